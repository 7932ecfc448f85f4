"""Front end (compiler/frontend.py): the functional, method, in-place and reshape forms people
write lower exactly like their module twins (same IR, same plan hash); shared layers, tied
weights, several outputs, data-dependent control flow and batch-changing reshapes are refused
with one line that names the cause and a fix (also through ``pipetrain compile``)."""

from __future__ import annotations

import os
import textwrap

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from pipetrain.compiler.compile import compile_result
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.frontend import ACTIVATION_MODULES, CompileError, trace
from pipetrain.compiler.plan import Plan
from pipetrain.errors import UserError
from torch import nn


def _hash(model: nn.Module) -> str:
    return compile_result(model, TrainConfig(), formats="default", name="net").plan.hash


class _Twin(nn.Module):
    """The all-module form: ``pre`` → fc1 (8 → 6) → ``act`` → ``mid`` → fc2 (6 → 3)."""

    def __init__(self, act: nn.Module, pre: nn.Module | None = None, mid: nn.Module | None = None):
        super().__init__()
        self.pre, self.fc1, self.act = pre or nn.Identity(), nn.Linear(8, 6), act
        self.mid, self.fc2 = mid or nn.Identity(), nn.Linear(6, 3)

    def forward(self, x):
        return self.fc2(self.mid(self.act(self.fc1(self.pre(x)))))


class _Fn(nn.Module):
    """The same network written with functions: ``pre(x)``, ``act(h)``, ``mid(h)`` (callables
    traced by fx; a module ``act`` is called too)."""

    def __init__(self, act, pre=None, mid=None):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 6), nn.Linear(6, 3)
        self.act_fn, self.pre_fn, self.mid_fn = act, pre, mid
        if isinstance(act, nn.Module):
            self.act_mod = act

    def forward(self, x):
        if self.pre_fn is not None:
            x = self.pre_fn(x)
        h = self.fc1(x)
        h = self.act_mod(h) if hasattr(self, "act_mod") else self.act_fn(h)
        if self.mid_fn is not None:
            h = self.mid_fn(h)
        return self.fc2(h)


def _inplace_ignoring_result(fn):
    """``fn(h)`` mutates ``h``; the next step reads ``h`` itself, not ``fn``'s result."""

    def step(h):
        fn(h)
        return h

    return step


class _ActModIgnored(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 6), nn.ReLU(inplace=True), nn.Linear(6, 3)

    def forward(self, x):
        h = self.fc1(x)
        self.act(h)  # in place: h is now relu(h)
        return self.fc2(h)


