"""RTL link engine in Amaranth's simulator: against the Python device model, under random
backpressure, corruption and retransmission, with a behavioural network (ToyNetwork)."""

from __future__ import annotations

import random
from collections import deque

import numpy as np
import pytest
from amaranth.sim import Simulator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pipetrain.hdl.link import LinkEngine
from pipetrain.host.client import LinkClient
from pipetrain.host.transport import FaultyTransport, LoopbackTransport
from pipetrain.protocol.device_model import LinkDeviceModel, ToyNetwork
from pipetrain.protocol.wire import (
    SYNC,
    Cmd,
    Frame,
    FrameDecoder,
    LinkParams,
    Result,
    encode_frame,
    encode_record,
    weight_header,
)
from test_protocol import tiny_plan

PLAN = tiny_plan(lwp_w=False)
RX_TIMEOUT = 40  # cycles; the harness never pauses a frame that long unless it was cut


class ToyPorts:
    """NetworkTop's ports (``net``, the flipped network signature of an engine or dispatcher)
    played by a :class:`ToyNetwork` under random backpressure, one cycle at a time: call
    :meth:`drive` before the cycle settles, :meth:`sample` after, :meth:`commit` after the edge.
    ``rng`` is shared with the caller (the order of its draws is part of the test)."""

    def __init__(self, net, toy: ToyNetwork, rng: random.Random, p_net: float) -> None:
        self.net, self.toy, self.rng, self.p_net = net, toy, rng, p_net
        self.beats: list[int] = []
        self.tick_busy = 0
        self.rq: deque[Result] = deque()
        self.ro_hold = False
        self.wrsp: deque[int] = deque()
        self.wr_hold = False

    def drive(self, ctx) -> None:
        net, toy, rng = self.net, self.toy, self.rng
        self.si_ready = self.tick_busy == 0 and rng.random() < self.p_net
        ctx.set(net.sample_in.ready, self.si_ready)
        if self.rq and (self.ro_hold or rng.random() < self.p_net):
            self.ro_hold = True
            r = self.rq[0]
            ctx.set(net.result_out.valid, 1)
            ctx.set(net.result_out.payload.sample, r.sample)
            ctx.set(net.result_out.payload.pred, r.pred)
            ctx.set(net.result_out.payload.loss, r.loss)
            ctx.set(net.result_out.payload.train, r.train)
        else:
            ctx.set(net.result_out.valid, 0)
        idle = not toy.in_flight and self.tick_busy == 0 and not self.rq
        self.wc_ready = idle and not self.wrsp and rng.random() < self.p_net
        ctx.set(net.wacc_cmd.ready, self.wc_ready)
        if self.wrsp and (self.wr_hold or rng.random() < self.p_net):
            self.wr_hold = True
            ctx.set(net.wacc_rsp.valid, 1)
            ctx.set(net.wacc_rsp.payload.data, self.wrsp[0])
        else:
            ctx.set(net.wacc_rsp.valid, 0)
        ctx.set(net.idle, idle)
        trained, ticks, sats = toy.counters()
        ctx.set(net.samples_trained, trained & 0xFFFFFFFF)
        ctx.set(net.ticks, ticks & 0xFFFFFFFF)
        for i, v in enumerate(sats):
            ctx.set(net.saturations[i], v & 0xFFFFFFFF)

    def sample(self, ctx) -> None:
        net = self.net
        self.si_valid = ctx.get(net.sample_in.valid)
        if self.si_valid and self.si_ready:
            self.sx = ctx.get(net.sample_in.payload.x)
            self.slast = ctx.get(net.sample_in.payload.last)
            self.slabel = ctx.get(net.sample_in.payload.label)
            self.strain = ctx.get(net.sample_in.payload.train)
        self.ro_ready = ctx.get(net.result_out.ready)
        self.ro_valid = ctx.get(net.result_out.valid)
        self.wc_valid = ctx.get(net.wacc_cmd.valid)
        if self.wc_valid and self.wc_ready:
            self.wcmd = ctx.get(net.wacc_cmd.payload)
        self.wr_valid = ctx.get(net.wacc_rsp.valid)
        self.wr_ready = ctx.get(net.wacc_rsp.ready)
        self.flush = ctx.get(net.flush)

    def commit(self) -> None:
        toy, rng = self.toy, self.rng
        if self.tick_busy:
            self.tick_busy -= 1
        if self.si_valid and self.si_ready:
            self.beats.append(self.sx)
            if self.slast:
                assert len(self.beats) == toy.params.in_features
                toy.push(self.beats, self.slabel, bool(self.strain))
                self.beats = []
                self.tick_busy = rng.randint(0, 4)
                self.rq.extend(toy.pop_results())
        elif self.flush and toy.in_flight and self.tick_busy == 0:
            toy.bubble()
            self.tick_busy = rng.randint(0, 4)
            self.rq.extend(toy.pop_results())
        if self.ro_valid and self.ro_ready:
            self.rq.popleft()
            self.ro_hold = False
        if self.wc_valid and self.wc_ready:
            w = self.wcmd
            self.wrsp.append(toy.wacc(bool(w.write), w.stage, w.kind, w.row, w.col, w.data))
        if self.wr_valid and self.wr_ready:
            self.wrsp.popleft()
            self.wr_hold = False


