"""Whole-network RTL check: build ``NetworkTop(plan)``, stream samples, compare with the golden.

Flow (:func:`check_network`):

1. :func:`build_network` — Verilog from :func:`pipetrain.hdl.verilog.generate_verilog`, built by
   the harness (:func:`pipetrain.sim.harness.cached_design`) with Verilator or Icarus. An index
   keyed by the plan and a hash of the generator's sources skips even the Verilog generation
   when nothing changed.
2. :func:`run_network` — one simulator run (:mod:`pipetrain.sim.cocotb_network`): write the
   initial memories through ``wacc_cmd`` (checking each echoed value), stream the samples
   (``sample_in``), collect every ``result_out`` record, flush, read the counters and every
   weight, velocity (and LWP ``w_prev``) back.
3. The golden model (:class:`pipetrain.sim.golden.GoldenModel`, traced) runs the same stream;
   :func:`compare` lists every difference as a :class:`Mismatch` (tick, stage, tensor, index,
   expected, actual).
4. Localisation: result mismatches carry the tick of the loss unit that produced them (from
   the golden traces). When weights differ, a bisection over stream *prefixes* finds the first
   sample whose updates differ: the RTL re-runs the first k samples + flush + read-back
   (prefix runs are exact prefixes of the full run: a flush only adds bubble ticks after the
   last sample) and the golden model does the same; the differing elements are then tagged
   with the tick in which the golden trace shows that stage applying that sample's update.

Nothing here recomputes a plan quantity: shapes, formats, lanes and seeds come from the plan;
the arithmetic comes from the golden model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...compiler.plan import Plan
from ...protocol.wire import KIND_CODES, KIND_NAMES
from ..golden_conv import conv_slot
from ..harness import (
    DEFAULT_SIMULATOR,
    RTLBuild,
    cached_design,
    design_cached,
    hdl_source_hash,
    run_cocotb,
)
from .layout import fields_to_json, flatten_layout

__all__ = [
    "Mismatch",
    "NetworkDesign",
    "RTLRun",
    "SimReport",
    "build_network",
    "network_cached",
    "check_network",
    "compare",
    "hdl_source_hash",
    "run_network",
]

STREAMS = ("sample_in", "result_out", "wacc_cmd", "wacc_rsp")
TOPLEVEL = "pipetrain_top"
CLOCK_NS = 10
TB_MODULE = "pipetrain.sim.cocotb_network"


@dataclass(frozen=True)
class NetworkDesign:
    """A built network simulation.

    Members
    -------
    plan: the plan the hardware was generated from.
    build: the RTL build (``build.simulator`` names the simulator).
    fields: flat payload layouts (:func:`~pipetrain.sim.tb.layout.fields_to_json`) per stream.
    build_s: seconds this call spent (Verilog generation + build); ~0 when fully cached.
    verilog_s: the Verilog-generation part of ``build_s``.
    """

    plan: Plan
    build: RTLBuild
    fields: dict[str, list]
    build_s: float
    verilog_s: float


def _stream_fields(plan: Plan) -> dict[str, list]:
    """Flat payload layouts of the four streams, from :mod:`pipetrain.hdl.top`'s layouts."""
    from ...hdl import top

    layouts = {
        "sample_in": top.sample_layout(plan),
        "result_out": top.result_layout(),
        "wacc_cmd": top.wacc_cmd_layout(),
        "wacc_rsp": top.wacc_rsp_layout(),
    }
    return {name: fields_to_json(flatten_layout(layouts[name])) for name in STREAMS}


