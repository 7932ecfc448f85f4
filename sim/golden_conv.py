"""The fixed-point arithmetic of a convolution stage: docs/numerics.md §9, executable.

:class:`ConvEngine` is the golden model's stage engine for a ``Conv1d``/``Conv2d`` stage with
its activation and pooling. It keeps the Linear engine's state and update (weights, velocities,
LFSR draws in slot order, saturation counters) on the (C_out, T + 1) weight matrix — T =
C_in·Πkernel taps, bias column last — and replaces the per-sample arithmetic:

* forward (§9.1): the im2col matrix X (T + 1, P) of the input (zero padding; last row the bias
  input 2^x.frac, 0 without bias); acc = ŵ·X exact in int64; z = sat_y(rhu(acc, w.frac +
  x.frac − y.frac)); the activation as for Linear; pooling (§9.3): MaxPool takes the first
  largest value of each window (row-major) and stashes its index, AvgPool takes
  sat_y(rhu(Σ window · pool_scale, pool_shift));
* backward (§9.2): the error g (C_out·P′) goes to the pooling's input (MaxPool: to the stashed
  argmax, 0 elsewhere; AvgPool: rhu(g·pool_scale, pool_shift) to every value of the window;
  positions outside every window get 0), δ = act′ as for Linear; the input gradient is the
  transposed correlation, exact, then sat_gin(rhu(Σ, w.frac + d.frac − gin.frac)); the weight
  gradient P = δ·Xᵀ (C_out, T + 1) is summed exactly over all P output positions and enters
  ONE momentum/SC update per weight, the Linear stage's (§5.3–§5.5).

Every sum is exact (int64; the plan keeps every accumulator ≤ 62 bits), so the order of the
sums does not matter; rounding happens only where listed. Vectorised over positions and
samples; :func:`pipetrain.sim.golden_scalar.run_scalar` transcribes the same rules in loops.
Source: docs/numerics.md §9 (*derived* from the Linear stage's rules, §3 and §5).
"""

from __future__ import annotations

import dataclasses
import itertools

import torch
from torch import nn

from ..compiler.conv import ConvGeometry
from ..compiler.plan import Plan, Stage
from .fixed import rhu
from .golden import GoldenError, _StageEngine

__all__ = ["ConvEngine", "conv_engine", "conv_slot", "im2col_index", "pool_windows"]


def im2col_index(g: ConvGeometry) -> torch.Tensor:
    """(T, P) int64: for tap t (channel, kernel row, kernel column) and output position p
    (row-major) the index of the input value it reads in a sample's C-order values, or
    ``g.in_values`` (a padding zero)."""
    out = torch.full((g.taps, g.positions), g.in_values, dtype=torch.int64)
    kern = list(itertools.product(*(range(k) for k in g.kernel)))
    outs = list(itertools.product(*(range(o) for o in g.out_size)))
    strides = [1] * g.dims
    for d in range(g.dims - 2, -1, -1):
        strides[d] = strides[d + 1] * g.in_size[d + 1]
    plane = 1
    for v in g.in_size:
        plane *= v
    for c in range(g.in_channels):
        for ki, k in enumerate(kern):
            t = c * len(kern) + ki
            for p, o in enumerate(outs):
                pos = [o[d] * g.stride[d] + k[d] - g.padding[d] for d in range(g.dims)]
                if all(0 <= pos[d] < g.in_size[d] for d in range(g.dims)):
                    out[t, p] = c * plane + sum(pos[d] * strides[d] for d in range(g.dims))
    return out


