"""The plan's multipliers of a convolution stage's pooling: the AvgPool scale products counted
exactly when the golden model multiplies there (a window that is not a power of two,
docs/numerics.md §9.3; compiler/build.py:pool_multipliers), with the hard-multiplier estimate."""

from __future__ import annotations

import pytest
from pipetrain.compiler.build import build_plan, hard_multipliers, multiplier_operands
from pipetrain.compiler.config import TrainConfig
from pipetrain.compiler.frontend import trace
from torch import nn


@pytest.mark.parametrize(("window", "extra"), [(2, 0), (4, 0), (3, 2)])
def test_avgpool_scale_products_are_counted(window, extra):
    """AvgPool over 3 values multiplies by round(2^16/3) = 21845 (8 signed digits: a real
    multiplier) on the window sum and on the error: 2 more per lane; over 2 or 4 values the
    mean is a shift (scale 1): none. The hard-multiplier estimate grows with them."""
    m = nn.Sequential(
        nn.Conv1d(1, 4, 3, padding=1), nn.ReLU(), nn.AvgPool1d(window), nn.Flatten(),
        nn.Linear(4 * (12 // window), 2),
    )  # fmt: skip
    m.input_shape = (1, 12)
    plan = build_plan(trace(m, "avg"), TrainConfig(), lanes=(2, 1))
    st = plan.stages[0]
    g = st.conv
    assert g.pool == "avg" and (g.pool_scale == 1) == (extra == 0)
    mx = nn.Sequential(
        nn.Conv1d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool1d(window), nn.Flatten(),
        nn.Linear(4 * (12 // window), 2),
    )  # fmt: skip
    mx.input_shape = (1, 12)
    base = build_plan(trace(mx, "max"), TrainConfig(), lanes=(2, 1)).stages[0]
    assert st.multipliers == base.multipliers + st.lanes * extra
    scale_ops = len(multiplier_operands(st)) - len(multiplier_operands(base))
    assert scale_ops == extra
    assert (hard_multipliers(st) > hard_multipliers(base)) == (extra > 0)
