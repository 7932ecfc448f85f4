"""Byte transports for the host link: in-process loopback, fault injection, serial and TCP.

A transport moves raw bytes; framing and CRC live in :mod:`pipetrain.protocol.wire`,
retransmission in :mod:`pipetrain.host.client`. The interface is two calls:

* ``write(data)`` — send bytes (never blocks for long);
* ``read(timeout)`` — return the bytes that arrive within ``timeout`` seconds, as soon as some
  have arrived; ``b""`` means the timeout passed with nothing received.

:func:`open_transport` turns a target URL into a transport: ``serial:///dev/ttyUSB1?baud=115200``
(pyserial; ``serial://COM3`` on Windows) or ``tcp://host:port``.
"""

from __future__ import annotations

import errno
import random
import socket
import urllib.parse
from abc import ABC, abstractmethod
from typing import Any, Protocol

from ..errors import UserError

__all__ = [
    "Transport",
    "ByteDevice",
    "LoopbackTransport",
    "FaultyTransport",
    "SerialTransport",
    "TcpTransport",
    "TransportError",
    "open_transport",
    "serial_hint",
    "tcp_hint",
    "DEFAULT_BAUD",
]

#: Baud rate of ``serial://`` targets without ``?baud=`` (the board tops' default).
DEFAULT_BAUD = 115200


class TransportError(UserError, ValueError):
    """A target URL cannot be opened (bad scheme, missing port, device not found); the
    message names the address and what to check (:func:`serial_hint`, :func:`tcp_hint`)."""


class Transport(ABC):
    """A bidirectional byte pipe to a device (see the module docstring for the contract)."""

    @abstractmethod
    def write(self, data: bytes) -> None:
        """Send ``data``."""

    @abstractmethod
    def read(self, timeout: float) -> bytes:
        """Return received bytes (b"" once ``timeout`` seconds pass with none)."""

    def close(self) -> None:  # noqa: B027  (optional for subclasses)
        """Release the underlying resource."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ByteDevice(Protocol):
    """An in-process device: ``step(data)`` consumes host bytes, runs until the device is quiet
    (nothing left to do, a partial frame dropped by its receive timeout) and returns the bytes
    it sent. :class:`~pipetrain.protocol.device_model.LinkDeviceModel` and the RTL simulation
    harnesses implement it."""

    def step(self, data: bytes) -> bytes:
        """Consume ``data``; return the device's output."""


class LoopbackTransport(Transport):
    """In-process transport to a :class:`ByteDevice`; time is simulated, so a timeout costs
    nothing: ``read`` runs the device and returns b"" when it sent nothing."""

    def __init__(self, device: ByteDevice) -> None:
        self.device = device
        self._pending = bytearray()
        self.bytes_written = 0
        self.bytes_read = 0

    def write(self, data: bytes) -> None:
        """Queue ``data`` for the device."""
        self._pending += data
        self.bytes_written += len(data)

    def read(self, timeout: float) -> bytes:
        """Run the device on the queued bytes; return what it sent."""
        data, self._pending = bytes(self._pending), bytearray()
        out = self.device.step(data)
        self.bytes_read += len(out)
        return out


