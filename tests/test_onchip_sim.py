"""The on-chip training set and bit-packed samples through the board-level RTL simulation
(docs/protocol.md §2 SAMPLES / STORE / RUN, the order docs/numerics.md §10): the tiny net with
11-bit inputs (6 features in 9 bytes: features straddle bytes, 6 padding bits) in its board top
in Verilator, every byte an 8N1 frame on its UART pins, trains one streamed epoch, uploads a
small training set once and trains several epochs in the device's own LFSR order — every
result of the streamed epoch, every epoch summary, the final weights and velocities and the
counters equal the golden model's run; the device's own cycle count gives the board's rate
(``board_samples_per_s``)."""

from __future__ import annotations

import time
import warnings

import pytest
import torch
from pipetrain.compiler.build import FormatSpec, build_plan
from pipetrain.compiler.formats import apply_overrides
from pipetrain.compiler.ir import LayerIR, NetworkIR
from pipetrain.compiler.plan import QFormat
from pipetrain.host import open
from pipetrain.host.client import OnChipError
from pipetrain.host.device import DeviceError
from pipetrain.protocol.wire import LinkParams
from pipetrain.sim.golden import GoldenModel, onchip_order
from tiny_net import tiny

DIVISOR = 8
N_SET, EPOCHS = 20, 3
X_BITS = 11


def tiny_packed():
    """The tiny net (tests/tiny_net.py) with stage 1's input format Q(11, 8)."""
    _, model, config = tiny()
    layers = (LayerIR("0", 6, 5, "leaky_relu", 0.1), LayerIR("2", 5, 4, "relu", 0.0))
    ir = NetworkIR("tiny", 6, (*layers, LayerIR("4", 4, 3)), "cross_entropy")
    fs = apply_overrides(FormatSpec.default(3), {"s1.x": QFormat(X_BITS, 8)}, ir, config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tiny net's deliberate padding lanes
        plan = build_plan(ir, config, formats=fs, lanes=[2, 3, 2])
    return plan, model, config


def _set(n: int = N_SET, seed: int = 5):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, 6, generator=gen) * 4 - 1, torch.randint(0, 3, (n,), generator=gen)


def test_onchip_run_bit_exact_with_golden_through_the_uart_pins() -> None:
    plan, model, config = tiny_packed()
    params = LinkParams.from_plan(plan)
    assert params.x_bits == X_BITS and params.record_bytes == 3 + 9  # 66 bits in 9 bytes
    x, y = _set()
    with open(plan, "golden", config, model=model) as gold:
        gold.train(x, y, epochs=1)  # streamed: SAMPLES records at 11 bits
        want_stream = list(gold.results)
        want = gold.train(x, y, epochs=EPOCHS, onchip=True)
        want_sd = gold.state_dict()
        want_mem = gold.memories()
    t0 = time.perf_counter()
    opts = {"uart_divisor": DIVISOR, "onchip_samples": N_SET}
    with open(plan, "sim", config, model=model, shadow=True, sim_options=opts) as dev:
        dev.train(x, y, epochs=1)
        stream = list(dev.results)
        rep = dev.train(x, y, epochs=EPOCHS, onchip=True)
        v = dev.verify()
        c = dev.counters()
        sd, mem = dev.state_dict(), dev.memories()
        # a second call reuses the uploaded set (no STORE): the run's next 2 epochs
        rep2 = dev.train(x, y, epochs=2, onchip=True)
        v2 = dev.verify()
        with pytest.raises(OnChipError, match="21 samples.*holds 20"):
            dev.train(*_set(N_SET + 1), epochs=1, onchip=True)
        # per-sample records on request: one epoch per RUN, read back with READ_RESULTS
        before = len(dev.results)
        rep3 = dev.train(x, y, epochs=2, onchip=True, records=True)
        recs = dev.results[before:]
        # streaming again after the runs: the result numbers follow the run's samples
        dev.train(x[:5], y[:5], epochs=1)
        v3 = dev.verify()
    wall = time.perf_counter() - t0
    assert v.bit_exact and v2.bit_exact and v3.bit_exact, (
        v.mismatches + v2.mismatches + v3.mismatches
    )
    assert stream == want_stream[:N_SET] and len(stream) == N_SET  # the streamed epoch
    assert rep.epoch_summaries == want.epoch_summaries and len(rep.epoch_summaries) == EPOCHS
    assert all(torch.equal(sd[k], w) for k, w in want_sd.items())
    for k, w in want_mem.items():
        assert all(torch.equal(mem[k][t], w[t]) for t in w), k
    assert c["samples_trained"] == (1 + EPOCHS) * N_SET
    assert c["bad_crc"] == c["rx_timeouts"] == 0
    assert rep.accuracy == want.accuracy
    # a test that could fail: the epochs differ, and the order is the device's, not the host's
    assert len({s["loss_sum"] for s in rep.epoch_summaries}) == EPOCHS
    g = GoldenModel(plan, model, config)
    g.train(x, y, epochs=1)
    xq = g.quantise_input(x)
    for order in onchip_order(N_SET, config.seed, 1, EPOCHS):
        for i in order.tolist():
            g.submit(xq[i], int(y[i]), True)
        g.flush()
    assert all(torch.equal(want_sd[k], w) for k, w in g.state_dict().items())
    # the board's rate: the device's own cycle count, ≥ N cycles per sample (one feature a
    # cycle on sample_in) and ≤ the tick or the feed, whichever is longer, + 25 % (the flush
    # at the end of the run: 2S − 1 bubble ticks over 60 samples)
    per_sample = rep.device_cycles / (EPOCHS * N_SET)
    bound = max(plan.tick_cycles, plan.in_features + 2)
    assert plan.in_features <= per_sample <= 1.25 * bound, (per_sample, bound)
    assert rep.device_samples_per_s == pytest.approx(plan.clock_hz / per_sample)
    assert rep2.epochs == 2 and rep2.device_cycles > 0
    # the records agree with their summaries (and, through verify, with golden record by record)
    assert len(recs) == 2 * N_SET and rep3.loss is not None
    assert [s["loss_sum"] for s in rep3.epoch_summaries] == [
        sum(r[1] for r in recs[:N_SET]),
        sum(r[1] for r in recs[N_SET:]),
    ]
    s = dev.sim_stats
    assert s is not None and s["divisor"] == DIVISOR
    print(
        f"\non-chip set through the UART pins: {per_sample:.1f} cycles/sample (tick "
        f"{plan.tick_cycles}, N {plan.in_features}), {wall:.1f} s wall, {s['cycles']} cycles"
    )


def test_onchip_refusals() -> None:
    plan, model, config = tiny_packed()
    x, y = _set()
    with open(plan, "reference", config, model=model) as ref:
        with pytest.raises(DeviceError, match="golden or a link target"):
            ref.train(x, y, epochs=1, onchip=True)
    with open(plan, "golden", config, model=model) as gold:
        with pytest.raises(DeviceError, match="no checkpoints"):
            gold.train(x, y, epochs=1, onchip=True, checkpoint_every=5)
