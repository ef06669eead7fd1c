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
    output's singular values are not all 1 (an inexact polar factor). The iteration acts on each singular value σ
    of ``G`` separately, mapping ``x = σ/‖G‖_F`` five times through ``p(x) = a x + b x³ + c x⁵``. The result never
    exceeds 1.21, at any input; it lies in [0.68, 1.21] for σ/‖G‖_F ≥ 1.6e-3; below that it is about
    ``a⁵ x ≈ 487 x`` (0.47 at ``x = 1e-3``), short of the band. Tall and wide matrices rarely have such small
    singular values (a 64×32 Gaussian stays in the band), square ones do: the smallest output singular value of a
    256×256 Gaussian matrix ranged over 0.004–0.22 in ten draws (typically ~0.07). Muon's own docstring quotes
    ``Uniform(0.5, 1.5)``: the real top is 1.21, and square matrices go below 0.5.

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
