"""``pipetrain.host.open``: golden and reference targets in process, and a link target (tcp://)
served by the protocol's device model in front of the golden model — fast, no RTL."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import pytest
import torch
from pipetrain.compiler.build import build_plan
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.ir import LayerIR, NetworkIR
from pipetrain.compiler.plan import Plan
from pipetrain.host import Device, DeviceError, open
from pipetrain.host.transport import TransportError
from pipetrain.protocol.device_model import LinkDeviceModel
from pipetrain.protocol.wire import LinkParams, Result
from pipetrain.sim.golden import GoldenModel
from pipetrain.sim.reference import ReferenceTrainer
from torch import nn

IR = NetworkIR("tiny", 6, (LayerIR("0", 6, 5, "relu"), LayerIR("2", 5, 3)))
PLAN = build_plan(IR, TrainConfig(momentum=0.9, lr=0.05, seed=3), lanes=[2, 1])


def make_model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def make_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.rand(n, 6, generator=g) * 0.3
    x[torch.arange(n), 2 * y] += 0.8  # class = which pair of features is bright
    return x, y


X, Y = make_data(40, 0)
XT, YT = make_data(15, 1)


class GoldenBackend:
    """The golden model as the link device model's network (docs/ports.md semantics)."""

    def __init__(self, golden: GoldenModel) -> None:
        self.g = golden
        self._seen = 0

    def push(self, x: Sequence[int], label: int, train: bool) -> None:
        self.g.submit(torch.tensor(list(x), dtype=torch.int64), label, train)

    def pop_results(self) -> list[Result]:
        out = [Result(r.sample, r.pred, r.loss_raw, r.train) for r in self.g.results[self._seen :]]
        self._seen = len(self.g.results)
        return out

    def flush(self) -> None:
        self.g.flush()

    def wacc(self, write: bool, stage: int, kind: int, row: int, col: int, data: int) -> int:
        eng = self.g.stages[stage]
        mem = {0: "w", 1: "u", 2: "w_prev"}[kind]
        if write:
            t = getattr(eng, mem).clone()
            t[row, col] = data
            setattr(eng, mem, t)
        return int(getattr(eng, mem)[row, col])

    def counters(self) -> tuple[int, int, Sequence[int]]:
        return self.g.samples_applied, self.g.ticks, self.g.stage_saturations


@contextlib.contextmanager
def serve_device(plan: Plan, golden: GoldenModel) -> Iterator[str]:
    """A TCP server on 127.0.0.1 for one connection, running
    LinkDeviceModel(GoldenBackend(golden)) for ``plan``; yields its ``tcp://`` URL."""
    dev = LinkDeviceModel(LinkParams.from_plan(plan), GoldenBackend(golden))
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(65536):
                dev.receive(data)
                conn.sendall(dev.transmit())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"tcp://127.0.0.1:{port}"
    finally:
        srv.close()
        t.join(timeout=5)


@pytest.fixture
def tcp_device() -> Iterator[tuple[str, GoldenModel]]:
    """:func:`serve_device` for PLAN; the golden model starts from *other* weights (seed 99),
    so the host must write its own."""
    torch.manual_seed(99)
    other = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    golden = GoldenModel(PLAN, other)
    with serve_device(PLAN, golden) as url:
        yield url, golden


def test_golden_target_matches_the_golden_model():
    with open(PLAN, "golden", model=make_model()) as dev:
        rep = dev.train(X, Y, epochs=2)
        acc = dev.evaluate(XT, YT)
        ref = GoldenModel(PLAN, make_model())
        ref.train(X, Y, epochs=2)
        assert acc == ref.evaluate(XT, YT)
        assert dev.memories()["0"]["w"].equal(ref.memories()["0"]["w"])
        assert rep.samples == 80 and rep.epochs == 2 and dev.epochs_trained == 2
        # online accuracy/loss come from the 80 training results, in streaming order
        assert rep.accuracy is not None and 0.0 <= rep.accuracy <= 1.0 and rep.loss > 0
        c = dev.counters()
        assert c["samples_trained"] == 80 == dev.samples_trained
        assert c["ticks"] == ref.ticks and c["saturations"] == ref.stage_saturations
        assert dev.retransmits == 0


def test_reference_target_matches_the_reference_trainer():
    model = make_model()
    with open(PLAN, "reference", model=model) as dev:
        dev.train(X, Y, epochs=2)
        ref = ReferenceTrainer(make_model(), dev.config, plan=PLAN, profile=False)
        ref.train(X, Y, epochs=2)
        assert torch.equal(dev.predict(XT), ref.predict(XT))
        sd = dev.state_dict()
        for k, v in ref.state_dict().items():
            assert torch.equal(sd[k], v)
        assert dev.counters()["samples_trained"] == 80
        # load_state_dict replaces the weights exactly (float target: no quantisation)
        new = {k: v * 0.5 for k, v in sd.items()}
        dev.load_state_dict(new)
        assert all(torch.equal(dev.state_dict()[k], new[k]) for k in new)


