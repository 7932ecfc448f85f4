"""CPU peers of the boards: the same net trained on one CPU the way a user would, with accuracy.

Peers (issue 17 item 8), each trained from the model's own initial weights
(:func:`pipetrain.compiler.models.load_model`, the seed the plan uses) for the same epochs in
the same sample order (:func:`pipetrain.data.epoch_order`; a batch is the next B samples of that
order) on digits, float32, then evaluated on the test set:

* ``torch_b1``, ``torch_b32``, ``torch_b128``: PyTorch, ``torch.optim.SGD`` with momentum,
  ``nn.CrossEntropyLoss`` (mean over the batch), at batch 1, 32, 128. The hyperparameters are the
  project's batch-1 values (``TrainConfig``: η₁, m₁) carried to batch B by the inverse of the
  project's scaling rule (:func:`batch_hyperparams`), so every peer takes the same effective step
  per sample. Rate: the best of 1 thread and the default threads.
* ``compiled_b1``: ``benchmarks/sgd_b1.c`` (batch-1 SGD with momentum, float32), compiled with
  the machine's C compiler (``$CC`` or ``cc``, ``-O3 -march=native``) and called through ctypes.
  No C compiler (or a failing one): the record says ``n/a`` and why.

Every rate is samples trained per wall-clock second of the training loop (evaluation and set-up
not timed), the best of ``reps`` repetitions of the whole run (each from the initial weights);
``samples_per_cpu_s`` divides by this process's CPU time instead. Each record carries
``loadavg`` (:func:`os.getloadavg` before and after it): the machine is shared.

Run alone (``python benchmarks/cpu_peers.py --json -``) it prints the records as JSON;
``--nice N`` first sets this process's niceness (before torch starts its threads, so they all
inherit it) and records whether that was allowed. :mod:`run` runs it that way, in a child
process, so the peers are timed serially and at that priority.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
C_SOURCE = HERE / "sgd_b1.c"
C_FLAGS = ("-O3", "-march=native", "-shared", "-fPIC")
TORCH_BATCHES = (1, 32, 128)
PEERS = tuple(f"torch_b{b}" for b in TORCH_BATCHES) + ("compiled_b1",)

__all__ = [
    "LR_SCALES",
    "PEERS",
    "CCompilerMissing",
    "batch_hyperparams",
    "build_c_loop",
    "c_train",
    "compiled_peer",
    "find_c_compiler",
    "flat_params",
    "load_flat",
    "lr_search",
    "peers",
    "torch_peer",
]


class CCompilerMissing(RuntimeError):
    """No usable C compiler: the message says which was tried and what failed."""


def batch_hyperparams(lr1: float, momentum1: float, batch: int) -> tuple[float, float]:
    """The batch-``batch`` (η_B, m_B) whose batch-1 scaling is (``lr1``, ``momentum1``).

    The inverse of :func:`pipetrain.compiler.schedule.batch1_scaling` (docs/architecture.md
    §2.3): m_B = m₁^B and η_B = η₁·B·(1 − m_B)/(1 − m₁) (m₁ = 0: η_B = η₁·B), so the momentum's
    memory in samples and the effective step η/(1 − m) per sample are those of the batch-1 run.
    Source: derived (solving the rule of §2.3 for the reference values).
    """
    if batch < 1:
        raise ValueError(f"batch must be ≥ 1, got {batch}")
    if momentum1 == 0.0:
        return lr1 * batch, 0.0
    mb = momentum1**batch
    return lr1 * batch * (1.0 - mb) / (1.0 - momentum1), mb


def _loadavg() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def _setup(model: str, seed: int) -> tuple[Any, Any, Any]:
    """``(net, dataset, config)``: the model's initial weights, digits, the project's config."""
    from pipetrain.compiler.config import TrainConfig
    from pipetrain.compiler.models import load_model
    from pipetrain.data import load_digits

    _, net, cfg = load_model(model, seed=seed)
    config = TrainConfig(**(cfg or {})).replace(seed=seed)
    return net, load_digits(), config


def _orders(n: int, seed: int, epochs: int) -> Any:
    """The concatenated sample order of ``epochs`` epochs (int64, (epochs·n,))."""
    import torch
    from pipetrain.data import epoch_order

    return torch.cat([epoch_order(n, seed, e) for e in range(epochs)])


def _accuracy(net: Any, x: Any, y: Any) -> float:
    """Fraction of ``x`` (n, N) whose arg-max logit is the label ``y`` (n,)."""
    import torch

    with torch.no_grad():
        return float((net(x.float()).argmax(1) == y).double().mean())


def _accuracies(net: Any, ds: Any) -> dict[str, float]:
    return {
        "test_accuracy": _accuracy(net, ds.x_test, ds.y_test),
        "train_accuracy": _accuracy(net, ds.x_train, ds.y_train),
    }


def _best(runs: list[tuple[float, float]], samples: int) -> dict[str, Any]:
    """Rates of the fastest of ``runs`` (wall, cpu seconds) training ``samples`` samples."""
    wall = min(r[0] for r in runs)
    cpu = min(r[1] for r in runs)
    walls = sorted(r[0] for r in runs)
    return {
        "samples_per_s": samples / wall,
        "samples_per_cpu_s": samples / cpu if cpu > 0 else None,
        "median_samples_per_s": samples / walls[len(walls) // 2],
        "reps": len(runs),
    }


def torch_peer(
    model: str,
    batch: int,
    epochs: int,
    seed: int = 0,
    threads: int | None = None,
    reps: int = 3,
    lr_scale: float = 1.0,
) -> dict[str, Any]:
    """PyTorch SGD with momentum at ``batch`` on ``threads`` intra-op threads (None: default).

    Trains ``epochs`` epochs of digits (``epochs·1437`` samples; the last batch of an epoch is
    the remainder) ``reps`` times from the initial weights, at ``lr_scale`` × the batch's η_B
    (:func:`batch_hyperparams`). Returns ``samples_per_s`` (best repetition, wall),
    ``samples_per_cpu_s``, ``median_samples_per_s``, ``test_accuracy`` and ``train_accuracy``
    (of the first repetition), ``lr``/``momentum`` (used), ``lr_scale``, ``threads``,
    ``samples``, ``loadavg`` (before, after).
    """
    import copy

    import torch

    saved = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        net0, ds, cfg = _setup(model, seed)
        lr, m = batch_hyperparams(cfg.lr1, cfg.momentum1, batch)
        lr *= lr_scale
        x, y = ds.x_train.float(), ds.y_train.long()
        n = len(x)
        order = _orders(n, seed, epochs)
        batches = [
            order[e * n + i : e * n + min(i + batch, n)]
            for e in range(epochs)
            for i in range(0, n, batch)
        ]
        xs = [x[b] for b in batches]  # gathered before timing: a data loader's job
        ys = [y[b] for b in batches]
        loss_fn = torch.nn.CrossEntropyLoss()
        load0 = _loadavg()
        runs, acc = [], None
        for _ in range(reps):
            net = copy.deepcopy(net0)
            opt = torch.optim.SGD(
                net.parameters(), lr=lr, momentum=m, weight_decay=cfg.weight_decay
            )
            wall, cpu = time.perf_counter(), time.process_time()
            for xb, yb in zip(xs, ys, strict=True):
                opt.zero_grad(set_to_none=True)
                loss_fn(net(xb), yb).backward()
                opt.step()
            runs.append((time.perf_counter() - wall, time.process_time() - cpu))
            if acc is None:
                acc = _accuracies(net, ds)
        return (
            _best(runs, n * epochs)
            | acc
            | {
                "peer": f"torch_b{batch}",
                "batch": batch,
                "lr": lr,
                "lr_scale": lr_scale,
                "momentum": m,
                "epochs": epochs,
                "samples": n * epochs,
                "threads": torch.get_num_threads(),
                "loadavg": [load0, _loadavg()],
            }
        )
    finally:
        torch.set_num_threads(saved)


def find_c_compiler() -> str:
    """The C compiler to use: ``$CC``, else ``cc``, ``gcc`` or ``clang`` on ``PATH``.

    Raises :class:`CCompilerMissing` naming what was looked for.
    """
    env = os.environ.get("CC")
    for name in ([env] if env else []) + ["cc", "gcc", "clang"]:
        path = shutil.which(name)
        if path:
            return path
    raise CCompilerMissing("no C compiler ($CC, cc, gcc or clang) on PATH")


def build_c_loop(cache_dir: Path | None = None, compiler: str | None = None) -> Path:
    """Compile ``benchmarks/sgd_b1.c`` into a shared library (cached by source, compiler, flags).

    ``cc -O3 -march=native -shared -fPIC sgd_b1.c -lm``; the library goes to
    ``<cache>/sgd_b1-<hash>.so`` (``cache_dir`` default ``~/.cache/pipetrain/bench/c``).
    Raises :class:`CCompilerMissing` when there is no compiler or it fails (the message has its
    first error line).
    """
    cc = compiler or find_c_compiler()
    key = hashlib.sha256(
        C_SOURCE.read_bytes() + cc.encode() + " ".join(C_FLAGS).encode()
    ).hexdigest()[:16]
    folder = cache_dir or Path.home() / ".cache" / "pipetrain" / "bench" / "c"
    folder.mkdir(parents=True, exist_ok=True)
    lib = folder / f"sgd_b1-{key}.so"
    if lib.is_file():
        return lib
    tmp = lib.with_suffix(f".{os.getpid()}.tmp")
    try:
        proc = subprocess.run(
            [cc, *C_FLAGS, str(C_SOURCE), "-o", str(tmp), "-lm"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CCompilerMissing(f"{cc} could not run: {exc}") from exc
    if proc.returncode != 0:
        first = next((ln for ln in proc.stderr.splitlines() if ln.strip()), "no message")
        raise CCompilerMissing(f"{cc} {' '.join(C_FLAGS)} failed: {first}")
    tmp.replace(lib)
    return lib


def c_train(
    lib: Path,
    sizes: list[int],
    params: Any,
    x: Any,
    y: Any,
    order: Any,
    lr: float,
    momentum: float,
    weight_decay: float = 0.0,
    vel: Any = None,
) -> tuple[Any, Any, float]:
    """Train ``params`` in place with the C loop, one sample per step in ``order``.

    ``sizes``: [inputs, …, classes]; ``params``: float32 numpy (P,) in the layout of
    ``sgd_b1.c`` (per layer W row-major, then b); ``x`` float32 (n, sizes[0]); ``y`` int32 (n,);
    ``order`` int32 (steps,), indices into x; ``vel``: momentum buffers like ``params`` (zeros
    when None). Returns ``(params, vel, seconds)`` (wall time of the call). Raises
    :class:`ValueError` for inconsistent shapes or an error code of the loop.
    """
    import numpy as np

    expected = sum(o * (i + 1) for i, o in zip(sizes[:-1], sizes[1:], strict=True))
    if params.dtype != np.float32 or params.shape != (expected,):
        raise ValueError(f"params must be float32 of shape ({expected},), got {params.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.ascontiguousarray(y, dtype=np.int32)
    order = np.ascontiguousarray(order, dtype=np.int32)
    if x.ndim != 2 or x.shape[1] != sizes[0] or len(y) != len(x):
        raise ValueError(f"x must be (n, {sizes[0]}) with y (n,), got {x.shape}, {y.shape}")
    if len(order) and (order.min() < 0 or order.max() >= len(x)):
        raise ValueError("order holds an index outside the training set")
    vel = np.zeros_like(params) if vel is None else vel
    so = ctypes.CDLL(str(lib))
    fn = so.pt_train
    fp = ctypes.POINTER(ctypes.c_float)
    ip = ctypes.POINTER(ctypes.c_int)
    fn.argtypes = [ctypes.c_int, ip, fp, fp, fp, ip, ip, ctypes.c_long]
    fn.argtypes += [ctypes.c_float] * 3
    fn.restype = ctypes.c_int
    sz = np.asarray(sizes, dtype=np.int32)
    t0 = time.perf_counter()
    rc = fn(
        len(sizes) - 1,
        sz.ctypes.data_as(ip),
        params.ctypes.data_as(fp),
        vel.ctypes.data_as(fp),
        x.ctypes.data_as(fp),
        y.ctypes.data_as(ip),
        order.ctypes.data_as(ip),
        len(order),
        lr,
        momentum,
        weight_decay,
    )
    dt = time.perf_counter() - t0
    if rc != 0:
        raise ValueError(f"sgd_b1.c pt_train returned {rc} (see its header comment)")
    return params, vel, dt


def flat_params(net: Any) -> tuple[list[int], Any]:
    """``(sizes, params)`` of an ``nn.Sequential`` of Linear/ReLU in ``sgd_b1.c``'s layout."""
    import numpy as np
    import torch

    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    sizes = [linears[0].in_features] + [m.out_features for m in linears]
    parts = []
    for m in linears:
        parts += [m.weight.detach().reshape(-1), m.bias.detach()]
    return sizes, torch.cat(parts).numpy().astype(np.float32).copy()


