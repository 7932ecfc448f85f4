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
import operands_check  # noqa: E402
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
        "vs_best_cpu": 50e6 / 527 / 2e6,
        "build_s": 400.0,
        "rtl_cycles_per_sample": 527.0,
        "dsp_blocks": 156,
        "multiplies_per_sample": 5150,
        "ceiling_samples_per_s": 156 * 50e6 / 5150,
        "fraction_of_ceiling": (50e6 / 527) / (156 * 50e6 / 5150),
        "board_clock_mhz": 25.0,
        "board_samples_per_s": None,
        "board_samples_note": bench.BOARD_SAMPLES_NA,
        "golden": {"test_accuracy": 0.95, "epochs": 4},
    }
    nofit = {
        "status": "no_fit_plan",
        "fits": False,
        "lanes": [1, 1],
        "fit": {"multipliers": {"needed": 16, "available": 8}},
        "link_bound_samples_per_s": 763.0,
        "dsp_blocks": 8,
        "multiplies_per_sample": 5150,
        "board_clock_mhz": 12.0,
        "board_samples_per_s": None,
        "board_samples_note": bench.BOARD_SAMPLES_NA,
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

    def peer(rate: float, acc: float, **extra: object) -> dict:
        return {
            "samples_per_s": rate,
            "median_samples_per_s": rate * 0.9,
            "samples_per_cpu_s": rate * 1.1,
            "test_accuracy": acc,
            "train_accuracy": acc + 0.02,
            "lr": 0.002,
            "momentum": 0.9,
            "epochs": 4,
            "reps": 3,
            "threads": 1,
            "loadavg": [[5.0, 4.0, 3.0], [5.5, 4.0, 3.0]],
        } | extra

    search = {
        "runs": [
            {"lr_scale": 1.0, "lr": 2.56, "train_accuracy": 0.1, "test_accuracy": 0.1},
            {"lr_scale": 0.25, "lr": 0.64, "train_accuracy": 0.87, "test_accuracy": 0.856},
        ]
    }
    search["best"] = search["runs"][1]
    cpu = {
        "torch_b1": peer(1000.0, 0.956, by_threads={"1": peer(1000.0, 0.956)}),
        "torch_b32": peer(30000.0, 0.942, lr_search=search | {"best": search["runs"][0]}),
        "torch_b128": peer(90000.0, 0.1, lr_search=search),
        "compiled_b1": peer(2e6, 0.956, status="ok"),
    }
    model = {
        "name": "mlp-digits",
        "cycles_per_sample": 527.0,
        "ideal_cycles_per_sample": 527,
        "pb_vs_sequential_speedup": 3.38,
        "stages": 2,
        "projected_samples_per_s": {"ulx3s-85f": 50e6 / 527, "icebreaker": None},
        "cpu": cpu,
        "best_cpu_peer": "compiled_b1",
        "best_cpu_samples_per_s": 2e6,
        "shape": [64, 32, 10],
        "lanes": [4, 1],
        "rtl": {"pb": rtl, "sequential": rtl | {"cycles_per_sample": 1779.0}},
        "mac_util": 0.9,
        "bit_exact": True,
        "stage_utilisation": [util],
        "memory": {"stash_bits": 1, "weight_bits": 2, "velocity_bits": 2, "memory_bits": 5},
        "boards": {"ulx3s-85f": board, "icebreaker": nofit},
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
        "cpu_peers": {"nice": {"requested": -5, "niceness": -5}, "epochs": 4},
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

    board = get_board("ulx3s-85f")
    # the plan of `pipetrain build mlp-digits --board ulx3s-85f` (formats calibrated as it does)
    plan = measure.compile_board_design("mlp-digits", board).plan
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


# ------------------------------------------------------------- issue 17 item 8: ceiling, peers


def test_ceiling_of_mlp_digits_counts_5150_multiplies_from_its_plan() -> None:
    from pipetrain.compiler.build import FormatSpec, build_plan
    from pipetrain.compiler.config import TrainConfig
    from pipetrain.compiler.frontend import trace
    from pipetrain.compiler.models import build_mlp
    from pipetrain.compiler.targets import get_board

    plan = build_plan(
        trace(build_mlp([64, 32, 10]), "m"), TrainConfig(), FormatSpec.default(2), (4, 1)
    )
    # forward + weight gradient of 65·32 and 33·10 weights, input gradient of stage 2's 33·10
    assert measure.multiplies_per_sample(plan) == 2 * 2080 + 3 * 330 == 5150
    deep = build_plan(
        trace(build_mlp([64, 32, 32, 32, 10]), "d"), TrainConfig(), FormatSpec.default(4), None
    )
    assert measure.multiplies_per_sample(deep) == 2 * 2080 + 3 * (33 * 32 * 2 + 33 * 10)
    ecp5, up5k = get_board("ulx3s-85f"), get_board("icebreaker")
    assert (ecp5.multipliers, up5k.multipliers) == (156, 8)
    # issue 17: 156 × 56.1 MHz ÷ 5,150 ≈ 1.70 M samples/s
    ceiling = measure.ceiling_samples_per_s(plan, ecp5.multipliers, 56.1)
    assert ceiling == pytest.approx(156 * 56.1e6 / 5150) and 1.69e6 < ceiling < 1.71e6


def test_batch_hyperparams_invert_the_projects_scaling_rule() -> None:
    import cpu_peers
    from pipetrain.compiler.schedule import batch1_scaling

    for b in (1, 32, 128):
        lr, m = cpu_peers.batch_hyperparams(0.002, 0.9, b)
        assert batch1_scaling(lr, m, b) == pytest.approx((0.002, 0.9))
        assert lr / (1 - m) == pytest.approx(b * 0.002 / (1 - 0.9))  # per-sample step kept
    assert cpu_peers.batch_hyperparams(0.01, 0.0, 32) == pytest.approx((0.32, 0.0))


@pytest.fixture(scope="module")
def c_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """benchmarks/sgd_b1.c compiled once for this module (a fresh cache: no stale library)."""
    import cpu_peers

    try:
        return cpu_peers.build_c_loop(tmp_path_factory.mktemp("c"))
    except cpu_peers.CCompilerMissing as exc:  # the benchmark then prints n/a; nothing to test
        pytest.skip(f"no C compiler: {exc}")


def test_c_loop_steps_equal_torch_sgd_with_momentum(c_lib: Path) -> None:
    """Three batch-1 steps of sgd_b1.c (the third revisits the first sample) against
    torch.optim.SGD(momentum=0.9, weight_decay=1e-3) on the same net: float32 tolerance."""
    import copy

    import cpu_peers
    import numpy as np
    import torch
    from pipetrain.compiler.models import load_model
    from pipetrain.data import load_digits

    lib = c_lib
    _, net, _ = load_model("mlp-digits-deep", seed=3)  # three ReLU layers: masks, input grads
    ds = load_digits()
    x, y = ds.x_train[:5].float(), ds.y_train[:5].long()
    order = [4, 1, 4]
    sizes, p0 = cpu_peers.flat_params(net)
    ref = copy.deepcopy(net)
    opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    params, vel = p0.copy(), None
    for k, i in enumerate(order):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x[i : i + 1]), y[i : i + 1]).backward()
        opt.step()
        params, vel, _ = cpu_peers.c_train(
            lib, sizes, params, x.numpy(), y.numpy(), np.array([i]), 0.05, 0.9, 1e-3, vel
        )
        _, want = cpu_peers.flat_params(ref)
        assert np.abs(want - p0).max() > 1e-3  # the step moved the weights
        np.testing.assert_allclose(params, want, rtol=1e-5, atol=1e-6, err_msg=f"step {k}")
    # one call over the whole order gives the same weights as three calls
    again, _, _ = cpu_peers.c_train(
        lib, sizes, p0.copy(), x.numpy(), y.numpy(), np.array(order), 0.05, 0.9, 1e-3
    )
    np.testing.assert_array_equal(again, params)
    with pytest.raises(ValueError, match="outside the training set"):
        cpu_peers.c_train(lib, sizes, p0.copy(), x.numpy(), y.numpy(), np.array([5]), 0.1, 0.9)


