"""Pipelined Backpropagation scheduling rules: delays, update maps, SC and batch-1 scaling.

This module is the single source of every scheduling number in pipetrain. The compiler writes
them into the plan; the reference trainer, the golden model and the HDL read them from there (or,
for the float reference trainer run without a plan, from these functions directly).

Sources: Kosson et al., "Pipelined Backpropagation at Scale", MLSys 2021 (arXiv 2003.11666) §3
(PB, Spike Compensation, Linear Weight Prediction); Gomez et al., "Interlocking
Backpropagation", JMLR 23 (2022) §3 (local and interlocking learning). The tick model and the
batch-1 scaling rules are *derived* (``docs/architecture.md`` §2.1, §2.3).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .enums import LwpForm, Mitigation, Rule, Schedule, Strategy, parse

__all__ = [
    "SCHEDULES",
    "MITIGATIONS",
    "LWP_FORMS",
    "STRATEGIES",
    "RULES",
    "pb_delay",
    "StageRole",
    "stage_layout",
    "update_losses",
    "carried_losses",
    "same_as_global",
    "main_stream",
    "early_update_streams",
    "tick_streams",
    "spike_compensation",
    "batch1_scaling",
    "naive_overshoot",
]

#: Accepted values (CLI choices), from the enums.
SCHEDULES = tuple(m.value for m in Schedule)
MITIGATIONS = tuple(m.value for m in Mitigation)
LWP_FORMS = tuple(m.value for m in LwpForm)
STRATEGIES = tuple(m.value for m in Strategy)
RULES = tuple(m.value for m in Rule)


def pb_delay(num_stages: int, stage: int) -> int:
    """Return the PB delay D_s = 2(S−s)+1 of 1-based ``stage`` in a pipeline of ``num_stages``.

    Units: weight updates (= samples, one update per sample per stage).
    Source: *derived* tick model, docs/architecture.md §2.1 (forward of sample n at tick n+s−1,
    backward at
    tick n+2S−s).

    Raises :class:`ValueError` if ``stage`` is not in 1..S.
    """
    if not 1 <= stage <= num_stages:
        raise ValueError(f"stage {stage} is outside 1..{num_stages}")
    return 2 * (num_stages - stage) + 1


def update_losses(
    num_blocks: int, block: int, strategy: str, distance: int = 0, rule: str = "only"
) -> tuple[int, ...]:
    """Return the 1-based indices of the losses that update the weights of 1-based ``block``.

    ``strategy`` is ``global`` (every block gets L_K), ``local`` (block k gets L_k) or
    ``interlocking`` with ``distance`` d: rule ``only`` gives L_min(k+d, K), rule ``sum`` gives
    L_k … L_min(k+d, K). Source: Gomez et al. 2022 §3 and the reference code's "only" rule;
    the K=5 table of docs/architecture.md §2.4.

    Raises :class:`ValueError` for an unknown strategy/rule, a negative distance or a block
    outside 1..K.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; supported: {', '.join(STRATEGIES)}")
    if rule not in RULES:
        raise ValueError(f"unknown interlocking rule {rule!r}; supported: {', '.join(RULES)}")
    if not 1 <= block <= num_blocks:
        raise ValueError(f"block {block} is outside 1..{num_blocks}")
    if distance < 0:
        raise ValueError(f"interlocking distance must be ≥ 0, got {distance}")
    if strategy == "global":
        return (num_blocks,)
    d = 0 if strategy == "local" else distance
    target = min(block + d, num_blocks)
    if rule == "sum" and strategy == "interlocking":
        return tuple(range(block, target + 1))
    return (target,)


@dataclass(frozen=True)
class StageRole:
    """Where one weight stage sits in the (possibly blockwise) pipeline.

    Members
    -------
    position: int
        1-based index among all stages in execution order (main stages first, then heads).
    block: int
        1-based block the stage belongs to (heads belong to the block they follow).
    head: bool
        True for an auxiliary-head stage.
    losses: tuple[int, ...]
        Losses that update this stage's weights (1-based; K is the true loss).
    delay: int
        D_s in updates: 2 × (stages between this one and its farthest updating loss, head
        stages included) + 1 (docs/architecture.md §2.4, *derived*).
    derivation: str
        The delay's derivation, for the plan report.
    streams: tuple[tuple[int, int], ...]
        The stage's backward streams as ``(loss t, delay D_{s,t})`` pairs, ascending t: the
        error of L_t reaches the stage at position p (main stage s: s; head stage h of block
        k: the end of block k + h) D_{s,t} = 2·(P_t − p) + 1 updates after the stage's forward
        of the same sample, P_t being the position of the stage feeding loss t (S for the true
        loss, the end of block t + the head's stages otherwise); 0 under ``sequential``.
        ``delay`` is the largest D_{s,t} of the update losses; a shorter stream is a
        pass-through stream or, under the ``sum`` rule, an earlier update loss
        (docs/numerics.md §7.2, *derived* from the tick model).
    """

    position: int
    block: int
    head: bool
    losses: tuple[int, ...]
    delay: int
    derivation: str
    streams: tuple[tuple[int, int], ...] = ()


