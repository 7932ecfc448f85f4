"""The loss unit: softmax cross-entropy (or MSE) gradient, argmax and loss value (numerics §4).

Cross-entropy runs four sequential phases over the ``C`` logits, one logit per cycle:

1. **max**: ``zmax``, ``pred = argmax`` (lowest index on ties);
2. **exp**: ``idx_j = min(rhu(zmax − z_j, fy − fl), K − 1)``, ``e_j = LUT[idx_j]`` (a ROM),
   ``E = Σ e_j``; the ``e_j`` go to a small memory;
3. **divide**: ``r = ⌊2^(fe+fr) / E⌋`` with a restoring divider, one quotient bit per cycle
   (``E ≥ 2^fe`` so the quotient has ``fr + 1`` bits);
4. **out**: ``p_j = rhu(e_j·r, fe)``, ``δ_j = sat(rhu(p_j, fr − d.frac) − [j = y]·2^d.frac, d)``
   streamed to stage S's error buffer; ``p_y`` is the loss output.

MSE is one phase: ``δ_j = sat(rhu((z_j − t_j)·scale, fy + scale.frac − d.frac), d)``, argmax and
``Σ (z_j − t_j)^2`` (``2·fy`` fraction bits, saturated to 32 bits at the port).

δ is formed for every sample; its clamps count on the unit's saturation counter only for
training samples (an inference sample's δ is not used; the golden model does not form it).
Source: docs/numerics.md §4 (the arithmetic); docs/architecture.md §3 (LUT exp + reciprocal);
the phase structure and the restoring divider are *derived* (smallest hardware, one result per
cycle). Cycles: :func:`loss_unit_cycles`.
"""

from __future__ import annotations

from collections.abc import Callable

from amaranth import Cat, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..compiler.plan import LossUnit as LossPlan
from .arith import const_mul, rhu, sat
from .streams import LossControlSignature, ValidSignature, word_layout

__all__ = ["LossUnit", "loss_unit_cycles"]

SAT_MAX = (1 << 32) - 1


def loss_unit_cycles(kind: str, classes: int, recip_frac: int) -> int:
    """Cycles from the start pulse until ``done`` is high again (derived from the phases):
    cross-entropy ``3C + fr + 7``, MSE ``C + 3``."""
    if kind == "mse":
        return classes + 3
    return 3 * classes + recip_frac + 7


class _Shared:
    """The signals the phases of :class:`LossUnit` share (issue counters, the S1 logit, the
    running maximum and the outputs)."""


