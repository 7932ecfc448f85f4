"""Datasets: scikit-learn's 8×8 digits (embedded default) and a user's ``.npz`` file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError

__all__ = [
    "MAX_LABEL",
    "Dataset",
    "DataError",
    "epoch_order",
    "load_data",
    "load_digits",
    "load_npz",
]

DIGITS_TEST_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0


class DataError(UserError, ValueError):
    """A dataset is missing or malformed; the message names the key, shape or dtype at fault."""


@dataclass(frozen=True)
class Dataset:
    """Train/test tensors: ``x_*`` float32 (samples, features), ``y_*`` int64 (samples,).

    ``sample_shape``: one sample's shape as given — (C, L) or (C, H, W) for feature maps,
    stored flattened in C order (the order the hardware streams a sample's values); empty for
    plain feature vectors (then :attr:`shape` is (features,)).
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    sample_shape: tuple[int, ...] = ()

    @property
    def shape(self) -> tuple[int, ...]:
        """One sample's shape: :attr:`sample_shape`, or (features,)."""
        return self.sample_shape or (self.features,)

    def fits(self, shape: tuple[int, ...]) -> bool:
        """Whether samples of this set can feed a network whose sample is ``shape`` ((N,) for
        an MLP, (C, L) / (C, H, W) for a CNN): the same shape, or the same number of values
        when either side is a flat vector (a flat sample is streamed in C order; an MLP
        flattens feature maps). Source: *derived* (samples stream flat, docs/ports.md)."""
        n = 1
        for v in shape:
            n *= v
        if n != self.features:
            return False
        return len(shape) == 1 or len(self.shape) == 1 or tuple(shape) == self.shape

    def mismatch(self, shape: tuple[int, ...], model: str) -> str | None:
        """None when :meth:`fits`, else a message naming both shapes and the fix."""
        if self.fits(shape):
            return None
        mine = "×".join(map(str, self.shape))
        theirs = "×".join(map(str, shape))
        return (
            f"data {self.name!r} has samples of shape {mine} ({self.features} values) but model "
            f"{model!r} takes {theirs}: give data of that shape with --data FILE.npz (x_train "
            f"of shape (n, {', '.join(map(str, shape))}), or flat (n, features)), or a model "
            "that takes these samples"
            + (
                f"; a convolution network without model.input_shape is given the smallest size "
                f"that fits its first Linear: if it takes {mine} samples, set model.input_shape "
                f"= ({', '.join(map(str, self.shape))}) in the model file"
                if len(shape) > 1 and len(self.shape) == len(shape)
                else ""
            )
        )

    @property
    def features(self) -> int:
        """Input features per sample."""
        return int(self.x_train.shape[1])

    @property
    def classes(self) -> int:
        """Number of classes (max label + 1 over train and test)."""
        return int(max(self.y_train.max(), self.y_test.max())) + 1


def load_digits() -> Dataset:
    """Return scikit-learn's 8×8 digits: 1437 train / 360 test samples, 64 features, 10 classes.

    Split: ``train_test_split(test_size=0.2, random_state=0, stratify=y)``. Scaling: pixel
    values 0..16 divided by 16, so features lie in [0, 1]. The 64 values are the 8×8 image
    row-major, flat (no ``sample_shape``), so they feed any network of 64 inputs: a CNN on
    (1, 8, 8) reads them as one-channel 8×8 images (C order), ``cnn1d-digits`` as a 1×64
    sequence.
    """
    from sklearn.datasets import load_digits as _load
    from sklearn.model_selection import train_test_split

    bunch = _load()
    x = (bunch.data / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=DIGITS_TEST_FRACTION, random_state=DIGITS_SPLIT_SEED, stratify=y
    )
    return Dataset(
        "digits",
        torch.from_numpy(x_tr),
        torch.from_numpy(y_tr),
        torch.from_numpy(x_te),
        torch.from_numpy(y_te),
    )


#: Labels must be below this: the result record carries the prediction in 16 bits
#: (docs/protocol.md, ``Plan.result_bits``), so no design can predict a larger class.
MAX_LABEL = (1 << 16) - 1


def load_npz(path: str | Path) -> Dataset:
    """Load ``x_train, y_train, x_test, y_test`` from an ``.npz`` file.

    ``x_*`` must be real (float or integer) arrays of finite values with at least one sample,
    of shape (samples, features), (samples, C, L) (Conv1d) or (samples, C, H, W) (Conv2d) —
    train and test the same sample shape, every size ≥ 1 — stored flattened in C order with
    ``sample_shape`` = the shape after the samples (empty for (samples, features)); ``y_*``
    1-D integer labels in 0..:data:`MAX_LABEL` with as many entries as their ``x``. Shapes:
    ``x_*`` (samples, features) → float32,
    ``y_*`` (samples,) → int64. Other arrays in the file are ignored. Raises
    :class:`DataError` naming the array and what is wrong (a file that is not an ``.npz``
    archive, a missing array, an array that cannot be read without pickle, a wrong shape or
    dtype, an empty split, NaN/infinite values or values beyond float32, labels out of range).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {str(path)!r} does not exist")
    hint = "write one with numpy.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)"
    try:
        arrays = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise DataError(
            f"{str(path)!r} is not a readable .npz file ({hint}): {type(exc).__name__}"
        ) from exc
    if not hasattr(arrays, "files"):  # a plain .npy array, not an archive
        raise DataError(f"{str(path)!r} holds a single array, not an .npz archive of four arrays")
    with arrays:
        need = ("x_train", "y_train", "x_test", "y_test")
        missing = [k for k in need if k not in arrays.files]
        if missing:
            raise DataError(
                f"{str(path)!r} lacks array(s) {', '.join(missing)}; it has "
                f"{', '.join(arrays.files) or 'none'} (need {', '.join(need)})"
            )
        raw = {}
        for k in need:
            try:
                raw[k] = np.asarray(arrays[k])
            except Exception as exc:  # object arrays (pickle), a damaged member
                raise DataError(
                    f"{k} in {str(path)!r} cannot be read as a plain numeric array ({hint}): "
                    f"{type(exc).__name__}: {exc}"
                ) from None
    out = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for split in ("train", "test"):
        x, y = raw[f"x_{split}"], raw[f"y_{split}"]
        if x.ndim not in (2, 3, 4):
            raise DataError(
                f"x_{split} must be (samples, features), (samples, C, L) or (samples, C, H, W), "
                f"got shape {x.shape}"
            )
        is_real = np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)
        if not is_real:
            raise DataError(f"x_{split} must be a real number array, got dtype {x.dtype}")
        if 0 in x.shape[1:]:
            raise DataError(f"x_{split} has no features (shape {x.shape}); need ≥ 1 column")
        shapes[split] = tuple(int(v) for v in x.shape[1:]) if x.ndim > 2 else ()
        x = x.reshape(len(x), int(np.prod(x.shape[1:])))  # C order; -1 fails for 0 samples
        if y.ndim != 1:
            raise DataError(f"y_{split} must be 1-D class labels, got shape {y.shape}")
        if not np.issubdtype(y.dtype, np.integer):
            raise DataError(f"y_{split} must hold integer class labels, got dtype {y.dtype}")
        if len(y) != len(x):
            raise DataError(f"x_{split} has {len(x)} samples but y_{split} has {len(y)}")
        if len(y) == 0:
            raise DataError(f"x_{split} is empty")
        if y.min() < 0:
            raise DataError(f"y_{split} has negative labels (min {y.min()})")
        if y.max() > MAX_LABEL:
            raise DataError(
                f"y_{split} has label {y.max()} > {MAX_LABEL} (class labels are 0..C−1 and the "
                "result record carries 16 bits)"
            )
        with np.errstate(over="ignore", invalid="ignore"):  # checked on the next line
            xf = x.astype(np.float32)
        if not np.all(np.isfinite(xf)):
            what = "NaN or infinite" if not np.all(np.isfinite(x)) else "beyond float32 range"
            raise DataError(f"x_{split} contains {what} values")
        out[f"x_{split}"] = torch.from_numpy(xf)
        out[f"y_{split}"] = torch.from_numpy(y.astype(np.int64))
    if shapes["train"] != shapes["test"]:
        raise DataError(
            f"x_train has samples of shape {shapes['train'] or (out['x_train'].shape[1],)} but "
            f"x_test {shapes['test'] or (out['x_test'].shape[1],)}: give both the same shape"
        )
    if out["x_train"].shape[1] != out["x_test"].shape[1]:
        raise DataError(
            f"x_train has {out['x_train'].shape[1]} features but x_test has "
            f"{out['x_test'].shape[1]}"
        )
    return Dataset(path.stem, **out, sample_shape=shapes["train"])


def load_data(spec: str) -> Dataset:
    """Return the dataset for ``digits`` or a path to an ``.npz`` file."""
    if spec == "digits":
        return load_digits()
    if spec.endswith(".npz"):
        return load_npz(spec)
    raise DataError(f"unknown data {spec!r}: use 'digits' or a path to a .npz file")


def epoch_order(samples: int, seed: int, epoch: int) -> torch.Tensor:
    """Return the order (int64, shape (samples,)) in which an epoch streams the training set.

    Epoch ``e`` uses ``torch.randperm`` with a generator seeded ``seed·1000003 + e``. Every
    trainer (reference, golden, RTL via the host) uses this one function, so the same seed
    streams the same samples in the same order to every target.
    """
    gen = torch.Generator().manual_seed(seed * 1000003 + epoch)
    return torch.randperm(samples, generator=gen)
