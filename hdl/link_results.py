"""READ_RESULTS (docs/protocol.md §2): the result buffer and the command that reads it.

:class:`ResultBuffer` keeps the network's results, from ``result_out``, until the host reads
them; :class:`ReadResults` executes READ_RESULTS: it answers ``n`` and then ``n`` results of
11 bytes (``Result.to_bytes``), and asks the dispatcher to count each one (``results_read``).
"""

from __future__ import annotations

from typing import Any

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..protocol.wire import RESULT_BYTES, LinkParams, NakReason
from .link_ports import byte_layout, command_signature
from .top import result_layout

__all__ = ["ResultBuffer", "ReadResults"]

#: Bytes per slot of the result memory: a power of two ≥ RESULT_BYTES (the slot number is the
#: high address bits).
SLOT_BYTES = 16


def _wrap_inc(sig: Signal, n: int):
    """``sig + 1`` modulo ``n``."""
    return sig + 1 if n == 1 << len(sig) else Mux(sig == n - 1, 0, sig + 1)


class ResultBuffer(wiring.Component):
    """A FIFO of ``depth`` results in one byte memory (16-byte slots), read a byte at a time.

    A result is written a byte per cycle straight from ``i`` (held valid by the stream rules)
    and taken with its last byte, so it costs no word register (*derived*: area on the
    iCE40UP5K, where the whole FIFO is one EBR).

    Parameters
    ----------
    depth: results buffered (``LinkParams.result_depth``), ≥ 1.
    packed: the results back to back, ``RESULT_BYTES`` (11) bytes each, at write and read
        addresses that step by one and wrap at ``depth · 11`` — 11/16 of the 16-byte slots'
        memory (an on-chip set's buffer of an epoch's records: 1,437 results in 8 ECP5
        DP16KD, not 12) for two address counters. *Derived*: the blocks; the default keeps
        the slot number as the high address bits (no counters: the iCE40 shell's area).

    Members
    -------
    i: ``In(stream.Signature(result_layout()))`` results from the network (``result_out``);
        a result is taken ``RESULT_BYTES`` cycles after it is offered, when a slot is free.
    o: ``Out(stream.Signature(byte_layout()))`` the oldest result's 11 bytes in
        ``Result.to_bytes`` order, ``last`` on the 11th, through a one-byte output register (a
        byte every other cycle; the memory's output drives no logic: docs/boards.md §4.1); the
        slot is free once its last byte is in that register.
    level: ``Out(range(depth + 1))`` results buffered, but the one whose last byte waits in
        the output register (a reader that takes each result to its ``last`` byte sees whole
        results).
    """

    def __init__(self, depth: int, packed: bool = False) -> None:
        if depth < 1:
            raise ValueError(f"depth must be ≥ 1 result, got {depth}")
        self.depth = depth
        self.packed = packed
        super().__init__(
            {
                "i": In(stream.Signature(result_layout())),
                "o": Out(stream.Signature(byte_layout())),
                "level": Out(range(depth + 1)),
            }
        )

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        D, i, o, level = self.depth, self.i, self.o, self.level
        size = D * (RESULT_BYTES if self.packed else SLOT_BYTES)
        m.submodules.mem = mem = Memory(shape=8, depth=size, init=[])
        w, r = mem.write_port(), mem.read_port()
        wslot, rslot = Signal(range(D)), Signal(range(D))
        wb, rb = Signal(4), Signal(4)
        wa, ra = Signal(range(size), name="wa"), Signal(range(size), name="ra")  # packed
        push = i.valid & i.ready
        raw_ready = Signal()  # the output register takes the byte the memory shows
        raw_take = (level != 0) & raw_ready
        pop = raw_take & (rb == RESULT_BYTES - 1)  # the slot's last byte left the memory

        # write side: byte `wb` of the offered result into the free slot
        value = i.payload.as_value()
        rbytes = Cat(value, Const(0, 8 * RESULT_BYTES - len(value)))
        with m.If(i.valid & (level != D)):
            m.d.comb += [
                w.addr.eq(wa if self.packed else Cat(wb, wslot)),
                w.data.eq(rbytes.word_select(wb, 8)),
                w.en.eq(1),
            ]
            m.d.sync += wb.eq(wb + 1)
            if self.packed:
                m.d.sync += wa.eq(_wrap_inc(wa, size))
            with m.If(wb == RESULT_BYTES - 1):
                m.d.comb += i.ready.eq(1)
                m.d.sync += [wb.eq(0), wslot.eq(_wrap_inc(wslot, D))]

        # read side: the read port shows byte `rb` of slot `rslot` (addressed a cycle ahead)
        rb_next, rslot_next = Signal.like(rb), Signal.like(rslot)
        m.d.comb += [rb_next.eq(rb), rslot_next.eq(rslot)]
        with m.If(raw_take):
            m.d.comb += rb_next.eq(rb + 1)
        with m.If(pop):
            m.d.comb += [rb_next.eq(0), rslot_next.eq(_wrap_inc(rslot, D))]
        m.d.sync += [rb.eq(rb_next), rslot.eq(rslot_next)]
        ra_next = Signal.like(ra)
        if self.packed:
            m.d.comb += ra_next.eq(Mux(raw_take, _wrap_inc(ra, size), ra))
            m.d.sync += ra.eq(ra_next)
        # the memory's output goes straight into the output register
        m.submodules.out = q = SyncFIFOBuffered(width=9, depth=1)
        m.d.comb += [
            raw_ready.eq(q.w_rdy),
            r.addr.eq(ra_next if self.packed else Cat(rb_next, rslot_next)),
            q.w_en.eq(level != 0),
            q.w_data.eq(Cat(r.data, rb == RESULT_BYTES - 1)),
            o.valid.eq(q.r_rdy),
            o.payload.data.eq(q.r_data[:8]),
            o.payload.last.eq(q.r_data[8]),
            q.r_en.eq(o.ready),
        ]

        with m.If(push & ~pop):
            m.d.sync += level.eq(level + 1)
        with m.Elif(pop & ~push):
            m.d.sync += level.eq(level - 1)
        return m


