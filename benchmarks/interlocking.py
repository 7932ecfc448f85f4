"""Local and interlocking learning vs global PB on ``mlp-digits-deep8``, on the hardware
arithmetic (issue 15 item 6, golden side).

Each setting trains the 8-stage built-in (64→32×7→10) with the fixed-point golden model — the
RTL's bit-exact specification (docs/numerics.md §7.2) — for ``--epochs`` epochs per seed on
digits, from the same initial weights and sample order per seed, and reports the test accuracy
of the main network (mean ± standard deviation over the seeds) next to the plan's figures:
the largest stage delay (updates), the stash (input stash + activation-derivative masks as
built, bits: Σ ``Stage.stash_bits``), every memory of the design (bits: ``Plan.memory_bits``,
heads and their loss units included) and the datapath multipliers (``Plan.multipliers``).
``cycles_per_sample`` is the RTL's measured spacing of result records (``pipetrain sim``); it
reads ``n/a`` until the HDL builds auxiliary heads.

Settings (``SETTINGS``): global PB, local, interlocking d = 1 and d = 2 with the ``only`` and
``sum`` rules; blocks end after stages 2, 4, 6 (K = 4 blocks of two stages, one-stage heads).
Formats are calibrated once per setting on a float run of ``--calib-epochs`` epochs (the same
calibration ``pipetrain train`` runs, shortened).

Run: ``python benchmarks/interlocking.py [--seeds 0,1,2] [--epochs 10] [--lr 0.002]
[--out FILE.md] [--jsonl RUNS.jsonl]`` (about 3 minutes per seed and setting on one loaded
core). lr 0.002 (momentum 0.9, batch 1): global PB trains the He-initialised built-in (2
epochs: 46 % float, against 10 % at lr 0.01, where exact batch-1 SGD already diverges).
Source: Gomez et al., "Interlocking Backpropagation", JMLR 2022, §3 (the settings); the
hardware numbers are the plan's (docs/architecture.md §2.4).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch
from pipetrain.compiler.config import TrainConfig
from pipetrain.data import load_digits
from pipetrain.host.flow import compile_design
from pipetrain.sim.golden import GoldenModel

__all__ = ["SETTINGS", "MODEL", "plan_figures", "run_setting", "table"]

MODEL = "mlp-digits-deep8"
BLOCKS = (2, 4, 6)

#: name → TrainConfig overrides of one setting.
SETTINGS: dict[str, dict[str, Any]] = {
    "global PB": {},
    "local": {"strategy": "local", "blocks": BLOCKS},
    "interlocking d=1 only": {"strategy": "interlocking", "blocks": BLOCKS, "distance": 1},
    "interlocking d=1 sum": {
        "strategy": "interlocking", "blocks": BLOCKS, "distance": 1, "rule": "sum",
    },
    "interlocking d=2 only": {"strategy": "interlocking", "blocks": BLOCKS, "distance": 2},
    "interlocking d=2 sum": {
        "strategy": "interlocking", "blocks": BLOCKS, "distance": 2, "rule": "sum",
    },
}  # fmt: skip


def plan_figures(plan: Any) -> dict[str, int]:
    """The plan's hardware figures of one setting: ``max_delay`` (updates), ``stash_bits``,
    ``memory_bits`` (bits) and ``multipliers``."""
    return {
        "max_delay": max(st.delay for st in plan.stages),
        "stash_bits": sum(st.stash_bits for st in plan.stages),
        "memory_bits": plan.memory_bits,
        "multipliers": plan.multipliers,
    }


def run_setting(
    overrides: dict[str, Any], seed: int, epochs: int, lr: float, calib_epochs: int
) -> dict[str, Any]:
    """Compile and train one setting for one seed on the golden model; returns the plan's
    figures (:func:`plan_figures`), ``test_accuracy`` (fraction), ``plan_hash`` and
    ``seconds`` (wall time of compile + training)."""
    t0 = time.perf_counter()
    ds = load_digits()
    cfg = {"lr": lr, "seed": seed, "epochs": calib_epochs} | overrides
    res = compile_design(MODEL, data=ds, config_overrides=cfg, seed=seed, writers=())
    config = TrainConfig.from_dict(
        {k: v for k, v in res.plan.train.items() if k not in ("lr1", "momentum1")}
    )
    golden = GoldenModel(res.plan, res.model, config)
    golden.train(ds.x_train, ds.y_train, epochs=epochs)
    acc = golden.evaluate(ds.x_test, ds.y_test)
    return plan_figures(res.plan) | {
        "test_accuracy": acc,
        "plan_hash": res.plan.hash,
        "seconds": time.perf_counter() - t0,
    }


def table(rows: dict[str, list[dict[str, Any]]], seeds: list[int], epochs: int, lr: float) -> str:
    """The Markdown table of the runs (``rows``: setting → one result per seed)."""
    out = [
        f"`{MODEL}` on digits, golden model (the RTL's arithmetic), {epochs} epochs, lr {lr:g}, "
        f"momentum 0.9, seeds {','.join(map(str, seeds))}; blocks end after stages "
        f"{','.join(map(str, BLOCKS))}",
        "",
        "| setting | test accuracy | max delay | stash bits | memory bits | multipliers | "
        "cycles/sample (RTL) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, runs in rows.items():
        accs = [r["test_accuracy"] for r in runs]
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        r = runs[0]
        out.append(
            f"| {name} | {statistics.mean(accs):.3f} ± {sd:.3f} | {r['max_delay']} | "
            f"{r['stash_bits']:,} | {r['memory_bits']:,} | {r['multipliers']} | n/a |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Command line: run every setting for every seed, print (and with ``--out`` write) the
    table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.002)
    ap.add_argument("--calib-epochs", type=int, default=1)
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated names")
    ap.add_argument("--out", default=None)
    ap.add_argument("--jsonl", default=None, help="append every run's result here as it ends")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    names = [n.strip() for n in args.settings.split(",")]
    rows: dict[str, list[dict[str, Any]]] = {}
    for name in names:
        for seed in seeds:
            r = run_setting(SETTINGS[name], seed, args.epochs, args.lr, args.calib_epochs)
            rows.setdefault(name, []).append(r)
            if args.jsonl:
                with open(args.jsonl, "a") as f:
                    f.write(json.dumps({"setting": name, "seed": seed, **r}) + "\n")
            print(
                f"{name} seed {seed}: accuracy {r['test_accuracy']:.4f} ({r['seconds']:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    text = table(rows, seeds, args.epochs, args.lr)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
