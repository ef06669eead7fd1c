"""Linear minimization oracles (LMOs) for momentum LMO optimizers; Muon's Newton–Schulz orthogonalisation.

Paper: "General Analysis of LMO-based Optimizers: Beyond Bounded Variance" (ICML 2026), notebook
``notebooks/01-lmo-momentum-abc.ipynb``; the Newton–Schulz iteration is also POGO's Muon base (paper 19).

Muon replaces a matrix update ``G = U Σ Vᵀ`` by (approximately) its polar factor ``U Vᵀ``, the spectral-norm
LMO up to sign. It runs five steps of the quintic iteration ``X ← a X + (b A + c A²) X`` with ``A = X Xᵀ``
from ``X₀ = G/‖G‖_F``; the coefficients (a, b, c) = (3.4445, −4.7750, 2.0315) of the public Muon code are
tuned for speed, not exactness: the output's singular values land roughly in [0.5, 1.5], not at 1.
"""

from __future__ import annotations

import torch

NS5_COEFFS = (3.4445, -4.7750, 2.0315)


def newton_schulz5(G: torch.Tensor, steps: int = 5, coeffs: tuple[float, float, float] = NS5_COEFFS,
                   eps: float = 1e-7, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Approximate polar factor ``U Vᵀ`` of ``G`` (shape ``(..., m, n)``, batched) by Muon's quintic
    Newton–Schulz iteration. Works on tall and wide matrices (tall ones are transposed internally).

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
