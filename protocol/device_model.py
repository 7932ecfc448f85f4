"""The reference device of the host link: a byte-exact Python model of the RTL link engine.

:class:`LinkDeviceModel` is a byte-exact model of :class:`pipetrain.hdl.link.LinkEngine` (same
parser, same resynchronisation, same responses, same counters, the device half of the
stop-and-wait ARQ of :mod:`pipetrain.protocol.wire`); tests compare the two. It drives a
:class:`NetworkBackend`: :class:`ToyNetwork` (a deterministic stand-in for protocol tests) or a
model of ``NetworkTop`` in front of the golden model.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from enum import IntEnum
from typing import Protocol

from .onchip import epoch_orders, perm_bits
from .wire import (
    CRC_BYTES,
    MAX_RUN_EPOCHS,
    NAK,
    RUN_RECORDS,
    STORE_INDEX_BYTES,
    SYNC,
    WEIGHT_HEADER_BYTES,
    Cmd,
    EpochSummary,
    Frame,
    LinkParams,
    NakReason,
    Result,
    crc32,
    decode_features,
    encode_frame,
    response_type,
)

__all__ = ["NetworkBackend", "ToyNetwork", "LinkDeviceModel"]


class NetworkBackend(Protocol):
    """What :class:`LinkDeviceModel` needs from the network (a model of docs/ports.md)."""

    def push(self, x: Sequence[int], label: int, train: bool) -> None:
        """Accept one whole sample (``x``: N signed ints)."""

    def pop_results(self) -> list[Result]:
        """Results produced since the last call, in order."""

    def flush(self) -> None:
        """Run bubble ticks until no sample is in flight."""

    def wacc(self, write: bool, stage: int, kind: int, row: int, col: int, data: int) -> int:
        """One weight access (network idle); returns the value read or written."""

    def counters(self) -> tuple[int, int, Sequence[int]]:
        """(samples_trained, ticks, the rest of the network's counters: saturations (S + 1 +
        heads), then the heads' ``head_correct``; :attr:`LinkParams.network_counters` − 2)."""


def _wrap_s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


class ToyNetwork:
    """A small deterministic stand-in for NetworkTop, for protocol tests (not a neural network).

    Samples stay in flight for ``latency`` ticks (default S, like the PB pipeline): pushing a
    sample runs one tick, and once more than ``latency`` samples are in flight the oldest yields
    its result; ``flush`` runs bubble ticks until none is in flight. The result of sample
    ``n`` is ``pred = (Σx + label) mod classes``, ``loss = (7·Σx + label) mod 2^32``. A training
    result bumps ``samples_trained``; ``saturations[i]`` (every network counter after ``ticks``:
    the saturation counters, then the heads' ``head_correct``) counts pushed samples with
    ``x[i mod N] < 0``. Weights start at a hash of their address. Every applied sample is kept in
    :attr:`applied` (for exactly-once checks).
    """

    def __init__(self, params: LinkParams, latency: int | None = None) -> None:
        self.params = params
        self.latency = params.num_stages if latency is None else latency
        self.in_flight: deque[tuple[int, tuple[int, ...], int, bool]] = deque()
        self.produced: deque[Result] = deque()
        self.applied: list[tuple[tuple[int, ...], int, bool]] = []
        self.samples_trained = 0
        self.ticks = 0
        self.saturations = [0] * (params.network_counters - 2)
        self.weights: dict[tuple[int, int, int, int], int] = {}
        self._next = 0

    @staticmethod
    def initial_weight(stage: int, kind: int, row: int, col: int) -> int:
        """Deterministic initial value of a weight (signed 32 bit)."""
        h = ((stage * 131 + kind * 31 + row * 7 + col) * 2654435761) & 0xFFFFFFFF
        return _wrap_s32(h)

    def _retire(self) -> None:
        n, x, label, train = self.in_flight.popleft()
        s = sum(x)
        self.produced.append(
            Result(n, (s + label) % self.params.classes, (7 * s + label) & 0xFFFFFFFF, train)
        )
        if train:
            self.samples_trained += 1

    def push(self, x: Sequence[int], label: int, train: bool) -> None:
        """Accept one sample and run one tick."""
        x = tuple(int(v) for v in x)
        self.applied.append((x, label, train))
        self.in_flight.append((self._next, x, label, train))
        self._next = (self._next + 1) & 0xFFFFFFFF
        N = len(x)
        for i in range(len(self.saturations)):
            self.saturations[i] += 1 if x[i % N] < 0 else 0
        self.ticks += 1
        if len(self.in_flight) > self.latency:
            self._retire()

    def bubble(self) -> None:
        """One bubble tick (only while a sample is in flight)."""
        self.ticks += 1
        self._retire()

    def flush(self) -> None:
        """Bubble ticks until nothing is in flight."""
        while self.in_flight:
            self.bubble()

    def pop_results(self) -> list[Result]:
        """Results produced since the last call."""
        out = list(self.produced)
        self.produced.clear()
        return out

    def wacc(self, write: bool, stage: int, kind: int, row: int, col: int, data: int) -> int:
        """Read or write one weight; returns the value."""
        key = (stage, kind, row, col)
        if write:
            self.weights[key] = _wrap_s32(data)
        return self.weights.get(key, self.initial_weight(*key))

    def counters(self) -> tuple[int, int, Sequence[int]]:
        """(samples_trained, ticks, saturations)."""
        return self.samples_trained, self.ticks, list(self.saturations)


