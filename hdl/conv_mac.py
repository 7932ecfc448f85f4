"""The backward MACs of a convolution stage: the weight-gradient sums and the input gradient
(docs/numerics.md §9.2 steps 3–4).

**Weight gradient** (:class:`WeightGradient`): in a MAC slot ``(g, p, t)`` lane ``l`` adds
``δ_j,p·X[t][p]`` (``j = g·L + l``; the bias tap's input, or 0 at a padding tap) to its sum
``wgacc[g·(T+1) + t]`` — read at S2, added and written at S3; the first position starts from 0,
so nothing is cleared (a weight's word recurs ``T + 1`` slots later, after its write). In a U
slot the word is read at S1 and the exact sum ``P[j][t]`` over all P positions goes to the
update unit at S2: **one** update per weight.

**Input gradient** (:class:`ConvInputGradient`): in a MAC slot the lanes' products ``w_j,t·δ_j,p``
are summed across lanes (an adder chain, S3) and added to ``gacc[i]``, ``i`` the input value the
tap reads at the position (padding taps and the bias tap add nothing): the transposed
correlation, summed over the groups, positions and taps. Two slots one apart never touch the
same ``i`` (the taps of a position read distinct inputs and the bias slot separates positions),
so the read at S2 and the write at S3 do not race. Once the MAC phase is over (its last slot
at S3) the sums are sent, ``gin_i = sat(rhu(gacc[i], w.frac + d.frac − gin.frac), gin)`` for
``i = 0..N−1`` in order, one a cycle, while the gap and the U slots run; each word is cleared
as it is read, so the next pass starts from 0.

Source: docs/numerics.md §9.2 (the arithmetic); the memories' use and the send schedule are
*derived* (``hdl/mac.py``'s input gradient with a convolution's addresses).
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..compiler.plan import QFormat
from .arith import rhu, sat, wire
from .conv import PHASE_MAC, ConvPipelineSignature, conv_at
from .streams import (
    DeltaSignature,
    LaneWeightsSignature,
    SlotPipelineSignature,
    StashOperandsSignature,
    ValidSignature,
)

__all__ = ["ConvInputGradient", "WeightGradient"]


class WeightGradient(wiring.Component):
    """The per-lane weight-gradient sums ``P = Σ_p δ·x`` of a convolution stage.

    Parameters
    ----------
    pipeline: the standard slot pipeline (``read_addr`` at S0 is the weight word; ``bwd``).
    conv: the payload pipeline (S2, S3: ``phase``, ``first_pos``).
    lanes: L. acc_bits: the sum's width (the plan's ``wgacc`` width). d_format: Q-format of δ.
    x_operand_bits: width of the ``x`` operand.

    Members
    -------
    slots: ``In(pipeline.subset(S0…S3; read_addr, bwd))``. conv: ``In(conv.subset(S1…S3))``.
    upd: ``In(1)`` the U phase runs (the sequencer's ``upd``).
    operands: ``In(StashOperandsSignature(x_operand_bits))`` the backward item's ``x`` at S2.
    delta: ``In(DeltaSignature(L, d.bits))`` δ at S2.
    grad: ``Out(DeltaSignature(L, acc_bits))`` the U slot's sum ``P`` per lane at S2.
    """

    def __init__(
        self,
        pipeline: SlotPipelineSignature,
        conv: ConvPipelineSignature,
        *,
        lanes: int,
        acc_bits: int,
        d_format: QFormat,
        x_operand_bits: int,
    ) -> None:
        self.pipeline, self.L, self.bits = pipeline, lanes, acc_bits
        super().__init__(
            {
                "slots": In(pipeline.subset(stages=(0, 1, 2, 3), flags=("read_addr", "bwd"))),
                "conv": In(conv.subset((1, 2, 3))),
                "upd": In(1),
                "operands": In(StashOperandsSignature(x_operand_bits)),
                "delta": In(DeltaSignature(lanes, d_format.bits)),
                "grad": Out(DeltaSignature(lanes, acc_bits)),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        sp, words = self.slots, self.pipeline.words
        addr = [Signal(range(words), name=f"wga{k}") for k in range(4)]  # the word at S0..S3
        m.d.comb += addr[0].eq(sp.read_addr)
        for k in range(1, 4):
            m.d.sync += addr[k].eq(addr[k - 1])
        c3 = conv_at(self.conv, 3)
        acc3 = c3.valid & (c3.payload.phase == PHASE_MAC) & sp.bwd
        for lane in range(self.L):
            m.submodules[f"wgacc{lane}"] = mem = Memory(
                shape=signed(self.bits), depth=words, init=[]
            )
            rd, wr = mem.read_port(), mem.write_port()
            pw3 = Signal(signed(self.bits), name=f"pw3_{lane}")  # δ·x, registered at S3
            m.d.sync += pw3.eq(self.delta.delta[lane] * self.operands.x_bwd)
            m.d.comb += [
                rd.addr.eq(Mux(self.upd, addr[1], addr[2])),
                wr.addr.eq(addr[3]),
                wr.data.eq(Mux(c3.payload.first_pos, 0, rd.data) + pw3),
                wr.en.eq(acc3),
                self.grad.delta[lane].eq(rd.data),
            ]
        return m


class ConvInputGradient(wiring.Component):
    """The input gradient of a convolution stage, sent serially ``i = 0..N−1`` after its sums
    are complete (module docstring).

    Parameters
    ----------
    pipeline: the standard slot pipeline (S2, S3; ``bwd``).
    conv: the payload pipeline (S2 ``xidx``; S3 ``phase``, ``pad``, ``bias_tap``,
        ``last_mac``).
    lanes: L. in_values: N (input values). acc_bits: the sums' width (``acc_bwd_bits``).
    w_format, d_format, gin_format: Q-formats. what_bits: width of ŵ on ``weights``.

    Members
    -------
    slots: ``In(pipeline.subset(S2, S3; bwd))``. conv: ``In(conv.subset(S2, S3))``.
    weights: ``In(LaneWeightsSignature(L, what_bits, w.bits))`` ``w`` at S2.
    delta: ``In(DeltaSignature(L, d.bits))`` δ at S2.
    gin: ``Out(ValidSignature(signed(gin.bits)))`` ``gin_i`` in input order, in passes with a
        backward item (cannot stall).
    saturated: ``Out(1)`` ``gin`` clamped (with ``gin``).
    busy: ``Out(1)`` the sums are still being sent (the pass may not end).
    """

    def __init__(
        self,
        pipeline: SlotPipelineSignature,
        conv: ConvPipelineSignature,
        *,
        lanes: int,
        in_values: int,
        acc_bits: int,
        w_format: QFormat,
        d_format: QFormat,
        gin_format: QFormat,
        what_bits: int,
    ) -> None:
        self.L, self.N, self.bits = lanes, in_values, acc_bits
        self.fw, self.fd, self.fg = w_format, d_format, gin_format
        super().__init__(
            {
                "slots": In(pipeline.subset(stages=(2, 3), flags=("bwd",))),
                "conv": In(conv.subset((2, 3))),
                "weights": In(LaneWeightsSignature(lanes, what_bits, w_format.bits)),
                "delta": In(DeltaSignature(lanes, d_format.bits)),
                "gin": Out(ValidSignature(signed(gin_format.bits))),
                "saturated": Out(1),
                "busy": Out(1),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        N, fw, fd, fg = self.N, self.fw, self.fd, self.fg
        sp = self.slots
        c2, c3 = conv_at(self.conv, 2), conv_at(self.conv, 3)
        gsum = None  # S2: w·δ per lane; S3: the sum across lanes
        for lane in range(self.L):
            pg3 = Signal(signed(fw.bits + fd.bits), name=f"pg3_{lane}")
            m.d.sync += pg3.eq(self.weights.w[lane] * self.delta.delta[lane])
            gsum = pg3 if gsum is None else gsum + pg3
        m.submodules.gacc = mem = Memory(shape=signed(self.bits), depth=N, init=[])
        rd, wr = mem.read_port(), mem.write_port()
        xidx3 = Signal(range(max(N, 2)), name="xidx3")
        m.d.sync += xidx3.eq(c2.payload.xidx)
        p3 = c3.payload
        acc3 = c3.valid & (p3.phase == PHASE_MAC) & ~p3.pad & ~p3.bias_tap & sp.bwd

        # the send: after the MAC phase's last slot (at S3: every sum written), read i, clear
        # it the next cycle, gin_i the cycle after
        sending = Signal()
        i = Signal(range(N + 1))
        ok1, ok2 = Signal(), Signal()  # word i − 1 read last cycle; gin valid
        i1 = Signal(range(max(N, 2)))
        with m.If(sp.bwd & c3.valid & p3.last_mac):
            m.d.sync += [sending.eq(1), i.eq(0)]
        with m.If(sending):
            m.d.sync += i.eq(i + 1)
            with m.If(i == N - 1):
                m.d.sync += sending.eq(0)
        m.d.sync += [ok1.eq(sending), i1.eq(i), ok2.eq(ok1)]
        m.d.comb += [
            rd.addr.eq(Mux(sending, i, c2.payload.xidx)),
            wr.addr.eq(Mux(ok1, i1, xidx3)),
            wr.data.eq(Mux(ok1, 0, rd.data + gsum)),
            wr.en.eq(ok1 | acc3),
        ]
        gv, gc = sat(wire(m, rhu(rd.data, fw.frac + fd.frac - fg.frac), "ginr"), fg)
        gin2, gs2 = Signal(signed(fg.bits)), Signal()
        m.d.sync += [gin2.eq(gv), gs2.eq(gc)]
        m.d.comb += [
            self.gin.valid.eq(ok2),
            self.gin.payload.eq(gin2),
            self.saturated.eq(ok2 & gs2),
            self.busy.eq(sending | ok1 | ok2),
        ]
        return m
