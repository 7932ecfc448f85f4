"""The interfaces between the parts of a stage, the stages, the loss unit and the tick controller.

Data moves in two ways (docs/architecture.md §3):

* **valid/ready streams** (:class:`amaranth.lib.stream.Signature`) where the receiver may stall:
  the host streams of docs/ports.md and the pending-sample handshake between the sample writer
  and the tick controller. A beat moves in a cycle where ``valid`` and ``ready`` are both high.
* **valid-only streams** (:class:`ValidSignature`: ``payload`` + ``valid``, no ``ready``) where
  the receiver *cannot stall*: everything inside the lockstep pass. All stages run their fused
  pass in lockstep, one slot per cycle (docs/architecture.md §3); a receiver takes every beat in
  the cycle it is valid, so there is no ``ready`` to connect. One valid-only stream may feed
  several receivers (``wiring.connect`` with one producer and many consumers).

Signatures are written from the producer's side (``Out`` = driven by the producer), as
``lib.stream`` does. Inside a stage the parts meet at fixed pipeline stages of the slot (S0
issues the reads … the write stage writes back, see :class:`SlotPipelineSignature`); a member
documented "at Sk" belongs to the slot that is at stage k in that cycle.

Shapes: ``range(n)`` members are ``unsigned(bits_for(n − 1))``, so a producer and a consumer
built from the same geometry have equal shapes and ``wiring.connect`` accepts them; different
geometries fail loudly instead of truncating.

Source: docs/architecture.md §3 (lockstep fused pass), docs/ports.md (host streams); the split
into these interfaces is *derived* (one signature per flow between two parts).
"""

from __future__ import annotations

from typing import Any

from amaranth import Shape, ShapeLike, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..compiler.plan import Plan

__all__ = [
    "error_layout",
    "network_signature",
    "ValidSignature",
    "index_shape",
    "word_layout",
    "mask_layout",
    "write_back_layout",
    "slot_layout",
    "pending_sample_layout",
    "PassItemsSignature",
    "StashBasesSignature",
    "ErrorHalvesSignature",
    "PassControlSignature",
    "SlotPipelineSignature",
    "slot_at",
    "connect_pipeline",
    "PASS_FLAGS",
    "RamReadSignature",
    "RamWriteSignature",
    "WeightReadSignature",
    "LaneWeightsSignature",
    "DeltaSignature",
    "StashOperandsSignature",
    "MaskReadSignature",
    "WeightAccessSignature",
    "LossControlSignature",
    "sample_layout",
    "result_layout",
    "wacc_cmd_layout",
    "wacc_rsp_layout",
]


class _Signature(wiring.Signature):
    """A signature that equals another of its class with the same members (the default
    ``wiring.Signature`` subclass compares by identity)."""

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.members == self.members

    def __hash__(self) -> int:
        return hash(type(self).__name__)


class ValidSignature(_Signature):
    """A valid-only stream: ``payload`` with ``valid``, and no ``ready`` — it **cannot stall**.

    The receiver takes the payload in every cycle ``valid`` is high (the lockstep pass has no
    way to wait). One producer may feed several receivers.

    Parameters
    ----------
    payload_shape: shape or layout of the payload.

    Members
    -------
    payload: ``Out(payload_shape)`` the beat (meaningful only while ``valid``).
    valid: ``Out(1)`` a beat is present this cycle.
    """

    def __init__(self, payload_shape: ShapeLike) -> None:
        self._payload_shape = payload_shape
        super().__init__({"payload": Out(payload_shape), "valid": Out(1)})

    @property
    def payload_shape(self) -> ShapeLike:
        """The payload's shape or layout."""
        return self._payload_shape

    def __repr__(self) -> str:
        return f"ValidSignature({self._payload_shape!r})"


def index_shape(n: int) -> Shape:
    """The unsigned shape of an index ``0 … max(n, 2) − 1`` (at least one bit)."""
    return Shape.cast(range(max(n, 2)))


def word_layout(words: int, data_bits: int) -> data.StructLayout:
    """``{word: index(words), data: unsigned(data_bits)}``: word ``word`` of a buffer entry.

    The forward output of a stage (one row group of ``L`` activations per word) and the stash
    write of the next stage (``Lw`` = that ``L`` values per word) share it, as do the last
    stage's output and the loss unit's logit buffer.
    """
    return data.StructLayout({"word": index_shape(words), "data": unsigned(data_bits)})


