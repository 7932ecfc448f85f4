"""What the HDL builds yet: one check the hardware paths (Verilog, ``sim``, ``build``, link
targets) run before they elaborate or write anything."""

from __future__ import annotations

from typing import Any

from ..errors import UserError

__all__ = ["INSTEAD", "HDLSupportError", "require_hdl"]


class HDLSupportError(UserError, NotImplementedError):
    """The plan has a stage the HDL does not build yet; the message names it and the targets
    that run it. A ``NotImplementedError`` too, so the Verilog artifact writer skips the plan
    with a warning (the plan and the report are still written) — and a
    :class:`~pipetrain.errors.UserError`, so ``sim``/``build``/``--target sim`` give one line,
    exit status 2."""


#: What each hardware command can do instead when the HDL does not build a plan (``use`` of
#: :func:`require_hdl`): the in-process trainers run every plan (docs/numerics.md §9).
INSTEAD = {
    "train": "use --target golden or reference (they run it in process)",
    "sim": "pipetrain sim runs the RTL only: train it with `pipetrain train MODEL --target "
    "golden` (or reference)",
    "build": "a bitstream needs the HDL: train it with `pipetrain train MODEL --target golden` "
    "(or reference), or `pipetrain compile MODEL` for its plan and report",
}


def require_hdl(plan: Any, use: str = "train") -> None:
    """Raise :class:`HDLSupportError` for a plan (or the traced ``NetworkIR``, so a command can
    refuse before calibrating or fitting) with a convolution stage (``Stage.conv`` /
    ``LayerIR.conv``): the golden model and the float reference run it (docs/numerics.md §9),
    the HDL conv stage is not built yet. ``use``: the command, a key of :data:`INSTEAD` — the
    message ends with what that command's user can do instead. Source: *derived* (issue 16:
    the HDL conv stage is a later step)."""
    stages = getattr(plan, "stages", None) or getattr(plan, "layers", ())
    conv = [(k, s) for k, s in enumerate(stages, 1) if getattr(s, "conv", None) is not None]
    if conv:
        k, s = conv[0]
        raise HDLSupportError(
            f"convolution stages are not in the HDL yet (stage {k}, {s.name!r}, "
            f"{s.conv.kind}): {INSTEAD[use]}"
        )
