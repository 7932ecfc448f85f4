"""pipetrain benchmarks: hardware efficiency, projected on-board throughput vs CPU, tool speed.

Usage::

    python benchmarks/run.py                  # full run: writes benchmarks/results.{json,md}, PNGs
    python benchmarks/run.py --quick --json - # quick run, JSON on stdout (no files unless --out)
    python benchmarks/run.py --from-json benchmarks/results.json  # re-render, measure nothing

Per model (``mlp-digits``, ``mlp-digits-deep``, ``mlp-digits-wide``), all measured in one run:

1. **Hardware efficiency** — cycles per sample measured in the RTL (Verilator, the
   ``pipetrain sim`` machinery: steady-state spacing of result records, and the run is checked
   bit-exact against the golden model) vs the plan's ``ideal_cycles_per_sample``; the same for
   ``--schedule sequential`` (also in RTL), and their ratio (PB speed-up, ≈ the stage count);
   per-stage lane utilisation from the plan.
2. **Boards against their ceiling, side by side with the CPU peers** (issue 17 item 8). Per board
   (ULX3S: ECP5-85F, iCEBreaker: iCE40UP5K): ``projected_samples_per_s`` = achieved Fmax (nextpnr
   report of the board build) / RTL cycles per sample of the plan fitted to that board
   (``compile_design(board=…)``, the plan in the bitstream, measured in Verilator as well);
   ``ceiling_samples_per_s`` = the board's DSP blocks (``dsp_blocks``, all of them, not the
   design's) × Fmax / the multiplies a sample needs (:func:`measure.multiplies_per_sample`, from the
   plan); the tables' "DSP blocks used/available" column is the design's, from the build's
   ``utilization`` or else the plan's ``fit`` (:func:`_dsp_cell`); ``fraction_of_ceiling`` =
   projected / ceiling; ``board_clock_mhz`` (the oscillator the board top runs the network at today)
   and the rate at it; ``board_samples_per_s``: the real rate at the board's clock through the
   on-chip training set, measured in the board-level RTL simulation (the board top through its UART
   pins, :func:`measure.onchip_board_rate`: the device's own cycle count of a RUN), with
   ``board_samples_ratio`` = it ÷ (board clock ÷ RTL cycles per sample) (issue 17 done-when: ≥ 0.9);
   ``n/a`` with the reason where the set does not fit the board (:data:`BOARD_SAMPLES_NA`); in a
   full run the golden model of the fitted plan is trained for the peers' epochs (the board's test
   accuracy). A model that does not fit gets ``null`` and the needed vs available numbers. CPU peers
   (:mod:`cpu_peers`, one child process at niceness :data:`PEER_NICE`): PyTorch SGD with momentum at
   batch 1, 32, 128 and a batch-1 C loop (``cc -O3 -march=native``), each with samples/s and test
   accuracy after the same epochs, initial weights and order. Board builds are cached by plan hash +
   board (:mod:`board_cache`); ``--quick`` reuses cached reports even when built from older HDL and
   builds only missing ones (``--no-board-builds``: none); a full run also rebuilds reports made
   from older HDL unless ``--reuse-stale-boards`` (they are then marked).
3. **Tool speed** — Verilog generation, Verilator build (rebuilt and timed in a full run; the
   recorded time of the cached build with ``--quick``), RTL simulation cycles/s and samples/s,
   golden model and reference trainer samples/s.
4. **Memory** — per-stage stash and weight bits, and the depth sweep (:mod:`memory_scaling`).

Outputs: ``results.json``, ``results.md`` (date, machine), ``*.png`` in ``--out`` (default
``benchmarks/`` for a full run), and the README's "Benchmarks" table (``--readme``, on by
default for a full run). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import board_cache  # noqa: E402
import cpu_peers  # noqa: E402
import measure  # noqa: E402
import memory_scaling  # noqa: E402
from pipetrain.host.cli.options import DEFAULT_EPOCHS  # noqa: E402  (the peers' epochs)

__all__ = ["MODELS", "BOARDS", "Settings", "run", "render_markdown", "main"]

MODELS = ("mlp-digits", "mlp-digits-deep", "mlp-digits-wide")
BOARDS = ("ulx3s-85f", "icebreaker")
README_START = "<!-- benchmarks:start -->"
README_END = "<!-- benchmarks:end -->"
#: Niceness of the CPU peers' process (the machine is shared; falls back when not allowed).
PEER_NICE = -5
SUMMARY_NOTE = (
    "DSP blocks used/available: the design's, from the board build (nextpnr); *(plan)*: the "
    "fit estimate of the plan fitted to the board, where it is not built. "
    "Ceiling = the board's DSP blocks (ECP5-85F: 156 MULT18X18D, UP5K: 8 SB_MAC16) × achieved "
    "Fmax ÷ the multiplies a sample needs (forward and weight gradient for every weight, bias "
    "included, plus the input gradient for every weight after stage 1: "
    "`measure.multiplies_per_sample`, from the plan) — every block busy every cycle. "
    "Projected = achieved Fmax (nextpnr) ÷ the RTL cycles/sample of the plan fitted to that "
    "board (Verilator); fraction = projected ÷ ceiling. Board clock: what the board top runs "
    "the network at (its PLL's network clock), and the rate that gives. Board samples/s: the "
    "real rate at that clock through the on-chip training set (`train --on-chip-data`), "
    "measured in the board-level RTL simulation — the board top through its UART pins, the "
    "device's own cycle count of a RUN over a stored subset of the digits training split, "
    "bit-exact with the golden model (`measure.onchip_board_rate`); n/a where the set does "
    "not fit the board. Test acc (golden): the golden model of the board's plan "
    "(bit-exact with the RTL) after {epochs} epochs. CPU peers: the same net, initial weights, "
    "epochs and sample order on one core, float32 — samples/s (test accuracy): see §2."
)
PEER_NOTE = (
    "CPU peers (`benchmarks/cpu_peers.py`, one child process, serially): `torch_bB` = "
    "`torch.optim.SGD` with momentum at batch B, η_B and m_B from the project's batch-1 "
    "η₁ = 0.002, m₁ = 0.9 by the inverse of its scaling rule (docs/architecture.md §2.3: "
    "m_B = m₁^B, η_B = η₁·B·(1 − m_B)/(1 − m₁)), the faster of 1 thread and the default "
    "threads; `compiled_b1` = `benchmarks/sgd_b1.c`, batch-1 SGD with momentum, "
    "`cc -O3 -march=native`, through ctypes. Samples/s: samples trained per wall second of "
    "the training loop, the best of `reps` whole runs from the initial weights (median "
    "beside it; samples/CPU-s: per second of this process's CPU time, what an unloaded core "
    "would do). Load (1 min): the load average when the peer started."
)
#: ``board_samples_per_s`` where the on-chip training set was not measured (issue 17 item 6):
#: the board cannot hold it, or the run skips the measurement (``--no-onchip``).
BOARD_SAMPLES_NA = "n/a (on-chip training set not measured)"


class Settings:
    """Sample counts and what to rebuild, per mode (``quick`` or ``full``).

    Members
    -------
    quick: the mode.
    rtl_samples, seq_samples: samples streamed through the RTL (pb, sequential).
    golden_samples, reference_samples: samples for the golden / reference trainer rates.
    epochs: epochs of every CPU peer and of the boards' golden-model accuracy (those of
        ``pipetrain train``).
    board_accuracy: train the golden model of every fitted board plan for ``epochs`` epochs
        (full run only: minutes).
    nice: niceness the CPU peers run at (their own child process; :mod:`cpu_peers`).
    verilog_models: models whose Verilog generation is timed (all in a full run).
    fresh_verilator: rebuild the Verilator model to time it (full run) or report the cached
        build's recorded time (quick).
    board_build: build missing board reports; ``board_current``: rebuild reports made from
        other HDL (full run).
    onchip, onchip_samples: measure ``board_samples_per_s`` through the on-chip training set
        (the board-level RTL simulation, :func:`measure.onchip_board_rate`) with that many
        samples stored (4 epochs).
    """

    def __init__(
        self,
        quick: bool,
        board_builds: bool = True,
        reuse_stale: bool = False,
        onchip: bool = True,
    ) -> None:
        self.quick = quick
        self.onchip = onchip
        self.onchip_samples = 64 if quick else 128
        self.rtl_samples = 64 if quick else 300
        self.seq_samples = 24 if quick else 100
        self.golden_samples = 400 if quick else 1437
        self.reference_samples = 500 if quick else 1437
        self.epochs = DEFAULT_EPOCHS
        self.board_accuracy = not quick
        self.nice = PEER_NICE
        self.fresh_verilator = not quick
        self.verilog_all = not quick
        self.board_build = board_builds
        self.board_current = not quick and not reuse_stale


def log(msg: str) -> None:
    """Progress line on stderr (stdout may carry the JSON)."""
    print(msg, file=sys.stderr, flush=True)


def machine_info() -> dict[str, Any]:
    """CPU model, cores and software versions of this machine."""
    import torch

    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }


class _Timer:
    def __init__(self) -> None:
        self.phases: dict[str, float] = {}

    def __call__(self, name: str) -> _Phase:
        return _Phase(self, name)


class _Phase:
    def __init__(self, timer: _Timer, name: str) -> None:
        self.timer, self.name = timer, name

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        dt = time.perf_counter() - self.t0
        self.timer.phases[self.name] = self.timer.phases.get(self.name, 0.0) + dt


def _load() -> list[float]:
    """:func:`os.getloadavg` (1, 5, 15 min), rounded: recorded next to every timing."""
    return [round(v, 2) for v in os.getloadavg()]


def cpu_peer_run(models: tuple[str, ...], st: Settings) -> dict[str, Any]:
    """Run :mod:`cpu_peers` for ``models`` in a child process at niceness ``st.nice``.

    One process, models one after another (serially, nothing else of this run in parallel);
    the child sets its niceness before torch starts threads. Returns its JSON (``nice``,
    ``epochs``, ``models``: ``{model: {peer: record}}``) plus ``wall_s``.
    Raises :class:`RuntimeError` with the child's last error line when it fails.
    """
    import subprocess

    cmd = [sys.executable, str(HERE / "cpu_peers.py"), "--models", ",".join(models)]
    cmd += ["--epochs", str(st.epochs), "--nice", str(st.nice), "--json", "-"]
    if st.quick:
        cmd.append("--quick")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"benchmarks/cpu_peers.py failed ({proc.returncode}): {last}")
    return json.loads(proc.stdout) | {"wall_s": time.perf_counter() - t0}


#: A CPU peer "learns" when its test accuracy is at most this below torch_b1's (the batch-1
#: run the hardware mirrors) after the same epochs; a faster peer that does not is shown, but
#: not counted as the CPU's best.
LEARN_MARGIN = 0.05


def best_learning_peer(peers: dict[str, Any]) -> tuple[str | None, float | None]:
    """``(name, samples/s)`` of the fastest peer whose test accuracy is within
    :data:`LEARN_MARGIN` of ``torch_b1``'s; ``(None, None)`` when none has a rate."""
    ref = (peers.get("torch_b1") or {}).get("test_accuracy") or 0.0
    ok = {
        k: v["samples_per_s"]
        for k, v in peers.items()
        if v.get("samples_per_s") and (v.get("test_accuracy") or 0.0) >= ref - LEARN_MARGIN
    }
    if not ok:
        return None, None
    name = max(ok, key=ok.__getitem__)
    return name, ok[name]


