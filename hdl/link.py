"""``LinkEngine``: the device side of the host link protocol, between a byte stream and the
network top.

The wire format, the commands and the reliability rules are those of ``docs/protocol.md``; the
constants come from :mod:`pipetrain.host.protocol`, and :class:`~pipetrain.host.protocol.
LinkDeviceModel` is this engine's byte-exact Python model (the tests compare them).

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

Source: docs/protocol.md (*derived*: stop-and-wait ARQ with a response cache).
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..compiler.plan import Plan
from ..host.protocol import (
    CRC_POLY_REFLECTED,
    HELLO_BYTES,
    NAK,
    PROTOCOL_VERSION,
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
    params: the :class:`~pipetrain.host.protocol.LinkParams`.
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
        rx, tx, net = self.rx, self.tx, self.net

        # ---- buffers ----
        m.submodules.rxbuf = rxbuf = Memory(shape=8, depth=P.rx_max, init=[])
        m.submodules.txbuf = txbuf = Memory(shape=8, depth=P.tx_max, init=[])
        rxw, rxr = rxbuf.write_port(), rxbuf.read_port()
        txw, txr = txbuf.write_port(), txbuf.read_port()
        rlay = result_layout()
        m.submodules.results = fifo = SyncFIFOBuffered(width=rlay.size, depth=P.result_depth)
        m.d.comb += [
            fifo.w_data.eq(net.result_out.payload.as_value()),
            fifo.w_en.eq(net.result_out.valid),
            net.result_out.ready.eq(fifo.w_rdy),
        ]

        # read pointers: data of a sync read port is always buf[ptr] (address = next pointer)
        rd_ptr = Signal(range(P.rx_max + 1))
        rd_next = Signal.like(rd_ptr)
        t_ptr = Signal(range(P.tx_max + 1))
        t_next = Signal.like(t_ptr)
        m.d.comb += [
            rd_next.eq(rd_ptr),
            t_next.eq(t_ptr),
            rxr.addr.eq(rd_next),
            txr.addr.eq(t_next),
        ]
        m.d.sync += [rd_ptr.eq(rd_next), t_ptr.eq(t_next)]
        byte = rxr.data

        # response writer
        wptr = Signal(range(P.tx_max + 1))

        def emit(value):
            m.d.comb += [txw.addr.eq(wptr), txw.data.eq(value), txw.en.eq(1)]
            m.d.sync += wptr.eq(wptr + 1)

        # ---- state ----
        typ, seq = Signal(8), Signal(8)
        length = Signal(16)
        idx = Signal(16)
        crc = Signal(32)
        # one shared CRC byte step: receiving states feed rx.payload, sending states the byte out
        crc_byte = Signal(8)
        crc_upd = Signal(32)
        m.d.comb += [crc_byte.eq(rx.payload), crc_upd.eq(_crc_next(crc, crc_byte))]
        rcrc = Signal(32)
        nrec = Signal(range(P.max_batch + 1))
        last_seq = Signal(8)
        have_last = Signal()
        rsp_type, rsp_seq, rsp_len = Signal(8), Signal(8), Signal(16)
        reason = Signal(8)

        accepted, popped = Signal(32), Signal(32)
        frames_ok, bad_crc, bad_header, timeouts, dups = (
            Signal(32, name=n)
            for n in ("frames_ok", "bad_crc", "bad_header", "rx_timeouts", "duplicates")
        )
        counter_vals = [
            net.samples_trained,
            net.ticks,
            *[net.saturations[i] for i in range(S + 1)],
            accepted,
            popped,
            frames_ok,
            bad_crc,
            bad_header,
            timeouts,
            dups,
        ]
        assert len(counter_vals) == P.num_counters
        offsets = [Signal(32, name=f"offset{i}") for i in range(P.num_counters)]
        vals_a, offs_a = Array(counter_vals), Array(offsets)

        # receive timeout
        in_frame = Signal()
        tmo_hit = Signal()
        if self.rx_timeout:
            tmo = Signal(range(self.rx_timeout + 1))
            with m.If(in_frame & ~rx.valid):
                m.d.sync += tmo.eq(tmo + 1)
            with m.Else():
                m.d.sync += tmo.eq(0)
            m.d.comb += tmo_hit.eq(tmo >= self.rx_timeout - 1)

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
        xacc = Signal(8 * B)
        feat = Signal(range(N))
        rec = Signal(range(P.max_batch))
        # READ_RESULTS
        nres = Signal(8)
        ri = Signal(8)
        rres = Signal(rlay.size)
        rview = data.View(rlay, rres)
        res_bytes = Array(
            [rview.sample.word_select(i, 8) for i in range(4)]
            + [rview.pred.word_select(i, 8) for i in range(2)]
            + [rview.loss.word_select(i, 8) for i in range(4)]
            + [Cat(rview.train, Const(0, 7))]
        )
        assert len(res_bytes) == RESULT_BYTES
        # READ_COUNTERS
        ci = Signal(range(P.num_counters))
        cword = Signal(32)
        # weights
        wstage, wkind, wcount = Signal(8), Signal(8), Signal(8)
        wrow, wcol = Signal(16), Signal(16)
        wi = Signal(8)
        wdata = Signal(32)
        is_write = Signal()
        # FLUSH
        fwait = Signal(3)

        hello = list(P.plan_hash) + [
            PROTOCOL_VERSION,
            P.max_batch,
            P.max_words,
            P.num_stages,
            P.result_depth & 0xFF,
            P.result_depth >> 8,
            N & 0xFF,
            N >> 8,
            X,
            B,
        ]
        hello_bytes = Array(
            [Const(b, 8) for b in hello]
            + [accepted.word_select(i, 8) for i in range(4)]
            + [popped.word_select(i, 8) for i in range(4)]
        )
        assert len(hello_bytes) == HELLO_BYTES
        acc_bytes = Array([accepted.word_select(i, 8) for i in range(4)])

        si = net.sample_in
        wc = net.wacc_cmd
        m.d.comb += [
            si.payload.x.eq(xacc[:X]),
            si.payload.label.eq(label),
            si.payload.train.eq(train),
            si.payload.last.eq(feat == N - 1),
            wc.payload.stage.eq(wstage),
            wc.payload.kind.eq(wkind),
            wc.payload.row.eq(wrow),
            wc.payload.col.eq(wcol + wi),
            wc.payload.data.eq(wdata),
        ]

        def rx_byte(state_body):
            """A receiving state: take a byte when one is offered, else count the timeout."""
            m.d.comb += [rx.ready.eq(1), in_frame.eq(1)]
            with m.If(rx.valid):
                state_body()
            with m.Elif(tmo_hit):
                m.d.sync += timeouts.eq(timeouts + 1)
                m.next = "HUNT"

        with m.FSM(name="link") as fsm:
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
                    m.d.sync += [length[0:8].eq(rx.payload), crc.eq(crc_upd)]
                    m.next = "LEN1"

                rx_byte(body)

            with m.State("LEN1"):
                m.d.comb += hdr_len.eq(Cat(length[0:8], rx.payload))

                def body():
                    m.d.sync += [
                        length.eq(hdr_len),
                        crc.eq(crc_upd),
                        idx.eq(0),
                        nrec.eq(hdr_nrec),
                    ]
                    with m.If(~hdr_ok):
                        m.d.sync += bad_header.eq(bad_header + 1)
                        m.next = "HUNT"
                    with m.Elif(hdr_len == 0):
                        m.next = "CRC"
                    with m.Else():
                        m.next = "PAYLOAD"

                rx_byte(body)

            with m.State("PAYLOAD"):

                def body():
                    m.d.comb += [rxw.addr.eq(idx), rxw.data.eq(rx.payload), rxw.en.eq(1)]
                    m.d.sync += [crc.eq(crc_upd), idx.eq(idx + 1)]
                    with m.If(idx == length - 1):
                        m.d.sync += idx.eq(0)
                        m.next = "CRC"

                rx_byte(body)

            with m.State("CRC"):

                def body():
                    got = Cat(rcrc[8:32], rx.payload)
                    m.d.sync += [rcrc.eq(got), idx.eq(idx + 1)]
                    with m.If(idx == 3):
                        with m.If(got == (crc ^ 0xFFFFFFFF)):
                            m.d.sync += frames_ok.eq(frames_ok + 1)
                            m.next = "DISPATCH"
                        with m.Else():
                            m.d.sync += bad_crc.eq(bad_crc + 1)
                            m.next = "HUNT"

                rx_byte(body)

            # ---------------- dispatch ----------------
            with m.State("DISPATCH"):
                m.d.comb += rd_next.eq(0)
                m.d.sync += [
                    wptr.eq(0),
                    idx.eq(0),
                    ci.eq(0),
                    is_write.eq(typ == Cmd.WRITE_WEIGHTS),
                    fwait.eq(0),
                ]
                with m.If((typ != Cmd.HELLO) & have_last & (seq == last_seq)):
                    m.d.sync += dups.eq(dups + 1)
                    m.next = "SEND"
                with m.Else():
                    m.d.sync += rsp_type.eq(typ | 0x80)
                    with m.Switch(typ):
                        with m.Case(Cmd.HELLO):
                            m.next = "HELLO"
                        with m.Case(Cmd.SAMPLES):
                            m.next = "S_CHECK"
                        with m.Case(Cmd.READ_RESULTS):
                            m.next = "R_CHECK"
                        with m.Case(Cmd.FLUSH):
                            m.next = "FLUSH"
                        with m.Case(Cmd.READ_COUNTERS):
                            m.next = "C_LATCH"
                        with m.Case(Cmd.RESET_COUNTERS):
                            m.next = "C_RESET"
                        with m.Default():  # READ_WEIGHTS, WRITE_WEIGHTS
                            m.next = "W_HDR"

            with m.State("NAK0"):
                emit(typ)
                m.d.sync += rsp_type.eq(NAK)
                m.next = "NAK1"

            with m.State("NAK1"):
                emit(reason)
                m.next = "DONE"

            with m.State("DONE"):
                m.d.sync += [
                    rsp_len.eq(wptr),
                    rsp_seq.eq(seq),
                    last_seq.eq(seq),
                    have_last.eq(1),
                    idx.eq(0),
                ]
                m.next = "SEND"

            # ---------------- HELLO ----------------
            with m.State("HELLO"):
                emit(hello_bytes[idx])
                m.d.sync += idx.eq(idx + 1)
                with m.If(idx == HELLO_BYTES - 1):
                    m.next = "DONE"

            # ---------------- SAMPLES ----------------
            with m.State("S_CHECK"):
                outstanding = Signal(32)
                m.d.comb += outstanding.eq(accepted - popped)
                with m.If(outstanding + nrec > P.result_depth):
                    m.d.sync += reason.eq(NakReason.FULL)
                    m.next = "NAK0"
                with m.Else():
                    m.d.sync += rec.eq(0)
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
                m.d.sync += [train.eq(byte[0]), feat.eq(0), idx.eq(0)]
                m.next = "S_FEAT"

            with m.State("S_FEAT"):
                m.d.comb += rd_next.eq(rd_ptr + 1)
                m.d.sync += [xacc.eq(Cat(xacc[8:], byte) if B > 1 else byte), idx.eq(idx + 1)]
                with m.If(idx == B - 1):
                    m.d.sync += idx.eq(0)
                    m.next = "S_PUSH"

            with m.State("S_PUSH"):
                m.d.comb += si.valid.eq(1)
                with m.If(si.ready):
                    with m.If(feat == N - 1):
                        m.d.sync += [accepted.eq(accepted + 1), rec.eq(rec + 1)]
                        with m.If(rec == nrec - 1):
                            m.next = "S_ACK"
                        with m.Else():
                            m.next = "S_LAB0"
                    with m.Else():
                        m.d.sync += feat.eq(feat + 1)
                        m.next = "S_FEAT"

            with m.State("S_ACK"):
                emit(acc_bytes[idx])
                m.d.sync += idx.eq(idx + 1)
                with m.If(idx == 3):
                    m.next = "DONE"

            # ---------------- READ_RESULTS ----------------
            with m.State("R_CHECK"):
                with m.If(byte == 0):
                    m.d.sync += reason.eq(NakReason.BAD_ARG)
                    m.next = "NAK0"
                with m.Else():
                    c1 = Signal(16)
                    cnt = Signal(8)
                    m.d.comb += [
                        c1.eq(Mux(byte < fifo.level, byte, fifo.level)),
                        cnt.eq(Mux(c1 < P.max_results, c1, P.max_results)),
                    ]
                    emit(cnt)
                    m.d.sync += [nres.eq(cnt), ri.eq(0)]
                    m.next = "R_POP"

            with m.State("R_POP"):
                with m.If(ri == nres):
                    m.next = "DONE"
                with m.Else():
                    m.d.comb += fifo.r_en.eq(1)
                    m.d.sync += [rres.eq(fifo.r_data), idx.eq(0)]
                    m.next = "R_EMIT"

            with m.State("R_EMIT"):
                emit(res_bytes[idx])
                m.d.sync += idx.eq(idx + 1)
                with m.If(idx == RESULT_BYTES - 1):
                    m.d.sync += [ri.eq(ri + 1), popped.eq(popped + 1)]
                    m.next = "R_POP"

            # ---------------- FLUSH ----------------
            with m.State("FLUSH"):
                m.d.comb += net.flush.eq(1)
                # hold flush a few cycles before trusting `idle` (it may lag the last beat)
                with m.If(fwait != 4):
                    m.d.sync += fwait.eq(fwait + 1)
                with m.Elif(net.idle):
                    m.next = "DONE"

            # ---------------- counters ----------------
            with m.State("C_LATCH"):
                m.d.sync += [cword.eq(vals_a[ci] - offs_a[ci]), idx.eq(0)]
                m.next = "C_EMIT"

            with m.State("C_EMIT"):
                emit(cword[0:8])
                m.d.sync += [cword.eq(cword >> 8), idx.eq(idx + 1)]
                with m.If(idx == 3):
                    m.d.sync += ci.eq(ci + 1)
                    with m.If(ci == P.num_counters - 1):
                        m.next = "DONE"
                    with m.Else():
                        m.next = "C_LATCH"

            with m.State("C_RESET"):
                m.d.sync += [o.eq(v) for o, v in zip(offsets, counter_vals, strict=True)]
                m.next = "DONE"

            # ---------------- weights ----------------
            with m.State("W_HDR"):
                m.d.comb += rd_next.eq(rd_ptr + 1)
                with m.Switch(idx):
                    for k, target in enumerate(
                        [wstage, wkind, wrow[0:8], wrow[8:16], wcol[0:8], wcol[8:16], wcount]
                    ):
                        with m.Case(k):
                            m.d.sync += target.eq(byte)
                m.d.sync += idx.eq(idx + 1)
                with m.If(idx == WEIGHT_HEADER_BYTES - 1):
                    m.next = "W_CHECK"

            with m.State("W_CHECK"):
                kinds = Array([Const(k, 8) for k in P.stage_kinds])
                rows = Array([Const(r, 16) for r in P.stage_rows])
                cols = Array([Const(c, 17) for c in P.stage_cols])
                ok = Signal()
                m.d.comb += ok.eq(
                    (wstage < S)
                    & (wkind < kinds[wstage])
                    & (wrow < rows[wstage])
                    & (wcount != 0)
                    & (wcount <= P.max_words)
                    & (wcol + wcount <= cols[wstage])
                    & (~is_write | (length == WEIGHT_HEADER_BYTES + 4 * wcount))
                )
                m.d.sync += [wi.eq(0), idx.eq(0)]
                with m.If(~ok):
                    m.d.sync += reason.eq(NakReason.BAD_ARG)
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
                m.d.comb += net.wacc_rsp.ready.eq(1)
                with m.If(net.wacc_rsp.valid):
                    m.d.sync += [wdata.eq(net.wacc_rsp.payload.data), idx.eq(0)]
                    m.next = "W_REMIT"

            with m.State("W_REMIT"):
                emit(wdata[0:8])
                m.d.sync += [wdata.eq(wdata >> 8), idx.eq(idx + 1)]
                with m.If(idx == 3):
                    m.d.sync += wi.eq(wi + 1)
                    with m.If(wi == wcount - 1):
                        m.next = "DONE"
                    with m.Else():
                        m.next = "W_RCMD"

            with m.State("W_WDATA"):
                m.d.comb += rd_next.eq(rd_ptr + 1)
                m.d.sync += [wdata.eq(Cat(wdata[8:32], byte)), idx.eq(idx + 1)]
                with m.If(idx == 3):
                    m.next = "W_WCMD"

            with m.State("W_WCMD"):
                m.d.comb += [wc.valid.eq(1), wc.payload.write.eq(1), net.flush.eq(1)]
                with m.If(wc.ready):
                    m.next = "W_WRSP"

            with m.State("W_WRSP"):
                m.d.comb += net.wacc_rsp.ready.eq(1)
                with m.If(net.wacc_rsp.valid):
                    m.d.sync += [wi.eq(wi + 1), idx.eq(0)]
                    with m.If(wi == wcount - 1):
                        m.next = "DONE"
                    with m.Else():
                        m.next = "W_WDATA"

            # ---------------- send ----------------
            with m.State("SEND"):
                hdr = Array(
                    [
                        Const(SYNC[0], 8),
                        Const(SYNC[1], 8),
                        rsp_type,
                        rsp_seq,
                        rsp_len[0:8],
                        rsp_len[8:16],
                    ]
                )
                out = hdr[idx]
                m.d.comb += [tx.valid.eq(1), tx.payload.eq(out), t_next.eq(0)]
                with m.If(tx.ready):
                    m.d.sync += idx.eq(idx + 1)
                    with m.If(idx < 2):
                        m.d.sync += crc.eq(0xFFFFFFFF)
                    with m.Else():
                        m.d.comb += crc_byte.eq(out)
                        m.d.sync += crc.eq(crc_upd)
                    with m.If(idx == 5):
                        m.d.sync += idx.eq(0)
                        with m.If(rsp_len == 0):
                            m.next = "SEND_CRC"
                        with m.Else():
                            m.next = "SEND_PAY"

            with m.State("SEND_PAY"):
                m.d.comb += [tx.valid.eq(1), tx.payload.eq(txr.data)]
                with m.If(tx.ready):
                    m.d.comb += t_next.eq(t_ptr + 1)
                    m.d.comb += crc_byte.eq(txr.data)
                    m.d.sync += [crc.eq(crc_upd), idx.eq(idx + 1)]
                    with m.If(idx == rsp_len - 1):
                        m.d.sync += idx.eq(0)
                        m.next = "SEND_CRC"

            with m.State("SEND_CRC"):
                fin = Signal(32)
                m.d.comb += [
                    fin.eq(crc ^ 0xFFFFFFFF),
                    tx.valid.eq(1),
                    tx.payload.eq(fin.word_select(idx[0:2], 8)),
                ]
                with m.If(tx.ready):
                    m.d.sync += idx.eq(idx + 1)
                    with m.If(idx == 3):
                        m.next = "HUNT"

        m.d.comb += self.busy.eq(~fsm.ongoing("HUNT"))
        return m
