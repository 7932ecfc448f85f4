"""SAMPLES and STORE (docs/protocol.md §2): records from the command payload into ``sample_in``."""

from __future__ import annotations

from typing import Any

from amaranth import Array, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..compiler.plan import Plan
from ..protocol.wire import LinkParams
from .link_ports import command_signature
from .top import sample_layout

__all__ = ["SamplesCommand"]


class SamplesCommand(wiring.Component):
    """SAMPLES: every record (``label`` u16, ``flags`` u8, N features bit-packed at X bits, LSB
    first) becomes N beats on ``sample_in`` (``last`` on the final one), and is counted after its
    last beat. STORE's records take the same path (the dispatcher sends the beats to the on-chip
    set instead of the network).

    Unpacking (*derived*: no barrel shifter, area on the iCE40UP5K): ``avail`` counts the record's
    bits taken but not yet pushed (``8·bytes − X·features``, 0 .. X + 7); a feature is complete
    when ``avail ≥ X`` and then starts at bit ``32 − avail`` of ``word`` (the last four bytes
    taken), so an 8-way multiplexer over ``avail − X`` picks it; the padding bits after the last
    feature (< 8) are dropped with the record.

    The result-buffer check (NAK FULL) and the response (the ``accepted`` counter) are the
    dispatcher's, which owns the counters.

    Parameters
    ----------
    plan: the design plan (the ``sample_in`` layout).
    params: link sizes (N, B, X).

    Members
    -------
    cmd, args: :func:`~pipetrain.hdl.link_ports.command_signature` (``cmd`` without payload;
        ``args`` the k records, ``last`` on the final byte of the last one).
    word: ``In(32)`` the last four bytes taken from ``args``, the latest in bits 24..31 (the
        dispatcher's shift register, shared with the weight data and the counter snapshots);
        X ≤ :data:`~pipetrain.protocol.wire.MAX_INPUT_BITS` = 25 keeps a feature inside it.
    sample_in: ``Out(stream.Signature(sample_layout(plan)))`` to NetworkTop: ``x`` is the low
        X bits of a feature (two's complement), ``train`` the flags' bit 0.
    bump: ``Out(stream.Signature(0))`` one beat per record after its last ``sample_in`` beat:
        the dispatcher counts it (``accepted``, and one sample more in flight) and takes it.
    """

    def __init__(self, plan: Plan, params: LinkParams) -> None:
        self.params = params
        super().__init__(
            dict(command_signature(emits=False).members)
            | {
                "word": In(32),
                "sample_in": Out(stream.Signature(sample_layout(plan))),
                "bump": Out(stream.Signature(0)),
            }
        )

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        P = self.params
        N, X = P.in_features, P.x_bits
        cmd, args, si = self.cmd, self.args, self.sample_in
        take = args.valid & args.ready
        byte = args.payload.data
        feature = Signal(range(N))
        avail = Signal(range(X + 8))  # bits taken, not yet pushed
        end = Signal()  # the record just read is the command's last
        label, train = Signal(16), Signal()
        # a complete feature starts at bit 32 − avail of `word`, avail ∈ X .. X + 7
        windows = Array(self.word[32 - X - j :][:X] for j in range(8))
        m.d.comb += [
            si.payload.x.eq(windows[(avail - X)[:3]]),
            si.payload.label.eq(label),
            si.payload.train.eq(train),
            si.payload.last.eq(feature == N - 1),
        ]

        with m.FSM(name="samples"):
            for state, nxt, reg in (
                ("LABEL0", "LABEL1", label[:8]),
                ("LABEL1", "FLAGS", label[8:]),
            ):
                with m.State(state):
                    m.d.comb += args.ready.eq(cmd.valid)
                    with m.If(take):
                        m.d.sync += reg.eq(byte)
                        m.next = nxt

            with m.State("FLAGS"):
                m.d.comb += args.ready.eq(1)
                with m.If(take):
                    m.d.sync += [train.eq(byte[0]), feature.eq(0), avail.eq(0)]
                    m.next = "FEATURE"

            with m.State("FEATURE"):
                m.d.comb += args.ready.eq(1)
                with m.If(take):
                    m.d.sync += [avail.eq(avail + 8), end.eq(args.payload.last)]
                    with m.If(avail + 8 >= X):
                        m.next = "PUSH"

            with m.State("PUSH"):
                m.d.comb += si.valid.eq(1)
                with m.If(si.ready):
                    m.d.sync += [feature.eq(feature + 1), avail.eq(avail - X)]
                    with m.If(si.payload.last):
                        m.next = "BUMP"
                    with m.Elif(avail - X < X):
                        m.next = "FEATURE"

            with m.State("BUMP"):
                m.d.comb += self.bump.valid.eq(1)
                with m.If(self.bump.ready):
                    with m.If(end):
                        m.next = "DONE"
                    with m.Else():
                        m.next = "LABEL0"

            with m.State("DONE"):
                m.d.comb += cmd.ready.eq(1)
                m.next = "LABEL0"
        return m
