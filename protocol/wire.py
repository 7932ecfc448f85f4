"""The host link protocol's wire format: constants, frames, CRC, link sizes and payload codecs.

The wire format is specified in ``docs/protocol.md``; this module is its executable form and the
single source of its constants (the RTL engine :mod:`pipetrain.hdl.link`, the device model
:mod:`pipetrain.protocol.device_model` and the host client :mod:`pipetrain.host.client` import
them).

* Frame: ``A5 5A | type | seq | len (u16 LE) | payload[len] | CRC-32 (u32 LE)``; the CRC is
  CRC-32/ISO-HDLC (zlib's ``crc32``: poly 0x04C11DB7 reflected, init and xorout 0xFFFFFFFF,
  check value ``crc32(b"123456789") = 0xCBF43926``) over ``type … payload``.
* Reliability (stop-and-wait ARQ, *derived*: the classic alternating-sequence protocol with an
  8-bit sequence number): the host sends one command at a time and retransmits it, with the same
  sequence number, until a response with that number arrives; the device executes a command only
  if its sequence number differs from the last one it executed and otherwise re-sends the cached
  response, so every command — in particular every training sample — is applied exactly once.
* :class:`LinkParams` holds the link sizes of one plan and engine configuration; the payload
  codecs (:func:`encode_record`, :func:`weight_header`, :class:`Result`, :class:`Counters`,
  :class:`DeviceInfo`) are shared by both sides.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from ..compiler.enums import unknown
from ..compiler.plan import Plan

__all__ = [
    "SYNC",
    "PROTOCOL_VERSION",
    "HEADER_BYTES",
    "CRC_BYTES",
    "NAK",
    "CRC_POLY_REFLECTED",
    "RESULT_BYTES",
    "WEIGHT_HEADER_BYTES",
    "HELLO_BYTES",
    "SESSION_BYTES",
    "ENGINE_COUNTERS",
    "KIND_NAMES",
    "KIND_CODES",
    "Cmd",
    "NakReason",
    "response_type",
    "crc32",
    "Frame",
    "encode_frame",
    "FrameDecoder",
    "LinkParams",
    "encode_record",
    "decode_features",
    "MAX_INPUT_BITS",
    "MAX_RUN_EPOCHS",
    "SUMMARY_BYTES",
    "RUN_ARG_BYTES",
    "RUN_RECORDS",
    "STORE_INDEX_BYTES",
    "EpochSummary",
    "run_payload",
    "weight_header",
    "Result",
    "loss_value",
    "Counters",
    "DeviceInfo",
]

#: Two-byte sync marker that starts every frame.
SYNC = b"\xa5\x5a"
#: Protocol version reported by HELLO; the client refuses another one (2: HELLO reports the
#: session tag that SESSION sets; 3: sample features bit-packed at the plan's input width X,
#: the on-chip training set commands STORE and RUN, HELLO reports its capacity).
PROTOCOL_VERSION = 3
#: Bytes before the payload: sync (2), type, seq, len (2).
HEADER_BYTES = 6
#: Bytes after the payload: CRC-32, little endian.
CRC_BYTES = 4
#: Response type of a negative acknowledgement (payload: command type, reason).
NAK = 0xFF
#: CRC-32 polynomial, reflected form (the shift-right form of zlib's CRC-32; the RTL uses
#: ``amaranth.lib.crc.catalog.CRC32_ISO_HDLC``, the same CRC).
CRC_POLY_REFLECTED = 0xEDB88320
#: Bytes of one result in a READ_RESULTS response: sample u32, pred u16, loss u32, train u8.
RESULT_BYTES = 11
#: Bytes of the fixed header of READ_WEIGHTS / WRITE_WEIGHTS: stage, kind, row, col, count.
WEIGHT_HEADER_BYTES = 7
#: Bytes of a HELLO response: session tag (4), hash (8), 12 bytes of sizes, two counters (8).
HELLO_BYTES = 32
#: Widest input feature the link packs (bits): the RTL unpacks a feature from its 32-bit window
#: of the last four payload bytes, which holds X + 7 bits (docs/protocol.md §2).
MAX_INPUT_BITS = 25
#: Epochs one RUN command trains (its response holds one summary per epoch).
MAX_RUN_EPOCHS = 32
#: Bytes of one epoch summary in a RUN response: loss sum u64, correct u32.
SUMMARY_BYTES = 12
#: Bytes of a RUN command: count u16, epochs u8 (bit 7: records), start u16, mask u16.
RUN_ARG_BYTES = 7
#: Bit of RUN's ``epochs`` byte asking for the per-sample records (then 1 epoch, count ≤
#: result_depth: the records wait in the result buffer for READ_RESULTS).
RUN_RECORDS = 0x80
#: Bytes before the records of a STORE command: the first slot, u16.
STORE_INDEX_BYTES = 2
#: Bytes of the session tag (SESSION payload, first field of HELLO).
SESSION_BYTES = 4
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
#: Names of the weight kinds (docs/ports.md ``wacc_cmd.kind``): a kind's code is its index.
KIND_NAMES = ("w", "u", "w_prev")
#: Code of each weight kind by name (``wacc_cmd.kind``, the ``kind`` byte of READ_WEIGHTS /
#: WRITE_WEIGHTS): the inverse of :data:`KIND_NAMES`.
KIND_CODES: dict[str, int] = {name: code for code, name in enumerate(KIND_NAMES)}


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
    SESSION = 0x09
    #: on-chip training set (bit 4 set; STORE shares SAMPLES' low bits, 0b0010, and its
    #: record parser in the RTL)
    STORE = 0x12
    RUN = 0x13


class NakReason(IntEnum):
    """Reason byte of a NAK response. A NAKed command was not applied."""

    FULL = 1  #: SAMPLES would exceed the result buffer; read results first.
    BAD_ARG = 2  #: an argument is out of range (stage, kind, row, col, count).
    BUSY = 3  #: RUN with results still unread (read them first: the run's results are its own).


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
    x_bytes: B = ⌈X/8⌉, bytes of one feature as a weight-free integer (HELLO reports it; the
        wire packs features at X bits, ``feature_bytes``).
    feature_bytes: F = ⌈N·X/8⌉, the packed features of one record (bits LSB first).
    num_stages: S, stages in the plan (weight-access ``stage`` is 0..S−1).
    classes: outputs of the loss unit.
    stage_rows: M of every stage; ``stage_cols``: N+1 (bias column last) — a convolution
        stage's weight matrix: C_out rows, T + 1 columns (``Stage.rows`` / ``Stage.cols``,
        docs/numerics.md §9).
    stage_kinds: weight kinds served per stage (2 = w, u; 3 = also w_prev for LWP ``w`` form).
    max_batch: samples per SAMPLES frame (1..255).
    max_words: weights per READ/WRITE_WEIGHTS frame (1..255).
    result_depth: results the device buffers (≥ S + max_batch, so no forced flush).
    max_results: results per READ_RESULTS response (≤ 255).
    record_bytes: R = 3 + F, one sample record.
    rx_max, tx_max: largest command / response payload.
    num_counters: 32-bit words of a READ_COUNTERS response: :attr:`network_counters` + 7.
    heads: auxiliary heads of the plan (K − 1; 0 for ``global``): their loss units add
        saturation counters and each head a ``head_correct`` counter (docs/protocol.md §4).
    onchip_samples: capacity of the on-chip training set (samples; 0: the engine has none and
        refuses STORE and RUN as bad headers).
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
    heads: int = 0
    feature_bytes: int = 0
    onchip_samples: int = 0

    @classmethod
    def from_plan(
        cls,
        plan: Plan,
        max_batch: int | None = None,
        max_words: int = 32,
        result_depth: int | None = None,
        onchip_samples: int = 0,
    ) -> LinkParams:
        """Derive the link sizes from ``plan`` (``onchip_samples``: the on-chip set's capacity,
        0..65535 samples).

        Defaults: ``max_batch`` = ⌊1024 / R⌋ clamped to 1..8 (a command buffer of ≤ ~1 KiB);
        ``result_depth`` = the next power of two ≥ max(16, S + 2·max_batch); with an on-chip
        set max(16, S + 2·max_batch, min(onchip_samples, 4096)) — an epoch's records, no
        more (each 11 bytes of block RAM, ``ResultBuffer(packed=True)``). Raises ValueError
        when a value is out of range or ``result_depth < S + max_batch`` (the host could then
        be forced to flush, which would change the training schedule), or the input format is
        wider than :data:`MAX_INPUT_BITS`.
        """
        stages = plan.stages
        S = len(stages)
        X = stages[0].formats.x.bits
        B = _ceil_div(X, 8)
        N = plan.in_features
        if X > MAX_INPUT_BITS:
            raise ValueError(
                f"the link packs inputs of ≤ {MAX_INPUT_BITS} bits, the plan's are {X}"
            )
        if not 0 <= onchip_samples <= 0xFFFF:
            raise ValueError(f"onchip_samples={onchip_samples} must be in 0..65535")
        F = _ceil_div(N * X, 8)
        R = 3 + F
        if max_batch is None:
            max_batch = max(1, min(8, 1024 // R))
        if result_depth is None:
            want = S + 2 * max_batch
            if onchip_samples:  # room for one epoch's records (≤ 4096), exactly: the buffer
                # is packed (hdl/link_results.py), its block RAMs follow the depth
                result_depth = max(16, want, min(onchip_samples, 4096))
            else:
                result_depth = 1 << max(4, math.ceil(math.log2(want)))
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
        heads = len(getattr(plan, "head_losses", ()))
        num_counters = 2 + S + 1 + 2 * heads + len(ENGINE_COUNTERS)
        return cls(
            plan_hash=bytes.fromhex(plan.hash),
            in_features=N,
            x_bits=X,
            x_bytes=B,
            num_stages=S,
            classes=plan.loss.classes,
            stage_rows=tuple(s.rows for s in stages),
            stage_cols=tuple(s.cols + 1 for s in stages),
            stage_kinds=kinds,
            max_batch=max_batch,
            max_words=max_words,
            result_depth=result_depth,
            max_results=max_results,
            record_bytes=R,
            rx_max=max(
                max_batch * R + (STORE_INDEX_BYTES if onchip_samples else 0),
                WEIGHT_HEADER_BYTES + 4 * max_words,
            ),
            tx_max=max(
                HELLO_BYTES,
                1 + RESULT_BYTES * max_results,
                4 * max_words,
                4 * num_counters,
                (SUMMARY_BYTES * MAX_RUN_EPOCHS + 4) if onchip_samples else 0,
            ),
            num_counters=num_counters,
            heads=heads,
            feature_bytes=F,
            onchip_samples=onchip_samples,
        )

    @property
    def network_counters(self) -> int:
        """The network's words of a READ_COUNTERS response: ``samples_trained``, ``ticks``, the
        saturation counters (S + 1 + heads: every stage, then every loss unit) and the heads'
        ``head_correct`` counters."""
        return 2 + self.num_stages + 1 + 2 * self.heads

    def command_length_ok(self, cmd: int, length: int) -> bool:
        """Whether a command header with this type and payload length is well formed."""
        if cmd in (Cmd.HELLO, Cmd.FLUSH, Cmd.READ_COUNTERS, Cmd.RESET_COUNTERS):
            return length == 0
        if cmd == Cmd.READ_RESULTS:
            return length == 1
        if cmd == Cmd.SESSION:
            return length == SESSION_BYTES
        if cmd == Cmd.READ_WEIGHTS:
            return length == WEIGHT_HEADER_BYTES
        if cmd == Cmd.WRITE_WEIGHTS:
            n = length - WEIGHT_HEADER_BYTES
            return 4 <= n <= 4 * self.max_words and n % 4 == 0
        if cmd == Cmd.SAMPLES:
            return length % self.record_bytes == 0 and 1 <= length // self.record_bytes <= (
                self.max_batch
            )
        if self.onchip_samples and cmd == Cmd.STORE:
            return self.command_length_ok(Cmd.SAMPLES, length - STORE_INDEX_BYTES)
        if self.onchip_samples and cmd == Cmd.RUN:
            return length == RUN_ARG_BYTES
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
        if cmd in (Cmd.FLUSH, Cmd.RESET_COUNTERS, Cmd.WRITE_WEIGHTS, Cmd.SESSION, Cmd.STORE):
            return length == 0
        if cmd == Cmd.RUN:
            return length % SUMMARY_BYTES == 4 and length <= 4 + SUMMARY_BYTES * MAX_RUN_EPOCHS
        if cmd == Cmd.READ_COUNTERS:
            return length == 4 * self.num_counters
        if cmd == Cmd.READ_WEIGHTS:
            return length % 4 == 0 and 4 <= length <= 4 * max_words
        return False

    def hello_payload(self, accepted: int, results_read: int, session: int = 0) -> bytes:
        """The HELLO response: session tag, hash, version, sizes, then the raw sample counters."""
        return (
            (session & 0xFFFFFFFF).to_bytes(SESSION_BYTES, "little")
            + self.plan_hash
            + bytes((PROTOCOL_VERSION, self.max_batch, self.max_words, self.num_stages))
            + self.result_depth.to_bytes(2, "little")
            + self.in_features.to_bytes(2, "little")
            + bytes((self.x_bits, self.x_bytes))
            + self.onchip_samples.to_bytes(2, "little")
            + (accepted & 0xFFFFFFFF).to_bytes(4, "little")
            + (results_read & 0xFFFFFFFF).to_bytes(4, "little")
        )


def encode_record(params: LinkParams, x: Sequence[int], label: int, train: bool) -> bytes:
    """One sample record (R bytes): label u16 LE, flags (bit 0 = train), then the N features
    bit-packed at X bits each, two's complement, LSB first: feature i is bits i·X … i·X + X − 1
    of the little-endian integer of the F = ⌈N·X/8⌉ feature bytes (the padding bits are 0)."""
    X = params.x_bits
    mask = (1 << X) - 1
    packed = 0
    for i, v in enumerate(x):
        packed |= (int(v) & mask) << (i * X)
    out = bytearray(int(label).to_bytes(2, "little"))
    out.append(1 if train else 0)
    out += packed.to_bytes(params.feature_bytes, "little")
    return bytes(out)


def decode_features(params: LinkParams, packed: bytes) -> list[int]:
    """The N signed X-bit features of a record's F packed feature bytes (:func:`encode_record`)."""
    X = params.x_bits
    v = int.from_bytes(packed, "little")
    out = []
    for i in range(params.in_features):
        f = (v >> (i * X)) & ((1 << X) - 1)
        out.append(f - (1 << X) if f >> (X - 1) else f)
    return out


