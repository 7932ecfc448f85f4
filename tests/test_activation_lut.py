"""tanh / sigmoid through the plan's interpolated LUT (docs/numerics.md §3.4, §5.1).

The LUT's error bound is checked on every ``z`` of each format against the exact function; the
negative half is the symmetry exactly; the derivative from the stashed output stays within its
rounding bound and never exceeds |g|; the vectorised golden model equals the scalar oracle bit
for bit on tiny tanh and sigmoid nets (including saturating ones); the compiler accepts
``nn.Tanh``/``nn.Sigmoid``, describes the ROM and the wider mask in the plan, and refuses a
sigmoid whose y format cannot hold 1.0 with a user error naming the ``--format`` fix."""

from __future__ import annotations

import math

import pytest
import torch
from pipetrain.compiler.act_lut import ERROR_BOUND_LSB, activation_lut, exact
from pipetrain.compiler.build import PlanError, build_plan
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.frontend import trace
from pipetrain.compiler.ir import LayerIR, NetworkIR
from pipetrain.compiler.plan import Plan, QFormat
from pipetrain.errors import UserError
from pipetrain.sim.golden import lut_derivative, lut_forward
from torch import nn

#: y formats: the static default Q5.10, typical calibrated ones, iCE40-narrow 12 bits, a
#: fraction-only one (tanh) and one where the format's range, not flatness, ends the table.
FORMATS = [QFormat(16, 10), QFormat(16, 12), QFormat(12, 8), QFormat(12, 9), QFormat(16, 14)]


def _all(fmt: QFormat) -> torch.Tensor:
    return torch.arange(fmt.min_int, fmt.max_int + 1, dtype=torch.int64)


#: sigmoid without an integer bit is refused by the compiler (tested below): tanh only there
BOUND_CASES = [(fn, q) for fn in ("tanh", "sigmoid") for q in FORMATS] + [("tanh", QFormat(16, 15))]


@pytest.mark.parametrize("function,fmt", BOUND_CASES, ids=lambda v: str(v))
def test_lut_error_bound_over_every_input(function, fmt):
    """max |LUT(z) − f(z)| over all 2^b inputs ≤ the documented 0.78125 LSB (measured 0.54–0.72
    LSB); outputs stay in the format (tanh |y| ≤ |z|, sigmoid 0 ≤ y ≤ 1.0)."""
    lut = activation_lut(function, fmt)
    assert lut.error_bound_lsb == ERROR_BOUND_LSB == 0.78125
    z = _all(fmt)
    y = lut_forward(z, lut, fmt.frac)
    scale = 2.0**fmt.frac
    want = torch.tensor([exact(function, v / scale) * scale for v in z.tolist()])
    err = (y.double() - want).abs().max().item()
    assert err <= ERROR_BOUND_LSB, err
    assert err > 0.4  # the final rounding alone reaches ~½ LSB: the comparison is real
    if function == "tanh":
        assert bool((y.abs() <= z.abs()).all()) and int(y.abs().max()) <= 1 << fmt.frac
    else:
        assert int(y.min()) >= 0 and int(y.max()) <= 1 << fmt.frac <= fmt.max_int


@pytest.mark.parametrize("function", ["tanh", "sigmoid"])
def test_lut_symmetry_and_table_shape(function):
    fmt = QFormat(16, 12)
    lut = activation_lut(function, fmt)
    z = torch.arange(1, fmt.max_int + 1, dtype=torch.int64)
    pos, neg = lut_forward(z, lut, 12), lut_forward(-z, lut, 12)
    if function == "tanh":
        assert torch.equal(neg, -pos)
    else:
        assert torch.equal(neg, (1 << 12) - pos)
    # the index step keeps interpolation within ¼ LSB; entries are rounded f(k·2^-fl)·2^fe
    assert lut.entry_frac == 16
    assert lut.index_frac == {"tanh": 6, "sigmoid": 4}[function]
    assert len(lut.entries) == {"tanh": 334, "sigmoid": 129}[function]
    for k in (0, 1, 17, len(lut.entries) - 1):
        assert lut.entries[k] == math.floor(exact(function, k / 2**lut.index_frac) * 2**16 + 0.5)
    assert lut.slopes[-1] == 0 and all(d >= 0 for d in lut.slopes)
    assert all(w >> lut.entry_bits == d for w, d in zip(lut.words, lut.slopes, strict=True))


@pytest.mark.parametrize("function", ["tanh", "sigmoid"])
def test_derivative_from_the_stashed_output(function):
    """δ = rhu(g·q, f), q = rhu(2^2f − y², f) or rhu(y(2^f − y), f): within |g|·2^−(f+1) + ½ LSB
    of g·f′ evaluated at the stashed y, and |δ| ≤ |g| (no clamp needed), for every y the LUT
    can output and extreme g."""
    fy, fd = QFormat(16, 12), QFormat(16, 13)
    f = fy.frac
    lut = activation_lut(function, fy)
    y = torch.unique(lut_forward(_all(fy), lut, f))
    for gv in (fd.min_int, fd.max_int, -12345, 7, 1):
        g = torch.full_like(y, gv)
        d = lut_derivative(function, y, g, f)
        yr = y.double() / 2**f
        fprime = 1 - yr * yr if function == "tanh" else yr * (1 - yr)
        err = (d.double() - gv * fprime).abs()
        assert bool((err <= abs(gv) / 2 ** (f + 1) + 0.5).all())
        assert bool((d.abs() <= abs(gv)).all())


