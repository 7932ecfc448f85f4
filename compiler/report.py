"""Human- and machine-readable summaries of a :class:`~pipetrain.compiler.plan.Plan`.

* :func:`stage_table` — the per-stage table ``pipetrain compile`` prints (aligned Markdown),
  and :func:`stage_legend`, the line under it naming its columns;
* :func:`conv_table` — the convolution stages' geometry, lanes, cycles and memories;
* :func:`format_table` — every tensor's format against its calibrated range;
* :func:`fit_table` / :func:`fit_text` — a board fit's needed / available resources;
* :func:`render_report` — ``report.md``: the board fit, both tables, totals, loss units, notes
  and warnings;
* :func:`plan_summary` — the JSON result of ``pipetrain compile --json``.

Every number is read from the plan or the fit (nothing is recomputed here, except the DSP
blocks per multiplier of :func:`multiplier_text`, by the fit's own rule).

Names: *multipliers* are the datapath's products (what the HDL builds, ``Stage.products``;
``Stage.multipliers`` = lanes × their count, ``Plan.multipliers`` the stages' sum, each counted
once; the loss units' are rows of the stage table and the Multipliers table, and the totals
include them); *DSP blocks* are the board's hard multipliers (18 × 18 MULT18X18D, 16 × 16
SB_MAC16) that they take. The JSON keys stay ``multipliers`` (the stages') and
``loss_multipliers``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from .build import (
    RAM_FAMILIES,
    TICK_OVERHEAD,
    forward_cycles,
    logic_pieces,
    loss_operands,
    multiplier_blocks,
    pass_cycles,
)
from .lanes import lanes_text
from .plan import Const, LossUnit, Plan, QFormat, Stage
from .targets import BOARDS, Board

__all__ = [
    "markdown_table",
    "stage_legend",
    "stage_table",
    "stage_shape",
    "conv_table",
    "totals_text",
    "FIT_LABELS",
    "fit_label",
    "fit_table",
    "fit_text",
    "format_table",
    "render_report",
    "plan_summary",
]

_TENSORS = ("x", "y", "d", "gin", "w", "u")


def markdown_table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], left: Sequence[str] = ()
) -> str:
    """Return an aligned Markdown table (readable as plain text too); numeric columns are
    right-aligned except the columns named in ``left``."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    numeric = [
        h not in left and all(_is_number(r[i]) for r in cells) and bool(cells)
        for i, h in enumerate(headers)
    ]

    def line(values: Sequence[str]) -> str:
        out = []
        for v, w, num in zip(values, widths, numeric, strict=True):
            out.append(v.rjust(w) if num else v.ljust(w))
        return "| " + " | ".join(out) + " |"

    sep = (
        "|"
        + "|".join(
            ("-" * (w + 1) + ":") if num else ("-" * (w + 2))
            for w, num in zip(widths, numeric, strict=True)
        )
        + "|"
    )
    return "\n".join([line(headers), sep, *(line(r) for r in cells)])


def _is_number(text: str) -> bool:
    """Whether a cell keeps its column numeric (right-aligned): a number, or a cell that
    labels a row of numbers — empty, ``–``, ``total``, and the stage table's ``L<k>`` (a loss
    unit) and ``top`` rows."""
    if text in ("", "–", "total", "top") or re.fullmatch(r"L\d+", text):
        return True
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True


def _fmt(f: QFormat | None) -> str:
    return "–" if f is None else str(f)


def _layer(st: Stage) -> str:
    return st.name if st.role == "main" else f"{st.name} (head)"


def block_name(plan: Plan) -> str:
    """The plan's block RAM as a short column name: ``BRAM18`` (18 Kib blocks, ``bram18``) or
    ``EBR`` (iCE40 4 Kib)."""
    return "EBR" if plan.ram_family == "ice40" else f"BRAM{_block_kib(plan)}"


def _block_kib(plan: Plan) -> int:
    return RAM_FAMILIES[plan.ram_family].block_bits // 1024


def _dims(*sizes: int) -> str:
    return "×".join(str(v) for v in sizes)


def stage_shape(st: Stage) -> str:
    """``N→M``, or a convolution stage's ``C_in×H×W→C_out×H′×W′`` (after pooling)."""
    g = st.conv
    if g is None:
        return f"{st.in_features}→{st.out_features}"
    return f"{_dims(g.in_channels, *g.in_size)}→{_dims(g.out_channels, *g.pooled_size)}"


def conv_table(plan: Plan) -> str:
    """Return the convolution stages' geometry (docs/numerics.md §9): kind, C_in → C_out,
    kernel, stride, padding, bias, input / convolution-output / pooled spatial sizes, the
    pooling and its window, T + 1 weight columns, P output positions, lanes (over output
    channels), row groups, cycles per tick (``conv_cycles``) and the stage's memories as the
    HDL builds them (name: bits); "" for a plan without one."""
    headers = (
        "stage", "layer", "kind", "C_in→C_out", "kernel", "stride", "padding", "bias",
        "in size", "conv out", "pool", "pooled", "T+1", "P", "lanes", "groups",
        "cycles/tick", "memories (bits)",
    )  # fmt: skip
    rows = []
    for st in plan.stages:
        g = st.conv
        if g is None:
            continue
        pool = "–" if g.pool == "none" else f"{g.pool} {_dims(*g.pool_size)}"
        if g.pool == "avg" and g.pool_scale != 1:
            pool += f" (·{g.pool_scale}≫{g.pool_shift})"
        rows.append(
            (
                st.index, _layer(st), g.kind, f"{g.in_channels}→{g.out_channels}",
                _dims(*g.kernel), _dims(*g.stride), _dims(*g.padding),
                "yes" if g.bias else "no", _dims(*g.in_size), _dims(*g.out_size), pool,
                _dims(*g.pooled_size), g.taps + 1, g.positions, st.lanes, st.row_groups,
                st.cycles_per_tick, ", ".join(f"{m.name} {m.bits:,}" for m in st.memories),
            )
        )  # fmt: skip
    if not rows:
        return ""
    return markdown_table(headers, rows, left=("layer", "kind", "pool", "memories (bits)"))


