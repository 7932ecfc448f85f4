"""Boards: budgets, fit errors, the board top in simulation, report parsing, deploy, CLI."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
from amaranth.sim import Simulator
from click.testing import CliRunner
from pipetrain.compiler.build import (
    ICE40_BLOCK_RAM_CONFIGS,
    PlanError,
    build_plan,
    memory_blocks,
)
from pipetrain.compiler.compile import compile_result
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.fit import FitError, check_fit
from pipetrain.compiler.ir import LayerIR, NetworkIR
from pipetrain.compiler.targets import BOARDS, BoardError, get_board
from pipetrain.hdl.board import BoardTop, Loopback
from pipetrain.host import toolchain
from pipetrain.host.bitstream import deploy_bitstream, parse_report, synth_cells, synth_overflow
from pipetrain.host.cli import cli
from pipetrain.host.toolchain import ToolchainError

MLP_DIGITS = NetworkIR(
    "mlp-digits", 64, (LayerIR("0", 64, 32, "relu"), LayerIR("2", 32, 10, "identity"))
)


def _runner() -> CliRunner:
    return CliRunner()


# --- budgets and fitting -------------------------------------------------------------------


def test_budgets_are_the_data_sheet_totals() -> None:
    ecp5, ice = BOARDS["ulx3s-85f"], BOARDS["icebreaker"]
    assert (ecp5.luts, ecp5.multipliers, ecp5.bram_blocks) == (83_640, 156, 208)
    assert ecp5.bram_bits == 208 * 18_432 == 3_833_856
    assert (ice.luts, ice.multipliers, ice.bram_blocks, ice.spram_blocks) == (5_280, 8, 30, 4)
    assert ice.bram_bits == 122_880 and ice.spram_bits == 1_048_576
    assert ice.synth_opts == "-dsp" and ice.bitstream_ext == "bin" and ecp5.bitstream_ext == "bit"


def test_unknown_board_lists_known_ones() -> None:
    with pytest.raises(BoardError, match="known boards: ulx3s-85f, icebreaker"):
        get_board("arty")


def test_mlp_digits_fits_ulx3s_with_numbers() -> None:
    plan = build_plan(MLP_DIGITS, TrainConfig())
    rows = check_fit(plan, BOARDS["ulx3s-85f"])
    # 18×18 blocks with the 18-bit operands (numerics §3.2, §5.3): stage 1 (no input gradient)
    # 4 per lane (ŵ·x, m·u — its top 18 bits; m × the low 6 bits of the 24-bit u is logic,
    # Plan.logic_low_bits —, lr·δ, e·x), stage 2 5 (+ w·δ), loss unit 1
    assert rows["multipliers"] == {"needed": 4 + 5 + 1, "available": 156}
    assert plan.multipliers == 4 + 5  # the stages' multipliers, one each whatever their width
    assert rows["memory_bits"] == {"needed": plan.memory_bits, "available": 3_833_856}
    # one lane per stage: w, u 2 080 × 24 → 4 blocks each (Yosys: as the ULX3S builds map
    # these banks, compiler.build._bram_blocks), stage 1's stash 320 × 16 with two read ports
    # 2, stage 2's w, u 1 each, the exp ROM 1; the small memories (stage 2's stash 96 × 16 with
    # two read ports too) are LUT RAM (compiler.build.memory_kind)
    assert plan.memory_blocks == 4 + 4 + 2 + 1 + 1 + 1 == 13
    assert rows["memory_block_bits"]["needed"] == plan.memory_blocks * 18_432


def test_mlp_digits_does_not_fit_icebreaker_block_ram() -> None:
    # 2 080 weights × (24 + 24) bits in stage 1 alone need more than the 30 EBRs (120 Kib)
    plan = build_plan(MLP_DIGITS, TrainConfig())
    ebr = memory_blocks(plan, ICE40_BLOCK_RAM_CONFIGS)
    with pytest.raises(FitError) as e:
        check_fit(plan, BOARDS["icebreaker"])
    msg = str(e.value)
    # counted in 4 Kib EBRs, every memory as the HDL builds it: stage 1's 2 080 × 24-bit
    # weights and velocities take 14 each (2 048 × 2: 12, the last 32 words 256 × 16: 2; the
    # rule measured on ECP5, docs/boards.md §3), its stash 320 × 16 with two read
    # ports 2 × 2, mask 160 × 1 1 and the scaled errors lr·g 64 × 18 2 (formed at the error
    # buffer's write; nothing reads g itself: no gbuf); stage 2's w, u 330 × 24 3 each, stash
    # 96 × 16 1 × 2, error buffer 1, scaled errors 20 × 18 2, gacc 32 × 39 3 (its 30-bit mask
    # is flip-flops); loss unit: logits 1, exp ROM 512 × 16 2, exp values 1
    assert ebr == 14 + 14 + 4 + 1 + 2 + 3 + 3 + 2 + 1 + 2 + 3 + 1 + 2 + 1 == 53
    # the memory as built (134 216 bits, tests/test_plan_memories.py) is already more than the
    # 120 Kib of EBR, so that is the message
    assert f"{plan.memory_bits:,} memory bits needed, 122,880 available (block RAM)" in msg
    assert e.value.rows["memory_block_bits"] == {"needed": ebr * 4096, "available": 122_880}
    # 16×16 SB_MAC16 with 18-bit constants and operands: each 18×16 product takes 2 blocks
    # (ŵ·x, w·δ, lr·δ, e·x), momentum × u (18 × 24) 2
    assert (
        "21 DSP blocks needed, 8 available (16×16 SB_MAC16, for the stages' 9 multipliers and "
        "the loss unit's 1)"
    ) in msg
    # single-port (SPRAM) weights take the big memories out of the EBR count
    sp = build_plan(MLP_DIGITS, TrainConfig(), single_port=(1, 2))
    assert memory_blocks(sp, ICE40_BLOCK_RAM_CONFIGS) == 53 - 2 * (14 + 3) == 19
    with pytest.raises(FitError) as e2:
        check_fit(sp, BOARDS["icebreaker"])
    # 24-bit w and u take two 16-bit SPRAMs each: 8 needed, 4 on the chip
    assert e2.value.rows["spram"] == {"needed": 8, "available": 4}
    assert "8 SPRAMs needed, 4 available" in str(e2.value)


def test_plan_for_board_fits_mlp_digits_on_the_icebreaker() -> None:
    from pipetrain.host.flow import compile_design

    plan = compile_design("mlp-digits", board=BOARDS["icebreaker"]).plan
    assert [s.lanes for s in plan.stages] == [1, 1]
    # 16-bit weights with the calibrated integer bits, SPRAM for both stages' w and u
    assert {(str(s.formats.w), str(s.formats.u)) for s in plan.stages} == {("Q1.14", "Q1.14")}
    # 12-bit activations and errors, the calibrated integer bits kept (auto: Q2.13 → Q2.9, …)
    assert [(str(s.formats.x), str(s.formats.y), str(s.formats.d)) for s in plan.stages] == [
        ("Q2.9", "Q3.8", "Q2.9"),
        ("Q3.8", "Q4.7", "Q1.10"),
    ]
    assert str(plan.stages[1].formats.gin) == "Q2.9"  # = stage 1's d, as the format rules ask
    assert [s.slot_cycles for s in plan.stages] == [2, 2]
    # 5-bit constants: lr 0.002 → 2^-9 (a shift), m 0.9 → 29/32 (three signed digits)
    up = plan.stages[0].update
    assert (up.lr.value, up.lr.frac, up.momentum.value, up.momentum.frac) == (16, 13, 29, 5)
    # a slot every other cycle: 2·(2 080 − 1) + 2 + 5 for stage 1, + 2 control cycles
    assert plan.tick_cycles == 2 * 2079 + 7 + 2 == 4167
    rows = check_fit(plan, BOARDS["icebreaker"])
    # per stage: forward ŵ·x and δ·x (+ w·δ in stage 2) 16×16 each; the loss unit's e·r
    assert rows["multipliers"] == {"needed": 2 + 3 + 1, "available": 8}
    assert rows["spram"] == {"needed": 4, "available": 4}
    assert plan.clock_hz == 24e6  # the network clock the board top makes with its PLL


def test_plan_for_board_names_what_does_not_fit() -> None:
    from pipetrain.host.flow import compile_design

    # four stages: 2 + 3 + 3 + 3 16×16 products and the loss unit's, 8 SB_MAC16 on the chip
    with pytest.raises(FitError, match="12 DSP blocks needed, 8 available") as e:
        compile_design("mlp-digits-deep", board=BOARDS["icebreaker"])
    assert [s.lanes for s in e.value.plan.stages] == [1, 1, 1, 1]
    assert e.value.rows["multipliers"] == {"needed": 12, "available": 8}


def test_fit_error_names_every_resource() -> None:
    plan = SimpleNamespace(name="big", memory_bits=4_000_000, multipliers=200, memory_blocks=300)
    with pytest.raises(FitError) as e:
        check_fit(plan, BOARDS["ulx3s-85f"])
    msg = str(e.value)
    assert "200 DSP blocks needed, 156 available" in msg
    assert "4,000,000 memory bits needed, 3,833,856 available" in msg


# --- the board top in simulation -----------------------------------------------------------


def _sim_board_loopback(data: list[int], seed: int) -> tuple[list[int], list[int]]:
    """Run BoardTop(Loopback) on a scaled-down board (400 Hz clock, 100 baud → 4 cycles/bit,
    heartbeat period 400 cycles); drive frames into rx_pin back to back, decode tx_pin."""
    board = dataclasses.replace(BOARDS["icebreaker"], clock_hz=400, baud=100)
    dut = BoardTop(board, Loopback, fifo_depth=8)
    assert dut.divisor == 4
    div = dut.divisor
    rng = random.Random(seed)
    got: list[int] = []
    beats: list[int] = []
    acts: list[int] = []

    async def drive(ctx):
        for byte in data:
            for bit in [0] + [(byte >> i) & 1 for i in range(8)] + [1]:
                ctx.set(dut.rx_pin, bit)
                await ctx.tick().repeat(div)
            ctx.set(dut.rx_pin, 1)
            await ctx.tick().repeat(1 + rng.randrange(3))

    async def decode(ctx):
        cycles = 0
        while len(got) < len(data):
            _, _, tx = await ctx.tick().sample(dut.tx_pin)
            cycles += 1
            assert cycles < 20 * div * (len(data) + 4)
            if tx == 0:  # start bit: sample the middle of each data bit
                await ctx.tick().repeat(div // 2)
                byte = 0
                for i in range(8):
                    await ctx.tick().repeat(div)
                    byte |= ctx.get(dut.tx_pin) << i
                await ctx.tick().repeat(div)
                assert ctx.get(dut.tx_pin) == 1  # stop bit
                got.append(byte)

    async def watch(ctx):
        async for _, _, leds in ctx.tick().sample(dut.led_pins):
            beats.append(leds & 1)
            acts.append((leds >> 1) & 1)

    sim = Simulator(dut)
    sim.add_clock(1 / 400)
    sim.add_testbench(watch, background=True)
    sim.add_testbench(drive, background=True)
    sim.add_testbench(decode)
    sim.run()
    # the activity LED: off until the first byte is in (start bit + 8 data bits), on within two
    # 8-cycle windows (clock/50 = 8) of it, and switched only at window edges (runs of 8·n)
    first = next(i for i, a in enumerate(acts) if a)
    assert 9 * div <= first <= 10 * div + 2 * 8, first
    edges = [i for i in range(first, len(acts)) if acts[i] != acts[i - 1]]
    assert len(edges) >= 2 and all(
        (b - a) % 8 == 0 for a, b in zip(edges, edges[1:], strict=False)
    ), edges
    return got, beats


def test_board_top_loopback_echoes_bytes_and_beats() -> None:
    rng = random.Random(3)
    data = [rng.randrange(256) for _ in range(12)] + [0x00, 0xFF]
    got, beats = _sim_board_loopback(data, seed=3)
    assert got == data
    # heartbeat toggles every clock_hz/2 = 200 cycles
    edges = [i for i in range(1, len(beats)) if beats[i] != beats[i - 1]]
    assert len(edges) >= 2 and all(b - a == 200 for a, b in zip(edges, edges[1:], strict=False))


def test_network_core_timeout_zero_is_off() -> None:
    """0 s turns the link's receive timeout off (it was one cycle: every frame was dropped)."""
    from pipetrain.hdl.board import NetworkCore

    plan = build_plan(MLP_DIGITS, TrainConfig())
    assert NetworkCore(plan, rx_timeout_s=0).rx_timeout == 0
    assert NetworkCore(plan, rx_timeout_s=1e-12).rx_timeout == 1  # positive: ≥ one cycle
    assert NetworkCore(plan, rx_timeout_s=0.021).rx_timeout == round(plan.clock_hz * 0.021)
    with pytest.raises(ValueError, match="rx_timeout_s must be ≥ 0"):
        NetworkCore(plan, rx_timeout_s=-1.0)