class FaultyTransport(Transport):
    """Wraps a transport and damages the traffic in both directions, at random.

    Each ``write`` chunk (host → device) and each non-empty ``read`` chunk (device → host)
    independently suffers, with the given probabilities: being dropped, truncated (a random
    prefix kept), corrupted (1–3 bytes XORed with non-zero values), duplicated, or preceded by
    1–16 garbage bytes (which may contain sync markers); optionally also losing one byte,
    doubling one byte, or a noise burst (a run of 4–64 bytes overwritten with random bytes).
    ``faults`` counts what was done. A kind whose probability is 0 draws nothing from ``rng``
    (adding a kind leaves the other kinds' random sequence as it was).
    """

    KINDS = (
        "drop",
        "truncate",
        "corrupt",
        "duplicate",
        "garbage",
        "byte_drop",
        "byte_dup",
        "burst",
    )

    def __init__(
        self,
        inner: Transport,
        rng: random.Random,
        *,
        p_drop: float = 0.0,
        p_truncate: float = 0.0,
        p_corrupt: float = 0.0,
        p_duplicate: float = 0.0,
        p_garbage: float = 0.0,
        p_byte_drop: float = 0.0,
        p_byte_dup: float = 0.0,
        p_burst: float = 0.0,
    ) -> None:
        self.inner = inner
        self.rng = rng
        self.p = {
            "drop": p_drop,
            "truncate": p_truncate,
            "corrupt": p_corrupt,
            "duplicate": p_duplicate,
            "garbage": p_garbage,
            "byte_drop": p_byte_drop,
            "byte_dup": p_byte_dup,
            "burst": p_burst,
        }
        self.faults = dict.fromkeys(self.KINDS, 0)
        self.byte_time = getattr(inner, "byte_time", 0.0)

    def _damage(self, data: bytes) -> bytes:
        rng = self.rng
        if not data:
            return data
        if rng.random() < self.p["drop"]:
            self.faults["drop"] += 1
            return b""
        out = bytearray(data)
        if rng.random() < self.p["truncate"] and len(out) > 1:
            self.faults["truncate"] += 1
            del out[rng.randrange(1, len(out)) :]
        if rng.random() < self.p["corrupt"]:
            self.faults["corrupt"] += 1
            for _ in range(rng.randint(1, 3)):
                out[rng.randrange(len(out))] ^= rng.randint(1, 255)
        if rng.random() < self.p["duplicate"]:
            self.faults["duplicate"] += 1
            out += bytes(out)
        if rng.random() < self.p["garbage"]:
            self.faults["garbage"] += 1
            junk = bytearray(rng.randrange(256) for _ in range(rng.randint(1, 16)))
            if rng.random() < 0.5:
                pos = rng.randrange(len(junk))
                junk[pos : pos + 2] = b"\xa5\x5a"
            out = junk + out
        if self.p["byte_drop"] and len(out) > 1 and rng.random() < self.p["byte_drop"]:
            self.faults["byte_drop"] += 1
            del out[rng.randrange(len(out))]
        if self.p["byte_dup"] and rng.random() < self.p["byte_dup"]:
            self.faults["byte_dup"] += 1
            pos = rng.randrange(len(out))
            out.insert(pos, out[pos])
        if self.p["burst"] and rng.random() < self.p["burst"]:
            self.faults["burst"] += 1
            n = min(len(out), rng.randint(4, 64))
            pos = rng.randrange(len(out) - n + 1)
            out[pos : pos + n] = bytes(rng.randrange(256) for _ in range(n))
        return bytes(out)

    def write(self, data: bytes) -> None:
        """Send a possibly damaged copy of ``data``."""
        damaged = self._damage(data)
        if damaged:
            self.inner.write(damaged)

    def read(self, timeout: float) -> bytes:
        """Receive, then damage what arrived (a dropped chunk reads as a timeout)."""
        return self._damage(self.inner.read(timeout))

    def close(self) -> None:
        """Close the inner transport."""
        self.inner.close()


class SerialTransport(Transport):
    """A serial port through pyserial (any port name or pyserial URL, e.g. ``/dev/ttyUSB1``)."""

    def __init__(self, port: str, baud: int = DEFAULT_BAUD) -> None:
        import serial  # pyserial

        try:
            self.ser = serial.serial_for_url(port, baudrate=baud, timeout=0)
        except (serial.SerialException, ValueError) as exc:
            raise TransportError(
                f"cannot open serial port {port!r} (serial://{port}): {exc}; {serial_hint(exc)}"
            ) from exc
        self.port, self.baud = port, baud
        #: seconds per byte on the line (8N1: 10 bit times); the client adds it to timeouts
        self.byte_time = 10.0 / baud

    def write(self, data: bytes) -> None:
        """Send ``data`` (blocks until it is handed to the driver)."""
        self.ser.write(data)
        self.ser.flush()

    def read(self, timeout: float) -> bytes:
        """Wait up to ``timeout`` s for a byte, then take everything already buffered."""
        self.ser.timeout = max(0.0, timeout)
        first = self.ser.read(1)
        if not first:
            return b""
        waiting = self.ser.in_waiting
        return first + (self.ser.read(waiting) if waiting else b"")

    def close(self) -> None:
        """Close the port."""
        self.ser.close()