def error_layout(d_bits: int, beat: int = 1) -> ShapeLike:
    """The payload of an error write into a stage's error buffer: one error ``signed(d_bits)``
    a beat (an input gradient's ``gin_i``, a loss unit with ``out_lanes`` = 1), or ``beat`` of
    them (``data.ArrayLayout``; element ``t`` is the error of the beat's ``t``-th row: a loss
    unit's ``out_lanes``, ``Stage.error_beat``)."""
    if beat == 1:
        return signed(d_bits)
    return data.ArrayLayout(signed(d_bits), beat)


def mask_layout(row_groups: int, lanes: int) -> data.StructLayout:
    """``{group: index(row_groups), bits: unsigned(lanes)}``: the ``z > 0`` bits of one row
    group (bit ``l`` = lane ``l``)."""
    return data.StructLayout({"group": index_shape(row_groups), "bits": unsigned(lanes)})


def write_back_layout(
    lanes: int, w_bits: int, u_bits: int, w_prev: bool = False
) -> data.StructLayout:
    """``{w: signed(w_bits)[lanes], u: signed(u_bits)[lanes], lanes: unsigned(lanes)}``: the
    updated ``(w′, u′)`` of one slot per lane; ``lanes`` bit ``l`` is 0 for a padding lane
    (its row does not exist), which writes nothing. ``w_prev`` (LWP ``w`` form): also
    ``w_prev: signed(w_bits)[lanes]``, the weight before this update (numerics §5)."""
    fields = {
        "w": data.ArrayLayout(signed(w_bits), lanes),
        "u": data.ArrayLayout(signed(u_bits), lanes),
        "lanes": unsigned(lanes),
    }
    if w_prev:
        fields["w_prev"] = data.ArrayLayout(signed(w_bits), lanes)
    return data.StructLayout(fields)


def slot_layout(in_features: int, row_groups: int) -> data.StructLayout:
    """``{col: index(N + 1), group: index(row_groups), last_group: 1}``: where a slot is in the
    pass — column ``col`` (``N`` = the bias column) of row group ``group``; ``last_group`` is
    ``group = row_groups − 1`` (registered with the slot, not compared again)."""
    return data.StructLayout(
        {
            "col": index_shape(in_features + 1),
            "group": index_shape(row_groups),
            "last_group": unsigned(1),
        }
    )


def pending_sample_layout() -> data.StructLayout:
    """``{label: unsigned(16), train: 1}``: the sample waiting in stage 1's stash."""
    return data.StructLayout({"label": unsigned(16), "train": unsigned(1)})


class PassItemsSignature(_Signature):
    """Which items one fused pass works on (tick controller → stage).

    Members
    -------
    start: ``Out(1)`` pulse: begin a pass with the flags below (held stable until ``done``).
    fwd: ``Out(1)`` the pass forwards the item stashed at the stash's forward base.
    fwd_train: ``Out(1)`` the forward item trains (Linear Weight Prediction's ŵ is used only
        then; inference forwards use ``w``, as the golden model does).
    bwd: ``Out(1)`` the pass back-propagates and updates with the item at the backward base
        (the LFSRs draw only then).
    done: ``In(1)`` no pass running (low from the start pulse until the last write-back).
    fwd_done: ``In(1)`` the pass's forward outputs are all out (low from the start pulse until
        the cycle after the last ``y`` beat; ``done`` or earlier): a loss unit fed by the stage
        may start (``build.forward_cycles``).
    """

    def __init__(self) -> None:
        super().__init__(
            {
                "start": Out(1),
                "fwd": Out(1),
                "fwd_train": Out(1),
                "bwd": Out(1),
                "done": In(1, init=1),
                "fwd_done": In(1, init=1),
            }
        )


