"""``pipetrain.host.open``: one API for every training target.

>>> dev = pipetrain.host.open("mlp-digits", target="sim")      # doctest: +SKIP
>>> with dev:                                                  # doctest: +SKIP
...     dev.train(x_train, y_train, epochs=2)
...     acc = dev.evaluate(x_test, y_test)
...     model.load_state_dict(dev.state_dict())

Targets:

* ``golden`` — the fixed-point golden model in this process (bit-exact spec of the RTL);
* ``reference`` — the float PB reference trainer in this process;
* ``sim`` — the RTL (``LinkEngine`` ↔ ``NetworkTop``) in Verilator, reached over the host link
  on a loopback TCP port (:class:`~pipetrain.sim.bridge.SimBridge`, started and stopped here);
  ``sim_options={"uart_divisor": N}`` simulates the board top instead, every byte an 8N1 frame
  on its UART pins (N clock cycles per bit, :mod:`pipetrain.sim.cocotb_uart`);
* ``serial://PORT[?baud=N]``, ``tcp://HOST:PORT`` — a device (board or bridge) over the link.

Link targets (``sim``, ``serial``, ``tcp``) start from the same weights as the golden model:
the model's parameters are quantised exactly as the golden model does (numerics §2) and
written with ``WRITE_WEIGHTS`` together with zero velocities, and the counters are reset.
Samples stream in :func:`~pipetrain.data.epoch_order` (seed ``config.seed``), the
pipeline is flushed only at the end of :meth:`Device.train`, before inference and before
weight access — exactly where the golden model flushes — so a fresh ``sim`` device and the
golden model agree bit for bit (``shadow=True`` checks it: :meth:`Device.verify`).

Source: docs/architecture.md §1 (host API), docs/protocol.md §4 (link client).
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from ..compiler.compile import CompileResult
from ..compiler.config import TrainConfig
from ..compiler.plan import Plan
from ..data import epoch_order
from ..errors import UserError
from ..hdl.support import require_hdl
from ..protocol.onchip import run_chunks
from ..protocol.wire import MAX_RUN_EPOCHS, EpochSummary, Result, loss_value
from ..sim.fixed import quantise
from ..sim.golden import GoldenModel, onchip_order
from ..sim.golden_conv import conv_slot
from ..sim.trainer import Trainer, accuracy, progress_bar
from .checkpoint import Checkpoint, CheckpointError, data_digest, lfsr_states
from .client import LinkClient, LinkError, OnChipError, quantise_inputs
from .flow import compile_design
from .transport import TcpTransport, Transport, open_transport

__all__ = [
    "open",
    "Device",
    "TrainReport",
    "Verification",
    "DeviceError",
    "LINK_SCHEMES",
    "LOCAL_TARGETS",
    "local_trainer",
    "PROGRESS_MIN_SAMPLES",
]

#: Targets that run in this process.
LOCAL_TARGETS = ("golden", "reference")
#: URL schemes of link targets (besides ``sim``).
LINK_SCHEMES = ("serial://", "tcp://")
#: ``progress=None`` shows a progress bar for runs of at least this many samples (on a TTY).
PROGRESS_MIN_SAMPLES = 2000
#: Samples per ``send_samples`` call of a link target (progress granularity).
_CHUNK = 128


class DeviceError(UserError, ValueError):
    """A target cannot be opened or used as asked (unknown target, missing model, bad shapes)."""


@dataclass(frozen=True)
class TrainReport:
    """What one :meth:`Device.train` call did.

    Members
    -------
    samples: training samples streamed (``epochs × n``).
    epochs: passes over the data.
    seconds: wall-clock time of the call (s).
    samples_per_s: ``samples / seconds``.
    accuracy: fraction of training samples whose prediction (made in the forward pass, with the
        weights the pipeline used) was right; None for the float reference trainer.
    loss: mean loss of those forwards (numerics §4 loss output); None for the reference, and
        for cross-entropy runs through the on-chip set (their summaries sum p_y, not −ln p_y).
    epoch_summaries: runs through the on-chip training set: per epoch ``{"loss_sum",
        "correct", "accuracy"}`` (docs/protocol.md §2 RUN); None otherwise.
    device_cycles: the clock cycles the device counted for those runs (link targets), else
        None; ``device_samples_per_s`` = samples at ``plan.clock_hz`` over them.
    """

    samples: int
    epochs: int
    seconds: float
    samples_per_s: float
    accuracy: float | None
    loss: float | None
    epoch_summaries: list[dict[str, Any]] | None = None
    device_cycles: int | None = None
    device_samples_per_s: float | None = None


@dataclass
class Verification:
    """A comparison of a link device with its golden shadow (:meth:`Device.verify`).

    Members
    -------
    bit_exact: every result record, weight, velocity and counter equal.
    results: result records compared; memories: memory words compared.
    mismatches: one line per difference (at most 20 kept).
    """

    bit_exact: bool
    results: int = 0
    memories: int = 0
    mismatches: list[str] = field(default_factory=list)


def _as_tensor(x: Any, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().to(dtype)
    return torch.as_tensor(np.asarray(x), dtype=dtype)


class Device:
    """A network being trained on one target (build with :func:`open`).

    Members
    -------
    target: ``golden``, ``reference``, ``sim`` or the link URL.
    plan: the compiled plan; result: the :class:`CompileResult` (None when opened from a plan).
    model: the original ``nn.Module`` (its ``load_state_dict`` takes :meth:`state_dict`).
    config: training settings (``seed`` orders the samples).
    client: the :class:`LinkClient` (link targets), else None.
    trainer: the in-process trainer (golden/reference), else None.
    shadow: a golden model fed the same stream (link targets with ``shadow=True``), else None.
    samples_trained: training samples this host streamed.
    epochs_trained: epochs streamed so far (epoch e uses ``epoch_order(n, seed, e)``).
    results: result records ``(pred, loss_raw, train)`` the device returned, in order (link
        targets and golden).
    sim_stats: the simulator's statistics after :meth:`close` (``sim`` target).
    """

    def __init__(
        self,
        target: str,
        plan: Plan,
        model: nn.Module | None,
        config: TrainConfig,
        *,
        result: CompileResult | None = None,
        trainer: Any = None,
        client: LinkClient | None = None,
        transport: Transport | None = None,
        bridge: Any = None,
        shadow: GoldenModel | None = None,
        progress: bool | None = None,
    ) -> None:
        self.target = target
        self.plan = plan
        self.model = model
        self.config = config
        self.result = result
        self.trainer = trainer
        self.client = client
        self.shadow = shadow
        self.progress = progress
        self.samples_trained = 0
        self.epochs_trained = 0
        self.results: list[tuple[int, int, bool]] = []
        self.sim_stats: dict[str, Any] | None = None
        self._transport = transport
        self._bridge = bridge
        self._pool = ThreadPoolExecutor(1) if shadow is not None else None
        self._pending: list[Future[Any]] = []
        self._closed = False
        self._shadow_results = 0  # golden results already produced when this device started
        # network counters restored from a checkpoint (link targets): added to the device's
        self._counter_base: dict[str, Any] | None = None
        # weight updates the link device's LFSRs had made when its counters were last reset
        # (0: fresh at open; None: unknown, the device had run samples before)
        self._lfsr_base: int | None = 0
        self._link_results: list[Result] = []

    # -- shadow (golden model fed the same stream, in a worker thread) --------------------------
    def _to_shadow(self, fn: Any, *args: Any) -> None:
        if self.shadow is None or self._pool is None:
            return
        self._pending.append(self._pool.submit(fn, *args))

    def _sync_shadow(self) -> None:
        for f in self._pending:
            f.result()
        self._pending.clear()

    # -- properties -----------------------------------------------------------------------------
    @property
    def is_link(self) -> bool:
        """Whether the target is reached over the host link."""
        return self.client is not None

    @property
    def retransmits(self) -> int:
        """Commands the link client sent again after a timeout (0 for in-process targets)."""
        return self.client.retransmits if self.client is not None else 0

    @property
    def saturations(self) -> int:
        """Saturation events so far (sum over stages and the loss unit; 0 for reference)."""
        c = self.counters()
        return int(sum(c.get("saturations", [])))

    def _check(self) -> None:
        if self._closed:
            raise DeviceError(f"the {self.target} device is closed")

    def _xy(self, x: Any, y: Any | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        xt = _as_tensor(x, torch.float32)
        shape = tuple(self.plan.input_shape)  # a CNN's (C, L) / (C, H, W): flat in C order
        if xt.ndim == 1 or (len(shape) > 1 and tuple(xt.shape) == shape):
            xt = xt.reshape(1, -1)
        elif len(shape) > 1 and tuple(xt.shape[1:]) == shape:
            xt = xt.reshape(len(xt), -1)
        if xt.ndim != 2 or xt.shape[1] != self.plan.in_features:
            also = f" or (n, {', '.join(map(str, shape))})" if len(shape) > 1 else ""
            raise DeviceError(
                f"inputs have shape {tuple(xt.shape)}; the network takes (n, "
                f"{self.plan.in_features}){also}"
            )
        if y is None:
            return xt, None
        yt = _as_tensor(y, torch.int64).reshape(-1)
        if len(yt) != len(xt):
            raise DeviceError(f"{len(xt)} samples but {len(yt)} labels")
        classes = self.plan.loss.classes
        if len(yt) and (int(yt.min()) < 0 or int(yt.max()) >= classes):
            raise DeviceError(
                f"labels lie in [{int(yt.min())}, {int(yt.max())}]; the network has "
                f"{classes} outputs (labels 0..{classes - 1})"
            )
        return xt, yt

    def _show(self, total: int, progress: bool | None) -> bool:
        show = self.progress if progress is None else progress
        if show is None:
            show = total >= PROGRESS_MIN_SAMPLES and sys.stderr.isatty()
        return bool(show)

    def _bar(self, total: int, progress: bool | None) -> tqdm:
        return progress_bar(
            total=total,
            disable=not self._show(total, progress),
            unit="sample",
            leave=False,
            desc=f"train {self.target}",
        )

    # -- training -------------------------------------------------------------------------------
    def train(
        self,
        x: Any,
        y: Any,
        epochs: int = 1,
        progress: bool | None = None,
        *,
        checkpoint: str | os.PathLike[str] | None = None,
        checkpoint_every: int | None = None,
        resume: Checkpoint | None = None,
        onchip: bool = False,
        records: bool = False,
    ) -> TrainReport:
        """Train on ``x`` (n, N) floats with labels ``y`` (n,) for ``epochs`` passes, one sample
        at a time in :func:`~pipetrain.data.epoch_order`, then flush (every update applied).

        ``progress``: a tqdm bar over samples (None: on a TTY for ≥ ``PROGRESS_MIN_SAMPLES``).

        Checkpoints (``golden`` and link targets; docs/protocol.md §7): with ``checkpoint_every``
        = k (samples; default one epoch when ``checkpoint`` or ``resume`` is given) the run
        flushes after every k samples — the PB stream is cut there, so the numbers are those of
        a run with that flush period — and writes the state to ``checkpoint`` (a
        :class:`~pipetrain.host.checkpoint.Checkpoint`, atomically) at each flush. ``resume``
        restores a checkpoint's state onto this device and continues its run from its position
        (same plan, data, seed and period): bit for bit what the uninterrupted run computes. The
        report then covers the whole run (``samples`` = epochs × n, accuracy over all of it).

        ``onchip``: train through the on-chip training set (docs/protocol.md §2 STORE/RUN): the
        data is uploaded once (again only when it changed), then the device runs the epochs in
        its own LFSR order (:func:`~pipetrain.sim.golden.onchip_order`, flushing after every 32
        epochs) with no sample on the link; the report carries the epoch summaries instead of
        per-sample results — with ``records`` also those (one epoch per RUN, so the device
        flushes after every epoch, and the set must fit its result buffer: result_depth ≥ n),
        and the exact mean loss. The ``golden`` target computes the same run in the same order
        (what a fresh device must match bit for bit).

        Raises :class:`DeviceError` for bad shapes/labels, ``epochs < 1``, ``checkpoint_every
        < 1``, checkpoints on the reference target, or ``onchip`` with checkpoints or on the
        reference target; :class:`~pipetrain.host.client.OnChipError` when the device has no
        on-chip set or too few slots;
        :class:`~pipetrain.host.checkpoint.CheckpointError` for a checkpoint of another plan or
        data; :class:`~pipetrain.host.client.LinkError` when the link fails.
        """
        self._check()
        xt, yt = self._xy(x, y)
        assert yt is not None
        if epochs < 1:
            raise DeviceError(f"epochs must be ≥ 1, got {epochs}")
        if onchip:
            if checkpoint is not None or checkpoint_every is not None or resume is not None:
                raise DeviceError(
                    "--on-chip-data runs take no checkpoints (the device runs whole epochs "
                    "on its own): drop --checkpoint/--resume or --on-chip-data"
                )
            return self._train_onchip(xt, yt, epochs, records)
        if checkpoint is not None or checkpoint_every is not None or resume is not None:
            return self._train_run(xt, yt, epochs, progress, checkpoint, checkpoint_every, resume)
        n = len(xt)
        t0 = time.perf_counter()
        if self.client is None:
            first = len(getattr(self.trainer, "results", []))
            self.trainer.epochs_trained = self.epochs_trained
            show = self._show(n * epochs, progress)
            self.trainer.train(xt, yt, epochs=epochs, progress=show)
            got = [
                (r.pred, r.loss_raw, r.train) for r in getattr(self.trainer, "results", [])[first:]
            ]
        else:
            got = self._train_link(xt, yt, epochs, progress)
        seconds = time.perf_counter() - t0
        self.epochs_trained += epochs
        self.samples_trained += n * epochs
        self.results += got
        samples = n * epochs
        acc = loss = None
        if got:
            start = self.epochs_trained - epochs
            labels = torch.cat(
                [yt[epoch_order(n, self.config.seed, start + e)] for e in range(epochs)]
            ).tolist()
            acc = sum(p == lab for (p, _, _), lab in zip(got, labels, strict=True)) / samples
            loss = float(np.mean([self._loss(raw) for _, raw, _ in got]))
        return TrainReport(
            samples, epochs, seconds, samples / seconds if seconds > 0 else float("inf"), acc, loss
        )

    def _train_onchip(
        self, xt: torch.Tensor, yt: torch.Tensor, epochs: int, records: bool = False
    ) -> TrainReport:
        """:meth:`train` through the on-chip training set (see there)."""
        n = len(xt)
        per_run = 1 if records else MAX_RUN_EPOCHS
        got_records: list[tuple[int, int, bool]] = []
        if self.client is None and not isinstance(self.trainer, GoldenModel):
            raise DeviceError(
                f"--on-chip-data needs the golden or a link target; {self.target} is the float "
                "reference trainer"
            )
        if not 1 <= n <= 0xFFFF:
            raise DeviceError(f"an on-chip training set holds 1..65535 samples, got {n}")
        labels = yt.tolist()
        seed, first = self.config.seed, self.epochs_trained
        t0 = time.perf_counter()
        sums: list[EpochSummary] = []
        cycles: int | None = None
        if self.client is not None:
            cli = self.client
            cli.check_onchip(n)
            assert cli.info is not None
            if records and n > cli.info.result_depth:
                raise OnChipError(
                    f"per-sample records of a {n}-sample set need a result buffer of {n}, the "
                    f"device's holds {cli.info.result_depth}: train without them (epoch "
                    "summaries only) or on a smaller set"
                )
            xq = quantise_inputs(xt.numpy(), self.plan)
            digest = data_digest(xt, yt)
            if getattr(self, "_onchip_digest", None) != digest:
                cli.store(xq, labels)
                self._onchip_digest = digest
            per_sample = max(self.plan.in_features, self.plan.ideal_cycles_per_sample)
            rate = 20e3 if self.target == "sim" else self.plan.clock_hz  # simulated cycles/s
            cycles = 0
            orders = onchip_order(n, seed, first, epochs, per_run)
            for (start, mask, k), order in zip(
                run_chunks(n, seed, first, epochs, per_run), orders, strict=True
            ):
                got, cyc = cli.run(
                    n, k, start, mask, seconds=4 * k * n * per_sample / rate, records=records
                )
                sums += got
                cycles += cyc
                idx = order.numpy()
                if records:
                    mine = cli.read_results()
                    if len(mine) != n:
                        raise DeviceError(f"{len(mine)} records for a {n}-sample epoch")
                    got_records += [(r.pred, r.loss, r.train) for r in mine]
                elif self.shadow is not None:  # for verify(): where the shadow's records go
                    runs = self.__dict__.setdefault("_onchip_runs", [])
                    pos = len(self.results) + sum(len(r[1]) for r in runs)  # shadow records
                    runs.append((pos, [labels[i] for i in idx.tolist()], got))
                self._to_shadow(_shadow_submit, self.shadow, torch.from_numpy(xq[idx]), [
                    labels[i] for i in idx.tolist()
                ])  # fmt: skip
                self._to_shadow(GoldenModel.flush, self.shadow)
        else:
            g = self.trainer
            xq_t = g.quantise_input(xt)
            for order in onchip_order(n, seed, first, epochs, per_run):
                start_res = len(g.results)
                for i in order.tolist():
                    g.submit(xq_t[i], labels[i], True)
                g.flush()
                res = g.results[start_res:]
                for e in range(len(res) // n):
                    part = res[e * n : (e + 1) * n]
                    ids = order[e * n : (e + 1) * n].tolist()
                    sums.append(
                        EpochSummary(
                            sum(r.loss_raw for r in part),
                            sum(int(r.pred == labels[i]) for r, i in zip(part, ids, strict=True)),
                        )
                    )
                got_records += [(r.pred, r.loss_raw, r.train) for r in res]
        if self.client is None or records:
            self.results += got_records
        seconds = time.perf_counter() - t0
        self.epochs_trained += epochs
        self.samples_trained += n * epochs
        samples = n * epochs
        lu = self.plan.loss
        loss = None
        if lu.kind == "mse":
            loss = sum(s.loss_sum for s in sums) / 2.0 ** (2 * lu.z.frac) / lu.classes / samples
        elif records:
            loss = float(np.mean([self._loss(raw) for _, raw, _ in got_records]))
        summaries = [
            {"loss_sum": s.loss_sum, "correct": s.correct, "accuracy": s.correct / n} for s in sums
        ]
        return TrainReport(
            samples,
            epochs,
            seconds,
            samples / seconds if seconds > 0 else float("inf"),
            sum(s.correct for s in sums) / samples,
            loss,
            summaries,
            cycles,
            samples * self.plan.clock_hz / cycles if cycles else None,
        )

    def _loss(self, raw: int) -> float:
        return loss_value(Result(0, 0, raw, True), self.plan)

    def _train_link(
        self, xt: torch.Tensor, yt: torch.Tensor, epochs: int, progress: bool | None
    ) -> list[tuple[int, int, bool]]:
        cli = self.client
        assert cli is not None
        n = len(xt)
        xq = quantise_inputs(xt.numpy(), self.plan)
        labels = yt.numpy()
        first = cli._accepted
        got = []
        bar = self._bar(n * epochs, progress)
        try:
            for e in range(epochs):
                order = epoch_order(n, self.config.seed, self.epochs_trained + e).numpy()
                for k in range(0, n, _CHUNK):
                    idx = order[k : k + _CHUNK]
                    xc, yc = xq[idx], labels[idx].tolist()
                    got += cli.send_samples(xc, yc, True)
                    self._to_shadow(_shadow_submit, self.shadow, torch.from_numpy(xc), yc)
                    bar.update(len(idx))
        finally:
            bar.close()
        got += self._finish(cli)
        self._to_shadow(GoldenModel.flush, self.shadow)
        mine = [r for r in got if ((r.sample - first) & 0xFFFFFFFF) < n * epochs]
        if len(mine) != n * epochs:
            raise DeviceError(f"{len(mine)} results for {n * epochs} samples")
        return [(r.pred, r.loss, r.train) for r in mine]

    @staticmethod
    def _finish(cli: LinkClient) -> list[Any]:
        """Flush and read every outstanding result."""
        cli.flush()
        got = []
        while cli._outstanding():
            more = cli.read_results()
            if not more:
                raise LinkError(f"{cli._outstanding()} results missing after a flush")
            got += more
        return got

    # -- checkpointed runs (docs/protocol.md §7) ------------------------------------------------
    def _train_run(
        self,
        xt: torch.Tensor,
        yt: torch.Tensor,
        epochs: int,
        progress: bool | None,
        path: str | os.PathLike[str] | None,
        every: int | None,
        resume: Checkpoint | None,
    ) -> TrainReport:
        """:meth:`train` with a flush every ``every`` samples, a checkpoint at each flush and
        optionally a restored start (see there)."""
        if self.client is None and not isinstance(self.trainer, GoldenModel):
            raise DeviceError(
                f"checkpoints need the golden or a link target; {self.target} is the float "
                "reference trainer"
            )
        n = len(xt)
        total = n * epochs
        digest = data_digest(xt, yt)
        if resume is not None:
            resume.check(self.plan, digest, n, epochs)
            if resume.seed != self.config.seed:
                raise CheckpointError(
                    f"the checkpoint's run streams epoch order seed {resume.seed}, this one "
                    f"{self.config.seed}: resume with --seed {resume.seed}"
                )
            if every is not None and every != resume.every:
                raise CheckpointError(
                    f"the checkpoint's run flushes every {resume.every} samples, this one "
                    f"every {every}: resume with --checkpoint-every {resume.every}"
                )
            every = resume.every
            self._restore(resume)
            start, base, done = resume.position, resume.epoch_base, list(resume.results)
        else:
            start, base, done = 0, self.epochs_trained, []
        every = n if every is None else every
        if every < 1:
            raise DeviceError(f"checkpoint_every must be ≥ 1 sample, got {every}")
        orders: dict[int, np.ndarray] = {}

        def positions(a: int, b: int) -> np.ndarray:
            out = []
            for e in range(a // n, (b - 1) // n + 1):
                if e not in orders:
                    orders[e] = epoch_order(n, self.config.seed, base + e).numpy()
                lo, hi = max(a, e * n) - e * n, min(b, (e + 1) * n) - e * n
                out.append(orders[e][lo:hi])
            return np.concatenate(out)

        labels = yt.numpy()
        cli = self.client
        xq = (
            quantise_inputs(xt.numpy(), self.plan)
            if cli is not None
            else self.trainer.quantise_input(xt).numpy()
        )
        first = cli._accepted if cli is not None else len(self.trainer.results)
        self._link_results: list[Result] = []
        got: list[tuple[int, int, bool]] = []
        t0 = time.perf_counter()
        bar = self._bar(total - start, progress)
        p = start
        try:
            while p < total:
                end = min(total, (p // every + 1) * every)
                idx = positions(p, end)
                if cli is not None:
                    for k in range(0, len(idx), _CHUNK):
                        part = idx[k : k + _CHUNK]
                        xc, yc = xq[part], labels[part].tolist()
                        self._link_results += cli.send_samples(xc, yc, True)
                        self._to_shadow(_shadow_submit, self.shadow, torch.from_numpy(xc), yc)
                        bar.update(len(part))
                    self._link_results += self._finish(cli)
                    self._to_shadow(GoldenModel.flush, self.shadow)
                else:
                    g = self.trainer
                    for i in idx.tolist():
                        g.submit(torch.from_numpy(xq[i]), int(labels[i]), True)
                    g.flush()
                    bar.update(len(idx))
                p = end
                self.samples_trained += len(idx)
                if path is not None:
                    got = self._run_results(first, p - start)
                    self._checkpoint(epochs, n, base, every, p, digest, done + got).save(path)
        finally:
            bar.close()
        got = self._run_results(first, total - start)
        seconds = time.perf_counter() - t0
        self.epochs_trained = base + epochs
        self.results += got
        run = done + got
        order = positions(0, total)
        acc = (
            float(sum(pr == lab for (pr, _, _), lab in zip(run, labels[order], strict=True)))
            / total
        )
        loss = float(np.mean([self._loss(raw) for _, raw, _ in run]))
        streamed = total - start
        return TrainReport(
            total,
            epochs,
            seconds,
            streamed / seconds if seconds > 0 else float("inf"),
            acc,
            loss,
        )

    def _run_results(self, first: int, count: int) -> list[tuple[int, int, bool]]:
        """The run's result records so far: ``count`` samples from sample number ``first``."""
        if self.client is None:
            res = self.trainer.results[first : first + count]
            return [(r.pred, r.loss_raw, r.train) for r in res]
        mine = [r for r in self._link_results if ((r.sample - first) & 0xFFFFFFFF) < count]
        if len(mine) != count:
            raise DeviceError(f"{len(mine)} results for {count} samples")
        return [(r.pred, r.loss, r.train) for r in mine]

    def _checkpoint(
        self,
        epochs: int,
        n: int,
        base: int,
        every: int,
        position: int,
        digest: str,
        results: list[tuple[int, int, bool]],
    ) -> Checkpoint:
        """The state of this device at a flush point (the pipeline is empty)."""
        S = len(self.plan.stages)
        if self.client is None:
            snap = self.trainer.snapshot()
            memories = [snap["memories"][st.name] for st in self.plan.stages]
            counters = {
                "samples_trained": snap["samples_applied"],
                "ticks": self.trainer.ticks,
                "saturations": self.trainer.stage_saturations,
            }
            if self.trainer.K > 1:
                counters["head_correct"] = self.trainer.head_correct
            lfsr, updates, golden = snap["lfsr"], snap["samples_applied"], snap
        else:
            mem = self.client.read_weights()
            memories = [{k: v.tolist() for k, v in d.items()} for d in mem]
            raw = self.client.counters()
            c = self.counters()
            counters = {k: c[k] for k in ("samples_trained", "ticks", "saturations")}
            if c.get("head_correct"):  # auxiliary heads: their correct predictions
                counters["head_correct"] = c["head_correct"]
            updates = None if self._lfsr_base is None else self._lfsr_base + raw.samples_trained
            lfsr = [None] * S if updates is None else lfsr_states(self.plan, updates)
            golden = None
            if self.shadow is not None:
                self._sync_shadow()
                golden = self.shadow.snapshot()
        return Checkpoint(
            plan_hash=self.plan.hash,
            target=self.target,
            epochs=epochs,
            samples=n,
            seed=self.config.seed,
            epoch_base=base,
            every=every,
            position=position,
            digest=digest,
            memories=memories,
            lfsr=lfsr,
            lfsr_updates=-1 if updates is None else int(updates),
            counters=counters,
            golden=golden,
            results=results,
        )

    def _restore(self, ck: Checkpoint) -> None:
        """Put a checkpoint's state onto this device (and its golden shadow).

        Golden target: the snapshot is restored as it is. Link targets cannot write LFSR states
        or counters, so the state is re-created (*derived*, docs/protocol.md §7): the device
        must be fresh (no sample since it booted: its LFSRs hold the plan's seeds); it trains
        ``lfsr_updates`` zero samples, which advance every LFSR exactly as the checkpoint's
        updates did (the draws do not depend on the data), then the checkpoint's ``w``, ``u``,
        ``w_prev`` are written over what they did, the counters are reset and the checkpoint's
        network counters are added by the host from then on."""
        if self.client is None:
            if ck.golden is None:
                raise CheckpointError(
                    f"the checkpoint was written by the {ck.target} target without a golden "
                    "shadow; resume it on a link target (sim, serial://, tcp://)"
                )
            self.trainer.restore(ck.golden)
        else:
            cli = self.client
            if self.shadow is not None and ck.golden is None:
                raise CheckpointError(
                    f"the checkpoint was written by the {ck.target} target without a golden "
                    "shadow, so the shadow cannot resume: resume with --no-verify"
                )
            if self.plan.rounding == "stochastic" and ck.lfsr_updates != 0:
                if ck.lfsr_updates < 0:
                    raise CheckpointError(
                        "the checkpoint does not know the device's LFSR states (its device had "
                        "run samples before the run began); it can only resume on that device"
                    )
                info = cli.hello()
                if info.accepted != 0:
                    raise DeviceError(
                        f"the device has accepted {info.accepted} samples since it booted, so "
                        "its LFSR states are not the plan's seeds; reset (re-flash) it, then "
                        "resume"
                    )
                self._fast_forward(ck.lfsr_updates)
            cli.write_weights(
                [{k: np.asarray(v, np.int64) for k, v in d.items()} for d in ck.memories]
            )
            cli.reset_counters()
            self._counter_base = dict(ck.counters)
            self._lfsr_base = ck.lfsr_updates
            if self.shadow is not None:
                self._sync_shadow()
                assert ck.golden is not None
                self.shadow.restore(ck.golden)
                self._shadow_results = len(self.shadow.results)
        self.results = []
        self.epochs_trained = ck.epoch_base
        self.samples_trained = ck.position

    def _fast_forward(self, updates: int) -> None:
        """Train ``updates`` all-zero samples (label 0), flush and drop their results: every
        stage's LFSRs advance by ``updates`` updates (weights are overwritten afterwards)."""
        cli = self.client
        assert cli is not None
        zeros = np.zeros((min(updates, 4096), self.plan.in_features), np.int64)
        left = updates
        while left:
            k = min(left, len(zeros))
            cli.send_samples(zeros[:k], [0] * k, True)
            left -= k
        cli.flush()
        while cli._outstanding():
            if not cli.read_results():
                raise LinkError(f"{cli._outstanding()} results missing after a flush")

    # -- inference ------------------------------------------------------------------------------
    def _infer(self, xt: torch.Tensor, yt: torch.Tensor | None) -> torch.Tensor:
        self._check()
        if self.client is None:
            if isinstance(self.trainer, GoldenModel):
                pred, raw = self.trainer.infer(xt, yt)
                self.results += [(int(p), int(r), False) for p, r in zip(pred, raw, strict=True)]
                return pred
            return self.trainer.predict(xt)
        res = self.client.infer(xt.numpy(), None if yt is None else yt.tolist())
        self.results += [(r.pred, r.loss, r.train) for r in res]
        self._to_shadow(GoldenModel.infer, self.shadow, xt, yt)
        return torch.tensor([r.pred for r in res], dtype=torch.int64)

    def predict(self, x: Any) -> torch.Tensor:
        """Predicted classes, int64 (n,), of ``x`` (n, N) with the current weights (inference
        samples: forward only, no update; the pipeline is flushed before and after)."""
        xt, _ = self._xy(x, None)
        return self._infer(xt, None)

    def evaluate(self, x: Any, y: Any) -> float:
        """Accuracy (fraction in [0, 1]) of the device's predictions on ``x`` against ``y``."""
        xt, yt = self._xy(x, y)
        assert yt is not None
        return accuracy(self._infer(xt, yt), yt)

    # -- weights --------------------------------------------------------------------------------
    def memories(self) -> dict[str, dict[str, torch.Tensor]]:
        """Raw integer memories per stage name: ``w``, ``u`` (M, N+1; a convolution stage's
        (C_out, T + 1), docs/numerics.md §9), and ``w_prev`` for LWP
        ``w`` form, in the plan's fixed-point formats (golden and link targets)."""
        self._check()
        if self.client is None:
            if not isinstance(self.trainer, GoldenModel):
                raise DeviceError("the float reference trainer has no fixed-point memories")
            return self.trainer.memories()
        back = self.client.read_weights()
        return {
            st.name: {k: torch.from_numpy(v) for k, v in back[s].items()}
            for s, st in enumerate(self.plan.stages)
        }

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The current weights as a ``state_dict`` of the original module (``name.weight`` (M, N),
        ``name.bias`` (M,); a convolution's weight (C_out, C_in, *kernel), its bias only when the
        layer has one): the fixed-point weights ``w / 2^w.frac``, float32 when that is exact
        (``w.bits ≤ 25``), else float64 — so :meth:`load_state_dict` round-trips exactly. Main
        stages only: the auxiliary heads of local/interlocking learning are not in the original
        module (they are in :meth:`memories`)."""
        self._check()
        if self.client is None:
            return self.trainer.state_dict()
        mem = self.memories()
        out = {}
        for st in (s for s in self.plan.stages if s.role == "main"):
            fw = st.formats.w
            dtype = torch.float32 if fw.bits <= 25 else torch.float64
            wf = mem[st.name]["w"].to(torch.float64) * 2.0**-fw.frac
            conv = getattr(st, "conv", None)  # a convolution's (C_out, T + 1): numerics §9
            shape = (st.out_features, st.in_features) if conv is None else conv.weight_shape
            out[f"{st.name}.weight"] = wf[:, : st.cols].reshape(shape).to(dtype).contiguous()
            if conv is None or conv.bias:
                out[f"{st.name}.bias"] = wf[:, st.cols].to(dtype).contiguous()
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load float weights (``name.weight`` (M, N) / ``name.bias`` (M,) of every main
        stage, as :meth:`state_dict` gives them): quantised into ``w`` as numerics §2
        (``w_prev = w`` for LWP ``w`` form); velocities are kept, and so are the auxiliary
        heads of local/interlocking learning (their memories: :meth:`memories`). Raises
        :class:`DeviceError` (:func:`checked_state_dict`) for a missing or
        unexpected key, a value that is not a real tensor, a wrong shape or a NaN/infinite
        weight — before anything is written to the device."""
        self._check()
        state = checked_state_dict(self.plan, state)
        mains = [st for st in self.plan.stages if st.role == "main"]
        mems = [_weight_matrix(st, state) for st in mains]
        if self.client is None:
            if isinstance(self.trainer, GoldenModel):
                self.trainer.load_state_dict(state)
            else:
                _reference_load(self.trainer, mems)
            return
        self.client.flush()
        words: list[dict[str, Any]] = [{} for _ in self.plan.stages]  # heads: left as they are
        for st, wf in zip(mains, mems, strict=True):
            w = quantise(wf, st.formats.w)[0].numpy()
            d = {"w": w}
            if st.update.lwp_horizon > 0 and st.update.lwp_form == "w":
                d["w_prev"] = w
            words[st.index - 1] = d
        self.client.write_weights(words)
        self._to_shadow(GoldenModel.load_state_dict, self.shadow, state)

    # -- counters -------------------------------------------------------------------------------
    def counters(self) -> dict[str, Any]:
        """Counters since :func:`open`: ``samples_trained`` (training samples whose last update
        was applied), ``ticks``, ``saturations`` (per stage, then the loss unit), with auxiliary
        heads ``head_correct`` (per head, its predictions equal to the label; golden and link
        targets); link targets add the engine's counters (docs/protocol.md ``READ_COUNTERS``)."""
        self._check()
        if self.client is not None:
            c = self.client.counters().to_dict()
            b = self._counter_base
            if b is not None:  # restored from a checkpoint: the run's counters before it
                c["samples_trained"] += b["samples_trained"]
                c["ticks"] += b["ticks"]
                for key in ("saturations", "head_correct"):  # per stage / per head
                    if key in b:
                        c[key] = [u + v for u, v in zip(c[key], b[key], strict=True)]
            return c
        t = self.trainer
        if isinstance(t, GoldenModel):
            out: dict[str, Any] = {
                "samples_trained": t.samples_applied,
                "ticks": t.ticks,
                "saturations": t.stage_saturations,
            }
            if t.K > 1:  # the heads' correct predictions, as the RTL counts them
                out["head_correct"] = t.head_correct
            return out
        return {"samples_trained": t.samples_trained, "saturations": []}

    # -- verification against the golden shadow ------------------------------------------------
    def verify(self) -> Verification:
        """Compare the device with its golden shadow (``open(..., shadow=True)``): every result
        record (pred, loss, train), every memory word and the counters ``samples_trained``,
        ``ticks``, ``saturations`` and (auxiliary heads) ``head_correct``. Raises
        :class:`DeviceError` without a shadow."""
        self._check()
        if self.shadow is None:
            raise DeviceError("verify() needs a golden shadow: open(..., shadow=True)")
        self._sync_shadow()
        g = self.shadow
        bad: list[str] = []
        gold = [(r.pred, r.loss_raw, r.train) for r in g.results[self._shadow_results :]]
        # on-chip runs returned epoch summaries, not records: compare those, drop the records
        for pos, labels, sums in reversed(getattr(self, "_onchip_runs", [])):
            part = gold[pos : pos + len(labels)]
            n = len(labels) // len(sums)
            for e, s in enumerate(sums):
                rs, ls = part[e * n : (e + 1) * n], labels[e * n : (e + 1) * n]
                hits = sum(int(r[0] == lab) for r, lab in zip(rs, ls, strict=True))
                want = EpochSummary(sum(r[1] for r in rs), hits)
                if s != want:
                    bad.append(f"on-chip epoch summary {e}: device {s}, golden {want}")
            del gold[pos : pos + len(labels)]
        if len(gold) != len(self.results):
            bad.append(f"{len(self.results)} results from the device, {len(gold)} from golden")
        for k, (a, b) in enumerate(zip(self.results, gold, strict=False)):
            if a != b:
                bad.append(f"result {k}: device (pred, loss, train) {a}, golden {b}")
        mem, gm = self.memories(), g.memories()
        words = 0
        for st in self.plan.stages:
            for kind, want in gm[st.name].items():
                have = mem[st.name].get(kind)
                words += want.numel()
                if have is None or not torch.equal(have, want):
                    diff = 0 if have is None else int((have != want).sum())
                    first = ""
                    if diff:  # the first differing word, a conv stage's slot named
                        j, i = (have != want).nonzero()[0].tolist()
                        conv = getattr(st, "conv", None)
                        first = f", first {kind}[{j}, {i}]" + (
                            f" ({conv_slot(conv, j, i)})" if conv is not None else ""
                        )
                        first += f": golden {int(want[j, i])}, device {int(have[j, i])}"
                    bad.append(
                        f"stage {st.name} {kind}: {diff} of {want.numel()} words differ{first}"
                    )
        c = self.counters()
        checks: list[tuple[str, Any]] = [
            ("samples_trained", g.samples_applied),
            ("ticks", g.ticks),
            ("saturations", g.stage_saturations),
        ]
        if g.K > 1:  # the heads' loss units: their correct predictions
            checks.append(("head_correct", g.head_correct))
        for key, want in checks:
            have = list(c.get(key, ())) if key in ("saturations", "head_correct") else c[key]
            if have != want:
                bad.append(f"counter {key}: device {have}, golden {want}")
        return Verification(not bad, len(gold), words, bad[:20])

    # -- life cycle -----------------------------------------------------------------------------
    def close(self) -> None:
        """Close the link and stop the simulator (``sim``); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._transport is not None:
            self._transport.close()
        if self.client is not None and self.client.transport is not self._transport:
            self.client.transport.close()  # reopened after the link dropped
        if self._bridge is not None:
            self.sim_stats = self._bridge.close()

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # best effort: never leave a simulator behind
        try:
            if not self._closed and self._bridge is not None:
                self.close()
        except Exception:  # noqa: S110  (interpreter shutdown)
            pass


def checked_state_dict(plan: Plan, state: Any) -> dict[str, torch.Tensor]:
    """Check a ``state_dict`` for ``plan`` and return it as float64 tensors: exactly the keys
    ``<stage name>.weight`` (out_features, in_features) and ``<stage name>.bias``
    (out_features,) of every main stage (the original module's; not the auxiliary heads of
    local/interlocking learning), each a real (float or integer) ``torch.Tensor`` or numpy
    array of finite values. Raises :class:`DeviceError` naming the key and the fix otherwise
    (*derived*: ``torch.nn.Module.load_state_dict(strict=True)`` also refuses missing and
    unexpected keys)."""
    if not isinstance(state, dict):
        raise DeviceError(
            f"a state_dict is a dict of tensors (model.state_dict()), not {type(state).__name__}"
        )
    shapes = {}
    for st in (s for s in plan.stages if s.role == "main"):
        if getattr(st, "conv", None) is not None:  # a convolution's (C_out, C_in, *kernel)
            shapes[f"{st.name}.weight"] = st.conv.weight_shape
            if st.conv.bias:
                shapes[f"{st.name}.bias"] = (st.conv.out_channels,)
            continue
        shapes[f"{st.name}.weight"] = (st.out_features, st.in_features)
        shapes[f"{st.name}.bias"] = (st.out_features,)
    for key in shapes:
        if key not in state:
            raise DeviceError(f"state_dict lacks {key!r} (it needs {', '.join(shapes)})")
    extra = [k for k in state if k not in shapes]
    if extra:
        raise DeviceError(
            f"state_dict has unexpected key(s) {', '.join(map(repr, extra))}: the plan's stages "
            f"take only {', '.join(shapes)}"
        )
    out = {}
    for key, shape in shapes.items():
        v = state[key]
        if isinstance(v, np.ndarray) and v.dtype.kind in "biuf":
            v = torch.from_numpy(np.array(v))
        if not isinstance(v, torch.Tensor):
            raise DeviceError(f"state_dict[{key!r}] is a {type(v).__name__}, not a tensor")
        if v.dtype == torch.bool or v.is_complex():
            raise DeviceError(
                f"state_dict[{key!r}] has dtype {v.dtype}; weights are real numbers (float)"
            )
        if tuple(v.shape) != shape:
            raise DeviceError(
                f"state_dict[{key!r}] has shape {tuple(v.shape)}; the plan's stage needs {shape}"
            )
        v = v.detach().to(torch.float64)
        if not bool(torch.isfinite(v).all()):
            raise DeviceError(f"state_dict[{key!r}] holds NaN or infinite values")
        out[key] = v
    return out


def _weight_matrix(st: Any, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """A stage's (rows, columns + 1) weight matrix, bias column last, from a checked
    ``state_dict`` (a convolution's weight viewed (C_out, T); a bias-free one's column 0)."""
    w = state[f"{st.name}.weight"]
    w = w.reshape(w.shape[0], -1)
    key = f"{st.name}.bias"
    b = state[key] if key in state else torch.zeros(w.shape[0], dtype=w.dtype)
    return torch.cat([w, b[:, None]], 1)


def _shadow_submit(g: GoldenModel, xq: torch.Tensor, ys: Sequence[int]) -> None:
    for row, y in zip(xq, ys, strict=True):
        g.submit(row, int(y), True)


def _reference_load(trainer: Any, mems: list[torch.Tensor]) -> None:
    """Replace the reference trainer's main-stage weights (velocities kept), after a flush."""
    from ..sim.reference import Version

    trainer.flush()
    for st, w in zip(trainer._main, mems, strict=True):
        cur = st.current
        w = w.to(cur.w.dtype)
        st.queue.clear()
        st.queue.append(Version(w, cur.u, w, cur.index))


