"""``pipetrain sim MODEL``: run the generated RTL in an RTL simulator and prove it bit-exact.

Compiles MODEL to a plan (:func:`pipetrain.host.flow.compile_design`, as ``pipetrain compile``
does, but with the auto formats calibrated over the config's epochs, 1 unless a model file sets
them: ``sim`` streams ``--samples`` samples, not epochs, and has no ``--epochs`` or
``--calib-epochs``; ``compile``, ``build`` and ``train`` calibrate over the run's epochs,
default 4, so with auto formats their plan hashes differ from ``sim``'s), generates and
builds ``NetworkTop(plan)`` with ``--simulator``
(``verilator``, the default, or ``icarus``: :mod:`pipetrain.sim.harness`; cached by plan and
generator sources), streams the first ``--samples`` training samples of the data set
(:func:`pipetrain.sim.stimulus.plan_samples`) through the RTL and
through the fixed-point golden model, and compares every result record, every final weight,
velocity and counter. Any difference is reported with its tick, stage, tensor and index
(:mod:`pipetrain.sim.tb.network`).

JSON (``--json FILE``): ``{"bit_exact", "mismatches", "samples", "cycles",
"cycles_per_sample", "ideal_cycles_per_sample", "sim_cycles_per_s", "build_s", ...}``;
``cycles`` counts the training (first sample beat → idle after the flush), ``total_cycles``
the whole simulated run (weight load and read-back included), ``cycles_per_sample`` is the
steady-state mean spacing of result records; ``sim_cycles_per_s`` = total_cycles per second;
``waves``: the wave file's absolute path (with ``--waves``). Every field: README.md
(``pipetrain sim --json``).
Exit status 1 when the RTL is not bit-exact.

``--post-synth ice40|ecp5`` simulates the board's Yosys netlist instead of the RTL
(:mod:`pipetrain.sim.postsynth`: the bitstream build's synthesis script, the vendor cell
models); ``--board NAME`` compiles the plan fitted to that board and, with ``--post-synth``,
takes its synthesis options (default: the family's first board). The JSON adds ``post_synth``
(``family``, ``board``, ``cells``, ``script``, ``synth_s``, ``synth_cached``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from ...compiler.lanes import parse_lane_spec
from ...compiler.targets import BoardError, get_board
from ...hdl.support import require_hdl
from ...hdl.synth import family_board, yosys_command
from ...sim.harness import RTLSimError, check_toolchain, check_waves
from ...sim.postsynth import build_postsynth_network
from ...sim.stimulus import plan_samples
from ...sim.tb.network import check_network, network_cached
from ..flow import compile_design
from . import cli, emit_json, info, json_option, user_errors
from .options import (
    board_option,
    config_options,
    config_overrides,
    hidden_option,
    model_help,
    simulator_option,
)

__all__ = ["sim_command"]


def _cells_line(cells: dict[str, int]) -> str:
    """``5,770 SB_LUT4, 53 SB_MAC16, …``: the netlist's cells, most numerous first."""
    return ", ".join(f"{n:,} {c}" for c, n in sorted(cells.items(), key=lambda kv: -kv[1]))


