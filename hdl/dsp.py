"""A multiplier with its operand and product registers, in the DSP block's own registers where
the FPGA has them.

:func:`registered_product` is every variable multiply of a Linear stage's lanes (the forward MAC
``ŵ·x``, the input gradient ``w·δ``, the update's ``e·x`` and its constant products ``m·u``,
``c·w``): the operands pass ``Stage.operand_registers`` = P registers (no enable), the product
one more (no enable), so the product of the operands presented in cycle ``t`` is read in cycle
``t + P + 1``. Two forms, the same values in every cycle after the first P + 1 (the registers
hold no reset value the datapath reads: each is read only by a valid slot, P + 1 cycles after
that slot's operands were presented):

* **ECP5 with P = 1 or 2 and both operands in 18 bits** (signed ≤ 18 bits, unsigned ≤ 18
  bits, a constant in either): one ``MULT18X18D`` (Lattice TN1267, *ECP5 and ECP5-5G sysDSP Usage
  Guide*, MULT18X18D) with its input registers A and B and its output register on ``CLK0``
  (``REG_INPUTA_CLK`` = ``REG_INPUTB_CLK`` = ``REG_OUTPUT_CLK`` = ``"CLK0"``, clock enable
  ``CE0`` = 1, no reset, no pipeline register). Yosys does not pack ECP5 DSP registers, so
  without this the registers are fabric flip-flops that nextpnr places away from the block:
  the -deep 16,8,8,4 build's critical path was an operand register → 9.7 ns of routing → the
  MULT18 → its product register (docs/boards.md §4.2). nextpnr times the block's registered
  ports against ``CLK0`` (``MULT18X18D_REGS_ALL``). The product is ``P[35:0]``, two's
  complement when either operand is signed (``SIGNEDP``). With P = 2 the block's ``P`` passes
  one more register in the fabric (no enable; ``out`` itself): the placer can put it between
  a block far from its lane and the lane's logic, where a block's ``P`` → the update's rounding
  adders crossed 8.0 ns of routing (-deep 16,8,8,4, 73.8 MHz at a 90 MHz constraint,
  docs/boards.md §4.2). P + 1 = 3 registers as in the fabric form: the block's input
  registers, its output register and the fabric one.
* **Otherwise** (simulation without a platform, the iCE40 — where Yosys absorbs the product
  register into ``SB_MAC16`` itself —, P = 0, wider operands): ``delayed`` operand registers
  (P of them) and a product register in the fabric, named as before this module existed, so
  those designs' Verilog is unchanged.

Source: *derived* (timing only: no value changes; docs/architecture.md §3 "Operand
registers").
"""

from __future__ import annotations

from typing import Any

from amaranth import Cat, ClockSignal, Const, Module, Shape, Signal, Value
from amaranth.hdl import Instance

from .arith import delayed

__all__ = ["DSP_BITS", "DSP_REGISTERS", "fits_dsp", "in_dsp", "is_ecp5", "registered_product"]

#: Operand width of the ECP5's 18 × 18 multiplier (bits).
DSP_BITS = 18

#: The operand registers (``Stage.operand_registers``) that take the MULT18X18D's own registers:
#: 1 (input + output registers) and 2 (the same, + one fabric register on its product).
DSP_REGISTERS = (1, 2)


def is_ecp5(platform: Any) -> bool:
    """Whether ``platform`` builds for the ECP5 family (Amaranth's ``LatticePlatform`` with
    ``family == "ecp5"``, which amaranth-boards' ULX3S platform derives from)."""
    if platform is None:
        return False
    family = getattr(platform, "family", None)
    if isinstance(family, str):
        return family.lower() == "ecp5"
    return any(c.__name__ == "LatticeECP5Platform" for c in type(platform).__mro__)


def _operand(value: Value) -> tuple[Value, int] | None:
    """``(value as DSP_BITS bits, SIGNED bit)`` when ``value`` fits one 18-bit port, else
    None. A constant takes the unsigned form when it is not negative (the momentum's
    ``const_operand`` carries a sign bit: 19 bits for an 18-bit magnitude)."""
    if isinstance(value, Const):
        v = value.value
        if 0 <= v < 1 << DSP_BITS:
            return Const(v, DSP_BITS), 0
        if -(1 << (DSP_BITS - 1)) <= v < 0:
            return Const(v, DSP_BITS), 1
        return None
    shape = value.shape()
    if shape.width > DSP_BITS:
        return None
    if shape.signed:
        return value.as_signed() if shape.width == DSP_BITS else _extend(value, True), 1
    return _extend(value, False), 0


def _extend(value: Value, signed: bool) -> Value:
    """``value`` sign- (``signed``) or zero-extended to DSP_BITS bits."""
    width = value.shape().width
    if width == DSP_BITS:
        return value
    fill = value[width - 1] if signed and width else Const(0, 1)
    return Cat(value, *([fill] * (DSP_BITS - width)))


