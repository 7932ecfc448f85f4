"""The torch.fx front end: a user's ``nn.Module`` → :class:`~pipetrain.compiler.ir.NetworkIR`.

The hardware trains a chain of weight stages (docs/architecture.md §1, §3): ``Linear`` layers, each
followed
by at most one activation. :func:`trace` runs :func:`torch.fx` symbolic tracing and accepts
exactly that shape of graph; everything else is a :class:`CompileError` that names the module
path, its type and the supported set, so the user knows what to change.
"""

from __future__ import annotations

import os
import traceback
import warnings
from collections.abc import Iterable

import torch
import torch.fx as fx
from torch import nn

from .ir import LayerIR, NetworkIR
from .models import ModelError

__all__ = ["CompileError", "SUPPORTED_MODULES", "trace"]

#: Module types the front end accepts, by role.
WEIGHT_MODULES: tuple[type[nn.Module], ...] = (nn.Linear,)
ACTIVATION_MODULES: dict[type[nn.Module], str] = {nn.ReLU: "relu", nn.LeakyReLU: "leaky_relu"}
PASS_MODULES: tuple[type[nn.Module], ...] = (nn.Flatten, nn.Identity, nn.Dropout)
SUPPORTED_MODULES: tuple[str, ...] = (
    "Linear",
    "ReLU",
    "LeakyReLU",
    "Flatten",
    "Identity",
    "Dropout",
)
SUPPORTED_TEXT = (
    "supported: nn.Linear (with bias), nn.ReLU, nn.LeakyReLU, nn.Flatten, nn.Identity, "
    "nn.Dropout (treated as identity), chained one after another"
)
_TORCH_DIR = os.path.dirname(torch.__file__)


class CompileError(ModelError):
    """The model cannot be compiled to hardware; the message names the module path, its type and
    what is supported. A :class:`~pipetrain.compiler.models.ModelError`, so the CLI reports it as
    a user error (exit status 2)."""


def _user_frame(frames: Iterable[tuple[str, int, str, str | None]]) -> str:
    """Return ``file:line: code`` of the innermost frame outside torch (or '')."""
    last = ""
    for filename, lineno, _func, line in frames:
        if filename.startswith(_TORCH_DIR) or os.sep + "torch" + os.sep in filename:
            continue
        if filename.endswith(os.path.join("compiler", "frontend.py")):
            continue
        last = f"{filename}:{lineno}" + (f" (`{line.strip()}`)" if line else "")
    return last


def _where(node: fx.Node) -> str:
    """Describe where ``node`` comes from: enclosing module path/type and source line."""
    parts = []
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path, (_, typ) = list(stack.items())[-1]
        parts.append(f"in module {path!r} ({getattr(typ, '__name__', typ)})")
    loc = _user_frame(node.meta.get("pipetrain_stack", ()))
    if loc:
        parts.append(f"at {loc}")
    return (" " + " ".join(parts)) if parts else ""


class _Tracer(fx.Tracer):
    """fx tracer that keeps a cheap Python stack of every non-module node (for error messages;
    fx's own ``record_stack_traces`` imports seconds of profiler machinery)."""

    def create_node(self, kind, target, args, kwargs, name=None, type_expr=None):  # noqa: D102
        node = super().create_node(kind, target, args, kwargs, name, type_expr)
        if kind in ("call_function", "call_method", "get_attr"):
            node.meta["pipetrain_stack"] = [
                (f.filename, f.lineno, f.name, f.line) for f in traceback.extract_stack(limit=40)
            ]
        return node


def _describe_call(node: fx.Node) -> str:
    if node.op == "call_function":
        target = node.target
        mod = getattr(target, "__module__", None) or ""
        name = getattr(target, "__name__", str(target))
        if mod in ("_operator", "operator"):
            return f"the operator {name!r}"
        return f"the function {mod + '.' if mod else ''}{name}"
    if node.op == "call_method":
        return f"the tensor method .{node.target}()"
    if node.op == "get_attr":
        return f"a direct use of the parameter/buffer {node.target!r}"
    return f"{node.op} {node.target!r}"