RELU, LEAKY = nn.ReLU(), nn.LeakyReLU(0.2)
#: name → (functional model, all-module twin); the functional forms of docs/architecture.md §1.5.
ACCEPTED = {
    "F.relu": (lambda: _Fn(F.relu), lambda: _Twin(RELU)),
    "torch.relu": (lambda: _Fn(torch.relu), lambda: _Twin(RELU)),
    "x.relu()": (lambda: _Fn(lambda h: h.relu()), lambda: _Twin(RELU)),
    "F.relu(inplace=True)": (
        lambda: _Fn(lambda h: F.relu(h, inplace=True)),
        lambda: _Twin(RELU),
    ),
    "F.relu(x, True) result ignored": (
        lambda: _Fn(_inplace_ignoring_result(lambda h: F.relu(h, True))),
        lambda: _Twin(RELU),
    ),
    "x.relu_()": (lambda: _Fn(lambda h: h.relu_()), lambda: _Twin(RELU)),
    "x.relu_() result ignored": (
        lambda: _Fn(_inplace_ignoring_result(lambda h: h.relu_())),
        lambda: _Twin(RELU),
    ),
    "torch.relu_": (lambda: _Fn(_inplace_ignoring_result(torch.relu_)), lambda: _Twin(RELU)),
    "F.relu_": (lambda: _Fn(F.relu_), lambda: _Twin(RELU)),
    "nn.ReLU(inplace=True)": (lambda: _Fn(nn.ReLU(inplace=True)), lambda: _Twin(RELU)),
    "nn.ReLU(inplace=True) result ignored": (_ActModIgnored, lambda: _Twin(RELU)),
    "F.leaky_relu(negative_slope=)": (
        lambda: _Fn(lambda h: F.leaky_relu(h, negative_slope=0.2)),
        lambda: _Twin(LEAKY),
    ),
    "F.leaky_relu(x, 0.2)": (lambda: _Fn(lambda h: F.leaky_relu(h, 0.2)), lambda: _Twin(LEAKY)),
    "F.leaky_relu default slope": (lambda: _Fn(F.leaky_relu), lambda: _Twin(nn.LeakyReLU())),
    "F.leaky_relu(inplace=True) result ignored": (
        lambda: _Fn(_inplace_ignoring_result(lambda h: F.leaky_relu(h, 0.2, inplace=True))),
        lambda: _Twin(LEAKY),
    ),
    "F.leaky_relu_": (lambda: _Fn(lambda h: F.leaky_relu_(h, 0.2)), lambda: _Twin(LEAKY)),
    "nn.LeakyReLU(inplace=True)": (
        lambda: _Fn(nn.LeakyReLU(0.2, inplace=True)),
        lambda: _Twin(LEAKY),
    ),
    "torch.flatten(x, 1)": (
        lambda: _Fn(F.relu, pre=lambda x: torch.flatten(x, 1)),
        lambda: _Twin(RELU, pre=nn.Flatten()),
    ),
    "torch.flatten(x, start_dim=1)": (
        lambda: _Fn(F.relu, pre=lambda x: torch.flatten(x, start_dim=1, end_dim=-1)),
        lambda: _Twin(RELU, pre=nn.Flatten()),
    ),
    "x.flatten(1)": (
        lambda: _Fn(F.relu, pre=lambda x: x.flatten(1)),
        lambda: _Twin(RELU, pre=nn.Flatten()),
    ),
    "x.view(x.size(0), -1)": (
        lambda: _Fn(F.relu, pre=lambda x: x.view(x.size(0), -1)),
        lambda: _Twin(RELU, pre=nn.Flatten()),
    ),
    "x.view(x.shape[0], -1)": (
        lambda: _Fn(F.relu, pre=lambda x: x.view(x.shape[0], -1)),
        lambda: _Twin(RELU, pre=nn.Flatten()),
    ),
    "x.view((x.size()[0], 8))": (
        lambda: _Fn(F.relu, pre=lambda x: x.view((x.size()[0], 8))),
        lambda: _Twin(RELU, pre=nn.Flatten()),
    ),
    "x.view(-1, 8)": (
        lambda: _Fn(F.relu, pre=lambda x: x.view(-1, 8)),
        lambda: _Twin(RELU, pre=nn.Flatten()),
    ),
    "x.reshape(x.size(0), 2, 4).flatten(1)": (
        lambda: _Fn(F.relu, pre=lambda x: x.reshape(x.size(0), 2, 4).flatten(1)),
        lambda: _Twin(RELU, pre=nn.Flatten()),
    ),
    "torch.reshape(x, (-1, 8)).contiguous()": (
        lambda: _Fn(F.relu, pre=lambda x: torch.reshape(x, (-1, 8)).contiguous()),
        lambda: _Twin(RELU, pre=nn.Flatten()),
    ),
    "h.view(-1, 6) after the activation": (
        lambda: _Fn(F.relu, mid=lambda h: h.view(-1, 6)),
        lambda: _Twin(RELU, mid=nn.Flatten()),
    ),
}


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_functional_form_lowers_like_its_module_twin(case):
    make_fn, make_twin = ACCEPTED[case]
    torch.manual_seed(0)
    fn = make_fn()
    twin = make_twin()
    twin.load_state_dict(fn.state_dict())  # the Linear paths are the same: fc1, fc2
    x = torch.randn(5, 8)
    # the twin is the same function in PyTorch (in-place forms included), batch of 5
    assert torch.equal(fn(x.clone()), twin(x.clone()))
    assert trace(fn, "net") == trace(twin, "net")
    assert _hash(fn) == _hash(twin)


def test_the_ir_of_the_functional_forms():
    ir = trace(_Fn(lambda h: F.leaky_relu(h, 0.2, True), pre=lambda x: x.view(-1, 8)), "net")
    assert ir.in_features == 8
    assert [(ly.name, ly.activation, ly.negative_slope) for ly in ir.layers] == [
        ("fc1", "leaky_relu", 0.2),
        ("fc2", "identity", 0.0),
    ]


