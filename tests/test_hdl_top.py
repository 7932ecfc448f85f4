"""NetworkTop in Amaranth's simulator against the golden model, bit for bit: every result record,
every final weight and velocity (read back through ``wacc``), the counters and the cycles.

The tiny network (6 → 5 LeakyReLU → 4 ReLU → 3, lanes 2/3/2: padding lanes, several row groups,
input-gradient accumulation over groups) is the golden model's own oracle network; its stream
mixes inference samples in. Runtime: ~25 s for the file (each run builds the simulator, ~1 s).
"""

from __future__ import annotations

import pytest
import torch
from amaranth import Const
from amaranth.sim import Simulator
from pipetrain.hdl.top import NetworkTop, sample_layout, wacc_cmd_layout
from pipetrain.sim.golden import GoldenModel
from pipetrain.sim.tb.pysim import simulate_top
from tiny_net import tiny, tiny_stream

# a weight bank's read that meets a write to its address reads garbage (conftest)
pytestmark = pytest.mark.usefixtures("poisoned_collisions")


def golden_and_rtl(plan, model, cfg, n=30, **sim_kw):
    """Run the same quantised stream through the golden model and the RTL."""
    g = GoldenModel(plan, model, cfg)
    x, y, train = tiny_stream(n)
    xq = g.quantise_input(x)
    init = g.memories()
    for i in range(n):
        g.submit(xq[i], int(y[i]), train[i])
    g.flush()
    run = simulate_top(plan, xq, y.tolist(), train, init=init, **sim_kw)
    return g, run


def assert_bit_exact(g, run):
    assert run.echo_errors == []
    assert run.results == [(r.sample, r.pred, r.loss_raw, int(r.train)) for r in g.results]
    gm = g.memories()
    for name, mem in gm.items():
        assert sorted(run.memories[name]) == sorted(mem), name  # w_prev with the LWP w form
        for kind in mem:
            assert torch.equal(run.memories[name][kind], mem[kind]), (name, kind)
    expect = {
        "samples_trained": g.samples_applied,
        "ticks": g.ticks,
        "saturations": g.stage_saturations,
    }
    if g.head_results:  # per head: samples whose head prediction equals the label
        x, y, train = tiny_stream(len(g.results))
        expect["head_correct"] = [
            sum(r.pred == int(y[r.sample]) for r in g.head_results[k])
            for k in sorted(g.head_results)
        ]
    assert run.counters == expect


CASES = [
    dict(schedule="pb"),
    dict(schedule="pb", mitigation="sc+lwp", rounding="nearest_even", loss="mse"),
    dict(schedule="pb", mitigation="lwp", loss="mse", lr=0.3),  # drives the formats to clamp
    # LWP w form (the w_prev banks) with SC, where it differs from the v form, and clamps: a
    # clamped step makes w − w_prev wider than u (Stage.what_bits)
    dict(schedule="pb", mitigation="sc+lwp", lwp_form="w", loss="mse", lr=0.3),
    dict(schedule="sequential", mitigation="sc"),
    # the ECP5's operand registers (every product one or two stages later: a later write
    # stage, so write-backs nearer the next pass's reads)
    dict(schedule="pb", mitigation="sc", operand_registers=1),
    dict(schedule="pb", mitigation="sc+lwp", lwp_form="w", operand_registers=2),
    # the iCE40 options: single-port (SPRAM) weights, a slot every other cycle, and 5-bit
    # constants (lr a shift, m = 0.90625 a shift-add) — with and without SC (write stage 5
    # either way) and with LWP (H·u as shifts)
    dict(schedule="pb", lanes=(1, 3, 1), single_port=(1, 3), const_bits=5),
    dict(schedule="pb", mitigation="sc+lwp", lanes=(1, 1, 1), single_port=(2,), const_bits=4),
    # tanh and sigmoid hidden stages: the LUT ROM, the stashed y, the derivative (numerics §3.4)
    dict(schedule="pb", acts=("tanh", "sigmoid")),
    # local learning: a one-stage head on stage 1 (fan-out to stage 2 and the head, two loss
    # units), then two-stage heads on two blocks with SC+LWP w form and clamps
    dict(schedule="pb", strategy="local", blocks=(1,)),
    dict(
        schedule="pb",
        strategy="local",
        blocks=(1, 2),
        head_stages=2,
        mitigation="sc+lwp",
        lwp_form="w",
        loss="mse",
        lr=0.3,
    ),
    # interlocking d=2, rule sum (K=3): stage 1 sums L1 (its δ kept in dsum_l1), L2 and L3
    # (the same tick); stage 2 sends both L2's and L3's input gradients; SC+LWP w, clamps (the
    # δ sum's too)
    dict(
        schedule="pb",
        strategy="interlocking",
        blocks=(1, 2),
        distance=2,
        rule="sum",
        mitigation="sc+lwp",
        lwp_form="w",
        loss="mse",
        lr=0.3,
    ),
    # heads under sequential: one sample at a time, its passes in the tick model's order (a
    # stream of another tick is another pass): the sum rule (d=2) with clamps, and (slow) the
    # only rule's pass-through stream (stage 2 passes L2 back to stage 1)
    dict(
        schedule="sequential",
        strategy="interlocking",
        blocks=(1, 2),
        distance=2,
        rule="sum",
        loss="mse",
        lr=0.3,
    ),
    pytest.param(  # ≈ 23 s in Amaranth's simulator: --runslow (the sum case covers the rest)
        dict(schedule="sequential", strategy="interlocking", blocks=(1, 2), distance=1),
        marks=pytest.mark.slow,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c.values())))
