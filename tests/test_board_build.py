"""Real bitstream builds (Yosys → nextpnr → pack) of the UART loopback design, one per family.

Needs ``pip install 'pipetrain[boards]'`` (skipped otherwise). Builds are cached in
``build/test-board-build/<board>`` (reused while the generated design and tools are unchanged):
a warm run takes < 1 s per board, a fresh build ≈ 10 s per board, and the very first YoWASP run
adds 1–2.5 min per tool to compile WebAssembly. Each build is time-boxed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from pipetrain.compiler.targets import BOARDS
from pipetrain.hdl.board import BoardTop, Loopback
from pipetrain.host import toolchain
from pipetrain.host.bitstream import CLOCK_MARGIN, build_board, build_design

ROOT = Path(__file__).resolve().parents[1]
#: Cold YoWASP compile (≈ 2.5 min × 3 tools) + build, with margin.
BUILD_TIMEOUT_S = 900


def _tools_or_skip(family: str) -> None:
    if importlib.util.find_spec("amaranth_boards") is None:
        pytest.skip("amaranth-boards not installed (pip install 'pipetrain[boards]')")
    try:
        toolchain.configure(family, {})
    except toolchain.ToolchainError as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("name", ["icebreaker", "ulx3s-85f"])
def test_loopback_bitstream_builds(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    board = BOARDS[name]
    _tools_or_skip(board.family)
    monkeypatch.chdir(ROOT)  # YoWASP cannot see /tmp: build under the repo's build/
    out = Path("build") / "test-board-build" / name
    r = build_design(board, BoardTop(board, Loopback), out, timeout_s=BUILD_TIMEOUT_S)
    bitstream = ROOT / r["bitstream"]
    assert bitstream.suffix == f".{board.bitstream_ext}" and bitstream.stat().st_size > 0
    # ECP5 .bit (compressed) starts with the Lattice preamble comment block 0xFF 0x00;
    # iCE40 .bin with the 0x7EAA997E sync word after 0xFF padding.
    head = bitstream.read_bytes()[:64]
    if board.family == "ice40":
        assert b"\x7e\xaa\x99\x7e" in head
    else:
        assert head[:2] == b"\xff\x00"
    # The loopback meets the board's network clock (the PLL's: 24 MHz iCE40, 50 MHz ECP5)
    # with the margin the build asks of every design (CLOCK_MARGIN; measured with the PLL at
    # the 16.875 MHz iCE40 clock before: 19.1 MHz = 1.13×, not yet at 24 MHz; before the PLL,
    # at the 12 MHz oscillator, ≈ 27 MHz) and uses a few hundred LUTs, no multipliers.
    assert r["clock_mhz"] == pytest.approx(board.clock_hz / 1e6, rel=1e-3)
    assert r["timing_met"] and r["fmax_mhz"] >= (1 + CLOCK_MARGIN) * r["clock_mhz"]
    u = r["utilization"]
    assert 100 < u["luts"]["used"] < 1000 and u["luts"]["available"] == board.luts
    assert 30 < u["ffs"]["used"] < 1000
    assert u["multipliers"] == {"used": 0, "available": board.multipliers}
    assert u["bram_blocks"]["available"] == board.bram_blocks
    log = (out / "build.log").read_text()  # the tools' own logs, also for a reused build
    assert "==== Yosys (synthesis): top.rpt ====" in log and " cells\n" in log
    assert "==== nextpnr (place and route, timing): top.tim ====" in log
    assert "Max frequency for clock" in log


def _top(board, plan, clock_hz: float) -> BoardTop:  # noqa: ANN001
    from pipetrain.hdl.board import network_core

    return BoardTop(board, lambda: network_core(plan, clock_hz=clock_hz), clock_hz=clock_hz)


def _assert_clock(board, r: dict) -> None:  # noqa: ANN001
    """The network clock the build chose is nextpnr's constraint, at most the board's, and
    meets timing with the margin (docs/boards.md §2.1)."""
    ck = r["clock"]
    assert r["clock_mhz"] == pytest.approx(ck["chosen_mhz"], rel=1e-3) and r["timing_met"]
    assert ck["chosen_mhz"] <= board.clock_hz / 1e6 and ck["target_mhz"] == board.clock_hz / 1e6
    assert ck["met"] and r["fmax_mhz"] >= (1 + CLOCK_MARGIN) * ck["chosen_mhz"]
    assert r["uart_divisor"] == round(ck["chosen_mhz"] * 1e6 / board.baud)


@pytest.mark.slow
def test_mlp_digits_bitstream_on_ulx3s(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole training design (UART ↔ LinkEngine ↔ NetworkTop) for mlp-digits on the ECP5.

    Measured (yowasp 0.70 / nextpnr 0.11, 2 cores): 4–8 min fresh, ≈ 10 s cached; Fmax
    49–56 MHz at the 25 MHz board clock, 8.6–10 k LUT4, 4.1–5.2 k FF, 38 MULT18X18D,
    22–24 DP16KD.
    """
    from pipetrain.compiler.fit import check_fit
    from pipetrain.host.flow import compile_design

    board = BOARDS["ulx3s-85f"]
    _tools_or_skip(board.family)
    monkeypatch.chdir(ROOT)
    plan = compile_design("mlp-digits", board=board).plan
    check_fit(plan, board)
    out = Path("build") / "test-board-build" / "mlp-digits-ulx3s-85f"
    r = build_board(board, lambda f: _top(board, plan, f), out, timeout_s=1800)
    assert (ROOT / r["bitstream"]).stat().st_size > 100_000
    _assert_clock(board, r)
    u = r["utilization"]
    # every hard multiplier the plan counts maps to ≥ 1 MULT18X18D (wider ones to several)
    assert plan.multipliers <= u["multipliers"]["used"] <= board.multipliers
    assert 0 < u["bram_blocks"]["used"] <= board.bram_blocks
    assert 1000 < u["luts"]["used"] < board.luts // 2


