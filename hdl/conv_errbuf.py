"""The error buffer of a convolution stage: the error ``g`` at its pooled outputs,
double-buffered, and δ per lane at every output position (docs/numerics.md §9.2 steps 1–2).

``gbuf`` holds two halves of ``G·P′`` words of ``L`` values (``d`` format): word ``g·P′ + q``,
lane ``l`` is output channel ``g·L + l`` at pooled position ``q``. The next stage's input
gradient arrives serially in the stage's output order — channel-major, ``k = j·P′ + q`` — one
value a beat (cannot stall); ``C_out·P′`` beats fill the half the tick controller names. A MAC
slot at position ``p`` reads the other half's word of its window at S0; at S1 each lane routes
the error through the pooling (:func:`~pipetrain.hdl.pool.pool_backward`, with the stashed
argmax) and forms ``δ = f′(z)·e`` from the position's stashed mask bit — 0 in padding lanes, in
update slots and in passes without a backward item — registered at S2. Every slot of a
position has the same δ.

Source: docs/numerics.md §9.2 (δ of a convolution), docs/architecture.md §3 (double-buffered
error buffer); the serial order and the pipeline are *derived* (as ``hdl/errbuf.py``).
"""

from __future__ import annotations

from collections.abc import Callable

from amaranth import Cat, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..compiler.plan import QFormat
from .activation import Activation
from .conv import PHASE_MAC, Conv2DView, ConvPipelineSignature, conv_at
from .conv_stash import argmax_bits
from .pool import pool_backward
from .streams import (
    DeltaSignature,
    ErrorHalvesSignature,
    MaskReadSignature,
    SlotPipelineSignature,
    ValidSignature,
    slot_at,
)

__all__ = ["ConvErrorBuffer"]


class ConvErrorBuffer(wiring.Component):
    """Double-buffered error of the pooled outputs and the per-lane δ of each MAC slot.

    Parameters
    ----------
    pipeline: the standard slot pipeline (S1 ``last_group``; ``bwd``).
    conv: the convolution payload pipeline (S0 ``aword``; S1 ``phase``, ``r``, ``inwin``).
    view: the stage's :class:`~pipetrain.hdl.conv.Conv2DView`. pool, scale, shift: the
        stage's pooling (``ConvGeometry.pool``, ``pool_scale``, ``pool_shift``).
    lanes: L. groups: G. out_channels: C_out (the last group has ``C_out − (G−1)·L`` live
        lanes). d_format: Q-format of ``g`` and δ. activation: the stage's
        :class:`~pipetrain.hdl.activation.Activation`. shift_add: the constant rule.

    Members
    -------
    write: ``In(ValidSignature(signed(d.bits)))`` serial error, channel-major.
    halves: ``In(ErrorHalvesSignature())``.
    slots: ``In(pipeline.subset(S1; bwd))``. conv: ``In(conv.subset(S0, S1))``.
    mask: ``In(MaskReadSignature(L))`` the position's stashed ``z > 0`` bits at S1.
    argmax: ``In(MaskReadSignature(L·abits))`` (``max``) the window's stashed ``r*`` at S1.
    delta: ``Out(DeltaSignature(L, d.bits))`` δ per lane at S2.

    Raises ValueError unless ``(G−1)·L < C_out ≤ G·L``.
    """

    def __init__(
        self,
        pipeline: SlotPipelineSignature,
        conv: ConvPipelineSignature,
        view: Conv2DView,
        *,
        pool: str,
        scale: int,
        shift: int,
        lanes: int,
        groups: int,
        out_channels: int,
        d_format: QFormat,
        activation: Activation,
        shift_add: Callable[[int], bool],
    ) -> None:
        if not (groups - 1) * lanes < out_channels <= groups * lanes:
            raise ValueError(f"{out_channels} channels do not fill {groups} groups of {lanes}")
        self.v, self.pool, self.scale, self.shift = view, pool, scale, shift
        self.L, self.G, self.C = lanes, groups, out_channels
        self.fd, self.act = d_format, activation
        self.shift_add = shift_add
        members = {
            "write": In(ValidSignature(signed(d_format.bits))),
            "halves": In(ErrorHalvesSignature()),
            "slots": In(pipeline.subset(stages=(1,), flags=("bwd",))),
            "conv": In(conv.subset((0, 1))),
            "mask": In(MaskReadSignature(lanes)),
            "delta": Out(DeltaSignature(lanes, d_format.bits)),
        }
        if pool == "max":
            members["argmax"] = In(MaskReadSignature(lanes * argmax_bits(view.window)))
        super().__init__(members)

    def elaborate(self, platform) -> Module:
        m = Module()
        v, G, L, fd = self.v, self.G, self.L, self.fd
        half = G * v.PQ
        m.submodules.gbuf = gm = Memory(shape=L * fd.bits, depth=2 * half, init=[])
        grd, gwr = gm.read_port(), gm.write_port(granularity=fd.bits)

        # serial write: k = j·P′ + q → word (j div L)·P′ + q, lane j mod L
        q = Signal(range(max(v.PQ, 2)))
        gl = Signal(range(max(L, 2)))
        gb = Signal(range(half + 1))  # (j div L)·P′
        wr = self.write
        last_lane = (self.C - 1) % L
        m.d.comb += [
            gwr.addr.eq(Mux(self.halves.write, half, 0) + gb + q),
            gwr.data.eq(Cat(*([wr.payload] * L))),
        ]
        for lane in range(L):
            m.d.comb += gwr.en[lane].eq(wr.valid & (gl == lane))
        with m.If(wr.valid):
            with m.If(q != v.PQ - 1):
                m.d.sync += q.eq(q + 1)
            with m.Elif((gb == half - v.PQ) & (gl == last_lane)):
                m.d.sync += [q.eq(0), gl.eq(0), gb.eq(0)]
            with m.Elif(gl == L - 1):
                m.d.sync += [q.eq(0), gl.eq(0), gb.eq(gb + v.PQ)]
            with m.Else():
                m.d.sync += [q.eq(0), gl.eq(gl + 1)]

        # S0: the window's word; S1: through the pooling, δ per lane; S2: registered
        c0, c1 = conv_at(self.conv, 0).payload, conv_at(self.conv, 1)
        m.d.comb += grd.addr.eq(Mux(self.halves.read, half, 0) + c0.aword)
        s1 = slot_at(self.slots, 1)
        live_last = self.C - (G - 1) * L
        ab = argmax_bits(v.window)
        for lane in range(L):
            g = grd.data.word_select(lane, fd.bits).as_signed()
            arg = self.argmax.bits.word_select(lane, ab) if self.pool == "max" else None
            p1 = c1.payload
            e = pool_backward(
                self.pool, g, p1.r, p1.inwin, arg, self.scale, self.shift, self.shift_add
            )
            dl = self.act.derivative(self.mask.bits[lane], e)
            live = self.slots.bwd & (p1.phase == PHASE_MAC)
            if lane >= live_last:
                live = live & ~s1.payload.last_group
            d2 = Signal(signed(fd.bits), name=f"d2_{lane}")
            with m.If(c1.valid):
                m.d.sync += d2.eq(Mux(live, dl, 0))
            m.d.comb += self.delta.delta[lane].eq(d2)
        return m
