"""Example model file for pipetrain: a Tanh MLP for the 8×8 digits.

The hidden Tanh runs on the chip through an interpolated look-up table (max error 0.78125 LSB
of the stage's output format) and back-propagates from its stashed output, 1 − y²
(docs/numerics.md §3 step 4, §5 step 1); ``nn.Sigmoid`` works the same way. Use it wherever a
MODEL is expected:

    pipetrain compile examples/mlp_tanh.py --out build/tanh
    pipetrain train examples/mlp_tanh.py --target golden --epochs 3
"""

from torch import nn

model = nn.Sequential(
    nn.Linear(64, 32),
    nn.Tanh(),
    nn.Linear(32, 10),
)

# Any TrainConfig field (pipetrain.compiler.config); command-line options override these.
config = {"schedule": "pb", "lr": 0.01, "momentum": 0.9}
