"""One PB pipeline stage: Linear + activation with its memories and the fused pass
(docs/architecture.md §3).

Per tick the stage makes ONE pass over its weight memory (``row_groups × (N+1)`` slots, numerics
§2 order: ``for g: for i in 0..N``). In slot ``(g, i)`` lane ``l`` handles row
``j = g·L + l`` and column ``i`` (column ``N`` is the bias, input ``2^x.frac``) and does, from
one read of ``(w, u)``:

* the forward MAC of the forward item (``ŵ = w − H·u`` with LWP, numerics §3), lane-local;
* the input-gradient MAC of the backward item with the current ``w`` (an adder tree across
  lanes, accumulated over row groups in a small memory, finalised in the last group);
* the momentum / Spike-Compensation update with the plan's rounding and the lane's LFSR
  (one draw per lane per slot, only in updating passes), writing ``(w, u)`` back.

Pipeline (one slot per cycle): S0 issues the reads; S1 selects operands (``x``, ``δ`` with
the activation derivative, ``ŵ``); S2 multiplies; S3 accumulates, forms ``U`` and ``u'``
(and ``w'`` without SC) and draws random bits; S4 finalises the forward outputs and writes
back (S5 with SC: ``V`` and ``w'``). A pass therefore takes ``row_groups·(N+1) + depth``
cycles, ``depth = 5`` (6 with SC) including the cycle the start pulse arrives
(:func:`pipetrain.compiler.build.pass_cycles`).

Memories (all ``amaranth.lib.memory`` with synchronous reads):

* ``w[l]``, ``u[l]``: one bank per lane, ``row_groups·(N+1)`` words, address ``g·(N+1)+i``.
* ``x``: the input stash, ``stash_depth + 1`` entries (the extra one is being written by the
  previous stage or the host while the pass runs; *derived*: it replaces a separate double
  buffer) of ``⌈N/Lw⌉`` words, each ``Lw`` values wide (``Lw`` = the writer's lanes, 1 for
  stage 1). Two read ports (forward and backward item).
* ``mask``: ``z > 0`` bits of the stashed samples, entry × row group, ``L`` bits per word.
* ``g``: the error at the stage output, double-buffered (two halves of ``row_groups`` words of
  ``L`` values), written serially by the next stage's input gradient or the loss unit.
* ``gacc``: ``N`` input-gradient partial sums (only with ``row_groups > 1``).

Source: docs/architecture.md §3 (fused pass, lane ownership, adder tree), docs/numerics.md §2–§6
(the
arithmetic). The stash sizing and the pipeline are *derived* (see above).
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..compiler.build import (
    PASS_LATENCY,
    forward_weight_bits,
    pass_cycles,
    shift_add,
    write_stage,
    x_operand_bits,
)
from ..compiler.plan import Plan, Stage
from .arith import align, const_mul, rhu, round_upd, sat
from .lfsr import LFSR
from .spram import SinglePortRAM

__all__ = ["StageUnit", "pass_cycles", "PASS_DEPTH", "stash_entries"]

#: Pipeline cycles a pass needs after its last slot is issued (without / with SC), counting
#: the start-pulse cycle: start → S0 … write stage → done. The plan's estimates use the same
#: numbers (``compiler.build.PASS_LATENCY``, :func:`~pipetrain.compiler.build.pass_cycles`);
#: the tests check the measured tick against the plan.
PASS_DEPTH = {False: PASS_LATENCY, True: PASS_LATENCY + 1}

SAT_MAX = (1 << 32) - 1


def stash_entries(stage: Stage) -> int:
    """Physical stash entries: ``stage.stash_depth`` in use plus one being written."""
    return stage.stash_depth + 1


def _popcount_sum(flags: list) -> Value:
    total = Const(0, 1)
    for f in flags:
        total = total + f
    return total


class StageUnit(wiring.Component):
    """The datapath and memories of one stage (see the module docstring).

    Parameters
    ----------
    plan: the design plan (rounding, LFSR polynomial).
    stage: this stage's plan entry.
    x_lanes: ``Lw``, values per word of the input stash = the writer's lanes (1 for stage 1).

    Members
    -------
    start: ``In(1)`` pulse: begin a pass with ``fwd_en``/``bwd_en`` (held stable, with the
        bases, until ``done``).
    fwd_en: ``In(1)`` the pass does the forward of the item stashed at ``fx_base``.
    fwd_train: ``In(1)`` the forward item trains (LWP's ``ŵ`` is used only then; inference
        forwards use ``w``, as the golden model does).
    bwd_en: ``In(1)`` the pass does the input gradient and update of the item at ``bx_base``
        (LFSRs draw only then).
    fx_base, bx_base: ``In`` word address of the forward / backward item's stash entry
        (entry × ⌈N/Lw⌉).
    fm_base, bm_base: ``In`` mask address of the forward / backward item (entry × row_groups).
    gr_half: ``In(1)`` half of the error buffer this pass reads.
    done: ``Out(1)`` no pass running (low from the start pulse until the last write).
    xw_en, xw_addr, xw_data: ``In`` stash write (absolute word address, ``Lw`` values).
    gw_en, gw_data, gw_half: ``In`` serial error write: the ``k``-th write since the buffer
        was last filled is error ``j = k`` (``M`` writes fill it), into half ``gw_half``.
    y_en, y_word, y_data: ``Out`` forward output: ``L`` activations of row group ``y_word``.
    gin_en, gin_data: ``Out`` serial input gradient ``i = 0..N−1`` (stages with
        ``input_gradient`` only).
    saturations: ``Out(32)`` saturation counter (z, gin, u', w' clamps; saturating).
    acc_en, acc_we, acc_kind, acc_lane, acc_addr, acc_wdata: ``In`` weight access (only while
        no pass runs): kind 0 = w, 1 = u; the write data is saturated to the memory format.
    acc_rdata: ``Out(signed(32))`` the value read (or written), valid the cycle after
        ``acc_en``.
    """

    def __init__(self, plan: Plan, stage: Stage, x_lanes: int) -> None:
        up = stage.update
        if up.lwp_horizon and up.lwp_form != "v":
            raise NotImplementedError(
                f"stage {stage.index}: LWP weight-difference form (lwp_form='w') is not "
                "implemented in the HDL yet; use lwp_form='v'"
            )
        self.plan, self.stage, self.lw = plan, stage, x_lanes
        N, M, L = stage.in_features, stage.out_features, stage.lanes
        self.N, self.M, self.L, self.G = N, M, L, stage.row_groups
        self.T = stage.cycles_per_tick
        self.P = stash_entries(stage)
        self.kx = -(-N // x_lanes)
        if self.G > 1 and stage.input_gradient and N < 4:
            raise NotImplementedError(
                f"stage {stage.index}: N={N} < 4 inputs with {self.G} row groups would race "
                "the input-gradient accumulator memory; use lanes = out_features"
            )
        f = stage.formats
        self.x_depth = self.P * self.kx
        self.m_depth = self.P * self.G
        sig = {
            "start": In(1),
            "fwd_en": In(1),
            "fwd_train": In(1),
            "bwd_en": In(1),
            "fx_base": In(range(self.x_depth)),
            "bx_base": In(range(self.x_depth)),
            "fm_base": In(range(self.m_depth)),
            "bm_base": In(range(self.m_depth)),
            "gr_half": In(1),
            "done": Out(1, init=1),
            "xw_en": In(1),
            "xw_addr": In(range(self.x_depth)),
            "xw_data": In(x_lanes * f.x.bits),
            "gw_en": In(1),
            "gw_data": In(signed(f.d.bits)),
            "gw_half": In(1),
            "y_en": Out(1),
            "y_word": Out(range(max(self.G, 2))),
            "y_data": Out(L * f.y.bits),
            "saturations": Out(32),
            "acc_en": In(1),
            "acc_we": In(1),
            "acc_kind": In(2),
            "acc_lane": In(range(max(L, 2))),
            "acc_addr": In(range(self.T)),
            "acc_wdata": In(signed(32)),
            "acc_rdata": Out(signed(32)),
        }
        if stage.input_gradient:
            sig["gin_en"] = Out(1)
            sig["gin_data"] = Out(signed(f.gin.bits))
        super().__init__(sig)

    def elaborate(self, platform) -> Module:  # noqa: C901 - one datapath, kept in one place
        m = Module()
        plan, st = self.plan, self.stage
        f, up = st.formats, st.update
        N, M, L, G, T, Lw = self.N, self.M, self.L, self.G, self.T, self.lw
        sc = up.sc
        SC2 = st.slot_cycles  # 2: single-port w/u memories, a slot every other cycle
        natural_ws = PASS_DEPTH[sc] - 1  # stage where w', u' are ready (4, or 5 with SC)
        # pipeline stage index of the write-back: natural_ws, one later when single-port
        # memories need the write an odd number of cycles after the read
        ws = write_stage(sc, SC2)

        # ---------------- memories ----------------
        wr, ww, ur, uw = [], [], [], []
        for lane in range(L):
            if SC2 == 2:
                wm = SinglePortRAM(signed(f.w.bits), T)
                um = SinglePortRAM(signed(f.u.bits), T)
            else:
                wm = Memory(shape=signed(f.w.bits), depth=T, init=[])
                um = Memory(shape=signed(f.u.bits), depth=T, init=[])
            m.submodules[f"w{lane}"] = wm
            m.submodules[f"u{lane}"] = um
            if SC2 == 2:
                wr.append(wm.read)
                ww.append(wm.write)
                ur.append(um.read)
                uw.append(um.write)
            else:
                wr.append(wm.read_port())
                ww.append(wm.write_port())
                ur.append(um.read_port())
                uw.append(um.write_port())
        xm = Memory(shape=Lw * f.x.bits, depth=self.x_depth, init=[])
        m.submodules.xstash = xm
        xrf, xrb, xwp = xm.read_port(), xm.read_port(), xm.write_port()
        mm = Memory(shape=L, depth=self.m_depth, init=[])
        m.submodules.mask = mm
        mrd, mwr = mm.read_port(), mm.write_port()
        gm = Memory(shape=L * f.d.bits, depth=2 * G, init=[])
        m.submodules.gbuf = gm
        grd, gwr = gm.read_port(), gm.write_port(granularity=f.d.bits)
        use_gacc = st.input_gradient and G > 1
        if use_gacc:
            am = Memory(shape=signed(st.acc_bwd_bits), depth=N, init=[])
            m.submodules.gacc = am
            ard, awr = am.read_port(), am.write_port()
        lfsrs = []
        for lane in range(L):
            lf = LFSR(plan.lfsr_poly, plan.lfsr_width, plan.lfsr_leap, st.lfsr_seeds[lane])
            m.submodules[f"lfsr{lane}"] = lf
            lfsrs.append(lf)

        # ---------------- stash and error-buffer writes ----------------
        m.d.comb += [
            xwp.en.eq(self.xw_en),
            xwp.addr.eq(self.xw_addr),
            xwp.data.eq(self.xw_data),
        ]
        gq = Signal(range(max(G, 2)))
        gl = Signal(range(max(L, 2)))
        last_lane = (M - 1) % L
        m.d.comb += [
            gwr.addr.eq(Mux(self.gw_half, G, 0) + gq),
            gwr.data.eq(Cat(*([self.gw_data] * L))),
        ]
        for lane in range(L):
            m.d.comb += gwr.en[lane].eq(self.gw_en & (gl == lane))
        with m.If(self.gw_en):
            with m.If((gq == G - 1) & (gl == last_lane)):
                m.d.sync += [gq.eq(0), gl.eq(0)]
            with m.Elif(gl == L - 1):
                m.d.sync += [gq.eq(gq + 1), gl.eq(0)]
            with m.Else():
                m.d.sync += gl.eq(gl + 1)

        # ---------------- S0: slot counters and read issue ----------------
        busy = Signal()
        k = Signal(range(T))
        i0 = Signal(range(N + 1))
        g0 = Signal(range(max(G, 2)))
        q0 = Signal(range(max(self.kx, 2)))
        sel0 = Signal(range(max(Lw, 2)))
        fe = Signal()
        ft = Signal()
        be = Signal()
        adv = Signal()  # a slot issues (reads its memories) this cycle
        if SC2 == 2:
            phase = Signal()  # 1: the write-back cycle between two reads
            with m.If(self.start):
                m.d.sync += phase.eq(0)
            with m.Elif(busy):
                m.d.sync += phase.eq(~phase)
            m.d.comb += adv.eq(busy & ~phase)
        else:
            m.d.comb += adv.eq(busy)
        with m.If(self.start):
            m.d.sync += [
                busy.eq(1),
                k.eq(0),
                i0.eq(0),
                g0.eq(0),
                q0.eq(0),
                sel0.eq(0),
                fe.eq(self.fwd_en),
                ft.eq(self.fwd_train),
                be.eq(self.bwd_en),
            ]
        with m.Elif(adv):
            m.d.sync += k.eq(k + 1)
            with m.If(k == T - 1):
                m.d.sync += busy.eq(0)
            with m.If(i0 == N):
                m.d.sync += [i0.eq(0), q0.eq(0), sel0.eq(0), g0.eq(g0 + 1)]
            with m.Else():
                m.d.sync += i0.eq(i0 + 1)
                if Lw > 1:
                    with m.If(sel0 == Lw - 1):
                        m.d.sync += [sel0.eq(0), q0.eq(q0 + 1)]
                    with m.Else():
                        m.d.sync += sel0.eq(sel0 + 1)
                else:
                    m.d.sync += q0.eq(q0 + 1)
        for lane in range(L):
            m.d.comb += [
                wr[lane].addr.eq(Mux(busy, k, self.acc_addr)),
                ur[lane].addr.eq(Mux(busy, k, self.acc_addr)),
            ]
        m.d.comb += [
            xrf.addr.eq(self.fx_base + q0),
            xrb.addr.eq(self.bx_base + q0),
            grd.addr.eq(Mux(self.gr_half, G, 0) + g0),
            mrd.addr.eq(self.bm_base + g0),
        ]

        def wire(expr, name: str) -> Signal:
            """A comb signal for a value used more than once (one adder in the netlist)."""
            sig = Signal(expr.shape(), name=name)
            m.d.comb += sig.eq(expr)
            return sig

        # pipeline control registers: valid, i, g, sel, k per stage 1..ws
        def stage_regs(n: int, name: str, shape, src):
            regs = [src]
            for s in range(1, n + 1):
                r = Signal(shape, name=f"{name}{s}")
                m.d.sync += r.eq(regs[-1])
                regs.append(r)
            return regs

        v = stage_regs(ws, "v", 1, adv)
        iv = stage_regs(ws, "i", range(N + 1), i0)
        gv = stage_regs(ws, "g", range(max(G, 2)), g0)
        # write-back address: slots reach the write stage in issue order, one per valid cycle,
        # so a counter replaces a k pipeline (derived: fewer flip-flops than ws copies of k)
        wk = Signal(range(T + 1))
        with m.If(self.start):
            m.d.sync += wk.eq(0)
        with m.Elif(v[ws]):
            m.d.sync += wk.eq(wk + 1)
        sel1 = Signal.like(sel0)
        m.d.sync += sel1.eq(sel0)

        # ---------------- S1: operand selection ----------------
        bias = 1 << f.x.frac

        def pick(word):
            if Lw == 1:
                return word.as_signed()
            return word.word_select(sel1, f.x.bits).as_signed()

        bias1 = iv[1] == N
        xf1 = Mux(bias1, bias, pick(xrf.data))
        xb1 = Mux(bias1, bias, pick(xrb.data))
        last_g1 = gv[1] == G - 1
        pad_first = M - (G - 1) * L  # lanes ≥ this are padding in the last group
        deltas1, what1 = [], []
        for lane in range(L):
            graw = grd.data.word_select(lane, f.d.bits).as_signed()
            mbit = mrd.data[lane]
            if st.activation == "relu":
                dl = Mux(mbit, graw, 0)
            elif st.activation == "leaky_relu":
                sl = st.negative_slope
                dl = Mux(mbit, graw, rhu(const_mul(sl.value, graw), sl.frac))
            else:
                dl = graw
            live = be
            if lane >= pad_first:
                live = live & ~last_g1
            deltas1.append(Mux(live, dl, 0))
            w1 = wr[lane].data
            if up.lwp_horizon:
                what1.append(Mux(ft, w1 - const_mul(up.lwp_horizon, ur[lane].data), w1))
            else:
                what1.append(w1)

        # ---------------- S1 → S2 registers ----------------
        what_bits = forward_weight_bits(f.w, up.lwp_horizon)
        w2 = [Signal(signed(f.w.bits), name=f"w2_{lane}") for lane in range(L)]
        u2 = [Signal(signed(f.u.bits), name=f"u2_{lane}") for lane in range(L)]
        # without LWP the forward weight is w itself: one register, not two
        wh2 = (
            [Signal(signed(what_bits), name=f"wh2_{lane}") for lane in range(L)]
            if up.lwp_horizon
            else w2
        )
        d2 = [Signal(signed(f.d.bits), name=f"d2_{lane}") for lane in range(L)]
        xf2 = Signal(signed(x_operand_bits(f.x)))
        xb2 = Signal(signed(x_operand_bits(f.x)))
        # every pipeline register loads only when its slot is valid: the same hardware, and
        # Amaranth's simulator skips the arithmetic of idle cycles
        with m.If(v[1]):
            m.d.sync += [xf2.eq(xf1), xb2.eq(xb1)]
            for lane in range(L):
                m.d.sync += [
                    w2[lane].eq(wr[lane].data),
                    u2[lane].eq(ur[lane].data),
                    d2[lane].eq(deltas1[lane]),
                ]
                if up.lwp_horizon:
                    m.d.sync += wh2[lane].eq(what1[lane])
        pad = []  # per lane: 1 if padding in this slot, by pipeline stage
        for lane in range(L):
            if lane >= pad_first:
                pad.append(stage_regs(ws, f"pad{lane}_", 1, g0 == G - 1))
            else:
                pad.append([Const(0, 1)] * (ws + 1))
        if use_gacc:
            # the partial sum of column i is read at S2 and arrives at S3, where it is added
            # (no pipeline copies); the write of the same column is a whole row later
            m.d.comb += ard.addr.eq(iv[2])
            ga3 = ard.data

        # ---------------- S2: products ----------------
        pf3 = [Signal(signed(what_bits + f.x.bits + 1), name=f"pf3_{lane}") for lane in range(L)]
        pg3 = [Signal(signed(f.w.bits + f.d.bits), name=f"pg3_{lane}") for lane in range(L)]
        w3 = [Signal(signed(f.w.bits), name=f"w3_{lane}") for lane in range(L)]
        u_terms3, v_terms3 = [], []
        # The S2 → S3 product registers load every cycle: S3 reads them exactly one cycle
        # after a valid S2, and without an enable Yosys can absorb them into the DSP blocks'
        # output registers (iCE40 SB_MAC16, ECP5 MULT18X18D) instead of spending flip-flops.
        for lane in range(L):
            m.d.sync += pf3[lane].eq(wh2[lane] * xf2)
            with m.If(v[2]):
                m.d.sync += w3[lane].eq(w2[lane])
            if st.input_gradient:  # stage 1 has no input-gradient multiplier
                m.d.sync += pg3[lane].eq(w2[lane] * d2[lane])
            # U terms: (product expression, its fraction bits)
            terms = [
                (const_mul(up.momentum.value, u2[lane]), up.momentum.frac + f.w.frac),
                (
                    # exact either way: (d·x) first when lr is a shift-add constant
                    const_mul(up.lr.value, d2[lane] * xb2)
                    if shift_add(up.lr.value)
                    else const_mul(up.lr.value, d2[lane]) * xb2,
                    up.lr.frac + f.d.frac + f.x.frac,
                ),
                (const_mul(up.lr_wd.value, w2[lane]), up.lr_wd.frac + f.w.frac),
            ]
            regs = []
            for n, (expr, frac) in enumerate(terms):
                if n > 0 and ((n == 1 and up.lr.value == 0) or (n == 2 and up.lr_wd.value == 0)):
                    continue
                r = Signal(expr.shape(), name=f"ut{n}_{lane}")
                m.d.sync += r.eq(expr)  # read at S3 only (see above)
                regs.append((r, frac))
            u_terms3.append(regs)
            if sc:
                vt = [
                    (
                        const_mul(up.sc_lr_b.value, d2[lane] * xb2)
                        if shift_add(up.sc_lr_b.value)
                        else const_mul(up.sc_lr_b.value, d2[lane]) * xb2,
                        up.sc_lr_b.frac + f.d.frac + f.x.frac,
                    ),
                    (const_mul(up.sc_lr_wd_b.value, w2[lane]), up.sc_lr_wd_b.frac + f.w.frac),
                ]
                vregs = []
                for n, (expr, frac) in enumerate(vt):
                    c = up.sc_lr_b if n == 0 else up.sc_lr_wd_b
                    if c.value == 0:
                        continue
                    r = Signal(expr.shape(), name=f"vt{n}_{lane}")
                    m.d.sync += r.eq(expr)  # read at S3 only
                    vregs.append((r, frac))
                v_terms3.append(vregs)

        # ---------------- S3: accumulate, update ----------------
        sat_flags = []
        first3 = iv[3] == 0
        bias3 = iv[3] == N
        fire3 = v[3] & fe & bias3
        zsh = f.w.frac + f.x.frac - f.y.frac
        z4 = [Signal(signed(f.y.bits), name=f"z4_{lane}") for lane in range(L)]
        zs4 = [Signal(name=f"zs4_{lane}") for lane in range(L)]
        fire4 = Signal()
        m.d.sync += fire4.eq(fire3)
        for lane in range(L):
            facc = Signal(signed(st.acc_fwd_bits), name=f"facc_{lane}")
            fsum = Signal(signed(st.acc_fwd_bits), name=f"fsum_{lane}")
            m.d.comb += fsum.eq(Mux(first3, 0, facc) + pf3[lane])
            with m.If(v[3]):
                m.d.sync += facc.eq(fsum)
            zv, zc = sat(wire(rhu(fsum, zsh), f"zr_{lane}"), f.y)
            with m.If(fire3):
                m.d.sync += [z4[lane].eq(zv), zs4[lane].eq(zc & ~pad[lane][3])]
            sat_flags.append(fire4 & zs4[lane])

        if st.input_gradient:
            gsum = pg3[0]
            for lane in range(1, L):
                gsum = gsum + pg3[lane]
            gnew = Signal(signed(st.acc_bwd_bits))
            if use_gacc:
                m.d.comb += gnew.eq(Mux(gv[3] == 0, 0, ga3) + gsum)
                m.d.comb += [
                    awr.en.eq(v[3] & be & (iv[3] != N)),
                    awr.addr.eq(iv[3]),
                    awr.data.eq(gnew),
                ]
            else:
                m.d.comb += gnew.eq(gsum)
            gv_, gc_ = sat(wire(rhu(gnew, f.w.frac + f.d.frac - f.gin.frac), "ginr"), f.gin)
            gin_en4 = Signal()
            gin_d4 = Signal(signed(f.gin.bits))
            gin_s4 = Signal()
            m.d.sync += gin_en4.eq(v[3] & be & (gv[3] == G - 1) & (iv[3] != N))
            with m.If(v[3]):
                m.d.sync += [gin_d4.eq(gv_), gin_s4.eq(gc_)]
            m.d.comb += [self.gin_en.eq(gin_en4), self.gin_data.eq(gin_d4)]
            sat_flags.append(gin_en4 & gin_s4)

        upd3 = v[3] & be
        ku = up.frac_u - f.w.frac
        kvs = up.frac_v - f.w.frac
        new_u = []  # (value at write stage, flag signal) per lane
        new_w = []
        for lane in range(L):
            lf = lfsrs[lane]
            m.d.comb += lf.draw.eq(upd3)
            r_u = lf.next[: plan.round_bits]
            U = 0
            for r, frac in u_terms3[lane]:
                U = U + align(r, frac, up.frac_u)
            uq, uc = sat(
                wire(round_upd(U, ku, r_u, plan.rounding, plan.round_bits), f"ur_{lane}"), f.u
            )
            uq = wire(uq, f"uq_{lane}")
            upd_live = upd3 & ~pad[lane][3]
            if not sc:
                wq, wc = sat(wire(w3[lane] - uq, f"wd_{lane}"), f.w)
                u4 = Signal(signed(f.u.bits), name=f"u4_{lane}")
                w4 = Signal(signed(f.w.bits), name=f"w4_{lane}")
                us4 = Signal(name=f"us4_{lane}")
                ws4 = Signal(name=f"ws4_{lane}")
                with m.If(v[3]):
                    m.d.sync += [u4.eq(uq), w4.eq(wq), us4.eq(uc & upd_live), ws4.eq(wc & upd_live)]
                sat_flags += [v[4] & us4, v[4] & ws4]
                new_u.append(u4)
                new_w.append(w4)
            else:
                u4 = Signal(signed(f.u.bits), name=f"u4_{lane}")
                w4 = Signal(signed(f.w.bits), name=f"w4_{lane}")
                rw4 = Signal(plan.lfsr_width - plan.round_bits, name=f"rw4_{lane}")
                us4 = Signal(name=f"us4_{lane}")
                with m.If(v[3]):
                    m.d.sync += [
                        u4.eq(uq),
                        w4.eq(w3[lane]),
                        rw4.eq(lf.next[plan.round_bits :]),
                        us4.eq(uc & upd_live),
                    ]
                vt4 = []
                for r, frac in v_terms3[lane]:
                    r4 = Signal(r.shape(), name=f"{r.name}_4")
                    with m.If(v[3]):
                        m.d.sync += r4.eq(r)
                    vt4.append((r4, frac))
                # S4: V and w'
                V = align(const_mul(up.sc_a.value, u4), up.sc_a.frac + f.w.frac, up.frac_v)
                for r4, frac in vt4:
                    V = V + align(r4, frac, up.frac_v)
                dw = round_upd(V, kvs, rw4[: plan.round_bits], plan.rounding, plan.round_bits)
                wq, wc = sat(wire(w4 - dw, f"wd_{lane}"), f.w)
                u5 = Signal(signed(f.u.bits), name=f"u5_{lane}")
                w5 = Signal(signed(f.w.bits), name=f"w5_{lane}")
                ws5 = Signal(name=f"ws5_{lane}")
                with m.If(v[4]):
                    m.d.sync += [u5.eq(u4), w5.eq(wq), ws5.eq(wc & be & ~pad[lane][4])]
                sat_flags += [v[4] & us4, v[5] & ws5]
                new_u.append(u5)
                new_w.append(w5)

        # ---------------- S4: forward outputs ----------------
        acts, masks = [], []
        for lane in range(L):
            z = z4[lane]
            if st.activation == "relu":
                a = Mux(z > 0, z, 0)
            elif st.activation == "leaky_relu":
                sl = st.negative_slope
                a = Mux(z > 0, z, rhu(const_mul(sl.value, z), sl.frac))
            else:
                a = z
            acts.append(a[: f.y.bits])
            masks.append(z > 0)
        m.d.comb += [
            self.y_en.eq(fire4),
            self.y_word.eq(gv[4]),
            self.y_data.eq(Cat(*acts)),
            mwr.en.eq(fire4),
            mwr.addr.eq(self.fm_base + gv[4]),
            mwr.data.eq(Cat(*masks)),
        ]

        # ---------------- write-back and weight access ----------------
        for _ in range(ws - natural_ws):  # single-port memories: one more register
            nu = [Signal.like(u, name=f"{u.name}_d") for u in new_u]
            nw = [Signal.like(w, name=f"{w.name}_d") for w in new_w]
            with m.If(v[natural_ws]):
                m.d.sync += [a.eq(b) for a, b in zip(nu + nw, new_u + new_w, strict=True)]
            new_u, new_w = nu, nw
        wen = v[ws] & be
        acc_w = self.acc_en & self.acc_we
        w_in, w_ic = sat(self.acc_wdata, f.w)
        u_in, u_ic = sat(self.acc_wdata, f.u)
        for lane in range(L):
            live = wen & ~pad[lane][ws]
            sel = self.acc_lane == lane
            m.d.comb += [
                ww[lane].en.eq(live | (acc_w & sel & (self.acc_kind == 0))),
                ww[lane].addr.eq(Mux(live, wk, self.acc_addr)),
                ww[lane].data.eq(Mux(live, new_w[lane], w_in)),
                uw[lane].en.eq(live | (acc_w & sel & (self.acc_kind == 1))),
                uw[lane].addr.eq(Mux(live, wk, self.acc_addr)),
                uw[lane].data.eq(Mux(live, new_u[lane], u_in)),
            ]
        # response, the cycle after acc_en
        r_we = Signal()
        r_kind = Signal(2)
        r_lane = Signal.like(self.acc_lane)
        r_wv = Signal(signed(max(f.w.bits, f.u.bits)))  # the saturated write data
        m.d.sync += [
            r_we.eq(self.acc_we),
            r_kind.eq(self.acc_kind),
            r_lane.eq(self.acc_lane),
            r_wv.eq(Mux(self.acc_kind == 0, w_in, u_in)),
        ]
        rsel_w = Signal(signed(f.w.bits))
        rsel_u = Signal(signed(f.u.bits))
        with m.Switch(r_lane):
            for lane in range(L):
                with m.Case(lane):
                    m.d.comb += [rsel_w.eq(wr[lane].data), rsel_u.eq(ur[lane].data)]
        m.d.comb += self.acc_rdata.eq(Mux(r_we, r_wv, Mux(r_kind == 0, rsel_w, rsel_u)))

        # ---------------- done and saturation counter ----------------
        active = self.start | busy
        for s in range(1, ws + 1):
            active = active | v[s]
        m.d.comb += self.done.eq(~active)
        cnt = Signal(32)
        inc = _popcount_sum(sat_flags)
        nxt = cnt + inc
        m.d.sync += cnt.eq(Mux(nxt > SAT_MAX, SAT_MAX, nxt))
        m.d.comb += self.saturations.eq(cnt)
        return m