def loss_units(plan: Plan) -> list[tuple[str, LossUnit]]:
    """The plan's loss units with their loss names, as the Delays lines and the memory table
    name them: ``loss L<K>`` (the main one, K = heads + 1) first, then the heads' ``loss L<k>``."""
    out = [(f"loss L{len(plan.head_losses) + 1}", plan.loss)]
    return out + [(f"loss L{k}", lu) for k, lu in enumerate(plan.head_losses, start=1)]


def loss_multipliers(loss: LossUnit) -> int:
    """Multipliers of a loss unit as the HDL builds them (:func:`~pipetrain.compiler.build.
    loss_operands`: cross-entropy 1, MSE 1 or 2)."""
    return len(loss_operands(loss))


def _bram_blocks(memories: Sequence[Any]) -> int:
    """Block RAMs of the plan's family that ``memories`` take (their ``bram`` entries' blocks,
    as ``Stage.memory_blocks`` and ``Plan.memory_blocks`` count them; SPRAMs not)."""
    return sum(m.blocks for m in memories if m.kind == "bram")


def stage_table(plan: Plan) -> str:
    """Return the per-stage table: layer, shape, delay D_s, stash entries as built
    (``Stage.stash_entries`` = D_s + 2, the ``xstash`` / ``mask`` memories'), lanes, slots and
    cycles of the stage's pass per tick (``Stage.cycles_per_tick`` slots, one every
    ``Stage.slot_cycles`` cycles: ``Stage.pass_cycles``), memory (bits and block RAMs of the
    plan's RAM family, from ``Stage.memories`` as the HDL builds them), multipliers and the
    x/y/d/w/u formats; then one row per loss unit (``L<k>``, layer ``loss``: its cycles,
    memories and multipliers) and one for the network top's memories (``top``: the result
    FIFO), so that the totals — ``Plan.memory_bits``,
    ``Plan.memory_blocks`` and every multiplier of the design (``Plan.multipliers`` + the loss
    units') — are the sums of the rows above them."""
    headers = (
        "stage", "layer", "shape", "act", "D_s", "stash", "lanes", "slots/tick", "pass cycles",
        "memory bits", block_name(plan), "mults", "x", "y", "d", "gin", "w", "u",
    )  # fmt: skip
    rows: list[tuple] = []
    for st in plan.stages:
        f = st.formats
        rows.append(
            (
                st.index,
                _layer(st),
                stage_shape(st),
                st.activation,
                st.delay,
                st.stash_entries,
                st.lanes if st.col_lanes is None else f"{st.lanes}×{st.col_lanes}",
                st.cycles_per_tick,
                st.pass_cycles,
                st.memory_bits,
                st.memory_blocks,
                st.multipliers,
                _fmt(f.x),
                _fmt(f.y),
                _fmt(f.d),
                _fmt(f.gin),
                _fmt(f.w),
                _fmt(f.u),
            )
        )
    blank = ("",) * 6
    losses = loss_units(plan)
    for name, lu in losses:
        rows.append(
            (
                name.split()[-1], "loss", f"{lu.classes} classes", str(lu.kind), "", "", "", "",
                lu.cycles, sum(m.bits for m in lu.memories), _bram_blocks(lu.memories),
                loss_multipliers(lu), *blank,
            )
        )  # fmt: skip
    if plan.memories:
        rows.append(
            (
                "top", "", ", ".join(m.name for m in plan.memories), "", "", "", "", "", "",
                sum(m.bits for m in plan.memories), _bram_blocks(plan.memories), 0, *blank,
            )
        )  # fmt: skip
    mults = plan.multipliers + sum(loss_multipliers(lu) for _, lu in losses)
    rows.append(
        (
            "total", "", "", "", "", "", sum(s.mac_lanes for s in plan.stages), "", "",
            plan.memory_bits, plan.memory_blocks, mults, *blank,
        )
    )  # fmt: skip
    return markdown_table(headers, rows, left=("layer",))


def stage_legend() -> str:
    """The line under :func:`stage_table` saying what its less obvious columns are: D_s, the
    stash (entries as built), slots/tick and pass cycles (docs/architecture.md §2.1, §3.4,
    §3.6)."""
    return (
        "D_s: the stage's delay, the weight updates it applies between a sample's forward "
        "and its backward (docs/architecture.md §2.1); stash: input-stash entries as built "
        "(`Stage.stash_entries` = D_s + 2: the D_s + 1 samples in use and the one being "
        "written; the `xstash` and `mask` memories hold that many, §3.6); slots/tick: the "
        "fused pass's weight-memory slots per tick (`Stage.cycles_per_tick`; a Linear "
        "stage's row groups × (N + 1); with k column lanes, lanes L×k, row groups × "
        "⌈(N + 1)/k⌉); pass cycles: the pass from start to done, its slots plus the "
        "pipeline's fill and drain (`Stage.pass_cycles`)."
    )


