"""Time the board shell on its own: a ULX3S build whose network runs in a second clock domain.

In a normal board build nextpnr reports one critical path per clock, and the network's hides
every path of the shell around it (UART, RX FIFO, link engine, on-chip training set). This
analysis build drives ``NetworkTop`` from a second ``EHXPLLL`` output at the same frequency as
``sync`` (``BoardTop(second_domain="net")``: CLKOS with the CLKOP dividers), so nextpnr reports
the shell's own critical path (``sync``), the network's (``net``) and the worst crossing each
way. It is a measuring design, not a product one: both domains run from one VCO in phase, the
crossings are timed only as "max delay" and the bitstream is not meant for a board. Results:
docs/boards.md §4.1.

Usage (one nextpnr pass at ``--mhz``; several minutes on a loaded machine)::

    python benchmarks/shell_timing.py --hidden 8 --lanes 1 --onchip 1437 --out build/shell

Source: *derived* (nextpnr times each clock domain and each crossing separately).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from amaranth import DomainRenamer, Module
from amaranth.lib import wiring
from pipetrain.compiler.lanes import parse_lanes
from pipetrain.compiler.plan import Plan
from pipetrain.compiler.targets import get_board
from pipetrain.hdl.board import BoardTop, byte_core_signature
from pipetrain.hdl.link import LinkEngine
from pipetrain.hdl.pll import pick_pll
from pipetrain.hdl.top import NetworkTop
from pipetrain.host.bitstream import build_design
from pipetrain.host.flow import compile_design

__all__ = ["SplitCore", "main"]


class SplitCore(wiring.Component):
    """The training core with ``NetworkTop(plan)`` in domain ``net`` (the link in ``sync``).

    Parameters
    ----------
    plan: the design plan.
    clock_hz: the clock of both domains (Hz): the link's receive timeout counts it.
    onchip_samples: slots of the link's on-chip training set (0: none).

    Members
    -------
    i: ``In(stream.Signature(8))`` bytes from the host.
    o: ``Out(stream.Signature(8))`` bytes to the host.
    """

    def __init__(self, plan: Plan, clock_hz: float, onchip_samples: int) -> None:
        self.plan, self.clock_hz, self.onchip_samples = plan, clock_hz, onchip_samples
        super().__init__(byte_core_signature())

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        m.submodules.link = link = LinkEngine(
            self.plan,
            rx_timeout=max(1, round(self.clock_hz * 0.021)),
            onchip_samples=self.onchip_samples,
        )
        net = NetworkTop(self.plan)
        m.submodules.net = DomainRenamer("net")(net)
        wiring.connect(m, link.net, net)
        wiring.connect(m, wiring.flipped(self.i), link.rx)
        wiring.connect(m, link.tx, wiring.flipped(self.o))
        return m


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Compile MODEL for the ULX3S, build the split top at ``--mhz`` (one pass) in ``--out``;
    print and return ``{"clocks": {net name: {achieved_mhz, constraint_mhz}}, "utilization",
    "build_s", "lanes"}`` (the critical paths are in ``OUT/build.log``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("model", nargs="?", default="mlp")
    ap.add_argument("--hidden", default=None, help="hidden sizes of model 'mlp'")
    ap.add_argument("--lanes", default=None, help="lanes, e.g. 1 (default: the board fit's)")
    ap.add_argument("--onchip", type=int, default=1437, help="on-chip set slots")
    ap.add_argument("--mhz", type=float, default=100.0, help="the constraint of both clocks")
    ap.add_argument("--out", required=True, help="build directory")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds")
    a = ap.parse_args(argv)
    board = get_board("ulx3s-85f")
    res = compile_design(
        a.model,
        board=board,
        hidden=a.hidden,
        lanes=parse_lanes(a.lanes) if a.lanes else None,
        writers=(),
        onchip_samples=a.onchip,
    )
    f = pick_pll("ecp5", board.osc_hz, a.mhz * 1e6, board.baud).out_hz
    core = SplitCore(res.plan, f, a.onchip)
    top = BoardTop(board, core, clock_hz=f, second_domain="net")
    r = build_design(board, top, os.path.relpath(a.out), force=True, timeout_s=a.timeout)
    out = {
        "clocks": r["clocks"],
        "utilization": {k: r["utilization"][k]["used"] for k in ("luts", "ffs", "bram_blocks")},
        "build_s": r["build_s"],
        "lanes": [s.lanes for s in res.plan.stages],
    }
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"{time.perf_counter() - t0:.0f} s")
