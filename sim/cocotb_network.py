"""cocotb testbench of the network top (docs/ports.md); runs inside Verilator.

It executes a *job* — a list of operations built by :mod:`pipetrain.sim.tb.network` — against
``NetworkTop`` and writes everything it observed; the comparison with the golden model happens
in the caller, outside the simulator.

Job keys: ``fields`` (flat payload layouts of ``sample_in``, ``result_out``, ``wacc_cmd``,
``wacc_rsp``), ``in_features`` N, ``counters`` (saturation counters), ``heads``, ``clock_ns``,
``valid_prob`` / ``ready_prob`` / ``seed`` (handshake randomisation of every stream; 1.0 =
free-running), ``timeout_cycles`` and ``ops``, each one of:

* ``{"op": "wacc", "cmds": [[write, stage, kind, row, col, data], …]}`` → ``{"data": [...]}``,
  one response per command, in order (commands and responses pipelined);
* ``{"op": "stream", "samples": [[x_0 … x_{N−1}, label, train], …]}`` → beat and cycle counts
  (``N`` beats per sample; ``label``/``train`` only on the ``last`` beat, so a design that
  takes them from another beat is caught);
* ``{"op": "flush"}``: holds ``flush`` high until every streamed sample's result has arrived
  and ``idle`` is high;
* ``{"op": "counters"}`` → ``samples_trained``, ``ticks``, ``saturations`` (``counters``
  values), and ``head_correct`` (``heads`` values, with auxiliary heads).

Result: ``{"ops": [...], "results": [{sample, pred, loss, train}, …], "result_cycles": [...]
(clock edge after each result's transfer, counted from the end of reset), "cycles": total,
"handshakes": backpressure seen (randomised mode: beats refused by the DUT, beats offered
while the bench held ready low)}``. Each op result also has ``wall_s`` and ``sim_cycles``.
"""

from __future__ import annotations

import random
import time
from typing import Any

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Event, ReadOnly, RisingEdge, with_timeout
from cocotb.utils import get_sim_time

from .tb.job import run_job
from .tb.layout import fields_from_json
from .tb.streams import StreamDriver, StreamMonitor


