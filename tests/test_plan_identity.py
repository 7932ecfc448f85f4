"""The plan is the hardware's identity: host-only settings must not change it."""

from pipetrain.compiler.build import build_plan
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.ir import LayerIR, NetworkIR

IR = NetworkIR("t", 8, (LayerIR("0", 8, 6, "relu"), LayerIR("2", 6, 4)))


def test_epochs_do_not_change_the_plan_hash():
    a = build_plan(IR, TrainConfig(epochs=1))
    b = build_plan(IR, TrainConfig(epochs=7))
    assert a.hash == b.hash
    assert "epochs" not in a.train


def test_training_settings_do_change_the_plan_hash():
    a = build_plan(IR, TrainConfig(lr=0.002))
    assert build_plan(IR, TrainConfig(lr=0.004)).hash != a.hash
    assert build_plan(IR, TrainConfig(seed=1)).hash != a.hash  # LFSR seeds differ
