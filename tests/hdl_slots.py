"""Test helpers for the stage parts: a testbench model of the slot pipeline.

:func:`drive_pass` plays the slot sequencer for a part under test: it issues the slots of one
pass in numerics §2 order, with random gaps between slots (the real sequencer never leaves one,
so a part that only works gap-free fails here), and moves every slot one pipeline stage per
cycle. Before each clock edge it calls ``cycle(pipe)`` with ``pipe[k]`` = the slot at stage k
(``(index, col, group)`` or None), so the test sets the part's other inputs for the slots at
their stages and reads its outputs.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from pipetrain.hdl.streams import slot_at

Slot = tuple[int, int, int]  # (index in the pass, column, row group)


def pass_slots(in_features: int, row_groups: int) -> list[Slot]:
    """The slots of one pass: ``for g: for i in 0..N`` (column N = bias)."""
    out = []
    for g in range(row_groups):
        for i in range(in_features + 1):
            out.append((len(out), i, g))
    return out


async def drive_pass(
    ctx,
    slots_port,
    pipeline,
    *,
    rng: random.Random,
    gap: float = 0.0,
    fwd: bool = False,
    fwd_train: bool = False,
    bwd: bool = False,
    cycle: Callable[[list[Slot | None]], None] | None = None,
    slots: list[Slot] | None = None,
    single_port: bool = False,
) -> int:
    """Run one pass on ``slots_port`` (a part's ``In(SlotPipelineSignature)`` member); returns
    the cycles it took. ``gap``: probability that a cycle issues no slot. ``single_port``: never
    issue a slot (a read) in a cycle where a slot is at the write stage (a write), the rule
    single-port weight memories need."""
    G, N, depth = pipeline.row_groups, pipeline.in_features, pipeline.depth
    todo = list(slots if slots is not None else pass_slots(N, G))
    sp = slots_port
    have = sp.signature.members

    def put(name, value):  # a part declares only the flags and stages it reads
        if name in have:
            ctx.set(getattr(sp, name), value)

    stages = [k for k in range(depth + 1) if f"s{k}" in have]
    put("fwd", fwd)
    put("fwd_train", fwd_train)
    put("bwd", bwd)
    put("start", 1)
    for k in stages:
        ctx.set(slot_at(sp, k).valid, 0)
    if cycle is not None:
        cycle([None] * (depth + 1))
    await ctx.tick()
    put("start", 0)
    pipe: list[Slot | None] = [None] * (depth + 1)
    written = 0
    cycles = 1
    while todo or any(p is not None for p in pipe[:-1]):
        blocked = single_port and pipe[depth - 1] is not None
        new = todo.pop(0) if todo and not blocked and rng.random() >= gap else None
        pipe = [new, *pipe[:-1]]
        put("busy", bool(todo) or new is not None)
        if new is not None:
            put("read_addr", new[0])
        put("write_addr", written)
        for k in stages:
            s, port = pipe[k], slot_at(sp, k)
            ctx.set(port.valid, s is not None)
            if s is not None:
                ctx.set(port.payload.col, s[1])
                ctx.set(port.payload.group, s[2])
                ctx.set(port.payload.last_group, s[2] == G - 1)
        if cycle is not None:
            cycle(pipe)
        await ctx.tick()
        cycles += 1
        if pipe[depth] is not None:
            written += 1
    for k in stages:
        ctx.set(slot_at(sp, k).valid, 0)
    put("busy", 0)
    return cycles


def pack_lanes(values, bits: int) -> int:
    """One word of ``bits``-bit two's-complement lanes, lane 0 in the low bits."""
    word = 0
    for k, v in enumerate(values):
        word |= (int(v) & ((1 << bits) - 1)) << (k * bits)
    return word


def unpack_lanes(word: int, bits: int, n: int) -> list[int]:
    """The ``n`` signed ``bits``-bit lanes of ``word`` (the inverse of :func:`pack_lanes`)."""
    out = []
    for k in range(n):
        v = (word >> (k * bits)) & ((1 << bits) - 1)
        out.append(v - (1 << bits) if v >> (bits - 1) else v)
    return out
