"""8N1 UART receiver and transmitter with ``lib.stream`` byte ports.

The host link runs over the board's USB-serial bridge (FTDI). Frames are 8N1: one start bit (0),
eight data bits LSB first, one stop bit (1); the line idles high.

Timing is counted in clock cycles: a bit lasts ``divisor = round(clk_hz / baud)`` cycles
(:func:`uart_divisor`). The receiver oversamples at the full clock rate (``divisor``× per bit):
the pin goes through a two-flip-flop synchroniser and a 3-sample majority filter (rejects
single-cycle glitches), a falling edge arms the receiver, the start bit is re-checked half a bit
later (a shorter low pulse is a glitch and is ignored), then each data bit and the stop bit are
sampled in the middle of the bit. A low stop bit is a framing error: the byte is dropped, the
``framing_error`` strobe pulses and the receiver waits for the line to return high (a *break*
yields one error, not a stream of zero bytes). Source: the standard asynchronous serial frame
(e.g. TIA-232 / FT231X datasheet); mid-bit sampling with a majority filter is *derived* (it is
what 16× oversampling UARTs do with their 3 middle samples, at clock resolution instead).

Tolerance: mid-bit sampling of the 10th bit stays inside that bit while the rates differ by
less than ~½ bit over 9.5 bits ≈ 5 %; :func:`uart_divisor` refuses more than 2 % (a board clock
that cannot make the baud rate) so that the far end's own error still fits.
"""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..errors import UserError

__all__ = ["UARTError", "uart_divisor", "baud_error", "UARTRx", "UARTTx", "MIN_DIVISOR"]

#: Fewest clock cycles per bit: the receiver needs a half-bit wait ≥ 1 cycle after the
#: synchroniser and filter latency, and a majority filter narrower than a bit.
MIN_DIVISOR = 4
#: Largest baud-rate error accepted between the requested and the achieved rate.
MAX_BAUD_ERROR = 0.02


class UARTError(UserError, ValueError):
    """The clock cannot make the requested baud rate (the message gives both numbers)."""


def baud_error(clk_hz: float, baud: float, divisor: int) -> float:
    """Return the relative error ``|clk_hz/divisor − baud| / baud`` of a divisor (unitless)."""
    return abs(clk_hz / divisor - baud) / baud


def uart_divisor(clk_hz: float, baud: float, max_error: float = MAX_BAUD_ERROR) -> int:
    """Return clock cycles per bit, ``round(clk_hz / baud)``.

    Raises :class:`UARTError` when the divisor is below :data:`MIN_DIVISOR` or the achieved
    baud rate ``clk_hz / divisor`` is more than ``max_error`` (default 2 %) off ``baud``.
    """
    if clk_hz <= 0 or baud <= 0:
        raise UARTError(f"clock ({clk_hz} Hz) and baud rate ({baud}) must be positive")
    divisor = max(1, round(clk_hz / baud))
    if divisor < MIN_DIVISOR:
        raise UARTError(
            f"baud rate {baud:.0f} is too fast for a {clk_hz / 1e6:g} MHz clock: "
            f"{clk_hz / baud:.2f} cycles per bit, the UART needs at least {MIN_DIVISOR}"
        )
    err = baud_error(clk_hz, baud, divisor)
    if err > max_error:
        raise UARTError(
            f"baud rate {baud:.0f} cannot be made from a {clk_hz / 1e6:g} MHz clock: the "
            f"nearest divisor {divisor} gives {clk_hz / divisor:.0f} baud, "
            f"{100 * err:.2f} % off (limit {100 * max_error:g} %)"
        )
    return divisor


