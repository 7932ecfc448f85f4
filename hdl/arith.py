"""Fixed-point operators of the training datapath as Amaranth expressions (docs/numerics.md §1).

Each function returns an Amaranth value that computes exactly the integer operation of the
same name in ``docs/numerics.md`` §1 (and in :mod:`pipetrain.sim.fixed`, the golden model's
version). Shifts by a constant ``k`` are wiring; ``>>`` on a signed value is arithmetic (floor),
as the contract requires. Every operand keeps its full width: Amaranth widens ``+`` by one bit
and ``*`` to the sum of the widths, so nothing wraps before :func:`sat` narrows it.

Source: docs/numerics.md §1 (the contract); the expressions are the literal definitions.
"""

from __future__ import annotations

from collections.abc import Callable

from amaranth import Const, Module, Mux, Signal, Value, signed
from amaranth.hdl import ValueCastable

from ..compiler.plan import QFormat, csd

__all__ = [
    "tree_sum",
    "sat",
    "sat_sides",
    "rhu",
    "rne",
    "rsr",
    "align",
    "round_upd",
    "const_mul",
    "const_operand",
    "select_add",
    "split_product",
    "wire",
    "ushape",
]


def sat_sides(v: Value, fmt: QFormat) -> tuple[Value, Value]:
    """``(hi, lo)``: ``v > fmt.max_int`` and ``v < fmt.min_int``, read from the bits of ``v``
    from ``fmt.bits − 1`` up: ``v`` fits exactly when they are all equal (all 0: ``hi`` when
    any is 1 and ``v ≥ 0``; all 1: ``lo`` when any is 0 and ``v < 0``) — two OR/AND
    reductions instead of two magnitude comparators, which Yosys maps to carry chains
    (*derived*, timing only: on both boards the comparators' chains were most of the update
    unit's critical path; the result is the same)."""
    v = Value.cast(v)
    n, shape = fmt.bits, v.shape()
    width, signed_ = shape.width, shape.signed
    if width < n or (width == n and signed_):  # every value fits
        return Const(0, 1), Const(0, 1)
    top = v[n - 1 :]  # the result's sign bit and every bit above it
    if not signed_:
        return top.any(), Const(0, 1)
    neg = v[width - 1]
    return ~neg & top.any(), neg & ~top.all()


def sat(v: Value, fmt: QFormat) -> tuple[Value, Value]:
    """Clamp ``v`` to ``[fmt.min_int, fmt.max_int]``.

    Returns ``(value, clamped)``: ``value`` has shape ``signed(fmt.bits)``, ``clamped`` is 1
    when the clamp changed ``v`` (the caller adds it to the owning saturation counter). The
    range test is :func:`sat_sides`.
    """
    v = Value.cast(v)
    hi, lo = sat_sides(v, fmt)
    out = Mux(hi, fmt.max_int, Mux(lo, fmt.min_int, v))
    return out[: fmt.bits].as_signed(), hi | lo


def rhu(v: Value, k: int) -> Value:
    """Round half up by ``k`` bits: ``v`` (k = 0), ``(v + 2^(k−1)) >> k`` (k > 0), ``v << −k``
    (k < 0)."""
    if k > 0:
        return (v + (1 << (k - 1))) >> k
    if k < 0:
        return v << -k
    return v


def rhu_offset(k: int) -> int:
    """The constant :func:`rhu` adds before its shift: ``2^(k−1)`` for ``k > 0``, else 0.

    A sum that starts from this offset rounds by a shift alone (:func:`rhu_offset_shift`):
    ``rhu(Σ, k) = (h + Σ) >> k`` with ``h`` the offset, exact in integers (addition is
    associative). The forward MACs start their accumulators from it, so the output's rounding
    is no carry chain of its own (*derived*, timing).
    """
    return 1 << (k - 1) if k > 0 else 0


def rhu_offset_shift(v: Value, k: int) -> Value:
    """``rhu(v − rhu_offset(k), k)``: the rounding of a sum that already holds the offset —
    ``v >> k`` (k > 0), ``v << −k`` (k ≤ 0)."""
    return v >> k if k > 0 else v << -k


