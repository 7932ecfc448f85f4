"""First use without data: ``pipetrain compile`` of a model file with no ``--data`` (static,
uncalibrated formats, said in the report), built-ins calibrating on their default data set,
clear errors naming ``--data FILE.npz`` where data must fit, and ``mlp`` sized from the data in
every command."""

import json
import os
import warnings

import pytest
import torch
from click.testing import CliRunner
from pipetrain.compiler.build import FormatSpec, PlanError
from pipetrain.compiler.compile import compile_result
from pipetrain.compiler.plan import Plan, QFormat
from pipetrain.host.cli import cli
from torch import nn

#: A 20-input model: the default data set (digits, 64 features) does not fit it.
M20 = (
    "from torch import nn\nmodel = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 4))\n"
)


def _run(args, cwd):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, args, catch_exceptions=False)
    finally:
        os.chdir(old)


def test_compile_model_file_without_data_writes_static_formats(tmp_path):
    (tmp_path / "m20.py").write_text(M20)
    res = _run(["compile", "m20.py", "--out", "o", "--json", "-"], tmp_path)
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["formats_source"] == "static"
    assert sorted(os.listdir(tmp_path / "o")) == ["m20.v", "plan.json", "report.md"]
    plan = Plan.from_json((tmp_path / "o" / "plan.json").read_text())
    assert plan.in_features == 20 and plan.hash == out["plan_hash"]
    default = FormatSpec.default(2)  # PyTorch's init (|w| ≤ 1/√20) fits Q3.20: nothing widened
    assert [(s.formats.x, s.formats.w, s.formats.u) for s in plan.stages] == [
        (default.x[i], default.w[i], default.u[i]) for i in range(2)
    ]
    report = (tmp_path / "o" / "report.md").read_text()
    assert "formats: static — not calibrated" in report
    assert "formats not calibrated" in report and "--data FILE.npz" in report
    assert "formats not calibrated" in res.stderr and "--data FILE.npz" in res.stderr
    assert "module m20" in (tmp_path / "o" / "m20.v").read_text()


def test_static_formats_widen_w_for_large_initial_weights():
    model = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 4))
    with torch.no_grad():
        model[2].weight[1, 3] = -10.0  # × headroom 2 = 20: needs 5 integer bits of 24
    res = compile_result(model, formats="static")
    fs = res.formats
    assert fs.source == "static"
    assert fs.w == (QFormat(24, 20), QFormat(24, 18)) and fs.u == fs.w  # Q3.20, Q5.18
    assert "widened for the initial weights: s2.w=Q5.18" in fs.notes[0]
    assert res.plan.stages[1].formats.w == QFormat(24, 18)


def test_builtin_without_data_calibrates_on_digits_and_says_so(tmp_path):
    res = _run(
        ["compile", "mlp-digits", "--calib-samples", "300", "--out", "a", "--json", "-"], tmp_path
    )
    out = json.loads(res.stdout)
    assert out["formats_source"] == "auto"
    assert any("calibrated on 'digits'" in n for n in out["notes"])
    assert "calibrated on 'digits'" in (tmp_path / "a" / "report.md").read_text()
    from pipetrain.host.flow import compile_design

    given = compile_design("mlp-digits", data="digits", calib_samples=300, writers=())
    assert given.plan.hash == out["plan_hash"]  # the same calibration
    assert not any("calibrated on" in n for n in given.formats.notes)  # data given: no note


@pytest.mark.parametrize(
    "args",
    [
        ["compile", "m20.py", "--data", "digits"],
        ["train", "m20.py", "--target", "golden"],
        ["train", "m20.py", "--target", "golden", "--formats", "default"],
        ["sim", "m20.py", "--samples", "2"],
    ],
)
def test_data_of_another_width_names_the_fix(tmp_path, args):
    (tmp_path / "m20.py").write_text(M20)
    res = _run([*args, "--json", "err.json"], tmp_path)
    assert res.exit_code == 2
    line = res.stderr.strip()
    assert "\n" not in line and line.startswith("Error: data 'digits' has 64 features")
    assert "--data FILE.npz" in line
    assert json.loads((tmp_path / "err.json").read_text())["error_type"] == "PlanError"
    assert not (tmp_path / "build").exists()  # nothing half-written


def test_open_without_data_compiles_uncalibrated_and_names_data():
    from pipetrain.host import open

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(13, 8), nn.ReLU(), nn.Linear(8, 3))
    x = torch.rand(12, 13)
    y = torch.arange(12) % 3
    with pytest.warns(UserWarning, match="pass data="):
        dev = open(net, "golden")
    with dev:
        assert dev.plan.in_features == 13
        assert dev.train(x, y, epochs=1).samples == 12
    with pytest.raises(PlanError, match="data= in the API"):
        open(net, "golden", data="digits")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # formats chosen explicitly: no warning
        open(net, "golden", formats="default").close()


