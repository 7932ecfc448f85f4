"""``LinkDispatcher``: executes received frames and hands their responses to the transmitter
(docs/protocol.md §2, §3).

For each ``frame`` beat: count it (``frames_ok``, ``bad_crc``, ``bad_header`` or
``rx_timeouts``); drop a bad frame; answer a retransmission (same seq as the last executed
command, HELLO excepted) from the response buffer, which is the response cache, without
executing it; otherwise execute the command, write its response into the response buffer and
send it. HELLO, SESSION, FLUSH and the counter commands run here; SAMPLES, READ_RESULTS and the
weight commands run in their parts (:class:`~pipetrain.hdl.link_samples.SamplesCommand`,
:class:`~pipetrain.hdl.link_results.ReadResults`,
:class:`~pipetrain.hdl.link_weights.WeightsCommand`), through held ``cmd`` requests.

State memory (*derived*: area on the iCE40UP5K, one EBR): one byte memory holds the response
buffer (0 .. tx_max−1), then two regions of counters, counter c at byte 4c (LE): the offsets
latched by RESET_COUNTERS, and the values of the engine's own counters (incremented by a
12-cycle read-modify-write: three cycles a byte, the read address and the read data each
registered; writes go through a register too — timing, docs/boards.md §4.1). The value slots of
the network counters are
unused; the session tag (4 bytes, written by SESSION) and the constant HELLO bytes sit there,
ending right before ``accepted``, so HELLO is one 30-byte copy (tag, constants, ``accepted``,
``results_read``); the tag costs no register (*derived*: the iCEBreaker's logic cells are nearly
all used). READ_COUNTERS forms ``value − offset`` a byte every three cycles (a network counter is
latched whole first: it may change while it is read); SEND hands the response buffer to the
transmitter a byte every two cycles. After reset the dispatcher zeroes the
counters, offsets and the session tag (a few hundred cycles, ``busy`` high), so a reset device
answers HELLO with tag 0.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..compiler.plan import Plan
from ..protocol.wire import (
    ENGINE_COUNTERS,
    HELLO_BYTES,
    NAK,
    SESSION_BYTES,
    STORE_INDEX_BYTES,
    Cmd,
    LinkParams,
    NakReason,
)
from .link_onchip import OnChipSet
from .link_ports import (
    FrameStatus,
    byte_layout,
    frame_layout,
    network_signature,
    response_layout,
)
from .link_results import ReadResults
from .link_samples import SamplesCommand
from .link_weights import WeightsCommand

__all__ = ["LinkDispatcher"]

# `_PartSelect` and the counter states tell command types apart by single bits; these are
# the bits they rely on (type bits 0, 2 and 3 of the four types that run in a part)
_PART_TYPES = (Cmd.SAMPLES, Cmd.READ_RESULTS, Cmd.READ_WEIGHTS, Cmd.WRITE_WEIGHTS)
assert [t & 0b1101 for t in _PART_TYPES] == [0b0000, 0b0001, 0b0101, 0b1000]
assert Cmd.READ_COUNTERS & 1 and not Cmd.RESET_COUNTERS & 1
assert Cmd.STORE & 0b1101 == 0b0000  # STORE's records run in the SAMPLES part
# a frame's status is the offset of its counter from `frames_ok`
_STATUS_COUNTERS = ("frames_ok", "bad_crc", "bad_header", "rx_timeouts")
assert [ENGINE_COUNTERS.index(n) - 2 for n in _STATUS_COUNTERS] == [s.value for s in FrameStatus]


class _Write(NamedTuple):
    """A write of the state memory in this cycle (committed by the port a cycle later)."""

    addr: Signal
    data: Signal
    en: Signal


class _StateMemory:
    """The dispatcher's byte memory (response buffer, counter offsets and values, HELLO bytes)
    and its operations: append to the response, increment a counter, copy bytes.

    ``wptr`` is the response length so far, ``bi`` a byte index (of a counter's 4 bytes).

    Reads (*derived* (timing): the block RAM's address comes from a register, so no FSM state,
    handshake or counter drives it; docs/boards.md §4.1): ``ra`` is a register and is the read
    address ``rd.addr``; ``ra_next`` is its next value (combinational, ``ra`` unless a state
    assigns it). A state that sets ``ra_next`` = A in cycle t presents A to the block RAM in
    t + 1; ``rd.data`` = mem[A] in t + 2 and ``rdq`` = mem[A] in t + 3. So a state that computes
    on what it reads (:meth:`read_phases`) takes three cycles a byte: phase 0 presents ``ra``,
    phase 1 has ``rd.data`` = mem[ra] (registered into ``rdq``), phase 2 acts on ``rdq`` and
    moves ``ra``. SEND offers ``rd.data`` itself, from the cycle after ``ra`` moved (two
    cycles a byte). ``ra`` is also the write address of :meth:`write` (the byte just read).
    """

    RET = ("DISPATCH", "IDLE", "DONE", "EXEC")  # where an increment returns to

    def __init__(self, m: Module, params: LinkParams) -> None:
        P = params
        self.m = m
        # with the on-chip set, RUN adds its E·count samples to `accepted` then `results_read`
        self.RET = self.RET + (("RUN_READ",) if P.onchip_samples else ())
        self.E = P.network_counters  # the first engine counter (`accepted`), READ_COUNTERS order
        self.counter = {name: self.E + i for i, name in enumerate(ENGINE_COUNTERS)}
        self.cb = max(1, (P.num_counters - 1).bit_length())
        Z = 4 << self.cb  # bytes of a counter region
        self.OB = -(-P.tx_max // (2 * Z)) * (2 * Z)  # offsets region; values at OB + Z
        self.NC = HELLO_BYTES - SESSION_BYTES - 8  # constant HELLO bytes (hash, version, sizes)
        self.HB = self.OB + Z + 4 * self.E - self.NC  # the HELLO constants
        self.TB = self.HB - SESSION_BYTES  # the session tag; HELLO copies from here
        self.depth = self.OB + 2 * Z
        assert self.TB >= self.OB + 4 * P.num_counters  # tag and constants overlap no used slot
        init = [0] * self.depth
        init[self.HB : self.HB + self.NC] = P.hello_payload(0, 0)[SESSION_BYTES : HELLO_BYTES - 8]
        m.submodules.mem = mem = Memory(shape=8, depth=self.depth, init=init)
        port, self.rd = mem.write_port(), mem.read_port()
        # writes go through a register stage (the read data drives no write port directly:
        # timing, docs/boards.md §4.1); a byte is never read back the cycle after its write
        # (every state reads other bytes first), so the delay changes no byte
        self.wr = wr = _Write(Signal.like(port.addr), Signal(8), Signal())
        m.d.sync += [port.addr.eq(wr.addr), port.data.eq(wr.data), port.en.eq(wr.en)]
        # the read address from a register (timing, docs/boards.md §4.1); see the class doc
        self.ra = Signal(range(self.depth), init=self.OB)
        self.ra_next = Signal.like(self.ra)
        m.d.comb += [self.ra_next.eq(self.ra), self.rd.addr.eq(self.ra)]
        m.d.sync += self.ra.eq(self.ra_next)
        self.wptr = Signal(range(P.tx_max + 1))
        self.bi = Signal(2)
        self.carry = Signal()  # of a counter increment; 0 for copies
        # the read data, registered: the states that compute on it (INC, the copies, the
        # counter reads) take three cycles a byte (:meth:`read_phases`), so no arithmetic
        # follows the block RAM's slow output (docs/boards.md §4.1); `ph` is the phase (SEND
        # uses it too: 1 once `rd.data` shows mem[ra])
        self.rdq = Signal(8)
        self.ph = Signal(2)
        m.d.sync += self.rdq.eq(self.rd.data)
        self.sum = Signal(9)  # mem[ra] (from rdq) + carry (+ the addend's byte)
        self.ret = Signal(range(len(self.RET)))
        # a 32-bit addend (RUN's sample count), shifted out a byte per INC cycle: zero otherwise
        self.addend = Signal(32) if P.onchip_samples else None
        if self.addend is None:
            m.d.comb += self.sum.eq(self.rdq + self.carry)
        else:
            m.d.comb += self.sum.eq(self.rdq + self.carry + self.addend[:8])

    def slot(self, region: int, c) -> Cat:
        """Address of byte 0 of counter ``c`` (int or Value) in region 0 (offsets) / 1 (values)."""
        cb = self.cb
        index = Const(c, cb) if isinstance(c, int) else c[:cb]
        top = Const(self.OB >> (cb + 3), len(self.ra) - cb - 3)
        return Cat(Const(0, 2), index, Const(region, 1), top)

    def emit(self, value) -> None:
        """Append a byte to the response."""
        self.m.d.comb += [self.wr.addr.eq(self.wptr), self.wr.data.eq(value), self.wr.en.eq(1)]
        self.m.d.sync += self.wptr.eq(self.wptr + 1)

    def write(self, value) -> None:
        """Write a byte at the read address (counter updates)."""
        self.m.d.comb += [self.wr.addr.eq(self.ra), self.wr.data.eq(value), self.wr.en.eq(1)]

    def increment(self, c, ret, addend=None) -> None:
        """Go to INC: add 1 (or the 32-bit ``addend``) to engine counter ``c`` (12 cycles),
        then to ``ret`` (a :attr:`RET` name, or ``(cond, if_true, if_false)``)."""
        m = self.m
        m.d.comb += self.ra_next.eq(self.slot(1, c))
        if isinstance(ret, str):
            code = self.RET.index(ret)
        else:
            code = Mux(ret[0], self.RET.index(ret[1]), self.RET.index(ret[2]))
        m.d.sync += [self.carry.eq(addend is None), self.bi.eq(0), self.ret.eq(code)]
        if addend is not None:
            m.d.sync += self.addend.eq(addend)
        m.next = "INC"

    def read_phases(self):
        """In a three-cycles-a-byte state: ``ph`` counts 0, 1, 2; phase 0 presents ``ra`` to the
        block RAM, phase 1 registers ``rd.data`` = mem[ra] into ``rdq``, and the body (the
        returned ``If``) runs in phase 2 (``rdq`` = mem[ra]) and may move ``ra``; phases 0 and
        1 hold ``ra``. A state is entered and left with ``ph`` = 0 and ``ra`` set by the cycle
        before (*derived*: timing, see the class doc)."""
        act = self.ph == 2
        self.m.d.sync += self.ph.eq(Mux(act, 0, self.ph + 1))
        return self.m.If(act)

    def increment_state(self, returns: dict) -> None:
        """The INC state (12 cycles); ``returns[name]()`` runs in its last cycle when it returns
        to ``name``."""
        m = self.m
        with m.State("INC"), self.read_phases():
            m.d.comb += self.ra_next.eq(self.ra + 1)
            self.write(self.sum[:8])
            m.d.sync += [self.carry.eq(self.sum[8]), self.bi.eq(self.bi + 1)]
            if self.addend is not None:
                m.d.sync += self.addend.eq(self.addend >> 8)
            with m.If(self.bi == 3):
                with m.Switch(self.ret):
                    for code, name in enumerate(self.RET):
                        with m.Case(code):
                            returns.get(name, lambda: None)()
                            m.next = name

    def copy_state(self, name: str, count: int) -> None:
        """State ``name``: append ``count`` bytes from ``ra`` on (set by the state before, with
        ``carry`` 0) to the response, then DONE."""
        m = self.m
        with m.State(name), self.read_phases():
            self.emit(self.sum[:8])
            m.d.comb += self.ra_next.eq(self.ra + 1)
            with m.If(self.wptr == count - 1):
                m.next = "DONE"

    def clear_state(self) -> None:
        """CLEAR, after reset: zero the counters, offsets and session tag (not the constant HELLO
        bytes), then IDLE."""
        m, ra = self.m, self.ra
        with m.State("CLEAR"):
            with m.If((ra < self.HB) | (ra >= self.HB + self.NC)):
                self.write(0)
            m.d.comb += self.ra_next.eq(ra + 1)
            with m.If(ra == self.depth - 1):
                m.next = "IDLE"


class _PartSelect:
    """Which part runs the frame's command in EXEC, from the type bits that tell SAMPLES
    (0b0010), READ_RESULTS (0b0011), READ_WEIGHTS (0b0111) and WRITE_WEIGHTS (0b1000) apart
    (only these types reach EXEC; *derived*: three 1–2-input gates instead of 8-bit compares)."""

    def __init__(self, typ) -> None:
        self.samples = ~typ[0] & ~typ[3]
        self.results = typ[0] & ~typ[2]
        self.weights = typ[2] | typ[3]


class LinkDispatcher(wiring.Component):
    """Executes frames from the receiver, sends responses through the transmitter.

    Parameters
    ----------
    plan: the design plan (NetworkTop's ports).
    params: link sizes.

    Members
    -------
    frame: ``In(stream.Signature(frame_layout(params)))`` held request from the receiver; taken
        when the frame is dropped or its response was sent.
    args: ``In(stream.Signature(byte_layout()))`` the frame's payload (to the command parts).
    response: ``Out(stream.Signature(response_layout()))`` held request to the transmitter.
    data: ``Out(stream.Signature(byte_layout()))`` the response payload, from the response
        buffer.
    net: ``In(network_signature(plan))`` NetworkTop's ports, flipped.
    busy: ``Out(1)`` clearing after reset, or a frame in hand.
    """

    def __init__(self, plan: Plan, params: LinkParams) -> None:
        self.plan = plan
        self.params = params
        super().__init__(
            {
                "frame": In(stream.Signature(frame_layout(params))),
                "args": In(stream.Signature(byte_layout())),
                "response": Out(stream.Signature(response_layout())),
                "data": Out(stream.Signature(byte_layout())),
                "net": In(network_signature(plan)),
                "busy": Out(1),
            }
        )

    def _parts(
        self, m: Module, sh: Signal, args_ready: Signal
    ) -> tuple[SamplesCommand, ReadResults, WeightsCommand, OnChipSet | None]:
        """The command parts, connected to ``net``, ``args`` (also taken when ``args_ready``)
        and the shift register ``sh``."""
        net, args, f = self.net, self.args, self.frame.payload
        m.submodules.samples = samples = SamplesCommand(self.plan, self.params)
        m.submodules.read_results = results = ReadResults(self.params)
        m.submodules.weights = weights = WeightsCommand(self.params)
        onchip = None
        if self.params.onchip_samples:
            m.submodules.onchip = onchip = OnChipSet(self.plan, self.params)
            self._route_onchip(m, samples, results, onchip)
        else:
            wiring.connect(m, samples.sample_in, wiring.flipped(net.sample_in))
            wiring.connect(m, wiring.flipped(net.result_out), results.result_out)
        wiring.connect(m, weights.wacc_cmd, wiring.flipped(net.wacc_cmd))
        wiring.connect(m, wiring.flipped(net.wacc_rsp), weights.wacc_rsp)
        parts = (samples, results, weights) + ((onchip,) if onchip is not None else ())
        for part in parts:
            m.d.comb += [part.args.valid.eq(args.valid), part.args.payload.eq(args.payload)]
        m.d.comb += [
            args.ready.eq(
                samples.args.ready
                | results.args.ready
                | weights.args.ready
                | args_ready
                | (onchip.args.ready if onchip is not None else 0)
            ),
            samples.word.eq(sh),
            weights.word.eq(sh),
            weights.cmd.payload.write.eq(f.type[3]),  # WRITE_WEIGHTS = 8, READ_WEIGHTS = 7
            weights.cmd.payload.length.eq(f.length),
        ]
        # every byte a part takes from `args` shifts in (features, the word to write)
        with m.If(args.valid & args.ready):
            m.d.sync += sh.eq(Cat(sh[8:], args.payload.data))
        return samples, results, weights, onchip

    def _route_onchip(
        self, m: Module, samples: SamplesCommand, results: ReadResults, onchip: OnChipSet
    ) -> None:
        """``sample_in``: the SAMPLES parser's beats go to the network, or for STORE to the
        on-chip set; during a RUN the set feeds the network and takes its results."""
        net, f = self.net, self.frame.payload
        store = f.type == Cmd.STORE
        run = onchip.running
        si, ro = net.sample_in, net.result_out
        m.d.comb += [
            onchip.store.payload.eq(samples.sample_in.payload),
            onchip.store.valid.eq(samples.sample_in.valid & store),
            si.valid.eq(Mux(run, onchip.sample_in.valid, samples.sample_in.valid & ~store)),
            si.payload.eq(Mux(run, onchip.sample_in.payload, samples.sample_in.payload)),
            samples.sample_in.ready.eq(Mux(store, onchip.store.ready, si.ready & ~run)),
            onchip.sample_in.ready.eq(si.ready & run),
            onchip.result_in.payload.eq(ro.payload),
            results.result_out.payload.eq(ro.payload),
            # a run with records hands every result to both, in the same cycle
            onchip.result_in.valid.eq(
                ro.valid & run & (~onchip.records | results.result_out.ready)
            ),
            results.result_out.valid.eq(
                ro.valid & (~run | (onchip.records & onchip.result_in.ready))
            ),
            ro.ready.eq(
                Mux(
                    run,
                    onchip.result_in.ready & (~onchip.records | results.result_out.ready),
                    results.result_out.ready,
                )
            ),
            onchip.idle.eq(net.idle),
        ]

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        st = _StateMemory(m, self.params)
        f, net = self.frame.payload, self.net
        sh = Signal(32)  # shift register: bytes taken from `args`, counter snapshots
        args_ready = Signal()  # the dispatcher itself takes `args` (SESSION, STORE's slot)
        self._args_ready = args_ready
        samples, results, weights, onchip = self._parts(m, sh, args_ready)
        part = _PartSelect(f.type)
        last_seq, have_last = Signal(8), Signal()
        rsp_type = Signal(8)
        reason = Signal(2)  # NakReason of a NAK
        outstanding = Signal(range(self.params.result_depth + 1))  # accepted − results_read
        fwait = Signal(3)
        flush = Signal()  # net.flush in the next cycle

        def dropped() -> None:  # a bad frame was counted
            m.d.comb += self.frame.ready.eq(1)

        def counted() -> None:  # a part's count is done
            m.d.comb += [samples.bump.ready.eq(part.samples), results.bump.ready.eq(part.results)]
            m.d.sync += outstanding.eq(Mux(part.samples, outstanding + 1, outstanding - 1))

        with m.FSM(name="dispatch") as fsm:
            st.clear_state()
            with m.State("IDLE"):
                with m.If(self.frame.valid):
                    ok = f.status == FrameStatus.OK
                    counter = st.counter["frames_ok"] + f.status.as_value()
                    st.increment(counter, (ok, "DISPATCH", "IDLE"))
            st.increment_state({"IDLE": dropped, "EXEC": counted})
            if onchip is not None:
                self._onchip_states(m, st, onchip, sh, reason, outstanding)

            with m.State("DISPATCH"):
                with m.If((f.type != Cmd.HELLO) & have_last & (f.seq == last_seq)):
                    st.increment(st.counter["duplicates"], "DONE")  # from the response cache
                with m.Else():
                    m.d.sync += [
                        st.wptr.eq(0),
                        rsp_type.eq(f.type | 0x80),
                        st.carry.eq(0),
                        st.bi.eq(0),
                        fwait.eq(0),
                        reason.eq(NakReason.FULL),
                    ]
                    self._dispatch(m, st, outstanding, reason)

            with m.State("EXEC"):
                self._exec(m, st, part, (samples, results, weights), reason)

            with m.State("NAK0"):
                st.emit(f.type)
                m.d.sync += rsp_type.eq(NAK)
                m.next = "NAK1"

            with m.State("NAK1"):
                st.emit(reason)
                m.next = "DONE"

            st.copy_state("HELLO", HELLO_BYTES)

            with m.State("SESSION"):  # the tag's bytes from `args` into the state memory
                m.d.comb += args_ready.eq(1)
                with m.If(self.args.valid):
                    st.write(self.args.payload.data)
                    m.d.comb += st.ra_next.eq(st.ra + 1)
                    m.d.sync += st.bi.eq(st.bi + 1)
                    with m.If(st.bi == SESSION_BYTES - 1):
                        m.next = "DONE"
            st.copy_state("ACK", 4)  # SAMPLES: `accepted`

            with m.State("FLUSH"):
                m.d.comb += flush.eq(1)
                # hold flush a few cycles before trusting `idle` (it may lag the last beat)
                with m.If(fwait != 4):
                    m.d.sync += fwait.eq(fwait + 1)
                with m.Elif(net.idle):
                    m.next = "DONE"

            self._counter_states(m, st, sh)

            with m.State("DONE"):
                m.d.comb += st.ra_next.eq(0)
                m.d.sync += [last_seq.eq(f.seq), have_last.eq(1)]
                m.next = "SEND"

            with m.State("SEND"):
                self._send(m, st, rsp_type, last_seq)

        with m.If(weights.flush | (onchip.flush if onchip is not None else 0)):
            m.d.comb += flush.eq(1)
        # registered: the network's tick controller decodes it (timing: docs/boards.md §4.1)
        m.d.sync += net.flush.eq(flush)
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))
        return m

    def _dispatch(self, m: Module, st: _StateMemory, outstanding: Signal, reason: Signal) -> None:
        """The first state of each command (in DISPATCH, a new command)."""
        f = self.frame.payload
        with m.Switch(f.type):
            with m.Case(Cmd.HELLO):
                m.d.comb += st.ra_next.eq(st.TB)
                m.next = "HELLO"
            with m.Case(Cmd.SESSION):  # bi is 0 (set with the DISPATCH defaults)
                m.d.comb += st.ra_next.eq(st.TB)
                m.next = "SESSION"
            with m.Case(Cmd.SAMPLES):  # NAK FULL unless the result buffer has room for all
                with m.If(outstanding + f.records > self.params.result_depth):
                    m.next = "NAK0"
                with m.Else():
                    m.next = "EXEC"
            with m.Case(Cmd.FLUSH):
                m.next = "FLUSH"
            if self.params.onchip_samples:
                with m.Case(Cmd.STORE):  # bi is 0: the slot's two bytes first
                    m.next = "STORE_INDEX"
                with m.Case(Cmd.RUN):  # a run's results are its own: none may be unread
                    with m.If(outstanding != 0):
                        m.d.sync += reason.eq(NakReason.BUSY)
                        m.next = "NAK0"
                    with m.Else():
                        m.next = "RUN"
            with m.Case(Cmd.READ_COUNTERS, Cmd.RESET_COUNTERS):
                m.next = "C_LATCH"
            with m.Default():  # READ_RESULTS, READ_WEIGHTS, WRITE_WEIGHTS
                m.next = "EXEC"

    def _exec(self, m: Module, st: _StateMemory, part: _PartSelect, parts, reason: Signal) -> None:
        """EXEC: the command runs in its part; the part's bytes go to the response, its counts
        to the counters; when it is done, its NAK, SAMPLES' ``accepted``, or DONE."""
        samples, results, weights = parts
        f = self.frame.payload
        m.d.comb += [
            samples.cmd.valid.eq(part.samples),
            results.cmd.valid.eq(part.results),
            weights.cmd.valid.eq(part.weights),
        ]
        with m.If(results.emit.valid | weights.emit.valid):
            st.emit(Mux(results.emit.valid, results.emit.payload, weights.emit.payload))
        store = f.type == Cmd.STORE if self.params.onchip_samples else Const(0)
        with m.If(samples.bump.valid & store):  # a stored record is not a sample in flight
            m.d.comb += samples.bump.ready.eq(1)
        with m.Elif(samples.bump.valid):
            st.increment(st.counter["accepted"], "EXEC")
        with m.Elif(results.bump.valid):
            st.increment(st.counter["results_read"], "EXEC")
        with m.If(samples.cmd.ready | results.cmd.ready | weights.cmd.ready):
            nak = results.nak | weights.nak
            m.d.sync += [reason.eq(nak), st.carry.eq(0)]
            with m.If(nak != 0):
                m.next = "NAK0"
            with m.Elif(store):
                m.next = "DONE"
            with m.Elif(part.samples):
                m.d.comb += st.ra_next.eq(st.slot(1, st.counter["accepted"]))
                m.next = "ACK"
            with m.Else():
                m.next = "DONE"

    def _onchip_states(
        self,
        m: Module,
        st: _StateMemory,
        onchip: OnChipSet,
        sh: Signal,
        reason: Signal,
        outstanding: Signal,
    ) -> None:
        """STORE_INDEX (the slot's two bytes from ``args``, checked against the capacity, then
        the records through EXEC) and RUN (the on-chip set runs; its summaries go to the
        response; ``accepted`` and ``results_read`` then grow by the samples it fed)."""
        P, args, f = self.params, self.args, self.frame.payload
        with m.State("STORE_INDEX"):
            m.d.comb += self._args_ready.eq(1)  # from the state alone (timing, as in SESSION)
            with m.If(args.valid):
                m.d.sync += st.bi.eq(st.bi + 1)
                with m.If(st.bi == STORE_INDEX_BYTES - 1):
                    m.next = "STORE_CHECK"
        with m.State("STORE_CHECK"):  # the slot is sh[16:32] (LE)
            with m.If(sh[16:32] + f.records > P.onchip_samples):
                m.d.sync += reason.eq(NakReason.BAD_ARG)
                m.next = "NAK0"
            with m.Else():
                m.d.comb += [onchip.store_start.eq(1), onchip.store_index.eq(sh[16:32])]
                m.next = "EXEC"
        keep = Signal()  # the run kept its records: they are outstanding until read
        with m.State("RUN"):
            m.d.comb += onchip.cmd.valid.eq(1)
            with m.If(onchip.running):
                m.d.sync += keep.eq(onchip.records)
            with m.If(onchip.emit.valid):
                st.emit(onchip.emit.payload)
            with m.If(onchip.cmd.ready):
                with m.If(onchip.nak != 0):
                    m.d.sync += reason.eq(onchip.nak)
                    m.next = "NAK0"
                with m.Else():
                    st.increment(st.counter["accepted"], "RUN_READ", addend=onchip.fed)
        with m.State("RUN_READ"):
            with m.If(keep):
                m.d.sync += [outstanding.eq(outstanding + onchip.fed), keep.eq(0)]
                m.next = "DONE"
            with m.Else():
                st.increment(st.counter["results_read"], "DONE", addend=onchip.fed)

    def _send(self, m: Module, st: _StateMemory, rsp_type: Signal, last_seq: Signal) -> None:
        """SEND: offer the response (header and payload from the response buffer) until the
        transmitter takes it; then the frame is done.

        Byte ``ra`` of the buffer is offered in phase 1 (``ph`` = 1: ``ra`` was presented in
        the cycle before, ``rd.data`` = mem[ra]) until taken; then ``ra`` moves on and phase 0
        waits for the read (*derived*: timing, the registered read address; two cycles a byte,
        the UART needs ~290 at 3 Mbaud and 87.5 MHz). ``data.valid`` comes from registers only.
        """
        rsp, dat = self.response, self.data
        shown = st.ph[0]  # DONE left ph = 0 and set ra = 0
        m.d.comb += [
            rsp.valid.eq(1),
            rsp.payload.type.eq(rsp_type),
            rsp.payload.seq.eq(last_seq),
            rsp.payload.length.eq(st.wptr),
            dat.valid.eq(shown & (st.ra != st.wptr)),
            dat.payload.data.eq(st.rd.data),
            dat.payload.last.eq(st.ra + 1 == st.wptr),
        ]
        with m.If(dat.valid & dat.ready):
            m.d.comb += st.ra_next.eq(st.ra + 1)
            m.d.sync += st.ph.eq(0)
        with m.Else():
            m.d.sync += st.ph.eq(1)
        with m.If(rsp.ready):
            m.d.comb += self.frame.ready.eq(1)
            m.d.sync += st.ph.eq(0)  # IDLE's states are entered with ph = 0
            m.next = "IDLE"

    def _counter_states(self, m: Module, st: _StateMemory, sh: Signal) -> None:
        """READ_COUNTERS and RESET_COUNTERS: for each counter, READ emits ``value − offset`` a
        byte at a time, RESET writes the value into the offset slot. A network counter is
        latched whole first (it may change while it is read); an engine counter is loaded from
        the state memory."""
        P, net, f = self.params, self.net, self.frame.payload
        E, K = st.E, P.num_counters
        bi = st.bi
        c = Signal(range(K))
        borrow = Signal()
        d = Signal(9)
        is_read = f.type[0]  # READ_COUNTERS = 5, RESET_COUNTERS = 6

        def shift_in(b) -> None:
            m.d.sync += sh.eq(Cat(sh[8:], b))

        with m.State("C_LATCH"):
            m.d.sync += [borrow.eq(0), bi.eq(0)]
            with m.If(c < E):
                with m.Switch(c):
                    network = [net.samples_trained, net.ticks, *net.saturations]
                    if P.heads:  # then the heads' correct-prediction counters
                        network += list(net.head_correct)
                    for i, v in enumerate(network):
                        with m.Case(i):
                            m.d.sync += sh.eq(v)
                m.d.comb += st.ra_next.eq(st.slot(0, c))
                m.next = "C_EMIT"
            with m.Else():
                m.d.comb += st.ra_next.eq(st.slot(1, c))
                m.next = "C_LOADV"

        with m.State("C_LOADV"), st.read_phases():
            shift_in(st.rdq)
            m.d.comb += st.ra_next.eq(st.ra + 1)
            m.d.sync += bi.eq(bi + 1)
            with m.If(bi == 3):
                m.d.comb += st.ra_next.eq(st.slot(0, c))
                m.next = "C_EMIT"

        with m.State("C_EMIT"), st.read_phases():
            m.d.comb += [d.eq(sh[0:8] - st.rdq - borrow), st.ra_next.eq(st.ra + 1)]
            with m.If(is_read):
                st.emit(d[:8])
            with m.Else():
                st.write(sh[0:8])
            shift_in(st.rdq)
            m.d.sync += [borrow.eq(d[8]), bi.eq(bi + 1)]
            with m.If(bi == 3):
                with m.If(c == K - 1):
                    m.d.sync += c.eq(0)
                    m.next = "DONE"
                with m.Else():
                    m.d.sync += c.eq(c + 1)
                    m.next = "C_LATCH"
