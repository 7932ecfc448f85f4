"""``Plan.momentum_in_logic``: every Linear stage forms ``m·u`` with shifts and adders (the
momentum's canonical signed digits, its adder tree over the lanes' operand registers) instead of
a DSP block. The plan drops the ``momentum`` product (one multiplier a lane fewer) and keeps its
JSON and hash when the option is off; the RTL stays bit-exact with the golden model (Verilator),
whose arithmetic does not change (the same integer ``m·u``)."""

from __future__ import annotations

import pytest
from pipetrain.compiler.build import hard_multipliers
from pipetrain.compiler.plan import Plan, csd
from pipetrain.sim.golden import GoldenModel
from pipetrain.sim.tb.network import build_network, check_network
from tiny_net import tiny, tiny_stream


def test_momentum_in_logic_drops_one_multiplier_a_lane_and_round_trips():
    base, _, _ = tiny(operand_registers=2)
    plan, _, _ = tiny(operand_registers=2, momentum_in_logic=True)
    assert base.momentum_in_logic is None and "momentum_in_logic" not in base.to_json()
    assert plan.momentum_in_logic is True
    assert len(csd(plan.stages[0].update.momentum.value)) == 9  # 0.9 at 18 significant bits
    for s0, s in zip(base.stages, plan.stages, strict=True):
        names0, names = [p.name for p in s0.products], [p.name for p in s.products]
        assert names0.count("momentum") == 1 and "momentum" not in names
        assert [n for n in names0 if n != "momentum"] == names
        assert s0.multipliers - s.multipliers == s.lanes
    lanes = sum(s.lanes for s in plan.stages)  # 2 + 3 + 2: one 18×18 block each
    assert hard_multipliers(base) - hard_multipliers(plan) == lanes == 7
    back = Plan.from_json(plan.to_json())
    assert back == plan and back.hash == plan.hash != base.hash


@pytest.mark.parametrize("operand_registers", [0, 2])
def test_momentum_in_logic_is_bit_exact_in_verilator(operand_registers):
    """The tiny net (three stages, padding lanes, inference samples mixed in) with m·u in logic:
    with no operand register (the tree in one cycle) and the ECP5's two (spread over three)."""
    plan, model, cfg = tiny(operand_registers=operand_registers, momentum_in_logic=True)
    x, y, train = tiny_stream()
    xq = GoldenModel(plan, model, cfg).quantise_input(x)
    rep = check_network(plan, model, xq, y.tolist(), train, design=build_network(plan))
    assert rep.bit_exact, [m.describe() for m in rep.mismatches[:5]]
    assert rep.samples == len(x)