class _ReusedAct(nn.Module):
    def __init__(self, act: str):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(8, 6), nn.Linear(6, 5), nn.Linear(5, 3)
        self.a, self.b = nn.ReLU(), nn.ReLU()
        self.act = act

    def forward(self, x):
        if self.act == "shared":  # one parameter-free module called twice
            return self.fc3(self.a(self.fc2(self.a(self.fc1(x)))))
        return self.fc3(self.b(self.fc2(self.a(self.fc1(x)))))


def test_a_parameter_free_module_may_be_called_twice():
    torch.manual_seed(0)
    shared, twin = _ReusedAct("shared"), _ReusedAct("two")
    twin.load_state_dict(shared.state_dict())
    assert trace(shared, "net") == trace(twin, "net")
    assert [ly.activation for ly in trace(shared, "net").layers] == ["relu", "relu", "identity"]
    assert _hash(shared) == _hash(twin)


def test_functional_tanh_and_sigmoid_follow_their_modules():
    """``torch.tanh`` / ``F.sigmoid`` map to nn.Tanh / nn.Sigmoid: compiled exactly like the
    module while the front end supports it, refused by name while it does not."""
    for fn_act, mod in [
        (torch.tanh, nn.Tanh),
        (F.tanh, nn.Tanh),
        (lambda h: h.tanh(), nn.Tanh),
        (_inplace_ignoring_result(torch.tanh_), nn.Tanh),
        (_inplace_ignoring_result(lambda h: h.tanh_()), nn.Tanh),
        (torch.sigmoid, nn.Sigmoid),
        (F.sigmoid, nn.Sigmoid),
        (lambda h: h.sigmoid(), nn.Sigmoid),
        (_inplace_ignoring_result(torch.sigmoid_), nn.Sigmoid),
        (lambda h: h.sigmoid_(), nn.Sigmoid),
    ]:
        torch.manual_seed(0)
        fn, twin = _Fn(fn_act), _Twin(mod())
        twin.load_state_dict(fn.state_dict())
        x = torch.randn(5, 8)
        assert torch.equal(fn(x.clone()), twin(x.clone()))
        if mod in ACTIVATION_MODULES:
            assert trace(fn, "net") == trace(twin, "net")
            assert trace(fn, "net").layers[0].activation == ACTIVATION_MODULES[mod]
            assert _hash(fn) == _hash(twin)  # the plan's activation LUT included
        else:
            with pytest.raises(CompileError, match=f"functional form of nn.{mod.__name__}"):
                trace(fn, "net")
            with pytest.raises(CompileError, match=f"'act' \\({mod.__name__}\\) is not supported"):
                trace(twin, "net")


# ---- refusals -----------------------------------------------------------------------------


class _Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.out = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.out(F.relu(self.fc(F.relu(self.fc(x)))))


class _Tied(nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.enc, self.dec, self.out = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)
        if how == "weight":
            self.dec.weight = self.enc.weight
        elif how == "bias":
            self.dec.bias = self.enc.bias
        elif how == "storage":
            self.dec.weight = nn.Parameter(self.enc.weight.data)

    def forward(self, x):
        return self.out(torch.relu(self.dec(torch.relu(self.enc(x)))))


class _Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.out = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        h = F.relu(self.fc(x))
        return self.out(h), h


