"""``pipetrain compile``: JSON result, artifacts, and clean failures that leave nothing behind."""

import json
import os
import textwrap

import pytest
from click.testing import CliRunner
from pipetrain.compiler.compile import compile_model, compile_result
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.models import load_model
from pipetrain.compiler.plan import Plan
from pipetrain.host.cli import cli


def _run(args, cwd):
    runner = CliRunner()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return runner.invoke(cli, args, catch_exceptions=False)
    finally:
        os.chdir(old)


def _json(result):
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_compile_mlp_digits_json_and_artifacts(tmp_path):
    res = _run(["compile", "mlp-digits", "--out", "out", "--json", "-"], tmp_path)
    out = _json(res)
    assert [
        (
            s["index"],
            s["in_features"],
            s["out_features"],
            s["delay"],
            s["stash_depth"],
            s["lanes"],
            s["cycles_per_tick"],
        )
        for s in out["stages"]
    ] == [
        (1, 64, 32, 3, 4, 4, 520),  # D = 2(2−1)+1; 4 lanes: 8 row groups × 65 columns
        (2, 32, 10, 1, 2, 1, 330),  # D = 1; 1 lane: 10 rows × 33 columns
    ]
    # slowest pass (520 slots + 5 pipeline) + 2 control cycles (hdl/tick.py)
    assert out["tick_cycles"] == 520 + 5 + 2 == out["ideal_cycles_per_sample"]
    assert out["formats_source"] == "auto"
    plan = Plan.from_json((tmp_path / "out" / "plan.json").read_text())
    assert plan.hash == out["plan_hash"]
    assert [s.memory_bits for s in plan.stages] == [s["memory_bits"] for s in out["stages"]]
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no temporary folders left
    assert sorted(os.listdir(tmp_path / "out")) == ["mlp_digits.v", "plan.json", "report.md"]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| stage | layer | shape" in report and "observed max" in report
    assert "tick: 527 cycles" in res.stderr  # the table goes to stderr when JSON is on stdout
    # compiling again replaces the earlier output
    again = _json(_run(["compile", "mlp-digits", "--out", "out", "--json", "-"], tmp_path))
    assert again["plan_hash"] == out["plan_hash"]  # deterministic (seeded calibration)


def test_compile_deep_pb_sequential_and_defaults(tmp_path):
    args = ["compile", "mlp-digits-deep", "--formats", "default", "--json", "-"]
    pb = _json(_run([*args, "--out", "pb"], tmp_path))
    assert [s["delay"] for s in pb["stages"]] == [7, 5, 3, 1]  # 2(S−s)+1, S = 4
    assert [s["lanes"] for s in pb["stages"]] == [4, 3, 3, 1]
    seq = _json(_run([*args, "--out", "seq", "--schedule", "sequential"], tmp_path))
    assert [s["delay"] for s in seq["stages"]] == [0, 0, 0, 0]
    # admit + (pass + 1 control) forward and backward per stage + loss (2·10 + 21) + 1
    assert seq["ideal_cycles_per_sample"] == 1 + 2 * (526 + 369 + 369 + 336) + 42 + 1
    # default output folder: build/<name>
    _json(_run(["compile", "mlp-digits", "--formats", "default", "--json", "-"], tmp_path))
    assert (tmp_path / "build" / "mlp-digits" / "plan.json").is_file()


@pytest.mark.parametrize(
    "opts",
    [
        ["--strategy", "local", "--blocks", "2"],
        [
            "--strategy",
            "interlocking",
            "--blocks",
            "1,2",  # 1,2,3 would pass L3 back beyond stage 3's stash: refused
            "--distance",
            "1",
            "--head-stages",
            "2",
        ],
    ],
)
def test_compile_local_interlocking_delays_equal_reference_trainer(tmp_path, opts):
    from pipetrain.sim.reference import ReferenceTrainer

    args = ["compile", "mlp-digits-deep", "--formats", "default", "--out", "o", "--json", "-"]
    out = _json(_run([*args, *opts], tmp_path))
    plan = Plan.from_json((tmp_path / "o" / "plan.json").read_text())
    _, model, _ = load_model("mlp-digits-deep")
    cfg = TrainConfig(**{k: v for k, v in plan.train.items() if k not in ("lr1", "momentum1")})
    ref = ReferenceTrainer(model, cfg)
    assert tuple(s["delay"] for s in out["stages"]) == ref.delays
    assert [s["role"] for s in out["stages"]].count("head") == len(ref.delays) - 4