def test_c_loop_learns_digits_in_one_epoch(c_lib: Path) -> None:
    """One epoch of mlp-digits at the project's η₁ = 0.002, m₁ = 0.9: ≥ 0.85 test accuracy
    (chance is 0.10; the golden model reaches 0.84–0.91 after one epoch, host/cli/options.py,
    and float training does no worse), and within 2 pp of torch.optim.SGD on the same order
    (the same float32 arithmetic up to summation order)."""
    import copy

    import cpu_peers
    import torch
    from pipetrain.compiler.models import load_model
    from pipetrain.data import epoch_order, load_digits

    lib = c_lib
    _, net, _ = load_model("mlp-digits", seed=0)
    ds = load_digits()
    order = epoch_order(len(ds.x_train), 0, 0)
    sizes, p0 = cpu_peers.flat_params(net)
    params, _, _ = cpu_peers.c_train(
        lib, sizes, p0, ds.x_train.numpy(), ds.y_train.numpy(), order.numpy(), 0.002, 0.9
    )
    c_net = copy.deepcopy(net)
    cpu_peers.load_flat(c_net, params)
    opt = torch.optim.SGD(net.parameters(), lr=0.002, momentum=0.9)
    for i in order.tolist():
        opt.zero_grad()
        xi, yi = ds.x_train[i : i + 1], ds.y_train[i : i + 1]
        torch.nn.functional.cross_entropy(net(xi), yi).backward()
        opt.step()
    acc_c = cpu_peers._accuracy(c_net, ds.x_test, ds.y_test)
    acc_t = cpu_peers._accuracy(net, ds.x_test, ds.y_test)
    assert acc_c >= 0.85
    assert abs(acc_c - acc_t) <= 0.02


