"""Range calibration: run the float PB reference trainer and record every tensor's range.

The compiler picks fixed-point formats from ranges it is handed
(:func:`pipetrain.compiler.formats.formats_from_ranges`); the run that observes them is a
simulation step, so it lives here (docs/architecture.md §1, §4). :class:`Calibrator` is the
callable :func:`pipetrain.compiler.compile.compile_result` takes as ``calibrate``: it holds the
calibration data and, given the traced network, returns the ranges.

The float PB reference trainer (:class:`pipetrain.sim.reference.ReferenceTrainer`) trains a
copy of the network with the plan's schedule and hyperparameters and records max|value| of
every tensor (``x y d gin w u``) of every stage, auxiliary heads included (their formats come
from their own ranges). Source: *derived* (range profiling as in hls4ml's
``auto`` precision).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping

import torch
from torch import nn

from ..compiler.build import EXP_LUT_FRAC, PlanError, build_plan
from ..compiler.config import TrainConfig
from ..compiler.enums import Activation, unknown
from ..compiler.formats import DATA_BITS, HEADROOM, Ranges, format_for_range, formats_from_ranges
from ..compiler.frontend import trace
from ..compiler.ir import NetworkIR
from ..compiler.plan import QFormat
from ..data import Dataset
from .golden import GoldenModel
from .reference import ReferenceTrainer

__all__ = [
    "Calibrator",
    "InputScaleError",
    "calibrate_ranges",
    "golden_ranges",
    "merge_ranges",
    "auto_formats",
    "input_scale_note",
    "ir_sequential",
    "GOLDEN_PASSES",
    "INPUT_SCALE_LIMIT",
]

#: The FormatSpec fields :func:`golden_ranges` compares between passes (main and heads).
_FORMAT_FIELDS = ("x", "d", "w", "u", "logits", "head_y", "head_d", "head_w", "head_u")
#: Golden passes of the calibration (:func:`golden_ranges`) after the float run, at most.
GOLDEN_PASSES = 2
#: Inputs whose largest per-feature RMS exceeds this are "far from unit scale": the default
#: hyperparameters (lr 0.002, momentum 0.9 at batch 1) were chosen on inputs in [0, 1]
#: (digits), and on the benchmark's ``unscaled`` set (RMS 4.9) the float reference itself
#: loses 18 pp to the standardised set (derived; benchmarks/formats_check.py).
INPUT_SCALE_LIMIT = 4.0


class InputScaleError(PlanError):
    """The calibration run on inputs far from unit scale needs logits no 16-bit format holds
    with the exp LUT's fraction bits; the fix is to standardise the inputs."""


def input_scale_note(x: torch.Tensor) -> str | None:
    """A one-line note when the training inputs x float (n, N) are far from unit scale (a
    feature's RMS above :data:`INPUT_SCALE_LIMIT`), naming that feature and the fix
    (standardise per feature over the training set); None otherwise."""
    if x.numel() == 0:
        return None
    xd = x.detach().to(torch.float64)
    rms = xd.square().mean(dim=0).sqrt()
    k = int(rms.argmax())
    if float(rms[k]) <= INPUT_SCALE_LIMIT:
        return None
    mean, std = float(xd[:, k].mean()), float(xd[:, k].std())
    return (
        f"inputs are far from unit scale (feature {k}: RMS {float(rms[k]):.3g}, mean "
        f"{mean:.3g}, std {std:.3g}; limit {INPUT_SCALE_LIMIT:g}); training and the formats "
        "follow these values — standardise each feature over the training set, x = (x - "
        "mean) / std, before saving the .npz"
    )


