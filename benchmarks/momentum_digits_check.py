"""What does a shift-add momentum cost in accuracy? Golden at D signed digits vs golden at full
precision vs float.

Usage: ``python benchmarks/momentum_digits_check.py [--models mlp-digits,...] [--digits 4]
[--lfsr-leap 16] [--seeds 0,1,2] [--streams K] [--json FILE]``.

``--momentum-digits D`` (``TrainConfig.momentum_digits``, docs/numerics.md §1) rounds the
hardware's momentum to at most D canonical signed digits — 0.9 has 9 at 18 bits, 4 give
0.8984375, 3 give 0.90625 — so a lane's ``m·u`` in logic takes D − 1 adders instead of 8 (at
mlp-digits 8×5,10 on the ULX3S, stage 1's update units synthesise to 29,923 LUT4 slots at 9
digits and 21,991 at 4; docs/boards.md §3). For each built-in × seed this compiles the plan
``pipetrain train MODEL --seed N`` compiles (formats ``auto`` on digits, default lanes), its
D-digit twin from the *same* FormatSpec, lanes and initial weights (:func:`digits_result`:
only the momentum constant differs, and the Spike Compensation coefficients that follow it),
and trains three sides for the CLI's default epochs on the same sample order, each the mean of
K runs (operands_check's streams, :func:`operands_check._golden_streams` /
:func:`~operands_check._float_streams`):

* ``golden``: the golden model of the full-precision plan;
* ``golden_d``: the golden model of the D-digit plan (with ``--lfsr-leap L`` also its
  stochastic rounding drawn every L LFSR steps, docs/numerics.md §6);
* ``float``: the float PB reference trainer at the configured momentum (0.9).

Prints per model × seed the means and the gaps float − golden_d and golden − golden_d (pp, ±
the standard error from both sides' spreads), and per model the mean over seeds (formats_check's
summary). Results: benchmarks/momentum_digits_results.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Any

import formats_check as fc
import numpy as np
import operands_check as oc
from pipetrain.compiler.compile import CompileResult, compile_result
from pipetrain.data import Dataset, load_digits
from pipetrain.host.cli.options import DEFAULT_EPOCHS
from pipetrain.host.flow import compile_design

#: The gaps reported, as (name, minuend side, subtrahend side): each is mean(a) − mean(b).
GAPS = (
    ("float_minus_golden_d", "float", "golden_d"),
    ("golden_minus_golden_d", "golden", "golden_d"),
)


def digits_result(r: CompileResult, digits: int, leap: int = 0) -> CompileResult:
    """The D-digit twin of ``r``: ``r``'s model, FormatSpec and lanes, its config with
    ``momentum_digits = digits`` (and ``lfsr_leap = leap``: 0, the default 32 steps). Raises
    what :func:`compile_result` raises."""
    return compile_result(
        r.model,
        dataclasses.replace(r.config, momentum_digits=digits, lfsr_leap=leap),
        formats=r.formats,
        lanes=[s.lanes for s in r.plan.stages],
        name=r.name,
        writers=(),
    )


def check(
    model: str, seed: int, digits: int, streams: int, ds: Dataset, leap: int = 0
) -> dict[str, Any]:
    """One built-in × seed: the three sides' accuracies over ``streams`` runs, the :data:`GAPS`
    (pp ± SE), both plans' momentum constants and hashes, the saturations of the D-digit plan's
    first stream, and the wall seconds."""
    t0 = time.perf_counter()
    epochs = DEFAULT_EPOCHS
    r = compile_design(
        model, data=ds, config_overrides={"seed": seed, "epochs": epochs}, writers=()
    )
    rd = digits_result(r, digits, leap)
    sides: dict[str, list[float]] = {}
    sides["golden"], _ = oc._golden_streams(r, ds, epochs, seed, streams)
    sides["golden_d"], gd = oc._golden_streams(rd, ds, epochs, seed, streams)
    sides["float"] = oc._float_streams(r, ds, epochs, seed, streams)
    m, md = r.plan.stages[0].update.momentum, rd.plan.stages[0].update.momentum
    row: dict[str, Any] = {
        "model": model,
        "seed": seed,
        "digits": digits,
        "lfsr_leap": rd.plan.lfsr_leap,
        "epochs": epochs,
        "streams": streams,
        "momentum": m.quantised,
        "momentum_d": md.quantised,
        "plan_hash": r.plan.hash,
        "plan_hash_d": rd.plan.hash,
        "lanes": [s.lanes for s in r.plan.stages],
    }
    for side, accs in sides.items():
        row[side] = accs
        row[f"{side}_mean"] = float(np.mean(accs))
    for name, a, b in GAPS:
        g = oc._gap(model, seed, sides[a], sides[b])
        row[f"{name}_pp"], row[f"{name}_se_pp"] = g["stream_gap_pp"], g["stream_gap_se_pp"]
    row["saturations_d"] = gd.saturations
    row["wall_s"] = time.perf_counter() - t0
    return row


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: a line per model × seed, then per model the mean over seeds (± SE within, and
    between seeds)."""
    out = [
        "| model | seed | m → m_D (leap) | golden | golden D | float | float − golden D (pp) | "
        "golden − golden D (pp) | saturations golden D |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        gaps = " | ".join(f"{r[f'{n}_pp']:+.2f} ± {r[f'{n}_se_pp']:.2f}" for n, _, _ in GAPS)
        out.append(
            f"| {r['model']} | {r['seed']} | {r['momentum']:.6g} → {r['momentum_d']:.6g} "
            f"({r.get('lfsr_leap', 32)}) | "
            f"{r['golden_mean']:.4f} | {r['golden_d_mean']:.4f} | {r['float_mean']:.4f} | "
            f"{gaps} | {r['saturations_d']} |"
        )
    for model in dict.fromkeys(r["model"] for r in rows):
        sel = [r for r in rows if r["model"] == model]
        cells = []
        for _name, a, b in GAPS:
            s = fc.summary([oc._gap(model, r["seed"], r[a], r[b]) for r in sel])[model]
            cells.append(
                f"**{s['stream_gap_pp']:+.2f}** ± {s['se_within_pp']:.2f} "
                f"(between seeds ± {s['se_between_pp']:.2f})"
            )
        means = " | ".join(
            f"{np.mean([r[f'{side}_mean'] for r in sel]):.4f}"
            for side in ("golden", "golden_d", "float")
        )
        out.append(
            f"| **{model}** mean | {len(sel)} seeds × {sel[0]['streams']} | | {means} | "
            f"{' | '.join(cells)} | {sum(r['saturations_d'] for r in sel)} in all |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp-digits", help="comma-separated built-ins")
    ap.add_argument("--digits", type=int, default=4, help="signed digits of the momentum")
    ap.add_argument("--lfsr-leap", type=int, default=0, help="the D side's LFSR leap (0: 32)")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    ap.add_argument("--streams", type=int, default=4, help="runs per seed and side")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    ap.add_argument("--load", default=None, help="print the table of earlier --json files")
    args = ap.parse_args()
    if args.load:
        rows = [r for path in args.load.split(",") for r in json.load(open(path))]
        print(table(rows))
        return
    ds, rows = load_digits(), []
    for model in args.models.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            r = check(model, seed, args.digits, args.streams, ds, args.lfsr_leap)
            rows.append(r)
            print(
                f"{model:16} seed {seed}: m {r['momentum']:.6g} → {r['momentum_d']:.6g}; golden "
                f"{r['golden_mean']:.4f} golden_d {r['golden_d_mean']:.4f} float "
                f"{r['float_mean']:.4f}; float−golden_d {r['float_minus_golden_d_pp']:+.2f} ± "
                f"{r['float_minus_golden_d_se_pp']:.2f}, golden−golden_d "
                f"{r['golden_minus_golden_d_pp']:+.2f} ± {r['golden_minus_golden_d_se_pp']:.2f} "
                f"pp ({r['wall_s']:.0f} s)",
                flush=True,
            )
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=2)
    print(table(rows))


if __name__ == "__main__":
    main()