def build_network(
    plan: Plan,
    *,
    simulator: str = DEFAULT_SIMULATOR,
    waves: str | None = None,
    rebuild: bool = False,
) -> NetworkDesign:
    """Generate and build ``NetworkTop(plan)`` with ``simulator`` (``"verilator"`` or
    ``"icarus"``), cached by the plan and the generator's sources.

    ``waves``: ``None``, ``"vcd"`` or ``"fst"`` (a separate build). Raises :class:`ValueError`
    for an unknown simulator, :class:`~pipetrain.sim.harness.ToolchainError` when its tools are
    missing and :class:`~pipetrain.sim.harness.RTLSimError` when the build fails.
    """
    t0 = time.perf_counter()

    def generate() -> str:
        from ...hdl.verilog import generate_verilog

        return generate_verilog(plan, TOPLEVEL)

    build, verilog_s = cached_design(
        "network",
        TOPLEVEL,
        plan.to_json(),
        generate,
        simulator=simulator,
        waves=waves,
        rebuild=rebuild,
    )
    fields = _stream_fields(plan)
    return NetworkDesign(plan, build, fields, time.perf_counter() - t0, verilog_s)


def network_cached(
    plan: Plan, *, simulator: str = DEFAULT_SIMULATOR, waves: str | None = None
) -> bool:
    """Whether :func:`build_network` would reuse a finished build of ``NetworkTop(plan)`` (no
    build runs; :func:`pipetrain.sim.harness.design_cached`)."""
    return design_cached("network", TOPLEVEL, plan.to_json(), simulator=simulator, waves=waves)


@dataclass
class RTLRun:
    """What one simulator run of the network observed.

    Members
    -------
    results: ``(sample, pred, loss, train)`` per result record, in arrival order.
    result_cycles: clock cycle (from the end of reset) each record transferred at.
    memories: ``{stage name: {"w"|"u"|"w_prev": int64 (M, N+1)}}`` read back after the flush
        (empty when no read-back was asked for).
    counters: ``samples_trained``, ``ticks``, ``saturations`` (one per stage and loss unit:
        S + 1 for ``global``) after the flush; with auxiliary heads ``head_correct`` (one per
        head: samples whose head prediction equals the label).
    echo_errors: ``(cmd, echoed)`` for initial writes whose response differs from the data.
    cycles: total simulated cycles; ``stream_cycles``: from the first sample beat to the last
        one accepted; ``flush_cycles``: the flush; ``stream_start``: cycle of the first beat.
    sim_s: seconds inside the testbench body; ``wall_s``: the whole simulator process.
    handshakes: backpressure counts seen by the bench (randomised handshakes only).
    op_stats: per operation ``{"op", "wall_s", "sim_cycles"}``.
    """

    results: list[tuple[int, int, int, int]]
    result_cycles: list[int]
    memories: dict[str, dict[str, torch.Tensor]]
    counters: dict[str, Any]
    echo_errors: list[tuple[list[int], int]]
    cycles: int
    stream_cycles: int
    flush_cycles: int
    stream_start: int
    sim_s: float
    wall_s: float
    handshakes: dict[str, int] = field(default_factory=dict)
    op_stats: list[dict[str, Any]] = field(default_factory=list)


def _memory_commands(
    plan: Plan, memories: dict[str, dict[str, torch.Tensor]] | None, write: bool
) -> tuple[list[list[int]], list[tuple[str, str, int, int]]]:
    """wacc commands for every element of every stage's memories; with the slot each reads."""
    cmds: list[list[int]] = []
    where: list[tuple[str, str, int, int]] = []
    for s, st in enumerate(plan.stages):
        kinds = ["w", "u"]
        if st.update.lwp_horizon > 0 and st.update.lwp_form == "w":
            kinds.append("w_prev")
        for kind in kinds:
            values = memories[st.name][kind].tolist() if write and memories else None
            for j in range(st.rows):  # a conv stage: (C_out, T + 1), numerics §9
                for i in range(st.cols + 1):
                    data = values[j][i] if values is not None else 0
                    cmds.append([int(write), s, KIND_CODES[kind], j, i, data])
                    where.append((st.name, kind, j, i))
    return cmds, where