class UARTTx(wiring.Component):
    """UART transmitter, 8N1.

    Parameters
    ----------
    divisor: clock cycles per bit (see :func:`uart_divisor`), ≥ :data:`MIN_DIVISOR`.

    Members
    -------
    i: ``In(stream.Signature(8))`` bytes to send; a byte is taken when the transmitter is idle
        (``ready`` high), so back-to-back bytes follow each other with one extra idle cycle.
    tx: ``Out(1)`` the serial line (registered, idles high).
    busy: ``Out(1)`` a frame is being sent.
    """

    def __init__(self, divisor: int) -> None:
        if divisor < MIN_DIVISOR:
            self._MustUse__silence = True  # not built: no "unused elaboratable" warning
            raise UARTError(f"UART divisor {divisor} < {MIN_DIVISOR}")
        self.divisor = int(divisor)
        super().__init__({"i": In(stream.Signature(8)), "tx": Out(1, init=1), "busy": Out(1)})

    def elaborate(self, platform) -> Module:
        m = Module()
        shreg = Signal(10, init=0x3FF)  # stop, data[7:0], start — sent LSB first
        bits = Signal(range(11))
        count = Signal(range(self.divisor))

        m.d.comb += [self.i.ready.eq(bits == 0), self.busy.eq(bits != 0)]
        m.d.sync += self.tx.eq(shreg[0])
        with m.If(bits == 0):
            with m.If(self.i.valid):
                m.d.sync += [
                    shreg.eq((1 << 9) | (self.i.payload << 1)),
                    bits.eq(10),
                    count.eq(self.divisor - 1),
                ]
        with m.Elif(count == 0):
            m.d.sync += [
                shreg.eq((1 << 9) | (shreg >> 1)),
                bits.eq(bits - 1),
                count.eq(self.divisor - 1),
            ]
        with m.Else():
            m.d.sync += count.eq(count - 1)
        return m


class UARTRx(wiring.Component):
    """UART receiver, 8N1, sampled at the clock rate with a majority glitch filter.

    Parameters
    ----------
    divisor: clock cycles per bit (see :func:`uart_divisor`), ≥ :data:`MIN_DIVISOR`.

    Members
    -------
    rx: ``In(1, init=1)`` the serial line (asynchronous; synchronised inside).
    o: ``Out(stream.Signature(8))`` received bytes; ``valid`` holds until ``ready``. A byte
        that completes while the previous one still waits is dropped (``overrun`` pulses).
    framing_error: ``Out(1)`` one-cycle strobe: a stop bit was low, the byte was dropped.
    overrun: ``Out(1)`` one-cycle strobe: a byte was dropped because ``o`` was not taken.
    """

    def __init__(self, divisor: int) -> None:
        if divisor < MIN_DIVISOR:
            self._MustUse__silence = True  # not built: no "unused elaboratable" warning
            raise UARTError(f"UART divisor {divisor} < {MIN_DIVISOR}")
        self.divisor = int(divisor)
        super().__init__(
            {
                "rx": In(1, init=1),
                "o": Out(stream.Signature(8)),
                "framing_error": Out(1),
                "overrun": Out(1),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        div = self.divisor
        sync = Signal(2, init=0b11)  # two-flop synchroniser
        window = Signal(3, init=0b111)  # last three synchronised samples
        line = Signal(init=1)  # majority of the window
        m.d.sync += [
            sync.eq(sync << 1 | self.rx),
            window.eq(window << 1 | sync[1]),
            line.eq((window[0] & window[1]) | (window[0] & window[2]) | (window[1] & window[2])),
        ]

        count = Signal(range(div))
        bit = Signal(range(8))
        data = Signal(8)
        m.d.sync += [self.framing_error.eq(0), self.overrun.eq(0)]
        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)

        with m.FSM():
            with m.State("WAIT-HIGH"):  # after reset or a break: the line must idle first
                with m.If(line):
                    m.next = "IDLE"
            with m.State("IDLE"):
                with m.If(~line):
                    m.d.sync += count.eq(div // 2 - 1)
                    m.next = "START"
            with m.State("START"):
                with m.If(count != 0):
                    m.d.sync += count.eq(count - 1)
                with m.Elif(line):  # high again at mid-start-bit: a glitch
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += [count.eq(div - 1), bit.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                with m.If(count != 0):
                    m.d.sync += count.eq(count - 1)
                with m.Else():
                    m.d.sync += [data.eq(line << 7 | data >> 1), count.eq(div - 1)]
                    m.d.sync += bit.eq(bit + 1)
                    with m.If(bit == 7):
                        m.next = "STOP"
            with m.State("STOP"):
                with m.If(count != 0):
                    m.d.sync += count.eq(count - 1)
                with m.Elif(line):
                    with m.If(self.o.valid & ~self.o.ready):
                        m.d.sync += self.overrun.eq(1)
                    with m.Else():
                        m.d.sync += [self.o.payload.eq(data), self.o.valid.eq(1)]
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += self.framing_error.eq(1)
                    m.next = "WAIT-HIGH"
        return m
