"""The board PLLs: divider search, the board top's clock domain, the build's clock choice."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from pipetrain.compiler.targets import BOARDS, BoardError
from pipetrain.hdl.board import BoardTop, Loopback, NetworkCore
from pipetrain.hdl.pll import pick_pll, pll_settings
from pipetrain.host import bitstream


def _ice40_out(ref: float, dv: dict) -> tuple[float, float, float]:
    pfd = ref / (dv["DIVR"] + 1)
    vco = pfd * (dv["DIVF"] + 1)
    return pfd, vco, vco / 2 ** dv["DIVQ"]


def _ecp5_out(ref: float, dv: dict) -> tuple[float, float, float]:
    pfd = ref / dv["CLKI_DIV"]
    out = pfd * dv["CLKFB_DIV"]
    return pfd, out * dv["CLKOP_DIV"], out


@pytest.mark.parametrize("ref", [12e6, 25e6, 48e6, 100e6])
def test_every_ice40_setting_is_inside_the_lattice_ranges(ref: float) -> None:
    """iCE40 (FPGA-TN-02052, simple feedback): PFD 10–133, VCO 533–1066, out 16–275 MHz, the
    dividers in their fields; the output recomputed from the dividers is the one recorded."""
    settings = pll_settings("ice40", ref)
    assert settings and [s.out_hz for s in settings] == sorted(
        (s.out_hz for s in settings), reverse=True
    )
    for s in settings:
        pfd, vco, out = _ice40_out(ref, s.dividers)
        assert (pfd, vco, out) == pytest.approx((s.pfd_hz, s.vco_hz, s.out_hz))
        assert 10e6 <= pfd <= 133e6 and 533e6 <= vco <= 1066e6 and 16e6 <= out <= 275e6
        dv = s.dividers
        assert 0 <= dv["DIVR"] <= 15 and 0 <= dv["DIVF"] <= 127 and 1 <= dv["DIVQ"] <= 6
        assert 1 <= dv["FILTER_RANGE"] <= 6


@pytest.mark.parametrize("ref", [12e6, 25e6, 100e6])
def test_every_ecp5_setting_is_inside_the_lattice_ranges(ref: float) -> None:
    """ECP5 (TN1263, CLKOP feedback): PFD 3.125–400, out 3.125–400, VCO 400–800 MHz, every
    divider 1..128; CLKOP_CPHASE as ecppll writes it."""
    for s in pll_settings("ecp5", ref):
        pfd, vco, out = _ecp5_out(ref, s.dividers)
        assert (pfd, vco, out) == pytest.approx((s.pfd_hz, s.vco_hz, s.out_hz))
        assert 3.125e6 <= pfd <= 400e6 and 3.125e6 <= out <= 400e6 and 400e6 <= vco <= 800e6
        dv = s.dividers
        assert all(1 <= dv[k] <= 128 for k in ("CLKI_DIV", "CLKFB_DIV", "CLKOP_DIV"))
        assert dv["CLKOP_CPHASE"] == (dv["CLKOP_DIV"] - 1) // 2


@pytest.mark.parametrize(
    ("ref", "target", "want"),
    [
        # icestorm's icepll gives the same settings for these (simple feedback)
        (12e6, 48e6, {"DIVR": 0, "DIVF": 63, "DIVQ": 4, "FILTER_RANGE": 1}),
        (12e6, 42e6, {"DIVR": 0, "DIVF": 55, "DIVQ": 4, "FILTER_RANGE": 1}),
        (96e6, 16e6, {"DIVR": 2, "DIVF": 31, "DIVQ": 6, "FILTER_RANGE": 3}),
        (48e6, 16e6, {"DIVR": 2, "DIVF": 63, "DIVQ": 6, "FILTER_RANGE": 1}),
        # the iCEBreaker's network clock: 12 MHz × 64 / 32 (VCO 768 MHz)
        (12e6, 24e6, {"DIVR": 0, "DIVF": 63, "DIVQ": 5, "FILTER_RANGE": 1}),
        # its network clock before (12 MHz × 45 / 32, VCO 540 MHz)
        (12e6, 16.875e6, {"DIVR": 0, "DIVF": 44, "DIVQ": 5, "FILTER_RANGE": 1}),
    ],
)
def test_ice40_exact_targets(ref: float, target: float, want: dict) -> None:
    s = pick_pll("ice40", ref, target)
    assert s.out_hz == pytest.approx(target, abs=1e-3) and s.dividers == want


def test_icebreaker_network_clock_is_exact_at_1_mbaud() -> None:
    """24 MHz = 12 MHz × 64 / 32 with the UART at 1 Mbaud (divisor 24, no rate error): PFD 12
    MHz (DIVR 0), VCO 768 MHz (DIVF 63), ÷ 2^5 (DIVQ 5)."""
    s = pick_pll("ice40", 12e6, 24e6, 1_000_000)
    assert (s.out_hz, s.pfd_hz, s.vco_hz) == (24e6, 12e6, 768e6)
    assert s.dividers == {"DIVR": 0, "DIVF": 63, "DIVQ": 5, "FILTER_RANGE": 1}


@pytest.mark.parametrize(
    ("family", "ref", "target"),
    [
        ("ice40", 12e6, 17.9e6 / 1.03),
        ("ice40", 12e6, 24e6),
        ("ice40", 12e6, 100e6),
        ("ecp5", 25e6, 50e6),
        ("ecp5", 25e6, 56.1e6 / 1.03),
        ("ecp5", 25e6, 90e6),
        ("ecp5", 25e6, 133.3e6),
    ],
)
def test_pick_is_the_fastest_at_or_below_the_limit(family: str, ref: float, target: float) -> None:
    """The chosen clock never exceeds the limit, no legal setting lies between it and the
    limit, and it is within 2.5 % below it (the output grids of these references are finer:
    iCE40 from 12 MHz steps by ≤ 0.375 MHz above 16 MHz, ECP5 from 25 MHz by ≤ 1.6 %)."""
    s = pick_pll(family, ref, target)
    assert s.out_hz <= target
    assert not [o for o in pll_settings(family, ref) if s.out_hz < o.out_hz <= target]
    assert s.out_hz >= 0.975 * target


def test_pick_skips_clocks_the_uart_cannot_use() -> None:
    """16.5 MHz is 3 % off a 1 Mbaud divisor (16 or 17 cycles per bit, the UART allows 2 %):
    the next one down, 16.3125 MHz (divisor 16, 1.95 %), is chosen. Below the iCEBreaker's
    24 MHz, 22.5 MHz is 2.27 % / 2.17 % off (divisor 22 / 23): 22.125 MHz (divisor 22, 0.57 %)."""
    assert pick_pll("ice40", 12e6, 16.6e6).out_hz == 16.5e6
    assert pick_pll("ice40", 12e6, 16.6e6, 1_000_000).out_hz == 16.3125e6
    assert pick_pll("ice40", 12e6, 22.6e6).out_hz == 22.5e6
    assert pick_pll("ice40", 12e6, 22.6e6, 1_000_000).out_hz == 22.125e6


def test_below_the_pll_range_is_a_board_error() -> None:
    with pytest.raises(BoardError, match=r"slowest is 16\.125 MHz\): run on the oscillator"):
        pick_pll("ice40", 12e6, 15e6)
    with pytest.raises(BoardError, match="no PLL model for FPGA family 'gowin'"):
        pick_pll("gowin", 27e6, 50e6)


def test_board_network_clocks_are_pll_exact() -> None:
    """Each board's network clock (the plans' clock) is one its PLL makes exactly, with the
    UART at the board's baud rate in tolerance."""
    for board in BOARDS.values():
        s = pick_pll(board.family, board.osc_hz, board.clock_hz, board.baud)
        assert s.out_hz == pytest.approx(board.clock_hz, abs=1e-3)