def ir_sequential(model: nn.Module, ir: NetworkIR) -> nn.Sequential:
    """Return an ``nn.Sequential`` of the IR's layers sharing the model's weight modules.

    The reference trainer then sees exactly the chain the front end accepted (custom
    container modules, Dropout and Flatten removed); a convolution stage's pooling follows
    its activation, one ``nn.Flatten`` precedes the first Linear after the convolutions, and
    the Sequential carries ``input_shape`` (the IR's) for the reference's geometry.
    """
    mods: list[nn.Module] = []
    for k, layer in enumerate(ir.layers):
        if k and layer.conv is None and ir.layers[k - 1].conv is not None:
            mods.append(nn.Flatten())  # the convolutions' feature maps → the first Linear
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
        g = layer.conv
        if g is not None and g.pool != "none":  # the stage's pooling (kernel = stride)
            two = g.dims == 2
            pool = {"max": (nn.MaxPool1d, nn.MaxPool2d), "avg": (nn.AvgPool1d, nn.AvgPool2d)}
            mods.append(pool[g.pool][two](g.pool_size if two else g.pool_size[0]))
    seq = nn.Sequential(*mods)
    if ir.layers[0].conv is not None:
        seq.input_shape = ir.input_shape  # the front end reads the geometry from it
    return seq


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
    _stream(trainer, x_sample, y_sample, total)
    return {s: dict(v) for s, v in trainer.ranges.items()}


def merge_ranges(a: Ranges, b: Ranges) -> dict[int, dict[str, float]]:
    """Per stage and tensor the larger of two range records (tensors of either)."""
    out = {int(s): {k: float(v) for k, v in t.items()} for s, t in a.items()}
    for s, t in b.items():
        row = out.setdefault(int(s), {})
        for k, v in t.items():
            row[k] = max(row.get(k, 0.0), float(v))
    return out


def _stream(trainer, x: torch.Tensor, y: torch.Tensor, total: int) -> None:
    """Train ``total`` samples of x, y: full passes, then the first samples for the rest."""
    n = int(x.shape[0])
    full, rest = divmod(total, n)
    if full:
        trainer.train(x, y, epochs=full)
    if rest:
        trainer.train(x[:rest], y[:rest], epochs=1)


def golden_ranges(
    model: nn.Module,
    ir: NetworkIR,
    config: TrainConfig,
    ranges: Ranges,
    x_sample: torch.Tensor,
    y_sample: torch.Tensor,
    samples: int | None = None,
    passes: int = GOLDEN_PASSES,
    headroom: float = HEADROOM,
) -> dict[int, dict[str, float]]:
    """Widen float-calibrated ``ranges`` by the fixed-point trajectory: build the plan of the
    formats the ranges give (:func:`formats_from_ranges`, the compiler's default lanes and
    constants), train the golden model (``profile=True``) on the same ``samples`` samples of
    x (n, N), y (n,), and take per tensor the larger of the two maxima (:func:`merge_ranges`;
    the golden maxima are before the clamp, so a tensor the run saturated gets the range it
    needed). Repeat, at most ``passes`` golden runs, until the formats stop changing.

    Why: the float reference's ranges are those of the float trajectory; the fixed-point run
    rounds every product and update, drifts from it, and a tensor whose float maximum sat
    close to its format's edge can leave it (derived; measured in benchmarks/formats_check.py,
    docs/architecture.md §4.2). Ranges only grow, so the formats only widen and the loop ends.
    Returns the merged ranges (those of ``ranges`` kept, e.g. ``p``). Raises
    :class:`PlanError` for a plan the ranges cannot build (a diverged float run).
    """
    total = int(x_sample.shape[0]) * config.epochs if samples is None else int(samples)
    merged = merge_ranges(ranges, {})
    formats = formats_from_ranges(merged, config, ir, headroom=headroom)
    for _ in range(passes):
        plan = build_plan(ir, config, formats)
        g = GoldenModel(plan, model, config, profile=True)
        _stream(g, x_sample, y_sample, total)
        merged = merge_ranges(merged, g.ranges)
        wider = formats_from_ranges(merged, config, ir, headroom=headroom)
        if all(getattr(wider, k) == getattr(formats, k) for k in _FORMAT_FIELDS):
            break
        formats = wider
    return merged


