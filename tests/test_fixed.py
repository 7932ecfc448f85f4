"""Fixed-point primitives (docs/numerics.md §1) against hand-computed values."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from pipetrain.compiler.plan import QFormat
from pipetrain.sim.fixed import align, quantise, rhu, rne, rsr, sat, sat_int

Q8 = QFormat(8, 4)  # [-128, 127]


def t(*v):
    return torch.tensor(v, dtype=torch.int64)


def test_sat_clamps_and_counts():
    out, n = sat(t(-129, -128, 0, 127, 128, 10**12, -(10**12)), Q8)
    assert out.tolist() == [-128, -128, 0, 127, 127, 127, -128]
    assert int(n) == 4  # the edges −128 and 127 themselves are not clamps
    assert sat_int(-129, Q8) == (-128, 1) and sat_int(-128, Q8) == (-128, 0)
    assert sat_int(127, Q8) == (127, 0) and sat_int(300, Q8) == (127, 1)


def test_rhu_ties_go_up_and_negative_k_shifts_left():
    # values in units of 1/4 (k = 2): 2.5 → 3, −2.5 → −2, 1.25 → 1, −1.75 → −2
    assert rhu(t(10, -10, 5, -7), 2).tolist() == [3, -2, 1, -2]
    assert rhu(t(10, -10), 0).tolist() == [10, -10]
    assert rhu(t(3, -3), -2).tolist() == [12, -12]
    assert [rhu(v, 1) for v in (1, -1, 3, -3)] == [1, 0, 2, -1]  # python ints too
    # most negative value of a 62-bit sum: no overflow in int64
    assert rhu(t(-(2**61)), 3).tolist() == [-(2**58)]


def test_rne_ties_to_even():
    # k = 1: 0.5 → 0, 1.5 → 2, 2.5 → 2, −0.5 → 0, −1.5 → −2, −2.5 → −2, 2.75 not a tie
    assert rne(t(1, 3, 5, -1, -3, -5), 1).tolist() == [0, 2, 2, 0, -2, -2]
    # k = 2: 0.75 → 1, 0.25 → 0, −0.75 → −1, −0.25 → 0, 1.5 → 2, −1.5 → −2
    assert rne(t(3, 1, -3, -1, 6, -6), 2).tolist() == [1, 0, -1, 0, 2, -2]
    assert rne(t(7, -7), 0).tolist() == [7, -7]
    # −2^60 − 0.5 lies between −2^60 − 1 (odd) and −2^60 (even): the tie goes to −2^60
    assert rne(-(2**61) - 1, 1) == -(2**60)
    assert rne(t(-(2**61) - 1), 1).tolist() == [-(2**60)]


def test_rsr_k_below_equal_above_R_and_zero():
    R = 16
    # k < R: adds r >> (R − k). v = 5 (1.25 in units of 1/4), k = 2: r >> 14 ∈ {0..3}
    assert [rsr(5, 2, r, R) for r in (0, 0x3FFF, 0x4000, 0xBFFF, 0xC000, 0xFFFF)] == [
        1,
        1,
        1,
        1,
        2,
        2,
    ]  # rounds up iff (r >> 14) + 1 ≥ 4, i.e. with probability 1/4 = frac(1.25)
    # k = R: adds r itself
    assert rsr(0x18000, 16, 0x7FFF, R) == 1 and rsr(0x18000, 16, 0x8000, R) == 2
    # k > R: adds r << (k − R); k = 18, v = 3·2^16 (0.75): up iff (r << 2) + v ≥ 2^18
    assert rsr(3 << 16, 18, 0x3FFF, R) == 0 and rsr(3 << 16, 18, 0x4000, R) == 1
    # k = 0: unchanged whatever r is
    assert rsr(-7, 0, 0xFFFF, R) == -7
    # negative values floor: −1.25 (−5/4) → −2 or −1
    assert rsr(-5, 2, 0, R) == -2 and rsr(-5, 2, 0xFFFF, R) == -1
    # tensors with tensor randoms
    assert rsr(t(5, 5), 2, t(0, 0xC000), R).tolist() == [1, 2]


def test_align_is_exact_and_refuses_to_drop_bits():
    assert align(t(-3, 5), 4, 7).tolist() == [-24, 40]
    assert align(9, 3, 3) == 9
    with pytest.raises(ValueError, match="drop bits"):
        align(1, 5, 4)


def test_quantise_round_half_even_and_saturate():
    fmt = QFormat(8, 2)  # step 0.25, range [−32, 31.75]
    x = torch.tensor([0.125, 0.375, -0.125, -0.375, 1.0, 100.0, -100.0, -32.0, 31.75])
    q, n = quantise(x, fmt)
    assert q.dtype == torch.int64
    assert q.tolist() == [0, 2, 0, -2, 4, 127, -128, -128, 127]
    assert int(n) == 2
    with pytest.raises(ValueError, match="NaN"):
        quantise(torch.tensor([float("nan")]), fmt)


@given(st.integers(-(2**60), 2**60), st.integers(0, 20))
def test_rounding_brackets_the_exact_quotient(v, k):
    """Every rounding lands on floor(v/2^k) or the next integer; rhu/rne land on the nearest."""
    lo = v >> k
    for r in (rhu(v, k), rne(v, k), rsr(v, k, 0, 16), rsr(v, k, 0xFFFF, 16)):
        assert r in (lo, lo + 1)
    if k:
        twice = 2 * (v - (lo << k))  # 2·remainder vs 2^k
        assert rhu(v, k) == (lo + 1 if twice >= (1 << k) else lo)
        if twice != (1 << k):
            assert rne(v, k) == rhu(v, k)