def stage_layout(
    num_main_stages: int,
    schedule: str = "pb",
    strategy: str = "global",
    block_ends: Sequence[int] = (),
    distance: int = 0,
    rule: str = "only",
    head_stages: int = 1,
) -> list[StageRole]:
    """Return the role and delay of every stage: main stages 1..S, then one head per block < K.

    ``block_ends`` are the 1-based main stages after which a block ends (an auxiliary head is
    attached there); the last block always ends at stage S. ``head_stages`` is the number of
    weight stages in each auxiliary head (default 1: one Linear layer to the classes).
    With ``schedule="sequential"`` every delay is 0 (exact batch-1 SGD).

    Raises :class:`ValueError` for an unknown schedule, block ends that are not strictly
    increasing inside 1..S−1 (S itself: a head on the last block), no block end for
    ``local``/``interlocking``, or a stream that would reach a stage after the stage's own
    delay (a D_{s,t} > D_s, :attr:`StageRole.streams`: its stash holds D_s + 1 samples) — a
    pass-through stream from a head longer than the rest of the network, e.g. interlocking
    with ``head_stages`` 2 and a last block of one stage.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; supported: {', '.join(SCHEDULES)}")
    if num_main_stages < 1:
        raise ValueError("a pipeline needs at least one weight stage")
    ends = list(block_ends)
    if strategy == "global":
        ends = []
    given = ",".join(map(str, block_ends))
    if num_main_stages in ends:
        raise ValueError(
            f"--blocks {given}: a block boundary after stage {num_main_stages}, the last, would "
            "put an auxiliary head on the last block, whose loss is the true loss; block "
            f"boundaries must be strictly increasing stage numbers in 1..{num_main_stages - 1}"
        )
    if any(not 1 <= e < num_main_stages for e in ends) or ends != sorted(set(ends)):
        raise ValueError(
            f"--blocks {given}: block boundaries must be strictly increasing stage numbers in "
            f"1..{num_main_stages - 1} (the last block always ends at stage {num_main_stages})"
        )
    if strategy != "global" and not ends:
        raise ValueError(
            f"--strategy {getattr(strategy, 'value', strategy)} needs at least one block "
            "boundary: add --blocks (e.g. --blocks 1)"
        )
    ends.append(num_main_stages)
    num_blocks = len(ends)

    def block_of(stage: int) -> int:
        return next(k for k, e in enumerate(ends, start=1) if stage <= e)

    def loss_distance(block_t: int) -> int:
        # stages from the end of block t to its loss: the head for t < K, nothing for K
        return ends[block_t - 1], (head_stages if block_t < num_blocks else 0)

    roles: list[StageRole] = []
    for s in range(1, num_main_stages + 1):
        k = block_of(s)
        losses = update_losses(num_blocks, k, strategy, distance, rule)
        if schedule == "sequential":
            roles.append(StageRole(s, k, False, losses, 0, "sequential schedule: D = 0"))
            continue
        counts = []
        for t in losses:
            end_t, head_t = loss_distance(t)
            counts.append((end_t - s) + head_t)
        between = max(counts)
        t = losses[counts.index(between)]
        end_t, head_t = loss_distance(t)
        derivation = (
            f"2·(({end_t}−{s}) stages to the end of block {t} + {head_t} head stages)+1"
            if t < num_blocks
            else f"2·(S−s)+1 = 2·({num_main_stages}−{s})+1"
        )
        roles.append(StageRole(s, k, False, losses, 2 * between + 1, derivation))
    position = num_main_stages
    for k in range(1, num_blocks):
        for h in range(1, head_stages + 1):
            position += 1
            if schedule == "sequential":
                delay, why = 0, "sequential schedule: D = 0"
            else:
                delay = 2 * (head_stages - h) + 1
                why = f"head stage {h} of {head_stages}: 2·({head_stages}−{h})+1"
            trained_by = (num_blocks,) if strategy == "global" else (k,)
            roles.append(StageRole(position, k, True, trained_by, delay, why))
    return [
        _with_streams(r, roles, ends, schedule, strategy, distance, rule, head_stages)
        for r in roles
    ]


def _with_streams(
    r: StageRole,
    roles: list[StageRole],
    ends: list[int],
    schedule: str,
    strategy: str,
    distance: int,
    rule: str,
    head_stages: int,
) -> StageRole:
    """``r`` with its :attr:`StageRole.streams`; raises :class:`ValueError` for a stream beyond
    the stage's delay."""
    K = len(ends)
    S = ends[-1]
    P = {t: ends[t - 1] + (head_stages if t < K else 0) for t in range(1, K + 1)}
    if r.head:
        pos = ends[r.block - 1] + r.position - S - (r.block - 1) * head_stages
        streams = r.losses
    else:
        pos, streams = r.position, carried_losses(K, r.block, strategy, distance, rule)
    pairs = tuple((t, 0 if schedule == "sequential" else 2 * (P[t] - pos) + 1) for t in streams)
    t, far = max(pairs, key=lambda p: p[1])
    if far > r.delay:
        kind = "head stage" if r.head else "stage"
        raise ValueError(
            f"{kind} {r.position} would pass loss L{t}'s error back {far} updates after its "
            f"forward, beyond its delay D = {r.delay} (its stash holds D + 1 samples): use "
            "--head-stages 1, a longer last block (--blocks) or --rule sum"
        )
    return dataclasses.replace(r, streams=pairs)