class StashBasesSignature(_Signature):
    """The stash entries of a pass (tick controller → stage).

    Parameters
    ----------
    x_depth: words of the input stash (entries × x_words).
    m_depth: words of the mask memory (entries × row_groups).

    Members
    -------
    fwd_x, bwd_x: ``Out(range(x_depth))`` word address of the forward / backward item's entry.
    fwd_mask, bwd_mask: ``Out(range(m_depth))`` mask address of the forward / backward item.
    write: ``Out(range(x_depth))`` entry the writer into this stash (the previous stage, or the
        host for stage 1) fills this tick.
    """

    def __init__(self, x_depth: int, m_depth: int) -> None:
        self.x_depth, self.m_depth = x_depth, m_depth
        xa, ma = Shape.cast(range(x_depth)), Shape.cast(range(m_depth))
        super().__init__(
            {
                "fwd_x": Out(xa),
                "bwd_x": Out(xa),
                "fwd_mask": Out(ma),
                "bwd_mask": Out(ma),
                "write": Out(xa),
            }
        )


class ErrorHalvesSignature(_Signature):
    """The halves of a double-buffered error buffer used this tick (tick controller → stage).

    Members
    -------
    write: ``Out(1)`` half the serial error writes go to.
    read: ``Out(1)`` half the pass reads.
    """

    def __init__(self) -> None:
        super().__init__({"write": Out(1), "read": Out(1)})


class StreamItemSignature(_Signature):
    """One pass-through backward stream of a pass (tick controller → stage; interlocking
    learning, docs/architecture.md §2.4): the stream's item and where its mask bits are.

    Members
    -------
    bwd: ``Out(1)`` the pass back-propagates this stream's item (input gradient only, no
        update); held with the pass's other flags.
    mask: ``Out(range(m_depth))`` mask address of the stream's item.
    """

    def __init__(self, m_depth: int) -> None:
        super().__init__({"bwd": Out(1), "mask": Out(Shape.cast(range(m_depth)))})


class PassControlSignature(_Signature):
    """Everything the tick controller tells one stage (tick controller → stage).

    Parameters
    ----------
    x_depth, m_depth: see :class:`StashBasesSignature`.
    extra: pass-through streams of the stage (0 without interlocking).

    Members
    -------
    items: ``Out(PassItemsSignature())``.
    stash: ``Out(StashBasesSignature(x_depth, m_depth))``.
    error: ``Out(ErrorHalvesSignature())``.
    extra0 … extra{n−1}: ``Out(StreamItemSignature(m_depth))`` the ``extra`` pass-through
        streams, in the stage's stream order.
    """

    def __init__(self, x_depth: int, m_depth: int, extra: int = 0) -> None:
        self.x_depth, self.m_depth, self.extra = x_depth, m_depth, extra
        members = {
            "items": Out(PassItemsSignature()),
            "stash": Out(StashBasesSignature(x_depth, m_depth)),
            "error": Out(ErrorHalvesSignature()),
        }
        for e in range(extra):  # named members: wiring cannot flip an array of interfaces
            members[f"extra{e}"] = Out(StreamItemSignature(m_depth))
        super().__init__(members)


#: The pass-wide members of :class:`SlotPipelineSignature`.
PASS_FLAGS = ("start", "busy", "fwd", "fwd_train", "bwd", "read_addr", "write_addr")


