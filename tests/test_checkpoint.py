"""Checkpoints and resume (docs/protocol.md §7): a run interrupted after a checkpoint and resumed
from it equals the uninterrupted run with the same flush period in every weight bit, velocity,
LFSR state, counter and result — on the golden target and on a link target (the protocol's
device model in front of the golden model, over TCP, fresh for the resume) and the RTL in
Verilator (the `sim` target, one cached build shared with tests/test_host_sim.py)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from pipetrain.data import load_npz
from pipetrain.host import DeviceError, open
from pipetrain.host.checkpoint import Checkpoint, CheckpointError, lfsr_states
from pipetrain.host.cli import cli
from pipetrain.host.flow import compile_design
from pipetrain.sim.golden import GoldenModel
from test_host_device import PLAN, X, Y, make_model, serve_device
from test_host_sim import FEATURES, HIDDEN, LR, make_npz
from torch import nn

EPOCHS, EVERY = 3, 15  # 120 samples of 40 per epoch; flushes cross the epoch boundaries


def other_model() -> nn.Module:
    """Weights a fresh device holds before the host writes its own."""
    torch.manual_seed(99)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


class Crash(Exception):
    """The host dies mid-run."""


def crash_after(obj, name: str, calls: int) -> None:
    """Make ``obj.name`` raise :class:`Crash` on its ``calls``-th call."""
    orig, seen = getattr(obj, name), [0]

    def wrapped(*args, **kwargs):
        seen[0] += 1
        if seen[0] == calls:
            raise Crash
        return orig(*args, **kwargs)

    setattr(obj, name, wrapped)


def read(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[dict, object]:
    """The golden target's run without interruption: its last checkpoint and report."""
    path = tmp_path_factory.mktemp("ck") / "a.json"
    with open(PLAN, "golden", model=make_model()) as dev:
        rep = dev.train(X, Y, epochs=EPOCHS, checkpoint=path, checkpoint_every=EVERY)
    return read(path), rep


def test_golden_resume_is_bit_exact(tmp_path, uninterrupted):
    want, rep_a = uninterrupted
    path = tmp_path / "b.json"
    with open(PLAN, "golden", model=make_model()) as dev:
        crash_after(dev.trainer, "submit", 52)  # inside the 4th segment (samples 45..59)
        with pytest.raises(Crash):
            dev.train(X, Y, epochs=EPOCHS, checkpoint=path, checkpoint_every=EVERY)
    ck = Checkpoint.load(path)
    assert ck.position == 45 and len(ck.results) == 45 and ck.counters["samples_trained"] == 45
    with open(PLAN, "golden", model=make_model()) as dev:
        rep_b = dev.train(X, Y, epochs=EPOCHS, checkpoint=path, resume=ck)
        assert dev.counters()["samples_trained"] == 120 == dev.samples_trained
    got = read(path)
    # every field: all weight and velocity words, LFSR states, counters, golden internals,
    # results; and the reports agree (accuracy over the whole run)
    assert got == want
    assert (rep_b.samples, rep_b.accuracy, rep_b.loss) == (120, rep_a.accuracy, rep_a.loss)
    assert got["lfsr"] == lfsr_states(PLAN, 120) and PLAN.rounding == "stochastic"
    # the flushes matter: without them the same stream ends elsewhere
    g = GoldenModel(PLAN, make_model())
    g.train(X, Y, epochs=EPOCHS)
    assert g.memories()["0"]["w"].tolist() != got["memories"][0]["w"]


