"""cocotb test for :class:`pipetrain.sim.tb.stream_fifo.StreamFIFO` (runs inside Verilator).

Job: ``{"fields": [...], "beats": [{name: int}, ...], "valid_prob", "ready_prob", "seed"}``.
Result: ``{"received": [...], "cycles": int, "stalls": int, "refused": int}`` — the beats seen
on ``o`` in order, the clock cycles from the first offered beat to the last transfer, and the
backpressure observed (input beats refused, output beats offered while not ready).
"""

from __future__ import annotations

import random
from typing import Any

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotb.utils import get_sim_time

from .tb.job import run_job
from .tb.layout import fields_from_json
from .tb.streams import StreamDriver, StreamMonitor

CLOCK_NS = 10


async def _body(dut: Any, job: dict[str, Any]) -> dict[str, Any]:
    fields = fields_from_json(job["fields"])
    rng = random.Random(job["seed"])
    Clock(dut.clk, CLOCK_NS, unit="ns").start()
    dut.rst.value = 1
    drv = StreamDriver(dut, "i", fields, dut.clk, valid_prob=job["valid_prob"], rng=rng)
    mon = StreamMonitor(
        dut, "o", fields, dut.clk, ready_prob=job["ready_prob"], rng=random.Random(rng.random())
    )
    await ClockCycles(dut.clk, 2)
    dut.rst.value = 0
    await RisingEdge(dut.clk)
    t0 = get_sim_time("ns")
    send = cocotb.start_soon(drv.send(job["beats"]))
    received = await mon.collect(len(job["beats"]))
    await send
    cycles = round((get_sim_time("ns") - t0) / CLOCK_NS)
    return {"received": received, "cycles": cycles, "stalls": drv.stalls, "refused": mon.refused}


@cocotb.test()
async def stream_fifo(dut: Any) -> None:
    """Send the job's beats through the FIFO under the job's backpressure; record what comes out."""
    await run_job(dut, _body)