def rne(v: Value, k: int) -> Value:
    """Round half to even by ``k`` ≥ 0 bits: ``q = v >> k``, remainder ``r`` = the low ``k``
    bits, ``q + 1`` if ``r > 2^(k−1)`` or (``r = 2^(k−1)`` and ``q`` odd), else ``q``."""
    if k < 0:
        raise ValueError(f"rne needs k ≥ 0, got {k}")
    if k == 0:
        return v
    q = v >> k
    r = v[:k]
    h = 1 << (k - 1)
    up = (r > h) | ((r == h) & q[0])
    return q + up


def rsr(v: Value, k: int, r: Value, round_bits: int) -> Value:
    """Stochastic rounding by ``k`` ≥ 0 bits with an unsigned ``round_bits``-bit random ``r``:
    ``(v + (r >> (R − k))) >> k`` for 0 < k ≤ R, ``(v + (r << (k − R))) >> k`` for k > R."""
    if k < 0:
        raise ValueError(f"rsr needs k ≥ 0, got {k}")
    if k == 0:
        return v
    r = r.as_unsigned()
    add = r >> (round_bits - k) if k <= round_bits else r << (k - round_bits)
    return (v + add) >> k


def round_upd(v: Value, k: int, r: Value, rounding: str, round_bits: int) -> Value:
    """``round_upd`` of numerics §1: :func:`rsr` for ``stochastic``, else :func:`rne`."""
    if rounding == "stochastic":
        return rsr(v, k, r, round_bits)
    return rne(v, k)


def align(v: Value, f_from: int, f_to: int) -> Value:
    """``v << (f_to − f_from)`` (exact). Raises ValueError if ``f_to < f_from``."""
    if f_to < f_from:
        raise ValueError(f"align from {f_from} to {f_to} fraction bits would drop bits")
    return v << (f_to - f_from)


def const_operand(value: int) -> Const:
    """The integer constant ``value`` as a signed operand of minimal width (one more bit than
    its magnitude needs): the constant side of a multiplier (``value.bit_length() + 1`` bits)."""
    width = value.bit_length() + 1 if value >= 0 else (-value - 1).bit_length() + 1
    return Const(value, signed(width))


def const_mul(
    value: int,
    v: Value | ValueCastable,
    shift_add: Callable[[int], bool],
    low_bits: int = 0,
) -> Value:
    """``value · v`` for an integer constant, exactly: shifts and adders over the constant's
    canonical signed digits (:func:`pipetrain.compiler.plan.csd`) when the plan's rule
    ``shift_add(value)`` says so (:meth:`pipetrain.compiler.plan.Plan.shift_add`: at most
    ``Plan.shift_add_max_terms`` digits), else one product with a signed constant operand of
    minimal width (a DSP block after synthesis) — with ``low_bits`` > 0 (the plan's
    :meth:`~pipetrain.compiler.plan.Plan.low_piece` of ``value`` and ``v``'s width) of ``v``'s
    top bits only, ``value · v[:low_bits]`` formed in logic (:func:`split_product`,
    :func:`select_add`). The plan's multiplier estimate follows the same rules."""
    if value == 0:
        return Const(0, signed(1))
    if value == 1:
        return Value.cast(v)
    if shift_add(value):
        out = None
        for shift, sign in reversed(csd(value)):  # most significant digit first
            term = Value.cast(v) << shift
            if out is None:
                out = term if sign > 0 else -term
            else:
                out = out + term if sign > 0 else out - term
        return out
    if low_bits:
        v = Value.cast(v)
        lo = select_add(value, v[:low_bits])
        return split_product(value, v[low_bits:].as_signed(), lo, low_bits)
    return const_operand(value) * v


def select_add(value: int, bits: Value) -> Value:
    """``value · bits`` for an unsigned ``bits`` (a few bits wide) in logic, never a multiplier:
    Σ_i ``bits[i] ? value << i : 0`` as a balanced adder tree (:func:`tree_sum`, ⌈log2
    len(bits)⌉ adder levels; each term is ``value << i``'s bits gated by one bit). Yosys sees
    multiplexers and adders, so it maps no DSP block to it. Exact (the literal definition of
    the product). Source: *derived* (``Plan.logic_low_bits``)."""
    bits = Value.cast(bits)
    terms = [Mux(bits[i], Const(value << i), 0) for i in range(len(bits))]
    return tree_sum(terms) if terms else Const(0, 1)


