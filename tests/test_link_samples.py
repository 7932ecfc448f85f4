"""SamplesCommand (SAMPLES) in Amaranth's simulator: records built with ``protocol.wire`` become
``sample_in`` beats with the device model's values, one ``bump`` after each record, under
random backpressure on ``args``, ``sample_in`` and ``bump``."""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator
from pipetrain.hdl.link_samples import SamplesCommand
from pipetrain.protocol.wire import LinkParams, encode_record
from test_link import PLAN

PARAMS = LinkParams.from_plan(PLAN)


def run_samples(commands: list[bytes], seed: int, p_args=0.6, p_si=0.5, p_bump=0.4):
    """Execute SAMPLES with each payload of ``commands``; return per command the events in
    order: ``("beat", x, label, train, last)`` and ``("bump",)``."""
    dut = SamplesCommand(PLAN, PARAMS)
    rng = random.Random(seed)
    log: list[list[tuple]] = []

    async def bench(ctx):
        word = 0  # the dispatcher's shift register: the last four bytes taken from args
        for payload in commands:
            events: list[tuple] = []
            pos, offered = 0, False
            ctx.set(dut.cmd.valid, 1)
            while True:
                offered = pos < len(payload) and (offered or rng.random() < p_args)
                ctx.set(dut.args.valid, offered)
                if offered:
                    ctx.set(
                        dut.args.payload, {"data": payload[pos], "last": pos == len(payload) - 1}
                    )
                ctx.set(dut.word, word)
                ctx.set(dut.sample_in.ready, rng.random() < p_si)
                ctx.set(dut.bump.ready, rng.random() < p_bump)
                _, _, took, beat, si, bump, done = await ctx.tick().sample(
                    dut.args.ready,
                    dut.sample_in.payload,
                    dut.sample_in.valid & dut.sample_in.ready,
                    dut.bump.valid & dut.bump.ready,
                    dut.cmd.ready,
                )
                if offered and took:
                    word = (word >> 8) | (payload[pos] << 24)
                    pos, offered = pos + 1, False
                if si:
                    events.append(("beat", beat.x, beat.label, beat.train, beat.last))
                if bump:
                    events.append(("bump",))
                if done:
                    assert pos == len(payload)
                    break
            ctx.set(dut.cmd.valid, 0)
            ctx.set(dut.args.valid, 0)
            log.append(events)
            await ctx.tick().repeat(rng.randint(1, 3))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return log


def expected(records: list[tuple[list[int], int, bool]]) -> list[tuple]:
    N = PARAMS.in_features
    out: list[tuple] = []
    for x, label, train in records:
        out += [("beat", v, label, int(train), int(i == N - 1)) for i, v in enumerate(x)]
        out.append(("bump",))
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_records_to_beats(seed):
    rng = random.Random(seed)
    X = PARAMS.x_bits
    lo, hi = -(1 << (X - 1)), (1 << (X - 1)) - 1
    commands, want = [], []
    for k in [1, PARAMS.max_batch, 2]:
        recs = [
            (
                [rng.choice((lo, hi, 0, -1, rng.randint(lo, hi))) for _ in range(4)],
                rng.randrange(1 << 16),
                rng.random() < 0.5,
            )
            for _ in range(k)
        ]
        commands.append(b"".join(encode_record(PARAMS, *r) for r in recs))
        want.append(expected(recs))
    assert run_samples(commands, seed) == want
