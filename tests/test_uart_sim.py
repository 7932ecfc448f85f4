"""The UART-level ``sim`` target: the board top (``BoardTop`` around ``NetworkCore``) in
Verilator, every host byte moved as an 8N1 frame on its pins by a bit-level UART model
(:mod:`pipetrain.sim.cocotb_uart`), driven by the same host client as the word-stream target.

* the UART model against the RTL UART (``BoardTop`` with the FIFO loopback core), in Verilator
  and in Icarus (marker ``icarus``);
* the tiny net trained through ``pipetrain.host.open(..., "sim", sim_options={"uart_divisor":
  8}, shadow=True)``, bit-exact with the golden model;
* a frame split across TCP writes does not trip the engine's (board) receive timeout;
* (slow) ``mlp-digits`` with the iCEBreaker's board plan, clock and baud rate (the 24 MHz
  network clock of its PLL, 1 Mbaud: divisor 24).
"""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch
from pipetrain.hdl.uart import MIN_DIVISOR, UARTError
from pipetrain.host import open
from pipetrain.host.transport import TcpTransport
from pipetrain.protocol.wire import Cmd, Counters, Frame, FrameDecoder, encode_frame
from pipetrain.sim.bridge import SimBridge
from pipetrain.sim.golden import GoldenModel
from pipetrain.sim.harness import run_cocotb
from pipetrain.sim.uart_bridge import UartBridgeTop, build_uart_bridge
from tiny_net import tiny

DIVISOR = 8


SIMULATORS = ["verilator", pytest.param("icarus", marks=pytest.mark.icarus)]


def _loopback(
    divisor: int, data: list[int], bad_stop_at: int | None = None, simulator: str = "verilator"
) -> dict:
    design = build_uart_bridge(None, divisor, simulator=simulator)
    assert design.build.simulator == simulator
    job = {"divisor": divisor, "clock_ns": 10, "data": data, "bad_stop_at": bad_stop_at}
    return run_cocotb(design.build, "pipetrain.sim.cocotb_uart", job, testcase="uart_loopback")


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("divisor", [MIN_DIVISOR, DIVISOR])
def test_uart_model_against_rtl_uart_loopback(divisor: int, simulator: str) -> None:
    rng = random.Random(divisor)
    data = [0x00, 0xFF, 0xA5, 0x5A, 0x01, 0x80] + [rng.randrange(256) for _ in range(58)]
    data += [0x00, 0x00, 0xFF, 0xFF]
    r = _loopback(divisor, data, simulator=simulator)
    assert r["received"] == data
    assert r["leds"] >> 2 & 1 == 0 and r["glitches"] == 0  # no framing error latched
    # back-to-back 8N1 frames: ≥ 10 bits of `divisor` cycles per byte, echoed with little lag
    assert 10 * divisor * len(data) <= r["cycles"] <= 10 * divisor * len(data) + 40 * divisor


@pytest.mark.parametrize("simulator", SIMULATORS)
def test_uart_model_low_stop_bit_is_a_framing_error_in_the_rtl(simulator: str) -> None:
    data = [0x11, 0x22, 0x33, 0x44, 0x55]
    r = _loopback(DIVISOR, data, bad_stop_at=2, simulator=simulator)
    assert r["received"] == [0x11, 0x22, 0x44, 0x55]  # the bad byte dropped, the rest intact
    assert r["leds"] >> 2 & 1 == 1  # BoardTop's latched framing-error LED


def test_uart_divisor_below_minimum_is_refused() -> None:
    plan, _, _ = tiny()
    with pytest.raises(UARTError, match="divisor"):
        UartBridgeTop(plan, MIN_DIVISOR - 1)


@pytest.fixture(scope="module")
def tiny_net():
    return tiny()


def _train_stream(n: int = 24, seed: int = 5):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 6, generator=gen) * 4 - 1
    y = torch.randint(0, 3, (n,), generator=gen)
    return x, y


