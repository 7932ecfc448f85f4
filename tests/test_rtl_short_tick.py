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
    design = build_network(plan)
    n = 24
    x, y = plan_samples(plan, n, "digits", 0)
    rep = check_network(plan, model, x, y.tolist(), design=design)
    assert rep.bit_exact, [m.describe() for m in rep.mismatches[:5]]
    rtl = run_network(design, x, y.tolist(), init=GoldenModel(plan, model).memories())
    rc, S = rtl.result_cycles, len(plan.stages)
    steady = [b - a for a, b in zip(rc[1 : n - 2 * S], rc[2:], strict=False)]
    assert len(steady) >= n - 2 * S - 1 and set(steady) == {plan.ideal_cycles_per_sample}
