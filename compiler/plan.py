"""The plan: every hardware decision for one network, read by the HDL, golden model and host.

A :class:`Plan` is a tree of frozen dataclasses. It round-trips exactly through JSON
(:meth:`Plan.to_json` / :meth:`Plan.from_json`) and has a content hash (:attr:`Plan.hash`) that
the generated hardware reports in its hello frame. Nothing downstream recomputes a delay, a
format or a constant: it reads them here. The arithmetic these numbers parameterise is
specified in ``docs/numerics.md``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .conv import ConvGeometry
from .enums import Activation, Loss, LwpForm, Mitigation, Rounding, Rule, Schedule, Strategy

__all__ = [
    "QFormat",
    "Const",
    "StageFormats",
    "UpdateConstants",
    "MemorySpec",
    "Product",
    "ActivationLUT",
    "ConvGeometry",
    "Stage",
    "LossUnit",
    "Plan",
    "csd",
    "low_piece_bits",
]

#: Plan format version. 2: every memory the HDL builds is a :class:`MemorySpec` (physical words,
#: ports, kind), stages and loss units carry their stream widths, stash geometry, ŵ width,
#: write stage and pass cycles (they were derived again in ``hdl/``).
PLAN_VERSION = 2

#: Memory kinds of :attr:`MemorySpec.kind`.
MEMORY_KINDS = ("bram", "spram", "lutram", "logic")


def csd(value: int) -> tuple[tuple[int, int], ...]:
    """Canonical signed-digit (non-adjacent) form of an integer: ``((shift, sign), …)`` from the
    least significant digit, sign ±1, with ``Σ sign·2^shift = value`` and the fewest non-zero
    digits (no two adjacent). Source: Reitwiesner (1960), the standard recoding for
    shift-add constant multipliers (``hdl.arith.const_mul``; :meth:`Plan.shift_add`)."""
    out = []
    n, k = int(value), 0
    while n:
        if n & 1:
            d = 2 - (n & 3)
            n -= d
            out.append((k, d))
        n >>= 1
        k += 1
    return tuple(out)


def low_piece_bits(
    value: int,
    bits: int,
    operand_bits: int | None,
    logic_low_bits: int | None,
    shift_add_max_terms: int,
) -> int:
    """Bits ``lo`` of the low piece of a signed ``bits``-wide operand ``v`` that the constant
    product ``value · v`` forms in logic (:attr:`Plan.logic_low_bits`), 0 for none:
    ``value·v = (value·v[lo:] << lo) + value·v[:lo]`` with the top ``operand_bits`` bits
    ``v[lo:]`` (signed) in one multiplier and ``value·v[:lo]`` (``lo`` unsigned bits) a
    select-add in logic (``hdl.arith.select_add``) — exactly the same integer. It applies when
    ``value`` is a multiplier at all (not 0, more than ``shift_add_max_terms`` signed digits,
    :func:`csd`) and ``v`` is wider than ``operand_bits`` by 1..``logic_low_bits`` bits; None
    (a plan without the field or without ``operand_bits``) or 0 never. Source: *derived*
    (Yosys' mul2dsp cuts a 24-bit ``v`` into an 18-bit signed and a 6-bit unsigned piece, one
    DSP block each; the 6-bit one costs a handful of adders instead)."""
    if not value or not operand_bits or not logic_low_bits:
        return 0
    if len(csd(value)) <= shift_add_max_terms:
        return 0
    lo = bits - operand_bits
    return lo if 0 < lo <= logic_low_bits else 0


@dataclass(frozen=True)
class QFormat:
    """Signed two's-complement fixed point Q(bits, frac): value = integer / 2**frac.

    Members
    -------
    bits: total width including the sign bit.
    frac: fractional bits (may exceed ``bits`` for tiny tensors, or be negative).
    """

    bits: int
    frac: int

    @property
    def min_int(self) -> int:
        """Most negative integer, −2^(bits−1)."""
        return -(1 << (self.bits - 1))

    @property
    def max_int(self) -> int:
        """Most positive integer, 2^(bits−1) − 1."""
        return (1 << (self.bits - 1)) - 1

    @property
    def max_value(self) -> float:
        """Largest representable real value."""
        return self.max_int / 2.0**self.frac

    @property
    def lsb(self) -> float:
        """Value of one least-significant bit."""
        return 2.0**-self.frac

    def __str__(self) -> str:
        return f"Q{self.bits - 1 - self.frac}.{self.frac}"


@dataclass(frozen=True)
class Const:
    """A fixed-point constant: real ≈ value / 2**frac.

    Members
    -------
    value: the integer the hardware uses.
    frac: its fractional bits.
    real: the float it approximates (for reports and the reference trainer).
    """

    value: int
    frac: int
    real: float

    @classmethod
    def of(cls, real: float, frac: int) -> Const:
        """Quantise ``real`` with ``frac`` fractional bits (round half to even)."""
        return cls(int(round(real * 2.0**frac)), frac, float(real))

    @classmethod
    def normalised(cls, real: float, mantissa_bits: int = 18) -> Const:
        """Quantise ``real`` so that |value| < 2**mantissa_bits with the most precision."""
        if real == 0.0:
            return cls(0, 0, 0.0)
        frac = mantissa_bits - 1 - math.floor(math.log2(abs(real)))
        c = cls.of(real, frac)
        if abs(c.value) >= 1 << mantissa_bits:  # rounding carried into a new bit
            c = cls.of(real, frac - 1)
        return c

    @classmethod
    def signed_digits(cls, real: float, digits: int, mantissa_bits: int = 18) -> Const:
        """Quantise ``real`` to at most ``digits`` canonical signed digits (a sum of ``digits``
        signed powers of two) at the fraction bits of :meth:`normalised` (``mantissa_bits``),
        so a product with it is ``digits − 1`` adders (``hdl.arith.const_mul``). The digits are
        chosen greedily, each the signed power of two nearest the remainder (ties: the larger
        power). Example: 0.9 at 4 digits, 18 bits → 235520·2^−18 = 1 − 2^−3 + 2^−5 − 2^−7 =
        0.8984375 (0.9 itself has 9 digits at 18 bits).

        Raises ValueError for ``digits`` < 1. Source: the greedy signed-power-of-two
        approximation of constant multipliers (e.g. Lim, Yang, Li, Lim, "Signed power-of-two
        term allocation scheme for the design of digital filters", IEEE TCAS-II 46(5), 1999,
        §II); *derived*: the fraction bits are those of the full-precision constant, so the
        plan's update sums keep their widths."""
        if digits < 1:
            raise ValueError(f"a constant needs at least 1 signed digit, got {digits}")
        base = cls.normalised(real, mantissa_bits)
        if base.value == 0:
            return base
        target, value = real * 2.0**base.frac, 0
        for _ in range(digits):
            rest = target - value
            if abs(rest) < 0.5:  # nearer 0 than any power of two the integer can take
                break
            k = math.floor(math.log2(abs(rest)))  # 2^k ≤ |rest| < 2^(k+1), k ≥ −1
            lo, hi = (1 << k if k >= 0 else 0), 1 << (k + 1)
            step = hi if hi - abs(rest) <= abs(rest) - lo else lo
            value += step if rest > 0 else -step
        if abs(value) >= 1 << mantissa_bits:  # 0.99 at 1 digit: 2^frac, one bit more
            return cls(value >> 1, base.frac - 1, float(real))
        return cls(value, base.frac, float(real))

    @property
    def quantised(self) -> float:
        """The value the hardware actually uses."""
        return self.value / 2.0**self.frac

    @property
    def digits(self) -> tuple[tuple[int, int], ...]:
        """The shift-add terms of ``value``: its canonical signed digits (:func:`csd`)."""
        return csd(self.value)