@cli.command("sim")
@model_help()
@click.argument("model")
@click.option(
    "--samples",
    type=click.IntRange(1),
    default=200,
    show_default=True,
    help="Training samples to stream through the RTL.",
)
@click.option(
    "--data",
    default="digits",
    show_default=True,
    help="'digits' or a .npz file (x_train, y_train, x_test, y_test).",
)
@hidden_option
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Model initialisation, sample order and LFSR seeds.",
)
@click.option(
    "--waves",
    type=click.Path(dir_okay=False),
    default=None,
    help="Record a waveform to FILE (.vcd, or .fst: Verilator needs liblz4-dev and "
    "zlib1g-dev; builds a tracing variant).",
)
@click.option(
    "--backpressure",
    type=click.FloatRange(0.05, 1.0),
    default=1.0,
    show_default=True,
    help="Probability of valid/ready on every stream each cycle (1 = free-running).",
)
@click.option(
    "--lanes",
    default=None,
    help="Lanes per stage, e.g. '4,1' or '16x3,10' (stage 1 over 3 column lanes; "
    "default: compiler's).",
)
@click.option(
    "--no-localise", is_flag=True, help="Skip the bisection that names the first differing update."
)
@click.option(
    "--post-synth",
    "post_synth",
    type=click.Choice(["ice40", "ecp5"]),
    default=None,
    help="Simulate the Yosys netlist for this FPGA family (vendor cell models) instead of the RTL.",
)
@board_option(
    "Compile the plan fitted to this board (and, with --post-synth, its synthesis options)."
)
@config_options(
    "schedule", "mitigation", "lwp_form", "strategy", "distance", "rule", "blocks",
    "head_stages", "rounding", "momentum_digits", "lfsr_leap",
)  # fmt: skip
@simulator_option
@json_option
@user_errors
def sim_command(
    model: str,
    samples: int,
    data: str,
    hidden: str | None,
    seed: int,
    waves: str | None,
    backpressure: float,
    lanes: str | None,
    no_localise: bool,
    post_synth: str | None,
    board_name: str | None,
    simulator: str,
    json_out: str | None,
    **training: Any,
) -> None:
    """Simulate MODEL's RTL and check it against the golden model.

    Streams --samples training samples through the generated RTL (Verilator or Icarus) and the
    fixed-point golden model and compares every result, weight and counter bit for bit (exit
    status 1 when they differ). The training options (--strategy --blocks --distance --rule
    --head-stages --mitigation --lwp-form, with --schedule and --rounding) shape the plan as
    they do for pipetrain train."""
    check_toolchain(simulator)  # a missing simulator is reported before anything is compiled
    wave_kind = None if waves is None else ("fst" if waves.endswith(".fst") else "vcd")
    check_waves(simulator, wave_kind)  # FST without lz4/zlib: named here, not in a make log
    board = get_board(board_name) if board_name else None
    synth_board = None
    if post_synth is not None:
        synth_board = board or family_board(post_synth)
        if synth_board.family != post_synth:
            raise BoardError(
                f"--post-synth {post_synth} does not match board {synth_board.name} "
                f"({synth_board.family}): use --post-synth {synth_board.family} or another board"
            )
        yosys_command()  # a missing Yosys is reported before anything is compiled
    overrides = config_overrides(training)  # checked, as for train (nothing built yet)
    lane_list, col_lanes = parse_lane_spec(lanes) if lanes else (None, None)
    result = compile_design(
        model,
        seed=seed,
        data=data,
        hidden=hidden,
        board=board,
        config_overrides=overrides,
        lanes=lane_list,
        col_lanes=col_lanes,
        writers=(),
        check=lambda ir: require_hdl(ir, "sim"),  # before calibrating
    )
    plan, module = result.plan, result.model
    for w in result.warnings:  # e.g. interlocking that equals global
        click.echo(f"warning: {w}", err=True)
    require_hdl(plan, "sim")  # before anything is built or written
    x, y = plan_samples(plan, samples, data, seed)
    design, synth = None, None
    if synth_board is None:
        built = network_cached(plan, simulator=simulator, waves=wave_kind)
        info(
            f"simulating {plan.name} ({len(plan.stages)} stages, plan {plan.hash}) on {samples} "
            f"samples in {simulator}"
            + ("" if built else "; building the RTL first (new design: 20–60 s)")
            + "…",
            json_out,
        )
    else:
        info(
            f"simulating {plan.name} ({len(plan.stages)} stages, plan {plan.hash}) on {samples} "
            f"samples in {simulator}: the {post_synth} netlist ({synth_board.name} synthesis; "
            "a new design synthesises and builds in minutes)…",
            json_out,
        )
        design, synth = build_postsynth_network(
            plan, synth_board, simulator=simulator, waves=wave_kind
        )
        yosys = "cached" if synth.get("synth_cached") else f"{synth.get('synth_s', 0):.0f} s"
        info(f"netlist: {_cells_line(synth.get('cells', {}))}; Yosys {yosys}", json_out)
    try:
        report = check_network(
            plan,
            module,
            x,
            y.tolist(),
            waves=waves,
            valid_prob=backpressure,
            ready_prob=backpressure,
            seed=seed,
            localise_first=not no_localise,
            simulator=None if design is not None else simulator,
            design=design,
        )
    except RTLSimError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    if design is not None:
        report.build_s = design.build_s  # synthesis + netlist build (0 when cached)
    out = report.to_dict()
    if synth is not None:
        out["post_synth"] = synth
    if report.bit_exact:
        info(
            f"bit-exact: {samples} samples, {report.cycles_per_sample:.1f} cycles/sample "
            f"(ideal {report.ideal_cycles_per_sample}), {report.sim_cycles_per_s:,.0f} "
            f"simulated cycles/s, build {report.build_s:.1f} s",
            json_out,
        )
    else:
        info(
            f"NOT bit-exact: {len(report.mismatches)} mismatches; first: "
            f"{report.first.describe() if report.first else '?'}",
            json_out,
        )
        if report.localisation:
            info(f"  ({report.localisation})", json_out)
    if waves is not None:
        out["waves"] = str(Path(waves).resolve())
        info(f"waves written to {out['waves']}", json_out)
    emit_json(json_out, out)
    if not report.bit_exact:
        sys.exit(1)