def test_compiled_peer_without_a_working_c_compiler_is_na(tmp_path: Path, monkeypatch) -> None:
    import cpu_peers

    monkeypatch.setattr(cpu_peers.shutil, "which", lambda name: None)
    rec = cpu_peers.compiled_peer("mlp-digits", 1, cache_dir=tmp_path)
    assert rec["status"] == "n/a" and "no C compiler" in rec["reason"]
    assert bench._peer_cell(rec).startswith("n/a (no C compiler")
    monkeypatch.undo()
    false = __import__("shutil").which("false")
    if false is None:
        pytest.skip("no `false` program to stand in for a failing compiler")
    with pytest.raises(cpu_peers.CCompilerMissing, match="failed"):
        cpu_peers.build_c_loop(tmp_path, compiler=false)


def test_peer_and_board_tables() -> None:
    res = _fake_results()
    boards = bench.board_table(res)
    row = next(ln for ln in boards.splitlines() if "ulx3s-85f" in ln)
    cells = [c.strip() for c in row.strip("|").split("|")]
    # ceiling 156 × 50 MHz ÷ 5,150; fraction = (50 MHz ÷ 527) ÷ ceiling
    assert cells[6] == "1,514,563" and cells[7] == "94,877" and cells[8] == "0.063"
    assert cells[11] == bench.BOARD_SAMPLES_NA and cells[12] == "0.950"
    assert "does not fit" in boards and " 12.0 |" in boards  # icebreaker: clock, no figures
    peers = bench.peer_table(res)
    assert "1,000 (0.956)" in peers and "2,000,000 (0.956)" in peers
    assert "90,000 (0.100) [η×0.25: 0.856]" in peers  # fast but did not learn: shown
    assert "30,000 (0.942) |" in peers.replace("  ", " ")  # rule's η_B picked: no bracket
    assert "compiled_b1: 21.08×" in peers  # 2 M ÷ 94,877
    v = bench.verdict(res)
    assert "`compiled_b1`, trains 2,000,000 samples/s" in v
    assert "21× the ulx3s-85f projection" in v and "1.3× its whole DSP ceiling" in v
    assert "(1,514,563: above it)" in v and "icebreaker: does not fit" in v
    # a board without a build report is "not built", not "does not fit"
    res["models"][0]["boards"]["icebreaker"] |= {"fits": None, "status": "missing"}
    assert "icebreaker: not built" in bench.verdict(res)


