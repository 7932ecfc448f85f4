"""The host link protocol: frames, CRC, the reference device state machine and the host client.

The wire format is specified in ``docs/protocol.md``; this module is its executable form and the
single source of its constants (the RTL engine :mod:`pipetrain.hdl.link` imports them).

* Frame: ``A5 5A | type | seq | len (u16 LE) | payload[len] | CRC-32 (u32 LE)``; the CRC is
  CRC-32/ISO-HDLC (zlib's ``crc32``: poly 0x04C11DB7 reflected, init and xorout 0xFFFFFFFF,
  check value ``crc32(b"123456789") = 0xCBF43926``) over ``type … payload``.
* Reliability (stop-and-wait ARQ, *derived*: the classic alternating-sequence protocol with an
  8-bit sequence number): the host sends one command at a time and retransmits it, with the same
  sequence number, until a response with that number arrives; the device executes a command only
  if its sequence number differs from the last one it executed and otherwise re-sends the cached
  response, so every command — in particular every training sample — is applied exactly once.
* :class:`LinkDeviceModel` is a byte-exact Python model of the RTL engine (same parser, same
  resynchronisation, same responses, same counters); tests compare the two.
* :class:`LinkClient` is the host side: ``hello``, ``train``, ``infer``, weight access, counters.
"""

from __future__ import annotations

import math
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol

import numpy as np

from ..compiler.plan import Plan

__all__ = [
    "SYNC",
    "PROTOCOL_VERSION",
    "HEADER_BYTES",
    "CRC_BYTES",
    "Cmd",
    "NAK",
    "NakReason",
    "crc32",
    "Frame",
    "encode_frame",
    "FrameDecoder",
    "LinkParams",
    "Result",
    "Counters",
    "DeviceInfo",
    "NetworkBackend",
    "ToyNetwork",
    "LinkDeviceModel",
    "LinkError",
    "PlanMismatchError",
    "NakError",
    "LinkClient",
    "quantise_inputs",
    "loss_value",
    "encode_record",
    "response_type",
]

#: Two-byte sync marker that starts every frame.
SYNC = b"\xa5\x5a"
#: Protocol version reported by HELLO; the client refuses another one.
PROTOCOL_VERSION = 1
#: Bytes before the payload: sync (2), type, seq, len (2).
HEADER_BYTES = 6
#: Bytes after the payload: CRC-32, little endian.
CRC_BYTES = 4
#: Response type of a negative acknowledgement (payload: command type, reason).
NAK = 0xFF
#: CRC-32 polynomial, reflected form (what the RTL's XOR matrix is built from).
CRC_POLY_REFLECTED = 0xEDB88320
#: Bytes of one result in a READ_RESULTS response: sample u32, pred u16, loss u32, train u8.
RESULT_BYTES = 11
#: Bytes of the fixed header of READ_WEIGHTS / WRITE_WEIGHTS: stage, kind, row, col, count.
WEIGHT_HEADER_BYTES = 7
#: Bytes of a HELLO response.
HELLO_BYTES = 26
#: Engine-side counters appended to the network's counters in READ_COUNTERS, in order.
ENGINE_COUNTERS = (
    "accepted",
    "results_read",
    "frames_ok",
    "bad_crc",
    "bad_header",
    "rx_timeouts",
    "duplicates",
)


class Cmd(IntEnum):
    """Command types (host → device). A successful response has type ``cmd | 0x80``."""

    HELLO = 0x01
    SAMPLES = 0x02
    READ_RESULTS = 0x03
    FLUSH = 0x04
    READ_COUNTERS = 0x05
    RESET_COUNTERS = 0x06
    READ_WEIGHTS = 0x07
    WRITE_WEIGHTS = 0x08


class NakReason(IntEnum):
    """Reason byte of a NAK response. A NAKed command was not applied."""

    FULL = 1  #: SAMPLES would exceed the result buffer; read results first.
    BAD_ARG = 2  #: an argument is out of range (stage, kind, row, col, count).


def response_type(cmd: int) -> int:
    """Type byte of the successful response to ``cmd``."""
    return 0x80 | cmd


def crc32(data: bytes, crc: int = 0) -> int:
    """CRC-32/ISO-HDLC of ``data`` (``crc32(b"123456789") == 0xCBF43926``); chainable."""
    return zlib.crc32(data, crc)


# ----------------------------------------------------------------------------------------------
# Frames


@dataclass(frozen=True)
class Frame:
    """One frame: ``type`` (u8), ``seq`` (u8) and ``payload`` (≤ 65535 bytes)."""

    type: int
    seq: int
    payload: bytes = b""


