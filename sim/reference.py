"""Float Pipelined-Backpropagation reference trainer: the algorithmic truth (docs/architecture.md
§5, rung 1).

:class:`ReferenceTrainer` trains an ``nn.Sequential``-style net of ``Linear`` layers and
elementwise activations at batch size 1 with the schedules, mitigations and learning strategies
of docs/architecture.md §2, in float PyTorch. Backpropagation is written out by hand, one **stage**
per
``Linear`` layer together with the activation that follows it, so that the forward and the
backward of a sample can use different weight versions.

Weight versions (docs/architecture.md §2.1, *derived*): version k of a stage is its weights after k
updates.
For sample n (0-based, counted from the start of training)

* the forward at stage s uses version max(b, n − D_s), where b is the version at the last
  pipeline flush (0 before any): the stage keeps a queue of its last D_s + 1 versions and the
  forward reads the oldest one;
* every backward — the input gradient and the weight gradient — uses version n, the newest;
* the gradient outer(δ_s, x_s) (plus weight decay) makes version n + 1.

This "version-queue" formulation processes one sample completely before the next and gives
bit-identical weights to the tick-by-tick model of the hardware
(:class:`pipetrain.sim.reference_tick.PBTickSimulator`; a test checks it). A flush
(:meth:`ReferenceTrainer.flush`) collapses each queue to its newest version, because after
the hardware drains its pipeline the next sample's forward sees every update so far.

Local and interlocking learning (docs/architecture.md §2.4): the net is split into K blocks at
``config.blocks``; block k < K gets an auxiliary head (``config.head_stages`` Linear layers to
the classes, ReLU between, seeded init) on its detached output. Which loss updates which
block comes from :func:`pipetrain.compiler.schedule.update_losses` (through
:func:`~pipetrain.compiler.schedule.stage_layout` or the plan). The gradient of loss L_t runs
back from its output to the first stage of the lowest block it updates; blocks on the way that
L_t does not update pass it through (input gradients only). Per sample, the errors of all
losses that update a stage are summed before its single update. *Derived choice* (the tick
model's causality, docs/numerics.md §7.2): every forward (main and head stages) uses version
n − D_s with the stage's own D_s from the layout; the update and the backward of the stream
that defines D_s use version n; a stream of loss L_t that reaches the stage earlier — a
pass-through stream, or an earlier update loss under the ``sum`` rule — forms its input
gradient with the version the stage holds when it arrives, n − (D_s − D_{s,t}) (clipped at
the last flush), D_{s,t} = 2·(P_t − s) + 1 being that stream's delay.

Updates, in velocity-in-weight-units form u = η·v (the form of ``docs/numerics.md`` §5, so the
plan's constants are used directly)::

    P  = outer(δ, [x, 1])                         # bias column last
    u' = m·u + η·P + ηλ·w                         # = η·(m·v + g + λw): PyTorch SGD momentum
    w' = w − u'                                   # no Spike Compensation
    w' = w − (a·u' + bη·P + bηλ·w)                # SC: a = m^D, b = (1−m^D)/(1−m)

Linear Weight Prediction (forward only, horizon H = D_s, on the forward version's values):
``v`` form ŵ = w − H·u (= w − η·D·v); ``w`` form ŵ = w + H·(w − w_prev), w_prev the weights
before that version's last update (w_prev = w for version 0).

Sources: Kosson et al., "Pipelined Backpropagation at Scale", MLSys 2021, §3 (PB, SC, LWP);
Gomez et al., "Interlocking Backpropagation", JMLR 2022, §3; the version bookkeeping is
*derived* from the tick model (docs/architecture.md §2.1).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..compiler.config import ConfigError, TrainConfig
from ..compiler.conv import ConvGeometry
from ..compiler.enums import unknown
from ..compiler.frontend import trace
from ..compiler.models import ModelError
from ..compiler.plan import Plan
from ..compiler.schedule import lwp_horizon, spike_compensation, stage_layout
from .heads import seeded_linear
from .reference_conv import ConvStage, one_thread
from .trainer import accuracy, stream_epochs

__all__ = [
    "SUPPORTED_MODULES",
    "RANGE_KEYS",
    "UnsupportedModelError",
    "StageSpec",
    "UpdateRule",
    "parse_model",
    "ReferenceTrainer",
]

#: Module types the reference trainer understands (``nn.Sequential`` nests are flattened).
SUPPORTED_MODULES: tuple[type[nn.Module], ...] = (
    nn.Linear,
    nn.ReLU,
    nn.LeakyReLU,
    nn.Tanh,
    nn.Sigmoid,
    nn.Flatten,
    nn.Identity,
    nn.Conv1d,
    nn.Conv2d,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.AvgPool1d,
    nn.AvgPool2d,
)
_CONV_TYPES = (nn.Conv1d, nn.Conv2d)
_ACT_TYPES = {nn.ReLU: "relu", nn.LeakyReLU: "leaky_relu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid"}
_SUPPORTED_TEXT = "nn.Sequential of " + ", ".join(f"nn.{t.__name__}" for t in SUPPORTED_MODULES)

#: Keys of :attr:`ReferenceTrainer.ranges` (see there).
RANGE_KEYS = ("x", "y", "d", "gin", "w", "u", "p")


class UnsupportedModelError(ModelError):
    """The model has a layer or structure the reference trainer cannot train.

    The message names the module path, its type and the supported set.
    """


@dataclass(frozen=True)
class StageSpec:
    """One weight stage: a Linear layer and the activation that follows it.

    Members
    -------
    name: module path of the Linear layer in the user's model (``""`` for auxiliary heads).
    in_features, out_features: N and M (elements).
    bias: whether the layer has a bias (a bias-free layer keeps its bias column at 0).
    activation: ``relu``, ``leaky_relu``, ``tanh``, ``sigmoid`` or ``identity``.
    negative_slope: LeakyReLU slope (0.0 otherwise).
    head: True for an auxiliary-head stage.
    conv: a convolution stage's geometry, its pooling included (None for Linear; then
        ``in_features`` / ``out_features`` are the values of one input / output sample).
    """

    name: str
    in_features: int
    out_features: int
    bias: bool = True
    activation: str = "identity"
    negative_slope: float = 0.0
    head: bool = False
    conv: ConvGeometry | None = None


@dataclass(frozen=True)
class UpdateRule:
    """Float constants of one stage's update and LWP (the ``.real`` of the plan's constants).

    Members
    -------
    momentum: m.
    lr: η.
    lr_wd: η·λ.
    sc: Spike Compensation on.
    sc_a: a = m^D (1 without SC).
    sc_lr_b: b·η, b = (1−m^D)/(1−m) (0 without SC).
    sc_lr_wd_b: b·η·λ.
    lwp_horizon: H in updates (0 = no LWP).
    lwp_form: ``v`` or ``w``.
    """

    momentum: float
    lr: float
    lr_wd: float
    sc: bool
    sc_a: float
    sc_lr_b: float
    sc_lr_wd_b: float
    lwp_horizon: int
    lwp_form: str

    @classmethod
    def from_config(cls, config: TrainConfig, delay: int) -> UpdateRule:
        """Constants for a stage of delay ``delay`` (updates) from ``config``'s batch-1 values.

        SC coefficients from :func:`~pipetrain.compiler.schedule.spike_compensation`, the LWP
        horizon from :func:`~pipetrain.compiler.schedule.lwp_horizon` (the same calls the
        plan builder makes).
        """
        m, lr, wd = config.momentum1, config.lr1, config.weight_decay
        sc = config.mitigation.sc
        a, b = spike_compensation(m, delay) if sc else (1.0, 0.0)
        return cls(
            momentum=m,
            lr=lr,
            lr_wd=lr * wd,
            sc=sc,
            sc_a=a,
            sc_lr_b=b * lr,
            sc_lr_wd_b=b * lr * wd,
            lwp_horizon=lwp_horizon(delay, config.mitigation),
            lwp_form=config.lwp_form,
        )

    @classmethod
    def from_plan_stage(cls, stage) -> UpdateRule:  # stage: pipetrain.compiler.plan.Stage
        """Constants of a plan stage (its ``update``'s ``.real`` values; nothing recomputed)."""
        c = stage.update
        return cls(
            momentum=c.momentum.real,
            lr=c.lr.real,
            lr_wd=c.lr_wd.real,
            sc=c.sc,
            sc_a=c.sc_a.real if c.sc else 1.0,
            sc_lr_b=c.sc_lr_b.real if c.sc else 0.0,
            sc_lr_wd_b=c.sc_lr_wd_b.real if c.sc else 0.0,
            lwp_horizon=c.lwp_horizon,
            lwp_form=c.lwp_form,
        )


def _path(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _flatten(module: nn.Module, prefix: str, out: list[tuple[str, nn.Module]]) -> None:
    for name, child in module.named_children():
        path = _path(prefix, name)
        if type(child) is nn.Sequential:
            _flatten(child, path, out)
        elif type(child) in SUPPORTED_MODULES:
            out.append((path, child))
        else:
            raise UnsupportedModelError(
                f"module {path!r} is a {type(child).__module__}.{type(child).__name__}; the "
                f"reference trainer supports {_SUPPORTED_TEXT}"
            )


def parse_model(model: nn.Module) -> list[tuple[StageSpec, nn.Module]]:
    """Split ``model`` into stages: each Linear with the (at most one) activation after it.

    Nested ``nn.Sequential`` containers are flattened; ``Flatten`` and ``Identity`` are
    no-ops on a sample that is already a vector (N,). A model with ``Conv1d``/``Conv2d``
    layers is read by the compiler's front end (:func:`pipetrain.compiler.frontend.trace`,
    which gives each convolution its geometry: the input shape from ``model.input_shape`` or
    inferred; it raises its ``CompileError``, a :class:`ModelError`).

    Raises :class:`UnsupportedModelError` for a model that is not an ``nn.Sequential`` (or a
    single ``nn.Linear``), a module type outside :data:`SUPPORTED_MODULES`, an activation
    before the first Linear or two activations in a row, no Linear at all, or consecutive
    Linear layers whose sizes do not chain.
    """
    if type(model) is nn.Linear:
        items: list[tuple[str, nn.Module]] = [("", model)]
    elif type(model) is nn.Sequential:
        items = []
        _flatten(model, "", items)
    else:
        raise UnsupportedModelError(
            f"module '(root)' is a {type(model).__module__}.{type(model).__name__}; the "
            f"reference trainer supports {_SUPPORTED_TEXT}"
        )
    if any(type(mod) in _CONV_TYPES for _, mod in items):
        modules = dict(model.named_modules())
        ir = trace(model, type(model).__name__)
        out = []
        for ly in ir.layers:
            mod = modules[ly.name]
            bias = mod.bias is not None
            act, slope = str(ly.activation), float(ly.negative_slope)
            spec = StageSpec(ly.name, ly.in_features, ly.out_features, bias, act, slope)
            out.append((dataclasses.replace(spec, conv=ly.conv), mod))
        return out
    stages: list[list] = []  # [path, linear, activation, slope]
    for path, mod in items:
        if type(mod) is nn.Linear:
            if stages and stages[-1][1].out_features != mod.in_features:
                raise UnsupportedModelError(
                    f"module {path!r} (nn.Linear) takes {mod.in_features} inputs but the "
                    f"layer before it gives {stages[-1][1].out_features}"
                )
            stages.append([path, mod, "identity", 0.0])
        elif type(mod) in _ACT_TYPES:
            if not stages:
                raise UnsupportedModelError(
                    f"module {path!r} ({type(mod).__name__}) comes before the first nn.Linear; "
                    "a stage is a Linear layer followed by at most one activation"
                )
            if stages[-1][2] != "identity":
                raise UnsupportedModelError(
                    f"module {path!r} ({type(mod).__name__}) is a second activation after "
                    f"nn.Linear {stages[-1][0]!r}; a stage has at most one activation"
                )
            stages[-1][2] = _ACT_TYPES[type(mod)]
            if type(mod) is nn.LeakyReLU:
                stages[-1][3] = float(mod.negative_slope)
    if not stages:
        raise UnsupportedModelError(
            f"the model has no nn.Linear layer; the reference trainer supports {_SUPPORTED_TEXT}"
        )
    return [
        (StageSpec(p, lin.in_features, lin.out_features, lin.bias is not None, act, slope), lin)
        for p, lin, act, slope in stages
    ]


# --------------------------------------------------------------------------------------------
# Stage arithmetic shared by the version-queue trainer and the tick-by-tick simulator (so the
# two perform the very same float operations and agree bit for bit).


class Version(NamedTuple):
    """One weight version of a stage.

    Members
    -------
    w: weights (M, N+1), bias column last.
    u: velocity in weight units (M, N+1), u = η·v.
    prev: weights before this version's last update (LWP ``w`` form); ``w`` for version 0.
    index: the version number k (updates applied since the start).
    """

    w: torch.Tensor
    u: torch.Tensor
    prev: torch.Tensor
    index: int


class _Stage:
    """Runtime state of one stage: spec, constants, delay, and its queue of weight versions."""

    def __init__(
        self, spec: StageSpec, rule: UpdateRule, delay: int, w: torch.Tensor, keep: int
    ) -> None:
        self.spec = spec
        self.rule = rule
        self.delay = delay
        self.n = spec.in_features
        self.one = torch.tensor([1.0 if spec.bias else 0.0], dtype=w.dtype)
        self.queue: deque[Version] = deque([Version(w, torch.zeros_like(w), w, 0)], maxlen=keep)

    @property
    def current(self) -> Version:
        return self.queue[-1]

    def collapse(self) -> None:
        """Keep only the newest version (pipeline flushed)."""
        newest = self.queue[-1]
        self.queue.clear()
        self.queue.append(newest)

    def forward_weights(self, ver: Version) -> torch.Tensor:
        """ŵ of ``ver``: LWP prediction with horizon H, or the weights themselves."""
        h = self.rule.lwp_horizon
        if h == 0:
            return ver.w
        if self.rule.lwp_form == "v":
            return torch.add(ver.w, ver.u, alpha=-h)
        return torch.add(ver.w, ver.w - ver.prev, alpha=h)

    def forward(
        self, w: torch.Tensor, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return (x_aug (N+1,), z (M,), a (M,)) of input ``x`` (N,) with weights ``w``."""
        x_aug = torch.cat((x, self.one))
        z = torch.mv(w, x_aug)
        act = self.spec.activation
        if act == "relu":
            a = torch.relu(z)
        elif act == "leaky_relu":
            a = F.leaky_relu(z, self.spec.negative_slope)
        elif act == "tanh":
            a = torch.tanh(z)
        elif act == "sigmoid":
            a = torch.sigmoid(z)
        elif act == "identity":
            a = z
        else:
            unknown(act, "activation")
        return x_aug, z, a

    def delta(self, g: torch.Tensor, z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Return δ = g ⊙ act'(z) (M,) from the error ``g`` (M,) at the stage output."""
        act = self.spec.activation
        if act == "relu":
            return g * (z > 0)
        if act == "leaky_relu":
            return torch.where(z > 0, g, g * self.spec.negative_slope)
        if act == "tanh":
            return g * (1.0 - a * a)
        if act == "sigmoid":
            return g * a * (1.0 - a)
        if act == "identity":
            return g
        unknown(act, "activation")

    def input_grad(self, w: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """Return ∂L/∂x (N,) = W[:, :N]ᵀ δ with weights ``w`` (the bias column excluded)."""
        return torch.mv(w[:, : self.n].t(), d)

    def update(self, ver: Version, x_aug: torch.Tensor, d: torch.Tensor) -> Version:
        """Apply the momentum (and SC) update with P = outer(δ, x_aug); return the new version."""
        return self.step(ver, lambda t, a, b=1.0: torch.addr(t, d, x_aug, beta=b, alpha=a))

    def step(self, ver: Version, add_p: Callable[..., torch.Tensor]) -> Version:
        """The momentum (and SC) update of docs/architecture.md §2 (PyTorch SGD convention):
        u ← m·u + η·P (+ η·λ·w); w ← w − u, or with SC w ← w − a·u − b·η·λ·w − b·η·P; return
        the new version. ``add_p(t, α, β=1)`` returns β·t + α·P — the Linear stage's P =
        outer(δ, x_aug) (one ``torch.addr``), a convolution's sum over its positions
        (sim/reference_conv.py) — so both stages share this one update."""
        r = self.rule
        u = add_p(ver.u, r.lr, r.momentum)
        if r.lr_wd:
            u.add_(ver.w, alpha=r.lr_wd)
        if r.sc:
            w = torch.add(ver.w, u, alpha=-r.sc_a)
            if r.sc_lr_wd_b:
                w.add_(ver.w, alpha=-r.sc_lr_wd_b)
            w = add_p(w, -r.sc_lr_b)
        else:
            w = ver.w - u
        return Version(w, u, ver.w, ver.index + 1)


class _ConvStage(ConvStage, _Stage):
    """A convolution stage: the Linear stage's state and versions with the arithmetic of
    :class:`~pipetrain.sim.reference_conv.ConvStage` (forward, δ, input gradient, update)."""

    def __init__(
        self, spec: StageSpec, rule: UpdateRule, delay: int, w: torch.Tensor, keep: int
    ) -> None:
        super().__init__(spec, rule, delay, w, keep)
        assert spec.conv is not None
        self.setup_conv(spec.conv)


def loss_gradient(kind: str, z: torch.Tensor, label: int) -> torch.Tensor:
    """Return ∂L/∂z (C,) of one sample: cross-entropy p − onehot(y), or MSE 2(z − onehot)/C.

    Source: PyTorch ``CrossEntropyLoss`` / ``MSELoss`` (mean reduction) at batch 1.
    """
    if kind == "cross_entropy":
        g = torch.softmax(z, 0)
        g[label] -= 1.0
        return g
    if kind != "mse":
        unknown(kind, "loss")
    t = torch.zeros_like(z)
    t[label] = 1.0
    return (z - t) * (2.0 / z.numel())


@dataclass(frozen=True)
class _Role:
    block: int
    head: bool
    losses: tuple[int, ...]
    delay: int


class ReferenceTrainer:
    """Float PB / sequential trainer at batch size 1 (version-queue formulation).

    Parameters
    ----------
    model: an ``nn.Sequential`` (nests flattened) of :data:`SUPPORTED_MODULES`; its
        parameters are copied (the module is not modified).
    config: schedule, mitigation, strategy, hyperparameters (batch-1 values ``lr1``,
        ``momentum1`` are used), loss and seed.
    plan: optional compiled plan; when given, delays, update/SC/LWP constants, update masks
        and the loss kind are read from it (one source) and must match the model's shapes.
    active_losses: 1-based losses that are switched on (default: all). A switched-off loss
        produces no gradient anywhere (used to probe the interlocking update mask).
    profile: record :attr:`ranges` (default True; about doubles the time per sample of a
        small net — switch it off for accuracy runs).

    Members
    -------
    target: ``"reference"``.
    delays: D_s of every stage (main stages 1..S, then head stages), in updates.
    stages: the :class:`StageSpec` of every stage in the same order.
    num_losses: K (1 for the global strategy).
    block_ends: last main stage (1-based) of each block.
    samples_trained, epochs_trained, saturations (always 0): see :class:`~.trainer.Trainer`.

    Auxiliary heads (local/interlocking) are initialised like ``nn.Linear`` (U(±1/√N) for
    weights and biases) from a ``torch.Generator`` seeded ``config.seed·1000003 + 7919``, in
    stage order, so the global RNG is untouched; :meth:`head_weights` returns them.

    Raises :class:`UnsupportedModelError` for an unsupported model, :class:`ConfigError` for a
    plan that does not match the model, unknown ``active_losses`` or a bad block layout.
    """

    target = "reference"

    def __init__(
        self,
        model: nn.Module,
        config: TrainConfig,
        plan: Plan | None = None,
        active_losses: set[int] | None = None,
        *,
        profile: bool = True,
    ) -> None:
        self.config = config
        self.plan = plan
        parsed = parse_model(model)
        # state_dict keys: the plan's stage names (the user's module paths) when compiled, so a
        # model class of the user's, run here as the front end's chain, gets its own keys back
        names = [st.name for st in plan.main_stages] if plan is not None else []
        if len(names) != len(parsed):
            names = [spec.name for spec, _ in parsed]
        self._linears = [(nm, lin) for nm, (_, lin) in zip(names, parsed, strict=True)]
        main_specs = [spec for spec, _ in parsed]
        S = len(main_specs)
        dtype = parsed[0][1].weight.dtype
        self.dtype = dtype
        roles, rules = self._roles_and_rules(main_specs, config, plan)
        self.num_losses = 1 + sum(1 for r in roles if r.head and _is_first_head(roles, r))
        K = self.num_losses
        if active_losses is None:
            active_losses = set(range(1, K + 1))
        bad = set(active_losses) - set(range(1, K + 1))
        if bad:
            raise ConfigError(f"active_losses {sorted(bad)} are not in 1..{K} (K = {K} losses)")
        self.active_losses = frozenset(active_losses)
        self.loss_kind = plan.loss.kind if plan is not None else config.loss
        # block ends and head specs
        ends = [max(s for s in range(1, S + 1) if roles[s - 1].block == k) for k in range(1, K + 1)]
        self.block_ends = tuple(ends)
        classes = main_specs[-1].out_features
        specs = list(main_specs)
        head_roles = [r for r in roles if r.head]
        per_head = len(head_roles) // (K - 1) if K > 1 else 0
        gen = torch.Generator().manual_seed(config.seed * 1000003 + 7919)
        init: list[torch.Tensor] = []
        for _, lin in parsed:
            rows = lin.weight.shape[0]  # M, or a convolution's C_out (weight.view(C_out, -1))
            b = lin.bias.detach() if lin.bias is not None else torch.zeros(rows)
            wm = lin.weight.detach().reshape(rows, -1)
            init.append(torch.cat((wm, b.to(dtype)[:, None]), 1).clone())
        for k in range(1, K):
            width = main_specs[ends[k - 1] - 1].out_features
            for h in range(1, per_head + 1):
                n_out = classes if h == per_head else width
                act = "identity" if h == per_head else "relu"
                if plan is not None:  # the plan's head activation wins (one source)
                    act = plan.stages[len(specs)].activation
                specs.append(StageSpec("", width, n_out, True, act, 0.0, head=True))
                init.append(seeded_linear(width, n_out, gen, dtype))
        if plan is not None:
            for i, (spec, pst) in enumerate(zip(specs, plan.stages, strict=False)):
                if (spec.in_features, spec.out_features) != (pst.in_features, pst.out_features):
                    raise ConfigError(
                        f"plan stage {i + 1} ({pst.name}) is {pst.in_features}→"
                        f"{pst.out_features} but the model's stage {i + 1} is "
                        f"{spec.in_features}→{spec.out_features}; recompile the plan"
                    )
        self.stages: tuple[StageSpec, ...] = tuple(specs)
        self._roles = roles
        self.delays: tuple[int, ...] = tuple(r.delay for r in roles)
        self._st = [
            (_Stage if spec.conv is None else _ConvStage)(
                spec, rule, r.delay, w, self._keep(r.delay)
            )
            for spec, rule, r, w in zip(specs, rules, roles, init, strict=True)
        ]
        self._main = self._st[:S]
        self._heads = [self._st[S + (k - 1) * per_head : S + k * per_head] for k in range(1, K)]
        self._programs = self._backward_programs()
        self.samples_trained = 0
        self.epochs_trained = 0
        self.saturations = 0
        self.profile = profile
        self.reset_ranges()

    # ---- construction helpers ------------------------------------------------------------

    @staticmethod
    def _keep(delay: int) -> int:
        return delay + 1

    @staticmethod
    def _roles_and_rules(
        main_specs: list[StageSpec], config: TrainConfig, plan: Plan | None
    ) -> tuple[list[_Role], list[UpdateRule]]:
        S = len(main_specs)
        if plan is not None:
            mains = plan.main_stages
            if len(mains) != S:
                raise ConfigError(
                    f"the plan has {len(mains)} main stages but the model has {S} Linear "
                    "layers; recompile the plan for this model"
                )
            roles = [
                _Role(s.block, s.role == "head", tuple(s.losses), s.delay) for s in plan.stages
            ]
            rules = [UpdateRule.from_plan_stage(s) for s in plan.stages]
            return roles, rules
        try:
            layout = stage_layout(
                S,
                config.schedule,
                config.strategy,
                config.blocks,
                config.distance,
                config.rule,
                config.head_stages,
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        roles = [_Role(r.block, r.head, tuple(r.losses), r.delay) for r in layout]
        rules = [UpdateRule.from_config(config, r.delay) for r in roles]
        return roles, rules

    def _backward_programs(self) -> dict[int, tuple[list[_Stage], list[tuple[int, bool]]]]:
        """Per loss t: (head stages top-down, [(main stage index 0-based, updates?)…]).

        Also sets :attr:`_lag`: per (t, main stage index) how many versions older than the
        newest the stream of L_t reads, D_s − D_{s,t} with D_{s,t} = 2·(P_t − s) + 1 the
        stream's own delay (P_t: stages from the input to loss t, heads included) under
        ``pb``, 0 under ``sequential`` — the version the stage holds when that stream
        arrives in the tick model (docs/architecture.md §2.4, docs/numerics.md §7.2)."""
        K = self.num_losses
        S = len(self._main)
        sequential = (self.plan.schedule if self.plan is not None else self.config.schedule) == (
            "sequential"
        )
        per_head = (len(self._st) - S) // (K - 1) if K > 1 else 0
        self._lag: dict[tuple[int, int], int] = {}
        progs = {}
        for t in range(1, K + 1):
            heads = list(reversed(self._heads[t - 1])) if t < K else []
            updated = [k for k in range(1, K + 1) if t in self._block_losses(k)]
            chain: list[tuple[int, bool]] = []
            if updated:
                k_min = min(updated)
                first = (self.block_ends[k_min - 2] + 1) if k_min > 1 else 1
                top = self.block_ends[t - 1] if t < K else S
                for s in range(top, first - 1, -1):
                    chain.append((s - 1, t in self._roles[s - 1].losses))
                    P_t = self.block_ends[t - 1] + per_head if t < K else S
                    lag = 0 if sequential else self._roles[s - 1].delay - (2 * (P_t - s) + 1)
                    if lag < 0:
                        raise ConfigError(
                            f"stage {s} passes loss L{t} back {-lag} updates after its own "
                            "delay; its stash cannot hold it (use fewer --head-stages or move "
                            "the block boundary)"
                        )
                    self._lag[(t, s - 1)] = lag
            progs[t] = (heads, chain)
        return progs

    def _block_losses(self, k: int) -> tuple[int, ...]:
        return next(r.losses for r in self._roles if not r.head and r.block == k)

    # ---- training --------------------------------------------------------------------------

    def train(
        self, x: torch.Tensor, y: torch.Tensor, epochs: int = 1, progress: bool = False
    ) -> None:
        """Stream ``epochs`` passes over ``x`` (n, N), ``y`` (n,) in epoch order; then flush
        (a network with convolution stages on one torch thread, :func:`one_thread`)."""
        if any(isinstance(st, _ConvStage) for st in self._st):
            with one_thread():
                stream_epochs(self, x, y, epochs, self.config.seed, progress)
            return
        stream_epochs(self, x, y, epochs, self.config.seed, progress)

    def flush(self) -> None:
        """End of stream: every update is already applied here, so the queues collapse to the
        newest version (the next forward sees all updates, as after a hardware flush)."""
        for st in self._st:
            st.collapse()

    def train_sample(self, x: torch.Tensor, y: int | torch.Tensor) -> None:
        """Forward sample ``x`` (N,) with stale versions, backward with the newest, update."""
        label = int(y)
        x = x.to(self.dtype)
        main, S = self._main, len(self._main)
        cache = []
        h = x
        for st in main:
            x_aug, z, a = st.forward(st.forward_weights(st.queue[0]), h)
            cache.append((h, x_aug, z, a))
            h = a
        n_st = len(self._st)
        d_acc: list[torch.Tensor | None] = [None] * n_st
        g_acc: list[torch.Tensor | None] = [None] * n_st
        gin_acc: list[torch.Tensor | None] = [None] * n_st
        # every stream's own error and input gradient (pass-through streams included): the
        # fixed-point formats hold each of them, not only the update streams' sum
        streams_g: list[list[torch.Tensor]] = [[] for _ in range(n_st)]
        streams_gin: list[list[torch.Tensor]] = [[] for _ in range(n_st)]
        head_x: dict[int, torch.Tensor] = {}
        head_in: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # (x, z, a)
        K = self.num_losses
        for t in sorted(self.active_losses, reverse=True):
            heads, chain = self._programs[t]
            if t == K:
                g = loss_gradient(self.loss_kind, cache[-1][3], label)
            else:  # forward the head on the detached block output, backward through it
                hh = h_blk = cache[self.block_ends[t - 1] - 1][3]
                hcache = []
                for st in reversed(heads):
                    x_aug, z, a = st.forward(st.forward_weights(st.queue[0]), hh)
                    hcache.append((x_aug, z, a))
                    hh = a
                g = loss_gradient(self.loss_kind, hh, label)
                for j, st in enumerate(heads):
                    x_aug, z, a = hcache[-1 - j]
                    d = st.delta(g, z, a)
                    i = self._st.index(st)
                    d_acc[i] = d
                    head_x[i] = x_aug
                    head_in[i] = (hcache[-2 - j][2] if j + 1 < len(heads) else h_blk, z, a)
                    if self.profile:
                        streams_g[i].append(g)
                    if j + 1 < len(heads) or chain:
                        g = st.input_grad(st.current.w, d)
                        if self.profile:
                            streams_gin[i].append(g)
            for c, (i, upd) in enumerate(chain):
                st = main[i]
                _, _, z, a = cache[i]
                d = st.delta(g, z, a)
                if self.profile:
                    streams_g[i].append(g)
                if upd:
                    d_acc[i] = d if d_acc[i] is None else d_acc[i] + d
                    g_acc[i] = g if g_acc[i] is None else g_acc[i] + g
                if c + 1 < len(chain):  # the version the stage holds when this stream arrives
                    lag = self._lag[(t, i)]
                    ver = st.queue[-1 - lag] if len(st.queue) > lag else st.queue[0]
                    g = st.input_grad(ver.w, d)
                    if self.profile:
                        streams_gin[i].append(g)
                    if upd:
                        gin_acc[i] = g if gin_acc[i] is None else gin_acc[i] + g
        vals: list[torch.Tensor] | None = [] if self.profile else None
        for i, st in enumerate(self._st):
            d = d_acc[i]
            if i < S:
                x_aug = cache[i][1]
            else:
                x_aug = head_x.get(i)
                if x_aug is None:
                    x_aug = torch.zeros(st.n + 1, dtype=self.dtype)
            if d is None:
                d = torch.zeros(st.spec.out_features, dtype=self.dtype)
            new = st.update(st.current, x_aug, d)
            st.queue.append(new)
            if vals is not None and (i < S or i in head_in):
                h_in, z, a = (cache[i][0], *cache[i][2:]) if i < S else head_in[i]
                g_all = [t for t in (g_acc[i], *streams_g[i]) if t is not None]
                gin_all = [t for t in (gin_acc[i], *streams_gin[i]) if t is not None]
                self._record(vals, h_in, z, a, g_all, gin_all, new, d, x_aug)
            elif vals is not None:  # a head whose loss is switched off: nothing seen
                vals += (self._zero,) * 8
        if vals is not None:  # one stack and one max per sample for all stages
            torch.maximum(self._acc, torch.stack(vals).view(n_st, 8), out=self._acc)
        self.samples_trained += 1

    # ---- ranges ------------------------------------------------------------------------------

    def reset_ranges(self) -> None:
        """Clear :attr:`ranges`; ``w`` restarts at the current weights' max |value|."""
        self._acc = torch.zeros(len(self._st), 8, dtype=self.dtype)
        self._zero = torch.zeros((), dtype=self.dtype)
        for i, st in enumerate(self._st):
            self._acc[i, 5] = float(st.current.w.abs().max())
            self._acc[i, 6] = float(st.current.u.abs().max())

    def _record(self, vals: list[torch.Tensor], x, z, a, g, gin, new: Version, d, x_aug) -> None:
        """Append one stage's 8 max-|value| scalars (order of :attr:`_acc`) to ``vals``;
        ``g`` / ``gin``: the error at the output and the input gradient, as lists of tensors
        (the update streams' sum and every stream's own, pass-through streams included)."""
        inf = math.inf
        nrm = torch.linalg.vector_norm
        zero = self._zero
        nz = nrm(z, inf)
        vals += (
            nrm(x, inf),
            nz,
            nz if a is z else nrm(a, inf),
            max((nrm(t, inf) for t in g), default=zero),
            max((nrm(t, inf) for t in gin), default=zero),
            nrm(new.w, inf),
            nrm(new.u, inf),
            nrm(d, inf) * nrm(x_aug, inf),
        )

    @property
    def ranges(self) -> dict[int, dict[str, float]]:
        """Max |value| seen since :meth:`reset_ranges`, per stage (1-based: main stages, then
        the auxiliary-head stages in plan order).

        Keys: ``x`` stage input; ``y`` stage output (max over pre-activation z and the
        activation output); ``d`` error at the stage output (summed over the losses that
        update the stage); ``gin`` input gradient produced; ``w`` weights and bias; ``u``
        velocity in weight units η·v; ``p`` products |δ_j·x_i| (bias input 1 included).
        Empty-stream values are 0 (``w`` starts at the initial weights). Only recorded with
        ``profile=True``.
        """
        out = {}
        for i, row in enumerate(self._acc.tolist()):
            out[i + 1] = {
                "x": row[0],
                "y": max(row[1], row[2]),
                "d": row[3],
                "gin": row[4],
                "w": row[5],
                "u": row[6],
                "p": row[7],
            }
        return out

    # ---- inference and export -----------------------------------------------------------------

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Return int64 (n,) argmax classes of ``x`` (n, N) with the newest weights (no LWP)."""
        h = x.to(self.dtype)
        for st in self._main:
            w = st.current.w
            if isinstance(st, _ConvStage):
                h = st.predict_batch(w, h)
                continue
            z = torch.addmm(w[:, st.n], h, w[:, : st.n].t())
            act = st.spec.activation
            if act == "relu":
                h = torch.relu(z)
            elif act == "leaky_relu":
                h = F.leaky_relu(z, st.spec.negative_slope)
            elif act == "tanh":
                h = torch.tanh(z)
            elif act == "sigmoid":
                h = torch.sigmoid(z)
            elif act == "identity":
                h = z
            else:
                unknown(act, "activation")
        return torch.argmax(h, dim=1)

    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Return the accuracy of :meth:`predict` on ``x`` (n, N) against ``y`` (n,)."""
        return accuracy(self.predict(x), y)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Return ``{"<path>.weight": (M, N), "<path>.bias": (M,)}`` of the main stages.

        Loads into the original model with ``model.load_state_dict`` (auxiliary heads are not
        part of it; see :meth:`head_weights`).
        """
        out = {}
        for (path, lin), st in zip(self._linears, self._main, strict=True):
            w = st.current.w
            pre = f"{path}." if path else ""
            cols = st.cols if isinstance(st, _ConvStage) else st.n
            out[pre + "weight"] = w[:, :cols].reshape(lin.weight.shape).clone().to(lin.weight.dtype)
            if lin.bias is not None:
                out[pre + "bias"] = w[:, cols].clone().to(lin.bias.dtype)
        return out

    def head_weights(self) -> list[torch.Tensor]:
        """Return the auxiliary-head weights (M, N+1), bias column last, in stage order."""
        return [st.current.w.clone() for st in self._st[len(self._main) :]]

    def velocities(self) -> list[torch.Tensor]:
        """Return every stage's velocity in PyTorch units v = u/η (M, N+1), bias column last."""
        return [st.current.u / st.rule.lr for st in self._st]


def _is_first_head(roles: list[_Role], r: _Role) -> bool:
    return r is next(q for q in roles if q.head and q.block == r.block)
