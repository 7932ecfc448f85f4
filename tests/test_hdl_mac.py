"""The MAC lanes alone (Amaranth simulator), against exact integer references from the golden
model's operators (:mod:`pipetrain.sim.fixed`; docs/numerics.md §2, §5), with random gaps
between slots:

* :class:`ForwardLanes`: per row group, ``z = sat(rhu(Σ ŵ·x, w.frac + x.frac − y.frac), y)``,
  the activation (the golden model's LeakyReLU rounding), the ``z > 0`` mask, one output word
  per group in forward passes only, and the clamps of live lanes;
* :class:`InputGradient`: ``gin_i = sat(rhu(Σ_j w_ji·δ_j, w.frac + d.frac − gin.frac), gin)`` in
  column order, with one and with several row groups (partial sums in ``gacc``).
"""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator
from hdl_slots import drive_pass
from pipetrain.compiler.build import gin_stage, input_gradient_split
from pipetrain.hdl.activation import activation_of
from pipetrain.hdl.mac import ForwardLanes, InputGradient
from pipetrain.hdl.streams import SlotPipelineSignature
from pipetrain.sim import fixed
from tiny_net import tiny


def _value(rng, bits, edge=0.15):
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if rng.random() < edge:
        return rng.choice([lo, hi])
    return rng.randrange(lo // 4, hi // 4)


def _act(st, z):
    if st.activation == "relu":
        return max(z, 0)
    if st.activation == "leaky_relu" and z <= 0:
        sl = st.negative_slope
        return fixed.rhu(z * sl.value, sl.frac)
    return z


def _unpack(word, bits, n):
    out = []
    for k in range(n):
        v = (word >> (k * bits)) & ((1 << bits) - 1)
        out.append(v - (1 << bits) if v >> (bits - 1) else v)
    return out


@pytest.mark.parametrize(
    "case,s",
    [
        (dict(), 0),
        (dict(), 1),
        (dict(mitigation="lwp"), 2),
        (dict(lanes=(5, 2, 3)), 0),
        # the ECP5's operand registers: the products, sums and outputs one stage later
        (dict(operand_registers=1), 1),
        (dict(mitigation="lwp", lanes=(5, 2, 3), operand_registers=1), 0),
        # two operand registers (an experiment's P = 2): two stages later, per-lane controls
        (dict(operand_registers=2), 1),
        (dict(mitigation="lwp", lanes=(5, 2, 3), operand_registers=2), 0),
        # column lanes (Stage.col_lanes): each row's k products summed before its accumulator,
        # in a register of their own at P = 2 (the outputs one stage later); padding columns
        (dict(col_lanes=(3,)), 0),
        (dict(col_lanes=(2,), operand_registers=1), 0),
        (dict(col_lanes=(3,), operand_registers=2, mitigation="lwp"), 0),
    ],
)
def test_forward_lanes_equal_the_reference(case, s):
    plan, _, _ = tiny(**case)
    st = plan.stages[s]
    f, N, G, L, M = st.formats, st.in_features, st.row_groups, st.lanes, st.out_features
    K, C = st.column_lanes, st.group_slots  # slot t: columns t·K … t·K + K − 1
    pipe = SlotPipelineSignature(C - 1, G, st.cycles_per_tick, st.write_stage)
    dut = ForwardLanes(
        pipe,
        lanes=L,
        live_last=M - (G - 1) * L,
        acc_bits=st.acc_fwd_bits,
        w_format=st.mac_w_format,
        x_format=f.x,
        y_format=f.y,
        what_bits=st.w_hat_operand_bits,
        x_operand_bits=st.x_operand_bits,
        activation=activation_of(st, plan.shift_add),
        operand_registers=st.operand_registers or 0,
        columns=K,
    )
    rng = random.Random(s * 17 + len(case))
    log = []
    P = st.operand_registers or 0
    out_stage = 5 + P + (1 if K > 1 and P >= 2 else 0) if P else 4
    assert out_stage <= st.write_stage  # inside the pass: it is not longer

    async def bench(ctx):
        for fwd in (True, False, True, True):
            ops, outs, flags = {}, [], [0] * L

            def cycle(pipe_, ops=ops, outs=outs, flags=flags):
                s2 = pipe_[2]
                if s2 is not None:
                    n, t, _ = s2
                    wh = [_value(rng, st.w_hat_operand_bits) for _ in range(L * K)]
                    cols = [t * K + c for c in range(K)]  # the stash's operands of slot t
                    x = [(1 << f.x.frac) if i == N else 0 if i > N else _value(rng, f.x.bits)
                         for i in cols]  # fmt: skip
                    ops[n] = (wh, x)
                    for k in range(L * K):
                        ctx.set(dut.weights.w_hat[k], wh[k])
                    if K == 1:
                        ctx.set(dut.operands.x_fwd, x[0])
                    for c in range(K if K > 1 else 0):
                        ctx.set(dut.operands.x_fwd[c], x[c])
                y, mw = dut.y, dut.mask_write
                assert ctx.get(y.valid) == ctx.get(mw.valid)
                if ctx.get(y.valid):
                    assert ctx.get(mw.payload.group) == ctx.get(y.payload.word)
                    # y leaves at S4 of the group's bias slot, S5+P with operand registers
                    at = pipe_[out_stage]
                    assert at is not None and at[1:] == (C - 1, ctx.get(y.payload.word)), at
                    outs.append(
                        (ctx.get(y.payload.word), ctx.get(y.payload.data), ctx.get(mw.payload.bits))
                    )
                sat = ctx.get(dut.saturated)
                for k in range(L):
                    flags[k] += (sat >> k) & 1

            await drive_pass(ctx, dut.slots, pipe, rng=rng, gap=0.3, fwd=fwd, cycle=cycle)
            log.append((fwd, ops, outs, flags))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    clamps = 0
    for fwd, ops, outs, flags in log:
        if not fwd:
            assert outs == [] and flags == [0] * L
            continue
        assert [g for g, _, _ in outs] == list(range(G))
        exp_flags = [0] * L
        for g, data, mask in outs:
            a = _unpack(data, f.y.bits, L)
            for k in range(L):  # row lane k: physical lanes c·L + k, operand c
                acc = sum(
                    ops[g * C + t][0][c * L + k] * ops[g * C + t][1][c]
                    for t in range(C)
                    for c in range(K)
                )
                z, c = fixed.sat_int(fixed.rhu(acc, st.mac_w_frac + f.x.frac - f.y.frac), f.y)
                assert a[k] == _act(st, z), (g, k)
                assert (mask >> k) & 1 == (z > 0), (g, k)
                if g * L + k < M:
                    exp_flags[k] += c
        assert flags == exp_flags
        clamps += sum(flags)
    assert clamps > 0


@pytest.mark.parametrize(
    "case,s",
    [
        (dict(), 1),
        (dict(mitigation="sc"), 2),
        (dict(lanes=(2, 4, 3)), 1),  # one row group of 4 lanes: rounded at S4
        (dict(lanes=(5, 2, 3)), 2),  # one group of 3: rhu's offset a leaf of the lane tree
        (dict(operand_registers=1), 1),  # two row groups: gacc read and written one later
        (dict(operand_registers=2), 1),  # and two later
        (dict(mitigation="sc", operand_registers=2), 2),
        # more than TREE_SPLIT_LANES lanes (L, G): the sum across lanes registered half-way,
        # gin one stage later; with gacc (G = 2) and without, P = 1 and 2
        (dict(operand_registers=1, wide=(17, 2)), 1),
        (dict(operand_registers=2, wide=(22, 2)), 1),
        (dict(operand_registers=1, wide=(20, 1)), 2),
        (dict(wide=(22, 2)), 1),  # no operand registers: one cycle, as for fewer lanes
    ],
)
def test_input_gradient_equals_the_reference(case, s):
    case = dict(case)
    wide = case.pop("wide", None)
    plan, _, _ = tiny(**case)
    st = plan.stages[s]
    f, N, G, L = st.formats, st.in_features, st.row_groups, st.lanes
    acc_bits = st.acc_bwd_bits
    if wide is not None:  # the tiny net's formats, a lane count of a wide stage
        L, G = wide
        acc_bits += L.bit_length()  # Σ of L·G products instead of the plan's
    P = st.operand_registers or 0
    X = int(input_gradient_split(L, P))
    assert X == int(wide is not None and P >= 1)
    pipe = SlotPipelineSignature(N, G, G * (N + 1), st.write_stage)
    assert gin_stage(L, P) == 4 + P + X <= st.write_stage  # gin inside the pass
    dut = InputGradient(
        pipe,
        lanes=L,
        acc_bits=acc_bits,
        w_format=st.mac_w_format,
        d_format=f.d,
        gin_format=f.gin,
        what_bits=st.w_hat_operand_bits,
        operand_registers=P,
    )
    rng = random.Random(s * 31 + len(case) + L)
    log = []

    async def bench(ctx):
        for bwd in (True, True, False, True):
            ops, outs, flags = {}, [], [0]

            def cycle(pipe_, ops=ops, outs=outs, flags=flags):
                s2 = pipe_[2]
                if s2 is not None:
                    w = [_value(rng, st.w_operand_bits) for _ in range(L)]
                    d = [_value(rng, f.d.bits) for _ in range(L)]
                    ops[s2[0]] = (w, d)
                    for k in range(L):
                        ctx.set(dut.weights.w[k], w[k])
                        ctx.set(dut.delta.delta[k], d[k])
                if ctx.get(dut.gin.valid):
                    outs.append((pipe_[4 + P + X][1], ctx.get(dut.gin.payload)))
                flags[0] += ctx.get(dut.saturated)

            await drive_pass(ctx, dut.slots, pipe, rng=rng, gap=0.35, bwd=bwd, cycle=cycle)
            log.append((bwd, ops, outs, flags[0]))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    clamps = 0
    for bwd, ops, outs, nflags in log:
        if not bwd:
            assert outs == [] and nflags == 0
            continue
        assert [i for i, _ in outs] == list(range(N))
        exp = 0
        for i, gin in outs:
            acc = sum(
                ops[g * (N + 1) + i][0][k] * ops[g * (N + 1) + i][1][k]
                for g in range(G)
                for k in range(L)
            )
            v, c = fixed.sat_int(fixed.rhu(acc, st.mac_w_frac + f.d.frac - f.gin.frac), f.gin)
            assert gin == v, i
            exp += c
        assert nflags == exp
        clamps += nflags
    assert clamps > 0


def test_input_gradient_refuses_the_accumulator_race():
    pipe = SlotPipelineSignature(3, 2, 8, 4)
    plan, _, _ = tiny()
    f = plan.stages[1].formats
    with pytest.raises(NotImplementedError, match="N=3 < 4"):
        InputGradient(
            pipe, lanes=2, acc_bits=40, w_format=f.w, d_format=f.d, gin_format=f.gin, what_bits=16
        )
