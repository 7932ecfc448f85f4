"""The activation of a stage and its derivative as Amaranth expressions (docs/numerics.md §2, §5).

``identity``: ``a = z``, ``δ = g``. ``relu``: ``a = z`` if ``z > 0`` else 0, ``δ = g`` if the
stashed ``z > 0`` else 0. ``leaky_relu`` with slope ``s`` (a constant ``value·2^−frac``):
``a = z`` if ``z > 0`` else ``rhu(s·z, frac)``, ``δ = g`` if ``z > 0`` else ``rhu(s·g, frac)``.
The derivative of these needs only the bit ``z > 0`` of the forward item (the stash's mask).

``tanh`` / ``sigmoid`` (numerics §3.4, §5.1): the forward is :class:`LUTActivation`, the plan's
interpolated ROM (:class:`~pipetrain.compiler.plan.ActivationLUT`) for all lanes, read with
``z`` one cycle before the output; the stash keeps the output ``y`` (``Stage.mask_bits`` =
y.bits per lane) and the derivative is ``δ = rhu(g·q, f)`` with ``q = rhu(2^2f − y², f)``
(tanh) or ``rhu(y·(2^f − y), f)`` (sigmoid).

:func:`activation_of` is the one dispatch from the plan's activation name; a name the HDL does
not build raises there, when the stage is constructed — there is no silent fallback.

Source: docs/numerics.md §2 (forward), §5 (backward); the expressions are the definitions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from amaranth import Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..compiler.plan import ActivationLUT, Const, QFormat, Stage
from .arith import const_mul, rhu

__all__ = ["SUPPORTED_ACTIVATIONS", "Activation", "LUTActivation", "activation_of"]

#: The activations the HDL builds.
SUPPORTED_ACTIVATIONS = ("identity", "relu", "leaky_relu", "tanh", "sigmoid")
#: The ones computed by :class:`LUTActivation`.
LUT_ACTIVATIONS = ("tanh", "sigmoid")


@dataclass(frozen=True)
class Activation:
    """One stage's activation.

    Members
    -------
    name: ``identity``, ``relu``, ``leaky_relu``, ``tanh`` or ``sigmoid``.
    slope: the LeakyReLU slope (``leaky_relu`` only, else ``None``).
    stage: 1-based stage index (for error messages).
    shift_add: the plan's constant-multiplier rule (:meth:`~pipetrain.compiler.plan.Plan.
        shift_add`) for the LeakyReLU slope; needed to build ``leaky_relu`` (``None`` is enough
        to check a stage).
    lut: the plan's :class:`~pipetrain.compiler.plan.ActivationLUT` (``tanh``/``sigmoid``
        only).
    y_format: the output format (``tanh``/``sigmoid`` only: its fraction bits scale the
        derivative, its width is the stashed value's).

    Raises NotImplementedError, naming the stage, the activation and the supported set, for any
    other name (or a ``leaky_relu`` without a slope, a ``tanh``/``sigmoid`` without its LUT and
    output format).
    """

    name: str
    slope: Const | None = None
    stage: int = 0
    shift_add: Callable[[int], bool] | None = None
    lut: ActivationLUT | None = None
    y_format: QFormat | None = None

    def __post_init__(self) -> None:
        if self.name not in SUPPORTED_ACTIVATIONS:
            raise NotImplementedError(
                f"stage {self.stage}: activation {self.name!r} has no hardware; the HDL builds "
                f"{', '.join(SUPPORTED_ACTIVATIONS)}"
            )
        if self.name == "leaky_relu" and self.slope is None:
            raise NotImplementedError(f"stage {self.stage}: leaky_relu needs a negative slope")
        if self.name in LUT_ACTIVATIONS and (
            self.lut is None or self.lut.function != self.name or self.y_format is None
        ):
            raise NotImplementedError(
                f"stage {self.stage}: {self.name} needs the plan's activation LUT and y format"
            )

    @property
    def uses_lut(self) -> bool:
        """Computed by :class:`LUTActivation` (``tanh``/``sigmoid``)."""
        return self.name in LUT_ACTIVATIONS

    @property
    def stash_bits(self) -> int:
        """Bits stashed per lane for the derivative (``Stage.mask_bits``): 1, or y.bits."""
        return self.y_format.bits if self.uses_lut else 1

    def forward(self, z: Value) -> Value:
        """``a = f(z)`` (same width as ``z`` for ``identity``/``relu``; the caller keeps the
        output format's bits). ``tanh``/``sigmoid`` take :class:`LUTActivation` instead."""
        if self.name == "identity":
            return z
        if self.name == "relu":
            return Mux(z > 0, z, 0)
        if self.uses_lut:
            raise ValueError(f"{self.name} is a LUTActivation, not an expression of z")
        return Mux(z > 0, z, rhu(const_mul(self.slope.value, z, self.shift_add), self.slope.frac))

    def derivative(self, stashed: Value, g: Value) -> Value:
        """``δ = f′(z)·g`` from ``stashed`` = the bit ``z > 0`` (``tanh``/``sigmoid``: the
        output ``y``, signed y.bits) and the error ``g``; |δ| ≤ |g| for every activation."""
        if self.name == "identity":
            return g
        if self.name == "relu":
            return Mux(stashed, g, 0)
        if self.uses_lut:
            f = self.y_format.frac
            y = stashed.as_signed()
            if self.name == "tanh":
                q = rhu((1 << (2 * f)) - y * y, f)
            else:
                q = rhu(y * ((1 << f) - y), f)
            # 0 ≤ q ≤ 2^f: its f + 1 low bits are exact, and g·q is a (d, f + 2)-bit product
            return rhu(g * q[: f + 1], f)
        return Mux(stashed, g, rhu(const_mul(self.slope.value, g, self.shift_add), self.slope.frac))


class LUTActivation(wiring.Component):
    """``tanh`` / ``sigmoid`` of every lane through the plan's interpolated ROM
    (docs/numerics.md §3.4): ``z`` of lane ``l`` with ``en`` → ``y`` of lane ``l`` the next
    cycle, held until the next ``en``.

    The ROM (``act_lut``: ``len(lut.entries)`` words ``entry | slope << entry_bits``, one read
    port per lane, no write port) is read at ``i = min(|z| >> k, K − 1)``; the cycle after,
    ``mag = rhu((entry << k) + slope·r, fe − fl)`` with ``r`` the low ``k = f − fl`` bits of the
    registered ``|z|``, and the sign by symmetry.

    Parameters
    ----------
    lanes: L.
    lut: the stage's :class:`~pipetrain.compiler.plan.ActivationLUT`.
    y_format: Q-format of ``z`` and ``y``.

    Members
    -------
    z: ``In(data.ArrayLayout(signed(y.bits), L))`` the saturated pre-activations.
    en: ``In(1)`` read ``z`` this cycle.
    y: ``Out(data.ArrayLayout(signed(y.bits), L))`` ``f(z)`` of the last ``en``.

    Source: docs/numerics.md §3.4 (the definition); the one-cycle ROM read is *derived*
    (``hdl/mac.py`` reads at S3 the ``z`` it registers for S4).
    """

    def __init__(self, lanes: int, lut: ActivationLUT, y_format: QFormat) -> None:
        self.L, self.lut, self.fy = lanes, lut, y_format
        if y_format.frac < lut.index_frac:
            raise ValueError(f"LUT step 2^-{lut.index_frac} is finer than y = {y_format}")
        yb = y_format.bits
        super().__init__(
            {
                "z": In(data.ArrayLayout(signed(yb), lanes)),
                "en": In(1),
                "y": Out(data.ArrayLayout(signed(yb), lanes)),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        lut, f, yb = self.lut, self.fy.frac, self.fy.bits
        K, k = len(lut.entries), f - lut.index_frac
        eb, sb = lut.entry_bits, lut.slope_bits
        m.submodules.act_lut = rom = Memory(
            shape=unsigned(lut.word_bits), depth=K, init=list(lut.words)
        )
        for lane in range(self.L):
            rp = rom.read_port()
            z = self.z[lane]
            mag3 = Signal(unsigned(yb), name=f"absz3_{lane}")
            m.d.comb += mag3.eq(Mux(z < 0, -z, z))
            idx = mag3 >> k
            m.d.comb += [rp.addr.eq(Mux(idx > K - 1, K - 1, idx)), rp.en.eq(self.en)]
            neg4 = Signal(name=f"neg4_{lane}")
            r4 = Signal(unsigned(max(k, 1)), name=f"r4_{lane}")
            with m.If(self.en):
                m.d.sync += [neg4.eq(z < 0), r4.eq(mag3[:k] if k else 0)]
            entry, slope = rp.data[:eb], rp.data[eb : eb + sb]
            v = (entry << k) + slope * r4 if k else entry
            mag = rhu(v, lut.entry_frac - lut.index_frac)
            if lut.function == "tanh":
                out = Mux(neg4, -mag, mag)
            else:
                out = Mux(neg4, (1 << f) - mag, mag)
            m.d.comb += self.y[lane].eq(out)
        return m


def activation_of(stage: Stage, shift_add: Callable[[int], bool] | None = None) -> Activation:
    """The :class:`Activation` of a plan stage, with the plan's constant-multiplier rule
    ``shift_add`` and (``tanh``/``sigmoid``) its LUT and output format (raises
    NotImplementedError, see there)."""
    name = str(stage.activation)  # the plan's StrEnum member, or a plain name
    slope = stage.negative_slope if name == "leaky_relu" else None
    if name in LUT_ACTIVATIONS:
        lut = getattr(stage, "activation_lut", None)
        return Activation(name, slope, stage.index, shift_add, lut, stage.formats.y)
    return Activation(name, slope, stage.index, shift_add)
