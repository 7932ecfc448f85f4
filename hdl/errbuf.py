"""The error buffer of a stage: the error ``g`` at its output, double-buffered, and δ per lane.

``gbuf`` holds two halves of ``row_groups`` words of ``L`` values (``d`` format). The next
stage's input gradient (or the loss unit's δ) arrives serially, one value a beat: the ``k``-th
beat since the half was last filled is ``g_k``, stored in lane ``k mod L`` of word ``k div L`` of
the half the tick controller names; ``M`` beats fill it. A loss unit with ``out_lanes`` = B
writes B values a beat (``Stage.error_beat``; B divides L): beat ``b`` holds ``g_{b·B}`` …
``g_{b·B+B−1}``, lanes ``b·B mod L`` … of word ``b·B div L``; ``⌈M/B⌉`` beats fill the half.
The pass reads the other half, the word of the slot's row group at S0. At S1 each lane forms
``δ = f′(z)·g`` from the stashed mask bit (``tanh``/``sigmoid``: the stashed output y;
docs/numerics.md §5) — 0 in padding lanes of the last row group and in passes without a
backward item — registered at S2.

Under the interlocking ``sum`` rule (docs/numerics.md §5.6) the main update stream's buffer adds
the δ of the stage's earlier update streams at S1 (``addend<k>``: from a
:class:`DeltaStash`, or the S1 δ of a stream arriving in the same tick, ``early``) and clamps
the sum to ``d`` (counted once per row: at column 0). :class:`DeltaStash` keeps an earlier
stream's δ of each sample, one word per stash entry and row group, until the main stream reads
it.

Source: docs/architecture.md §3 (double-buffered error buffer), docs/numerics.md §5 (δ), §5.6
(the δ sum); the serial write order, the δ memory and the pipeline are *derived*.
"""

from __future__ import annotations

from functools import partial

from amaranth import Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..compiler.plan import QFormat
from .activation import Activation
from .arith import rhu, sat, wire
from .dsp import in_dsp, registered_product
from .streams import (
    DeltaSignature,
    ErrorHalvesSignature,
    MaskReadSignature,
    SlotPipelineSignature,
    ValidSignature,
    error_layout,
    slot_at,
)

__all__ = ["DeltaStash", "ErrorBuffer"]


