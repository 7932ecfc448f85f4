"""Memory of a PB design vs depth, from plans only (no HDL): the stash grows quadratically.

Stage s of an S-stage ``pb`` pipeline keeps its input for D_s + 1 samples (docs/architecture.md
§2.1), so the
activation stash is Σ_s (D_s+1)·|x_s| bits with D_s = 2(S−s)+1 — for equal widths
|x|·S(S+1), quadratic in depth — while weights and velocities grow linearly. :func:`sweep`
builds the plans of ``64 → 32 × (S−1) → 10`` MLPs (static default formats, one lane per stage:
lanes do not change the stash) and puts the plan's numbers next to the analytic sum, whose
delays come from :func:`pipetrain.compiler.schedule.pb_delay`.
"""

from __future__ import annotations

from typing import Any

from pipetrain.compiler.build import FormatSpec, build_plan
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.frontend import trace
from pipetrain.compiler.models import build_mlp
from pipetrain.compiler.schedule import pb_delay

__all__ = ["depth_plan", "sweep", "plot"]


def depth_plan(depth: int, schedule: str = "pb", width: int = 32) -> Any:
    """Plan of ``64 → width × (depth−1) → 10`` (``depth`` Linear stages), default formats."""
    sizes = [64] + [width] * (depth - 1) + [10]
    ir = trace(build_mlp(sizes), f"mlp-depth{depth}")
    cfg = TrainConfig(schedule=schedule)
    return build_plan(ir, cfg, FormatSpec.default(depth), None)


def sweep(depths: range | list[int] = range(2, 17), width: int = 32) -> list[dict[str, Any]]:
    """One row per depth S: bits summed over the stages (all ints, bits).

    ``stash_x_bits`` — the plan's input stash in use (``stash_depth`` = D_s + 1 entries of its
    ``xstash`` memory); ``stash_x_built_bits`` — the ``xstash`` memory as built (D_s + 2
    entries: one more is written while the pass runs);
    ``stash_bits`` — the plan's ``stash_bits`` (input stash + activation-derivative mask);
    ``analytic_stash_bits`` — Σ_s (pb_delay(S, s)+1)·N_s·x_bits;
    ``weight_bits``/``velocity_bits`` — the plan's; ``sequential_stash_bits`` — the stash of the
    same net under ``schedule=sequential`` (D = 0); ``stages`` — per stage ``(stash_bits,
    weight_bits, analytic)`` for the per-stage view.
    """
    rows = []
    for S in depths:
        plan = depth_plan(S, "pb", width)
        seq = depth_plan(S, "sequential", width)
        per = []
        stash_x = analytic = built = 0
        for st in plan.stages:
            xm = st.memory("xstash")
            a = (pb_delay(S, st.index) + 1) * st.in_features * st.formats.x.bits
            stash_x += st.stash_depth * st.x_words * xm.width
            built += xm.bits
            analytic += a
            per.append(
                {
                    "stage": st.index,
                    "delay": st.delay,
                    "stash_bits": st.stash_bits,
                    "stash_x_bits": st.stash_depth * st.x_words * xm.width,
                    "stash_x_built_bits": xm.bits,
                    "analytic_bits": a,
                    "weight_bits": st.weight_bits,
                }
            )
        rows.append(
            {
                "depth": S,
                "stash_x_bits": stash_x,
                "stash_x_built_bits": built,
                "stash_bits": sum(s.stash_bits for s in plan.stages),
                "analytic_stash_bits": analytic,
                "weight_bits": sum(s.weight_bits for s in plan.stages),
                "velocity_bits": sum(s.velocity_bits for s in plan.stages),
                "memory_bits": plan.memory_bits,
                "sequential_stash_bits": sum(s.stash_bits for s in seq.stages),
                "stages": per,
            }
        )
    return rows


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """Write the memory-vs-depth plot (PNG, Kib on a linear axis) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = [r["depth"] for r in rows]
    kib = lambda key: [r[key] / 1024 for r in rows]  # noqa: E731
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax.plot(d, kib("stash_bits"), "o-", label="stash, plan (x + mask)")
    ax.plot(d, kib("stash_x_bits"), "s", mfc="none", label="stash x, plan")
    ax.plot(d, kib("analytic_stash_bits"), "k--", label="Σ (D_s+1)·|x_s| (analytic)")
    ax.plot(d, kib("weight_bits"), "^-", label="weights")
    ax.plot(d, kib("velocity_bits"), "v:", label="velocities")
    ax.plot(d, kib("sequential_stash_bits"), "x-", label="stash, sequential (D=0)")
    ax.set_xlabel("depth S (Linear stages; 64→32×(S−1)→10)")
    ax.set_ylabel("Kib")
    ax.set_title("PB memory vs depth (plans)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    last = rows[-1]
    st = last["stages"]
    idx = [s["stage"] for s in st]
    ax2.bar([i - 0.2 for i in idx], [s["stash_bits"] / 1024 for s in st], 0.4, label="stash")
    ax2.bar([i + 0.2 for i in idx], [s["weight_bits"] / 1024 for s in st], 0.4, label="weights")
    ax2.plot(idx, [s["analytic_bits"] / 1024 for s in st], "k.--", label="(D_s+1)·|x_s|")
    ax2.set_xlabel(f"stage s (S = {last['depth']})")
    ax2.set_ylabel("Kib")
    ax2.set_title("per stage: stash shrinks with D_s = 2(S−s)+1")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
