"""The on-chip training set in the board fit (docs/protocol.md §2, docs/boards.md): its memories
are part of the board shell, so ``--lanes auto`` leaves room for them; a set that cannot fit is
one error naming its size and the block RAMs; without the option nothing changes."""

from __future__ import annotations

import pytest
from pipetrain.compiler.fit import FitError
from pipetrain.hdl.link_onchip import onchip_memory_bits
from pipetrain.hdl.shell import board_shell
from pipetrain.host.flow import compile_design
from pipetrain.protocol.wire import LinkParams

DIGITS_TRAIN = 1437  # samples of the digits training split


def test_ulx3s_holds_the_digits_training_set_at_the_auto_lanes():
    r = compile_design("mlp-digits", board="ulx3s-85f", onchip_samples=DIGITS_TRAIN)
    plain = compile_design("mlp-digits", board="ulx3s-85f")
    assert [s.lanes for s in r.plan.stages] == [s.lanes for s in plain.plan.stages]
    assert r.plan.hash == plain.plan.hash  # a build option, not part of the plan
    rows = r.fit["bram_blocks"]
    assert rows["needed"] <= rows["available"] == 208
    # 1437·64 words of 16 bits in 18-Kib blocks (1024 × 18 each): ≥ 90 blocks more than without
    assert rows["needed"] - plain.fit["bram_blocks"]["needed"] >= DIGITS_TRAIN * 64 // 1024
    mems = {m[0].rsplit("/", 1)[-1]: m for m in board_shell(r.plan, DIGITS_TRAIN).memories}
    # the features in banks of one block each (1024 × 16: hdl/link_onchip.py bank_words)
    banks = [m for name, m in mems.items() if name.startswith("data")]
    assert len(banks) == 90 and {m[2] for m in banks} == {16}
    assert sum(m[1] for m in banks) == DIGITS_TRAIN * 64 and max(m[1] for m in banks) == 1024
    assert mems["labels"][1:3] == (1437, 4)
    assert onchip_memory_bits(r.plan, DIGITS_TRAIN) == DIGITS_TRAIN * (64 * 16 + 4)
    # an epoch's records, no more, back to back: 1437 × 11 bytes (8 blocks of 2048 × 9, not
    # the 16 of 2048 16-byte slots)
    assert LinkParams.from_plan(r.plan, onchip_samples=DIGITS_TRAIN).result_depth == DIGITS_TRAIN
    (buf,) = [m for m in board_shell(r.plan, DIGITS_TRAIN).memories if "results/buffer" in m[0]]
    assert buf[1:3] == (DIGITS_TRAIN * 11, 8)


def test_ulx3s_holds_the_set_beside_wide_at_its_filled_lanes():
    """mlp-digits-wide's 10×2,22,2 (440 cycles, 108 DP16KD) and the set: 208 of 208 blocks with
    the packed result buffer (216 with 2048 16-byte slots: the fit fell back to 3×3,10,1,
    957 cycles)."""
    r = compile_design("mlp-digits-wide", board="ulx3s-85f", onchip_samples=DIGITS_TRAIN)
    plain = compile_design("mlp-digits-wide", board="ulx3s-85f")
    assert [(s.lanes, s.column_lanes) for s in r.plan.stages] == [(10, 2), (22, 1), (2, 1)]
    assert r.plan.hash == plain.plan.hash
    assert r.fit["bram_blocks"] == {"needed": 208, "available": 208}


def test_icebreaker_refuses_the_set_and_builds_without_it():
    want = r"set of 1437 samples \(1,109,364 bits\) does not fit icebreaker.*30 on the board"
    with pytest.raises(FitError, match=want):
        compile_design("mlp-digits", board="icebreaker", onchip_samples=DIGITS_TRAIN)
    plain = compile_design("mlp-digits", board="icebreaker")
    assert plain.fit["logic_cells"]["needed"] <= plain.fit["logic_cells"]["available"]
    assert not any("onchip" in m[0] for m in board_shell(plain.plan).memories)


def test_train_cli_on_chip_data_golden_and_refusals(tmp_path):
    """`train --on-chip-data` on the golden target: the run's epoch summaries in the JSON, the
    online accuracy their correct counts; with checkpoints it is one Error line."""
    import json

    from click.testing import CliRunner
    from pipetrain.host.cli import cli
    from test_host_sim import make_npz

    npz = str(make_npz(tmp_path / "bands.npz"))
    args = ["train", "mlp", "--hidden", "8", "--data", npz, "--target", "golden"]
    res = CliRunner().invoke(cli, [*args, "--epochs", "3", "--on-chip-data", "--json", "-"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout[res.stdout.index("{") :])
    sums = rep["epoch_summaries"]
    assert rep["on_chip_data"] and len(sums) == 3 and all(s["loss_sum"] > 0 for s in sums)
    assert rep["online_accuracy"] == sum(s["correct"] for s in sums) / (3 * 80)
    bad = CliRunner().invoke(cli, [*args, "--on-chip-data", "--checkpoint-every", "10"])
    assert bad.exit_code == 2 and "no checkpoints" in bad.output and "Traceback" not in bad.output
