"""Rate/distortion measures of repro.papers.pace (paper 09) on hand-made examples."""

from __future__ import annotations

import numpy as np
import pytest

from repro.papers.pace import metrics as X


def test_d1_on_a_three_point_example():
    a = np.array([[0.0, 0, 0], [1, 0, 0], [0, 2, 0]])
    b = np.array([[0.0, 0, 0.5], [1, 0, 0], [0, 2, 0], [5, 0, 0]])
    ab, ba = X.d1_mse(a, b)
    assert ab == pytest.approx(0.25 / 3)  # only (0,0,0) moved, by 0.5
    assert ba == pytest.approx((0.25 + 0 + 0 + 16) / 4)  # (5,0,0) is 4 away from (1,0,0)
    assert X.d1_psnr(a, b, peak=10) == pytest.approx(10 * np.log10(3 * 100 / ba))
    assert X.d1_psnr(a, b, peak=10) == X.d1_psnr(b, a, peak=10)  # symmetric
    assert X.d1_psnr(a, a) == float("inf")


def test_bits_per_point_and_errors():
    assert X.bits_per_point(125, 1000) == 1.0
    with pytest.raises(ValueError):
        X.bits_per_point(10, 0)
    with pytest.raises(ValueError):
        X.d1_psnr(np.zeros((0, 3)), np.zeros((2, 3)))
    with pytest.raises(ValueError):
        X.d1_psnr(np.zeros((2, 3)), np.zeros((2, 3)) + np.nan)


def test_bd_rate():
    rate = np.array([0.5, 1.0, 2.0, 4.0])
    psnr = np.array([60.0, 66, 72, 78])
    assert X.bd_rate(rate, psnr, rate, psnr) == pytest.approx(0.0, abs=1e-9)
    assert X.bd_rate(rate, psnr, 0.9 * rate, psnr) == pytest.approx(-10.0, abs=1e-6)
    assert X.bd_rate(rate, psnr, 1.2 * rate, psnr) == pytest.approx(20.0, abs=1e-6)
    with pytest.raises(ValueError):
        X.bd_rate(rate[:3], psnr[:3], rate[:3], psnr[:3])
    with pytest.raises(ValueError):
        X.bd_rate(-rate, psnr, rate, psnr)
