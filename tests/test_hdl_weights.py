"""The weight banks and the weight store alone (Amaranth simulator).

* :class:`WeightBank`: random reads and writes against a model memory, for the dual-port
  ``lib.memory`` and the single-port (SPRAM) variant, whose read in a write cycle returns the
  word at the *write* address (the hazard the sequencer must avoid).
* :class:`WeightStore`: weight-access writes saturate and echo the stored value, reads return
  it; a pass (random gaps between slots) reads every lane's ``(w, u)`` of each slot at S1 and
  writes ``(w′, u′)`` back at the write stage to exactly the live lanes — with the LWP ``w``
  form's third bank ``w_prev`` (kind 2) as well.
"""

from __future__ import annotations

import contextlib
import random

import pytest
from amaranth import Module, signed
from amaranth.back import rtlil
from amaranth.hdl import Fragment
from amaranth.sim import Simulator
from hdl_slots import drive_pass
from pipetrain.compiler.plan import QFormat
from pipetrain.hdl.streams import SlotPipelineSignature
from pipetrain.hdl.weights import (
    WeightBank,
    WeightStore,
    access_latency,
    poison_collisions,
    tree_levels,
)
from pipetrain.sim import fixed


@pytest.mark.parametrize("single_port,poison", [(False, False), (False, True), (True, False)])
def test_weight_bank_reads_what_was_written(single_port, poison):
    """``poison``: inside ``poison_collisions`` a dual-port read that meets a write to its
    address in the same cycle returns the complement of the old word (else the old word)."""
    words, bits = 11, 9
    m = Module()
    spram = (16384, 16) if single_port else None  # one SB_SPRAM256KA
    with poison_collisions() if poison else contextlib.nullcontext():
        dut = WeightBank(m, "w0", signed(bits), words, spram=spram)
    rng = random.Random(int(single_port))
    model = [0] * words
    checks = []

    async def bench(ctx):
        pending = None  # (expected data, what) of the read issued last cycle
        for _ in range(400):
            ra = rng.randrange(words)
            we = rng.random() < 0.4
            wa, wd = rng.randrange(words), rng.randrange(-(1 << (bits - 1)), 1 << (bits - 1))
            ctx.set(dut.read.addr, ra)
            ctx.set(dut.write.en, we)
            ctx.set(dut.write.addr, wa)
            ctx.set(dut.write.data, wd)
            if pending is not None:
                checks.append((ctx.get(dut.read.data), *pending))
            # the word a read issued now returns next cycle (the old content: no write-through)
            word = model[wa if (single_port and we) else ra]
            if poison and we and wa == ra:
                word = ~word
            pending = (word, (ra, wa, we))
            await ctx.tick()
            if we:
                model[wa] = wd

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert len(checks) == 399
    for got, exp, what in checks:
        assert got == exp, what
    if single_port:  # the hazard is visible: some read in a write cycle got another word
        assert any(w[2] and w[0] != w[1] for _, _, w in checks)
    collisions = [got for got, _, (ra, wa, we) in checks if we and ra == wa]
    assert len(collisions) >= 5  # the random reads and writes met often enough to matter


FW, FU = QFormat(12, 8), QFormat(10, 8)


class _Ecp5:
    """A stand-in platform of the ECP5 family (``hdl.dsp.is_ecp5``)."""

    family = "ecp5"


def _sat(v, fmt):
    return fixed.sat_int(v, fmt)[0]