def run_network(
    design: NetworkDesign,
    x: torch.Tensor,
    labels: Sequence[int],
    train: Sequence[bool] | None = None,
    *,
    init: dict[str, dict[str, torch.Tensor]] | None = None,
    readback: bool = True,
    valid_prob: float = 1.0,
    ready_prob: float = 1.0,
    seed: int = 0,
    waves_file: str | Path | None = None,
    work_dir: Path | None = None,
) -> RTLRun:
    """Run one simulation: write ``init`` memories, stream ``x``, flush, read everything back.

    ``x``: int64 (n, N), already quantised to stage 1's ``x`` format (numerics §3).
    ``labels``: n class indices; ``train``: n flags (default all True). ``init``: raw memories
    as :meth:`GoldenModel.memories` returns them (None: keep the RTL's reset contents).
    ``valid_prob``/``ready_prob`` < 1 randomise every stream handshake (seeded by ``seed``).

    Raises :class:`~pipetrain.sim.verilator.RTLSimError` if the simulation fails or stalls (the
    message names the operation and how far it got).
    """
    plan = design.plan
    n = len(x)
    train = [True] * n if train is None else list(train)
    S = len(plan.stages)
    heads = len(getattr(plan, "head_losses", ()))
    N = plan.in_features
    rows = [
        [int(v) for v in x[k].tolist()] + [int(labels[k]), int(bool(train[k]))] for k in range(n)
    ]
    ops: list[dict[str, Any]] = []
    init_cmds: list[list[int]] = []
    if init is not None:
        init_cmds, _ = _memory_commands(plan, init, write=True)
        ops.append({"op": "wacc", "cmds": init_cmds})
    ops += [{"op": "stream", "samples": rows}, {"op": "flush"}, {"op": "counters"}]
    read_where: list[tuple[str, str, int, int]] = []
    if readback:
        read_cmds, read_where = _memory_commands(plan, None, write=False)
        ops.append({"op": "wacc", "cmds": read_cmds})
    words = len(init_cmds) + len(read_where)
    # generous: every tick + flush + two cycles per weight access (×4 under backpressure), ×2
    slow = 1.0 / max(min(valid_prob, ready_prob), 0.05)
    budget = (n + 2 * S + 4) * plan.tick_cycles * (2 if plan.schedule == "pb" else 2 * S)
    budget = int(2 * slow * (budget + 4 * words + n * N) + 10_000)
    job = {
        "fields": design.fields,
        "in_features": N,
        "counters": S + 1 + heads,
        "heads": heads,
        "clock_ns": CLOCK_NS,
        "valid_prob": valid_prob,
        "ready_prob": ready_prob,
        "seed": seed,
        "timeout_cycles": budget,
        "ops": ops,
    }
    res = run_cocotb(
        design.build, TB_MODULE, job, waves_file=waves_file, seed=seed, work_dir=work_dir
    )
    op_res = res["ops"]
    k = 0
    echo_errors: list[tuple[list[int], int]] = []
    if init is not None:
        echoed = op_res[k]["data"]
        echo_errors = [(c, e) for c, e in zip(init_cmds, echoed, strict=True) if e != c[5]]
        k += 1
    stream_r, flush_r, counters = op_res[k], op_res[k + 1], op_res[k + 2]
    memories: dict[str, dict[str, torch.Tensor]] = {}
    if readback:
        data = op_res[k + 3]["data"]
        for st in plan.stages:
            memories[st.name] = {}
        for (name, kind, j, i), v in zip(read_where, data, strict=True):
            mem = memories[name]
            if kind not in mem:
                st = next(s for s in plan.stages if s.name == name)
                mem[kind] = torch.zeros(st.rows, st.cols + 1, dtype=torch.int64)
            mem[kind][j, i] = v
    results = [(r["sample"], r["pred"], r["loss"], r["train"]) for r in res["results"]]
    return RTLRun(
        results=results,
        result_cycles=list(res["result_cycles"]),
        memories=memories,
        counters=counters,
        echo_errors=echo_errors,
        cycles=int(res["cycles"]),
        stream_cycles=int(stream_r["cycles"]),
        flush_cycles=int(flush_r["cycles"]),
        stream_start=int(stream_r["start"]),
        sim_s=float(res["python_s"]),
        wall_s=float(res["wall_s"]),
        handshakes=dict(res.get("handshakes", {})),
        op_stats=[
            {"op": op["op"], "wall_s": r["wall_s"], "sim_cycles": r["sim_cycles"]}
            for op, r in zip(ops, op_res, strict=True)
        ],
    )


