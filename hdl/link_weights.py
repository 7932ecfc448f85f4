"""READ_WEIGHTS and WRITE_WEIGHTS (docs/protocol.md §2): weight access through ``wacc_cmd`` /
``wacc_rsp`` (docs/ports.md)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

from amaranth import Array, Const, Module, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..protocol.wire import WEIGHT_HEADER_BYTES, LinkParams, NakReason
from .link_ports import command_signature
from .top import wacc_cmd_layout, wacc_rsp_layout

__all__ = ["WeightsCommand", "weights_cmd_layout"]


def weights_cmd_layout(params: LinkParams) -> data.StructLayout:
    """The request of a weight command: ``write`` (WRITE_WEIGHTS) and the payload ``length``."""
    return data.StructLayout({"write": 1, "length": range(params.rx_max + 1)})


class WeightsCommand(wiring.Component):
    """READ/WRITE_WEIGHTS ``stage, kind, row, col, count`` [+ count × i32]: ``count`` words of
    row ``row`` from column ``col`` on, one ``wacc_cmd`` each (``flush`` raised while one waits:
    the network serves weight access only when idle); a read answers the words (i32 LE), a
    write nothing. Out-of-range arguments are NAKed BAD_ARG (the checks of docs/protocol.md §2).

    Parameters
    ----------
    params: link sizes (stages' rows, columns and kinds, ``max_words``).

    Members
    -------
    cmd, args, nak, emit: :func:`~pipetrain.hdl.link_ports.command_signature` (``cmd`` payload
        :func:`weights_cmd_layout`).
    word: ``In(32)`` the last four bytes taken from ``args``, the latest in bits 24..31 (the
        dispatcher's shift register): the word to write.
    wacc_cmd: ``Out(stream.Signature(wacc_cmd_layout()))`` to NetworkTop.
    wacc_rsp: ``In(stream.Signature(wacc_rsp_layout()))`` from NetworkTop, one per command.
    flush: ``Out(1)`` while a ``wacc_cmd`` waits.
    """

    def __init__(self, params: LinkParams) -> None:
        self.params = params
        super().__init__(
            dict(command_signature(weights_cmd_layout(params)).members)
            | {
                "word": In(32),
                "wacc_cmd": Out(stream.Signature(wacc_cmd_layout())),
                "wacc_rsp": In(stream.Signature(wacc_rsp_layout())),
                "flush": Out(1),
            }
        )

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        cmd, args, wc, wr = self.cmd, self.args, self.wacc_cmd, self.wacc_rsp
        take = args.valid & args.ready
        h = _Header(self.params)
        hi = Signal(range(WEIGHT_HEADER_BYTES))  # header byte
        bi = Signal(2)  # byte of the word
        # `cmd.ready` and `nak` come from registers (they steer the dispatcher's next state and
        # its memory's read address; timing: docs/boards.md §4.1)
        ok = Signal()  # the header passed its checks
        m.d.comb += [
            wc.payload.write.eq(cmd.payload.write),
            wc.payload.stage.eq(h.stage),
            wc.payload.kind.eq(h.kind),
            wc.payload.row.eq(h.row),
            wc.payload.col.eq(h.col),
            wc.payload.data.eq(self.word),
        ]

        def word_done(nxt: str) -> None:
            """One word was read or written: the next, or the command is done."""
            m.d.sync += [h.col.eq(h.col + 1), h.count.eq(h.count - 1)]
            with m.If(h.count == 1):
                m.next = "FINISH"
            with m.Else():
                m.next = nxt

        with m.FSM(name="weights"):
            with m.State("HEADER"):
                m.d.comb += args.ready.eq(cmd.valid)
                with m.If(take):
                    m.d.sync += hi.eq(hi + 1)
                    with h.load(m, hi, args.payload.data):  # the last byte
                        m.d.sync += hi.eq(0)
                        m.next = "VERIFY"

            with m.State("VERIFY"):  # the header's checks into a register
                m.d.sync += ok.eq(h.valid(cmd.payload.write, cmd.payload.length))
                m.next = "CHECK"

            with m.State("CHECK"):
                m.d.sync += bi.eq(0)
                with m.If(~ok):
                    m.d.comb += [cmd.ready.eq(1), self.nak.eq(NakReason.BAD_ARG)]
                    m.next = "HEADER"
                with m.Elif(cmd.payload.write):
                    m.next = "WDATA"
                with m.Else():
                    m.next = "COMMAND"

            with m.State("COMMAND"):
                m.d.comb += [wc.valid.eq(1), self.flush.eq(1)]
                with m.If(wc.ready & cmd.payload.write):
                    m.next = "WRESPONSE"
                with m.Elif(wc.ready):
                    m.next = "RDATA"

            with m.State("RDATA"):
                # the word a byte per cycle while the response is held, then take it
                with m.If(wr.valid):
                    m.d.comb += [
                        self.emit.valid.eq(1),
                        self.emit.payload.eq(wr.payload.data.as_unsigned().word_select(bi, 8)),
                    ]
                    m.d.sync += bi.eq(bi + 1)
                    with m.If(bi == 3):
                        m.d.comb += wr.ready.eq(1)
                        word_done("COMMAND")

            with m.State("WDATA"):
                m.d.comb += args.ready.eq(1)
                with m.If(take):
                    m.d.sync += bi.eq(bi + 1)
                    with m.If(bi == 3):
                        m.next = "COMMAND"

            with m.State("FINISH"):  # the last word is done
                m.d.comb += cmd.ready.eq(1)
                m.next = "HEADER"

            with m.State("WRESPONSE"):
                m.d.comb += wr.ready.eq(1)
                with m.If(wr.valid):
                    word_done("WDATA")
        return m


class _Header:
    """The registers of a weight header, with only the bits a valid command can have (8 or 16
    bits of row and col, the stage's bits); ``bad`` records that a header byte had others
    (*derived*: area). ``col`` and ``count`` then count the words."""

    def __init__(self, params: LinkParams) -> None:
        self.params = P = params
        self.sbits = max(1, (P.num_stages - 1).bit_length())
        self.rw = 8 if max(P.stage_rows) <= 256 else 16
        self.cw = 8 if max(P.stage_cols) <= 256 else 16
        self.stage, self.kind, self.count = Signal(self.sbits), Signal(2), Signal(8)
        self.row, self.col = Signal(self.rw), Signal(self.cw)
        self.bad = Signal()

    def _table(self, values, width: int, index) -> Value:
        """``values[index]`` (a stage's constant); a constant when every stage has the same."""
        if len(set(values)) == 1:
            return Const(values[0], width)
        pad = (1 << self.sbits) - len(values)
        return Array([Const(v, width) for v in values] + [Const(0, width)] * pad)[index]

    @contextmanager
    def load(self, m: Module, index, byte):
        """Header byte ``index`` (0 .. 6: stage, kind, row LE, col LE, count) is ``byte``; the
        body runs for the last one."""
        S, bad = self.params.num_stages, self.bad
        with m.Switch(index):
            with m.Case(0):
                m.d.sync += [self.stage.eq(byte), bad.eq(byte >= S)]
            with m.Case(1):
                kinds = self._table(self.params.stage_kinds, 2, self.stage)
                m.d.sync += [self.kind.eq(byte), bad.eq(bad | (byte >= kinds))]
            for k, reg, width in ((2, self.row, self.rw), (4, self.col, self.cw)):
                with m.Case(k):
                    m.d.sync += reg[0:8].eq(byte)
                with m.Case(k + 1):
                    if width == 8:
                        m.d.sync += bad.eq(bad | (byte != 0))
                    else:
                        m.d.sync += reg[8:16].eq(byte)
            with m.Case(WEIGHT_HEADER_BYTES - 1):
                m.d.sync += self.count.eq(byte)
                yield

    def valid(self, write, length) -> Value:
        """Whether the header (and for a write, the payload ``length``) is one the network
        serves: the checks of docs/protocol.md §2 (``LinkDeviceModel``'s)."""
        P = self.params
        rows = self._table(P.stage_rows, self.rw + 1, self.stage)
        cols = self._table(P.stage_cols, self.cw + 1, self.stage)
        count = self.count
        return (
            ~self.bad
            & (self.row < rows)
            & (count != 0)
            & (count <= P.max_words)
            & (self.col + count <= cols)
            & (~write | (length == WEIGHT_HEADER_BYTES + 4 * count))
        )
