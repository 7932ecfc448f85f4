"""The parts of the network top alone (Amaranth simulator), each with random gaps on its valid
inputs and random backpressure on every valid/ready stream:

* :class:`SampleWriter`: ``sample_in`` beats → stage 1's stash words and the pending sample
  (held, and ``sample_in`` stalled, until the tick controller takes it);
* :class:`ResultQueue`: records leave in order, numbered, exactly once; ``room_next``
  promises room a cycle ahead;
* :class:`WeightAccess`: commands reach the right stage, lane and address (constant division),
  bad commands answer 0 without an access, one answer per command;
* :class:`SaturationCounter`: counts every raised flag.
"""

from __future__ import annotations

import random

import pytest
from amaranth import Const
from amaranth.hdl import Fragment
from amaranth.sim import Simulator
from pipetrain.hdl.saturation import GROUP, SUMS, SaturationCounter, counter_lag
from pipetrain.hdl.streams import sample_layout, wacc_cmd_layout
from pipetrain.hdl.top import ResultQueue, SampleWriter
from pipetrain.hdl.wacc import AccessGeometry, WeightAccess
from pipetrain.hdl.weights import access_latency
from tiny_net import tiny


def _pack(layout, **fields) -> int:
    return int(Const.cast(layout.const(fields).as_value()).value)


def test_sample_writer_under_random_gaps_and_backpressure():
    plan, _, _ = tiny()
    N = plan.in_features
    dut = SampleWriter(plan)
    rng = random.Random(5)
    lay = sample_layout(plan)
    samples = [
        ([rng.randrange(-3000, 3000) for _ in range(N)], rng.randrange(3), rng.random() < 0.7)
        for _ in range(8)
    ]
    samples[2] = (samples[2][0] + [1, 2], *samples[2][1:])  # extra beats before `last`: dropped
    taken = []

    async def host(ctx):
        for xs, label, train in samples:
            for k, x in enumerate(xs):
                while rng.random() < 0.4:  # gaps between beats
                    ctx.set(dut.samples.valid, 0)
                    await ctx.tick()
                beat = _pack(lay, x=x, label=label, train=train, last=k == len(xs) - 1)
                ctx.set(dut.samples.payload.as_value(), beat)
                ctx.set(dut.samples.valid, 1)
                await ctx.tick().until(dut.samples.ready)
            ctx.set(dut.samples.valid, 0)

    async def monitor(ctx):
        cur = []
        for _ in range(3000):
            if len(taken) == len(samples):
                break
            if ctx.get(dut.stash.valid):
                cur.append((ctx.get(dut.stash.payload.word), ctx.get(dut.stash.payload.data)))
            pend = dut.pending
            ready = rng.random() < 0.3
            ctx.set(pend.ready, ready)
            if ctx.get(pend.valid):
                assert ctx.get(dut.samples.ready) == 0  # sample_in stalls while one is pending
                if ready:
                    taken.append((ctx.get(pend.payload.label), ctx.get(pend.payload.train), cur))
                    cur = []
            await ctx.tick()
            ctx.set(pend.ready, 0)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(host, background=True)
    sim.add_testbench(monitor)
    sim.run()
    bits = plan.stages[0].formats.x.bits
    for (xs, label, train), (lab, tr, words) in zip(samples, taken, strict=True):
        assert (lab, tr) == (label, train)
        assert words == [(k, xs[k] & ((1 << bits) - 1)) for k in range(N)]


