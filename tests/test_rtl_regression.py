"""Randomised RTL regression: many small networks, each built, simulated and compared.

Default run: :data:`~pipetrain.sim.tb.regress.SMOKE_CASES` — depths 1–4, several lane counts,
``pb`` and ``sequential``, every mitigation (none, sc, lwp, sc+lwp), both roundings, both
losses, relu/leaky_relu/identity, default/narrow/wide formats, inference-only samples mixed in —
and ``CI_RANDOM_CASES`` random cases (layer sizes ≤ ``CI_MAX_SIZE``, lanes ≤ ``CI_MAX_LANES``)
drawn from the run's seed (:func:`~pipetrain.sim.tb.regress.regress_seed`:
``PIPETRAIN_REGRESS_SEED``, else the commit; the pytest header and summary print it). With
``--runslow``: 12 more random cases with sizes up to 12 (seed 1). Each case costs one Verilator
build (≈ 15–40 s, cached by plan and HDL source hash) and a simulation of a few seconds. A
failing case names the seed and the command that reruns it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from pipetrain.hdl.graph import stage_graph
from pipetrain.sim.tb.network import check_network
from pipetrain.sim.tb.regress import (
    BREADTH_CASES,
    CI_MAX_LANES,
    CI_MAX_SIZE,
    CI_RANDOM_CASES,
    OPERAND_REGISTER_CASES,
    REGRESS_SEED_ENV,
    SMOKE_CASES,
    Case,
    prepare,
    random_cases,
    regress_seed,
)

SEED, SEED_SOURCE = regress_seed()
SEEDED_CASES = random_cases(
    CI_RANDOM_CASES, seed=SEED, max_size=CI_MAX_SIZE, max_lanes=CI_MAX_LANES
)
SLOW_CASES = random_cases(12, seed=1)
HERE = "tests/test_rtl_regression.py"


def _check(case: Case) -> None:
    plan, model, x, labels, train = prepare(case)
    rep = check_network(plan, model, x, labels, train)
    assert rep.bit_exact, (
        f"{case.name}: {len(rep.mismatches)} mismatches; first: "
        f"{rep.first.describe() if rep.first else '?'} ({rep.localisation})"
    )
    n = case.samples
    assert rep.extra["samples_trained"] == sum(train)
    if plan.schedule == "pb":
        # every sample enters one tick after the previous; the flush ends after the last
        # sample's last backward (numerics §7; span = 2S for global, hdl/graph.py)
        assert rep.extra["ticks"] == n + stage_graph(plan).span - 1
        if plan.ideal_cycles_per_sample >= 50:
            # throughput within 10 % of the plan; on tinier ticks the plan's fixed per-tick
            # overhead estimate can be short by a few cycles (measured: +5 of 29 with LWP)
            assert rep.cycles_per_sample <= 1.10 * plan.ideal_cycles_per_sample
    if case.formats == "narrow" and case in SMOKE_CASES:
        # the narrow set is there to exercise the saturation counters (compared above)
        assert sum(rep.extra["saturations"]) > 0


def _check_reproducibly(case: Case, command: str) -> None:
    """:func:`_check`, with the case and the command that reruns it added to any failure."""
    try:
        _check(case)
    except BaseException as exc:
        exc.add_note(f"regression case {case}\nreproduce: {command}")
        raise


@pytest.mark.parametrize("case", SMOKE_CASES, ids=[c.name for c in SMOKE_CASES])
def test_smoke_case_bit_exact(case):
    _check_reproducibly(case, f'pytest "{HERE}::test_smoke_case_bit_exact[{case.name}]"')


@pytest.mark.parametrize(
    "case", OPERAND_REGISTER_CASES, ids=[c.name for c in OPERAND_REGISTER_CASES]
)
def test_operand_registers_bit_exact(case):
    """The multipliers' operand registers (``Stage.operand_registers`` = P = 1, the ECP5
    board's plans; 2 in the ``-opr2`` cases) move every product and what follows it P stages
    later, the write data is registered P times more before the weight banks: 2·P cycles more
    per pass; the integers stay those of the golden model, and the plan's pass and tick cycles
    follow (checked in :func:`_check` and here against the same case without them)."""
    _check_reproducibly(case, f'pytest "{HERE}::test_operand_registers_bit_exact[{case.name}]"')
    plan = prepare(case)[0]
    base = prepare(replace(case, operand_registers=0))[0]
    P = case.operand_registers
    for st, st0 in zip(plan.stages, base.stages, strict=True):
        assert st.operand_registers == P and st0.operand_registers is None
        assert st.update_stage == st0.update_stage + P
        assert st.write_stage == st0.write_stage + 2 * P  # and the write data registered
        assert st.pass_cycles == st0.pass_cycles + 2 * P
    assert plan.tick_cycles >= base.tick_cycles


@pytest.mark.parametrize("name", ["d4-local-h2", "d5-inter-d1", "d5-inter-sum-h2"])
def test_heads_bit_exact_under_backpressure(name):
    """The local and interlocking smoke designs (their builds are cached by the smoke cases)
    with random valid/ready on every stream: results, memories, counters and head_correct stay
    exact."""
    case = next(c for c in SMOKE_CASES if c.name == name)
    plan, model, x, labels, train = prepare(case)
    rep = check_network(plan, model, x, labels, train, valid_prob=0.6, ready_prob=0.5, seed=3)
    assert rep.bit_exact, rep.first.describe() if rep.first else rep.localisation
    assert len(rep.extra["head_correct"]) == 2 and rep.extra["handshakes"]


@pytest.mark.slow  # one Verilator build each (≈ 30–60 CPU-s)
@pytest.mark.parametrize("case", BREADTH_CASES, ids=[c.name for c in BREADTH_CASES])
def test_heads_breadth_bit_exact_under_backpressure(case):
    """Local and interlocking (d = 1, 2; ``only``, ``sum``; K = 2–4; heads of 1 and 2 stages;
    depth up to 8; ``pb`` and ``sequential``) with random valid/ready: results, memories,
    counters and head_correct equal the golden model's; under ``pb`` the ticks are the
    stream's plus the span."""
    plan, model, x, labels, train = prepare(case)
    graph = stage_graph(plan)
    assert graph.K == len(case.blocks) + 1  # the heads are built (not compiled as global)
    rep = check_network(plan, model, x, labels, train, valid_prob=0.6, ready_prob=0.5, seed=4)
    assert rep.bit_exact, rep.first.describe() if rep.first else rep.localisation
    assert len(rep.extra["head_correct"]) == graph.K - 1
    assert rep.extra["samples_trained"] == sum(train)
    if plan.schedule == "pb":
        assert rep.extra["ticks"] == case.samples + graph.span - 1
    else:
        assert rep.extra["ticks"] == case.samples


