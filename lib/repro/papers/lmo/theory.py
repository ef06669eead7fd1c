"""The bound proxy of paper 01 (our stand-in for the paper's theorem, whose constants are not public): the
standard bounded-variance bound for momentum LMO methods with the τ-nice ABC variance ``σ_τ² = 2 A Δ₀ + C``
plugged in; :func:`optimal_alpha_theory` and :func:`theory_sample_cost` minimise it. Derivation in the notebook.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["ALPHA_FINE", "ProxyConstants", "bound_proxy", "optimal_alpha_theory", "proxy_best", "theory_sample_cost"]


@dataclass(frozen=True)
class ProxyConstants:
    """What the bound proxy needs: ``delta0 = f(x₀) − f_inf``, ``L`` (smoothness of f), ``L_max = max L_i``,
    ``delta_inf`` (:mod:`repro.papers.lmo`) and the number of samples ``n``."""

    delta0: float
    L: float
    L_max: float
    delta_inf: float
    n: int

    def step(self, tau: float | np.ndarray, alpha: float | np.ndarray, budget: int) -> np.ndarray:
        """The proxy's optimal step ``η* = √(Δ₀ / (K L (1/2 + 2/α)))`` with ``K = budget/τ`` (closed form of
        :func:`bound_proxy` in η); ``≈ √(Δ₀ τ α / (2 L N))`` for small α."""
        K = budget / np.asarray(tau, dtype=float)
        return np.sqrt(self.delta0 / (K * self.L * (0.5 + 2 / np.asarray(alpha, dtype=float))))

    def sigma(self, tau: int | np.ndarray) -> np.ndarray:
        """ABC-induced noise level ``σ_τ = √(2 A_τ Δ₀ + C_τ) = √(2 v(τ) L_max (Δ₀ + Δ_inf))``."""
        tau = np.asarray(tau, dtype=float)
        if (tau < 1).any() or (tau > self.n).any():
            raise ValueError(f"tau must lie in [1, n={self.n}]")
        v = np.where(tau >= self.n, 0.0, (self.n - tau) / (tau * max(self.n - 1, 1)))
        return np.sqrt(2 * v * self.L_max * (self.delta0 + self.delta_inf))


def bound_proxy(eta: float | np.ndarray, alpha: float | np.ndarray, K: float | np.ndarray,
                sigma: float | np.ndarray, delta0: float, L: float) -> np.ndarray:
    """Bounded-variance bound on ``(1/K) Σ E‖∇f(x_k)‖_*`` for momentum LMO methods (proxy, not the paper's
    theorem): ``Δ₀/(ηK) + Lη/2 + 2Lη/α + 2σ√α + 2σ/(αK)`` (descent lemma + momentum-error recursion with
    ``m₀ = g₀``; derivation in the notebook). Broadcasts over its array arguments."""
    eta, alpha, K, sigma = (np.asarray(a, dtype=float) for a in (eta, alpha, K, sigma))
    if (eta <= 0).any() or (alpha <= 0).any() or (alpha > 1).any() or (K <= 0).any():
        raise ValueError("need eta > 0, 0 < alpha <= 1, K > 0")
    return delta0 / (eta * K) + L * eta / 2 + 2 * L * eta / alpha + 2 * sigma * np.sqrt(alpha) + 2 * sigma / (alpha * K)


def _proxy_min_over_eta(alpha: np.ndarray, K: np.ndarray, sigma: np.ndarray, delta0: float, L: float) -> np.ndarray:
    # min_η Δ₀/(ηK) + ηL(1/2 + 2/α) = 2 √(Δ₀ L (1/2 + 2/α) / K)
    return 2 * np.sqrt(delta0 * L * (0.5 + 2 / alpha) / K) + 2 * sigma * np.sqrt(alpha) + 2 * sigma / (alpha * K)


ALPHA_FINE = np.logspace(-9, 0, 2701)


def proxy_best(K: float | np.ndarray, sigma: float | np.ndarray, delta0: float, L: float,
               alphas: np.ndarray = ALPHA_FINE) -> tuple[np.ndarray, np.ndarray]:
    """``(min value, argmin α)`` of :func:`bound_proxy` over η (closed form) and α (on the fine grid
    ``alphas``), for each element of the broadcast ``K``, ``sigma``."""
    K, sigma = np.broadcast_arrays(np.asarray(K, dtype=float), np.asarray(sigma, dtype=float))
    vals = _proxy_min_over_eta(alphas, K[..., None], sigma[..., None], delta0, L)
    j = vals.argmin(-1)
    return np.take_along_axis(vals, j[..., None], -1)[..., 0], alphas[j]


def optimal_alpha_theory(taus: Sequence[int] | np.ndarray, budget: int, consts: ProxyConstants) -> np.ndarray:
    """Bound-proxy optimal α*(τ) at a fixed sample budget ``N`` (``K = N/τ`` steps), η optimised too."""
    taus = np.asarray(taus, dtype=float)
    if budget < taus.max():
        raise ValueError("the budget must allow at least one step at every tau")
    return proxy_best(budget / taus, consts.sigma(taus), consts.delta0, consts.L)[1]


def theory_sample_cost(taus: Sequence[int] | np.ndarray, eps: float, consts: ProxyConstants,
                       k_max: float = 1e14) -> np.ndarray:
    """Bound-proxy total sample cost ``N_ε(τ) = τ · K_ε(τ)``: ``K_ε`` is the least number of steps with
    ``min_{η, α} proxy ≤ ε`` (found by bisection in log K, vectorised over τ)."""
    taus = np.asarray(taus, dtype=float)
    if eps <= 0:
        raise ValueError("eps must be > 0")
    sigma = consts.sigma(taus)
    lo, hi = np.zeros_like(taus), np.full_like(taus, math.log(k_max))
    if (proxy_best(np.exp(hi), sigma, consts.delta0, consts.L)[0] > eps).any():
        raise ValueError(f"eps={eps} is not reached within k_max={k_max:g} steps")
    for _ in range(60):
        mid = (lo + hi) / 2
        ok = proxy_best(np.exp(mid), sigma, consts.delta0, consts.L)[0] <= eps
        hi, lo = np.where(ok, mid, hi), np.where(ok, lo, mid)
    K = np.ceil(np.exp(hi))
    prev_ok = (K > 1) & (proxy_best(np.maximum(K - 1, 1), sigma, consts.delta0, consts.L)[0] <= eps)
    return taus * np.where(prev_ok, K - 1, K)
