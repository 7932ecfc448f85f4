"""The activation dispatch: every supported activation and its derivative equal the golden
model's (docs/numerics.md §2, §5) on all values of a small format — tanh / sigmoid through
:class:`LUTActivation` (the plan's ROM) on every input of a 12-bit format and on every ROM
address of a 16-bit one, their derivative from the stashed y on every output; an unknown
activation is refused when the stage (or the network top) is constructed, naming the stage,
the activation and the supported set — never a silent identity."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from amaranth import Module, Signal, signed
from amaranth.sim import Simulator
from pipetrain.compiler.act_lut import activation_lut
from pipetrain.compiler.plan import QFormat
from pipetrain.hdl.activation import (
    SUPPORTED_ACTIVATIONS,
    Activation,
    LUTActivation,
    activation_of,
)
from pipetrain.hdl.stage import StageUnit
from pipetrain.hdl.top import NetworkTop, check_supported
from pipetrain.hdl.verilog import generate_verilog
from pipetrain.sim import fixed
from pipetrain.sim.golden import lut_derivative, lut_forward
from tiny_net import tiny


def _golden_act(name, slope, z):
    if name == "relu":
        return max(z, 0)
    if name == "leaky_relu" and z <= 0:
        return fixed.rhu(z * slope.value, slope.frac)
    return z


@pytest.mark.parametrize("s", [0, 1, 2])  # leaky_relu, relu, identity
def test_forward_and_derivative_equal_the_golden_model(s):
    plan, _, _ = tiny()
    st = plan.stages[s]
    act = activation_of(st, plan.shift_add)
    assert act.name == st.activation
    bits = 10
    z, g, pos = Signal(signed(bits)), Signal(signed(bits)), Signal()
    a_out = Signal(signed(bits))
    d_out = Signal(signed(bits + 1))
    m = Module()
    m.d.comb += [a_out.eq(act.forward(z)[:bits]), d_out.eq(act.derivative(pos, g))]
    seen = []

    async def bench(ctx):
        for v in range(-(1 << (bits - 1)), 1 << (bits - 1), 3):
            ctx.set(z, v)
            ctx.set(g, -v // 2)
            ctx.set(pos, v > 0)
            seen.append((v, ctx.get(a_out), ctx.get(d_out)))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    sl = st.negative_slope
    for v, a, d in seen:
        assert a == _golden_act(st.activation, sl, v), v
        gv = -v // 2
        exp_d = (
            gv
            if v > 0 or st.activation == "identity"
            else (0 if st.activation == "relu" else fixed.rhu(gv * sl.value, sl.frac))
        )
        assert d == exp_d, v


def test_unknown_activation_is_refused_at_construction():
    plan, _, _ = tiny()
    # the plan refuses unknown names itself; a newer compiler may know one the HDL does not
    bad = dataclasses.replace(plan.stages[1])
    object.__setattr__(bad, "activation", "gelu")
    plan_bad = dataclasses.replace(plan, stages=(plan.stages[0], bad, plan.stages[2]))
    pattern = (
        r"stage 2: activation 'gelu' has no hardware; the HDL builds identity, relu, "
        r"leaky_relu, tanh, sigmoid"
    )
    with pytest.raises(NotImplementedError, match=pattern):
        StageUnit(plan_bad, bad)
    with pytest.raises(NotImplementedError, match=pattern):
        check_supported(plan_bad)
    with pytest.raises(NotImplementedError, match=pattern):
        NetworkTop(plan_bad)
    with pytest.raises(NotImplementedError, match=pattern):
        generate_verilog(plan_bad, "bad")
    with pytest.raises(NotImplementedError, match="needs a negative slope"):
        Activation("leaky_relu", None, 1)
    assert SUPPORTED_ACTIVATIONS == ("identity", "relu", "leaky_relu", "tanh", "sigmoid")
    with pytest.raises(NotImplementedError, match="tanh needs the plan's activation LUT"):
        Activation("tanh", None, 1)


def _lut_inputs(fmt: QFormat, lut, rng: random.Random) -> list[int]:
    """Every z of a format up to 12 bits; else every ROM address (both signs, a random
    remainder), the format's ends, and random values."""
    if fmt.bits <= 12:
        return list(range(fmt.min_int, fmt.max_int + 1))
    k = fmt.frac - lut.index_frac
    out = [fmt.min_int, fmt.max_int, 0, -1, 1]
    for i in range(len(lut.entries)):
        a = min((i << k) + rng.randrange(1 << k), fmt.max_int)
        out += [a, -a]
    return out + [rng.randrange(fmt.min_int, fmt.max_int + 1) for _ in range(300)]