def totals_text(plan: Plan, board: Board | None = None) -> str:
    """Return the tick, throughput, memory and multiplier totals as a few lines of text; the
    multipliers line says which DSP blocks they take (``board``'s, else 18 × 18,
    :func:`multiplier_text`)."""
    slowest = max(plan.stages, key=lambda s: s.pass_cycles)
    losses = [plan.loss, *plan.head_losses]
    loss_cycles = max(lu.cycles for lu in losses)
    last = plan.main_stages[-1]
    stage_bits = sum(s.memory_bits for s in plan.stages)
    lines = [
        f"tick: {plan.tick_cycles} cycles, the longer of the slowest stage's pass "
        f"(stage {slowest.index}: {slowest.cycles_per_tick} slots, {slowest.pass_cycles} cycles) "
        f"and the last stage's forward outputs followed by the loss unit "
        f"({forward_cycles(last)} + {loss_cycles} cycles), plus {TICK_OVERHEAD} cycles of "
        "tick control",
        *_slot_lines(plan),
        f"ideal cycles per sample: {plan.ideal_cycles_per_sample} ({plan.schedule}); "
        f"{plan.samples_per_s:,.0f} samples/s at {plan.clock_hz / 1e6:g} MHz",
        f"memory: {plan.memory_bits:,} bits ({plan.memory_bits / 1024:.1f} Kib) as built — "
        f"stages {stage_bits:,}, loss units and result FIFO {plan.memory_bits - stage_bits:,} — "
        f"in {plan.memory_blocks} {_block_kib(plan)} Kib block RAMs"
        + _spram_text(plan)
        + (f" (budget {plan.memory_budget_bits:,} bits)" if plan.memory_budget_bits else ""),
        f"{multiplier_text(plan, board)}; lanes: "
        + lanes_text([s.lanes for s in plan.stages], [s.column_lanes for s in plan.stages]),
        *_lut_lines(plan),
        f"plan hash: {plan.hash}",
    ]
    return "\n".join(lines)


def _slot_lines(plan: Plan) -> list[str]:
    """One line for the stages whose pass issues a slot every other cycle (single-port SPRAM
    weights, ``Stage.slot_cycles`` = 2): why their pass cycles are twice their slots."""
    out = []
    two = [s for s in plan.stages if s.slot_cycles > 1]
    if two:
        each = ", ".join(
            f"stage {s.index} {s.cycles_per_tick:,} slots → {s.pass_cycles:,} cycles" for s in two
        )
        out.append(
            f"slots/tick vs pass cycles: a single-port (SPRAM) weight memory gives a slot every "
            f"{two[0].slot_cycles} cycles: {each}"
        )
    regs = [s for s in plan.stages if s.operand_registers]
    if regs:
        P = max(s.operand_registers or 0 for s in regs)
        bare = {s.index: pass_cycles(dataclasses.replace(s, operand_registers=None)) for s in regs}
        each = ", ".join(
            f"stage {s.index} {s.cycles_per_tick:,} slots → {s.pass_cycles:,} cycles "
            f"({bare[s.index]:,} without them)"
            for s in regs
        )
        more = {s.pass_cycles - bare[s.index] for s in regs}
        times = "once" if P == 1 else "twice" if P == 2 else f"{P} times"
        out.append(
            f"operand registers (the board's, `Stage.operand_registers` = {P}; "
            f"docs/architecture.md §3): every multiplier's operands are registered {times} "
            f"more and the weight banks' write data {times} before the write (timing), so each "
            f"pass takes {' or '.join(str(n) for n in sorted(more))} cycles more than without "
            f"them (a pass is its slots plus the pipeline's fill and drain): {each}; on the "
            "ECP5 a lane multiplier's operand and product registers are its MULT18X18D's own "
            "(hdl/dsp.py)"
        )
    return out


def _dsp_counts(plan: Plan, width: int, min_product_bits: int) -> dict[int, int]:
    """``{DSP blocks one multiplier takes: multipliers}`` over every multiplier of the design
    (each stage lane's ``Stage.products``, a ``per_stage`` one once, and the loss units'), for
    ``width`` × ``width`` blocks (:func:`~pipetrain.compiler.build.multiplier_blocks`, as
    ``build.hard_multipliers`` and the board fit count them)."""
    out: dict[int, int] = {}
    for st in plan.stages:
        for p in st.products or ():
            k = multiplier_blocks(p.a_bits, p.b_bits, width, 2, min_product_bits)
            out[k] = out.get(k, 0) + st.product_count(p)
    for lu in (plan.loss, *plan.head_losses):
        for a, b in loss_operands(lu):
            k = multiplier_blocks(a, b, width, 2, min_product_bits)
            out[k] = out.get(k, 0) + 1
    return out


def multiplier_text(plan: Plan, board: Board | None = None) -> str:
    """``multipliers: 139 (138 in the stages + 1 in the loss unit) → 139 DSP blocks (18×18
    MULT18X18D): one each``: every multiplier of the design and the DSP blocks they take on
    ``board`` (None: 18 × 18 blocks, the Multipliers table's), with how many take more than one
    block (an operand wider than the block) or none (a product too narrow for a block, in
    logic: iCE40). The DSP count is the board fit's ``multipliers`` row (``needed``)."""
    width = 18 if board is None else board.multiplier_width
    min_product = 0 if board is None else board.multiplier_min_product_bits
    cell = "MULT18X18D" if board is None else board.dsp_cell
    counts = _dsp_counts(plan, width, min_product)
    losses = [plan.loss, *plan.head_losses]
    in_loss = sum(loss_multipliers(lu) for lu in losses)
    total = plan.multipliers + in_loss
    blocks = sum(k * n for k, n in counts.items())
    unit = "loss unit" if len(losses) == 1 else "loss units"
    if set(counts) <= {1}:
        how = "one each"
    else:
        parts = [f"{n} take {k}" for k, n in sorted(counts.items()) if k > 1]
        if counts.get(0):
            parts.append(f"{counts[0]} none (narrower than a {min_product}-bit product: in logic)")
        how = ", ".join(parts) + (f", {counts[1]} one each" if counts.get(1) else "")
        if any(k > 1 for k in counts):
            how += f" (an operand wider than {width} bits is split into {width}-bit pieces)"
    return (
        f"multipliers: {total} ({plan.multipliers} in the stages + {in_loss} in the {unit}) → "
        f"{blocks} DSP blocks ({width}×{width} {cell}): {how}"
    )


