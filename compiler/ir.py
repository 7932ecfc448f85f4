"""The compiler's small intermediate representation: a chain of weight layers."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ACTIVATIONS", "LayerIR", "NetworkIR"]

ACTIVATIONS = ("relu", "leaky_relu", "identity")


@dataclass(frozen=True)
class LayerIR:
    """One weight layer (``nn.Linear``) and the activation that follows it.

    Members
    -------
    name: module path of the Linear layer in the user's model (e.g. ``"0"``, ``"net.fc1"``).
    in_features, out_features: sizes (elements).
    activation: one of :data:`ACTIVATIONS`.
    negative_slope: LeakyReLU slope (0.0 otherwise).
    """

    name: str
    in_features: int
    out_features: int
    activation: str = "identity"
    negative_slope: float = 0.0


@dataclass(frozen=True)
class NetworkIR:
    """A traced network: input size, its weight layers in order, and the loss.

    Members
    -------
    name: model name.
    in_features: input features per sample.
    layers: the weight layers in execution order.
    loss: ``cross_entropy`` or ``mse``.
    """

    name: str
    in_features: int
    layers: tuple[LayerIR, ...]
    loss: str = "cross_entropy"

    @property
    def classes(self) -> int:
        """Output size of the last layer."""
        return self.layers[-1].out_features