def carried_losses(
    num_blocks: int, block: int, strategy: str, distance: int = 0, rule: str = "only"
) -> tuple[int, ...]:
    """Return the losses whose error a main stage of 1-based ``block`` back-propagates: loss t
    if t ≥ k and t updates some block j ≤ k (its update losses plus pass-through streams,
    docs/architecture.md §2.4). Raises :class:`ValueError` as :func:`update_losses`."""
    return tuple(
        t
        for t in range(block, num_blocks + 1)
        if any(
            t in update_losses(num_blocks, j, strategy, distance, rule) for j in range(1, block + 1)
        )
    )


def same_as_global(strategy: str, num_blocks: int, distance: int, rule: str = "only") -> bool:
    """True when interlocking learning updates every block from the true loss alone, as
    ``global`` does: rule ``only`` with distance d ≥ K − 1 (e.g. 2 blocks, d = 1; Gomez et
    al. 2022 §3: d = K − 1 is global). Its auxiliary heads would then train without changing
    any block (docs/architecture.md §2.4)."""
    return strategy == "interlocking" and rule == "only" and distance >= num_blocks - 1


def tick_streams(stages: Sequence[Any]) -> list[tuple[tuple[int, int], ...]]:
    """Per stage its backward streams as ``(loss t, D_{s,t})`` of the ``pb`` tick model,
    whatever the schedule: the error of L_t reaches the stage at position ``p`` in tick
    ``D_{s,t} = 2·(P_t − p) + 1`` after its forward (docs/numerics.md §7.2). ``stages`` in plan
    order (main stages, then the head stages in block order), each with ``attach``, ``role``,
    ``losses`` and ``grad_losses`` (a :class:`~pipetrain.compiler.plan.Stage` or the
    builder's slot). Under ``pb`` this is ``StageRole.streams``; ``sequential`` runs the same
    ticks with one sample in flight, so its passes follow these delays too (hdl/tick.py).
    Source: *derived* (numerics §7.2)."""
    n = len(stages)
    pos: list[int] = []
    read = [False] * n
    for st in stages:
        pos.append(pos[st.attach - 1] + 1 if st.attach else 1)
        if st.attach:
            read[st.attach - 1] = True
    mains = [i for i, st in enumerate(stages) if st.role == "main"]
    feeds = [i for i in range(len(mains), n) if not read[i]] + [mains[-1]]
    P = {t: pos[i] for t, i in enumerate(feeds, start=1)}
    return [
        tuple((t, 2 * (P[t] - pos[i]) + 1) for t in sorted(st.grad_losses or st.losses))
        for i, st in enumerate(stages)
    ]


