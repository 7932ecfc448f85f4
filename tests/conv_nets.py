"""Small seeded CNNs shared by the convolution tests (float reference, golden traces)."""

from __future__ import annotations

import torch
from torch import nn


def cnn(kind: str, pool: str, stride: int, padding: int, bias: bool) -> nn.Module:
    """Conv(2 → 4, k 3, ``stride``, ``padding``, ``bias``) → LeakyReLU(0.1) → ``pool`` 2 (``max``,
    ``avg`` or ``none``) → Conv(4 → 3, k 2, padding 1) → ReLU → Flatten → Linear(→ 4), seeded
    (11); inputs 2×10 (``conv1d``) or 2×6×7 (``conv2d``), set as ``input_shape``."""
    torch.manual_seed(11)
    if kind == "conv1d":
        conv, size = nn.Conv1d, (10,)
        pools = {"max": nn.MaxPool1d(2), "avg": nn.AvgPool1d(2), "none": nn.Identity()}
    else:
        conv, size = nn.Conv2d, (6, 7)
        pools = {"max": nn.MaxPool2d(2), "avg": nn.AvgPool2d(2), "none": nn.Identity()}
    m = nn.Sequential(
        conv(2, 4, 3, stride=stride, padding=padding, bias=bias),
        nn.LeakyReLU(0.1),
        pools[pool],
        conv(4, 3, 2, padding=1),
        nn.ReLU(),
    )
    with torch.no_grad():
        out = m(torch.zeros(1, 2, *size)).numel()
    m.append(nn.Flatten())
    m.append(nn.Linear(out, 4))
    m.input_shape = (2, *size)
    return m
