"""``OnChipSet``: the on-chip training set of the link engine — STORE's memories and RUN's
runner (docs/protocol.md §2, the order: docs/numerics.md §10).

STORE writes records into two memories: ``data`` (``C·N`` words of X bits, sample ``i``'s
feature ``f`` at word ``i·N + f``, in banks of :func:`bank_words` words) and ``labels`` (``C``
words). RUN then trains E epochs on slots ``0..count−1`` without the host: a permutation
generator (the k-bit Galois LFSR of :mod:`pipetrain.protocol.onchip`, one candidate per cycle,
prefetching the next slot while the current sample's features stream out), a feeder (one
feature per cycle from ``data`` onto ``sample_in``, the label on every beat), and a summary
unit that takes every result, compares its prediction with the sample's label (a FIFO of the
labels in flight) and adds its ``loss``; at each epoch's last result it emits the epoch's
12-byte summary. After the last sample it raises ``flush`` until the network is idle and every
result is in, then emits the cycles the run took. Source: docs/protocol.md §2 (*derived*: the
order and the buffering).

Timing (*derived*, measured on the ULX3S: docs/boards.md §4.1): a block RAM's output is slow
(ECP5 DP16KD: 5.8 ns clock to data out), so no logic but a 4-way multiplexer follows one before
a register. STORE writes through a register stage (address, data, enable); RUN reads the
banks every cycle, registers a 4-way choice of bank outputs, then the final choice, and the
beats wait in a :data:`FEED_DEPTH`-entry FIFO whose output register drives ``sample_in``: a
read is issued only while fewer than :data:`FEED_DEPTH` beats are issued and not yet taken, so
the feed keeps one beat per cycle under any backpressure and never overflows.
"""

from __future__ import annotations

from typing import Any

from amaranth import Array, Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..compiler.plan import Plan
from ..protocol.onchip import PERM_TAPS, perm_bits
from ..protocol.wire import MAX_RUN_EPOCHS, RUN_ARG_BYTES, SUMMARY_BYTES, LinkParams, NakReason
from .link_ports import command_signature
from .streams import result_layout, sample_layout

__all__ = ["FEED_DEPTH", "FEED_LATENCY", "OnChipSet", "bank_words", "onchip_memory_bits"]

#: Beats the feeder buffers between the banks and ``sample_in`` (≥ FEED_LATENCY + 2 keeps one
#: beat per cycle: a beat is issued, read, chosen twice and written into the FIFO, whose output
#: register shows it a cycle later).
FEED_DEPTH = 8
#: Cycles from a read's issue to its beat entering the FIFO: the bank read, the 4-way choice,
#: the final choice.
FEED_LATENCY = 3


def onchip_memory_bits(plan: Plan, samples: int) -> int:
    """Bits of the on-chip set's two memories for ``samples`` slots: ``samples·N·X`` (features)
    + ``samples·⌈log2 classes⌉`` (labels, at least 1 bit)."""
    return samples * (plan.in_features * plan.stages[0].formats.x.bits + _label_bits(plan))


def bank_words(x_bits: int) -> int:
    """Words of one ``data`` bank for X-bit features: the deepest ECP5 DP16KD aspect ratio at
    least X bits wide (16384 × 1, 8192 × 2, 4096 × 4, 2048 × 9, 1024 × 18; 512 × 36 in its
    pseudo-dual-port form), so a bank is one 18-Kib block and the read multiplexer has one input
    per block. Source: Lattice ECP5 sysMEM usage guide (the DP16KD/PDPW16KD configurations;
    *derived*: the bank size)."""
    for width, words in ((1, 16384), (2, 8192), (4, 4096), (9, 2048), (18, 1024)):
        if x_bits <= width:
            return words
    return 512


def _label_bits(plan: Plan) -> int:
    return max(1, (plan.loss.classes - 1).bit_length())


def _const_mul(v: Any, c: int, width: int) -> Any:
    """``v · c`` for a constant ``c`` as a sum of shifted copies (no multiplier block)."""
    terms = [(v << b) for b in range(c.bit_length()) if c >> b & 1]
    acc = terms[0]
    for t in terms[1:]:
        acc = acc + t
    return acc[:width]