def run_payload(count: int, epochs: int, start: int, mask: int, records: bool = False) -> bytes:
    """The RUN command's 7 bytes: ``count`` u16 (samples of the on-chip set, slots 0..count−1),
    ``epochs`` u8 (1..:data:`MAX_RUN_EPOCHS`; :data:`RUN_RECORDS` added with ``records``), the
    permutation's ``start`` state and epoch ``mask`` (u16 each; :mod:`pipetrain.protocol.
    onchip`)."""
    return (
        count.to_bytes(2, "little")
        + bytes((epochs | (RUN_RECORDS if records else 0),))
        + start.to_bytes(2, "little")
        + mask.to_bytes(2, "little")
    )


@dataclass(frozen=True)
class EpochSummary:
    """One epoch of a RUN (docs/protocol.md §2): ``loss_sum`` = Σ of the results' raw ``loss``
    field (CE: p_y with ``recip_frac`` fraction bits; MSE: Σ(z−t)²) over the epoch's samples,
    ``correct`` = samples whose prediction equals their label."""

    loss_sum: int
    correct: int

    def to_bytes(self) -> bytes:
        """The 12 wire bytes."""
        return (self.loss_sum & (2**64 - 1)).to_bytes(8, "little") + (
            self.correct & 0xFFFFFFFF
        ).to_bytes(4, "little")

    @classmethod
    def from_bytes(cls, b: bytes) -> EpochSummary:
        """Parse 12 wire bytes."""
        return cls(int.from_bytes(b[0:8], "little"), int.from_bytes(b[8:12], "little"))


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
    if lu.kind == "mse":
        return result.loss / 2.0 ** (2 * lu.z.frac) / lu.classes
    unknown(lu.kind, "loss")


