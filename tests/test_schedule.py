"""Scheduling rules: delays, update maps, SC coefficients and batch-1 scaling."""

import pytest
from pipetrain.compiler.schedule import (
    batch1_scaling,
    naive_overshoot,
    pb_delay,
    spike_compensation,
    stage_layout,
    update_losses,
)


def test_pb_delay_is_2_s_minus_s_plus_1():
    assert [pb_delay(5, s) for s in range(1, 6)] == [9, 7, 5, 3, 1]
    with pytest.raises(ValueError, match="outside 1..5"):
        pb_delay(5, 6)


# docs/architecture.md §2.4 table, K = 5: for each loss, the blocks whose weights it changes.
TABLE = {
    ("global", 0): {5: [1, 2, 3, 4, 5]},
    ("local", 0): {1: [1], 2: [2], 3: [3], 4: [4], 5: [5]},
    ("interlocking", 1): {2: [1], 3: [2], 4: [3], 5: [4, 5]},
    ("interlocking", 2): {3: [1], 4: [2], 5: [3, 4, 5]},
    ("interlocking", 4): {5: [1, 2, 3, 4, 5]},
}


@pytest.mark.parametrize("mode", list(TABLE))
def test_update_map_matches_design_table(mode):
    strategy, d = mode
    got: dict[int, list[int]] = {}
    for k in range(1, 6):
        for loss in update_losses(5, k, strategy, d):
            got.setdefault(loss, []).append(k)
    assert got == TABLE[mode]


def test_stage_layout_local_and_interlocking_delays():
    # 4 main stages, blocks end after stages 2 and 4 (K = 2), one-stage heads.
    glob = [r.delay for r in stage_layout(4)]
    assert glob == [7, 5, 3, 1]
    local = stage_layout(4, strategy="local", block_ends=[2])
    # stage 1 → end of block 1 (stage 2) + 1 head stage = 2 stages → 5; stage 2 → 3
    assert [r.delay for r in local] == [5, 3, 3, 1, 1]
    assert [r.head for r in local] == [False] * 4 + [True]
    inter = stage_layout(4, strategy="interlocking", block_ends=[2], distance=1)
    assert [r.delay for r in inter] == [7, 5, 3, 1, 1]
    seq = stage_layout(4, schedule="sequential")
    assert [r.delay for r in seq] == [0, 0, 0, 0]


def test_spike_compensation_coefficients():
    assert spike_compensation(0.9, 0) == (1.0, 0.0)
    assert spike_compensation(0.9, 1) == (0.9, 1.0)
    a, b = spike_compensation(0.9, 3)
    assert a == pytest.approx(0.729)
    assert b == pytest.approx((1 - 0.729) / 0.1)


def test_batch1_scaling_rule():
    lr1, m1 = batch1_scaling(0.1, 0.9, 128)
    assert m1 == pytest.approx(0.999177, abs=1e-6)
    assert lr1 == pytest.approx(0.1 / 128 * (1 - m1) / 0.1)
    assert naive_overshoot(0.9, 128) == pytest.approx(121.5, abs=0.5)
    # the effective step η/(1−m) per sample is preserved: η_ref/(B_ref (1−m_ref))
    assert lr1 / (1 - m1) == pytest.approx(0.1 / (128 * 0.1))
