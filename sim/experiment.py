"""Accuracy of PB and its mitigations against depth, in float: the library behind
``pipetrain experiment`` (docs/architecture.md §2).

For every depth × method × learning rate × seed, an MLP ``features → width → … → width →
classes`` with ``depth`` Linear layers and ReLU between (:func:`pipetrain.compiler.models.
build_mlp`, He/Kaiming-uniform init seeded with the seed by default, so that 8-layer nets
train at all) is trained at batch size 1 by the float reference trainer
(:class:`pipetrain.sim.reference.ReferenceTrainer`) and scored on the test set. Methods:
``sgd`` (sequential schedule: exact batch-1 SGD with momentum), ``pb`` (Pipelined
Backpropagation, D_s = 2(S−s)+1), ``pb+sc``, ``pb+lwp``, ``pb+sc+lwp`` (Spike Compensation /
Linear Weight Prediction, Kosson et al. 2021 §3). The seed also fixes the sample order
(:func:`pipetrain.data.epoch_order`); every method sees the same initial weights and the same
order for a given seed.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..compiler.config import ConfigError, TrainConfig
from ..compiler.models import build_mlp
from ..data import Dataset
from .reference import ReferenceTrainer
from .trainer import progress_bar

__all__ = [
    "METHODS",
    "INITS",
    "DEFAULT_EPOCHS",
    "make_mlp",
    "run_experiment",
    "format_table",
    "LR_STYLES",
    "plot_styles",
    "plot_rows",
]

#: method name → (schedule, mitigation).
METHODS: dict[str, tuple[str, str]] = {
    "sgd": ("sequential", "none"),
    "pb": ("pb", "none"),
    "pb+sc": ("pb", "sc"),
    "pb+lwp": ("pb", "lwp"),
    "pb+sc+lwp": ("pb", "sc+lwp"),
}
#: Default passes over the training set: 10 epochs keep ``--depths 2,4 --seeds 3`` with all
#: methods well inside 5 minutes on a 2-core machine (measured ~40 s) and bring the sequential
#: 64→32→10 baseline above 0.95 test accuracy on digits.
DEFAULT_EPOCHS = 10
#: Weight initialisations (see :func:`run_experiment`).
INITS = ("default", "kaiming")


def make_mlp(sizes: list[int], init: str) -> nn.Sequential:
    """A ReLU MLP of ``sizes`` (:func:`~pipetrain.compiler.models.build_mlp`) with ``init``:
    ``default`` (PyTorch's nn.Linear init) or ``kaiming`` (He-uniform weights, zero biases)."""
    model = build_mlp(sizes)
    if init == "kaiming":
        with torch.no_grad():
            for layer in model:
                if isinstance(layer, nn.Linear):
                    nn.init.kaiming_uniform_(layer.weight, nonlinearity="relu")
                    nn.init.zeros_(layer.bias)
    return model


def run_experiment(
    data: Dataset,
    depths: Sequence[int],
    methods: Sequence[str],
    seeds: int,
    epochs: int,
    lrs: Sequence[float],
    width: int = 32,
    base: TrainConfig | None = None,
    progress: bool = False,
    init: str = "kaiming",
) -> list[dict[str, Any]]:
    """Train every depth × method × lr over seeds 0..seeds−1; return one row per combination.

    ``base`` supplies the other settings (momentum, weight decay, batch_ref, LWP form; default
    :class:`TrainConfig`). Rows: ``depth`` (Linear layers), ``method``, ``lr`` (reference η),
    ``test_accuracy_mean``, ``test_accuracy_std`` (sample standard deviation over seeds, 0 for
    one seed), ``seeds``. ``init``: ``default`` (PyTorch's nn.Linear init, as
    :func:`build_mlp` makes it) or ``kaiming`` (He-uniform weights for ReLU, zero biases; keeps
    the signal alive in deep narrow nets). Raises :class:`ConfigError` for an unknown method,
    init or bad setting.
    """
    if init not in INITS:
        raise ConfigError(f"unknown init {init!r}; choose from: {', '.join(INITS)}")
    base = base or TrainConfig()
    for m in methods:
        if m not in METHODS:
            raise ConfigError(f"unknown method {m!r}; choose from: {', '.join(METHODS)}")
    rows = []
    total = len(depths) * len(methods) * len(lrs) * seeds
    bar = progress_bar(total=total, disable=not progress, unit="run", desc="experiment")
    for depth in depths:
        sizes = [data.features] + [width] * (depth - 1) + [data.classes]
        for method in methods:
            schedule, mitigation = METHODS[method]
            for lr in lrs:
                accs = []
                for seed in range(seeds):
                    bar.set_postfix_str(f"depth={depth} {method} lr={lr:g} seed={seed}")
                    cfg = base.replace(
                        schedule=schedule, mitigation=mitigation, lr=lr, seed=seed, epochs=epochs
                    )
                    torch.manual_seed(seed)
                    trainer = ReferenceTrainer(make_mlp(sizes, init), cfg, profile=False)
                    trainer.train(data.x_train, data.y_train, epochs=epochs)
                    accs.append(trainer.evaluate(data.x_test, data.y_test))
                    bar.update(1)
                rows.append(
                    {
                        "depth": depth,
                        "method": method,
                        "lr": lr,
                        "test_accuracy_mean": statistics.fmean(accs),
                        "test_accuracy_std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                        "seeds": seeds,
                    }
                )
    bar.close()
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Return a depth × method × lr text table of ``mean ± std`` test accuracies."""
    lines = [f"{'depth':>5}  {'method':<10} {'lr':>8}  test accuracy (mean ± std, seeds)"]
    for r in rows:
        lines.append(
            f"{r['depth']:>5}  {r['method']:<10} {r['lr']:>8g}  "
            f"{r['test_accuracy_mean']:.4f} ± {r['test_accuracy_std']:.4f}  ({r['seeds']})"
        )
    return "\n".join(lines)


#: Line styles of the learning rates in a plot (cycled), in increasing lr order.
LR_STYLES = ("-", "--", ":", "-.")


def plot_styles(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, float], tuple[str, str]]:
    """``{(method, lr): (colour, line style)}`` of :func:`plot_rows`: one colour per method
    (matplotlib's cycle ``C0``, ``C1``, … in the rows' method order) and one line style per
    learning rate (:data:`LR_STYLES`, in increasing lr order), so a method keeps its colour
    across learning rates."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    lrs = sorted({r["lr"] for r in rows})
    return {
        (m, lr): (f"C{i % 10}", LR_STYLES[j % len(LR_STYLES)])
        for i, m in enumerate(methods)
        for j, lr in enumerate(lrs)
    }


def plot_rows(rows: Sequence[dict[str, Any]], path: str, title: str = "") -> None:
    """Save a plot of test accuracy vs depth, one line (with ±std bars) per method and lr:
    colour = method, line style = lr (:func:`plot_styles`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    lrs = sorted({r["lr"] for r in rows})
    styles = plot_styles(rows)
    for method in dict.fromkeys(r["method"] for r in rows):
        for lr in lrs:
            pts = sorted(
                (r["depth"], r["test_accuracy_mean"], r["test_accuracy_std"])
                for r in rows
                if r["method"] == method and r["lr"] == lr
            )
            if not pts:
                continue
            label = method if len(lrs) == 1 else f"{method} (lr={lr:g})"
            ax.errorbar(
                [p[0] for p in pts],
                [p[1] for p in pts],
                yerr=[p[2] for p in pts],
                marker="o",
                capsize=3,
                label=label,
                color=styles[method, lr][0],
                linestyle=styles[method, lr][1],
            )
    ax.set_xlabel("depth (Linear layers)")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0.0, 1.02)
    ax.set_xticks(sorted({r["depth"] for r in rows}))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
