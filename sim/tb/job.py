"""Job/result plumbing between a caller and a cocotb test running inside the simulator.

The caller (:func:`pipetrain.sim.verilator.run_cocotb`) writes a JSON job and names it in
``$PIPETRAIN_JOB``; the cocotb test calls :func:`run_job` with its body, which receives the job
and returns a JSON-ready dict. :func:`run_job` writes that dict to ``$PIPETRAIN_RESULT`` — or,
if the body raises, ``{"error": "<type>: <message>", "traceback": …}`` — so the caller always
gets a reason instead of a bare non-zero exit.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["load_job", "write_result", "run_job"]


def load_job() -> dict[str, Any]:
    """Return the job dict named by ``$PIPETRAIN_JOB`` (KeyError if the variable is unset)."""
    with open(os.environ["PIPETRAIN_JOB"]) as f:
        return json.load(f)


def write_result(result: dict[str, Any]) -> None:
    """Write ``result`` as JSON to ``$PIPETRAIN_RESULT``."""
    path = os.environ["PIPETRAIN_RESULT"]
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, path)


async def run_job(
    dut: Any, body: Callable[[Any, dict[str, Any]], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    """Run ``body(dut, job)`` and write its result (or the error) for the caller.

    Adds ``"python_s"``: wall seconds spent inside the body. Re-raises the body's exception
    after writing it, so cocotb also reports the test as failed.
    """
    job = load_job()
    t0 = time.perf_counter()
    try:
        result = await body(dut, job)
    except BaseException as exc:
        write_result({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        raise
    result["python_s"] = time.perf_counter() - t0
    write_result(result)
    return result
