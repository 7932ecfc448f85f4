"""Verilog of the network top: one module, port names as in docs/ports.md.

:func:`generate_verilog` converts ``NetworkTop(plan)`` with ``amaranth.back.verilog`` (Yosys
inside Amaranth's ``builtin-yosys``). Ports: ``clk``, ``rst``, then per stream
``<member>__payload`` / ``__valid`` / ``__ready`` (payloads are the packed structs of
docs/ports.md, first field in the least significant bits), ``flush``, ``idle``,
``samples_trained``, ``ticks`` and ``saturations__<k>`` for k = 0..S.
:func:`write_verilog` is the compile flow's artifact writer (``DIR/<name>.v``).

Source: docs/ports.md (names), docs/architecture.md §6 (toolchain facts).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from amaranth.back import verilog

from ..compiler.plan import Plan
from .support import require_hdl
from .top import NetworkTop

__all__ = ["generate_verilog", "write_verilog", "verilog_name"]


def verilog_name(name: str) -> str:
    """A legal Verilog module name from a model name (``mlp-digits`` → ``mlp_digits``)."""
    out = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return out if re.match(r"[A-Za-z_]", out) else f"m_{out}"


def generate_verilog(plan: Plan, name: str) -> str:
    """Return the Verilog text of ``NetworkTop(plan)`` as one top module ``name``.

    Raises NotImplementedError for plans the HDL does not build (auxiliary heads, LWP ``w``
    form; a convolution stage: :class:`~pipetrain.hdl.support.HDLSupportError`, also a
    UserError) and ValueError for a name that is not a legal Verilog identifier.
    """
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*", name):
        raise ValueError(f"{name!r} is not a legal Verilog module name (use verilog_name())")
    require_hdl(plan)
    top = NetworkTop(plan)
    return verilog.convert(top, name=name, emit_src=False)


def write_verilog(result: Any, folder: Path) -> Sequence[str]:
    """Artifact writer: ``<name>.v`` for ``result.plan`` (``result.name`` made legal).

    Plans the HDL cannot build yet (auxiliary heads of local/interlocking learning) get no
    Verilog: the writer adds the reason to ``result.warnings`` and returns no file instead of
    failing the compile (the plan and report are still useful).
    """
    name = verilog_name(result.name)
    try:
        text = generate_verilog(result.plan, name)
    except NotImplementedError as exc:
        result.warnings.append(f"no Verilog written: {exc}")
        return []
    (Path(folder) / f"{name}.v").write_text(text)
    return [f"{name}.v"]