def test_board_table_dsp_column_is_the_designs_use_of_the_board() -> None:
    """The "DSP blocks used/available" column: the build's nextpnr utilisation (139 of the
    ULX3S's 156), else the plan's fit rows marked *(plan)* (a plan that does not fit: more
    needed than available), never the board's total alone (it printed 156 for every model)."""
    res = _fake_results()
    boards = res["models"][0]["boards"]
    boards["ulx3s-85f"]["utilization"]["multipliers"] = {"used": 139, "available": 156}
    table = bench.board_table(res)
    head = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    assert head[4] == "DSP blocks used/available" and "DSP blocks" not in head[5:]

    def cells(board: str) -> list[str]:
        row = next(ln for ln in table.splitlines() if f"| {board} " in ln)
        return [c.strip() for c in row.strip("|").split("|")]

    assert cells("ulx3s-85f")[4] == "139/156"
    assert cells("icebreaker")[4] == "16/8 (plan)"
    assert bench._dsp_cell({"fit": {"multipliers": {"needed": 133, "available": 156}}}) == (
        "133/156 (plan)"
    )
    assert bench._dsp_cell({"dsp_blocks": 156}) == "–/156"  # neither: the board's total only
    # the ceiling keeps the board's whole DSP count
    assert cells("ulx3s-85f")[6] == "1,514,563"
    assert "DSP blocks used/available: the design's" in bench.render_markdown(res)


def test_readme_benchmark_table_heads_the_dsp_column_as_used_of_available() -> None:
    """README's benchmark block (rendered by run.py) has the new heading and per-model cells."""
    readme = (BENCH.parent / "README.md").read_text()
    block = readme.split(bench.README_START, 1)[1].split(bench.README_END, 1)[0]
    assert "| DSP blocks used/available |" in block and "| DSP blocks |" not in block
    assert "| 141/156 " in block  # mlp-digits on the ULX3S, from its build (nextpnr)


def test_the_fastest_cpu_peer_must_learn() -> None:
    """torch_b128 at 90,000 samples/s with 0.10 accuracy is shown but not the CPU's best; the
    best is the fastest peer within LEARN_MARGIN of torch_b1's accuracy."""
    cpu = _fake_results()["models"][0]["cpu"]
    assert bench.best_learning_peer(cpu) == ("compiled_b1", 2e6)
    del cpu["compiled_b1"]
    assert bench.best_learning_peer(cpu) == ("torch_b32", 30000.0)  # 0.942 ≥ 0.956 − 0.05
    cpu["torch_b32"]["test_accuracy"] = 0.9
    assert bench.best_learning_peer(cpu) == ("torch_b1", 1000.0)
    res = _fake_results()
    res["models"][0]["cpu"]["compiled_b1"]["test_accuracy"] = 0.5
    m = bench.refresh_derived(res)["models"][0]
    assert m["best_cpu_peer"] == "torch_b32"
    assert m["boards"]["ulx3s-85f"]["vs_best_cpu"] == pytest.approx(50e6 / 527 / 30000)
    assert "vs_best_cpu" not in m["boards"]["icebreaker"]


