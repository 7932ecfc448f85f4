"""The compile flow as a library: calibrate (sim) → compile and fit (compiler) → write the plan,
the report and the Verilog (compiler + hdl), in one call.

:func:`compile_design` is the one entry every command and API uses: ``pipetrain compile``,
``train``, ``build``, ``sim``, :func:`pipetrain.host.open` and the benchmarks. It wires the two
steps the compiler cannot import (docs/architecture.md §1): the calibration run
(:class:`pipetrain.sim.calibrate.Calibrator`, only for ``formats="auto"``) and the Verilog
writer (:func:`pipetrain.hdl.verilog.write_verilog`); with ``board`` the compiler fits the plan
to it (:func:`pipetrain.compiler.fit.fit_plan`), once.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..compiler.build import PlanError
from ..compiler.compile import ARTIFACT_WRITERS, ArtifactWriter, CompileResult, compile_result
from ..compiler.config import TrainConfig
from ..compiler.fit import FitError
from ..compiler.formats import Ranges
from ..compiler.ir import NetworkIR
from ..compiler.models import DATA_MLP, build_mlp
from ..compiler.targets import Board, get_board
from ..data import Dataset, load_data
from ..hdl.link_onchip import onchip_memory_bits
from ..hdl.shell import board_shell
from ..hdl.verilog import write_verilog
from ..sim.calibrate import Calibrator

__all__ = [
    "DEFAULT_DATA",
    "DEFAULT_HIDDEN",
    "DESIGN_WRITERS",
    "compile_design",
    "data_mlp",
    "DefaultDataCalibrator",
]

#: Hidden layer sizes of the data-sized ``mlp`` model.
DEFAULT_HIDDEN = "32"
#: The data set of the built-in models and of ``mlp`` when no data is given.
DEFAULT_DATA = "digits"

#: The artifacts of ``pipetrain compile``: ``plan.json``, ``report.md`` and ``<name>.v``.
DESIGN_WRITERS: list[ArtifactWriter] = [*ARTIFACT_WRITERS, write_verilog]


def data_mlp(ds: Dataset, hidden: str, seed: int) -> nn.Module:
    """A ReLU MLP sized from ``ds``: features → ``hidden`` (``"32"`` or ``"64,32"``) →
    classes, initialised with ``seed``. Raises :class:`PlanError` for bad sizes."""
    try:
        sizes = [int(v) for v in hidden.replace(" ", "").split(",") if v]
    except ValueError as exc:
        raise PlanError(f"--hidden {hidden!r} must be layer sizes like 32 or 64,32") from exc
    if any(v < 1 for v in sizes):
        raise PlanError(f"--hidden {hidden!r}: layer sizes must be ≥ 1")
    torch.manual_seed(seed)
    return build_mlp([ds.features, *sizes, ds.classes])


class DefaultDataCalibrator:
    """The ``calibrate`` step when the caller gave no data: calibrate on the default data set
    (:data:`DEFAULT_DATA`) if it fits the network (its features are the network's inputs and
    its classes fit the outputs), with a note saying so; otherwise return None, so the compile
    uses static formats (:func:`~pipetrain.compiler.formats.static_formats`, whose note names
    ``--data FILE.npz``). Source: *derived* (every command's default data set is digits).

    Members
    -------
    calibrator: the :class:`~pipetrain.sim.calibrate.Calibrator` on the default data.
    notes: after a call, the format notes for the report (empty before).
    """

    def __init__(self, dataset: Dataset, samples: int | None = None) -> None:
        self.calibrator = Calibrator(dataset, samples)
        self.notes: tuple[str, ...] = ()

    def __call__(self, model: nn.Module, ir: NetworkIR, config: TrainConfig) -> Ranges | None:
        ds = self.calibrator.dataset
        if not ds.fits(ir.input_shape) or ds.classes > ir.classes:
            self.notes = ()
            return None
        self.notes = (
            f"formats calibrated on {ds.name!r}, the default data set (no data given; "
            "--data FILE.npz calibrates on other data)",
        )
        return self.calibrator(model, ir, config)


def compile_design(
    model: str | nn.Module,
    config: TrainConfig | None = None,
    out_dir: str | os.PathLike | None = None,
    *,
    data: str | Dataset | None = None,
    calib_samples: int | None = None,
    calib_epochs: int | None = None,
    board: str | Board | None = None,
    hidden: str | None = None,
    formats: Any = "auto",
    writers: Sequence[ArtifactWriter] | None = None,
    onchip_samples: int = 0,
    **options: Any,
) -> CompileResult:
    """Compile ``model`` (a built-in name, ``mlp`` sized from ``data``, a ``.py`` file or an
    ``nn.Module``) into a :class:`~pipetrain.compiler.compile.CompileResult`.

    ``data``: ``digits``, a ``.npz`` path or a :class:`~pipetrain.data.Dataset`; it calibrates
    the ``auto`` formats over ``calib_epochs`` epochs of its training set or ``calib_samples``
    samples (at most one of them; default ``config.epochs`` epochs: 1 unless the config or a
    model file sets it; the CLI passes the epochs of the run, ``pipetrain train`` its
    ``--epochs``: the weights grow while training, and formats calibrated over fewer epochs
    clamp them, e.g. mlp-digits-deep seed 2, 4 epochs: 2,046 stage-1 ``w`` clamps calibrated
    over 1 epoch, 0 over 4), sizes
    ``mlp`` (hidden layers ``hidden``, default :data:`DEFAULT_HIDDEN`) and gives a convolution
    network without ``model.input_shape`` its input shape (one sample's shape, where it fits
    the first convolution; :func:`~pipetrain.compiler.frontend.trace`). Without ``data``
    (None) the default data set :data:`DEFAULT_DATA` (digits) sizes ``mlp`` and calibrates a
    network it fits (the built-ins and any 64-input model with ≥ 10 outputs; a note says so);
    any other network compiles uncalibrated with static formats (:class:`DefaultDataCalibrator`,
    :func:`~pipetrain.compiler.formats.static_formats`; its note says how to calibrate).
    ``board``: a board name or
    :class:`~pipetrain.compiler.targets.Board`; the plan is fitted to it (the plan ``pipetrain
    build --board`` puts in the bitstream; lanes not given: the fastest that fit, counting the
    link engine's memories, :func:`~pipetrain.hdl.shell.board_shell`; ``result.fit`` holds
    the needed / available rows). ``onchip_samples``: the board design holds an on-chip
    training set of that many samples (docs/protocol.md §2 STORE/RUN): its memories count in
    the fit, so the lanes chosen leave room for it; a set too big for the board is a
    :class:`~pipetrain.compiler.fit.FitError` naming its size and the board's block RAMs.
    ``out_dir``: write the artifacts there
    (``writers``, default :data:`DESIGN_WRITERS`). ``options``: the other keyword arguments of
    :func:`~pipetrain.compiler.compile.compile_result` (``config_overrides``,
    ``format_overrides``, ``lanes``, ``seed``, ``name``, …).

    Raises the compiler's errors (:class:`~pipetrain.compiler.models.ModelError`,
    :class:`~pipetrain.compiler.config.ConfigError`, :class:`PlanError`,
    :class:`~pipetrain.compiler.fit.FitError`), :class:`~pipetrain.compiler.targets.BoardError`
    for an unknown board, :class:`~pipetrain.data.DataError` for bad data and
    :class:`PlanError` for ``hidden`` given with a model other than ``mlp``, and for
    ``calib_epochs`` < 1 or given with ``calib_samples``, and ``calib_samples`` < 1.
    """
    if calib_epochs is not None:
        if calib_samples is not None:
            raise PlanError(
                f"--calib-epochs {calib_epochs} and --calib-samples {calib_samples} both set the "
                "calibration run's length: give one of them"
            )
        if calib_epochs < 1:
            raise PlanError(f"--calib-epochs must be ≥ 1, got {calib_epochs}")
    if calib_samples is not None and calib_samples < 1:
        raise PlanError(f"--calib-samples must be ≥ 1, got {calib_samples}")
    if hidden is not None and model != DATA_MLP:
        raise PlanError(
            f"--hidden {hidden} sizes only the data-sized model 'mlp' (hidden= in the API); "
            "this model has its own layers: drop --hidden, or use MODEL mlp"
        )
    defaulted = data is None
    data = DEFAULT_DATA if data is None else data
    auto = isinstance(formats, str) and formats == "auto"
    needs_data = model == DATA_MLP or auto or not defaulted  # given data: its sample shape
    ds = (data if isinstance(data, Dataset) else load_data(data)) if needs_data else None
    if ds is not None and not defaulted:  # a CNN without model.input_shape takes the data's
        options.setdefault("sample_shape", ds.shape)
    calibrate = None
    if ds is not None and auto:
        if calib_epochs is not None:  # n samples an epoch: full passes of the training set
            calib_samples = len(ds.x_train) * calib_epochs
        calibrate = (DefaultDataCalibrator if defaulted else Calibrator)(ds, calib_samples)
    if model == DATA_MLP:
        assert ds is not None
        seed = (options.get("config_overrides") or {}).get("seed", options.get("seed"))
        model = data_mlp(ds, hidden or DEFAULT_HIDDEN, int(seed or 0))
        options.setdefault("name", DATA_MLP)
    if isinstance(board, str):
        board = get_board(board)
    try:
        return _compile(model, config, out_dir, formats, calibrate, board, onchip_samples, writers,
                        options)  # fmt: skip
    except FitError as exc:
        if not onchip_samples:
            raise
        plan = exc.plan
        bits = "" if plan is None else f" ({onchip_memory_bits(plan, onchip_samples):,} bits)"
        row = exc.rows.get("bram_blocks")
        need = (
            f"{row['needed']} block RAMs needed with it, {row['available']} on the board"
            if row
            else str(exc)
        )
        raise FitError(
            f"the on-chip training set of {onchip_samples} samples{bits} does not fit "
            f"{board.name if board is not None else 'the board'} next to the network: {need}; "
            "train with the data streamed (without --on-chip-data), a smaller set or a bigger "
            "board",
            exc.rows,
            plan,
        ) from exc


def _compile(
    model: Any,
    config: TrainConfig | None,
    out_dir: Any,
    formats: Any,
    calibrate: Any,
    board: Board | None,
    onchip_samples: int,
    writers: Sequence[ArtifactWriter] | None,
    options: dict[str, Any],
) -> CompileResult:
    return compile_result(
        model,
        config,
        out_dir,
        formats=formats,
        calibrate=calibrate,
        board=board,
        shell=(
            None
            if board is None
            else functools.partial(board_shell, onchip_samples=onchip_samples)
            if onchip_samples
            else board_shell
        ),
        writers=DESIGN_WRITERS if writers is None else writers,
        **options,
    )
