"""Convolution and pooling in the front end, the plan and the data (issue 16): the IR's geometry,
the refusals (module, parameter, supported values), the plan's stage kind and geometry with an
exact JSON round trip and unchanged MLP hashes, the HDL refusal, and the data shapes."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conv_nets import BUMP_CNN, bump_data
from pipetrain.compiler.build import build_plan
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.conv import CONV_UPDATE_GAP, conv_cycles
from pipetrain.compiler.frontend import CompileError, trace
from pipetrain.compiler.models import load_model
from pipetrain.compiler.plan import Plan
from pipetrain.compiler.plan_check import PlanError
from pipetrain.data import DataError, load_digits, load_npz
from pipetrain.errors import UserError
from pipetrain.hdl.support import HDLSupportError, require_hdl
from pipetrain.host.cli import cli
from torch import nn


def _ir(name="cnn-digits"):
    _, model, _ = load_model(name)
    return trace(model, name)


def test_cnn_digits_geometry():
    """cnn-digits: 1×8×8 → conv 8×8×8 → max 4×4 → conv 16×4×4 → max 2×2 → 64 → 10."""
    ir = _ir()
    assert ir.input_shape == (1, 8, 8) and ir.in_features == 64
    a, b, c = ir.layers
    assert (a.in_features, a.out_features, b.in_features, b.out_features) == (64, 128, 128, 64)
    assert (a.conv.out_size, a.conv.pooled_size, a.conv.taps, a.conv.pool) == (
        (8, 8), (4, 4), 9, "max",
    )  # fmt: skip
    assert (b.conv.in_size, b.conv.pooled_size, b.conv.taps) == ((4, 4), (2, 2), 72)
    assert c.conv is None and (c.in_features, c.out_features) == (64, 10)
    assert [str(ly.activation) for ly in ir.layers] == ["relu", "relu", "identity"]


def test_cnn1d_digits_geometry():
    """Stride 2, padding 2, LeakyReLU and AvgPool: 64 → 32 → (32 + 4 − 5)//2 + 1 = 16 → 8."""
    a, b, _ = _ir("cnn1d-digits").layers
    assert (a.conv.out_size, a.conv.pooled_size) == ((64,), (32,))
    assert (b.conv.stride, b.conv.out_size, b.conv.pooled_size, b.conv.pool) == (
        (2,), (16,), (8,), "avg",
    )  # fmt: skip
    assert (b.conv.pool_scale, b.conv.pool_shift) == (1, 1)  # ½ is a shift
    assert float(b.negative_slope) == 0.125


