"""A short-tick plan in Verilator: the loss unit runs in parallel (exp lanes, two quotient bits a
cycle) and no longer sets the tick; the network stays bit-exact with the golden model and
back-to-back samples are exactly the plan's tick apart (docs/architecture.md §3.3, §3.8)."""

from __future__ import annotations

import pytest
from pipetrain.compiler.build import pass_cycles
from pipetrain.host.flow import compile_design
from pipetrain.sim.golden import GoldenModel
from pipetrain.sim.stimulus import plan_samples
from pipetrain.sim.tb.network import build_network, check_network, run_network


def _bit_exact_one_tick_apart(plan, model, x, y: list[int]) -> None:
    """The network in the RTL simulator: bit-exact with the golden model (results, weights,
    velocities, counters) and, in the steady state, results exactly one tick apart."""
    design = build_network(plan)
    rep = check_network(plan, model, x, y, design=design)
    assert rep.bit_exact, [m.describe() for m in rep.mismatches[:5]]
    rtl = run_network(design, x, y, init=GoldenModel(plan, model).memories())
    rc, n, S = rtl.result_cycles, len(y), len(plan.stages)
    steady = [b - a for a, b in zip(rc[1 : n - 2 * S], rc[2:], strict=False)]
    assert len(steady) >= n - 2 * S - 1 and set(steady) == {plan.ideal_cycles_per_sample}


@pytest.mark.slow
def test_mlp_digits_at_138_multipliers_runs_at_the_slowest_pass():
    """``mlp-digits --max-multipliers 138`` (lanes 32, 10: 32·3 + 1 + 10·4 + 1 multipliers, the
    scaled error lr·g once per stage at the error buffer's write — its one-cycle-later write
    must land before stage 1's one row group is read, G = 1; 178 with lr·δ per lane): stage
    2's pass (38 cycles) and the
    one-logit-a-cycle loss unit (53 cycles) made a 93-cycle tick; the plan now gives the loss
    unit 5 exp lanes and 2 quotient bits a cycle (⌈10/5⌉ + ⌈17/2⌉ + 10 + 5 + ⌈log2 10⌉ = 30
    cycles ≤ the 32 of slack; 2 exp lanes would take 33), so the tick is stage 1's 70-cycle
    pass + 2 control cycles = 72. Verilator: bit-exact (results, weights, velocities,
    counters) and results exactly 72 cycles apart while samples stream."""
    res = compile_design("mlp-digits", seed=0, formats="default", max_multipliers=138, writers=())
    plan, model = res.plan, res.model
    s1, s2 = plan.stages
    assert (s1.lanes, s2.lanes) == (32, 10)
    assert (pass_cycles(s1), pass_cycles(s2)) == (70, 38)
    assert (plan.loss.exp_lanes, plan.loss.div_bits, plan.loss.cycles) == (5, 2, 30)
    assert plan.tick_cycles == plan.ideal_cycles_per_sample == 70 + 2
    x, y = plan_samples(plan, 24, "digits", 0)
    _bit_exact_one_tick_apart(plan, model, x, y.tolist())