def _link_bound(plan: Any, baud: int) -> float:
    """Upper bound of samples/s over an 8N1 UART at ``baud``: only the sample record's bytes
    (:class:`pipetrain.protocol.wire.LinkParams` ``record_bytes``), 10 line bits per byte;
    frame headers, CRC and result reads lower it further."""
    from pipetrain.protocol.wire import LinkParams

    return baud / 10 / LinkParams.from_plan(plan).record_bytes


def _onchip_rate(rec: dict[str, Any], name: str, board: str, st: Settings, timer: _Timer) -> None:
    """``board_samples_per_s`` of ``rec`` through the on-chip training set (or the reason it is
    n/a: the set does not fit the board)."""
    from pipetrain.compiler.fit import FitError

    log(f"[{name}] board {board}: on-chip training set, board-level RTL sim ...")
    try:
        with timer("onchip"):
            m = measure.onchip_board_rate(name, board, samples=st.onchip_samples)
    except FitError as exc:
        rec["board_samples_note"] = f"n/a ({exc})"
        return
    rec["onchip"] = m
    rec["board_samples_per_s"] = m["board_samples_per_s"]
    rec["board_samples_note"] = None
    if rec.get("rtl_cycles_per_sample"):
        rec["board_samples_ratio"] = m["board_samples_per_s"] / (
            m["clock_hz"] / rec["rtl_cycles_per_sample"]
        )


