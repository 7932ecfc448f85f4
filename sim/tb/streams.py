"""cocotb drivers and monitors for ``amaranth.lib.stream`` ports (``<name>__payload/valid/ready``).

Timing discipline shared by every helper here (and by the testbenches using them): signals are
written right after ``RisingEdge(clk)`` and sampled in the following ``ReadOnly()`` phase; a
beat transfers at the rising edge that ends a cycle in which ``valid & ready`` was seen in
``ReadOnly``. Under this discipline the helpers are correct for any mix of random and constant
valid/ready.

Randomised handshakes (``valid_prob``/``ready_prob`` < 1) are seeded through ``rng`` so a failing
run can be replayed. With probability 1 the helpers *free-run*: while the other side stalls they
wait for a value change (``RisingEdge(ready)`` / ``RisingEdge(valid)``) instead of waking up every
cycle, so the simulator runs the design on its own in between (docs/architecture.md §6: ~15k
cycles/s with
Python every cycle versus 100k–400k free-running).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cocotb.handle import SimHandleBase
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

from .layout import BitField, pack, unpack

__all__ = ["StreamDriver", "StreamMonitor", "stream_handles"]


def stream_handles(dut: SimHandleBase, name: str) -> tuple[Any, Any, Any]:
    """Return the ``(payload, valid, ready)`` handles of stream member ``name`` of ``dut``."""
    return (
        getattr(dut, f"{name}__payload"),
        getattr(dut, f"{name}__valid"),
        getattr(dut, f"{name}__ready"),
    )


class StreamDriver:
    """Drive beats into an input stream of the DUT (the DUT is the sink).

    ``valid_prob``: probability that a pending beat is offered in a cycle (1.0 = always, which
    free-runs while the DUT holds ``ready`` low). ``rng`` seeds the random gaps. ``accepted``
    counts beats taken by the DUT; ``stalls`` the cycles a beat was offered but not taken
    (counted in randomised mode only: free-running mode does not wake up per cycle).

    ``ready_registered``: promise that the DUT's ``ready`` does not depend combinationally on
    ``valid`` or ``payload`` (e.g. ``ready = ~pending`` from a register). Free-running sends
    then wake up once per beat instead of twice: at each falling edge the settled ``ready``
    says whether the beat on the bus goes at the next rising edge, and the next beat is put on
    the bus at the falling edge after it. Breaking the promise duplicates or drops beats.
    """

    def __init__(
        self,
        dut: SimHandleBase,
        name: str,
        fields: Sequence[BitField],
        clk: Any,
        *,
        valid_prob: float = 1.0,
        rng: random.Random | None = None,
        ready_registered: bool = False,
    ) -> None:
        self.payload, self.valid, self.ready = stream_handles(dut, name)
        self.name = name
        self.fields = tuple(fields)
        self.clk = clk
        self.valid_prob = valid_prob
        self.ready_registered = ready_registered
        self.rng = rng or random.Random(0)
        self.accepted = 0
        self.stalls = 0
        self.valid.value = 0

    async def send(self, beats: Iterable[Mapping[str, int] | int]) -> None:
        """Send ``beats`` in order; return right after the edge that transferred the last one.

        Must be called in a write phase (after ``RisingEdge(clk)`` or at time 0); leaves
        ``valid`` low when done.
        """
        raws = [pack(self.fields, b) for b in beats]
        free = self.valid_prob >= 1.0
        if free and self.ready_registered:
            await self._send_at_falling_edges(raws)
            return
        i = 0
        while i < len(raws):
            offer = free or self.rng.random() < self.valid_prob
            if offer:
                self.payload.value = raws[i]
                self.valid.value = 1
            else:
                self.valid.value = 0
            await ReadOnly()
            ok = offer and self.ready.value == 1
            if offer and not ok and not free:
                self.stalls += 1
            while free and not ok:  # stall: let the design run until it raises ready
                await RisingEdge(self.ready)
                await ReadOnly()
                ok = self.ready.value == 1
            await RisingEdge(self.clk)
            if ok:
                i += 1
                self.accepted += 1
        self.valid.value = 0

    async def _send_at_falling_edges(self, raws: list[int]) -> None:
        """One wake-up per beat (see ``ready_registered``); returns at a falling edge."""
        i = 0
        await FallingEdge(self.clk)
        while i < len(raws):
            self.payload.value = raws[i]
            self.valid.value = 1
            if self.ready.value == 1:  # settled, and independent of the write above
                i += 1
                self.accepted += 1
            else:  # stall: let the design run until it raises ready
                await RisingEdge(self.ready)
            await FallingEdge(self.clk)
        self.valid.value = 0


class StreamMonitor:
    """Collect beats from an output stream of the DUT (the testbench is the sink).

    ``ready_prob``: probability that ``ready`` is high in a cycle (1.0 = always ready, which
    free-runs while the DUT holds ``valid`` low). ``beats`` holds the unpacked payloads in
    order; ``refused`` counts cycles the DUT offered a beat while ``ready`` was low.
    """

    def __init__(
        self,
        dut: SimHandleBase,
        name: str,
        fields: Sequence[BitField],
        clk: Any,
        *,
        ready_prob: float = 1.0,
        rng: random.Random | None = None,
    ) -> None:
        self.payload, self.valid, self.ready = stream_handles(dut, name)
        self.name = name
        self.fields = tuple(fields)
        self.clk = clk
        self.ready_prob = ready_prob
        self.rng = rng or random.Random(1)
        self.beats: list[dict[str, int]] = []
        self.refused = 0
        self.ready.value = 0

    async def collect(self, count: int) -> list[dict[str, int]]:
        """Collect ``count`` more beats; return right after the edge that transferred the last.

        Must be called in a write phase; leaves ``ready`` low when done.
        """
        free = self.ready_prob >= 1.0
        target = len(self.beats) + count
        if free:
            self.ready.value = 1
        while len(self.beats) < target:
            take = free or self.rng.random() < self.ready_prob
            if not free:
                self.ready.value = 1 if take else 0
            await ReadOnly()
            ok = take and self.valid.value == 1
            if not take and self.valid.value == 1:
                self.refused += 1
            while free and not ok:  # idle: let the design run until it raises valid
                await RisingEdge(self.valid)
                await ReadOnly()
                ok = self.valid.value == 1
            if ok:
                self.beats.append(unpack(self.fields, self.payload.value.to_unsigned()))
            await RisingEdge(self.clk)
        self.ready.value = 0
        return self.beats[target - count :]