def test_golden_state_dict_round_trip_is_exact_and_loads_into_the_module():
    model = make_model()
    with open(PLAN, "golden", model=model) as dev:
        dev.train(X, Y)
        before = dev.memories()
        sd = dev.state_dict()
        model.load_state_dict(sd)  # strict: exactly the module's keys and shapes
        dev.load_state_dict(sd)
        after = dev.memories()
        for name in before:
            assert torch.equal(before[name]["w"], after[name]["w"])
            assert torch.equal(before[name]["u"], after[name]["u"])  # velocities kept


def test_tcp_target_starts_from_the_model_and_matches_golden(tcp_device):
    url, served = tcp_device
    model = make_model()
    with open(PLAN, url, model=model, shadow=True) as dev:
        assert dev.is_link
        # the device now holds the model's weights, quantised as the golden model does
        assert torch.equal(
            served.memories()["0"]["w"], GoldenModel(PLAN, model).memories()["0"]["w"]
        )
        rep = dev.train(X, Y, epochs=2)
        acc = dev.evaluate(XT, YT)
        v = dev.verify()
        assert v.bit_exact, v.mismatches
        assert v.results == 80 + 15 and v.memories == 2 * (5 * 7 + 3 * 6)
        c = dev.counters()
        assert c["samples_trained"] == rep.samples == 80
        assert c["accepted"] == 95 and c["bad_crc"] == 0
        ref = GoldenModel(PLAN, make_model())
        ref.train(X, Y, epochs=2)
        assert acc == ref.evaluate(XT, YT)
        sd = dev.state_dict()
        assert all(torch.equal(sd[k], v) for k, v in ref.state_dict().items())
        mem = dev.memories()
        dev.load_state_dict(sd)  # exact round trip through the fixed-point formats
        back = dev.memories()
        assert all(torch.equal(mem[n]["w"], back[n]["w"]) for n in mem)
        assert dev.verify().bit_exact  # the shadow loaded the same state
    assert dev.retransmits == 0


def test_open_errors():
    with pytest.raises(DeviceError, match="unknown target 'fpga'"):
        open(PLAN, "fpga", model=make_model())
    with pytest.raises(DeviceError, match="needs the model"):
        open(PLAN, "golden")
    with pytest.raises(TransportError, match="give host and port"):
        open(PLAN, "tcp://localhost", model=make_model())
    with open(PLAN, "golden", model=make_model()) as dev:
        with pytest.raises(DeviceError, match=r"shape \(2, 4\)"):
            dev.predict(torch.zeros(2, 4))
        with pytest.raises(DeviceError, match=r"labels lie in \[0, 3\]"):
            dev.train(X[:2], torch.tensor([0, 3]))
        with pytest.raises(DeviceError, match="verify\\(\\) needs a golden shadow"):
            dev.verify()
        with pytest.raises(DeviceError, match="lacks '0.bias'"):
            dev.load_state_dict({"0.weight": torch.zeros(5, 6)})
    with pytest.raises(DeviceError, match="closed"):
        dev.predict(XT)


def test_board_option_opens_the_plan_the_board_was_built_from():
    """A board runs the plan ``pipetrain build --board`` fitted to it: ``open(model, url)``
    compiles another plan and is refused at HELLO; ``board=`` compiles the board's plan."""
    from pipetrain.compiler.targets import BOARDS
    from pipetrain.data import load_digits
    from pipetrain.host.client import PlanMismatchError
    from pipetrain.host.flow import compile_design

    built = compile_design("mlp-digits", board=BOARDS["icebreaker"])  # the bitstream's plan
    ds = load_digits()
    with serve_device(built.plan, GoldenModel(built.plan, built.model)) as url:
        with pytest.raises(
            PlanMismatchError, match=f"device was built from plan {built.plan.hash}"
        ):
            open("mlp-digits", url)
    golden = GoldenModel(built.plan, built.model)
    with serve_device(built.plan, golden) as url:
        with open("mlp-digits", url, board="icebreaker", shadow=True) as dev:
            assert dev.plan.hash == built.plan.hash
            dev.train(ds.x_train[:16], ds.y_train[:16])
            v = dev.verify()
            assert v.bit_exact and v.results == 16, v.mismatches
    with pytest.raises(DeviceError, match="board= fits the plan while compiling"):
        open(PLAN, "golden", model=make_model(), board="icebreaker")


def test_numpy_inputs_and_the_host_package_export():
    import pipetrain.host as host

    assert host.open is open and issubclass(host.Device, object) and Device is host.Device
    with open(PLAN, "golden", model=make_model()) as dev:
        dev.train(X.numpy(), Y.numpy())
        assert dev.predict(XT.numpy()).dtype == torch.int64
        assert np.isclose(dev.evaluate(XT.numpy(), YT.numpy()), dev.evaluate(XT, YT))