# --- nextpnr report parsing ----------------------------------------------------------------

_YOSYS_TAIL = """
=== design hierarchy ===

        +----------Count including submodules.
        |
       22 cells
        2   SB_RAM40_4K
       74   SB_CARRY
       28   SB_DFF
       27   SB_DFFE
       94   SB_DFFESR
       31   SB_DFFSR
      222   SB_LUT4

2.60. Executing CHECK pass (checking for obvious problems).
"""


def test_parse_report_ice40() -> None:
    report = {
        "fmax": {"cd_sync.clk": {"achieved": 26.62, "constraint": 12.0}},
        "utilization": {
            "ICESTORM_LC": {"available": 5280, "used": 317},
            "ICESTORM_RAM": {"available": 30, "used": 2},
            "ICESTORM_DSP": {"available": 8, "used": 0},
            "ICESTORM_SPRAM": {"available": 4, "used": 0},
            "SB_IO": {"available": 39, "used": 5},
        },
    }
    r = parse_report(report, "ice40", _YOSYS_TAIL)
    assert (r["fmax_mhz"], r["clock_mhz"]) == (26.62, 12.0)
    u = r["utilization"]
    assert u["luts"] == {"used": 317, "available": 5280}
    assert u["ffs"] == {"used": 28 + 27 + 94 + 31, "available": 5280}
    assert u["bram_blocks"] == {"used": 2, "available": 30}
    assert u["multipliers"] == {"used": 0, "available": 8}