def test_mlp_takes_hidden_in_compile_and_sim(tmp_path):
    args = ["compile", "mlp", "--hidden", "8", "--calib-samples", "200", "--out", "o"]
    res = _run([*args, "--json", "-"], tmp_path)
    out = json.loads(res.stdout)
    assert [(s["in_features"], s["out_features"]) for s in out["stages"]] == [(64, 8), (8, 10)]
    bad = _run(["sim", "mlp", "--hidden", "8,x"], tmp_path)  # fails before any RTL build
    assert bad.exit_code == 2 and "--hidden '8,x' must be layer sizes" in bad.stderr


@pytest.mark.parametrize("target", ["golden", "reference"])
def test_local_targets_print_no_link_fields(tmp_path, target):
    from test_host_sim import make_npz

    npz = str(make_npz(tmp_path / "bands.npz"))
    args = ["train", "mlp", "--hidden", "8", "--data", npz, "--target", target, "--epochs", "1"]
    res = _run([*args, "--formats", "default", "--json", "-"], tmp_path)
    assert res.exit_code == 0, res.stderr
    rep = json.loads(res.stdout)
    assert rep["bit_exact"] is None and rep["retransmits"] is None and rep["mismatches"] == []
    text = res.stderr
    assert f"mlp on {target}: 1 epoch, 80 samples, " in text
    for link_field in ("bit_exact", "retransmits", "trained by the device", "epoch(s)"):
        assert link_field not in text
    assert ("saturations: " in text) == (target == "golden")


def test_help_shows_training_defaults_and_describes_every_experiment_option():
    import click
    from pipetrain.host.cli.train import train_cmd

    ctx = click.Context(train_cmd)
    lines = {
        p.opts[0]: p.get_help_record(ctx)[1] for p in train_cmd.params if p.opts[0][:2] == "--"
    }
    for opt, default in [
        ("--lr", "0.002"),
        ("--momentum", "0.9"),
        ("--mitigation", "none"),
        ("--schedule", "pb"),
        ("--epochs", "the model file's config, else 4; not a plan field, but the auto formats"),
        ("--hidden", "32"),
    ]:
        assert f"[default: {default}" in lines[opt], lines[opt]
    from pipetrain.host.cli.experiment import experiment

    for p in experiment.params:
        assert getattr(p, "help", None), f"experiment {p.opts} has no description"


def test_c_library_probe_names_a_missing_header():
    from pipetrain.sim.verilator import c_library_problem

    problem = c_library_problem(("pipetrain_no_such_header.h",), ())
    assert problem is not None and "pipetrain_no_such_header.h" in problem
    assert c_library_problem(("cstdio",), ()) is None  # the C++ standard library always builds


def test_fst_waves_without_lz4_fail_before_compiling(tmp_path, monkeypatch):
    import pipetrain.sim.verilator as vl

    monkeypatch.setattr(vl, "c_library_problem", lambda h, libs: "no lz4" if "lz4.h" in h else None)
    res = _run(["sim", "mlp-digits", "--waves", "w.fst", "--samples", "2"], tmp_path)
    assert res.exit_code == 2
    line = res.stderr.strip()
    assert "\n" not in line and "lz4.h" in line and "liblz4-dev" in line
    assert "--waves FILE.vcd" in line and "zlib" not in line
    assert not (tmp_path / "w.fst").exists()


def test_design_cached_is_false_until_the_build_exists(tmp_path, monkeypatch):
    import shutil

    from pipetrain.sim.harness import cached_design, design_cached

    if shutil.which("iverilog") is None:
        pytest.skip("iverilog not on PATH (the fastest back end to build a design with)")
    monkeypatch.setenv("PIPETRAIN_RTL_CACHE", str(tmp_path / "cache"))
    verilog = (
        "module probe_top(input clk, output reg q);\nalways @(posedge clk) q <= ~q;\nendmodule\n"
    )
    args = ("probe", "probe_top", "identity-1")
    assert not design_cached(*args, simulator="icarus")
    build, _ = cached_design(*args[:2], args[2], lambda: verilog, simulator="icarus")
    assert not build.cached
    assert design_cached(*args, simulator="icarus")
    assert not design_cached("probe", "probe_top", "identity-2", simulator="icarus")


