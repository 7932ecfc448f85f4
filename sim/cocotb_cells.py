"""cocotb test that applies input vectors to a combinational cell and records its outputs (the
vendor-cell models' own tests, tests/test_postsynth.py; runs in Icarus or Verilator).

Job: ``{"inputs": [port, ...], "outputs": [port, ...], "vectors": [[value, ...], ...]}`` —
each vector gives one value per input port. Result: ``{"outputs": [[value, ...], ...]}``, the
output ports' values (unsigned integers) 1 ns after each vector was applied.
"""

from __future__ import annotations

from typing import Any

import cocotb
from cocotb.triggers import Timer

from .tb.job import run_job


async def _body(dut: Any, job: dict[str, Any]) -> dict[str, Any]:
    ins = [getattr(dut, name) for name in job["inputs"]]
    outs = [getattr(dut, name) for name in job["outputs"]]
    got = []
    for vec in job["vectors"]:
        for port, value in zip(ins, vec, strict=True):
            port.value = value
        await Timer(1, unit="ns")
        got.append([int(port.value) for port in outs])
    return {"outputs": got}


@cocotb.test()
async def cell_vectors(dut: Any) -> None:
    """Apply the job's vectors one per nanosecond; record the outputs."""
    await run_job(dut, _body)
