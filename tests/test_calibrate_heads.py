"""Format calibration of auxiliary heads (local / interlocking learning): the float reference
profiles the head stages like the main ones, the format chooser gives a head its own ``y``,
``d``, ``w`` and ``u`` formats (the attach stage's error covers the head's input gradient), and
the calibration's golden passes run for every strategy (docs/architecture.md §4.2).

Regression: the heads took the last main stage's formats and no golden pass ran for them; on
``mlp-digits-deep8`` with interlocking d = 1 the heads' weights outgrew stage 8's ``w`` format
(±2) and clamped 6,123 times in 10 golden epochs (benchmarks/interlocking.py).
"""

from __future__ import annotations

import json

import pytest
import torch
from pipetrain.compiler.build import build_plan
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.formats import DATA_BITS, WEIGHT_BITS, format_for_range, formats_from_ranges
from pipetrain.compiler.ir import LayerIR, NetworkIR
from pipetrain.compiler.plan import QFormat
from pipetrain.data import Dataset
from pipetrain.host.flow import compile_design
from pipetrain.sim.golden import GoldenModel
from pipetrain.sim.reference import ReferenceTrainer
from torch import nn

IR4 = NetworkIR(
    "mlp4",
    8,
    tuple(
        LayerIR(str(2 * i), a, b, "relu" if i < 3 else "identity")
        for i, (a, b) in enumerate(zip([8, 6, 6, 6, 3], [6, 6, 6, 3], strict=False))
    ),
)


def test_reference_profiles_a_head_of_one_known_step() -> None:
    """Local learning, 2 → 3 → 2 with a head after stage 1, one sequential step (lr 0.1, no
    momentum): the head's ranges are its input (stage 1's ReLU output), its logits, its loss
    error, its input gradient (with the weights before the step), its weights and its step; stage
    1's error is the head's input gradient (L_1 alone updates block 1)."""
    torch.manual_seed(0)
    l1, l2 = nn.Linear(2, 3), nn.Linear(3, 2)
    cfg = TrainConfig(schedule="sequential", lr=0.1, momentum=0.0, strategy="local", blocks=(1,))
    tr = ReferenceTrainer(nn.Sequential(l1, nn.ReLU(), l2), cfg)
    (wh,) = tr.head_weights()  # (2, 4): the head 3 → 2, bias column last
    x = torch.tensor([0.7, -0.4])
    tr.train_sample(x, 1)
    a1 = torch.relu(l1.weight.detach() @ x + l1.bias.detach())
    zh = wh[:, :3] @ a1 + wh[:, 3]
    dh = torch.softmax(zh, 0) - torch.tensor([0.0, 1.0])
    gin = wh[:, :3].T @ dh
    new_wh = wh - 0.1 * torch.outer(dh, torch.cat((a1, torch.ones(1))))
    r = tr.ranges
    assert set(r) == {1, 2, 3}
    h = r[3]
    assert h["x"] == pytest.approx(float(a1.abs().max()))
    assert h["y"] == pytest.approx(float(zh.abs().max()))
    assert h["d"] == pytest.approx(float(dh.abs().max()))
    assert h["gin"] == pytest.approx(float(gin.abs().max()))
    # w: the largest weight seen, from the initial weights on
    assert h["w"] == pytest.approx(max(float(wh.abs().max()), float(new_wh.abs().max())))
    assert h["u"] == pytest.approx(float((new_wh - wh).abs().max()))  # η·v = the step
    assert r[1]["d"] == pytest.approx(h["gin"])


def _ranges(head: dict[str, float] | None) -> dict[int, dict[str, float]]:
    main = {"x": 1.0, "y": 3.0, "d": 0.5, "gin": 0.5, "w": 1.0, "u": 0.01}
    out = {s: dict(main) for s in range(1, 5)}
    if head is not None:
        out[5] = head
    return out


