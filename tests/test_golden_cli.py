"""``pipetrain train``: targets, JSON report, user errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from pipetrain.host.cli import cli
from pipetrain.host.device import LOCAL_TARGETS


@pytest.fixture(scope="module")
def npz(tmp_path_factory):
    """A small separable 64-feature, 3-class problem (class = which third of x is bright)."""
    rng = np.random.default_rng(0)

    def make(n):
        y = rng.integers(0, 3, n)
        x = rng.uniform(0, 0.2, (n, 64))
        for i, c in enumerate(y):
            x[i, c * 21 : (c + 1) * 21] += 0.6
        return x.astype(np.float32), y.astype(np.int64)

    path = tmp_path_factory.mktemp("data") / "thirds.npz"
    x_tr, y_tr = make(150)
    x_te, y_te = make(60)
    np.savez(path, x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te)
    return str(path)


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.mark.parametrize("target", ["golden", "reference"])
def test_train_reports_accuracy_json(npz, target):
    res = run(
        "train", "mlp-digits", "--target", target, "--data", npz, "--formats", "default",
        "--epochs", "2", "--lr", "0.01", "--json", "-",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout[res.stdout.index("{") :])
    assert report["target"] == target and report["samples"] == 300 and report["epochs"] == 2
    assert report["test_accuracy"] >= 0.9  # an easy problem: well above chance (1/3)
    assert report["samples_per_s"] > 0 and report["saturations"] >= 0
    assert report["formats_source"] == "default"
    if target == "golden":
        assert len(report["stage_saturations"]) == 3  # two stages + the loss unit


def test_unknown_target_is_a_user_error(npz):
    res = CliRunner().invoke(cli, ["train", "mlp-digits", "--target", "fpga", "--data", npz])
    assert res.exit_code == 2
    assert "unknown target 'fpga'" in res.output and "golden" in res.output
    assert {"golden", "reference"} <= set(LOCAL_TARGETS)
