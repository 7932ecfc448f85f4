"""What the HDL builds yet: one check the hardware paths (Verilog, ``sim``, ``build``, link
targets) run before they elaborate or write anything."""

from __future__ import annotations

from ..compiler.plan import Plan
from ..errors import UserError

__all__ = ["HDLSupportError", "require_hdl"]


class HDLSupportError(UserError, NotImplementedError):
    """The plan has a stage the HDL does not build yet; the message names it and the targets
    that run it. A ``NotImplementedError`` too, so the Verilog artifact writer skips the plan
    with a warning (the plan and the report are still written) — and a
    :class:`~pipetrain.errors.UserError`, so ``sim``/``build``/``--target sim`` give one line,
    exit status 2."""


def require_hdl(plan: Plan) -> None:
    """Raise :class:`HDLSupportError` for a plan with a convolution stage (``Stage.conv``):
    the golden model and the float reference run it (docs/numerics.md §9), the HDL conv stage
    is not built yet. Source: *derived* (issue 16: the HDL conv stage is a later step)."""
    conv = [s for s in plan.stages if getattr(s, "conv", None) is not None]
    if conv:
        s = conv[0]
        raise HDLSupportError(
            f"convolution stages are not in the HDL yet (stage {s.index}, {s.name!r}, "
            f"{s.conv.kind}): use --target golden or reference"
        )
