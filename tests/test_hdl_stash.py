"""The input stash alone (Amaranth simulator): stash writes with random gaps, then passes whose
``x`` operands (forward and backward item, bias input in column N, the lane of a packed word)
and mask bits must be the stored values — while another entry is being written, as the previous
stage does during a tick."""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator
from hdl_slots import drive_pass
from pipetrain.compiler.build import x_operand_bits
from pipetrain.compiler.plan import QFormat
from pipetrain.hdl.stash import InputStash
from pipetrain.hdl.streams import SlotPipelineSignature


def _pack(values, bits):
    word = 0
    for k, v in enumerate(values):
        word |= (v & ((1 << bits) - 1)) << (k * bits)
    return word


@pytest.mark.parametrize(
    "N,G,L,Lw,fx,plane",
    [
        (5, 2, 3, 1, QFormat(16, 10), 1),
        (7, 3, 2, 3, QFormat(8, 7), 1),  # 3 values a word; the bias 2^7 needs a 9-bit operand
        (4, 1, 4, 2, QFormat(12, 4), 1),
        (12, 2, 2, 2, QFormat(8, 4), 3),  # after a convolution: 4 channels × 3 positions
        (10, 1, 3, 3, QFormat(8, 4), 2),  # 5 channels × 2 positions, a partly used last word
    ],
)
@pytest.mark.parametrize("early_read", [False, True])
def test_stash_returns_the_stored_operands_and_masks(N, G, L, Lw, fx, plane, early_read):
    """``early_read`` (operand registers: each slot's words read a cycle ahead and registered
    before the lane pick) gives the same operands at S2; the bases change with the start
    pulse, as the tick controller's do, so the first early read is the start cycle's. After a
    convolution writer (``plane`` = P′ positions) column ``c·P′ + q`` is lane ``c mod Lw`` of
    word ``(c div Lw)·P′ + q``."""
    rng = random.Random(N * 7 + Lw + plane)
    P = 3
    kx = -(-N // (plane * Lw)) * plane
    xb = x_operand_bits(fx)
    pipe = SlotPipelineSignature(N, G, G * (N + 1), 4)
    dut = InputStash(
        pipe,
        lanes=L,
        entries=P,
        x_lanes=Lw,
        x_words=kx,
        x_format=fx,
        x_operand_bits=xb,
        plane=plane,
        early_read=early_read,
    )

    def place(i):  # column i's (word, lane)
        c, q = divmod(i, plane)
        return (c // Lw) * plane + q, c % Lw

    xs = [[rng.randrange(fx.min_int, fx.max_int + 1) for _ in range(N)] for _ in range(P)]
    words = []  # each entry's stash words
    for e in range(P):
        lanes = [[0] * Lw for _ in range(kx)]
        for i in range(N):
            w, lane = place(i)
            lanes[w][lane] = xs[e][i]
        words.append([_pack(v, fx.bits) for v in lanes])
    masks = [[rng.randrange(1 << L) for _ in range(G)] for _ in range(P)]
    bias = 1 << fx.frac
    got = []

    async def write_entry(ctx, e, gap):
        """Entry e's words and masks, with random idle cycles between beats."""
        ctx.set(dut.bases.write, e * kx)
        ctx.set(dut.bases.fwd_mask, e * G)
        for q in range(kx):
            while rng.random() < gap:
                await ctx.tick()
            ctx.set(dut.write.valid, 1)
            ctx.set(dut.write.payload.word, q)
            ctx.set(dut.write.payload.data, words[e][q])
            await ctx.tick()
            ctx.set(dut.write.valid, 0)
        for g in range(G):
            while rng.random() < gap:
                await ctx.tick()
            ctx.set(dut.mask_write.valid, 1)
            ctx.set(dut.mask_write.payload.group, g)
            ctx.set(dut.mask_write.payload.bits, masks[e][g])
            await ctx.tick()
            ctx.set(dut.mask_write.valid, 0)

    async def bench(ctx):
        await write_entry(ctx, 0, 0.5)
        await write_entry(ctx, 1, 0.3)
        # passes: (forward entry, backward entry) while entry 2 is written beside them
        for fe, be in ((0, 1), (1, 0), (1, 1)):
            ctx.set(dut.bases.fwd_x, fe * kx)
            ctx.set(dut.bases.bwd_x, be * kx)
            ctx.set(dut.bases.bwd_mask, be * G)
            ctx.set(dut.bases.write, 2 * kx)
            beats = list(range(kx))
            seen = []

            def cycle(pipe, beats=beats, seen=seen):
                # one stash write of entry 2 in some cycles of the pass
                if beats and rng.random() < 0.4:
                    q = beats.pop(0)
                    ctx.set(dut.write.valid, 1)
                    ctx.set(dut.write.payload.word, q)
                    ctx.set(dut.write.payload.data, _pack([-1 - q] * Lw, fx.bits))
                else:
                    ctx.set(dut.write.valid, 0)
                if pipe[1] is not None:
                    seen.append(("mask", pipe[1], ctx.get(dut.mask.bits)))
                if pipe[2] is not None:
                    op = dut.operands
                    seen.append(("x", pipe[2], ctx.get(op.x_fwd), ctx.get(op.x_bwd)))

            await drive_pass(ctx, dut.slots, pipe, rng=rng, gap=0.35, cycle=cycle)
            ctx.set(dut.write.valid, 0)
            got.append((fe, be, seen))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert len(got) == 3
    for fe, be, seen in got:
        n_x = n_m = 0
        for rec in seen:
            if rec[0] == "mask":
                (_, i, g), bits = rec[1], rec[2]
                assert bits == masks[be][g], (be, g)
                n_m += 1
            else:
                (_, i, g), xf, xbk = rec[1], rec[2], rec[3]
                assert xf == (bias if i == N else xs[fe][i]), (fe, i)
                assert xbk == (bias if i == N else xs[be][i]), (be, i)
                n_x += 1
        assert n_x == n_m == G * (N + 1)


def test_stash_rejects_a_bad_geometry():
    pipe = SlotPipelineSignature(5, 1, 6, 4)
    with pytest.raises(ValueError, match="x_words"):
        InputStash(
            pipe, lanes=1, entries=2, x_lanes=2, x_words=2, x_format=QFormat(8, 4), x_operand_bits=8
        )
    with pytest.raises(ValueError, match="operand"):
        InputStash(
            pipe, lanes=1, entries=2, x_lanes=1, x_words=5, x_format=QFormat(8, 4), x_operand_bits=7
        )


@pytest.mark.parametrize(
    "N,k,G",
    [
        (6, 3, 2),  # 7 columns in 3 slots: the bias at sub-lane 0 of the last, 2 padding zeros
        (5, 2, 1),  # 6 columns in 3 slots: the bias in the last sub-lane, no padding
        (8, 4, 3),  # 9 columns in 3 slots: the bias at sub-lane 0, 3 padding zeros
    ],
)
def test_column_lanes_stash_gives_k_operands_a_slot(N, k, G):
    """k column lanes (``Stage.col_lanes``): host words written in a random order land in bank
    ``w mod k`` at ``base + w div k``; slot ``t`` gives operand ``s`` = column ``t·k + s`` of the
    forward and backward entries (the bias input in column N, 0 above it) while another entry is
    being written."""
    rng = random.Random(N * 11 + k)
    P, fx = 3, QFormat(10, 6)
    xb = x_operand_bits(fx)
    C = -(-(N + 1) // k)
    pipe = SlotPipelineSignature(C - 1, G, G * C, 4)
    dut = InputStash(
        pipe, lanes=2, entries=P, x_lanes=1, x_words=N, x_format=fx, x_operand_bits=xb,
        columns=k, inputs=N,
    )  # fmt: skip
    xs = [[rng.randrange(fx.min_int, fx.max_int + 1) for _ in range(N)] for _ in range(P)]
    bias = 1 << fx.frac
    got = []

    async def write_entry(ctx, e, words):
        ctx.set(dut.bases.write, e * N)
        for w in words:
            while rng.random() < 0.3:
                await ctx.tick()
            ctx.set(dut.write.valid, 1)
            ctx.set(dut.write.payload.word, w)
            ctx.set(dut.write.payload.data, xs[e][w] & ((1 << fx.bits) - 1))
            await ctx.tick()
            ctx.set(dut.write.valid, 0)

    async def bench(ctx):
        for e in (0, 1):
            await write_entry(ctx, e, rng.sample(range(N), N))
        for fe, be in ((0, 1), (1, 0)):
            ctx.set(dut.bases.fwd_x, fe * N)
            ctx.set(dut.bases.bwd_x, be * N)
            ctx.set(dut.bases.write, 2 * N)
            beats, seen = list(range(N)), []

            def cycle(pipe, beats=beats, seen=seen):
                if beats and rng.random() < 0.4:  # entry 2 written beside the pass
                    ctx.set(dut.write.valid, 1)
                    ctx.set(dut.write.payload.word, beats.pop(0))
                    ctx.set(dut.write.payload.data, 0x155)
                else:
                    ctx.set(dut.write.valid, 0)
                if pipe[2] is not None:
                    op = dut.operands
                    xf = [ctx.get(op.x_fwd[s]) for s in range(k)]
                    seen.append((pipe[2], xf, [ctx.get(op.x_bwd[s]) for s in range(k)]))

            await drive_pass(ctx, dut.slots, pipe, rng=rng, gap=0.35, cycle=cycle)
            ctx.set(dut.write.valid, 0)
            got.append((fe, be, seen))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()

    def want(e, col):
        return bias if col == N else 0 if col > N else xs[e][col]

    for fe, be, seen in got:
        assert len(seen) == G * C
        for (_, t, _g), xf, xbk in seen:
            assert xf == [want(fe, t * k + s) for s in range(k)], (fe, t)
            assert xbk == [want(be, t * k + s) for s in range(k)], (be, t)
