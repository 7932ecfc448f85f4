"""The stage graph of the tick model: who feeds whom, and at which item age each part works.

Every stage ``i`` of the plan (main stages, then auxiliary-head stages) has a *position* ``p``:
main stage ``s`` has ``p = s``, a head stage the position of the stage it reads (``attach``)
plus one. An item that entered the pipeline ``a`` ticks ago has *age* ``a``. In tick ``τ``:

* stage ``i`` forwards the item of age ``p − 1`` (its output goes to every stage that reads it:
  the next main stage and a head attached there — a fan-out);
* loss ``L_t``'s unit works at the end of the tick on the item of age ``P_t − 1``, where
  ``P_t`` is the position of the stage feeding it (stage S for the true loss ``L_K``, the last
  head stage of block t for ``t < K``);
* stage ``i`` back-propagates the stream of loss ``t`` (``Stage.grad_losses``) of the item of
  age ``2·P_t − p`` — the loss gradient formed at age ``P_t − 1`` travels back one stage a tick.

The delay is the distance from the forward to the farthest update stream: ``D = 2·(P_t − p) +
1`` (``Stage.delay``; docs/architecture.md §2.4); an item is in flight ``span`` ticks, from its
entry through its last backward. ``global``: ``p = s``, one loss at ``P = S``, ages ``s − 1``
and ``2S − s``, ``span = 2S`` (docs/architecture.md §2.1).

Source: docs/architecture.md §2.1 (tick model), §2.4 (delays of local and interlocking
learning), docs/numerics.md §7; the age formulation is *derived* from them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..compiler.plan import LossUnit, Plan

__all__ = ["LossNode", "StageGraph", "StageNode", "stage_graph"]


@dataclass(frozen=True)
class StageNode:
    """One stage in the graph (0-based ``index`` into ``plan.stages``).

    Members
    -------
    index: 0-based stage. position: ``p`` (1-based). writer: 0-based stage whose output this
        stage reads (None: the host's samples, stage 1). fwd_age: ``p − 1``.
    streams: ``(loss t, backward age 2·P_t − p)`` per backward stream, ascending loss.
    updates: the losses that update this stage (``Stage.losses``).
    gin_losses: the streams whose input gradient it sends to ``writer``.
    main: the update stream that makes the update — the update loss of the largest age (ties:
        the larger loss; ``compiler.schedule.main_stream``); the other update losses (the ``sum``
        rule) and the pass-through streams are the stage's extra streams.
    """

    index: int
    position: int
    writer: int | None
    fwd_age: int
    streams: tuple[tuple[int, int], ...]
    updates: tuple[int, ...]
    gin_losses: tuple[int, ...]
    main: int

    @property
    def extras(self) -> tuple[tuple[int, int], ...]:
        """``(loss, age)`` of every stream but :attr:`main`, ascending loss."""
        return tuple((t, a) for t, a in self.streams if t != self.main)


@dataclass(frozen=True)
class LossNode:
    """Loss unit of loss ``t`` (1-based; ``K`` the true loss): the 0-based ``feed`` stage, the
    item ``age`` it works on (``P_t − 1``) and its plan entry ``spec``."""

    t: int
    feed: int
    age: int
    spec: LossUnit


@dataclass(frozen=True)
class StageGraph:
    """The stage graph of a plan (see the module docstring): ``stages`` (one
    :class:`StageNode` per plan stage), ``losses`` (one :class:`LossNode` per loss, ``L_1`` …
    ``L_K``), ``span`` (ticks an item is in flight)."""

    stages: tuple[StageNode, ...]
    losses: tuple[LossNode, ...]
    span: int

    @property
    def K(self) -> int:
        """Losses (blocks): 1 for ``global``."""
        return len(self.losses)

    def loss(self, t: int) -> LossNode:
        """Loss unit of 1-based loss ``t``."""
        return self.losses[t - 1]

    def bwd_age(self, i: int, t: int) -> int:
        """Backward age of stream ``t`` at 0-based stage ``i``."""
        return dict(self.stages[i].streams)[t]

    def senders(self, i: int, t: int) -> list[int]:
        """0-based stages that send stream ``t``'s input gradient to stage ``i``."""
        return [n.index for n in self.stages if n.writer == i and t in n.gin_losses]


class GraphError(ValueError):
    """A plan whose stages do not form the tick model's graph (a damaged or foreign plan)."""


def stage_graph(plan: Plan) -> StageGraph:
    """Build the :class:`StageGraph` of ``plan`` from its stages' ``attach``, ``losses``,
    ``grad_losses`` and ``gin_losses`` and its loss units (``loss``, ``head_losses``).

    Raises :class:`GraphError` when a stage's ``delay`` (``pb``) is not the tick model's or
    the streams do not connect (every stream a stage carries must come from a stage or loss
    unit that sends it)."""
    stages = plan.stages
    n = len(stages)
    pos = [0] * n
    readers: list[list[int]] = [[] for _ in range(n)]
    for i, st in enumerate(stages):
        a = st.attach
        if not 0 <= a <= i:
            raise GraphError(f"stage {st.index}: attach {a} is not an earlier stage")
        pos[i] = pos[a - 1] + 1 if a else 1
        if a:
            readers[a - 1].append(i)
    mains = [i for i, st in enumerate(stages) if st.role == "main"]
    ends = [i for i in range(len(mains), n) if not readers[i]]  # last head stages
    heads = tuple(getattr(plan, "head_losses", ()))
    if len(ends) != len(heads):
        raise GraphError(f"{len(heads)} head loss units for {len(ends)} heads")
    feeds = [*ends, mains[-1]]
    specs = [*heads, plan.loss]
    losses = tuple(
        LossNode(t, f, pos[f] - 1, spec)
        for t, (f, spec) in enumerate(zip(feeds, specs, strict=True), start=1)
    )
    P = {ln.t: pos[ln.feed] for ln in losses}
    nodes = []
    span = max(P.values()) + 1
    for i, st in enumerate(stages):
        grads = tuple(sorted(st.grad_losses or st.losses))
        streams = tuple((t, 2 * P[t] - pos[i]) for t in grads)
        delay = max(2 * (P[t] - pos[i]) + 1 for t in st.losses)
        if plan.schedule == "pb" and delay != st.delay:
            raise GraphError(f"stage {st.index}: delay {st.delay}, tick model {delay}")
        span = max(span, *(b + 1 for _, b in streams))
        nodes.append(
            StageNode(
                i,
                pos[i],
                st.attach - 1 if st.attach else None,
                pos[i] - 1,
                streams,
                tuple(st.losses),
                tuple(st.gin_losses) if st.input_gradient else (),
                max(st.losses, key=lambda t: (2 * P[t] - pos[i], t)),
            )
        )
    graph = StageGraph(tuple(nodes), losses, span)
    for node in nodes:
        for t, _ in node.streams:
            from_loss = any(ln.feed == node.index and ln.t == t for ln in losses)
            if not from_loss and not graph.senders(node.index, t):
                raise GraphError(f"stage {node.index + 1} carries L{t}, which nobody sends it")
    return graph
