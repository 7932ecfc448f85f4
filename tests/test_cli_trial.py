"""The fresh-user trial's leftovers, each pinned to its exact new behaviour: what ``train
--json`` says about the run, ``compile --on-chip-data``, the interlocking output (head stages,
the ``d`` column, one loss naming L1 … LK), ``--distance 0``, the unknown-model list, resume
messages, the golden model's head counters in a snapshot, a CNN's input shape taken from the
data, the experiment's progress bar width, the conv refusal sentence. All on small nets and
the golden / reference targets (no RTL)."""

from __future__ import annotations

from test_train_cli import npz40, report_of, run

__all__ = ["npz40"]  # a fixture (80 train / 40 test samples of 40 features, 4 classes)


#: A local-learning run of the data-sized mlp (40 → 8 → 4, a head after stage 1): one epoch.
LOCAL = ("--hidden", "8", "--target", "golden", "--formats", "default", "--strategy", "local",
         "--blocks", "1")  # fmt: skip


def test_train_json_says_how_the_run_was_made(npz40):
    res = run(
        "train", "mlp", "--data", npz40, *LOCAL, "--lr", "0.02", "--momentum", "0.5",
        "--seed", "3", "--epochs", "1", "--mitigation", "sc", "--json", "-",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    rep = report_of(res)
    assert rep["settings"] == {
        "schedule": "pb", "lr": 0.02, "momentum": 0.5, "weight_decay": 0.0, "batch_ref": 1,
        "mitigation": "sc", "lwp_form": "v", "strategy": "local", "distance": 1,
        "rule": "only", "blocks": [1], "head_stages": 1, "loss": "cross_entropy",
        "rounding": "stochastic", "seed": 3, "epochs": 1,
    }  # fmt: skip
    # the keys that were there keep their values
    assert (rep["epochs"], rep["schedule"], rep["mitigation"]) == (1, "pb", "sc")
    assert rep["train_samples"] == 80 and len(rep["head_online_accuracy"]) == 1


def test_compile_takes_on_chip_data_as_build_does(tmp_path):
    """``compile --on-chip-data N --board B`` fits the plan with the set counted, exactly as
    ``build`` does (the same ``compile_design(onchip_samples=N)``); the option is build's own
    definition (same help); without ``--board`` it is a one-line error, nothing written."""
    from pipetrain.host.cli.build import build_cmd
    from pipetrain.host.cli.compile import compile_cmd
    from pipetrain.host.flow import compile_design

    opts = ("--board", "ulx3s-85f", "--formats", "default", "--lanes", "4,1")
    res = run("compile", "mlp-digits", *opts, "--on-chip-data", "1437", "--out",
              str(tmp_path / "a"), "--json", "-")  # fmt: skip
    assert res.exit_code == 0, res.output
    rep = report_of(res)
    kw = {"board": "ulx3s-85f", "formats": "default", "lanes": [4, 1], "writers": ()}
    assert rep["fit"] == compile_design("mlp-digits", onchip_samples=1437, **kw).fit
    assert rep["onchip_samples"] == 1437
    # the set's block RAMs: 132 with it, 24 without (ECP5 DP16KD, the link's included)
    assert rep["fit"]["bram_blocks"]["needed"] == 132
    assert compile_design("mlp-digits", **kw).fit["bram_blocks"]["needed"] == 24
    assert "with an on-chip training set of 1437 samples (needed/available)" in res.stderr
    helps = [
        next(p.help for p in cmd.params if p.name == "onchip_samples")
        for cmd in (compile_cmd, build_cmd)
    ]
    assert helps[0] == helps[1] and "its memories count in the fit" in helps[0]
    res = run("compile", "mlp-digits", "--on-chip-data", "10", "--out", str(tmp_path / "b"))
    assert res.exit_code == 2
    assert res.output.strip() == (
        "Error: --on-chip-data 10 counts an on-chip training set in a board's fit: add --board "
        "NAME (the board you build with --on-chip-data), or drop --on-chip-data"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
