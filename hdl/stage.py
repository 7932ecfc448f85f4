"""One PB pipeline stage of kind Linear: a composition of the stage parts (docs/architecture.md
§3).

Per tick the stage makes ONE pass over its weight memory (``row_groups × (N+1)`` slots, numerics
§2 order: ``for g: for i in 0..N``). In slot ``(g, i)`` lane ``l`` handles row ``j = g·L + l``
and column ``i`` (column ``N`` is the bias, input ``2^x.frac``) and does, from one read of
``(w, u)``: the forward MAC of the forward item (with ŵ under LWP), the input-gradient product of
the backward item (summed across lanes), and the momentum / Spike-Compensation update.

The parts (each its own module, connected only through the signatures of
:mod:`pipetrain.hdl.streams`):

* :class:`~pipetrain.hdl.sequencer.SlotSequencer` — issues the slots, carries each slot's
  position down the pipeline (:class:`~pipetrain.hdl.streams.SlotPipelineSignature`), ``done``;
* :class:`~pipetrain.hdl.weights.WeightStore` — per-lane ``w``/``u`` banks (dual-port or SPRAM;
  ``w_prev`` too for the LWP ``w`` form) shared with the host's weight access;
* :class:`~pipetrain.hdl.stash.InputStash` — stashed ``x`` and ReLU mask (tanh/sigmoid: the
  output y), the ``x`` operands;
* :class:`~pipetrain.hdl.errbuf.ErrorBuffer` — double-buffered ``g``, δ per lane;
* :class:`~pipetrain.hdl.update.UpdateUnit` — ŵ, momentum, SC, rounding with the lane LFSRs;
* :class:`~pipetrain.hdl.mac.ForwardLanes` / :class:`~pipetrain.hdl.mac.InputGradient` — the
  forward MACs and activation, the input gradient (stages with ``input_gradient`` only);
* :class:`~pipetrain.hdl.saturation.SaturationCounter` — the stage's clamp counter.

With k column lanes (``Stage.col_lanes``, stage 1 only) the pass has ``row_groups × C`` slots,
``C = ⌈(N+1)/k⌉``: physical lane ``s·L + l`` handles row ``g·L + l`` and column ``t·k + s``
in slot ``(g, t)``; the weight store and the update unit have L·k lanes, the stash k banks
(k operands a slot), the forward sums each row's k products, and the error buffer's L δ
(and scaled errors) go to the k lanes of their row (docs/architecture.md §3.5). The slot
pipeline then counts slots, not columns: its ``N`` is ``C − 1``.

Another stage kind (a convolution, an auxiliary head) is another composition of these parts.
Every part takes its geometry as constructor parameters, read here, in one place, from the
plan's :class:`~pipetrain.compiler.plan.Stage` (``x_lanes``, ``x_words``, ``stash_entries``,
``what_bits``, ``x_operand_bits``, ``update_stage``, ``write_stage``, ``operand_registers``,
…). A pass takes ``Stage.pass_cycles`` cycles from the start pulse to ``done``.

With ``Stage.operand_registers`` = 1 every multiplier of the forward,
input-gradient and update parts reads operands registered once more, per lane, right before
it: the products leave at S4 instead of S3 and everything after them is one stage later (the
stage numbers in the parts' docstrings are then + 1 from S3 on); with 2 (the ECP5 boards'
plans) twice, the products at S5 and the stage numbers + 2.

Source: docs/architecture.md §3 (fused pass, lane ownership, adder tree), docs/numerics.md §2–§6
(the arithmetic); the partition and the pipeline are *derived*.
"""

from __future__ import annotations

from amaranth import Cat, Module, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..compiler.build import early_stash_read, forward_stage, momentum_logic
from ..compiler.plan import Plan, Stage
from ..compiler.schedule import early_update_streams, main_stream, tick_streams
from .activation import activation_of
from .errbuf import DeltaStash, ErrorBuffer
from .graph import stage_graph
from .mac import ForwardLanes, InputGradient
from .saturation import SaturationCounter
from .sequencer import SlotSequencer
from .stash import InputStash
from .streams import (
    PassControlSignature,
    SlotPipelineSignature,
    ValidSignature,
    WeightAccessSignature,
    connect_pipeline,
    error_layout,
    word_layout,
)
from .update import LFSRConfig, UpdateUnit, scaled_error_ports, scaled_errors
from .weights import WeightStore

