"""cocotb test serving :class:`~pipetrain.sim.bridge.BridgeTop`'s byte streams on a TCP port.

Runs inside Verilator (started by :class:`~pipetrain.sim.bridge.SimBridge`). After reset it
listens on ``127.0.0.1`` (``job["port"]``, 0 = any), writes ``{"port", "pid"}`` to
``job["port_file"]``, accepts one connection and serves it until the host closes it; then it
returns its statistics (written by the runner to the job's result file).

Scheduling (what keeps Python off the per-cycle path, docs/architecture.md §6):

* host → design: each bridge word (up to W bytes) is one ``valid`` beat; while the word buffer
  drains the coroutine sleeps on ``RisingEdge(i.ready)``;
* design → host: ``o.ready`` stays high; the coroutine sleeps on ``RisingEdge(o.valid)`` and
  sends each word's bytes at once;
* no input pending: while the design is busy (or for ``settle_cycles`` after, so a tick in
  progress finishes) the clock runs ``chunk_cycles`` at a time between non-blocking polls of
  the socket; once it is quiet the simulator blocks in ``select`` with the clock stopped
  (simulated time does not advance while nothing can happen).

The socket is served until the host closes it, the host process (``job["parent_pid"]``) dies,
or no connection arrives within ``accept_timeout_s``.
"""

from __future__ import annotations

import json
import os
import select
import socket
import time
from typing import Any

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, First, ReadOnly, RisingEdge, Timer
from cocotb.utils import get_sim_time

from .tb.job import run_job


class _Closed(Exception):
    """The host closed the connection."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - exists, owned by another user
        return True
    return True


class _Bridge:
    def __init__(self, dut: Any, job: dict[str, Any]) -> None:
        self.dut, self.job = dut, job
        self.W = int(job["word_bytes"])
        self.clock_ns = int(job["clock_ns"])
        self.chunk = max(1, int(job["chunk_cycles"]))
        self.settle = int(job["settle_cycles"])
        self.busy_wait = max(self.chunk, int(job.get("busy_wait_cycles", 4096)))
        self.parent = int(job.get("parent_pid", 0))
        self.conn: socket.socket | None = None
        self.bytes_in = self.bytes_out = 0
        self.wakeups = 0
        self.blocked_s = 0.0
        self.t0_ns = 0.0

    def cycles(self) -> int:
        return round((get_sim_time("ns") - self.t0_ns) / self.clock_ns)

    def _recv(self) -> bytes:
        """Non-blocking read; raises _Closed when the host has closed the connection."""
        assert self.conn is not None
        try:
            data = self.conn.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return b""
        except OSError as exc:  # reset by peer
            raise _Closed from exc
        if not data:
            raise _Closed
        self.bytes_in += len(data)
        return data

    async def wait_input(self) -> bytes:
        """Return the next host bytes, running the design while it has work to do."""
        dut = self.dut
        quiet = 0
        while True:
            data = self._recv()
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
                t = time.perf_counter()
                while True:
                    r, _, _ = select.select([self.conn], [], [], 1.0)
                    if r:
                        break
                    if self.parent and not _alive(self.parent):
                        raise _Closed
                self.blocked_s += time.perf_counter() - t
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
                buf += self._recv()
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
        assert self.conn is not None
        while True:
            await ReadOnly()
            if dut.o__valid.value == 1:
                v = dut.o__payload.value.to_unsigned()
                n = v >> (8 * W)
                out = (v & mask).to_bytes(W, "little")[:n]
                self.conn.sendall(out)
                self.bytes_out += n
                await RisingEdge(dut.clk)
            else:
                await RisingEdge(dut.o__valid)
            self.wakeups += 1

    async def run(self) -> dict[str, Any]:
        dut, job = self.dut, self.job
        Clock(dut.clk, self.clock_ns, unit="ns").start()
        dut.rst.value = 1
        dut.i__valid.value = 0
        dut.o__ready.value = 1
        await ClockCycles(dut.clk, 3)
        dut.rst.value = 0
        await RisingEdge(dut.clk)
        self.t0_ns = get_sim_time("ns")

        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", int(job.get("port", 0))))
        srv.listen(1)
        port = srv.getsockname()[1]
        tmp = f"{job['port_file']}.tmp"
        with open(tmp, "w") as f:
            json.dump({"port": port, "pid": os.getpid()}, f)
        os.replace(tmp, job["port_file"])
        srv.settimeout(float(job.get("accept_timeout_s", 60.0)))
        try:
            self.conn, _ = srv.accept()
        except TimeoutError as exc:
            raise TimeoutError(
                f"no host connected to 127.0.0.1:{port} within {job['accept_timeout_s']} s"
            ) from exc
        finally:
            srv.close()
        self.conn.setblocking(True)
        self.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t_wall = time.perf_counter()
        tx = cocotb.start_soon(self.drain())
        try:
            await self.feed()
        except _Closed:
            pass
        finally:
            tx.cancel()
            self.conn.close()
        return {
            "port": port,
            "cycles": self.cycles(),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "wakeups": self.wakeups,
            "serve_s": time.perf_counter() - t_wall,
            "blocked_s": self.blocked_s,
        }


async def _body(dut: Any, job: dict[str, Any]) -> dict[str, Any]:
    return await _Bridge(dut, job).run()


@cocotb.test()
async def serve(dut: Any) -> None:
    """Serve the link byte stream of the design on a TCP port until the host disconnects."""
    await run_job(dut, _body)
