"""Test problems of paper 01: finite-sum least squares (a vector for normalized SGD and sign descent, a matrix for
Muon), with exact optimum, smoothness constants and τ-nice ABC constants. Generated from a seed; no data files.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .method import ABC, Tensor, tau_nice_abc
from .theory import ProxyConstants

__all__ = ["LeastSquares", "linear_regression", "matrix_regression"]


@dataclass
class LeastSquares:
    """``f(x) = (1/2n) Σ_i (⟨a_i, x⟩ − b_i)²`` with ``x`` of ``shape`` (a vector, or a matrix for Muon).

    ``a`` has shape ``(n, numel)`` (rows flattened); ``x_star``, ``f_star``, ``H = aᵀa/n`` are exact (computed in
    float64 on the CPU, so this also works on devices without float64), as are the smoothness constants ``L``
    (``λ_max(H)``) and ``row_L`` (``L_i = ‖a_i‖²``).
    """

    a: Tensor
    b: Tensor
    shape: tuple[int, ...]
    x_star: Tensor
    f_star: float
    H: Tensor
    L: float
    row_L: np.ndarray

    @classmethod
    def from_data(cls, a: Tensor, b: Tensor, shape: Sequence[int]) -> LeastSquares:
        if a.ndim != 2 or b.shape != (a.shape[0],) or math.prod(shape) != a.shape[1]:
            raise ValueError(f"need a (n, d), b (n,), prod(shape) = d; got {tuple(a.shape)}, {tuple(b.shape)}, "
                             f"{tuple(shape)}")
        a64, b64 = a.detach().cpu().double(), b.detach().cpu().double()
        x_star = torch.linalg.lstsq(a64, b64[:, None]).solution[:, 0]
        f_star = float(0.5 * (a64 @ x_star - b64).square().mean())
        H = (a64.mT @ a64) / a.shape[0]
        return cls(a=a, b=b, shape=tuple(shape), x_star=x_star.to(a.device, a.dtype), f_star=f_star,
                   H=H.to(a.device, a.dtype), L=float(torch.linalg.eigvalsh(H)[-1]),
                   row_L=a64.square().sum(1).numpy())

    @property
    def n(self) -> int:
        return self.a.shape[0]

    def excess(self, x: Tensor) -> Tensor:
        """``f(x) − f*`` for ``x`` of shape ``(..., *shape)``, computed as ``½ eᵀ H e`` (no cancellation)."""
        e = (x.reshape(*x.shape[: x.ndim - len(self.shape)], -1) - self.x_star)
        return 0.5 * ((e @ self.H) * e).sum(-1)

    def grad(self, x: Tensor, idx: Tensor | None = None) -> Tensor:
        """Mean gradient over rows ``idx`` (shape ``(S, τ)``) at ``x`` of shape ``(S, C, *shape)`` (C configs per
        index set); full gradient if ``idx`` is None, as ``H (x − x*)`` (the normal equations make ``aᵀ(a x* − b)``
        vanish): one ``d × d`` product instead of two through all ``n`` rows."""
        flat = x.reshape(*x.shape[: x.ndim - len(self.shape)], -1)
        if idx is None:
            return ((flat - self.x_star) @ self.H).reshape(x.shape)
        aS, bS = self.a[idx], self.b[idx]                           # (S, τ, d), (S, τ)
        r = torch.baddbmm(-bS[:, None, :], flat, aS.mT)             # (S, C, τ)
        return (torch.bmm(r, aS) / idx.shape[-1]).reshape(x.shape)

    def proxy_constants(self, x0: Tensor | None = None) -> ProxyConstants:
        """Constants of the bound proxy: ``L = λ_max(H)``, ``L_i = ‖a_i‖²``, ``f_i,inf = 0``, from ``x0`` (0)."""
        x0 = torch.zeros(self.shape, dtype=self.a.dtype, device=self.a.device) if x0 is None else x0
        delta0 = float(self.excess(x0))
        return ProxyConstants(delta0=delta0, L=self.L, L_max=float(self.row_L.max()), delta_inf=self.f_star, n=self.n)

    def abc(self, tau: int) -> ABC:
        """τ-nice ABC constants of this finite sum (``f_i`` is ``‖a_i‖²``-smooth with ``f_i,inf = 0``)."""
        return tau_nice_abc(self.row_L, np.zeros_like(self.row_L), self.f_star, tau)


def _gaussian(gen: torch.Generator, *shape: int) -> Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def linear_regression(n: int, d: int, noise: float, seed: int = 0, device: torch.device | str = "cpu",
                      dtype: torch.dtype = torch.float32) -> LeastSquares:
    """Gaussian design ``a_i ~ N(0, I_d)``, ``x* ~ N(0, I_d)``, ``b = a x* + noise · N(0, 1)`` (generated on CPU
    in float64 from ``seed``, so every device sees the same problem)."""
    if n < 1 or d < 1 or noise < 0:
        raise ValueError("need n, d >= 1 and noise >= 0")
    gen = torch.Generator().manual_seed(seed)
    a, x = _gaussian(gen, n, d), _gaussian(gen, d)
    b = a @ x + noise * _gaussian(gen, n)
    return LeastSquares.from_data(a.to(device, dtype), b.to(device, dtype), (d,))


def matrix_regression(n: int, p: int, q: int, rank: int, noise: float, seed: int = 0,
                      device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> LeastSquares:
    """Matrix sensing ``y_i = ⟨A_i, X*⟩ + noise · N(0, 1)`` with Gaussian ``A_i`` (``p × q``) and a rank-``rank``
    ``X* = U Vᵀ/√rank`` with Gaussian factors (so ``E‖X*‖_F² = p q``)."""
    if min(n, p, q, rank) < 1 or rank > min(p, q) or noise < 0:
        raise ValueError("need n, p, q >= 1, 1 <= rank <= min(p, q), noise >= 0")
    gen = torch.Generator().manual_seed(seed)
    a = _gaussian(gen, n, p * q)
    X = _gaussian(gen, p, rank) @ _gaussian(gen, rank, q) / math.sqrt(rank)
    b = a @ X.reshape(-1) + noise * _gaussian(gen, n)
    return LeastSquares.from_data(a.to(device, dtype), b.to(device, dtype), (p, q))
