"""Training checkpoints: the state of a run at a flush point, written atomically, read back to
resume the run bit for bit (``pipetrain train --checkpoint FILE`` / ``--resume FILE``).

A checkpoint is taken only where the pipeline is empty — at a flush, every
``checkpoint_every`` samples of the run — because the in-flight state of a PB pipeline
(stashes, weight versions, the samples between stages) cannot be read over the link. What it
holds (docs/protocol.md §7):

* the plan hash (a checkpoint of another plan is refused, naming both hashes) and the run:
  epochs, samples per epoch, the epoch-order seed, the flush period, the position (samples of the
  run streamed so far), a digest of the training data;
* the device state: per stage ``w``, ``u`` (and ``w_prev`` for LWP ``w`` form) as the raw
  fixed-point words, the lanes' LFSR states and the number of updates that produced them, the
  network counters ``samples_trained``, ``ticks``, ``saturations`` (and the heads'
  ``head_correct``);
* the golden model's own snapshot (:meth:`~pipetrain.sim.golden.GoldenModel.snapshot`) for the
  ``golden`` target, or the golden shadow's for a link target run with ``shadow=True``;
* the result records of the run so far (for the run's online accuracy).

The file is JSON, written to a temporary file in the same folder, flushed to disk and renamed
over the target (``os.replace``), so a crash leaves the old checkpoint or the new one, never a
half-written file. Source: *derived* (the design is in docs/protocol.md §7).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..compiler.plan import Plan
from ..errors import UserError
from ..sim.lfsr import jump

__all__ = [
    "CHECKPOINT_FORMAT",
    "Checkpoint",
    "CheckpointError",
    "data_digest",
    "lfsr_states",
]

#: Format tag and version of a checkpoint file.
CHECKPOINT_FORMAT = "pipetrain-checkpoint/1"


class CheckpointError(UserError, ValueError):
    """A checkpoint cannot be read, or does not belong to this plan, data or run."""


def data_digest(x: torch.Tensor, y: torch.Tensor) -> str:
    """SHA-256 (16 hex digits) of the training inputs (float32) and labels (int64) — a resumed
    run must stream the same data."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(x.detach().to(torch.float32).numpy()).tobytes())
    h.update(np.ascontiguousarray(y.detach().to(torch.int64).numpy()).tobytes())
    return h.hexdigest()[:16]


def lfsr_states(plan: Plan, updates: int) -> list[list[int] | None]:
    """Per stage, the lanes' LFSR states after ``updates`` weight updates from the plan's seeds
    (None with nearest-even rounding). Each update draws once per slot, ⌈M/L⌉·⌈(N+1)/k⌉ draws
    per lane (numerics §6, k = ``Stage.column_lanes``; a convolution stage ⌈C_out/L⌉·(T + 1),
    §9), whatever the data, so the
    state is a function of the update count (*derived*; :func:`pipetrain.sim.lfsr.jump`)."""
    if plan.rounding != "stochastic":
        return [None] * len(plan.stages)
    out: list[list[int] | None] = []
    for st in plan.stages:
        draws = updates * st.row_groups * st.group_slots
        out.append([jump(s, draws, plan.lfsr_poly, plan.lfsr_leap) for s in st.lfsr_seeds])
    return out


