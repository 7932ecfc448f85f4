"""The boards' platforms: the amaranth-boards class of a :class:`~pipetrain.compiler.targets.
Board` (the board's resource budget and settings live below hdl/, in
:mod:`pipetrain.compiler.targets`; the fit check is the compiler pass
:mod:`pipetrain.compiler.fit`)."""

from __future__ import annotations

import importlib

from ..compiler.targets import Board, BoardError

__all__ = ["platform_class"]


def platform_class(board: Board) -> type:
    """Import and return the amaranth-boards platform class of ``board``.

    Raises :class:`~pipetrain.compiler.targets.BoardError` when amaranth-boards is not
    installed (fix: ``pip install -e ".[boards]"`` in a checkout, or ``pip install
    amaranth-boards``).
    """
    module, cls = board.platform.split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as exc:
        raise BoardError(
            f"board {board.name!r} needs amaranth-boards: pip install -e '.[boards]' in the "
            f"pipetrain checkout, or pip install amaranth-boards==0.0.21 ({exc})"
        ) from exc
