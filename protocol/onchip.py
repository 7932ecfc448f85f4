"""The on-chip training set's sample order: an LFSR permutation the device makes itself.

A RUN command (docs/protocol.md §2) trains E epochs over the ``n`` samples of the on-chip set in
an order the device computes from two u16 words of the command, ``start`` and ``mask``; the
golden model reproduces it with :func:`epoch_orders` (``pipetrain.sim.golden.onchip_order``),
the host derives the words from the plan's seed and the epoch (:func:`run_seeds`). The order is
specified in docs/numerics.md §10; this module is its executable form and holds the tap table
the RTL uses (``hdl/link_onchip.py``).

The permutation (*derived*: the cheapest full-period generator that covers every index, one
candidate per clock cycle, no multiplier, no memory):

* ``k = perm_bits(n) = max(2, ⌈log2 n⌉)`` bits, a right-shifting Galois LFSR of ``k`` bits with
  the maximal-length toggle mask :data:`PERM_TAPS` ``[k]``:
  ``step(s) = (s >> 1) ^ (taps if s & 1 else 0)``, period 2^k − 1 over the non-zero states;
* one epoch with mask ``m`` (non-zero, < 2^k) visits the 2^k candidates ``m``, then
  ``s ^ m`` for the 2^k − 1 states ``s = start, step(start), …`` (back to ``start`` after the
  epoch) — every k-bit value once — and keeps those ``< n``: a permutation of ``0..n−1``;
* the next epoch uses ``step(m)``; ``start`` is the same every epoch.
"""

from __future__ import annotations

from .wire import MAX_RUN_EPOCHS

__all__ = ["PERM_TAPS", "perm_bits", "perm_step", "epoch_orders", "run_seeds", "run_chunks"]

#: Maximal-length toggle masks of the right-shifting Galois LFSR, by width k (2..16): the
#: smallest mask with bit k−1 set whose LFSR has period 2^k − 1 (found by search;
#: tests/test_onchip.py checks every period).
PERM_TAPS: dict[int, int] = {
    2: 0x3,
    3: 0x5,
    4: 0x9,
    5: 0x12,
    6: 0x21,
    7: 0x41,
    8: 0x8E,
    9: 0x108,
    10: 0x204,
    11: 0x402,
    12: 0x829,
    13: 0x100D,
    14: 0x2015,
    15: 0x4001,
    16: 0x8016,
}


def perm_bits(n: int) -> int:
    """Bits k of the permutation LFSR for a set of ``n`` samples (1..65535): max(2, ⌈log2 n⌉).

    Raises ValueError for ``n`` outside 1..65535."""
    if not 1 <= n <= 0xFFFF:
        raise ValueError(f"an on-chip set holds 1..65535 samples, got {n}")
    return max(2, (n - 1).bit_length())


def perm_step(s: int, k: int) -> int:
    """One step of the k-bit Galois LFSR (:data:`PERM_TAPS`)."""
    return (s >> 1) ^ (PERM_TAPS[k] if s & 1 else 0)


def epoch_orders(n: int, start: int, mask: int, epochs: int) -> list[list[int]]:
    """The sample order of ``epochs`` epochs of a RUN over slots ``0..n−1`` (a permutation per
    epoch; module docstring). ``start`` and ``mask``: non-zero k-bit words (k = perm_bits(n)).

    Raises ValueError on a zero or too wide ``start`` / ``mask`` (the device NAKs them)."""
    k = perm_bits(n)
    if not (0 < start < 1 << k and 0 < mask < 1 << k):
        raise ValueError(f"start={start}, mask={mask} must be non-zero {k}-bit words")
    out = []
    m = mask
    for _ in range(epochs):
        order = [m] if m < n else []
        s = start
        for _ in range((1 << k) - 1):
            c = s ^ m
            if c < n:
                order.append(c)
            s = perm_step(s, k)
        assert s == start
        out.append(order)
        m = perm_step(m, k)
    return out


def run_seeds(n: int, seed: int, epoch: int) -> tuple[int, int]:
    """``(start, mask)`` of a RUN whose first epoch is epoch ``epoch`` (0-based) of the run
    seeded ``seed`` (the plan's ``train["seed"]``): ``start = 1 + (seed·2654435761 mod (2^k −
    1))``, the mask of epoch 0 ``1 + ((seed·40503 + 12345) mod (2^k − 1))``, stepped once per
    epoch (*derived*: two multiplicative hashes, so nearby seeds start far apart)."""
    k = perm_bits(n)
    period = (1 << k) - 1
    start = 1 + (seed * 2654435761) % period
    mask = 1 + (seed * 40503 + 12345) % period
    for _ in range(epoch % period):
        mask = perm_step(mask, k)
    return start, mask


def run_chunks(
    n: int, seed: int, first_epoch: int, epochs: int, per_run: int = MAX_RUN_EPOCHS
) -> list[tuple[int, int, int]]:
    """The RUN commands of ``epochs`` epochs from epoch ``first_epoch`` on: ``(start, mask,
    epochs)`` each, at most ``per_run`` (default :data:`~pipetrain.protocol.wire.MAX_RUN_EPOCHS`;
    1 for runs with per-sample records) epochs per RUN (the device flushes after each, so a
    longer run is cut there: the golden model flushes at the same points)."""
    out = []
    e = 0
    while e < epochs:
        k = min(per_run, epochs - e)
        out.append((*run_seeds(n, seed, first_epoch + e), k))
        e += k
    return out