def conv_slot(g: ConvGeometry, j: int, i: int) -> str:
    """What slot (j, i) of a convolution stage's (C_out, T + 1) weight matrix holds, for
    mismatch reports: row j = output channel, column i < T = tap (input channel, kernel offset)
    in the order of ``weight.view(C_out, -1)``, column T = the bias (docs/numerics.md §9):
    ``out channel 3, in channel 1, kernel (1, 0)`` or ``out channel 3, bias``."""
    if i >= g.taps:
        return f"out channel {j}, bias"
    c, r = divmod(i, g.taps // g.in_channels)
    off = []
    for size in reversed(g.kernel):
        r, o = divmod(r, size)
        off.append(o)
    return f"out channel {j}, in channel {c}, kernel ({', '.join(map(str, reversed(off)))})"


def pool_windows(g: ConvGeometry) -> torch.Tensor:
    """(P′, window) int64: the conv output positions (row-major) of each pooling window, in
    row-major order inside the window (the order MaxPool's ties are broken in)."""
    strides = [1] * g.dims
    for d in range(g.dims - 2, -1, -1):
        strides[d] = strides[d + 1] * g.out_size[d + 1]
    rows = []
    for q in itertools.product(*(range(n) for n in g.pooled_size)):
        rows.append(
            [
                sum((q[d] * g.pool_size[d] + r[d]) * strides[d] for d in range(g.dims))
                for r in itertools.product(*(range(k) for k in g.pool_size))
            ]
        )
    return torch.tensor(rows, dtype=torch.int64)


class ConvEngine(_StageEngine):
    """A convolution stage (module docstring). Members beyond the Linear engine's:
    ``conv`` (the geometry), ``N_in`` (input values per sample), ``weight_shape`` (the
    layer's weight shape, for ``state_dict``), ``has_bias``. Its ``N`` and ``M`` are the
    weight matrix's T and C_out (the update and the LFSR draws run over them)."""

    def __init__(self, plan: Plan, st: Stage, weight: torch.Tensor, bias: torch.Tensor | None):
        g = st.conv
        assert g is not None
        matrix = dataclasses.replace(st, in_features=g.taps, out_features=g.out_channels)
        b = bias if bias is not None else torch.zeros(g.out_channels, dtype=weight.dtype)
        super().__init__(plan, matrix, weight.reshape(g.out_channels, -1), b)
        self.conv, self.stage = g, st
        self.N_in = g.in_values
        self.has_bias = g.bias
        self.bias_in = (1 << self.fx.frac) if g.bias else 0
        self.idx = im2col_index(g)
        self.win = pool_windows(g)
        self.P, self.Pp = g.positions, g.pooled_positions

    @property
    def weight_shape(self) -> tuple[int, ...]:
        """(C_out, C_in, *kernel)."""
        return self.conv.weight_shape

    def columns(self, xb: torch.Tensor) -> torch.Tensor:
        """X (n, T + 1, P) of samples xb (n, N_in + 1) (their last entry is ignored)."""
        n = xb.shape[0]
        xz = torch.cat((xb[:, : self.N_in], torch.zeros(n, 1, dtype=torch.int64)), 1)
        cols = xz[:, self.idx]
        ones = torch.full((n, 1, self.P), self.bias_in, dtype=torch.int64)
        return torch.cat((cols, ones), 1)

    def forward(self, xb: torch.Tensor, predict: bool):
        """xb (..., N_in + 1) → (z (..., C_out·P), a (..., C_out·P′), (mask, argmax))."""
        lead = xb.shape[:-1]
        X = self.columns(xb.reshape(-1, xb.shape[-1]))
        acc = torch.matmul(self.w_hat_operand(predict), X)  # (n, C_out, P)
        z = self._clamp(rhu(acc, self.k_fwd), self.fy, "y")
        mask = z > 0
        a = self.activate(z, mask)
        g = self.conv
        arg = None
        if g.pool == "none":
            out = a
        else:
            w = a[..., self.win]  # (n, C_out, P′, window)
            if g.pool == "max":
                arg = w.argmax(dim=-1)  # the first largest value
                out = w.gather(-1, arg[..., None])[..., 0]
            else:
                s = w.sum(dim=-1)
                out = self._clamp(rhu(s * g.pool_scale, g.pool_shift), self.fy, "y")
        n = (*lead, -1)
        aux = (
            mask.reshape(*lead, self.M, self.P),
            None if arg is None else arg.reshape(*lead, self.M, self.Pp),
        )
        return z.reshape(n), out.reshape(n), aux

    def derivative(self, sid: int, g: torch.Tensor) -> torch.Tensor:
        """δ (C_out, P) from the error g (C_out·P′) and the stashed (mask, argmax)."""
        mask, arg = self.stash[sid][1]
        geo = self.conv
        g2 = g.reshape(self.M, self.Pp)
        if geo.pool == "none":
            e = g2
        else:
            e = torch.zeros(self.M, self.P, dtype=torch.int64)
            if geo.pool == "max":
                pos = self.win[torch.arange(self.Pp)[None, :], arg]  # (C_out, P′)
                e.scatter_(1, pos, g2)
            else:
                share = rhu(g2 * geo.pool_scale, geo.pool_shift)
                e[:, self.win.reshape(-1)] = share.repeat_interleave(geo.window, dim=1)
        return self.masked_derivative(mask, e)

    def input_grad(self, delta: torch.Tensor) -> torch.Tensor:
        """gin (N_in,): the transposed correlation of δ (C_out, P) with the current weights,
        exact, then sat(rhu(·, k_gin), gin) (numerics §9.2)."""
        G = self.w_operand()[:, : self.N].T @ delta  # (T, P)
        acc = torch.zeros(self.N_in + 1, dtype=torch.int64)
        acc.index_add_(0, self.idx.reshape(-1), G.reshape(-1))
        return self._clamp(rhu(acc[: self.N_in], self.k_gin), self.fgin, "gin")

    def gradient(self, sid: int, delta: torch.Tensor) -> torch.Tensor:
        """P (C_out, T + 1) = δ·Xᵀ: the exact sum over all output positions."""
        X = self.columns(self.stash[sid][0][None])[0]
        return delta @ X.T


def conv_engine(plan: Plan, st: Stage, module: nn.Module | None):
    """The engine of convolution stage ``st`` with the initial weights of ``module`` (the
    user's ``nn.Conv1d``/``nn.Conv2d`` named ``st.name``), quantised as numerics §2. Raises
    the golden model's ``GoldenError`` for a missing module or one of another shape."""
    g = st.conv
    assert g is not None
    want = nn.Conv1d if g.kind == "conv1d" else nn.Conv2d
    if not isinstance(module, want):
        raise GoldenError(
            f"model has no nn.{want.__name__} named {st.name!r} (plan stage {st.index})"
        )
    if tuple(module.weight.shape) != g.weight_shape or (module.bias is not None) != g.bias:
        raise GoldenError(
            f"layer {st.name!r} has weight {tuple(module.weight.shape)} (bias "
            f"{module.bias is not None}) but the plan says {g.weight_shape} (bias {g.bias})"
        )
    bias = module.bias.detach() if module.bias is not None else None
    return ConvEngine(plan, st, module.weight.detach(), bias)
