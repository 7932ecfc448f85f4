"""SamplesCommand (SAMPLES) in Amaranth's simulator: records built with ``protocol.wire`` become
``sample_in`` beats with the device model's values, one ``bump`` after each record, under
random backpressure on ``args``, ``sample_in`` and ``bump``; features bit-packed at every input
width the unpacker has a distinct case for (several features per byte, byte-aligned, straddling
bytes, the widest window)."""

from __future__ import annotations

import dataclasses
import random

import pytest
from amaranth.sim import Simulator
from pipetrain.compiler.plan import QFormat
from pipetrain.hdl.link_samples import SamplesCommand
from pipetrain.protocol.wire import LinkParams, decode_features, encode_record
from test_link import PLAN

PARAMS = LinkParams.from_plan(PLAN)


def plan_with_input_bits(bits: int):
    """PLAN with stage 1's input format ``bits`` wide (the only width SamplesCommand reads)."""
    st = PLAN.stages[0]
    fmts = dataclasses.replace(st.formats, x=QFormat(bits, bits - 3))
    return dataclasses.replace(
        PLAN, stages=(dataclasses.replace(st, formats=fmts),) + PLAN.stages[1:]
    )


def run_samples(
    commands: list[bytes], seed: int, p_args=0.6, p_si=0.5, p_bump=0.4, plan=PLAN, params=PARAMS
):
    """Execute SAMPLES with each payload of ``commands``; return per command the events in
    order: ``("beat", x, label, train, last)`` and ``("bump",)``."""
    dut = SamplesCommand(plan, params)
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


def expected(records: list[tuple[list[int], int, bool]], params=PARAMS) -> list[tuple]:
    N = params.in_features
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


@pytest.mark.parametrize("bits", [5, 8, 12, 25])
def test_packed_widths(bits):
    """X = 5 (one byte completes up to two features), 8, 12 (a feature straddles two bytes,
    record of 3 + ⌈4·12/8⌉ = 9 bytes), 25 (the widest: the feature starts at word bit 0)."""
    plan = plan_with_input_bits(bits)
    params = LinkParams.from_plan(plan)
    assert params.x_bits == bits and params.record_bytes == 3 + -(-4 * bits // 8)
    rng = random.Random(bits)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    commands, want = [], []
    for k in [1, params.max_batch]:
        recs = [
            ([rng.choice((lo, hi, 0, -1, rng.randint(lo, hi))) for _ in range(4)], k, True)
            for _ in range(k)
        ]
        payload = b"".join(encode_record(params, *r) for r in recs)
        assert [
            decode_features(params, payload[j * params.record_bytes + 3 :][: params.feature_bytes])
            for j in range(k)
        ] == [r[0] for r in recs]
        commands.append(payload)
        want.append(expected(recs, params))
    assert run_samples(commands, bits, plan=plan, params=params) == want


def test_wider_inputs_refused():
    with pytest.raises(ValueError, match="≤ 25 bits"):
        LinkParams.from_plan(plan_with_input_bits(26))
