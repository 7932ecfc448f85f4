"""``pipetrain build``, ``deploy`` and ``list-boards``: bitstreams with the open toolchain.

``build MODEL --board NAME`` compiles the model to a plan (clock = the board's), checks that it
fits the board (:func:`pipetrain.hdl.boards.check_fit`), elaborates the board top (UART ↔ link
engine ↔ ``NetworkTop(plan)``), and runs Yosys → nextpnr → icepack/ecppack through Amaranth's
Lattice platform. The result is read from nextpnr's ``--report report.json``: achieved vs
constrained Fmax and utilisation. A build whose inputs (every generated file, the build script
and the tool commands) are unchanged is reused from ``DIR/build.json`` unless ``--force``.

``deploy BITSTREAM --board NAME`` loads a bitstream with openFPGALoader (ULX3S) or iceprog
(iCEBreaker); ``--dry-run`` prints the command only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import click

from ..compiler.build import EXP_LUT_FRAC, PlanError
from ..hdl.boards import (
    BOARDS,
    Board,
    BoardError,
    BoardFitError,
    check_fit,
    get_board,
    plan_totals,
)
from ..hdl.uart import UARTError
from . import toolchain
from .cli import cli, emit_json, info, json_option, register_user_error, user_errors
from .cmd_compile import config_overrides, plan_format_options, train_config_options
from .cmd_train import DEFAULT_HIDDEN, compile_job
from .toolchain import ToolchainError

__all__ = [
    "BuildError",
    "build_design",
    "parse_report",
    "compile_for_board",
    "plan_for_board",
    "deploy_bitstream",
]

for _exc in (BoardError, UARTError, ToolchainError, PlanError):
    register_user_error(_exc)


class BuildError(ToolchainError):
    """A tool in the build failed or timed out; the message quotes its first error line."""


register_user_error(BuildError)

#: nextpnr report cell names → report keys (per family).
_UTIL_KEYS: dict[str, dict[str, str]] = {
    "ecp5": {
        "luts": "TRELLIS_COMB",
        "ffs": "TRELLIS_FF",
        "multipliers": "MULT18X18D",
        "bram_blocks": "DP16KD",
        "lutram": "TRELLIS_RAMW",
        "io": "TRELLIS_IO",
    },
    "ice40": {
        "luts": "ICESTORM_LC",
        "multipliers": "ICESTORM_DSP",
        "bram_blocks": "ICESTORM_RAM",
        "spram_blocks": "ICESTORM_SPRAM",
        "io": "SB_IO",
    },
}


def parse_report(report: dict[str, Any], family: str, yosys_log: str = "") -> dict[str, Any]:
    """Return ``{"fmax_mhz", "clock_mhz", "clocks", "utilization"}`` from a nextpnr report.

    ``report`` is nextpnr's ``--report`` JSON (``fmax: {clock: {achieved, constraint}}`` in MHz,
    ``utilization: {cell type: {used, available}}``). ``fmax_mhz``/``clock_mhz`` are those of the
    slowest-achieving clock. Utilisation keys: ``luts``, ``ffs``, ``multipliers``,
    ``bram_blocks`` (+ ``spram_blocks``, ``lutram``, ``io``), each ``{used, available}``; on
    iCE40 (LUT and FF share a logic cell) ``ffs.used`` is counted from the Yosys log's ``SB_DFF*``
    cells. ``raw`` keeps every cell type.
    """
    clocks = {
        name: {"achieved_mhz": v["achieved"], "constraint_mhz": v["constraint"]}
        for name, v in report.get("fmax", {}).items()
    }
    if clocks:
        worst = min(clocks.values(), key=lambda c: c["achieved_mhz"] - c["constraint_mhz"])
        fmax, clock = worst["achieved_mhz"], worst["constraint_mhz"]
    else:  # a purely combinational design has no clock
        fmax = clock = float("nan")
    raw = report.get("utilization", {})
    util: dict[str, Any] = {}
    for key, cell in _UTIL_KEYS[family].items():
        if cell in raw:
            util[key] = {"used": raw[cell]["used"], "available": raw[cell]["available"]}
    if family == "ice40" and "luts" in util:
        util["ffs"] = {"used": _ice40_ffs(yosys_log), "available": util["luts"]["available"]}
    util["raw"] = raw
    return {"fmax_mhz": fmax, "clock_mhz": clock, "clocks": clocks, "utilization": util}


def synth_cells(yosys_log: str) -> dict[str, int]:
    """Return ``{cell type: count}`` of the last ``stat`` block (whole design) in a Yosys log."""
    # Yosys ≥ 0.5x ends with "Count including submodules" blocks; older ones "Number of cells"
    last = max(yosys_log.rfind("Count including submodules"), yosys_log.rfind("Number of cells"))
    text = yosys_log[last:] if last >= 0 else yosys_log
    end = text.find("Executing")
    text = text if end < 0 else text[:end]
    cells: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"\s*(?:(\d+)\s+(?:[\d.]+\s+)?([A-Z]\w*)|([A-Z]\w*)\s+(\d+))\s*$", line)
        if m:
            cells[m.group(2) or m.group(3)] = int(m.group(1) or m.group(4))
    return cells


def _ice40_ffs(yosys_log: str) -> int:
    """Sum the ``SB_DFF*`` cell counts of the last ``stat`` block in a Yosys log."""
    return sum(n for c, n in synth_cells(yosys_log).items() if c.startswith("SB_DFF"))


#: Yosys cell types of the hard blocks, per family: board budget field → cell types.
_SYNTH_HARD: dict[str, dict[str, tuple[str, ...]]] = {
    "ice40": {
        "multipliers": ("SB_MAC16",),
        "bram_blocks": ("SB_RAM40_4K",),
        "spram_blocks": ("SB_SPRAM256KA",),
        "luts": ("SB_LUT4",),
    },
    "ecp5": {"multipliers": ("MULT18X18D",), "bram_blocks": ("DP16KD",), "luts": ("LUT4",)},
}


def synth_overflow(board: Board, cells: dict[str, int]) -> list[str]:
    """Return "N <resource> needed, M available" for each hard resource the synthesised netlist
    (``cells`` from :func:`synth_cells`) uses beyond the board's budget."""
    out = []
    for field, types in _SYNTH_HARD[board.family].items():
        used = sum(cells.get(t, 0) for t in types)
        avail = getattr(board, field)
        if used > avail:
            out.append(f"{used} {'/'.join(types)} needed, {avail} available")
    return out


