"""LinkReceiver (the receive framer) with the shared CRC in Amaranth's simulator: the frames it
reports equal the device model's parser, frame by frame, under random backpressure on ``rx``,
``frame`` and ``args``; frames built with ``protocol.wire``."""

from __future__ import annotations

import random

import pytest
from amaranth import Elaboratable, Module
from amaranth.lib import wiring
from amaranth.sim import Simulator
from pipetrain.hdl.link_crc import LinkCRC
from pipetrain.hdl.link_ports import FrameStatus
from pipetrain.hdl.link_rx import LinkReceiver
from pipetrain.protocol.device_model import LinkDeviceModel
from pipetrain.protocol.wire import (
    SYNC,
    Cmd,
    Frame,
    LinkParams,
    crc32,
    encode_frame,
    encode_record,
    weight_header,
)
from stream_sim import StreamRules, stream_get, stream_put, wait_until
from test_link import _damage, _script
from test_protocol import tiny_plan

PARAMS = LinkParams.from_plan(tiny_plan(lwp_w=False))
RX_TIMEOUT = 30


class FrameLog(LinkDeviceModel):
    """The device model's parser, recording each frame's end instead of executing it:
    ``(status, type, seq, payload)`` (type, seq and payload only for OK frames)."""

    def __init__(self, params: LinkParams) -> None:
        super().__init__(params)
        self.events: list[tuple] = []

    def _byte(self, b: int) -> None:
        bad = (self.bad_crc, self.bad_header)
        super()._byte(b)
        if self.bad_crc != bad[0]:
            self.events.append((FrameStatus.BAD_CRC,))
        if self.bad_header != bad[1]:
            self.events.append((FrameStatus.BAD_HEADER,))

    def _dispatch(self, cmd: int, seq: int, p: bytes) -> None:
        self.events.append((FrameStatus.OK, cmd, seq, p))

    def timeout(self) -> None:
        n = self.rx_timeouts
        super().timeout()
        if self.rx_timeouts != n:
            self.events.append((FrameStatus.TIMEOUT,))


class RxTop(Elaboratable):
    def __init__(self) -> None:
        self.rx = LinkReceiver(PARAMS, RX_TIMEOUT)
        self.crc = LinkCRC()

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.rx, m.submodules.crc = self.rx, self.crc
        wiring.connect(m, self.rx.crc, self.crc.rx)
        return m