def trace(model: nn.Module, name: str, loss: str = "cross_entropy") -> NetworkIR:
    """Trace ``model`` with torch.fx and return its :class:`NetworkIR`.

    Accepted graphs: one input, then a chain of ``nn.Linear`` layers (with bias), each followed
    by at most one ``nn.ReLU``/``nn.LeakyReLU``; ``nn.Flatten``, ``nn.Identity`` and
    ``nn.Dropout`` may appear anywhere in the chain and are dropped (Dropout with a
    ``warnings.warn``: the hardware trains without it). Containers (``nn.Sequential``, custom
    modules) are traced through. Input shape: (batch, in_features); the IR's ``in_features`` is
    the first Linear's.

    Raises :class:`CompileError` for a non-Module ``model``; a graph fx cannot trace (e.g.
    data-dependent control flow); an unsupported module (``nn.LSTM``, ``nn.Conv2d``,
    ``nn.Tanh``, …); a functional call or operator (``torch.relu``, ``F.relu``, ``x + 1``); a
    graph that is not a chain; an activation before the first Linear or two in a row; a Linear
    without bias; Linear sizes that do not match; a network without Linear layers.
    Source: *derived* from the stage model of docs/architecture.md §1/§3.
    """
    if not isinstance(model, nn.Module):
        raise CompileError(
            f"model {name!r} is a {type(model).__name__}, not a torch.nn.Module; {SUPPORTED_TEXT}"
        )
    try:
        graph = _Tracer().trace(model)
    except Exception as exc:
        frames = [
            (f.filename, f.lineno, f.name, f.line) for f in traceback.extract_tb(exc.__traceback__)
        ]
        loc = _user_frame(frames)
        raise CompileError(
            f"model {name!r} ({type(model).__name__}) cannot be traced by torch.fx"
            + (f" at {loc}" if loc else "")
            + f": {type(exc).__name__}: {exc}. The forward pass must be a fixed chain of "
            f"modules without data-dependent control flow; {SUPPORTED_TEXT}"
        ) from exc

    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise CompileError(
            f"model {name!r} ({type(model).__name__}) takes {len(placeholders)} inputs; the "
            "hardware streams one input tensor (batch, features)"
        )
    current: fx.Node = placeholders[0]
    layers: list[dict] = []
    last_kind = "input"  # input | linear | activation
    last_desc = "the input"
    for node in graph.nodes:
        if node.op in ("placeholder",):
            continue
        if node.op == "output":
            out = node.args[0]
            if out is not current:
                raise CompileError(
                    f"model {name!r} returns {out!r}, not the output of its last module; "
                    "the network must return the last layer's output (one tensor)"
                )
            continue
        if node.op != "call_module":
            raise CompileError(
                f"model {name!r} uses {_describe_call(node)}{_where(node)}; the hardware "
                "only "
                f"implements modules: replace it with the nn.Module equivalent "
                f"(e.g. nn.ReLU() instead of torch.relu/F.relu); {SUPPORTED_TEXT}"
            )
        path = str(node.target)
        mod = model.get_submodule(path)
        typ = type(mod).__name__
        ins = [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, fx.Node)]
        if ins != [current] or len(node.args) != 1 or node.kwargs:
            raise CompileError(
                f"module {path!r} ({typ}) does not take exactly the previous output "
                f"({last_desc}) as its only argument; the network must be a plain chain "
                f"(no skip connections or extra arguments); {SUPPORTED_TEXT}"
            )
        if len(current.users) != 1:
            raise CompileError(
                f"the output of {last_desc} is used {len(current.users)} times (by "
                f"{', '.join(repr(str(u.target)) for u in current.users)}); the network must be "
                f"a plain chain; {SUPPORTED_TEXT}"
            )
        if isinstance(mod, WEIGHT_MODULES):
            if mod.bias is None:
                raise CompileError(
                    f"module {path!r} (Linear) has no bias; every hardware stage has a bias "
                    "column: use nn.Linear(..., bias=True)"
                )
            if layers and layers[-1]["out"] != mod.in_features:
                raise CompileError(
                    f"module {path!r} (Linear) expects {mod.in_features} inputs but the "
                    f"previous Linear {layers[-1]['name']!r} produces {layers[-1]['out']}"
                )
            layers.append(
                {
                    "name": path,
                    "in": mod.in_features,
                    "out": mod.out_features,
                    "act": "identity",
                    "slope": 0.0,
                }
            )
            last_kind = "linear"
        elif type(mod) in ACTIVATION_MODULES:
            act = ACTIVATION_MODULES[type(mod)]
            if last_kind == "input":
                raise CompileError(
                    f"module {path!r} ({typ}) comes before the first Linear; an activation "
                    f"must follow a Linear layer; {SUPPORTED_TEXT}"
                )
            if last_kind == "activation":
                raise CompileError(
                    f"module {path!r} ({typ}) follows another activation ({last_desc}); each "
                    f"Linear layer takes at most one activation; {SUPPORTED_TEXT}"
                )
            slope = float(mod.negative_slope) if act == "leaky_relu" else 0.0
            if act == "leaky_relu" and not 0.0 <= slope < 1.0:
                raise CompileError(
                    f"module {path!r} (LeakyReLU) has negative_slope={slope}; the hardware "
                    "supports 0 ≤ slope < 1"
                )
            layers[-1]["act"], layers[-1]["slope"] = act, slope
            last_kind = "activation"
        elif isinstance(mod, PASS_MODULES):
            if isinstance(mod, nn.Dropout):
                warnings.warn(
                    f"module {path!r} (Dropout, p={mod.p}) is compiled as identity: the "
                    "hardware trains without dropout",
                    stacklevel=2,
                )
            if isinstance(mod, nn.Flatten) and (mod.start_dim, mod.end_dim) != (1, -1):
                raise CompileError(
                    f"module {path!r} (Flatten) has start_dim={mod.start_dim}, "
                    f"end_dim={mod.end_dim}; only the default Flatten(1, -1) is supported"
                )
        else:
            raise CompileError(
                f"module {path!r} ({typ}) is not supported by the hardware; {SUPPORTED_TEXT}"
            )
        current = node
        last_desc = f"module {path!r} ({typ})"
    if not layers:
        raise CompileError(
            f"model {name!r} ({type(model).__name__}) has no nn.Linear layer; {SUPPORTED_TEXT}"
        )
    return NetworkIR(
        name=name,
        in_features=layers[0]["in"],
        layers=tuple(
            LayerIR(
                name=ly["name"],
                in_features=ly["in"],
                out_features=ly["out"],
                activation=ly["act"],
                negative_slope=ly["slope"],
            )
            for ly in layers
        ),
        loss=loss,
    )