def auto_formats(
    model: nn.Module,
    config: TrainConfig,
    x_sample: torch.Tensor,
    y_sample: torch.Tensor,
    samples: int | None = None,
    overrides: Mapping[str, QFormat] | None = None,
    headroom: float = HEADROOM,
    ir: NetworkIR | None = None,
    golden_passes: int = 0,
):
    """Calibrate on the data and pick the formats: :func:`calibrate_ranges`, with
    ``golden_passes`` > 0 widened by :func:`golden_ranges` (the compile flow's
    :class:`Calibrator` runs :data:`GOLDEN_PASSES`; 0 here keeps the float ranges), then
    :func:`~pipetrain.compiler.formats.formats_from_ranges` (a
    :class:`~pipetrain.compiler.build.FormatSpec` with ``ranges`` kept).

    Raises :class:`~pipetrain.compiler.frontend.CompileError` for a model the front end rejects
    and :class:`PlanError` for bad overrides or a diverged calibration run.
    """
    if ir is None:
        ir = trace(model, type(model).__name__, config.loss)
    ranges = calibrate_ranges(model, ir, config, x_sample, y_sample, samples)
    if golden_passes > 0:
        ranges = golden_ranges(
            model, ir, config, ranges, x_sample, y_sample, samples, golden_passes, headroom
        )
    return formats_from_ranges(ranges, config, ir, overrides, headroom)


def _check_finite(ranges: Ranges, config: TrainConfig, note: str | None) -> None:
    """Raise when the float calibration run diverged (a range is NaN or infinite), naming the
    first such tensor (stage, kind) and the fix: standardising when the inputs are far from
    unit scale (``note``, :class:`InputScaleError`), else a lower learning rate."""
    bad = [
        (s, k, v)
        for s, kinds in sorted(ranges.items())
        for k, v in sorted(kinds.items())
        if not math.isfinite(float(v))
    ]
    if not bad:
        return
    s, k, v = bad[0]
    where = f"stage {s} tensor {k!r} reached {v}" if s else f"the input reached {v}"
    head = f"the float calibration run diverged at lr {config.lr:g} ({where})"
    if note:
        raise InputScaleError(f"{head}, because the {note}")
    raise PlanError(f"{head}; train with a lower --lr (or lr= in the config)")


class Calibrator:
    """The ``calibrate`` callable of :func:`~pipetrain.compiler.compile.compile_result`.

    ``Calibrator(dataset, samples, golden_passes)(model, ir, config)`` checks that the data
    fits the network, runs :func:`calibrate_ranges` on its training set (``samples`` samples,
    default the whole training run) and widens the ranges by up to ``golden_passes`` golden
    runs (:func:`golden_ranges`; 0 keeps the float ranges; every strategy, auxiliary heads
    included). Inputs far from unit scale (:func:`input_scale_note`) give
    a warning (``warnings.warn``: the compile result's warnings).

    Raises :class:`PlanError` naming the data and the model when the feature or class counts
    differ (fix: ``--data FILE.npz`` with matching data, or the data-sized model ``mlp``), and
    :class:`InputScaleError` when such inputs drove the float run's logits beyond what a
    16-bit logit format holds with the exp LUT's fraction bits (fix: standardise).
    """

    def __init__(
        self, dataset: Dataset, samples: int | None = None, golden_passes: int = GOLDEN_PASSES
    ) -> None:
        self.dataset, self.samples, self.golden_passes = dataset, samples, golden_passes

    def __call__(self, model: nn.Module, ir: NetworkIR, config: TrainConfig) -> Ranges:
        ds = self.dataset
        wrong = ds.mismatch(ir.input_shape, ir.name)
        if wrong and (len(ir.input_shape) > 1 or len(ds.shape) > 1):  # feature maps
            raise PlanError(wrong)
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
        note = input_scale_note(ds.x_train)
        if note:
            warnings.warn(note, stacklevel=2)
        ranges = calibrate_ranges(model, ir, config, ds.x_train, ds.y_train, self.samples)
        _check_finite(ranges, config, note)
        S = len(ir.layers)
        logits = float(ranges.get(S, {}).get("y", 0.0))
        if note and format_for_range(logits, DATA_BITS).frac <= EXP_LUT_FRAC:
            raise InputScaleError(
                f"the calibration run's logits reach {logits:.4g}, more than a {DATA_BITS}-bit "
                f"logit format with {EXP_LUT_FRAC + 1} fraction bits holds, because the {note}"
            )
        if self.golden_passes < 1:
            return ranges
        return golden_ranges(
            model, ir, config, ranges, ds.x_train, ds.y_train, self.samples, self.golden_passes
        )
