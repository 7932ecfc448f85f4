"""The float reference trainer's convolution stages (sim/reference_conv.py): exact batch-1 SGD
under the sequential schedule (torch.optim.SGD on the user's module), the tick-by-tick PB
simulator bit for bit with the version queue, and Spike Compensation reaching the stage."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conv_nets import cnn as _cnn
from pipetrain.compiler.config import TrainConfig
from pipetrain.sim.reference import ReferenceTrainer
from pipetrain.sim.reference_conv import one_thread
from pipetrain.sim.reference_tick import PBTickSimulator

GEOMETRIES = [
    ("conv2d", "max", 1, 1, True),
    ("conv2d", "avg", 2, 1, False),
    ("conv1d", "max", 2, 1, True),
    ("conv1d", "none", 1, 0, False),
]


@pytest.mark.parametrize("geo", GEOMETRIES, ids=lambda g: "-".join(map(str, g)))
def test_sequential_conv_reproduces_torch_sgd(geo):
    """Momentum and weight decay, 8 samples one at a time: every parameter within 1e-6 of
    torch.optim.SGD on the module itself (float32 rounding of the same sums in another order;
    measured ≤ 6e-8)."""
    cfg = TrainConfig(lr=0.1, momentum=0.9, weight_decay=1e-3, schedule="sequential")
    model = _cnn(*geo)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(8, math.prod(model.input_shape), generator=gen)
    y = torch.randint(0, 4, (8,), generator=gen)
    ref = ReferenceTrainer(model, cfg)
    twin = _cnn(*geo)
    opt = torch.optim.SGD(twin.parameters(), lr=cfg.lr1, momentum=cfg.momentum1, weight_decay=1e-3)
    with one_thread():  # batch-1 tensors: threads only cost (sim/reference_conv.py)
        for i in range(8):
            ref.train_sample(x[i], y[i])
            opt.zero_grad()
            F.cross_entropy(twin(x[i : i + 1].view(1, *model.input_shape)), y[i : i + 1]).backward()
            opt.step()
    got = ref.state_dict()
    assert got.keys() == twin.state_dict().keys()
    for k, v in twin.state_dict().items():
        assert float((got[k] - v).abs().max()) < 1e-6, k
    moved = max(float((got[k] - v).abs().max()) for k, v in _cnn(*geo).state_dict().items())
    assert moved > 1e-2  # it trained
    pred = ref.predict(x)
    assert torch.equal(pred, twin(x.view(8, *model.input_shape)).argmax(1))


@pytest.mark.parametrize("mitigation", ["none", "sc+lwp"])
def test_tick_simulator_matches_version_queue_for_conv(mitigation):
    """PB with delays 5, 3, 1: the literal tick schedule and the version queue give identical
    weights (torch.equal), with and without SC + LWP."""
    cfg = TrainConfig(lr=0.05, momentum=0.9, mitigation=mitigation)
    gen = torch.Generator().manual_seed(2)
    x = torch.rand(12, 2 * 6 * 7, generator=gen)
    y = torch.randint(0, 4, (12,), generator=gen)
    a = ReferenceTrainer(_cnn(*GEOMETRIES[0]), cfg, profile=False)
    b = PBTickSimulator(_cnn(*GEOMETRIES[0]), cfg)
    assert a.delays == b.delays == (5, 3, 1)
    a.train(x, y)
    b.train(x, y)
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["0.weight"], _cnn(*GEOMETRIES[0]).state_dict()["0.weight"])


def test_pb_delay_changes_the_conv_trajectory():
    """PB (stale forward weights) and SC change a convolution stage's weights against the
    sequential schedule on the same stream: the delays reach the conv stages."""
    gen = torch.Generator().manual_seed(4)
    x = torch.rand(10, 2 * 6 * 7, generator=gen)
    y = torch.randint(0, 4, (10,), generator=gen)
    out = {}
    for name, cfg in {
        "seq": TrainConfig(lr=0.05, schedule="sequential"),
        "pb": TrainConfig(lr=0.05),
        "pb+sc": TrainConfig(lr=0.05, mitigation="sc"),
    }.items():
        r = ReferenceTrainer(_cnn(*GEOMETRIES[1]), cfg)
        r.train(x, y)
        out[name] = r.state_dict()["0.weight"]
    assert not torch.allclose(out["seq"], out["pb"], atol=1e-6)
    assert not torch.allclose(out["pb"], out["pb+sc"], atol=1e-6)
