"""RTL flow on a small stream component: the harness's build cache, both simulators, stream
helpers, backpressure.

Builds :class:`~pipetrain.sim.tb.stream_fifo.StreamFIFO` in Verilator and in Icarus (a few
seconds the first time, cached afterwards) and checks that every beat arrives exactly once, in
order, under random valid/ready toggling, and that results come back from cocotb to pytest.
The Icarus cases are skipped when ``iverilog`` is not on PATH (marker ``icarus``).
"""

from __future__ import annotations

import random

import pytest
from amaranth import signed, unsigned
from amaranth.back import verilog
from amaranth.lib import data
from hypothesis import given
from hypothesis import strategies as st
from pipetrain.sim.harness import RTLSimError, build_key, build_rtl, run_cocotb
from pipetrain.sim.tb.layout import (
    BitField,
    fields_from_json,
    fields_to_json,
    flatten_layout,
    pack,
    unpack,
)
from pipetrain.sim.tb.stream_fifo import StreamFIFO

LAYOUT = data.StructLayout(
    {"a": signed(12), "hdr": data.StructLayout({"kind": unsigned(2), "neg": signed(3)}), "last": 1}
)
FIFO_DEPTH = 4


def test_flatten_layout_offsets_and_signs():
    fields = flatten_layout(LAYOUT)
    assert fields == (
        BitField("a", 0, 12, True),
        BitField("hdr.kind", 12, 2, False),
        BitField("hdr.neg", 14, 3, True),
        BitField("last", 17, 1, False),
    )
    assert fields_from_json(fields_to_json(fields)) == fields
    assert flatten_layout(signed(7)) == (BitField("", 0, 7, True),)


@given(
    a=st.integers(-2048, 2047),
    kind=st.integers(0, 3),
    neg=st.integers(-4, 3),
    last=st.integers(0, 1),
)
def test_pack_matches_amaranth_const(a, kind, neg, last):
    fields = flatten_layout(LAYOUT)
    values = {"a": a, "hdr.kind": kind, "hdr.neg": neg, "last": last}
    raw = pack(fields, values)
    # lib.data's own constant packing is the reference for the bit placement
    ref = LAYOUT.const({"a": a, "hdr": {"kind": kind, "neg": neg}, "last": last}).as_bits()
    assert raw == ref
    assert unpack(fields, raw) == values


def test_pack_rejects_out_of_range_and_unknown():
    fields = flatten_layout(LAYOUT)
    with pytest.raises(ValueError, match=r"'a'=2048 outside \[-2048, 2047\]"):
        pack(fields, {"a": 2048})
    with pytest.raises(ValueError, match="unknown payload fields"):
        pack(fields, {"b": 1})


@pytest.fixture(
    scope="module", params=["verilator", pytest.param("icarus", marks=pytest.mark.icarus)]
)
def fifo_build(request):
    v = verilog.convert(StreamFIFO(LAYOUT, FIFO_DEPTH), name="stream_fifo")
    return build_rtl(v, "stream_fifo", simulator=request.param)


def _beats(n: int, seed: int) -> list[dict[str, int]]:
    rng = random.Random(seed)
    return [
        {
            "a": rng.randrange(-2048, 2048),
            "hdr.kind": rng.randrange(4),
            "hdr.neg": rng.randrange(-4, 4),
            "last": int(i % 5 == 4),
        }
        for i in range(n)
    ]


def _run(build, beats, valid_prob, ready_prob, seed):
    job = {
        "fields": fields_to_json(flatten_layout(LAYOUT)),
        "beats": beats,
        "valid_prob": valid_prob,
        "ready_prob": ready_prob,
        "seed": seed,
    }
    return run_cocotb(build, "pipetrain.sim.cocotb_stream_fifo", job)


def test_stream_fifo_full_throughput(fifo_build):
    beats = _beats(200, 0)
    r = _run(fifo_build, beats, 1.0, 1.0, 0)
    assert r["received"] == beats
    # SyncFIFOBuffered: 2 cycles latency, then one beat per cycle with both sides always ready
    assert r["cycles"] == len(beats) + 2
    assert r["stalls"] == 0 and r["refused"] == 0


