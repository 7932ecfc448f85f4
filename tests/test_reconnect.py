"""A host whose link drops mid-run reconnects and continues exactly once; a device that was
reset between two connections is detected (docs/protocol.md §3). The protocol's device model
with the toy network; fast."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pipetrain.host.client import DeviceResetError, LinkClient, LinkError
from pipetrain.host.transport import LoopbackTransport
from pipetrain.protocol.device_model import LinkDeviceModel, ToyNetwork
from test_protocol import FUZZ, PARAMS, PLAN, _expected, _samples


class Dropping(LoopbackTransport):
    """A connection that breaks at random: a write delivers a random prefix of its bytes (all,
    none or part of a frame) and raises; a read lets the device run and answer, then raises
    (the answer is lost with the connection)."""

    def __init__(self, device, rng: random.Random, p: float) -> None:
        super().__init__(device)
        self.rng, self.p = rng, p

    def write(self, data: bytes) -> None:
        if self.rng.random() < self.p:
            super().write(data[: self.rng.randrange(len(data) + 1)])
            super().read(0)  # the device takes what arrived (a partial frame times out)
            raise ConnectionResetError("connection reset by peer")
        super().write(data)

    def read(self, timeout: float) -> bytes:
        out = super().read(timeout)
        if self.rng.random() < self.p:
            raise ConnectionResetError("connection reset by peer")
        return out


@FUZZ
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 40), p=st.sampled_from([0.05, 0.2]))
def test_reconnect_applies_every_sample_exactly_once(seed, n, p):
    rng = random.Random(seed)
    net = ToyNetwork(PARAMS)
    dev = LinkDeviceModel(PARAMS, net)
    opened = []

    def reopen():
        opened.append(1)
        return Dropping(dev, rng, p)

    cli = LinkClient(Dropping(dev, rng, p), PLAN, reconnect=reopen, max_reconnects=50)
    cli.hello()
    cli.reset_counters()
    xs, ys = _samples(n, seed=seed % 1000)
    res = cli.train(xs, ys)
    assert res == _expected(xs, ys, 0, True)  # every result, in order, none lost
    assert net.applied == [(tuple(map(int, x)), int(y), True) for x, y in zip(xs, ys, strict=True)]
    assert cli.counters().samples_trained == n == cli.train_samples_sent
    assert cli.reconnects == len(opened)


def test_a_device_reset_between_connections_is_detected():
    """The device is reset (a fresh engine and network) while the host is disconnected: the
    client refuses to continue and says what happened."""
    net = ToyNetwork(PARAMS)
    state = {"dev": LinkDeviceModel(PARAMS, net)}
    rng = random.Random(0)
    first = Dropping(state["dev"], rng, 0.0)
    cli = LinkClient(first, PLAN, reconnect=lambda: LoopbackTransport(state["dev"]))
    xs, ys = _samples(20, seed=1)
    cli.train(xs[:10], ys[:10])
    state["dev"] = LinkDeviceModel(PARAMS, ToyNetwork(PARAMS))  # reset / re-flashed
    first.p = 1.0  # the link drops at the next write
    with pytest.raises(
        DeviceResetError,
        match=r"accepted=\d+, results_read=\d+, this session "
        r"expects 1\d, 10: the device was reset or re-flashed mid-run",
    ):
        cli.train(xs[10:], ys[10:])
    assert len(net.applied) == 10  # nothing went to the old device twice


def test_without_reconnect_the_transport_error_propagates():
    dev = LinkDeviceModel(PARAMS, ToyNetwork(PARAMS))
    cli = LinkClient(Dropping(dev, random.Random(0), 1.0), PLAN)
    with pytest.raises(ConnectionResetError):
        cli.hello()
    failing = LinkClient(
        Dropping(dev, random.Random(0), 1.0),
        PLAN,
        reconnect=lambda: Dropping(dev, random.Random(0), 1.0),
        max_reconnects=3,
    )
    with pytest.raises(LinkError, match="the link failed 3 times in a row"):
        failing.hello()


def test_reconnects_answer_a_lost_response_from_the_cache():
    """The fuzzer's two paths both happen: commands re-sent after a reconnect that the device
    had executed (answered from its response cache, not applied again) and ones it had not."""
    rng = random.Random(7)
    net = ToyNetwork(PARAMS)
    dev = LinkDeviceModel(PARAMS, net)
    cli = LinkClient(Dropping(dev, rng, 0.2), PLAN, reconnect=lambda: Dropping(dev, rng, 0.2))
    xs, ys = _samples(30, seed=7)
    assert cli.train(xs, ys) == _expected(xs, ys, 0, True)
    assert len(net.applied) == 30
    assert cli.reconnects >= 5 and dev.duplicates >= 1  # measured: 16 and 5 with this seed


def test_the_session_tag_names_a_reset_or_another_host():
    """With a session tag (SESSION, reported by HELLO) a reset device is recognised even when its
    counters happen to match, and a device another host tagged is named as such."""
    for new_tag, what in (
        (None, r"it was reset or re-flashed mid-run \(tag 0\)"),
        (7, "another host tagged it with session 00000007"),
    ):
        state = {"dev": LinkDeviceModel(PARAMS, ToyNetwork(PARAMS))}
        first = Dropping(state["dev"], random.Random(0), 0.0)
        cli = LinkClient(first, PLAN, reconnect=lambda s=state: LoopbackTransport(s["dev"]))
        tag = cli.start_session(0x5E55)
        assert tag == 0x5E55 and cli.hello().session == 0x5E55
        state["dev"] = LinkDeviceModel(PARAMS, ToyNetwork(PARAMS))  # counters 0, like ours
        if new_tag is not None:
            state["dev"].session = new_tag
        first.p = 1.0
        with pytest.raises(DeviceResetError, match=f"tag 00005e55: {what}"):
            cli.counters()