def encode_frame(frame: Frame) -> bytes:
    """Return the wire bytes of ``frame``. Raises ValueError on out-of-range fields."""
    if not (0 <= frame.type <= 0xFF and 0 <= frame.seq <= 0xFF and len(frame.payload) <= 0xFFFF):
        raise ValueError(f"frame fields out of range: {frame.type}, {frame.seq}")
    body = bytes((frame.type, frame.seq)) + len(frame.payload).to_bytes(2, "little")
    body += frame.payload
    return SYNC + body + crc32(body).to_bytes(4, "little")


class FrameDecoder:
    """Incremental frame decoder with resynchronisation (the host side's receiver).

    Bytes are buffered; the decoder hunts for :data:`SYNC`, reads the header, rejects a length
    above ``max_payload`` at once, waits for the rest of the frame and checks the CRC. On any
    failure it drops the first byte of the false sync marker and hunts again from the next byte
    (so a frame that starts inside a corrupted one is still found). Never raises on bad input.

    Members
    -------
    max_payload: longest payload accepted (bytes).
    accept: optional check ``accept(type, length)`` of a header; a header it refuses is treated
        like a bad length (the host passes :meth:`LinkParams.response_length_ok`).
    bad_crc, bad_header: frames rejected by CRC or by length.
    """

    def __init__(
        self, max_payload: int = 0xFFFF, accept: Callable[[int, int], bool] | None = None
    ) -> None:
        self.max_payload = max_payload
        self.accept = accept
        self._buf = bytearray()
        self.bad_crc = 0
        self.bad_header = 0

    def reset(self) -> None:
        """Discard buffered bytes."""
        self._buf.clear()

    def feed(self, data: bytes) -> list[Frame]:
        """Add ``data``; return the frames completed by it, in order."""
        self._buf += data
        out: list[Frame] = []
        buf = self._buf
        while True:
            start = buf.find(SYNC)
            if start < 0:
                # keep a trailing first sync byte: it may start a marker
                del buf[: max(0, len(buf) - 1) if buf[-1:] == SYNC[:1] else len(buf)]
                return out
            del buf[:start]
            if len(buf) < HEADER_BYTES:
                return out
            length = int.from_bytes(buf[4:6], "little")
            if length > self.max_payload or (
                self.accept is not None and not self.accept(buf[2], length)
            ):
                self.bad_header += 1
                del buf[:1]
                continue
            end = HEADER_BYTES + length + CRC_BYTES
            if len(buf) < end:
                return out
            body = bytes(buf[2 : HEADER_BYTES + length])
            if crc32(body) != int.from_bytes(buf[end - CRC_BYTES : end], "little"):
                self.bad_crc += 1
                del buf[:1]
                continue
            out.append(Frame(body[0], body[1], body[4:]))
            del buf[:end]


