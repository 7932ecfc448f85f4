"""Choosing lanes (parallel MAC units per stage, FINN's "folding") for the lockstep tick.

A tick lasts as long as the slowest stage (docs/architecture.md §3), so lanes are worth adding only
where a
stage is slower than the others. Stage cycles come from
:func:`pipetrain.compiler.build.stage_cycles`: ⌈M/L⌉·(N+1) for N inputs, M rows, L lanes.

Policies (exactly one applies; :func:`choose_lanes`):

* explicit: ``lanes=(8,)`` for every main stage, or one entry per main stage (``8,2``), or one
  per stage including auxiliary heads. Heads not listed get the fewest lanes that keep them
  within the slowest main stage.
* ``target_cycles=T``: every stage gets the fewest lanes whose pass issues ≤ T slots (its
  ``cycles_per_tick``, :func:`choose_lanes`); the compiler then takes the fewest lanes whose
  *tick* is ≤ T (:func:`lanes_for_tick`: the pass adds the pipeline latency, the last stage's
  the loss unit, the tick the control cycles), which is what ``--target-cycles`` means.
* ``max_multipliers=M``: the smallest T whose fewest-lanes design uses ≤ M multipliers
  (``Plan.multipliers``: lanes × :func:`lane_multipliers` + its per-stage ones, the products
  the HDL builds; so the slowest stage sets the tick and no stage has more lanes than T
  needs).
* default: T = the pass of the largest stage (most cycles at one lane) with
  :data:`DEFAULT_LANES` lanes (or one lane per row if it has fewer rows); every other stage
  gets the fewest lanes meeting T. For mlp-digits (64→32→10) that is 4 and 1 lanes, 520
  cycles.

Source: *derived* from the lockstep tick model (docs/architecture.md §3); the "fewest lanes that
meet the
slowest stage" balancing follows FINN's folding heuristic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .build import (
    TICK_OVERHEAD,
    FormatSpec,
    PlanError,
    build_plan,
    fewest_lanes,
    forward_cycles,
    pass_cycles,
    stage_cycles,
    stage_slots,
)
from .config import TrainConfig
from .ir import NetworkIR

__all__ = [
    "DEFAULT_LANES",
    "parse_lanes",
    "choose_lanes",
    "lanes_for_target",
    "lanes_for_tick",
    "lane_multipliers",
]

#: Lanes given to the largest stage by default; the others are balanced to its cycles.
DEFAULT_LANES = 4


def parse_lanes(text: str) -> tuple[int, ...] | None:
    """Parse ``"4"`` or ``"8,2"`` into lane counts; ``"auto"`` is None (with a board the fit
    pass chooses them, :func:`pipetrain.compiler.fit.board_lanes`; else the default balance).
    Column lanes (``"16x3,10"``) are :func:`parse_lane_spec`'s. Raises :class:`PlanError` on
    bad text."""
    return parse_lane_spec(text)[0]


def parse_lane_spec(text: str) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """Parse ``--lanes``: ``"8,2"`` → ((8, 2), None); ``"16x3,10"`` → ((16, 10), (3, 1)):
    row lanes L and, after an ``x``, column lanes k (``Stage.col_lanes``: k physical lanes
    share each row's columns, L·k in all; stage 1 only); ``"auto"`` → (None, None). Raises
    :class:`PlanError` on bad text."""
    if text.strip().lower() == "auto":
        return None, None
    rows, cols = [], []
    try:
        for part in text.replace(" ", "").lower().split(","):
            L, _, k = part.partition("x")
            rows.append(int(L))
            cols.append(int(k) if k else 1)
    except ValueError:
        raise PlanError(
            f"--lanes {text!r} is not a number, a comma-separated list of numbers (a stage's "
            "row lanes, optionally × column lanes) or 'auto' (e.g. 4, 8,2, 16x3,10 or auto)"
        ) from None
    if any(v < 1 for v in rows + cols):
        raise PlanError(f"--lanes {text!r}: every lane count must be ≥ 1")
    return tuple(rows), (tuple(cols) if any(k > 1 for k in cols) else None)


def lanes_text(lanes: Sequence[int], cols: Sequence[int] | None = None) -> str:
    """``--lanes`` text of ``lanes`` and column lanes ``cols``: ``"16x3,10"``."""
    ks = list(cols or ()) + [1] * (len(lanes) - len(cols or ()))
    return ",".join(f"{L}x{k}" if k > 1 else str(L) for L, k in zip(lanes, ks, strict=True))


def lanes_for_target(
    ir: NetworkIR, config: TrainConfig, target_cycles: int, first: int = 0
) -> tuple[int, ...]:
    """Return the fewest lanes per stage (main, then heads) with each pass ≤ ``target_cycles``;
    ``first``: from that 0-based stage on (the board fit's column-lane candidates choose stage
    1's lanes themselves, ``compiler/fit.py:column_candidates``).

    Raises :class:`PlanError` when a stage cannot reach the target even with one lane per row
    (its pass then takes N+1 cycles).
    """
    out = []
    for sl in stage_slots(ir, config)[first:]:
        L = fewest_lanes(sl.in_features, sl.out_features, target_cycles, sl.conv)
        if L is None:
            raise PlanError(
                f"--target-cycles {target_cycles} is below what stage {sl.index} ({sl.name}, "
                f"{sl.in_features}→{sl.out_features}) can do: even one lane per row issues "
                f"{stage_cycles(sl.in_features, sl.out_features, sl.rows, sl.conv)[1]} slots "
                "per pass, and the tick adds the pipeline, the loss unit and the tick control"
            )
        out.append(L)
    return tuple(out)


def lanes_for_tick(
    ir: NetworkIR,
    config: TrainConfig,
    target_cycles: int,
    plan_of: Callable[[tuple[int, ...]], Any],
) -> tuple[int, ...]:
    """Return the fewest lanes per stage (main, then heads) whose plan ticks in ≤
    ``target_cycles`` cycles (``Plan.tick_cycles``: every pass, and the loss unit's feeder's
    pass + the loss unit, + the tick control; ``--target-cycles``).

    ``plan_of(lanes)``: the plan those lanes make (the request's formats and the board's
    options: operand registers and constants change the pass overheads). Starts from
    :func:`lanes_for_target` (each pass ≤ T slots) and takes, for every stage whose part of
    the tick is over the target, the fewest lanes whose pass issues that many slots fewer,
    until the plan meets it (a pass's cycles grow by ``slot_cycles`` per slot, so one round
    usually does). Raises :class:`PlanError` when a stage cannot meet it even with one lane
    per row, naming the fastest tick the network can have. Source: *derived* from the tick
    formula (``compiler/build.py:tick_cycles``, docs/architecture.md §3).
    """
    slots = stage_slots(ir, config)
    S = len(ir.layers)

    def unreachable(sl, plan) -> PlanError:
        fastest = plan_of(tuple(s.rows for s in slots)).tick_cycles
        return PlanError(
            f"--target-cycles {target_cycles} is below what stage {sl.index} ({sl.name}, "
            f"{sl.in_features}→{sl.out_features}) can do with one lane per row: the fastest "
            f"tick of this network is {fastest} cycles (report.md's tick line); give "
            f"--target-cycles {fastest} or more, or --lanes auto"
        )

    try:
        lanes = list(lanes_for_target(ir, config, target_cycles))
    except PlanError:  # even the slots of a pass exceed the target
        stuck = next(
            sl
            for sl in slots
            if fewest_lanes(sl.in_features, sl.out_features, target_cycles, sl.conv) is None
        )
        raise unreachable(stuck, None) from None

    for _ in range(2 * len(slots) + 2):
        plan = plan_of(tuple(lanes))
        if plan.tick_cycles <= target_cycles:
            return tuple(lanes)
        loss = max([plan.loss.cycles] + [lu.cycles for lu in plan.head_losses])
        feeders = {S - 1} | {k for k in range(S, len(slots)) if slots[k].activation == "identity"}
        changed = False
        for k, (sl, st) in enumerate(zip(slots, plan.stages, strict=True)):
            fed = forward_cycles(st) + loss if k in feeders else 0
            part = max(pass_cycles(st), fed) + TICK_OVERHEAD
            if part <= target_cycles:
                continue
            if lanes[k] >= sl.rows:
                raise unreachable(sl, plan)
            fewer = -(-(part - target_cycles) // st.slot_cycles)  # slots to take off the pass
            L = fewest_lanes(sl.in_features, sl.out_features, st.cycles_per_tick - fewer, sl.conv)
            # None: not even one lane per row issues that few slots — but the loss unit's
            # parallelism follows the lanes (a shorter feeding pass leaves it more slack), so
            # the part counted with this plan's loss unit can overstate it: try one lane per
            # row (mlp-digits 32,5 on the ULX3S: 74 + 34 cycles asks for 32 slots of stage 2,
            # one lane per row issues 33, and 32,10 ticks in 76 with its loss unit at 33)
            lanes[k] = sl.rows if L is None else max(L, lanes[k] + 1)
            changed = True
        if not changed:  # cannot happen: the tick is one of the parts
            break
    raise unreachable(slots[0], plan_of(tuple(lanes)))


def lane_multipliers(
    ir: NetworkIR, config: TrainConfig, formats: FormatSpec | None = None, **options: Any
) -> tuple[tuple[int, int], ...]:
    """``(per lane, per stage)`` multipliers of each stage (main, then heads) as the HDL builds
    them: the ``Stage.products`` of the one-lane plan of ``ir`` (:func:`build_plan` with
    ``formats``, default :meth:`FormatSpec.default`, and ``options``: ``const_bits``,
    ``operand_bits``, …, which decide which constants are shift-adds and which products
    exist), split by ``Product.per_stage`` (the scaled error formed once at the error buffer's
    write). Neither count depends on the lane count, so ``lanes × per lane + per stage`` is
    each stage's ``Stage.multipliers`` at any lanes (the ``max_multipliers`` search,
    :func:`choose_lanes`) — but for a loss unit's out lanes, which the plan adds after the
    lanes where one error a cycle would set the tick (``LossUnit.out_lanes`` Q: Q − 1 more
    scaled-error multipliers in the feeding stage, ``Stage.error_beat``, and Q − 1 more
    ``e·r`` in the loss unit; compiler/loss_unit.py), which this count does not see: it is a
    lower bound, and :func:`choose_lanes` checks a candidate's plan with its ``count``."""
    ones = tuple(1 for _ in stage_slots(ir, config))
    plan = build_plan(ir, config, formats, ones, **options)
    out = []
    for st in plan.stages:
        shared = sum(1 for p in st.products or () if p.per_stage)
        out.append((len(st.products or ()) - shared, shared))
    return tuple(out)


def _multipliers(per_lane: Sequence[tuple[int, int]], lanes: Sequence[int]) -> int:
    return sum(p * L + s for (p, s), L in zip(per_lane, lanes, strict=True))


def _per_stage_hint(slots: Sequence, lanes: tuple[int, ...], one: bool) -> str:
    """The fix of a lane count outside a stage's 1..rows: per-stage lanes (``--lanes 16,4``:
    the counts that fit kept, each other stage the fewest lanes whose pass is within the
    slowest kept one's, :func:`~pipetrain.compiler.build.fewest_lanes`; one lane per row where
    none is), or ``--lanes auto``; ``one``: the user gave one count for every stage."""
    main = list(zip(slots, lanes, strict=False))
    ok = [(sl, L) for sl, L in main if 1 <= L <= sl.rows]
    slowest = max(
        (stage_cycles(sl.in_features, sl.out_features, L, sl.conv)[1] for sl, L in ok),
        default=0,
    )
    fixed = ",".join(
        str(
            L
            if 1 <= L <= sl.rows
            else fewest_lanes(sl.in_features, sl.out_features, slowest, sl.conv) or sl.rows
        )
        for sl, L in main
    )
    given = f"--lanes {lanes[0]} gives every stage {lanes[0]} lanes; " if one else ""
    return (
        f"; {given}give one count per stage (e.g. --lanes {fixed}), or "
        "--lanes auto (with --board the fastest plan that fits the board, else the default "
        "balance)"
    )


def choose_lanes(
    ir: NetworkIR,
    config: TrainConfig,
    lanes: Sequence[int] | None = None,
    target_cycles: int | None = None,
    max_multipliers: int | None = None,
    per_lane: Sequence[tuple[int, int]] | None = None,
    count: Callable[[tuple[int, ...]], int] | None = None,
) -> tuple[int, ...]:
    """Return the lanes of every stage (main stages, then auxiliary heads).

    ``per_lane``: the ``(per lane, per stage)`` multipliers of each stage for
    ``max_multipliers`` (:func:`lane_multipliers` of the plan's formats and options; None:
    those of the default formats). ``count``: the stages' multipliers of the plan at a lane
    choice (``Plan.multipliers``), where a loss unit's out lanes add scaled-error multipliers
    that ``per_lane`` does not see; the search then takes a choice only when its plan is within
    ``max_multipliers`` (``per_lane`` stays the cheap bound first: out lanes only add).

    See the module docstring for the policies. Raises :class:`PlanError` when more than one
    policy is given, a list has the wrong length, a lane count exceeds a stage's rows (naming
    per-stage lanes that would do and ``--lanes auto``), the target is unreachable, or even
    one lane per stage exceeds ``max_multipliers``.
    """
    given = [n for n, v in (("--lanes", lanes), ("--target-cycles", target_cycles),
                            ("--max-multipliers", max_multipliers)) if v is not None]  # fmt: skip
    if len(given) > 1:
        raise PlanError(f"give only one of {', '.join(given)} (they all choose the lanes)")
    slots = stage_slots(ir, config)
    S = len(ir.layers)
    if lanes is not None:
        lanes = tuple(lanes)
        one = len(lanes) == 1  # one count for every main stage
        if one:
            lanes = lanes * S
        if len(lanes) not in (S, len(slots)):
            raise PlanError(
                f"--lanes has {len(lanes)} entries but the network has {S} main stages"
                + (f" and {len(slots) - S} head stages" if len(slots) > S else "")
                + f"; give one number for all stages or {S} numbers"
            )
        bad = [
            f"stage {sl.index} ({sl.name}): lanes={L} must be in 1..{sl.rows} (one lane per "
            f"output row at most; the stage has {sl.rows} rows)"
            for sl, L in zip(slots, lanes, strict=False)
            if not 1 <= L <= sl.rows
        ]
        if bad:  # every stage out of range, in one message
            raise PlanError("; ".join(bad) + _per_stage_hint(slots, lanes, one))
        if len(lanes) == S and len(slots) > S:
            slowest = max(
                stage_cycles(sl.in_features, sl.out_features, L, sl.conv)[1]
                for sl, L in zip(slots, lanes, strict=False)
            )
            lanes = lanes + tuple(
                fewest_lanes(sl.in_features, sl.out_features, slowest) or sl.rows
                for sl in slots[S:]
            )
        return lanes
    if target_cycles is not None:
        if target_cycles < 1:
            raise PlanError(f"--target-cycles must be ≥ 1, got {target_cycles}")
        return lanes_for_target(ir, config, target_cycles)
    if max_multipliers is not None:
        if per_lane is None:
            per_lane = lane_multipliers(ir, config)
        candidates = sorted(
            {
                stage_cycles(sl.in_features, sl.out_features, L, sl.conv)[1]
                for sl in slots
                for L in range(1, sl.rows + 1)
            }
        )
        floor = max(
            stage_cycles(sl.in_features, sl.out_features, sl.rows, sl.conv)[1] for sl in slots
        )
        for T in candidates:
            if T < floor:
                continue
            choice = lanes_for_target(ir, config, T)
            if _multipliers(per_lane, choice) > max_multipliers:
                continue
            if count is None or count(tuple(choice)) <= max_multipliers:
                return choice
        smallest = _multipliers(per_lane, [1] * len(slots))
        raise PlanError(
            f"--max-multipliers {max_multipliers} is below the smallest design: one lane per "
            f"stage already uses {smallest} multipliers in the stages; give --max-multipliers "
            f"{smallest} or more (the least that works: one lane per stage), or leave it out"
        )
    largest = max(
        slots, key=lambda sl: stage_cycles(sl.in_features, sl.out_features, 1, sl.conv)[1]
    )
    L = min(DEFAULT_LANES, largest.rows)
    return lanes_for_target(
        ir, config, stage_cycles(largest.in_features, largest.out_features, L, largest.conv)[1]
    )
