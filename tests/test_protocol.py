"""Host link protocol: CRC, frame codec, resynchronisation, the device model and the client."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pipetrain.compiler.build import build_plan
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.ir import LayerIR, NetworkIR
from pipetrain.host.client import (
    LinkClient,
    LinkError,
    NakError,
    PlanMismatchError,
    quantise_inputs,
)
from pipetrain.host.transport import FaultyTransport, LoopbackTransport
from pipetrain.protocol.device_model import LinkDeviceModel, ToyNetwork
from pipetrain.protocol.wire import (
    NAK,
    SYNC,
    Cmd,
    Counters,
    Frame,
    FrameDecoder,
    LinkParams,
    NakReason,
    Result,
    crc32,
    encode_frame,
    encode_record,
    loss_value,
    response_type,
)

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def tiny_plan(lwp_w: bool = True, **cfg):
    """A 4 → 3 → 2 network; LWP ``w`` form so that kind 2 (w_prev) is served."""
    ir = NetworkIR("tiny", 4, (LayerIR("0", 4, 3, "relu"), LayerIR("2", 3, 2)))
    if lwp_w:
        cfg = {"mitigation": "lwp", "lwp_form": "w"} | cfg
    return build_plan(ir, TrainConfig(**cfg))


PLAN = tiny_plan()
PARAMS = LinkParams.from_plan(PLAN)


def make_device(latency=None):
    net = ToyNetwork(PARAMS, latency)
    return LinkDeviceModel(PARAMS, net), net


# ---------------------------------------------------------------------------------------------
# CRC and frames


def test_crc32_check_value_and_chaining():
    # CRC-32/ISO-HDLC catalogue check value (reveng.sourceforge.io/crc-catalogue).
    assert crc32(b"123456789") == 0xCBF43926
    assert crc32(b"56789", crc32(b"1234")) == 0xCBF43926


def test_encode_frame_exact_bytes():
    wire = encode_frame(Frame(Cmd.HELLO, 7, b""))
    body = bytes((0x01, 7, 0, 0))
    assert wire == SYNC + body + crc32(body).to_bytes(4, "little")
    assert len(encode_frame(Frame(0x82, 1, b"abc"))) == 6 + 3 + 4
    with pytest.raises(ValueError):
        encode_frame(Frame(256, 0))


def test_decoder_roundtrip_split_anywhere():
    frames = [Frame(0x80 | k, k * 3 % 256, bytes(range(k * 5))) for k in range(1, 9)]
    wire = b"".join(encode_frame(f) for f in frames)
    rng = random.Random(1)
    dec = FrameDecoder()
    got: list[Frame] = []
    i = 0
    while i < len(wire):
        n = rng.randint(1, 9)
        got += dec.feed(wire[i : i + n])
        i += n
    assert got == frames
    assert dec.bad_crc == dec.bad_header == 0


def test_decoder_finds_frame_inside_false_header():
    # a false sync marker whose "length" covers the real frame: rewind finds the real one
    real = encode_frame(Frame(0x85, 9, b"xyz"))
    junk = SYNC + bytes((0x85, 0x01, 40, 0))  # claims 40 payload bytes
    dec = FrameDecoder(max_payload=64)
    got = dec.feed(junk + real + bytes(64))
    assert got == [Frame(0x85, 9, b"xyz")]
    assert dec.bad_crc == 1


def test_decoder_rejects_oversized_length_at_once():
    dec = FrameDecoder(max_payload=16)
    real = encode_frame(Frame(0x81, 2, b"ok"))
    assert dec.feed(SYNC + b"\x81\x02\xff\xff" + real) == [Frame(0x81, 2, b"ok")]
    assert dec.bad_header == 1


frame_st = st.builds(
    Frame, st.integers(0, 255), st.integers(0, 255), st.binary(min_size=0, max_size=40)
)
damage_st = st.sampled_from(["keep", "keep", "corrupt", "truncate", "drop", "garbage"])


@FUZZ
@given(st.lists(st.tuples(frame_st, damage_st, st.randoms(use_true_random=False)), max_size=12))
def test_fuzz_python_decoder(items):
    """Never accept a damaged frame; always find every intact frame (resync after damage)."""
    wire = bytearray()
    intact: list[Frame] = []
    for fr, damage, rng in items:
        b = bytearray(encode_frame(fr))
        if damage == "keep":
            intact.append(fr)
        elif damage == "corrupt":
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] ^= rng.randint(1, 255)
        elif damage == "truncate":
            del b[rng.randrange(1, len(b)) :]
        elif damage == "drop":
            b = bytearray()
        else:
            junk = bytearray(rng.randrange(256) for _ in range(rng.randint(1, 30)))
            pos = rng.randrange(len(junk))
            junk[pos:pos] = SYNC
            b = junk + b
            intact.append(fr)
        wire += b
    dec = FrameDecoder(max_payload=40)
    got: list[Frame] = []
    rng = random.Random(len(wire))
    i = 0
    while i < len(wire):
        n = rng.randint(1, 50)
        got += dec.feed(bytes(wire[i : i + n]))
        i += n
    got += dec.feed(bytes(40 + 10))  # padding completes any false header that is still open
    assert got == intact


# ---------------------------------------------------------------------------------------------
# Link parameters and payloads


def test_link_params_from_plan():
    p = PARAMS
    assert p.plan_hash.hex() == PLAN.hash
    assert (p.in_features, p.x_bits, p.x_bytes) == (4, PLAN.stages[0].formats.x.bits, 2)
    assert p.record_bytes == 3 + 4 * 2
    assert p.stage_rows == (3, 2) and p.stage_cols == (5, 4)
    assert p.stage_kinds == (3, 3)  # LWP w form keeps w_prev
    assert LinkParams.from_plan(tiny_plan(lwp_w=False)).stage_kinds == (2, 2)
    # result buffer holds the in-flight samples of the pipeline plus one full frame
    assert p.result_depth >= p.num_stages + p.max_batch
    assert p.num_counters == 2 + 3 + 7
    # local learning: per auxiliary head one more saturation counter (its loss unit) and a
    # head_correct counter, sent after the saturations (docs/protocol.md §2)
    ir3 = NetworkIR("t3", 4, (LayerIR("0", 4, 3, "relu"), LayerIR("2", 3, 3), LayerIR("4", 3, 2)))
    local = LinkParams.from_plan(build_plan(ir3, TrainConfig(strategy="local", blocks=(1,))))
    assert (local.num_stages, local.heads) == (4, 1)
    assert local.network_counters == 2 + (4 + 2) + 1 and local.num_counters == 9 + 7
    words = [5, 6, *range(10, 16), 77, *range(100, 107)]
    c = Counters.from_words(words, local.heads)
    assert (c.samples_trained, c.ticks, c.head_correct) == (5, 6, (77,))
    assert c.saturations == tuple(range(10, 16)) and (c.accepted, c.duplicates) == (100, 106)
    assert Counters.from_words(words[:8] + words[9:]).head_correct == ()
    with pytest.raises(ValueError, match="result_depth"):
        LinkParams.from_plan(PLAN, max_batch=8, result_depth=9)
    assert p.command_length_ok(Cmd.SAMPLES, 3 * 11) and not p.command_length_ok(Cmd.SAMPLES, 12)
    assert p.command_length_ok(Cmd.WRITE_WEIGHTS, 7 + 4 * 32)
    assert not p.command_length_ok(Cmd.WRITE_WEIGHTS, 7 + 4 * 33)
    assert not p.command_length_ok(Cmd.HELLO, 1) and not p.command_length_ok(0x55, 0)


def test_record_encoding_and_quantisation():
    rec = encode_record(PARAMS, [1, -1, -32768, 32767], 513, True)
    assert rec == bytes((1, 2, 1, 1, 0, 0xFF, 0xFF, 0, 0x80, 0xFF, 0x7F))
    fmt = PLAN.stages[0].formats.x
    xs = np.array([[0.5, -0.25, 1e9, -1e9], [2.5 / 2**fmt.frac, 0, 0, 0]])
    q = quantise_inputs(xs, PLAN)
    assert q[0].tolist() == [2 ** (fmt.frac - 1), -(2 ** (fmt.frac - 2)), fmt.max_int, fmt.min_int]
    assert q[1, 0] == 2  # round half to even
    with pytest.raises(ValueError, match="outside"):
        quantise_inputs(np.array([[fmt.max_int + 1, 0, 0, 0]]), PLAN)
    with pytest.raises(ValueError, match="shape"):
        quantise_inputs(np.zeros((2, 3)), PLAN)


def test_loss_value():
    fr = PLAN.loss.recip_frac
    assert loss_value(Result(0, 0, 1 << fr, True), PLAN) == 0.0
    assert loss_value(Result(0, 0, 0, True), PLAN) == pytest.approx(fr * np.log(2))


# ---------------------------------------------------------------------------------------------
# Device model: commands, de-duplication, NAKs


def _cmd(dev, cmd, seq, payload=b""):
    dev.receive(encode_frame(Frame(cmd, seq, payload)))
    got = FrameDecoder().feed(dev.transmit())
    assert len(got) == 1
    return got[0]


def test_device_hello_and_duplicate_is_not_reapplied():
    dev, net = make_device()
    r = _cmd(dev, Cmd.HELLO, 0)
    assert r.type == response_type(Cmd.HELLO) and r.payload[4:12] == PARAMS.plan_hash
    assert r.payload[:4] == bytes(4)  # no session tag since reset
    assert _cmd(dev, Cmd.SESSION, 9, (0xC0FFEE01).to_bytes(4, "little")).payload == b""
    assert _cmd(dev, Cmd.HELLO, 9).payload[:4] == (0xC0FFEE01).to_bytes(4, "little")
    rec = encode_record(PARAMS, [1, 2, 3, 4], 1, True)
    first = _cmd(dev, Cmd.SAMPLES, 1, rec * 2)
    again = _cmd(dev, Cmd.SAMPLES, 1, rec * 2)  # retransmission: cached answer
    assert first == again and first.payload == (2).to_bytes(4, "little")
    assert len(net.applied) == 2 and dev.duplicates == 1
    third = _cmd(dev, Cmd.SAMPLES, 2, rec)
    assert third.payload == (3).to_bytes(4, "little") and len(net.applied) == 3


def test_device_naks_full_and_bad_args():
    dev, net = make_device()
    rec = encode_record(PARAMS, [0, 0, 0, 0], 0, True)
    seq = 0
    for _ in range(PARAMS.result_depth // PARAMS.max_batch):
        seq += 1
        assert _cmd(dev, Cmd.SAMPLES, seq, rec * PARAMS.max_batch).type == 0x82
    r = _cmd(dev, Cmd.SAMPLES, seq + 1, rec)
    assert (r.type, r.payload) == (NAK, bytes((Cmd.SAMPLES, NakReason.FULL)))
    assert len(net.applied) == PARAMS.result_depth  # the refused sample was not applied
    bad = [
        bytes((2, 0, 0, 0, 0, 0, 1)),  # stage 2 of 2
        bytes((0, 3, 0, 0, 0, 0, 1)),  # kind 3
        bytes((0, 0, 3, 0, 0, 0, 1)),  # row 3 of 3
        bytes((0, 0, 0, 0, 4, 0, 2)),  # cols 4..5 of 5
        bytes((0, 0, 0, 0, 0, 0, 0)),  # count 0
    ]
    for k, p in enumerate(bad):
        r = _cmd(dev, Cmd.READ_WEIGHTS, 100 + k, p)
        assert (r.type, r.payload) == (NAK, bytes((Cmd.READ_WEIGHTS, NakReason.BAD_ARG)))
    r = _cmd(dev, Cmd.WRITE_WEIGHTS, 120, bytes((0, 0, 0, 0, 0, 0, 2)) + bytes(4))
    assert r.type == NAK  # count 2 but one word given
    r = _cmd(dev, Cmd.READ_RESULTS, 121, b"\x00")
    assert r.payload == bytes((Cmd.READ_RESULTS, NakReason.BAD_ARG))


def test_device_header_check_and_timeout_resync():
    dev, net = make_device()
    good = encode_frame(Frame(Cmd.SAMPLES, 5, encode_record(PARAMS, [1, 1, 1, 1], 0, True)))
    dev.receive(SYNC + bytes((Cmd.SAMPLES, 4, 12, 0)))  # 12 is no multiple of R = 11
    assert dev.bad_header == 1 and not dev.busy
    dev.receive(good[:9])  # truncated frame, then the bytes stop
    dev.timeout()
    assert dev.rx_timeouts == 1 and not dev.busy
    dev.receive(good)
    assert len(net.applied) == 1 and dev.transmit()[-8:] != b""


# ---------------------------------------------------------------------------------------------
# Client over a loopback to the device model


def _samples(n, seed=0):
    rng = np.random.default_rng(seed)
    fmt = PLAN.stages[0].formats.x
    xs = rng.integers(fmt.min_int, fmt.max_int + 1, size=(n, 4))
    ys = rng.integers(0, 2, size=n)
    return xs, ys


def _expected(xs, ys, first, train):
    return [
        Result(
            first + i, (int(x.sum()) + int(y)) % 2, (7 * int(x.sum()) + int(y)) & 0xFFFFFFFF, train
        )
        for i, (x, y) in enumerate(zip(xs, ys, strict=True))
    ]


def test_client_train_infer_counters_weights():
    dev, net = make_device()
    cli = LinkClient(LoopbackTransport(dev), PLAN)
    info = cli.hello()
    assert info.plan_hash == PLAN.hash and info.max_batch == PARAMS.max_batch
    cli.reset_counters()
    xs, ys = _samples(50)
    res = cli.train(xs, ys)
    assert res == _expected(xs, ys, 0, True)
    xi, yi = _samples(7, seed=1)
    assert cli.infer(xi, yi) == _expected(xi, yi, 50, False)
    c = cli.counters()
    assert c.samples_trained == 50 == cli.train_samples_sent
    assert c.accepted == 57 and c.results_read == 57 and c.duplicates == 0
    # each push is a tick, each flush adds latency (= S = 2) bubble ticks: 2 flushes
    assert c.ticks == 57 + 2 * 2
    assert c.saturations == tuple(
        int((np.concatenate([xs, xi])[:, i % 4] < 0).sum()) for i in range(3)
    )
    w = cli.read_weights()
    assert [sorted(d) for d in w] == [["u", "w", "w_prev"]] * 2
    assert w[1]["u"][1, 2] == ToyNetwork.initial_weight(1, 1, 1, 2)
    w[0]["w"][2, 4] = -123456789
    w[1]["w_prev"][:] = 7
    cli.write_weights(w)
    back = cli.read_weights()
    for a, b in zip(w, back, strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    cli.reset_counters()
    assert cli.counters().samples_trained == 0
    assert cli.retransmits == 0


def test_client_refuses_other_plan():
    dev, _ = make_device()
    other = tiny_plan(lwp_w=False)
    with pytest.raises(PlanMismatchError, match="rebuild"):
        LinkClient(LoopbackTransport(dev), other).hello()
    # check_hash=False reads the identity anyway
    info = LinkClient(LoopbackTransport(dev), other, check_hash=False).hello()
    assert info.plan_hash == PLAN.hash


def test_client_gives_up_on_a_dead_link():
    class Dead:
        def step(self, data):
            return b""

    cli = LinkClient(LoopbackTransport(Dead()), PLAN, max_retries=3)
    with pytest.raises(LinkError, match="after 3 retransmissions"):
        cli.hello()
    assert cli.retransmits == 3


def test_client_nak_error():
    dev, _ = make_device()
    cli = LinkClient(LoopbackTransport(dev), PLAN)
    cli.hello()
    with pytest.raises(NakError, match="BAD_ARG"):
        cli._transact(Cmd.READ_WEIGHTS, bytes((9, 0, 0, 0, 0, 0, 1)))


@FUZZ
@given(
    rng=st.integers(0, 2**32 - 1).map(random.Random),
    n=st.integers(1, 40),
    p=st.tuples(*[st.sampled_from([0.0, 0.05, 0.2])] * 5),
)
def test_fuzz_client_exactly_once(rng, n, p):
    """Under drops, truncation, corruption, duplication and garbage in both directions every
    sample is applied exactly once, in order, and the device's trained counter equals the
    host's count."""
    dev, net = make_device()
    faulty = FaultyTransport(
        LoopbackTransport(dev),
        rng,
        p_drop=p[0],
        p_truncate=p[1],
        p_corrupt=p[2],
        p_duplicate=p[3],
        p_garbage=p[4],
    )
    cli = LinkClient(faulty, PLAN, max_retries=200)
    cli.reset_counters()
    xs, ys = _samples(n, seed=rng.randrange(1000))
    res = cli.train(xs, ys)
    assert res == _expected(xs, ys, 0, True)
    assert net.applied == [(tuple(map(int, x)), int(y), True) for x, y in zip(xs, ys, strict=True)]
    assert cli.counters().samples_trained == n == cli.train_samples_sent
    if any(faulty.faults.values()):
        # every fault costs at most one retransmission... or none (a duplicate, harmless junk)
        assert cli.retransmits <= sum(faulty.faults.values())


def test_client_timeout_includes_serial_line_time():
    """On a slow line the retry timeout grows by the frame's and its longest answer's bytes."""
    dev, _ = make_device()

    class Slow(LoopbackTransport):
        byte_time = 10 / 9600  # 9600 baud, 8N1
        seen: list[float] = []

        def read(self, timeout):
            self.seen.append(timeout)
            return super().read(timeout)

    tr = Slow(dev)
    cli = LinkClient(tr, PLAN, timeout=0.1)
    cli.hello()
    # HELLO: 10-byte frame + 10 + 32-byte answer = 52 bytes ≈ 54.2 ms at 9600 baud
    assert 0.1 + 0.045 < tr.seen[0] <= 0.1 + 52 * 10 / 9600
