"""Matrix functions shared by the optimizer papers: Muon's Newton–Schulz iteration and the exact polar factor.

Users: ``repro.papers.lmo`` (paper 01: the spectral LMO, exact and Muon's approximation) and
``repro.papers.pogo`` (paper 19: the Muon base optimizer and the SVD-projection baseline).
"""

from __future__ import annotations

import torch

NS5_COEFFS = (3.4445, -4.7750, 2.0315)


def newton_schulz5(G: torch.Tensor, steps: int = 5, coeffs: tuple[float, float, float] = NS5_COEFFS,
                   eps: float = 1e-7, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Approximate polar factor ``U Vᵀ`` of ``G`` (shape ``(..., m, n)``, batched) by Muon's quintic
    Newton–Schulz iteration ``X ← a X + (b A + c A²) X``, ``A = X Xᵀ``, from ``X₀ = G/‖G‖_F``. Works on tall
    and wide matrices (tall ones are transposed internally).

    The public coefficients (a, b, c) = (3.4445, −4.7750, 2.0315) are tuned for speed, not exactness: the
    output's singular values are not all 1 (an inexact polar factor).

    ``dtype`` is the working precision (e.g. ``torch.bfloat16`` on CUDA, as Muon does); the result is returned
    in ``G``'s dtype.
    """
    if G.ndim < 2:
        raise ValueError(f"newton_schulz5 needs a matrix (or a batch of them), got shape {tuple(G.shape)}")
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    a, b, c = coeffs
    X = G.to(dtype or G.dtype)
    tall = X.shape[-2] > X.shape[-1]
    if tall:
        X = X.mT
    X = X / (torch.linalg.matrix_norm(X, keepdim=True) + eps)
    for _ in range(steps):
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    if tall:
        X = X.mT
    return X.to(G.dtype)


def polar(X: torch.Tensor) -> torch.Tensor:
    """The exact orthonormal polar factor ``U Vᵀ`` of each matrix (``X = U S Vᵀ``, thin SVD; batched over the
    leading dims): the closest matrix with orthonormal rows/columns in Frobenius norm."""
    if X.ndim < 2:
        raise ValueError(f"polar needs a matrix (or a batch of them), got shape {tuple(X.shape)}")
    U, _, Vh = torch.linalg.svd(X, full_matrices=False)
    return U @ Vh