def test_link_resume_on_a_fresh_device_is_bit_exact(tmp_path, uninterrupted):
    """The host crashes mid-run; a fresh device (reset, its own weights) resumes from the
    checkpoint: zero samples re-create the LFSR states, the weights are written, and the end
    equals the golden target's run bit for bit (the golden shadow agrees too)."""
    want, rep_a = uninterrupted
    path = tmp_path / "c.json"
    with serve_device(PLAN, GoldenModel(PLAN, other_model())) as url:
        with open(PLAN, url, model=make_model(), shadow=True) as dev:
            crash_after(dev.client, "send_samples", 5)  # 4 segments of 15 done
            with pytest.raises(Crash):
                dev.train(X, Y, epochs=EPOCHS, checkpoint=path, checkpoint_every=EVERY)
    ck = Checkpoint.load(path)
    assert ck.position == 60 and ck.lfsr_updates == 60 and ck.golden is not None
    fresh = GoldenModel(PLAN, other_model())
    with serve_device(PLAN, fresh) as url:
        with open(PLAN, url, model=make_model(), shadow=True) as dev:
            rep = dev.train(X, Y, epochs=EPOCHS, checkpoint=path, resume=ck)
            v = dev.verify()
            assert v.bit_exact, v.mismatches
            c = dev.counters()
            assert c["samples_trained"] == 120 and c["accepted"] == 60  # 60 streamed here
            assert c["ticks"] == want["counters"]["ticks"]
            assert c["saturations"] == want["counters"]["saturations"]
    # the device applied 60 zero samples (LFSRs) and the 60 samples left of the run
    assert fresh.samples_applied == 120
    got = read(path)
    for key in ("memories", "lfsr", "lfsr_updates", "counters", "results", "golden"):
        assert got[key] == want[key], key
    assert got["target"] == url and (rep.accuracy, rep.loss) == (rep_a.accuracy, rep_a.loss)


def stored(folder: Path, want: dict) -> tuple[Path, Checkpoint]:
    """The uninterrupted run's last checkpoint in ``folder/a.json``, loaded, its position set
    back to sample 45 (a run with 75 samples left)."""
    path = folder / "a.json"
    path.write_text(json.dumps(want))
    ck = Checkpoint.load(path)
    ck.position = 45
    return path, ck


def test_resume_refusals(tmp_path, uninterrupted):
    path, ck = stored(tmp_path, uninterrupted[0])
    with open(PLAN, "golden", model=make_model()) as dev:
        with pytest.raises(CheckpointError, match="flushes every 15 samples, this one every 10"):
            dev.train(X, Y, epochs=EPOCHS, checkpoint_every=10, resume=ck)
        with pytest.raises(CheckpointError, match="other data"):
            dev.train(X[:30], Y[:30], epochs=EPOCHS, resume=ck)
        with pytest.raises(CheckpointError, match="nothing is left to train"):
            dev.train(X, Y, epochs=1, resume=ck)
        ck.plan_hash = "0123456789abcdef"
        with pytest.raises(
            CheckpointError, match=f"plan 0123456789abcdef, this run has plan {PLAN.hash}"
        ):
            dev.train(X, Y, epochs=EPOCHS, resume=ck)
    with open(PLAN, "reference", model=make_model()) as dev:
        with pytest.raises(DeviceError, match="golden or a link target"):
            dev.train(X, Y, checkpoint=path)


def test_resume_refuses_a_device_that_ran_since_it_booted(tmp_path, uninterrupted):
    """Its LFSRs are not at the seeds any more, so the state cannot be re-created there."""
    path, ck = stored(tmp_path, uninterrupted[0])
    with serve_device(PLAN, GoldenModel(PLAN, other_model())) as url:
        with open(PLAN, url, model=make_model()) as dev:
            dev.train(X[:5], Y[:5])
            with pytest.raises(DeviceError, match="accepted 5 samples since it booted"):
                dev.train(X, Y, epochs=EPOCHS, resume=ck)