__all__ = ["StageUnit", "check_stage", "extra_streams", "pass_through"]


def pass_through(stage: Stage) -> tuple[int, ...]:
    """The stage's pass-through streams (interlocking learning): the losses it back-propagates
    (``grad_losses``) without updating from them (``losses``), ascending. Each runs its own
    error buffer, mask read and input gradient in the same fused pass (docs/architecture.md
    §2.4); the primary backward path carries the main update stream."""
    return tuple(t for t in sorted(stage.grad_losses) if t not in stage.losses)


def extra_streams(plan: Plan, stage: Stage) -> tuple[int, ...]:
    """Every backward stream of the stage but its main update stream
    (``compiler.schedule.main_stream`` over the tick model's delays,
    ``compiler.schedule.tick_streams``), ascending: the pass-through streams and, under the
    ``sum`` rule, the earlier update streams (``compiler.schedule.early_update_streams``). Each
    has its own error buffer, mask read port (``ctl.extra<e>``) and, when it is sent on
    (``gin_losses``), its own input gradient."""
    main = main_stream(stage.losses, tick_streams(plan.stages)[stage.index - 1])
    return tuple(t for t in sorted(stage.grad_losses or stage.losses) if t != main)


def writer_plane(plan: Plan, stage: Stage) -> int:
    """1, or the pooled positions P′ of the convolution stage that writes this stage's input
    (its output words hold channels of one position: ``compiler/conv.py:stash_words``)."""
    writer = plan.stages[stage.attach - 1] if stage.attach else None
    conv = getattr(writer, "conv", None)
    return conv.pooled_positions if conv is not None else 1


def check_stage(stage: Stage) -> None:
    """Raise NotImplementedError (naming the stage, what is missing and the way out) for a stage
    the HDL does not build: an activation other than identity/relu/leaky_relu/tanh/sigmoid (or
    a tanh/sigmoid without its LUT), fewer than 4 inputs with several row groups and an input
    gradient, or an LWP ``w`` form whose ``what_bits`` cannot hold ŵ = w + H·(w − w_prev)
    (w.bits + bitlen(H) + 1 bits, docs/architecture.md §2.2; a plan of an older compiler that
    sized ŵ from u), or column lanes on a stage other than the host-written one they are built
    for (docs/architecture.md §3.5)."""
    activation_of(stage)
    up, fw = stage.update, stage.formats.w
    if up.lwp_horizon and up.lwp_form == "w":
        need = fw.bits + up.lwp_horizon.bit_length() + 1
        if stage.what_bits < need:
            raise NotImplementedError(
                f"stage {stage.index}: LWP w form needs what_bits ≥ {need} for "
                f"w + H·(w − w_prev), the plan has {stage.what_bits}; recompile the plan"
            )
    k = stage.column_lanes
    if k > 1 and (
        stage.input_gradient
        or stage.attach
        or stage.slot_cycles != 1
        or stage.x_lanes != 1
        or tuple(stage.grad_losses or stage.losses) != tuple(stage.losses)
        or len(stage.losses) > 1
    ):
        raise NotImplementedError(
            f"stage {stage.index}: {k} column lanes are built only for a stage the host writes "
            "with dual-port memories, one update stream and no input gradient; use 1 column lane"
        )
    if stage.row_groups > 1 and stage.input_gradient and stage.in_features < 4:
        raise NotImplementedError(
            f"stage {stage.index}: N={stage.in_features} < 4 inputs with {stage.row_groups} "
            "row groups would race the input-gradient accumulator memory; use lanes = "
            "out_features"
        )


