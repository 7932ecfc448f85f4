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
an item is still in flight (a bubble); ``can_start`` (the result FIFO has room and no weight
access runs in the next cycle) gates both. The start is decided a cycle ahead, into a register
``go`` (``sample``, ``flush`` and ``can_start`` of the cycle before the start, which all hold
until a tick takes them: *derived*): the stash allocation and the history, hundreds of
flip-flops, take their enable from one flip-flop, not from the link's and the weight access's
registers across the chip (the ULX3S critical path of mlp-digits-deep 11×2: the weight access's
state → ``can_start`` → stage 1's allocation enable, 14.8 ns, docs/boards.md §4.2). Back to
back ticks start as before (the next one is decided in the last cycle of the one running); a
sample that arrives while the controller waits starts a cycle later. Tick length:
``max_s(pass_s, pass_S + loss) + TICK_OVERHEAD`` cycles
(:func:`pipetrain.compiler.build.tick_cycles`). Source: docs/architecture.md §2.1/§3,
docs/ports.md tick rule; the allocation scheme and the state machine are *derived*.
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
        StageNode(
            s, s + 1, s - 1 if s else None, s, ((1, 2 * S - s - 1),), (1,), (1,) if s else (), 1
        )
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
    can_start: ``In(1)`` a tick may start in the next cycle (the result FIFO will have room, no
        weight access runs then); it and ``sample.valid``, ``flush`` are sampled a cycle
        before the start.
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

    Raises NotImplementedError for another schedule; ValueError for per-stage lists of
    different lengths.
    """

    def __init__(
        self,
        schedule: str,
        entries: Sequence[int],
        x_words: Sequence[int],
        row_groups: Sequence[int],
        graph: StageGraph | None = None,
    ) -> None:
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
        """``(loss, age)`` of 0-based stage ``s``'s extra streams (pass-through streams and the
        ``sum`` rule's earlier update streams: all but the main one), ascending loss."""
        return list(self.graph.stages[s].extras)

    def _bwd_age(self, s: int) -> int:
        """Age of 0-based stage ``s``'s main update stream (its backward item)."""
        node = self.graph.stages[s]
        return dict(node.streams)[node.main]

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
        # the start, a cycle ahead: in the cycle before, the controller is to be idle (IDLE
        # without a start, or the end of a tick) and can start with a sample or a bubble
        go, idle_next = Signal(name="go"), Signal(name="idle_next")
        wants = self.sample.valid | (self.flush & in_flight)
        m.d.sync += go.eq(idle_next & self.can_start & wants)
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += [self.idle.eq(~in_flight), idle_next.eq(~go)]
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
                    # from its feeder's last forward output on (build.forward_cycles)
                    with m.If(self.stage(ln.feed).items.fwd_done & item["valid"] & ~st):
                        m.d.comb += self.loss_ctl(ln.t).start.eq(1)
                        m.d.sync += st.eq(1)
                with m.If(stage_done & Cat(*loss_ok).all()):
                    m.d.comb += [self.result_valid.eq(lit["valid"]), idle_next.eq(1)]
                    m.d.comb += [
                        self.head_valid[ln.t - 1].eq(hist[ln.age]["valid"]) for ln in g.losses[:-1]
                    ]
                    m.d.sync += [
                        trained.eq(trained + (first["valid"] & first["train"])),
                        ticks.eq(ticks + 1),
                    ]
                    m.next = "IDLE"

    def _steps(self) -> list[tuple[str, int, tuple[int, ...]]]:
        """The passes of one sample under ``sequential``, in the tick model's order (numerics
        §7.2: the ``pb`` ticks with one sample in flight): per tick τ, the forwards of the
        stages at age τ, the loss units at age τ, then one backward pass per stage with
        streams at age τ (their losses). ``global``: forward 1..S, the loss, backward S..1."""
        g = self.graph
        steps: list[tuple[str, int, tuple[int, ...]]] = []
        for tau in range(g.span):
            steps += [("fwd", n.index, ()) for n in g.stages if n.fwd_age == tau]
            steps += [("loss", ln.t, ()) for ln in g.losses if ln.age == tau]
            for n in g.stages:
                ts = tuple(t for t, a in n.streams if a == tau)
                if ts:
                    steps.append(("bwd", n.index, ts))
        return steps

    def _sequential(
        self, m: Module, new: dict, advance_alloc, trained: Signal, ticks: Signal
    ) -> None:
        S, g = self.S, self.graph
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
            m.d.comb += [
                getattr(port, f"extra{e}").mask.eq(cur["mb"][s]) for e in range(len(self._extra(s)))
            ]
            if s >= 1:
                m.d.comb += port.stash.write.eq(cur["xb"][s])
        for ln in g.losses:
            ctl = self.loss_ctl(ln.t)
            m.d.comb += [ctl.label.eq(cur["label"]), ctl.train.eq(cur["train"])]
        m.d.comb += self.result_train.eq(cur["train"])
        steps = self._steps()
        n = len(steps)
        # after step p of an inference sample: the next forward or loss step (no backward)
        skip = [next((q for q in range(p + 1, n) if steps[q][0] != "bwd"), n) for p in range(n)]

        def flags(step: tuple[str, int, tuple[int, ...]]) -> list:
            """The item flags of a step's pass (held from its start pulse to its end)."""
            kind, i, ts = step
            if kind == "fwd":
                return [self.stage(i).items.fwd.eq(1)]
            if kind == "loss":
                return []
            port, node = self.stage(i), g.stages[i]
            out = [port.items.bwd.eq(cur["train"] & (node.main in ts))]
            for e, (t, _) in enumerate(self._extra(i)):
                out.append(getattr(port, f"extra{e}").bwd.eq(cur["train"] & (t in ts)))
            return out

        def done(step: tuple[str, int, tuple[int, ...]]):
            kind, i, _ = step
            return self.loss_ctl(i).done if kind == "loss" else self.stage(i).items.done

        phase = Signal(range(n + 1))
        go, idle_next = Signal(name="go"), Signal(name="idle_next")  # as in ``pb``
        m.d.sync += go.eq(idle_next & self.can_start & self.sample.valid)
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += [self.idle.eq(1), idle_next.eq(~go)]
                with m.If(go):
                    m.d.comb += self.sample.ready.eq(1)
                    advance_alloc()
                    m.d.sync += self._assign(cur, new)
                    m.d.sync += phase.eq(0)
                    m.next = "START"
            with m.State("START"):
                m.d.comb += self.running.eq(1)
                with m.Switch(phase):
                    for p, step in enumerate(steps):
                        with m.Case(p):
                            kind, i, _ = step
                            if kind == "loss":
                                m.d.comb += self.loss_ctl(i).start.eq(1)
                            else:
                                m.d.comb += self.stage(i).items.start.eq(1)
                            m.d.comb += flags(step)
                m.next = "WAIT"
            with m.State("WAIT"):
                m.d.comb += self.running.eq(1)
                # hold the flags of the running pass (stages sample them at start)
                with m.Switch(phase):
                    for p, step in enumerate(steps):
                        with m.Case(p):
                            m.d.comb += flags(step)
                            kind, i, _ = step
                            with m.If(done(step)):
                                if kind == "loss" and i == g.K:
                                    m.d.comb += self.result_valid.eq(1)
                                elif kind == "loss":
                                    m.d.comb += self.head_valid[i - 1].eq(1)
                                nxt = Mux(cur["train"], p + 1, skip[p])
                                with m.If(nxt == n):
                                    m.d.comb += idle_next.eq(1)
                                    m.d.sync += [
                                        trained.eq(trained + cur["train"]),
                                        ticks.eq(ticks + 1),
                                    ]
                                    m.next = "IDLE"
                                with m.Else():
                                    m.d.sync += phase.eq(nxt)
                                    m.next = "START"
