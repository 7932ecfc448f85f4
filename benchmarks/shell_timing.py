"""Time the board shell on its own: a ULX3S build whose network runs in a second clock domain.

In a normal board build nextpnr reports one critical path per clock, and the network's hides
every path of the shell around it (UART, RX FIFO, link engine, on-chip training set). This
analysis build drives ``NetworkTop`` from a second ``EHXPLLL`` output at the same frequency as
``sync`` (CLKOS, the CLKOP dividers), so nextpnr reports the shell's own critical path
(``sync``), the network's (``net``) and the worst crossing each way. It is a measuring design,
not a product one: both domains run from one VCO in phase, the crossings are timed only as
"max delay" and the bitstream is not meant for a board. Results: docs/boards.md §4.1.

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

from amaranth import (
    ClockDomain,
    ClockSignal,
    Const,
    DomainRenamer,
    Instance,
    Module,
    ResetSignal,
    Signal,
)
from amaranth.lib import fifo, io, wiring
from pipetrain.compiler.lanes import parse_lanes
from pipetrain.compiler.plan import Plan
from pipetrain.compiler.targets import get_board
from pipetrain.hdl.board import BoardTop
from pipetrain.hdl.link import LinkEngine
from pipetrain.hdl.pll import ICE40_POR_S, PLLSetting, pick_pll
from pipetrain.hdl.top import NetworkTop
from pipetrain.hdl.uart import UARTRx, UARTTx
from pipetrain.host.bitstream import build_design
from pipetrain.host.flow import compile_design

__all__ = ["SplitTop", "main"]


class SplitTop(BoardTop):
    """A ULX3S board top with ``NetworkTop(plan)`` in domain ``net`` and the shell in ``sync``.

    Parameters
    ----------
    plan: the design plan.
    setting: the ECP5 PLL setting of both clocks (:func:`~pipetrain.hdl.pll.pick_pll`).
    onchip_samples: slots of the link's on-chip training set (0: none).

    Both domains are held in reset until the PLL has locked and :data:`ICE40_POR_S` more, as in
    :class:`~pipetrain.hdl.pll.PLLClock`; led 0 shows the link's ``busy`` (keeps it placed).
    """

    def __init__(self, plan: Plan, setting: PLLSetting, onchip_samples: int) -> None:
        super().__init__(get_board("ulx3s-85f"), lambda: None, clock_hz=setting.out_hz)
        self.plan, self.setting, self.onchip_samples = plan, setting, onchip_samples

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        s, dv = self.setting, self.setting.dividers
        clk, net_clk, lock = Signal(name="pll_clk"), Signal(name="net_clk"), Signal(name="lock")
        pin = platform.request(platform.default_clk, dir="-")
        m.submodules.osc = osc = io.Buffer("i", pin)
        mhz = f"{s.out_hz / 1e6:g}"
        m.submodules.pll = Instance(
            "EHXPLLL",
            a_FREQUENCY_PIN_CLKI=f"{s.ref_hz / 1e6:g}",
            a_FREQUENCY_PIN_CLKOP=mhz,
            a_FREQUENCY_PIN_CLKOS=mhz,
            a_ICP_CURRENT="12",
            a_LPF_RESISTOR="8",
            a_MFG_ENABLE_FILTEROPAMP="1",
            a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED",
            p_INTFB_WAKE="DISABLED",
            p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED",
            p_OUTDIVIDER_MUXA="DIVA",
            p_OUTDIVIDER_MUXB="DIVB",
            p_CLKOP_ENABLE="ENABLED",
            p_CLKOS_ENABLE="ENABLED",
            p_CLKI_DIV=dv["CLKI_DIV"],
            p_CLKFB_DIV=dv["CLKFB_DIV"],
            p_CLKOP_DIV=dv["CLKOP_DIV"],
            p_CLKOP_CPHASE=dv["CLKOP_CPHASE"],
            p_CLKOP_FPHASE=0,
            p_CLKOS_DIV=dv["CLKOP_DIV"],
            p_CLKOS_CPHASE=dv["CLKOP_CPHASE"],
            p_CLKOS_FPHASE=0,
            p_FEEDBK_PATH="CLKOP",
            i_CLKI=osc.i,
            i_CLKFB=clk,
            i_RST=Const(0),
            i_STDBY=Const(0),
            i_PHASESEL0=Const(0),
            i_PHASESEL1=Const(0),
            i_PHASEDIR=Const(1),
            i_PHASESTEP=Const(1),
            i_PHASELOADREG=Const(1),
            i_PLLWAKESYNC=Const(0),
            i_ENCLKOP=Const(0),
            o_CLKOP=clk,
            o_CLKOS=net_clk,
            o_LOCK=lock,
        )
        m.domains.sync = ClockDomain("sync")
        m.domains.net = ClockDomain("net")
        m.domains.por = ClockDomain("por", reset_less=True, local=True)
        delay = max(1, int(ICE40_POR_S * s.out_hz))
        lock_s, timer = Signal(2), Signal(range(delay + 1))
        m.d.comb += [ClockSignal("por").eq(clk), ClockSignal("sync").eq(clk)]
        m.d.comb += ClockSignal("net").eq(net_clk)
        m.d.por += lock_s.eq((lock_s << 1) | lock)
        with m.If(~lock_s[1]):
            m.d.por += timer.eq(0)
        with m.Elif(timer != delay):
            m.d.por += timer.eq(timer + 1)
        m.d.comb += [ResetSignal("sync").eq(timer != delay), ResetSignal("net").eq(timer != delay)]

        rx_timeout = max(1, round(s.out_hz * 0.021))
        m.submodules.link = link = LinkEngine(
            self.plan, rx_timeout=rx_timeout, onchip_samples=self.onchip_samples
        )
        net = NetworkTop(self.plan)
        m.submodules.net = DomainRenamer("net")(net)
        wiring.connect(m, link.net, net)
        m.submodules.uart_rx = rx = UARTRx(self.divisor)
        m.submodules.uart_tx = tx = UARTTx(self.divisor)
        m.submodules.rx_fifo = q = fifo.SyncFIFOBuffered(width=8, depth=self.fifo_depth)
        wiring.connect(m, rx.o, q.w_stream)
        wiring.connect(m, q.r_stream, link.rx)
        wiring.connect(m, link.tx, tx.i)
        uart = platform.request("uart", 0, dir="-")
        m.submodules.rx_pin = rx_buf = io.Buffer("i", uart.rx)
        m.submodules.tx_pin = tx_buf = io.Buffer("o", uart.tx)
        m.submodules.led0 = led = io.Buffer("o", platform.request("led", 0, dir="-"))
        m.d.comb += [rx.rx.eq(rx_buf.i), tx_buf.o.eq(tx.tx), led.o.eq(link.busy)]
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
    setting = pick_pll("ecp5", board.osc_hz, a.mhz * 1e6, board.baud)
    top = SplitTop(res.plan, setting, a.onchip)
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
