"""Regression cases for the RTL check: small networks over the design space.

A :class:`Case` names a network (layer sizes, activation), its lanes, the training algorithm
(schedule, mitigation and LWP form, rounding, loss, momentum, weight decay) and a format set;
:func:`prepare` compiles it (:func:`pipetrain.compiler.compile.compile_result`) and draws a
seeded sample stream with a few inference-only samples mixed in. :data:`SMOKE_CASES` is the
fixed set the default test run covers; :func:`random_cases` draws more: :data:`CI_RANDOM_CASES`
small ones in every default run from the run's seed (:func:`regress_seed`:
``PIPETRAIN_REGRESS_SEED``, else the commit), and 12 larger ones with ``--runslow``.

Format sets: ``default`` (:meth:`FormatSpec.default`), ``narrow`` (12-bit activations and
errors, 18-bit weights: saturations happen, so the counters are exercised) and ``wide``
(20-bit activations, 28-bit weights and velocities).
"""

from __future__ import annotations

import os
import random
import subprocess
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...compiler.build import FormatSpec
from ...compiler.config import TrainConfig
from ...compiler.plan import Plan, QFormat

__all__ = [
    "CI_RANDOM_CASES",
    "CI_MAX_LANES",
    "CI_MAX_SIZE",
    "FALLBACK_SEED",
    "REGRESS_SEED_ENV",
    "Case",
    "RegressSeedError",
    "SMOKE_CASES",
    "BREADTH_CASES",
    "case_formats",
    "prepare",
    "random_cases",
    "regress_seed",
]

#: Environment variable that fixes the seed of the default run's random cases (an integer ≥ 0).
REGRESS_SEED_ENV = "PIPETRAIN_REGRESS_SEED"
#: The seed when neither the environment variable nor ``git rev-parse HEAD`` gives one (an
#: installed copy outside a git checkout).
FALLBACK_SEED = 1
#: Random cases every default test run draws (tests/test_rtl_regression.py). Bound: each case
#: is one Verilog generation, one Verilator build and a simulation of at most 24 samples; with
#: layer sizes ≤ :data:`CI_MAX_SIZE` and lanes ≤ :data:`CI_MAX_LANES` the costliest shapes
#: (depth 2–4, 4 lanes, SC+LWP, wide formats) measured 27–34 CPU-seconds each on the 2-core
#: machine (a depth-4 case with 8 lanes: 2–3× that, hence the lane bound), so the three add
#: at most ~1.7 CPU-minutes — under 3 minutes on 2 cores (*derived* from those measurements).
CI_RANDOM_CASES = 3
#: Largest layer size of the default run's random cases (the slow set draws up to 12).
CI_MAX_SIZE = 8
#: Most lanes per stage of the default run's random cases (the build grows with the lanes).
CI_MAX_LANES = 4


@dataclass(frozen=True)
class Case:
    """One regression network and training setup (see the module docstring)."""

    name: str
    sizes: tuple[int, ...]
    lanes: tuple[int, ...]
    schedule: str = "pb"
    mitigation: str = "none"
    lwp_form: str = "v"
    rounding: str = "stochastic"
    loss: str = "cross_entropy"
    activation: str = "relu"
    formats: str = "default"
    momentum: float = 0.9
    weight_decay: float = 0.0
    lr: float = 0.05
    samples: int = 16
    seed: int = 0
    strategy: str = "global"
    blocks: tuple[int, ...] = ()
    head_stages: int = 1
    distance: int = 1
    rule: str = "only"
    operand_registers: int = 0

    @property
    def depth(self) -> int:
        """Weight layers (stages)."""
        return len(self.sizes) - 1

    @property
    def input_values(self) -> int:
        """Values of one input sample (a convolution case: C·Πsize, :mod:`.regress_conv`)."""
        return self.sizes[0]

    def model(self) -> nn.Module:
        """The case's network, seeded by ``seed``: Linear layers of ``sizes``, ``activation``
        between them."""
        return _model(self)


def case_formats(kind: str, stages: int) -> FormatSpec:
    """The ``default``, ``narrow`` or ``wide`` format set for ``stages`` stages."""
    if kind == "default":
        return FormatSpec.default(stages)
    if kind == "narrow":
        x, d, w = QFormat(12, 8), QFormat(12, 10), QFormat(18, 15)
    elif kind == "wide":
        x, d, w = QFormat(20, 13), QFormat(20, 17), QFormat(28, 24)
    else:
        raise ValueError(f"unknown format set {kind!r}")
    return FormatSpec(x=(x,) * stages, logits=x, d=(d,) * stages, w=(w,) * stages, u=(w,) * stages)