def _spram_text(plan: Plan) -> str:
    """`` and N SPRAMs (B bits: …)`` for the memories the plan puts in SPRAM (single-port
    stages on the iCE40 UltraPlus, docs/boards.md), else ``""``."""
    spram = [(o, m) for o, m in plan.all_memories() if m.kind == "spram"]
    if not spram:
        return ""
    blocks = sum(m.blocks for _, m in spram)
    bits = sum(m.banks * m.words * m.width for _, m in spram)
    names = ", ".join(f"{o.replace('stage', 'stage ')} {m.name}" for o, m in spram)
    return f" and {blocks} SPRAM{'s' if blocks != 1 else ''} ({bits:,} bits: {names})"


def _lut_lines(plan: Plan) -> list[str]:
    """One line per tanh / sigmoid stage: its LUT ROM, step and error bound (numerics.md §3)."""
    out = []
    for s in plan.stages:
        lut = s.activation_lut
        if lut is None:
            continue
        out.append(
            f"stage {s.index} {lut.function}: LUT of {len(lut.entries)} words × {lut.word_bits} "
            f"bits (step 2^-{lut.index_frac}, interpolated), max error {lut.error_bound_lsb} LSB "
            f"of y {s.formats.y}; the stash keeps y ({s.mask_bits} bits per output)"
        )
    return out


def memory_table_title(plan: Plan) -> str:
    """The heading of :func:`memory_table`: what ``blocks`` counts."""
    return f"as the HDL builds them; blocks: {_block_kib(plan)} Kib block RAMs, SPRAMs"


def _owner(plan: Plan, owner: str) -> str:
    """A memory owner of :meth:`Plan.all_memories` as :func:`memory_table` shows it: a loss
    unit by its loss, as the Delays lines, the training summary and its saturation table name
    them — L1 … LK, the true loss LK (K = heads + 1), the heads' L1 … L(K−1): ``loss`` →
    ``loss L<K>``, ``head_loss<k>`` → ``loss L<k>``; the stages and ``top`` as they are (the
    JSON keeps the HDL's submodule names)."""
    if owner == "loss":
        return f"loss L{len(plan.head_losses) + 1}"
    if owner.startswith("head_loss"):
        return f"loss L{owner[len('head_loss') :]}"
    return owner


def memory_table(plan: Plan) -> str:
    """Return every memory of the design (:meth:`Plan.all_memories`) with its owner, kind,
    banks, words × width (bits), read/write ports, block mode and blocks (block RAMs of the
    plan's RAM family for ``bram``, SPRAMs for ``spram``, none for LUT RAM / flip-flops); a loss
    unit's owner is its loss, ``loss L<t>`` (:func:`_owner`)."""
    rows = [
        (
            _owner(plan, owner),
            m.name,
            m.kind,
            m.banks,
            m.words,
            m.width,
            f"{m.read_ports}R{m.write_ports}W",
            f"{m.config_depth}×{m.config_width}" if m.blocks else "–",
            m.blocks,
            m.bits,
        )
        for owner, m in plan.all_memories()
    ]
    headers = ("owner", "memory", "kind", "banks", "words", "width", "ports", "block mode")
    return markdown_table(headers + ("blocks", "bits"), rows, left=("owner", "ports"))


def multiplier_table(plan: Plan) -> str:
    """Return every multiplier of each stage lane as built (``Stage.products``: what it
    multiplies, its operand widths in bits, the 18 × 18 DSP blocks it takes per lane and for
    the stage's lanes — once for a stage's shared one, ``Product.per_stage``, whose row says
    1 lane) and the loss units'; stages of plans from before the list are left out."""
    rows: list[tuple] = [
        (st.index, p.name, f"{p.a_bits} × {p.b_bits}", p.blocks, n, p.blocks * n)
        for st in plan.stages
        for p in st.products or ()
        for n in [st.product_count(p)]
    ]
    for name, lu in [("loss", plan.loss)] + [
        (f"L{k}", lu) for k, lu in enumerate(plan.head_losses, start=1)
    ]:
        ops = loss_operands(lu)
        for a, b in dict.fromkeys(ops):  # the out phase's Q products e·r: one row, Q lanes
            blocks, n = multiplier_blocks(a, b), ops.count((a, b))
            rows.append((name, "loss unit", f"{a} × {b}", blocks, n, blocks * n))
    rows.append(("total", "", "", "", "", sum(r[5] for r in rows)))
    headers = ("stage", "multiplier", "operand bits", "DSP blocks/lane", "lanes", "DSP blocks")
    return markdown_table(headers, rows, left=("multiplier",))


#: How the rows of a board fit (:func:`~pipetrain.compiler.fit.check_fit`) read in output: the
#: datapath's multipliers take the board's DSP blocks (row key ``multipliers``), and the
#: stage memories are mapped onto the board's own block RAMs. ``memory_bits`` is the plan's
#: own (``Plan.memory_bits``: the link engine's memories are not in it), the two block-RAM
#: rows count the link's blocks too (``fit.plan_totals``' ``bram_blocks``): each label says so.
FIT_LABELS = {
    "multipliers": "DSP blocks",
    "spram": "SPRAM",
    "memory_bits": "memory bits (the plan's, link's not counted)",
    "memory_block_bits": "block-RAM bits as mapped (link's included)",
    "bram_blocks": "block RAMs (link's included)",
    "logic_cells": "logic cells (estimate)",
}


def fit_label(resource: str, board: Board | None = None) -> str:
    """A fit row's name as output shows it (:data:`FIT_LABELS`); with ``board`` the DSP
    blocks name their cell, e.g. ``DSP blocks (18×18 MULT18X18D)``."""
    label = FIT_LABELS.get(resource, resource)
    if resource == "multipliers" and board is not None:
        w = board.multiplier_width
        label += f" ({w}×{w} {board.dsp_cell})"
    if resource == "logic_cells" and board is not None:
        label = f"{board.cells_name} (estimate)"  # iCE40 logic cells, ECP5 LUT4s
    return label