def bench_model(
    name: str,
    st: Settings,
    timer: _Timer,
    cache_dir: Path,
    boards: tuple[str, ...],
    peers: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Measure one model (``peers``: its CPU peers, :func:`cpu_peer_run`); return ``(model
    record, tools record)``."""
    from pipetrain.compiler.targets import get_board

    log(f"[{name}] compiling (auto formats) ...")
    with timer("compile"):
        pb = measure.compile_design(name, "pb")
        lanes = tuple(s.lanes for s in pb.plan.stages)
        seq = measure.compile_design(name, "sequential", lanes=lanes)
    tools: dict[str, Any] = {}
    if st.verilog_all or name == MODELS[0]:
        log(f"[{name}] timing Verilog generation ...")
        with timer("verilog"):
            v = measure.verilog_time(pb.plan)
        tools |= {"verilog_s": v["verilog_s"], "verilog_bytes": v["verilog_bytes"]}
        with timer("verilator_build"):
            log(f"[{name}] Verilator build ({'fresh' if st.fresh_verilator else 'cached'}) ...")
            tools |= measure.verilator_build_time(v["verilog"], st.fresh_verilator)
    log(f"[{name}] RTL pb, {st.rtl_samples} samples ...")
    with timer("rtl_sim"):
        rtl_pb = measure.rtl_run(pb, st.rtl_samples)
        log(f"[{name}] RTL sequential, {st.seq_samples} samples ...")
        rtl_seq = measure.rtl_run(seq, st.seq_samples)
    for k in ("sim_cycles_per_s", "train_cycles_per_s", "rtl_samples_per_s", "build_s"):
        tools[f"rtl_{k}" if not k.startswith("rtl_") else k] = rtl_pb[k]
    tools["rtl_build_cached"] = rtl_pb["build_cached"]
    tools["rtl_sequential_build_s"] = rtl_seq["build_s"]
    log(f"[{name}] golden / reference speed ...")
    with timer("cpu_rates"):
        g = measure.trainer_speed(pb, "golden", st.golden_samples) | {"loadavg": _load()}
        r = measure.trainer_speed(pb, "reference", st.reference_samples) | {"loadavg": _load()}
    tools |= {
        "golden_samples_per_s": g["samples_per_s"],
        "golden_samples_per_cpu_s": g["samples_per_cpu_s"],
        "reference_samples_per_s": r["samples_per_s"],
        "reference_samples_per_cpu_s": r["samples_per_cpu_s"],
        "loadavg": _load(),
    }
    best_peer, best_rate = best_learning_peer(peers)
    rtl_by_plan = {pb.plan.hash: rtl_pb}
    acc_by_plan: dict[str, Any] = {}
    board_recs: dict[str, Any] = {}
    projected: dict[str, float | None] = {}
    for bname in boards:
        board = get_board(bname)
        log(f"[{name}] board {bname} ...")
        with timer("boards"):
            rec = board_cache.board_result(
                name,
                bname,
                cache_dir=cache_dir,
                build=st.board_build,
                require_current_hdl=st.board_current,
                echo=log,
            )
        rec = {k: v for k, v in rec.items() if k != "utilization"} | {
            "utilization": rec.get("utilization", {})
        }
        rec["link_bound_samples_per_s"] = _link_bound(pb.plan, board.baud)
        rec |= {
            "dsp_blocks": board.multipliers,
            "multiplies_per_sample": measure.multiplies_per_sample(pb.plan),
            "board_clock_mhz": board.clock_hz / 1e6,
            "board_samples_per_s": None,
            "board_samples_note": BOARD_SAMPLES_NA,
        }
        proj = None
        if rec.get("status") == "built" and rec.get("fmax_mhz"):
            key = rec.get("plan_changed") or rec["plan_hash"]  # the plan the board runs now
            design = None
            if key not in rtl_by_plan:  # the board runs its fitted plan: measure that one
                log(f"[{name}] RTL pb, the plan fitted to {bname} ({key}) ...")
                with timer("rtl_sim"):
                    design = measure.compile_board_design(name, bname)
                    if design.plan.hash != key:
                        raise RuntimeError(
                            f"{name} on {bname}: the board record was built from plan {key}, "
                            f"compile_design(board=…) now gives {design.plan.hash}"
                        )
                    rtl_by_plan[key] = measure.rtl_run(design, st.seq_samples) | {
                        "loadavg": _load()
                    }
            cps = rtl_by_plan[key]["cycles_per_sample"]
            proj = rec["fmax_mhz"] * 1e6 / cps
            ceiling = measure.ceiling_samples_per_s(pb.plan, board.multipliers, rec["fmax_mhz"])
            rec["rtl_cycles_per_sample"] = cps
            rec["projected_samples_per_s"] = proj
            rec["ceiling_samples_per_s"] = ceiling
            rec["fraction_of_ceiling"] = proj / ceiling
            rec["board_clock_samples_per_s"] = board.clock_hz / cps
            if st.onchip:
                _onchip_rate(rec, name, bname, st, timer)
            if best_rate:
                rec["vs_best_cpu"] = proj / best_rate
            if st.board_accuracy:
                log(f"[{name}] golden model of the {bname} plan, {st.epochs} epochs ...")
                with timer("board_accuracy"):
                    if key not in acc_by_plan:
                        d = design or (pb if key == pb.plan.hash else None)
                        d = d or measure.compile_board_design(name, bname)
                        acc_by_plan[key] = measure.golden_accuracy(d, st.epochs)
                rec["golden"] = acc_by_plan[key]
        board_recs[bname] = rec
        projected[bname] = proj
    speedup = rtl_seq["cycles_per_sample"] / rtl_pb["cycles_per_sample"]
    model = {
        "name": name,
        "cycles_per_sample": rtl_pb["cycles_per_sample"],
        "ideal_cycles_per_sample": pb.plan.ideal_cycles_per_sample,
        "pb_vs_sequential_speedup": speedup,
        "stages": len(pb.plan.stages),
        "projected_samples_per_s": projected,
        "cpu": peers,
        "best_cpu_peer": best_peer,
        "best_cpu_samples_per_s": best_rate,
        "plan_hash": pb.plan.hash,
        "lanes": list(lanes),
        "shape": [pb.plan.in_features] + [s.out_features for s in pb.plan.stages],
        "tick_cycles": pb.plan.tick_cycles,
        "rtl": {"pb": rtl_pb, "sequential": rtl_seq},
        "sequential_cycles_per_sample": rtl_seq["cycles_per_sample"],
        "sequential_ideal_cycles_per_sample": seq.plan.ideal_cycles_per_sample,
        "bit_exact": rtl_pb["bit_exact"] and rtl_seq["bit_exact"],
        "stage_utilisation": measure.stage_utilisation(pb.plan),
        "mac_util": sum(s.out_features * (s.in_features + 1) for s in pb.plan.stages)
        / (sum(s.mac_lanes for s in pb.plan.stages) * pb.plan.tick_cycles),
        "memory": {
            "memory_bits": pb.plan.memory_bits,
            "stash_bits": sum(s.stash_bits for s in pb.plan.stages),
            "weight_bits": sum(s.weight_bits for s in pb.plan.stages),
            "velocity_bits": sum(s.velocity_bits for s in pb.plan.stages),
            "multipliers": pb.plan.multipliers,
            "memory_blocks": pb.plan.memory_blocks,
        },
        "boards": board_recs,
        "golden": g,
        "reference": r,
    }
    return model, tools


def run(
    quick: bool,
    models: tuple[str, ...] = MODELS,
    boards: tuple[str, ...] = BOARDS,
    cache_dir: Path | None = None,
    board_builds: bool = True,
    depths: range | list[int] = range(2, 17),
    reuse_stale: bool = False,
    onchip: bool = True,
) -> dict[str, Any]:
    """Run every measurement; return the results dict (the ``--json`` payload).

    ``board_builds=False`` never runs YoWASP (missing reports stay missing); ``reuse_stale``
    keeps board reports built from older HDL in a full run (``--quick`` always does);
    ``onchip=False`` skips the on-chip training set's board-level simulations.
    """
    st = Settings(quick, board_builds, reuse_stale, onchip)
    timer = _Timer()
    t0 = time.perf_counter()
    load0 = os.getloadavg()
    cache = cache_dir or board_cache.default_cache_dir()
    out_models, tools = [], {}
    log(f"CPU peers ({', '.join(cpu_peers.PEERS)}), one child process at nice {st.nice} ...")
    with timer("cpu_peers"):
        peer_res = cpu_peer_run(models, st)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lane-idle PlanWarnings: reported as utilisation
        for name in models:
            m, t = bench_model(name, st, timer, cache, boards, peer_res["models"][name])
            out_models.append(m)
            tools[name] = t
        log("memory sweep over depths (plans only) ...")
        with timer("memory_sweep"):
            mem = memory_scaling.sweep(depths)
    verilator = sum(
        (m["rtl"][k].get("verilator_build_s_recorded") or 0.0)
        for m in out_models
        for k in ("pb", "sequential")
    )
    board_s = sum(
        (b.get("build_s") or 0.0)
        for m in out_models
        for b in m["boards"].values()
        if b.get("status") in ("built", "no_fit_synth")
    )
    return {
        "meta": {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "mode": "quick" if quick else "full",
            "machine": machine_info(),
            "settings": {k: v for k, v in vars(st).items()},
            "run_s": time.perf_counter() - t0,
            "loadavg_start": load0,
            "loadavg_end": os.getloadavg(),
            "cold_extra_s": {
                "verilator_builds": verilator,
                "board_builds": board_s,
                "note": "a cold run adds these (recorded when the cached builds were made) "
                "plus the first YoWASP run compiling each tool's WebAssembly (1–2.5 min each)",
            },
            "phases_s": timer.phases,
            "cpu_peers": {k: v for k, v in peer_res.items() if k != "models"},
            "board_cache": str(cache),
        },
        "models": out_models,
        "tools": tools,
        "memory_scaling": mem,
    }


# ---------------------------------------------------------------------------------- output


def _f(v: Any, digits: int = 0) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _table(head: list[str], rows: list[list[str]]) -> str:
    from pipetrain.compiler.report import markdown_table

    return markdown_table(head, rows)


def _board_cell(rec: dict[str, Any], short: bool = False) -> str:
    if short and rec.get("status") in ("no_fit_plan", "no_fit_synth"):
        return "does not fit"
    if rec.get("status") == "built":
        if not rec.get("stale"):
            return f"{rec['fmax_mhz']:.1f} MHz"
        return f"{rec['fmax_mhz']:.1f} MHz (older HDL/plan, built {rec.get('built_at', '?')[:16]})"
    if rec.get("status") in ("no_fit_plan", "no_fit_synth"):
        rows = rec.get("synth") or rec.get("fit") or {}
        over = [
            f"{k} {v['needed']}/{v['available']}"
            for k, v in rows.items()
            if v["needed"] > v["available"]
        ]
        where = "synthesis" if rec["status"] == "no_fit_synth" else "plan"
        return f"does not fit ({where}: {', '.join(over)} needed/available)"
    if rec.get("status") == "missing":
        return "not built yet"
    return rec.get("status", "?")


def _acc(v: Any) -> str:
    return "–" if v is None else f"{v:.3f}"


def _peer_cell(rec: dict[str, Any] | None) -> str:
    """``rate (test accuracy)`` of a CPU peer; a batch peer whose η_B search picked another
    scale adds ``[η×s: accuracy]``; a missing peer ``n/a (reason)``."""
    if not rec or rec.get("status") == "n/a" or not rec.get("samples_per_s"):
        return f"n/a ({(rec or {}).get('reason', 'not run')})"
    cell = f"{_f(rec['samples_per_s'])} ({_acc(rec.get('test_accuracy'))})"
    best = (rec.get("lr_search") or {}).get("best")
    if best and best["lr_scale"] != 1.0:
        cell += f" [η×{best['lr_scale']:g}: {_acc(best['test_accuracy'])}]"
    return cell


def _dsp_cell(rec: dict[str, Any]) -> str:
    """``used/available`` DSP blocks of the design on the board: the build's utilisation
    (nextpnr) when there is one, else ``needed/available (plan)`` from the plan's fit rows
    (``compiler.fit.fit_rows``: what the fitted plan needs, more than available for a plan that
    does not fit); ``–/N`` (the board's N) when the record has neither."""
    used = (rec.get("utilization") or {}).get("multipliers")
    if used:
        return f"{used['used']:,}/{used['available']:,}"
    fit = (rec.get("fit") or {}).get("multipliers")
    if fit:
        return f"{fit['needed']:,}/{fit['available']:,} (plan)"
    return f"–/{_f(rec.get('dsp_blocks'))}"


def board_table(res: dict[str, Any]) -> str:
    """Per model and board: the board's figures of issue 17 item 8 (README, results.md)."""
    rows = []
    for m in res["models"]:
        for b, rec in m["boards"].items():
            rows.append(
                [
                    m["name"],
                    b,
                    _board_cell(rec, short=True),
                    _f(rec.get("rtl_cycles_per_sample"), 1),
                    _dsp_cell(rec),
                    _f(rec.get("multiplies_per_sample")),
                    _f(rec.get("ceiling_samples_per_s")),
                    _f(rec.get("projected_samples_per_s")),
                    f"{rec['fraction_of_ceiling']:.3f}" if rec.get("fraction_of_ceiling") else "–",
                    _f(rec.get("board_clock_mhz"), 1),
                    _f(rec.get("board_clock_samples_per_s")),
                    rec.get("board_samples_note") or _f(rec.get("board_samples_per_s")),
                    _acc((rec.get("golden") or {}).get("test_accuracy")),
                ]
            )
    head = [
        "model",
        "board",
        "Fmax",
        "RTL cycles/sample",
        "DSP blocks used/available",
        "multiplies/sample",
        "ceiling samples/s",
        "projected samples/s",
        "fraction of ceiling",
        "board clock MHz",
        "@board clock samples/s",
        "board samples/s",
        "test acc (golden)",
    ]
    return _table(head, rows)


def peer_table(res: dict[str, Any]) -> str:
    """Per model: each CPU peer's samples/s (test accuracy), the best board projection and the
    ratio of the fastest CPU peer to it (README, results.md)."""
    rows = []
    for m in res["models"]:
        proj = {b: v for b, v in m["projected_samples_per_s"].items() if v}
        best_b = max(proj, key=proj.__getitem__) if proj else None
        cpu = m.get("best_cpu_samples_per_s")
        ratio = f"{cpu / proj[best_b]:.2f}×" if best_b and cpu else "–"
        acc = (m["boards"].get(best_b, {}).get("golden") or {}).get("test_accuracy")
        rows.append(
            [m["name"]]
            + [_peer_cell(m["cpu"].get(p)) for p in cpu_peers.PEERS]
            + [
                f"{_f(proj[best_b])} ({_acc(acc)}, {best_b})" if best_b else "–",
                f"{m['best_cpu_peer']}: {ratio}" if m.get("best_cpu_peer") else "–",
            ]
        )
    head = [
        "model",
        *cpu_peers.PEERS,
        "best board, projected",
        "fastest learning CPU ÷ best board",
    ]
    return _table(head, rows)


def summary_table(res: dict[str, Any]) -> str:
    """The headline tables (README): the boards' figures, then the CPU peers beside them."""
    return board_table(res) + "\n\n" + peer_table(res)


def render_markdown(res: dict[str, Any]) -> str:
    """``results.md``: every table of the run, with the date, machine and run times."""
    meta = res["meta"]
    mach = meta["machine"]
    out = [
        "# pipetrain benchmarks",
        "",
        f"Run {meta['date']} ({meta['mode']} mode, {meta['run_s']:.0f} s) on {mach['cpu']}, "
        f"{mach['cores']} cores; Python {mach['python']}, torch {mach['torch']}. "
        "Generated by `python benchmarks/run.py`; numbers in `results.json`.",
        "",
        "## Summary",
        "",
        summary_table(res),
        "",
        SUMMARY_NOTE.format(epochs=res["models"][0]["cpu"]["torch_b1"]["epochs"])
        if res["models"]
        else "",
        "",
        f"Load average (1 min) {meta['loadavg_start'][0]:.1f} at the start, "
        f"{meta['loadavg_end'][0]:.1f} at the end of the run; every timing's record in "
        "`results.json` has its own `loadavg`. CPU peers at niceness "
        f"{meta.get('cpu_peers', {}).get('nice', {}).get('niceness', '?')}.",
        "",
        "## 1. Hardware efficiency (RTL, Verilator)",
        "",
    ]
    rows = []
    for m in res["models"]:
        p, s = m["rtl"]["pb"], m["rtl"]["sequential"]
        rows.append(
            [
                m["name"],
                "→".join(str(v) for v in m["shape"]),
                ",".join(str(v) for v in m["lanes"]),
                _f(p["cycles_per_sample"], 1),
                _f(p["ideal_cycles_per_sample"]),
                _f(s["cycles_per_sample"], 1),
                _f(s["ideal_cycles_per_sample"]),
                f"{m['pb_vs_sequential_speedup']:.2f}×",
                f"{m['mac_util']:.0%}",
                "yes" if m["bit_exact"] else "**NO**",
                f"{p['samples']}/{s['samples']}",
            ]
        )
    out += [
        _table(
            [
                "model",
                "shape",
                "lanes",
                "PB cycles/sample (RTL)",
                "PB ideal",
                "sequential cycles/sample (RTL)",
                "sequential ideal",
                "speed-up",
                "MAC util",
                "bit-exact",
                "samples pb/seq",
            ],
            rows,
        ),
        "",
        "Cycles/sample: steady-state spacing of result records in the RTL run; ideal: the "
        "plan's `ideal_cycles_per_sample` (tick for PB, every stage's forward and backward "
        "pass + loss unit for sequential). MAC util = Σ M·(N+1) ÷ (Σ lanes · tick): useful "
        "multiply-accumulate slots per lane-cycle.",
        "",
        "### Per-stage lane utilisation (PB)",
        "",
    ]
    rows = []
    for m in res["models"]:
        for u in m["stage_utilisation"]:
            rows.append(
                [
                    m["name"],
                    str(u["stage"]),
                    u["shape"],
                    str(u["lanes"]),
                    str(u["delay"]),
                    f"{u['lane_slot_util']:.0%}",
                    str(u["cycles_per_tick"]),
                    str(u["pass_cycles"]),
                    str(u["tick_cycles"]),
                    f"{u['tick_share']:.0%}",
                    f"{u['mac_util']:.0%}",
                ]
            )
    out += [
        _table(
            [
                "model",
                "stage",
                "N→M",
                "lanes",
                "D_s",
                "lane-slot util",
                "slots (cycles)",
                "pass cycles",
                "tick",
                "pass/tick",
                "MAC util",
            ],
            rows,
        ),
        "",
        "Lane-slot util = M ÷ (⌈M/L⌉·L); pass cycles = slots + pipeline latency; "
        "MAC util = M·(N+1) ÷ (L·tick).",
        "",
        "## 2. Projected on-board throughput vs CPU",
        "",
    ]
    rows = []
    for m in res["models"]:
        for b, rec in m["boards"].items():
            u = rec.get("utilization") or {}

            def used(k: str, u: dict = u) -> str:
                return f"{u[k]['used']}/{u[k]['available']}" if k in u else "–"

            rows.append(
                [
                    m["name"],
                    b,
                    ",".join(str(v) for v in rec.get("lanes", [])),
                    _board_cell(rec),
                    _f(rec.get("clock_mhz"), 1),
                    used("luts"),
                    used("multipliers"),
                    used("bram_blocks"),
                    _f(rec.get("projected_samples_per_s")),
                    _f(rec.get("board_clock_samples_per_s")),
                    _f(rec.get("link_bound_samples_per_s")),
                    _f(m.get("best_cpu_samples_per_s")),
                    f"{rec['vs_best_cpu']:.2f}×" if rec.get("vs_best_cpu") else "–",
                    _f(rec.get("build_s"), 0),
                ]
            )
    out += [
        _table(
            [
                "model",
                "board",
                "lanes",
                "Fmax / fit",
                "board clock MHz",
                "LUTs",
                "multipliers",
                "BRAM",
                "samples/s @Fmax",
                "@board clock",
                "UART bound",
                "fastest learning CPU peer",
                "@Fmax ÷ CPU",
                "build s",
            ],
            rows,
        ),
        "",
        "UART bound: the board's baud rate (ULX3S 3 Mbaud, iCEBreaker 1 Mbaud) 8N1 ÷ the sample "
        "record's bytes (frame headers, CRC and result reads make it lower still). Build s: "
        "the board build that made the cached report.",
        "",
    ]
    rows = []
    for m in res["models"]:
        for p in cpu_peers.PEERS:
            r = m["cpu"].get(p) or {}
            if not r.get("samples_per_s"):
                rows.append([m["name"], p, _peer_cell(r)] + ["–"] * 8)
                continue
            by = r.get("by_threads") or {}
            rows.append(
                [
                    m["name"],
                    p,
                    _f(r["samples_per_s"]),
                    _f(r.get("median_samples_per_s")),
                    _f(r.get("samples_per_cpu_s")),
                    ", ".join(f"{t}: {_f(v['samples_per_s'])}" for t, v in by.items()) or "1",
                    f"{r['lr']:.4g} / {r['momentum']:.4g}",
                    _acc(r.get("test_accuracy")),
                    _acc(r.get("train_accuracy")),
                    f"{r['loadavg'][0][0]:.1f}",
                    str(r.get("reps")),
                ]
            )
    out += [
        _table(
            [
                "model",
                "peer",
                "samples/s (best)",
                "median",
                "samples/CPU-s",
                "threads: samples/s",
                "η / m",
                "test acc",
                "train acc",
                "load (1 min)",
                "reps",
            ],
            rows,
        ),
        "",
        PEER_NOTE,
        "",
    ]
    rows = []
    for m in res["models"]:
        for p in cpu_peers.PEERS:
            search = (m["cpu"].get(p) or {}).get("lr_search")
            for r in (search or {}).get("runs", []):
                picked = "**picked**" if r == search["best"] else ""
                rows.append(
                    [
                        m["name"],
                        p,
                        f"{r['lr_scale']:g}",
                        f"{r['lr']:.4g}",
                        _acc(r["train_accuracy"]),
                        _acc(r["test_accuracy"]),
                        picked,
                    ]
                )
    if rows:
        out += [
            _table(["model", "peer", "η scale", "η", "train acc", "test acc", ""], rows),
            "",
            "η search of the batch peers (1 thread, one run each): the rule's η_B and its "
            "halvings; picked by training accuracy (the test set is only reported).",
            "",
        ]
    out += [
        "## 3. Tool speed",
        "",
    ]
    rows = []
    for m in res["models"]:
        t = res["tools"][m["name"]]
        vb = t.get("verilator_build_s")
        rows.append(
            [
                m["name"],
                _f(t.get("verilog_s"), 1),
                (_f(vb, 1) + ("" if t.get("measured_now") else " (cached)")) if vb else "–",
                _f(t["rtl_sim_cycles_per_s"]),
                _f(t["rtl_train_cycles_per_s"]),
                _f(t["rtl_samples_per_s"]),
                _f(t["golden_samples_per_s"]),
                _f(t["reference_samples_per_s"]),
            ]
        )
    out += [
        _table(
            [
                "model",
                "Verilog gen s",
                "Verilator build s",
                "RTL sim cycles/s (whole run)",
                "RTL cycles/s (training)",
                "RTL samples/s",
                "golden samples/s",
                "reference samples/s",
            ],
            rows,
        ),
        "",
        "RTL sim: cocotb + Verilator, free-running streams; whole run includes the weight "
        "load and read-back through the per-word access port. Verilator build: Verilog → "
        "C++ → binary (no ccache) with the prebuilt runtime objects "
        '("cached": recorded when the cached '
        "build was made). Golden: the bit-exact fixed-point model (int64 PyTorch); reference: "
        "the float PB trainer.",
        "",
        "## 4. Memory",
        "",
    ]
    rows = []
    for m in res["models"]:
        mm = m["memory"]
        for u in m["stage_utilisation"]:
            rows.append(
                [
                    m["name"],
                    str(u["stage"]),
                    str(u["delay"]),
                    _f(u["stash_bits"]),
                    _f(u["weight_bits"]),
                    _f(u["velocity_bits"]),
                    _f(u["memory_bits"]),
                ]
            )
        rows.append(
            [
                f"**{m['name']}**",
                "all",
                "",
                _f(mm["stash_bits"]),
                _f(mm["weight_bits"]),
                _f(mm["velocity_bits"]),
                _f(mm["memory_bits"]),
            ]
        )
    out += [
        _table(
            ["model", "stage", "D_s", "stash bits", "weight bits", "velocity bits", "total"], rows
        ),
        "",
        "Depth sweep (64→32×(S−1)→10, default formats, plans only): stash = Σ_s (D_s+1)·|x_s| "
        "grows as S(S+1); weights linearly. See `memory_scaling.png`.",
        "",
    ]
    rows = [
        [
            str(r["depth"]),
            _f(r["stash_x_bits"]),
            _f(r["analytic_stash_bits"]),
            "yes" if r["stash_x_bits"] == r["analytic_stash_bits"] else "**no**",
            _f(r["stash_bits"]),
            _f(r["weight_bits"]),
            _f(r["sequential_stash_bits"]),
        ]
        for r in res["memory_scaling"]
    ]
    out += [
        _table(
            [
                "S",
                "stash x bits (plan)",
                "Σ(D_s+1)·bits(x_s)",
                "equal",
                "stash + mask bits",
                "weight bits",
                "sequential stash",
            ],
            rows,
        ),
        "",
        "![memory vs depth](memory_scaling.png)",
        "",
        "![throughput](throughput.png)",
        "",
        "## Run times",
        "",
        _table(
            ["phase", "seconds"],
            [[k, f"{v:.1f}"] for k, v in meta["phases_s"].items()]
            + [["total", f"{meta['run_s']:.1f}"]],
        ),
        "",
        f"A cold run (empty caches) adds the Verilator builds "
        f"({meta['cold_extra_s']['verilator_builds']:.0f} s for the {2 * len(res['models'])} "
        f"designs, as recorded when they were built) and the board builds "
        f"({meta['cold_extra_s']['board_builds']:.0f} s), plus 1–2.5 min per YoWASP tool on "
        "its first use (WebAssembly compilation).",
        "",
    ]
    return "\n".join(out)


def plot_throughput(res: dict[str, Any], path: Path) -> None:
    """Bar chart (log scale) per model: the first board's ceiling, projected board samples/s,
    the UART bound, the CPU peers, the golden model and the RTL simulation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = res["models"]
    boards = list(models[0]["boards"]) if models else []
    series: list[tuple[str, list[float]]] = []
    for b in boards:
        series.append((f"{b} @Fmax", [m["projected_samples_per_s"][b] or 0.0 for m in models]))
    series.append(
        (
            f"{boards[0]} @board clock",
            [m["boards"][boards[0]].get("board_clock_samples_per_s") or 0.0 for m in models],
        )
    )
    series.append(
        ("UART bound", [m["boards"][boards[0]]["link_bound_samples_per_s"] for m in models])
    )
    series.insert(
        0,
        (
            f"{boards[0]} ceiling",
            [m["boards"][boards[0]].get("ceiling_samples_per_s") or 0.0 for m in models],
        ),
    )
    for p in cpu_peers.PEERS:
        series.append(
            (f"CPU {p}", [(m["cpu"].get(p) or {}).get("samples_per_s") or 0.0 for m in models])
        )
    series.append(
        ("golden model", [res["tools"][m["name"]]["golden_samples_per_s"] for m in models])
    )
    series.append(("RTL sim", [res["tools"][m["name"]]["rtl_samples_per_s"] for m in models]))
    fig, ax = plt.subplots(figsize=(10.5, 4.2))
    w = 0.8 / len(series)
    for k, (label, vals) in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * w for i in range(len(models))]
        ax.bar(xs, [v if v > 0 else float("nan") for v in vals], w, label=label)
    ax.set_yscale("log")
    ax.set_xticks(range(len(models)), [m["name"] for m in models])
    ax.set_ylabel("training samples/s")
    ax.set_title("Training throughput (missing bar: does not fit or not built)")
    ax.grid(axis="y", alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _x(ratio: float) -> str:
    """A ratio: 2 decimals below 1, 1 below 10, none above (``0.59×``, ``1.5×``, ``37×``)."""
    return f"{ratio:.{2 if ratio < 1 else 1 if ratio < 10 else 0}f}×"


def verdict(res: dict[str, Any]) -> str:
    """One paragraph, from the numbers: per model, the fastest CPU peer against each fitted
    board's projection, DSP ceiling and board-clock rate (README)."""
    parts = []
    for m in res["models"]:
        best = m.get("best_cpu_peer")
        if not best:
            continue
        peer = m["cpu"][best]
        cpu = peer["samples_per_s"]
        said = [
            f"**{m['name']}**: the fastest CPU peer that learns (test accuracy within "
            f"{LEARN_MARGIN * 100:.0f} pp of `torch_b1`), `{best}`, trains {_f(cpu)} samples/s "
            f"(accuracy {_acc(peer.get('test_accuracy'))})"
        ]
        for b, rec in m["boards"].items():
            proj, ceil = rec.get("projected_samples_per_s"), rec.get("ceiling_samples_per_s")
            if not proj:
                # a model without a projection either does not fit or has no build report
                why = "does not fit" if rec.get("fits") is False else "not built"
                said.append(f"{b}: {why}")
                continue
            acc = _acc((rec.get("golden") or {}).get("test_accuracy"))
            word = "above" if cpu > ceil else "below"
            said.append(
                f"{_x(cpu / proj)} the {b} projection ({_f(proj)}, accuracy {acc}), "
                f"{_x(cpu / ceil)} its whole DSP ceiling ({_f(ceil)}: {word} it) and "
                f"{_x(cpu / rec['board_clock_samples_per_s'])} its rate at today's board clock"
            )
        proj = [v for v in m["projected_samples_per_s"].values() if v]
        if proj:
            top = max(proj)
            rates = {p: (m["cpu"].get(p) or {}).get("samples_per_s") for p in cpu_peers.PEERS}
            beaten = [f"`{p}` ({_f(v)})" for p, v in rates.items() if v and v < top]
            said.append(
                f"the best board projection ({_f(top)}) beats "
                + (", ".join(beaten) if beaten else "no CPU peer")
            )
        parts.append("; ".join(said) + ".")
    return "Where the CPU wins (this run, one core): " + " ".join(parts) if parts else ""


def update_readme(res: dict[str, Any], readme: Path) -> None:
    """Put the summary tables into README's "Benchmarks" section (appended if absent)."""
    meta = res["meta"]
    epochs = res["models"][0]["cpu"]["torch_b1"]["epochs"] if res["models"] else DEFAULT_EPOCHS
    stale = any(r.get("stale") for m in res["models"] for r in m["boards"].values())
    block = "\n".join(
        [
            README_START,
            f"Measured {meta['date'][:10]} on {meta['machine']['cpu']} ({meta['machine']['cores']}"
            f" cores, shared: load average {meta['loadavg_start'][0]:.1f} → "
            f"{meta['loadavg_end'][0]:.1f}), {meta['mode']} run of `python benchmarks/run.py` "
            f"({meta['run_s'] / 60:.0f} min); details in "
            "[benchmarks/results.md](benchmarks/results.md).",
            "",
            summary_table(res),
            "",
            SUMMARY_NOTE.format(epochs=epochs)
            + " Cells: samples/s (test accuracy); `[η×s: acc]` where a smaller η_B learned "
            "better in the same epochs (picked on the training set). The UART (ULX3S 3 Mbaud, "
            "iCEBreaker 1 Mbaud) limits streamed runs to < 2,300 and < 1,010 samples/s; the "
            "on-chip set takes the link out of the loop."
            + (
                " Fmax marked *(older HDL/plan)*: a cached board report built from older HDL "
                "(`--reuse-stale-boards`)."
                if stale
                else ""
            )
            + " Re-run with `python benchmarks/run.py` (full; board builds cached by plan hash)"
            " or `python benchmarks/run.py --quick --json -`.",
            "",
            verdict(res),
            README_END,
        ]
    )
    text = readme.read_text()
    if README_START in text and README_END in text:
        pre, rest = text.split(README_START, 1)
        post = rest.split(README_END, 1)[1]
        text = pre + block + post
    else:
        text = text.rstrip("\n") + "\n\n## Benchmarks\n\n" + block + "\n"
    readme.write_text(text)


def write_outputs(res: dict[str, Any], out: Path) -> None:
    """Write ``results.json``, ``results.md``, ``memory_scaling.png`` and ``throughput.png``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    (out / "results.md").write_text(render_markdown(res))
    memory_scaling.plot(res["memory_scaling"], str(out / "memory_scaling.png"))
    if res["models"]:
        plot_throughput(res, out / "throughput.png")


def refresh_derived(res: dict[str, Any]) -> dict[str, Any]:
    """Recompute the figures derived from the measurements (the fastest learning CPU peer and
    each board's ratio to it) in a results dict, e.g. one written by an older version."""
    for m in res["models"]:
        name, rate = best_learning_peer(m["cpu"])
        m["best_cpu_peer"], m["best_cpu_samples_per_s"] = name, rate
        for rec in m["boards"].values():
            rec.pop("vs_best_cpu", None)
            if rate and rec.get("projected_samples_per_s"):
                rec["vs_best_cpu"] = rec["projected_samples_per_s"] / rate
    return res


def main(argv: list[str] | None = None) -> None:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples, cached builds")
    ap.add_argument("--json", default=None, help="write the results JSON here ('-' = stdout)")
    ap.add_argument("--out", default=None, help="folder for results.{json,md} and PNGs")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated models")
    ap.add_argument("--boards", default=",".join(BOARDS), help="comma-separated boards")
    ap.add_argument("--cache-dir", default=None, help="board report cache")
    ap.add_argument("--no-board-builds", action="store_true", help="never run YoWASP builds")
    ap.add_argument(
        "--reuse-stale-boards",
        action="store_true",
        help="full run: keep board reports built from older HDL (marked) instead of rebuilding",
    )
    ap.add_argument("--readme", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument(
        "--onchip",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure board_samples_per_s through the on-chip training set (board-level RTL "
        "simulation, minutes per model and board)",
    )
    ap.add_argument(
        "--from-json",
        default=None,
        help="measure nothing: re-render a saved results.json (its mode decides --out)",
    )
    args = ap.parse_args(argv)
    if args.from_json:
        res = refresh_derived(json.loads(Path(args.from_json).read_text()))
        args.quick = res["meta"]["mode"] == "quick"
    else:
        res = run(
            args.quick,
            tuple(m for m in args.models.split(",") if m),
            tuple(b for b in args.boards.split(",") if b),
            Path(args.cache_dir) if args.cache_dir else None,
            board_builds=not args.no_board_builds,
            reuse_stale=args.reuse_stale_boards,
            onchip=args.onchip,
        )
    out = args.out or (None if args.quick else str(HERE))
    if out:
        write_outputs(res, Path(out))
        log(f"wrote {out}/results.json, results.md, PNGs")
    if args.readme or (args.readme is None and not args.quick and out == str(HERE)):
        update_readme(res, HERE.parent / "README.md")
        log("updated README.md (Benchmarks)")
    if args.json == "-":
        print(json.dumps(res, indent=1, default=str))
    elif args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str) + "\n")
    log(f"done in {res['meta']['run_s']:.0f} s" + (" (re-rendered)" if args.from_json else ""))


if __name__ == "__main__":
    main()