def test_imported_reports_are_reused_only_as_stale(tmp_path: Path) -> None:
    """A results.json's board reports go into the cache under their own plan hash and HDL hash:
    a run that does not build reuses the same-lanes report, marked stale with the current plan
    hash (also when the memories changed since, ``fit_changed``)."""
    from pipetrain.compiler.targets import get_board

    board = get_board("ulx3s-85f")
    # the plan of `pipetrain build mlp-digits --board ulx3s-85f` (formats calibrated as it does)
    plan = measure.compile_board_design("mlp-digits", board).plan
    lanes = [s.lanes for s in plan.stages]
    old = {
        "model": "mlp-digits",
        "board": board.name,
        "plan_hash": "1" * 16,
        "lanes": lanes,
        "fit": {"multipliers": {"needed": 1, "available": 156}},  # not today's fit rows
        "status": "built",
        "fits": True,
        "fmax_mhz": 47.0,
        "clock_mhz": 25,
        "hdl_hash": "old",
        "built_at": "2026-01-01 00:00:00",
        "projected_samples_per_s": 1.0,  # a run's figure: not copied
    }
    nofit = {"model": "mlp-digits", "board": "icebreaker", "status": "no_fit_plan"}
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"models": [{"boards": {"u": old, "i": nofit}}]}))
    assert board_cache.import_records(results, tmp_path) == [f"{'1' * 16}-{board.name}"]
    assert board_cache.import_records(results, tmp_path) == []  # never overwrites
    stored = json.loads((tmp_path / "boards" / f"{'1' * 16}-{board.name}.json").read_text())
    assert "projected_samples_per_s" not in stored and stored["hdl_hash"] == "old"
    rec = board_cache.board_result(
        "mlp-digits", board.name, cache_dir=tmp_path, build=False, echo=lambda m: None
    )
    assert rec["fmax_mhz"] == 47.0 and rec["stale"] and rec["fit_changed"]
    assert rec["plan_changed"] == plan.hash
    assert "47.0 MHz (older HDL/plan, built 2026-01-01 00:00)" == bench._board_cell(rec)
    # (other lanes stay missing: test_board_result_reuses_a_report_of_the_same_hardware)


