"""WeightsCommand (READ_WEIGHTS / WRITE_WEIGHTS) in Amaranth's simulator against the device
model: the same NAKs, the same words read, the same weights written, under random backpressure
on ``args``, ``wacc_cmd`` and ``wacc_rsp``; ``flush`` is high while a ``wacc_cmd`` waits."""

from __future__ import annotations

import random
from collections import deque

import pytest
from amaranth.sim import Simulator
from pipetrain.hdl.link_weights import WeightsCommand
from pipetrain.protocol.device_model import LinkDeviceModel, ToyNetwork
from pipetrain.protocol.wire import (
    NAK,
    Cmd,
    Frame,
    FrameDecoder,
    LinkParams,
    NakReason,
    encode_frame,
    weight_header,
)
from test_link import PLAN


def run_weights(params: LinkParams, commands: list[tuple[int, bytes]], toy: ToyNetwork, seed: int):
    """Execute ``(cmd, payload)`` commands against ``toy``; return ``(nak, emitted bytes)`` per
    command."""
    dut = WeightsCommand(params)
    rng = random.Random(seed)
    out: list[tuple[int, bytes]] = []

    async def bench(ctx):
        word = 0
        pending: deque[int] = deque()  # wacc responses not yet taken
        for cmd, payload in commands:
            ctx.set(dut.cmd.payload, {"write": cmd == Cmd.WRITE_WEIGHTS, "length": len(payload)})
            ctx.set(dut.cmd.valid, 1)
            pos, offered, rsp_on = 0, False, False
            emitted = bytearray()
            while True:
                offered = pos < len(payload) and (offered or rng.random() < 0.6)
                ctx.set(dut.args.valid, offered)
                if offered:
                    ctx.set(dut.args.payload, {"data": payload[pos], "last": 0})
                ctx.set(dut.word, word)
                wc_ready = not pending and rng.random() < 0.5
                ctx.set(dut.wacc_cmd.ready, wc_ready)
                rsp_on = bool(pending) and (rsp_on or rng.random() < 0.5)
                ctx.set(dut.wacc_rsp.valid, rsp_on)
                if rsp_on:
                    ctx.set(dut.wacc_rsp.payload.data, pending[0])
                _, _, took, wc, w, rsp_taken, e, eb, flush, done, nak = await ctx.tick().sample(
                    dut.args.ready,
                    dut.wacc_cmd.valid,
                    dut.wacc_cmd.payload,
                    dut.wacc_rsp.ready,
                    dut.emit.valid,
                    dut.emit.payload,
                    dut.flush,
                    dut.cmd.ready,
                    dut.nak,
                )
                assert flush or not wc, "a weight command waits without flush"
                if offered and took:
                    word = (word >> 8) | (payload[pos] << 24)
                    pos, offered = pos + 1, False
                if wc and wc_ready:
                    pending.append(toy.wacc(bool(w.write), w.stage, w.kind, w.row, w.col, w.data))
                if rsp_on and rsp_taken:
                    pending.popleft()
                    rsp_on = False
                if e:
                    emitted.append(eb)
                if done:
                    break
            ctx.set(dut.cmd.valid, 0)
            ctx.set(dut.args.valid, 0)
            assert not pending
            out.append((nak, bytes(emitted)))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return out


@pytest.mark.parametrize("max_words", [32, 2])  # 2: fewer than a row (count > max_words)
def test_weight_access_equals_the_device_model(max_words):
    rng = random.Random(4)
    P = LinkParams.from_plan(PLAN, max_words=max_words)
    commands = []
    for _ in range(12):
        s = rng.randrange(P.num_stages)
        col = rng.randrange(P.stage_cols[s])
        n = rng.randint(1, min(P.max_words, P.stage_cols[s] - col))
        hdr = weight_header(
            s, rng.randrange(P.stage_kinds[s]), rng.randrange(P.stage_rows[s]), col, n
        )
        if rng.random() < 0.5:
            words = b"".join(rng.getrandbits(32).to_bytes(4, "little") for _ in range(n))
            commands.append((Cmd.WRITE_WEIGHTS, hdr + words))
        commands.append((Cmd.READ_WEIGHTS, hdr))
    bad = [
        weight_header(P.num_stages, 0, 0, 0, 1),  # stage
        weight_header(0, P.stage_kinds[0], 0, 0, 1),  # kind
        weight_header(0, 0, P.stage_rows[0], 0, 1),  # row
        weight_header(0, 0, 256, 0, 1),  # row's high byte
        weight_header(0, 0, 0, P.stage_cols[0] - 1, 2),  # col + count
        weight_header(0, 0, 0, 1 << 8, 1),  # col's high byte
        weight_header(0, 0, 0, 0, 0),  # count 0
        weight_header(0, 0, 0, 0, P.max_words + 1),  # count > max_words
    ]
    commands[3:3] = [(Cmd.READ_WEIGHTS, h) for h in bad]
    commands.append((Cmd.WRITE_WEIGHTS, weight_header(0, 0, 0, 0, 2) + bytes(4)))  # length

    model = LinkDeviceModel(P, ToyNetwork(P))
    want = []
    for i, (cmd, payload) in enumerate(commands):
        (f,) = FrameDecoder().feed(model.step(encode_frame(Frame(cmd, i, payload))))
        want.append((NakReason.BAD_ARG, b"") if f.type == NAK else (0, f.payload))
    assert sum(nak != 0 for nak, _ in want) == len(bad) + 1

    toy = ToyNetwork(P)
    assert run_weights(P, commands, toy, seed=5) == want
    assert toy.weights == model.net.weights