def serial_hint(exc: BaseException) -> str:
    """What to check when a serial port does not open (``exc``: pyserial's error; its
    ``errno``, where it has one, picks the advice): the device path (ENOENT), permissions
    (EACCES, EPERM), another program holding the port (EBUSY), else all three."""
    code = getattr(exc, "errno", None)
    path = (
        "check the device path: is the board plugged in and programmed (pipetrain deploy)? "
        "`python -m serial.tools.list_ports` lists the ports"
    )
    perm = (
        "check the permissions: on Linux your user needs the port's group (usually dialout: "
        "sudo usermod -aG dialout $USER, then log in again)"
    )
    busy = "check that no other program (a terminal, an earlier pipetrain run) holds the port"
    if code == errno.ENOENT:
        return path
    if code in (errno.EACCES, errno.EPERM):
        return perm
    if code == errno.EBUSY:
        return busy
    return f"{path}; {perm}; {busy}"


def tcp_hint(exc: BaseException, host: str, port: int, timeout: float) -> str:
    """What to check when ``tcp://HOST:PORT`` does not connect (``exc``: the socket error):
    nothing listening (refused), a host name that does not resolve, no answer within
    ``timeout`` s; every hint asks whether the board's bridge is running there. A ``tcp://``
    target is a board behind a network-to-serial bridge (e.g. ser2net or socat in raw mode)
    or any server of the link protocol; the RTL simulation is ``--target sim``, which starts
    its own."""
    where = f"tcp://{host}:{port}"
    serve = (
        f"is the device's bridge (a network-to-serial bridge such as ser2net or socat in raw "
        f"mode, in front of a programmed board) running and listening on {where}? (the RTL "
        "simulation needs no server: --target sim)"
    )
    if isinstance(exc, ConnectionRefusedError):
        return f"nothing listens on port {port} of {host}: {serve}"
    if isinstance(exc, socket.gaierror):
        return f"the host name {host!r} does not resolve: check the address; {serve}"
    if isinstance(exc, TimeoutError):
        return (
            f"{host} did not answer within {timeout:g} s: check the address and that no "
            f"firewall blocks port {port}; {serve}"
        )
    return f"check the address; {serve}"


class TcpTransport(Transport):
    """A TCP connection (e.g. a simulation server or a network-to-serial bridge)."""

    def __init__(self, host: str, port: int, connect_timeout: float = 5.0) -> None:
        try:
            self.sock = socket.create_connection((host, port), timeout=connect_timeout)
        except OSError as exc:
            raise TransportError(
                f"cannot connect to tcp://{host}:{port}: {exc}; "
                f"{tcp_hint(exc, host, port, connect_timeout)}"
            ) from exc
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def write(self, data: bytes) -> None:
        """Send all of ``data``."""
        self.sock.settimeout(None)
        self.sock.sendall(data)

    def read(self, timeout: float) -> bytes:
        """Receive what arrives within ``timeout`` s. Raises ConnectionError if the peer closed."""
        self.sock.settimeout(max(1e-4, timeout))
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return b""
        if not data:
            raise ConnectionError("the device closed the TCP connection")
        return data

    def close(self) -> None:
        """Close the connection."""
        self.sock.close()


def open_transport(url: str) -> Transport:
    """Open ``serial://PORT[?baud=N]`` or ``tcp://HOST:PORT``.

    ``serial:///dev/ttyUSB1`` is the port ``/dev/ttyUSB1``; ``serial://COM3`` is ``COM3``.
    Raises :class:`TransportError` for another scheme, a missing TCP port or a port that cannot
    be opened.
    """
    u = urllib.parse.urlsplit(url)
    if u.scheme == "serial":
        port = u.netloc + u.path
        if not port:
            raise TransportError(f"{url!r}: give a port, e.g. serial:///dev/ttyUSB1")
        query = urllib.parse.parse_qs(u.query)
        try:
            baud = int(query.get("baud", [DEFAULT_BAUD])[0])
        except ValueError as exc:
            raise TransportError(f"{url!r}: baud must be an integer") from exc
        return SerialTransport(port, baud)
    if u.scheme == "tcp":
        try:
            port_no = u.port
        except ValueError as exc:
            raise TransportError(f"{url!r}: bad port") from exc
        if not u.hostname or port_no is None:
            raise TransportError(f"{url!r}: give host and port, e.g. tcp://localhost:7000")
        return TcpTransport(u.hostname, port_no)
    raise TransportError(
        f"unknown link target {url!r}: use serial://PORT[?baud=N] or tcp://HOST:PORT"
    )
