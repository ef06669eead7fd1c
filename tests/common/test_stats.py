"""repro.common.stats against scipy's references, exact cases and coverage over simulated data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from repro.common import stats


def test_standard_error_is_scipys_sem_and_nan_for_one_sample():
    x = np.random.default_rng(0).normal(size=17)
    assert stats.se(x) == pytest.approx(scipy_stats.sem(x), rel=1e-12)
    assert stats.sd(x) == pytest.approx(np.std(x, ddof=1), rel=1e-12)
    assert math.isnan(stats.se([3.0])) and math.isnan(stats.sd([3.0])) and math.isnan(stats.mean([]))
    m = np.random.default_rng(1).normal(size=(4, 9))
    np.testing.assert_allclose(stats.se(m, axis=1), scipy_stats.sem(m, axis=1), rtol=1e-12)
    assert np.isnan(stats.se(m[:, :1], axis=1)).all()


def test_interval_over_seeds_is_scipys_t_interval():
    x = [2.0, 3.5, 1.0, 4.0]
    est = stats.over_seeds(x)
    lo, hi = scipy_stats.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=scipy_stats.sem(x))
    assert (est.lo, est.hi) == (pytest.approx(lo, rel=1e-12), pytest.approx(hi, rel=1e-12))
    assert est.samples == tuple(x) and est.n == 4 and est.method == "seeds"
    one = stats.over_seeds([1.5])
    assert one.value == 1.5 and math.isnan(one.lo) and not one.defined


def test_t_interval_covers_the_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(2)
    hits = 0
    for _ in range(2000):
        e = stats.over_seeds(rng.normal(1.0, 2.0, size=3))
        hits += e.lo <= 1.0 <= e.hi
    assert 0.93 <= hits / 2000 <= 0.97  # binomial SE 0.005 around 0.95


def test_bootstrap_matches_scipys_percentile_bootstrap():
    x = np.random.default_rng(3).exponential(size=200)
    ours = stats.bootstrap(x)
    ref = scipy_stats.bootstrap((x,), np.mean, method="percentile", n_resamples=20000,
                                random_state=np.random.default_rng(4)).confidence_interval
    assert ours.value == pytest.approx(x.mean())
    assert ours.lo == pytest.approx(ref.low, abs=0.02) and ours.hi == pytest.approx(ref.high, abs=0.02)
    again = stats.bootstrap(x)
    assert (again.lo, again.hi) == (ours.lo, ours.hi)  # the same items give the same interval
    const = stats.bootstrap(np.full(10, 2.5))
    assert (const.lo, const.hi) == (2.5, 2.5)


def test_bootstrap_with_a_statistic_and_paired_comparison():
    rng = np.random.default_rng(5)
    a = rng.normal(size=50)
    b = a + rng.normal(0.5, 0.1, size=50)
    paired = stats.bootstrap_compare(b, a)
    direct = stats.bootstrap(b - a)
    assert (paired.lo, paired.hi) == pytest.approx((direct.lo, direct.hi), rel=1e-12)  # same resamples
    assert paired.value == pytest.approx(0.5, abs=0.05) and paired.lo > 0.4
    med = stats.bootstrap((a, b), lambda u, v: float(np.median(v - u)))
    assert med.lo <= med.value <= med.hi
    ratio = stats.bootstrap_compare(np.full(5, 2.0), np.full(5, 4.0), compare="ratio")
    assert (ratio.value, ratio.lo, ratio.hi) == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match="statistic"):
        stats.bootstrap((a, b))
    with pytest.raises(ValueError, match="same number of items"):
        stats.bootstrap((a, b[:3]), lambda u, v: 0.0)


def test_resampling_helpers_and_bad_input():
    idx = stats.resample_indices(5, 3, seed=0)
    assert idx.shape == (3, 5) and idx.min() >= 0 and idx.max() < 5
    counts = stats.resample_counts(7, 4, seed=1)
    assert counts.shape == (4, 7) and (counts.sum(1) == 7).all()
    assert stats.percentile_interval([1.0, float("nan")]) != stats.percentile_interval([1.0, 2.0])
    assert math.isnan(stats.percentile_interval([1.0, float("nan")])[0])
    with pytest.raises(TypeError, match="expected numbers"):
        stats.over_seeds(["1", "2"])
    with pytest.raises(TypeError, match="expected numbers"):
        stats.exact(True)
    with pytest.raises(TypeError, match="one number"):
        stats.exact([1.0, 2.0])
    with pytest.raises(ValueError, match="level"):
        stats.over_seeds([1.0, 2.0], level=1.5)


def test_proportion_stratified_and_normal_interval():
    assert stats.proportion_se(0.5, 100) == pytest.approx(0.05)
    strata = [np.array([1.0, 2.0, 3.0]), np.array([0.0, 4.0])]
    w = [0.25, 0.75]
    expect = math.sqrt(0.25**2 * np.var(strata[0], ddof=1) / 3 + 0.75**2 * np.var(strata[1], ddof=1) / 2)
    assert stats.stratified_se(strata, w) == pytest.approx(expect, rel=1e-12)
    lo, hi = stats.normal_interval(1.0, 0.5)
    assert (lo, hi) == pytest.approx((1.0 - 1.959964 * 0.5, 1.0 + 1.959964 * 0.5), rel=1e-6)
