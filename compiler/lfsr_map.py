"""The stochastic-rounding LFSR's draw as a GF(2) matrix (docs/numerics.md §6), for the HDL
(``hdl/lfsr.py`` builds it as XORs) and the fit's logic estimate (``fit.logic_cells``: its
non-zero entries). Source: docs/numerics.md §6; the leap-as-matrix form is the standard
parallel LFSR (e.g. Xilinx XAPP052 / "leap-forward LFSR")."""

from __future__ import annotations

from functools import lru_cache

__all__ = ["lfsr_step", "leap_matrix", "leap_entries"]


def lfsr_step(state: int, poly: int, width: int) -> int:
    """One Galois step: ``(state << 1) ^ (poly if bit width−1 was set)``, kept to ``width``
    bits (``poly`` includes the x^width term)."""
    top = (state >> (width - 1)) & 1
    state = state << 1
    if top:
        state ^= poly
    return state & ((1 << width) - 1)


def leap_matrix(poly: int, width: int, leap: int) -> list[int]:
    """Return the draw map as ``width`` row masks: new bit ``r`` = XOR of the old state bits
    set in ``rows[r]``. Built from the images of the basis states after ``leap`` steps."""
    cols = []
    for c in range(width):
        s = 1 << c
        for _ in range(leap):
            s = lfsr_step(s, poly, width)
        cols.append(s)
    return [sum(((cols[c] >> r) & 1) << c for c in range(width)) for r in range(width)]


@lru_cache(maxsize=64)
def leap_entries(poly: int, width: int, leap: int) -> int:
    """Non-zero entries of :func:`leap_matrix` (the XOR inputs of one draw): 207 for the
    plans' x^32 + x^22 + x^2 + x + 1 at 32 steps, 98 at 16."""
    return sum(bin(r).count("1") for r in leap_matrix(poly, width, leap))
