"""Measurements of the benchmark: RTL cycles per sample, stage utilisation, tool and CPU speed.

Every function here measures one thing and returns a JSON-ready dict; :mod:`run` puts them
side by side. Times are wall-clock seconds (``time.perf_counter``) unless a key says ``cpu``
(this process's CPU time, ``time.process_time``).
"""

from __future__ import annotations

import time
from typing import Any

from pipetrain.compiler.build import pass_cycles
from pipetrain.compiler.plan import Plan

__all__ = [
    "ceiling_samples_per_s",
    "compile_design",
    "golden_accuracy",
    "multiplies_per_sample",
    "onchip_board_rate",
    "rtl_run",
    "stage_utilisation",
    "trainer_speed",
    "verilator_build_time",
    "verilog_time",
]


def compile_design(
    model: str, schedule: str = "pb", lanes: tuple[int, ...] | None = None, seed: int = 0
) -> Any:
    """Compile ``model`` exactly as ``pipetrain sim`` does (auto formats calibrated on digits);
    return the :class:`~pipetrain.compiler.compile.CompileResult`."""
    from pipetrain.host.flow import compile_design as _compile

    return _compile(
        model,
        seed=seed,
        data="digits",
        config_overrides={"schedule": schedule},
        lanes=lanes,
        writers=(),
    )


def compile_board_design(model: str, board: Any, seed: int = 0) -> Any:
    """Compile ``model`` fitted to ``board`` (a name or a
    :class:`~pipetrain.compiler.targets.Board`) exactly as ``pipetrain build MODEL --board``
    does (:func:`pipetrain.host.flow.compile_design`, the auto formats calibrated over
    :func:`~pipetrain.host.cli.options.calibration_epochs` epochs, as every command does): the
    design the board runs, the plan hash of the user's bitstream."""
    from pipetrain.host.cli.options import calibration_epochs
    from pipetrain.host.flow import compile_design as _compile

    epochs = calibration_epochs(model, None)
    return _compile(model, board=board, seed=seed, writers=(), calib_epochs=epochs)


def rtl_run(result: Any, samples: int, seed: int = 0) -> dict[str, Any]:
    """Stream ``samples`` digits samples through the Verilator RTL and the golden model.

    Uses :func:`pipetrain.sim.tb.network.check_network` (the ``pipetrain sim`` machinery; the
    build is cached by plan + HDL hash). Returns ``cycles_per_sample`` (steady-state mean
    spacing of result records, cycles), ``ideal_cycles_per_sample`` (the plan's), ``bit_exact``,
    ``build_s`` (seconds spent building in this call; 0 when cached), ``sim_cycles_per_s``
    (whole simulated run incl. weight load/read-back per testbench second),
    ``train_cycles_per_s`` (stream + flush only), ``rtl_samples_per_s`` (train cycles/s ÷
    cycles per sample), ``sim_wall_s`` (the simulator process), ``check_s`` (this call, golden
    model and comparison included).
    """
    from pipetrain.sim.stimulus import plan_samples
    from pipetrain.sim.tb.network import check_network

    plan = result.plan
    x, y = plan_samples(plan, samples, "digits", seed)
    t0 = time.perf_counter()
    rep = check_network(plan, result.model, x, y.tolist(), seed=seed, localise_first=False)
    check_s = time.perf_counter() - t0
    recorded = _recorded_build_s(plan)
    d = rep.to_dict(max_mismatches=3)
    train_cps = float(d.get("train_cycles_per_s", 0.0))
    return {
        "schedule": plan.schedule,
        "lanes": [s.lanes for s in plan.stages],
        "plan_hash": plan.hash,
        "samples": samples,
        "bit_exact": rep.bit_exact,
        "mismatches": len(rep.mismatches),
        "cycles": rep.cycles,
        "total_cycles": rep.total_cycles,
        "cycles_per_sample": rep.cycles_per_sample,
        "ideal_cycles_per_sample": plan.ideal_cycles_per_sample,
        "build_s": rep.build_s,
        "build_cached": bool(d.get("build_cached")),
        "verilator_build_s_recorded": recorded,
        "sim_cycles_per_s": rep.sim_cycles_per_s,
        "train_cycles_per_s": train_cps,
        "rtl_samples_per_s": train_cps / rep.cycles_per_sample if rep.cycles_per_sample else 0.0,
        "sim_wall_s": float(d.get("sim_wall_s", 0.0)),
        "check_s": check_s,
    }


