"""A literal, slow transcription of docs/numerics.md: the oracle for :mod:`.golden`'s speed-ups.

Where :class:`~pipetrain.sim.golden.GoldenModel` ticks a pipeline with vectorised tensors and
pre-computed blocks of random numbers, this module processes **one sample at a time** with
Python integers, element by element, slot by slot, lane by lane, with the bit-serial LFSR
(:func:`pipetrain.sim.lfsr.draw`), and gets the PB delays from a **queue of weight versions**
per stage (docs/architecture.md §2.1: the forward of a sample entering in tick t0 reads the weights
after all
updates of training samples that entered before t0 − D_s; its backward reads the newest).
The tests require the two to agree bit for bit. Slow (pure Python): use small networks.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..compiler.enums import unknown
from ..compiler.plan import LossUnit, Plan, QFormat, Stage
from .fixed import U32_MAX, rhu, rne, rsr, sat_int
from .lfsr import draw

__all__ = ["ScalarResult", "run_scalar"]

Matrix = list[list[int]]


@dataclass
class ScalarResult:
    """Outcome of :func:`run_scalar`.

    w, u: per stage, the final (M, N+1) memories as nested lists.
    results: (sample, pred, loss_raw, train) per sample, in order (the true loss).
    saturations: per-stage counters (main, then head stages), then the loss units' (the true
        loss, then the heads' L_1 … L_{K−1}).
    ticks: the hardware ``ticks`` counter after the final flush (numerics §7).
    samples_applied: training samples whose stage-1 update was applied.
    head_results: per auxiliary head k its loss unit's (sample, pred, loss_raw, train) records.
    head_correct: per head, the samples whose head prediction equals their label.
    """

    w: list[Matrix]
    u: list[Matrix]
    results: list[tuple[int, int, int, bool]]
    saturations: list[int]
    ticks: int
    samples_applied: int
    head_results: dict[int, list[tuple[int, int, int, bool]]]
    head_correct: list[int]


class _Stage:
    def __init__(self, plan: Plan, st: Stage, w0: Matrix) -> None:
        self.st, self.plan = st, plan
        self.conv = getattr(st, "conv", None)  # a convolution stage's geometry (numerics §9)
        conv = self.conv
        self.N = st.in_features if conv is None else conv.taps  # weight matrix (M, N+1)
        self.M = st.out_features if conv is None else conv.out_channels
        self.L = st.lanes
        self.versions: list[tuple[Matrix, Matrix]] = [(w0, [[0] * (self.N + 1)] * self.M)]
        self.lfsr = list(st.lfsr_seeds)
        self.sat = 0

    def count(self, v: int, fmt: QFormat) -> int:
        c, n = sat_int(v, fmt)
        self.sat += n
        return c


def _loss(lu: LossUnit, z: list[int], label: int) -> tuple[int, int, list[int], int]:
    """(pred, loss_raw, δ, saturations) of loss unit ``lu`` (numerics §4), one element at a
    time."""
    C, fy, fd = len(z), lu.z.frac, lu.d.frac
    pred = max(range(C), key=lambda j: (z[j], -j))
    sats = 0
    delta = []
    if lu.kind == "cross_entropy":
        zmax = max(z)
        e = [lu.exp_lut[min(rhu(zmax - zj, fy - lu.exp_lut_frac), len(lu.exp_lut) - 1)] for zj in z]
        E = sum(e)
        r = (1 << (lu.exp_frac + lu.recip_frac)) // E
        p = [rhu(ej * r, lu.exp_frac) for ej in e]
        for j in range(C):
            d, n = sat_int(rhu(p[j], lu.recip_frac - fd) - (j == label) * (1 << fd), lu.d)
            delta.append(d)
            sats += n
        return pred, p[label], delta, sats
    if lu.kind != "mse":
        unknown(lu.kind, "loss")
    loss = 0
    for j in range(C):
        diff = z[j] - (j == label) * (1 << fy)
        loss += diff * diff
        d, n = sat_int(rhu(diff * lu.mse_scale.value, fy + lu.mse_scale.frac - fd), lu.d)
        delta.append(d)
        sats += n
    return pred, min(loss, U32_MAX), delta, sats


def _lut(st: Stage, z: int) -> int:
    """numerics §3.4 literally: |z| splits into the entry index and the interpolation
    remainder; the negative half by symmetry."""
    lut, f = st.activation_lut, st.formats.y.frac
    k = f - lut.index_frac
    a = -z if z < 0 else z
    i = min(a >> k, len(lut.entries) - 1)
    r = a - ((a >> k) << k)
    mag = rhu(lut.entries[i] * 2**k + lut.slopes[i] * r, lut.entry_frac - lut.index_frac)
    if z >= 0:
        return mag
    return -mag if st.activation == "tanh" else 2**f - mag


def _lut_delta(st: Stage, y: int, g: int) -> int:
    """numerics §5.1: δ from the stashed output y."""
    f = st.formats.y.frac
    if st.activation == "tanh":
        q = rhu(2 ** (2 * f) - y * y, f)
    else:
        q = rhu(y * (2**f - y), f)
    return rhu(g * q, f)


def _act(st: Stage, z: int) -> int:
    if st.activation in ("tanh", "sigmoid"):
        return _lut(st, z)
    if st.activation == "relu":
        return max(z, 0)
    if st.activation == "leaky_relu":
        return z if z > 0 else rhu(z * st.negative_slope.value, st.negative_slope.frac)
    if st.activation == "identity":
        return z
    unknown(st.activation, "activation")


def _points(size: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every position of a grid of ``size``, row-major."""
    out: list[tuple[int, ...]] = [()]
    for n in size:
        out = [p + (i,) for p in out for i in range(n)]
    return out


