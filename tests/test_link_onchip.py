"""The on-chip training set (STORE, RUN; docs/protocol.md §2, the order docs/numerics.md §10):
the permutation, the device model, and the RTL engine in Amaranth's simulator against the
model byte for byte (but RUN's measured cycles) under random backpressure, with a ToyNetwork."""

from __future__ import annotations

import random

import pytest
from amaranth.hdl import Fragment
from pipetrain.hdl import link_onchip
from pipetrain.hdl.link import LinkEngine
from pipetrain.hdl.resources import _memories
from pipetrain.protocol.device_model import LinkDeviceModel, ToyNetwork
from pipetrain.protocol.onchip import PERM_TAPS, epoch_orders, perm_bits, perm_step, run_seeds
from pipetrain.protocol.wire import (
    Cmd,
    EpochSummary,
    Frame,
    FrameDecoder,
    LinkParams,
    NakReason,
    encode_frame,
    encode_record,
    response_type,
    run_payload,
)
from test_link import PLAN, RX_TIMEOUT, EngineSim

CAP = 13  # slots: k = 4 bits, 3 of the 16 candidates are skipped per epoch


@pytest.mark.parametrize("k", sorted(PERM_TAPS))
def test_taps_have_full_period(k):
    s, n = 1, 0
    while True:
        s, n = perm_step(s, k), n + 1
        if s == 1:
            break
    assert n == (1 << k) - 1


@pytest.mark.parametrize("n", [1, 2, 3, 13, 16, 17, 1437])
def test_epoch_orders_are_permutations(n):
    start, mask = run_seeds(n, 5, 0)
    orders = epoch_orders(n, start, mask, 3)
    assert all(sorted(o) == list(range(n)) for o in orders)
    if n >= 13:  # the mask moves every epoch: the orders differ
        assert orders[0] != orders[1] != orders[2]
    assert perm_bits(n) == max(2, (n - 1).bit_length())
    # epoch e of a run equals the first epoch of a RUN started at epoch e
    assert epoch_orders(n, *run_seeds(n, 5, 2), 1)[0] == orders[2]


def test_epoch_orders_refuse_bad_words():
    with pytest.raises(ValueError, match="non-zero 4-bit"):
        epoch_orders(13, 0, 1, 1)
    with pytest.raises(ValueError, match="non-zero 4-bit"):
        epoch_orders(13, 1, 16, 1)
    with pytest.raises(ValueError, match="1..65535"):
        perm_bits(0)


def _memory_names(engine) -> list[str]:
    out: list = []
    _memories(Fragment.get(engine, None), "", out)
    return [m.path for m in out]


def _records(params, rng, k):
    X = params.x_bits
    recs = [
        (
            [rng.randint(-(1 << (X - 1)), (1 << (X - 1)) - 1) for _ in range(params.in_features)],
            rng.randrange(params.classes),
        )
        for _ in range(k)
    ]
    return recs, b"".join(encode_record(params, x, y, True) for x, y in recs)


def _script(params, rng):
    """STOREs filling the set (one out of range: NAK), a RUN with results unread (NAK BUSY),
    RUNs with bad words (NAK BAD_ARG), two good RUNs, SAMPLES around them."""
    seq = 0
    out: list[bytes] = []

    def frame(cmd, payload=b""):
        nonlocal seq
        seq = (seq + 1) & 0xFF
        out.append(encode_frame(Frame(cmd, seq, payload)))

    stored = []
    frame(Cmd.HELLO)
    for i in range(0, CAP, params.max_batch):
        k = min(params.max_batch, CAP - i)
        recs, payload = _records(params, rng, k)
        stored += recs
        frame(Cmd.STORE, i.to_bytes(2, "little") + payload)
        if rng.random() < 0.5:
            out.append(out[-1])  # a retransmission: answered from the cache
    frame(Cmd.STORE, (CAP - 1).to_bytes(2, "little") + _records(params, rng, 2)[1])  # NAK
    frame(Cmd.SAMPLES, _records(params, rng, 2)[1])
    frame(Cmd.RUN, run_payload(CAP, 2, 1, 1))  # two results unread: BUSY
    frame(Cmd.FLUSH)
    frame(Cmd.READ_RESULTS, b"\x10")
    for bad in [(0, 1, 1, 1), (CAP + 1, 1, 1, 1), (CAP, 0, 1, 1), (CAP, 33, 1, 1), (CAP, 1, 0, 1),
                (CAP, 1, 16, 1), (CAP, 1, 1, 16)]:  # fmt: skip
        frame(Cmd.RUN, run_payload(*bad))
    frame(Cmd.RUN, run_payload(CAP, 3, *run_seeds(CAP, 1, 0)))
    frame(Cmd.RUN, run_payload(5, 2, *run_seeds(5, 1, 3)))  # a smaller count: k = 3
    frame(Cmd.RUN, run_payload(CAP, 2, 1, 1, records=True))  # records: one epoch only (NAK)
    frame(Cmd.RUN, run_payload(CAP, 1, *run_seeds(CAP, 1, 5), records=True))
    frame(Cmd.RUN, run_payload(CAP, 1, 1, 1))  # its records are unread: BUSY
    frame(Cmd.READ_RESULTS, b"\x08")
    frame(Cmd.READ_RESULTS, b"\x10")
    frame(Cmd.SAMPLES, _records(params, rng, 1)[1])
    frame(Cmd.FLUSH)
    frame(Cmd.READ_RESULTS, b"\x10")
    frame(Cmd.HELLO)
    frame(Cmd.READ_COUNTERS)
    return out, stored