def test_plan_multipliers_and_dsp_blocks_count_different_things():
    """build.json's ``plan.multipliers`` (5) vs ``fit.multipliers.needed`` (6) on the iCEBreaker
    plan of mlp-digits: the plan counts the stages' multipliers the HDL instantiates
    (``Stage.products``: not the momentum, whose 5-bit constant is built from shifts and adders,
    and not the loss unit); the fit counts their DSP blocks, the loss unit's included."""
    from pipetrain.compiler.build import multiplier_operands, shift_add
    from pipetrain.compiler.fit import check_fit, plan_totals
    from pipetrain.compiler.targets import BOARDS
    from pipetrain.host.flow import compile_design

    board = BOARDS["icebreaker"]
    plan = compile_design("mlp-digits", board=board, formats="default", writers=()).plan
    assert [s.multipliers for s in plan.stages] == [2, 3]  # fwd, d·x (+ input gradient)
    assert all(shift_add(s.update.momentum.value) for s in plan.stages)  # no m·u multiplier
    assert [len(multiplier_operands(s)) for s in plan.stages] == [2, 3]
    assert [[p.name for p in s.products] for s in plan.stages] == [
        ["fwd", "lr_dx"],
        ["fwd", "gin", "lr_dx"],
    ]
    totals = plan_totals(plan, board)
    assert (totals["multipliers"], totals["hard_multipliers"]) == (5, 2 + 3 + 1)  # + loss unit
    assert check_fit(plan, board)["multipliers"]["needed"] == totals["hard_multipliers"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["experiment", "--seeds", "x"], "Invalid value for '--seeds': 'x' is not a valid integer"),
        (["train", "--lrr", "3"], "No such option '--lrr'. Did you mean '--lr'?"),
        (["sim"], "Missing argument 'MODEL'"),
    ],
)
def test_usage_errors_are_one_line(args, needle, capsys):
    from pipetrain.host.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    cmd = " ".join(["pipetrain", *args[:1]])
    assert err.count("\n") == 1 and err.startswith("Error: ") and needle in err
    assert err.endswith(f"(see '{cmd} --help')\n")


def test_an_internal_error_is_one_line_unless_asked(monkeypatch, capsys):
    """A bug of pipetrain's (not a UserError) reaches the user as one 'Internal error:' line
    naming the exception and PIPETRAIN_TRACEBACK, exit 1; with PIPETRAIN_TRACEBACK=1 the
    exception itself propagates (its traceback)."""
    import pipetrain.host.cli as cli_mod

    def broken(*args, **kwargs):
        raise RuntimeError("state_dict keys\n  differ")

    monkeypatch.setattr(cli_mod.cli, "main", broken)
    monkeypatch.delenv("PIPETRAIN_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        cli_mod.main(["train"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("Internal error: RuntimeError: state_dict")
    assert "keys differ" in err and "PIPETRAIN_TRACEBACK=1" in err
    monkeypatch.setenv("PIPETRAIN_TRACEBACK", "1")
    with pytest.raises(RuntimeError, match="state_dict keys"):
        cli_mod.main(["train"])


def test_a_model_digits_fits_calibrates_on_digits_without_data():
    """64 inputs, 10 outputs: the default data set fits, so (as train and build do) the formats
    are calibrated on digits, with a note; the plan equals the one with data='digits'."""
    from pipetrain.host.flow import compile_design

    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 10))

    res = compile_design(net(), calib_samples=100, writers=())
    assert res.formats.source == "auto"
    assert res.formats.notes[0].startswith("formats calibrated on 'digits', the default data set")
    given = compile_design(net(), data="digits", calib_samples=100, writers=())
    assert given.plan.hash == res.plan.hash and not given.formats.notes


def test_hidden_with_a_model_that_is_not_mlp_is_an_error(tmp_path):
    """--hidden sizes only 'mlp'; with another model it was silently ignored (the trial ran
    64→32→10 for `train mlp-digits --hidden 64`). Now one line naming the fix, nothing
    written; with 'mlp' it sizes the hidden layer."""
    out = tmp_path / "o"
    res = CliRunner().invoke(cli, ["compile", "mlp-digits", "--hidden", "64", "--out", str(out)])
    assert res.exit_code == 2 and not out.exists()
    assert "--hidden 64 sizes only the data-sized model 'mlp'" in res.output
    from pipetrain.host.flow import compile_design

    plan = compile_design("mlp", hidden="8", formats="default", writers=()).plan
    assert [s.out_features for s in plan.stages] == [8, 10]


@pytest.mark.parametrize(
    "args, needle",
    [
        # without --strategy the default global would ignore them
        (["--distance", "2"], "--distance applies to --strategy interlocking, and the strategy "
         "is global (the default): add --strategy interlocking, or drop --distance"),
        (["--rule", "only"], "--rule applies to --strategy interlocking"),
        # interlocking that collapses to global still checks its block boundaries
        (["--strategy", "interlocking", "--blocks", "8"], "auxiliary head on the last block"),
        (["--strategy", "interlocking", "--blocks", "9"], "strictly increasing stage numbers"),
    ],
)  # fmt: skip
def test_strategy_options_that_would_be_ignored_fail_cleanly(tmp_path, args, needle):
    res = _run(
        ["compile", "mlp-digits-deep8", *args, "--formats", "default", "--out", "o"],
        tmp_path,
    )
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("Error: ") and needle in res.stderr, res.stderr
    assert "Traceback" not in res.output
    assert os.listdir(tmp_path) == []


