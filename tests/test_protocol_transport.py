"""Real transports: TCP and a serial port (a pseudo-terminal) to the Python device model."""

from __future__ import annotations

import os
import select
import socket
import threading

import numpy as np
import pytest
from pipetrain.host.client import LinkClient
from pipetrain.host.transport import TransportError, open_transport
from pipetrain.protocol.device_model import LinkDeviceModel, ToyNetwork
from pipetrain.protocol.wire import LinkParams
from test_protocol import PLAN


def _model():
    params = LinkParams.from_plan(PLAN)
    net = ToyNetwork(params)
    return LinkDeviceModel(params, net), net


def _exercise(cli: LinkClient, net: ToyNetwork) -> None:
    rng = np.random.default_rng(5)
    xs = rng.integers(-2000, 2000, size=(20, 4))
    ys = rng.integers(0, 2, size=20)
    cli.reset_counters()
    res = cli.train(xs, ys)
    assert [r.sample for r in res] == list(range(20))
    assert [r.pred for r in res] == [
        (int(x.sum()) + int(y)) % 2 for x, y in zip(xs, ys, strict=True)
    ]
    assert len(net.applied) == 20 and cli.counters().samples_trained == 20
    assert cli.retransmits == 0


def test_tcp_transport_to_device_model():
    dev, net = _model()
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    stop = threading.Event()

    def serve():
        conn, _ = srv.accept()
        with conn:
            while not stop.is_set():
                data = conn.recv(4096)
                if not data:
                    return
                dev.receive(data)
                conn.sendall(dev.transmit())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with open_transport(f"tcp://127.0.0.1:{port}") as tr:
        _exercise(LinkClient(tr, PLAN, timeout=2.0), net)
    stop.set()
    t.join(2)
    srv.close()


def test_serial_transport_over_a_pty():
    dev, net = _model()
    master, slave = os.openpty()
    name = os.ttyname(slave)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            r, _, _ = select.select([master], [], [], 0.05)
            if r:
                try:
                    data = os.read(master, 4096)
                except OSError:
                    return
                dev.receive(data)
                out = dev.transmit()
                if out:
                    os.write(master, out)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with open_transport(f"serial://{name}?baud=115200") as tr:
            assert tr.baud == 115200
            _exercise(LinkClient(tr, PLAN, timeout=2.0), net)
    finally:
        stop.set()
        t.join(2)
        os.close(master)
        os.close(slave)


@pytest.mark.parametrize(
    "url, msg",
    [
        ("udp://x:1", "unknown link target"),
        ("tcp://localhost", "give host and port"),
        ("serial://", "give a port"),
        ("serial:///dev/ttyUSB1?baud=fast", "baud must be an integer"),
        ("serial:///nonexistent/tty0", "cannot open serial port"),
    ],
)
def test_open_transport_errors(url, msg):
    with pytest.raises(TransportError, match=msg):
        open_transport(url)


def test_tcp_connection_refused():
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(TransportError, match="cannot connect"):
        open_transport(f"tcp://127.0.0.1:{port}")