def split_product(value: int, hi: Value, low_product: Value, low_bits: int) -> Value:
    """``value · v`` from the pieces of ``v = hi·2^low_bits + lo``: ``(value · hi) << low_bits
    + low_product``, with ``hi = v[low_bits:]`` (signed) and ``low_product = value · lo`` for
    the unsigned ``lo = v[:low_bits]`` (:func:`select_add`, possibly formed a pipeline stage
    earlier and registered). Exact. One multiplier (the constant × ``len(hi)`` bits: one DSP
    block when ``hi`` is at most the block's width), then one adder — the shape of Yosys'
    own two-block split, with the low block replaced by logic."""
    return (const_operand(value) * hi << low_bits) + low_product


def ushape(n: int) -> int:
    """Bits of an unsigned counter that holds 0..n (at least 1)."""
    return max(1, int(n).bit_length())


def wire(m: Module, expr: Value, name: str) -> Signal:
    """A combinational signal ``name`` = ``expr``, for a value used more than once: one cell in
    the netlist instead of a copy per use (*derived*: keeps the shared adders shared)."""
    sig = Signal(expr.shape(), name=name)
    m.d.comb += sig.eq(expr)
    return sig


def delayed(m: Module, value: Value, name: str, registers: int) -> Value:
    """``value`` through ``registers`` registers without an enable (0: ``value`` itself), named
    ``name``, ``name_1``, …: the multipliers' operand registers (``Stage.operand_registers``).
    A pipeline register of a lockstep slot pipeline needs no enable: the stage after it reads
    it exactly one cycle after the stage before it was valid. Source: *derived* (timing: a
    register next to each DSP block takes the routing to the block out of the multiplier's
    path, docs/boards.md §4.2)."""
    for k in range(registers):
        r = Signal(value.shape(), name=name if k == 0 else f"{name}_{k}")
        m.d.sync += r.eq(value)
        value = r
    return value


def pipelined_const_mul(m: Module, value: int, v: Value, registers: int, name: str) -> Value:
    """``value · v`` exactly for a constant ``value`` ≠ 0, in logic, never a multiplier: the
    canonical signed digits of ``value`` (:func:`pipetrain.compiler.plan.csd`) as shifted
    ``±v`` terms summed by a balanced adder tree (:func:`tree_sum`'s pairing) of
    ``levels`` = ⌈log2 digits⌉ adder levels, with ``registers`` register levels without an
    enable (named ``name_r<k>_<term>``) after levels ⌈(k+1)·levels / (registers+1)⌉: the
    value is ``value`` × the ``v`` of ``registers`` cycles before, and no path between
    registers has more than ⌈levels / (registers+1)⌉ adders (the last of them after the last
    register, for the caller's own register). Raises ValueError for ``value`` = 0. The plan's
    ``momentum_in_logic`` (``m·u`` of a lockstep lane, in the cycles its operand registers
    leave). Source: *derived* (timing: momentum 0.9 at 18 significant bits is 9 digits, 4
    adder levels of ~30-bit carry chains, too long for one 90 MHz cycle on the ECP5)."""
    if value == 0:
        raise ValueError("pipelined_const_mul of 0: no terms")
    v = Value.cast(v)
    terms = [(v << shift) if sign > 0 else -(v << shift) for shift, sign in csd(value)]
    levels = max(0, len(terms) - 1).bit_length()
    after = [-(-(k + 1) * levels // (registers + 1)) for k in range(registers)]
    reg = 0
    for level in range(levels + 1):
        while reg < registers and after[reg] == level:  # register the terms after `level`
            regs = []
            for n, t in enumerate(terms):
                r = Signal(t.shape(), name=f"{name}_r{reg}_{n}")
                m.d.sync += r.eq(t)
                regs.append(r)
            terms, reg = regs, reg + 1
        if level < levels:
            pairs = [terms[k] + terms[k + 1] for k in range(0, len(terms) - 1, 2)]
            terms = pairs + ([terms[-1]] if len(terms) % 2 else [])
    return terms[0]


def tree_sum(values: list) -> Value:
    """Σ ``values`` as a balanced adder tree (⌈log2 n⌉ levels; integers, so the order is free):
    the input gradient's sum across lanes, the loss unit's exp lanes into E, the saturation
    counters' popcount and :func:`select_add`'s terms. Source: *derived* (timing: one adder
    per level instead of a chain)."""
    values = list(values)
    while len(values) > 1:
        pairs = [values[k] + values[k + 1] for k in range(0, len(values) - 1, 2)]
        values = pairs + ([values[-1]] if len(values) % 2 else [])
    return values[0]
