"""LinkDispatcher (commands, counters, response cache) with its command parts in Amaranth's
simulator: fed received frames as the receiver reports them, it answers exactly what the device
model answers to the same frames on the wire, under random backpressure on ``frame``, ``args``,
``response``, ``data`` and NetworkTop's ports (a ToyNetwork)."""

from __future__ import annotations

import random
from collections import deque

import pytest
from amaranth.sim import Simulator
from pipetrain.hdl.link_dispatch import LinkDispatcher
from pipetrain.hdl.link_ports import FrameStatus
from pipetrain.protocol.device_model import LinkDeviceModel, ToyNetwork
from pipetrain.protocol.wire import (
    NAK,
    SYNC,
    Cmd,
    Frame,
    FrameDecoder,
    LinkParams,
    NakReason,
    encode_frame,
    encode_record,
)
from test_link import PLAN, ToyPorts, _script

PARAMS = LinkParams.from_plan(PLAN)


class DispatchSim:
    """The dispatcher behind a testbench that plays the receiver (``frame`` beats held until
    taken, ``args`` bytes with random gaps) and the transmitter (``response``/``data`` with
    random ``ready``), and NetworkTop's ports with :class:`ToyPorts`, one cycle at a time.

    Checks on the way: ``args`` is never read past the payload, a frame is taken only after
    its response (none for a dropped frame), a response has ``length`` data beats, ``last`` on
    the final one, and no data beat is offered beyond them.
    """

    def __init__(self, seed: int, p_frame=0.5, p_args=0.6, p_rsp=0.5, p_data=0.6, p_net=0.6):
        self.dut = LinkDispatcher(PLAN, PARAMS)
        self.toy = ToyNetwork(PARAMS)
        self.rng = random.Random(seed)
        self.p = (p_frame, p_args, p_rsp, p_data)
        self.p_net = p_net
        self.frames: deque[tuple] = deque()
        self.responses: list[Frame] = []
        self.cycles = 0

    def run(self, items: list[tuple], max_cycles: int = 200_000) -> list[Frame]:
        """Run ``items`` (``(status, type, seq, payload)``) through; return the responses."""
        self.frames.extend(items)
        sim = Simulator(self.dut)
        sim.add_clock(1e-6)

        async def bench(ctx):
            await self._bench(ctx, max_cycles)

        sim.add_testbench(bench)
        sim.run()
        return self.responses

    async def _bench(self, ctx, max_cycles: int) -> None:
        d, rng = self.dut, self.rng
        p_frame, p_args, p_rsp, p_data = self.p
        ports = ToyPorts(d.net, self.toy, rng, self.p_net)
        cur = None  # the frame offered: (status, type, seq, payload)
        pos = 0  # payload bytes read by the dispatcher
        args_on = False
        data = bytearray()
        lasts: list[int] = []
        while self.frames or cur is not None or ctx.get(d.busy):
            if cur is None and self.frames and rng.random() < p_frame:
                cur, pos, n_rsp = self.frames.popleft(), 0, len(self.responses)
            status, typ, seq, payload = cur if cur is not None else (0, 0, 0, b"")
            ctx.set(d.frame.valid, cur is not None)
            records = len(payload) // PARAMS.record_bytes if typ == Cmd.SAMPLES else 0
            ctx.set(
                d.frame.payload,
                {
                    "status": status,
                    "type": typ,
                    "seq": seq,
                    "length": len(payload),
                    "records": records,
                },
            )
            ok = cur is not None and status == FrameStatus.OK
            args_on = ok and pos < len(payload) and (args_on or rng.random() < p_args)
            ctx.set(d.args.valid, args_on)
            if args_on:
                ctx.set(d.args.payload, {"data": payload[pos], "last": pos == len(payload) - 1})
            ports.drive(ctx)
            ports.sample(ctx)
            # a transmitter takes the response after its payload (with the last CRC byte)
            length = ctx.get(d.response.payload).length
            ctx.set(d.data.ready, rng.random() < p_data)
            ctx.set(
                d.response.ready,
                ctx.get(d.response.valid) and len(data) == length and rng.random() < p_rsp,
            )
            _, _, f_taken, a_taken, r_taken, r, dv, db = await ctx.tick().sample(
                d.frame.ready,
                d.args.ready,
                d.response.valid & d.response.ready,
                d.response.payload,
                d.data.valid & d.data.ready,
                d.data.payload,
            )
            self.cycles += 1
            assert self.cycles < max_cycles, "the dispatcher hung"
            ports.commit()
            if args_on and a_taken:
                pos += 1
                args_on = False
            if dv:
                data.append(db.data)
                lasts.append(db.last)
            if r_taken:
                assert len(data) == r.length
                assert lasts == [0] * (r.length - 1) + [1] * (r.length > 0)
                self.responses.append(Frame(r.type, r.seq, bytes(data)))
                data.clear()
                lasts.clear()
            if cur is not None and f_taken:
                sent = len(self.responses) - n_rsp
                assert sent == (1 if status == FrameStatus.OK else 0)
                cur = None


