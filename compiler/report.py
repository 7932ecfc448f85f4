"""Human- and machine-readable summaries of a :class:`~pipetrain.compiler.plan.Plan`.

* :func:`stage_table` — the per-stage table ``pipetrain compile`` prints (aligned Markdown);
* :func:`conv_table` — the convolution stages' geometry, lanes, cycles and memories;
* :func:`format_table` — every tensor's format against its calibrated range;
* :func:`fit_table` / :func:`fit_text` — a board fit's needed / available resources;
* :func:`render_report` — ``report.md``: the board fit, both tables, totals, loss units, notes
  and warnings;
* :func:`plan_summary` — the JSON result of ``pipetrain compile --json``.

Every number is read from the plan or the fit (nothing is recomputed here).

Names: *multipliers* are the datapath's products (what the HDL builds, ``Stage.products``;
``Stage.multipliers`` = lanes × their count, ``Plan.multipliers`` the stages' sum, each counted
once; the loss units' are listed in the Multipliers table); *DSP blocks* are the board's hard
multipliers (18 × 18 MULT18X18D, 16 × 16 SB_MAC16) that they take. The JSON keys stay
``multipliers``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .build import RAM_FAMILIES, logic_pieces, loss_operands, multiplier_blocks
from .plan import Plan, QFormat, Stage
from .targets import Board

__all__ = [
    "markdown_table",
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
    if text in ("", "–", "total"):
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


def stage_table(plan: Plan) -> str:
    """Return the per-stage table: layer, shape, delay D_s, stash depth, lanes, cycles per
    tick, memory (bits and block RAMs of the plan's RAM family, from ``Stage.memories`` as the
    HDL builds them), multipliers and the x/y/d/w/u formats."""
    headers = (
        "stage", "layer", "shape", "act", "D_s", "stash", "lanes", "cycles/tick",
        "memory bits", block_name(plan), "mults", "x", "y", "d", "gin", "w", "u",
    )  # fmt: skip
    rows = []
    for st in plan.stages:
        f = st.formats
        rows.append(
            (
                st.index,
                _layer(st),
                stage_shape(st),
                st.activation,
                st.delay,
                st.stash_depth,
                st.lanes,
                st.cycles_per_tick,
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
    rows.append(
        (
            "total", "", "", "", "", "", sum(s.lanes for s in plan.stages), "",
            plan.memory_bits, plan.memory_blocks, plan.multipliers, "", "", "", "", "", "",
        )
    )  # fmt: skip
    return markdown_table(headers, rows, left=("layer",))


def totals_text(plan: Plan) -> str:
    """Return the tick, throughput and memory totals as a few lines of text."""
    slowest = max(plan.stages, key=lambda s: s.pass_cycles)
    losses = [plan.loss, *plan.head_losses]
    loss_cycles = max(lu.cycles for lu in losses)
    last = plan.main_stages[-1]
    stage_bits = sum(s.memory_bits for s in plan.stages)
    lines = [
        f"tick: {plan.tick_cycles} cycles, the longer of the slowest stage's pass "
        f"(stage {slowest.index}: {slowest.cycles_per_tick} slots, {slowest.pass_cycles} cycles) "
        f"and the last stage's pass followed by the loss unit ({last.pass_cycles} + "
        f"{loss_cycles} cycles), plus tick control",
        f"ideal cycles per sample: {plan.ideal_cycles_per_sample} ({plan.schedule}); "
        f"{plan.samples_per_s:,.0f} samples/s at {plan.clock_hz / 1e6:g} MHz",
        f"memory: {plan.memory_bits:,} bits ({plan.memory_bits / 1024:.1f} Kib) as built — "
        f"stages {stage_bits:,}, loss units and result FIFO {plan.memory_bits - stage_bits:,} — "
        f"in {plan.memory_blocks} {_block_kib(plan)} Kib block RAMs"
        + _spram_text(plan)
        + (f" (budget {plan.memory_budget_bits:,} bits)" if plan.memory_budget_bits else ""),
        f"multipliers: {plan.multipliers}; lanes: " + ",".join(str(s.lanes) for s in plan.stages),
        *_lut_lines(plan),
        f"plan hash: {plan.hash}",
    ]
    return "\n".join(lines)


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
        for n in [1 if p.per_stage else st.lanes]
    ]
    for name, lu in [("loss", plan.loss)] + [
        (f"L{k}", lu) for k, lu in enumerate(plan.head_losses, start=1)
    ]:
        for a, b in loss_operands(lu):
            blocks = multiplier_blocks(a, b)
            rows.append((name, "loss unit", f"{a} × {b}", blocks, 1, blocks))
    rows.append(("total", "", "", "", "", sum(r[5] for r in rows)))
    headers = ("stage", "multiplier", "operand bits", "DSP blocks/lane", "lanes", "DSP blocks")
    return markdown_table(headers, rows, left=("multiplier",))


#: How the rows of a board fit (:func:`~pipetrain.compiler.fit.check_fit`) read in output: the
#: datapath's multipliers take the board's DSP blocks (row key ``multipliers``), and the
#: stage memories are mapped onto the board's own block RAMs.
FIT_LABELS = {
    "multipliers": "DSP blocks",
    "spram": "SPRAM",
    "memory_bits": "memory bits",
    "memory_block_bits": "block-RAM bits as mapped",
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
    ``onchip_samples`` samples counted, when there is one)."""
    rows = ", ".join(f"{fit_label(k)} {v['needed']:,}/{v['available']:,}" for k, v in fit.items())
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
            "Needed vs available (the link engine and UART included; logic cells are an "
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
    need = f": {row['needed']:,}" if row else ""
    return (
        f" (this table; this board's {w}×{w} {board.dsp_cell} blocks count differently{need}, "
        "in Board above)"
    )


