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
from ..protocol.onchip import epoch_orders, run_chunks
from .fixed import U32_MAX, quantise, rhu, rne, rsr_addend, sat
from .heads import head_initial_weights
from .lfsr import LaneLFSRs
from .trainer import accuracy, stream_epochs

__all__ = [
    "GoldenModel",
    "Result",
    "StageTrace",
    "StreamTrace",
    "LossTrace",
    "TickTrace",
    "GoldenError",
    "onchip_order",
]

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
class StreamTrace:
    """One backward stream a stage ran in one tick (local/interlocking: a stage may run several,
    one per loss it carries, docs/numerics.md §7.2).

    loss: the loss t the error comes from (1-based; K is the true loss).
    sample: the sample back-propagated.
    g (M,), delta (M,): the error at the stage output and δ = f′(z)·g.
    gin (N,): the input gradient sent back (None when the stage does not send this stream on).
    updates: whether δ counts towards this stage's update (t is one of the stage's ``losses``)
        or only passes through (input gradient only).
    """

    loss: int
    sample: int
    g: torch.Tensor
    delta: torch.Tensor
    gin: torch.Tensor | None
    updates: bool


@dataclass
class StageTrace:
    """What one stage did in one tick (integer tensors; None where the slot was empty).

    x (N,), z (M,), a (M,), mask (M,) bool: the forward of ``fwd_sample`` (x without the bias
    input). g (M,), delta (M,), gin (N,): the backward of ``bwd_sample`` on the stream of the
    stage's delay-defining loss (the farthest loss that updates it; for ``global`` the only
    stream; gin None for a stage without an input gradient). ``streams``: every backward stream
    of the tick (:class:`StreamTrace`, ascending loss). ``update_sample`` / ``update_delta``
    (M,): the sample whose update the stage applied at the end of the tick and the δ it used
    (the saturated sum of its update streams' δ, numerics §5.6).
    w, u (M, N+1), w_prev (LWP ``w`` form, else None): the memories at the end of the tick.
    lfsr (L,): per-lane LFSR states at the end of the tick (None with nearest-even rounding).
    A convolution stage (docs/numerics.md §9): x (N_in,) = the input sample's C_in·Πin values
    in C order, z (C_out·P,) before pooling, a and g (C_out·P′,) after it, mask (C_out, P),
    ``argmax`` (C_out, P′) the stashed MaxPool index inside each window (None without MaxPool
    and for Linear), delta (C_out, P), gin (N_in,), w, u (C_out, T + 1), T = C_in·Πkernel.
    """

    stage: int
    fwd_sample: int | None = None
    x: torch.Tensor | None = None
    z: torch.Tensor | None = None
    a: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    argmax: torch.Tensor | None = None
    bwd_sample: int | None = None
    g: torch.Tensor | None = None
    delta: torch.Tensor | None = None
    gin: torch.Tensor | None = None
    w: torch.Tensor | None = None
    u: torch.Tensor | None = None
    w_prev: torch.Tensor | None = None
    lfsr: tuple[int, ...] | None = None
    streams: list[StreamTrace] = field(default_factory=list)
    update_sample: int | None = None
    update_delta: torch.Tensor | None = None


@dataclass
class LossTrace:
    """A loss unit's work at the end of a tick: logits ``z`` (C,), ``delta`` (C,) (None for
    an inference sample), and the result record."""

    sample: int
    z: torch.Tensor
    delta: torch.Tensor | None
    result: Result


@dataclass
class TickTrace:
    """One tick: its number (0-based, the tick-model clock), the sample that entered stage 1
    (None = bubble), the stages' traces (index i = plan stage i+1: main stages, then heads),
    the true loss unit's (None if no logits arrived) and the auxiliary heads' loss units
    (``head_losses[k]`` for loss L_k, k < K; only those that ran this tick)."""

    tick: int
    entered: int | None
    stages: list[StageTrace] = field(default_factory=list)
    loss: LossTrace | None = None
    head_losses: dict[int, LossTrace] = field(default_factory=dict)