def fits_dsp(a: Value, b: Value) -> bool:
    """Whether ``a · b`` is one ECP5 18 × 18 multiply (:func:`registered_product`'s rule)."""
    return _operand(Value.cast(a)) is not None and _operand(Value.cast(b)) is not None


def in_dsp(platform: Any, registers: int, a: Value, b: Value) -> bool:
    """Whether :func:`registered_product` forms ``a · b`` with ``registers`` operand registers in
    a MULT18X18D with its own registers (the ECP5, ``registers`` in :data:`DSP_REGISTERS`, both
    operands in 18 bits) — else in the fabric."""
    return registers in DSP_REGISTERS and is_ecp5(platform) and fits_dsp(a, b)


def registered_product(
    m: Module,
    platform: Any,
    a: Value,
    b: Value,
    *,
    registers: int,
    out: Signal,
    names: tuple[str, str],
) -> None:
    """``out`` ← ``a · b`` through ``registers`` operand registers and one product register
    (module docstring): ``out`` in cycle ``t + registers + 1`` is the product of ``a`` and
    ``b`` in cycle ``t``, exact in ``out``'s shape (which must hold the product; two's
    complement).

    ``names``: the fabric operand registers' names (:func:`~.arith.delayed`); ``out`` is the
    product register itself in the fabric form, in the ECP5 form the block's ``P`` (through
    ``comb``) with P = 1 and the fabric register after it with P = 2. Raises ValueError when
    ``out`` is narrower than the product needs."""
    a, b = Value.cast(a), Value.cast(b)
    _check_width(a, b, out.shape())
    if not in_dsp(platform, registers, a, b):
        ad = delayed(m, a, names[0], registers)
        bd = delayed(m, b, names[1], registers)
        m.d.sync += out.eq(ad * bd)
        return
    (a18, sa), (b18, sb) = _operand(a), _operand(b)
    p = Signal(2 * DSP_BITS, name=f"{out.name}_p")
    params = {
        "p_REG_INPUTA_CLK": "CLK0",
        "p_REG_INPUTA_CE": "CE0",
        "p_REG_INPUTA_RST": "RST0",
        "p_REG_INPUTB_CLK": "CLK0",
        "p_REG_INPUTB_CE": "CE0",
        "p_REG_INPUTB_RST": "RST0",
        "p_REG_INPUTC_CLK": "NONE",
        "p_REG_PIPELINE_CLK": "NONE",
        "p_REG_OUTPUT_CLK": "CLK0",
        "p_REG_OUTPUT_CE": "CE0",
        "p_REG_OUTPUT_RST": "RST0",
        "p_CLK0_DIV": "ENABLED",
        "p_HIGHSPEED_CLK": "NONE",
        "p_GSR": "DISABLED",
        "p_CAS_MATCH_REG": "FALSE",
        "p_SOURCEB_MODE": "B_SHIFT",
        "p_MULT_BYPASS": "DISABLED",
        "p_RESETMODE": "SYNC",
    }
    conns: dict[str, Any] = {
        "i_CLK0": ClockSignal(),
        "i_CE0": Const(1, 1),
        "i_RST0": Const(0, 1),
        "i_SIGNEDA": Const(sa, 1),
        "i_SIGNEDB": Const(sb, 1),
        "i_SOURCEA": Const(0, 1),
        "i_SOURCEB": Const(0, 1),
    }
    for k in range(DSP_BITS):
        conns[f"i_A{k}"] = a18[k]
        conns[f"i_B{k}"] = b18[k]
        conns[f"i_C{k}"] = Const(0, 1)
    for k in range(2 * DSP_BITS):
        conns[f"o_P{k}"] = p[k]
    m.submodules[f"{out.name}_dsp"] = Instance("MULT18X18D", **params, **conns)
    product = p.as_signed() if sa or sb else p
    if registers == 1:
        m.d.comb += out.eq(product)
    else:  # P = 2: one fabric register after the block's output register (module docstring)
        m.d.sync += out.eq(product)


def _check_width(a: Value, b: Value, shape: Shape) -> None:
    """Raise ValueError when ``shape`` cannot hold every product of ``a`` and ``b``."""
    lo_a, hi_a = _range(a)
    lo_b, hi_b = _range(b)
    corners = [x * y for x in (lo_a, hi_a) for y in (lo_b, hi_b)]
    lo, hi = min(corners), max(corners)
    s = Shape.cast(shape)
    smin = -(1 << (s.width - 1)) if s.signed else 0
    smax = (1 << (s.width - 1)) - 1 if s.signed else (1 << s.width) - 1
    if lo < smin or hi > smax:
        raise ValueError(
            f"product register of {s} cannot hold {a.shape()} × {b.shape()} "
            f"(range {lo}..{hi}); widen it"
        )


def _range(v: Value) -> tuple[int, int]:
    """The least and greatest integer ``v`` can hold."""
    if isinstance(v, Const):
        return v.value, v.value
    s = v.shape()
    if s.signed:
        return -(1 << (s.width - 1)), (1 << (s.width - 1)) - 1
    return 0, (1 << s.width) - 1
