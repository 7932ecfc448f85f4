"""The boards pipetrain targets: their resource budgets and settings (one place, below hdl/).

Budgets are the device's totals as nextpnr counts them (the same names appear in the build
report), from the vendor data sheets:

- ``ulx3s-85f``: Lattice ECP5 LFE5U-85F-6 (CABGA381) — 83 640 LUT4 / 83 640 FF, 156 18×18
  multipliers (MULT18X18D), 208 DP16KD block RAMs of 18 Kib (3 744 Kib). Lattice FPGA-DS-02012
  (ECP5 family data sheet), Table 1.1. 25 MHz oscillator, FT231X USB-serial.
- ``icebreaker``: Lattice iCE40 UltraPlus iCE40UP5K-SG48 — 5 280 LUT4 / 5 280 FF, 8 SB_MAC16
  DSPs (16×16), 30 EBR of 4 Kib (120 Kib) and 4 SPRAM of 256 Kib (1 Mib, single-port 16 K ×
  16). Lattice FPGA-DS-02008 (iCE40 UltraPlus data sheet), Table 1.1. 12 MHz oscillator,
  FT2232H USB-serial.

The compiler's fitting pass (:mod:`pipetrain.compiler.fit`) reads these numbers; the HDL reads
only the platform name and the synthesis options (:mod:`pipetrain.hdl.boards`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..errors import UserError
from .build import (
    BLOCK_RAM_BITS,
    BLOCK_RAM_CONFIGS,
    ICE40_BLOCK_RAM_BITS,
    ICE40_BLOCK_RAM_CONFIGS,
    LOGIC_LOW_BITS,
)

__all__ = ["Board", "BoardError", "BOARDS", "get_board", "ECP5_BRAM_CONFIGS", "ICE40_BRAM_CONFIGS"]

#: Aspect ratios (words, bits) of one ECP5 DP16KD (18 Kib) and one iCE40 EBR (4 Kib).
ECP5_BRAM_CONFIGS = BLOCK_RAM_CONFIGS
ICE40_BRAM_CONFIGS = ICE40_BLOCK_RAM_CONFIGS


class BoardError(UserError, ValueError):
    """Unknown board name, or a board setting (clock, baud) that cannot work."""


@dataclass(frozen=True)
class Board:
    """One supported board.

    Members
    -------
    name: CLI name (``--board``).
    description: human-readable board and device.
    family: ``ecp5`` or ``ice40`` (selects the nextpnr flavour and packer).
    device: FPGA part as nextpnr names it.
    platform: ``module:Class`` of the amaranth-boards platform (loaded by
        :func:`pipetrain.hdl.boards.platform_class`).
    clock_hz: the network clock (Hz): the clock the board's plans assume and the board top makes
        from ``osc_hz`` with the FPGA's PLL (``hdl/pll.py``); the bitstream build lowers it when
        nextpnr's Fmax misses it (docs/boards.md §2.1). A frequency the PLL makes exactly.
    baud: default UART baud rate (bit/s); ``clock_hz / baud`` must be within 2 % of an integer.
    luts, ffs: LUT4s and flip-flops.
    multipliers: DSP blocks, the hard multipliers (ECP5 MULT18X18D, iCE40 SB_MAC16;
        :attr:`dsp_cell`); the name is the JSON key of ``list-boards`` and the fit rows.
    multiplier_width: DSP block width: the operand bits one hard multiplier takes (18: ECP5
        MULT18X18D; 16: SB_MAC16); wider products take several blocks.
    multiplier_min_product_bits: narrowest partial product Yosys puts in a DSP (iCE40 11, from
        ``synth_ice40 -dsp``; 0 on ECP5).
    bram_blocks, bram_block_bits: block RAMs and bits per block (ECP5 DP16KD 18 Kib, iCE40 EBR
        4 Kib).
    bram_configs: the block's aspect ratios (words, bits) used to map memories onto it.
    spram_blocks, spram_block_bits: iCE40 single-port RAMs (0 where absent).
    bitstream_ext: the file the programmer takes (``bit`` or ``bin``).
    synth_opts: extra options for Yosys' ``synth_<family>`` (``-dsp`` on iCE40 maps multipliers
        to SB_MAC16).
    weight_bits: widest weight/velocity word the board's plans use (0: the compiler's
        formats). iCE40: 16, one SB_MAC16 operand and one SPRAM word; ``w`` and ``u`` keep
        their integer bits and give up fraction bits (:func:`pipetrain.compiler.fit.
        narrow_formats`).
    activation_bits: widest activation / error word (``x``, ``y``, ``d``, ``gin``; 0: the
        compiler's formats). iCE40: 12 — narrower registers, adders and stashes; golden
        model, 4 epochs on digits: 0.9528 test accuracy vs 0.9583 at 16 bits.
    const_bits: significant bits of the update constants on this board (18: the compiler's
        default; iCE40: 5, so that lr and momentum are shifts and short shift-add chains
        instead of SB_MAC16s — :func:`pipetrain.compiler.build.build_plan`).
    ram_family: the block-RAM family the plan's memories are placed on
        (``compiler.build.RAM_FAMILIES``: ``bram18`` = 18 Kib RAMB18/DP16KD, ``ice40`` = 4 Kib
        EBR), so the plan's kinds and block counts are the board's.
    logic_low_bits: the widest low piece of a constant product's operand that the board's
        plans form in logic (``Plan.logic_low_bits``; ``compiler.build.LOGIC_LOW_BITS``): ECP5
        8 — DSP blocks bind its lanes and LUT4s are plentiful (m·u of a 24-bit u: one
        MULT18X18D and a select-add of 6 terms instead of two blocks); iCE40 0 — its logic
        cells are the scarce resource (mlp-digits fills 98 % of them) and its 16-bit ``u``/
        ``w`` with 5-bit shift-add constants leave no such product anyway.
    operand_registers: the multipliers' operand registers of the board's plans
        (``Stage.operand_registers``, 0, 1 or 2; the loss unit's ``LossUnit.operand_registers``
        is 1 when this is ≥ 1): ECP5 2 — its MULT18X18D blocks sit in rows apart from the
        lanes' logic: the block's own input and output registers keep the routing to it out of
        the multiplier's path, and one fabric register on its product the routing from it
        (two cycles more per pass; *derived*, timing: -deep 73.8 → 84.0 MHz and mlp-digits
        72.7 → 74.6 MHz from 1 to 2 at a 90 MHz constraint, docs/boards.md §4.2); iCE40 0 —
        yosys absorbs registers into SB_MAC16 and its logic cells are full.
    osc_hz: the board oscillator (Hz), the PLL's reference (0: the network runs on
        ``clock_hz`` directly).
    """

    name: str
    description: str
    family: str
    device: str
    platform: str
    clock_hz: float
    baud: int
    luts: int
    ffs: int
    multipliers: int
    multiplier_width: int
    bram_blocks: int
    bram_block_bits: int
    spram_blocks: int
    spram_block_bits: int
    bitstream_ext: str
    synth_opts: str = ""
    multiplier_min_product_bits: int = 0
    bram_configs: tuple[tuple[int, int], ...] = ECP5_BRAM_CONFIGS
    weight_bits: int = 0
    activation_bits: int = 0
    const_bits: int = 18
    ram_family: str = "bram18"
    osc_hz: float = 0.0
    logic_low_bits: int = LOGIC_LOW_BITS
    operand_registers: int = 0

    def format_bits(self) -> dict[str, int]:
        """``{tensor: widest bits}`` the board's plans use (0: the compiler's choice)."""
        a = self.activation_bits
        return {"w": self.weight_bits, "u": self.weight_bits, "x": a, "y": a, "d": a, "gin": a}

    @property
    def dsp_cell(self) -> str:
        """The board's DSP block as nextpnr names it: ``MULT18X18D`` (ECP5) or ``SB_MAC16``
        (iCE40). Output calls these hard blocks *DSP blocks*, never *multipliers* (those are
        the datapath's products, ``Stage.products``)."""
        return "SB_MAC16" if self.family == "ice40" else "MULT18X18D"

    @property
    def cells_name(self) -> str:
        """What output calls the board's logic cells, the unit of ``luts`` and of the fit's
        ``logic_cells`` estimate (nextpnr's count): ``logic cells`` on the iCE40 (an
        ICESTORM_LC: a LUT4 with its flip-flop and carry), ``LUT4s`` on the ECP5 (TRELLIS_COMB
        LUT4 slots)."""
        return "logic cells" if self.family == "ice40" else "LUT4s"

    @property
    def bram_bits(self) -> int:
        """Total block-RAM bits (EBR/DP16KD), excluding SPRAM."""
        return self.bram_blocks * self.bram_block_bits

    @property
    def spram_bits(self) -> int:
        """Total SPRAM bits (iCE40 UltraPlus; 0 elsewhere)."""
        return self.spram_blocks * self.spram_block_bits

    def budget(self) -> dict[str, int]:
        """Return the budget as a flat dict (the ``list-boards`` JSON)."""
        return {
            "luts": self.luts,
            "ffs": self.ffs,
            "multipliers": self.multipliers,
            "multiplier_width": self.multiplier_width,
            "bram_blocks": self.bram_blocks,
            "bram_block_bits": self.bram_block_bits,
            "bram_bits": self.bram_bits,
            "spram_blocks": self.spram_blocks,
            "spram_bits": self.spram_bits,
        }

    def to_dict(self) -> dict[str, Any]:
        """Return every field plus the derived budget totals."""
        return asdict(self) | {"bram_bits": self.bram_bits, "spram_bits": self.spram_bits}


BOARDS: dict[str, Board] = {
    b.name: b
    for b in (
        Board(
            name="ulx3s-85f",
            description="Radiona ULX3S, Lattice ECP5 LFE5U-85F",
            family="ecp5",
            device="LFE5U-85F",
            platform="amaranth_boards.ulx3s:ULX3S_85F_Platform",
            # 25 MHz × 7 / 2 (EHXPLLL: CLKI_DIV 2, CLKFB_DIV 7, CLKOP_DIV 9, VCO 787.5 MHz): the
            # fastest PLL clock ≤ 90 MHz / 1.03, the Fmax issue 17 asks of the filled plans
            # (mlp-digits 32,10: 90.8 MHz at 90addfc, 85.2 at a0e4f2f, 86.3 at 53d3f90; -deep
            # 16,8,8,4: 98.0 at 3f875ad, 93.2 at 53d3f90; boards.md §4.2); a design that
            # misses it is rebuilt below its Fmax (§2.1)
            clock_hz=87.5e6,
            osc_hz=25e6,
            operand_registers=2,
            baud=3_000_000,  # the FT231X maximum: divisor 29 at 87.5 MHz, 3.017 Mbaud (+0.57 %)
            luts=83_640,
            ffs=83_640,
            multipliers=156,
            multiplier_width=18,
            bram_blocks=208,
            bram_block_bits=BLOCK_RAM_BITS,
            spram_blocks=0,
            spram_block_bits=0,
            bitstream_ext="bit",
        ),
        Board(
            name="icebreaker",
            description="1BitSquared iCEBreaker, Lattice iCE40UP5K",
            family="ice40",
            device="iCE40UP5K",
            platform="amaranth_boards.icebreaker:ICEBreakerPlatform",
            # 12 MHz × 64 / 32 (SB_PLL40_PAD: DIVR 0, DIVF 63, DIVQ 5, VCO 768 MHz); 1 Mbaud at
            # divisor 24, exact; mlp-digits: Fmax 28.3 MHz (docs/boards.md §4.2) ≥ 1.03 × 24
            clock_hz=24e6,
            osc_hz=12e6,
            baud=1_000_000,
            luts=5_280,
            ffs=5_280,
            multipliers=8,
            multiplier_width=16,
            bram_blocks=30,
            bram_block_bits=ICE40_BLOCK_RAM_BITS,
            spram_blocks=4,
            spram_block_bits=256 * 1024,
            bitstream_ext="bin",
            synth_opts="-dsp",
            multiplier_min_product_bits=11,
            bram_configs=ICE40_BRAM_CONFIGS,
            weight_bits=16,
            activation_bits=12,
            const_bits=5,
            ram_family="ice40",
            logic_low_bits=0,
        ),
    )
}


def get_board(name: str) -> Board:
    """Return the board called ``name``; :class:`BoardError` lists the known ones otherwise."""
    try:
        return BOARDS[name]
    except KeyError:
        raise BoardError(f"unknown board {name!r}; known boards: {', '.join(BOARDS)}") from None
