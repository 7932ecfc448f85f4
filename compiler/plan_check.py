"""Reading a plan from JSON strictly: every field's type, range and consistency is checked.

A ``plan.json`` is written by the compiler (:meth:`Plan.to_json`); one edited by hand or
damaged must not load into a silently different design. :func:`plan_from_json` therefore
accepts exactly what :meth:`Plan.to_json` writes and raises a :class:`PlanError` naming the
field (a JSON path such as ``stages[1].formats.w.bits``) and its valid values otherwise:

* the document: valid JSON, no duplicate keys (``json`` would keep the last one silently),
  no ``NaN``/``Infinity``, an object of plan version :data:`~pipetrain.compiler.plan.PLAN_VERSION`;
* every object has exactly its dataclass's fields — a missing key is an error (the only
  exception: an optional field whose default is ``None`` is absent when unset, as
  :meth:`Plan.to_json` writes it), an unknown key is an error (it would be dropped);
* types as annotated: integers are JSON integers (not ``true``, not ``2.0``), floats are
  finite numbers, enums one of their values, tuples JSON arrays;
* ranges (:data:`INT_RANGES`; unlisted integers: |v| < 2^62, what ``int64`` arithmetic holds);
* consistency: the derived quantities the HDL, the golden model and the host read
  (row groups, cycles, stash geometry, stream word widths, pass cycles, memory totals, the
  lanes and formats that link stages and the loss unit, the tick, the training settings) agree
  with the numbers they are derived from (the formulas of ``compiler/build.py``); the update
  constants, ŵ / operand / accumulator widths, pipeline stages, multipliers, LFSR seeds,
  LeakyReLU slope, activation LUT and the loss unit (exp LUT included) must be exactly what
  the compiler derives from the plan's formats, delays and training settings — so an accepted
  plan is one the compiler can produce, and the golden model and the HDL agree on it.

Source: *derived* (docs/architecture.md §1.2: the plan is the one source of every hardware
decision; §1.4: a user error names the problem and the fix).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from enum import Enum
from typing import Any

from .act_lut import activation_lut
from .build import (
    HOST_ONLY_SETTINGS,
    MAX_SUM_BITS,
    OPTIONAL_SETTINGS,
    RAM_FAMILIES,
    SLOPE_FRAC,
    PlanError,
    _ceil_log2,
    _loss_unit,
    _update_constants,
    conv_accumulator_bits,
    forward_cycles,
    forward_weight_bits,
    input_gradient_macs,
    lfsr_seeds,
    loss_writes_words,
    p_sum_bits,
    pass_cycles,
    sequential_cycles,
    shift_add,
    stage_cycles,
    stage_multipliers,
    stage_products,
    tick_cycles,
    update_stage,
    weight_operand,
    write_stage,
    x_operand_bits,
)
from .config import ConfigError, TrainConfig
from .conv import CONV_KINDS, POOL_KINDS, conv_geometry, stash_words
from .loss_unit import DIV_BITS_MAX
from .plan import MEMORY_KINDS, PLAN_VERSION, Const, Plan
from .schedule import stage_layout

__all__ = ["INT_RANGES", "plan_from_dict", "plan_from_json"]

#: Largest magnitude of an integer field without its own range: int64 arithmetic holds it.
INT_LIMIT = 1 << 62

#: Valid ranges ``(lo, hi)`` (inclusive; None: unbounded up to :data:`INT_LIMIT`) of integer
#: fields, by ``(class name, field)``; for tuples of integers, the range of each element.
INT_RANGES: dict[tuple[str, str], tuple[int, int | None]] = {
    ("QFormat", "bits"): (2, MAX_SUM_BITS),
    ("QFormat", "frac"): (-128, 256),
    ("Const", "frac"): (-256, 512),
    ("UpdateConstants", "lwp_horizon"): (0, None),
    ("UpdateConstants", "frac_u"): (-256, 512),
    ("UpdateConstants", "frac_v"): (-256, 512),
    ("UpdateConstants", "sum_bits"): (1, MAX_SUM_BITS),
    ("MemorySpec", "banks"): (1, None),
    ("MemorySpec", "entries"): (1, None),
    ("MemorySpec", "words"): (1, None),
    ("MemorySpec", "width"): (1, None),
    ("MemorySpec", "read_ports"): (0, None),
    ("MemorySpec", "write_ports"): (0, 1),
    ("MemorySpec", "config_depth"): (0, None),
    ("MemorySpec", "config_width"): (0, None),
    ("MemorySpec", "blocks_per_bank"): (0, None),
    ("MemorySpec", "blocks"): (0, None),
    ("Stage", "index"): (1, None),
    ("Stage", "block"): (1, None),
    ("Stage", "losses"): (1, None),
    ("Stage", "grad_losses"): (1, None),
    ("Stage", "gin_losses"): (1, None),
    ("Stage", "in_features"): (1, None),
    ("Stage", "out_features"): (1, None),
    ("Stage", "delay"): (0, None),
    ("Stage", "stash_depth"): (1, None),
    ("Stage", "stash_bits"): (0, None),
    ("Stage", "lanes"): (1, None),
    ("Stage", "row_groups"): (1, None),
    ("Stage", "cycles_per_tick"): (1, None),
    ("Stage", "weight_bits"): (0, None),
    ("Stage", "velocity_bits"): (0, None),
    ("Stage", "memory_bits"): (0, None),
    ("Stage", "memory_blocks"): (0, None),
    ("Stage", "multipliers"): (0, None),
    ("Stage", "lfsr_seeds"): (1, (1 << 32) - 1),
    ("Stage", "acc_fwd_bits"): (1, MAX_SUM_BITS),
    ("Stage", "acc_bwd_bits"): (1, MAX_SUM_BITS),
    ("Stage", "x_lanes"): (1, None),
    ("Stage", "x_words"): (1, None),
    ("Stage", "stash_entries"): (2, None),
    ("Stage", "x_word_bits"): (1, None),
    ("Stage", "y_word_bits"): (1, None),
    ("Stage", "d_word_bits"): (1, None),
    ("Stage", "gin_bits"): (0, MAX_SUM_BITS),
    ("Stage", "what_bits"): (2, MAX_SUM_BITS),
    ("Stage", "x_operand_bits"): (2, MAX_SUM_BITS),
    ("Stage", "update_stage"): (0, None),
    ("Stage", "write_stage"): (0, None),
    ("Stage", "pass_cycles"): (1, None),
    ("Stage", "operand_registers"): (1, 2),
    ("Stage", "error_beat"): (2, None),
    ("Stage", "col_lanes"): (2, None),
    ("Stage", "attach"): (0, None),
    ("Stage", "slot_cycles"): (1, 2),
    ("LossUnit", "classes"): (1, None),
    ("LossUnit", "exp_lut_frac"): (-64, 64),
    ("LossUnit", "exp_frac"): (0, MAX_SUM_BITS),
    ("LossUnit", "exp_lut"): (0, None),
    ("LossUnit", "recip_frac"): (0, MAX_SUM_BITS),
    ("LossUnit", "cycles"): (1, None),
    ("LossUnit", "z_lanes"): (1, None),
    ("LossUnit", "z_words"): (1, None),
    ("LossUnit", "z_word_bits"): (1, None),
    ("LossUnit", "exp_lanes"): (1, None),
    ("LossUnit", "div_bits"): (1, DIV_BITS_MAX),
    ("LossUnit", "operand_registers"): (1, 1),
    ("LossUnit", "out_lanes"): (2, None),
    ("Plan", "version"): (PLAN_VERSION, PLAN_VERSION),
    ("Plan", "in_features"): (1, None),
    ("Plan", "distance"): (0, None),
    ("Plan", "round_bits"): (1, 64),
    ("Plan", "lfsr_poly"): (1, None),
    ("Plan", "lfsr_width"): (2, 64),
    ("Plan", "lfsr_leap"): (1, None),
    ("Plan", "tick_cycles"): (1, None),
    ("Plan", "ideal_cycles_per_sample"): (1, None),
    ("Plan", "memory_bits"): (0, None),
    ("Plan", "multipliers"): (0, None),
    ("Plan", "memory_budget_bits"): (0, None),
    ("Plan", "memory_blocks"): (0, None),
    ("Plan", "const_bits"): (1, MAX_SUM_BITS),
    ("Plan", "result_fifo_depth"): (2, None),
    ("Plan", "result_bits"): (1, None),
    ("Plan", "shift_add_max_terms"): (0, None),
    ("Plan", "operand_bits"): (2, MAX_SUM_BITS),
    ("Plan", "logic_low_bits"): (0, MAX_SUM_BITS),
    ("Product", "a_bits"): (1, MAX_SUM_BITS),
    ("Product", "b_bits"): (1, MAX_SUM_BITS),
    ("Product", "blocks"): (0, None),
    ("ConvGeometry", "in_channels"): (1, None),
    ("ConvGeometry", "out_channels"): (1, None),
    ("ConvGeometry", "in_size"): (1, None),
    ("ConvGeometry", "kernel"): (1, None),
    ("ConvGeometry", "stride"): (1, 2),
    ("ConvGeometry", "padding"): (0, None),
    ("ConvGeometry", "out_size"): (1, None),
    ("ConvGeometry", "pool_size"): (1, None),
    ("ConvGeometry", "pooled_size"): (1, None),
    ("ConvGeometry", "pool_scale"): (1, None),
    ("ConvGeometry", "pool_shift"): (0, 64),
}

#: Valid values of string fields, by ``(class name, field)``.
STR_CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("Stage", "role"): ("main", "head"),
    ("MemorySpec", "kind"): MEMORY_KINDS,
    ("Plan", "ram_family"): tuple(RAM_FAMILIES),
    ("ConvGeometry", "kind"): tuple(CONV_KINDS),
    ("ConvGeometry", "pool"): POOL_KINDS,
}

_FIX = "plan.json is written by `pipetrain compile`: recompile the model rather than edit it"


def _err(path: str, value: Any, problem: str) -> PlanError:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return PlanError(f"plan field {path} = {text}: {problem} ({_FIX})")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise PlanError(f"plan.json has the key {k!r} twice in one object ({_FIX})")
        out[k] = v
    return out


def _no_constant(name: str) -> float:
    raise PlanError(f"plan.json holds {name}, not a finite number ({_FIX})")


def plan_from_json(text: str) -> Plan:
    """Read a plan from :meth:`Plan.to_json` text, checking every field (module docstring).

    Raises :class:`PlanError` (one line: the field's JSON path, its value, what is valid) for
    invalid JSON, duplicate keys, non-finite numbers, a version other than
    :data:`~pipetrain.compiler.plan.PLAN_VERSION`, missing or unknown keys, wrong types,
    out-of-range values and inconsistent derived quantities.
    """
    try:
        d = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise PlanError(
            f"plan.json is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} "
            f"({_FIX})"
        ) from None
    except RecursionError:
        raise PlanError(f"plan.json is nested too deeply to be a plan ({_FIX})") from None
    return plan_from_dict(d)


def plan_from_dict(d: Any) -> Plan:
    """Build a :class:`Plan` from :meth:`Plan.to_dict` output, checking every field (module
    docstring). Raises :class:`PlanError` naming the field, as :func:`plan_from_json`."""
    if not isinstance(d, dict):
        raise PlanError(f"a plan is a JSON object, not {type(d).__name__} ({_FIX})")
    if d.get("version") != PLAN_VERSION:
        raise PlanError(
            f"plan version {d.get('version')!r} is not supported (this pipetrain reads "
            f"version {PLAN_VERSION}); recompile the model"
        )
    plan = _load(Plan, d, "")
    _check_plan(plan)
    return plan


# -- types and ranges ----------------------------------------------------------------------------
def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _load(tp: Any, value: Any, path: str, owner: tuple[str, str] | None = None) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if value is None else _load(args[0], value, path, owner)
    if dataclasses.is_dataclass(tp):
        return _load_dataclass(tp, value, path)
    if origin is tuple:
        if not isinstance(value, list):
            raise _err(path, value, "must be a JSON array")
        (arg, *_) = typing.get_args(tp)
        return tuple(_load(arg, v, f"{path}[{k}]", owner) for k, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise _err(path, value, "must be a JSON object")
        _, vt = typing.get_args(tp)
        return {k: _load(vt, v, _join(path, k), owner) for k, v in value.items()}
    if tp is Any:
        return value
    if isinstance(tp, type) and issubclass(tp, Enum):
        allowed = [m.value for m in tp]
        if not isinstance(value, str) or value not in allowed:
            raise _err(path, value, f"must be one of {', '.join(allowed)}")
        return tp(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise _err(path, value, "must be true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _err(path, value, "must be an integer")
        lo, hi = INT_RANGES.get(owner, (-INT_LIMIT, None)) if owner else (-INT_LIMIT, None)
        hi = INT_LIMIT if hi is None else hi
        if not lo <= value <= hi:
            raise _err(path, value, f"must be in {lo}..{hi}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _err(path, value, "must be a number")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise _err(path, value, "must be a finite number")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise _err(path, value, "must be a string")
        choices = STR_CHOICES.get(owner) if owner else None
        if choices is not None and value not in choices:
            raise _err(path, value, f"must be one of {', '.join(choices)}")
        return value
    raise _err(path, value, f"has a type this reader does not know ({tp!r})")  # a bug


@functools.cache
def _hints(tp: Any) -> dict[str, Any]:
    return typing.get_type_hints(tp)


def _load_dataclass(tp: Any, value: Any, path: str) -> Any:
    where = path or "the plan"
    if not isinstance(value, dict):
        raise _err(path or "(plan)", value, f"must be a JSON object ({tp.__name__})")
    fields = dataclasses.fields(tp)
    names = {f.name for f in fields}
    extra = sorted(set(value) - names)
    if extra:
        raise PlanError(
            f"plan field {_join(path, extra[0])} is not a field of {tp.__name__} ({where} has "
            f"unknown key(s) {', '.join(map(repr, extra))}; valid: {', '.join(sorted(names))}) "
            f"({_FIX})"
        )
    missing = [f.name for f in fields if f.name not in value and f.default is not None]
    if missing:
        raise PlanError(
            f"plan field {_join(path, missing[0])} is missing ({where} lacks "
            f"{', '.join(missing)}) ({_FIX})"
        )
    hints = _hints(tp)
    kw = {
        f.name: _load(hints[f.name], value[f.name], _join(path, f.name), (tp.__name__, f.name))
        for f in fields
        if f.name in value
    }
    return tp(**kw)


# -- consistency ---------------------------------------------------------------------------------
def _streams(plan: Plan, cfg: TrainConfig) -> list[tuple[tuple[int, int], ...] | None]:
    """Every stage's ``streams`` as the compiler derives them from the training settings
    (``schedule.stage_layout``; None for ``global``)."""
    if cfg.strategy == "global":
        return [None] * len(plan.stages)
    S = sum(1 for s in plan.stages if s.role == "main")
    try:
        roles = stage_layout(
            S, cfg.schedule, cfg.strategy, cfg.blocks, cfg.distance, cfg.rule, cfg.head_stages
        )
    except ValueError as exc:
        raise PlanError(f"plan field train: {exc}") from None
    if len(roles) != len(plan.stages):
        raise _err("stages", len(plan.stages), f"must be {len(roles)} stages for train's blocks")
    return [r.streams for r in roles]


def _multipliers_before_products(st: Any) -> int:
    """Multipliers per lane that plans written before ``Stage.products`` carry (used only to
    read those plans unchanged): forward and update product (2), input-gradient MACs (one per
    stream sent on, :func:`input_gradient_macs`), momentum and learning-rate scaling (+1, +1
    more for the Spike Compensation sum), a ``tanh``/``sigmoid`` LUT +3 and an AvgPool scale
    that is not a shift-add +2 — whether or not a constant is built from shifts and adders.
    Plans with ``products`` count ``len(products)`` instead (what the HDL instantiates)."""
    gin = input_gradient_macs(st.losses, st.grad_losses, st.gin_losses) if st.input_gradient else 0
    lut = 3 if st.activation.lut else 0
    g = st.conv
    pool = 2 if g is not None and g.pool == "avg" and not shift_add(g.pool_scale) else 0
    return 2 + max(gin, 1 if st.input_gradient else 0) + (2 if st.update.sc else 1) + lut + pool


def _same(path: str, value: Any, expected: Any, rule: str) -> None:
    if value != expected:
        raise _err(path, value, f"must be {rule} = {expected!r}")


def _same_fields(path: str, value: Any, expected: Any, rule: str) -> None:
    """``value == expected`` for two dataclasses, naming the first field that differs."""
    if value == expected:
        return
    for f in dataclasses.fields(expected):
        a, b = getattr(value, f.name), getattr(expected, f.name)
        if a != b:
            if dataclasses.is_dataclass(b) and type(a) is type(b):
                _same_fields(_join(path, f.name), a, b, rule)
            _same(_join(path, f.name), a, b, rule)
    _same(path, value, expected, rule)  # pragma: no cover (a difference outside the fields)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _check_memories(path: str, memories: Any) -> None:
    seen: set[str] = set()
    for k, m in enumerate(memories):
        p = f"{path}[{k}]"
        if m.name in seen:
            raise _err(f"{p}.name", m.name, "must be unique among the memories of its owner")
        seen.add(m.name)
        _same(f"{p}.blocks", m.blocks, m.banks * m.blocks_per_bank, "banks × blocks_per_bank")


def _check_stage(plan: Plan, i: int, cfg: TrainConfig) -> None:
    st = plan.stages[i]
    p = f"stages[{i}]"
    N, M, L = st.in_features, st.out_features, st.lanes
    f = st.formats
    _same(f"{p}.index", st.index, i + 1, "its position in stages (1-based)")
    if st.conv is not None:
        _check_conv(plan, i, p)
    if L > st.rows:
        raise _err(f"{p}.lanes", L, f"must be in 1..the stage's rows ({st.rows})")
    _same(f"{p}.row_groups", st.row_groups, _ceil(st.rows, L), "⌈rows / lanes⌉")
    k = st.column_lanes
    if k < 1 or k > N + 1 or (k > 1 and (st.conv is not None or st.attach or st.input_gradient)):
        raise _err(f"{p}.col_lanes", st.col_lanes, "k in 2..N + 1, on stage 1 only (or null)")
    cycles = stage_cycles(N, M, L, st.conv, k)[1]
    _same(f"{p}.cycles_per_tick", st.cycles_per_tick, cycles, "build.stage_cycles")
    _same(f"{p}.stash_depth", st.stash_depth, st.delay + 1, "delay + 1")
    _same(f"{p}.stash_entries", st.stash_entries, st.stash_depth + 1, "stash_depth + 1")
    writer = plan.stages[st.attach - 1].conv if st.attach else None
    _same(f"{p}.x_words", st.x_words, stash_words(N, st.x_lanes, writer), "conv.stash_words")
    _same(f"{p}.x_word_bits", st.x_word_bits, st.x_lanes * f.x.bits, "x_lanes·x.bits")
    _same(f"{p}.y_word_bits", st.y_word_bits, L * f.y.bits, "lanes·y.bits")
    _same(f"{p}.d_word_bits", st.d_word_bits, L * f.d.bits, "lanes·d.bits")
    _same(f"{p}.input_gradient", st.input_gradient, bool(st.gin_losses), "gin_losses ≠ ()")
    _same(f"{p}.streams", st.streams, _streams(plan, cfg)[i], "stage_layout's streams of train")
    if st.input_gradient and f.gin is None:
        raise _err(f"{p}.formats.gin", None, "must be a format: the stage has an input gradient")
    gin_bits = f.gin.bits if st.input_gradient and f.gin is not None else 0
    _same(f"{p}.gin_bits", st.gin_bits, gin_bits, "gin.bits with an input gradient, else 0")
    _same(f"{p}.lfsr_seeds", len(st.lfsr_seeds), L * k, "one seed per lane (L·k): its length")
    # the arithmetic's constants and widths: what the compiler derives from the formats, the
    # delay and the training settings (golden model and HDL both read them, so a changed one
    # would be a different design than the one these settings describe)
    seeds = lfsr_seeds(cfg.seed, st.index, L * k)
    _same(f"{p}.lfsr_seeds", st.lfsr_seeds, seeds, "build.lfsr_seeds of train.seed")
    slope = Const.of(st.negative_slope.real, SLOPE_FRAC)
    _same_fields(f"{p}.negative_slope", st.negative_slope, slope, "Const.of(real, 16)")
    upd = _update_constants(
        cfg, st.delay, f.x, f.d, f.w, f.u, plan.const_bits, p_sum_bits(st.conv), plan.operand_bits,
        st.conv is not None,
    )  # fmt: skip
    _same_fields(f"{p}.update", st.update, upd, "what build derives from train, delay, formats")
    what = forward_weight_bits(f.w, upd.lwp_horizon, f.u, upd.lwp_form)
    _same(f"{p}.what_bits", st.what_bits, what, "build.forward_weight_bits")
    _same(f"{p}.x_operand_bits", st.x_operand_bits, x_operand_bits(f.x), "build.x_operand_bits")
    w_op = weight_operand(f.w, what, plan.operand_bits)
    _same(f"{p}.weight_operand", st.weight_operand, w_op, "build.weight_operand of operand_bits")
    acc_fwd = st.w_hat_operand_bits + f.x.bits + _ceil_log2(N + 1) + 1
    acc_bwd = st.w_operand_bits + f.d.bits + _ceil_log2(M) + 1
    if st.conv is not None:
        acc_fwd, acc_bwd, _ = conv_accumulator_bits(
            st.conv, f, st.w_hat_operand_bits, st.w_operand_bits
        )
    _same(f"{p}.acc_fwd_bits", st.acc_fwd_bits, acc_fwd, "ŵ operand + x.bits + ⌈log2(N+1)⌉ + 1")
    _same(f"{p}.acc_bwd_bits", st.acc_bwd_bits, acc_bwd, "w operand + d.bits + ⌈log2 M⌉ + 1")
    if st.products is not None:
        want = stage_products(
            st, 18, plan.operand_bits, plan.logic_low_bits, plan.momentum_in_logic
        )
        rule = "build.stage_products of operand_bits and logic_low_bits"
        _same(f"{p}.products", st.products, want, rule)
    opr = st.operand_registers or 0
    if opr and st.conv is not None:
        raise _err(f"{p}.operand_registers", opr, "a convolution stage has none (null)")
    _same(f"{p}.update_stage", st.update_stage, update_stage(upd.sc, opr), "build.update_stage")
    ws = write_stage(upd.sc, st.slot_cycles, opr)
    _same(f"{p}.write_stage", st.write_stage, ws, "build.write_stage")
    _same(f"{p}.pass_cycles", st.pass_cycles, pass_cycles(st), "build.pass_cycles")
    if st.products is not None:
        _same(
            f"{p}.multipliers",
            st.multipliers,
            stage_multipliers(st),
            "lanes × the per-lane products + the per-stage ones",
        )
    else:  # a plan from before Stage.products: the count it was written with
        mults = L * _multipliers_before_products(st)
        _same(
            f"{p}.multipliers", st.multipliers, mults, "lanes × the count of plans before products"
        )
    if st.activation.lut:
        if st.activation_lut is None:
            raise _err(f"{p}.activation_lut", None, f"must be the {st.activation} LUT")
        lut = activation_lut(st.activation, f.y)
        _same_fields(f"{p}.activation_lut", st.activation_lut, lut, "build's LUT for y")
    elif st.activation_lut is not None:
        raise _err(f"{p}.activation_lut", "{...}", f"must be absent for {st.activation}")
    _check_memories(f"{p}.memories", st.memories)
    _same(f"{p}.memory_bits", st.memory_bits, sum(m.bits for m in st.memories), "Σ memory bits")
    blocks = sum(m.blocks for m in st.memories if m.kind == "bram")
    _same(f"{p}.memory_blocks", st.memory_blocks, blocks, "Σ blocks of the bram memories")
    for name, fmt, total in (("w", f.w, "weight_bits"), ("u", f.u, "velocity_bits")):
        k = next((k for k, m in enumerate(st.memories) if m.name == name), None)
        if k is None:
            raise _err(f"{p}.memories", [m.name for m in st.memories], f"must hold {name!r}")
        m = st.memories[k]
        _same(f"{p}.memories[{k}].banks", m.banks, st.mac_lanes, "one bank per lane (L·k)")
        words = st.row_groups * st.group_slots
        _same(f"{p}.memories[{k}].words", m.words, words, "row_groups·⌈(columns + 1)/k⌉")
        _same(f"{p}.memories[{k}].width", m.width, fmt.bits, f"{name}.bits")
        _same(f"{p}.{total}", getattr(st, total), m.bits, f"the bits of memory {name!r}")
    # what feeds the stage: the input (attach 0), the previous main stage, or a head's source
    if st.role == "main":
        _same(f"{p}.attach", st.attach, st.index - 1, "index − 1 for a main stage")
    if st.attach >= st.index:
        raise _err(f"{p}.attach", st.attach, f"must name an earlier stage (< {st.index})")
    if st.attach == 0:
        _same(f"{p}.in_features", N, plan.in_features, "the plan's in_features")
        _same(f"{p}.x_lanes", st.x_lanes, 1, "1 for the stage the host writes")
    else:
        src = plan.stages[st.attach - 1]
        _same(f"{p}.in_features", N, src.out_features, f"stage {src.index}'s out_features")
        _same(f"{p}.x_lanes", st.x_lanes, src.lanes, f"stage {src.index}'s lanes")
        _same(f"{p}.formats.x", f.x, src.formats.y, f"stage {src.index}'s y format")


def _check_conv(plan: Plan, i: int, p: str) -> None:
    """A convolution stage: its geometry is what :func:`~pipetrain.compiler.conv.conv_geometry`
    derives from its parameters, its sizes agree with the stage's, and it comes before every
    Linear stage, chained channel to channel."""
    st = plan.stages[i]
    g = st.conv
    assert g is not None
    try:
        want = conv_geometry(
            g.kind, g.in_channels, g.out_channels, g.in_size, g.kernel, g.stride, g.padding,
            g.bias, g.pool, g.pool_size,
        )  # fmt: skip
    except ValueError as exc:
        raise _err(f"{p}.conv", g.kind, str(exc)) from None
    _same_fields(f"{p}.conv", g, want, "what conv_geometry derives from its parameters")
    _same(f"{p}.in_features", st.in_features, g.in_values, "conv.in_channels·Πconv.in_size")
    _same(f"{p}.out_features", st.out_features, g.out_values, "conv.out_channels·Πpooled_size")
    _same(f"{p}.role", st.role, "main", "main for a convolution stage")
    if st.activation not in ("relu", "leaky_relu", "identity"):
        raise _err(f"{p}.activation", st.activation, "must be relu, leaky_relu or identity")
    if i > 0:
        prev = plan.stages[i - 1].conv
        if prev is None:
            raise _err(f"{p}.conv", g.kind, "must come before every Linear stage")
        _same(f"{p}.conv.kind", g.kind, prev.kind, f"stage {i}'s convolution kind")
        _same(f"{p}.conv.in_size", g.in_size, prev.pooled_size, f"stage {i}'s pooled_size")


def _check_loss(plan: Plan, path: str, lu: Any, feeder: Any) -> None:
    _same(f"{path}.classes", lu.classes, feeder.out_features, f"stage {feeder.index}'s outputs")
    _same(f"{path}.z", lu.z, feeder.formats.y, f"stage {feeder.index}'s y format")
    _same(f"{path}.d", lu.d, feeder.formats.d, f"stage {feeder.index}'s d format")
    _same(f"{path}.z_lanes", lu.z_lanes, feeder.lanes, f"stage {feeder.index}'s lanes")
    _same(f"{path}.z_words", lu.z_words, _ceil(lu.classes, lu.z_lanes), "⌈classes / z_lanes⌉")
    _same(f"{path}.z_word_bits", lu.z_word_bits, lu.z_lanes * lu.z.bits, "z_lanes·z.bits")
    _check_memories(f"{path}.memories", lu.memories)
    family = RAM_FAMILIES[plan.ram_family]
    key = f"s{feeder.index}.y"
    slack = max(s.pass_cycles for s in plan.stages) - forward_cycles(feeder)
    regs = lu.operand_registers or 0  # the board's choice, checked for range above
    words = lu is plan.loss and loss_writes_words(plan.strategy, feeder)
    want = _loss_unit(lu.kind, lu.classes, lu.z, lu.d, key, lu.z_lanes, family, slack, regs, words)
    if want != lu:  # the other rule where nothing fits the slack (build_plan's loss_fastest)
        fast = _loss_unit(
            lu.kind, lu.classes, lu.z, lu.d, key, lu.z_lanes, family, slack, regs, words, True
        )
        want = fast if fast == lu else want
    _same_fields(path, lu, want, "what build derives from kind, classes, formats, lanes, tick")


def _check_train(plan: Plan) -> TrainConfig:
    expect = {f.name for f in dataclasses.fields(TrainConfig)} - set(HOST_ONLY_SETTINGS)
    expect |= {"lr1", "momentum1"}
    keys = set(plan.train)
    for k in sorted(keys - expect):
        raise _err(f"train.{k}", plan.train[k], f"is not a training setting ({sorted(expect)})")
    for k in sorted(expect - keys - set(OPTIONAL_SETTINGS)):
        raise PlanError(f"plan field train.{k} is missing ({_FIX})")
    for k in ("lr1", "momentum1"):
        _load(float, plan.train[k], f"train.{k}")
    settings = {k: v for k, v in plan.train.items() if k not in ("lr1", "momentum1")}
    hints = _hints(TrainConfig)
    for k, v in sorted(settings.items()):
        _load(hints[k], v, f"train.{k}")  # the type (the plan keeps the JSON value as it is)
    try:
        cfg = TrainConfig.from_dict(settings)
    except (ConfigError, TypeError, ValueError) as exc:
        raise PlanError(f"plan field train: {exc} ({_FIX})") from None
    for name in ("schedule", "mitigation", "lwp_form", "strategy", "distance", "rule", "rounding"):
        _same(name, getattr(plan, name), getattr(cfg, name), f"train.{name}")
    return cfg


def _check_plan(plan: Plan) -> None:
    if not plan.stages:
        raise _err("stages", [], "must hold at least one stage")
    roles = [s.role for s in plan.stages]
    S = roles.count("main")
    if S == 0 or roles[:S] != ["main"] * S:
        raise _err("stages", roles, "must list the main stages first, then the heads")
    cfg = _check_train(plan)
    _same("lfsr_leap", plan.lfsr_leap, cfg.lfsr_leap or plan.lfsr_width, "train.lfsr_leap")
    for i in range(len(plan.stages)):
        _check_stage(plan, i, cfg)
    last = plan.stages[S - 1]
    _check_loss(plan, "loss", plan.loss, last)
    for i, st in enumerate(plan.stages):  # the main loss unit's feeder takes its error words
        beat = plan.loss.out_lanes if st is last else None
        _same(f"stages[{i}].error_beat", st.error_beat, beat, "the main loss unit's out_lanes")
    heads = [s for s in plan.stages[S:] if s.activation == "identity"]
    _same("head_losses", len(plan.head_losses), len(heads), "one per head's last stage: count")
    for k, (lu, st) in enumerate(zip(plan.head_losses, heads, strict=True)):
        _check_loss(plan, f"head_losses[{k}]", lu, st)
    _check_memories("memories", plan.memories)
    every = [m for _, m in plan.all_memories()]
    _same("memory_bits", plan.memory_bits, sum(m.bits for m in every), "Σ bits of every memory")
    blocks = sum(m.blocks for m in every if m.kind == "bram")
    _same("memory_blocks", plan.memory_blocks, blocks, "Σ blocks of every bram memory")
    _same("multipliers", plan.multipliers, sum(s.multipliers for s in plan.stages), "Σ stages'")
    loss_max = max([plan.loss.cycles] + [lu.cycles for lu in plan.head_losses])
    tick = tick_cycles(plan.stages, [last, *heads], loss_max)
    _same("tick_cycles", plan.tick_cycles, tick, "build.tick_cycles of the stages")
    units = [plan.loss.cycles, *(lu.cycles for lu in plan.head_losses)]
    ideal = tick if plan.schedule == "pb" else sequential_cycles(plan.stages, units)
    _same("ideal_cycles_per_sample", plan.ideal_cycles_per_sample, ideal, "the schedule's cycles")
    if not math.isclose(plan.samples_per_s, plan.clock_hz / ideal, rel_tol=1e-12):
        raise _err("samples_per_s", plan.samples_per_s, f"must be clock_hz / {ideal}")
    if plan.clock_hz <= 0:
        raise _err("clock_hz", plan.clock_hz, "must be > 0")
    if plan.lfsr_poly >> plan.lfsr_width != 1:
        raise _err("lfsr_poly", plan.lfsr_poly, f"must have degree lfsr_width ({plan.lfsr_width})")
    if plan.round_bits > plan.lfsr_width:
        raise _err("round_bits", plan.round_bits, f"must be in 1..lfsr_width ({plan.lfsr_width})")
    draws = plan.round_bits * (2 if plan.mitigation.sc else 1)  # a slot's roundings (§6)
    if plan.lfsr_leap < draws:
        raise _err("lfsr_leap", plan.lfsr_leap, f"must be ≥ the {draws} bits a slot draws")
    fifo = next((m for m in plan.memories if m.name == "results"), None)
    if fifo is not None:
        _same("memories[results].entries", fifo.entries, plan.result_fifo_depth, "the depth")
        _same("memories[results].width", fifo.width, plan.result_bits, "result_bits")
