"""The composed Linear stage alone (Amaranth simulator) against the golden model's stage engine,
bit for bit: forward outputs, input gradients, final weights and velocities (read back through
the weight-access port), the saturation counter and the pass length.

The testbench plays the tick controller and the neighbouring stages: weights are loaded
through ``access``; in tick t the stage forwards sample t and back-propagates sample t − 1
(an inference sample is not back-propagated) while sample t + 1's ``x`` and sample t's error
``g`` arrive on the valid-only inputs with random gaps. The golden engine runs the same
samples in the same order (forward first: it reads the weights before the tick's update).
"""

from __future__ import annotations

import random

import pytest
import torch
from amaranth.sim import Simulator
from pipetrain.hdl.stage import StageUnit
from pipetrain.sim.golden import GoldenModel
from tiny_net import tiny

# a weight bank's read that meets a write to its address reads garbage (conftest)
pytestmark = pytest.mark.usefixtures("poisoned_collisions")


def _pack(values, bits):
    word = 0
    for k, v in enumerate(values):
        word |= (int(v) & ((1 << bits) - 1)) << (k * bits)
    return word


def _unpack(word, bits, n):
    out = []
    for k in range(n):
        v = (word >> (k * bits)) & ((1 << bits) - 1)
        out.append(v - (1 << bits) if v >> (bits - 1) else v)
    return out


CASES = [
    (dict(), 1),  # relu, 3 lanes over 4 rows (padding), 2-value stash words, gacc
    (dict(), 0),  # stage 1: LeakyReLU, no input gradient, 3 row groups
    (dict(mitigation="sc+lwp", rounding="nearest_even"), 1),
    (dict(lanes=(1, 3, 1), single_port=(1, 3), const_bits=5), 0),  # SPRAM slots
    (dict(mitigation="sc+lwp", lanes=(1, 1, 1), single_port=(2,), const_bits=4), 1),
    (dict(mitigation="sc+lwp", lwp_form="w"), 1),  # LWP w form: the w_prev banks (kind 2)
]