def _operand_lines(plan: Plan) -> list[str]:
    """One line per stage with a rounded multiplier operand (docs/numerics.md §3.2, §5.3)."""
    out = []
    for st in plan.stages:
        parts = []
        if st.weight_operand is not None:
            parts.append(
                f"the MACs read ŵ and w as {st.weight_operand} (ŵ: w, or LWP's prediction; "
                f"rhu by {st.weight_shift} bits, round half up, one integer bit more than ŵ)"
            )
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
        for name, lo, _ in logic_pieces(st, plan.operand_bits, plan.logic_low_bits):
            parts.append(
                f"`{name}` takes the top {plan.operand_bits} bits of its variable operand, the "
                f"constant × the low {lo} bits is a select-add in logic"
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
        f"{t['batch_ref']} → batch 1: η₁ = {t['lr1']:.6g}, m₁ = {t['momentum1']:.6g}",
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
        *(
            ["## Convolutions (docs/numerics.md §9)", "", conv_table(plan), ""]
            if any(st.conv is not None for st in plan.stages)
            else []
        ),
        "```",
        totals_text(plan),
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
                f"in logic (a select-add, `logic_low_bits` = {lb}; the same integers), so m·u "
                f"takes one block for a u of up to {plan.operand_bits + lb} bits"
                if lb
                else "so m·u may take two"
            )
            lines += [
                f"Variable operands are at most {plan.operand_bits} bits (one 18 × 18 block per "
                f"multiplier); master weights and velocities keep their width: {wide}. The "
                "total includes the loss units: it is the board fit's DSP block count on an "
                "18 × 18 board.",
                "",
                *(ops := _operand_lines(plan)),
                *([""] if ops else []),
            ]
        lines += [multiplier_table(plan)]
    lines += ["", "## Formats", "", format_table(plan), ""]
    lu_rows = [
        (name, lu.kind, lu.classes, str(lu.z), str(lu.d), lu.cycles)
        for name, lu in [(f"L{len(plan.head_losses) + 1} (main)", plan.loss)]
        + [(f"L{k} (head {k})", lu) for k, lu in enumerate(plan.head_losses, start=1)]
    ]
    lines += [
        "## Loss units",
        "",
        markdown_table(("loss", "kind", "classes", "logits", "error", "cycles"), lu_rows),
        "",
    ]
    if notes:
        lines += ["## Notes", "", *(f"- {n}" for n in notes), ""]
    if warnings:
        lines += ["## Warnings", "", *(f"- {w}" for w in warnings), ""]
    return "\n".join(lines)


def plan_summary(plan: Plan) -> dict[str, Any]:
    """Return the JSON result of ``pipetrain compile``: plan hash, per-stage numbers, totals.

    Keys: ``plan_hash``, ``name``, ``stages`` (``index``, ``name``, ``role``, ``block``,
    ``in_features``, ``out_features``, ``delay``, ``stash_depth``, ``lanes``,
    ``cycles_per_tick``, ``memory_bits``, ``memory_blocks``, ``multipliers``, ``formats``
    (tensor → ``Qi.f`` string, null where the stage has none); a convolution stage adds
    ``conv``, its :class:`~pipetrain.compiler.conv.ConvGeometry` as a dict),
    ``tick_cycles``, ``ideal_cycles_per_sample``, ``samples_per_s``, ``memory_bits``,
    ``memory_blocks``, ``multipliers``, ``schedule``, ``strategy``, ``memories`` (every memory
    as the HDL builds it: ``owner``, ``name``, ``kind``, ``banks``, ``words``, ``width``,
    ``read_ports``, ``write_ports``, ``blocks``, ``bits``; :meth:`Plan.all_memories`).
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
                "cycles_per_tick": st.cycles_per_tick,
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
