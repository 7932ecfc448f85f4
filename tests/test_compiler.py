"""Compiler: torch.fx front end, plan building (heads, validation, memories), lanes, formats."""

import itertools
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from pipetrain.compiler.build import (
    RAM_FAMILIES,
    FormatSpec,
    PlanError,
    PlanWarning,
    build_plan,
    map_memory,
    memory_kind,
    place_memory,
    stage_cycles,
)
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.formats import (
    DATA_BITS,
    HEADROOM,
    WEIGHT_BITS,
    FormatError,
    apply_overrides,
    format_for_range,
    parse_format_overrides,
    parse_qformat,
)
from pipetrain.compiler.frontend import CompileError, trace
from pipetrain.compiler.lanes import choose_lanes, lane_multipliers, parse_lanes
from pipetrain.compiler.models import ModelError, build_mlp, load_model
from pipetrain.compiler.plan import Plan, QFormat
from pipetrain.data import load_digits
from pipetrain.sim.calibrate import auto_formats
from torch import nn


def _ir(spec="mlp-digits"):
    name, model, _ = load_model(spec)
    return trace(model, name)


# ---- front end ----------------------------------------------------------------------------


def test_trace_builtin_models():
    ir = _ir("mlp-digits-deep")
    assert ir.in_features == 64 and ir.classes == 10
    assert [(ly.name, ly.in_features, ly.out_features, ly.activation) for ly in ir.layers] == [
        ("0", 64, 32, "relu"),
        ("2", 32, 32, "relu"),
        ("4", 32, 32, "relu"),
        ("6", 32, 10, "identity"),
    ]


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8)
        self.act = nn.LeakyReLU(0.125)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return self.drop(self.act(self.fc(x)))


class _Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.flat = nn.Flatten()
        self.body = _Block()
        self.skip = nn.Identity()
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.skip(self.body(self.flat(x))))


def test_trace_nested_modules_leaky_slope_and_dropout_warning():
    with pytest.warns(UserWarning, match=r"'body.drop' \(Dropout, p=0.1\) is compiled as identity"):
        ir = trace(_Nested(), "nested", "mse")
    assert ir.loss == "mse"
    assert [(ly.name, ly.activation, ly.negative_slope) for ly in ir.layers] == [
        ("body.fc", "leaky_relu", 0.125),
        ("head", "identity", 0.0),
    ]


class _Func(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.fc, self.out, self.how = nn.Linear(4, 4), nn.Linear(4, 2), how

    def forward(self, x):
        h = self.fc(x)
        if self.how == "torch.relu":
            h = torch.relu(h)
        elif self.how == "F.relu":
            h = F.relu(h)
        elif self.how == "add":
            h = h + 1
        elif self.how == "control":
            if h.sum() > 0:  # data-dependent: fx cannot trace
                h = -h
        elif self.how == "skip":
            h = self.fc(x) + x
        return self.out(h)


class _Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(self.conv(x))


BAD_MODELS = {
    "lstm": (nn.Sequential(nn.Linear(4, 4), nn.LSTM(4, 4)), ["'1'", "LSTM", "supported"]),
    "conv": (_Conv(), ["'conv'", "Conv2d", "supported"]),
    "gelu": (nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 2)), ["'1'", "GELU"]),
    "add": (_Func("add"), ["operator 'add'", "supported"]),
    "control": (_Func("control"), ["cannot be traced", "control flow", "test_compiler.py"]),
    "skip": (_Func("skip"), ["module 'fc' (Linear) is called more than once"]),
    "act-first": (nn.Sequential(nn.ReLU(), nn.Linear(4, 2)), ["'0'", "ReLU", "before the first"]),
    "two-acts": (
        nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.LeakyReLU(), nn.Linear(4, 2)),
        ["'2'", "LeakyReLU", "follows another activation"],
    ),
    "sizes": (nn.Sequential(nn.Linear(4, 5), nn.Linear(4, 2)), ["'1'", "expects 4", "produces 5"]),
    "no-bias": (nn.Sequential(nn.Linear(4, 2, bias=False)), ["'0'", "no bias"]),
    "no-linear": (nn.Sequential(nn.Flatten()), ["no nn.Linear"]),
}


@pytest.mark.parametrize("case", list(BAD_MODELS))
def test_trace_rejects_unsupported_models_with_path_type_and_supported_set(case):
    model, needles = BAD_MODELS[case]
    with pytest.raises(CompileError) as info:
        trace(model, "bad")
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
    assert isinstance(info.value, ModelError)  # the CLI reports it as a user error


def test_trace_rejects_non_module():
    with pytest.raises(CompileError, match="is a dict, not a torch.nn.Module"):
        trace({"a": 1}, "x")


# ---- plan: delays, heads, streams ---------------------------------------------------------