def test_tiny_network_equals_golden(case):
    plan, model, cfg = tiny(**case)
    g, run = golden_and_rtl(plan, model, cfg)
    assert_bit_exact(g, run)
    if case.get("lr") == 0.3:
        assert sum(run.counters["saturations"]) > 0
    if case.get("rule") == "sum":  # the δ sum clamped too (numerics §5.6), compared above
        assert g.tensor_saturations[0]["d"] > 0 and g.tensor_saturations[1]["d"] > 0
    # cycles: back-to-back training samples are exactly the plan's estimate apart (results
    # taken while samples still stream in; the bench's flush phase may see them a cycle early)
    train = tiny_stream()[2]
    rc = run.result_cycles
    steady = len(rc) - 2 * len(plan.stages)
    deltas = [rc[k + 1] - rc[k] for k in range(1, steady) if train[k] and train[k + 1]]
    expect = plan.tick_cycles if plan.schedule == "pb" else plan.ideal_cycles_per_sample
    assert len(deltas) > 10 and set(deltas) == {expect}


def test_random_backpressure_delivers_exactly_the_expected_beats():
    """valid/ready toggle at random on all four streams: the same bits as free-running."""
    plan, model, cfg = tiny()
    g, run = golden_and_rtl(plan, model, cfg, n=12, valid_prob=0.45, ready_prob=0.35, seed=9)
    assert len(run.results) == 12
    assert_bit_exact(g, run)


def test_three_lane_stage_one_and_larger_groups():
    """Stage 1 with 3 lanes over 5 rows and the last stage with one lane (3 row groups)."""
    plan, model, cfg = tiny(lanes=(3, 2, 1), mitigation="sc")
    g, run = golden_and_rtl(plan, model, cfg, n=14)
    assert_bit_exact(g, run)


def _pack(layout, **fields) -> int:
    return int(Const.cast(layout.const(fields).as_value()).value)