def local_trainer(target: str, plan: Plan, model: nn.Module, config: TrainConfig) -> Trainer:
    """The in-process trainer of a local target: ``golden`` (the fixed-point golden model) or
    ``reference`` (the float PB reference trainer, same schedule). Raises
    :class:`DeviceError` for another target."""
    if target == "golden":
        return GoldenModel(plan, model, config)
    if target == "reference":
        from ..compiler.frontend import trace
        from ..sim.calibrate import ir_sequential
        from ..sim.reference import ReferenceTrainer

        if type(model) not in (nn.Sequential, nn.Linear):
            # a model class of the user's (functional forms, views): the chain the front end
            # accepted, sharing the model's Linear modules
            model = ir_sequential(model, trace(model, plan.name))
        return ReferenceTrainer(model, config, plan=plan, profile=False)
    raise DeviceError(f"{target!r} is not a local target; use one of {', '.join(LOCAL_TARGETS)}")


def _resolve(
    plan_or_model: Any,
    config: TrainConfig | dict | None,
    model: nn.Module | None,
    compile_options: dict[str, Any],
    board: str | None = None,
) -> tuple[Plan, nn.Module | None, TrainConfig, CompileResult | None]:
    if board is not None and isinstance(plan_or_model, (CompileResult, Plan)):
        raise DeviceError(
            "board= fits the plan while compiling the model; pass a model name, file or "
            "nn.Module with it (this plan is compiled already)"
        )
    if isinstance(plan_or_model, CompileResult):
        r = plan_or_model
        return r.plan, r.model, r.config, r
    if isinstance(plan_or_model, Plan):
        plan = plan_or_model
        if config is None:
            cfg = {k: v for k, v in plan.train.items() if k not in ("lr1", "momentum1")}
            config = TrainConfig.from_dict(cfg)
        elif isinstance(config, dict):
            config = TrainConfig.from_dict(config)
        return plan, model, config, None
    if model is not None:
        raise DeviceError("model= is only used with a Plan (the model is compiled otherwise)")
    cfg = TrainConfig.from_dict(config) if isinstance(config, dict) else config
    r = compile_design(plan_or_model, cfg, board=board, writers=(), **compile_options)
    if r.formats.source.startswith("static") and "formats" not in compile_options:
        warnings.warn(
            f"{r.name}: no data= given, so the formats are not calibrated (static formats); "
            "pass data= (a Dataset or FILE.npz of the model's width) to calibrate them",
            UserWarning,
            stacklevel=3,
        )
    return r.plan, r.model, r.config, r


