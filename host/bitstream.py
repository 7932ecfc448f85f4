"""Bitstreams with the open toolchain, and loading them onto a board (the library behind
``pipetrain build`` and ``deploy``).

:func:`build_design` elaborates an Amaranth top for a :class:`~pipetrain.compiler.targets.Board`
and runs Yosys → nextpnr → icepack/ecppack through Amaranth's Lattice platform, with the
synthesis options of :func:`pipetrain.hdl.synth.platform_overrides` (the post-synthesis
simulation and the fit guard synthesise with the same script, :mod:`pipetrain.hdl.synth`). The
result is read from nextpnr's ``--report report.json``: achieved vs constrained Fmax and
utilisation. A build whose inputs (every generated file, the build script and the tool
commands) are unchanged is reused from ``DIR/build.json`` unless ``force``. ``DIR/build.log``
holds the Yosys and nextpnr logs and the build script's output (:func:`build_log`).
:func:`deploy_bitstream` loads a bitstream with openFPGALoader (ULX3S) or iceprog
(iCEBreaker). Source: docs/boards.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..compiler.fit import FitError
from ..compiler.targets import Board, BoardError
from ..hdl.boards import platform_class
from ..hdl.synth import first_error, platform_overrides, synth_cells
from . import toolchain
from .toolchain import ToolchainError

__all__ = [
    "BuildError",
    "CLOCK_MARGIN",
    "build_board",
    "build_design",
    "build_log",
    "parse_report",
    "synth_cells",
    "synth_overflow",
    "pnr_overflow",
    "deploy_bitstream",
]


class BuildError(ToolchainError):
    """A tool in the build failed or timed out; the message quotes its first error line."""


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
            out.append(f"{used:,} {'/'.join(types)} needed, {avail:,} available")
    return out


#: nextpnr's messages when the placed design has more cells of a kind than the device:
#: ``Failed to expand region … of N ICESTORM_LCs`` (iCE40 packer/placer) and ``Design uses N
#: TRELLIS_COMB …`` style lines are reduced to (cell type, count needed).
_PNR_OVERFLOW = (
    re.compile(r"Failed to expand region .* of (\d+) (ICESTORM_LCs|TRELLIS_COMB|TRELLIS_SLICE)"),
    re.compile(r"Unable to place cell .*: (\d+) (ICESTORM_LC|TRELLIS_COMB) cells? needed"),
)


def pnr_overflow(board: Board, log: str) -> str | None:
    """Return "N logic cells needed, M available" (ECP5: "N LUT4s …",
    :attr:`~pipetrain.compiler.targets.Board.cells_name`) when nextpnr gave up because the
    packed design has more logic cells than ``board.luts``, else None."""
    what = "LUT4 + flip-flop" if board.family == "ice40" else "LUT4 slots"
    for pat in _PNR_OVERFLOW:
        m = pat.search(log)
        if m and int(m.group(1)) > board.luts:
            return (
                f"{int(m.group(1)):,} {board.cells_name} ({m.group(2)}: {what}) needed after "
                f"packing, {board.luts:,} available"
            )
    return None


#: First line of ``build.log`` (the sections follow).
_LOG_HEADER = "# pipetrain build log: Yosys, nextpnr, then the build script's own output"


def build_log(out: Path, name: str, script_output: str) -> str:
    """The text of ``DIR/build.log``: the Yosys log (``<name>.rpt``, synthesis and its cell
    statistics), the nextpnr log (``<name>.tim``, placement, routing, timing) and the build
    script's stdout/stderr (the tools run ``-q``, so this is short on success), each under a
    ``==== … ====`` heading; a missing log says so."""
    parts = [_LOG_HEADER]
    for title, path in (
        ("Yosys (synthesis)", out / f"{name}.rpt"),
        ("nextpnr (place and route, timing)", out / f"{name}.tim"),
    ):
        text = path.read_text(errors="replace") if path.is_file() else "(no log written)\n"
        parts.append(f"==== {title}: {path.name} ====\n{text}")
    parts.append(f"==== build script output (stdout, stderr) ====\n{script_output}")
    return "\n".join(parts)


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

    Raises :class:`ToolchainError` for missing tools, :class:`BuildError` when a tool fails or
    the build exceeds ``timeout_s`` (seconds), and :class:`~pipetrain.compiler.fit.FitError`
    when the synthesised or placed design needs more cells than the board has.
    """
    t0 = time.monotonic()
    echo = echo or (lambda msg: None)
    commands = toolchain.configure(board.family)
    platform = platform_class(board)()
    out = Path(os.path.relpath(Path(out_dir).resolve(), Path.cwd()))
    overrides: dict[str, Any] = {"nextpnr_opts": "--report report.json --timing-allow-fail"}
    overrides |= platform_overrides(board)  # the synthesis options (one source: hdl/synth.py)
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
            log_file = out / "build.log"
            old = log_file.read_text() if log_file.is_file() else ""
            if not old.startswith(_LOG_HEADER):  # a build from before build.log held the logs
                log_file.write_text(build_log(out, name, old))
            reused = {"cached": True, "build_s": round(time.monotonic() - t0, 3)}
            return cached | (meta or {}) | reused  # meta: this call's description of the inputs
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
    (out / "build.log").write_text(build_log(out, name, log))
    rpt = out / f"{name}.rpt"
    yosys_log = rpt.read_text() if rpt.is_file() else ""
    if proc.returncode != 0 or not bitstream.is_file():
        over = synth_overflow(board, synth_cells(yosys_log)) if yosys_log else []
        if over:
            raise FitError(
                f"the synthesised design does not fit {board.name} ({board.description}): "
                + "; ".join(over)
                + f" (Yosys log: {rpt})"
            )
        packed = pnr_overflow(board, log)
        if packed:
            luts = synth_cells(yosys_log).get(_SYNTH_HARD[board.family]["luts"][0], 0)
            raise FitError(
                f"the placed design does not fit {board.name} ({board.description}): {packed} "
                f"(synthesis: {luts:,} LUT4; full log: {out / 'build.log'}). Use a smaller "
                "network or a bigger board"
            )
        tim = out / f"{name}.tim"
        detail = first_error(tim.read_text() if tim.is_file() else "") if tim.is_file() else ""
        raise BuildError(
            f"the {board.name} build failed: {first_error(log) or detail} "
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


#: Timing margin of the network clock (derived): a pass is accepted when nextpnr's achieved
#: Fmax ≥ (1 + margin) × the clock, so the board keeps a 3 % guard band over the static timing
#: estimate (voltage, temperature and the model's own error).
CLOCK_MARGIN = 0.03


def build_board(
    board: Board,
    make_top: Callable[[float], Any],
    out_dir: str | os.PathLike,
    *,
    clock_hz: float | None = None,
    baud: int | None = None,
    margin: float = CLOCK_MARGIN,
    max_passes: int = 3,
    force: bool = False,
    meta: dict[str, Any] | None = None,
    echo: Any = None,
    **build_kw: Any,
) -> dict[str, Any]:
    """Build a board top at the fastest network clock that meets timing with ``margin``; return
    the last pass's :func:`build_design` report with ``clock`` added. ``force``, ``meta``,
    ``echo`` and ``build_kw`` (``name``, ``timeout_s``) are :func:`build_design`'s; ``force``
    rebuilds the first pass only.

    ``make_top(clock_hz)`` returns the board top running the network at ``clock_hz`` (Hz), e.g.
    ``BoardTop(board, core, clock_hz=f)``. The first pass runs at ``clock_hz`` (default the
    board's network clock, ``board.clock_hz``, the plan's; a build directory whose
    ``build.json`` holds a lower clock chosen for the same target starts there). When nextpnr's
    achieved Fmax is below ``(1 + margin)`` × the clock, the next pass runs at the fastest
    clock the PLL makes at or below ``Fmax / (1 + margin)`` with the UART at ``baud`` within
    tolerance (:func:`~pipetrain.hdl.pll.pick_pll`), or on the oscillator when the PLL cannot
    go that low; at most ``max_passes`` passes, stopping when the clock cannot go lower.

    ``clock`` (also in ``build.json``): ``target_mhz``, ``chosen_mhz`` (the network clock of the
    bitstream), ``osc_mhz``, ``pll`` (the divider settings, VCO and PFD frequencies; None on the
    oscillator), ``fmax_mhz`` (achieved at the chosen clock), ``margin``, ``met`` (Fmax ≥
    (1 + margin) × chosen) and ``passes`` (``clock_mhz``, ``fmax_mhz`` of every pass this call
    ran or reused). Raises as :func:`build_design`, and
    :class:`~pipetrain.compiler.targets.BoardError` when ``clock_hz`` is not a clock the PLL
    makes with the UART in tolerance.

    Source: docs/boards.md §2.1 (*derived*: nextpnr reports the achieved Fmax only after place
    and route, so the clock is fixed by a rebuild, not predicted).
    """
    from ..hdl.pll import pick_pll

    baud = int(baud or board.baud)
    osc = board.osc_hz or board.clock_hz
    target = float(clock_hz or board.clock_hz)

    def exact(f: float) -> tuple[float, Any]:
        """(clock, PLL setting or None) for a clock at or below ``f``."""
        if abs(f - osc) < 1e-3:
            return osc, None
        s = pick_pll(board.family, osc, f, baud)
        return s.out_hz, s

    f, pll = exact(target)
    stamp = Path(out_dir) / "build.json"
    if not force and stamp.is_file():  # a lower clock chosen before for this target
        try:
            old = json.loads(stamp.read_text()).get("clock") or {}
        except json.JSONDecodeError:
            old = {}
        chosen = float(old.get("chosen_mhz") or 0) * 1e6
        if abs(float(old.get("target_mhz") or 0) * 1e6 - target) < 1 and 0 < chosen < f:
            f, pll = exact(chosen)
    passes: list[dict[str, float]] = []
    while True:
        clock = {
            "target_mhz": target / 1e6,
            "chosen_mhz": f / 1e6,
            "osc_mhz": osc / 1e6,
            "pll": pll.to_dict() if pll is not None else None,
            "margin": margin,
        }
        echo = echo or (lambda msg: None)
        if passes:
            echo(f"rebuilding at {f / 1e6:g} MHz (Fmax {passes[-1]['fmax_mhz']:.2f} MHz)")
        top = make_top(f)
        uart = {"baud": top.baud, "uart_divisor": top.divisor} if hasattr(top, "divisor") else {}
        result = build_design(
            board,
            top,
            out_dir,
            force=force and not passes,
            meta=(meta or {}) | uart | {"clock": clock},
            echo=echo,
            **build_kw,
        )
        fmax = float(result["fmax_mhz"]) * 1e6
        passes.append({"clock_mhz": f / 1e6, "fmax_mhz": fmax / 1e6})
        met = fmax >= f * (1 + margin)
        if met or len(passes) >= max_passes:
            break
        try:
            nf, npll = exact(fmax / (1 + margin))
        except BoardError:  # below the PLL's range: the oscillator
            nf, npll = osc, None
        if nf >= f:  # no slower clock left
            break
        f, pll = nf, npll
    clock |= {"fmax_mhz": fmax / 1e6, "met": met, "passes": passes}
    result = result | {"clock": clock}
    if stamp.is_file():  # build_design wrote (or reused) it: add the clock passes
        kept = {k: v for k, v in result.items() if k != "cached"}
        stamp.write_text(json.dumps(kept, indent=2) + "\n")
    return result


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