def test_a_head_gets_formats_from_its_own_ranges() -> None:
    """Ranges with a head entry (stage 5, the head of block 1 after stage 2): its weights
    (3.5: Q3.20 with the 2× headroom), logits (40: Q7.8) and error (0.9: Q1.14) set its
    formats, its input gradient (6.0) widens the attach stage's error (Q4.11); without the
    entry the head keeps the last main stage's formats. The plan builds with them."""
    cfg = TrainConfig(strategy="local", blocks=(2,))
    head = {"x": 3.0, "y": 40.0, "d": 0.9, "gin": 6.0, "w": 3.5, "u": 0.02}
    fs = formats_from_ranges(_ranges(head), cfg, IR4)
    assert fs.head_w == (QFormat(WEIGHT_BITS, 20),) and fs.head_u == (QFormat(WEIGHT_BITS, 20),)
    assert fs.head_y == (QFormat(DATA_BITS, 8),)
    assert fs.head_d == (QFormat(DATA_BITS, 14),)
    assert fs.d[1] == QFormat(DATA_BITS, 11)  # stage 2: max(0.5, the head's 6.0)
    assert fs.d[0] == format_for_range(0.5, DATA_BITS)  # the other stages keep their own
    plan = build_plan(IR4, cfg, fs)
    hf = plan.stages[4].formats
    assert (hf.w, hf.y, hf.d, hf.gin) == (QFormat(24, 20), QFormat(16, 8), QFormat(16, 14), fs.d[1])
    old = formats_from_ranges(_ranges(None), cfg, IR4)
    assert old.head_w == (old.w[-1],) and old.head_d == (old.d[-1],)
    assert old.head_y == (old.logits,)


def _blobs(n: int = 600, features: int = 8, classes: int = 3) -> Dataset:
    """A separable Gaussian-blob set (seeded): class c centred at a fixed random mean."""
    g = torch.Generator().manual_seed(5)
    centres = torch.randn(classes, features, generator=g) * 1.5
    y = torch.arange(n) % classes
    x = centres[y] + 0.8 * torch.randn(n, features, generator=g)
    k = n * 3 // 4
    return Dataset("blobs", x[:k], y[:k], x[k:], y[k:])


def test_calibrated_heads_replay_without_a_clamp() -> None:
    """The compile flow's calibration (float run + golden passes) with heads (interlocking
    d = 1, K = 3: two heads and a pass-through stream): the final plan's training run on the
    calibration samples clamps nothing in any stage or loss unit, heads included (the head
    stages were profiled: their ranges are in the plan)."""
    torch.manual_seed(2)
    net = nn.Sequential(
        nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 3)
    )  # fmt: skip
    ds = _blobs(240)
    over = {"epochs": 1, "seed": 1, "lr": 0.01, "strategy": "interlocking", "blocks": (1, 2)}
    r = compile_design(net, data=ds, config_overrides=over, writers=())
    heads = [st for st in r.plan.stages if st.role == "head"]
    assert heads and all(st.calibrated.get("w", 0.0) > 0.0 for st in heads)
    g = GoldenModel(r.plan, r.model, r.config)
    g.train(ds.x_train, ds.y_train, epochs=1)
    assert g.saturations == 0, g.tensor_saturations


def test_interlocking_benchmark_table_and_jsonl(tmp_path) -> None:
    """benchmarks/interlocking.py: the table's accuracy is mean ± sample sd over the seeds
    (0.9, 0.8 → 0.850 ± 0.071), saturations the mean per run, the RTL cell the measured
    spacing or why there is none; ``--from-jsonl`` re-renders the runs a file holds (the last
    record of a setting and seed wins)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import interlocking as bench

    hw = {"max_delay": 9, "stash_bits": 45978, "memory_bits": 585916, "multipliers": 105}
    recs = [
        {"setting": "local", "seed": 0, "test_accuracy": 0.5, "saturations": 0, **hw},
        {"setting": "local", "seed": 0, "test_accuracy": 0.9, "saturations": 10, **hw},
        {"setting": "local", "seed": 1, "test_accuracy": 0.8, "saturations": 30, **hw},
        {"rtl_setting": "local", "cycles_per_sample": 527.0, "bit_exact": True},
        {"setting": "interlocking d=1 sum", "seed": 0, "test_accuracy": 0.75, **hw},
        {"rtl_setting": "interlocking d=1 sum", "rtl": "the HDL builds the only rule"},
    ]
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    rows, rtl = bench.read_jsonl(str(path))
    assert list(rows) == ["local", "interlocking d=1 sum"]  # SETTINGS order
    text = bench.table(rows, [0, 1], 10, 0.002, rtl)
    lines = {ln.split(" | ")[0]: ln for ln in text.splitlines() if ln.startswith("| ")}
    assert "| 0.850 ± 0.071 | 20 | 9 | 45,978 | 585,916 | 105 | n/a | 527.0 |" in lines["| local"]
    assert lines["| interlocking d=1 sum"].endswith("| not in the HDL |")
    out = tmp_path / "t.md"
    assert bench.main(["--from-jsonl", str(path), "--out", str(out)]) == 0
    assert out.read_text() == text
