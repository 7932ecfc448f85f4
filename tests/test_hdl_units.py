"""HDL building blocks in Amaranth's simulator: fixed-point operators, the leap LFSR and the
loss unit, each against the golden model's definitions (docs/numerics.md §1, §4, §6)."""

from __future__ import annotations

import dataclasses
import random
import warnings

import pytest
import torch
from amaranth import Module, Signal, signed, unsigned
from amaranth.sim import Simulator
from pipetrain.compiler.build import FormatSpec, build_plan
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.ir import LayerIR, NetworkIR
from pipetrain.compiler.plan import QFormat
from pipetrain.hdl.arith import (
    const_mul,
    rhu,
    rhu_offset,
    rhu_offset_shift,
    rne,
    rsr,
    sat,
    select_add,
    split_product,
)
from pipetrain.hdl.lfsr import LFSR, leap_matrix
from pipetrain.hdl.loss import LossUnit, loss_unit_cycles
from pipetrain.sim import fixed
from pipetrain.sim import lfsr as golden_lfsr
from pipetrain.sim.golden import GoldenModel
from torch import nn

# ---- fixed-point operators -------------------------------------------------------------------


def test_operators_equal_the_golden_definitions():
    """sat/rhu/rne/rsr on 300 random 40-bit values (and the tie/edge cases) for shifts −3..20;
    rhu_offset_shift of v + rhu_offset(k) (the forward MAC's accumulator started at the offset)
    equals rhu(v, k)."""
    fmt = QFormat(12, 4)
    v = Signal(signed(40))
    r = Signal(unsigned(16))
    m = Module()
    outs = {}
    for k in (-3, 0, 1, 5, 16, 20):
        outs[("rhu", k)] = rhu(v, k)
        outs[("rhuo", k)] = rhu_offset_shift(v + rhu_offset(k), k)
        if k >= 0:
            outs[("rne", k)] = rne(v, k)
            outs[("rsr", k)] = rsr(v, k, r, 16)
    sv, sc = sat(v, fmt)
    sigs = {}
    for key, expr in outs.items():
        s = Signal(expr.shape(), name=f"{key[0]}_{key[1] + 3}")
        m.d.comb += s.eq(expr)
        sigs[key] = s
    s_sat, s_cnt = Signal(signed(fmt.bits)), Signal()
    m.d.comb += [s_sat.eq(sv), s_cnt.eq(sc)]
    rng = random.Random(7)
    values = [rng.randrange(-(1 << 39), 1 << 39) >> rng.randrange(40) for _ in range(300)]
    values += [-5, -4, -3, 3, 4, 5, 8, -8, 24, -24, 2047, 2048, -2048, -2049, 0, 1, -1]
    randoms = [rng.randrange(1 << 16) for _ in values]
    seen = []

    async def bench(ctx):
        for x, rr in zip(values, randoms, strict=True):
            ctx.set(v, x)
            ctx.set(r, rr)
            got = {key: ctx.get(s) for key, s in sigs.items()}
            seen.append((x, rr, got, ctx.get(s_sat), ctx.get(s_cnt)))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    for x, rr, got, sv_, sc_ in seen:
        for (op, k), val in got.items():
            exp = {
                "rhu": lambda: fixed.rhu(x, k),  # noqa: B023
                "rhuo": lambda: fixed.rhu(x, k),  # noqa: B023
                "rne": lambda: fixed.rne(x, k),  # noqa: B023
                "rsr": lambda: fixed.rsr(x, k, rr, 16),  # noqa: B023
            }[op]()
            assert val == exp, (op, k, x, rr)
        assert (sv_, sc_) == fixed.sat_int(x, fmt), x


