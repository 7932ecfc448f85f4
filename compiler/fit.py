"""Fitting a plan to a board: the compiler pass ``build --board``, ``compile --board``,
``train --board``, ``open(board=…)`` and the benchmarks all run (once per compile).

:func:`fit_plan` takes a :class:`PlanRequest` (the traced network, the settings, the formats
and the lanes the compiler would build) and a :class:`~pipetrain.compiler.targets.Board`, and
returns the fitted plan or raises :class:`FitError` with needed vs available numbers. In order
(each step only when the board asks for it):

1. constants with ``board.const_bits`` significant bits (iCE40: 5 — lr 0.002 becomes the
   shift 2^-9, m 0.9 becomes 29/32, a three-digit shift-add; no SB_MAC16 for them), the
   board's clock, its block-RAM family (``board.ram_family``: the plan's memory kinds and
   block counts are the board's) and its rule for constant products' low pieces in logic
   (``board.logic_low_bits``: ECP5 8, so m·u of a 24-bit u takes one MULT18X18D, not two;
   iCE40 0);
2. formats narrowed to the board's widths (iCE40: 16-bit weights and velocities, 12-bit
   activations and errors), keeping their calibrated integer bits (:func:`narrow_formats`);
3. lanes (``--lanes auto``, :func:`board_lanes`): the fastest plan that fits — every
   fewest-lanes design (:func:`lane_candidates`, fastest first) is
   built with the board's settings and checked (:func:`check_fit`); the one with the fewest
   ideal cycles per sample (the tick) wins, ties going to fewer DSP blocks, logic cells and
   block RAMs (FINN's folding to a target rate, with the board's budget as the target).
   Lanes the user gave (``--lanes``/``--target-cycles``/``--max-multipliers``) win; if they do
   not fit, :class:`FitError` names the resource, needed vs available, and the lanes that fit;
4. SPRAM (iCE40 UltraPlus): one-lane stages, largest weight + velocity bits first, get
   single-port SPRAM weight memories (``Stage.slot_cycles`` = 2: a slot every other cycle)
   while SPRAMs remain (:func:`spram_stages`; run for every lane candidate).

The fit check (:func:`check_fit`) compares the board design's needs with the board: hard
multiplier blocks for the board's DSP width (:func:`~pipetrain.compiler.build.hard_multipliers`:
a 24 × 16-bit product takes two 18×18 MULT18X18D), memory bits, the memories mapped onto the
board's own block RAMs (18 Kib DP16KD on ECP5, 4 Kib EBR on iCE40) — the plan's and the board
shell's (:class:`Shell`: the link engine's buffers and the RX FIFO, 5 EBR on the iCEBreaker) —
and logic cells (:func:`logic_cells`, a per-part cost model fitted to nextpnr's counts of
measured builds, :data:`LOGIC_MODELS`, docs/boards.md §3). Routing is still only known after
place and route. Source: *derived* (the order above was measured on the iCEBreaker,
docs/boards.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .build import (
    BLOCK_RAM_BITS,
    CONST_MANTISSA_BITS,
    EXP_LUT_FRAC,
    LFSR_WIDTH,
    LOGIC_LOW_BITS,
    OPERAND_BITS,
    RAM_FAMILIES,
    TICK_OVERHEAD,
    FormatSpec,
    PlanError,
    build_plan,
    fewest_lanes,
    hard_multipliers,
    logic_pieces,
    loss_operands,
    memory_blocks,
    momentum_logic,
    place_memory,
    spram_blocks,
    stage_cycles,
    stage_slots,
)
from .config import TrainConfig
from .formats import apply_overrides, parse_format_overrides
from .ir import NetworkIR
from .lanes import lanes_for_target, lanes_text
from .lfsr_map import leap_entries
from .loss_unit import radix_compares
from .plan import Plan, csd
from .targets import Board, BoardError

__all__ = [
    "FitError",
    "PlanRequest",
    "Shell",
    "LogicModel",
    "LOGIC_MODELS",
    "fit_plan",
    "board_request",
    "board_lanes",
    "lane_candidates",
    "column_candidates",
    "plan_with_lanes",
    "check_fit",
    "plan_totals",
    "logic_cells",
    "shell_blocks",
    "narrow_formats",
    "narrowed_label",
    "spram_stages",
]


class FitError(BoardError):
    """The plan needs more of a resource than the board has (message: needed vs available).

    ``rows``: the ``{resource: {needed, available}}`` rows of :func:`check_fit`; ``plan``: the
    plan checked (None when not given)."""

    def __init__(self, message: str, rows: dict | None = None, plan: Any = None) -> None:
        super().__init__(message)
        self.rows = rows or {}
        self.plan = plan


@dataclass(frozen=True)
class PlanRequest:
    """What :func:`~pipetrain.compiler.build.build_plan` builds a plan from.

    Members
    -------
    ir: the traced network.
    config: the training settings.
    formats: the format spec (calibrated or default, user overrides applied).
    lanes: lanes per stage as :func:`~pipetrain.compiler.lanes.choose_lanes` chose them.
    lanes_given: the user chose ``lanes`` (``--lanes``/``--target-cycles``/
        ``--max-multipliers``): fitting keeps them.
    clock_hz: design clock (Hz).
    memory_budget_bits: 0 = no budget.
    const_bits: significant bits of the update constants.
    single_port: 1-based stages with single-port (SPRAM) weight memories.
    ram_family: the block-RAM family the memories are placed on (``RAM_FAMILIES``).
    operand_bits: the widest variable multiplier operand (``Plan.operand_bits``; None: every
        product exact).
    logic_low_bits: the widest low piece of a constant product's operand formed in logic
        (``Plan.logic_low_bits``; the board's, ``Board.logic_low_bits``, once fitted).
    operand_registers: the Linear stages' multiplier operand registers, 0, 1 or 2
        (``Stage.operand_registers``; the board's, ``Board.operand_registers``, once fitted).
    lanes_option: the option that chose ``lanes`` when it was not ``--lanes``, as the user gave
        it (``--max-multipliers 20``, ``--target-cycles 100``): a fit error names it (None: "the
        lanes asked for").
    momentum_in_logic: every Linear stage forms ``m·u`` in logic (``Plan.momentum_in_logic``).
    col_lanes: column lanes k per stage (``Stage.col_lanes``; None: one each): ``--lanes
        16x3,10``, or the fit's choice (:func:`column_candidates`).
    loss_fastest: a loss unit that cannot keep up with the passes takes its fastest
        parallelism (``build_plan``'s ``loss_fastest``; the fit's choice with column lanes).
    """

    ir: NetworkIR
    config: TrainConfig
    formats: FormatSpec
    lanes: tuple[int, ...]
    lanes_given: bool = False
    clock_hz: float = 50e6
    memory_budget_bits: int = 0
    const_bits: int = CONST_MANTISSA_BITS
    single_port: tuple[int, ...] = ()
    ram_family: str = "bram18"
    operand_bits: int | None = OPERAND_BITS
    logic_low_bits: int | None = LOGIC_LOW_BITS
    operand_registers: int = 0
    lanes_option: str | None = None
    momentum_in_logic: bool = False
    col_lanes: tuple[int, ...] | None = None
    loss_fastest: bool = False

    def replace(self, **changes: Any) -> PlanRequest:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)

    def build(self) -> Plan:
        """The plan of this request (:func:`~pipetrain.compiler.build.build_plan`)."""
        return build_plan(
            self.ir,
            self.config,
            self.formats,
            self.lanes,
            self.clock_hz,
            self.memory_budget_bits,
            self.const_bits,
            self.single_port,
            self.ram_family,
            self.operand_bits,
            self.logic_low_bits,
            self.operand_registers,
            self.momentum_in_logic,
            self.col_lanes,
            self.loss_fastest,
        )


@dataclass(frozen=True)
class Shell:
    """What a board design holds besides the plan's network (``NetworkTop``): the link engine
    and the board top's RX FIFO (``hdl/board.py``), as the fit check counts them. The host
    derives it from the HDL (:func:`pipetrain.hdl.shell.board_shell`); the compiler only
    places its memories on the board's RAM family.

    Members
    -------
    memories: ``(name, words, width, read_ports, write_ports)`` of every memory outside the
        plan (link receiver buffer, dispatcher state memory, results buffer, RX FIFO).
    """

    memories: tuple[tuple[str, int, int, int, int], ...] = ()


#: A shell, or how to derive it from a plan (its sizes follow the plan's inputs and stages).
ShellSource = Shell | Callable[[Plan], Shell] | None


def _shell_of(shell: ShellSource, plan: Any) -> Shell | None:
    return shell(plan) if callable(shell) else shell


def shell_blocks(shell: Shell | None, board: Board) -> int:
    """Block RAMs of the board's family that the shell's memories take (each placed as the
    plan's are, :func:`~pipetrain.compiler.build.place_memory`: LUT RAM where cheaper on ECP5);
    0 without a shell."""
    if shell is None:
        return 0
    fam = RAM_FAMILIES[board.ram_family]
    return sum(
        place_memory(n, 1, d, w, read_ports=r, write_ports=wp, family=fam).blocks
        for n, d, w, r, wp in shell.memories
    )


@dataclass(frozen=True)
class LogicModel:
    """Logic cells of a board design on one FPGA family, per part, in nextpnr's unit (iCE40
    ``ICESTORM_LC``: a LUT4 with its flip-flop and carry; ECP5 ``TRELLIS_COMB``: a LUT4 slot,
    two per CCU2C carry cell and per TRELLIS_DPR16X4 LUT RAM). :func:`logic_cells` sums the
    parts (all in cells).

    Members
    -------
    shell: UART, RX FIFO, heartbeat and LEDs, and the link engine.
    network: the network top's own logic (tick controller, weight access, result FIFO).
    loss: the cross-entropy loss unit (max, exp LUT read, divider, p − onehot).
    stage: one stage without its lanes (sequencer, stash and error-buffer addressing,
        activation, operand registers).
    ingrad_stage: what a stage with an input gradient adds (its stash, ``gacc`` path).
    lane: one lane of a stage (forward MAC, update with stochastic rounding, saturation and
        write-back).
    size: per row and per input of a stage (M + N: address counters, the activation mask).
    lutram_tile: one 16 × 4 LUT-RAM tile of a ``lutram`` memory, per read port (ECP5).
    bram_mux_bit: one output bit of a block-RAM bank beyond its first block in depth (the
        read multiplexer of a bank deeper than one block).
    logic_bit: one bit of a memory the plan keeps in flip-flops (``logic`` kind).
    select_add_bit: a constant product's low piece formed in logic (``Plan.logic_low_bits``,
        not in the builds ``lane`` was fitted to), per bit of its ``lo − 1`` adders of
        ``constant bits + lo`` bits (:func:`~pipetrain.compiler.build.logic_pieces`). ECP5:
        fitted to ``synth_ecp5`` of three such products (m = 235930 × 24 bits, lo = 6: 79
        LUT4 slots, 26 bits, lo = 8: 110; 191103 × 24, lo = 6: 172; Yosys makes the tree a
        carry-save sum of LUT full adders and one CCU2C chain) × ``pack``; iCE40: one logic
        cell per adder bit, not measured (its plans form none, ``Board.logic_low_bits`` = 0).
    pack: nextpnr cells per synthesised cell of the builds the model was fitted to (LUT4 +
        FF + carry on iCE40, LUT4 + 2 × CCU2C + 2 × DPR16X4 on ECP5; for the record).
    source: the builds the numbers were fitted to (docs/boards.md §3).
    column_shared: what a row's column sub-lanes (physical lanes s ≥ 1 of its k,
        ``Stage.col_lanes``) do not repeat of ``lane``: the forward output path after the k-sum
        (clamp, activation, mask and ``y`` registers) and the row's δ operand path, once a row
        (*derived*; ECP5: fitted to mlp-digits 11×4,10 — 61,230 LUT4 built, 64,797 estimated
        without it — and -deep 11×2,11,11,5 — 57,846 built, 60,454 —, 108 and 237 cells a
        sub-lane: 140 leaves −1.7 % and +1.8 %; 200 since -wide 6×3,22,2 at b4276a9 — 41,362
        built, +10.8 % estimated at 140, its stage 1's netlist 12,613 synthesised cells (× 1.135:
        14,316) against 16,829 estimated, stages 2 and 3 within 5 % —: every ECP5 record within
        −8.6 … +9.0 %; iCE40: not measured, 0: each sub-lane counted whole, the safe side on a
        full device).
    divider_compare: one of the 2^k − 1 parallel compares of a loss unit's radix-2^k divider
        (``LossUnit.div_bits`` > :data:`~pipetrain.compiler.loss_unit.CHAINED_DIV_BITS`),
        beyond ``loss``'s chained divider. *Derived* from Yosys synthesis of the divider
        alone (``hdl/loss.py``'s ``_Divider``, E of 20 bits, fr = 16): ``synth_ecp5`` LUT4 +
        2 × CCU2C at k = 2, 3, 4: 92, 485, 1,145 ((1,145 − 92) / 15 × ``pack`` ≈ 80);
        ``synth_ice40`` SB_LUT4 69, 500, 1,059 (66 a compare; carries and flip-flops pack
        with them). Not yet in a place-and-route record.
    lfsr_entry: one non-zero entry of a lane's LFSR leap matrix
        (:func:`~pipetrain.compiler.lfsr_map.leap_entries`) fewer than the 32-step leap's 207
        that ``lane`` was fitted with (``Plan.lfsr_leap``, docs/numerics.md §6). *Derived*
        from ``synth_ecp5`` of ``hdl/lfsr.py``'s LFSR alone: 124 LUT4 at 32 steps (207
        entries), 41 at 16 (98): (124 − 41) / 109 × ``pack`` ≈ 0.86. Not yet in a
        place-and-route record; iCE40: 0 (not measured, every lane counted at 32 steps).
    rom_bit: one bit of a ROM a loss unit keeps in logic (its exp ROM, when Yosys' cost rule
        maps its P read ports to logic rather than block RAM: ``build.memory_kind``), per read
        port. *Derived* from Yosys synthesis of the 512 × 16 exp ROM alone with 10 read ports
        (registered addresses and outputs): ``synth_ecp5`` 2,533 LUT4 (+ 1,028 PFUMX and 559
        L6MUX21, which take no LUT slot) / 81,920 bit-ports ≈ 0.031; ``synth_ice40`` 3,524
        SB_LUT4 ≈ 0.043. Checked on the ULX3S by mlp-digits 11×4,10 (61,230 LUT4 built:
        −6.3 % estimated without it, −2.2 % with it) and 8×5,10 with ``--momentum-digits 4``
        (53,348: −10.6 %, −5.9 %), the two builds whose loss unit has a 10-port ROM in logic.
    """

    shell: float
    network: float
    loss: float
    stage: float
    ingrad_stage: float
    lane: float
    size: float
    lutram_tile: float
    bram_mux_bit: float
    logic_bit: float
    select_add_bit: float
    pack: float
    source: str
    column_shared: float = 0.0
    divider_compare: float = 0.0
    lfsr_entry: float = 0.0
    rom_bit: float = 0.0


#: The cost models per ``Board.family``, fitted per part to the synthesised netlists (cells
#: attributed by their hierarchical names: ``core.link``, ``core.net.stage<i>``, …) of the
#: builds in tests/nextpnr_builds.json and scaled by ``pack`` to nextpnr's counts (docs/boards.md
#: §3 has the table; tests/test_board_fit.py checks every recorded build within 10 %).
LOGIC_MODELS: dict[str, LogicModel] = {
    "ice40": LogicModel(
        shell=2086.0,
        network=449.0,
        loss=586.0,
        stage=104.0,
        ingrad_stage=34.0,
        lane=811.0,
        size=1.13,
        lutram_tile=0.0,
        bram_mux_bit=1.0,
        logic_bit=1.0,
        select_add_bit=1.0,
        pack=0.733,
        source="derived from 4 iCEBreaker builds (mlp 64→16/32/48/56→10, one lane per stage) "
        "and the lane from Yosys synthesis of mlp-digits at 2,1 and 4,1 lanes (1,107 "
        "synthesised cells per lane)",
        divider_compare=66.0,
        rom_bit=0.043,
    ),
    "ecp5": LogicModel(
        shell=2071.0,
        network=322.0,
        loss=498.0,
        stage=203.0,
        ingrad_stage=642.0,
        lane=860.0,
        size=0.0,
        lutram_tile=2.27,
        bram_mux_bit=4.26,
        logic_bit=0.5,
        select_add_bit=0.93,
        pack=1.135,
        source="derived from 4 ULX3S builds (mlp-digits 4,1 and 8,2, -deep 4,3,3,1, -wide 4,4,1); "
        "ingrad_stage 842 → 642 after -deep 16,8,8,4 at 3f875ad (40,128 LUT4 built, +10.1 % "
        "estimated): every recorded build within −6.2 … +8.6 %; column_shared from mlp-digits "
        "11x4,10 and -deep 11x2,11,11,5; lane 898 → 860 after 53d3f90's forward rounding "
        "(a bit slice: mlp-digits 32,10 44,316 LUT4 built, +9.4 % estimated, -deep 16,8,8,4 "
        "38,754, +12.5 %): every recorded build within −8.6 … +9.0 %; column_shared 140 → 200 "
        "after -wide 6x3,22,2 (41,362 LUT4 built, +10.8 % estimated; now +9.0 %; docs/boards.md "
        "§3)",
        column_shared=200.0,
        divider_compare=80.0,
        rom_bit=0.031,
        lfsr_entry=0.86,
    ),
}


def _logic_rom_bits(loss: Any) -> int:
    """Bit-ports of the ROMs ``loss`` (a loss unit's plan) keeps in logic: words × width ×
    read ports of each ``logic`` memory without a write port (the exp ROM; 0 for a loss unit
    without memories, e.g. MSE)."""
    return sum(
        mm.words * mm.width * mm.read_ports
        for mm in getattr(loss, "memories", ()) or ()
        if mm.kind == "logic" and not mm.write_ports
    )


def logic_cells(plan: Any, board: Board) -> dict[str, int]:
    """Estimated logic cells of the board design of ``plan`` on ``board`` (nextpnr's count:
    iCE40 logic cells, ECP5 LUT4 slots), per part: ``shell`` (UART, FIFO, link engine),
    ``network``, ``loss`` (per loss unit), ``stage<i>`` (:attr:`LogicModel.stage` (+
    ``ingrad_stage``) + physical lanes L·k × (``lane`` + its products' low pieces in logic,
    ``select_add_bit`` per adder bit) + with k column lanes L·(k − 1) × (the forward
    accumulator's bits (the k-sum) − ``column_shared``) + (M + N) × ``size`` + its ``lutram``
    tiles, deep block-RAM banks' output bits and ``logic`` memory bits at their costs), and
    ``total``. A plan without stages (a summary) gives ``{"total": 0}``.

    Source: *derived* — a linear model per part, fitted to the measured builds
    (:data:`LOGIC_MODELS`; the builds, the fit and the residuals in docs/boards.md §3; within
    10 % of nextpnr's counts, tests/test_board_fit.py).
    """
    stages = getattr(plan, "stages", None)
    if not stages:
        return {"total": 0}
    m = LOGIC_MODELS[board.family]
    ob, lb = getattr(plan, "operand_bits", None), getattr(plan, "logic_low_bits", None)
    main, heads = getattr(plan, "loss", None), tuple(getattr(plan, "head_losses", ()))
    out = {
        "shell": m.shell,
        "network": m.network,
        "loss": m.loss * (1 + len(heads))
        + m.divider_compare * sum(radix_compares(lu) for lu in (main, *heads) if lu is not None)
        + m.rom_bit * sum(_logic_rom_bits(lu) for lu in (main, *heads) if lu is not None),
    }
    for st in stages:
        tiles = mux = flops = 0
        for mem in st.memories:
            if mem.kind == "lutram":
                tiles += (
                    mem.banks * -(-mem.words // 16) * -(-mem.width // 4) * max(1, mem.read_ports)
                )
            elif mem.kind == "logic":
                flops += mem.banks * mem.words * mem.width
            elif mem.kind == "bram" and mem.config_depth:
                mux += mem.banks * mem.width * (-(-mem.words // mem.config_depth) - 1)
        ml = getattr(plan, "momentum_in_logic", None)
        pieces = sum((lo - 1) * (cb + lo) for _, lo, cb in logic_pieces(st, ob, lb, ml))
        if momentum_logic(st, ml):  # m·u's CSD adder tree: (digits − 1) adders of u's width
            # (the low bits of each shifted term pass through; fitted to -deep 16,11,11,4:
            # 51,801 LUT4 built, 52,379 estimated, docs/boards.md §2)
            pieces += (len(csd(st.update.momentum.value)) - 1) * st.formats.u.bits
        # column lanes (Stage.col_lanes): each physical lane its own update and products, less
        # what a row's sub-lanes share (LogicModel.column_shared); the forward's k-sum (k − 1)
        # adders of the accumulator's width a row (derived: one cell a bit, a carry chain)
        sub = st.lanes * (st.column_lanes - 1)
        ksum = sub * (st.acc_fwd_bits - m.column_shared)
        # a shorter LFSR leap than the 32 steps the lane cost was fitted with (a conv stage's
        # LFSR is the same): fewer XOR inputs a lane
        poly, width = getattr(plan, "lfsr_poly", None), getattr(plan, "lfsr_width", None)
        leap = getattr(plan, "lfsr_leap", None)
        fewer = 0
        if poly and width and leap and leap != LFSR_WIDTH:
            fewer = leap_entries(poly, width, LFSR_WIDTH) - leap_entries(poly, width, leap)
        out[f"stage{st.index}"] = (
            m.stage
            + (m.ingrad_stage if st.input_gradient else 0.0)
            + st.mac_lanes * (m.lane + pieces * m.select_add_bit - fewer * m.lfsr_entry)
            + ksum
            + (st.in_features + st.out_features) * m.size
            + tiles * m.lutram_tile
            + mux * m.bram_mux_bit
            + flops * m.logic_bit
        )
    res = {k: round(v) for k, v in out.items()}
    res["total"] = round(sum(out.values()))
    return res


def plan_totals(plan: Any, board: Board | None = None, shell: ShellSource = None) -> dict[str, int]:
    """Return the plan's ``memory_bits``, ``multipliers`` (in the datapath) and
    ``memory_blocks`` (18 Kib units; the sum over stages when the plan has no total); with a
    ``board`` also ``hard_multipliers`` (DSP blocks of the board's width), ``bram_blocks``
    (the board's own block RAMs: the plan's plus the ``shell``'s, :func:`shell_blocks`),
    ``shell_bram_blocks``, ``spram_blocks`` and ``logic_cells`` (:func:`logic_cells`). A plan
    without stages (a summary) counts its ``multipliers`` as blocks and its 18 Kib blocks'
    bits in the board's blocks, and no logic cells."""
    blocks = getattr(plan, "memory_blocks", None)
    if blocks is None:
        blocks = sum(s.memory_blocks for s in plan.stages)
    out = {
        "memory_bits": int(plan.memory_bits),
        "multipliers": int(plan.multipliers),
        "memory_blocks": int(blocks),
    }
    if board is None:
        return out
    sh = shell_blocks(_shell_of(shell, plan), board)
    if not getattr(plan, "stages", None):
        bram = -(-out["memory_blocks"] * BLOCK_RAM_BITS // board.bram_block_bits)
        return out | {
            "hard_multipliers": out["multipliers"],
            "bram_blocks": int(bram) + sh,
            "shell_bram_blocks": sh,
            "spram_blocks": 0,
            "logic_cells": 0,
        }
    hard = hard_multipliers(plan, board.multiplier_width, 2, board.multiplier_min_product_bits)
    bram = memory_blocks(plan, board.bram_configs, board.bram_block_bits)
    return out | {
        "hard_multipliers": int(hard),
        "bram_blocks": int(bram) + sh,
        "shell_bram_blocks": sh,
        "spram_blocks": int(spram_blocks(plan)),
        "logic_cells": logic_cells(plan, board)["total"],
    }


def check_fit(plan: Any, board: Board, shell: ShellSource = None) -> dict[str, dict[str, int]]:
    """Check the board design of ``plan`` against the board; return ``{resource: {needed,
    available}}``.

    - multipliers: DSP blocks (hard multipliers of the board's width, ``Board.dsp_cell``) vs
      the board's; the plan's ``multipliers`` count each datapath multiplier once, whatever
      its width. The key stays ``multipliers`` (JSON); messages say "DSP blocks" for the
      board's and "multipliers" for the datapath's.
    - spram: SPRAMs of the stages with single-port weight memories vs the board's (0 except on
      the iCE40 UltraPlus).
    - memory bits: ``plan.memory_bits`` vs block RAM bits + the bits of the SPRAMs the plan
      uses.
    - bram_blocks: the plan's memories and the ``shell``'s (:class:`Shell`, None: the plan's
      only) mapped onto the board's block RAMs vs the board's (each memory is rounded up to
      whole blocks, so this is the tighter check); ``memory_block_bits``: the same in bits.
    - logic_cells: :func:`logic_cells` (UART and link engine included) vs the board's LUT4s /
      logic cells.

    Raises :class:`FitError` naming every resource that does not fit, with needed vs available
    numbers (its ``rows`` hold the same table).
    """
    t = plan_totals(plan, board, shell)
    sp = t["spram_blocks"]
    sp_bits = min(sp, board.spram_blocks) * board.spram_block_bits
    ram_bits = board.bram_bits + sp_bits
    ram_name = "block RAM" + (f" + {sp} SPRAM" if sp else "")
    block_bits = t["bram_blocks"] * board.bram_block_bits
    rows = {
        "multipliers": {"needed": t["hard_multipliers"], "available": board.multipliers},
        "spram": {"needed": sp, "available": board.spram_blocks},
        "memory_bits": {"needed": t["memory_bits"], "available": ram_bits},
        "memory_block_bits": {"needed": block_bits, "available": board.bram_bits},
        "bram_blocks": {"needed": t["bram_blocks"], "available": board.bram_blocks},
        "logic_cells": {"needed": t["logic_cells"], "available": board.luts},
    }
    w = board.multiplier_width
    problems = []
    if t["hard_multipliers"] > board.multipliers:
        losses = (getattr(plan, "loss", None), *getattr(plan, "head_losses", ()))
        in_loss = sum(len(loss_operands(lu)) for lu in losses if lu is not None)
        whose = (
            f"the stages' {t['multipliers']:,} multipliers and the loss unit's {in_loss}"
            if in_loss
            else f"the datapath's {t['multipliers']:,} multipliers"
        )
        problems.append(
            f"{t['hard_multipliers']:,} DSP blocks needed, {board.multipliers:,} available "
            f"({w}×{w} {board.dsp_cell}, for {whose})"
        )
    if sp > board.spram_blocks:
        problems.append(f"{sp:,} SPRAMs needed, {board.spram_blocks:,} available")
    if t["memory_bits"] > ram_bits:
        problems.append(
            f"{t['memory_bits']:,} memory bits needed, {ram_bits:,} available ({ram_name})"
        )
    elif t["bram_blocks"] > board.bram_blocks:
        link = f", {t['shell_bram_blocks']} of them the link's" if t["shell_bram_blocks"] else ""
        problems.append(
            f"{t['bram_blocks']:,} block RAMs of {board.bram_block_bits // 1024} Kib needed "
            f"({block_bits:,} bits{link}), {board.bram_blocks:,} available "
            f"({board.bram_bits:,} bits)"
        )
    if t["logic_cells"] > board.luts:
        problems.append(
            f"~{t['logic_cells']:,} {board.cells_name} needed (estimate, link engine and UART "
            f"included), {board.luts:,} available"
        )
    if problems:
        raise FitError(
            f"{getattr(plan, 'name', 'the design')} does not fit {board.name} "
            f"({board.description}): " + "; ".join(problems) + ". Use fewer lanes, narrower "
            "formats or a smaller network, or a bigger board",
            rows,
            plan,
        )
    return rows


def narrow_formats(plan: Plan, widths: dict[str, int]) -> list[str]:
    """Format overrides (``s<i>.<tensor>=Qi.f``) that fit each stage's tensors into
    ``widths[tensor]`` bits (0 or absent: leave it), keeping their calibrated integer bits and
    giving up fraction bits; [] when everything fits already.

    The same rule on every tensor keeps the formats that must agree equal: stage s's ``y`` and
    stage s+1's ``x``, stage s's ``d`` and stage s+1's ``gin``, and ``w``/``u`` share a
    fraction (the velocity is stored in weight units: their common fraction is set by the
    wider integer part). Logits (the ``y`` that feeds a loss unit) keep more than
    ``EXP_LUT_FRAC`` fraction bits, the exp LUT's step, even if that makes them wider.
    """
    out: list[str] = []
    last_main = plan.main_stages[-1].index
    for st in plan.stages:
        f = st.formats
        feeds_loss = st.index == last_main or (st.role == "head" and st.activation == "identity")
        wb = widths.get("w", 0) or widths.get("u", 0)
        if wb and max(f.w.bits, f.u.bits) > wb:
            wi, ui = f.w.bits - 1 - f.w.frac, f.u.bits - 1 - f.u.frac
            frac = wb - 1 - max(wi, ui)
            out += [f"s{st.index}.w=Q{wi}.{frac}", f"s{st.index}.u=Q{ui}.{frac}"]
        for t in ("x", "y", "d", "gin"):
            q, bits = getattr(f, t), widths.get(t, 0)
            if q is not None and bits and q.bits > bits:
                i = q.bits - 1 - q.frac
                frac = bits - 1 - i
                if t == "y" and feeds_loss:
                    # logits feed the loss unit's exp LUT, which needs > EXP_LUT_FRAC bits
                    frac = max(frac, EXP_LUT_FRAC + 1)
                if frac < q.frac:
                    out.append(f"s{st.index}.{t}=Q{i}.{frac}")
    return out


def narrowed_label(board: Board) -> str:
    """How a format source names the board fit's narrowing (:func:`narrow_formats`): ``narrowed
    to icebreaker's widths (w, u 16 bits; x, y, d, gin 12 bits)`` — the widths
    ``Board.format_bits`` gives, integer bits kept (logits keep the exp LUT's fraction bits)."""
    by: dict[int, list[str]] = {}
    for t, bits in board.format_bits().items():
        if bits:
            by.setdefault(bits, []).append(t)
    widths = "; ".join(f"{', '.join(ts)} {b} bits" for b, ts in by.items())
    return f"narrowed to {board.name}'s widths ({widths})"


def spram_stages(plan: Plan, board: Board) -> tuple[int, ...]:
    """The 1-based stages that get SPRAM weight memories on ``board`` (step 4 of the module
    docstring): one-lane stages of ≤ 16 K slots, largest weight + velocity bits first, while
    SPRAMs remain; () on a board without SPRAM. Not only until the plan's own count fits: that
    count covers the stage weights and stashes, while the link engine, the loss unit and the
    error buffers take ~15 more EBRs on the iCE40 (measured with Yosys, ``mlp-digits``), so
    every EBR the weights leave free is needed."""
    if not board.spram_blocks:
        return ()
    chosen: list[int] = []
    free = board.spram_blocks
    for st in sorted(plan.stages, key=lambda s: -(s.weight_bits + s.velocity_bits)):
        f = st.formats
        need = -(-f.w.bits // 16) + -(-f.u.bits // 16)
        if st.mac_lanes != 1 or st.cycles_per_tick > 16384 or need > free:
            continue
        chosen.append(st.index)
        free -= need
    return tuple(sorted(chosen))


def _pass(slot: Any, lanes: int) -> int:
    """Cycles of one stage slot's fused pass with ``lanes`` (a convolution slot passes its
    geometry)."""
    conv = getattr(slot, "conv", None)
    extra = () if conv is None else (conv,)
    return stage_cycles(slot.in_features, slot.out_features, lanes, *extra)[1]


def lane_candidates(ir: NetworkIR, config: TrainConfig) -> list[tuple[int, tuple[int, ...]]]:
    """Every fewest-lanes design, fastest first: ``(T, lanes)`` with ``lanes`` =
    :func:`~pipetrain.compiler.lanes.lanes_for_target` (T) for each pass length T (cycles) that
    some stage takes with some lane count (⌈M/L⌉·(N+1)), from the floor (one lane per row
    everywhere) up to one lane per stage; T is the slowest stage's pass of ``lanes``, and a
    lane vector appears once. Source: *derived* (FINN's folding by a target rate,
    docs/architecture.md §3)."""
    slots = stage_slots(ir, config)
    rows = [getattr(sl, "rows", sl.out_features) for sl in slots]
    floor = max(_pass(sl, r) for sl, r in zip(slots, rows, strict=True))
    ticks = sorted(
        {_pass(sl, L) for sl, r in zip(slots, rows, strict=True) for L in range(1, r + 1)}
    )
    out: list[tuple[int, tuple[int, ...]]] = []
    seen: set[tuple[int, ...]] = set()
    for T in ticks:
        if T < floor:
            continue
        lanes = lanes_for_target(ir, config, T)
        if lanes in seen:
            continue
        seen.add(lanes)
        out.append((max(_pass(sl, L) for sl, L in zip(slots, lanes, strict=True)), lanes))
    return out


def plan_with_lanes(
    req: PlanRequest,
    board: Board,
    lanes: tuple[int, ...],
    cols: tuple[int, ...] | None = None,
) -> tuple[Plan, PlanRequest]:
    """The plan of ``req`` (already at the board's settings) with ``lanes`` and column lanes
    ``cols`` (None: the request's), its one-lane stages on SPRAM where the board has it (step
    4); and the request it was built from. Unchecked."""
    cols = req.col_lanes if cols is None else (cols if any(k > 1 for k in cols) else None)
    attempt = req.replace(lanes=tuple(lanes), single_port=(), col_lanes=cols)
    plan = attempt.build()
    sp = spram_stages(plan, board)
    if sp:
        attempt = attempt.replace(single_port=sp)
        plan = attempt.build()
    return plan, attempt


#: The most of a board's logic cells (the estimate, :func:`logic_cells`) a plan with m·u in
#: logic (``Plan.momentum_in_logic``) may take when the search picks it: the ECP5 builds at a
#: 90 MHz constraint slow down with their size, their critical paths mostly routing across
#: the die — -deep 16,8,8,4 (m·u in blocks) 40,128 LUT4 (48 %) 98.0 MHz, mlp-digits 32,10
#: 49,105 (59 %) 90.8, -deep 16,11,11,4 with m·u in logic 51,801 (62 %) 81.4, -deep
#: 11×2,11,11,5 with m·u in logic 57,846 (69 %; 58,914 estimated) **67.7** (365dccf: the
#: weight access's state → stage 1's stash-write enable, 14.8 ns with 12.4 of routing) — that
#: 110-cycle plan projects to 616 k samples/s at its Fmax against 16,8,8,4's 685 k at 143, so
#: a faster tick in a bigger design is slower. *Derived* from those builds (0.75 before
#: them); a plan with m·u in its DSP blocks fits up to every cell, and lanes the user gives
#: up to every cell either way.
MOMENTUM_LOGIC_FILL = 0.60
#: The fewest cycles a plan with m·u in logic must save against the fastest fit with m·u in
#: its DSP blocks to be chosen (a fraction of that tick): its extra lanes make a bigger
#: design that routes slower — mlp-digits-deep 16,11,11,4 with m·u in logic (141 cycles,
#: 51,801 LUT4) reached 81.4 MHz at a 90 MHz constraint (42162ff; its critical path the
#: weight access's state → the tick controller → stage 1's stash-write enable, 10.1 ns of
#: routing across the die) where 16,8,8,4 (143 cycles) had reached 92.3: 1.4 % fewer cycles
#: for 12 % less clock. *Derived* from that build; -wide's 527 → 398 (24 %) passes.
MOMENTUM_LOGIC_GAIN = 0.10


def _has_momentum_product(plan: Plan) -> bool:
    """A stage of ``plan`` multiplies ``m·u`` in a DSP block (``Stage.products``)."""
    return any(p.name == "momentum" for st in plan.stages for p in st.products or ())


def _fitting(
    req: PlanRequest,
    board: Board,
    lanes: tuple[int, ...],
    resolved: Shell | None,
    shell: ShellSource,
    cols: tuple[int, ...] | None = None,
    fill: float | None = None,
) -> tuple[Plan, PlanRequest, Shell, FitError | None]:
    """The plan of ``req`` with ``lanes`` that fits ``board``: with m·u in its DSP blocks, or
    else — where those blocks are what does not fit — m·u in logic
    (``Plan.momentum_in_logic``: one block a lane fewer, the same integers; *derived*: the
    blocks bind a board's lanes, its LUT4s rarely do) when its logic cells stay within
    :data:`MOMENTUM_LOGIC_FILL` of the board's. Returns the plan, its request, the shell
    and the fit error (None when it fits; the DSP form's error when neither does).
    ``cols``: column lanes per stage (:func:`plan_with_lanes`). ``fill``: the largest share of
    the board's logic cells the m·u-in-logic form may take (default
    :data:`MOMENTUM_LOGIC_FILL`; lanes the user gave: 1, every cell)."""
    plan, attempt = plan_with_lanes(req, board, lanes, cols)
    if resolved is None:
        resolved = _shell_of(shell, plan)  # the same for every lane count
    try:
        check_fit(plan, board, resolved)
        return plan, attempt, resolved, None
    except FitError as exc:
        first = exc
    if req.momentum_in_logic or not _has_momentum_product(plan):
        return plan, attempt, resolved, first
    if plan_totals(plan, board, resolved)["hard_multipliers"] <= board.multipliers:
        return plan, attempt, resolved, first  # the blocks fit: something else does not
    logic, at = plan_with_lanes(req.replace(momentum_in_logic=True), board, lanes, cols)
    try:
        check_fit(logic, board, resolved)
    except FitError:
        return plan, attempt, resolved, first
    limit = MOMENTUM_LOGIC_FILL if fill is None else fill
    if plan_totals(logic, board, resolved)["logic_cells"] > limit * board.luts:
        return plan, attempt, resolved, first
    return logic, at, resolved, None


def _search(
    req: PlanRequest, board: Board, shell: ShellSource
) -> tuple[tuple[Plan, PlanRequest] | None, FitError | None]:
    """Walk the lane candidates fastest first (step 3); return the best fitting (plan,
    request), or None and the last candidate's FitError (one lane per stage): the fewest
    cycles, then fewer blocks, logic cells, block RAMs — of the plans with m·u in their DSP
    blocks, unless one with m·u in logic (:func:`_fitting`) ticks at most
    1 − :data:`MOMENTUM_LOGIC_GAIN` of their best."""
    bests: dict[bool, tuple[tuple[int, ...], Plan, PlanRequest]] = {}
    err: FitError | None = None
    resolved: Shell | None = None
    plain = [(t, lanes, None) for t, lanes in lane_candidates(req.ir, req.config)]
    cands = sorted(plain + column_candidates(req.ir, req.config), key=lambda c: c[0])
    for slowest, base, cols in cands:
        if False in bests and slowest > bests[False][0][0]:
            break  # the tick is at least the slowest pass: no later candidate is faster
        for lanes in _with_faster_feeder(req, base):
            # with column lanes the stages outpace the loss unit: it takes its fastest form
            r = req.replace(loss_fastest=True) if cols else req
            plan, attempt, resolved, exc = _fitting(r, board, lanes, resolved, shell, cols)
            if exc is not None:
                if lanes == base and cols is None:
                    err = exc
                continue
            t = plan_totals(plan, board, resolved)
            key = (
                plan.ideal_cycles_per_sample,
                t["hard_multipliers"],
                t["logic_cells"],
                t["bram_blocks"],
            )
            form = bool(plan.momentum_in_logic)
            if form not in bests or key < bests[form][0]:
                bests[form] = (key, plan, attempt)
            if plan.tick_cycles <= max(st.pass_cycles for st in plan.stages) + TICK_OVERHEAD:
                break  # the tick is the slowest pass: more feeder lanes add nothing
    best = bests.get(False)
    logic = bests.get(True)
    if logic is not None and (
        best is None or logic[0][0] <= (1 - MOMENTUM_LOGIC_GAIN) * best[0][0]
    ):
        best = logic
    return ((best[1], best[2]) if best else None), err


#: The most column lanes the fit gives a stage (``Stage.col_lanes``): the forward's k-sum is
#: then at most two adder levels in its register stage (*derived*, timing only; ``--lanes``
#: may ask for more).
COL_LANES_MAX = 4


def column_candidates(
    ir: NetworkIR, config: TrainConfig
) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """The designs with column lanes on stage 1 (``Stage.col_lanes``, when the HDL builds them
    there: a Linear stage the host writes, without an input gradient): ``(T, lanes, cols)``
    for each pass length T some (L, k ≤ :data:`COL_LANES_MAX`) of stage 1 takes, with the
    other stages' fewest lanes for T (:func:`~pipetrain.compiler.lanes.lanes_for_target`) and
    stage 1's fewest physical lanes L·k > L₁ for T (ties: fewer column lanes) — only where
    that is fewer than one lane per row would need, or one lane per row is not fast enough.
    Sorted by T; [] when stage 1 cannot take column lanes. Source: *derived* (folding over
    the input dimension, as FINN's SIMD beside its PE)."""
    slots = stage_slots(ir, config)
    s1 = slots[0]
    if (
        getattr(s1, "conv", None) is not None
        or s1.attach != 0
        or s1.gin_losses
        or len(s1.losses) != 1
        or tuple(s1.grad_losses) != tuple(s1.losses)
        or s1.in_features < 2
    ):
        return []
    N, M = s1.in_features, s1.out_features
    options = sorted(
        (stage_cycles(N, M, L, None, k)[1], L * k, k, L)
        for k in range(2, COL_LANES_MAX + 1)
        for L in range(1, M + 1)
    )
    rest_floor = max((_pass(sl, getattr(sl, "rows", sl.out_features)) for sl in slots[1:]),
                     default=0)  # fmt: skip
    out: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []
    seen: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    for T in sorted({o[0] for o in options if o[0] >= rest_floor}):
        fits = [o for o in options if o[0] <= T]
        _, phys, k, L = min(fits, key=lambda o: (o[1], o[2]))
        plain = fewest_lanes(N, M, T)
        if plain is not None and plain <= phys:
            continue  # rows alone reach T with as few lanes
        try:
            lanes = lanes_for_target(ir, config, T, first=1)
        except PlanError:
            continue
        key = ((L, *lanes), (k,) + (1,) * len(lanes))
        if key in seen:
            continue
        seen.add(key)
        slowest = max([stage_cycles(N, M, L, None, k)[1]] +
                      [_pass(sl, x) for sl, x in zip(slots[1:], lanes, strict=True)])  # fmt: skip
        out.append((slowest, *key))
    return out


def _with_faster_feeder(req: PlanRequest, lanes: tuple[int, ...]) -> list[tuple[int, ...]]:
    """``lanes``, then the same with more lanes on the last main stage — the one feeding the
    loss unit — one row group fewer at a time (the fewest lanes for each): a fewest-lanes
    design meets its target with every pass, but the tick is also the feeder's pass followed
    by the loss unit, which a faster feeder shortens (mlp-digits-deep on the ULX3S: 16,8,8,3
    ticks 169 cycles on 137 + 30, 16,8,8,4 139). Source: *derived*."""
    slots = stage_slots(req.ir, req.config)
    k = max(i for i, sl in enumerate(slots) if getattr(sl, "role", "main") == "main")
    rows = getattr(slots[k], "rows", slots[k].out_features)
    out = [tuple(lanes)]
    groups = -(-rows // lanes[k])
    for g in range(groups - 1, 0, -1):
        more = list(lanes)
        more[k] = -(-rows // g)
        out.append(tuple(more))
    return out


def board_lanes(request: PlanRequest, board: Board, shell: ShellSource = None) -> tuple[int, ...]:
    """``--lanes auto``: the lanes of the fastest plan of ``request`` that fits ``board``
    (step 3 of the module docstring; the request as :func:`fit_plan` builds it, with the
    board's constants and formats). Raises :class:`FitError` when even one lane per stage does
    not fit. Source: *derived* (FINN's folding to a target rate; the board is the target)."""
    found, err = _search(request, board, shell)
    if found is None:
        assert err is not None
        raise err
    return found[1].lanes


def board_request(request: PlanRequest, board: Board) -> PlanRequest:
    """``request`` at ``board``'s settings (steps 1 and 2 of the module docstring): its clock,
    constants, RAM family, low-piece rule and operand registers, the formats narrowed to its
    widths; lanes as they are, no SPRAM stage yet. What :func:`fit_plan` fits, and what
    ``--max-multipliers`` counts with a board (its constants decide which products are
    shift-adds)."""
    req = request.replace(
        clock_hz=board.clock_hz,
        const_bits=board.const_bits,
        single_port=(),
        ram_family=board.ram_family,
        logic_low_bits=board.logic_low_bits,
        operand_registers=board.operand_registers,
    )
    over = narrow_formats(req.build(), board.format_bits())
    if over:
        spec = apply_overrides(
            req.formats, parse_format_overrides(over), req.ir, req.config, narrowed_label(board)
        )
        req = req.replace(formats=spec)
    return req


def fit_plan(
    request: PlanRequest, board: Board, shell: ShellSource = None
) -> tuple[Plan, PlanRequest]:
    """Fit ``request`` to ``board`` (module docstring); return the plan and the request it was
    built from (its ``formats`` are the narrowed ones, its ``lanes`` the chosen ones).
    ``shell``: the board design's memories outside the plan (:class:`Shell`, or a function of
    the plan giving it; None: the plan's memories only).

    Raises :class:`FitError` (needed vs available numbers) when even one lane per stage with
    the board's formats does not fit, or when the lanes the user gave (``lanes_given``) do not
    fit — then naming the lanes that do; :class:`~pipetrain.compiler.build.PlanError` for a
    design that is invalid at the board's settings.
    """
    req = board_request(request, board)
    if req.lanes_given:
        # the user's lanes: m·u in logic where its cells fit at all (the fill rule is the
        # search's, for the timing of a bigger design it would choose by itself)
        plan, attempt, _, given = _fitting(req, board, req.lanes, None, shell, fill=1.0)
        if given is None:
            return plan, attempt
        found, _ = _search(req, board, shell)
        head = str(given).split(". Use fewer lanes")[0]
        if found is None:
            hint = "no lane count fits either: use a smaller network or a bigger board"
        else:
            p = found[0]
            hint = (
                f"--lanes {lanes_text(found[1].lanes, found[1].col_lanes)} fits "
                f"({p.ideal_cycles_per_sample:,} "
                "cycles/sample): give it, or leave --lanes out for the fastest plan that fits "
                "(--lanes auto)"
            )
        if req.lanes_option:
            asked = f"the lanes {req.lanes_option} chose"
            hint = hint.replace("leave --lanes out", f"leave {req.lanes_option.split()[0]} out")
        else:
            asked = "the lanes asked for"
        raise FitError(
            f"{head}, with {asked} ({lanes_text(req.lanes, req.col_lanes)}); {hint}",
            given.rows,
            given.plan,
        ) from None
    found, err = _search(req, board, shell)
    if found is not None:
        return found
    assert err is not None
    head = str(err).split(". Use fewer lanes")[0]
    narrowed = " and the board's narrower formats" if any(board.format_bits().values()) else ""
    raise FitError(
        f"{head}, already with one lane per stage{narrowed}. Use a smaller network or a bigger "
        "board (pipetrain list-boards)",
        err.rows,
        err.plan,
    ) from None
