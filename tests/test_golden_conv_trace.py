"""The golden model's per-tick traces of convolution stages (``StageTrace``, docs/numerics.md §9):
x is the whole input feature map (C_in·Πin values, not the weight matrix's T taps), z is the
convolution recomputed independently by ``torch.nn.functional.conv*d`` from the weights the
trace held at the end of the previous tick, mask/argmax/a follow from z and the pooling, the
error g and input gradient gin chain between neighbouring stages one tick apart, and the w/u
matrices of the last tick are the model's memories. The RTL comparison (sim/tb/network.py)
reads these traces, so a wrong slice would name the wrong values in a mismatch.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conv_nets import cnn
from pipetrain.compiler.build import build_plan
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.frontend import trace
from pipetrain.sim.fixed import rhu, sat
from pipetrain.sim.golden import GoldenModel
from pipetrain.sim.golden_conv import pool_windows


@pytest.mark.parametrize(
    ("kind", "pool", "stride", "padding", "bias"),
    [("conv2d", "max", 1, 1, True), ("conv1d", "avg", 2, 0, False)],
)
def test_conv_stage_traces_hold_feature_maps_and_chain(kind, pool, stride, padding, bias):
    model = cnn(kind, pool, stride, padding, bias)
    plan = build_plan(trace(model, "t"), TrainConfig(lr=0.05, mitigation="none"), lanes=(2, 1, 2))
    g = GoldenModel(plan, model, trace=True)
    gen = torch.Generator().manual_seed(2)
    n = 6
    xq = g.quantise_input(torch.rand(n, plan.in_features, generator=gen))
    ys = torch.randint(0, 3, (n,), generator=gen)
    w_now = [e.w.clone() for e in g.stages]  # the weights a forward reads (no mitigation)
    for i in range(n):
        g.submit(xq[i], int(ys[i]), True)
    g.flush()
    seen = {"x1": 0, "z": 0, "chain_x": 0, "chain_g": 0, "argmax": 0}
    for k, tr in enumerate(g.traces):
        for s, st_tr in enumerate(tr.stages[:2]):  # the two convolution stages
            st = plan.stages[s]
            geo = st.conv
            assert geo is not None
            if st_tr.fwd_sample is not None:
                x = st_tr.x
                assert x.shape == (geo.in_values,)  # the whole feature map, not T taps
                if s == 0:
                    assert torch.equal(x, xq[st_tr.fwd_sample])
                    seen["x1"] += 1
                else:  # the previous stage's output one tick earlier
                    prev = g.traces[k - 1].stages[0]
                    assert prev.fwd_sample == st_tr.fwd_sample
                    assert torch.equal(x, prev.a)
                    seen["chain_x"] += 1
                # z recomputed by torch's convolution (float64 holds these sums exactly)
                f = st.formats
                w = rhu(w_now[s], st.weight_shift)  # the MAC's weight operand (numerics §3.2)
                wk = w[:, : geo.taps].reshape(geo.weight_shape).double()
                b = w[:, geo.taps].double() * 2.0**f.x.frac if geo.bias else None
                conv = F.conv1d if geo.dims == 1 else F.conv2d
                acc = conv(
                    x.reshape(1, *geo.in_shape).double(),
                    wk,
                    b,
                    stride=geo.stride,
                    padding=geo.padding,
                )
                acc = acc.round().to(torch.int64).reshape(-1)
                z_ref, _ = sat(rhu(acc, st.mac_w_frac + f.x.frac - f.y.frac), f.y)
                assert torch.equal(st_tr.z, z_ref)
                seen["z"] += 1
                assert st_tr.mask.shape == (geo.out_channels, geo.positions)
                assert torch.equal(st_tr.mask.reshape(-1), z_ref > 0)
                act = g.stages[s].activate(z_ref, z_ref > 0)  # numerics §3.4, tested on its own
                act = act.reshape(geo.out_channels, geo.positions)
                windows = act[:, pool_windows(geo)]  # (C_out, P′, window)
                assert st_tr.a.shape == (geo.out_values,)
                if geo.pool == "max":
                    assert st_tr.argmax.shape == (geo.out_channels, geo.pooled_positions)
                    picked = windows.gather(-1, st_tr.argmax[..., None])[..., 0]
                    assert torch.equal(picked, windows.max(dim=-1).values)
                    assert torch.equal(st_tr.a, picked.reshape(-1))
                    seen["argmax"] += 1
                elif geo.pool == "avg":
                    assert st_tr.argmax is None
                    mean, _ = sat(rhu(windows.sum(-1) * geo.pool_scale, geo.pool_shift), f.y)
                    assert torch.equal(st_tr.a, mean.reshape(-1))
                else:
                    assert st_tr.argmax is None
                    assert torch.equal(st_tr.a, act.reshape(-1))
            if st_tr.bwd_sample is not None:
                assert st_tr.delta.shape == (geo.out_channels, geo.positions)
                assert st_tr.g.shape == (geo.out_values,)
                if s == 1:  # stage 2's input gradient is stage 1's error one tick later
                    assert st_tr.gin.shape == (geo.in_values,)
                    nxt = g.traces[k + 1].stages[0]
                    assert nxt.bwd_sample == st_tr.bwd_sample
                    assert torch.equal(nxt.g, st_tr.gin)
                    seen["chain_g"] += 1
            assert st_tr.w.shape == st_tr.u.shape == (geo.out_channels, geo.taps + 1)
        w_now = [st_tr.w.clone() for st_tr in tr.stages]
    mem = g.memories()
    for s, st in enumerate(plan.stages):
        assert torch.equal(g.traces[-1].stages[s].w, mem[st.name]["w"])
    assert seen["x1"] == seen["chain_x"] == seen["chain_g"] == n
    assert seen["z"] == 2 * n
    assert seen["argmax"] == (n if pool == "max" else 0)  # stage 2 has no pooling