@dataclass(frozen=True)
class StageFormats:
    """Fixed-point formats of every tensor of one stage (docs/architecture.md §4, docs/numerics.md).

    Members
    -------
    x: the stage's input activations (stashed).
    y: the stage's output (pre- and post-activation share it; the next stage's ``x``).
    d: the error at the stage's output (∂L/∂y, and δ after the activation derivative).
    gin: the input gradient sent back (= the previous stage's ``d``; None for stage 1).
    w: master weights (and biases).
    u: velocity, stored in weight units u = η·v (same ``frac`` as ``w``).
    """

    x: QFormat
    y: QFormat
    d: QFormat
    gin: QFormat | None
    w: QFormat
    u: QFormat


@dataclass(frozen=True)
class UpdateConstants:
    """Fixed-point constants of the momentum/SC update and LWP of one stage.

    u' = sat_u(round(m·u + η·δx + ηλ·w));  w' = sat_w(w − u')  without SC, or
    w' = sat_w(w − round(a·u' + bη·δx + bηλ·w)) with SC;  ŵ = w − H·u (LWP v form).

    Members
    -------
    momentum: m.
    lr: η.
    lr_wd: η·λ.
    sc: whether Spike Compensation is on.
    sc_a: a = m^D (Spike Compensation; 1 without SC).
    sc_lr_b: b·η with b = (1−m^D)/(1−m) (0 without SC).
    sc_lr_wd_b: b·η·λ.
    lwp_horizon: H, the LWP horizon in updates (the stage's delay; 0 without LWP).
    lwp_form: ``v`` or ``w``.
    frac_u: common fraction bits the velocity sum is aligned to before rounding.
    frac_v: common fraction bits the SC sum is aligned to before rounding.
    sum_bits: width of the widest update sum (bits, ≤ 62 so int64 holds it exactly).
    lr_delta: the Q-format of the scaled error ``e_j = rhu(lr·δ_j, k)`` that the learning-rate
        product multiplies with ``x`` (docs/numerics.md §5.3: ``frac = lr.frac + d.frac − k``,
        ``bits`` = the plan's ``operand_bits``, ``k`` the fewest dropped bits that keep every
        ``e`` inside it unclamped); None: the exact product ``lr·δ·x`` (a shift-add ``lr``, a
        convolution's summed gradient, or a plan without ``operand_bits``; then absent from
        the JSON).
    sc_lr_b_delta: the same for Spike Compensation's ``b·lr`` (None without SC).
    """

    momentum: Const
    lr: Const
    lr_wd: Const
    sc: bool
    sc_a: Const
    sc_lr_b: Const
    sc_lr_wd_b: Const
    lwp_horizon: int
    lwp_form: LwpForm
    frac_u: int
    frac_v: int
    sum_bits: int
    lr_delta: QFormat | None = None
    sc_lr_b_delta: QFormat | None = None

    def __post_init__(self) -> None:
        _coerce(self, lwp_form=LwpForm)

    def scaled_errors(self, d: QFormat) -> tuple[tuple[str, Const, QFormat, int], ...]:
        """``(port, c, e, k)`` of each scaled error ``e = rhu(c·δ, k)`` that a learning-rate
        product multiplies with ``x`` (docs/numerics.md §5.3), for δ in format ``d``: η's
        (port ``scaled_lr``, format :attr:`lr_delta`), then Spike Compensation's b·η
        (``scaled_b``, :attr:`sc_lr_b_delta`); ``k = c.frac + d.frac − e.frac`` bits dropped.
        Empty when every learning-rate product is exact. The HDL's error buffer and update
        unit and the golden model read the shifts from here (the scalar oracle and the tests
        recompute them, as independent checks)."""
        out = []
        if self.lr_delta is not None:
            out.append(("scaled_lr", self.lr, self.lr_delta))
        if self.sc and self.sc_lr_b_delta is not None:
            out.append(("scaled_b", self.sc_lr_b, self.sc_lr_b_delta))
        return tuple((n, c, e, c.frac + d.frac - e.frac) for n, c, e in out)


def errors_scaled_at_write(
    activation: str, losses: Sequence[int], upd: UpdateConstants, fd: QFormat
) -> bool:
    """Whether a Linear stage's error buffer forms its scaled errors ``e = rhu(c·g, k)``
    (docs/numerics.md §5.3) once per error ``g`` as it is written — one ``c·g`` multiplier per
    scale for the whole stage, ``e`` kept in the ``sbuf`` memory beside ``gbuf`` — instead of
    ``rhu(c·δ, k)`` in every lane at every slot (``hdl/errbuf.py``; ``Stage.scaled_at_write``).
    True when the stage has a scaled error (:meth:`UpdateConstants.scaled_errors` of ``fd``),
    its δ = f′(z)·g is ``g``
    gated by a mask (``relu``: the stashed bit ``z > 0``; ``identity``: none), so
    ``rhu(c·δ, k) = mask·rhu(c·g, k)`` — the same integers — and it has one update stream
    (``losses``: no earlier stream's δ added to it, the ``sum`` rule of numerics §5.6).
    Source: *derived* (saves ``L − 1`` DSP blocks per scale and takes the rounding out of the
    S2 path of ``e·x``)."""
    if not upd.scaled_errors(fd):
        return False
    name = str(getattr(activation, "value", activation))
    return name in ("relu", "identity") and len(losses) <= 1