@pytest.mark.parametrize("operand_registers", [0, 2])
def test_loss_unit_writing_error_words_is_bit_exact(operand_registers):
    """10 → 6 → 10 at lanes 2, 10: stage 1's pass leaves the loss unit 26 cycles after stage
    2's; one error a cycle takes at least ⌈10/10⌉ + ⌈17/2⌉ + 10 + 5 + ⌈log2 10⌉ = 29 (32 with
    the ECP5's operand registers), so the plan gives the loss unit Q = 5 out lanes (P = 5,
    k = 2: 22 cycles, 25) — five products ``e_j·r`` and one write of five errors into stage 2's
    error buffer, two writes a sample, whose scaled error lr·g then takes five multipliers —
    and the tick is stage 1's pass again (compiler/loss_unit.py). Verilator: bit-exact with the
    golden model (results, weights, velocities, counters) over a stream of samples, results
    exactly one tick apart; ``operand_registers`` = 2 is the ECP5 boards' pipeline (the
    MULT18X18D's registers in fabric form here)."""
    import warnings

    import torch
    from pipetrain.compiler.build import FormatSpec, build_plan
    from pipetrain.compiler.config import TrainConfig
    from pipetrain.compiler.ir import LayerIR, NetworkIR
    from torch import nn

    ir = NetworkIR("q", 10, (LayerIR("0", 10, 6, "relu"), LayerIR("2", 6, 10)), "cross_entropy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # uncalibrated formats
        plan = build_plan(
            ir, TrainConfig(), FormatSpec.default(2), [2, 10], operand_registers=operand_registers
        )
    lu, (s1, s2) = plan.loss, plan.stages
    R = 5 if operand_registers else 0  # the loss unit's R + 4 with R = 1
    assert (lu.exp_lanes, lu.div_bits, lu.out_lanes, lu.cycles) == (5, 2, 5, 22 + R)
    assert s2.error_beat == 5 and s1.error_beat is None
    assert pass_cycles(s1) - pass_cycles(s2) == 26  # the slack; serial (10, 2): 29 + R
    assert plan.tick_cycles == pass_cycles(s1) + 2  # the loss unit is off the tick
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(10, 6), nn.ReLU(), nn.Linear(6, 10))
    gen = torch.Generator().manual_seed(5)
    fx = s1.formats.x
    x = torch.randint(-(1 << fx.frac), 1 << fx.frac, (20, 10), generator=gen)
    y = torch.randint(0, 10, (20,), generator=gen).tolist()
    _bit_exact_one_tick_apart(plan, model, x, y)


