"""Float arithmetic of a convolution stage for the reference trainers (docs/numerics.md §9).

:class:`ConvStage` is the :class:`~pipetrain.sim.reference.ReferenceTrainer`'s stage for a
``Conv1d``/``Conv2d`` layer with its activation and pooling (MaxPool or AvgPool, kernel =
stride): the same interface as the Linear stage (forward, δ, input gradient, update), so the
version-queue trainer and the tick-by-tick simulator (:mod:`pipetrain.sim.reference_tick`) run
it unchanged — PB delays, SC, LWP and both schedules exactly as for Linear. The weights are the
(C_out, T + 1) matrix of ``weight.view(C_out, -1)`` with the bias column last; the convolution
is written as a matrix product with the im2col matrix X (T + 1, P) of the input (``F.unfold``,
zero padding; its last row is the bias input 1, or 0 without bias), so

* forward: z = W·X (C_out, P), a = pool(act(z)) (C_out, P′), flattened channel-major;
* backward: the error g (C_out·P′) at the stage output goes back through the pooling (MaxPool:
  to the window's argmax, recomputed from the stashed z; AvgPool: g / window to each value),
  δ = act′(z) ⊙ that; the input gradient is the transposed correlation
  fold(W[:, :T]ᵀ·δ) (C_in·Πin_size); the weight gradient P = δ·Xᵀ (C_out, T + 1) sums the
  products of all output positions, and the stage applies ONE momentum/SC update with it.

Source: PyTorch's convolution and pooling definitions (the gradients are their exact
derivatives); the stage form is *derived* from the Linear stage (docs/architecture.md §2).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from ..compiler.conv import ConvGeometry
from ..compiler.enums import unknown

__all__ = ["ConvStage", "conv_columns", "one_thread"]


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one intra-op thread inside the block (restored after): a batch-1
    convolution's tensors are just large enough for torch to split them across threads, which
    costs more than it saves (measured: 430 → 3.5 ms per cnn-digits sample on a loaded 2-core
    machine)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _as_2d(g: ConvGeometry) -> tuple[tuple[int, ...], ...]:
    """(in_size, kernel, stride, padding, out_size, pool_size) as 2-D pairs (1-D: height 1)."""
    t = (g.in_size, g.kernel, g.stride, g.padding, g.out_size, g.pool_size)
    if g.dims == 2:
        return t
    return tuple((0 if k == 3 else 1, v[0]) for k, v in enumerate(t))  # no padding in height


def conv_columns(g: ConvGeometry, x: torch.Tensor, one: float) -> torch.Tensor:
    """The im2col matrix of input samples x (n, C_in·Πin_size): (n, T + 1, P), rows in tap
    order (channel, kernel row, kernel column), the last row ``one`` (the bias input)."""
    size, kernel, stride, padding, _, _ = _as_2d(g)
    cols = F.unfold(
        x.reshape(x.shape[0], g.in_channels, *size), kernel, padding=padding, stride=stride
    )
    ones = torch.full((x.shape[0], 1, cols.shape[2]), one, dtype=x.dtype)
    return torch.cat((cols, ones), 1)


class ConvStage:
    """Mixin of the convolution arithmetic over the reference trainer's stage (its ``rule``,
    ``spec``, ``queue``, ``one`` and ``forward_weights`` are the Linear stage's).

    Members
    -------
    conv: the stage's :class:`~pipetrain.compiler.conv.ConvGeometry`.
    cols: weight columns without the bias, T.
    """

    conv: ConvGeometry

    def setup_conv(self, conv: ConvGeometry) -> None:
        """Bind the geometry (called by the stage's constructor)."""
        self.conv = conv
        self.cols = conv.taps

    # -- the activation and the pooling -------------------------------------------------------
    def _act(self, z: torch.Tensor) -> torch.Tensor:
        act = self.spec.activation
        if act == "relu":
            return torch.relu(z)
        if act == "leaky_relu":
            return F.leaky_relu(z, self.spec.negative_slope)
        if act == "identity":
            return z
        unknown(act, "activation after a convolution")

    def _pool(self, a: torch.Tensor) -> torch.Tensor:
        """a (n, C_out, P) → (n, C_out·P′): the pooling of the stage's output path."""
        g = self.conv
        _, _, _, _, out, win = _as_2d(g)
        if g.pool == "none":
            return a.reshape(a.shape[0], -1)
        m = a.reshape(a.shape[0], g.out_channels, *out)
        if g.pool == "max":
            p = F.max_pool2d(m, win, win)
        else:
            p = F.avg_pool2d(m, win, win)
        return p.reshape(a.shape[0], -1)

    def _unpool(self, gout: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The error at the pooling's input (C_out, P) from the error gout (C_out·P′) at its
        output and the stashed pre-activation z (C_out·P)."""
        g = self.conv
        _, _, _, _, out, win = _as_2d(g)
        if g.pool == "none":
            return gout.reshape(g.out_channels, g.positions)
        a = self._act(z.reshape(1, g.out_channels, *out))
        if g.pool == "max":
            _, idx = F.max_pool2d(a, win, win, return_indices=True)
            full = torch.zeros(1, g.out_channels, g.positions, dtype=gout.dtype)
            full.scatter_(
                2, idx.reshape(1, g.out_channels, -1), gout.reshape(1, g.out_channels, -1)
            )
            return full.reshape(g.out_channels, g.positions)
        ph, pw = g.pooled_size if g.dims == 2 else (1, g.pooled_size[0])
        e = gout.reshape(g.out_channels, ph, 1, pw, 1) / g.window
        e = e.expand(g.out_channels, ph, win[0], pw, win[1]).reshape(
            g.out_channels, ph * win[0], pw * win[1]
        )
        full = torch.zeros(g.out_channels, *out, dtype=gout.dtype)
        full[:, : ph * win[0], : pw * win[1]] = e
        return full.reshape(g.out_channels, g.positions)

    # -- the stage interface ----------------------------------------------------------------
    def forward(
        self, w: torch.Tensor, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return (X (T+1, P), z (C_out·P,), a (C_out·P′,)) of input ``x`` (C_in·Πin_size,)."""
        cols = conv_columns(self.conv, x[None], float(self.one[0]))[0]
        z = w @ cols
        a = self._pool(self._act(z)[None])[0]
        return cols, z.reshape(-1), a

    def delta(self, g: torch.Tensor, z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Return δ (C_out·P,) = act′(z) ⊙ unpool(g) from the error ``g`` (C_out·P′,)."""
        e = self._unpool(g, z).reshape(-1)
        act = self.spec.activation
        if act == "relu":
            return e * (z > 0)
        if act == "leaky_relu":
            return torch.where(z > 0, e, e * self.spec.negative_slope)
        if act == "identity":
            return e
        unknown(act, "activation after a convolution")

    def input_grad(self, w: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """Return ∂L/∂x (C_in·Πin_size,): the transposed correlation fold(W[:, :T]ᵀ·δ)."""
        g = self.conv
        size, kernel, stride, padding, _, _ = _as_2d(g)
        cols = w[:, : g.taps].t() @ d.reshape(g.out_channels, g.positions)
        x = F.fold(cols[None], size, kernel, padding=padding, stride=stride)
        return x.reshape(-1)

    def gradient(self, x_aug: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """P (C_out, T + 1) = δ·Xᵀ: the weight gradient summed over all output positions."""
        return d.reshape(self.conv.out_channels, -1) @ x_aug.t()

    def update(self, ver, x_aug: torch.Tensor, d: torch.Tensor):  # ver: reference.Version
        """The Linear stage's momentum (and SC) update with P = :meth:`gradient`: one update
        per weight per sample, whatever the number of positions; returns the new version."""
        P = self.gradient(x_aug, d)
        return self.step(ver, lambda t, a, b=1.0: torch.add(t * b, P, alpha=a))  # _Stage.step

    def predict_batch(self, w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """The stage's output (n, C_out·P′) for inputs h (n, C_in·Πin_size) with weights w."""
        cols = conv_columns(self.conv, h, float(self.one[0]))
        return self._pool(self._act(w @ cols))
