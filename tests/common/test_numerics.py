"""repro.common.numerics (users: papers 01, 03, 05 and 19)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from repro.common.numerics import loglog_slope, wide_float


def test_loglog_slope_recovers_a_power_law_and_rejects_bad_input():
    x = np.array([1.0, 2, 4, 8, 16])
    assert math.isclose(loglog_slope(x, 3 * x**-0.5), -0.5)
    assert math.isclose(loglog_slope([1, 2, 4, 8], [3, 6, 12, 24]), 1.0)
    with pytest.raises(ValueError, match="positive"):
        loglog_slope([1, 2], [1, -1])
    with pytest.raises(ValueError, match="two or more"):
        loglog_slope([1], [1])


def test_wide_float_is_float64_except_on_mps():
    assert wide_float("cpu") is torch.float64
    assert wide_float(torch.device("cuda", 0)) is torch.float64  # a name only: no GPU is needed
    assert wide_float("meta") is torch.float64
    assert wide_float("mps") is torch.float32
    assert wide_float(torch.device("mps")) is torch.float32
