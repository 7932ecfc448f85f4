"""The compiler's small intermediate representation: a chain of weight layers."""

from __future__ import annotations

from dataclasses import dataclass

from .conv import ConvGeometry
from .enums import Activation, Loss

__all__ = ["ACTIVATIONS", "LayerIR", "NetworkIR"]

#: The activations a weight layer may end in (:class:`~pipetrain.compiler.enums.Activation`).
ACTIVATIONS = tuple(m.value for m in Activation)


@dataclass(frozen=True)
class LayerIR:
    """One weight layer (``nn.Linear``, ``nn.Conv1d``, ``nn.Conv2d``) and the activation (and,
    after a convolution, the pooling) that follows it.

    Members
    -------
    name: module path of the weight layer in the user's model (e.g. ``"0"``, ``"net.fc1"``).
    in_features, out_features: values per sample in and out (elements; a convolution's are
        C_in·Πin_size and C_out·Πpooled_size, :class:`~pipetrain.compiler.conv.ConvGeometry`).
    activation: an :class:`~pipetrain.compiler.enums.Activation` (a string of
        :data:`ACTIVATIONS` is converted; another raises ``ValueError``).
    negative_slope: LeakyReLU slope (0.0 otherwise).
    conv: the convolution's geometry, pooling included (None for a Linear layer).
    """

    name: str
    in_features: int
    out_features: int
    activation: Activation = Activation.IDENTITY
    negative_slope: float = 0.0
    conv: ConvGeometry | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "activation", Activation(self.activation))


@dataclass(frozen=True)
class NetworkIR:
    """A traced network: input size, its weight layers in order, and the loss.

    Members
    -------
    name: model name.
    in_features: input features per sample (values streamed per sample).
    layers: the weight layers in execution order.
    loss: a :class:`~pipetrain.compiler.enums.Loss` (strings are converted).
    input_shape: one sample's shape without the batch dimension: (C, L) or (C, H, W) when the
        first layer is a convolution, else (in_features,).
    """

    name: str
    in_features: int
    layers: tuple[LayerIR, ...]
    loss: Loss = Loss.CROSS_ENTROPY
    input_shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "loss", Loss(self.loss))
        if not self.input_shape:
            object.__setattr__(self, "input_shape", (self.in_features,))

    @property
    def classes(self) -> int:
        """Output size of the last layer."""
        return self.layers[-1].out_features
