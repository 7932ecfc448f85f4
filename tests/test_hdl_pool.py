"""The pooling unit of a convolution stage alone (Amaranth simulator): positions arrive
row-major with random activations (and random gaps), as the forward lanes give them; the pooled
outputs, the stashed MaxPool argmax and the AvgPool clamps equal the golden model's rule
(docs/numerics.md §9.1 step 3, sim/golden_conv.py: the first largest value of each window, the
mean ``sat(rhu(Σ·pool_scale, pool_shift), y)``); and ``pool_backward`` routes an error as §9.2
step 1 says."""

from __future__ import annotations

import random

import pytest
import torch
from amaranth import Module, Signal, signed
from amaranth.sim import Simulator
from hdl_slots import unpack_lanes
from pipetrain.compiler.conv import conv_cycles, conv_geometry
from pipetrain.compiler.plan import QFormat
from pipetrain.hdl.conv import ConvPipelineSignature, conv2d_view, conv_at, conv_slot_layout
from pipetrain.hdl.pool import PoolUnit, pool_backward
from pipetrain.hdl.streams import SlotPipelineSignature, slot_at
from pipetrain.sim.fixed import rhu
from pipetrain.sim.golden_conv import pool_windows

FY = QFormat(8, 4)


CASES = [
    ("conv2d", (6, 5), (2, 2), "max", 2, 3),  # 3 lanes over 2 channels: a padding lane
    ("conv2d", (5, 6), (2, 2), "avg", 3, 2),
    ("conv1d", (9,), (3,), "avg", 2, 2),  # a window of 3: the mean's scale round(2^16/3)
    ("conv1d", (8,), (2,), "max", 3, 3),
    ("conv2d", (4, 4), None, "none", 2, 2),
]


@pytest.mark.parametrize("kind,size,psize,pool,cout,lanes", CASES, ids=lambda c: str(c))
def test_pool_unit_equals_the_golden_pooling(kind, size, psize, pool, cout, lanes):
    n = len(size)
    g = conv_geometry(kind, 1, cout, size, (1,) * n, (1,) * n, (0,) * n, True, pool, psize)
    v = conv2d_view(g)
    G, _ = conv_cycles(g, lanes)
    live_last = cout - (G - 1) * lanes
    pipe = SlotPipelineSignature(g.taps, G, G * (g.taps + 1), 4)
    cp = ConvPipelineSignature(conv_slot_layout(v, G, g.in_values, 1), 4)
    pool_args = dict(pool=pool, scale=g.pool_scale, shift=g.pool_shift, groups=G)
    dut = PoolUnit(
        pipe, cp, v, **pool_args, lanes=lanes, live_last=live_last, y_format=FY,
        shift_add=lambda c: True,
    )  # fmt: skip
    rng = random.Random(len(size) * 7 + cout)
    P, Pp = g.positions, g.pooled_positions
    # activations (C_out, P), ties included (few values), and near-saturating means
    a = torch.tensor([[rng.choice([-3, 0, 5, 5, 60, 127, -128]) for _ in range(P)]
                      for _ in range(G * lanes)])  # fmt: skip
    win = pool_windows(g).tolist()
    where = {p: (q, row.index(p)) for q, row in enumerate(win) for p in row}
    got = {"y": [], "arg": [], "sat": 0}

    async def bench(ctx):
        c4, s4 = conv_at(dut.conv, 4), slot_at(dut.slots, 4)
        for grp in range(G):
            for p in range(P):
                q, r = where.get(p, (0, 0))
                pay = c4.payload
                ctx.set(pay.aword, grp * Pp + q if v.window > 1 else grp * P + p)
                ctx.set(pay.wcol, q % v.PQW if v.QH > 1 else 0)
                ctx.set(pay.r, r)
                ctx.set(pay.inwin, p in where)
                ctx.set(pay.win_first, r == 0)
                ctx.set(pay.win_last, r == g.window - 1)
                ctx.set(s4.payload.last_group, grp == G - 1)
                word = 0
                for lane in range(lanes):
                    word |= (int(a[grp * lanes + lane, p]) & 0xFF) << (8 * lane)
                ctx.set(dut.a.payload, word)
                ctx.set(dut.a.valid, 1)
                if ctx.get(dut.y.valid):
                    got["y"].append((ctx.get(dut.y.payload.word), ctx.get(dut.y.payload.data)))
                    if pool == "max":
                        got["arg"].append(ctx.get(dut.argmax_write.payload.bits))
                if pool == "avg":
                    got["sat"] += bin(ctx.get(dut.saturated)).count("1")
                await step(ctx)
                ctx.set(dut.a.valid, 0)
                for _ in range(rng.randrange(3)):  # the rest of the position's taps
                    await step(ctx)

    async def step(ctx):  # without pooling the unit has no registers (no clock domain)
        await (ctx.tick() if pool != "none" else ctx.delay(1e-8))

    sim = Simulator(dut)
    if pool != "none":
        sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()

    rows = torch.tensor(win)
    w = a[:, rows] if pool != "none" else a[:, :, None]  # (C, P′, window)
    if pool == "max":
        want, arg = w.max(dim=-1).values, w.argmax(dim=-1)  # torch: the first largest
    elif pool == "avg":
        s = rhu(w.sum(dim=-1) * g.pool_scale, g.pool_shift)
        want = s.clamp(FY.min_int, FY.max_int)
        live = torch.zeros_like(s, dtype=torch.bool)
        live[:cout] = True
        assert got["sat"] == int(((s != want) & live).sum())
    else:
        want = w[..., 0]
    assert [wd for wd, _ in got["y"]] == list(range(G * (Pp if pool != "none" else P)))
    y = torch.tensor([unpack_lanes(d, 8, lanes) for _, d in got["y"]])  # (G·P′, L)
    y = y.reshape(G, -1, lanes).permute(0, 2, 1).reshape(G * lanes, -1)
    assert torch.equal(y[:cout], want[:cout])
    if pool == "max":
        bits = max(1, (g.window - 1).bit_length())
        ga = torch.tensor([unpack_lanes(b, bits, lanes) for b in got["arg"]]) % (1 << bits)
        ga = ga.reshape(G, -1, lanes).permute(0, 2, 1).reshape(G * lanes, -1)
        assert torch.equal(ga[:cout], arg[:cout])


@pytest.mark.parametrize("pool", ["none", "max", "avg"])
def test_pool_backward_routes_the_error(pool):
    """max: the error at the stashed argmax only; avg: rhu(g·scale, shift) everywhere in the
    window (scale 1/3 in 16 fraction bits); 0 outside every window."""
    m = Module()
    g, r, arg = Signal(signed(12)), Signal(2), Signal(2)
    inwin, e = Signal(), Signal(signed(12))
    m.d.comb += e.eq(pool_backward(pool, g, r, inwin, arg, 21845, 16, lambda c: True))
    seen = []

    async def bench(ctx):
        for gv, rv, av, iw in [(-700, 1, 1, 1), (700, 2, 1, 1), (301, 0, 0, 0), (-5, 3, 3, 1)]:
            ctx.set(g, gv)
            ctx.set(r, rv)
            ctx.set(arg, av)
            ctx.set(inwin, iw)
            seen.append(ctx.get(e))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    want = {
        "none": [-700, 700, 301, -5],
        "max": [-700, 0, 0, -5],
        "avg": [rhu(torch.tensor(-700 * 21845), 16).item(), rhu(torch.tensor(700 * 21845), 16)
                .item(), 0, rhu(torch.tensor(-5 * 21845), 16).item()],
    }[pool]  # fmt: skip
    assert seen == want
