"""Bad input, fuzzed: a mutated ``plan.json``, a malformed ``.npz``, a model file that raises, a
wrong ``state_dict`` — each a clear one-line :class:`~pipetrain.errors.UserError` naming the
field, array, file or key, never a crash, never a silently different design, nothing written.

The plan mutations (hypothesis, derandomised so every run checks the same examples) delete a
key, add one, change a value's JSON type, change an integer (in and far out of range) or a
string. A mutation the reader accepts must load into exactly the mutated document (nothing
coerced, defaulted or dropped); a structural one (missing, unknown, wrongly typed or
out-of-range field) must be refused with a :class:`PlanError` that names the field's JSON path.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pipetrain.compiler.build import PlanError, build_plan
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.ir import LayerIR, NetworkIR
from pipetrain.compiler.models import ModelError, load_model
from pipetrain.compiler.plan import PLAN_VERSION, Plan
from pipetrain.data import DataError, load_npz
from pipetrain.data.datasets import MAX_LABEL
from pipetrain.errors import UserError
from pipetrain.host import DeviceError, open
from pipetrain.host.cli import cli
from pipetrain.sim.tb.regress import SMOKE_CASES, prepare
from torch import nn

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)

# -- plan.json ------------------------------------------------------------------------------------
TINY = NetworkIR(
    "tiny", 6, (LayerIR("0", 6, 5, "relu"), LayerIR("2", 5, 4, "relu"), LayerIR("4", 4, 3))
)


def _bases() -> dict[str, Plan]:
    """A 4-stage SC+LWP plan with weight decay and wide formats (regression smoke case), and a
    local-learning plan with an auxiliary head (head stages and head loss units)."""
    d4 = next(c for c in SMOKE_CASES if c.name == "d4-sclwp-wd-wide")
    local = TrainConfig(strategy="local", blocks=(1,), lr=0.05, seed=3)
    return {"d4": prepare(d4)[0], "local": build_plan(TINY, local, lanes=[2, 1, 3])}


BASES = _bases()
DOCS = {k: json.loads(p.to_json()) for k, p in BASES.items()}

Path_ = tuple[Any, ...]


def _nodes(doc: Any, path: Path_ = ()) -> list[tuple[Path_, Any]]:
    out = [(path, doc)]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _nodes(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _nodes(v, (*path, i))
    return out


NODES = {k: _nodes(d) for k, d in DOCS.items()}


def _path_str(path: Path_) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


def _get(doc: Any, path: Path_) -> Any:
    for p in path:
        doc = doc[p]
    return doc


def _free(path: Path_) -> bool:
    """Inside ``calibrated`` (observed ranges: any tensor names) a key is data, not a field."""
    return "calibrated" in path


def _outcome(doc: Any) -> Plan | PlanError:
    try:
        return Plan.from_json(json.dumps(doc))
    except PlanError as exc:
        return exc


def _check(doc: Any, named: str | None) -> None:
    """Refused with a one-line PlanError (naming ``named`` when given), or loaded exactly."""
    got = _outcome(doc)
    if isinstance(got, PlanError):
        msg = str(got)
        assert "\n" not in msg and msg.startswith("plan")
        if named is not None:
            assert named in msg, (named, msg)
        return
    assert named is None, f"accepted a plan with a bad {named}"
    assert json.loads(got.to_json()) == doc  # nothing coerced, defaulted or dropped


def test_every_plan_round_trips_exactly():
    for name, plan in BASES.items():
        back = Plan.from_json(plan.to_json())
        assert back == plan and back.hash == plan.hash, name
        assert Plan.from_dict(plan.to_dict()) == plan


def test_logic_low_bits_round_trips_and_plans_from_before_load():
    """``Plan.logic_low_bits`` (8 in new plans without a board; 0, the iCE40's, is recorded as
    None) round-trips exactly; a plan from before the field (no key) loads with None, whose
    products are the ones without low pieces in logic — so where a product has one (the local
    base: 24-bit u, m·u 18 × 18), dropping the key is refused by name, and where none has (d4:
    28-bit u and w, 10 bits more than the multiplier's 18) the plan loads unchanged but for
    the field."""
    local, d4 = BASES["local"], BASES["d4"]
    assert local.logic_low_bits == d4.logic_low_bits == 8
    mom = [p for st in local.stages for p in st.products if p.name == "momentum"]
    assert mom and all((p.b_bits, p.blocks) == (18, 1) for p in mom)
    for plan in (
        build_plan(
            TINY, TrainConfig(strategy="local", blocks=(1,)), lanes=[2, 1, 3], logic_low_bits=0
        ),
        build_plan(TINY, TrainConfig(), lanes=[2, 1, 3], logic_low_bits=None),
    ):
        back = Plan.from_json(plan.to_json())
        assert back == plan and back.hash == plan.hash
        assert plan.logic_low_bits is None and "logic_low_bits" not in plan.to_dict()
        mom = [p for st in plan.stages for p in st.products if p.name == "momentum"]
        assert all((p.b_bits, p.blocks) == (24, 2) for p in mom)
    doc = copy.deepcopy(DOCS["local"])
    del doc["logic_low_bits"]
    with pytest.raises(PlanError, match=r"stages\[0\]\.products .*logic_low_bits"):
        Plan.from_json(json.dumps(doc))
    doc = copy.deepcopy(DOCS["d4"])
    del doc["logic_low_bits"]
    old = Plan.from_json(json.dumps(doc))
    assert old.logic_low_bits is None and old.stages == d4.stages and old.hash != d4.hash
    assert json.loads(old.to_json()) == doc


@pytest.mark.parametrize(
    "edit, named",
    [
        (lambda d: d.pop("tick_cycles"), "tick_cycles"),
        (lambda d: d["stages"][1]["formats"]["w"].pop("frac"), "stages[1].formats.w.frac"),
        (lambda d: d["stages"][0].update(lanez=2), "stages[0].lanez"),
        (lambda d: d.update(shift_add_max_terms=True), "shift_add_max_terms"),
        (lambda d: d.update(logic_low_bits=-1), "logic_low_bits"),
        (lambda d: d.update(logic_low_bits=6.0), "logic_low_bits"),
        (lambda d: d["stages"][2].update(lanes="2"), "stages[2].lanes"),
        (lambda d: d["stages"][0]["formats"]["x"].update(bits=2.0), "stages[0].formats.x.bits"),
        (lambda d: d["stages"][3]["formats"]["d"].update(bits=99), "stages[3].formats.d.bits"),
        (lambda d: d["stages"][0]["lfsr_seeds"].__setitem__(0, 0), "stages[0].lfsr_seeds[0]"),
        (lambda d: d.update(rounding="nearest"), "rounding"),
        (lambda d: d["loss"].update(kind="hinge"), "loss.kind"),
        (lambda d: d["stages"][1]["memories"][0].update(kind="rom"), "stages[1].memories[0].kind"),
        (lambda d: d.update(clock_hz=None), "clock_hz"),
        (lambda d: d["train"].update(lr=-1.0), "train"),
        (lambda d: d["train"].update(momentum="0.9"), "train.momentum"),
        (lambda d: d["train"].pop("seed"), "train.seed"),
        (lambda d: d["train"].update(epochs=3), "train.epochs"),  # host-only: never in a plan
        # inconsistent lanes and shapes
        (lambda d: d["stages"][1].update(lanes=1), "stages[1].row_groups"),
        (lambda d: d["stages"][1].update(lanes=9), "stages[1].lanes"),
        (lambda d: d["stages"][2].update(in_features=4), "stages[2].cycles_per_tick"),
        (lambda d: d.update(in_features=8), "stages[0].in_features"),
        (lambda d: d["loss"].update(classes=4), "loss.classes"),
        (lambda d: d["stages"][0].update(x_lanes=2), "stages[0].x_words"),
        (lambda d: d["stages"][2].update(delay=0), "stages[2].stash_depth"),
        (lambda d: d.update(schedule="sequential"), "schedule"),  # train says pb
        (lambda d: d.update(memory_bits=d["memory_bits"] + 1), "memory_bits"),
        (lambda d: d["stages"][1].update(pass_cycles=1), "stages[1].pass_cycles"),
        # the arithmetic: constants and widths the compiler derives
        (lambda d: d["stages"][2]["update"]["lr"].update(value=7), "stages[2].update.lr.value"),
        (lambda d: d["stages"][0]["update"].update(sc=False), "stages[0].update.sc"),
        (lambda d: d["stages"][1].update(acc_fwd_bits=20), "stages[1].acc_fwd_bits"),
        (lambda d: d["stages"][1].update(what_bits=20), "stages[1].what_bits"),
        (lambda d: d["stages"][3]["lfsr_seeds"].__setitem__(0, 12345), "stages[3].lfsr_seeds"),
        (lambda d: d["loss"]["exp_lut"].__setitem__(3, 1), "loss.exp_lut"),
        (lambda d: d["stages"][0]["negative_slope"].update(value=3), "negative_slope.value"),
    ],
)
def test_a_bad_field_is_named(edit, named):
    doc = copy.deepcopy(DOCS["d4"])
    edit(doc)
    with pytest.raises(PlanError) as info:
        Plan.from_json(json.dumps(doc))
    assert named in str(info.value) and "\n" not in str(info.value)
    assert "recompile" in str(info.value)  # the fix


def test_a_bad_document_is_a_plan_error():
    text = BASES["d4"].to_json()
    with pytest.raises(PlanError, match=r"not valid JSON: .* line \d+ column \d+"):
        Plan.from_json(text[: len(text) // 2])
    with pytest.raises(PlanError, match="key 'name' twice"):
        Plan.from_json(text.replace('"name": ', '"name": "x", "name": ', 1))
    with pytest.raises(PlanError, match="NaN"):
        Plan.from_json(text.replace('"clock_hz": ', '"clock_hz": NaN, "x": ', 1))
    with pytest.raises(PlanError, match="a JSON object, not list"):
        Plan.from_json("[]")
    old = json.loads(text) | {"version": PLAN_VERSION - 1}
    with pytest.raises(PlanError, match=f"version {PLAN_VERSION - 1} is not supported"):
        Plan.from_dict(old)
    with pytest.raises(PlanError, match="nested too deeply"):
        Plan.from_json("[" * 100_000 + "]" * 100_000)


@st.composite
def _mutation(draw: st.DrawFn) -> tuple[Any, str | None]:
    base = draw(st.sampled_from(sorted(DOCS)))
    doc = copy.deepcopy(DOCS[base])
    nodes = NODES[base]
    kind = draw(st.sampled_from(["delete", "extra", "retype", "int", "str", "drop_item"]))
    if kind == "delete":
        path, _ = draw(st.sampled_from([n for n in nodes if n[0] and isinstance(n[0][-1], str)]))
        del _get(doc, path[:-1])[path[-1]]
        return doc, None if _free(path) else _path_str(path)
    if kind == "extra":
        path, _ = draw(st.sampled_from([n for n in nodes if isinstance(n[1], dict)]))
        key = draw(st.text(min_size=1, max_size=6).filter(lambda k: k not in _get(doc, path)))
        _get(doc, path)[key] = draw(st.sampled_from([0, 1.5, "x", None, [], {}]))
        return doc, None if _free(path) else _path_str((*path, key))
    if kind == "drop_item":
        lists = [n for n in nodes if isinstance(n[1], list) and n[1]]
        path, value = draw(st.sampled_from(lists))
        del _get(doc, path)[draw(st.integers(0, len(value) - 1))]
        return doc, None
    leaves = [n for n in nodes if n[0] and not isinstance(n[1], (dict, list))]
    if kind == "int":
        path, old = draw(st.sampled_from([n for n in leaves if type(n[1]) is int]))
        new = draw(
            st.one_of(
                st.integers(-3, 3).map(lambda k: old + k),
                st.integers(-(2**70), 2**70),
            )
        )
        _get(doc, path[:-1])[path[-1]] = new
        return doc, _path_str(path) if abs(new) > 2**62 else None
    if kind == "str":
        path, old = draw(st.sampled_from([n for n in leaves if isinstance(n[1], str)]))
        _get(doc, path[:-1])[path[-1]] = draw(st.text(max_size=8))
        return doc, None
    path, old = draw(st.sampled_from([n for n in nodes if n[0]]))
    new = draw(st.sampled_from([None, True, "x", 1.5, 7, [], [1], {}, {"a": 1}]))
    same_kind = type(new) is type(old) or (type(old) is float and type(new) is int)
    _get(doc, path[:-1])[path[-1]] = new
    return doc, None if same_kind or old is None else _path_str(path)


@FUZZ
@given(_mutation())
def test_a_mutated_plan_is_refused_by_name_or_loaded_exactly(mutation):
    doc, named = mutation
    _check(doc, named)


# -- .npz data ------------------------------------------------------------------------------------
def _good_arrays(n: int, features: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(n * 31 + features)
    return {
        "x_train": rng.random((n, features), dtype=np.float32),
        "y_train": rng.integers(0, 3, n),
        "x_test": rng.random((max(1, n // 2), features)),
        "y_test": rng.integers(0, 3, max(1, n // 2)).astype(np.int32),
    }


#: defect → (the array it breaks, a function making the bad array from the good one)
DEFECTS: dict[str, tuple[str, Any]] = {
    "nan": ("x", lambda x, y: (np.where(np.arange(x.size).reshape(x.shape) == 1, np.nan, x), y)),
    "inf": ("x", lambda x, y: (np.full_like(x, -np.inf), y)),
    "float32 overflow": ("x", lambda x, y: (np.full(x.shape, 1e300), y)),
    "empty": ("x", lambda x, y: (x[:0], y[:0])),
    "no features": ("x", lambda x, y: (x[:, :0], y)),
    "1-D x": ("x", lambda x, y: (x[:, 0], y)),
    "3-D x": ("x", lambda x, y: (x[:, :, None], y)),
    "complex x": ("x", lambda x, y: (x.astype(np.complex64), y)),
    "string x": ("x", lambda x, y: (x.astype(str), y)),
    "bool x": ("x", lambda x, y: (x > 0.5, y)),
    "object x": ("x", lambda x, y: (np.array([list(r) for r in x], dtype=object), y)),
    "negative label": ("y", lambda x, y: (x, np.where(np.arange(len(y)) == 0, -1, y))),
    "float labels": ("y", lambda x, y: (x, y.astype(np.float64) + 0.5)),
    "bool labels": ("y", lambda x, y: (x, y > 0)),
    "huge label": ("y", lambda x, y: (x, np.where(np.arange(len(y)) == 0, MAX_LABEL + 1, y))),
    "uint64 label": ("y", lambda x, y: (x, np.full(len(y), 2**63, dtype=np.uint64))),
    "2-D labels": ("y", lambda x, y: (x, y[:, None])),
    "fewer labels": ("y", lambda x, y: (x, y[:-1])),
}


def _write_npz(folder: str, arrays: dict[str, np.ndarray]) -> str:
    path = os.path.join(folder, "data.npz")
    np.savez(path, **arrays)
    return path


@FUZZ
@given(
    defect=st.sampled_from(sorted(DEFECTS)),
    split=st.sampled_from(["train", "test"]),
    n=st.integers(2, 9),
    features=st.integers(1, 5),
)
def test_a_bad_npz_array_is_named(defect, split, n, features):
    which, make = DEFECTS[defect]
    arrays = _good_arrays(n, features)
    x, y = make(arrays[f"x_{split}"], arrays[f"y_{split}"])
    arrays[f"x_{split}"], arrays[f"y_{split}"] = x, y
    with tempfile.TemporaryDirectory() as folder:
        with pytest.raises(DataError) as info:
            load_npz(_write_npz(folder, arrays))
    msg = str(info.value)
    assert f"{which}_{split}" in msg and "\n" not in msg, msg


@FUZZ
@given(n=st.integers(1, 9), features=st.integers(1, 5))
def test_a_good_npz_loads_as_written(n, features):
    arrays = _good_arrays(n, features)
    with tempfile.TemporaryDirectory() as folder:
        ds = load_npz(_write_npz(folder, arrays))
    for k in ("x_train", "x_test"):
        assert ds.__getattribute__(k).dtype == torch.float32
        assert torch.equal(getattr(ds, k), torch.from_numpy(arrays[k].astype(np.float32)))
    for k in ("y_train", "y_test"):
        assert torch.equal(getattr(ds, k), torch.from_numpy(arrays[k].astype(np.int64)))


def test_a_file_that_is_not_an_npz_archive(tmp_path):
    arrays = _good_arrays(4, 2)
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04 not a zip at all")
    with pytest.raises(DataError, match="not a readable .npz file"):
        load_npz(tmp_path / "junk.npz")
    np.save(tmp_path / "one.npy", arrays["x_train"])
    os.replace(tmp_path / "one.npy", tmp_path / "one.npz")
    with pytest.raises(DataError, match="single array"):
        load_npz(tmp_path / "one.npz")
    del arrays["y_test"]
    with pytest.raises(DataError, match="lacks array\\(s\\) y_test"):
        load_npz(_write_npz(str(tmp_path), arrays))
    arrays = _good_arrays(4, 2) | {"x_test": _good_arrays(4, 3)["x_test"]}
    with pytest.raises(DataError, match="x_train has 2 features but x_test has 3"):
        load_npz(_write_npz(str(tmp_path), arrays))


# -- model files ----------------------------------------------------------------------------------
BAD_MODELS = {
    "raises.py": ("import torch\nraise RuntimeError('no GPU here')\n", "RuntimeError: no GPU"),
    "missing_import.py": ("import no_such_package_xyz\n", "ModuleNotFoundError"),
    "syntax.py": ("def model(:\n    pass\n", "SyntaxError"),
    "exits.py": ("import sys\nsys.exit(3)\n", "SystemExit: 3"),
    "factory_raises.py": ("def model():\n    return 1 / 0\n", "ZeroDivisionError"),
    "not_a_module.py": ("model = 42\n", "is a int, not a torch.nn.Module"),
    "no_model.py": ("net = None\n", "does not define `model`"),
}


@pytest.mark.parametrize("name", sorted(BAD_MODELS))
def test_a_model_file_that_fails_is_named(tmp_path, name):
    text, why = BAD_MODELS[name]
    (tmp_path / name).write_text(text)
    with pytest.raises(ModelError) as info:
        load_model(str(tmp_path / name))
    msg = str(info.value)
    assert name in msg and why in msg and "\n" not in msg, msg


def _cli(args: list[str], cwd: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.chdir(cwd)
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def _assert_cli_error(res: Any, *words: str) -> None:
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.stderr
    assert "Traceback" not in res.output
    for w in words:
        assert w in lines[0], lines[0]


def test_cli_compile_writes_nothing_for_a_failing_model_file(tmp_path, monkeypatch):
    (tmp_path / "net.py").write_text(
        textwrap.dedent(
            """
            from torch import nn
            model = nn.Sequential(nn.Linear(4, 3))
            raise ValueError("the data path is wrong")
            """
        )
    )
    res = _cli(["compile", "net.py", "--out", "out"], tmp_path, monkeypatch)
    _assert_cli_error(res, "net.py", "ValueError: the data path is wrong")
    assert sorted(os.listdir(tmp_path)) == ["net.py"]


@pytest.mark.parametrize("defect", ["nan", "float labels", "empty", "object x"])
def test_cli_compile_writes_nothing_for_bad_data(tmp_path, monkeypatch, defect):
    which, make = DEFECTS[defect]
    arrays = _good_arrays(6, 3)
    arrays["x_train"], arrays["y_train"] = make(arrays["x_train"], arrays["y_train"])
    _write_npz(str(tmp_path), arrays)
    res = _cli(["compile", "mlp", "--data", "data.npz", "--out", "out"], tmp_path, monkeypatch)
    _assert_cli_error(res, f"{which}_train")
    assert sorted(os.listdir(tmp_path)) == ["data.npz"]


# -- state_dict -----------------------------------------------------------------------------------
DEV_PLAN = build_plan(
    NetworkIR("tiny", 6, (LayerIR("0", 6, 5, "relu"), LayerIR("2", 5, 3))),
    TrainConfig(lr=0.05, seed=3),
    lanes=[2, 1],
)


def _module() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


BAD_STATES = {
    "missing key": (lambda s: s.pop("2.bias"), "lacks '2.bias'"),
    "unexpected key": (lambda s: s.update({"4.weight": torch.zeros(3, 3)}), "'4.weight'"),
    "renamed key": (lambda s: s.update({"0.w": s.pop("0.weight")}), "'0.weight'"),
    "wrong shape": (lambda s: s.update({"0.weight": torch.zeros(6, 5)}), "'0.weight'"),
    "bias shape": (lambda s: s.update({"2.bias": torch.zeros(3, 1)}), "'2.bias'"),
    "a list": (lambda s: s.update({"2.bias": [0.0, 0.0, 0.0]}), "'2.bias'] is a list"),
    "complex": (lambda s: s.update({"2.bias": torch.zeros(3, dtype=torch.cfloat)}), "'2.bias'"),
    "bool": (lambda s: s.update({"0.bias": torch.ones(5, dtype=torch.bool)}), "'0.bias'"),
    "nan": (lambda s: s["0.weight"].__setitem__((1, 2), float("nan")), "'0.weight'] holds NaN"),
    "inf": (lambda s: s["2.bias"].__setitem__(0, float("inf")), "'2.bias'] holds NaN or inf"),
}


@pytest.mark.parametrize("target", ["golden", "reference"])
@pytest.mark.parametrize("case", sorted(BAD_STATES))
def test_a_bad_state_dict_is_named_and_nothing_is_written(target, case):
    edit, named = BAD_STATES[case]
    with open(DEV_PLAN, target, model=_module()) as dev:
        before = dev.state_dict()
        state = {k: v.clone() for k, v in _module().state_dict().items()}
        state = {k: v * 0.5 for k, v in state.items()}  # other weights than the device's
        edit(state)
        with pytest.raises(DeviceError) as info:
            dev.load_state_dict(state)
        assert named in str(info.value) and "\n" not in str(info.value), str(info.value)
        after = dev.state_dict()
        assert before.keys() == after.keys()
        assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_numpy_state_dict_loads_like_tensors():
    state = {k: v * 0.5 for k, v in _module().state_dict().items()}
    with (
        open(DEV_PLAN, "golden", model=_module()) as a,
        open(DEV_PLAN, "golden", model=_module()) as b,
    ):
        a.load_state_dict(state)
        b.load_state_dict({k: v.numpy() for k, v in state.items()})
        sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["0.weight"], _module().state_dict()["0.weight"])
    assert issubclass(DeviceError, UserError)