def test_pb_and_sequential_delays_and_cycles():
    ir = _ir("mlp-digits-deep")
    plan = build_plan(ir, TrainConfig(), lanes=[4, 3, 3, 1])
    assert plan.delays == (7, 5, 3, 1)  # 2(S−s)+1, S = 4
    assert [s.stash_depth for s in plan.stages] == [8, 6, 4, 2]
    assert [s.cycles_per_tick for s in plan.stages] == [8 * 65, 11 * 33, 11 * 33, 10 * 33]
    # tick = slowest pass (520 slots + 5 pipeline) + 2 control cycles; the loss unit
    # (⌈10/1⌉ + ⌈17/1⌉ + 10 + 4 = 41 cycles: one exp lane, one quotient bit a cycle, as the
    # slack of 525 − 335 cycles allows) after stage 4's pass (330 + 5) ends earlier
    assert (plan.loss.exp_lanes, plan.loss.div_bits, plan.loss.cycles) == (1, 1, 42)
    assert plan.tick_cycles == 520 + 5 + 2 == plan.ideal_cycles_per_sample
    seq = build_plan(ir, TrainConfig(schedule="sequential"), lanes=[4, 3, 3, 1])
    assert seq.delays == (0, 0, 0, 0)
    # one sample at a time: admit, forward and backward pass per stage (+1 control each), loss
    assert seq.ideal_cycles_per_sample == 1 + 2 * (526 + 369 + 369 + 336) + 42 + 1
    assert [s.input_gradient for s in plan.stages] == [False, True, True, True]


HEAD_CONFIGS = [
    dict(strategy="local", blocks=(2,)),
    dict(strategy="local", blocks=(1, 3), schedule="sequential"),
    dict(strategy="interlocking", blocks=(1, 2), distance=1, head_stages=2),
    dict(strategy="interlocking", blocks=(1, 2, 3), distance=1, head_stages=2, rule="sum"),
    dict(strategy="interlocking", blocks=(1, 2), distance=2, rule="sum"),
]


@pytest.mark.parametrize("cfg", HEAD_CONFIGS, ids=lambda c: f"{c['strategy']}-{c['blocks']}")
def test_head_stage_delays_equal_reference_trainer(cfg):
    from pipetrain.sim.reference import ReferenceTrainer

    name, model, _ = load_model("mlp-digits-deep")
    config = TrainConfig(**cfg)
    plan = build_plan(trace(model, name), config, lanes=[1, 1, 1, 1])
    ref = ReferenceTrainer(model, config)
    assert plan.delays == ref.delays
    assert [(s.in_features, s.out_features) for s in plan.stages] == [
        (spec.in_features, spec.out_features) for spec in ref.stages
    ]
    assert len(plan.head_losses) == len(config.blocks)


def test_interlocking_streams_and_heads():
    # K = 3 blocks (stages 1 | 2 | 3, 4), d = 1, two-stage heads: block k is updated by
    # L_{k+1}, the last block by the true loss L3
    ir = _ir("mlp-digits-deep")
    cfg = TrainConfig(strategy="interlocking", blocks=(1, 2), distance=1, head_stages=2)
    plan = build_plan(ir, cfg, lanes=[1, 1, 1, 1])
    rows = [
        (s.index, s.role, s.block, s.losses, s.grad_losses, s.gin_losses, s.attach, s.delay)
        for s in plan.stages
    ]
    assert rows == [
        (1, "main", 1, (2,), (2,), (), 0, 7),
        (2, "main", 2, (3,), (2, 3), (2,), 1, 5),  # L2 passes through to block 1
        (3, "main", 3, (3,), (3,), (3,), 2, 3),
        (4, "main", 3, (3,), (3,), (3,), 3, 1),
        (5, "head", 1, (1,), (1,), (), 1, 3),  # L1 updates no block: no input gradient
        (6, "head", 1, (1,), (1,), (1,), 5, 1),
        (7, "head", 2, (2,), (2,), (2,), 2, 3),
        (8, "head", 2, (2,), (2,), (2,), 7, 1),
    ]
    # K = 4 blocks of one stage each with two-stage heads: stage 3 would pass L3 back 5
    # updates after its forward (P_3 = 3 + 2), beyond its delay 3 from the true loss — refused
    bad = TrainConfig(strategy="interlocking", blocks=(1, 2, 3), distance=1, head_stages=2)
    with pytest.raises(PlanError, match="stage 3 would pass loss L3's error back 5 updates"):
        build_plan(ir, bad, lanes=[1, 1, 1, 1])
    heads = plan.head_stages
    assert [(s.name, s.in_features, s.out_features, s.activation) for s in heads[:2]] == [
        ("head1.0", 32, 32, "relu"),
        ("head1.1", 32, 10, "identity"),
    ]
    assert heads[0].formats.gin is None and heads[1].formats.gin == heads[1].formats.d
    # local: the first stage of block 2 is detached
    local = build_plan(ir, TrainConfig(strategy="local", blocks=(2,)), lanes=[1, 1, 1, 1])
    assert [s.input_gradient for s in local.stages] == [False, True, False, True, True]


