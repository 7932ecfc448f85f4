"""The torch.fx front end: a user's ``nn.Module`` → :class:`~pipetrain.compiler.ir.NetworkIR`.

The hardware trains a chain of weight stages (docs/architecture.md §1, §3): ``Linear`` layers, each
followed by at most one activation. :func:`trace` runs :func:`torch.fx` symbolic tracing and
accepts exactly that shape of graph, written with modules or with the functional and tensor-method
forms people write (``F.relu(x)``, ``x.relu_()``, ``torch.flatten(x, 1)``,
``x.view(x.size(0), -1)``, …): each form is an entry of :data:`FUNCTION_FORMS` /
:data:`METHOD_FORMS` that lowers exactly like its module (same IR, same plan hash). Everything
else is a :class:`CompileError` that names the module path or source line, the cause and a fix
that compiles.
"""

from __future__ import annotations

import math
import operator
import os
import traceback
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.fx.proxy import TraceError

from .conv import ConvGeometry, conv_geometry
from .ir import LayerIR, NetworkIR
from .models import ModelError

__all__ = [
    "CompileError",
    "FUNCTION_FORMS",
    "METHOD_FORMS",
    "Form",
    "SUPPORTED_MODULES",
    "trace",
]

#: Module types the front end accepts, by role.
CONV_MODULES: dict[type[nn.Module], str] = {nn.Conv1d: "conv1d", nn.Conv2d: "conv2d"}
WEIGHT_MODULES: tuple[type[nn.Module], ...] = (nn.Linear, *CONV_MODULES)
#: Pooling modules (after a convolution, in its stage's output path): (kind, dimensions).
POOL_MODULES: dict[type[nn.Module], tuple[str, int]] = {
    nn.MaxPool1d: ("max", 1),
    nn.MaxPool2d: ("max", 2),
    nn.AvgPool1d: ("avg", 1),
    nn.AvgPool2d: ("avg", 2),
}
#: The values a convolution's parameters may take: ``{attribute: (supported values, text)}``
#: (stride is checked per dimension; padding any non-negative integer, zeros).
CONV_PARAMS: dict[str, tuple[tuple[Any, ...], str]] = {
    "groups": ((1,), "groups=1"),
    "dilation": ((1,), "dilation=1"),
    "padding_mode": (("zeros",), "padding_mode='zeros'"),
    "stride": ((1, 2), "stride 1 or 2"),
}
#: The values a pooling module's parameters may take (kernel = stride is checked apart).
POOL_PARAMS: dict[str, tuple[tuple[Any, ...], str]] = {
    "padding": ((0,), "padding=0"),
    "dilation": ((1,), "dilation=1"),
    "ceil_mode": ((False,), "ceil_mode=False"),
    "return_indices": ((False,), "return_indices=False"),
    "divisor_override": ((None,), "divisor_override=None"),
}
#: Activations a convolution stage supports (its output path: activation, then pooling).
CONV_ACTIVATIONS = ("relu", "leaky_relu")
#: Largest input size the front end searches when a CNN does not give ``input_shape``.
INPUT_SEARCH_LIMIT = {1: 16384, 2: 512}
ACTIVATION_MODULES: dict[type[nn.Module], str] = {
    nn.ReLU: "relu",
    nn.LeakyReLU: "leaky_relu",
    nn.Tanh: "tanh",  # tanh / sigmoid: the plan's LUT (docs/numerics.md §3.4)
    nn.Sigmoid: "sigmoid",
}
PASS_MODULES: tuple[type[nn.Module], ...] = (nn.Flatten, nn.Identity, nn.Dropout)
#: Parameters an activation carries into the IR: ``{module type: (name, default)}``; the module's
#: attribute and the functional argument share the name (``nn.LeakyReLU.negative_slope``,
#: ``F.leaky_relu(x, negative_slope=0.01)``).
ACTIVATION_PARAMS: dict[type[nn.Module], tuple[str, float]] = {
    nn.LeakyReLU: ("negative_slope", 0.01)
}


@dataclass(frozen=True)
class Form:
    """One functional or tensor-method spelling of a chain step.

    Members
    -------
    text: how it is written, for messages (``"F.relu(x)"``).
    step: ``"activation"`` (lowers like ``module``), ``"flatten"``, ``"reshape"`` (view /
        reshape: the new shape is checked to keep the batch dimension) or ``"pass"`` (a no-op
        on the values, e.g. ``x.contiguous()``).
    params: names of the positional arguments after the tensor (keywords are accepted too).
    defaults: ``((name, value), …)`` for the arguments not given.
    module: the module type an activation lowers like (its kind is
        ``ACTIVATION_MODULES[module]``; a form whose module is not there is refused by name).
    inplace: ``True`` for the ``_`` forms, ``False`` for a form that returns a new tensor,
        ``None`` when the ``inplace`` argument decides.
    """

    text: str
    step: str
    params: tuple[str, ...] = ()
    defaults: tuple[tuple[str, Any], ...] = ()
    module: type[nn.Module] | None = None
    inplace: bool | None = False


_INPLACE = (("inplace", False),)
_FLATTEN = ("start_dim", "end_dim")
_FLATTEN_DEFAULTS = (("start_dim", 0), ("end_dim", -1))  # torch.flatten's and Tensor.flatten's

