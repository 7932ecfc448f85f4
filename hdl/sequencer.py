"""The slot sequencer of a stage's fused pass: which slot issues when, and where each slot is.

A pass issues ``words = row_groups·(N+1)`` slots in numerics §2 order (``for g: for i in
0..N``), one every ``slot_cycles`` cycles (2 with single-port weight memories: a read cycle,
then the write-back cycle of an earlier slot). Slot ``(g, i)`` reads weight word ``g·(N+1)+i``
at S0; the sequencer then carries ``(i, g, g = G−1)`` down the pipeline, one register per stage,
to the write stage, where a counter gives the write-back address (slots reach it in issue order,
so a counter replaces a copy of the address per stage; *derived*: fewer flip-flops).

Timing: the start pulse is cycle 0, the first slot issues in cycle 1, and ``done`` rises once
the last slot has left the write stage: ``slot_cycles·(words − 1) + 2 + write_stage`` cycles
from the start pulse (``Stage.pass_cycles``); ``fwd_done`` once it has left the forward output
stage (``build.forward_stage``), ``write_stage − forward_stage`` cycles earlier
(``build.forward_cycles``: where a loss unit fed by the stage starts).

Source: docs/architecture.md §3 (fused pass, slot order), docs/numerics.md §2 (order); the
pipeline is *derived*.
"""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .streams import PassItemsSignature, SlotPipelineSignature, slot_at

__all__ = ["SlotSequencer"]


class SlotSequencer(wiring.Component):
    """Issues the slots of a pass and carries their position down the pipeline.

    Parameters
    ----------
    pipeline: the pass's :class:`~pipetrain.hdl.streams.SlotPipelineSignature` (N, row
        groups, words, write stage).
    slot_cycles: 1, or 2 for single-port weight memories.
    forward_stage: the stage whose slot carries the forward output (``build.forward_stage``;
        default the write stage): ``items.fwd_done`` rises the cycle after the last slot
        leaves it.

    Members
    -------
    items: ``In(PassItemsSignature())`` start pulse and item flags in, ``done`` and
        ``fwd_done`` out.
    slots: ``Out(pipeline)`` the slot at every stage S0..S{depth}, the latched item flags,
        ``busy`` and the read / write-back addresses.

    Raises ValueError for ``slot_cycles`` other than 1 or 2, or ``words`` ≠ row_groups·(N+1).
    """

    def __init__(
        self, pipeline: SlotPipelineSignature, slot_cycles: int, forward_stage: int | None = None
    ) -> None:
        N, G = pipeline.in_features, pipeline.row_groups
        self.forward_stage = pipeline.depth if forward_stage is None else forward_stage
        if not 1 <= self.forward_stage <= pipeline.depth:
            raise ValueError(f"forward stage {forward_stage} outside 1..{pipeline.depth}")
        if slot_cycles not in (1, 2):
            raise ValueError(f"slot_cycles must be 1 or 2, not {slot_cycles}")
        if pipeline.words != G * (N + 1):
            raise ValueError(f"words {pipeline.words} ≠ row_groups·(N+1) = {G * (N + 1)}")
        self.pipeline, self.slot_cycles = pipeline, slot_cycles
        super().__init__({"items": In(PassItemsSignature()), "slots": Out(pipeline)})

    def elaborate(self, platform) -> Module:
        m = Module()
        pl = self.pipeline
        N, G, T, depth = pl.in_features, pl.row_groups, pl.words, pl.depth
        it, sp = self.items, self.slots

        busy = Signal()
        k = Signal(range(T))
        i0 = Signal(range(N + 1))
        g0 = Signal(range(max(G, 2)))
        fe, ft, be = Signal(), Signal(), Signal()
        adv = Signal()  # a slot issues (reads its memories) this cycle
        if self.slot_cycles == 2:
            phase = Signal()  # 1: the write-back cycle between two reads
            with m.If(it.start):
                m.d.sync += phase.eq(0)
            with m.Elif(busy):
                m.d.sync += phase.eq(~phase)
            m.d.comb += adv.eq(busy & ~phase)
        else:
            m.d.comb += adv.eq(busy)
        with m.If(it.start):
            m.d.sync += [
                busy.eq(1),
                k.eq(0),
                i0.eq(0),
                g0.eq(0),
                fe.eq(it.fwd),
                ft.eq(it.fwd_train),
                be.eq(it.bwd),
            ]
        with m.Elif(adv):
            m.d.sync += k.eq(k + 1)
            with m.If(k == T - 1):
                m.d.sync += busy.eq(0)
            with m.If(i0 == N):
                m.d.sync += [i0.eq(0), g0.eq(g0 + 1)]
            with m.Else():
                m.d.sync += i0.eq(i0 + 1)

        # the slot at S0, then one register per stage (no enables: a bubble moves like a slot)
        s0 = slot_at(sp, 0)
        m.d.comb += [
            s0.valid.eq(adv),
            s0.payload.col.eq(i0),
            s0.payload.group.eq(g0),
            s0.payload.last_group.eq(g0 == G - 1),
        ]
        for s in range(1, depth + 1):
            prev, cur = slot_at(sp, s - 1), slot_at(sp, s)
            valid = Signal(name=f"v{s}")
            payload = Signal(cur.payload.shape(), name=f"slot{s}")
            m.d.sync += [valid.eq(prev.valid), payload.eq(prev.payload)]
            m.d.comb += [cur.valid.eq(valid), cur.payload.eq(payload)]

        # write-back address: counts the slots that reached the write stage
        wk = Signal(range(T + 1))
        with m.If(it.start):
            m.d.sync += wk.eq(0)
        with m.Elif(slot_at(sp, depth).valid):
            m.d.sync += wk.eq(wk + 1)

        # ``done`` = no start, no slot issuing, none in S1..S{depth}; the last two from a
        # register holding next cycle's ``busy | v1 | … | v{depth}`` (the same value in every
        # cycle: busy's next value, S0's slot becomes v1, v{s} becomes v{s+1}), so ``done``
        # leaves one gate after a flip-flop (timing only, *derived*: the -deep 16,8,8,4
        # critical path at 85.7 MHz was a stage's v1 → the OR of its pipeline → the tick
        # controller's all-done → the result queue's push, 11.7 ns; docs/boards.md §4.2)
        ends = adv & (k == T - 1)
        following = it.start | (busy & ~ends) | adv
        for s in range(1, depth):
            following = following | slot_at(sp, s).valid
        in_pass = Signal()
        m.d.sync += in_pass.eq(following)
        active = it.start | in_pass
        # fwd_done the same way over S1..S{forward_stage} (the forward outputs' last slot)
        forwarding = it.start | (busy & ~ends) | adv
        for s in range(1, self.forward_stage):
            forwarding = forwarding | slot_at(sp, s).valid
        in_fwd = Signal()
        m.d.sync += in_fwd.eq(forwarding)
        m.d.comb += [
            sp.start.eq(it.start),
            sp.busy.eq(busy),
            sp.fwd.eq(fe),
            sp.fwd_train.eq(ft),
            sp.bwd.eq(be),
            sp.read_addr.eq(k),
            sp.write_addr.eq(wk),
            it.done.eq(~active),
            it.fwd_done.eq(~(it.start | in_fwd)),
        ]
        return m
