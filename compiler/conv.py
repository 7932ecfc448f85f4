"""Geometry of a convolution stage: ``Conv1d``/``Conv2d`` with its activation and pooling.

A convolution stage is one PB stage (docs/architecture.md §2.1) whose weight layer is a
convolution: its weights are a (C_out, T + 1) matrix — T = C_in·Πkernel taps in the order of
``weight.view(C_out, -1)`` (channel, then kernel row, then kernel column), the bias column last,
as for Linear — applied at every output position; the activation and the pooling (MaxPool or
AvgPool, kernel = stride) are part of the stage's output path (docs/numerics.md §9).
:class:`ConvGeometry` is the plan's record of it (``Stage.conv``); the functions here derive
the sizes the plan builder, the plan reader, the golden model and the reference trainer share.
Imports nothing of the compiler, so the plan (``compiler/plan.py``) can hold it.

Source: the convolution and pooling definitions of PyTorch (``nn.Conv1d``/``nn.Conv2d`` with
zero padding, ``nn.MaxPool*``/``nn.AvgPool*`` with ``ceil_mode=False``); the cycle and memory
counts are *derived* (lanes over output channels, as the Linear stage's lanes over rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "CONV_KINDS",
    "CONV_SEND_SLACK",
    "CONV_UPDATE_GAP",
    "POOL_KINDS",
    "POOL_SCALE_FRAC",
    "ConvGeometry",
    "conv_cycles",
    "conv_gap",
    "conv_geometry",
    "p_sum_bits",
    "pool_scale",
    "stash_words",
]

#: ``ConvGeometry.kind`` values and their spatial dimensions.
CONV_KINDS = {"conv1d": 1, "conv2d": 2}
#: ``ConvGeometry.pool`` values.
POOL_KINDS = ("none", "max", "avg")
#: Slot cycles without a slot between a convolution pass's MAC and update phases (at least): the
#: update unit's write-back stage (≤ 5) must see no MAC slot once the update phase begins
#: (``hdl/conv.py``; *derived*).
CONV_UPDATE_GAP = 5
#: Cycles the input gradient's send needs beyond one a value (``hdl/conv_mac.py``: it starts 4
#: cycles after the last MAC slot issues and gives its last value 2 cycles after the last read).
CONV_SEND_SLACK = 6
#: Fraction bits of the AvgPool scale 1/window when the window is not a power of two.
POOL_SCALE_FRAC = 16


def pool_scale(window: int) -> tuple[int, int]:
    """``(scale, shift)`` of the AvgPool mean over ``window`` values: mean ≈ rhu(sum·scale,
    shift) (docs/numerics.md §9.3). A power-of-two window is exact: ``(1, log2 window)``;
    otherwise ``(round(2^16 / window), 16)``. Source: *derived*."""
    if window < 1:
        raise ValueError(f"a pooling window has at least one value, got {window}")
    if window & (window - 1) == 0:
        return 1, window.bit_length() - 1
    return int(round(2**POOL_SCALE_FRAC / window)), POOL_SCALE_FRAC


@dataclass(frozen=True)
class ConvGeometry:
    """Every size of one convolution stage (``Stage.conv``; the IR's ``LayerIR.conv``).

    Spatial tuples have one entry per dimension: (L,) for ``conv1d``, (H, W) for ``conv2d``.

    Members
    -------
    kind: ``conv1d`` or ``conv2d``.
    in_channels, out_channels: C_in, C_out.
    in_size: the input feature map's spatial size (values per channel).
    kernel, stride, padding: the convolution's (stride 1 or 2, zero padding).
    bias: whether the layer has a bias (a bias-free layer keeps its bias column at 0).
    out_size: the convolution's output size, ⌊(in + 2·padding − kernel) / stride⌋ + 1.
    pool: ``none``, ``max`` or ``avg``.
    pool_size: the pooling window (= its stride; all 1 for ``none``).
    pooled_size: the stage's output size, ⌊out_size / pool_size⌋ (positions beyond the last
        whole window are dropped, as PyTorch's ``ceil_mode=False``).
    pool_scale, pool_shift: AvgPool's mean ≈ rhu(sum·pool_scale, pool_shift)
        (:func:`pool_scale`; 1, 0 otherwise).
    """

    kind: str
    in_channels: int
    out_channels: int
    in_size: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    bias: bool
    out_size: tuple[int, ...]
    pool: str
    pool_size: tuple[int, ...]
    pooled_size: tuple[int, ...]
    pool_scale: int
    pool_shift: int

    @property
    def dims(self) -> int:
        """Spatial dimensions: 1 or 2."""
        return CONV_KINDS[self.kind]

    @property
    def taps(self) -> int:
        """T = C_in·Πkernel: weight columns without the bias (the forward sum's terms − 1)."""
        return self.in_channels * math.prod(self.kernel)

    @property
    def positions(self) -> int:
        """Output positions of the convolution, Πout_size."""
        return math.prod(self.out_size)

    @property
    def pooled_positions(self) -> int:
        """Output positions after pooling, Πpooled_size."""
        return math.prod(self.pooled_size)

    @property
    def window(self) -> int:
        """Values per pooling window, Πpool_size (1 without pooling)."""
        return math.prod(self.pool_size)

    @property
    def in_values(self) -> int:
        """Values of one input sample, C_in·Πin_size (the stage's ``in_features``)."""
        return self.in_channels * math.prod(self.in_size)

    @property
    def out_values(self) -> int:
        """Values of one output sample, C_out·Πpooled_size (the stage's ``out_features``)."""
        return self.out_channels * self.pooled_positions

    @property
    def in_shape(self) -> tuple[int, ...]:
        """(C_in, *in_size): one input sample as PyTorch lays it out (without the batch)."""
        return (self.in_channels, *self.in_size)

    @property
    def weight_shape(self) -> tuple[int, ...]:
        """(C_out, C_in, *kernel): the shape of the layer's ``weight``."""
        return (self.out_channels, self.in_channels, *self.kernel)


def conv_geometry(
    kind: str,
    in_channels: int,
    out_channels: int,
    in_size: tuple[int, ...],
    kernel: tuple[int, ...],
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    bias: bool,
    pool: str = "none",
    pool_size: tuple[int, ...] | None = None,
) -> ConvGeometry:
    """Return the :class:`ConvGeometry` of a convolution (and pooling) on inputs of
    ``in_size``; the derived fields follow PyTorch's size rules.

    Raises ``ValueError`` naming the size for an unknown kind or pool, tuples of the wrong
    length, or an output with no position (the input is smaller than the kernel, or than the
    pooling window)."""
    if kind not in CONV_KINDS:
        raise ValueError(f"convolution kind {kind!r} is not one of {', '.join(CONV_KINDS)}")
    if pool not in POOL_KINDS:
        raise ValueError(f"pooling {pool!r} is not one of {', '.join(POOL_KINDS)}")
    n = CONV_KINDS[kind]
    pool_size = pool_size if pool_size is not None and pool != "none" else (1,) * n
    for name, t in (
        ("in_size", in_size),
        ("kernel", kernel),
        ("stride", stride),
        ("padding", padding),
        ("pool_size", pool_size),
    ):
        if len(t) != n:
            raise ValueError(f"{kind}: {name} {t} needs {n} entries")
    out = tuple(
        (i + 2 * p - k) // s + 1
        for i, k, s, p in zip(in_size, kernel, stride, padding, strict=True)
    )
    if min(out) < 1:
        raise ValueError(
            f"{kind}: an input of size {tuple(in_size)} is smaller than the kernel {tuple(kernel)}"
            f" with padding {tuple(padding)}"
        )
    pooled = tuple(o // k for o, k in zip(out, pool_size, strict=True))
    if min(pooled) < 1:
        raise ValueError(
            f"{kind}: the output of size {out} is smaller than the pooling window {pool_size}"
        )
    window = math.prod(pool_size)
    scale, shift = pool_scale(window) if pool == "avg" else (1, 0)
    return ConvGeometry(
        kind=kind,
        in_channels=in_channels,
        out_channels=out_channels,
        in_size=tuple(in_size),
        kernel=tuple(kernel),
        stride=tuple(stride),
        padding=tuple(padding),
        bias=bool(bias),
        out_size=out,
        pool=pool,
        pool_size=tuple(pool_size),
        pooled_size=pooled,
        pool_scale=scale,
        pool_shift=shift,
    )


def stash_words(in_values: int, x_lanes: int, writer: ConvGeometry | None) -> int:
    """Stash words per sample (``Stage.x_words``) of a stage whose input comes ``x_lanes``
    values a word from its writer: ⌈N / Lw⌉; after a convolution stage ``writer`` (its
    output word holds Lw channels of one pooled position: channel ``c`` of position ``q`` is
    word ``(c div Lw)·P′ + q``, lane ``c mod Lw``) ⌈C_out / Lw⌉·P′, which is ⌈N / Lw⌉ when Lw
    divides C_out. Source: *derived* (``hdl/conv.py``, ``hdl/stash.py``)."""
    if writer is None:
        return -(-in_values // x_lanes)
    return -(-writer.out_channels // x_lanes) * writer.pooled_positions


def p_sum_bits(conv: ConvGeometry | None) -> int:
    """Extra bits of a stage's weight gradient P over one product δ·x: 0 for Linear (None),
    ⌈log2 P⌉ for a convolution, whose P sums the products of its P output positions
    (docs/numerics.md §9.2; ``UpdateConstants.sum_bits`` counts them)."""
    if conv is None or conv.positions < 2:
        return 0
    return (conv.positions - 1).bit_length()


def conv_gap(g: ConvGeometry, groups: int) -> int:
    """Slot-free cycles between a convolution pass's MAC and update phases:
    :data:`CONV_UPDATE_GAP`, longer when the input gradient's ``N`` values (sent one a cycle
    after the MAC phase, while the gap and the update phase run) need more:
    ``max(CONV_UPDATE_GAP, N + CONV_SEND_SLACK − groups·(T + 1))`` (``groups`` = ⌈C_out / L⌉
    row groups). Source: *derived* (``hdl/conv.py``)."""
    return max(CONV_UPDATE_GAP, g.in_values + CONV_SEND_SLACK - groups * (g.taps + 1))


def conv_cycles(g: ConvGeometry, lanes: int) -> tuple[int, int]:
    """``(row_groups, cycles)`` of one tick of a convolution stage with ``lanes`` lanes over
    the output channels: ⌈C_out / L⌉ row groups, each running P·(T + 1) MAC slots (P = output
    positions; in each slot every lane makes the forward MAC of the forward item, and the
    input-gradient and weight-gradient MACs of the backward item — the transposed correlation
    and the gradient sum read the same δ and weight, ŵ and w come from one read), then one
    update slot per weight, T + 1 per group, after :func:`conv_gap` cycles without a slot:
    cycles = ⌈C_out / L⌉·(T + 1)·(P + 1) + conv_gap (the HDL's order, ``hdl/conv.py``: every
    group's MAC slots, the gap, every group's update slots). Source: *derived* (one MAC of each
    kind per lane and slot; the Linear stage's fused pass over the weights does not carry over:
    each weight is used at every position).
    """
    groups = -(-g.out_channels // lanes)
    return groups, groups * (g.taps + 1) * (g.positions + 1) + conv_gap(g, groups)