BAD_FILES = {
    "lstm.py": (
        """
        from torch import nn
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(64, 32)
                self.rnn = nn.LSTM(32, 10)
            def forward(self, x):
                return self.rnn(self.fc(x))
        model = Net
        """,
        ["'rnn'", "(LSTM)", "supported: nn.Linear"],
    ),
    "functional.py": (
        """
        import torch
        from torch import nn
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc, self.out = nn.Linear(64, 32), nn.Linear(32, 10)
            def forward(self, x):
                return self.out(torch.sin(self.fc(x)))
        model = Net()
        """,
        ["the function torch.sin", "functional.py:9", "remove it"],
    ),
    "control.py": (
        """
        from torch import nn
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(64, 10)
            def forward(self, x):
                return self.fc(x) if x.mean() > 0 else self.fc(-x)
        model = Net()
        """,
        ["cannot be traced", "control.py:8", "control flow"],
    ),
    "notmodule.py": ("model = [1, 2]\n", ["is a list, not a torch.nn.Module"]),
}


@pytest.mark.parametrize("fname", list(BAD_FILES))
def test_bad_model_files_fail_cleanly(tmp_path, fname):
    source, needles = BAD_FILES[fname]
    (tmp_path / fname).write_text(textwrap.dedent(source))
    res = _run(["compile", fname, "--out", "out", "--formats", "default"], tmp_path)
    assert res.exit_code == 2
    assert "Traceback" not in res.output
    for needle in needles:
        assert needle in res.stderr, (needle, res.stderr)
    assert sorted(os.listdir(tmp_path)) == [fname]  # no output folder, no temporary folder


@pytest.mark.parametrize(
    "args, needles",
    [
        (["missing.py"], ["model file 'missing.py' does not exist"]),
        (["no-such-model"], ["unknown model 'no-such-model'"]),
        (["mlp-digits", "--format", "s1.x=16.12"], ["is not Qi.f"]),
        (["mlp-digits", "--format", "s1.x=Q40.12"], ["an activation/error format has at most 32"]),
        (["mlp-digits", "--format", "s7.x=Q3.12"], ["there is no stage 7"]),
        (["mlp-digits", "--format", "q=Q3.12"], ["key 'q' is unknown"]),
        (["mlp-digits", "--format", "s1.y=Q0.15"], ["calibrated max|y|", "does not fit y = Q0.15"]),
        (["mlp-digits", "--lanes", "4,16"], ["stage 2 (2): lanes=16 must be in 1..10"]),
        (["mlp-digits", "--lanes", "1,2,3"], ["--lanes has 3 entries"]),
        (
            ["mlp-digits", "--target-cycles", "20"],
            ["the fastest tick of this network is 72 cycles", "give --target-cycles 72 or more"],
        ),
        (["mlp-digits", "--memory-budget", "64Kib"], ["memory bits", "budget is 65,536 bits"]),
        (["mlp-digits", "--memory-budget", "lots"], ["is not a size in bits"]),
        (["mlp-digits", "--strategy", "local"], ["--strategy local needs at least one block"]),
        (["mlp-digits", "--strategy", "interlocking"], ["--strategy interlocking needs"]),
        (["mlp-digits", "--blocks", "x"], ["--blocks 'x'"]),
        (["mlp-digits", "--momentum", "1.5"], ["momentum must be in [0, 1)"]),
        (["mlp-digits", "--data", "nothing.npz"], ["data file 'nothing.npz' does not exist"]),
    ],
)
def test_bad_options_fail_cleanly(tmp_path, args, needles):
    if "--memory-budget" in args:  # the others fail before (or need) the calibration run
        args = [*args, "--formats", "default"]
    res = _run(["compile", *args, "--out", "out"], tmp_path)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    for needle in needles:
        assert needle in res.stderr, (needle, res.stderr)
    assert os.listdir(tmp_path) == []


