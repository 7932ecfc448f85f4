"""The board PLLs: divider settings for a network clock, and the clock domain they drive.

A board top runs the network on ``sync`` made from the board oscillator by the FPGA's PLL —
ECP5 ``EHXPLLL``, iCE40 ``SB_PLL40_PAD`` (the iCEBreaker's 12 MHz oscillator drives the PLL's
dedicated input pad, pin 35; the oscillator is then not routed into the fabric). The divider
search (:func:`pll_settings`) enumerates every legal setting of the family and keeps, per output
frequency, the one with the highest phase-detector and VCO frequencies (less jitter);
:func:`pick_pll` takes the fastest output at or below a limit whose UART divisor is within the
UART's tolerance.

Ranges (*derived* from the Lattice PLL documentation's operating ranges, as the open-source
tools ``icepll`` and ``ecppll`` encode them):

* iCE40 (iCE40 sysCLOCK PLL Design and Usage Guide, FPGA-TN-02052, simple feedback): reference
  10–133 MHz; ``f_PFD = f_ref / (DIVR + 1)`` in 10–133 MHz; ``f_VCO = f_PFD · (DIVF + 1)`` in
  533–1066 MHz; ``f_out = f_VCO / 2^DIVQ`` in 16–275 MHz; DIVR 0..15, DIVF 0..127, DIVQ 1..6;
  the loop filter range from f_PFD (< 17, < 26, < 44, < 66, < 101 MHz → 1..5, else 6).
* ECP5 (ECP5 and ECP5-5G sysCLOCK PLL/DLL Design and Usage Guide, FPGA-TN-02200 / TN1263,
  feedback from CLKOP): ``f_PFD = f_ref / CLKI_DIV`` in 3.125–400 MHz; ``f_out = f_PFD ·
  CLKFB_DIV`` in 3.125–400 MHz; ``f_VCO = f_out · CLKOP_DIV`` in 400–800 MHz; each divider
  1..128; ``CLKOP_CPHASE = (CLKOP_DIV − 1) div 2`` as ``ecppll`` writes it.

In simulation (no platform) the top's ``sync`` domain is the network clock itself: the PLL has
no cell model and is not needed (docs/boards.md §2.1).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Any

from amaranth import ClockDomain, ClockSignal, Const, Instance, Module, ResetSignal, Signal
from amaranth.lib import io, wiring

from ..compiler.targets import BoardError
from .uart import UARTError, uart_divisor

__all__ = ["PLLSetting", "ICE40_POR_S", "pll_settings", "pick_pll", "PLLClock"]

#: Power-on reset after the PLL locks (s): the iCE40 block RAMs read 0 for ~3 µs after
#: configuration; Amaranth's own iCE40 reset waits 15 µs, and so does this one.
ICE40_POR_S = 15e-6


@dataclass(frozen=True)
class PLLSetting:
    """One PLL configuration.

    Members
    -------
    family: ``ice40`` or ``ecp5``.
    ref_hz: the oscillator (Hz).
    out_hz: the network clock it makes (Hz), exactly ``ref_hz`` × the divider ratio.
    pfd_hz, vco_hz: phase-detector and VCO frequencies (Hz), inside the family's ranges.
    dividers: the primitive's divider parameters (iCE40: ``DIVR``, ``DIVF``, ``DIVQ``,
        ``FILTER_RANGE``; ECP5: ``CLKI_DIV``, ``CLKFB_DIV``, ``CLKOP_DIV``, ``CLKOP_CPHASE``).
    """

    family: str
    ref_hz: float
    out_hz: float
    pfd_hz: float
    vco_hz: float
    dividers: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        """The ``build.json`` record (frequencies in MHz)."""
        d = asdict(self)
        for k in ("ref_hz", "out_hz", "pfd_hz", "vco_hz"):
            d[k.replace("_hz", "_mhz")] = d.pop(k) / 1e6
        return d


def _ice40_filter(pfd_mhz: float) -> int:
    for i, top in enumerate((17, 26, 44, 66, 101)):
        if pfd_mhz < top:
            return i + 1
    return 6


def _ice40(ref: float) -> list[PLLSetting]:
    out = []
    for divr in range(16):
        pfd = ref / (divr + 1)
        if not 10e6 <= pfd <= 133e6:
            continue
        for divf in range(128):
            vco = pfd * (divf + 1)
            if not 533e6 <= vco <= 1066e6:
                continue
            for divq in range(1, 7):
                f = vco / 2**divq
                if 16e6 <= f <= 275e6:
                    dv = {"DIVR": divr, "DIVF": divf, "DIVQ": divq}
                    dv["FILTER_RANGE"] = _ice40_filter(pfd / 1e6)
                    out.append(PLLSetting("ice40", ref, f, pfd, vco, dv))
    return out


def _ecp5(ref: float) -> list[PLLSetting]:
    out = []
    for ci in range(1, 129):
        pfd = ref / ci
        if not 3.125e6 <= pfd <= 400e6:
            continue
        for fb in range(1, 129):
            f = pfd * fb
            if not 3.125e6 <= f <= 400e6:
                continue
            # the largest CLKOP_DIV with the VCO ≤ 800 MHz (the highest VCO)
            op = min(128, int(800e6 // f))
            if op < 1 or f * op < 400e6:
                continue
            dv = {"CLKI_DIV": ci, "CLKFB_DIV": fb, "CLKOP_DIV": op, "CLKOP_CPHASE": (op - 1) // 2}
            out.append(PLLSetting("ecp5", ref, f, pfd, f * op, dv))
    return out


@functools.cache
def pll_settings(family: str, ref_hz: float) -> tuple[PLLSetting, ...]:
    """Every output frequency the ``family``'s PLL makes from ``ref_hz`` (module docstring's
    ranges), fastest first, one setting each (the highest f_PFD, then the highest f_VCO).

    Raises :class:`~pipetrain.compiler.targets.BoardError` for an unknown family."""
    if family == "ice40":
        cands = _ice40(ref_hz)
    elif family == "ecp5":
        cands = _ecp5(ref_hz)
    else:
        raise BoardError(f"no PLL model for FPGA family {family!r} (ice40, ecp5)")
    best: dict[float, PLLSetting] = {}
    for s in cands:
        key = round(s.out_hz, 3)
        old = best.get(key)
        if old is None or (s.pfd_hz, s.vco_hz) > (old.pfd_hz, old.vco_hz):
            best[key] = s
    return tuple(sorted(best.values(), key=lambda s: -s.out_hz))


def pick_pll(family: str, ref_hz: float, max_hz: float, baud: int | None = None) -> PLLSetting:
    """The fastest PLL setting with ``out_hz ≤ max_hz`` (Hz) at which the UART makes ``baud``
    (bit/s; None: no UART) within its tolerance (:func:`~pipetrain.hdl.uart.uart_divisor`).

    Raises :class:`~pipetrain.compiler.targets.BoardError` naming the slowest frequency the PLL
    makes when none is at or below ``max_hz``."""
    settings = pll_settings(family, ref_hz)
    for s in settings:
        if s.out_hz > max_hz * (1 + 1e-12):
            continue
        if baud is None or _uart_ok(s.out_hz, baud):
            return s
    slowest = settings[-1].out_hz / 1e6 if settings else float("nan")
    raise BoardError(
        f"the {family} PLL cannot make a clock ≤ {max_hz / 1e6:.3f} MHz from "
        f"{ref_hz / 1e6:g} MHz" + (f" for {baud} baud" if baud else "")
        + f" (its slowest is {slowest:.3f} MHz): run on the oscillator instead"
    )  # fmt: skip


def _uart_ok(clock_hz: float, baud: int) -> bool:
    try:
        uart_divisor(clock_hz, baud)
    except UARTError:
        return False
    return True


class PLLClock(wiring.Component):
    """Drives the ``sync`` domain of a board top (which defines the domain): the PLL's output,
    held in reset until the PLL has locked and then for :data:`ICE40_POR_S` more (the iCE40
    block-RAM start-up; the same delay on ECP5, harmless there). On ECP5 the reset leaves a
    register through a ``DCCA`` onto a global network (it fans out to every flip-flop with a
    reset).

    Parameters
    ----------
    setting: the :class:`PLLSetting` (its ``family`` selects the primitive).
    pin: the oscillator's pin as ``platform.request(clk, dir="-")`` returns it (iCE40: wired
        to ``SB_PLL40_PAD.PACKAGEPIN``; ECP5: through an input buffer into ``EHXPLLL.CLKI``).
    second: (ECP5 only) the name of a second domain, driven by ``EHXPLLL.CLKOS`` with CLKOP's
        dividers (the same frequency and phase) and the same reset, or None. nextpnr times it
        as a clock of its own: the shell timing analysis (``benchmarks/shell_timing.py``,
        docs/boards.md §4.1) runs the network there. Raises ValueError on iCE40.

    Members
    -------
    locked: ``Out(1)`` the PLL's LOCK output (asynchronous).

    nextpnr derives the output's timing constraint through the PLL from the oscillator pin's
    (which the platform constrains): the build's report times ``sync`` at ``setting.out_hz``.
    """

    def __init__(self, setting: PLLSetting, pin: Any, second: str | None = None) -> None:
        if second is not None and setting.family != "ecp5":
            raise ValueError("a second PLL output domain is built for ECP5 only")
        self.setting, self.pin, self.second = setting, pin, second
        super().__init__({"locked": wiring.Out(1)})

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        s, dv = self.setting, self.setting.dividers
        clk = Signal(name="pll_clk")
        clk2 = Signal(name="pll_clk2")  # CLKOS, with `second`
        lock = Signal(name="pll_lock")
        if s.family == "ice40":
            m.submodules.pll = Instance(
                "SB_PLL40_PAD",
                p_FEEDBACK_PATH="SIMPLE",
                p_PLLOUT_SELECT="GENCLK",
                p_DIVR=Const(dv["DIVR"], 4),
                p_DIVF=Const(dv["DIVF"], 7),
                p_DIVQ=Const(dv["DIVQ"], 3),
                p_FILTER_RANGE=Const(dv["FILTER_RANGE"], 3),
                i_PACKAGEPIN=self.pin.io,
                i_RESETB=Const(1),
                i_BYPASS=Const(0),
                o_PLLOUTGLOBAL=clk,
                o_LOCK=lock,
            )
        else:
            m.submodules.osc = osc = io.Buffer("i", self.pin)
            extra: dict[str, Any] = {}
            if self.second is not None:
                extra = {
                    "a_FREQUENCY_PIN_CLKOS": f"{s.out_hz / 1e6:g}",
                    "p_OUTDIVIDER_MUXB": "DIVB",
                    "p_CLKOS_ENABLE": "ENABLED",
                    "p_CLKOS_DIV": dv["CLKOP_DIV"],
                    "p_CLKOS_CPHASE": dv["CLKOP_CPHASE"],
                    "p_CLKOS_FPHASE": 0,
                    "o_CLKOS": clk2,
                }
            m.submodules.pll = Instance(
                "EHXPLLL",
                **extra,
                a_FREQUENCY_PIN_CLKI=f"{s.ref_hz / 1e6:g}",
                a_FREQUENCY_PIN_CLKOP=f"{s.out_hz / 1e6:g}",
                a_ICP_CURRENT="12",
                a_LPF_RESISTOR="8",
                a_MFG_ENABLE_FILTEROPAMP="1",
                a_MFG_GMCREF_SEL="2",
                p_PLLRST_ENA="DISABLED",
                p_INTFB_WAKE="DISABLED",
                p_STDBY_ENABLE="DISABLED",
                p_DPHASE_SOURCE="DISABLED",
                p_OUTDIVIDER_MUXA="DIVA",
                p_CLKOP_ENABLE="ENABLED",
                p_CLKI_DIV=dv["CLKI_DIV"],
                p_CLKFB_DIV=dv["CLKFB_DIV"],
                p_CLKOP_DIV=dv["CLKOP_DIV"],
                p_CLKOP_CPHASE=dv["CLKOP_CPHASE"],
                p_CLKOP_FPHASE=0,
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
                o_LOCK=lock,
            )
        # power-on reset: two flip-flops take LOCK into the PLL clock, then a timer
        m.domains.por = ClockDomain("por", reset_less=True, local=True)
        delay = max(1, int(ICE40_POR_S * s.out_hz))
        lock_s = Signal(2)
        timer = Signal(range(delay + 1))
        m.d.comb += [ClockSignal("por").eq(clk), ClockSignal("sync").eq(clk)]
        m.d.por += lock_s.eq((lock_s << 1) | lock)
        with m.If(~lock_s[1]):
            m.d.por += timer.eq(0)
        with m.Elif(timer != delay):
            m.d.por += timer.eq(timer + 1)
        rst: Any = timer != delay
        if s.family == "ecp5":
            # the reset from a register through a DCCA onto a global network: it reaches the
            # LSR of every flip-flop with a reset (~20,000 at 32,10 on the ULX3S), which over
            # fabric routing from the timer's comparator took up to 13.0 ns (*derived*, timing,
            # docs/boards.md §4.2); one cycle later, harmless for a power-on reset
            reg = Signal(init=1, name="por_rst")
            m.d.por += reg.eq(rst)
            rst = Signal(name="por_rst_global")
            m.submodules.rst_global = Instance("DCCA", i_CLKI=reg, i_CE=Const(1), o_CLKO=rst)
        m.d.comb += [ResetSignal("sync").eq(rst), self.locked.eq(lock)]
        if self.second is not None:
            m.d.comb += [
                ClockSignal(self.second).eq(clk2),
                ResetSignal(self.second).eq(rst),
            ]
        return m
