"""Where does a golden run lose precision? Per-tensor rounding statistics over one training run.

Usage: ``python benchmarks/formats_probe.py [--set wide] [--seed 0] [--format KEY=Qi.f ...]``.
It compiles the data set's ``mlp`` as :mod:`formats_check` does (``--formats auto``), trains
the golden model once and, at every rounding of the datapath (docs/numerics.md §3–§5),
compares the rounded value with the exact value of the same integer inputs (the local error;
a float run's trajectory is not comparable value by value, batch-1 SGD being chaotic):

* ``y``: the forward pre-activation ``z`` against ``acc·2^−(w.frac + x.frac)`` (§3.3);
* ``gin``: the input gradient against ``δ·W`` unrounded (§5.2);
* ``loss d``: the loss unit's δ against ``softmax(z) − onehot`` of the same fixed-point logits
  (exp LUT, reciprocal and the final rounding together, §4);
* ``u``: the velocity ``u'`` against the update sum ``U`` before its (stochastic) rounding
  (§5.3) — a ``u'`` of 0 from a non-zero ``U`` is an update that rounded to zero (``w``
  unchanged).

Per tensor: how many values, the fraction that rounded to zero from a non-zero exact value,
the fraction below one LSB, the relative error ``‖q − e‖ / ‖e‖`` and the relative bias
``Σ(q − e) / Σ|e|``; and per stage the fraction of zero δ (ReLU masks and flushed errors).
Source: *derived* (a measurement wrapper around the golden model's stage engine; the model's
arithmetic is unchanged — the wrapper recomputes the exact values beside it).
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from typing import Any

import torch
from pipetrain.host.device import local_trainer
from pipetrain.sim import golden as G

sys.path.insert(0, str(Path(__file__).resolve().parent))
import formats_check as fc  # noqa: E402  (the data sets and their nets)

Stats = dict[str, collections.Counter]


def _record(stats: Stats, key: str, exact: torch.Tensor, q: torch.Tensor, lsb: float) -> None:
    e, qq = exact.double().flatten(), q.double().flatten()
    c = stats[key]
    c["n"] += e.numel()
    c["nonzero"] += int((e != 0).sum())
    c["to_zero"] += int(((e != 0) & (qq == 0)).sum())
    c["below_lsb"] += int(((e.abs() < lsb) & (e != 0)).sum())
    c["err2"] += float(((qq - e) ** 2).sum())
    c["e2"] += float((e**2).sum())
    c["bias"] += float((qq - e).sum())
    c["abs"] += float(e.abs().sum())


def instrument(stats: Stats) -> None:
    """Wrap the golden model's forward, input gradient, update and loss unit so that each
    records its rounding statistics into ``stats`` (process-wide; a benchmark script)."""
    E = G._StageEngine
    fwd0, gin0, upd0, loss0 = E.forward, E.input_grad, E.update, G.GoldenModel.loss_unit

    def forward(self, xb, predict):
        z, a, m = fwd0(self, xb, predict)
        acc = xb.double() @ self.w_hat(predict).T.double()
        exact = acc * 2.0 ** -(self.fw.frac + self.fx.frac)
        lsb = 2.0**-self.fy.frac
        _record(stats, f"s{self.spec.index} y", exact, z.double() * lsb, lsb)
        return z, a, m

    def input_grad(self, delta):
        out = gin0(self, delta)
        exact = (delta.double() @ self.w[:, : self.N].double()) * 2.0 ** -(
            self.fw.frac + self.fd.frac
        )
        lsb = 2.0**-self.fgin.frac
        _record(stats, f"s{self.spec.index} gin", exact, out.double() * lsb, lsb)
        return out

    def update(self, sid, delta):
        P = self.gradient(sid, delta)
        U = G._sum_terms(
            G._mul_shift(self.u, self.t_m),
            G._mul_shift(P, self.t_lr),
            G._mul_shift(self.w, self.t_lrwd),
        )
        upd0(self, sid, delta)
        lsb = 2.0**-self.fw.frac
        exact = U.double() * 2.0**-self.spec.update.frac_u
        _record(stats, f"s{self.spec.index} u", exact, self.u.double() * lsb, lsb)
        c = stats[f"s{self.spec.index} δ"]
        c["n"] += delta.numel()
        c["zero"] += int((delta == 0).sum())

    def loss_unit(self, z, label, want_delta=True, t=None):
        pred, raw, d = loss0(self, z, label, want_delta, t)
        if d is not None:
            lu = self.loss_units[(t or self.K) - 1]
            p = torch.softmax(z.double() * 2.0**-lu.z.frac, -1)
            exact = p - torch.nn.functional.one_hot(label, z.shape[-1]).double()
            lsb = 2.0**-lu.d.frac
            _record(stats, "loss d", exact, d.double() * lsb, lsb)
        return pred, raw, d

    E.forward, E.input_grad, E.update = forward, input_grad, update
    G.GoldenModel.loss_unit = loss_unit


def table(stats: dict[str, dict[str, float]]) -> str:
    """Markdown table of :func:`probe`'s statistics."""
    out = [
        "| tensor | values | rounded to 0 | below 1 LSB | rel. error | rel. bias | zero δ |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for k, c in stats.items():
        if "zero" in c:
            out.append(f"| {k} | {c['n']:,} | | | | | {c['zero'] / c['n']:.3f} |")
            continue
        nz = max(c["nonzero"], 1)
        out.append(
            f"| {k} | {c['n']:,} | {c['to_zero'] / nz:.4f} | {c['below_lsb'] / nz:.4f} | "
            f"{(c['err2'] / max(c['e2'], 1e-300)) ** 0.5:.2e} | "
            f"{c['bias'] / max(c['abs'], 1e-300):+.1e} | |"
        )
    return "\n".join(out)


def probe(name: str, seed: int, format_overrides: list[str] | None = None) -> dict[str, Any]:
    """Train data set ``name``'s golden model once (seed ``seed``) with the instrumented
    arithmetic; return the formats, the test accuracy and the statistics per tensor."""
    stats: Stats = collections.defaultdict(collections.Counter)
    instrument(stats)
    ds, r, epochs = fc.compile_set(name, seed, format_overrides)
    g = local_trainer("golden", r.plan, r.model, r.config)
    g.train(ds.x_train, ds.y_train, epochs=epochs)
    return {
        "formats": {s.index: str(s.formats) for s in r.plan.main_stages},
        "accuracy": g.evaluate(ds.x_test, ds.y_test),
        "stats": {k: dict(v) for k, v in sorted(stats.items())},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="wide", choices=sorted(fc.SETS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--format", action="append", default=[], help="a --format override")
    args = ap.parse_args()
    res = probe(args.set, args.seed, args.format)
    for s, f in res["formats"].items():
        print(f"stage {s}: {f}")
    print(f"golden test accuracy {res['accuracy']:.4f}")
    print(table(res["stats"]))


if __name__ == "__main__":
    main()
