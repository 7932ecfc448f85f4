"""Flat bit layouts of stream payloads: pack/unpack integers without Amaranth in the simulator.

An Amaranth ``lib.data`` layout (or plain shape) is flattened once, in the parent process, into
:class:`BitField` records (dotted name, bit offset, width, signedness) that travel to the cocotb
process as JSON; :func:`pack` and :func:`unpack` then convert between ``{name: int}`` dicts and
the payload's raw unsigned integer (the value on ``<member>__payload``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["BitField", "flatten_layout", "pack", "unpack", "fields_to_json", "fields_from_json"]


@dataclass(frozen=True)
class BitField:
    """One leaf field of a payload.

    Members
    -------
    name: dotted path (``"x"``, ``"hdr.kind"``); ``""`` for a payload that is a plain shape.
    offset: lowest bit (LSB first, as ``lib.data`` places fields).
    width: bits.
    signed: two's complement when True.
    """

    name: str
    offset: int
    width: int
    signed: bool

    @property
    def min(self) -> int:
        """Smallest integer the field holds."""
        return -(1 << (self.width - 1)) if self.signed else 0

    @property
    def max(self) -> int:
        """Largest integer the field holds."""
        return (1 << (self.width - 1)) - 1 if self.signed else (1 << self.width) - 1


def flatten_layout(layout: Any, prefix: str = "", offset: int = 0) -> tuple[BitField, ...]:
    """Flatten an Amaranth ``lib.data`` layout or shape into leaf :class:`BitField` records.

    Struct fields recurse (``"outer.inner"``); array layouts name elements ``"name.0"``, …;
    a plain shape gives one field named ``prefix``. Raises TypeError for anything else.
    """
    from amaranth.hdl import Shape
    from amaranth.lib import data

    if isinstance(layout, data.Layout):
        out: list[BitField] = []
        for name, field in layout:
            child = f"{prefix}.{name}" if prefix else str(name)
            out.extend(flatten_layout(field.shape, child, offset + field.offset))
        return tuple(out)
    shape = Shape.cast(layout)
    return (BitField(prefix, offset, shape.width, shape.signed),)


def pack(fields: Sequence[BitField], values: Mapping[str, int] | int) -> int:
    """Return the raw payload integer for ``values`` (missing fields are 0).

    A plain int is taken as the value of the single unnamed field. Raises ValueError when a
    value does not fit its field or a name is unknown.
    """
    if isinstance(values, int):
        values = {"": values}
    known = {f.name for f in fields}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"unknown payload fields {sorted(unknown)}; layout has {sorted(known)}")
    raw = 0
    for f in fields:
        v = int(values.get(f.name, 0))
        if not f.min <= v <= f.max:
            raise ValueError(f"payload field {f.name!r}={v} outside [{f.min}, {f.max}]")
        raw |= (v & ((1 << f.width) - 1)) << f.offset
    return raw


def unpack(fields: Sequence[BitField], raw: int) -> dict[str, int]:
    """Split a raw payload integer into ``{name: int}`` (signed fields sign-extended)."""
    out = {}
    for f in fields:
        v = (raw >> f.offset) & ((1 << f.width) - 1)
        if f.signed and v >> (f.width - 1):
            v -= 1 << f.width
        out[f.name] = v
    return out


def fields_to_json(fields: Sequence[BitField]) -> list[list[Any]]:
    """Serialise fields as ``[[name, offset, width, signed], …]``."""
    return [[f.name, f.offset, f.width, f.signed] for f in fields]


def fields_from_json(data: Sequence[Sequence[Any]]) -> tuple[BitField, ...]:
    """Inverse of :func:`fields_to_json`."""
    return tuple(BitField(str(n), int(o), int(w), bool(s)) for n, o, w, s in data)