def load_flat(net: Any, params: Any) -> None:
    """Copy ``params`` (``sgd_b1.c`` layout) into ``net``'s Linear layers."""
    import torch

    p = torch.from_numpy(params)
    k = 0
    with torch.no_grad():
        for m in (m for m in net if isinstance(m, torch.nn.Linear)):
            for t in (m.weight, m.bias):
                t.copy_(p[k : k + t.numel()].reshape(t.shape))
                k += t.numel()


def compiled_peer(
    model: str, epochs: int, seed: int = 0, reps: int = 5, cache_dir: Path | None = None
) -> dict[str, Any]:
    """The C batch-1 loop on ``model``: rate and test accuracy after ``epochs`` epochs.

    Same initial weights, order and hyperparameters (η₁, m₁) as ``torch_b1``. Returns the keys
    of :func:`torch_peer` (``threads`` 1) plus ``compiler`` and ``flags``; without a usable C
    compiler ``{"peer", "status": "n/a", "reason"}`` instead.
    """
    import copy

    import torch

    try:
        lib = build_c_loop(cache_dir)
        cc = find_c_compiler()
    except CCompilerMissing as exc:
        return {"peer": "compiled_b1", "status": "n/a", "reason": str(exc)}
    net0, ds, cfg = _setup(model, seed)
    if not all(isinstance(m, (torch.nn.Linear, torch.nn.ReLU)) for m in net0):
        return {"peer": "compiled_b1", "status": "n/a", "reason": "sgd_b1.c: Linear/ReLU only"}
    sizes, p0 = flat_params(net0)
    x = ds.x_train.float().numpy()
    y = ds.y_train.numpy().astype("int32")
    order = _orders(len(x), seed, epochs).numpy().astype("int32")
    load0 = _loadavg()
    runs, acc = [], None
    for _ in range(reps):
        cpu = time.process_time()
        params, _, wall = c_train(
            lib, sizes, p0.copy(), x, y, order, cfg.lr1, cfg.momentum1, cfg.weight_decay
        )
        runs.append((wall, time.process_time() - cpu))
        if acc is None:
            net = copy.deepcopy(net0)
            load_flat(net, params)
            acc = _accuracies(net, ds)
    return (
        _best(runs, len(order))
        | acc
        | {
            "peer": "compiled_b1",
            "status": "ok",
            "batch": 1,
            "lr": cfg.lr1,
            "momentum": cfg.momentum1,
            "epochs": epochs,
            "samples": len(order),
            "threads": 1,
            "compiler": cc,
            "compiler_version": _cc_version(cc),
            "flags": " ".join(C_FLAGS[:2]),
            "loadavg": [load0, _loadavg()],
        }
    )