def _rtlil(board_name: str, clock_hz: float | None = None) -> str:
    from pipetrain.hdl.boards import platform_class

    board = BOARDS[board_name]
    top = BoardTop(board, Loopback, clock_hz=clock_hz)
    plan = platform_class(board)().prepare(top, "top")
    text = plan.files["top.il"]
    return text.decode() if isinstance(text, bytes) else text


def test_board_tops_instantiate_the_pll_with_the_dividers() -> None:
    """iCEBreaker: SB_PLL40_PAD on the 12 MHz pin (DIVF 63, DIVQ 5); ULX3S: EHXPLLL at 87.5 MHz
    (CLKI_DIV 2, CLKFB_DIV 7, CLKOP_DIV 9); on the oscillator itself no PLL."""
    ice = _rtlil("icebreaker")
    assert "SB_PLL40_PAD" in ice and "parameter \\DIVF 7'0111111" in ice
    assert "parameter \\DIVQ 3'101" in ice
    ecp = _rtlil("ulx3s-85f")
    assert "EHXPLLL" in ecp and "parameter \\CLKFB_DIV 7" in ecp
    assert "parameter \\CLKI_DIV 2" in ecp and "parameter \\CLKOP_DIV 9" in ecp
    assert "SB_PLL40_PAD" not in _rtlil("icebreaker", 12e6)
    with pytest.raises(BoardError, match="cannot make 17 MHz from 12 MHz"):
        _rtlil("icebreaker", 17e6)


