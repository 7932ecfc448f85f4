"""Choosing fixed-point formats from calibrated ranges, and explicit format overrides.

Like hls4ml's ``auto`` precision, but for *training* tensors (docs/architecture.md §4): a
calibration run (:mod:`pipetrain.sim.calibrate`, a step the caller runs: the float PB reference
trainer trains the network on calibration data with the real schedule) records max|value| of
every tensor of every stage and hands those **ranges** to :func:`formats_from_ranges`; each
tensor then gets the fewest integer bits that hold ``headroom`` × its observed maximum and the
rest of its width as fraction bits:

* activations ``x``/``y`` and errors ``d``/``gin``: :data:`DATA_BITS` (16) bits;
* weights ``w``: :data:`WEIGHT_BITS` (24) bits; velocities ``u``: ``u.frac = w.frac`` (they are
  stored in weight units) and as many bits as u's range needs, at least 24.

Tensors shared by two stages (stage s's output ``y`` is stage s+1's input ``x``; stage s's
error ``d`` is stage s+1's input gradient ``gin``) get one format from the larger of the two
observations. The update sum ``m·u + η·δx + ηλ·w`` is aligned to the finest of its terms' fraction
bits (docs/numerics.md §5) and must fit 62 bits; where it would not, the error format gives up
fraction bits (more headroom) until it does, and a note says so. Auxiliary heads are
profiled like the main stages (stage indices after the main ones): their ``y``, ``d``, ``w``
and ``u`` come from their own ranges (``x`` and the input gradient are the attach stage's
tensors); ranges without head entries give them the last main stage's formats.

Explicit overrides (``--format s1.x=Q3.12``, ``--format w=Q3.20``) win over the calibration;
see :func:`apply_overrides`. Source: *derived* (range profiling as in hls4ml's ``auto``
precision, docs/architecture.md §4).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping

from .build import (
    MAX_DATA_BITS,
    MAX_SUM_BITS,
    MAX_WEIGHT_BITS,
    FormatSpec,
    PlanError,
    _Slot,
    _update_constants,
    stage_slots,
)
from .config import TrainConfig
from .conv import p_sum_bits
from .ir import NetworkIR
from .plan import QFormat

__all__ = [
    "HEADROOM",
    "DATA_BITS",
    "WEIGHT_BITS",
    "TENSORS",
    "FormatError",
    "parse_qformat",
    "parse_format_overrides",
    "check_override_widths",
    "format_for_range",
    "Ranges",
    "formats_from_ranges",
    "static_formats",
    "apply_overrides",
]

#: Calibrated max|value| × HEADROOM must fit the format (one spare integer bit).
HEADROOM = 2.0
#: Width of activations and errors (bits).
DATA_BITS = 16
#: Width of weights, and the least width of velocities (bits).
WEIGHT_BITS = 24
#: Tensor names of a stage that have a format.
TENSORS = ("x", "y", "d", "gin", "w", "u")
_GLOBAL_KEYS = (*TENSORS, "logits")


class FormatError(PlanError):
    """A ``--format`` override is malformed, names an unknown stage/tensor, or conflicts."""


def parse_qformat(text: str, bits: int | None = None) -> QFormat:
    """Parse ``Qi.f`` (i integer bits without the sign, f fraction bits; i may be negative)
    into a QFormat of i + f + 1 bits. Raises :class:`FormatError`."""
    m = re.fullmatch(r"\s*[Qq](-?\d+)\.(\d+)\s*", text)
    if not m:
        raise FormatError(
            f"format {text!r} is not Qi.f (i integer bits, f fraction bits, e.g. Q3.12 = 16 bits)"
        )
    i, f = int(m.group(1)), int(m.group(2))
    if i + f + 1 < 2:
        raise FormatError(f"format {text!r} has {i + f + 1} bits; at least 2 are needed")
    return QFormat(i + f + 1, f)


def parse_format_overrides(items: list[str] | tuple[str, ...]) -> dict[str, QFormat]:
    """Parse ``["s1.x=Q3.12", "w=Q3.20"]`` into ``{"s1.x": QFormat(16, 12), …}``.

    Keys: a tensor (``x y d gin w u logits``) for every stage, or ``s<k>.<tensor>`` for stage k
    (1-based; heads after the main stages). One override per item: comma-joined ones
    (``"s1.x=Q3.12,w=Q3.20"``) are refused, naming the repeated ``--format`` that gives them
    (one syntax for the command line, the API's lists and a model file's). Raises
    :class:`FormatError`.
    """
    out: dict[str, QFormat] = {}
    for item in items:
        if "," in item:
            parts = [t.strip() for t in item.split(",") if t.strip()]
            raise FormatError(
                f"--format {item!r} joins {len(parts)} overrides with commas; give --format "
                "once per key: " + " ".join(f"--format {t}" for t in parts)
            )
        if "=" not in item:
            raise FormatError(
                f"--format {item!r} must be KEY=Qi.f, e.g. s1.x=Q3.12 or w=Q3.20 (keys: "
                f"{', '.join(_GLOBAL_KEYS)} or s<stage>.<tensor>)"
            )
        key, value = (t.strip() for t in item.split("=", 1))
        if not (key in _GLOBAL_KEYS or re.fullmatch(r"s\d+\.(x|y|d|gin|w|u)", key)):
            raise FormatError(
                f"--format key {key!r} is unknown; use one of {', '.join(_GLOBAL_KEYS)} (all "
                "stages) or s<stage>.<tensor> with tensor in x, y, d, gin, w, u (e.g. s2.d)"
            )
        fmt = parse_qformat(value)
        if key in out and out[key] != fmt:
            raise FormatError(f"--format {key} is given twice ({out[key]} and {fmt})")
        out[key] = fmt
    return out


def check_override_widths(overrides: Mapping[str, QFormat]) -> None:
    """Refuse an override wider than any plan takes — activations and errors (``x``, ``y``,
    ``d``, ``gin``, ``logits``) at most :data:`~pipetrain.compiler.build.MAX_DATA_BITS` bits,
    weights and velocities (``w``, ``u``) :data:`~pipetrain.compiler.build.MAX_WEIGHT_BITS` —
    before a calibration run spends its seconds on a plan that ``build_plan`` refuses. Raises
    :class:`FormatError` naming the ``--format`` and the widths allowed."""
    for key, fmt in overrides.items():
        tensor = key.split(".")[-1]
        hi = MAX_WEIGHT_BITS if tensor in ("w", "u") else MAX_DATA_BITS
        if fmt.bits > hi:
            kind = "a weight/velocity" if tensor in ("w", "u") else "an activation/error"
            raise FormatError(
                f"--format {key}={fmt} has {fmt.bits} bits; {kind} format has at most {hi} "
                f"(x, y, d, gin, logits: 2..{MAX_DATA_BITS}; w, u: 2..{MAX_WEIGHT_BITS})"
            )


def format_for_range(max_abs: float, bits: int, headroom: float = HEADROOM) -> QFormat:
    """Return Q(bits, f) with the most fraction bits f whose largest value ≥ headroom·max_abs.

    A zero range (a tensor that stayed 0) gets 0 integer bits. Units: max_abs in real value.
    """
    need = headroom * max_abs
    if not math.isfinite(need):
        raise PlanError(f"a calibrated range is not finite ({max_abs}); training diverged")
    if need <= 0:
        return QFormat(bits, bits - 1)
    i = math.ceil(math.log2(need))
    while QFormat(bits, bits - 1 - i).max_value < need:
        i += 1
    while QFormat(bits, bits - i).max_value >= need:  # log2 rounding: take the tighter one
        i -= 1
    return QFormat(bits, bits - 1 - i)


def _int_bits(fmt: QFormat) -> int:
    return fmt.bits - 1 - fmt.frac


#: Calibrated ranges: ``{stage (1-based): {tensor: max|value|}}`` with tensors ``x y d gin w u``
#: (real values), as :mod:`pipetrain.sim.calibrate` records them.
Ranges = Mapping[int, Mapping[str, float]]


def formats_from_ranges(
    ranges: Ranges,
    config: TrainConfig,
    ir: NetworkIR,
    overrides: Mapping[str, QFormat] | None = None,
    headroom: float = HEADROOM,
) -> FormatSpec:
    """Pick every stage's formats from calibrated ``ranges`` (module docstring), then apply
    ``overrides``. ``FormatSpec.ranges`` keeps the ranges; ``source`` is ``"auto"``.

    Raises :class:`PlanError` for a non-finite range (a diverged calibration run), an update
    sum that no 16-bit error format keeps within 62 bits, or bad overrides
    (:class:`FormatError`).
    """
    S = len(ir.layers)
    ranges = {int(s): {k: float(v) for k, v in t.items()} for s, t in ranges.items()}

    def r(stage: int, key: str) -> float:
        return float(ranges.get(stage, {}).get(key, 0.0))

    act = [r(1, "x")] + [max(r(s, "y"), r(s + 1, "x")) for s in range(1, S)] + [r(S, "y")]
    err = [max(r(s, "d"), r(s + 1, "gin") if s < S else 0.0) for s in range(1, S + 1)]
    slots = stage_slots(ir, config)
    for sl in slots[S:]:  # a head's first stage sends its input gradient into the attach stage
        if sl.attach <= S:
            err[sl.attach - 1] = max(err[sl.attach - 1], r(sl.index, "gin"))
    xs = [format_for_range(v, DATA_BITS, headroom) for v in act[:S]]
    logits = format_for_range(act[S], DATA_BITS, headroom)
    ds = [format_for_range(v, DATA_BITS, headroom) for v in err]
    ws = [format_for_range(r(s, "w"), WEIGHT_BITS, headroom) for s in range(1, S + 1)]
    us = []
    for s, w in enumerate(ws, start=1):
        iu = _int_bits(format_for_range(r(s, "u"), WEIGHT_BITS, headroom))
        us.append(QFormat(max(WEIGHT_BITS, iu + 1 + w.frac), w.frac))
    notes: list[str] = []
    ys = [*xs[1:], logits]
    for s in range(S):  # keep the update sum within 62 bits (numerics.md §5)
        extra = p_sum_bits(getattr(slots[s], "conv", None))  # a conv's P sums positions
        ds[s] = _fit_update_sum(config, slots[s], xs[s], ds[s], ws[s], us[s], notes, extra)
    head_slots = slots[S:]
    head_y = [
        logits if sl.activation == "identity" else (xs[sl.attach] if sl.attach < S else logits)
        for sl in head_slots
    ]
    head_d, head_w, head_u = ([f] * len(head_slots) for f in (ds[-1], ws[-1], us[-1]))
    for j, sl in enumerate(head_slots):  # a profiled head: formats from its own ranges
        if sl.index not in ranges:
            continue  # ranges without heads (older calibrations): the last stage's formats
        nxt = sl.index + 1 if j + 1 < len(head_slots) and head_slots[j + 1].attach > S else 0
        head_y[j] = format_for_range(max(r(sl.index, "y"), r(nxt, "x")), DATA_BITS, headroom)
        head_d[j] = format_for_range(max(r(sl.index, "d"), r(nxt, "gin")), DATA_BITS, headroom)
        head_w[j] = format_for_range(r(sl.index, "w"), WEIGHT_BITS, headroom)
        iu = _int_bits(format_for_range(r(sl.index, "u"), WEIGHT_BITS, headroom))
        head_u[j] = QFormat(max(WEIGHT_BITS, iu + 1 + head_w[j].frac), head_w[j].frac)
        x_h = (xs[sl.attach] if sl.attach < S else logits) if sl.attach <= S else head_y[j - 1]
        head_d[j] = _fit_update_sum(config, sl, x_h, head_d[j], head_w[j], head_u[j], notes)
    fs = FormatSpec(
        x=tuple(xs),
        logits=ys[-1],
        d=tuple(ds),
        w=tuple(ws),
        u=tuple(us),
        ranges=ranges,
        head_y=tuple(head_y),
        head_d=tuple(head_d),
        head_w=tuple(head_w),
        head_u=tuple(head_u),
        source="auto",
        notes=tuple(notes),
    )
    return apply_overrides(fs, overrides or {}, ir, config)


def _fit_update_sum(
    config: TrainConfig,
    slot: _Slot,
    x: QFormat,
    d: QFormat,
    w: QFormat,
    u: QFormat,
    notes: list[str],
    p_sum: int = 0,
) -> QFormat:
    """Return stage ``slot``'s error format ``d`` with fraction bits given up until its update
    sum ``m·u + η·δx + ηλ·w`` fits :data:`MAX_SUM_BITS` (docs/numerics.md §5; ``p_sum``: a
    convolution's ⌈log2 P⌉ more bits), appending a note to ``notes`` when it had to. Raises
    :class:`PlanError` when no 16-bit error format does. Source: *derived* (the update
    datapath's width, numerics.md §5)."""
    more = {"p_sum_bits": p_sum} if p_sum else {}
    base = d
    while _update_constants(config, slot.delay, x, d, w, u, **more).sum_bits > MAX_SUM_BITS:
        d = QFormat(d.bits, d.frac - 1)
        if _int_bits(d) > DATA_BITS:
            raise PlanError(
                f"stage {slot.index}: no 16-bit error format keeps the update sum within "
                f"{MAX_SUM_BITS} bits; lower the learning-rate precision or x ({x})"
            )
    if d != base:
        notes.append(
            f"stage {slot.index}: d widened from {base} to {d} so the update sum fits "
            f"{MAX_SUM_BITS} bits"
        )
    return d


#: What the report and the CLI say about formats chosen without calibration data.
UNCALIBRATED_NOTE = (
    "formats not calibrated: static defaults (x/y Q5.10, d Q1.14, "
    "w/u Q3.20){widened}; calibrate on data of the model's width with --data FILE.npz "
    "(data= in pipetrain.host.open / compile_design)"
)


def static_formats(
    weight_max: Mapping[int, float],
    config: TrainConfig,
    ir: NetworkIR,
    overrides: Mapping[str, QFormat] | None = None,
    headroom: float = HEADROOM,
) -> FormatSpec:
    """Formats for a compile without calibration data: :meth:`FormatSpec.default`, with a
    stage's ``w``/``u`` given fewer fraction bits where ``headroom`` × its initial max|w|
    (``weight_max``: ``{stage (1-based): max|w|}``, real value) exceeds Q3.20; then
    ``overrides``. Never narrower than the defaults. ``source`` is ``"static"`` and a note says
    the formats are not calibrated and how to calibrate (:data:`UNCALIBRATED_NOTE`).

    Source: *derived* — without data only the initial weights are known; activations and
    errors keep the static formats (docs/architecture.md §4). Raises :class:`PlanError` for a
    non-finite weight and :class:`FormatError` for bad overrides.
    """
    S = len(ir.layers)
    fs = FormatSpec.default(S)
    w, u = list(fs.w), list(fs.u)
    widened = []
    for s in range(1, S + 1):
        fmt = format_for_range(float(weight_max.get(s, 0.0)), WEIGHT_BITS, headroom)
        if fmt.frac < w[s - 1].frac:
            w[s - 1] = fmt
            u[s - 1] = QFormat(WEIGHT_BITS, fmt.frac)
            widened.append(f"s{s}.w={fmt}")
    S_all = len(stage_slots(ir, config))
    fs = dataclasses.replace(
        fs,
        w=tuple(w),
        u=tuple(u),
        head_w=(w[-1],) * (S_all - S),
        head_u=(u[-1],) * (S_all - S),
        source="static",
        notes=(
            UNCALIBRATED_NOTE.format(
                widened=f", widened for the initial weights: {', '.join(widened)}"
                if widened
                else ""
            ),
        ),
    )
    return apply_overrides(fs, overrides or {}, ir, config)


def apply_overrides(
    fs: FormatSpec,
    overrides: Mapping[str, QFormat],
    ir: NetworkIR,
    config: TrainConfig,
    label: str | None = None,
) -> FormatSpec:
    """Return ``fs`` with explicit formats applied; stage-specific keys win over global ones.
    ``source`` gets `` + overrides (KEY=Qi.f, …)`` appended, or `` + <label>`` when given (the
    board fit's narrowing says which widths, not its dozen overrides).

    Global keys: ``x`` (every stage input), ``y`` (every stage output, logits included), ``d``
    (every error), ``gin`` (every input gradient = the previous stage's ``d``), ``w``, ``u``,
    ``logits``. Stage keys ``s<k>.<tensor>`` address the shared tensor (``s1.y`` is ``s2.x``;
    ``s2.gin`` is ``s1.d``). A head stage's ``x``/``gin`` belong to its attach stage: set them
    there. When ``w`` is overridden but ``u`` is not, ``u`` keeps its integer bits and takes
    ``w``'s fraction bits. Raises :class:`FormatError` for an unknown stage, a head ``x``/``gin``,
    or two stage keys that set one tensor differently.
    """
    if not overrides:
        return fs
    S = len(ir.layers)
    slots = stage_slots(ir, config)
    H = len(slots) - S
    x, d, w, u = list(fs.x), list(fs.d), list(fs.w), list(fs.u)
    logits = fs.logits
    hy, hd, hw, hu = (list(t) for t in (fs.head_y, fs.head_d, fs.head_w, fs.head_u))
    # heads without explicit entries inherit the last stage's formats: materialise them
    hy += [logits] * (H - len(hy))
    hd += [d[-1]] * (H - len(hd))
    hw += [w[-1]] * (H - len(hw))
    hu += [u[-1]] * (H - len(hu))

    # canonical cells: ("x", i) = input of main stage i+1 (i = S: logits), ("d", i), ("w", i),
    # ("u", i); ("hy"/"hd"/"hw"/"hu", j) for head stage j
    def cells(key: str) -> list[tuple[str, int]]:
        if key == "x":
            return [("x", i) for i in range(S)]
        if key == "y":
            return [("x", i) for i in range(1, S + 1)] + [("hy", j) for j in range(H)]
        if key == "logits":
            return [("x", S)]
        if key == "d":
            return [("d", i) for i in range(S)] + [("hd", j) for j in range(H)]
        if key == "gin":
            return [("d", sl.index - 2) for sl in slots[1:S] if sl.gin_losses]
        if key in ("w", "u"):
            return [(key, i) for i in range(S)] + [("h" + key, j) for j in range(H)]
        k_str, tensor = key[1:].split(".")
        k = int(k_str)
        if not 1 <= k <= S + H:
            raise FormatError(
                f"--format {key}: there is no stage {k} (stages 1..{S + H}"
                + (f", heads {S + 1}..{S + H}" if H else "")
                + ")"
            )
        if k <= S:
            cell = {
                "x": ("x", k - 1),
                "y": ("x", k),
                "d": ("d", k - 1),
                "w": ("w", k - 1),
                "u": ("u", k - 1),
            }.get(tensor)
            if tensor == "gin":
                if k == 1:
                    raise FormatError(f"--format {key}: stage 1 has no input gradient")
                cell = ("d", k - 2)
            return [cell]
        j = k - S - 1
        if tensor in ("x", "gin"):
            raise FormatError(
                f"--format {key}: a head stage's {tensor} is its attach stage's "
                f"{'output' if tensor == 'x' else 'error'}; set s{slots[k - 1].attach}."
                f"{'y' if tensor == 'x' else 'd'} instead"
            )
        return [({"y": "hy", "d": "hd", "w": "hw", "u": "hu"}[tensor], j)]

    values: dict[tuple[str, int], QFormat] = {}
    for key in sorted(overrides, key=lambda k: k.startswith("s")):  # global keys first
        fmt = overrides[key]
        specific = key.startswith("s")
        for cell in cells(key):
            if specific and cell in values and values[cell][1] and values[cell][0] != fmt:
                raise FormatError(
                    f"--format {key}={fmt} conflicts with --format {values[cell][2]}="
                    f"{values[cell][0]} (the same tensor)"
                )
            values[cell] = (fmt, specific, key)
    store = {"x": x, "d": d, "w": w, "u": u, "hy": hy, "hd": hd, "hw": hw, "hu": hu}
    for (kind, i), (fmt, _, _) in values.items():
        if kind == "x" and i == S:
            logits = fmt
        else:
            store[kind][i] = fmt
    for wk, uk in (("w", "u"), ("hw", "hu")):
        for i in range(len(store[wk])):
            if (wk, i) in values and (uk, i) not in values:
                old = store[uk][i]
                iu = _int_bits(old)
                frac = store[wk][i].frac
                store[uk][i] = QFormat(max(iu + 1 + frac, 2), frac)
    return dataclasses.replace(
        fs,
        x=tuple(x),
        logits=logits,
        d=tuple(d),
        w=tuple(w),
        u=tuple(u),
        head_y=tuple(hy),
        head_d=tuple(hd),
        head_w=tuple(hw),
        head_u=tuple(hu),
        source=fs.source
        + " + "
        + (label or "overrides (" + ", ".join(f"{k}={v}" for k, v in overrides.items()) + ")"),
    )