def fit_table(fit: dict[str, dict[str, int]], board: Board | None = None) -> str:
    """Return the board fit ``{resource: {needed, available}}`` as a table: resource (with
    :func:`fit_label`), needed, available."""
    rows = [
        (fit_label(k, board), f"{v['needed']:,}", f"{v['available']:,}") for k, v in fit.items()
    ]
    return markdown_table(("resource", "needed", "available"), rows, left=("resource",))


def fit_text(board: str, fit: dict[str, dict[str, int]], onchip_samples: int = 0) -> str:
    """One line of the board fit, ``fitted to BOARD (needed/available): DSP blocks 105/156,
    …``, as ``pipetrain compile --board`` prints it (with the on-chip training set of
    ``onchip_samples`` samples counted, when there is one); the logic cells in the board's
    unit (:attr:`~pipetrain.compiler.targets.Board.cells_name`)."""
    known = BOARDS.get(board)

    def label(k: str) -> str:
        return fit_label(k, known) if k == "logic_cells" else fit_label(k)

    rows = ", ".join(f"{label(k)} {v['needed']:,}/{v['available']:,}" for k, v in fit.items())
    onchip = f", with an on-chip training set of {onchip_samples} samples" if onchip_samples else ""
    return f"fitted to {board}{onchip} (needed/available): {rows}"


def _board_lines(plan: Plan, board: Board | None, fit: dict | None) -> list[str]:
    """``report.md``'s board section: the board and its fit table; [] without a board."""
    if board is None:
        return []
    lines = [
        f"## Board: {board.name}",
        "",
        f"The plan is fitted to `{board.name}` ({board.description}; `--board {board.name}`): "
        f"its {plan.clock_hz / 1e6:g} MHz clock, constants, formats, lanes and memories, the "
        f"plan `pipetrain build --board {board.name}` puts in the bitstream.",
        "",
    ]
    if fit:
        lines += [
            f"Needed vs available (the link engine and UART included in the block RAMs and "
            f"{board.cells_name}; memory bits are the plan's own; {board.cells_name} are an "
            "estimate, docs/boards.md §3):",
            "",
            fit_table(fit, board),
            "",
        ]
    return lines


def _other_width(board: Board | None, fit: dict | None) -> str:
    """`` (this table; this board's 16×16 SB_MAC16 blocks count differently: 6, in Board
    above)`` for a board whose
    DSP blocks are not 18 × 18, else ``""``."""
    if board is None or board.multiplier_width == 18:
        return ""
    w = board.multiplier_width
    row = (fit or {}).get("multipliers")
    need = f" {row['needed']:,}" if row else ""
    return (
        f" (this table counts 18 × 18 blocks; on this board's {w} × {w} {board.dsp_cell} "
        f"blocks the design takes{need or ' its own count'}, Board above)"
    )


def _weight_operand_text(st: Stage) -> str:
    """What the MACs' rounded weight operand is (``Stage.weight_operand``, docs/numerics.md
    §3.2), with the widths: ŵ's format (``what_bits`` wide, w's fraction bits), the bits the
    rounding drops, and why the operand has one integer bit more than ŵ."""
    wo, fw = st.weight_operand, st.formats.w
    assert wo is not None
    what = QFormat(st.what_bits, fw.frac)
    kind = "w" if st.what_bits == fw.bits else "LWP's prediction of w"
    top = 1 << (wo.bits - 2)
    return (
        f"the MACs read ŵ ({kind}, {what}: {what.bits} bits) and w ({fw}) as {wo} "
        f"({wo.bits} bits): rounded half up by {st.weight_shift} bits, {wo.frac} fraction bits "
        f"kept; {wo} has one integer bit more than {what} ({wo.bits - 1 - wo.frac} vs "
        f"{what.bits - 1 - what.frac}) because rounding up the largest ŵ reaches {top:,} "
        f"(2^{wo.bits - 2}) LSBs, one past a {wo.bits - 1}-bit signed range: no clamp needed"
    )


#: What each datapath product of the Multipliers table multiplies (``build.stage_products``;
#: ``<p>`` is ``lr`` or Spike Compensation's ``sc_lr_b``; ``gin_l<t>``: one per stream t).
PRODUCT_NAMES: dict[str, str] = {
    "fwd": "the forward MAC ŵ·x",
    "gin": "the input-gradient MAC w·δ (one per stream sent back)",
    "lwp": "LWP's H·u (or H·(w − w_prev))",
    "slope_d": "the leaky-ReLU slope × the error",
    "slope_y": "the leaky-ReLU slope × the output",
    "pool_y": "the AvgPool scale × the window sum",
    "pool_d": "the AvgPool scale × the error",
    "lut_slope": "the tanh/sigmoid LUT's interpolation: the slope between two entries × the "
    "low bits of |z| below the LUT step (docs/numerics.md §3.4)",
    "deriv": "the tanh/sigmoid derivative factor from the stashed y: y·y for tanh (1 − y²), "
    "y·(1 − y) for sigmoid (docs/numerics.md §5)",
    "deriv_g": "the error g × that derivative factor (δ = g·f′)",
    "wgrad": "the convolution's weight gradient δ·x, summed over the positions",
    "momentum": "m·u",
    "lr_wd": "η·λ × w",
    "sc_a": "Spike Compensation's a·u′",
    "sc_lr_wd_b": "Spike Compensation's b·η·λ × w",
    "_delta": "the scaled error <p>·δ (e)",
    "_x": "e·x",
    "_dx": "δ·x (the constant <p> is shifts and adds)",
    "_p": "<p> × the convolution's summed gradient P",
}


