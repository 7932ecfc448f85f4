"""Whole-network RTL (Verilator) against the golden model: bit-exact, backpressure, faults, CLI.

One small digits model (64 → 8 → 10, compiled exactly as ``pipetrain sim`` compiles it) is
built once (≈ 20–40 s on a clean cache) and shared by the library tests and the CLI test; the
fault-injection test builds one faulty variant. Larger checks run with ``--runslow``.
"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from pipetrain.host.cli import cli
from pipetrain.host.flow import compile_design
from pipetrain.sim.stimulus import plan_samples
from pipetrain.sim.tb.faults import inject_fault
from pipetrain.sim.tb.network import build_network, check_network

TINY_MODEL = """
from torch import nn

model = nn.Sequential(nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 10))
config = {"lr": 0.05, "momentum": 0.9}
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tiny_digits.py"
    path.write_text(TINY_MODEL)
    result = compile_design(str(path), seed=0, data="digits", writers=())
    plan, model = result.plan, result.model
    design = build_network(plan)
    return path, plan, model, design


def test_tiny_net_bit_exact_with_inference_samples(tiny):
    _, plan, model, design = tiny
    n = 30
    x, y = plan_samples(plan, n, "digits", 0)
    train = [k % 7 != 3 for k in range(n)]  # samples 3, 10, 17, 24 are inference-only
    rep = check_network(plan, model, x, y.tolist(), train, design=design)
    assert rep.bit_exact, [m.describe() for m in rep.mismatches[:5]]
    S = len(plan.stages)
    # docs/ports.md: ticks count bubbles too; the last sample enters in tick n − 1 and the
    # flush runs until its stage-1 backward slot, tick n − 1 + 2S − 1
    assert rep.extra["ticks"] == n + 2 * S - 1
    assert rep.extra["samples_trained"] == sum(train)
    # free-running stream: the next sample's beats arrive while the tick runs, so results
    # come one tick apart (plan: tick_cycles is an upper bound on the real tick)
    assert rep.cycles_per_sample <= 1.10 * plan.ideal_cycles_per_sample


def test_tiny_net_bit_exact_under_random_backpressure(tiny):
    _, plan, model, design = tiny
    x, y = plan_samples(plan, 12, "digits", 1)
    rep = check_network(
        plan, model, x, y.tolist(), design=design, valid_prob=0.6, ready_prob=0.4, seed=7
    )
    assert rep.bit_exact, [m.describe() for m in rep.mismatches[:5]]
    hs = rep.extra["handshakes"]
    # backpressure really happened on every stream the bench controls
    assert hs["result_out_refused"] > 0 and hs["wacc_rsp_refused"] > 0


def test_fault_injection_lfsr_seed_is_localised(tiny):
    _, plan, model, _ = tiny
    x, y = plan_samples(plan, 10, "digits", 2)
    faulty = inject_fault(plan, "lfsr_seed", stage=2, lane=0)
    rep = check_network(plan, model, x, y.tolist(), rtl_plan=faulty)
    assert not rep.bit_exact
    first = rep.first
    S = len(plan.stages)
    # the wrong seed changes stage 2's first stochastic rounding: sample 0's update at
    # stage 2, which numerics §7 schedules in tick 0 + 2S − 2
    assert (first.what, first.stage, first.sample, first.tick) == ("memory", 2, 0, 2 * S - 2)
    assert first.tensor in ("u", "w") and first.expected != first.actual
    assert "first 0 samples match" in rep.localisation
    # stage 1 and the forward results are untouched by a stage-2 rounding difference until
    # the wrong weights are used; every mismatch is in stage 2 or later in time
    assert all(
        m.stage != 1 or m.what != "memory" or m.tick > first.tick
        for m in rep.mismatches
        if m.tick is not None
    )


