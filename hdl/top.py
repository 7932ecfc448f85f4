"""``NetworkTop``: the stages, the loss unit and the tick controller behind the host streams.

Ports are exactly docs/ports.md. The parts meet only through the signatures of
:mod:`pipetrain.hdl.streams` (``wiring.connect``); data paths, all inside the design:

* :class:`SampleWriter`: ``sample_in`` beats go straight into stage 1's input stash (the entry
  the tick controller allocated to the next sample); the ``last`` beat makes the sample
  *pending* (a valid/ready handshake with the tick controller) and ``sample_in`` stalls until
  the sample enters the pipeline.
* stage s's forward output (valid-only) goes into stage s+1's stash (or the loss unit's logit
  buffer); stage s+1's input gradient and the loss unit's δ go into the error buffer of the
  stage before (double-buffered by tick parity).
* :class:`~pipetrain.hdl.tick.TickController` starts every stage's pass and the loss unit.
* :class:`ResultQueue`: results go through a 3-deep FIFO to ``result_out``; a tick starts only
  if the FIFO has room, so ``result_out`` backpressure delays ticks but never changes the
  arithmetic (the link engine's own result FIFO is the deep one; 3 entries keep back-to-back
  ticks at full rate (2 cost a cycle per tick) with 81 fewer flip-flops than 4).
* :class:`~pipetrain.hdl.wacc.WeightAccess`: ``wacc_cmd`` is served while the pipeline is idle
  and no sample is pending.

Source: docs/ports.md (the contract), docs/architecture.md §3; the buffering is *derived*.
"""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out, connect, flipped

from ..compiler.plan import Plan
from .activation import activation_of
from .conv_stage import ConvStageUnit, conv_mask_words
from .graph import stage_graph
from .loss import LossUnit
from .stage import StageUnit, check_stage
from .streams import (
    ValidSignature,
    network_signature,
    pending_sample_layout,
    result_layout,
    sample_layout,
    wacc_cmd_layout,
    wacc_rsp_layout,
    word_layout,
)
from .support import require_hdl
from .tick import TickController
from .wacc import AccessGeometry, WeightAccess

__all__ = [
    "NetworkTop",
    "SampleWriter",
    "ResultQueue",
    "check_supported",
    "sample_layout",
    "result_layout",
    "wacc_cmd_layout",
    "wacc_rsp_layout",
]


def check_supported(plan: Plan) -> None:
    """Raise :class:`~pipetrain.hdl.support.HDLSupportError` (a UserError and a
    NotImplementedError: one ``Error:`` line on the command line) with the reason and the way
    out for a plan the HDL does not build (:func:`~pipetrain.hdl.support.require_hdl`); a plain
    NotImplementedError for a stage the stage parts do not build (an unknown activation:
    :func:`~pipetrain.hdl.stage.check_stage`) or a schedule other than ``pb``/``sequential``.
    Local learning and interlocking with the ``only`` rule (pass-through streams) and the
    ``sum`` rule (earlier update streams whose δ waits for the main one) are built, under
    both schedules."""
    require_hdl(plan)
    for s in plan.stages:
        activation_of(s)
        if s.conv is None:  # a convolution stage: require_hdl checked it
            check_stage(s)
    if plan.schedule not in ("pb", "sequential"):
        raise NotImplementedError(f"schedule {plan.schedule!r} has no tick controller")


def _rest_layout() -> data.StructLayout:
    """A result record without the sample number (``pred``, ``loss``, ``train``)."""
    return data.StructLayout({k: v.shape for k, v in result_layout() if k != "sample"})


