"""The golden model's convolution stages (docs/numerics.md §9): bit-exact with the scalar oracle
(loops, independent of the tensor code) over every geometry and training option, the pooling
rules on hand-computed values, the float reference within quantisation, and the plan's geometry.
"""

from __future__ import annotations

import pytest
import torch
from pipetrain.compiler.build import build_plan
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.frontend import trace
from pipetrain.compiler.plan import Plan
from pipetrain.sim.golden import GoldenModel
from pipetrain.sim.golden_scalar import run_scalar
from pipetrain.sim.reference import ReferenceTrainer
from torch import nn


def _net(
    kind: str, pool: str, stride: int, padding: int, bias: bool, act: str, window: int = 2
) -> nn.Module:
    """Conv (2 → 3 channels) → act → pool → Conv (3 → 2) → Flatten → Linear(→ 3), seeded."""
    torch.manual_seed(3)
    conv = nn.Conv1d if kind == "conv1d" else nn.Conv2d
    pools = {
        "max": nn.MaxPool1d(window) if kind == "conv1d" else nn.MaxPool2d(window),
        "avg": nn.AvgPool1d(window) if kind == "conv1d" else nn.AvgPool2d(window),
        "none": nn.Identity(),
    }
    acts = {"relu": nn.ReLU(), "leaky_relu": nn.LeakyReLU(0.125), "identity": nn.Identity()}
    size = (9,) if kind == "conv1d" else (5, 6)
    first = conv(2, 3, 3, stride=stride, padding=padding, bias=bias)
    m = nn.Sequential(first, acts[act], pools[pool], conv(3, 2, 2, padding=1), nn.ReLU())
    with torch.no_grad():  # the output size, to size the Linear
        out = m(torch.zeros(1, 2, *size)).numel()
    m.append(nn.Flatten())
    m.append(nn.Linear(out, 3))
    m.input_shape = (2, *size)
    return m


ORACLE_CASES = [
    dict(kind="conv2d", pool="max", stride=1, padding=1, bias=True, act="relu"),
    dict(kind="conv2d", pool="avg", stride=2, padding=1, bias=False, act="leaky_relu"),
    dict(kind="conv2d", pool="none", stride=2, padding=0, bias=True, act="identity"),
    dict(kind="conv1d", pool="max", stride=2, padding=1, bias=False, act="relu"),
    dict(kind="conv1d", pool="avg", stride=1, padding=0, bias=True, act="leaky_relu"),
    # a window of 3: the mean's scale round(2^16/3) (not a shift), the last position dropped
    dict(kind="conv1d", pool="avg", stride=1, padding=0, bias=True, act="relu", window=3),
    dict(kind="conv2d", pool="max", stride=1, padding=1, bias=True, act="leaky_relu", window=3),
]
TRAIN_CASES = [
    dict(),
    dict(mitigation="sc+lwp", rounding="nearest_even"),
    dict(mitigation="lwp", lwp_form="w", lr=0.2),
    dict(schedule="sequential", mitigation="sc", loss="mse"),
]


def _plan(model: nn.Module, **cfg) -> tuple[Plan, TrainConfig]:
    config = TrainConfig(**{"lr": 0.05, **cfg})
    return build_plan(trace(model, "conv"), config, lanes=(2, 1, 2)), config