def test_cli_sim_json(tiny, tmp_path):
    path, plan, _, _ = tiny
    out = tmp_path / "sim.json"
    res = CliRunner().invoke(cli, ["sim", str(path), "--samples", "16", "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["bit_exact"] is True and data["mismatches"] == 0
    assert data["samples"] == 16
    assert data["ideal_cycles_per_sample"] == plan.ideal_cycles_per_sample
    assert 0 < data["cycles_per_sample"] <= 1.10 * plan.ideal_cycles_per_sample
    assert data["build_s"] >= 0.0  # ≈ 0 when the fixture's build is reused
    assert data["sim_cycles_per_s"] > 1000
    assert data["cycles"] > 16 * data["cycles_per_sample"]


def test_cli_sim_bad_model_is_a_user_error(tmp_path):
    res = CliRunner().invoke(cli, ["sim", str(tmp_path / "missing.py")])
    assert res.exit_code == 2
    assert "does not exist" in res.output


@pytest.mark.slow
def test_waves_vcd_records_ports(tiny, tmp_path):
    _, plan, model, _ = tiny
    x, y = plan_samples(plan, 3, "digits", 0)
    vcd = tmp_path / "run.vcd"
    rep = check_network(plan, model, x, y.tolist(), waves=vcd)
    assert rep.bit_exact
    text = vcd.read_text(errors="replace")
    assert "sample_in__valid" in text and "result_out__payload" in text


@pytest.mark.slow
@pytest.mark.parametrize(("fault", "stage"), [("lr", 1), ("lfsr_tap", 1), ("momentum", 2)])
def test_more_faults_are_caught(tiny, fault, stage):
    _, plan, model, _ = tiny
    x, y = plan_samples(plan, 8, "digits", 3)
    rep = check_network(plan, model, x, y.tolist(), rtl_plan=inject_fault(plan, fault, stage))
    assert not rep.bit_exact
    assert rep.first is not None and rep.first.tick is not None
    if fault != "lfsr_tap":
        assert rep.first.stage == stage


@pytest.mark.slow
def test_local_heads_train_bit_exact_through_the_link():
    """Local learning on the ``sim`` target (LinkEngine ↔ NetworkTop in Verilator): a head on
    stage 1 with its own loss unit; the run is bit-exact against the golden shadow, and the
    head's ``head_correct`` counter comes back through READ_COUNTERS (docs/protocol.md §2).
    Measured: ≈ 140 s to build at load ~8, then ≈ 20 s."""
    import warnings

    from pipetrain.compiler.config import TrainConfig
    from pipetrain.compiler.models import build_mlp
    from pipetrain.data import epoch_order, load_digits
    from pipetrain.host import open as open_device

    ds = load_digits()
    cfg = TrainConfig(strategy="local", blocks=(1,), lr=0.02)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # static formats without data=: a UserWarning
        dev = open_device(
            build_mlp([64, 12, 10, 10]), "sim", cfg, shadow=True, formats="default", lanes=[2, 2, 2]
        )
    with dev:
        dev.train(ds.x_train[:60], ds.y_train[:60], epochs=1)
        counters = dev.counters()
        check = dev.verify()  # head_correct included
        head = list(dev.shadow.head_results[1])  # the golden shadow's head records so far
        gold_hits = dev.shadow.head_correct
        # the main stages' state_dict round-trips through the link; the head keeps its weights
        before = dev.memories()["head1.0"]["w"]
        dev.load_state_dict(dev.state_dict())
        after = dev.memories()["head1.0"]["w"]
        dev.train(ds.x_train[60:80], ds.y_train[60:80], epochs=1)
        again = dev.verify()
    assert check.bit_exact, check.mismatches[:3]
    assert counters["samples_trained"] == 60 and len(counters["saturations"]) == 4 + 2
    labels = ds.y_train[:60][epoch_order(60, cfg.seed, 0)]
    assert counters["head_correct"] == [sum(int(r.pred == labels[r.sample]) for r in head)]
    assert counters["head_correct"] == gold_hits
    assert torch.equal(before, after) and again.bit_exact, again.mismatches[:3]


@pytest.mark.parametrize("leap", [0, 16])
def test_shift_add_momentum_trains_bit_exact(tiny, leap):
    """``--momentum-digits 3`` (docs/numerics.md §1): the plan's momentum 0.9 becomes
    0.90625 = 1 − 2^−3 + 2^−5, a shift-add constant (no multiplier for m·u), recorded in the
    plan; with ``--lfsr-leap 16`` (§6) too, each stochastic-rounding draw 16 LFSR steps. The
    RTL trains bit-exact with the golden model on both."""
    path = tiny[0]
    result = compile_design(
        str(path),
        seed=0,
        data="digits",
        writers=(),
        config_overrides={"momentum_digits": 3, "lfsr_leap": leap},
    )
    plan, model = result.plan, result.model
    assert plan.train["momentum_digits"] == 3 and "momentum_digits" not in tiny[1].train
    assert plan.lfsr_leap == (leap or 32) and plan.train.get("lfsr_leap", 0) == leap
    for st in plan.stages:
        assert st.update.momentum.quantised == 0.90625 and st.update.momentum.real == 0.9
        assert "momentum" not in [p.name for p in st.products]
    assert plan.multipliers < tiny[1].multipliers
    x, y = plan_samples(plan, 20, "digits", 2)
    rep = check_network(plan, model, x, y.tolist(), design=build_network(plan))
    assert rep.bit_exact, [m.describe() for m in rep.mismatches[:5]]
