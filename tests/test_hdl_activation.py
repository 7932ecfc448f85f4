"""The activation dispatch: every supported activation and its derivative equal the golden
model's (docs/numerics.md §2, §5) on all values of a small format; an unknown activation is
refused when the stage (or the network top) is constructed, naming the stage, the activation
and the supported set — never a silent identity."""

from __future__ import annotations

import dataclasses

import pytest
from amaranth import Module, Signal, signed
from amaranth.sim import Simulator
from pipetrain.hdl.activation import SUPPORTED_ACTIVATIONS, Activation, activation_of
from pipetrain.hdl.stage import StageUnit
from pipetrain.hdl.top import NetworkTop, check_supported
from pipetrain.hdl.verilog import generate_verilog
from pipetrain.sim import fixed
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
        r"stage 2: activation 'gelu' has no hardware; the HDL builds identity, relu, leaky_relu"
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
    assert SUPPORTED_ACTIVATIONS == ("identity", "relu", "leaky_relu")
