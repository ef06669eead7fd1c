"""Two-sample metrics used to compare posterior samples: C2ST (the sbibm protocol) and MMD.

Paper: Sun, Nicholls, Lee, ICML 2026 (arXiv 2601.22367), "standard two-sample metrics"; the C2ST protocol is
sbibm's (Lueckmann et al. 2021; Lopez-Paz & Oquab 2017). Notebook: ``notebooks/17-amortized-gbi.ipynb``.

* :func:`c2st`: z-score both samples with the first sample's mean and std, train an MLP classifier (ReLU,
  two hidden layers of 10·d units, Adam) to tell them apart, report the mean 5-fold cross-validated accuracy.
  0.5: indistinguishable; 1: disjoint. :func:`c2st_outcomes` keeps which points it classified right (per draw
  pair), for a bootstrap interval over the draws. One deviation from sbibm, for speed: ``early_stopping=True`` (10 % of
  each training fold held out, stop after 10 epochs without improvement) instead of up to 10 000 epochs.
* :func:`mmd2`: the unbiased squared maximum mean discrepancy with a Gaussian kernel, on the same z-scored
  coordinates, bandwidth by the median heuristic on the pooled sample.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["c2st", "c2st_outcomes", "c2st_score", "mmd2"]

Tensor = torch.Tensor


def _pair(a, b) -> tuple[Tensor, Tensor]:
    a = torch.as_tensor(a).double().cpu()
    b = torch.as_tensor(b).double().cpu()
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"need two (n, d) samples of the same d, got {tuple(a.shape)} and {tuple(b.shape)}")
    if min(len(a), len(b)) < 10:
        raise ValueError("need at least 10 points per sample")
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        raise ValueError("samples must be finite")
    loc, scale = a.mean(0), a.std(0).clamp(min=1e-12)
    return (a - loc) / scale, (b - loc) / scale


def c2st_outcomes(a, b, *, folds: int = 5, seed: int = 1, early_stopping: bool = True) -> np.ndarray:
    """Which points the C2ST classifier (see :func:`c2st`) got right when it was tested on them: ``1.0`` / ``0.0``
    per point, out of fold, as an ``(n, 2)`` array when ``len(a) == len(b) == n`` (row i: ``a[i]`` and ``b[i]``, a
    *draw pair*: the item a bootstrap over the draws resamples), else the ``len(a) + len(b)`` points in order.
    The folds, classifiers and predictions are those of :func:`c2st`; when the folds have equal sizes (the number
    of points a multiple of ``folds``), the mean of the outcomes is its accuracy."""
    from sklearn.base import clone
    from sklearn.model_selection import KFold
    from sklearn.neural_network import MLPClassifier
    from threadpoolctl import threadpool_limits

    za, zb = _pair(a, b)
    d = za.shape[1]
    clf = MLPClassifier(activation="relu", hidden_layer_sizes=(10 * d, 10 * d), max_iter=10_000, solver="adam",
                        random_state=seed, early_stopping=early_stopping)
    data = torch.cat([za, zb]).numpy()
    target = np.concatenate([np.zeros(len(za)), np.ones(len(zb))])
    cv = KFold(n_splits=folds, shuffle=True, random_state=seed)
    right = np.empty(len(target))
    with threadpool_limits(limits=1):
        for train, test in cv.split(data, target):
            fitted = clone(clf).fit(data[train], target[train])
            right[test] = (fitted.predict(data[test]) == target[test]).astype(float)
    return np.stack([right[:len(za)], right[len(za):]], axis=1) if len(za) == len(zb) else right


def c2st(a, b, *, folds: int = 5, seed: int = 1, early_stopping: bool = True) -> float:
    """Classifier two-sample test accuracy (sbibm protocol, see module docstring): the mean over the folds of
    each fold's accuracy (:func:`c2st_outcomes` gives the per-point outcomes behind it). The classifier runs with
    one BLAS thread, so that the score does not depend on the machine's thread count."""
    return c2st_score(c2st_outcomes(a, b, folds=folds, seed=seed, early_stopping=early_stopping), folds=folds,
                      seed=seed)


def c2st_score(outcomes: np.ndarray, *, folds: int = 5, seed: int = 1) -> float:
    """The C2ST accuracy of :func:`c2st_outcomes`' ``outcomes``: the mean over the same ``folds`` of each fold's
    mean outcome (as ``sklearn.model_selection.cross_val_score`` averages)."""
    from sklearn.model_selection import KFold

    right = outcomes.T.reshape(-1) if outcomes.ndim == 2 else outcomes
    cv = KFold(n_splits=folds, shuffle=True, random_state=seed)
    return float(np.mean([right[test].mean() for _, test in cv.split(right)]))


def mmd2(a, b, *, bandwidth: float | None = None, max_median: int = 500) -> float:
    """Unbiased MMD² with k(u, v) = exp(−‖u − v‖² / (2 h²)); h = median pairwise distance of (up to
    ``max_median`` points of each of) the pooled z-scored samples unless ``bandwidth`` is given."""
    za, zb = _pair(a, b)
    if bandwidth is None:
        pooled = torch.cat([za[:max_median], zb[:max_median]])
        dist = torch.cdist(pooled, pooled)
        h = float(dist[torch.triu_indices(len(pooled), len(pooled), 1).unbind()].median())
    else:
        h = float(bandwidth)
    if not h > 0:
        raise ValueError("bandwidth must be > 0")

    def mean_k(u: Tensor, v: Tensor, same: bool) -> float:
        k = torch.exp(-torch.cdist(u, v) ** 2 / (2 * h * h))
        if same:
            n = len(u)
            return float((k.sum() - k.diagonal().sum()) / (n * (n - 1)))
        return float(k.mean())

    return mean_k(za, za, True) + mean_k(zb, zb, True) - 2 * mean_k(za, zb, False)
