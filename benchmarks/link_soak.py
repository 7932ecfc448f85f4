"""Link soak: frames through a damaging line, exactly-once checked at every error rate.

Usage: ``python benchmarks/link_soak.py [--model-frames N] [--rtl-frames N] [--json FILE]``
(defaults: 100,000 frames through the protocol's device model and 10,000 through the RTL link
engine in Verilator, split evenly over :data:`RATES`).

Both halves stream training and inference samples, read results, write random memories and
read them back, through :class:`~pipetrain.host.transport.FaultyTransport` in both directions:
each chunk, with probability ``rate`` per kind, is dropped, truncated, corrupted (1–3 bytes
XORed: bit flips), duplicated, preceded by junk that may hold a sync marker, loses a byte,
doubles a byte, or suffers a noise burst (4–64 bytes overwritten).

* **device model** — :class:`~pipetrain.protocol.device_model.LinkDeviceModel` with the toy
  network (:class:`~pipetrain.protocol.device_model.ToyNetwork`) over an in-process loopback.
  Every sample carries its number in its features, so the network's list of applied samples
  shows a lost sample or one applied twice; weights are random 32-bit words written and read
  back.
* **RTL** — the ``sim`` target (``LinkEngine`` ↔ ``NetworkTop`` in Verilator over TCP, a small
  6 → 5 → 3 net) with its golden shadow: after the run every result record, weight, velocity
  and counter is compared with the golden model fed the same stream (a lost or doubled sample
  changes them), and the device's ``accepted`` / ``samples_trained`` counters with the host's.

Printed per rate: host frames (commands and retransmissions), faults injected, retransmits,
samples sent, trained, lost (must be 0), applied twice (must be 0), weights read back correct.
Source: *derived* (docs/protocol.md §3, the stop-and-wait ARQ it soaks).
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time
import warnings
from typing import Any

import numpy as np
import torch
from pipetrain.compiler.build import build_plan
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.ir import LayerIR, NetworkIR
from pipetrain.compiler.plan import Plan
from pipetrain.host.client import LinkClient
from pipetrain.host.transport import FaultyTransport, LoopbackTransport, Transport
from pipetrain.protocol.device_model import LinkDeviceModel, ToyNetwork
from pipetrain.protocol.wire import LinkParams
from torch import nn

#: Probability of each fault kind per chunk and direction.
RATES = (0.0, 0.001, 0.01, 0.05)
#: Seconds a link attempt waits for the RTL's answer before retransmitting (a tiny-net frame
#: is answered in a few ms of simulation; a too-early retransmission is harmless).
RTL_TIMEOUT = 0.05


def faulty(inner: Transport, rng: random.Random, rate: float) -> FaultyTransport:
    """``inner`` behind every fault kind at probability ``rate`` each."""
    kinds = ("drop", "truncate", "corrupt", "duplicate", "garbage", "byte_drop", "byte_dup")
    return FaultyTransport(inner, rng, **{f"p_{k}": rate for k in kinds}, p_burst=rate)


def toy_plan() -> Plan:
    """4 → 3 → 2 with LWP ``w`` form (three memory kinds), 16-bit inputs."""
    ir = NetworkIR("soak", 4, (LayerIR("0", 4, 3, "relu"), LayerIR("2", 3, 2)))
    return build_plan(ir, TrainConfig(mitigation="lwp", lwp_form="w"))


def _tally(sent: list[int], applied: list[int]) -> tuple[int, int]:
    """(lost, applied twice) of sample numbers ``sent`` given those ``applied``."""
    count = collections.Counter(applied)
    lost = sum(1 for s in sent if count[s] == 0)
    twice = sum(c - 1 for c in count.values() if c > 1)
    return lost, twice


def soak_model(frames: int, rate: float, seed: int = 0) -> dict[str, Any]:
    """Run until the host has sent ``frames`` frames through the device model at ``rate``."""
    rng = random.Random(seed)
    plan = toy_plan()
    params = LinkParams.from_plan(plan)
    net = ToyNetwork(params)
    dev = LinkDeviceModel(params, net)
    tr = faulty(LoopbackTransport(dev), rng, rate)
    cli = LinkClient(tr, plan, max_retries=100_000)
    cli.reset_counters()
    sent: list[int] = []
    trains = 0
    weights_ok = True
    t0 = time.perf_counter()
    n = 0
    while cli._stats.commands + cli.retransmits < frames:
        k = rng.randint(1, 40)
        ids = np.arange(n, n + k)
        xq = np.stack([ids % 1000, ids // 1000 % 1000, ids // 1_000_000, ids % 7], axis=1)
        train = [rng.random() < 0.8 for _ in range(k)]
        cli.send_samples(xq, [int(i % params.classes) for i in ids], train)
        sent += ids.tolist()
        trains += sum(train)
        n += k
        if rng.random() < 0.05:  # a memory round trip under the same faults
            mem = [
                {
                    kind: np.array(
                        [[rng.randrange(-(2**31), 2**31) for _ in range(c)] for _ in range(r)]
                    )
                    for kind in ("w", "u", "w_prev")[:kinds]
                }
                for r, c, kinds in zip(
                    params.stage_rows, params.stage_cols, params.stage_kinds, strict=True
                )
            ]
            cli.write_weights(mem)
            back = cli.read_weights()
            weights_ok &= all(
                np.array_equal(back[s][kind], mem[s][kind])
                for s in range(len(mem))
                for kind in mem[s]
            )
    cli.flush()
    while cli._outstanding():
        cli.read_results()
    seconds = time.perf_counter() - t0
    applied = [int(x[0]) + 1000 * int(x[1]) + 1_000_000 * int(x[2]) for x, _, _ in net.applied]
    lost, twice = _tally(sent, applied)
    c = cli.counters()
    return {
        "where": "device model",
        "rate": rate,
        "frames": cli._stats.commands + cli.retransmits,
        "faults": sum(tr.faults.values()),
        "retransmits": cli.retransmits,
        "samples_sent": len(sent),
        "trained": net.samples_trained,
        "lost": lost,
        "applied_twice": twice,
        "counters_ok": c.samples_trained == trains == net.samples_trained
        and c.accepted == len(sent),
        "weights_ok": bool(weights_ok),
        "seconds": seconds,
    }


def rtl_net() -> tuple[Plan, nn.Module]:
    """The 6 → 5 → 3 net of the host-device tests (2 lanes, then 1)."""
    ir = NetworkIR("soak", 6, (LayerIR("0", 6, 5, "relu"), LayerIR("2", 5, 3)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = build_plan(ir, TrainConfig(momentum=0.9, lr=0.05, seed=3), lanes=[2, 1])
    torch.manual_seed(1)
    return plan, nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def soak_rtl(frames: int, rate: float, seed: int = 0) -> dict[str, Any]:
    """Run the ``sim`` target until the host has sent ``frames`` frames at ``rate``; compare
    with the golden shadow."""
    from pipetrain.host import open as open_device

    rng = random.Random(seed)
    plan, model = rtl_net()
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(200, 6, generator=g) * 2 - 0.5
    y = torch.randint(0, 3, (200,), generator=g)
    t0 = time.perf_counter()
    with open_device(plan, "sim", model=model, shadow=True, timeout=RTL_TIMEOUT) as dev:
        cli = dev.client
        assert cli is not None
        cli.max_retries = 100_000
        tr = faulty(cli.transport, rng, rate)
        cli.transport = tr
        sent = 0
        while cli._stats.commands + cli.retransmits < frames:
            dev.train(x, y)
            sent += len(x)
            dev.evaluate(x[:40], y[:40])  # inference samples in between
            sent += 40
        v = dev.verify()  # results, every weight and velocity word, counters
        c = dev.counters()
        frames_sent = cli._stats.commands + cli.retransmits
        retransmits = cli.retransmits
    seconds = time.perf_counter() - t0
    return {
        "where": "RTL (Verilator)",
        "rate": rate,
        "frames": frames_sent,
        "faults": sum(tr.faults.values()),
        "retransmits": retransmits,
        "samples_sent": sent,
        "trained": c["samples_trained"],
        "lost": max(0, sent - c["accepted"]),
        "applied_twice": max(0, c["accepted"] - sent),
        "counters_ok": c["accepted"] == sent and c["samples_trained"] == dev.samples_trained,
        "weights_ok": v.bit_exact,
        "mismatches": v.mismatches,
        "memory_words": v.memories,
        "seconds": seconds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-frames", type=int, default=100_000, help="device-model frames")
    ap.add_argument("--rtl-frames", type=int, default=10_000, help="RTL frames (0: skip)")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    args = ap.parse_args()
    rows = []
    head = (
        f"{'where':16} {'rate':>6} {'frames':>7} {'faults':>7} {'retx':>6} {'sent':>7} "
        f"{'trained':>7} {'lost':>4} {'twice':>5} {'weights':>7} {'s':>6}"
    )
    print(head)
    jobs = [(soak_model, args.model_frames // len(RATES), r) for r in RATES]
    if args.rtl_frames:
        jobs += [(soak_rtl, args.rtl_frames // len(RATES), r) for r in RATES]
    for fn, frames, rate in jobs:
        row = fn(frames, rate)
        rows.append(row)
        print(
            f"{row['where']:16} {rate:6.3f} {row['frames']:7d} {row['faults']:7d} "
            f"{row['retransmits']:6d} {row['samples_sent']:7d} {row['trained']:7d} "
            f"{row['lost']:4d} {row['applied_twice']:5d} "
            f"{'ok' if row['weights_ok'] else 'WRONG':>7} {row['seconds']:6.1f}",
            flush=True,
        )
    bad = [r for r in rows if r["lost"] or r["applied_twice"] or not r["weights_ok"]]
    bad += [r for r in rows if not r["counters_ok"]]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    total = {
        w: sum(r["frames"] for r in rows if r["where"] == w) for w in {r["where"] for r in rows}
    }
    print("frames: " + ", ".join(f"{w} {n:,}" for w, n in sorted(total.items())))
    if bad:
        print(f"FAILED: {len(bad)} rows lost or doubled a sample or read wrong weights")
        sys.exit(1)


if __name__ == "__main__":
    main()
