"""Networks written with the front end's functional, method, in-place and reshape forms
(compiler/frontend.py, docs/architecture.md §1.5) train bit-exact in RTL (Verilator) with the
golden model, and their plans are those of their all-module twins (same hash).

Default run: the functional twins of the digits nets of ``tests/test_rtl_network.py`` (64 → 8
→ 10, in-place ``F.relu``, views) and ``tests/test_rtl_activation.py`` (64 → 8 → 6 → 10,
``torch.tanh``, ``x.sigmoid_()``): their plans are those nets' plans, so they share those builds
(cached by the plan; no Verilator build of their own). With ``--runslow``: a 10-stage net
with every ReLU / LeakyReLU form and every reshape form, one Verilator build of its own
(measured on the project's shared 2-core machine: 58 s of compiler CPU plus 17–21 s of Verilog
generation, ~190 s wall; too long for the default run).
"""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F
from pipetrain.compiler.compile import compile_result
from pipetrain.compiler.config import TrainConfig
from pipetrain.host.flow import compile_design
from pipetrain.sim.fixed import quantise
from pipetrain.sim.stimulus import plan_samples
from pipetrain.sim.tb.network import check_network
from torch import nn

#: tests/test_rtl_network.py's TINY_MODEL, written with functions: Linear paths "0" and "2"
#: (created in the same order, so the same seeded initial weights and calibrated formats)
FUNCTIONAL_TINY = """
import torch
import torch.nn.functional as F
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.add_module("0", nn.Linear(64, 8))
        self.add_module("2", nn.Linear(8, 10))

    def forward(self, x):
        x = torch.flatten(x.view(x.size(0), -1), 1)
        h = getattr(self, "0")(x.reshape(-1, 64).contiguous())
        F.relu(h, inplace=True)
        return getattr(self, "2")(h.view(h.shape[0], -1))

model = Net
config = {"lr": 0.05, "momentum": 0.9}
"""

#: tests/test_rtl_activation.py's MODEL (64 → 8 Tanh → 6 Sigmoid → 10) with torch.tanh and an
#: in-place x.sigmoid_()
FUNCTIONAL_TANH_SIGMOID = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        for name, (a, b) in zip(("0", "2", "4"), ((64, 8), (8, 6), (6, 10))):
            self.add_module(name, nn.Linear(a, b))

    def forward(self, x):
        h = torch.tanh(getattr(self, "0")(x.view(-1, 64)))
        h = getattr(self, "2")(h)
        h.sigmoid_()
        return getattr(self, "4")(h)

model = Net
config = {"lr": 0.05, "momentum": 0.9}
"""


def _module_twin(name: str) -> tuple[str, str]:
    if name == "tiny_digits":
        from test_rtl_network import TINY_MODEL

        return TINY_MODEL, FUNCTIONAL_TINY
    from test_rtl_activation import MODEL

    return MODEL, FUNCTIONAL_TANH_SIGMOID


@pytest.mark.parametrize("name", ["tiny_digits", "tanh_sigmoid"])
def test_functional_net_is_its_module_net_and_bit_exact(tmp_path, name):
    """The functional form of a net another RTL test builds: the same plan (calibrated formats
    included), so that test's Verilator build serves both."""
    results = []
    for folder, source in zip(("module", "fn"), _module_twin(name), strict=True):
        (tmp_path / folder).mkdir()
        path = tmp_path / folder / f"{name}.py"  # the same model name
        path.write_text(textwrap.dedent(source))
        results.append(compile_design(str(path), seed=0, data="digits", writers=()))
    mod, fn = results
    assert fn.plan.hash == mod.plan.hash
    n = 20
    x, y = plan_samples(fn.plan, n, "digits", 0)
    train = [k % 7 != 3 for k in range(n)]
    rep = check_network(fn.plan, fn.model, x, y.tolist(), train)  # the functional module
    assert rep.bit_exact, [m.describe() for m in rep.mismatches[:5]]
    assert rep.extra["samples_trained"] == sum(train)