@dataclass(frozen=True)
class Counters:
    """READ_COUNTERS: every value counts since the last RESET_COUNTERS (mod 2^32).

    Members
    -------
    samples_trained: training samples whose last update the network applied.
    ticks: network ticks (bubble ticks included).
    saturations: per-stage saturation counters (all S stages, main then heads), then the loss
        units' (the true loss, then the heads'): S + 1 + heads values.
    accepted: samples the engine handed to the network.
    results_read: results the host has read.
    frames_ok: frames received with a good CRC (duplicates included).
    bad_crc: frames dropped for a CRC mismatch.
    bad_header: headers dropped for a type/length that no command has.
    rx_timeouts: frames dropped because the bytes stopped mid-frame.
    duplicates: retransmitted frames answered from the response cache (not re-applied).
    head_correct: per auxiliary head, samples whose head prediction equals their label (empty
        for ``global``; sent after the saturation counters).
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
    head_correct: tuple[int, ...] = ()

    @classmethod
    def from_words(cls, words: Sequence[int], heads: int = 0) -> Counters:
        """Build from the words of a READ_COUNTERS response (``heads``:
        :attr:`LinkParams.heads`)."""
        n_net = len(words) - len(ENGINE_COUNTERS)
        n_sat = n_net - 2 - heads
        eng = words[n_net:]
        return cls(
            words[0], words[1], tuple(words[2 : 2 + n_sat]), *eng, tuple(words[2 + n_sat : n_net])
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class DeviceInfo:
    """HELLO response.

    Members
    -------
    session: the tag the last SESSION command set (0 after reset or power-up).
    plan_hash: hex string (16 digits) of the plan the design was built from.
    version: protocol version.
    max_batch, max_words, num_stages, result_depth, in_features, x_bits, x_bytes: link sizes.
    onchip_samples: capacity of the on-chip training set (0: none).
    accepted, results_read: raw (never reset) sample counters of the engine.
    """

    session: int
    plan_hash: str
    version: int
    max_batch: int
    max_words: int
    num_stages: int
    result_depth: int
    in_features: int
    x_bits: int
    x_bytes: int
    onchip_samples: int
    accepted: int
    results_read: int

    @classmethod
    def from_payload(cls, p: bytes) -> DeviceInfo:
        """Parse a HELLO response payload. Raises ValueError on a wrong length."""
        if len(p) != HELLO_BYTES:
            raise ValueError(f"HELLO response has {len(p)} bytes, expected {HELLO_BYTES}")
        q = p[SESSION_BYTES:]
        return cls(
            session=int.from_bytes(p[:SESSION_BYTES], "little"),
            plan_hash=q[0:8].hex(),
            version=q[8],
            max_batch=q[9],
            max_words=q[10],
            num_stages=q[11],
            result_depth=int.from_bytes(q[12:14], "little"),
            in_features=int.from_bytes(q[14:16], "little"),
            x_bits=q[16],
            x_bytes=q[17],
            onchip_samples=int.from_bytes(q[18:20], "little"),
            accepted=int.from_bytes(q[20:24], "little"),
            results_read=int.from_bytes(q[24:28], "little"),
        )
