"""The host side of the link: :class:`LinkClient` and its errors.

:class:`LinkClient` speaks the protocol of :mod:`pipetrain.protocol.wire` (``docs/protocol.md``)
over a transport (:mod:`pipetrain.host.transport`): ``hello``, ``train``, ``infer``, weight
access, counters. It is the host half of the stop-and-wait ARQ: one command at a time,
retransmitted with the same sequence number until its response arrives.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..compiler.plan import Plan
from ..errors import UserError
from ..protocol.wire import (
    CRC_BYTES,
    HEADER_BYTES,
    HELLO_BYTES,
    KIND_NAMES,
    MAX_RUN_EPOCHS,
    NAK,
    PROTOCOL_VERSION,
    RESULT_BYTES,
    SESSION_BYTES,
    STORE_INDEX_BYTES,
    SUMMARY_BYTES,
    Cmd,
    Counters,
    DeviceInfo,
    EpochSummary,
    Frame,
    FrameDecoder,
    LinkParams,
    NakReason,
    Result,
    encode_frame,
    encode_record,
    response_type,
    run_payload,
    weight_header,
)

__all__ = [
    "LinkError",
    "PlanMismatchError",
    "DeviceResetError",
    "NakError",
    "OnChipError",
    "LinkClient",
    "quantise_inputs",
]


class LinkError(RuntimeError):
    """The link failed: no valid response after the retries, or a protocol violation."""


class PlanMismatchError(UserError, LinkError):
    """The device was built from another plan (or speaks another protocol version)."""


class DeviceResetError(UserError, LinkError):
    """After a reconnect the device's sample counters are not this session's: it was reset or
    re-flashed mid-run (or another host used it), so its state is not the run's."""


class NakError(LinkError):
    """The device refused a command (NAK); ``reason`` is a :class:`NakReason`."""

    def __init__(self, cmd: int, reason: int) -> None:
        self.cmd, self.reason = cmd, reason
        name = NakReason(reason).name if reason in NakReason._value2member_map_ else reason
        super().__init__(
            f"device refused {Cmd(cmd).name if cmd in Cmd._value2member_map_ else cmd}: {name}"
        )


class OnChipError(UserError, ValueError):
    """The on-chip training set cannot take this data: the device has none, or too few slots
    (the message names the sizes and the way out)."""