class SampleWriter(wiring.Component):
    """``sample_in`` beats into stage 1's stash; a whole sample then waits as *pending*.

    Beat ``k < N`` of a sample is written as stash word ``k`` (the stash adds the entry base);
    the ``last`` beat makes the sample pending with its label and train flag, and ``samples``
    stalls until the tick controller takes it (``pending`` handshake). Beats after the N-th and
    before ``last`` are dropped (docs/ports.md).

    Parameters
    ----------
    plan: the design plan (``x`` format of stage 1, N).

    Members
    -------
    samples: ``In(stream.Signature(sample_layout(plan)))`` the host's ``sample_in``.
    stash: ``Out(ValidSignature(word_layout(N, x.bits)))`` stage 1's stash write.
    pending: ``Out(stream.Signature(pending_sample_layout()))`` the waiting sample.
    """

    def __init__(self, plan: Plan) -> None:
        st = plan.stages[0]
        self.N = plan.in_features
        super().__init__(
            {
                "samples": In(stream.Signature(sample_layout(plan))),
                "stash": Out(ValidSignature(word_layout(st.x_words, st.x_word_bits))),
                "pending": Out(stream.Signature(pending_sample_layout())),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        N, si, pd = self.N, self.samples, self.pending
        beat = Signal(range(N + 1))
        pending = Signal()
        m.d.comb += [
            si.ready.eq(~pending),
            pd.valid.eq(pending),
            self.stash.valid.eq(si.valid & si.ready & (beat < N)),
            self.stash.payload.word.eq(beat),
            self.stash.payload.data.eq(si.payload.x),
        ]
        # taken first: ``ready`` may be high without ``valid`` (then the last beat wins)
        with m.If(pd.ready):
            m.d.sync += pending.eq(0)
        with m.If(si.valid & si.ready):
            with m.If(si.payload.last):
                m.d.sync += [
                    beat.eq(0),
                    pending.eq(1),
                    pd.payload.label.eq(si.payload.label),
                    pd.payload.train.eq(si.payload.train),
                ]
            with m.Elif(beat < N):
                m.d.sync += beat.eq(beat + 1)
        return m


class ResultQueue(wiring.Component):
    """The result records on their way to ``result_out``, numbered as they leave.

    Records leave in order, so the sample number is not stored: it is the count of records
    delivered. A ``depth``-deep FIFO (the plan's ``result_fifo_depth``: 3 entries keep
    back-to-back ticks at full rate, 2 cost a cycle per tick; *derived*). ``push`` cannot stall:
    the tick controller starts a tick only with ``room``.

    Members
    -------
    push: ``In(ValidSignature(pred, loss, train))`` one record per sample.
    room: ``Out(1)`` the FIFO can take a record.
    room_next: ``Out(1)`` the FIFO can take a record in the next cycle, whatever ``out`` does:
        at most ``depth`` − 2 records held after this cycle's push (a record in the FIFO's
        output register counts; the tick controller decides a start a cycle ahead, hdl/tick.py).
    out: ``Out(stream.Signature(result_layout()))`` the host's ``result_out``.

    Raises ValueError for ``depth`` < 2 (``room_next`` would never rise).
    """

    def __init__(self, depth: int) -> None:
        if depth < 2:
            self._MustUse__silence = True
            raise ValueError(f"the result FIFO needs depth >= 2, not {depth}")
        self.depth = depth
        super().__init__(
            {
                "push": In(ValidSignature(_rest_layout())),
                "room": Out(1),
                "room_next": Out(1),
                "out": Out(stream.Signature(result_layout())),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        rest = _rest_layout()
        m.submodules.results = fifo = SyncFIFOBuffered(width=rest.size, depth=self.depth)
        popped = Signal(32)  # records delivered = the sample number of the next one
        ro = self.out
        out = data.View(rest, fifo.r_data)
        m.d.comb += [
            fifo.w_en.eq(self.push.valid),
            fifo.w_data.eq(self.push.payload.as_value()),
            self.room.eq(fifo.w_rdy),
            # held ≤ depth − 2 after the push ⇒ w_rdy next cycle (a pop only frees room)
            self.room_next.eq(fifo.level + self.push.valid <= self.depth - 2),
            ro.payload.sample.eq(popped),
            ro.payload.pred.eq(out.pred),
            ro.payload.loss.eq(out.loss),
            ro.payload.train.eq(out.train),
            ro.valid.eq(fifo.r_rdy),
            fifo.r_en.eq(ro.ready),
        ]
        with m.If(ro.valid & ro.ready):
            m.d.sync += popped.eq(popped + 1)
        return m


class NetworkTop(wiring.Component):
    """The trainable network behind host streams (docs/ports.md).

    Parameters
    ----------
    plan: the design plan; ``schedule`` ``pb`` or ``sequential``; ``global`` or ``local``
        learning (auxiliary heads: ``pb`` only, one loss unit per head). Raises
        NotImplementedError for what the HDL does not build (:func:`check_supported`).

    Members
    -------
    sample_in: ``In(stream.Signature(sample_layout))`` N beats per sample.
    result_out: ``Out(stream.Signature(result_layout))`` one per sample, in order.
    wacc_cmd: ``In(stream.Signature(wacc_cmd_layout))`` weight access commands.
    wacc_rsp: ``Out(stream.Signature(wacc_rsp_layout))`` one response per command.
    flush: ``In(1)`` run bubble ticks until nothing is in flight.
    idle: ``Out(1)`` no sample in flight and no tick running.
    samples_trained: ``Out(32)`` training samples whose stage-1 update was applied.
    ticks: ``Out(32)`` ticks run (``sequential``: samples processed).
    saturations: ``Out(32).array(n + K)`` per-stage counters (all n stages of the plan, main
        then heads), then the loss units': the true loss, then the heads' ``L_1 … L_{K−1}``
        (``global``: S + 1).
    head_correct: ``Out(32).array(K − 1)`` (only with heads) per head k, the samples whose
        head-k prediction equals their label (training and inference samples alike).
    """

    def __init__(self, plan: Plan) -> None:
        try:
            check_supported(plan)
        except NotImplementedError:
            self._MustUse__silence = True  # not built: no "created but never used" warning
            raise
        self.plan = plan
        super().__init__(network_signature(plan))

    def elaborate(self, platform) -> Module:
        m = Module()
        plan = self.plan
        stages = plan.stages
        graph = stage_graph(plan)
        n = len(stages)
        units = [(StageUnit if st.conv is None else ConvStageUnit)(plan, st) for st in stages]
        for i, u in enumerate(units):
            m.submodules[f"stage{i + 1}"] = u
        lus = []  # loss units, L_1 … L_K
        for ln in graph.losses:
            lu = LossUnit(ln.spec, plan.shift_add)
            m.submodules["loss" if ln.t == graph.K else f"head_loss{ln.t}"] = lu
            lus.append(lu)
        loss = lus[-1]
        m.submodules.ctrl = ctrl = TickController(
            plan.schedule,
            [s.stash_entries for s in stages],
            [s.x_words for s in stages],
            [s.row_groups if s.conv is None else conv_mask_words(s) for s in stages],
            graph,
        )
        m.submodules.samples = samples = SampleWriter(plan)
        m.submodules.results = results = ResultQueue(plan.result_fifo_depth)
        m.submodules.wacc = wacc = WeightAccess(
            [
                AccessGeometry(
                    s.lanes,
                    s.cols,
                    s.rows,
                    s.row_groups * s.group_slots,
                    3 if any(m.name == "w_prev" for m in s.memories) else 2,
                    s.column_lanes,
                )
                for s in stages
            ],
            plan.shift_add,
        )

        # samples in; every stage's output to the stashes of its readers (a fan-out where a
        # head is attached) and the loss unit it feeds; errors back along the streams
        connect(m, flipped(self.sample_in), samples.samples)
        connect(m, samples.pending, ctrl.sample)
        for node, u in zip(graph.stages, units, strict=True):
            connect(m, ctrl.stage(node.index), u.ctl)
            connect(m, wacc.stage(node.index), u.access)
        for node, u in zip(graph.stages, units, strict=True):
            readers = [units[r.index].x_in for r in graph.stages if r.writer == node.index]
            readers += [lus[ln.t - 1].z_in for ln in graph.losses if ln.feed == node.index]
            src = samples.stash if node.index == 0 else None
            if src is not None:
                connect(m, src, u.x_in)
            if readers:
                connect(m, u.y, *readers)
            for t, _ in node.streams:  # the main update stream, then the extra streams
                sink = u.g_in if t == node.main else getattr(u, f"g_in_l{t}")
                senders = graph.senders(node.index, t)
                if senders:
                    j = senders[0]
                    if t == graph.stages[j].main:
                        sent = units[j].gin
                    else:
                        sent = getattr(units[j], f"gin_l{t}")
                    connect(m, sent, sink)
                else:  # the stage feeds loss t
                    connect(m, lus[t - 1].delta, sink)
        connect(m, ctrl.loss, loss.ctl)
        for ln in graph.losses[:-1]:
            connect(m, ctrl.loss_ctl(ln.t), lus[ln.t - 1].ctl)

        # results out; weight access while the pipeline is idle
        connect(m, results.out, flipped(self.result_out))
        connect(m, flipped(self.wacc_cmd), wacc.cmd)
        connect(m, wacc.rsp, flipped(self.wacc_rsp))
        m.d.comb += [
            results.push.valid.eq(ctrl.result_valid),
            results.push.payload.pred.eq(loss.pred),
            results.push.payload.loss.eq(loss.loss),
            results.push.payload.train.eq(ctrl.result_train),
            ctrl.can_start.eq(results.room_next & ~wacc.busy),  # for the next cycle (hdl/tick.py)
            wacc.allowed.eq(ctrl.idle & ~samples.pending.valid),
            ctrl.flush.eq(self.flush),
            self.idle.eq(ctrl.idle),
            self.samples_trained.eq(ctrl.samples_trained),
            self.ticks.eq(ctrl.ticks),
        ]
        m.d.comb += [self.saturations[i].eq(u.saturations) for i, u in enumerate(units)]
        m.d.comb += self.saturations[n].eq(loss.saturations)
        for ln in graph.losses[:-1]:  # the heads' loss units after the true one
            k = ln.t
            m.d.comb += self.saturations[n + k].eq(lus[k - 1].saturations)
            correct = Signal(32, name=f"head{k}_correct")
            hit = ctrl.head_valid[k - 1] & (lus[k - 1].pred == ctrl.loss_ctl(k).label)
            with m.If(hit & (correct != 0xFFFF_FFFF)):
                m.d.sync += correct.eq(correct + 1)
            m.d.comb += self.head_correct[k - 1].eq(correct)
        return m
