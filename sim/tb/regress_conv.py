"""Convolution regression cases for the RTL check (issue 16): small CNNs over the conv design space.

A :class:`ConvCase` is a :class:`~pipetrain.sim.tb.regress.Case` whose network starts with
convolution stages (:class:`ConvLayer`: ``Conv1d`` for a (C, L) input, ``Conv2d`` for
(C, H, W); stride 1 or 2, padding 0 or 1, bias or not, then the case's activation — ``relu``,
``leaky_relu`` or none for ``identity`` — and MaxPool / AvgPool with kernel = stride or none),
then a flatten and Linear layers of ``sizes`` (their outputs; the first one's input is the
flattened feature map). :func:`~pipetrain.sim.tb.regress.prepare` compiles and streams it as
any case (samples of C·Πsize values, flat in C order, docs/numerics.md §9).

:data:`CONV_SMOKE_CASES` is the fixed set; :func:`random_conv_cases` draws more from its OWN
random stream (``random.Random(f"conv-{seed}")``), so the MLP cases of
:func:`~pipetrain.sim.tb.regress.random_cases` keep their values for every seed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .regress import Case

__all__ = [
    "CI_RANDOM_CONV_CASES",
    "CONV_SMOKE_CASES",
    "ConvCase",
    "ConvLayer",
    "random_conv_cases",
]

#: Random conv cases every default test run draws (tests/test_rtl_regression_conv.py), from the
#: run's seed. Bound: one Verilator build (~30–60 s) and a simulation of ≤ 16 samples of ticks
#: of ≤ ~3,000 cycles each (inputs ≤ 2×6×6, ≤ 4 output channels: (T + 1)·(2P + 1) per row
#: group, ``compiler/conv.py``), so one case adds about a minute on the 2-core machine.
CI_RANDOM_CONV_CASES = 1


@dataclass(frozen=True)
class ConvLayer:
    """One convolution stage of a :class:`ConvCase` (the kind follows the input's dimensions).

    Members
    -------
    out_channels: C_out.
    kernel: the (square) kernel size.
    stride: 1 or 2. padding: zero padding, 0 or 1. bias: whether the layer has a bias.
    pool: ``none``, ``max`` or ``avg`` (kernel = stride = ``pool_size``, after the activation).
    """

    out_channels: int
    kernel: int = 3
    stride: int = 1
    padding: int = 0
    bias: bool = True
    pool: str = "none"
    pool_size: int = 2


@dataclass(frozen=True)
class ConvCase(Case):
    """A :class:`~pipetrain.sim.tb.regress.Case` with convolution stages first (module
    docstring): ``input_shape`` (C, L) or (C, H, W), ``convs`` its conv stages, ``sizes`` the
    Linear layers' outputs after the flatten (the last one the classes), ``lanes`` one per
    stage (conv stages first; lanes over output channels)."""

    input_shape: tuple[int, ...] = (1, 8)
    convs: tuple[ConvLayer, ...] = ()

    @property
    def depth(self) -> int:
        """Weight layers (stages): the convolutions and the Linear layers."""
        return len(self.convs) + len(self.sizes)

    @property
    def input_values(self) -> int:
        """Values of one input sample, C·Πsize (streamed flat in C order)."""
        return math.prod(self.input_shape)

    def model(self) -> nn.Module:
        """The seeded network: each conv, the case's activation, its pooling; flatten; the
        Linear layers (the activation between them); ``input_shape`` set for the front end."""
        torch.manual_seed(self.seed)
        dims = len(self.input_shape) - 1
        conv_t = nn.Conv1d if dims == 1 else nn.Conv2d
        pools = {"max": (nn.MaxPool1d, nn.MaxPool2d), "avg": (nn.AvgPool1d, nn.AvgPool2d)}
        layers: list[nn.Module] = []
        channels = self.input_shape[0]
        for c in self.convs:
            layers.append(
                conv_t(channels, c.out_channels, c.kernel, c.stride, c.padding, bias=c.bias)
            )
            layers += _activation(self.activation)
            if c.pool != "none":
                layers.append(pools[c.pool][dims - 1](c.pool_size))
            channels = c.out_channels
        layers.append(nn.Flatten())
        with torch.no_grad():
            flat = nn.Sequential(*layers)(torch.zeros(1, *self.input_shape)).shape[1]
        for k, out in enumerate(self.sizes):
            layers.append(nn.Linear(flat, out))
            if k < len(self.sizes) - 1:
                layers += _activation(self.activation)
            flat = out
        model = nn.Sequential(*layers)
        model.input_shape = tuple(self.input_shape)
        return model


def _activation(name: str) -> list[nn.Module]:
    if name == "relu":
        return [nn.ReLU()]
    if name == "leaky_relu":
        return [nn.LeakyReLU(0.125)]
    return []  # identity


def _cc(name: str, shape: tuple[int, ...], convs: tuple[ConvLayer, ...], **kw: Any) -> ConvCase:
    kw.setdefault("sizes", (3,))
    kw.setdefault("lanes", tuple(min(2, c.out_channels) for c in convs) + (1,) * len(kw["sizes"]))
    return ConvCase(name, input_shape=shape, convs=convs, **kw)


#: The fixed conv regression: Conv1d and Conv2d, stride 1 and 2, padding 0 and 1, with and
#: without bias, MaxPool, AvgPool (a window of 2, a shift, and of 3, the scale multiply) and
#: none, both schedules, every mitigation and both LWP forms, both roundings, a two-conv chain
#: (the input gradient's transposed correlation) and a narrow format set (saturations).
CONV_SMOKE_CASES: tuple[ConvCase, ...] = (
    _cc("c2d-max-s1p1", (1, 6, 6), (ConvLayer(3, padding=1, pool="max"),), samples=12),
    _cc(
        "c1d-avg-s2p0-nobias-seq",
        (2, 11),
        (ConvLayer(3, stride=2, bias=False, pool="avg"),),
        schedule="sequential",
        rounding="nearest_even",
        samples=8,
        seed=1,
    ),
    _cc(
        "c2d-chain-sc-lwp",
        (2, 6, 6),
        (ConvLayer(3, padding=1, pool="max"), ConvLayer(4, kernel=2, stride=2, bias=False)),
        mitigation="sc+lwp",
        activation="leaky_relu",
        samples=12,
        seed=2,
    ),
    _cc(
        "c1d-avg3-lwp-w-narrow",
        (1, 12),
        (ConvLayer(2, padding=1, pool="avg", pool_size=3),),
        sizes=(4, 3),
        mitigation="lwp",
        lwp_form="w",
        formats="narrow",
        lr=0.3,
        samples=12,
        seed=3,
    ),
)


def random_conv_cases(n: int, seed: int = 1) -> list[ConvCase]:
    """Draw ``n`` random conv cases named ``conv<seed>-<k>`` from their own stream (the same
    ``(n, seed)`` draws the same cases; the MLP draws of ``random_cases`` do not move): one or
    two conv stages (Conv1d on 1–2×8–12 or Conv2d on 1–2×5–7×5–7, 2–4 output channels, kernel
    2–3, stride 1/2, padding 0/1, bias or not, max/avg/no pooling where the map is ≥ 2),
    one or two Linear layers (hidden ones ≥ 4 wide; one row group on fewer than 4 inputs, the
    Linear stage's limit), random lanes, schedule, mitigation (and LWP form), rounding,
    loss, activation, formats (``default`` or ``narrow``; weight decay with ``narrow``: see
    the comment), momentum and learning rate. The pooling is dropped where it
    would leave no output position; a second conv only where the first one's output still
    holds its kernel."""
    rng = random.Random(f"conv-{seed}")
    out = []
    for k in range(n):
        dims = rng.choice([1, 2])
        cin = rng.randint(1, 2)
        size = (rng.randint(8, 12),) if dims == 1 else (rng.randint(5, 7), rng.randint(5, 7))
        convs, spatial = [], list(size)
        for _ in range(rng.choice([1, 1, 2])):
            kern = rng.randint(2, 3)
            stride, pad = rng.choice([1, 2]), rng.choice([0, 1])
            nxt = [(v + 2 * pad - kern) // stride + 1 for v in spatial]
            if min(nxt) < 1:
                break
            pool = rng.choice(["none", "max", "avg"]) if min(nxt) >= 2 else "none"
            if pool != "none":
                nxt = [v // 2 for v in nxt]
            convs.append(ConvLayer(rng.randint(2, 4), kern, stride, pad, rng.random() < 0.5, pool))
            spatial = nxt
        if not convs:  # a kernel larger than the padded input: the smallest valid stage
            convs.append(ConvLayer(2, 2, 1, 1))
        # a hidden Linear layer keeps ≥ 4 outputs: the Linear stage after it needs N ≥ 4 inputs
        # with several row groups (hdl/stage.py: the input-gradient accumulator would race)
        sizes = (rng.randint(3, 5),) if rng.random() < 0.5 else (rng.randint(4, 6), 3)
        flat = convs[-1].out_channels * math.prod(spatial)
        schedule = rng.choice(["pb", "pb", "sequential"])
        mitigation = "none" if schedule == "sequential" else rng.choice(
            ["none", "sc", "lwp", "sc+lwp"]
        )  # fmt: skip
        # no ``wide`` set and weight decay only with ``narrow``: a convolution's update sum has
        # ⌈log2 P⌉ more bits (compiler/conv.py:p_sum_bits), and with 28-bit weights (or the
        # small η·λ constant on the default set) it passes 62 bits — a PlanError
        fmt = rng.choice(["default", "narrow"])
        case = ConvCase(
            f"conv{seed}-{k}",
            sizes,
            tuple(rng.randint(1, c.out_channels) for c in convs)
            + tuple(
                rng.randint(1, m) if (flat if j == 0 else sizes[j - 1]) >= 4 else m
                for j, m in enumerate(sizes)
            ),  # fewer than 4 inputs: one row group (lanes = outputs), as above
            schedule=schedule,
            mitigation=mitigation,
            lwp_form=rng.choice(["v", "w"]) if "lwp" in mitigation else "v",
            rounding=rng.choice(["stochastic", "nearest_even"]),
            loss=rng.choice(["cross_entropy", "mse"]),
            activation=rng.choice(["relu", "leaky_relu", "identity"]),
            formats=fmt,
            momentum=rng.choice([0.0, 0.5, 0.9]),
            weight_decay=rng.choice([0.0, 0.001]) if fmt == "narrow" else 0.0,
            lr=rng.choice([0.01, 0.05, 0.3]),
            samples=rng.randint(2 * (len(convs) + len(sizes)) + 2, 16),
            seed=rng.randrange(1000),
            input_shape=(cin, *size),
            convs=tuple(convs),
        )
        out.append(case)
    return out
