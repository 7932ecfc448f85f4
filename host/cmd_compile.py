"""``pipetrain compile MODEL``: trace, calibrate formats, choose lanes, write the plan, the
report and the Verilog (:func:`pipetrain.host.flow.compile_design`).

Prints the per-stage table (layer, shape, delay, stash, lanes, cycles per tick, memory,
formats) and writes ``DIR/plan.json``, ``DIR/report.md`` and ``DIR/<name>.v`` (``--out DIR``,
default ``build/<name>``, or ``build/<name>-<board>`` with ``--board``). ``--board NAME`` fits
the plan to the board (:mod:`pipetrain.compiler.fit`: the plan ``build --board`` puts in the
bitstream) and prints the board's needed vs available resources. ``--json FILE`` gets
:func:`pipetrain.compiler.report.plan_summary` (plus ``board`` and ``fit``).

Every :class:`~pipetrain.compiler.config.TrainConfig` field has an option here
(:func:`train_config_options`); they override the model file's ``config``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..compiler.build import PlanError
from ..compiler.config import LOSSES, ROUNDINGS
from ..compiler.fit import check_fit
from ..compiler.lanes import parse_lanes
from ..compiler.report import plan_summary, stage_table, totals_text
from ..compiler.schedule import LWP_FORMS, MITIGATIONS, RULES, SCHEDULES, STRATEGIES
from ..compiler.targets import BOARDS, get_board
from .cli import cli, emit_json, info, json_option, user_errors
from .flow import compile_design

__all__ = [
    "train_config_options",
    "plan_format_options",
    "config_overrides",
    "parse_memory",
    "compile_cmd",
]

#: (option, TrainConfig field, click type, help) for every training setting.
_CONFIG_OPTIONS: tuple[tuple[str, str, Any, str], ...] = (
    ("--schedule", "schedule", click.Choice(SCHEDULES), "pb (pipelined) or sequential (D = 0)."),
    ("--lr", "lr", float, "Reference learning rate η (at --batch-ref)."),
    ("--momentum", "momentum", float, "Reference momentum m (at --batch-ref)."),
    ("--weight-decay", "weight_decay", float, "L2 weight decay λ."),
    ("--batch-ref", "batch_ref", int, "Batch size of the reference η, m (scaled to batch 1)."),
    ("--mitigation", "mitigation", click.Choice(MITIGATIONS), "Delay mitigation."),
    ("--lwp-form", "lwp_form", click.Choice(LWP_FORMS), "Linear Weight Prediction form."),
    ("--strategy", "strategy", click.Choice(STRATEGIES), "Learning strategy."),
    ("--distance", "distance", int, "Interlocking distance d (blocks)."),
    ("--rule", "rule", click.Choice(RULES), "Interlocking rule."),
    ("--blocks", "blocks", str, "Main stages after which a block ends, e.g. 2 or 1,3."),
    ("--head-stages", "head_stages", int, "Linear stages per auxiliary head."),
    ("--loss", "loss", click.Choice(LOSSES), "Loss function."),
    ("--rounding", "rounding", click.Choice(ROUNDINGS), "Rounding of weight updates."),
    ("--seed", "seed", int, "Seed of initialisation, data order and LFSRs."),
    ("--epochs", "epochs", int, "Passes over the training set."),
)


def train_config_options(func: Callable) -> Callable:
    """Add one option per TrainConfig field (default: unset, i.e. keep the model's config)."""
    for opt, field, typ, text in reversed(_CONFIG_OPTIONS):
        func = click.option(opt, field, type=typ, default=None, help=text)(func)
    return func


def plan_format_options(func: Callable) -> Callable:
    """Add the options that shape the plan's formats and lanes, shared by ``compile`` and
    ``train``: ``--formats``, ``--format`` (repeatable), ``--calib-samples``, ``--lanes``."""
    options = (
        click.option(
            "--formats",
            "formats",
            type=click.Choice(["auto", "default"]),
            default="auto",
            show_default=True,
            help="auto: calibrate on --data with the float reference trainer; "
            "default: static formats.",
        ),
        click.option(
            "--format",
            "format_items",
            multiple=True,
            metavar="KEY=Qi.f",
            help="Override a format: s1.x=Q3.12 (stage 1's input) or w=Q3.20 (every stage); "
            "repeatable.",
        ),
        click.option(
            "--calib-samples",
            type=int,
            default=None,
            help="Samples streamed for calibration [default: the whole training run].",
        ),
        click.option(
            "--lanes", "lanes_text", default=None, help="Lanes: N for all stages, or 8,2."
        ),
    )
    for opt in reversed(options):
        func = opt(func)
    return func


def config_overrides(options: dict[str, Any]) -> dict[str, Any]:
    """Return the TrainConfig overrides from :func:`train_config_options` values (pops them).

    Raises :class:`PlanError` for a malformed ``--blocks``.
    """
    out = {}
    for _, field, _, _ in _CONFIG_OPTIONS:
        value = options.pop(field, None)
        if value is None:
            continue
        if field == "blocks":
            text = value.replace(" ", "")
            if not re.fullmatch(r"(\d+(,\d+)*)?", text):
                raise PlanError(f"--blocks {value!r} must be stage numbers like 2 or 1,3")
            value = tuple(int(v) for v in text.split(",")) if text else ()
        out[field] = value
    return out


_UNITS = {"": 1, "b": 1, "bit": 1, "bits": 1, "k": 1024, "kib": 1024, "kbit": 1024,
          "m": 1 << 20, "mib": 1 << 20, "mbit": 1 << 20}  # fmt: skip


def parse_memory(text: str) -> int:
    """Parse a memory budget in bits: ``589824``, ``576Kib``, ``1.5Mib`` (K = 1024 bits).

    Raises :class:`PlanError` on anything else.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise PlanError(
            f"--memory-budget {text!r} is not a size in bits (e.g. 589824, 576Kib, 1.5Mib)"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


@cli.command("compile")
@click.argument("model")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Output folder for plan.json and report.md [default: build/<name>].",
)
@click.option("--data", default="digits", show_default=True, help="Calibration data (.npz).")
@plan_format_options
@click.option("--target-cycles", type=int, default=None, help="Fewest lanes with ≤ T cycles.")
@click.option("--max-multipliers", type=int, default=None, help="Fastest design with ≤ M mults.")
@click.option("--memory-budget", "memory_budget", default=None, help="Memory budget, e.g. 1.5Mib.")
@click.option("--clock-mhz", type=float, default=None, help="Clock (MHz) [50, or the board's].")
@click.option(
    "--board",
    "board_name",
    type=click.Choice(sorted(BOARDS)),
    default=None,
    help="Fit the plan to this board, as `pipetrain build --board` does.",
)
@train_config_options
@json_option
@user_errors
def compile_cmd(
    model: str,
    out_dir: str | None,
    formats: str,
    format_items: tuple[str, ...],
    data: str,
    calib_samples: int | None,
    lanes_text: str | None,
    target_cycles: int | None,
    max_multipliers: int | None,
    memory_budget: str | None,
    clock_mhz: float | None,
    board_name: str | None,
    json_out: str | None,
    **options: Any,
) -> None:
    """Compile MODEL (built-in name or .py file) into a plan and print the per-stage table."""
    overrides = config_overrides(options)
    lanes = parse_lanes(lanes_text) if lanes_text is not None else None
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
        from ..compiler.models import BUILTIN_MODELS

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
        calib_samples=calib_samples,
        lanes=lanes,
        target_cycles=target_cycles,
        max_multipliers=max_multipliers,
        memory_budget_bits=budget,
        clock_hz=clock_mhz * 1e6,
    )
    plan = result.plan
    fit = check_fit(plan, board) if board is not None else None
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    for n in result.formats.notes:
        click.echo(f"note: {n}", err=True)
    info(
        f"{plan.name}: {len(plan.stages)} stages, schedule {plan.schedule}, strategy "
        f"{plan.strategy}, formats {result.formats.source}\n"
        + stage_table(plan)
        + "\n"
        + totals_text(plan)
        + (_fit_text(board.name, fit) if board is not None and fit is not None else "")
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
            "warnings": result.warnings,
            "notes": list(result.formats.notes),
            "board": board_name,
            "fit": fit,
        },
    )


def _fit_text(board: str, fit: dict[str, dict[str, int]]) -> str:
    """One line per board resource: ``needed / available``."""
    rows = ", ".join(f"{k} {v['needed']}/{v['available']}" for k, v in fit.items())
    return f"\nfitted to {board} (needed/available): {rows}"