@pytest.mark.parametrize(
    ("valid_prob", "ready_prob", "seed"), [(0.5, 0.5, 1), (0.9, 0.2, 2), (0.3, 0.95, 3)]
)
def test_stream_fifo_random_backpressure(fifo_build, valid_prob, ready_prob, seed):
    beats = _beats(300, seed)
    r = _run(fifo_build, beats, valid_prob, ready_prob, seed)
    assert r["received"] == beats  # every beat exactly once, in order
    # the sink takes ≤ 1 beat per ready cycle: ~len/ready_prob cycles at least (minus noise)
    assert r["cycles"] >= 0.8 * len(beats) / min(ready_prob, valid_prob)
    assert r["refused"] > 0  # the monitor really held ready low while data was offered
    if ready_prob < valid_prob:
        assert r["stalls"] > 0  # the FIFO filled up and pushed back on the driver


def test_stream_fifo_cache_hit_and_key(fifo_build):
    sim = fifo_build.simulator
    v = verilog.convert(StreamFIFO(LAYOUT, FIFO_DEPTH), name="stream_fifo")
    again = build_rtl(v, "stream_fifo", simulator=sim)
    assert again.cached and again.build_s == 0.0 and again.directory == fifo_build.directory
    assert again.simulator == sim
    key = build_key(v, "stream_fifo", simulator=sim)
    assert key == fifo_build.key and fifo_build.directory.name == key
    assert key != build_key(v + "\n", "stream_fifo", simulator=sim)
    assert key != build_key(v, "stream_fifo", "fst", simulator=sim)
    other = "icarus" if sim == "verilator" else "verilator"
    assert key != build_key(v, "stream_fifo", simulator=other)  # one cache, both simulators


def test_unknown_simulator_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown simulator 'xsim': use one of verilator, icarus"):
        build_rtl("module m; endmodule", "m", simulator="xsim")


def test_testbench_error_reaches_pytest(fifo_build):
    job = {
        "fields": fields_to_json(flatten_layout(LAYOUT)),
        "beats": [{"zz": 1}],
        "valid_prob": 1.0,
        "ready_prob": 1.0,
        "seed": 0,
    }
    with pytest.raises(RTLSimError, match="unknown payload fields"):
        run_cocotb(fifo_build, "pipetrain.sim.cocotb_stream_fifo", job)


def test_missing_compiler_is_a_clear_error(monkeypatch):
    import shutil

    from pipetrain.sim import verilator as V

    real = shutil.which
    monkeypatch.setattr(V.shutil, "which", lambda t: None if t in ("g++", "perl") else real(t))
    with pytest.raises(V.ToolchainError, match=r"needs g\+\+, perl on PATH"):
        V.toolchain_env()


def test_missing_icarus_is_a_clear_error(monkeypatch):
    from pipetrain.sim import icarus
    from pipetrain.sim.harness import ToolchainError

    monkeypatch.setattr(icarus.shutil, "which", lambda t: None)
    fix = r"needs iverilog and vvp on PATH: .*apt-get install iverilog.* or use the verilator"
    with pytest.raises(ToolchainError, match=fix):
        build_rtl("module m; endmodule", "m", simulator="icarus")


def test_wheel_driver_is_found_and_put_first_on_path():
    import os

    from pipetrain.sim import verilator as V

    env = V.toolchain_env()
    bin_dir = V.verilator_bin_dir()
    assert (bin_dir / "verilator").is_file()
    assert env["PATH"].split(os.pathsep)[0] == str(bin_dir)
    # the wheel's makefile needs these (docs/architecture.md §6)
    assert "CFG_CXXFLAGS_PCH_I=-include" in env["MAKEFLAGS"].split()
    assert "PYTHON3=python3" in env["MAKEFLAGS"].split()
