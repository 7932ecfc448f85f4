"""``LinkTransmitter``: the response framer of the link engine (docs/protocol.md §1).

Sends ``A5 5A``, type, seq, length (LE), the payload bytes and the CRC-32 of type … payload
(LE), every byte by a handshake on ``tx``.
"""

from __future__ import annotations

from typing import Any

from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..protocol.wire import SYNC
from .link_crc import crc_port_signature
from .link_ports import byte_layout, response_layout

__all__ = ["LinkTransmitter"]


class LinkTransmitter(wiring.Component):
    """Response framer: one ``response`` header and its payload bytes in, a frame out.

    Members
    -------
    response: ``In(stream.Signature(response_layout()))`` held request: the header of the frame
        to send, held for the whole frame; taken with the last CRC byte.
    data: ``In(stream.Signature(byte_layout()))`` the payload, ``response.length`` beats with
        ``last`` on the final one (none for length 0).
    tx: ``Out(stream.Signature(8))`` bytes to the host: ``10 + length`` per response.
    crc: ``Out(crc_port_signature())`` port on the shared CRC (zero while idle).
    """

    def __init__(self) -> None:
        super().__init__(
            {
                "response": In(stream.Signature(response_layout())),
                "data": In(stream.Signature(byte_layout())),
                "tx": Out(stream.Signature(8)),
                "crc": Out(crc_port_signature()),
            }
        )

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        rsp, pay, tx, crc = self.response, self.data, self.tx, self.crc
        bi = Signal(2)  # header / CRC byte index; 0 between frames (the shared port's rule)
        sent = tx.valid & tx.ready
        m.d.comb += [crc.data.eq(tx.payload), crc.index.eq(bi)]

        with m.FSM(name="tx"):
            with m.State("SYNC0"):
                m.d.comb += [tx.valid.eq(rsp.valid), tx.payload.eq(SYNC[0])]
                with m.If(sent):
                    m.next = "SYNC1"

            with m.State("SYNC1"):
                m.d.comb += [tx.valid.eq(1), tx.payload.eq(SYNC[1])]
                with m.If(sent):
                    m.d.comb += crc.start.eq(1)
                    m.next = "HEADER"

            with m.State("HEADER"):
                header = rsp.payload.as_value().word_select(bi, 8)  # type, seq, length (LE)
                m.d.comb += [tx.valid.eq(1), tx.payload.eq(header)]
                with m.If(sent):
                    m.d.comb += crc.valid.eq(1)
                    m.d.sync += bi.eq(bi + 1)
                    with m.If(bi == 3):
                        with m.If(rsp.payload.length == 0):
                            m.next = "CRC"
                        with m.Else():
                            m.next = "PAYLOAD"

            with m.State("PAYLOAD"):
                m.d.comb += [
                    tx.valid.eq(pay.valid),
                    tx.payload.eq(pay.payload.data),
                    pay.ready.eq(tx.ready),
                ]
                with m.If(sent):
                    m.d.comb += crc.valid.eq(1)
                    with m.If(pay.payload.last):
                        m.next = "CRC"

            with m.State("CRC"):
                m.d.comb += [tx.valid.eq(1), tx.payload.eq(crc.byte)]
                with m.If(sent):
                    m.d.sync += bi.eq(bi + 1)
                    with m.If(bi == 3):
                        m.d.comb += rsp.ready.eq(1)
                        m.next = "SYNC0"
        return m
