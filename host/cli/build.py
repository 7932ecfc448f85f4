"""``pipetrain build``, ``deploy`` and ``list-boards``: bitstreams with the open toolchain.

``build MODEL --board NAME`` compiles the model with the plan fitted to the board
(:func:`pipetrain.host.flow.compile_design` with ``board``, the compiler pass
:mod:`pipetrain.compiler.fit`), elaborates the board top (UART ↔ link engine ↔
``NetworkTop(plan)``) and builds it (:func:`pipetrain.host.bitstream.build_design`).
``deploy BITSTREAM --board NAME`` loads a bitstream (:func:`pipetrain.host.bitstream.
deploy_bitstream`); ``--dry-run`` prints the command only. ``list-boards`` prints
:data:`pipetrain.compiler.targets.BOARDS`.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import click

from ...compiler.fit import logic_cells, plan_totals
from ...compiler.lanes import parse_lane_spec
from ...compiler.targets import BOARDS, BoardError, get_board
from ...hdl.shell import board_shell
from ...hdl.support import require_hdl
from ...sim.harness import hdl_source_hash
from ..bitstream import build_board, deploy_bitstream
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
    plan_format_options,
    train_config_options,
)

__all__ = ["build_cmd", "deploy_cmd", "list_boards_cmd"]


#: ``--board NAME`` of ``build`` and ``deploy`` (required).
_board_option = board_option("Target board (see `pipetrain list-boards`).", required=True)


@cli.command("build")
@model_help(also="No MODEL with --loopback.")
@click.argument("model", required=False)
@_board_option
@click.option("--out", "out_dir", default=None, help="Build directory [build/<model>-<board>].")
@click.option("--baud", type=int, default=None, help="UART baud rate [the board's default].")
@click.option("--loopback", is_flag=True, help="Build the UART loopback design instead (no MODEL).")
@click.option("--force", is_flag=True, help="Rebuild even if the cached build is current.")
@click.option("--timeout", "timeout_s", type=float, default=None, help="Give up after SECONDS.")
@onchip_data_option
@data_option
@hidden_option
@plan_format_options
@train_config_options
@json_option
@user_errors
def build_cmd(
    model: str | None,
    board_name: str,
    out_dir: str | None,
    baud: int | None,
    loopback: bool,
    force: bool,
    timeout_s: float | None,
    onchip_samples: int,
    data: str | None,
    hidden: str | None,
    formats: str,
    format_items: tuple[str, ...],
    calib_epochs: int | None,
    calib_samples: int | None,
    lanes_text: str | None,
    json_out: str | None,
    **options: Any,
) -> None:
    """Build MODEL's bitstream for --board with Yosys/nextpnr.

    YoWASP runs them where they are not installed. The plan is fitted to the board; the compile
    and training options are those of `pipetrain train`, so `train --board` with the same
    options streams the same plan. --epochs is not in the plan, but the auto formats are
    calibrated over it (or --calib-epochs; default: the model file's epochs, else 4, train's
    default run): train the board with the same --epochs, or another --epochs with
    --calib-epochs of the build."""
    from ...hdl.board import BoardTop, Loopback, network_core

    board = get_board(board_name)
    if loopback == (model is not None):
        raise BoardError("give a MODEL or --loopback (not both)")
    overrides = config_overrides(options)
    # --epochs: the run the bitstream is for (not in the plan): the auto formats are calibrated
    # over it, as train and compile calibrate over theirs (calibration_epochs)
    run_epochs = overrides.pop("epochs", None)
    calib_epochs = (
        None
        if model is None
        else calibration_epochs(model, calib_epochs, run_epochs, calib_samples, formats)
    )
    meta: dict[str, Any] = {"design": "uart-loopback" if loopback else model}
    if loopback:
        core: Any = lambda f: Loopback()  # noqa: E731
    else:
        result = compile_design(
            model,
            data=data,
            hidden=hidden,
            board=board,
            config_overrides=overrides,
            formats=formats,
            format_overrides=list(format_items),
            calib_samples=calib_samples,
            calib_epochs=calib_epochs,
            lanes=parse_lane_spec(lanes_text)[0] if lanes_text else None,
            col_lanes=parse_lane_spec(lanes_text)[1] if lanes_text else None,
            writers=(),
            check=lambda ir: require_hdl(ir, "build"),  # before calibrating and fitting
            onchip_samples=onchip_samples,
        )
        plan = result.plan
        fit = result.fit
        for w in result.warnings:  # e.g. interlocking that equals global
            click.echo(f"warning: {w}", err=True)
        require_hdl(plan, "build")  # before anything is built or written
        # plan.multipliers counts the stages' multipliers as built (Stage.products: shift-add
        # constants and the loss unit not); plan.hard_multipliers = fit.multipliers.needed:
        # DSP blocks, the loss units' included (docs/boards.md)
        totals = plan_totals(plan, board, lambda p: board_shell(p, onchip_samples))
        meta |= {
            "plan_hash": plan.hash,
            # how the auto formats were calibrated (null: not calibrated)
            "calib_epochs": calib_epochs if result.formats.source.startswith("auto") else None,
            "calib_samples": calib_samples if result.formats.source.startswith("auto") else None,
            "lanes": [s.lanes for s in plan.stages],
            "col_lanes": [s.column_lanes for s in plan.stages],
            "ideal_cycles_per_sample": plan.ideal_cycles_per_sample,
            "plan": totals,
            "fit": fit,
            "estimate": logic_cells(plan, board),
            # the generator sources the bitstream was made from (benchmarks/board_cache.py
            # imports a report as current only for today's HDL)
            "hdl_hash": hdl_source_hash(),
        }
        if onchip_samples:  # build.json records it (absent: no on-chip set, as before)
            meta["onchip_samples"] = onchip_samples
        core = lambda f: network_core(plan, clock_hz=f, onchip_samples=onchip_samples)  # noqa: E731
    design = "loopback" if loopback else Path(str(model)).stem
    out = out_dir or os.path.join("build", f"{design}-{board.name}")
    info(f"building {meta['design']} for {board.name} in {out} ...", json_out)
    result = build_board(
        board,
        lambda f: BoardTop(board, lambda: core(f), baud=baud, clock_hz=f),
        out,
        baud=baud,
        force=force,
        timeout_s=timeout_s,
        meta=meta,
        echo=lambda msg: info(msg, json_out),
    )
    u = result["utilization"]

    def frac(key: str) -> str:
        if key not in u:
            return "-"
        return f"{u[key]['used']:,}/{u[key]['available']:,}"

    ck = result["clock"]
    src = f"PLL from {ck['osc_mhz']:g} MHz" if ck["pll"] else "the oscillator"
    short = "" if ck["met"] else f", Fmax under the {ck['margin']:.0%} margin"
    info(
        f"{result['bitstream']}: Fmax {result['fmax_mhz']:.1f} MHz "
        f"(network clock {ck['chosen_mhz']:g} MHz, {src}"
        f"{'' if result['timing_met'] else ', NOT MET'}{short}); "
        f"{board.cells_name} {frac('luts')}, "
        f"FFs {frac('ffs')}, DSP blocks {frac('multipliers')}, "
        f"block RAM {frac('bram_blocks')}"
        + (f", SPRAM {frac('spram_blocks')}" if "spram_blocks" in u else "")
        + f"; {result['build_s']:.0f} s{' (cached)' if result['cached'] else ''}",
        json_out,
    )
    emit_json(json_out, result)


@cli.command("deploy")
@click.argument("bitstream")
@_board_option
@click.option("--flash", is_flag=True, help="ULX3S: write the SPI flash (default: SRAM).")
@click.option("--dry-run", is_flag=True, help="Print the programming command, do not run it.")
@json_option
@user_errors
def deploy_cmd(
    bitstream: str, board_name: str, flash: bool, dry_run: bool, json_out: str | None
) -> None:
    """Load BITSTREAM onto --board with openFPGALoader or iceprog.

    ULX3S: openFPGALoader, into SRAM (lost at power-off) or with --flash into the SPI flash;
    iCEBreaker: its SPI flash, with iceprog when installed, else openFPGALoader."""
    board = get_board(board_name)
    result = deploy_bitstream(board, bitstream, flash=flash, dry_run=dry_run)
    info(shlex.join(result["command"]), json_out)
    if result["ran"]:
        info(f"programmed {board.name}", json_out)
    emit_json(json_out, {"board": board.name, "bitstream": bitstream} | result)


@cli.command("list-boards")
@json_option
@user_errors
def list_boards_cmd(json_out: str | None) -> None:
    """List supported boards and their resource budgets."""
    rows = []
    for b in BOARDS.values():
        ram = f"{b.bram_blocks}×{b.bram_block_bits // 1024} Kib"
        if b.spram_blocks:
            ram += f" + SPRAM {b.spram_blocks}×{b.spram_block_bits // 1024} Kib"
        rows.append(
            f"{b.name:<11} {b.description}; {b.clock_hz / 1e6:g} MHz (PLL from "
            f"{(b.osc_hz or b.clock_hz) / 1e6:g} MHz), UART {b.baud} baud; "
            f"{b.luts:,} {b.cells_name}, {b.ffs:,} FF, {b.multipliers} DSP blocks "
            f"({b.multiplier_width}×{b.multiplier_width} {b.dsp_cell}), RAM {ram}"
        )
    info("\n".join(rows), json_out)
    emit_json(json_out, {"boards": [b.to_dict() for b in BOARDS.values()]})
