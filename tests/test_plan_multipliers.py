"""``Stage.multipliers`` / ``Plan.multipliers`` count the multipliers the HDL instantiates:
lanes × the per-lane ``Stage.products`` plus the per-stage ones (``Product.per_stage``: the
scaled error formed at the error buffer's write) per stage (``build.stage_products``), the
stages summed (the
loss units' are in report.md's Multipliers table and the board fit), and ``plan_check``
refuses a plan whose counts disagree with its products."""

from __future__ import annotations

import json

import pytest
from pipetrain.compiler.build import build_plan, stage_products
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.frontend import trace
from pipetrain.compiler.lanes import choose_lanes, lane_multipliers
from pipetrain.compiler.models import load_model
from pipetrain.compiler.plan import Plan
from pipetrain.compiler.plan_check import PlanError
from torch import nn


def _ir(spec: str):
    name, model, _ = load_model(spec)
    return trace(model, name)


def _tanh_ir():
    m = nn.Sequential(nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 5), nn.Sigmoid(), nn.Linear(5, 3))
    return trace(m, "ts")


def test_mlp_digits_16_4_on_the_ulx3s_counts_its_products():
    """The ULX3S plan of mlp-digits at --lanes 16,4: per lane stage 1 builds ŵ·x, m·u and e·x
    (3), stage 2 also w·δ (4); each stage forms its scaled error lr·g once, at the error
    buffer's write (ReLU / identity: e = mask·rhu(lr·g, k)): 16·3 + 1 + 4·4 + 1 = 66 (84 when
    lr·δ was per lane). The fit's DSP blocks: one per product — m·u of the 24-bit velocity too:
    its top 18 bits take the block, m × the low 6 bits is a select-add in logic
    (``Plan.logic_low_bits`` = 8 on the ECP5; it took two before) — and the loss unit's e·r:
    16·3 + 1 + 4·4 + 1 + 1 = 67 (105 before both). The loss unit starts from stage 2's forward
    outputs (107 cycles, ``build.forward_cycles``; its pass is 108), leaving 32 cycles of
    stage 1's 139: the fastest one-error-a-cycle loss unit (P = 4, k = 2) takes 34 since its
    logit slice and its exp ROM's index are registered as well as its entries (32 with the
    entries alone), so it takes Q = 2 out lanes at P = 2 (31 cycles, its 2-port ROM in one
    block): stage 2 scales two errors a write (18
    multipliers), 66 + 1 + the loss unit's 2 = 69 blocks, and the tick is stage 1's pass + 2 =
    141."""
    from pipetrain.host.flow import compile_design

    res = compile_design(
        "mlp-digits", board="ulx3s-85f", lanes=(16, 4), formats="default", writers=()
    )
    plan = res.plan
    assert [s.lanes for s in plan.stages] == [16, 4]
    assert [[p.name for p in s.products] for s in plan.stages] == [
        ["fwd", "momentum", "lr_delta", "lr_x"],
        ["fwd", "gin", "momentum", "lr_delta", "lr_x"],
    ]
    assert [[p.name for p in s.products if p.per_stage] for s in plan.stages] == [
        ["lr_delta"],
        ["lr_delta"],
    ]
    assert [s.multipliers for s in plan.stages] == [49, 18]
    assert plan.multipliers == 67
    assert (plan.loss.exp_lanes, plan.loss.div_bits, plan.loss.out_lanes) == (2, 2, 2)
    assert plan.loss.cycles == 31 and plan.tick_cycles == 139 + 2
    assert plan.logic_low_bits == 8 and plan.operand_bits == 18
    mom = [p for s in plan.stages for p in s.products if p.name == "momentum"]
    assert [(p.a_bits, p.b_bits, p.blocks) for p in mom] == [(18, 18, 1)] * 2
    assert all(s.formats.u.bits == 24 for s in plan.stages)  # so the low piece is 6 bits
    assert res.fit["multipliers"] == {"needed": 69, "available": 156}


