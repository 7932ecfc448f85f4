"""The input stash of a stage: the stashed inputs ``x`` and the ReLU mask of its samples.

* ``xstash``: ``entries`` sample entries of ``x_words = ⌈N/Lw⌉`` words, each ``Lw`` values of
  ``x`` (``Lw`` = the writer's lanes, 1 for stage 1). Written by the previous stage's forward
  output (or the host) at ``bases.write + word``; read twice per slot — by the forward item and
  by the backward item — at ``base + ⌊i/Lw⌋``, lane ``i mod Lw`` of the word picked at S1.
  Column N is the bias input ``2^x.frac`` instead. The operands are registered at S2 (with
  ``early_read`` the words are read a cycle ahead, at addresses formed from registers only, and
  registered at S1, before the pick). After a convolution stage (``plane`` = its pooled
  positions P′) a word holds ``Lw`` channels of one position: column ``i = c·P′ + q`` is word
  ``(c div Lw)·P′ + q``, lane ``c mod Lw``.
  With k column lanes (``Stage.col_lanes``; the host writes the stash, ``Lw`` = 1) ``xstash``
  is k banks ``xstash0 … xstash{k−1}``: word ``w`` lives in bank ``w mod k`` at
  ``base + w div k`` (each bank has the whole entry geometry, so the tick controller's bases
  serve every bank without a division; *derived*), and slot ``t`` reads all k at
  ``base + t``: operand ``s`` is column ``t·k + s`` — the bias input in column N (sub-lane
  ``N mod k`` of the last slot), 0 in the padding columns above N.
* ``mask``: ``entries × row_groups`` words of ``L·mask_bits`` bits, the ``z > 0`` bits of the
  forward item (``tanh``/``sigmoid``: its outputs ``y``, ``mask_bits`` = y.bits; written at
  S4), read for the backward item's row group at S0 (used at S1) — and, on a stage with
  pass-through streams (interlocking), once more per stream, for that stream's item.

The entry allocation (which entry a base points to) is the tick controller's; the stash has
``stash_depth + 1`` entries, the extra one being written while the pass runs (*derived*: it
replaces a separate double buffer).

Source: docs/architecture.md §3 (stash, lanes), docs/numerics.md §2 (bias column); the word
packing and the pipeline are *derived*.
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..compiler.plan import QFormat
from .streams import (
    MaskReadSignature,
    SlotPipelineSignature,
    StashBasesSignature,
    StashOperandsSignature,
    ValidSignature,
    mask_layout,
    slot_at,
    word_layout,
)

__all__ = ["InputStash"]


class InputStash(wiring.Component):
    """The ``x`` stash and the mask memory of one stage, and the ``x`` operands of each slot.

    Parameters
    ----------
    pipeline: the pass's slot pipeline (N, row groups).
    lanes: L (mask bits per row group).
    entries: sample entries (``Stage.stash_entries``).
    x_lanes: Lw, values per stash word.
    x_words: words per entry, ⌈N/Lw⌉.
    x_format: Q-format of ``x``.
    x_operand_bits: width of the operands (``Stage.x_operand_bits``: one more than ``x`` when
        the bias input does not fit it).
    mask_bits: bits per lane of the mask (``Stage.mask_bits``: 1, or y.bits for
        ``tanh``/``sigmoid``).
    plane: 1, or the writer's pooled positions P′ when it is a convolution stage (its
        channel-word layout; ``compiler/conv.py:stash_words``).
    extra: pass-through streams (one more mask read port each; 0 without interlocking).
    columns: k, column lanes (``Stage.column_lanes``); with k > 1 the pipeline's N is the last
        slot of a group, ``C − 1``, and ``inputs`` is the stage's N.
    inputs: N, the stage's inputs (default the pipeline's N).
    early_read: with ``Lw`` > 1, read each slot's words a cycle ahead (at the counters' next
        values, in the cycle before the slot is at S0) and register them at S1, so the lane
        pick starts from a register, not from the memory's output (the same operands at S2;
        ``compiler.build.early_stash_read``: with operand registers and a block-RAM stash).
        The bases are the pass's from its start pulse on, and the first slot issues the cycle
        after it (``SlotSequencer``), so the first early read sees them. *Derived*, timing
        only: the -wide 10×2,22,2 ULX3S critical path at 82.5 MHz was stage 2's DP16KD
        output, 5.8 ns, → the 10-lane pick → the operand register, 12.1 ns (docs/boards.md
        §4.2); registering the words at S2 and picking after them instead put the pick
        between a register and 44 multiplier inputs across the die (81.2 MHz).

    Members
    -------
    write: ``In(ValidSignature(word_layout(x_words, Lw·x.bits)))`` stash write at
        ``bases.write + word``.
    bases: ``In(StashBasesSignature(entries·x_words, entries·row_groups))``.
    slots: ``In(pipeline.subset(S0, S1; start))``.
    mask_write: ``In(ValidSignature(mask_layout(row_groups, L·mask_bits)))`` the forward item's
        mask bits, at ``bases.fwd_mask + group``.
    operands: ``Out(StashOperandsSignature(x_operand_bits, k))`` ``x`` operands at S2.
    mask: ``Out(MaskReadSignature(L·mask_bits))`` the backward item's mask bits at S1.
    extra_bases: ``In(range(entries·row_groups)).array(extra)`` (``extra`` > 0) mask address
        of each pass-through stream's item; ``extra_masks``:
        ``Out(MaskReadSignature(L·mask_bits)).array(extra)`` its mask bits at S1.

    Raises ValueError if ``x_words`` ≠ ⌈N/Lw⌉ (⌈N/(P′·Lw)⌉·P′ after a convolution), the
    operand is narrower than ``x``, or k > 1 with ``Lw`` or ``P′`` > 1 or a pipeline of other
    than ⌈(N + 1)/k⌉ slots a group.
    """

    def __init__(
        self,
        pipeline: SlotPipelineSignature,
        *,
        lanes: int,
        entries: int,
        x_lanes: int,
        x_words: int,
        x_format: QFormat,
        x_operand_bits: int,
        mask_bits: int = 1,
        extra: int = 0,
        plane: int = 1,
        columns: int = 1,
        inputs: int | None = None,
        early_read: bool = False,
    ) -> None:
        N = pipeline.in_features if inputs is None else inputs
        G = pipeline.row_groups
        if columns > 1 and (x_lanes != 1 or plane != 1):
            raise ValueError(f"{columns} column lanes need one value a stash word (Lw = P′ = 1)")
        if pipeline.in_features != -(-(N + 1) // columns) - 1:
            raise ValueError(
                f"pipeline of {pipeline.in_features + 1} slots a group ≠ ⌈({N}+1)/{columns}⌉"
            )
        if x_words != -(-N // (plane * x_lanes)) * plane:
            raise ValueError(f"x_words {x_words} ≠ ⌈{N}/({plane}·{x_lanes})⌉·{plane}")
        if x_operand_bits < x_format.bits:
            raise ValueError(f"x operand of {x_operand_bits} bits cannot hold {x_format}")
        self.pipeline = pipeline
        self.L, self.P, self.Lw, self.kx = lanes, entries, x_lanes, x_words
        self.mb = lanes * mask_bits
        self.fx, self.xb = x_format, x_operand_bits
        self.x_depth, self.m_depth = entries * x_words, entries * G
        self.extra, self.plane = extra, plane
        self.N, self.k = N, columns
        self.early_read = early_read and x_lanes > 1
        members = {
            "write": In(ValidSignature(word_layout(x_words, x_lanes * x_format.bits))),
            "bases": In(StashBasesSignature(self.x_depth, self.m_depth)),
            "slots": In(pipeline.subset(stages=(0, 1), flags=("start",))),
            "mask_write": In(ValidSignature(mask_layout(G, self.mb))),
            "operands": Out(StashOperandsSignature(x_operand_bits, columns)),
            "mask": Out(MaskReadSignature(self.mb)),
        }
        if extra:
            members["extra_bases"] = In(range(self.m_depth)).array(extra)
            members["extra_masks"] = Out(MaskReadSignature(self.mb)).array(extra)
        super().__init__(members)

    def elaborate(self, platform) -> Module:
        m = Module()
        sp, b = self.slots, self.bases
        s0 = slot_at(sp, 0)
        m.submodules.mask = mm = Memory(shape=self.mb, depth=self.m_depth, init=[])
        mrd, mwr = mm.read_port(), mm.write_port()
        m.d.comb += [
            mwr.en.eq(self.mask_write.valid),
            mwr.addr.eq(b.fwd_mask + self.mask_write.payload.group),
            mwr.data.eq(self.mask_write.payload.bits),
            mrd.addr.eq(b.bwd_mask + s0.payload.group),
            self.mask.bits.eq(mrd.data),
        ]
        for e in range(self.extra):  # pass-through streams: their items' mask bits
            rd = mm.read_port()
            m.d.comb += [
                rd.addr.eq(self.extra_bases[e] + s0.payload.group),
                self.extra_masks[e].bits.eq(rd.data),
            ]
        if self.k > 1:
            self._column_operands(m)
        else:
            self._operands(m)
        return m

    def _operands(self, m: Module) -> None:
        """One ``x`` memory; slot ``(g, i)`` reads column ``i`` (word ``⌊i/Lw⌋``, lane
        ``i mod Lw``; positions first after a convolution)."""
        N = self.pipeline.in_features
        Lw, fx = self.Lw, self.fx
        sp, b, op = self.slots, self.bases, self.operands
        s1 = slot_at(sp, 1)

        m.submodules.xstash = xm = Memory(shape=Lw * fx.bits, depth=self.x_depth, init=[])
        xrf, xrb, xwp = xm.read_port(), xm.read_port(), xm.write_port()
        m.d.comb += [
            xwp.en.eq(self.write.valid),
            xwp.addr.eq(b.write + self.write.payload.word),
            xwp.data.eq(self.write.payload.data),
        ]

        # S0: word q = ⌊i/Lw⌋ and lane sel = i mod Lw of the issuing column
        if self.early_read:
            sel0 = self._early_addresses(m, xrf, xrb)
        else:
            sel0 = self._counters(m, xrf, xrb)
        xf_word, xb_word = xrf.data, xrb.data
        if self.early_read:  # the words of S0's slot read in the cycle before, registered at S1
            xf_word = Signal.like(xrf.data, name="xwf1")
            xb_word = Signal.like(xrb.data, name="xwb1")
            m.d.sync += [xf_word.eq(xrf.data), xb_word.eq(xrb.data)]

        # S1: pick the lane, the bias input in column N; registered at S2
        sel1 = Signal.like(sel0)
        m.d.sync += sel1.eq(sel0)
        bias = 1 << fx.frac
        bias1 = s1.payload.col == N

        def pick(word):
            if Lw == 1:
                return word.as_signed()
            return word.word_select(sel1, fx.bits).as_signed()

        xf2 = Signal(signed(self.xb), name="xf2")
        xb2 = Signal(signed(self.xb), name="xb2")
        with m.If(s1.valid):
            m.d.sync += [
                xf2.eq(Mux(bias1, bias, pick(xf_word))),
                xb2.eq(Mux(bias1, bias, pick(xb_word))),
            ]
        m.d.comb += [op.x_fwd.eq(xf2), op.x_bwd.eq(xb2)]

    def _counters(self, m: Module, xrf, xrb) -> Signal:
        """S0's word ``q0`` and lane ``sel0`` (and position after a convolution writer),
        stepped by each valid slot; the memories read at ``base + q0``. Returns ``sel0``."""
        N, Lw, P = self.pipeline.in_features, self.Lw, self.plane
        sp, b = self.slots, self.bases
        s0 = slot_at(sp, 0)
        q0 = Signal(range(max(self.kx, 2)), name="q0")
        sel0 = Signal(range(max(Lw, 2)), name="sel0")
        pq = Signal(range(max(P, 2)), name="pq")
        with m.If(sp.start | (s0.valid & (s0.payload.col == N))):
            m.d.sync += [q0.eq(0), sel0.eq(0), pq.eq(0)]
        with m.Elif(s0.valid):
            if P > 1:  # positions first, then the word's lanes, then the next word
                with m.If(pq != P - 1):
                    m.d.sync += [pq.eq(pq + 1), q0.eq(q0 + 1)]
                with m.Elif(sel0 != Lw - 1):
                    m.d.sync += [pq.eq(0), sel0.eq(sel0 + 1), q0.eq(q0 - (P - 1))]
                with m.Else():
                    m.d.sync += [pq.eq(0), sel0.eq(0), q0.eq(q0 + 1)]
            elif Lw > 1:
                with m.If(sel0 == Lw - 1):
                    m.d.sync += [sel0.eq(0), q0.eq(q0 + 1)]
                with m.Else():
                    m.d.sync += sel0.eq(sel0 + 1)
            else:
                m.d.sync += q0.eq(q0 + 1)
        m.d.comb += [xrf.addr.eq(b.fwd_x + q0), xrb.addr.eq(b.bwd_x + q0)]
        return sel0

    def _early_addresses(self, m: Module, xrf, xrb) -> Signal:
        """``early_read``: the read addresses of the slot at S0 *next* cycle, formed from
        registers only — the addresses ``af``/``ab`` of S0's slot (``base + q0``, the base
        taken after column N and while idle at column 0) and flags registered a cycle ahead: S0's
        slot is column N (``last0``, from a column counter ``c0`` that follows the issue
        order, ``for g: for i in 0..N``), its lane is the word's last (``wrap0``), its
        position the plane's last (``pend0``). Returns ``sel0``. *Derived*, timing only: the
        -wide 10×2,22,2 ULX3S critical path at 89.9 MHz was S0's column → the compare with
        N → the next word → base + word → the DP16KD address, 11.1 ns; with the start
        pulse as the base select, -deep 16,8,8,4's at 89.3 MHz was the tick controller →
        ``start`` → that select → the address, 11.2 ns (docs/boards.md §4.2)."""
        N, Lw, P = self.pipeline.in_features, self.Lw, self.plane
        sp, b = self.slots, self.bases
        s0 = slot_at(sp, 0)
        sel0 = Signal(range(max(Lw, 2)), name="sel0")
        pq = Signal(range(max(P, 2)), name="pq")
        c0 = Signal(range(N + 1), name="c0")
        af = Signal(range(self.x_depth), name="af0")
        ab = Signal(range(self.x_depth), name="ab0")
        last0, wrap0, pend0 = Signal(name="last0"), Signal(name="wrap0"), Signal(name="pend0")
        zero0 = Signal(init=1, name="zero0")
        afn, abn = Signal.like(af, name="afn"), Signal.like(ab, name="abn")
        seln, pqn, c0n = Signal.like(sel0), Signal.like(pq), Signal.like(c0)
        m.d.comb += [afn.eq(af), abn.eq(ab), seln.eq(sel0), pqn.eq(pq), c0n.eq(c0)]

        def step(d: int) -> list:
            return [afn.eq(af + d), abn.eq(ab + d)] if d else []

        # the bases: taken after column N, and while no slot is at S0 with the counters at
        # zero (between passes: every pass issues whole groups), so the tick's new bases are
        # in ``afn`` at its start pulse without the pulse itself on the address path
        with m.If(Mux(s0.valid, last0, zero0)):
            m.d.comb += [afn.eq(b.fwd_x), abn.eq(b.bwd_x), seln.eq(0), pqn.eq(0), c0n.eq(0)]
        with m.Elif(s0.valid):
            m.d.comb += c0n.eq(c0 + 1)
            if P > 1:  # positions first, then the word's lanes, then the next word
                with m.If(~pend0):
                    m.d.comb += [pqn.eq(pq + 1), *step(1)]
                with m.Elif(~wrap0):
                    m.d.comb += [pqn.eq(0), seln.eq(sel0 + 1), *step(-(P - 1))]
                with m.Else():
                    m.d.comb += [pqn.eq(0), seln.eq(0), *step(1)]
            else:
                with m.If(wrap0):
                    m.d.comb += [seln.eq(0), *step(1)]
                with m.Else():
                    m.d.comb += seln.eq(sel0 + 1)
        m.d.sync += [
            af.eq(afn),
            ab.eq(abn),
            sel0.eq(seln),
            pq.eq(pqn),
            c0.eq(c0n),
            last0.eq(c0n == N),
            zero0.eq(c0n == 0),
            wrap0.eq(seln == Lw - 1),
            pend0.eq(pqn == P - 1),
        ]
        m.d.comb += [xrf.addr.eq(afn), xrb.addr.eq(abn)]
        return sel0

    def _column_operands(self, m: Module) -> None:
        """k banks (module docstring); slot ``t`` of a group reads word ``t`` of every bank,
        operand ``s`` = column ``t·k + s``."""
        k, N, fx = self.k, self.N, self.fx
        last = self.pipeline.in_features  # the group's last slot, C − 1 = N div k
        sp, b, op, wr = self.slots, self.bases, self.operands, self.write
        s0, s1 = slot_at(sp, 0), slot_at(sp, 1)
        # the write word's bank w mod k and address w div k (a table over the x_words words)
        wbank = Signal(range(k))
        wq = Signal(range(max(self.kx, 2)))
        with m.Switch(wr.payload.word):
            for w in range(self.kx):
                with m.Case(w):
                    m.d.comb += [wbank.eq(w % k), wq.eq(w // k)]
        # S0: the slot within its group
        q0 = Signal(range(max(last + 1, 2)))
        with m.If(sp.start | (s0.valid & (s0.payload.col == last))):
            m.d.sync += q0.eq(0)
        with m.Elif(s0.valid):
            m.d.sync += q0.eq(q0 + 1)
        bias, sb = 1 << fx.frac, N % k  # the bias column's sub-lane in the last slot
        last1 = s1.payload.col == last
        for s in range(k):
            xm = Memory(shape=fx.bits, depth=self.x_depth, init=[])
            m.submodules[f"xstash{s}"] = xm
            xrf, xrb, xwp = xm.read_port(), xm.read_port(), xm.write_port()
            m.d.comb += [
                xwp.en.eq(wr.valid & (wbank == s)),
                xwp.addr.eq(b.write + wq),
                xwp.data.eq(wr.payload.data),
                xrf.addr.eq(b.fwd_x + q0),
                xrb.addr.eq(b.bwd_x + q0),
            ]
            # S1: the bias input / a padding column's 0 in the last slot; registered at S2
            xf2 = Signal(signed(self.xb), name=f"xf2_{s}")
            xb2 = Signal(signed(self.xb), name=f"xb2_{s}")
            const = bias if s == sb else 0
            with m.If(s1.valid):
                if s < sb:
                    m.d.sync += [xf2.eq(xrf.data.as_signed()), xb2.eq(xrb.data.as_signed())]
                else:
                    m.d.sync += [
                        xf2.eq(Mux(last1, const, xrf.data.as_signed())),
                        xb2.eq(Mux(last1, const, xrb.data.as_signed())),
                    ]
            m.d.comb += [op.x_fwd[s].eq(xf2), op.x_bwd[s].eq(xb2)]