#: nextpnr's messages when the placed design has more cells of a kind than the device:
#: ``Failed to expand region … of N ICESTORM_LCs`` (iCE40 packer/placer) and ``Design uses N
#: TRELLIS_COMB …`` style lines are reduced to (cell type, count needed).
_PNR_OVERFLOW = (
    re.compile(r"Failed to expand region .* of (\d+) (ICESTORM_LCs|TRELLIS_COMB|TRELLIS_SLICE)"),
    re.compile(r"Unable to place cell .*: (\d+) (ICESTORM_LC|TRELLIS_COMB) cells? needed"),
)


def pnr_overflow(board: Board, log: str) -> str | None:
    """Return "N logic cells needed, M available" when nextpnr gave up because the packed
    design has more logic cells (LUT4 + flip-flop pairs) than ``board.luts``, else None."""
    for pat in _PNR_OVERFLOW:
        m = pat.search(log)
        if m and int(m.group(1)) > board.luts:
            return (
                f"{int(m.group(1))} logic cells ({m.group(2)}: LUT4 + flip-flop) needed after "
                f"packing, {board.luts} available"
            )
    return None


def _first_error(log: str) -> str:
    for line in log.splitlines():
        if re.search(r"\bERROR\b|error:", line):
            return line.strip()
    tail = [x for x in log.strip().splitlines() if x.strip()]
    return tail[-1].strip() if tail else "(no output)"


