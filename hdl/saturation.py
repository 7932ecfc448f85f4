"""A saturating event counter: how many clamps a unit made (docs/ports.md ``saturations``).

Every cycle the counter adds the number of raised flags (each flag = one clamp of a value to its
Q-format) and sticks at ``2^32 − 1``. Source: docs/ports.md (the counters), docs/numerics.md §1
(``sat`` reports each clamp); the popcount as an adder chain is *derived* (flags are few).
"""

from __future__ import annotations

from amaranth import Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["SaturationCounter", "SAT_MAX"]

#: The counter's ceiling (32 bits).
SAT_MAX = (1 << 32) - 1


class SaturationCounter(wiring.Component):
    """Counts raised flags, saturating at :data:`SAT_MAX`.

    Parameters
    ----------
    flags: number of flag inputs (≥ 1).

    Members
    -------
    flags: ``In(flags)`` one bit per clamp source this cycle.
    count: ``Out(32)`` flags counted so far (reset 0).

    Raises ValueError for fewer than one flag.
    """

    def __init__(self, flags: int) -> None:
        if flags < 1:
            raise ValueError(f"a saturation counter needs at least one flag, not {flags}")
        self.n = flags
        super().__init__({"flags": In(flags), "count": Out(32)})

    def elaborate(self, platform) -> Module:
        m = Module()
        total = Const(0, 1)
        for k in range(self.n):
            total = total + self.flags[k]
        cnt = Signal(32)
        nxt = cnt + total
        m.d.sync += cnt.eq(Mux(nxt > SAT_MAX, SAT_MAX, nxt))
        m.d.comb += self.count.eq(cnt)
        return m
