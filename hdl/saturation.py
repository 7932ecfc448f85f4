"""A saturating event counter: how many clamps a unit made (docs/ports.md ``saturations``).

Every cycle the counter adds the number of flags raised earlier (each flag = one clamp of a value
to its Q-format; registered, so ``count`` lags the flags by one cycle, by two with more than
:data:`GROUP` flags, whose popcount is registered per group of :data:`GROUP`, by three with more
than :data:`SUMS` such groups, whose counts are summed and registered :data:`SUMS` at a time:
:func:`counter_lag`) and sticks at ``2^32 − 1``. Source: docs/ports.md (the counters),
docs/numerics.md §1 (``sat`` reports each clamp); the flag register and the popcount tree are
*derived* (timing: the clamp tests of the datapath ended in the counter's adder, the ECP5's
critical path at small lanes; the group popcounts: at 32,10 on the ULX3S stage 1's 96 flags
→ the popcount tree → the counter was the critical path, 16.4 ns with 11.3 ns of routing,
docs/boards.md §4.2; the second level: at 46e8daf's HDL the 12 group counts of those 96 flags
→ their sum → the 33-bit add → the clamp was, at 82.5 MHz, 12.1 ns with 8.2 ns of routing).
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .arith import tree_sum

__all__ = ["SaturationCounter", "SAT_MAX", "GROUP", "SUMS", "counter_lag"]

#: The counter's ceiling (32 bits).
SAT_MAX = (1 << 32) - 1
#: Flags per registered group popcount (more flags than this: the counter adds the groups'
#: registered counts, one cycle later). *Derived*: 8 flags are a 3-level tree of 1–3 bit adds.
GROUP = 8
#: Group counts the counter adds in its own cycle; more are summed :data:`SUMS` at a time into
#: registers first. *Derived*: four 4-bit counts are two levels of small adds before the
#: counter's carry chain.
SUMS = 4


def counter_lag(flags: int) -> int:
    """Cycles from a flag to ``count``: 1, + 1 with more than :data:`GROUP` flags, + 1 more
    with more than :data:`SUMS` groups of them (:class:`SaturationCounter`)."""
    groups = -(-flags // GROUP)
    return 1 + (flags > GROUP) + (groups > SUMS)


class SaturationCounter(wiring.Component):
    """Counts raised flags, saturating at :data:`SAT_MAX`.

    Parameters
    ----------
    flags: number of flag inputs (≥ 1).

    Members
    -------
    flags: ``In(flags)`` one bit per clamp source this cycle.
    count: ``Out(32)`` flags counted up to :func:`counter_lag` cycles before (reset 0).

    Raises ValueError for fewer than one flag.
    """

    def __init__(self, flags: int) -> None:
        if flags < 1:
            raise ValueError(f"a saturation counter needs at least one flag, not {flags}")
        self.n = flags
        super().__init__({"flags": In(flags), "count": Out(32)})

    def elaborate(self, platform) -> Module:
        m = Module()
        # the flags registered first (the units' clamp tests end in them: no path from a
        # datapath rounding into the counter's adder), then a balanced popcount tree
        flags = Signal(self.n)
        m.d.sync += flags.eq(self.flags)
        terms = [flags[k] for k in range(self.n)]
        if self.n > GROUP:  # each group's popcount registered: the counter adds ⌈n/GROUP⌉ terms
            groups = []
            for g in range(0, self.n, GROUP):
                part = tree_sum(terms[g : g + GROUP])
                r = Signal(part.shape().width, name=f"pop{g // GROUP}")
                m.d.sync += r.eq(part)
                groups.append(r)
            terms = groups
        if self.n > GROUP and len(terms) > SUMS:  # the group counts, SUMS at a time, registered
            sums = []
            for g in range(0, len(terms), SUMS):
                part = tree_sum(terms[g : g + SUMS])
                r = Signal(part.shape().width, name=f"sum{g // SUMS}")
                m.d.sync += r.eq(part)
                sums.append(r)
            terms = sums
        cnt = Signal(32)
        nxt = Signal(33)  # cnt + total < 2^33: bit 32 is the overflow past SAT_MAX
        m.d.comb += nxt.eq(cnt + tree_sum(terms))
        m.d.sync += cnt.eq(Mux(nxt[32], SAT_MAX, nxt[:32]))
        m.d.comb += self.count.eq(cnt)
        return m
