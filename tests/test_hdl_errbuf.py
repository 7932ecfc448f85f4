"""The error buffer alone (Amaranth simulator): serial error writes with random gaps into one
half while passes read the other; δ per lane = the activation derivative of the stored error
(the golden model's ``rhu`` for the LeakyReLU slope), 0 in padding lanes and without a backward
item (docs/numerics.md §5); the scaled errors ``e = rhu(c·δ, k)`` of the learning-rate
products (§5.3) of the update's δ, in the 18-bit formats the compiler picks — per lane from δ,
or (ReLU / identity) once per error at the write, gated by the mask: the same integers."""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator
from hdl_slots import drive_pass
from pipetrain.compiler.build import scaled_error_format
from pipetrain.compiler.plan import Const, QFormat, csd
from pipetrain.hdl.activation import Activation
from pipetrain.hdl.errbuf import ErrorBuffer
from pipetrain.hdl.streams import SlotPipelineSignature
from pipetrain.sim import fixed

FD = QFormat(16, 12)
SLOPE = Const(6554, 16, 0.1)
#: two learning-rate constants (18 significant bits, not shift-add) and their scaled errors
LRS = [Const.normalised(r) for r in (0.002, 0.37)]
SCALES = tuple(
    (c.value, c.frac + FD.frac - fe.frac, fe.bits)
    for c in LRS
    for fe in [scaled_error_format(c, FD, 18)]
)