class _Transport(Protocol):
    def write(self, data: bytes) -> None: ...

    def read(self, timeout: float) -> bytes: ...

    def close(self) -> None: ...


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

    ``reconnect``: a function that opens a new transport to the same device; when the transport
    fails (``ConnectionError``/``OSError``, e.g. a dropped TCP connection or a USB-serial
    adapter that re-enumerated) the client opens a new one (at most ``max_reconnects`` times
    in a row) and sends the outstanding command again with the same sequence number, so the
    device's response cache keeps it exactly once (docs/protocol.md §3). Before its answer is
    used it checks with HELLO that the device still carries this session's tag
    (:meth:`start_session`) and that its raw ``accepted`` and ``results_read`` counters are
    this session's, and raises :class:`DeviceResetError` otherwise (the device was reset or
    re-flashed mid-run). Without ``reconnect`` the transport's error propagates.

    Members
    -------
    retransmits: commands sent again after a timeout or a reconnect (whole session).
    reconnects: transports opened again after the link failed.
    session: the tag :meth:`start_session` gave the device (None before).
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
        reconnect: Callable[[], _Transport] | None = None,
        max_reconnects: int = 5,
    ) -> None:
        self.transport = transport
        self._reconnect = reconnect
        self.max_reconnects = max_reconnects
        self.reconnects = 0
        self.session: int | None = None  # this session's tag on the device (start_session)
        self._recheck = False  # a reconnect happened: check the device before the next command
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
        failures = 0  # transport failures in a row
        for attempt in range(self.max_retries + 1):
            if attempt:
                self._stats.retransmits += 1
            try:
                self.transport.write(wire)
            except OSError as exc:  # ConnectionError included
                failures = self._link_failed(exc, failures)
                continue
            deadline = time.monotonic() + self.timeout + line
            while True:
                if not self._frames:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    try:
                        data = self.transport.read(remaining)
                    except OSError as exc:
                        failures = self._link_failed(exc, failures)
                        break
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
                        if self._recheck and cmd != Cmd.HELLO:
                            self._after_reconnect(cmd, payload, fr.payload)
                        return fr.payload
                    if fr.type == NAK and len(fr.payload) == 2 and fr.payload[0] == cmd:
                        self._seq = (seq + 1) & 0xFF
                        raise NakError(cmd, fr.payload[1])
                    # a response of another type with our seq: a device bug or a stale session
        raise LinkError(
            f"no valid response to {cmd.name} (seq {seq}) after {self.max_retries} retransmissions"
        )

    def _link_failed(self, exc: OSError, failures: int) -> int:
        """The transport failed: open a new one (``reconnect``) or re-raise ``exc``. Returns the
        failures in a row; raises :class:`LinkError` after ``max_reconnects`` of them."""
        if self._reconnect is None:
            raise exc
        if failures >= self.max_reconnects:
            raise LinkError(f"the link failed {failures} times in a row ({exc})") from exc
        try:
            self.transport.close()
        except OSError:
            pass
        try:
            self.transport = self._reconnect()
        except (OSError, UserError) as exc2:  # TransportError is a UserError
            raise LinkError(f"the link failed ({exc}) and cannot be reopened: {exc2}") from exc2
        self._decoder.reset()
        self._frames.clear()
        self.reconnects += 1
        self._recheck = True
        return failures + 1

    def _after_reconnect(self, cmd: Cmd, payload: bytes, response: bytes) -> None:
        """The command sent again after a reconnect was answered: check the device before its
        answer is used (the host's books as they will be after this command)."""
        self._recheck = False
        accepted, read = self._accepted, self._read
        if cmd == Cmd.SAMPLES:
            accepted += len(payload) // self.params.record_bytes
        elif cmd == Cmd.READ_RESULTS and response:
            read += response[0]
        elif cmd == Cmd.RUN and response:  # NAKs raise before: the run happened
            n = int.from_bytes(payload[0:2], "little") * (payload[2] & 0x7F)
            accepted, read = accepted + n, read + (0 if payload[2] & 0x80 else n)
        self._check_session(accepted, read & 0xFFFFFFFF)

    def start_session(self, tag: int | None = None) -> int:
        """Tag the device with this session (SESSION; ``tag``: u32, default a random non-zero
        one) and return the tag. HELLO reports it until the device is reset (tag 0) or
        another host sets its own, so a reconnect can tell (docs/protocol.md §3)."""
        self._ensure()
        tag = (secrets.randbits(32) or 1) if tag is None else tag & 0xFFFFFFFF
        self._transact(Cmd.SESSION, tag.to_bytes(SESSION_BYTES, "little"))
        self.session = tag
        return tag

    def _check_session(self, accepted: int, results_read: int) -> None:
        """HELLO, and raise :class:`DeviceResetError` unless the device still carries this
        session's tag (:meth:`start_session`) and its raw counters are ``accepted`` and
        ``results_read`` (the host's books after a reconnect). The books are left as they were
        (the caller moves them on)."""
        books = self._accepted, self._read
        info = self.hello()
        self._accepted, self._read = books
        if self.session is not None and info.session != self.session:
            what = (
                "it was reset or re-flashed mid-run (tag 0)"
                if info.session == 0
                else f"another host tagged it with session {info.session:08x}"
            )
            raise DeviceResetError(
                f"after reconnecting, the device does not carry this session's tag "
                f"{self.session:08x}: {what}, so its state is not the run's; resume from a "
                "checkpoint (pipetrain train --resume FILE)"
            )
        if (info.accepted, info.results_read) != (accepted & 0xFFFFFFFF, results_read):
            raise DeviceResetError(
                f"after reconnecting, the device reports accepted={info.accepted}, "
                f"results_read={info.results_read}, this session expects {accepted}, "
                f"{results_read}: the device was reset or re-flashed mid-run (or another host "
                "used it) and its state is not the run's; resume from a checkpoint "
                "(pipetrain train --resume FILE)"
            )

    def _response_bound(self, cmd: Cmd, payload: bytes) -> int:
        """Largest response payload to ``cmd`` (bytes)."""
        if cmd == Cmd.READ_RESULTS:
            return 1 + RESULT_BYTES * payload[0]
        if cmd == Cmd.READ_WEIGHTS:
            return 4 * payload[6]
        if cmd == Cmd.READ_COUNTERS:
            return 4 * self.params.num_counters
        if cmd == Cmd.RUN:
            return 4 + SUMMARY_BYTES * (payload[2] & 0x7F)
        return HELLO_BYTES

    def _ensure(self) -> None:
        if self.info is None:
            self.hello()

    def hello(self) -> DeviceInfo:
        """Identify the device. Raises PlanMismatchError if its plan hash or version differ."""
        try:
            info = DeviceInfo.from_payload(self._transact(Cmd.HELLO))
        except ValueError as exc:
            raise LinkError(str(exc)) from exc
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

    # -- the on-chip training set (docs/protocol.md §2)
    def check_onchip(self, samples: int) -> None:
        """Raise :class:`OnChipError` unless the device's on-chip set holds ``samples`` slots."""
        self._ensure()
        assert self.info is not None
        cap = self.info.onchip_samples
        if cap == 0:
            raise OnChipError(
                "the device was built without an on-chip training set: rebuild it with one "
                "(pipetrain build --on-chip-data N) or train without --on-chip-data"
            )
        if samples > cap:
            raise OnChipError(
                f"the training set has {samples} samples, the device's on-chip set holds {cap}: "
                "use at most that many, a device built with a larger set, or train without "
                "--on-chip-data"
            )

    def store(self, xq: np.ndarray, labels: Sequence[int], first: int = 0) -> None:
        """Upload quantised samples ``xq`` [n, N] with ``labels`` into slots ``first ..
        first+n−1`` of the on-chip set (STORE frames of ``max_batch`` records). Raises
        :class:`OnChipError` when they do not fit."""
        self.check_onchip(first + len(xq))
        assert self.info is not None
        for i in range(0, len(xq), self.info.max_batch):
            recs = b"".join(
                encode_record(self.params, xq[j], int(labels[j]), True)
                for j in range(i, min(len(xq), i + self.info.max_batch))
            )
            self._transact(Cmd.STORE, (first + i).to_bytes(STORE_INDEX_BYTES, "little") + recs)

    def run(
        self,
        count: int,
        epochs: int,
        start: int,
        mask: int,
        seconds: float = 0.0,
        records: bool = False,
    ) -> tuple[list[EpochSummary], int]:
        """RUN: train ``epochs`` (1..32) epochs over slots ``0..count−1`` in the device's
        permutation (``start``, ``mask``: :func:`pipetrain.protocol.onchip.run_seeds`), ending
        with a flush. ``seconds``: how long the run may take on the device (added to the
        timeout). ``records``: keep the per-sample records (one epoch, ``count`` ≤ the device's
        result_depth), read them with :meth:`read_results` after. Returns the epoch summaries
        and the device's cycle count of the run; the host's sample books move on by
        ``epochs·count`` like the device's."""
        self._ensure()
        if not 1 <= epochs <= MAX_RUN_EPOCHS:
            raise ValueError(f"epochs per RUN must be 1..{MAX_RUN_EPOCHS}, got {epochs}")
        saved = self.timeout
        self.timeout = saved + seconds
        try:
            p = self._transact(Cmd.RUN, run_payload(count, epochs, start, mask, records))
        finally:
            self.timeout = saved
        if len(p) != 4 + SUMMARY_BYTES * epochs:
            raise LinkError(f"RUN response of {len(p)} bytes for {epochs} epochs")
        sums = [
            EpochSummary.from_bytes(p[SUMMARY_BYTES * e : SUMMARY_BYTES * (e + 1)])
            for e in range(epochs)
        ]
        n = count * epochs
        self._accepted = (self._accepted + n) & 0xFFFFFFFF
        if not records:  # the records are read with READ_RESULTS
            self._read = (self._read + n) & 0xFFFFFFFF
        self.samples_sent += n
        self.train_samples_sent += n
        return sums, int.from_bytes(p[-4:], "little")

    # -- counters
    def counters(self) -> Counters:
        """Read the counters (since the last :meth:`reset_counters`)."""
        self._ensure()
        p = self._transact(Cmd.READ_COUNTERS)
        if len(p) != 4 * self.params.num_counters:
            raise LinkError(f"READ_COUNTERS response of {len(p)} bytes")
        words = [int.from_bytes(p[4 * k : 4 * k + 4], "little") for k in range(len(p) // 4)]
        return Counters.from_words(words, self.params.heads)

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