def test_synthesised_overflow_names_hard_blocks() -> None:
    # mlp-digits' NetworkTop synthesised for iCE40 (measured): 23 SB_MAC16, 49 EBR
    log = _YOSYS_TAIL.replace("2   SB_RAM40_4K", "49   SB_RAM40_4K\n       23   SB_MAC16")
    cells = synth_cells(log)
    assert cells["SB_MAC16"] == 23 and cells["SB_LUT4"] == 222
    assert synth_overflow(BOARDS["icebreaker"], cells) == [
        "23 SB_MAC16 needed, 8 available",
        "49 SB_RAM40_4K needed, 30 available",
    ]
    assert synth_overflow(BOARDS["ulx3s-85f"], {"MULT18X18D": 38, "DP16KD": 22}) == []


def test_parse_report_ecp5_worst_clock() -> None:
    report = {
        "fmax": {
            "a": {"achieved": 80.0, "constraint": 25.0},
            "b": {"achieved": 40.0, "constraint": 50.0},
        },
        "utilization": {
            "TRELLIS_COMB": {"available": 83640, "used": 1000},
            "TRELLIS_FF": {"available": 83640, "used": 700},
            "MULT18X18D": {"available": 156, "used": 7},
            "DP16KD": {"available": 208, "used": 16},
        },
    }
    r = parse_report(report, "ecp5")
    assert (r["fmax_mhz"], r["clock_mhz"]) == (40.0, 50.0)  # the clock that misses timing
    assert r["utilization"]["ffs"] == {"used": 700, "available": 83640}
    assert r["utilization"]["multipliers"]["used"] == 7