def _scaled(d: int) -> list[int]:
    """e = rhu(c·δ, k) per scale; each inside its 18 bits (no clamp, numerics §5.3)."""
    out = [fixed.rhu(c * d, k) for c, k, _ in SCALES]
    assert all(-(1 << 17) <= e < 1 << 17 for e in out)
    return out


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
    "act,M,L,at_write,delta_out,reg,B,opr",
    [
        ("relu", 5, 2, False, True, False, 1, False),
        ("leaky_relu", 7, 3, False, True, False, 1, False),
        ("identity", 4, 4, False, True, False, 1, False),
        ("leaky_relu", 3, 1, False, True, False, 1, False),
        # the scaled errors rhu(c·g, k) formed at the write (sbuf), gated by the mask at S1
        ("relu", 5, 2, True, True, False, 1, False),
        ("identity", 4, 4, True, True, True, 1, False),
        (
            "relu",
            3,
            3,
            True,
            False,
            False,
            1,
            False,
        ),  # one row group (read at once), no gbuf: δ is 0
        ("relu", 7, 3, True, False, True, 1, False),  # g registered before c·g
        # B errors a write (a loss unit's out_lanes): 2 + 2 | 2 (the last a padding row), and
        # one row group of 6 in two writes of 3, scaled at the write (B multipliers a scale)
        ("relu", 5, 4, True, True, False, 2, False),
        ("identity", 6, 6, True, True, False, 3, False),
        ("leaky_relu", 5, 4, False, True, False, 4, False),
        # a loss-fed buffer with operand registers: c·g through one operand register (the
        # sbuf write two cycles after g), one error and two a write
        ("relu", 5, 2, True, True, False, 1, True),
        ("relu", 5, 4, True, False, False, 2, True),
    ],
)
def test_error_buffer_delta_is_the_derivative_of_the_stored_error(
    act, M, L, at_write, delta_out, reg, B, opr
):
    """δ and the scaled errors of every slot, with the next sample's errors written during the
    pass (``B`` a write; random values in the padding rows of the last write must not show);
    the buffer's contract: a half is read from two cycles after its last error's write,
    three with ``register_write`` or ``operand_register`` (the scaled errors' write lands one
    cycle after ``g``'s, two with either)."""
    G = -(-M // L)
    N = 3
    rng = random.Random(M * 10 + L + 100 * at_write)
    pipe = SlotPipelineSignature(N, G, G * (N + 1), 4)
    activation = Activation(act, SLOPE if act == "leaky_relu" else None, 2, SHIFT_ADD)
    dut = ErrorBuffer(
        pipe, lanes=L, out_features=M, d_format=FD, activation=activation, scales=SCALES,
        at_write=at_write, delta_out=delta_out, register_write=reg, beat=B,
        operand_register=opr,
    )  # fmt: skip
    beats = -(-M // B)  # writes a sample: M errors, padding rows up to a multiple of B
    errors = [
        [rng.randrange(FD.min_int, FD.max_int + 1) for _ in range(beats * B)] for _ in range(4)
    ]
    results = []

    def payloads(sample: list[int]) -> list:
        """The sample's writes: one error, or a list of B (the write's array elements)."""
        if B == 1:
            return sample[:M]
        return [sample[b * B : b * B + B] for b in range(beats)]

    async def bench(ctx):
        # fill half 0 with sample 0 (gaps between beats)
        ctx.set(dut.halves.write, 0)
        for g in payloads(errors[0]):
            while rng.random() < 0.5:
                await ctx.tick()
            ctx.set(dut.write.valid, 1)
            ctx.set(dut.write.payload, g)
            await ctx.tick()
            ctx.set(dut.write.valid, 0)
        for _ in range(1 + (reg or opr)):
            await ctx.tick()
        # tick t reads half t % 2 and fills the other one with sample t + 1
        for t in range(3):
            rd, bwd = t % 2, t != 1
            ctx.set(dut.halves.read, rd)
            ctx.set(dut.halves.write, 1 - rd)
            todo = payloads(errors[t + 1])
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
                    own = [ctx.get(dut.delta.delta[lane]) for lane in range(L)]
                    es = [
                        [ctx.get(getattr(dut, f"scaled{n}").delta[q]) for n in range(2)]
                        for q in range(L)
                    ]
                    seen.append((pipe[2], own, es))

            await drive_pass(ctx, dut.slots, pipe, rng=rng, gap=0.3, bwd=bwd, cycle=cycle)
            while todo:  # the rest of the next sample's errors after the pass
                ctx.set(dut.write.valid, 1)
                ctx.set(dut.write.payload, todo.pop(0))
                await ctx.tick()
            ctx.set(dut.write.valid, 0)
            for _ in range(
                1 + (reg or opr)
            ):  # the next pass: two cycles after the last write (three)
                await ctx.tick()
            results.append((t, bwd, masks, seen))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert len(results) == 3
    for t, bwd, masks, seen in results:
        assert len(seen) == G * (N + 1)
        for (n, _i, g), deltas, es in seen:
            for lane, d in enumerate(deltas):
                j = g * L + lane
                want = 0
                if bwd and j < M:
                    positive = bool((masks[n] >> lane) & 1)
                    want = _derivative(act, positive, errors[t][j])
                assert d == (want if delta_out else 0), (t, j)
                assert es[lane] == _scaled(want), (t, j)


def test_scaled_errors_at_the_write_need_a_mask_derivative_and_no_addends():
    pipe = SlotPipelineSignature(3, 1, 4, 4)
    leaky = Activation("leaky_relu", SLOPE, 2, SHIFT_ADD)
    with pytest.raises(ValueError, match="mask derivative.*leaky_relu"):
        ErrorBuffer(pipe, lanes=2, out_features=2, d_format=FD, activation=leaky, scales=SCALES,
                    at_write=True)  # fmt: skip
    with pytest.raises(ValueError, match="2 addends"):
        ErrorBuffer(pipe, lanes=2, out_features=2, d_format=FD, activation=Activation("relu"),
                    scales=SCALES, addends=2, at_write=True)  # fmt: skip
    with pytest.raises(ValueError, match="leave δ out"):
        ErrorBuffer(pipe, lanes=2, out_features=2, d_format=FD, activation=Activation("relu"),
                    scales=SCALES, delta_out=False)  # fmt: skip


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


def test_sum_rule_delta_total_clamps_once_per_row_and_delta_stash_keeps_it():
    """The sum rule's parts (docs/numerics.md §5.6): with two addends at S1 the buffer gives
    its own δ (the input gradient's), ``total`` = sat(δ + a0 + a1, d) (the update's), a clamp
    pulse once per live row and pass (column 0), and ``early`` = the S1 δ; 0 in padding lanes
    and without a backward item. A :class:`DeltaStash` returns at S1 the δ an earlier pass
    wrote for the same entry (S2, column 0), while another entry is written."""
    from hdl_slots import pack_lanes
    from pipetrain.hdl.errbuf import DeltaStash

    M, L, N = 5, 2, 3
    G = -(-M // L)
    rng = random.Random(7)
    pipe = SlotPipelineSignature(N, G, G * (N + 1), 4)
    act = Activation("relu")
    dut = ErrorBuffer(
        pipe, lanes=L, out_features=M, d_format=FD, activation=act, addends=2, early=True,
        scales=SCALES,
    )  # fmt: skip
    errors = [rng.randrange(FD.min_int, FD.max_int + 1) for _ in range(M)]
    adds = [[[rng.randrange(FD.min_int, FD.max_int + 1) for _ in range(L)] for _ in range(G)]
            for _ in range(2)]  # fmt: skip
    masks = [rng.randrange(1 << L) for _ in range(G)]
    out = {}

    async def bench(ctx):
        ctx.set(dut.halves.write, 0)
        for g in errors:
            ctx.set(dut.write.valid, 1)
            ctx.set(dut.write.payload, g)
            await ctx.tick()
        ctx.set(dut.write.valid, 0)
        ctx.set(dut.halves.read, 0)
        ctx.set(dut.halves.write, 1)
        for bwd in (True, False):
            seen, pulses = [], []

            def cycle(p, seen=seen, pulses=pulses):
                if p[1] is not None:
                    g = p[1][2]
                    ctx.set(dut.mask.bits, masks[g])
                    for k in range(2):
                        for lane in range(L):
                            ctx.set(getattr(dut, f"addend{k}").delta[lane], adds[k][g][lane])
                    seen.append(("early", p[1], [ctx.get(dut.early.delta[q]) for q in range(L)]))
                if p[2] is not None:
                    own = [ctx.get(dut.delta.delta[q]) for q in range(L)]
                    tot = [ctx.get(dut.total.delta[q]) for q in range(L)]
                    es = [
                        [ctx.get(getattr(dut, f"scaled{n}").delta[q]) for n in range(2)]
                        for q in range(L)
                    ]
                    seen.append(("s2", p[2], own, tot, es))
                pulses.append(ctx.get(dut.saturated))

            await drive_pass(ctx, dut.slots, pipe, rng=rng, gap=0.3, bwd=bwd, cycle=cycle)
            out[bwd] = (seen, pulses)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    clamps = 0
    for g in range(G):
        for lane in range(L):
            j = g * L + lane
            if j < M:
                raw = (errors[j] if (masks[g] >> lane) & 1 else 0) + adds[0][g][lane]
                raw += adds[1][g][lane]
                clamps += not FD.min_int <= raw <= FD.max_int
    assert clamps > 0  # the draws clamp some rows (else the pulse count is not tested)
    for bwd, (seen, pulses) in out.items():
        for rec in seen:
            (_n, _i, g) = rec[1]
            for lane in range(L):
                j = g * L + lane
                live = bwd and j < M
                d = (errors[j] if (masks[g] >> lane) & 1 else 0) if live else 0
                if rec[0] == "early":
                    assert rec[2][lane] == d
                    continue
                total = d + adds[0][g][lane] + adds[1][g][lane]
                assert rec[2][lane] == d
                want = min(max(total, FD.min_int), FD.max_int) if live else 0
                assert rec[3][lane] == want, (bwd, j)
                assert rec[4][lane] == _scaled(want), (bwd, j)  # e of the update's δ: the sum
        assert sum(bin(p).count("1") for p in pulses) == (clamps if bwd else 0)

    # the δ memory: entry 1 (row groups 3..5) written, entry 0 read in the same pass
    ds = DeltaStash(pipe, lanes=L, depth=2 * G, d_format=FD)
    stored = [[[rng.randrange(FD.min_int, FD.max_int + 1) for _ in range(L)] for _ in range(G)]
              for _ in range(2)]  # fmt: skip
    reads = []

    async def bench2(ctx):
        for p, (wb, rb) in enumerate([(0, G), (G, 0)]):  # write entry 0, then entry 1
            ctx.set(ds.write_base, wb)
            ctx.set(ds.read_base, rb)

            def cycle(pp, p=p):
                if pp[2] is not None:
                    for lane in range(L):
                        ctx.set(ds.write.delta[lane], stored[p][pp[2][2]][lane])
                if pp[1] is not None and p == 1:
                    reads.append((pp[1][2], [ctx.get(ds.stored.delta[q]) for q in range(L)]))

            await drive_pass(ctx, ds.slots, pipe, rng=rng, gap=0.3, bwd=True, cycle=cycle)

    sim = Simulator(ds)
    sim.add_clock(1e-8)
    sim.add_testbench(bench2)
    sim.run()
    assert len(reads) == G * (N + 1)
    assert all(vals == stored[0][g] for g, vals in reads)
    assert pack_lanes(stored[0][0], FD.bits) != pack_lanes(stored[1][0], FD.bits)
