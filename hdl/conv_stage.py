"""One PB pipeline stage of kind Conv1d/Conv2d: a composition of the stage parts
(docs/architecture.md §3, docs/numerics.md §9).

Per tick the stage runs ONE pass (:mod:`pipetrain.hdl.conv`: every row group's MAC slots, a
gap, every row group's U slots; ``Stage.cycles_per_tick`` slot cycles). Lanes are over output
channels: lane ``l`` of row group ``g`` owns channel ``j = g·L + l`` and its weight row
``w[j][0..T]`` (the Linear stage's weight memories, T + 1 columns with the bias last). In the
MAC slot ``(g, p, t)``, from one read of ``w[j][t]``, each lane accumulates ``ŵ·x`` of the
forward item (after the bias tap it rounds, activates and pools the position) and, for the
backward item, forms ``w·δ_j,p`` for the input gradient (summed across lanes into the input
value ``t`` reads at ``p``) and ``δ_j,p·x`` for the weight gradient (summed over the
positions); in the U slot ``(g, t)`` it makes **one** momentum/SC update of ``w[j][t]`` from
the summed gradient. Every MAC slot reads the weights before the tick's update.

The parts (connected only through the signatures of :mod:`pipetrain.hdl.streams` and
:mod:`pipetrain.hdl.conv`):

* :class:`~pipetrain.hdl.conv.ConvSequencer` — issues the slots and their addresses;
* :class:`~pipetrain.hdl.weights.WeightStore` — per-lane ``w``/``u`` (``w_prev``) banks, shared
  with the host's weight access (row ``j``, column ``t``: lane ``j mod L``, word
  ``(j div L)·(T+1) + t``);
* :class:`~pipetrain.hdl.conv_stash.ConvStash` — the input feature maps, the ReLU mask per
  position and the MaxPool argmax of D_s + 1 samples (+ the one being written);
* :class:`~pipetrain.hdl.conv_errbuf.ConvErrorBuffer` — the double-buffered error, δ;
* :class:`~pipetrain.hdl.mac.ForwardLanes` — the forward MACs and the activation (its ``fwd``
  flag: the MAC slots only), then :class:`~pipetrain.hdl.pool.PoolUnit`;
* :class:`~pipetrain.hdl.conv_mac.WeightGradient`,
  :class:`~pipetrain.hdl.conv_mac.ConvInputGradient` — the backward MACs;
* :class:`~pipetrain.hdl.update.UpdateUnit` — ŵ, momentum, SC, rounding (its ``bwd`` flag:
  the U phase of a pass with a backward item; the gradient arrives summed);
* :class:`~pipetrain.hdl.saturation.SaturationCounter`.

Source: docs/numerics.md §9 (the arithmetic), docs/architecture.md §3; the phase schedule is
*derived* (the plan's ``compiler/conv.py:conv_cycles``).
"""

from __future__ import annotations

from amaranth import Cat, Module, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..compiler.plan import Plan, Stage
from .activation import activation_of
from .conv import PHASE_MAC, ConvSequencer, connect_conv, conv2d_view, conv_at
from .conv_errbuf import ConvErrorBuffer
from .conv_mac import ConvInputGradient, WeightGradient
from .conv_stash import ConvStash
from .mac import ForwardLanes
from .pool import PoolUnit
from .saturation import SaturationCounter
from .streams import (
    PassControlSignature,
    SlotPipelineSignature,
    ValidSignature,
    WeightAccessSignature,
    connect_pipeline,
    word_layout,
)
from .update import LFSRConfig, UpdateUnit
from .weights import WeightStore

__all__ = ["ConvStageUnit", "check_conv_stage", "conv_mask_words", "conv_x_words"]

#: Activations a convolution stage builds (docs/numerics.md §9.1: no LUT activation).
CONV_ACTIVATIONS = ("relu", "leaky_relu", "identity")