class SlotPipelineSignature(_Signature):
    """The fused pass as the slot sequencer issues it: the lockstep timing every part of a stage
    follows (sequencer → parts).

    A pass is ``words`` = ``row_groups·(N+1)`` slots, issued in numerics §2 order (``for g: for
    i in 0..N``), one per slot cycle; a slot issued at S0 is at stage ``k`` exactly ``k``
    cycles later. Stage roles (docs/architecture.md §3, *derived* pipeline): S0 reads the
    memories, S1 selects operands, S2 multiplies, S3 accumulates and updates, S4 finalises the
    forward outputs and (without Spike Compensation) has ``w′, u′``; the write stage writes them
    back.

    The sequencer drives the whole pipeline; a part declares the :meth:`subset` it follows (the
    stages and flags it reads), and :func:`connect_pipeline` connects it — so each part's
    signature says which stages it works at (*derived*: no unused wires per part).

    Parameters
    ----------
    in_features: N (columns 0..N−1, then the bias column N).
    row_groups: G.
    words: slots of a pass = weight-memory words per lane.
    depth: the write stage (pipeline stages S0..S{depth}).
    stages: the stages present (default all, 0..depth). flags: the pass-wide members present
        (default all of :data:`PASS_FLAGS`).

    Members
    -------
    start: ``Out(1)`` the pass's start pulse (the cycle before its first slot can issue).
    busy: ``Out(1)`` slots are still issuing (the weight memories' read address is the pass's).
    fwd, fwd_train, bwd: ``Out(1)`` the pass's item flags, latched at ``start``
        (:class:`PassItemsSignature`).
    read_addr: ``Out(range(words))`` weight-memory address of the slot issuing at S0.
    write_addr: ``Out(range(words))`` weight-memory address of the slot at the write stage.
    s0 … s{depth}: ``Out(ValidSignature(slot_layout(N, G)))`` the slot at that stage, a
        valid-only beat (``valid``: a slot is there; it cannot stall); use :func:`slot_at`.

    Raises ValueError for a stage outside 0..depth or an unknown flag.
    """

    def __init__(
        self,
        in_features: int,
        row_groups: int,
        words: int,
        depth: int,
        *,
        stages: tuple[int, ...] | None = None,
        flags: tuple[str, ...] | None = None,
    ) -> None:
        self.in_features, self.row_groups, self.words, self.depth = (
            in_features,
            row_groups,
            words,
            depth,
        )
        self.stages = tuple(range(depth + 1)) if stages is None else tuple(sorted(set(stages)))
        self.flags = PASS_FLAGS if flags is None else tuple(f for f in PASS_FLAGS if f in flags)
        if any(not 0 <= k <= depth for k in self.stages):
            raise ValueError(f"pipeline stages {self.stages} outside 0..{depth}")
        if flags is not None and set(flags) - set(PASS_FLAGS):
            raise ValueError(f"unknown pass flags {sorted(set(flags) - set(PASS_FLAGS))}")
        shapes = {
            "start": 1,
            "busy": 1,
            "fwd": 1,
            "fwd_train": 1,
            "bwd": 1,
            "read_addr": range(words),
            "write_addr": range(words),
        }
        slot = ValidSignature(slot_layout(in_features, row_groups))
        members: dict[str, Any] = {f: Out(shapes[f]) for f in self.flags}
        members.update({f"s{k}": Out(slot) for k in self.stages})
        super().__init__(members)

    def subset(
        self, stages: tuple[int, ...] = (), flags: tuple[str, ...] = ()
    ) -> SlotPipelineSignature:
        """The same pipeline with only ``stages`` and ``flags`` (what one part reads)."""
        return SlotPipelineSignature(
            self.in_features,
            self.row_groups,
            self.words,
            self.depth,
            stages=stages,
            flags=flags,
        )


def slot_at(pipeline: Any, stage: int) -> Any:
    """The valid-only slot stream of ``pipeline`` (an interface of
    :class:`SlotPipelineSignature`) at pipeline stage ``stage``."""
    return getattr(pipeline, f"s{stage}")


def connect_pipeline(
    m: Any, source: Any, *sinks: Any, replace: dict[str, Any] | None = None
) -> None:
    """Connect the full slot pipeline ``source`` (the sequencer's ``Out`` member) to the parts'
    ``In`` subsets ``sinks``: every member a sink declares is driven by the source's member of
    the same name — or by ``replace[name]`` (a pass-wide flag of another stream, e.g. ``bwd``
    of a pass-through stream). Raises ValueError if a sink declares a member the source lacks or
    with another shape (a sink of a different pass geometry)."""
    replace = replace or {}
    src = source.signature
    for sink in sinks:
        sig = sink.signature.flip()
        for path, member in sig.members.flatten():
            if not member.is_port:
                continue
            try:
                want = src.members[path[0]]
                if len(path) > 1:
                    want = want.signature.members[path[1]]
            except (KeyError, AttributeError):
                raise ValueError(f"the pipeline has no member {'.'.join(path)}") from None
            if want.shape != member.shape:
                raise ValueError(
                    f"pipeline member {'.'.join(path)}: {member.shape!r} ≠ {want.shape!r}"
                )
            a, b = source, sink
            for name in path:
                a, b = getattr(a, name), getattr(b, name)
            if len(path) == 1 and path[0] in replace:
                a = replace[path[0]]
            m.d.comb += b.eq(a)


