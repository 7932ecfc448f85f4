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

from amaranth import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..compiler.plan import LossUnit as LossPlan
from .arith import const_mul, rhu, sat

__all__ = ["LossUnit", "loss_unit_cycles"]

SAT_MAX = (1 << 32) - 1


def loss_unit_cycles(kind: str, classes: int, recip_frac: int) -> int:
    """Cycles from the start pulse until ``done`` is high again (derived from the phases):
    cross-entropy ``3C + fr + 7``, MSE ``C + 3``."""
    if kind == "mse":
        return classes + 3
    return 3 * classes + recip_frac + 7


class LossUnit(wiring.Component):
    """Loss unit after the last stage.

    Parameters
    ----------
    loss: the plan's loss unit (formats, LUT, constants).
    z_lanes: logits per word of the input buffer (= the last stage's lanes).

    Members
    -------
    zw_en, zw_word, zw_data: ``In`` logits write from the last stage (``z_lanes`` per word).
    start: ``In(1)`` pulse: run on the buffered logits with ``label``.
    label: ``In(16)`` the class of the sample (held until ``done``).
    train: ``In(1)`` the sample trains (δ clamps are counted only then; held until ``done``).
    done: ``Out(1)`` not running (low from the start pulse until the last output).
    dl_en, dl_data: ``Out`` serial error ``δ_j``, ``j = 0..C−1`` (format ``loss.d``).
    pred: ``Out(16)`` argmax of the logits (valid from ``done`` to the next start).
    loss: ``Out(32)`` ``p_y`` (CE, frac ``recip_frac``) or ``Σ(z−t)²`` (MSE, saturated).
    saturations: ``Out(32)`` δ clamps (saturating counter).
    """

    def __init__(self, loss: LossPlan, z_lanes: int) -> None:
        if loss.kind not in ("cross_entropy", "mse"):
            raise NotImplementedError(f"loss {loss.kind!r} has no hardware loss unit")
        self.lp, self.zl = loss, z_lanes
        C = loss.classes
        self.words = -(-C // z_lanes)
        super().__init__(
            {
                "zw_en": In(1),
                "zw_word": In(range(max(self.words, 2))),
                "zw_data": In(z_lanes * loss.z.bits),
                "start": In(1),
                "label": In(16),
                "train": In(1),
                "done": Out(1),
                "dl_en": Out(1),
                "dl_data": Out(signed(loss.d.bits)),
                "pred": Out(16),
                "loss": Out(32),
                "saturations": Out(32),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        lp, Lz = self.lp, self.zl
        C, fz, fd = lp.classes, lp.z, lp.d
        zm = Memory(shape=Lz * fz.bits, depth=self.words, init=[])
        m.submodules.zbuf = zm
        zr, zwp = zm.read_port(), zm.write_port()
        m.d.comb += [zwp.en.eq(self.zw_en), zwp.addr.eq(self.zw_word), zwp.data.eq(self.zw_data)]

        # issue counters: j, word q, lane sel
        j0 = Signal(range(C + 1))
        q0 = Signal(range(max(self.words, 2)))
        s0 = Signal(range(max(Lz, 2)))
        issue = Signal()
        m.d.comb += zr.addr.eq(q0)

        def advance():
            m.d.sync += j0.eq(j0 + 1)
            if Lz > 1:
                with m.If(s0 == Lz - 1):
                    m.d.sync += [s0.eq(0), q0.eq(q0 + 1)]
                with m.Else():
                    m.d.sync += s0.eq(s0 + 1)
            else:
                m.d.sync += q0.eq(q0 + 1)

        def restart():
            m.d.sync += [j0.eq(0), q0.eq(0), s0.eq(0)]

        v1 = Signal()
        j1 = Signal.like(j0)
        s1 = Signal.like(s0)
        m.d.sync += [v1.eq(issue), j1.eq(j0), s1.eq(s0)]
        z1 = (zr.data.word_select(s1, fz.bits) if Lz > 1 else zr.data).as_signed()

        label = self.label
        zmax = Signal(signed(fz.bits))
        arg = Signal(16)

        cnt = Signal(32)
        dl_en = Signal()
        dl_d = Signal(signed(fd.bits))
        dl_s = Signal()
        m.d.comb += [self.dl_en.eq(dl_en), self.dl_data.eq(dl_d)]
        loss_v = Signal(32)
        m.d.comb += [self.pred.eq(arg), self.loss.eq(loss_v)]
        nxt = cnt + (dl_en & dl_s & self.train)
        m.d.sync += cnt.eq(Mux(nxt > SAT_MAX, SAT_MAX, nxt))
        m.d.comb += self.saturations.eq(cnt)
        m.d.sync += dl_en.eq(0)

        if lp.kind == "mse":
            sc = lp.mse_scale
            diff = z1 - Mux(j1 == label, 1 << fz.frac, 0)
            dv, dc = sat(rhu(const_mul(sc.value, diff), fz.frac + sc.frac - fd.frac), fd)
            acc = Signal(2 * (fz.bits + 1) + max(1, C.bit_length()))
            with m.If(v1):
                m.d.sync += [dl_en.eq(1), dl_d.eq(dv), dl_s.eq(dc)]
                m.d.sync += acc.eq(Mux(j1 == 0, 0, acc) + diff * diff)
                with m.If((j1 == 0) | (z1 > zmax)):
                    m.d.sync += [zmax.eq(z1), arg.eq(j1)]
            m.d.comb += loss_v.eq(Mux(acc > SAT_MAX, SAT_MAX, acc))
            with m.FSM():
                with m.State("IDLE"):
                    m.d.comb += self.done.eq(~self.start)
                    with m.If(self.start):
                        restart()
                        m.next = "RUN"
                with m.State("RUN"):
                    m.d.comb += issue.eq(1)
                    advance()
                    with m.If(j0 == C - 1):
                        m.next = "TAIL"
                with m.State("TAIL"):
                    with m.If(~v1):
                        m.next = "IDLE"
            return m

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
        v_max, v_exp, v_out = v1 & (ph1 == 0), v1 & (ph1 == 1), v1 & (ph1 == 2)
        with m.If(v_max & ((j1 == 0) | (z1 > zmax))):
            m.d.sync += [zmax.eq(z1), arg.eq(j1)]

        # exp phase: t_j and the LUT index at S1, the LUT entry at S2
        t1 = zmax - z1
        idx = rhu(t1, fz.frac - fl)
        m.d.comb += lr.addr.eq(Mux(idx > K - 1, K - 1, idx))
        v2 = Signal()
        j2 = Signal.like(j0)
        m.d.sync += [v2.eq(v_exp), j2.eq(j1)]
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
        dv, dc = sat(rhu(p1, fr - fd.frac) - Mux(j1 == label, 1 << fd.frac, 0), fd)
        m.d.comb += er.addr.eq(j0)
        with m.If(v_out):
            m.d.sync += [dl_en.eq(1), dl_d.eq(dv), dl_s.eq(dc)]
            with m.If(j1 == label):
                m.d.sync += loss_v.eq(p1)

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.done.eq(~self.start)
                with m.If(self.start):
                    restart()
                    m.d.sync += loss_v.eq(0)
                    m.next = "MAX"
            with m.State("MAX"):
                m.d.comb += [issue.eq(1), ph0.eq(0)]
                advance()
                with m.If(j0 == C - 1):
                    restart()
                    m.next = "EXP"
            with m.State("EXP"):
                m.d.comb += [issue.eq(1), ph0.eq(1)]
                advance()
                with m.If(j0 == C - 1):
                    m.next = "EXP_TAIL"
            with m.State("EXP_TAIL"):
                with m.If(~v1 & ~v2):
                    m.d.sync += [
                        R.eq(1 << (fe + fr)),
                        D.eq(E << fr),
                        r.eq(0),
                        step.eq(0),
                    ]
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
                    restart()
                    m.next = "OUT"
            with m.State("OUT"):
                m.d.comb += [issue.eq(1), ph0.eq(2)]
                advance()
                with m.If(j0 == C - 1):
                    m.next = "OUT_TAIL"
            with m.State("OUT_TAIL"):
                with m.If(~v1):
                    m.next = "IDLE"
        return m