@dataclass
class Checkpoint:
    """One checkpoint (module docstring). Positions and counts are in samples.

    Members
    -------
    plan_hash: ``Plan.hash`` of the run.
    target: the target that wrote it (``golden``, ``sim``, a link URL).
    epochs: epochs of the run; samples: training samples per epoch (n); seed: the epoch-order
        seed; epoch_base: epochs the device had trained before the run (epoch e of the run uses
        ``epoch_order(n, seed, epoch_base + e)``).
    every: samples between two flushes (and checkpoints) of the run.
    position: samples of the run streamed and flushed when it was taken (a multiple of
        ``every``, or the run's end).
    digest: :func:`data_digest` of the training data.
    memories: per stage ``{"w", "u"[, "w_prev"]}``: M lists of N+1 raw ints.
    lfsr: per stage the lanes' LFSR states (None: nearest-even rounding).
    lfsr_updates: weight updates since the seeds that gave ``lfsr``.
    counters: the network counters ``samples_trained``, ``ticks``, ``saturations`` (S+1), and
        with auxiliary heads ``head_correct`` (one per head).
    golden: the golden model's snapshot (golden target; a link target's golden shadow), or None.
    results: ``(pred, loss_raw, train)`` of every training sample of the run so far.
    """

    plan_hash: str
    target: str
    epochs: int
    samples: int
    seed: int
    epoch_base: int
    every: int
    position: int
    digest: str
    memories: list[dict[str, list[list[int]]]]
    lfsr: list[list[int] | None]
    lfsr_updates: int
    counters: dict[str, Any]
    golden: dict[str, Any] | None = None
    results: list[tuple[int, int, bool]] = field(default_factory=list)

    # -- files ----------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the checkpoint to ``path`` atomically (temporary file in the same folder,
        fsync, ``os.replace``). Raises :class:`CheckpointError` when the folder does not exist or
        cannot be written."""
        target = Path(path)
        folder = target.resolve().parent
        if not folder.is_dir():
            raise CheckpointError(f"checkpoint {str(path)!r}: the folder does not exist")
        text = json.dumps({"format": CHECKPOINT_FORMAT, **asdict(self)}, separators=(",", ":"))
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(text)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            raise CheckpointError(f"cannot write checkpoint {str(path)!r}: {exc}") from exc

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Checkpoint:
        """Read a checkpoint. Raises :class:`CheckpointError` for a missing file, a file that is
        not a pipetrain checkpoint, or another format version."""
        try:
            raw = json.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise CheckpointError(f"checkpoint {str(path)!r} does not exist") from exc
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{str(path)!r} is not a pipetrain checkpoint: {exc}") from exc
        if not isinstance(raw, dict) or raw.get("format") != CHECKPOINT_FORMAT:
            got = raw.get("format") if isinstance(raw, dict) else None
            raise CheckpointError(
                f"{str(path)!r} is not a {CHECKPOINT_FORMAT} checkpoint (format {got!r})"
            )
        raw.pop("format")
        try:
            ck = cls(**raw)
        except TypeError as exc:
            raise CheckpointError(f"{str(path)!r}: malformed checkpoint: {exc}") from exc
        ck.results = [(int(p), int(lo), bool(t)) for p, lo, t in ck.results]
        return ck

    # -- checks ---------------------------------------------------------------------------------
    def check(self, plan: Plan, digest: str, samples: int, epochs: int) -> None:
        """Refuse to resume with another plan, other data or a run that already ended.

        Raises :class:`CheckpointError` naming both plan hashes, both data digests, or the
        position and the run's length (samples)."""
        if self.plan_hash != plan.hash:
            raise CheckpointError(
                f"the checkpoint is of plan {self.plan_hash}, this run has plan {plan.hash}: "
                "resume with the model, data and options that wrote it"
            )
        if self.digest != digest or self.samples != samples:
            raise CheckpointError(
                f"the checkpoint was written training on other data ({self.samples} samples, "
                f"digest {self.digest}; this run: {samples}, digest {digest}): pass the same "
                "--data"
            )
        if self.position >= epochs * samples:
            raise CheckpointError(
                f"the checkpoint is at sample {self.position} of the run, which has "
                f"{epochs * samples} ({epochs} epoch{'s' if epochs != 1 else ''}): nothing is "
                "left to train; raise --epochs"
            )

    def memory_tensors(self, plan: Plan) -> dict[str, dict[str, torch.Tensor]]:
        """``memories`` as int64 tensors keyed by stage name (as ``Device.memories`` returns)."""
        return {
            st.name: {k: torch.tensor(v, dtype=torch.int64) for k, v in self.memories[s].items()}
            for s, st in enumerate(plan.stages)
        }
