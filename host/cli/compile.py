"""``pipetrain compile MODEL``: trace, calibrate formats, choose lanes, write the plan, the
report and the Verilog (:func:`pipetrain.host.flow.compile_design`).

Prints the per-stage table (layer, shape, delay, stash, lanes, cycles per tick, memory,
formats) and writes ``DIR/plan.json``, ``DIR/report.md`` and ``DIR/<name>.v`` (``--out DIR``,
default ``build/<name>``, or ``build/<name>-<board>`` with ``--board``). ``--board NAME`` fits
the plan to the board (:mod:`pipetrain.compiler.fit`: the plan ``build --board`` puts in the
bitstream) and prints the board's needed vs available resources; ``--on-chip-data N`` (with
``--board``) counts an on-chip training set of N samples in that fit, as ``build
--on-chip-data N`` does, so the lanes chosen leave room for it. ``--json FILE`` gets
:func:`pipetrain.compiler.report.plan_summary` (plus ``board``, ``fit`` and
``onchip_samples``).

Formats: calibrated on ``--data`` (``digits`` or a ``FILE.npz``); without it a model that the
default data set, digits, fits (the built-ins, ``mlp`` sized from it, any 64-input model with
≥ 10 outputs) calibrates on digits, and any other model compiles uncalibrated with static
formats (:func:`pipetrain.compiler.formats.static_formats`); the printed note and
``report.md`` say which, with the ``--data`` hint. The calibration run lasts
``--calib-epochs`` epochs (default ``--epochs``, else the model file's epochs, else 4, the run
``pipetrain train`` makes; :func:`~pipetrain.host.cli.options.calibration_epochs`), as in
``build`` and ``train``, so the three compile the same plan; ``--json`` records
``calib_epochs`` and ``calib_samples``.

Every :class:`~pipetrain.compiler.config.TrainConfig` field has an option here
(:func:`train_config_options`); they override the model file's ``config``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ...compiler.build import PlanError
from ...compiler.lanes import parse_lane_spec
from ...compiler.report import fit_text, plan_summary, stage_legend, stage_table, totals_text
from ...compiler.targets import get_board
from ..flow import compile_design
from . import cli, emit_json, info, json_option, user_errors
from .options import (
    board_option,
    calibration_epochs,
    config_overrides,
    data_option,
    hidden_option,
    model_help,
    onchip_data_option,
    parse_memory,
    plan_format_options,
    train_config_options,
)

__all__ = ["compile_cmd"]


@cli.command("compile")
@model_help()
@click.argument("model")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Output folder for plan.json, report.md and <name>.v [default: build/<name>, or "
    "build/<name>-<board> with --board].",
)
@data_option
@hidden_option
@plan_format_options
@click.option(
    "--target-cycles",
    type=int,
    default=None,
    help="Fewest lanes whose tick (cycles per sample under pb: report.md's tick line) is ≤ T.",
)
@click.option(
    "--max-multipliers",
    type=int,
    default=None,
    help="Fastest design with ≤ M multipliers in the stages (the loss unit's one is not "
    "counted; not DSP blocks: a wide product takes several).",
)
@click.option("--memory-budget", "memory_budget", default=None, help="Memory budget, e.g. 1.5Mib.")
@click.option("--clock-mhz", type=float, default=None, help="Clock (MHz) [50, or the board's].")
@board_option(
    "Fit the plan to this board, as `pipetrain build --board` does; report.md names it and "
    "its needed / available resources."
)
@onchip_data_option
@train_config_options
@json_option
@user_errors
def compile_cmd(
    model: str,
    out_dir: str | None,
    formats: str,
    format_items: tuple[str, ...],
    data: str | None,
    hidden: str | None,
    calib_epochs: int | None,
    calib_samples: int | None,
    lanes_text: str | None,
    target_cycles: int | None,
    max_multipliers: int | None,
    memory_budget: str | None,
    clock_mhz: float | None,
    board_name: str | None,
    onchip_samples: int,
    json_out: str | None,
    **options: Any,
) -> None:
    """Compile MODEL into a plan, report and Verilog (no training).

    Writes plan.json, report.md and <name>.v to --out and prints the per-stage table (lanes,
    formats, cycles, memories; fitted to --board when given)."""
    overrides = config_overrides(options)
    # the run's epochs (--epochs) or --calib-epochs; train and build pick them the same way
    calib_epochs = calibration_epochs(
        model, calib_epochs, overrides.get("epochs"), calib_samples, formats
    )
    if onchip_samples and board_name is None:
        raise PlanError(
            f"--on-chip-data {onchip_samples} counts an on-chip training set in a board's fit: "
            "add --board NAME (the board you build with --on-chip-data), or drop --on-chip-data"
        )
    lanes, col_lanes = parse_lane_spec(lanes_text) if lanes_text is not None else (None, None)
    budget = parse_memory(memory_budget) if memory_budget is not None else 0
    board = get_board(board_name) if board_name is not None else None
    if board is not None and clock_mhz is not None:
        raise PlanError(
            f"--clock-mhz and --board: the plan fitted to {board.name} runs at its "
            f"{board.clock_hz / 1e6:g} MHz clock; give one of them"
        )
    clock_mhz = 50.0 if clock_mhz is None else clock_mhz
    if clock_mhz <= 0:
        raise PlanError(f"--clock-mhz must be > 0, got {clock_mhz}")
    if out_dir is None:
        from ...compiler.models import BUILTIN_MODELS

        stem = model if model in BUILTIN_MODELS else Path(model).stem
        out_dir = str(Path("build") / (stem + (f"-{board.name}" if board else "")))
    result = compile_design(
        model,
        None,
        out_dir,
        board=board,
        config_overrides=overrides,
        formats=formats,
        format_overrides=list(format_items),
        data=data,
        hidden=hidden,
        calib_samples=calib_samples,
        calib_epochs=calib_epochs,
        lanes=lanes,
        col_lanes=col_lanes,
        target_cycles=target_cycles,
        max_multipliers=max_multipliers,
        memory_budget_bits=budget,
        clock_hz=clock_mhz * 1e6,
        onchip_samples=onchip_samples,
    )
    plan = result.plan
    fit = result.fit
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    for n in result.formats.notes:
        click.echo(f"note: {n}", err=True)
    info(
        f"{plan.name}: {len(plan.stages)} stages, schedule {plan.schedule}, strategy "
        f"{plan.strategy}, formats {result.formats.source}\n"
        + stage_table(plan)
        + "\n"
        + stage_legend()
        + "\n"
        + totals_text(plan, board)
        + (
            "\n" + fit_text(board.name, fit, onchip_samples)
            if board is not None and fit is not None
            else ""
        )
        + f"\nwrote {', '.join(result.files)} to {result.out_dir}",
        json_out,
    )
    emit_json(
        json_out,
        plan_summary(plan)
        | {
            "out_dir": str(result.out_dir),
            "files": result.files,
            "formats_source": result.formats.source,
            "calib_epochs": calib_epochs if result.formats.source.startswith("auto") else None,
            "calib_samples": calib_samples if result.formats.source.startswith("auto") else None,
            "warnings": result.warnings,
            "notes": list(result.formats.notes),
            "board": board_name,
            "fit": fit,
            "onchip_samples": onchip_samples,
        },
    )
