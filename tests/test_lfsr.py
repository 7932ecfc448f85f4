"""The stochastic-rounding LFSR (docs/numerics.md §6): polynomial, steps, fast generator."""

import pytest
from pipetrain.compiler.build import LFSR_POLY, build_plan
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.ir import LayerIR, NetworkIR
from pipetrain.sim.lfsr import (
    LaneLFSRs,
    draw,
    gf2_mulmod,
    multiplicative_order_is_full,
    prime_factors,
    step,
    x_pow,
)


def test_plan_polynomial_is_x32_x22_x2_x_1():
    ir = NetworkIR("t", 4, (LayerIR("0", 4, 3),))
    plan = build_plan(ir, TrainConfig())
    assert plan.lfsr_poly == LFSR_POLY == (1 << 32) | (1 << 22) | 0b111
    assert (plan.lfsr_width, plan.lfsr_leap, plan.round_bits) == (32, 32, 16)


def test_polynomial_is_primitive():
    """x has order 2^32 − 1: x^(2^32−1) ≡ 1 and x^((2^32−1)/q) ≢ 1 for q | 2^32 − 1."""
    order = (1 << 32) - 1
    assert prime_factors(order) == [3, 5, 17, 257, 65537]
    assert x_pow(order, LFSR_POLY) == 1
    for q in (3, 5, 17, 257, 65537):
        assert x_pow(order // q, LFSR_POLY) != 1
    assert multiplicative_order_is_full(LFSR_POLY)
    # a reducible polynomial fails: x^32 + 1 = (x + 1)^32
    assert not multiplicative_order_is_full((1 << 32) | 1)


def test_step_is_multiplication_by_x():
    assert step(1, LFSR_POLY) == 2
    # bit 31 set: shifted out and the feedback taps x^22 + x^2 + x + 1 come in
    assert step(0x8000_0000, LFSR_POLY) == (1 << 22) | 0b111
    assert step(0x8000_0001, LFSR_POLY) == (1 << 22) | 0b101
    s = 0x1234_5678
    assert step(s, LFSR_POLY) == gf2_mulmod(s, 2, LFSR_POLY)
    # one draw = 32 steps = multiplication by x^32
    assert draw(s, LFSR_POLY) == gf2_mulmod(s, x_pow(32, LFSR_POLY), LFSR_POLY)
    assert draw(1, LFSR_POLY) == x_pow(32, LFSR_POLY) == (1 << 22) | 0b111


@pytest.mark.parametrize("count", [1, 2, 3, 7, 64, 1000])
def test_fast_generator_equals_step_by_step(count):
    seeds = [1, 0xDEAD_BEEF, 0xFFFF_FFFF, 0x8000_0000]
    gen = LaneLFSRs(seeds, LFSR_POLY)
    first = gen.draws(count)
    second = gen.draws(5)  # continues where the first block ended
    assert first.shape == (4, count) and gen.draws_taken == count + 5
    for lane, s in enumerate(seeds):
        seq = []
        for _ in range(count + 5):
            s = draw(s, LFSR_POLY)
            seq.append(s)
        assert [int(v) for v in first[lane]] + [int(v) for v in second[lane]] == seq


def test_generator_rejects_zero_seed():
    with pytest.raises(ValueError, match="non-zero"):
        LaneLFSRs([0], LFSR_POLY)


def test_lfsr_leap_16_is_a_plan_setting_with_its_own_hash():
    """``--lfsr-leap 16`` (docs/numerics.md §6): the plan's draw is 16 steps, recorded in
    ``plan.train`` (absent at the default 0, so other plans keep their JSON and hash); the
    16-step draw visits every state (gcd(16, 2^32 − 1) = 1), and the golden draw is x^16."""
    import json

    from pipetrain.compiler.build import PlanError
    from pipetrain.compiler.plan import Plan

    ir = NetworkIR("t", 4, (LayerIR("0", 4, 3),))
    base = build_plan(ir, TrainConfig())
    plan = build_plan(ir, TrainConfig(lfsr_leap=16))
    assert (base.lfsr_leap, plan.lfsr_leap) == (32, 16)
    assert "lfsr_leap" not in base.train and plan.train["lfsr_leap"] == 16
    back = Plan.from_json(plan.to_json())
    assert back == plan and back.hash == plan.hash != base.hash
    assert draw(1, LFSR_POLY, 32, 16) == x_pow(16, LFSR_POLY)
    # a plan whose leap disagrees with its training settings is refused on load
    bad = json.loads(plan.to_json())
    bad["lfsr_leap"] = 32
    with pytest.raises(PlanError, match="lfsr_leap"):
        Plan.from_json(json.dumps(bad))
    # Spike Compensation draws two 16-bit numbers a slot: 16 steps are too few
    with pytest.raises(PlanError, match="--lfsr-leap 16: a draw must give the 32 bits"):
        build_plan(ir, TrainConfig(lfsr_leap=16, mitigation="sc"))
    with pytest.raises(PlanError, match="give --lfsr-leap 16 or more"):
        build_plan(ir, TrainConfig(lfsr_leap=8))
    # a longer leap than the width is allowed (and recorded): 48 steps a draw
    assert build_plan(ir, TrainConfig(lfsr_leap=48)).lfsr_leap == 48


def test_leap_16_takes_its_xor_inputs_out_of_the_logic_estimate():
    """``fit.logic_cells`` prices a lane at the 32-step leap's 207 XOR inputs; at 16 steps
    (98) each physical lane costs 109 × ``LogicModel.lfsr_entry`` cells fewer (ECP5), and
    the iCE40 model, not measured, none."""
    from pipetrain.compiler.fit import LOGIC_MODELS, logic_cells
    from pipetrain.compiler.lfsr_map import leap_entries
    from pipetrain.compiler.targets import get_board

    assert (leap_entries(LFSR_POLY, 32, 32), leap_entries(LFSR_POLY, 32, 16)) == (207, 98)
    ir = NetworkIR("t", 8, (LayerIR("0", 8, 6, "relu"), LayerIR("2", 6, 3)))
    base = build_plan(ir, TrainConfig(), lanes=[3, 2])
    lean = build_plan(ir, TrainConfig(lfsr_leap=16), lanes=[3, 2])
    ecp5, ice = get_board("ulx3s-85f"), get_board("icebreaker")
    saved = {
        k: logic_cells(base, ecp5)[k] - logic_cells(lean, ecp5)[k] for k in ("stage1", "stage2")
    }
    per_lane = 109 * LOGIC_MODELS["ecp5"].lfsr_entry
    assert abs(saved["stage1"] - 3 * per_lane) <= 1 and abs(saved["stage2"] - 2 * per_lane) <= 1
    assert logic_cells(base, ice) == logic_cells(lean, ice)