def _model(case: Case) -> nn.Module:
    torch.manual_seed(case.seed)
    layers: list[nn.Module] = []
    for k, (a, b) in enumerate(zip(case.sizes[:-1], case.sizes[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if k < case.depth - 1:
            if case.activation == "relu":
                layers.append(nn.ReLU())
            elif case.activation == "leaky_relu":
                layers.append(nn.LeakyReLU(0.125))
    return nn.Sequential(*layers)


def prepare(case: Case) -> tuple[Plan, nn.Module, torch.Tensor, list[int], list[bool]]:
    """Compile ``case``; return ``(plan, model, x_int (n, N), labels, train flags)``.

    The stream is seeded by ``case.seed``: inputs ~ N(0, 1) quantised to stage 1's ``x``
    format, uniform labels, and samples 5 and 11 (when present) inference-only.
    """
    from ...compiler.compile import compile_result
    from ..fixed import quantise

    cfg = TrainConfig(
        schedule=case.schedule,
        lr=case.lr,
        momentum=case.momentum,
        weight_decay=case.weight_decay,
        mitigation=case.mitigation,
        lwp_form=case.lwp_form,
        loss=case.loss,
        rounding=case.rounding,
        seed=case.seed,
        strategy=case.strategy,
        blocks=case.blocks,
        head_stages=case.head_stages,
        distance=case.distance,
        rule=case.rule,
    )
    model = case.model()
    res = compile_result(
        model,
        cfg,
        formats=case_formats(case.formats, case.depth),
        lanes=case.lanes,
        name=case.name.replace("-", "_"),
        operand_registers=case.operand_registers,
    )
    gen = torch.Generator().manual_seed(1000 + case.seed)
    xf = torch.randn(case.samples, case.input_values, generator=gen)
    x = quantise(xf, res.plan.stages[0].formats.x)[0]
    labels = torch.randint(0, case.sizes[-1], (case.samples,), generator=gen).tolist()
    train = [k not in (5, 11) for k in range(case.samples)]
    return res.plan, res.model, x, labels, train


#: The fixed default regression (depths 1–4, lanes, both schedules, every mitigation and both
#: LWP forms, both roundings, both losses, all activations, three format sets, local learning
#: and interlocking with the ``only`` and the ``sum`` rule).
SMOKE_CASES: tuple[Case, ...] = (
    Case("d1-ce", (6, 4), (2,), samples=12),
    Case("d2-lanes-sc", (10, 7, 3), (3, 2), mitigation="sc", samples=16),
    Case(
        "d2-seq-rne-mse",
        (8, 5, 4),
        (1, 1),
        schedule="sequential",
        rounding="nearest_even",
        loss="mse",
        samples=10,
    ),
    Case(
        "d3-lwp-leaky-narrow",
        (9, 6, 5, 3),
        (2, 3, 1),
        mitigation="lwp",
        activation="leaky_relu",
        formats="narrow",
        lr=0.5,
        samples=18,
        seed=3,
    ),
    Case(
        "d4-sclwp-wd-wide",  # LWP w form: the w_prev banks
        (7, 6, 5, 4, 3),
        (1, 2, 4, 3),
        mitigation="sc+lwp",
        lwp_form="w",
        weight_decay=0.01,
        formats="wide",
        samples=20,
        seed=4,
    ),
    Case(
        "d4-local-h2",  # local learning: heads of 2 stages on blocks ending after stages 1, 3
        (8, 7, 6, 5, 4),
        (2, 3, 1, 2),
        mitigation="sc",
        strategy="local",
        blocks=(1, 3),
        head_stages=2,
        samples=20,
        seed=6,
    ),
    Case(
        "d5-inter-d1",  # interlocking d=1 (K=3): stages 2, 3 pass L2 back to stage 1 (L2's
        # stream arrives two ticks before their L3 update stream)
        (7, 6, 6, 5, 5, 4),
        (2, 3, 1, 2, 2),
        strategy="interlocking",
        blocks=(1, 3),
        distance=1,
        samples=20,
        seed=2,
    ),
    Case(
        "d5-inter-sum-h2",  # interlocking d=2, rule sum (K=3), two-stage heads, SC: stage 1 sums
        # L1 (its δ kept in dsum_l1 for four ticks), L2 and L3 (the same tick: P_2 = P_3 = 5)
        (7, 6, 6, 5, 5, 4),
        (2, 3, 1, 2, 2),
        strategy="interlocking",
        blocks=(1, 3),
        distance=2,
        rule="sum",
        head_stages=2,
        mitigation="sc",
        samples=20,
        seed=7,
    ),
    Case(
        "d2-identity-rne",
        (5, 4, 3),
        (4, 3),
        activation="identity",
        rounding="nearest_even",
        momentum=0.0,
        samples=12,
        seed=5,
    ),
)


#: Smoke cases again with the multipliers' operand registers (``Stage.operand_registers`` = 1,
#: the ECP5 board's plans): SC, LWP ``v`` and ``w`` forms with weight decay (the select-adds'
#: registers), several row groups with an input gradient (``gacc`` one stage later), the
#: sequential schedule, interlocking with the ``sum`` rule (the extra streams' input
#: gradients), round-half-to-even with identity; three of them with 2 (``-opr2``).
OPERAND_REGISTER_CASES: tuple[Case, ...] = tuple(
    replace(c, name=f"{c.name}-opr", operand_registers=1)
    for c in SMOKE_CASES
    if c.name
    in (
        "d2-lanes-sc",
        "d2-seq-rne-mse",
        "d3-lwp-leaky-narrow",
        "d4-sclwp-wd-wide",
        "d5-inter-sum-h2",
        "d2-identity-rne",
    )
) + tuple(
    # two operand registers (an experiment's P = 2; on the ECP5 a fabric register after each
    # MULT18X18D): SC with several row groups and an input gradient, LWP ``v`` and ``w`` forms
    replace(c, name=f"{c.name}-opr2", operand_registers=2)
    for c in SMOKE_CASES
    if c.name in ("d2-lanes-sc", "d3-lwp-leaky-narrow", "d4-sclwp-wd-wide")
)


#: The local / interlocking breadth set (``--runslow``, tests/test_rtl_regression.py, each
#: under random backpressure): local; interlocking d = 1 and 2 with the ``only`` and the ``sum``
#: rule; K = 2, 3, 4 blocks; heads of 1 and 2 stages; depth up to 8; both schedules.
BREADTH_CASES: tuple[Case, ...] = (
    Case(
        "b-local-k4-d8",
        (6, 5, 5, 5, 5, 5, 5, 5, 4),
        (2, 1, 2, 1, 2, 1, 2, 2),
        strategy="local",
        blocks=(2, 4, 6),
        samples=20,
        seed=11,
    ),
    Case(
        "b-inter-d2-only-k4-d8",
        (6, 5, 5, 5, 5, 5, 5, 5, 4),
        (1, 2, 1, 2, 1, 2, 1, 2),
        strategy="interlocking",
        blocks=(2, 4, 6),
        distance=2,
        mitigation="sc+lwp",
        samples=20,
        seed=12,
    ),
    Case(
        "b-inter-d1-sum-k4-d8",
        (6, 5, 5, 5, 5, 5, 5, 5, 4),
        (2, 2, 1, 1, 2, 2, 1, 1),
        strategy="interlocking",
        blocks=(2, 4, 6),
        distance=1,
        rule="sum",
        mitigation="sc+lwp",
        lwp_form="w",
        samples=20,
        seed=13,
    ),
    Case(
        "b-inter-d1-sum-k2-h2",
        (6, 5, 5, 5, 4),
        (2, 1, 2, 2),
        strategy="interlocking",
        blocks=(2,),
        distance=1,
        rule="sum",
        head_stages=2,
        formats="narrow",
        lr=0.3,
        samples=18,
        seed=14,
    ),
    Case(
        "b-seq-local-h2",
        (7, 6, 5, 5, 4),
        (2, 3, 1, 2),
        schedule="sequential",
        strategy="local",
        blocks=(1, 3),
        head_stages=2,
        samples=14,
        seed=15,
    ),
    Case(
        "b-seq-inter-d1-only-k3-h2",
        (6, 5, 5, 5, 5, 5, 4),
        (1, 2, 1, 2, 1, 2),
        schedule="sequential",
        strategy="interlocking",
        blocks=(2, 4),
        distance=1,
        head_stages=2,
        samples=14,
        seed=16,
    ),
    Case(
        "b-seq-inter-d2-sum-k3",
        (7, 6, 6, 5, 5, 4),
        (2, 3, 1, 2, 2),
        schedule="sequential",
        strategy="interlocking",
        blocks=(1, 3),
        distance=2,
        rule="sum",
        loss="mse",
        samples=14,
        seed=17,
    ),
)


class RegressSeedError(ValueError):
    """``PIPETRAIN_REGRESS_SEED`` is not an integer ≥ 0."""


@cache
def regress_seed() -> tuple[int, str]:
    """The seed of the default run's random cases and where it came from: ``(seed, source)``.

    ``$PIPETRAIN_REGRESS_SEED`` (a decimal integer ≥ 0) when set; else the first 8 hex digits
    of ``git rev-parse HEAD`` of the checkout this package lives in (so every commit tests
    other configurations, and a CI run is reproducible from its commit); else
    :data:`FALLBACK_SEED`. ``source`` says which (``"PIPETRAIN_REGRESS_SEED"``,
    ``"commit <12 hex digits>"`` or ``"fallback"``). Raises :class:`RegressSeedError` for a
    malformed variable. Source: *derived* (docs/architecture.md §5, rung 4).
    """
    env = os.environ.get(REGRESS_SEED_ENV)
    if env is not None:
        text = env.strip()
        if not text.isdigit():
            raise RegressSeedError(
                f"{REGRESS_SEED_ENV}={env!r} is not an integer ≥ 0: set it to the seed a "
                "test run printed (e.g. PIPETRAIN_REGRESS_SEED=1234 pytest ...)"
            )
        return int(text), REGRESS_SEED_ENV
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        return int(out[:8], 16), f"commit {out[:12]}"
    except (OSError, subprocess.SubprocessError, ValueError):
        return FALLBACK_SEED, "fallback"


def random_cases(n: int, seed: int = 1, max_size: int = 12, max_lanes: int = 12) -> list[Case]:
    """Draw ``n`` random cases (depth 1–4, sizes 4–``max_size``, 1–``max_lanes`` lanes, random
    algorithm/formats; the LWP form ``v`` or ``w`` when the mitigation has LWP; in about half
    of the ``pb`` cases of depth ≥ 2 — and a quarter of the ``sequential`` ones — local
    learning (heads of 1 or 2 stages) or interlocking (rule ``only`` or ``sum``, d = 1 or 2,
    heads of 2 stages where the last block has two) with 1–3 random block ends — every
    strategy the HDL builds).

    Each case is named ``rand<seed>-<k>``; the same ``(n, seed, max_size)`` draws the same cases.

    Sizes start at 4: the HDL rejects stages with fewer than 4 inputs and several row groups
    (:class:`NotImplementedError` from ``hdl/stage.py``). The ``wide`` formats get no weight
    decay: the tiny η·λ constant would push the update sum past 62 bits (a PlanError).
    """
    if max_size < 4:
        raise ValueError(f"max_size={max_size}: the HDL needs layer sizes ≥ 4 (see above)")
    rng = random.Random(seed)
    extra = random.Random(f"lwp-form-and-strategy-{seed}")
    more = random.Random(f"rule-and-sequential-heads-{seed}")
    out = []
    for k in range(n):
        depth = rng.randint(1, 4)
        sizes = tuple(rng.randint(4, max_size) for _ in range(depth + 1))
        lanes = tuple(rng.randint(1, min(m, max_lanes)) for m in sizes[1:])
        kw: dict[str, Any] = dict(
            schedule=rng.choice(["pb", "pb", "sequential"]),
            mitigation=rng.choice(["none", "sc", "lwp", "sc+lwp"]),
            rounding=rng.choice(["stochastic", "nearest_even"]),
            loss=rng.choice(["cross_entropy", "mse"]),
            activation=rng.choice(["relu", "leaky_relu", "identity"]),
            formats=rng.choice(["default", "narrow", "wide"]),
            momentum=rng.choice([0.0, 0.5, 0.9]),
            weight_decay=rng.choice([0.0, 0.001]),
            lr=rng.choice([0.01, 0.05, 0.3]),
            samples=rng.randint(2 * depth + 2, 24),
            seed=rng.randrange(1000),
        )
        if kw["schedule"] == "sequential":
            kw["mitigation"] = "none"  # no delay to mitigate
        # from their own stream, so every field above (and every later case) stays what it was
        # for a given seed: the pinned --runslow set predates these draws
        lwp_form = extra.choice(["v", "w"])
        if "lwp" in kw["mitigation"]:
            kw["lwp_form"] = lwp_form
        strategy = extra.choice(["global", "global", "local", "interlocking"])
        head_stages = extra.choice([1, 1, 2])
        distance = extra.choice([1, 2])
        ends = (
            sorted(extra.sample(range(1, depth), k=extra.randint(1, min(3, depth - 1))))
            if (depth > 1)
            else []
        )
        # the sum rule, two-stage interlocking heads and heads under sequential: a third
        # stream, so the draws above keep their values (the pb cases stay the cases they were
        # apart from these options)
        rule = more.choice(["only", "sum"])
        seq_heads = more.random() < 0.5
        if strategy != "global" and ends and (kw["schedule"] == "pb" or seq_heads):
            kw |= dict(strategy=strategy, blocks=tuple(ends), head_stages=head_stages)
            if strategy == "interlocking":
                # a two-stage head needs a last block of two stages: else its stream would
                # pass back beyond the stage's delay, which the compiler refuses
                h = head_stages if depth - ends[-1] >= head_stages else 1
                kw |= dict(distance=distance, head_stages=h, rule=rule)
        if kw["formats"] == "wide":
            kw["weight_decay"] = 0.0
        out.append(Case(f"rand{seed}-{k}", sizes, lanes, **kw))
    return out
