"""What do the 18-bit multiplier operands cost in accuracy? Golden-18 vs exact vs float.

Usage: ``python benchmarks/operands_check.py [--models mlp-digits,...] [--seeds 0,1,2]
[--streams K] [--calib-epochs E] [--json FILE]``; ``--load A.json,B.json`` prints (and with
``--json`` combines) earlier runs' rows, e.g. of one process per model.

Issue 17 item 2 narrows the variable multiplies to one 18 × 18 block each (docs/numerics.md
§3.2, §5.2, §5.3): the forward and input-gradient MACs read the weights rounded half up to an
18-bit operand (``Stage.weight_operand``) and the learning-rate product is ``rhu(lr·δ, k)·x``
with an 18-bit scaled error (``UpdateConstants.lr_delta``); a plan records the rule as
``Plan.operand_bits = 18``. For each built-in (:data:`MODELS`) × seed this script compiles once
as ``pipetrain train MODEL --seed N`` does (formats ``auto`` calibrated on digits, default
lanes, ``operand_bits`` 18), builds the exact plan from the *same* FormatSpec, lanes and initial
weights with ``operand_bits=None`` (:func:`exact_result`: only the arithmetic differs, not the
formats) and trains three sides for the CLI's default epochs
(:data:`~pipetrain.host.cli.options.DEFAULT_EPOCHS`) on the same sample order:

* ``golden18``: the golden model of the 18-bit plan;
* ``exact``: the golden model of the exact plan (the arithmetic before issue 17);
* ``float``: the float PB reference trainer (``local_trainer("reference", …)``) on the plan.

A single run cannot resolve a 1 pp bar (benchmarks/formats_check.py's module docstring:
batch-1 SGD with momentum is chaotic, one run's accuracy moves by ~1–2 pp with any change of
the arithmetic), so each side is averaged over ``--streams K`` runs with formats_check's
machinery: golden runs with the plan's LFSR seeds and K − 1 other sets
(:func:`formats_check._golden_run`, the same K sets for both golden plans), float runs from the
initial weights and K − 1 starts perturbed by ≤ 1 LSB of ``w`` (:func:`formats_check._float_run`).
Per model × seed it prints the three mean accuracies, the gaps float − golden18, float − exact
and exact − golden18 (pp, ± the standard error from both sides' run-to-run spreads,
:func:`formats_check._se_pp`) and golden18's saturations per tensor (its first stream,
docs/numerics.md §8); the summary per model (:func:`summary`, formats_check's
:func:`~formats_check.summary` on each gap) gives the mean over seeds with its standard errors
between seeds and within (from the run-to-run spreads). The issue's bar (issue 17, done-when):
golden within 1 pp of the float reference on mlp-digits with the narrowed multiplies, 3 seeds,
mean. Results: benchmarks/operands_results.md.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import formats_check as fc
import numpy as np
from pipetrain.compiler.compile import CompileResult, compile_result
from pipetrain.data import Dataset, load_digits
from pipetrain.host.cli.options import DEFAULT_EPOCHS
from pipetrain.host.device import local_trainer
from pipetrain.host.flow import compile_design
from pipetrain.sim.golden import GoldenModel

#: The built-ins of the check (docs/architecture.md: 64→32→10, 64→32→32→32→10, 64→128→64→10).
MODELS = ("mlp-digits", "mlp-digits-deep", "mlp-digits-wide")

#: The gaps reported, as (name, minuend side, subtrahend side): each is mean(a) − mean(b).
GAPS = (
    ("float_minus_golden18", "float", "golden18"),
    ("float_minus_exact", "float", "exact"),
    ("exact_minus_golden18", "exact", "golden18"),
)


def exact_result(r: CompileResult) -> CompileResult:
    """The exact-arithmetic twin of ``r``: compiled from ``r``'s model (the same initial
    weights), config, FormatSpec and per-stage lanes with ``operand_bits=None`` (every product
    exact, docs/numerics.md "Changes"), so it differs from ``r.plan`` only in the multipliers'
    operands — ``weight_operand``, ``update.lr_delta`` / ``sc_lr_b_delta`` and what follows from
    them (``products``, the accumulator widths, the update sums' alignment) — and in
    ``Plan.operand_bits``. Raises what :func:`compile_result` raises (nothing for a plan it
    built before)."""
    return compile_result(
        r.model,
        r.config,
        formats=r.formats,
        lanes=[s.lanes for s in r.plan.stages],
        operand_bits=None,
        name=r.name,
        writers=(),
    )


def _golden_streams(
    r: CompileResult, ds: Dataset, epochs: int, seed: int, streams: int
) -> tuple[list[float], GoldenModel]:
    """Test accuracies of ``streams`` golden runs of ``r.plan`` (the plan's own LFSR seeds,
    then formats_check's other sets) and the first run's trainer (its saturation counters)."""
    g = local_trainer("golden", r.plan, r.model, r.config)
    assert isinstance(g, GoldenModel)
    g.train(ds.x_train, ds.y_train, epochs=epochs)
    accs = [g.evaluate(ds.x_test, ds.y_test)]
    accs += [fc._golden_run(r, ds, epochs, seed, k) for k in range(1, streams)]
    return accs, g


def _float_streams(
    r: CompileResult, ds: Dataset, epochs: int, seed: int, streams: int
) -> list[float]:
    """Test accuracies of ``streams`` float reference runs: the initial weights, then
    formats_check's starts perturbed by ≤ 1 LSB of ``w``."""
    f = local_trainer("reference", r.plan, r.model, r.config)
    f.train(ds.x_train, ds.y_train, epochs=epochs)
    accs = [f.evaluate(ds.x_test, ds.y_test)]
    return accs + [fc._float_run(r, ds, epochs, seed, k) for k in range(1, streams)]


def _gap(model: str, seed: int, a: list[float], b: list[float]) -> dict[str, Any]:
    """One seed's gap mean(a) − mean(b) in formats_check's row keys (``b`` in the golden slot,
    ``a`` in the float slot), so that :func:`formats_check.summary` averages it over seeds."""
    return {
        "set": model,
        "seed": seed,
        "streams": len(a),
        "gap_pp": 100 * (a[0] - b[0]),
        "stream_gap_pp": 100 * (float(np.mean(a)) - float(np.mean(b))),
        "stream_gap_se_pp": fc._se_pp(b, a),
        "golden_streams": b,
        "reference_starts": a,
    }


def check(
    model: str,
    seed: int,
    streams: int = 4,
    ds: Dataset | None = None,
    calib_epochs: int | None = None,
) -> dict[str, Any]:
    """One built-in × seed: the three sides' test accuracies over ``streams`` runs each, their
    means, the :data:`GAPS` (pp) with standard errors, golden18's saturations per tensor (first
    stream) and both golden plans' total saturations (first stream), the plans' lanes,
    formats, weight operands and scaled-error formats, and the wall seconds. ``ds``: digits
    (loaded when None). ``calib_epochs``: the ``auto`` formats are calibrated over that many
    epochs (the compile's ``epochs``; None: the run's :data:`DEFAULT_EPOCHS`, as ``pipetrain
    train`` calibrates over its epochs — training always runs :data:`DEFAULT_EPOCHS`; the
    README's table was measured with the config's 1, train's calibration before it covered the
    run)."""
    t0 = time.perf_counter()
    ds = load_digits() if ds is None else ds
    epochs = DEFAULT_EPOCHS
    cal = {"epochs": epochs if calib_epochs is None else calib_epochs}
    r18 = compile_design(model, data=ds, config_overrides={"seed": seed, **cal}, writers=())
    rex = exact_result(r18)
    t_compile = time.perf_counter() - t0
    sides: dict[str, list[float]] = {}
    sides["golden18"], g18 = _golden_streams(r18, ds, epochs, seed, streams)
    sides["exact"], gex = _golden_streams(rex, ds, epochs, seed, streams)
    sides["float"] = _float_streams(r18, ds, epochs, seed, streams)
    row: dict[str, Any] = {
        "model": model,
        "seed": seed,
        "epochs": epochs,
        "calib_epochs": r18.config.epochs,
        "streams": streams,
        "operand_bits": r18.plan.operand_bits,
        "lanes": [s.lanes for s in r18.plan.stages],
        "formats": [str(s.formats) for s in r18.plan.main_stages],
        "weight_operand": [str(s.weight_operand) for s in r18.plan.stages],
        "lr_delta": [str(s.update.lr_delta) for s in r18.plan.stages],
        "plan_hash": r18.plan.hash,
        "exact_plan_hash": rex.plan.hash,
    }
    for side, accs in sides.items():
        row[side] = accs
        row[f"{side}_mean"] = float(np.mean(accs))
    for name, a, b in GAPS:
        g = _gap(model, seed, sides[a], sides[b])
        row[f"{name}_pp"] = g["stream_gap_pp"]
        row[f"{name}_se_pp"] = g["stream_gap_se_pp"]
        row[f"{name}_single_pp"] = g["gap_pp"]
    row["saturations"] = g18.saturations
    row["tensor_saturations"] = g18.tensor_saturations
    row["input_saturations"] = g18.input_saturations
    row["exact_saturations"] = gex.saturations
    row["notes"] = list(r18.warnings)
    row["compile_s"] = t_compile
    row["wall_s"] = time.perf_counter() - t0
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model over its seeds: each side's mean accuracy and, per gap of :data:`GAPS`,
    formats_check's :func:`~formats_check.summary` of it (``stream_gap_pp``: mean over seeds of
    the stream-averaged gap; ``se_between_pp``: sd of the per-seed gaps / √seeds;
    ``se_within_pp``: √Σse² / seeds from the run-to-run spreads; ``gap_pp``, ``gap_se_pp``:
    the single-run gap of the first streams), and golden18's saturations summed over seeds."""
    out: dict[str, dict[str, Any]] = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        sel = [r for r in rows if r["model"] == model]
        m: dict[str, Any] = {"seeds": len(sel), "streams": sel[0]["streams"]}
        for side in ("golden18", "exact", "float"):
            m[side] = float(np.mean([r[f"{side}_mean"] for r in sel]))
        for name, a, b in GAPS:
            m[name] = fc.summary([_gap(model, r["seed"], r[a], r[b]) for r in sel])[model]
        m["saturations"] = sum(r["saturations"] for r in sel)
        out[model] = m
    return out


def _sat(r: dict[str, Any]) -> str:
    """golden18's saturations per tensor: per stage y/gin/u/w, then the loss unit's d."""
    per = " ".join(
        "/".join(str(t.get(k, 0)) for k in ("y", "gin", "u", "w"))
        for t in r["tensor_saturations"][:-1]
    )
    return f"{per}, {r['tensor_saturations'][-1].get('d', 0)}"


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table: one line per model × seed (mean accuracies over the streams, gaps ± the
    standard error), then per model the mean over seeds (gaps ± SE within, and between
    seeds)."""
    out = [
        "| model | seed | golden-18 | golden exact | float | float − golden-18 (pp) | "
        "float − exact (pp) | exact − golden-18 (pp) | saturations golden-18 (y/gin/u/w, d) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        gaps = " | ".join(f"{r[f'{n}_pp']:+.2f} ± {r[f'{n}_se_pp']:.2f}" for n, _, _ in GAPS)
        out.append(
            f"| {r['model']} | {r['seed']} | {r['golden18_mean']:.4f} | {r['exact_mean']:.4f} | "
            f"{r['float_mean']:.4f} | {gaps} | {_sat(r)} |"
        )
    for model, m in summary(rows).items():
        gaps = " | ".join(
            f"**{m[n]['stream_gap_pp']:+.2f}** ± {m[n]['se_within_pp']:.2f} "
            f"(between seeds ± {m[n]['se_between_pp']:.2f})"
            for n, _, _ in GAPS
        )
        out.append(
            f"| **{model}** mean | {m['seeds']} seeds × {m['streams']} | {m['golden18']:.4f} | "
            f"{m['exact']:.4f} | {m['float']:.4f} | {gaps} | {m['saturations']} in all |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated built-ins")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    ap.add_argument("--streams", type=int, default=4, help="runs per seed and side")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    ap.add_argument(
        "--calib-epochs",
        type=int,
        default=None,
        help="calibrate the auto formats over this many epochs (default: the run's, as train does)",
    )
    ap.add_argument(
        "--load",
        default=None,
        help="comma-separated --json files of earlier runs: print their table and summary "
        "(with --json: write the rows combined) instead of training",
    )
    args = ap.parse_args()
    if args.load:
        rows = [r for path in args.load.split(",") for r in json.load(open(path))]
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=2)
        print(table(rows))
        print(json.dumps(summary(rows), indent=1))
        return
    ds = load_digits()
    rows = []
    for model in args.models.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            r = check(model, seed, args.streams, ds, args.calib_epochs)
            rows.append(r)
            print(
                f"{model:16} seed {seed}: golden18 {r['golden18_mean']:.4f} exact "
                f"{r['exact_mean']:.4f} float {r['float_mean']:.4f}; float−g18 "
                f"{r['float_minus_golden18_pp']:+.2f} ± {r['float_minus_golden18_se_pp']:.2f}, "
                f"float−exact {r['float_minus_exact_pp']:+.2f} ± "
                f"{r['float_minus_exact_se_pp']:.2f}, exact−g18 "
                f"{r['exact_minus_golden18_pp']:+.2f} ± {r['exact_minus_golden18_se_pp']:.2f} pp;"
                f" saturations {_sat(r)} ({r['wall_s']:.0f} s)",
                flush=True,
            )
            if args.json:  # after every row: a long run keeps what it measured
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=2)
    print(table(rows))
    print(json.dumps(summary(rows), indent=1))


if __name__ == "__main__":
    main()