def _bad_wire(rng: random.Random, status: FrameStatus) -> bytes:
    """Wire bytes (and for TIMEOUT, a cut frame) that end in ``status`` at the device model."""
    body = encode_frame(Frame(Cmd.HELLO, rng.randrange(256)))
    if status == FrameStatus.BAD_CRC:
        return body[:-1] + bytes((body[-1] ^ 1,))
    if status == FrameStatus.BAD_HEADER:
        return SYNC + bytes((Cmd.READ_RESULTS, 1, 2, 0))  # READ_RESULTS has 1 byte
    return body[:5]


def _items_and_model(script: list[bytes], rng: random.Random, p_bad: float):
    """Turn wire frames into receiver items, with dropped frames mixed in; feed the device model
    the same on the wire; return (items, model responses, model)."""
    model = LinkDeviceModel(PARAMS, ToyNetwork(PARAMS))
    items, out = [], bytearray()
    for wire in script:
        while rng.random() < p_bad:
            status = rng.choice([FrameStatus.BAD_CRC, FrameStatus.BAD_HEADER, FrameStatus.TIMEOUT])
            items.append((status, rng.randrange(256), rng.randrange(256), b""))
            out += model.step(_bad_wire(rng, status))
        (f,) = FrameDecoder().feed(wire)
        items.append((FrameStatus.OK, f.type, f.seq, f.payload))
        out += model.step(wire)
    return items, FrameDecoder().feed(bytes(out)), model


@pytest.mark.parametrize("seed", [11, 12])
def test_dispatcher_answers_like_the_device_model(seed):
    rng = random.Random(seed)
    script = _script(PARAMS, rng, 20)
    items, want, model = _items_and_model(script, rng, 0.15)
    sim = DispatchSim(seed)
    got = sim.run(items)
    assert got == want
    assert sim.toy.applied == model.net.applied and len(model.net.applied) > 12
    assert model.duplicates > 0 and model.bad_crc + model.bad_header + model.rx_timeouts > 0
    # the last response is READ_COUNTERS: the dropped frames were counted like the model's
    assert got[-1].type == Cmd.READ_COUNTERS | 0x80


def test_full_result_buffer_naks_samples_until_read():
    """SAMPLES beyond result_depth in flight is NAKed FULL and applies nothing; after
    READ_RESULTS it is accepted; READ_RESULTS 0 is NAKed BAD_ARG."""
    rng = random.Random(3)
    D = PARAMS.result_depth
    k = PARAMS.max_batch

    def rec():
        return encode_record(PARAMS, [rng.randint(-99, 99) for _ in range(4)], 1, True)

    frames = []
    for i in range(D // k + 1):
        frames.append(Frame(Cmd.SAMPLES, i + 1, b"".join(rec() for _ in range(k))))
    n = len(frames)
    frames += [
        Frame(Cmd.FLUSH, n + 1),
        Frame(Cmd.READ_RESULTS, n + 2, b"\x00"),
        Frame(Cmd.READ_RESULTS, n + 3, b"\xff"),
        Frame(Cmd.SAMPLES, n + 4, frames[-1].payload),
    ]
    script = [encode_frame(f) for f in frames]
    items, want, model = _items_and_model(script, rng, 0.0)
    got = DispatchSim(4).run(items)
    assert got == want
    naks = [f for f in got if f.type == NAK]
    assert naks == [
        Frame(NAK, n, bytes((Cmd.SAMPLES, NakReason.FULL))),
        Frame(NAK, n + 2, bytes((Cmd.READ_RESULTS, NakReason.BAD_ARG))),
    ]
    assert got[-1].type == Cmd.SAMPLES | 0x80
    assert len(model.net.applied) == n * k
