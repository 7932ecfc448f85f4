"""The ``sim`` link target: the RTL (``LinkEngine`` ↔ ``NetworkTop``) in an RTL simulator
(Verilator by default, or Icarus), serving the link byte stream on a loopback TCP port.

Pieces:

* :class:`BridgeTop` — the simulated design: :class:`~pipetrain.hdl.link.LinkEngine` in front of
  :class:`~pipetrain.hdl.top.NetworkTop`, as the board core wires them, with the host byte
  streams widened to ``W``-byte words (a word in, a word out per Python interaction; the
  engine still moves one byte per cycle). The receive timeout is off: TCP neither loses nor
  truncates bytes, and the simulator stops its clock while it waits for the host.
* :func:`build_bridge` — Verilog + build through the harness (:mod:`pipetrain.sim.harness`),
  cached by plan, generator sources, word width and simulator (a cache hit skips even the
  Verilog generation).
* :mod:`pipetrain.sim.cocotb_bridge` — the cocotb test that runs the design and serves the
  byte stream on ``127.0.0.1`` through the bridge server (:mod:`pipetrain.sim.tb.server`).
* :class:`SimBridge` — started and stopped by the host: builds, runs the simulator in a
  subprocess (its own process group), waits for the port, and shuts it down cleanly (closing
  the connection ends the simulation; a process that does not exit is killed).

UART level: ``SimBridge(plan, uart_divisor=8)`` simulates the board top instead — UART pins
driven by a bit-level UART model, ``divisor`` clock cycles per bit
(:mod:`pipetrain.sim.uart_bridge`, :mod:`pipetrain.sim.cocotb_uart`).

Host use: ``with SimBridge(plan) as sim: LinkClient(TcpTransport("127.0.0.1", sim.port), plan)``
(:func:`pipetrain.host.open` does this for ``target="sim"``; ``sim_options={"simulator":
"icarus"}`` picks the simulator).

Speed (*derived*, docs/architecture.md §6): Python is woken per word and per polling chunk, never
per cycle
in between, so the design free-runs between interactions.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amaranth import Module, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from ..compiler.plan import Plan
from .harness import (
    DEFAULT_SIMULATOR,
    RTLBuild,
    RTLSimError,
    cached_design,
    check_simulator,
    design_cached,
    tail,
)

__all__ = [
    "BridgeTop",
    "BridgeDesign",
    "SimBridge",
    "SimBridgeError",
    "build_bridge",
    "bridge_cached",
    "word_layout",
    "DEFAULT_WORD_BYTES",
    "TOPLEVEL",
]

#: Bytes per word on the widened host streams (one Python interaction moves up to this many).
DEFAULT_WORD_BYTES = 64
#: Verilog top module name of the bridge design.
TOPLEVEL = "pipetrain_bridge"
#: The cocotb test module that serves the byte stream.
TB_MODULE = "pipetrain.sim.cocotb_bridge"
#: The cocotb test module that serves it through the UART pins (``uart_divisor`` set).
UART_TB_MODULE = "pipetrain.sim.cocotb_uart"
#: Bump when the bridge's job protocol changes (invalidates the index; a change of this file or
#: of the generator's sources does so by itself).
BRIDGE_VERSION = 2
CLOCK_NS = 10


class SimBridgeError(RTLSimError):
    """The simulation target could not be started (the port never opened) or died."""


def word_layout(word_bytes: int) -> data.StructLayout:
    """``{data: unsigned(8·W), count: unsigned(bits_for(W))}``: ``count`` bytes (1..W) of
    ``data``, byte 0 in bits 0..7."""
    return data.StructLayout(
        {"data": unsigned(8 * word_bytes), "count": unsigned(bits_for(word_bytes))}
    )


class BridgeTop(wiring.Component):
    """``LinkEngine(plan)`` ↔ ``NetworkTop(plan)`` behind ``W``-byte word streams (simulation).

    Parameters
    ----------
    plan: the design plan.
    word_bytes: W, bytes per word on ``i``/``o`` (1..255).

    Members
    -------
    i: ``In(stream.Signature(word_layout(W)))`` host bytes; a beat carries ``count`` bytes,
        fed to the engine one per cycle (``ready`` while the word buffer is empty).
    o: ``Out(stream.Signature(word_layout(W)))`` device bytes, packed W to a word; a partial
        word is sent as soon as the engine pauses its output for a cycle.
    busy: ``Out(1)`` the engine is inside a frame, executing or sending, or a word buffer
        holds bytes (while low and ``net_idle`` is high nothing can change without input).
    net_idle: ``Out(1)`` the network's ``idle`` (no sample in flight, no tick running).
    """

    def __init__(
        self, plan: Plan, word_bytes: int = DEFAULT_WORD_BYTES, onchip_samples: int = 0
    ) -> None:
        if not 1 <= word_bytes <= 255:
            raise ValueError(f"word_bytes must be in 1..255, got {word_bytes}")
        self.plan = plan
        self.word_bytes = word_bytes
        self.onchip_samples = onchip_samples
        layout = word_layout(word_bytes)
        super().__init__(
            {
                "i": In(stream.Signature(layout)),
                "o": Out(stream.Signature(layout)),
                "busy": Out(1),
                "net_idle": Out(1),
            }
        )

    def elaborate(self, platform: Any) -> Module:
        from ..hdl.link import LinkEngine
        from ..hdl.top import NetworkTop

        m = Module()
        W = self.word_bytes
        m.submodules.link = link = LinkEngine(
            self.plan, rx_timeout=0, onchip_samples=self.onchip_samples
        )
        m.submodules.net = net = NetworkTop(self.plan)
        wiring.connect(m, link.net, net)

        # host → engine: one word buffer, shifted out a byte per cycle
        ibuf = Signal(8 * W)
        icount = Signal(range(W + 1))
        m.d.comb += [
            self.i.ready.eq(icount == 0),
            link.rx.payload.eq(ibuf[:8]),
            link.rx.valid.eq(icount != 0),
        ]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [ibuf.eq(self.i.payload.data), icount.eq(self.i.payload.count)]
        with m.Elif(link.rx.valid & link.rx.ready):
            m.d.sync += [ibuf.eq(ibuf >> 8), icount.eq(icount - 1)]

        # engine → host: bytes packed into a word; sent when full or when the engine pauses
        obuf = Signal(8 * W)
        ocount = Signal(range(W + 1))
        ofull = Signal()
        m.d.comb += [
            link.tx.ready.eq(~ofull),
            self.o.valid.eq(ofull),
            self.o.payload.data.eq(obuf),
            self.o.payload.count.eq(ocount),
        ]
        with m.If(ofull):
            with m.If(self.o.ready):
                m.d.sync += [ofull.eq(0), ocount.eq(0), obuf.eq(0)]
        with m.Elif(link.tx.valid):
            m.d.sync += [obuf.word_select(ocount, 8).eq(link.tx.payload), ocount.eq(ocount + 1)]
            with m.If(ocount == W - 1):
                m.d.sync += ofull.eq(1)
        with m.Elif(ocount != 0):
            m.d.sync += ofull.eq(1)

        m.d.comb += [
            self.busy.eq(link.busy | (icount != 0) | (ocount != 0) | ofull),
            self.net_idle.eq(net.idle),
        ]
        return m


@dataclass(frozen=True)
class BridgeDesign:
    """A built bridge simulation.

    Members
    -------
    plan: the plan the design was generated from.
    build: the RTL build (``build.simulator`` names the simulator).
    word_bytes: W of the word streams.
    build_s: seconds this call spent (Verilog generation + build); ~0 when cached.
    cached: whether an earlier build was reused.
    """

    plan: Plan
    build: RTLBuild
    word_bytes: int
    build_s: float
    cached: bool


def build_bridge(
    plan: Plan,
    word_bytes: int = DEFAULT_WORD_BYTES,
    *,
    simulator: str = DEFAULT_SIMULATOR,
    rebuild: bool = False,
    onchip_samples: int = 0,
) -> BridgeDesign:
    """Generate and build :class:`BridgeTop` for ``plan`` with ``simulator`` (cached by the
    plan, the generator's sources, ``word_bytes`` and the build recipe: an unchanged design
    skips the Verilog generation too).

    Raises :class:`ValueError` for an unknown simulator,
    :class:`~pipetrain.sim.harness.ToolchainError` when the simulator's tools are missing and
    :class:`~pipetrain.sim.harness.RTLSimError` (with the log's tail) when the build fails.
    """
    t0 = time.perf_counter()

    def generate() -> str:
        from amaranth.back import verilog

        return verilog.convert(BridgeTop(plan, word_bytes, onchip_samples), name=TOPLEVEL)

    build, _ = cached_design(
        "bridge",
        TOPLEVEL,
        _identity(plan, word_bytes) + (f"|onchip={onchip_samples}" if onchip_samples else ""),
        generate,
        simulator=simulator,
        sources=[__file__],
        rebuild=rebuild,
    )
    return BridgeDesign(plan, build, word_bytes, time.perf_counter() - t0, build.cached)


def _identity(plan: Plan, word_bytes: int) -> str:
    return f"{plan.to_json()}|{word_bytes}|{BRIDGE_VERSION}"


def bridge_cached(
    plan: Plan, word_bytes: int = DEFAULT_WORD_BYTES, *, simulator: str = DEFAULT_SIMULATOR
) -> bool:
    """Whether :func:`build_bridge` would reuse a finished build of this design (no build
    runs; :func:`pipetrain.sim.harness.design_cached`)."""
    return design_cached(
        "bridge", TOPLEVEL, _identity(plan, word_bytes), simulator=simulator, sources=[__file__]
    )


class SimBridge:
    """Runs the bridge simulation in a subprocess and serves the link on ``127.0.0.1:port``.

    Parameters
    ----------
    plan: the design plan.
    word_bytes: W of the word streams (:class:`BridgeTop`).
    chunk_cycles: cycles the simulator runs between two polls of the socket while the design
        is busy (latency of a new command ≤ this many cycles).
    startup_timeout: seconds to wait for the port to open (the simulator process start, not the
        build, which happens before in this process).
    port: TCP port to listen on (0 = any free one).
    work_dir: where the run's job, log and stats go (default: a temporary directory).
    uart_divisor: None serves the word streams of :class:`BridgeTop`; an integer N (≥
        :data:`~pipetrain.hdl.uart.MIN_DIVISOR`) simulates the board top instead
        (:class:`~pipetrain.sim.uart_bridge.UartBridgeTop`: ``BoardTop`` around ``NetworkCore``
        at ``plan.clock_hz``, N clock cycles per UART bit), every byte moved as an 8N1 frame on
        its pins by a bit-level UART model (:mod:`pipetrain.sim.cocotb_uart`).
    rx_timeout_s: (UART level) the link engine's receive timeout in seconds of
        ``plan.clock_hz``, as on a board (default the board core's 21 ms); TCP splits of a frame
        cannot trigger it (the server stops the clock while it waits for the rest).
    simulator: ``"verilator"`` (default) or ``"icarus"`` (:data:`~pipetrain.sim.harness.
        SIMULATORS`; Icarus runs 40–300× slower: small plans only, :mod:`pipetrain.sim.icarus`).
    onchip_samples: capacity of the link engine's on-chip training set (samples; 0: none;
        docs/protocol.md §2 STORE/RUN).

    Use as a context manager, or call :meth:`start` and :meth:`close`. Members after
    :meth:`start`: ``port``, ``url`` (``tcp://127.0.0.1:PORT``), ``design`` (the build);
    after :meth:`close`: ``stats`` (``cycles``, ``bytes_in``, ``bytes_out``, ``wakeups``,
    ``python_s``, ``wall_s`` of the simulator process; UART level adds ``uart_bytes_sent``,
    ``uart_bytes_received``, ``partial_waits``, ``divisor``).

    Raises :class:`ValueError` for an unknown ``simulator`` (at construction),
    :class:`~pipetrain.sim.harness.ToolchainError`/:class:`RTLSimError` from the build,
    :class:`~pipetrain.hdl.uart.UARTError` for a ``uart_divisor`` below ``MIN_DIVISOR``, and
    :class:`SimBridgeError` when the simulator exits or stays silent before the port opens
    (the message carries the simulator log's tail).
    """

    def __init__(
        self,
        plan: Plan,
        *,
        word_bytes: int = DEFAULT_WORD_BYTES,
        chunk_cycles: int = 32,
        startup_timeout: float = 60.0,
        port: int = 0,
        work_dir: str | os.PathLike | None = None,
        uart_divisor: int | None = None,
        rx_timeout_s: float | None = None,
        simulator: str = DEFAULT_SIMULATOR,
        onchip_samples: int = 0,
    ) -> None:
        self.simulator = check_simulator(simulator)
        self.onchip_samples = onchip_samples
        self.plan = plan
        self.uart_divisor = uart_divisor
        self.rx_timeout_s = rx_timeout_s
        self.word_bytes = word_bytes
        self.chunk_cycles = chunk_cycles
        self.startup_timeout = startup_timeout
        self.requested_port = port
        self._work_dir = Path(work_dir) if work_dir is not None else None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.design: Any = None  # BridgeDesign, or UartBridgeDesign at UART level
        self.stats: dict[str, Any] | None = None

    @property
    def url(self) -> str:
        """``tcp://127.0.0.1:PORT`` (after :meth:`start`)."""
        if self.port is None:
            raise SimBridgeError("the simulation target is not running")
        return f"tcp://127.0.0.1:{self.port}"

    def start(self) -> SimBridge:
        """Build (cached), start the simulator and wait until its port is open."""
        if self.uart_divisor is None:
            self.design = build_bridge(
                self.plan,
                self.word_bytes,
                simulator=self.simulator,
                onchip_samples=self.onchip_samples,
            )
        else:
            from .uart_bridge import RX_TIMEOUT_S, build_uart_bridge

            tmo = RX_TIMEOUT_S if self.rx_timeout_s is None else self.rx_timeout_s
            self.design = build_uart_bridge(
                self.plan,
                self.uart_divisor,
                rx_timeout_s=tmo,
                simulator=self.simulator,
                onchip_samples=self.onchip_samples,
            )
        if self._work_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="pt-bridge-")
            self._work_dir = Path(self._tmp.name)
        wd = self._work_dir
        wd.mkdir(parents=True, exist_ok=True)
        port_file, stats_file = wd / "port.json", wd / "stats.json"
        for f in (port_file, stats_file):
            f.unlink(missing_ok=True)
        job = {
            "build": self.design.build.to_json(),
            "word_bytes": self.word_bytes,
            "clock_ns": CLOCK_NS,
            "chunk_cycles": self.chunk_cycles,
            # after the engine goes quiet, run on until the network's tick in progress and a
            # pending sample's tick have finished, then stop the clock until the host speaks
            "settle_cycles": 2 * self.plan.tick_cycles + 64,
            "port": self.requested_port,
            "port_file": str(port_file),
            "stats_file": str(stats_file),
            "accept_timeout_s": self.startup_timeout,
            "parent_pid": os.getpid(),
        }
        if self.uart_divisor is not None:
            job |= {
                "tb_module": UART_TB_MODULE,
                "testcase": "serve",
                "divisor": self.uart_divisor,
                "plan": self.plan.to_json(),
            }
        job_file = wd / "bridge_job.json"
        job_file.write_text(json.dumps(job))
        self._log = wd / "bridge.log"
        with open(self._log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pipetrain.sim.bridge", str(job_file)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: close() can end it whole
            )
        deadline = time.monotonic() + self.startup_timeout
        while not port_file.is_file():
            if self.proc.poll() is not None:
                raise SimBridgeError(
                    f"the RTL simulation exited (status {self.proc.returncode}) before opening "
                    f"its port; log tail:\n{self._logtail()}"
                )
            if time.monotonic() > deadline:
                self._kill()
                raise SimBridgeError(
                    f"the RTL simulation did not open its port within {self.startup_timeout:.0f}"
                    f" s; log tail:\n{self._logtail()}"
                )
            time.sleep(0.02)
        self.port = int(json.loads(port_file.read_text())["port"])
        return self

    def _logtail(self) -> str:
        wd = self._work_dir
        parts = [tail(self._log, 30)]
        sim_log = wd / "run" / "sim.log" if wd else None
        if sim_log is not None and sim_log.is_file():
            parts.append(tail(sim_log, 30))
        return "\n".join(parts)

    def _kill(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=5)
                return
            except subprocess.TimeoutExpired:
                continue

    def close(self, timeout: float = 30.0) -> dict[str, Any] | None:
        """Wait for the simulator to end (the host closes its connection first) and return its
        stats; after ``timeout`` seconds it is killed (stats None). Idempotent."""
        if self.proc is not None:
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._kill()
            stats_file = self._work_dir / "stats.json" if self._work_dir else None
            if stats_file is not None and stats_file.is_file():
                self.stats = json.loads(stats_file.read_text())
            self.proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        return self.stats

    def terminate(self) -> None:
        """End the simulator at once (process group SIGTERM, then SIGKILL)."""
        self._kill()
        self.close(timeout=0)

    def __enter__(self) -> SimBridge:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _serve(job_file: str) -> int:
    """Subprocess entry: run the cocotb bridge test on the build named in the job."""
    from .harness import ToolchainError, run_cocotb

    job = json.loads(Path(job_file).read_text())
    build = RTLBuild.from_json(job["build"])
    work = Path(job_file).parent / "run"
    try:
        tb = job.get("tb_module", TB_MODULE)
        result = run_cocotb(build, tb, job, work_dir=work, testcase=job.get("testcase"))
    except (RTLSimError, ToolchainError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    tmp = f"{job['stats_file']}.tmp"
    Path(tmp).write_text(json.dumps(result))
    os.replace(tmp, job["stats_file"])
    return 0


if __name__ == "__main__":
    sys.exit(_serve(sys.argv[1]))
