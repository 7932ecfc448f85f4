"""Drive ``NetworkTop`` in Amaranth's own Python simulator (no Verilog, no compile).

Rung 3 of the verification ladder (docs/architecture.md §5), for the whole top: the same port
contract the RTL benches (:mod:`pipetrain.sim.cocotb_network`) drive in Verilator or Icarus,
without leaving Python.

:func:`simulate_top` loads memories through ``wacc_cmd``, streams samples with optional random
valid/ready toggling on every stream, flushes, reads the counters and every weight/velocity
back, and returns what it saw (:class:`TopRun`). Per-cycle Python work is one ``set`` per
driven port and one ``tick``; Amaranth's simulator runs such a loop at ~5–20k cycles/s for the
small networks of the tests.

Source: docs/ports.md (the port contract this bench exercises); the bench is *derived*.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from amaranth import Const
from amaranth.sim import Simulator

from ...compiler.plan import Plan
from ...hdl.top import NetworkTop, sample_layout, wacc_cmd_layout
from ...protocol.wire import KIND_CODES, KIND_NAMES

__all__ = ["TopRun", "simulate_top"]


def _kinds(stage) -> tuple[str, ...]:
    """The weight memories the weight access serves for ``stage``: ``w``, ``u`` and, with the
    LWP ``w`` form, ``w_prev`` (docs/ports.md ``wacc``)."""
    if any(m.name == "w_prev" for m in stage.memories):
        return ("w", "u", "w_prev")
    return ("w", "u")


@dataclass
class TopRun:
    """What one simulation of ``NetworkTop`` observed.

    Members
    -------
    results: ``(sample, pred, loss, train)`` per ``result_out`` record, in order.
    result_cycles: the cycle (from the end of reset) each record was transferred.
    memories: ``{stage name: {"w"|"u"|"w_prev": int64 (M, N+1)}}`` read back after the flush.
    counters: ``samples_trained``, ``ticks``, ``saturations`` (one per stage and loss unit:
        S + 1 for ``global``), and with auxiliary heads ``head_correct`` (one per head).
    echo_errors: initial writes whose response differed from the data sent.
    cycles: total cycles; stream_cycles: from the first sample beat to the last result.
    wall_s: seconds of simulation.
    """

    results: list[tuple[int, int, int, int]] = field(default_factory=list)
    result_cycles: list[int] = field(default_factory=list)
    memories: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    counters: dict = field(default_factory=dict)
    echo_errors: list = field(default_factory=list)
    cycles: int = 0
    stream_cycles: int = 0
    wall_s: float = 0.0


def simulate_top(
    plan: Plan,
    x: torch.Tensor,
    labels: Sequence[int],
    train: Sequence[bool] | None = None,
    *,
    init: dict[str, dict[str, torch.Tensor]] | None = None,
    readback: bool = True,
    valid_prob: float = 1.0,
    ready_prob: float = 1.0,
    seed: int = 0,
    max_cycles: int = 10_000_000,
    top: NetworkTop | None = None,
) -> TopRun:
    """Simulate ``NetworkTop(plan)``: write ``init`` memories, stream ``x`` (n, N) int (already
    quantised) with ``labels`` and ``train`` flags, flush, read back.

    ``valid_prob``/``ready_prob`` < 1 randomise the producer's ``valid`` and the consumer's
    ``ready`` every cycle on all four streams (``seed``). Raises RuntimeError if the design
    makes no progress within ``max_cycles``.
    """
    top = top or NetworkTop(plan)
    n = len(x)
    xs = [[int(v) for v in row] for row in x.tolist()]
    labels = [int(v) for v in labels]
    train = [True] * n if train is None else [bool(t) for t in train]
    rng = random.Random(seed)
    run = TopRun()
    S = len(plan.stages)
    N = plan.in_features

    def writes() -> list[tuple[int, int, int, int, int, int]]:
        cmds = []
        for s, st in enumerate(plan.stages):
            mem = (init or {}).get(st.name, {})
            for kind in ("w", "u", "w_prev"):
                if kind not in mem or kind not in _kinds(st):
                    continue
                vals = mem[kind].tolist()
                for j in range(st.rows):
                    for i in range(st.cols + 1):
                        cmds.append((1, s, KIND_CODES[kind], j, i, int(vals[j][i])))
        return cmds

    def reads() -> list[tuple[int, int, int, int, int, int]]:
        return [
            (0, s, KIND_CODES[kind], j, i, 0)
            for s, st in enumerate(plan.stages)
            for kind in _kinds(st)
            for j in range(st.rows)
            for i in range(st.cols + 1)
        ]

    # whole-payload integers: one ``set`` per stream per cycle (field views are slow to build)
    cmd_l, smp_l = wacc_cmd_layout(), sample_layout(plan)
    si, ro = top.sample_in, top.result_out
    wc, wr = top.wacc_cmd, top.wacc_rsp
    si_p, ro_p, wc_p, wr_p = (v.payload.as_value() for v in (si, ro, wc, wr))
    heads = len(getattr(plan, "head_losses", ()))
    sat_sigs = [top.saturations[k] for k in range(S + 1 + heads)]
    head_sigs = [top.head_correct[k] for k in range(heads)]

    def pack(layout, **fields) -> int:
        return int(Const.cast(layout.const(fields).as_value()).value)

    period_fs = 10_000_000  # 10 ns clock in femtoseconds

    def now() -> int:
        """Clock cycles simulated so far (from the simulator's time)."""
        return sim._engine.now // period_fs  # noqa: SLF001 - no public accessor in 0.5

    async def tick(ctx) -> None:
        await ctx.tick()
        if now() > max_cycles:
            raise RuntimeError(f"no completion within {max_cycles} cycles")

    async def wacc(ctx, cmds) -> list[int]:
        packed = [
            pack(cmd_l, write=w, stage=s, kind=kd, row=r, col=c, data=d)
            for w, s, kd, r, c, d in cmds
        ]
        out: list[int] = []
        k = 0
        while len(out) < len(cmds):
            v = k < len(cmds) and rng.random() < valid_prob
            if v:
                ctx.set(wc_p, packed[k])
            ctx.set(wc.valid, v)
            rd = rng.random() < ready_prob
            ctx.set(wr.ready, rd)
            cr, rv = ctx.get(wc.ready), ctx.get(wr.valid)
            if rd and rv:
                raw = ctx.get(wr_p)
                out.append(raw - (1 << 32) if raw >> 31 else raw)
            await tick(ctx)
            if v and cr:
                k += 1
        ctx.set(wc.valid, 0)
        ctx.set(wr.ready, 0)
        return out

    def take_result(ctx) -> None:
        raw = ctx.get(ro_p)
        run.results.append(
            (raw & 0xFFFFFFFF, (raw >> 32) & 0xFFFF, (raw >> 48) & 0xFFFFFFFF, (raw >> 80) & 1)
        )
        run.result_cycles.append(now() + 1)

    async def bench(ctx) -> None:
        cmds = writes()
        if cmds:
            echo = await wacc(ctx, cmds)
            run.echo_errors = [(c, e) for c, e in zip(cmds, echo, strict=True) if c[5] != e]
        t0 = now()
        beats = [
            pack(
                smp_l,
                x=xs[k][i],
                label=labels[k] if i == N - 1 else 0,
                train=int(train[k]) if i == N - 1 else 0,
                last=int(i == N - 1),
            )
            for k in range(n)
            for i in range(N)
        ]
        b = 0
        free = valid_prob >= 1.0 and ready_prob >= 1.0
        while b < len(beats) or len(run.results) < n:
            if free and ctx.get(si.ready) == 0 and ctx.get(ro.valid) == 0 and b < len(beats):
                # nothing to hand over: let the design run until a stream needs us
                ctx.set(si.valid, 0)
                ctx.set(ro.ready, 0)
                await ctx.tick().until(si.ready | ro.valid)
                continue
            v = b < len(beats) and rng.random() < valid_prob
            if v:
                ctx.set(si_p, beats[b])
            ctx.set(si.valid, v)
            rd = rng.random() < ready_prob
            ctx.set(ro.ready, rd)
            # flush once every sample has been streamed (the host's end of train())
            ctx.set(top.flush, b >= len(beats))
            taken = v and ctx.get(si.ready)
            if rd and ctx.get(ro.valid):
                take_result(ctx)
            await tick(ctx)
            if taken:
                b += 1
        ctx.set(si.valid, 0)
        ctx.set(ro.ready, 0)
        ctx.set(top.flush, 1)
        while not ctx.get(top.idle):
            await tick(ctx)
        ctx.set(top.flush, 0)
        run.stream_cycles = now() - t0
        run.counters = {
            "samples_trained": ctx.get(top.samples_trained),
            "ticks": ctx.get(top.ticks),
            "saturations": [ctx.get(s) for s in sat_sigs],
        }
        if head_sigs:
            run.counters["head_correct"] = [ctx.get(s) for s in head_sigs]
        if readback:
            cmds = reads()
            data = await wacc(ctx, cmds)
            for (_, s, kind, j, i, _), d in zip(cmds, data, strict=True):
                st = plan.stages[s]
                name = KIND_NAMES[kind]
                mem = run.memories.setdefault(st.name, {})
                if name not in mem:
                    mem[name] = torch.zeros(st.rows, st.cols + 1, dtype=torch.int64)
                mem[name][j, i] = d
        run.cycles = now()

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    t = time.perf_counter()
    sim.run()
    run.wall_s = time.perf_counter() - t
    return run
