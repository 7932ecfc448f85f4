"""Icarus Verilog back end of the RTL harness (:mod:`pipetrain.sim.harness`): the toolchain
facts (docs/architecture.md §6).

Icarus comes from the system (Debian/Ubuntu: ``apt-get install iverilog``; version 11 is what
the project is tested with): ``iverilog`` compiles, ``vvp`` runs with cocotb's VPI module.
What differs from Verilator:

* cocotb's runner compiles with ``iverilog -g2012``; the build adds ``-g2005`` (the last
  generation flag wins): Amaranth writes Verilog-2005, and only Verilog-2005 rules give
  Yosys' time-0 trigger of its ``always @*`` blocks an event (:func:`build_options`);
* the Verilog has no ``timescale``, so the build passes ``+timescale+1ns/1ps`` (the benches
  time the clock in ns and the UART model in ps);
* Verilator's ``--x-initial 0`` has no counterpart and needs none: Amaranth writes an
  ``initial`` value for every register and an ``initial`` block for every memory; the only
  registers without one are memory read-data registers, loaded at every clock edge, and the
  benches hold reset for three cycles before they look;
* no trace is written unless asked for (the runner's ``-none``): a trace needs a tracing build
  (``waves``) with a Verilog-2005 ``$dumpfile`` module (:data:`DUMP_MODULE`);
  ``+dumpfile_path`` names the file and the format follows the build (``-fst`` or ``-vcd``);
* every signal is visible to cocotb (``public`` has no effect);
* speed: an event-driven interpreter, 40–300× slower than Verilator — measured on this
  project's 2-core machines: the tests' tiny net 2.6k cycles/s (Verilator 61k), ``mlp-digits``
  1.3k cycles/s over a whole ``pipetrain sim`` run and 0.5k while training (Verilator ~100k
  and ~170k); the build takes ~3 s instead of ~45 s. So the tests use the tiny net and a few
  samples.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .harness import ToolchainError, version

__all__ = ["ensure_toolchain", "ensure_waves", "iverilog_version"]

#: Bump when the build recipe changes: invalidates every cached Icarus build.
RUNNER_VERSION = 2
#: Time unit and precision of the build (the Verilog has no ``timescale`` of its own).
TIMESCALE = ("1ns", "1ps")


def ensure_toolchain() -> None:
    """Check that ``iverilog`` and ``vvp`` are on ``PATH``.

    Raises :class:`~pipetrain.sim.harness.ToolchainError` naming the missing tools, how to
    install them and the alternative simulator.
    """
    missing = [tool for tool in ("iverilog", "vvp") if shutil.which(tool) is None]
    if missing:
        raise ToolchainError(
            f"the icarus simulator needs {' and '.join(missing)} on PATH: install Icarus "
            "Verilog (Debian/Ubuntu: apt-get install iverilog) or use the verilator simulator"
        )


@functools.cache
def ensure_waves(waves: str | None) -> None:
    """Harness hook: Icarus writes VCD and FST itself (``vvp -fst``); nothing to check."""


def iverilog_version() -> str:
    """The first line of ``iverilog -V`` (e.g. ``Icarus Verilog version 11.0 (stable) ()``).

    Raises :class:`~pipetrain.sim.harness.ToolchainError` when ``iverilog`` is missing.
    """
    ensure_toolchain()
    out = subprocess.run(
        ["iverilog", "-V"], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    lines = (out.stdout or out.stderr).splitlines()
    return lines[0].strip() if lines else "?"


def recipe(toplevel: str, waves: str | None, public: str) -> tuple[str, ...]:
    """Harness hook: the build-key parts besides the Verilog text (``public`` has no effect on
    an Icarus build and is not part of it)."""
    return (
        f"runner={RUNNER_VERSION}",
        "simulator=icarus",
        f"iverilog={iverilog_version()}",
        f"cocotb={version('cocotb')}",
        f"python={sys.version_info[:2]}",
        f"top={toplevel}",
        f"waves={waves}",
        f"timescale={TIMESCALE}",
    )


def build_options(
    src: Path, toplevel: str, waves: str | None, public: str, jobs: int | None
) -> dict[str, Any]:
    """Harness hook: ``runner.build`` arguments.

    ``-g2005`` after the runner's ``-g2012`` (the last generation flag wins): the Verilog is
    Verilog-2005, and under SystemVerilog rules Icarus runs declaration initialisers before
    time 0 without an event, so Yosys' ``reg \\$auto$verilog_backend… = 0`` trigger never wakes
    the ``always @*`` blocks and every combinational process whose inputs stay constant keeps
    ``x`` (found on the link engine: the weight-command stage and kind read ``x`` until they
    first change). A tracing build adds :data:`DUMP_MODULE` as a second root instead of the
    runner's own, which is SystemVerilog (a ``string``). ``public`` and ``jobs`` have no
    effect.
    """
    sources, args = [src], ["-g2005"]
    if waves is not None:
        dump = src.parent / f"{DUMP_MODULE}.v"
        dump.write_text(_DUMP_VERILOG.format(module=DUMP_MODULE, top=toplevel))
        sources.append(dump)
        args += ["-s", DUMP_MODULE]
    return {
        "sources": sources,
        "build_args": args,
        "waves": False,  # the runner's dump module is SystemVerilog: ours is added above
        "timescale": TIMESCALE,
    }


#: Top module of a tracing build's dump (``$dumpfile`` + ``$dumpvars``), a second root.
DUMP_MODULE = "pipetrain_iverilog_dump"
_DUMP_VERILOG = """module {module};
  reg [8*1024-1:0] path;
  initial begin
    if ($value$plusargs("dumpfile_path=%s", path)) $dumpfile(path);
    $dumpvars(0, {top});
  end
endmodule
"""


def binary(directory: Path, toplevel: str) -> Path:
    """Harness hook: the file a finished build has (the compiled ``vvp`` program)."""
    return directory / "sim.vvp"


@contextlib.contextmanager
def build_context(root: Path, directory: Path, waves: str | None) -> Iterator[None]:
    """Harness hook around the runner's build: nothing to prepare."""
    yield


def runner(waves: str | None) -> Any:
    """Harness hook: cocotb's Icarus runner; for a VCD build one whose ``vvp`` call asks for
    VCD instead of the runner's fixed ``-fst``."""
    from cocotb_tools.runner import Icarus

    if waves != "vcd":
        return Icarus()

    class _IcarusVCD(Icarus):
        def _test_command(self) -> list[Any]:
            return [["-vcd" if a == "-fst" else a for a in cmd] for cmd in super()._test_command()]

    return _IcarusVCD()


def test_options(waves_file: Path | None) -> dict[str, Any]:
    """Harness hook: ``runner.test`` arguments recording a trace to ``waves_file`` (``-none``
    from the runner turns tracing off otherwise)."""
    if waves_file is None:
        return {}
    return {"waves": True, "plusargs": [f"+dumpfile_path={waves_file}"]}
