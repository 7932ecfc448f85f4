"""Tests of benchmarks/run.py's pieces: memory sweep, utilisation, fit records, output.

The timed measurements themselves are not tested (they depend on the machine); the result
structure, the analytic memory identity and the board-fit record are.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import board_cache  # noqa: E402
import link_soak  # noqa: E402
import measure  # noqa: E402
import memory_scaling  # noqa: E402
import run as bench  # noqa: E402


def test_memory_sweep_is_the_analytic_quadratic() -> None:
    rows = memory_scaling.sweep([2, 3, 4, 8])
    for r in rows:
        S = r["depth"]
        # default x format is 16 bit; stage 1 reads 64 inputs, stages 2..S read 32;
        # D_s + 1 = 2(S − s) + 2, so Σ = 16·(64·2S + 32·S(S − 1)) (docs/architecture.md §2.1)
        assert r["analytic_stash_bits"] == 16 * (64 * 2 * S + 32 * S * (S - 1))
        assert r["stash_x_bits"] == r["analytic_stash_bits"]
        # as built: one more entry per stage, being written while the pass runs
        assert r["stash_x_built_bits"] == r["stash_x_bits"] + 16 * (64 + 32 * (S - 1))
        assert r["stash_bits"] > r["stash_x_bits"]  # + the activation-derivative mask
        assert r["sequential_stash_bits"] < r["stash_bits"]
        assert [s["delay"] for s in r["stages"]] == [2 * (S - s) + 1 for s in range(1, S + 1)]
    # weights grow linearly: equal steps of one 32→32 layer (33·32 words of 24 bits)
    w = {r["depth"]: r["weight_bits"] for r in rows}
    assert w[3] - w[2] == w[4] - w[3] == 33 * 32 * 24


def test_stage_utilisation_of_mlp_digits() -> None:
    from pipetrain.compiler.build import FormatSpec, build_plan
    from pipetrain.compiler.config import TrainConfig
    from pipetrain.compiler.frontend import trace
    from pipetrain.compiler.models import build_mlp

    plan = build_plan(
        trace(build_mlp([64, 32, 10]), "m"), TrainConfig(), FormatSpec.default(2), (4, 1)
    )
    u = measure.stage_utilisation(plan)
    tick = plan.tick_cycles
    assert [s["lanes"] for s in u] == [4, 1]
    assert u[0]["lane_slot_util"] == 1.0 and u[1]["lane_slot_util"] == 1.0
    assert u[0]["cycles_per_tick"] == 8 * 65 and u[1]["cycles_per_tick"] == 10 * 33
    assert u[0]["mac_util"] == pytest.approx(32 * 65 / (4 * tick))
    assert all(s["tick_share"] <= 1.0 for s in u)  # no pass outlasts the tick


def test_board_result_records_a_plan_that_does_not_fit(tmp_path: Path) -> None:
    rec = board_cache.board_result(
        "mlp-digits-deep", "icebreaker", cache_dir=tmp_path, build=False, echo=lambda m: None
    )
    assert rec["status"] == "no_fit_plan" and rec["fits"] is False
    assert rec["lanes"] == [1, 1, 1, 1]
    over = {k for k, v in rec["fit"].items() if v["needed"] > v["available"]}
    assert "multipliers" in over and rec["fit"]["multipliers"]["available"] == 8
    assert "does not fit icebreaker" in rec["reason"]


def _fake_results() -> dict:
    board = {
        "status": "built",
        "fits": True,
        "lanes": [4, 1],
        "fmax_mhz": 50.0,
        "clock_mhz": 25.0,
        "utilization": {"luts": {"used": 10, "available": 100}},
        "link_bound_samples_per_s": 763.0,
        "projected_samples_per_s": 50e6 / 527,
        "board_clock_samples_per_s": 25e6 / 527,
        "vs_cpu_torch": 50e6 / 527 / 1000,
        "build_s": 400.0,
    }
    nofit = {
        "status": "no_fit_plan",
        "fits": False,
        "lanes": [1, 1],
        "fit": {"multipliers": {"needed": 16, "available": 8}},
        "link_bound_samples_per_s": 763.0,
    }
    rtl = {"cycles_per_sample": 527.0, "ideal_cycles_per_sample": 527, "samples": 8}
    util = {
        "stage": 1,
        "shape": "64→32",
        "lanes": 4,
        "delay": 3,
        "lane_slot_util": 1.0,
        "cycles_per_tick": 520,
        "pass_cycles": 525,
        "tick_cycles": 527,
        "tick_share": 525 / 527,
        "mac_util": 0.99,
        "stash_bits": 1,
        "weight_bits": 2,
        "velocity_bits": 2,
        "memory_bits": 5,
    }
    cpu = {"samples_per_s": 1000.0, "samples_per_cpu_s": 1100.0, "threads": 2}
    model = {
        "name": "mlp-digits",
        "cycles_per_sample": 527.0,
        "ideal_cycles_per_sample": 527,
        "pb_vs_sequential_speedup": 3.38,
        "stages": 2,
        "projected_samples_per_s": {"ulx3s-85f": 50e6 / 527, "icebreaker": None},
        "cpu_torch_samples_per_s": 1000.0,
        "shape": [64, 32, 10],
        "lanes": [4, 1],
        "rtl": {"pb": rtl, "sequential": rtl | {"cycles_per_sample": 1779.0}},
        "mac_util": 0.9,
        "bit_exact": True,
        "stage_utilisation": [util],
        "memory": {"stash_bits": 1, "weight_bits": 2, "velocity_bits": 2, "memory_bits": 5},
        "boards": {"ulx3s-85f": board, "icebreaker": nofit},
        "cpu_torch": {"one_thread": cpu, "default_threads": cpu},
    }
    tools = {
        "verilog_s": 8.0,
        "verilator_build_s": 13.0,
        "measured_now": False,
        "rtl_sim_cycles_per_s": 3e4,
        "rtl_train_cycles_per_s": 6e4,
        "rtl_samples_per_s": 120.0,
        "golden_samples_per_s": 700.0,
        "reference_samples_per_s": 5000.0,
    }
    meta = {
        "date": "2026-01-01 00:00:00",
        "mode": "quick",
        "machine": {"cpu": "X", "cores": 2, "python": "3.11", "torch": "2"},
        "run_s": 60.0,
        "loadavg_start": (1.0, 1.0, 1.0),
        "loadavg_end": (1.0, 1.0, 1.0),
        "phases_s": {"rtl_sim": 10.0},
        "cold_extra_s": {"verilator_builds": 100.0, "board_builds": 400.0},
    }
    return {
        "meta": meta,
        "models": [model],
        "tools": {"mlp-digits": tools},
        "memory_scaling": memory_scaling.sweep([2, 3]),
    }


def test_markdown_and_readme_section(tmp_path: Path) -> None:
    res = _fake_results()
    md = bench.render_markdown(res)
    assert "| mlp-digits |" in md.replace("  ", " ")
    assert "50.0 MHz" in md and "94,877" in md  # 50 MHz / 527 cycles
    assert "does not fit (plan: multipliers 16/8 needed/available)" in md
    json.dumps(res, default=str)  # JSON-ready
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\nset-up lines\n")
    bench.update_readme(res, readme)
    bench.update_readme(res, readme)  # replaces the block, does not append twice
    text = readme.read_text()
    assert text.startswith("# x\n\nset-up lines\n")
    assert text.count("## Benchmarks") == 1 and text.count(bench.README_START) == 1
    bench.write_outputs(res, tmp_path / "out")
    assert (tmp_path / "out" / "throughput.png").stat().st_size > 1000
    assert json.loads((tmp_path / "out" / "results.json").read_text())["models"][0]["stages"] == 2


def test_board_result_reuses_a_report_of_the_same_hardware(tmp_path: Path) -> None:
    from pipetrain.compiler.targets import get_board
    from pipetrain.host.flow import compile_design

    board = get_board("ulx3s-85f")
    plan = compile_design("mlp-digits", board=board).plan
    old = {
        "model": "mlp-digits",
        "board": board.name,
        "plan_hash": "0" * 16,  # an earlier plan hash of the same hardware
        "lanes": [s.lanes for s in plan.stages],
        "fit": board_cache.fit_rows(plan, board),
        "status": "built",
        "fits": True,
        "fmax_mhz": 50.0,
        "clock_mhz": 25.0,
        "hdl_hash": "old",
    }
    (tmp_path / "boards").mkdir()
    (tmp_path / "boards" / f"{'0' * 16}-{board.name}.json").write_text(json.dumps(old))
    rec = board_cache.board_result("mlp-digits", board.name, cache_dir=tmp_path, build=False)
    assert rec["fmax_mhz"] == 50.0 and rec["stale"] and rec["plan_changed"] == plan.hash
    # other lanes (other hardware) are not reused
    (tmp_path / "boards" / f"{'0' * 16}-{board.name}.json").write_text(
        json.dumps(old | {"lanes": [1, 1]})
    )
    rec = board_cache.board_result("mlp-digits", board.name, cache_dir=tmp_path, build=False)
    assert rec["status"] == "missing"


@pytest.mark.parametrize("rate", link_soak.RATES)
def test_link_soak_loses_and_doubles_nothing(rate) -> None:
    """A tiny run of benchmarks/link_soak.py through the device model at each error rate:
    lost = 0, applied twice = 0, weights read back, counters agree; faults were injected
    (every rate but 0) and cost retransmissions."""
    row = link_soak.soak_model(600, rate, seed=1)
    assert row["frames"] >= 600 and row["samples_sent"] > 0
    assert row["lost"] == 0 and row["applied_twice"] == 0
    assert row["weights_ok"] and row["counters_ok"]
    assert row["trained"] <= row["samples_sent"]
    if rate >= 0.01:
        assert row["faults"] > 0 and row["retransmits"] > 0
    if rate == 0:
        assert row["faults"] == row["retransmits"] == 0
