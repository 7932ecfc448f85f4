"""The loss unit's cycle count and its parallelism (``hdl/loss.py``; docs/architecture.md §3.8).

The cross-entropy loss unit (docs/numerics.md §4) has two parameters that change only its
speed and size, never a result (the integers are those of the golden model's ``loss_unit`` for
every setting):

* ``exp_lanes`` P — logits through the exp LUT per cycle (P LUT read ports, a P-input adder
  into E); P divides the logit buffer's ``z_lanes``, so the P logits of a cycle are one slice of
  one buffer word;
* ``div_bits`` k — quotient bits of the reciprocal ``r = ⌊2^(fe+fr) / E⌋`` per cycle (k chained
  compare-subtract steps of a restoring divider, or above :data:`CHAINED_DIV_BITS` one radix-2^k
  digit by 2^k − 1 parallel compares; :func:`divider_cycles`);
* ``out_lanes`` Q — errors ``δ_j`` formed per cycle in the out phase (Q products ``e_j·r`` and
  one write of Q values into the feeding stage's error buffer, whose scaled error ``lr·g`` then
  takes Q multipliers too); Q divides P, so the Q exp values of a cycle are one slice of one
  ``ebuf`` word.

:func:`loss_parallelism` picks the smallest pair whose cycles fit the slack the tick leaves the
loss unit (the slowest pass minus the pass of the stage feeding it), so the loss unit does not
set the tick where the pipeline allows it (docs/architecture.md §3.3); ``Q`` > 1 only where no
``(P, k)`` fits with one error a cycle, because each out lane costs two hard multipliers (DSP
blocks, the board's scarcest resource) where P and k cost logic. Source: *derived* from
the lockstep tick (``build.tick_cycles``) with FINN's "fewest resources that meet the slowest
stage" heuristic, as for the stages' lanes (``compiler/lanes.py``).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = [
    "CHAINED_DIV_BITS",
    "DIV_BITS_MAX",
    "divider_cycles",
    "loss_cycles",
    "loss_parallelism",
    "max_tree_levels",
    "radix_compares",
]

#: Most quotient bits per cycle the divider chains: two compare-subtract steps of ~20 bits
#: each between registers (derived: keeps the divider off the critical path next to the
#: stages' multiply-accumulate; three or more would be the longest carry path of the design).
CHAINED_DIV_BITS = 2

#: Most quotient bits per cycle: above :data:`CHAINED_DIV_BITS` the divider takes one
#: radix-2^k digit a cycle by 2^k − 1 compares in parallel (one carry chain, then the digit's
#: select; ``hdl/loss.py``'s ``_Divider``), 15 subtractors of ~24 bits at k = 4 (*derived*:
#: ``fr`` = 16 then takes 5 cycles, not 9, for plans whose loss unit sets the tick).
DIV_BITS_MAX = 4


def divider_cycles(recip_frac: int, div_bits: int) -> int:
    """Cycles of the reciprocal's divider: ``⌈(fr+1)/k⌉`` with ``k`` ≤
    :data:`CHAINED_DIV_BITS` chained steps a cycle; above that, one cycle of two chained steps
    (while the multiples of E are registered) and then one radix-2^k digit a cycle,
    ``1 + ⌈(fr−1)/k⌉``. Source: *derived* (``hdl/loss.py``'s ``_Divider``)."""
    if div_bits <= CHAINED_DIV_BITS:
        return -(-(recip_frac + 1) // div_bits)
    return 1 + -(-(recip_frac - 1) // div_bits)


def max_tree_levels(z_lanes: int) -> int:
    """Register stages of the cross-entropy loss unit's comparison tree over one logit word of
    ``z_lanes`` lanes: ``⌈log2 z_lanes⌉`` (one register after every level of two-input
    compares; 0 for one lane). Source: *derived* from the ULX3S's critical path at
    ``--lanes 16,4``: the word register → a 4-lane tree → the running compare in one cycle was
    18.2 ns (docs/boards.md §4.2)."""
    return max(0, z_lanes - 1).bit_length()


def radix_compares(loss: object) -> int:
    """The parallel compares of a loss unit's radix-2^k divider: ``2^k − 1`` with ``div_bits``
    k > :data:`CHAINED_DIV_BITS`, else 0 (an MSE loss unit's ``div_bits`` is 1). Source:
    ``hdl/loss.py``'s ``_Divider``."""
    k = getattr(loss, "div_bits", 1) or 1
    return (1 << k) - 1 if k > CHAINED_DIV_BITS else 0


def loss_cycles(
    kind: str,
    classes: int,
    exp_frac: int,
    recip_frac: int,
    exp_lanes: int = 1,
    div_bits: int = 1,
    z_lanes: int = 1,
    operand_registers: int = 0,
    out_lanes: int = 1,
) -> int:
    """Cycles of the loss unit from its start pulse to ``done`` (``hdl/loss.py``, derived from
    its phases; the maximum and argmax are taken as the logits arrive): cross-entropy
    ``T`` cycles until the running maximum is final (the comparison tree's
    :func:`max_tree_levels` registers; the last logit word arrives no later than the start) +
    ``⌈C/P⌉`` exp issue cycles + 2 (LUT read, sum into E) + ``⌈(fr+1)/k⌉`` divider cycles
    (:func:`divider_cycles`; ``1 + ⌈(fr−1)/k⌉`` above :data:`CHAINED_DIV_BITS`) +
    ``⌈C/Q⌉`` out issue cycles (the first during the last divider cycle) + 3 (``p`` register, δ
    register, last δ) + 1 start cycle = ``⌈C/P⌉ + divider + ⌈C/Q⌉ + 5 + T``, with ``C``
    classes, ``P`` = ``exp_lanes``, ``k`` = ``div_bits``, ``Q`` = ``out_lanes``,
    ``fr`` = ``recip_frac``,
    ``T = ⌈log2 z_lanes⌉`` (``z_lanes``: logits per buffer word, the feeding stage's lanes),
    + ``R + 4`` with ``R`` = ``operand_registers`` ≥ 1 (``LossUnit.operand_registers``: ``e_j``
    and ``r`` through R registers and their product through one more before ``p``'s, and in
    the exp phase the logit word's selected slice registered, the LUT's index registered
    before the ROM and its entries before their sum into E); MSE
    ``C + 3`` (one phase; P, k and the lanes unused). ``exp_frac`` does not change the count
    (kept for callers)."""
    if kind == "mse":
        return classes + 3
    T = max_tree_levels(z_lanes)
    R = operand_registers + 4 if operand_registers else 0
    out = -(-classes // out_lanes)
    return -(-classes // exp_lanes) + divider_cycles(recip_frac, div_bits) + out + 5 + T + R


def loss_parallelism(
    kind: str,
    classes: int,
    z_lanes: int,
    recip_frac: int,
    slack: int | None,
    operand_registers: int = 0,
    parallel_out: bool = False,
    fastest: bool = False,
    rom_in_logic: Callable[[int], bool] | None = None,
) -> tuple[int, int, int]:
    """``(exp_lanes, div_bits, out_lanes)`` of a loss unit: the cheapest pair ``(P, k)`` (cost P +
    k: one exp lane or one chained divider step each adds one compare/subtract datapath; a
    radix-2^k divider above :data:`CHAINED_DIV_BITS` costs its 2^k − 1 parallel compares,
    derived) whose :func:`loss_cycles` with one error a cycle (Q = 1) ≤ ``slack`` cycles; ties
    go to fewer cycles. When none fits and ``parallel_out`` allows Q > 1 (the feeding
    stage's error buffer takes a word of Q errors a write: a Linear stage's main stream), the
    cheapest triple (cost P + k + Q) that fits; when none fits at all, the fastest pair with Q =
    1 (the loss unit then sets the tick, and the report says so: out lanes are bought only where
    they take the loss unit off the tick — a board short of DSP blocks would otherwise lose the
    lanes they cost elsewhere, e.g. mlp-digits 32,5 on the ULX3S without m·u's low piece in
    logic fits its 156 blocks exactly) — unless ``fastest`` (the board fit's choice for a plan
    whose stages are fast enough for the loss unit to set the tick, e.g. with column lanes):
    then the fastest triple (Q > 1 where ``parallel_out`` allows it, and the radix-2^k divider:
    only there, its compares being logic the fit's estimate counts per divider), the loss unit
    setting a shorter tick. ``slack`` None, or an MSE loss: ``(1, 1, 1)``. P runs over the
    divisors of ``z_lanes``, k over 1..:data:`DIV_BITS_MAX`, Q over the divisors of P.

    ``rom_in_logic(P)``: the exp ROM with P read ports maps to logic, not block RAM (Yosys'
    cost rule, ``build.memory_kind``); such a P is taken only where no setting with the ROM in
    block RAM fits, out lanes included: mlp-digits 32,10 on the ULX3S fits its 33 slack cycles
    at (10, 2, 1) with a 10-port ROM in logic (≈ 5,900 LUT4 more and 72.5 MHz when built;
    docs/boards.md §4.2) or at (5, 2, 2) with the 5-port ROM in 3 DP16KD and 2 more DSP
    blocks — *derived*: 2 of 156 DSP blocks against 7 % of the LUTs."""
    if kind == "mse" or slack is None:
        return 1, 1, 1
    triples = [
        (p, k, q)
        for p in range(1, z_lanes + 1)
        if z_lanes % p == 0
        for k in range(1, DIV_BITS_MAX + 1)
        for q in (range(1, p + 1) if parallel_out else (1,))
        if p % q == 0
    ]

    def cycles(pkq: tuple[int, int, int]) -> int:
        p, k, q = pkq
        return loss_cycles(
            kind, classes, 0, recip_frac, p, k, z_lanes, operand_registers, out_lanes=q
        )

    def size(pkq: tuple[int, int, int]) -> int:  # compare/subtract datapaths and out lanes
        p, k, q = pkq
        return p + (k if k <= CHAINED_DIV_BITS else (1 << k) - 1) + q

    def cost(pkq: tuple[int, int, int]) -> tuple:
        return (size(pkq), cycles(pkq), pkq)

    serial = [t for t in triples if t[2] == 1]
    rom_ok = [t for t in triples if rom_in_logic is None or not rom_in_logic(t[0])]
    pools = (
        [t for t in serial if t in rom_ok],
        rom_ok,  # out lanes before an exp ROM in logic
        serial,
        triples,
    )
    for pool in pools:
        fits = [t for t in pool if cycles(t) <= slack and t[1] <= CHAINED_DIV_BITS]
        if fits:
            return min(fits, key=cost)
    if fastest:  # the radix-2^k divider only here, where the loss unit sets the tick
        return min(triples, key=lambda t: (cycles(t), size(t), t))
    return min(
        (t for t in serial if t[1] <= CHAINED_DIV_BITS), key=lambda t: (cycles(t), size(t), t)
    )