def open(  # noqa: A001  (the API's name: pipetrain.host.open)
    plan_or_model: Plan | CompileResult | nn.Module | str,
    target: str = "sim",
    config: TrainConfig | dict | None = None,
    *,
    model: nn.Module | None = None,
    shadow: bool = False,
    write_weights: bool = True,
    timeout: float | None = None,
    progress: bool | None = None,
    sim_options: dict[str, Any] | None = None,
    board: str | None = None,
    **compile_options: Any,
) -> Device:
    """Open a training target for a network and return a :class:`Device`.

    ``plan_or_model``: a built-in model name, a ``.py`` model file or an ``nn.Module`` (compiled
    here with ``config`` and ``compile_options`` of
    :func:`~pipetrain.host.flow.compile_design`, e.g. ``formats``, ``data``, ``lanes``;
    without ``data`` a model that digits fits calibrates on digits, any other compiles with
    static, uncalibrated formats, with a ``UserWarning`` naming ``data=``);
    a :class:`CompileResult`; or a :class:`Plan` together with ``model=`` (the module whose
    weights start the device and receive :meth:`Device.state_dict`; optional for link targets,
    which then keep the weights they hold).

    ``target``: ``sim`` | ``golden`` | ``reference`` | ``serial://PORT[?baud=N]`` |
    ``tcp://HOST:PORT``. ``shadow``: (link targets) feed a golden model the same stream, in a
    worker thread, for :meth:`Device.verify`. ``write_weights``: (link targets) start from the
    model's weights. ``timeout``: link seconds per attempt (default 60 for ``sim``, with 2
    retries since TCP loses nothing; 0.5 otherwise, 50 retries). ``progress``: progress bars
    (None: automatic). ``sim_options``: keyword arguments of
    :class:`~pipetrain.sim.bridge.SimBridge`. ``board``: compile the model fitted to that board
    (:func:`~pipetrain.host.flow.compile_design` with ``board``), the plan ``pipetrain build
    --board`` put in its bitstream — needed to train a board over ``serial://``.

    Raises :class:`DeviceError` for an unknown target, a missing model or ``board`` with a
    compiled plan, :class:`~pipetrain.compiler.targets.BoardError` for an unknown board
    (:class:`~pipetrain.compiler.fit.FitError`: a net that does not fit it),
    :class:`~pipetrain.host.transport.TransportError` when a link cannot be opened,
    :class:`~pipetrain.host.client.PlanMismatchError` when the device was built from another
    plan, the compiler's errors for a bad model/config, and for ``sim``
    :class:`~pipetrain.sim.verilator.ToolchainError`/:class:`~pipetrain.sim.verilator.RTLSimError`
    when the simulation cannot be built or started.
    """
    is_link = target == "sim" or target.startswith(LINK_SCHEMES)
    if target not in LOCAL_TARGETS and not is_link:
        raise DeviceError(
            f"unknown target {target!r}: use sim, golden, reference, serial://PORT or "
            "tcp://HOST:PORT"
        )
    plan, mdl, cfg, result = _resolve(plan_or_model, config, model, compile_options, board)
    if target in LOCAL_TARGETS:
        if mdl is None:
            raise DeviceError(f"the {target} target needs the model (pass model= with a Plan)")
        trainer = local_trainer(target, plan, mdl, cfg)
        return Device(target, plan, mdl, cfg, result=result, trainer=trainer, progress=progress)
    require_hdl(plan)  # a link target runs the generated hardware: a conv stage is not built yet
    golden = GoldenModel(plan, mdl, cfg) if mdl is not None else None
    if shadow and (golden is None or not write_weights):
        raise DeviceError(
            "shadow=True needs the model (pass model= with a Plan) and write_weights=True "
            "(the device and the golden shadow must start from the same weights)"
        )
    bridge = None
    transport: Transport | None = None
    try:
        if target == "sim":
            from ..sim.bridge import SimBridge

            bridge = SimBridge(plan, **(sim_options or {})).start()
            transport = TcpTransport("127.0.0.1", bridge.port)
            # TCP loses nothing: a timeout means a hung design, so give up after two retries
            link_timeout, retries = (60.0 if timeout is None else timeout), 2
        else:
            transport = open_transport(target)
            link_timeout, retries = (0.5 if timeout is None else timeout), 50
        # a board or bridge keeps running when the host's link drops: reopen and continue
        # exactly once (the sim target's simulation ends with its connection)
        reopen = None if target == "sim" else (lambda: open_transport(target))
        client = LinkClient(
            transport, plan, timeout=link_timeout, max_retries=retries, reconnect=reopen
        )
        client.hello()
        client.start_session()
        client.reset_counters()
        if write_weights and golden is not None:
            mem = golden.memories()
            client.write_weights(
                [{k: v.numpy() for k, v in mem[st.name].items()} for st in plan.stages]
            )
    except BaseException:
        if transport is not None:
            transport.close()
        if bridge is not None:
            bridge.terminate()
        raise
    dev = Device(
        target,
        plan,
        mdl,
        cfg,
        result=result,
        client=client,
        transport=transport,
        bridge=bridge,
        shadow=golden if shadow else None,
        progress=progress,
    )
    if dev.shadow is not None:
        dev._shadow_results = len(dev.shadow.results)
    assert client.info is not None
    dev._lfsr_base = 0 if client.info.accepted == 0 else None
    return dev
