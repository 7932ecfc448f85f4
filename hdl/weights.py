"""The weight store of a stage: per-lane banks of ``w`` and ``u`` (and ``w_prev``) and their two
clients.

Lane ``l`` owns rows ``j ≡ l (mod L)``; its banks ``w{l}`` and ``u{l}`` hold word ``g·(N+1)+i``
= row ``g·L + l``, column ``i`` (column N: the bias), ``words = row_groups·(N+1)`` words each.
With the LWP ``w`` form a third bank ``w_prev{l}`` per lane holds each weight before its last
update (numerics §3 step 1, §5), read with ``w`` and written with ``(w′, u′)``; it is always
dual-port (the plan refuses single-port memories with it).
A bank is an ``amaranth.lib.memory`` read/write port pair, or a single-port RAM (iCE40 SPRAM,
``hdl/spram.py``) for stages with ``slot_cycles`` = 2, whose sequencer leaves every other cycle
free for the write-back.

Two clients share the banks: the fused pass (reads at S0 while slots issue, writes ``(w′, u′)``
back at the write stage) and the host's weight access (docs/ports.md ``wacc``), which the top
only serves while no pass runs. A weight-access write stores the data saturated to the bank's
format and answers with the stored value (uncounted: not a training clamp); on the ECP5 the
write lands two cycles after ``en``, from registers beside each lane (before the answer, so a
following read or pass sees it).

Source: docs/architecture.md §3 (lane ownership, memory per lane), docs/ports.md (weight
access); the sharing of the ports is *derived*.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from amaranth import Module, Mux, Shape, ShapeLike, Signal, Value, signed
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..compiler.plan import QFormat
from .arith import sat
from .dsp import is_ecp5
from .spram import SinglePortRAM
from .streams import (
    RamReadSignature,
    SlotPipelineSignature,
    ValidSignature,
    WeightAccessSignature,
    WeightReadSignature,
    write_back_layout,
)

__all__ = ["WeightBank", "WeightStore", "access_latency", "poison_collisions", "tree_levels"]

_poison = [False]  # poison_collisions() is active


@contextmanager
def poison_collisions() -> Iterator[None]:
    """While active, the dual-port banks elaborated read the bitwise complement of the old
    word when the address read is written in the same cycle (a block RAM's ports leave that
    read undefined, and the banks tell Yosys so: ``no_rw_check``). A design elaborated inside
    it stays bit-exact with the golden model only if no read whose data is used ever meets a
    write to its address — what the RTL-vs-golden tests check with it (verification aid,
    simulation only)."""
    _poison[0], before = True, _poison[0]
    try:
        yield
    finally:
        _poison[0] = before


class WeightBank:
    """One lane's bank of weights (or velocities): a read port and a write port, built into the
    weight store's module (no hierarchy level of its own: a wrapper module per bank made the
    Verilog generation of mlp-digits measurably slower; *derived*).

    Parameters
    ----------
    m: the module the memory is added to, as submodule ``name``.
    name: the bank's name (``w0``, ``u0``, …: ``MemorySpec.bank_names``).
    shape: word shape (``signed(w.bits)`` or ``signed(u.bits)``).
    words: depth (words).
    spram: one SPRAM's (words, bits) for a single-port bank — one shared address
        (:class:`~pipetrain.hdl.spram.SinglePortRAM`): a read in a write cycle returns the word
        at the write address, so the user must not read and write in one cycle; ``None``: an
        ``amaranth.lib.memory`` with separate read and write ports.

    Members
    -------
    read: the read port, :class:`~pipetrain.hdl.streams.RamReadSignature`: ``addr`` (in) and
        ``data`` (out, the word at the previous cycle's address; undefined on the FPGA when that
        address was written in that cycle — the user must not use such a read).
    write: the write port, ``en``, ``addr``, ``data`` (in) — a ``lib.memory.WritePort`` or
        :class:`~pipetrain.hdl.streams.RamWriteSignature`.
    """

    def __init__(
        self,
        m: Module,
        name: str,
        shape: ShapeLike,
        words: int,
        *,
        spram: tuple[int, int] | None,
    ) -> None:
        self.shape, self.words, self.single_port = Shape.cast(shape), words, spram is not None
        if spram is not None:
            m.submodules[name] = ram = SinglePortRAM(self.shape, words, spram)
            self.read, self.write = ram.read, ram.write
            return
        # an asynchronous read port and a register: the same cycle-for-cycle values as a
        # synchronous port (the word at the previous cycle's address, the old word when that
        # address was written in that cycle), which Yosys merges into the block RAM's own
        # address register; ``no_rw_check`` tells it no read whose data is used meets a write
        # to its address in the same cycle (:func:`poison_collisions` checks that in
        # simulation), so it builds no collision logic. Without the attribute it built, per
        # bank, a flip-flop per bit and a comparison of the two addresses: the mlp-digits 32,10
        # critical path at 81.5 MHz was a stage's ``busy`` → the read-address multiplexer →
        # that comparison's register, 12.3 ns (timing and logic cells, *derived*;
        # docs/boards.md §4.2)
        attrs = {"no_rw_check": 1}
        m.submodules[name] = mem = Memory(shape=self.shape, depth=words, init=[], attrs=attrs)
        rp, self.write = mem.read_port(domain="comb"), mem.write_port()
        self.read = RamReadSignature(self.shape, words).create(path=(name, "read"))
        word = rp.data
        if _poison[0]:  # a used read that meets a write to its address reads garbage
            hit = self.write.en & (self.write.addr == rp.addr)
            word = Mux(hit, ~rp.data, rp.data)
        m.d.comb += rp.addr.eq(self.read.addr)
        m.d.sync += self.read.data.eq(word)


class WeightStore(wiring.Component):
    """The ``w`` and ``u`` (and ``w_prev``) banks of all lanes, shared by the pass and the
    weight access.

    Parameters
    ----------
    pipeline: the pass's slot pipeline (words).
    lanes: L.
    w_format, u_format: Q-formats of ``w`` and ``u``.
    spram: one SPRAM's (words, bits) when the banks are single-port SPRAM (the plan's ``w``
        memory of kind ``spram``: ``Stage.slot_cycles`` = 2), else ``None`` (dual-port).
    w_prev: build the ``w_prev`` banks (LWP ``w`` form: the plan's ``w_prev`` memory).

    Members
    -------
    slots: ``In(pipeline.subset(busy, read_addr, write_addr))``.
    read: ``Out(WeightReadSignature(L, w.bits, u.bits, w_prev))`` the slot's words at S1.
    write_back: ``In(ValidSignature(write_back_layout(L, w.bits, u.bits, w_prev)))``
        ``(w′, u′[, w_prev′])`` of the slot at the write stage (cannot stall).
    access: ``In(WeightAccessSignature(L, words))`` weight access while no pass runs (kind 0
        ``w``, 1 ``u``, 2 ``w_prev``); ``rdata`` :func:`access_latency` cycles after ``en`` (3:
        the bank's read and two registered levels; on the ECP5 one per-lane register level
        and the 4-way levels of :func:`tree_levels` before the last): the word read, or the
        saturated word written; it holds while the request is unchanged.

    Raises ValueError for ``w_prev`` with single-port banks.
    """

    def __init__(
        self,
        pipeline: SlotPipelineSignature,
        *,
        lanes: int,
        w_format: QFormat,
        u_format: QFormat,
        spram: tuple[int, int] | None,
        w_prev: bool = False,
    ) -> None:
        if w_prev and spram is not None:
            raise ValueError("w_prev banks need dual-port memories (spram must be None)")
        self.pipeline, self.L, self.fw, self.fu = pipeline, lanes, w_format, u_format
        self.spram, self.single_port, self.w_prev = spram, spram is not None, w_prev
        fb, ub = w_format.bits, u_format.bits
        super().__init__(
            {
                "slots": In(pipeline.subset(flags=("busy", "read_addr", "write_addr"))),
                "read": Out(WeightReadSignature(lanes, fb, ub, w_prev)),
                "write_back": In(ValidSignature(write_back_layout(lanes, fb, ub, w_prev))),
                "access": In(WeightAccessSignature(lanes, pipeline.words)),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        L, T, fw, fu = self.L, self.pipeline.words, self.fw, self.fu
        sp, acc, wb = self.slots, self.access, self.write_back
        acc_w = acc.en & acc.write
        w_in, _ = sat(acc.data, fw)
        u_in, _ = sat(acc.data, fu)
        read_addr = Signal(range(T))
        m.d.comb += read_addr.eq(Mux(sp.busy, sp.read_addr, acc.addr))
        ecp5 = is_ecp5(platform)
        if ecp5:  # the access write, registered per stage and then per lane (_access_writes)
            a_w, a_kind, a_lane, a_addr, a_win, a_uin = (
                _registered(m, v, f"aw_{n}")
                for v, n in (
                    (acc_w, "en"),
                    (acc.kind, "kind"),
                    (acc.lane, "lane"),
                    (acc.addr, "addr"),
                    (w_in, "w"),
                    (u_in, "u"),
                )
            )
        for lane in range(L):
            live = wb.valid & wb.payload.lanes[lane]
            sel = acc.lane == lane
            if ecp5:
                l_addr = _registered(m, a_addr, f"aw_addr_l{lane}")
                l_win = _registered(m, a_win, f"aw_w_l{lane}")
                l_uin = _registered(m, a_uin, f"aw_u_l{lane}")
            kinds = [("w", fw, wb.payload.w[lane], w_in), ("u", fu, wb.payload.u[lane], u_in)]
            if self.w_prev:
                kinds.append(("w_prev", fw, wb.payload.w_prev[lane], w_in))
            banks = []
            for kind, (prefix, fmt, new, acc_in) in enumerate(kinds):
                bank = WeightBank(m, f"{prefix}{lane}", signed(fmt.bits), T, spram=self.spram)
                if ecp5:  # the write two cycles after en, from registers beside the lane
                    # (timing only, *derived*: the -deep 16,8,8,4 critical path at 80.0 MHz was
                    # the access data → its saturation → 7.9 ns of routing to every stage's
                    # banks → a bank's write data, 12.5 ns; docs/boards.md §4.2)
                    l_en = _registered(
                        m, a_w & (a_lane == lane) & (a_kind == kind), f"aw_en_l{lane}_k{kind}"
                    )
                    en, addr, data = l_en, l_addr, (l_uin if kind == 1 else l_win)
                else:
                    en, addr, data = acc_w & sel & (acc.kind == kind), acc.addr, acc_in
                m.d.comb += [
                    bank.read.addr.eq(read_addr),
                    bank.write.en.eq(live | en),
                    bank.write.addr.eq(Mux(live, sp.write_addr, addr)),
                    bank.write.data.eq(Mux(live, new, data)),
                ]
                banks.append(bank)
            m.d.comb += [
                self.read.w[lane].eq(banks[0].read.data),
                self.read.u[lane].eq(banks[1].read.data),
            ]
            if self.w_prev:
                m.d.comb += self.read.w_prev[lane].eq(banks[2].read.data)

        # weight-access answer: the request registered the cycle after en
        r_we = Signal()
        r_kind = Signal(2)
        r_lane = Signal.like(acc.lane)
        r_wv = Signal(signed(max(fw.bits, fu.bits)))  # the saturated write data
        m.d.sync += [
            r_we.eq(acc.write),
            r_kind.eq(acc.kind),
            r_lane.eq(acc.lane),
            r_wv.eq(Mux(acc.kind == 1, u_in, w_in)),
        ]
        kinds = 3 if self.w_prev else 2
        reads = [self.read.w, self.read.u] + ([self.read.w_prev] if self.w_prev else [])
        fmts = [fw, fu, fw]
        if is_ecp5(platform):
            rq = self._answer_tree(m, reads, fmts, kinds, r_we, r_kind, r_lane, r_wv)
            m.d.comb += acc.rdata.eq(rq)
            return m
        # two registered levels: each group of ≤ 4 lanes' banks through its multiplexer into a
        # register (one LUT/PFUMX level after a block RAM's output, 5.6 ns on the ECP5), then
        # the group, the kind and the write data into the answer (timing, *derived*: the
        # lanes 2,4 critical path at 84.4 MHz was a DP16KD → the 4-lane and kind multiplexers
        # → this register, 11.85 ns)
        groups = [list(range(q, min(q + 4, L))) for q in range(0, L, 4)]
        held = []  # held[q][kind]: group q's lane of that kind, registered
        for q, members in enumerate(groups):
            row = []
            for kind in range(kinds):
                r = Signal(signed(fmts[kind].bits), name=f"acc_g{q}_k{kind}")
                with m.Switch(r_lane):
                    for lane in members:
                        with m.Case(lane):
                            m.d.sync += r.eq(reads[kind][lane])
                row.append(r)
            held.append(row)
        r2_we, r2_kind, r2_wv = Signal(), Signal(2), Signal.like(r_wv)
        r2_group = Signal(range(max(len(groups), 2)))
        m.d.sync += [r2_we.eq(r_we), r2_kind.eq(r_kind), r2_wv.eq(r_wv), r2_group.eq(r_lane >> 2)]
        gsel = [Signal(signed(fmts[k].bits), name=f"acc_sel_k{k}") for k in range(kinds)]
        with m.Switch(r2_group):
            for q, row in enumerate(held):
                with m.Case(q):
                    m.d.comb += [g.eq(r) for g, r in zip(gsel, row, strict=True)]
        prev = gsel[2] if kinds == 3 else 0  # kind 2 without w_prev banks answers 0
        rsel = Mux(r2_kind == 0, gsel[0], Mux(r2_kind == 1, gsel[1], prev))
        rq = Signal(signed(max(fw.bits, fu.bits)))
        m.d.sync += rq.eq(Mux(r2_we, r2_wv, rsel))
        m.d.comb += acc.rdata.eq(rq)
        return m

    def _answer_tree(
        self,
        m: Module,
        reads: list,
        fmts: list[QFormat],
        kinds: int,
        r_we: Signal,
        r_kind: Signal,
        r_lane: Signal,
        r_wv: Signal,
    ) -> Signal:
        """The ECP5 form of the answer (:func:`access_latency`): every lane's word straight from
        its block RAM into a register (a DP16KD without its output register has 5.6 ns
        clock-to-output: the -deep 16,8,8,4 critical path at 84.0 MHz was a DP16KD → two LUT
        levels of the 4-lane multiplexer → its register, 11.9 ns), then registered 4-way
        multiplexer levels until ≤ 4 words are left (one 16-way level after the per-lane
        registers, which sit beside their block RAMs across the die, made 13.1 ns, 76.4 MHz),
        then those, the kind and the write data into the answer; the request fields follow
        through as many registers (timing only, *derived*; docs/boards.md §4.2)."""
        L = self.L
        nodes = []  # nodes[i][kind]: a register holding node i's word of that kind
        for lane in range(L):
            row = []
            for kind in range(kinds):
                r = Signal(signed(fmts[kind].bits), name=f"acc_l{lane}_k{kind}")
                m.d.sync += r.eq(reads[kind][lane])
                row.append(r)
            nodes.append(row)
        # the request's fields, registered alongside the words (they match the nodes)
        we, kind_, lane_, wv = (
            _registered(m, v, f"acc_{n}0")
            for v, n in ((r_we, "we"), (r_kind, "kind"), (r_lane, "lane"), (r_wv, "wv"))
        )
        shift = 0  # nodes[i] holds the lanes with lane >> shift == i
        level = 0
        while len(nodes) > 4:
            level += 1
            nxt = []
            for g in range(0, len(nodes), 4):
                row = []
                for kind in range(kinds):
                    r = Signal(signed(fmts[kind].bits), name=f"acc_t{level}_{g // 4}_k{kind}")
                    with m.Switch((lane_ >> shift) & 3):
                        for i, node in enumerate(nodes[g : g + 4]):
                            with m.Case(i):
                                m.d.sync += r.eq(node[kind])
                    row.append(r)
                nxt.append(row)
            nodes, shift = nxt, shift + 2
            we, kind_, lane_, wv = (
                _registered(m, v, f"acc_{n}{level}")
                for v, n in ((we, "we"), (kind_, "kind"), (lane_, "lane"), (wv, "wv"))
            )
        # the last level: ≤ 4 nodes, the kind and the write data into the answer
        gsel = [Signal(signed(fmts[k].bits), name=f"acc_sel_k{k}") for k in range(kinds)]
        with m.Switch(lane_ >> shift):
            for i, row in enumerate(nodes):
                with m.Case(i):
                    m.d.comb += [g.eq(r) for g, r in zip(gsel, row, strict=True)]
        prev = gsel[2] if kinds == 3 else 0  # kind 2 without w_prev banks answers 0
        rsel = Mux(kind_ == 0, gsel[0], Mux(kind_ == 1, gsel[1], prev))
        rq = Signal(signed(max(self.fw.bits, self.fu.bits)))
        m.d.sync += rq.eq(Mux(we, wv, rsel))
        return rq


def tree_levels(lanes: int) -> int:
    """The ECP5 answer's 4-way multiplexer levels between the per-lane registers and the last
    level (:meth:`WeightStore._answer_tree`): 4-way reductions until ≤ 4 words are left."""
    n, levels = lanes, 0
    while n > 4:
        n, levels = -(-n // 4), levels + 1
    return levels


def access_latency(lanes: int, platform: Any) -> int:
    """Cycles from a weight access's ``en`` to its ``rdata`` (:class:`WeightStore`): 3 (the
    bank's read, two registered levels), on the ECP5 3 + :func:`tree_levels` (``lanes``).
    Source: *derived* (timing)."""
    return 3 + (tree_levels(lanes) if is_ecp5(platform) else 0)


def _registered(m: Module, value: Value, name: str) -> Signal:
    r = Signal.like(value, name=name)
    m.d.sync += r.eq(value)
    return r