def _plan_6_44_18_3(lanes: list[int], operand_registers: int):
    """6 → 44 → 18 → 3 (ReLU, cross-entropy) planned at ``lanes`` with uncalibrated default
    formats."""
    import warnings

    from pipetrain.compiler.build import FormatSpec, build_plan
    from pipetrain.compiler.config import TrainConfig
    from pipetrain.compiler.ir import LayerIR, NetworkIR

    layers = (LayerIR("0", 6, 44, "relu"), LayerIR("2", 44, 18, "relu"), LayerIR("4", 18, 3))
    ir = NetworkIR("q", 6, layers, "cross_entropy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # uncalibrated formats
        return build_plan(
            ir, TrainConfig(), FormatSpec.default(3), lanes, operand_registers=operand_registers
        )


def _bit_exact_6_44_18_3(plan) -> None:
    """16 random samples through :func:`_plan_6_44_18_3`'s network in RTL: bit-exact with the
    golden model, results one tick apart."""
    import torch
    from torch import nn

    torch.manual_seed(4)
    model = nn.Sequential(
        nn.Linear(6, 44), nn.ReLU(), nn.Linear(44, 18), nn.ReLU(), nn.Linear(18, 3)
    )
    gen = torch.Generator().manual_seed(6)
    fx = plan.stages[0].formats.x
    x = torch.randint(-(1 << fx.frac), 1 << fx.frac, (16, 6), generator=gen)
    y = torch.randint(0, 3, (16,), generator=gen).tolist()
    _bit_exact_one_tick_apart(plan, model, x, y)


@pytest.mark.parametrize("operand_registers", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_split_input_gradient_lands_before_the_next_tick(operand_registers):
    """6 → 44 → 18 → 3 at lanes 11, 18, 3: stage 2's input gradient sums 18 lanes, more than
    ``TREE_SPLIT_LANES``, so with operand registers its tree is registered half-way and gin
    leaves at S5+P instead of S4+P (hdl/mac.py); stage 2's pass (45 slots) is the tick's
    longest, so its last gin reaches stage 1's error buffer (4 row groups) at the tightest
    point of the tick, read at S0 of the next tick's first slot. Simulator: bit-exact with
    the golden model (results, weights, velocities, counters), results one tick apart."""
    from pipetrain.compiler.build import TICK_OVERHEAD, gin_stage, input_gradient_split

    plan = _plan_6_44_18_3([11, 18, 3], operand_registers)
    s1, s2, s3 = plan.stages
    P = operand_registers
    assert input_gradient_split(s2.lanes, P) and not input_gradient_split(s3.lanes, P)
    assert gin_stage(s2.lanes, P) == 5 + P < s2.write_stage == 4 + 2 * P
    assert s1.row_groups == 4 and pass_cycles(s2) == 45 + 5 + 2 * operand_registers
    assert plan.tick_cycles == pass_cycles(s2) + TICK_OVERHEAD  # stage 2's pass is the tick
    _bit_exact_6_44_18_3(plan)


def test_early_stash_read_only_where_the_stash_is_block_ram_is_bit_exact():
    """``compiler.build.early_stash_read``: at lanes 4,18,3 with operand registers (P = 2)
    stage 2's ``xstash`` (55 × 64: 11 words of 4 values, 5 entries) is planned in block RAM
    and read a cycle ahead; stage 3's (3 × 288) is LUT RAM and read at S0 as without operand
    registers; stage 1's has one value a word. The whole network in RTL is bit-exact with the
    golden model, results one tick apart (a mutation of the early read's wrap flag fails it)."""
    from pipetrain.compiler.build import early_stash_read

    plan = _plan_6_44_18_3([4, 18, 3], 2)
    s2, s3 = plan.stages[1:]
    kinds = [next(m.kind for m in s.memories if m.name == "xstash") for s in plan.stages]
    assert (s2.x_lanes, s3.x_lanes) == (4, 18) and kinds[1:] == ["bram", "lutram"]
    assert [early_stash_read(s) for s in plan.stages] == [False, True, False]
    _bit_exact_6_44_18_3(plan)


def test_radix_divider_loss_unit_sets_a_shorter_tick_bit_exact():
    """6 → 12 → 10 at lanes 6×2,10 with operand registers: the column lanes make stage 1's pass
    17 cycles, so the loss unit sets the tick and takes its fastest form (``loss_fastest``):
    10 exp and out lanes and the radix-16 divider (``div_bits`` 4: two chained quotient bits,
    then 4 a cycle by 15 parallel compares, 5 cycles for r's 17 bits; 9 with k = 2), 21 cycles
    (25 with k = 2) — tick 44. The whole network in RTL is bit-exact with the golden model and
    its results exactly 44 cycles apart."""
    import warnings

    import torch
    from pipetrain.compiler.build import FormatSpec, build_plan
    from pipetrain.compiler.config import TrainConfig
    from pipetrain.compiler.ir import LayerIR, NetworkIR
    from pipetrain.compiler.loss_unit import divider_cycles
    from torch import nn

    ir = NetworkIR("q", 6, (LayerIR("0", 6, 12, "relu"), LayerIR("2", 12, 10)), "cross_entropy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # uncalibrated formats
        plan = build_plan(
            ir, TrainConfig(), FormatSpec.default(2), [6, 10], operand_registers=2,
            col_lanes=(2, 1), loss_fastest=True,
        )  # fmt: skip
    lu = plan.loss
    assert (lu.exp_lanes, lu.div_bits, lu.out_lanes, lu.cycles) == (10, 4, 10, 21)
    assert (divider_cycles(lu.recip_frac, 4), divider_cycles(lu.recip_frac, 2)) == (5, 9)
    assert plan.tick_cycles == plan.ideal_cycles_per_sample == 44
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 10))
    gen = torch.Generator().manual_seed(5)
    fx = plan.stages[0].formats.x
    x = torch.randint(-(1 << fx.frac), 1 << fx.frac, (16, 6), generator=gen)
    y = torch.randint(0, 10, (16,), generator=gen).tolist()
    _bit_exact_one_tick_apart(plan, model, x, y)
