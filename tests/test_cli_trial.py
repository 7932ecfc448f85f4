"""The fresh-user trial's leftovers, each pinned to its exact new behaviour: what ``train
--json`` says about the run, ``compile --on-chip-data``, the interlocking output (head stages,
the ``d`` column, one loss naming L1 … LK), ``--distance 0``, the unknown-model list, resume
messages, the golden model's head counters in a snapshot, a CNN's input shape taken from the
data, the experiment's progress bar width, the conv refusal sentence. All on small nets and
the golden / reference targets (no RTL)."""

from __future__ import annotations

import pytest
from pipetrain.compiler.build import PlanError
from pipetrain.compiler.plan import QFormat, StageFormats
from test_train_cli import npz40, report_of, run

__all__ = ["npz40"]  # a fixture (80 train / 40 test samples of 40 features, 4 classes)


#: A local-learning run of the data-sized mlp (40 → 8 → 4, a head after stage 1): one epoch.
LOCAL = ("--hidden", "8", "--target", "golden", "--formats", "default", "--strategy", "local",
         "--blocks", "1")  # fmt: skip


@pytest.fixture(scope="module")
def local_run(npz40):
    """``train mlp`` with local learning on the golden target, one epoch, ``--json -``."""
    res = run(
        "train", "mlp", "--data", npz40, *LOCAL, "--lr", "0.02", "--momentum", "0.5",
        "--seed", "3", "--epochs", "1", "--mitigation", "sc", "--json", "-",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    return res


def test_train_json_says_how_the_run_was_made(local_run):
    rep = report_of(local_run)
    assert rep["settings"] == {
        "schedule": "pb", "lr": 0.02, "momentum": 0.5, "weight_decay": 0.0, "batch_ref": 1,
        "mitigation": "sc", "lwp_form": "v", "strategy": "local", "distance": 1,
        "rule": "only", "blocks": [1], "head_stages": 1, "loss": "cross_entropy",
        "rounding": "stochastic", "seed": 3, "epochs": 1, "momentum_digits": 0,
        "lfsr_leap": 0,
    }  # fmt: skip
    # the keys that were there keep their values
    assert (rep["epochs"], rep["schedule"], rep["mitigation"]) == (1, "pb", "sc")
    assert rep["train_samples"] == 80 and len(rep["head_online_accuracy"]) == 1


def test_compile_takes_on_chip_data_as_build_does(tmp_path):
    """``compile --on-chip-data N --board B`` fits the plan with the set counted, exactly as
    ``build`` does (the same ``compile_design(onchip_samples=N)``); the option is build's own
    definition (same help); without ``--board`` it is a one-line error, nothing written."""
    from pipetrain.host.cli.build import build_cmd
    from pipetrain.host.cli.compile import compile_cmd
    from pipetrain.host.flow import compile_design

    opts = ("--board", "ulx3s-85f", "--formats", "default", "--lanes", "4,1")
    res = run("compile", "mlp-digits", *opts, "--on-chip-data", "1437", "--out",
              str(tmp_path / "a"), "--json", "-")  # fmt: skip
    assert res.exit_code == 0, res.output
    rep = report_of(res)
    kw = {"board": "ulx3s-85f", "formats": "default", "lanes": [4, 1], "writers": ()}
    assert rep["fit"] == compile_design("mlp-digits", onchip_samples=1437, **kw).fit
    assert rep["onchip_samples"] == 1437
    # the set's block RAMs: 124 with it, 24 without (ECP5 DP16KD, the link's included; 132
    # before the result buffer was packed: 1437 × 11 bytes in 8 blocks, not 16)
    assert rep["fit"]["bram_blocks"]["needed"] == 124
    assert compile_design("mlp-digits", **kw).fit["bram_blocks"]["needed"] == 24
    assert "with an on-chip training set of 1437 samples (needed/available)" in res.stderr
    helps = [
        next(p.help for p in cmd.params if p.name == "onchip_samples")
        for cmd in (compile_cmd, build_cmd)
    ]
    assert helps[0] == helps[1] and "its memories count in the fit" in helps[0]
    res = run("compile", "mlp-digits", "--on-chip-data", "10", "--out", str(tmp_path / "b"))
    assert res.exit_code == 2
    assert res.output.strip() == (
        "Error: --on-chip-data 10 counts an on-chip training set in a board's fit: add --board "
        "NAME (the board you build with --on-chip-data), or drop --on-chip-data"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_interlocking_output_marks_heads_explains_d_and_names_losses_l1_to_lk(local_run, tmp_path):
    """The saturation table marks the head stage, says under it what ``d`` counts, and names
    the loss units L1 (the head's) and L2 (the true loss) — as the head accuracy line and
    report.md do (its loss-unit table and memory owners; no ``L_K``, no ``head_loss1``)."""
    err = local_run.stderr.splitlines()
    first = err.index("saturations per tensor (golden):")
    names = [ln[2:13].rstrip() for ln in err[first + 2 : first + 7]]
    assert names == ["1", "2", "3 (head 1)", "loss L1", "loss L2"]
    assert err[first + 7] == (
        "  d: δ clamps of a loss unit (docs/numerics.md §4.6), or of a stage's δ sum (§5.6)"
    )
    assert any(ln.startswith("head accuracy during training (the heads' loss units): L1 ")
               for ln in err)  # fmt: skip
    rep = report_of(local_run)
    assert [r.get("head") for r in rep["tensor_saturations"][:3]] == [None, None, 1]
    res = run("compile", "mlp-digits", "--formats", "default", "--strategy", "local",
              "--blocks", "1", "--out", str(tmp_path))  # fmt: skip
    assert res.exit_code == 0, res.output
    md = (tmp_path / "report.md").read_text()
    assert "| L2 (main)   | cross_entropy |" in md and "| L1 (head 1) | cross_entropy |" in md
    owners = {ln.split("|")[1].strip() for ln in md.splitlines() if "| loss L" in ln}
    assert owners == {"loss L1", "loss L2"}
    assert "head_loss" not in md and "L_K" not in md


def test_distance_zero_interlocking_is_local_with_a_warning(tmp_path):
    """d = 0 is documented as local learning (docs/architecture.md §2.4): interlocking with
    it compiles to the local plan (same hash) under either rule, and the warning says so and
    names --strategy local; the CLI prints it once."""
    from pipetrain.host.flow import compile_design

    def compiled(**cfg):
        return compile_design(
            "mlp-digits", formats="default", config_overrides={"blocks": (1,), **cfg}, writers=()
        )

    local = compiled(strategy="local")
    warning = (
        "--distance 0 with --strategy interlocking is local learning (block k is updated by "
        "its own loss L_k alone): training it as --strategy local, the same plan; say "
        "--strategy local, or give --distance 1 or more for interlocking learning"
    )
    for rule in ("only", "sum"):
        res = compiled(strategy="interlocking", distance=0, rule=rule)
        assert res.plan.hash == local.plan.hash and res.config.strategy == "local"
        assert res.warnings == [warning] and local.warnings == []
    args = ["--strategy", "interlocking", "--blocks", "1", "--distance", "0"]
    res = run("compile", "mlp-digits", "--formats", "default", *args, "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    assert res.stderr.count("warning: ") == 1 and f"warning: {warning}" in res.stderr
    assert "strategy local" in res.stdout.splitlines()[0]


def test_unknown_model_lists_every_built_in_mlp_included():
    from pipetrain.compiler.compile import compile_result
    from pipetrain.compiler.models import BUILTIN_MODELS, ModelError

    res = run("compile", "no-such-model")
    assert res.exit_code == 2
    assert res.output.strip() == (
        f"Error: unknown model 'no-such-model': give a built-in name ({', '.join(BUILTIN_MODELS)}"
        ", or mlp, sized from the data) or a path to a Python file that defines `model`"
    )
    # the compiler alone has no data to size it: it says where mlp is built
    with pytest.raises(ModelError, match=r"^model 'mlp' is sized from the data: compile it wi"):
        compile_result("mlp", formats="default", writers=())


def test_resume_says_where_it_continues_and_counts_epochs_right(npz40, tmp_path):
    from pipetrain.host.checkpoint import Checkpoint
    from pipetrain.host.cli.train import resume_point

    ck = tmp_path / "ck.json"
    args = ("train", "mlp", "--data", npz40, "--hidden", "8", "--target", "golden",
            "--formats", "default")  # fmt: skip
    res = run(*args, "--epochs", "1", "--checkpoint", str(ck))
    assert res.exit_code == 0, res.output
    res = run(*args, "--epochs", "1", "--resume", str(ck))
    assert res.exit_code == 2 and res.output.strip() == (
        "Error: the checkpoint is at sample 80 of the run, which has 80 (1 epoch): nothing is "
        "left to train; raise --epochs"
    )
    res = run(*args, "--epochs", "3", "--resume", str(ck))
    assert res.exit_code == 0, res.output
    where = f"{ck} at epoch 2 of 3 (sample 0 of 80 in it; from sample 80 of the run)"
    lines = res.output.splitlines()
    assert f"resuming {where}" in lines and f"resumed: {where}" in lines
    assert lines.index(f"resuming {where}") < lines.index(f"resumed: {where}")
    loaded = Checkpoint.load(ck)
    loaded.position = 150  # mid-epoch: epoch 2 of the run's 80-sample epochs, 70 samples in
    assert resume_point("f.json", loaded, 3) == (
        "f.json at epoch 2 of 3 (sample 70 of 80 in it; from sample 150 of the run)"
    )


def _local_plan():
    """The tiny 6 → 5 → 3 net of tests/test_host_device.py with a head after stage 1."""
    from pipetrain.compiler.build import build_plan
    from pipetrain.compiler.config import TrainConfig
    from test_host_device import IR

    cfg = TrainConfig(strategy="local", blocks=(1,), momentum=0.9, lr=0.05, seed=3)
    return build_plan(IR, cfg, lanes=[2, 1, 1]), cfg


def test_golden_snapshot_keeps_the_heads_correct_counters():
    """Snapshot mid-run (60 of 120 samples, heads on), restore into a fresh model, continue:
    the heads' counters equal the uninterrupted run's, as every other counter does."""
    from pipetrain.sim.golden import GoldenError, GoldenModel
    from test_host_device import make_data, make_model

    plan, cfg = _local_plan()
    x, y = make_data(120, 0)
    a = GoldenModel(plan, make_model(), cfg)
    a.train(x[:60], y[:60])
    snap = a.snapshot()
    assert snap["head_correct"] == a.head_correct and sum(a.head_correct) > 0
    b = GoldenModel(plan, make_model(), cfg)
    b.restore(snap)
    b.train(x[60:], y[60:])
    a.train(x[60:], y[60:])
    whole = GoldenModel(plan, make_model(), cfg)
    whole.train(x[:60], y[:60])
    whole.flush()  # where the snapshot flushed
    whole.train(x[60:], y[60:])
    assert b.head_correct == a.head_correct == whole.head_correct
    assert b.head_correct[0] > snap["head_correct"][0]  # counted on from the snapshot
    assert b.stage_saturations == whole.stage_saturations
    assert b.weights_hash() == whole.weights_hash()
    del snap["head_correct"]  # a snapshot from before the heads' counters were saved
    with pytest.raises(GoldenError, match="0 head_correct counters; the plan has 1 heads"):
        GoldenModel(plan, make_model(), cfg).restore(snap)


def _heads_backend():
    """tests/test_host_device.py's GoldenBackend (the golden model behind the link device
    model) with the heads' counters after the saturation counters (docs/protocol.md §4)."""
    from test_host_device import GoldenBackend

    class HeadsBackend(GoldenBackend):
        def counters(self):
            g = self.g
            return g.samples_applied, g.ticks, [*g.stage_saturations, *g.head_correct]

    return HeadsBackend


def test_link_resume_with_heads_counts_the_whole_run(tmp_path, monkeypatch):
    """A link run with a head, interrupted after a checkpoint and resumed on a fresh device:
    ``head_correct`` covers the whole run (the checkpoint's counts added on the host, the
    golden shadow's restored) and equals the golden target's uninterrupted run."""
    from pipetrain.host import open as open_device
    from pipetrain.host.checkpoint import Checkpoint
    from pipetrain.sim.golden import GoldenModel
    from test_checkpoint import Crash, crash_after
    from test_host_device import make_data, make_model, serve_device

    monkeypatch.setattr("test_host_device.GoldenBackend", _heads_backend())
    plan, cfg = _local_plan()
    x, y = make_data(40, 0)
    with open_device(plan, "golden", cfg, model=make_model()) as dev:
        dev.train(x, y, epochs=3, checkpoint_every=15)
        want = dev.counters()["head_correct"]
    path = tmp_path / "ck.json"
    with serve_device(plan, GoldenModel(plan, make_model(), cfg)) as url:
        with open_device(plan, url, cfg, model=make_model(), shadow=True) as dev:
            crash_after(dev.client, "send_samples", 5)  # 4 segments of 15 done
            with pytest.raises(Crash):
                dev.train(x, y, epochs=3, checkpoint=path, checkpoint_every=15)
    ck = Checkpoint.load(path)
    assert ck.position == 60 and len(ck.counters["head_correct"]) == 1
    with serve_device(plan, GoldenModel(plan, make_model(), cfg)) as url:
        with open_device(plan, url, cfg, model=make_model(), shadow=True) as dev:
            dev.train(x, y, epochs=3, resume=ck)
            v = dev.verify()
            assert v.bit_exact, v.mismatches
            assert dev.counters()["head_correct"] == want
            assert want[0] > ck.counters["head_correct"][0] > 0


#: A Conv1d model file without ``input_shape``: MaxPool1d(3) over L positions gives the
#: Linear its 4·5 = 20 values for L = 15, 16 or 17; the front end's guess is 15 (no window cut).
POOL3_CNN = (
    "from torch import nn\n"
    "model = nn.Sequential(nn.Conv1d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool1d(3),\n"
    "                      nn.Flatten(), nn.Linear(20, 2))\n"
)


def test_a_cnn_takes_its_input_shape_from_the_data(tmp_path):
    """With data of (n, 1, 16) samples the front end takes L = 16 from it instead of guessing
    15; flat (n, 16) samples give a Conv1d the same (C, F / C); without data the guess stays;
    data that the network cannot take names the data's shape in the error."""
    from pathlib import Path

    import numpy as np
    from conv_nets import bump_data
    from pipetrain.host.flow import compile_design

    model = tmp_path / "pool3.py"
    model.write_text(POOL3_CNN)
    seq, flat, long = tmp_path / "seq.npz", tmp_path / "flat.npz", tmp_path / "long.npz"
    bump_data(seq, n_train=32, n_test=8, length=16)
    arrays = dict(np.load(seq))
    np.savez(flat, **{k: v.reshape(len(v), -1) if k.startswith("x") else v
                      for k, v in arrays.items()})  # fmt: skip
    bump_data(long, n_train=32, n_test=8, length=20)

    def in_size(data: Path | None = None) -> tuple[int, ...]:
        res = compile_design(str(model), data=data and str(data), formats="default", writers=())
        return res.plan.stages[0].conv.in_size

    assert in_size() == (15,)  # no data: the smallest size with no pooling window cut
    assert in_size(seq) == (16,) == in_size(flat)
    res = run("train", str(model), "--data", str(seq), "--target", "golden", "--formats",
              "default", "--epochs", "1")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "32 samples" in res.output.splitlines()[0]
    res = run("compile", str(model), "--data", str(long), "--formats", "default")
    assert res.exit_code == 2
    assert res.output.strip() == (
        "Error: module '4' (Linear) expects 20 inputs but the convolution '0' gives 4×6 = 24 "
        "values per sample (input shape (1, 20), the data's samples): make it nn.Linear(24, 2)"
    )


def test_experiment_progress_bar_fits_80_columns(capsys, monkeypatch):
    """The bar goes to stderr, here no terminal and no $COLUMNS (as through ``| tee``): it
    keeps to 80 columns, its long postfix (depth, method, lr, seed) trimmed — every redraw."""
    import torch
    from pipetrain.data import Dataset
    from pipetrain.sim.experiment import run_experiment
    from pipetrain.sim.trainer import bar_columns

    monkeypatch.delenv("COLUMNS", raising=False)
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(8, 4, generator=g), torch.arange(8) % 2
    data = Dataset("tiny", x, y, x, y)
    run_experiment(data, [1], ["pb+sc+lwp"], 12, 1, [0.000123], width=4, progress=True)
    draws = [d for d in capsys.readouterr().err.replace("\n", "\r").split("\r") if d.strip()]
    assert len(draws) >= 12 and all(d.startswith("experiment:") for d in draws)
    assert max(len(d) for d in draws) <= 80, max(draws, key=len)
    assert bar_columns() == 80
    monkeypatch.setenv("COLUMNS", "60")
    assert bar_columns() == 60  # an exported terminal width wins over the default


def test_sim_refuses_an_interlocking_conv_stage_in_one_clear_sentence():
    """What is not built (a conv stage's several backward streams), what is (one: global or
    local learning) and what runs this plan instead, in one sentence: the line ``pipetrain
    sim`` prints after ``Error:`` (its CLI path: tests/test_conv_refusals.py)."""
    from pipetrain.hdl.support import HDLSupportError, require_hdl
    from pipetrain.host.flow import compile_design

    cfg = {"strategy": "interlocking", "blocks": (1, 2), "distance": 1}
    plan = compile_design("cnn-digits", formats="default", config_overrides=cfg, writers=()).plan
    try:
        require_hdl(plan, "sim")
    except HDLSupportError as exc:
        message = str(exc)
    else:
        pytest.skip("the HDL builds interlocking conv stages now: no refusal to test")
    assert message == (
        "stage 2 (conv2d): 2 backward streams (interlocking learning) are not built for a "
        "convolution stage, only one: use --strategy global or local; or train it with "
        "`pipetrain train MODEL --target golden` (or reference), which runs it in process "
        "(pipetrain sim runs the RTL only)"
    )


def test_format_help_explains_negative_integer_bits():
    """``--format`` documents Qi.f with a negative i (README says the same): Q-1.16 is 16 bits
    whose largest value is 2^-1 − 2^-16, below 0.5."""
    from pipetrain.compiler.formats import parse_qformat

    res = run("compile", "--help")
    assert "may be negative: Q-1.16 is 16 bits below 0.5" in " ".join(res.output.split())
    q = parse_qformat("Q-1.16")
    assert (q.bits, q.frac, q.max_value) == (16, 16, 2**-1 - 2**-16)


# --- the second user trial: names, the board in report.md, and hints that say what to do ---


def test_fit_errors_and_list_boards_say_dsp_blocks_for_hard_blocks():
    """*DSP blocks* are the board's hard multipliers (MULT18X18D / SB_MAC16), *multipliers*
    the datapath's products; the fit rows keep their JSON key ``multipliers``."""
    from types import SimpleNamespace

    from pipetrain.compiler.fit import FitError, check_fit
    from pipetrain.compiler.targets import BOARDS

    plan = SimpleNamespace(name="big", memory_bits=1000, multipliers=200, memory_blocks=1)
    with pytest.raises(FitError) as e:
        check_fit(plan, BOARDS["ulx3s-85f"])
    assert "200 DSP blocks needed, 156 available (18×18 MULT18X18D, for the datapath's 200 " \
        "multipliers)" in str(e.value)  # fmt: skip
    assert "multipliers needed" not in str(e.value)
    assert e.value.rows["multipliers"] == {"needed": 200, "available": 156}
    res = run("list-boards")
    assert res.exit_code == 0, res.output
    assert "156 DSP blocks (18×18 MULT18X18D)" in res.output
    assert "8 DSP blocks (16×16 SB_MAC16)" in res.output and " multipliers" not in res.output


def test_report_names_the_board_and_its_fit_near_the_top(tmp_path):
    """``compile --board`` writes the board and its fit table (needed / available, the JSON's
    ``fit``) into report.md before the stage table; the multiplier table names multipliers
    and their DSP blocks, and says the iCE40's 16×16 count is the fit's; without a board the
    report says it is not fitted."""
    from pipetrain.compiler.report import fit_label
    from pipetrain.compiler.targets import BOARDS

    res = run("compile", "mlp-digits", "--board", "icebreaker", "--formats", "default",
              "--out", str(tmp_path / "b"), "--json", "-")  # fmt: skip
    assert res.exit_code == 0, res.output
    rep = report_of(res)
    assert rep["fit"]["multipliers"] == {"needed": 6, "available": 8}
    assert "fitted to icebreaker (needed/available): DSP blocks 6/8, SPRAM 4/4" in res.stderr
    text = (tmp_path / "b" / "report.md").read_text()
    assert "- board: `icebreaker` (fitted; see Board below)" in text
    assert text.index("## Board: icebreaker") < text.index("## Stages")
    assert "1BitSquared iCEBreaker, Lattice iCE40UP5K; `--board icebreaker`): its 24 MHz" in text
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 3 and cells[0] != "resource" and not cells[0].startswith("-"):
            rows[cells[0]] = (int(cells[1].replace(",", "")), int(cells[2].replace(",", "")))
    board = BOARDS["icebreaker"]
    assert rows == {
        fit_label(k, board): (v["needed"], v["available"]) for k, v in rep["fit"].items()
    }
    assert rows["DSP blocks (16×16 SB_MAC16)"] == (6, 8)
    assert rows["block RAMs (link's included)"] == (21, 30)
    assert "## Multipliers and their DSP blocks (docs/numerics.md" in text
    assert "| stage | multiplier | operand bits | DSP blocks/lane | lanes | DSP blocks |" in text
    assert "on this board's 16 × 16 SB_MAC16 blocks the design takes 6, Board above" in text

    res = run("compile", "mlp-digits", "--formats", "default", "--out", str(tmp_path / "n"))
    assert res.exit_code == 0, res.output
    text = (tmp_path / "n" / "report.md").read_text()
    assert "- board: none (not fitted to a board; `--board NAME` fits it)" in text
    assert "## Board" not in text and "the design takes" not in text


def test_one_lane_count_too_big_for_a_later_stage_suggests_per_stage_lanes_and_auto(tmp_path):
    """``--lanes 16`` on 64→32→10 gives stage 2 (10 rows) 16 lanes: the error names the
    per-stage lanes that do (the count kept where it fits, the other stages balanced to its
    pass: 16,4) and ``--lanes auto``."""
    from pipetrain.compiler.build import PlanError
    from pipetrain.compiler.config import TrainConfig
    from pipetrain.compiler.frontend import trace
    from pipetrain.compiler.lanes import choose_lanes
    from pipetrain.compiler.models import load_model

    res = run("compile", "mlp-digits", "--formats", "default", "--lanes", "16", "--out",
              str(tmp_path / "a"))  # fmt: skip
    assert res.exit_code == 2
    assert res.output.strip() == (
        "Error: stage 2 (2): lanes=16 must be in 1..10 (one lane per output row at most; the "
        "stage has 10 rows); --lanes 16 gives every stage 16 lanes; give one count per stage "
        "(e.g. --lanes 16,4), or --lanes auto (with --board the fastest plan that fits the "
        "board, else the default balance)"
    )
    name, module, _ = load_model("mlp-digits-wide")  # 64→128→64→10
    ir = trace(module, name)
    with pytest.raises(PlanError, match=r"\(e\.g\. --lanes 64,64,5\), or --lanes auto"):
        choose_lanes(ir, TrainConfig(), lanes=(64,))
    with pytest.raises(PlanError, match=r"lanes=12 must be in 1\.\.10.*--lanes 8,8,1\)") as e:
        # a list: no "every stage" clause; stage 3 needs 1 lane (650 cycles) for 8,8 (1,040)
        choose_lanes(ir, TrainConfig(), lanes=(8, 8, 12))
    assert "gives every stage" not in str(e.value)
    # lanes that do not fit the board name the ones that do and --lanes auto (as before)
    res = run("compile", "mlp-digits", "--board", "icebreaker", "--formats", "default",
              "--lanes", "16,4", "--out", str(tmp_path / "b"))  # fmt: skip
    assert res.exit_code == 2
    assert "with the lanes asked for (16,4); --lanes 1,1 fits" in res.output
    assert "(--lanes auto)" in res.output


def test_comma_joined_format_overrides_are_refused_naming_the_repeated_option(tmp_path):
    """One override per ``--format`` (documented in README and ``--help``): a comma-joined
    list is one clear error that spells the repeated options; those compile."""
    from pipetrain.compiler.formats import parse_format_overrides
    from pipetrain.compiler.plan import QFormat

    res = run("compile", "mlp-digits", "--formats", "default", "--format",
              "s1.x=Q3.12,w=Q3.20", "--out", str(tmp_path / "a"))  # fmt: skip
    assert res.exit_code == 2
    assert res.output.strip() == (
        "Error: --format 's1.x=Q3.12,w=Q3.20' joins 2 overrides with commas; give --format "
        "once per key: --format s1.x=Q3.12 --format w=Q3.20"
    )
    assert not (tmp_path / "a").exists()
    assert parse_format_overrides(["s1.x=Q3.12", "w=Q3.20"]) == {
        "s1.x": QFormat(16, 12),
        "w": QFormat(24, 20),
    }
    res = run("compile", "mlp-digits", "--formats", "default", "--format", "s1.x=Q3.12",
              "--format", "w=Q3.20", "--out", str(tmp_path / "b"), "--json", "-")  # fmt: skip
    assert res.exit_code == 0, res.output
    f1 = report_of(res)["stages"][0]["formats"]
    assert (f1["x"], f1["w"]) == ("Q3.12", "Q3.20")
    res = run("compile", "--help")
    assert "repeat --format once per key" in " ".join(res.output.split())


def test_link_connect_errors_name_the_address_and_what_to_check(npz40):
    """A ``tcp://`` target nobody listens on and a serial port that does not open: one line
    with the address and what to check (the bridge, the device path, permissions, a busy
    port), through ``pipetrain train`` too."""
    import errno
    import socket

    import serial
    from pipetrain.host.transport import TransportError, open_transport, serial_hint

    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(TransportError) as e:
        open_transport(f"tcp://127.0.0.1:{port}")
    msg = str(e.value)
    assert msg.startswith(f"cannot connect to tcp://127.0.0.1:{port}: ")
    assert f"nothing listens on port {port} of 127.0.0.1: is the device's bridge" in msg
    assert f"running and listening on tcp://127.0.0.1:{port}?" in msg and "--target sim" in msg
    with pytest.raises(TransportError, match="does not resolve: check the address"):
        open_transport("tcp://no-such-host.invalid:7000")
    with pytest.raises(TransportError) as e:
        open_transport("serial:///nonexistent/tty0")
    assert "cannot open serial port '/nonexistent/tty0' (serial:///nonexistent/tty0)" in str(
        e.value
    )
    assert "check the device path: is the board plugged in" in str(e.value)
    assert "dialout" in serial_hint(serial.SerialException(errno.EACCES, "denied"))
    assert "no other program" in serial_hint(serial.SerialException(errno.EBUSY, "busy"))
    other = serial_hint(serial.SerialException("odd"))  # no errno: every check
    assert "device path" in other and "dialout" in other and "no other program" in other

    res = run("train", "mlp", "--hidden", "4", "--data", npz40, "--formats", "default",
              "--epochs", "1", "--target", f"tcp://127.0.0.1:{port}")  # fmt: skip
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert f"nothing listens on port {port} of 127.0.0.1" in res.output


def test_sim_help_shows_the_defaults_of_schedule_mitigation_and_rounding():
    """``sim``'s --schedule/--mitigation/--rounding are the shared TrainConfig options: the
    same help and ``[default: …, or the model file's config]`` as compile and train."""
    from pipetrain.host.cli.compile import compile_cmd
    from pipetrain.host.cli.sim import sim_command

    def helps(cmd):
        return {p.name: getattr(p, "help", None) for p in cmd.params}

    sim, comp = helps(sim_command), helps(compile_cmd)
    for name in ("schedule", "mitigation", "rounding"):
        assert sim[name] == comp[name]
    assert sim["schedule"].endswith("[default: pb, or the model file's config]")
    assert sim["mitigation"].endswith("[default: none, or the model file's config]")
    assert sim["rounding"].endswith("[default: stochastic, or the model file's config]")
    text = " ".join(run("sim", "--help").output.split())
    assert "[default: pb, or the model file's config]" in text


def test_every_board_option_is_a_choice_of_the_boards():
    """``--board`` of compile, train, sim, build and deploy: a click.Choice of the boards
    (``--help`` lists them; a wrong name is refused before any work)."""
    import click
    from pipetrain.compiler.targets import BOARDS
    from pipetrain.host.cli import cli

    with_board = {}
    for name in cli.list_commands(None):
        for p in cli.get_command(None, name).params:
            if "--board" in getattr(p, "opts", ()):
                with_board[name] = p
    assert sorted(with_board) == ["build", "compile", "deploy", "sim", "train"]
    for p in with_board.values():
        assert isinstance(p.type, click.Choice) and list(p.type.choices) == sorted(BOARDS)
    assert with_board["build"].required and not with_board["train"].required
    res = run("train", "--board", "ICEbreaker", "--target", "golden")
    assert res.exit_code == 2 and "is not one of 'icebreaker', 'ulx3s-85f'" in res.output


def test_readme_says_linear_layers_need_their_bias():
    """README's own-model section says what the front end requires of a Linear: its bias; the
    refusal names the same fix."""
    from pathlib import Path

    from pipetrain.compiler.frontend import trace
    from pipetrain.compiler.models import ModelError
    from torch import nn

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    own = readme[readme.index("Supported layers:") : readme.index("## Benchmarks")]
    assert "`Linear` with its bias (`bias=True`, PyTorch's default" in " ".join(own.split())
    with pytest.raises(ModelError, match=r"has no bias.*use nn.Linear\(\.\.\., bias=True\)"):
        trace(nn.Sequential(nn.Linear(4, 2, bias=False)), "nobias")


def test_a_format_one_lsb_short_asks_for_fraction_bits_or_an_integer_bit():
    """max|w| = 0.949 under Q0.4 (largest 0.9375): Q0.4 has its 0 integer bits already, so the
    hint names the fraction bits that reach it (Q0.5: 0.96875) or one integer bit — not "≥ 0
    integer bits" (the third trial's report)."""
    from pipetrain.compiler.build import _check_formats

    class Slot:
        index, name = 2, "2"

    f = StageFormats(
        x=QFormat(12, 9), y=QFormat(12, 7), d=QFormat(12, 10), gin=None,
        w=QFormat(5, 4), u=QFormat(5, 4),
    )  # fmt: skip
    with pytest.raises(PlanError) as err:
        _check_formats(Slot(), f, {"w": 0.949357})
    assert str(err.value).endswith(
        "(largest value 0.9375); it needs more fraction bits (Q0.5) or ≥ 1 integer bits"
    )
    with pytest.raises(PlanError) as err:  # 0.99: five fraction bits reach only 0.96875
        _check_formats(Slot(), f, {"w": 0.99})
    assert "more fraction bits (Q0.7) or ≥ 1 integer bits" in str(err.value)
    with pytest.raises(PlanError) as err:  # above 1: integer bits only
        _check_formats(Slot(), f, {"w": 2.5})
    assert str(err.value).endswith("it needs ≥ 2 integer bits")


def test_memory_budget_error_formats_its_figures():
    """Second trial, item 4: the ``--memory-budget`` refusal gave its bit counts without
    thousands separators (``134216``, ``65536``) while every other figure has them."""
    res = run("compile", "mlp-digits", "--formats", "default", "--memory-budget", "64Kib")
    assert res.exit_code == 2
    assert (
        "the design needs 134,216 memory bits (131.1 Kib) but the budget is 65,536 bits "
        "(64.0 Kib); the largest is stage 1 (0) with 106,272 bits; use narrower formats"
    ) in res.output


def test_readme_conv_table_gives_mlp_digits_current_memory_and_multipliers():
    """Second trial, item 5: README's plan table quoted 133,728 memory bits and 16 multipliers
    for ``mlp-digits`` at lanes 4,1; the rows now hold the plan's figures as
    ``benchmarks/conv.py`` reads them (``plan_figures``: ``Plan.memory_bits``, the stages'
    ``Plan.multipliers``)."""
    from pathlib import Path

    from pipetrain.benchmarks.conv import plan_figures
    from pipetrain.host.flow import compile_design

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    row = next(ln for ln in readme.splitlines() if ln.startswith("| `mlp-digits` | 4,1 | "))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    fig = plan_figures(compile_design("mlp-digits", seed=0).plan)
    assert fig["lanes"] == [4, 1]
    assert cells[2] == f"{fig['ideal_cycles_per_sample']:,}"
    assert cells[5:] == [
        f"{fig['multiplies_per_sample']:,}",
        f"{fig['memory_bits']:,}",
        f"{fig['stash_bits']:,}",
        str(fig["multipliers"]),
    ]


# --- the third user trial: command summaries, the MODEL names, --formats ---


def test_command_summaries_say_what_each_command_does_in_full():
    """``pipetrain --help`` lists each command by its docstring's first sentence: train's says
    it trains (compiling is a step), and none is cut short (``...``) at 80 columns."""
    res = run("--help")
    assert res.exit_code == 0, res.output
    listing = res.output.split("Commands:", 1)[1]
    lines = {ln.split()[0]: " ".join(ln.split()[1:]) for ln in listing.splitlines() if ln.strip()}
    assert lines == {
        "build": "Build MODEL's bitstream for --board with Yosys/nextpnr.",
        "compile": "Compile MODEL into a plan, report and Verilog (no training).",
        "deploy": "Load BITSTREAM onto --board with openFPGALoader or iceprog.",
        "experiment": "Compare test accuracy of sgd, pb and mitigations by depth.",
        "list-boards": "List supported boards and their resource budgets.",
        "sim": "Simulate MODEL's RTL and check it against the golden model.",
        "train": "Train MODEL on --target and report its test accuracy.",
    }
    text = " ".join(run("train", "--help").output.split())
    assert "Train MODEL on --target and report its test accuracy. MODEL: a built-in" in text
    assert "MODEL is compiled into a plan first, as `pipetrain compile` does" in text


@pytest.mark.parametrize("command", ["train", "compile", "build", "sim"])
def test_model_help_lists_the_builtin_models_and_mlp(command):
    """Every command that takes MODEL lists the built-in names, from ``BUILTIN_MODELS`` (so the
    list cannot go stale), and the data-sized ``mlp`` (each compiles through
    ``compile_design``, which builds it), right after its summary."""
    from pipetrain.compiler.models import BUILTIN_MODELS
    from pipetrain.host.cli.options import model_text

    text = " ".join(run(command, "--help").output.split())
    names = ", ".join(BUILTIN_MODELS)
    assert f"MODEL: a built-in network ({names}); mlp, a ReLU MLP sized from the data" in text
    assert "or a FILE.py that defines `model`" in text
    own = {
        "train": model_text("mlp-digits"),  # train's default MODEL
        "build": model_text(also="No MODEL with --loopback."),
    }.get(command, model_text())
    assert " ".join(own.split()) in text
    assert ("[default: mlp-digits]" in text) == (command == "train")


def test_model_text_follows_builtin_models(monkeypatch):
    """The MODEL paragraph is generated: a new built-in appears in it."""
    from pipetrain.compiler import models
    from pipetrain.host.cli import options

    monkeypatch.setitem(models.BUILTIN_MODELS, "mlp-new", lambda: None)
    assert "cnn1d-digits, mlp-new); mlp," in options.model_text()


@pytest.mark.parametrize("command", ["train", "compile", "build"])
def test_formats_help_says_when_to_pick_each(command):
    """``--formats``: one sentence per choice that tells static (no data: the fixed formats,
    widened for the initial weights) from default (the fixed formats exactly)."""
    text = " ".join(run(command, "--help").output.split())
    for sentence in (
        "auto: formats calibrated by a training run on --data (float reference, then golden "
        "passes), for when you have the model's training data (compile/build without --data, "
        "for a model digits does not fit: static).",
        "static: for a model without data, the fixed formats (x/y Q5.10, d Q1.14, w/u Q3.20) "
        "with w/u given more integer bits where the initial weights need them.",
        "default: the fixed formats exactly, never widened (larger initial weights clamp), the "
        "same for every model and seed, e.g. to compare plans.",
    ):
        assert sentence in text


def test_static_and_default_formats_differ_as_the_help_says():
    """What the help says: ``static`` widens w/u of a stage whose initial weights exceed the
    fixed Q3.20 (here stage 1's weights scaled to 20) and says the formats are uncalibrated;
    ``default`` keeps Q3.20 there."""
    import torch
    from pipetrain.compiler.models import build_mlp
    from pipetrain.host.flow import compile_design

    def stage1(formats):
        torch.manual_seed(0)
        m = build_mlp([8, 4, 2])
        with torch.no_grad():
            m[0].weight.mul_(0).add_(20.0)
        plan = compile_design(m, formats=formats, writers=()).plan
        return plan.stages[0].formats

    st, df = stage1("static"), stage1("default")
    assert str(df.w) == "Q3.20" and str(df.x) == str(st.x) == "Q5.10"
    assert st.w.frac < df.w.frac and st.w.bits == df.w.bits == 24