def test_result_queue_delivers_in_order_under_backpressure():
    dut = ResultQueue(3)
    rng = random.Random(2)
    records = [
        (rng.randrange(1 << 16), rng.randrange(1 << 32), rng.random() < 0.5) for _ in range(25)
    ]
    out = []

    async def producer(ctx):
        for pred, loss, train in records:
            while not ctx.get(dut.room) or rng.random() < 0.5:
                await ctx.tick()
            ctx.set(dut.push.valid, 1)
            ctx.set(dut.push.payload.pred, pred)
            ctx.set(dut.push.payload.loss, loss)
            ctx.set(dut.push.payload.train, train)
            await ctx.tick()
            ctx.set(dut.push.valid, 0)

    async def consumer(ctx):
        while len(out) < len(records):
            ready = rng.random() < 0.35
            ctx.set(dut.out.ready, ready)
            if ready and ctx.get(dut.out.valid):
                p = dut.out.payload
                out.append((ctx.get(p.sample), ctx.get(p.pred), ctx.get(p.loss), ctx.get(p.train)))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer, background=True)
    sim.add_testbench(consumer)
    sim.run()
    assert out == [(n, p, lo, int(t)) for n, (p, lo, t) in enumerate(records)]


@pytest.mark.parametrize("depth", [2, 3, 5])
def test_result_queue_room_next_promises_room(depth):
    """``room_next`` (with this cycle's push) ⇒ ``room`` in the next cycle, under random pushes
    and backpressure: the tick controller decides a start a cycle ahead on it (hdl/tick.py)."""
    dut = ResultQueue(depth)
    rng = random.Random(depth)
    pushed, out, promised = [], [], [False]

    async def producer(ctx):
        for n in range(60):
            push = promised[0] and rng.random() < 0.7
            if push:
                assert ctx.get(dut.room), f"room_next promised room at push {n}"
                pushed.append(n)
            ctx.set(dut.push.valid, push)
            ctx.set(dut.push.payload.pred, n)
            promised[0] = bool(ctx.get(dut.room_next))
            await ctx.tick()
        ctx.set(dut.push.valid, 0)

    async def consumer(ctx):
        for _ in range(60):
            ready = rng.random() < 0.3
            ctx.set(dut.out.ready, ready)
            if ready and ctx.get(dut.out.valid):
                out.append(ctx.get(dut.out.payload.pred))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(consumer, background=True)
    sim.add_testbench(producer)
    sim.run()
    assert len(pushed) >= 5 and out == pushed[: len(out)]


def test_result_queue_room_next_keeps_three_cycle_ticks():
    """Depth 3 and a consumer that is always ready: a record pushed every 3 cycles (the
    shortest ``pb`` tick: IDLE, START, RUN) never waits for ``room_next``."""
    dut = ResultQueue(3)
    seen = []

    async def tb(ctx):
        ctx.set(dut.out.ready, 1)
        for c in range(30):
            ctx.set(dut.push.valid, c % 3 == 0)
            if c % 3 == 0:
                seen.append(ctx.get(dut.room_next))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert seen == [1] * 10


def test_result_queue_refuses_depth_1():
    with pytest.raises(ValueError, match="depth >= 2"):
        ResultQueue(1)


class _Ecp5:
    """A stand-in platform of the ECP5 family (``hdl.dsp.is_ecp5``)."""

    family = "ecp5"


