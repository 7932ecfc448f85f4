"""Options shared by the subcommands: every TrainConfig field, the plan's formats and lanes,
and the parsers behind them."""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Callable
from typing import Any

import click

from ...compiler.build import PlanError
from ...compiler.config import LOSSES, ROUNDINGS, TrainConfig, strategy_overrides
from ...compiler.models import BUILTIN_MODELS, DATA_MLP, load_model
from ...compiler.schedule import LWP_FORMS, MITIGATIONS, RULES, SCHEDULES, STRATEGIES
from ...compiler.targets import BOARDS
from ...sim.harness import DEFAULT_SIMULATOR, SIMULATORS
from ..flow import DEFAULT_HIDDEN

__all__ = [
    "DEFAULT_EPOCHS",
    "FORMATS_HELP",
    "model_text",
    "model_help",
    "calibration_epochs",
    "file_epochs",
    "train_config_options",
    "config_options",
    "plan_format_options",
    "simulator_option",
    "board_option",
    "data_option",
    "hidden_option",
    "onchip_data_option",
    "config_overrides",
    "parse_memory",
]

#: Epochs of ``pipetrain train`` when neither ``--epochs`` nor the model file sets them:
#: mlp-digits reaches ≥ 0.95 test accuracy on digits for seeds 0–2 (golden model; 1 epoch gives
#: 0.84–0.91).
DEFAULT_EPOCHS = 4

#: ``--formats`` help, one sentence per choice: when to pick it (the choices are
#: :func:`~pipetrain.compiler.compile.compile_result`'s ``formats``; ``static`` is
#: :func:`~pipetrain.compiler.formats.static_formats`, ``default`` ``FormatSpec.default``).
FORMATS_HELP = (
    "auto: formats calibrated by a training run on --data (float reference, then golden "
    "passes), for when you have the model's training data (compile/build without --data, for "
    "a model digits does not fit: static). static: for a model without data, the fixed "
    "formats (x/y Q5.10, d Q1.14, w/u Q3.20) with w/u given more integer bits where the "
    "initial weights need them. default: the fixed formats exactly, never widened (larger "
    "initial weights clamp), the same for every model and seed, e.g. to compare plans."
)


#: (option, TrainConfig field, click type, help) for every training setting.
_CONFIG_OPTIONS: tuple[tuple[str, str, Any, str], ...] = (
    ("--schedule", "schedule", click.Choice(SCHEDULES), "pb (pipelined) or sequential (D = 0)."),
    ("--lr", "lr", float, "Reference learning rate η (at --batch-ref)."),
    ("--momentum", "momentum", float, "Reference momentum m (at --batch-ref)."),
    (
        "--momentum-digits",
        "momentum_digits",
        int,
        "Most signed digits of the hardware's momentum constant (0.9 at 4: 0.8984375, m·u "
        "with 3 adders; 0: full precision).",
    ),
    ("--weight-decay", "weight_decay", float, "L2 weight decay λ."),
    ("--batch-ref", "batch_ref", int, "Batch size of the reference η, m (scaled to batch 1)."),
    ("--mitigation", "mitigation", click.Choice(MITIGATIONS), "Delay mitigation."),
    ("--lwp-form", "lwp_form", click.Choice(LWP_FORMS), "Linear Weight Prediction form."),
    ("--strategy", "strategy", click.Choice(STRATEGIES), "Learning strategy."),
    ("--distance", "distance", int, "Interlocking distance d (blocks)."),
    ("--rule", "rule", click.Choice(RULES), "Interlocking rule."),
    ("--blocks", "blocks", str, "Main stages after which a block ends, e.g. 2 or 1,3."),
    ("--head-stages", "head_stages", int, "Linear stages per auxiliary head."),
    ("--loss", "loss", click.Choice(LOSSES), "Loss function."),
    ("--rounding", "rounding", click.Choice(ROUNDINGS), "Rounding of weight updates."),
    (
        "--lfsr-leap",
        "lfsr_leap",
        int,
        "LFSR steps per stochastic-rounding draw: 16 without Spike Compensation (a smaller "
        "leap matrix a lane), ≥ 32 with it; 0: the LFSR width, 32.",
    ),
    ("--seed", "seed", int, "Seed of initialisation, data order and LFSRs."),
    ("--epochs", "epochs", int, "Passes over the training set."),
)


