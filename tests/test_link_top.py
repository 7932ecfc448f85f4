"""The link engine in front of the real ``NetworkTop(plan)`` (Amaranth simulation), driven by
``LinkClient``: a checkpoint written over the link, a few samples trained, results, weights and
counters equal to the golden model bit for bit."""

from __future__ import annotations

import random

import numpy as np
import torch
from amaranth import Elaboratable, Module
from amaranth.lib import wiring
from pipetrain.compiler.build import build_plan
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.ir import LayerIR, NetworkIR
from pipetrain.hdl.link import LinkEngine
from pipetrain.hdl.top import NetworkTop
from pipetrain.host.client import LinkClient, quantise_inputs
from pipetrain.host.transport import FaultyTransport, LoopbackTransport
from pipetrain.sim.golden import GoldenModel
from test_link import RX_TIMEOUT, EngineSim
from torch import nn


class LinkedTop(Elaboratable):
    """LinkEngine ↔ NetworkTop, connected as the board core does."""

    def __init__(self, plan) -> None:
        self.engine = LinkEngine(plan, rx_timeout=RX_TIMEOUT)
        self.top = NetworkTop(plan)

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.engine = self.engine
        m.submodules.top = self.top
        wiring.connect(m, self.engine.net, self.top)
        return m


def test_link_trains_real_network_top_like_golden():
    ir = NetworkIR("tiny", 4, (LayerIR("0", 4, 3, "relu"), LayerIR("2", 3, 2)))
    plan = build_plan(ir, TrainConfig(momentum=0.9, lr=0.05), lanes=[1, 2])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    golden = GoldenModel(plan, model)
    dut = LinkedTop(plan)
    sim = EngineSim(dut.engine, None, top=dut, seed=1, p_rx=0.8, p_tx=0.7)
    rng = random.Random(2)
    link = FaultyTransport(LoopbackTransport(sim), rng, p_corrupt=0.1, p_drop=0.05)
    cli = LinkClient(link, plan, max_retries=50)
    assert cli.hello().plan_hash == plan.hash
    cli.reset_counters()

    # checkpoint in: the golden model's initial memories, over the link
    mem = golden.memories()
    cli.write_weights([{k: v.numpy() for k, v in mem[st.name].items()} for st in plan.stages])

    n = 7
    xf = np.random.default_rng(3).uniform(-1.5, 1.5, size=(n, 4))
    ys = [int(v) for v in np.random.default_rng(4).integers(0, 2, size=n)]
    xq = quantise_inputs(xf, plan)
    assert torch.equal(golden.quantise_input(torch.tensor(xf)), torch.tensor(xq))
    res = cli.train(xq, ys)
    for x, y in zip(xq, ys, strict=True):
        golden.submit(torch.tensor(x), y, True)
    golden.flush()
    assert [(r.sample, r.pred, r.loss, r.train) for r in res] == [tuple(r) for r in golden.results]

    back = cli.read_weights()
    gm = golden.memories()
    for s, st in enumerate(plan.stages):
        for k in ("w", "u"):
            np.testing.assert_array_equal(back[s][k], gm[st.name][k].numpy())
    # training changed the weights (the comparison above is not of two untouched memories)
    assert not np.array_equal(back[0]["w"], mem[plan.stages[0].name]["w"].numpy())

    # inference after training: forward only, then a flush (golden: one batch, same ticks)
    xi = np.random.default_rng(5).uniform(-1.5, 1.5, size=(3, 4))
    yi = torch.tensor([1, 0, 1])
    inf = cli.infer(xi, yi.tolist())
    pred, loss_raw = golden.infer(torch.tensor(xi), yi)
    assert [r.sample for r in inf] == [n, n + 1, n + 2] and not any(r.train for r in inf)
    assert [r.pred for r in inf] == pred.tolist()
    assert [r.loss for r in inf] == loss_raw.tolist()

    c = cli.counters()
    assert c.samples_trained == n == golden.samples_trained == cli.train_samples_sent
    assert c.ticks == golden.ticks
    assert list(c.saturations) == golden.stage_saturations