class _If(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.out = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        h = self.fc(x)
        if h.mean() > 0:  # data-dependent
            h = F.relu(h)
        return self.out(h)


class _Step(nn.Module):
    """fc (4 → 4) → ``step(h)`` → out (4 → 2), input (B, 4) through ``pre``."""

    def __init__(self, step=None, pre=None):
        super().__init__()
        self.fc, self.out, self.step, self.pre = nn.Linear(4, 4), nn.Linear(4, 2), step, pre
        self.relu = nn.ReLU()

    def forward(self, x):
        if self.pre is not None:
            x = self.pre(x)
        h = self.fc(x)
        if self.step is not None:
            h = self.step(self, h)
        return self.out(h)


def _unused(self, h):
    F.relu(h)  # not in place: the result is dropped, h is unchanged
    return h


def _unused_module(self, h):
    self.relu(h)
    return h


REFUSED = {
    "linear twice": (_Twice(), ["module 'fc' (Linear) is called more than once", "separate"]),
    "tied weight": (
        _Tied("weight"),
        ["the weight of module 'dec' (Linear) is the same Parameter as 'enc.weight'", "own"],
    ),
    "tied bias": (_Tied("bias"), ["the bias of module 'dec'", "'enc.bias'", "tied"]),
    "tied storage": (_Tied("storage"), ["'dec'", "shares its storage with 'enc.weight'"]),
    "two outputs": (_Two(), ["returns 2 values (a tuple)", "return one tensor"]),
    "data-dependent if": (
        _If(),
        ["data-dependent control flow", "test_frontend.py:", "if h.mean() > 0", "remove"],
    ),
    "view(-1, 2) splits samples": (
        _Step(lambda s, h: h.view(-1, 2)),
        ["x.view", "changes the batch dimension", "4 values", "2 rows of 2", "x.size(0), -1"],
    ),
    "view(-1, 2) on the input": (
        _Step(pre=lambda x: x.view(-1, 2)),
        ["x.view", "changes the batch dimension", "4 values"],
    ),
    "view(1, -1)": (
        _Step(lambda s, h: h.view(1, -1)),
        ["x.view", "fixes the batch dimension to the number 1", "x.view(x.size(0), -1)"],
    ),
    "view(-1)": (_Step(lambda s, h: h.view(-1)), ["1-D", "merges the batch dimension"]),
    "reshape(size(1), -1)": (
        _Step(lambda s, h: h.reshape(h.size(1), -1)),
        ["x.reshape", "not the batch size", "x.size(0)"],
    ),
    "view(size(0), 3)": (
        _Step(lambda s, h: h.view(h.size(0), 3)),
        ["asks for 3 values per sample", "a sample has 4"],
    ),
    "view(size(0), 2, 2) into Linear": (
        _Step(lambda s, h: F.relu(h).view(h.size(0), 2, 2)),
        ["'out' (Linear) gets a 3-D tensor", "x.flatten(1)"],
    ),
    "torch.flatten(x)": (
        _Step(pre=lambda x: torch.flatten(x)),
        ["torch.flatten", "start_dim=0", "torch.flatten(x, 1)"],
    ),
    "x.flatten()": (_Step(lambda s, h: h.flatten()), ["x.flatten", "start_dim=0"]),
    "nn.Flatten(0)": (
        nn.Sequential(nn.Flatten(0), nn.Linear(4, 2)),
        ["'0' (Flatten)", "start_dim=0", "nn.Flatten()"],
    ),
    "result never used": (_Step(_unused), ["the result of F.relu(x)", "never used", "assign"]),
    "module result never used": (
        _Step(_unused_module),
        ["the result of module 'relu' (ReLU) is never used", "assign"],
    ),
    "F.linear": (
        _Step(lambda s, h: F.linear(h, s.fc.weight, s.fc.bias)),
        ["reads the parameter/buffer 'fc.weight'", "self.fc(x)"],
    ),
    "F.dropout": (_Step(lambda s, h: F.dropout(h, 0.1)), ["dropout", "nn.Dropout"]),
    "leaky slope": (_Step(lambda s, h: F.leaky_relu(h, 1.5)), ["negative_slope=1.5", "0 ≤"]),
    "relu before Linear": (
        _Step(pre=lambda x: F.relu(x)),
        ["F.relu(x)", "before the first Linear"],
    ),
    "two activations": (
        _Step(lambda s, h: torch.relu(F.relu(h, inplace=True))),
        ["torch.relu(x)", "follows another activation (F.relu(x)", "remove one"],
    ),
    "operator": (_Step(lambda s, h: h * 2), ["operator 'mul'", "remove it"]),
    "len(x)": (_Step(pre=lambda x: x.view(len(x), -1)), ["len(x)", "write x.size(0) instead"]),
    "F.log_softmax": (
        _Step(lambda s, h: F.log_softmax(h, 1)),
        ["log_softmax", "loss unit applies softmax cross-entropy", "returns the logits"],
    ),
    "x.softmax": (_Step(lambda s, h: h.softmax(1)), ["softmax", "returns the logits"]),
    "nn.LogSoftmax": (
        nn.Sequential(nn.Linear(4, 2), nn.LogSoftmax(1)),
        ["(LogSoftmax) is not supported", "returns the logits: remove the softmax"],
    ),
    "bare nn.Linear": (nn.Linear(4, 2), ["bare nn.Linear", "nn.Sequential(nn.Linear(...))"]),
    "view of the input never used": (
        _Step(pre=lambda x: (x.view(x.size(0), -1), x)[1]),
        ["the result of x.view", "never used", "assign"],
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refusals_name_the_cause_and_a_fix(case):
    model, needles = REFUSED[case]
    with pytest.raises(CompileError) as info:
        trace(model, "bad")
    msg = str(info.value)
    assert "\n" not in msg  # one line through the CLI
    for needle in needles:
        assert needle in msg, (needle, msg)
    assert isinstance(info.value, UserError)


def test_named_parameters_hides_tied_weights():
    """Why the check uses identity: ``named_parameters()`` lists a tied tensor once."""
    assert len(list(_Tied("weight").named_parameters())) == 5  # enc.w, enc.b, dec.b, out.w/b
    assert len(list(_Tied("none").named_parameters())) == 6
    assert trace(_Tied("none"), "ok").layers[1].name == "dec"


def test_the_old_module_hint_is_gone():
    """The `.view()` refusal used to suggest nn.ReLU() instead of F.relu, which did not help."""
    with pytest.raises(CompileError) as info:
        trace(_Step(lambda s, h: h.view(-1)), "bad")
    assert "nn.ReLU() instead" not in str(info.value)


# ---- through the command line: one line, exit 2, nothing written --------------------------

_HEADER = """
import torch
import torch.nn.functional as F
from torch import nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.out = nn.Linear(64, 64), nn.Linear(64, 10)
"""

CLI_REFUSED = {
    "batch_view.py": (
        "    def forward(self, x):\n        return self.out(F.relu(self.fc(x)).view(-1, 32))\n",
        ["changes the batch dimension", "batch_view.py:10"],
    ),
    "twice.py": (
        "    def forward(self, x):\n        return self.out(F.relu(self.fc(F.relu(self.fc(x)))))\n",
        ["module 'fc' (Linear) is called more than once"],
    ),
    "tied.py": (
        "        self.mid = nn.Linear(64, 64)\n        self.mid.weight = self.fc.weight\n"
        "    def forward(self, x):\n"
        "        return self.out(F.relu(self.mid(F.relu(self.fc(x)))))\n",
        ["the weight of module 'mid' (Linear) is the same Parameter as 'fc.weight'"],
    ),
    "tuple.py": (
        "    def forward(self, x):\n        h = self.fc(x)\n        return self.out(h), h\n",
        ["returns 2 values (a tuple)"],
    ),
    "branch.py": (
        "    def forward(self, x):\n        h = self.fc(x)\n        if h.sum() > 0:\n"
        "            h = -h\n        return self.out(h)\n",
        ["data-dependent control flow", "branch.py:11"],
    ),
}


def _cli(args, cwd, monkeypatch):
    from pipetrain.host.cli import cli

    monkeypatch.chdir(cwd)
    return CliRunner().invoke(cli, args, catch_exceptions=False)


@pytest.mark.parametrize("fname", list(CLI_REFUSED))
def test_cli_refuses_with_one_line_and_writes_nothing(tmp_path, monkeypatch, fname):
    body, needles = CLI_REFUSED[fname]
    (tmp_path / fname).write_text(textwrap.dedent(_HEADER) + body + "model = Net()\n")
    res = _cli(["compile", fname, "--out", "out", "--formats", "default"], tmp_path, monkeypatch)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert sorted(os.listdir(tmp_path)) == [fname]  # no out folder, no temporary folder


def test_cli_compiles_the_functional_form_to_the_module_twins_plan(tmp_path, monkeypatch):
    source = """
        import torch.nn.functional as F
        from torch import nn
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc, self.out = nn.Linear(6, 5), nn.Linear(5, 3)
            def forward(self, x):
                h = self.fc(x.view(x.size(0), -1))
                F.leaky_relu(h, 0.25, inplace=True)
                return self.out(h)
        model = Net()
        """
    (tmp_path / "net.py").write_text(textwrap.dedent(source))
    res = _cli(["compile", "net.py", "--out", "out", "--formats", "default"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    plan = Plan.from_json((tmp_path / "out" / "plan.json").read_text())

    class Twin(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.act, self.out = nn.Linear(6, 5), nn.LeakyReLU(0.25), nn.Linear(5, 3)

        def forward(self, x):
            return self.out(self.act(self.fc(x)))

    twin_plan = compile_result(Twin(), TrainConfig(), formats="default", name="net").plan
    assert [st.activation for st in plan.stages] == ["leaky_relu", "identity"]
    assert plan.hash == twin_plan.hash