def test_sum_rule_memories_and_multipliers():
    """The sum rule (K = 3 blocks 1 | 2 | 3, 4, d = 1): stage 1 is updated by L1 and L2. L1's
    error arrives 2 ticks before L2's (delays 3, 5), so its δ waits in ``dsum_l1``: one word
    of L·d bits per stash entry and row group; L1 has its own error buffer and mask read port.
    Stage 2 (L2 + L3, delays 3, 5) sends L2's input gradient on (+1 MAC per lane, its own
    ``gacc_l2``) and not L3's: the main stream's ``gacc`` does not exist there, only the one
    MAC. Derived from hdl/stage.py (docs/architecture.md §2.4)."""
    ir = _ir("mlp-digits-deep")
    cfg = TrainConfig(strategy="interlocking", blocks=(1, 2), distance=1, rule="sum")
    plan = build_plan(ir, cfg, lanes=[2, 1, 1, 1])
    s1, s2 = plan.stages[:2]
    assert (s1.losses, s1.streams, s2.losses, s2.streams) == (
        (1, 2), ((1, 3), (2, 5)), (2, 3), ((2, 3), (3, 5))
    )  # fmt: skip
    mem1 = {m.name: m for m in s1.memories}
    assert mem1["dsum_l1"].words == s1.stash_entries * s1.row_groups == 7 * 16
    assert mem1["dsum_l1"].width == 2 * s1.formats.d.bits and mem1["mask"].read_ports == 2
    assert mem1["gbuf_l1"].bits == mem1["gbuf"].bits and "gacc_l1" not in mem1
    mem2 = {m.name: m for m in s2.memories}
    assert mem2["mask"].read_ports == 2 and "dsum_l2" in mem2 and "gbuf_l2" in mem2
    assert s2.gin_losses == (2,) and [n for n in mem2 if n.startswith("gacc")] == ["gacc"]
    # one input gradient: fwd, gin, momentum, lr_delta, lr_x
    assert s2.multipliers == len(s2.products) == 5
    only = build_plan(ir, TrainConfig(strategy="interlocking", blocks=(1, 2), distance=1),
                      lanes=[2, 1, 1, 1])  # fmt: skip
    assert not any(m.name.startswith("dsum") for s in only.stages for m in s.memories)
    assert plan.memory_bits > only.memory_bits


def test_bad_blocks_are_a_plan_error():
    with pytest.raises(PlanError, match="strictly increasing"):
        build_plan(_ir(), TrainConfig(strategy="local", blocks=(2,)))


# ---- plan: validation and memories --------------------------------------------------------


def test_map_memory_picks_fewest_blocks():
    m = map_memory("weights", 4, 520, 24)  # 520 words: 1024×18 needs 2 per bank, as 512×36
    assert (m.config_depth, m.config_width, m.blocks_per_bank, m.blocks) == (1024, 18, 2, 8)
    assert m.kind == "bram" and m.bits == 4 * 520 * 24
    assert map_memory("w", 1, 330, 24).blocks == 1  # 512×36
    assert map_memory("w", 1, 4096, 4).blocks == 1  # 4K×4
    assert map_memory("w", 1, 4097, 4).blocks == 2
    assert map_memory("w", 2, 16384, 3).blocks == 2 * 3  # 16K×1, three wide
    assert map_memory("w", 1, 0, 16).blocks == 0
    # two read ports and a write port: a copy per read port (a block has two ports)
    assert map_memory("x", 1, 320, 16, read_ports=2).blocks == 2
    assert map_memory("rom", 1, 512, 16, read_ports=2, write_ports=0).blocks == 1


def test_memory_kind_follows_the_cost_rule():
    bram18, ice40 = RAM_FAMILIES["bram18"], RAM_FAMILIES["ice40"]
    # 520×24: 2 blocks (cost 256) vs 33·6 LUT-RAM tiles (792 + read mux)
    assert memory_kind(520, 24, 1, 1, bram18) == "bram"
    # 16×64 error buffer: 16 tiles (64) vs two 512×36 blocks (256)
    assert memory_kind(16, 64, 1, 1, bram18) == "lutram"
    # iCE40 has no LUT RAM: a 160-bit memory is one EBR (64), 40 bits are cheaper as FFs
    assert memory_kind(40, 4, 1, 1, ice40) == "bram"
    assert memory_kind(10, 4, 1, 1, ice40) == "logic"
    # a 512×16 ROM: one block (128) vs 512 as logic (bits/16)
    assert memory_kind(512, 16, 1, 0, bram18) == "bram"


