"""ResultBuffer and ReadResults (READ_RESULTS) in Amaranth's simulator under random backpressure:
the bytes read equal ``protocol.wire.Result.to_bytes`` of the results pushed, in order."""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator
from pipetrain.hdl.link_results import ReadResults, ResultBuffer
from pipetrain.protocol.wire import RESULT_BYTES, LinkParams, NakReason, Result
from stream_sim import StreamRules, stream_get, stream_put
from test_link import PLAN

PARAMS = LinkParams.from_plan(PLAN)


def random_results(rng: random.Random, n: int) -> list[Result]:
    return [
        Result(i, rng.randrange(1 << 16), rng.getrandbits(32), rng.random() < 0.5) for i in range(n)
    ]


def result_payload(r: Result) -> dict:
    return {"sample": r.sample, "pred": r.pred, "loss": r.loss, "train": r.train}


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("depth, p_in, p_out", [(4, 0.9, 0.2), (16, 0.3, 0.9), (5, 0.6, 0.6)])
def test_buffer_bytes_in_order_and_backpressure(depth, p_in, p_out, packed):
    """Results in with random gaps, bytes out with random ``ready``: every result's 11 bytes in
    order, ``last`` on the 11th; ``level`` never above ``depth`` and a full buffer takes
    nothing (a slow reader makes it fill). 40 results wrap every buffer's addresses (packed:
    at depth · 11 bytes, not a power of two)."""
    dut = ResultBuffer(depth, packed=packed)
    rng = random.Random(depth)
    results = random_results(rng, 40)
    got: list[tuple[int, int]] = []
    levels: list[int] = []
    rules = StreamRules(dut.o, "o")

    async def writer(ctx):
        for r in results:
            await stream_put(ctx, dut.i, result_payload(r), rng, p_in)

    async def reader(ctx):
        for _ in range(len(results) * RESULT_BYTES):
            beat = await stream_get(ctx, dut.o, rng, p_out)
            got.append((beat.data, beat.last))

    async def monitor(ctx):
        async for _, _, level, full_take in ctx.tick().sample(
            dut.level, dut.i.ready & (dut.level == depth)
        ):
            levels.append(level)
            assert not full_take, "a full buffer took a result"

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(writer, background=True)
    sim.add_testbench(reader)
    sim.add_process(monitor)
    sim.add_process(rules.run)
    sim.run()
    assert bytes(b for b, _ in got) == b"".join(r.to_bytes() for r in results)
    assert [last for _, last in got] == ([0] * (RESULT_BYTES - 1) + [1]) * len(results)
    assert max(levels) <= depth and (p_out > 0.5 or max(levels) == depth)
    assert rules.violations == []


def test_read_results_counts_and_naks():
    """READ_RESULTS max: n = min(max, buffered, max_results), then n results; one ``bump``
    per result, after its last byte; max = 0 is NAKed BAD_ARG with nothing emitted."""
    dut = ReadResults(PARAMS)
    rng = random.Random(7)
    results = random_results(rng, 13)
    requests = [0, 3, 1, 255, 5]  # 13 buffered: 3, 1, then min(255, 9, max_results), then 0
    responses: list[tuple[int, bytes, int]] = []
    pushed = []

    async def network(ctx):
        for r in results:
            await stream_put(ctx, dut.result_out, result_payload(r), rng, 0.7)
        pushed.append(True)

    async def host(ctx):
        while not pushed:  # every result buffered first: n is then known
            await ctx.tick()
        for want in requests:
            ctx.set(dut.cmd.valid, 1)
            emitted, bumps, beats_at_bump = bytearray(), 0, []
            args_left = [want]
            while True:
                ctx.set(dut.args.valid, bool(args_left) and rng.random() < 0.6)
                ctx.set(dut.args.payload, {"data": want, "last": 1})
                ctx.set(dut.bump.ready, rng.random() < 0.4)
                _, _, a, e, b, done, nak, emit = await ctx.tick().sample(
                    dut.args.valid & dut.args.ready,
                    dut.emit.valid,
                    dut.bump.valid & dut.bump.ready,
                    dut.cmd.ready,
                    dut.nak,
                    dut.emit.payload,
                )
                if a:
                    args_left.clear()
                if e:
                    emitted.append(emit)
                if b:
                    bumps += 1
                    beats_at_bump.append(len(emitted))
                if done:
                    break
            ctx.set(dut.cmd.valid, 0)
            ctx.set(dut.args.valid, 0)
            assert beats_at_bump == [1 + RESULT_BYTES * (k + 1) for k in range(bumps)]
            responses.append((nak, bytes(emitted), bumps))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(network, background=True)
    sim.add_testbench(host)
    sim.run()
    counts = [0, 3, 1, min(9, PARAMS.max_results), 0]
    assert [r[0] for r in responses] == [NakReason.BAD_ARG, 0, 0, 0, 0]
    pos, want_bytes = 0, []
    for n, req in zip(counts, requests, strict=True):
        want_bytes.append(
            b""
            if req == 0
            else bytes((n,)) + b"".join(r.to_bytes() for r in results[pos : pos + n])
        )
        pos += n
    assert [r[1] for r in responses] == want_bytes
    assert [r[2] for r in responses] == counts
