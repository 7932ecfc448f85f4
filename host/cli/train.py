"""``pipetrain train [MODEL]``: compile, train on a target, report the test accuracy.

With no arguments it runs the main job: the built-in ``mlp-digits`` on scikit-learn's digits,
trained for :data:`DEFAULT_EPOCHS` epochs through the RTL simulation (``--target sim``), checked
bit for bit against the golden model on the same stream.

Targets (:func:`pipetrain.host.open`): ``sim`` (Verilator, over the host link on a loopback
port), ``golden`` (fixed-point golden model), ``reference`` (float PB reference trainer),
``serial://PORT[?baud=N]`` and ``tcp://HOST:PORT`` (a board or bridge over the link). Every
target gets the same plan, the same initial weights (the model initialised with ``--seed``) and
the same sample order (:func:`pipetrain.data.epoch_order`), so their numbers compare.

A board runs the plan fitted to it by ``pipetrain build MODEL --board NAME`` (board clock,
lanes, formats, memories): train it with the same ``--board NAME`` (and ``--seed``,
``--lanes``), e.g. ``pipetrain train --board icebreaker --target serial:///dev/ttyUSB1``; the
device refuses any other plan at HELLO (plan hash). ``--board`` with ``golden``/``sim`` shows
what that board's arithmetic learns, bit for bit.

Model ``mlp`` sizes a ReLU MLP from the data (features → ``--hidden`` → classes), for a
``--data FILE.npz`` that the digits models do not fit.

Epochs: ``--epochs N``, else the model file's ``config["epochs"]``, else
:data:`DEFAULT_EPOCHS`. They are not part of the compiled plan (the plan keeps the config's
value), but the ``auto`` formats are calibrated over them (``--calib-epochs``, default the
run's epochs; a resumed run: the checkpoint's): the weights grow while training, and formats
calibrated over 1 epoch clamped mlp-digits-deep's stage-1 ``w`` 181 (seed 1) and 2,046
(seed 2) times in 4 epochs, over 4 epochs 0 times
(:func:`~pipetrain.host.cli.options.calibration_epochs`). ``train --board B --epochs E``
streams the plan of ``build --board B --epochs E`` (build calibrates the same way; without
``--epochs`` over :data:`DEFAULT_EPOCHS`); that board trains any other number of epochs with
``--calib-epochs`` of its build, e.g. ``train --board icebreaker --epochs 10 --calib-epochs
4``; without it the run's epochs pick other formats, a plan the device refuses at HELLO.

``--json FILE`` gets ``{"target", "model", "test_accuracy", "float_test_accuracy",
"train_accuracy", "online_accuracy", "train_samples", "device_samples", "samples",
"samples_per_s", "seconds", "bit_exact", "mismatches", "retransmits", "saturations",
"stage_saturations", "head_online_accuracy", "tensor_saturations", "tensor_saturations_source",
"input_saturations", "epochs", "settings", "board", "schedule", "mitigation", "plan_hash",
"formats_source", "calib_epochs", "calib_samples", "sim_cycles", "wall_s"}``
(``calib_epochs``/``calib_samples``: the auto formats' calibration run, null when the formats
were not calibrated): accuracies are fractions in [0, 1]
(``float_test_accuracy``: the device's weights loaded into the original module, evaluated by
PyTorch in float;
``online_accuracy``: predictions made during training); ``train_samples`` are the training
samples the host streamed (``samples`` is the same number), ``device_samples`` the target's
``samples_trained`` counter (they must agree); ``samples_per_s`` is the training throughput;
``bit_exact`` compares the ``sim`` target's results, final weights and counters with the golden
model on the same stream (null for other targets, and ``mismatches`` empty); ``retransmits``
counts link frames sent again (null for ``golden`` and ``reference``, which have no link);
``saturations`` are the fixed-point saturation counters (0 for ``reference``, float);
``head_online_accuracy`` (only with auxiliary heads, on golden and link targets; absent
otherwise): per auxiliary head L_1 … L_{K−1}, the fraction of the training stream its loss unit
predicted right (the device's ``head_correct`` counters, read after training);
``tensor_saturations`` splits them by tensor (:func:`tensor_saturations`), also printed as a
table. ``settings`` says how the run was made: every
:class:`~pipetrain.compiler.config.TrainConfig` field as the plan was built from it (model file
and options merged; ``strategy``, ``blocks``, ``distance``, ``rule``, ``head_stages``, ``lr``,
``momentum`` and ``weight_decay`` at ``batch_ref``, ``seed``, ``schedule``, ``mitigation``,
``lwp_form``, ``loss``, ``rounding``) with ``epochs`` this run's. The printed summary shows
only the lines that apply to the target.

Checkpoints (docs/protocol.md §7): ``--checkpoint FILE`` flushes every ``--checkpoint-every N``
samples (default one epoch) and saves the run's state there atomically; ``--resume FILE``
continues that run bit for bit (same model, data and options; the epochs default to the
checkpoint's, a larger ``--epochs`` extends the run). With a resume the report covers the whole
run (``train_samples``, ``online_accuracy``) and adds ``resumed_at`` (the run's sample it
continued from); ``checkpoint`` names the file written. A resumed run prints where it
continues (``resuming FILE at epoch k of E …``, :func:`resume_point`) before it trains, and in
the summary.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
import torch
from torch import nn

from ...compiler.build import PlanError
from ...compiler.compile import CompileResult
from ...compiler.lanes import parse_lane_spec
from ...data import Dataset, load_data
from ...hdl.support import require_hdl
from ...sim.bridge import bridge_cached
from ...sim.golden import GoldenModel
from ...sim.harness import DEFAULT_SIMULATOR, check_toolchain
from ...sim.trainer import accuracy
from ...sim.verilator import RTLSimError, ToolchainError
from ..checkpoint import Checkpoint
from ..client import LinkError
from ..device import LINK_SCHEMES, LOCAL_TARGETS, Device, open
from ..flow import compile_design
from . import cli, emit_json, info, json_option, user_errors
from .options import (
    DEFAULT_EPOCHS,
    board_option,
    calibration_epochs,
    config_overrides,
    file_epochs,
    hidden_option,
    model_help,
    plan_format_options,
    simulator_option,
    train_config_options,
)

__all__ = [
    "DEFAULT_EPOCHS",
    "DEFAULT_MODEL",
    "DEFAULT_TARGET",
    "TrainCheckError",
    "resume_point",
    "run_training",
    "saturation_table",
    "tensor_saturations",
    "train_cmd",
]

#: The main job: model, target and epochs of ``pipetrain train`` without arguments.
DEFAULT_MODEL = "mlp-digits"
DEFAULT_TARGET = "sim"
# DEFAULT_EPOCHS (epochs when neither --epochs nor the model file sets them) is defined with
# the options, whose help shows it (pipetrain.host.cli.options.DEFAULT_EPOCHS).


class TrainCheckError(click.ClickException):
    """The target's books disagree with the host's (e.g. its trained-sample counter)."""


def _check_target(target: str) -> None:
    if target in ("sim", *LOCAL_TARGETS) or target.startswith(LINK_SCHEMES):
        return
    raise PlanError(
        f"unknown target {target!r}; choose one of: sim, {', '.join(LOCAL_TARGETS)}, "
        "serial://PORT[?baud=N], tcp://HOST:PORT"
    )


def _check_sizes(result: CompileResult, ds: Dataset) -> None:
    plan = result.plan
    hint = (
        f"; give data of the model's shape with --data FILE.npz (x_train: (n, "
        f"{plan.in_features})), or use model 'mlp', which sizes the network from the data"
    )
    wrong = ds.mismatch(plan.input_shape, result.name)
    if wrong and (len(plan.input_shape) > 1 or len(ds.shape) > 1):  # feature maps: both shapes
        raise PlanError(wrong)
    if ds.features != plan.in_features:
        raise PlanError(
            f"data {ds.name!r} has {ds.features} features but model {result.name!r} takes "
            f"{plan.in_features}{hint}"
        )
    if ds.classes > plan.loss.classes:
        raise PlanError(
            f"data {ds.name!r} has {ds.classes} classes but model {result.name!r} has "
            f"{plan.loss.classes} outputs{hint}"
        )


def _float_accuracy(
    model: nn.Module, state: dict[str, torch.Tensor], ds: Dataset, shape: tuple[int, ...] = ()
) -> float:
    """Accuracy of ``model`` with ``state`` loaded (strict), evaluated by PyTorch in float; the
    flat test samples are viewed as ``shape`` (a CNN's (C, L) / (C, H, W), the IR's
    ``input_shape``) first."""
    model.load_state_dict(state)
    x = ds.x_test.reshape(len(ds.x_test), *shape) if shape else ds.x_test
    with torch.no_grad():
        out = model(x.to(next(model.parameters()).dtype))
    return accuracy(out.argmax(dim=1), ds.y_test)


def run_training(
    result: CompileResult,
    target: str,
    ds: Dataset,
    epochs: int,
    *,
    progress: bool | None = None,
    verify: bool = True,
    save: str | None = None,
    board: str | None = None,
    simulator: str = DEFAULT_SIMULATOR,
    checkpoint: str | None = None,
    checkpoint_every: int | None = None,
    resume: Checkpoint | None = None,
    onchip: bool = False,
    calib_epochs: int | None = None,
    calib_samples: int | None = None,
) -> tuple[dict[str, Any], Device]:
    """Train ``result``'s model on ``target`` for ``epochs`` epochs of ``ds``; return the report
    (module docstring) and the closed device.

    ``verify``: for ``sim``, run the golden model on the same stream and compare
    (``bit_exact``). ``save``: write the trained ``state_dict`` there (``torch.save``).
    ``board``: the board ``result`` was fitted to (reported only). ``simulator``: the RTL
    simulator of the ``sim`` target (:data:`pipetrain.sim.harness.SIMULATORS`).
    ``checkpoint``, ``checkpoint_every``, ``resume``: :meth:`Device.train`'s checkpoints (flush
    and write the state every ``checkpoint_every`` samples; continue a run from a
    :class:`~pipetrain.host.checkpoint.Checkpoint`, refused with another plan before the target
    is opened; docs/protocol.md §7). ``onchip``: train through the device's on-chip training
    set (:meth:`Device.train`'s ``onchip``; ``sim`` builds its design with a set of the
    training split's size; docs/protocol.md §2 STORE/RUN). ``calib_epochs``,
    ``calib_samples``: how ``result``'s auto formats were calibrated (reported only; None:
    not calibrated, or not said).
    Raises :class:`PlanError` for an unknown target or data that does not fit the model,
    :class:`TrainCheckError` when the device's trained-sample counter differs from the host's.
    """
    _check_target(target)
    _check_sizes(result, ds)
    if target not in LOCAL_TARGETS:  # the RTL or a board: refused before any message or build
        require_hdl(result.plan, "train")
    if resume is not None and resume.plan_hash != result.plan.hash:
        resume.check(result.plan, "", 0, 0)  # names both plan hashes
    t_wall = time.perf_counter()
    if target == "sim":
        check_toolchain(simulator)
        built = bridge_cached(result.plan, simulator=simulator)
        click.echo(
            f"starting the RTL simulation ({simulator}"
            + ("" if built else "; building this design first, 20–60 s")
            + ")…",
            err=True,
        )
    sim_options: dict[str, Any] | None = {"simulator": simulator} if target == "sim" else None
    if sim_options is not None and onchip:
        sim_options["onchip_samples"] = len(ds.x_train)
    dev = open(
        result,
        target,
        shadow=verify and target == "sim",
        progress=progress,
        sim_options=sim_options,
    )
    with dev:
        rep = dev.train(
            ds.x_train,
            ds.y_train,
            epochs=epochs,
            checkpoint=checkpoint,
            checkpoint_every=checkpoint_every,
            resume=resume,
            onchip=onchip,
        )
        # the heads' loss units count their correct predictions (link targets, docs/ports.md);
        # read before the evaluation streams more samples through them
        heads_correct = dev.counters().get("head_correct") if result.plan.head_losses else None
        test_acc = dev.evaluate(ds.x_test, ds.y_test)
        train_acc = dev.evaluate(ds.x_train, ds.y_train)
        counters = dev.counters()
        state = dev.state_dict()
        check = dev.verify() if dev.shadow is not None else None
        retransmits = dev.retransmits
        per_tensor = tensor_saturations(dev)
    device_samples = int(counters["samples_trained"])
    if device_samples != rep.samples:
        raise TrainCheckError(
            f"the {target} target reports {device_samples} trained samples, the host streamed "
            f"{rep.samples}"
        )
    if save:
        torch.save(state, save)
    sats = [int(v) for v in counters.get("saturations", [])]
    report: dict[str, Any] = {
        "target": target,
        "model": result.name,
        "test_accuracy": test_acc,
        "float_test_accuracy": _float_accuracy(result.model, state, ds, result.ir.input_shape),
        "train_accuracy": train_acc,
        "online_accuracy": rep.accuracy,
        "train_samples": rep.samples,
        "device_samples": device_samples,
        "samples": rep.samples,
        "samples_per_s": rep.samples_per_s,
        "seconds": rep.seconds,
        "bit_exact": None if check is None else check.bit_exact,
        "mismatches": [] if check is None else check.mismatches,
        "retransmits": retransmits if target not in LOCAL_TARGETS else None,
        "saturations": sum(sats),
        "stage_saturations": sats,
        # only with auxiliary heads (a global plan has none: no key, not a null)
        **(
            {"head_online_accuracy": [c / max(rep.samples, 1) for c in heads_correct]}
            if heads_correct
            else {}
        ),
        **per_tensor,
        "epochs": epochs,
        # how the run was made: the resolved TrainConfig the plan was built from, this run's
        # epochs (an interlocking run that equals global reads strategy global, as trained)
        "settings": result.config.to_dict() | {"epochs": epochs},
        "board": board,
        "schedule": result.plan.schedule,
        "mitigation": result.plan.mitigation,
        "plan_hash": result.plan.hash,
        "formats_source": result.formats.source,
        "calib_epochs": calib_epochs,
        "calib_samples": calib_samples,
        "sim_cycles": (dev.sim_stats or {}).get("cycles"),
        "on_chip_data": onchip,
        "epoch_summaries": rep.epoch_summaries,
        "device_samples_per_s": rep.device_samples_per_s,
        "wall_s": time.perf_counter() - t_wall,
    }
    if save:
        report["saved"] = save
    if checkpoint:
        report["checkpoint"] = checkpoint
    if resume is not None:
        report["resumed_at"] = resume.position
    return report, dev


def tensor_saturations(dev: Device) -> dict[str, Any]:
    """The run's saturations per tensor kind (docs/numerics.md §8), from the golden model: the
    ``golden`` target itself, or the golden shadow of a link target (``--verify``; the RTL
    counts per stage only, and the shadow equals it stage by stage when ``bit_exact``).

    Returns ``{"tensor_saturations": [{"stage": "1", "y", "gin", "u", "w", "total"}, …,
    {"stage": "loss", "d", "total"}] or None (with auxiliary heads one ``loss L<t>`` row per
    loss unit, the true loss first, and a head stage's row has ``"head": k``, the block whose
    head it is, loss L_k), "tensor_saturations_source": "golden" |
    "golden shadow" | None, "input_saturations": input values clamped by the host's
    quantisation, summed over streamed samples (golden target only, else None)}``; each
    ``total`` is the stage's entry of ``stage_saturations`` below 2^32.
    """
    g = dev.trainer if isinstance(dev.trainer, GoldenModel) else dev.shadow
    if g is None:
        return {
            "tensor_saturations": None,
            "tensor_saturations_source": None,
            "input_saturations": None,
        }
    rows: list[dict[str, Any]] = []
    K = getattr(g, "K", 1)  # loss units: the true loss, then the heads' L_1 … L_{K−1}
    losses = ["loss"] if K == 1 else [f"loss L{K}", *(f"loss L{t}" for t in range(1, K))]
    for k, counts in enumerate(g.tensor_saturations, start=1):
        name = str(k) if k <= g.S else losses[k - g.S - 1]
        spec = g.stages[k - 1].spec if k <= g.S else None
        head = {"head": spec.block} if spec is not None and spec.role == "head" else {}
        rows.append({"stage": name, **head, **counts, "total": sum(counts.values())})
    own = g is dev.trainer
    return {
        "tensor_saturations": rows,
        "tensor_saturations_source": "golden" if own else "golden shadow",
        "input_saturations": g.input_saturations if own else None,
    }


def saturation_table(report: dict[str, Any]) -> list[str]:
    """The summary's per-tensor saturation table (lines) of ``report["tensor_saturations"]``:
    stages in plan order (a head stage marked ``(head k)``), then the loss units L1 … LK, a line
    saying what the ``d`` column counts, and the host's input clamps; empty when the report has
    none (``reference``, a link target without a shadow)."""
    rows = report.get("tensor_saturations")
    if not rows:
        return []
    src = report.get("tensor_saturations_source")
    where = "the golden shadow; the RTL counts per stage" if src == "golden shadow" else "golden"
    head = f"saturations per tensor ({where}):"
    cols = ("y", "gin", "u", "w", "d")
    # stages in plan order, then the loss units by loss number (L1 … L_K; the JSON keeps the
    # counters' order, the true loss first); the stage column as wide as its longest name
    stages = [r for r in rows if not str(r["stage"]).startswith("loss")]
    losses = sorted(
        (r for r in rows if str(r["stage"]).startswith("loss")),
        key=lambda r: int(str(r["stage"])[6:] or 0),
    )
    names = {id(r): str(r["stage"]) + (f" (head {r['head']})" if "head" in r else "") for r in rows}
    width = max(len("stage"), *map(len, names.values())) + 1
    out = [head, f"  {'stage':<{width}}" + "".join(f"{c:>9}" for c in cols) + f"{'total':>10}"]
    for r in (*stages, *losses):
        cells = "".join(f"{r[c]:>9}" if c in r else f"{'-':>9}" for c in cols)
        out.append(f"  {names[id(r)]:<{width}}{cells}{r['total']:>10}")
    out.append("  d: δ clamps of a loss unit (docs/numerics.md §4.6), or of a stage's δ sum (§5.6)")
    if report.get("input_saturations") is not None:
        out.append(f"  input x (host quantisation): {report['input_saturations']}")
    return out


def resume_point(path: str, ck: Checkpoint, epochs: int) -> str:
    """Where a resumed run continues: ``FILE at epoch k of E (sample s of n in it; from sample
    p of the run)`` for a checkpoint at run sample p = (k − 1)·n + s of a run of E epochs of n
    samples (positions in samples, docs/protocol.md §7)."""
    k, s = divmod(ck.position, max(ck.samples, 1))
    return (
        f"{path} at epoch {k + 1} of {epochs} (sample {s} of {ck.samples} in it; from sample "
        f"{ck.position} of the run)"
    )


@cli.command("train")
@model_help(DEFAULT_MODEL)
@click.argument("model", default=DEFAULT_MODEL)
@click.option(
    "--target",
    default=DEFAULT_TARGET,
    show_default=True,
    help="sim (RTL in Verilator over the link), golden (fixed point), reference (float), "
    "serial://PORT[?baud=N] or tcp://HOST:PORT.",
)
@click.option("--data", default="digits", show_default=True, help="digits or a FILE.npz.")
@hidden_option
@plan_format_options
@board_option(
    "Fit the plan to this board as `pipetrain build --board` does (board clock, lanes, "
    "formats, memories), so it matches the board's bitstream (see `pipetrain list-boards`)."
)
@click.option(
    "--save", type=click.Path(dir_okay=False), default=None, help="Save the state_dict (.pt)."
)
@click.option(
    "--verify/--no-verify",
    default=True,
    show_default=True,
    help="sim: compare with the golden model on the same stream (bit_exact).",
)
@click.option(
    "--progress/--no-progress", default=None, help="Progress bar (default: on a terminal)."
)
@click.option(
    "--checkpoint",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the run's state to FILE (atomically) at every flush point, for --resume.",
)
@click.option(
    "--checkpoint-every",
    type=click.IntRange(min=1),
    default=None,
    help="Samples between flush points (and checkpoints); default one epoch. The stream is "
    "flushed there, so a resumed run equals an uninterrupted one with the same value.",
)
@click.option(
    "--resume",
    type=click.Path(dir_okay=False),
    default=None,
    help="Continue the run saved in this checkpoint, bit for bit (same model, data, options).",
)
@click.option(
    "--on-chip-data",
    "onchip",
    is_flag=True,
    help="Upload the training set once into the device's on-chip set and let it run the "
    "epochs in its own order (a board built with `build --on-chip-data N`; sim builds one).",
)
@simulator_option
@train_config_options
@json_option
@user_errors
def train_cmd(
    model: str,
    target: str,
    data: str,
    hidden: str | None,
    formats: str,
    format_items: tuple[str, ...],
    calib_epochs: int | None,
    calib_samples: int | None,
    lanes_text: str | None,
    board_name: str | None,
    save: str | None,
    verify: bool,
    progress: bool | None,
    simulator: str,
    checkpoint: str | None,
    checkpoint_every: int | None,
    resume: str | None,
    onchip: bool,
    json_out: str | None,
    **options: Any,
) -> None:
    """Train MODEL on --target and report its test accuracy.

    MODEL is compiled into a plan first, as `pipetrain compile` does (fitted to --board when
    given), then trained for --epochs on the target: sim (the default: the RTL in Verilator),
    golden (the fixed-point model), reference (float) or a board over serial:// or tcp://."""
    _check_target(target)
    overrides = config_overrides(options)
    epochs = overrides.pop("epochs", None)
    ck = Checkpoint.load(resume) if resume else None
    if epochs is None and ck is not None:
        epochs = ck.epochs
    if epochs is None:
        epochs = file_epochs(model) or DEFAULT_EPOCHS
    if epochs < 1:
        raise PlanError(f"--epochs must be ≥ 1, got {epochs}")
    # the formats cover the run (a resumed run: the one that wrote the checkpoint, whose plan
    # it holds, also when a larger --epochs extends it)
    calib_epochs = calibration_epochs(
        model, calib_epochs, ck.epochs if ck is not None else epochs, calib_samples, formats
    )
    lanes, col_lanes = parse_lane_spec(lanes_text) if lanes_text is not None else (None, None)
    if save and not Path(save).resolve().parent.is_dir():
        raise PlanError(f"--save {save!r}: the folder does not exist")
    if checkpoint and not Path(checkpoint).resolve().parent.is_dir():
        raise PlanError(f"--checkpoint {checkpoint!r}: the folder does not exist")
    ds = load_data(data)
    result = compile_design(
        model,
        data=ds,
        hidden=hidden,
        board=board_name,
        config_overrides=overrides,
        formats=formats,
        format_overrides=list(format_items),
        calib_samples=calib_samples,
        calib_epochs=calib_epochs,
        lanes=lanes,
        col_lanes=col_lanes,
        writers=(),
        # a hardware target refuses a network its HDL does not build before calibrating
        check=None if target in LOCAL_TARGETS else lambda ir: require_hdl(ir, "train"),
        # the board's design holds the set: it must fit next to the network (FitError)
        onchip_samples=len(ds.x_train) if onchip and board_name else 0,
    )
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    if ck is not None and ck.position < epochs * ck.samples:  # else check() says why not
        info(f"resuming {resume_point(str(resume), ck, epochs)}", json_out)
    calibrated = result.formats.source.startswith("auto")  # not static, default
    try:
        report, _ = run_training(
            result,
            target,
            ds,
            epochs,
            progress=progress,
            verify=verify,
            save=save,
            board=board_name,
            simulator=simulator,
            checkpoint=checkpoint,
            checkpoint_every=checkpoint_every,
            resume=ck,
            onchip=onchip,
            calib_epochs=calib_epochs if calibrated else None,
            calib_samples=calib_samples if calibrated else None,
        )
    except (ToolchainError, RTLSimError, LinkError) as exc:
        raise click.ClickException(str(exc)) from exc
    bit = report["bit_exact"]
    link = target not in LOCAL_TARGETS  # golden/reference: no link, no device, no RTL check
    lines = [
        f"{result.name} on {target}"
        + (f" (the plan fitted to {board_name})" if board_name else "")
        + f": {epochs} epoch{'s' if epochs != 1 else ''}, {report['train_samples']} samples"
        + (f" ({report['device_samples']} trained by the device)" if link else "")
        + f", {report['samples_per_s']:.0f} samples/s",
        *(
            [
                "formats: calibrated over "
                + (
                    f"{calib_samples} samples"
                    if calib_samples is not None
                    else f"{calib_epochs} epoch{'s' if calib_epochs != 1 else ''}"
                )
            ]
            if calibrated
            else []
        ),
        f"test_accuracy: {report['test_accuracy']:.4f}",
        f"float_test_accuracy: {report['float_test_accuracy']:.4f} (weights in PyTorch)",
    ]
    if bit is not None:
        lines.append(f"bit_exact: {str(bit).lower()} (against the golden model)")
    if report["device_samples_per_s"]:
        lines.append(
            f"on-chip set: the device ran {report['device_samples_per_s']:.0f} samples/s at "
            f"{result.plan.clock_hz / 1e6:g} MHz (its own cycle count)"
        )
    if link:
        lines.append(f"retransmits: {report['retransmits']}, saturations: {report['saturations']}")
    heads = report.get("head_online_accuracy")
    if heads:
        lines.append(
            "head accuracy during training (the heads' loss units): "
            + ", ".join(f"L{k} {a:.4f}" for k, a in enumerate(heads, start=1))
        )
    if target == "golden":
        lines.append(f"saturations: {report['saturations']}")
    lines += saturation_table(report)
    lines += [f"  mismatch: {m}" for m in report["mismatches"]]
    if save:
        lines.append(f"saved: {save}")
    if resume and ck is not None:
        lines.append(f"resumed: {resume_point(resume, ck, epochs)}")
    if checkpoint:
        lines.append(f"checkpoint: {checkpoint}")
    info("\n".join(lines), json_out)
    emit_json(json_out, report)
    if bit is False:
        raise click.ClickException("the RTL differs from the golden model (bit_exact: false)")
