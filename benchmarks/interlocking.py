"""Local and interlocking learning vs global PB on ``mlp-digits-deep8``, on the hardware
arithmetic (issue 15 item 6, golden side).

Each setting trains the 8-stage built-in (64→32×7→10) with the fixed-point golden model — the
RTL's bit-exact specification (docs/numerics.md §7.2) — for ``--epochs`` epochs per seed on
digits, from the same initial weights and sample order per seed, and reports the test accuracy
of the main network (mean ± standard deviation over the seeds) next to the plan's figures:
the largest stage delay (updates), the stash (input stash + activation-derivative masks as
built, bits: Σ ``Stage.stash_bits``), every memory of the design (bits: ``Plan.memory_bits``,
heads and their loss units included) and the datapath multipliers (``Plan.multipliers``), the
golden run's saturations (clamps, every stage and loss unit; per tensor in ``--jsonl``), the
plan's ideal cycles/sample and the RTL's measured one (:func:`rtl_cycles`: ``--rtl-samples``
samples of seed 0 through Verilator and the golden model, as ``pipetrain sim`` runs them;
``not in the HDL`` where the HDL refuses the plan).

Settings (``SETTINGS``): global PB, local, interlocking d = 1 and d = 2 with the ``only`` and
``sum`` rules; blocks end after stages 2, 4, 6 (K = 4 blocks of two stages, one-stage heads).
Formats are calibrated per setting and seed on ``--calib-epochs`` epochs (default
``--epochs``, as ``pipetrain train`` calibrates: the float run, then the golden passes; heads
included); with fewer (the README's table: 1, train's calibration before it covered the run)
ranges that grow over the later epochs clamp: the table shows how often.

Run: ``python benchmarks/interlocking.py [--seeds 0,1,2] [--epochs 10] [--lr 0.002]
[--out FILE.md] [--jsonl RUNS.jsonl] [--rtl-samples 200]`` (1–2 minutes per seed and
setting on an idle core, 7–10 at a load of 15 on 2 cores); ``--from-jsonl RUNS.jsonl``
re-renders the table of a run file. lr 0.002 (momentum 0.9, batch 1): global PB trains the
He-initialised built-in (2 epochs: 46 % float, against 10 % at lr 0.01, where exact batch-1
SGD already diverges).
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


def _compile(overrides: dict[str, Any], seed: int, lr: float, calib_epochs: int) -> Any:
    """The compile result of one setting: formats calibrated on ``calib_epochs`` epochs of
    digits (float run + golden passes, as ``pipetrain train`` calibrates)."""
    cfg = {"lr": lr, "seed": seed, "epochs": calib_epochs} | overrides
    return compile_design(MODEL, data=load_digits(), config_overrides=cfg, seed=seed, writers=())


def run_setting(
    overrides: dict[str, Any], seed: int, epochs: int, lr: float, calib_epochs: int
) -> dict[str, Any]:
    """Compile and train one setting for one seed on the golden model; returns the plan's
    figures (:func:`plan_figures`), ``ideal_cycles_per_sample`` (the plan's, cycles),
    ``test_accuracy`` (fraction), ``saturations`` (clamps of the whole run, every stage and
    loss unit) with ``tensor_saturations`` (per stage and tensor, numerics §8),
    ``plan_hash`` and ``seconds`` (wall time of compile + training)."""
    t0 = time.perf_counter()
    ds = load_digits()
    res = _compile(overrides, seed, lr, calib_epochs)
    config = TrainConfig.from_dict(
        {k: v for k, v in res.plan.train.items() if k not in ("lr1", "momentum1")}
    )
    golden = GoldenModel(res.plan, res.model, config)
    golden.train(ds.x_train, ds.y_train, epochs=epochs)
    acc = golden.evaluate(ds.x_test, ds.y_test)
    return plan_figures(res.plan) | {
        "ideal_cycles_per_sample": res.plan.ideal_cycles_per_sample,
        "test_accuracy": acc,
        "saturations": golden.saturations,
        "tensor_saturations": golden.tensor_saturations,
        "plan_hash": res.plan.hash,
        "seconds": time.perf_counter() - t0,
    }


def rtl_cycles(
    overrides: dict[str, Any], samples: int, lr: float, calib_epochs: int
) -> dict[str, Any]:
    """Measure one setting in the RTL (Verilator, seed 0): the first ``samples`` training
    samples through ``NetworkTop`` and the golden model, as ``pipetrain sim`` does. Returns
    ``{"cycles_per_sample"}`` (steady-state spacing of result records, cycles) and
    ``"bit_exact"``, or ``{"rtl": reason}`` for a plan the HDL does not build
    (:class:`~pipetrain.hdl.support.HDLSupportError`'s message)."""
    from pipetrain.hdl.support import HDLSupportError
    from pipetrain.sim.stimulus import plan_samples
    from pipetrain.sim.tb.network import check_network

    res = _compile(overrides, 0, lr, calib_epochs)
    x, y = plan_samples(res.plan, samples, "digits", 0)
    try:
        rep = check_network(res.plan, res.model, x, y.tolist(), localise_first=False)
    except HDLSupportError as exc:
        return {"rtl": str(exc)}
    return {"cycles_per_sample": rep.cycles_per_sample, "bit_exact": rep.bit_exact}


def _rtl_cell(rtl: dict[str, Any] | None) -> str:
    """The ``cycles/sample (RTL)`` cell: measured (``*`` when not bit-exact), or why not."""
    if not rtl:
        return "not run"
    if "rtl" in rtl:
        return "not in the HDL"
    mark = "" if rtl["bit_exact"] else " (not bit-exact)"
    return f"{rtl['cycles_per_sample']:.1f}{mark}"


def table(
    rows: dict[str, list[dict[str, Any]]],
    seeds: list[int],
    epochs: int,
    lr: float,
    rtl: dict[str, dict[str, Any]] | None = None,
) -> str:
    """The Markdown table of the runs (``rows``: setting → one result per seed; ``rtl``:
    setting → :func:`rtl_cycles`' result). Accuracy: mean ± sample standard deviation over
    the seeds; saturations: the mean clamps per run; the hardware columns are seed 0's plan
    (the same for every seed but the formats)."""
    out = [
        f"`{MODEL}` on digits, golden model (the RTL's arithmetic), {epochs} epochs, lr {lr:g}, "
        f"momentum 0.9, seeds {','.join(map(str, seeds))}; blocks end after stages "
        f"{','.join(map(str, BLOCKS))}",
        "",
        "| setting | test accuracy | saturations / run | max delay | stash bits | memory bits | "
        "multipliers | cycles/sample (plan) | cycles/sample (RTL) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, runs in rows.items():
        accs = [r["test_accuracy"] for r in runs]
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        sats = statistics.mean(r.get("saturations", 0) for r in runs)
        r = runs[0]
        out.append(
            f"| {name} | {statistics.mean(accs):.3f} ± {sd:.3f} | {sats:,.0f} | "
            f"{r['max_delay']} | {r['stash_bits']:,} | {r['memory_bits']:,} | "
            f"{r['multipliers']} | {r.get('ideal_cycles_per_sample', 'n/a')} | "
            f"{_rtl_cell((rtl or {}).get(name))} |"
        )
    return "\n".join(out) + "\n"


def read_jsonl(path: str) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    """The runs and RTL measurements a ``--jsonl`` file holds (the last record per setting
    and seed wins), in :data:`SETTINGS` order."""
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    rtl: dict[str, dict[str, Any]] = {}
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "rtl_setting" in rec:
                rtl[rec.pop("rtl_setting")] = rec
            else:
                runs[(rec["setting"], rec["seed"])] = rec
    rows: dict[str, list[dict[str, Any]]] = {}
    for name in SETTINGS:
        got = sorted((k[1], v) for k, v in runs.items() if k[0] == name)
        if got:
            rows[name] = [v for _, v in got]
    return rows, rtl


def main(argv: list[str] | None = None) -> int:
    """Command line: run every setting for every seed, print (and with ``--out`` write) the
    table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.002)
    ap.add_argument("--calib-epochs", type=int, default=None, help="default: --epochs")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated names")
    ap.add_argument("--out", default=None)
    ap.add_argument("--jsonl", default=None, help="append every run's result here as it ends")
    ap.add_argument(
        "--rtl-samples",
        type=int,
        default=200,
        help="samples per setting through the RTL (Verilator) for cycles/sample; 0: skip",
    )
    ap.add_argument(
        "--from-jsonl", default=None, help="re-render the table of a --jsonl file (no runs)"
    )
    args = ap.parse_args(argv)
    if args.calib_epochs is None:  # the run's epochs, as pipetrain train calibrates
        args.calib_epochs = args.epochs
    torch.set_num_threads(1)
    if args.from_jsonl:
        rows, rtl = read_jsonl(args.from_jsonl)
        seeds = sorted({r["seed"] for runs in rows.values() for r in runs})
        return _emit(table(rows, seeds, args.epochs, args.lr, rtl), args.out)
    seeds = [int(s) for s in args.seeds.split(",")]
    names = [n.strip() for n in args.settings.split(",")]
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        ap.error(f"unknown setting {unknown[0]!r}; choose from {', '.join(SETTINGS)}")
    rows: dict[str, list[dict[str, Any]]] = {}
    rtl: dict[str, dict[str, Any]] = {}

    def log(rec: dict[str, Any]) -> None:
        if args.jsonl:
            with open(args.jsonl, "a") as f:
                f.write(json.dumps(rec) + "\n")

    for name in names:
        for seed in seeds:
            r = run_setting(SETTINGS[name], seed, args.epochs, args.lr, args.calib_epochs)
            rows.setdefault(name, []).append(r)
            log({"setting": name, "seed": seed, **r})
            print(
                f"{name} seed {seed}: accuracy {r['test_accuracy']:.4f}, "
                f"{r['saturations']} saturations ({r['seconds']:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    for name in names if args.rtl_samples > 0 else ():
        rtl[name] = rtl_cycles(SETTINGS[name], args.rtl_samples, args.lr, args.calib_epochs)
        log({"rtl_setting": name, **rtl[name]})
        print(f"{name} RTL: {_rtl_cell(rtl[name])}", file=sys.stderr, flush=True)
    return _emit(table(rows, seeds, args.epochs, args.lr, rtl), args.out)


def _emit(text: str, out: str | None) -> int:
    """Print the table and, with ``out``, write it there."""
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
