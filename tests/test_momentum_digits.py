"""``TrainConfig.momentum_digits`` (``--momentum-digits D``): the hardware's momentum constant
rounded to at most D canonical signed digits (:meth:`Const.signed_digits`, docs/numerics.md
§1), so a lane's ``m·u`` takes D − 1 adders instead of the 9 digits' 8 that 0.9 has at 18
bits. The golden model reads the constant from the plan; the plan records the setting (and
only when it is set: every other plan keeps its JSON and hash)."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as hs
from pipetrain.compiler.build import PlanError
from pipetrain.compiler.config import ConfigError, TrainConfig
from pipetrain.compiler.plan import Const, Plan, csd
from pipetrain.host.cli import cli
from tiny_net import tiny


@pytest.mark.parametrize(
    ("real", "digits", "value", "frac"),
    [
        (0.9, 4, 235520, 18),  # 1 − 2^−3 + 2^−5 − 2^−7 = 0.8984375
        (0.9, 3, 237568, 18),  # 1 − 2^−3 + 2^−5 = 0.90625
        (0.9, 2, 229376, 18),  # 1 − 2^−3 = 0.875
        (0.9, 9, 235930, 18),  # all of 0.9's digits at 18 bits: the full-precision constant
        (0.99, 1, 131072, 17),  # 1: one bit more than 18 significant bits, one frac bit less
        (0.5, 3, 131072, 18),  # already one digit
    ],
)
def test_signed_digits_golden_values(real, digits, value, frac):
    c = Const.signed_digits(real, digits)
    assert (c.value, c.frac, c.real) == (value, frac, real)
    if digits == 9:
        assert c == Const.normalised(real, 18)


@given(hs.floats(1e-4, 0.999), hs.integers(1, 8))
def test_signed_digits_bounds(real, digits):
    """At most ``digits`` digits, within 18 bits; the error is at most |real|·2^−digits + one
    LSB (each digit is the power of two nearest the remainder r, which leaves at most r/2, so
    D digits leave |real|·2^−D, and the integer grid one LSB); the fraction bits are those of
    the 18-bit constant (one fewer when rounding carried into a 19th bit)."""
    c = Const.signed_digits(real, digits)
    assert len(csd(c.value)) <= digits
    assert abs(c.value) < 1 << 18
    assert abs(c.quantised - real) <= abs(real) * 2.0**-digits + 2.0**-c.frac
    base = Const.normalised(real, 18)
    assert c.frac in (base.frac, base.frac - 1)


def test_signed_digits_refuses_zero_digits():
    with pytest.raises(ValueError, match="at least 1 signed digit"):
        Const.signed_digits(0.9, 0)


def test_momentum_digits_in_the_plan_round_trip_and_default_unchanged():
    base, _, _ = tiny()
    plan, _, _ = tiny(momentum_digits=4)
    assert "momentum_digits" not in base.train and '"momentum_digits"' not in base.to_json()
    assert plan.train["momentum_digits"] == 4
    for s0, s in zip(base.stages, plan.stages, strict=True):
        assert len(csd(s0.update.momentum.value)) == 9
        assert s.update.momentum == Const(235520, 18, 0.9)
        # the rest of the update (widths, fraction bits, other constants) is the same
        assert (s.update.frac_u, s.update.sum_bits, s.update.lr) == (
            s0.update.frac_u,
            s0.update.sum_bits,
            s0.update.lr,
        )
    back = Plan.from_json(plan.to_json())
    assert back == plan and back.hash == plan.hash != base.hash


def test_spike_compensation_follows_the_quantised_momentum():
    """SC's a and b come from the momentum the hardware uses (docs/numerics.md §1)."""
    from pipetrain.compiler.schedule import spike_compensation

    plan, _, _ = tiny(momentum_digits=3, mitigation="sc")
    st = plan.stages[0]
    a, b = spike_compensation(0.90625, st.delay)
    assert math.isclose(st.update.sc_a.real, a) and math.isclose(st.update.sc_lr_b.real, b * 0.1)


def test_momentum_digits_errors_name_the_fix():
    with pytest.raises(ConfigError, match="--momentum-digits 19: give 0"):
        TrainConfig(momentum_digits=19)
    with pytest.raises(PlanError, match="becomes 1 ≥ 1.*give more digits"):
        tiny(momentum=0.99, momentum_digits=1)


def test_cli_compile_reports_the_quantised_momentum(tmp_path):
    out = tmp_path / "c"
    res = CliRunner().invoke(
        cli,
        [
            "compile",
            "mlp-digits",
            "--formats",
            "default",
            "--momentum-digits",
            "4",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    plan = Plan.from_json((out / "plan.json").read_text())
    assert plan.stages[0].update.momentum.quantised == 0.8984375
    assert "0.8984375" in (out / "report.md").read_text()
    bad = CliRunner().invoke(cli, ["compile", "mlp-digits", "--momentum-digits", "-1"])
    assert bad.exit_code != 0 and "--momentum-digits -1" in bad.output
    assert "Traceback" not in bad.output