@pytest.mark.parametrize("shape", [signed(6), unsigned(6), signed(4), unsigned(3), signed(1)])
def test_sat_every_value_of_small_shapes(shape):
    """sat(v, Q(b, 0)) on every value of ``shape`` for b = 1..7 (narrower, equal and wider than
    ``v``): the clamp and its flag equal the definition (the sign-extension test of
    :func:`~pipetrain.hdl.arith.sat` stands in for two comparators)."""
    v = Signal(shape)
    m = Module()
    outs = []
    for bits in range(1, 8):
        fmt = QFormat(bits, 0)
        sv, sc = sat(v, fmt)
        o, c = Signal(signed(bits), name=f"o{bits}"), Signal(name=f"c{bits}")
        m.d.comb += [o.eq(sv), c.eq(sc)]
        outs.append((fmt, o, c))
    lo, hi = (
        (-(1 << (shape.width - 1)), 1 << (shape.width - 1))
        if shape.signed
        else (0, 1 << shape.width)
    )
    seen = []

    async def bench(ctx):
        for x in range(lo, hi):
            ctx.set(v, x)
            seen.append((x, [(ctx.get(o), ctx.get(c)) for _, o, c in outs]))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert len(seen) == hi - lo
    for x, got in seen:
        for (fmt, _, _), g in zip(outs, got, strict=True):
            assert g == fixed.sat_int(x, fmt), (shape, fmt, x)


# (constant, operand bits, low bits): momentum 0.9 at 18 bits (235930 = 2·117965, 9 signed
# digits), an odd and a negative constant, SC's a, widths 19..26 and pieces of 1..8 bits
SPLITS = [
    (235930, 24, 6),
    (235930, 26, 8),
    (191103, 24, 6),
    (117965, 19, 1),
    (-235930, 24, 6),
    (-191103, 25, 7),
    (0x2AAAB, 22, 4),
]


@pytest.mark.parametrize("value,bits,lo", SPLITS)
def test_constant_product_with_a_low_piece_in_logic_is_exact(value, bits, lo):
    """``value·u`` with the low ``lo`` bits of ``u`` as a select-add (``Plan.logic_low_bits``):
    combinational (:func:`const_mul` with ``low_bits``) and as the update unit builds m·u
    (the select-add registered beside ``u`` at S1, :func:`split_product` at S2) equal the
    integer ``value·u`` for random ``u`` and the format's extremes; the select-add's netlist
    holds no multiplier cell (Yosys cannot map it to a DSP block)."""
    never = lambda c: False  # noqa: E731 (the constant is a multiplier, not a shift-add)
    u = Signal(signed(bits))
    en = Signal()
    m = Module()
    comb = Signal(signed(bits + value.bit_length() + 2), name="comb")
    m.d.comb += comb.eq(const_mul(value, u, never, lo))
    low1 = select_add(value, u[:lo])
    u2, low2 = Signal(signed(bits)), Signal(low1.shape())
    with m.If(en):
        m.d.sync += [u2.eq(u), low2.eq(low1)]
    piped = Signal.like(comb, name="piped")
    m.d.comb += piped.eq(split_product(value, u2[lo:].as_signed(), low2, lo))
    rng = random.Random(value ^ bits ^ lo)
    top = 1 << (bits - 1)
    values = [-top, top - 1, 0, -1, 1, (1 << lo) - 1, -(1 << lo), top - (1 << lo)]
    values += [rng.randrange(-top, top) for _ in range(300)]
    seen = []

    async def bench(ctx):
        prev = None
        for x in values:
            ctx.set(u, x)
            ctx.set(en, 1)
            got_comb = ctx.get(comb)
            await ctx.tick()
            seen.append((x, got_comb, ctx.get(piped)))
            ctx.set(en, 0)  # held: the registered pieces keep the last enabled u
            await ctx.tick()
            assert ctx.get(piped) == seen[-1][2]
            prev = x
        assert prev == values[-1]

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert len(seen) == len(values)
    for x, c, p in seen:
        assert c == value * x and p == value * x, (x, c, p)
    # the select-add is multiplexers and adders: no $mul for Yosys' mul2dsp to map
    from amaranth.back import rtlil

    sa = Module()
    bits_in, out = Signal(lo), Signal(low1.shape())
    sa.d.comb += out.eq(select_add(value, bits_in))
    text = rtlil.convert(sa, ports=[bits_in, out])
    assert "$mul" not in text and "$add" in text or lo == 1