@pytest.mark.parametrize(
    "single_port,L,N,G,depth,w_prev,ecp5",
    [
        (False, 3, 4, 2, 4, False, False),
        (True, 2, 3, 3, 5, False, False),
        (False, 2, 4, 2, 5, True, False),
        (False, 6, 3, 2, 4, True, False),  # two lane groups of the answer's multiplexer (4 + 2)
        # the ECP5 form: every lane's word registered, then 4-way levels: 6 lanes one level
        # (2 words left), 17 lanes two (5, then 2), 3 lanes none
        (False, 6, 3, 2, 4, True, True),
        (False, 17, 2, 2, 4, False, True),
        (False, 3, 4, 2, 4, False, True),
    ],
)
@pytest.mark.usefixtures("poisoned_collisions")  # no used read meets a write (conftest)
def test_weight_store_access_and_pass(single_port, L, N, G, depth, w_prev, ecp5):
    T = G * (N + 1)
    pipe = SlotPipelineSignature(N, G, T, depth)
    spram = (16384, 16) if single_port else None  # one SB_SPRAM256KA
    dut = WeightStore(pipe, lanes=L, w_format=FW, u_format=FU, spram=spram, w_prev=w_prev)
    rng = random.Random(L * 10 + N + w_prev)
    kinds = ((0, FW), (1, FU), (2, FW)) if w_prev else ((0, FW), (1, FU))
    K = len(kinds)
    mem = {(kind, lane, a): 0 for kind in range(K) for lane in range(L) for a in range(T)}
    echoes, reads, passes = [], [], []

    async def access(ctx, write, kind, lane, addr, data=0):
        acc = dut.access
        ctx.set(acc.en, 1)
        ctx.set(acc.write, write)
        ctx.set(acc.kind, kind)
        ctx.set(acc.lane, lane)
        ctx.set(acc.addr, addr)
        ctx.set(acc.data, data)
        await ctx.tick()
        ctx.set(acc.en, 0)
        for _ in range(latency - 1):  # rdata: access_latency cycles after en
            await ctx.tick()
        out = ctx.get(acc.rdata)
        for _ in range(rng.randrange(3)):  # the answer holds while the command is unchanged
            await ctx.tick()
            assert ctx.get(acc.rdata) == out
        return out

    async def bench(ctx):
        for kind, fmt in kinds:
            for lane in range(L):
                for a in range(T):
                    data = rng.choice([rng.randrange(-3000, 3000), 1 << 20, -(1 << 20)])
                    echoes.append((await access(ctx, 1, kind, lane, a, data), _sat(data, fmt)))
                    mem[kind, lane, a] = _sat(data, fmt)
        for _ in range(12):
            kind, lane, a = rng.randrange(K), rng.randrange(L), rng.randrange(T)
            reads.append((await access(ctx, 0, kind, lane, a), mem[kind, lane, a]))
        for _ in range(2):
            new = {}
            seen = []

            def cycle(pipe, new=new, seen=seen):
                wb = dut.write_back
                if pipe[1] is not None:
                    n = pipe[1][0]
                    rd = dut.read
                    seen.append(
                        (
                            n,
                            [
                                (ctx.get(rd.w[k]), ctx.get(rd.u[k]))
                                + ((ctx.get(rd.w_prev[k]),) if w_prev else ())
                                for k in range(L)
                            ],
                        )
                    )
                s = pipe[depth]
                ctx.set(wb.valid, s is not None)
                if s is not None:
                    lanes = rng.randrange(1 << L)
                    ctx.set(wb.payload.lanes, lanes)
                    for k in range(L):
                        w, u = rng.randrange(-2000, 2000), rng.randrange(-500, 500)
                        ctx.set(wb.payload.w[k], w)
                        ctx.set(wb.payload.u[k], u)
                        if (lanes >> k) & 1:
                            new[0, k, s[0]], new[1, k, s[0]] = w, u
                        if w_prev:
                            p = rng.randrange(-2000, 2000)
                            ctx.set(wb.payload.w_prev[k], p)
                            if (lanes >> k) & 1:
                                new[2, k, s[0]] = p

            snapshot = dict(mem)
            await drive_pass(
                ctx, dut.slots, pipe, rng=rng, gap=0.4, cycle=cycle, single_port=single_port
            )
            ctx.set(dut.write_back.valid, 0)
            mem.update(new)
            passes.append((snapshot, seen))
        for kind in range(K):
            for lane in range(L):
                for a in range(T):
                    reads.append((await access(ctx, 0, kind, lane, a), mem[kind, lane, a]))

    platform = _Ecp5() if ecp5 else None
    # the ECP5 form registers each lane's word (acc_l<lane>_k<kind>), then 4-way levels
    # (acc_t<level>_<group>_k<kind>) until ≤ 4 are left; the fabric form each group of 4 lanes
    # (acc_g<group>_k<kind>)
    text = rtlil.convert(dut, platform=platform)
    if ecp5:
        assert f"acc_l{L - 1}_k0" in text and f"acc_l{L}_k0" not in text
        levels = tree_levels(L)
        assert (f"acc_t{levels}_0_k0" in text) == (levels > 0)
        assert f"acc_t{levels + 1}_0_k0" not in text
    else:
        last = (L - 1) // 4
        assert f"acc_g{last}_k0" in text and f"acc_g{last + 1}_k0" not in text
    latency = access_latency(L, platform)
    assert latency == 3 + (tree_levels(L) if ecp5 else 0)
    sim = Simulator(Fragment.get(dut, platform))
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert all(got == exp for got, exp in echoes) and len(echoes) == K * L * T
    assert all(got == exp for got, exp in reads) and len(reads) == 12 + K * L * T
    for snapshot, seen in passes:
        assert [n for n, _ in seen] == list(range(T))
        for n, lanes in seen:
            assert lanes == [tuple(snapshot[kind, k, n] for kind in range(K)) for k in range(L)], n