def test_a_pipetrain_build_report_goes_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pipetrain build --json`` records the HDL hash; ``import_build`` makes the report the
    cache record of its plan hash and board, current for today's HDL (the benchmark reuses it
    without building), stale without a hash (a report from before); a report no newer than the
    cached record does not replace it; a loopback report is refused."""
    import os

    from click.testing import CliRunner
    from pipetrain.host import bitstream
    from pipetrain.host.cli import cli
    from pipetrain.sim.tb.network import hdl_source_hash

    def fake_build(board, top, out, **kw):  # noqa: ANN001, ANN003
        return kw["meta"] | {
            "board": board.name, "bitstream": f"{out}/top.bin", "fmax_mhz": 28.5,
            "clock_mhz": 24.0015, "timing_met": True, "build_s": 120.0, "cached": False,
            "utilization": {"luts": {"used": 5075, "available": 5280}, "raw": {}},
        }  # fmt: skip

    monkeypatch.setattr(bitstream, "build_design", fake_build)
    report = tmp_path / "ice.json"
    res = CliRunner().invoke(
        cli, ["build", "mlp-digits", "--board", "icebreaker", "--json", str(report)]
    )
    assert res.exit_code == 0, res.output
    built = json.loads(report.read_text())
    assert built["hdl_hash"] == hdl_source_hash()
    key, stale = board_cache.import_build(report, tmp_path)
    assert key == f"{built['plan_hash']}-icebreaker" and not stale
    rec = board_cache.board_result(
        "mlp-digits", "icebreaker", cache_dir=tmp_path, build=False, echo=lambda m: None
    )
    assert (rec["status"], rec["fmax_mhz"], rec["stale"], rec["cached"]) == (
        "built",
        28.5,
        False,
        True,
    )
    # the benchmark's board plan is the user's build's (it calibrated otherwise before)
    assert "plan_changed" not in rec
    assert measure.compile_board_design("mlp-digits", "icebreaker").plan.hash == built["plan_hash"]
    assert rec["constraint_mhz"] == 24.0  # the last pass's clock, not nextpnr's 24.0015
    assert rec["utilization"] == {"luts": {"used": 5075, "available": 5280}}  # no raw
    # an older report without the hash (before pipetrain build recorded it) does not replace it
    old = tmp_path / "old.json"
    before = {k: v for k, v in built.items() if k != "hdl_hash"}
    old.write_text(json.dumps(before | {"fmax_mhz": 1}))
    os.utime(old, (1e9, 1e9))
    assert board_cache.import_build(old, tmp_path) == (key, True)
    assert json.loads((tmp_path / "boards" / f"{key}.json").read_text())["fmax_mhz"] == 28.5
    os.utime(old, None)  # now newer: it replaces the record, which is stale
    board_cache.import_build(old, tmp_path)
    rec = board_cache.board_result(
        "mlp-digits", "icebreaker", cache_dir=tmp_path, build=False, echo=lambda m: None
    )
    assert rec["fmax_mhz"] == 1 and rec["stale"]
    loop = tmp_path / "loop.json"
    loop.write_text(json.dumps({"design": "uart-loopback", "board": "icebreaker"}))
    with pytest.raises(ValueError, match="loop.json: not a model build report"):
        board_cache.import_build(loop, tmp_path)


def test_onchip_rate_record(monkeypatch):
    """board_samples_per_s comes from the board-level measurement (here a stand-in returning
    the device's cycle count of a RUN) and its ratio to clock ÷ RTL cycles per sample; a set
    that does not fit leaves it n/a with the fit error."""
    from pipetrain.compiler.fit import FitError

    def fake(name, board, samples):
        assert (name, board, samples) == ("mlp-digits", "ulx3s-85f", 64)
        return {"board_samples_per_s": 50e6 / 140.0, "clock_hz": 50e6, "cycles_per_sample": 140}

    monkeypatch.setattr(measure, "onchip_board_rate", fake)
    st, timer = bench.Settings(quick=True), bench._Timer()
    rec = {"rtl_cycles_per_sample": 137.0, "board_samples_note": bench.BOARD_SAMPLES_NA}
    bench._onchip_rate(rec, "mlp-digits", "ulx3s-85f", st, timer)
    assert rec["board_samples_per_s"] == 50e6 / 140 and rec["board_samples_note"] is None
    assert rec["board_samples_ratio"] == pytest.approx(137 / 140)

    def no_fit(name, board, samples):
        raise FitError("the on-chip training set of 1437 samples does not fit icebreaker")

    monkeypatch.setattr(measure, "onchip_board_rate", no_fit)
    rec = {"board_samples_per_s": None}
    bench._onchip_rate(rec, "mlp-digits", "icebreaker", st, timer)
    assert (
        rec["board_samples_per_s"] is None
        and "does not fit icebreaker" in rec["board_samples_note"]
    )


@pytest.mark.parametrize("mitigation", ["none", "sc+lwp"])
def test_operands_check_exact_twin_differs_only_in_the_multiplies(mitigation: str) -> None:
    import dataclasses

    from pipetrain.compiler.build import OPERAND_BITS
    from pipetrain.host.flow import compile_design

    r = compile_design(
        "mlp-digits-deep",
        formats="default",
        config_overrides={"seed": 1, "mitigation": mitigation},
        writers=(),
    )
    e = operands_check.exact_result(r)
    assert (r.plan.operand_bits, e.plan.operand_bits) == (OPERAND_BITS, None)
    assert e.formats == r.formats and e.config == r.config and e.model is r.model
    changed = {
        f.name
        for f in dataclasses.fields(r.plan)
        if getattr(r.plan, f.name) != getattr(e.plan, f.name)
    }
    # multipliers: the 18-bit plan forms lr·g once per stage (Stage.scaled_at_write), the exact
    # twin lr·(δ·x) in every lane
    assert changed <= {"stages", "operand_bits", "memory_bits", "multipliers"}
    for a, b in zip(r.plan.stages, e.plan.stages, strict=True):
        # the formats, lanes, delays and LFSR seeds are the 18-bit plan's: only arithmetic moves
        assert (a.formats, a.lanes, a.delay, a.lfsr_seeds) == (
            b.formats,
            b.lanes,
            b.delay,
            b.lfsr_seeds,
        )
        stage = {f.name for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)}
        assert stage <= {
            "weight_operand", "update", "products", "acc_fwd_bits", "acc_bwd_bits",
            "memories", "memory_bits", "multipliers",
        }  # fmt: skip
        upd = {
            f.name
            for f in dataclasses.fields(a.update)
            if getattr(a.update, f.name) != getattr(b.update, f.name)
        }
        assert upd <= {"lr_delta", "sc_lr_b_delta", "frac_u", "frac_v", "sum_bits"}
        # a memory may change only where an accumulator width does (the gradient accumulator),
        # and the 18-bit plan's scaled errors formed at the write add sbuf (and drop gbuf
        # where nothing reads δ itself: stage 1)
        am = [m for m in a.memories if m.name != "sbuf" and (m.name != "gbuf" or a.reads_delta)]
        bm = [m for m in b.memories if m.name != "gbuf" or a.reads_delta]
        assert [m.name for m in a.memories if m.name == "sbuf"] == ["sbuf"] * a.scaled_at_write
        for ma, mb in zip(am, bm, strict=True):
            assert ma == mb or (ma.name == mb.name == "gacc" and mb.width > ma.width)
        # the exact twin multiplies exactly; the 18-bit plan reads 18-bit weights (24-bit w:
        # every stage narrows) and, where lr is no shift-add constant, an 18-bit scaled error
        assert b.weight_operand is None and b.update.lr_delta is None
        assert a.weight_operand is not None and a.weight_operand.bits == OPERAND_BITS
        assert a.weight_operand.frac < a.formats.w.frac
        assert a.update.lr_delta is not None and a.update.lr_delta.bits == OPERAND_BITS
        assert (a.update.sc_lr_b_delta is not None) == (mitigation == "sc+lwp")
        blocks = lambda s: sum(p.blocks for p in s.products)  # noqa: E731
        assert blocks(a) < blocks(b)
        assert max(max(p.a_bits, p.b_bits) for p in a.products if p.name in ("fwd", "gin")) <= 18


def test_board_result_constraint(tmp_path, monkeypatch) -> None:
    """``clock_hz``: the build constrains the network clock (the board top's and the core's
    ``clock_hz``) and the record keeps ``constraint_mhz``; a record of another constraint is
    rebuilt only when that clock is asked for, and a call without one reuses it."""
    from pipetrain.compiler.targets import get_board
    from pipetrain.host import bitstream

    board = get_board("ulx3s-85f")
    calls = []

    def fake_build(board_, top, out, **kw):
        calls.append((top.clock_hz, str(out)))
        return {
            "fmax_mhz": 91.5,
            "clock_mhz": top.clock_hz / 1e6,
            "timing_met": True,
            "utilization": {},
            "build_s": 1.0,
        }

    monkeypatch.setattr(bitstream, "build_design", fake_build)
    quiet = {"cache_dir": tmp_path, "echo": lambda m: None}
    rec = board_cache.board_result(
        "mlp-digits", board.name, clock_hz=90e6, out_dir="build/x", **quiet
    )
    assert calls == [(90e6, "build/x")]
    assert rec["constraint_mhz"] == 90.0 and rec["fmax_mhz"] == 91.5 and not rec["cached"]
    rec = board_cache.board_result("mlp-digits", board.name, **quiet)  # any constraint serves
    assert rec["cached"] and rec["constraint_mhz"] == 90.0 and len(calls) == 1
    rec = board_cache.board_result("mlp-digits", board.name, clock_hz=50e6, **quiet)
    assert len(calls) == 2 and calls[-1][0] == 50e6 and rec["constraint_mhz"] == 50.0