@dataclass(frozen=True)
class Mismatch:
    """One difference between the RTL and the golden model.

    Members
    -------
    what: ``result`` | ``memory`` | ``counter`` | ``echo``.
    tensor: ``pred``/``loss``/``sample``/``train``/``count`` (results), ``w``/``u``/``w_prev``
        (memories), ``samples_trained``/``ticks``/``saturations`` (counters).
    stage: 1-based stage; ``S + 1`` is the loss unit; None when not stage-specific.
    index: element index (``(j, i)`` for memories, ``(sample,)`` for results, ``(k,)`` for
        saturation counter k).
    expected: the golden model's value; actual: the RTL's (None = missing).
    tick: 0-based tick in which the golden model produced the value (None if unknown).
    sample: the sample whose forward (results) or update (memories) produced it.
    detail: what the index means where (j, i) alone does not say it: for a convolution
        stage's memories (C_out, T + 1) the output channel, input channel and kernel offset
        of tap i, or the bias column (:func:`~pipetrain.sim.golden_conv.conv_slot`); None otherwise.
    """

    what: str
    tensor: str
    stage: int | None
    index: tuple[int, ...]
    expected: int | None
    actual: int | None
    tick: int | None = None
    sample: int | None = None
    detail: str | None = None

    def describe(self) -> str:
        """One line: ``tick 7, stage 2, w[3, 12] (sample 4): expected 1234, actual 1235``; a
        conv stage's memory adds its :attr:`detail` (``w[3, 12] (out channel 3, in channel 1,
        kernel (1, 0); sample 4)``)."""
        where = []
        if self.tick is not None:
            where.append(f"tick {self.tick}")
        if self.stage is not None:
            where.append(f"stage {self.stage}")
        idx = ", ".join(str(i) for i in self.index)
        name = f"{self.what} {self.tensor}[{idx}]" if idx else f"{self.what} {self.tensor}"
        notes = [self.detail] if self.detail else []
        notes += [f"sample {self.sample}"] if self.sample is not None else []
        where.append(name + (f" ({'; '.join(notes)})" if notes else ""))
        return f"{', '.join(where)}: expected {self.expected}, actual {self.actual}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (with ``text`` = :meth:`describe`)."""
        return {
            "what": self.what,
            "tensor": self.tensor,
            "stage": self.stage,
            "index": list(self.index),
            "expected": self.expected,
            "actual": self.actual,
            "tick": self.tick,
            "sample": self.sample,
            "detail": self.detail,
            "text": self.describe(),
        }


def _result_ticks(golden: Any) -> dict[int, int]:
    return {tr.loss.sample: tr.tick for tr in golden.traces if tr.loss is not None}


def _update_ticks(golden: Any) -> dict[tuple[int, int], int]:
    """(stage, sample) → tick of that sample's update at that stage (golden traces)."""
    out = {}
    for tr in golden.traces:
        for st in tr.stages:
            if st.bwd_sample is not None:
                out[(st.stage, st.bwd_sample)] = tr.tick
    return out


def head_correct(golden: Any, labels: Sequence[int]) -> list[int]:
    """Per auxiliary head k (loss L_k, k < K), the samples whose head-k prediction equals their
    label in the golden model's :attr:`head_results` — the RTL's ``head_correct`` counters."""
    return [
        sum(int(r.pred == int(labels[r.sample])) for r in golden.head_results[k])
        for k in sorted(golden.head_results)
    ]


