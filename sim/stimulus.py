"""Stimulus for RTL runs: the first samples of a data set, quantised to the plan's input format.

Used by ``pipetrain sim``, the RTL tests and the benchmarks, so that every RTL run streams the
samples the golden model and the trainers see (docs/architecture.md §5).
"""

from __future__ import annotations

import torch

from ..compiler.plan import Plan
from ..data import DataError, epoch_order, load_data
from .fixed import quantise

__all__ = ["plan_samples"]


def plan_samples(plan: Plan, n: int, data: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(x_int (n, N) int64, labels (n,))``: the first n training samples in
    :func:`~pipetrain.data.epoch_order` of ``seed`` (epochs repeat when n exceeds the set).

    ``data``: ``digits`` or an ``.npz`` path (:func:`pipetrain.data.load_data`). Inputs are
    quantised to stage 1's ``x`` format (docs/numerics.md §3, round half even, saturating).
    A CNN's samples ((C, L) / (C, H, W), ``plan.input_shape``) are streamed flat in C order,
    N = C·L or C·H·W values (docs/numerics.md §9), as the data set stores them.
    Raises :class:`~pipetrain.data.DataError` when the data's feature count differs from the
    plan's input size, or its sample shape from a CNN's input shape (naming both).
    """
    ds = load_data(data)
    wrong = ds.mismatch(plan.input_shape, plan.name)
    if wrong and (len(plan.input_shape) > 1 or len(ds.shape) > 1):
        raise DataError(wrong)
    if ds.features != plan.in_features:
        raise DataError(
            f"data {data!r} has {ds.features} features but the model takes {plan.in_features}; "
            "give --data a file of the model's width"
        )
    total = len(ds.x_train)
    order = torch.cat([epoch_order(total, seed, e) for e in range(-(-n // total))])[:n]
    x = quantise(ds.x_train[order], plan.stages[0].formats.x)[0]
    return x, ds.y_train[order]
