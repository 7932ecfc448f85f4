"""Built-in networks and loading a user's model file."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import UserError

__all__ = [
    "BUILTIN_MODELS",
    "DATA_MLP",
    "ModelError",
    "build_mlp",
    "load_model",
    "he_init",
]


class ModelError(UserError, ValueError):
    """A model argument cannot be turned into an ``nn.Module``; the message says why and how."""


def build_mlp(sizes: list[int], activation: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    """Return ``Linear → act → … → Linear`` for layer ``sizes`` [in, hidden…, out]."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


def build_cnn_digits() -> nn.Sequential:
    """``cnn-digits``: Conv2d(1, 8, 3, padding=1) → ReLU → MaxPool2d(2) → Conv2d(8, 16, 3,
    padding=1) → ReLU → MaxPool2d(2) → Flatten → Linear(64, 10) on 1×8×8 images (the digits'
    64 values row-major; ``input_shape`` (1, 8, 8)): 8×8 → 4×4 → 2×2, three PB stages."""
    m = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64, 10),
    )
    m.input_shape = (1, 8, 8)
    return m


def build_cnn1d_digits() -> nn.Sequential:
    """``cnn1d-digits``: the digits' 64 values as one 1×64 sequence: Conv1d(1, 8, 5,
    padding=2) → ReLU → MaxPool1d(2) → Conv1d(8, 16, 5, stride=2, padding=2) → LeakyReLU(0.125)
    → AvgPool1d(2) → Flatten → Linear(128, 10) (64 → 32 → 16 → 8 positions; ``input_shape``
    (1, 64)): stride 2, both poolings and LeakyReLU in one built-in."""
    m = nn.Sequential(
        nn.Conv1d(1, 8, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool1d(2),
        nn.Conv1d(8, 16, 5, stride=2, padding=2),
        nn.LeakyReLU(0.125),
        nn.AvgPool1d(2),
        nn.Flatten(),
        nn.Linear(128, 10),
    )
    m.input_shape = (1, 64)
    return m


def he_init(model: nn.Module) -> nn.Module:
    """Kaiming-normal (He) weights for ReLU, std √(2/N), and zero biases in every ``nn.Linear``
    of ``model`` (in place; returns it). Source: He et al., "Delving Deep into Rectifiers",
    ICCV 2015 §2.2. ``nn.Linear``'s default U(±1/√N) shrinks a ReLU signal by about √6 per
    stage: measured, ``mlp-digits-deep8`` so initialised stays at chance (10 %) after 3 epochs of
    exact batch-1 SGD at lr 0.002 and 0.01, and reaches 74 % after 2 epochs at 0.002 with this
    one."""
    for mod in model.modules():
        if isinstance(mod, nn.Linear):
            nn.init.kaiming_normal_(mod.weight, nonlinearity="relu")
            nn.init.zeros_(mod.bias)
    return model


BUILTIN_MODELS: dict[str, Callable[[], nn.Module]] = {
    "mlp-digits": lambda: build_mlp([64, 32, 10]),
    "mlp-digits-deep": lambda: build_mlp([64, 32, 32, 32, 10]),
    "mlp-digits-wide": lambda: build_mlp([64, 128, 64, 10]),
    # 8 stages (64→32×7→10): the depth where global PB's delay (15 at stage 1) and stash
    # (Σ (D_s+1)·|x_s|) grow quadratically and local/interlocking learning bound them by the
    # window (docs/architecture.md §2.4)
    "mlp-digits-deep8": lambda: he_init(build_mlp([64] + [32] * 7 + [10])),
    "cnn-digits": build_cnn_digits,  # convolution stages (golden, reference and the RTL)
    "cnn1d-digits": build_cnn1d_digits,
}

#: The built-in sized from the data (features → hidden → classes): the host's compile flow
#: builds it (``pipetrain.host.flow.data_mlp``), since the compiler does not load data.
DATA_MLP = "mlp"


def _describe(exc: BaseException, path: Path) -> str:
    """``Type: message (line N)`` of an exception raised by the user's file ``path``, in one
    line; N is the file's last line in the traceback (a SyntaxError's own line)."""
    text = " ".join(str(exc).split())
    line = None
    if isinstance(exc, SyntaxError):
        text, line = " ".join(str(exc.msg).split()), exc.lineno
    else:
        tb = exc.__traceback__
        while tb is not None:
            if Path(tb.tb_frame.f_code.co_filename).resolve() == path.resolve():
                line = tb.tb_lineno
            tb = tb.tb_next
    out = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return f"{out} (line {line})" if line is not None else out


def load_model(
    spec: str | nn.Module, seed: int = 0
) -> tuple[str, nn.Module, dict[str, Any] | None]:
    """Return ``(name, module, config)`` for a built-in name, a ``.py`` path or a module.

    A model file must define ``model`` (an ``nn.Module``, or a callable returning one) and may
    define ``config`` (a dict of :class:`~pipetrain.compiler.config.TrainConfig` fields).
    Initialisation is seeded with ``seed`` so runs are reproducible.

    Raises :class:`ModelError` for an unknown name (or :data:`DATA_MLP`, which the host's
    compile flow builds from the data), a missing file, a file that raises (or
    calls ``sys.exit``) when run, a ``model`` callable that raises, or a file without an
    ``nn.Module`` ``model``; the message names the file and the exception.
    """
    if isinstance(spec, nn.Module):
        return type(spec).__name__, spec, None
    torch.manual_seed(seed)
    if spec in BUILTIN_MODELS:
        return spec, BUILTIN_MODELS[spec](), None
    if spec == DATA_MLP:
        raise ModelError(
            f"model {DATA_MLP!r} is sized from the data: compile it with "
            "pipetrain.host.flow.compile_design (data=...) or pipetrain.host.open, which build "
            "it, or pass the nn.Module"
        )
    path = Path(spec)
    if path.suffix != ".py":
        raise ModelError(
            f"unknown model {spec!r}: give a built-in name ({', '.join(BUILTIN_MODELS)}, or "
            f"{DATA_MLP}, sized from the data) or a path to a Python file that defines `model`"
        )
    if not path.is_file():
        raise ModelError(f"model file {spec!r} does not exist")
    name = path.stem
    module_spec = importlib.util.spec_from_file_location(f"pipetrain_user_{name}", path)
    if module_spec is None or module_spec.loader is None:
        raise ModelError(f"model file {spec!r} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # the user's code: report it, name the file
        sys.modules.pop(module_spec.name, None)
        raise ModelError(f"model file {spec!r} failed to run: {_describe(exc, path)}") from exc
    if not hasattr(module, "model"):
        raise ModelError(f"model file {spec!r} does not define `model` (an nn.Module)")
    model = module.model
    if not isinstance(model, nn.Module) and callable(model):
        try:
            model = model()
        except (Exception, SystemExit) as exc:
            why = _describe(exc, path)
            raise ModelError(f"`model()` in model file {spec!r} failed: {why}") from exc
    if not isinstance(model, nn.Module):
        raise ModelError(f"`model` in {spec!r} is a {type(model).__name__}, not a torch.nn.Module")
    config = getattr(module, "config", None)
    return name, model, config
