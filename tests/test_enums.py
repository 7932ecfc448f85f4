"""The closed settings are enums: converted on entry, an error wherever an unknown value is
dispatched (compiler/enums.py)."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
from pipetrain.compiler.config import ConfigError, TrainConfig
from pipetrain.compiler.enums import Activation, Loss, Mitigation, Rounding, Schedule
from pipetrain.compiler.ir import LayerIR, NetworkIR
from pipetrain.compiler.plan import Plan
from pipetrain.protocol.wire import Result, loss_value
from pipetrain.sim import golden_scalar
from pipetrain.sim.golden import GoldenModel
from pipetrain.sim.reference import loss_gradient
from tiny_net import tiny, tiny_stream


def test_members_are_their_strings() -> None:
    assert Activation.RELU == "relu" and str(Schedule.PB) == "pb"
    assert json.dumps({"r": Rounding.NEAREST_EVEN}) == '{"r": "nearest_even"}'
    assert Mitigation("sc+lwp").sc and Mitigation("sc+lwp").lwp
    assert not Mitigation.SC.lwp and not Mitigation.LWP.sc and not Mitigation.NONE.sc


def test_config_converts_and_names_the_choices() -> None:
    cfg = TrainConfig(schedule="sequential", mitigation="lwp", loss="mse")
    assert cfg.schedule is Schedule.SEQUENTIAL and cfg.mitigation is Mitigation.LWP
    assert cfg.loss is Loss.MSE
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg  # the JSON form round-trips
    with pytest.raises(ConfigError, match="rounding='floor' .*stochastic, nearest_even"):
        TrainConfig(rounding="floor")
    with pytest.raises(ConfigError, match=r"mitigation='lwp\+sc' .*none, sc, lwp, sc\+lwp"):
        TrainConfig(mitigation="lwp+sc")


def test_ir_refuses_an_unknown_activation() -> None:
    assert LayerIR("0", 4, 3, "relu").activation is Activation.RELU
    assert LayerIR("0", 4, 3, "tanh").activation is Activation.TANH
    with pytest.raises(ValueError, match="gelu"):
        LayerIR("0", 4, 3, "gelu")
    with pytest.raises(ValueError, match="hinge"):
        NetworkIR("n", 4, (LayerIR("0", 4, 3),), "hinge")


def _with_activation(plan, stage: int, act: str):
    """The plan with one stage's activation forced to ``act`` past the plan's own check."""
    stages = list(plan.stages)
    stages[stage] = copy.copy(stages[stage])
    object.__setattr__(stages[stage], "activation", act)
    return dataclasses.replace(plan, stages=tuple(stages))


def test_plan_fields_are_enums_and_round_trip() -> None:
    plan, _, _ = tiny(mitigation="sc")
    assert plan.schedule is Schedule.PB and plan.mitigation is Mitigation.SC
    assert (
        plan.stages[0].activation is Activation.LEAKY_RELU and plan.loss.kind is Loss.CROSS_ENTROPY
    )
    back = Plan.from_json(plan.to_json())
    assert back == plan and back.hash == plan.hash and back.rounding is Rounding.STOCHASTIC
    assert back.stages[1].activation is Activation.RELU
    with pytest.raises(ValueError, match=r"Stage.activation='gelu' is not one of"):
        dataclasses.replace(plan.stages[0], activation="gelu")
    with pytest.raises(ValueError, match=r"Plan.rounding='floor' is not one of"):
        dataclasses.replace(plan, rounding="floor")


def test_golden_models_refuse_an_activation_they_do_not_implement() -> None:
    """A plan edited by hand to an activation no branch handles fails at the first forward
    (it used to be treated as identity)."""
    plan, model, config = tiny()
    bad = _with_activation(plan, 1, "gelu")
    x, y, _ = tiny_stream(4)
    with pytest.raises(ValueError, match="unsupported activation 'gelu'"):
        GoldenModel(bad, model, config).train(x, y, epochs=1)
    w0 = [[[0] * (st.in_features + 1) for _ in range(st.out_features)] for st in bad.stages]
    xs = [[1] * bad.in_features]
    with pytest.raises(ValueError, match="unsupported activation 'gelu'"):
        golden_scalar.run_scalar(bad, w0, [(xs[0], 0, True)])


def test_losses_refuse_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unsupported loss 'hinge'"):
        loss_gradient("hinge", torch.zeros(3), 0)
    plan, _, _ = tiny()
    loss = copy.copy(plan.loss)
    object.__setattr__(loss, "kind", "hinge")
    bad = dataclasses.replace(plan, loss=loss)
    with pytest.raises(ValueError, match="unsupported loss 'hinge'"):
        loss_value(Result(0, 0, 7, True), bad)
