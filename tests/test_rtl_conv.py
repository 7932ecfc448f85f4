"""Convolution stages in the RTL (Verilator) against the golden model, bit for bit
(docs/numerics.md §9, hdl/conv_stage.py).

A small Conv1d net (2×10 → Conv1d(2→4, k3, stride 2, padding 1) → LeakyReLU → MaxPool1d(2) →
Conv1d(4→3, k2, padding 1) → ReLU → Linear(→ 4): stride 2, padding, pooling, a conv stage after
a conv stage and a Linear after it) is built once and checked with inference samples mixed in
and under random backpressure, at the plan's cycles per sample. With ``--runslow`` the built-in
``cnn-digits`` (Conv2d, MaxPool) and ``cnn1d-digits`` (Conv1d, stride 2, LeakyReLU, AvgPool)
through ``pipetrain sim``, both schedules, SC + LWP.
"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from conv_nets import cnn
from pipetrain.compiler.config import TrainConfig
from pipetrain.host.cli import cli
from pipetrain.host.flow import compile_design
from pipetrain.sim.tb.network import build_network, check_network


@pytest.fixture(scope="module")
def small():
    model = cnn("conv1d", "max", 2, 1, True)
    cfg = TrainConfig(seed=0, lr=0.05, mitigation="sc+lwp")
    plan = compile_design(model, cfg, formats="static", writers=(), lanes=(2, 3, 2)).plan
    return plan, model, build_network(plan)


def _samples(plan, n, seed):
    """n quantised inputs in the middle half of stage 1's x format, labels."""
    f = plan.stages[0].formats.x
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(f.min_int // 2, f.max_int // 2, (n, plan.in_features), generator=gen)
    y = torch.randint(0, plan.stages[-1].out_features, (n,), generator=gen)
    return x, y.tolist()


def test_small_conv_net_bit_exact_at_the_plan_cycles(small):
    plan, model, design = small
    assert [s.kind for s in plan.stages] == ["conv1d", "conv1d", "linear"]
    n = 14
    x, y = _samples(plan, n, 0)
    train = [k % 5 != 2 for k in range(n)]  # samples 2, 7, 12 are inference-only
    rep = check_network(plan, model, x, y, train, design=design)
    assert rep.bit_exact, [m.describe() for m in rep.mismatches[:5]]
    assert rep.extra["samples_trained"] == sum(train)
    # free-running streams: the tick is the plan's (the slowest pass + tick control)
    assert rep.cycles_per_sample <= 1.05 * plan.ideal_cycles_per_sample


def test_small_conv_net_bit_exact_under_random_backpressure(small):
    plan, model, design = small
    x, y = _samples(plan, 8, 1)
    rep = check_network(plan, model, x, y, design=design, valid_prob=0.6, ready_prob=0.4, seed=3)
    assert rep.bit_exact, [m.describe() for m in rep.mismatches[:5]]
    assert rep.extra["handshakes"]["result_out_refused"] > 0


@pytest.mark.slow
def test_a_convolution_feeding_the_loss_unit_bit_exact():
    """No Linear layer: the conv stage's pooled outputs (one lane: channel-major words) are the
    logits."""
    from torch import nn

    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv1d(1, 3, 3), nn.ReLU(), nn.MaxPool1d(2), nn.Flatten())
    model.input_shape = (1, 10)
    cfg = TrainConfig(seed=0, lr=0.05)
    plan = compile_design(model, cfg, formats="static", writers=(), lanes=(1,)).plan
    x, y = _samples(plan, 10, 4)
    rep = check_network(plan, model, x, y)
    assert rep.bit_exact, [m.describe() for m in rep.mismatches[:5]]


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ["cnn-digits", "--samples", "50"],
        ["cnn1d-digits", "--samples", "50"],
        ["cnn-digits", "--schedule", "sequential", "--mitigation", "sc", "--samples", "12"],
        ["cnn1d-digits", "--mitigation", "sc+lwp", "--backpressure", "0.5", "--samples", "20"],
    ],
    ids=lambda a: "-".join(a[:3]),
)
def test_builtin_cnns_bit_exact_through_pipetrain_sim(args, tmp_path):
    out = tmp_path / "sim.json"
    res = CliRunner().invoke(cli, ["sim", *args, "--json", str(out)])
    assert res.exit_code == 0, res.output
    rep = json.loads(out.read_text())
    assert rep["bit_exact"] is True
    # issue 16: cycles per sample within 5 % of the plan's ideal
    assert abs(rep["cycles_per_sample"] / rep["ideal_cycles_per_sample"] - 1) <= 0.05