CASES = {
    # per lane fwd, momentum, lr_x (+ gin after stage 1), per stage lr_delta (ReLU: at the write)
    "mlp-digits": (lambda: _ir("mlp-digits"), TrainConfig(), (4, 1), [4 * 3 + 1, 5]),
    "mlp-digits-deep": (
        lambda: _ir("mlp-digits-deep"),
        TrainConfig(),
        (4, 3, 3, 1),
        [4 * 3 + 1, 3 * 4 + 1, 3 * 4 + 1, 5],
    ),
    "mlp-digits-wide": (
        lambda: _ir("mlp-digits-wide"),
        TrainConfig(),
        (4, 4, 1),
        [4 * 3 + 1, 4 * 4 + 1, 5],
    ),
    # Spike Compensation: + a·u and the b·lr product (b·lr·g per stage, then × x)
    "sc": (lambda: _ir("mlp-digits"), TrainConfig(mitigation="sc"), (4, 1), [4 * 5 + 2, 8]),
    # tanh/sigmoid: + LUT slope, derivative factor, g × factor; their lr·δ stays per lane (δ is
    # not a masked g); the identity output stage forms lr·g at the write
    "tanh": (_tanh_ir, TrainConfig(), (2, 5, 3), [2 * 7, 5 * 8, 3 * 4 + 1]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stage_multipliers_are_lanes_times_products(case):
    make, cfg, lanes, expected = CASES[case]
    ir = make()
    plan = build_plan(ir, cfg, lanes=lanes)
    assert [s.multipliers for s in plan.stages] == expected
    for s in plan.stages:
        want = stage_products(s, 18, plan.operand_bits, plan.logic_low_bits)
        assert s.products == want and all(p.blocks > 0 for p in s.products)
        shared = sum(1 for p in s.products if p.per_stage)
        assert s.multipliers == s.lanes * (len(s.products) - shared) + shared
        assert shared == (s.scaled_at_write and len(s.update.scaled_errors(s.formats.d)))
    assert plan.multipliers == sum(expected)
    # the max_multipliers search's counts are these products (any lanes)
    per = lane_multipliers(ir, cfg)
    assert [s.lanes * a + b for s, (a, b) in zip(plan.stages, per, strict=True)] == expected
    back = Plan.from_json(plan.to_json())
    assert back == plan and back.hash == plan.hash


def test_max_multipliers_counts_the_products():
    ir, cfg = _ir("mlp-digits"), TrainConfig()
    lanes = choose_lanes(ir, cfg, max_multipliers=66)
    plan = build_plan(ir, cfg, lanes=lanes)
    assert lanes == (16, 4) and plan.multipliers == 66 <= 66
    # one fewer: stage 2 drops to 3 lanes (4 row groups, 132 slots: 16·3 + 1 + 3·4 + 1 = 62)
    slower = choose_lanes(ir, cfg, max_multipliers=65)
    assert slower == (16, 3) and build_plan(ir, cfg, lanes=slower).multipliers == 62


def test_max_multipliers_counts_the_loss_units_out_lanes_on_the_board():
    """On the ULX3S, mlp-digits 11,2 has 43 multipliers by its products per lane (11·3 + 1 +
    2·4 + 1), but its loss unit needs Q = 2 out lanes there (stage 1's 204-cycle pass leaves
    31 cycles after stage 2's forward outputs at 173; one error a cycle takes 35, two 30), which
    adds a scaled-error multiplier in stage 2: 44 in all. ``--max-multipliers 43`` must not give
    it (it did: the search counted products per lane only); it takes the next tick, 8,2 (34)."""
    from pipetrain.host.flow import compile_design

    res = compile_design(
        "mlp-digits", board="ulx3s-85f", max_multipliers=43, formats="default", writers=()
    )
    plan = res.plan
    assert [s.lanes for s in plan.stages] == [8, 2] and plan.multipliers == 34
    at_44 = compile_design(
        "mlp-digits", board="ulx3s-85f", max_multipliers=44, formats="default", writers=()
    ).plan
    assert [s.lanes for s in at_44.stages] == [11, 2] and at_44.multipliers == 44
    assert at_44.loss.out_lanes == 2 and at_44.stages[1].error_beat == 2
    assert at_44.loss.cycles == 30 and at_44.tick_cycles == 204 + 2


@pytest.mark.parametrize(
    ("edit", "named", "rule"),
    [
        (lambda d: d["stages"][0].update(multipliers=48), "stages[0].multipliers", "= 49"),
        (lambda d: d.update(multipliers=64), "multipliers", "= 66"),
        # a product dropped by hand: the list must be stage_products'
        (lambda d: d["stages"][1]["products"].pop(), "stages[1].products", "stage_products"),
    ],
)
def test_a_hand_edited_multiplier_count_is_refused(edit, named, rule):
    plan = build_plan(_ir("mlp-digits"), TrainConfig(), lanes=(16, 4))
    doc = json.loads(plan.to_json())
    edit(doc)
    with pytest.raises(PlanError) as info:
        Plan.from_json(json.dumps(doc))
    msg = str(info.value)
    assert msg.startswith(f"plan field {named}") or named in msg, msg
    assert rule in msg, msg


def test_a_plan_from_before_products_keeps_its_count():
    """A plan without ``products`` (written before them) carries the older per-lane count
    (forward, update, momentum and lr scaling: 3, + 1 with an input gradient) and loads
    unchanged; the products' count is refused there."""
    plan = build_plan(_ir("mlp-digits"), TrainConfig(), lanes=(16, 4))
    doc = json.loads(plan.to_json())
    for st in doc["stages"]:
        del st["products"]
    with pytest.raises(PlanError, match=r"stages\[0\]\.multipliers.*= 48"):
        Plan.from_json(json.dumps(doc))
    doc["stages"][0]["multipliers"], doc["stages"][1]["multipliers"] = 48, 16
    doc["multipliers"] = 64
    back = Plan.from_json(json.dumps(doc))
    assert back.multipliers == 64 and back.stages[0].products is None
    assert json.loads(back.to_json()) == doc  # loaded exactly


def test_operand_registers_are_the_boards_and_round_trip():
    """``Stage.operand_registers``: 1 in every Linear stage of an ECP5 board plan (each pass one
    two cycles longer: ``pass_cycles`` = slots − 1 + 2 + write stage 6, the update at 5 and its
    data registered before the weight banks), none on the iCE40 and
    without a board (absent from the JSON, so those plans keep their hash); the plan
    round-trips exactly and a hand edit is refused naming the field."""
    from pipetrain.host.flow import compile_design

    def plan_of(board):
        kw = {"board": board} if board else {"lanes": (32, 10)}
        return compile_design("mlp-digits", formats="default", writers=(), **kw).plan

    ecp5, ice, none = plan_of("ulx3s-85f"), plan_of("icebreaker"), plan_of(None)
    assert [s.operand_registers for s in ecp5.stages] == [2, 2]
    assert [(s.update_stage, s.write_stage, s.pass_cycles) for s in ecp5.stages] == [
        (6, 8, 65 - 1 + 2 + 8),
        (6, 8, 33 - 1 + 2 + 8),
    ]
    assert [s.pass_cycles for s in none.stages] == [70, 38]  # the same lanes without them
    assert ecp5.tick_cycles == 74 + 2
    assert ecp5.loss.operand_registers == 1 and ice.loss.operand_registers is None
    for plan in (ice, none):
        assert all(s.operand_registers is None for s in plan.stages)
        assert "operand_registers" not in plan.to_json()
    assert Plan.from_dict(json.loads(ecp5.to_json())) == ecp5
    edited = json.loads(ecp5.to_json())
    edited["stages"][0]["operand_registers"] = 3
    with pytest.raises(PlanError, match=r"stages\[0\]\.operand_registers = 3"):
        Plan.from_dict(edited)
    edited["stages"][0]["operand_registers"] = 1  # in range, but the stages are P = 2's
    with pytest.raises(PlanError, match=r"stages\[0\]\.update_stage = 6: must be"):
        Plan.from_dict(edited)
    edited["stages"][0]["operand_registers"] = None
    with pytest.raises(PlanError, match=r"stages\[0\]\.update_stage = 6: must be"):
        Plan.from_dict(edited)
    edited = json.loads(ecp5.to_json())
    # the loss unit's geometry is R = 1's: without R (5 cycles fewer) one error a cycle
    # fits the slack, so the plan's Q = 2 out lanes are not what build derives
    edited["loss"]["operand_registers"] = None
    with pytest.raises(PlanError, match=r"loss\.out_lanes = 2: must be what build derives"):
        Plan.from_dict(edited)


def test_one_and_two_operand_registers_round_trip():
    """``Stage.operand_registers`` = 2 (the ECP5 board's, ``Board.operand_registers``) against
    1 (an experiment's board): every product two stages later (``update_stage`` 6, not 5), the
    write data twice registered (``write_stage`` 8, not 6): two cycles more per pass than with
    1; the plan round-trips exactly, JSON and hash."""
    import dataclasses

    from pipetrain.compiler.targets import get_board
    from pipetrain.host.flow import compile_design

    assert get_board("ulx3s-85f").operand_registers == 2
    board = dataclasses.replace(get_board("ulx3s-85f"), operand_registers=1)
    one = compile_design("mlp-digits", board=board, formats="default", writers=()).plan
    plan = compile_design("mlp-digits", board="ulx3s-85f", formats="default", writers=()).plan
    assert [(s.update_stage, s.write_stage) for s in one.stages] == [(5, 6), (5, 6)]
    assert [s.lanes for s in plan.stages] == [s.lanes for s in one.stages]
    assert [s.operand_registers for s in plan.stages] == [2, 2]
    assert [(s.update_stage, s.write_stage) for s in plan.stages] == [(6, 8), (6, 8)]
    assert [s.pass_cycles for s in plan.stages] == [s.pass_cycles + 2 for s in one.stages]
    assert plan.tick_cycles == one.tick_cycles + 2
    text = plan.to_json()
    back = Plan.from_dict(json.loads(text))
    assert back == plan and back.to_json() == text and back.hash == plan.hash
