"""The fixed-point golden model: the bit-exact specification of the training datapath.

:class:`GoldenModel` implements ``docs/numerics.md`` on int64 tensors, tick by tick, as the RTL
does: every stage forwards one sample and back-propagates/updates another in each tick
(numerics §7), the loss unit runs at the end of the tick, stage-to-stage vectors move one stage
per tick. The RTL must equal it bit for bit on every activation, error, weight, velocity,
counter and result record; :attr:`GoldenModel.traces` (``trace=True``) records everything the
testbenches compare.

Speed: each stage's work in a tick is a handful of vectorised torch int64 ops over the whole
(M, N+1) memory — bit-identical to the RTL's slot-by-slot pass, because integer sums are exact
and every element is rounded independently (the only order that matters, the LFSR draw order of
numerics §6, is reproduced by precomputing each update's random numbers in slot order, in blocks
of updates). Inference (:meth:`GoldenModel.predict`) runs as one batch, since weights do not
change while only inference samples flow; the tick count and counters are advanced exactly as
ticking would. A literal, slow transcription (:mod:`pipetrain.sim.golden_scalar`) checks this
module in the tests.

Implements the :class:`pipetrain.sim.trainer.Trainer` protocol. Supports the ``global``
strategy (main stages only), schedules ``pb`` and ``sequential``, every mitigation, both
rounding modes and both losses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from ..compiler.config import TrainConfig
from ..compiler.enums import unknown
from ..compiler.plan import ActivationLUT, Const, LossUnit, Plan, QFormat, Stage
from ..errors import UserError
from .fixed import U32_MAX, quantise, rhu, rne, rsr_addend, sat
from .lfsr import LaneLFSRs
from .trainer import accuracy, stream_epochs

__all__ = ["GoldenModel", "Result", "StageTrace", "LossTrace", "TickTrace", "GoldenError"]

#: Updates whose random numbers are generated in one block (trades memory for speed).
DRAW_BLOCK = 32
#: Tensor kinds whose clamps a stage counts (numerics §8), in the order of
#: :attr:`GoldenModel.tensor_saturations`.
STAGE_SAT_TENSORS = ("y", "gin", "u", "w")


class GoldenError(UserError, ValueError):
    """The plan or model cannot be simulated (the message says which field and why)."""


class Result(NamedTuple):
    """One result record (docs/ports.md ``result_out``).

    sample: accepted-sample counter (0-based, training and inference samples alike).
    pred: argmax of the logits (lowest index on ties).
    loss_raw: ``p_y`` with ``loss.recip_frac`` fraction bits (CE) or Σ(z−t)² with 2·z.frac
        fraction bits, clamped to 2^32 − 1 (MSE).
    train: whether the sample trains.
    """

    sample: int
    pred: int
    loss_raw: int
    train: bool


@dataclass
class StageTrace:
    """What one stage did in one tick (integer tensors; None where the slot was empty).

    x (N,), z (M,), a (M,), mask (M,) bool: the forward of ``fwd_sample`` (x without the bias
    input). g (M,), delta (M,), gin (N,): the backward of ``bwd_sample`` (gin None for stage 1).
    w, u (M, N+1), w_prev (LWP ``w`` form, else None): the memories at the end of the tick.
    lfsr (L,): per-lane LFSR states at the end of the tick (None with nearest-even rounding).
    """

    stage: int
    fwd_sample: int | None = None
    x: torch.Tensor | None = None
    z: torch.Tensor | None = None
    a: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    bwd_sample: int | None = None
    g: torch.Tensor | None = None
    delta: torch.Tensor | None = None
    gin: torch.Tensor | None = None
    w: torch.Tensor | None = None
    u: torch.Tensor | None = None
    w_prev: torch.Tensor | None = None
    lfsr: tuple[int, ...] | None = None


@dataclass
class LossTrace:
    """The loss unit's work at the end of a tick: logits ``z`` (C,), ``delta`` (C,) (None for
    an inference sample), and the result record."""

    sample: int
    z: torch.Tensor
    delta: torch.Tensor | None
    result: Result


@dataclass
class TickTrace:
    """One tick: its number (0-based, the tick-model clock), the sample that entered stage 1
    (None = bubble), the stages' traces (index s−1 = stage s) and the loss unit's (None if no
    logits arrived)."""

    tick: int
    entered: int | None
    stages: list[StageTrace] = field(default_factory=list)
    loss: LossTrace | None = None


class _Sample:
    __slots__ = ("id", "label", "train")

    def __init__(self, sid: int, label: int, train: bool) -> None:
        self.id, self.label, self.train = sid, label, train


def _shift_term(c: Const, operand_frac: int, f_to: int, what: str) -> tuple[int, int]:
    """(multiplier, left shift) of one aligned update-sum term (numerics §5.3)."""
    if c.value == 0:
        return 0, 0
    shift = f_to - (c.frac + operand_frac)
    if shift < 0:
        raise GoldenError(f"update term {what} has more fraction bits than the sum ({f_to})")
    return c.value, shift


def _mul_shift(operand: torch.Tensor, term: tuple[int, int]) -> torch.Tensor | None:
    value, shift = term
    if value == 0:
        return None
    t = operand * value if value != 1 else operand
    return t << shift if shift else t


def _sum_terms(*terms: torch.Tensor | None) -> torch.Tensor:
    live = [t for t in terms if t is not None]
    out = live[0]
    for t in live[1:]:
        out = out + t
    return out


def lut_forward(z: torch.Tensor, lut: ActivationLUT, frac: int) -> torch.Tensor:
    """``tanh``/``sigmoid`` of the saturated ``z`` (int64, any shape, format with ``frac``
    fraction bits) through the plan's interpolated LUT (numerics §3.4); same shape and format.
    """
    k = frac - lut.index_frac
    a = z.abs()
    i = (a >> k).clamp_max(len(lut.entries) - 1)
    r = a & ((1 << k) - 1)
    entries = torch.tensor(lut.entries, dtype=torch.int64)
    slopes = torch.tensor(lut.slopes, dtype=torch.int64)
    mag = rhu((entries[i] << k) + slopes[i] * r, lut.entry_frac - lut.index_frac)
    if lut.function == "tanh":
        return torch.where(z < 0, -mag, mag)
    if lut.function == "sigmoid":
        return torch.where(z < 0, (1 << frac) - mag, mag)
    unknown(lut.function, "LUT activation")


def lut_derivative(function: str, y: torch.Tensor, g: torch.Tensor, frac: int) -> torch.Tensor:
    """δ = f′·g from the stashed output ``y`` (``frac`` fraction bits) and the error ``g``
    (numerics §5.1): ``q = rhu(2^2f − y², f)`` (tanh) or ``rhu(y·(2^f − y), f)`` (sigmoid),
    ``δ = rhu(g·q, f)``; |δ| ≤ |g|, so δ needs no clamp."""
    if function == "tanh":
        q = rhu((1 << (2 * frac)) - y * y, frac)
    elif function == "sigmoid":
        q = rhu(y * ((1 << frac) - y), frac)
    else:
        unknown(function, "LUT activation")
    return rhu(g * q, frac)


class _StageEngine:
    """State and arithmetic of one stage (numerics §2, §3, §5, §6)."""

    def __init__(self, plan: Plan, st: Stage, weight: torch.Tensor, bias: torch.Tensor) -> None:
        f = st.formats
        self.spec = st
        self.N, self.M, self.L, self.G = st.in_features, st.out_features, st.lanes, st.row_groups
        if self.G != -(-self.M // self.L):
            raise GoldenError(f"stage {st.index}: row_groups {self.G} ≠ ⌈M/L⌉")
        self.fx, self.fy, self.fd, self.fgin, self.fw, self.fu = f.x, f.y, f.d, f.gin, f.w, f.u
        if self.fu.frac != self.fw.frac:
            raise GoldenError(f"stage {st.index}: u.frac must equal w.frac (numerics §2)")
        for name, bits in (("acc_fwd_bits", st.acc_fwd_bits), ("acc_bwd_bits", st.acc_bwd_bits)):
            if bits > 64:
                raise GoldenError(
                    f"stage {st.index}: {name} = {bits} > 64; the int64 golden model cannot "
                    "hold the sum exactly (use narrower formats)"
                )
        upd = st.update
        if upd.sum_bits > 62:
            raise GoldenError(f"stage {st.index}: update sum_bits {upd.sum_bits} > 62")
        self.bias_in = 1 << self.fx.frac
        self.k_fwd = self.fw.frac + self.fx.frac - self.fy.frac
        self.act = st.activation
        self.slope = (st.negative_slope.value, st.negative_slope.frac)
        self.lut = st.activation_lut  # tanh / sigmoid (numerics §3.4)
        if self.act in ("tanh", "sigmoid") and (self.lut is None or self.lut.function != self.act):
            raise GoldenError(f"stage {st.index}: {self.act} needs the plan's activation LUT")
        self.H, self.form = upd.lwp_horizon, upd.lwp_form
        self.input_gradient = st.input_gradient
        if self.input_gradient:
            if self.fgin is None:
                raise GoldenError(f"stage {st.index} has an input gradient but no gin format")
            self.k_gin = self.fw.frac + self.fd.frac - self.fgin.frac
        fw, fp = self.fw.frac, self.fd.frac + self.fx.frac
        self.t_m = _shift_term(upd.momentum, fw, upd.frac_u, "momentum·u")
        self.t_lr = _shift_term(upd.lr, fp, upd.frac_u, "lr·P")
        self.t_lrwd = _shift_term(upd.lr_wd, fw, upd.frac_u, "lr_wd·w")
        self.k_u = upd.frac_u - fw
        self.sc = upd.sc
        if self.sc:
            self.t_a = _shift_term(upd.sc_a, fw, upd.frac_v, "sc_a·u'")
            self.t_b = _shift_term(upd.sc_lr_b, fp, upd.frac_v, "sc_lr_b·P")
            self.t_bwd = _shift_term(upd.sc_lr_wd_b, fw, upd.frac_v, "sc_lr_wd_b·w")
            self.k_v = upd.frac_v - fw
        if self.k_u < 0 or (self.sc and self.k_v < 0):
            raise GoldenError(f"stage {st.index}: update sums have fewer fraction bits than w")
        self.stochastic = plan.rounding == "stochastic"
        self.R = plan.round_bits
        if self.stochastic:
            if 2 * self.R > plan.lfsr_width:
                raise GoldenError(f"round_bits {self.R} needs a {2 * self.R}-bit LFSR")
            if len(st.lfsr_seeds) != self.L:
                raise GoldenError(
                    f"stage {st.index}: {len(st.lfsr_seeds)} seeds for {self.L} lanes"
                )
            self.lfsr = LaneLFSRs(st.lfsr_seeds, plan.lfsr_poly, plan.lfsr_leap)
        self._block: tuple[torch.Tensor, torch.Tensor | None, np.ndarray] | None = None
        self._block_pos = 0
        self._last_draw: tuple[np.ndarray, int] | None = None
        w_int, _ = quantise(torch.cat([weight, bias[:, None]], dim=1), self.fw)
        self.w = w_int
        self.u = torch.zeros_like(w_int)
        self.track_prev = self.H > 0 and self.form == "w"
        self.w_prev = w_int if self.track_prev else None
        self.stash: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        #: clamps per tensor kind (numerics §8): ``y`` (z, §3.3), ``gin`` (§5.2), ``u`` (u'),
        #: ``w`` (w'); their sum is the stage's hardware counter :attr:`sat`
        self.sat_by = dict.fromkeys(STAGE_SAT_TENSORS, 0)
        #: max|value| before the clamp per tensor kind (real values), when profiling
        self.peaks: dict[str, float] | None = None
        self.updates = 0

    @property
    def sat(self) -> int:
        """The stage's saturation counter (numerics §8): the sum of :attr:`sat_by`."""
        return sum(self.sat_by.values())

    def _clamp(self, v: torch.Tensor, fmt: QFormat, kind: str) -> torch.Tensor:
        """``sat(v, fmt)`` counted on tensor ``kind``; with :attr:`peaks` on, it also keeps
        max|v| before the clamp (real value)."""
        out, c = sat(v, fmt)
        self.sat_by[kind] += c
        if self.peaks is not None and v.numel():
            peak = float(v.abs().max()) * 2.0**-fmt.frac
            self.peaks[kind] = max(self.peaks[kind], peak)
        return out

    @property
    def lfsr_state(self) -> tuple[int, ...] | None:
        """Per-lane LFSR states after the last update (the seeds before any; None when
        rounding is nearest-even)."""
        if not self.stochastic:
            return None
        if self._last_draw is None:
            return tuple(int(s) for s in self.spec.lfsr_seeds)
        last, b = self._last_draw
        return tuple(int(s) for s in last[b])

    def set_lfsr_state(self, states: tuple[int, ...] | list[int]) -> None:
        """Continue the lanes' LFSRs from ``states`` (as :attr:`lfsr_state` returns them; one
        per lane), dropping the precomputed draw block. Raises :class:`GoldenError` for a wrong
        lane count; ignored with nearest-even rounding."""
        if not self.stochastic:
            return
        if len(states) != self.L:
            raise GoldenError(f"stage {self.spec.index}: {len(states)} LFSR states, {self.L} lanes")
        self.lfsr = LaneLFSRs(tuple(int(v) for v in states), self.lfsr.poly, self.lfsr.leap)
        self._block, self._block_pos = None, 0
        self._last_draw = (np.array([states], dtype=np.uint64), 0)

    # -- forward (numerics §3) -------------------------------------------------------------
    def w_hat(self, predict: bool) -> torch.Tensor:
        """ŵ: LWP prediction for training samples (exact, unsaturated), else w."""
        if not predict or self.H == 0:
            return self.w
        if self.form == "v":
            return self.w - self.H * self.u
        return self.w + self.H * (self.w - self.w_prev)

    def forward(
        self, xb: torch.Tensor, predict: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """xb (..., N+1) with the bias input → (z, a, mask), each (..., M)."""
        acc = xb @ self.w_hat(predict).T
        z = self._clamp(rhu(acc, self.k_fwd), self.fy, "y")
        mask = z > 0
        if self.act == "relu":
            a = z.clamp_min(0)
        elif self.act == "leaky_relu":
            a = torch.where(mask, z, rhu(z * self.slope[0], self.slope[1]))
        elif self.act == "identity":
            a = z
        elif self.act in ("tanh", "sigmoid"):
            a = lut_forward(z, self.lut, self.fy.frac)
        else:
            unknown(self.act, "activation")
        return z, a, mask

    # -- backward and update (numerics §5) ---------------------------------------------------
    def _randoms(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rounding addends (M, N+1) of this update for u' and w' (numerics §6 draw order)."""
        if self._block is None or self._block_pos == DRAW_BLOCK:
            C = self.G * (self.N + 1)
            st = self.lfsr.draws(DRAW_BLOCK * C)  # (L, B·C), lane-major
            last = st.reshape(self.L, DRAW_BLOCK, C)[:, :, -1].T.copy()  # (B, L)
            # slot (g, i) of update b is draw b·C + g·(N+1) + i of lane l, row j = g·L + l
            grid = st.reshape(self.L, DRAW_BLOCK, self.G, self.N + 1).transpose(1, 2, 0, 3)
            grid = grid.reshape(DRAW_BLOCK, self.G * self.L, self.N + 1)[:, : self.M]
            # numpy here: these block-sized tensors are where torch's intra-op threads cost most
            mask = np.uint64((1 << self.R) - 1)
            add_u = torch.from_numpy(rsr_addend((grid & mask).astype(np.int64), self.k_u, self.R))
            add_w = None
            if self.sc:
                r_w = ((grid >> np.uint64(self.R)) & mask).astype(np.int64)
                add_w = torch.from_numpy(rsr_addend(r_w, self.k_v, self.R))
            self._block = (add_u, add_w, last)
            self._block_pos = 0
        add_u, add_w, last = self._block
        b = self._block_pos
        self._block_pos += 1
        self._last_draw = (last, b)
        return add_u[b], (add_w[b] if add_w is not None else None)

    def _round(self, v: torch.Tensor, k: int, addend: torch.Tensor | None) -> torch.Tensor:
        if k == 0:
            return v
        if self.stochastic:
            return (v + addend) >> k
        return rne(v, k)

    def backward(self, sid: int, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Backward of sample ``sid`` with output error g (M,) → (δ, gin or None); updates.
        The stash holds (x with bias, the mask ``z > 0``, or for tanh/sigmoid the output y)."""
        xb, mask = self.stash.pop(sid)
        if self.act in ("tanh", "sigmoid"):
            delta = lut_derivative(self.act, mask, g, self.fy.frac)
        elif self.act == "relu":
            delta = torch.where(mask, g, 0)
        elif self.act == "leaky_relu":
            delta = torch.where(mask, g, rhu(g * self.slope[0], self.slope[1]))
        elif self.act == "identity":
            delta = g
        else:
            unknown(self.act, "activation")
        w, u = self.w, self.u
        gin = None
        if self.input_gradient:
            gin = self._clamp(rhu(delta @ w[:, : self.N], self.k_gin), self.fgin, "gin")
        P = torch.outer(delta, xb)
        add_u, add_w = self._randoms() if self.stochastic else (None, None)
        U = _sum_terms(
            _mul_shift(u, self.t_m), _mul_shift(P, self.t_lr), _mul_shift(w, self.t_lrwd)
        )
        u1 = self._clamp(self._round(U, self.k_u, add_u), self.fu, "u")
        if self.sc:
            V = _sum_terms(
                _mul_shift(u1, self.t_a), _mul_shift(P, self.t_b), _mul_shift(w, self.t_bwd)
            )
            w1 = self._clamp(w - self._round(V, self.k_v, add_w), self.fw, "w")
        else:
            w1 = self._clamp(w - u1, self.fw, "w")
        if self.track_prev:
            self.w_prev = w
        self.w, self.u = w1, u1
        self.updates += 1
        return delta, gin


class GoldenModel:
    """Fixed-point PB trainer, bit-exact to the RTL (docs/numerics.md, docs/ports.md).

    Parameters
    ----------
    plan: the compiled plan (every format, constant, delay, seed is read from it).
    model: the float ``nn.Module`` the plan was compiled from; each stage's ``nn.Linear``
        (found by ``stage.name``) gives the initial weights, quantised per numerics §2.
    config: training settings; only ``seed`` (sample order) is used — the arithmetic comes
        from the plan. Default: ``plan.train``.
    trace: record a :class:`TickTrace` per tick in :attr:`traces` (slow; for testbenches).
    profile: record every clamped tensor's max|value| before the clamp (:attr:`ranges`; the
        golden pass of the calibration, docs/architecture.md §4.2).

    Raises :class:`GoldenError` for a plan it cannot run (auxiliary heads, accumulators wider
    than 64 bits, inconsistent formats) or a model whose layers do not match the plan.
    """

    target = "golden"

    def __init__(
        self,
        plan: Plan,
        model: nn.Module,
        config: TrainConfig | None = None,
        *,
        trace: bool = False,
        profile: bool = False,
    ) -> None:
        if any(s.role != "main" for s in plan.stages) or getattr(plan, "head_losses", ()):
            raise GoldenError(
                "the golden model supports the global strategy only (no auxiliary heads)"
            )
        if config is None:
            cfg = {k: v for k, v in plan.train.items() if k not in ("lr1", "momentum1")}
            config = TrainConfig.from_dict(cfg)
        self.plan, self.config, self.trace = plan, config, trace
        self.loss: LossUnit = plan.loss
        modules = dict(model.named_modules())
        self._names: list[str] = []
        self.stages: list[_StageEngine] = []
        prev: Stage | None = None
        for st in plan.stages:
            lin = modules.get(st.name)
            if not isinstance(lin, nn.Linear):
                raise GoldenError(
                    f"model has no nn.Linear named {st.name!r} (plan stage {st.index})"
                )
            if lin.bias is None:
                raise GoldenError(f"layer {st.name!r} has no bias; the hardware trains one")
            if tuple(lin.weight.shape) != (st.out_features, st.in_features):
                raise GoldenError(
                    f"layer {st.name!r} is {tuple(lin.weight.shape)} but the plan says "
                    f"({st.out_features}, {st.in_features})"
                )
            if prev is not None and (
                prev.formats.y != st.formats.x or st.formats.gin != prev.formats.d
            ):
                raise GoldenError(f"stage {st.index}: formats disagree with stage {prev.index}")
            self.stages.append(_StageEngine(plan, st, lin.weight.detach(), lin.bias.detach()))
            self._names.append(st.name)
            prev = st
        last = plan.stages[-1]
        if self.loss.z != last.formats.y or self.loss.d != last.formats.d:
            raise GoldenError("loss unit formats disagree with the last stage")
        if self.loss.kind == "cross_entropy" and self.loss.z.frac < self.loss.exp_lut_frac:
            raise GoldenError("logits need at least exp_lut_frac fraction bits")
        self._lut = torch.tensor(self.loss.exp_lut, dtype=torch.int64)
        self.S = len(self.stages)
        self.sequential = plan.schedule == "sequential"
        self._fwd: list[tuple[_Sample, torch.Tensor] | None] = [None] * self.S
        self._bwd: list[tuple[_Sample, torch.Tensor] | None] = [None] * self.S
        self._loss_sat = 0
        self._loss_peak: float | None = 0.0 if profile else None
        if profile:
            for eng in self.stages:
                eng.peaks = dict.fromkeys(STAGE_SAT_TENSORS, 0.0)
        #: input values clamped by the host's quantisation (numerics §3), per streamed sample;
        #: on no hardware counter
        self.input_saturations = 0
        self._clock = 0  # tick-model clock (sequential: 2S clock ticks per sample)
        self._seq_ticks = 0
        self._last_entry: int | None = None
        self._next_id = 0
        self.samples_trained = 0
        self.samples_applied = 0
        self.epochs_trained = 0
        self.results: list[Result] = []
        self.traces: list[TickTrace] = []

    # -- counters ----------------------------------------------------------------------------
    @property
    def stage_saturations(self) -> list[int]:
        """Per-stage saturation counters, then the loss unit's (S+1 values, each ≤ 2^32−1)."""
        vals = [int(s.sat) for s in self.stages] + [int(self._loss_sat)]
        return [min(v, U32_MAX) for v in vals]

    @property
    def saturations(self) -> int:
        """Sum of :attr:`stage_saturations`."""
        return sum(self.stage_saturations)

    @property
    def ranges(self) -> dict[int, dict[str, float]]:
        """Max|value| before the clamp seen so far (``profile=True``; real values), in the
        calibration's form ``{stage: {tensor: max}}`` (docs/architecture.md §4.2): per stage
        ``y`` (z), ``gin``, ``u`` (u'), ``w`` (w'), and for the last stage ``d`` (the loss unit's
        δ). A value above its format's largest value is a tensor the run saturated. Raises
        :class:`GoldenError` without ``profile``."""
        if self._loss_peak is None:
            raise GoldenError("ranges need GoldenModel(..., profile=True)")
        out = {k: dict(eng.peaks or {}) for k, eng in enumerate(self.stages, start=1)}
        out[self.S]["d"] = self._loss_peak
        return out

    @property
    def tensor_saturations(self) -> list[dict[str, int]]:
        """The saturation counters split by tensor kind (numerics §8), S+1 entries in the order
        of :attr:`stage_saturations`: per stage ``{"y", "gin", "u", "w"}`` (clamps of z, the
        input gradient, u' and w'; ``gin`` is 0 for stage 1), then the loss unit's ``{"d"}``
        (δ clamps). Unclamped counts: each entry sums to its stage's counter below 2^32.
        Input clamps are not on any counter: :attr:`input_saturations`. Source: the golden
        model only; the RTL counts per stage (derived: one 32-bit counter per stage fits the
        iCEBreaker, docs/numerics.md §8)."""
        return [dict(s.sat_by) for s in self.stages] + [{"d": int(self._loss_sat)}]

    @property
    def ticks(self) -> int:
        """The hardware ``ticks`` counter (numerics §7): ``pb`` every tick, bubbles included;
        ``sequential`` one per sample."""
        return self._seq_ticks if self.sequential else self._clock

    @property
    def clock(self) -> int:
        """Ticks of the tick model run so far (= :attr:`ticks` for ``pb``; ``sequential`` runs
        a sample's forward, loss and backward as 2S ticks of this clock)."""
        return self._clock

    @property
    def busy(self) -> bool:
        """True while a sample is in flight: from the tick it enters stage 1 through the tick of
        its stage-1 backward slot (entry + 2S − 1), training or not (numerics §7)."""
        return self._last_entry is not None and self._clock < self._last_entry + 2 * self.S

    # -- host boundary -------------------------------------------------------------------------
    def quantise_input(self, x: torch.Tensor) -> torch.Tensor:
        """x float (..., N) → int64 in stage 1's x format (numerics §3; saturations not counted)."""
        return quantise(x, self.stages[0].fx)[0]

    def _quantise_rows(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x float (n, N) → (int64 (n, N) in stage 1's x format, clamped values per row (n,))."""
        xq = self.quantise_input(x)
        scaled = torch.round(x.detach().to(torch.float64) * 2.0 ** self.stages[0].fx.frac)
        return xq, (scaled != xq).sum(dim=-1)

    def _with_bias(self, x: torch.Tensor, stage: _StageEngine) -> torch.Tensor:
        pad = torch.full((*x.shape[:-1], 1), stage.bias_in, dtype=torch.int64)
        return torch.cat([x, pad], dim=-1)

    # -- loss unit (numerics §4) ---------------------------------------------------------------
    def _loss_clamp(self, delta: torch.Tensor) -> torch.Tensor:
        """``sat(δ, loss.d)`` counted on the loss unit (numerics §4.6), peak kept when profiling."""
        out, c = sat(delta, self.loss.d)
        self._loss_sat += c
        if self._loss_peak is not None and delta.numel():
            self._loss_peak = max(
                self._loss_peak, float(delta.abs().max()) * 2.0**-self.loss.d.frac
            )
        return out

    def loss_unit(
        self, z: torch.Tensor, label: torch.Tensor, want_delta: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Logits z (..., C) int64 and labels (...) → (pred, loss_raw, δ (..., C) or None).

        δ saturations are counted on the loss unit's counter (only when ``want_delta``).
        """
        lu = self.loss
        C = z.shape[-1]
        onehot = torch.nn.functional.one_hot(label, C).to(torch.int64)
        pred = z.argmax(dim=-1)
        fy, fd = lu.z.frac, lu.d.frac
        if lu.kind == "cross_entropy":
            t = z.max(dim=-1, keepdim=True).values - z
            idx = rhu(t, fy - lu.exp_lut_frac).clamp_max(len(lu.exp_lut) - 1)
            e = self._lut[idx]
            E = e.sum(dim=-1, keepdim=True)
            r = torch.div(
                torch.full_like(E, 1 << (lu.exp_frac + lu.recip_frac)), E, rounding_mode="floor"
            )
            p = rhu(e * r, lu.exp_frac)
            loss_raw = (p * onehot).sum(dim=-1)
            delta = None
            if want_delta:
                delta = self._loss_clamp(rhu(p, lu.recip_frac - fd) - onehot * (1 << fd))
        elif lu.kind == "mse":
            diff = z - onehot * (1 << fy)
            loss_raw = (diff * diff).sum(dim=-1).clamp_max(U32_MAX)
            delta = None
            if want_delta:
                ms = lu.mse_scale
                delta = self._loss_clamp(rhu(diff * ms.value, fy + ms.frac - fd))
        else:
            unknown(lu.kind, "loss")
        return pred, loss_raw, delta

    # -- ticks (numerics §7) -------------------------------------------------------------------
    def _tick(self, entering: tuple[_Sample, torch.Tensor] | None) -> None:
        t = self._clock
        S = self.S
        if entering is not None:
            self._fwd[0] = entering
            self._last_entry = t
        tr = TickTrace(t, entering[0].id if entering else None) if self.trace else None
        new_fwd: list[tuple[_Sample, torch.Tensor] | None] = [None] * S
        new_bwd: list[tuple[_Sample, torch.Tensor] | None] = [None] * S
        logits = None
        for s, eng in enumerate(self.stages):
            st_tr = StageTrace(s + 1) if tr is not None else None
            f = self._fwd[s]
            if f is not None:  # forward first: it reads the pre-update weights
                sample, xb = f
                z, a, mask = eng.forward(xb, sample.train)
                if sample.train:  # tanh/sigmoid stash the output y instead (numerics §2)
                    eng.stash[sample.id] = (xb, a if eng.lut is not None else mask)
                if s + 1 < S:
                    new_fwd[s + 1] = (sample, self._with_bias(a, self.stages[s + 1]))
                else:
                    logits = (sample, a)
                if st_tr is not None:
                    st_tr.fwd_sample, st_tr.x, st_tr.z, st_tr.a, st_tr.mask = (
                        sample.id,
                        xb[: eng.N],
                        z,
                        a,
                        mask,
                    )
            b = self._bwd[s]
            if b is not None:
                sample, g = b
                delta, gin = eng.backward(sample.id, g)
                if s > 0:
                    new_bwd[s - 1] = (sample, gin)
                else:
                    self.samples_applied += 1
                if st_tr is not None:
                    st_tr.bwd_sample, st_tr.g, st_tr.delta, st_tr.gin = sample.id, g, delta, gin
            if st_tr is not None:
                st_tr.w, st_tr.u, st_tr.w_prev = eng.w, eng.u, eng.w_prev
                st_tr.lfsr = eng.lfsr_state
                tr.stages.append(st_tr)
        if logits is not None:
            sample, z = logits
            pred, loss_raw, delta = self.loss_unit(
                z, torch.tensor(sample.label), want_delta=sample.train
            )
            res = Result(sample.id, int(pred), int(loss_raw), sample.train)
            self.results.append(res)
            if sample.train:
                new_bwd[S - 1] = (sample, delta)
            if tr is not None:
                tr.loss = LossTrace(sample.id, z, delta, res)
        self._fwd, self._bwd = new_fwd, new_bwd
        self._clock += 1
        if tr is not None:
            self.traces.append(tr)

    def submit(self, x_int: torch.Tensor, label: int, train: bool = True) -> int:
        """Stream one already-quantised sample (N,) int64 into stage 1 (one tick); returns its
        sample number. ``sequential`` first drains the pipeline (one sample in flight)."""
        if self.sequential:
            self.flush()
            self._seq_ticks += 1
        sample = _Sample(self._next_id, int(label), bool(train))
        self._next_id += 1
        if train:
            self.samples_trained += 1
        self._tick((sample, self._with_bias(x_int, self.stages[0])))
        return sample.id

    # -- Trainer protocol ----------------------------------------------------------------------
    def train_sample(self, x: torch.Tensor, y: int | torch.Tensor) -> None:
        """Stream one float sample x (N,) with label y into training (numerics §3 quantisation);
        does not flush."""
        xq, clamped = self._quantise_rows(x[None, :])
        self.input_saturations += int(clamped[0])
        self.submit(xq[0], int(y), True)

    def flush(self) -> None:
        """Run bubble ticks until no sample is in flight (every pending update applied)."""
        while self.busy:
            self._tick(None)

    def train(
        self, x: torch.Tensor, y: torch.Tensor, epochs: int = 1, progress: bool = False
    ) -> None:
        """Train ``epochs`` passes over x (n, N) float, y (n,) in ``epoch_order``, then flush."""
        xq, clamped = self._quantise_rows(x)
        fast = _QuantisedFeeder(self, xq, clamped.tolist())
        rows = torch.arange(len(x)).unsqueeze(1)
        stream_epochs(fast, rows, y, epochs, self.config.seed, progress)
        self.epochs_trained = fast.epochs_trained

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Predicted classes int64 (n,) of x (n, N): inference samples (train = 0) streamed after
        a flush, then flushed; computed as one batch (weights are constant meanwhile)."""
        return self.infer(x)[0]

    def infer(self, x: torch.Tensor, y: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """Stream x (n, N) as inference samples; return (pred (n,), loss_raw (n,)) — loss_raw
        against labels ``y`` (0 if None). Appends their :class:`Result` records."""
        self.flush()
        n = len(x)
        labels = torch.zeros(n, dtype=torch.int64) if y is None else y.to(torch.int64)
        if n == 0:
            return torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
        xq, clamped = self._quantise_rows(x)
        self.input_saturations += int(clamped.sum())
        if self.trace:  # tick by tick, so every tick is traced
            first = len(self.results)
            for i in range(n):
                self.submit(xq[i], int(labels[i]), False)
            self.flush()
            res = self.results[first:]
            return (
                torch.tensor([r.pred for r in res], dtype=torch.int64),
                torch.tensor([r.loss_raw for r in res], dtype=torch.int64),
            )
        a = self._with_bias(xq, self.stages[0])
        for s, eng in enumerate(self.stages):
            _, a, _ = eng.forward(a, False)
            if s + 1 < self.S:
                a = self._with_bias(a, self.stages[s + 1])
        pred, loss_raw, _ = self.loss_unit(a, labels, want_delta=False)
        first = self._next_id
        self._next_id += n
        self.results.extend(
            Result(first + i, p, lr, False)
            for i, (p, lr) in enumerate(zip(pred.tolist(), loss_raw.tolist(), strict=True))
        )
        # the ticks that streaming would have run: n entries (2S apart when sequential), flush
        self._last_entry = self._clock + (n - 1) * (2 * self.S if self.sequential else 1)
        self._clock = self._last_entry + 2 * self.S
        if self.sequential:
            self._seq_ticks += n
        return pred, loss_raw

    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Accuracy (fraction in [0, 1]) of :meth:`predict` on x against y."""
        return accuracy(self.predict(x), y)

    # -- weights -------------------------------------------------------------------------------
    def memories(self) -> dict[str, dict[str, torch.Tensor]]:
        """Raw integer memories per stage name: ``w``, ``u`` (M, N+1) and ``w_prev`` (LWP ``w``
        form). Flushes first (weight access only while idle, docs/ports.md)."""
        self.flush()
        out = {}
        for name, eng in zip(self._names, self.stages, strict=True):
            d = {"w": eng.w.clone(), "u": eng.u.clone()}
            if eng.w_prev is not None:
                d["w_prev"] = eng.w_prev.clone()
            out[name] = d
        return out

    def load_memories(self, mem: dict[str, dict[str, torch.Tensor]]) -> None:
        """Write raw integer memories (as from :meth:`memories`; keys may be omitted)."""
        self.flush()
        for name, eng in zip(self._names, self.stages, strict=True):
            d = mem.get(name, {})
            for key in ("w", "u", "w_prev"):
                if key in d:
                    v = d[key].to(torch.int64)
                    if tuple(v.shape) != (eng.M, eng.N + 1):
                        raise GoldenError(f"{name}.{key}: shape {tuple(v.shape)} ≠ (M, N+1)")
                    if key == "w_prev" and eng.w_prev is None:
                        continue
                    setattr(eng, key, v.clone())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Current weights as float32 ``{name.weight: w[:, :N]/2^f, name.bias: w[:, N]/2^f}``."""
        out = {}
        for name, eng in zip(self._names, self.stages, strict=True):
            self.flush()
            scale = 2.0**-eng.fw.frac
            wf = eng.w.to(torch.float64) * scale
            out[f"{name}.weight"] = wf[:, : eng.N].to(torch.float32)
            out[f"{name}.bias"] = wf[:, eng.N].to(torch.float32).contiguous()
        return out

    def momentum_buffers(self) -> dict[str, torch.Tensor]:
        """PyTorch-style momentum buffers v = u/(η·2^f) (float32), keyed like :meth:`state_dict`
        (η = the plan's quantised ``lr`` constant)."""
        self.flush()
        out = {}
        for name, eng in zip(self._names, self.stages, strict=True):
            lr = eng.spec.update.lr.quantised
            vf = eng.u.to(torch.float64) * 2.0**-eng.fw.frac / lr
            out[f"{name}.weight"] = vf[:, : eng.N].to(torch.float32)
            out[f"{name}.bias"] = vf[:, eng.N].to(torch.float32).contiguous()
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Quantise float weights into ``w`` (numerics §2; ``w_prev`` = ``w``); velocities keep
        their values. Raises :class:`GoldenError` for a missing key or a wrong shape."""
        self.flush()
        for name, eng in zip(self._names, self.stages, strict=True):
            try:
                wt, bs = state[f"{name}.weight"], state[f"{name}.bias"]
            except KeyError as exc:
                raise GoldenError(f"state_dict lacks {exc.args[0]!r}") from exc
            if tuple(wt.shape) != (eng.M, eng.N) or tuple(bs.shape) != (eng.M,):
                raise GoldenError(f"{name}: shapes {tuple(wt.shape)}, {tuple(bs.shape)} differ")
            eng.w = quantise(torch.cat([wt, bs[:, None]], dim=1), eng.fw)[0]
            if eng.w_prev is not None:
                eng.w_prev = eng.w

    def snapshot(self) -> dict[str, Any]:
        """The whole training state after a flush (which it runs first), as plain Python values:
        ``memories`` (per stage name ``w``, ``u``[, ``w_prev``]: lists of M rows of N+1 ints),
        ``lfsr`` (per stage the lanes' states, None with nearest-even rounding),
        ``saturations`` (:attr:`tensor_saturations`, unclamped), ``samples_trained``,
        ``samples_applied``, ``clock``, ``seq_ticks``, ``next_id``, ``epochs_trained``.
        :meth:`restore` takes it back; a model restored from it continues bit for bit like this
        one (checkpoints, docs/protocol.md §7)."""
        self.flush()
        return {
            "memories": {
                name: {k: v.tolist() for k, v in d.items()} for name, d in self.memories().items()
            },
            "lfsr": [None if e.lfsr_state is None else list(e.lfsr_state) for e in self.stages],
            "saturations": self.tensor_saturations,
            "samples_trained": self.samples_trained,
            "samples_applied": self.samples_applied,
            "clock": self._clock,
            "seq_ticks": self._seq_ticks,
            "next_id": self._next_id,
            "epochs_trained": self.epochs_trained,
        }

    def restore(self, snap: dict[str, Any]) -> None:
        """Set the training state from a :meth:`snapshot` of a model of the same plan (memories,
        LFSR states, counters, clock, sample numbers); the pipeline is flushed first. Raises
        :class:`GoldenError` for a snapshot of another shape."""
        self.flush()
        try:
            mem = {
                name: {k: torch.tensor(v, dtype=torch.int64) for k, v in d.items()}
                for name, d in snap["memories"].items()
            }
            lfsr, sats = snap["lfsr"], snap["saturations"]
            if len(lfsr) != self.S or len(sats) != self.S + 1:
                raise GoldenError(f"snapshot of {len(lfsr)} stages; the plan has {self.S}")
            self.load_memories(mem)
            for eng, states, by in zip(self.stages, lfsr, sats, strict=False):
                if states is not None:
                    eng.set_lfsr_state(states)
                eng.sat_by = {k: int(by[k]) for k in STAGE_SAT_TENSORS}
            self._loss_sat = int(sats[-1]["d"])
            self.samples_trained = int(snap["samples_trained"])
            self.samples_applied = int(snap["samples_applied"])
            self._clock, self._seq_ticks = int(snap["clock"]), int(snap["seq_ticks"])
            self._next_id = int(snap["next_id"])
            self.epochs_trained = int(snap["epochs_trained"])
        except (KeyError, TypeError, ValueError) as exc:
            raise GoldenError(f"not a golden-model snapshot: {exc}") from exc
        self._last_entry = None

    def weights_hash(self) -> str:
        """SHA-256 (16 hex digits) of every stage's raw w and u — for determinism checks."""
        import hashlib

        h = hashlib.sha256()
        for eng in self.stages:
            h.update(eng.w.numpy().tobytes())
            h.update(eng.u.numpy().tobytes())
        return h.hexdigest()[:16]


class _QuantisedFeeder:
    """Lets :func:`stream_epochs` (which hands over rows of its ``x``) feed pre-quantised rows:
    it is given row indices (n, 1) as ``x`` and looks the quantised row up."""

    def __init__(self, model: GoldenModel, xq: torch.Tensor, clamped: list[int]) -> None:
        self.model, self.xq, self.clamped = model, xq, clamped
        self.epochs_trained = model.epochs_trained

    def train_sample(self, row: torch.Tensor, y: int) -> None:
        i = int(row[0])
        self.model.input_saturations += self.clamped[i]
        self.model.submit(self.xq[i], y, True)

    def flush(self) -> None:
        self.model.flush()