def _config_default(field: str) -> str:
    """The ``[default: …]`` text of a TrainConfig option: the field's
    :class:`~pipetrain.compiler.config.TrainConfig` default, which a model file's ``config``
    replaces (``--epochs``: ``train`` runs :data:`pipetrain.host.cli.train.DEFAULT_EPOCHS`)."""
    if field == "epochs":
        return (
            f"the model file's config, else {DEFAULT_EPOCHS}; not a plan field, but the auto "
            "formats are calibrated over them (so they set the plan's formats and hash) unless "
            "--calib-epochs is given"
        )
    value = getattr(TrainConfig(), field)
    text = getattr(value, "value", value)
    if isinstance(text, tuple):
        text = ",".join(map(str, text)) or "none"
    return f"{text}, or the model file's config"


def model_text(default: str | None = None, also: str = "") -> str:
    """The MODEL paragraph of a command's ``--help``: the built-in names, read from
    :data:`~pipetrain.compiler.models.BUILTIN_MODELS` (so the list cannot go stale), the
    data-sized :data:`~pipetrain.compiler.models.DATA_MLP` (:func:`pipetrain.host.flow.data_mlp`,
    which every command that compiles through :func:`~pipetrain.host.flow.compile_design`
    accepts) and a model file (:func:`~pipetrain.compiler.models.load_model`); ``also``: a
    sentence of the command's own; ``default``: the command's default MODEL, if it has one."""
    text = (
        f"MODEL: a built-in network ({', '.join(BUILTIN_MODELS)}); {DATA_MLP}, a ReLU MLP "
        "sized from the data (its features → --hidden → its classes); or a FILE.py that "
        "defines `model` (an nn.Module, or a function returning one) and may define `config` "
        "(TrainConfig fields)."
    ) + (f" {also}" if also else "")
    return text if default is None else f"{text}  [default: {default}]"


def model_help(default: str | None = None, also: str = "") -> Callable[[Callable], Callable]:
    """A decorator, placed right below ``@cli.command``, that puts :func:`model_text` into the
    command's help after its first paragraph (the one-line summary click lists stays first).
    The paragraph is wrapped here, never at a hyphen (click's ``\\b``: not rewrapped), so no
    model name is split across lines (``mlp-`` / ``digits-deep8``): 76 columns, 78 with
    click's indent, as wide as click wraps the rest at 80."""

    def add(func: Callable) -> Callable:
        first, _, rest = inspect.cleandoc(func.__doc__ or "").partition("\n\n")
        text = textwrap.fill(
            model_text(default, also), 76, break_on_hyphens=False, break_long_words=False
        )
        func.__doc__ = "\n\n".join(p for p in (first, "\b\n" + text, rest) if p)
        return func

    return add


def config_options(*fields: str) -> Callable[[Callable], Callable]:
    """A decorator adding the TrainConfig options of ``fields`` (all when none are named;
    default: unset, i.e. keep the model's config; the help shows the TrainConfig default).
    Their values reach the command's ``**options``, for :func:`config_overrides`."""
    chosen = [o for o in _CONFIG_OPTIONS if not fields or o[1] in fields]

    def add(func: Callable) -> Callable:
        for opt, field, typ, text in reversed(chosen):
            func = click.option(
                opt,
                field,
                type=typ,
                default=None,
                help=f"{text}  [default: {_config_default(field)}]",
            )(func)
        return func

    return add


def train_config_options(func: Callable) -> Callable:
    """Add one option per TrainConfig field (:func:`config_options` of every field)."""
    return config_options()(func)