#: widths: 6 inputs, nine hidden stages of 4 (one activation form each), 3 classes
WIDTHS = (6, 4, 4, 4, 4, 4, 4, 4, 4, 4, 3)


class AllForms(nn.Module):
    """10 Linear stages; stage s ends in the s-th activation form, and the reshapes between
    them keep the batch dimension."""

    def __init__(self) -> None:
        super().__init__()
        for s, (a, b) in enumerate(zip(WIDTHS[:-1], WIDTHS[1:], strict=True), start=1):
            setattr(self, f"l{s}", nn.Linear(a, b))
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        x = torch.flatten(x.view(x.size(0), -1), 1)
        h = F.relu(self.l1(x))  # 1
        h = torch.relu(self.l2(h.reshape(h.shape[0], -1)))  # 2
        h = F.leaky_relu(self.l3(h.view(-1, 4)), negative_slope=0.125)  # 3
        h = self.l4(h.flatten(1))
        self.act(h)  # 4: nn.ReLU(inplace=True), its result not used
        h = self.l5(torch.reshape(h, (-1, 4)))
        F.relu(h, inplace=True)  # 5
        h = self.l6(h.contiguous())
        h.relu_()  # 6
        h = self.l7(h)
        torch.relu_(h)  # 7
        h = self.l8(h).relu()  # 8
        h = self.l9(h.view(h.size()[0], 4))
        F.leaky_relu(h, 0.25, inplace=True)  # 9
        return self.l10(h)


class AllModules(nn.Module):
    """The same network with modules only (same Linear paths ``l1``…``l10``)."""

    def __init__(self) -> None:
        super().__init__()
        acts = [nn.ReLU(), nn.ReLU(), nn.LeakyReLU(0.125), nn.ReLU(), nn.ReLU(), nn.ReLU()]
        acts += [nn.ReLU(), nn.ReLU(), nn.LeakyReLU(0.25), nn.Identity()]
        for s, (a, b) in enumerate(zip(WIDTHS[:-1], WIDTHS[1:], strict=True), start=1):
            setattr(self, f"l{s}", nn.Linear(a, b))
            setattr(self, f"a{s}", acts[s - 1])

    def forward(self, x):
        for s in range(1, len(WIDTHS)):
            x = getattr(self, f"a{s}")(getattr(self, f"l{s}")(x))
        return x


@pytest.mark.slow
def test_all_functional_forms_train_bit_exact_in_rtl():
    torch.manual_seed(0)
    model, twin = AllForms(), AllModules()
    twin.load_state_dict(model.state_dict())
    x0 = torch.randn(7, 6)
    assert torch.equal(model(x0.clone()), twin(x0.clone()))  # the same function in PyTorch
    config = TrainConfig(lr=0.25, momentum=0.5)
    lanes = [2] + [1] * 9
    res = compile_result(model, config, formats="default", lanes=lanes, name="all_forms")
    twin_plan = compile_result(twin, config, formats="default", lanes=lanes, name="all_forms").plan
    plan = res.plan
    assert plan.hash == twin_plan.hash
    assert [str(st.activation) for st in plan.stages] == [
        "relu",
        "relu",
        "leaky_relu",
        *["relu"] * 5,
        "leaky_relu",
        "identity",
    ]
    n = 14
    gen = torch.Generator().manual_seed(5)
    x = quantise(torch.randn(n, 6, generator=gen), plan.stages[0].formats.x)[0]
    labels = torch.randint(0, 3, (n,), generator=gen).tolist()
    train = [k != 6 for k in range(n)]  # one inference sample mixed in
    rep = check_network(plan, model, x, labels, train)
    assert rep.bit_exact, (
        f"{len(rep.mismatches)} mismatches; first: "
        f"{rep.first.describe() if rep.first else '?'} ({rep.localisation})"
    )
    assert rep.extra["samples_trained"] == n - 1
    assert rep.extra["ticks"] == n + 2 * len(plan.stages) - 1  # PB: numerics §7
