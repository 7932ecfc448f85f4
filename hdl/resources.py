"""What the generated network top really contains: memories and multipliers.

:func:`design_resources` elaborates ``NetworkTop(plan)`` and counts

* every ``amaranth.lib.memory`` instance (depth × width, read/write ports) and the total bits;
* the ``$mul`` cells of its RTLIL, split into *variable* multipliers (both operands are
  signals: DSP candidates) and *constant-coefficient* ones (one operand is a constant: the
  momentum/learning-rate/LWP/slope products, the weight-access address arithmetic and
  Amaranth's variable part-selects, which synthesis maps to adders, shifts or DSPs).
  Identical cells (same operands) are counted once, as Yosys' ``opt_merge`` would.

These are the numbers of the design itself; the plan's ``memory_bits``/``multipliers`` are the
compiler's estimate (source: derived from the netlist).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from amaranth import Shape
from amaranth.back import rtlil
from amaranth.hdl import Fragment
from amaranth.hdl._mem import MemoryInstance

from ..compiler.plan import Plan
from .top import NetworkTop

__all__ = ["MemoryUse", "Resources", "design_resources"]


@dataclass(frozen=True)
class MemoryUse:
    """One memory: hierarchical ``path``, ``depth`` words × ``width`` bits, port counts."""

    path: str
    depth: int
    width: int
    read_ports: int
    write_ports: int

    @property
    def bits(self) -> int:
        """depth × width."""
        return self.depth * self.width


@dataclass
class Resources:
    """Memories and multipliers of one design.

    Members
    -------
    memories: every memory instance.
    memory_bits: Σ depth × width (bits).
    variable_multipliers: ``$mul`` cells with two signal operands, as ``(a_width, b_width)``.
    constant_multipliers: ``$mul`` cells with a constant operand, as ``(a_width, b_width)``.
    """

    memories: list[MemoryUse] = field(default_factory=list)
    variable_multipliers: list[tuple[int, int]] = field(default_factory=list)
    constant_multipliers: list[tuple[int, int]] = field(default_factory=list)

    @property
    def memory_bits(self) -> int:
        """Total memory bits."""
        return sum(m.bits for m in self.memories)


def _memories(frag: Fragment, path: str, out: list[MemoryUse]) -> None:
    for sub, name, _ in frag.subfragments:
        p = f"{path}/{name}"
        if isinstance(sub, MemoryInstance):
            d = sub._data  # noqa: SLF001 - the instance's MemoryData
            width = Shape.cast(d.shape).width
            out.append(MemoryUse(p, d.depth, width, len(sub._read_ports), len(sub._write_ports)))
        _memories(sub, p, out)


_CELL = re.compile(r"cell \$mul (\S+)\n(.*?)\n\s*end", re.S)
_CONST = re.compile(r"^\d+'[01xz]+$")


def design_resources(plan: Plan) -> Resources:
    """Elaborate ``NetworkTop(plan)`` and count its memories and multipliers (seconds)."""
    res = Resources()
    _memories(Fragment.get(NetworkTop(plan), None), "", res.memories)
    text = rtlil.convert(NetworkTop(plan), name="top")
    seen = set()
    for module in text.split("\nmodule ")[1:]:
        mod_name = module.split("\n", 1)[0]
        for _, body in _CELL.findall(module):
            a = re.search(r"connect \\A (.*)", body).group(1).strip()
            b = re.search(r"connect \\B (.*)", body).group(1).strip()
            key = (mod_name, a, b)
            if key in seen:
                continue
            seen.add(key)
            aw = int(re.search(r"parameter \\A_WIDTH (\d+)", body).group(1))
            bw = int(re.search(r"parameter \\B_WIDTH (\d+)", body).group(1))
            if _CONST.match(a) or _CONST.match(b):
                res.constant_multipliers.append((aw, bw))
            else:
                res.variable_multipliers.append((aw, bw))
    return res
