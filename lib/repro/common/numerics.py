"""Small numerical helpers shared by several papers.

Users: :func:`loglog_slope`: ``repro.papers.contracts`` (paper 05, rate exponents) and ``repro.papers.lmo``
(paper 01, the batch-size scaling of the best momentum); :func:`wide_float`: ``repro.papers.d3llm`` (paper 03,
probabilities in float64 as the public code computes them) and ``repro.papers.pogo`` (paper 19, the roots of the
adaptive λ's quartic).
"""

from __future__ import annotations

import numpy as np
import torch


def loglog_slope(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of ``log y`` on ``log x`` (a rate or scaling exponent)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.size < 2 or (x <= 0).any() or (y <= 0).any():
        raise ValueError("need two or more positive (x, y) pairs of equal shape")
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def wide_float(device: torch.device | str) -> torch.dtype:
    """The widest float dtype ``device`` computes in: ``torch.float64``, but ``torch.float32`` on Apple MPS, which
    has no float64. Used by ``repro.papers.d3llm`` and ``repro.papers.pogo``."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64