def test_checkpoint_is_written_atomically(tmp_path, uninterrupted, monkeypatch):
    path, ck = stored(tmp_path, uninterrupted[0])
    ck.save(path)
    assert read(path)["position"] == 45 and os.listdir(tmp_path) == ["a.json"]

    def fail(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", fail)
    ck.position = 60
    with pytest.raises(CheckpointError, match="cannot write checkpoint .*disk full"):
        ck.save(path)
    # the old checkpoint is intact and no temporary file is left
    assert read(path)["position"] == 45 and os.listdir(tmp_path) == ["a.json"]
    with pytest.raises(CheckpointError, match="the folder does not exist"):
        ck.save(tmp_path / "no" / "a.json")


def test_cli_resume_continues_the_run(tmp_path):
    """``train --checkpoint`` for one epoch, then ``--resume`` for two, equals two epochs in one
    go with the same flush period (one epoch by default)."""
    npz = tmp_path / "d.npz"
    import numpy as np

    g = torch.Generator().manual_seed(0)
    x = torch.rand(60, 64, generator=g)
    y = torch.randint(0, 10, (60,), generator=g)
    np.savez(
        npz, x_train=x.numpy(), y_train=y.numpy(), x_test=x[:20].numpy(), y_test=y[:20].numpy()
    )
    args = ["train", "mlp-digits", "--target", "golden", "--data", str(npz), "--formats", "default"]
    r = CliRunner()
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    out = r.invoke(cli, [*args, "--epochs", "2", "--checkpoint", str(a)])
    assert out.exit_code == 0, out.output
    out = r.invoke(cli, [*args, "--epochs", "1", "--checkpoint", str(b)])
    assert out.exit_code == 0, out.output
    out = r.invoke(cli, [*args, "--epochs", "2", "--resume", str(b), "--checkpoint", str(b)])
    assert out.exit_code == 0, out.output
    assert "resumed: " in out.output and "from sample 60 of the run" in out.output
    assert "2 epochs, 120 samples" in out.output
    assert read(a) == read(b)
    out = r.invoke(cli, [*args, "--seed", "4", "--resume", str(b)])
    assert out.exit_code == 2 and "Error: the checkpoint is of plan" in out.output
    assert "Traceback" not in out.output


@pytest.fixture(scope="module")
def sim_design(tmp_path_factory):
    """The design of tests/test_host_sim.py (``compiled`` there): same data, same plan."""
    ds = load_npz(str(make_npz(tmp_path_factory.mktemp("data") / "bands.npz")))
    result = compile_design(
        "mlp", data=ds, hidden=HIDDEN, config_overrides={"lr": LR}, formats="default", writers=()
    )
    assert result.plan.in_features == FEATURES
    return result, ds


def test_sim_resume_is_bit_exact(sim_design, tmp_path):
    """The RTL in Verilator: a run that dies after its second checkpoint, resumed on a new
    simulation (a fresh device: LFSRs at the seeds, other weights), ends where the golden
    target's uninterrupted run ends — every weight and velocity word, LFSR state, counter and
    result — and agrees with its golden shadow. The design of tests/test_host_sim.py (one
    Verilator build, cached)."""
    result, ds = sim_design
    initial = copy.deepcopy(result.model)

    def device(target):
        return open(
            result.plan, target, result.config, model=copy.deepcopy(initial), shadow=target == "sim"
        )

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    with device("golden") as dev:
        dev.train(ds.x_train, ds.y_train, epochs=2, checkpoint=a, checkpoint_every=40)
    with device("sim") as dev:
        crash_after(dev.client, "send_samples", 3)  # one call per 40-sample segment
        with pytest.raises(Crash):
            dev.train(ds.x_train, ds.y_train, epochs=2, checkpoint=b, checkpoint_every=40)
    assert Checkpoint.load(b).position == 80
    with device("sim") as dev:
        rep = dev.train(ds.x_train, ds.y_train, epochs=2, checkpoint=b, resume=Checkpoint.load(b))
        v = dev.verify()
        assert v.bit_exact, v.mismatches
        assert dev.counters()["samples_trained"] == 160 == rep.samples
        # the RTL keeps the session tag the host set (SESSION; HELLO reports it)
        assert dev.client.hello().session == dev.client.session != 0
    want, got = read(a), read(b)
    for key in ("memories", "lfsr", "lfsr_updates", "counters", "results", "golden"):
        assert got[key] == want[key], key
