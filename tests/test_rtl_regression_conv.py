"""Randomised RTL regression of convolution stages (issue 16, item 6): small CNNs built,
simulated in Verilator and compared bit for bit with the golden model.

Default run: :data:`~pipetrain.sim.tb.regress_conv.CONV_SMOKE_CASES` (Conv1d / Conv2d, stride
1 / 2, padding 0 / 1, bias or not, max / avg (window 2 and 3) / no pooling, both schedules,
mitigations and LWP forms, both roundings, a two-conv chain, narrow formats), one of them
under random backpressure, and ``CI_RANDOM_CONV_CASES`` random conv cases from the run's seed
(the MLP cases' draws do not move: their own stream). With ``--runslow``: 8 more (seed 1).
A case whose plan the HDL does not build yet is skipped with the refusal as the reason
(:func:`~pipetrain.hdl.support.require_hdl`), so each runs the moment the HDL builds it.
"""

from __future__ import annotations

import pytest
from pipetrain.hdl.stage import check_stage
from pipetrain.hdl.support import HDLSupportError, require_hdl
from pipetrain.sim.tb.network import check_network
from pipetrain.sim.tb.regress import REGRESS_SEED_ENV, prepare, random_cases, regress_seed
from pipetrain.sim.tb.regress_conv import (
    CI_RANDOM_CONV_CASES,
    CONV_SMOKE_CASES,
    ConvCase,
    random_conv_cases,
)
from test_rtl_regression import _check_reproducibly

SEED, SEED_SOURCE = regress_seed()
SEEDED = random_conv_cases(CI_RANDOM_CONV_CASES, seed=SEED)
SLOW = random_conv_cases(8, seed=1)
HERE = "tests/test_rtl_regression_conv.py"


def _built(case: ConvCase) -> None:
    """Skip ``case`` with the HDL's refusal as the reason while the HDL does not build it."""
    plan = prepare(case)[0]
    try:
        require_hdl(plan)
    except HDLSupportError as exc:
        pytest.skip(f"the HDL does not build {case.name} yet: {exc}")


@pytest.mark.parametrize("case", CONV_SMOKE_CASES, ids=[c.name for c in CONV_SMOKE_CASES])
def test_conv_smoke_case_bit_exact(case):
    _built(case)
    _check_reproducibly(case, f'pytest "{HERE}::test_conv_smoke_case_bit_exact[{case.name}]"')


def test_conv_bit_exact_under_backpressure():
    """The two-conv smoke design (its build is cached by the smoke case) with random
    valid/ready on every stream: results, memories and counters stay exact."""
    case = next(c for c in CONV_SMOKE_CASES if c.name == "c2d-chain-sc-lwp")
    _built(case)
    plan, model, x, labels, train = prepare(case)
    rep = check_network(plan, model, x, labels, train, valid_prob=0.6, ready_prob=0.5, seed=5)
    assert rep.bit_exact, rep.first.describe() if rep.first else rep.localisation
    assert rep.extra["handshakes"]


@pytest.mark.parametrize("case", SEEDED, ids=[c.name for c in SEEDED])
def test_seeded_random_conv_case_bit_exact(case):
    _built(case)
    _check_reproducibly(
        case,
        f'{REGRESS_SEED_ENV}={SEED} pytest "{HERE}::test_seeded_random_conv_case_bit_exact'
        f'[{case.name}]"  (seed {SEED} from {SEED_SOURCE})',
    )


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW, ids=[c.name for c in SLOW])
def test_random_conv_case_bit_exact(case):
    _built(case)
    _check_reproducibly(
        case, f'pytest --runslow "{HERE}::test_random_conv_case_bit_exact[{case.name}]"'
    )


def test_conv_cases_are_reproducible_valid_and_small():
    """Every draw (the slow set's too) compiles and passes the HDL's checks (a PlanError or a
    Linear stage's limit here would fail the RTL run for a reason that is not the conv
    stage's), is the same for the same seed, stays inside the CI bound (≤ 2×12 or 2×7×7
    inputs, ≤ 4 channels, ≤ 16 samples) and covers both kinds, pooling and schedules; the MLP
    cases of a seed are the ones they were (the pinned slow set's first two)."""
    seen = set()
    for seed in range(8):
        cases = random_conv_cases(4, seed)
        assert cases == random_conv_cases(4, seed)
        assert [c.name for c in cases] == [f"conv{seed}-{k}" for k in range(4)]
        cases += SLOW if seed == 0 else []
        for c in cases:
            plan = prepare(c)[0]
            for st in plan.stages:  # no Linear-stage limit hit (N ≥ 4 with several groups)
                if st.conv is None:
                    check_stage(st)
            assert plan.input_shape == c.input_shape and len(plan.stages) == c.depth
            assert c.input_values <= 2 * 7 * 7 and c.samples <= 16
            assert all(conv.out_channels <= 4 for conv in c.convs)
            seen |= {(len(c.input_shape), conv.pool, c.schedule) for conv in c.convs}
    assert {k for k, _, _ in seen} == {2, 3} and {p for _, p, _ in seen} == {"none", "max", "avg"}
    assert {s for _, _, s in seen} == {"pb", "sequential"}
    assert [(c.sizes, c.lanes) for c in random_cases(12, seed=1)[:2]] == [
        ((5, 8, 5), (8, 4)),
        ((8, 7, 5, 9, 4), (1, 1, 9, 1)),
    ]
    for case in CONV_SMOKE_CASES:
        plan = prepare(case)[0]
        assert [s.kind for s in plan.stages][: len(case.convs)] == [
            "conv1d" if len(case.input_shape) == 2 else "conv2d"
        ] * len(case.convs)
