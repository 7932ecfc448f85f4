"""Verilog generation: one top module with the docs/ports.md port names, clean under
``verilator --lint-only -Wno-fatal``, written by the compile flow as ``<name>.v``."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.models import build_mlp
from pipetrain.hdl.verilog import generate_verilog, verilog_name

sys.path.insert(0, str(Path(__file__).parent))
from test_hdl_top import tiny  # noqa: E402


@pytest.fixture(scope="module")
def tiny_verilog():
    plan, _, _ = tiny()
    return plan, generate_verilog(plan, "pipetrain_tiny")


def _ports(text: str, module: str) -> dict[str, tuple[str, int]]:
    body = text[text.index(f"module {module}(") :]
    body = body[: body.index("endmodule")]
    ports = {}
    for d, w, name in re.findall(r"^\s*(input|output)\s+(?:\[(\d+):0\]\s+)?(\w+);", body, re.M):
        ports[name] = (d, int(w) + 1 if w else 1)
    return ports


def test_ports_are_the_contract(tiny_verilog):
    plan, text = tiny_verilog
    S = len(plan.stages)
    X = plan.stages[0].formats.x.bits
    assert text.count("\nmodule pipetrain_tiny(") == 1
    ports = _ports(text, "pipetrain_tiny")
    expected = {
        "clk": ("input", 1),
        "rst": ("input", 1),
        "sample_in__payload": ("input", X + 16 + 1 + 1),
        "sample_in__valid": ("input", 1),
        "sample_in__ready": ("output", 1),
        "result_out__payload": ("output", 32 + 16 + 32 + 1),
        "result_out__valid": ("output", 1),
        "result_out__ready": ("input", 1),
        "wacc_cmd__payload": ("input", 1 + 8 + 2 + 16 + 16 + 32),
        "wacc_cmd__valid": ("input", 1),
        "wacc_cmd__ready": ("output", 1),
        "wacc_rsp__payload": ("output", 32),
        "wacc_rsp__valid": ("output", 1),
        "wacc_rsp__ready": ("input", 1),
        "flush": ("input", 1),
        "idle": ("output", 1),
        "samples_trained": ("output", 32),
        "ticks": ("output", 32),
    } | {f"saturations__{k}": ("output", 32) for k in range(S + 1)}
    assert ports == expected


def test_verilator_lint_passes(tiny_verilog, tmp_path):
    from pipetrain.sim.verilator import toolchain_env

    _, text = tiny_verilog
    try:
        env = toolchain_env()
    except Exception as exc:  # noqa: BLE001 - the toolchain is optional on a bare machine
        pytest.skip(f"verilator toolchain unavailable: {exc}")
    if shutil.which("verilator", path=env["PATH"]) is None:
        pytest.skip("verilator not found")
    src = tmp_path / "pipetrain_tiny.v"
    src.write_text(text)
    res = subprocess.run(
        ["verilator", "--lint-only", "-Wno-fatal", "--top-module", "pipetrain_tiny", src.name],
        cwd=tmp_path,
        env={**__import__("os").environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "%Error" not in res.stderr
    # only Amaranth's known width/case lint classes (docs/architecture.md §6)
    kinds = set(re.findall(r"%Warning-(\w+)", res.stderr))
    assert kinds <= {"WIDTHEXPAND", "WIDTHTRUNC", "CASEINCOMPLETE", "UNUSEDSIGNAL"}


def test_names_and_unsupported_plans(tmp_path):
    assert verilog_name("mlp-digits") == "mlp_digits" and verilog_name("3net") == "m_3net"
    plan, _, _ = tiny()
    with pytest.raises(ValueError, match="legal Verilog"):
        generate_verilog(plan, "mlp-digits")


def test_compile_writes_the_verilog(tmp_path):
    """The compile flow (host.flow.compile_design) appends the HDL's Verilog writer."""
    from pipetrain.host.flow import compile_design

    res = compile_design(
        build_mlp([8, 6, 4]), TrainConfig(), tmp_path / "out", formats="default", name="net-a"
    )
    assert res.files[-1] == "net_a.v"
    text = (tmp_path / "out" / "net_a.v").read_text()
    assert "module net_a(" in text
    # a stage the HDL does not build (3 inputs, several row groups and an input gradient: the
    # gacc write would race its read): no Verilog, a warning, no failure
    odd = compile_design(
        build_mlp([8, 3, 4]), TrainConfig(), tmp_path / "odd", formats="default", lanes=[1, 1]
    )
    assert not any(f.endswith(".v") for f in odd.files)
    assert any("no Verilog written" in w for w in odd.warnings)
    # the interlocking sum rule is built: an earlier update stream's δ memory is in the Verilog
    inter = compile_design(
        build_mlp([8, 6, 5, 4]),
        TrainConfig(strategy="interlocking", blocks=(1, 2), distance=1, rule="sum"),
        tmp_path / "inter",
        formats="default",
        name="net-sum",
    )
    assert inter.files[-1] == "net_sum.v"
    assert "dsum" in (tmp_path / "inter" / "net_sum.v").read_text()
    # local learning is: the head's stage and loss unit are in the Verilog
    local = compile_design(
        build_mlp([8, 6, 5, 4]),
        TrainConfig(strategy="local", blocks=(1,)),
        tmp_path / "local",
        formats="default",
        name="net-local",
    )
    assert local.files[-1] == "net_local.v"
    assert "head_correct" in (tmp_path / "local" / "net_local.v").read_text()


def test_design_resources_count_the_lanes():
    """One forward and one update multiplier per lane, plus the input-gradient one after stage
    1, plus the loss unit's e·r; weight/velocity memories are L banks of row_groups·(N+1)."""
    from pipetrain.hdl.resources import design_resources

    plan, _, _ = tiny()
    res = design_resources(plan)
    expect = sum(s.lanes * (3 if s.input_gradient else 2) for s in plan.stages) + 1
    assert len(res.variable_multipliers) == expect == 2 * 2 + 3 * 3 + 2 * 3 + 1
    wu = sum(  # the banks w0, u0, … (their memory may sit one level below, hdl/weights.py)
        m.bits
        for m in res.memories
        if any(c[:1] in "wu" and c[1:].isdigit() for c in m.path.split("/"))
    )
    assert wu == sum(
        s.lanes * s.row_groups * (s.in_features + 1) * (s.formats.w.bits + s.formats.u.bits)
        for s in plan.stages
    )
    assert res.memory_bits > wu  # stash, masks, error buffers, loss unit, result FIFO
