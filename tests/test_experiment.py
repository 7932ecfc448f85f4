"""``pipetrain experiment``: JSON shape, values and input errors on tiny runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from click.testing import CliRunner
from pipetrain.host.cli import cli
from pipetrain.sim.experiment import format_table, make_mlp, plot_styles


def test_experiment_json_shape_and_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "e.json", tmp_path / "e.png"
    args = ["experiment", "--epochs", "1", "--depths", "2", "--seeds", "2"]
    args += ["--methods", "sgd,pb", "--lrs", "0.002,0.004", "--no-progress"]
    args += ["--json", str(out), "--plot", str(png)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert list(rows) == ["settings", "rows"]
    assert rows["settings"] == {
        "data": "digits",
        "train_samples": 1437,
        "test_samples": 360,
        "depths": [2],
        "methods": ["sgd", "pb"],
        "lrs": [0.002, 0.004],
        "seeds": 2,
        "epochs": 1,
        "width": 32,
        "init": "kaiming",
        "momentum": 0.9,
        "weight_decay": 0.0,
        "batch_ref": 1,
        "lwp_form": "v",
    }
    assert [(r["depth"], r["method"], r["lr"]) for r in rows["rows"]] == [
        (2, "sgd", 0.002),
        (2, "sgd", 0.004),
        (2, "pb", 0.002),
        (2, "pb", 0.004),
    ]
    for r in rows["rows"]:
        assert list(r) == [
            "depth",
            "method",
            "lr",
            "test_accuracy_mean",
            "test_accuracy_std",
            "seeds",
        ]
        assert r["seeds"] == 2 and isinstance(r["depth"], int)
        # one epoch of digits at batch 1 reaches ~0.88 (measured); chance is 0.1
        assert 0.7 < r["test_accuracy_mean"] <= 1.0
        assert 0.0 <= r["test_accuracy_std"] < 0.1
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "2  sgd" in result.output and "±" in result.output


def test_experiment_is_reproducible_per_seed() -> None:
    args = ["experiment", "--epochs", "1", "--depths", "1", "--seeds", "1", "--methods", "pb"]
    args += ["--no-progress", "--json", "-"]
    a = CliRunner().invoke(cli, args)
    b = CliRunner().invoke(cli, args)
    assert a.exit_code == 0
    rows_a = json.loads(a.stdout[a.stdout.index("{") :])["rows"]
    rows_b = json.loads(b.stdout[b.stdout.index("{") :])["rows"]
    assert rows_a == rows_b and rows_a[0]["test_accuracy_std"] == 0.0


def test_experiment_bad_inputs_exit_2_with_one_line() -> None:
    runner = CliRunner()
    r = runner.invoke(cli, ["experiment", "--methods", "sgd,adam", "--no-progress"])
    assert r.exit_code == 2 and "adam" in r.output and "pb+sc+lwp" in r.output
    r = runner.invoke(cli, ["experiment", "--depths", "2,x", "--no-progress"])
    assert r.exit_code == 2 and "--depths" in r.output
    r = runner.invoke(cli, ["experiment", "--data", "nope.npz", "--no-progress"])
    assert r.exit_code == 2 and "does not exist" in r.output
    assert "Traceback" not in r.output


def test_format_table_rows() -> None:
    row = {
        "depth": 4,
        "method": "pb+sc",
        "lr": 0.01,
        "test_accuracy_mean": 0.91234,
        "test_accuracy_std": 0.01,
        "seeds": 3,
    }
    lines = format_table([row]).splitlines()
    assert lines[1].split() == ["4", "pb+sc", "0.01", "0.9123", "±", "0.0100", "(3)"]


def test_kaiming_init_option() -> None:
    torch.manual_seed(0)
    model = make_mlp([64, 32, 10], "kaiming")
    first = model[0]
    w = first.weight.detach()
    assert torch.equal(first.bias, torch.zeros(32))
    bound = math.sqrt(6.0 / 64)  # He uniform for ReLU: gain √2 · √(3 / fan_in)
    assert float(w.abs().max()) <= bound
    assert float(w.abs().max()) > 0.9 * bound  # 2048 draws reach the edge
    r = CliRunner().invoke(cli, ["experiment", "--init", "xavier", "--no-progress"])
    assert r.exit_code == 2 and "xavier" in r.output


def test_plot_styles_colour_is_method_and_line_style_is_lr() -> None:
    rows = [{"method": m, "lr": lr} for m in ("sgd", "pb", "pb+sc") for lr in (0.004, 0.002)]
    styles = plot_styles(rows)
    assert styles[("sgd", 0.002)] == ("C0", "-") and styles[("sgd", 0.004)] == ("C0", "--")
    assert styles[("pb+sc", 0.002)] == ("C2", "-") and styles[("pb+sc", 0.004)] == ("C2", "--")
    assert len({c for c, _ in styles.values()}) == 3 and len({ls for _, ls in styles.values()}) == 2


def test_plot_title_says_epoch_in_the_singular(tmp_path: Path, monkeypatch) -> None:
    import pipetrain.host.cli.experiment as exp_cli

    titles: list[str] = []
    monkeypatch.setattr(exp_cli, "plot_rows", lambda rows, path, title: titles.append(title))
    args = ["experiment", "--epochs", "1", "--depths", "1", "--seeds", "1", "--methods", "pb"]
    result = CliRunner().invoke(cli, [*args, "--no-progress", "--plot", str(tmp_path / "p.png")])
    assert result.exit_code == 0, result.output
    assert titles == ["digits: test accuracy vs depth (1 epoch)"]
