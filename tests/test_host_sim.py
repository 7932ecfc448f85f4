"""The ``sim`` target end to end: the RTL (LinkEngine ↔ NetworkTop in Verilator) served on a
loopback TCP port, driven through ``pipetrain.host.open`` and ``pipetrain train``.

One small design (a data-sized ``mlp`` 40 → 8 → 4, static formats) is built once (cached under
the RTL build cache) and shared by every test here: the API test compiles it exactly as the CLI
does (:func:`~pipetrain.host.flow.compile_design`), so the CLI test reuses the build.
"""

from __future__ import annotations

import copy
import json
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from pipetrain.compiler.models import build_mlp
from pipetrain.data import load_npz
from pipetrain.host import open
from pipetrain.host.cli import cli
from pipetrain.host.flow import compile_design
from pipetrain.sim import bridge
from pipetrain.sim.golden import GoldenModel
from pipetrain.sim.harness import RTLBuild

FEATURES, CLASSES, HIDDEN, LR = 40, 4, "8", 0.02


def make_npz(path: Path, n_train: int = 80, n_test: int = 40) -> Path:
    """40 features, 4 classes: class c makes features 10c..10c+9 bright."""
    rng = np.random.default_rng(0)

    def make(n):
        y = rng.integers(0, CLASSES, n)
        x = rng.uniform(0, 0.25, (n, FEATURES))
        for i, c in enumerate(y):
            x[i, 10 * c : 10 * c + 10] += 0.6
        return x.astype(np.float32), y.astype(np.int64)

    x_tr, y_tr = make(n_train)
    x_te, y_te = make(n_test)
    np.savez(path, x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te)
    return path


@pytest.fixture(scope="module")
def npz(tmp_path_factory) -> str:
    return str(make_npz(tmp_path_factory.mktemp("data") / "bands.npz"))


@pytest.fixture(scope="module")
def compiled(npz):
    ds = load_npz(npz)
    result = compile_design(
        "mlp", data=ds, hidden=HIDDEN, config_overrides={"lr": LR}, formats="default", writers=()
    )
    return result, ds


def test_sim_target_trains_bit_exact_with_golden(compiled):
    result, ds = compiled
    initial = copy.deepcopy(result.model)
    with open(result, "sim", shadow=True) as dev:
        port = dev._bridge.port
        rep = dev.train(ds.x_train, ds.y_train, epochs=2)
        acc = dev.evaluate(ds.x_test, ds.y_test)
        v = dev.verify()
        assert v.bit_exact, v.mismatches
        assert v.results == 160 + 40  # every training and inference result compared
        c = dev.counters()
        assert c["samples_trained"] == rep.samples == 160 == dev.samples_trained
        assert c["accepted"] == 200 and c["bad_crc"] == c["bad_header"] == 0
        assert dev.retransmits == 0
        # the same numbers as the golden model trained on its own
        ref = GoldenModel(result.plan, initial, result.config)
        ref.train(ds.x_train, ds.y_train, epochs=2)
        assert acc == ref.evaluate(ds.x_test, ds.y_test)
        assert acc >= 0.9  # an easy problem (chance: 0.25)
        # state_dict: exact round trip through the fixed-point formats, loads into the module
        sd = dev.state_dict()
        assert all(torch.equal(sd[k], w) for k, w in ref.state_dict().items())
        mem = dev.memories()
        dev.load_state_dict(sd)
        back = dev.memories()
        for name in mem:
            assert torch.equal(mem[name]["w"], back[name]["w"])
            assert torch.equal(mem[name]["u"], back[name]["u"])
        result.model.load_state_dict(sd)  # strict: the original module's keys and shapes
    # closed: the simulator ended cleanly and its port is gone
    assert dev.sim_stats is not None and dev.sim_stats["cycles"] > 200 * result.plan.tick_cycles
    assert dev.sim_stats["bytes_in"] > 200 * (3 + FEATURES * 2)
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass


def test_cli_sim_target_save_and_reload(npz, tmp_path):
    out = tmp_path / "w.pt"
    res = CliRunner().invoke(
        cli,
        ["train", "mlp", "--hidden", HIDDEN, "--data", npz, "--formats", "default",
         "--lr", str(LR), "--epochs", "1", "--save", str(out), "--json", "-"],
        catch_exceptions=False,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout[res.stdout.index("{") :])
    assert report["target"] == "sim" and report["bit_exact"] is True
    assert report["train_samples"] == report["device_samples"] == report["samples"] == 80
    assert report["retransmits"] == 0 and report["saturations"] >= 0
    assert report["samples_per_s"] > 0 and report["sim_cycles"] > 0
    assert report["test_accuracy"] >= 0.9  # one epoch of an easy 4-class problem (chance 0.25)
    # the saved state_dict loads with weights_only=True into the original (data-sized) module
    state = torch.load(out, weights_only=True)
    model = build_mlp([FEATURES, 8, CLASSES])
    model.load_state_dict(state)
    ds = load_npz(npz)
    with torch.no_grad():
        float_acc = float((model(ds.x_test).argmax(1) == ds.y_test).double().mean())
    assert float_acc == report["float_test_accuracy"]
    assert abs(float_acc - report["test_accuracy"]) <= 0.02


def test_simulator_that_dies_before_its_port_opens_is_a_clear_error(
    compiled, monkeypatch, tmp_path
):
    result, _ = compiled
    fake = bridge.BridgeDesign(
        result.plan, RTLBuild(tmp_path / "nowhere", bridge.TOPLEVEL, "0", None, 0.0, True),
        bridge.DEFAULT_WORD_BYTES, 0.0, True,
    )  # fmt: skip
    monkeypatch.setattr(bridge, "build_bridge", lambda plan, word_bytes, **kw: fake)
    with pytest.raises(bridge.SimBridgeError, match="exited .* before opening its port"):
        bridge.SimBridge(result.plan, startup_timeout=30).start()


@pytest.mark.slow
def test_main_job_defaults(tmp_path):
    """``pipetrain train`` with no arguments: mlp-digits on digits through the RTL simulation."""
    out = tmp_path / "w.pt"
    res = CliRunner().invoke(cli, ["train", "--save", str(out), "--json", "-"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout[res.stdout.index("{") :])
    assert report["target"] == "sim" and report["model"] == "mlp-digits"
    assert report["bit_exact"] is True and report["test_accuracy"] >= 0.90
    assert report["device_samples"] == report["train_samples"] >= 1437
    assert abs(report["float_test_accuracy"] - report["test_accuracy"]) <= 0.02
    assert set(torch.load(out, weights_only=True)) == {"0.weight", "0.bias", "2.weight", "2.bias"}


def test_bridge_serves_frames_split_across_writes(compiled):
    """A frame that arrives in pieces (TCP segments, junk before it) is still one command."""
    from pipetrain.host.transport import TcpTransport
    from pipetrain.protocol.wire import Cmd, Frame, FrameDecoder, encode_frame

    result, _ = compiled
    with bridge.SimBridge(result.plan) as sim:
        tr = TcpTransport("127.0.0.1", sim.port)
        wire = encode_frame(Frame(Cmd.HELLO, 5))
        tr.write(b"\x00\xa5\x13" + wire[:4])
        time.sleep(0.3)  # the simulator runs on (busy, inside a frame) and polls again
        tr.write(wire[4:])
        dec, frames = FrameDecoder(), []
        deadline = time.monotonic() + 30
        while not frames and time.monotonic() < deadline:
            frames += dec.feed(tr.read(1.0))
        tr.close()
    assert [(f.type, f.seq) for f in frames] == [(0x80 | Cmd.HELLO, 5)]
    # session tag 0 (fresh from reset), then the plan hash
    assert frames[0].payload[:12] == bytes(4) + bytes.fromhex(result.plan.hash)
    assert sim.stats is not None and sim.stats["bytes_in"] == len(wire) + 3