class RamReadSignature(_Signature):
    """A synchronous read port, from the memory's side (as ``lib.memory.ReadPort.Signature``).

    Members
    -------
    addr: ``In(range(depth))``. data: ``Out(shape)`` the word at the previous cycle's address.
    """

    def __init__(self, shape: ShapeLike, depth: int) -> None:
        super().__init__({"addr": In(range(depth)), "data": Out(shape)})


class RamWriteSignature(_Signature):
    """A write port, from the memory's side (as ``lib.memory.WritePort.Signature``).

    Members
    -------
    en: ``In(1)``. addr: ``In(range(depth))``. data: ``In(shape)`` written at ``addr`` when
    ``en``.
    """

    def __init__(self, shape: ShapeLike, depth: int) -> None:
        super().__init__({"en": In(1), "addr": In(range(depth)), "data": In(shape)})


class WeightReadSignature(_Signature):
    """The weights and velocities of the slot, per lane, at S1 (weight store → update unit).

    Members
    -------
    w: ``Out(signed(w_bits)).array(lanes)`` ``w`` of row ``g·L + l``, column ``i``.
    u: ``Out(signed(u_bits)).array(lanes)`` ``u`` of the same word.
    w_prev: ``Out(signed(w_bits)).array(lanes)`` (``w_prev`` True: LWP ``w`` form only) the
        same word's weight before its last update.
    """

    def __init__(self, lanes: int, w_bits: int, u_bits: int, w_prev: bool = False) -> None:
        members = {"w": Out(signed(w_bits)).array(lanes), "u": Out(signed(u_bits)).array(lanes)}
        if w_prev:
            members["w_prev"] = Out(signed(w_bits)).array(lanes)
        super().__init__(members)


class LaneWeightsSignature(_Signature):
    """The weights of the slot's products, per lane, at S2 (update unit → MAC lanes).

    Members
    -------
    w_hat: ``Out(signed(what_bits)).array(lanes)`` forward weight ŵ (``w − H·u``, or
        ``w + H·(w − w_prev)`` in the ``w`` form, with Linear Weight Prediction for a training
        forward item, else ``w``; numerics §3).
    w: ``Out(signed(w_bits)).array(lanes)`` current ``w`` (input-gradient product).
    """

    def __init__(self, lanes: int, what_bits: int, w_bits: int) -> None:
        super().__init__(
            {
                "w_hat": Out(signed(what_bits)).array(lanes),
                "w": Out(signed(w_bits)).array(lanes),
            }
        )


class DeltaSignature(_Signature):
    """δ of the backward item per lane at S2 (error buffer → update unit, input gradient).

    Members
    -------
    delta: ``Out(signed(d_bits)).array(lanes)`` ``f′(z_j)·g_j`` of row ``j = g·L + l`` (0 in
        padding lanes and in passes without a backward item).
    """

    def __init__(self, lanes: int, d_bits: int) -> None:
        super().__init__({"delta": Out(signed(d_bits)).array(lanes)})


class StashOperandsSignature(_Signature):
    """The input stash's ``x`` operands of the slot at S2 (input stash → MAC lanes, update
    unit).

    Parameters
    ----------
    x_bits: the operand width (``Stage.x_operand_bits``).
    columns: k, the column lanes (``Stage.column_lanes``): with k > 1 each member is an array
        of k operands, ``[s]`` = column ``t·k + s`` of slot ``t`` (0 for a padding column).

    Members
    -------
    x_fwd: ``Out(signed(x_bits))`` ``x_i`` of the forward item, or the bias input ``2^x.frac``
        in column N (``.array(k)`` with k > 1).
    x_bwd: ``Out(signed(x_bits))`` the same for the backward item.
    """

    def __init__(self, x_bits: int, columns: int = 1) -> None:
        self.columns = columns
        one = Out(signed(x_bits)) if columns == 1 else Out(signed(x_bits)).array(columns)
        super().__init__({"x_fwd": one, "x_bwd": one})


