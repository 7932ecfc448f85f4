"""The UART-level ``sim`` target: the board top (UART pins) in an RTL simulator, served on TCP.

Where :class:`~pipetrain.sim.bridge.BridgeTop` hands the link engine whole words of bytes, this
variant simulates what a board runs: :class:`~pipetrain.hdl.board.BoardTop` (UART RX → RX FIFO
→ core, core → UART TX, heartbeat LEDs) around :class:`~pipetrain.hdl.board.NetworkCore`
(``LinkEngine`` ↔ ``NetworkTop``, with the board's receive timeout), and the cocotb server
(:mod:`pipetrain.sim.cocotb_uart`) moves every byte as an 8N1 frame on the ``rx_pin`` /
``tx_pin`` lines with a bit-level UART model.

Clocking: the simulated board runs at ``plan.clock_hz`` (the clock the plan and the link
engine's receive timeout assume) with ``baud = clock_hz / divisor``: a high baud-to-clock ratio
(``divisor`` ≥ :data:`~pipetrain.hdl.uart.MIN_DIVISOR` cycles per bit, default 8) keeps the
simulated line time short while the RTL UART sees exactly what it sees on a board with that
divisor (the iCEBreaker: 12 MHz, 1 Mbaud, divisor 12).

Pieces:

* :class:`UartBridgeTop` — the simulated design: ``BoardTop`` plus two status outputs the
  server needs to know when it may stop the clock (``busy``: the link engine is inside a frame,
  executing or sending; ``net_idle``: the network's ``idle``). They are read from the core,
  they do not change ``BoardTop``. With ``plan=None`` the core is the board's FIFO
  :class:`~pipetrain.hdl.board.Loopback` (for testing the UART model against the RTL UART).
* :func:`build_uart_bridge` — Verilog + build through the harness (:mod:`pipetrain.sim.
  harness`), cached by plan, generator sources, divisor, receive timeout and simulator (never
  collides with the word-stream build: another top-level name and key).

:class:`~pipetrain.sim.bridge.SimBridge` (``uart_divisor=N``) and
``pipetrain.host.open(plan, "sim", sim_options={"uart_divisor": N})`` run it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..compiler.plan import Plan
from ..hdl.board import BoardTop, Loopback, NetworkCore
from ..hdl.uart import MIN_DIVISOR, UARTError
from .harness import DEFAULT_SIMULATOR, RTLBuild, cached_design

__all__ = [
    "DEFAULT_UART_DIVISOR",
    "RX_TIMEOUT_S",
    "UART_TOPLEVEL",
    "SimBoard",
    "UartBridgeDesign",
    "UartBridgeTop",
    "build_uart_bridge",
]

#: Clock cycles per UART bit of the UART-level sim target unless asked otherwise.
DEFAULT_UART_DIVISOR = 8
#: Verilog top module name of the UART-level design.
UART_TOPLEVEL = "pipetrain_uart_bridge"
#: The board core's receive timeout (s): :class:`~pipetrain.hdl.board.NetworkCore`'s default.
RX_TIMEOUT_S = 0.021
#: Clock of the loopback design (``plan=None``), Hz.
LOOPBACK_CLOCK_HZ = 1e6
#: Bump when the server's job protocol changes (invalidates the index; a change of this file or
#: of the generator's sources does so by itself).
UART_BRIDGE_VERSION = 2


@dataclass(frozen=True)
class SimBoard:
    """The board :class:`~pipetrain.hdl.board.BoardTop` sees in simulation (it reads only
    ``clock_hz`` and ``baud``).

    Members
    -------
    name: ``"sim"``.
    clock_hz: the simulated board clock (Hz).
    baud: the UART rate (bit/s); ``clock_hz / baud`` is the divisor (cycles per bit).
    """

    name: str
    clock_hz: float
    baud: int


class UartBridgeTop(wiring.Component):
    """``BoardTop(SimBoard, NetworkCore(plan))`` with its UART pins as ports (simulation).

    Parameters
    ----------
    plan: the design plan; None builds the board's FIFO ``Loopback`` core instead.
    divisor: clock cycles per UART bit (≥ :data:`~pipetrain.hdl.uart.MIN_DIVISOR`).
    rx_timeout_s: the link engine's receive timeout (s of ``plan.clock_hz``), as on a board.

    Members
    -------
    rx_pin: ``In(1, init=1)`` the host → device line (idle high).
    tx_pin: ``Out(1)`` the device → host line (idle high).
    leds: ``Out(3)`` ``BoardTop.led_pins``: heartbeat, activity, latched framing error.
    busy: ``Out(1)`` the link engine is inside a frame, executing or sending (0: loopback).
    net_idle: ``Out(1)`` the network's ``idle`` (1: loopback).

    Raises :class:`~pipetrain.hdl.uart.UARTError` when ``divisor`` is below ``MIN_DIVISOR``.
    """

    def __init__(
        self,
        plan: Plan | None,
        divisor: int = DEFAULT_UART_DIVISOR,
        rx_timeout_s: float = RX_TIMEOUT_S,
        onchip_samples: int = 0,
    ) -> None:
        if divisor < MIN_DIVISOR:
            self._MustUse__silence = True  # not built: no "unused elaboratable" warning
            raise UARTError(f"UART divisor {divisor} < {MIN_DIVISOR} cycles per bit")
        self.plan = plan
        self.divisor = int(divisor)
        self.rx_timeout_s = rx_timeout_s
        self.onchip_samples = onchip_samples
        clock_hz = float(plan.clock_hz) if plan is not None else LOOPBACK_CLOCK_HZ
        self.board = SimBoard("sim", clock_hz, round(clock_hz / self.divisor))
        super().__init__(
            {
                "rx_pin": In(1, init=1),
                "tx_pin": Out(1, init=1),
                "leds": Out(3),
                "busy": Out(1),
                "net_idle": Out(1),
            }
        )

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        if self.plan is None:
            core: wiring.Component = Loopback()
            m.d.comb += [self.busy.eq(0), self.net_idle.eq(1)]
        else:
            core = _StatusNetworkCore(self.plan, self.rx_timeout_s, self.onchip_samples)
            m.d.comb += [self.busy.eq(core.busy), self.net_idle.eq(core.net_idle)]
        m.submodules.board = top = BoardTop(self.board, core)  # type: ignore[arg-type]
        assert top.divisor == self.divisor, (top.divisor, self.divisor)
        m.d.comb += [
            top.rx_pin.eq(self.rx_pin),
            self.tx_pin.eq(top.tx_pin),
            self.leds.eq(top.led_pins),
        ]
        return m


class _StatusNetworkCore(NetworkCore):
    """:class:`~pipetrain.hdl.board.NetworkCore` exactly as a board builds it, plus
    ``net_idle`` (a plain signal, not a port): the network's ``idle``, for the server."""

    def __init__(self, plan: Plan, rx_timeout_s: float, onchip_samples: int = 0) -> None:
        super().__init__(plan, rx_timeout_s, onchip_samples=onchip_samples)
        self.net_idle = Signal()

    def elaborate(self, platform: Any) -> Module:
        m = super().elaborate(platform)
        m.d.comb += self.net_idle.eq(m.submodules.net.idle)
        return m