class _Functional(nn.Module):
    """A model class with a view to images, functional ReLU and torch.flatten."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(1, 4, 3, padding=1, bias=False)
        self.p = nn.AvgPool2d(2)
        self.fc = nn.Linear(64, 3)

    def forward(self, x):
        x = x.view(x.size(0), 1, 8, 8)
        return self.fc(torch.flatten(self.p(torch.relu(self.c(x))), 1))


def test_view_gives_the_input_shape_and_functional_forms_lower_alike():
    ir = trace(_Functional(), "f")
    assert ir.input_shape == (1, 8, 8)
    g = ir.layers[0].conv
    assert (g.bias, g.pool, g.pool_scale, g.pool_shift, ir.layers[0].activation) == (
        False, "avg", 1, 2, "relu",
    )  # fmt: skip


def _seq(*mods, shape=None):
    m = nn.Sequential(*mods)
    if shape is not None:
        m.input_shape = shape
    return m


REFUSED = {
    "groups": (
        _seq(nn.Conv2d(2, 4, 3, groups=2), nn.Flatten(), nn.Linear(4, 2), shape=(2, 3, 3)),
        ["'0' (Conv2d)", "groups=2", "groups=1"],
    ),
    "dilation": (
        _seq(nn.Conv1d(1, 2, 3, dilation=2), nn.Flatten(), nn.Linear(2, 2), shape=(1, 5)),
        ["'0' (Conv1d)", "dilation=(2,)", "dilation=1"],
    ),
    "stride": (
        _seq(nn.Conv2d(1, 2, 3, stride=3), nn.Flatten(), nn.Linear(2, 2), shape=(1, 3, 3)),
        ["'0' (Conv2d)", "stride=(3, 3)", "stride 1 or 2"],
    ),
    "padding_mode": (
        _seq(
            nn.Conv2d(1, 2, 3, padding=1, padding_mode="reflect"),
            nn.Flatten(),
            nn.Linear(18, 2),
            shape=(1, 3, 3),
        ),  # fmt: skip
        ["'0' (Conv2d)", "padding_mode='reflect'", "padding_mode='zeros'"],
    ),
    "padding_same": (
        _seq(nn.Conv2d(1, 2, 3, padding="same"), nn.Flatten(), nn.Linear(18, 2)),
        ["'0' (Conv2d)", "padding='same'", "integer zero padding"],
    ),
    "pool_kernel_ne_stride": (
        _seq(nn.Conv2d(1, 2, 3), nn.MaxPool2d(3, 2), nn.Flatten(), nn.Linear(2, 2)),
        ["'1' (MaxPool2d)", "kernel_size=3, stride=2", "kernel = stride"],
    ),
    "pool_ceil_mode": (
        _seq(nn.Conv1d(1, 2, 3), nn.AvgPool1d(2, ceil_mode=True), nn.Flatten(), nn.Linear(4, 2)),
        ["'1' (AvgPool1d)", "ceil_mode=True", "ceil_mode=False"],
    ),
    "pool_after_linear": (
        _seq(nn.Linear(8, 8), nn.MaxPool1d(2)),
        ["'1' (MaxPool1d)", "does not follow a convolution stage"],
    ),
    "act_after_pool": (
        _seq(nn.Conv2d(1, 2, 3), nn.MaxPool2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(2, 2)),
        ["'2' (ReLU)", "put the activation before the pooling"],
    ),
    "tanh_after_conv": (
        _seq(nn.Conv1d(1, 2, 3), nn.Tanh(), nn.Flatten(), nn.Linear(4, 2)),
        ["'1' (Tanh)", "nn.ReLU or nn.LeakyReLU"],
    ),
    "conv_after_linear": (
        _seq(nn.Conv1d(1, 2, 3), nn.Flatten(), nn.Linear(4, 4), nn.Conv1d(1, 2, 3)),
        ["'3' (Conv1d)", "follows a Linear layer"],
    ),
    "no_flatten": (
        _seq(nn.Conv2d(1, 2, 3), nn.Linear(4, 2)),
        ["'1' (Linear)", "4-D tensor", "flatten"],
    ),
    "sizes": (
        _seq(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(5, 2), shape=(1, 4, 4)),
        ["'2' (Linear) expects 5 inputs", "2×2×2 = 8", "nn.Linear(8, 2)"],
    ),
    "ambiguous_input": (
        _seq(nn.Conv2d(1, 2, 3, stride=2), nn.Flatten(), nn.Linear(8, 2)),
        ["input sizes 5, 6 all", "model.input_shape = (1, H, W)"],
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_unsupported_conv_models_are_refused_by_name(case):
    model, needles = REFUSED[case]
    with pytest.raises(CompileError) as info:
        trace(model, "bad")
    text = str(info.value)
    for needle in needles:
        assert needle in text, (needle, text)
    assert "\n" not in text and isinstance(info.value, UserError)


def test_cli_compile_refusal_is_one_line_exit_2_nothing_written(tmp_path):
    f = tmp_path / "bad.py"
    f.write_text(
        "from torch import nn\n"
        "model = nn.Sequential(nn.Conv2d(1, 2, 3, dilation=2), nn.Flatten(), nn.Linear(8, 2))\n"
    )
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["compile", str(f), "--out", str(out)])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert lines[-1].startswith("Error: module '0' (Conv2d) has dilation=(2, 2)")
    assert "Traceback" not in r.output and not out.exists()


def _plan(name="cnn-digits", **cfg):
    return build_plan(_ir(name), TrainConfig(**cfg), lanes=(2, 4, 1))


def test_plan_conv_stage_kind_geometry_and_round_trip():
    plan = _plan()
    s1, s2, s3 = plan.stages
    assert (s1.kind, s2.kind, s3.kind) == ("conv2d", "conv2d", "linear")
    assert plan.input_shape == (1, 8, 8)
    # lanes over output channels: ⌈8/2⌉ = 4, ⌈16/4⌉ = 4 row groups of (T + 1)·(P + 1) cycles,
    # and the pass's gap before the update phase (stage 1: its 64 input gradients are not sent)
    gap = CONV_UPDATE_GAP
    assert (s1.row_groups, s1.cycles_per_tick) == (4, 4 * 10 * (64 + 1) + 64 + 6 - 4 * 10)
    assert (s2.row_groups, s2.cycles_per_tick) == (4, 4 * 73 * (16 + 1) + gap)
    assert conv_cycles(s2.conv, 4) == (4, s2.cycles_per_tick)
    names = [m.name for m in s1.memories]
    assert names == ["w", "u", "xstash", "mask", "argmax", "gbuf", "wgacc"]
    w = s2.memory("w")
    assert (w.banks, w.words) == (4, 4 * 73)  # row_groups·(T + 1) words per lane
    mask, arg, gbuf = s2.memory("mask"), s2.memory("argmax"), s2.memory("gbuf")
    # the stash: D_s + 1 = 4 samples (+1 being written) of 128 inputs, the ReLU bit per conv
    # output position and the 2-bit argmax per pooled position (the MaxPool window has 4)
    assert (s2.stash_depth, s2.stash_entries, s2.memory("xstash").entries) == (4, 5, 5)
    assert (mask.words, mask.width) == (5 * 4 * 16, 4)
    assert (arg.words, arg.width) == (5 * 4 * 4, 4 * 2)
    assert s2.stash_bits == s2.memory("xstash").bits + mask.bits + arg.bits
    assert (gbuf.words, s2.memory("gacc").words) == (2 * 4 * 4, 128)
    # the weight gradient sums 16 positions: P has ⌈log2 16⌉ = 4 more bits than one product
    f = s2.formats
    assert s2.memory("wgacc").width == f.d.bits + f.x.bits + 4 + 1
    text = plan.to_json()
    back = Plan.from_json(text)
    assert back == plan and back.hash == plan.hash
    assert json.loads(text)["stages"][2].get("conv") is None  # absent for Linear


def test_mlp_plans_keep_their_json_without_conv_fields():
    """A Linear stage's JSON has no ``conv`` key: MLP plans keep their hashes."""
    ir = _ir("mlp-digits")
    d = build_plan(ir, TrainConfig()).to_dict()
    assert all("conv" not in st for st in d["stages"])