@pytest.mark.parametrize(
    ("depth", "width", "reads", "kind"),
    [  # synth_ecp5 of a no_rw_check memory read through a registered address (2026-12-03)
        (33, 24, 1, "lutram"),
        (48, 24, 1, "lutram"),
        (49, 24, 1, "bram"),  # 24 tiles (96) + ½ · 3 · 24 (36) > one block (128)
        (51, 24, 1, "bram"),  # mlp-digits 11×4,10's weight banks: 88 DP16KD built
        (64, 16, 1, "lutram"),
        (80, 16, 1, "lutram"),  # 20 tiles (80) + ½ · 4 · 16 (32) < 128
        (49, 36, 1, "bram"),
        (49, 45, 1, "bram"),
        (33, 24, 2, "lutram"),
        (49, 24, 2, "bram"),
    ],
)
def test_memory_kind_of_the_weight_banks_port_form(depth, width, reads, kind) -> None:
    """The weight banks (``w``, ``u``, ``w_prev``: hdl/weights.py's asynchronous read behind a
    registered address) price LUT RAM's read multiplexer per bit; the synchronous-read rule
    keeps 51 × 24 in LUT RAM, where Yosys puts the weight bank in a DP16KD."""
    bram18 = RAM_FAMILIES["bram18"]
    assert memory_kind(depth, width, reads, 1, bram18, address_register=True) == kind
    assert place_memory("w", 4, depth, width, read_ports=reads, family=bram18).kind == kind
    assert memory_kind(51, 24, 1, 1, bram18) == "lutram"


def test_stage_memory_and_blocks():
    """mlp-digits 64→32→10 with lanes 4, 1 (default formats: x 16, w/u 24, d 16 bits):
    every memory as the HDL builds it.

    Stage 1 (N 64, M 32, L 4, 8 row groups, D 3): w, u 4 banks × 8·65 = 520 words × 24 → 49,920
    bits each (2 blocks of 1024×18 per bank); stash (D+2) = 5 entries × 64 words × 16 (the host
    writes one value per word) = 5,120 bits, two read ports → 2 copies of one block; mask 5·8 ×
    4 bits = 160 and the error buffer's scaled errors (lr·g, formed at the write: 2·8 words ×
    4·18 bits = 1,152; no input gradient, so nothing reads g itself: no gbuf) in LUT RAM.
    Σ 106,272 bits, 18 blocks.
    Stage 2 (N 32, M 10, L 1, 10 groups, D 1): w, u 330 × 24 = 7,920 each (one 512×36 block);
    stash 3 entries × ⌈32/4⌉ words × 4·16 bits = 1,536; mask 30 × 1; error buffer 20 × 16 =
    320, scaled errors 20 × 18 = 360; gacc 32 × (18 + 16 + ⌈log2 10⌉ + 1 = 39: the 18-bit
    weight operand of the input-gradient MAC, numerics §5.2) = 1,248 — all but w, u in LUT
    RAM. Σ 19,334 bits, 2 blocks.
    Loss unit: logits 10 × 16, exp ROM 512 × 16 = 8,192 (one block), exp values 10 × 16; the
    result FIFO 2 × 49. Total 106,272 + 19,334 + 8,512 + 98 = 134,216 bits, 21 blocks.
    """
    plan = build_plan(_ir(), TrainConfig(), lanes=[4, 1])
    s1, s2 = plan.stages
    assert s1.memory_bits == 2 * 4 * 520 * 24 + 5 * 64 * 16 + 40 * 4 + 16 * 72 == 106272
    assert [m.name for m in s1.memories] == ["w", "u", "xstash", "mask", "sbuf"]
    assert s1.memory_blocks == 8 + 8 + 2 == sum(m.blocks for m in s1.memories)
    assert s1.stash_bits == 5 * 64 * 16 + 40 * 4
    assert s2.memory_bits == 2 * 330 * 24 + 24 * 64 + 30 + 20 * 16 + 20 * 18 + 32 * 39 == 19334
    assert [m.name for m in s2.memories] == ["w", "u", "xstash", "mask", "gbuf", "sbuf", "gacc"]
    assert (s2.x_lanes, s2.x_words, s2.stash_entries, s2.x_word_bits) == (4, 8, 3, 64)
    assert plan.memory_bits == 106272 + 19334 + (10 * 16 + 512 * 16 + 10 * 16) + 2 * 49 == 134216
    assert plan.memory_blocks == s1.memory_blocks + s2.memory_blocks + 1 == 21
    # fwd, momentum, lr_x per lane; lr_delta once for the stage
    assert s1.multipliers == 4 * 3 + 1


def test_too_many_lanes_and_idle_lanes():
    ir = _ir()
    with pytest.raises(PlanError, match=r"lanes=11 must be in 1..10 .*10 rows"):
        build_plan(ir, TrainConfig(), lanes=[1, 11])
    with pytest.raises(PlanError, match="lanes has 3 entries"):
        build_plan(ir, TrainConfig(), lanes=[1, 1, 1])
    with pytest.warns(PlanWarning, match=r"leave 6 of 16 lane slots idle \(38% > 25%\); 5 lanes"):
        build_plan(ir, TrainConfig(), lanes=[1, 8])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_plan(ir, TrainConfig(), lanes=[4, 5])  # 0 idle: no warning


