"""The update unit of a stage: ŵ, momentum, Spike Compensation, rounding, saturation, per lane.

From one read of ``(w, u)`` per lane and slot (docs/numerics.md §3):

* **Linear Weight Prediction** (horizon ``H``): the forward weight of a training forward item
  is ``ŵ = w − H·u`` (``v`` form) or ``ŵ = w + H·(w − w_prev)`` (``w`` form, ``w_prev`` read
  with ``w``), else ``w``; formed at S1 and registered at S2. The ``w`` form writes the slot's
  old ``w`` back as its new ``w_prev`` with ``(w′, u′)`` (carried from S2 to the write stage).
* **momentum** (backward passes only): ``U = m·u + η·δ·x + ηλ·w`` aligned to ``frac_u``,
  ``u′ = sat(round_upd(U, frac_u − w.frac), u)``; without Spike Compensation
  ``w′ = sat(w − u′, w)`` (S3, registered at S4).
* **Spike Compensation**: ``V = a·u′ + b·η·δ·x + b·ηλ·w`` aligned to ``frac_v``,
  ``w′ = sat(w − round_upd(V, frac_v − w.frac), w)`` one stage later (S4, registered at S5).
* **rounding**: ``round_upd`` is stochastic (the lane's LFSR, one ``leap``-step draw per lane
  per backward slot: ``u′`` takes the low ``round_bits`` of the draw, SC's ``w′`` the next
  ones) or round-half-to-even (docs/numerics.md §1, §6).
* **saturation**: every clamp of ``u′`` and ``w′`` in a live lane raises a flag for the stage's
  saturation counter.

A constant product whose variable operand is wider than the plan's multiplier operand
(``Plan.logic_low_bits``, ``Plan.low_piece``: momentum × ``u``, ``lr_wd`` and SC's
``b·lr·λ`` × ``w``, SC's ``a`` × ``u′``, LWP's ``H`` × ``u`` or ``w − w_prev``; constants that
are not shift-adds) takes the operand's top ``operand_bits`` bits (signed) into one multiplier
and forms the constant × its low ``lo`` bits (unsigned) in logic, a select-add
(``arith.select_add``); the sum ``(c·x[lo:] << lo) + c·x[:lo]`` is exactly ``c·x``. For the
S2 products (momentum, weight decay) the select-add is formed at S1 from the read data and
registered into S2 beside ``(w, u)`` (same enable); the multiplier's product and the
select-add are two terms, each with its own S2 → S3 register, added into U at S3 (U is a
balanced adder tree), so S2 is one multiplier straight into its register; SC's ``a·u′``
(S4) and LWP's ŵ (S1) add it beside their multiplier.

The learning-rate products are formed as ``η·(δ·x)`` when ``η`` is a shift-add constant (then
one ``δ·x`` multiplier, exact) and otherwise as ``e·x`` with the scaled error
``e = rhu(η·δ, k)`` that the error buffer forms at S1 (``scaled_lr``, docs/numerics.md §5.3: an
18-bit operand, one DSP block, and one multiplier level per pipeline stage). The forward and
input-gradient MACs read ``ŵ`` and ``w`` rounded to the plan's weight operand
(``Stage.weight_operand``: ``rhu(·, w.frac − operand.frac)``, registered at S2 with them).
A convolution stage gives the weight gradient already summed over its positions
(``gradient_bits``: ``P = Σ_p δ·x`` on ``delta``, same fraction bits as ``δ·x``;
docs/numerics.md §9.2), so the products are ``η·P``, exact.
With operand registers the write-back leaves one stage later than ``update_stage`` (the write
data registered before the weight banks); with single-port memories one stage later when that
stage is even (one more register; the write must fall between two reads).

Source: docs/numerics.md §1, §3, §6 (the arithmetic, literal), docs/architecture.md §3; the
pipeline is *derived*.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from amaranth import Cat, Module, Mux, Signal, Value, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..compiler.plan import QFormat, Stage, StageFormats, UpdateConstants
from .arith import (
    align,
    const_mul,
    const_operand,
    delayed,
    pipelined_const_mul,
    rhu,
    round_upd,
    sat,
    sat_sides,
    select_add,
    tree_sum,
    wire,
)
from .dsp import in_dsp, registered_product
from .lfsr import LFSR
from .streams import (
    DeltaSignature,
    LaneWeightsSignature,
    SlotPipelineSignature,
    StashOperandsSignature,
    ValidSignature,
    WeightReadSignature,
    slot_at,
    write_back_layout,
)

__all__ = ["UpdateUnit", "LFSRConfig", "scaled_errors", "scaled_error_ports"]


def scaled_errors(stage: Stage) -> tuple[tuple[int, int, int], ...]:
    """``(c, k, bits)`` of each scaled error ``e = rhu(c·δ, k)`` the update unit of a Linear
    ``stage`` reads (docs/numerics.md §5.3, ``UpdateConstants.scaled_errors``): η's, then Spike
    Compensation's b·η; the error buffer forms them (``ErrorBuffer(scales=…)``). Empty when
    every product is exact."""
    return tuple((c.value, k, e.bits) for _, c, e, k in stage.update.scaled_errors(stage.formats.d))


def scaled_error_ports(stage: Stage) -> tuple[str, ...]:
    """The :class:`UpdateUnit` members that take :func:`scaled_errors`, in the same order."""
    return tuple(name for name, _, _, _ in stage.update.scaled_errors(stage.formats.d))


@dataclass(frozen=True)
class _Registered:
    """A term that is already its own S3 register: the product of a MULT18X18D with its
    input and output registers (P = 2: and the fabric register after them;
    :meth:`UpdateUnit._product`)."""

    value: Value


class LFSRConfig:
    """The plan's LFSR settings: ``poly`` (with the x^width term), ``width``, ``leap`` (steps per
    draw), ``round_bits`` (random bits per rounding) and one non-zero ``seeds`` entry per lane
    (docs/numerics.md §6)."""

    def __init__(
        self, poly: int, width: int, leap: int, round_bits: int, seeds: tuple[int, ...]
    ) -> None:
        self.poly, self.width, self.leap, self.round_bits = poly, width, leap, round_bits
        self.seeds = tuple(seeds)


class UpdateUnit(wiring.Component):
    """ŵ and the ``(w, u)`` update of every lane (see the module docstring).

    Parameters
    ----------
    pipeline: the pass's slot pipeline; its depth is the write stage.
    lanes: the physical lanes, L·k (``Stage.mac_lanes``).
    live_last: row lanes live in the last row group, ``M − (G−1)·L`` (the rest are padding;
        physical lane ``p`` is row lane ``p mod L``).
    columns: k, column lanes (``Stage.column_lanes``): physical lane ``p`` takes the backward
        ``x`` operand ``p div L`` of the slot (its column ``t·k + p div L``).
    formats: the stage's Q-formats (``w``, ``u``, ``d``, ``x``).
    update: the stage's update constants (momentum, learning rate, SC, LWP horizon and form).
    x_operand_bits: width of the ``x`` operand (``Stage.x_operand_bits``).
    what_bits: width of ŵ (``Stage.what_bits``).
    update_stage: stage where ``w′, u′`` are ready (4, 5 with SC, + P; ``Stage.update_stage``).
    rounding: ``stochastic`` or ``nearest_even``.
    lfsr: the LFSR settings (:class:`LFSRConfig`, one seed per lane).
    shift_add: the plan's rule (``Plan.shift_add``): whether a constant is multiplied with shifts
        and adders — then the learning-rate products are formed as ``η·(δ·x)``.
    gradient_bits: ``None`` (Linear), or the width of a summed weight gradient ``P`` that
        arrives on ``delta`` instead of δ (a convolution stage; ``operands`` is then absent).
    weight_operand: the MACs' weight operand format (``Stage.weight_operand``; None: ŵ and
        ``w`` exact).
    low_piece: the plan's rule (``Plan.low_piece``): ``low_piece(c, bits)`` low bits of a
        ``bits``-wide operand whose product with the constant ``c`` is formed in logic (0:
        none; the default: never, every constant product in one multiplier).
    operand_registers: P = 0, 1 or 2 (``Stage.operand_registers``): the S2 products' operands
        (δ, ``x``, the scaled errors, ``u``, ``w``, the select-adds) registered P times more
        per lane before the multipliers; U, u′, w′ (and SC's V) then come P stages later.
    momentum_in_logic: ``m·u`` formed in logic, shifts and adders over the canonical signed
        digits of ``m`` whatever their number, its adder tree spread over the P operand
        registers (:func:`~.arith.pipelined_const_mul`; ``Plan.momentum_in_logic``): no DSP
        block, the same integer.

    Members
    -------
    slots: ``In(pipeline.subset(S1…S{depth}; fwd_train, bwd))``.
    read: ``In(WeightReadSignature(L, w.bits, u.bits, w_prev))`` ``(w, u[, w_prev])`` at S1
        (``w_prev``: the LWP ``w`` form, ``H > 0``).
    operands: ``In(StashOperandsSignature(x_operand_bits, k))`` the backward ``x`` at S2 (not
        with ``gradient_bits``).
    delta: ``In(DeltaSignature(L, d.bits))`` δ at S2 (``gradient_bits``: ``P`` of that width).
    scaled_lr, scaled_b: ``In(DeltaSignature(L, e.bits))`` the scaled errors ``rhu(η·δ, k)``
        and (Spike Compensation) ``rhu(b·η·δ, k)`` at S2 (``update.lr_delta`` /
        ``sc_lr_b_delta`` set, Linear stages only).
    weights: ``Out(LaneWeightsSignature(L, ŵ operand bits, w operand bits))`` the MACs' ŵ and
        ``w`` operands at S2 (``weight_operand`` bits each, else ``what_bits`` / ``w.bits``).
    write_back: ``Out(ValidSignature(write_back_layout(L, w.bits, u.bits, w_prev)))``
        ``(w′, u′[, w_prev′ = w])`` at the write stage, valid in backward passes (padding lanes
        masked).
    saturated: ``Out(2·L)`` clamp flags ``u′`` of lane 0, ``w′`` of lane 0, ``u′`` of lane 1, …
        (each high for one cycle per clamp).

    Raises ValueError for a write stage before ``update_stage``, one seed per lane missing, or
    an unknown rounding.
    """

    def __init__(
        self,
        pipeline: SlotPipelineSignature,
        *,
        lanes: int,
        live_last: int,
        formats: StageFormats,
        update: UpdateConstants,
        x_operand_bits: int,
        what_bits: int,
        update_stage: int,
        rounding: str,
        lfsr: LFSRConfig,
        shift_add: Callable[[int], bool],
        gradient_bits: int | None = None,
        weight_operand: QFormat | None = None,
        low_piece: Callable[[int, int], int] | None = None,
        operand_registers: int = 0,
        momentum_in_logic: bool = False,
        columns: int = 1,
    ) -> None:
        P = operand_registers
        if lanes % columns:
            raise ValueError(f"{lanes} lanes are not whole rows of {columns} column lanes")
        self.k, self.rows = columns, lanes // columns
        self.momentum_in_logic = momentum_in_logic
        if pipeline.depth < update_stage or update_stage != 4 + int(update.sc) + P:
            raise ValueError(
                f"update stage {update_stage} (write stage {pipeline.depth}) does not match the "
                f"pipeline (4, 5 with Spike Compensation, + {P} operand registers)"
            )
        if len(lfsr.seeds) != lanes:
            raise ValueError(f"{len(lfsr.seeds)} LFSR seeds for {lanes} lanes")
        if rounding not in ("stochastic", "nearest_even"):
            raise ValueError(f"unknown rounding {rounding!r}")
        self.pipeline, self.L, self.live_last = pipeline, lanes, live_last
        self.f, self.up, self.xb, self.what_bits = formats, update, x_operand_bits, what_bits
        self.update_stage, self.rounding, self.lfsr = update_stage, rounding, lfsr
        self.P = P
        self.shift_add, self.gradient_bits = shift_add, gradient_bits
        self.low_piece = low_piece or (lambda value, bits: 0)
        self.w_prev = bool(update.lwp_horizon) and update.lwp_form == "w"
        f, wp = formats, self.w_prev
        self.wo = weight_operand
        self.k_wop = 0 if weight_operand is None else f.w.frac - weight_operand.frac
        wh_bits = what_bits if weight_operand is None else weight_operand.bits
        wg_bits = f.w.bits if weight_operand is None else weight_operand.bits
        linear = gradient_bits is None
        self.e_lr = update.lr_delta if linear else None
        self.e_b = update.sc_lr_b_delta if linear and update.sc else None
        members = {
            "slots": In(
                pipeline.subset(
                    stages=tuple(range(1, pipeline.depth + 1)), flags=("fwd_train", "bwd")
                )
            ),
            "read": In(WeightReadSignature(lanes, f.w.bits, f.u.bits, wp)),
            "operands": In(StashOperandsSignature(x_operand_bits, columns)),
            "delta": In(DeltaSignature(lanes, gradient_bits or f.d.bits)),
            "weights": Out(LaneWeightsSignature(lanes, wh_bits, wg_bits)),
            "write_back": Out(ValidSignature(write_back_layout(lanes, f.w.bits, f.u.bits, wp))),
            "saturated": Out(2 * lanes),
        }
        if gradient_bits is not None:
            del members["operands"]
        if self.e_lr is not None:
            members["scaled_lr"] = In(DeltaSignature(lanes, self.e_lr.bits))
        if self.e_b is not None:
            members["scaled_b"] = In(DeltaSignature(lanes, self.e_b.bits))
        super().__init__(members)

    def _terms(
        self, m: Module, lane: int, d2, xb2, c_lr, c_wd, wd, first=(), e=None
    ) -> list[tuple]:
        """``(product, fraction bits)`` of ``[first…,] c_lr·δ·x, c_wd·w`` with the zero
        constants left out; ``first``, ``wd``: the terms of a constant product
        (:meth:`_s2_product`) with their fraction bits; ``e``: ``(scaled error at S2, its
        format)`` or ``(…, e before its registers, x before its registers, name)`` — the product is
        then ``e·x`` (numerics §5.3), in the DSP block's registers where :meth:`_dsp` holds."""
        f = self.f
        out = list(first)
        if e is not None:
            if len(e) > 2 and self._dsp(e[2], e[3]):  # (…, the operands before their registers)
                out.append((self._product(m, e[2], e[3], e[4], lane), e[1].frac + f.x.frac))
            else:
                out.append((e[0] * xb2, e[1].frac + f.x.frac))
        elif c_lr.value:
            if xb2 is None:  # a summed gradient P on δ (convolution)
                dx = const_mul(c_lr.value, d2, self.shift_add)
            elif self.shift_add(c_lr.value):
                dx = const_mul(c_lr.value, d2 * xb2, self.shift_add)
            else:
                dx = const_mul(c_lr.value, d2, self.shift_add) * xb2
            out.append((dx, c_lr.frac + f.d.frac + f.x.frac))
        if c_wd.value:
            out += wd
        return out

    def _s2_product(
        self, m: Module, lane: int, v: list, value: int, x1, x2, name: str, frac: int
    ) -> list[tuple]:
        """The terms ``(expression, fraction bits)`` of ``value · x`` (fraction bits ``frac``)
        at S2 for the operand ``x`` read at S1 (``x1``) and registered at S2 (``x2``):
        :func:`~.arith.const_mul` of ``x2``; or with a low piece (``lo`` =
        ``low_piece(value, bits)`` > 0) two terms, the multiplier of ``x2``'s top bits (its
        fraction ``frac − lo``: the product of ``x[lo:]`` is ``value·x[lo:]·2^lo``) and
        ``value · x[:lo]``, a select-add formed at S1 from ``x1`` and registered with the
        same enable as ``x2`` (so it is always ``value · x2[:lo]``, exactly) — with operand
        registers formed at S2 from ``x2`` into the operand register (*derived*, timing: at
        32,10 on the ULX3S the weight bank's DP16KD → the select-add → its register was among
        the paths over 11.1 ns, 830 endpoints, docs/boards.md §4.2). Each term gets
        its own S3 register and S3 adds them into U: the multiplier's output goes straight to
        its register (*derived*, timing: at 32,10 on the ULX3S the DSP blocks sit across the
        die from the lane's adders, and the path u2 → DSP → the adder with the select-add →
        the term register was 18.3 ns with 11.7 ns of routing)."""
        if name == "mom" and self.momentum_in_logic and value not in (0, 1):
            # shifts and adders over the P operand-register cycles, into the term register
            return [(pipelined_const_mul(m, value, x2, self.P, f"{name}l_{lane}"), frac)]
        bits = x2.shape().width
        lo = self.low_piece(value, bits)
        c = const_operand(value)
        if not lo:
            if value not in (0, 1) and not self.shift_add(value) and self._dsp(c, x2):
                return [(self._product(m, c, x2, name, lane), frac)]
            x2 = delayed(m, x2, f"{name}a_{lane}", self.P)
            return [(const_mul(value, x2, self.shift_add), frac)]
        if self.P:  # formed at S2 from the register x2, into the operand register beside x2's
            low2 = delayed(m, select_add(value, x2[:lo]), f"{name}loa_{lane}", self.P)
        else:
            low1 = select_add(value, x1[:lo])
            low2 = Signal(low1.shape(), name=f"{name}lo2_{lane}")
            with m.If(v[1]):
                m.d.sync += low2.eq(low1)
        if self._dsp(c, x2[lo:].as_signed()):
            return [(self._product(m, c, x2[lo:].as_signed(), name, lane), frac - lo), (low2, frac)]
        x2 = delayed(m, x2, f"{name}a_{lane}", self.P)
        return [(c * x2[lo:].as_signed(), frac - lo), (low2, frac)]

    def _dsp(self, a, b) -> bool:
        """Whether ``a · b`` takes the DSP block's own registers
        (:func:`~pipetrain.hdl.dsp.in_dsp`: P = 1 or 2 on the ECP5, 18-bit operands)."""
        return in_dsp(self._platform, self.P, a, b)

    def _product(self, m: Module, a, b, name: str, lane: int) -> _Registered:
        """``a · b`` (:meth:`_dsp` holds) through the MULT18X18D's input and output registers
        (P = 2: and one fabric register after them): a :class:`_Registered` term, which
        :meth:`_products` does not register again."""
        out = Signal((Value.cast(a) * Value.cast(b)).shape(), name=f"{name}p_{lane}")
        registered_product(
            m,
            self._platform,
            a,
            b,
            registers=self.P,
            out=out,
            names=(f"{name}ca_{lane}", f"{name}a_{lane}"),
        )
        return _Registered(out)

    def elaborate(self, platform) -> Module:
        m = Module()
        self._platform = platform
        sp, ws = self.slots, self.pipeline.depth
        v = [None] + [slot_at(sp, s).valid for s in range(1, ws + 1)]
        flags, lanes_live = [], []
        for lane in range(self.L):
            live = self._live(lane)
            lanes_live.append(live(ws))
            w2, u2 = self._operands(m, lane, v)
            u_terms, v_terms, w3 = self._products(m, lane, v, w2, u2)
            new_u, new_w, lane_flags = self._update(m, lane, v, live, u_terms, v_terms, w3)
            flags += lane_flags
            us = self.update_stage
            new = [new_u, new_w]
            if self.w_prev:  # the old w, carried S3+P → update stage: the new w_prev
                old = w3
                for k in range(3 + self.P, us):
                    r = Signal.like(w3, name=f"wp{k + 1}_{lane}")
                    with m.If(v[k]):
                        m.d.sync += r.eq(old)
                    old = r
                new.append(old)
            # registers up to the write stage: the write data registered before the weight
            # banks (operand registers), the parity of single-port memories
            for k in range(ws - us):
                delayed = [Signal.like(x, name=f"{x.name}_d") for x in new]
                with m.If(v[us + k]):
                    m.d.sync += [d.eq(x) for d, x in zip(delayed, new, strict=True)]
                new = delayed
            m.d.comb += [
                self.write_back.payload.u[lane].eq(new[0]),
                self.write_back.payload.w[lane].eq(new[1]),
            ]
            if self.w_prev:
                m.d.comb += self.write_back.payload.w_prev[lane].eq(new[2])
        m.d.comb += [
            self.write_back.valid.eq(v[ws] & sp.bwd),
            self.write_back.payload.lanes.eq(Cat(*lanes_live)),
            self.saturated.eq(Cat(*flags)),
        ]
        return m

    def _x(self, lane: int) -> Value:
        """The backward ``x`` operand of physical lane ``lane`` (its column lane's)."""
        if self.k == 1:
            return self.operands.x_bwd
        return self.operands.x_bwd[lane // self.rows]

    def _live(self, lane: int):
        """``live(s)``: lane ``lane``'s row exists for the slot at stage ``s`` (a padding lane
        is dead in the last row group)."""
        if lane % self.rows < self.live_last:
            return lambda s: 1
        return lambda s: ~slot_at(self.slots, s).payload.last_group

    def _operands(self, m: Module, lane: int, v: list) -> tuple[Signal, Signal]:
        """S1 → S2: ``(w, u)`` and ŵ registered; ŵ and ``w`` out to the MAC lanes. ŵ is exact in
        ``what_bits`` (``v`` form ``w − H·u``, ``w`` form ``w + H·(w − w_prev)``)."""
        f, up, sp = self.f, self.up, self.slots
        w1, u1 = self.read.w[lane], self.read.u[lane]
        w2 = Signal(signed(f.w.bits), name=f"w2_{lane}")
        u2 = Signal(signed(f.u.bits), name=f"u2_{lane}")
        with m.If(v[1]):
            m.d.sync += [w2.eq(w1), u2.eq(u1)]
        k = self.k_wop
        # The operands' rounding rhu(·, k) is formed at S2 from the registered exact value, not
        # at S1 after the weight bank's read (the same integers; timing, *derived*: the ULX3S's
        # critical path at lanes 2,4 was the DP16KD's output, 5.6 ns, → rhu's carry chain →
        # the operand register, 12.1 ns; the S2 multiplies take the rounding before them)
        wg2 = w2  # the input-gradient operand: w itself, or rhu(w, k) (numerics §5.2)
        if k:
            wg2 = wire(m, rhu(w2, k)[: self.wo.bits].as_signed(), f"wg2_{lane}")
        wh2 = wg2  # without LWP the forward weight is w itself: one register, not two
        if up.lwp_horizon:
            H = up.lwp_horizon
            if self.w_prev:
                step = wire(m, w1 - self.read.w_prev[lane], f"wstep1_{lane}")  # w.bits + 1
                lo = self.low_piece(H, f.w.bits + 1)
                pred = w1 + const_mul(H, step, self.shift_add, lo)
            else:
                pred = w1 - const_mul(H, u1, self.shift_add, self.low_piece(H, f.u.bits))
            what1 = Mux(sp.fwd_train, pred, w1)
            # exact ŵ: the expression's own width when it is rounded at S2, else what_bits
            what2 = Signal(what1.shape() if k else signed(self.what_bits), name=f"what2_{lane}")
            with m.If(v[1]):
                m.d.sync += what2.eq(what1)
            wh2 = what2  # the forward operand (numerics §3.2), rounded to the operand format
            if k:
                wh2 = wire(m, rhu(what2, k)[: self.wo.bits].as_signed(), f"wh2_{lane}")
        m.d.comb += [self.weights.w_hat[lane].eq(wh2), self.weights.w[lane].eq(wg2)]
        return w2, u2

    def _products(self, m: Module, lane: int, v: list, w2: Signal, u2: Signal):
        """S2: the terms of U (and V with SC) as registers, read at S3 only — without enables,
        so Yosys can absorb them into DSP output registers; ``w`` carried to S3. ``m·u``,
        ``c_wd·w``: :meth:`_s2_product` (a low piece's select-add from S1)."""
        f, up, P = self.f, self.up, self.P
        # the variable operands, registered P times more right before the multipliers (the
        # constant products' operands in _s2_product); "S2"/"S3" below are then S2+P/S3+P
        d2 = delayed(m, self.delta.delta[lane], f"da_{lane}", P)
        xb2 = None
        if self.gradient_bits is None:
            xb2 = delayed(m, self._x(lane), f"xba_{lane}", P)
        w3 = Signal(signed(f.w.bits), name=f"w3_{lane}")
        with m.If(v[2]):
            m.d.sync += w3.eq(w2)
        for k in range(P):  # w carried to S3+P
            wk = Signal(signed(f.w.bits), name=f"w{4 + k}_{lane}")
            with m.If(v[3 + k]):
                m.d.sync += wk.eq(w3)
            w3 = wk
        u1, w1 = self.read.u[lane], self.read.w[lane]
        mom = self._s2_product(
            m, lane, v, up.momentum.value, u1, u2, "mom", up.momentum.frac + f.w.frac
        )
        e_lr = e_b = None
        # the operands before their registers, for a product in the DSP block's own (a
        # convolution's update has no x operand here: its gradient is summed, numerics §5)
        xb = self._x(lane) if self.gradient_bits is None else None

        def raw(e, name: str) -> tuple:
            return () if xb is None else (e, xb, name)

        if self.e_lr is not None:
            e = self.scaled_lr.delta[lane]
            e_lr = (delayed(m, e, f"ela_{lane}", P), self.e_lr, *raw(e, "elx"))
        if self.e_b is not None:
            e = self.scaled_b.delta[lane]
            e_b = (delayed(m, e, f"eba_{lane}", P), self.e_b, *raw(e, "ebx"))
        u_terms, v_terms = [], []
        wd = []
        if up.lr_wd.value:
            wd = self._s2_product(
                m, lane, v, up.lr_wd.value, w1, w2, "wd", up.lr_wd.frac + f.w.frac
            )
        for n, (expr, frac) in enumerate(
            self._terms(m, lane, d2, xb2, up.lr, up.lr_wd, wd, mom, e_lr)
        ):
            u_terms.append((self._term_register(m, expr, f"ut{n}_{lane}"), frac))
        if up.sc:
            c = up.sc_lr_wd_b.value
            fc = up.sc_lr_wd_b.frac + f.w.frac
            vwd = self._s2_product(m, lane, v, c, w1, w2, "vwd", fc) if c else []
            for n, (expr, frac) in enumerate(
                self._terms(m, lane, d2, xb2, up.sc_lr_b, up.sc_lr_wd_b, vwd, e=e_b)
            ):
                v_terms.append((self._term_register(m, expr, f"vt{n}_{lane}"), frac))
        return u_terms, v_terms, w3

    @staticmethod
    def _term_register(m: Module, expr, name: str) -> Value:
        """The S3 register of a term: ``expr`` registered (no enable), or a
        :class:`_Registered` product itself (its register is the DSP block's)."""
        if isinstance(expr, _Registered):
            return expr.value
        r = Signal(expr.shape(), name=name)
        m.d.sync += r.eq(expr)
        return r

    def _update(self, m: Module, lane: int, v: list, live, u_terms, v_terms, w3):
        """S3: U and u′ with the lane's LFSR draw (backward slots only), w′ without SC (S4
        registers); with SC, :meth:`_spike_compensation`. Returns ``(u′, w′, clamp flags)``."""
        f, up, cfg, P = self.f, self.up, self.lfsr, self.P
        R = cfg.round_bits
        upd3 = v[3 + P] & self.slots.bwd
        m.submodules[f"lfsr{lane}"] = lf = LFSR(cfg.poly, cfg.width, cfg.leap, cfg.seeds[lane])
        m.d.comb += lf.draw.eq(upd3)
        # a balanced adder tree (integers: the order is free; ⌈log2 n⌉ adders deep)
        U = tree_sum([align(r, frac, up.frac_u) for r, frac in u_terms])
        ku = up.frac_u - f.w.frac
        ur = wire(m, round_upd(U, ku, lf.next[:R], self.rounding, R), f"ur_{lane}")
        upd_live = upd3 & live(3 + P)
        if up.sc:
            uq, uc = sat(ur, f.u)
            uq = wire(m, uq, f"uq_{lane}")
            return self._spike_compensation(m, lane, v, live, lf, uq, uc & upd_live, w3, v_terms)
        # S3 → S4: the rounded U and w registered, with sat(w − max_u) and sat(w − min_u) (the
        # w′ of a clamped u′, formed at S3 beside U); S4: u′ = sat(U) and w′ = sat(w − U) from
        # the unclamped U's low bits, picked by the clamp sides (one carry chain and the
        # reductions of sat_sides a stage; *derived*, timing only: the same integers)
        ur4 = Signal(ur.shape(), name=f"ur4_{lane}")
        w4 = Signal(signed(f.w.bits), name=f"w4_{lane}")
        live4 = Signal(name=f"live4_{lane}")
        wc_hi, wc_lo = sat(w3 - f.u.max_int, f.w), sat(w3 - f.u.min_int, f.w)
        w_hi4, s_hi4 = Signal(signed(f.w.bits), name=f"whi4_{lane}"), Signal(name=f"shi4_{lane}")
        w_lo4, s_lo4 = Signal(signed(f.w.bits), name=f"wlo4_{lane}"), Signal(name=f"slo4_{lane}")
        with m.If(v[3 + P]):
            m.d.sync += [ur4.eq(ur), w4.eq(w3), live4.eq(upd_live)]
            m.d.sync += [w_hi4.eq(wc_hi[0]), s_hi4.eq(wc_hi[1])]
            m.d.sync += [w_lo4.eq(wc_lo[0]), s_lo4.eq(wc_lo[1])]
        hi, lo = sat_sides(ur4, f.u)
        uq, uc = sat(ur4, f.u)
        u4 = wire(m, uq, f"u4_{lane}")
        wm, sm = sat(wire(m, w4 - ur4[: f.u.bits].as_signed(), f"wd_{lane}"), f.w)
        wq = Mux(hi, w_hi4, Mux(lo, w_lo4, wm))
        wc = Mux(hi, s_hi4, Mux(lo, s_lo4, sm))
        return u4, wire(m, wq, f"w4q_{lane}"), [v[4 + P] & uc & live4, v[4 + P] & wc & live4]

    def _spike_compensation(
        self, m: Module, lane: int, v: list, live, lf, uq, u_clamp, w3, v_terms
    ):
        """S3 → S4: u′, w, the V terms and the draw's upper bits registered; S4: ``V`` and
        ``w′ = sat(w − round_upd(V))``, registered at S5."""
        f, up, R, P = self.f, self.up, self.lfsr.round_bits, self.P
        u4 = Signal(signed(f.u.bits), name=f"u4_{lane}")
        w4 = Signal(signed(f.w.bits), name=f"w4_{lane}")
        rw4 = Signal(self.lfsr.width - R, name=f"rw4_{lane}")
        us4 = Signal(name=f"us4_{lane}")
        with m.If(v[3 + P]):
            m.d.sync += [u4.eq(uq), w4.eq(w3), rw4.eq(lf.next[R:]), us4.eq(u_clamp)]
        a = up.sc_a.value  # a·u′: its low piece (if any) beside the multiplier, at S4
        au = const_mul(a, u4, self.shift_add, self.low_piece(a, f.u.bits))
        V = align(au, up.sc_a.frac + f.w.frac, up.frac_v)
        for r, frac in v_terms:
            r4 = Signal(r.shape(), name=f"{r.name}_4")
            with m.If(v[3 + P]):
                m.d.sync += r4.eq(r)
            V = V + align(r4, frac, up.frac_v)
        dw = round_upd(V, up.frac_v - f.w.frac, rw4[:R], self.rounding, R)
        wq, wc = sat(wire(m, w4 - dw, f"wd_{lane}"), f.w)
        u5 = Signal(signed(f.u.bits), name=f"u5_{lane}")
        w5 = Signal(signed(f.w.bits), name=f"w5_{lane}")
        ws5 = Signal(name=f"ws5_{lane}")
        with m.If(v[4 + P]):
            m.d.sync += [u5.eq(u4), w5.eq(wq), ws5.eq(wc & self.slots.bwd & live(4 + P))]
        return u5, w5, [v[4 + P] & us4, v[5 + P] & ws5]
