"""Example model file for pipetrain: a LeakyReLU MLP for the 8×8 digits with its own settings.

Use it wherever a MODEL is expected:

    pipetrain compile examples/mlp_leaky.py --out build/leaky
    pipetrain train examples/mlp_leaky.py --target golden --epochs 2
"""

from torch import nn

model = nn.Sequential(
    nn.Flatten(),
    nn.Linear(64, 48),
    nn.LeakyReLU(0.125),
    nn.Linear(48, 24),
    nn.LeakyReLU(0.125),
    nn.Linear(24, 10),
)

# Any TrainConfig field (pipetrain.compiler.config); command-line options override these.
config = {"schedule": "pb", "mitigation": "sc+lwp", "lr": 0.002, "momentum": 0.9}