def test_memory_budget():
    ir = _ir()
    with pytest.raises(PlanError, match=r"needs 134,216 memory bits .* budget is 100,000 bits"):
        build_plan(ir, TrainConfig(), lanes=[4, 1], memory_budget_bits=100_000)
    assert build_plan(ir, TrainConfig(), lanes=[4, 1], memory_budget_bits=134216).memory_bits == (
        134216
    )


def test_format_validation():
    ir = _ir()
    fs = FormatSpec.default(2)
    small = FormatSpec(fs.x, fs.logits, fs.d, fs.w, fs.u, ranges={2: {"x": 40.0, "w": 1.0}})
    with pytest.raises(PlanError, match=r"stage 2 \(2\): calibrated max\|x\| = 40 does not fit"):
        build_plan(ir, TrainConfig(), small)
    bad_u = FormatSpec(fs.x, fs.logits, fs.d, fs.w, (QFormat(24, 19), QFormat(24, 20)))
    with pytest.raises(PlanError, match=r"velocity format u = Q4.19 .* \(19 ≠ 20\)"):
        build_plan(ir, TrainConfig(), bad_u)
    wide = FormatSpec(fs.x, fs.logits, (QFormat(16, 40), fs.d[1]), fs.w, fs.u)
    with pytest.raises(PlanError, match=r"stage 1 \(0\): the update sum needs \d+ bits \(> 62\)"):
        build_plan(ir, TrainConfig(), wide)


def test_plan_json_round_trip_exact():
    ir = _ir("mlp-digits-deep")
    x, y = load_digits().x_train[:200], load_digits().y_train[:200]
    cfg = TrainConfig(strategy="interlocking", blocks=(2,), distance=1, mitigation="sc+lwp")
    name, model, _ = load_model("mlp-digits-deep")
    fs = auto_formats(model, cfg, x, y, samples=200, ir=ir)
    plan = build_plan(ir, cfg, fs, choose_lanes(ir, cfg))
    again = Plan.from_json(plan.to_json())
    assert again == plan and again.hash == plan.hash
    assert again.stages[0].calibrated == plan.stages[0].calibrated != {}
    assert again.stages[-1].memories == plan.stages[-1].memories


# ---- lanes --------------------------------------------------------------------------------


def test_target_cycles_is_the_tick():
    """``--target-cycles T`` targets the plan's tick (``Plan.tick_cycles``), not a pass's
    slots: the fewest lanes whose tick is ≤ T, the board's operand registers included. ULX3S
    mlp-digits: T = 76 and 100 give 32,10 (tick 76: stage 1's 65 slots + 9, stage 2's 33 + 9
    + the loss unit's 33 + 2 control), where the slot rule gave 32,5 at 110 cycles (stage 2's
    66 slots + the loss unit); T = 145 gives 16,4 at 141 (16,3 would tick 175: stage 2's 132
    slots + 9 + 32 + 2). No board, T = 200: 16,3 at 169 (2 lanes: 165 slots → 202). Below the
    fastest tick, the error names it. T = 76 from 32,5 (74 + 34 cycles of stage 2's forward and
    its loss unit) asks stage 2 for 32 slots, fewer than one lane per row issues (33): the
    search tried one lane per row (its loss unit then at 33 cycles: 76) instead of refusing
    with "the fastest tick is 76" (a bug when the loss unit's exp slice was registered)."""
    from pipetrain.compiler.compile import compile_result
    from pipetrain.compiler.targets import get_board

    ulx3s = get_board("ulx3s-85f")
    for T, lanes, tick in ((76, [32, 10], 76), (100, [32, 10], 76), (145, [16, 4], 141)):
        plan = compile_result("mlp-digits", formats="default", board=ulx3s, target_cycles=T).plan
        assert ([s.lanes for s in plan.stages], plan.tick_cycles) == (lanes, tick), T
    plan = compile_result("mlp-digits", formats="default", target_cycles=200).plan
    assert ([s.lanes for s in plan.stages], plan.tick_cycles) == ([16, 3], 169)
    with pytest.raises(PlanError, match="the fastest tick of this network is 76 cycles"):
        compile_result("mlp-digits", formats="default", board=ulx3s, target_cycles=75)


