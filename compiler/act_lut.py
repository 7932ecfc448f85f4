"""The interpolated look-up table of a ``tanh`` / ``sigmoid`` stage (docs/numerics.md §3.4).

:func:`activation_lut` builds the :class:`~pipetrain.compiler.plan.ActivationLUT` for a stage's
output format ``y`` = Q(b, f): a table of the function on |z| ≥ 0 (odd symmetry
``tanh(−z) = −tanh(z)``, ``sigmoid(−z) = 1 − sigmoid(z)`` give the negative half) with a step
of 2^−fl, each entry with its slope to the next, so the hardware interpolates linearly with one
small multiplier (slope × the low ``f − fl`` bits of |z|).

Error budget, in LSBs of ``y`` (*derived*; ``tests/test_activation_lut.py`` checks it on every
``z`` of the format): the final rounding ½; the interpolation of the exact function,
h²/8·max|f″| ≤ ¼ with h = 2^−fl (or 0 when fl = f: every |z| is an entry), or beyond the last
entry the distance to the function's limit, ≤ ¼; the entries' own rounding 2^−(G+1) with
G = :data:`GUARD_BITS` (a convex combination of two entries keeps it). Total
:data:`ERROR_BOUND_LSB` = 0.78125.

Source: *derived* (piecewise-linear interpolation error bound h²/8·max|f″|, standard).
"""

from __future__ import annotations

import math

from .enums import Activation, unknown
from .plan import ActivationLUT, QFormat

__all__ = ["GUARD_BITS", "CURVATURE", "ERROR_BOUND_LSB", "activation_lut", "exact"]

#: Fraction bits of the entries beyond ``y.frac``.
GUARD_BITS = 4
#: max |f″| on the real line: tanh″ peaks at 4/(3√3) (z = atanh(1/√3)), sigmoid″ at 1/(6√3).
CURVATURE = {"tanh": 4 / (3 * math.sqrt(3)), "sigmoid": 1 / (6 * math.sqrt(3))}
#: ½ + ¼ + 2^−(GUARD_BITS+1) LSBs of ``y`` (module docstring).
ERROR_BOUND_LSB = 0.5 + 0.25 + 2.0 ** -(GUARD_BITS + 1)


class LUTFormatError(ValueError):
    """The stage's ``y`` format cannot hold the activation's LUT output (the caller turns it
    into its own user error)."""


def exact(function: str, x: float) -> float:
    """The exact function: ``tanh(x)`` or ``1 / (1 + e^−x)`` (real units)."""
    if function == "tanh":
        return math.tanh(x)
    if function == "sigmoid":
        return 0.5 * (1.0 + math.tanh(0.5 * x))  # = 1/(1+e^−x), no overflow for large |x|
    unknown(function, "LUT activation")


def activation_lut(function: str | Activation, y: QFormat) -> ActivationLUT:
    """The LUT of ``function`` (``tanh``/``sigmoid``) for output format ``y`` (module docstring;
    fields: :class:`~pipetrain.compiler.plan.ActivationLUT`).

    Raises :class:`LUTFormatError` when ``y`` has fewer than 2 fraction bits, or (sigmoid) no
    integer bit, so that 1.0 does not fit.
    """
    function = str(function)
    f = y.frac
    if function not in CURVATURE:
        unknown(function, "LUT activation")
    if f < 2:
        raise LUTFormatError(f"{function} needs at least 2 fraction bits in y ({y} has {f})")
    if function == "sigmoid" and y.max_int < (1 << f):
        raise LUTFormatError(
            f"sigmoid outputs up to 1.0, which y = {y} cannot hold (largest {y.max_value:.6g}); "
            f"y needs at least 1 integer bit, e.g. Q1.{y.bits - 2}"
        )
    fe = f + GUARD_BITS
    quarter = 2.0 ** -(f + 2)  # ¼ LSB of y, real units
    fl = 0
    while fl < f and 2.0 ** (-2 * fl) / 8 * CURVATURE[function] > quarter:
        fl += 1
    k = f - fl
    # beyond x_flat the function is within ¼ LSB of its limit 1
    x_flat = math.atanh(1 - quarter) if function == "tanh" else math.log((1 - quarter) / quarter)
    last = min(math.ceil(x_flat * 2**fl), (1 << (y.bits - 1)) >> k)
    entries = tuple(math.floor(exact(function, i / 2**fl) * 2**fe + 0.5) for i in range(last + 1))
    slopes = tuple(entries[i + 1] - entries[i] for i in range(last)) + (0,)
    return ActivationLUT(
        function=function,
        index_frac=fl,
        entry_frac=fe,
        entries=entries,
        slopes=slopes,
        entry_bits=max(entries).bit_length(),
        slope_bits=max(1, max(slopes).bit_length()),
        error_bound_lsb=ERROR_BOUND_LSB,
    )
