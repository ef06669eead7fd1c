"""Rate and distortion measures of point cloud compression, as used by PACE and the MPEG test conditions.

Paper 09 (PACE, Zhu et al., ICML 2026), Sec. 5 (evaluation). Notebook: ``notebooks/09-pace-lidar.ipynb``.

* Rate: bits per **input** point (bpp), the stream's size over the number of raw points (not the quantised ones).
* D1 (point-to-point) PSNR, MPEG ``pc_error`` convention: one-sided ``MSE(A→B)`` = mean over points of ``A`` of the
  squared distance to the nearest point of ``B`` (sum over the three coordinates); the symmetric MSE is the larger
  of the two directions; ``PSNR = 10·log10(3·r² / MSE)`` with the peak ``r`` (``--resolution``; 59.70 for KITTI).
  The factor 3 is ``pc_error``'s (a peak per coordinate); it shifts every curve equally and never changes BD-rates.
* BD-rate (Bjøntegaard delta rate, percent; negative = saving) through the ``bjontegaard`` package.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree

__all__ = ["bd_rate", "bits_per_point", "d1_mse", "d1_psnr"]

KITTI_PEAK = 59.70


def bits_per_point(n_bytes: int, n_points: int) -> float:
    """Bits per input point of a stream of ``n_bytes`` bytes."""
    if n_points <= 0:
        raise ValueError("n_points must be positive")
    return 8.0 * n_bytes / n_points


def _cloud(x: np.ndarray, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] != 3 or len(a) == 0:
        raise ValueError(f"{name} must be a non-empty (N, 3) array, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} contains NaN or inf")
    return a


def d1_mse(reference: np.ndarray, test: np.ndarray) -> tuple[float, float]:
    """One-sided point-to-point MSEs ``(reference→test, test→reference)``."""
    a, b = _cloud(reference, "reference"), _cloud(test, "test")
    d_ab, _ = cKDTree(b).query(a, k=1)
    d_ba, _ = cKDTree(a).query(b, k=1)
    return float(np.mean(d_ab**2)), float(np.mean(d_ba**2))


def d1_psnr(reference: np.ndarray, test: np.ndarray, peak: float = KITTI_PEAK) -> float:
    """Symmetric D1 PSNR in dB: ``10·log10(3·peak² / max(MSE_ab, MSE_ba))`` (``inf`` for identical clouds)."""
    if not peak > 0:
        raise ValueError("peak must be positive")
    mse = max(d1_mse(reference, test))
    return float("inf") if mse == 0 else float(10 * np.log10(3 * peak**2 / mse))


def bd_rate(rate_anchor: np.ndarray, psnr_anchor: np.ndarray, rate_test: np.ndarray, psnr_test: np.ndarray,
            method: str = "pchip") -> float:
    """Bjøntegaard-delta rate of ``test`` against ``anchor`` in percent (negative: ``test`` needs fewer bits at
    equal PSNR), by ``bjontegaard.bd_rate`` (piecewise cubic interpolation; at least 4 points per curve)."""
    import bjontegaard

    arrays = [np.asarray(v, dtype=np.float64) for v in (rate_anchor, psnr_anchor, rate_test, psnr_test)]
    if any(a.ndim != 1 or len(a) < 4 for a in arrays) or len(arrays[0]) != len(arrays[1]) \
            or len(arrays[2]) != len(arrays[3]):
        raise ValueError("need matching 1-D rate/PSNR arrays of at least 4 points per curve")
    if (arrays[0] <= 0).any() or (arrays[2] <= 0).any() or not all(np.isfinite(a).all() for a in arrays):
        raise ValueError("rates must be positive and all values finite")
    return float(bjontegaard.bd_rate(*arrays, method=method, require_matching_points=False))