def compare(
    golden: Any, rtl: RTLRun, plan: Plan, labels: Sequence[int] | None = None
) -> list[Mismatch]:
    """Every difference between a finished (flushed, traced) golden model and an RTL run.

    Results are compared record by record (tagged with the loss unit's tick), memories element
    by element (tagged with the tick of the stage's last update), then the counters (with
    ``labels``: the heads' ``head_correct`` too, :func:`head_correct`) and the echoes of the
    initial writes.
    """
    S = len(plan.stages)
    out: list[Mismatch] = []
    rticks = _result_ticks(golden)
    exp = [(r.sample, r.pred, r.loss_raw, int(r.train)) for r in golden.results]
    for n in range(max(len(exp), len(rtl.results))):
        e = exp[n] if n < len(exp) else None
        a = rtl.results[n] if n < len(rtl.results) else None
        if e is None or a is None:
            out.append(
                Mismatch(
                    "result", "count", S + 1, (n,), len(exp), len(rtl.results), rticks.get(n), n
                )
            )
            break
        for f, name in enumerate(("sample", "pred", "loss", "train")):
            if e[f] != a[f]:
                out.append(
                    Mismatch("result", name, S + 1, (n,), e[f], a[f], rticks.get(e[0]), e[0])
                )
    if rtl.memories:
        uticks = _update_ticks(golden)
        last_update: dict[int, tuple[int, int]] = {}
        for (s, n), t in uticks.items():
            if s not in last_update or t > last_update[s][0]:
                last_update[s] = (t, n)
        gm = golden.memories()
        for st in plan.stages:
            for kind, ev in gm[st.name].items():
                av = rtl.memories[st.name].get(kind)
                if av is None:
                    continue
                diff = (ev != av).nonzero().tolist()
                t, smp = last_update.get(st.index, (None, None))
                conv = getattr(st, "conv", None)
                for j, i in diff:
                    detail = conv_slot(conv, j, i) if conv is not None else None
                    e, a = int(ev[j, i]), int(av[j, i])
                    out.append(Mismatch("memory", kind, st.index, (j, i), e, a, t, smp, detail))
    g_counters = {
        "samples_trained": golden.samples_applied,
        "ticks": golden.ticks,
    }
    for name, e in g_counters.items():
        a = rtl.counters[name]
        if e != a:
            out.append(Mismatch("counter", name, None, (), e, a))
    for k, (e, a) in enumerate(
        zip(golden.stage_saturations, rtl.counters["saturations"], strict=True)
    ):
        if e != a:
            out.append(Mismatch("counter", "saturations", k + 1, (k,), e, a))
    if labels is not None and getattr(golden, "head_results", None):
        got = rtl.counters.get("head_correct", [])
        for k, e in enumerate(head_correct(golden, labels), start=1):
            a = got[k - 1] if k - 1 < len(got) else None
            if e != a:
                out.append(Mismatch("counter", "head_correct", None, (k,), e, a))
    for cmd, echoed in rtl.echo_errors:
        _, s, kind, j, i, data = cmd
        name = KIND_NAMES[kind]
        conv = getattr(plan.stages[s], "conv", None)
        detail = conv_slot(conv, j, i) if conv is not None else None
        out.append(Mismatch("echo", name, s + 1, (j, i), data, echoed, detail=detail))
    return out


def _golden(
    plan: Plan, model: Any, x: torch.Tensor, labels: Sequence[int], train: Sequence[bool]
) -> Any:
    from ..golden import GoldenModel

    g = GoldenModel(plan, model, trace=True)
    for k in range(len(x)):
        g.submit(x[k], int(labels[k]), bool(train[k]))
    g.flush()
    return g


