"""The slot sequencer alone (Amaranth simulator): slot order, pipeline positions, addresses,
latched item flags and the pass length, with random idle gaps between passes and item inputs
that change while a pass runs (the sequencer must use the values of the start pulse)."""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator
from hdl_slots import pass_slots
from pipetrain.hdl.sequencer import SlotSequencer
from pipetrain.hdl.streams import SlotPipelineSignature, slot_at


@pytest.mark.parametrize(
    "N,G,slot_cycles,depth,fwd_stage",
    [(5, 2, 1, 4, 4), (3, 1, 1, 5, 4), (4, 3, 2, 5, 4), (6, 2, 2, 6, 6), (5, 1, 1, 8, 7),
     (2, 2, 1, 8, 8), (4, 2, 1, 6, 1)],
)  # fmt: skip
def test_sequencer_issues_every_slot_in_order_at_the_plan_timing(
    N, G, slot_cycles, depth, fwd_stage
):
    """… and ``fwd_done`` rises the cycle after the last slot leaves ``forward_stage``
    (``build.forward_cycles``: ``depth − forward_stage`` cycles before ``done``)."""
    T = G * (N + 1)
    pipe = SlotPipelineSignature(N, G, T, depth)
    dut = SlotSequencer(pipe, slot_cycles, fwd_stage)
    rng = random.Random(N * 100 + G * 10 + slot_cycles)
    passes = [(rng.random() < 0.5, rng.random() < 0.5, rng.random() < 0.5) for _ in range(4)]
    expect_cycles = slot_cycles * (T - 1) + 2 + depth  # Stage.pass_cycles
    log = []

    async def bench(ctx):
        it, sp = dut.items, dut.slots
        for fwd, ft, bwd in passes:
            for _ in range(rng.randrange(4)):  # idle gap between passes
                assert ctx.get(it.done) == 1
                await ctx.tick()
            ctx.set(it.fwd, fwd)
            ctx.set(it.fwd_train, ft)
            ctx.set(it.bwd, bwd)
            ctx.set(it.start, 1)
            seen = {k: [] for k in range(depth + 1)}
            writes = []
            cycle, fwd_done = 0, None
            while True:
                assert ctx.get(sp.start) == (cycle == 0)
                if cycle == 0:
                    assert ctx.get(it.done) == ctx.get(it.fwd_done) == 0
                elif ctx.get(it.fwd_done) and fwd_done is None:
                    fwd_done = cycle
                if cycle > 0 and ctx.get(it.done):
                    assert ctx.get(it.fwd_done)  # never after done
                    break
                if cycle > 0:
                    assert (ctx.get(sp.fwd), ctx.get(sp.fwd_train), ctx.get(sp.bwd)) == (
                        fwd,
                        ft,
                        bwd,
                    )
                for k in range(depth + 1):
                    s = slot_at(sp, k)
                    if ctx.get(s.valid):
                        p = (ctx.get(s.payload.col), ctx.get(s.payload.group))
                        assert ctx.get(s.payload.last_group) == (p[1] == G - 1)
                        seen[k].append((cycle, *p))
                        if k == 0:
                            assert ctx.get(sp.busy) == 1
                            assert ctx.get(sp.read_addr) == len(seen[0]) - 1
                        if k == depth:
                            writes.append(ctx.get(sp.write_addr))
                await ctx.tick()
                ctx.set(it.start, 0)
                # the item inputs may change once the pass runs: the latched flags hold
                ctx.set(it.fwd, rng.random() < 0.5)
                ctx.set(it.bwd, rng.random() < 0.5)
                cycle += 1
            log.append((cycle, seen, writes, fwd_done))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    order = [(i, g) for _, i, g in pass_slots(N, G)]
    for cycles, seen, writes, fwd_done in log:
        assert cycles == expect_cycles
        assert fwd_done == expect_cycles - (depth - fwd_stage)
        # the last slot was at the forward stage in the cycle before fwd_done
        assert seen[fwd_stage][-1][0] == fwd_done - 1
        for k in range(depth + 1):
            assert [(i, g) for _, i, g in seen[k]] == order
            # slot n issues in cycle 1 + n·slot_cycles and is at stage k k cycles later
            assert [c for c, _, _ in seen[k]] == [1 + n * slot_cycles + k for n in range(T)]
        assert writes == list(range(T))


def test_sequencer_rejects_a_bad_geometry():
    with pytest.raises(ValueError, match="slot_cycles"):
        SlotSequencer(SlotPipelineSignature(3, 1, 4, 4), 3)
    with pytest.raises(ValueError, match="words"):
        SlotSequencer(SlotPipelineSignature(3, 2, 4, 4), 1)
    with pytest.raises(ValueError, match="forward stage"):
        SlotSequencer(SlotPipelineSignature(3, 1, 4, 4), 1, 5)
