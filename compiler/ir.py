"""The compiler's small intermediate representation: a chain of weight layers."""

from __future__ import annotations

from dataclasses import dataclass

from .enums import Activation, Loss

__all__ = ["ACTIVATIONS", "LayerIR", "NetworkIR"]

#: The activations a weight layer may end in (:class:`~pipetrain.compiler.enums.Activation`).
ACTIVATIONS = tuple(m.value for m in Activation)


@dataclass(frozen=True)
class LayerIR:
    """One weight layer (``nn.Linear``) and the activation that follows it.

    Members
    -------
    name: module path of the Linear layer in the user's model (e.g. ``"0"``, ``"net.fc1"``).
    in_features, out_features: sizes (elements).
    activation: an :class:`~pipetrain.compiler.enums.Activation` (a string of
        :data:`ACTIVATIONS` is converted; another raises ``ValueError``).
    negative_slope: LeakyReLU slope (0.0 otherwise).
    """

    name: str
    in_features: int
    out_features: int
    activation: Activation = Activation.IDENTITY
    negative_slope: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "activation", Activation(self.activation))


@dataclass(frozen=True)
class NetworkIR:
    """A traced network: input size, its weight layers in order, and the loss.

    Members
    -------
    name: model name.
    in_features: input features per sample.
    layers: the weight layers in execution order.
    loss: a :class:`~pipetrain.compiler.enums.Loss` (strings are converted).
    """

    name: str
    in_features: int
    layers: tuple[LayerIR, ...]
    loss: Loss = Loss.CROSS_ENTROPY

    def __post_init__(self) -> None:
        object.__setattr__(self, "loss", Loss(self.loss))

    @property
    def classes(self) -> int:
        """Output size of the last layer."""
        return self.layers[-1].out_features
