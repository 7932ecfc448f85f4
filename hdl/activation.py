"""The activation of a stage and its derivative as Amaranth expressions (docs/numerics.md §2, §5).

``identity``: ``a = z``, ``δ = g``. ``relu``: ``a = z`` if ``z > 0`` else 0, ``δ = g`` if the
stashed ``z > 0`` else 0. ``leaky_relu`` with slope ``s`` (a constant ``value·2^−frac``):
``a = z`` if ``z > 0`` else ``rhu(s·z, frac)``, ``δ = g`` if ``z > 0`` else ``rhu(s·g, frac)``.
The derivative needs only the bit ``z > 0`` of the forward item (the stash's mask).

:func:`activation_of` is the one dispatch from the plan's activation name; a name the HDL does
not build raises there, when the stage is constructed — there is no silent fallback.

Source: docs/numerics.md §2 (forward), §5 (backward); the expressions are the definitions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from amaranth import Mux, Value

from ..compiler.plan import Const, Stage
from .arith import const_mul, rhu

__all__ = ["SUPPORTED_ACTIVATIONS", "Activation", "activation_of"]

#: The activations the HDL builds.
SUPPORTED_ACTIVATIONS = ("identity", "relu", "leaky_relu")


@dataclass(frozen=True)
class Activation:
    """One stage's activation.

    Members
    -------
    name: ``identity``, ``relu`` or ``leaky_relu``.
    slope: the LeakyReLU slope (``leaky_relu`` only, else ``None``).
    stage: 1-based stage index (for error messages).
    shift_add: the plan's constant-multiplier rule (:meth:`~pipetrain.compiler.plan.Plan.
        shift_add`) for the LeakyReLU slope; needed to build ``leaky_relu`` (``None`` is enough
        to check a stage).

    Raises NotImplementedError, naming the stage, the activation and the supported set, for any
    other name (or a ``leaky_relu`` without a slope).
    """

    name: str
    slope: Const | None = None
    stage: int = 0
    shift_add: Callable[[int], bool] | None = None

    def __post_init__(self) -> None:
        if self.name not in SUPPORTED_ACTIVATIONS:
            raise NotImplementedError(
                f"stage {self.stage}: activation {self.name!r} has no hardware; the HDL builds "
                f"{', '.join(SUPPORTED_ACTIVATIONS)}"
            )
        if self.name == "leaky_relu" and self.slope is None:
            raise NotImplementedError(f"stage {self.stage}: leaky_relu needs a negative slope")

    def forward(self, z: Value) -> Value:
        """``a = f(z)`` (same width as ``z`` for ``identity``/``relu``; the caller keeps the
        output format's bits)."""
        if self.name == "identity":
            return z
        if self.name == "relu":
            return Mux(z > 0, z, 0)
        return Mux(z > 0, z, rhu(const_mul(self.slope.value, z, self.shift_add), self.slope.frac))

    def derivative(self, positive: Value, g: Value) -> Value:
        """``δ = f′(z)·g`` from ``positive`` = the stashed bit ``z > 0`` and the error ``g``."""
        if self.name == "identity":
            return g
        if self.name == "relu":
            return Mux(positive, g, 0)
        return Mux(
            positive, g, rhu(const_mul(self.slope.value, g, self.shift_add), self.slope.frac)
        )


def activation_of(stage: Stage, shift_add: Callable[[int], bool] | None = None) -> Activation:
    """The :class:`Activation` of a plan stage, with the plan's constant-multiplier rule
    ``shift_add`` (raises NotImplementedError, see there)."""
    name = str(stage.activation)  # the plan's StrEnum member, or a plain name
    slope = stage.negative_slope if name == "leaky_relu" else None
    return Activation(name, slope, stage.index, shift_add)
