"""The built-in digits networks in Amaranth's simulator, trained on real digits samples, equal the
golden model bit for bit (results, final weights and velocities read back through ``wacc``,
counters), at the plan's cycles per sample. Slow (≈ 0.5–2 min each): ``--runslow``."""

from __future__ import annotations

import warnings

import pytest
import torch
from pipetrain.compiler.compile import compile_result
from pipetrain.compiler.config import TrainConfig
from pipetrain.data import load_data
from pipetrain.sim.golden import GoldenModel
from pipetrain.sim.tb.pysim import simulate_top

# a weight bank's read that meets a write to its address reads garbage (conftest)
pytestmark = pytest.mark.usefixtures("poisoned_collisions")


def _run(name: str, schedule: str, n: int):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = compile_result(name, TrainConfig(seed=1, schedule=schedule), formats="default")
    plan = res.plan
    g = GoldenModel(plan, res.model)
    ds = load_data("digits")
    x = g.quantise_input(torch.as_tensor(ds.x_train[:n], dtype=torch.float32))
    y = [int(v) for v in ds.y_train[:n]]
    init = g.memories()
    for i in range(n):
        g.submit(x[i], y[i], True)
    g.flush()
    run = simulate_top(plan, x, y, init={k: {"w": v["w"]} for k, v in init.items()})
    return plan, g, run


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,schedule,n",
    [
        ("mlp-digits", "pb", 50),
        ("mlp-digits-deep", "pb", 50),
        ("mlp-digits", "sequential", 12),
    ],
)
def test_digits_networks_equal_golden(name, schedule, n):
    plan, g, run = _run(name, schedule, n)
    assert run.echo_errors == []
    assert run.results == [(r.sample, r.pred, r.loss_raw, int(r.train)) for r in g.results]
    for st in plan.stages:
        for kind in ("w", "u"):
            assert torch.equal(run.memories[st.name][kind], g.memories()[st.name][kind])
    assert run.counters == {
        "samples_trained": n,
        "ticks": g.ticks,
        "saturations": g.stage_saturations,
    }
    rc = run.result_cycles
    steady = [b - a for a, b in zip(rc[1 : n - 2 * len(plan.stages)], rc[2:], strict=False)]
    assert set(steady) == {plan.ideal_cycles_per_sample}
