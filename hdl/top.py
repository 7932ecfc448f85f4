"""``NetworkTop``: the stages, the loss unit and the tick controller behind the host streams.

Ports are exactly docs/ports.md. Data paths (all inside the design, no per-cycle host work):

* ``sample_in`` beats are written straight into stage 1's input stash (the entry the tick
  controller allocated to the next sample); the ``last`` beat makes the sample *pending* and
  ``sample_in`` stalls until the sample enters the pipeline.
* stage s's forward outputs go into stage s+1's stash (or the loss unit's logit buffer);
  stage s+1's input gradient and the loss unit's δ go into the error buffer of the stage
  before (double-buffered by tick parity).
* results go through a 3-deep FIFO to ``result_out``; a tick starts only if the FIFO has room,
  so ``result_out`` backpressure delays ticks but never changes the arithmetic (the link
  engine's own result FIFO is the deep one; 3 entries keep back-to-back ticks at full rate
  (2 cost a cycle per tick) with 81 fewer flip-flops than 4).
* ``wacc_cmd`` is served while the pipeline is idle: row ``j`` lives in lane ``j mod L`` at
  address ``(j div L)·(N+1) + col`` (found by repeated subtraction, ``≤ row_groups`` cycles).
  A write stores the data saturated to the memory's format (uncounted) and answers with the
  stored value; a command for a stage, kind, row or column that does not exist answers 0 and
  changes nothing.

Source: docs/ports.md (the contract), docs/architecture.md §3; the buffering is *derived*.
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..compiler.plan import Plan
from .arith import const_mul
from .loss import LossUnit
from .stage import StageUnit
from .tick import TickController

__all__ = [
    "NetworkTop",
    "check_supported",
    "sample_layout",
    "result_layout",
    "wacc_cmd_layout",
    "wacc_rsp_layout",
    "RESULT_FIFO_DEPTH",
]

#: Result records buffered in the top (each ``result_layout().size`` = 81 bits).
RESULT_FIFO_DEPTH = 3


def sample_layout(plan: Plan) -> data.StructLayout:
    """``{x: signed(X), label: unsigned(16), train: 1, last: 1}`` (LSB first)."""
    return data.StructLayout(
        {
            "x": signed(plan.stages[0].formats.x.bits),
            "label": unsigned(16),
            "train": unsigned(1),
            "last": unsigned(1),
        }
    )


def result_layout() -> data.StructLayout:
    """``{sample: unsigned(32), pred: unsigned(16), loss: unsigned(32), train: 1}``."""
    return data.StructLayout(
        {"sample": unsigned(32), "pred": unsigned(16), "loss": unsigned(32), "train": unsigned(1)}
    )


def wacc_cmd_layout() -> data.StructLayout:
    """``{write: 1, stage: 8, kind: 2, row: 16, col: 16, data: signed(32)}``."""
    return data.StructLayout(
        {
            "write": unsigned(1),
            "stage": unsigned(8),
            "kind": unsigned(2),
            "row": unsigned(16),
            "col": unsigned(16),
            "data": signed(32),
        }
    )


def wacc_rsp_layout() -> data.StructLayout:
    """``{data: signed(32)}``."""
    return data.StructLayout({"data": signed(32)})


def check_supported(plan: Plan) -> None:
    """Raise NotImplementedError (with the reason and the way out) for a plan the HDL does not
    build: auxiliary-head stages (local/interlocking learning), LWP ``w`` form, or a schedule
    other than ``pb``/``sequential``."""
    if any(s.role != "main" for s in plan.stages) or getattr(plan, "head_losses", ()):
        raise NotImplementedError(
            f"strategy {plan.strategy!r} needs auxiliary-head stages, which the HDL does not "
            "build yet; use strategy='global' for hardware (the reference trainer runs the rest)"
        )
    for s in plan.stages:
        if s.update.lwp_horizon and s.update.lwp_form != "v":
            raise NotImplementedError(
                f"stage {s.index}: LWP weight-difference form (lwp_form='w') is not implemented "
                "in the HDL yet; use lwp_form='v'"
            )
    if plan.schedule not in ("pb", "sequential"):
        raise NotImplementedError(f"schedule {plan.schedule!r} has no tick controller")


def _div_const(v: Value, d: int) -> Value:
    """``v // d`` for an unsigned ``v`` of at most 16 bits and a constant ``d`` ≥ 1: a shift for
    powers of two, else ``(v·⌈2^K/d⌉) >> K`` with ``K = 16 + bitlen(d)`` (exact for every
    16-bit ``v``: the reciprocal's error times ``v`` stays below ``2^K``; Granlund–Montgomery)."""
    if d & (d - 1) == 0:
        return v >> (d.bit_length() - 1)
    k = 16 + d.bit_length()
    return const_mul(-(-(1 << k) // d), v) >> k


class NetworkTop(wiring.Component):
    """The trainable network behind host streams (docs/ports.md).

    Parameters
    ----------
    plan: the design plan; ``schedule`` ``pb`` or ``sequential``, global strategy, main
        stages only. Raises NotImplementedError for auxiliary heads or LWP ``w`` form.

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
    saturations: ``Out(32).array(S + 1)`` per-stage counters, then the loss unit's.
    """

    def __init__(self, plan: Plan) -> None:
        try:
            check_supported(plan)
        except NotImplementedError:
            self._MustUse__silence = True  # not built: no "created but never used" warning
            raise
        self.plan = plan
        S = len(plan.stages)
        super().__init__(
            {
                "sample_in": In(stream.Signature(sample_layout(plan))),
                "result_out": Out(stream.Signature(result_layout())),
                "wacc_cmd": In(stream.Signature(wacc_cmd_layout())),
                "wacc_rsp": Out(stream.Signature(wacc_rsp_layout())),
                "flush": In(1),
                "idle": Out(1),
                "samples_trained": Out(32),
                "ticks": Out(32),
                "saturations": Out(32).array(S + 1),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        plan = self.plan
        stages = plan.stages
        S = len(stages)
        lws = [1] + [s.lanes for s in stages[:-1]]
        units = []
        for n, st in enumerate(stages):
            u = StageUnit(plan, st, lws[n])
            m.submodules[f"stage{n + 1}"] = u
            units.append(u)
        loss = LossUnit(plan.loss, stages[-1].lanes)
        m.submodules.loss = loss
        ctrl = TickController(plan, [u.kx for u in units])
        m.submodules.ctrl = ctrl
        # the sample number is not stored: records leave in order, so it is the pop count
        rest = data.StructLayout(
            {k: v.shape for k, v in result_layout() if k != "sample"}  # pred, loss, train
        )
        fifo = SyncFIFOBuffered(width=rest.size, depth=RESULT_FIFO_DEPTH)
        m.submodules.results = fifo

        # ---- stage control and the vector paths between units ----
        for n, u in enumerate(units):
            m.d.comb += [
                u.start.eq(ctrl.stage_start[n]),
                u.fwd_en.eq(ctrl.fwd_en[n]),
                u.fwd_train.eq(ctrl.fwd_train[n]),
                u.bwd_en.eq(ctrl.bwd_en[n]),
                u.fx_base.eq(ctrl.fx_base[n]),
                u.bx_base.eq(ctrl.bx_base[n]),
                u.fm_base.eq(ctrl.fm_base[n]),
                u.bm_base.eq(ctrl.bm_base[n]),
                u.gr_half.eq(ctrl.gr_half),
                u.gw_half.eq(ctrl.gw_half),
                ctrl.stage_done[n].eq(u.done),
                self.saturations[n].eq(u.saturations),
            ]
            if n > 0:
                prev = units[n - 1]
                m.d.comb += [
                    u.xw_en.eq(prev.y_en),
                    u.xw_addr.eq(ctrl.xw_base[n] + prev.y_word),
                    u.xw_data.eq(prev.y_data),
                ]
            if n + 1 < S:
                nxt = units[n + 1]
                m.d.comb += [u.gw_en.eq(nxt.gin_en), u.gw_data.eq(nxt.gin_data)]
            else:
                m.d.comb += [u.gw_en.eq(loss.dl_en), u.gw_data.eq(loss.dl_data)]
        last = units[-1]
        m.d.comb += [
            loss.zw_en.eq(last.y_en),
            loss.zw_word.eq(last.y_word),
            loss.zw_data.eq(last.y_data),
            loss.start.eq(ctrl.loss_start),
            loss.label.eq(ctrl.loss_label),
            loss.train.eq(ctrl.result_train),
            ctrl.loss_done.eq(loss.done),
            self.saturations[S].eq(loss.saturations),
            ctrl.flush.eq(self.flush),
            self.idle.eq(ctrl.idle),
            self.samples_trained.eq(ctrl.samples_trained),
            self.ticks.eq(ctrl.ticks),
        ]

        # ---- samples in ----
        N = plan.in_features
        beat = Signal(range(N + 1))
        pending = Signal()
        p_label = Signal(16)
        p_train = Signal()
        si = self.sample_in
        m.d.comb += [
            si.ready.eq(~pending),
            ctrl.sample_ready.eq(pending),
            ctrl.sample_label.eq(p_label),
            ctrl.sample_train.eq(p_train),
        ]
        first = units[0]
        m.d.comb += [
            first.xw_en.eq(si.valid & si.ready & (beat < N)),
            first.xw_addr.eq(ctrl.host_xbase + beat),
            first.xw_data.eq(si.payload.x),
        ]
        with m.If(si.valid & si.ready):
            with m.If(si.payload.last):
                m.d.sync += [
                    beat.eq(0),
                    pending.eq(1),
                    p_label.eq(si.payload.label),
                    p_train.eq(si.payload.train),
                ]
            with m.Elif(beat < N):
                m.d.sync += beat.eq(beat + 1)
        with m.If(ctrl.take):
            m.d.sync += pending.eq(0)

        # ---- results out ----
        popped = Signal(32)  # records delivered = the sample number of the next one
        res = Signal(rest)
        m.d.comb += [
            res.pred.eq(loss.pred),
            res.loss.eq(loss.loss),
            res.train.eq(ctrl.result_train),
            fifo.w_en.eq(ctrl.result_valid),
            fifo.w_data.eq(res.as_value()),
        ]
        ro = self.result_out
        out = data.View(rest, fifo.r_data)
        m.d.comb += [
            ro.payload.sample.eq(popped),
            ro.payload.pred.eq(out.pred),
            ro.payload.loss.eq(out.loss),
            ro.payload.train.eq(out.train),
            ro.valid.eq(fifo.r_rdy),
            fifo.r_en.eq(ro.ready),
        ]
        with m.If(ro.valid & ro.ready):
            m.d.sync += popped.eq(popped + 1)

        # ---- weight access ----
        wc, wr = self.wacc_cmd, self.wacc_rsp
        cmd = Signal(wacc_cmd_layout())
        addr = Signal(range(max(max(s.cycles_per_tick for s in stages), 2)))
        lane = Signal(range(max(max(s.lanes for s in stages), 2)))
        okr = Signal()
        busy = Signal()
        m.d.comb += ctrl.can_start.eq(fifo.w_rdy & ~busy)
        max_kind = [2 if (s.update.lwp_horizon and s.update.lwp_form == "w") else 1 for s in stages]
        for u in units:
            m.d.comb += [
                u.acc_we.eq(cmd.write),
                u.acc_kind.eq(cmd.kind),
                u.acc_lane.eq(lane),
                u.acc_addr.eq(addr),
                u.acc_wdata.eq(cmd.data),
            ]
        accept = wc.valid & ctrl.idle & ~ctrl.sample_ready

        def take_cmd() -> None:
            m.d.comb += wc.ready.eq(1)
            m.d.sync += cmd.eq(wc.payload)
            m.next = "CALC"

        with m.FSM():
            with m.State("IDLE"):
                with m.If(accept):
                    take_cmd()
            with m.State("CALC"):
                # row j → lane j mod L, group j div L (constant division), address g·(N+1)+col
                m.d.comb += busy.eq(1)
                m.d.sync += okr.eq(0)
                with m.Switch(cmd.stage):
                    for n, st in enumerate(stages):
                        with m.Case(n):
                            grp = _div_const(cmd.row, st.lanes)
                            m.d.sync += [
                                okr.eq(
                                    (cmd.kind <= max_kind[n])
                                    & (cmd.row < st.out_features)
                                    & (cmd.col <= st.in_features)
                                ),
                                # constant products: shifts and adders where cheap
                                lane.eq(cmd.row - const_mul(st.lanes, grp)),
                                addr.eq(const_mul(st.in_features + 1, grp) + cmd.col),
                            ]
                m.next = "ACC"
            with m.State("ACC"):
                m.d.comb += busy.eq(1)
                with m.Switch(cmd.stage):
                    for n, u in enumerate(units):
                        with m.Case(n):
                            m.d.comb += u.acc_en.eq(okr)
                m.next = "RESP"
            with m.State("RESP"):
                # acc_rdata stays valid while cmd, lane and addr are unchanged
                m.d.comb += [busy.eq(1), wr.valid.eq(1)]
                with m.Switch(cmd.stage):
                    for n, u in enumerate(units):
                        with m.Case(n):
                            m.d.comb += wr.payload.data.eq(Mux(okr, u.acc_rdata, 0))
                with m.If(wr.ready):
                    with m.If(accept):
                        take_cmd()
                    with m.Else():
                        m.next = "IDLE"
        return m