def plan_format_options(func: Callable) -> Callable:
    """Add the options that shape the plan's formats and lanes, shared by ``compile`` and
    ``train`` (and ``build``): ``--formats``, ``--format`` (repeatable), ``--calib-epochs``,
    ``--calib-samples``, ``--lanes``. ``--calib-epochs`` defaults to the run's epochs
    (:func:`calibration_epochs`), the same in every command, so ``train --board`` and ``build
    --board`` with the same options compile the same plan."""
    options = (
        click.option(
            "--formats",
            "formats",
            type=click.Choice(["auto", "static", "default"]),
            default="auto",
            show_default=True,
            help=FORMATS_HELP,
        ),
        click.option(
            "--format",
            "format_items",
            multiple=True,
            metavar="KEY=Qi.f",
            help="Override a format: s1.x=Q3.12 (stage 1's input) or w=Q3.20 (every stage); "
            "Qi.f = i integer bits besides the sign (may be negative: Q-1.16 is 16 bits below "
            "0.5) and f fraction bits; repeat --format once per key (--format s1.x=Q3.12 --format "
            "w=Q3.20; comma-joined keys are refused).",
        ),
        click.option(
            "--calib-epochs",
            type=int,
            default=None,
            help="Epochs of the auto formats' calibration run (float reference, then golden "
            "passes): the weights grow while training, so the formats must cover the whole run "
            f"[default: --epochs; else the model file's config epochs, else {DEFAULT_EPOCHS}, "
            "train's default run].",
        ),
        click.option(
            "--calib-samples",
            type=int,
            default=None,
            help="Samples streamed for calibration instead of --calib-epochs epochs "
            "[default: --calib-epochs epochs of the training set].",
        ),
        click.option(
            "--lanes",
            "lanes_text",
            default=None,
            help="Lanes: N for all stages, 8,2, 16x3,10 (stage 1: 16 row lanes × 3 column "
            "lanes), or auto [auto: with --board the fastest plan that fits the board "
            "(docs/boards.md §3), else 4 lanes on the largest stage].",
        ),
    )
    for opt in reversed(options):
        func = opt(func)
    return func


def file_epochs(model: str) -> int | None:
    """``config["epochs"]`` of a model file (``.py``), if it sets one; None for a built-in."""
    if not model.endswith(".py"):
        return None
    _, _, cfg = load_model(model)
    value = cfg.get("epochs") if isinstance(cfg, dict) else getattr(cfg, "epochs", None)
    return None if value is None else int(value)


def calibration_epochs(
    model: str | None,
    calib_epochs: int | None,
    run_epochs: int | None = None,
    calib_samples: int | None = None,
    formats: str = "auto",
) -> int | None:
    """Epochs of the auto formats' calibration run of ``pipetrain compile``, ``build`` and
    ``train``: ``--calib-epochs`` when given, else the run's epochs (``run_epochs``: the
    command's ``--epochs``; train's resolved epochs, a resumed run's the checkpoint's), else
    the model file's ``config["epochs"]``, else
    :data:`DEFAULT_EPOCHS` (what ``train`` runs). With ``calib_samples`` (``--calib-samples``)
    given it returns ``calib_epochs`` as given (None: that option sets the length; both given:
    :func:`~pipetrain.host.flow.compile_design` refuses them), and None without a model.

    Why: the weights grow while training, and formats calibrated over fewer epochs than the
    run clamp them (measured: mlp-digits-deep, ``train --target golden``, 4 epochs, seed 2:
    2,046 stage-1 ``w`` clamps with formats calibrated over 1 epoch, 0 over 4; seed 1: 181,
    0). One rule for every command keeps ``train --board`` on the plan ``build --board``
    built with the same options (the device refuses another at HELLO).

    Raises :class:`PlanError` for ``--calib-epochs`` or ``--calib-samples`` given with
    ``--formats static`` / ``default`` (``formats``), which do not calibrate: the option would
    be ignored.
    """
    if formats != "auto":
        given = [
            f"{name} {v}"
            for name, v in (("--calib-epochs", calib_epochs), ("--calib-samples", calib_samples))
            if v is not None
        ]
        if given:
            raise PlanError(
                f"{' and '.join(given)} set{'s' if len(given) == 1 else ''} the length of the auto "
                f"formats' calibration run, but --formats {formats} does not calibrate: drop "
                f"{' and '.join(g.split()[0] for g in given)}, or use --formats auto"
            )
    if calib_epochs is not None or calib_samples is not None:
        return calib_epochs
    if run_epochs is not None:
        return run_epochs
    if model is None:
        return None
    return file_epochs(model) or DEFAULT_EPOCHS


