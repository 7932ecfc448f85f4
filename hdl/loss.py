"""The loss unit: softmax cross-entropy (or MSE) gradient, argmax and loss value (numerics §4).

Cross-entropy takes the maximum as the logits arrive and then runs three phases:

0. **max** (while stage S writes the logit words): ``zmax``, ``pred = argmax`` (lowest index
   on ties), a comparison tree over each word's lanes with a register after each level, so
   the exp phase starts ``⌈log2 z_lanes⌉`` cycles after the start pulse;
1. **exp**: ``P`` = ``exp_lanes`` logits a cycle, ``idx_j = min(rhu(zmax − z_j, fy − fl),
   K − 1)``, ``e_j = LUT[idx_j]`` (a ROM with P read ports), ``E = Σ e_j``; the ``e_j`` go to a
   small memory, P per word;
2. **divide**: ``r = ⌊2^(fe+fr) / E⌋`` by long division, ``k`` = ``div_bits`` quotient bits a
   cycle (``E ≥ 2^fe`` so the quotient has ``fr + 1`` bits);
3. **out**: ``p_j = rhu(e_j·r, fe)``, ``δ_j = sat(rhu(p_j, fr − d.frac) − [j = y]·2^d.frac, d)``
   streamed to stage S's error buffer, ``Q`` = ``out_lanes`` a cycle (one write of ``Q``
   errors); ``p_y`` is the loss output.

``P``, ``k`` and ``Q`` are the plan's (:mod:`pipetrain.compiler.loss_unit` picks the smallest
setting that keeps the loss unit off the tick); every setting computes the same integers.

MSE is one phase: ``δ_j = sat(rhu((z_j − t_j)·scale, fy + scale.frac − d.frac), d)``, argmax and
``Σ (z_j − t_j)^2`` (``2·fy`` fraction bits, saturated to 32 bits at the port).

δ is formed for every sample; its clamps count on the unit's saturation counter only for
training samples (an inference sample's δ is not used; the golden model does not form it).
Source: docs/numerics.md §4 (the arithmetic); docs/architecture.md §3.8 (LUT exp + reciprocal);
the phase structure, the running maximum and the divider are *derived* (one result per cycle,
parallel only where the tick needs it). Cycles: :func:`loss_unit_cycles`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from amaranth import Array, Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..compiler.loss_unit import CHAINED_DIV_BITS, divider_cycles, loss_cycles, max_tree_levels
from ..compiler.plan import LossUnit as LossPlan
from .arith import const_mul, delayed, rhu, rhu_offset, rhu_offset_shift, sat, tree_sum
from .dsp import registered_product
from .streams import LossControlSignature, ValidSignature, error_layout, word_layout

__all__ = ["LossUnit", "loss_unit_cycles"]

SAT_MAX = (1 << 32) - 1


def loss_unit_cycles(
    kind: str,
    classes: int,
    recip_frac: int,
    exp_lanes: int = 1,
    div_bits: int = 1,
    z_lanes: int = 1,
    operand_registers: int = 0,
    out_lanes: int = 1,
) -> int:
    """Cycles from the start pulse until ``done`` is high again: the plan's formula
    (:func:`pipetrain.compiler.loss_unit.loss_cycles`): cross-entropy
    ``⌈C/P⌉ + ⌈(fr+1)/k⌉ + ⌈C/Q⌉ + 5 + ⌈log2 z_lanes⌉`` (+ R + 4 with R =
    ``operand_registers`` ≥ 1; Q = ``out_lanes``), MSE ``C + 3``."""
    return loss_cycles(
        kind, classes, 0, recip_frac, exp_lanes, div_bits, z_lanes, operand_registers, out_lanes
    )


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
    delta: ``Out(ValidSignature(error_layout(loss.d.bits, Q)))`` the errors ``δ_j``,
        ``j = 0..C−1``, in order, ``Q`` = ``loss.out_lanes`` a beat (element ``t`` of beat
        ``b`` is ``δ_{b·Q+t}``; rows past C in the last beat are 0; cannot stall).
    pred: ``Out(16)`` argmax of the logits (valid from ``done`` to the next start).
    loss: ``Out(32)`` ``p_y`` (CE, frac ``recip_frac``) or ``Σ(z−t)²`` (MSE, saturated).
    saturations: ``Out(32)`` δ clamps (saturating counter).
    """

    def __init__(self, loss: LossPlan, shift_add: Callable[[int], bool]) -> None:
        if loss.kind not in ("cross_entropy", "mse"):
            raise NotImplementedError(f"loss {loss.kind!r} has no hardware loss unit")
        self.lp, self.zl = loss, loss.z_lanes
        self.Q = Q = loss.errors_per_write
        if Q > 1 and (loss.kind != "cross_entropy" or loss.exp_lanes % Q):
            raise ValueError(
                f"out_lanes {Q} needs a cross-entropy loss whose exp_lanes it divides "
                f"({loss.kind}, exp_lanes {loss.exp_lanes})"
            )
        self.shift_add = shift_add
        self.words = loss.z_words
        super().__init__(
            {
                "z_in": In(ValidSignature(word_layout(self.words, loss.z_word_bits))),
                "ctl": In(LossControlSignature()),
                "delta": Out(ValidSignature(error_layout(loss.d.bits, Q))),
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
        c.q0 = Signal(range(max(C, 2)))  # the zbuf word (exp, MSE) or the ebuf word (out)
        c.s0 = Signal(range(max(Lz, 2)))
        c.issue = Signal()
        m.d.comb += zr.addr.eq(c.q0)
        c.v1 = Signal()
        c.j1 = Signal.like(c.j0)
        s1 = Signal.like(c.s0)
        m.d.sync += [c.v1.eq(c.issue), c.j1.eq(c.j0), s1.eq(c.s0)]
        c.zr, c.s1 = zr, s1
        c.z1 = (zr.data.word_select(s1, fz.bits) if Lz > 1 else zr.data).as_signed()
        c.zmax = Signal(signed(fz.bits))
        c.arg = Signal(16)
        if self.Q > 1:  # out phase: the first row of the beat being issued
            c.rb0 = Signal(range(C + self.Q))

        # outputs: δ stream, pred, loss value, saturation counter
        cnt = Signal(32)
        c.dl_en = Signal()
        c.dl_d = Signal(error_layout(fd.bits, self.Q))
        c.dl_s = Signal(self.Q)  # per error of the beat: clamped
        m.d.comb += [self.delta.valid.eq(c.dl_en), self.delta.payload.eq(c.dl_d)]
        c.loss_v = Signal(32)
        m.d.comb += [self.pred.eq(c.arg), self.loss.eq(c.loss_v)]
        nxt = cnt + (c.dl_en & c.dl_s & self.ctl.train)
        if self.Q > 1:  # every clamped error of the beat counts
            nxt = cnt + sum(c.dl_en & c.dl_s[t] & self.ctl.train for t in range(self.Q))
        m.d.sync += cnt.eq(Mux(nxt > SAT_MAX, SAT_MAX, nxt))
        m.d.comb += self.saturations.eq(cnt)
        m.d.sync += c.dl_en.eq(0)
        if lp.kind == "mse":
            self._mse(m, c)
        else:
            self._cross_entropy(m, c, platform)
        return m

    def _advance(self, m: Module, c: _Shared, per_word: int | None = None) -> None:
        """Issue the next item: j + 1, the next of ``per_word`` items of the word (default the
        logit buffer's lanes), or the next word."""
        per_word = self.zl if per_word is None else per_word
        m.d.sync += c.j0.eq(c.j0 + 1)
        if per_word > 1:
            with m.If(c.s0 == per_word - 1):
                m.d.sync += [c.s0.eq(0), c.q0.eq(c.q0 + 1)]
            with m.Else():
                m.d.sync += c.s0.eq(c.s0 + 1)
        else:
            m.d.sync += c.q0.eq(c.q0 + 1)

    @staticmethod
    def _restart(m: Module, c: _Shared) -> None:
        m.d.sync += [c.j0.eq(0), c.q0.eq(0), c.s0.eq(0)]
        if hasattr(c, "rb0"):
            m.d.sync += c.rb0.eq(0)

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

    def _cross_entropy(self, m: Module, c: _Shared, platform: Any) -> None:
        """Three phases after the start (the maximum is taken as the logits arrive): exp
        (``P`` LUT reads a cycle), divide (``k`` quotient bits a cycle), out (see the module
        docstring)."""
        lp, C, fz, fd = self.lp, self.lp.classes, self.lp.z, self.lp.d
        P = lp.exp_lanes
        label = self.ctl.label
        fl, fe, fr = lp.exp_lut_frac, lp.exp_frac, lp.recip_frac
        K = len(lp.exp_lut)
        self._running_max(m, c)
        lut = Memory(shape=unsigned(fe + 1), depth=K, init=list(lp.exp_lut))
        m.submodules.lut = lut
        lrs = [lut.read_port() for _ in range(P)]
        W = -(-C // P)  # exp issue cycles = ebuf words
        em = Memory(shape=P * (fe + 1), depth=W, init=[])
        m.submodules.ebuf = em
        er, ew = em.read_port(), em.write_port()

        # the phase that issued the read now arriving at S1: 0 exp, 1 out
        ph0 = Signal()
        ph1 = Signal()
        m.d.sync += ph1.eq(ph0)
        v_exp, v_out = c.v1 & ~ph1, c.v1 & ph1

        # exp phase: P logits of ebuf word j1 (a slice of a zbuf word) at S1, t and the LUT
        # index at S1, the LUT entries at S2 (lanes past C are padding: e = 0), summed into E
        # and written to ebuf at S2 — at S5 with operand registers (X = 3; timing, *derived*):
        # the slice, the index before the ROM and the entries after it registered (the mlp-digits
        # critical path at 80.6 MHz was the DP16KD's output, 5.8 ns, → the padding mux → the
        # 5-lane sum → E, 12.4 ns; and at 72.5 MHz with the ROM in logic:
        # zbuf → zmax − z → rhu → the clamp → a 10-port ROM's 5 LUT levels, 13.8 ns;
        # docs/boards.md §4.2)
        zs = c.zr.data.word_select(c.s1, P * fz.bits) if self.zl > P else c.zr.data
        live_from = C - (W - 1) * P  # lanes ≥ this are padding in the last ebuf word
        v2 = Signal()
        j2 = Signal.like(c.j0)
        m.d.sync += [v2.eq(v_exp), j2.eq(c.j1)]
        # With operand registers the selected slice of the logit word is registered, then the
        # index before the ROM and its entries after it, in block RAM or in logic (three
        # cycles; the mlp-digits 32,10 critical path at 86.2 MHz, with only the entries
        # registered: s1 → zmax_h − z → the clamp → the exp ROM's DP16KD address, 11.6 ns with
        # 7.8 ns of routing to the ROM's blocks; at 88.0 MHz, with the index registered too:
        # s1's word select → zmax_h − z → rhu → the clamp → e_idx, 11.4 ns with 7.8 ns of
        # routing; docs/boards.md §4.2)
        X = 3 if lp.operand_registers else 0
        if X:
            z_sel = Signal(len(zs), name="z_sel")
            m.d.sync += z_sel.eq(zs)
            zs = z_sel
        chain = [v2]  # v2 through the X registers: the entries' valid, one per cycle
        ves, jes, entries = v2, j2, []
        for k in range(X):
            v_k, j_k = Signal(name=f"v_e{3 + k}"), Signal.like(j2, name=f"j_e{3 + k}")
            m.d.sync += [v_k.eq(ves), j_k.eq(jes)]
            ves, jes = v_k, j_k
            chain.append(ves)
        for lane, lr in enumerate(lrs):
            z1 = zs.word_select(lane, fz.bits).as_signed() if P > 1 else zs.as_signed()
            idx = rhu_offset_shift(c.zmax_h - z1, fz.frac - fl)  # = rhu(zmax − z1, ·)
            addr = Mux(idx > K - 1, K - 1, idx)
            if X:
                addr1 = Signal(range(K), name=f"e_idx{lane}")
                m.d.sync += addr1.eq(addr)
                addr = addr1
            m.d.comb += lr.addr.eq(addr)
            if X:
                e3 = Signal.like(lr.data, name=f"e_lut{lane}")
                m.d.sync += e3.eq(lr.data)
                entries.append(e3)
            else:
                entries.append(lr.data)
        es = [Mux(jes == W - 1, 0, d) if lane >= live_from else d for lane, d in enumerate(entries)]
        E = Signal(fe + 1 + max(1, C.bit_length()))
        m.d.comb += [ew.en.eq(ves), ew.addr.eq(jes), ew.data.eq(Cat(*es))]
        with m.If(ves):
            m.d.sync += E.eq(Mux(jes == 0, 0, E) + tree_sum(es))
        # the last entries summed into E this cycle
        exp_last = ves & ~chain[-2] if X else v2

        # divider: r = ⌊2^(fe+fr) / E⌋ by long division, k bits a cycle (_Divider)
        div = _Divider(m, E, fe, fr, lp.div_bits)

        # out phase: e_j from the e memory at S1, p_j = rhu(e_j·r) registered at S2, δ_j at S2
        # (registered at S3: the product and its rounding apart from δ's rounding and clamp;
        # *derived*, timing only)
        Q = self.Q  # errors a cycle: Q lanes of the out path, one beat of Q errors
        e_q = er.data.word_select(c.s1, Q * (fe + 1)) if P > Q else er.data
        # with operand registers (R = LossUnit.operand_registers) e_j and r pass R registers and
        # their product one more before p's rounding register (on the ECP5 the MULT18X18D's
        # own: the mlp-digits critical path at 74.6 MHz was the word select → this multiply
        # unregistered → p's rounding adder, 13.4 ns; docs/boards.md §4.2), R + 1 cycles
        R = lp.operand_registers or 0
        vouts = [v_out]  # v_out through the product's registers: one per cycle of the out path
        for k in range(R + 1 if R else 0):
            vouts.append(Signal(name=f"vo_op{k}"))
            m.d.sync += vouts[-1].eq(vouts[-2])
        vo2 = Signal()
        m.d.sync += vo2.eq(vouts[-1])
        if Q > 1:  # the beat's first row, beside j1 (the beat) for the label compare
            rb1 = Signal.like(c.rb0, name="rb1")
            m.d.sync += rb1.eq(c.rb0)
        outs = []
        for t in range(Q):
            sfx = f"_{t}" if Q > 1 else ""
            e1 = e_q.word_select(t, fe + 1) if Q > 1 else e_q
            p2 = Signal(fr + 2, name=f"p2{sfx}")  # p ≤ 2^fr (+ one rounding bit of headroom)
            if R:
                prod = Signal(unsigned(e1.shape().width + div.r.shape().width), name=f"p_prod{sfx}")
                names = (f"e_op{sfx}", f"r_op{sfx}")
                registered_product(m, platform, e1, div.r, registers=R, out=prod, names=names)
                m.d.sync += p2.eq(rhu(prod, fe))
            else:
                m.d.sync += p2.eq(rhu(e1 * div.r, fe))
            hit = c.j1 == label if Q == 1 else rb1 + t == label
            lab1 = delayed(m, hit, f"lab_op{sfx}", R + 1 if R else 0)
            lab2 = Signal(name=f"lab2{sfx}")
            m.d.sync += lab2.eq(lab1)
            dv, dc = sat(rhu(p2, fr - fd.frac) - Mux(lab2, 1 << fd.frac, 0), fd)
            outs.append((p2, lab2, dv, dc))
        m.d.comb += er.addr.eq(c.q0)
        with m.If(vo2):
            m.d.sync += c.dl_en.eq(1)
            for t, (p2, lab2, dv, dc) in enumerate(outs):
                d_t, s_t = (c.dl_d, c.dl_s) if Q == 1 else (c.dl_d[t], c.dl_s[t])
                m.d.sync += [d_t.eq(dv), s_t.eq(dc)]
                with m.If(lab2):
                    m.d.sync += c.loss_v.eq(p2)
        busy = Cat(vo2, *vouts[1:]).any() if R else vo2  # a δ still in the out path
        self._ce_phases(m, c, ph0, exp_last, div, busy)

    def _running_max(self, m: Module, c: _Shared) -> None:
        """``zmax`` and ``arg`` as the logit words arrive: the word registered on arrival, its
        maximum (a comparison tree over its lanes, lowest index on ties; padding lanes of the
        last word never win) with a register after every level (``T`` =
        :func:`~pipetrain.compiler.loss_unit.max_tree_levels` of the lanes), then compared with
        the running maximum (a later word wins only when greater: lowest index on ties). Word 0
        restarts it. The last word arrives no later than the feeding stage's ``done``, so
        ``zmax`` is final ``T + 2`` cycles after the start pulse, when the exp phase first
        reads it (:meth:`_ce_phases` waits ``T`` cycles before it)."""
        C, fz, Lz = self.lp.classes, self.lp.z, self.zl
        zi = self.z_in
        # the word registered on arrival (the feeding stage forms z at S4 from its sum: no
        # path from its rounding into the comparisons)
        wval, w = Signal(), Signal.like(zi.payload.word)
        data = Signal.like(zi.payload.data)
        m.d.sync += [wval.eq(zi.valid), w.eq(zi.payload.word), data.eq(zi.payload.data)]
        live_from = C - (self.words - 1) * Lz
        cands = []
        for lane in range(Lz):
            zv = data.word_select(lane, fz.bits).as_signed()
            live = (w != self.words - 1) if lane >= live_from else Const(1)
            cands.append((zv, Const(lane, range(max(Lz, 2))), live))
        # the tree, a register after each level (the word's index and valid beside it)
        while len(cands) > 1:
            nxt = []
            for level in _tree_level(cands):
                v, ln, lv = Signal(signed(fz.bits)), Signal(range(Lz)), Signal()  # Lz ≥ 2 here
                m.d.sync += [v.eq(level[0]), ln.eq(level[1]), lv.eq(level[2])]
                nxt.append((v, ln, lv))
            wv_, w_ = Signal(), Signal.like(w)
            m.d.sync += [wv_.eq(wval), w_.eq(w)]
            cands, wval, w = nxt, wv_, w_
        wv, bl, _ = cands[0]
        base = Array(Const(q * Lz, 16) for q in range(self.words))[w] if Lz > 1 else w
        wj, wfirst = base + bl, w == 0
        # zmax_h = zmax + 2^(k−1), k = fz.frac − fl: the exp index rhu(zmax − z, k) is then
        # (zmax_h − z) >> k, one carry chain before the ROM address, not two (the same
        # integers; the mlp-digits 32,10 and -deep 16,8,8,4 ULX3S critical path at 53d3f90:
        # s1 → zmax − z → rhu → the clamp → the exp ROM's block-RAM address, 11.6 / 10.7 ns,
        # docs/boards.md §4.2; *derived*, timing)
        k = fz.frac - self.lp.exp_lut_frac
        h = rhu_offset(k)
        c.zmax_h = Signal(signed(max(fz.bits, k) + 2), name="zmax_h")
        with m.If(wval & (wfirst | (wv > c.zmax))):
            m.d.sync += [c.zmax.eq(wv), c.zmax_h.eq(wv + h), c.arg.eq(wj)]

    def _ce_phases(
        self, m: Module, c: _Shared, ph0: Signal, exp_last: Value, div: _Divider, vo2: Signal
    ) -> None:
        """The cross-entropy state machine: IDLE → (MAX: ``T`` cycles while the comparison
        tree drains, with a tree of registers) → EXP → EXP_TAIL → DIV → OUT → OUT_TAIL →
        IDLE; the first out read issues in the last divider cycle (its S1 sees the final r);
        OUT issues ⌈C/Q⌉ beats of Q rows."""
        C, P, Q = self.lp.classes, self.lp.exp_lanes, self.Q
        W = -(-C // P)
        T = max_tree_levels(self.zl)
        wait = Signal(range(max(T, 2)))

        def issue_out(first: bool) -> None:  # beat j0: rows j0·Q …, slice s0 of ebuf word q0
            m.d.comb += [c.issue.eq(1), ph0.eq(1)]
            self._advance(m, c, P // Q)
            if Q > 1:
                m.d.sync += c.rb0.eq(c.rb0 + Q)
            with m.If(c.j0 == -(-C // Q) - 1):
                m.next = "OUT_TAIL"
            if first:
                with m.Else():
                    m.next = "OUT"

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.ctl.done.eq(~self.ctl.start)
                with m.If(self.ctl.start):
                    self._restart(m, c)
                    m.d.sync += [c.loss_v.eq(0), wait.eq(0)]
                    m.next = "MAX" if T else "EXP"
            if T:  # the comparison tree's registers: zmax is final after T more cycles
                with m.State("MAX"):
                    m.d.sync += wait.eq(wait + 1)
                    with m.If(wait == T - 1):
                        m.next = "EXP"
            with m.State("EXP"):
                m.d.comb += [c.issue.eq(1), ph0.eq(0)]
                self._advance(m, c, self.zl // P)
                with m.If(c.j0 == W - 1):
                    m.next = "EXP_TAIL"
            with m.State("EXP_TAIL"):
                with m.If(~c.v1 & exp_last):  # E is final from the next cycle
                    self._restart(m, c)
                    m.d.sync += div.init()
                    m.next = "DIV"
            with m.State("DIV"):
                m.d.sync += div.step()
                with m.If(div.last):
                    issue_out(first=True)
            with m.State("OUT"):
                issue_out(first=False)
            with m.State("OUT_TAIL"):
                with m.If(~c.v1 & ~vo2):
                    m.next = "IDLE"


class _Divider:
    """``r = ⌊2^(fe+fr) / E⌋`` by long division (restoring), ``k`` quotient bits a cycle.

    The quotient has at most ``fr + 1`` bits (``E ≥ 2^fe``). The remainder starts at
    ``⌊2^(fe+fr) / 2^Qb⌋ = 2^(fe+fr−Qb)`` (< E) over ``Qb`` ≥ fr + 1 quotient bits, the top
    ``Qb − fr − 1`` of them 0, and each quotient digit shifts it up (the dividend's lower bits
    are 0) and subtracts the digit's multiple of E, so it stays below E: the datapath is E's
    width + 1 bits (+ k in a step).

    * ``k`` ≤ :data:`~pipetrain.compiler.loss_unit.CHAINED_DIV_BITS`: ``k`` chained
      compare-subtract steps a cycle, ``D = ⌈(fr+1)/k⌉`` cycles, ``Qb = k·D``.
    * ``k`` > that (radix 2^k): the first cycle is two chained steps while the odd multiples
      ``j·E`` (j < 2^k; shifts and adders) are registered, then one digit a cycle: ``x =
      rem·2^k`` against all ``2^k − 1`` multiples at once (parallel subtractors, no carry chain
      after another), the digit the number of them ≤ x, ``rem = x − digit·E`` — ``D = 1 +
      ⌈(fr−1)/k⌉`` cycles, ``Qb = 2 + k·(D−1)``.

    Every form gives the same quotient. Source: the restoring division algorithm; the k-step
    unrolling and the radix-2^k digit by parallel compares are *derived* (timing: the same
    quotient bits, k per register stage; :func:`~pipetrain.compiler.loss_unit.divider_cycles`).
    """

    def __init__(self, m: Module, E: Signal, fe: int, fr: int, k: int) -> None:
        self.E, self.k = E, k
        self.D = divider_cycles(fr, k)
        self.radix = k > CHAINED_DIV_BITS
        qb = 2 + k * (self.D - 1) if self.radix else k * self.D
        self.rem0 = 1 << (fe + fr - qb)
        self.rem = Signal(len(E) + 1)
        self.r = Signal(fr + 1)
        self.count = Signal(range(max(self.D, 2)))
        self.last = self.count == self.D - 1
        self.multiples: list[Value] = []
        if self.radix:  # j·E for j = 1 … 2^k − 1: the odd ones registered, the even ones shifts
            odd = {1: E}
            for j in range(3, 1 << k, 2):
                mj = Signal(len(E) + k, name=f"div_e{j}")
                m.d.sync += mj.eq(const_mul(j, E, lambda _: True))
                odd[j] = mj
            for j in range(1, 1 << k):
                t = (j & -j).bit_length() - 1  # j = odd · 2^t
                self.multiples.append(Value.cast(odd[j >> t]) << t)
            self.remk, self.bitsk = self._digit(m)

    def init(self) -> list:
        """Statements that load the remainder and clear the quotient and the step counter."""
        return [self.rem.eq(self.rem0), self.r.eq(0), self.count.eq(0)]

    def _chained(self, steps: int) -> tuple[Value, list[Value]]:
        rem, bits = Value.cast(self.rem), []
        for _ in range(steps):
            x = Cat(Const(0, 1), rem)  # 2·rem
            ge = x >= self.E
            rem = Mux(ge, x - self.E, x)[: len(self.rem)]
            bits.append(ge)
        return rem, bits

    def _digit(self, m: Module) -> tuple[Value, list[Value]]:
        """One radix-2^k digit: the ``2^k − 1`` compares of ``rem·2^k`` with the multiples,
        the digit and the remainder it leaves.

        The compares are a thermometer code (``j·E ≤ x`` for every j up to the digit), so
        the remainder is a binary search over it: a tree of 2:1 multiplexers whose selects
        are compares themselves (``digit ≥ 8``, then ``≥ 12`` or ``≥ 4``, … at k = 4), with
        no encoder between the carry chains and the select — and the digit's bits the same
        search over the compares. *Derived* (timing: the mlp-digits 8×5,10 critical path at
        79.1 MHz was ``div_e7`` → the compare ``x − 7E``'s carry chain → the digit's
        thermometer-to-binary encoder → a 16-way select by the digit → ``rem``, 12.65 ns;
        docs/boards.md §4.2); the same digit and remainder as an encoder and a select."""
        k = self.k
        x = Cat(Const(0, k), self.rem)  # rem·2^k
        w = len(x) + 1
        # x − j·E once per multiple, one bit wider: its sign bit is the compare (j·E ≤ x)
        diffs = [Signal(w, name=f"div_d{j}") for j in range(1, 1 << k)]
        for d, mj in zip(diffs, self.multiples, strict=True):
            m.d.comb += d.eq(x - mj)
        ge = [~d[-1] for d in diffs]  # ge[j − 1]: j·E ≤ x, true up to the digit
        rems = [x[: len(self.rem)], *(d[: len(self.rem)] for d in diffs)]

        def search(lo: int, hi: int, span: int, leaf: Callable[[int], Value]) -> Value:
            """The search over digits [lo, hi) down to spans of ``span``: ``leaf(start)``."""
            if hi - lo == span:
                return leaf(lo)
            mid = (lo + hi) // 2
            return Mux(ge[mid - 1], search(mid, hi, span, leaf), search(lo, mid, span, leaf))

        n = 1 << k
        rem = search(0, n, 1, lambda j: rems[j])
        # bit b (MSB first): the search down to a span of 2^(b+1) digits, then its middle compare
        bits = [
            search(0, n, 2 << b, lambda lo, b=b: ge[lo + (1 << b) - 1]) for b in reversed(range(k))
        ]
        return rem, bits

    def step(self) -> list:
        """Statements of one cycle: quotient bits MSB first (``k`` chained steps; radix 2^k:
        two chained steps in the first cycle, then one digit)."""
        if not self.radix:
            rem, bits = self._chained(self.k)
            q = Cat(*reversed(bits), self.r)  # the new bits below the old quotient
            return [self.rem.eq(rem), self.r.eq(q[: len(self.r)]), self.count.eq(self.count + 1)]
        rem2, bits2 = self._chained(CHAINED_DIV_BITS)
        remk, bitsk = self.remk, self.bitsk
        q2 = Cat(*reversed(bits2), self.r)
        qk = Cat(*reversed(bitsk), self.r)
        first = self.count == 0
        return [
            self.rem.eq(Mux(first, rem2, remk)),
            self.r.eq(Mux(first, q2[: len(self.r)], qk[: len(self.r)])),
            self.count.eq(self.count + 1),
        ]


def _tree_level(cands: list) -> list:
    """One level of the comparison tree over ``(value, lane, live)`` candidates: pairs reduced
    to their greater live member (on ties, and with a dead right operand, the lower lane wins,
    so the tree gives the first maximum); an odd last candidate passes through."""
    nxt = []
    for i in range(0, len(cands), 2):
        if i + 1 == len(cands):
            nxt.append(cands[i])
            continue
        (av, al, alive), (bv, bl, blive) = cands[i], cands[i + 1]
        take_b = blive & (~alive | (bv > av))
        nxt.append((Mux(take_b, bv, av), Mux(take_b, bl, al), alive | blive))
    return nxt
