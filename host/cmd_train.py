"""``pipetrain train MODEL``: compile, then train on a target and report the test accuracy.

Targets are factories in :data:`TARGETS` (``golden``: the fixed-point golden model,
``reference``: the float PB reference trainer); another module adds one with
:func:`register_target` (e.g. ``sim``, the RTL through the host link). Every target gets the
same plan, the same initial weights (the model initialised with ``--seed``) and streams the
same samples (:func:`pipetrain.host.data.epoch_order`), so their accuracies are comparable.

``--json FILE`` gets ``{"target", "model", "test_accuracy", "train_accuracy", "samples",
"samples_per_s", "seconds", "saturations", "stage_saturations", "epochs", "plan_hash",
"formats_source"}`` (accuracies are fractions in [0, 1]; ``samples`` counts streamed training
samples; ``samples_per_s`` is wall-clock training throughput of this host).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import click
import torch

from ..compiler.build import PlanError
from ..compiler.compile import CompileResult, compile_result
from ..compiler.lanes import parse_lanes
from ..sim.golden import GoldenError, GoldenModel
from ..sim.trainer import Trainer
from .cli import cli, emit_json, info, json_option, register_user_error, user_errors
from .cmd_compile import config_overrides, train_config_options
from .data import load_data

__all__ = ["TARGETS", "register_target", "train_cmd", "run_training"]

register_user_error(PlanError)
register_user_error(GoldenError)

#: target name → factory building a trainer from a compile result.
TARGETS: dict[str, Callable[[CompileResult], Trainer]] = {}


def register_target(name: str, factory: Callable[[CompileResult], Trainer]) -> None:
    """Make ``--target name`` build its trainer with ``factory(compile_result)``."""
    TARGETS[name] = factory


def _golden(result: CompileResult) -> Trainer:
    return GoldenModel(result.plan, result.model, result.config)


def _reference(result: CompileResult) -> Trainer:
    from ..sim.reference import ReferenceTrainer

    return ReferenceTrainer(result.model, result.config, plan=result.plan, profile=False)


register_target("golden", _golden)
register_target("reference", _reference)


def run_training(
    result: CompileResult, target: str, data: str, progress: bool = False
) -> dict[str, Any]:
    """Train ``result``'s model on ``target`` for ``result.config.epochs`` epochs of ``data``
    and return the report dict (module docstring). Raises :class:`PlanError` for an unknown
    target and :class:`~pipetrain.host.data.DataError` for bad data."""
    if target not in TARGETS:
        raise PlanError(f"unknown target {target!r}; choose one of: {', '.join(TARGETS)}")
    ds = load_data(data)
    if ds.features != result.plan.in_features:
        raise PlanError(
            f"data {ds.name!r} has {ds.features} features but the model takes "
            f"{result.plan.in_features}"
        )
    trainer = TARGETS[target](result)
    epochs = result.config.epochs
    start = time.perf_counter()
    trainer.train(ds.x_train, ds.y_train, epochs=epochs, progress=progress)
    seconds = time.perf_counter() - start
    samples = len(ds.x_train) * epochs
    return {
        "target": target,
        "model": result.name,
        "test_accuracy": trainer.evaluate(ds.x_test, ds.y_test),
        "train_accuracy": trainer.evaluate(ds.x_train, ds.y_train),
        "samples": samples,
        "samples_per_s": samples / seconds if seconds > 0 else float("inf"),
        "seconds": seconds,
        "saturations": int(trainer.saturations),
        "stage_saturations": list(getattr(trainer, "stage_saturations", [])),
        "epochs": epochs,
        "schedule": result.plan.schedule,
        "mitigation": result.plan.mitigation,
        "plan_hash": result.plan.hash,
        "formats_source": result.formats.source,
        "_trainer": trainer,
    }


@cli.command("train")
@click.argument("model")
@click.option(
    "--target",
    default="golden",
    show_default=True,
    help="Where to train: golden (fixed-point golden model) or reference (float).",
)
@click.option("--data", default="digits", show_default=True, help="digits or a FILE.npz.")
@click.option(
    "--formats",
    type=click.Choice(["auto", "default"]),
    default="auto",
    show_default=True,
    help="auto: calibrate on --data with the float reference trainer; default: static.",
)
@click.option(
    "--format",
    "format_items",
    multiple=True,
    metavar="KEY=Qi.f",
    help="Override a format: s1.x=Q3.12 or w=Q3.20; repeatable.",
)
@click.option("--calib-samples", type=int, default=None, help="Calibration samples.")
@click.option("--lanes", "lanes_text", default=None, help="Lanes: N for all stages, or 8,2.")
@click.option("--save", type=click.Path(dir_okay=False), default=None, help="Save state_dict.")
@click.option("--progress/--no-progress", default=False, help="Show a progress bar.")
@train_config_options
@json_option
@user_errors
def train_cmd(
    model: str,
    target: str,
    data: str,
    formats: str,
    format_items: tuple[str, ...],
    calib_samples: int | None,
    lanes_text: str | None,
    save: str | None,
    progress: bool,
    json_out: str | None,
    **options: Any,
) -> None:
    """Compile MODEL (built-in name or .py file) and train it on --target; report accuracy."""
    if target not in TARGETS:
        raise PlanError(f"unknown target {target!r}; choose one of: {', '.join(TARGETS)}")
    overrides = config_overrides(options)
    lanes = parse_lanes(lanes_text) if lanes_text is not None else None
    result = compile_result(
        model,
        None,
        None,
        config_overrides=overrides,
        formats=formats,
        format_overrides=list(format_items),
        data=data,
        calib_samples=calib_samples,
        lanes=lanes,
    )
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    report = run_training(result, target, data, progress)
    trainer = report.pop("_trainer")
    if save:
        torch.save(trainer.state_dict(), save)
        report["saved"] = save
    info(
        f"{result.name} on {target}: test accuracy {100 * report['test_accuracy']:.2f} % "
        f"after {report['epochs']} epoch(s), {report['samples']} samples, "
        f"{report['samples_per_s']:.0f} samples/s, {report['saturations']} saturations",
        json_out,
    )
    emit_json(json_out, report)