class StageUnit(wiring.Component):
    """The datapath and memories of one Linear stage (see the module docstring).

    Parameters
    ----------
    plan: the design plan (rounding, LFSR polynomial).
    stage: this stage's plan entry (its geometry fields size every part).

    Members
    -------
    ctl: ``In(PassControlSignature(entries·x_words, entries·row_groups))`` pass start, item
        flags, stash bases and error-buffer halves from the tick controller; ``done`` back.
    x_in: ``In(ValidSignature(word_layout(x_words, x_word_bits)))`` stash write, at
        ``ctl.stash.write + word`` (cannot stall).
    g_in: ``In(ValidSignature(error_layout(d.bits, B)))`` serial error ``g_k``, ``k = 0..M−1``,
        B = ``Stage.error_beat`` (1 when None) a beat, into half ``ctl.error.write`` (cannot
        stall).
    y: ``Out(ValidSignature(word_layout(row_groups, y_word_bits)))`` forward output: the ``L``
        activations of row group ``word``.
    gin: ``Out(ValidSignature(signed(gin.bits)))`` serial input gradient ``i = 0..N−1`` of
        the main update stream (only when the stage sends it on: it is in ``gin_losses``).
    g_in_l<t>, gin_l<t>: the same two ports of extra stream ``t`` (:func:`extra_streams`:
        pass-through and earlier update streams; ``ctl.extra<e>`` is its item): the error
        arriving, the input gradient sent back (only when ``t`` is in ``gin_losses``). An
        earlier update stream's δ is added to the main stream's before the update (the
        ``sum`` rule, docs/numerics.md §5.6): kept per sample in ``dsum_l<t>``
        (:class:`~pipetrain.hdl.errbuf.DeltaStash`) when it arrives in an earlier tick.
    access: ``In(WeightAccessSignature(L·k, cycles_per_tick))`` weight access (only while no
        pass runs; ``Stage.mac_lanes`` lanes).
    saturations: ``Out(32)`` saturation counter (z, gin, u′, w′ clamps and the δ sum's;
        saturating).

    Raises NotImplementedError for a stage the HDL does not build (:func:`check_stage`).
    """

    def __init__(self, plan: Plan, stage: Stage) -> None:
        check_stage(stage)
        self.plan, self.stage = plan, stage
        self.activation = activation_of(stage, plan.shift_add)
        st, f = stage, stage.formats
        P = st.stash_entries
        ticks = tick_streams(plan.stages)[st.index - 1]  # both schedules follow these ticks
        self.extra = extra_streams(plan, st)
        self.main = main_stream(st.losses, ticks)
        self.early = dict(early_update_streams(st.losses, ticks))  # t → kept in dsum
        self.primary_gin = st.input_gradient and self.main in st.gin_losses
        sig = {
            "ctl": In(PassControlSignature(P * st.x_words, P * st.row_groups, len(self.extra))),
            "x_in": In(ValidSignature(word_layout(st.x_words, st.x_word_bits))),
            "g_in": In(ValidSignature(error_layout(f.d.bits, st.error_beat or 1))),
            "y": Out(ValidSignature(word_layout(st.row_groups, st.y_word_bits))),
            "access": In(WeightAccessSignature(st.mac_lanes, st.cycles_per_tick)),
            "saturations": Out(32),
        }
        if self.primary_gin:
            sig["gin"] = Out(ValidSignature(signed(st.gin_bits)))
        for t in self.extra:
            sig[f"g_in_l{t}"] = In(ValidSignature(signed(f.d.bits)))
            if t in st.gin_losses:
                sig[f"gin_l{t}"] = Out(ValidSignature(signed(st.gin_bits)))
        super().__init__(sig)

    def _parts(self) -> dict:
        """The parts of this stage, each sized from the plan's stage entry (the one place the
        geometry is read)."""
        plan, st = self.plan, self.stage
        f, L, k = st.formats, st.lanes, st.column_lanes
        opr = st.operand_registers or 0  # the multipliers' operand registers (S2 → S3)
        live_last = st.out_features - (st.row_groups - 1) * L  # lanes live in the last group
        pipe = SlotPipelineSignature(
            st.group_slots - 1, st.row_groups, st.cycles_per_tick, st.write_stage
        )
        lfsr = LFSRConfig(
            plan.lfsr_poly, plan.lfsr_width, plan.lfsr_leap, plan.round_bits, st.lfsr_seeds
        )
        wmem = st.memory("w")  # the compiler's mapping: SPRAM (single-port) or block RAM
        spram = (wmem.config_depth, wmem.config_width) if wmem.kind == "spram" else None
        parts = {
            "seq": SlotSequencer(pipe, st.slot_cycles, forward_stage(st)),
            "store": WeightStore(
                pipe,
                lanes=L * k,
                w_format=f.w,
                u_format=f.u,
                spram=spram,
                w_prev=any(m.name == "w_prev" for m in st.memories),
            ),
            "stash": InputStash(
                pipe,
                lanes=L,
                entries=st.stash_entries,
                x_lanes=st.x_lanes,
                x_words=st.x_words,
                x_format=f.x,
                x_operand_bits=st.x_operand_bits,
                mask_bits=st.mask_bits,
                extra=len(self.extra),
                plane=writer_plane(plan, st),
                columns=k,
                inputs=st.in_features,
                early_read=early_stash_read(st),
            ),
            "errbuf": ErrorBuffer(
                pipe,
                lanes=L,
                out_features=st.out_features,
                d_format=f.d,
                activation=self.activation,
                addends=len(self.early),
                scales=scaled_errors(st),
                at_write=st.scaled_at_write,
                delta_out=st.reads_delta,
                register_write=bool(stage_graph(plan).senders(st.index - 1, self.main)),
                beat=st.error_beat or 1,
                operand_register=bool(opr),
            ),
            "update": UpdateUnit(
                pipe,
                lanes=L * k,
                columns=k,
                live_last=live_last,
                formats=f,
                update=st.update,
                x_operand_bits=st.x_operand_bits,
                what_bits=st.what_bits,
                update_stage=st.update_stage,
                rounding=plan.rounding,
                lfsr=lfsr,
                shift_add=plan.shift_add,
                weight_operand=st.weight_operand,
                low_piece=plan.low_piece,
                operand_registers=opr,
                momentum_in_logic=momentum_logic(st, plan.momentum_in_logic),
            ),
            "fwd": ForwardLanes(
                pipe,
                lanes=L,
                live_last=live_last,
                acc_bits=st.acc_fwd_bits,
                w_format=st.mac_w_format,
                x_format=f.x,
                y_format=f.y,
                what_bits=st.w_hat_operand_bits,
                x_operand_bits=st.x_operand_bits,
                activation=self.activation,
                operand_registers=opr,
                columns=k,
            ),
        }

        def ingrad() -> InputGradient:
            return InputGradient(
                pipe,
                lanes=L,
                acc_bits=st.acc_bwd_bits,
                w_format=st.mac_w_format,
                d_format=f.d,
                gin_format=f.gin,
                what_bits=st.w_hat_operand_bits,
                operand_registers=opr,
            )

        if self.primary_gin:
            parts["ingrad"] = ingrad()
        for t in self.extra:  # an extra stream: its error buffer, input gradient, δ memory
            parts[f"errbuf_l{t}"] = ErrorBuffer(
                pipe,
                lanes=L,
                out_features=st.out_features,
                d_format=f.d,
                activation=self.activation,
                early=self.early.get(t) is False,
            )
            if t in st.gin_losses:
                parts[f"ingrad_l{t}"] = ingrad()
            if self.early.get(t):
                parts[f"dstash_l{t}"] = DeltaStash(
                    pipe, lanes=L, depth=st.stash_entries * st.row_groups, d_format=f.d
                )
        return parts

    def elaborate(self, platform) -> Module:
        m = Module()
        parts = self._parts()
        for name, part in parts.items():
            m.submodules[name] = part
        seq, store, stash = parts["seq"], parts["store"], parts["stash"]
        errbuf, update, fwd = parts["errbuf"], parts["update"], parts["fwd"]
        grads = [parts["ingrad"]] if "ingrad" in parts else []  # take w and δ besides update
        grads_x: list[InputGradient] = []  # the pass-through streams' input gradients

        # the tick controller's control, the lockstep slot pipeline to every part
        connect(m, flipped(self.ctl.items), seq.items)
        connect(m, flipped(self.ctl.stash), stash.bases)
        connect(m, flipped(self.ctl.error), errbuf.halves)
        own = [
            n for n in parts if n != "seq" and not n.endswith(tuple(f"_l{t}" for t in self.extra))
        ]
        connect_pipeline(m, seq.slots, *(parts[n].slots for n in own))
        addends = []  # the earlier update streams' δ at S1, into the main error buffer
        for e, t in enumerate(self.extra):  # extra stream t: its own bwd flag
            item, eb = getattr(self.ctl, f"extra{e}"), parts[f"errbuf_l{t}"]
            ig = parts.get(f"ingrad_l{t}")
            flag = Signal(name=f"bwd_l{t}")  # latched at start, like the sequencer's flags
            with m.If(self.ctl.items.start):
                m.d.sync += flag.eq(item.bwd)
            mine = [eb] + ([ig] if ig is not None else [])
            ds = parts.get(f"dstash_l{t}")
            if ds is not None:
                mine.append(ds)
            connect_pipeline(m, seq.slots, *(p.slots for p in mine), replace={"bwd": flag})
            connect(m, flipped(self.ctl.error), eb.halves)
            m.d.comb += stash.extra_bases[e].eq(item.mask)
            connect(m, flipped(getattr(self, f"g_in_l{t}")), eb.write)
            connect(m, stash.extra_masks[e], eb.mask)  # S1
            if ds is not None:  # kept for the main stream: written at S2, read at S0
                connect(m, eb.delta, ds.write)  # S2
                m.d.comb += [ds.write_base.eq(item.mask), ds.read_base.eq(self.ctl.stash.bwd_mask)]
                addends.append(ds.stored)  # S1
            elif t in self.early:  # the same tick and sample as the main stream
                addends.append(eb.early)  # S1
            if ig is not None:
                connect(m, eb.delta, ig.delta)  # S2
                grads_x.append(ig)
                connect(m, ig.gin, flipped(getattr(self, f"gin_l{t}")))  # S4+P (S5+P split)
        for k, a in enumerate(addends):
            connect(m, a, getattr(errbuf, f"addend{k}"))
        # data between the parts, in pipeline order
        connect(m, flipped(self.x_in), stash.write)
        connect(m, flipped(self.g_in), errbuf.write)
        connect(m, flipped(self.access), store.access)
        connect(m, store.read, update.read)  # S1
        connect(m, stash.mask, errbuf.mask)  # S1
        connect(m, stash.operands, update.operands, fwd.operands)  # S2
        st = self.stage
        if st.column_lanes > 1:  # row l's δ and scaled errors to its k lanes s·L + l, S2
            L = st.lanes
            pairs = [(errbuf.delta, update.delta)] + [
                (getattr(errbuf, f"scaled{n}"), getattr(update, name))
                for n, name in enumerate(scaled_error_ports(st))
            ]
            for src, dst in pairs:
                m.d.comb += [d.eq(src.delta[p % L]) for p, d in enumerate(dst.delta)]
        elif addends:  # the update takes the δ sum, the main input gradient its own δ
            connect(m, errbuf.total, update.delta)  # S2
            connect(m, errbuf.delta, *(g.delta for g in grads))
        else:
            connect(m, errbuf.delta, update.delta, *(g.delta for g in grads))  # S2
        connect(m, update.weights, fwd.weights, *(g.weights for g in grads + grads_x))  # S2
        for n, name in enumerate(scaled_error_ports(st)):  # e = rhu(c·δ, k) of §5.3, S2
            if st.column_lanes == 1:
                connect(m, getattr(errbuf, f"scaled{n}"), getattr(update, name))
        connect(m, fwd.y, flipped(self.y))  # S4 (S5+P with operand registers)
        connect(m, fwd.mask_write, stash.mask_write)  # with y
        for g in grads:
            connect(m, g.gin, flipped(self.gin))  # S4+P (S5+P split, hdl/mac.py split)
        connect(m, update.write_back, store.write_back)  # write stage

        # clamp flags in a fixed order: z per lane, gin, then (u′, w′) per lane, then the
        # pass-through streams' gin
        flags = [fwd.saturated, *(g.saturated for g in grads), update.saturated]
        flags += [g.saturated for g in grads_x]
        if addends:  # the δ sum of the update streams (numerics §5.6)
            flags.append(errbuf.saturated)
        m.submodules.saturations = sat = SaturationCounter(sum(len(x) for x in flags))
        m.d.comb += [sat.flags.eq(Cat(*flags)), self.saturations.eq(sat.count)]
        return m
