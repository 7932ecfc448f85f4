"""A fresh-user trial's report and CLI findings, each pinned to its corrected text: the stage
table's totals (the loss unit and the result FIFO are rows of their own), the iCEBreaker's
constants and m·u as the plan builds them, what "overrides" the formats had, the option that
chose lanes that do not fit and the least ``--max-multipliers`` that works, slots vs cycles
of a single-port stage, formatted fit numbers in the board's logic-cell unit, an HDL refusal
as one line, the MACs' weight operand with its widths, the names of the multipliers, the
calibration options checked before calibrating, multipliers → DSP blocks, and the loss
unit's P and k. Compile only (``--formats default``: no calibration run), no RTL."""

from __future__ import annotations

import gc
import warnings
from types import SimpleNamespace

import pytest
from pipetrain.compiler.build import hard_multipliers, loss_operands
from pipetrain.compiler.targets import BOARDS
from test_train_cli import report_of, run

ICE = ("--board", "icebreaker", "--formats", "default")


def _table(text: str, title: str) -> list[list[str]]:
    """The rows (cells stripped) of the first Markdown table whose header starts ``title``."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(title))
    rows = []
    for ln in lines[start + 2 :]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in ln.split("|")[1:-1]])
    return rows


@pytest.fixture(scope="module")
def ice(tmp_path_factory):
    """``compile mlp-digits --board icebreaker --formats default --json -``: (result, report.md)."""
    out = tmp_path_factory.mktemp("ice") / "b"
    res = run("compile", "mlp-digits", *ICE, "--out", str(out), "--json", "-")
    assert res.exit_code == 0, res.output
    return res, (out / "report.md").read_text()


def test_stage_table_totals_are_the_sums_of_its_rows_loss_unit_and_fifo_included(ice):
    """Item 1: the mults total counted the stages only while the BRAM/EBR and memory totals
    included the loss unit's memories unseen; now the loss unit (``L1``) and the network top's
    result FIFO (``top``) are rows, and every total is its column's sum — the mults total the
    design's multipliers, the board fit's DSP blocks here (one each)."""
    res, text = ice
    rows = _table(text, "| stage | layer")
    by = {r[0]: r for r in rows}
    assert list(by) == ["1", "2", "L1", "top", "total"]
    head = [c.strip() for c in text.split("| stage | layer", 1)[1].splitlines()[0].split("|")]
    cols = ["stage", "layer", *head[1:-1]]
    bits, blocks, mults = cols.index("memory bits"), cols.index("EBR"), cols.index("mults")
    for col in (bits, blocks, mults):
        assert int(by["total"][col]) == sum(int(r[col]) for r in rows[:-1])
    assert by["L1"][1:4] == ["loss", "10 classes", "cross_entropy"]
    assert (by["L1"][bits], by["L1"][blocks], by["L1"][mults]) == ("8472", "4", "1")
    assert (by["top"][2], by["top"][bits], by["top"][mults]) == ("results", "98", "0")
    rep = report_of(res)
    assert (
        int(by["total"][mults])
        == 6
        == rep["multipliers"] + rep["loss_multipliers"]
        == rep["fit"]["multipliers"]["needed"]
    )
    assert rep["loss_multipliers"] == 1
    assert int(by["total"][bits]) == rep["memory_bits"]
    assert int(by["total"][blocks]) == rep["memory_blocks"]


def test_icebreaker_report_gives_the_built_constants_and_no_split_m_u(ice):
    """Item 2: the iCE40 plan forms no low piece in logic (``logic_low_bits`` 0) and its m =
    29/32 is shifts and adds, so "m·u may take two" was wrong; η, m are 5-bit constants: the
    report gives the values built next to the ones asked for."""
    _, text = ice
    assert "m·u may take two" not in text
    assert (
        "- η = 0.002, m = 0.9, λ = 0.0 at batch 1 → batch 1: η₁ = 0.002, m₁ = 0.9; as built "
        "(5-bit constants): η₁ = 0.001953125 (2^-9), m₁ = 0.90625 (29/2^5)"
    ) in text
    assert (
        "no low piece of a constant product is formed in logic here (`logic_low_bits` 0), and no "
        "product of this plan is wider than one block; m·u is shifts and adds (m₁ = 0.90625 "
        "(29/2^5), at most 3 signed digits), no multiplier"
    ) in text


def test_formats_source_says_what_the_overrides_are(tmp_path):
    """Item 3: "formats: auto+overrides" without any --format: the board's narrowing is named
    with its widths, and --format overrides are listed."""
    res = run("compile", "mlp-digits", *ICE, "--format", "s1.x=Q3.8", "--out", str(tmp_path / "a"))
    assert res.exit_code == 0, res.output
    want = (
        "default + overrides (s1.x=Q3.8) + narrowed to icebreaker's widths (w, u 16 bits; x, y, "
        "d, gin 12 bits)"
    )
    assert f"strategy global, formats {want}\n" in res.output
    assert f"formats: {want}" in (tmp_path / "a" / "report.md").read_text()
    res = run("compile", "mlp-digits", "--board", "ulx3s-85f", "--formats", "default",
              "--out", str(tmp_path / "b"), "--json", "-")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert report_of(res)["formats_source"] == "default"  # nothing narrowed on the ULX3S


def test_max_multipliers_errors_name_the_option_and_the_least_that_works(tmp_path):
    """Item 4: lanes chosen by --max-multipliers that do not fit say so (not "the lanes asked
    for"); one too small names the least value that works — counted with the board's
    constants (5 on the iCEBreaker, whose m·u and η are shift-adds; 9 without a board)."""
    res = run("compile", "mlp-digits", *ICE, "--max-multipliers", "20", "--out", str(tmp_path))
    assert res.exit_code == 2
    assert "with the lanes --max-multipliers 20 chose (7,2); --lanes 1,1 fits (4,167 " in (
        res.output
    )
    assert "leave --max-multipliers out for the fastest plan that fits" in res.output
    assert "the lanes asked for" not in res.output
    res = run("compile", "mlp-digits", *ICE, "--max-multipliers", "3", "--out", str(tmp_path))
    assert res.exit_code == 2
    assert res.output.strip() == (
        "Error: --max-multipliers 3 is below the smallest design: one lane per stage already "
        "uses 5 multipliers in the stages; give --max-multipliers 5 or more (the least that "
        "works: one lane per stage), or leave it out"
    )
    res = run("compile", "mlp-digits", *ICE, "--max-multipliers", "5", "--out",
              str(tmp_path / "ok"), "--json", "-")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert [s["lanes"] for s in report_of(res)["stages"]] == [1, 1]
    res = run("compile", "mlp-digits", "--formats", "default", "--max-multipliers", "3",
              "--out", str(tmp_path / "n"))  # fmt: skip
    assert "give --max-multipliers 9 or more" in res.output


def test_single_port_stages_show_slots_and_cycles(ice):
    """Item 5: the column said cycles/tick but held slots, which SPRAM stages issue every other
    cycle; now slots/tick and the pass's cycles, and a line says why they differ."""
    res, text = ice
    rows = _table(text, "| stage | layer")
    head = text.split("| stage | layer", 1)[1].splitlines()[0]
    assert "| slots/tick | pass cycles |" in head and "cycles/tick" not in head
    assert rows[0][7:9] == ["2080", "4165"] and rows[1][7:9] == ["330", "665"]
    assert (
        "slots/tick vs pass cycles: a single-port (SPRAM) weight memory gives a slot every 2 "
        "cycles: stage 1 2,080 slots → 4,165 cycles, stage 2 330 slots → 665 cycles"
    ) in res.output
    assert [s["pass_cycles"] for s in report_of(res)["stages"]] == [4165, 665]


def test_operand_registers_are_explained_where_the_pass_cycles_are(tmp_path):
    """A fresh-user trial: the ULX3S plan's passes are longer than the same lanes without a
    board (operand and write-data registers: 2 each on the ECP5, 4 cycles) and nothing said
    why; the report and the terminal now give a line with each stage's slots and cycles
    (65 → 74, 33 → 42)."""
    out = tmp_path / "u"
    res = run("compile", "mlp-digits", "--board", "ulx3s-85f", "--formats", "default",
              "--out", str(out), "--json", "-")  # fmt: skip
    assert res.exit_code == 0, res.output
    line = (
        "`Stage.operand_registers` = 2; docs/architecture.md §3): every multiplier's operands "
        "are registered twice more and the weight banks' write data twice before the write "
        "(timing), so each pass takes 4 cycles more than without them (a pass is its slots "
        "plus the pipeline's fill and drain): stage 1 65 slots → 74 cycles (70 without them), "
        "stage 2 33 slots → 42 cycles (38 without them)"
    )
    assert line in (out / "report.md").read_text() and line in res.output
    assert [s["pass_cycles"] for s in report_of(res)["stages"]] == [74, 42]
    bare = run("compile", "mlp-digits", "--lanes", "32,10", "--formats", "default",
               "--out", str(tmp_path / "n"))  # fmt: skip
    assert bare.exit_code == 0 and "operand registers" not in bare.output


def test_fit_errors_format_numbers_and_name_the_boards_logic_cells(tmp_path):
    """Item 6: fit numbers with thousands separators; logic cells on the iCE40, LUT4s on the
    ECP5, in errors, the fit line and table and list-boards alike."""
    from pipetrain.compiler.fit import FitError, check_fit
    from pipetrain.compiler.report import fit_label, fit_text

    plan = SimpleNamespace(name="big", memory_bits=4_000_000, multipliers=200, memory_blocks=300)
    with pytest.raises(FitError) as e:
        check_fit(plan, BOARDS["ulx3s-85f"])
    assert "4,000,000 memory bits needed, 3,833,856 available (block RAM)" in str(e.value)
    res = run("compile", "mlp-digits", *ICE, "--lanes", "4,1", "--out", str(tmp_path))
    assert res.exit_code == 2
    assert "~7,860 logic cells needed (estimate, link engine and UART included), 5,280 " in (
        res.output
    )
    assert "(208,896 bits, 5 of them the link's), 30 available (122,880 bits)" in res.output
    ulx = BOARDS["ulx3s-85f"]
    assert fit_label("logic_cells", ulx) == "LUT4s (estimate)"
    assert fit_label("logic_cells", BOARDS["icebreaker"]) == "logic cells (estimate)"
    fit = {"logic_cells": {"needed": 48_681, "available": 83_640}}
    assert fit_text("ulx3s-85f", fit) == (
        "fitted to ulx3s-85f (needed/available): LUT4s (estimate) 48,681/83,640"
    )
    res = run("list-boards")
    assert "5,280 logic cells, 5,280 FF" in res.output and "83,640 LUT4s, 83,640 FF" in res.output


def test_an_hdl_refusal_is_one_line_without_amaranth_warnings(capsys):
    """Item 7: a plan the HDL refuses while it is elaborated (mlp 64→1→10: stage 2's one input
    with 10 row groups would race its accumulator memory) was ``Internal error:`` (status 1)
    followed by Amaranth's UnusedElaboratable warnings for the parts built before; now one
    ``Error:`` line, status 2, and no warning after it."""
    from pipetrain.host.cli import main

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(SystemExit) as e:
            main(["train", "mlp", "--hidden", "1", "--target", "sim", "--epochs", "1",
                  "--formats", "default"])  # fmt: skip
        code = e.value.code
        del e
        gc.collect()
    assert code == 2
    assert not [w for w in caught if w.category.__name__ == "UnusedElaboratable"]
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "Error: the HDL does not build this plan: stage 2: N=1 < 4 inputs with 10 row groups "
        "would race the input-gradient accumulator memory; use lanes = out_features"
    )


