"""The closed sets of the training settings and the plan, as ``enum.StrEnum``s.

A member compares equal to its value (``Activation.RELU == "relu"``), prints as it, and is
written to JSON as it, so the plan's canonical JSON and hash are those of the strings. Settings
are converted on entry (:class:`~pipetrain.compiler.config.TrainConfig`, the IR, the plan's JSON),
and every dispatch on one of these sets ends in :func:`unknown`, which raises: an unsupported
value is an error wherever it is dispatched, never a silent fallback.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NoReturn, TypeVar

__all__ = [
    "Schedule",
    "Mitigation",
    "LwpForm",
    "Strategy",
    "Rule",
    "Loss",
    "Rounding",
    "Activation",
    "parse",
    "unknown",
]


class Schedule(StrEnum):
    """``pb``: Pipelined Backpropagation, D_s = 2(S−s)+1; ``sequential``: exact batch-1 SGD."""

    PB = "pb"
    SEQUENTIAL = "sequential"


class Mitigation(StrEnum):
    """Delay mitigation: Spike Compensation and/or Linear Weight Prediction (Kosson et al.,
    MLSys 2021; docs/architecture.md §2.2)."""

    NONE = "none"
    SC = "sc"
    LWP = "lwp"
    SC_LWP = "sc+lwp"

    @property
    def sc(self) -> bool:
        """Spike Compensation is on."""
        return self in (Mitigation.SC, Mitigation.SC_LWP)

    @property
    def lwp(self) -> bool:
        """Linear Weight Prediction is on."""
        return self in (Mitigation.LWP, Mitigation.SC_LWP)


class LwpForm(StrEnum):
    """LWP form: ``v`` (ŵ = w − η·D·v) or ``w`` (ŵ = w + D·(w_t − w_{t−1}))."""

    V = "v"
    W = "w"


class Strategy(StrEnum):
    """Learning strategy (docs/architecture.md §2.4)."""

    GLOBAL = "global"
    LOCAL = "local"
    INTERLOCKING = "interlocking"


class Rule(StrEnum):
    """Interlocking rule: a block updates from its own loss only, or from the sum."""

    ONLY = "only"
    SUM = "sum"


class Loss(StrEnum):
    """Loss function of a loss unit."""

    CROSS_ENTROPY = "cross_entropy"
    MSE = "mse"


class Rounding(StrEnum):
    """Rounding of weight/velocity updates (docs/numerics.md §5)."""

    STOCHASTIC = "stochastic"
    NEAREST_EVEN = "nearest_even"


class Activation(StrEnum):
    """Activation after a weight layer (``tanh`` and ``sigmoid`` through a LUT,
    docs/numerics.md §3)."""

    RELU = "relu"
    LEAKY_RELU = "leaky_relu"
    IDENTITY = "identity"
    TANH = "tanh"
    SIGMOID = "sigmoid"

    @property
    def lut(self) -> bool:
        """Computed by a look-up table with interpolation (``tanh``, ``sigmoid``); its
        derivative comes from the stashed output y, not from a mask bit."""
        return self in (Activation.TANH, Activation.SIGMOID)


E = TypeVar("E", bound=StrEnum)


def parse(kind: type[E], value: object, what: str) -> E:
    """``kind(value)``; a value outside the set raises :class:`ValueError` naming ``what``
    and the accepted values (callers wrap it in their own error type)."""
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(m.value for m in kind)
        raise ValueError(f"{what}={value!r} is not supported; choose one of: {allowed}") from None


def unknown(value: object, what: str) -> NoReturn:
    """The last branch of a dispatch: raise :class:`ValueError` for ``value``."""
    raise ValueError(f"unsupported {what} {value!r} (no branch handles it)")
