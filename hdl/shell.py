"""The board shell: what a board design holds besides the plan's network, for the fit check.

:func:`board_shell` elaborates the link engine (``LinkEngine(plan)``) and the board top's RX
FIFO without a platform and lists their memories as a
:class:`~pipetrain.compiler.fit.Shell`; the compiler's fit pass places them on the board's RAM
family next to the plan's own (``compiler/fit.py``: the compiler cannot import the HDL, so the
host hands this function to it, ``host/flow.py``). Source: derived from the HDL
(``hdl/link*.py``, ``hdl/board.py``), checked against the build's netlist (docs/boards.md §3).
"""

from __future__ import annotations

from amaranth.hdl import Fragment
from amaranth.lib.fifo import SyncFIFOBuffered

from ..compiler.fit import Shell
from ..compiler.plan import Plan
from .link import LinkEngine
from .resources import MemoryUse, _memories

__all__ = ["BOARD_RX_FIFO_DEPTH", "board_shell"]


#: RX FIFO depth (bytes) of the board top (``hdl.board.BoardTop``'s default ``fifo_depth``).
BOARD_RX_FIFO_DEPTH = 64

_SHELLS: dict[tuple, Shell] = {}


def board_shell(plan: Plan, onchip_samples: int = 0) -> Shell:
    """The memories a board design holds besides ``NetworkTop(plan)``: the link engine's
    (``LinkEngine(plan, onchip_samples=…)``: receiver buffer of ``rx_max`` bytes, the
    dispatcher's state memory, the results buffer, and with ``onchip_samples`` > 0 the on-chip
    training set's feature and label memories and its label FIFO; protocol.md §2) and the board
    top's RX FIFO storage
    (:data:`BOARD_RX_FIFO_DEPTH` bytes), elaborated without a platform (under a second; cached
    by what the link sizes depend on: inputs, input format, stages' shapes, classes).

    On the iCEBreaker plan of ``mlp-digits`` that is 792 × 8, 512 × 8, 512 × 8 and 63 × 8 bits
    (12-bit inputs bit-packed: 99-byte records, 8 per frame, 32 results buffered): 5 EBR,
    the difference between the plan's 16 and the 21 the bitstream build uses (measured:
    21 / 30); on the ULX3S 3 DP16KD and LUT RAM (24 vs 21). Source: derived from the HDL
    (``hdl/link*.py``, ``hdl/board.py``; the build's netlist names them, docs/boards.md §3).
    """
    key = (
        onchip_samples,
        plan.in_features,
        plan.stages[0].formats.x.bits,
        plan.loss.classes,
        tuple(
            (s.in_features, s.out_features, s.update.lwp_horizon > 0 and s.update.lwp_form == "w")
            for s in plan.stages
        ),
    )
    if key not in _SHELLS:
        out: list[MemoryUse] = []
        engine = LinkEngine(plan, onchip_samples=onchip_samples)
        _memories(Fragment.get(engine, None), "/core/link", out)
        fifo = SyncFIFOBuffered(width=8, depth=BOARD_RX_FIFO_DEPTH)
        _memories(Fragment.get(fifo, None), "/rx_fifo", out)
        mems = tuple((m.path, m.depth, m.width, m.read_ports, m.write_ports) for m in out)
        _SHELLS[key] = Shell(mems)
    return _SHELLS[key]