def test_second_pll_output_domain_for_the_shell_timing() -> None:
    """ULX3S ``second_domain``: EHXPLLL's CLKOS with CLKOP's divider (9: 87.5 MHz) drives the
    domain (benchmarks/shell_timing.py); without it CLKOS is off; iCE40 refuses it."""
    from pipetrain.hdl.boards import platform_class
    from pipetrain.hdl.pll import PLLClock

    board = BOARDS["ulx3s-85f"]
    top = BoardTop(board, Loopback, second_domain="net")
    text = platform_class(board)().prepare(top, "top").files["top.il"]
    text = text.decode() if isinstance(text, bytes) else text
    assert "parameter \\CLKOS_DIV 9" in text and 'parameter \\CLKOS_ENABLE "ENABLED"' in text
    assert "CLKOS_ENABLE" not in _rtlil("ulx3s-85f")
    ice = BOARDS["icebreaker"]
    s = pick_pll(ice.family, ice.osc_hz, ice.clock_hz, ice.baud)
    with pytest.raises(ValueError, match="ECP5 only"):
        PLLClock(s, None, second="net")


def test_uart_divisor_and_timeouts_follow_the_clock() -> None:
    board = BOARDS["icebreaker"]
    assert BoardTop(board, Loopback).divisor == 24  # 24 MHz / 1 Mbaud
    assert BoardTop(board, Loopback, clock_hz=16.875e6).divisor == 17
    assert BoardTop(board, Loopback, clock_hz=16.3125e6).divisor == 16
    assert BoardTop(board, Loopback, clock_hz=12e6).divisor == 12
    # the link's 21 ms receive timeout in cycles (the board's plans run at board.clock_hz:
    # tests/test_board.py)
    plan = SimpleNamespace(clock_hz=board.clock_hz)
    assert NetworkCore(plan).rx_timeout == round(24e6 * 0.021) == 504_000
    assert NetworkCore(plan, clock_hz=12e6).rx_timeout == round(12e6 * 0.021)


def _fake_builds(monkeypatch: pytest.MonkeyPatch, fmax_at: dict[float, float]) -> list[float]:
    """Replace build_design by one that reports ``fmax_at[clock MHz]`` and writes build.json."""
    clocks: list[float] = []

    def fake(board, top, out, **kw):  # noqa: ANN001, ANN003
        f = top.clock_hz / 1e6
        clocks.append(f)
        r = kw["meta"] | {"fmax_mhz": fmax_at[f], "clock_mhz": f, "digest": str(f)}
        r |= {"timing_met": fmax_at[f] >= f, "utilization": {}, "cached": False}
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "build.json").write_text(json.dumps(r))
        return r

    monkeypatch.setattr(bitstream, "build_design", fake)
    return clocks