def test_uart_sim_trains_bit_exact_with_golden(tiny_net) -> None:
    plan, model, config = tiny_net
    x, y = _train_stream(24)
    x_test, y_test = _train_stream(8, seed=9)
    t0 = time.perf_counter()
    with open(
        plan, "sim", config, model=model, shadow=True, sim_options={"uart_divisor": DIVISOR}
    ) as dev:
        rep = dev.train(x, y, epochs=1)
        preds = dev.predict(x_test)
        v = dev.verify()
        results = list(dev.results)
        c = dev.counters()
        sd = dev.state_dict()
    wall = time.perf_counter() - t0
    assert v.bit_exact, v.mismatches
    assert v.results == 24 + 8 and v.memories > 0
    assert rep.samples == 24 and c["samples_trained"] == 24
    assert c["bad_crc"] == c["bad_header"] == c["rx_timeouts"] == 0 and dev.retransmits == 0
    # the same numbers as a golden model trained on its own (not only the shadow's word)
    ref = GoldenModel(plan, model, config)
    ref.train(x, y, epochs=1)
    gold_preds, _ = ref.infer(x_test, None)
    assert torch.equal(preds, gold_preds)
    assert [(p, r, t) for p, r, t in results[:24]] == [
        (r.pred, r.loss_raw, r.train) for r in ref.results[:24]
    ]
    assert all(torch.equal(sd[k], w) for k, w in ref.state_dict().items())
    # a test that could fail: the losses and predictions are not all the same
    losses = [raw for _, raw, _ in results[:24]]
    assert len(set(losses)) > 5 and len({p for p, _, _ in results}) > 1
    # every byte went through the UART pins
    s = dev.sim_stats
    assert s is not None and s["divisor"] == DIVISOR
    assert s["uart_bytes_sent"] == s["bytes_in"] and s["uart_bytes_received"] == s["bytes_out"]
    assert s["bytes_in"] > 24 * plan_record_bytes(plan)
    assert s["cycles"] >= 10 * DIVISOR * (s["bytes_in"] + s["bytes_out"]) // 2
    print(
        f"\nUART sim, tiny net, divisor {DIVISOR}: {s['cycles']} cycles, "
        f"{s['bytes_in']} B in / {s['bytes_out']} B out, {wall:.1f} s wall"
    )


