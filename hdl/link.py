"""``LinkEngine``: the device side of the host link protocol, between a byte stream and the
network top.

The wire format, the commands and the reliability rules are those of ``docs/protocol.md``; the
constants come from :mod:`pipetrain.protocol.wire`, and :class:`~pipetrain.protocol.
device_model.LinkDeviceModel` is this engine's byte-exact Python model (the tests compare them).

The engine is the composition of its parts (interfaces in :mod:`pipetrain.hdl.link_ports`),
one frame at a time; the receiver is stalled while a command runs or its response is sent,
which is correct under any backpressure because every byte moves by a stream handshake:

* :class:`~pipetrain.hdl.link_rx.LinkReceiver` — hunt for ``A5 5A``, header, payload into the
  command buffer, CRC check, receive timeout; one ``frame`` beat per frame;
* :class:`~pipetrain.hdl.link_dispatch.LinkDispatcher` — counts frames, answers
  retransmissions from the response cache, executes commands (with
  :class:`~pipetrain.hdl.link_samples.SamplesCommand`,
  :class:`~pipetrain.hdl.link_results.ReadResults` and
  :class:`~pipetrain.hdl.link_weights.WeightsCommand`) and keeps the response buffer, the
  counters and the HELLO bytes in one block RAM;
* :class:`~pipetrain.hdl.link_tx.LinkTransmitter` — sync, type, seq, length, payload, CRC (the
  payload through a one-byte register: the response buffer's block RAM drives no logic);
* :class:`~pipetrain.hdl.link_crc.LinkCRC` — the CRC-32 (``amaranth.lib.crc``), shared by the
  receiver and the transmitter, which never run at once.

Area (the design must fit an iCE40UP5K next to the network): everything wide is byte-serial
and lives in block RAM (command buffer, state memory, result FIFO); one CRC unit and one 32-bit
shift register serve every part that needs them.

Source: docs/protocol.md (*derived*: stop-and-wait ARQ with a response cache).
"""

from __future__ import annotations

from typing import Any

from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..compiler.plan import Plan
from ..protocol.wire import LinkParams
from .link_crc import LinkCRC
from .link_dispatch import LinkDispatcher
from .link_ports import network_signature
from .link_rx import LinkReceiver
from .link_tx import LinkTransmitter

__all__ = ["LinkEngine", "network_signature", "DEFAULT_RX_TIMEOUT"]

#: Cycles without a byte after which a partial frame is dropped (21 ms at 50 MHz: far longer
#: than a byte at any baud rate the boards use, far shorter than the host's retry timeout).
DEFAULT_RX_TIMEOUT = 1 << 20


class LinkEngine(wiring.Component):
    """Device-side protocol engine: host byte streams in/out, NetworkTop ports (docs/ports.md).

    Parameters
    ----------
    plan: the design plan (sizes, formats, hash).
    max_batch, max_words, result_depth: link sizes (:meth:`LinkParams.from_plan` defaults).
    onchip_samples: capacity of the on-chip training set (samples; 0 = none: STORE and RUN
        are bad headers, and the set's memories and runner are not built —
        :class:`~pipetrain.hdl.link_onchip.OnChipSet`).
    rx_timeout: cycles without a byte inside a frame before it is dropped (0 = never).

    Raises
    ------
    ValueError: ``rx_timeout`` is negative, or a link size is out of range
        (:meth:`LinkParams.from_plan`).

    Members
    -------
    rx: ``In(stream.Signature(8))`` bytes from the host.
    tx: ``Out(stream.Signature(8))`` bytes to the host.
    net: ``In(network_signature(plan))`` — the flipped NetworkTop signature: the engine drives
        ``sample_in``, ``wacc_cmd``, ``flush`` and consumes ``result_out``, ``wacc_rsp``,
        ``idle`` and the counters. Connect with ``wiring.connect(m, engine.net, top)``.
    busy: ``Out(1)`` clearing after reset, inside a frame, executing or sending (low only
        while hunting for a frame).

    Attributes
    ----------
    params: the :class:`~pipetrain.protocol.wire.LinkParams`.
    plan_hash: the plan hash as an integer (64 bit); HELLO reports it.
    """

    def __init__(
        self,
        plan: Plan,
        *,
        max_batch: int | None = None,
        max_words: int = 32,
        result_depth: int | None = None,
        rx_timeout: int = DEFAULT_RX_TIMEOUT,
        onchip_samples: int = 0,
    ) -> None:
        self.plan = plan
        self.params = LinkParams.from_plan(
            plan, max_batch, max_words, result_depth, onchip_samples=onchip_samples
        )
        self.plan_hash = int(plan.hash, 16)
        if rx_timeout < 0:
            raise ValueError(f"rx_timeout must be ≥ 0 cycles, got {rx_timeout}")
        self.rx_timeout = rx_timeout
        super().__init__(
            {
                "rx": In(stream.Signature(8)),
                "tx": Out(stream.Signature(8)),
                "net": In(network_signature(plan)),
                "busy": Out(1),
            }
        )

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        m.submodules.receiver = rx = LinkReceiver(self.params, self.rx_timeout)
        m.submodules.dispatcher = dispatch = LinkDispatcher(self.plan, self.params)
        m.submodules.transmitter = tx = LinkTransmitter()
        m.submodules.crc = crc = LinkCRC()
        wiring.connect(m, wiring.flipped(self.rx), rx.rx)
        wiring.connect(m, rx.frame, dispatch.frame)
        wiring.connect(m, rx.args, dispatch.args)
        wiring.connect(m, dispatch.response, tx.response)
        # the response bytes come from the dispatcher's block RAM: a one-byte register before
        # the transmitter and its CRC (a byte every other cycle, far above the UART's rate;
        # timing: docs/boards.md §4.1)
        m.submodules.tx_data = q = SyncFIFOBuffered(width=9, depth=1)
        d, t = dispatch.data, tx.data
        m.d.comb += [
            q.w_en.eq(d.valid),
            q.w_data.eq(d.payload.as_value()),
            d.ready.eq(q.w_rdy),
            t.valid.eq(q.r_rdy),
            t.payload.eq(q.r_data),
            q.r_en.eq(t.ready),
        ]
        wiring.connect(m, tx.tx, wiring.flipped(self.tx))
        wiring.connect(m, wiring.flipped(self.net), dispatch.net)
        wiring.connect(m, rx.crc, crc.rx)
        wiring.connect(m, tx.crc, crc.tx)
        m.d.comb += self.busy.eq(rx.busy | dispatch.busy)
        return m
