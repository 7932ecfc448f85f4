"""The error buffer of a stage: the error ``g`` at its output, double-buffered, and δ per lane.

``gbuf`` holds two halves of ``row_groups`` words of ``L`` values (``d`` format). The next
stage's input gradient (or the loss unit's δ) arrives serially, one value a beat: the ``k``-th
beat since the half was last filled is ``g_k``, stored in lane ``k mod L`` of word ``k div L`` of
the half the tick controller names; ``M`` beats fill it. The pass reads the other half, the
word of the slot's row group at S0. At S1 each lane forms ``δ = f′(z)·g`` from the stashed mask
bit (``tanh``/``sigmoid``: the stashed output y; docs/numerics.md §5) — 0 in padding lanes of
the last row group and in passes without a backward item — registered at S2.

Source: docs/architecture.md §3 (double-buffered error buffer), docs/numerics.md §5 (δ); the
serial write order and the pipeline are *derived*.
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..compiler.plan import QFormat
from .activation import Activation
from .streams import (
    DeltaSignature,
    ErrorHalvesSignature,
    MaskReadSignature,
    SlotPipelineSignature,
    ValidSignature,
    slot_at,
)

__all__ = ["ErrorBuffer"]


class ErrorBuffer(wiring.Component):
    """Double-buffered error ``g`` and the per-lane δ of each slot.

    Parameters
    ----------
    pipeline: the pass's slot pipeline (row groups).
    lanes: L.
    out_features: M (errors per sample; the last row group has ``M − (G−1)·L`` live lanes).
    d_format: Q-format of ``g`` and δ.
    activation: the stage's :class:`~pipetrain.hdl.activation.Activation` (its derivative).

    Members
    -------
    write: ``In(ValidSignature(signed(d.bits)))`` serial error, one value a beat (cannot
        stall).
    halves: ``In(ErrorHalvesSignature())`` half written / read this tick.
    slots: ``In(pipeline.subset(S0, S1; bwd))``.
    mask: ``In(MaskReadSignature(L·stash_bits))`` the stashed ``z > 0`` bits at S1
        (``tanh``/``sigmoid``: the outputs y, ``activation.stash_bits`` = y.bits per lane).
    delta: ``Out(DeltaSignature(L, d.bits))`` δ per lane at S2.

    Raises ValueError unless ``(G−1)·L < M ≤ G·L``.
    """

    def __init__(
        self,
        pipeline: SlotPipelineSignature,
        *,
        lanes: int,
        out_features: int,
        d_format: QFormat,
        activation: Activation,
    ) -> None:
        G = pipeline.row_groups
        if not (G - 1) * lanes < out_features <= G * lanes:
            raise ValueError(f"{out_features} rows do not fill {G} row groups of {lanes} lanes")
        self.pipeline, self.L, self.M, self.fd, self.act = (
            pipeline,
            lanes,
            out_features,
            d_format,
            activation,
        )
        super().__init__(
            {
                "write": In(ValidSignature(signed(d_format.bits))),
                "halves": In(ErrorHalvesSignature()),
                "slots": In(pipeline.subset(stages=(0, 1), flags=("bwd",))),
                "mask": In(MaskReadSignature(lanes * activation.stash_bits)),
                "delta": Out(DeltaSignature(lanes, d_format.bits)),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        G, L, M, fd = self.pipeline.row_groups, self.L, self.M, self.fd
        sp = self.slots
        s1 = slot_at(sp, 1)
        m.submodules.gbuf = gm = Memory(shape=L * fd.bits, depth=2 * G, init=[])
        grd, gwr = gm.read_port(), gm.write_port(granularity=fd.bits)

        # serial write: word gq, lane gl of the half being filled
        gq = Signal(range(max(G, 2)))
        gl = Signal(range(max(L, 2)))
        last_lane = (M - 1) % L
        wr = self.write
        m.d.comb += [
            gwr.addr.eq(Mux(self.halves.write, G, 0) + gq),
            gwr.data.eq(Cat(*([wr.payload] * L))),
        ]
        for lane in range(L):
            m.d.comb += gwr.en[lane].eq(wr.valid & (gl == lane))
        with m.If(wr.valid):
            with m.If((gq == G - 1) & (gl == last_lane)):
                m.d.sync += [gq.eq(0), gl.eq(0)]
            with m.Elif(gl == L - 1):
                m.d.sync += [gq.eq(gq + 1), gl.eq(0)]
            with m.Else():
                m.d.sync += gl.eq(gl + 1)

        # S0: read the slot's row group; S1: δ per lane; S2: registered
        m.d.comb += grd.addr.eq(Mux(self.halves.read, G, 0) + slot_at(sp, 0).payload.group)
        live_last = M - (G - 1) * L  # lanes ≥ this are padding in the last row group
        for lane in range(L):
            g = grd.data.word_select(lane, fd.bits).as_signed()
            mb = self.act.stash_bits
            stashed = self.mask.bits[lane] if mb == 1 else self.mask.bits.word_select(lane, mb)
            dl = self.act.derivative(stashed, g)
            live = sp.bwd
            if lane >= live_last:
                live = live & ~s1.payload.last_group
            d2 = Signal(signed(fd.bits), name=f"d2_{lane}")
            with m.If(s1.valid):
                m.d.sync += d2.eq(Mux(live, dl, 0))
            m.d.comb += self.delta.delta[lane].eq(d2)
        return m
