"""The tick controller: which item each stage forwards and back-propagates, and when.

Items are samples or bubbles. ``pb`` (numerics §7): all stages run their fused pass in
lockstep; the item that entered in tick τ is forwarded by stage s in tick τ+s−1, reaches the
loss unit at the end of tick τ+S−1 and is back-propagated by stage s in tick τ+2S−s. A shift
register ``hist`` of the last 2S items (age 0 = entered this tick) gives every stage its
forward item (age s−1) and backward item (age 2S−s). ``sequential``: one sample at a time,
forward stage 1..S, loss, backward stage S..1 (only training samples go backward).

Stash entries are allocated per stage to *samples* (bubbles take none), round-robin over the
stage's ``stash_depth + 1`` entries: at most ``D_s + 1`` samples use stage s's stash at once
plus the one being written, so a sample's entry is never reused while it is needed (*derived*;
it keeps a sample that arrives during a bubble tick safe). Each item carries its entry base
addresses for every stage.

A tick starts when a whole sample is pending (it enters stage 1) or, with ``flush`` high, when
an item is still in flight (a bubble); ``can_start`` (result FIFO has room, no weight access
running) gates both. Tick length: ``max_s(pass_s, pass_S + loss) + TICK_OVERHEAD`` cycles
(:func:`pipetrain.compiler.build.tick_cycles`). Source: docs/architecture.md §2.1/§3, docs/ports.md
tick
rule; the allocation scheme and the state machine are *derived*.
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..compiler.plan import Plan
from .stage import stash_entries

__all__ = ["TickController"]


def _addr_bits(n: int) -> int:
    return max(1, (n - 1).bit_length())


class TickController(wiring.Component):
    """Lockstep (``pb``) or one-sample-at-a-time (``sequential``) control of the stages.

    Parameters
    ----------
    plan: the design plan (schedule, stages).
    x_words: per stage, stash words per entry (⌈N/Lw⌉).

    Members
    -------
    sample_ready: ``In(1)`` a whole sample is pending (in stage 1's stash at ``host_xbase``).
    sample_label, sample_train: ``In`` its label and train flag.
    take: ``Out(1)`` pulse: the pending sample entered the pipeline.
    host_xbase: ``Out`` stage-1 stash word address where the host writes the next sample.
    flush: ``In(1)`` run bubble ticks while an item is in flight.
    can_start: ``In(1)`` a tick may start (result FIFO has room, no weight access).
    stage_done: ``In(S)`` per stage ``done``. stage_start, fwd_en, fwd_train, bwd_en: ``Out(S)``.
    fx_base, bx_base, fm_base, bm_base, xw_base: ``Out(A).array(S)`` stash/mask bases per
        stage (``xw_base``: where the writer into stage s puts its output, s ≥ 2).
    gw_half, gr_half: ``Out(1)`` error-buffer halves written / read this tick.
    loss_start: ``Out(1)``; loss_label: ``Out(16)``; loss_done: ``In(1)``.
    result_valid: ``Out(1)`` pulse: the loss unit's outputs belong to a sample (push them);
        result_train: ``Out(1)`` its train flag.
    running: ``Out(1)`` a tick runs. idle: ``Out(1)`` no tick runs and nothing is in flight.
    samples_trained, ticks: ``Out(32)`` counters (docs/ports.md); ``sequential`` counts one
        tick per sample (numerics §7).
    """

    def __init__(self, plan: Plan, x_words: list[int]) -> None:
        stages = plan.stages
        if any(s.role != "main" for s in stages):
            raise NotImplementedError("auxiliary-head stages are not implemented in the HDL yet")
        if plan.schedule not in ("pb", "sequential"):
            raise NotImplementedError(f"schedule {plan.schedule!r} has no tick controller")
        self.plan = plan
        self.S = S = len(stages)
        self.P = [stash_entries(s) for s in stages]
        self.kx = list(x_words)
        self.G = [s.row_groups for s in stages]
        self.A = max(
            max(_addr_bits(p * k) for p, k in zip(self.P, self.kx, strict=True)),
            max(_addr_bits(p * g) for p, g in zip(self.P, self.G, strict=True)),
        )
        A = self.A
        super().__init__(
            {
                "sample_ready": In(1),
                "sample_label": In(16),
                "sample_train": In(1),
                "take": Out(1),
                "host_xbase": Out(A),
                "flush": In(1),
                "can_start": In(1),
                "stage_done": In(S),
                "stage_start": Out(S),
                "fwd_en": Out(S),
                "fwd_train": Out(S),
                "bwd_en": Out(S),
                "fx_base": Out(A).array(S),
                "bx_base": Out(A).array(S),
                "fm_base": Out(A).array(S),
                "bm_base": Out(A).array(S),
                "xw_base": Out(A).array(S),
                "gw_half": Out(1),
                "gr_half": Out(1),
                "loss_start": Out(1),
                "loss_label": Out(16),
                "loss_done": In(1),
                "result_valid": Out(1),
                "result_train": Out(1),
                "running": Out(1),
                "idle": Out(1),
                "samples_trained": Out(32),
                "ticks": Out(32),
            }
        )

    def _item(self, name: str) -> dict:
        A, S = self.A, self.S
        return {
            "valid": Signal(name=f"{name}_valid"),
            "train": Signal(name=f"{name}_train"),
            "label": Signal(16, name=f"{name}_label"),
            "xb": [Signal(A, name=f"{name}_xb{s}") for s in range(S)],
            "mb": [Signal(A, name=f"{name}_mb{s}") for s in range(S)],
        }

    @staticmethod
    def _assign(dst: dict, src: dict) -> list:
        out = [dst["valid"].eq(src["valid"]), dst["train"].eq(src["train"])]
        out.append(dst["label"].eq(src["label"]))
        out += [d.eq(s) for d, s in zip(dst["xb"], src["xb"], strict=True)]
        out += [d.eq(s) for d, s in zip(dst["mb"], src["mb"], strict=True)]
        return out

    def elaborate(self, platform) -> Module:
        m = Module()
        S = self.S
        # per-stage allocation of stash entries to samples
        ax = [Signal(self.A, name=f"alloc_x{s}") for s in range(S)]
        am = [Signal(self.A, name=f"alloc_m{s}") for s in range(S)]
        new = self._item("new")
        m.d.comb += [
            new["valid"].eq(self.sample_ready),
            new["train"].eq(self.sample_train),
            new["label"].eq(self.sample_label),
        ]
        m.d.comb += [n.eq(a) for n, a in zip(new["xb"], ax, strict=True)]
        m.d.comb += [n.eq(a) for n, a in zip(new["mb"], am, strict=True)]
        m.d.comb += self.host_xbase.eq(ax[0])

        def advance_alloc():
            for s in range(S):
                xw, mw = self.P[s] * self.kx[s], self.P[s] * self.G[s]
                m.d.sync += [
                    ax[s].eq(Mux(ax[s] == xw - self.kx[s], 0, ax[s] + self.kx[s])),
                    am[s].eq(Mux(am[s] == mw - self.G[s], 0, am[s] + self.G[s])),
                ]

        trained = Signal(32)
        ticks = Signal(32)
        m.d.comb += [self.samples_trained.eq(trained), self.ticks.eq(ticks)]
        if self.plan.schedule == "pb":
            self._pb(m, new, advance_alloc, trained, ticks)
        else:
            self._sequential(m, new, advance_alloc, trained, ticks)
        return m

    def _pb(self, m: Module, new: dict, advance_alloc, trained: Signal, ticks: Signal) -> None:
        S = self.S
        hist = [self._item(f"age{a}") for a in range(2 * S)]
        in_flight = 0
        for a in range(2 * S - 1):
            in_flight = in_flight | hist[a]["valid"]
        tp = Signal()
        m.d.comb += [self.gw_half.eq(tp), self.gr_half.eq(~tp)]
        for s in range(1, S + 1):
            fw, bw = hist[s - 1], hist[2 * S - s]
            m.d.comb += [
                self.fwd_en[s - 1].eq(fw["valid"]),
                self.fwd_train[s - 1].eq(fw["train"]),
                self.bwd_en[s - 1].eq(bw["valid"] & bw["train"]),
                self.fx_base[s - 1].eq(fw["xb"][s - 1]),
                self.fm_base[s - 1].eq(fw["mb"][s - 1]),
                self.bx_base[s - 1].eq(bw["xb"][s - 1]),
                self.bm_base[s - 1].eq(bw["mb"][s - 1]),
            ]
            if s >= 2:
                m.d.comb += self.xw_base[s - 1].eq(hist[s - 2]["xb"][s - 1])
        lit = hist[S - 1]
        m.d.comb += [self.loss_label.eq(lit["label"]), self.result_train.eq(lit["train"])]
        loss_started = Signal()
        all_done = self.stage_done.all()
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.idle.eq(~in_flight)
                go = self.can_start & (self.sample_ready | (self.flush & in_flight))
                with m.If(go):
                    for a in range(2 * S - 1, 0, -1):
                        m.d.sync += self._assign(hist[a], hist[a - 1])
                    m.d.sync += self._assign(hist[0], new)
                    m.d.sync += [tp.eq(~tp), loss_started.eq(0)]
                    with m.If(self.sample_ready):
                        m.d.comb += self.take.eq(1)
                        advance_alloc()
                    m.next = "START"
            with m.State("START"):
                m.d.comb += [self.running.eq(1), self.stage_start.eq((1 << S) - 1)]
                m.next = "RUN"
            with m.State("RUN"):
                m.d.comb += self.running.eq(1)
                with m.If(self.stage_done[S - 1] & lit["valid"] & ~loss_started):
                    m.d.comb += self.loss_start.eq(1)
                    m.d.sync += loss_started.eq(1)
                loss_ok = Mux(lit["valid"], loss_started & self.loss_done, 1)
                with m.If(all_done & loss_ok):
                    m.d.comb += self.result_valid.eq(lit["valid"])
                    last = hist[2 * S - 1]
                    m.d.sync += [
                        trained.eq(trained + (last["valid"] & last["train"])),
                        ticks.eq(ticks + 1),
                    ]
                    m.next = "IDLE"

    def _sequential(
        self, m: Module, new: dict, advance_alloc, trained: Signal, ticks: Signal
    ) -> None:
        S = self.S
        cur = self._item("cur")
        m.d.comb += [self.gw_half.eq(0), self.gr_half.eq(0)]
        for s in range(S):
            m.d.comb += [
                self.fx_base[s].eq(cur["xb"][s]),
                self.bx_base[s].eq(cur["xb"][s]),
                self.fm_base[s].eq(cur["mb"][s]),
                self.bm_base[s].eq(cur["mb"][s]),
                self.xw_base[s].eq(cur["xb"][s]),
                self.fwd_train[s].eq(cur["train"]),
            ]
        m.d.comb += [self.loss_label.eq(cur["label"]), self.result_train.eq(cur["train"])]
        # phases: 0..S−1 forward of stage p+1, S loss, S+1..2S backward of stage 2S−p+1
        phase = Signal(range(2 * S + 2))
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.idle.eq(1)
                with m.If(self.can_start & self.sample_ready):
                    m.d.comb += self.take.eq(1)
                    advance_alloc()
                    m.d.sync += self._assign(cur, new)
                    m.d.sync += phase.eq(0)
                    m.next = "START"
            with m.State("START"):
                m.d.comb += self.running.eq(1)
                with m.Switch(phase):
                    for p in range(2 * S + 1):
                        with m.Case(p):
                            if p < S:
                                m.d.comb += [self.stage_start[p].eq(1), self.fwd_en[p].eq(1)]
                            elif p == S:
                                m.d.comb += self.loss_start.eq(1)
                            else:
                                s = 2 * S - p
                                m.d.comb += [self.stage_start[s].eq(1), self.bwd_en[s].eq(1)]
                m.next = "WAIT"
            with m.State("WAIT"):
                m.d.comb += self.running.eq(1)
                # hold the enables of the running phase (stages sample them at start)
                with m.Switch(phase):
                    for p in range(2 * S + 1):
                        with m.Case(p):
                            if p < S:
                                ok = self.stage_done[p]
                                m.d.comb += self.fwd_en[p].eq(1)
                            elif p == S:
                                ok = self.loss_done
                            else:
                                ok = self.stage_done[2 * S - p]
                                m.d.comb += self.bwd_en[2 * S - p].eq(1)
                            with m.If(ok):
                                if p == S:
                                    m.d.comb += self.result_valid.eq(1)
                                end = None
                                if p == 2 * S:
                                    end = 1
                                elif p == S:
                                    end = ~cur["train"]
                                if end is None:
                                    m.d.sync += phase.eq(p + 1)
                                    m.next = "START"
                                else:
                                    with m.If(end):
                                        m.d.sync += [
                                            trained.eq(trained + cur["train"]),
                                            ticks.eq(ticks + 1),
                                        ]
                                        m.next = "IDLE"
                                    with m.Else():
                                        m.d.sync += phase.eq(p + 1)
                                        m.next = "START"
