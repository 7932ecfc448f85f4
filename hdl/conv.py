"""The slot sequencer of a convolution stage: positions × taps, phase by phase, with the address
generation of every slot.

A convolution stage's pass (docs/numerics.md §9, the plan's ``compiler/conv.py:conv_cycles``)
issues, one slot a cycle, in this order:

* **MAC**: ``for g in 0..G−1: for p in 0..P−1: for t in 0..T`` — from one read of the weight
  ``w[g·L + l][t]`` each lane makes the forward MAC of the forward item (ŵ·x, then after the
  position's bias tap ``t = T`` the rounding, activation and pooling) and the input-gradient
  (transposed correlation) and weight-gradient MACs of the backward item;
* a gap without a slot (:func:`~pipetrain.compiler.conv.conv_gap`: at least
  :data:`~pipetrain.compiler.conv.CONV_UPDATE_GAP` cycles, more when the input gradient needs
  them to be sent);
* **U** (update): ``for g: for t in 0..T`` — one momentum/SC update per weight from the summed
  gradient, the LFSR draws in numerics §6 slot order over the ``(C_out, T + 1)`` matrix.

Every MAC slot reads the weights before the tick's update; the input-gradient sums are complete
when the MAC phase ends and are sent while the gap and the U slots run. The gap keeps the MAC
slots out of the pipeline stages where the update unit writes back, so its ``bwd`` flag can be
the pass-wide "U phase" flag (``upd``).

Each slot's weight word is ``g·(T+1) + t`` (the Linear stage's slot ``(g, i)`` with ``i = t``);
the sequencer carries the standard :class:`~pipetrain.hdl.streams.SlotPipelineSignature`
(``col = t``) for the parts shared with the Linear stage and, beside it, a
:func:`conv_slot_layout` payload per pipeline stage (:class:`ConvPipelineSignature`): the
phase, the position, the stash word and lane of the input value tap ``t`` reads at position
``p`` (or a padding zero), the input index for the input-gradient sums, and the pooling window.
All addresses come from counters (no multiplier except by constants).

A 1-D convolution is the 2-D one with one row (:func:`conv2d_view`).

Timing: the start pulse is cycle 0, the first slot issues in cycle 1, ``done`` rises once the
last slot has left the write stage and ``hold`` is low: ``cycles − 1 + 2 + write_stage``
cycles (``Stage.pass_cycles``; ``cycles`` = ``Stage.cycles_per_tick``).

Source: docs/numerics.md §9 (the arithmetic and the slot order of the update), the plan's
cycle formula (``compiler/conv.py``); the phase order and the counters are *derived*.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth import Const, Module, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..compiler.conv import ConvGeometry, conv_gap
from .streams import (
    PassItemsSignature,
    SlotPipelineSignature,
    ValidSignature,
    _Signature,
    index_shape,
    slot_at,
)

__all__ = [
    "PHASE_MAC",
    "PHASE_UPD",
    "Conv2DView",
    "ConvPipelineSignature",
    "ConvSequencer",
    "conv2d_view",
    "conv_at",
    "conv_slot_layout",
    "connect_conv",
]

#: ``phase`` values of a slot: the MAC phase (forward and backward), the update phase.
PHASE_MAC, PHASE_UPD = 0, 2


@dataclass(frozen=True)
class Conv2DView:
    """A convolution's sizes as 2-D (a 1-D one has one row: height 1, kernel 1, stride 1,
    padding 0, pooling 1 in the first dimension).

    Members
    -------
    C, K: input and output channels. H, W: input size. KH, KW: kernel. SH, SW: stride.
    PH, PW: padding. OH, OW: output size. QH, QW: pooling window. PQH, PQW: pooled size.
    T: taps C·KH·KW. P: positions OH·OW. PQ: pooled positions. window: QH·QW.
    bias: the layer has a bias (the bias tap's input is ``2^x.frac``, else 0).
    """

    C: int
    K: int
    H: int
    W: int
    KH: int
    KW: int
    SH: int
    SW: int
    PH: int
    PW: int
    OH: int
    OW: int
    QH: int
    QW: int
    PQH: int
    PQW: int
    bias: bool

    @property
    def T(self) -> int:
        return self.C * self.KH * self.KW

    @property
    def P(self) -> int:
        return self.OH * self.OW

    @property
    def PQ(self) -> int:
        return self.PQH * self.PQW

    @property
    def window(self) -> int:
        return self.QH * self.QW

    @property
    def in_values(self) -> int:
        return self.C * self.H * self.W


def conv2d_view(g: ConvGeometry) -> Conv2DView:
    """The :class:`Conv2DView` of a plan's convolution geometry."""

    def two(t: tuple[int, ...], one: int) -> tuple[int, int]:
        return (one, t[0]) if len(t) == 1 else (t[0], t[1])

    (H, W), (KH, KW) = two(g.in_size, 1), two(g.kernel, 1)
    (SH, SW), (PH, PW) = two(g.stride, 1), two(g.padding, 0)
    (OH, OW), (QH, QW) = two(g.out_size, 1), two(g.pool_size, 1)
    PQH, PQW = two(g.pooled_size, 1)
    return Conv2DView(
        g.in_channels, g.out_channels, H, W, KH, KW, SH, SW, PH, PW, OH, OW, QH, QW, PQH, PQW,
        g.bias,
    )  # fmt: skip


def conv_slot_layout(v: Conv2DView, groups: int, x_words: int, x_lanes: int) -> data.StructLayout:
    """The per-slot payload of a convolution pass (beside the standard slot):

    ``phase`` (:data:`PHASE_MAC`, :data:`PHASE_UPD`); ``last_mac`` (the pass's last MAC
    slot); ``bias_tap`` (t = T, the bias column); ``first_pos``
    (p = 0: a weight-gradient sum starts); ``pad`` (tap t < T reads a padding zero);
    ``xword``/``xlane`` (the stash word in the entry and the value in it: channel c of input
    position (iy, ix) is word ``(c div Lw)·H·W + iy·W + ix``, lane ``c mod Lw``); ``xidx``
    (its input index ``c·H·W + iy·W + ix``, channel-major as the samples); ``mword``
    (``g·P + p``, the mask word of the position); ``aword`` (``g·P′ + q``: the pooled output,
    argmax and error word of the position's window ``q``; ``g·P + p`` without pooling);
    ``wcol`` (the window column ``q mod P′_W`` of the running pooling state); ``r`` (the
    position's offset in its window, row-major); ``inwin`` (the position is in a whole window);
    ``win_first``/``win_last`` (the window's first / last position)."""
    return data.StructLayout(
        {
            "phase": 2,
            "last_mac": 1,
            "bias_tap": 1,
            "first_pos": 1,
            "pad": 1,
            "xword": index_shape(x_words),
            "xlane": index_shape(x_lanes),
            "xidx": index_shape(v.in_values),
            "mword": index_shape(groups * v.P),
            "aword": index_shape(groups * v.PQ),
            "wcol": index_shape(v.PQW),
            "r": index_shape(v.window),
            "inwin": 1,
            "win_first": 1,
            "win_last": 1,
        }
    )


class ConvPipelineSignature(_Signature):
    """The convolution payload of each slot down the pipeline (sequencer → parts), beside the
    standard :class:`~pipetrain.hdl.streams.SlotPipelineSignature`: ``c0 … c{depth}``, each
    ``Out(ValidSignature(layout))`` (valid with the slot at that stage; use :func:`conv_at`).

    Parameters
    ----------
    layout: :func:`conv_slot_layout`. depth: the write stage. stages: the stages present
    (default all; a part declares what it reads, :meth:`subset`).
    """

    def __init__(
        self, layout: data.StructLayout, depth: int, stages: tuple[int, ...] | None = None
    ) -> None:
        self.layout, self.depth = layout, depth
        self.stages = tuple(range(depth + 1)) if stages is None else tuple(sorted(set(stages)))
        if any(not 0 <= k <= depth for k in self.stages):
            raise ValueError(f"pipeline stages {self.stages} outside 0..{depth}")
        super().__init__({f"c{k}": Out(ValidSignature(layout)) for k in self.stages})

    def subset(self, stages: tuple[int, ...]) -> ConvPipelineSignature:
        """The same payload at ``stages`` only."""
        return ConvPipelineSignature(self.layout, self.depth, stages)


def conv_at(pipeline, stage: int):
    """The valid-only payload stream of a :class:`ConvPipelineSignature` interface at
    ``stage``."""
    return getattr(pipeline, f"c{stage}")


def connect_conv(m: Module, source, *sinks) -> None:
    """Drive every stage a sink declares from the sequencer's full payload ``source``."""
    for sink in sinks:
        for k in sink.signature.stages:
            a, b = conv_at(source, k), conv_at(sink, k)
            m.d.comb += [b.valid.eq(a.valid), b.payload.eq(a.payload)]


class ConvSequencer(wiring.Component):
    """Issues the slots of a convolution pass and carries them down the pipeline (module
    docstring).

    Parameters
    ----------
    pipeline: the standard slot pipeline (``in_features`` = T, row groups G, ``words`` =
        G·(T+1), depth = the write stage).
    geometry: the stage's :class:`~pipetrain.compiler.conv.ConvGeometry`.
    x_words: stash words per entry; x_lanes: values per stash word (the writer's lanes).
    cycles: slot cycles of a pass (``Stage.cycles_per_tick``; checked against the phases).

    Members
    -------
    items: ``In(PassItemsSignature())`` start pulse and item flags in, ``done`` out.
    slots: ``Out(pipeline)`` the standard slot at every stage (``col`` = t), the latched flags,
        ``busy`` and the weight read / write-back addresses (the write-back counter counts U
        slots).
    conv: ``Out(ConvPipelineSignature(conv_slot_layout(…), depth))`` the payload per stage.
    upd: ``Out(1)`` the U phase has begun (every slot still in the pipeline is an update slot).
    hold: ``In(1)`` keep ``done`` low (a part still busy: the input gradient being sent).

    Raises ValueError when ``cycles`` is not the phases' count (the plan and the HDL disagree).
    """

    def __init__(
        self,
        pipeline: SlotPipelineSignature,
        geometry: ConvGeometry,
        *,
        x_words: int,
        x_lanes: int,
        cycles: int,
    ) -> None:
        v = conv2d_view(geometry)
        G = pipeline.row_groups
        if pipeline.in_features != v.T or pipeline.words != G * (v.T + 1):
            raise ValueError(f"pipeline of {pipeline.in_features} columns ≠ T = {v.T}")
        self.gap = conv_gap(geometry, G)
        want = G * (v.T + 1) * (v.P + 1) + self.gap
        if cycles != want:
            raise ValueError(f"{cycles} cycles per pass, the phases take {want}")
        self.pipeline, self.v, self.G = pipeline, v, G
        self.x_words, self.x_lanes = x_words, x_lanes
        self.layout = conv_slot_layout(v, G, x_words, x_lanes)
        super().__init__(
            {
                "items": In(PassItemsSignature()),
                "slots": Out(pipeline),
                "conv": Out(ConvPipelineSignature(self.layout, pipeline.depth)),
                "upd": Out(1),
                "hold": In(1),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        v, G, Lw = self.v, self.G, self.x_lanes
        T = v.T
        pl, it, sp = self.pipeline, self.items, self.slots
        depth = pl.depth
        k = _Counters(v, G, Lw, pl.words)
        busy, upd, in_gap = Signal(), Signal(), Signal()
        gap = Signal(range(self.gap + 1))
        fe, ft, be = Signal(), Signal(), Signal()
        adv = busy & ~in_gap  # a slot issues (reads its memories) this cycle

        with m.If(it.start):
            m.d.sync += [busy.eq(1), upd.eq(0), in_gap.eq(0), gap.eq(0)]
            m.d.sync += [fe.eq(it.fwd), ft.eq(it.fwd_train), be.eq(it.bwd)]
            m.d.sync += [k.phase.eq(PHASE_MAC), *k.reset_group(), *k.reset_taps()]
            m.d.sync += k.reset_positions()
        with m.Elif(busy & in_gap):
            m.d.sync += gap.eq(gap + 1)
            with m.If(gap == self.gap - 1):
                m.d.sync += [in_gap.eq(0), upd.eq(1), k.phase.eq(PHASE_UPD)]
        with m.Elif(adv & (k.phase == PHASE_UPD)):
            with m.If(k.t == T):
                m.d.sync += [k.t.eq(0), k.g.eq(k.g + 1), k.gbase.eq(k.gbase + T + 1)]
                with m.If(k.g == G - 1):
                    m.d.sync += busy.eq(0)
            with m.Else():
                m.d.sync += k.t.eq(k.t + 1)
        with m.Elif(adv):  # MAC: the next tap, or the next position, group and phase
            with m.If(k.t == T):
                m.d.sync += [*k.reset_taps(), k.mword.eq(k.mword + 1)]
                k.next_position(m, in_gap)
            with m.Else():
                k.next_tap(m)

        self._issue(m, k, adv)
        # one register per stage, no enables (a bubble moves like a slot)
        for pipe, at in ((sp, slot_at), (self.conv, conv_at)):
            for s in range(1, depth + 1):
                src, dst = at(pipe, s - 1), at(pipe, s)
                valid = Signal(name=f"{'v' if pipe is sp else 'cv'}{s}")
                payload = Signal(dst.payload.shape(), name=f"{'slot' if pipe is sp else 'cs'}{s}")
                m.d.sync += [valid.eq(src.valid), payload.eq(src.payload)]
                m.d.comb += [dst.valid.eq(valid), dst.payload.eq(payload)]

        # write-back address: the U slots that reached the write stage, in order
        wk = Signal(range(pl.words + 1))
        with m.If(it.start):
            m.d.sync += wk.eq(0)
        with m.Elif(slot_at(sp, depth).valid & upd):
            m.d.sync += wk.eq(wk + 1)

        active = it.start | busy | self.hold
        for s in range(1, depth + 1):
            active = active | slot_at(sp, s).valid
        m.d.comb += [
            sp.start.eq(it.start),
            sp.busy.eq(busy),
            sp.fwd.eq(fe),
            sp.fwd_train.eq(ft),
            sp.bwd.eq(be),
            sp.read_addr.eq(k.gbase + k.t),
            sp.write_addr.eq(wk),
            self.upd.eq(upd),
            it.done.eq(~active),
            it.fwd_done.eq(~active),  # the outputs leave before the last write-back
        ]
        return m

    def _issue(self, m: Module, k: _Counters, adv) -> None:
        """S0: the standard slot and the convolution payload from the counters."""
        v, G = self.v, self.G
        bits = max(v.OH * v.SH + v.KH, v.OW * v.SW + v.KW, v.H, v.W).bit_length() + 2
        iy, ix = Signal(signed(bits), name="iy"), Signal(signed(bits), name="ix")
        m.d.comb += [  # constant strides and paddings: shifts and adders
            iy.eq(k.oy * v.SH + k.ky + Const(-v.PH, signed(bits))),
            ix.eq(k.ox * v.SW + k.kx + Const(-v.PW, signed(bits))),
        ]
        inside = (iy >= 0) & (iy < v.H) & (ix >= 0) & (ix < v.W)
        pos = iy.as_unsigned() * v.W + ix.as_unsigned()
        s0, c0 = slot_at(self.slots, 0), conv_at(self.conv, 0)
        pay = c0.payload
        m.d.comb += [
            s0.valid.eq(adv),
            s0.payload.col.eq(k.t),
            s0.payload.group.eq(k.g),
            s0.payload.last_group.eq(k.g == G - 1),
            c0.valid.eq(adv),
            pay.phase.eq(k.phase),
            pay.last_mac.eq(
                (k.phase == PHASE_MAC) & (k.g == G - 1) & (k.p == v.P - 1) & (k.t == v.T)
            ),  # fmt: skip
            pay.bias_tap.eq(k.t == v.T),
            pay.first_pos.eq(k.p == 0),
            pay.pad.eq(~inside),
            pay.xword.eq(k.cw * (v.H * v.W) + pos),
            pay.xlane.eq(k.cl),
            pay.xidx.eq(k.c * (v.H * v.W) + pos),
            pay.mword.eq(k.mword),
            pay.aword.eq(k.mword if v.window == 1 else k.qbase + k.qx),
            pay.wcol.eq(k.qx if v.QH > 1 else 0),
            pay.r.eq(k.ry * v.QW + k.rx),
            pay.inwin.eq((k.oy < v.PQH * v.QH) & (k.ox < v.PQW * v.QW)),
            pay.win_first.eq((k.ry == 0) & (k.rx == 0)),
            pay.win_last.eq((k.ry == v.QH - 1) & (k.rx == v.QW - 1)),
        ]


class _Counters:
    """The sequencer's slot counters (internal): phase, group ``g`` (``gbase`` = g·(T+1)),
    position ``(oy, ox)`` = ``p`` (``mword`` = g·P + p), tap ``t`` = ``(c, ky, kx)`` with
    ``c`` = ``cw``·Lw + ``cl``, and the pooling window: offsets ``(ry, rx)``, window ``(qy,
    qx)``, ``qbase`` = g·P′ + qy·P′_W."""

    def __init__(self, v: Conv2DView, G: int, Lw: int, words: int) -> None:
        self.v, self.G, self.Lw = v, G, Lw

        def ctr(n: int, name: str) -> Signal:
            return Signal(range(max(n, 2)), name=name)

        self.phase = Signal(2, name="phase")
        self.g, self.gbase = ctr(G, "g"), ctr(words + 1, "gbase")
        self.oy, self.ox, self.p = ctr(v.OH, "oy"), ctr(v.OW, "ox"), ctr(v.P, "p")
        self.mword = ctr(G * v.P, "mword")
        self.t, self.c = ctr(v.T + 1, "t"), ctr(v.C, "c")
        self.cw, self.cl = ctr(-(-v.C // Lw), "cw"), ctr(Lw, "cl")
        self.ky, self.kx = ctr(v.KH, "ky"), ctr(v.KW, "kx")
        self.ry, self.rx = ctr(v.QH, "ry"), ctr(v.QW, "rx")
        self.qy, self.qx = ctr(v.OH + 1, "qy"), ctr(v.OW + 1, "qx")
        self.qbase = ctr(G * v.PQ + 1, "qbase")

    def reset_taps(self) -> list:
        return [s.eq(0) for s in (self.t, self.cw, self.cl, self.c, self.ky, self.kx)]

    def reset_positions(self) -> list:
        return [s.eq(0) for s in (self.oy, self.ox, self.p, self.ry, self.rx, self.qy, self.qx)]

    def reset_group(self) -> list:
        return [s.eq(0) for s in (self.g, self.gbase, self.mword, self.qbase)]

    def next_tap(self, m: Module) -> None:
        """t + 1: kx, then ky, then the channel (and its stash word and lane)."""
        v = self.v
        m.d.sync += self.t.eq(self.t + 1)
        with m.If(self.kx != v.KW - 1):
            m.d.sync += self.kx.eq(self.kx + 1)
        with m.Elif(self.ky != v.KH - 1):
            m.d.sync += [self.kx.eq(0), self.ky.eq(self.ky + 1)]
        with m.Else():
            m.d.sync += [self.kx.eq(0), self.ky.eq(0), self.c.eq(self.c + 1)]
            with m.If(self.cl == self.Lw - 1):
                m.d.sync += [self.cl.eq(0), self.cw.eq(self.cw + 1)]
            with m.Else():
                m.d.sync += self.cl.eq(self.cl + 1)

    def next_position(self, m: Module, in_gap: Signal) -> None:
        """After a position's bias tap: the next position (row-major), else the next group,
        else the gap."""
        v = self.v

        def step(r, q, size):  # the window offset and window index along one dimension
            with m.If(r == size - 1):
                m.d.sync += [r.eq(0), q.eq(q + 1)]
            with m.Else():
                m.d.sync += r.eq(r + 1)

        with m.If(self.ox != v.OW - 1):
            m.d.sync += [self.ox.eq(self.ox + 1), self.p.eq(self.p + 1)]
            step(self.rx, self.qx, v.QW)
        with m.Elif(self.oy != v.OH - 1):
            m.d.sync += [self.ox.eq(0), self.rx.eq(0), self.qx.eq(0)]
            m.d.sync += [self.oy.eq(self.oy + 1), self.p.eq(self.p + 1)]
            with m.If(self.ry == v.QH - 1):
                m.d.sync += self.qbase.eq(self.qbase + v.PQW)
            step(self.ry, self.qy, v.QH)
        with m.Else():  # the group's last position
            m.d.sync += self.reset_positions()
            m.d.sync += [self.g.eq(self.g + 1), self.gbase.eq(self.gbase + v.T + 1)]
            m.d.sync += self.qbase.eq((self.g + 1) * v.PQ)
            with m.If(self.g == self.G - 1):
                m.d.sync += [*self.reset_group(), in_gap.eq(1)]