class MaskReadSignature(_Signature):
    """The backward item's ``z > 0`` bits of the slot's row group at S1 (input stash → error
    buffer).

    Members
    -------
    bits: ``Out(lanes)`` bit ``l`` = lane ``l``.
    """

    def __init__(self, lanes: int) -> None:
        super().__init__({"bits": Out(lanes)})


class WeightAccessSignature(_Signature):
    """Host access to one stage's weight memories while no pass runs (weight-access unit →
    stage). Fixed latency: the answer is valid the cycle after ``en`` and stays while the
    command fields are unchanged.

    Parameters
    ----------
    lanes: L. words: weight-memory words per lane.

    Members
    -------
    en: ``Out(1)`` access this cycle.
    write: ``Out(1)`` write ``data`` (saturated to the memory's format) instead of reading.
    kind: ``Out(2)`` 0 = ``w``, 1 = ``u``, 2 = ``w_prev`` (LWP ``w`` form).
    lane: ``Out(range(max(lanes, 2)))``. addr: ``Out(range(words))`` word in the lane's bank.
    data: ``Out(signed(32))`` write data.
    rdata: ``In(signed(32))`` the value read, or the saturated value written.
    """

    def __init__(self, lanes: int, words: int) -> None:
        super().__init__(
            {
                "en": Out(1),
                "write": Out(1),
                "kind": Out(2),
                "lane": Out(index_shape(lanes)),
                "addr": Out(range(words)),
                "data": Out(signed(32)),
                "rdata": In(signed(32)),
            }
        )


class LossControlSignature(_Signature):
    """Start of the loss unit on the buffered logits (tick controller → loss unit).

    Members
    -------
    start: ``Out(1)`` pulse. label: ``Out(16)`` the sample's class. train: ``Out(1)`` the sample
        trains (held, with ``label``, until ``done``).
    done: ``In(1)`` the loss unit is not running.
    """

    def __init__(self) -> None:
        super().__init__({"start": Out(1), "label": Out(16), "train": Out(1), "done": In(1)})


# ---- host stream payloads (docs/ports.md) ---------------------------------------------------


def sample_layout(plan: Plan) -> data.StructLayout:
    """``{x: signed(X), label: unsigned(16), train: 1, last: 1}`` (LSB first)."""
    return data.StructLayout(
        {
            "x": signed(plan.stages[0].formats.x.bits),
            "label": unsigned(16),
            "train": unsigned(1),
            "last": unsigned(1),
        }
    )


def result_layout() -> data.StructLayout:
    """``{sample: unsigned(32), pred: unsigned(16), loss: unsigned(32), train: 1}``."""
    return data.StructLayout(
        {"sample": unsigned(32), "pred": unsigned(16), "loss": unsigned(32), "train": unsigned(1)}
    )


def wacc_cmd_layout() -> data.StructLayout:
    """``{write: 1, stage: 8, kind: 2, row: 16, col: 16, data: signed(32)}``."""
    return data.StructLayout(
        {
            "write": unsigned(1),
            "stage": unsigned(8),
            "kind": unsigned(2),
            "row": unsigned(16),
            "col": unsigned(16),
            "data": signed(32),
        }
    )


def wacc_rsp_layout() -> data.StructLayout:
    """``{data: signed(32)}``."""
    return data.StructLayout({"data": signed(32)})


def network_signature(plan: Plan) -> wiring.Signature:
    """``NetworkTop(plan)``'s signature (docs/ports.md), seen from the network top; the link
    engine holds it flipped (one definition for both). ``saturations``: one counter per stage
    (main stages, then head stages) and per loss unit (the true loss, then the heads');
    ``head_correct`` (only with auxiliary heads): one counter per head."""
    heads = len(getattr(plan, "head_losses", ()))
    members = {
        "sample_in": In(stream.Signature(sample_layout(plan))),
        "result_out": Out(stream.Signature(result_layout())),
        "wacc_cmd": In(stream.Signature(wacc_cmd_layout())),
        "wacc_rsp": Out(stream.Signature(wacc_rsp_layout())),
        "flush": In(1),
        "idle": Out(1),
        "samples_trained": Out(32),
        "ticks": Out(32),
        "saturations": Out(32).array(len(plan.stages) + 1 + heads),
    }
    if heads:
        members["head_correct"] = Out(32).array(heads)
    return wiring.Signature(members)
