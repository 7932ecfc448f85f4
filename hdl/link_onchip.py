"""``OnChipSet``: the on-chip training set of the link engine — STORE's memories and RUN's
runner (docs/protocol.md §2, the order: docs/numerics.md §10).

STORE writes records into two memories: ``data`` (``C·N`` words of X bits, sample ``i``'s
feature ``f`` at word ``i·N + f``) and ``labels`` (``C`` words). RUN then trains E epochs on
slots ``0..count−1`` without the host: a permutation generator (the k-bit Galois LFSR of
:mod:`pipetrain.protocol.onchip`, one candidate per cycle, prefetching the next slot while the
current sample's features stream out), a feeder (one feature per cycle from ``data`` onto
``sample_in``, the label on the ``last`` beat), and a summary unit that takes every result,
compares its prediction with the sample's label (a FIFO of the labels in flight) and adds its
``loss``; at each epoch's last result it emits the epoch's 12-byte summary. After the last
sample it raises ``flush`` until the network is idle and every result is in, then emits the
cycles the run took. Source: docs/protocol.md §2 (*derived*: the order and the buffering).
"""

from __future__ import annotations

from typing import Any

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..compiler.plan import Plan
from ..protocol.onchip import PERM_TAPS, perm_bits
from ..protocol.wire import MAX_RUN_EPOCHS, RUN_ARG_BYTES, SUMMARY_BYTES, LinkParams, NakReason
from .link_ports import command_signature
from .streams import result_layout, sample_layout

__all__ = ["OnChipSet", "onchip_memory_bits"]


def onchip_memory_bits(plan: Plan, samples: int) -> int:
    """Bits of the on-chip set's two memories for ``samples`` slots: ``samples·N·X`` (features)
    + ``samples·⌈log2 classes⌉`` (labels, at least 1 bit)."""
    return samples * (plan.in_features * plan.stages[0].formats.x.bits + _label_bits(plan))


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
        m.submodules.data = data = Memory(shape=X, depth=depth, init=[])
        m.submodules.labels = labels = Memory(shape=LB, depth=C, init=[])
        dwr, drd = data.write_port(), data.read_port()
        lwr, lrd = labels.write_port(), labels.read_port()

        # ---- STORE
        st = self.store
        slot = Signal(range(C + 1))
        waddr = Signal(aw + 1)
        m.d.comb += [
            st.ready.eq(1),
            dwr.addr.eq(waddr),
            dwr.data.eq(st.payload.x),
            dwr.en.eq(st.valid),
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
        k = Signal(range(17))  # LFSR bits for `count`
        taps = Signal(K)
        for w in range(K, 1, -1):  # k = max(2, ⌈log2 count⌉): the smallest w with count ≤ 2^w
            with m.If(count <= (1 << w)):
                m.d.comb += [k.eq(w), taps.eq(PERM_TAPS[w])]
        period = Signal(K + 1)  # 2^k − 1
        m.d.comb += period.eq((Const(1, K + 1) << k) - 1)
        bad = (
            (count == 0)
            | (count > C)
            | (epochs == 0)
            | (epochs > MAX_RUN_EPOCHS)
            | (start == 0)
            | (mask0 == 0)
            | ((start >> k) != 0)
            | ((mask0 >> k) != 0)
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

        # ---- feeder: one feature per cycle from `data`
        si = self.sample_in
        m.submodules.inflight = lab_q = SyncFIFOBuffered(width=LB, depth=P.result_depth)
        a = Signal(aw + 1)  # next word to read
        left = Signal(range(N + 1))  # words of the sample still to read
        out_valid, out_last = Signal(), Signal()
        push = Signal()  # the label read last cycle enters the in-flight FIFO
        load = Signal()
        begin = Signal()
        m.d.comb += [
            load.eq((left != 0) & (~out_valid | si.ready)),
            drd.addr.eq(a),
            drd.en.eq(load),
            si.valid.eq(out_valid),
            si.payload.x.eq(drd.data),
            si.payload.label.eq(lrd.data),
            si.payload.train.eq(1),
            si.payload.last.eq(out_last),
            lab_q.w_data.eq(lrd.data),
            lab_q.w_en.eq(push),
            begin.eq(
                self.running
                & nxt_valid
                & (left == 0)
                & ~push
                & lab_q.w_rdy
                & (~out_valid | (si.ready & out_last))
            ),
            lrd.addr.eq(nxt),
            lrd.en.eq(begin),
        ]
        m.d.sync += push.eq(begin)
        with m.If(load):
            m.d.sync += [
                a.eq(a + 1),
                left.eq(left - 1),
                out_valid.eq(1),
                out_last.eq(left == 1),
            ]
        with m.Elif(si.ready):
            m.d.sync += out_valid.eq(0)
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
        fed_all = (gen_left == 0) & ~nxt_valid & (left == 0) & ~out_valid & ~push
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
                    ]
                    m.next = "RUN"
            with m.State("RUN"):
                m.d.comb += [self.running.eq(1), self.records.eq(records)]
                m.d.sync += cycles.eq(cycles + 1)
                with m.If(fed_all):
                    m.d.comb += self.flush.eq(1)
                    with m.If(fwait != 4):
                        m.d.sync += fwait.eq(fwait + 1)
                    with m.Elif(self.idle & (res_epochs == epochs) & (eleft == 0)):
                        m.d.sync += cyc_left.eq(4)
                        m.next = "CYCLES"
            with m.State("CYCLES"):
                with m.If(cyc_left == 1):
                    m.next = "DONE"
            with m.State("DONE"):
                m.d.comb += self.cmd.ready.eq(1)
                m.next = "IDLE"
        return m