def onchip_board_rate(
    model: str, board: str, samples: int = 128, epochs: int = 4, seed: int = 0
) -> dict[str, Any]:
    """``board_samples_per_s``: the board's real training rate through the on-chip training set,
    measured in the board-level RTL simulation (docs/protocol.md §2 RUN, §6).

    ``model`` is compiled fitted to ``board`` with an on-chip set of the whole digits training
    split (so the plan and lanes are the board's: the fit counts the set), then the board top
    (UART pins at the board's baud rate and network clock: ``BoardTop`` around
    ``NetworkCore``, Verilator) stores the first ``samples`` training samples and trains
    ``epochs`` epochs on them with RUN; the device counts the run's clock cycles (the last
    sample's flush included). Returns ``cycles_per_sample`` (= cycles ÷ (epochs·samples)),
    ``board_samples_per_s`` (= clock ÷ that), ``clock_hz``, ``divisor``, ``bit_exact`` (every
    epoch summary, weight, velocity and counter against the golden shadow), ``tick_cycles`` and
    ``wall_s``. Raises :class:`~pipetrain.compiler.fit.FitError` when the set does not fit.
    (A subset keeps the UART upload short in simulation; the per-sample cost of a run does not
    depend on the set's size beyond the permutation's skipped candidates, which the prefetch
    hides, and the flush, amortised over the run.)"""
    from pipetrain.compiler.targets import get_board
    from pipetrain.data import load_data
    from pipetrain.hdl.uart import uart_divisor
    from pipetrain.host import open as open_device
    from pipetrain.host.flow import compile_design as _compile

    ds = load_data("digits")
    b = get_board(board)
    result = _compile(model, board=board, seed=seed, writers=(), onchip_samples=len(ds.x_train))
    plan = result.plan
    divisor = uart_divisor(plan.clock_hz, b.baud)
    opts = {"uart_divisor": divisor, "onchip_samples": samples}
    t0 = time.perf_counter()
    with open_device(result, "sim", shadow=True, sim_options=opts) as dev:
        rep = dev.train(ds.x_train[:samples], ds.y_train[:samples], epochs=epochs, onchip=True)
        v = dev.verify()
    cps = rep.device_cycles / (epochs * samples)
    return {
        "model": model,
        "board": board,
        "plan_hash": plan.hash,
        "samples": samples,
        "epochs": epochs,
        "device_cycles": rep.device_cycles,
        "cycles_per_sample": cps,
        "board_samples_per_s": plan.clock_hz / cps,
        "clock_hz": plan.clock_hz,
        "divisor": divisor,
        "tick_cycles": plan.tick_cycles,
        "ideal_cycles_per_sample": plan.ideal_cycles_per_sample,
        "bit_exact": v.bit_exact,
        "wall_s": time.perf_counter() - t0,
    }


def _recorded_build_s(plan: Plan) -> float | None:
    """Seconds the (now cached) Verilator build of ``plan`` took when it was made (its stamp)."""
    import json

    from pipetrain.sim.tb.network import build_network

    try:
        stamp = build_network(plan).build.directory / ".complete"
        return float(json.loads(stamp.read_text())["build_s"])
    except (OSError, ValueError, KeyError):
        return None


def stage_utilisation(plan: Plan) -> list[dict[str, Any]]:
    """Per-stage lane use of the ``pb`` tick, from the plan (no recomputed quantities).

    For a stage with N inputs, M rows, L lanes and G = ``row_groups``:
    ``lane_slot_util`` = M / (G·L) (useful lane-slots of the fused pass / total);
    ``pass_cycles`` = the stage's pass incl. pipeline latency
    (:func:`pipetrain.compiler.build.pass_cycles`); ``tick_share`` = pass_cycles / tick;
    ``mac_util`` = M·(N+1) / (L·tick) — useful MAC slots per lane-cycle of the whole tick
    (the product of the two, up to the pass latency). A convolution stage (rows = C_out,
    docs/numerics.md §9) uses each of its C_out·(T + 1) weights at P positions, one MAC slot
    each (the forward, input-gradient and weight-gradient MACs of the slot share the weight
    read): ``mac_util`` = C_out·(T + 1)·P / (L·tick) (``compiler/conv.py:conv_cycles``'s
    slots). Source: *derived* from docs/architecture.md §3.
    """
    tick = plan.tick_cycles
    out = []
    for st in plan.stages:
        slots = st.row_groups * st.lanes
        conv = getattr(st, "conv", None)
        useful = st.rows * (st.cols + 1) * (1 if conv is None else conv.positions)
        out.append(
            {
                "stage": st.index,
                "name": st.name,
                "shape": f"{st.in_features}→{st.out_features}",
                "lanes": st.lanes,
                "delay": st.delay,
                "lane_slot_util": st.rows / slots,
                "cycles_per_tick": st.cycles_per_tick,
                "pass_cycles": pass_cycles(st),
                "tick_cycles": tick,
                "tick_share": pass_cycles(st) / tick,
                "mac_util": useful / (st.lanes * tick),
                "stash_bits": st.stash_bits,
                "weight_bits": st.weight_bits,
                "velocity_bits": st.velocity_bits,
                "memory_bits": st.memory_bits,
                "multipliers": st.multipliers,
            }
        )
    return out


def verilog_time(plan: Plan) -> dict[str, Any]:
    """Time Verilog generation of ``NetworkTop(plan)`` (Amaranth elaboration + Yosys write).

    Returns ``{"verilog_s", "verilog_bytes", "verilog"}`` (the text, for a build).
    """
    from pipetrain.hdl.verilog import generate_verilog
    from pipetrain.sim.tb.network import TOPLEVEL

    t0 = time.perf_counter()
    text = generate_verilog(plan, TOPLEVEL)
    return {"verilog_s": time.perf_counter() - t0, "verilog_bytes": len(text), "verilog": text}