#: ``call_function`` targets the front end lowers, by the function object fx records.
FUNCTION_FORMS: dict[Callable[..., Any], Form] = {
    F.relu: Form("F.relu(x)", "activation", ("inplace",), _INPLACE, nn.ReLU, None),
    torch.relu: Form("torch.relu(x)", "activation", (), (), nn.ReLU),
    torch.relu_: Form("torch.relu_(x)", "activation", (), (), nn.ReLU, True),  # = F.relu_
    F.leaky_relu: Form(
        "F.leaky_relu(x, negative_slope)",
        "activation",
        ("negative_slope", "inplace"),
        _INPLACE,
        nn.LeakyReLU,
        None,
    ),
    F.leaky_relu_: Form(
        "F.leaky_relu_(x, negative_slope)",
        "activation",
        ("negative_slope",),
        (),
        nn.LeakyReLU,
        True,
    ),
    torch.tanh: Form("torch.tanh(x)", "activation", (), (), nn.Tanh),
    torch.tanh_: Form("torch.tanh_(x)", "activation", (), (), nn.Tanh, True),
    torch.sigmoid: Form("torch.sigmoid(x)", "activation", (), (), nn.Sigmoid),
    torch.sigmoid_: Form("torch.sigmoid_(x)", "activation", (), (), nn.Sigmoid, True),
    torch.flatten: Form("torch.flatten", "flatten", _FLATTEN, _FLATTEN_DEFAULTS),
    torch.reshape: Form("torch.reshape", "reshape", ("shape",)),
}

#: ``call_method`` names the front end lowers (``F.tanh`` / ``F.sigmoid`` trace as methods).
METHOD_FORMS: dict[str, Form] = {
    "relu": Form("x.relu()", "activation", (), (), nn.ReLU),
    "relu_": Form("x.relu_()", "activation", (), (), nn.ReLU, True),
    "tanh": Form("x.tanh() / F.tanh(x)", "activation", (), (), nn.Tanh),
    "tanh_": Form("x.tanh_()", "activation", (), (), nn.Tanh, True),
    "sigmoid": Form("x.sigmoid() / F.sigmoid(x)", "activation", (), (), nn.Sigmoid),
    "sigmoid_": Form("x.sigmoid_()", "activation", (), (), nn.Sigmoid, True),
    "flatten": Form("x.flatten", "flatten", _FLATTEN, _FLATTEN_DEFAULTS),
    "view": Form("x.view", "reshape"),
    "reshape": Form("x.reshape", "reshape"),
    "contiguous": Form("x.contiguous()", "pass"),
}

#: Functions with a module twin the front end accepts: the fix a refusal names.
#: The loss unit applies softmax and cross-entropy to the last Linear's output (the logits).
_SOFTMAX_HINT = (
    "the loss unit applies softmax cross-entropy to the last Linear's output itself, so "
    "forward returns the logits: remove the softmax (train with nn.CrossEntropyLoss on them)"
)

_MODULE_HINTS: dict[Callable[..., Any], str] = {
    F.dropout: "use an nn.Dropout module (compiled as identity)",
    F.linear: "use an nn.Linear module",
    F.softmax: _SOFTMAX_HINT,
    F.log_softmax: _SOFTMAX_HINT,
    torch.softmax: _SOFTMAX_HINT,
    torch.log_softmax: _SOFTMAX_HINT,
}

#: Hints for methods (``x.softmax(1)``) and module types, by name / type.
_METHOD_HINTS: dict[str, str] = {"softmax": _SOFTMAX_HINT, "log_softmax": _SOFTMAX_HINT}
_TYPE_HINTS: dict[type[nn.Module], str] = {nn.Softmax: _SOFTMAX_HINT, nn.LogSoftmax: _SOFTMAX_HINT}


def _forms_of(module: type[nn.Module]) -> list[str]:
    """The spellings of ``module``'s activation that return a new tensor (messages list the
    in-place ones once, as a rule)."""
    forms = (*FUNCTION_FORMS.values(), *METHOD_FORMS.values())
    return [f.text for f in forms if f.module is module and f.inplace is not True]


def _supported_text() -> str:
    acts = ", ".join(f"nn.{m.__name__} (or {', '.join(_forms_of(m))})" for m in ACTIVATION_MODULES)
    return (
        f"supported: nn.Linear (with bias), each followed by at most one activation: {acts}, "
        "in place or not (inplace=True, x.relu_(), torch.relu_(x), …); before the Linear "
        "layers nn.Conv1d / nn.Conv2d (stride 1 or 2, zero padding, dilation 1, groups 1, "
        "bias or not), each followed by at most nn.ReLU / nn.LeakyReLU and then one "
        "nn.MaxPool1d/2d or nn.AvgPool1d/2d (kernel = stride), and nn.Flatten() before the "
        "first Linear; anywhere in the chain "
        "nn.Flatten(), torch.flatten(x, 1), x.flatten(1), and x.view / x.reshape / "
        "torch.reshape that keep the batch dimension first (x.view(x.size(0), -1), "
        "x.view(-1, features)), x.contiguous(), nn.Identity, nn.Dropout (compiled as "
        "identity); each step applied to the previous one's output"
    )


SUPPORTED_MODULES: tuple[str, ...] = tuple(
    m.__name__ for m in (*WEIGHT_MODULES, *ACTIVATION_MODULES, *POOL_MODULES, *PASS_MODULES)
)
SUPPORTED_TEXT = _supported_text()
_TORCH_DIR = os.path.dirname(torch.__file__)


class CompileError(ModelError):
    """The model cannot be compiled to hardware; the message names the module path or source
    line, the cause and a fix. A :class:`~pipetrain.compiler.models.ModelError`, so the CLI
    reports it as a user error (exit status 2)."""


def _user_frame(frames: Iterable[tuple[str, int, str, str | None]]) -> str:
    """Return ``file:line (`code`)`` of the innermost frame outside torch (or '')."""
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
    return f"{node.op} {node.target!r}"


def _form_of(node: fx.Node) -> Form | None:
    if node.op == "call_function":
        try:
            return FUNCTION_FORMS.get(node.target)  # type: ignore[arg-type]
        except TypeError:  # an unhashable target
            return None
    if node.op == "call_method":
        return METHOD_FORMS.get(str(node.target))
    return None