def errors_read_as_delta(input_gradient: bool, upd: UpdateConstants, fd: QFormat) -> bool:
    """Whether anything reads a Linear stage's δ itself once its scaled errors are formed at the
    error buffer's write (:func:`errors_scaled_at_write`): its input gradient ``w·δ``, or a
    learning-rate product without a scaled error (a shift-add ``c``: ``c·(δ·x)``). When
    nothing does, the buffer keeps only the scaled errors (no ``gbuf``). Source: *derived*."""
    if input_gradient:
        return True
    exact_lr = upd.lr.value != 0 and upd.lr_delta is None
    exact_b = upd.sc and upd.sc_lr_b.value != 0 and upd.sc_lr_b_delta is None
    return exact_lr or exact_b


@dataclass(frozen=True)
class Product:
    """One multiplier of a stage lane as the HDL builds it (``build.stage_products``).

    Members
    -------
    name: what it multiplies, e.g. ``fwd`` (ŵ·x), ``gin`` (w·δ), ``lr_delta`` (lr·δ),
        ``lr_x`` (e·x), ``momentum`` (m·u); a ``_l<t>`` suffix for interlocking stream ``t``.
    a_bits, b_bits: the operand widths (bits, signed) the multiplier takes: of a constant
        product whose variable operand has a low piece formed in logic
        (:attr:`Plan.logic_low_bits`), that operand's top ``Plan.operand_bits`` bits.
    blocks: 18 × 18 hard multiplier blocks it takes (``build.multiplier_blocks``; 0: shifts
        and adders in logic).
    per_stage: True: one multiplier for the whole stage, not one per lane (the scaled error
        ``c·g`` formed at the error buffer's write, ``build.errors_scaled_at_write``); None
        (absent from the JSON): one per lane.
    """

    name: str
    a_bits: int
    b_bits: int
    blocks: int
    per_stage: bool | None = None


@dataclass(frozen=True)
class MemorySpec:
    """One memory exactly as the HDL builds it, and where the compiler puts it on the target.

    A memory is ``banks`` identical banks, each ``words`` × ``width`` bits (an
    ``amaranth.lib.memory.Memory`` with synchronous read ports, or a single-port RAM,
    ``hdl/spram.py``). Per-lane memories (``per_lane``) have one bank per lane, bank ``l``
    being the HDL submodule ``f"{name}{l}"``; the others are one submodule called ``name``.

    Members
    -------
    name: the HDL submodule name (per-lane: the prefix). Stage: ``w``, ``u`` (weights,
        velocities; ``w_prev`` for the LWP ``w`` form: the weights before the last update),
        ``xstash`` (input stash), ``mask`` (activation-derivative bits), ``gbuf`` (error
        buffer), ``sbuf`` (scaled errors), ``gacc`` (input-gradient partial sums), ``act_lut``
        (tanh/sigmoid ROM).
        Loss unit: ``zbuf`` (logits), ``lut`` (exp ROM), ``ebuf`` (exp values). Top:
        ``results`` (result FIFO storage).
    per_lane: one bank per lane, named ``name0`` … (weights and velocities).
    banks: identical banks (the lanes for per-lane memories, else 1).
    entries: logical entries it holds (stash / mask: sample entries, ``Stage.stash_entries``;
        error buffer: 2 halves; weights: row groups; loss buffers: 1 sample; result FIFO:
        records); each entry is ``words // entries`` words except the FIFO's (see ``words``).
    words: depth of one bank (words).
    width: bits per word.
    read_ports, write_ports: synchronous read ports and write ports of one bank (a single-port
        RAM has one of each sharing one address).
    kind: where the compiler puts it on the plan's RAM family (``Plan.ram_family``):
        ``bram`` (block RAM), ``spram`` (iCE40 UltraPlus SPRAM, single-port stages only),
        ``lutram`` (distributed LUT RAM) or ``logic`` (flip-flops and multiplexers).
        Source: *derived* (``compiler.build.memory_kind``: Yosys memory_libmap's cost rule).
    config_depth, config_width: the block aspect ratio (words × bits) a ``bram``/``spram``
        bank uses (0 for the other kinds).
    blocks_per_bank: blocks of that kind one bank takes, with port copies (a block has two
        ports: a bank with more read ports than one plus a write port needs a copy per read
        port); 0 for ``lutram``/``logic``.
    blocks: banks × blocks_per_bank.
    """

    name: str
    per_lane: bool
    banks: int
    entries: int
    words: int
    width: int
    read_ports: int
    write_ports: int
    kind: str
    config_depth: int
    config_width: int
    blocks_per_bank: int
    blocks: int

    @property
    def bits(self) -> int:
        """Bits of all banks: banks × words × width."""
        return self.banks * self.words * self.width

    @property
    def bank_names(self) -> tuple[str, ...]:
        """The HDL submodule name of each bank (``w0``, ``w1``, … or just ``name``)."""
        if self.per_lane:
            return tuple(f"{self.name}{b}" for b in range(self.banks))
        return (self.name,)


