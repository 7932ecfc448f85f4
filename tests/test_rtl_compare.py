"""The RTL-vs-golden comparison itself (no simulator): reports name tick, stage, tensor, index.

An :class:`RTLRun` is synthesised from a golden run, so a perfect "RTL" gives no mismatch and
each planted difference is reported exactly once with the tick the golden trace assigns.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from pipetrain.compiler.compile import compile_result
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.models import build_mlp
from pipetrain.sim.tb.network import Mismatch, RTLRun, _golden, compare


@pytest.fixture(scope="module")
def golden_run():
    torch.manual_seed(0)
    res = compile_result(build_mlp([8, 6, 3]), TrainConfig(seed=1), formats="default", lanes=(2, 1))
    gen = torch.Generator().manual_seed(5)
    x = torch.randint(-1000, 1000, (10, 8), generator=gen)
    labels = [k % 3 for k in range(10)]
    g = _golden(res.plan, res.model, x, labels, [True] * 10)
    return res.plan, g


def _perfect(g) -> RTLRun:
    return RTLRun(
        results=[(r.sample, r.pred, r.loss_raw, int(r.train)) for r in g.results],
        result_cycles=[],
        memories={k: {kk: vv.clone() for kk, vv in v.items()} for k, v in g.memories().items()},
        counters={
            "samples_trained": g.samples_applied,
            "ticks": g.ticks,
            "saturations": list(g.stage_saturations),
        },
        echo_errors=[],
        cycles=0,
        stream_cycles=0,
        flush_cycles=0,
        stream_start=0,
        sim_s=0.0,
        wall_s=0.0,
    )


def test_perfect_rtl_has_no_mismatch(golden_run):
    plan, g = golden_run
    assert compare(g, _perfect(g), plan) == []


def test_memory_mismatch_names_stage_tick_index(golden_run):
    plan, g = golden_run
    rtl = _perfect(g)
    name = plan.stages[1].name
    rtl.memories[name]["u"][2, 4] += 1
    (m,) = compare(g, rtl, plan)
    exp = int(g.memories()[name]["u"][2, 4])
    # S = 2, 10 samples: stage 2 applies sample n's update in tick n + 2S − 2 = n + 2 → last
    # update (sample 9) in tick 11
    assert m == Mismatch("memory", "u", 2, (2, 4), exp, exp + 1, 11, 9)
    assert (
        m.describe() == f"tick 11, stage 2, memory u[2, 4] (sample 9): expected {exp}, "
        f"actual {exp + 1}"
    )


def test_result_and_counter_mismatches(golden_run):
    plan, g = golden_run
    rtl = _perfect(g)
    s, p, loss, t = rtl.results[4]
    rtl.results[4] = (s, (p + 1) % 3, loss, t)
    rtl.counters = dict(rtl.counters, ticks=rtl.counters["ticks"] + 1, saturations=[0, 5, 0])
    mm = compare(g, rtl, plan)
    # sample 4's logits reach the loss unit at the end of tick 4 + S − 1 = 5; loss unit = S + 1
    assert mm[0] == Mismatch("result", "pred", 3, (4,), p, (p + 1) % 3, 5, 4)
    assert Mismatch("counter", "ticks", None, (), g.ticks, g.ticks + 1) in mm
    assert Mismatch("counter", "saturations", 2, (1,), 0, 5) in mm
    assert len(mm) == 3


def test_missing_results_are_reported(golden_run):
    plan, g = golden_run
    rtl = dataclasses.replace(_perfect(g))
    rtl.results = rtl.results[:7]
    mm = compare(g, rtl, plan)
    assert mm == [Mismatch("result", "count", 3, (7,), 10, 7, 8, 7)]


def test_conv_memories_are_weight_matrices_and_mismatches_name_the_tap():
    """A convolution stage's memories are its (C_out, T + 1) matrix (docs/numerics.md §9): the
    testbench writes and reads exactly those slots, and a planted difference names tick, stage,
    tensor, index and the tap (output channel, input channel, kernel offset; or the bias)."""
    from conv_nets import cnn
    from pipetrain.compiler.build import build_plan
    from pipetrain.compiler.frontend import trace
    from pipetrain.sim.tb.network import _memory_commands

    model = cnn("conv2d", "max", 1, 1, True)  # Conv2d(2 → 4, 3×3): T = 18
    plan = build_plan(trace(model, "c"), TrainConfig(lr=0.05), lanes=(2, 1, 2))
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, 200, (10, plan.in_features), generator=gen)
    g = _golden(plan, model, x, [k % 4 for k in range(10)], [True] * 10)
    cmds, where = _memory_commands(plan, g.memories(), write=True)
    conv = plan.stages[0].conv
    first = [w for w in where if w[0] == plan.stages[0].name and w[1] == "w"]
    assert len(first) == conv.out_channels * (conv.taps + 1) == 4 * 19
    assert {c[3] for c, w in zip(cmds, where, strict=True) if w in first} == set(range(4))
    rtl = _perfect(g)
    name = plan.stages[0].name
    rtl.memories[name]["w"][3, 13] += 1  # tap 13 = in channel 1, kernel row 1, column 1
    rtl.memories[name]["u"][2, 18] -= 1  # the bias column
    m1, m2 = compare(g, rtl, plan)
    tick = 9 + plan.stages[0].delay  # stage 1 applies sample 9's update D_1 ticks after entry
    assert (m1.tick, m1.stage, m1.tensor, m1.index, m1.sample) == (tick, 1, "w", (3, 13), 9)
    assert m1.detail == "out channel 3, in channel 1, kernel (1, 1)"
    w = model[0].weight.detach().view(4, -1)
    assert torch.equal(w[3, 13], model[0].weight.detach()[3, 1, 1, 1])  # the slot's meaning
    assert m1.describe().startswith(
        f"tick {tick}, stage 1, memory w[3, 13] (out channel 3, in channel 1, kernel (1, 1); "
        "sample 9): expected "
    )
    assert (m2.tensor, m2.index, m2.detail) == ("u", (2, 18), "out channel 2, bias")
