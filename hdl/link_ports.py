"""The interfaces between the parts of the link engine (:class:`~pipetrain.hdl.link.LinkEngine`).

::

    rx ─▶ LinkReceiver ─frame, args─▶ LinkDispatcher ─response, data─▶ LinkTransmitter ─▶ tx
              │                        ├─ SamplesCommand ──▶ net.sample_in
              │                        ├─ ReadResults ◀──── net.result_out
              │                        └─ WeightsCommand ◀▶ net.wacc_cmd, net.wacc_rsp
              └─────────────── LinkCRC (shared) ──────────────────────────────┘

Every byte and record moves by a ``lib.stream`` handshake (valid/ready). Some streams carry a
*held request*: the source offers one beat for a whole job and the sink takes it when the job is
done — ``frame`` (the receiver holds it until the response is sent, which is what stalls the
receiver during execution, docs/protocol.md §3), ``response`` (the transmitter takes it with
the last CRC byte), a command part's ``cmd`` (taken when the command has executed) and its
``bump`` (taken when the dispatcher has counted it). Holding the request keeps its fields in
the source's registers instead of a copy in the sink (*derived*: area on the iCE40UP5K).
"""

from __future__ import annotations

from amaranth import unsigned
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from ..protocol.wire import LinkParams
from .streams import network_signature

__all__ = [
    "FrameStatus",
    "frame_layout",
    "byte_layout",
    "response_layout",
    "network_signature",
    "command_signature",
]


class FrameStatus(enum.Enum, shape=2):
    """How a frame ended (docs/protocol.md §3). The values are the offsets of the counters that
    count them from ``frames_ok`` in READ_COUNTERS order (docs/protocol.md §2)."""

    OK = 0  #: good CRC: a command to execute (``frames_ok``)
    BAD_CRC = 1  #: CRC mismatch, dropped (``bad_crc``)
    BAD_HEADER = 2  #: no command has this type and length, dropped (``bad_header``)
    TIMEOUT = 3  #: the bytes stopped inside the frame, dropped (``rx_timeouts``)


def frame_layout(params: LinkParams) -> data.StructLayout:
    """One received frame (docs/protocol.md §1): ``status`` (:class:`FrameStatus`), ``type`` and
    ``seq`` (u8), ``length`` (payload bytes, 0 .. ``rx_max``) and ``records`` (SAMPLES records,
    ``length / R``; 0 for other types). Only ``status`` is meaningful unless it is OK."""
    return data.StructLayout(
        {
            "status": FrameStatus,
            "type": unsigned(8),
            "seq": unsigned(8),
            "length": range(params.rx_max + 1),
            "records": range(params.max_batch + 1),
        }
    )


def byte_layout() -> data.StructLayout:
    """A byte of a payload: ``data`` (u8) and ``last`` (the payload's final byte)."""
    return data.StructLayout({"data": unsigned(8), "last": unsigned(1)})


def response_layout() -> data.StructLayout:
    """A response frame's header (docs/protocol.md §1): ``type``, ``seq`` (u8), ``length``
    (u16, payload bytes; the payload follows on a :func:`byte_layout` stream)."""
    return data.StructLayout({"type": unsigned(8), "seq": unsigned(8), "length": unsigned(16)})


def command_signature(cmd_shape=0, *, emits: bool = True) -> wiring.Signature:
    """The dispatcher's side of a command part, seen from the part.

    Members
    -------
    cmd: ``In(stream.Signature(cmd_shape))`` held request: offered while the command runs,
        taken when it has executed.
    args: ``In(stream.Signature(byte_layout()))`` the command's payload bytes, in order; the
        part takes exactly the bytes the command has (the receiver checked the length).
    nak: ``Out(2)`` (``emits`` only) the command's :class:`~pipetrain.protocol.wire.NakReason`,
        0 = executed; read with the ``cmd`` transfer; a NAKed command has emitted nothing.
    emit: ``Out(stream.Signature(8, always_ready=True))`` (``emits`` only) response payload
        bytes, appended in order (the response buffer holds any response: no backpressure).
    """
    members = {
        "cmd": In(stream.Signature(cmd_shape)),
        "args": In(stream.Signature(byte_layout())),
    }
    if emits:
        members |= {"nak": Out(2), "emit": Out(stream.Signature(8, always_ready=True))}
    return wiring.Signature(members)
