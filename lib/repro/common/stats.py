"""The book's statistics: the one standard error, intervals over seeds and bootstrap intervals over items.

Every verdict of the book is decided from an interval computed here (:mod:`repro.report` calls it), and every
package that reports a spread uses these functions, so one convention holds everywhere:

* **standard error** (:func:`se`): the sample standard deviation with Bessel's correction (``ddof=1``) over
  ``sqrt(n)``. With fewer than two samples it is **NaN**, never 0: one seed says nothing about the spread.
* **interval over seeds** (:func:`over_seeds`): Student's t, two-sided, level 0.95 by default,
  ``mean ± t_{(1+level)/2, n-1} · SE``. With three seeds the half-width is 4.30 SE: few seeds give wide intervals,
  and a claim whose interval straddles its rule is *inconclusive*, not decided.
* **bootstrap** (:func:`bootstrap`, :func:`bootstrap_compare`): the percentile interval of ``n_boot`` = 2000
  resamples of the items with replacement, drawn from ``numpy.random.default_rng(seed)`` (PCG64, the same stream on
  every platform), ``seed`` = 0 unless given; the statistic is recomputed on each resample. Two samples of the same
  length are resampled *paired* (the same items for both); of different lengths, independently. A bootstrap interval
  covers the sampling of the items it resamples (test problems, trials), not the training randomness.
* **exact** (:func:`exact`): a value without sampling noise (an identity, a count, a deterministic computation),
  or a test statistic whose rule already allows for its noise (a z-score against four standard errors): its
  interval is the point itself.
* **normal interval** (:func:`normal_interval`): ``value ± z · SE`` for an estimate over many items whose standard
  error is computed directly (a stratified mean), not over seeds.

:class:`Estimate` carries a value with its interval, the number of samples and how it was obtained; the results
contract records it. Users: :mod:`repro.report` (verdicts) and every paper package that reports a spread
(``cds``, ``d3llm``, ``gdro``, ``meta_marl``, ``ptdi``, ``scale_ps``, ``semantic_entropy``, ``spreading``,
``tsmcts``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

LEVEL = 0.95
N_BOOT = 2000
BOOT_SEED = 0
METHODS = ("exact", "seeds", "bootstrap")


@dataclass(frozen=True)
class Estimate:
    """A measured value and its interval: ``method`` is ``exact`` (``lo == hi == value``), ``seeds`` (Student-t over
    per-seed values, kept in ``samples``) or ``bootstrap`` (percentile interval over ``n`` resampled items).
    ``lo``/``hi`` are NaN when the interval cannot be computed (one seed, no items)."""

    value: float
    lo: float
    hi: float
    n: int
    method: str
    level: float | None = None
    samples: tuple[float, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"Estimate.method must be one of {METHODS}, got {self.method!r}")

    @property
    def defined(self) -> bool:
        """Whether the value and both ends of the interval are numbers (not NaN)."""
        return not any(math.isnan(x) for x in (self.value, self.lo, self.hi))

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "lo": self.lo, "hi": self.hi, "n": self.n, "method": self.method,
                "level": self.level, "samples": list(self.samples)}


def as_samples(x: Any, name: str = "values") -> np.ndarray:
    """``x`` as a float array of samples along axis 0; rejects strings, bools and non-numeric input by name."""
    if isinstance(x, str | bytes | bool) or (isinstance(x, Sequence) and any(isinstance(v, str | bool) for v in x)):
        raise TypeError(f"{name}: expected numbers, got {x!r}")
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name}: expected numbers, got {type(x).__name__}") from err
    if arr.ndim == 0:
        arr = arr[None]
    return arr


def mean(x: Any, axis: int | None = None) -> Any:
    """The mean (NaN for no samples)."""
    arr = as_samples(x)
    if arr.size == 0:
        return float("nan")
    out = arr.mean(axis=axis)
    return float(out) if np.ndim(out) == 0 else out


def sd(x: Any, axis: int | None = None) -> Any:
    """The sample standard deviation with Bessel's correction; NaN with fewer than two samples."""
    arr = as_samples(x)
    n = arr.size if axis is None else arr.shape[axis]
    if n < 2:
        shape = () if axis is None else np.delete(np.array(arr.shape), axis)
        out = np.full(shape, np.nan)
    else:
        out = arr.std(axis=axis, ddof=1)
    return float(out) if np.ndim(out) == 0 else out


