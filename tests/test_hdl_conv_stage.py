"""The composed convolution stage alone (Amaranth simulator) against the golden model's
convolution engine (docs/numerics.md §9), bit for bit: pooled forward outputs, input gradients,
final weights and velocities (read back through the weight-access port), the saturation counter
and the pass length (the plan's ``pass_cycles``).

The testbench plays the tick controller and the neighbouring stages, as tests/test_hdl_stage.py
does for the Linear stage: in tick t the stage forwards sample t and back-propagates sample
t − 1 (an inference sample is not back-propagated) while sample t + 1's input feature map and
sample t's error arrive on the valid-only inputs with random gaps.
"""

from __future__ import annotations

import random
import warnings

import pytest
import torch
from amaranth.sim import Simulator
from hdl_slots import pack_lanes, unpack_lanes
from pipetrain.compiler.build import PlanWarning, build_plan
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.frontend import trace
from pipetrain.hdl.conv import conv2d_view
from pipetrain.hdl.conv_stage import ConvStageUnit
from pipetrain.sim.golden import GoldenModel
from torch import nn

# a weight bank's read that meets a write to its address reads garbage (conftest)
pytestmark = pytest.mark.usefixtures("poisoned_collisions")


def conv_net(kind, pool, stride, padding, bias, act, c=(2, 3, 2), window=2, size=None):
    """Conv (c0 → c1) → act → pool → Conv (c1 → c2, 2, padding 1) → ReLU → Flatten → Linear(→ 3),
    seeded (tests/test_golden_conv.py's net with settable channels)."""
    torch.manual_seed(5)
    conv = nn.Conv1d if kind == "conv1d" else nn.Conv2d
    pools = {
        "max": (nn.MaxPool1d if kind == "conv1d" else nn.MaxPool2d)(window),
        "avg": (nn.AvgPool1d if kind == "conv1d" else nn.AvgPool2d)(window),
        "none": nn.Identity(),
    }
    acts = {"relu": nn.ReLU(), "leaky_relu": nn.LeakyReLU(0.125), "identity": nn.Identity()}
    size = size or ((9,) if kind == "conv1d" else (5, 6))
    first = conv(c[0], c[1], 3, stride=stride, padding=padding, bias=bias)
    m = nn.Sequential(first, acts[act], pools[pool], conv(c[1], c[2], 2, padding=1), nn.ReLU())
    with torch.no_grad():
        out = m(torch.zeros(1, c[0], *size)).numel()
    m.append(nn.Flatten())
    m.append(nn.Linear(out, 3))
    m.input_shape = (c[0], *size)
    return m