def _flat(pos: tuple[int, ...], size: tuple[int, ...]) -> int:
    k = 0
    for p, n in zip(pos, size, strict=True):
        k = k * n + p
    return k


def _reads(g, o: tuple[int, ...], k: tuple[int, ...]) -> tuple[int, ...] | None:
    """The input position output position ``o`` reads through kernel offset ``k`` (None: a
    padding zero)."""
    pos = tuple(oi * s + ki - p for oi, s, ki, p in zip(o, g.stride, k, g.padding, strict=True))
    return pos if all(0 <= q < n for q, n in zip(pos, g.in_size, strict=True)) else None


def _conv_forward(sg: _Stage, w: Matrix, u: Matrix, w_prev: Matrix, x: list[int], train: bool):
    """numerics §9.1 for one sample: (output values, stash entry (x, (mask, argmax)))."""
    st, f, upd, g = sg.st, sg.st.formats, sg.st.update, sg.conv
    plane = 1
    for n in g.in_size:
        plane *= n
    kern = _points(g.kernel)
    bias_in = (1 << f.x.frac) if g.bias else 0
    z: list[list[int]] = []
    for j in range(g.out_channels):
        row = []
        for o in _points(g.out_size):
            acc = 0
            for t in range(g.taps + 1):
                what = w[j][t]
                if train and upd.lwp_horizon and upd.lwp_form == "v":
                    what = w[j][t] - upd.lwp_horizon * u[j][t]
                elif train and upd.lwp_horizon:
                    what = w[j][t] + upd.lwp_horizon * (w[j][t] - w_prev[j][t])
                what = rhu(what, st.weight_shift)  # the MAC operand (numerics §3.2)
                if t == g.taps:
                    acc += what * bias_in
                    continue
                c, k = divmod(t, len(kern))
                pos = _reads(g, o, kern[k])
                if pos is not None:
                    acc += what * x[c * plane + _flat(pos, g.in_size)]
            row.append(sg.count(rhu(acc, st.mac_w_frac + f.x.frac - f.y.frac), f.y))
        z.append(row)
    mask = [[v > 0 for v in row] for row in z]
    act = [[_act(st, v) for v in row] for row in z]
    out, arg = [], []
    for j in range(g.out_channels):
        arg.append([])
        for q in _points(g.pooled_size):
            vals = [
                act[j][
                    _flat(
                        tuple(qi * k + r for qi, k, r in zip(q, g.pool_size, rr, strict=True)),
                        g.out_size,
                    )
                ]
                for rr in _points(g.pool_size)
            ]
            if g.pool == "avg":
                out.append(sg.count(rhu(sum(vals) * g.pool_scale, g.pool_shift), f.y))
            else:  # max (the first largest), or none (a window of one)
                best = max(range(len(vals)), key=lambda i: (vals[i], -i))
                arg[j].append(best)
                out.append(vals[best])
    return out, (list(x), (mask, arg))


