"""The convolution slot sequencer alone (Amaranth simulator): every slot of a pass — phase,
group, tap, weight word, the stash word and lane of the input value the tap reads (or a padding
zero), the input index, the mask / window words and the pooling flags — against the golden
model's im2col index and pooling windows (sim/golden_conv.py), and the pass length of the plan
(``pass_cycles`` = cycles − 1 + 2 + write stage)."""

from __future__ import annotations

import pytest
from amaranth.sim import Simulator
from pipetrain.compiler.conv import conv_cycles, conv_gap, conv_geometry
from pipetrain.hdl.conv import PHASE_MAC, PHASE_UPD, ConvSequencer, conv_at
from pipetrain.hdl.streams import SlotPipelineSignature, slot_at
from pipetrain.sim.golden_conv import im2col_index, pool_windows

FIELDS = ("phase", "last_mac", "bias_tap", "first_pos", "pad", "xword", "xlane", "xidx")
FIELDS += ("mword", "aword", "r", "inwin", "win_first", "win_last")


def _expected(g, G, Lw):
    """The slots of one pass in issue order, as dicts of the fields that matter for each."""
    T, P = g.taps, g.positions
    idx, win = im2col_index(g).tolist(), pool_windows(g).tolist()
    plane = g.in_values // g.in_channels
    where = {p: (q, row.index(p)) for q, row in enumerate(win) for p in row}
    out = []
    for grp in range(G):
        for p in range(P):
            for t in range(T + 1):
                last = int((grp, p, t) == (G - 1, P - 1, T))
                e = dict(col=t, g=grp, ra=grp * (T + 1) + t, phase=PHASE_MAC, upd=0)
                e |= dict(first_pos=int(p == 0), mword=grp * P + p, bias_tap=int(t == T))
                e["last_mac"] = last
                e["inwin"] = int(p in where)
                if p in where:
                    q, r = where[p]
                    e |= dict(aword=grp * g.pooled_positions + q, r=r)
                    e |= dict(win_first=int(r == 0), win_last=int(r == g.window - 1))
                if t < T:
                    i = idx[t][p]
                    e["pad"] = int(i == g.in_values)
                    if i < g.in_values:
                        c, pos = divmod(i, plane)
                        e |= dict(xidx=i, xword=(c // Lw) * plane + pos, xlane=c % Lw)
                out.append(e)
    for grp in range(G):
        for t in range(T + 1):
            out.append(dict(col=t, g=grp, ra=grp * (T + 1) + t, phase=PHASE_UPD, upd=1))
    return out


GEOMETRIES = [
    # (kind, C_in, C_out, size, kernel, stride, padding, pool, pool size, lanes, x lanes)
    ("conv2d", 2, 3, (5, 6), (3, 3), (1, 1), (1, 1), "max", (2, 2), 2, 1),
    ("conv2d", 3, 4, (5, 6), (3, 2), (2, 2), (1, 0), "avg", (2, 2), 3, 2),
    ("conv2d", 2, 2, (5, 5), (2, 2), (1, 1), (0, 0), "none", None, 1, 2),
    ("conv1d", 2, 3, (9,), (3,), (2,), (1,), "max", (2,), 2, 2),
    ("conv1d", 3, 3, (9,), (3,), (1,), (0,), "avg", (3,), 3, 1),  # a window of 3, a dropped tail
]


@pytest.mark.parametrize("geo", GEOMETRIES, ids=lambda g: "-".join(map(str, g[:1] + g[7:8])))
def test_sequencer_slots_are_the_im2col_order(geo):
    kind, cin, cout, size, k, s, pad, pool, psize, L, Lw = geo
    g = conv_geometry(kind, cin, cout, size, k, s, pad, True, pool, psize)
    G, cycles = conv_cycles(g, L)
    pipe = SlotPipelineSignature(g.taps, G, G * (g.taps + 1), 4)
    x_words = -(-cin // Lw) * (g.in_values // cin)
    dut = ConvSequencer(pipe, g, x_words=x_words, x_lanes=Lw, cycles=cycles)
    got, length = [], []

    async def bench(ctx):
        ctx.set(dut.items.start, 1)
        ctx.set(dut.items.bwd, 1)
        ctx.set(dut.items.fwd, 1)
        await ctx.tick()
        ctx.set(dut.items.start, 0)
        n = 1
        while not ctx.get(dut.items.done):
            s0, c0 = slot_at(dut.slots, 0), conv_at(dut.conv, 0).payload
            if ctx.get(s0.valid):
                rec = dict(col=ctx.get(s0.payload.col), g=ctx.get(s0.payload.group))
                rec |= dict(ra=ctx.get(dut.slots.read_addr), upd=ctx.get(dut.upd))
                rec |= {f: ctx.get(getattr(c0, f)) for f in FIELDS}
                got.append(rec)
            await ctx.tick()
            n += 1
        length.append(n)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    want = _expected(g, G, Lw)
    assert len(got) == len(want) == cycles - conv_gap(g, G)
    for n, (a, e) in enumerate(zip(got, want, strict=True)):
        assert {f: a[f] for f in e} == e, n
    assert length == [cycles - 1 + 2 + 4]  # Stage.pass_cycles with write stage 4


def test_sequencer_refuses_a_cycle_count_that_is_not_its_phases():
    g = conv_geometry("conv1d", 1, 2, (8,), (3,), (1,), (1,), True)
    G, cycles = conv_cycles(g, 2)
    pipe = SlotPipelineSignature(g.taps, G, G * (g.taps + 1), 4)
    with pytest.raises(ValueError, match="cycles per pass"):
        ConvSequencer(pipe, g, x_words=8, x_lanes=1, cycles=cycles - 1)
