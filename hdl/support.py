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
#: :func:`require_hdl`, which appends it as ``…; or <this>`` to the reason): the in-process
#: trainers run every plan (docs/numerics.md §9).
INSTEAD = {
    "train": "use --target golden or reference (they run it in process)",
    "sim": "train it with `pipetrain train MODEL --target golden` (or reference), which runs it "
    "in process (pipetrain sim runs the RTL only)",
    "build": "train it with `pipetrain train MODEL --target golden` (or reference), which runs "
    "it in process, or see its plan and report with `pipetrain compile MODEL` (a bitstream "
    "needs the HDL)",
}


def require_hdl(plan: Any, use: str = "train") -> None:
    """Raise :class:`HDLSupportError` for a plan with a convolution stage the HDL conv stage
    does not build (:func:`~pipetrain.hdl.conv_stage.check_conv_stage`: a stash layout or
    input-gradient schedule this HDL does not have, single-port weights); the message names the
    stage and ends with what the command ``use`` (a key of :data:`INSTEAD`) can do instead. A
    traced ``NetworkIR`` (a command that refuses before calibrating or fitting) passes: its
    convolutions are built (docs/numerics.md §9). Source: *derived* (the HDL's conv stage,
    ``hdl/conv_stage.py``)."""
    from .conv_stage import check_conv_stage  # the stage parts only when a plan is checked

    stages = getattr(plan, "stages", None) or ()
    for s in stages:
        if getattr(s, "conv", None) is None:
            continue
        try:
            check_conv_stage(s)
        except NotImplementedError as exc:
            raise HDLSupportError(f"{exc}; or {INSTEAD[use]}") from None
    mains = [s for s in stages if getattr(s, "role", "main") == "main"]
    last = mains[-1] if mains else None
    if last is not None and last.conv is not None and last.conv.pooled_positions > 1 < last.lanes:
        # its output words hold L channels of one position; the loss unit reads logits in order
        raise HDLSupportError(
            f"stage {last.index} ({last.conv.kind}) feeds the loss unit with {last.lanes} lanes "
            f"over {last.conv.pooled_positions} positions, which the HDL does not build: use "
            f"--lanes …,1 for it or end the model with a Linear layer; or {INSTEAD[use]}"
        )