class OnChipSet(wiring.Component):
    """The on-chip training set: STORE beats into memory, RUN's permutation, feeder and epoch
    summaries.

    Parameters
    ----------
    plan: the design plan (N, X, the classes).
    params: link sizes; ``params.onchip_samples`` = C ≥ 1 slots, ``params.result_depth`` the
        label FIFO's depth (samples in flight during a run).

    Members
    -------
    store: ``In(stream.Signature(sample_layout(plan)))`` STORE's beats (from the SAMPLES
        parser): beat ``f`` of a record is written at ``slot·N + f``, the ``last`` beat writes
        the label and moves to the next slot; always ready.
    store_start: ``In(1)`` strobe: the next STORE record goes to slot ``store_index``.
    store_index: ``In(16)`` the first slot of a STORE (checked by the dispatcher: < C).
    cmd, args, nak, emit: :func:`~pipetrain.hdl.link_ports.command_signature` for RUN: ``args``
        its 7 bytes (count u16, epochs u8 with bit 7 = records, start u16, mask u16), ``nak``
        BAD_ARG for a count outside 1..C, epochs outside 1..32, a zero or too wide start/mask,
        or records with more than one epoch or more than ``result_depth`` samples; ``emit`` E
        summaries (loss sum u64, correct u32) then the run's cycles (u32).
    sample_in: ``Out(stream.Signature(sample_layout(plan)))`` the run's samples (train = 1).
    result_in: ``In(stream.Signature(result_layout()))`` the network's results during a run.
    flush: ``Out(1)`` after the run's last sample, until the network is idle.
    idle: ``In(1)`` the network's ``idle``.
    running: ``Out(1)`` RUN holds the network (the dispatcher routes ``sample_in`` and
        ``result_out`` here).
    records: ``Out(1)`` (while running) the run keeps its per-sample records: every result is
        also pushed into the result buffer (both take it in the same cycle).
    fed: ``Out(32)`` samples the last run fed (E·count once it is done).
    """

    def __init__(self, plan: Plan, params: LinkParams) -> None:
        if params.onchip_samples < 1:
            raise ValueError("OnChipSet needs params.onchip_samples ≥ 1")
        self.plan, self.params = plan, params
        super().__init__(
            dict(command_signature().members)
            | {
                "store": In(stream.Signature(sample_layout(plan))),
                "store_start": In(1),
                "store_index": In(16),
                "sample_in": Out(stream.Signature(sample_layout(plan))),
                "result_in": In(stream.Signature(result_layout())),
                "flush": Out(1),
                "idle": In(1),
                "running": Out(1),
                "records": Out(1),
                "fed": Out(32),
            }
        )

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        P, plan = self.params, self.plan
        C, N, X = P.onchip_samples, P.in_features, P.x_bits
        K = perm_bits(C)  # widest permutation LFSR (count ≤ C)
        LB = _label_bits(plan)
        depth = C * N
        aw = max(1, (depth - 1).bit_length())
        W = min(bank_words(X), 1 << (depth - 1).bit_length())  # words per bank
        bb = (W - 1).bit_length()  # the word's bits inside a bank
        nb = -(-depth // W)  # banks; the last holds the rest
        banks = []
        for b in range(nb):
            mem = Memory(shape=X, depth=min(W, depth - b * W), init=[])
            m.submodules[f"data{b}" if nb > 1 else "data"] = mem
            banks.append((mem.write_port(), mem.read_port()))
        m.submodules.labels = labels = Memory(shape=LB, depth=C, init=[])
        lwr, lrd = labels.write_port(), labels.read_port()

        # ---- STORE: each beat through a register stage into its bank
        st = self.store
        slot = Signal(range(C + 1))
        waddr = Signal(aw + 1)
        w_en, w_addr, w_data = Signal(), Signal(aw + 1), Signal(X)
        m.d.sync += [w_en.eq(st.valid), w_addr.eq(waddr), w_data.eq(st.payload.x)]
        for b, (wr, _) in enumerate(banks):
            m.d.comb += [
                wr.addr.eq(w_addr[:bb]),
                wr.data.eq(w_data),
                wr.en.eq(w_en & (w_addr[bb:] == b) if nb > 1 else w_en),
            ]
        m.d.comb += [
            st.ready.eq(1),
            lwr.addr.eq(slot),
            lwr.data.eq(st.payload.label),
            lwr.en.eq(st.valid & st.payload.last),
        ]
        with m.If(self.store_start):
            m.d.sync += [
                slot.eq(self.store_index),
                waddr.eq(_const_mul(self.store_index, N, aw + 1)),
            ]
        with m.Elif(st.valid):
            m.d.sync += waddr.eq(waddr + 1)
            with m.If(st.payload.last):
                m.d.sync += slot.eq(slot + 1)

        # ---- RUN arguments
        argsr = Signal(8 * RUN_ARG_BYTES)
        nargs = Signal(range(RUN_ARG_BYTES + 1))
        count, epochs, records = argsr[0:16], argsr[16:23], argsr[23]
        start, mask0 = argsr[24:40], argsr[40:56]
        # derived from the arguments a cycle after the last byte, checked the cycle after that
        # (registered: docs/boards.md §4.1); `start`, `mask0` fit k bits iff they are ≤ 2^k − 1
        taps = Signal(K)
        period = Signal(K + 1)  # 2^k − 1, k = max(2, ⌈log2 count⌉)
        for w in range(K, 1, -1):  # the smallest w with count ≤ 2^w
            with m.If(count <= (1 << w)):
                m.d.sync += [taps.eq(PERM_TAPS[w]), period.eq((1 << w) - 1)]
        bad = Signal()
        m.d.sync += bad.eq(
            (count == 0)
            | (count > C)
            | (epochs == 0)
            | (epochs > MAX_RUN_EPOCHS)
            | (start == 0)
            | (mask0 == 0)
            | (start > period)
            | (mask0 > period)
            | (records & ((epochs != 1) | (count > P.result_depth)))
        )

        def step(v):
            return (v >> 1) ^ Mux(v[0], taps, 0)

        # ---- permutation generator: one candidate per cycle into a one-slot prefetch
        s, msk = Signal(K), Signal(K)
        first = Signal()
        steps = Signal(K + 1)
        gen_left = Signal(8)  # epochs the generator still has to walk
        nxt = Signal(K)
        nxt_valid = Signal()
        cand = Mux(first, msk, s ^ msk)
        gen = Signal()  # generator active this cycle
        m.d.comb += gen.eq(self.running & (gen_left != 0) & ~nxt_valid)
        with m.If(gen):
            with m.If(cand < count):
                m.d.sync += [nxt.eq(cand), nxt_valid.eq(1)]
            with m.If(first):
                m.d.sync += first.eq(0)
            with m.Else():
                m.d.sync += [s.eq(step(s)), steps.eq(steps - 1)]
                with m.If(steps == 1):  # the epoch's last candidate: next mask
                    m.d.sync += [
                        msk.eq(step(msk)),
                        first.eq(1),
                        steps.eq(period),
                        gen_left.eq(gen_left - 1),
                    ]

        # ---- feeder: one feature per cycle from the banks, through the FIFO to `sample_in`
        si = self.sample_in
        m.submodules.inflight = lab_q = SyncFIFOBuffered(width=LB, depth=P.result_depth)
        m.submodules.feed = feed = SyncFIFOBuffered(width=X + 1 + LB, depth=FEED_DEPTH)
        a = Signal(aw + 1)  # next word to read
        left = Signal(range(N + 1))  # words of the sample still to issue
        taken = Signal(range(FEED_DEPTH + 1))  # beats issued, not yet taken from `sample_in`
        push = Signal()  # the label read last cycle enters the in-flight FIFO
        label = Signal(LB)  # the sample's label, from the cycle after `begin`
        issue = Signal()
        begin = Signal()
        pop = si.valid & si.ready
        m.d.comb += [
            issue.eq((left != 0) & (taken != FEED_DEPTH)),
            begin.eq(self.running & nxt_valid & (left == 0) & ~push & lab_q.w_rdy),
            lrd.addr.eq(nxt),
            lrd.en.eq(begin),
            lab_q.w_data.eq(lrd.data),
            lab_q.w_en.eq(push),
        ]
        m.d.sync += [push.eq(begin), taken.eq(taken + issue - pop)]
        with m.If(push):
            m.d.sync += label.eq(lrd.data)
        # the pipeline: issue (address `a`) → bank outputs → 4-way choice → final choice
        v = [Signal(name=f"feed_v{i}") for i in range(FEED_LATENCY)]
        tag = [Signal(1 + LB, name=f"feed_tag{i}") for i in range(FEED_LATENCY)]  # last, label
        sel = [Signal(max(1, aw + 1 - bb), name=f"feed_bank{i}") for i in range(2)]
        m.d.sync += [
            v[0].eq(issue),
            tag[0].eq(Cat(left == 1, Mux(push, lrd.data, label))),
            sel[0].eq(a[bb:]),
            sel[1].eq(sel[0] >> 2),
        ]
        m.d.sync += [v[i + 1].eq(v[i]) for i in range(FEED_LATENCY - 1)]
        m.d.sync += [tag[i + 1].eq(tag[i]) for i in range(FEED_LATENCY - 1)]
        outs = [rd.data for _, rd in banks]
        m.d.comb += [rd.addr.eq(a[:bb]) for _, rd in banks]
        groups = [Signal(X, name=f"feed_group{g}") for g in range(-(-nb // 4))]
        for g, reg in enumerate(groups):
            four = outs[4 * g : 4 * g + 4]
            m.d.sync += reg.eq(Array(four)[sel[0][:2]] if len(four) > 1 else four[0])
        x = Signal(X)
        m.d.sync += x.eq(Array(groups)[sel[1]] if len(groups) > 1 else groups[0])
        m.d.comb += [
            feed.w_en.eq(v[-1]),
            feed.w_data.eq(Cat(x, tag[-1])),
            si.valid.eq(feed.r_rdy),
            feed.r_en.eq(si.ready),
            si.payload.x.eq(feed.r_data[:X]),
            si.payload.last.eq(feed.r_data[X]),
            si.payload.label.eq(feed.r_data[X + 1 :]),
            si.payload.train.eq(1),
        ]
        with m.If(issue):
            m.d.sync += [a.eq(a + 1), left.eq(left - 1)]
        with m.If(begin):
            m.d.sync += [
                a.eq(_const_mul(nxt, N, aw + 1)),
                left.eq(N),
                nxt_valid.eq(0),
                self.fed.eq(self.fed + 1),
            ]

        # ---- summary unit
        ri = self.result_in
        esr = Signal(8 * SUMMARY_BYTES)  # summary being emitted, LSB first
        eleft = Signal(range(SUMMARY_BYTES + 1))
        loss_sum = Signal(64)
        correct = Signal(32)
        rcount = Signal(16)
        res_epochs = Signal(8)
        take = ri.valid & ri.ready
        hit = ri.payload.pred == lab_q.r_data
        m.d.comb += [ri.ready.eq(self.running & (eleft == 0)), lab_q.r_en.eq(take)]
        with m.If(take):
            new_sum, new_correct = loss_sum + ri.payload.loss, correct + hit
            with m.If(rcount == count - 1):
                m.d.sync += [
                    esr.eq(Cat(new_sum[:64], new_correct[:32])),
                    eleft.eq(SUMMARY_BYTES),
                    loss_sum.eq(0),
                    correct.eq(0),
                    rcount.eq(0),
                    res_epochs.eq(res_epochs + 1),
                ]
            with m.Else():
                m.d.sync += [loss_sum.eq(new_sum), correct.eq(new_correct), rcount.eq(rcount + 1)]
        cycles = Signal(32)
        cyc_left = Signal(range(5))
        with m.If(eleft != 0):
            m.d.comb += [self.emit.valid.eq(1), self.emit.payload.eq(esr[:8])]
            m.d.sync += [esr.eq(esr >> 8), eleft.eq(eleft - 1)]
        with m.Elif(cyc_left != 0):
            m.d.comb += [self.emit.valid.eq(1), self.emit.payload.eq(cycles[:8])]
            m.d.sync += [cycles.eq(cycles >> 8), cyc_left.eq(cyc_left - 1)]

        # ---- control
        fwait = Signal(3)
        flushing = Signal()  # registered: every sample was fed, the network drains
        m.d.comb += self.flush.eq(flushing)
        fed_all = (gen_left == 0) & ~nxt_valid & (left == 0) & (taken == 0) & ~push
        with m.FSM(name="onchip"):
            with m.State("IDLE"):
                with m.If(self.cmd.valid):
                    m.d.sync += nargs.eq(0)
                    m.next = "ARGS"
            with m.State("ARGS"):
                m.d.comb += self.args.ready.eq(1)
                with m.If(self.args.valid):
                    m.d.sync += [
                        argsr.eq(Cat(argsr[8:], self.args.payload.data)),
                        nargs.eq(nargs + 1),
                    ]
                    with m.If(nargs == RUN_ARG_BYTES - 1):
                        m.next = "DERIVE"
            with m.State("DERIVE"):  # taps, period from the arguments
                m.next = "VERIFY"
            with m.State("VERIFY"):  # bad from the arguments and period
                m.next = "CHECK"
            with m.State("CHECK"):
                with m.If(bad):
                    m.d.comb += [self.nak.eq(NakReason.BAD_ARG), self.cmd.ready.eq(1)]
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += [
                        s.eq(start),
                        msk.eq(mask0),
                        first.eq(1),
                        steps.eq(period),
                        gen_left.eq(epochs),
                        nxt_valid.eq(0),
                        self.fed.eq(0),
                        loss_sum.eq(0),
                        correct.eq(0),
                        rcount.eq(0),
                        res_epochs.eq(0),
                        cycles.eq(0),
                        fwait.eq(0),
                        flushing.eq(0),
                    ]
                    m.next = "RUN"
            with m.State("RUN"):
                m.d.comb += [self.running.eq(1), self.records.eq(records)]
                m.d.sync += cycles.eq(cycles + 1)
                with m.If(fed_all):
                    m.d.sync += flushing.eq(1)
                with m.If(flushing):
                    with m.If(fwait != 4):
                        m.d.sync += fwait.eq(fwait + 1)
                    with m.Elif(self.idle & (res_epochs == epochs) & (eleft == 0)):
                        m.d.sync += [cyc_left.eq(4), flushing.eq(0)]
                        m.next = "CYCLES"
            with m.State("CYCLES"):
                with m.If(cyc_left == 1):
                    m.next = "DONE"
            with m.State("DONE"):
                m.d.comb += self.cmd.ready.eq(1)
                m.next = "IDLE"
        return m