class EngineSim:
    """A :class:`~pipetrain.host.transport.ByteDevice` running the RTL engine in Amaranth's
    simulator, with a testbench process that plays the host byte streams and (``toy`` given)
    NetworkTop's ports (:class:`ToyPorts`), all under random valid/ready gaps.

    ``step(data)`` queues host bytes and runs until every byte was taken and the engine has gone
    quiet (``busy`` low) for 2 cycles; a partial frame is dropped by the engine's own timeout.
    """

    def __init__(self, engine, toy=None, *, top=None, seed=0, p_rx=0.7, p_tx=0.6, p_net=0.6):
        self.engine = engine
        self.toy = toy
        self.rng = random.Random(seed)
        self.p_rx, self.p_tx, self.p_net = p_rx, p_tx, p_net
        self.inq: deque[int] = deque()
        self.out = bytearray()
        self.cycles = 0
        self.quiet = 0
        self.max_step_cycles = 0
        self.sim = Simulator(top if top is not None else engine)
        self.sim.add_clock(1e-6)
        self.sim.add_testbench(self._bench, background=True)
        self._t = 0.0

    async def _bench(self, ctx):
        e, rng = self.engine, self.rng
        cur = None
        ports = None if self.toy is None else ToyPorts(e.net, self.toy, rng, self.p_net)
        while True:
            # ---- drive inputs ----
            if cur is None and self.inq and rng.random() < self.p_rx:
                cur = self.inq.popleft()
            ctx.set(e.rx.valid, cur is not None)
            ctx.set(e.rx.payload, 0 if cur is None else cur)
            tx_ready = rng.random() < self.p_tx
            ctx.set(e.tx.ready, tx_ready)
            if ports is not None:
                ports.drive(ctx)
            # ---- sample outputs (settled) ----
            rx_ready = ctx.get(e.rx.ready)
            tx_valid = ctx.get(e.tx.valid)
            tx_byte = ctx.get(e.tx.payload)
            busy = ctx.get(e.busy)
            if ports is not None:
                ports.sample(ctx)
            await ctx.tick()
            self.cycles += 1
            # ---- transfers of this cycle ----
            if cur is not None and rx_ready:
                cur = None
            if tx_valid and tx_ready:
                self.out.append(tx_byte)
            self.quiet = self.quiet + 1 if (cur is None and not self.inq and not busy) else 0
            if ports is not None:
                ports.commit()

    def step(self, data: bytes, max_cycles: int = 200_000) -> bytes:
        """Queue ``data``; run until the engine is quiet; return its output bytes."""
        self.inq.extend(data)
        start = self.cycles
        self.quiet = 0
        while self.quiet < 2:
            self._t += 32e-6
            self.sim.run_until(self._t)
            if self.cycles - start > max_cycles:
                raise AssertionError(f"engine did not go quiet within {max_cycles} cycles")
        self.max_step_cycles = max(self.max_step_cycles, self.cycles - start)
        out = bytes(self.out)
        self.out.clear()
        return out


def make_pair(seed=0, **kw):
    """(RTL sim, Python model) with their own ToyNetworks, same link sizes."""
    engine = LinkEngine(PLAN, rx_timeout=RX_TIMEOUT, **kw)
    params = engine.params
    rtl = EngineSim(engine, ToyNetwork(params), seed=seed)
    model = LinkDeviceModel(params, ToyNetwork(params))
    return rtl, model