def run_receiver(chunks: list[bytes], seed: int, p_rx=0.7, p_frame=0.4, p_args=0.6):
    """Feed ``chunks`` (each followed by a pause longer than the timeout); return the frames the
    receiver reported, as :class:`FrameLog` events, and the stream-rule violations."""
    top = RxTop()
    dut = top.rx
    rng = random.Random(seed)
    events: list[tuple] = []
    rules = [StreamRules(dut.frame, "frame"), StreamRules(dut.args, "args")]

    async def source(ctx):
        for chunk in chunks:
            for b in chunk:
                await stream_put(ctx, dut.rx, b, rng, p_rx)
            await ctx.tick().repeat(RX_TIMEOUT + 2)
        while ctx.get(dut.busy):  # the last frame taken
            await ctx.tick()
        await ctx.tick().repeat(3)

    async def sink(ctx):
        while True:
            await wait_until(ctx, dut.frame.valid)
            f = ctx.get(dut.frame.payload)
            if f.status != FrameStatus.OK:
                assert not ctx.get(dut.args.valid)
                events.append((f.status,))
            else:
                beats = [await stream_get(ctx, dut.args, rng, p_args) for _ in range(f.length)]
                assert [b.last for b in beats] == [0] * (f.length - 1) + [1] * (f.length > 0)
                assert not ctx.get(dut.args.valid)  # exactly `length` beats
                payload = bytes(b.data for b in beats)
                assert f.records == (len(payload) // PARAMS.record_bytes) * (f.type == Cmd.SAMPLES)
                events.append((FrameStatus.OK, f.type, f.seq, payload))
            assert ctx.get(dut.busy) and not ctx.get(dut.rx.ready)  # stalled while held
            await stream_get(ctx, dut.frame, rng, p_frame)

    sim = Simulator(top)
    sim.add_clock(1e-6)
    sim.add_testbench(source)
    sim.add_testbench(sink, background=True)
    for r in rules:
        sim.add_process(r.run)
    sim.run()
    return events, [v for r in rules for v in r.violations]


def model_events(chunks: list[bytes]) -> list[tuple]:
    log = FrameLog(PARAMS)
    for chunk in chunks:
        log.receive(chunk)
        log.timeout()
    return log.events


def frame(cmd: int, seq: int, payload: bytes = b"") -> bytes:
    return encode_frame(Frame(cmd, seq, payload))


def test_every_ending_of_a_frame():
    """Good frames of each payload kind, A5 A5 5A, junk, a bad CRC, bad headers, a truncated
    frame and a lone A5 (both end by the timeout): the statuses and payloads expected."""
    rec = encode_record(PARAMS, [1, -2, 3, -4], 1, True)
    write = weight_header(1, 0, 1, 0, 2) + bytes(range(8))
    bad_crc = bytearray(frame(Cmd.READ_WEIGHTS, 9, weight_header(0, 1, 2, 0, 3)))
    bad_crc[-1] ^= 0x10
    chunks = [
        frame(Cmd.HELLO, 1),
        frame(Cmd.SAMPLES, 2, rec + rec),
        b"\x00\x13" + SYNC[:1] + frame(Cmd.READ_RESULTS, 3, b"\x05"),  # A5 A5 5A syncs
        frame(Cmd.WRITE_WEIGHTS, 4, write),
        bytes(bad_crc),
        frame(Cmd.SAMPLES, 5, rec[:-1]),  # no command has this length
        SYNC + bytes((0x42, 6, 0, 0)),  # no command has this type
        frame(Cmd.READ_COUNTERS, 7)[:-2],  # cut inside the CRC: times out
        SYNC[:1],  # times out waiting for 5A
        SYNC[:1] + b"\x00" + frame(Cmd.FLUSH, 8),
    ]
    want = [
        (FrameStatus.OK, Cmd.HELLO, 1, b""),
        (FrameStatus.OK, Cmd.SAMPLES, 2, rec + rec),
        (FrameStatus.OK, Cmd.READ_RESULTS, 3, b"\x05"),
        (FrameStatus.OK, Cmd.WRITE_WEIGHTS, 4, write),
        (FrameStatus.BAD_CRC,),
        (FrameStatus.BAD_HEADER,),
        (FrameStatus.BAD_HEADER,),
        (FrameStatus.TIMEOUT,),
        (FrameStatus.TIMEOUT,),
        (FrameStatus.OK, Cmd.FLUSH, 8, b""),
    ]
    assert model_events(chunks) == want
    got, violations = run_receiver(chunks, seed=1)
    assert got == want
    assert violations == []
    # the CRC the receiver accepted is zlib's (the wire's last 4 bytes)
    assert int.from_bytes(chunks[0][-4:], "little") == crc32(chunks[0][2:-4])


@pytest.mark.parametrize("seed", [3, 5, 8])
def test_damaged_streams_equal_the_model_parser(seed):
    """Command scripts with corrupted, truncated, junk-prefixed and dropped frames, random
    backpressure everywhere: frame for frame what the device model's parser sees."""
    rng = random.Random(seed)
    chunks = []
    for wire in _script(PARAMS, rng, 6):
        chunks.append(_damage(rng, wire) if rng.random() < 0.4 else wire)
    want = model_events(chunks)
    assert {e[0] for e in want} == set(FrameStatus)  # these seeds end frames every way
    got, violations = run_receiver(chunks, seed, p_rx=0.8, p_frame=0.5, p_args=0.5)
    assert got == want
    assert violations == []


def test_negative_timeout_is_refused():
    with pytest.raises(ValueError, match="rx_timeout"):
        LinkReceiver(PARAMS, -1)