def conv_x_words(stage: Stage) -> int:
    """Stash words per sample of a convolution stage: ``⌈C_in / Lw⌉·Πin_size`` (channel ``c``
    of input position ``pos`` in word ``(c div Lw)·Πin_size + pos``, lane ``c mod Lw``)."""
    v = conv2d_view(stage.conv)
    return -(-v.C // stage.x_lanes) * v.H * v.W


def conv_mask_words(stage: Stage) -> int:
    """Mask words per sample (the tick controller's mask base step): ``row_groups·P``."""
    return stage.row_groups * stage.conv.positions


def check_conv_stage(stage: Stage) -> None:
    """Raise NotImplementedError (naming the stage, the problem and the way out) for a
    convolution stage the HDL does not build: a LUT activation, several backward streams
    (interlocking learning: pass-through or summed streams), single-port (SPRAM) weights, or a
    plan whose stash words are not this HDL's."""
    where = f"stage {stage.index} ({stage.conv.kind})"
    if stage.activation not in CONV_ACTIVATIONS:
        raise NotImplementedError(
            f"{where}: activation {stage.activation!r} after a convolution has no hardware; "
            f"use one of {', '.join(CONV_ACTIVATIONS)}"
        )
    streams = set(stage.grad_losses or stage.losses)
    if len(streams) > 1:
        raise NotImplementedError(
            f"{where}: {len(streams)} backward streams (interlocking learning) are not built for "
            "a convolution stage, only one: use --strategy global or local"
        )
    if stage.slot_cycles != 1:
        raise NotImplementedError(f"{where}: single-port (SPRAM) weights are not built for a "
                                  "convolution stage; leave it in block RAM")  # fmt: skip
    if stage.x_words != conv_x_words(stage):
        raise NotImplementedError(
            f"{where}: the plan's {stage.x_words} stash words per sample are not the HDL's "
            f"{conv_x_words(stage)} (⌈C_in/Lw⌉·Πin_size); recompile the plan"
        )


class ConvStageUnit(wiring.Component):
    """The datapath and memories of one convolution stage (see the module docstring); the same
    ports as :class:`~pipetrain.hdl.stage.StageUnit`, for the network top.

    Parameters
    ----------
    plan: the design plan (rounding, LFSR polynomial, constant rule).
    stage: this stage's plan entry (``Stage.conv`` and the geometry fields size every part).

    Members
    -------
    ctl: ``In(PassControlSignature(entries·x_words, entries·G·P))`` pass start, item flags,
        stash bases (the mask base steps by ``G·P``), error-buffer halves; ``done`` back.
    x_in: ``In(ValidSignature(word_layout(x_words, x_word_bits)))`` stash write (cannot stall).
    g_in: ``In(ValidSignature(signed(d.bits)))`` serial error, channel-major ``j·P′ + q``.
    y: ``Out(ValidSignature(word_layout(G·P′, L·y.bits)))`` the pooled outputs of window ``q``
        of row group ``g`` as word ``g·P′ + q``.
    gin: ``Out(ValidSignature(signed(gin.bits)))`` (stages with ``input_gradient``) serial input
        gradient ``i = 0..N−1`` (channel-major).
    access: ``In(WeightAccessSignature(L, G·(T+1)))`` weight access (only while no pass runs).
    saturations: ``Out(32)`` saturation counter (z, the AvgPool mean, gin, u′, w′ clamps).

    Raises NotImplementedError for a stage the HDL does not build (:func:`check_conv_stage`).
    """

    def __init__(self, plan: Plan, stage: Stage) -> None:
        check_conv_stage(stage)
        self.plan, self.stage = plan, stage
        self.activation = activation_of(stage, plan.shift_add)
        st, f, g = stage, stage.formats, stage.conv
        self.view = conv2d_view(g)
        E, G, words = st.stash_entries, st.row_groups, st.row_groups * (g.taps + 1)
        sig = {
            "ctl": In(PassControlSignature(E * st.x_words, E * G * g.positions)),
            "x_in": In(ValidSignature(word_layout(st.x_words, st.x_word_bits))),
            "g_in": In(ValidSignature(signed(f.d.bits))),
            "y": Out(ValidSignature(word_layout(G * g.pooled_positions, st.y_word_bits))),
            "access": In(WeightAccessSignature(st.lanes, words)),
            "saturations": Out(32),
        }
        if st.input_gradient:
            sig["gin"] = Out(ValidSignature(signed(st.gin_bits)))
        super().__init__(sig)

    def _parts(self) -> dict:
        """The parts of this stage, each sized from the plan's stage entry."""
        plan, st, v = self.plan, self.stage, self.view
        f, L, G, g = st.formats, st.lanes, st.row_groups, st.conv
        live_last = g.out_channels - (G - 1) * L
        pipe = SlotPipelineSignature(g.taps, G, G * (g.taps + 1), st.write_stage)
        seq = ConvSequencer(
            pipe, g, x_words=st.x_words, x_lanes=st.x_lanes, cycles=st.cycles_per_tick
        )
        cp = seq.conv.signature
        lfsr = LFSRConfig(
            plan.lfsr_poly, plan.lfsr_width, plan.lfsr_leap, plan.round_bits, st.lfsr_seeds
        )
        pool = dict(pool=g.pool, scale=g.pool_scale, shift=g.pool_shift)
        parts = {
            "seq": seq,
            "store": WeightStore(
                pipe, lanes=L, w_format=f.w, u_format=f.u, spram=None,
                w_prev=any(m.name == "w_prev" for m in st.memories),
            ),
            "stash": ConvStash(
                cp, v, lanes=L, groups=G, entries=st.stash_entries, x_lanes=st.x_lanes,
                x_words=st.x_words, x_format=f.x, x_operand_bits=st.x_operand_bits,
                maxpool=g.pool == "max",
            ),
            "errbuf": ConvErrorBuffer(
                pipe, cp, v, **pool, lanes=L, groups=G, out_channels=g.out_channels,
                d_format=f.d, activation=self.activation, shift_add=plan.shift_add,
            ),
            "update": UpdateUnit(
                pipe, lanes=L, live_last=live_last, formats=f, update=st.update,
                x_operand_bits=st.x_operand_bits, what_bits=st.what_bits,
                update_stage=st.update_stage, rounding=plan.rounding, lfsr=lfsr,
                shift_add=plan.shift_add, gradient_bits=st.memory("wgacc").width,
                weight_operand=st.weight_operand, low_piece=plan.low_piece,
            ),
            "fwd": ForwardLanes(
                pipe, lanes=L, live_last=live_last, acc_bits=st.acc_fwd_bits,
                w_format=st.mac_w_format, x_format=f.x, y_format=f.y,
                what_bits=st.w_hat_operand_bits,
                x_operand_bits=st.x_operand_bits, activation=self.activation,
            ),
            "pool": PoolUnit(
                pipe, cp, v, **pool, lanes=L, groups=G, live_last=live_last, y_format=f.y,
                shift_add=plan.shift_add,
            ),
            "wgrad": WeightGradient(
                pipe, cp, lanes=L, acc_bits=st.memory("wgacc").width, d_format=f.d,
                x_operand_bits=st.x_operand_bits,
            ),
        }  # fmt: skip
        if st.input_gradient:
            parts["ingrad"] = ConvInputGradient(
                pipe, cp, lanes=L, in_values=v.in_values, acc_bits=st.acc_bwd_bits,
                w_format=st.mac_w_format, d_format=f.d, gin_format=f.gin,
                what_bits=st.w_hat_operand_bits,
            )  # fmt: skip
        return parts

    def elaborate(self, platform) -> Module:
        m = Module()
        parts = self._parts()
        for name, part in parts.items():
            m.submodules[name] = part
        seq, store, stash, errbuf = parts["seq"], parts["store"], parts["stash"], parts["errbuf"]
        update, fwd, pool, wgrad = parts["update"], parts["fwd"], parts["pool"], parts["wgrad"]
        ingrad = parts.get("ingrad")
        sp = seq.slots

        # control; the two slot pipelines to the parts (the forward lanes see MAC slots only,
        # the update unit's backward flag is the U phase of a pass with a backward item)
        connect(m, flipped(self.ctl.items), seq.items)
        connect(m, flipped(self.ctl.stash), stash.bases)
        connect(m, flipped(self.ctl.error), errbuf.halves)
        c3 = conv_at(seq.conv, 3)
        f3 = sp.fwd & c3.valid & (c3.payload.phase == PHASE_MAC)
        connect_pipeline(m, sp, store.slots, errbuf.slots, pool.slots, wgrad.slots)
        connect_pipeline(m, sp, fwd.slots, replace={"fwd": f3})
        connect_pipeline(m, sp, update.slots, replace={"bwd": sp.bwd & seq.upd})
        sinks = [stash.conv, errbuf.conv, pool.conv, wgrad.conv]
        connect_conv(m, seq.conv, *sinks, *([ingrad.conv] if ingrad else []))
        if ingrad:
            connect_pipeline(m, sp, ingrad.slots)
            m.d.comb += seq.hold.eq(ingrad.busy)
        m.d.comb += wgrad.upd.eq(seq.upd)

        # data between the parts, in pipeline order
        connect(m, flipped(self.x_in), stash.write)
        connect(m, flipped(self.g_in), errbuf.write)
        connect(m, flipped(self.access), store.access)
        connect(m, store.read, update.read)  # S1
        connect(m, stash.mask, errbuf.mask)  # S1
        maxpool = self.stage.conv.pool == "max"
        if maxpool:
            connect(m, stash.argmax, errbuf.argmax)  # S1
        connect(m, stash.operands, fwd.operands, wgrad.operands)  # S2
        connect(m, errbuf.delta, wgrad.delta, *([ingrad.delta] if ingrad else []))  # S2
        connect(m, wgrad.grad, update.delta)  # S2 (U slots)
        connect(m, update.weights, fwd.weights, *([ingrad.weights] if ingrad else []))  # S2
        c4 = conv_at(seq.conv, 4)
        m.d.comb += [  # S4: the position's activations to the pooling, its mask bits stashed
            pool.a.valid.eq(fwd.y.valid),
            pool.a.payload.eq(fwd.y.payload.data),
            stash.mask_write.valid.eq(fwd.mask_write.valid),
            stash.mask_write.payload.group.eq(c4.payload.mword),
            stash.mask_write.payload.bits.eq(fwd.mask_write.payload.bits),
        ]
        connect(m, pool.y, flipped(self.y))  # S4
        if maxpool:
            connect(m, pool.argmax_write, stash.argmax_write)
        if ingrad:
            connect(m, ingrad.gin, flipped(self.gin))
        connect(m, update.write_back, store.write_back)  # write stage

        flags = [fwd.saturated, update.saturated]
        flags += [pool.saturated] if self.stage.conv.pool == "avg" else []
        flags += [ingrad.saturated] if ingrad else []
        m.submodules.saturations = sat = SaturationCounter(sum(len(x) for x in flags))
        m.d.comb += [sat.flags.eq(Cat(*flags)), self.saturations.eq(sat.count)]
        return m
