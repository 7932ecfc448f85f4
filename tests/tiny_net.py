"""The tiny 3-stage net shared by the golden-model and HDL tests (padding lanes, LeakyReLU)."""

import warnings

import torch
from pipetrain.compiler.build import build_plan
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.ir import LayerIR, NetworkIR
from torch import nn

#: The activation modules of the tiny net's two hidden stages, by plan name.
_MODULES = {
    "leaky_relu": lambda: nn.LeakyReLU(0.1),
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "identity": nn.Identity,
}


def tiny(
    loss="cross_entropy",
    lanes=(2, 3, 2),
    const_bits=18,
    single_port=(),
    acts=("leaky_relu", "relu"),
    operand_registers=0,
    momentum_in_logic=False,
    col_lanes=None,
    **cfg,
):
    """6 → 5 (LeakyReLU) → 4 (ReLU) → 3; stage 2 has 3 lanes over 4 rows (2 padding slots).
    ``const_bits``/``single_port``: :func:`build_plan`'s board options (few-bit constants,
    single-port SPRAM weight memories), ``operand_registers`` (the ECP5's: every product one
    stage later), ``momentum_in_logic`` (m·u in shifts and adders), ``col_lanes`` (k per
    stage: stage 1's 7 columns over k column lanes, padding columns for k ∤ 7). ``acts``: the
    two hidden activations (``tanh``, ``sigmoid``, … instead of LeakyReLU, ReLU)."""
    torch.manual_seed(1)
    model = nn.Sequential(
        nn.Linear(6, 5), _MODULES[acts[0]](), nn.Linear(5, 4), _MODULES[acts[1]](), nn.Linear(4, 3)
    )
    slope = (0.1 if acts[0] == "leaky_relu" else 0.0, 0.1 if acts[1] == "leaky_relu" else 0.0)
    layers = (
        LayerIR("0", 6, 5, acts[0], slope[0]),
        LayerIR("2", 5, 4, acts[1], slope[1]),
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
            operand_registers=operand_registers,
            momentum_in_logic=momentum_in_logic,
            col_lanes=col_lanes,
        )
    return plan, model, config


def tiny_stream(n=30, seed=3):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 6, generator=gen) * 4 - 1
    y = torch.randint(0, 3, (n,), generator=gen)
    train = [i % 7 != 3 for i in range(n)]  # inference samples mixed in
    return x, y, train