class _Sample:
    __slots__ = ("id", "label", "train", "entry")

    def __init__(self, sid: int, label: int, train: bool, entry: int = 0) -> None:
        self.id, self.label, self.train, self.entry = sid, label, train, entry


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
        #: column lanes k (numerics §6: physical lane p = s·L + l draws for row l's columns
        #: i ≡ s mod k) and the slots of a row group, C = ⌈(N+1)/k⌉
        self.K = st.column_lanes
        self.C = -(-(self.N + 1) // self.K)
        #: input values per sample (without the bias input); a conv engine's N is its taps T
        self.N_in = st.in_features
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
        #: the MACs' weight operand: ŵ and w rounded by k_wop bits (numerics §3.2, §5.2)
        self.k_wop = st.weight_shift
        self.k_fwd = st.mac_w_frac + self.fx.frac - self.fy.frac
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
            self.k_gin = st.mac_w_frac + self.fd.frac - self.fgin.frac
        fw, fp = self.fw.frac, self.fd.frac + self.fx.frac
        self.t_m = _shift_term(upd.momentum, fw, upd.frac_u, "momentum·u")
        # lr·P exact (a plan without the scaled error of §5.3, or a convolution's summed P)
        self.t_lr = (0, 0) if upd.lr_delta else _shift_term(upd.lr, fp, upd.frac_u, "lr·P")
        #: the scaled errors e = rhu(c·δ, k) of numerics §5.3: (c, k, shift of e·x into the sum)
        scaled = {n: (c, k) for n, c, _, k in upd.scaled_errors(self.fd)}
        self.e_lr = self._scaled(scaled.get("scaled_lr"), upd.lr_delta, upd.frac_u)
        self.e_b = self._scaled(scaled.get("scaled_b"), upd.sc_lr_b_delta, upd.frac_v)
        self.t_lrwd = _shift_term(upd.lr_wd, fw, upd.frac_u, "lr_wd·w")
        self.k_u = upd.frac_u - fw
        self.sc = upd.sc
        if self.sc:
            self.t_a = _shift_term(upd.sc_a, fw, upd.frac_v, "sc_a·u'")
            self.t_b = (
                (0, 0) if upd.sc_lr_b_delta else _shift_term(upd.sc_lr_b, fp, upd.frac_v, "b·lr·P")
            )
            self.t_bwd = _shift_term(upd.sc_lr_wd_b, fw, upd.frac_v, "sc_lr_wd_b·w")
            self.k_v = upd.frac_v - fw
        if self.k_u < 0 or (self.sc and self.k_v < 0):
            raise GoldenError(f"stage {st.index}: update sums have fewer fraction bits than w")
        self.stochastic = plan.rounding == "stochastic"
        self.R = plan.round_bits
        if self.stochastic:
            if 2 * self.R > plan.lfsr_width:
                raise GoldenError(f"round_bits {self.R} needs a {2 * self.R}-bit LFSR")
            if len(st.lfsr_seeds) != self.L * self.K:
                raise GoldenError(
                    f"stage {st.index}: {len(st.lfsr_seeds)} seeds for {self.L * self.K} lanes"
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

    def _scaled(
        self, ck: tuple[Const, int] | None, fe: QFormat | None, f_to: int
    ) -> tuple[int, int, int] | None:
        """(c, k, shift) of the scaled error ``e = rhu(c·δ, k)`` in format ``fe``
        (``ck = (c, k)`` from ``UpdateConstants.scaled_errors``) and its ``e·x`` term's left
        shift into a sum of ``f_to`` fraction bits; None: exact ``c·P``."""
        if ck is None or fe is None:
            return None
        c, k = ck
        shift = f_to - (fe.frac + self.fx.frac)
        if k < 0 or shift < 0:
            raise GoldenError(f"stage {self.spec.index}: scaled error {fe} does not fit the sum")
        return c.value, k, shift

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
            self.peaks[kind] = max(self.peaks.get(kind, 0.0), peak)
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
        if len(states) != self.L * self.K:
            n = self.L * self.K
            raise GoldenError(f"stage {self.spec.index}: {len(states)} LFSR states, {n} lanes")
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

    def w_hat_operand(self, predict: bool) -> torch.Tensor:
        """The forward MAC's weight operand ``rhu(ŵ, k_wop)`` (numerics §3.2; ŵ itself when the
        plan keeps it exact)."""
        return rhu(self.w_hat(predict), self.k_wop)

    def w_operand(self) -> torch.Tensor:
        """The input-gradient MAC's weight operand ``rhu(w, k_wop)`` (numerics §5.2)."""
        return rhu(self.w, self.k_wop)

    def forward(
        self, xb: torch.Tensor, predict: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """xb (..., N+1) with the bias input → (z, a, mask), each (..., M)."""
        acc = xb @ self.w_hat_operand(predict).T
        z = self._clamp(rhu(acc, self.k_fwd), self.fy, "y")
        mask = z > 0
        return z, self.activate(z, mask), mask

    def activate(self, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """a = f(z) (same shape) with ``mask`` = ``z > 0`` (numerics §3): ReLU, LeakyReLU
        (rhu(z·slope)), identity, tanh/sigmoid (the plan's LUT). Shared by the Linear and the
        convolution engines (:mod:`~pipetrain.sim.golden_conv`)."""
        if self.act == "relu":
            return z.clamp_min(0)
        if self.act == "leaky_relu":
            return torch.where(mask, z, rhu(z * self.slope[0], self.slope[1]))
        if self.act == "identity":
            return z
        if self.act in ("tanh", "sigmoid"):
            return lut_forward(z, self.lut, self.fy.frac)
        unknown(self.act, "activation")

    # -- backward and update (numerics §5) ---------------------------------------------------
    def _randoms(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rounding addends (M, N+1) of this update for u' and w' (numerics §6 draw order)."""
        if self._block is None or self._block_pos == DRAW_BLOCK:
            K, Cg = self.K, self.C
            C = self.G * Cg
            st = self.lfsr.draws(DRAW_BLOCK * C)  # (L·k, B·C), lane-major
            last = st.reshape(self.L * K, DRAW_BLOCK, C)[:, :, -1].T.copy()  # (B, L·k)
            # slot (g, t) of update b is draw b·C + g·C_g + t of physical lane p = s·L + l:
            # weight (g·L + l, t·k + s); with k = 1 slot (g, i) of lane l, row g·L + l
            grid = st.reshape(K, self.L, DRAW_BLOCK, self.G, Cg).transpose(2, 3, 1, 4, 0)
            grid = grid.reshape(DRAW_BLOCK, self.G * self.L, Cg * K)[:, : self.M, : self.N + 1]
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

    def derivative(self, sid: int, g: torch.Tensor) -> torch.Tensor:
        """δ (M,) = f′(z)·g of sample ``sid`` from its stash entry (the mask ``z > 0``, or for
        tanh/sigmoid the stashed output y) and the error g (M,) at the stage output
        (numerics §5.1); the entry stays stashed."""
        mask = self.stash[sid][1]
        if self.act in ("tanh", "sigmoid"):
            return lut_derivative(self.act, mask, g, self.fy.frac)
        return self.masked_derivative(mask, g)

    def masked_derivative(self, mask: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """δ = f′(z)·g (same shape) for ReLU, LeakyReLU (rhu(g·slope) where the mask is off)
        and identity, from the stashed ``mask`` = ``z > 0`` (numerics §5.1). Shared by the
        Linear and the convolution engines."""
        if self.act == "relu":
            return torch.where(mask, g, 0)
        if self.act == "leaky_relu":
            return torch.where(mask, g, rhu(g * self.slope[0], self.slope[1]))
        if self.act == "identity":
            return g
        unknown(self.act, "activation")

    def input_grad(self, delta: torch.Tensor) -> torch.Tensor:
        """gin (N,) = sat(rhu(δ·W[:, :N], k_gin), gin) with the weights as they are now (the
        start of the tick; numerics §5.2), counted on ``gin``."""
        acc = delta @ self.w_operand()[:, : self.N]
        return self._clamp(rhu(acc, self.k_gin), self.fgin, "gin")

    #: whether the layer has a bias (a convolution may not: its bias column stays 0)
    has_bias = True

    @property
    def weight_shape(self) -> tuple[int, ...]:
        """The layer's ``weight`` shape: (M, N) (a convolution's: (C_out, C_in, *kernel))."""
        return (self.M, self.N)

    def gradient(self, sid: int, delta: torch.Tensor) -> torch.Tensor:
        """P (M, N+1) = outer(δ, x) of sample ``sid`` with its stashed input (numerics §5.3;
        a convolution stage sums it over its output positions, §9.2)."""
        return torch.outer(delta, self.stash[sid][0])

    def update(self, sid: int, delta: torch.Tensor) -> None:
        """The momentum (and SC) update of sample ``sid`` with δ (M,) and its stashed input
        (numerics §5.3–§5.5), one LFSR draw per lane per slot; drops nothing from the stash."""
        w, u = self.w, self.u
        P = (
            self.gradient(sid, delta)
            if self.e_lr is None or (self.sc and self.e_b is None)
            else None
        )

        def lr_term(e: tuple[int, int, int] | None, exact: tuple[int, int]) -> torch.Tensor | None:
            if e is None:  # c·P exact
                return _mul_shift(P, exact)
            c, k, shift = e  # (rhu(c·δ, k))·x, numerics §5.3
            return _mul_shift(self.gradient(sid, rhu(delta * c, k)), (1, shift))

        add_u, add_w = self._randoms() if self.stochastic else (None, None)
        U = _sum_terms(
            _mul_shift(u, self.t_m), lr_term(self.e_lr, self.t_lr), _mul_shift(w, self.t_lrwd)
        )
        u1 = self._clamp(self._round(U, self.k_u, add_u), self.fu, "u")
        if self.sc:
            V = _sum_terms(
                _mul_shift(u1, self.t_a), lr_term(self.e_b, self.t_b), _mul_shift(w, self.t_bwd)
            )
            w1 = self._clamp(w - self._round(V, self.k_v, add_w), self.fw, "w")
        else:
            w1 = self._clamp(w - u1, self.fw, "w")
        if self.track_prev:
            self.w_prev = w
        self.w, self.u = w1, u1
        self.updates += 1

    def backward(self, sid: int, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Single-stream backward of sample ``sid`` (the ``global`` strategy): δ, gin (None for
        a stage without an input gradient), then the update; pops the stash entry."""
        delta = self.derivative(sid, g)
        gin = self.input_grad(delta) if self.input_gradient else None
        self.update(sid, delta)
        del self.stash[sid]
        return delta, gin


class GoldenModel:
    """Fixed-point PB trainer, bit-exact to the RTL (docs/numerics.md, docs/ports.md).

    Parameters
    ----------
    plan: the compiled plan (every format, constant, delay, seed is read from it).
    model: the float ``nn.Module`` the plan was compiled from; each main stage's ``nn.Linear``
        (found by ``stage.name``) gives the initial weights, quantised per numerics §2. The
        auxiliary-head stages (local/interlocking) start from the float reference trainer's
        seeded head initialisation (:func:`pipetrain.sim.heads.head_initial_weights`,
        docs/architecture.md §2.4), quantised the same way.
    config: training settings; only ``seed`` (sample order, head initialisation) is used — the
        arithmetic comes from the plan. Default: ``plan.train``.
    trace: record a :class:`TickTrace` per tick in :attr:`traces` (slow; for testbenches).
    profile: record every clamped tensor's max|value| before the clamp (:attr:`ranges`; the
        golden pass of the calibration, docs/architecture.md §4.2).

    Local and interlocking learning (numerics §7.2): every stage of the plan — main stages,
    then the head stages — is ticked; a stage forwards to the stages that read its output (the
    next main stage and a head attached to it) and runs one backward stream per loss it carries
    (``Stage.grad_losses``), passing the stream's input gradient on for ``Stage.gin_losses``
    and updating from the losses in ``Stage.losses`` once per sample, when the last of them
    arrives. Each head's loss unit produces its own result records (:attr:`head_results`).

    Raises :class:`GoldenError` for a plan it cannot run (accumulators wider than 64 bits,
    inconsistent formats, delays or streams that disagree with the tick model) or a model whose
    layers do not match the plan.
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
        if config is None:
            cfg = {k: v for k, v in plan.train.items() if k not in ("lr1", "momentum1")}
            config = TrainConfig.from_dict(cfg)
        self.plan, self.config, self.trace = plan, config, trace
        self.loss: LossUnit = plan.loss
        modules = dict(model.named_modules())
        self._names: list[str] = []
        self.stages: list[_StageEngine] = []
        mains = [st for st in plan.stages if st.role == "main"]
        heads = [st for st in plan.stages if st.role != "main"]
        if [st.index for st in plan.stages] != list(range(1, len(plan.stages) + 1)):
            raise GoldenError("plan stages must be numbered 1..n in order")
        if plan.stages[: len(mains)] != tuple(mains):
            raise GoldenError("plan stages must list the main stages before the heads")
        dtype = torch.float32
        for st in mains:
            lin = modules.get(st.name)
            if getattr(st, "conv", None) is not None:  # convolution: sim/golden_conv.py (§9)
                from .golden_conv import conv_engine

                self.stages.append(conv_engine(plan, st, lin))
                self._names.append(st.name)
                continue
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
            dtype = lin.weight.dtype
            self.stages.append(_StageEngine(plan, st, lin.weight.detach(), lin.bias.detach()))
            self._names.append(st.name)
        shapes = [(st.in_features, st.out_features) for st in heads]
        for st, wb in zip(heads, head_initial_weights(shapes, config.seed, dtype), strict=True):
            self.stages.append(_StageEngine(plan, st, wb[:, :-1], wb[:, -1]))
            self._names.append(st.name)
        self.S_main = len(mains)
        self.S = len(self.stages)
        self._wire(plan)
        for lu, feed in zip(self.loss_units, self._feed, strict=True):
            fy = self.stages[feed].spec.formats
            if lu.z != fy.y or lu.d != fy.d:
                raise GoldenError(f"loss unit formats disagree with stage {feed + 1}")
            if lu.kind == "cross_entropy" and lu.z.frac < lu.exp_lut_frac:
                raise GoldenError("logits need at least exp_lut_frac fraction bits")
        self._luts = [torch.tensor(lu.exp_lut, dtype=torch.int64) for lu in self.loss_units]
        self._lut = self._luts[0]
        self.sequential = plan.schedule == "sequential"
        self._fwd: list[tuple[_Sample, torch.Tensor] | None] = [None] * self.S
        self._bwd: list[dict[int, tuple[_Sample, torch.Tensor]]] = [{} for _ in self.stages]
        self._loss_sats = [0] * len(self.loss_units)
        self._loss_peaks: list[float] | None = [0.0] * len(self.loss_units) if profile else None
        if profile:
            for eng in self.stages:
                eng.peaks = dict.fromkeys(STAGE_SAT_TENSORS, 0.0)
        #: input values clamped by the host's quantisation (numerics §3), per streamed sample;
        #: on no hardware counter
        self.input_saturations = 0
        self._clock = 0  # tick-model clock (sequential: `span` clock ticks per sample)
        self._seq_ticks = 0
        self._last_entry: int | None = None
        self._next_id = 0
        self.samples_trained = 0
        self.samples_applied = 0
        self.epochs_trained = 0
        self.results: list[Result] = []
        #: per auxiliary head k (loss L_k, k < K) its loss unit's result records, one per
        #: sample (training and inference alike), in sample order
        self.head_results: dict[int, list[Result]] = {k: [] for k in range(1, self.K)}
        self._head_hits = [0] * (self.K - 1)  # per head: predictions equal to the label
        self.traces: list[TickTrace] = []

    def _wire(self, plan: Plan) -> None:
        """The stage graph of the tick model (numerics §7.2): who reads whose output, where
        input gradients go, which stage feeds which loss unit; the position p of every stage
        (main stage s: s; head stage: its attach stage's + 1) and of every loss (P_t, the
        position of the stage feeding it). Checks every stage's delay against the tick model
        (``pb``: D_s = max over its update losses of 2·(P_t − p) + 1) and that its stash holds
        every stream it carries."""
        n = self.S
        pos = [0] * n
        self._readers: list[list[int]] = [[] for _ in range(n)]
        self._target: list[int | None] = [None] * n  # where a stage's input gradient goes
        for i, eng in enumerate(self.stages):
            st = eng.spec
            a = st.attach
            if not 0 <= a < st.index:
                raise GoldenError(f"stage {st.index}: attach {a} must be an earlier stage")
            if a:
                src = self.stages[a - 1].spec
                if src.formats.y != st.formats.x:
                    raise GoldenError(f"stage {st.index}: formats disagree with stage {a}")
                if st.input_gradient and st.formats.gin != src.formats.d:
                    raise GoldenError(f"stage {st.index}: formats disagree with stage {a}")
                self._readers[a - 1].append(i)
                self._target[i] = a - 1
            pos[i] = pos[a - 1] + 1 if a else 1
        # loss units: the true loss L_K after the last main stage, L_k after head k's last stage
        head_ends = [i for i in range(self.S_main, n) if not self._readers[i]]
        self.K = len(head_ends) + 1
        if len(plan.head_losses) != self.K - 1:
            raise GoldenError(
                f"the plan has {len(plan.head_losses)} head loss units for {self.K - 1} heads"
            )
        blocks = [self.stages[i].spec.block for i in head_ends]
        if blocks != sorted(blocks) or any(self.stages[i].spec.role != "head" for i in head_ends):
            raise GoldenError("head loss units must follow the heads in block order")
        #: loss units in loss order L_1 … L_K (the true loss last)
        self.loss_units: list[LossUnit] = [*plan.head_losses, plan.loss]
        self._feed = [*head_ends, self.S_main - 1]  # stage feeding loss t = index t − 1
        self._feeds = {i: t for t, i in enumerate(self._feed, start=1)}
        P = {t: pos[i] for t, i in enumerate(self._feed, start=1)}
        self._pos, self._loss_pos = pos, P
        span = max(P.values()) + 1
        for i, eng in enumerate(self.stages):
            st = eng.spec
            streams = tuple(st.grad_losses) or tuple(st.losses)
            if not set(st.losses) <= set(streams) or any(not 1 <= t <= self.K for t in streams):
                raise GoldenError(f"stage {st.index}: streams {streams} / losses {st.losses}")
            if set(st.gin_losses) - set(streams) or (bool(st.gin_losses) != st.input_gradient):
                raise GoldenError(f"stage {st.index}: gin_losses {st.gin_losses} do not fit")
            tgt = self._target[i]
            for t in st.gin_losses:
                if tgt is None or t not in (self.stages[tgt].spec.grad_losses or (self.K,)):
                    raise GoldenError(f"stage {st.index} sends L{t} to a stage that lacks it")
            eng.streams, eng.update_losses = streams, tuple(st.losses)
            if len(st.losses) > 1:  # the δ sum of several update losses (numerics §5.6)
                eng.sat_by["d"] = 0
            eng.gin_losses = tuple(st.gin_losses)
            delay = {t: 2 * (P[t] - pos[i]) + 1 for t in streams}
            if min(delay.values()) < 1:
                raise GoldenError(f"stage {st.index} carries a loss that it does not reach")
            eng.main_loss = max(st.losses, key=lambda t: (delay[t], t))
            if plan.schedule == "pb":
                listed = getattr(st, "streams", None)
                if listed is not None and dict(listed) != delay:
                    raise GoldenError(
                        f"stage {st.index}: the plan's streams {listed} are not the tick "
                        f"model's {tuple(delay.items())} (numerics §7.2)"
                    )
                want = delay[eng.main_loss]
                if st.delay != want:
                    raise GoldenError(
                        f"stage {st.index}: the plan's delay {st.delay} is not the tick "
                        f"model's {want} (2·(P_t − p) + 1, numerics §7.2)"
                    )
                far = max(delay.values())
                if far > st.delay:
                    raise GoldenError(
                        f"stage {st.index} passes a stream back {far} updates after its "
                        f"forward but stashes D_s + 1 = {st.stash_depth} samples"
                    )
            span = max(span, *(2 * P[t] - pos[i] + 1 for t in streams))
        #: ticks a sample is in flight (numerics §7): entry tick through its last backward
        self.span = span

    # -- counters ----------------------------------------------------------------------------
    @property
    def stage_saturations(self) -> list[int]:
        """Per-stage saturation counters (every stage, main then heads), then the loss units'
        (the true loss first, then the heads' L_1 … L_{K−1}); each ≤ 2^32−1. ``global``: S+1
        values."""
        sats = [self._loss_sats[-1], *self._loss_sats[:-1]]
        vals = [int(s.sat) for s in self.stages] + [int(v) for v in sats]
        return [min(v, U32_MAX) for v in vals]

    @property
    def head_correct(self) -> list[int]:
        """Per auxiliary head L_1 … L_{K−1}: the samples (training and inference alike) whose
        head prediction equals their label, each ≤ 2^32−1 — the RTL's ``head_correct``
        counters (docs/ports.md); empty for ``global``."""
        return [min(v, U32_MAX) for v in self._head_hits]

    @property
    def saturations(self) -> int:
        """Sum of :attr:`stage_saturations`."""
        return sum(self.stage_saturations)

    @property
    def ranges(self) -> dict[int, dict[str, float]]:
        """Max|value| before the clamp seen so far (``profile=True``; real values), in the
        calibration's form ``{stage: {tensor: max}}`` (docs/architecture.md §4.2): per stage
        ``y`` (z), ``gin``, ``u`` (u'), ``w`` (w'), and for a stage feeding a loss unit ``d``
        (the loss unit's δ). A value above its format's largest value is a tensor the run
        saturated. Raises :class:`GoldenError` without ``profile``."""
        if self._loss_peaks is None:
            raise GoldenError("ranges need GoldenModel(..., profile=True)")
        out = {k: dict(eng.peaks or {}) for k, eng in enumerate(self.stages, start=1)}
        for t, i in enumerate(self._feed, start=1):
            out[i + 1]["d"] = self._loss_peaks[t - 1]
        return out

    @property
    def tensor_saturations(self) -> list[dict[str, int]]:
        """The saturation counters split by tensor kind (numerics §8), in the order of
        :attr:`stage_saturations`: per stage ``{"y", "gin", "u", "w"}`` (clamps of z, the
        input gradient, u' and w'; ``gin`` is 0 for stage 1) plus ``d`` on a stage that sums
        several update streams (the clamp of the δ sum, numerics §5.6), then each loss unit's
        ``{"d"}`` (δ clamps). Unclamped counts: each entry sums to its stage's counter below
        2^32. Input clamps are not on any counter: :attr:`input_saturations`. Source: the
        golden model only; the RTL counts per stage (derived: one 32-bit counter per stage
        fits the iCEBreaker, docs/numerics.md §8)."""
        sats = [self._loss_sats[-1], *self._loss_sats[:-1]]
        return [dict(s.sat_by) for s in self.stages] + [{"d": int(v)} for v in sats]

    @property
    def ticks(self) -> int:
        """The hardware ``ticks`` counter (numerics §7): ``pb`` every tick, bubbles included;
        ``sequential`` one per sample."""
        return self._seq_ticks if self.sequential else self._clock

    @property
    def clock(self) -> int:
        """Ticks of the tick model run so far (= :attr:`ticks` for ``pb``; ``sequential`` runs
        a sample's forward, loss and backward as :attr:`span` ticks of this clock)."""
        return self._clock

    @property
    def busy(self) -> bool:
        """True while a sample is in flight: from the tick it enters stage 1 through the tick of
        its last backward slot (entry + :attr:`span` − 1; ``global``: 2S − 1), training or not
        (numerics §7)."""
        return self._last_entry is not None and self._clock < self._last_entry + self.span

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
    def _loss_clamp(self, delta: torch.Tensor, t: int | None = None) -> torch.Tensor:
        """``sat(δ, d)`` counted on loss unit ``t`` (default the true loss; numerics §4.6), peak
        kept when profiling."""
        k = (t or self.K) - 1
        out, c = sat(delta, self.loss_units[k].d)
        self._loss_sats[k] += c
        if self._loss_peaks is not None and delta.numel():
            peak = float(delta.abs().max()) * 2.0 ** -self.loss_units[k].d.frac
            self._loss_peaks[k] = max(self._loss_peaks[k], peak)
        return out

    def loss_unit(
        self, z: torch.Tensor, label: torch.Tensor, want_delta: bool = True, t: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Logits z (..., C) int64 and labels (...) → (pred, loss_raw, δ (..., C) or None) of
        loss unit ``t`` (1-based loss index; default the true loss L_K).

        δ saturations are counted on that loss unit's counter (only when ``want_delta``).
        """
        k = (t or self.K) - 1
        lu = self.loss_units[k]
        C = z.shape[-1]
        onehot = torch.nn.functional.one_hot(label, C).to(torch.int64)
        pred = z.argmax(dim=-1)
        fy, fd = lu.z.frac, lu.d.frac
        if lu.kind == "cross_entropy":
            t_ = z.max(dim=-1, keepdim=True).values - z
            idx = rhu(t_, fy - lu.exp_lut_frac).clamp_max(len(lu.exp_lut) - 1)
            e = self._luts[k][idx]
            E = e.sum(dim=-1, keepdim=True)
            r = torch.div(
                torch.full_like(E, 1 << (lu.exp_frac + lu.recip_frac)), E, rounding_mode="floor"
            )
            p = rhu(e * r, lu.exp_frac)
            loss_raw = (p * onehot).sum(dim=-1)
            delta = None
            if want_delta:
                delta = self._loss_clamp(rhu(p, lu.recip_frac - fd) - onehot * (1 << fd), k + 1)
        elif lu.kind == "mse":
            diff = z - onehot * (1 << fy)
            loss_raw = (diff * diff).sum(dim=-1).clamp_max(U32_MAX)
            delta = None
            if want_delta:
                ms = lu.mse_scale
                delta = self._loss_clamp(rhu(diff * ms.value, fy + ms.frac - fd), k + 1)
        else:
            unknown(lu.kind, "loss")
        return pred, loss_raw, delta

    # -- ticks (numerics §7) -------------------------------------------------------------------
    def _tick(self, entering: tuple[_Sample, torch.Tensor] | None) -> None:
        t = self._clock
        if entering is not None:
            self._fwd[0] = entering
            self._last_entry = t
        tr = TickTrace(t, entering[0].id if entering else None) if self.trace else None
        new_fwd: list[tuple[_Sample, torch.Tensor] | None] = [None] * self.S
        new_bwd: list[dict[int, tuple[_Sample, torch.Tensor]]] = [{} for _ in self.stages]
        logits: dict[int, tuple[_Sample, torch.Tensor]] = {}
        for i, eng in enumerate(self.stages):
            st_tr = StageTrace(i + 1) if tr is not None else None
            f = self._fwd[i]
            if f is not None:  # forward first: it reads the pre-update weights
                sample, xb = f
                z, a, mask = eng.forward(xb, sample.train)
                if sample.train:  # tanh/sigmoid stash the output y instead (numerics §2)
                    # [x with bias, mask or y, streams still to run, δ sum, updates to come]
                    eng.stash[sample.id] = [
                        xb, a if eng.lut is not None else mask, len(eng.streams), None,
                        len(eng.update_losses),
                    ]  # fmt: skip
                for j in self._readers[i]:
                    new_fwd[j] = (sample, self._with_bias(a, self.stages[j]))
                if i in self._feeds:
                    logits[self._feeds[i]] = (sample, a)
                if st_tr is not None:  # a conv stage's mask is (mask, argmax); x its N_in
                    st_tr.fwd_sample, st_tr.x, st_tr.z, st_tr.a = sample.id, xb[: eng.N_in], z, a
                    st_tr.mask, st_tr.argmax = mask if isinstance(mask, tuple) else (mask, None)
            done: tuple[_Sample, torch.Tensor] | None = None
            for loss_t in sorted(self._bwd[i]):  # every stream reads the start-of-tick weights
                sample, g = self._bwd[i][loss_t]
                entry = eng.stash[sample.id]
                delta = eng.derivative(sample.id, g)
                gin = eng.input_grad(delta) if loss_t in eng.gin_losses else None
                if gin is not None:
                    new_bwd[self._target[i]][loss_t] = (sample, gin)
                upd = loss_t in eng.update_losses
                if upd:
                    entry[3] = delta if entry[3] is None else entry[3] + delta
                    entry[4] -= 1
                    if entry[4] == 0:
                        if done is not None:
                            raise GoldenError(f"stage {i + 1}: two updates in tick {t}")
                        done = (sample, entry[3])
                entry[2] -= 1
                if st_tr is not None:
                    st_tr.streams.append(StreamTrace(loss_t, sample.id, g, delta, gin, upd))
                    if loss_t == eng.main_loss:
                        st_tr.bwd_sample, st_tr.g, st_tr.delta, st_tr.gin = (
                            sample.id, g, delta, gin,
                        )  # fmt: skip
            if done is not None:  # one update per tick, after every stream's input gradient
                sample, dsum = done
                if len(eng.update_losses) > 1:  # the δ sum of several losses (numerics §5.6)
                    dsum = eng._clamp(dsum, eng.fd, "d")
                if not self.sequential and t - sample.entry - (self._pos[i] - 1) != eng.spec.delay:
                    raise GoldenError(f"stage {i + 1}: update of sample {sample.id} off its delay")
                eng.update(sample.id, dsum)
                if i == 0:
                    self.samples_applied += 1
                if st_tr is not None:
                    st_tr.update_sample, st_tr.update_delta = sample.id, dsum
            for sid in [k for k, e in eng.stash.items() if e[2] == 0]:
                del eng.stash[sid]
            if st_tr is not None:
                st_tr.w, st_tr.u, st_tr.w_prev = eng.w, eng.u, eng.w_prev
                st_tr.lfsr = eng.lfsr_state
                tr.stages.append(st_tr)
        for loss_t in sorted(logits):
            sample, z = logits[loss_t]
            pred, loss_raw, delta = self.loss_unit(
                z, torch.tensor(sample.label), want_delta=sample.train, t=loss_t
            )
            res = Result(sample.id, int(pred), int(loss_raw), sample.train)
            feed = self._feed[loss_t - 1]
            if loss_t == self.K:
                self.results.append(res)
            else:
                self.head_results[loss_t].append(res)
                self._head_hits[loss_t - 1] += int(pred) == sample.label
            if sample.train and loss_t in self.stages[feed].streams:
                new_bwd[feed][loss_t] = (sample, delta)
            if tr is not None:
                lt = LossTrace(sample.id, z, delta, res)
                if loss_t == self.K:
                    tr.loss = lt
                else:
                    tr.head_losses[loss_t] = lt
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
        sample = _Sample(self._next_id, int(label), bool(train), self._clock)
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
        """Stream x (n, N) as inference samples; return (pred (n,), loss_raw (n,)) of the true
        loss — loss_raw against labels ``y`` (0 if None). Appends their :class:`Result` records
        (and the heads' to :attr:`head_results`)."""
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
        acts: list[torch.Tensor] = []
        for eng in self.stages:
            a_in = xq if eng.spec.attach == 0 else acts[eng.spec.attach - 1]
            acts.append(eng.forward(self._with_bias(a_in, eng), False)[1])
        first = self._next_id
        self._next_id += n
        out = None
        for loss_t, feed in enumerate(self._feed, start=1):
            pred, loss_raw, _ = self.loss_unit(acts[feed], labels, want_delta=False, t=loss_t)
            recs = [
                Result(first + i, p, lr, False)
                for i, (p, lr) in enumerate(zip(pred.tolist(), loss_raw.tolist(), strict=True))
            ]
            if loss_t == self.K:
                self.results.extend(recs)
                out = (pred, loss_raw)
            else:
                self.head_results[loss_t].extend(recs)
                self._head_hits[loss_t - 1] += int((pred == labels).sum())
        # the ticks that streaming would have run: n entries (`span` apart when sequential)
        self._last_entry = self._clock + (n - 1) * (self.span if self.sequential else 1)
        self._clock = self._last_entry + self.span
        if self.sequential:
            self._seq_ticks += n
        return out

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

    def _main(self) -> list[tuple[str, _StageEngine]]:
        return list(zip(self._names, self.stages, strict=True))[: self.S_main]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Current weights of the main stages as float32 ``{name.weight: w[:, :N]/2^f,
        name.bias: w[:, N]/2^f}`` (loads into the user's model; the auxiliary heads are in
        :meth:`memories`)."""
        out = {}
        for name, eng in self._main():
            self.flush()
            scale = 2.0**-eng.fw.frac
            wf = eng.w.to(torch.float64) * scale
            out[f"{name}.weight"] = wf[:, : eng.N].reshape(eng.weight_shape).to(torch.float32)
            if eng.has_bias:
                out[f"{name}.bias"] = wf[:, eng.N].to(torch.float32).contiguous()
        return out

    def momentum_buffers(self) -> dict[str, torch.Tensor]:
        """PyTorch-style momentum buffers v = u/(η·2^f) (float32), keyed like :meth:`state_dict`
        (η = the plan's quantised ``lr`` constant)."""
        self.flush()
        out = {}
        for name, eng in self._main():
            lr = eng.spec.update.lr.quantised
            vf = eng.u.to(torch.float64) * 2.0**-eng.fw.frac / lr
            out[f"{name}.weight"] = vf[:, : eng.N].reshape(eng.weight_shape).to(torch.float32)
            if eng.has_bias:
                out[f"{name}.bias"] = vf[:, eng.N].to(torch.float32).contiguous()
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Quantise float weights into ``w`` (numerics §2; ``w_prev`` = ``w``); velocities keep
        their values (main stages; the heads keep theirs). Raises :class:`GoldenError` for a
        missing key or a wrong shape."""
        self.flush()
        for name, eng in self._main():
            try:
                wt = state[f"{name}.weight"]
                bs = state[f"{name}.bias"] if eng.has_bias else torch.zeros(eng.M)
            except KeyError as exc:
                raise GoldenError(f"state_dict lacks {exc.args[0]!r}") from exc
            if tuple(wt.shape) != eng.weight_shape or tuple(bs.shape) != (eng.M,):
                raise GoldenError(f"{name}: shapes {tuple(wt.shape)}, {tuple(bs.shape)} differ")
            wt = wt.reshape(eng.M, eng.N)
            eng.w = quantise(torch.cat([wt, bs[:, None]], dim=1), eng.fw)[0]
            if eng.w_prev is not None:
                eng.w_prev = eng.w

    def snapshot(self) -> dict[str, Any]:
        """The whole training state after a flush (which it runs first), as plain Python values:
        ``memories`` (per stage name ``w``, ``u``[, ``w_prev``]: lists of M rows of N+1 ints),
        ``lfsr`` (per stage the lanes' states, None with nearest-even rounding),
        ``saturations`` (:attr:`tensor_saturations`, unclamped), ``samples_trained``,
        ``samples_applied``, ``clock``, ``seq_ticks``, ``next_id``, ``epochs_trained``,
        ``head_correct`` (the heads' correct-prediction counters, unclamped; empty for
        ``global``). :meth:`restore` takes it back; a model restored from it continues bit for
        bit like this one (checkpoints, docs/protocol.md §7)."""
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
            "head_correct": list(self._head_hits),
        }

    def restore(self, snap: dict[str, Any]) -> None:
        """Set the training state from a :meth:`snapshot` of a model of the same plan (memories,
        LFSR states, counters — the heads' ``head_correct`` included —, clock, sample
        numbers); the pipeline is flushed first. Raises :class:`GoldenError` for a snapshot of
        another shape, or one with heads but without their counters (written before
        snapshots held them)."""
        self.flush()
        try:
            mem = {
                name: {k: torch.tensor(v, dtype=torch.int64) for k, v in d.items()}
                for name, d in snap["memories"].items()
            }
            lfsr, sats = snap["lfsr"], snap["saturations"]
            if len(lfsr) != self.S or len(sats) != self.S + self.K:
                raise GoldenError(f"snapshot of {len(lfsr)} stages; the plan has {self.S}")
            self.load_memories(mem)
            for eng, states, by in zip(self.stages, lfsr, sats, strict=False):
                if states is not None:
                    eng.set_lfsr_state(states)
                eng.sat_by = {k: int(by[k]) for k in eng.sat_by}
            loss = [int(v["d"]) for v in sats[self.S :]]
            self._loss_sats = [*loss[1:], loss[0]]
            self.samples_trained = int(snap["samples_trained"])
            self.samples_applied = int(snap["samples_applied"])
            self._clock, self._seq_ticks = int(snap["clock"]), int(snap["seq_ticks"])
            self._next_id = int(snap["next_id"])
            self.epochs_trained = int(snap["epochs_trained"])
            hits = [int(v) for v in snap.get("head_correct", ())]
            if len(hits) != self.K - 1:
                raise GoldenError(
                    f"snapshot with {len(hits)} head_correct counters; the plan has "
                    f"{self.K - 1} heads (a snapshot from before they were saved cannot "
                    "continue their counts: rerun from the start)"
                )
            self._head_hits = hits
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


def onchip_order(
    n: int, seed: int, first_epoch: int, epochs: int, per_run: int = 32
) -> list[torch.Tensor]:
    """The sample order of ``epochs`` epochs (from epoch ``first_epoch`` of the run seeded
    ``seed``, the plan's ``train["seed"]``) through a device's on-chip training set of ``n``
    samples: one int64 tensor per RUN command (≤ ``per_run`` epochs each: 32, or 1 for runs
    that keep per-sample records), the concatenated epoch orders
    of the device's LFSR permutation (docs/numerics.md §10, :mod:`pipetrain.protocol.onchip`).
    The device flushes after each RUN: stream each tensor with :meth:`GoldenModel.submit` and
    :meth:`GoldenModel.flush` after it to compute what the device computes. (The host's
    streamed runs use :func:`~pipetrain.data.epoch_order` instead and flush only at the end.)

    Raises ValueError for ``n`` outside 1..65535."""
    out = []
    for start, mask, k in run_chunks(n, seed, first_epoch, epochs, per_run):
        orders = epoch_orders(n, start, mask, k)
        out.append(torch.tensor([i for o in orders for i in o], dtype=torch.int64))
    return out


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