# ----------------------------------------------------------------------------------------------
# Parameters shared by the RTL engine, the device model and the client


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class LinkParams:
    """Sizes of the link for one plan and engine configuration (all counts in bytes or items).

    Members
    -------
    plan_hash: the plan's hash as 8 bytes (``bytes.fromhex(plan.hash)``).
    in_features: N, features per sample.
    x_bits: X, bits of one quantised feature (``plan.stages[0].formats.x.bits``).
    x_bytes: B = ⌈X/8⌉, bytes per feature on the wire (two's complement, little endian).
    num_stages: S, stages in the plan (weight-access ``stage`` is 0..S−1).
    classes: outputs of the loss unit.
    stage_rows: M of every stage; ``stage_cols``: N+1 (bias column last).
    stage_kinds: weight kinds served per stage (2 = w, u; 3 = also w_prev for LWP ``w`` form).
    max_batch: samples per SAMPLES frame (1..255).
    max_words: weights per READ/WRITE_WEIGHTS frame (1..255).
    result_depth: results the device buffers (≥ S + max_batch, so no forced flush).
    max_results: results per READ_RESULTS response (≤ 255).
    record_bytes: R = 3 + N·B, one sample record.
    rx_max, tx_max: largest command / response payload.
    num_counters: 32-bit words of a READ_COUNTERS response (S + 1 + 2 + 7).
    """

    plan_hash: bytes
    in_features: int
    x_bits: int
    x_bytes: int
    num_stages: int
    classes: int
    stage_rows: tuple[int, ...]
    stage_cols: tuple[int, ...]
    stage_kinds: tuple[int, ...]
    max_batch: int
    max_words: int
    result_depth: int
    max_results: int
    record_bytes: int
    rx_max: int
    tx_max: int
    num_counters: int

    @classmethod
    def from_plan(
        cls,
        plan: Plan,
        max_batch: int | None = None,
        max_words: int = 32,
        result_depth: int | None = None,
    ) -> LinkParams:
        """Derive the link sizes from ``plan``.

        Defaults: ``max_batch`` = ⌊1024 / R⌋ clamped to 1..8 (a command buffer of ≤ ~1 KiB);
        ``result_depth`` = the next power of two ≥ max(16, S + 2·max_batch). Raises ValueError
        when a value is out of range or ``result_depth < S + max_batch`` (the host could then
        be forced to flush, which would change the training schedule).
        """
        stages = plan.stages
        S = len(stages)
        X = stages[0].formats.x.bits
        B = _ceil_div(X, 8)
        N = plan.in_features
        R = 3 + N * B
        if max_batch is None:
            max_batch = max(1, min(8, 1024 // R))
        if result_depth is None:
            result_depth = 1 << max(4, math.ceil(math.log2(S + 2 * max_batch)))
        if not 1 <= max_batch <= 255 or not 1 <= max_words <= 255:
            raise ValueError(f"max_batch={max_batch}, max_words={max_words} must be in 1..255")
        if result_depth < S + max_batch or result_depth > 0xFFFF:
            raise ValueError(
                f"result_depth={result_depth} must be ≥ S + max_batch = {S + max_batch} "
                "(results of in-flight samples need room) and ≤ 65535"
            )
        kinds = tuple(
            3 if (s.update.lwp_horizon > 0 and s.update.lwp_form == "w") else 2 for s in stages
        )
        max_results = min(255, result_depth)
        num_counters = S + 1 + 2 + len(ENGINE_COUNTERS)
        return cls(
            plan_hash=bytes.fromhex(plan.hash),
            in_features=N,
            x_bits=X,
            x_bytes=B,
            num_stages=S,
            classes=plan.loss.classes,
            stage_rows=tuple(s.out_features for s in stages),
            stage_cols=tuple(s.in_features + 1 for s in stages),
            stage_kinds=kinds,
            max_batch=max_batch,
            max_words=max_words,
            result_depth=result_depth,
            max_results=max_results,
            record_bytes=R,
            rx_max=max(max_batch * R, WEIGHT_HEADER_BYTES + 4 * max_words),
            tx_max=max(
                HELLO_BYTES, 1 + RESULT_BYTES * max_results, 4 * max_words, 4 * num_counters
            ),
            num_counters=num_counters,
        )

    def command_length_ok(self, cmd: int, length: int) -> bool:
        """Whether a command header with this type and payload length is well formed."""
        if cmd in (Cmd.HELLO, Cmd.FLUSH, Cmd.READ_COUNTERS, Cmd.RESET_COUNTERS):
            return length == 0
        if cmd == Cmd.READ_RESULTS:
            return length == 1
        if cmd == Cmd.READ_WEIGHTS:
            return length == WEIGHT_HEADER_BYTES
        if cmd == Cmd.WRITE_WEIGHTS:
            n = length - WEIGHT_HEADER_BYTES
            return 4 <= n <= 4 * self.max_words and n % 4 == 0
        if cmd == Cmd.SAMPLES:
            return length % self.record_bytes == 0 and 1 <= length // self.record_bytes <= (
                self.max_batch
            )
        return False

    def response_length_ok(self, rtype: int, length: int, max_words: int = 255) -> bool:
        """Whether a response header with this type and payload length is well formed
        (``max_words``: the device's words per weight frame, 255 before HELLO)."""
        if rtype == NAK:
            return length == 2
        if rtype & 0x80 == 0:
            return False
        cmd = rtype & 0x7F
        if cmd == Cmd.HELLO:
            return length == HELLO_BYTES
        if cmd == Cmd.SAMPLES:
            return length == 4
        if cmd == Cmd.READ_RESULTS:
            return length % RESULT_BYTES == 1 and length <= 1 + RESULT_BYTES * 255
        if cmd in (Cmd.FLUSH, Cmd.RESET_COUNTERS, Cmd.WRITE_WEIGHTS):
            return length == 0
        if cmd == Cmd.READ_COUNTERS:
            return length == 4 * self.num_counters
        if cmd == Cmd.READ_WEIGHTS:
            return length % 4 == 0 and 4 <= length <= 4 * max_words
        return False

    def hello_payload(self, accepted: int, results_read: int) -> bytes:
        """The HELLO response: hash, version, sizes, then the raw sample counters."""
        return (
            self.plan_hash
            + bytes((PROTOCOL_VERSION, self.max_batch, self.max_words, self.num_stages))
            + self.result_depth.to_bytes(2, "little")
            + self.in_features.to_bytes(2, "little")
            + bytes((self.x_bits, self.x_bytes))
            + (accepted & 0xFFFFFFFF).to_bytes(4, "little")
            + (results_read & 0xFFFFFFFF).to_bytes(4, "little")
        )


def encode_record(params: LinkParams, x: Sequence[int], label: int, train: bool) -> bytes:
    """One sample record: label u16 LE, flags (bit 0 = train), N features of B bytes each (LE)."""
    B = params.x_bytes
    mask = (1 << (8 * B)) - 1
    out = bytearray(int(label).to_bytes(2, "little"))
    out.append(1 if train else 0)
    for v in x:
        out += (int(v) & mask).to_bytes(B, "little")
    return bytes(out)


def weight_header(stage: int, kind: int, row: int, col: int, count: int) -> bytes:
    """The 7-byte header of READ_WEIGHTS / WRITE_WEIGHTS."""
    return (
        bytes((stage, kind))
        + row.to_bytes(2, "little")
        + col.to_bytes(2, "little")
        + bytes((count,))
    )


@dataclass(frozen=True)
class Result:
    """One result from the loss unit (docs/ports.md ``result_out``).

    Members
    -------
    sample: index of the sample (counts accepted samples from 0, mod 2^32).
    pred: argmax of the logits.
    loss: raw loss output: p_y with ``recip_frac`` fraction bits (CE) or Σ(z−t)² (MSE).
    train: whether the sample was a training sample.
    """

    sample: int
    pred: int
    loss: int
    train: bool

    def to_bytes(self) -> bytes:
        """The 11 wire bytes of this result."""
        return (
            (self.sample & 0xFFFFFFFF).to_bytes(4, "little")
            + (self.pred & 0xFFFF).to_bytes(2, "little")
            + (self.loss & 0xFFFFFFFF).to_bytes(4, "little")
            + bytes((1 if self.train else 0,))
        )

    @classmethod
    def from_bytes(cls, b: bytes) -> Result:
        """Parse 11 wire bytes."""
        return cls(
            int.from_bytes(b[0:4], "little"),
            int.from_bytes(b[4:6], "little"),
            int.from_bytes(b[6:10], "little"),
            bool(b[10] & 1),
        )


def loss_value(result: Result, plan: Plan) -> float:
    """The real loss of one result (docs/numerics.md §4): CE −ln(max(p_y,1)/2^fr); MSE Σ/2^2fy/C."""
    lu = plan.loss
    if lu.kind == "cross_entropy":
        return -math.log(max(result.loss, 1) / 2.0**lu.recip_frac)
    return result.loss / 2.0 ** (2 * lu.z.frac) / lu.classes


@dataclass(frozen=True)
class Counters:
    """READ_COUNTERS: every value counts since the last RESET_COUNTERS (mod 2^32).

    Members
    -------
    samples_trained: training samples whose last update the network applied.
    ticks: network ticks (bubble ticks included).
    saturations: per-stage saturation counters, then the loss unit's (S + 1 values).
    accepted: samples the engine handed to the network.
    results_read: results the host has read.
    frames_ok: frames received with a good CRC (duplicates included).
    bad_crc: frames dropped for a CRC mismatch.
    bad_header: headers dropped for a type/length that no command has.
    rx_timeouts: frames dropped because the bytes stopped mid-frame.
    duplicates: retransmitted frames answered from the response cache (not re-applied).
    """

    samples_trained: int
    ticks: int
    saturations: tuple[int, ...]
    accepted: int
    results_read: int
    frames_ok: int
    bad_crc: int
    bad_header: int
    rx_timeouts: int
    duplicates: int

    @classmethod
    def from_words(cls, words: Sequence[int]) -> Counters:
        """Build from the words of a READ_COUNTERS response."""
        n_sat = len(words) - 2 - len(ENGINE_COUNTERS)
        eng = words[2 + n_sat :]
        return cls(words[0], words[1], tuple(words[2 : 2 + n_sat]), *eng)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class DeviceInfo:
    """HELLO response.

    Members
    -------
    plan_hash: hex string (16 digits) of the plan the design was built from.
    version: protocol version.
    max_batch, max_words, num_stages, result_depth, in_features, x_bits, x_bytes: link sizes.
    accepted, results_read: raw (never reset) sample counters of the engine.
    """

    plan_hash: str
    version: int
    max_batch: int
    max_words: int
    num_stages: int
    result_depth: int
    in_features: int
    x_bits: int
    x_bytes: int
    accepted: int
    results_read: int

    @classmethod
    def from_payload(cls, p: bytes) -> DeviceInfo:
        """Parse a HELLO response payload. Raises LinkError on a wrong length."""
        if len(p) != HELLO_BYTES:
            raise LinkError(f"HELLO response has {len(p)} bytes, expected {HELLO_BYTES}")
        return cls(
            plan_hash=p[0:8].hex(),
            version=p[8],
            max_batch=p[9],
            max_words=p[10],
            num_stages=p[11],
            result_depth=int.from_bytes(p[12:14], "little"),
            in_features=int.from_bytes(p[14:16], "little"),
            x_bits=p[16],
            x_bytes=p[17],
            accepted=int.from_bytes(p[18:22], "little"),
            results_read=int.from_bytes(p[22:26], "little"),
        )


# ----------------------------------------------------------------------------------------------
# Reference device: network backends and the engine model


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
        """(samples_trained, ticks, saturations[S + 1])."""


def _wrap_s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


class ToyNetwork:
    """A small deterministic stand-in for NetworkTop, for protocol tests (not a neural network).

    Samples stay in flight for ``latency`` ticks (default S, like the PB pipeline): pushing a
    sample runs one tick, and once more than ``latency`` samples are in flight the oldest yields
    its result; ``flush`` runs bubble ticks until none is in flight. The result of sample
    ``n`` is ``pred = (Σx + label) mod classes``, ``loss = (7·Σx + label) mod 2^32``. A training
    result bumps ``samples_trained``; ``saturations[i]`` counts pushed samples with
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
        self.saturations = [0] * (params.num_stages + 1)
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
        self.accepted = 0
        self.results_read = 0
        self.frames_ok = self.bad_crc = self.bad_header = self.rx_timeouts = self.duplicates = 0
        self._offsets = [0] * params.num_counters

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

    def _execute(self, cmd: int, p: bytes) -> tuple[int, bytes]:
        P = self.params
        ok = response_type(cmd)
        if cmd == Cmd.HELLO:
            return ok, P.hello_payload(self.accepted, self.results_read)
        if cmd == Cmd.SAMPLES:
            n = len(p) // P.record_bytes
            if (self.accepted - self.results_read) % (1 << 32) + n > P.result_depth:
                return NAK, bytes((cmd, NakReason.FULL))
            B, X = P.x_bytes, P.x_bits
            for k in range(n):
                r = p[k * P.record_bytes : (k + 1) * P.record_bytes]
                xs = []
                for i in range(P.in_features):
                    v = int.from_bytes(r[3 + i * B : 3 + (i + 1) * B], "little") & ((1 << X) - 1)
                    xs.append(v - (1 << X) if v >> (X - 1) else v)
                self.net.push(xs, int.from_bytes(r[0:2], "little"), bool(r[2] & 1))
                self.accepted = (self.accepted + 1) & 0xFFFFFFFF
                self._collect()
            return ok, self.accepted.to_bytes(4, "little")
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


# ----------------------------------------------------------------------------------------------
# Host client


class LinkError(RuntimeError):
    """The link failed: no valid response after the retries, or a protocol violation."""


class PlanMismatchError(LinkError):
    """The device was built from another plan (or speaks another protocol version)."""


class NakError(LinkError):
    """The device refused a command (NAK); ``reason`` is a :class:`NakReason`."""

    def __init__(self, cmd: int, reason: int) -> None:
        self.cmd, self.reason = cmd, reason
        name = NakReason(reason).name if reason in NakReason._value2member_map_ else reason
        super().__init__(
            f"device refused {Cmd(cmd).name if cmd in Cmd._value2member_map_ else cmd}: {name}"
        )


class _Transport(Protocol):
    def write(self, data: bytes) -> None: ...

    def read(self, timeout: float) -> bytes: ...


def quantise_inputs(xs: Any, plan: Plan) -> np.ndarray:
    """Quantise input features to ``plan.stages[0].formats.x`` (docs/numerics.md §3).

    ``xs``: array-like [n, N]. Float input: ``sat(round_half_even(x·2^frac))``; integer input is
    taken as already quantised and must lie in the format's range (ValueError otherwise).
    Returns an int64 array [n, N].
    """
    fmt = plan.stages[0].formats.x
    a = np.asarray(xs)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2 or a.shape[1] != plan.in_features:
        raise ValueError(f"inputs have shape {a.shape}, expected [n, {plan.in_features}]")
    if np.issubdtype(a.dtype, np.integer):
        q = a.astype(np.int64)
        if q.size and (q.min() < fmt.min_int or q.max() > fmt.max_int):
            raise ValueError(
                f"quantised inputs lie in [{q.min()}, {q.max()}], outside {fmt} "
                f"[{fmt.min_int}, {fmt.max_int}]"
            )
        return q
    q = np.rint(a.astype(np.float64) * 2.0**fmt.frac)
    return np.clip(q, fmt.min_int, fmt.max_int).astype(np.int64)


@dataclass
class _Stats:
    retransmits: int = 0
    naks_full: int = 0
    commands: int = 0


class LinkClient:
    """Host side of the link: one command at a time, retransmitted until answered.

    ``transport`` needs ``write(bytes)`` and ``read(timeout) -> bytes`` (b"" = the timeout
    passed with nothing received; :mod:`pipetrain.host.transport`). Every public call first
    performs HELLO if it has not been done, which checks the device's plan hash against
    ``plan`` and raises :class:`PlanMismatchError` on a mismatch (``check_hash=False`` skips the
    check, e.g. to read a device's identity).

    ``timeout`` is seconds per attempt, plus the line time of the frame and its longest answer
    when the transport has a ``byte_time`` (seconds per byte, serial ports); after
    ``max_retries`` retransmissions of one command :class:`LinkError` is raised. A NAK raises
    :class:`NakError` (FULL is handled internally).

    Members
    -------
    retransmits: commands sent again after a timeout (all commands, whole session).
    samples_sent, train_samples_sent: samples the device acknowledged (exactly once each).
    info: the HELLO response (None before HELLO).
    """

    def __init__(
        self,
        transport: _Transport,
        plan: Plan,
        *,
        timeout: float = 0.5,
        max_retries: int = 50,
        check_hash: bool = True,
    ) -> None:
        self.transport = transport
        self.plan = plan
        self.timeout = timeout
        self.max_retries = max_retries
        self.check_hash = check_hash
        self.params = LinkParams.from_plan(plan)
        self.info: DeviceInfo | None = None
        self._seq = 0
        self._decoder = FrameDecoder(
            1 + RESULT_BYTES * 255,
            accept=lambda t, n: self.params.response_length_ok(t, n, self._max_words),
        )
        self._max_words = 255
        self._frames: deque[Frame] = deque()
        self._stats = _Stats()
        self.samples_sent = 0
        self.train_samples_sent = 0
        self._accepted = 0  # engine's raw accepted counter (mod 2^32)
        self._read = 0  # engine's raw results_read counter

    @property
    def retransmits(self) -> int:
        """Commands sent again after a timeout."""
        return self._stats.retransmits

    # -- transactions
    def _transact(self, cmd: Cmd, payload: bytes = b"") -> bytes:
        """Send one command and return the payload of its response (retransmitting as needed)."""
        seq = self._seq
        wire = encode_frame(Frame(cmd, seq, payload))
        want = response_type(cmd)
        self._stats.commands += 1
        # a slow line (serial) adds the time to send the frame and receive the longest answer
        line = getattr(self.transport, "byte_time", 0.0) * (
            len(wire) + HEADER_BYTES + CRC_BYTES + self._response_bound(cmd, payload)
        )
        for attempt in range(self.max_retries + 1):
            if attempt:
                self._stats.retransmits += 1
            self.transport.write(wire)
            deadline = time.monotonic() + self.timeout + line
            while True:
                if not self._frames:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    data = self.transport.read(remaining)
                    if not data:
                        # like the device's receive timeout: a partial frame is dropped
                        self._decoder.reset()
                        break
                    self._frames.extend(self._decoder.feed(data))
                while self._frames:
                    fr = self._frames.popleft()
                    if fr.seq != seq:
                        continue  # a stale answer to an earlier retransmission
                    if fr.type == want:
                        self._seq = (seq + 1) & 0xFF
                        return fr.payload
                    if fr.type == NAK and len(fr.payload) == 2 and fr.payload[0] == cmd:
                        self._seq = (seq + 1) & 0xFF
                        raise NakError(cmd, fr.payload[1])
                    # a response of another type with our seq: a device bug or a stale session
        raise LinkError(
            f"no valid response to {cmd.name} (seq {seq}) after {self.max_retries} retransmissions"
        )

    def _response_bound(self, cmd: Cmd, payload: bytes) -> int:
        """Largest response payload to ``cmd`` (bytes)."""
        if cmd == Cmd.READ_RESULTS:
            return 1 + RESULT_BYTES * payload[0]
        if cmd == Cmd.READ_WEIGHTS:
            return 4 * payload[6]
        if cmd == Cmd.READ_COUNTERS:
            return 4 * self.params.num_counters
        return HELLO_BYTES

    def _ensure(self) -> None:
        if self.info is None:
            self.hello()

    def hello(self) -> DeviceInfo:
        """Identify the device. Raises PlanMismatchError if its plan hash or version differ."""
        info = DeviceInfo.from_payload(self._transact(Cmd.HELLO))
        if info.version != PROTOCOL_VERSION:
            raise PlanMismatchError(
                f"device speaks protocol version {info.version}, this host {PROTOCOL_VERSION}"
            )
        if self.check_hash and info.plan_hash != self.plan.hash:
            raise PlanMismatchError(
                f"device was built from plan {info.plan_hash}, the host has plan "
                f"{self.plan.hash}: rebuild the bitstream or load the matching plan"
            )
        if info.in_features != self.plan.in_features or info.x_bytes != self.params.x_bytes:
            raise PlanMismatchError(
                f"device takes {info.in_features} features of {info.x_bytes} bytes, the plan "
                f"{self.plan.in_features} of {self.params.x_bytes}"
            )
        self.info = info
        self._max_words = info.max_words
        self._accepted, self._read = info.accepted, info.results_read
        return info

    # -- samples and results
    def _outstanding(self) -> int:
        return (self._accepted - self._read) & 0xFFFFFFFF

    def read_results(self) -> list[Result]:
        """Read every result the device has buffered (in sample order)."""
        self._ensure()
        assert self.info is not None
        out: list[Result] = []
        while True:
            p = self._transact(Cmd.READ_RESULTS, bytes((min(255, self.info.result_depth),)))
            n = p[0] if p else 0
            if len(p) != 1 + RESULT_BYTES * n:
                raise LinkError(f"READ_RESULTS response of {len(p)} bytes for {n} results")
            for k in range(n):
                r = Result.from_bytes(p[1 + RESULT_BYTES * k : 1 + RESULT_BYTES * (k + 1)])
                if r.sample != self._read:
                    raise LinkError(f"result for sample {r.sample}, expected {self._read}")
                self._read = (self._read + 1) & 0xFFFFFFFF
                out.append(r)
            if n < min(255, self.info.result_depth):
                return out

    def send_samples(
        self, xq: np.ndarray, labels: Sequence[int], train: bool | Sequence[bool]
    ) -> list[Result]:
        """Send quantised samples ``xq`` [n, N]; return the results read while sending.

        Frames carry up to ``max_batch`` samples; results are read whenever the device's result
        buffer could otherwise overflow (no flush is ever forced).
        """
        self._ensure()
        assert self.info is not None
        n = len(xq)
        trains = [bool(train)] * n if isinstance(train, (bool, np.bool_)) else list(train)
        got: list[Result] = []
        i = 0
        while i < n:
            room = self.info.result_depth - self._outstanding()
            if room < min(self.info.max_batch, n - i):
                got += self.read_results()
                room = self.info.result_depth - self._outstanding()
            k = min(self.info.max_batch, n - i, room)
            if k <= 0:
                raise LinkError("the device's result buffer stays full (results not produced)")
            payload = b"".join(
                encode_record(self.params, xq[j], int(labels[j]), trains[j])
                for j in range(i, i + k)
            )
            try:
                p = self._transact(Cmd.SAMPLES, payload)
            except NakError as exc:
                if exc.reason != NakReason.FULL:
                    raise
                self._stats.naks_full += 1
                got += self.read_results()
                continue
            acc = int.from_bytes(p[:4], "little")
            if acc != (self._accepted + k) & 0xFFFFFFFF:
                raise LinkError(
                    f"device accepted-sample counter is {acc}, expected {self._accepted + k}: "
                    "a sample was lost or applied twice"
                )
            self._accepted = acc
            self.samples_sent += k
            self.train_samples_sent += sum(trains[i : i + k])
            i += k
        return got

    def _run(self, xs: Any, ys: Sequence[int] | None, train: bool) -> list[Result]:
        xq = quantise_inputs(xs, self.plan)
        labels = [0] * len(xq) if ys is None else [int(y) for y in ys]
        if len(labels) != len(xq):
            raise ValueError(f"{len(xq)} samples but {len(labels)} labels")
        self._ensure()
        first = self._accepted
        got = self.send_samples(xq, labels, train)
        self.flush()
        while self._outstanding():
            more = self.read_results()
            if not more:
                raise LinkError(f"{self._outstanding()} results missing after a flush")
            got += more
        mine = [r for r in got if ((r.sample - first) & 0xFFFFFFFF) < len(xq)]
        if len(mine) != len(xq):
            raise LinkError(f"{len(mine)} results for {len(xq)} samples")
        return mine

    def train(self, xs: Any, ys: Sequence[int]) -> list[Result]:
        """Train on samples ``xs`` [n, N] (floats, quantised here, or quantised ints) with labels
        ``ys``, one sample at a time in order, then flush (the golden model flushes at the end of
        ``train`` too). Returns the n results in sample order."""
        return self._run(xs, ys, True)

    def infer(self, xs: Any, ys: Sequence[int] | None = None) -> list[Result]:
        """Forward only (no update) for ``xs`` [n, N], then flush; returns the n results."""
        return self._run(xs, ys, False)

    def flush(self) -> None:
        """Run the pipeline empty (every in-flight sample's update applied)."""
        self._ensure()
        self._transact(Cmd.FLUSH)

    # -- counters
    def counters(self) -> Counters:
        """Read the counters (since the last :meth:`reset_counters`)."""
        self._ensure()
        p = self._transact(Cmd.READ_COUNTERS)
        if len(p) != 4 * self.params.num_counters:
            raise LinkError(f"READ_COUNTERS response of {len(p)} bytes")
        words = [int.from_bytes(p[4 * k : 4 * k + 4], "little") for k in range(len(p) // 4)]
        return Counters.from_words(words)

    def reset_counters(self) -> None:
        """Start every counter of :meth:`counters` from zero."""
        self._ensure()
        self._transact(Cmd.RESET_COUNTERS)

    # -- weights
    def _weight_chunks(self) -> Iterable[tuple[int, int, int, int, int]]:
        assert self.info is not None
        P = self.params
        for s in range(P.num_stages):
            for kind in range(P.stage_kinds[s]):
                for row in range(P.stage_rows[s]):
                    for col in range(0, P.stage_cols[s], self.info.max_words):
                        yield s, kind, row, col, min(self.info.max_words, P.stage_cols[s] - col)

    def read_weights(self) -> list[dict[str, np.ndarray]]:
        """Read every stage's memories: per stage ``{"w", "u"[, "w_prev"]}`` int64 arrays of
        shape [M, N+1] (bias column last), in the plan's fixed-point formats."""
        self._ensure()
        P = self.params
        out = [
            {
                KIND_NAMES[k]: np.zeros((P.stage_rows[s], P.stage_cols[s]), np.int64)
                for k in range(P.stage_kinds[s])
            }
            for s in range(P.num_stages)
        ]
        for s, kind, row, col, n in self._weight_chunks():
            p = self._transact(Cmd.READ_WEIGHTS, weight_header(s, kind, row, col, n))
            if len(p) != 4 * n:
                raise LinkError(f"READ_WEIGHTS response of {len(p)} bytes for {n} words")
            vals = [int.from_bytes(p[4 * k : 4 * k + 4], "little", signed=True) for k in range(n)]
            out[s][KIND_NAMES[kind]][row, col : col + n] = vals
        return out

    def write_weights(self, weights: Sequence[dict[str, Any]]) -> None:
        """Write memories given as :meth:`read_weights` returns them (missing kinds are skipped).

        Raises ValueError on a wrong stage count or array shape."""
        self._ensure()
        P = self.params
        if len(weights) != P.num_stages:
            raise ValueError(f"{len(weights)} stages given, the plan has {P.num_stages}")
        arrays: dict[tuple[int, int], np.ndarray] = {}
        for s, d in enumerate(weights):
            for k in range(P.stage_kinds[s]):
                if KIND_NAMES[k] not in d:
                    continue
                a = np.asarray(d[KIND_NAMES[k]], dtype=np.int64)
                if a.shape != (P.stage_rows[s], P.stage_cols[s]):
                    raise ValueError(
                        f"stage {s} {KIND_NAMES[k]} has shape {a.shape}, expected "
                        f"{(P.stage_rows[s], P.stage_cols[s])}"
                    )
                arrays[(s, k)] = a
        for s, kind, row, col, n in self._weight_chunks():
            a = arrays.get((s, kind))
            if a is None:
                continue
            data = b"".join(
                (int(v) & 0xFFFFFFFF).to_bytes(4, "little") for v in a[row, col : col + n]
            )
            self._transact(Cmd.WRITE_WEIGHTS, weight_header(s, kind, row, col, n) + data)


#: Names of the weight kinds (docs/ports.md ``wacc_cmd.kind``).
KIND_NAMES = ("w", "u", "w_prev")
