"""Board build reports for the benchmark, cached by plan hash + board (YoWASP builds are slow).

:func:`board_result` returns one record per (model, board): achieved Fmax and utilisation from
nextpnr's report (via :func:`pipetrain.host.bitstream.build_design`), or why the model does not
fit (needed vs available, from the plan's fit check or from the synthesised netlist). Records
live in ``<cache>/boards/<plan hash>-<board>.json``; the plan is the one ``pipetrain build``
would use (:func:`measure.compile_board_design`: the compiler's lanes, one lane per stage when
those do not fit, the formats calibrated as the command does). The record also stores the
HDL source hash it was built from, so a caller can tell a report built from older HDL
(``stale``). :func:`import_build` puts a ``pipetrain build --json`` report in the cache.

Cold cost (this project's 2-core machine, YoWASP 0.5x): ECP5 builds of these models take
~7–20 min each (Yosys ~1 min, nextpnr-ecp5 the rest); an iCE40 fit failure found in synthesis
costs ~1–2 min. A cached record costs one compile (~2 s).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from pipetrain.compiler.fit import FitError, check_fit
from pipetrain.compiler.targets import Board, get_board
from pipetrain.sim.tb.network import hdl_source_hash

__all__ = [
    "REPO",
    "board_key",
    "board_result",
    "default_cache_dir",
    "fit_rows",
    "import_build",
    "import_records",
]

#: Repository root (YoWASP tools need a build directory relative to the working directory).
REPO = Path(__file__).resolve().parents[1]


def default_cache_dir() -> Path:
    """``$PIPETRAIN_BENCH_CACHE`` or ``~/.cache/pipetrain/bench``."""
    env = os.environ.get("PIPETRAIN_BENCH_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "pipetrain" / "bench"


def board_key(plan_hash: str, board: str) -> str:
    """Cache key of a board record: ``<plan hash>-<board>``."""
    return f"{plan_hash}-{board}"


def fit_rows(plan: Any, board: Board) -> dict[str, dict[str, int]]:
    """``{resource: {needed, available}}`` of the plan against the board, without raising.

    The same rows as :func:`pipetrain.compiler.fit.check_fit` (multiplier blocks of the board's
    DSP width, memory bits, the board's block-RAM bits needed vs available).
    """
    try:
        return check_fit(plan, board)
    except FitError as exc:
        return exc.rows


def _synth_needs(board: Board, rpt: Path) -> dict[str, dict[str, int]]:
    """Hard-block counts of the synthesised netlist vs the board (from the Yosys log)."""
    from pipetrain.host.bitstream import synth_cells

    if not rpt.is_file():
        return {}
    cells = synth_cells(rpt.read_text(errors="replace"))
    types = {
        "ice40": {"multipliers": ("SB_MAC16",), "bram_blocks": ("SB_RAM40_4K",)},
        "ecp5": {"multipliers": ("MULT18X18D",), "bram_blocks": ("DP16KD",)},
    }[board.family]
    types["luts"] = ("SB_LUT4",) if board.family == "ice40" else ("LUT4",)
    return {
        field: {"needed": sum(cells.get(t, 0) for t in ts), "available": getattr(board, field)}
        for field, ts in types.items()
    }


def board_result(
    model: str,
    board_name: str,
    *,
    cache_dir: Path | None = None,
    build: bool = True,
    require_current_hdl: bool = False,
    timeout_s: float = 3600.0,
    echo: Any = print,
    clock_hz: float | None = None,
    out_dir: str | None = None,
) -> dict[str, Any]:
    """Return the board record of ``model`` on ``board_name`` (cached, building if needed).

    Record keys: ``model``, ``board``, ``plan_hash``, ``lanes`` (per stage), ``fits`` (bool),
    ``fit`` (plan-level needed/available rows), ``status`` (``built`` | ``no_fit_plan`` |
    ``no_fit_synth`` | ``build_failed`` | ``missing``), ``fmax_mhz`` and ``clock_mhz`` (MHz;
    built only), ``timing_met``, ``utilization``, ``build_s`` (seconds of the build that made
    the record), ``reason`` (text, when it does not fit or failed), ``synth`` (synthesised
    hard blocks vs available, synthesis failures), ``hdl_hash`` (the HDL the record was built
    from), ``cached`` (this call reused it), ``stale`` (``hdl_hash`` differs from the current
    HDL), ``plan_changed`` (the current plan hash, when the record was made for another plan
    hash of the same model, board, lanes and resource totals — reused only when not building
    for current HDL; with ``build=False`` also a built report of the same lanes whose resource
    totals differ, then ``fit_changed``).

    ``build=False`` never runs the toolchain (a missing record gives ``status: missing``);
    ``require_current_hdl`` rebuilds a record made from other HDL. Build folders are
    ``build/bench/<model>-<board>`` under the repository root (``out_dir``: another folder
    relative to it). ``clock_hz``: the network clock the build constrains (through the board's
    PLL; default the board's clock), recorded as ``constraint_mhz``: nextpnr optimises timing
    only up to its constraint, so an Fmax above the board clock is measured at a higher one
    (docs/boards.md §4.2). With ``clock_hz`` given a record of another constraint is rebuilt
    when building; without it a record of any constraint is returned.
    """
    from measure import compile_board_design
    from pipetrain.host.bitstream import BuildError

    board = get_board(board_name)
    cache = (cache_dir or default_cache_dir()) / "boards"
    cache.mkdir(parents=True, exist_ok=True)
    hdl = hdl_source_hash()
    base: dict[str, Any] = {"model": model, "board": board.name}
    # fitting falls back to one lane per stage and raises (with that plan) when even
    # the fallback does not fit
    try:
        plan = compile_board_design(model, board, seed=0).plan
    except FitError as exc:
        plan = exc.plan
        return base | {
            "plan_hash": plan.hash,
            "lanes": [s.lanes for s in plan.stages],
            "fits": False,
            "status": "no_fit_plan",
            "fit": fit_rows(plan, board),
            "reason": str(exc),
            "hdl_hash": hdl,
            "cached": False,
            "stale": False,
        }
    key = board_key(plan.hash, board.name)
    path = cache / f"{key}.json"
    base |= {"plan_hash": plan.hash, "lanes": [s.lanes for s in plan.stages]}
    constraint_mhz = (clock_hz or board.clock_hz) / 1e6
    if path.is_file():
        rec = json.loads(path.read_text())
        stale = rec.get("hdl_hash") != hdl
        # a given clock_hz wants a record built at it; without one any constraint serves
        other_clock = clock_hz is not None and (
            rec.get("constraint_mhz", board.clock_hz / 1e6) != constraint_mhz
        )
        if not ((stale and require_current_hdl or other_clock) and build):
            return rec | {"cached": True, "stale": stale}
    elif not (require_current_hdl and build):
        # the plan hash also changes with fields the hardware ignores (e.g. the format of the
        # training settings): reuse a report of the same model, board, lanes and resource
        # totals, marked stale
        fit = fit_rows(plan, board)
        same_lanes = []
        for other in sorted(cache.glob(f"*-{board.name}.json")):
            rec = json.loads(other.read_text())
            if rec.get("model") == model and rec.get("lanes") == base["lanes"]:
                if rec.get("fit") == fit:
                    return rec | {"cached": True, "stale": True, "plan_changed": plan.hash}
                if rec.get("status") == "built":
                    same_lanes.append(rec)
        if same_lanes and not build:
            # only when asked not to build: the newest report of the same lanes, though the
            # memories changed since (``fit_changed``), rather than none
            rec = max(same_lanes, key=lambda r: r.get("built_at", ""))
            return rec | {
                "cached": True,
                "stale": True,
                "plan_changed": plan.hash,
                "fit_changed": True,
            }
    if not build:
        return base | {
            "fits": None,
            "status": "missing",
            "fit": fit_rows(plan, board),
            "reason": "no cached build report (run without --quick to build it)",
            "hdl_hash": hdl,
            "cached": False,
            "stale": False,
        }
    from pipetrain.hdl.board import BoardTop, network_core

    out = Path(out_dir) if out_dir else Path("build") / "bench" / f"{Path(model).stem}-{board.name}"
    fit = fit_rows(plan, board)
    echo(f"  building {model} for {board.name} in {out} (YoWASP; minutes) ...")
    t0 = time.monotonic()
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        if clock_hz is None:
            top = BoardTop(board, lambda: network_core(plan))
        else:
            core = lambda: network_core(plan, clock_hz=clock_hz)  # noqa: E731
            top = BoardTop(board, core, clock_hz=clock_hz)
        res = build_design(board, top, out, timeout_s=timeout_s, echo=echo)
        rec = base | {
            "fits": True,
            "status": "built",
            "fit": fit,
            "fmax_mhz": res["fmax_mhz"],
            "clock_mhz": res["clock_mhz"],
            "timing_met": res["timing_met"],
            "utilization": {k: v for k, v in res["utilization"].items() if k != "raw"},
            "build_s": _build_seconds(res, REPO / out),
            "constraint_mhz": constraint_mhz,
        }
    except FitError as exc:
        rec = base | {
            "fits": False,
            "status": "no_fit_synth",
            "fit": fit,
            "reason": str(exc),
            "synth": _synth_needs(board, REPO / out / "top.rpt"),
            "build_s": round(time.monotonic() - t0, 1),
        }
    except BuildError as exc:
        rec = base | {
            "fits": None,
            "status": "build_failed",
            "fit": fit,
            "reason": str(exc),
            "build_s": round(time.monotonic() - t0, 1),
        }
        return rec | {"hdl_hash": hdl, "cached": False, "stale": False}  # not cached: retry
    finally:
        os.chdir(cwd)
    rec |= {"hdl_hash": hdl, "built_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    path.write_text(json.dumps(rec, indent=2) + "\n")
    return rec | {"cached": False, "stale": False}


def _build_seconds(res: dict[str, Any], out: Path) -> float:
    """Seconds the build took: this call's, or — when ``build_design`` reused a finished build
    of the same design digest in ``out`` — the recorded ones of that build (``build.json``)."""
    if res.get("cached"):
        try:
            return float(json.loads((out / "build.json").read_text())["build_s"])
        except (OSError, KeyError, ValueError):
            pass
    return res["build_s"]


def import_records(results_json: Path, cache_dir: Path | None = None) -> list[str]:
    """Copy the built board reports of a ``results.json`` (:mod:`run`'s output) into the cache.

    Each goes to ``<cache>/boards/<its plan hash>-<board>.json`` unless that file exists, with
    its own ``hdl_hash`` and ``built_at``, so :func:`board_result` reuses it only as a stale
    report (a full run with ``--reuse-stale-boards``, or ``--quick``). For a machine whose cache
    is empty where the board builds would take hours. Returns the keys written.
    """
    keep = (
        "model board plan_hash lanes fits status fit fmax_mhz clock_mhz timing_met "
        "utilization build_s hdl_hash built_at constraint_mhz"
    ).split()
    cache = (cache_dir or default_cache_dir()) / "boards"
    cache.mkdir(parents=True, exist_ok=True)
    written = []
    for m in json.loads(Path(results_json).read_text())["models"]:
        for rec in m["boards"].values():
            if rec.get("status") != "built" or "hdl_hash" not in rec:
                continue
            key = board_key(rec["plan_hash"], rec["board"])
            path = cache / f"{key}.json"
            if not path.is_file():
                path.write_text(json.dumps({k: rec[k] for k in keep if k in rec}, indent=2) + "\n")
                written.append(key)
    return written


def import_build(report_json: Path, cache_dir: Path | None = None) -> tuple[str, bool]:
    """Put a ``pipetrain build --json`` report (or its build folder's ``build.json``) into the
    cache as the record of its plan hash and board; return ``(key, stale)``.

    For a board the benchmark would otherwise rebuild (1–2 h each for the filled ULX3S designs
    on this project's 2-core machine) when ``pipetrain build`` has already built the same plan.
    The record keeps the report's ``hdl_hash`` (``pipetrain build`` records it since this
    function exists; an older report has none, so its record is ``stale`` and a full run uses
    it only with ``--reuse-stale-boards``); ``constraint_mhz`` is the clock of the report's last
    nextpnr pass; ``built_at`` the report file's time. A cached record is replaced only by a
    newer build. Raises :class:`ValueError` naming the file for a report that is not a
    successful model build (a loopback design, missing Fmax or plan hash).
    """
    path = Path(report_json)
    rep = json.loads(path.read_text())
    missing = [k for k in ("design", "board", "plan_hash", "lanes", "fmax_mhz") if k not in rep]
    if missing or rep.get("design") == "uart-loopback":
        raise ValueError(
            f"{path}: not a model build report of `pipetrain build --json` "
            f"(missing {', '.join(missing) or 'a model: a loopback build'})"
        )
    board = get_board(rep["board"])
    passes = (rep.get("clock") or {}).get("passes") or [{"clock_mhz": rep["clock_mhz"]}]
    built_at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(path.stat().st_mtime))
    rec = {
        "model": rep["design"],
        "board": board.name,
        "plan_hash": rep["plan_hash"],
        "lanes": rep["lanes"],
        "fits": True,
        "status": "built",
        "fit": rep.get("fit", {}),
        "fmax_mhz": rep["fmax_mhz"],
        "clock_mhz": rep["clock_mhz"],
        "timing_met": rep["timing_met"],
        "utilization": {k: v for k, v in rep.get("utilization", {}).items() if k != "raw"},
        "build_s": rep.get("build_s"),
        "constraint_mhz": passes[-1]["clock_mhz"],
        "hdl_hash": rep.get("hdl_hash"),
        "built_at": built_at,
    }
    cache = (cache_dir or default_cache_dir()) / "boards"
    cache.mkdir(parents=True, exist_ok=True)
    key = board_key(rec["plan_hash"], board.name)
    target = cache / f"{key}.json"
    stale = rec["hdl_hash"] != hdl_source_hash()
    if target.is_file() and json.loads(target.read_text()).get("built_at", "") >= built_at:
        return key, stale  # the cached record is as new: kept
    target.write_text(json.dumps(rec, indent=2) + "\n")
    return key, stale


def build_design(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """:func:`pipetrain.host.bitstream.build_design` (imported lazily: it loads Amaranth)."""
    from pipetrain.host.bitstream import build_design as _bd

    return _bd(*args, **kwargs)


if __name__ == "__main__":
    # fill the cache: python benchmarks/board_cache.py BOARD MODEL...
    # or copy a results.json's reports in: python benchmarks/board_cache.py --import FILE
    # or `pipetrain build --json` reports: python benchmarks/board_cache.py --import-build F...
    import sys

    if sys.argv[1] == "--import":
        print("\n".join(import_records(Path(sys.argv[2]))) or "nothing new")
        sys.exit(0)
    if sys.argv[1] == "--import-build":  # python benchmarks/board_cache.py --import-build F...
        for f in sys.argv[2:]:
            try:
                key, stale = import_build(Path(f))
            except (OSError, ValueError) as exc:
                sys.exit(f"error: {exc}")
            print(f"{key}{' (older HDL: stale)' if stale else ''}")
        sys.exit(0)
    for m in sys.argv[2:]:
        r = board_result(m, sys.argv[1])
        print(json.dumps({k: v for k, v in r.items() if k != "utilization"}), flush=True)