def test_plan_reader_checks_conv_geometry():
    d = _plan().to_dict()
    d["stages"][0]["conv"]["out_size"] = [7, 8]
    with pytest.raises(PlanError, match=r"stages\[0\]\.conv\.out_size"):
        Plan.from_dict(d)
    d = _plan().to_dict()
    d["stages"][1]["conv"]["stride"] = [3, 3]
    with pytest.raises(PlanError, match=r"stages\[1\]\.conv\.stride\[0\] = 3: must be in 1\.\.2"):
        Plan.from_dict(d)


def test_hdl_builds_conv_plans_and_refuses_what_it_does_not_with_one_user_error():
    """cnn-digits passes the HDL check; a conv stage it does not build (interlocking with 3
    blocks: conv stage 2 has two backward streams) is one UserError naming the stage and the
    way out (the CLI's one-line refusals: tests/test_conv_flows.py)."""
    require_hdl(_plan())
    require_hdl(build_plan(_ir("mlp-digits"), TrainConfig()))  # an MLP passes
    plan = _plan(strategy="interlocking", blocks=(1, 2), distance=1)
    with pytest.raises(HDLSupportError, match="stage 2 .*backward streams.*--target golden or"):
        require_hdl(plan)
    assert isinstance(HDLSupportError("x"), UserError)