def config_overrides(options: dict[str, Any]) -> dict[str, Any]:
    """Return the TrainConfig overrides from :func:`train_config_options` values (pops them).

    The learning-strategy options are checked by
    :func:`~pipetrain.compiler.config.strategy_overrides`; interlocking learning that equals
    ``global`` becomes ``global`` in the compile step (no unused auxiliary head; a warning in
    the compile result's ``warnings``, which the commands print).

    Raises :class:`PlanError` for a malformed ``--blocks``, :class:`ConfigError` for a strategy
    option the given ``--strategy`` cannot use.
    """
    out = {}
    for _, field, _, _ in _CONFIG_OPTIONS:
        value = options.pop(field, None)
        if value is None:
            continue
        if field == "blocks":
            text = value.replace(" ", "")
            if not re.fullmatch(r"(\d+(,\d+)*)?", text):
                raise PlanError(f"--blocks {value!r} must be stage numbers like 2 or 1,3")
            value = tuple(int(v) for v in text.split(",")) if text else ()
        out[field] = value
    return strategy_overrides(out)


_UNITS = {"": 1, "b": 1, "bit": 1, "bits": 1, "k": 1024, "kib": 1024, "kbit": 1024,
          "m": 1 << 20, "mib": 1 << 20, "mbit": 1 << 20}  # fmt: skip


def parse_memory(text: str) -> int:
    """Parse a memory budget in bits: ``589824``, ``576Kib``, ``1.5Mib`` (K = 1024 bits).

    Raises :class:`PlanError` on anything else.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise PlanError(
            f"--memory-budget {text!r} is not a size in bits (e.g. 589824, 576Kib, 1.5Mib)"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def data_option(func: Callable) -> Callable:
    """Add ``--data`` to a command that compiles (``compile``, ``build``): calibration data,
    default none (:func:`pipetrain.host.flow.compile_design`: digits where it fits the model,
    else static formats)."""
    return click.option(
        "--data",
        default=None,
        help="Calibration data: digits or a FILE.npz [default: digits where it fits the model "
        "(and sizes mlp); for any other model static, uncalibrated formats].",
    )(func)


def hidden_option(func: Callable) -> Callable:
    """Add ``--hidden`` (the hidden layer sizes of the data-sized model ``mlp``,
    :func:`pipetrain.host.flow.data_mlp`), shared by every command that takes a MODEL."""
    return click.option(
        "--hidden",
        default=None,
        help=(
            "Hidden layer sizes of model 'mlp' (sized from the data), e.g. 64,32 "
            f"[default: {DEFAULT_HIDDEN}]; only with MODEL mlp."
        ),
    )(func)


def onchip_data_option(func: Callable) -> Callable:
    """Add ``--on-chip-data N`` (samples, 0..65535, default 0: none), shared by ``build`` and
    ``compile``: the board design holds an on-chip training set of N samples (docs/protocol.md
    §2 STORE/RUN), whose memories count in the board's fit
    (:func:`pipetrain.host.flow.compile_design`'s ``onchip_samples``). Its value reaches the
    command as ``onchip_samples``."""
    return click.option(
        "--on-chip-data",
        "onchip_samples",
        type=click.IntRange(0, 65535),
        default=0,
        show_default=True,
        help="Build an on-chip training set of N samples into the link (train --on-chip-data); "
        "its memories count in the fit (0: none).",
    )(func)


def simulator_option(func: Callable) -> Callable:
    """Add ``--simulator verilator|icarus`` (:data:`pipetrain.sim.harness.SIMULATORS`), shared
    by ``sim`` and ``train --target sim``."""
    return click.option(
        "--simulator",
        type=click.Choice(SIMULATORS),
        default=DEFAULT_SIMULATOR,
        show_default=True,
        help="RTL simulator (icarus: Icarus Verilog on PATH, much slower; small models).",
    )(func)


def board_option(help: str, required: bool = False) -> Callable[[Callable], Callable]:
    """Add ``--board NAME`` (value: ``board_name``), one of
    :data:`pipetrain.compiler.targets.BOARDS` (``click.Choice``: ``--help`` lists them and a
    wrong name is a usage error naming the choices), shared by every command that takes a
    board (``compile``, ``train``, ``sim``, ``build``, ``deploy``); ``help`` says what the
    command does with it."""
    return click.option(
        "--board",
        "board_name",
        type=click.Choice(sorted(BOARDS)),
        required=required,
        default=None,
        help=help,
    )