def build_design(
    board: Board,
    top: Any,
    out_dir: str | os.PathLike,
    *,
    name: str = "top",
    force: bool = False,
    timeout_s: float | None = None,
    meta: dict[str, Any] | None = None,
    echo: Any = None,
) -> dict[str, Any]:
    """Build ``top`` (an Amaranth elaboratable) for ``board`` in ``out_dir``; return the report.

    Returns ``{"board", "bitstream", "fmax_mhz", "clock_mhz", "utilization", "build_s",
    "cached", "digest", "timing_met", ...meta}`` (paths relative to the current directory,
    Fmax/clock in MHz, ``build_s`` in seconds of this call). The build runs in ``out_dir``
    given as a path relative to the working directory (YoWASP tools cannot see ``/tmp``).

    Raises :class:`ToolchainError` for missing tools and :class:`BuildError` when a tool fails or
    the build exceeds ``timeout_s`` (seconds).
    """
    t0 = time.monotonic()
    echo = echo or (lambda msg: None)
    commands = toolchain.configure(board.family)
    platform = board.platform_class()()
    out = Path(os.path.relpath(Path(out_dir).resolve(), Path.cwd()))
    overrides: dict[str, Any] = {"nextpnr_opts": "--report report.json --timing-allow-fail"}
    if board.synth_opts:
        overrides["synth_opts"] = board.synth_opts
    plan = platform.prepare(top, name, **overrides)
    h = hashlib.sha256(plan.digest())
    for env in sorted(commands):
        h.update(f"{env}={Path(commands[env]).name}".encode())
    digest = h.hexdigest()[:16]
    bitstream = out / f"{name}.{board.bitstream_ext}"
    stamp = out / "build.json"
    if not force and stamp.is_file() and bitstream.is_file():
        try:
            cached = json.loads(stamp.read_text())
        except json.JSONDecodeError:
            cached = {}
        if cached.get("digest") == digest:
            return cached | {"cached": True, "build_s": round(time.monotonic() - t0, 3)}
    slow = toolchain.first_run_tools(commands)
    if slow:
        echo(
            f"first run of {', '.join(slow)}: compiling WebAssembly, 1–2.5 min each "
            "(cached afterwards in ~/.cache/YoWASP)"
        )
    for stale in (out / "report.json", bitstream):
        stale.unlink(missing_ok=True)
    build_dir = plan.extract(str(out))
    script = f"{plan.script}.sh"
    try:
        proc = subprocess.run(
            ["sh", script],
            cwd=build_dir,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"the {board.name} build took longer than {timeout_s:.0f} s") from exc
    log = proc.stdout + proc.stderr
    (out / "build.log").write_text(log)
    rpt = out / f"{name}.rpt"
    yosys_log = rpt.read_text() if rpt.is_file() else ""
    if proc.returncode != 0 or not bitstream.is_file():
        over = synth_overflow(board, synth_cells(yosys_log)) if yosys_log else []
        if over:
            raise BoardFitError(
                f"the synthesised design does not fit {board.name} ({board.description}): "
                + "; ".join(over)
                + f" (Yosys log: {rpt})"
            )
        packed = pnr_overflow(board, log)
        if packed:
            raise BoardFitError(
                f"the placed design does not fit {board.name} ({board.description}): {packed} "
                f"(synthesis: {synth_cells(yosys_log).get(_SYNTH_HARD[board.family]['luts'][0], 0)}"
                f" LUT4; full log: {out / 'build.log'}). Use a smaller network or a bigger board"
            )
        tim = out / f"{name}.tim"
        detail = _first_error(tim.read_text() if tim.is_file() else "") if tim.is_file() else ""
        raise BuildError(
            f"the {board.name} build failed: {_first_error(log) or detail} "
            f"(full log: {out / 'build.log'})"
        )
    report_path = out / "report.json"
    parsed = parse_report(json.loads(report_path.read_text()), board.family, yosys_log)
    result = {
        "board": board.name,
        "bitstream": str(bitstream),
        "fmax_mhz": parsed["fmax_mhz"],
        "clock_mhz": parsed["clock_mhz"],
        "timing_met": parsed["fmax_mhz"] >= parsed["clock_mhz"],
        "clocks": parsed["clocks"],
        "utilization": parsed["utilization"],
        "build_s": round(time.monotonic() - t0, 3),
        "cached": False,
        "digest": digest,
        "tools": {k: Path(v).name for k, v in commands.items()},
        "nextpnr_report": str(report_path),
    } | (meta or {})
    stamp.write_text(json.dumps(result, indent=2) + "\n")
    return result


