"""Tick-by-tick float simulator of the PB pipeline: the tick model of docs/architecture.md §2.1,
literally.

In tick t (0-based, counted from the first sample of a stream segment) every stage s = 1..S
does, reading its weights as they were at the start of the tick:

* the forward of sample n = t − s + 1 (0-based), on the output stage s−1 produced in tick t−1
  (stage 1 takes the new sample), stashing its input and pre-activation (at most D_s + 1
  entries, checked);
* the backward of sample n = t − 2S + s, on the input gradient stage s+1 produced in tick t−1
  (stage S takes the loss gradient formed at the end of tick t−1), followed by the weight
  update.

The loss unit forms the error of stage S's forward output at the end of the tick. A flush runs
ticks without new samples until the pipeline is empty (2S − 1 ticks), after which tick
counting restarts. The stage arithmetic (LWP, forward, activation derivative, input gradient,
update) is the very code of :class:`pipetrain.sim.reference.ReferenceTrainer`, so the two
agree bit for bit (``torch.equal``); the test suite checks it. Only the ``global`` strategy
and the ``pb`` schedule are modelled; :attr:`ranges` are not recorded here.
"""

from __future__ import annotations

from collections import deque

import torch
from torch import nn

from ..compiler.config import ConfigError, TrainConfig
from ..compiler.plan import Plan
from .reference import ReferenceTrainer, loss_gradient

__all__ = ["PBTickSimulator"]


class PBTickSimulator(ReferenceTrainer):
    """Tick-by-tick PB simulator (global strategy), same constructor as the reference trainer.

    Each stage holds only its current weights (plus ``w_prev`` for LWP ``w``); staleness arises
    from the schedule, not from a version queue. ``train_sample`` runs one tick with the new
    sample entering stage 1; ``flush`` runs ticks until every update is applied.

    Members
    -------
    target: ``"reference-tick"``.
    tick: ticks run in the current stream segment.
    in_flight: samples whose update is not yet applied at every stage.

    Raises :class:`ConfigError` for a strategy other than ``global`` or a schedule other than
    ``pb``, plus everything :class:`~pipetrain.sim.reference.ReferenceTrainer` raises.
    """

    target = "reference-tick"

    def __init__(
        self,
        model: nn.Module,
        config: TrainConfig,
        plan: Plan | None = None,
        active_losses: set[int] | None = None,
        *,
        profile: bool = False,
    ) -> None:
        strategy = plan.strategy if plan is not None else config.strategy
        schedule = plan.schedule if plan is not None else config.schedule
        if strategy != "global" or schedule != "pb":
            raise ConfigError(
                f"the tick simulator models schedule 'pb' with strategy 'global' only, got "
                f"schedule {schedule!r}, strategy {strategy!r}"
            )
        super().__init__(model, config, plan, active_losses, profile=False)
        S = len(self._main)
        self._S = S
        self.tick = 0
        self._next_id = 0
        self._fwd_reg: list[tuple[int, int, torch.Tensor] | None] = [None] * S
        self._bwd_reg: list[tuple[int, torch.Tensor] | None] = [None] * S
        self._loss_reg: tuple[int, torch.Tensor] | None = None
        self._stash: list[deque] = [deque() for _ in range(S)]

    @staticmethod
    def _keep(delay: int) -> int:
        return 1  # only the current version; staleness comes from the tick schedule

    @property
    def in_flight(self) -> int:
        """Samples entered but not yet updated at stage 1 (the last stage to update)."""
        return len(self._stash[0])

    def train_sample(self, x: torch.Tensor, y: int | torch.Tensor) -> None:
        """Run one tick with sample ``x`` (N,), label ``y`` entering stage 1."""
        sid = self._next_id
        self._next_id += 1
        self._run_tick((sid, int(y), x.to(self.dtype)))
        self.samples_trained += 1

    def flush(self) -> None:
        """Run empty ticks until no sample is in flight, then restart tick counting."""
        while (
            any(r is not None for r in self._fwd_reg)
            or any(r is not None for r in self._bwd_reg)
            or self._loss_reg is not None
            or any(self._stash)
        ):
            self._run_tick(None)
        self.tick = 0
        self._next_id = 0

    def _run_tick(self, new: tuple[int, int, torch.Tensor] | None) -> None:
        S, t = self._S, self.tick
        fwd_out: list[tuple[int, int, torch.Tensor] | None] = [None] * S
        bwd_out: list[tuple[int, torch.Tensor] | None] = [None] * S
        active = self.num_losses in self.active_losses
        for i, st in enumerate(self._main):
            s = i + 1
            ver = st.current  # the weights at the start of this tick
            inp = new if i == 0 else self._fwd_reg[i - 1]
            if inp is not None:
                sid, label, h = inp
                assert sid == t - s + 1, f"stage {s} forward of sample {sid} in tick {t}"
                x_aug, z, a = st.forward(st.forward_weights(ver), h)
                self._stash[i].append((sid, x_aug, z, a))
                assert len(self._stash[i]) <= st.delay + 1, f"stage {s} stash overflow"
                fwd_out[i] = (sid, label, a)
            err = self._loss_reg if i == S - 1 else self._bwd_reg[i + 1]
            if err is not None:
                sid, g = err
                assert sid == t - 2 * S + s, f"stage {s} backward of sample {sid} in tick {t}"
                sid2, x_aug, z, a = self._stash[i].popleft()
                assert sid2 == sid, f"stage {s} stash holds sample {sid2}, not {sid}"
                d = st.delta(g, z, a)
                if i > 0:
                    bwd_out[i] = (sid, st.input_grad(ver.w, d))
                st.queue.append(st.update(ver, x_aug, d))
        last = fwd_out[S - 1]
        if last is not None:
            sid, label, logits = last
            g = loss_gradient(self.loss_kind, logits, label)
            if not active:
                g = torch.zeros_like(g)
            self._loss_reg = (sid, g)
        else:
            self._loss_reg = None
        self._fwd_reg, self._bwd_reg = fwd_out, bwd_out
        self.tick += 1