def _bind(node: fx.Node, form: Form) -> dict[str, Any]:
    """The arguments after the tensor, by name (positional ones named by ``form.params``)."""
    bound = dict(form.defaults)
    if form.step == "reshape" and node.op == "call_method":  # x.view(*shape) or x.view(shape)
        rest = node.args[1:]
        shape = rest[0] if len(rest) == 1 and isinstance(rest[0], (tuple, list)) else rest
        bound["shape"] = node.kwargs.get("size", node.kwargs.get("shape", shape))
        return bound
    bound.update(zip(form.params, node.args[1:], strict=False))
    bound.update(node.kwargs)
    return bound


def _nodes_in(value: Any) -> list[fx.Node]:
    if isinstance(value, fx.Node):
        return [value]
    if isinstance(value, (tuple, list)):
        return [n for v in value for n in _nodes_in(v)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _nodes_in(v)]
    return []


class _Chain:
    """The walk over the traced graph: the chain's current value and what is known of it."""

    def __init__(
        self, model: nn.Module, first: fx.Node, data_shape: tuple[int, ...] | None = None
    ) -> None:
        self.model = model
        self.data_shape = data_shape  # the data's sample shape (trace's sample_shape)
        self.head: set[fx.Node] = {first}  # nodes holding the current value (in-place aliases)
        self.seen: set[fx.Node] = {first}  # every value the chain held (batch dimension first)
        self.sizes: dict[fx.Node, int | None] = {}  # x.size(d) / x.shape[d] → d; x.size() → None
        self.last: fx.Node = first
        self.last_desc = "the input"
        self.last_kind = "input"  # input | linear | conv | activation | pool
        self.last_inplace = False
        self.rank: int | None = None  # None: the input's (not known)
        self.features: int | None = None  # values per sample; known from the first Linear on
        self.pending: list[tuple[str, int, str]] = []  # reshape claims before the first Linear
        self.layers: list[dict] = []
        self.called: dict[int, str] = {}  # id(module with parameters) → path
        self.params: dict[int, str] = {}  # id(Parameter) → "path.weight"
        self.storages: dict[int, str] = {}  # data_ptr → "path.weight"
        self.shape_hint: tuple[int, ...] | None = None  # a reshape's sample shape before a conv

    def not_chained(self, what: str) -> CompileError:
        if not self.last.users and not self.last_inplace and self.last.op != "placeholder":
            return CompileError(
                f"the result of {self.last_desc} is never used: {what} takes an earlier value "
                "(the step is not in place); assign the result (`h = step(h)`) so the next step "
                "uses it, or remove the step"
            )
        return CompileError(
            f"{what} does not take the previous step's output ({self.last_desc}) as its only "
            "tensor argument; the network must be a plain chain (no skip connections, branches "
            "or extra tensor arguments): apply each step to the previous step's output"
        )

    # ---- steps ----
    def advance(self, node: fx.Node, desc: str, inplace: bool) -> None:
        self.head = (self.head | {node}) if inplace else {node}
        self.seen.add(node)
        self.last, self.last_desc, self.last_inplace = node, desc, inplace

    def size_query(self, node: fx.Node) -> bool:
        """Record ``x.size(d)``, ``x.size()``, ``x.shape``, ``x.shape[d]`` of a chain value."""
        args = node.args
        if node.op == "call_method" and node.target == "size" and args[0] in self.seen:
            dim = node.kwargs.get("dim", args[1] if len(args) > 1 else None)
            self.sizes[node] = dim if isinstance(dim, int) or dim is None else -999
            return True
        if (
            node.op == "call_function"
            and node.target is getattr
            and args[0] in self.seen
            and args[1] == "shape"
        ):
            self.sizes[node] = None
            return True
        if node.op == "call_function" and node.target is operator.getitem:
            obj = args[0]
            if isinstance(obj, fx.Node) and obj in self.sizes and self.sizes[obj] is None:
                self.sizes[node] = args[1] if isinstance(args[1], int) else -999
                return True
        return False

    def own_parameters(self, path: str, mod: nn.Module) -> None:
        """Refuse a weight or bias of ``mod`` that is tied to an earlier layer's."""
        typ = type(mod).__name__
        for pname in ("weight", "bias"):
            p = getattr(mod, pname)
            if p is None:
                continue
            key = f"{path}.{pname}"
            if id(p) in self.params:
                raise CompileError(
                    f"the {pname} of module {path!r} ({typ}) is the same Parameter as "
                    f"{self.params[id(p)]!r} (tied weights); each hardware stage keeps its own "
                    f"weights in its own memories and updates them alone: give each {typ} its "
                    f"own Parameter (remove the assignment that ties {key!r})"
                )
            ptr = p.untyped_storage().data_ptr() if p.numel() else 0
            if ptr and ptr in self.storages:
                raise CompileError(
                    f"the {pname} of module {path!r} ({typ}) shares its storage with "
                    f"{self.storages[ptr]!r} (tied weights); each hardware stage keeps its own "
                    f"weights: give each {typ} its own Parameter (e.g. clone the tensor)"
                )
            self.params[id(p)] = key
            if ptr:
                self.storages[ptr] = key

    def linear(self, node: fx.Node, path: str, mod: nn.Linear) -> None:
        if mod.bias is None:
            raise CompileError(
                f"module {path!r} (Linear) has no bias; every hardware stage has a bias "
                "column: use nn.Linear(..., bias=True)"
            )
        self.own_parameters(path, mod)
        if self.rank is not None and self.rank != 2:
            after_conv = bool(self.layers) and self.layers[-1]["conv"] is not None
            raise CompileError(
                f"module {path!r} (Linear) gets a {self.rank}-D tensor from {self.last_desc}; "
                "a stage takes (batch, features): flatten it first (x.flatten(1))"
                + (f"; {SUPPORTED_TEXT}" if after_conv else "")
            )
        if (
            self.layers
            and self.layers[-1]["conv"] is None
            and self.layers[-1]["out"] != mod.in_features
        ):
            raise CompileError(
                f"module {path!r} (Linear) expects {mod.in_features} inputs but the "
                f"previous Linear {self.layers[-1]['name']!r} produces {self.layers[-1]['out']}: "
                f"make them equal (nn.Linear({self.layers[-1]['out']}, {mod.out_features}))"
            )
        if self.features is None:  # the first Linear: a sample is its in_features values
            for desc, count, how in self.pending:
                self.check_count(desc, count, how, mod.in_features)
        elif self.features != mod.in_features:
            raise CompileError(
                f"module {path!r} (Linear) expects {mod.in_features} inputs but a sample has "
                f"{self.features} values after {self.last_desc}: make them equal"
            )
        layer = {"name": path, "in": mod.in_features, "out": mod.out_features, "conv": None}
        self.layers.append(layer | {"act": "identity", "slope": 0.0})
        self.features, self.rank, self.last_kind = mod.out_features, 2, "linear"

    def conv(self, path: str, mod: nn.Module) -> None:
        """A Conv1d/Conv2d stage: check its parameters against :data:`CONV_PARAMS`."""
        kind = CONV_MODULES[type(mod)]
        dims = 1 if kind == "conv1d" else 2
        typ = type(mod).__name__
        desc = f"module {path!r} ({typ})"
        for attr, (ok, text) in CONV_PARAMS.items():
            value = getattr(mod, attr)
            values = value if isinstance(value, tuple) else (value,)
            if any(v not in ok for v in values):
                raise CompileError(
                    f"{desc} has {attr}={value!r}; the hardware supports {text}: build it as "
                    f"nn.{typ}({mod.in_channels}, {mod.out_channels}, {mod.kernel_size[0]}"
                    f"{', stride=2' if attr == 'stride' else ''}, padding=...)"
                )
        if isinstance(mod.padding, str):
            raise CompileError(
                f"{desc} has padding={mod.padding!r}; the hardware supports an integer zero "
                "padding: give it as a number (padding=0 for 'valid', padding=k//2 for an odd "
                "kernel k with stride 1 for 'same')"
            )
        if any(lay["conv"] is None for lay in self.layers):
            raise CompileError(
                f"{desc} follows a Linear layer; convolution stages come before the first "
                "Linear (Conv → activation → pooling …, then Flatten → Linear …): move it"
            )
        if self.rank is not None and self.rank != dims + 2:
            raise CompileError(
                f"{desc} gets a {self.rank}-D tensor from {self.last_desc}; an {typ} takes "
                f"(batch, channels, {'length' if dims == 1 else 'height, width'}): give it "
                f"{dims + 2}-D input"
            )
        if self.layers:
            prev = self.layers[-1]["conv"]
            if prev["kind"] != kind:
                raise CompileError(
                    f"{desc} follows a {prev['kind']} stage ({self.layers[-1]['name']!r}); the "
                    "convolutions of one network are all Conv1d or all Conv2d"
                )
            if prev["out_channels"] != mod.in_channels:
                raise CompileError(
                    f"{desc} takes {mod.in_channels} channels but {self.layers[-1]['name']!r} "
                    f"gives {prev['out_channels']}: make them equal"
                )
        self.own_parameters(path, mod)
        params = {
            "kind": kind,
            "in_channels": mod.in_channels,
            "out_channels": mod.out_channels,
            "kernel": tuple(mod.kernel_size),
            "stride": tuple(mod.stride),
            "padding": tuple(mod.padding),
            "bias": mod.bias is not None,
            "pool": "none",
            "pool_size": None,
        }
        self.layers.append(
            {"name": path, "in": None, "out": None, "conv": params, "act": "identity"}
            | {"slope": 0.0}
        )
        self.features, self.rank, self.last_kind = None, dims + 2, "conv"

    def pool(self, desc: str, mod: nn.Module) -> None:
        """A pooling module: the output path of the convolution stage before it."""
        kind, dims = POOL_MODULES[type(mod)]
        typ = type(mod).__name__
        conv = self.layers[-1]["conv"] if self.layers else None
        if conv is None or self.last_kind not in ("conv", "activation"):
            raise CompileError(
                f"{desc} does not follow a convolution stage (it follows {self.last_desc}); "
                f"pooling is part of a convolution stage's output path: put nn.{typ} right "
                "after a convolution (or its activation)"
            )
        if conv["pool"] != "none":
            raise CompileError(
                f"{desc} is a second pooling after {self.layers[-1]['name']!r}; a convolution "
                "stage has at most one pooling: remove one or merge them into one window"
            )
        if (dims == 1) != (conv["kind"] == "conv1d"):
            raise CompileError(
                f"{desc} follows a {conv['kind']} stage; use the {conv['kind'][-2:]} pooling "
                f"(nn.{'Max' if kind == 'max' else 'Avg'}Pool{conv['kind'][-2:]})"
            )

        def tup(v: Any) -> tuple[int, ...]:
            return tuple(v) if isinstance(v, (tuple, list)) else (v,) * dims

        kernel = tup(mod.kernel_size)
        stride = tup(mod.stride if mod.stride is not None else mod.kernel_size)
        for attr, (ok, text) in POOL_PARAMS.items():
            if not hasattr(mod, attr):
                continue
            value = getattr(mod, attr)
            values = value if isinstance(value, tuple) else (value,)
            if any(v not in ok for v in values):
                raise CompileError(
                    f"{desc} has {attr}={value!r}; the hardware supports {text}: "
                    f"nn.{typ}({kernel[0]})"
                )
        if kernel != stride:
            raise CompileError(
                f"{desc} has kernel_size={mod.kernel_size!r}, stride={mod.stride!r}; the hardware "
                f"supports kernel = stride (non-overlapping windows): nn.{typ}({kernel[0]})"
            )
        conv["pool"], conv["pool_size"] = kind, kernel
        self.last_kind = "pool"

    def resolve(self, name: str) -> tuple[int, ...] | None:
        """Give every convolution layer its :class:`ConvGeometry` (and its in/out values);
        return the input sample's shape (None without convolutions)."""
        convs = [ly for ly in self.layers if ly["conv"] is not None]
        if not convs:
            return None
        first = convs[0]["conv"]
        dims = 1 if first["kind"] == "conv1d" else 2
        linear = next((ly for ly in self.layers if ly["conv"] is None), None)
        shape = self.shape_hint or getattr(self.model, "input_shape", None)
        where = "model.input_shape" if shape is not None and not self.shape_hint else "the input"
        if shape is None and (shape := self._data_input(first, dims)) is not None:
            where = "the data's sample shape"
        if shape is not None:
            shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
            if len(shape) != dims + 1 or any(
                isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in shape
            ):
                raise CompileError(
                    f"{where} of model {name!r} is {shape!r}; a {first['kind']} network takes "
                    f"one sample of shape ({'C, L' if dims == 1 else 'C, H, W'}): set "
                    f"model.input_shape = ({first['in_channels']}, "
                    f"{'L' if dims == 1 else 'H, W'})"
                )
            if shape[0] != first["in_channels"]:
                raise CompileError(
                    f"{where} of model {name!r} has {shape[0]} channels but the first "
                    f"convolution {convs[0]['name']!r} takes {first['in_channels']}: make them "
                    "equal"
                )
        else:
            shape = self._solve_input(name, convs, linear, dims)
        given = f"input shape {tuple(shape)}" + (
            ", the data's samples" if where == "the data's sample shape" else ""
        )
        size = tuple(shape[1:])
        for ly in convs:
            c = ly["conv"]
            try:
                g = conv_geometry(
                    c["kind"], c["in_channels"], c["out_channels"], size, c["kernel"],
                    c["stride"], c["padding"], c["bias"], c["pool"], c["pool_size"],
                )  # fmt: skip
            except ValueError as exc:
                raise CompileError(
                    f"module {ly['name']!r}: {exc} ({given}): give the model larger inputs, or "
                    "less pooling"
                ) from None
            ly["geometry"], ly["in"], ly["out"] = g, g.in_values, g.out_values
            size = g.pooled_size
        last = convs[-1]
        if linear is not None and linear["in"] != last["out"]:
            g = last["geometry"]
            raise CompileError(
                f"module {linear['name']!r} (Linear) expects {linear['in']} inputs but the "
                f"convolution {last['name']!r} gives {g.out_channels}×"
                f"{'×'.join(map(str, g.pooled_size))} = {last['out']} values per sample "
                f"({given}): make it nn.Linear({last['out']}, {linear['out']})"
            )
        return tuple(shape)

    def _data_input(self, first: dict, dims: int) -> tuple[int, ...] | None:
        """The input sample's shape the data gives a convolution network without
        ``model.input_shape`` (rather than the size search's guess): the data's sample shape
        when it is (C, L) / (C, H, W) with the first convolution's C channels, or for a Conv1d
        a flat sample of F values as (C, F / C) — the only (C, L) of F values (samples stream
        flat in C order). None otherwise (no data, another rank or channel count, a flat
        sample for a Conv2d): the search runs. Source: *derived*."""
        shape, channels = self.data_shape, first["in_channels"]
        if not shape:
            return None
        if len(shape) == dims + 1 and shape[0] == channels:
            return tuple(shape)
        if len(shape) == 1 and dims == 1 and shape[0] % channels == 0:
            return (channels, shape[0] // channels)
        return None

    def _solve_input(
        self, name: str, convs: list[dict], linear: dict | None, dims: int
    ) -> tuple[int, ...]:
        first = convs[0]["conv"]
        fix = (
            f"set model.input_shape = ({first['in_channels']}, "
            f"{'L' if dims == 1 else 'H, W'}) (one sample, without the batch dimension)"
        )
        if linear is None:
            raise CompileError(
                f"model {name!r} has no Linear layer after its convolutions, so the input size "
                f"cannot be inferred: {fix}"
            )
        found = []
        for n in range(1, INPUT_SEARCH_LIMIT[dims] + 1):
            size = (n,) * dims
            exact = True  # no conv output dropped by a pooling window
            try:
                for ly in convs:
                    c = ly["conv"]
                    g = conv_geometry(
                        c["kind"], c["in_channels"], c["out_channels"], size, c["kernel"],
                        c["stride"], c["padding"], c["bias"], c["pool"], c["pool_size"],
                    )  # fmt: skip
                    exact = exact and all(
                        o % w == 0 for o, w in zip(g.out_size, g.pool_size, strict=True)
                    )
                    size = g.pooled_size
            except ValueError:
                continue
            if g.out_values == linear["in"]:
                found.append((n, exact))
            elif g.out_values > linear["in"]:
                break
        exact_sizes = [n for n, ok in found if ok]
        if len(exact_sizes) == 1:  # the one size no pooling window truncates
            return (first["in_channels"], *((exact_sizes[0],) * dims))
        found = [n for n, _ in found]
        if len(found) != 1:
            what = (
                "no input size"
                if not found
                else f"the input sizes {', '.join(map(str, found))} all"
            )
            shape = "L" if dims == 1 else "H = W"
            raise CompileError(
                f"model {name!r}: {what} ({shape}) make the convolutions give the "
                f"{linear['in']} values Linear {linear['name']!r} takes: {fix}"
            )
        return (first["in_channels"], *((found[0],) * dims))

    def activation(self, desc: str, typ: type[nn.Module], slope: Any) -> None:
        if typ not in ACTIVATION_MODULES:
            raise CompileError(
                f"{desc} is the functional form of nn.{typ.__name__}, which the hardware does "
                f"not implement: use a supported activation or remove it; {SUPPORTED_TEXT}"
            )
        act = ACTIVATION_MODULES[typ]
        if self.last_kind == "pool":
            raise CompileError(
                f"{desc} follows the pooling of convolution {self.layers[-1]['name']!r}; a "
                "convolution stage's output path is the activation, then the pooling: put the "
                "activation before the pooling"
            )
        if (
            self.last_kind == "conv"
            and self.layers[-1]["conv"] is not None
            and act not in CONV_ACTIVATIONS
        ):
            raise CompileError(
                f"{desc} follows convolution {self.layers[-1]['name']!r}; after a convolution "
                "the hardware supports nn.ReLU or nn.LeakyReLU (or none): use one of them"
            )
        if self.last_kind == "input":
            raise CompileError(
                f"{desc} comes before the first Linear; an activation must follow a Linear "
                f"layer: move it after one or remove it; {SUPPORTED_TEXT}"
            )
        if self.last_kind == "activation":
            raise CompileError(
                f"{desc} follows another activation ({self.last_desc}); each Linear layer takes "
                f"at most one activation: remove one of them; {SUPPORTED_TEXT}"
            )
        value = 0.0
        if typ in ACTIVATION_PARAMS:
            pname = ACTIVATION_PARAMS[typ][0]
            if isinstance(slope, bool) or not isinstance(slope, (int, float)):
                raise CompileError(
                    f"{desc} has {pname}={slope!r}; the hardware needs a number fixed when the "
                    f"model is built: pass a constant ({pname}=0.01)"
                )
            value = float(slope)
            if not 0.0 <= value < 1.0:
                raise CompileError(
                    f"{desc} has {pname}={value}; the hardware supports 0 ≤ {pname} < 1: use a "
                    "slope in that range"
                )
        self.layers[-1]["act"], self.layers[-1]["slope"] = act, value
        self.last_kind = "activation"

    def flatten(self, desc: str, start: Any, end: Any, module: bool) -> None:
        fix = "nn.Flatten()" if module else "torch.flatten(x, 1) or x.flatten(1)"
        if start == 0:
            raise CompileError(
                f"{desc} has start_dim=0, which flattens the batch dimension into the features "
                f"(start_dim=0 is the default of torch.flatten and x.flatten()); keep the batch "
                f"dimension: {fix}"
            )
        if start != 1 or end not in (-1, *(() if self.rank is None else (self.rank - 1,))):
            raise CompileError(
                f"{desc} has start_dim={start}, end_dim={end}; only the flatten of every "
                f"dimension after the batch (start_dim=1, end_dim=-1) is supported: {fix}"
            )
        self.rank = 2

    def check_count(self, desc: str, count: int, how: str, features: int) -> None:
        if count == features:
            return
        if how == "-1":
            if features % count == 0:
                effect = f"-1 would make {features // count} rows of {count} per sample"
            elif count % features == 0:
                effect = f"-1 would merge {count // features} samples into one row"
            else:
                effect = f"rows of {count} would mix the values of neighbouring samples"
            raise CompileError(
                f"{desc} changes the batch dimension: a sample has {features} values here, so "
                f"{effect}; keep the batch dimension first: x.view(x.size(0), -1) (or "
                f"x.view(-1, {features}))"
            )
        raise CompileError(
            f"{desc} asks for {count} values per sample, but a sample has {features} values "
            f"here: use x.view(x.size(0), -1)"
        )

    def reshape(self, desc: str, shape: Any) -> None:
        if isinstance(shape, (int, fx.Node)):
            shape = (shape,)
        entries = list(shape) if isinstance(shape, (tuple, list)) else [shape]
        keep = (
            "keep the batch dimension first: x.view(x.size(0), -1)"
            + (f" or x.view(-1, {self.features})" if self.features else "")
            + " (or x.flatten(1))"
        )
        if len(entries) < 2:
            raise CompileError(
                f"{desc} makes a 1-D tensor, which merges the batch dimension into the "
                f"features; {keep}"
            )
        d0, rest = entries[0], entries[1:]
        for d in rest:
            if isinstance(d, fx.Node):
                raise CompileError(
                    f"{desc} takes a computed size after the batch dimension; only the first "
                    "entry may be the batch size (x.size(0) or x.shape[0]); give the others as "
                    "numbers or -1, e.g. x.view(x.size(0), -1)"
                )
            if isinstance(d, bool) or not isinstance(d, int) or (d < 1 and d != -1):
                raise CompileError(
                    f"{desc} has the size entry {d!r}; give positive numbers or one -1, e.g. "
                    "x.view(x.size(0), -1)"
                )
        if rest.count(-1) + (d0 == -1) > 1:
            raise CompileError(f"{desc} has more than one -1; {keep}")
        count = math.prod(rest)
        if isinstance(d0, fx.Node):
            if self.sizes.get(d0, -999) != 0:
                raise CompileError(
                    f"{desc} has a first entry that is not the batch size; the first entry "
                    f"must be x.size(0) or x.shape[0] (or -1); {keep}"
                )
            claim = None if -1 in rest else (count, "batch")
        elif d0 == -1:
            claim = (count, "-1")
        else:
            raise CompileError(
                f"{desc} fixes the batch dimension to the number {d0!r}. The model is traced "
                "with a batch dimension (the chip trains one sample at a time, but the module "
                f"runs on whole batches in PyTorch, where view({d0}, ...) would mix the "
                f"samples of a batch); {keep}"
            )
        if not self.layers and -1 not in rest and len(rest) in (2, 3):
            self.shape_hint = tuple(rest)  # a sample's shape for a following convolution
        if claim is not None:
            if self.features is None:
                self.pending.append((desc, *claim))
            else:
                self.check_count(desc, claim[0], claim[1], self.features)
        self.rank = len(entries)


def _trace_graph(model: nn.Module, name: str) -> fx.Graph:
    try:
        return _Tracer().trace(model)
    except Exception as exc:
        frames = [
            (f.filename, f.lineno, f.name, f.line) for f in traceback.extract_tb(exc.__traceback__)
        ]
        loc = _user_frame(frames)
        at = f" at {loc}" if loc else ""
        first_line = (str(exc).strip().splitlines() or [""])[0]
        if "'len' is not supported" in first_line:
            first_line = "len(x) of a traced tensor; write x.size(0) instead"
        if isinstance(exc, TraceError) and "control flow" in str(exc):
            raise CompileError(
                f"model {name!r} ({type(model).__name__}) cannot be traced by torch.fx: it has "
                f"data-dependent control flow{at}: "
                "torch.fx traces forward once with symbolic tensors, so an if/while on a "
                "tensor's value cannot be compiled; make forward run the same chain of layers "
                f"for every input (remove the branch); {SUPPORTED_TEXT}"
            ) from exc
        raise CompileError(
            f"model {name!r} ({type(model).__name__}) cannot be traced by torch.fx{at}: "
            f"{type(exc).__name__}: {first_line}. The forward pass must be a fixed chain of "
            f"layers without data-dependent control flow; {SUPPORTED_TEXT}"
        ) from exc


def _check_output(graph: fx.Graph, model: nn.Module, name: str) -> fx.Node:
    out = next(n for n in graph.nodes if n.op == "output")
    ret = out.args[0]
    if isinstance(ret, fx.Node):
        return ret
    cls = type(model).__name__
    if isinstance(ret, (tuple, list, dict)):
        kind = {tuple: "a tuple", list: "a list", dict: "a dict"}[type(ret)]
        raise CompileError(
            f"model {name!r} ({cls}) returns {len(ret)} values ({kind}); the hardware has one "
            "output, the last Linear's, which feeds the loss unit: return one tensor (e.g. "
            "`return self.out(h)`)"
        )
    raise CompileError(
        f"model {name!r} ({cls}) returns {ret!r}, not a tensor; return the last Linear's "
        "output (one tensor)"
    )


def trace(
    model: nn.Module,
    name: str,
    loss: str = "cross_entropy",
    sample_shape: tuple[int, ...] | None = None,
) -> NetworkIR:
    """Trace ``model`` with torch.fx and return its :class:`NetworkIR`.

    Accepted graphs: one input (batch, features…), then a chain of ``nn.Linear`` layers (with
    bias), each followed by at most one activation — ``nn.ReLU`` / ``nn.LeakyReLU`` or a
    functional / method form of :data:`FUNCTION_FORMS` / :data:`METHOD_FORMS` (``F.relu``,
    ``torch.relu``, ``x.relu()``, ``F.leaky_relu(x, negative_slope)``, and the in-place ones:
    ``inplace=True``, ``x.relu_()``, ``torch.relu_``, ``F.leaky_relu_``; an in-place step's
    input and result are the same value, so the next step may take either). Anywhere in the
    chain, dropped: ``nn.Flatten()`` / ``torch.flatten(x, 1)`` / ``x.flatten(1)``,
    ``x.view`` / ``x.reshape`` / ``torch.reshape`` that keep the batch dimension,
    ``x.contiguous()``, ``nn.Identity``, ``nn.Dropout`` (with a ``warnings.warn``: the hardware
    trains without it). Containers are traced through; a parameter-free module may be called
    more than once. Every form lowers exactly like its module form (same IR, same plan hash).

    **The batch dimension** (docs/architecture.md §1.5). The model is traced with a batch
    dimension first, although the chip trains one sample at a time. A sample is the first
    Linear's ``in_features`` values (what the hardware streams per sample); after a Linear,
    its ``out_features``. A reshape keeps the batch dimension when its first entry is
    ``x.size(0)`` / ``x.shape[0]`` (of any value in the chain; the rest numbers or one -1 whose
    product is a sample's values), or -1 with the rest numbers whose product is a sample's
    values (``x.view(-1, 64)`` on 64-value samples). Refused as changing the batch dimension:
    a 1-D result (``x.view(-1)``), -1 first with another product (``x.view(-1, 32)`` on 64
    values), a number first (``x.view(1, -1)``: literal 1 included — in PyTorch it would merge
    a batch into one row), ``flatten`` with ``start_dim=0`` (``torch.flatten(x)``,
    ``x.flatten()``). A Linear must get a 2-D (batch, features) tensor.

    **A convolution network's input shape** (docs/architecture.md §1.5), in this order:
    ``model.input_shape``; a reshape's sample shape before the first convolution;
    ``sample_shape``, the data's (a :class:`~pipetrain.data.Dataset`'s ``shape``, given by the
    compile flow when the caller gave data), where it fits the first convolution (its rank and
    channels; a flat sample for a Conv1d as (C, F / C)); else the smallest input size that
    gives the first Linear its ``in_features`` (searched up to :data:`INPUT_SEARCH_LIMIT`).

    Raises :class:`CompileError` (one line, naming the module path or source line and a fix)
    for a non-Module ``model``; a graph fx cannot trace (data-dependent control flow, a
    ``TraceError``); several inputs or outputs; an unsupported module, function, method or
    operator (``nn.LSTM``, ``nn.Conv2d``, ``torch.sin``, ``x + 1``; a softmax at the end is
    named: the loss unit applies it); a bare ``nn.Linear`` as the model (wrap it); a direct use of
    a parameter (``F.linear(x, self.fc.weight)``); a graph that is not a chain (skip
    connections, a step whose result is never used); a module with parameters called twice; a
    Parameter shared by two Linear layers (tied weights, found by identity and by storage — not
    by ``named_parameters()``, which hides them); an activation before the first Linear or two
    in a row; a LeakyReLU slope outside [0, 1); a Linear without bias; Linear sizes that do not
    match; a reshape that changes the batch dimension; a network without Linear layers.
    Source: *derived* from the stage model of docs/architecture.md §1/§3.
    """
    if not isinstance(model, nn.Module):
        raise CompileError(
            f"model {name!r} is a {type(model).__name__}, not a torch.nn.Module: pass an "
            f"nn.Module; {SUPPORTED_TEXT}"
        )
    if type(model) in WEIGHT_MODULES:  # the root itself: its forward reads its own weight
        raise CompileError(
            f"model {name!r} is a bare nn.{type(model).__name__}; a stage is a Linear module "
            f"called inside the model: wrap it, nn.Sequential(nn.Linear(...)) (its state_dict "
            f"keys become '0.weight', '0.bias'); {SUPPORTED_TEXT}"
        )
    graph = _trace_graph(model, name)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise CompileError(
            f"model {name!r} ({type(model).__name__}) takes {len(placeholders)} inputs; the "
            "hardware streams one input tensor (batch, features): give forward one argument"
        )
    ret = _check_output(graph, model, name)
    chain = _Chain(model, placeholders[0], sample_shape)
    for node in graph.nodes:
        if node.op in ("placeholder", "output") or chain.size_query(node):
            continue
        if node.op == "call_module":
            _module_step(chain, node)
            continue
        form = _form_of(node)
        if form is None:
            raise CompileError(_unsupported(node, name, model))
        desc = f"{form.text}{_where(node)}"
        src = node.args[0] if node.args else None
        others = [n for n in _nodes_in((node.args[1:], node.kwargs)) if n not in chain.sizes]
        if not isinstance(src, fx.Node) or src not in chain.head or others:
            raise chain.not_chained(desc)
        bound = _bind(node, form)
        if form.step == "activation":
            assert form.module is not None
            pname = ACTIVATION_PARAMS.get(form.module, ("", 0.0))
            chain.activation(desc, form.module, bound.get(pname[0], pname[1]))
            inplace = form.inplace if form.inplace is not None else bool(bound.get("inplace"))
            chain.advance(node, desc, inplace)
            continue
        if form.step == "flatten":
            chain.flatten(desc, bound["start_dim"], bound["end_dim"], module=False)
        elif form.step == "reshape":
            chain.reshape(desc, bound.get("shape", ()))
        chain.advance(node, desc, False)
    if ret not in chain.head:
        raise chain.not_chained(f"the model's return value ({ret.name})")
    layers = chain.layers
    if not layers:
        raise CompileError(
            f"model {name!r} ({type(model).__name__}) has no nn.Linear layer: add one; "
            f"{SUPPORTED_TEXT}"
        )
    shape = chain.resolve(name)
    if layers[-1]["conv"] is not None and chain.rank != 2:
        raise CompileError(
            f"model {name!r} ends in convolution {layers[-1]['name']!r}; the loss unit takes "
            "(batch, classes): flatten its output (nn.Flatten()) or end in an nn.Linear"
        )
    geometry: list[ConvGeometry | None] = [ly.get("geometry") for ly in layers]
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
                conv=g,
            )
            for ly, g in zip(layers, geometry, strict=True)
        ),
        loss=loss,
        input_shape=shape or (),
    )


