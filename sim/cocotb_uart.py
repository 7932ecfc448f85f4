"""cocotb tests driving :class:`~pipetrain.sim.uart_bridge.UartBridgeTop`'s UART pins with a
bit-level UART model.

Runs inside the simulator (started by :class:`~pipetrain.sim.bridge.SimBridge` with
``uart_divisor=N``, or by :func:`pipetrain.sim.harness.run_cocotb` for the loopback check).

**The UART model** (:class:`UartLine`), 8N1 at ``divisor`` clock cycles per bit, as a USB-serial
bridge would drive the board's pins:

* transmit (host → ``rx_pin``): start bit 0, eight data bits LSB first, stop bit 1, each held
  for exactly ``divisor`` cycles; bytes follow each other back to back;
* receive (``tx_pin`` → host): wait for the falling edge of ``tx_pin``, re-check the start bit
  half a bit later, sample each data bit and the stop bit in the middle of the bit; a low stop
  bit raises :class:`UartFramingError` naming the bytes received so far (never a silent drop).

Bits are timed with one ``Timer`` of ``divisor`` clock periods each, placed half a period away
from the rising edges (no race with the design's registers): Python wakes once per bit while a
byte moves, never once per cycle (cocotb's ``ClockCycles`` would wake it on every edge).

**The server** (test ``serve``): after reset the bridge server
(:class:`~pipetrain.sim.tb.server.LinkServer`) accepts the host on a loopback port and serves it
until the host leaves. Host bytes are sent on ``rx_pin``; bytes decoded from ``tx_pin`` are
sent to the host as they complete. Scheduling, with no input pending:

* the clock runs (in waits of at most one byte time, ``10·divisor`` cycles, that end early on a
  falling edge of ``tx_pin`` or a rising ``net_idle``) while a byte moves on either line, while
  the link engine is busy (executing a command or sending its response), and for ``guard``
  cycles after the last activity (the RTL UART's receive latency and the UART TX start: a
  byte in flight inside the design is never missed) — then, once the network is idle (or
  ``settle_cycles`` have passed: a tick in progress has finished), the simulator blocks in
  ``select`` with the clock stopped until the host speaks;
* **frames split across TCP segments**: the server follows the host's frame structure
  (sync, header checked against the plan's command lengths, payload, CRC). When the bytes
  forwarded so far end inside a frame and the engine is waiting for the rest, the clock is
  kept stopped (up to ``partial_wait_s`` seconds of wall time) until the rest arrives, so the
  link engine's receive timeout — the board's own ``rx_timeout_s`` (21 ms of the board clock),
  not a longer simulation value — cannot fire because of the TCP split. A host that really
  stops mid-frame for longer gets the board's behaviour: the clock runs and the timeout drops
  the frame.

**Loopback check** (test ``uart_loopback``, ``plan=None`` design): sends ``job["data"]``
through the RTL UART RX → FIFO loopback → RTL UART TX and decodes the echo;
``job["bad_stop_at"]`` sends that byte with a low stop bit (the RTL drops it and latches its
framing-error LED).
"""

from __future__ import annotations

from typing import Any

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge, First, RisingEdge, Timer
from cocotb.utils import get_sim_time

from .tb.job import run_job
from .tb.server import LinkServer

__all__ = ["UartFramingError", "UartLine", "FrameTracker"]

SYNC0, SYNC1 = 0xA5, 0x5A


class UartFramingError(RuntimeError):
    """A byte from the device had a low stop bit (the message names the byte count so far)."""