class ErrorBuffer(wiring.Component):
    """Double-buffered error ``g`` and the per-lane δ of each slot.

    Parameters
    ----------
    pipeline: the pass's slot pipeline (row groups).
    lanes: L.
    out_features: M (errors per sample; the last row group has ``M − (G−1)·L`` live lanes).
    d_format: Q-format of ``g`` and δ.
    activation: the stage's :class:`~pipetrain.hdl.activation.Activation` (its derivative).
    addends: δ values of other streams added at S1 (the ``sum`` rule; 0: none).
    early: also give the S1 δ (``early``) for another buffer's same-tick sum.
    scales: ``(c, k, bits)`` per scaled error ``e = rhu(c·δ, k)`` of the update's δ
        (docs/numerics.md §5.3: the learning-rate products' ``e``, so ``e·x`` is one
        multiplier level at S2); ``bits`` holds it unclamped (the compiler's
        ``scaled_error_format``).
    at_write: form the scaled errors once per error as it is written — ``rhu(c·g, k)``, one
        ``c·g`` multiplier per scale for the buffer, kept in ``sbuf`` beside ``gbuf`` and gated
        by the activation's mask at S1 — instead of ``rhu(c·δ, k)`` in every lane from the S1
        δ (the compiler's ``errors_scaled_at_write``: ``relu``/``identity`` without
        ``addends``, where both give the same integers).
    beat: B, values a write (``Stage.error_beat``; divides L): ``write`` carries
        ``error_layout(d.bits, B)``, and the scaled errors at the write take B multipliers
        per scale.
    register_write: (``at_write``) register ``g`` before both buffers: the writer's value is
        not a register output (an input gradient's ``sat(rhu(Σ))`` at S4); the ``gbuf`` write
        then lands one cycle after ``g`` arrives instead of with it, and the ``sbuf`` write
        two instead of one (three on the ECP5, where ``c·g`` is a MULT18X18D with its input
        register after ``g``'s fabric one).
    operand_register: (``at_write`` without ``register_write``: the writer's ``g`` is a
        register output, the loss unit's) ``c·g`` takes one operand register before its
        product register (:func:`~pipetrain.hdl.dsp.registered_product` with one register: on
        the ECP5 the MULT18X18D's input register, elsewhere a fabric one — the same cycles), so
        the ``sbuf`` write lands two cycles after ``g`` instead of one: timing, *derived* —
        mlp-digits 32,10 on the ULX3S had the loss-fed buffer's ``g`` register → 4.3 ns of
        routing → the block without registers → 3.3 ns → ``c·g``'s register as its critical
        path, 12.1 ns at 82.5 MHz (docs/boards.md §4.2). The stage sets it with operand
        registers (``Stage.operand_registers``, the ECP5 board plans).
    delta_out: build ``gbuf`` and give δ (False: with ``at_write``, when nothing reads δ —
        a stage without an input gradient whose every learning-rate product takes a scaled
        error, ``Stage.reads_delta``; ``delta`` is then 0).

    Members
    -------
    write: ``In(ValidSignature(error_layout(d.bits, B)))`` serial error, B values a beat
        (one: ``signed(d.bits)``; cannot stall).
    halves: ``In(ErrorHalvesSignature())`` half written / read this tick.
    slots: ``In(pipeline.subset(S0, S1; bwd))``.
    mask: ``In(MaskReadSignature(L·stash_bits))`` the stashed ``z > 0`` bits at S1
        (``tanh``/``sigmoid``: the outputs y, ``activation.stash_bits`` = y.bits per lane).
    delta: ``Out(DeltaSignature(L, d.bits))`` δ per lane at S2 (this stream's own: its input
        gradient's; 0 without ``delta_out``).
    addend0 … addend{n−1}: ``In(DeltaSignature(L, d.bits))`` (``addends`` > 0) δ per lane of
        an earlier update stream of this slot's row group at S1 (0 where it did not run).
    total: ``Out(DeltaSignature(L, d.bits))`` (``addends`` > 0) ``sat(δ + Σ addend, d)`` per
        lane at S2, the update's δ (docs/numerics.md §5.6).
    saturated: ``Out(L)`` (``addends`` > 0) per lane: the δ sum clamped (a one-cycle pulse,
        once per row and pass, only in a pass with a backward item; padding lanes 0).
    early: ``Out(DeltaSignature(L, d.bits))`` (``early``) δ per lane at S1, combinational.
    scaled0 … scaled{n−1}: ``Out(DeltaSignature(L, bits))`` (``scales``) ``rhu(c·δ, k)`` per
        lane at S2, of the update's δ (``total`` with ``addends``, else ``delta``).

    The write of ``gbuf`` lands with its ``g``, one cycle after it with ``register_write`` and
    ``at_write``;
    the write of ``sbuf`` one cycle after its ``g`` (``c·g`` registered, then rounded),
    two with ``operand_register``, two with ``register_write`` (three on the ECP5): an input
    gradient's last value leaves at
    S4+P of the second-to-last slot of a pass (S5+P when its sum across lanes is split,
    :func:`~pipetrain.compiler.build.gin_stage`; P the operand registers), at least 3
    cycles before the pass ends (that slot + 1 + 2 + ``write_stage``, ``write_stage`` ≥
    4 + 2P: 3 + P − the split cycles), and the reading pass reads it at S0 of its first slot,
    after the tick's ``TICK_OVERHEAD`` control cycles and its start pulse, so the three cycles
    land in time; the loss unit's δ (a register) ends ``TICK_OVERHEAD`` cycles before the
    tick, so its two cycles land in time (``tests/test_rtl_short_tick.py``: a loss unit that
    ends on the tick, with operand registers, bit-exact). The read never sees a half-written word
    (*derived*; the RTL-vs-golden tests cover both schedules, one row group included).

    Raises ValueError unless ``(G−1)·L < M ≤ G·L`` and B divides L, or for ``at_write`` with
    ``addends`` or an activation whose derivative is not a mask.
    """

    def __init__(
        self,
        pipeline: SlotPipelineSignature,
        *,
        lanes: int,
        out_features: int,
        d_format: QFormat,
        activation: Activation,
        addends: int = 0,
        early: bool = False,
        scales: tuple[tuple[int, int, int], ...] = (),
        at_write: bool = False,
        delta_out: bool = True,
        register_write: bool = False,
        beat: int = 1,
        operand_register: bool = False,
    ) -> None:
        G = pipeline.row_groups
        if not (G - 1) * lanes < out_features <= G * lanes:
            raise ValueError(f"{out_features} rows do not fill {G} row groups of {lanes} lanes")
        if beat < 1 or lanes % beat:
            raise ValueError(f"a write of {beat} errors does not divide {lanes} lanes")
        self.beat = beat
        if at_write and (addends or activation.name not in ("relu", "identity")):
            raise ValueError(
                f"scaled errors at the write need a mask derivative (relu, identity) and no "
                f"addends, not {activation.name} with {addends} addends"
            )
        self.at_write = bool(at_write and scales)
        if not delta_out and (not self.at_write or early):
            raise ValueError(
                "only an error buffer that forms its scaled errors at the write "
                "and gives no early δ can leave δ out"
            )
        self.delta_out, self.register_write = delta_out, register_write
        self.operand_register = bool(operand_register and self.at_write and not register_write)
        self.pipeline, self.L, self.M, self.fd, self.act = (
            pipeline,
            lanes,
            out_features,
            d_format,
            activation,
        )
        self.addends, self.with_early, self.scales = addends, early, tuple(scales)
        members = {
            "write": In(ValidSignature(error_layout(d_format.bits, beat))),
            "halves": In(ErrorHalvesSignature()),
            "slots": In(pipeline.subset(stages=(0, 1), flags=("bwd",))),
            "mask": In(MaskReadSignature(lanes * activation.stash_bits)),
            "delta": Out(DeltaSignature(lanes, d_format.bits)),
        }
        for k in range(addends):
            members[f"addend{k}"] = In(DeltaSignature(lanes, d_format.bits))
        if addends:
            members["total"] = Out(DeltaSignature(lanes, d_format.bits))
            members["saturated"] = Out(lanes)
        if early:
            members["early"] = Out(DeltaSignature(lanes, d_format.bits))
        for n, (_, _, bits) in enumerate(self.scales):
            members[f"scaled{n}"] = Out(DeltaSignature(lanes, bits))
        super().__init__(members)

    def elaborate(self, platform) -> Module:
        m = Module()
        G, L, M = self.pipeline.row_groups, self.L, self.M
        sp = self.slots
        s1 = slot_at(sp, 1)
        # serial write: word gq, lane gl of the half being filled (lanes gl·B … with B values
        # a beat: gl counts blocks of B lanes)
        B = self.beat
        gq = Signal(range(max(G, 2)))
        gl = Signal(range(max(L // B, 2)))
        last_lane = (M - 1) % L // B
        wr = self.write
        with m.If(wr.valid):
            with m.If((gq == G - 1) & (gl == last_lane)):
                m.d.sync += [gq.eq(0), gl.eq(0)]
            with m.Elif(gl == L // B - 1):
                m.d.sync += [gq.eq(gq + 1), gl.eq(0)]
            with m.Else():
                m.d.sync += gl.eq(gl + 1)
        waddr = wire(m, Mux(self.halves.write, G, 0) + gq, "waddr")
        # S0: read the slot's row group's word; S1: δ (and e) per lane; S2: registered
        raddr = wire(m, Mux(self.halves.read, G, 0) + slot_at(sp, 0).payload.group, "raddr")
        g_in = wr.payload if B == 1 else Value.cast(wr.payload)  # B values, d.bits each
        written = (wr.valid, waddr, gl, g_in)
        if self.register_write and self.at_write:  # timing, *derived*: the writer's g is not
            # a register output (an input gradient's sat(rhu(Σ)) at S4). -deep on the ULX3S had
            # stage 3's gin rounding and clamp → stage 2's c·g → its register as the critical
            # path (16.5 ns), then with c·g's own registers stage 3's gsum4 → rounding and
            # clamp → stage 2's gbuf write data (LUT RAM), 11.6 ns at 86.5 MHz
            # (docs/boards.md §4.2): both buffers take g from one register, so gbuf lands one
            # cycle after g
            written = self._registered(m, written, "w")
        grd = self._gbuf(m, *written, raddr) if self.delta_out else None
        e_bits = sum(bits for _, _, bits in self.scales)
        srd = self._scaled_at_write(m, platform, written, raddr, e_bits) if self.at_write else None
        live_last = M - (G - 1) * L  # lanes ≥ this are padding in the last row group
        for lane in range(L):
            mb = self.act.stash_bits
            stashed = self.mask.bits[lane] if mb == 1 else self.mask.bits.word_select(lane, mb)
            live = sp.bwd
            if lane >= live_last:
                live = live & ~s1.payload.last_group
            if grd is not None:
                g = grd.data.word_select(lane, self.fd.bits).as_signed()
                self._delta_lane(m, lane, g, stashed, live)
            if srd is not None:  # e of g from sbuf, gated like δ (mask·rhu(c·g, k)) at S1
                e_word = srd.data.word_select(lane, e_bits)
                lo = 0
                for n, (_, _, bits) in enumerate(self.scales):
                    eg = e_word[lo : lo + bits].as_signed()
                    lo += bits
                    e2 = Signal(signed(bits), name=f"e{n}_2_{lane}")
                    with m.If(s1.valid):
                        m.d.sync += e2.eq(Mux(live, self.act.derivative(stashed, eg), 0))
                    m.d.comb += getattr(self, f"scaled{n}").delta[lane].eq(e2)
        return m

    @staticmethod
    def _registered(m: Module, values: tuple, tag: str) -> tuple[Signal, ...]:
        """``values`` through one register each, named ``sbuf_<tag><n>``."""
        regs = tuple(Signal.like(x, name=f"sbuf_{tag}{n}") for n, x in enumerate(values))
        m.d.sync += [r.eq(x) for r, x in zip(regs, values, strict=True)]
        return regs

    def _values(self, g) -> list:
        """The B values of a write (``g`` itself for one)."""
        B, bits = self.beat, self.fd.bits
        return [g] if B == 1 else [g.word_select(t, bits).as_signed() for t in range(B)]

    def _gbuf(self, m: Module, valid, waddr, wlane, g, raddr):
        """``gbuf``: each write's ``g`` (with ``valid``; B values) written into lane block
        ``wlane`` (lanes ``wlane·B`` …) of word ``waddr``; read at S0 at ``raddr``. Returns the
        read port (data at S1)."""
        G, L, fd, B = self.pipeline.row_groups, self.L, self.fd, self.beat
        m.submodules.gbuf = gm = Memory(shape=L * fd.bits, depth=2 * G, init=[])
        grd, gwr = gm.read_port(), gm.write_port(granularity=fd.bits)
        m.d.comb += [
            gwr.addr.eq(waddr),
            gwr.data.eq(Cat(*(self._values(g) * (L // B)))),
            grd.addr.eq(raddr),
        ]
        for lane in range(L):
            m.d.comb += gwr.en[lane].eq(valid & (wlane == lane // B))
        return grd

    def _delta_lane(self, m: Module, lane: int, g, stashed, live) -> None:
        """Lane ``lane``'s δ = f′(z)·g at S1 (``early``), registered at S2 (``delta``); the
        ``sum`` rule's total; the scaled errors ``rhu(c·δ, k)`` formed in the lane."""
        fd, s1 = self.fd, slot_at(self.slots, 1)
        dl = wire(m, self.act.derivative(stashed, g), f"dl_{lane}")  # used twice: one copy
        d1 = wire(m, Mux(live, dl, 0), f"d1_{lane}")
        if self.with_early:
            m.d.comb += self.early.delta[lane].eq(d1)
        d2 = Signal(signed(fd.bits), name=f"d2_{lane}")
        with m.If(s1.valid):
            m.d.sync += d2.eq(d1)
        m.d.comb += self.delta.delta[lane].eq(d2)
        raw1 = dl  # the update's δ before its gating (the scaled errors gate after the product)
        if self.addends:  # the sum rule: δ + the earlier streams' δ, clamped once
            total = dl
            for k in range(self.addends):
                total = total + getattr(self, f"addend{k}").delta[lane]
            t1, clamped = sat(total, fd)
            upd1, raw1 = wire(m, Mux(live, t1, 0), f"t1_{lane}"), t1
            t2 = Signal(signed(fd.bits), name=f"t2_{lane}")
            flag = Signal(name=f"dsat_{lane}")
            with m.If(s1.valid):
                m.d.sync += t2.eq(upd1)
            m.d.sync += flag.eq(s1.valid & live & clamped & (s1.payload.col == 0))
            m.d.comb += [self.total.delta[lane].eq(t2), self.saturated[lane].eq(flag)]
        if self.at_write:
            return
        for n, (c, k, bits) in enumerate(self.scales):  # e = rhu(c·δ, k), numerics §5.3
            # the product c·δ registered at S2, gated after the multiplier, and rounded at
            # S2 (rhu(c·0, k) = 0: the same integers). Timing, *derived*: the ULX3S's
            # critical path at lanes 2,4 was bwd / the stashed mask → gate → c·δ → rhu's
            # carry chain in one cycle (12.0 / 12.2 ns); S1 now ends at the product and
            # S2's rounding sits before the update's e·x, which has the cycle to itself
            raw = raw1 * c
            p2 = Signal(raw.shape(), name=f"e{n}_p2_{lane}")
            with m.If(s1.valid):
                m.d.sync += p2.eq(Mux(live, raw, 0))
            e2 = wire(m, rhu(p2, k)[:bits].as_signed(), f"e{n}_2_{lane}")
            m.d.comb += getattr(self, f"scaled{n}").delta[lane].eq(e2)

    def _scaled_at_write(self, m: Module, platform, written: tuple, raddr, e_bits: int):
        """``sbuf``: ``rhu(c·g, k)`` of each scale for every ``written = (valid, addr, lane,
        g)`` (already registered once with ``register_write``) — ``c·g`` registered (one
        multiplier per scale, no enable: a DSP output register), rounded the cycle after and
        written with the address and lane of its ``g`` (held with it); read at S0 at
        ``gbuf``'s address. Returns the read port (data at S1)."""
        G, L = self.pipeline.row_groups, self.L
        m.submodules.sbuf = sm = Memory(shape=L * e_bits, depth=2 * G, init=[])
        srd, swr = sm.read_port(), sm.write_port(granularity=e_bits)
        registered = partial(self._registered, m)
        valid, addr, lane_w, g = written
        # on the ECP5 c·g takes the MULT18X18D's input register after g's fabric one, and c·g's
        # register is the block's output register (hdl/dsp.py; one cycle more): the -deep
        # 16,8,8,4 critical path at 78.1 MHz was stage 2's fabric g register → 4.6 ns of
        # routing → the block without registers → 3.8 ns → c·g's register, 12.8 ns
        # (docs/boards.md §4.2)
        consts = [Const(c) for c, _, _ in self.scales]
        dsp = self.register_write and all(in_dsp(platform, 1, g, c) for c in consts)
        # g's fabric register before the block's: with the block's input register alone the
        # path was stage 3's gsum4 → its rounding and clamp → 4.1 ns of routing → stage 2's
        # MULT18X18D, 11.6 ns (-deep 16,8,8,4, 86.0 MHz); a loss-fed g (operand_register) is
        # a register already and goes straight into the operand register, on any platform
        dsp = dsp or self.operand_register
        if dsp:
            valid, addr, lane_w = registered((valid, addr, lane_w), "x")
        valid1, addr1, lane1 = registered((valid, addr, lane_w), "p")
        B = self.beat
        words = []  # per value of the write: its scaled errors, one multiplier each
        for t, gv in enumerate(self._values(g)):
            es = []
            for n, (c, k, bits) in enumerate(self.scales):
                raw = gv * c
                p1 = Signal(raw.shape(), name=f"e{n}_p1" + (f"_{t}" if B > 1 else ""))
                if dsp:
                    names = (f"sbuf_w{n}" + (f"_{t}" if B > 1 else ""), "")
                    registered_product(m, platform, gv, consts[n], registers=1, out=p1, names=names)
                else:
                    m.d.sync += p1.eq(raw)
                es.append(rhu(p1, k)[:bits])
            words.append(Cat(*es))
        m.d.comb += [
            swr.addr.eq(addr1),
            swr.data.eq(Cat(*(words * (L // B)))),
            srd.addr.eq(raddr),
        ]
        for lane in range(L):
            m.d.comb += swr.en[lane].eq(valid1 & (lane1 == lane // B))
        return srd


class DeltaStash(wiring.Component):
    """The δ of one earlier update stream (the ``sum`` rule, docs/numerics.md §5.6) of each
    sample, kept until the stage's main update stream reaches that sample.

    ``dsum`` holds ``entries × row_groups`` words of ``L`` values (``d`` format), addressed like
    the mask memory: ``base + group`` with the item's mask base. A pass in which the earlier
    stream runs writes its δ of row group ``g`` (at S2, column 0; every slot of a group has
    the same δ); the main stream's pass reads its item's word at S0 (used at S1). The two
    items are different samples, so the read and the write never meet (*derived*).

    Parameters
    ----------
    pipeline: the pass's slot pipeline (row groups).
    lanes: L.
    depth: words (``Stage.stash_entries × row_groups``).
    d_format: Q-format of δ.

    Members
    -------
    slots: ``In(pipeline.subset(S0, S2; bwd))`` (``bwd``: the earlier stream runs this pass).
    write: ``In(DeltaSignature(L, d.bits))`` the earlier stream's δ at S2.
    write_base: ``In(range(depth))`` mask base of the earlier stream's item.
    read_base: ``In(range(depth))`` mask base of the main stream's item.
    stored: ``Out(DeltaSignature(L, d.bits))`` that item's stored δ at S1.
    """

    def __init__(
        self, pipeline: SlotPipelineSignature, *, lanes: int, depth: int, d_format: QFormat
    ) -> None:
        self.pipeline, self.L, self.depth, self.fd = pipeline, lanes, depth, d_format
        super().__init__(
            {
                "slots": In(pipeline.subset(stages=(0, 2), flags=("bwd",))),
                "write": In(DeltaSignature(lanes, d_format.bits)),
                "write_base": In(range(depth)),
                "read_base": In(range(depth)),
                "stored": Out(DeltaSignature(lanes, d_format.bits)),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        L, fd, sp = self.L, self.fd, self.slots
        m.submodules.dsum = mem = Memory(shape=L * fd.bits, depth=self.depth, init=[])
        rd, wr = mem.read_port(), mem.write_port()
        s0, s2 = slot_at(sp, 0), slot_at(sp, 2)
        m.d.comb += [
            rd.addr.eq(self.read_base + s0.payload.group),
            wr.addr.eq(self.write_base + s2.payload.group),
            wr.data.eq(Cat(*(self.write.delta[lane] for lane in range(L)))),
            wr.en.eq(s2.valid & sp.bwd & (s2.payload.col == 0)),
        ]
        for lane in range(L):
            m.d.comb += self.stored.delta[lane].eq(rd.data.word_select(lane, fd.bits).as_signed())
        return m
