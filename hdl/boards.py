"""Supported dev boards, their resource budgets, and the plan-fits-the-board check.

Budgets are the device's totals as nextpnr counts them (the same names appear in the build
report), from the vendor data sheets:

- ``ulx3s-85f``: Lattice ECP5 LFE5U-85F-6 (CABGA381) — 83 640 LUT4 / 83 640 FF, 156 18×18
  multipliers (MULT18X18D), 208 DP16KD block RAMs of 18 Kib (3 744 Kib). Lattice FPGA-DS-02012
  (ECP5 family data sheet), Table 1.1. 25 MHz oscillator, FT231X USB-serial.
- ``icebreaker``: Lattice iCE40 UltraPlus iCE40UP5K-SG48 — 5 280 LUT4 / 5 280 FF, 8 SB_MAC16
  DSPs (16×16), 30 EBR of 4 Kib (120 Kib) and 4 SPRAM of 256 Kib (1 Mib, single-port 16 K ×
  16). Lattice FPGA-DS-02008 (iCE40 UltraPlus data sheet), Table 1.1. 12 MHz oscillator,
  FT2232H USB-serial.

The fit check (:func:`check_fit`) compares the plan's needs with what the design can use on the
board and raises :class:`BoardFitError` with needed vs available numbers: hard multiplier blocks
estimated for the board's DSP width (``compiler.build.hard_multipliers``: a 24 × 16-bit product
takes two 18×18 MULT18X18D), memory bits, and the stages' memories mapped onto the board's own
block RAMs (18 Kib DP16KD on ECP5, 4 Kib EBR on iCE40). It is a necessary check, not a
sufficient one: routing and LUT use are only known after place and route.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass
from typing import Any

from ..compiler.build import (
    BLOCK_RAM_CONFIGS,
    ICE40_BLOCK_RAM_CONFIGS,
    hard_multipliers,
    memory_blocks,
    spram_blocks,
)

__all__ = [
    "Board",
    "BoardError",
    "BoardFitError",
    "BOARDS",
    "get_board",
    "check_fit",
    "plan_totals",
    "PLAN_BLOCK_BITS",
]

#: The plan counts block RAMs in units of 18 Kib (``compiler.build.BLOCK_RAM_BITS``).
PLAN_BLOCK_BITS = 18 * 1024
#: Aspect ratios (words, bits) of one ECP5 DP16KD (18 Kib) and one iCE40 EBR (4 Kib).
ECP5_BRAM_CONFIGS = BLOCK_RAM_CONFIGS
ICE40_BRAM_CONFIGS = ICE40_BLOCK_RAM_CONFIGS


class BoardError(ValueError):
    """Unknown board name, or a board setting (clock, baud) that cannot work."""


class BoardFitError(BoardError):
    """The plan needs more of a resource than the board has (message: needed vs available).

    ``rows``: the ``{resource: {needed, available}}`` rows of :func:`check_fit`; ``plan``: the
    plan checked (None when not given)."""

    def __init__(self, message: str, rows: dict | None = None, plan: Any = None) -> None:
        super().__init__(message)
        self.rows = rows or {}
        self.plan = plan


@dataclass(frozen=True)
class Board:
    """One supported board.

    Members
    -------
    name: CLI name (``--board``).
    description: human-readable board and device.
    family: ``ecp5`` or ``ice40`` (selects the nextpnr flavour and packer).
    device: FPGA part as nextpnr names it.
    platform: ``module:Class`` of the amaranth-boards platform.
    clock_hz: board oscillator frequency (Hz); the design runs on it directly (no PLL: the UART
        link, not the compute, limits samples/s — see ``docs`` in :mod:`pipetrain.hdl.board`).
    baud: default UART baud rate (bit/s); ``clock_hz / baud`` must be within 2 % of an integer.
    luts, ffs: LUT4s and flip-flops.
    multipliers: hard multipliers (ECP5 MULT18X18D, iCE40 SB_MAC16).
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
        their integer bits and give up fraction bits (``pipetrain.host.cmd_build.
        plan_for_board``).
    activation_bits: widest activation / error word (``x``, ``y``, ``d``, ``gin``; 0: the
        compiler's formats). iCE40: 12 — narrower registers, adders and stashes; golden
        model, 4 epochs on digits: 0.9528 test accuracy vs 0.9583 at 16 bits.
    const_bits: significant bits of the update constants on this board (18: the compiler's
        default; iCE40: 5, so that lr and momentum are shifts and short shift-add chains
        instead of SB_MAC16s — ``compiler.build.build_plan``).
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

    def format_bits(self) -> dict[str, int]:
        """``{tensor: widest bits}`` the board's plans use (0: the compiler's choice)."""
        a = self.activation_bits
        return {"w": self.weight_bits, "u": self.weight_bits, "x": a, "y": a, "d": a, "gin": a}

    @property
    def bram_bits(self) -> int:
        """Total block-RAM bits (EBR/DP16KD), excluding SPRAM."""
        return self.bram_blocks * self.bram_block_bits

    @property
    def spram_bits(self) -> int:
        """Total SPRAM bits (iCE40 UltraPlus; 0 elsewhere)."""
        return self.spram_blocks * self.spram_block_bits

    def platform_class(self) -> type:
        """Import and return the amaranth-boards platform class.

        Raises :class:`BoardError` when amaranth-boards is not installed (``pip install
        pipetrain[boards]``).
        """
        module, cls = self.platform.split(":")
        try:
            return getattr(importlib.import_module(module), cls)
        except ImportError as exc:
            raise BoardError(
                f"board {self.name!r} needs amaranth-boards: pip install 'pipetrain[boards]' "
                f"({exc})"
            ) from exc

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
            clock_hz=25e6,
            baud=1_000_000,
            luts=83_640,
            ffs=83_640,
            multipliers=156,
            multiplier_width=18,
            bram_blocks=208,
            bram_block_bits=18 * 1024,
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
            clock_hz=12e6,
            baud=1_000_000,
            luts=5_280,
            ffs=5_280,
            multipliers=8,
            multiplier_width=16,
            bram_blocks=30,
            bram_block_bits=4 * 1024,
            spram_blocks=4,
            spram_block_bits=256 * 1024,
            bitstream_ext="bin",
            synth_opts="-dsp",
            multiplier_min_product_bits=11,
            bram_configs=ICE40_BRAM_CONFIGS,
            weight_bits=16,
            activation_bits=12,
            const_bits=5,
        ),
    )
}


