"""The tick controller: which item each stage forwards and back-propagates, and when.

Items are samples or bubbles. ``pb`` (numerics §7): all stages run their fused pass in
lockstep; the item that entered in tick τ is forwarded by stage s in tick τ+s−1, reaches the
loss unit at the end of tick τ+S−1 and is back-propagated by stage s in tick τ+2S−s. A shift
register ``hist`` of the last 2S items (age 0 = entered this tick) gives every stage its
forward item (age s−1) and backward item (age 2S−s). With auxiliary heads (local learning) the
ages come from the stage graph (:mod:`pipetrain.hdl.graph`): stage i forwards age ``p − 1``
and back-propagates age ``2·P_t − p``, loss unit t works on age ``P_t − 1``, and the history
holds ``span`` items. ``sequential``: one sample at a time, forward stage 1..S, loss, backward
stage S..1 (only training samples go backward).

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

from collections.abc import Sequence

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .graph import LossNode, StageGraph, StageNode
from .streams import LossControlSignature, PassControlSignature, pending_sample_layout

__all__ = ["TickController"]


def _addr_bits(n: int) -> int:
    return max(1, (n - 1).bit_length())


def _chain(S: int) -> StageGraph:
    """The ``global`` graph of S stages: stage s forwards age s − 1, back-propagates age
    2S − s; one loss unit on age S − 1 (its plan entry is not needed here)."""
    nodes = tuple(
        StageNode(s, s + 1, s - 1 if s else None, s, ((1, 2 * S - s - 1),), (1,), (1,) if s else ())
        for s in range(S)
    )
    return StageGraph(nodes, (LossNode(1, S - 1, S - 1, None),), 2 * S)


class TickController(wiring.Component):
    """Lockstep (``pb``) or one-sample-at-a-time (``sequential``) control of the stages.

    Parameters
    ----------
    schedule: ``pb`` or ``sequential``.
    entries: per stage, physical stash entries (``Stage.stash_entries``).
    x_words: per stage, stash words per entry (``Stage.x_words``, ⌈N/Lw⌉).
    row_groups: per stage, row groups (mask words per entry).
    graph: the plan's :class:`~pipetrain.hdl.graph.StageGraph` (``pb`` only); None: the
        ``global`` chain of ``len(entries)`` stages and one loss unit.

    Members
    -------
    sample: ``In(stream.Signature(pending_sample_layout()))`` the whole sample pending in stage
        1's stash (at ``stage1.stash.write``); taken (``ready``) when it enters the pipeline.
    flush: ``In(1)`` run bubble ticks while an item is in flight.
    can_start: ``In(1)`` a tick may start (result FIFO has room, no weight access).
    stage1 … stageS: ``Out(PassControlSignature(entries·x_words, entries·row_groups))`` per
        stage: start pulse and item flags (``done`` back), stash bases (``stash.write``: where
        the writer into the stage — the previous stage, or the host for stage 1 — puts its
        output), error-buffer halves, and each pass-through stream's item (``extra``: its
        ``bwd`` flag and mask address; interlocking learning).
    loss: ``Out(LossControlSignature())`` start, label and train flag of the (true) loss unit.
    head1 … head{K−1}: ``Out(LossControlSignature())`` the auxiliary heads' loss units
        (``L_1`` … ``L_{K−1}``; only with a graph of several losses).
    result_valid: ``Out(1)`` pulse: the loss unit's outputs belong to a sample (push them);
        result_train: ``Out(1)`` its train flag.
    head_valid: ``Out(K−1)`` bit k−1 pulses with ``result_valid``'s timing when head k's loss
        unit worked on a sample this tick (its ``pred`` is that sample's).
    running: ``Out(1)`` a tick runs. idle: ``Out(1)`` no tick runs and nothing is in flight.
    samples_trained, ticks: ``Out(32)`` counters (docs/ports.md); ``sequential`` counts one
        tick per sample (numerics §7).

    Raises NotImplementedError for another schedule, for auxiliary heads under
    ``sequential`` and for a stage updated by several losses (the interlocking ``sum`` rule);
    ValueError for per-stage lists of different lengths.
    """

    def __init__(
        self,
        schedule: str,
        entries: Sequence[int],
        x_words: Sequence[int],
        row_groups: Sequence[int],
        graph: StageGraph | None = None,
    ) -> None:
        if graph is not None and graph.K > 1 and schedule != "pb":
            self._MustUse__silence = True
            raise NotImplementedError(
                f"auxiliary heads under schedule {schedule!r} have no tick controller; use "
                "schedule='pb'"
            )
        if graph is not None and any(len(n.updates) > 1 for n in graph.stages):
            self._MustUse__silence = True
            raise NotImplementedError(
                "a stage updated by several losses (interlocking rule 'sum') has no tick "
                "controller yet; use --rule only"
            )
        if schedule not in ("pb", "sequential"):
            self._MustUse__silence = True  # not built: no "created but never used" warning
            raise NotImplementedError(f"schedule {schedule!r} has no tick controller")
        if not len(entries) == len(x_words) == len(row_groups) > 0:
            self._MustUse__silence = True
            raise ValueError("entries, x_words and row_groups need one value per stage")
        self.schedule = schedule
        self.S = S = len(entries)
        self.graph = graph or _chain(S)
        self.P, self.kx, self.G = list(entries), list(x_words), list(row_groups)
        self.A = max(
            max(_addr_bits(p * k) for p, k in zip(self.P, self.kx, strict=True)),
            max(_addr_bits(p * g) for p, g in zip(self.P, self.G, strict=True)),
        )
        members = {
            "sample": In(stream.Signature(pending_sample_layout())),
            "flush": In(1),
            "can_start": In(1),
        }
        for s in range(S):
            extra = len(self._extra(s))
            members[f"stage{s + 1}"] = Out(
                PassControlSignature(self.P[s] * self.kx[s], self.P[s] * self.G[s], extra)
            )
        members["loss"] = Out(LossControlSignature())
        for k in range(1, self.graph.K):
            members[f"head{k}"] = Out(LossControlSignature())
        members |= {
            "result_valid": Out(1),
            "result_train": Out(1),
            "head_valid": Out(max(self.graph.K - 1, 1)),
            "running": Out(1),
            "idle": Out(1),
            "samples_trained": Out(32),
            "ticks": Out(32),
        }
        super().__init__(members)

    def stage(self, s: int) -> wiring.PureInterface:
        """The control interface of 0-based stage ``s`` (member ``stage{s+1}``)."""
        return getattr(self, f"stage{s + 1}")

    def _extra(self, s: int) -> list[tuple[int, int]]:
        """``(loss, age)`` of 0-based stage ``s``'s pass-through streams (those that do not
        update it), ascending loss."""
        node = self.graph.stages[s]
        return [(t, a) for t, a in node.streams if t not in node.updates]

    def _bwd_age(self, s: int) -> int:
        """Age of 0-based stage ``s``'s update stream (its backward item)."""
        node = self.graph.stages[s]
        return dict(node.streams)[node.updates[0]]

    def loss_ctl(self, t: int) -> wiring.PureInterface:
        """The control interface of loss ``t``'s unit (1-based; ``K``: member ``loss``, else
        ``head{t}``)."""
        return self.loss if t == self.graph.K else getattr(self, f"head{t}")

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
            new["valid"].eq(self.sample.valid),
            new["train"].eq(self.sample.payload.train),
            new["label"].eq(self.sample.payload.label),
        ]
        m.d.comb += [n.eq(a) for n, a in zip(new["xb"], ax, strict=True)]
        m.d.comb += [n.eq(a) for n, a in zip(new["mb"], am, strict=True)]
        m.d.comb += self.stage(0).stash.write.eq(ax[0])  # the host writes the next sample

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
        if self.schedule == "pb":
            self._pb(m, new, advance_alloc, trained, ticks)
        else:
            self._sequential(m, new, advance_alloc, trained, ticks)
        return m

    def _pb(self, m: Module, new: dict, advance_alloc, trained: Signal, ticks: Signal) -> None:
        g = self.graph
        span = g.span
        hist = [self._item(f"age{a}") for a in range(span)]
        in_flight = 0
        for a in range(span - 1):
            in_flight = in_flight | hist[a]["valid"]
        tp = Signal()
        for node in g.stages:
            i = node.index
            fw, bw = hist[node.fwd_age], hist[self._bwd_age(i)]
            port = self.stage(i)
            m.d.comb += [
                port.items.fwd.eq(fw["valid"]),
                port.items.fwd_train.eq(fw["train"]),
                port.items.bwd.eq(bw["valid"] & bw["train"]),
                port.stash.fwd_x.eq(fw["xb"][i]),
                port.stash.fwd_mask.eq(fw["mb"][i]),
                port.stash.bwd_x.eq(bw["xb"][i]),
                port.stash.bwd_mask.eq(bw["mb"][i]),
                port.error.write.eq(tp),
                port.error.read.eq(~tp),
            ]
            if node.writer is not None:  # the writer forwards the item one tick younger
                m.d.comb += port.stash.write.eq(hist[node.fwd_age - 1]["xb"][i])
            for e, (_, age) in enumerate(self._extra(i)):  # pass-through streams
                item = hist[age]
                m.d.comb += [
                    getattr(port, f"extra{e}").bwd.eq(item["valid"] & item["train"]),
                    getattr(port, f"extra{e}").mask.eq(item["mb"][i]),
                ]
        lit = hist[g.loss(g.K).age]
        m.d.comb += self.result_train.eq(lit["train"])
        started = [Signal(name=f"loss{ln.t}_started") for ln in g.losses]
        loss_ok = []
        for ln, st in zip(g.losses, started, strict=True):
            item, ctl = hist[ln.age], self.loss_ctl(ln.t)
            m.d.comb += [ctl.label.eq(item["label"]), ctl.train.eq(item["train"])]
            loss_ok.append(Mux(item["valid"], st & ctl.done, 1))
        stage_done = Cat(*(self.stage(n.index).items.done for n in g.stages)).all()
        # samples_trained: training items whose stage-1 backward (its update) ran this tick
        first = hist[self._bwd_age(0)]
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.idle.eq(~in_flight)
                go = self.can_start & (self.sample.valid | (self.flush & in_flight))
                with m.If(go):
                    for a in range(span - 1, 0, -1):
                        m.d.sync += self._assign(hist[a], hist[a - 1])
                    m.d.sync += self._assign(hist[0], new)
                    m.d.sync += [tp.eq(~tp), *(st.eq(0) for st in started)]
                    with m.If(self.sample.valid):
                        m.d.comb += self.sample.ready.eq(1)
                        advance_alloc()
                    m.next = "START"
            with m.State("START"):
                m.d.comb += self.running.eq(1)
                m.d.comb += [self.stage(n.index).items.start.eq(1) for n in g.stages]
                m.next = "RUN"
            with m.State("RUN"):
                m.d.comb += self.running.eq(1)
                for ln, st in zip(g.losses, started, strict=True):
                    item = hist[ln.age]
                    with m.If(self.stage(ln.feed).items.done & item["valid"] & ~st):
                        m.d.comb += self.loss_ctl(ln.t).start.eq(1)
                        m.d.sync += st.eq(1)
                with m.If(stage_done & Cat(*loss_ok).all()):
                    m.d.comb += self.result_valid.eq(lit["valid"])
                    m.d.comb += [
                        self.head_valid[ln.t - 1].eq(hist[ln.age]["valid"]) for ln in g.losses[:-1]
                    ]
                    m.d.sync += [
                        trained.eq(trained + (first["valid"] & first["train"])),
                        ticks.eq(ticks + 1),
                    ]
                    m.next = "IDLE"

    def _sequential(
        self, m: Module, new: dict, advance_alloc, trained: Signal, ticks: Signal
    ) -> None:
        S = self.S
        cur = self._item("cur")
        for s in range(S):
            port = self.stage(s)
            m.d.comb += [
                port.stash.fwd_x.eq(cur["xb"][s]),
                port.stash.bwd_x.eq(cur["xb"][s]),
                port.stash.fwd_mask.eq(cur["mb"][s]),
                port.stash.bwd_mask.eq(cur["mb"][s]),
                port.items.fwd_train.eq(cur["train"]),
                port.error.write.eq(0),
                port.error.read.eq(0),
            ]
            if s >= 1:
                m.d.comb += port.stash.write.eq(cur["xb"][s])
        m.d.comb += [
            self.loss.label.eq(cur["label"]),
            self.loss.train.eq(cur["train"]),
            self.result_train.eq(cur["train"]),
        ]
        # phases: 0..S−1 forward of stage p+1, S loss, S+1..2S backward of stage 2S−p+1
        phase = Signal(range(2 * S + 2))
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.idle.eq(1)
                with m.If(self.can_start & self.sample.valid):
                    m.d.comb += self.sample.ready.eq(1)
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
                                it = self.stage(p).items
                                m.d.comb += [it.start.eq(1), it.fwd.eq(1)]
                            elif p == S:
                                m.d.comb += self.loss.start.eq(1)
                            else:
                                it = self.stage(2 * S - p).items
                                m.d.comb += [it.start.eq(1), it.bwd.eq(1)]
                m.next = "WAIT"
            with m.State("WAIT"):
                m.d.comb += self.running.eq(1)
                # hold the enables of the running phase (stages sample them at start)
                with m.Switch(phase):
                    for p in range(2 * S + 1):
                        with m.Case(p):
                            if p < S:
                                ok = self.stage(p).items.done
                                m.d.comb += self.stage(p).items.fwd.eq(1)
                            elif p == S:
                                ok = self.loss.done
                            else:
                                ok = self.stage(2 * S - p).items.done
                                m.d.comb += self.stage(2 * S - p).items.bwd.eq(1)
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