def main_stream(losses: Sequence[int], streams: Sequence[tuple[int, int]] | None) -> int:
    """The stream that makes a stage's update (``hdl/stage.py``, the golden model's
    ``main_loss``): the update loss whose error arrives last, the largest delay ``D_{s,t}`` of
    ``streams`` (ties: the larger loss); ``losses[0]`` without streams (``global``). The other
    update losses (the ``sum`` rule) are earlier update streams whose δ waits for it
    (docs/numerics.md §5.6). Source: *derived* (numerics §5.6, §7.2)."""
    if not streams or len(losses) == 1:
        return losses[0]
    delay = dict(streams)
    return max(losses, key=lambda t: (delay[t], t))


def early_update_streams(
    losses: Sequence[int], streams: Sequence[tuple[int, int]] | None
) -> tuple[tuple[int, bool], ...]:
    """The ``sum`` rule's earlier update streams of a stage: ``(loss t, stored)`` ascending,
    every update loss but :func:`main_stream`; ``stored`` when its error arrives in an earlier
    tick than the main stream's (``D_{s,t} < D_s``: its δ waits in the stage's ``dsum_l<t>``
    memory, one entry per stash entry), else it arrives in the same tick and is summed at once
    (docs/architecture.md §2.4). Source: *derived* (numerics §5.6)."""
    main = main_stream(losses, streams)
    delay = dict(streams or ())
    return tuple((t, delay.get(t, 0) < delay.get(main, 0)) for t in sorted(losses) if t != main)


def spike_compensation(momentum: float, delay: int) -> tuple[float, float]:
    """Return the Spike Compensation coefficients (a, b) = (m^D, (1−m^D)/(1−m)).

    The update becomes w ← w − η·(a·v + b·g). D=0 gives (1, 0), plain momentum; D=1 gives
    (m, 1), exactly PyTorch's Nesterov momentum. For m = 0 the limit b = D·… is handled
    (b = 1 for D ≥ 1, since m^D = 0). Source: Kosson et al. 2021 §3.2.

    Raises :class:`ValueError` for a negative delay or a momentum outside [0, 1).
    """
    if delay < 0:
        raise ValueError(f"delay must be ≥ 0, got {delay}")
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}")
    a = momentum**delay
    b = sum(momentum**i for i in range(delay))  # (1 − m^D)/(1 − m), exact also for m = 0
    return a, b


def batch1_scaling(lr_ref: float, momentum_ref: float, batch_ref: int) -> tuple[float, float]:
    """Scale reference hyperparameters at batch ``batch_ref`` to batch size 1.

    Returns (η₁, m₁) with m₁ = m_ref^(1/B_ref) and η₁ = η_ref·(1/B_ref)·(1−m₁)/(1−m_ref), so
    the effective step η/(1−m) per sample and the momentum's memory in samples are kept.
    Weight decay is unchanged. Source: *derived*, docs/architecture.md §2.3.

    Raises :class:`ValueError` for batch_ref < 1 or a momentum outside [0, 1).
    """
    if batch_ref < 1:
        raise ValueError(f"reference batch size must be ≥ 1, got {batch_ref}")
    if not 0.0 <= momentum_ref < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum_ref}")
    if momentum_ref == 0.0:
        return lr_ref / batch_ref, 0.0
    m1 = momentum_ref ** (1.0 / batch_ref)
    lr1 = lr_ref / batch_ref * (1.0 - m1) / (1.0 - momentum_ref)
    return lr1, m1


def naive_overshoot(momentum_ref: float, batch_ref: int) -> float:
    """Return how far the naive rule (η linear, m by the root) overshoots the effective step.

    The factor is (1−m_ref)/(1−m₁), ≈121 for B_ref=128, m_ref=0.9 (docs/architecture.md §2.3).
    """
    m1 = momentum_ref ** (1.0 / batch_ref)
    return (1.0 - momentum_ref) / (1.0 - m1) if momentum_ref > 0 else 1.0


def lwp_horizon(delay: int, mitigation: str) -> int:
    """Return the LWP prediction horizon (the stage's delay if LWP is on, else 0)."""
    return delay if parse(Mitigation, mitigation, "mitigation").lwp else 0


def ceil_log2(n: int) -> int:
    """Return ⌈log2 n⌉ for n ≥ 1 (0 for n = 1)."""
    return max(0, math.ceil(math.log2(n))) if n > 1 else 0