def test_digits_feed_images_and_sequences():
    """The digits are flat 8×8 images (row-major): they fit 1×8×8, 1×64 and 64 inputs."""
    ds = load_digits()
    assert ds.shape == (64,) and ds.features == 64
    assert ds.fits((1, 8, 8)) and ds.fits((64,)) and ds.fits((1, 64)) and not ds.fits((1, 63))


def test_npz_feature_maps_are_flattened_and_checked(tmp_path):
    gen = np.random.default_rng(0)
    p = tmp_path / "seq.npz"
    xs = gen.standard_normal((6, 2, 5)).astype(np.float32)
    np.savez(p, x_train=xs, y_train=np.arange(6) % 2, x_test=xs[:2], y_test=np.array([0, 1]))
    ds = load_npz(p)
    assert ds.shape == (2, 5) and tuple(ds.x_train.shape) == (6, 10)
    assert torch.equal(ds.x_train[1], torch.from_numpy(xs[1].reshape(-1)))  # C order
    assert ds.fits((2, 5)) and ds.fits((10,)) and not ds.fits((1, 10))
    msg = ds.mismatch((1, 10), "m")
    assert "shape 2×5" in msg and "takes 1×10" in msg
    assert "set model.input_shape = (2, 5)" in msg  # a guessed CNN size: name the fix
    assert "model.input_shape" not in ds.mismatch((7,), "m")  # a flat model: not a CNN guess
    q = tmp_path / "bad.npz"
    np.savez(q, x_train=xs, y_train=np.arange(6) % 2, x_test=xs[:2].reshape(2, 5, 2),
             y_test=np.array([0, 1]))  # fmt: skip
    with pytest.raises(DataError, match=r"x_train has samples of shape \(2, 5\) but x_test"):
        load_npz(q)


def test_train_cli_names_both_shapes(tmp_path):
    gen = np.random.default_rng(1)
    p = tmp_path / "maps.npz"
    xs = gen.random((8, 1, 64)).astype(np.float32)
    np.savez(p, x_train=xs, y_train=np.arange(8) % 10, x_test=xs[:2], y_test=np.array([0, 1]))
    out = tmp_path / "o.json"
    r = CliRunner().invoke(
        cli, ["train", "cnn-digits", "--data", str(p), "--target", "golden", "--json", str(out)]
    )
    assert r.exit_code == 2, r.output
    assert "shape 1×64" in r.output and "takes 1×8×8" in r.output
    report = json.loads(out.read_text())  # --json gets the error only (docs/architecture.md §1.4)
    assert set(report) == {"error", "error_type"} and "takes 1×8×8" in report["error"]


def test_dataclass_replace_keeps_conv():
    st = _plan().stages[0]
    assert dataclasses.replace(st, lanes=st.lanes).conv == st.conv


def test_user_conv1d_file_on_user_npz_trains_on_golden(tmp_path):
    """A user's Conv1d model file (a global MaxPool over the 16 positions) on a user's
    (n, 1, 16) .npz compiles and trains through --target golden; the bumps are separable by
    the max over positions, so after 8 epochs the test accuracy is ≥ 0.9 (measured 1.0, and
    1.0 on --target reference)."""
    data = tmp_path / "bumps.npz"
    bump_data(data)
    f = tmp_path / "bump_cnn.py"
    f.write_text(BUMP_CNN)
    out = tmp_path / "r.json"
    args = ["train", str(f), "--data", str(data), "--target", "golden", "--epochs", "8"]
    r = CliRunner().invoke(cli, [*args, "--json", str(out)])
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    assert report["test_accuracy"] >= 0.9, report["test_accuracy"]
    assert report["float_test_accuracy"] == report["test_accuracy"]
