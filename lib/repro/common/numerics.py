"""Small numerical helpers shared by several papers.

Users: :func:`loglog_slope`: ``repro.papers.contracts`` (paper 05, rate exponents) and ``repro.papers.lmo``
(paper 01, the batch-size scaling of the best momentum).
"""

from __future__ import annotations

import numpy as np


def loglog_slope(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of ``log y`` on ``log x`` (a rate or scaling exponent)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.size < 2 or (x <= 0).any() or (y <= 0).any():
        raise ValueError("need two or more positive (x, y) pairs of equal shape")
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])