def _product_legend(plan: Plan) -> str:
    """``Names: `fwd` the forward MAC ŵ·x; …``: what each product in the Multipliers table
    multiplies (:data:`PRODUCT_NAMES`), for the names this plan has, in table order."""
    seen: dict[str, str] = {}
    for st in plan.stages:
        for p in st.products or ():
            name = p.name
            base = "gin" if name.startswith("gin_l") else name
            text = PRODUCT_NAMES.get(base)
            if text is None:
                for prefix in ("sc_lr_b", "lr"):
                    suffix = name[len(prefix) :]
                    if name.startswith(prefix + "_") and suffix in PRODUCT_NAMES:
                        c = "η" if prefix == "lr" else "b·η"
                        text = PRODUCT_NAMES[suffix].replace("<p>", c)
                        break
            if text is not None and base not in seen:
                seen[base] = text
    kinds = {str(lu.kind) for lu in (plan.loss, *plan.head_losses)}
    loss = []
    if "cross_entropy" in kinds:
        loss.append("cross-entropy's exp value × the reciprocal of their sum (p = e·r)")
    if "mse" in kinds:
        loss.append("MSE's (z − t)² and 2/C × (z − t)")
    parts = [f"`{k}` {v}" for k, v in seen.items()]
    parts.append("`loss unit` " + "; ".join(loss))
    return "Names: " + "; ".join(parts) + "."


def _unsplit_text(plan: Plan) -> str:
    """The Multipliers section's words on the constant products of a plan that forms no low
    piece in logic (``Plan.logic_low_bits`` 0 / None, e.g. the iCE40's): which of them take
    more than one 18 × 18 block here, or that none does (naming m·u when it is shifts and
    adds: a constant of few signed digits, ``Plan.shift_add``)."""
    wide = [
        f"stage {st.index} `{p.name}` ({p.a_bits} × {p.b_bits}: {p.blocks})"
        for st in plan.stages
        for p in st.products or ()
        if p.blocks > 1
    ]
    head = "no low piece of a constant product is formed in logic here (`logic_low_bits` 0)"
    if wide:
        return f"{head}, so a product wider than {plan.operand_bits} bits takes more than one " + (
            "block: " + ", ".join(wide)
        )
    mu = [st for st in plan.stages if plan.shift_add(st.update.momentum.value)]
    why = (
        f"; m·u is shifts and adds (m₁ = {_const_text(plan.stages[0].update.momentum)}, "
        f"at most {plan.shift_add_max_terms} signed digits), no multiplier"
        if len(mu) == len(plan.stages)
        else ""
    )
    return f"{head}, and no product of this plan is wider than one block{why}"


def _low_bits_used(plan: Plan) -> str:
    """``6 used here`` (or ``6 and 8 used here``, ``none used here``): the low bits the plan's
    constant products actually form in logic (:func:`~pipetrain.compiler.build.logic_pieces`,
    their operand's width beyond ``Plan.operand_bits``), next to the limit
    ``Plan.logic_low_bits``."""
    used = sorted(
        {
            lo
            for st in plan.stages
            for _, lo, _ in logic_pieces(
                st, plan.operand_bits, plan.logic_low_bits, plan.momentum_in_logic
            )
        }
    )
    if not used:
        return "none used here"
    words = ", ".join(map(str, used[:-1])) + (" and " if len(used) > 1 else "") + str(used[-1])
    return f"{words} used here"


def _operand_lines(plan: Plan) -> list[str]:
    """One line per stage with a rounded multiplier operand (docs/numerics.md §3.2, §5.3)."""
    out = []
    for st in plan.stages:
        parts = []
        if st.weight_operand is not None:
            parts.append(_weight_operand_text(st))
        shared = any(p.per_stage for p in st.products or ())
        where = (
            "once per error as it is written, one multiplier for the stage"
            if shared
            else ("in every lane")
        )
        for name, fe in (("lr·δ", st.update.lr_delta), ("b·lr·δ", st.update.sc_lr_b_delta)):
            if fe is not None:
                parts.append(
                    f"the scaled error {name} as {fe} (`lr_delta`, {where}; then `lr_x` = e·x)"
                )
        for name, lo, _ in logic_pieces(
            st, plan.operand_bits, plan.logic_low_bits, plan.momentum_in_logic
        ):
            parts.append(
                f"`{name}` takes the top {plan.operand_bits} bits of its variable operand, the "
                f"constant × the low {lo} bits is a select-add in logic ({lo} of the up to "
                f"{plan.logic_low_bits} `logic_low_bits` allows)"
            )
        if parts:
            out.append(f"- stage {st.index}: " + "; ".join(parts))
    return out


def format_table(plan: Plan) -> str:
    """Return every stage tensor's format, its largest value and the calibrated max|value|
    (with the ratio format max / observed, the headroom; '–' where not calibrated)."""
    headers = ("stage", "tensor", "format", "bits", "format max", "observed max", "headroom")
    rows = []
    for st in plan.stages:
        for t in _TENSORS:
            f = getattr(st.formats, t)
            if f is None:
                continue
            seen = st.calibrated.get(t)
            rows.append(
                (
                    st.index,
                    t,
                    str(f),
                    f.bits,
                    f"{f.max_value:.10g}",
                    "–" if seen is None else f"{seen:.6g}",
                    "–" if not seen else f"{f.max_value / seen:.2f}",
                )
            )
    return markdown_table(headers, rows)


def _streams_text(st: Stage) -> str:
    """``; back-propagates L2 (pass-through, delay 3), L3 (delay 7)``: the stage's backward
    streams with their delays (``Stage.streams``; the stage's own delay when the plan lists
    none, ``global``), empty without any."""
    if not st.grad_losses:
        return ""
    listed = getattr(st, "streams", None)  # absent in global plans
    delays = dict(listed) if listed is not None else {}
    parts = []
    for t in st.grad_losses:
        kind = "" if t in st.losses else "pass-through, "
        parts.append(f"L{t} ({kind}delay {delays.get(t, st.delay)})")
    return f"; back-propagates {', '.join(parts)}"


