"""Compile a model into a plan and its artifacts: front end → formats → lanes → (fit) → plan
→ files.

:func:`compile_result` is the compiler's whole pass list. Two steps are handed in by the caller
because they belong to higher layers (docs/architecture.md §1): ``calibrate`` (the float
calibration run of :mod:`pipetrain.sim.calibrate`, for ``formats="auto"``) and extra artifact
``writers`` (the Verilog of :func:`pipetrain.hdl.verilog.write_verilog`). The library entry that
wires both is :func:`pipetrain.host.flow.compile_design`. With ``board``, the plan is fitted to
the board by :func:`pipetrain.compiler.fit.fit_plan`.

The artifacts are written by the writers (default :data:`ARTIFACT_WRITERS`: ``plan.json``,
``report.md``) into a temporary sibling folder of ``out_dir`` that is renamed into place at the
end, so a failed compile leaves nothing behind (and an earlier output folder intact).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from .build import (
    CONST_MANTISSA_BITS,
    LOGIC_LOW_BITS,
    OPERAND_BITS,
    FormatSpec,
    PlanError,
    stage_slots,
)
from .config import TrainConfig, check_strategy_options, global_if_same
from .fit import PlanRequest, ShellSource, board_request, check_fit, fit_plan, plan_with_lanes
from .formats import (
    Ranges,
    apply_overrides,
    check_override_widths,
    formats_from_ranges,
    parse_format_overrides,
    static_formats,
)
from .frontend import trace
from .ir import NetworkIR
from .lanes import choose_lanes, lane_multipliers, lanes_for_tick
from .models import ModelError, load_model
from .plan import Plan, QFormat
from .report import render_report
from .targets import Board

__all__ = [
    "CompileResult",
    "ArtifactWriter",
    "ARTIFACT_WRITERS",
    "write_plan_json",
    "write_report_md",
    "Calibrate",
    "compile_model",
    "compile_result",
]


@dataclass
class CompileResult:
    """Everything a compile produced (what the artifact writers get).

    Members
    -------
    name: model name (built-in name or the model file's stem).
    model: the user's module (parameters as initialised with ``config.seed``).
    ir: the traced network.
    config: the resolved training settings.
    formats: the format spec the plan was built from (with calibrated ranges for ``auto``).
    plan: the plan.
    warnings: warning messages (front end, lanes) for the report and the CLI.
    out_dir: the final output folder (None when nothing is written).
    files: names of the files written into ``out_dir``.
    board: the board the plan was fitted to (None: not fitted).
    fit: the board's ``{resource: {needed, available}}`` rows of the fitted plan
        (:func:`~pipetrain.compiler.fit.check_fit`, with the shell; None: not fitted).
    """

    name: str
    model: nn.Module
    ir: NetworkIR
    config: TrainConfig
    formats: FormatSpec
    plan: Plan
    warnings: list[str] = field(default_factory=list)
    out_dir: Path | None = None
    files: list[str] = field(default_factory=list)
    board: Board | None = None
    fit: dict | None = None


#: An artifact writer: ``writer(result, folder)`` writes its files into ``folder`` (a
#: temporary folder that becomes ``result.out_dir``) and returns their names.
ArtifactWriter = Callable[[CompileResult, Path], Sequence[str]]


def write_plan_json(result: CompileResult, folder: Path) -> Sequence[str]:
    """Write ``plan.json`` (canonical JSON, :meth:`Plan.to_json`)."""
    (folder / "plan.json").write_text(result.plan.to_json() + "\n")
    return ["plan.json"]


def write_report_md(result: CompileResult, folder: Path) -> Sequence[str]:
    """Write ``report.md`` (:func:`pipetrain.compiler.report.render_report`, with the board
    and fit of a fitted plan)."""
    text = render_report(
        result.plan,
        warnings=result.warnings,
        notes=result.formats.notes,
        formats_source=result.formats.source,
        board=result.board,
        fit=result.fit,
    )
    (folder / "report.md").write_text(text + "\n")
    return ["report.md"]


#: The compiler's own artifacts, written in order; callers append their layer's writers (the
#: Verilog writer :func:`pipetrain.hdl.verilog.write_verilog`).
ARTIFACT_WRITERS: list[ArtifactWriter] = [write_plan_json, write_report_md]

#: The calibration step: ``calibrate(model, ir, config)`` returns the ranges the auto formats
#: are chosen from (:class:`pipetrain.sim.calibrate.Calibrator`), or None when it has no data
#: for this network (the formats are then :func:`~pipetrain.compiler.formats.static_formats`).
#: A ``notes`` attribute, read after the call, adds lines to the report's format notes.
Calibrate = Callable[[nn.Module, NetworkIR, TrainConfig], Ranges | None]


def _load(
    model_spec: str | nn.Module, seed: int
) -> tuple[str, nn.Module, dict | TrainConfig | None]:
    if isinstance(model_spec, nn.Module):
        return type(model_spec).__name__, model_spec, None
    if not isinstance(model_spec, str):
        raise ModelError(
            f"model must be a built-in name, a .py path or an nn.Module, got "
            f"{type(model_spec).__name__}"
        )
    return load_model(model_spec, seed=seed)


def _weight_max(model: nn.Module, ir: NetworkIR) -> dict[int, float]:
    """``{stage (1-based): max|w|}`` over each traced Linear layer's weight and bias (real
    values), for :func:`~pipetrain.compiler.formats.static_formats`."""
    out = {}
    for s, layer in enumerate(ir.layers, start=1):
        params = [p for p in model.get_submodule(layer.name).parameters(recurse=False)]
        out[s] = max((float(p.detach().abs().max()) for p in params if p.numel()), default=0.0)
    return out


def compile_result(
    model_spec: str | nn.Module,
    config: TrainConfig | None = None,
    out_dir: str | os.PathLike | None = None,
    *,
    config_overrides: Mapping | None = None,
    formats: str | FormatSpec = "auto",
    format_overrides: Mapping[str, QFormat] | Sequence[str] | None = None,
    calibrate: Calibrate | None = None,
    board: Board | None = None,
    shell: ShellSource = None,
    lanes: Sequence[int] | None = None,
    col_lanes: Sequence[int] | None = None,
    target_cycles: int | None = None,
    max_multipliers: int | None = None,
    memory_budget_bits: int = 0,
    clock_hz: float = 50e6,
    const_bits: int = CONST_MANTISSA_BITS,
    single_port: Sequence[int] = (),
    operand_bits: int | None = OPERAND_BITS,
    logic_low_bits: int | None = LOGIC_LOW_BITS,
    operand_registers: int = 0,
    writers: Sequence[ArtifactWriter] | None = None,
    name: str | None = None,
    seed: int | None = None,
    notes: Sequence[str] = (),
    check: Callable[[NetworkIR], None] | None = None,
    sample_shape: tuple[int, ...] | None = None,
) -> CompileResult:
    """Compile ``model_spec`` and return the :class:`CompileResult`; see :func:`compile_model`."""
    overrides = dict(config_overrides or {})
    if seed is not None:
        overrides["seed"] = seed
    seed0 = overrides.get("seed")
    loaded_name, model, file_config = _load(model_spec, seed0 if seed0 is not None else 0)
    from_file = config is None and "strategy" in (file_config or {})
    if config is None:
        config = TrainConfig.from_dict(file_config)
    config = config.replace(**overrides)
    check_strategy_options(config, overrides, from_file)
    if seed0 is None and config.seed != 0 and isinstance(model_spec, str):
        # the model file's config chose another seed: initialise with it
        loaded_name, model, _ = _load(model_spec, config.seed)
    name = name or loaded_name
    caught: list[str] = []
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        ir = trace(model, name, config.loss, sample_shape)
        config, same = global_if_same(config, len(ir.layers), overrides)
        if same:
            warnings.warn(same, stacklevel=2)
        if check is not None:
            check(ir)
        if isinstance(format_overrides, (list, tuple)):
            fmt_over = parse_format_overrides(format_overrides)
        else:
            fmt_over = dict(format_overrides or {})
        if target_cycles is not None and lanes is None and max_multipliers is None:
            # fail fast, before calibrating: the cycles do not depend on the formats, so the
            # default formats' plans say whether (and with which lanes) the tick is reachable
            ones = tuple(1 for _ in stage_slots(ir, config))
            early = PlanRequest(ir, config, FormatSpec.default(len(ir.layers)), ones,
                                clock_hz=clock_hz, memory_budget_bits=memory_budget_bits,
                                const_bits=const_bits, single_port=tuple(single_port),
                                operand_bits=operand_bits, logic_low_bits=logic_low_bits,
                                operand_registers=operand_registers)  # fmt: skip
            early = early if board is None else board_request(early, board)
            lanes_for_tick(ir, config, target_cycles, _plans_of(early, board))
        if max_multipliers is None:
            chosen = choose_lanes(ir, config, lanes, target_cycles)  # fail fast
        elif lanes is not None or target_cycles is not None:
            choose_lanes(ir, config, lanes, target_cycles, max_multipliers)  # one policy: raises
        if fmt_over:  # check the override keys and widths before a calibration run
            check_override_widths(fmt_over)
            apply_overrides(FormatSpec.default(len(ir.layers)), fmt_over, ir, config)
        if isinstance(formats, FormatSpec):
            spec = apply_overrides(formats, fmt_over, ir, config)
        elif formats == "default":
            spec = apply_overrides(FormatSpec.default(len(ir.layers)), fmt_over, ir, config)
        elif formats == "static":
            spec = static_formats(_weight_max(model, ir), config, ir, fmt_over)
        elif formats == "auto":
            if calibrate is None:
                raise PlanError(
                    "formats 'auto' need a calibration run: compile through "
                    "pipetrain.host.flow.compile_design (it calibrates on --data), pass "
                    "calibrate=pipetrain.sim.calibrate.Calibrator(dataset), or use "
                    "formats='static' or 'default'"
                )
            ranges = calibrate(model, ir, config)
            notes = (*notes, *getattr(calibrate, "notes", ()))
            if ranges is None:  # the calibrator's (default) data does not fit this network
                spec = static_formats(_weight_max(model, ir), config, ir, fmt_over)
            else:
                spec = formats_from_ranges(ranges, config, ir, fmt_over)
        else:
            raise PlanError(
                f"formats must be 'auto', 'static', 'default' or a FormatSpec, got {formats!r}"
            )
        if notes:
            spec = dataclasses.replace(spec, notes=(*notes, *spec.notes))
        request = PlanRequest(
            ir,
            config,
            spec,
            tuple(chosen) if max_multipliers is None else tuple(1 for _ in stage_slots(ir, config)),
            lanes_given=any(v is not None for v in (lanes, target_cycles, max_multipliers)),
            lanes_option=(
                f"--max-multipliers {max_multipliers}"
                if max_multipliers is not None
                else f"--target-cycles {target_cycles}"
                if target_cycles is not None
                else None
            ),
            clock_hz=clock_hz,
            memory_budget_bits=memory_budget_bits,
            const_bits=const_bits,
            single_port=tuple(single_port),
            operand_bits=operand_bits,
            logic_low_bits=logic_low_bits,
            operand_registers=operand_registers,
            col_lanes=tuple(col_lanes) if col_lanes and any(k > 1 for k in col_lanes) else None,
            # column lanes outpace a serial loss unit: its fastest form, as the fit's choice
            loss_fastest=bool(col_lanes and any(k > 1 for k in col_lanes)),
        )
        if target_cycles is not None:  # the tick itself: the board's options set the passes
            at = request if board is None else board_request(request, board)
            chosen = lanes_for_tick(ir, config, target_cycles, _plans_of(at, board))
            request = request.replace(lanes=tuple(chosen))
        if max_multipliers is not None:  # the formats and constants decide which products
            # exist: with a board, the board's (its constants, e.g. 5-bit shift-adds on iCE40)
            at = request if board is None else board_request(request, board)
            per_lane = lane_multipliers(
                ir, config, at.formats, const_bits=at.const_bits, single_port=at.single_port,
                operand_bits=at.operand_bits, ram_family=at.ram_family,
                logic_low_bits=at.logic_low_bits,
            )  # fmt: skip
            chosen = choose_lanes(
                ir,
                config,
                max_multipliers=max_multipliers,
                per_lane=per_lane,
                count=lambda lanes: at.replace(lanes=lanes).build().multipliers,
            )
            request = request.replace(lanes=tuple(chosen))
        fit = None
        if board is None:
            plan = request.build()
        else:
            plan, request = fit_plan(request, board, shell)
            fit = check_fit(plan, board, shell)
    for rec in records:
        caught.append(str(rec.message))
    result = CompileResult(
        name, model, ir, config, request.formats, plan, caught, board=board, fit=fit
    )
    if out_dir is not None:
        _write_artifacts(result, Path(out_dir), ARTIFACT_WRITERS if writers is None else writers)
    return result


def _plans_of(request: PlanRequest, board: Board | None) -> Callable[[tuple[int, ...]], Plan]:
    """The plan of each lane count as the build makes it: with a board as the fit builds it
    (:func:`~pipetrain.compiler.fit.plan_with_lanes`: one-lane stages on SPRAM where the board
    has it, a slot every 2 cycles), so ``--target-cycles`` counts the cycles the fitted plan
    has (the iCEBreaker's 1,1 ticks 4,167 on SPRAM, not 2,087)."""
    if board is None:
        return lambda lanes: request.replace(lanes=lanes).build()
    return lambda lanes: plan_with_lanes(request, board, lanes)[0]


def compile_model(
    model_spec: str | nn.Module,
    config: TrainConfig | None = None,
    out_dir: str | os.PathLike | None = None,
    **options,
) -> Plan:
    """Compile a model into a :class:`Plan`; with ``out_dir`` also write the artifacts.

    ``model_spec``: a built-in name (``mlp-digits``), a ``.py`` file defining ``model`` (and
    optionally ``config``), or an ``nn.Module``. ``config``: the training settings (default: the
    model file's ``config``, else :class:`TrainConfig` defaults); ``config_overrides`` (a dict of
    TrainConfig fields, ``None`` values ignored) are applied on top. Interlocking learning
    that is global (:func:`~pipetrain.compiler.config.global_if_same`) or local (distance 0,
    :func:`~pipetrain.compiler.config.local_if_distance_zero`) is compiled as that strategy,
    with a line in the result's ``warnings``.

    Options: ``formats`` (``"auto"``: formats from the ranges that ``calibrate(model, ir,
    config)`` returns, :func:`~pipetrain.compiler.formats.formats_from_ranges`; ``"static"``:
    no calibration data, the defaults widened for the initial weights,
    :func:`~pipetrain.compiler.formats.static_formats`; ``"default"``:
    :meth:`FormatSpec.default`; or a FormatSpec), ``format_overrides`` (``{"s1.x": QFormat}`` or
    ``["s1.x=Q3.12", …]``), lanes via ``lanes``/``target_cycles``/``max_multipliers``
    (:func:`~pipetrain.compiler.lanes.choose_lanes`), ``memory_budget_bits`` (0 = none),
    ``clock_hz``, ``const_bits``, ``single_port``, ``operand_bits``, ``logic_low_bits`` and
    ``operand_registers`` (:func:`~pipetrain.compiler.build.build_plan`: constant precision,
    SPRAM stages, the multipliers' operand width — 18 by default, None keeps every product
    exact —, the widest low piece of a constant product formed in logic, and the multipliers'
    operand registers, 0 or 1), ``board`` (fit the plan to it,
    :func:`~pipetrain.compiler.fit.fit_plan`: its clock, constants, low pieces in logic,
    operand registers, formats, lanes and SPRAM replace those options; lanes not given: the
    fastest that fit),
    ``shell`` (the board design's memories outside the plan,
    :class:`~pipetrain.compiler.fit.Shell` or a function of the plan; counted in the fit),
    ``writers`` (default :data:`ARTIFACT_WRITERS`), ``name``, ``seed`` (shorthand for
    ``config_overrides={"seed": …}``), ``notes`` (lines put first in the format notes of the
    report, e.g. which data calibrated the formats), ``check`` (called with the
    traced :class:`~pipetrain.compiler.ir.NetworkIR` before calibration and fitting: a hardware
    command refuses a network its HDL does not build before any work, raising its own error),
    ``sample_shape`` (one sample's shape in the caller's data, ``Dataset.shape``: a
    convolution network without ``model.input_shape`` takes it where it fits,
    :func:`~pipetrain.compiler.frontend.trace`).

    ``out_dir`` receives ``plan.json`` and ``report.md`` (plus later writers' files). They are
    written into a temporary sibling folder that replaces ``out_dir`` at the end; an existing
    ``out_dir`` is replaced only if it is empty or holds a ``plan.json`` (an earlier compile).

    Raises :class:`~pipetrain.compiler.models.ModelError` (incl. ``CompileError``) for a bad
    model, :class:`~pipetrain.compiler.config.ConfigError` for bad settings,
    :class:`~pipetrain.compiler.build.PlanError` (incl. ``FormatError``) for a design that is
    invalid, :class:`~pipetrain.compiler.fit.FitError` for a plan that does not fit ``board``,
    and whatever ``calibrate`` raises.
    """
    return compile_result(model_spec, config, out_dir, **options).plan


def _nearest_existing(path: Path) -> Path:
    p = path.resolve().parent
    while not p.exists():
        p = p.parent
    return p


def _write_artifacts(result: CompileResult, out: Path, writers: Sequence[ArtifactWriter]) -> None:
    if out.exists() and not out.is_dir():
        raise PlanError(f"output path {str(out)!r} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / "plan.json").is_file():
        raise PlanError(
            f"output folder {str(out)!r} is not empty and holds no plan.json (not an earlier "
            "compile); refusing to replace it — choose another --out"
        )
    base = _nearest_existing(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=base))
    old: Path | None = None
    try:
        files: list[str] = []
        result.out_dir = out
        for writer in writers:
            files.extend(writer(result, tmp))
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old / "previous")
        os.replace(tmp, out)
        result.files = files
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and (old / "previous").exists() and not out.exists():
            os.replace(old / "previous", out)  # put the earlier output back
        result.out_dir = None
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
