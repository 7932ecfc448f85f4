"""The MAC lanes of a stage: the forward MACs and the input-gradient sum across lanes.

**Forward** (:class:`ForwardLanes`, docs/numerics.md §2): lane ``l`` accumulates
``Σ_i ŵ_ji·x_i`` over the columns of its row ``j = g·L + l`` (the bias column N last, with the
bias input), lane-local; after column N, ``z_j = sat(rhu(acc, w.frac + x.frac − y.frac), y)``
at S4 from the sum registered at S3, the activation gives ``a_j``, and the row group's ``L``
activations leave as one word at S4 (with the ``z > 0`` bits for the stash's mask;
``tanh``/``sigmoid``: ``z`` is formed at S3, where it reads the ROM of
:class:`~pipetrain.hdl.activation.LUTActivation`, and the mask is the output ``y`` itself).

**Input gradient** (:class:`InputGradient`, docs/numerics.md §5): in slot ``(g, i)`` the lanes'
products ``w_ji·δ_j`` are summed across lanes (a balanced adder tree); with several row groups the
partial sums of column ``i`` are accumulated in a small memory (``gacc``, read at S1 through a
register, added and written at S3) and finalised in the last group:
``gin_i = sat(rhu(Σ_j w_ji·δ_j, w.frac + d.frac − gin.frac), gin)`` (rounded and clamped at S4,
from the sum registered at S3), sent serially ``i = 0..N−1`` to the previous stage's error
buffer. With operand registers and more than ``TREE_SPLIT_LANES`` lanes
(:func:`~pipetrain.compiler.build.input_gradient_split`)
the tree is registered half-way, ⌈levels/2⌉ levels into partial-sum registers, and every step
after it is one stage later (``gacc`` read one stage later too, ``gin`` at S5+P, still before
the write stage 4 + 2P, so no pass gets longer). *Derived*, timing only: -wide 10×2,22,2's
22-lane tree was its critical path on the ULX3S (docs/boards.md §4.2).

Products are registered without enables (S2 → S3): S3 reads them exactly one cycle after a valid
S2, and without an enable Yosys can absorb them into the DSP blocks' output registers (iCE40
SB_MAC16; Yosys does not pack ECP5 MULT18X18D registers). With ``Stage.operand_registers`` = 1
the operands are registered once more per lane right before the multiplier (no enable either),
and the product, the sums and the outputs come one stage later (S3 → S4, S4 → S5); on the
ECP5 both registers are the MULT18X18D's own (:func:`~pipetrain.hdl.dsp.registered_product`).
With ``Stage.operand_registers`` = P = 2 the product passes one more register (on the ECP5 a
fabric register after the block's output register) and everything after it is two stages later.

With operand registers (P ≥ 1) every lane has its own copies of the forward accumulator's
controls — "first column" and "slot valid" at S3+P, registered from S2+P (the slot pipeline is
lockstep without enables, so they are the S3+P values exactly): one shared ``col == 0`` decode
fanned out to every lane's accumulator was the mlp-digits 32,10 critical path on the ULX3S
(S3+P's ``col`` → the decode → 4.5 + 2.8 ns of routing to the 32 lanes' ``facc``, 72.7 MHz at
a 90 MHz constraint). *Derived*, timing only: the same values in every cycle.

With k column lanes (``Stage.col_lanes``) row ``l``'s products come from the k physical lanes
``s·L + l`` (ŵ of lane ``s·L + l``, operand ``x[s]``) and are summed (a balanced adder tree)
before the row's accumulator: with P = 2 in one more register stage (every later forward
stage one later, the outputs at S6+P ≤ the write-back stage 4+2P, so the pass is not longer;
*derived*, timing only), else in the accumulator's cycle.

Source: docs/architecture.md §3 (lane-local forward, adder tree across lanes, §3.5 column
lanes), docs/numerics.md §2, §5 (the arithmetic); the pipeline is *derived*.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..compiler.build import gin_stage
from ..compiler.plan import QFormat
from .activation import Activation, LUTActivation
from .arith import delayed, rhu, rhu_offset, rhu_offset_shift, sat, tree_sum, wire
from .dsp import registered_product
from .streams import (
    DeltaSignature,
    LaneWeightsSignature,
    SlotPipelineSignature,
    StashOperandsSignature,
    ValidSignature,
    mask_layout,
    slot_at,
    word_layout,
)

__all__ = ["ForwardLanes", "InputGradient"]


class ForwardLanes(wiring.Component):
    """The forward MAC of every lane, the output rounding and the activation.

    Parameters
    ----------
    pipeline: the pass's slot pipeline (N, row groups).
    lanes: L.
    live_last: lanes live in the last row group (padding lanes never count a clamp).
    acc_bits: forward accumulator width (``Stage.acc_fwd_bits``).
    w_format, x_format, y_format: Q-formats of ``w``, ``x`` and the output ``y``.
    what_bits: width of ŵ. x_operand_bits: width of the ``x`` operand.
    activation: the stage's :class:`~pipetrain.hdl.activation.Activation`.
    operand_registers: P = 0, 1 or 2 (``Stage.operand_registers``): ŵ and ``x`` registered P
        times more per lane before the multiplier; the product, the accumulation and the
        output then come P stages later (S3+P, S4+P), and the outputs are registered once more
        (S5+P). With P ≥ 1 each lane registers its own "first column" and "valid" of S3+P from
        S2+P (module docstring).
    columns: k, column lanes (``Stage.column_lanes``): L·k weights and k ``x`` operands a
        slot, each row's k products summed before its accumulator (one register stage more
        with P = 2: the accumulation at S4+P, the outputs at S6+P).

    Members
    -------
    slots: ``In(pipeline.subset(S3+P, S4+P; fwd))``, with S2+P too when P ≥ 1 (each one
        later with k > 1 and P = 2).
    operands: ``In(StashOperandsSignature(x_operand_bits, k))`` the forward ``x`` at S2.
    weights: ``In(LaneWeightsSignature(L·k, what_bits, w.bits))`` ŵ at S2.
    y: ``Out(ValidSignature(word_layout(row_groups, L·y.bits)))`` the activations of row group
        ``word`` (lane ``l`` in bits ``l·y.bits …``), valid at S4 of the group's bias slot in
        forward passes, S5+P with operand registers (P ≥ 1; cannot stall).
    mask_write: ``Out(ValidSignature(mask_layout(row_groups, L·stash_bits)))`` the ``z > 0``
        bits (``tanh``/``sigmoid``: the ``L`` outputs, y.bits each), with ``y``.
    saturated: ``Out(L)`` per lane: ``z`` clamped (one cycle, with ``y``; padding lanes 0).
    """

    def __init__(
        self,
        pipeline: SlotPipelineSignature,
        *,
        lanes: int,
        live_last: int,
        acc_bits: int,
        w_format: QFormat,
        x_format: QFormat,
        y_format: QFormat,
        what_bits: int,
        x_operand_bits: int,
        activation: Activation,
        operand_registers: int = 0,
        columns: int = 1,
    ) -> None:
        self.pipeline, self.L, self.live_last, self.acc_bits = pipeline, lanes, live_last, acc_bits
        self.fw, self.fx, self.fy = w_format, x_format, y_format
        self.what_bits, self.act = what_bits, activation
        self.P = P = operand_registers
        self.k = columns
        #: the stages after the products: one later when the k-sum has its own register
        self.A = A = P + (1 if columns > 1 and P >= 2 else 0)
        G = pipeline.row_groups
        stages = (2 + A, 3 + A, 4 + A) if P else (3, 4)  # S2+A: the lanes' control copies
        super().__init__(
            {
                "slots": In(pipeline.subset(stages=stages, flags=("fwd",))),
                "operands": In(StashOperandsSignature(x_operand_bits, columns)),
                "weights": In(LaneWeightsSignature(lanes * columns, what_bits, w_format.bits)),
                "y": Out(ValidSignature(word_layout(G, lanes * y_format.bits))),
                "mask_write": Out(ValidSignature(mask_layout(G, lanes * activation.stash_bits))),
                "saturated": Out(lanes),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        N = self.pipeline.in_features
        L, fw, fx, fy = self.L, self.fw, self.fx, self.fy
        sp, P, A, k = self.slots, self.P, self.A, self.k
        # "S3"/"S4" below: the stages after the product, P later with operand registers (A:
        # one more with the k-sum's register)
        s3, s4 = slot_at(sp, 3 + A), slot_at(sp, 4 + A)
        first3 = s3.payload.col == 0
        fire3 = s3.valid & sp.fwd & (s3.payload.col == N)
        fire4 = Signal()
        m.d.sync += fire4.eq(fire3)
        zsh = fw.frac + fx.frac - fy.frac
        # the accumulator starts from rhu's offset h, so z = sat(rhu(Σ)) = sat((h + Σ) >> zsh):
        # the output's rounding is a bit slice, not a carry chain between facc and the clamp
        # (*derived*, timing: mlp-digits 32,10's ULX3S critical path at 85.2 MHz was stage 1's
        # facc → the rounding's carry chain → the clamp → the output register, 11.7 ns). The
        # sum bound |Σ| ≤ (N+1)·2^(ŵ+x−2) ≤ 2^(acc−3) leaves room for h ≤ 2^(acc−3).
        h = rhu_offset(zsh)
        if zsh > self.acc_bits - 2:
            raise ValueError(
                f"forward rounding by {zsh} bits needs an accumulator of at least {zsh + 2} "
                f"bits, got {self.acc_bits}: widen Stage.acc_fwd_bits"
            )
        acts, masks, flags = [], [], []
        lut = None
        if self.act.uses_lut:  # read at S3 with z, the output at S4
            m.submodules.act = lut = LUTActivation(L, self.act.lut, fy)
            m.d.comb += lut.en.eq(fire3)
        products = []
        for p in range(L * k):  # S2: ŵ·x of every physical lane
            pf3 = Signal(signed(self.what_bits + fx.bits + 1), name=f"pf3_{p}")
            registered_product(
                m,
                platform,
                self.weights.w_hat[p],
                self.operands.x_fwd if k == 1 else self.operands.x_fwd[p // L],
                registers=P,
                out=pf3,
                names=(f"wa_{p}", f"xa_{p}"),
            )
            products.append(pf3)
        for lane in range(L):
            # S3: accumulate, round and saturate after the bias column
            term = products[lane]
            if k > 1:  # row lane's k products (physical lanes s·L + lane)
                term = tree_sum([products[s * L + lane] for s in range(k)])
                if A > P:  # in a register of their own (no enable: lockstep)
                    reg = Signal(signed(self.acc_bits), name=f"pk_{lane}")
                    m.d.sync += reg.eq(term)
                    term = reg
            facc = Signal(signed(self.acc_bits), name=f"facc_{lane}")
            fsum = Signal(signed(self.acc_bits), name=f"fsum_{lane}")
            first, valid = first3, s3.valid
            if P:  # the lane's own copies of S3+P's controls, registered from S2+P
                s2 = slot_at(sp, 2 + A)
                # init: S3+P's reset payload has col = 0 (the pipeline's registers reset to 0)
                first = Signal(init=1, name=f"first3_{lane}")
                valid = Signal(name=f"v3_{lane}")
                m.d.sync += [first.eq(s2.payload.col == 0), valid.eq(s2.valid)]
            m.d.comb += fsum.eq(Mux(first, h, facc) + term)
            with m.If(valid):
                m.d.sync += facc.eq(fsum)
            if lut is not None:
                # tanh/sigmoid: z = sat(rhu(Σ)) at S3 addresses the ROM; y and the mask at S4
                zv, zc = sat(wire(m, rhu_offset_shift(fsum, zsh), f"zr_{lane}"), fy)
                if lane >= self.live_last:
                    zc = zc & ~s3.payload.last_group
                zs4 = Signal(name=f"zs4_{lane}")
                with m.If(fire3):
                    m.d.sync += zs4.eq(zc)
                flags.append(fire4 & zs4)
                m.d.comb += lut.z[lane].eq(zv)
                acts.append(lut.y[lane])
                masks.append(lut.y[lane])
                continue
            # S4: z = sat(rhu(Σ)) from the sum registered at S3 (facc holds h + the bias slot's
            # sum in the cycle after it), the activation and the mask bit
            zv, zc = sat(wire(m, rhu_offset_shift(facc, zsh), f"zr_{lane}"), fy)
            if lane >= self.live_last:
                zc = zc & ~s4.payload.last_group
            z4 = wire(m, zv, f"z4_{lane}")
            flags.append(fire4 & zc)
            acts.append(self.act.forward(z4)[: fy.bits])
            masks.append(z4 > 0)
        outputs = [
            (self.y.valid, fire4),
            (self.y.payload.word, s4.payload.group),
            (self.y.payload.data, Cat(*acts)),
            (self.mask_write.valid, fire4),
            (self.mask_write.payload.group, s4.payload.group),
            (self.mask_write.payload.bits, Cat(*masks)),
            (self.saturated, Cat(*flags)),
        ]
        # With operand registers the outputs are registered once more (S5+P, no enable: the
        # values of S4+P one cycle later): the rounding's carry chain, the clamp and the
        # activation feed a register instead of the next stage's stash write data, the
        # mlp-digits 32,10 critical path on the ULX3S at 86.2 MHz (docs/boards.md §4.2).
        # S5+P ≤ the write-back stage 4+2P, so the pass is not longer (derived).
        domain = m.d.sync if P else m.d.comb
        domain += [port.eq(value) for port, value in outputs]
        return m


class InputGradient(wiring.Component):
    """The input gradient ``gin_i = Σ_j w_ji·δ_j`` of a stage, serial ``i = 0..N−1``.

    Parameters
    ----------
    pipeline: the pass's slot pipeline (N, row groups).
    lanes: L.
    acc_bits: accumulator width (``Stage.acc_bwd_bits``).
    w_format, d_format, gin_format: Q-formats of ``w``, δ and the output ``gin``.
    operand_registers: P = 0, 1 or 2 (``Stage.operand_registers``): ``w`` and δ registered P
        times more per lane before the multiplier; the sums and ``gin`` P stages later. With
        P ≥ 1 the sum register's enable is its own copy of S3+P's valid, from S2+P, and with
        more than ``compiler.build.TREE_SPLIT_LANES`` lanes the sum across lanes is split
        (:func:`~pipetrain.compiler.build.input_gradient_split`):
        partial sums registered at S3+P, their sum (and ``gacc``'s) at S4+P, ``gin`` one stage
        later (S5+P).

    Members
    -------
    slots: ``In(pipeline.subset(S1+P, S2+P, S3+P; bwd))`` (S1+P: ``gacc``'s read address).
    weights: ``In(LaneWeightsSignature(L, what_bits, w.bits))`` ``w`` at S2.
    delta: ``In(DeltaSignature(L, d.bits))`` δ at S2.
    gin: ``Out(ValidSignature(signed(gin.bits)))`` ``gin_i`` in column order, valid at S4+P
        (S5+P when split: :func:`~pipetrain.compiler.build.gin_stage`) of the last row
        group's slots ``i < N`` in backward passes (cannot stall).
    saturated: ``Out(1)`` ``gin`` clamped (one cycle, with ``gin``).

    Raises NotImplementedError for fewer than 4 inputs with several row groups (the ``gacc``
    write of column ``i`` would race its read for the next group).
    """

    def __init__(
        self,
        pipeline: SlotPipelineSignature,
        *,
        lanes: int,
        acc_bits: int,
        w_format: QFormat,
        d_format: QFormat,
        gin_format: QFormat,
        what_bits: int,
        operand_registers: int = 0,
    ) -> None:
        N, G = pipeline.in_features, pipeline.row_groups
        if G > 1 and N < 4:
            self._MustUse__silence = True  # not built: no "created but never used" warning
            raise NotImplementedError(
                f"N={N} < 4 inputs with {G} row groups would race the input-gradient "
                "accumulator memory; use lanes = out_features"
            )
        self.pipeline, self.L, self.acc_bits = pipeline, lanes, acc_bits
        self.fw, self.fd, self.fg = w_format, d_format, gin_format
        self.P = P = operand_registers
        super().__init__(
            {
                "slots": In(pipeline.subset(stages=(1 + P, 2 + P, 3 + P), flags=("bwd",))),
                "weights": In(LaneWeightsSignature(lanes, what_bits, w_format.bits)),
                "delta": In(DeltaSignature(lanes, d_format.bits)),
                "gin": Out(ValidSignature(signed(gin_format.bits))),
                "saturated": Out(1),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        N, G = self.pipeline.in_features, self.pipeline.row_groups
        L, fw, fd, fg = self.L, self.fw, self.fd, self.fg
        sp, P = self.slots, self.P
        # "S2"/"S3" below: the product's stage and the one after it, P later with operand
        # registers
        s2, s3 = slot_at(sp, 2 + P), slot_at(sp, 3 + P)
        # S2: w·δ per lane; S3: sum across lanes, a balanced adder tree (⌈log2 L⌉ levels; the
        # integers are exact, so the order is free) + the partial sum of earlier row groups
        terms = []
        for lane in range(L):
            pg3 = Signal(signed(fw.bits + fd.bits), name=f"pg3_{lane}")
            registered_product(
                m,
                platform,
                self.weights.w[lane],
                self.delta.delta[lane],
                registers=P,
                out=pg3,
                names=(f"wga_{lane}", f"da_{lane}"),
            )
            terms.append(pg3)
        # rhu's offset h where it costs no adder level: the first group's partial sum (G > 1) or
        # a leaf of a tree whose depth it keeps (L not a power of two); gin's rounding is then a
        # bit slice at S4 (*derived*, timing, as ForwardLanes' facc). Otherwise rounded at S4.
        gsh = fw.frac + fd.frac - fg.frac
        h = rhu_offset(gsh)
        offset = h and gsh <= self.acc_bits - 2 and (G > 1 or L & (L - 1) != 0)
        if offset and G == 1:
            terms.append(Const(h))
        X = gin_stage(L, P) - (4 + P)  # 1: the tree registered half-way, one stage more on
        if X:  # ⌈levels/2⌉ levels into registers at S3+P, the rest (and gacc's add) at S4+P
            k = 1 << -(-(len(terms) - 1).bit_length() // 2)
            parts = []
            for n, i in enumerate(range(0, len(terms), k)):
                part = Signal(signed(self.acc_bits), name=f"gpart_{n}")
                m.d.sync += part.eq(tree_sum(terms[i : i + k]))
                parts.append(part)
            terms = parts
        gsum = tree_sum(terms)
        gnew = Signal(signed(self.acc_bits))
        col3 = s3.payload.col
        first3 = s3.payload.group == 0
        last3 = s3.payload.group == G - 1
        live3 = s3.valid & sp.bwd & (col3 != N)  # a column's sum (not the bias slot's)
        gsum_en = s3.valid
        if P:  # timing, *derived*: S3+P's controls from their own registers, loaded from S2+P
            # (S3+P is S2+P one cycle later), beside the accumulator: -deep on the ULX3S had
            # stage 3's slot pipeline (its bwd flag and S3+P column, 8.9 ns of routing across
            # the die) → the column compare → gacc's write enable (LUT RAM), 12.2 ns at
            # 82.0 MHz (docs/boards.md §4.2); with the split tree one register more each (the
            # slot pipeline is lockstep: no enables)
            c2, g2 = s2.payload.col, s2.payload.group
            col3 = delayed(m, c2, "gcol3", 1 + X)
            first3 = delayed(m, g2 == 0, "gfirst3", 1 + X)
            last3 = delayed(m, g2 == G - 1, "glast3", 1 + X)
            live3 = delayed(m, s2.valid & sp.bwd & (c2 != N), "glive3", 1 + X)
            # the sum register's enable: its own copy of S3+P's valid (as ForwardLanes' lanes)
            gsum_en = delayed(m, s2.valid, "gv3", 1 + X)
        if G > 1:
            # the partial sum of column i is read at S1 (address; S2 when split), leaves the
            # memory a stage later and is registered once more (no enable: the slot pipeline is
            # lockstep), arriving where it is added (no pipeline copies). The write of the same
            # column is a whole row (N ≥ 4 slots) later than its read, so the read one stage
            # earlier still sees the previous group's sum. *Derived*, timing only: -wide
            # 6×3,22,2 on the ULX3S had gacc in block RAM, whose DP16KD output (no output
            # register) → the adder's carry chain → gin was the critical path, 14.7 ns at
            # 68.0 MHz (docs/boards.md §4.2).
            m.submodules.gacc = am = Memory(shape=signed(self.acc_bits), depth=N, init=[])
            ard, awr = am.read_port(), am.write_port()
            gprev3 = Signal(signed(self.acc_bits), name="gprev3")
            m.d.sync += gprev3.eq(ard.data)
            m.d.comb += [
                ard.addr.eq(slot_at(sp, 1 + P + X).payload.col),
                gnew.eq(Mux(first3, h if offset else 0, gprev3) + gsum),
                awr.en.eq(live3),
                awr.addr.eq(col3),
                awr.data.eq(gnew),
            ]
        else:
            m.d.comb += gnew.eq(gsum)
        # S3 → S4: the sum registered; S4: gin = sat(rhu(Σ)) (the rounding out of S3's adders)
        gin_en4 = Signal()
        gsum4 = Signal(signed(self.acc_bits))
        gin_live = live3 & last3 if P else s3.valid & sp.bwd & last3 & (col3 != N)
        m.d.sync += gin_en4.eq(gin_live)
        with m.If(gsum_en):
            m.d.sync += gsum4.eq(gnew)
        rounded = rhu_offset_shift(gsum4, gsh) if offset else rhu(gsum4, gsh)
        gv, gc = sat(wire(m, rounded, "ginr"), fg)
        m.d.comb += [
            self.gin.valid.eq(gin_en4),
            self.gin.payload.eq(gv),
            self.saturated.eq(gin_en4 & gc),
        ]
        return m
