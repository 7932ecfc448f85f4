"""Initial weights of the auxiliary-head stages (local and interlocking learning), shared by the
float reference trainer and the golden model so both start their heads from the same values
(docs/architecture.md §2.4)."""

from __future__ import annotations

import math

import torch

__all__ = ["seeded_linear", "head_initial_weights"]


def seeded_linear(
    n_in: int, n_out: int, gen: torch.Generator, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``nn.Linear``'s default initialisation, U(−1/√N, 1/√N) for weights and bias, drawn from
    ``gen`` in float64: an (n_out, n_in + 1) tensor, bias column last, in ``dtype``.
    Source: PyTorch ``nn.Linear.reset_parameters`` (the bound 1/√fan_in)."""
    bound = 1.0 / math.sqrt(n_in)
    w = torch.rand(n_out, n_in + 1, generator=gen, dtype=torch.float64) * 2.0 - 1.0
    return (w * bound).to(dtype)


def head_initial_weights(
    shapes: list[tuple[int, int]], seed: int, dtype: torch.dtype = torch.float32
) -> list[torch.Tensor]:
    """The initial weights (M, N+1), bias column last, of the auxiliary-head stages of
    ``shapes`` ((N, M) per head stage, in stage order): :func:`seeded_linear` from one
    ``torch.Generator`` seeded ``seed·1000003 + 7919`` (docs/architecture.md §2.4) — the draws
    of the float reference trainer, which the golden model's heads start from too. Source:
    *derived* (a generator of its own leaves the global RNG alone)."""
    gen = torch.Generator().manual_seed(seed * 1000003 + 7919)
    return [seeded_linear(n_in, n_out, gen, dtype) for n_in, n_out in shapes]
