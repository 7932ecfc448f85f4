"""``pipetrain experiment``: test accuracy of PB and its mitigations against depth (float);
the runs are :func:`pipetrain.sim.experiment.run_experiment`.

For every depth × method × learning rate × seed, an MLP ``features → width → … → width →
classes`` with ``depth`` Linear layers and ReLU between (:func:`pipetrain.compiler.models.
build_mlp`, He/Kaiming-uniform init seeded with the seed by default, so that 8-layer nets
train at all) is trained at batch size 1 by the float
reference trainer (:class:`pipetrain.sim.reference.ReferenceTrainer`) and scored on the test
set. Methods: ``sgd`` (sequential schedule: exact batch-1 SGD with momentum), ``pb``
(Pipelined Backpropagation, D_s = 2(S−s)+1), ``pb+sc``, ``pb+lwp``, ``pb+sc+lwp`` (Spike
Compensation / Linear Weight Prediction, Kosson et al. 2021 §3). The seed also fixes the
sample order (:func:`pipetrain.data.epoch_order`); every method sees the same initial
weights and the same order for a given seed.

Output: a table (mean ± sample standard deviation over seeds), optionally a plot of accuracy
vs depth (one line per method and learning rate) and ``--json``:
``{"settings": {...}, "rows": [{"depth", "method", "lr", "test_accuracy_mean",
"test_accuracy_std", "seeds"}]}``; ``settings`` records the run: ``data`` (name),
``train_samples``, ``test_samples``, ``depths``, ``methods``, ``lrs``, ``seeds`` (the count),
``epochs``, ``width``, ``init``, ``momentum``, ``weight_decay``, ``batch_ref``, ``lwp_form``.
The plot: colour = method, line style = learning rate.
"""

from __future__ import annotations

import time

import click
import torch

from ...compiler.config import ConfigError, TrainConfig
from ...data import load_data
from ...sim.experiment import (
    DEFAULT_EPOCHS,
    INITS,
    METHODS,
    format_table,
    plot_rows,
    run_experiment,
)
from . import cli, emit_json, info, json_option, user_errors

__all__ = ["experiment"]


def _int_list(text: str, what: str, minimum: int) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise ConfigError(f"--{what} must be comma-separated integers, got {text!r}") from exc
    if not values or any(v < minimum for v in values):
        raise ConfigError(f"--{what} needs integers ≥ {minimum}, got {text!r}")
    return values