def test_target_cycles_counts_the_fitted_plans_cycles():
    """A fresh-user trial: ``--target-cycles 3000 --board icebreaker`` returned 1,1 at 4,167
    cycles without a word — the target counted 1,1 with dual-port memories (2,087), the fit then
    moved the one-lane stages to SPRAM (a slot every 2 cycles). It now counts the fitted plan:
    3000 needs 2,1, which does not fit, and the error names the plan that does; 5000 gives
    1,1 at 4,167."""
    from pipetrain.compiler.compile import compile_result
    from pipetrain.compiler.fit import FitError
    from pipetrain.compiler.targets import get_board

    ice = get_board("icebreaker")
    with pytest.raises(FitError) as e:
        compile_result("mlp-digits", formats="default", board=ice, target_cycles=3000)
    msg = str(e.value)
    assert "with the lanes --target-cycles 3000 chose (2,1)" in msg
    assert "--lanes 1,1 fits (4,167 cycles/sample)" in msg
    plan = compile_result("mlp-digits", formats="default", board=ice, target_cycles=5000).plan
    assert ([s.lanes for s in plan.stages], plan.tick_cycles) == ([1, 1], 4167)
    assert [s.slot_cycles for s in plan.stages] == [2, 2]


def test_lane_policies():
    ir, deep = _ir(), _ir("mlp-digits-deep")
    cfg = TrainConfig()
    # default: largest stage (64→32) at 4 lanes = 8·65 = 520 cycles; others fewest lanes ≤ 520
    assert choose_lanes(ir, cfg) == (4, 1)
    assert choose_lanes(deep, cfg) == (4, 3, 3, 1)  # 32 rows in ⌊520/33⌋ = 15 groups → 3
    assert choose_lanes(ir, cfg, lanes=parse_lanes("8,2")) == (8, 2)
    assert choose_lanes(ir, cfg, lanes=parse_lanes("2")) == (2, 2)
    # target 400: stage 1 may take ⌊400/65⌋ = 6 groups → ⌈32/6⌉ = 6 lanes (390 cycles)
    assert choose_lanes(ir, cfg, target_cycles=400) == (6, 1)
    with pytest.raises(PlanError, match="one lane per row issues 65 slots per pass"):
        choose_lanes(ir, cfg, target_cycles=50)
    with pytest.raises(
        PlanError, match="stage 1 .*lanes=99 must be in 1..32 .*; stage 2 .*lanes=99"
    ):
        choose_lanes(ir, cfg, lanes=(99, 99))  # every stage out of range, in one message
    with pytest.raises(PlanError, match="lanes=16 must be in 1..10"):
        choose_lanes(ir, cfg, lanes=(16,))
    with pytest.raises(PlanError, match="give only one of --lanes, --target-cycles"):
        choose_lanes(ir, cfg, lanes=(1,), target_cycles=100)
    with pytest.raises(PlanError, match="not a number"):
        parse_lanes("4,x")
    # heads not listed get the fewest lanes that keep within the slowest main stage
    local = TrainConfig(strategy="local", blocks=(1,))
    assert choose_lanes(ir, local, lanes=(4, 1)) == (4, 1, 1)


@pytest.mark.parametrize("budget", [9, 16, 40, 100, 200])
def test_max_multipliers_is_the_fastest_design_within_budget(budget):
    ir, cfg = _ir(), TrainConfig()
    per = lane_multipliers(ir, cfg)
    # per lane fwd, momentum, lr_x (+ gin); per stage lr_delta (formed at the error buffer's write)
    assert per == ((3, 1), (4, 1))
    lanes = choose_lanes(ir, cfg, max_multipliers=budget)

    def cost(ls):
        return sum(a * L + b for (a, b), L in zip(per, ls, strict=True))

    def tick(ls):
        return max(stage_cycles(ly.in_features, ly.out_features, L)[1]
                   for ly, L in zip(ir.layers, ls, strict=True))  # fmt: skip

    best = min(
        tick(ls) for ls in itertools.product(range(1, 33), range(1, 11)) if cost(ls) <= budget
    )
    assert cost(lanes) <= budget and tick(lanes) == best
    # not over-provisioned: removing a lane from any stage makes it slower than the tick
    for i, L in enumerate(lanes):
        if L > 1:
            fewer = list(lanes)
            fewer[i] -= 1
            ly = ir.layers[i]
            assert stage_cycles(ly.in_features, ly.out_features, L - 1)[1] > best


def test_max_multipliers_too_small():
    with pytest.raises(PlanError, match="one lane per stage already uses 9 multipliers"):
        choose_lanes(_ir(), TrainConfig(), max_multipliers=8)


# ---- formats ------------------------------------------------------------------------------


def test_format_for_range_and_parsing():
    assert format_for_range(1.0, 16) == QFormat(16, 13)  # needs 2.0 → Q2.13 (max 3.9999)
    assert format_for_range(0.99, 16) == QFormat(16, 14)  # 1.98 fits Q1.14 (max 1.99994)
    assert format_for_range(0.6, 24) == QFormat(24, 22)
    assert format_for_range(0.003, 16) == QFormat(16, 22)  # 0.0078 max
    assert format_for_range(0.0, 16) == QFormat(16, 15)
    assert parse_qformat("Q3.12") == QFormat(16, 12)
    assert parse_qformat("Q-2.17") == QFormat(16, 17)
    with pytest.raises(FormatError, match="not Qi.f"):
        parse_qformat("16.12")
    assert parse_format_overrides(["s1.x=Q3.12", "w=Q3.20"]) == {
        "s1.x": QFormat(16, 12),
        "w": QFormat(24, 20),
    }
    for bad, msg in [("x", "KEY=Qi.f"), ("s1.q=Q1.2", "unknown"), ("z=Q1.2", "unknown")]:
        with pytest.raises(FormatError, match=msg):
            parse_format_overrides([bad])