def test_engine_signature_and_hash():
    e = LinkEngine(PLAN)
    assert e.plan_hash == int(PLAN.hash, 16)
    members = dict(e.signature.members["net"].signature.members.items())
    assert set(members) == {
        "sample_in",
        "result_out",
        "wacc_cmd",
        "wacc_rsp",
        "flush",
        "idle",
        "samples_trained",
        "ticks",
        "saturations",
    }
    with pytest.raises(ValueError):
        LinkEngine(PLAN, rx_timeout=-1)


def _script(params: LinkParams, rng: random.Random, n_cmds: int) -> list[bytes]:
    """A command script covering every command (wire bytes, one frame per entry); seq numbers
    advance, with some retransmissions (same seq, same bytes)."""
    out = []
    seq = 0
    N = params.in_features

    def frame(cmd, payload=b""):
        nonlocal seq
        seq = (seq + 1) & 0xFF
        return encode_frame(Frame(cmd, seq, payload))

    out.append(frame(Cmd.HELLO))
    out.append(frame(Cmd.RESET_COUNTERS))
    for _ in range(n_cmds):
        kind = rng.choice(
            ["samples"] * 4 + ["flushread", "counters", "wread", "wwrite", "bad", "session"]
        )
        if kind == "samples":
            k = rng.randint(1, params.max_batch)
            recs = b"".join(
                encode_record(
                    params,
                    [
                        rng.randint(-(2 ** (params.x_bits - 1)), 2 ** (params.x_bits - 1) - 1)
                        for _ in range(N)
                    ],
                    rng.randrange(params.classes),
                    rng.random() < 0.8,
                )
                for _ in range(k)
            )
            out.append(frame(Cmd.SAMPLES, recs))
        elif kind == "flushread":
            out.append(frame(Cmd.FLUSH))
            out.append(frame(Cmd.READ_RESULTS, bytes((rng.randint(1, 40),))))
        elif kind == "counters":
            out.append(frame(Cmd.READ_COUNTERS))
        elif kind == "wread":
            s = rng.randrange(params.num_stages)
            row = rng.randrange(params.stage_rows[s])
            col = rng.randrange(params.stage_cols[s])
            n = rng.randint(1, params.stage_cols[s] - col)
            out.append(frame(Cmd.READ_WEIGHTS, weight_header(s, rng.randrange(2), row, col, n)))
        elif kind == "wwrite":
            s = rng.randrange(params.num_stages)
            col = rng.randrange(params.stage_cols[s])
            n = rng.randint(1, params.stage_cols[s] - col)
            vals = b"".join(rng.getrandbits(32).to_bytes(4, "little") for _ in range(n))
            hdr = weight_header(s, rng.randrange(2), rng.randrange(params.stage_rows[s]), col, n)
            out.append(frame(Cmd.WRITE_WEIGHTS, hdr + vals))
        elif kind == "session":  # set a tag, read it back in HELLO
            out.append(frame(Cmd.SESSION, rng.getrandbits(32).to_bytes(4, "little")))
            out.append(frame(Cmd.HELLO))
        else:  # NAK: a weight access out of range
            out.append(frame(Cmd.READ_WEIGHTS, weight_header(params.num_stages, 0, 0, 0, 1)))
        if rng.random() < 0.2:
            out.append(out[-1])  # retransmission
    out.append(frame(Cmd.FLUSH))
    out.append(frame(Cmd.READ_RESULTS, b"\xff"))
    out.append(frame(Cmd.READ_COUNTERS))
    return out


def _damage(rng: random.Random, wire: bytes) -> bytes:
    b = bytearray(wire)
    what = rng.choice(["corrupt", "truncate", "garbage", "drop"])
    if what == "corrupt":
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] ^= rng.randint(1, 255)
    elif what == "truncate":
        del b[rng.randrange(1, len(b)) :]
    elif what == "garbage":
        junk = bytearray(rng.randrange(256) for _ in range(rng.randint(1, 12)))
        pos = rng.randrange(len(junk))
        junk[pos:pos] = SYNC
        b = junk + b
    else:
        b = bytearray()
    return bytes(b)