@pytest.mark.parametrize("k", range(len(ORACLE_CASES)))
def test_conv_golden_equals_scalar_oracle(k):
    """Every geometry with one training option each (cycled), inference samples mixed in:
    weights, velocities, result records, saturation counters and ticks bit for bit."""
    model = _net(**ORACLE_CASES[k])
    plan, cfg = _plan(model, **TRAIN_CASES[k % len(TRAIN_CASES)])
    g = GoldenModel(plan, model, cfg)
    gen = torch.Generator().manual_seed(k)
    n = 7
    x = torch.rand(n, plan.in_features, generator=gen) * 2 - 0.5
    y = torch.randint(0, 3, (n,), generator=gen)
    train = [True, True, False, True, True, True, False]
    xq = g.quantise_input(x)
    w0 = [e.w.tolist() for e in g.stages]
    for i in range(n):
        g.submit(xq[i], int(y[i]), train[i])
    g.flush()
    ref = run_scalar(plan, w0, [(xq[i].tolist(), int(y[i]), train[i]) for i in range(n)])
    assert [e.w.tolist() for e in g.stages] == ref.w
    assert [e.u.tolist() for e in g.stages] == ref.u
    assert [tuple(r) for r in g.results] == ref.results
    assert g.stage_saturations == ref.saturations
    assert (g.ticks, g.samples_applied) == (ref.ticks, ref.samples_applied)
    assert [e.w.tolist() for e in g.stages] != w0  # it trained


def _one_stage(pool: str, values: list[float]) -> GoldenModel:
    """Conv1d(1, 1, 1) with weight 1, no bias, then ``pool`` over 2, then Linear(2, 2)."""
    p = nn.MaxPool1d(2) if pool == "max" else nn.AvgPool1d(2)
    m = nn.Sequential(nn.Conv1d(1, 1, 1, bias=False), p, nn.Flatten(), nn.Linear(2, 2))
    with torch.no_grad():
        m[0].weight.fill_(1.0)
    m.input_shape = (1, len(values))
    plan = build_plan(trace(m, "p"), TrainConfig())
    return GoldenModel(plan, m)


def test_pooling_rules_on_hand_values():
    """MaxPool keeps the first largest value of a window and its index (ties → the first);
    AvgPool is rhu(Σ·scale, shift) — for a window of 2: (a + b + 1) >> 1; positions after the
    last whole window are dropped (PyTorch's ceil_mode=False)."""
    g = _one_stage("max", [0.25, 0.5, 0.75, 0.75, 1.0])
    xb = g._with_bias(g.quantise_input(torch.tensor([[0.25, 0.5, 0.75, 0.75, 1.0]])), g.stages[0])
    z, a, (mask, arg) = g.stages[0].forward(xb, False)
    f = g.stages[0].fx.frac
    assert a.tolist() == [[0.5 * 2**f, 0.75 * 2**f]]
    assert arg.tolist() == [[[1, 0]]]  # the tie 0.75, 0.75 keeps the first
    assert z.shape == (1, 5)
    g = _one_stage("avg", [0.0, 1.0, -1.0, 2.0])
    lsb = 2.0 ** -g.stages[0].fx.frac
    x = torch.tensor([[3 * lsb, 0.0, -3 * lsb, 0.0]])  # sums 3 and −3 LSBs
    xb = g._with_bias(g.quantise_input(x), g.stages[0])
    _, a, _ = g.stages[0].forward(xb, False)
    assert a.tolist() == [[2, -1]]  # rhu(3/2) = 2, rhu(−3/2) = −1 (half up)


def test_conv_golden_agrees_with_the_float_reference():
    """Sequential schedule, nearest-even rounding, 20 samples: the golden model's weights stay
    within 5 % of the float reference's weight change (quantisation only; derived bound: the
    formats' LSBs are ~1e-4 of the changes here, and 20 updates accumulate them)."""
    model = _net(**ORACLE_CASES[1])
    plan, cfg = _plan(model, schedule="sequential", rounding="nearest_even")
    gen = torch.Generator().manual_seed(5)
    x = torch.rand(20, plan.in_features, generator=gen)
    y = torch.randint(0, 3, (20,), generator=gen)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    g = GoldenModel(plan, model, cfg)
    g.train(x, y)
    r = ReferenceTrainer(model, cfg, plan)
    r.train(x, y)
    sg, sr = g.state_dict(), r.state_dict()
    assert sg.keys() == sr.keys() == start.keys()
    for key in sg:
        change = float((sr[key] - start[key]).abs().max())
        assert change > 1e-3, key
        assert float((sg[key] - sr[key]).abs().max()) < 0.05 * change, key
    model.load_state_dict(sg)  # loads into the user's module (conv weights reshaped)