def test_weight_access_rules():
    """Writes saturate and echo the stored value; bad stage/kind/row/col answer 0 and change
    nothing; a command waits while a sample is in flight and is served once ``flush`` drains
    the pipeline."""
    plan, model, cfg = tiny()
    top = NetworkTop(plan)
    L = wacc_cmd_layout()
    wmax = plan.stages[0].formats.w.max_int
    log = []

    async def cmd(ctx, write, stage, kind, row, col, data=0, flush_after=None):
        ctx.set(
            top.wacc_cmd.payload.as_value(),
            _pack(L, write=write, stage=stage, kind=kind, row=row, col=col, data=data),
        )
        ctx.set(top.wacc_cmd.valid, 1)
        ctx.set(top.wacc_rsp.ready, 1)
        waited = 0
        while True:
            accepted = ctx.get(top.wacc_cmd.ready)
            await ctx.tick()
            waited += 1
            if accepted:
                ctx.set(top.wacc_cmd.valid, 0)
            if flush_after is not None and waited == flush_after:
                ctx.set(top.flush, 1)
            if ctx.get(top.wacc_rsp.valid):
                raw = ctx.get(top.wacc_rsp.payload.as_value())
                await ctx.tick()
                ctx.set(top.flush, 0)
                return (raw - (1 << 32) if raw >> 31 else raw), waited

    async def bench(ctx):
        log.append(await cmd(ctx, 1, 0, 0, 3, 6, (1 << 31) - 1))  # bias of row 3: saturates
        log.append(await cmd(ctx, 0, 0, 0, 3, 6))
        log.append(await cmd(ctx, 1, 1, 1, 2, 4, -(1 << 31)))  # u: saturates low
        log.append(await cmd(ctx, 0, 1, 1, 2, 4))
        for bad in ((0, 3, 0, 0, 0), (0, 0, 2, 0, 0), (0, 0, 0, 5, 0), (0, 0, 0, 0, 7)):
            log.append(await cmd(ctx, *bad))
        log.append(await cmd(ctx, 1, 0, 0, 5, 0, 77))  # row 5 does not exist: no write
        log.append(await cmd(ctx, 0, 0, 0, 4, 0))
        # one training sample in flight: a read waits until flush drains it
        beats = [
            _pack(sample_layout(plan), x=100 * i, label=1, train=1, last=i == 5) for i in range(6)
        ]
        for b in beats:
            ctx.set(top.sample_in.payload.as_value(), b)
            ctx.set(top.sample_in.valid, 1)
            await ctx.tick().until(top.sample_in.ready)
        ctx.set(top.sample_in.valid, 0)
        ctx.set(top.result_out.ready, 1)
        log.append(await cmd(ctx, 0, 0, 0, 3, 6, flush_after=400))
        log.append(ctx.get(top.samples_trained))

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    umin = plan.stages[1].formats.u.min_int
    assert [v for v, _ in log[:4]] == [wmax, wmax, umin, umin]
    assert [v for v, _ in log[4:10]] == [0] * 6  # four bad commands, the ignored write, row 4
    value, waited = log[10]
    assert waited > 400  # not served before the flush
    assert log[11] == 1  # the sample's stage-1 update was applied before the read
    # the golden model from the same memories (all zero but the two writes) and sample
    g = GoldenModel(plan, model, cfg)
    mem = {k: {kk: torch.zeros_like(vv) for kk, vv in v.items()} for k, v in g.memories().items()}
    mem[plan.stages[0].name]["w"][3, 6] = wmax
    mem[plan.stages[1].name]["u"][2, 4] = umin
    g.load_memories(mem)
    g.submit(torch.tensor([100 * i for i in range(6)]), 1, True)
    g.flush()
    assert value == int(g.memories()[plan.stages[0].name]["w"][3, 6]) != wmax


@pytest.mark.slow  # ≈ 45 CPU-s in Amaranth's simulator; the normal suite has the Verilator case
def test_interlocking_pass_through_streams_equal_golden_under_backpressure():
    """Interlocking d=2 with K=4 blocks (rule ``only``): stages 2–5 carry L3's pass-through
    stream (own error buffer, mask read and input gradient) besides their L4 update stream;
    SC+LWP w form; random valid/ready. Results, memories (w_prev too), every counter and the
    three heads' head_correct equal the golden model's."""
    from pipetrain.hdl.graph import stage_graph
    from pipetrain.sim.tb.regress import Case, prepare

    case = Case(
        "inter-d2",
        (6, 5, 5, 5, 5, 5, 4),
        (1, 2, 1, 2, 1, 2),
        strategy="interlocking",
        blocks=(1, 3, 5),
        distance=2,
        mitigation="sc+lwp",
        lwp_form="w",
        samples=20,
        seed=3,
    )
    plan, model, x, labels, train = prepare(case)
    graph = stage_graph(plan)
    assert [len(n.streams) for n in graph.stages[:6]] == [1, 2, 2, 2, 2, 1]
    g = GoldenModel(plan, model)
    init = g.memories()
    for i in range(len(x)):
        g.submit(x[i], int(labels[i]), train[i])
    g.flush()
    run = simulate_top(plan, x, labels, train, init=init, valid_prob=0.6, ready_prob=0.7, seed=5)
    assert run.results == [(r.sample, r.pred, r.loss_raw, int(r.train)) for r in g.results]
    for name, mem in g.memories().items():
        assert sorted(run.memories[name]) == sorted(mem), name
        for kind in mem:
            assert torch.equal(run.memories[name][kind], mem[kind]), (name, kind)
    heads = [
        sum(int(r.pred == labels[r.sample]) for r in g.head_results[k])
        for k in sorted(g.head_results)
    ]
    assert run.counters == {
        "samples_trained": g.samples_applied,
        "ticks": g.ticks,
        "saturations": g.stage_saturations,
        "head_correct": heads,
    }