def compile_for_board(
    model: Any,
    board: Board,
    seed: int | None = 0,
    lanes: tuple[int, ...] | None = None,
    **compile_options: Any,
) -> Any:
    """Compile ``model`` (built-in name, ``.py`` file or ``nn.Module``) to a
    :class:`~pipetrain.compiler.compile.CompileResult` whose plan is fitted to ``board`` and
    clocked at the board clock: the plan ``pipetrain build --board`` puts in the bitstream and
    ``pipetrain train --board`` streams to it (the device checks the plan hash at HELLO).

    ``compile_options``: further :func:`~pipetrain.compiler.compile.compile_result` options
    (``config``, ``config_overrides``, ``formats``, ``format_overrides``, ``data``,
    ``calib_samples``, ``name``); ``seed=None`` leaves the seed to them / the model's config.

    Fitting, in order (each step only when the board asks for it):

    1. constants with ``board.const_bits`` significant bits (iCE40: 5 — lr 0.002 becomes the
       shift 2^-9, m 0.9 becomes 29/32, a three-digit shift-add; no SB_MAC16 for them);
    2. formats narrowed to the board's widths (iCE40: 16-bit weights and velocities, 12-bit
       activations and errors), keeping their calibrated integer bits
       (:func:`narrow_formats`; the auto formats are computed once and reused);
    3. lanes: ``lanes`` if given; otherwise the compiler's default balance, and if that plan
       does not fit (:func:`~pipetrain.hdl.boards.check_fit`), one lane per stage — the UART
       bounds samples/s well below one lane's compute rate (see :mod:`pipetrain.hdl.board`),
       so fewer lanes cost only idle compute;
    4. SPRAM (iCE40 UltraPlus): one-lane stages, largest weight + velocity bits first, get
       single-port SPRAM weight memories (``Stage.slot_cycles`` = 2: a slot every other
       cycle) as long as SPRAMs remain.

    Raises :class:`BoardFitError` (needed vs available numbers) when even that does not fit,
    unless ``lanes`` was given (the caller checks then).
    """
    from ..compiler.compile import compile_result

    opts: dict[str, Any] = {
        "clock_hz": board.clock_hz,
        "seed": seed,
        "const_bits": board.const_bits,
    }
    shared = {
        k: v for k, v in compile_options.items() if k in ("config", "config_overrides", "name")
    }
    first = compile_result(model, lanes=lanes, **opts, **compile_options)
    over = narrow_formats(first.plan, board.format_bits())

    def make(lanes_: tuple[int, ...] | None, single_port: tuple[int, ...] = ()) -> Any:
        if not over and not single_port and lanes_ == lanes:
            return first
        # the calibrated formats of the first compile (user overrides included), narrowed
        return compile_result(
            model,
            lanes=lanes_,
            formats=first.formats,
            format_overrides=over,
            single_port=single_port,
            **opts,
            **shared,
        )

    candidates = [lanes] if lanes is not None else [None, (1,)]
    err: BoardFitError | None = None
    result = None
    for lanes_ in candidates:
        result = _with_spram(make(lanes_), board, lambda sp, ln=lanes_: make(ln, sp))
        if all(s.lanes == 1 for s in result.plan.stages) and lanes_ is None:
            candidates = [None]  # the default plan is already one lane per stage
        try:
            check_fit(result.plan, board)
            return result
        except BoardFitError as exc:
            err = exc
    if lanes is not None:
        return result
    assert err is not None
    # fewer lanes cannot help any more: say what was tried and what is left
    head = str(err).split(". Use fewer lanes")[0]
    narrowed = " and the board's narrower formats" if any(board.format_bits().values()) else ""
    raise BoardFitError(
        f"{head}, already with one lane per stage{narrowed}. Use a smaller network or a bigger "
        "board (pipetrain list-boards)",
        err.rows,
        err.plan,
    ) from None


def plan_for_board(
    model: Any, board: Board, seed: int | None = 0, lanes: tuple[int, ...] | None = None
) -> Any:
    """The plan of :func:`compile_for_board` (same arguments and errors)."""
    return compile_for_board(model, board, seed=seed, lanes=lanes).plan