# ---- LFSR ---------------------------------------------------------------------------------------

POLY = (1 << 32) | (1 << 22) | (1 << 2) | (1 << 1) | 1


def test_leap_matrix_is_multiplication_by_x_to_the_leap():
    rows = leap_matrix(POLY, 32, 32)
    rng = random.Random(1)
    for _ in range(50):
        s = rng.randrange(1, 1 << 32)
        by_matrix = sum((bin(row & s).count("1") & 1) << b for b, row in enumerate(rows))
        assert (
            by_matrix
            == golden_lfsr.draw(s, POLY)
            == golden_lfsr.gf2_mulmod(s, golden_lfsr.x_pow(32, POLY), POLY)
        )


@pytest.mark.parametrize("seed", [1, 0x9E3779B9, 0xFFFFFFFF])
def test_lfsr_draws_only_when_asked_and_equals_the_golden_sequence(seed):
    """Random draw enables over 200 cycles: the state after each draw is golden's draw()."""
    dut = LFSR(POLY, 32, 32, seed)
    rng = random.Random(seed & 0xFFFF)
    pattern = [rng.random() < 0.6 for _ in range(200)]
    got, exp = [], []
    state = seed
    for p in pattern:
        if p:
            state = golden_lfsr.draw(state, POLY)
            exp.append(state)

    async def bench(ctx):
        for p in pattern:
            ctx.set(dut.draw, p)
            nxt = ctx.get(dut.next)
            await ctx.tick()
            if p:
                got.append(nxt)
                assert ctx.get(dut.state) == nxt

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got == exp and len(got) == sum(pattern)


def test_lfsr_rejects_zero_seed():
    with pytest.raises(ValueError, match="non-zero"):
        LFSR(POLY, 32, 32, 0)


# ---- loss unit -------------------------------------------------------------------------------


def _loss_plan(loss: str, d_fmt: QFormat | None = None, lanes=(2, 2)):
    """8 → 6 → 5 network; the last stage has 2 lanes (logits arrive 2 per word, 3 words)."""
    ir = NetworkIR("l", 8, (LayerIR("0", 8, 6, "relu"), LayerIR("2", 6, 5)), loss)
    fs = FormatSpec.default(2)
    if d_fmt is not None:
        fs = dataclasses.replace(fs, d=(fs.d[0], d_fmt))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = build_plan(ir, TrainConfig(loss=loss), fs, lanes=list(lanes))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 5))
    return plan, GoldenModel(plan, model)