@dataclass
class SimReport:
    """Outcome of :func:`check_network` (the ``pipetrain sim`` JSON, plus details).

    Members
    -------
    bit_exact: no mismatch anywhere.
    mismatches: every :class:`Mismatch` of the full run.
    first: the earliest mismatch in time (after localisation), or None.
    samples: samples streamed; cycles: training cycles, first sample beat → idle after the
        flush; total_cycles: the whole simulated run (weight load, stream, flush, read-back).
    cycles_per_sample: steady state, mean cycles between consecutive result records.
    ideal_cycles_per_sample: the plan's.
    sim_cycles_per_s: ``total_cycles`` per second of simulator time (testbench body).
    build_s: seconds spent building in this call (0 when cached).
    localisation: how the first mismatch was found (text), or None.
    """

    bit_exact: bool
    mismatches: list[Mismatch]
    first: Mismatch | None
    samples: int
    cycles: int
    total_cycles: int
    cycles_per_sample: float
    ideal_cycles_per_sample: int
    sim_cycles_per_s: float
    build_s: float
    localisation: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, max_mismatches: int = 20) -> dict[str, Any]:
        """The ``pipetrain sim`` JSON (first ``max_mismatches`` mismatches listed)."""
        return {
            "bit_exact": self.bit_exact,
            "mismatches": len(self.mismatches),
            "samples": self.samples,
            "cycles": self.cycles,
            "total_cycles": self.total_cycles,
            "cycles_per_sample": self.cycles_per_sample,
            "ideal_cycles_per_sample": self.ideal_cycles_per_sample,
            "sim_cycles_per_s": self.sim_cycles_per_s,
            "build_s": self.build_s,
            "first_mismatch": self.first.to_dict() if self.first else None,
            "localisation": self.localisation,
            "mismatch_list": [m.to_dict() for m in self.mismatches[:max_mismatches]],
            **self.extra,
        }


def _train_speed(rtl: RTLRun) -> float:
    """Simulated cycles per second while streaming and flushing (no weight access)."""
    ops = [o for o in rtl.op_stats if o["op"] in ("stream", "flush")]
    wall = sum(o["wall_s"] for o in ops)
    return sum(o["sim_cycles"] for o in ops) / wall if wall > 0 else 0.0


def _steady_cycles_per_sample(rtl: RTLRun) -> float:
    rc = rtl.result_cycles
    if len(rc) >= 2:
        return (rc[-1] - rc[0]) / (len(rc) - 1)
    return float(rtl.stream_cycles + rtl.flush_cycles)


def localise(
    design: NetworkDesign,
    plan: Plan,
    model: Any,
    x: torch.Tensor,
    labels: Sequence[int],
    train: Sequence[bool],
    init: dict[str, dict[str, torch.Tensor]],
    full: list[Mismatch],
    **run_kw: Any,
) -> tuple[int, list[Mismatch]]:
    """Find the shortest stream prefix k whose flushed state differs (bisection over k).

    ``full``: the mismatches of the whole stream (length n, assumed non-empty). Returns
    ``(k, mismatches of the prefix-k run)``: memory mismatches are tagged with the tick and
    sample of the stage's last update in that prefix, i.e. the first differing update. About
    log2(n) extra simulator runs.
    """

    def check(k: int) -> list[Mismatch]:
        g = _golden(plan, model, x[:k], labels[:k], train[:k])
        r = run_network(design, x[:k], labels[:k], train[:k], init=init, **run_kw)
        return compare(g, r, plan, labels[:k])

    lo, hi, found = 0, len(x), full
    while hi - lo > 1:
        mid = (lo + hi) // 2
        mm = check(mid)
        if mm:
            hi, found = mid, mm
        else:
            lo = mid
    return hi, found