@pytest.fixture(scope="module")
def calibrated():
    name, model, _ = load_model("mlp-digits-deep")
    ds = load_digits()
    cfg = TrainConfig()
    ir = trace(model, name)
    before = [p.clone() for p in model.parameters()]
    fs = auto_formats(model, cfg, ds.x_train, ds.y_train, samples=1000, ir=ir)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    return ir, cfg, fs


def test_auto_formats_hold_every_calibrated_max_with_headroom(calibrated):
    ir, cfg, fs = calibrated
    plan = build_plan(ir, cfg, fs, choose_lanes(ir, cfg))
    assert fs.source == "auto" and not fs.notes
    checked = 0
    for st in plan.stages:
        f = st.formats
        assert (f.x.bits, f.y.bits, f.d.bits, f.w.bits) == (DATA_BITS,) * 3 + (WEIGHT_BITS,)
        assert f.u.frac == f.w.frac and f.u.bits >= WEIGHT_BITS
        for t in ("x", "y", "d", "gin", "w", "u"):
            fmt, seen = getattr(f, t), st.calibrated.get(t)
            if fmt is None or not seen:
                continue
            assert fmt.max_value >= HEADROOM * seen, (st.index, t, str(fmt), seen)
            if t != "u":  # tight: one integer bit less would not hold the shared tensor's max
                shared = max(plan.stages[s - 1].calibrated[t2] for s, t2 in _shared(st.index, t, 4))
                tighter = QFormat(fmt.bits, fmt.frac + 1)
                assert tighter.max_value < HEADROOM * shared, (st.index, t)
            checked += 1
    assert checked == 4 * 6 - 1  # 4 stages × 6 tensors, stage 1 has no gin
    # the observations are real numbers from training, e.g. input pixels are in [0, 1]
    assert plan.stages[0].calibrated["x"] == 1.0
    assert plan.stages[0].formats.x == QFormat(16, 13)


def _shared(stage, tensor, S):
    """The (stage, tensor) cells that share one format with (stage, tensor)."""
    cells = {(stage, tensor)}
    if tensor == "y" and stage < S:
        cells.add((stage + 1, "x"))
    if tensor == "x" and stage > 1:
        cells.add((stage - 1, "y"))
    if tensor == "d" and stage < S:
        cells.add((stage + 1, "gin"))
    if tensor == "gin":
        cells.add((stage - 1, "d"))
    return cells


def test_format_overrides_win(calibrated):
    ir, cfg, fs = calibrated
    over = apply_overrides(
        fs,
        parse_format_overrides(["w=Q3.20", "s1.y=Q6.9", "s2.w=Q2.21", "s3.gin=Q4.11"]),
        ir,
        cfg,
    )
    assert over.w == (QFormat(24, 20), QFormat(24, 21), QFormat(24, 20), QFormat(24, 20))
    assert [u.frac for u in over.u] == [20, 21, 20, 20]  # u follows w's fraction bits
    assert over.x[1] == QFormat(16, 9)  # s1.y is s2.x
    assert over.d[1] == QFormat(16, 11)  # s3.gin is s2.d
    assert over.x[0] == fs.x[0]
    assert over.source == "auto + overrides (w=Q3.20, s1.y=Q6.9, s2.w=Q2.21, s3.gin=Q4.11)"
    with pytest.raises(FormatError, match="conflicts"):
        apply_overrides(fs, parse_format_overrides(["s1.y=Q6.9", "s2.x=Q5.10"]), ir, cfg)
    with pytest.raises(FormatError, match="no stage 9"):
        apply_overrides(fs, parse_format_overrides(["s9.x=Q6.9"]), ir, cfg)
    with pytest.raises(FormatError, match="stage 1 has no input gradient"):
        apply_overrides(fs, parse_format_overrides(["s1.gin=Q6.9"]), ir, cfg)
    # an override too narrow for the calibrated range is refused by build_plan
    narrow = apply_overrides(fs, parse_format_overrides(["s1.y=Q0.15"]), ir, cfg)
    with pytest.raises(PlanError, match=r"calibrated max\|y\| = .* does not fit y = Q0.15"):
        build_plan(ir, cfg, narrow)