def se(x: Any, axis: int | None = None) -> Any:
    """The standard error of the mean, ``sd / sqrt(n)`` (the book's one convention); NaN with fewer than two."""
    arr = as_samples(x)
    n = arr.size if axis is None else arr.shape[axis]
    out = np.asarray(sd(arr, axis=axis)) / math.sqrt(max(n, 1))
    return float(out) if np.ndim(out) == 0 else out


def proportion_se(p: float, n: int) -> float:
    """The standard error of a frequency ``p`` over ``n`` independent trials, ``sqrt(p (1 - p) / n)``."""
    if n < 1:
        return float("nan")
    return math.sqrt(p * (1 - p) / n)


def stratified_se(strata: Sequence[Any], weights: Sequence[float]) -> float:
    """The standard error of the weighted mean ``sum_k w_k mean(stratum_k)`` of independent strata,
    ``sqrt(sum_k w_k^2 se_k^2)``; NaN if a stratum has fewer than two samples."""
    if len(strata) != len(weights):
        raise ValueError("stratified_se: one weight per stratum")
    total = 0.0
    for w, s in zip(weights, strata, strict=True):
        arr = as_samples(s, "stratum").reshape(-1)
        total += w**2 * (arr.var(ddof=1) / len(arr) if arr.size > 1 else float("nan"))
    return math.sqrt(total)


def t_quantile(n: int, level: float = LEVEL) -> float:
    """Student's t quantile ``t_{(1+level)/2, n-1}`` (NaN for n < 2)."""
    _check_level(level)
    from scipy import stats as scipy_stats  # imported on first use: repro.common.stats stays light to import

    return float(scipy_stats.t.ppf((1 + level) / 2, n - 1)) if n >= 2 else float("nan")


def z_quantile(level: float = LEVEL) -> float:
    """The standard normal quantile ``z_{(1+level)/2}`` (1.95996... for 0.95)."""
    _check_level(level)
    from scipy import stats as scipy_stats

    return float(scipy_stats.norm.ppf((1 + level) / 2))


def normal_interval(value: float, se_value: float, level: float = LEVEL) -> tuple[float, float]:
    """``value ± z · se``: the interval of an estimate whose standard error is known (e.g. a stratified mean over
    many items), where a t interval over seeds does not apply."""
    half = z_quantile(level) * se_value
    return value - half, value + half


def exact(value: float) -> Estimate:
    """A value without sampling noise; its interval is the point."""
    arr = as_samples(value, "exact value").reshape(-1)
    if arr.size != 1:
        raise TypeError(f"exact value: expected one number, got {arr.size} values")
    v = float(arr[0])
    return Estimate(v, v, v, 1, "exact")


def over_seeds(values: Any, level: float = LEVEL) -> Estimate:
    """The mean over seeds with its Student-t interval; the per-seed values are kept."""
    arr = as_samples(values, "per-seed values").reshape(-1)
    m = mean(arr)
    half = t_quantile(arr.size, level) * se(arr)
    return Estimate(m, m - half, m + half, int(arr.size), "seeds", level, tuple(float(v) for v in arr))


def paired_differences(a: Any, b: Any, name: str = "values") -> np.ndarray:
    """``a - b`` sample by sample (seeds or items shared by both); the lengths must match."""
    a, b = as_samples(a, name), as_samples(b, f"{name} (control)")
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"{name}: {a.shape[0]} samples against the control's {b.shape[0]}; pairing needs equal counts")
    return a - b


