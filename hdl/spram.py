"""A single-port RAM: the iCE40 UltraPlus SPRAM on that family, a faithful model elsewhere.

A stage whose weight and velocity memories are single-port (``Stage.slot_cycles`` = 2, the
compiler's ``single_port`` option) reads one slot and writes back an earlier one on
alternate cycles (``hdl/sequencer.py``, ``hdl/weights.py``). :class:`SinglePortRAM` gives it
the members of a ``lib.memory`` read/write port pair, but with ONE address: on a write cycle
the address is the write address, so a read issued in the same cycle returns that word, not
the one asked for.
The model therefore breaks (and the RTL-vs-golden tests fail) if the stage ever reads and
writes in one cycle, exactly as the hardware would.

On an iCE40 platform (``platform.family`` is ``"iCE40"``: Amaranth's ``SiliconBluePlatform``,
which amaranth-boards' iCEBreaker platform derives from) the RAM is
one ``SB_SPRAM256KA`` per 16 K × 16 bits (Lattice FPGA-TN-02022, iCE40 SPRAM usage guide):
``DATAOUT`` is registered (the word addressed in cycle t is valid in cycle t+1, like a
synchronous ``lib.memory`` read port). Elsewhere (simulation, ECP5) it is a ``lib.memory``
whose read address follows the write address on write cycles.
"""

from __future__ import annotations

from typing import Any

from amaranth import ClockSignal, Const, Module, Mux, Shape, Signal
from amaranth.hdl import Instance
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import Out

from .streams import RamReadSignature, RamWriteSignature

__all__ = ["SinglePortRAM", "is_ice40"]


def is_ice40(platform: Any) -> bool:
    """Whether ``platform`` builds for the iCE40 family (where SB_SPRAM256KA exists)."""
    if platform is None:
        return False
    family = getattr(platform, "family", None)
    if isinstance(family, str):
        return family.lower() == "ice40"  # amaranth's SiliconBluePlatform: "iCE40"
    return any(
        c.__name__ in ("SiliconBluePlatform", "LatticeICE40Platform")
        for c in type(platform).__mro__
    )


class SinglePortRAM(wiring.Component):
    """``depth`` words of ``shape``, one address for reading and writing.

    Parameters
    ----------
    shape: word shape (wider words than one SPRAM's use several side by side).
    depth: words (at most one SPRAM's; deeper memories are not supported).
    config: one SB_SPRAM256KA's (words, bits), 16 384 × 16: the plan's ``MemorySpec.
        config_depth``/``config_width`` of the memory (the compiler decided the mapping).

    Members
    -------
    read: ``Out(RamReadSignature(shape, depth))``: ``addr`` in, ``data`` out — the word at the
        previous cycle's address; on a write cycle that is the written address.
    write: ``Out(RamWriteSignature(shape, depth))``: write ``data`` at ``addr`` when ``en``.

    Raises ``ValueError`` for a depth above ``config``'s words.
    """

    def __init__(self, shape: Any, depth: int, config: tuple[int, int]) -> None:
        self.shape = Shape.cast(shape)
        self.depth = int(depth)
        self.config = (int(config[0]), int(config[1]))
        if self.depth > self.config[0]:
            self._MustUse__silence = True  # not built: no "created but never used" warning
            raise ValueError(f"SinglePortRAM depth {depth} > {self.config[0]} words")
        super().__init__(
            {
                "read": Out(RamReadSignature(self.shape, self.depth)),
                "write": Out(RamWriteSignature(self.shape, self.depth)),
            }
        )

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        addr = Mux(self.write.en, self.write.addr, self.read.addr)
        width = self.shape.width
        if is_ice40(platform):
            sw = self.config[1]
            n = -(-width // sw)
            wdata = Signal(n * sw)
            rdata = Signal(n * sw)
            a14 = Signal(14)
            m.d.comb += [wdata.eq(self.write.data.as_unsigned()), a14.eq(addr)]
            for i in range(n):
                m.submodules[f"spram{i}"] = Instance(
                    "SB_SPRAM256KA",
                    i_ADDRESS=a14,
                    i_DATAIN=wdata[i * sw : (i + 1) * sw],
                    i_MASKWREN=Const(0xF, 4),
                    i_WREN=self.write.en,
                    i_CHIPSELECT=Const(1, 1),
                    i_CLOCK=ClockSignal(),
                    i_STANDBY=Const(0, 1),
                    i_SLEEP=Const(0, 1),
                    i_POWEROFF=Const(1, 1),
                    o_DATAOUT=rdata[i * sw : (i + 1) * sw],
                )
            m.d.comb += self.read.data.eq(rdata[:width])
        else:
            m.submodules.mem = mem = Memory(shape=self.shape, depth=self.depth, init=[])
            rp, wp = mem.read_port(), mem.write_port()
            m.d.comb += [
                rp.addr.eq(addr),
                self.read.data.eq(rp.data),
                wp.en.eq(self.write.en),
                wp.addr.eq(self.write.addr),
                wp.data.eq(self.write.data),
            ]
        return m
