"""The error buffer alone (Amaranth simulator): serial error writes with random gaps into one
half while passes read the other; δ per lane = the activation derivative of the stored error
(the golden model's ``rhu`` for the LeakyReLU slope), 0 in padding lanes and without a backward
item (docs/numerics.md §5)."""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator
from hdl_slots import drive_pass
from pipetrain.compiler.plan import Const, QFormat, csd
from pipetrain.hdl.activation import Activation
from pipetrain.hdl.errbuf import ErrorBuffer
from pipetrain.hdl.streams import SlotPipelineSignature
from pipetrain.sim import fixed

FD = QFormat(16, 12)
SLOPE = Const(6554, 16, 0.1)


def SHIFT_ADD(value: int) -> bool:  # noqa: N802 - the plan's rule, as Plan.shift_add has it
    """The plan's constant-multiplier rule (``Plan.shift_add``: at most 3 signed digits)."""
    return len(csd(value)) <= 3


def _derivative(act: str, positive: bool, g: int) -> int:
    if act == "identity" or positive:
        return g
    if act == "relu":
        return 0
    return fixed.rhu(g * SLOPE.value, SLOPE.frac)


@pytest.mark.parametrize(
    "act,M,L",
    [("relu", 5, 2), ("leaky_relu", 7, 3), ("identity", 4, 4), ("leaky_relu", 3, 1)],
)
def test_error_buffer_delta_is_the_derivative_of_the_stored_error(act, M, L):
    G = -(-M // L)
    N = 3
    rng = random.Random(M * 10 + L)
    pipe = SlotPipelineSignature(N, G, G * (N + 1), 4)
    activation = Activation(act, SLOPE if act == "leaky_relu" else None, 2, SHIFT_ADD)
    dut = ErrorBuffer(pipe, lanes=L, out_features=M, d_format=FD, activation=activation)
    errors = [[rng.randrange(FD.min_int, FD.max_int + 1) for _ in range(M)] for _ in range(4)]
    results = []

    async def bench(ctx):
        # fill half 0 with sample 0 (gaps between beats)
        ctx.set(dut.halves.write, 0)
        for g in errors[0]:
            while rng.random() < 0.5:
                await ctx.tick()
            ctx.set(dut.write.valid, 1)
            ctx.set(dut.write.payload, g)
            await ctx.tick()
            ctx.set(dut.write.valid, 0)
        # tick t reads half t % 2 and fills the other one with sample t + 1
        for t in range(3):
            rd, bwd = t % 2, t != 1
            ctx.set(dut.halves.read, rd)
            ctx.set(dut.halves.write, 1 - rd)
            todo = list(errors[t + 1])
            masks = {}
            seen = []

            def cycle(pipe, todo=todo, masks=masks, seen=seen):
                if todo and rng.random() < 0.5:
                    ctx.set(dut.write.valid, 1)
                    ctx.set(dut.write.payload, todo.pop(0))
                else:
                    ctx.set(dut.write.valid, 0)
                if pipe[1] is not None:
                    masks[pipe[1][0]] = rng.randrange(1 << L)
                    ctx.set(dut.mask.bits, masks[pipe[1][0]])
                if pipe[2] is not None:
                    seen.append((pipe[2], [ctx.get(dut.delta.delta[lane]) for lane in range(L)]))

            await drive_pass(ctx, dut.slots, pipe, rng=rng, gap=0.3, bwd=bwd, cycle=cycle)
            while todo:  # the rest of the next sample's errors after the pass
                ctx.set(dut.write.valid, 1)
                ctx.set(dut.write.payload, todo.pop(0))
                await ctx.tick()
            ctx.set(dut.write.valid, 0)
            results.append((t, bwd, masks, seen))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert len(results) == 3
    for t, bwd, masks, seen in results:
        assert len(seen) == G * (N + 1)
        for (n, _i, g), deltas in seen:
            for lane, d in enumerate(deltas):
                j = g * L + lane
                if not bwd or j >= M:
                    assert d == 0, (t, j)
                else:
                    positive = bool((masks[n] >> lane) & 1)
                    assert d == _derivative(act, positive, errors[t][j]), (t, j)


def test_unknown_activation_raises_naming_stage_and_choices():
    with pytest.raises(NotImplementedError, match=r"stage 3: activation 'gelu'.*identity, relu"):
        Activation("gelu", None, 3)
    with pytest.raises(ValueError, match="row groups"):
        ErrorBuffer(
            SlotPipelineSignature(3, 2, 8, 4),
            lanes=2,
            out_features=5,
            d_format=FD,
            activation=Activation("relu"),
        )