def _const_text(c: Const) -> str:
    """``0.001953125 (2^-9)`` / ``0.90625 (29/2^5)``: a plan constant's value as the hardware
    uses it (``Const.quantised``), with its integer over a power of two (reduced)."""
    v, f = c.value, c.frac
    while v and v % 2 == 0 and f > 0:
        v, f = v // 2, f - 1
    exact = f"{v}" if f == 0 else (f"2^-{f}" if v == 1 else f"{v}/2^{f}")
    return f"{c.quantised:.10g} ({exact})"


def _constants_text(plan: Plan) -> str:
    """``; as built (5 significant bits): η₁ = 0.001953125 (2^-9), m₁ = 0.90625 (29/2^5)``: the
    update constants the plan's stages use (``UpdateConstants``: the same η₁, m₁ and η₁·λ in
    every stage; ``Plan.const_bits`` significant bits), which the requested values only
    approximate."""
    up = plan.stages[0].update
    parts = [f"η₁ = {_const_text(up.lr)}", f"m₁ = {_const_text(up.momentum)}"]
    if up.lr_wd.value:
        parts.append(f"η₁·λ = {_const_text(up.lr_wd)}")
    same = all(c.quantised == c.real for c in (up.lr, up.momentum, up.lr_wd))
    return (
        f"; as built ({plan.const_bits}-bit constants"
        + (", exactly the requested ones" if same else "")
        + "): "
        + ", ".join(parts)
    )


def render_report(
    plan: Plan,
    warnings: Sequence[str] = (),
    notes: Sequence[str] = (),
    formats_source: str = "",
    board: Board | None = None,
    fit: dict[str, dict[str, int]] | None = None,
) -> str:
    """Return ``report.md``: settings, the board and its fit (``board``: the board the plan
    was fitted to, ``fit``: its :func:`~pipetrain.compiler.fit.check_fit` rows; both None when
    not fitted), stage table, totals, loss units, formats, notes, warnings and each stage's
    delay derivation."""
    t = plan.train
    lines = [
        f"# pipetrain plan: {plan.name}",
        "",
        f"- schedule `{plan.schedule}`, mitigation `{plan.mitigation}`"
        + (f" (LWP form `{plan.lwp_form}`)" if "lwp" in plan.mitigation else "")
        + f", strategy `{plan.strategy}`"
        + (
            f" (distance {plan.distance}, rule `{plan.rule}`, blocks end after "
            f"{', '.join(str(b) for b in t.get('blocks', []))})"
            if plan.strategy != "global"
            else ""
        ),
        f"- η = {t['lr']}, m = {t['momentum']}, λ = {t['weight_decay']} at batch "
        f"{t['batch_ref']} → batch 1: η₁ = {t['lr1']:.6g}, m₁ = {t['momentum1']:.6g}"
        + _constants_text(plan),
        f"- loss `{plan.loss.kind}` over {plan.loss.classes} classes; rounding "
        f"`{plan.rounding}`; formats: {formats_source or 'given'}"
        + (
            " — not calibrated (no data given); `--data FILE.npz` calibrates them (see Notes)"
            if formats_source.startswith("static")
            else ""
        ),
        f"- input: {plan.in_features} features"
        + (
            f" (one {_dims(*plan.input_shape)} sample, streamed flat in C order)"
            if len(plan.input_shape) > 1
            else ""
        ),
        f"- board: `{board.name}` (fitted; see Board below)"
        if board is not None
        else "- board: none (not fitted to a board; `--board NAME` fits it)",
        "",
        *_board_lines(plan, board, fit),
        "## Stages",
        "",
        stage_table(plan),
        "",
        stage_legend(),
        "",
        *(
            ["## Convolutions (docs/numerics.md §9)", "", conv_table(plan), ""]
            if any(st.conv is not None for st in plan.stages)
            else []
        ),
        "```",
        totals_text(plan, board),
        "```",
        "",
        "## Delays",
        "",
    ]
    for st in plan.stages:
        lines.append(
            f"- stage {st.index} ({_layer(st)}): D = {st.delay} — {st.delay_derivation}; "
            f"updated by loss {', '.join(f'L{k}' for k in st.losses)}"
            + _streams_text(st)
            + (
                f"; sends input gradient of {', '.join(f'L{k}' for k in st.gin_losses)}"
                if st.gin_losses
                else "; no input gradient"
            )
        )
    lines += ["", f"## Memories ({memory_table_title(plan)})", "", memory_table(plan)]
    if any(st.products for st in plan.stages):
        lines += [
            "",
            "## Multipliers and their DSP blocks (docs/numerics.md §3.2, §5.3)",
            "",
            "Multipliers: the datapath's products as the HDL builds them; DSP blocks: the 18 × "
            "18 hard blocks (ECP5 MULT18X18D) each takes" + _other_width(board, fit) + ".",
            "",
        ]
        if plan.operand_bits:
            lb = plan.logic_low_bits or 0
            wide = (
                f"a constant × one of them up to {lb} bits wider gives its top "
                f"{plan.operand_bits} bits to the block and forms the constant × the low bits "
                f"in logic (a select-add of up to {lb} low bits, `logic_low_bits` = {lb}; "
                f"{_low_bits_used(plan)}; the same integers), so m·u takes one block for a u "
                f"of up to {plan.operand_bits + lb} bits"
                if lb
                else _unsplit_text(plan)
            )
            if plan.momentum_in_logic:
                wide += (
                    "; here m·u takes no block at all: `momentum_in_logic`, shifts and adders "
                    "over the momentum's signed digits (the board fit chose it: the DSP blocks "
                    "bound the lanes; docs/architecture.md §3)"
                )
            if board is not None and board.multiplier_width != 18:
                w = board.multiplier_width
                row = (fit or {}).get("multipliers")
                on = f"{row['needed']:,} {w} × {w} {board.dsp_cell}" if row else "Board above"
                total = f"The total includes the loss units ({board.name}'s blocks: {on})."
            else:
                total = (
                    "The total includes the loss units: it is the board fit's DSP block count "
                    "on an 18 × 18 board."
                )
            lines += [
                f"Variable operands are at most {plan.operand_bits} bits (one 18 × 18 block per "
                f"multiplier in this table); master weights and velocities keep their width: "
                f"{wide}. {total}",
                "",
                *(ops := _operand_lines(plan)),
                *([""] if ops else []),
            ]
        lines += [multiplier_table(plan), "", _product_legend(plan)]
    lines += ["", "## Formats", "", format_table(plan), ""]
    lu_rows = [
        (name, lu.kind, lu.classes, str(lu.z), str(lu.d), *_loss_parallelism(lu), lu.cycles)
        for name, lu in [(f"L{len(plan.head_losses) + 1} (main)", plan.loss)]
        + [(f"L{k} (head {k})", lu) for k, lu in enumerate(plan.head_losses, start=1)]
    ]
    headers = ("loss", "kind", "classes", "logits", "error", "P", "k", "Q", "cycles")
    lines += [
        "## Loss units",
        "",
        markdown_table(headers, lu_rows),
        "",
        "P: logits through the exp LUT per cycle (`exp_lanes`), k: quotient bits of the "
        "reciprocal per cycle (`div_bits`), Q: errors formed and written per cycle "
        "(`out_lanes`, only where one a cycle would set the tick: each costs two DSP blocks) — "
        "the cross-entropy unit's parallelism, chosen to fit the slack the tick leaves it; they "
        "change its cycles and size, never a result (compiler/loss_unit.py; MSE has none: –).",
        "",
    ]
    if notes:
        lines += ["## Notes", "", *(f"- {n}" for n in notes), ""]
    if warnings:
        lines += ["## Warnings", "", *(f"- {w}" for w in warnings), ""]
    return "\n".join(lines)


