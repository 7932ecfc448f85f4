"""benchmarks/conv.py's pieces on cnn-digits' plan (no training, no RTL): the MAC utilisation
and multiplies of convolution stages count each weight at every output position, the memory
table lists every stage memory the HDL builds, the table marks a model the HDL does not build.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pipetrain.compiler.build import FormatSpec, build_plan
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.frontend import trace
from pipetrain.compiler.models import load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import conv as bench_conv  # noqa: E402
import measure  # noqa: E402


@pytest.fixture(scope="module")
def plan():
    ir = trace(load_model("cnn-digits")[1], "cnn-digits")
    return build_plan(ir, TrainConfig(), FormatSpec.default(3), (2, 4, 1))


def test_conv_utilisation_and_multiplies(plan):
    s1, s2, s3 = plan.stages
    tick = plan.tick_cycles
    u = measure.stage_utilisation(plan)
    # stage 2: 16 channels × 73 weights (8·3·3 + bias), each in one MAC slot at 16 positions
    assert u[1]["mac_util"] == pytest.approx(16 * 73 * 16 / (4 * tick))
    assert u[1]["lane_slot_util"] == 1.0 and u[2]["mac_util"] == pytest.approx(10 * 65 / tick)
    # forward + weight gradient per weight and position; input gradient after stage 1
    want = 8 * 64 * 10 * 2 + (16 * 16 * 73 * 2 + 16 * 16 * 72) + 10 * 65 * 3
    assert measure.multiplies_per_sample(plan) == want
    fig = bench_conv.plan_figures(plan)
    assert fig["bound_stage"] == 2 and fig["mac_util"] == u[1]["mac_util"]
    assert fig["stash_bits"] == s1.stash_bits + s2.stash_bits + s3.stash_bits


def test_memory_table_and_table_cells(plan):
    text = bench_conv.memory_table(plan)
    assert "| 1 | conv2d | 1×8×8→8×4×4 |" in text and "| 3 | linear | 64→10 |" in text
    for st in plan.stages:
        for m in st.memories:
            assert f"{m.bits:,}" in text
    row = {"plan": bench_conv.plan_figures(plan), "rtl": {"rtl": "not built"}}
    out = bench_conv.table({"cnn-digits": row}, 4, [0])
    assert "| `cnn-digits` | 2 conv2d+1 linear | 2,4,1 | not run | not run |" in out
    assert "not in the HDL" in out
