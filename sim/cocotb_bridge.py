"""cocotb test serving :class:`~pipetrain.sim.bridge.BridgeTop`'s byte streams on a TCP port.

Runs inside the simulator (started by :class:`~pipetrain.sim.bridge.SimBridge`). After reset
the bridge server (:class:`~pipetrain.sim.tb.server.LinkServer`) accepts the host on a loopback
port and serves it until the host closes the connection; then the test returns the statistics
(written to the job's result file).

Scheduling (what keeps Python off the per-cycle path, docs/architecture.md §6):

* host → design: each bridge word (up to W bytes) is one ``valid`` beat; while the word buffer
  drains the coroutine sleeps on ``RisingEdge(i.ready)``;
* design → host: ``o.ready`` stays high; the coroutine sleeps on ``RisingEdge(o.valid)`` and
  sends each word's bytes at once;
* no input pending: while the design is busy (or for ``settle_cycles`` after, so a tick in
  progress finishes) the clock runs ``chunk_cycles`` at a time between non-blocking polls of
  the socket; once it is quiet the simulator blocks in ``select`` with the clock stopped
  (simulated time does not advance while nothing can happen).
"""

from __future__ import annotations

from typing import Any

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, First, ReadOnly, RisingEdge, Timer
from cocotb.utils import get_sim_time

from .tb.job import run_job
from .tb.server import LinkServer


class _Bridge:
    def __init__(self, dut: Any, job: dict[str, Any]) -> None:
        self.dut, self.job = dut, job
        self.W = int(job["word_bytes"])
        self.clock_ns = int(job["clock_ns"])
        self.chunk = max(1, int(job["chunk_cycles"]))
        self.settle = int(job["settle_cycles"])
        self.busy_wait = max(self.chunk, int(job.get("busy_wait_cycles", 4096)))
        self.server = LinkServer(job)
        self.wakeups = 0
        self.t0_ns = 0.0

    def cycles(self) -> int:
        return round((get_sim_time("ns") - self.t0_ns) / self.clock_ns)

    async def wait_input(self) -> bytes:
        """Return the next host bytes, running the design while it has work to do."""
        dut = self.dut
        quiet = 0
        while True:
            data = self.server.recv()
            if data:
                return data
            await ReadOnly()
            busy = dut.busy.value == 1
            idle = dut.net_idle.value == 1
            await RisingEdge(dut.clk)
            self.wakeups += 1
            quiet = 0 if busy else quiet + 1
            if not busy and (idle or quiet > self.settle):
                # nothing can change until the host speaks: stop the clock and wait
                self.server.wait()
                continue
            if busy:
                # executing or answering: the host (stop-and-wait) speaks after the response;
                # wake on output, or after a long chunk (a frame split across TCP segments)
                await First(RisingEdge(dut.o__valid), Timer(self.busy_wait * self.clock_ns, "ns"))
                await RisingEdge(dut.clk)
            else:
                await Timer(self.chunk * self.clock_ns - self.clock_ns // 2, "ns")
                await RisingEdge(dut.clk)
                quiet += self.chunk

    async def feed(self) -> None:
        """host → design, a word per beat."""
        dut, W = self.dut, self.W
        shift = 8 * W
        buf = b""
        while True:
            if not buf:
                buf = await self.wait_input()
            else:
                buf += self.server.recv()
            word, buf = buf[:W], buf[W:]
            dut.i__payload.value = int.from_bytes(word, "little") | (len(word) << shift)
            dut.i__valid.value = 1
            await ReadOnly()
            while dut.i__ready.value != 1:
                await RisingEdge(dut.i__ready)
                await ReadOnly()
            await RisingEdge(dut.clk)
            self.wakeups += 1
            dut.i__valid.value = 0

    async def drain(self) -> None:
        """design → host, a word per beat (``o.ready`` is always high)."""
        dut, W = self.dut, self.W
        mask = (1 << (8 * W)) - 1
        while True:
            await ReadOnly()
            if dut.o__valid.value == 1:
                v = dut.o__payload.value.to_unsigned()
                n = v >> (8 * W)
                self.server.send((v & mask).to_bytes(W, "little")[:n])
                await RisingEdge(dut.clk)
            else:
                await RisingEdge(dut.o__valid)
            self.wakeups += 1

    async def run(self) -> dict[str, Any]:
        dut = self.dut
        Clock(dut.clk, self.clock_ns, unit="ns").start()
        dut.rst.value = 1
        dut.i__valid.value = 0
        dut.o__ready.value = 1
        await ClockCycles(dut.clk, 3)
        dut.rst.value = 0
        await RisingEdge(dut.clk)
        self.t0_ns = get_sim_time("ns")
        await self.server.serve(self.feed, self.drain)
        return self.server.stats() | {"cycles": self.cycles(), "wakeups": self.wakeups}


async def _body(dut: Any, job: dict[str, Any]) -> dict[str, Any]:
    return await _Bridge(dut, job).run()


@cocotb.test()
async def serve(dut: Any) -> None:
    """Serve the link byte stream of the design on a TCP port until the host disconnects."""
    await run_job(dut, _body)
