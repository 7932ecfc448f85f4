"""Pooling in a convolution stage's output path: MaxPool / AvgPool forward, and the error's way
back through it (docs/numerics.md §9.1 step 3, §9.2 step 1).

**Forward** (:class:`PoolUnit`): after each output position's bias tap the forward lanes give
the position's ``L`` activations (S4). Positions come row-major, so the positions of one window
arrive in the window's own row-major order, interleaved with the other windows of the same
pooled row: the unit keeps one running state per lane and window column (one for windows one
row high). ``max``: the first position of a window loads the state, a later one replaces it only
when strictly larger — the **first** largest value wins, and its offset ``r*`` is kept;
``avg``: the state sums the window. At the window's last position the pooled output leaves as
one word ``g·P′ + q`` of ``L`` values (with ``r*`` for the stash's argmax memory; the mean is
``sat(rhu(Σ·pool_scale, pool_shift), y)``, its clamps counted). Without pooling every position
leaves as word ``g·P + p``. Positions in no whole window are dropped.

**Backward** (:func:`pool_backward`): the error ``g`` of window ``q`` goes to the position
holding ``r*`` (``max``; 0 elsewhere) or, as ``rhu(g·pool_scale, pool_shift)``, to every
position of the window (``avg``); positions in no window get 0.

Source: docs/numerics.md §9.1–§9.2 (the arithmetic), PyTorch's ``MaxPool*``/``AvgPool*``
(kernel = stride, ``ceil_mode=False``); the running state is *derived*.
"""

from __future__ import annotations

from collections.abc import Callable

from amaranth import Array, Cat, Module, Mux, Signal, Value, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..compiler.plan import QFormat
from .arith import const_mul, rhu, sat
from .conv import Conv2DView, ConvPipelineSignature, conv_at
from .conv_stash import argmax_bits
from .streams import SlotPipelineSignature, ValidSignature, mask_layout, slot_at, word_layout

__all__ = ["PoolUnit", "pool_backward"]


def pool_backward(
    pool: str,
    g: Value,
    r: Value,
    inwin: Value,
    argmax: Value | None,
    scale: int,
    shift: int,
    shift_add: Callable[[int], bool],
) -> Value:
    """The error ``e`` of one lane at a conv output position from its window's error ``g``
    (docs/numerics.md §9.2 step 1): ``pool`` ``none`` → ``g``; ``max`` → ``g`` where the
    position's offset ``r`` is the stashed ``argmax``, else 0; ``avg`` → ``rhu(g·scale,
    shift)`` (no clamp: ``|e| ≤ |g|``); 0 outside every window (``inwin`` low)."""
    if pool == "none":
        return g
    if pool == "max":
        return Mux(inwin & (argmax == r), g, 0)
    return Mux(inwin, rhu(const_mul(scale, g, shift_add), shift), 0)


class PoolUnit(wiring.Component):
    """MaxPool / AvgPool (or none) of a convolution stage's forward output (module docstring).

    Parameters
    ----------
    pipeline: the standard slot pipeline (its S4 ``last_group``: padding lanes).
    conv: the convolution payload pipeline (S4: ``aword``, ``wcol``, ``r``, ``inwin``,
        ``win_first``, ``win_last``).
    view: the stage's :class:`~pipetrain.hdl.conv.Conv2DView`. pool: ``none``, ``max``,
        ``avg``. scale, shift: AvgPool's ``pool_scale``, ``pool_shift``.
    lanes: L. groups: G. live_last: lanes live in the last group. y_format: Q-format of the
        activations and outputs. shift_add: the plan's constant-multiplier rule.

    Members
    -------
    slots: ``In(pipeline.subset(S4))``. conv: ``In(conv.subset(S4))``.
    a: ``In(ValidSignature(L·y.bits))`` the position's activations at S4 (valid after its bias
        tap in forward passes).
    y: ``Out(ValidSignature(word_layout(G·P′, L·y.bits)))`` the pooled outputs of a window (or
        of a position, without pooling), at S4.
    argmax_write: ``Out(ValidSignature(mask_layout(G·P′, L·abits)))`` (``max``) each lane's
        ``r*``, with ``y``.
    saturated: ``Out(L)`` (``avg``) per lane: the mean clamped (with ``y``; padding lanes 0).
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
        live_last: int,
        y_format: QFormat,
        shift_add: Callable[[int], bool],
    ) -> None:
        self.v, self.pool, self.scale, self.shift = view, pool, scale, shift
        self.L, self.G, self.live_last, self.fy = lanes, groups, live_last, y_format
        self.shift_add, self.abits = shift_add, argmax_bits(view.window)
        words = groups * view.PQ
        members = {
            "slots": In(pipeline.subset(stages=(4,))),
            "conv": In(conv.subset((4,))),
            "a": In(ValidSignature(lanes * y_format.bits)),
            "y": Out(ValidSignature(word_layout(words, lanes * y_format.bits))),
        }
        if pool == "max":
            members["argmax_write"] = Out(ValidSignature(mask_layout(words, lanes * self.abits)))
        if pool == "avg":
            members["saturated"] = Out(lanes)
        super().__init__(members)

    def elaborate(self, platform) -> Module:
        m = Module()
        v, L, fy = self.v, self.L, self.fy
        c4 = conv_at(self.conv, 4).payload
        a, y = self.a, self.y
        m.d.comb += y.payload.word.eq(c4.aword)
        if self.pool == "none":
            m.d.comb += [y.valid.eq(a.valid), y.payload.data.eq(a.payload)]
            return m
        fire = a.valid & c4.inwin
        m.d.comb += y.valid.eq(fire & c4.win_last)
        cols = v.PQW if v.QH > 1 else 1  # running states: one per window column
        outs, idxs, flags = [], [], []
        for lane in range(L):
            al = a.payload.word_select(lane, fy.bits).as_signed()
            if self.pool == "max":
                st = Array(Signal(signed(fy.bits), name=f"best{lane}_{k}") for k in range(cols))
                ix = Array(Signal(self.abits, name=f"arg{lane}_{k}") for k in range(cols))
                cur, icur = st[c4.wcol], ix[c4.wcol]
                take = c4.win_first | (al > cur)
                new, inew = Mux(take, al, cur), Mux(take, c4.r, icur)
                with m.If(fire):
                    m.d.sync += [cur.eq(new), icur.eq(inew)]
                outs.append(new)
                idxs.append(inew[: self.abits])
                continue
            bits = fy.bits + v.window.bit_length()
            st = Array(Signal(signed(bits), name=f"sum{lane}_{k}") for k in range(cols))
            cur = st[c4.wcol]
            new = Mux(c4.win_first, 0, cur) + al
            with m.If(fire):
                m.d.sync += cur.eq(new)
            mean, clamped = sat(rhu(const_mul(self.scale, new, self.shift_add), self.shift), fy)
            if lane >= self.live_last:
                clamped = clamped & ~slot_at(self.slots, 4).payload.last_group
            outs.append(mean)
            flags.append(fire & c4.win_last & clamped)
        m.d.comb += y.payload.data.eq(Cat(*outs))
        if self.pool == "max":
            m.d.comb += [
                self.argmax_write.valid.eq(y.valid),
                self.argmax_write.payload.group.eq(c4.aword),
                self.argmax_write.payload.bits.eq(Cat(*idxs)),
            ]
        else:
            m.d.comb += self.saturated.eq(Cat(*flags))
        return m