@pytest.mark.parametrize("case", SEEDED_CASES, ids=[c.name for c in SEEDED_CASES])
def test_seeded_random_case_bit_exact(case):
    _check_reproducibly(
        case,
        f'{REGRESS_SEED_ENV}={SEED} pytest "{HERE}::test_seeded_random_case_bit_exact'
        f'[{case.name}]"  (seed {SEED} from {SEED_SOURCE})',
    )


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW_CASES, ids=[c.name for c in SLOW_CASES])
def test_random_case_bit_exact(case):
    _check_reproducibly(case, f'pytest --runslow "{HERE}::test_random_case_bit_exact[{case.name}]"')


def test_the_seed_comes_from_the_variable_else_the_commit(monkeypatch):
    import subprocess

    from pipetrain.sim.tb import regress

    try:
        regress_seed.cache_clear()
        monkeypatch.setenv(REGRESS_SEED_ENV, " 1234 ")
        assert regress_seed() == (1234, REGRESS_SEED_ENV)
        regress_seed.cache_clear()
        monkeypatch.setenv(REGRESS_SEED_ENV, "-5")
        with pytest.raises(regress.RegressSeedError, match="PIPETRAIN_REGRESS_SEED='-5'"):
            regress_seed()
        regress_seed.cache_clear()
        monkeypatch.delenv(REGRESS_SEED_ENV)
        head = subprocess.run(
            ["git", "-C", str(Path(regress.__file__).parents[2]), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        if head:  # a git checkout: the first 8 hex digits of HEAD
            assert regress_seed() == (int(head[:8], 16), f"commit {head[:12]}")
        else:
            assert regress_seed() == (regress.FALLBACK_SEED, "fallback")
    finally:
        regress_seed.cache_clear()


def test_random_cases_are_reproducible_and_bounded():
    for seed in range(40):
        cases = random_cases(CI_RANDOM_CASES, seed, CI_MAX_SIZE, CI_MAX_LANES)
        assert cases == random_cases(CI_RANDOM_CASES, seed, CI_MAX_SIZE, CI_MAX_LANES)
        assert [c.name for c in cases] == [f"rand{seed}-{k}" for k in range(CI_RANDOM_CASES)]
        for c in cases:
            assert 1 <= c.depth <= 4 and all(4 <= n <= CI_MAX_SIZE for n in c.sizes)
            outs = c.sizes[1:]
            assert all(1 <= a <= min(CI_MAX_LANES, m) for a, m in zip(c.lanes, outs, strict=True))
            assert c.samples <= 24
    # the slow set is the one it always was (drawn before the bounds existed)
    assert [(c.sizes, c.lanes) for c in SLOW_CASES[:2]] == [
        ((5, 8, 5), (8, 4)),
        ((8, 7, 5, 9, 4), (1, 1, 9, 1)),
    ]
    with pytest.raises(ValueError, match="max_size=3"):
        random_cases(1, 0, max_size=3)
