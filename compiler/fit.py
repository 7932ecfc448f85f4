"""Fitting a plan to a board: the compiler pass ``build --board``, ``compile --board``,
``train --board``, ``open(board=…)`` and the benchmarks all run (once per compile).

:func:`fit_plan` takes a :class:`PlanRequest` (the traced network, the settings, the formats
and the lanes the compiler would build) and a :class:`~pipetrain.compiler.targets.Board`, and
returns the fitted plan or raises :class:`FitError` with needed vs available numbers. In order
(each step only when the board asks for it):

1. constants with ``board.const_bits`` significant bits (iCE40: 5 — lr 0.002 becomes the
   shift 2^-9, m 0.9 becomes 29/32, a three-digit shift-add; no SB_MAC16 for them), the
   board's clock and its block-RAM family (``board.ram_family``: the plan's memory kinds and
   block counts are the board's);
2. formats narrowed to the board's widths (iCE40: 16-bit weights and velocities, 12-bit
   activations and errors), keeping their calibrated integer bits (:func:`narrow_formats`);
3. lanes: the request's if the user gave them; otherwise the compiler's default balance and,
   if that plan does not fit (:func:`check_fit`), one lane per stage — the UART bounds
   samples/s well below one lane's compute rate, so fewer lanes cost only idle compute;
4. SPRAM (iCE40 UltraPlus): one-lane stages, largest weight + velocity bits first, get
   single-port SPRAM weight memories (``Stage.slot_cycles`` = 2: a slot every other cycle)
   while SPRAMs remain (:func:`spram_stages`).

The fit check (:func:`check_fit`) compares the plan's needs with the board: hard multiplier
blocks for the board's DSP width (:func:`~pipetrain.compiler.build.hard_multipliers`: a 24 ×
16-bit product takes two 18×18 MULT18X18D), memory bits, and the stages' memories mapped onto
the board's own block RAMs (18 Kib DP16KD on ECP5, 4 Kib EBR on iCE40). It is a necessary
check, not a sufficient one: routing and LUT use are only known after place and route.
Source: *derived* (the order above was measured on the iCEBreaker, docs/boards.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .build import (
    BLOCK_RAM_BITS,
    CONST_MANTISSA_BITS,
    EXP_LUT_FRAC,
    FormatSpec,
    build_plan,
    hard_multipliers,
    memory_blocks,
    spram_blocks,
)
from .config import TrainConfig
from .formats import apply_overrides, parse_format_overrides
from .ir import NetworkIR
from .lanes import choose_lanes
from .plan import Plan
from .targets import Board, BoardError

__all__ = [
    "FitError",
    "PlanRequest",
    "fit_plan",
    "check_fit",
    "plan_totals",
    "narrow_formats",
    "spram_stages",
]


class FitError(BoardError):
    """The plan needs more of a resource than the board has (message: needed vs available).

    ``rows``: the ``{resource: {needed, available}}`` rows of :func:`check_fit`; ``plan``: the
    plan checked (None when not given)."""

    def __init__(self, message: str, rows: dict | None = None, plan: Any = None) -> None:
        super().__init__(message)
        self.rows = rows or {}
        self.plan = plan


@dataclass(frozen=True)
class PlanRequest:
    """What :func:`~pipetrain.compiler.build.build_plan` builds a plan from.

    Members
    -------
    ir: the traced network.
    config: the training settings.
    formats: the format spec (calibrated or default, user overrides applied).
    lanes: lanes per stage as :func:`~pipetrain.compiler.lanes.choose_lanes` chose them.
    lanes_given: the user chose ``lanes`` (``--lanes``/``--target-cycles``/
        ``--max-multipliers``): fitting keeps them.
    clock_hz: design clock (Hz).
    memory_budget_bits: 0 = no budget.
    const_bits: significant bits of the update constants.
    single_port: 1-based stages with single-port (SPRAM) weight memories.
    ram_family: the block-RAM family the memories are placed on (``RAM_FAMILIES``).
    """

    ir: NetworkIR
    config: TrainConfig
    formats: FormatSpec
    lanes: tuple[int, ...]
    lanes_given: bool = False
    clock_hz: float = 50e6
    memory_budget_bits: int = 0
    const_bits: int = CONST_MANTISSA_BITS
    single_port: tuple[int, ...] = ()
    ram_family: str = "bram18"

    def replace(self, **changes: Any) -> PlanRequest:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)

    def build(self) -> Plan:
        """The plan of this request (:func:`~pipetrain.compiler.build.build_plan`)."""
        return build_plan(
            self.ir,
            self.config,
            self.formats,
            self.lanes,
            self.clock_hz,
            self.memory_budget_bits,
            self.const_bits,
            self.single_port,
            self.ram_family,
        )


def plan_totals(plan: Any, board: Board | None = None) -> dict[str, int]:
    """Return the plan's ``memory_bits``, ``multipliers`` (in the datapath) and
    ``memory_blocks`` (18 Kib units; the sum over stages when the plan has no total); with a
    ``board`` also ``hard_multipliers`` (DSP blocks of the board's width), ``bram_blocks``
    (the board's own block RAMs) and ``spram_blocks``. A plan without stages (a summary)
    counts its ``multipliers`` as blocks and its 18 Kib blocks' bits in the board's blocks."""
    blocks = getattr(plan, "memory_blocks", None)
    if blocks is None:
        blocks = sum(s.memory_blocks for s in plan.stages)
    out = {
        "memory_bits": int(plan.memory_bits),
        "multipliers": int(plan.multipliers),
        "memory_blocks": int(blocks),
    }
    if board is None:
        return out
    if not getattr(plan, "stages", None):
        bram = -(-out["memory_blocks"] * BLOCK_RAM_BITS // board.bram_block_bits)
        return out | {
            "hard_multipliers": out["multipliers"],
            "bram_blocks": int(bram),
            "spram_blocks": 0,
        }
    hard = hard_multipliers(plan, board.multiplier_width, 2, board.multiplier_min_product_bits)
    bram = memory_blocks(plan, board.bram_configs, board.bram_block_bits)
    return out | {
        "hard_multipliers": int(hard),
        "bram_blocks": int(bram),
        "spram_blocks": int(spram_blocks(plan)),
    }


def check_fit(plan: Any, board: Board) -> dict[str, dict[str, int]]:
    """Check the plan against the board's budget; return ``{resource: {needed, available}}``.

    - multipliers: hard multiplier blocks of the board's DSP width vs the board's; the plan's
      ``multipliers`` count each datapath multiplier once, whatever its width.
    - spram: SPRAMs of the stages with single-port weight memories vs the board's (0 except on
      the iCE40 UltraPlus).
    - memory bits: ``plan.memory_bits`` vs block RAM bits + the bits of the SPRAMs the plan
      uses.
    - memory blocks: the other stage memories mapped onto the board's block RAM, as bits, vs
      block RAM bits (each memory is rounded up to whole blocks, so this is the tighter check).

    Raises :class:`FitError` naming every resource that does not fit, with needed vs available
    numbers (its ``rows`` hold the same table).
    """
    t = plan_totals(plan, board)
    sp = t["spram_blocks"]
    sp_bits = min(sp, board.spram_blocks) * board.spram_block_bits
    ram_bits = board.bram_bits + sp_bits
    ram_name = "block RAM" + (f" + {sp} SPRAM" if sp else "")
    block_bits = t["bram_blocks"] * board.bram_block_bits
    rows = {
        "multipliers": {"needed": t["hard_multipliers"], "available": board.multipliers},
        "spram": {"needed": sp, "available": board.spram_blocks},
        "memory_bits": {"needed": t["memory_bits"], "available": ram_bits},
        "memory_block_bits": {"needed": block_bits, "available": board.bram_bits},
    }
    w = board.multiplier_width
    problems = []
    if t["hard_multipliers"] > board.multipliers:
        problems.append(
            f"{t['hard_multipliers']} multipliers needed, {board.multipliers} available "
            f"({w}×{w} blocks for {t['multipliers']} datapath multipliers)"
        )
    if sp > board.spram_blocks:
        problems.append(f"{sp} SPRAMs needed, {board.spram_blocks} available")
    if t["memory_bits"] > ram_bits:
        problems.append(f"{t['memory_bits']} memory bits needed, {ram_bits} available ({ram_name})")
    elif t["bram_blocks"] > board.bram_blocks:
        problems.append(
            f"{t['bram_blocks']} block RAMs of {board.bram_block_bits // 1024} Kib needed "
            f"({block_bits} bits), {board.bram_blocks} available ({board.bram_bits} bits)"
        )
    if problems:
        raise FitError(
            f"{getattr(plan, 'name', 'the design')} does not fit {board.name} "
            f"({board.description}): " + "; ".join(problems) + ". Use fewer lanes, narrower "
            "formats or a smaller network, or a bigger board",
            rows,
            plan,
        )
    return rows


def narrow_formats(plan: Plan, widths: dict[str, int]) -> list[str]:
    """Format overrides (``s<i>.<tensor>=Qi.f``) that fit each stage's tensors into
    ``widths[tensor]`` bits (0 or absent: leave it), keeping their calibrated integer bits and
    giving up fraction bits; [] when everything fits already.

    The same rule on every tensor keeps the formats that must agree equal: stage s's ``y`` and
    stage s+1's ``x``, stage s's ``d`` and stage s+1's ``gin``, and ``w``/``u`` share a
    fraction (the velocity is stored in weight units: their common fraction is set by the
    wider integer part). Logits (the ``y`` that feeds a loss unit) keep more than
    ``EXP_LUT_FRAC`` fraction bits, the exp LUT's step, even if that makes them wider.
    """
    out: list[str] = []
    last_main = plan.main_stages[-1].index
    for st in plan.stages:
        f = st.formats
        feeds_loss = st.index == last_main or (st.role == "head" and st.activation == "identity")
        wb = widths.get("w", 0) or widths.get("u", 0)
        if wb and max(f.w.bits, f.u.bits) > wb:
            wi, ui = f.w.bits - 1 - f.w.frac, f.u.bits - 1 - f.u.frac
            frac = wb - 1 - max(wi, ui)
            out += [f"s{st.index}.w=Q{wi}.{frac}", f"s{st.index}.u=Q{ui}.{frac}"]
        for t in ("x", "y", "d", "gin"):
            q, bits = getattr(f, t), widths.get(t, 0)
            if q is not None and bits and q.bits > bits:
                i = q.bits - 1 - q.frac
                frac = bits - 1 - i
                if t == "y" and feeds_loss:
                    # logits feed the loss unit's exp LUT, which needs > EXP_LUT_FRAC bits
                    frac = max(frac, EXP_LUT_FRAC + 1)
                if frac < q.frac:
                    out.append(f"s{st.index}.{t}=Q{i}.{frac}")
    return out


def spram_stages(plan: Plan, board: Board) -> tuple[int, ...]:
    """The 1-based stages that get SPRAM weight memories on ``board`` (step 4 of the module
    docstring): one-lane stages of ≤ 16 K slots, largest weight + velocity bits first, while
    SPRAMs remain; () on a board without SPRAM. Not only until the plan's own count fits: that
    count covers the stage weights and stashes, while the link engine, the loss unit and the
    error buffers take ~15 more EBRs on the iCE40 (measured with Yosys, ``mlp-digits``), so
    every EBR the weights leave free is needed."""
    if not board.spram_blocks:
        return ()
    chosen: list[int] = []
    free = board.spram_blocks
    for st in sorted(plan.stages, key=lambda s: -(s.weight_bits + s.velocity_bits)):
        f = st.formats
        need = -(-f.w.bits // 16) + -(-f.u.bits // 16)
        if st.lanes != 1 or st.cycles_per_tick > 16384 or need > free:
            continue
        chosen.append(st.index)
        free -= need
    return tuple(sorted(chosen))


def fit_plan(request: PlanRequest, board: Board) -> tuple[Plan, PlanRequest]:
    """Fit ``request`` to ``board`` (module docstring); return the plan and the request it was
    built from (its ``formats`` are the narrowed ones).

    Raises :class:`FitError` (needed vs available numbers) when even one lane per stage with
    the board's formats does not fit; a plan with the user's own lanes is returned unchecked
    beyond that (the caller's :func:`check_fit` then names what does not fit), and
    :class:`~pipetrain.compiler.build.PlanError` for a design that is invalid at the board's
    settings.
    """
    req = request.replace(
        clock_hz=board.clock_hz,
        const_bits=board.const_bits,
        single_port=(),
        ram_family=board.ram_family,
    )
    over = narrow_formats(req.build(), board.format_bits())
    if over:
        spec = apply_overrides(req.formats, parse_format_overrides(over), req.ir, req.config)
        req = req.replace(formats=spec)
    candidates = [req.lanes]
    if not req.lanes_given:
        ones = choose_lanes(req.ir, req.config, (1,))
        if ones != req.lanes:
            candidates.append(ones)
    err: FitError | None = None
    plan = None
    for lanes in candidates:
        attempt = req.replace(lanes=tuple(lanes))
        plan = attempt.build()
        sp = spram_stages(plan, board)
        if sp:
            attempt = attempt.replace(single_port=sp)
            plan = attempt.build()
        try:
            check_fit(plan, board)
            return plan, attempt
        except FitError as exc:
            err = exc
            if req.lanes_given:
                return plan, attempt
    assert err is not None
    head = str(err).split(". Use fewer lanes")[0]
    narrowed = " and the board's narrower formats" if any(board.format_bits().values()) else ""
    raise FitError(
        f"{head}, already with one lane per stage{narrowed}. Use a smaller network or a bigger "
        "board (pipetrain list-boards)",
        err.rows,
        err.plan,
    ) from None