@pytest.mark.parametrize("ecp5", [False, True])
def test_weight_access_addresses_and_answers(ecp5):
    """Commands reach the right stage, lane and address; the answer is taken
    ``access_latency`` cycles after ``en`` — the slowest stage's: on the ECP5 stage 1's 6 lanes
    add a 4-way level (4 cycles), and the stages model answers only from then on. Stage 3 has
    3 column lanes (weight (j, i) in lane (i mod 3)·2 + j mod 2, address (j div 2)·2 + i div 3)."""
    lanes = 6 if ecp5 else 2
    geo = [
        AccessGeometry(lanes, 6, 5, 3 * 7),
        AccessGeometry(3, 5, 4, 2 * 6),
        AccessGeometry(2, 4, 3, 2 * 2, columns=3),
    ]
    platform = _Ecp5() if ecp5 else None
    latency = max(access_latency(g.lanes, platform) for g in geo)
    assert latency == (4 if ecp5 else 3)
    dut = WeightAccess(geo, tiny()[0].shift_add)  # the plan's constant-multiplier rule
    rng = random.Random(4)
    lay = wacc_cmd_layout()
    cmds = []
    for _ in range(40):
        st = rng.randrange(4)  # stage 3 (0-based) does not exist
        g = geo[st] if st < 3 else geo[0]
        cmds.append(
            dict(
                write=rng.random() < 0.5,
                stage=st,
                kind=rng.choice([0, 1, 1, 2]),
                row=rng.randrange(g.out_features + 1),
                col=rng.randrange(g.in_features + 2),
                data=rng.randrange(-1000, 1000),
            )
        )
    answers, accesses = [], []

    async def host(ctx):
        for c in cmds:
            while rng.random() < 0.4:
                await ctx.tick()
            ctx.set(dut.cmd.payload.as_value(), _pack(lay, **c))
            ctx.set(dut.cmd.valid, 1)
            await ctx.tick().until(dut.cmd.ready)
            ctx.set(dut.cmd.valid, 0)

    async def stages(ctx):
        """The stages' stores: the answer from ``latency`` cycles after ``en`` on (held while
        the request is unchanged), a wrong value before."""
        since = None  # cycles since the last en
        while len(answers) < len(cmds):
            ctx.set(dut.allowed, rng.random() < 0.7)
            for n in range(3):
                port = dut.stage(n)
                if ctx.get(port.en):
                    rec = (n, ctx.get(port.write), ctx.get(port.kind), ctx.get(port.lane))
                    accesses.append((*rec, ctx.get(port.addr), ctx.get(port.data)))
                    since = 0
            ready = rng.random() < 0.5
            ctx.set(dut.rsp.ready, ready)
            if ready and ctx.get(dut.rsp.valid):
                answers.append(ctx.get(dut.rsp.payload.data))
            await ctx.tick()
            since = None if since is None else since + 1
            for n in range(3):  # what a stage answers
                ctx.set(dut.stage(n).rdata, 1000 + n if since and since >= latency else -7)

    sim = Simulator(Fragment.get(dut, platform))
    sim.add_clock(1e-8)
    sim.add_testbench(host, background=True)
    sim.add_testbench(stages)
    sim.run()
    exp_acc, exp_ans = [], []
    for c in cmds:
        n = c["stage"]
        ok = n < 3 and c["kind"] <= 1 and c["row"] < geo[n].out_features
        ok = ok and c["col"] <= geo[n].in_features
        if ok:
            L, k, C = geo[n].lanes, geo[n].columns, geo[n].group_words
            grp, (q, s) = c["row"] // L, divmod(c["col"], k)
            lane = s * L + c["row"] % L
            exp_acc.append((n, c["write"], c["kind"], lane, grp * C + q, c["data"]))
        exp_ans.append(1000 + n if ok else 0)
    assert accesses == exp_acc
    assert answers == exp_ans


@pytest.mark.parametrize("n", [5, GROUP, GROUP + 1, GROUP * SUMS, GROUP * SUMS + 1, 96, 97])
def test_saturation_counter_counts_every_flag(n):
    """Every raised flag is counted, with the lag the docstring gives: one cycle for up to
    GROUP flags, two when the group popcounts are registered, three when more than SUMS of
    them are summed into registers first (96: stage 1 of mlp-digits 32,10)."""
    dut = SaturationCounter(n)
    rng = random.Random(1)
    pattern = [rng.getrandbits(n) for _ in range(300)]
    got = []

    async def bench(ctx):
        for p in pattern:
            ctx.set(dut.flags, p)
            await ctx.tick()
            got.append(ctx.get(dut.count))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    # the flags are registered: after the tick that presents pattern[i], the count holds the
    # flags of pattern[0 .. i−1] (up to GROUP flags), of pattern[0 .. i−2] (more)
    lag = 1 if n <= GROUP else 2 if n <= GROUP * SUMS else 3
    assert counter_lag(n) == lag
    total, exp = 0, []
    for i in range(len(pattern)):
        exp.append(total)
        if i + 1 - lag >= 0:
            total += bin(pattern[i + 1 - lag]).count("1")
    assert got == exp
    assert got[-1] > 0