def test_engine_equals_model_clean_stream():
    """Every command, continuous byte stream, random backpressure: RTL bytes == model bytes."""
    rtl, model = make_pair(seed=3)
    rng = random.Random(7)
    script = _script(rtl.engine.params, rng, 25)
    stream = b"".join(script)
    got = rtl.step(stream)
    model.receive(stream)
    want = model.transmit()
    assert got == want
    frames = FrameDecoder().feed(got)
    assert len(frames) == len(script)
    assert rtl.toy.applied == model.net.applied and len(model.net.applied) > 20
    assert model.duplicates > 0 and model.bad_crc == 0
    # last response: READ_COUNTERS; trained counter equals the train samples applied
    words = [int.from_bytes(frames[-1].payload[i : i + 4], "little") for i in range(0, 48, 4)]
    assert words[0] == sum(1 for _, _, t in model.net.applied if t)


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(seed=st.integers(0, 2**32 - 1), p_damage=st.sampled_from([0.1, 0.3]))
def test_fuzz_rtl_decoder_equals_model(seed, p_damage):
    """Damaged frames (corrupted, truncated, preceded by junk with sync markers, dropped), sent
    one step at a time with random backpressure: the RTL accepts exactly what the model
    accepts, never a damaged frame, and answers byte for byte the same."""
    rng = random.Random(seed)
    rtl, model = make_pair(seed=seed)
    R = rtl.engine.params.record_bytes
    script = _script(rtl.engine.params, rng, 8)
    candidates: list[bytes] = []  # records of SAMPLES frames that arrived intact, once per seq
    seen: set[int] = set()
    for wire in script:
        if rng.random() < p_damage:
            wire = _damage(rng, wire)
        for f in FrameDecoder().feed(wire + bytes(R * 8 + 10)):
            if f.type == Cmd.SAMPLES and f.seq not in seen:
                seen.add(f.seq)
                candidates += [f.payload[i : i + R] for i in range(0, len(f.payload), R)]
        got = rtl.step(wire)
        want = model.step(wire)
        assert got == want
    assert rtl.toy.applied == model.net.applied
    # never a damaged sample, never one twice: the applied records are a subsequence of the
    # records that arrived intact (a frame behind junk may be lost: the RTL does not rewind)
    applied = [encode_record(rtl.engine.params, x, y, t) for x, y, t in model.net.applied]
    it = iter(candidates)
    assert all(any(a == c for c in it) for a in applied)
    # the engine resynchronised: a final intact HELLO is answered
    hello = encode_frame(Frame(Cmd.HELLO, 0xEE))
    assert rtl.step(hello) == model.step(hello) != b""


@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(5, 30))
def test_fuzz_rtl_client_exactly_once(seed, n):
    """LinkClient ↔ damaged link ↔ RTL engine: every sample applied exactly once, in order,
    results as the toy network computes them, trained counter == host's count."""
    rng = random.Random(seed)
    engine = LinkEngine(PLAN, rx_timeout=RX_TIMEOUT)
    toy = ToyNetwork(engine.params)
    sim = EngineSim(engine, toy, seed=seed)
    faulty = FaultyTransport(
        LoopbackTransport(sim),
        rng,
        p_drop=0.05,
        p_truncate=0.05,
        p_corrupt=0.1,
        p_duplicate=0.05,
        p_garbage=0.05,
    )
    cli = LinkClient(faulty, PLAN, max_retries=100)
    cli.reset_counters()
    xs = np.array([[rng.randint(-3000, 3000) for _ in range(PLAN.in_features)] for _ in range(n)])
    ys = [rng.randrange(2) for _ in range(n)]
    res = cli.train(xs, ys)
    assert toy.applied == [(tuple(map(int, x)), y, True) for x, y in zip(xs, ys, strict=True)]
    assert [r.sample for r in res] == list(range(n))
    assert [r.pred for r in res] == [(int(x.sum()) + y) % 2 for x, y in zip(xs, ys, strict=True)]
    c = cli.counters()
    assert c.samples_trained == n == cli.train_samples_sent
    w = cli.read_weights()
    assert w[1]["u"][1, 2] == ToyNetwork.initial_weight(1, 1, 1, 2)
