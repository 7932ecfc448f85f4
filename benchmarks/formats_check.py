"""Do the ``auto`` formats hold on a user's data? Golden model against the float reference.

Usage: ``python benchmarks/formats_check.py [--seeds 0,1,2] [--sets digits,wide,...] [--streams
K] [--null] [--format KEY=Qi.f] [--json FILE]``. For each data set × seed it compiles the
data-sized ``mlp`` with ``--formats auto`` (calibrated on the training set over the whole
training run, docs/architecture.md §4.2), trains the fixed-point golden model and the float PB
reference trainer on the same plan, the same initial weights and the same sample order, and
prints both test accuracies, their gap in percentage points and the golden run's saturations per
tensor (docs/numerics.md §8). The issue's bar (issue 14): golden within 1 pp of the float
reference, mean over 3 seeds.

The noise floor: a second float reference run starts from the golden model's initial weights
(the float ones rounded to the plan's ``w`` format, at most ½ LSB = 2^-23 away on ``wide``)
and is otherwise identical. Batch-1 SGD with momentum at a constant learning rate is chaotic:
such a perturbation grows until the two float runs end on different weights, so the gap
between the two float runs (``float_gap_pp``) shows how far any change of the arithmetic moves
one seed's accuracy by chance; the golden-vs-float gap is to be read against it.

``--streams K`` (default 1) also averages each seed over K runs of either side: the golden
model with the plan's LFSR seeds and K − 1 other sets (``lfsr_seeds(seed + 1000·k, …)``: only
the stochastic rounding's random numbers change), the float reference from the initial weights
and from K − 1 starts perturbed uniformly by at most one LSB of the stage's ``w`` format
(seeded). ``stream_gap_pp`` is the float mean minus the golden mean: the gap of the expected
accuracies at that seed, without one random stream's luck; ``stream_gap_se_pp`` its standard
error from the two sides' run-to-run spreads. ``--null`` adds K float runs from other perturbed
starts: their gap to the K float runs (``null_gap_pp``, expected 0) is the noise floor at the
same protocol. The summary per data set (:func:`summary`) gives the mean over seeds with its
standard errors. How many runs a 1 pp bar needs: the gap of two means of n runs each with
run-to-run sd σ has a standard
error σ·√(2/n); on ``wide`` σ ≈ 2.2 pp (golden) and 1.6 pp (float) per run (measured), so 3
seeds × 8 streams (n = 24) give about ±0.6 pp and 6 × 8 about ±0.42 pp (README, formats
section). ``--format KEY=Qi.f`` (repeatable) compiles with format overrides, for
experiments.

Data sets (:data:`SETS`): scikit-learn's digits, and sets of our own making from
``sklearn.datasets.make_classification`` (fixed ``random_state``, 80/20 stratified split):
``wide`` (40 features → 100, 100 → 10 classes: the issue's shape), ``deep`` (20 features → 64,
64, 64 → 4 classes) and ``classes`` (30 features → 64 → 20 classes), standardised, default
hyperparameters; ``unscaled`` (16 features → 32 → 4 classes, not standardised, every feature
×3 + 3: RMS up to 8.1, far from unit scale, so the input-scale warning fires) with lr 0.0005:
at the default lr 0.002 the float reference on it is chaotic (float32 and float64 runs of one
seed differ by up to 3.4 pp), so no format can be judged against it there.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from pipetrain.compiler.build import lfsr_seeds
from pipetrain.data import Dataset, load_digits
from pipetrain.host.device import local_trainer
from pipetrain.host.flow import compile_design
from pipetrain.sim.golden import GoldenModel


@dataclass(frozen=True)
class Synthetic:
    """A ``make_classification`` data set: its shape, the MLP trained on it, and epochs.

    Members
        features, classes, samples (train + test), hidden (``--hidden``), epochs, lr (``--lr``),
        standardise (each feature to mean 0, std 1 over the training set, as the input-scale
        note asks), scale and shift (applied to every feature after that: x·scale + shift),
        state (``random_state``).
    """

    features: int
    classes: int
    samples: int
    hidden: str
    epochs: int
    lr: float = 0.002
    standardise: bool = True
    scale: float = 1.0
    shift: float = 0.0
    state: int = 0


#: The data sets of this check: ``digits`` (hidden 32, 4 epochs: the default job) and ours.
SETS: dict[str, Synthetic | None] = {
    "digits": None,
    "wide": Synthetic(40, 10, 2000, "100,100", 5),
    "deep": Synthetic(20, 4, 2000, "64,64,64", 5),
    "classes": Synthetic(30, 20, 3000, "64", 5),
    "unscaled": Synthetic(16, 4, 1500, "32", 5, lr=0.0005, standardise=False, scale=3.0, shift=3.0),
}
DIGITS = ("32", 4)


def make_dataset(name: str, spec: Synthetic) -> Dataset:
    """The data set ``spec`` as a :class:`~pipetrain.data.Dataset` (float32 x, int64 y):
    ``make_classification`` with ``n_informative = features·3//4``, no redundant features, one
    cluster per class, then x·scale + shift, split 80/20 stratified (``random_state=0``)."""
    from sklearn.datasets import make_classification
    from sklearn.model_selection import train_test_split

    x, y = make_classification(
        n_samples=spec.samples,
        n_features=spec.features,
        n_informative=spec.features * 3 // 4,
        n_redundant=0,
        n_classes=spec.classes,
        n_clusters_per_class=1,
        random_state=spec.state,
    )
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    if spec.standardise:
        mean, std = xtr.mean(axis=0), xtr.std(axis=0)
        xtr, xte = (xtr - mean) / std, (xte - mean) / std
    xtr, xte = xtr * spec.scale + spec.shift, xte * spec.scale + spec.shift
    t = [torch.from_numpy(np.asarray(a)) for a in (xtr, ytr, xte, yte)]
    return Dataset(name, t[0].float(), t[1].long(), t[2].float(), t[3].long())


def compile_set(
    name: str, seed: int, format_overrides: list[str] | None = None
) -> tuple[Dataset, Any, int]:
    """Data set ``name`` (:data:`SETS`), its data-sized ``mlp`` compiled with ``--formats auto``
    (calibrated on the training set; seed ``seed``, the set's epochs and lr, ``--format``
    overrides) and the epochs: ``(dataset, CompileResult, epochs)``."""
    spec = SETS[name]
    if spec is None:
        ds, (hidden, epochs) = load_digits(), DIGITS
    else:
        ds, hidden, epochs = make_dataset(name, spec), spec.hidden, spec.epochs
    lr = {} if spec is None else {"lr": spec.lr}
    r = compile_design(
        "mlp",
        data=ds,
        hidden=hidden,
        config_overrides={"seed": seed, "epochs": epochs, **lr},
        format_overrides=format_overrides or None,
        writers=(),
    )
    return ds, r, epochs


def _golden_run(r: Any, ds: Dataset, epochs: int, seed: int, k: int) -> float:
    """Test accuracy of the golden model with the ``k``-th other LFSR seeds (module
    docstring, ``--streams``; only the stochastic rounding's random numbers change)."""
    stages = tuple(
        dataclasses.replace(s, lfsr_seeds=lfsr_seeds(seed + 1000 * k, s.index, s.lanes))
        for s in r.plan.stages
    )
    g = local_trainer("golden", dataclasses.replace(r.plan, stages=stages), r.model, r.config)
    g.train(ds.x_train, ds.y_train, epochs=epochs)
    return g.evaluate(ds.x_test, ds.y_test)


def _float_run(r: Any, ds: Dataset, epochs: int, seed: int, k: int) -> float:
    """Test accuracy of the float reference from the ``k``-th start perturbed uniformly by at
    most one LSB of each stage's ``w`` format (seeded; module docstring)."""
    start = copy.deepcopy(r.model)
    gen = torch.Generator().manual_seed(1234 + 1000 * seed + k)
    linears = [m for m in start.modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for lin, st in zip(linears, r.plan.main_stages, strict=True):
            for p in lin.parameters():
                p.add_((torch.rand(p.shape, generator=gen) * 2 - 1) * 2.0**-st.formats.w.frac)
    f = local_trainer("reference", r.plan, start, r.config)
    f.train(ds.x_train, ds.y_train, epochs=epochs)
    return f.evaluate(ds.x_test, ds.y_test)


def _se_pp(a: list[float], b: list[float]) -> float:
    """Standard error (pp) of mean(b) − mean(a) from the two samples' spreads (ddof 1); 0
    with a single run per side (no spread to estimate)."""
    if min(len(a), len(b)) < 2:
        return 0.0
    return 100 * float(np.sqrt(np.var(a, ddof=1) / len(a) + np.var(b, ddof=1) / len(b)))


def check(
    name: str,
    seed: int,
    streams: int = 1,
    null: bool = False,
    format_overrides: list[str] | None = None,
) -> dict[str, Any]:
    """One data set × seed: golden and reference test accuracy, gap (pp), saturations; with
    ``streams`` > 1 also both sides' means over that many random streams / starts and the
    standard error of their gap; with ``null`` also ``streams`` more float runs from other
    perturbed starts: the float-vs-float gap at the same protocol (the noise floor, expected
    0). ``format_overrides``: ``--format`` items for the compile (a format experiment)."""
    t0 = time.perf_counter()
    ds, r, epochs = compile_set(name, seed, format_overrides)
    hidden = DIGITS[0] if SETS[name] is None else SETS[name].hidden
    t_compile = time.perf_counter() - t0
    acc = {}
    golden: GoldenModel | None = None
    start = copy.deepcopy(r.model)  # the golden model's quantised initial weights, in float
    start.load_state_dict(GoldenModel(r.plan, r.model, r.config).state_dict())
    for target, model in (("golden", r.model), ("reference", r.model), ("qstart", start)):
        tr = local_trainer("reference" if target == "qstart" else target, r.plan, model, r.config)
        tr.train(ds.x_train, ds.y_train, epochs=epochs)
        acc[target] = tr.evaluate(ds.x_test, ds.y_test)
        if isinstance(tr, GoldenModel):
            golden = tr
    assert golden is not None
    gs = [acc["golden"]] + [_golden_run(r, ds, epochs, seed, k) for k in range(1, streams)]
    fs = [acc["reference"]] + [_float_run(r, ds, epochs, seed, k) for k in range(1, streams)]
    ns = [_float_run(r, ds, epochs, seed, 500 + k) for k in range(streams)] if null else []
    return {
        "set": name,
        "seed": seed,
        "hidden": hidden,
        "epochs": epochs,
        "formats": [str(st.formats) for st in r.plan.main_stages],
        "format_overrides": list(format_overrides or []),
        "golden": acc["golden"],
        "reference": acc["reference"],
        "gap_pp": 100 * (acc["reference"] - acc["golden"]),
        "reference_qstart": acc["qstart"],
        "float_gap_pp": 100 * (acc["reference"] - acc["qstart"]),
        "streams": streams,
        "golden_streams": gs,
        "reference_starts": fs,
        "stream_gap_pp": 100 * (float(np.mean(fs)) - float(np.mean(gs))),
        "stream_gap_se_pp": _se_pp(gs, fs),
        "null_starts": ns,
        "null_gap_pp": 100 * (float(np.mean(fs)) - float(np.mean(ns))) if ns else None,
        "null_gap_se_pp": _se_pp(ns, fs) if ns else None,
        "saturations": golden.saturations,
        "tensor_saturations": golden.tensor_saturations,
        "input_saturations": golden.input_saturations,
        "notes": list(r.formats.notes) + list(r.warnings),
        "compile_s": t_compile,
        "wall_s": time.perf_counter() - t0,
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per data set over its seeds: the mean single-run gap and its standard error (sd over
    seeds / √seeds), the stream-averaged gap with two standard errors — ``se_between`` (sd of
    the per-seed gaps / √seeds: includes the seeds' own spread) and ``se_within`` (from each
    seed's run-to-run spread, √Σse² / seeds) — and the float-vs-float null gap with its
    standard error when measured (pp)."""
    out = {}
    for name in dict.fromkeys(r["set"] for r in rows):
        sel = [r for r in rows if r["set"] == name]
        n = len(sel)
        single = [r["gap_pp"] for r in sel]
        gaps = [r["stream_gap_pp"] for r in sel]
        sd = lambda v: float(np.std(v, ddof=1)) if len(v) > 1 else 0.0  # noqa: E731
        row = {
            "seeds": n,
            "streams": sel[0]["streams"],
            "gap_pp": float(np.mean(single)),
            "gap_se_pp": sd(single) / np.sqrt(n),
            "stream_gap_pp": float(np.mean(gaps)),
            "se_between_pp": sd(gaps) / np.sqrt(n),
            "se_within_pp": float(np.sqrt(sum(r["stream_gap_se_pp"] ** 2 for r in sel)) / n),
            "run_sd_golden_pp": 100 * float(np.mean([sd(r["golden_streams"]) for r in sel])),
            "run_sd_float_pp": 100 * float(np.mean([sd(r["reference_starts"]) for r in sel])),
        }
        if all(r.get("null_gap_pp") is not None for r in sel):
            nulls = [r["null_gap_pp"] for r in sel]
            row["null_gap_pp"] = float(np.mean(nulls))
            row["null_se_pp"] = float(np.sqrt(sum(r["null_gap_se_pp"] ** 2 for r in sel)) / n)
        out[name] = row
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table: one line per data set × seed, then per data set the mean over seeds
    (gaps: mean; float-float gap: also the standard deviation over seeds)."""
    out = [
        "| data set | seed | golden | reference | gap (pp) | float from golden's start | "
        "float-float gap (pp) | saturations (y/gin/u/w, d) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per = " ".join(
            "/".join(str(t[k]) for k in ("y", "gin", "u", "w"))
            for t in r["tensor_saturations"][:-1]
        )
        d = r["tensor_saturations"][-1]["d"]
        out.append(
            f"| {r['set']} | {r['seed']} | {r['golden']:.4f} | {r['reference']:.4f} | "
            f"{r['gap_pp']:+.2f} | {r['reference_qstart']:.4f} | {r['float_gap_pp']:+.2f} | "
            f"{per}, {d} |"
        )
    for name in dict.fromkeys(r["set"] for r in rows):
        sel = [r for r in rows if r["set"] == name]
        g = np.mean([r["golden"] for r in sel])
        f = np.mean([r["reference"] for r in sel])
        q = np.mean([r["reference_qstart"] for r in sel])
        spread = np.std([r["float_gap_pp"] for r in sel])
        out.append(
            f"| **{name}** mean | {len(sel)} seeds | {g:.4f} | {f:.4f} | "
            f"**{100 * (f - g):+.2f}** | {q:.4f} | {100 * (f - q):+.2f} (sd {spread:.2f}) | "
            f"{sum(r['saturations'] for r in sel)} in all |"
        )
    for name, m in summary(rows).items():
        if m["streams"] > 1:
            null = (
                f"; float vs float {m['null_gap_pp']:+.2f} ± {m['null_se_pp']:.2f}"
                if "null_gap_pp" in m
                else ""
            )
            out.append(
                f"| **{name}** {m['streams']} streams per seed | gap of the means | | | "
                f"**{m['stream_gap_pp']:+.2f}** ± {m['se_within_pp']:.2f} (between seeds "
                f"± {m['se_between_pp']:.2f}){null} | run sd golden {m['run_sd_golden_pp']:.2f}"
                f", float {m['run_sd_float_pp']:.2f} | | |"
            )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    ap.add_argument("--sets", default=",".join(SETS), help="comma-separated data sets")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    ap.add_argument(
        "--streams", type=int, default=1, help="runs per seed and side (random streams, starts)"
    )
    ap.add_argument(
        "--null",
        action="store_true",
        help="also --streams float runs from other starts: the float-vs-float gap (noise floor)",
    )
    ap.add_argument(
        "--format", action="append", default=[], help="a --format override (experiments)"
    )
    args = ap.parse_args()
    rows = []
    for name in args.sets.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            row = check(name, seed, args.streams, args.null, args.format)
            rows.append(row)
            more = (
                f"; {args.streams} streams {row['stream_gap_pp']:+.2f} ± "
                f"{row['stream_gap_se_pp']:.2f} pp"
                if args.streams > 1
                else ""
            )
            if row["null_gap_pp"] is not None:
                more += f", float vs float {row['null_gap_pp']:+.2f} pp"
            print(
                f"{name:9} seed {seed}: golden {row['golden']:.4f} reference "
                f"{row['reference']:.4f} gap {row['gap_pp']:+.2f} pp (float-float "
                f"{row['float_gap_pp']:+.2f}), saturations "
                f"{row['saturations']} ({row['wall_s']:.0f} s){more}",
                flush=True,
            )
    print(table(rows))
    print(json.dumps(summary(rows), indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