def run_stage(model, s, lanes, n=6, seed=0, **cfg):
    """Drive conv stage ``s`` (0-based) of ``model``'s plan through ``n`` samples and compare
    with the golden engine; returns the stage's plan entry."""
    config = TrainConfig(**{"lr": 0.05, **cfg})
    with warnings.catch_warnings():  # deliberate idle (padding) lanes raise a PlanWarning
        warnings.simplefilter("ignore", PlanWarning)
        plan = build_plan(trace(model, "conv"), config, lanes=lanes)
    st = plan.stages[s]
    f, g = st.formats, st.conv
    v = conv2d_view(g)
    L, G, E, kx, Lw = st.lanes, st.row_groups, st.stash_entries, st.x_words, st.x_lanes
    T, Cout, Pp, Nin = g.taps, g.out_channels, g.pooled_positions, g.in_values
    eng = GoldenModel(plan, model, config).stages[s]
    w0 = eng.w.clone()
    rng = random.Random(seed)
    train = [k != 2 for k in range(n)]
    xs = [[rng.randrange(f.x.min_int // 2, f.x.max_int // 2) for _ in range(Nin)] for _ in range(n)]
    gs = [[rng.randrange(f.d.min_int // 2, f.d.max_int // 2) for _ in range(Cout * Pp)]
          for _ in range(n)]  # fmt: skip
    plane = v.H * v.W

    def word_values(smp, q):  # stash word q: channels cw·Lw + l at input position pos
        cw, pos = divmod(q, plane)
        chans = [cw * Lw + lane for lane in range(Lw)]
        return [xs[smp][c * plane + pos] if c < v.C else 0 for c in chans]

    dut = ConvStageUnit(plan, st)
    got = {"y": {}, "gin": {}, "cycles": []}

    async def access(ctx, write, kind, j, t, data=0):
        acc = dut.access
        ctx.set(acc.en, 1)
        ctx.set(acc.write, write)
        ctx.set(acc.kind, kind)
        ctx.set(acc.lane, j % L)
        ctx.set(acc.addr, (j // L) * (T + 1) + t)
        ctx.set(acc.data, data)
        await ctx.tick()
        ctx.set(acc.en, 0)
        await ctx.tick()
        await ctx.tick()  # rdata: three cycles after en (two registered multiplexer levels)
        return ctx.get(acc.rdata)

    def set_x(ctx, smp, q):
        ctx.set(dut.ctl.stash.write, smp % E * kx)
        ctx.set(dut.x_in.valid, 1)
        ctx.set(dut.x_in.payload.word, q)
        ctx.set(dut.x_in.payload.data, pack_lanes(word_values(smp, q), f.x.bits))

    def set_g(ctx, smp, k):
        ctx.set(dut.ctl.error.write, smp % 2)
        ctx.set(dut.g_in.valid, 1)
        ctx.set(dut.g_in.payload, gs[smp][k])

    async def bench(ctx):
        for j in range(Cout):
            for t in range(T + 1):
                await access(ctx, 1, 0, j, t, int(w0[j, t]))
                if eng.w_prev is not None:
                    await access(ctx, 1, 2, j, t, int(w0[j, t]))
        ctl = dut.ctl
        x_beats = [(0, q) for q in range(kx)]
        g_beats = []
        for t in range(n + 1):
            fs, bs = (t if t < n else None), (t - 1 if t >= 1 and train[t - 1] else None)
            while x_beats and x_beats[0][0] <= t:
                set_x(ctx, *x_beats.pop(0))
                await ctx.tick()
            while g_beats and g_beats[0][0] < t:
                set_g(ctx, *g_beats.pop(0))
                await ctx.tick()
            ctx.set(dut.x_in.valid, 0)
            ctx.set(dut.g_in.valid, 0)
            if t + 1 < n:
                x_beats += [(t + 1, q) for q in range(kx)]
            if fs is not None and train[fs]:
                g_beats += [(fs, k) for k in range(Cout * Pp)]
            st_ = ctl.stash
            ctx.set(ctl.items.fwd, fs is not None)
            ctx.set(ctl.items.fwd_train, fs is not None and train[fs])
            ctx.set(ctl.items.bwd, bs is not None)
            ctx.set(st_.fwd_x, (fs or 0) % E * kx)
            ctx.set(st_.fwd_mask, (fs or 0) % E * G * g.positions)
            ctx.set(st_.bwd_x, (bs or 0) % E * kx)
            ctx.set(st_.bwd_mask, (bs or 0) % E * G * g.positions)
            ctx.set(ctl.error.read, (t - 1) % 2)
            ctx.set(ctl.error.write, t % 2)
            ctx.set(ctl.items.start, 1)
            cycles, ys, gins = 0, [], []
            while True:
                if ctx.get(dut.y.valid):
                    ys.append((ctx.get(dut.y.payload.word), ctx.get(dut.y.payload.data)))
                if st.input_gradient and ctx.get(dut.gin.valid):
                    gins.append(ctx.get(dut.gin.payload))
                ctx.set(dut.x_in.valid, 0)
                ctx.set(dut.g_in.valid, 0)
                if x_beats and rng.random() < 0.3:
                    set_x(ctx, *x_beats.pop(0))
                if g_beats and rng.random() < 0.3:
                    set_g(ctx, *g_beats.pop(0))
                await ctx.tick()
                ctx.set(ctl.items.start, 0)
                cycles += 1
                if ctx.get(ctl.items.done):
                    break
            ctx.set(dut.x_in.valid, 0)
            ctx.set(dut.g_in.valid, 0)
            got["cycles"].append(cycles)
            if fs is not None:
                got["y"][fs] = ys
            if bs is not None:
                got["gin"][bs] = gins
        got["w"] = [[await access(ctx, 0, 0, j, t) for t in range(T + 1)] for j in range(Cout)]
        got["u"] = [[await access(ctx, 0, 1, j, t) for t in range(T + 1)] for j in range(Cout)]
        got["sat"] = ctx.get(dut.saturations)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()

    for t in range(n + 1):
        if t < n:
            xb = torch.tensor([*xs[t], 0], dtype=torch.int64)
            _, out, aux = eng.forward(xb, train[t])
            if train[t]:
                eng.stash[t] = (xb, aux)
            words = sorted(got["y"][t])
            assert [w for w, _ in words] == list(range(G * Pp)), t
            y = [0] * (Cout * Pp)
            for w, d in words:
                grp, q = divmod(w, Pp)
                for lane, val in enumerate(unpack_lanes(d, f.y.bits, L)):
                    if grp * L + lane < Cout:
                        y[(grp * L + lane) * Pp + q] = val
            assert y == out.tolist(), t
        if t >= 1 and train[t - 1]:
            _, gin = eng.backward(t - 1, torch.tensor(gs[t - 1], dtype=torch.int64))
            if st.input_gradient:
                assert got["gin"][t - 1] == gin.tolist(), t - 1
    assert torch.equal(torch.tensor(got["w"]), eng.w)
    assert torch.equal(torch.tensor(got["u"]), eng.u)
    assert not torch.equal(eng.w, w0)  # the stage did train
    assert got["sat"] == eng.sat
    assert set(got["cycles"]) == {st.pass_cycles}
    return st


CASES = [
    # (net, stage, lanes, training options)
    # 4×5 maps: the MaxPool windows leave the last column out
    (dict(kind="conv2d", pool="max", stride=1, padding=1, bias=True, act="relu", size=(4, 5)), 0,
     (2, 1, 2), {}),
    (dict(kind="conv2d", pool="avg", stride=2, padding=1, bias=False, act="leaky_relu"), 1,
     (2, 1, 2), dict(mitigation="sc+lwp", rounding="nearest_even")),
    # stage 1's 3 lanes over 4 channels: a padding lane in the words stage 2 reads
    (dict(kind="conv1d", pool="max", stride=2, padding=1, bias=False, act="relu", c=(2, 4, 2)),
     1, (3, 2, 2), dict(mitigation="lwp", lwp_form="w")),
    (dict(kind="conv1d", pool="avg", stride=1, padding=0, bias=True, act="leaky_relu", window=3),
     0, (2, 1, 2), dict(mitigation="sc")),
    (dict(kind="conv2d", pool="none", stride=2, padding=0, bias=True, act="identity"), 1,
     (3, 2, 2), {}),
]  # fmt: skip


@pytest.mark.parametrize("net,s,lanes,cfg", CASES, ids=lambda c: str(c))
def test_conv_stage_equals_the_golden_engine(net, s, lanes, cfg):
    run_stage(conv_net(**net), s, lanes, **cfg)


def test_require_hdl_refuses_a_conv_stage_the_hdl_does_not_build():
    """One HDLSupportError line naming the stage and the way out: single-port (SPRAM) weights,
    a convolution feeding the loss unit with several lanes over several positions, and several
    backward streams (interlocking); the plans the HDL builds pass."""
    import dataclasses

    from pipetrain.hdl.support import HDLSupportError, require_hdl

    model = conv_net("conv1d", "max", 1, 1, True, "relu", c=(1, 8, 2), size=(64,))
    plan = build_plan(trace(model, "conv"), TrainConfig(), lanes=(2, 2, 1))
    require_hdl(plan, "sim")
    stages = list(plan.stages)
    stages[0] = dataclasses.replace(stages[0], slot_cycles=2)
    with pytest.raises(
        HDLSupportError,
        match=r"stage 1 \(conv1d\): single-port .*`pipetrain train MODEL --target golden`",
    ):
        require_hdl(dataclasses.replace(plan, stages=tuple(stages)), "sim")
    last = nn.Sequential(nn.Conv1d(1, 2, 3), nn.ReLU(), nn.MaxPool1d(2), nn.Flatten())
    last.input_shape = (1, 10)  # a convolution feeds the loss unit: 2 channels × 4 positions
    require_hdl(build_plan(trace(last, "conv"), TrainConfig(), lanes=(1,)), "sim")
    with pytest.raises(HDLSupportError, match=r"stage 1 \(conv1d\) feeds the loss unit"):
        require_hdl(build_plan(trace(last, "conv"), TrainConfig(), lanes=(2,)), "sim")
    inter = TrainConfig(strategy="interlocking", blocks=(1, 2), distance=1)
    plan = build_plan(trace(conv_net("conv2d", "max", 1, 1, True, "relu"), "conv"), inter)
    with pytest.raises(HDLSupportError, match=r"stage 2 \(conv2d\): 2 backward streams"):
        require_hdl(plan, "build")


def test_the_gap_makes_room_to_send_a_long_input_gradient():
    """A 1-tap stride-2 convolution of 8 channels sends 8·32 = 256 input gradients after its MAC
    phase, more than its (8 + 1) update slots take: the plan's gap grows to 256 + 6 − 9 cycles
    and the stage still equals the golden engine at the plan's pass length."""
    from pipetrain.compiler.conv import conv_gap

    m = nn.Sequential(nn.Conv1d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv1d(8, 1, 1, stride=2))
    m.append(nn.Flatten())
    m.append(nn.Linear(16, 2))
    m.input_shape = (1, 32)
    st = run_stage(m, 1, (2, 1, 1), n=3)
    assert conv_gap(st.conv, st.row_groups) == 256 + 6 - 9