def resample_indices(n: int, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> np.ndarray:
    """``n_boot`` × ``n`` item indices drawn with replacement (the bootstrap's resamples)."""
    if n < 1 or n_boot < 1:
        raise ValueError("need n >= 1 items and n_boot >= 1")
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def resample_counts(n: int, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> np.ndarray:
    """The same resampling as counts: ``n_boot`` × ``n`` multinomial draws (how often each item is drawn), for
    statistics computed as weighted sums."""
    if n < 1 or n_boot < 1:
        raise ValueError("need n >= 1 items and n_boot >= 1")
    return np.random.default_rng(seed).multinomial(n, np.full(n, 1.0 / n), size=n_boot)


def percentile_interval(replicates: Any, level: float = LEVEL) -> tuple[float, float]:
    """The ``level`` percentile interval of bootstrap replicates (NaN if any replicate is NaN)."""
    _check_level(level)
    arr = as_samples(replicates, "bootstrap replicates").reshape(-1)
    if arr.size == 0 or np.isnan(arr).any():
        return float("nan"), float("nan")
    lo, hi = np.quantile(arr, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def from_replicates(value: float, replicates: Any, n: int, level: float = LEVEL) -> Estimate:
    """A bootstrap :class:`Estimate`: ``value`` on the original items and the ``level`` percentile interval of
    its ``replicates`` (one per resample of the ``n`` items), for statistics resampled outside :func:`bootstrap`
    (e.g. through :func:`resample_counts`)."""
    lo, hi = percentile_interval(replicates, level)
    return Estimate(float(value), lo, hi, n, "bootstrap", level)


Statistic = Callable[..., float]


def bootstrap(data: Any, statistic: Statistic | None = None, *, n_boot: int = N_BOOT, level: float = LEVEL,
              seed: int = BOOT_SEED) -> Estimate:
    """``statistic`` of the items and its percentile bootstrap interval.

    ``data`` is an array of items along axis 0, or a tuple of such arrays of one length, resampled jointly (for
    a statistic of paired columns). ``statistic(*arrays) -> float`` defaults to the mean of a single array."""
    arrays = _items(data)
    stat = statistic or _mean_of_one
    value = float(stat(*arrays))
    n = arrays[0].shape[0]
    if n < 2:
        return Estimate(value, float("nan"), float("nan"), n, "bootstrap", level)
    idx = resample_indices(n, n_boot, seed)
    if statistic is None:  # the mean, vectorised
        reps = arrays[0][idx].mean(1)
    else:
        reps = np.array([stat(*(a[i] for a in arrays)) for i in idx], dtype=float)
    lo, hi = percentile_interval(reps, level)
    return Estimate(value, lo, hi, n, "bootstrap", level)


def bootstrap_compare(data: Any, control: Any, statistic: Statistic | None = None, *, compare: str = "difference",
                      n_boot: int = N_BOOT, level: float = LEVEL, seed: int = BOOT_SEED) -> Estimate:
    """``statistic(data) - statistic(control)`` (``compare="difference"``) or their ratio, with its percentile
    bootstrap interval: paired resamples when both have the same number of items, independent otherwise."""
    if compare not in ("difference", "ratio"):
        raise ValueError(f"compare must be 'difference' or 'ratio', got {compare!r}")
    a, b = _items(data), _items(control)
    stat = statistic or _mean_of_one
    combine = np.subtract if compare == "difference" else np.divide

    def both(ia: Any, ib: Any) -> float:
        return float(combine(stat(*(x[ia] for x in a)), stat(*(x[ib] for x in b))))

    na, nb = a[0].shape[0], b[0].shape[0]
    value = both(slice(None), slice(None))
    if min(na, nb) < 2:
        return Estimate(value, float("nan"), float("nan"), min(na, nb), "bootstrap", level)
    ia = resample_indices(na, n_boot, seed)
    ib = ia if na == nb else np.random.default_rng([seed, 1]).integers(0, nb, size=(n_boot, nb))
    with np.errstate(divide="ignore", invalid="ignore"):
        reps = np.array([both(i, j) for i, j in zip(ia, ib, strict=True)], dtype=float)
    lo, hi = percentile_interval(reps, level)
    return Estimate(value, lo, hi, min(na, nb), "bootstrap", level)


def _items(data: Any) -> tuple[np.ndarray, ...]:
    arrays = tuple(as_samples(d, "bootstrap items") for d in (data if isinstance(data, tuple) else (data,)))
    if len({a.shape[0] for a in arrays}) != 1:
        raise ValueError("bootstrap: the arrays of one sample must have the same number of items")
    return arrays


def _mean_of_one(*arrays: np.ndarray) -> float:
    if len(arrays) != 1 or arrays[0].ndim != 1:
        raise ValueError("bootstrap: the default statistic (the mean) takes one 1-D array; give a statistic")
    return float(arrays[0].mean())


def _check_level(level: float) -> None:
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
