"""Fixed-point primitives of the training datapath (docs/numerics.md §1), on int64 tensors.

Every function here is the literal definition from ``docs/numerics.md`` §1; the golden model
(:mod:`pipetrain.sim.golden`) is written with nothing else, and the RTL implements the same
operations. ``rhu``, ``rne``, ``rsr`` and ``align`` use only Python operators, so they work on
``torch.int64`` tensors, numpy int64 arrays *and* Python ints (the scalar oracle in
:mod:`pipetrain.sim.golden_scalar` uses them that way). Floats appear only in
:func:`quantise`, the host boundary.

Shifts: ``>>`` on int64 tensors and on Python ints is an arithmetic (floor) shift, as the
contract requires. No function here wraps: callers keep values inside int64 (the plan's
``sum_bits`` ≤ 62 and accumulator widths guarantee it).
"""

from __future__ import annotations

from typing import TypeVar

import torch

from ..compiler.plan import QFormat

__all__ = ["sat", "sat_int", "rhu", "rne", "rsr", "align", "quantise", "U32_MAX"]

#: Saturation counters are 32-bit and saturate themselves (numerics §1).
U32_MAX = (1 << 32) - 1

T = TypeVar("T", int, torch.Tensor)


def sat(v: torch.Tensor, fmt: QFormat) -> tuple[torch.Tensor, int]:
    """Clamp ``v`` (int64, any shape) to ``[fmt.min_int, fmt.max_int]`` (numerics §1 ``sat``).

    Returns ``(clamped, count)``: ``count`` is how many elements the clamp changed (each adds
    one to the owning saturation counter). When nothing is out of range ``v`` itself is
    returned (one min/max reduction, no copy).
    """
    if v.numel() == 0:
        return v, 0
    lo, hi = torch.aminmax(v)
    if int(lo) >= fmt.min_int and int(hi) <= fmt.max_int:
        return v, 0
    out = v.clamp(fmt.min_int, fmt.max_int)
    return out, int((out != v).sum())


def sat_int(v: int, fmt: QFormat) -> tuple[int, int]:
    """Python-int :func:`sat`: returns ``(clamped, 1 if clamped else 0)``."""
    c = min(max(v, fmt.min_int), fmt.max_int)
    return c, int(c != v)


def rhu(v: T, k: int) -> T:
    """Round half up by ``k`` bits (numerics §1): ``v`` if k = 0, ``(v + 2^(k−1)) >> k`` if
    k > 0, ``v << −k`` if k < 0. Ties go towards +∞ (−2.5 → −2, 2.5 → 3)."""
    if k > 0:
        return (v + (1 << (k - 1))) >> k
    if k < 0:
        return v << -k
    return v


def rne(v: T, k: int) -> T:
    """Round half to even by ``k`` ≥ 0 bits (numerics §1): ``q = v >> k``, ``r = v − (q << k)``,
    ``q + 1`` if ``r > 2^(k−1)`` or (``r = 2^(k−1)`` and ``q`` odd), else ``q``.

    Raises :class:`ValueError` for k < 0 (updates only ever narrow).
    """
    if k < 0:
        raise ValueError(f"rne needs k ≥ 0, got {k}")
    if k == 0:
        return v
    q = v >> k
    r = v - (q << k)
    h = 1 << (k - 1)
    return q + ((r > h) | ((r == h) & ((q & 1) == 1)))


def rsr(v: T, k: int, r: T, round_bits: int) -> T:
    """Stochastic rounding by ``k`` ≥ 0 bits with an ``R``-bit unsigned random ``r``
    (numerics §1; ``R = round_bits``): ``v`` if k = 0; ``(v + (r >> (R − k))) >> k`` if
    0 < k ≤ R; ``(v + (r << (k − R))) >> k`` if k > R.

    ``r`` is an int or an int64 tensor broadcastable to ``v``, each value in [0, 2^R).
    Raises :class:`ValueError` for k < 0.
    """
    if k < 0:
        raise ValueError(f"rsr needs k ≥ 0, got {k}")
    if k == 0:
        return v
    return (v + rsr_addend(r, k, round_bits)) >> k


def rsr_addend(r: T, k: int, round_bits: int) -> T:
    """The value :func:`rsr` adds before its shift: ``r >> (R − k)`` or ``r << (k − R)``
    (0 for k = 0). Precomputing it lets the golden model prepare a block of draws at once."""
    if k <= 0:
        return r * 0
    if k <= round_bits:
        return r >> (round_bits - k)
    return r << (k - round_bits)


def align(v: T, f_from: int, f_to: int) -> T:
    """Re-express ``v`` (``f_from`` fraction bits) with ``f_to`` fraction bits: ``v << (f_to −
    f_from)``, exact (numerics §1). Raises :class:`ValueError` if ``f_to < f_from``."""
    if f_to < f_from:
        raise ValueError(f"align from {f_from} to {f_to} fraction bits would drop bits")
    return v << (f_to - f_from)


def quantise(x: torch.Tensor, fmt: QFormat) -> tuple[torch.Tensor, int]:
    """Host-side quantisation ``sat(round_half_even(x·2^frac), fmt)`` (numerics §2, §3).

    ``x`` is any real tensor; the product is formed in float64 (scaling by a power of two is
    exact) and rounded half to even. Returns ``(int64 tensor, count of clamped elements)``.
    Raises :class:`ValueError` if ``x`` holds NaN or ±∞.
    """
    xd = x.detach().to(torch.float64)
    if not bool(torch.isfinite(xd).all()):
        raise ValueError("cannot quantise NaN or infinite values")
    scaled = torch.round(xd * 2.0**fmt.frac)
    lo, hi = float(fmt.min_int), float(fmt.max_int)
    count = int(((scaled < lo) | (scaled > hi)).sum())
    out = scaled.clamp(lo, hi).to(torch.int64).clamp(fmt.min_int, fmt.max_int)
    return out, count