def _loss_parallelism(lu: LossUnit) -> tuple[Any, Any, Any]:
    """``(P, k, Q)`` of a cross-entropy loss unit (``exp_lanes``, ``div_bits``, ``out_lanes``);
    ``("–", "–", "–")`` for MSE, which has one phase and uses none."""
    if str(lu.kind) == "mse":
        return "–", "–", "–"
    return lu.exp_lanes, lu.div_bits, lu.errors_per_write


def plan_summary(plan: Plan) -> dict[str, Any]:
    """Return the JSON result of ``pipetrain compile``: plan hash, per-stage numbers, totals.

    Keys: ``plan_hash``, ``name``, ``stages`` (``index``, ``name``, ``role``, ``block``,
    ``in_features``, ``out_features``, ``delay``, ``stash_depth``, ``lanes``,
    ``cycles_per_tick`` (slots), ``pass_cycles``, ``memory_bits``, ``memory_blocks``,
    ``multipliers``, ``formats``
    (tensor → ``Qi.f`` string, null where the stage has none); a convolution stage adds
    ``conv``, its :class:`~pipetrain.compiler.conv.ConvGeometry` as a dict),
    ``tick_cycles``, ``ideal_cycles_per_sample``, ``samples_per_s``, ``memory_bits``,
    ``memory_blocks``, ``multipliers`` (the stages'), ``loss_multipliers`` (the loss units';
    the stage table's mults total is their sum), ``schedule``, ``strategy``, ``memories``
    (every memory as the HDL builds it: ``owner``, ``name``, ``kind``, ``banks``, ``words``,
    ``width``, ``read_ports``, ``write_ports``, ``blocks``, ``bits``;
    :meth:`Plan.all_memories`).
    """
    return {
        "plan_hash": plan.hash,
        "name": plan.name,
        "schedule": plan.schedule,
        "strategy": plan.strategy,
        "stages": [
            {
                "index": st.index,
                "name": st.name,
                "role": st.role,
                "block": st.block,
                "in_features": st.in_features,
                "out_features": st.out_features,
                "delay": st.delay,
                "stash_depth": st.stash_depth,
                "lanes": st.lanes,
                **({} if st.col_lanes is None else {"col_lanes": st.col_lanes}),
                "cycles_per_tick": st.cycles_per_tick,
                "pass_cycles": st.pass_cycles,
                "memory_bits": st.memory_bits,
                "memory_blocks": st.memory_blocks,
                "multipliers": st.multipliers,
                **({} if st.conv is None else {"conv": dataclasses.asdict(st.conv)}),
                "formats": {
                    t: None if getattr(st.formats, t) is None else str(getattr(st.formats, t))
                    for t in _TENSORS
                },
            }
            for st in plan.stages
        ],
        "tick_cycles": plan.tick_cycles,
        "ideal_cycles_per_sample": plan.ideal_cycles_per_sample,
        "samples_per_s": plan.samples_per_s,
        "memory_bits": plan.memory_bits,
        "memory_blocks": plan.memory_blocks,
        "multipliers": plan.multipliers,
        "loss_multipliers": sum(loss_multipliers(lu) for _, lu in loss_units(plan)),
        "memories": [
            {
                "owner": owner,
                "name": m.name,
                "kind": m.kind,
                "banks": m.banks,
                "words": m.words,
                "width": m.width,
                "read_ports": m.read_ports,
                "write_ports": m.write_ports,
                "blocks": m.blocks,
                "bits": m.bits,
            }
            for owner, m in plan.all_memories()
        ],
    }
