"""The RTL in Icarus Verilog, the harness's second simulator: bit-exact with the golden model.

The tiny net (tests/tiny_net.py: three stages, padding lanes, LeakyReLU) builds in Icarus in a
few seconds and simulates at a few thousand cycles/s, so every check here streams a handful of
samples: the network top against the golden model (results, every final weight and velocity,
counters, cycles per sample), a planted fault caught and localised, a waveform, the ``sim``
link target (link engine + network over the loopback bridge server) trained through
``pipetrain.host.open``, and ``pipetrain sim --simulator icarus``. Marked ``icarus``: skipped,
with the reason, when ``iverilog`` is not on PATH (tests/conftest.py).
"""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner
from pipetrain.host.cli import cli
from pipetrain.sim.fixed import quantise
from pipetrain.sim.tb.faults import inject_fault
from pipetrain.sim.tb.network import build_network, check_network
from tiny_net import tiny, tiny_stream


@pytest.fixture(scope="module")
def net():
    plan, model, _ = tiny()
    x, y, train = tiny_stream(24)
    xq = quantise(x, plan.stages[0].formats.x)[0]
    return plan, model, xq, y.tolist(), train


@pytest.fixture(scope="module")
def design(net):
    return build_network(net[0], simulator="icarus")


@pytest.mark.icarus
def test_tiny_net_bit_exact_in_icarus(net, design):
    plan, model, x, y, train = net
    assert design.build.simulator == "icarus" and (design.build.directory / "sim.vvp").is_file()
    rep = check_network(plan, model, x, y, train, design=design)
    assert rep.bit_exact, [m.describe() for m in rep.mismatches[:5]]
    assert rep.extra["simulator"] == "icarus"
    n, S = len(x), len(plan.stages)
    assert rep.extra["ticks"] == n + 2 * S - 1  # docs/ports.md: bubbles count, flush included
    assert rep.extra["samples_trained"] == sum(train)
    assert rep.cycles_per_sample == plan.ideal_cycles_per_sample  # free-running: one tick each


@pytest.mark.icarus
def test_tiny_net_with_operand_registers_bit_exact_in_icarus():
    """The ECP5 board's operand and write-data registers (``Stage.operand_registers``) in the
    second simulator: bit-exact, one tick per sample at the plan's two-cycles-longer passes."""
    plan, model, _ = tiny(operand_registers=1)
    assert all(s.operand_registers == 1 for s in plan.stages)
    x, y, train = tiny_stream(12)
    xq = quantise(x, plan.stages[0].formats.x)[0]
    rep = check_network(plan, model, xq, y.tolist(), train, simulator="icarus")
    assert rep.bit_exact, [m.describe() for m in rep.mismatches[:5]]
    assert rep.cycles_per_sample == plan.ideal_cycles_per_sample


@pytest.mark.icarus
def test_fault_is_caught_and_localised_in_icarus(net):
    plan, model, x, y, train = net
    S = len(plan.stages)
    faulty = inject_fault(plan, "lfsr_seed", stage=2, lane=0)
    rep = check_network(plan, model, x[:8], y[:8], train[:8], rtl_plan=faulty, simulator="icarus")
    assert not rep.bit_exact
    first = rep.first
    # stage 2's first stochastic rounding differs: sample 0's update there, tick 2S − 2
    assert (first.what, first.stage, first.sample, first.tick) == ("memory", 2, 0, 2 * S - 2)
    assert first.expected != first.actual and "first 0 samples match" in rep.localisation


@pytest.mark.icarus
def test_icarus_records_a_vcd(net, tmp_path):
    plan, model, x, y, train = net
    vcd = tmp_path / "run.vcd"
    rep = check_network(plan, model, x[:3], y[:3], train[:3], waves=vcd, simulator="icarus")
    assert rep.bit_exact
    text = vcd.read_text(errors="replace")
    assert text.startswith("$date") and "sample_in__valid" in text and "result_out__payload" in text


@pytest.mark.icarus
def test_sim_target_in_icarus_trains_bit_exact(net):
    from pipetrain.host import open

    plan, model, _, _, _ = net
    x, y, _ = tiny_stream(12, seed=4)
    opts = {"simulator": "icarus"}
    with open(plan, "sim", model=copy.deepcopy(model), shadow=True, sim_options=opts) as dev:
        assert dev._bridge.design.build.simulator == "icarus"
        rep = dev.train(x, y, epochs=1)
        v = dev.verify()
        assert v.bit_exact, v.mismatches[:5]
        assert v.results == 12 and rep.samples == 12 == dev.samples_trained
        c = dev.counters()
        assert c["bad_crc"] == c["bad_header"] == c["rx_timeouts"] == 0
    assert dev.sim_stats is not None and dev.sim_stats["cycles"] > 12 * plan.tick_cycles


TINY_MODEL = """
from torch import nn

model = nn.Sequential(nn.Linear(64, 6), nn.ReLU(), nn.Linear(6, 10))
config = {"lr": 0.05, "momentum": 0.9}
"""


@pytest.mark.icarus
def test_cli_sim_with_icarus(tmp_path):
    path = tmp_path / "tiny_digits.py"
    path.write_text(TINY_MODEL)
    out = tmp_path / "sim.json"
    args = ["sim", str(path), "--simulator", "icarus", "--samples", "6", "--json", str(out)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["bit_exact"] is True and data["mismatches"] == 0 and data["samples"] == 6
    assert data["simulator"] == "icarus"
    assert data["cycles_per_sample"] == data["ideal_cycles_per_sample"]


def test_cli_sim_without_icarus_is_a_user_error(monkeypatch, tmp_path):
    from pipetrain.sim import icarus

    monkeypatch.setattr(icarus.shutil, "which", lambda tool: None)
    out = tmp_path / "err.json"
    res = CliRunner().invoke(
        cli, ["sim", "mlp-digits", "--simulator", "icarus", "--json", str(out)]
    )
    assert res.exit_code == 2
    assert "Traceback" not in res.output
    assert (
        "needs iverilog and vvp on PATH" in res.output and "apt-get install iverilog" in res.output
    )
    assert json.loads(out.read_text())["error_type"] == "ToolchainError"


def test_cli_sim_unknown_simulator_is_refused():
    res = CliRunner().invoke(cli, ["sim", "mlp-digits", "--simulator", "xsim"])
    assert res.exit_code == 2 and "'xsim' is not one of 'verilator', 'icarus'" in res.output


@pytest.mark.icarus
def test_cli_train_on_the_icarus_sim_target(tmp_path):
    """``pipetrain train --target sim --simulator icarus``: a 40→4→4 net trained through the
    link engine in Icarus, bit-exact with its golden shadow, the device's counter = the host's."""
    from test_host_sim import make_npz

    npz = make_npz(tmp_path / "small.npz", n_train=12, n_test=6)
    out = tmp_path / "train.json"
    args = ["train", "mlp", "--data", str(npz), "--hidden", "4", "--formats", "default"]
    args += ["--epochs", "1", "--target", "sim", "--simulator", "icarus", "--no-progress"]
    res = CliRunner().invoke(cli, [*args, "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["bit_exact"] is True and data["mismatches"] == []
    assert data["train_samples"] == data["device_samples"] == 12