def verilator_build_time(verilog: str, fresh: bool) -> dict[str, Any]:
    """Verilator build time of ``verilog`` (the network top), cached by its content hash.

    ``fresh``: rebuild now and time it, without ccache (reuses Verilator's prebuilt runtime
    objects, as every build does); otherwise report the ``build_s`` recorded when the cached
    build was made (``measured_now: False``). Returns ``{"verilator_build_s", "measured_now"}``.
    """
    import json
    import os

    from pipetrain.sim.tb.network import TOPLEVEL
    from pipetrain.sim.verilator import build_verilog

    saved = os.environ.get("OBJCACHE")
    if fresh:
        os.environ["OBJCACHE"] = ""  # time the C++ compile itself, not ccache hits
    try:
        b = build_verilog(verilog, TOPLEVEL, rebuild=fresh)
    finally:
        if saved is None:
            os.environ.pop("OBJCACHE", None)
        else:
            os.environ["OBJCACHE"] = saved
    if not b.cached:
        return {"verilator_build_s": b.build_s, "measured_now": True}
    stamp = json.loads((b.directory / ".complete").read_text())
    return {"verilator_build_s": float(stamp.get("build_s", float("nan"))), "measured_now": False}


def trainer_speed(result: Any, target: str, samples: int) -> dict[str, float]:
    """Train ``samples`` digits samples on an in-process target (``golden`` or ``reference``).

    Uses :func:`pipetrain.host.device.local_trainer` on ``result`` (the same plan the RTL runs);
    a throw-away trainer first trains 16 samples (one-time table set-up is not timed).
    Returns ``samples_per_s`` (wall) and ``samples_per_cpu_s``.
    """
    from pipetrain.data import load_digits
    from pipetrain.host.device import local_trainer

    ds = load_digits()
    n = min(samples, len(ds.x_train))

    def make() -> Any:
        return local_trainer(target, result.plan, result.model, result.config)

    make().train(ds.x_train[:16], ds.y_train[:16], epochs=1)  # warm-up
    trainer = make()
    wall, cpu = time.perf_counter(), time.process_time()
    trainer.train(ds.x_train[:n], ds.y_train[:n], epochs=1)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"samples": n, "samples_per_s": n / wall, "samples_per_cpu_s": n / cpu}


def multiplies_per_sample(plan: Plan) -> int:
    """Multiplies one training sample needs: Σ_s W_s·(2 + [s > 1]), W_s = M_s·(N_s + 1).

    Every weight (bias included, as the plan stores it: N_s + 1 words per row) takes one multiply
    in the forward pass and one in its weight gradient; every stage after the first also
    propagates its input gradient through each weight. 5,150 for mlp-digits (64→32→10:
    2·2,080 + 3·330). Source: derived (docs/architecture.md §3: the stage's forward, update and
    input-gradient passes), from the plan's stage shapes — the plan has no such figure. A
    convolution stage's C_out·(T + 1) weights work at each of its P output positions: forward
    and weight gradient C_out·(T + 1)·P each, input gradient (after the first stage)
    C_out·T·P (docs/numerics.md §9).
    """
    total = 0
    for k, st in enumerate(plan.stages):
        conv = getattr(st, "conv", None)
        if conv is None:
            total += st.out_features * (st.in_features + 1) * (3 if k else 2)
        else:
            w = conv.out_channels * conv.positions
            total += w * (conv.taps + 1) * 2 + (w * conv.taps if k else 0)
    return total


def ceiling_samples_per_s(plan: Plan, dsp_blocks: int, fmax_mhz: float) -> float:
    """Samples/s with every hard multiplier busy every cycle at ``fmax_mhz`` (MHz) on
    :func:`multiplies_per_sample`: ``dsp_blocks · fmax_mhz·10⁶ / multiplies``.

    ``dsp_blocks``: the board's hard multipliers (``Board.multipliers``: 156 MULT18X18D on the
    ECP5-85F, 8 SB_MAC16 on the UP5K). An upper bound for any design on that chip at that clock
    doing one multiply per block per cycle. Source: derived (issue 17's definition).
    """
    return dsp_blocks * fmax_mhz * 1e6 / multiplies_per_sample(plan)


def golden_accuracy(result: Any, epochs: int) -> dict[str, Any]:
    """Test accuracy of the golden model of ``result``'s plan after ``epochs`` epochs of digits.

    The golden model is bit-exact with the RTL, so this is what the board reaches; same initial
    weights and :func:`pipetrain.data.epoch_order` as the CPU peers. Returns
    ``{"test_accuracy", "epochs", "plan_hash", "s"}`` (``s``: wall seconds of the run).
    """
    from pipetrain.data import load_digits
    from pipetrain.host.device import local_trainer

    ds = load_digits()
    t0 = time.perf_counter()
    trainer = local_trainer("golden", result.plan, result.model, result.config)
    trainer.train(ds.x_train, ds.y_train, epochs=epochs)
    return {
        "test_accuracy": trainer.evaluate(ds.x_test, ds.y_test),
        "epochs": epochs,
        "plan_hash": result.plan.hash,
        "s": time.perf_counter() - t0,
    }
