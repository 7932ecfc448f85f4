"""Training throughput of the golden model next to the float reference trainer (same run).

Usage: ``python benchmarks/golden_speed.py [--samples N] [--json FILE]``. For each of
``mlp-digits`` and ``mlp-digits-deep`` (static default formats, PB, stochastic rounding) it
trains both targets on the same N digits samples and prints samples/s of wall-clock time and
of this process's CPU time (the CPU figure is the fair one on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import time

from pipetrain.compiler.compile import compile_result
from pipetrain.data import load_digits
from pipetrain.host.device import local_trainer


def measure(model: str, target: str, samples: int) -> dict[str, float]:
    """Train ``samples`` digits samples of ``model`` on ``target``; return the rates."""
    ds = load_digits()
    result = compile_result(model, formats="default")
    trainer = local_trainer(target, result.plan, result.model, result.config)
    x, y = ds.x_train, ds.y_train
    epochs = -(-samples // len(x))
    wall, cpu = time.perf_counter(), time.process_time()
    trainer.train(x, y, epochs=epochs)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    n = epochs * len(x)
    return {"samples": n, "samples_per_s": n / wall, "samples_per_cpu_s": n / cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1437, help="training samples per run")
    ap.add_argument("--json", default=None, help="write the numbers to this file")
    args = ap.parse_args()
    out = {}
    print(f"{'model':18} {'target':10} {'samples/s':>10} {'samples/CPU-s':>14}")
    for model in ("mlp-digits", "mlp-digits-deep"):
        for target in ("golden", "reference"):
            r = measure(model, target, args.samples)
            out[f"{model}/{target}"] = r
            print(
                f"{model:18} {target:10} {r['samples_per_s']:10.0f} {r['samples_per_cpu_s']:14.0f}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