@pytest.mark.parametrize("function", ["tanh", "sigmoid"])
@pytest.mark.parametrize("fmt", [QFormat(12, 8), QFormat(16, 12)], ids=str)
def test_lut_activation_equals_the_golden_lut(function, fmt):
    """LUTActivation (3 lanes, a ROM read per ``en``) outputs exactly the golden model's
    ``lut_forward`` the cycle after ``en``, on every input (12 bits: all 4096) or every ROM
    address (16 bits); ``y`` holds while ``en`` is low."""
    L = 3
    lut = activation_lut(function, fmt)
    rng = random.Random(7)
    zs = _lut_inputs(fmt, lut, rng)
    zs += [0] * (-len(zs) % L)
    dut = LUTActivation(L, lut, fmt)
    got = []

    async def bench(ctx):
        for n in range(0, len(zs), L):
            for lane in range(L):
                ctx.set(dut.z[lane], zs[n + lane])
            ctx.set(dut.en, 1)
            await ctx.tick()
            ctx.set(dut.en, 0)
            for lane in range(L):
                ctx.set(dut.z[lane], rng.randrange(fmt.min_int, fmt.max_int + 1))
            if n % (5 * L) == 0:
                await ctx.tick()  # an idle cycle: the outputs must hold
            got.extend(ctx.get(dut.y[lane]) for lane in range(L))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    want = lut_forward(torch.tensor(zs), lut, fmt.frac).tolist()
    assert got == want


@pytest.mark.parametrize("function", ["tanh", "sigmoid"])
def test_lut_derivative_equals_the_golden_model(function):
    """δ = rhu(g·q(y), f) for every y the LUT outputs in Q3.8 and errors g of a 12-bit format
    (extremes and random)."""
    fy, fd = QFormat(12, 8), QFormat(12, 10)
    lut = activation_lut(function, fy)
    act = Activation(function, None, 1, None, lut, fy)
    assert act.stash_bits == 12
    ys = sorted(set(lut_forward(torch.arange(fy.min_int, fy.max_int + 1), lut, 8).tolist()))
    rng = random.Random(3)
    gs = [fd.min_int, fd.max_int, 0, -1] + [
        rng.randrange(fd.min_int, fd.max_int + 1) for _ in range(4)
    ]
    y, g = Signal(signed(fy.bits)), Signal(signed(fd.bits))
    d_out = Signal(signed(fd.bits + 1))
    m = Module()
    m.d.comb += d_out.eq(act.derivative(y.as_unsigned(), g))
    seen = []

    async def bench(ctx):
        for yv in ys:
            for gv in gs:
                ctx.set(y, yv)
                ctx.set(g, gv)
                seen.append((yv, gv, ctx.get(d_out)))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    yt = torch.tensor([a for a, _, _ in seen])
    gt = torch.tensor([b for _, b, _ in seen])
    assert [d for _, _, d in seen] == lut_derivative(function, yt, gt, 8).tolist()


def test_lut_stage_multipliers_are_the_estimated_ones():
    """A tanh / sigmoid stage adds exactly 3 variable multipliers per lane to the netlist
    (interpolation, derivative factor, g × factor; the ReLU net has one forward and one update
    multiplier per lane, an input-gradient one after stage 1 and the loss unit's,
    tests/test_hdl_verilog.py), each within the plan's estimate
    (``compiler.build.multiplier_operands``, from which the board fit counts DSP blocks)."""
    from collections import Counter

    from pipetrain.compiler.build import multiplier_operands
    from pipetrain.hdl.resources import design_resources

    plan, _, _ = tiny(acts=("tanh", "sigmoid"))
    relu = tiny()[0]
    base = sum(s.lanes * (3 if s.input_gradient else 2) for s in plan.stages) + 1
    lanes = plan.stages[0].lanes + plan.stages[1].lanes
    built = Counter(design_resources(plan).variable_multipliers)
    assert sum(built.values()) == base + 3 * lanes == 35
    estimated = [
        op
        for st, twin in zip(plan.stages[:2], relu.stages[:2], strict=True)
        for op in multiplier_operands(st)
        if op not in multiplier_operands(twin)
    ]
    assert len(estimated) == 6  # 3 per LUT stage
    # the LUT ones: what the ReLU twin does not build (both have the same MACs and update)
    twin_built = Counter(design_resources(relu).variable_multipliers)
    lut_built = list((built - twin_built).elements())
    assert len(lut_built) == 3 * lanes
    for a, b in lut_built:
        assert any(max(a, b) <= max(x, y) and min(a, b) <= min(x, y) for x, y in estimated), (
            a,
            b,
            estimated,
        )