# --- tools and deploy ----------------------------------------------------------------------


def _stub(tmp_path: Path, name: str, rc: int, text: str) -> str:
    path = tmp_path / name
    path.write_text(f'#!/bin/sh\necho "{text} $*"\nexit {rc}\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_configure_picks_native_or_yowasp(monkeypatch: pytest.MonkeyPatch) -> None:
    env: dict[str, str] = {}
    try:
        chosen = toolchain.configure("ice40", env)
    except ToolchainError as e:
        assert "pip install 'pipetrain[boards]'" in str(e)
        return
    assert set(chosen) == {"YOSYS", "NEXTPNR_ICE40", "ICEPACK"} and chosen == env
    for name, cmd in chosen.items():
        tool = toolchain.TOOLS[name]
        assert Path(cmd).name in (tool.native, *tool.fallbacks)


def test_configure_reports_a_bad_env_var() -> None:
    with pytest.raises(ToolchainError, match="YOSYS='/nonexistent/yosys' \\(not found\\)"):
        toolchain.configure("ice40", {"YOSYS": "/nonexistent/yosys"})


def test_deploy_dry_run_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ofl = _stub(tmp_path, "ofl", 0, "ok")
    monkeypatch.setenv("OPENFPGALOADER", ofl)
    monkeypatch.delenv("ICEPROG", raising=False)
    bit = tmp_path / "top.bit"
    bit.write_bytes(b"\0")
    r = deploy_bitstream(BOARDS["ulx3s-85f"], str(bit), dry_run=True)
    assert r == {"command": [ofl, "-b", "ulx3s", "-m", str(bit)], "ran": False, "output": ""}
    r = deploy_bitstream(BOARDS["ulx3s-85f"], str(bit), flash=True, dry_run=True)
    assert r["command"][3] == "-f"
    binf = tmp_path / "top.bin"
    binf.write_bytes(b"\0")
    iceprog = _stub(tmp_path, "iceprog-stub", 0, "ok")
    monkeypatch.setenv("ICEPROG", iceprog)
    assert deploy_bitstream(BOARDS["icebreaker"], str(binf), dry_run=True)["command"] == [
        iceprog,
        str(binf),
    ]


def test_deploy_cli_dry_run_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ICEPROG", _stub(tmp_path, "ip", 0, "ok"))
    binf = tmp_path / "top.bin"
    binf.write_bytes(b"\0")
    res = _runner().invoke(
        cli, ["deploy", str(binf), "--board", "icebreaker", "--dry-run", "--json", "-"]
    )
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout[res.stdout.index("{") :])
    assert payload["command"] == [os.environ["ICEPROG"], str(binf)] and payload["ran"] is False