def test_refuses_to_replace_a_foreign_folder(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    res = _run(["compile", "mlp-digits", "--formats", "default", "--out", "mine"], tmp_path)
    assert res.exit_code == 2 and "refusing to replace it" in res.stderr
    assert os.listdir(tmp_path / "mine") == ["notes.txt"]
    assert sorted(os.listdir(tmp_path)) == ["mine"]


def test_failing_writer_leaves_nothing_and_keeps_earlier_output(tmp_path):
    out = tmp_path / "a" / "b"
    first = compile_model("mlp-digits", out_dir=out, formats="default")
    before = (out / "plan.json").read_text()

    def broken(result, folder):
        (folder / "half.v").write_text("module")
        raise RuntimeError("writer failed")

    with pytest.raises(RuntimeError, match="writer failed"):
        compile_result("mlp-digits", out_dir=out, formats="default", writers=[broken])
    assert (out / "plan.json").read_text() == before and not (out / "half.v").exists()
    assert sorted(os.listdir(tmp_path / "a")) == ["b"]
    # a fresh folder whose parents do not exist yet: nothing is created on failure
    with pytest.raises(RuntimeError):
        compile_result("mlp-digits", out_dir=tmp_path / "x" / "y", formats="default",
                       writers=[broken])  # fmt: skip
    assert sorted(os.listdir(tmp_path)) == ["a"]
    assert first.hash == Plan.from_json(before).hash


def test_model_file_config_and_cli_override(tmp_path):
    (tmp_path / "net.py").write_text(
        "from torch import nn\n"
        "model = nn.Sequential(nn.Linear(64, 16), nn.LeakyReLU(0.25), nn.Linear(16, 10))\n"
        "config = {'schedule': 'sequential', 'lr': 0.01, 'seed': 3}\n"
    )
    res = _run(["compile", "net.py", "--formats", "default", "--json", "-"], tmp_path)
    out = _json(res)
    assert [s["delay"] for s in out["stages"]] == [0, 0]
    plan = Plan.from_json((tmp_path / "build" / "net" / "plan.json").read_text())
    assert plan.train["lr"] == 0.01 and plan.train["seed"] == 3
    assert plan.stages[0].negative_slope.real == 0.25
    res = _run(
        ["compile", "net.py", "--formats", "default", "--schedule", "pb", "--lr", "0.02",
         "--lanes", "2", "--json", "-"],
        tmp_path,
    )  # fmt: skip
    out = _json(res)
    assert [s["delay"] for s in out["stages"]] == [3, 1]
    assert [s["lanes"] for s in out["stages"]] == [2, 2]


def test_compile_board_shows_the_fitted_plan(tmp_path):
    """``compile --board icebreaker`` writes and reports the plan ``build --board`` puts in the
    bitstream (the compiler's fitting pass, once): one lane per stage, the board clock, SPRAM
    weights, and the board's needed / available resources. Its auto formats are calibrated over
    DEFAULT_EPOCHS epochs, as build's and train's (the library's default is the config's 1)."""
    from pipetrain.host.cli.options import DEFAULT_EPOCHS
    from pipetrain.host.flow import compile_design

    res = _run(["compile", "mlp-digits", "--board", "icebreaker", "--json", "-"], tmp_path)
    out = _json(res)
    assert (out["calib_epochs"], out["calib_samples"]) == (DEFAULT_EPOCHS, None) == (4, None)
    fitted = compile_design(
        "mlp-digits", board="icebreaker", writers=(), calib_epochs=DEFAULT_EPOCHS
    ).plan
    assert out["plan_hash"] == fitted.hash and out["board"] == "icebreaker"
    assert [s["lanes"] for s in out["stages"]] == [1, 1] and fitted.clock_hz == 24e6
    assert fitted.ram_family == "ice40"  # its memories counted in the UP5K's 4 Kib EBRs
    # 16×16 SB_MAC16 blocks: forward ŵ·x and δ·x per stage (+ w·δ in stage 2), the loss unit's
    # e·r; the weights and velocities of both stages in the UP5K's four SPRAMs
    assert out["fit"]["multipliers"] == {"needed": 6, "available": 8}
    assert out["fit"]["spram"] == {"needed": 4, "available": 4}
    folder = tmp_path / "build" / "mlp-digits-icebreaker"
    assert sorted(os.listdir(folder)) == ["mlp_digits.v", "plan.json", "report.md"]
    assert Plan.from_json((folder / "plan.json").read_text()).hash == fitted.hash
    assert "DSP blocks 6/8" in res.stderr or "DSP blocks 6/8" in res.stdout


def test_compile_board_refuses_what_does_not_fit_and_a_second_clock(tmp_path):
    res = _run(["compile", "mlp-digits-deep", "--board", "icebreaker", "--json", "-"], tmp_path)
    assert res.exit_code == 2 and "Traceback" not in res.output
    err = json.loads(res.stdout)
    assert err["error_type"] == "FitError" and err["fit"]["multipliers"]["needed"] == 12
    assert not (tmp_path / "build").exists()  # nothing half-written
    res = _run(["compile", "mlp-digits", "--board", "icebreaker", "--clock-mhz", "20"], tmp_path)
    assert res.exit_code == 2 and "--clock-mhz and --board" in res.output
