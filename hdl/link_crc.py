"""``LinkCRC``: the frame CRC of the host link, one byte per cycle, shared by the link's
receiver and transmitter.

The CRC is CRC-32/ISO-HDLC (``docs/protocol.md`` §1; ``zlib.crc32``), computed by
``amaranth.lib.crc``'s byte-wide ``Processor`` from ``amaranth.lib.crc.catalog``. One unit
serves both directions because they never run at the same time: the receiver holds a frame
until its response has been sent (``docs/protocol.md`` §3, the receiver is stalled meanwhile),
so the transmitter only uses the CRC while the receiver does not. Each user has a
:func:`crc_port_signature` port; a user that is not computing a CRC holds its controls at zero.

Area (*derived*, measured with ``synth_ice40``): the restart is the Processor's clock-domain
reset (``ResetInserter``) rather than its ``start`` input, whose ``Mux(start, initial, crc)``
in front of the XOR matrix costs about 50 iCE40 LUTs more; the byte select of the finished
CRC is shared too (a second one would cost 16 LUTs).
"""

from __future__ import annotations

from typing import Any

from amaranth import Module, Mux, ResetInserter
from amaranth.lib import wiring
from amaranth.lib.crc import catalog
from amaranth.lib.wiring import In, Out

__all__ = ["LinkCRC", "crc_port_signature", "CRC_ALGORITHM"]

#: The frame CRC (docs/protocol.md §1): poly 0x04C11DB7 reflected, init and xorout 0xFFFFFFFF.
CRC_ALGORITHM = catalog.CRC32_ISO_HDLC


def crc_port_signature() -> wiring.Signature:
    """One user's port on :class:`LinkCRC`, seen from the user.

    Members
    -------
    start: ``Out(1)`` restart: the CRC of no bytes from the next cycle on (one cycle, without
        ``valid``).
    valid: ``Out(1)`` fold ``data`` into the CRC (the result shows from the next cycle on).
    data: ``Out(8)`` the byte to fold.
    index: ``Out(2)`` which byte of the finished CRC ``byte`` shows (0 = sent first).
    byte: ``In(8)`` byte ``index`` of the finished CRC (init, reflection and xorout applied)
        of the bytes folded since the last ``start``: the CRC as sent, little endian.
    """
    return wiring.Signature(
        {
            "start": Out(1),
            "valid": Out(1),
            "data": Out(8),
            "index": Out(2),
            "byte": In(8),
        }
    )


class LinkCRC(wiring.Component):
    """CRC-32/ISO-HDLC, one byte per cycle, for two users that take turns (docs/protocol.md §1).

    ``start``, ``valid`` and ``index`` of the two ports are ORed and ``data`` is taken from the
    port whose ``valid`` is high: a user holds ``start``, ``valid`` and ``index`` at zero while
    it does not compute a CRC (two users computing at once is an error the unit does not check).

    Members
    -------
    rx: ``In(crc_port_signature())`` the receiver's port.
    tx: ``In(crc_port_signature())`` the transmitter's port.
    """

    def __init__(self) -> None:
        super().__init__({"rx": In(crc_port_signature()), "tx": In(crc_port_signature())})

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        rx, tx = self.rx, self.tx
        proc = CRC_ALGORITHM(data_width=8).create()
        m.submodules.processor = ResetInserter(rx.start | tx.start)(proc)
        byte = proc.crc.word_select(rx.index | tx.index, 8)
        m.d.comb += [
            proc.valid.eq(rx.valid | tx.valid),
            proc.data.eq(Mux(tx.valid, tx.data, rx.data)),
            rx.byte.eq(byte),
            tx.byte.eq(byte),
        ]
        return m