def test_multiplier_section_explains_the_weight_operand_and_every_name(tmp_path):
    """Items 8 and 9: "one integer bit more than ŵ" now gives the formats and why; the tanh
    LUT's products (lut_slope, deriv, deriv_g) and every other name in the Multipliers table
    are explained under it."""
    from pathlib import Path

    tanh = Path(__file__).resolve().parent.parent / "examples" / "mlp_tanh.py"
    res = run("compile", str(tanh), "--formats", "default", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    text = (tmp_path / "report.md").read_text()
    assert (
        "the MACs read ŵ (w, Q3.20: 24 bits) and w (Q3.20) as Q4.13 (18 bits): rounded half up "
        "by 7 bits, 13 fraction bits kept; Q4.13 has one integer bit more than Q3.20 (4 vs 3) "
        "because rounding up the largest ŵ reaches 65,536 (2^16) LSBs, one past a 17-bit "
        "signed range: no clamp needed"
    ) in text
    names = next(ln for ln in text.splitlines() if ln.startswith("Names: "))
    table = {r[1] for r in _table(text, "| stage | multiplier")} - {"", "loss unit"}
    assert table == {"fwd", "gin", "lut_slope", "deriv", "deriv_g", "momentum", "lr_delta", "lr_x"}
    for name in table | {"loss unit"}:
        assert f"`{name}` " in names
    assert (
        "`lut_slope` the tanh/sigmoid LUT's interpolation: the slope between two entries × the "
        "low bits of |z| below the LUT step"
    ) in names
    assert "`deriv` the tanh/sigmoid derivative factor from the stashed y: y·y for tanh" in names


def test_calibration_options_and_format_widths_are_checked_before_calibrating(tmp_path):
    """Item 10: --calib-epochs/--calib-samples with formats that do not calibrate are refused
    (they were ignored); --calib-samples 0 names its option; an impossible --format is refused
    before the calibration run (it was refused after it, ~17 s later)."""
    out = ("--out", str(tmp_path / "a"))
    res = run("compile", "mlp-digits", "--formats", "static", "--calib-epochs", "3", *out)
    assert res.exit_code == 2
    assert res.output.strip() == (
        "Error: --calib-epochs 3 sets the length of the auto formats' calibration run, but "
        "--formats static does not calibrate: drop --calib-epochs, or use --formats auto"
    )
    res = run("compile", "mlp-digits", "--calib-samples", "0", *out)
    assert res.exit_code == 2 and res.output.strip() == "Error: --calib-samples must be ≥ 1, got 0"
    from pipetrain.compiler.compile import compile_result

    def calibrate(*_):
        raise AssertionError("calibrated before checking the --format widths")

    with pytest.raises(Exception, match=r"--format w=Q3.40 has 44 bits; a weight/velocity") as e:
        compile_result("mlp-digits", format_overrides=["w=Q3.40"], calibrate=calibrate)
    assert "at most 40 (x, y, d, gin, logits: 2..32; w, u: 2..40)" in str(e.value)
    res = run("compile", "mlp-digits", "--format", "x=Q20.20", *out)
    assert res.exit_code == 2 and "--format x=Q20.20 has 41 bits" in res.output


def test_multipliers_line_says_which_dsp_blocks_they_take(ice):
    """Item 11: ``multipliers: N`` then ``DSP blocks M/156`` with nothing between them; the
    line now counts the loss unit's and says how many blocks each takes, matching the fit (and
    a plan with m·u in two blocks says which ones take two)."""
    from pipetrain.compiler.build import build_plan
    from pipetrain.compiler.config import TrainConfig
    from pipetrain.compiler.frontend import trace
    from pipetrain.compiler.models import load_model
    from pipetrain.compiler.report import multiplier_text

    res, _ = ice
    assert (
        "multipliers: 6 (5 in the stages + 1 in the loss unit) → 6 DSP blocks (16×16 SB_MAC16): "
        "one each; lanes: 1,1\n"
    ) in res.output
    name, module, _ = load_model("mlp-digits")
    two = build_plan(trace(module, name), TrainConfig(), lanes=[4, 1], logic_low_bits=0)
    ulx = BOARDS["ulx3s-85f"]
    assert multiplier_text(two, ulx) == (
        "multipliers: 19 (18 in the stages + 1 in the loss unit) → 24 DSP blocks (18×18 "
        "MULT18X18D): 5 take 2, 14 one each (an operand wider than 18 bits is split into 18-bit "
        "pieces)"
    )
    assert hard_multipliers(two, 18) == 24
    assert two.multipliers + len(loss_operands(two.loss)) == 19


def test_loss_table_gives_p_and_k(tmp_path):
    """Item 12: the loss units' parallelism (``exp_lanes`` P, ``div_bits`` k, ``out_lanes`` Q)
    in report.md —
    the ULX3S's 32,10 plan's unit fits the tick's slack, stage 1's 74-cycle pass less stage 2's
    forward outputs at 41 cycles (``build.forward_cycles``): 33 cycles. P = 5, k = 2 with one
    error a cycle took 33 until the exp ROM's index was registered (35 since the logit slice
    is registered too); the cheapest setting that fits with the ROM in block RAM is (2, 2, 2),
    33 cycles, its 2-port ROM in one block, two errors a write (``loss_parallelism``)."""
    res = run("compile", "mlp-digits", "--board", "ulx3s-85f", "--formats", "default",
              "--lanes", "32,10", "--out", str(tmp_path), "--json", "-")  # fmt: skip
    assert res.exit_code == 0, res.output
    text = (tmp_path / "report.md").read_text()
    assert "| loss      | kind          | classes | logits | error | P | k | Q | cycles |" in text
    from pipetrain.compiler.plan import Plan

    lu = Plan.from_json((tmp_path / "plan.json").read_text()).loss
    row = _table(text, "| loss      | kind")[0]
    assert row[5:] == [str(lu.exp_lanes), str(lu.div_bits), str(lu.out_lanes), str(lu.cycles)]
    assert (lu.exp_lanes, lu.div_bits, lu.out_lanes, lu.cycles) == (2, 2, 2, 33)
    assert "P: logits through the exp LUT per cycle (`exp_lanes`), k: quotient bits" in text


def test_ice40_report_counts_its_own_blocks(tmp_path):
    """A fresh-user trial: the iCEBreaker report said the multiplier total "is the board fit's
    DSP block count on an 18 × 18 board" on a board of 16 × 16 SB_MAC16 blocks; it now names
    this board's blocks and their count from the fit (the ECP5 report keeps the sentence)."""
    out = tmp_path / "i"
    res = run("compile", "mlp-digits", "--board", "icebreaker", "--formats", "default",
              "--out", str(out))  # fmt: skip
    assert res.exit_code == 0, res.output
    text = (out / "report.md").read_text()
    assert "on an 18 × 18 board" not in text
    assert "The total includes the loss units (icebreaker's blocks: 6 16 × 16 SB_MAC16)" in text
    assert "on this board's 16 × 16 SB_MAC16 blocks the design takes 6, Board above" in text
    res = run("compile", "mlp-digits", "--board", "ulx3s-85f", "--formats", "default",
              "--out", str(tmp_path / "u"))  # fmt: skip
    assert res.exit_code == 0, res.output
    text = (tmp_path / "u" / "report.md").read_text()
    assert "it is the board fit's DSP block count on an 18 × 18 board" in text
    assert "product registers are its MULT18X18D's own (hdl/dsp.py)" in text


@pytest.fixture(scope="module")
def ulx(tmp_path_factory):
    """``compile mlp-digits --board ulx3s-85f --formats default --lanes 32,10 --json -`` (the
    one-lane-per-row plan these trials read, m·u in its DSP blocks; --lanes auto now folds
    stage 1 over column lanes): (result, report.md, plan.json as a dict — read as JSON, not
    ``Plan.from_json``, whose check of a board plan's loss cycles is not what these tests are
    about)."""
    import json

    out = tmp_path_factory.mktemp("ulx") / "b"
    res = run("compile", "mlp-digits", "--board", "ulx3s-85f", "--formats", "default",
              "--lanes", "32,10", "--out", str(out), "--json", "-")  # fmt: skip
    assert res.exit_code == 0, res.output
    plan = json.loads((out / "plan.json").read_text())
    return res, (out / "report.md").read_text(), plan


def test_fit_memory_bits_row_and_heading_say_the_same_of_the_link(ulx):
    """Second trial, item 1: the fit table's heading said "the link engine and UART included"
    while its memory-bits row is the plan's own (``Plan.memory_bits``, the link's memories not
    in it; the block-RAM rows count the link's blocks): every row now says which it is, and the
    heading no longer claims the link for all of them."""
    res, text, plan = ulx
    rep = report_of(res)
    rows = {r[0]: r[1:] for r in _table(text, "| resource")}
    bits = rows["memory bits (the plan's, link's not counted)"]
    assert (
        int(bits[0].replace(",", "")) == plan["memory_bits"] == rep["fit"]["memory_bits"]["needed"]
    )
    blocks = rows["block RAMs (link's included)"]
    assert int(blocks[0]) == rep["fit"]["bram_blocks"]["needed"] > plan["memory_blocks"]  # + link
    assert "block-RAM bits as mapped (link's included)" in rows
    assert (
        "Needed vs available (the link engine and UART included in the block RAMs and LUT4s; "
        "memory bits are the plan's own; LUT4s are an estimate, docs/boards.md §3):"
    ) in text
    assert (
        f"memory bits (the plan's, link's not counted) {plan['memory_bits']:,}/3,833,856, "
        "block-RAM bits as mapped (link's included) "
    ) in res.stderr


def test_stash_column_counts_the_entries_built_and_a_legend_names_the_columns(ulx):
    """Second trial, item 2: the stash column showed ``stash_depth`` (D_s + 1, the samples in
    use) while ``xstash`` and ``mask`` hold ``stash_entries`` = D_s + 2 (one more being
    written); it now shows the entries as built, and a line under the table says what D_s,
    stash, slots/tick and pass cycles are (report.md and the compile output)."""
    from pipetrain.compiler.report import stage_legend

    res, text, plan = ulx
    head = text.split("| stage | layer", 1)[1].splitlines()[0]
    cols = ["stage", "layer", *[c.strip() for c in head.split("|")[1:-1]]]
    by = {r[0]: r for r in _table(text, "| stage | layer")}
    mems = {(r[0], r[1]): r for r in _table(text, "| owner")}
    for st in plan["stages"]:
        entries, i = st["stash_entries"], st["index"]
        assert int(by[str(i)][cols.index("stash")]) == entries == st["delay"] + 2
        assert int(mems[(f"stage{i}", "xstash")][4]) == entries * st["x_words"]  # words
        assert int(mems[(f"stage{i}", "mask")][4]) == entries * st["row_groups"]
    legend = stage_legend()
    assert legend.startswith("D_s: the stage's delay, the weight updates it applies between")
    for words in ("stash: input-stash entries as built (`Stage.stash_entries` = D_s + 2",
                  "slots/tick: ", "pass cycles: "):  # fmt: skip
        assert words in legend
    table_end = text.index("| total |")
    assert text[table_end:].split("\n", 2)[2].startswith(legend)  # the line under the table
    assert f"\n{legend}\ntick: " in res.stderr


def test_logic_low_bits_text_gives_the_limit_and_the_bits_used(ulx):
    """Second trial, item 3: "`logic_low_bits` = 8" (the limit) beside "the low 6 bits" (what
    m·u of the 24-bit u forms in logic) read as a contradiction; the report now says both."""
    _, text, plan = ulx
    assert plan["logic_low_bits"] == 8 and plan["stages"][0]["formats"]["u"]["bits"] == 24
    assert (
        "forms the constant × the low bits in logic (a select-add of up to 8 low bits, "
        "`logic_low_bits` = 8; 6 used here; the same integers), so m·u takes one block for a u "
        "of up to 26 bits"
    ) in text
    assert (
        "`momentum` takes the top 18 bits of its variable operand, the constant × the low 6 "
        "bits is a select-add in logic (6 of the up to 8 `logic_low_bits` allows)"
    ) in text