def _conv_backward(sg: _Stage, w: Matrix, x: list[int], aux, gout: list[int]):
    """numerics §9.2 for one sample: (δ rows (C_out, P), gin or None, P (C_out, T+1))."""
    st, f, g = sg.st, sg.st.formats, sg.conv
    mask, arg = aux
    outs = _points(g.out_size)
    wins = _points(g.pool_size)
    plane = 1
    for n in g.in_size:
        plane *= n
    kern = _points(g.kernel)
    e = [[0] * g.positions for _ in range(g.out_channels)]
    for j in range(g.out_channels):
        for qi, q in enumerate(_points(g.pooled_size)):
            gv = gout[j * g.pooled_positions + qi]
            for r, rr in enumerate(wins):
                p = _flat(
                    tuple(a * k + b for a, k, b in zip(q, g.pool_size, rr, strict=True)), g.out_size
                )
                if g.pool == "avg":
                    e[j][p] = rhu(gv * g.pool_scale, g.pool_shift)
                elif r == arg[j][qi]:
                    e[j][p] = gv
    delta = [[0] * g.positions for _ in range(g.out_channels)]
    for j in range(g.out_channels):
        for p in range(g.positions):
            if mask[j][p] or st.activation == "identity":
                delta[j][p] = e[j][p]
            elif st.activation == "leaky_relu":
                delta[j][p] = rhu(e[j][p] * st.negative_slope.value, st.negative_slope.frac)
    bias_in = (1 << f.x.frac) if g.bias else 0
    grad = [[0] * (g.taps + 1) for _ in range(g.out_channels)]
    gacc = [0] * g.in_values
    for j in range(g.out_channels):
        for p, o in enumerate(outs):
            d = delta[j][p]
            grad[j][g.taps] += d * bias_in
            for t in range(g.taps):
                c, k = divmod(t, len(kern))
                pos = _reads(g, o, kern[k])
                if pos is not None:
                    i = c * plane + _flat(pos, g.in_size)
                    grad[j][t] += d * x[i]
                    gacc[i] += rhu(w[j][t], st.weight_shift) * d
    gin = None
    if st.input_gradient:
        k_gin = st.mac_w_frac + f.d.frac - f.gin.frac
        gin = [sg.count(rhu(v, k_gin), f.gin) for v in gacc]
    return [v for row in delta for v in row], gin, grad


def _geometry(plan: Plan) -> tuple[list[int], list[int], dict[int, int], int]:
    """The tick model of numerics §7.2, read off the plan: each stage's position, the stage
    feeding each loss (0-based; the heads' L_1 … L_{K−1}, then the true loss L_K), the
    positions P_t and the span (ticks a sample is in flight)."""
    sts = plan.stages
    pos: list[int] = []
    read = [False] * len(sts)
    for st in sts:
        pos.append(pos[st.attach - 1] + 1 if st.attach else 1)
        if st.attach:
            read[st.attach - 1] = True
    S_main = sum(1 for st in sts if st.role == "main")
    feed = [i for i in range(S_main, len(sts)) if not read[i]] + [S_main - 1]
    P = {t: pos[i] for t, i in enumerate(feed, start=1)}
    span = max(P.values()) + 1
    for i, st in enumerate(sts):
        for t in st.grad_losses or st.losses:
            span = max(span, 2 * P[t] - pos[i] + 1)
    return pos, feed, P, span