def _run_loss(plan, cases):
    """Run the loss unit on (logits, label, train) cases; return per case (pred, loss, δ list,
    saturation counter after the case, cycles from start to done)."""
    Lz = plan.stages[-1].lanes
    assert plan.loss.z_lanes == Lz  # the plan's logit-buffer geometry
    dut = LossUnit(plan.loss, plan.shift_add)
    zb, Q = plan.loss.z.bits, plan.loss.errors_per_write
    out = []

    async def bench(ctx):
        for z, label, train in cases:
            words = -(-len(z) // Lz)
            for w in range(words):
                word = 0
                for k, v in enumerate(z[w * Lz : (w + 1) * Lz]):
                    word |= (v & ((1 << zb) - 1)) << (k * zb)
                ctx.set(dut.z_in.valid, 1)
                ctx.set(dut.z_in.payload.word, w)
                ctx.set(dut.z_in.payload.data, word)
                if w < words - 1:
                    await ctx.tick()
            # the start pulse in the cycle of the last word (the latest the contract allows:
            # the last word arrives no later than the feeding stage's done)
            ctx.set(dut.ctl.label, label)
            ctx.set(dut.ctl.train, train)
            ctx.set(dut.ctl.start, 1)
            await ctx.tick()
            ctx.set(dut.z_in.valid, 0)
            ctx.set(dut.ctl.start, 0)
            deltas, cycles = [], 1
            while not ctx.get(dut.ctl.done):
                if ctx.get(dut.delta.valid):
                    beat = ctx.get(dut.delta.payload)
                    deltas += [beat[t] for t in range(Q)] if Q > 1 else [beat]
                await ctx.tick()
                cycles += 1
            out.append(
                (ctx.get(dut.pred), ctx.get(dut.loss), deltas, ctx.get(dut.saturations), cycles)
            )

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return out


def _cases(fmt: QFormat, C: int = 5):
    rng = random.Random(3)
    lo, hi = fmt.min_int, fmt.max_int
    cases = [[rng.randrange(-3000, 3000) for _ in range(C)] for _ in range(6)]
    cases += [
        [100] * C,  # all tied: argmax 0, uniform p
        [hi, lo, lo, lo, lo],  # extreme spread: LUT index clamps at K − 1
        [lo, hi, hi, 0, -1],  # tie at the maximum: the lower index wins
        [0, 0, 40, 0, 0],  # exact tie on the LUT rounding boundary
        [lo] * C,
        [hi, 0, 0, 0, hi],  # tie between the first and the last logit: index 0 wins
        [0, -5, 7, 3, 9],  # the maximum in the last word's first lane
    ]
    labels = [rng.randrange(C) for _ in cases]
    trains = [True] * len(cases)
    trains[2] = False  # an inference sample: δ clamps are not counted
    return list(zip(cases, labels, trains, strict=True))


@pytest.mark.parametrize(
    "loss,d_fmt,lanes,par,regs",
    [
        ("cross_entropy", None, (2, 2), (1, 1), 0),
        # δ in [−0.5, 0.5): p − 1, p > 0.5 clamp
        ("cross_entropy", QFormat(8, 8), (2, 2), (2, 2), 0),
        ("cross_entropy", None, (2, 5), (5, 1), 0),  # one word of 5: the registered compare tree
        ("cross_entropy", None, (2, 3), (3, 2), 0),  # 2 words of 3 lanes, one padding lane each
        ("cross_entropy", None, (2, 3), (1, 2), 0),
        # the ECP5 boards' operand registers (fabric form here): e_j, r and the product
        # registered before p's rounding, and the exp LUT's index before the ROM and its
        # entries before their sum: 4 cycles more
        ("cross_entropy", None, (2, 3), (3, 2), 1),
        ("cross_entropy", QFormat(8, 8), (2, 2), (1, 1), 1),
        # the exp ROM in logic (many read ports on the ECP5): the same registers
        ("cross_entropy", None, (2, 5), (5, 2), "logic"),
        # Q = out_lanes errors a cycle (one beat of Q): all 5 at once, and 2 + 2 + 1 (a
        # padding row in the last beat) out of 2-lane ebuf words of 3 logit words
        ("cross_entropy", None, (2, 5), (5, 2, 5), 1),
        ("cross_entropy", QFormat(8, 8), (2, 2), (2, 1, 2), 0),
        ("cross_entropy", None, (2, 5), (5, 1, 5), "logic"),
        # the radix-2^k divider (k > 2: two chained steps, then one digit a cycle by 2^k − 1
        # parallel compares), with and without the registers, one and five errors a cycle
        ("cross_entropy", QFormat(8, 8), (2, 2), (1, 3), 0),
        ("cross_entropy", None, (2, 5), (5, 4), 1),
        ("cross_entropy", None, (2, 5), (5, 4, 5), "logic"),
        ("mse", None, (2, 2), (1, 1), 0),
        ("mse", QFormat(8, 9), (2, 2), (1, 1), 0),
    ],
)
def test_loss_unit_equals_golden(loss, d_fmt, lanes, par, regs):
    """pred, loss output, every δ_j, the saturation counter and the cycle count equal the golden
    loss unit / the plan, on random, tied, extreme and saturating logits, for exp lanes P,
    divider bits k and out lanes Q ``par`` (the plan's parallelism, which never changes a
    result; Q = 1 when left out) and ``regs``
    operand registers (``LossUnit.operand_registers``, timing only; ``"logic"``: one, with the
    exp ROM a logic memory, whose index is registered instead of its entries)."""
    plan, g = _loss_plan(loss, d_fmt, lanes)
    P, k, Q = (*par, 1)[:3]
    lu = plan.loss
    rom = "logic" if regs == "logic" else None
    regs = 1 if rom else regs
    cycles_pk = loss_unit_cycles(loss, 5, lu.recip_frac, P, k, lanes[-1], regs, Q)
    mems = tuple(
        dataclasses.replace(mm, kind=rom) if rom and mm.name == "lut" else mm for mm in lu.memories
    )
    lu = dataclasses.replace(
        lu,
        exp_lanes=P,
        div_bits=k,
        cycles=cycles_pk,
        operand_registers=regs or None,
        memories=mems,
        out_lanes=Q if Q > 1 else None,
    )
    plan = dataclasses.replace(plan, loss=lu)
    cases = _cases(plan.loss.z)
    got = _run_loss(plan, cases)
    for (z, label, train), (pred, lossv, deltas, sats, cycles) in zip(cases, got, strict=True):
        p, lr, dl = g.loss_unit(
            torch.tensor(z, dtype=torch.int64), torch.tensor(label), want_delta=train
        )
        assert (pred, lossv) == (int(p), int(lr)), (z, label)
        if train:  # rows past C in the last beat are 0
            assert deltas == dl.tolist() + [0] * (-5 % Q), (z, label)
        assert sats == g.stage_saturations[-1]
        assert cycles == cycles_pk
    if loss == "cross_entropy":  # C = 5, fr = 16: ⌈5/P⌉ + div + ⌈5/Q⌉ + 5 + ⌈log2 lanes⌉
        tree = {2: 1, 3: 2, 5: 3}[lanes[-1]]  # (+ R + 4); div: ⌈17/k⌉, 1 + ⌈15/k⌉ at k > 2
        div = -(-17 // k) if k <= 2 else 1 + -(-15 // k)
        want = -(-5 // P) + div + -(-5 // Q) + 5 + tree + (regs + 4 if regs else 0)
        assert cycles_pk == want
    if d_fmt is not None:
        assert g.stage_saturations[-1] > 0  # the saturating formats did clamp


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_divider_quotient_every_radix(k):
    """The loss unit's reciprocal divider (``hdl/loss.py``'s ``_Divider``) gives r =
    ⌊2^(fe+fr)/E⌋ at every ``div_bits`` k (chained steps at k ≤ 2; a radix-2^k digit a cycle,
    its remainder a binary search over the compares, at k = 3, 4) in
    :func:`~pipetrain.compiler.loss_unit.divider_cycles` cycles, with mlp-digits' formats
    (fe = 15, fr = 16, 10 classes: 2^15 ≤ E ≤ 10·2^15): both ends, the powers of two and
    their neighbours (a digit of 0 or 2^k − 1, a remainder of 0), and 120 random E."""
    from pipetrain.compiler.loss_unit import divider_cycles
    from pipetrain.hdl.loss import _Divider

    fe, fr, C = 15, 16, 10
    E = Signal(fe + 1 + C.bit_length())
    go = Signal()
    m = Module()
    div = _Divider(m, E, fe, fr, k)
    with m.If(go):
        m.d.sync += div.init()
    with m.Else():
        m.d.sync += div.step()
    lo, hi = 1 << fe, C << fe
    rng = random.Random(k)
    es = [lo, lo + 1, hi - 1, hi, 3 << (fe - 1), 5 << (fe - 1), 7 << (fe - 1)]
    es += [(1 << b) + d for b in range(fe, fe + 4) for d in (-1, 0, 1) if lo <= (1 << b) + d <= hi]
    es += [rng.randrange(lo, hi + 1) for _ in range(120)]
    D = divider_cycles(fr, k)
    got = []

    async def bench(ctx):
        for e in es:
            ctx.set(E, e)
            ctx.set(go, 1)
            await ctx.tick()
            ctx.set(go, 0)
            for _ in range(D):
                assert ctx.get(div.count) < D
                await ctx.tick()
            got.append(ctx.get(div.r))

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert got == [(1 << (fe + fr)) // e for e in es]
