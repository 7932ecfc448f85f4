"""pipetrain: an FPGA hardware generator for on-chip training with Pipelined Backpropagation.

Subpackages: :mod:`pipetrain.compiler` (torch.fx front end, the plan), :mod:`pipetrain.sim`
(float reference trainer, fixed-point golden model, RTL simulation), :mod:`pipetrain.hdl`
(Amaranth components), :mod:`pipetrain.protocol` (host link wire format, device model),
:mod:`pipetrain.host` (link client, transports, CLI).
"""

__version__ = "0.1.0"
