"""The hardware commands refuse a convolution stage the HDL does not build with one line (before
"starting the RTL simulation" or any build, nothing written), each naming the stage, the reason
and what that command's user can do instead (hdl/support.py:INSTEAD)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from pipetrain.host.cli import cli
from test_conv_flows import _refused

#: A conv stage the HDL does not build (hdl/support.py, hdl/conv_stage.py): interlocking with
#: 3 blocks on cnn-digits gives conv stage 2 two backward streams.
INTERLOCKING = ["--strategy", "interlocking", "--blocks", "1,2", "--distance", "1"]


@pytest.mark.parametrize(
    ("args", "instead"),
    [
        (["train", "cnn-digits", "--target", "sim", "--formats", "default"], "--target golden or"),
        (
            ["build", "cnn-digits", "--board", "ulx3s-85f", "--formats", "default"],
            "or see its plan and report with `pipetrain compile MODEL` (a bitstream needs the HDL)",
        ),
        (["sim", "cnn-digits", "--samples", "3"], "pipetrain sim runs the RTL only"),
    ],
)
def test_hardware_commands_refuse_a_conv_stage_the_hdl_does_not_build(
    args, instead, tmp_path, monkeypatch
):
    """One Error line naming the stage, the reason and what that command can do instead, exit
    2, before the simulator start message or any build, and nothing written."""
    if not _refused("cnn-digits", strategy="interlocking", blocks=(1, 2), distance=1):
        pytest.skip("the HDL builds interlocking conv stages now: no refusal to test")
    monkeypatch.chdir(tmp_path)  # build writes build/<design>-<board> here
    r = CliRunner().invoke(cli, args + INTERLOCKING)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.strip().splitlines() if not ln.startswith(("note:", "warn"))]
    assert len(lines) == 1, r.output
    assert lines[0].startswith("Error: stage 2 (conv2d): 2 backward streams")
    assert instead in lines[0]
    assert "starting" not in r.output and "building" not in r.output
    assert list(tmp_path.iterdir()) == []
