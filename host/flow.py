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

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..compiler.build import PlanError
from ..compiler.compile import ARTIFACT_WRITERS, ArtifactWriter, CompileResult, compile_result
from ..compiler.config import TrainConfig
from ..compiler.models import BUILTIN_MODELS, build_mlp
from ..compiler.targets import Board, get_board
from ..data import Dataset, load_data
from ..hdl.verilog import write_verilog
from ..sim.calibrate import Calibrator

__all__ = [
    "DEFAULT_DATA",
    "DEFAULT_HIDDEN",
    "DESIGN_WRITERS",
    "compile_design",
    "data_mlp",
    "default_data",
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


def default_data(model: str | nn.Module) -> str | None:
    """The data set ``model`` uses when none is given: :data:`DEFAULT_DATA` for a built-in
    model (they are digits networks) and for ``mlp``; None for a model file or module (its
    data is unknown: :func:`compile_design` then uses static formats)."""
    if isinstance(model, str) and (model == "mlp" or model in BUILTIN_MODELS):
        return DEFAULT_DATA
    return None


def compile_design(
    model: str | nn.Module,
    config: TrainConfig | None = None,
    out_dir: str | os.PathLike | None = None,
    *,
    data: str | Dataset | None = None,
    calib_samples: int | None = None,
    board: str | Board | None = None,
    hidden: str = DEFAULT_HIDDEN,
    formats: Any = "auto",
    writers: Sequence[ArtifactWriter] | None = None,
    **options: Any,
) -> CompileResult:
    """Compile ``model`` (a built-in name, ``mlp`` sized from ``data``, a ``.py`` file or an
    ``nn.Module``) into a :class:`~pipetrain.compiler.compile.CompileResult`.

    ``data``: ``digits``, a ``.npz`` path or a :class:`~pipetrain.data.Dataset`; it calibrates
    the ``auto`` formats (``calib_samples`` samples, default the whole training run) and sizes
    ``mlp`` (hidden layers ``hidden``). Without ``data`` (None), a built-in model and ``mlp``
    use their default data set (:func:`default_data`: digits, said in the format notes), and
    any other model compiles uncalibrated: ``formats="auto"`` becomes ``"static"`` (the static
    defaults widened for the initial weights,
    :func:`~pipetrain.compiler.formats.static_formats`; its note says how to calibrate).
    ``board``: a board name or
    :class:`~pipetrain.compiler.targets.Board`; the plan is fitted to it (the plan ``pipetrain
    build --board`` puts in the bitstream). ``out_dir``: write the artifacts there
    (``writers``, default :data:`DESIGN_WRITERS`). ``options``: the other keyword arguments of
    :func:`~pipetrain.compiler.compile.compile_result` (``config_overrides``,
    ``format_overrides``, ``lanes``, ``seed``, ``name``, …).

    Raises the compiler's errors (:class:`~pipetrain.compiler.models.ModelError`,
    :class:`~pipetrain.compiler.config.ConfigError`, :class:`PlanError`,
    :class:`~pipetrain.compiler.fit.FitError`), :class:`~pipetrain.compiler.targets.BoardError`
    for an unknown board and :class:`~pipetrain.data.DataError` for bad data.
    """
    notes: list[str] = list(options.pop("notes", ()))
    auto = isinstance(formats, str) and formats == "auto"
    if data is None:
        data = default_data(model)
        if data is not None and auto:
            notes.append(
                f"formats calibrated on {data!r}, the default data set of the built-in model "
                f"(--data FILE.npz calibrates on other data)"
            )
        elif auto:
            formats = "static"
    needs_data = model == "mlp" or (isinstance(formats, str) and formats == "auto")
    ds = (data if isinstance(data, Dataset) else load_data(data)) if needs_data else None
    if model == "mlp":
        assert ds is not None
        seed = (options.get("config_overrides") or {}).get("seed", options.get("seed"))
        model = data_mlp(ds, hidden, int(seed or 0))
        options.setdefault("name", "mlp")
    if isinstance(board, str):
        board = get_board(board)
    return compile_result(
        model,
        config,
        out_dir,
        formats=formats,
        calibrate=Calibrator(ds, calib_samples) if ds is not None else None,
        board=board,
        writers=DESIGN_WRITERS if writers is None else writers,
        notes=notes,
        **options,
    )
