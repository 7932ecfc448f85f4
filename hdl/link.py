"""``LinkEngine``: the device side of the host link protocol, between a byte stream and the
network top.

The wire format, the commands and the reliability rules are those of ``docs/protocol.md``; the
constants come from :mod:`pipetrain.protocol.wire`, and :class:`~pipetrain.protocol.
device_model.LinkDeviceModel` is this engine's byte-exact Python model (the tests compare them).

Structure (one frame at a time; the receiver is stalled while a command runs or a response is
sent, which is correct under any backpressure because every byte moves by a stream handshake):

* **receive**: hunt for ``A5 5A``; read type, seq, length; drop the header at once if no
  command has that type and length; write the payload into the command buffer (a
  ``lib.memory`` of ``rx_max`` bytes); check the CRC-32 (an XOR matrix, one byte per cycle).
  A bad header or CRC, or ``rx_timeout`` cycles without a byte inside a frame, returns to the
  hunt at the next byte.
* **dispatch**: a command whose sequence number equals the last executed one (HELLO excepted)
  is a retransmission: the cached response is sent again and nothing is executed.
* **execute**: the command reads its arguments from the command buffer and writes its response
  into the response buffer (``tx_max`` bytes), which doubles as the retransmission cache.
  SAMPLES streams its records into ``net.sample_in`` (N beats each, ``last`` on the final
  one); results from ``net.result_out`` wait in a FIFO of ``result_depth`` entries until READ_
  RESULTS; weight access raises ``net.flush`` while its command waits (the network serves it
  only when idle); FLUSH raises ``net.flush`` until ``net.idle``; counters are read as
  ``value − offset`` with the offsets latched by RESET_COUNTERS.
* **send**: sync, type, seq, length, payload from the response buffer, CRC-32.

Area (the design must fit an iCE40UP5K next to the network): everything wide is byte-serial
and lives in block RAM. One byte memory holds the response buffer, the counter offsets, the
engine's own 32-bit counters (incremented by a 4-cycle read-modify-write) and the constant
HELLO bytes; READ_COUNTERS forms ``value − offset`` a byte per cycle (a network counter is
latched whole first, since it may change while it is read). The result FIFO is a byte memory
of 16-byte slots, filled a byte per cycle from ``result_out`` (taken with the last byte).
After reset the engine zeroes its counters and offsets (a few hundred cycles, ``rx`` stalled).

Source: docs/protocol.md (*derived*: stop-and-wait ARQ with a response cache).
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..compiler.plan import Plan
from ..protocol.wire import (
    CRC_POLY_REFLECTED,
    HELLO_BYTES,
    NAK,
    RESULT_BYTES,
    SYNC,
    WEIGHT_HEADER_BYTES,
    Cmd,
    LinkParams,
    NakReason,
)
from .top import result_layout, sample_layout, wacc_cmd_layout, wacc_rsp_layout

__all__ = ["LinkEngine", "network_signature", "crc32_step_matrix", "DEFAULT_RX_TIMEOUT"]

#: Cycles without a byte after which a partial frame is dropped (21 ms at 50 MHz: far longer
#: than a byte at any baud rate the boards use, far shorter than the host's retry timeout).
DEFAULT_RX_TIMEOUT = 1 << 20


def network_signature(plan: Plan) -> wiring.Signature:
    """``NetworkTop(plan)``'s signature (docs/ports.md), seen from the network top."""
    S = len(plan.stages)
    return wiring.Signature(
        {
            "sample_in": In(stream.Signature(sample_layout(plan))),
            "result_out": Out(stream.Signature(result_layout())),
            "wacc_cmd": In(stream.Signature(wacc_cmd_layout())),
            "wacc_rsp": Out(stream.Signature(wacc_rsp_layout())),
            "flush": In(1),
            "idle": Out(1),
            "samples_trained": Out(32),
            "ticks": Out(32),
            "saturations": Out(32).array(S + 1),
        }
    )


