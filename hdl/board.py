"""Board tops: board clock, UART pins, heartbeat LED, and a byte-stream core behind the UART.

A board top wires ``UART RX → core.i`` and ``core.o → UART TX``, where the core is any
``lib.wiring`` component with an 8-bit byte stream in (``i``) and out (``o``): the link engine
in front of :class:`~pipetrain.hdl.top.NetworkTop` for a training design
(:func:`network_core`), or a FIFO loopback (:class:`Loopback`) to prove a board's UART and
toolchain flow without a network.

Clocking: the network runs at ``clock_hz`` (default the board's network clock
``board.clock_hz``, the clock its plans assume: ULX3S 87.5 MHz, iCEBreaker 24 MHz), made from
the oscillator (``board.osc_hz``: 25 MHz, 12 MHz) by the FPGA's PLL (:class:`~pipetrain.hdl.pll.
PLLClock`: ``EHXPLLL`` / ``SB_PLL40_PAD``, the ``sync`` domain held in reset until the PLL locks);
a ``clock_hz`` equal to the oscillator uses the platform's own ``sync`` domain, without a PLL.
The UART divisor, the heartbeat and the link's receive timeout count cycles of ``clock_hz``. In
simulation (no platform) ``sync`` is the network clock itself: no PLL, no cell model.
The bitstream build picks ``clock_hz`` below the achieved Fmax (:func:`pipetrain.host.bitstream.
build_board`; docs/boards.md §2.1).

LEDs: ``led 0`` heartbeat (≈ 1 Hz, proves the bitstream runs), ``led 1`` UART activity
(RX/TX, latched per ≈ 10–20 ms window), ``led 2`` (boards with more LEDs) latched framing
error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from amaranth import Cat, ClockDomain, Elaboratable, Module, Signal
from amaranth.build import ResourceError
from amaranth.lib import fifo, io, stream, wiring
from amaranth.lib.wiring import In, Out

from ..compiler.targets import Board, BoardError
from .pll import PLLClock, PLLSetting, pick_pll
from .uart import UARTRx, UARTTx, uart_divisor

__all__ = ["BoardTop", "Loopback", "NetworkCore", "byte_core_signature", "network_core"]


def byte_core_signature() -> wiring.Signature:
    """Signature of a core behind the UART: ``i`` bytes from the host, ``o`` bytes to it."""
    return wiring.Signature({"i": In(stream.Signature(8)), "o": Out(stream.Signature(8))})


class Loopback(wiring.Component):
    """Echo every byte back through a FIFO (proves UART, pins and clock on a board).

    Parameters
    ----------
    depth: FIFO depth in bytes.

    Members
    -------
    i: ``In(stream.Signature(8))`` bytes from the host.
    o: ``Out(stream.Signature(8))`` the same bytes, in order.
    """

    def __init__(self, depth: int = 16) -> None:
        self.depth = depth
        super().__init__(byte_core_signature())

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        m.submodules.fifo = q = fifo.SyncFIFOBuffered(width=8, depth=self.depth)
        wiring.connect(m, wiring.flipped(self.i), q.w_stream)
        wiring.connect(m, q.r_stream, wiring.flipped(self.o))
        return m


class NetworkCore(wiring.Component):
    """The training design behind the UART: ``LinkEngine(plan)`` ↔ ``NetworkTop(plan)``.

    Parameters
    ----------
    plan: the design plan.
    rx_timeout_s: seconds without a byte inside a frame before the link drops it; converted to
        cycles of ``clock_hz`` (the link engine counts cycles), at least one cycle;
        0 turns the timeout off (a frame cut short then waits for the next bytes).
    clock_hz: the clock the core runs at (Hz); default ``plan.clock_hz``.
    onchip_samples: capacity of the link's on-chip training set (samples; 0: none, the
        default — :class:`~pipetrain.hdl.link.LinkEngine`).

    Raises
    ------
    ValueError: ``rx_timeout_s`` is negative.

    Members
    -------
    i: ``In(stream.Signature(8))`` bytes from the host (to ``LinkEngine.rx``).
    o: ``Out(stream.Signature(8))`` bytes to the host (from ``LinkEngine.tx``).
    busy: ``Out(1)`` the link is inside a frame.
    """

    def __init__(
        self,
        plan: Any,
        rx_timeout_s: float = 0.021,
        clock_hz: float | None = None,
        onchip_samples: int = 0,
    ) -> None:
        if rx_timeout_s < 0:
            raise ValueError(f"rx_timeout_s must be ≥ 0 s (0 = off), got {rx_timeout_s}")
        self.plan = plan
        self.onchip_samples = onchip_samples
        clock = plan.clock_hz if clock_hz is None else clock_hz
        # 0 s is "off" (LinkEngine's rx_timeout=0); any positive time is at least one cycle
        self.rx_timeout = max(1, round(clock * rx_timeout_s)) if rx_timeout_s else 0
        super().__init__(dict(byte_core_signature().members) | {"busy": Out(1)})

    def elaborate(self, platform: Any) -> Module:
        from .link import LinkEngine
        from .top import NetworkTop

        m = Module()
        m.submodules.link = link = LinkEngine(
            self.plan, rx_timeout=self.rx_timeout, onchip_samples=self.onchip_samples
        )
        m.submodules.net = net = NetworkTop(self.plan)
        wiring.connect(m, link.net, net)
        wiring.connect(m, wiring.flipped(self.i), link.rx)
        wiring.connect(m, link.tx, wiring.flipped(self.o))
        m.d.comb += self.busy.eq(link.busy)
        return m


def network_core(plan: Any, clock_hz: float | None = None, onchip_samples: int = 0) -> NetworkCore:
    """Return the link engine in front of ``NetworkTop(plan)`` as a byte-stream core running at
    ``clock_hz`` (Hz; default ``plan.clock_hz``), with an on-chip training set of
    ``onchip_samples`` slots (0: none)."""
    return NetworkCore(plan, clock_hz=clock_hz, onchip_samples=onchip_samples)


class BoardTop(Elaboratable):
    """The top of a board build: UART ↔ core, heartbeat LED.

    Parameters
    ----------
    board: the target (:data:`pipetrain.compiler.targets.BOARDS`): its network clock
        ``clock_hz``, oscillator ``osc_hz`` and FPGA ``family`` (for the PLL).
    core: a byte-stream component (``i``/``o``, see :func:`byte_core_signature`) or a
        zero-argument factory returning one.
    baud: UART rate (bit/s), default ``board.baud``; :class:`~pipetrain.hdl.uart.UARTError`
        when the board clock cannot make it within 2 %.
    fifo_depth: RX FIFO depth (bytes) between the UART and the core, so the core may stall for
        up to ``fifo_depth`` byte times without an overrun.
    clock_hz: the network clock (Hz), default ``board.clock_hz``; on a platform it must be the
        oscillator or a frequency the PLL makes exactly (:func:`~pipetrain.hdl.pll.pick_pll`),
        else :class:`~pipetrain.compiler.targets.BoardError` at elaboration.
    second_domain: (ECP5, on a platform, through the PLL) a second clock domain of that name
        at ``clock_hz`` from the PLL's second output (:class:`~pipetrain.hdl.pll.PLLClock`
        ``second``), for a core that runs a part there: the shell timing analysis
        (``benchmarks/shell_timing.py``, docs/boards.md §4.1); None (default): none.

    Members (simulation only, when elaborated without a platform)
    -------
    rx_pin, tx_pin: the UART lines (idle high).
    led_pins: ``Cat(heartbeat, activity, framing error)``.
    """

    def __init__(
        self,
        board: Board,
        core: wiring.Component | Callable[[], wiring.Component],
        baud: int | None = None,
        fifo_depth: int = 64,
        clock_hz: float | None = None,
        second_domain: str | None = None,
    ) -> None:
        self.board = board
        self.second_domain = second_domain
        self.baud = int(baud or board.baud)
        self.clock_hz = float(board.clock_hz if clock_hz is None else clock_hz)
        self.divisor = uart_divisor(self.clock_hz, self.baud)
        self._core = core
        self.fifo_depth = fifo_depth
        # Without a platform (simulation) the pins are these signals instead.
        self.rx_pin = Signal(init=1)
        self.tx_pin = Signal(init=1)
        self.led_pins = Signal(3)

    def pll(self) -> PLLSetting | None:
        """The PLL setting that makes ``clock_hz`` from the board's oscillator, or None when the
        network runs on the oscillator (or the board has none: a simulated board).

        Raises :class:`~pipetrain.compiler.targets.BoardError` when the PLL cannot make
        ``clock_hz`` exactly (the UART divisor and timeouts count cycles of it)."""
        osc = getattr(self.board, "osc_hz", 0.0)
        if not osc or abs(osc - self.clock_hz) < 1e-3:
            return None
        s = pick_pll(self.board.family, osc, self.clock_hz, self.baud)
        if abs(s.out_hz - self.clock_hz) > 1e-3:
            raise BoardError(
                f"the {self.board.family} PLL cannot make {self.clock_hz / 1e6:g} MHz from "
                f"{osc / 1e6:g} MHz (nearest below: {s.out_hz / 1e6:g} MHz); use that clock"
            )
        return s

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        if platform is not None:
            setting = self.pll()
            if setting is not None:
                # nextpnr derives the clock's constraint through the PLL from the
                # oscillator's (the platform constrains the pin)
                m.domains.sync = ClockDomain("sync")
                pin = platform.request(platform.default_clk, dir="-")
                if self.second_domain is not None:
                    m.domains += ClockDomain(self.second_domain)
                m.submodules.pll = PLLClock(setting, pin, second=self.second_domain)
        core = (
            self._core()
            if callable(self._core) and not isinstance(self._core, wiring.Component)
            else self._core
        )
        m.submodules.core = core
        m.submodules.uart_rx = rx = UARTRx(self.divisor)
        m.submodules.uart_tx = tx = UARTTx(self.divisor)
        m.submodules.rx_fifo = q = fifo.SyncFIFOBuffered(width=8, depth=self.fifo_depth)
        wiring.connect(m, rx.o, q.w_stream)
        wiring.connect(m, q.r_stream, core.i)
        wiring.connect(m, core.o, tx.i)

        # heartbeat ≈ 1 Hz
        clk_hz = int(self.clock_hz)
        beat = Signal(range(clk_hz // 2 + 1))
        led_beat = Signal()
        with m.If(beat == clk_hz // 2 - 1):
            m.d.sync += [beat.eq(0), led_beat.eq(~led_beat)]
        with m.Else():
            m.d.sync += beat.eq(beat + 1)
        # activity: a byte in or out, registered (the link's ready/valid are deep logic), and
        # latched per window of 2^wb ≈ 10-20 ms of the heartbeat counter (no counter of its
        # own: on the 98 %-full iCE40 its decrement chain, split by the placer, was the
        # critical path, 52 ns)
        wb = max(1, (clk_hz // 50).bit_length() - 1)
        act, seen, led_act = Signal(), Signal(), Signal()
        m.d.sync += act.eq((rx.o.valid & rx.o.ready) | (tx.i.valid & tx.i.ready))
        with m.If(beat[:wb] == 0):
            m.d.sync += [led_act.eq(seen | act), seen.eq(0)]
        with m.Elif(act):
            m.d.sync += seen.eq(1)
        frame_err = Signal()
        with m.If(rx.framing_error | rx.overrun):
            m.d.sync += frame_err.eq(1)

        if platform is None:
            m.d.comb += [rx.rx.eq(self.rx_pin), self.tx_pin.eq(tx.tx)]
            m.d.comb += self.led_pins.eq(Cat(led_beat, led_act, frame_err))
        else:
            uart = platform.request("uart", 0, dir="-")
            m.submodules.rx_pin = rx_buf = io.Buffer("i", uart.rx)
            m.submodules.tx_pin = tx_buf = io.Buffer("o", uart.tx)
            m.d.comb += [rx.rx.eq(rx_buf.i), tx_buf.o.eq(tx.tx)]
            leds = []
            for i in range(3):
                try:
                    leds.append(platform.request("led", i, dir="-"))
                except ResourceError:  # fewer LEDs on this board
                    break
            sigs = (led_beat, led_act, frame_err)
            for i, (led, sig) in enumerate(zip(leds, sigs, strict=False)):
                m.submodules[f"led{i}"] = buf = io.Buffer("o", led)
                m.d.comb += buf.o.eq(sig)
        return m
