"""Small seeded CNNs shared by the convolution tests (float reference, golden traces)."""

from __future__ import annotations

import numpy as np
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


#: A user's Conv1d model file (issue 16's done-when): a global MaxPool over the 16 positions.
BUMP_CNN = (
    "from torch import nn\n"
    "model = nn.Sequential(nn.Conv1d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool1d(16),\n"
    "                      nn.Flatten(), nn.Linear(4, 2))\n"
    "model.input_shape = (1, 16)\n"
    "config = {'lr': 0.05}\n"
)


def bump_data(path, n_train=64, n_test=32, length=16, seed=0):
    """(n, 1, L) sequences: class 1 has a +1 bump of width 3 at a random place, class 0 noise
    only (σ = 0.2): a max over positions separates them (what Conv1d + MaxPool can learn)."""
    gen = np.random.default_rng(seed)
    n = n_train + n_test
    x = gen.normal(0.0, 0.2, (n, 1, length)).astype(np.float32)
    y = np.arange(n) % 2
    for i in np.nonzero(y)[0]:
        k = gen.integers(0, length - 3)
        x[i, 0, k : k + 3] += 1.0
    np.savez(path, x_train=x[:n_train], y_train=y[:n_train], x_test=x[n_train:],
             y_test=y[n_train:])  # fmt: skip
