"""LinkTransmitter (the response framer) with the shared CRC in Amaranth's simulator: the bytes
equal ``protocol.wire.encode_frame`` and the CRC ``zlib.crc32``, under random backpressure on
``response``, ``data`` and ``tx``."""

from __future__ import annotations

import random
import zlib

import pytest
from amaranth import Elaboratable, Module
from amaranth.lib import wiring
from amaranth.sim import Simulator
from pipetrain.hdl.link_crc import LinkCRC
from pipetrain.hdl.link_tx import LinkTransmitter
from pipetrain.protocol.wire import NAK, SYNC, Frame, FrameDecoder, encode_frame
from stream_sim import StreamRules, stream_put


class TxTop(Elaboratable):
    def __init__(self) -> None:
        self.tx = LinkTransmitter()
        self.crc = LinkCRC()

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.tx, m.submodules.crc = self.tx, self.crc
        wiring.connect(m, self.tx.crc, self.crc.tx)
        return m


def run_transmitter(frames: list[Frame], seed: int, p_rsp=0.5, p_data=0.6, p_tx=0.5):
    """Send ``frames``; return the bytes on ``tx``, the number of ``tx`` bytes seen when each
    response was taken, and the stream-rule violations."""
    top = TxTop()
    dut = top.tx
    rng = random.Random(seed)
    out = bytearray()
    taken_at: list[int] = []
    rules = StreamRules(dut.tx, "tx")

    async def responses(ctx):
        for f in frames:
            hdr = {"type": f.type, "seq": f.seq, "length": len(f.payload)}
            await stream_put(ctx, dut.response, hdr, rng, p_rsp)

    async def payload(ctx):
        for f in frames:
            for i, b in enumerate(f.payload):
                beat = {"data": b, "last": i == len(f.payload) - 1}
                await stream_put(ctx, dut.data, beat, rng, p_data)

    async def sink(ctx):
        while True:
            ready = rng.random() < p_tx
            ctx.set(dut.tx.ready, ready)
            _, _, valid, byte, rsp_taken = await ctx.tick().sample(
                dut.tx.valid, dut.tx.payload, dut.response.valid & dut.response.ready
            )
            if valid and ready:
                out.append(byte)
            if rsp_taken:
                taken_at.append(len(out))

    total = sum(10 + len(f.payload) for f in frames)

    async def main(ctx):
        while len(out) < total:
            await ctx.tick()
        await ctx.tick().repeat(20)  # nothing more comes

    sim = Simulator(top)
    sim.add_clock(1e-6)
    sim.add_testbench(main)
    for bench in (responses, payload, sink):
        sim.add_testbench(bench, background=True)
    sim.add_process(rules.run)
    sim.run()
    return bytes(out), taken_at, rules.violations


@pytest.mark.parametrize("seed", [1, 2])
def test_frames_equal_encode_frame(seed):
    rng = random.Random(seed)
    frames = [Frame(0x81, 7, b""), Frame(NAK, 200, b"\x02\x02")]
    frames += [
        Frame(rng.randrange(256), rng.randrange(256), bytes(rng.randrange(256) for _ in range(n)))
        for n in [rng.choice((0, 1, 4, 26, 300)) for _ in range(8)]
    ]
    got, taken_at, violations = run_transmitter(frames, seed)
    assert got == b"".join(encode_frame(f) for f in frames)
    assert FrameDecoder().feed(got) == frames
    # every response is taken with its last CRC byte, not before
    ends = [sum(10 + len(f.payload) for f in frames[: k + 1]) for k in range(len(frames))]
    assert taken_at == ends
    assert violations == []
    # the CRC field is zlib's CRC-32 of type … payload, little endian
    pos = 0
    for f in frames:
        wire = got[pos : pos + 10 + len(f.payload)]
        assert wire[:2] == SYNC
        assert int.from_bytes(wire[-4:], "little") == zlib.crc32(wire[2:-4])
        pos += len(wire)


def test_no_backpressure_one_byte_per_cycle():
    """With every stream ready, a frame of L payload bytes takes 10 + L cycles."""
    frames = [Frame(0x85, 3, bytes(range(48)))]
    top = TxTop()
    dut = top.tx
    cycles = []

    async def bench(ctx):
        ctx.set(dut.tx.ready, 1)
        ctx.set(dut.response.payload, {"type": 0x85, "seq": 3, "length": 48})
        ctx.set(dut.response.valid, 1)
        ctx.set(dut.data.valid, 1)
        out = bytearray()
        for n in range(200):
            i = min(len(out) - 6, 47) if len(out) >= 6 else 0
            ctx.set(dut.data.payload, {"data": i, "last": i == 47})
            _, _, valid, byte, taken = await ctx.tick().sample(
                dut.tx.valid, dut.tx.payload, dut.response.ready
            )
            if valid:
                out.append(byte)
            if taken:
                cycles.append(n + 1)
                break
        assert bytes(out) == encode_frame(frames[0])

    sim = Simulator(top)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert cycles == [10 + 48]
