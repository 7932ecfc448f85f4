"""Column lanes (``Stage.col_lanes``, input-dimension folding of stage 1): k physical lanes share
each row's columns, ``⌈(N+1)/k⌉`` slots a row group. The plan counts L·k lanes (banks, seeds,
multipliers) and keeps its JSON and hash at k = 1; the golden model's draw order follows the
physical lanes (numerics §6); the RTL is bit-exact with it in Verilator with padding columns
(k ∤ N + 1), Spike Compensation and the ECP5's operand registers (the k-sum's own register)."""

from __future__ import annotations

import pytest
from pipetrain.compiler.build import PlanError
from pipetrain.compiler.plan import Plan
from pipetrain.sim.golden import GoldenModel
from pipetrain.sim.tb.network import build_network, check_network
from tiny_net import tiny, tiny_stream


def test_column_lanes_geometry_and_round_trip():
    base, _, _ = tiny()
    plan, _, _ = tiny(col_lanes=(3,))
    s0, s = base.stages[0], plan.stages[0]
    assert "col_lanes" not in base.to_json() and s0.column_lanes == 1
    # 6 inputs + bias = 7 columns over 3 column lanes: 3 slots a group (2 padding columns)
    assert (s.col_lanes, s.group_slots, s.mac_lanes) == (3, 3, 6)
    assert (s0.cycles_per_tick, s.cycles_per_tick) == (3 * 7, 3 * 3)
    assert s.pass_cycles == s0.pass_cycles - 12
    assert len(s.lfsr_seeds) == 6 and s.multipliers == 3 * s0.multipliers
    w = s.memory("w")
    assert (w.banks, w.words) == (6, 9)
    xs = s.memory("xstash")
    assert (xs.banks, xs.words, xs.bank_names) == (3, s0.memory("xstash").words, ("xstash0",
            "xstash1", "xstash2"))  # fmt: skip
    assert plan.stages[1:] == base.stages[1:]
    back = Plan.from_json(plan.to_json())
    assert back == plan and back.hash == plan.hash != base.hash


@pytest.mark.parametrize(
    "where, kw, text",
    [
        ("stage 2", dict(col_lanes=(1, 2)), "it has an input gradient"),
        (
            "stage 1",
            dict(col_lanes=(8,)),
            r"8 column lanes must be in 1\.\.7 \(one column of its 6 inputs and bias per "
            r"column lane at most\); give K ≤ 7 in that stage's --lanes LxK",
        ),
        ("stage 1", dict(col_lanes=(2,), single_port=(1,), lanes=(1, 3, 2)), "single-port"),
    ],
)
def test_column_lanes_refused_where_the_hdl_has_none(where, kw, text):
    with pytest.raises(PlanError, match=text) as e:
        tiny(**kw)
    assert where in str(e.value)


@pytest.mark.parametrize(
    "k, kw",
    [
        (2, dict()),  # 4 slots, one padding column
        (3, dict(operand_registers=2, mitigation="sc+lwp", lr=0.3)),  # k-sum register, clamps
        (7, dict(operand_registers=1)),  # one slot a group: the bias column in lane 6
    ],
)
def test_column_lanes_are_bit_exact_in_verilator(k, kw):
    """The tiny net with stage 1 over k column lanes (padding lanes and inference samples
    mixed in): weights, velocities, results and clamp counters equal the golden model's."""
    plan, model, cfg = tiny(col_lanes=(k,), **kw)
    x, y, train = tiny_stream()
    xq = GoldenModel(plan, model, cfg).quantise_input(x)
    rep = check_network(plan, model, xq, y.tolist(), train, design=build_network(plan))
    assert rep.bit_exact, [m.describe() for m in rep.mismatches[:5]]
    assert rep.samples == len(x)
    # one sample a tick: the plan's (the loss unit from stage 3's forward outputs on)
    assert rep.cycles_per_sample == plan.ideal_cycles_per_sample == plan.tick_cycles


def test_the_hdl_refuses_column_lanes_it_does_not_build():
    """A hand-made plan with column lanes on a stage with an input gradient: a clear error
    before anything is elaborated (the compiler never makes one)."""
    import dataclasses

    from pipetrain.hdl.stage import check_stage

    plan, _, _ = tiny()
    st = dataclasses.replace(plan.stages[1], col_lanes=2)
    with pytest.raises(NotImplementedError, match="stage 2: 2 column lanes are built only"):
        check_stage(st)
    check_stage(tiny(col_lanes=(3,))[0].stages[0])  # stage 1: built
