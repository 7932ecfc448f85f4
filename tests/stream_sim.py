"""``lib.stream`` helpers for testbenches in Amaranth's simulator: put and get beats under random
backpressure, and a checker of the stream rules.

``rng`` seeds the random gaps so a failing run replays; ``p`` is the probability that the
helper offers (``valid``) or accepts (``ready``) in a given cycle (1.0 = every cycle). A beat
transfers at the clock edge that ends a cycle in which ``valid`` and ``ready`` are both high;
``ctx.tick().sample(...)`` reads the values at that edge. (The cocotb equivalents for Verilator
runs are in ``pipetrain.sim.tb.streams``.)
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any


async def stream_put(
    ctx: Any, stream: Any, payload: Any, rng: random.Random | None = None, p: float = 1.0
) -> None:
    """Offer ``payload`` after random idle cycles (``valid`` low) and hold it until taken; return
    right after the edge that took it, with ``valid`` low again."""
    while rng is not None and rng.random() >= p:
        await ctx.tick()
    ctx.set(stream.payload, payload)
    ctx.set(stream.valid, 1)
    await ctx.tick().until(stream.ready)
    ctx.set(stream.valid, 0)


async def stream_get(
    ctx: Any, stream: Any, rng: random.Random | None = None, p: float = 1.0
) -> Any:
    """Take one beat, raising ``ready`` in random cycles; return its payload (sampled at the
    edge that took it), with ``ready`` low again."""
    while True:
        ready = rng is None or rng.random() < p
        ctx.set(stream.ready, ready)
        _, _, valid, payload = await ctx.tick().sample(stream.valid, stream.payload)
        if ready and valid:
            ctx.set(stream.ready, 0)
            return payload


async def wait_until(ctx: Any, signal: Any) -> None:
    """Return after the first clock edge at which ``signal`` is high (a one-shot trigger per
    cycle, so a background testbench may be stopped while it waits)."""
    while True:
        _, _, value = await ctx.tick().sample(signal)
        if value:
            return


async def stream_send(
    ctx: Any, stream: Any, beats: Iterable[Any], rng: random.Random | None = None, p: float = 1.0
) -> None:
    """:func:`stream_put` each of ``beats`` in order."""
    for beat in beats:
        await stream_put(ctx, stream, beat, rng, p)


async def stream_recv(
    ctx: Any, stream: Any, count: int, rng: random.Random | None = None, p: float = 1.0
) -> list[Any]:
    """:func:`stream_get` ``count`` beats; return their payloads in order."""
    return [await stream_get(ctx, stream, rng, p) for _ in range(count)]


class StreamRules:
    """Background checker of a stream's source rules: once ``valid`` is high it stays high, with
    the same payload, until the beat is taken. ``violations`` lists the cycles that broke them;
    ``taken`` counts transfers.

    Run :meth:`run` with ``add_process`` (it only samples; it never drives).
    """

    def __init__(self, stream: Any, name: str = "stream") -> None:
        self.stream = stream
        self.name = name
        self.violations: list[str] = []
        self.taken = 0

    async def run(self, ctx: Any) -> None:
        s = self.stream
        held = None  # payload of a beat offered and not taken
        cycle = 0
        async for _, _, valid, ready, payload in ctx.tick().sample(s.valid, s.ready, s.payload):
            cycle += 1
            if held is not None and (not valid or _raw(payload) != held):
                self.violations.append(f"{self.name}: beat withdrawn or changed at cycle {cycle}")
            if valid and ready:
                self.taken += 1
                held = None
            elif valid:
                held = _raw(payload)
            else:
                held = None


def _raw(payload: Any) -> int:
    """The bits of a sampled payload (an int, or a ``lib.data`` constant)."""
    return payload if isinstance(payload, int) else payload.as_value().value
