"""UART RX/TX in Amaranth's simulator: loopback under backpressure, rate mismatch, glitches,
framing errors, and the divisor/baud-error rule."""

from __future__ import annotations

import random

import pytest
from amaranth import Module
from amaranth.sim import Simulator
from pipetrain.hdl.uart import UARTError, UARTRx, UARTTx, baud_error, uart_divisor


def _loopback(tx_div: int, rx_div: int, data: list[int], seed: int, p_valid: float, p_ready: float):
    """Send ``data`` TX→RX with random producer gaps and consumer backpressure; return
    (received bytes, framing errors, overruns, cycles)."""
    m = Module()
    m.submodules.tx = tx = UARTTx(tx_div)
    m.submodules.rx = rx = UARTRx(rx_div)
    m.d.comb += rx.rx.eq(tx.tx)
    rng = random.Random(seed)
    got: list[int] = []
    errors = {"framing": 0, "overrun": 0, "cycles": 0}

    async def producer(ctx):
        for byte in data:
            while rng.random() > p_valid:
                await ctx.tick()
            ctx.set(tx.i.payload, byte)
            ctx.set(tx.i.valid, 1)
            await ctx.tick().until(tx.i.ready)
            ctx.set(tx.i.valid, 0)

    async def consumer(ctx):
        # A consumer slower than one byte per frame would overrun a 1-byte UART; the link
        # puts a FIFO here. Backpressure below is bounded by the frame time.
        while len(got) < len(data):
            ready = rng.random() < p_ready
            ctx.set(rx.o.ready, ready)
            _, _, valid, payload, fe, ov = await ctx.tick().sample(
                rx.o.valid, rx.o.payload, rx.framing_error, rx.overrun
            )
            errors["cycles"] += 1
            errors["framing"] += fe
            errors["overrun"] += ov
            if valid and ready:
                got.append(payload)
            assert errors["cycles"] < 40 * tx_div * (len(data) + 8) / p_valid, "receiver hung"

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(producer, background=True)
    sim.add_testbench(consumer)
    sim.run()
    return got, errors["framing"], errors["overrun"], errors["cycles"]


@pytest.mark.parametrize("div,seed", [(4, 1), (5, 2), (7, 3), (16, 4)])
def test_loopback_random_bytes_backpressure(div: int, seed: int) -> None:
    rng = random.Random(seed)
    data = [rng.randrange(256) for _ in range(48)] + [0x00, 0xFF, 0x55, 0xAA]
    got, fe, ov, cycles = _loopback(div, div, data, seed, p_valid=0.6, p_ready=0.3)
    assert got == data
    assert (fe, ov) == (0, 0)
    # back-to-back frames: ≥ 10 bits per byte; gaps add at most a bounded amount
    assert cycles >= 10 * div * (len(data) - 1)


@pytest.mark.parametrize("tx_div,rx_div", [(50, 51), (51, 50), (100, 98), (98, 100)])
def test_loopback_tolerates_2_percent_rate_mismatch(tx_div: int, rx_div: int) -> None:
    data = [0x00, 0xFF, 0x01, 0x80, 0x7F, 0xFE, 0x55, 0xAA, 0x0F, 0xF0]
    got, fe, ov, _ = _loopback(tx_div, rx_div, data, 7, p_valid=1.0, p_ready=1.0)
    assert got == data and (fe, ov) == (0, 0)


def _drive_rx(div: int, wave: list[tuple[int, int]]):
    """Drive ``rx`` with (level, cycles) pieces, always ready; return (bytes, framing errors)."""
    dut = UARTRx(div)
    got: list[int] = []
    fe = [0]

    async def tb(ctx):
        ctx.set(dut.o.ready, 1)
        for level, cycles in wave + [(1, 20 * div)]:
            ctx.set(dut.rx, level)
            for _ in range(cycles):
                _, _, valid, payload, ferr = await ctx.tick().sample(
                    dut.o.valid, dut.o.payload, dut.framing_error
                )
                if valid:
                    got.append(payload)
                fe[0] += ferr

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    return got, fe[0]