def _cc_version(cc: str) -> str:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.splitlines()[0] if out.stdout else "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


#: η_B scales tried for a batch peer besides the rule's η_B (k = 1..3 halvings), picked by
#: training accuracy: at large batches the rule's step can be too large for the same epochs.
LR_SCALES = (1.0, 0.5, 0.25, 0.125)


def lr_search(model: str, batch: int, epochs: int, seed: int = 0) -> dict[str, Any]:
    """Train ``batch`` at each of :data:`LR_SCALES` × η_B (1 thread, one repetition each).

    Returns ``{"runs": [{lr_scale, lr, train_accuracy, test_accuracy}], "best": the run with
    the highest training accuracy}`` — chosen on the training set, the test set only reported.
    Source: derived (a user tunes η at a large batch; the rule of docs/architecture.md §2.3 keeps
    the per-sample step, not its stability).
    """
    runs = []
    for scale in LR_SCALES:
        r = torch_peer(model, batch, epochs, seed, threads=1, reps=1, lr_scale=scale)
        runs.append({k: r[k] for k in ("lr_scale", "lr", "train_accuracy", "test_accuracy")})
    return {"runs": runs, "best": max(runs, key=lambda r: r["train_accuracy"])}


def peers(model: str, epochs: int, seed: int = 0, quick: bool = False) -> dict[str, Any]:
    """Every peer of ``model``: ``{peer: record}``. A torch peer's record is the faster of 1
    thread and the default threads (both under ``by_threads``), at the rule's η_B; a batch > 1
    also has ``lr_search`` (:func:`lr_search`). Repetitions (best one reported): batch 1 3,
    batch 32/128 10, the C loop 30 (``quick``: 1, 3, 10) — more for the short runs, so some land
    in a quiet moment of a shared machine."""
    import torch

    out: dict[str, Any] = {}
    for b in TORCH_BATCHES:
        # repetitions: a whole run at batch 1 takes seconds, at 32 or 128 a fraction of one
        reps = (1 if quick else 3) if b == 1 else (3 if quick else 10)
        runs = [torch_peer(model, b, epochs, seed, threads=1, reps=reps)]
        if torch.get_num_threads() > 1:
            runs.append(torch_peer(model, b, epochs, seed, threads=None, reps=reps))
        best = max(runs, key=lambda r: r["samples_per_s"])
        out[f"torch_b{b}"] = best | {"by_threads": {str(r["threads"]): r for r in runs}}
        if b > 1:
            out[f"torch_b{b}"]["lr_search"] = lr_search(model, b, epochs, seed)
    out["compiled_b1"] = compiled_peer(model, epochs, seed, reps=10 if quick else 30)
    return out


def main(argv: list[str] | None = None) -> None:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp-digits,mlp-digits-deep,mlp-digits-wide")
    ap.add_argument("--epochs", type=int, default=None, help="default: those of `pipetrain train`")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="one repetition per peer")
    ap.add_argument("--nice", type=int, default=None, help="set this niceness first")
    ap.add_argument("--json", default="-", help="write the records here ('-' = stdout)")
    args = ap.parse_args(argv)
    nice: dict[str, Any] = {"requested": args.nice}
    if args.nice is not None:
        try:
            nice["niceness"] = os.nice(args.nice - os.nice(0))
        except OSError as exc:
            nice["niceness"] = os.nice(0)
            nice["error"] = f"{type(exc).__name__}: {exc}"
    if args.epochs is None:
        from pipetrain.host.cli.options import DEFAULT_EPOCHS

        args.epochs = DEFAULT_EPOCHS
    res = {
        "nice": nice,
        "epochs": args.epochs,
        "models": {
            m: peers(m, args.epochs, args.seed, args.quick) for m in args.models.split(",") if m
        },
    }
    text = json.dumps(res, indent=1)
    if args.json == "-":
        print(text)
    else:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