def narrow_formats(plan: Any, widths: dict[str, int]) -> list[str]:
    """Format overrides (``s<i>.<tensor>=Qi.f``) that fit each stage's tensors into
    ``widths[tensor]`` bits (0 or absent: leave it), keeping their calibrated integer bits and
    giving up fraction bits; [] when everything fits already.

    The same rule on every tensor keeps the formats that must agree equal: stage s's ``y`` and
    stage s+1's ``x``, stage s's ``d`` and stage s+1's ``gin``, and ``w``/``u`` share a
    fraction (the velocity is stored in weight units: their common fraction is set by the
    wider integer part). Logits (the ``y`` that feeds a loss unit) keep more than
    ``EXP_LUT_FRAC`` fraction bits, the exp LUT's step, even if that makes them wider.
    """
    out: list[str] = []
    last_main = plan.main_stages[-1].index
    for st in plan.stages:
        f = st.formats
        feeds_loss = st.index == last_main or (st.role == "head" and st.activation == "identity")
        wb = widths.get("w", 0) or widths.get("u", 0)
        if wb and max(f.w.bits, f.u.bits) > wb:
            wi, ui = f.w.bits - 1 - f.w.frac, f.u.bits - 1 - f.u.frac
            frac = wb - 1 - max(wi, ui)
            out += [f"s{st.index}.w=Q{wi}.{frac}", f"s{st.index}.u=Q{ui}.{frac}"]
        for t in ("x", "y", "d", "gin"):
            q, bits = getattr(f, t), widths.get(t, 0)
            if q is not None and bits and q.bits > bits:
                i = q.bits - 1 - q.frac
                frac = bits - 1 - i
                if t == "y" and feeds_loss:
                    # logits feed the loss unit's exp LUT, which needs > EXP_LUT_FRAC bits
                    frac = max(frac, EXP_LUT_FRAC + 1)
                if frac < q.frac:
                    out.append(f"s{st.index}.{t}=Q{i}.{frac}")
    return out


def _with_spram(result: Any, board: Board, make: Any) -> Any:
    """Give every one-lane stage of ``result`` (a CompileResult) SPRAM weight memories, largest
    first, while SPRAMs remain (see :func:`compile_for_board`, step 4). Not only until the
    plan's own count fits: that count covers the stage weights and stashes, while the link
    engine, the loss unit and the error buffers take ~15 more EBRs on the iCE40 (measured with
    Yosys, ``mlp-digits``), so every EBR the weights leave free is needed."""
    if not board.spram_blocks:
        return result
    chosen: list[int] = []
    free = board.spram_blocks
    for st in sorted(result.plan.stages, key=lambda s: -(s.weight_bits + s.velocity_bits)):
        f = st.formats
        need = -(-f.w.bits // 16) + -(-f.u.bits // 16)
        if st.lanes != 1 or st.cycles_per_tick > 16384 or need > free:
            continue
        chosen.append(st.index)
        free -= need
    return make(tuple(sorted(chosen))) if chosen else result


def _board_option(func: Any) -> Any:
    return click.option(
        "--board",
        "board_name",
        required=True,
        type=click.Choice(sorted(BOARDS)),
        help="Target board (see `pipetrain list-boards`).",
    )(func)


@cli.command("build")
@click.argument("model", required=False)
@_board_option
@click.option("--out", "out_dir", default=None, help="Build directory [build/<model>-<board>].")
@click.option("--baud", type=int, default=None, help="UART baud rate [the board's default].")
@click.option("--loopback", is_flag=True, help="Build the UART loopback design instead (no MODEL).")
@click.option("--force", is_flag=True, help="Rebuild even if the cached build is current.")
@click.option("--timeout", "timeout_s", type=float, default=None, help="Give up after SECONDS.")
@click.option("--data", default="digits", show_default=True, help="Calibration data (.npz).")
@click.option(
    "--hidden", default=DEFAULT_HIDDEN, show_default=True, help="Hidden layer sizes of model 'mlp'."
)
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
    data: str,
    hidden: str,
    formats: str,
    format_items: tuple[str, ...],
    calib_samples: int | None,
    lanes_text: str | None,
    json_out: str | None,
    **options: Any,
) -> None:
    """Build a bitstream of MODEL for a board with Yosys/nextpnr (YoWASP if not installed).

    The plan is fitted to the board; the compile and training options are those of
    `pipetrain train`, so `train --board` with the same options streams the same plan."""
    from ..hdl.board import BoardTop, Loopback, network_core

    board = get_board(board_name)
    if loopback == (model is not None):
        raise BoardError("give a MODEL or --loopback (not both)")
    overrides = config_overrides(options)
    if overrides.pop("epochs", None) is not None:
        raise PlanError("--epochs is not part of the plan: give it to `pipetrain train`")
    meta: dict[str, Any] = {"design": "uart-loopback" if loopback else model}
    if loopback:
        core: Any = Loopback
    else:
        from ..compiler.lanes import parse_lanes
        from .data import load_data

        result = compile_job(
            model,
            load_data(data),
            data,
            hidden=hidden,
            overrides=overrides,
            formats=formats,
            format_items=format_items,
            calib_samples=calib_samples,
            lanes=parse_lanes(lanes_text) if lanes_text else None,
            board=board.name,
        )
        plan = result.plan
        fit = check_fit(plan, board)
        meta |= {"plan_hash": plan.hash, "plan": plan_totals(plan), "fit": fit}
        try:
            from ..hdl import link, top  # noqa: F401
        except ImportError as exc:
            raise BoardError(
                f"the network top / link engine is not available yet ({exc}); "
                "build --loopback to check the board flow"
            ) from exc
        core = lambda: network_core(plan)  # noqa: E731
    top = BoardTop(board, core, baud=baud)
    meta |= {"baud": top.baud, "uart_divisor": top.divisor}
    design = "loopback" if loopback else Path(str(model)).stem
    out = out_dir or os.path.join("build", f"{design}-{board.name}")
    info(f"building {meta['design']} for {board.name} in {out} ...", json_out)
    result = build_design(
        board,
        top,
        out,
        force=force,
        timeout_s=timeout_s,
        meta=meta,
        echo=lambda msg: info(msg, json_out),
    )
    u = result["utilization"]

    def frac(key: str) -> str:
        if key not in u:
            return "-"
        return f"{u[key]['used']}/{u[key]['available']}"

    info(
        f"{result['bitstream']}: Fmax {result['fmax_mhz']:.1f} MHz "
        f"(clock {result['clock_mhz']:.1f} MHz{'' if result['timing_met'] else ', NOT MET'}); "
        f"{'logic cells' if board.family == 'ice40' else 'LUTs'} {frac('luts')}, "
        f"FFs {frac('ffs')}, multipliers {frac('multipliers')}, "
        f"block RAM {frac('bram_blocks')}"
        + (f", SPRAM {frac('spram_blocks')}" if "spram_blocks" in u else "")
        + f"; {result['build_s']:.0f} s{' (cached)' if result['cached'] else ''}",
        json_out,
    )
    emit_json(json_out, result)