@dataclass(frozen=True)
class ActivationLUT:
    """The interpolated look-up table of a ``tanh`` / ``sigmoid`` stage (docs/numerics.md §3.4).

    For the saturated pre-activation ``z`` (format ``y`` = Q(b, f)), ``a = |z|``,
    ``i = min(a >> k, len(entries) − 1)`` with ``k = f − index_frac``, ``r = a mod 2^k``:
    ``mag = rhu((entries[i] << k) + slopes[i]·r, entry_frac − index_frac)``; ``tanh``:
    ``y = −mag`` if ``z < 0`` else ``mag``; ``sigmoid``: ``y = 2^f − mag`` if ``z < 0`` else
    ``mag``. Max abs error vs the exact function: :attr:`error_bound_lsb` LSBs of ``y``.

    Members
    -------
    function: ``tanh`` or ``sigmoid``.
    index_frac: fl, the table's step 2^−fl on |z| (real units); chosen so that linear
        interpolation is within ¼ LSB of the function (|f″| ≤ 0.770 for tanh, 0.0962 for
        sigmoid), at most ``y.frac``.
    entry_frac: fe = ``y.frac`` + 4 guard bits: entries are ``⌊f(k·2^−fl)·2^fe + ½⌋``.
    entries: the table, k = 0 … K−1 (unsigned, |z| ≥ 0; the last one where the function is
        within ¼ LSB of its limit, or the largest |z| of the format).
    slopes: ``entries[k+1] − entries[k]`` (unsigned), 0 for the last entry.
    entry_bits, slope_bits: widths of one ROM word's fields (entry in the low bits).
    error_bound_lsb: ½ (final rounding) + ¼ (interpolation or tail) + 2^−5 (entry rounding) =
        0.78125 LSBs of ``y`` (*derived*; ``tests/test_activation_lut.py`` enumerates every
        ``z``).
    """

    function: str
    index_frac: int
    entry_frac: int
    entries: tuple[int, ...]
    slopes: tuple[int, ...]
    entry_bits: int
    slope_bits: int
    error_bound_lsb: float

    @property
    def word_bits(self) -> int:
        """Bits of one ROM word: entry_bits + slope_bits."""
        return self.entry_bits + self.slope_bits

    @property
    def words(self) -> tuple[int, ...]:
        """The ROM words: ``entry | slope << entry_bits``."""
        return tuple(
            e | (d << self.entry_bits) for e, d in zip(self.entries, self.slopes, strict=True)
        )


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: a Linear layer with its activation, memories and update logic.

    Members
    -------
    index: 1-based position in execution order (main stages 1..S, then auxiliary heads).
    name: module path of the Linear layer in the user's model.
    role: ``main`` or ``head``.
    block: 1-based block (local/interlocking learning).
    losses: losses that update this stage (1-based; K is the true loss).
    in_features, out_features: N and M (elements).
    activation: ``relu``, ``leaky_relu``, ``identity``, ``tanh`` or ``sigmoid``.
    negative_slope: LeakyReLU slope as a constant (frac 16).
    delay: D_s in updates (samples).
    delay_derivation: how D_s follows from the schedule (text).
    input_gradient: whether the stage computes ∂L/∂x (False for stage 1).
    stash_depth: stashed samples in use, D_s + 1 (docs/architecture.md §2.1).
    stash_bits: bits of the input stash and the activation-derivative mask as built
        (``xstash`` + ``mask`` of ``memories``; the mask keeps :attr:`mask_bits` per output).
    lanes: parallel MAC lanes L; lane l owns rows j ≡ l (mod L).
    row_groups: ⌈M / L⌉ passes of the lanes over the columns.
    cycles_per_tick: memory-bandwidth-bound cycles of the fused pass: row_groups·(N+1).
    weight_bits, velocity_bits: bits of the weight / velocity banks as built: L banks of
        row_groups·(N+1) words (bias column last; padding rows of the last group included).
    memory_bits: Σ bits of ``memories`` (everything the stage's HDL stores).
    memory_blocks: block RAMs (``Plan.ram_family``'s blocks; 18 Kib by default) of the
        ``bram`` memories, port copies included: Σ ``blocks`` of the ``bram`` entries.
    multipliers: the multipliers the stage's HDL instantiates: ``lanes × len(products)``
        (each counted once whatever its operand widths; shift-add constants are not
        multipliers and not counted; their DSP blocks: ``build.hard_multipliers``).
    formats: tensor formats.
    update: update constants.
    lfsr_seeds: per-lane LFSR seeds (non-zero, 32 bit).
    acc_fwd_bits, acc_bwd_bits: accumulator widths of the forward and input-gradient sums.
    attach: for a head stage, the main stage whose output it reads (head stage 1) — the
        previous head stage otherwise; for a main stage, s − 1 (0 = the input).
    grad_losses: losses whose error this stage back-propagates (1-based): the ones in
        ``losses`` (δ·x updates these weights) plus pass-through streams (interlocking: only
        the input gradient is formed, docs/architecture.md §2.4). Global: (K,) everywhere.
    gin_losses: the streams whose input gradient this stage sends back (empty when
        ``input_gradient`` is False).
    memories: every memory the stage's HDL builds (:class:`MemorySpec`), in this order: ``w``,
        ``u`` (per lane), ``xstash``, ``mask``, ``gbuf``, ``sbuf`` (only when the scaled
        errors are formed at the error buffer's write, ``build.errors_scaled_at_write``), then
        ``gacc`` (only with an input
        gradient and row_groups > 1), then ``act_lut`` (``tanh``/``sigmoid`` only). Their
        geometry, from the fields below:

        - ``w``/``u``: L banks × ``cycles_per_tick`` words of w.bits / u.bits; address
          g·(N+1)+i; ``spram`` when ``slot_cycles`` = 2;
        - ``xstash``: ``stash_entries`` × ``x_words`` words of ``x_word_bits``, 2 read ports
          (forward and backward item), 1 write port;
        - ``mask``: ``stash_entries`` × row_groups words of L·``mask_bits`` bits;
        - ``gbuf``: 2 halves × row_groups words of ``d_word_bits`` (written d.bits at a time);
        - ``sbuf``: the same words of L × Σ e.bits (the scaled errors ``e = rhu(c·g, k)`` of
          :meth:`UpdateConstants.scaled_errors`, one lane's written at a time);
        - ``gacc``: N words of ``acc_bwd_bits``;
        - ``act_lut`` (``tanh``/``sigmoid`` only, last): the activation ROM, ``len(entries)``
          words of ``activation_lut.word_bits``, one read port per lane, no write port.
    slot_cycles: cycles per slot of the fused pass: 1, or 2 with single-port weight and
        velocity memories (iCE40 SPRAM: a read, then the write-back of an earlier slot).
    x_lanes: Lw, input values per stash word = the lanes of the stage that writes the stash
        (the ``attach`` stage; 1 for stage 1, whose stash the host writes one value a beat).
    x_words: stash words per sample entry, ⌈N / Lw⌉.
    stash_entries: physical stash entries, ``stash_depth`` + 1: the one more is being written
        by the previous stage (or the host) while the pass runs (*derived*: it replaces a
        separate double buffer; hdl/tick.py allocates entries round-robin).
    x_word_bits: the stash write word, Lw·x.bits (bits; = the writer's ``y_word_bits`` when it
        is a stage, with y = x).
    y_word_bits: the forward output word, L·y.bits (one row group per word).
    d_word_bits: an error-buffer word, L·d.bits (written serially, d.bits at a time).
    gin_bits: the serial input-gradient output, gin.bits (0 without ``input_gradient``).
    what_bits: width of the forward weight ŵ (signed): w.bits, or with LWP (horizon H)
        max(w.bits, u.bits + bitlen(H)) + 1, which holds w − H·u exactly, and w.bits +
        bitlen(H) + 1 for the ``w`` form's w + H·(w − w_prev) (*derived*).
    x_operand_bits: width of the x operand of the forward and update products (signed): x.bits,
        or x.bits + 1 when the bias input 2^x.frac does not fit x's signed range (*derived*).
    update_stage: pipeline stage where u′ and w′ are ready: ``build.PASS_LATENCY`` − 1 = 4 (5
        with Spike Compensation, whose V sum has its own stage), + ``operand_registers``.
    write_stage: pipeline stage of the weight write-back: ``update_stage`` (+ 1 with
        ``operand_registers``), + 1 with single-port memories when it is even (the write must
        fall between reads; *derived*).
    pass_cycles: cycles of one fused pass from the start pulse to done:
        slot_cycles·(cycles_per_tick − 1) + 2 + write_stage (``build.pass_cycles``).
    calibrated: max|value| per tensor observed in the float calibration run (``x``, ``y``,
        ``d``, ``gin``, ``w``, ``u``, …); empty with static formats.
    activation_lut: the :class:`ActivationLUT` of a ``tanh``/``sigmoid`` stage (None otherwise,
        and then absent from the JSON, so plans without one keep their hash).
    weight_operand: the Q-format the forward and input-gradient MACs read the weights in
        (docs/numerics.md §3.2, §5.2): ``ŵ`` and ``w`` rounded half up to ``operand_bits`` bits,
        ``frac = w.frac − (what_bits − operand_bits + 1)`` — one integer bit more than ŵ, so the
        rounding never needs a clamp; None when ``what_bits`` ≤ the plan's ``operand_bits``
        (or it has none): the MACs read ŵ and ``w`` exactly (then absent from the JSON). One
        18 × 18 DSP block per product (ECP5 MULT18X18D) instead of two.
    operand_registers: P = 1 when every multiplier of the stage's lanes (forward, input
        gradient, update) reads operands registered once more, right before it (the products
        one stage later, S3 → S4, and every later stage one later: ``update_stage`` + 1), and
        the weight banks' write data registered once more before the write (``write_stage`` +
        2, ``pass_cycles`` + 2); P = 2 one register more on each (the products two stages later:
        ``update_stage`` + 2, ``write_stage`` and ``pass_cycles`` + 4; on the ECP5 a fabric
        register after each MULT18X18D's output register); None for none (then absent from the
        JSON). Chosen by the board (``Board.operand_registers``: 1 on the ECP5, whose DSP blocks
        sit apart from the lanes' logic; *derived*, timing only: the same integers). Linear
        stages only.
    products: every multiplier of one lane as built (:class:`Product`: name, operand widths,
        18 × 18 blocks), in ``build.stage_products`` order; None in plans from before (then
        absent from the JSON).
    error_beat: B, errors per write of the error buffer of the stage's main stream when a
        loss unit writes B at once (``LossUnit.out_lanes`` of the loss it feeds): the buffer
        then forms its scaled errors ``lr·g`` with B multipliers (a ``Product.per_stage``
        product counts B times); None (omitted from the JSON): one error a write.
    col_lanes: k, column lanes (input-dimension folding): each row's columns are shared by
        k physical lanes, ``mac_lanes`` = L·k in all. Physical lane ``p = s·L + l`` owns row
        ``g·L + l`` and the columns ``i ≡ s (mod k)``; slot ``t`` of row group ``g`` covers
        columns ``t·k … t·k + k − 1`` (``group_slots`` C = ⌈(N + 1)/k⌉ slots a group, the
        bias column N in the last, columns above N are padding with ``x = 0``), so
        ``cycles_per_tick`` = row_groups·C; weight (j, i) lives in lane
        ``(i mod k)·L + j mod L`` at address ``(j div L)·C + i div k``; the ``w``/``u`` banks
        are L·k, the ``xstash`` k banks (host word ``w`` in bank ``w mod k``, address
        ``w div k``), the LFSR seeds L·k; the forward sums a row's k products before its
        accumulator (docs/architecture.md §3.5). Linear stages the host writes (stage 1,
        no input gradient) only. None (omitted from the JSON): one column lane, as plans
        from before.
    streams: local / interlocking learning: the stage's backward streams as ``[loss t, delay
        D_{s,t}]`` pairs in ``grad_losses`` order — the error of L_t reaches the stage D_{s,t}
        updates after its forward of the same sample (``schedule.StageRole.streams``,
        docs/numerics.md §7.2); ``delay`` is the largest D_{s,t} of ``losses``, the shorter
        ones are pass-through streams or, under the ``sum`` rule, earlier update losses.
        None for ``global`` (then absent from the JSON: the one stream is ``[1, delay]``).
    conv: the :class:`~pipetrain.compiler.conv.ConvGeometry` of a convolution stage (None for
        a Linear stage, and then absent from the JSON). A convolution stage's ``in_features``
        / ``out_features`` are the values of one input / output sample (C_in·Πin_size,
        C_out·Πpooled_size); its weight and velocity banks hold the (C_out, T + 1) matrix,
        T = ``conv.taps``, lanes over output channels (``row_groups`` = ⌈C_out / L⌉, each
        bank row_groups·(T + 1) words), and ``cycles_per_tick`` is
        ``conv.conv_cycles`` (docs/numerics.md §9). Its memories: ``w``, ``u``, ``xstash``,
        ``mask`` (stash_entries × row_groups·P words of L bits, P = conv positions),
        ``argmax`` (MaxPool only: stash_entries × row_groups·P′ words of L·⌈log2 window⌉
        bits, P′ = pooled positions), ``gbuf`` (2 × row_groups·P′ words), ``wgacc`` (the
        weight-gradient sums over the positions: L banks × row_groups·(T + 1) words of
        d.bits + x_operand_bits + ⌈log2 P⌉ bits), ``gacc`` (with an input gradient: the
        input-gradient sums, in_features words of ``acc_bwd_bits``).
    """

    index: int
    name: str
    role: str
    block: int
    losses: tuple[int, ...]
    in_features: int
    out_features: int
    activation: Activation
    negative_slope: Const
    delay: int
    delay_derivation: str
    input_gradient: bool
    stash_depth: int
    stash_bits: int
    lanes: int
    row_groups: int
    cycles_per_tick: int
    weight_bits: int
    velocity_bits: int
    memory_bits: int
    memory_blocks: int
    multipliers: int
    formats: StageFormats
    update: UpdateConstants
    lfsr_seeds: tuple[int, ...]
    acc_fwd_bits: int
    acc_bwd_bits: int
    x_lanes: int
    x_words: int
    stash_entries: int
    x_word_bits: int
    y_word_bits: int
    d_word_bits: int
    gin_bits: int
    what_bits: int
    x_operand_bits: int
    update_stage: int
    write_stage: int
    pass_cycles: int
    memories: tuple[MemorySpec, ...]
    attach: int = 0
    grad_losses: tuple[int, ...] = ()
    gin_losses: tuple[int, ...] = ()
    calibrated: dict[str, float] = dataclasses.field(default_factory=dict)
    slot_cycles: int = 1
    activation_lut: ActivationLUT | None = None
    conv: ConvGeometry | None = None
    streams: tuple[tuple[int, int], ...] | None = None
    weight_operand: QFormat | None = None
    products: tuple[Product, ...] | None = None
    operand_registers: int | None = None
    error_beat: int | None = None
    col_lanes: int | None = None

    def __post_init__(self) -> None:
        _coerce(self, activation=Activation)

    @property
    def column_lanes(self) -> int:
        """k, the column lanes of each row (``col_lanes``; 1 when None)."""
        return self.col_lanes or 1

    @property
    def mac_lanes(self) -> int:
        """The stage's physical lanes, ``lanes · column_lanes`` (L·k): each its own weight
        banks, LFSR and multipliers."""
        return self.lanes * self.column_lanes

    @property
    def group_slots(self) -> int:
        """C, the slots of one row group: ``⌈(N + 1) / k⌉`` (N + 1 with one column lane; a
        convolution's T + 1)."""
        return -(-(self.cols + 1) // self.column_lanes)

    def product_count(self, product: Product) -> int:
        """Multipliers ``product`` takes in this stage: ``mac_lanes``, or for a
        ``Product.per_stage`` one (the scaled error at the error buffer's write) one per error
        of a write (``error_beat``, 1 when None)."""
        return (self.error_beat or 1) if product.per_stage else self.mac_lanes

    @property
    def scaled_at_write(self) -> bool:
        """The error buffer forms the scaled errors at its write (:func:`errors_scaled_at_write`
        of this Linear stage; a convolution's lr·P is exact)."""
        if self.conv is not None:
            return False
        return errors_scaled_at_write(self.activation, self.losses, self.update, self.formats.d)

    @property
    def reads_delta(self) -> bool:
        """The error buffer gives δ and has ``gbuf``: unless the scaled errors are formed at
        its write and nothing else reads δ (:func:`errors_read_as_delta`)."""
        if not self.scaled_at_write:
            return True
        return errors_read_as_delta(self.input_gradient, self.update, self.formats.d)

    @property
    def weight_shift(self) -> int:
        """Bits the MACs drop from ``ŵ`` and ``w`` (``w.frac − weight_operand.frac``; 0 when
        they read them exactly)."""
        wo = self.weight_operand
        return 0 if wo is None else self.formats.w.frac - wo.frac

    @property
    def mac_w_frac(self) -> int:
        """Fraction bits of the weight operand of the forward and input-gradient MACs."""
        return self.formats.w.frac - self.weight_shift

    @property
    def mac_w_format(self) -> QFormat:
        """The input-gradient MAC's weight operand as a Q-format (``w_operand_bits`` bits,
        :attr:`mac_w_frac`); the forward operand has the same fraction bits."""
        return QFormat(self.w_operand_bits, self.mac_w_frac)

    @property
    def w_hat_operand_bits(self) -> int:
        """Width (signed) of the forward MAC's weight operand: ``weight_operand.bits`` or
        ``what_bits``."""
        wo = self.weight_operand
        return self.what_bits if wo is None else wo.bits

    @property
    def w_operand_bits(self) -> int:
        """Width (signed) of the input-gradient MAC's weight operand: ``weight_operand.bits`` or
        ``w.bits``."""
        wo = self.weight_operand
        return self.formats.w.bits if wo is None else wo.bits

    @property
    def kind(self) -> str:
        """``linear``, or the convolution's ``conv1d`` / ``conv2d``."""
        return "linear" if self.conv is None else self.conv.kind

    @property
    def rows(self) -> int:
        """Rows of the weight matrix: M (Linear) or C_out (convolution)."""
        return self.out_features if self.conv is None else self.conv.out_channels

    @property
    def cols(self) -> int:
        """Columns of the weight matrix without the bias: N (Linear) or T (convolution)."""
        return self.in_features if self.conv is None else self.conv.taps

    @property
    def mask_bits(self) -> int:
        """Bits the stash keeps per output for the activation derivative (docs/numerics.md §2):
        1 (the bit ``z > 0``), or ``y.bits`` for ``tanh``/``sigmoid`` (the output ``y``)."""
        return self.formats.y.bits if self.activation.lut else 1

    def memory(self, name: str) -> MemorySpec:
        """The memory called ``name`` (``w``, ``xstash``, …). Raises KeyError when the stage has
        none of that name (e.g. ``gacc`` with one row group)."""
        for m in self.memories:
            if m.name == name:
                return m
        raise KeyError(f"stage {self.index} has no memory {name!r}")


@dataclass(frozen=True)
class LossUnit:
    """The loss unit after the last stage (docs/numerics.md, "Loss unit").

    Members
    -------
    kind: ``cross_entropy`` or ``mse``.
    classes: C.
    z: format of the logits (= last stage's ``y``).
    d: format of the error it produces (= last stage's ``d``).
    exp_lut_frac: fl, index step 2^−fl of the exp LUT.
    exp_frac: fe, fraction bits of the LUT entries (entry 0 = 2^fe = e^0).
    exp_lut: the LUT: round(exp(−k·2^−fl)·2^fe), k = 0..size−1.
    recip_frac: fr, fraction bits of the probabilities p_j.
    mse_scale: 2/C (PyTorch MSELoss, mean reduction) as a constant.
    cycles: cycles the loss unit adds to a tick.
    z_lanes: logits per word of the logit buffer = the lanes of the stage feeding it.
    z_words: words of the logit buffer, ⌈C / z_lanes⌉.
    z_word_bits: the logit write word, z_lanes·z.bits (= the feeding stage's ``y_word_bits``).
    memories: every memory the loss unit's HDL builds: ``zbuf`` (z_words × z_word_bits);
        cross-entropy also ``lut`` (the exp ROM: len(exp_lut) words of exp_frac + 1 bits, no
        write port, ``exp_lanes`` read ports) and ``ebuf`` (⌈C / exp_lanes⌉ words of
        exp_lanes·(exp_frac + 1) bits).
    exp_lanes: P, logits through the exp LUT per cycle (divides z_lanes; cross-entropy only).
    div_bits: k, reciprocal quotient bits per cycle (cross-entropy only). P and k change the
        loss unit's cycles and size, never a result (``compiler/loss_unit.py``).
    operand_registers: R = 1 when the board registers its multipliers' operands
        (``Board.operand_registers`` ≥ 1: the ECP5): the cross-entropy out phase's ``e_j`` and
        ``r`` pass R registers and their product one more before ``p``'s rounding register
        (on the ECP5 the MULT18X18D's own), R + 1 cycles more, and the exp phase's LUT
        entries are registered before their sum into E, one cycle more; ``None`` (omitted from
        the JSON): product and rounding in ``p``'s register, the entries summed as read. Never
        a result (timing only).
    out_lanes: Q, errors δ_j the cross-entropy out phase forms per cycle: Q products
        ``e_j·r`` and one write of a word of Q errors into the feeding stage's error buffer
        (its ``Stage.error_beat``); divides ``exp_lanes``. Chosen only where one error a cycle
        leaves the loss unit on the tick (``compiler/loss_unit.py``); ``None`` (omitted from
        the JSON): one. Never a result.
    """

    kind: Loss
    classes: int
    z: QFormat
    d: QFormat
    exp_lut_frac: int
    exp_frac: int
    exp_lut: tuple[int, ...]
    recip_frac: int
    mse_scale: Const
    cycles: int
    z_lanes: int
    z_words: int
    z_word_bits: int
    memories: tuple[MemorySpec, ...]
    exp_lanes: int = 1
    div_bits: int = 1
    operand_registers: int | None = None
    out_lanes: int | None = None

    def __post_init__(self) -> None:
        _coerce(self, kind=Loss)

    @property
    def errors_per_write(self) -> int:
        """Q: the errors of one write into the feeding stage's error buffer (``out_lanes``,
        1 when None)."""
        return self.out_lanes or 1


@dataclass(frozen=True)
class Plan:
    """The whole design: stages, loss unit, schedule, rounding and cost totals.

    Members
    -------
    version: plan format version.
    name: model name.
    in_features: input features per sample.
    schedule, mitigation, lwp_form, strategy, distance, rule: the training algorithm.
    rounding: ``stochastic`` or ``nearest_even`` (weight/velocity updates).
    round_bits: R, random bits per stochastic rounding.
    lfsr_poly: LFSR feedback polynomial including the x^width term.
    lfsr_width: LFSR state bits.
    lfsr_leap: LFSR steps per draw (each draw gives ``lfsr_width`` fresh bits).
    stages: all stages (main, then heads).
    loss: the loss unit.
    tick_cycles: cycles per ``pb`` tick: the slowest pass, or the last stage's pass + the loss
        unit, + tick overhead (``build.tick_cycles``).
    ideal_cycles_per_sample: tick_cycles for ``pb``; for ``sequential`` every stage's forward
        and backward pass + the loss unit + control (``build.sequential_cycles``).
    clock_hz: clock the throughput figure assumes.
    samples_per_s: clock_hz / ideal_cycles_per_sample.
    memory_bits: total over every memory of the design (stages, loss units, ``memories``).
    multipliers: Σ ``Stage.multipliers``: the stages' multipliers as built; the loss units' are
        not counted here — the stage table's total (their own rows), ``report.md``'s
        Multipliers table and the board fit (``fit.multipliers``: DSP blocks) add them.
    memory_budget_bits: the budget validated against (0 = none).
    train: the float training settings (``TrainConfig.to_dict()``, plus ``lr1``/``momentum1``).
    head_losses: one loss unit per auxiliary head (local/interlocking), in block order; loss
        unit k reads the last stage of head k and is loss L_k.
    memory_blocks: block RAMs of ``ram_family`` over every memory of the design (stages, loss
        units, ``memories``), port copies included.
    const_bits: significant bits of the update constants (``build.CONST_MANTISSA_BITS`` by
        default; fewer make them shifts and short shift-add chains on small FPGAs).
    memories: memories of the network top outside the stages and loss units: ``results``, the
        result FIFO (``result_fifo_depth`` records of ``result_bits``; Amaranth's
        ``SyncFIFOBuffered`` keeps depth − 1 of them in a memory, one in its output register).
    result_fifo_depth: records the top's result FIFO buffers (docs/ports.md ``result_out``).
    result_bits: bits of one buffered result record (pred 16 + loss 32 + train 1; the sample
        number is the pop count, not stored).
    shift_add_max_terms: a constant with at most this many signed digits (:func:`csd`) is
        multiplied with shifts and adders, not a multiplier (:meth:`shift_add`;
        ``build.SHIFT_ADD_MAX_TERMS``: two adders of ~20 bits are cheaper than a DSP block).
    operand_bits: the widest variable operand of a datapath multiplier (bits, signed; 18: one
        ECP5 MULT18X18D block per product): the MACs' weight operand
        (``Stage.weight_operand``) and the learning-rate product's scaled error
        (``UpdateConstants.lr_delta``) are rounded to it; master weights and velocities keep
        their own width. None in plans from before (then absent from the JSON: every product
        exact).
    logic_low_bits: the widest low piece of a constant product formed in logic (bits; 0:
        never): momentum × u, ``lr_wd`` × w, SC's ``a`` × u′ and ``b·lr·λ`` × w and LWP's
        H × u (or × (w − w_prev)) with a constant that is not a shift-add and a variable
        operand wider than ``operand_bits`` by at most this many bits give the top
        ``operand_bits`` bits to one multiplier (one 18 × 18 block) and form the constant ×
        the low bits with adders (:meth:`low_piece`, :func:`low_piece_bits`; the same
        integers). Chosen per board family (``build.LOGIC_LOW_BITS``, ``Board.logic_low_bits``:
        8 on the ECP5, 0 on the iCE40, whose logic cells are full). None: never — plans from
        before the field and plans built with 0 (``build_plan`` records 0 as None, absent from
        the JSON, so such a plan keeps its JSON and hash).
    ram_family: the RAM the memories' ``kind`` and ``blocks`` were decided for
        (``build.RAM_FAMILIES``): ``bram18`` (18 Kib dual-port blocks and 16 × 4 LUT RAM:
        ECP5 DP16KD / TRELLIS_DPR16X4, Xilinx RAMB18) or ``ice40`` (4 Kib EBR, no LUT RAM,
        SPRAM for single-port stages).
    momentum_in_logic: True when every Linear stage forms ``m·u`` in logic — shifts and adders
        over the canonical signed digits of the momentum, whatever their number, its adder
        tree spread over the lane's operand registers (``hdl.arith.pipelined_const_mul``) —
        instead of a multiplier: one DSP block a lane fewer, about (digits − 1) × (u.bits +
        digit span) adder bits a lane more (``fit.logic_cells``), the same integers (no
        ``momentum`` product in ``Stage.products``). Chosen by the board fit where the DSP
        blocks bind the lanes (``compiler/fit.py``); None (omitted from the JSON): the
        constant rules (``shift_add_max_terms``, ``logic_low_bits``). *Derived*.
    """

    version: int
    name: str
    in_features: int
    schedule: Schedule
    mitigation: Mitigation
    lwp_form: LwpForm
    strategy: Strategy
    distance: int
    rule: Rule
    rounding: Rounding
    round_bits: int
    lfsr_poly: int
    lfsr_width: int
    lfsr_leap: int
    stages: tuple[Stage, ...]
    loss: LossUnit
    tick_cycles: int
    ideal_cycles_per_sample: int
    clock_hz: float
    samples_per_s: float
    memory_bits: int
    multipliers: int
    memory_budget_bits: int
    train: dict[str, Any]
    head_losses: tuple[LossUnit, ...] = ()
    memory_blocks: int = 0
    const_bits: int = 18
    memories: tuple[MemorySpec, ...] = ()
    result_fifo_depth: int = 3
    result_bits: int = 49
    ram_family: str = "bram18"
    shift_add_max_terms: int = 3
    operand_bits: int | None = None
    logic_low_bits: int | None = None
    momentum_in_logic: bool | None = None

    def shift_add(self, value: int) -> bool:
        """Whether ``value`` is multiplied with shifts and adders (at most
        :attr:`shift_add_max_terms` signed digits, :func:`csd`) rather than a multiplier; the
        multiplier estimate (``build.multiplier_operands``) follows the same rule."""
        return len(csd(value)) <= self.shift_add_max_terms

    def low_piece(self, value: int, bits: int) -> int:
        """Low bits of a ``bits``-wide operand that ``value ·`` it forms in logic (0: none;
        :attr:`logic_low_bits`, :func:`low_piece_bits`); ``build.stage_products`` follows the
        same rule."""
        return low_piece_bits(
            value, bits, self.operand_bits, self.logic_low_bits, self.shift_add_max_terms
        )

    def all_memories(self) -> tuple[tuple[str, MemorySpec], ...]:
        """Every memory of the design with its owner: ``("stage<index>", m)`` for the stages,
        ``("loss", m)`` for the main loss unit, ``("head_loss<k>", m)`` for head loss units
        (not built by the HDL yet), ``("top", m)`` for :attr:`memories`."""
        out = [(f"stage{s.index}", m) for s in self.stages for m in s.memories]
        out += [("loss", m) for m in self.loss.memories]
        out += [
            (f"head_loss{k}", m)
            for k, lu in enumerate(self.head_losses, start=1)
            for m in lu.memories
        ]
        out += [("top", m) for m in self.memories]
        return tuple(out)

    def __post_init__(self) -> None:
        _coerce(
            self,
            schedule=Schedule,
            mitigation=Mitigation,
            lwp_form=LwpForm,
            strategy=Strategy,
            rule=Rule,
            rounding=Rounding,
        )

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One input sample's shape: (C, L) / (C, H, W) when stage 1 is a convolution, else
        (in_features,)."""
        first = self.stages[0]
        return first.conv.in_shape if first.conv is not None else (self.in_features,)

    @property
    def main_stages(self) -> tuple[Stage, ...]:
        """The stages of the main network (no auxiliary heads), in order."""
        return tuple(s for s in self.stages if s.role == "main")

    @property
    def head_stages(self) -> tuple[Stage, ...]:
        """The auxiliary-head stages (local/interlocking learning), in order."""
        return tuple(s for s in self.stages if s.role == "head")

    @property
    def delays(self) -> tuple[int, ...]:
        """D_s of every stage, in order."""
        return tuple(s.delay for s in self.stages)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (exact: floats are kept as Python floats)."""
        return _to_jsonable(self)

    def to_json(self) -> str:
        """Return canonical JSON (sorted keys, 2-space indent)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        """Rebuild a plan from :meth:`to_dict` output, checking every field's type, range and
        consistency (``compiler/plan_check.py``). Raises ``PlanError`` (a ``ValueError``)
        naming the field and its valid values, also for another plan version."""
        from .plan_check import plan_from_dict

        return plan_from_dict(d)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """Rebuild a plan from :meth:`to_json` output, checked as :meth:`from_dict`; invalid
        JSON, a duplicate key or a NaN/Infinity is a ``PlanError`` too."""
        from .plan_check import plan_from_json

        return plan_from_json(text)

    @property
    def hash(self) -> str:
        """SHA-256 (hex, first 16 digits) of the canonical JSON: the design's identity."""
        canon = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()[:16]


def _coerce(obj: Any, **kinds: type[Enum]) -> None:
    """Convert the named fields of a frozen dataclass to their enums (strings from JSON or a
    caller); a value outside the set raises ``ValueError`` naming the field."""
    for name, kind in kinds.items():
        value = getattr(obj, name)
        try:
            object.__setattr__(obj, name, kind(value))
        except ValueError:
            allowed = ", ".join(m.value for m in kind)
            raise ValueError(
                f"{type(obj).__name__}.{name}={value!r} is not one of: {allowed}"
            ) from None


def _to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        # an optional field left at its default None is omitted (from_dict restores it), so
        # adding one keeps the JSON and hash of every plan that does not use it
        return {
            f.name: _to_jsonable(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if not (f.default is None and getattr(obj, f.name) is None)
        }
    if isinstance(obj, (tuple, list)):
        return [_to_jsonable(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _to_jsonable(v) for k, v in obj.items()}
    return obj
