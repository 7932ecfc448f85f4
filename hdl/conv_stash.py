"""The stash of a convolution stage: the input feature maps of its samples, the ReLU mask of
every output position and the MaxPool argmax of every window (docs/numerics.md §9.1).

* ``xstash``: ``entries`` sample entries of ``x_words`` words, each ``Lw`` values of ``x``
  (``Lw`` = the writer's lanes: channel ``c`` of input position ``pos`` is word
  ``(c div Lw)·H·W + pos``, lane ``c mod Lw``; 1 lane for the host's samples). Written at
  ``bases.write + word``; read twice at S0 in every slot — the forward item's and the backward
  item's entry — at the slot's ``xword`` (:mod:`pipetrain.hdl.conv`). At S1 the lane is
  picked; a padding tap gives 0, the bias tap ``2^x.frac`` (0 for a layer without bias);
  registered at S2.
* ``mask``: ``entries × row_groups·P`` words of ``L`` bits, the ``z > 0`` bits of the forward
  item's position (written at ``bases.fwd_mask + g·P + p``), read for the backward item's
  position at S0 (used at S1).
* ``argmax`` (MaxPool only): ``entries × row_groups·P′`` words of ``L·⌈log2 |W|⌉`` bits, the
  window offset ``r*`` of each lane's largest value, written with the window's pooled output
  and read like ``mask`` at the window's word ``g·P′ + q``. Its entry base is the mask's entry
  base scaled by ``P′/P`` (one case per entry: the entries are few).

Source: docs/numerics.md §9.1 (what is stashed), docs/architecture.md §3 (stash); the word
packing and the pipeline are *derived* (as the Linear stage's ``hdl/stash.py``).
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..compiler.plan import QFormat
from .conv import Conv2DView, ConvPipelineSignature, conv_at
from .streams import (
    MaskReadSignature,
    StashBasesSignature,
    StashOperandsSignature,
    ValidSignature,
    mask_layout,
    word_layout,
)

__all__ = ["ConvStash", "argmax_bits"]


def argmax_bits(window: int) -> int:
    """Bits of a stashed MaxPool argmax: ⌈log2 window⌉, at least 1 (the plan's ``argmax``)."""
    return max(1, (window - 1).bit_length())


class ConvStash(wiring.Component):
    """The input stash, the mask memory and the argmax memory of one convolution stage.

    Parameters
    ----------
    conv: the pass's :class:`~pipetrain.hdl.conv.ConvPipelineSignature` (the slot payload).
    view: the stage's :class:`~pipetrain.hdl.conv.Conv2DView`.
    lanes: L. groups: row groups G. entries: sample entries (``Stage.stash_entries``).
    x_lanes: Lw. x_words: words per entry. x_format: Q-format of ``x``.
    x_operand_bits: width of the operands (``Stage.x_operand_bits``). maxpool: build
        ``argmax``.

    Members
    -------
    write: ``In(ValidSignature(word_layout(x_words, Lw·x.bits)))`` stash write at
        ``bases.write + word``.
    bases: ``In(StashBasesSignature(entries·x_words, entries·G·P))``.
    conv: ``In(conv.subset(S0, S1))``.
    mask_write: ``In(ValidSignature(mask_layout(G·P, L)))`` the forward item's ``z > 0`` bits
        of word ``g·P + p``.
    operands: ``Out(StashOperandsSignature(x_operand_bits))`` the slot's ``x`` of the forward and
        of the backward item at S2.
    mask: ``Out(MaskReadSignature(L))`` the backward item's bits of the slot's position at S1.
    argmax_write: ``In(ValidSignature(mask_layout(G·P′, L·abits)))`` (MaxPool) each lane's
        ``r*`` of window word ``g·P′ + q``; argmax: ``Out(MaskReadSignature(L·abits))`` the
        backward item's at S1.
    """

    def __init__(
        self,
        conv: ConvPipelineSignature,
        view: Conv2DView,
        *,
        lanes: int,
        groups: int,
        entries: int,
        x_lanes: int,
        x_words: int,
        x_format: QFormat,
        x_operand_bits: int,
        maxpool: bool,
    ) -> None:
        self.v, self.L, self.G, self.E = view, lanes, groups, entries
        self.Lw, self.kx, self.fx, self.xb = x_lanes, x_words, x_format, x_operand_bits
        self.maxpool, self.abits = maxpool, argmax_bits(view.window)
        self.m_depth = entries * groups * view.P
        members = {
            "write": In(ValidSignature(word_layout(x_words, x_lanes * x_format.bits))),
            "bases": In(StashBasesSignature(entries * x_words, self.m_depth)),
            "conv": In(conv.subset((0, 1))),
            "mask_write": In(ValidSignature(mask_layout(groups * view.P, lanes))),
            "operands": Out(StashOperandsSignature(x_operand_bits)),
            "mask": Out(MaskReadSignature(lanes)),
        }
        if maxpool:
            a = lanes * self.abits
            members["argmax_write"] = In(ValidSignature(mask_layout(groups * view.PQ, a)))
            members["argmax"] = Out(MaskReadSignature(a))
        super().__init__(members)

    def elaborate(self, platform) -> Module:
        m = Module()
        v, fx, b = self.v, self.fx, self.bases
        c0, c1 = conv_at(self.conv, 0), conv_at(self.conv, 1)
        m.submodules.xstash = xm = Memory(shape=self.Lw * fx.bits, depth=self.E * self.kx, init=[])
        xrf, xrb, xwp = xm.read_port(), xm.read_port(), xm.write_port()
        m.submodules.mask = mm = Memory(shape=self.L, depth=self.m_depth, init=[])
        mrd, mwr = mm.read_port(), mm.write_port()
        m.d.comb += [
            xwp.en.eq(self.write.valid),
            xwp.addr.eq(b.write + self.write.payload.word),
            xwp.data.eq(self.write.payload.data),
            xrf.addr.eq(b.fwd_x + c0.payload.xword),
            xrb.addr.eq(b.bwd_x + c0.payload.xword),
            mwr.en.eq(self.mask_write.valid),
            mwr.addr.eq(b.fwd_mask + self.mask_write.payload.group),
            mwr.data.eq(self.mask_write.payload.bits),
            mrd.addr.eq(b.bwd_mask + c0.payload.mword),
            self.mask.bits.eq(mrd.data),
        ]
        if self.maxpool:
            self._argmax(m, c0)

        # S1: the lane of the word, a padding zero, the bias input; registered at S2
        p1 = c1.payload
        bias = (1 << fx.frac) if v.bias else 0
        for port, out in ((xrf, self.operands.x_fwd), (xrb, self.operands.x_bwd)):
            word = port.data
            pick = word.as_signed() if self.Lw == 1 else word.word_select(p1.xlane, fx.bits)
            x2 = Signal(signed(self.xb), name=f"{'xf' if port is xrf else 'xb'}2")
            with m.If(c1.valid):
                m.d.sync += x2.eq(Mux(p1.bias_tap, bias, Mux(p1.pad, 0, pick.as_signed())))
            m.d.comb += out.eq(x2)
        return m

    def _argmax(self, m: Module, c0) -> None:
        """The argmax memory; its entry base from the mask's (one case per entry)."""
        v, b, G = self.v, self.bases, self.G
        depth = self.E * G * v.PQ
        m.submodules.argmax = am = Memory(shape=self.L * self.abits, depth=depth, init=[])
        ard, awr = am.read_port(), am.write_port()

        def scaled(base: Signal, name: str) -> Signal:
            out = Signal(range(max(depth, 2)), name=name)
            with m.Switch(base):
                for e in range(self.E):
                    with m.Case(e * G * v.P):
                        m.d.comb += out.eq(e * G * v.PQ)
            return out

        fwd, bwd = scaled(b.fwd_mask, "argmax_fwd"), scaled(b.bwd_mask, "argmax_bwd")
        m.d.comb += [
            awr.en.eq(self.argmax_write.valid),
            awr.addr.eq(fwd + self.argmax_write.payload.group),
            awr.data.eq(self.argmax_write.payload.bits),
            ard.addr.eq(bwd + c0.payload.aword),
            self.argmax.bits.eq(ard.data),
        ]
