"""``LinkReceiver``: the receive framer of the link engine (docs/protocol.md §1, §3).

Hunts for ``A5 5A`` (``A5 A5 5A`` also syncs), reads type, seq and length, drops the header at
once if no command has that type and length, writes the payload into the command buffer (a
``lib.memory`` of ``rx_max`` bytes, one EBR on the iCE40) and compares the CRC a byte at a time.
Each frame, good or not, ends in one beat on ``frame`` with its :class:`FrameStatus`; while
that beat waits (until the dispatcher has executed the command and sent the response) the
receiver takes no byte, and ``args`` reads the payload back out of the command buffer through a
one-beat output register (the buffer's output drives no logic: docs/boards.md §4.1).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

from amaranth import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..protocol.wire import (
    RUN_ARG_BYTES,
    SESSION_BYTES,
    STORE_INDEX_BYTES,
    SYNC,
    WEIGHT_HEADER_BYTES,
    Cmd,
    LinkParams,
)
from .link_crc import crc_port_signature
from .link_ports import FrameStatus, byte_layout, frame_layout

__all__ = ["LinkReceiver"]


class LinkReceiver(wiring.Component):
    """Receive framer: host bytes in, one ``frame`` beat per frame out (docs/protocol.md §3).

    Parameters
    ----------
    params: link sizes (command lengths, ``rx_max``).
    rx_timeout: cycles without a byte inside a frame before it ends as TIMEOUT (0 = never).

    Raises
    ------
    ValueError: ``rx_timeout`` is negative.

    Members
    -------
    rx: ``In(stream.Signature(8))`` bytes from the host; taken one per cycle while receiving,
        not at all while ``frame`` waits.
    frame: ``Out(stream.Signature(frame_layout(params)))`` held request: one beat per frame,
        offered from the cycle after its last byte (after the header for BAD_HEADER, after
        ``rx_timeout`` idle cycles for TIMEOUT) until taken; the receiver resumes hunting after.
    args: ``Out(stream.Signature(byte_layout()))`` the payload of an OK frame from the command
        buffer, ``length`` beats (``last`` on the final one), while ``frame`` is offered (the
        first from the frame's second cycle; registered, a beat per cycle).
    crc: ``Out(crc_port_signature())`` port on the shared CRC (zero while not receiving).
    busy: ``Out(1)`` inside a frame (low only while hunting for ``A5``).
    """

    def __init__(self, params: LinkParams, rx_timeout: int) -> None:
        if rx_timeout < 0:
            raise ValueError(f"rx_timeout must be ≥ 0 cycles, got {rx_timeout}")
        self.params = params
        self.rx_timeout = rx_timeout
        super().__init__(
            {
                "rx": In(stream.Signature(8)),
                "frame": Out(stream.Signature(frame_layout(params))),
                "args": Out(stream.Signature(byte_layout())),
                "crc": Out(crc_port_signature()),
                "busy": Out(1),
            }
        )

    def header_check(self, m: Module, typ: Signal, length: Signal) -> tuple[Signal, Signal]:
        """``(ok, records)``: whether a command has this type and payload length
        (``LinkParams.command_length_ok``), and the SAMPLES record count (0 otherwise)."""
        P = self.params
        ok = Signal()
        records = Signal(range(P.max_batch + 1))
        with m.Switch(typ):
            with m.Case(Cmd.HELLO, Cmd.FLUSH, Cmd.READ_COUNTERS, Cmd.RESET_COUNTERS):
                m.d.comb += ok.eq(length == 0)
            with m.Case(Cmd.READ_RESULTS):
                m.d.comb += ok.eq(length == 1)
            with m.Case(Cmd.SESSION):
                m.d.comb += ok.eq(length == SESSION_BYTES)
            with m.Case(Cmd.READ_WEIGHTS):
                m.d.comb += ok.eq(length == WEIGHT_HEADER_BYTES)
            with m.Case(Cmd.WRITE_WEIGHTS):
                m.d.comb += ok.eq(
                    (length >= WEIGHT_HEADER_BYTES + 4)
                    & (length <= WEIGHT_HEADER_BYTES + 4 * P.max_words)
                    & (length[0:2] == (WEIGHT_HEADER_BYTES % 4))
                )
            with m.Case(Cmd.SAMPLES):
                for k in range(1, P.max_batch + 1):
                    with m.If(length == k * P.record_bytes):
                        m.d.comb += [ok.eq(1), records.eq(k)]
            if P.onchip_samples:  # the on-chip set's commands (docs/protocol.md §2)
                with m.Case(Cmd.STORE):
                    for k in range(1, P.max_batch + 1):
                        with m.If(length == STORE_INDEX_BYTES + k * P.record_bytes):
                            m.d.comb += [ok.eq(1), records.eq(k)]
                with m.Case(Cmd.RUN):
                    m.d.comb += ok.eq(length == RUN_ARG_BYTES)
        return ok, records

    def _idle_timeout(self, m: Module, counting: Signal) -> Signal:
        """A signal high in the ``rx_timeout``-th consecutive cycle of ``counting`` (never if the
        timeout is off)."""
        hit = Signal()
        if self.rx_timeout:
            idle = Signal(range(self.rx_timeout))  # cycles without a byte, inside a frame
            with m.If(counting):
                m.d.sync += idle.eq(idle + 1)
            with m.Else():
                m.d.sync += idle.eq(0)
            m.d.comb += hit.eq(idle == self.rx_timeout - 1)
        return hit

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        P = self.params
        rx, crc, f, args = self.rx, self.crc, self.frame.payload, self.args

        # command buffer; the read port shows buf[ptr] (its address is the next pointer)
        m.submodules.buf = buf = Memory(shape=8, depth=P.rx_max, init=[])
        wr, rd = buf.write_port(), buf.read_port()
        ptr = Signal(range(P.rx_max + 1))
        ptr_next = Signal.like(ptr)
        m.d.comb += [ptr_next.eq(ptr), rd.addr.eq(ptr_next)]
        m.d.sync += ptr.eq(ptr_next)
        at_end = ptr + 1 == f.length  # the byte at `ptr` is the payload's last

        bi = Signal(2)  # header / CRC byte; 0 outside a frame (the shared CRC port's rule)
        bad = Signal()  # a CRC byte differed
        drained = Signal()  # every payload byte was read out of the buffer (or there is none)
        # `args`'s output register: the block RAM's output goes straight into it (timing: an
        # ECP5 DP16KD's data comes 5.8 ns after the clock, docs/boards.md §4.1)
        q_valid, q_data, q_last = Signal(), Signal(8), Signal()
        hdr_len = Cat(f.length[0:8], rx.payload)  # the length while its high byte arrives
        hdr_ok, hdr_records = self.header_check(m, f.type, hdr_len)
        m.d.comb += [crc.data.eq(rx.payload), crc.index.eq(bi)]
        in_frame = Signal()
        timeout = self._idle_timeout(m, in_frame & ~rx.valid)

        def end(status: FrameStatus) -> None:
            m.d.sync += f.status.eq(status)
            m.next = "FRAME"

        @contextmanager
        def receiving(fold: bool = True):
            """A receiving state: the body runs for a byte offered, else the timeout counts."""
            m.d.comb += [rx.ready.eq(1), in_frame.eq(1)]
            with m.If(rx.valid):
                m.d.comb += crc.valid.eq(fold)
                yield
            with m.Elif(timeout):
                m.d.sync += bi.eq(0)
                end(FrameStatus.TIMEOUT)

        with m.FSM(name="rx") as fsm:
            with m.State("HUNT"):
                m.d.comb += rx.ready.eq(1)
                with m.If(rx.valid & (rx.payload == SYNC[0])):
                    m.next = "SYNC1"

            with m.State("SYNC1"), receiving(fold=False):
                with m.If(rx.payload == SYNC[1]):
                    m.d.comb += crc.start.eq(1)
                    m.next = "HEADER"
                with m.Elif(rx.payload != SYNC[0]):
                    m.next = "HUNT"

            with m.State("HEADER"), receiving():  # type, seq, length (LE): byte `bi`
                m.d.sync += bi.eq(bi + 1)
                with m.Switch(bi):
                    for i, field in enumerate((f.type, f.seq, f.length)):
                        with m.Case(i):
                            m.d.sync += field.eq(rx.payload)
                    with m.Case(3):
                        m.d.comb += ptr_next.eq(0)
                        m.d.sync += [
                            f.length.eq(hdr_len),
                            f.records.eq(hdr_records),
                            bad.eq(0),
                            drained.eq(hdr_len == 0),
                        ]
                        with m.If(~hdr_ok):
                            end(FrameStatus.BAD_HEADER)
                        with m.Elif(hdr_len == 0):
                            m.next = "CRC"
                        with m.Else():
                            m.next = "PAYLOAD"

            with m.State("PAYLOAD"), receiving():
                m.d.comb += [wr.addr.eq(ptr), wr.data.eq(rx.payload), wr.en.eq(1)]
                m.d.comb += ptr_next.eq(ptr + 1)
                with m.If(at_end):
                    m.next = "CRC"

            with m.State("CRC"), receiving(fold=False):
                ne = rx.payload != crc.byte
                m.d.sync += [bad.eq(bad | ne), bi.eq(bi + 1)]
                with m.If(bi == 3):
                    m.d.comb += ptr_next.eq(0)
                    with m.If(bad | ne):
                        end(FrameStatus.BAD_CRC)
                    with m.Else():
                        end(FrameStatus.OK)

            with m.State("FRAME"):  # held until the dispatcher is done; `args` reads it back
                m.d.comb += [
                    self.frame.valid.eq(1),
                    args.valid.eq(q_valid),
                    args.payload.data.eq(q_data),
                    args.payload.last.eq(q_last),
                ]
                # the output register takes buf[ptr] while it is empty or being taken
                with m.If((f.status == FrameStatus.OK) & ~drained & (~q_valid | args.ready)):
                    m.d.comb += ptr_next.eq(ptr + 1)
                    m.d.sync += [
                        q_valid.eq(1),
                        q_data.eq(rd.data),
                        q_last.eq(at_end),
                        drained.eq(at_end),
                    ]
                with m.Elif(args.ready):
                    m.d.sync += q_valid.eq(0)
                with m.If(self.frame.ready):
                    m.d.sync += q_valid.eq(0)
                    m.next = "HUNT"

        m.d.comb += self.busy.eq(~fsm.ongoing("HUNT"))
        return m
