"""Training configuration: the user's settings before they become hardware decisions."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import UserError
from .enums import Activation, Loss, LwpForm, Mitigation, Rounding, Rule, Schedule, Strategy, parse
from .schedule import batch1_scaling, same_as_global, stage_layout

__all__ = [
    "TrainConfig",
    "ConfigError",
    "strategy_overrides",
    "check_strategy_options",
    "global_if_same",
    "local_if_distance_zero",
]

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
    momentum_digits: 0, or the most canonical signed digits of the hardware's momentum constant
        (:meth:`~pipetrain.compiler.plan.Const.signed_digits`: 0.9 at 4 digits is 0.8984375,
        so a lane forms ``m·u`` with 3 adders instead of 8; docs/numerics.md §1). 0 keeps the
        plan's ``const_bits`` significant bits (0.9: 9 digits).
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
    lfsr_leap: 0, or the LFSR steps per stochastic-rounding draw (docs/numerics.md §6; 0: the
        LFSR's width, 32). A draw must give fresh bits for every rounding of a slot: ≥ 16
        (``round_bits``), ≥ 32 with Spike Compensation (two roundings). 16 makes the draw a
        16-step leap matrix — 41 LUT4 a lane on the ECP5 instead of 124 (docs/boards.md §3).
    seed: seed of the network initialisation, data order and the LFSR seeds (derived).
    epochs: passes over the training set.
    """

    schedule: Schedule = Schedule.PB
    lr: float = 0.002
    momentum: float = 0.9
    momentum_digits: int = 0
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
    lfsr_leap: int = 0
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
        if not 0 <= self.momentum_digits <= 18:
            raise ConfigError(
                f"--momentum-digits {self.momentum_digits}: give 0 (the full-precision "
                "constant) or 1..18 signed digits"
            )
        if self.lfsr_leap < 0:
            raise ConfigError(
                f"--lfsr-leap {self.lfsr_leap}: give 0 (the LFSR's width) or the steps per draw"
            )
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


def strategy_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """Check the learning-strategy options a command was given and return them normalised.

    ``overrides``: the TrainConfig fields given on the command line (only those given). With
    an explicit ``strategy``, an option that strategy cannot use is a :class:`ConfigError`
    naming the option and the strategies that take it (``--blocks 2`` with ``global``,
    ``--distance`` or ``--rule`` with ``local``). Without one, the strategy is the model
    file's or the default, known only when the config is merged:
    :func:`check_strategy_options` runs then (the compile step), as does
    :func:`global_if_same` once the network's stage count is known. Source: *derived*
    (docs/architecture.md §2.4).
    """
    out = dict(overrides)
    strategy = out.get("strategy")
    if strategy is None:
        return out
    strategy = getattr(strategy, "value", strategy)
    for field_, (opt, users) in _STRATEGY_OPTIONS.items():
        if field_ in out and strategy not in users:
            raise ConfigError(
                f"{opt} applies to --strategy {' or '.join(users)}, not {strategy}: drop "
                f"{opt} or choose --strategy {users[-1]}"
            )
    return out


def check_strategy_options(
    config: TrainConfig, given: Mapping[str, Any], from_file: bool = False
) -> None:
    """Refuse a strategy option among ``given`` (the TrainConfig fields a caller set on top
    of the model file's config or the defaults) that the merged ``config``'s strategy does not
    use: ``--distance`` or ``--rule`` without ``--strategy interlocking`` would be ignored.
    ``from_file``: the strategy came from the model file's ``config`` (named in the message).

    Raises :class:`ConfigError` naming the option and ``--strategy``. Source: *derived*.
    """
    strategy = config.strategy.value
    for field_, (opt, users) in _STRATEGY_OPTIONS.items():
        if field_ in given and strategy not in users:
            where = "the model file's config" if from_file else "the default"
            raise ConfigError(
                f"{opt} applies to --strategy {' or '.join(users)}, and the strategy is "
                f"{strategy} ({where}): add --strategy {users[-1]}, or drop {opt}"
            )


def global_if_same(
    config: TrainConfig, stages: int, given: Mapping[str, Any]
) -> tuple[TrainConfig, str | None]:
    """Return ``config`` as ``global`` learning, with a warning line, when a caller's
    strategy options (``given``: TrainConfig fields set on top of the model file's config)
    ask for interlocking learning that equals it (rule ``only``, d ≥ K − 1 with K = blocks +
    1, :func:`~.schedule.same_as_global`): the plan then builds no auxiliary head that would
    change nothing. Otherwise ``(config, None)``. ``stages``: the network's main stages S;
    the block boundaries are checked against it first (1..S − 1, increasing), so a bad
    ``--blocks`` is refused whether or not the strategy collapses.

    Interlocking with distance 0 is local learning instead: it returns
    :func:`local_if_distance_zero`'s config and warning, whatever the options' source.

    Raises :class:`ConfigError` for bad block boundaries. Source: *derived*
    (docs/architecture.md §2.4; Gomez et al. 2022 §3: d = K − 1 is global).
    """
    local, note = local_if_distance_zero(config)
    if note is not None:
        return local, note
    if not any(k in given for k in ("strategy", *_STRATEGY_OPTIONS)):
        return config, None
    K, d, rule = len(config.blocks) + 1, config.distance, config.rule.value
    if not config.blocks or not same_as_global(config.strategy.value, K, d, rule):
        return config, None
    try:
        stage_layout(stages, config.schedule.value, "interlocking", config.blocks, d, rule,
                     config.head_stages)  # fmt: skip
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    differ = f"at least {d + 1} block boundaries (--blocks, K ≥ d + 2 = {d + 2} blocks)"
    if d > 1:
        differ += " or a smaller --distance (d < K − 1)"
    note = (
        f"interlocking with {K} blocks and distance {d} updates every block from the true loss "
        "alone (d ≥ K − 1): it is global learning; training it as global, without auxiliary "
        f"heads (interlocking differs with {differ}, or with --rule sum; --distance 0 is local "
        "learning)"
    )
    plain = config.replace(strategy="global", blocks=(), distance=1, rule="only", head_stages=1)
    return plain, note


def local_if_distance_zero(config: TrainConfig) -> tuple[TrainConfig, str | None]:
    """Return ``config`` as ``local`` learning, with a warning line, when it is interlocking
    with distance d = 0: block k is then updated by its own loss L_k alone under either rule
    (``only``: L_min(k+0, K); ``sum``: L_k … L_min(k+0, K)), which is local learning, and the
    plan is the local one but for its strategy label. Otherwise ``(config, None)``. The
    distance 0 is documented as local (docs/architecture.md §2.4), so this is a warning, not
    an error. Source: *derived* (:func:`~.schedule.update_losses`; Gomez et al. 2022 §3)."""
    if config.strategy != Strategy.INTERLOCKING or config.distance != 0:
        return config, None
    note = (
        "--distance 0 with --strategy interlocking is local learning (block k is updated by "
        "its own loss L_k alone): training it as --strategy local, the same plan; say "
        "--strategy local, or give --distance 1 or more for interlocking learning"
    )
    return config.replace(strategy="local", distance=1, rule="only"), note
