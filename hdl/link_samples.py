"""SAMPLES (docs/protocol.md §2): records from the command payload into ``sample_in``."""

from __future__ import annotations

from typing import Any

from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..compiler.plan import Plan
from ..protocol.wire import LinkParams
from .link_ports import command_signature
from .top import sample_layout

__all__ = ["SamplesCommand"]


class SamplesCommand(wiring.Component):
    """SAMPLES: every record (``label`` u16, ``flags`` u8, N features of B bytes, LE) becomes N
    beats on ``sample_in`` (``last`` on the final one), and is counted after its last beat.

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
        dispatcher's shift register, shared with the weight data and the counter snapshots).
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
        N, B, X = P.in_features, P.x_bytes, P.x_bits
        cmd, args, si = self.cmd, self.args, self.sample_in
        take = args.valid & args.ready
        byte = args.payload.data
        feature = Signal(range(N))
        bi = Signal(range(B))  # byte of the feature
        end = Signal()  # the record just read is the command's last
        label, train = Signal(16), Signal()
        m.d.comb += [
            si.payload.x.eq(self.word[32 - 8 * B :][:X]),
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
                    m.d.sync += [train.eq(byte[0]), feature.eq(0)]
                    m.next = "FEATURE"

            with m.State("FEATURE"):
                m.d.comb += args.ready.eq(1)
                with m.If(take):
                    m.d.sync += [bi.eq(bi + 1), end.eq(args.payload.last)]
                    with m.If(bi == B - 1):
                        m.d.sync += bi.eq(0)
                        m.next = "PUSH"

            with m.State("PUSH"):
                m.d.comb += si.valid.eq(1)
                with m.If(si.ready):
                    m.d.sync += feature.eq(feature + 1)
                    with m.If(si.payload.last):
                        m.next = "BUMP"
                    with m.Else():
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