def _frames_without_cycles(wire: bytes) -> list[Frame]:
    """Decoded frames, each RUN response's last word (the cycles the RTL counted) zeroed."""
    out = []
    for fr in FrameDecoder().feed(wire):
        if fr.type == response_type(Cmd.RUN):
            fr = Frame(fr.type, fr.seq, fr.payload[:-4] + bytes(4))
        out.append(fr)
    return out


@pytest.mark.parametrize("bank", [None, 8])
def test_engine_equals_model_store_and_run(bank, monkeypatch):
    """``bank``: words per ``data`` bank (None: the ECP5 block's, one bank here; 8: ten banks
    of the 78 words, three 4-way groups — both levels of the feeder's read multiplexer)."""
    if bank is not None:
        monkeypatch.setattr(link_onchip, "bank_words", lambda x_bits: bank)
    engine = LinkEngine(PLAN, rx_timeout=RX_TIMEOUT, onchip_samples=CAP)
    params = engine.params
    assert params.onchip_samples == CAP
    banks = [n for n in _memory_names(engine) if "/onchip/data" in n]
    assert len(banks) == (1 if bank is None else -(-CAP * params.in_features // bank))
    rtl = EngineSim(engine, ToyNetwork(params), seed=11)
    model = LinkDeviceModel(params, ToyNetwork(params))
    script, stored = _script(params, random.Random(4))
    stream = b"".join(script)
    got = rtl.step(stream, max_cycles=400_000)
    model.receive(stream)
    want = model.transmit()
    g, w = _frames_without_cycles(got), _frames_without_cycles(want)
    assert len(w) == len(script) and g == w
    assert rtl.toy.applied == model.net.applied
    # the model's set holds what was stored; the runs fed the network in the permutation
    assert model.onchip == [(x, y) for x, y in stored]
    order = [i for o in epoch_orders(CAP, *run_seeds(CAP, 1, 0), 3) for i in o]
    order += [i for o in epoch_orders(5, *run_seeds(5, 1, 3), 2) for i in o]
    order += epoch_orders(CAP, *run_seeds(CAP, 1, 5), 1)[0]
    run_applied = model.net.applied[2 : 2 + len(order)]
    assert run_applied == [(tuple(stored[i][0]), stored[i][1], True) for i in order]
    naks = [fr.payload for fr in w if fr.type == 0xFF]
    assert naks[:2] == [bytes((Cmd.STORE, NakReason.BAD_ARG)), bytes((Cmd.RUN, NakReason.BUSY))]
    assert naks[2:9] == [bytes((Cmd.RUN, NakReason.BAD_ARG))] * 7
    assert naks[9:] == [bytes((Cmd.RUN, NakReason.BAD_ARG)), bytes((Cmd.RUN, NakReason.BUSY))]
    # the records run's results came back through READ_RESULTS: 8, then the other 5
    reads = [fr.payload for fr in w if fr.type == response_type(Cmd.READ_RESULTS)]
    assert [p[0] for p in reads[-3:-1]] == [8, CAP - 8]
    # the RTL's cycles: at least N per sample fed (one feature per cycle)
    runs = [fr for fr in FrameDecoder().feed(got) if fr.type == response_type(Cmd.RUN)]
    assert [len(fr.payload) for fr in runs] == [4 + 12 * 3, 4 + 12 * 2, 4 + 12]
    for fr, samples in zip(runs, (3 * CAP, 2 * 5, CAP), strict=True):
        assert int.from_bytes(fr.payload[-4:], "little") >= samples * params.in_features
    # the summaries equal the toy's results, recomputed here
    summaries = [EpochSummary.from_bytes(runs[0].payload[12 * e :][:12]) for e in range(3)]
    assert sum(s.correct for s in summaries) <= 3 * CAP and summaries[0].loss_sum > 0


def test_without_onchip_store_and_run_are_bad_headers():
    params = LinkParams.from_plan(PLAN)
    assert not params.command_length_ok(Cmd.STORE, 2 + params.record_bytes)
    assert not params.command_length_ok(Cmd.RUN, 7)
