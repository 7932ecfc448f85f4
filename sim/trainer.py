"""The interface every training target implements, and the one place samples are ordered.

Targets: the float reference trainer (:mod:`pipetrain.sim.reference`), the tick-by-tick float
simulator (:mod:`pipetrain.sim.reference_tick`), the fixed-point golden model and the RTL (via
the host). They all stream samples at batch size 1 in the order of
:func:`pipetrain.data.epoch_order`; :func:`stream_epochs` is the only caller of that
function on the training path, so the same seed gives the same sample sequence on every target.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Protocol, runtime_checkable

import torch
from tqdm import tqdm

from ..data import epoch_order

__all__ = ["Trainer", "stream_epochs", "accuracy", "bar_columns", "progress_bar"]

#: Width (columns) of a progress bar whose stream is no terminal and ``COLUMNS`` is unset.
DEFAULT_COLUMNS = 80


def bar_columns(stream: Any = None) -> int:
    """Columns a progress bar on ``stream`` (default ``sys.stderr``) may fill: the width of the
    terminal the stream is, else ``$COLUMNS``, else :data:`DEFAULT_COLUMNS` — so a bar piped
    through ``tee`` or into a log stays within an 80-column terminal (tqdm would not trim it,
    knowing no width). Source: *derived*."""
    stream = sys.stderr if stream is None else stream
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):  # not a terminal, or no file descriptor
        columns = 0
    if columns <= 0:
        try:
            columns = int(os.environ.get("COLUMNS", ""))
        except ValueError:
            columns = 0
    return columns if columns > 0 else DEFAULT_COLUMNS


def progress_bar(**options: Any) -> tqdm:
    """A tqdm bar on stderr that fits its line: ``options`` are tqdm's (``total``,
    ``disable``, ``unit``, ``desc``, …), ``ncols`` defaults to :func:`bar_columns` (tqdm
    trims the bar, its counts and its postfix to it)."""
    options.setdefault("ncols", bar_columns(options.get("file")))
    return tqdm(**options)


@runtime_checkable
class Trainer(Protocol):
    """A network being trained one sample at a time (batch size 1).

    Members
    -------
    target: str
        Which implementation this is (``"reference"``, ``"reference-tick"``, ``"golden"``, …).
    samples_trained: int
        Samples streamed into training so far (counted when they enter the pipeline).
    epochs_trained: int
        Epochs streamed by :meth:`train` so far; epoch ``e`` of a later call continues the
        numbering, so each epoch gets a fresh order (maintained by :func:`stream_epochs`).
    saturations: int
        Fixed-point saturation events so far (always 0 for float targets).
    """

    target: str
    samples_trained: int
    epochs_trained: int
    saturations: int

    def train(
        self, x: torch.Tensor, y: torch.Tensor, epochs: int = 1, progress: bool = False
    ) -> None:
        """Train on ``x`` float32 (n, N), ``y`` int64 (n,) for ``epochs`` passes, then flush.

        Samples are streamed at batch size 1 in :func:`pipetrain.data.epoch_order` order
        (use :func:`stream_epochs`); at the end every sample's update has been applied.
        """
        ...

    def train_sample(self, x: torch.Tensor, y: int | torch.Tensor) -> None:
        """Stream one sample ``x`` (N,) with label ``y`` into training; does not flush."""
        ...

    def flush(self) -> None:
        """Drain the pipeline: apply every streamed sample's pending update."""
        ...

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Return the predicted classes, int64 (n,), of ``x`` (n, N) with the current weights."""
        ...

    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Return the accuracy (fraction in [0, 1]) of :meth:`predict` on ``x`` against ``y``."""
        ...

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Return the current weights as a ``state_dict`` that loads into the original model."""
        ...


def stream_epochs(
    trainer: Trainer,
    x: torch.Tensor,
    y: torch.Tensor,
    epochs: int,
    seed: int,
    progress: bool = False,
) -> None:
    """Stream ``epochs`` passes over (``x`` (n, N), ``y`` (n,)) into ``trainer``, then flush.

    Epoch ``trainer.epochs_trained + e`` (e = 0..epochs−1) uses
    ``epoch_order(n, seed, trainer.epochs_trained + e)``; ``trainer.epochs_trained`` is
    advanced. The pipeline is not drained between epochs (samples stream continuously), only
    once at the end. ``progress`` shows a tqdm bar over samples.

    Raises :class:`ValueError` if ``x`` is not 2-D, ``y`` not 1-D of the same length, or
    ``epochs`` < 1.
    """
    if x.ndim != 2 or y.ndim != 1 or len(x) != len(y):
        raise ValueError(
            f"need x of shape (n, N) and y of shape (n,), got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    if epochs < 1:
        raise ValueError(f"epochs must be ≥ 1, got {epochs}")
    n = len(x)
    first = getattr(trainer, "epochs_trained", 0)
    bar = progress_bar(total=n * epochs, disable=not progress, unit="sample", leave=False)
    labels = y.tolist()
    for e in range(epochs):
        for i in epoch_order(n, seed, first + e).tolist():
            trainer.train_sample(x[i], labels[i])
            bar.update(1)
        trainer.epochs_trained = first + e + 1
    bar.close()
    trainer.flush()


def accuracy(pred: torch.Tensor, y: torch.Tensor) -> float:
    """Return the fraction of ``pred`` (n,) equal to ``y`` (n,); 0.0 for n = 0."""
    if len(y) == 0:
        return 0.0
    return float((pred == y).double().mean())