@pytest.mark.slow
def test_mlp_digits_bitstream_on_icebreaker(monkeypatch: pytest.MonkeyPatch) -> None:
    """mlp-digits fitted to the iCE40UP5K (one lane per stage, weights in SPRAM, 16-bit
    weights, 12-bit activations, 5-bit constants) places, routes and meets timing, with the
    margin, at the network clock the build chose (≤ 24 MHz, from the PLL).

    Measured (yowasp 0.70 / nextpnr 0.11, 2 cores): ≈ 3.3 min fresh; Fmax 16.5–17.6 MHz,
    5,213–5,268 of 5,280 logic cells, 6 SB_MAC16, 21 EBR, 4 SPRAM.
    """
    from pipetrain.compiler.fit import check_fit
    from pipetrain.host.flow import compile_design

    board = BOARDS["icebreaker"]
    _tools_or_skip(board.family)
    monkeypatch.chdir(ROOT)
    plan = compile_design("mlp-digits", board=board).plan
    fit = check_fit(plan, board)
    out = Path("build") / "test-board-build" / "mlp-digits-icebreaker"
    r = build_board(board, lambda f: _top(board, plan, f), out, timeout_s=1800)
    head = (ROOT / r["bitstream"]).read_bytes()[:64]
    assert b"\x7e\xaa\x99\x7e" in head
    _assert_clock(board, r)
    u = r["utilization"]
    # the plan check counts exactly the SB_MAC16s and SPRAMs Yosys/nextpnr place
    assert u["multipliers"]["used"] == fit["multipliers"]["needed"] <= board.multipliers
    assert u["spram_blocks"] == {"used": fit["spram"]["needed"], "available": 4}
    assert 0 < u["bram_blocks"]["used"] <= board.bram_blocks
    # the whole training design, not the loopback alone (< 1,000 LCs)
    assert 4_000 < u["luts"]["used"] <= u["luts"]["available"] == board.luts