@pytest.mark.parametrize("case,s", CASES, ids=lambda c: str(c))
def test_stage_unit_equals_the_golden_stage(case, s):
    plan, model, cfg = tiny(**case)
    st = plan.stages[s]
    f = st.formats
    N, M, L, G = st.in_features, st.out_features, st.lanes, st.row_groups
    P, kx, Lw = st.stash_entries, st.x_words, st.x_lanes
    eng = GoldenModel(plan, model, cfg).stages[s]
    w0 = eng.w.clone()
    rng = random.Random(s * 13 + len(str(case)))
    n = 7
    train = [k != 3 for k in range(n)]
    xs = [[rng.randrange(f.x.min_int // 2, f.x.max_int // 2) for _ in range(N)] for _ in range(n)]
    gs = [[rng.randrange(f.d.min_int // 4, f.d.max_int // 4) for _ in range(M)] for _ in range(n)]
    dut = StageUnit(plan, st)
    got = {"y": {}, "gin": {}, "cycles": [], "w": None, "u": None, "sat": None}

    async def access(ctx, write, kind, j, i, data=0):
        acc = dut.access
        ctx.set(acc.en, 1)
        ctx.set(acc.write, write)
        ctx.set(acc.kind, kind)
        ctx.set(acc.lane, j % L)
        ctx.set(acc.addr, (j // L) * (N + 1) + i)
        ctx.set(acc.data, data)
        await ctx.tick()
        ctx.set(acc.en, 0)
        await ctx.tick()
        await ctx.tick()  # rdata: three cycles after en (two registered multiplexer levels)
        return ctx.get(acc.rdata)

    async def bench(ctx):
        for j in range(M):
            for i in range(N + 1):
                await access(ctx, 1, 0, j, i, int(w0[j, i]))
                if eng.w_prev is not None:  # w_prev = w before the first update
                    await access(ctx, 1, 2, j, i, int(w0[j, i]))
        ctl = dut.ctl
        x_beats = [(0, q) for q in range(kx)]  # (sample, word) still to write
        g_beats = []  # (sample, row)
        for t in range(n + 1):
            fs, bs = (t if t < n else None), (t - 1 if t >= 1 and train[t - 1] else None)
            while x_beats and x_beats[0][0] <= t:  # this tick's forward input is complete
                smp, q = x_beats.pop(0)
                await write_x(ctx, smp, q)
            while g_beats and g_beats[0][0] < t:
                smp, j = g_beats.pop(0)
                await write_g(ctx, smp, j)
            ctx.set(dut.x_in.valid, 0)
            ctx.set(dut.g_in.valid, 0)
            if t + 1 < n:
                x_beats += [(t + 1, q) for q in range(kx)]
            if fs is not None and train[fs]:
                g_beats += [(fs, j) for j in range(M)]
            st_ = ctl.stash
            ctx.set(ctl.items.fwd, fs is not None)
            ctx.set(ctl.items.fwd_train, fs is not None and train[fs])
            ctx.set(ctl.items.bwd, bs is not None)
            ctx.set(st_.fwd_x, (fs or 0) % P * kx)
            ctx.set(st_.fwd_mask, (fs or 0) % P * G)
            ctx.set(st_.bwd_x, (bs or 0) % P * kx)
            ctx.set(st_.bwd_mask, (bs or 0) % P * G)
            ctx.set(ctl.error.read, (t - 1) % 2)
            ctx.set(ctl.error.write, t % 2)
            ctx.set(ctl.items.start, 1)
            cycles = 0
            ys, gins = [], []
            while True:
                if ctx.get(dut.y.valid):
                    ys.append((ctx.get(dut.y.payload.word), ctx.get(dut.y.payload.data)))
                if st.input_gradient and ctx.get(dut.gin.valid):
                    gins.append(ctx.get(dut.gin.payload))
                # the neighbours' beats arrive during the pass, with random gaps
                ctx.set(dut.x_in.valid, 0)
                ctx.set(dut.g_in.valid, 0)
                if x_beats and rng.random() < 0.3:
                    smp, q = x_beats.pop(0)
                    set_x(ctx, smp, q)
                if g_beats and rng.random() < 0.3:
                    smp, j = g_beats.pop(0)
                    set_g(ctx, smp, j)
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
            for _ in range(rng.randrange(3)):
                await ctx.tick()
        got["w"] = [[await access(ctx, 0, 0, j, i) for i in range(N + 1)] for j in range(M)]
        got["u"] = [[await access(ctx, 0, 1, j, i) for i in range(N + 1)] for j in range(M)]
        if eng.w_prev is not None:
            got["w_prev"] = [
                [await access(ctx, 0, 2, j, i) for i in range(N + 1)] for j in range(M)
            ]
        got["sat"] = ctx.get(dut.saturations)

    def set_x(ctx, smp, q):
        ctx.set(dut.ctl.stash.write, smp % P * kx)
        ctx.set(dut.x_in.valid, 1)
        ctx.set(dut.x_in.payload.word, q)
        ctx.set(dut.x_in.payload.data, _pack(xs[smp][q * Lw : (q + 1) * Lw], f.x.bits))

    async def write_x(ctx, smp, q):
        set_x(ctx, smp, q)
        await ctx.tick()

    def set_g(ctx, smp, j):
        ctx.set(dut.ctl.error.write, smp % 2)
        ctx.set(dut.g_in.valid, 1)
        ctx.set(dut.g_in.payload, gs[smp][j])

    async def write_g(ctx, smp, j):
        set_g(ctx, smp, j)
        await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()

    # the golden stage engine on the same samples: tick t forwards t, then back-propagates t − 1
    for t in range(n + 1):
        if t < n:
            xb = torch.tensor([*xs[t], 1 << f.x.frac], dtype=torch.int64)
            _, a, mask = eng.forward(xb, train[t])
            if train[t]:
                eng.stash[t] = (xb, mask)
            words = sorted(got["y"][t])
            assert [w for w, _ in words] == list(range(G))
            y = [v for _, d in words for v in _unpack(d, f.y.bits, L)][:M]
            assert y == a.tolist(), t
        if t >= 1 and train[t - 1]:
            _, gin = eng.backward(t - 1, torch.tensor(gs[t - 1], dtype=torch.int64))
            if st.input_gradient:
                assert got["gin"][t - 1] == gin.tolist(), t - 1
    assert torch.equal(torch.tensor(got["w"]), eng.w)
    assert torch.equal(torch.tensor(got["u"]), eng.u)
    if eng.w_prev is not None:
        assert torch.equal(torch.tensor(got["w_prev"]), eng.w_prev)
        assert not torch.equal(eng.w_prev, w0)
    assert not torch.equal(eng.w, w0)  # the stage did train
    assert got["sat"] == eng.sat
    assert set(got["cycles"]) == {st.pass_cycles}
