"""repro.common.numerics (users: papers 01 and 05)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from repro.common.numerics import loglog_slope


def test_loglog_slope_recovers_a_power_law_and_rejects_bad_input():
    x = np.array([1.0, 2, 4, 8, 16])
    assert math.isclose(loglog_slope(x, 3 * x**-0.5), -0.5)
    assert math.isclose(loglog_slope([1, 2, 4, 8], [3, 6, 12, 24]), 1.0)
    with pytest.raises(ValueError, match="positive"):
        loglog_slope([1, 2], [1, -1])
    with pytest.raises(ValueError, match="two or more"):
        loglog_slope([1], [1])
