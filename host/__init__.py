"""pipetrain.host: the link client, transports, the device API and the command line.

``pipetrain.host.open(model_or_plan, target=...)`` returns a :class:`~.device.Device` that
trains on the golden model, the reference trainer, the RTL simulation or a board. The names
are loaded on first use (PEP 562), so importing a host submodule (e.g. the command line's
``host.cli``) does not import the device API and its dependencies.
"""

from __future__ import annotations

from typing import Any

__all__ = ["open", "Device", "DeviceError", "TrainReport", "Verification"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import device

        return getattr(device, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
