"""Convolution built-ins next to mlp-digits (issue 16, item 7): accuracy, cycles, MACs, memories.

For each model of :data:`MODELS` (``mlp-digits``, ``cnn-digits``, ``cnn1d-digits``), compiled as
``pipetrain sim`` compiles it (formats calibrated on digits, lanes of the model, seed 0):

* the plan's figures — stages, lanes, ideal cycles per sample (``Plan.ideal_cycles_per_sample``)
  and samples/s at the plan's 50 MHz, multiplies per sample
  (:func:`measure.multiplies_per_sample`), MAC utilisation of the tick-bound stage
  (:func:`measure.stage_utilisation`: useful MAC slots per lane-cycle of the tick), memory and
  stash bits and datapath multipliers;
* test accuracy on the 360 test digits after ``--epochs`` epochs of the golden model (the RTL's
  bit-exact arithmetic) and of the float reference trainer, per seed;
* with ``--rtl-samples N`` (default 50; 0 skips): the RTL in Verilator on the first N training
  samples (:func:`measure.rtl_run`, the ``pipetrain sim`` machinery) — cycles per sample
  measured vs the plan's ideal, its MAC utilisation (the plan's × ideal / measured), and
  whether it is bit-exact with the golden model; a model the HDL does not build reads why;
* the stash and memory table of the CNNs: every stage memory as the HDL builds it (bits).

Run: ``python benchmarks/conv.py [--seeds 0] [--epochs 4] [--rtl-samples 50] [--out FILE.md]``
(minutes per model and seed on a loaded 2-core machine; a first Verilator build of cnn-digits
adds a few). Source: the definitions of docs/architecture.md §3 and docs/numerics.md §9; the
utilisation formula is *derived* (``measure.stage_utilisation``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import measure  # noqa: E402

__all__ = ["MODELS", "accuracy", "memory_table", "plan_figures", "rtl_figures", "table"]

MODELS = ("mlp-digits", "cnn-digits", "cnn1d-digits")


def plan_figures(plan: Any) -> dict[str, Any]:
    """The plan's figures of one model (module docstring): ``lanes``, ``ideal_cycles_per_sample``
    (cycles), ``samples_per_s`` (at the plan's clock), ``multiplies_per_sample``,
    ``mac_util`` (the tick-bound stage's, fraction), ``memory_bits``, ``stash_bits`` (Σ
    ``Stage.stash_bits``: input stash, masks, MaxPool argmax), ``multipliers``."""
    util = measure.stage_utilisation(plan)
    bound = max(util, key=lambda s: s["cycles_per_tick"])
    return {
        "lanes": [s.lanes for s in plan.stages],
        "kinds": [getattr(s, "kind", "linear") for s in plan.stages],
        "ideal_cycles_per_sample": plan.ideal_cycles_per_sample,
        "samples_per_s": plan.samples_per_s,
        "multiplies_per_sample": measure.multiplies_per_sample(plan),
        "mac_util": bound["mac_util"],
        "bound_stage": bound["stage"],
        "memory_bits": plan.memory_bits,
        "stash_bits": sum(s.stash_bits for s in plan.stages),
        "multipliers": plan.multipliers,
        "plan_hash": plan.hash,
    }


def accuracy(result: Any, target: str, epochs: int) -> dict[str, Any]:
    """Test accuracy (fraction) of ``result``'s model after ``epochs`` epochs of digits on the
    in-process ``target`` (``golden`` or ``reference``), with ``s`` (wall seconds)."""
    from pipetrain.data import load_digits
    from pipetrain.host.device import local_trainer

    ds = load_digits()
    t0 = time.perf_counter()
    trainer = local_trainer(target, result.plan, result.model, result.config)
    trainer.train(ds.x_train, ds.y_train, epochs=epochs)
    return {"test_accuracy": trainer.evaluate(ds.x_test, ds.y_test), "s": time.perf_counter() - t0}


def rtl_figures(result: Any, samples: int) -> dict[str, Any]:
    """The RTL on ``samples`` samples (:func:`measure.rtl_run`) plus ``vs_ideal`` (measured ÷
    ideal cycles per sample) and ``mac_util`` (the plan's tick-bound utilisation scaled by
    ideal ÷ measured); ``{"rtl": reason}`` for a plan the HDL does not build."""
    from pipetrain.hdl.support import HDLSupportError, require_hdl

    try:
        require_hdl(result.plan)
    except HDLSupportError as exc:
        return {"rtl": str(exc)}
    rec = measure.rtl_run(result, samples)
    ideal, got = rec["ideal_cycles_per_sample"], rec["cycles_per_sample"]
    util = plan_figures(result.plan)["mac_util"]
    return rec | {"vs_ideal": got / ideal if ideal else 0.0, "mac_util": util * ideal / got}


def memory_table(plan: Any) -> str:
    """Markdown: one row per stage — kind, shape, delay, stash entries, then the bits of each
    memory the HDL builds (``w``, ``u``, ``xstash``, ``mask``, ``argmax``, ``gbuf``, ``wgacc``,
    ``gacc``, …; – where the stage has none) and the stage total."""
    names: list[str] = []
    for st in plan.stages:
        for m in st.memories:
            if m.name not in names:
                names.append(m.name)
    out = [
        "| stage | kind | shape | D_s | stash entries | " + " | ".join(names) + " | total |",
        "|---|---|---|---|---|" + "---|" * len(names) + "---|",
    ]
    for st in plan.stages:
        bits = {m.name: m.bits for m in st.memories}
        cells = " | ".join(f"{bits[n]:,}" if n in bits else "–" for n in names)
        kind = getattr(st, "kind", "linear")
        out.append(
            f"| {st.index} | {kind} | {_shape(st)} | {st.delay} | "
            f"{st.stash_entries} | {cells} | {st.memory_bits:,} |"
        )
    return "\n".join(out)


def _shape(st: Any) -> str:
    """``N→M``, or a conv stage's ``C×H×W→C′×H′×W′`` (its pooled output)."""
    g = getattr(st, "conv", None)
    if g is None:
        return f"{st.in_features}→{st.out_features}"
    out = (g.out_channels, *g.pooled_size)
    return "×".join(map(str, g.in_shape)) + "→" + "×".join(map(str, out))


def _acc_cell(runs: list[dict[str, Any]]) -> str:
    accs = [r["test_accuracy"] for r in runs]
    if not accs:
        return "not run"
    text = " / ".join(f"{a:.4f}" for a in accs)
    return text + (f" ({statistics.mean(accs):.4f})" if len(accs) > 1 else "")


def _rtl_cells(rtl: dict[str, Any] | None) -> tuple[str, str, str]:
    if not rtl:
        return "not run", "–", "–"
    if "rtl" in rtl:
        return "not in the HDL", "–", "–"
    mark = "" if rtl["bit_exact"] else " (NOT bit-exact)"
    return (
        f"{rtl['cycles_per_sample']:.1f}{mark}",
        f"{rtl['vs_ideal']:.3f}",
        f"{rtl['mac_util']:.1%}",
    )


def table(rows: dict[str, dict[str, Any]], epochs: int, seeds: list[int]) -> str:
    """The side-by-side Markdown table (``rows``: model → ``plan``/``golden``/``reference``/
    ``rtl`` results)."""
    out = [
        f"digits, {epochs} epochs, seeds {','.join(map(str, seeds))}, formats calibrated on "
        "digits; cycles at the plan's 50 MHz",
        "",
        "| model | stages | lanes | golden test acc. | reference test acc. | ideal cycles/sample "
        "| RTL cycles/sample | RTL ÷ ideal | MAC util. (plan / RTL) | multiplies/sample | "
        "memory bits | stash bits | multipliers |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        p = r["plan"]
        cyc, ratio, util = _rtl_cells(r.get("rtl"))
        kinds = "+".join(
            f"{p['kinds'].count(k)} {k}" for k in dict.fromkeys(p["kinds"])
        )  # e.g. "2 conv2d+1 linear"
        out.append(
            f"| `{name}` | {kinds} | {','.join(map(str, p['lanes']))} | "
            f"{_acc_cell(r.get('golden', []))} | {_acc_cell(r.get('reference', []))} | "
            f"{p['ideal_cycles_per_sample']:,} | {cyc} | {ratio} | {p['mac_util']:.1%} / {util} | "
            f"{p['multiplies_per_sample']:,} | {p['memory_bits']:,} | {p['stash_bits']:,} | "
            f"{p['multipliers']} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Command line (module docstring): measure every model, print the tables (and write them
    to ``--out``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--rtl-samples", type=int, default=50)
    ap.add_argument("--no-train", action="store_true", help="plan and RTL figures only")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows: dict[str, dict[str, Any]] = {}
    mem: list[str] = []
    for name in args.models.split(","):
        res0 = measure.compile_design(name, seed=0)
        rows[name] = {"plan": plan_figures(res0.plan)}
        print(f"{name}: plan {res0.plan.hash}", file=sys.stderr, flush=True)
        if not args.no_train:
            for target in ("golden", "reference"):
                runs = []
                for seed in seeds:
                    res = res0 if seed == 0 else measure.compile_design(name, seed=seed)
                    runs.append(accuracy(res, target, args.epochs))
                    print(f"  {target} seed {seed}: {runs[-1]}", file=sys.stderr, flush=True)
                rows[name][target] = runs
        if args.rtl_samples:
            rows[name]["rtl"] = rtl_figures(res0, args.rtl_samples)
            print(f"  rtl: {rows[name]['rtl']}", file=sys.stderr, flush=True)
        if any(getattr(s, "conv", None) is not None for s in res0.plan.stages):
            mem += [f"`{name}` (plan {res0.plan.hash}):", "", memory_table(res0.plan), ""]
    text = table(rows, args.epochs, seeds) + "\n" + "\n".join(mem)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
