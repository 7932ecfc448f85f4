"""Fault injection for the RTL check: plan mutations that only the hardware sees.

The documented test hook: :func:`inject_fault` returns a copy of the plan with one bit changed;
the RTL is generated from the faulty copy (``check_network(..., rtl_plan=faulty)``) while the
golden model keeps the original. The comparison must catch the difference and name where it
first shows (tick, stage, tensor, index) — that is what the fault-injection tests assert.

Faults (each touches one stage unless noted):

* ``lfsr_seed``: flip bit 0 of lane ``lane``'s LFSR seed (stochastic rounding draws differ from
  the stage's first update on).
* ``lfsr_tap``: flip the x^5 tap of the (global) LFSR feedback polynomial.
* ``lr``: make the learning-rate constant ``update.lr`` one part in 256 larger (at least one
  LSB): one LSB of its 18 significant bits vanishes in the scaled error ``rhu(lr·δ, k)``
  (docs/numerics.md §5.3) for most δ, so 8 samples did not show it.
* ``momentum``: add one LSB to the momentum constant ``update.momentum``.
"""

from __future__ import annotations

import dataclasses

from ...compiler.plan import Const, Plan

__all__ = ["FAULTS", "inject_fault"]

FAULTS = ("lfsr_seed", "lfsr_tap", "lr", "momentum")


def _bump(c: Const, by: int = 1) -> Const:
    return dataclasses.replace(c, value=c.value + by)


def inject_fault(plan: Plan, fault: str, stage: int = 1, lane: int = 0) -> Plan:
    """Return ``plan`` with one ``fault`` (see the module docstring) in 1-based ``stage``.

    Raises ValueError for an unknown fault, stage or lane.
    """
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; choose one of {', '.join(FAULTS)}")
    if fault == "lfsr_tap":
        return dataclasses.replace(plan, lfsr_poly=plan.lfsr_poly ^ (1 << 5))
    if not 1 <= stage <= len(plan.stages):
        raise ValueError(f"stage {stage} outside 1..{len(plan.stages)}")
    st = plan.stages[stage - 1]
    if fault == "lfsr_seed":
        if not 0 <= lane < len(st.lfsr_seeds):
            raise ValueError(f"stage {stage} has {len(st.lfsr_seeds)} lanes, not lane {lane}")
        seeds = list(st.lfsr_seeds)
        seeds[lane] ^= 1 if seeds[lane] != 1 else 2  # stay non-zero
        st = dataclasses.replace(st, lfsr_seeds=tuple(seeds))
    else:
        name = {"lr": "lr", "momentum": "momentum"}[fault]
        c = getattr(st.update, name)
        by = max(1, abs(c.value) >> 8) if fault == "lr" else 1
        upd = dataclasses.replace(st.update, **{name: _bump(c, by)})
        st = dataclasses.replace(st, update=upd)
    stages = list(plan.stages)
    stages[stage - 1] = st
    return dataclasses.replace(plan, stages=tuple(stages))