def _float_list(text: str, what: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise ConfigError(f"--{what} must be comma-separated numbers, got {text!r}") from exc
    if not values or any(not v > 0 for v in values):
        raise ConfigError(f"--{what} needs numbers > 0, got {text!r}")
    return values


def _methods(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in METHODS]
    if bad or not names:
        raise ConfigError(
            f"unknown method(s) {', '.join(bad) or repr(text)}; choose from: {', '.join(METHODS)}"
        )
    return names


@cli.command("experiment")
@click.option(
    "--data",
    "data_spec",
    default="digits",
    show_default=True,
    metavar="digits|FILE",
    help="Data set: digits or a FILE.npz (x_train, y_train, x_test, y_test).",
)
@click.option(
    "--depths",
    default="2,4,8",
    show_default=True,
    help="Linear layers per net (comma-separated); one net per depth.",
)
@click.option(
    "--methods",
    default=",".join(METHODS),
    show_default=True,
    help="Methods to compare (comma-separated): sgd = sequential batch-1 SGD, pb = Pipelined "
    "Backpropagation, +sc = Spike Compensation, +lwp = Linear Weight Prediction.",
)
@click.option(
    "--seeds",
    default=3,
    show_default=True,
    type=int,
    help="Runs per setting, with seeds 0..N−1 (init and sample order); mean ± std over them.",
)
@click.option(
    "--epochs",
    default=DEFAULT_EPOCHS,
    show_default=True,
    type=int,
    help="Passes over the training set per run.",
)
@click.option(
    "--lrs",
    default=str(TrainConfig().lr),
    show_default=True,
    help="Reference learning rates (comma-separated).",
)
@click.option("--width", default=32, show_default=True, type=int, help="Hidden layer width.")
@click.option(
    "--momentum",
    default=None,
    type=float,
    help=f"Reference momentum m [default: {TrainConfig().momentum}].",
)
@click.option(
    "--weight-decay",
    default=None,
    type=float,
    help=f"L2 weight decay λ [default: {TrainConfig().weight_decay}].",
)
@click.option(
    "--lwp-form",
    type=click.Choice(["v", "w"]),
    default=None,
    help="Linear Weight Prediction form of the +lwp methods: v (ŵ = w − η·D·v) or w "
    f"(ŵ = w + D·(w_t − w_{{t−1}})) [default: {TrainConfig().lwp_form.value}].",
)
@click.option(
    "--init",
    type=click.Choice(INITS),
    default="kaiming",
    show_default=True,
    help="Weight init: He (Kaiming) uniform with zero biases, or PyTorch's default (which "
    "leaves 8-layer 32-wide ReLU nets near chance at batch 1).",
)
@click.option(
    "--plot",
    "plot_path",
    default=None,
    metavar="FILE.png",
    help="Save a plot of test accuracy vs depth (colour = method, line style = lr).",
)
@click.option(
    "--progress/--no-progress",
    default=True,
    show_default=True,
    help="Progress bar over the runs (on stderr).",
)
@json_option
@user_errors
def experiment(
    data_spec: str,
    depths: str,
    methods: str,
    seeds: int,
    epochs: int,
    lrs: str,
    width: int,
    momentum: float | None,
    weight_decay: float | None,
    lwp_form: str | None,
    init: str,
    plot_path: str | None,
    progress: bool,
    json_out: str | None,
) -> None:
    """Compare test accuracy of sgd, pb and mitigations by depth.

    Methods sgd / pb / pb+sc / pb+lwp / pb+sc+lwp, each an MLP of every --depths trained by the
    float reference trainer (no hardware), mean ± std over --seeds."""
    depth_list = _int_list(depths, "depths", 1)
    method_list = _methods(methods)
    lr_list = _float_list(lrs, "lrs")
    if seeds < 1:
        raise ConfigError(f"--seeds must be ≥ 1, got {seeds}")
    if epochs < 1:
        raise ConfigError(f"--epochs must be ≥ 1, got {epochs}")
    if width < 1:
        raise ConfigError(f"--width must be ≥ 1, got {width}")
    base = TrainConfig().replace(momentum=momentum, weight_decay=weight_decay, lwp_form=lwp_form)
    data = load_data(data_spec)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # batch-1 ops are tiny: threading only adds overhead
    t0 = time.perf_counter()
    try:
        rows = run_experiment(
            data, depth_list, method_list, seeds, epochs, lr_list, width, base, progress, init
        )
    finally:
        torch.set_num_threads(threads)
    elapsed = time.perf_counter() - t0
    info(
        f"{data.name}: {len(data.x_train)} train / {len(data.x_test)} test samples, "
        f"{epochs} epoch{'s' if epochs != 1 else ''}, width {width}, "
        f"momentum {base.momentum}, {init} init, batch 1",
        json_out,
    )
    info(format_table(rows), json_out)
    info(f"{len(rows) * seeds} runs in {elapsed:.1f} s", json_out)
    if plot_path:
        plot_rows(
            rows,
            plot_path,
            f"{data.name}: test accuracy vs depth ({epochs} epoch{'s' if epochs != 1 else ''})",
        )
        info(f"plot written to {plot_path}", json_out)
    settings = {
        "data": data.name,
        "train_samples": len(data.x_train),
        "test_samples": len(data.x_test),
        "depths": depth_list,
        "methods": method_list,
        "lrs": lr_list,
        "seeds": seeds,
        "epochs": epochs,
        "width": width,
        "init": init,
        "momentum": base.momentum,
        "weight_decay": base.weight_decay,
        "batch_ref": base.batch_ref,
        "lwp_form": base.lwp_form.value,
    }
    emit_json(json_out, {"settings": settings, "rows": rows})
