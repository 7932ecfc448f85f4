"""What the generated network top really contains: memories and multipliers.

:func:`design_resources` elaborates ``NetworkTop(plan)`` and counts

* every ``amaranth.lib.memory`` instance (depth × width, read/write ports) and the total bits;
* the ``$mul`` cells of its RTLIL, split into *variable* multipliers (both operands are
  signals: DSP candidates) and *constant-coefficient* ones (one operand is a constant: the
  momentum/learning-rate/LWP/slope products, the weight-access address arithmetic and
  Amaranth's variable part-selects, which synthesis maps to adders, shifts or DSPs).
  Identical cells (same operands) are counted once, as Yosys' ``opt_merge`` would.

These are the numbers of the design itself (source: derived from the netlist). The plan's
``memory_bits`` is the same number: :func:`compare_memories` checks the plan's memory list
(``Stage.memories``, ``LossUnit.memories``, ``Plan.memories``) against the memories the
elaborated design really has, exactly (tests/test_plan_memories.py); its ``multipliers`` are
the compiler's estimate.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from amaranth import Shape
from amaranth.back import rtlil
from amaranth.hdl import Fragment
from amaranth.hdl._mem import MemoryInstance

from ..compiler.plan import Plan
from .spram import SinglePortRAM
from .top import NetworkTop

__all__ = [
    "MemoryUse",
    "Resources",
    "design_resources",
    "design_memories",
    "OwnerCheck",
    "compare_memories",
]


@dataclass(frozen=True)
class MemoryUse:
    """One memory: hierarchical ``path`` (``/stage1/w0``), ``depth`` words × ``width`` bits,
    port counts; ``single_port``: the storage of a :class:`~pipetrain.hdl.spram.SinglePortRAM`
    (an SPRAM on iCE40)."""

    path: str
    depth: int
    width: int
    read_ports: int
    write_ports: int
    single_port: bool = False

    @property
    def owner(self) -> str:
        """The plan owner of the memory (:meth:`Plan.all_memories`): the top's submodule
        ``stage<n>``, ``loss`` or ``head_loss<k>`` (an auxiliary head's loss unit), else
        ``top``."""
        first = self.path.strip("/").split("/")[0]
        owned = first == "loss" or first.startswith(("stage", "head_loss"))
        return first if owned else "top"

    @property
    def names(self) -> tuple[str, ...]:
        """The path's components below the owner (``("w0", "mem")``; for ``top`` all of them)."""
        parts = tuple(self.path.strip("/").split("/"))
        return parts if self.owner == "top" else parts[1:]

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


def _memories(frag: Fragment, path: str, out: list[MemoryUse], single: bool = False) -> None:
    for sub, name, _ in frag.subfragments:
        p = f"{path}/{name}"
        sp = single or any(isinstance(o, SinglePortRAM) for o in getattr(sub, "origins", ()) or ())
        if isinstance(sub, MemoryInstance):
            d = sub._data  # noqa: SLF001 - the instance's MemoryData
            width = Shape.cast(d.shape).width
            rp, wp = len(sub._read_ports), len(sub._write_ports)  # noqa: SLF001
            out.append(MemoryUse(p, d.depth, width, rp, wp, sp))
        _memories(sub, p, out, sp)


def design_memories(plan: Plan, top: Any = None) -> list[MemoryUse]:
    """Elaborate ``top`` (default ``NetworkTop(plan)``, no platform) and return every memory
    instance in it, in hierarchy order."""
    out: list[MemoryUse] = []
    _memories(Fragment.get(top if top is not None else NetworkTop(plan), None), "", out)
    return out


@dataclass(frozen=True)
class OwnerCheck:
    """The memories of one owner, planned vs built.

    Members
    -------
    owner: ``stage<n>``, ``loss``, ``head_loss<k>`` or ``top``.
    matched_by: ``name`` (every built memory sits under a submodule named after one of the
        plan's banks, ``MemorySpec.bank_names``, each bank once) or ``multiset`` (compared as
        multisets of (words, width, read ports, write ports, single-port)).
    planned, built: the (name, words, width, read ports, write ports, single-port) rows;
        name is ``""`` when ``matched_by`` is ``multiset``.
    """

    owner: str
    matched_by: str
    planned: tuple[tuple[str, int, int, int, int, bool], ...]
    built: tuple[tuple[str, int, int, int, int, bool], ...]

    @property
    def ok(self) -> bool:
        """Planned and built are the same multiset of rows."""
        return Counter(self.planned) == Counter(self.built)

    def difference(self) -> str:
        """The rows only the plan has and the rows only the design has (empty when ``ok``)."""
        p, b = Counter(self.planned), Counter(self.built)
        return f"plan only {sorted((p - b).elements())}, design only {sorted((b - p).elements())}"


def compare_memories(plan: Plan, top: Any = None) -> list[OwnerCheck]:
    """Compare the plan's memories (:meth:`Plan.all_memories`) with the design's
    (:func:`design_memories`), per owner; one :class:`OwnerCheck` per owner that either side
    has. The plan's ``bram``/``lutram``/``logic`` kinds are one ``lib.memory`` each to the HDL,
    ``spram`` a :class:`~pipetrain.hdl.spram.SinglePortRAM`."""
    planned: dict[str, list[tuple[str, tuple]]] = {}
    for owner, m in plan.all_memories():
        geo = (m.words, m.width, m.read_ports, m.write_ports, m.kind == "spram")
        for bank in m.bank_names:
            planned.setdefault(owner, []).append((bank, geo))
    built: dict[str, list[MemoryUse]] = {}
    for mu in design_memories(plan, top):
        built.setdefault(mu.owner, []).append(mu)
    out = []
    for owner in sorted(set(planned) | set(built)):
        prow = planned.get(owner, [])
        brow = built.get(owner, [])
        names = {n for n, _ in prow}
        found = [next((c for c in reversed(mu.names) if c in names), None) for mu in brow]
        by_name = None not in found and len(set(found)) == len(found) == len(prow)

        def row(name: str, mu: MemoryUse) -> tuple[str, int, int, int, int, bool]:
            return (name, mu.depth, mu.width, mu.read_ports, mu.write_ports, mu.single_port)

        if by_name:
            b = tuple(row(n, mu) for n, mu in zip(found, brow, strict=True))
            p = tuple((n, *geo) for n, geo in prow)
        else:
            b = tuple(row("", mu) for mu in brow)
            p = tuple(("", *geo) for _, geo in prow)
        out.append(OwnerCheck(owner, "name" if by_name else "multiset", p, b))
    return out


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