def deploy_bitstream(
    board: Board, bitstream: str, *, flash: bool = False, dry_run: bool = False
) -> dict[str, Any]:
    """Load ``bitstream`` onto ``board``; return ``{"command", "ran", "output"}``.

    Raises :class:`BoardError` for a missing file or the wrong format (``.bit`` on ULX3S,
    ``.bin`` on iCEBreaker) and :class:`ToolchainError` when the programmer is missing, cannot
    start (e.g. libusb absent) or fails (e.g. no board attached).
    """
    path = Path(bitstream)
    if not path.is_file():
        raise BoardError(f"bitstream {bitstream!r} does not exist")
    if path.suffix != f".{board.bitstream_ext}":
        raise BoardError(
            f"{board.name} takes a .{board.bitstream_ext} bitstream, got {path.name!r}"
        )
    cmd = toolchain.programmer_command(board.family, path, flash=flash)
    if dry_run:
        return {"command": cmd, "ran": False, "output": ""}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except OSError as exc:
        raise ToolchainError(f"cannot run {cmd[0]}: {exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise ToolchainError(f"{shlex.join(cmd)} did not finish in 300 s") from exc
    output = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        if "error while loading shared libraries" in output:
            lib = re.search(r"libraries: (\S+?):", output)
            raise ToolchainError(
                f"{Path(cmd[0]).name} cannot start: missing "
                f"{lib.group(1) if lib else 'a shared library'} "
                "(Debian/Ubuntu: apt install libusb-1.0-0 libftdi1-2)"
            )
        last = output.splitlines()[-1] if output else "(no output)"
        raise ToolchainError(
            f"programming {board.name} failed (exit {proc.returncode}): {last}. "
            "Is the board connected and accessible (udev rules)?"
        )
    return {"command": cmd, "ran": True, "output": output}


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
    """Load BITSTREAM onto a board (openFPGALoader; iceprog for iCEBreaker when installed)."""
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
            f"{b.name:<11} {b.description}; {b.clock_hz / 1e6:g} MHz, UART {b.baud} baud; "
            f"{b.luts} LUT4, {b.ffs} FF, {b.multipliers} multipliers "
            f"({b.multiplier_width}×{b.multiplier_width}), RAM {ram}"
        )
    info("\n".join(rows), json_out)
    emit_json(json_out, {"boards": [b.to_dict() for b in BOARDS.values()]})
