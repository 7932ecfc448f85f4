"""The update unit alone (Amaranth simulator), slot by slot against an exact integer reference
built from the golden model's operators (:mod:`pipetrain.sim.fixed`, :mod:`pipetrain.sim.lfsr`;
docs/numerics.md §1, §3, §5.3, §6): ŵ (LWP) and the MACs' rounded weight operands, the
scaled errors e = rhu(c·δ, k) of the learning-rate products, u′ and w′ (momentum, weight
decay, Spike Compensation),
stochastic rounding with each lane's LFSR draw or round-half-to-even, the saturation flags of
live lanes — with random gaps between slots, random operands (some at the format limits) and
inference / forward-only passes in between (no draws, no write-back)."""

from __future__ import annotations

import dataclasses
import random
import zlib

import pytest
from amaranth.sim import Simulator
from hdl_slots import drive_pass
from pipetrain.compiler.build import momentum_logic
from pipetrain.compiler.plan import csd
from pipetrain.hdl.streams import SlotPipelineSignature
from pipetrain.hdl.update import LFSRConfig, UpdateUnit, scaled_error_ports, scaled_errors
from pipetrain.sim import fixed
from pipetrain.sim import lfsr as golden_lfsr
from tiny_net import tiny


def _term(c, operand, ofrac, fto):
    return 0 if c.value == 0 else fixed.align(c.value * operand, c.frac + ofrac, fto)


def reference_update(plan, st, w, u, d, x, draw):
    """(w′, u′, u clamped, w clamped) of one element (numerics §3, the golden model's
    ``_StageEngine.backward`` for one weight)."""
    f, up, R = st.formats, st.update, plan.round_bits
    mask = (1 << R) - 1

    def rnd(v, k, r):
        if plan.rounding == "stochastic":
            return fixed.rsr(v, k, r, R)
        return fixed.rne(v, k)

    P = d * x
    fp = f.d.frac + f.x.frac

    def lr_term(c, fe, fto):  # c·P exact, or (rhu(c·δ, k))·x (numerics §5.3)
        if fe is None:
            return _term(c, P, fp, fto)
        e = fixed.rhu(c.value * d, c.frac + f.d.frac - fe.frac)
        assert fe.min_int <= e <= fe.max_int  # the format holds every e unclamped
        return fixed.align(e * x, fe.frac + f.x.frac, fto)

    U = (
        _term(up.momentum, u, f.w.frac, up.frac_u)
        + lr_term(up.lr, up.lr_delta, up.frac_u)
        + _term(up.lr_wd, w, f.w.frac, up.frac_u)
    )
    u1, cu = fixed.sat_int(rnd(U, up.frac_u - f.w.frac, draw & mask), f.u)
    if up.sc:
        V = (
            _term(up.sc_a, u1, f.w.frac, up.frac_v)
            + lr_term(up.sc_lr_b, up.sc_lr_b_delta, up.frac_v)
            + _term(up.sc_lr_wd_b, w, f.w.frac, up.frac_v)
        )
        w1, cw = fixed.sat_int(w - rnd(V, up.frac_v - f.w.frac, (draw >> R) & mask), f.w)
    else:
        w1, cw = fixed.sat_int(w - u1, f.w)
    return w1, u1, cu, cw