class LossUnit(wiring.Component):
    """Loss unit after the last stage.

    Parameters
    ----------
    loss: the plan's loss unit (formats, LUT, constants) and the logit buffer's geometry:
        ``loss.z_lanes`` logits per word (the last stage's lanes), ``loss.z_words`` words of
        ``loss.z_word_bits`` bits.
    shift_add: the plan's constant-multiplier rule (:meth:`~pipetrain.compiler.plan.Plan.
        shift_add`), for the MSE scale.

    Members
    -------
    z_in: ``In(ValidSignature(word_layout(words, z_lanes·z.bits)))`` logits from the last stage
        (``z_lanes`` per word; cannot stall).
    ctl: ``In(LossControlSignature())``: ``start`` pulse runs on the buffered logits with
        ``label`` and ``train`` (δ clamps are counted only for training samples; both held
        until ``done``); ``done`` is low from the start pulse until the last output.
    delta: ``Out(ValidSignature(signed(loss.d.bits)))`` serial error ``δ_j``, ``j = 0..C−1``
        (cannot stall).
    pred: ``Out(16)`` argmax of the logits (valid from ``done`` to the next start).
    loss: ``Out(32)`` ``p_y`` (CE, frac ``recip_frac``) or ``Σ(z−t)²`` (MSE, saturated).
    saturations: ``Out(32)`` δ clamps (saturating counter).
    """

    def __init__(self, loss: LossPlan, shift_add: Callable[[int], bool]) -> None:
        if loss.kind not in ("cross_entropy", "mse"):
            raise NotImplementedError(f"loss {loss.kind!r} has no hardware loss unit")
        self.lp, self.zl = loss, loss.z_lanes
        self.shift_add = shift_add
        self.words = loss.z_words
        super().__init__(
            {
                "z_in": In(ValidSignature(word_layout(self.words, loss.z_word_bits))),
                "ctl": In(LossControlSignature()),
                "delta": Out(ValidSignature(signed(loss.d.bits))),
                "pred": Out(16),
                "loss": Out(32),
                "saturations": Out(32),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        lp, Lz = self.lp, self.zl
        C, fz, fd = lp.classes, lp.z, lp.d
        zm = Memory(shape=lp.z_word_bits, depth=self.words, init=[])
        m.submodules.zbuf = zm
        zr, zwp = zm.read_port(), zm.write_port()
        zi = self.z_in
        m.d.comb += [
            zwp.en.eq(zi.valid),
            zwp.addr.eq(zi.payload.word),
            zwp.data.eq(zi.payload.data),
        ]

        # issue counters: j, word q, lane sel; the logit z_j one cycle later (S1)
        c = _Shared()
        c.j0 = Signal(range(C + 1))
        c.q0 = Signal(range(max(self.words, 2)))
        c.s0 = Signal(range(max(Lz, 2)))
        c.issue = Signal()
        m.d.comb += zr.addr.eq(c.q0)
        c.v1 = Signal()
        c.j1 = Signal.like(c.j0)
        s1 = Signal.like(c.s0)
        m.d.sync += [c.v1.eq(c.issue), c.j1.eq(c.j0), s1.eq(c.s0)]
        c.z1 = (zr.data.word_select(s1, fz.bits) if Lz > 1 else zr.data).as_signed()
        c.zmax = Signal(signed(fz.bits))
        c.arg = Signal(16)

        # outputs: δ stream, pred, loss value, saturation counter
        cnt = Signal(32)
        c.dl_en = Signal()
        c.dl_d = Signal(signed(fd.bits))
        c.dl_s = Signal()
        m.d.comb += [self.delta.valid.eq(c.dl_en), self.delta.payload.eq(c.dl_d)]
        c.loss_v = Signal(32)
        m.d.comb += [self.pred.eq(c.arg), self.loss.eq(c.loss_v)]
        nxt = cnt + (c.dl_en & c.dl_s & self.ctl.train)
        m.d.sync += cnt.eq(Mux(nxt > SAT_MAX, SAT_MAX, nxt))
        m.d.comb += self.saturations.eq(cnt)
        m.d.sync += c.dl_en.eq(0)
        if lp.kind == "mse":
            self._mse(m, c)
        else:
            self._cross_entropy(m, c)
        return m

    def _advance(self, m: Module, c: _Shared) -> None:
        """Issue the next logit: j + 1, next lane of the word (or the next word)."""
        m.d.sync += c.j0.eq(c.j0 + 1)
        if self.zl > 1:
            with m.If(c.s0 == self.zl - 1):
                m.d.sync += [c.s0.eq(0), c.q0.eq(c.q0 + 1)]
            with m.Else():
                m.d.sync += c.s0.eq(c.s0 + 1)
        else:
            m.d.sync += c.q0.eq(c.q0 + 1)

    @staticmethod
    def _restart(m: Module, c: _Shared) -> None:
        m.d.sync += [c.j0.eq(0), c.q0.eq(0), c.s0.eq(0)]

    def _mse(self, m: Module, c: _Shared) -> None:
        """One phase: δ_j, argmax and Σ (z_j − t_j)² as the logits arrive."""
        lp, C, fz, fd = self.lp, self.lp.classes, self.lp.z, self.lp.d
        label = self.ctl.label
        sc = lp.mse_scale
        diff = c.z1 - Mux(c.j1 == label, 1 << fz.frac, 0)
        dv, dc = sat(
            rhu(const_mul(sc.value, diff, self.shift_add), fz.frac + sc.frac - fd.frac), fd
        )
        acc = Signal(2 * (fz.bits + 1) + max(1, C.bit_length()))
        with m.If(c.v1):
            m.d.sync += [c.dl_en.eq(1), c.dl_d.eq(dv), c.dl_s.eq(dc)]
            m.d.sync += acc.eq(Mux(c.j1 == 0, 0, acc) + diff * diff)
            with m.If((c.j1 == 0) | (c.z1 > c.zmax)):
                m.d.sync += [c.zmax.eq(c.z1), c.arg.eq(c.j1)]
        m.d.comb += c.loss_v.eq(Mux(acc > SAT_MAX, SAT_MAX, acc))
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.ctl.done.eq(~self.ctl.start)
                with m.If(self.ctl.start):
                    self._restart(m, c)
                    m.next = "RUN"
            with m.State("RUN"):
                m.d.comb += c.issue.eq(1)
                self._advance(m, c)
                with m.If(c.j0 == C - 1):
                    m.next = "TAIL"
            with m.State("TAIL"):
                with m.If(~c.v1):
                    m.next = "IDLE"

    def _cross_entropy(self, m: Module, c: _Shared) -> None:
        """Four phases over the logits: max, exp (LUT), divide, out (see the module
        docstring)."""
        lp, C, fz, fd = self.lp, self.lp.classes, self.lp.z, self.lp.d
        label = self.ctl.label
        fl, fe, fr = lp.exp_lut_frac, lp.exp_frac, lp.recip_frac
        K = len(lp.exp_lut)
        lut = Memory(shape=unsigned(fe + 1), depth=K, init=list(lp.exp_lut))
        m.submodules.lut = lut
        lr = lut.read_port()
        em = Memory(shape=unsigned(fe + 1), depth=C, init=[])
        m.submodules.ebuf = em
        er, ew = em.read_port(), em.write_port()

        # the phase that issued the read now arriving at S1: 0 max, 1 exp, 2 out
        ph0 = Signal(2)
        ph1 = Signal(2)
        m.d.sync += ph1.eq(ph0)
        v_max, v_exp, v_out = c.v1 & (ph1 == 0), c.v1 & (ph1 == 1), c.v1 & (ph1 == 2)
        with m.If(v_max & ((c.j1 == 0) | (c.z1 > c.zmax))):
            m.d.sync += [c.zmax.eq(c.z1), c.arg.eq(c.j1)]

        # exp phase: t_j and the LUT index at S1, the LUT entry at S2
        t1 = c.zmax - c.z1
        idx = rhu(t1, fz.frac - fl)
        m.d.comb += lr.addr.eq(Mux(idx > K - 1, K - 1, idx))
        v2 = Signal()
        j2 = Signal.like(c.j0)
        m.d.sync += [v2.eq(v_exp), j2.eq(c.j1)]
        E = Signal(fe + 1 + max(1, C.bit_length()))
        m.d.comb += [ew.en.eq(v2), ew.addr.eq(j2), ew.data.eq(lr.data)]
        with m.If(v2):
            m.d.sync += E.eq(Mux(j2 == 0, 0, E) + lr.data)

        # divider: R = 2^(fe+fr), D = E << fr halving each step: fr+1 quotient bits
        nb = fe + fr + max(1, C.bit_length()) + 1
        R = Signal(nb)
        D = Signal(nb)
        r = Signal(fr + 1)
        step = Signal(range(fr + 2))

        # out phase: e_j from the e memory at S1
        e1 = er.data
        p1 = Signal(fr + 2)  # p ≤ 2^fr (+ one rounding bit of headroom)
        m.d.comb += p1.eq(rhu(e1 * r, fe))
        dv, dc = sat(rhu(p1, fr - fd.frac) - Mux(c.j1 == label, 1 << fd.frac, 0), fd)
        m.d.comb += er.addr.eq(c.j0)
        with m.If(v_out):
            m.d.sync += [c.dl_en.eq(1), c.dl_d.eq(dv), c.dl_s.eq(dc)]
            with m.If(c.j1 == label):
                m.d.sync += c.loss_v.eq(p1)
        self._ce_phases(m, c, ph0, v2, E, R, D, r, step)

    def _ce_phases(
        self, m: Module, c: _Shared, ph0: Signal, v2: Signal, E: Value, R, D, r, step
    ) -> None:
        """The cross-entropy state machine: IDLE → MAX → EXP → DIV → OUT → IDLE."""
        C, fe, fr = self.lp.classes, self.lp.exp_frac, self.lp.recip_frac
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.ctl.done.eq(~self.ctl.start)
                with m.If(self.ctl.start):
                    self._restart(m, c)
                    m.d.sync += c.loss_v.eq(0)
                    m.next = "MAX"
            with m.State("MAX"):
                m.d.comb += [c.issue.eq(1), ph0.eq(0)]
                self._advance(m, c)
                with m.If(c.j0 == C - 1):
                    self._restart(m, c)
                    m.next = "EXP"
            with m.State("EXP"):
                m.d.comb += [c.issue.eq(1), ph0.eq(1)]
                self._advance(m, c)
                with m.If(c.j0 == C - 1):
                    m.next = "EXP_TAIL"
            with m.State("EXP_TAIL"):
                with m.If(~c.v1 & ~v2):
                    m.d.sync += [R.eq(1 << (fe + fr)), D.eq(E << fr), r.eq(0), step.eq(0)]
                    m.next = "DIV"
            with m.State("DIV"):
                ge = R >= D
                m.d.sync += [
                    R.eq(Mux(ge, R - D, R)),
                    D.eq(D >> 1),
                    r.eq(Cat(ge, r[:-1])),
                    step.eq(step + 1),
                ]
                with m.If(step == fr):
                    self._restart(m, c)
                    m.next = "OUT"
            with m.State("OUT"):
                m.d.comb += [c.issue.eq(1), ph0.eq(2)]
                self._advance(m, c)
                with m.If(c.j0 == C - 1):
                    m.next = "OUT_TAIL"
            with m.State("OUT_TAIL"):
                with m.If(~c.v1):
                    m.next = "IDLE"