class ReadResults(wiring.Component):
    """READ_RESULTS ``max`` (docs/protocol.md §2): answers ``n = min(max, buffered,
    max_results)`` then ``n`` results; ``max = 0`` is NAKed BAD_ARG.

    Parameters
    ----------
    params: link sizes (``result_depth``, ``max_results``).

    Members
    -------
    cmd, args, nak, emit: :func:`~pipetrain.hdl.link_ports.command_signature` (``cmd`` without
        payload; ``nak`` is BAD_ARG or 0).
    result_out: ``In(stream.Signature(result_layout()))`` results from the network, buffered in
        a :class:`ResultBuffer` (taken whether or not a command runs).
    bump: ``Out(stream.Signature(0))`` one beat per result read: the dispatcher counts it
        (``results_read``, and one sample less in flight) and takes the beat when done.
    """

    def __init__(self, params: LinkParams) -> None:
        self.params = params
        super().__init__(
            dict(command_signature().members)
            | {
                "result_out": In(stream.Signature(result_layout())),
                "bump": Out(stream.Signature(0)),
            }
        )

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        P = self.params
        D = P.result_depth
        # an on-chip set's buffer holds an epoch's records: packed (its block RAMs, 11/16)
        m.submodules.buffer = buf = ResultBuffer(D, packed=P.onchip_samples > 0)
        wiring.connect(m, wiring.flipped(self.result_out), buf.i)
        cmd, args, emit, res = self.cmd, self.args, self.emit, buf.o
        left = Signal(8)  # results still to emit

        with m.FSM(name="read_results"):
            with m.State("CHECK"):
                m.d.comb += args.ready.eq(cmd.valid)
                with m.If(cmd.valid & args.valid):
                    want = args.payload.data
                    with m.If(want == 0):
                        m.next = "REFUSE"
                    with m.Else():
                        lim = buf.level
                        if P.max_results < D:
                            lim = Mux(buf.level < P.max_results, buf.level, P.max_results)
                        n = Signal(8)
                        m.d.comb += [n.eq(Mux(want < lim, want, lim)), emit.valid.eq(1)]
                        m.d.comb += emit.payload.eq(n)
                        m.d.sync += left.eq(n)
                        m.next = "EMIT"

            # `cmd.ready` and `nak` come from registers (they steer the dispatcher's next state
            # and read address; timing, docs/boards.md §4.1): max = 0 is refused a cycle later
            with m.State("REFUSE"):
                m.d.comb += [cmd.ready.eq(1), self.nak.eq(NakReason.BAD_ARG)]
                m.next = "CHECK"

            with m.State("EMIT"):
                with m.If(left == 0):
                    m.d.comb += cmd.ready.eq(1)
                    m.next = "CHECK"
                with m.Else():
                    m.d.comb += [
                        res.ready.eq(1),
                        emit.valid.eq(res.valid),
                        emit.payload.eq(res.payload.data),
                    ]
                    with m.If(res.valid & res.payload.last):
                        m.d.sync += left.eq(left - 1)
                        m.next = "BUMP"

            with m.State("BUMP"):
                m.d.comb += self.bump.valid.eq(1)
                with m.If(self.bump.ready):
                    m.next = "EMIT"
        return m
