"""The per-lane Galois LFSRs of stochastic rounding (docs/numerics.md §6).

State arithmetic is GF(2)[x] modulo the plan's feedback polynomial ``p`` (``plan.lfsr_poly``,
the x^width term included): one **step** multiplies the state by x, one **draw** multiplies it
by x^leap (``plan.lfsr_leap`` steps, taken *before* the state is used).

Two implementations that must agree (a test checks it):

* :func:`step` / :func:`draw` — the literal bit-serial definition, one Python int at a time;
* :class:`LaneLFSRs` — a vectorised generator of whole blocks of draws for many lanes. A draw
  is the linear map "multiply by c = x^leap mod p"; applying it to a uint64 array uses four
  256-entry byte tables (the images of each byte position). A block of ``n`` draws is filled by
  doubling: ``out[:, 2^i + j] = out[:, j] · c^(2^i)``, so ``n`` draws cost ``log2 n`` array ops.

Source: the LFSR as a polynomial-basis multiplier is standard (e.g. Xilinx XAPP052); the
doubling generator is *derived* (the draw map is linear, so its powers compose).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

__all__ = [
    "step",
    "draw",
    "gf2_mulmod",
    "x_pow",
    "multiplicative_order_is_full",
    "prime_factors",
    "LaneLFSRs",
    "jump",
]


def step(state: int, poly: int, width: int = 32) -> int:
    """One Galois step (numerics §6): ``(state << 1) ^ (poly if bit width−1 was set)``, kept to
    ``width`` bits. ``poly`` includes the x^width term."""
    mask = (1 << width) - 1
    top = (state >> (width - 1)) & 1
    state = (state << 1) & ((1 << (width + 1)) - 1)
    if top:
        state ^= poly
    return state & mask


def draw(state: int, poly: int, width: int = 32, leap: int = 32) -> int:
    """One draw: ``leap`` steps of :func:`step`; returns the new state (which is then used)."""
    for _ in range(leap):
        state = step(state, poly, width)
    return state


def _degree(poly: int) -> int:
    return poly.bit_length() - 1


def gf2_mulmod(a: int, b: int, poly: int) -> int:
    """Return ``a·b mod poly`` in GF(2)[x] (carry-less multiply, then reduce)."""
    deg = _degree(poly)
    prod = 0
    while b:
        if b & 1:
            prod ^= a
        a <<= 1
        b >>= 1
    for bit in range(prod.bit_length() - 1, deg - 1, -1):
        if (prod >> bit) & 1:
            prod ^= poly << (bit - deg)
    return prod


def x_pow(exponent: int, poly: int) -> int:
    """Return ``x^exponent mod poly`` (square and multiply). ``exponent`` ≥ 0."""
    result, base = 1, gf2_mulmod(2, 1, poly)  # base = x mod p
    e = exponent
    while e:
        if e & 1:
            result = gf2_mulmod(result, base, poly)
        base = gf2_mulmod(base, base, poly)
        e >>= 1
    return result


def jump(state: int, draws: int, poly: int, leap: int = 32) -> int:
    """The state after ``draws`` draws of ``leap`` steps from ``state``: a Galois step is a
    multiplication by x modulo ``poly``, so this is ``state·x^(leap·draws) mod poly`` (*derived*
    from numerics §6; :meth:`LaneLFSRs.draws` uses the same identity). ``draws`` ≥ 0."""
    return gf2_mulmod(state, x_pow(leap * draws, poly), poly)


def prime_factors(n: int) -> list[int]:
    """Distinct prime factors of ``n`` ≥ 1 (trial division; 2^32 − 1 takes milliseconds)."""
    out, d = [], 2
    while d * d <= n:
        if n % d == 0:
            out.append(d)
            while n % d == 0:
                n //= d
        d += 1
    if n > 1:
        out.append(n)
    return out


def multiplicative_order_is_full(poly: int) -> bool:
    """True if x has order 2^w − 1 modulo ``poly`` (w = degree), i.e. ``poly`` is primitive and
    the LFSR visits every non-zero state: x^(2^w−1) = 1 and x^((2^w−1)/q) ≠ 1 for each prime
    factor q of 2^w − 1."""
    order = (1 << _degree(poly)) - 1
    if x_pow(order, poly) != 1:
        return False
    return all(x_pow(order // q, poly) != 1 for q in prime_factors(order))


@lru_cache(maxsize=256)
def _byte_tables(multiplier: int, poly: int) -> np.ndarray:
    """Tables (nbytes, 256) of uint64: entry [p][v] = (v·x^(8p)·multiplier) mod poly."""
    width = _degree(poly)
    nbytes = -(-width // 8)
    images = np.array(
        [gf2_mulmod(multiplier, 1 << b, poly) for b in range(nbytes * 8)], dtype=np.uint64
    )
    values = np.arange(256, dtype=np.uint64)
    tables = np.zeros((nbytes, 256), dtype=np.uint64)
    for p in range(nbytes):
        for bit in range(8):
            on = ((values >> np.uint64(bit)) & np.uint64(1)).astype(bool)
            tables[p, on] ^= images[8 * p + bit]
    return tables


@lru_cache(maxsize=256)
def _power_tables(leap: int, i: int, poly: int) -> np.ndarray:
    return _byte_tables(x_pow(leap << i, poly), poly)


def _apply(tables: np.ndarray, states: np.ndarray) -> np.ndarray:
    out = tables[0][states & np.uint64(0xFF)]
    for p in range(1, tables.shape[0]):
        out = out ^ tables[p][(states >> np.uint64(8 * p)) & np.uint64(0xFF)]
    return out


class LaneLFSRs:
    """The LFSRs of one stage's lanes, advanced in vectorised blocks of draws.

    Parameters: ``seeds`` (one non-zero state per lane), ``poly`` (with the x^width term),
    ``leap`` (steps per draw). :attr:`states` (uint64, shape (L,)) is the current state of
    every lane; :meth:`draws` advances them.
    """

    def __init__(self, seeds: tuple[int, ...] | list[int], poly: int, leap: int = 32) -> None:
        self.poly = poly
        self.width = _degree(poly)
        if self.width > 63:
            raise ValueError(f"LFSR width {self.width} > 63 is not supported")
        if any(not 0 < s < (1 << self.width) for s in seeds):
            raise ValueError(f"LFSR seeds must be non-zero {self.width}-bit values: {seeds}")
        self.leap = leap
        self.states = np.array(seeds, dtype=np.uint64)
        self.draws_taken = 0

    def _power_tables(self, i: int) -> np.ndarray:
        """Byte tables of the map state ↦ state·x^(leap·2^i)."""
        return _power_tables(self.leap, i, self.poly)

    def draws(self, count: int) -> np.ndarray:
        """Advance every lane by ``count`` draws; return the states after each draw, shape
        (L, count), uint64 (column k = the state used by the lane's (k+1)-th draw)."""
        lanes = len(self.states)
        out = np.empty((lanes, count), dtype=np.uint64)
        if count == 0:
            return out
        out[:, 0] = _apply(self._power_tables(0), self.states)
        filled, i = 1, 0
        while filled < count:
            n = min(filled, count - filled)
            out[:, filled : filled + n] = _apply(self._power_tables(i), out[:, :n])
            filled += n
            i += 1
        self.states = out[:, -1].copy()
        self.draws_taken += count
        return out
