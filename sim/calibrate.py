"""Range calibration: run the float PB reference trainer and record every tensor's range.

The compiler picks fixed-point formats from ranges it is handed
(:func:`pipetrain.compiler.formats.formats_from_ranges`); the run that observes them is a
simulation step, so it lives here (docs/architecture.md §1, §4). :class:`Calibrator` is the
callable :func:`pipetrain.compiler.compile.compile_result` takes as ``calibrate``: it holds the
calibration data and, given the traced network, returns the ranges.

The float PB reference trainer (:class:`pipetrain.sim.reference.ReferenceTrainer`) trains a
copy of the network with the plan's schedule and hyperparameters and records max|value| of
every tensor (``x y d gin w u``) of every main stage. Auxiliary heads are not profiled: their
stages take the last main stage's formats. Source: *derived* (range profiling as in hls4ml's
``auto`` precision).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ..compiler.build import PlanError
from ..compiler.config import TrainConfig
from ..compiler.enums import Activation, unknown
from ..compiler.formats import HEADROOM, Ranges, formats_from_ranges
from ..compiler.frontend import trace
from ..compiler.ir import NetworkIR
from ..compiler.plan import QFormat
from ..data import Dataset
from .reference import ReferenceTrainer

__all__ = ["Calibrator", "calibrate_ranges", "auto_formats", "ir_sequential"]


def ir_sequential(model: nn.Module, ir: NetworkIR) -> nn.Sequential:
    """Return an ``nn.Sequential`` of the IR's layers sharing the model's Linear modules.

    The reference trainer then sees exactly the chain the front end accepted (custom
    container modules, Dropout and Flatten removed).
    """
    mods: list[nn.Module] = []
    for layer in ir.layers:
        mods.append(model.get_submodule(layer.name))
        if layer.activation == Activation.RELU:
            mods.append(nn.ReLU())
        elif layer.activation == Activation.LEAKY_RELU:
            mods.append(nn.LeakyReLU(layer.negative_slope))
        elif layer.activation == Activation.TANH:
            mods.append(nn.Tanh())
        elif layer.activation == Activation.SIGMOID:
            mods.append(nn.Sigmoid())
        elif layer.activation != Activation.IDENTITY:
            unknown(layer.activation, "activation")
    return nn.Sequential(*mods)


def calibrate_ranges(
    model: nn.Module,
    ir: NetworkIR,
    config: TrainConfig,
    x_sample: torch.Tensor,
    y_sample: torch.Tensor,
    samples: int | None = None,
) -> dict[int, dict[str, float]]:
    """Train a copy of ``model`` on ``x_sample`` float (n, N), ``y_sample`` int64 (n,) and
    return ``{stage: {tensor: max|value|}}``.

    Streams ``samples`` samples (default n·config.epochs, the whole training run) through the
    float reference trainer with ``config``'s schedule and hyperparameters, in
    :func:`pipetrain.data.epoch_order` order (full passes, then the first samples of the data
    for the rest). The model's parameters are not changed.

    Raises :class:`PlanError` for data of the wrong shape or fewer than one sample.
    """
    n = int(x_sample.shape[0])
    if x_sample.ndim != 2 or x_sample.shape[1] != ir.in_features:
        raise PlanError(
            f"calibration data has shape {tuple(x_sample.shape)} but the network takes "
            f"(samples, {ir.in_features})"
        )
    total = n * config.epochs if samples is None else int(samples)
    if total < 1:
        raise PlanError(f"calibration needs at least one sample, got {total}")
    # the trainer copies the parameters: the user's model is not modified
    trainer = ReferenceTrainer(ir_sequential(model, ir), config, profile=True)
    full, rest = divmod(total, n)
    if full:
        trainer.train(x_sample, y_sample, epochs=full)
    if rest:
        trainer.train(x_sample[:rest], y_sample[:rest], epochs=1)
    return {s: dict(v) for s, v in trainer.ranges.items()}


def auto_formats(
    model: nn.Module,
    config: TrainConfig,
    x_sample: torch.Tensor,
    y_sample: torch.Tensor,
    samples: int | None = None,
    overrides: Mapping[str, QFormat] | None = None,
    headroom: float = HEADROOM,
    ir: NetworkIR | None = None,
):
    """Calibrate on the data and pick the formats: :func:`calibrate_ranges` then
    :func:`~pipetrain.compiler.formats.formats_from_ranges` (a
    :class:`~pipetrain.compiler.build.FormatSpec` with ``ranges`` kept).

    Raises :class:`~pipetrain.compiler.frontend.CompileError` for a model the front end rejects
    and :class:`PlanError` for bad overrides or a diverged calibration run.
    """
    if ir is None:
        ir = trace(model, type(model).__name__, config.loss)
    ranges = calibrate_ranges(model, ir, config, x_sample, y_sample, samples)
    return formats_from_ranges(ranges, config, ir, overrides, headroom)


class Calibrator:
    """The ``calibrate`` callable of :func:`~pipetrain.compiler.compile.compile_result`.

    ``Calibrator(dataset, samples)(model, ir, config)`` checks that the data fits the network
    and returns :func:`calibrate_ranges` on its training set.

    Raises :class:`PlanError` naming the data and the model when the feature or class counts
    differ (fix: ``--data FILE.npz`` with matching data, or the data-sized model ``mlp``).
    """

    def __init__(self, dataset: Dataset, samples: int | None = None) -> None:
        self.dataset, self.samples = dataset, samples

    def __call__(self, model: nn.Module, ir: NetworkIR, config: TrainConfig) -> Ranges:
        ds = self.dataset
        if ds.features != ir.in_features:
            raise PlanError(
                f"data {ds.name!r} has {ds.features} features but model {ir.name!r} takes "
                f"{ir.in_features} inputs; give data of the model's width (--data FILE.npz; "
                "data= in the API) or use the data-sized model 'mlp'"
            )
        if ds.classes > ir.classes:
            raise PlanError(
                f"data {ds.name!r} has {ds.classes} classes but model {ir.name!r} has "
                f"{ir.classes} outputs; give the model {ds.classes} outputs or use 'mlp'"
            )
        return calibrate_ranges(model, ir, config, ds.x_train, ds.y_train, self.samples)
