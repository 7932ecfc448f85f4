"""benchmarks/loss_unit_timing.py: a plan's loss unit timed alone (Yosys and nextpnr out of
context, docs/boards.md §3): the divider override and the critical-path split it prints."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pipetrain.compiler.loss_unit import divider_cycles
from tiny_net import tiny

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import loss_unit_timing as lut  # noqa: E402

#: Three steps of a nextpnr critical-path report (its own format, names shortened).
REPORT = """Info: Critical path report for clock 'clk' (posedge -> posedge):
Info:       type curr  total name
Info:   clk-to-q  0.52  0.52 Source lu.rem_TRELLIS_FF_Q.Q
Info:    routing  1.46  1.99 Net lu.div_e15_a (22,17) -> (26,15)
Info:      logic  0.45  2.43 Source lu.div_e15_b.FCO
Info:    routing  1.22  3.65 Net lu.rem_d
Info:      setup  0.00  3.65 Source lu.rem_TRELLIS_FF_Q_20.DI
Info: Critical path report for clock 'clk' (posedge -> posedge):
Info:      logic  9.99  9.99 Source a later report
"""


def test_critical_split_sums_the_first_report():
    """Clock-to-q counts as logic, setup as neither; a second report is not added."""
    got = lut.critical_split(REPORT)
    assert got == {"logic": pytest.approx(0.97), "routing": pytest.approx(2.68), "levels": 1}
    assert lut.critical_split("no timing here") == {"logic": 0.0, "routing": 0.0, "levels": 0}


def test_with_div_bits_moves_the_cycle_count_by_the_divider():
    """The tiny net's cross-entropy loss unit at k = 1 … 4: only the divider's cycles change
    (``divider_cycles``); k = 5 and an MSE loss unit are refused with the reason."""
    plan, _, _ = tiny()
    lu = plan.loss
    base = lu.cycles - divider_cycles(lu.recip_frac, lu.div_bits)
    for k in range(1, 5):
        got = lut.with_div_bits(lu, k)
        assert got.div_bits == k
        assert got.cycles == base + divider_cycles(lu.recip_frac, k)
    with pytest.raises(ValueError, match="1 … 4 bits a cycle"):
        lut.with_div_bits(lu, 5)
    mse, _, _ = tiny(loss="mse")
    with pytest.raises(ValueError, match="no divider"):
        lut.with_div_bits(mse.loss, 3)
