"""Dataset loading: the digits default, a user's .npz, and clear errors for bad files."""

import numpy as np
import pytest
import torch
from pipetrain.data import DataError, epoch_order, load_digits, load_npz


def test_digits_split_and_scaling():
    d = load_digits()
    assert (len(d.x_train), len(d.x_test), d.features, d.classes) == (1437, 360, 64, 10)
    assert float(d.x_train.min()) == 0.0 and float(d.x_train.max()) == 1.0  # pixels 0..16 / 16
    assert torch.bincount(d.y_test).tolist() == [36, 36, 35, 37, 36, 37, 36, 36, 35, 36]


def test_a_text_file_named_npz_is_a_clear_error(tmp_path):
    junk = tmp_path / "junk.npz"
    junk.write_text("not numpy at all\n")
    with pytest.raises(DataError, match="not a readable .npz file.*numpy.savez") as e:
        load_npz(junk)
    assert "pickle" not in str(e.value)  # numpy's allow_pickle advice misleads here


def test_a_single_npy_array_is_a_clear_error(tmp_path):
    path = tmp_path / "one.npz"
    with open(path, "wb") as f:
        np.save(f, np.zeros((3, 4)))
    with pytest.raises(DataError, match="single array"):
        load_npz(path)


@pytest.mark.parametrize(
    "arrays,message",
    [
        ({"X_train": 1}, "lacks array"),
        (
            {"x_train": np.zeros((4, 3, 1, 1, 1))},
            r"must be \(samples, features\), \(samples, C, L\)",
        ),
        (
            {"x_train": np.zeros((4, 3, 1))},
            r"x_train has samples of shape \(3, 1\) but x_test \(3,\)",
        ),
        ({"y_train": np.zeros(4)}, "integer class labels"),
        ({"y_train": np.zeros(5, dtype=np.int64)}, "4 samples but y_train has 5"),
        ({"x_test": np.zeros((2, 5), dtype=np.float32)}, "3 features but x_test has 5"),
        ({"x_train": np.full((4, 3), np.nan, dtype=np.float32)}, "NaN"),
    ],
)
def test_bad_npz_names_the_fault(tmp_path, arrays, message):
    good = {
        "x_train": np.zeros((4, 3), dtype=np.float32),
        "y_train": np.zeros(4, dtype=np.int64),
        "x_test": np.zeros((2, 3), dtype=np.float32),
        "y_test": np.zeros(2, dtype=np.int64),
    }
    if "X_train" in arrays:
        good["X_train"] = good.pop("x_train")
    else:
        good.update(arrays)
    path = tmp_path / "d.npz"
    np.savez(path, **good)
    with pytest.raises(DataError, match=message):
        load_npz(path)


def test_epoch_order_is_a_seeded_permutation():
    a, b = epoch_order(100, seed=3, epoch=1), epoch_order(100, seed=3, epoch=1)
    assert torch.equal(a, b) and sorted(a.tolist()) == list(range(100))
    assert not torch.equal(a, epoch_order(100, seed=3, epoch=2))
    assert not torch.equal(a, epoch_order(100, seed=4, epoch=1))