def plan_record_bytes(plan) -> int:
    """Bytes of one SAMPLES record (3 + ⌈N·X/8⌉: features bit-packed, docs/protocol.md §2)."""
    x_bits = plan.stages[0].formats.x.bits
    return 3 + -(-plan.in_features * x_bits // 8)


def test_uart_sim_frame_split_across_writes_keeps_the_clock_stopped(tiny_net) -> None:
    """A frame in two TCP writes 0.3 s apart: the engine's receive timeout must not fire while
    the server waits for the rest. The timeout is short here (200 µs = 10 000 cycles at 50 MHz,
    still 125 byte times) so that a clock left running during the wait would trip it."""
    plan = tiny_net[0]
    with SimBridge(plan, uart_divisor=DIVISOR, rx_timeout_s=200e-6) as sim:
        tr = TcpTransport("127.0.0.1", sim.port)
        wire = encode_frame(Frame(Cmd.HELLO, 5))
        tr.write(b"\x00\xa5\x13" + wire[:4])
        time.sleep(0.3)
        tr.write(wire[4:])
        dec, frames = FrameDecoder(), []
        deadline = time.monotonic() + 30
        while not frames and time.monotonic() < deadline:
            frames += dec.feed(tr.read(1.0))
        tr.write(encode_frame(Frame(Cmd.READ_COUNTERS, 6)))
        more: list[Frame] = []
        while not more and time.monotonic() < deadline:
            more += dec.feed(tr.read(1.0))
        tr.close()
    assert [(f.type, f.seq) for f in frames] == [(0x80 | Cmd.HELLO, 5)]
    # session tag 0 (fresh from reset), then the plan hash
    assert frames[0].payload[:12] == bytes(4) + bytes.fromhex(plan.hash)
    counters = Counters.from_words(np.frombuffer(more[0].payload, "<u4").tolist()).to_dict()
    # both frames arrived whole: the split one was not dropped by the receive timeout
    assert counters["frames_ok"] == 2 and counters["rx_timeouts"] == 0, counters
    assert counters["bad_header"] == counters["bad_crc"] == 0
    assert sim.stats is not None and sim.stats["partial_waits"] >= 1
    assert sim.stats["partial_timeouts"] == 0


ICEBREAKER_CLOCK_HZ, ICEBREAKER_DIVISOR = 24e6, 24  # the PLL's network clock, 1 Mbaud


@pytest.mark.slow
def test_mlp_digits_through_the_uart_bit_exact() -> None:
    """``mlp-digits`` with the plan ``pipetrain build --board icebreaker`` builds (one lane per
    stage, weights in single-port SPRAM, 16-bit weights, 12-bit activations, 5-bit constants;
    24 MHz clock, 1 Mbaud: 24 cycles per bit), 24 digits samples through the UART pins,
    bit-exact.

    Two sessions — open + verify, and open + train + verify — so their difference is what the
    24 training samples cost on the line (cycles, bytes; the weight traffic cancels out)."""
    from pipetrain.compiler.targets import BOARDS
    from pipetrain.data import load_digits
    from pipetrain.host.flow import compile_design

    result = compile_design("mlp-digits", board=BOARDS["icebreaker"])
    plan = result.plan
    assert plan.clock_hz == ICEBREAKER_CLOCK_HZ
    assert [(s.lanes, s.slot_cycles) for s in plan.stages] == [(1, 2), (1, 2)]  # SPRAM slots
    ds = load_digits()
    n = 24
    x, y = ds.x_train[:n], ds.y_train[:n]
    runs = {}
    for train in (False, True):
        t0 = time.perf_counter()
        opts = {"uart_divisor": ICEBREAKER_DIVISOR}
        with open(result, "sim", shadow=True, sim_options=opts) as dev:
            t_open = time.perf_counter()
            rep = dev.train(x, y, epochs=1) if train else None
            t_train = time.perf_counter() - t_open
            v = dev.verify()
            results = list(dev.results)
            build_s = dev._bridge.design.build_s
        assert v.bit_exact, v.mismatches
        assert v.memories == sum(2 * st.out_features * (st.in_features + 1) for st in plan.stages)
        s = dev.sim_stats
        assert s is not None and s["uart_bytes_sent"] == s["bytes_in"]
        assert s["uart_bytes_received"] == s["bytes_out"]
        runs[train] = (s, time.perf_counter() - t0, t_open - t0, t_train, build_s)
    assert v.results == n and rep is not None and rep.samples == n
    assert len({raw for _, raw, _ in results}) > n // 2  # losses differ from sample to sample
    (s0, wall0, _, _, build_s), (s1, wall1, open1, t_train, _) = runs[False], runs[True]
    cycles = s1["cycles"] - s0["cycles"]
    b_in, b_out = s1["bytes_in"] - s0["bytes_in"], s1["bytes_out"] - s0["bytes_out"]
    print(
        f"\nmlp-digits over the UART model (divisor {ICEBREAKER_DIVISOR}, "
        f"{plan.tick_cycles} cycles/tick), {n} samples bit-exact: build {build_s:.1f} s; "
        f"open (start + write weights) {open1:.1f} s; train {t_train:.2f} s "
        f"({n / t_train:.1f} samples/s wall); session {wall1:.1f} s (without training "
        f"{wall0:.1f} s); training cost {cycles / n:.0f} cycles/sample, "
        f"{b_in / n:.1f} B/sample host → device, {b_out / n:.1f} B/sample device → host"
    )