def _update(plan: Plan, sg: _Stage, w: Matrix, u: Matrix, xb, delta, grad) -> tuple:
    """numerics §5.3–§5.5 for one sample, slot by slot and lane by lane with the LFSR draws:
    the new (w, u) from the newest (w, u), the stashed ``xb`` and δ (a convolution: its
    summed gradient ``grad``)."""
    st, f, c = sg.st, sg.st.formats, sg.st.update
    stochastic = plan.rounding == "stochastic"
    R = plan.round_bits
    w1 = [[0] * (sg.N + 1) for _ in range(sg.M)]
    u1 = [[0] * (sg.N + 1) for _ in range(sg.M)]
    fw, fp = f.w.frac, f.d.frac + f.x.frac
    K = st.column_lanes  # physical lane s·L + l: row l's columns i ≡ s (mod k)
    for g_ in range(st.row_groups):
        for t in range(-(-(sg.N + 1) // K)):
            for lane in range(sg.L * K):
                r_u = r_w = 0
                if stochastic:
                    sg.lfsr[lane] = draw(
                        sg.lfsr[lane], plan.lfsr_poly, plan.lfsr_width, plan.lfsr_leap
                    )
                    r_u = sg.lfsr[lane] & ((1 << R) - 1)
                    r_w = (sg.lfsr[lane] >> R) & ((1 << R) - 1)
                j, i = g_ * sg.L + lane % sg.L, t * K + lane // sg.L
                if j >= sg.M or i > sg.N:
                    continue  # a padding lane or column: it drew, it does nothing else
                P = delta[j] * xb[i] if grad is None else grad[j][i]
                dj, xi = (delta[j], xb[i]) if grad is None else (0, 0)

                def al(const, operand: int, ofrac: int, fto: int) -> int:
                    if const.value == 0:
                        return 0
                    return (const.value * operand) << (fto - const.frac - ofrac)

                def lr_term(const, fe, fto: int, P: int = P, dj: int = dj, xi: int = xi) -> int:
                    if fe is None:  # const·P exact
                        return al(const, P, fp, fto)
                    e = rhu(const.value * dj, const.frac + f.d.frac - fe.frac)  # §5.3
                    return (e * xi) << (fto - fe.frac - f.x.frac)

                def rnd(v: int, kk: int, r: int) -> int:
                    return rsr(v, kk, r, R) if stochastic else rne(v, kk)

                U = (
                    al(c.momentum, u[j][i], fw, c.frac_u)
                    + lr_term(c.lr, c.lr_delta, c.frac_u)
                    + al(c.lr_wd, w[j][i], fw, c.frac_u)
                )
                un = sg.count(rnd(U, c.frac_u - fw, r_u), f.u)
                if c.sc:
                    V = (
                        al(c.sc_a, un, fw, c.frac_v)
                        + lr_term(c.sc_lr_b, c.sc_lr_b_delta, c.frac_v)
                        + al(c.sc_lr_wd_b, w[j][i], fw, c.frac_v)
                    )
                    wn = sg.count(w[j][i] - rnd(V, c.frac_v - fw, r_w), f.w)
                else:
                    wn = sg.count(w[j][i] - un, f.w)
                u1[j][i], w1[j][i] = un, wn
    return w1, u1


def _delta(sg: _Stage, mask, g: list[int]) -> list[int]:
    """numerics §5.1: δ_j = f′(z_j)·g_j from the stashed mask (tanh/sigmoid: the output y)."""
    st = sg.st
    delta = []
    for j in range(sg.M):
        if st.activation in ("tanh", "sigmoid"):
            delta.append(_lut_delta(st, mask[j], g[j]))  # mask: the stashed y
        elif mask[j] or st.activation == "identity":
            delta.append(g[j])
        elif st.activation == "leaky_relu":
            delta.append(rhu(g[j] * st.negative_slope.value, st.negative_slope.frac))
        elif st.activation == "relu":
            delta.append(0)
        else:
            unknown(st.activation, "activation")
    return delta


def run_scalar(
    plan: Plan, w0: list[Matrix], samples: list[tuple[list[int], int, bool]]
) -> ScalarResult:
    """Run quantised ``samples`` (x ints (N,), label, train) through the plan, then flush.

    ``w0`` gives each stage's initial integer weights (M, N+1), every stage of the plan (main,
    then auxiliary heads). Samples enter back to back (``pb``) or ``span`` ticks apart
    (``sequential``: one in flight). Each sample runs its events in the tick model's order
    (numerics §7.2): the forwards; every loss unit; each backward stream ``t`` at stage
    position ``p`` in tick ``2·P_t − p``, sent on to the attach stage when it is in
    ``gin_losses``; each stage's one update in tick ``p − 1 + D_s`` (after that tick's
    streams) with δ = the sum of its update streams' δ (clamped to d when there are several,
    numerics §5.6). Every read — forward or stream — takes the version the stage holds then:
    the updates of training samples that entered at ``t_j`` with ``t_j + p − 1 + D_s`` before
    the read's tick (and the sample's own update once made), counted from the entry ticks.
    """
    sts = plan.stages
    n_st = len(sts)
    stages = [_Stage(plan, st, [row[:] for row in w]) for st, w in zip(sts, w0, strict=True)]
    pos, feed, P, span = _geometry(plan)
    K = len(feed)
    units = [*plan.head_losses, plan.loss]  # loss unit of L_t at index t − 1
    # the tick model's delay of every stream and the stage's update tick (numerics §7.2)
    upd_tick = []
    for i, st in enumerate(sts):
        D = max(2 * (P[t] - pos[i]) + 1 for t in st.losses)
        upd_tick.append(pos[i] - 1 + D)
    gap = span if plan.schedule == "sequential" else 1
    entries: list[tuple[int, bool]] = []  # (entry tick, train) of samples so far
    results: list[tuple[int, int, int, bool]] = []
    head_results: dict[int, list[tuple[int, int, int, bool]]] = {t: [] for t in range(1, K)}
    loss_sat = [0] * K
    hits = [0] * (K - 1)
    applied = 0

    def version(i: int, tick: int, own: bool) -> tuple[Matrix, Matrix, Matrix]:
        """(w, u, w_prev) of stage i as read in relative tick ``tick`` of the current sample
        (``own``: its own update is already made)."""
        k = sum(1 for (tj, tr) in entries if tr and tj + upd_tick[i] < t0 + tick) + int(own)
        w, u = stages[i].versions[k]
        w_prev = stages[i].versions[k - 1][0] if k > 0 else w
        return w, u, w_prev

    for n, (x, label, train) in enumerate(samples):
        t0 = n * gap
        # ---- forwards in plan order (every stage after the one it reads) --------------------
        outs: list[list[int]] = []
        stash: list = []
        for i, sg in enumerate(stages):
            st, f, upd = sg.st, sg.st.formats, sg.st.update
            a = list(x) if st.attach == 0 else outs[st.attach - 1]
            w, u, w_prev = version(i, pos[i] - 1, False)
            if sg.conv is not None:  # numerics §9.1, in loops
                out, entry = _conv_forward(sg, w, u, w_prev, a, train)
                outs.append(out)
                stash.append(entry)
                continue
            xb = a + [1 << f.x.frac]
            out, mask = [], []
            for j in range(sg.M):
                acc = 0
                for c in range(sg.N + 1):
                    what = w[j][c]
                    if train and upd.lwp_horizon and upd.lwp_form == "v":
                        what = w[j][c] - upd.lwp_horizon * u[j][c]
                    elif train and upd.lwp_horizon:
                        what = w[j][c] + upd.lwp_horizon * (w[j][c] - w_prev[j][c])
                    acc += rhu(what, st.weight_shift) * xb[c]  # the MAC operand (§3.2)
                zj = sg.count(rhu(acc, st.mac_w_frac + f.x.frac - f.y.frac), f.y)
                mask.append(zj > 0)
                out.append(_act(st, zj))
            stash.append((xb, out if st.activation in ("tanh", "sigmoid") else mask))
            outs.append(out)
        # ---- every loss unit on the output of the stage feeding it ---------------------------
        err: dict[tuple[int, int], list[int]] = {}  # (stage, loss) → the error arriving
        for t in range(1, K + 1):
            pred, loss_raw, g, sats = _loss(units[t - 1], outs[feed[t - 1]], label)
            if t == K:
                results.append((n, pred, loss_raw, train))
            else:
                head_results[t].append((n, pred, loss_raw, train))
                hits[t - 1] += pred == label
            if train:
                loss_sat[t - 1] += sats
                err[(feed[t - 1], t)] = g
        if not train:
            entries.append((t0, train))
            continue
        # ---- backward streams and updates in tick order --------------------------------------
        events = []
        for i, st in enumerate(sts):
            for t in sorted(st.grad_losses or st.losses):
                events.append((2 * P[t] - pos[i], 0, i, t))
            events.append((upd_tick[i], 1, i, 0))
        dsum: list[list[int] | None] = [None] * n_st
        grads: list = [None] * n_st
        for tick, kind, i, t in sorted(events):
            sg, st = stages[i], sts[i]
            if kind == 1:  # the stage's one update, after this tick's streams
                delta = dsum[i]
                if len(st.losses) > 1 and sg.conv is None:  # several losses: clamp the sum
                    delta = [sg.count(v, st.formats.d) for v in delta]
                w, u, _ = version(i, tick, False)
                sg.versions.append(_update(plan, sg, w, u, stash[i][0], delta, grads[i]))
                if i == 0:
                    applied += 1
                continue
            g = err.pop((i, t))
            w, _, _ = version(i, tick, tick > upd_tick[i])
            xb, mask = stash[i]
            grad = None
            if sg.conv is not None:  # numerics §9.2: δ, gin and P, in loops
                delta, gin, grad = _conv_backward(sg, w, xb, mask, g)
            else:
                delta = _delta(sg, mask, g)
                gin = None
                if t in st.gin_losses:
                    k_gin = st.mac_w_frac + st.formats.d.frac - st.formats.gin.frac
                    kw = st.weight_shift  # the MAC operand rhu(w, kw) (numerics §5.2)
                    gin = [
                        sg.count(rhu(sum(rhu(w[j][c], kw) * delta[j] for j in range(sg.M)),
                                     k_gin), st.formats.gin)
                        for c in range(sg.N)
                    ]  # fmt: skip
            if t in st.gin_losses and gin is not None:
                err[(st.attach - 1, t)] = gin
            if t in st.losses:
                dsum[i] = (
                    delta
                    if dsum[i] is None
                    else [a + b for a, b in zip(dsum[i], delta, strict=True)]
                )
                grads[i] = grad
        entries.append((t0, train))
    if plan.schedule == "sequential":  # the counter advances once per sample (numerics §7)
        ticks = len(samples)
    else:
        ticks = len(samples) - 1 + span if samples else 0
    return ScalarResult(
        w=[sg.versions[-1][0] for sg in stages],
        u=[sg.versions[-1][1] for sg in stages],
        results=results,
        saturations=[min(sg.sat, U32_MAX) for sg in stages]
        + [min(v, U32_MAX) for v in [loss_sat[-1], *loss_sat[:-1]]],
        ticks=ticks,
        samples_applied=applied,
        head_results=head_results,
        head_correct=[min(v, U32_MAX) for v in hits],
    )
