"""Convolution plans through the user-facing flows (issue 16): the host device takes a CNN's
(C, L) / (C, H, W) samples and streams them flat in C order; the stimulus checks the shape; a
user's Conv1d file on a user's (n, 1, L) .npz trains through --target sim (the one-line
refusals of what the HDL does not build: tests/test_conv_refusals.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conv_nets import BUMP_CNN, bump_data, cnn
from pipetrain.compiler.build import build_plan
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.frontend import trace
from pipetrain.compiler.models import load_model
from pipetrain.data import DataError
from pipetrain.hdl.support import HDLSupportError, require_hdl
from pipetrain.host.cli import cli
from pipetrain.sim.stimulus import plan_samples


def _ir(name: str):
    return trace(load_model(name)[1], name)


def _refused(name: str, **cfg) -> bool:
    """Whether the HDL refuses model ``name`` (a built-in or a file) trained with ``cfg``."""
    try:
        require_hdl(build_plan(_ir(name), TrainConfig(**cfg)))
    except HDLSupportError:
        return True
    return False


def test_stimulus_streams_feature_maps_flat_in_c_order(tmp_path):
    """An (n, C, L) .npz feeds a Conv1d plan: plan_samples gives (n, C·L) values in C order
    (the link's sample order, docs/numerics.md §9); another sample shape names both shapes."""
    from torch import nn

    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv1d(2, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 6, 4))
    m.input_shape = (2, 8)
    plan = build_plan(trace(m, "seq"), TrainConfig())
    gen = np.random.default_rng(4)
    xs = (gen.random((5, 2, 8)) * 0.5).astype(np.float32)
    p = tmp_path / "seq.npz"
    np.savez(p, x_train=xs, y_train=np.arange(5) % 4, x_test=xs[:2], y_test=np.array([0, 1]))
    x, y = plan_samples(plan, 5, str(p), seed=0)
    assert tuple(x.shape) == (5, 16)
    fx = plan.stages[0].formats.x
    flat = torch.from_numpy(xs.reshape(5, -1))
    got = {tuple(row.tolist()) for row in x}
    want = {tuple(torch.round(r * 2**fx.frac).to(torch.int64).tolist()) for r in flat}
    assert got == want  # every sample once (epoch order), flat C order, quantised
    q = tmp_path / "wrong.npz"
    ws = xs.reshape(5, 4, 4)
    np.savez(q, x_train=ws, y_train=np.arange(5) % 4, x_test=ws[:2], y_test=np.array([0, 1]))
    with pytest.raises(DataError, match=r"shape 4×4 .* takes 2×8"):
        plan_samples(plan, 5, str(q), seed=0)


def test_device_takes_feature_maps_or_flat_samples():
    """Device.train/predict take a CNN's samples as (n, C, H, W), one (C, H, W) or flat
    (n, C·H·W) — the same values in C order, so the same results; another shape is one
    DeviceError naming both accepted shapes."""
    from pipetrain.host import open as open_device
    from pipetrain.host.device import DeviceError

    gen = torch.Generator().manual_seed(3)
    x = torch.rand(6, 2, 6, 7, generator=gen)
    y = torch.arange(6) % 4
    runs = []
    for xs in (x, x.reshape(6, -1)):
        with open_device(cnn("conv2d", "max", 1, 1, True), "golden", formats="default") as dev:
            dev.train(xs, y, epochs=1)
            runs.append((dev.predict(xs).tolist(), dev.predict(xs[0]).tolist(), dev.state_dict()))
    assert runs[0][:2] == runs[1][:2]
    assert all(torch.equal(runs[0][2][k], runs[1][2][k]) for k in runs[0][2])
    assert runs[0][1] == runs[0][0][:1]
    with open_device(cnn("conv2d", "max", 1, 1, True), "golden", formats="default") as dev:
        with pytest.raises(DeviceError, match=r"takes \(n, 84\) or \(n, 2, 6, 7\)"):
            dev.predict(torch.zeros(3, 2, 7, 6))


@pytest.mark.slow
@pytest.mark.skipif(_refused("cnn1d-digits"), reason="the HDL does not build conv stages")
def test_user_conv1d_file_on_user_npz_trains_on_sim(tmp_path):
    """Issue 16's done-when: a user's Conv1d model file on a user's (n, 1, 16) .npz trains
    through --target sim (the RTL behind the host link) bit-exact with the golden model, and
    as well as on --target golden (same stream, same arithmetic: the same accuracy)."""
    data = tmp_path / "bumps.npz"
    bump_data(data)
    f = tmp_path / "bump_cnn.py"
    f.write_text(BUMP_CNN)
    reports = {}
    for target in ("golden", "sim"):
        out = tmp_path / f"{target}.json"
        args = ["train", str(f), "--data", str(data), "--target", target, "--epochs", "2"]
        r = CliRunner().invoke(cli, [*args, "--json", str(out)])
        assert r.exit_code == 0, r.output
        reports[target] = json.loads(out.read_text())
    assert reports["sim"]["bit_exact"] is True, reports["sim"]["mismatches"]
    assert reports["sim"]["test_accuracy"] == reports["golden"]["test_accuracy"]
