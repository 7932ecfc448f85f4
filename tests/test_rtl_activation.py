"""tanh and sigmoid hidden stages in Verilator, bit-exact with the golden model (rung 4).

A small digits net, 64 → 8 (Tanh, 4 lanes) → 6 (Sigmoid) → 10, compiled as ``pipetrain sim``
compiles it (formats calibrated on digits): the activation ROM, the stashed y and the derivative
run in the generated Verilog against docs/numerics.md §3.4 / §5.1 — results, weights,
velocities, counters — with inference samples mixed in and under random backpressure. One
Verilator build (≈ 30–90 s on a clean cache, then cached).
"""

from __future__ import annotations

import pytest
from pipetrain.host.flow import compile_design
from pipetrain.sim.stimulus import plan_samples
from pipetrain.sim.tb.network import build_network, check_network

MODEL = """
from torch import nn

model = nn.Sequential(
    nn.Linear(64, 8), nn.Tanh(), nn.Linear(8, 6), nn.Sigmoid(), nn.Linear(6, 10)
)
config = {"lr": 0.05, "momentum": 0.9}
"""


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tanh_sigmoid.py"
    path.write_text(MODEL)
    result = compile_design(str(path), seed=0, data="digits", writers=())
    return result.plan, result.model, build_network(result.plan)


def test_tanh_sigmoid_net_bit_exact_in_verilator(net):
    plan, model, design = net
    assert [str(s.activation) for s in plan.stages] == ["tanh", "sigmoid", "identity"]
    assert all(s.activation_lut is not None for s in plan.stages[:2])
    n = 30
    x, y = plan_samples(plan, n, "digits", 0)
    train = [k % 7 != 3 for k in range(n)]  # samples 3, 10, 17, 24 are inference-only
    rep = check_network(plan, model, x, y.tolist(), train, design=design)
    assert rep.bit_exact, [m.describe() for m in rep.mismatches[:5]]
    assert rep.extra["samples_trained"] == sum(train)
    # the LUT read fits the forward pipeline: the tick is the plan's
    assert rep.cycles_per_sample <= 1.10 * plan.ideal_cycles_per_sample


def test_tanh_sigmoid_net_bit_exact_under_random_backpressure(net):
    plan, model, design = net
    x, y = plan_samples(plan, 12, "digits", 1)
    rep = check_network(
        plan, model, x, y.tolist(), design=design, valid_prob=0.6, ready_prob=0.4, seed=5
    )
    assert rep.bit_exact, [m.describe() for m in rep.mismatches[:5]]
    assert rep.extra["handshakes"]["result_out_refused"] > 0