def test_deploy_runs_the_programmer_and_reports_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bit = tmp_path / "top.bit"
    bit.write_bytes(b"\0")
    monkeypatch.setenv("OPENFPGALOADER", _stub(tmp_path, "good", 0, "done"))
    r = deploy_bitstream(BOARDS["ulx3s-85f"], str(bit))
    assert r["ran"] and r["output"] == f"done -b ulx3s -m {bit}"
    monkeypatch.setenv("OPENFPGALOADER", _stub(tmp_path, "bad", 1, "unable to open ftdi device"))
    res = _runner().invoke(cli, ["deploy", str(bit), "--board", "ulx3s-85f"])
    assert res.exit_code == 2
    assert "programming ulx3s-85f failed (exit 1): unable to open ftdi device" in res.output
    assert "Traceback" not in res.output


def test_deploy_rejects_wrong_file(tmp_path: Path) -> None:
    with pytest.raises(BoardError, match="does not exist"):
        deploy_bitstream(BOARDS["icebreaker"], str(tmp_path / "nope.bin"), dry_run=True)
    bit = tmp_path / "top.bit"
    bit.write_bytes(b"\0")
    with pytest.raises(BoardError, match=r"icebreaker takes a \.bin bitstream"):
        deploy_bitstream(BOARDS["icebreaker"], str(bit), dry_run=True)


def test_list_boards_json() -> None:
    res = _runner().invoke(cli, ["list-boards", "--json", "-"])
    assert res.exit_code == 0
    payload = json.loads(res.stdout[res.stdout.index("{") :])
    by_name = {b["name"]: b for b in payload["boards"]}
    assert by_name["icebreaker"]["spram_bits"] == 1_048_576
    assert by_name["ulx3s-85f"]["multipliers"] == 156


def test_build_fit_error_is_a_clean_cli_error() -> None:
    # the plan check fails before any tool runs: 12 SB_MAC16 needed, 8 on the chip
    res = _runner().invoke(
        cli, ["build", "mlp-digits-deep", "--board", "icebreaker", "--json", "-"]
    )
    assert res.exit_code == 2, res.output
    assert "does not fit icebreaker" in res.stderr and "Traceback" not in res.output
    assert "12 DSP blocks needed, 8 available" in res.stderr
    # one lane per stage was tried already: the advice does not say "fewer lanes"
    assert "already with one lane per stage" in res.stderr and "fewer lanes" not in res.stderr
    payload = json.loads(res.stdout)  # --json gets the error too, with the fit rows
    assert payload["error_type"] == "FitError"
    assert payload["fit"]["multipliers"] == {"needed": 12, "available": 8}


