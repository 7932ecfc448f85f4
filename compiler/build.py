"""Build a :class:`~pipetrain.compiler.plan.Plan` from a network IR and a training config.

Formats come from a :class:`FormatSpec` (static defaults here; ``auto`` calibration lives in
:mod:`pipetrain.compiler.calibrate`), lanes from an explicit per-stage list.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from .config import TrainConfig
from .ir import NetworkIR
from .plan import (
    PLAN_VERSION,
    Const,
    LossUnit,
    Plan,
    QFormat,
    Stage,
    StageFormats,
    UpdateConstants,
)
from .schedule import lwp_horizon, spike_compensation, stage_layout

__all__ = ["FormatSpec", "PlanError", "build_plan", "stage_cycles", "loss_cycles", "lfsr_seeds"]

#: LFSR: x^32 + x^22 + x^2 + x + 1 (primitive; Xilinx XAPP052 table), Galois, left-shifting.
LFSR_POLY = (1 << 32) | (1 << 22) | (1 << 2) | (1 << 1) | 1
LFSR_WIDTH = 32
ROUND_BITS = 16
#: Fixed cycles each tick spends outside the stages' passes (start, memory latency, hand-over).
TICK_OVERHEAD = 4
#: Widest update sum the golden model (int64) and the HDL support.
MAX_SUM_BITS = 62
CONST_MANTISSA_BITS = 18
SLOPE_FRAC = 16
BLOCK_RAM_BITS = 18 * 1024


class PlanError(ValueError):
    """The requested design is invalid or does not fit; the message gives the numbers."""


@dataclass(frozen=True)
class FormatSpec:
    """Fixed-point formats per stage (lists are per main stage, 0-based).

    Members
    -------
    x: input-activation format of each stage; the output format of stage s is ``x[s+1]`` and
        of the last stage ``logits``.
    logits: output format of the last stage (the loss unit's input).
    d: error format at each stage's output.
    w, u: weight and velocity formats of each stage (``u.frac`` must equal ``w.frac``).
    """

    x: tuple[QFormat, ...]
    logits: QFormat
    d: tuple[QFormat, ...]
    w: tuple[QFormat, ...]
    u: tuple[QFormat, ...]
    ranges: dict = field(default_factory=dict)

    @classmethod
    def default(cls, num_stages: int) -> FormatSpec:
        """Static defaults: x Q5.10, logits Q5.10, d Q1.14, w Q3.20 (24 b), u Q3.20 (24 b)."""
        return cls(
            x=(QFormat(16, 10),) * num_stages,
            logits=QFormat(16, 10),
            d=(QFormat(16, 14),) * num_stages,
            w=(QFormat(24, 20),) * num_stages,
            u=(QFormat(24, 20),) * num_stages,
        )


def stage_cycles(in_features: int, out_features: int, lanes: int) -> tuple[int, int]:
    """Return (row_groups, cycles) of the fused pass: ⌈M/L⌉ groups × (N+1) columns."""
    groups = -(-out_features // lanes)
    return groups, groups * (in_features + 1)


def loss_cycles(kind: str, classes: int, exp_frac: int, recip_frac: int) -> int:
    """Cycles the loss unit needs per sample (max, exp, divide, p − onehot; derived)."""
    if kind == "mse":
        return classes + 2
    return 3 * classes + exp_frac + recip_frac + 4


def lfsr_seeds(seed: int, stage: int, lanes: int) -> tuple[int, ...]:
    """Return distinct non-zero 32-bit LFSR seeds for each lane of a stage (SplitMix32-style)."""
    out = []
    for lane in range(lanes):
        z = (seed * 0x9E3779B9 + stage * 0x85EBCA6B + lane * 0xC2B2AE35 + 0x27D4EB2F) & 0xFFFFFFFF
        z = ((z ^ (z >> 16)) * 0x85EBCA6B) & 0xFFFFFFFF
        z = ((z ^ (z >> 13)) * 0xC2B2AE35) & 0xFFFFFFFF
        z ^= z >> 16
        out.append(z or 1)
    return tuple(out)


def _signed_bits_of_const(c: Const) -> int:
    return max(abs(c.value).bit_length() + 1, 1)


def _update_constants(
    cfg: TrainConfig, delay: int, fmt_x: QFormat, fmt_d: QFormat, fmt_w: QFormat, fmt_u: QFormat
) -> UpdateConstants:
    lr, m, wd = cfg.lr1, cfg.momentum1, cfg.weight_decay
    sc = "sc" in cfg.mitigation
    a, b = spike_compensation(m, delay) if sc else (1.0, 0.0)
    mk = lambda r: Const.normalised(r, CONST_MANTISSA_BITS)  # noqa: E731
    c_m, c_lr, c_lrwd = mk(m), mk(lr), mk(lr * wd)
    c_a, c_b, c_bwd = mk(a), mk(b * lr), mk(b * lr * wd)
    fw = fmt_w.frac
    p_frac, p_bits = fmt_d.frac + fmt_x.frac, fmt_d.bits + fmt_x.bits
    # terms of the velocity sum: (const, operand frac, operand bits)
    u_terms = [(c_m, fw, fmt_u.bits), (c_lr, p_frac, p_bits), (c_lrwd, fw, fmt_w.bits)]
    v_terms = [(c_a, fw, fmt_u.bits), (c_b, p_frac, p_bits), (c_bwd, fw, fmt_w.bits)]

    def align(terms: list) -> tuple[int, int]:
        live = [t for t in terms if t[0].value != 0] or terms[:1]
        frac = max(max(c.frac + f for c, f, _ in live), fw)
        bits = max(_signed_bits_of_const(c) + b + (frac - c.frac - f) for c, f, b in live)
        return frac, bits + 2  # + 2: sum of three terms

    frac_u, bits_u = align(u_terms)
    frac_v, bits_v = align(v_terms) if sc else (fw, 0)
    return UpdateConstants(
        momentum=c_m,
        lr=c_lr,
        lr_wd=c_lrwd,
        sc=sc,
        sc_a=c_a,
        sc_lr_b=c_b,
        sc_lr_wd_b=c_bwd,
        lwp_horizon=lwp_horizon(delay, cfg.mitigation),
        lwp_form=cfg.lwp_form,
        frac_u=frac_u,
        frac_v=frac_v,
        sum_bits=max(bits_u, bits_v),
    )


def _ceil_log2(n: int) -> int:
    return max(0, math.ceil(math.log2(n))) if n > 1 else 0


def build_plan(
    ir: NetworkIR,
    config: TrainConfig,
    formats: FormatSpec | None = None,
    lanes: Sequence[int] | None = None,
    clock_hz: float = 50e6,
    memory_budget_bits: int = 0,
) -> Plan:
    """Return the plan for ``ir`` trained with ``config``.

    ``lanes`` gives L per main stage (default 1 each). Raises :class:`PlanError` when a stage's
    update sum exceeds 62 bits, lanes exceed a stage's rows, formats disagree, or the memory
    exceeds ``memory_budget_bits`` (0 = no budget).
    """
    layers = ir.layers
    S = len(layers)
    fs = formats or FormatSpec.default(S)
    lanes = list(lanes) if lanes is not None else [1] * S
    if len(lanes) != S:
        raise PlanError(f"lanes has {len(lanes)} entries but the network has {S} stages")
    if config.strategy != "global":
        # Auxiliary-head stages need their own IR; the HDL path supports the global strategy.
        raise PlanError(
            f"strategy {config.strategy!r} is not supported by the hardware plan yet "
            "(use the reference trainer for local/interlocking experiments)"
        )
    roles = stage_layout(
        S,
        config.schedule,
        config.strategy,
        config.blocks,
        config.distance,
        config.rule,
        config.head_stages,
    )
    stages = []
    for i, (layer, role) in enumerate(zip(layers, roles, strict=True)):
        L = lanes[i]
        if not 1 <= L <= layer.out_features:
            raise PlanError(
                f"stage {i + 1} ({layer.name}): lanes={L} must be in 1..{layer.out_features} "
                f"(one lane per output row at most)"
            )
        fx, fd, fw, fu = fs.x[i], fs.d[i], fs.w[i], fs.u[i]
        fy = fs.x[i + 1] if i + 1 < S else fs.logits
        if fu.frac != fw.frac:
            raise PlanError(
                f"stage {i + 1}: velocity frac {fu.frac} must equal weight frac {fw.frac}"
            )
        upd = _update_constants(config, role.delay, fx, fd, fw, fu)
        if upd.sum_bits > MAX_SUM_BITS:
            raise PlanError(
                f"stage {i + 1} ({layer.name}): the update sum needs {upd.sum_bits} bits "
                f"(> {MAX_SUM_BITS}); use fewer fraction bits for x ({fx}), d ({fd}) or w ({fw})"
            )
        groups, cycles = stage_cycles(layer.in_features, layer.out_features, L)
        n_w = layer.out_features * (layer.in_features + 1)
        stash_entry = layer.in_features * fx.bits + layer.out_features
        stash_bits = (role.delay + 1) * stash_entry
        wbits, vbits = n_w * fw.bits, n_w * fu.bits
        prev_bits = wbits if (upd.lwp_horizon and upd.lwp_form == "w") else 0
        per_lane_words = groups * (layer.in_features + 1)
        blocks = L * (
            math.ceil(per_lane_words * fw.bits / BLOCK_RAM_BITS)
            + math.ceil(per_lane_words * fu.bits / BLOCK_RAM_BITS)
        ) + math.ceil(stash_bits / BLOCK_RAM_BITS)
        what_bits = fw.bits + _ceil_log2(upd.lwp_horizon + 1) + 1
        stages.append(
            Stage(
                index=i + 1,
                name=layer.name,
                role="main",
                block=role.block,
                losses=role.losses,
                in_features=layer.in_features,
                out_features=layer.out_features,
                activation=layer.activation,
                negative_slope=Const.of(layer.negative_slope, SLOPE_FRAC),
                delay=role.delay,
                delay_derivation=role.derivation,
                input_gradient=i > 0,
                stash_depth=role.delay + 1,
                stash_bits=stash_bits,
                lanes=L,
                row_groups=groups,
                cycles_per_tick=cycles,
                weight_bits=wbits,
                velocity_bits=vbits,
                memory_bits=wbits + vbits + stash_bits + prev_bits,
                memory_blocks=blocks,
                multipliers=L * ((3 if i > 0 else 2) + (2 if upd.sc else 1)),
                formats=StageFormats(
                    x=fx, y=fy, d=fd, gin=fs.d[i - 1] if i > 0 else None, w=fw, u=fu
                ),
                update=upd,
                lfsr_seeds=lfsr_seeds(config.seed, i + 1, L),
                acc_fwd_bits=what_bits + fx.bits + _ceil_log2(layer.in_features + 1) + 1,
                acc_bwd_bits=fw.bits + fd.bits + _ceil_log2(layer.out_features) + 1,
            )
        )
    classes = layers[-1].out_features
    fl, fe, fr = 3, 15, 16
    size = 16 << fl  # covers e^0 … e^−16
    lut = tuple(int(round(math.exp(-k / 2**fl) * 2**fe)) for k in range(size))
    if fs.logits.frac <= fl:
        raise PlanError(f"logit format {fs.logits} needs more than {fl} fraction bits")
    loss = LossUnit(
        kind=ir.loss,
        classes=classes,
        z=fs.logits,
        d=fs.d[-1],
        exp_lut_frac=fl,
        exp_frac=fe,
        exp_lut=lut,
        recip_frac=fr,
        mse_scale=Const.of(2.0 / classes, SLOPE_FRAC),
        cycles=loss_cycles(ir.loss, classes, fe, fr),
    )
    tick = max(s.cycles_per_tick for s in stages) + loss.cycles + TICK_OVERHEAD
    ideal = tick if config.schedule == "pb" else 2 * S * tick
    memory = sum(s.memory_bits for s in stages)
    if memory_budget_bits and memory > memory_budget_bits:
        raise PlanError(
            f"the design needs {memory} memory bits but the budget is {memory_budget_bits}; "
            "use narrower formats or a smaller network"
        )
    train = config.to_dict() | {"lr1": config.lr1, "momentum1": config.momentum1}
    return Plan(
        version=PLAN_VERSION,
        name=ir.name,
        in_features=ir.in_features,
        schedule=config.schedule,
        mitigation=config.mitigation,
        lwp_form=config.lwp_form,
        strategy=config.strategy,
        distance=config.distance,
        rule=config.rule,
        rounding=config.rounding,
        round_bits=ROUND_BITS,
        lfsr_poly=LFSR_POLY,
        lfsr_width=LFSR_WIDTH,
        lfsr_leap=LFSR_WIDTH,
        stages=tuple(stages),
        loss=loss,
        tick_cycles=tick,
        ideal_cycles_per_sample=ideal,
        clock_hz=clock_hz,
        samples_per_s=clock_hz / ideal,
        memory_bits=memory,
        multipliers=sum(s.multipliers for s in stages),
        memory_budget_bits=memory_budget_bits,
        train=train,
    )