def get_board(name: str) -> Board:
    """Return the board called ``name``; :class:`BoardError` lists the known ones otherwise."""
    try:
        return BOARDS[name]
    except KeyError:
        raise BoardError(f"unknown board {name!r}; known boards: {', '.join(BOARDS)}") from None


def plan_totals(plan: Any, board: Board | None = None) -> dict[str, int]:
    """Return the plan's ``memory_bits``, ``multipliers`` (in the datapath) and
    ``memory_blocks`` (18 Kib units; the sum over stages when the plan has no total); with a
    ``board`` also ``hard_multipliers`` (DSP blocks of the board's width) and ``bram_blocks``
    (the board's own block RAMs). A plan without stages (a summary) counts its ``multipliers``
    as blocks and its 18 Kib blocks' bits in the board's blocks."""
    blocks = getattr(plan, "memory_blocks", None)
    if blocks is None:
        blocks = sum(s.memory_blocks for s in plan.stages)
    out = {
        "memory_bits": int(plan.memory_bits),
        "multipliers": int(plan.multipliers),
        "memory_blocks": int(blocks),
    }
    if board is not None:
        if getattr(plan, "stages", None):
            hard = hard_multipliers(
                plan, board.multiplier_width, 2, board.multiplier_min_product_bits
            )
            bram = memory_blocks(plan, board.bram_configs, board.bram_block_bits)
        else:
            hard = out["multipliers"]
            bram = -(-out["memory_blocks"] * PLAN_BLOCK_BITS // board.bram_block_bits)
        out |= {
            "hard_multipliers": int(hard),
            "bram_blocks": int(bram),
            "spram_blocks": int(spram_blocks(plan)) if getattr(plan, "stages", None) else 0,
        }
    return out


def check_fit(plan: Any, board: Board) -> dict[str, dict[str, int]]:
    """Check the plan against the board's budget; return ``{resource: {needed, available}}``.

    - multipliers: hard multiplier blocks of the board's DSP width
      (``compiler.build.hard_multipliers``) vs the board's; the plan's ``multipliers`` count
      each datapath multiplier once, whatever its width.
    - spram: SPRAMs of the stages with single-port weight memories (``Stage.slot_cycles`` = 2,
      ``compiler.build.spram_blocks``) vs the board's (0 except on the iCE40 UltraPlus).
    - memory bits: ``plan.memory_bits`` vs block RAM bits + the bits of the SPRAMs the plan
      uses.
    - memory blocks: the other stage memories mapped onto the board's block RAM
      (``bram_blocks`` of ``bram_block_bits``: 18 Kib DP16KD, 4 Kib iCE40 EBR), as bits, vs
      block RAM bits (each lane's memories are rounded up to whole blocks, so this is the
      tighter check).

    Raises :class:`BoardFitError` naming every resource that does not fit, with needed vs
    available numbers (its ``rows`` hold the same table).
    """
    t = plan_totals(plan, board)
    sp = t.get("spram_blocks", 0)
    sp_bits = min(sp, board.spram_blocks) * board.spram_block_bits
    ram_bits = board.bram_bits + sp_bits
    ram_name = "block RAM" + (f" + {sp} SPRAM" if sp else "")
    block_bits = t["bram_blocks"] * board.bram_block_bits
    rows = {
        "multipliers": {"needed": t["hard_multipliers"], "available": board.multipliers},
        "spram": {"needed": sp, "available": board.spram_blocks},
        "memory_bits": {"needed": t["memory_bits"], "available": ram_bits},
        "memory_block_bits": {"needed": block_bits, "available": board.bram_bits},
    }
    w = board.multiplier_width
    problems = []
    if t["hard_multipliers"] > board.multipliers:
        problems.append(
            f"{t['hard_multipliers']} multipliers needed, {board.multipliers} available "
            f"({w}×{w} blocks for {t['multipliers']} datapath multipliers)"
        )
    if sp > board.spram_blocks:
        problems.append(f"{sp} SPRAMs needed, {board.spram_blocks} available")
    if t["memory_bits"] > ram_bits:
        problems.append(f"{t['memory_bits']} memory bits needed, {ram_bits} available ({ram_name})")
    elif t["bram_blocks"] > board.bram_blocks:
        problems.append(
            f"{t['bram_blocks']} block RAMs of {board.bram_block_bits // 1024} Kib needed "
            f"({block_bits} bits), {board.bram_blocks} available ({board.bram_bits} bits)"
        )
    if problems:
        raise BoardFitError(
            f"{getattr(plan, 'name', 'the design')} does not fit {board.name} "
            f"({board.description}): " + "; ".join(problems) + ". Use fewer lanes, narrower "
            "formats or a smaller network, or a bigger board",
            rows,
            plan,
        )
    return rows