def test_build_lowers_the_clock_until_fmax_has_margin(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """iCEBreaker: its 24 MHz meets timing but misses the 3 % margin at Fmax 24.5 MHz
    (< 24.72), so the next pass runs at the fastest PLL clock ≤ 24.5 / 1.03 = 23.79 MHz with
    the UART in tolerance (23.625 MHz = 12 × 63 / 32; divisor 24, −1.56 %), which meets it
    (24.4 ≥ 24.33); build.json records the passes, the PLL and the divisor of the real clock."""
    board = BOARDS["icebreaker"]
    clocks = _fake_builds(monkeypatch, {24.0: 24.5, 23.625: 24.4})
    r = bitstream.build_board(board, lambda f: BoardTop(board, Loopback, clock_hz=f), tmp_path)
    assert clocks == [24.0, 23.625]
    ck = r["clock"]
    assert (ck["target_mhz"], ck["chosen_mhz"], ck["fmax_mhz"], ck["met"]) == (
        24.0, 23.625, 24.4, True
    )  # fmt: skip
    assert ck["passes"] == [
        {"clock_mhz": 24.0, "fmax_mhz": 24.5},
        {"clock_mhz": 23.625, "fmax_mhz": 24.4},
    ]
    assert ck["pll"]["dividers"] == {"DIVR": 0, "DIVF": 62, "DIVQ": 5, "FILTER_RANGE": 1}
    assert r["uart_divisor"] == 24
    assert json.loads((tmp_path / "build.json").read_text())["clock"] == ck
    # a rerun starts at the clock chosen before (its build is the cached one)
    clocks.clear()
    bitstream.build_board(board, lambda f: BoardTop(board, Loopback, clock_hz=f), tmp_path)
    assert clocks == [23.625]


def test_build_falls_back_to_the_oscillator(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Fmax 15 MHz: below the iCE40 PLL's 16.125 MHz floor, the network runs on the 12 MHz
    oscillator (no PLL)."""
    board = BOARDS["icebreaker"]
    clocks = _fake_builds(monkeypatch, {24.0: 15.0, 12.0: 15.5})
    r = bitstream.build_board(board, lambda f: BoardTop(board, Loopback, clock_hz=f), tmp_path)
    assert clocks == [24.0, 12.0]
    assert r["clock"]["pll"] is None and r["clock"]["met"] and r["uart_divisor"] == 12


def test_ecp5_build_that_meets_the_target_runs_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    board = BOARDS["ulx3s-85f"]
    # mlp-digits 32,10's Fmax at a 90 MHz constraint (docs/boards.md §4.2): ≥ 1.03 × 87.5
    clocks = _fake_builds(monkeypatch, {87.5: 90.8})
    r = bitstream.build_board(board, lambda f: BoardTop(board, Loopback, clock_hz=f), tmp_path)
    # 3 Mbaud (the FT231X's fastest) at 87.5 MHz: 29 cycles per bit, 3.017 Mbaud, +0.57 %
    assert clocks == [87.5] and r["clock"]["met"] and r["uart_divisor"] == 29
    assert r["clock"]["pll"]["dividers"]["CLKFB_DIV"] == 7


def test_ecp5_build_that_misses_rebuilds_below_fmax(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """-deep 11×2,11,11,5's Fmax (67.75 MHz, docs/boards.md §4.2) misses 87.5 MHz: the second
    pass runs at the fastest PLL clock ≤ 67.75 / 1.03 = 65.78 MHz whose UART divisor is in
    tolerance, 65.625 MHz (25 × 21 / 8; 22 cycles per bit, 2.983 Mbaud, −0.57 %)."""
    board = BOARDS["ulx3s-85f"]
    clocks = _fake_builds(monkeypatch, {87.5: 67.75, 65.625: 68.1})
    r = bitstream.build_board(board, lambda f: BoardTop(board, Loopback, clock_hz=f), tmp_path)
    assert clocks == [87.5, 65.625] and r["clock"]["met"] and r["uart_divisor"] == 22
    assert r["clock"]["pll"]["dividers"]["CLKFB_DIV"] == 21
