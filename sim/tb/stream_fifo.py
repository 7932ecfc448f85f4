"""A small stream buffer used to prove the RTL flow (runner, stream helpers, result passing).

Not part of the generated hardware: it exists so the Verilator/cocotb plumbing can be tested
without the network top.
"""

from __future__ import annotations

from typing import Any

from amaranth import Module
from amaranth.hdl import Shape
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

__all__ = ["StreamFIFO"]


class StreamFIFO(wiring.Component):
    """A ``lib.fifo.SyncFIFOBuffered`` behind ``lib.stream`` ports, with a struct payload.

    Parameters
    ----------
    layout: payload shape or ``lib.data`` layout.
    depth: entries (beats).

    Members
    -------
    i: In(stream.Signature(layout)) — beats in.
    o: Out(stream.Signature(layout)) — the same beats out, in order, after ≥ 1 cycle.
    """

    def __init__(self, layout: Any, depth: int) -> None:
        self.layout = layout
        self.depth = depth
        super().__init__({"i": In(stream.Signature(layout)), "o": Out(stream.Signature(layout))})

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        width = Shape.cast(self.layout).width
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=width, depth=self.depth)
        m.d.comb += [
            fifo.w_data.eq(self.i.payload.as_value()),
            fifo.w_en.eq(self.i.valid),
            self.i.ready.eq(fifo.w_rdy),
            self.o.payload.as_value().eq(fifo.r_data),
            self.o.valid.eq(fifo.r_rdy),
            fifo.r_en.eq(self.o.ready),
        ]
        return m