def test_build_takes_the_training_options_of_train(monkeypatch: pytest.MonkeyPatch) -> None:
    """``build --lr …`` puts the same plan in the bitstream that ``train --board --lr …``
    streams (the device checks the hash at HELLO); the toolchain is replaced by a stub that
    returns the build metadata. --epochs is not in the plan, but both calibrate the auto
    formats over it: a build for 1 epoch is another plan than the default build's (4 epochs,
    DEFAULT_EPOCHS), which a 1-epoch run trains with --calib-epochs 4."""
    from pipetrain.host import bitstream

    def fake_build(board, top, out, **kw):  # noqa: ANN001, ANN003
        return kw["meta"] | {
            "board": board.name, "bitstream": f"{out}/top.bin", "fmax_mhz": 28.3,
            "clock_mhz": 24.0, "timing_met": True, "utilization": {}, "build_s": 0.0,
            "cached": False,
        }  # fmt: skip

    monkeypatch.setattr(bitstream, "build_design", fake_build)  # build_board's passes
    args = ["mlp-digits", "--board", "icebreaker", "--lr", "0.004", "--epochs", "1", "--json", "-"]
    res = _runner().invoke(cli, ["build", *args])
    assert res.exit_code == 0, res.output
    built = json.loads(res.stdout)
    assert (built["calib_epochs"], built["calib_samples"]) == (1, None)
    res = _runner().invoke(cli, ["train", *args, "--target", "golden"])
    assert res.exit_code == 0, res.output
    trained = json.loads(res.stdout[res.stdout.index("{") :])
    assert built["plan_hash"] == trained["plan_hash"] and trained["calib_epochs"] == 1
    from pipetrain.host.flow import compile_design

    default = compile_design("mlp-digits", board=BOARDS["icebreaker"], calib_epochs=1).plan
    assert built["plan_hash"] != default.hash  # the learning rate is in the plan
    res = _runner().invoke(cli, ["build", *args[:5], "--json", "-"])  # default: 4 epochs
    assert res.exit_code == 0, res.output
    four = json.loads(res.stdout)
    assert four["calib_epochs"] == 4 and four["plan_hash"] != built["plan_hash"]
    lr4 = compile_design(
        "mlp-digits", board=BOARDS["icebreaker"], config_overrides={"lr": 0.004}, calib_epochs=4
    )
    assert four["plan_hash"] == lr4.plan.hash  # what train --epochs 1 --calib-epochs 4 compiles


def test_narrowed_logits_keep_the_exp_lut_fraction() -> None:
    """At lr 0.01 the calibrated logits need 6 integer bits: 12 bits would leave 5 fraction
    bits, too few for the exp LUT (2^-5 steps), so the board keeps 6 (13 bits)."""
    from pipetrain.compiler.build import EXP_LUT_FRAC
    from pipetrain.host.flow import compile_design

    r = compile_design("mlp-digits", board=BOARDS["icebreaker"], config_overrides={"lr": 0.01})
    y = r.plan.stages[-1].formats.y
    assert y.frac == EXP_LUT_FRAC + 1 and y.bits == 13, y
    assert r.plan.stages[0].formats.y.bits == 12  # hidden activations still narrowed


def test_too_few_logit_fraction_bits_names_the_fix() -> None:
    with pytest.raises(PlanError, match=r"give it at least 6, e.g. --format s2.y=Q6.6"):
        compile_result("mlp-digits", formats="default", format_overrides=["s2.y=Q6.5"])


def test_pnr_logic_cell_overflow_is_reported_as_needed_vs_available() -> None:
    from pipetrain.host.bitstream import pnr_overflow

    log = "Info: ...\nERROR: Failed to expand region (0, 0) |_> (25, 31) of 5578 ICESTORM_LCs\n"
    msg = pnr_overflow(BOARDS["icebreaker"], log)
    assert msg == (
        "5,578 logic cells (ICESTORM_LCs: LUT4 + flip-flop) needed after packing, 5,280 available"
    )
    assert pnr_overflow(BOARDS["icebreaker"], "ERROR: something else") is None