class _Bench:
    def __init__(self, dut: Any, job: dict[str, Any]) -> None:
        self.dut, self.job = dut, job
        self.clock_ns = int(job.get("clock_ns", 10))
        f = {k: fields_from_json(v) for k, v in job["fields"].items()}
        rng = random.Random(job.get("seed", 0))
        vp, rp = float(job.get("valid_prob", 1.0)), float(job.get("ready_prob", 1.0))
        sub = lambda: random.Random(rng.getrandbits(64))  # noqa: E731
        # hdl/top.py: sample_in.ready = ~pending (a register), never a function of valid
        self.samples = StreamDriver(
            dut,
            "sample_in",
            f["sample_in"],
            dut.clk,
            valid_prob=vp,
            rng=sub(),
            ready_registered=bool(job.get("ready_registered", True)),
        )
        self.results = StreamMonitor(
            dut, "result_out", f["result_out"], dut.clk, ready_prob=rp, rng=sub()
        )
        self.cmds = StreamDriver(dut, "wacc_cmd", f["wacc_cmd"], dut.clk, valid_prob=vp, rng=sub())
        self.rsps = StreamMonitor(dut, "wacc_rsp", f["wacc_rsp"], dut.clk, ready_prob=rp, rng=sub())
        self.N = int(job["in_features"])
        self.sent = 0  # samples fully streamed
        self.result_times: list[int] = []
        self.got_result = Event()
        self.current = "reset"
        self.t0 = 0

    def now(self) -> int:
        """Clock edges since reset was released."""
        return int(get_sim_time("ns") // self.clock_ns) - self.t0

    async def collect_results(self) -> None:
        """Background task: take result records for ever, timestamping each."""
        while True:
            await self.results.collect(1)
            self.result_times.append(self.now())
            self.got_result.set()

    async def op_wacc(self, op: dict[str, Any]) -> dict[str, Any]:
        beats = [
            {"write": w, "stage": s, "kind": k, "row": r, "col": c, "data": d}
            for w, s, k, r, c, d in op["cmds"]
        ]
        t = self.now()
        send = cocotb.start_soon(self.cmds.send(beats))
        rsp = await self.rsps.collect(len(beats))
        await send
        return {"data": [b["data"] for b in rsp], "cycles": self.now() - t}

    async def op_stream(self, op: dict[str, Any]) -> dict[str, Any]:
        N = self.N
        beats: list[dict[str, int]] = []
        for row in op["samples"]:
            x, label, train = row[:N], row[N], row[N + 1]
            for i, xi in enumerate(x):
                last = i == N - 1
                beats.append(
                    {
                        "x": xi,
                        "label": label if last else 0,
                        "train": train if last else 0,
                        "last": int(last),
                    }
                )
        t = self.now()
        await self.samples.send(beats)
        self.sent += len(op["samples"])
        return {"beats": len(beats), "cycles": self.now() - t, "start": t}

    async def op_flush(self, op: dict[str, Any]) -> dict[str, Any]:
        dut = self.dut
        t = self.now()
        dut.flush.value = 1
        while len(self.results.beats) < self.sent:  # free-run until the last result is out
            self.got_result.clear()
            await self.got_result.wait()
        await ReadOnly()
        while dut.idle.value != 1:
            await RisingEdge(dut.idle)
            await ReadOnly()
        await RisingEdge(dut.clk)
        dut.flush.value = 0
        return {"cycles": self.now() - t}

    async def op_counters(self, op: dict[str, Any]) -> dict[str, Any]:
        dut = self.dut
        await ReadOnly()
        n = int(self.job["counters"])
        if hasattr(dut, "saturations__0"):  # Out(32).array(S + 1): one port per element
            sats = [getattr(dut, f"saturations__{i}").value.to_unsigned() for i in range(n)]
        else:  # one packed port
            raw = dut.saturations.value.to_unsigned()
            sats = [(raw >> (32 * i)) & 0xFFFFFFFF for i in range(n)]
        out = {
            "samples_trained": dut.samples_trained.value.to_unsigned(),
            "ticks": dut.ticks.value.to_unsigned(),
            "saturations": sats,
        }
        heads = int(self.job.get("heads", 0))
        if heads and hasattr(dut, "head_correct__0"):
            out["head_correct"] = [
                getattr(dut, f"head_correct__{k}").value.to_unsigned() for k in range(heads)
            ]
        elif heads:  # one packed port
            raw = dut.head_correct.value.to_unsigned()
            out["head_correct"] = [(raw >> (32 * k)) & 0xFFFFFFFF for k in range(heads)]
        await RisingEdge(dut.clk)
        return out

    async def run(self) -> dict[str, Any]:
        dut = self.dut
        Clock(dut.clk, self.clock_ns, unit="ns").start()
        dut.rst.value = 1
        dut.flush.value = 0
        await ClockCycles(dut.clk, 3)
        dut.rst.value = 0
        await RisingEdge(dut.clk)
        self.t0 = self.now()
        bg = cocotb.start_soon(self.collect_results())
        ops = []
        handlers = {
            "wacc": self.op_wacc,
            "stream": self.op_stream,
            "flush": self.op_flush,
            "counters": self.op_counters,
        }
        for op in self.job["ops"]:
            self.current = op["op"]
            t_wall, t_sim = time.perf_counter(), self.now()
            r = await handlers[op["op"]](op)
            r["wall_s"] = time.perf_counter() - t_wall
            r["sim_cycles"] = self.now() - t_sim
            ops.append(r)
        bg.cancel()
        return {
            "ops": ops,
            "results": self.results.beats,
            "result_cycles": self.result_times,
            "cycles": self.now(),
            "handshakes": {
                "sample_in_stalls": self.samples.stalls,
                "result_out_refused": self.results.refused,
                "wacc_cmd_stalls": self.cmds.stalls,
                "wacc_rsp_refused": self.rsps.refused,
            },
        }


async def _body(dut: Any, job: dict[str, Any]) -> dict[str, Any]:
    bench = _Bench(dut, job)
    timeout_ns = int(job["timeout_cycles"]) * bench.clock_ns
    try:
        return await with_timeout(bench.run(), timeout_ns, "ns")
    except TimeoutError as exc:  # cocotb's SimTimeoutError derives from TimeoutError
        raise TimeoutError(
            f"no progress within {job['timeout_cycles']} cycles in op {bench.current!r}: "
            f"{len(bench.results.beats)} of {bench.sent} results, "
            f"{bench.samples.accepted} sample beats and {bench.cmds.accepted} weight commands "
            f"accepted, {len(bench.rsps.beats)} responses"
        ) from exc


@cocotb.test()
async def network(dut: Any) -> None:
    """Run the job's operations on ``NetworkTop`` and record what it did."""
    await run_job(dut, _body)
