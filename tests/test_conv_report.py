"""report.md and the compile JSON for convolution plans: each conv stage's geometry, lanes, cycles
and memories from the plan (the AvgPool multipliers: tests/test_conv_multipliers.py)."""

from __future__ import annotations

from pipetrain.compiler.build import build_plan
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.frontend import trace
from pipetrain.compiler.models import load_model
from pipetrain.compiler.report import conv_table, plan_summary, render_report, stage_table


def _cnn_digits():
    return build_plan(trace(load_model("cnn-digits")[1], "cnn-digits"), TrainConfig())


def test_report_shows_each_conv_stage_geometry():
    plan = _cnn_digits()
    s1, s2 = plan.stages[0], plan.stages[1]
    table = conv_table(plan)
    rows = [r for r in table.splitlines() if r.strip("|").split("|")[0].strip().isdigit()]
    assert len(rows) == 2  # the two conv stages, not the Linear one
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    # Conv2d(1, 8, 3, padding=1) on 8×8 → 8×8, MaxPool2d(2) → 4×4: T + 1 = 10, P = 64
    assert cells[2:14] == [
        "conv2d", "1→8", "3×3", "1×1", "1×1", "yes", "8×8", "8×8", "max 2×2", "4×4", "10", "64"
    ]  # fmt: skip
    assert cells[14:17] == [str(s1.lanes), str(s1.row_groups), str(s1.cycles_per_tick)]
    for m in s1.memories:
        assert f"{m.name} {m.bits:,}" in cells[17]
    cells2 = [c.strip() for c in rows[1].strip("|").split("|")]
    assert cells2[3] == "8→16" and cells2[8:12] == ["4×4", "4×4", "max 2×2", "2×2"]
    assert cells2[16] == str(s2.cycles_per_tick)
    report = render_report(plan)
    assert "## Convolutions" in report and table in report
    assert "input: 64 features (one 1×8×8 sample, streamed flat in C order)" in report
    assert "| 1×8×8→8×4×4 " in stage_table(plan) and "| 64→10 " in stage_table(plan)
    js = plan_summary(plan)["stages"]
    assert tuple(js[0]["conv"]["kernel"]) == (3, 3) and js[0]["conv"]["pool"] == "max"
    assert tuple(js[0]["conv"]["pooled_size"]) == (4, 4) and "conv" not in js[2]


def test_mlp_report_has_no_conv_section():
    plan = build_plan(trace(load_model("mlp-digits")[1], "mlp-digits"), TrainConfig())
    assert conv_table(plan) == "" and "## Convolutions" not in render_report(plan)
    assert "conv" not in plan_summary(plan)["stages"][0]