def _value(rng, fmt, edge=0.25):
    if rng.random() < edge:
        return rng.choice([fmt.min_int, fmt.max_int])
    span = max(1, (fmt.max_int - fmt.min_int) // 8)
    return rng.randrange(-span, span)


CASES = [
    (dict(), 0),  # momentum, lr, weight decay, stochastic rounding; 2 lanes, one padding
    (dict(), 1),  # 3 lanes over 4 rows: 2 padding lanes in the last group
    (dict(mitigation="sc+lwp", rounding="nearest_even"), 1),
    (dict(mitigation="sc", lr=0.3), 0),  # large steps: u′ and w′ clamp
    (dict(lr=0.3), 0),  # without SC: w′ = sat(w − u′) picked by u′'s clamp side at S4
    (dict(lr=0.3, rounding="nearest_even"), 1),
    (dict(lanes=(1, 3, 1), single_port=(1, 3), const_bits=5), 0),  # shift-add constants, SPRAM
    (dict(mitigation="sc+lwp", lanes=(1, 1, 1), single_port=(2,), const_bits=4), 1),
    # LWP w form: ŵ = w + H·(w − w_prev) from the w_prev read, the old w written back as w_prev
    (dict(mitigation="sc+lwp", lwp_form="w"), 0),
    (dict(mitigation="lwp", lwp_form="w", rounding="nearest_even", const_bits=5), 1),
    # LWP's H (5, 3) as multipliers (at most 1 signed digit is a shift-add): H·u, H·(w − w_prev)
    # with their low pieces in logic beside the multiplier at S1 (plan.logic_low_bits)
    (dict(mitigation="sc+lwp", max_terms=1), 0),
    (dict(mitigation="sc+lwp", lwp_form="w", max_terms=1), 1),
    # the ECP5's operand registers (every S2 operand, the select-adds too, one stage more)
    (dict(operand_registers=1), 1),
    (dict(mitigation="sc+lwp", lwp_form="w", max_terms=1, operand_registers=1), 0),
    (dict(mitigation="sc", rounding="nearest_even", operand_registers=1), 2),
    # two operand registers (an experiment's P = 2): every S2 operand two stages more
    (dict(operand_registers=2), 1),
    (dict(mitigation="sc+lwp", lwp_form="w", max_terms=1, operand_registers=2), 0),
    (dict(mitigation="sc", rounding="nearest_even", operand_registers=2), 2),
    # m·u in shifts and adders (the 9-digit momentum), its tree over 0, 1 and 2 operand registers
    (dict(momentum_in_logic=True), 0),
    (dict(momentum_in_logic=True, operand_registers=1), 1),
    (dict(momentum_in_logic=True, mitigation="sc", operand_registers=2), 2),
    # a shift-add momentum (TrainConfig.momentum_digits, numerics §1): 4 signed digits in
    # logic (3 adders over the operand registers), and 3 — a shift-add constant, no multiplier
    (dict(momentum_digits=4, momentum_in_logic=True, operand_registers=2), 1),
    (dict(momentum_digits=3, mitigation="sc", operand_registers=1), 0),
    # a 16-step LFSR leap (TrainConfig.lfsr_leap, numerics §6): each draw the 16 bits u′ takes
    (dict(lfsr_leap=16, operand_registers=2), 1),
    (dict(lfsr_leap=16, momentum_digits=4, momentum_in_logic=True, lr=0.3), 0),
    # column lanes (Stage.col_lanes): L·k physical lanes, lane p's x the slot's operand p div L
    (dict(col_lanes=(3,), lr=0.3), 0),
    (dict(col_lanes=(2,), mitigation="sc+lwp", operand_registers=2), 0),
]


@pytest.mark.parametrize("case,s", CASES, ids=lambda c: str(c))
def test_update_unit_equals_the_reference_slot_by_slot(case, s):
    """Every case with 18-bit constants has m·u and λ·w (and SC's a·u′, b·lr·λ·w) with a low
    piece in logic (24-bit u and w, ``logic_low_bits`` = 8: the top 18 bits in the multiplier,
    the constant × the low 6 bits a select-add); ``max_terms`` makes LWP's H one too."""
    opts = {k: v for k, v in case.items() if k != "max_terms"}
    plan, _, _ = tiny(**opts)
    if "max_terms" in case:
        plan = dataclasses.replace(plan, shift_add_max_terms=case["max_terms"])
    st = plan.stages[s]
    f, up = st.formats, st.update
    assert plan.lfsr_leap == case.get("lfsr_leap", 32)
    digits = case.get("momentum_digits")
    if digits:  # 0.9 → at most that many signed digits, and m·u in no DSP block
        assert len(csd(up.momentum.value)) == digits and up.momentum.real == 0.9
        assert up.momentum.quantised == {4: 0.8984375, 3: 0.90625}[digits]
        assert "momentum" not in [p.name for p in st.products]
    elif case.get("momentum_in_logic"):  # no momentum multiplier: 9 signed digits in logic
        assert len(csd(up.momentum.value)) == 9 and plan.momentum_in_logic
        assert "momentum" not in [p.name for p in st.products]
    elif case.get("const_bits", 18) == 18:  # the low pieces this case exercises
        assert plan.low_piece(up.momentum.value, f.u.bits) == f.u.bits - 18 == 6
        assert not up.sc or plan.low_piece(up.sc_a.value, f.u.bits) == 6
    if "max_terms" in case:
        hb = f.w.bits + 1 if up.lwp_form == "w" else f.u.bits
        assert plan.low_piece(up.lwp_horizon, hb) == hb - 18 > 0
    N, G, Lr, M = st.in_features, st.row_groups, st.lanes, st.out_features
    K, C, L = st.column_lanes, st.group_slots, st.mac_lanes  # L: the physical lanes, Lr·K
    pipe = SlotPipelineSignature(C - 1, G, st.cycles_per_tick, st.write_stage)
    lfsr = LFSRConfig(
        plan.lfsr_poly, plan.lfsr_width, plan.lfsr_leap, plan.round_bits, st.lfsr_seeds
    )
    dut = UpdateUnit(
        pipe,
        lanes=L,
        live_last=M - (G - 1) * Lr,
        columns=K,
        formats=f,
        update=up,
        x_operand_bits=st.x_operand_bits,
        what_bits=st.what_bits,
        update_stage=st.update_stage,
        rounding=plan.rounding,
        lfsr=lfsr,
        shift_add=plan.shift_add,
        weight_operand=st.weight_operand,
        low_piece=plan.low_piece,
        operand_registers=st.operand_registers or 0,
        momentum_in_logic=momentum_logic(st, plan.momentum_in_logic),
    )
    scaled = list(zip(scaled_error_ports(st), scaled_errors(st), strict=True))
    w_form = up.lwp_horizon > 0 and up.lwp_form == "w"
    assert w_form == (case.get("lwp_form") == "w")
    rng = random.Random(zlib.crc32(repr((case, s)).encode()))
    passes = [(True, True), (False, False), (True, False), (True, True), (False, True)]
    log = []

    async def bench(ctx):
        for bwd, fwd_train in passes:
            ops, w_s2, wb, flags = {}, {}, {}, [0] * (2 * L)

            def cycle(pipe_, ops=ops, w_s2=w_s2, wb=wb, flags=flags):
                s1, s2 = pipe_[1], pipe_[2]
                if s1 is not None:
                    w = [_value(rng, f.w) for _ in range(L)]
                    u = [_value(rng, f.u) for _ in range(L)]
                    wp = [_value(rng, f.w) for _ in range(L)]  # w_prev (w form only)
                    ops[s1[0]] = [w, u, wp]
                    for k in range(L):
                        ctx.set(dut.read.w[k], w[k])
                        ctx.set(dut.read.u[k], u[k])
                        if w_form:
                            ctx.set(dut.read.w_prev[k], wp[k])
                if s2 is not None:
                    n, t, _ = s2
                    d = [_value(rng, f.d) for _ in range(L)]
                    x = [(1 << f.x.frac) if i == N else 0 if i > N else _value(rng, f.x)
                         for i in range(t * K, t * K + K)]  # fmt: skip
                    ops[n] += [d, x]
                    for k in range(L):
                        ctx.set(dut.delta.delta[k], d[k])
                        for port, (c, kk, _) in scaled:  # the error buffer's e at S2
                            ctx.set(getattr(dut, port).delta[k], fixed.rhu(c * d[k], kk))
                    if K == 1:
                        ctx.set(dut.operands.x_bwd, x[0])
                    for c in range(K if K > 1 else 0):
                        ctx.set(dut.operands.x_bwd[c], x[c])
                    w_s2[n] = [
                        (ctx.get(dut.weights.w_hat[k]), ctx.get(dut.weights.w[k])) for k in range(L)
                    ]
                out = dut.write_back
                if ctx.get(out.valid):
                    n = pipe_[st.write_stage][0]
                    lanes = ctx.get(out.payload.lanes)
                    wb[n] = (
                        lanes,
                        [(ctx.get(out.payload.w[k]), ctx.get(out.payload.u[k])) for k in range(L)],
                        [ctx.get(out.payload.w_prev[k]) for k in range(L)] if w_form else None,
                    )
                sat = ctx.get(dut.saturated)
                for b in range(2 * L):
                    flags[b] += (sat >> b) & 1

            await drive_pass(
                ctx,
                dut.slots,
                pipe,
                rng=rng,
                gap=0.3,
                bwd=bwd,
                fwd_train=fwd_train,
                cycle=cycle,
                single_port=st.slot_cycles == 2,
            )
            log.append((bwd, fwd_train, ops, w_s2, wb, flags))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()

    state = list(st.lfsr_seeds)
    clamps = 0
    by_kind = [0, 0]  # u′ clamps, w′ clamps
    for bwd, fwd_train, ops, w_s2, wb, flags in log:
        assert sorted(ops) == list(range(st.cycles_per_tick))
        assert sorted(wb) == (list(range(st.cycles_per_tick)) if bwd else [])
        exp_flags = [0] * (2 * L)
        for n in range(st.cycles_per_tick):
            w, u, wp, d, x = ops[n]
            g = n // C
            for k in range(L):
                what = w[k]
                if fwd_train and up.lwp_horizon:  # numerics §3 step 1, exact
                    step = w[k] - wp[k] if w_form else -u[k]
                    what = w[k] + up.lwp_horizon * step
                kw = st.weight_shift  # the MAC operands (numerics §3.2, §5.2)
                assert w_s2[n][k] == (fixed.rhu(what, kw), fixed.rhu(w[k], kw)), (n, k)
            if not bwd:
                continue
            lanes, got, got_prev = wb[n]
            for k in range(L):
                state[k] = golden_lfsr.draw(
                    state[k], plan.lfsr_poly, plan.lfsr_width, plan.lfsr_leap
                )
                live = g * Lr + k % Lr < M
                assert (lanes >> k) & 1 == live, (n, k)
                xk = x[k // Lr]  # the lane's column t·K + k div Lr
                w1, u1, cu, cw = reference_update(plan, st, w[k], u[k], d[k], xk, state[k])
                if live:
                    assert got[k] == (w1, u1), (n, k)
                    if w_form:  # numerics §5: w_prev ← the w before this update
                        assert got_prev[k] == w[k], (n, k)
                    exp_flags[2 * k] += cu
                    exp_flags[2 * k + 1] += cw
                    by_kind[0] += cu
                    by_kind[1] += cw
        assert flags == exp_flags
        clamps += sum(flags)
    assert clamps > 0  # the edge operands did clamp
    if case.get("lr"):  # large steps: both u′ and w′ clamp
        assert min(by_kind) > 0, by_kind