class UartLine:
    """Bit-level 8N1 UART model on a design's pins.

    Parameters
    ----------
    clk: the design clock handle (rising edges at multiples of the period from time 0).
    rx_pin: the handle this model drives (the design's receive line, idle high).
    tx_pin: the handle this model samples (the design's transmit line).
    divisor: clock cycles per bit (≥ 2).
    clock_period_ps: the clock period (ps, even): bits are timed with ``Timer`` in whole
        periods, so Python wakes once per bit, not once per cycle.

    Members
    -------
    receiving: a byte is being received (from the start edge to the stop-bit sample).
    sending: a byte is being sent.
    received, sent: bytes decoded / sent so far.
    glitches: falling edges of ``tx_pin`` whose start bit was high again half a bit later.
    """

    def __init__(
        self, clk: Any, rx_pin: Any, tx_pin: Any, divisor: int, clock_period_ps: int
    ) -> None:
        if divisor < 2:
            raise ValueError(f"UART divisor must be ≥ 2 cycles per bit, got {divisor}")
        if clock_period_ps < 2 or clock_period_ps % 2:
            raise ValueError(f"the clock period must be an even number of ps: {clock_period_ps}")
        self.clk, self.rx_pin, self.tx_pin = clk, rx_pin, tx_pin
        self.divisor = int(divisor)
        self.period_ps = int(clock_period_ps)
        self._tx_end_ps = -1
        self.receiving = self.sending = False
        self.received = self.sent = self.glitches = 0

    async def send_byte(self, byte: int, stop: int = 1) -> None:
        """Drive one frame on ``rx_pin``: start 0, 8 data bits LSB first, stop bit ``stop``
        (1 = a good frame), each for ``divisor`` cycles (one wake-up per bit). Starts half a
        clock period after a rising edge (the next falling clock edge unless already there)
        and ends there, so consecutive bytes follow back to back."""
        if not 0 <= byte <= 0xFF:
            raise ValueError(f"a UART byte is 0..255, got {byte}")
        if not self._mid_phase():
            await FallingEdge(self.clk)
        self.sending = True
        try:
            for bit in (0, *((byte >> i) & 1 for i in range(8)), stop):
                self.rx_pin.value = bit
                await Timer(self.divisor * self.period_ps, "ps")
        finally:
            self.rx_pin.value = 1
            self.sending = False
        self.sent += 1
        self._tx_end_ps = get_sim_time("ps")

    def _mid_phase(self) -> bool:
        return get_sim_time("ps") == self._tx_end_ps

    async def recv_byte(self) -> int:
        """Wait for a frame on ``tx_pin`` and return its byte, each bit sampled half a clock
        period after the rising edge nearest the middle of the bit (one wake-up per bit).

        Raises :class:`UartFramingError` when the stop bit is low."""
        half, div, T = self.divisor // 2, self.divisor, self.period_ps
        while True:
            if self.tx_pin.value != 0:
                await FallingEdge(self.tx_pin)  # changes just after a rising clock edge
            self.receiving = True
            try:
                await Timer(half * T + T // 2, "ps")
                if self.tx_pin.value != 0:  # high again at mid-start-bit: a glitch
                    self.glitches += 1
                    continue
                byte = 0
                for i in range(8):
                    await Timer(div * T, "ps")
                    byte |= int(self.tx_pin.value) << i
                await Timer(div * T, "ps")
                if self.tx_pin.value != 1:
                    raise UartFramingError(
                        f"UART framing error: the stop bit of device byte {self.received} "
                        f"(0-based; {self.received} bytes received correctly before it) was "
                        f"low (data 0x{byte:02x})"
                    )
            finally:
                self.receiving = False
            self.received += 1
            return byte


class FrameTracker:
    """Follows the host → device byte stream's frame structure (docs/protocol.md §1, §3) as the
    link engine does: hunt for ``A5 5A``, read type, seq and length, drop a header whose
    type/length no command has, then count payload and CRC bytes.

    Parameters
    ----------
    length_ok: ``(type, length) -> bool``, the engine's header check
        (:meth:`~pipetrain.protocol.wire.LinkParams.command_length_ok`).

    Members
    -------
    inside: the bytes fed so far end inside a well-formed frame (more bytes are due).
    """

    def __init__(self, length_ok: Any) -> None:
        self.length_ok = length_ok
        self.reset()

    def reset(self) -> None:
        """Back to the hunt (the engine dropped, or will drop, the frame)."""
        self._state = 0  # 0 hunt, 1 seen A5, 2 header, 3 payload + CRC
        self._hdr: list[int] = []
        self._left = 0

    @property
    def inside(self) -> bool:
        return self._state >= 2

    def feed(self, byte: int) -> None:
        """Account for one byte sent to the device."""
        st = self._state
        if st == 0:
            self._state = 1 if byte == SYNC0 else 0
        elif st == 1:
            if byte == SYNC1:
                self._state, self._hdr = 2, []
            elif byte != SYNC0:
                self._state = 0
        elif st == 2:
            self._hdr.append(byte)
            if len(self._hdr) == 4:
                typ, length = self._hdr[0], self._hdr[2] | self._hdr[3] << 8
                if self.length_ok(typ, length):
                    self._state, self._left = 3, length + 4
                else:
                    self._state = 0
        else:
            self._left -= 1
            if self._left == 0:
                self._state = 0


class _Server:
    def __init__(self, dut: Any, job: dict[str, Any]) -> None:
        from ..compiler.plan import Plan
        from ..protocol.wire import LinkParams

        self.dut, self.job = dut, job
        self.div = int(job["divisor"])
        self.clock_ns = int(job["clock_ns"])
        self.byte_cycles = 10 * self.div
        self.guard = int(job.get("guard_cycles", 2 * self.div + 16))
        self.settle = int(job["settle_cycles"])
        self.partial_wait_s = float(job.get("partial_wait_s", 2.0))
        params = LinkParams.from_plan(Plan.from_json(job["plan"]))
        self.tracker = FrameTracker(params.command_length_ok)
        self.line = UartLine(dut.clk, dut.rx_pin, dut.tx_pin, self.div, 1000 * self.clock_ns)
        self.server = LinkServer(job)
        self.wakeups = self.partial_waits = self.partial_timeouts = 0
        self.t0_ns = 0.0
        self.last_activity = 0

    def cycles(self) -> int:
        return int((get_sim_time("ns") - self.t0_ns) // self.clock_ns)

    async def _run_clock(self, cycles: int) -> None:
        """Run up to ``cycles`` cycles; return early (just after a clock edge) on a falling edge
        of ``tx_pin`` or a rising ``net_idle``."""
        dut = self.dut
        cycles = max(1, min(cycles, self.byte_cycles))
        await First(
            FallingEdge(dut.tx_pin),
            RisingEdge(dut.net_idle),
            Timer(cycles * self.clock_ns - self.clock_ns // 2, "ns"),
        )
        await RisingEdge(dut.clk)
        self.wakeups += 1

    async def wait_input(self) -> bytes:
        """Return the next host bytes, running the design while it has work to do."""
        dut, line = self.dut, self.line
        while True:
            data = self.server.recv()
            if data:
                return data
            busy = dut.busy.value == 1
            idle = dut.net_idle.value == 1
            now = self.cycles()
            if busy or line.receiving:
                self.last_activity = now
            quiet = now - self.last_activity
            if self.tracker.inside and busy and not line.receiving:
                # the host is inside a frame (a TCP segment split it): the engine waits for the
                # rest, so keep the clock stopped — its receive timeout must not see the split
                self.partial_waits += 1
                if self.server.wait(self.partial_wait_s):
                    continue
                self.partial_timeouts += 1
                self.tracker.reset()  # the host really stopped: run as a board would
            elif not busy and not line.receiving and quiet >= self.guard:
                if idle or quiet > self.settle:
                    self.server.wait()  # nothing can change until the host speaks
                    continue
                await self._run_clock(self.settle + 1 - quiet)
                continue
            elif not busy and not line.receiving:
                await self._run_clock(self.guard - quiet)
                continue
            await self._run_clock(self.byte_cycles)

    async def feed(self) -> None:
        """host → ``rx_pin``, a byte at a time, back to back."""
        buf = bytearray()
        while True:
            if not buf:
                buf += await self.wait_input()
            byte = buf.pop(0)
            self.tracker.feed(byte)
            await self.line.send_byte(byte)
            self.last_activity = self.cycles()
            buf += self.server.recv()

    async def drain(self) -> None:
        """``tx_pin`` → host, each byte as soon as its stop bit is sampled."""
        try:
            while True:
                byte = await self.line.recv_byte()
                self.last_activity = self.cycles()
                self.server.send(bytes((byte,)))
        except UartFramingError as exc:
            self.server.fail(exc)  # the host sees the link fail; serve() re-raises it

    async def run(self) -> dict[str, Any]:
        await _reset(self.dut, self.clock_ns)
        self.t0_ns = get_sim_time("ns")
        await self.server.serve(self.feed, self.drain)
        return self.server.stats() | {
            "cycles": self.cycles(),
            "uart_bytes_sent": self.line.sent,
            "uart_bytes_received": self.line.received,
            "uart_glitches": self.line.glitches,
            "wakeups": self.wakeups,
            "partial_waits": self.partial_waits,
            "partial_timeouts": self.partial_timeouts,
            "divisor": self.div,
        }


async def _reset(dut: Any, clock_ns: int) -> None:
    Clock(dut.clk, clock_ns, unit="ns").start()
    dut.rst.value = 1
    dut.rx_pin.value = 1
    await ClockCycles(dut.clk, 3)
    dut.rst.value = 0
    await RisingEdge(dut.clk)


async def _serve_body(dut: Any, job: dict[str, Any]) -> dict[str, Any]:
    return await _Server(dut, job).run()


async def _loopback_body(dut: Any, job: dict[str, Any]) -> dict[str, Any]:
    div, clock_ns = int(job["divisor"]), int(job.get("clock_ns", 10))
    data = [int(b) for b in job["data"]]
    bad = job.get("bad_stop_at")
    await _reset(dut, clock_ns)
    await ClockCycles(dut.clk, 4 * div)  # the receiver leaves WAIT-HIGH
    t0 = get_sim_time("ns")
    line = UartLine(dut.clk, dut.rx_pin, dut.tx_pin, div, 1000 * clock_ns)
    got: list[int] = []
    want = len(data) - (bad is not None)

    async def receive() -> None:
        while len(got) < want:
            got.append(await line.recv_byte())

    rx = cocotb.start_soon(receive())
    for k, byte in enumerate(data):
        if k == bad:
            await line.send_byte(byte, stop=0)
            await ClockCycles(dut.clk, 2 * div)  # the line idles high: the RX leaves WAIT-HIGH
        else:
            await line.send_byte(byte)
    limit = 20 * div * (len(data) + 4)
    await First(rx, Timer(limit * clock_ns, "ns"))
    rx.cancel()
    await ClockCycles(dut.clk, 2 * div)
    return {
        "received": got,
        "cycles": round((get_sim_time("ns") - t0) / clock_ns),
        "leds": int(dut.leds.value),
        "glitches": line.glitches,
    }


@cocotb.test()
async def serve(dut: Any) -> None:
    """Serve the host link on a TCP port through the design's UART pins until the host leaves."""
    await run_job(dut, _serve_body)


@cocotb.test()
async def uart_loopback(dut: Any) -> None:
    """Send bytes through the RTL UART and the board's FIFO loopback; decode the echo."""
    await run_job(dut, _loopback_body)