def test_compiler_accepts_tanh_and_sigmoid_and_plans_the_rom():
    model = nn.Sequential(
        nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 5), nn.Sigmoid(), nn.Linear(5, 3)
    )
    ir = trace(model, "ts")
    assert [ly.activation for ly in ir.layers] == ["tanh", "sigmoid", "identity"]
    plan = build_plan(ir, TrainConfig(), lanes=[2, 5, 3])
    for st in plan.stages[:2]:
        lut = st.activation_lut
        assert lut.function == st.activation and st.mask_bits == st.formats.y.bits
        rom = st.memory("act_lut")
        assert (rom.words, rom.width, rom.read_ports, rom.write_ports) == (
            len(lut.entries),
            lut.word_bits,
            st.lanes,
            0,
        )
        mask = st.memory("mask")
        assert mask.width == st.lanes * st.formats.y.bits
        assert st.stash_bits == st.memory("xstash").bits + mask.bits
        # the interpolation slope × |z| low bits, y·y or y·(1 − y), and g × it (stage_products)
        assert [q.name for q in st.products][-6:-3] == ["lut_slope", "deriv", "deriv_g"]
        assert st.multipliers == st.lanes * len(st.products)
    # per lane: fwd, (gin), the three LUT products, momentum, lr_delta, lr_x; the identity
    # output stage forms lr·g once at the error buffer's write (Stage.scaled_at_write)
    assert [s.multipliers for s in plan.stages] == [2 * 7, 5 * 8, 3 * 4 + 1]
    assert plan.multipliers == 67
    last = plan.stages[2]
    assert last.activation_lut is None and last.mask_bits == 1
    assert "activation_lut" not in plan.to_dict()["stages"][2]  # None fields stay out of JSON
    back = Plan.from_json(plan.to_json())
    assert back == plan and back.hash == plan.hash


def test_sigmoid_without_an_integer_bit_is_a_user_error():
    ir = NetworkIR("s", 4, (LayerIR("0", 4, 3, "sigmoid"), LayerIR("2", 3, 2)))
    from pipetrain.compiler.build import FormatSpec

    fs = FormatSpec.default(2)
    fs = FormatSpec(x=(fs.x[0], QFormat(16, 15)), logits=fs.logits, d=fs.d, w=fs.w, u=fs.u)
    with pytest.raises(PlanError, match=r"stage 1 \(0\): sigmoid outputs up to 1.0.*s1.y") as e:
        build_plan(ir, TrainConfig(), fs)
    assert isinstance(e.value, UserError)


def test_example_model_file_compiles_with_the_lut_in_its_report():
    from pathlib import Path

    from pipetrain.compiler.compile import compile_result
    from pipetrain.compiler.report import totals_text

    path = Path(__file__).resolve().parent.parent / "examples" / "mlp_tanh.py"
    plan = compile_result(str(path), formats="default").plan
    st = plan.stages[0]
    assert st.activation == "tanh" and st.formats.y == QFormat(16, 10)
    assert (st.activation_lut.index_frac, len(st.activation_lut.entries)) == (5, 146)
    assert (
        "stage 1 tanh: LUT of 146 words × 24 bits (step 2^-5, interpolated), max error 0.78125 "
        "LSB of y Q5.10; the stash keeps y (16 bits per output)"
    ) in totals_text(plan)


class _Functional(nn.Module):
    """torch.tanh and F.sigmoid instead of the modules (the front end's functional forms)."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 6), nn.Linear(6, 5), nn.Linear(5, 3)

    def forward(self, x):
        return self.c(torch.nn.functional.sigmoid(self.b(torch.tanh(self.a(x)))))


def test_functional_tanh_and_sigmoid_compile_like_the_modules():
    """Same IR activations and the same LUTs as the nn.Tanh / nn.Sigmoid twin (layer names
    differ, so the plans' hashes do)."""
    twin = nn.Sequential(nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 5), nn.Sigmoid(), nn.Linear(5, 3))
    ir, ir2 = trace(_Functional(), "f"), trace(twin, "f")
    assert [ly.activation for ly in ir.layers] == ["tanh", "sigmoid", "identity"]
    assert [ly.activation for ly in ir2.layers] == [ly.activation for ly in ir.layers]
    luts = [
        [s.activation_lut for s in build_plan(i, TrainConfig(), lanes=[2, 5, 3]).stages]
        for i in (ir, ir2)
    ]
    assert luts[0] == luts[1] and luts[0][0] is not None and luts[0][1] is not None


def test_board_fit_counts_the_lut_multipliers():
    """The fit counts the 3 LUT multipliers per lane: a 64 → 16 Sigmoid → 10 net needs 9
    iCE40 SB_MAC16s (the same ReLU net 6) of the iCEBreaker's 8, a FitError with the numbers."""
    from pipetrain.compiler.fit import FitError
    from pipetrain.compiler.models import build_mlp
    from pipetrain.host.flow import compile_design

    with pytest.raises(FitError, match="9 DSP blocks needed, 8 available") as e:
        compile_design(build_mlp([64, 16, 10], nn.Sigmoid), board="icebreaker", formats="default")
    assert e.value.rows["multipliers"] == {"needed": 9, "available": 8}
    assert isinstance(e.value, UserError)
    relu = compile_design(build_mlp([64, 16, 10]), board="icebreaker", formats="default").plan
    assert [s.activation_lut for s in relu.stages] == [None, None]
    from pipetrain.compiler.fit import plan_totals
    from pipetrain.compiler.targets import BOARDS

    assert plan_totals(relu, BOARDS["icebreaker"])["hard_multipliers"] == 6