@dataclass(frozen=True)
class UartBridgeDesign:
    """A built UART-level simulation.

    Members
    -------
    plan: the plan (None for the loopback design).
    build: the RTL build (``build.simulator`` names the simulator).
    divisor: clock cycles per UART bit.
    clock_hz: the simulated board clock (Hz); ``baud = clock_hz / divisor``.
    rx_timeout_cycles: the link engine's receive timeout (cycles; 0 for the loopback).
    build_s: seconds this call spent (Verilog generation + build); ~0 when cached.
    cached: whether an earlier build was reused.
    """

    plan: Plan | None
    build: RTLBuild
    divisor: int
    clock_hz: float
    rx_timeout_cycles: int
    build_s: float
    cached: bool


def build_uart_bridge(
    plan: Plan | None,
    divisor: int = DEFAULT_UART_DIVISOR,
    *,
    rx_timeout_s: float = RX_TIMEOUT_S,
    simulator: str = DEFAULT_SIMULATOR,
    rebuild: bool = False,
    onchip_samples: int = 0,
) -> UartBridgeDesign:
    """Generate and build :class:`UartBridgeTop` with ``simulator`` (cached by the plan, the
    generator's sources, ``divisor``, ``rx_timeout_s``, ``onchip_samples`` (the link's on-chip
    training set, 0: none) and the build recipe: an unchanged design skips the Verilog
    generation too).

    Raises :class:`~pipetrain.hdl.uart.UARTError` for a divisor below ``MIN_DIVISOR``,
    :class:`ValueError` for an unknown simulator, :class:`~pipetrain.sim.harness.ToolchainError`
    when the simulator's tools are missing and :class:`~pipetrain.sim.harness.RTLSimError` when
    the build fails.
    """
    t0 = time.perf_counter()
    if divisor < MIN_DIVISOR:
        raise UARTError(f"UART divisor {divisor} < {MIN_DIVISOR} cycles per bit")
    clock_hz = float(plan.clock_hz) if plan is not None else LOOPBACK_CLOCK_HZ
    tmo = 0 if plan is None else max(1, round(plan.clock_hz * rx_timeout_s))

    def generate() -> str:
        from amaranth.back import verilog

        return verilog.convert(
            UartBridgeTop(plan, divisor, rx_timeout_s, onchip_samples), name=UART_TOPLEVEL
        )

    plan_text = plan.to_json() if plan is not None else "loopback"
    build, _ = cached_design(
        "uart-bridge",
        UART_TOPLEVEL,
        f"{plan_text}|{divisor}|{tmo}|{UART_BRIDGE_VERSION}"
        + (f"|onchip={onchip_samples}" if onchip_samples else ""),
        generate,
        simulator=simulator,
        sources=[__file__],
        rebuild=rebuild,
    )
    return UartBridgeDesign(
        plan, build, divisor, clock_hz, tmo, time.perf_counter() - t0, build.cached
    )