def crc32_step_matrix() -> list[tuple[int, int]]:
    """The CRC-32 byte step as an XOR matrix: for output bit i, ``(crc_mask, byte_mask)`` such
    that ``next[i] = parity(crc & crc_mask) ^ parity(byte & byte_mask)`` (reflected CRC,
    poly 0xEDB88320, one input byte per step; *derived* from the bitwise definition by
    linearity)."""

    def step(c: int, d: int) -> int:
        c ^= d
        for _ in range(8):
            c = (c >> 1) ^ (CRC_POLY_REFLECTED if c & 1 else 0)
        return c

    col_c = [step(1 << j, 0) for j in range(32)]
    col_d = [step(0, 1 << j) for j in range(8)]
    rows = []
    for i in range(32):
        cm = sum(1 << j for j in range(32) if col_c[j] >> i & 1)
        dm = sum(1 << j for j in range(8) if col_d[j] >> i & 1)
        rows.append((cm, dm))
    return rows


_CRC_ROWS = crc32_step_matrix()


def _crc_next(crc, byte):
    bits = []
    for cm, dm in _CRC_ROWS:
        v = (crc & cm).xor()
        if dm:
            v = v ^ (byte & dm).xor()
        bits.append(v)
    return Cat(*bits)


class LinkEngine(wiring.Component):
    """Device-side protocol engine: host byte streams in/out, NetworkTop ports (docs/ports.md).

    Parameters
    ----------
    plan: the design plan (sizes, formats, hash).
    max_batch, max_words, result_depth: link sizes (:meth:`LinkParams.from_plan` defaults).
    rx_timeout: cycles without a byte inside a frame before it is dropped (0 = never).

    Members
    -------
    rx: ``In(stream.Signature(8))`` bytes from the host.
    tx: ``Out(stream.Signature(8))`` bytes to the host.
    net: ``In(network_signature(plan))`` — the flipped NetworkTop signature: the engine drives
        ``sample_in``, ``wacc_cmd``, ``flush`` and consumes ``result_out``, ``wacc_rsp``,
        ``idle`` and the counters. Connect with ``wiring.connect(m, engine.net, top)``.
    busy: ``Out(1)`` inside a frame, executing or sending (low only while hunting for a frame).

    Attributes
    ----------
    params: the :class:`~pipetrain.protocol.wire.LinkParams`.
    plan_hash: the plan hash as an integer (64 bit); HELLO reports it.
    """

    def __init__(
        self,
        plan: Plan,
        *,
        max_batch: int | None = None,
        max_words: int = 32,
        result_depth: int | None = None,
        rx_timeout: int = DEFAULT_RX_TIMEOUT,
    ) -> None:
        self.plan = plan
        self.params = LinkParams.from_plan(plan, max_batch, max_words, result_depth)
        self.plan_hash = int(plan.hash, 16)
        if rx_timeout < 0:
            raise ValueError(f"rx_timeout must be ≥ 0 cycles, got {rx_timeout}")
        self.rx_timeout = rx_timeout
        super().__init__(
            {
                "rx": In(stream.Signature(8)),
                "tx": Out(stream.Signature(8)),
                "net": In(network_signature(plan)),
                "busy": Out(1),
            }
        )

    def elaborate(self, platform) -> Module:  # noqa: C901  (one FSM, one place)
        m = Module()
        P = self.params
        S, N, B, X = P.num_stages, P.in_features, P.x_bytes, P.x_bits
        K, D = P.num_counters, P.result_depth
        E = S + 3  # index of the first engine counter (`accepted`) in READ_COUNTERS order
        rx, tx, net = self.rx, self.tx, self.net
        assert B <= 4 and X <= 32

        # ---- buffers ----
        # command buffer (bytes), read through `rd_ptr` (sync port: data is always rxbuf[rd_ptr])
        m.submodules.rxbuf = rxbuf = Memory(shape=8, depth=P.rx_max, init=[])
        rxw, rxr = rxbuf.write_port(), rxbuf.read_port()
        rd_ptr = Signal(range(P.rx_max + 1))
        rd_next = Signal.like(rd_ptr)
        m.d.comb += [rd_next.eq(rd_ptr), rxr.addr.eq(rd_next)]
        m.d.sync += rd_ptr.eq(rd_next)
        byte = rxr.data

        # `mem` (bytes): the response buffer at 0 .. tx_max-1 (also the retransmission cache),
        # then the counters: two regions of Z bytes, offsets (r = 0) and the engine's own counter
        # values (r = 1), counter c at byte 4c (LE). The value slots of the network counters
        # (c < E) are unused; the constant HELLO bytes sit there, ending right before
        # `accepted`, so HELLO is one 26-byte copy (constants, accepted, results_read).
        T = P.tx_max
        cb = max(1, (K - 1).bit_length())
        Z = 4 << cb
        OB = -(-T // (2 * Z)) * (2 * Z)
        HB = OB + Z + 4 * E - (HELLO_BYTES - 8)
        depth = OB + 2 * Z
        assert HB >= OB + 4 * K  # the constants overlap no used slot
        init = [0] * depth
        init[HB : HB + HELLO_BYTES - 8] = P.hello_payload(0, 0)[: HELLO_BYTES - 8]
        m.submodules.mem = mem = Memory(shape=8, depth=depth, init=init)
        mw, mr = mem.write_port(), mem.read_port()
        ra = Signal(range(depth), init=OB)  # read address; mr.data is always mem[ra]
        ra_next = Signal.like(ra)
        m.d.comb += [ra_next.eq(ra), mr.addr.eq(ra_next)]
        m.d.sync += ra.eq(ra_next)

        def slot(r: int, c) -> Cat:
            """Address of byte 0 of counter ``c`` in region ``r`` (0 offsets, 1 values)."""
            return Cat(
                Const(0, 2),
                c[:cb] if not isinstance(c, int) else Const(c, cb),
                Const(r, 1),
                Const(OB // (2 * Z), len(ra) - cb - 3),
            )

        wptr = Signal(range(T + 1))  # response bytes written; after DONE the cached length

        def emit(value) -> None:
            """Append a byte to the response."""
            m.d.comb += [mw.addr.eq(wptr), mw.data.eq(value), mw.en.eq(1)]
            m.d.sync += wptr.eq(wptr + 1)

        def wmem(value) -> None:
            """Write a byte at the read address (counter updates)."""
            m.d.comb += [mw.addr.eq(ra), mw.data.eq(value), mw.en.eq(1)]

        # results FIFO: result_depth slots of 16 bytes in one byte memory; a result is written
        # a byte per cycle straight from `result_out` (held valid by the stream rules), which
        # is acknowledged with the last byte; READ_RESULTS copies the bytes to the response
        RS = 16
        m.submodules.results = rmem = Memory(shape=8, depth=D * RS, init=[])
        fw, fr = rmem.write_port(), rmem.read_port()
        wslot, rslot = Signal(range(D)), Signal(range(D))
        wb, rb = Signal(4), Signal(4)
        rb_next = Signal(4)
        level = Signal(range(D + 1))
        push, pop = Signal(), Signal()
        ro = net.result_out
        rbytes = Cat(ro.payload.as_value(), Const(0, 8 * RESULT_BYTES - len(ro.payload.as_value())))
        m.d.comb += [rb_next.eq(rb), fr.addr.eq(Cat(rb_next, rslot))]
        m.d.sync += rb.eq(rb_next)

        def wrap_inc(sig, n: int):
            return sig + 1 if n == 1 << len(sig) else Mux(sig == n - 1, 0, sig + 1)

        with m.If(ro.valid & (level != D)):
            m.d.comb += [
                fw.addr.eq(Cat(wb, wslot)),
                fw.data.eq(rbytes.word_select(wb, 8)),
                fw.en.eq(1),
            ]
            m.d.sync += wb.eq(wb + 1)
            with m.If(wb == RESULT_BYTES - 1):
                m.d.comb += [ro.ready.eq(1), push.eq(1)]
                m.d.sync += [wb.eq(0), wslot.eq(wrap_inc(wslot, D))]
        with m.If(pop):
            m.d.sync += rslot.eq(wrap_inc(rslot, D))
        with m.If(push & ~pop):
            m.d.sync += level.eq(level + 1)
        with m.Elif(pop & ~push):
            m.d.sync += level.eq(level - 1)

        # ---- state ----
        typ, seq = Signal(8), Signal(8)
        length = Signal(range(P.rx_max + 1))
        bi = Signal(2)  # byte index within a 4-byte (or B-byte) group
        crc = Signal(32)
        fin_byte = (~crc).word_select(bi, 8)  # byte bi of the final CRC (sent / compared)
        bad = Signal()  # a received CRC byte differed
        # one shared CRC byte step: receiving states feed rx.payload, sending states the byte out
        crc_byte = Signal(8)
        crc_upd = Signal(32)
        m.d.comb += [crc_byte.eq(rx.payload), crc_upd.eq(_crc_next(crc, crc_byte))]
        nrec = Signal(range(P.max_batch + 1))
        last_seq = Signal(8)
        have_last = Signal()
        rsp_type = Signal(8)
        full = Signal()  # NAK reason: FULL (else BAD_ARG)
        outstanding = Signal(range(D + 1))  # accepted − results_read (≤ result_depth)
        sh = Signal(32)  # shift register: counter word, weight word, sample feature bytes
        carry = Signal()
        ret = Signal(3)
        RET = ["HUNT", "DISPATCH", "SEND", "S_LAB0", "S_ACK0", "R_POP"]
        c = Signal(range(K))

        s = Signal(9)  # mem[ra] + carry: counter increments, and copies (carry 0)
        m.d.comb += s.eq(mr.data + carry)

        def shift_in(b) -> None:
            m.d.sync += sh.eq(Cat(sh[8:], b))

        # receive timeout
        in_frame = Signal()
        tmo_hit = Signal()
        if self.rx_timeout:
            # counts down the cycles left; hits in the rx_timeout-th cycle without a byte
            tmo = Signal(range(self.rx_timeout + 1), init=self.rx_timeout - 1)
            with m.If(in_frame & ~rx.valid):
                m.d.sync += tmo.eq(tmo - 1)
            with m.Else():
                m.d.sync += tmo.eq(self.rx_timeout - 1)
            m.d.comb += tmo_hit.eq(tmo == 0)

        # header check: (type, length) of a command, and the record count of SAMPLES
        hdr_len = Signal(16)
        hdr_ok = Signal()
        hdr_nrec = Signal.like(nrec)
        R = P.record_bytes
        with m.Switch(typ):
            with m.Case(Cmd.HELLO, Cmd.FLUSH, Cmd.READ_COUNTERS, Cmd.RESET_COUNTERS):
                m.d.comb += hdr_ok.eq(hdr_len == 0)
            with m.Case(Cmd.READ_RESULTS):
                m.d.comb += hdr_ok.eq(hdr_len == 1)
            with m.Case(Cmd.READ_WEIGHTS):
                m.d.comb += hdr_ok.eq(hdr_len == WEIGHT_HEADER_BYTES)
            with m.Case(Cmd.WRITE_WEIGHTS):
                m.d.comb += hdr_ok.eq(
                    (hdr_len >= WEIGHT_HEADER_BYTES + 4)
                    & (hdr_len <= WEIGHT_HEADER_BYTES + 4 * P.max_words)
                    & (hdr_len[0:2] == (WEIGHT_HEADER_BYTES % 4))
                )
            with m.Case(Cmd.SAMPLES):
                for k in range(1, P.max_batch + 1):
                    with m.If(hdr_len == k * R):
                        m.d.comb += [hdr_ok.eq(1), hdr_nrec.eq(k)]

        # SAMPLES
        label = Signal(16)
        train = Signal()
        feat = Signal(range(N))
        # weights
        # weights: only the bits a valid header can have are kept; `wbad` flags the rest (a
        # stage ≥ S, a kind out of range, a nonzero high byte of row or col)
        sbits = max(1, (S - 1).bit_length())
        rw = 8 if max(P.stage_rows) <= 256 else 16
        cw = 8 if max(P.stage_cols) <= 256 else 16
        wstage, wkind, wcount = Signal(sbits), Signal(2), Signal(8)
        wrow, wcol = Signal(rw), Signal(cw)
        wbad = Signal()
        # FLUSH
        fwait = Signal(3)

        si = net.sample_in
        wc = net.wacc_cmd
        wr = net.wacc_rsp
        m.d.comb += [
            si.payload.x.eq(sh[32 - 8 * B :][:X]),
            si.payload.label.eq(label),
            si.payload.train.eq(train),
            si.payload.last.eq(feat == N - 1),
            wc.payload.stage.eq(wstage),
            wc.payload.kind.eq(wkind),
            wc.payload.row.eq(wrow),
            wc.payload.col.eq(wcol),
            wc.payload.data.eq(sh),
        ]

        def inc(ci: int, target) -> None:
            """Increment engine counter ``ci`` (in `mem`, 4 cycles), then go to ``target`` (a
            state name, or a Value selecting between two: ``(cond, if_true, if_false)``)."""
            m.d.comb += ra_next.eq(slot(1, ci))
            if isinstance(target, str):
                code = RET.index(target)
            else:
                cond, a, b = target
                code = Mux(cond, RET.index(a), RET.index(b))
            m.d.sync += [carry.eq(1), bi.eq(0), ret.eq(code)]
            m.next = "INC"

        CNT = {
            n: E + i
            for i, n in enumerate(
                ("accepted", "popped", "frames_ok", "bad_crc", "bad_header", "timeouts", "dups")
            )
        }

        def rx_byte(state_body) -> None:
            """A receiving state: take a byte when one is offered, else count the timeout."""
            m.d.comb += [rx.ready.eq(1), in_frame.eq(1)]
            with m.If(rx.valid):
                state_body()
            with m.Elif(tmo_hit):
                inc(CNT["timeouts"], "HUNT")

        with m.FSM(name="link") as fsm:
            # ---------------- after reset: zero the counters and offsets ----------------
            with m.State("CLEAR"):
                with m.If((ra < HB) | (ra >= HB + HELLO_BYTES - 8)):
                    wmem(sh[0:8])  # zero after reset
                m.d.comb += ra_next.eq(ra + 1)
                with m.If(ra == depth - 1):
                    m.next = "HUNT"

            # ---------------- receive ----------------
            with m.State("HUNT"):
                m.d.comb += rx.ready.eq(1)
                with m.If(rx.valid & (rx.payload == SYNC[0])):
                    m.next = "SYNC1"

            with m.State("SYNC1"):

                def body():
                    with m.If(rx.payload == SYNC[1]):
                        m.d.sync += crc.eq(0xFFFFFFFF)
                        m.next = "TYPE"
                    with m.Elif(rx.payload != SYNC[0]):
                        m.next = "HUNT"

                rx_byte(body)

            for name, nxt, reg in (("TYPE", "SEQ", typ), ("SEQ", "LEN0", seq)):
                with m.State(name):

                    def body(nxt=nxt, reg=reg):
                        m.d.sync += [reg.eq(rx.payload), crc.eq(crc_upd)]
                        m.next = nxt

                    rx_byte(body)

            with m.State("LEN0"):

                def body():
                    m.d.sync += [length.eq(rx.payload), crc.eq(crc_upd)]
                    m.next = "LEN1"

                rx_byte(body)

            with m.State("LEN1"):
                m.d.comb += hdr_len.eq(Cat(length[0:8], rx.payload))

                def body():
                    m.d.comb += rd_next.eq(0)
                    m.d.sync += [
                        length.eq(hdr_len),
                        crc.eq(crc_upd),
                        nrec.eq(hdr_nrec),
                        bad.eq(0),
                        bi.eq(0),
                    ]
                    with m.If(~hdr_ok):
                        inc(CNT["bad_header"], "HUNT")
                    with m.Elif(hdr_len == 0):
                        m.next = "CRC"
                    with m.Else():
                        m.next = "PAYLOAD"

                rx_byte(body)

            with m.State("PAYLOAD"):

                def body():
                    m.d.comb += [
                        rxw.addr.eq(rd_ptr),
                        rxw.data.eq(rx.payload),
                        rxw.en.eq(1),
                        rd_next.eq(rd_ptr + 1),
                    ]
                    m.d.sync += crc.eq(crc_upd)
                    with m.If(rd_ptr + 1 == length):
                        m.next = "CRC"

                rx_byte(body)

            with m.State("CRC"):

                def body():
                    ne = rx.payload != fin_byte
                    m.d.sync += [bad.eq(bad | ne), bi.eq(bi + 1)]
                    with m.If(bi == 3):
                        with m.If(bad | ne):
                            inc(CNT["bad_crc"], "HUNT")
                        with m.Else():
                            inc(CNT["frames_ok"], "DISPATCH")

                rx_byte(body)

            # ---------------- engine counter increment (read-modify-write in `mem`) --------
            with m.State("INC"):
                m.d.comb += ra_next.eq(ra + 1)
                wmem(s[:8])
                m.d.sync += [carry.eq(s[8]), bi.eq(bi + 1)]
                with m.If(bi == 3):
                    with m.Switch(ret):
                        for code, target in enumerate(RET):
                            with m.Case(code):
                                m.next = target

            # ---------------- dispatch ----------------
            with m.State("DISPATCH"):
                m.d.comb += rd_next.eq(0)
                with m.If((typ != Cmd.HELLO) & have_last & (seq == last_seq)):
                    inc(CNT["dups"], "SEND")
                with m.Else():
                    m.d.sync += [
                        wptr.eq(0),
                        rsp_type.eq(typ | 0x80),
                        c.eq(0),
                        bi.eq(0),
                        fwait.eq(0),
                    ]
                    with m.Switch(typ):
                        with m.Case(Cmd.HELLO):
                            m.d.comb += ra_next.eq(HB)
                            m.d.sync += carry.eq(0)
                            m.next = "HELLO"
                        with m.Case(Cmd.SAMPLES):
                            m.next = "S_CHECK"
                        with m.Case(Cmd.READ_RESULTS):
                            m.next = "R_CHECK"
                        with m.Case(Cmd.FLUSH):
                            m.next = "FLUSH"
                        with m.Case(Cmd.READ_COUNTERS, Cmd.RESET_COUNTERS):
                            m.next = "C_LATCH"
                        with m.Default():  # READ_WEIGHTS, WRITE_WEIGHTS
                            m.next = "W_HDR"

            with m.State("NAK0"):
                emit(typ)
                m.d.sync += rsp_type.eq(NAK)
                m.next = "NAK1"

            with m.State("NAK1"):
                emit(Mux(full, NakReason.FULL, NakReason.BAD_ARG))
                m.next = "DONE"

            with m.State("DONE"):
                m.d.sync += [last_seq.eq(seq), have_last.eq(1)]
                m.next = "SEND"

            # ---------------- HELLO ----------------
            with m.State("HELLO"):
                emit(s[:8])
                m.d.comb += ra_next.eq(ra + 1)
                with m.If(wptr == HELLO_BYTES - 1):
                    m.next = "DONE"

            # ---------------- SAMPLES ----------------
            with m.State("S_CHECK"):
                m.d.sync += full.eq(1)
                with m.If(outstanding + nrec > D):
                    m.next = "NAK0"
                with m.Else():
                    m.next = "S_LAB0"

            with m.State("S_LAB0"):
                m.d.comb += rd_next.eq(rd_ptr + 1)
                m.d.sync += label[0:8].eq(byte)
                m.next = "S_LAB1"

            with m.State("S_LAB1"):
                m.d.comb += rd_next.eq(rd_ptr + 1)
                m.d.sync += label[8:16].eq(byte)
                m.next = "S_FLAGS"

            with m.State("S_FLAGS"):
                m.d.comb += rd_next.eq(rd_ptr + 1)
                m.d.sync += [train.eq(byte[0]), feat.eq(0), bi.eq(0)]
                m.next = "S_FEAT"

            with m.State("S_FEAT"):
                m.d.comb += rd_next.eq(rd_ptr + 1)
                shift_in(byte)
                m.d.sync += bi.eq(bi + 1)
                with m.If(bi == B - 1):
                    m.d.sync += bi.eq(0)
                    m.next = "S_PUSH"

            with m.State("S_PUSH"):
                m.d.comb += si.valid.eq(1)
                with m.If(si.ready):
                    with m.If(feat == N - 1):
                        m.d.sync += [outstanding.eq(outstanding + 1), nrec.eq(nrec - 1)]
                        inc(CNT["accepted"], (nrec == 1, "S_ACK0", "S_LAB0"))
                    with m.Else():
                        m.d.sync += feat.eq(feat + 1)
                        m.next = "S_FEAT"

            with m.State("S_ACK0"):
                m.d.comb += ra_next.eq(slot(1, CNT["accepted"]))
                m.d.sync += carry.eq(0)
                m.next = "S_ACK"

            with m.State("S_ACK"):
                emit(s[:8])
                m.d.comb += ra_next.eq(ra + 1)
                with m.If(wptr == 3):
                    m.next = "DONE"

            # ---------------- READ_RESULTS ----------------
            nres = Signal(8)
            with m.State("R_CHECK"):
                m.d.sync += full.eq(0)
                with m.If(byte == 0):
                    m.next = "NAK0"
                with m.Else():
                    cnt = Signal(8)
                    lim = (
                        level
                        if P.max_results >= D
                        else Mux(level < P.max_results, level, P.max_results)
                    )
                    m.d.comb += cnt.eq(Mux(byte < lim, byte, lim))
                    emit(cnt)
                    m.d.sync += nres.eq(cnt)
                    m.next = "R_POP"

            with m.State("R_POP"):
                m.d.comb += rb_next.eq(0)
                with m.If(nres == 0):
                    m.next = "DONE"
                with m.Else():
                    m.next = "R_EMIT"

            with m.State("R_EMIT"):
                emit(fr.data)
                m.d.comb += rb_next.eq(rb + 1)
                with m.If(rb == RESULT_BYTES - 1):
                    m.d.comb += pop.eq(1)
                    m.d.sync += [outstanding.eq(outstanding - 1), nres.eq(nres - 1)]
                    inc(CNT["popped"], "R_POP")

            # ---------------- FLUSH ----------------
            with m.State("FLUSH"):
                m.d.comb += net.flush.eq(1)
                # hold flush a few cycles before trusting `idle` (it may lag the last beat)
                with m.If(fwait != 4):
                    m.d.sync += fwait.eq(fwait + 1)
                with m.Elif(net.idle):
                    m.next = "DONE"

            # ---------------- counters ----------------
            # READ_COUNTERS emits value − offset a byte at a time; RESET_COUNTERS writes the
            # value into the offset slot. A network counter is latched whole first (it may
            # change while it is read); an engine counter is loaded from `mem`.
            borrow = Signal()
            is_read = typ[0]  # READ_COUNTERS = 5, RESET_COUNTERS = 6
            with m.State("C_LATCH"):
                m.d.sync += [borrow.eq(0), bi.eq(0)]
                with m.If(c < E):
                    with m.Switch(c):
                        for i in range(E):
                            v = (
                                (net.samples_trained, net.ticks)[i]
                                if i < 2
                                else net.saturations[i - 2]
                            )
                            with m.Case(i):
                                m.d.sync += sh.eq(v)
                    m.d.comb += ra_next.eq(slot(0, c))
                    m.next = "C_EMIT"
                with m.Else():
                    m.d.comb += ra_next.eq(slot(1, c))
                    m.next = "C_LOADV"

            with m.State("C_LOADV"):
                shift_in(mr.data)
                m.d.comb += ra_next.eq(ra + 1)
                m.d.sync += bi.eq(bi + 1)
                with m.If(bi == 3):
                    m.d.comb += ra_next.eq(slot(0, c))
                    m.next = "C_EMIT"

            with m.State("C_EMIT"):
                d = Signal(9)
                m.d.comb += [d.eq(sh[0:8] - mr.data - borrow), ra_next.eq(ra + 1)]
                with m.If(is_read):
                    emit(d[:8])
                with m.Else():
                    wmem(sh[0:8])
                shift_in(mr.data)
                m.d.sync += [borrow.eq(d[8]), bi.eq(bi + 1)]
                with m.If(bi == 3):
                    m.d.sync += c.eq(c + 1)
                    with m.If(c == K - 1):
                        m.next = "DONE"
                    with m.Else():
                        m.next = "C_LATCH"

            # ---------------- weights ----------------
            with m.State("W_HDR"):
                m.d.comb += rd_next.eq(rd_ptr + 1)
                pad = 1 << sbits
                kinds = Array([Const(k, 2) for k in P.stage_kinds] + [Const(0, 2)] * (pad - S))
                with m.Switch(rd_ptr[0:3]):
                    with m.Case(0):
                        m.d.sync += [wstage.eq(byte), wbad.eq(byte >= S)]
                    with m.Case(1):
                        m.d.sync += [wkind.eq(byte), wbad.eq(wbad | (byte >= kinds[wstage]))]
                    for k, reg, width in ((2, wrow, rw), (4, wcol, cw)):
                        with m.Case(k):
                            m.d.sync += reg[0:8].eq(byte)
                        with m.Case(k + 1):
                            if width == 8:
                                m.d.sync += wbad.eq(wbad | (byte != 0))
                            else:
                                m.d.sync += reg[8:16].eq(byte)
                    with m.Case(6):
                        m.d.sync += wcount.eq(byte)
                with m.If(rd_ptr[0:3] == WEIGHT_HEADER_BYTES - 1):
                    m.next = "W_CHECK"

            is_write = typ[3]  # WRITE_WEIGHTS = 8, READ_WEIGHTS = 7
            with m.State("W_CHECK"):
                rows = Array(
                    [Const(r, rw + 1) for r in P.stage_rows] + [Const(0, rw + 1)] * (pad - S)
                )
                cols = Array(
                    [Const(c_, cw + 1) for c_ in P.stage_cols] + [Const(0, cw + 1)] * (pad - S)
                )
                ok = Signal()
                m.d.comb += ok.eq(
                    ~wbad
                    & (wrow < rows[wstage])
                    & (wcount != 0)
                    & (wcount <= P.max_words)
                    & (wcol + wcount <= cols[wstage])
                    & (~is_write | (length == WEIGHT_HEADER_BYTES + 4 * wcount))
                )
                m.d.sync += [full.eq(0), bi.eq(0)]
                with m.If(~ok):
                    m.next = "NAK0"
                with m.Elif(is_write):
                    m.next = "W_WDATA"
                with m.Else():
                    m.next = "W_RCMD"

            with m.State("W_RCMD"):
                m.d.comb += [wc.valid.eq(1), wc.payload.write.eq(0), net.flush.eq(1)]
                with m.If(wc.ready):
                    m.next = "W_RRSP"

            with m.State("W_RRSP"):
                # emit the word a byte per cycle while the response is held, then take it
                with m.If(wr.valid):
                    emit(wr.payload.data.as_unsigned().word_select(bi, 8))
                    m.d.sync += bi.eq(bi + 1)
                    with m.If(bi == 3):
                        m.d.comb += wr.ready.eq(1)
                        m.d.sync += [wcol.eq(wcol + 1), wcount.eq(wcount - 1)]
                        with m.If(wcount == 1):
                            m.next = "DONE"
                        with m.Else():
                            m.next = "W_RCMD"

            with m.State("W_WDATA"):
                m.d.comb += rd_next.eq(rd_ptr + 1)
                shift_in(byte)
                m.d.sync += bi.eq(bi + 1)
                with m.If(bi == 3):
                    m.next = "W_WCMD"

            with m.State("W_WCMD"):
                m.d.comb += [wc.valid.eq(1), wc.payload.write.eq(1), net.flush.eq(1)]
                with m.If(wc.ready):
                    m.next = "W_WRSP"

            with m.State("W_WRSP"):
                m.d.comb += wr.ready.eq(1)
                with m.If(wr.valid):
                    m.d.sync += [wcol.eq(wcol + 1), wcount.eq(wcount - 1)]
                    with m.If(wcount == 1):
                        m.next = "DONE"
                    with m.Else():
                        m.next = "W_WDATA"

            # ---------------- send ----------------
            for name, b_, nxt in (("SEND", SYNC[0], "SEND1"), ("SEND1", SYNC[1], "SEND_HDR")):
                with m.State(name):
                    m.d.comb += [tx.valid.eq(1), tx.payload.eq(b_)]
                    with m.If(tx.ready):
                        m.d.sync += [crc.eq(0xFFFFFFFF), bi.eq(0)]
                        m.next = nxt

            with m.State("SEND_HDR"):
                hdr = Cat(rsp_type, last_seq, wptr, Const(0, 16 - len(wptr))).word_select(bi, 8)
                m.d.comb += [tx.valid.eq(1), tx.payload.eq(hdr), crc_byte.eq(hdr), ra_next.eq(0)]
                with m.If(tx.ready):
                    m.d.sync += [crc.eq(crc_upd), bi.eq(bi + 1)]
                    with m.If(bi == 3):
                        with m.If(wptr == 0):
                            m.next = "SEND_CRC"
                        with m.Else():
                            m.next = "SEND_PAY"

            with m.State("SEND_PAY"):
                m.d.comb += [tx.valid.eq(1), tx.payload.eq(mr.data), crc_byte.eq(mr.data)]
                with m.If(tx.ready):
                    m.d.comb += ra_next.eq(ra + 1)
                    m.d.sync += crc.eq(crc_upd)
                    with m.If(ra + 1 == wptr):
                        m.next = "SEND_CRC"

            with m.State("SEND_CRC"):
                m.d.comb += [tx.valid.eq(1), tx.payload.eq(fin_byte)]
                with m.If(tx.ready):
                    m.d.sync += bi.eq(bi + 1)
                    with m.If(bi == 3):
                        m.next = "HUNT"

        m.d.comb += self.busy.eq(~fsm.ongoing("HUNT"))
        return m
