"""pipetrain.data: the data sets pipetrain trains on (the bottom layer, beside the compiler).

scikit-learn's 8×8 digits (the embedded default) and a user's ``.npz`` file, and the sample
order every trainer streams (:func:`epoch_order`). Imports torch, numpy and scikit-learn only,
so the simulators (``pipetrain.sim``) and the host (``pipetrain.host``) share one loader
(docs/architecture.md §1).
"""

from .datasets import DataError, Dataset, epoch_order, load_data, load_digits, load_npz

__all__ = ["Dataset", "DataError", "epoch_order", "load_data", "load_digits", "load_npz"]