def _unsupported(node: fx.Node, name: str, model: nn.Module) -> str:
    if node.op == "get_attr":
        target = str(node.target)
        owner = target.rpartition(".")[0]
        try:
            is_linear = isinstance(model.get_submodule(owner), nn.Linear) if owner else False
        except AttributeError:
            is_linear = False
        fix = (
            f"call the module instead, self.{owner}(x)"
            if is_linear
            else "make it the weight of an nn.Linear layer called as a module, or remove it"
        )
        return (
            f"model {name!r} reads the parameter/buffer {target!r} directly{_where(node)} (e.g. "
            "F.linear(x, self.fc.weight, self.fc.bias)); the hardware trains nn.Linear modules "
            f"called as modules: {fix}"
        )
    hint = None
    if node.op == "call_function":
        try:
            hint = _MODULE_HINTS.get(node.target)  # type: ignore[arg-type]
        except TypeError:
            hint = None
    elif node.op == "call_method":
        hint = _METHOD_HINTS.get(str(node.target))
    return (
        f"model {name!r} uses {_describe_call(node)}{_where(node)}; the hardware has no such "
        f"step: {hint or 'remove it or use a supported step'}; {SUPPORTED_TEXT}"
    )


def _module_step(chain: _Chain, node: fx.Node) -> None:
    path = str(node.target)
    mod = chain.model.get_submodule(path)
    typ = type(mod).__name__
    desc = f"module {path!r} ({typ})"
    if any(True for _ in mod.parameters()):
        if id(mod) in chain.called:
            raise CompileError(
                f"{desc} is called more than once in forward (a shared layer); each hardware "
                "stage owns one Linear's weights: create a separate module for each use"
            )
        chain.called[id(mod)] = path
    ins = _nodes_in((node.args, node.kwargs))
    if len(ins) != 1 or ins[0] not in chain.head or len(node.args) != 1 or node.kwargs:
        raise chain.not_chained(desc)
    inplace = bool(getattr(mod, "inplace", False)) or isinstance(mod, nn.Identity)
    if type(mod) in CONV_MODULES:
        chain.conv(path, mod)
        inplace = False
    elif isinstance(mod, WEIGHT_MODULES):
        chain.linear(node, path, mod)
        inplace = False
    elif type(mod) in POOL_MODULES:
        chain.pool(desc, mod)
    elif type(mod) in ACTIVATION_MODULES:
        pname, default = ACTIVATION_PARAMS.get(type(mod), ("", 0.0))
        chain.activation(desc, type(mod), getattr(mod, pname, default) if pname else default)
    elif isinstance(mod, PASS_MODULES):
        if isinstance(mod, nn.Dropout):
            warnings.warn(
                f"module {path!r} (Dropout, p={mod.p}) is compiled as identity: the "
                "hardware trains without dropout",
                stacklevel=3,
            )
        if isinstance(mod, nn.Flatten):
            chain.flatten(desc, mod.start_dim, mod.end_dim, module=True)
    else:
        fix = _TYPE_HINTS.get(type(mod), "replace it by a supported layer or remove it")
        raise CompileError(f"{desc} is not supported by the hardware: {fix}; {SUPPORTED_TEXT}")
    chain.advance(node, desc, inplace)