def test_auto_formats_keep_update_sum_within_62_bits():
    # batch-1 scaling from B = 128 makes η₁ ≈ 6e-6: its 18-bit constant has ~35 fraction bits
    name, model, _ = load_model("mlp-digits")
    ds = load_digits()
    cfg = TrainConfig(lr=0.1, batch_ref=128)
    ir = trace(model, name)
    fs = auto_formats(model, cfg, ds.x_train, ds.y_train, samples=300, ir=ir)
    plan = build_plan(ir, cfg, fs, choose_lanes(ir, cfg))
    assert max(s.update.sum_bits for s in plan.stages) <= 62
    assert fs.notes and all("so the update sum fits 62 bits" in n for n in fs.notes)
    assert math.isclose(cfg.lr1, 0.1 / 128 * (1 - 0.9 ** (1 / 128)) / 0.1)


def test_auto_formats_for_a_custom_module():
    model = nn.Sequential(nn.Flatten(), build_mlp([64, 16, 10], nn.LeakyReLU))
    ds = load_digits()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ir = trace(model, "custom")
    fs = auto_formats(model, TrainConfig(), ds.x_train, ds.y_train, samples=100, ir=ir)
    assert set(fs.ranges) == {1, 2} and fs.ranges[1]["x"] == 1.0
    with pytest.raises(PlanError, match=r"shape \(5, 3\) but the network takes \(samples, 64\)"):
        auto_formats(model, TrainConfig(), torch.zeros(5, 3), torch.zeros(5), ir=ir)


def test_loss_out_lanes_only_where_one_error_a_cycle_sets_the_tick():
    """``loss_parallelism``: Q > 1 out lanes (two DSP blocks each) only when no ``(P, k)`` with
    one error a cycle fits the slack — C = 10 logits in one word of 10, fr = 16, R = 1:
    (10, 2) serial takes ⌈10/10⌉ + ⌈17/2⌉ + 10 + 5 + 4 + 5 = 34 cycles; at slack 27 the
    cheapest fitting triple is (5, 2, 5): 2 + 9 + 2 + 14 = 27 ((10, 2, 10), 25, costs more);
    with nothing fitting, the fastest serial pair (out lanes only where they take the loss off
    the tick); a feeder that takes one error a write never gets Q > 1. The plan's round trip
    rejects a feeder whose ``error_beat`` disagrees with ``out_lanes``."""
    import dataclasses

    from pipetrain.compiler.ir import LayerIR, NetworkIR
    from pipetrain.compiler.loss_unit import loss_cycles, loss_parallelism

    def lp(slack: int, words: bool = True) -> tuple[int, int, int]:
        return loss_parallelism("cross_entropy", 10, 10, 16, slack, 1, words)

    assert lp(34) == (10, 2, 1)
    assert loss_cycles("cross_entropy", 10, 15, 16, 10, 2, 10, 1) == 34
    assert lp(27) == (5, 2, 5)
    assert loss_cycles("cross_entropy", 10, 15, 16, 5, 2, 10, 1, out_lanes=5) == 27
    assert loss_cycles("cross_entropy", 10, 15, 16, 10, 2, 10, 1, out_lanes=10) == 25
    assert lp(25) == (10, 2, 10)
    assert lp(24) == lp(27, words=False) == lp(10, words=False) == (10, 2, 1)

    # an exp ROM with P read ports in logic is taken only where nothing with it in block RAM
    # fits, out lanes included: at slack 34, (10, 2, 1)'s 10-port ROM in logic loses to
    # (2, 2, 2) (5 + 9 + 5 + 14 = 33) with its 2-port ROM in one block; where no P ≤ 2 fits,
    # the cheapest fitting triple of all, as without the rule
    def lp_rom(slack: int) -> tuple[int, int, int]:
        return loss_parallelism(
            "cross_entropy", 10, 10, 16, slack, 1, True, rom_in_logic=lambda p: p > 2
        )

    assert lp_rom(34) == (2, 2, 2) and lp_rom(33) == (2, 2, 2)
    assert lp_rom(27) == lp(27) == (5, 2, 5) and lp_rom(25) == lp(25) == (10, 2, 10)
    ir = NetworkIR("q", 10, (LayerIR("0", 10, 6, "relu"), LayerIR("2", 6, 10)), "cross_entropy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = build_plan(ir, TrainConfig(), FormatSpec.default(2), [2, 10])
    assert plan.loss.out_lanes == 5 and plan.stages[1].error_beat == 5
    # stage 2's scaled error lr·g at the write: five multipliers, one per error of a write
    shared = [p for p in plan.stages[1].products if p.per_stage]
    assert len(shared) == 1 and plan.stages[1].product_count(shared[0]) == 5
    assert Plan.from_json(plan.to_json()) == plan
    from pipetrain.compiler.build import stage_multipliers

    one = dataclasses.replace(plan.stages[1], error_beat=None)  # disagrees with out_lanes
    one = dataclasses.replace(one, multipliers=stage_multipliers(one))
    mults = plan.stages[0].multipliers + one.multipliers
    bad = dataclasses.replace(plan, stages=(plan.stages[0], one), multipliers=mults)
    with pytest.raises(PlanError, match="error_beat"):
        Plan.from_json(bad.to_json())