def _frame(byte: int, div: int, stop: int = 1) -> list[tuple[int, int]]:
    bits = [0] + [(byte >> i) & 1 for i in range(8)] + [stop]
    return [(b, div) for b in bits]


def test_rx_ignores_glitches() -> None:
    div = 16
    wave = [(1, 40), (0, 1), (1, 30), (0, 2), (1, 30), (0, div // 2 - 3), (1, 40)]
    wave += _frame(0xA5, div)
    got, fe = _drive_rx(div, wave)
    # 1- and 2-cycle pulses die in the majority filter; a sub-half-bit pulse fails the start
    # check; then the real frame arrives intact.
    assert got == [0xA5] and fe == 0


def test_rx_single_cycle_glitch_inside_a_bit_is_filtered() -> None:
    div = 8
    # 0x00 with a 1-cycle high spike in the middle of every data bit
    wave = [(1, 20), (0, div)]
    for _ in range(8):
        wave += [(0, div // 2 - 1), (1, 1), (0, div - div // 2)]
    wave += [(1, div)]
    got, fe = _drive_rx(div, wave)
    assert got == [0x00] and fe == 0


def test_rx_framing_error_drops_byte_and_recovers() -> None:
    div = 6
    wave = [(1, 20)] + _frame(0x3C, div, stop=0) + [(0, 5 * div), (1, 3 * div)]
    wave += _frame(0xC3, div)
    got, fe = _drive_rx(div, wave)
    assert got == [0xC3]  # the bad frame and the break after it produce no bytes
    assert fe == 1


def test_rx_overrun_keeps_first_byte() -> None:
    div = 5
    dut = UARTRx(div)
    out = {"ov": 0}

    async def tb(ctx):
        ctx.set(dut.o.ready, 0)
        for level, cycles in [(1, 20)] + _frame(0x11, div) + _frame(0x22, div) + [(1, 30)]:
            ctx.set(dut.rx, level)
            for _ in range(cycles):
                _, _, ov = await ctx.tick().sample(dut.overrun)
                out["ov"] += ov
        assert ctx.get(dut.o.valid) == 1
        assert ctx.get(dut.o.payload) == 0x11

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    assert out["ov"] == 1


def test_tx_waveform_is_8n1_lsb_first() -> None:
    div = 4
    dut = UARTTx(div)
    line: list[int] = []

    async def tb(ctx):
        ctx.set(dut.i.payload, 0b1001_0110)
        ctx.set(dut.i.valid, 1)
        await ctx.tick()
        ctx.set(dut.i.valid, 0)
        for _ in range(12 * div):
            _, _, tx = await ctx.tick().sample(dut.tx)
            line.append(tx)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    start = line.index(0)
    bits = [line[start + i * div + div // 2] for i in range(10)]
    assert bits == [0, 0, 1, 1, 0, 1, 0, 0, 1, 1]
    assert all(v == 0 for v in line[start : start + div])  # full-width start bit
    assert all(v == 1 for v in line[start + 9 * div :])  # stop bit, then idle


def test_divisor_and_baud_error_rule() -> None:
    assert uart_divisor(12e6, 1_000_000) == 12
    assert uart_divisor(25e6, 1_000_000) == 25
    assert uart_divisor(12e6, 115_200) == 104  # 115384.6 baud, 0.16 % off
    assert baud_error(12e6, 115_200, 104) == pytest.approx(0.001603, abs=1e-6)
    assert uart_divisor(12e6, 3_000_000) == 4
    with pytest.raises(UARTError, match=r"4\.17 % off"):
        uart_divisor(25e6, 3_000_000)  # 25/3 → 8 → 3.125 Mbaud
    with pytest.raises(UARTError, match="at least 4"):
        uart_divisor(12e6, 4_000_000)
    with pytest.raises(UARTError):
        UARTRx(3)
