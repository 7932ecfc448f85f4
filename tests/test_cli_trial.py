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
