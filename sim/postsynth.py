"""Post-synthesis simulation: the network top as Yosys synthesises it for a board, simulated
with the vendor cell models and compared with the golden model (``pipetrain sim --post-synth
ice40|ecp5 [--board NAME]``).

Flow (:func:`build_postsynth_network`): ``NetworkTop(plan)`` → RTLIL (Amaranth) → Yosys with
the board's bitstream synthesis (:func:`pipetrain.hdl.synth.synthesize`: the same
``synth_ice40``/``synth_ecp5`` command and ``synth_opts`` as ``pipetrain build``) → the netlist
(vendor cells) + the cell models (:func:`pipetrain.sim.cell_models.cell_models`) → the RTL
harness (:func:`pipetrain.sim.harness.cached_design`, Verilator or Icarus) → the same run and
comparison as ``pipetrain sim`` (:func:`pipetrain.sim.tb.network.check_network` with the
design). Only the network top is synthesised (the ports of docs/ports.md survive synthesis),
elaborated for the board's platform (so the iCEBreaker plan's SPRAM stages are
``SB_SPRAM256KA`` cells, as in the bitstream); the board top's UART and link engine are not
part of it.

Simulators: both work; Verilator (the default) is the one to use beyond the tiny nets — the
netlist is thousands of cell instances, which Icarus interprets one event at a time (measured:
docs/architecture.md §6).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from ..compiler.plan import Plan
from ..compiler.targets import Board
from .cell_models import cell_models
from .harness import DEFAULT_SIMULATOR, cached_design
from .tb.network import TOPLEVEL, NetworkDesign, _stream_fields

__all__ = ["POSTSYNTH_INFO", "build_postsynth_network", "netlist_verilog"]

#: File in the build directory with the netlist's synthesis facts (cells, script, seconds).
POSTSYNTH_INFO = "postsynth.json"


_DEFAULT = re.compile(r"(\w+)\s*`ICE40_DEFAULT_ASSIGNMENT_(?:([01])\b|V\(([^)]*)\))")


def _port_defaults(models: str) -> dict[str, dict[str, str]]:
    """``{cell: {port: default}}`` of the iCE40 models' SystemVerilog port defaults."""
    out: dict[str, dict[str, str]] = {}
    for m in re.finditer(r"^module\s+(\w+)\s*\((.*?)\);", models, re.S | re.M):
        found = {p: f"1'b{v}" if v else w.strip() for p, v, w in _DEFAULT.findall(m.group(2))}
        if found:
            out[m.group(1)] = found
    return out


def netlist_verilog(netlist_text: str, family: str) -> str:
    """The simulation source of a netlist: a ``timescale`` (the cell models have one), the
    netlist, then the cell models of ``family``.

    Yosys' iCE40 models give some input ports a default value (``input E = 1'b1``), which is
    SystemVerilog; the source defines ``NO_ICE40_DEFAULT_ASSIGNMENTS`` (Verilog-2005 ports) and
    connects every such port an instance leaves open to its default instead.
    """
    models = cell_models(family)
    head = "`timescale 1ns / 1ps\n"
    if family == "ice40":
        head += "`define NO_ICE40_DEFAULT_ASSIGNMENTS\n"
        defaults = _port_defaults(models)
        cell = re.compile(rf"\n  ({'|'.join(defaults)}) [^;]*?\n  \);")

        def connect(m: re.Match[str]) -> str:
            have = set(re.findall(r"\.(\w+)\(", m.group(0)))
            extra = [f",\n    .{p}({v})" for p, v in defaults[m.group(1)].items() if p not in have]
            return m.group(0)[: -len("\n  );")] + "".join(extra) + "\n  );"

        netlist_text = cell.sub(connect, netlist_text)
    return f"{head}{netlist_text}\n{models}\n"


def build_postsynth_network(
    plan: Plan,
    board: Board,
    *,
    simulator: str = DEFAULT_SIMULATOR,
    waves: str | None = None,
    rebuild: bool = False,
    synth_timeout_s: float | None = None,
) -> tuple[NetworkDesign, dict[str, Any]]:
    """Synthesise ``NetworkTop(plan)`` with ``board``'s bitstream synthesis and build the
    netlist with its cell models in ``simulator`` (cached: by the plan, the board's synthesis
    commands and the generator's sources; the netlist itself by its RTLIL).

    Returns ``(design, synth)``: a :class:`~pipetrain.sim.tb.network.NetworkDesign` for
    :func:`~pipetrain.sim.tb.network.check_network` and ``{"family", "board", "cells",
    "script", "synth_s", "synth_cached"}`` (``cells``: Yosys' ``stat`` of the netlist;
    ``synth_s``: seconds in Yosys, 0 when cached). Raises
    :class:`~pipetrain.hdl.synth.SynthToolError` without Yosys,
    :class:`~pipetrain.hdl.synth.SynthError` when synthesis fails, and the harness's errors.
    """
    from ..hdl.synth import synth_commands, yosys_version

    t0 = time.perf_counter()
    facts: dict[str, Any] = {}

    def generate() -> str:
        from ..hdl.synth import design_rtlil, synthesize
        from ..hdl.top import NetworkTop

        text = design_rtlil(NetworkTop(plan), board, TOPLEVEL)
        net = synthesize(text, board, TOPLEVEL, timeout_s=synth_timeout_s)
        facts.update(
            cells=net.cells, script=list(net.script), synth_s=net.synth_s, synth_cached=net.cached
        )
        return netlist_verilog(net.verilog, board.family)

    identity = json.dumps(
        {
            "plan": plan.to_json(),
            "family": board.family,
            "commands": synth_commands(board, TOPLEVEL),
            "yosys": yosys_version(),
        },
        sort_keys=True,
    )
    build, verilog_s = cached_design(
        f"postsynth-{board.family}",
        TOPLEVEL,
        identity,
        generate,
        simulator=simulator,
        waves=waves,
        sources=[Path(__file__).with_name("cell_models.py")],
        rebuild=rebuild,
    )
    info_file = build.directory / POSTSYNTH_INFO
    if facts:
        info_file.write_text(json.dumps(facts))
    elif info_file.is_file():
        facts = json.loads(info_file.read_text()) | {"synth_s": 0.0, "synth_cached": True}
    synth = {"family": board.family, "board": board.name} | facts
    design = NetworkDesign(plan, build, _stream_fields(plan), time.perf_counter() - t0, verilog_s)
    return design, synth
