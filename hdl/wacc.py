"""The weight-access unit of the network top: ``wacc_cmd`` → one stage's memory → ``wacc_rsp``.

A command names a stage, a kind (0 = ``w``, 1 = ``u``, 2 = ``w_prev``), a row ``j`` and a column
(``N`` = the bias). Row ``j`` lives in lane ``j mod L`` at address ``(j div L)·(N+1) + col``; the
division by the constant ``L`` is a multiply-and-shift (exact for 16-bit rows, Granlund–Montgomery);
on the ECP5 a repeated subtraction instead, one ``L`` a cycle (DIV, at most ``row_groups`` cycles;
:meth:`WeightAccess._stepped_calc`), and the answer is taken
:func:`~pipetrain.hdl.weights.access_latency` cycles after the access. A write stores the data
saturated to the memory's format (uncounted) and answers with the stored value; a command for a
stage, kind, row or column that does not exist answers 0 and changes nothing. Commands are taken
only while ``allowed`` (the top: pipeline idle, no sample pending), so the memories' ports are free.
Per command: CALC (lane, address) → ACC (the access) → READ (its data into a register) → RESP
(answer until taken); back-to-back commands skip IDLE. A stage with k column lanes
(``Stage.col_lanes``) keeps weight ``(j, i)`` in lane ``(i mod k)·L + j mod L`` at address
``(j div L)·C + i div k``, ``C = ⌈(N+1)/k⌉`` (the column divided the same way as the row).

Source: docs/ports.md (``wacc`` contract); the state machine and the constant division are
*derived*.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from amaranth import Module, Mux, Signal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .arith import const_mul
from .dsp import is_ecp5
from .streams import WeightAccessSignature, wacc_cmd_layout, wacc_rsp_layout
from .weights import access_latency

__all__ = ["AccessGeometry", "WeightAccess", "div_const"]


def div_const(v: Value, d: int, shift_add: Callable[[int], bool]) -> Value:
    """``v // d`` for an unsigned ``v`` of at most 16 bits and a constant ``d`` ≥ 1: a shift for
    powers of two, else ``(v·⌈2^K/d⌉) >> K`` with ``K = 16 + bitlen(d)`` (exact for every
    16-bit ``v``: the reciprocal's error times ``v`` stays below ``2^K``; Granlund–Montgomery).
    ``shift_add``: the plan's constant-multiplier rule (:func:`~pipetrain.hdl.arith.const_mul`)."""
    if d & (d - 1) == 0:
        return v >> (d.bit_length() - 1)
    k = 16 + d.bit_length()
    return const_mul(-(-(1 << k) // d), v, shift_add) >> k


@dataclass(frozen=True)
class AccessGeometry:
    """What the weight access needs of one stage: ``lanes`` L, ``in_features`` N,
    ``out_features`` M, ``words`` per lane bank (row_groups·C), ``kinds`` (memories per row:
    2 = ``w``, ``u``; 3 = also ``w_prev``, the LWP ``w`` form) and ``columns`` k (column
    lanes: L·k banks, ``C = ⌈(N+1)/k⌉`` words a row group)."""

    lanes: int
    in_features: int
    out_features: int
    words: int
    kinds: int = 2
    columns: int = 1

    @property
    def banks(self) -> int:
        """The physical lanes, L·k."""
        return self.lanes * self.columns

    @property
    def group_words(self) -> int:
        """C, the words of one row group in a bank."""
        return -(-(self.in_features + 1) // self.columns)


class WeightAccess(wiring.Component):
    """Serves weight-access commands on the stages' memories.

    Parameters
    ----------
    stages: one :class:`AccessGeometry` per stage.
    shift_add: the plan's constant-multiplier rule (``Plan.shift_add``) for the address
        arithmetic (row → lane and row group).

    Members
    -------
    cmd: ``In(stream.Signature(wacc_cmd_layout()))`` commands (docs/ports.md).
    rsp: ``Out(stream.Signature(wacc_rsp_layout()))`` one answer per command.
    allowed: ``In(1)`` a command may be taken now (no pass can run until it is answered).
    busy: ``Out(1)`` a command is being served (the top holds ticks back).
    stage1 … stageS: ``Out(WeightAccessSignature(L·k, words))`` per stage.
    """

    def __init__(self, stages: Sequence[AccessGeometry], shift_add: Callable[[int], bool]) -> None:
        self.geo, self.shift_add = tuple(stages), shift_add
        members = {
            "cmd": In(stream.Signature(wacc_cmd_layout())),
            "rsp": Out(stream.Signature(wacc_rsp_layout())),
            "allowed": In(1),
            "busy": Out(1),
        }
        for n, g in enumerate(self.geo):
            members[f"stage{n + 1}"] = Out(WeightAccessSignature(g.banks, g.words))
        super().__init__(members)

    def stage(self, n: int) -> wiring.PureInterface:
        """The access port of 0-based stage ``n``."""
        return getattr(self, f"stage{n + 1}")

    def elaborate(self, platform) -> Module:
        m = Module()
        geo = self.geo
        wc, wr = self.cmd, self.rsp
        cmd = Signal(wacc_cmd_layout())
        addr = Signal(range(max(max(g.words for g in geo), 2)))
        lane = Signal(range(max(max(g.banks for g in geo), 2)))
        okr = Signal()
        rsp = Signal.like(wr.payload.data)  # the answer, registered in READ
        latency = max(access_latency(g.banks, platform) for g in geo)
        for n in range(len(geo)):
            port = self.stage(n)
            m.d.comb += [
                port.write.eq(cmd.write),
                port.kind.eq(cmd.kind),
                port.lane.eq(lane),
                port.addr.eq(addr),
                port.data.eq(cmd.data),
            ]
        accept = wc.valid & self.allowed

        def take_cmd() -> None:
            m.d.comb += wc.ready.eq(1)
            m.d.sync += cmd.eq(wc.payload)
            m.next = "CALC"

        stepped = is_ecp5(platform)
        if stepped:  # the row's group by repeated subtraction (see the module docstring)
            rem = Signal.like(cmd.row, name="div_rem")
            base = Signal(range(max(max(g.words for g in geo), 2) + 1), name="div_base")
            crem = Signal.like(cmd.col, name="div_col_rem")  # the column's (column lanes)
            cq = Signal.like(cmd.col, name="div_col_quo")
        with m.FSM():
            with m.State("IDLE"):
                with m.If(accept):
                    take_cmd()
            if stepped:
                self._stepped_calc(m, cmd, okr, lane, addr, rem, base, crem, cq)
            else:
                with m.State("CALC"):
                    # row j → lane j mod L, group j div L (constant division), address g·(N+1)+col
                    m.d.comb += self.busy.eq(1)
                    m.d.sync += okr.eq(0)
                    with m.Switch(cmd.stage):
                        for n, g in enumerate(geo):
                            with m.Case(n):
                                grp = div_const(cmd.row, g.lanes, self.shift_add)
                                rl = cmd.row - const_mul(g.lanes, grp, self.shift_add)
                                cl, col = Value.cast(0), cmd.col
                                if g.columns > 1:  # the column's lane s and slot i div k
                                    col = div_const(cmd.col, g.columns, self.shift_add)
                                    cl = cmd.col - const_mul(g.columns, col, self.shift_add)
                                    cl = const_mul(g.lanes, cl, self.shift_add)
                                m.d.sync += [
                                    okr.eq(
                                        (cmd.kind <= g.kinds - 1)
                                        & (cmd.row < g.out_features)
                                        & (cmd.col <= g.in_features)
                                    ),
                                    # constant products: shifts and adders where cheap
                                    lane.eq(cl + rl),
                                    addr.eq(const_mul(g.group_words, grp, self.shift_add) + col),
                                ]
                    m.next = "ACC"
            with m.State("ACC"):
                m.d.comb += self.busy.eq(1)
                with m.Switch(cmd.stage):
                    for n in range(len(geo)):
                        with m.Case(n):
                            m.d.comb += self.stage(n).en.eq(okr)
                m.next = "WAIT"
            # the store registers its answer: rdata access_latency cycles after en (3; on the
            # ECP5 more with many lanes, hdl/weights.py), the slowest stage's for every stage
            waits = ["WAIT", "WAIT2"] + [f"WAIT{k}" for k in range(3, latency)]
            for k, state in enumerate(waits):
                with m.State(state):
                    m.d.comb += self.busy.eq(1)
                    m.next = waits[k + 1] if k + 1 < len(waits) else "READ"
            with m.State("READ"):
                # the stage's read data into a register (a block RAM's output through the
                # lanes' multiplexer: the link takes it byte by byte; docs/boards.md §4.1)
                m.d.comb += self.busy.eq(1)
                m.d.sync += rsp.eq(0)  # a stage that does not exist answers 0
                with m.Switch(cmd.stage):
                    for n in range(len(geo)):
                        with m.Case(n):
                            m.d.sync += rsp.eq(Mux(okr, self.stage(n).rdata, 0))
                m.next = "RESP"
            with m.State("RESP"):
                m.d.comb += [self.busy.eq(1), wr.valid.eq(1), wr.payload.data.eq(rsp)]
                with m.If(wr.ready):
                    with m.If(accept):
                        take_cmd()
                    with m.Else():
                        m.next = "IDLE"
        return m

    def _stepped_calc(self, m: Module, cmd, okr, lane, addr, rem, base, crem, cq) -> None:
        """The ECP5 form of CALC: ``okr`` as in the other form, then the row's group by
        repeated subtraction, one ``L`` (and one ``C`` = ``N + 1`` added to the base address)
        a cycle in DIV, until the remainder is the lane (≤ row_groups cycles; a command that
        does not exist skips it); with k column lanes the column's slot the same way in the
        same cycles, one ``k`` a cycle (≤ C cycles). No multiplier, no constant division:
        the mlp-digits 32,10 critical path at 67.9 MHz was the command's row → stage 2's
        division by 10 (a MULT18X18D without registers) → the lane's subtraction, 14.7 ns
        (docs/boards.md §4.2); the link takes longer per command than the steps (timing
        only, *derived*)."""
        geo = self.geo
        with m.State("CALC"):
            m.d.comb += self.busy.eq(1)
            m.d.sync += [okr.eq(0), rem.eq(cmd.row), base.eq(0), crem.eq(cmd.col), cq.eq(0)]
            with m.Switch(cmd.stage):
                for n, g in enumerate(geo):
                    with m.Case(n):
                        m.d.sync += okr.eq(
                            (cmd.kind <= g.kinds - 1)
                            & (cmd.row < g.out_features)
                            & (cmd.col <= g.in_features)
                        )
            m.next = "DIV"
        with m.State("DIV"):
            m.d.comb += self.busy.eq(1)
            with m.If(~okr):
                m.next = "ACC"
            with m.Switch(cmd.stage):
                for n, g in enumerate(geo):
                    with m.Case(n):
                        if g.columns == 1:
                            with m.If(rem >= g.lanes):
                                m.d.sync += [rem.eq(rem - g.lanes), base.eq(base + g.group_words)]
                            with m.Else():
                                m.d.sync += [lane.eq(rem), addr.eq(base + cmd.col)]
                                m.next = "ACC"
                            continue
                        row_left, col_left = rem >= g.lanes, crem >= g.columns
                        with m.If(row_left):
                            m.d.sync += [rem.eq(rem - g.lanes), base.eq(base + g.group_words)]
                        with m.If(col_left):
                            m.d.sync += [crem.eq(crem - g.columns), cq.eq(cq + 1)]
                        with m.If(~row_left & ~col_left):
                            m.d.sync += addr.eq(base + cq)
                            with m.Switch(crem):  # lane (i mod k)·L + j mod L: no multiplier
                                for c in range(g.columns):
                                    with m.Case(c):
                                        m.d.sync += lane.eq(rem + c * g.lanes)
                            m.next = "ACC"