def test_distance_uses_the_model_files_strategy(tmp_path):
    """A model file's ``config`` may set the strategy: ``--distance`` then applies to it
    (interlocking: accepted, K = 3 blocks with d = 1 keeps its heads), or is refused naming the
    model file's config (local)."""
    from pipetrain.compiler.config import ConfigError
    from pipetrain.host.flow import compile_design

    body = (
        "from torch import nn\n"
        "model = nn.Sequential(nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(),\n"
        "                      nn.Linear(8, 10))\n"
        "config = {{'strategy': '{s}', 'blocks': (1, 2)}}\n"
    )
    (tmp_path / "inter.py").write_text(body.format(s="interlocking"))
    (tmp_path / "loc.py").write_text(body.format(s="local"))
    opts = dict(formats="default", config_overrides={"distance": 1}, writers=())
    plan = compile_design(str(tmp_path / "inter.py"), **opts).plan
    assert [s.role for s in plan.stages].count("main") == 3 and len(plan.stages) == 5
    with pytest.raises(ConfigError, match=r"and the strategy is local \(the model file's config"):
        compile_design(str(tmp_path / "loc.py"), **opts)


def test_interlocking_equal_to_global_warning_says_what_makes_it_differ():
    """d = 1 with 2 blocks: the warning names the rule (d ≥ K − 1) and what differs — more
    block boundaries, or the sum rule — not "a smaller --distance" (d = 0 is local learning);
    the plan is the global one. (The CLI prints the compile's warnings once:
    tests/test_golden_interlocking.py.)"""
    from pipetrain.host.flow import compile_design

    cfg = {"strategy": "interlocking", "blocks": (1,), "distance": 1}
    res = compile_design("mlp-digits", formats="default", config_overrides=cfg, writers=())
    warning = [w for w in res.warnings if w.startswith("interlocking")]
    assert len(warning) == 1, res.warnings
    assert "(d ≥ K − 1)" in warning[0]
    assert "at least 2 block boundaries (--blocks, K ≥ d + 2 = 3 blocks)" in warning[0]
    assert "smaller --distance" not in warning[0]
    assert [s.role for s in res.plan.stages] == ["main"] * 2 and res.config.strategy == "global"


def test_saturation_table_orders_loss_units_and_aligns_columns():
    """With heads the JSON keeps the counters' order (true loss L4 first); the summary table
    lists the stages, then L1 … L4, every row's columns under the header's."""
    from pipetrain.host.cli.train import saturation_table

    stage = {"y": 3, "gin": 0, "u": 0, "w": 1, "total": 4}
    rows = [{"stage": "1", **stage}, {"stage": "4", **stage}]
    rows += [{"stage": f"loss L{t}", "d": t, "total": t} for t in (4, 1, 2, 3)]
    lines = saturation_table({"tensor_saturations": rows, "tensor_saturations_source": "golden"})
    lines = lines[:-1]  # the line under the table that says what d counts
    assert [ln.split()[0:2] for ln in lines[2:]] == [
        ["1", "3"], ["4", "3"], ["loss", "L1"], ["loss", "L2"], ["loss", "L3"], ["loss", "L4"]
    ]  # fmt: skip
    header = lines[1]
    for ln in lines[2:]:
        assert len(ln) == len(header), (ln, header)
    d_end = header.index(" d ") + 2  # the d column's right edge
    assert lines[-1][d_end - 1] == "4" and lines[2][d_end - 1] == "-"


def test_memory_line_names_the_sprams():
    """A plan with single-port (SPRAM) stages says so in the memory line of compile's summary
    (it listed the block RAMs only)."""
    from pipetrain.compiler.report import totals_text
    from pipetrain.host.flow import compile_design

    plan = compile_design(
        "mlp-digits", formats="default", lanes=[1, 1], single_port=(1,), writers=()
    ).plan
    spram = [m for m in plan.stages[0].memories if m.kind == "spram"]
    assert spram, "stage 1 is single-port: its weights are in SPRAM"
    blocks = sum(m.blocks for m in spram)
    line = next(ln for ln in totals_text(plan).splitlines() if ln.startswith("memory:"))
    assert f"Kib block RAMs and {blocks} SPRAM" in line and "stage 1 w" in line
    plain = compile_design("mlp-digits", formats="default", writers=()).plan
    assert "SPRAM" not in totals_text(plain)


@pytest.mark.parametrize("command", ["compile", "train", "sim", "build", "experiment"])
def test_help_has_no_rst_markup(command):
    res = CliRunner().invoke(cli, [command, "--help"])
    assert res.exit_code == 0 and "``" not in res.output