def check_network(
    plan: Plan,
    model: Any,
    x: torch.Tensor,
    labels: Sequence[int],
    train: Sequence[bool] | None = None,
    *,
    rtl_plan: Plan | None = None,
    design: NetworkDesign | None = None,
    localise_first: bool = True,
    valid_prob: float = 1.0,
    ready_prob: float = 1.0,
    seed: int = 0,
    waves: str | Path | None = None,
    simulator: str | None = None,
) -> SimReport:
    """Simulate ``NetworkTop`` on a stream and compare it with the golden model bit for bit.

    ``x``: int64 (n, N) quantised samples; ``labels``, ``train`` as in :func:`run_network`.
    ``rtl_plan``: a plan for the hardware only (fault injection: the golden model keeps
    ``plan``); ``design``: a prebuilt design (else built here). ``waves``: a ``.vcd`` or
    ``.fst`` path to record (builds a tracing variant). ``localise_first``: when memories
    differ, bisect stream prefixes to name the first differing update (extra runs).
    ``simulator``: ``"verilator"`` or ``"icarus"`` (default: the ``design``'s, else
    Verilator).

    Returns a :class:`SimReport` (cycles, cycles per second, build seconds). Raises
    :class:`ValueError` for an unknown simulator or one that differs from ``design``'s, and the
    harness's :class:`~pipetrain.sim.harness.ToolchainError` /
    :class:`~pipetrain.sim.harness.RTLSimError` (missing tools, a failed build or run).
    """
    from ..golden import GoldenModel

    n = len(x)
    train = [True] * n if train is None else [bool(t) for t in train]
    hw_plan = rtl_plan or plan
    wave_kind = None
    if waves is not None:
        wave_kind = "fst" if str(waves).endswith(".fst") else "vcd"
    if design is not None and simulator is not None and simulator != design.build.simulator:
        raise ValueError(
            f"simulator {simulator!r} differs from the prebuilt design's "
            f"{design.build.simulator!r}: pass no design, or no simulator"
        )
    sim = simulator or (design.build.simulator if design is not None else DEFAULT_SIMULATOR)
    built = design is None or (wave_kind is not None and design.build.waves != wave_kind)
    if built:
        design = build_network(hw_plan, simulator=sim, waves=wave_kind)
    assert design is not None
    init = GoldenModel(plan, model).memories()
    run_kw = {"valid_prob": valid_prob, "ready_prob": ready_prob, "seed": seed}
    rtl = run_network(design, x, labels, train, init=init, waves_file=waves, **run_kw)
    golden = _golden(plan, model, x, labels, train)
    mismatches = compare(golden, rtl, plan, labels)
    first = min(mismatches, key=lambda m: (m.tick is None, m.tick or 0)) if mismatches else None
    how = None
    if mismatches and localise_first and any(m.what == "memory" for m in mismatches):
        k, mm = localise(design, plan, model, x, labels, train, init, mismatches, **run_kw)
        mem = [m for m in mm if m.what == "memory"]
        if mem:
            cand = min(mem, key=lambda m: (m.tick is None, m.tick or 0))
            if first is None or first.tick is None or (cand.tick or 0) < first.tick:
                first = cand
            how = (
                f"bisection over stream prefixes: first {k - 1} samples match, the update "
                f"of sample {k - 1} differs ({len(mem)} memory elements)"
            )
    return SimReport(
        bit_exact=not mismatches,
        mismatches=mismatches,
        first=first,
        samples=n,
        cycles=rtl.stream_cycles + rtl.flush_cycles,
        total_cycles=rtl.cycles,
        cycles_per_sample=_steady_cycles_per_sample(rtl),
        ideal_cycles_per_sample=plan.ideal_cycles_per_sample,
        sim_cycles_per_s=rtl.cycles / rtl.sim_s if rtl.sim_s > 0 else 0.0,
        build_s=design.build_s if built else 0.0,
        localisation=how,
        extra={
            "simulator": design.build.simulator,
            "sim_wall_s": rtl.wall_s,
            "build_cached": design.build.cached,
            "ticks": rtl.counters["ticks"],
            "samples_trained": rtl.counters["samples_trained"],
            "saturations": rtl.counters["saturations"],
            **(
                {"head_correct": rtl.counters["head_correct"]}
                if "head_correct" in rtl.counters
                else {}
            ),
            "handshakes": rtl.handshakes,
            "train_cycles_per_s": _train_speed(rtl),
        },
    )
