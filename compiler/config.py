"""Training configuration: the user's settings before they become hardware decisions."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..errors import UserError
from .enums import Activation, Loss, LwpForm, Mitigation, Rounding, Rule, Schedule, Strategy, parse
from .schedule import batch1_scaling, same_as_global

__all__ = ["TrainConfig", "ConfigError", "strategy_overrides"]

#: Accepted values (CLI choices), from the enums.
LOSSES = tuple(m.value for m in Loss)
ROUNDINGS = tuple(m.value for m in Rounding)
ACTIVATIONS = tuple(m.value for m in Activation)


class ConfigError(UserError, ValueError):
    """A training setting is invalid; the message names the setting and the accepted values."""


@dataclass(frozen=True)
class TrainConfig:
    """Training settings at batch size 1.

    Hyperparameters are given as reference values at batch ``batch_ref`` and scaled to batch 1
    with :func:`pipetrain.compiler.schedule.batch1_scaling` (docs/architecture.md §2.3); with
    ``batch_ref=1``
    they are used as given.

    Members
    -------
    schedule: ``pb`` (Pipelined Backpropagation, D_s = 2(S−s)+1) or ``sequential`` (D = 0).
    lr, momentum, weight_decay: reference η, m, λ (PyTorch SGD conventions).
    batch_ref: reference batch size B_ref (samples).
    mitigation: ``none | sc | lwp | sc+lwp`` (Spike Compensation, Linear Weight Prediction).
    lwp_form: ``v`` (ŵ = w − η·D·v) or ``w`` (ŵ = w + D·(w_t − w_{t−1})).
    strategy: ``global | local | interlocking``.
    distance: interlocking distance d (blocks).
    rule: ``only`` or ``sum`` (which losses a block receives under interlocking).
    blocks: 1-based main stages after which a block ends (auxiliary heads attach there).
    head_stages: weight stages per auxiliary head (1 = one Linear layer to the classes).
    loss: ``cross_entropy`` or ``mse``.
    rounding: rounding of weight/velocity updates in fixed point (``stochastic`` from the
        per-stage LFSR, or ``nearest_even``).
    seed: seed of the network initialisation, data order and the LFSR seeds (derived).
    epochs: passes over the training set.
    """

    schedule: Schedule = Schedule.PB
    lr: float = 0.002
    momentum: float = 0.9
    weight_decay: float = 0.0
    batch_ref: int = 1
    mitigation: Mitigation = Mitigation.NONE
    lwp_form: LwpForm = LwpForm.V
    strategy: Strategy = Strategy.GLOBAL
    distance: int = 1
    rule: Rule = Rule.ONLY
    blocks: tuple[int, ...] = field(default_factory=tuple)
    head_stages: int = 1
    loss: Loss = Loss.CROSS_ENTROPY
    rounding: Rounding = Rounding.STOCHASTIC
    seed: int = 0
    epochs: int = 1

    def __post_init__(self) -> None:
        kinds = {
            "schedule": Schedule,
            "mitigation": Mitigation,
            "lwp_form": LwpForm,
            "strategy": Strategy,
            "rule": Rule,
            "loss": Loss,
            "rounding": Rounding,
        }
        for name, kind in kinds.items():
            try:
                object.__setattr__(self, name, parse(kind, getattr(self, name), name))
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if self.lr <= 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay must be ≥ 0, got {self.weight_decay}")
        if self.batch_ref < 1:
            raise ConfigError(f"batch_ref must be ≥ 1, got {self.batch_ref}")
        if self.distance < 0:
            raise ConfigError(
                f"--distance {self.distance}: the interlocking distance must be ≥ 0 "
                "(0 trains each block by its own head, as local; K − 1 is global)"
            )
        if self.rule == Rule.SUM and self.strategy != Strategy.INTERLOCKING:
            raise ConfigError(
                f"--rule sum needs --strategy interlocking (the strategy is "
                f"{self.strategy.value}): the rule says which losses an interlocking block sums"
            )
        if self.head_stages < 1:
            raise ConfigError(
                f"--head-stages {self.head_stages}: an auxiliary head needs ≥ 1 stage"
            )
        if self.strategy == Strategy.GLOBAL and (self.blocks or self.head_stages != 1):
            opt = "--blocks" if self.blocks else "--head-stages"
            raise ConfigError(
                f"{opt} applies to --strategy local or interlocking, and the strategy is global "
                f"(the default): add --strategy local or --strategy interlocking, or drop {opt}"
            )
        if self.epochs < 1:
            raise ConfigError(f"epochs must be ≥ 1, got {self.epochs}")
        object.__setattr__(self, "blocks", tuple(int(b) for b in self.blocks))

    @property
    def lr1(self) -> float:
        """η at batch 1 (scaled from the reference values)."""
        return batch1_scaling(self.lr, self.momentum, self.batch_ref)[0]

    @property
    def momentum1(self) -> float:
        """m at batch 1 (scaled from the reference values)."""
        return batch1_scaling(self.lr, self.momentum, self.batch_ref)[1]

    def replace(self, **changes: Any) -> TrainConfig:
        """Return a copy with ``changes`` applied; ``None`` values are ignored (CLI overrides)."""
        changes = {k: v for k, v in changes.items() if v is not None}
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        d = dataclasses.asdict(self)
        d["blocks"] = list(self.blocks)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> TrainConfig:
        """Build from a dict (e.g. a model file's ``config``); unknown keys are an error."""
        if d is None:
            return cls()
        if isinstance(d, TrainConfig):
            return d
        if not isinstance(d, dict):
            raise ConfigError(f"config must be a dict or TrainConfig, got {type(d).__name__}")
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(
                f"unknown config keys: {', '.join(sorted(unknown))}; known: "
                + ", ".join(f.name for f in dataclasses.fields(cls))
            )
        return cls(**d)


#: The options of each learning setting and the strategies that use them (CLI names).
_STRATEGY_OPTIONS = {
    "blocks": ("--blocks", ("local", "interlocking")),
    "head_stages": ("--head-stages", ("local", "interlocking")),
    "distance": ("--distance", ("interlocking",)),
    "rule": ("--rule", ("interlocking",)),
}


def strategy_overrides(overrides: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """Check the learning-strategy options a command was given and return them normalised,
    with a warning line or None.

    ``overrides``: the TrainConfig fields given on the command line (only those given). With
    an explicit ``strategy``, an option that strategy cannot use is a :class:`ConfigError`
    naming the option and the strategies that take it (``--blocks 2`` with ``global``,
    ``--distance`` or ``--rule`` with ``local``). Interlocking learning that equals ``global``
    (rule ``only``, d ≥ K − 1 with K = blocks + 1, :func:`~.schedule.same_as_global`) becomes
    ``global`` without the blocks, so the plan builds no head that would change nothing, and
    the warning says so. Source: *derived* (docs/architecture.md §2.4).
    """
    out = dict(overrides)
    strategy = out.get("strategy")
    if strategy is None:
        return out, None
    strategy = getattr(strategy, "value", strategy)
    for field_, (opt, users) in _STRATEGY_OPTIONS.items():
        if field_ in out and strategy not in users:
            raise ConfigError(
                f"{opt} applies to --strategy {' or '.join(users)}, not {strategy}: drop "
                f"{opt} or choose --strategy {users[-1]}"
            )
    if strategy != "interlocking":
        return out, None
    blocks = tuple(out.get("blocks", ()))
    distance = int(out.get("distance", TrainConfig.distance))
    rule = getattr(out.get("rule", "only"), "value", out.get("rule", "only"))
    if blocks and same_as_global("interlocking", len(blocks) + 1, distance, rule):
        for k in ("blocks", "distance", "rule", "head_stages"):
            out.pop(k, None)
        out["strategy"] = "global"
        note = (
            f"interlocking with {len(blocks) + 1} blocks and distance {distance} updates every "
            "block from the true loss alone: it is global learning; training it as global, "
            "without auxiliary heads (use a smaller --distance or more --blocks for "
            "interlocking)"
        )
        return out, note
    return out, None
