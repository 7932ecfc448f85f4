"""Per-lane Galois LFSR with a one-cycle ``leap``-step draw (docs/numerics.md §6).

One **step** multiplies the state by x modulo the feedback polynomial; one **draw** is
``leap`` steps, i.e. multiplication by x^leap, a linear map over GF(2). The hardware applies it
in one cycle as a ``width × width`` XOR matrix whose column ``c`` is the image of state bit
``c`` after ``leap`` steps. Source: docs/numerics.md §6; the leap-as-matrix form is the
standard parallel LFSR (e.g. Xilinx XAPP052 / "leap-forward LFSR").
"""

from __future__ import annotations

from functools import reduce

from amaranth import Cat, Module, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..compiler.lfsr_map import leap_matrix, lfsr_step

__all__ = ["lfsr_step", "leap_matrix", "LFSR"]


class LFSR(wiring.Component):
    """A Galois LFSR that takes one draw (``leap`` steps) per cycle when ``draw`` is high.

    Parameters
    ----------
    poly: feedback polynomial including the x^width term (``plan.lfsr_poly``).
    width: state bits (``plan.lfsr_width``).
    leap: steps per draw (``plan.lfsr_leap``).
    seed: initial (reset) state, non-zero.

    Members
    -------
    draw: ``In(1)`` take one draw this cycle.
    next: ``Out(width)`` the state after a draw (the value a draw this cycle yields, numerics
        §6: "taken before use"), from a register: it holds the draw of ``state`` and, on a
        draw, takes the draw of itself — the same value every cycle as the XOR matrix of
        ``state``, one matrix fewer before its users (timing only, *derived*: the -deep
        16,8,8,4 critical path at 85.2 MHz was a lane's state → the matrix → the rounding
        adder of U, 11.7 ns; docs/boards.md §4.2).
    state: ``Out(width)`` the current state.
    """

    def __init__(self, poly: int, width: int, leap: int, seed: int) -> None:
        if not 0 < seed < (1 << width):
            self._MustUse__silence = True  # not built: no "created but never used" warning
            raise ValueError(f"LFSR seed must be a non-zero {width}-bit value, got {seed:#x}")
        self.poly, self.width, self.leap, self.seed = poly, width, leap, seed
        super().__init__({"draw": In(1), "next": Out(width), "state": Out(width)})

    def elaborate(self, platform) -> Module:
        m = Module()
        rows = leap_matrix(self.poly, self.width, self.leap)

        def leap(v) -> Value:
            return Cat(
                *(
                    reduce(lambda a, b: a ^ b, [v[c] for c in range(self.width) if (row >> c) & 1])
                    for row in rows
                )
            )

        drawn = 0  # the draw of the seed, for next's reset value
        for r, row in enumerate(rows):
            drawn |= (bin(row & self.seed).count("1") & 1) << r
        st = Signal(self.width, init=self.seed)
        nx = Signal(self.width, init=drawn)
        m.d.comb += [self.next.eq(nx), self.state.eq(st)]
        with m.If(self.draw):
            m.d.sync += [st.eq(nx), nx.eq(leap(nx))]
        return m