class _RxState(IntEnum):
    HUNT = 0
    SYNC1 = 1
    TYPE = 2
    SEQ = 3
    LEN0 = 4
    LEN1 = 5
    PAYLOAD = 6
    CRC = 7


class LinkDeviceModel:
    """Byte-exact Python model of the RTL link engine (:class:`pipetrain.hdl.link.LinkEngine`).

    Feed host bytes with :meth:`receive`; the device's bytes accumulate in :meth:`transmit`.
    The parser is the RTL's: hunt for ``A5 5A`` (``A5 A5 5A`` also syncs), read type, seq and
    length, drop the header at once if no command has that type and length, buffer the payload,
    check the CRC; on any failure hunt again from the *next* byte (no rewind, as in the RTL).
    :meth:`timeout` models the RTL's receive timeout (the bytes stopped mid-frame).

    Members
    -------
    params: link sizes.
    net: the network backend.
    results: the device's result buffer (results the network produced, not yet read).
    onchip: the on-chip training set, slot → ``(features, label)`` (``params.onchip_samples``
        slots; a slot never stored holds zeros, as the RTL's memories after configuration).
    run_cycles: the ``cycles`` word of RUN responses (the RTL counts clock cycles; this model
        has no clock and reports this value, default 0).
    """

    def __init__(self, params: LinkParams, net: NetworkBackend | None = None) -> None:
        self.params = params
        self.net: NetworkBackend = net if net is not None else ToyNetwork(params)
        self.results: deque[Result] = deque()
        self._out = bytearray()
        self._state = _RxState.HUNT
        self._type = self._seq = self._len = 0
        self._payload = bytearray()
        self._crc = bytearray()
        self._last_seq: int | None = None
        self._cached = b""
        self.session = 0  # the SESSION tag (0 after reset)
        self.accepted = 0
        self.results_read = 0
        self.frames_ok = self.bad_crc = self.bad_header = self.rx_timeouts = self.duplicates = 0
        self._offsets = [0] * params.num_counters
        self.onchip: list[tuple[list[int], int]] = [
            ([0] * params.in_features, 0) for _ in range(params.onchip_samples)
        ]
        self.run_cycles = 0

    # -- byte interface
    @property
    def busy(self) -> bool:
        """Whether the parser is inside a frame (the RTL's ``busy`` output while receiving)."""
        return self._state != _RxState.HUNT

    def receive(self, data: bytes) -> None:
        """Process host bytes in order (responses go to the transmit buffer)."""
        for b in data:
            self._byte(b)

    def transmit(self) -> bytes:
        """Return and clear the bytes the device has sent."""
        out = bytes(self._out)
        self._out.clear()
        return out

    def timeout(self) -> None:
        """The receive timeout fired: drop a partial frame."""
        if self._state != _RxState.HUNT:
            self.rx_timeouts += 1
            self._state = _RxState.HUNT

    def step(self, data: bytes) -> bytes:
        """Receive ``data``, let the receive timeout fire if it left a partial frame, and return
        everything the device sent (the :class:`~pipetrain.host.transport.ByteDevice` protocol)."""
        self.receive(data)
        self.timeout()
        return self.transmit()

    def _byte(self, b: int) -> None:
        st = self._state
        if st == _RxState.HUNT:
            if b == SYNC[0]:
                self._state = _RxState.SYNC1
        elif st == _RxState.SYNC1:
            if b == SYNC[1]:
                self._state = _RxState.TYPE
            elif b != SYNC[0]:
                self._state = _RxState.HUNT
        elif st == _RxState.TYPE:
            self._type = b
            self._state = _RxState.SEQ
        elif st == _RxState.SEQ:
            self._seq = b
            self._state = _RxState.LEN0
        elif st == _RxState.LEN0:
            self._len = b
            self._state = _RxState.LEN1
        elif st == _RxState.LEN1:
            self._len |= b << 8
            if not self.params.command_length_ok(self._type, self._len):
                self.bad_header += 1
                self._state = _RxState.HUNT
                return
            self._payload = bytearray()
            self._crc = bytearray()
            self._state = _RxState.PAYLOAD if self._len else _RxState.CRC
        elif st == _RxState.PAYLOAD:
            self._payload.append(b)
            if len(self._payload) == self._len:
                self._state = _RxState.CRC
        elif st == _RxState.CRC:
            self._crc.append(b)
            if len(self._crc) == CRC_BYTES:
                self._state = _RxState.HUNT
                body = bytes((self._type, self._seq)) + self._len.to_bytes(2, "little")
                if crc32(body + self._payload) != int.from_bytes(self._crc, "little"):
                    self.bad_crc += 1
                    return
                self.frames_ok += 1
                self._dispatch(self._type, self._seq, bytes(self._payload))

    # -- execution
    def _dispatch(self, cmd: int, seq: int, p: bytes) -> None:
        if cmd != Cmd.HELLO and seq == self._last_seq:
            self.duplicates += 1
            self._out += self._cached
            return
        rtype, payload = self._execute(cmd, p)
        self._last_seq = seq
        self._cached = encode_frame(Frame(rtype, seq, payload))
        self._out += self._cached

    def _collect(self) -> None:
        self.results.extend(self.net.pop_results())

    def _counter_values(self) -> list[int]:
        trained, ticks, sats = self.net.counters()
        return [
            trained,
            ticks,
            *sats,
            self.accepted,
            self.results_read,
            self.frames_ok,
            self.bad_crc,
            self.bad_header,
            self.rx_timeouts,
            self.duplicates,
        ]

    def _run(self, p: bytes) -> tuple[int, bytes]:
        """RUN (docs/protocol.md §2): E epochs over slots 0..count−1 in the device's permutation
        (:func:`~pipetrain.protocol.onchip.epoch_orders`), every result summed into its epoch's
        summary, then a flush; ``accepted`` and ``results_read`` both grow by E·count — or, with
        :data:`~pipetrain.protocol.wire.RUN_RECORDS` (one epoch, count ≤ result_depth), the
        records also go to the result buffer and ``results_read`` grows as the host reads."""
        P = self.params
        count = int.from_bytes(p[0:2], "little")
        epochs, records = p[2] & ~RUN_RECORDS, bool(p[2] & RUN_RECORDS)
        start = int.from_bytes(p[3:5], "little")
        mask = int.from_bytes(p[5:7], "little")
        if self.accepted != self.results_read:  # results of earlier samples still to read
            return NAK, bytes((Cmd.RUN, NakReason.BUSY))
        if not 1 <= count <= P.onchip_samples or not 1 <= epochs <= MAX_RUN_EPOCHS:
            return NAK, bytes((Cmd.RUN, NakReason.BAD_ARG))
        if records and (epochs != 1 or count > P.result_depth):
            return NAK, bytes((Cmd.RUN, NakReason.BAD_ARG))
        k = perm_bits(count)
        if not (0 < start < 1 << k and 0 < mask < 1 << k):
            return NAK, bytes((Cmd.RUN, NakReason.BAD_ARG))
        labels: list[int] = []
        sums = [[0, 0] for _ in range(epochs)]
        done = 0

        def take(results: list[Result]) -> None:
            nonlocal done
            if records:  # the records wait in the result buffer too
                self.results.extend(results)
            for r in results:
                e = done // count
                sums[e][0] += r.loss
                sums[e][1] += int(r.pred == labels[done])
                done += 1

        for order in epoch_orders(count, start, mask, epochs):
            for i in order:
                xs, label = self.onchip[i]
                labels.append(label)
                self.net.push(xs, label, True)
                take(self.net.pop_results())
        self.net.flush()
        take(self.net.pop_results())
        total = epochs * count
        self.accepted = (self.accepted + total) & 0xFFFFFFFF
        if not records:
            self.results_read = (self.results_read + total) & 0xFFFFFFFF
        out = b"".join(EpochSummary(a, c).to_bytes() for a, c in sums)
        return response_type(Cmd.RUN), out + (self.run_cycles & 0xFFFFFFFF).to_bytes(4, "little")

    def _execute(self, cmd: int, p: bytes) -> tuple[int, bytes]:
        P = self.params
        ok = response_type(cmd)
        if cmd == Cmd.HELLO:
            return ok, P.hello_payload(self.accepted, self.results_read, self.session)
        if cmd == Cmd.SESSION:
            self.session = int.from_bytes(p, "little")
            return ok, b""
        if cmd == Cmd.SAMPLES:
            n = len(p) // P.record_bytes
            if (self.accepted - self.results_read) % (1 << 32) + n > P.result_depth:
                return NAK, bytes((cmd, NakReason.FULL))
            for k in range(n):
                r = p[k * P.record_bytes : (k + 1) * P.record_bytes]
                xs = decode_features(P, r[3:])
                self.net.push(xs, int.from_bytes(r[0:2], "little"), bool(r[2] & 1))
                self.accepted = (self.accepted + 1) & 0xFFFFFFFF
                self._collect()
            return ok, self.accepted.to_bytes(4, "little")
        if cmd == Cmd.STORE:
            index = int.from_bytes(p[:STORE_INDEX_BYTES], "little")
            recs = p[STORE_INDEX_BYTES:]
            n = len(recs) // P.record_bytes
            if index + n > P.onchip_samples:
                return NAK, bytes((cmd, NakReason.BAD_ARG))
            for k in range(n):
                r = recs[k * P.record_bytes : (k + 1) * P.record_bytes]
                self.onchip[index + k] = (
                    decode_features(P, r[3:]),
                    int.from_bytes(r[0:2], "little"),
                )
            return ok, b""
        if cmd == Cmd.RUN:
            return self._run(p)
        if cmd == Cmd.READ_RESULTS:
            if p[0] == 0:
                return NAK, bytes((cmd, NakReason.BAD_ARG))
            self._collect()
            n = min(p[0], len(self.results), P.max_results)
            out = bytearray((n,))
            for _ in range(n):
                out += self.results.popleft().to_bytes()
                self.results_read = (self.results_read + 1) & 0xFFFFFFFF
            return ok, bytes(out)
        if cmd == Cmd.FLUSH:
            self.net.flush()
            self._collect()
            return ok, b""
        if cmd == Cmd.READ_COUNTERS:
            vals = self._counter_values()
            return ok, b"".join(
                ((v - o) & 0xFFFFFFFF).to_bytes(4, "little")
                for v, o in zip(vals, self._offsets, strict=True)
            )
        if cmd == Cmd.RESET_COUNTERS:
            self._offsets = self._counter_values()
            return ok, b""
        # weight access
        stage, kind = p[0], p[1]
        row = int.from_bytes(p[2:4], "little")
        col = int.from_bytes(p[4:6], "little")
        count = p[6]
        write = cmd == Cmd.WRITE_WEIGHTS
        valid = (
            stage < P.num_stages
            and kind < P.stage_kinds[stage]
            and row < P.stage_rows[stage]
            and 1 <= count <= P.max_words
            and col + count <= P.stage_cols[stage]
            and (not write or len(p) == WEIGHT_HEADER_BYTES + 4 * count)
        )
        if not valid:
            return NAK, bytes((cmd, NakReason.BAD_ARG))
        self.net.flush()  # the engine raises `flush` while a weight access waits
        self._collect()
        out = bytearray()
        for k in range(count):
            data = 0
            if write:
                off = WEIGHT_HEADER_BYTES + 4 * k
                data = int.from_bytes(p[off : off + 4], "little", signed=True)
            v = self.net.wacc(write, stage, kind, row, col + k, data)
            if not write:
                out += (v & 0xFFFFFFFF).to_bytes(4, "little")
        return ok, bytes(out)
