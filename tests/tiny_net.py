"""The tiny 3-stage net shared by the golden-model and HDL tests (padding lanes, LeakyReLU)."""

import warnings

import torch
from pipetrain.compiler.build import build_plan
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.ir import LayerIR, NetworkIR
from torch import nn


def tiny(loss="cross_entropy", lanes=(2, 3, 2), const_bits=18, single_port=(), **cfg):
    """6 → 5 (LeakyReLU) → 4 (ReLU) → 3; stage 2 has 3 lanes over 4 rows (2 padding slots).
    ``const_bits``/``single_port``: :func:`build_plan`'s board options (few-bit constants,
    single-port SPRAM weight memories)."""
    torch.manual_seed(1)
    model = nn.Sequential(
        nn.Linear(6, 5), nn.LeakyReLU(0.1), nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3)
    )
    layers = (
        LayerIR("0", 6, 5, "leaky_relu", 0.1),
        LayerIR("2", 5, 4, "relu"),
        LayerIR("4", 4, 3),
    )
    config = TrainConfig(loss=loss, **({"lr": 0.1, "weight_decay": 0.01} | cfg))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the deliberate padding lanes raise a PlanWarning
        plan = build_plan(
            NetworkIR("tiny", 6, layers, loss),
            config,
            lanes=list(lanes),
            const_bits=const_bits,
            single_port=single_port,
        )
    return plan, model, config


def tiny_stream(n=30, seed=3):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 6, generator=gen) * 4 - 1
    y = torch.randint(0, 3, (n,), generator=gen)
    train = [i % 7 != 3 for i in range(n)]  # inference samples mixed in
    return x, y, train
