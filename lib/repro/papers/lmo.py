"""Momentum LMO optimizers (normalized SGD, sign descent, Muon) under expected smoothness (the ABC condition).

Paper: E. Shulgin, M. Awad, P. Richtárik, E. Gorbunov, "General Analysis of LMO-based Optimizers: Beyond Bounded
Variance", ICML 2026. Notebook: ``notebooks/01-lmo-momentum-abc.ipynb``. The Newton–Schulz iteration is also
POGO's Muon base (paper 19); both use :mod:`repro.common.linalg`.

The method family (one step, paper's convention)::

    m_k     = (1 − α) m_{k−1} + α g_k          α ∈ (0, 1] is the weight of the FRESH gradient (α = 1: no momentum)
    x_{k+1} = x_k + η lmo(m_k),                lmo(m) = argmin_{‖d‖ ≤ 1} ⟨m, d⟩

with ``g_k`` the mean gradient of a τ-nice mini-batch (τ indices drawn uniformly without replacement).
PyTorch's momentum coefficient is ``β = 1 − α`` (``torch.optim.SGD(momentum=β)``, Muon's ``momentum=0.95`` is
α = 0.05); "optimal momentum increases with the batch size" is a statement about α, i.e. β decreases.

The three LMOs, each with ``⟨m, lmo(m)⟩ = −‖m‖_*`` (the dual norm):

* ℓ2 ball → ``−m/‖m‖₂`` (normalized SGD with momentum), dual norm ℓ2;
* ℓ∞ ball → ``−sign(m)`` (sign descent, "Adam-like"), dual norm ℓ1;
* spectral-norm ball on matrices → ``−U Vᵀ`` for ``m = U Σ Vᵀ`` (Muon), dual norm nuclear. Muon approximates
  ``U Vᵀ`` by five steps of the quintic iteration ``X ← a X + (b A + c A²) X``, ``A = X Xᵀ``, from
  ``X₀ = G/‖G‖_F``; the public coefficients (a, b, c) = (3.4445, −4.7750, 2.0315) are tuned for speed, not
  exactness: the output's singular values land roughly in [0.5, 1.5], not at 1 (an inexact LMO).

Expected smoothness: ``E‖g(x)‖² ≤ 2A (f(x) − f_inf) + B ‖∇f(x)‖² + C``. For τ-nice sampling of a finite sum of
``L_i``-smooth ``f_i ≥ f_i,inf`` (derived in the notebook; cf. Khaled & Richtárik 2020) with
``v(τ) = (n − τ)/(τ (n − 1))``::

    E‖g‖² = (1 − v) ‖∇f‖² + v (1/n) Σ ‖∇f_i‖²        (exact)
    A = v max_i L_i,   B = 1 − v = n(τ − 1)/(τ(n − 1)),   C = 2 A Δ_inf,   Δ_inf = f_inf − (1/n) Σ f_i,inf.

The theorem's own constants are not public. :func:`bound_proxy` is a *proxy*: the standard bounded-variance
bound for momentum LMO methods (derived in the notebook) with the ABC-induced variance ``σ_τ² = 2 A Δ₀ + C``
plugged in; :func:`optimal_alpha_theory` and :func:`theory_sample_cost` minimise it.

Experiments: :func:`linear_regression` / :func:`matrix_regression` generate finite-sum least-squares problems and
:func:`run_grid` runs every (seed, α, learning rate) configuration of one batch size as one batched tensor
computation (any device).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch.optim import Optimizer

from ..common.linalg import newton_schulz5, polar

Tensor = torch.Tensor

# --------------------------------------------------------------------------------------------------------------
# Linear minimization oracles. ``batch_dims`` leading dimensions index independent problems (configurations);
# the norm ball lives on the remaining dimensions.
# --------------------------------------------------------------------------------------------------------------

LMO_NAMES = ("l2", "sign", "spectral", "spectral-ns5")


def _check_batch_dims(m: Tensor, batch_dims: int, need_matrix: bool = False) -> None:
    if not 0 <= batch_dims < m.ndim:
        raise ValueError(f"batch_dims must be in [0, {m.ndim - 1}] for a tensor of shape {tuple(m.shape)}, "
                         f"got {batch_dims}")
    if need_matrix and m.ndim - batch_dims != 2:
        raise ValueError(f"the spectral LMO needs matrices: shape {tuple(m.shape)} with batch_dims={batch_dims} "
                         f"leaves {m.ndim - batch_dims} dims, not 2")


def lmo_l2(m: Tensor, batch_dims: int = 0) -> Tensor:
    """ℓ2-ball LMO ``−m/‖m‖₂`` (normalized SGD); the norm runs over all dims after ``batch_dims``.
    A zero ``m`` maps to zero."""
    _check_batch_dims(m, batch_dims)
    dims = tuple(range(batch_dims, m.ndim))
    norm = torch.linalg.vector_norm(m, dim=dims, keepdim=True)
    return -m / norm.clamp_min(torch.finfo(m.dtype).tiny)


def lmo_sign(m: Tensor, batch_dims: int = 0) -> Tensor:
    """ℓ∞-ball LMO ``−sign(m)`` (sign descent); elementwise, so ``batch_dims`` only validates the shape."""
    _check_batch_dims(m, batch_dims)
    return -torch.sign(m)


def lmo_spectral(m: Tensor, batch_dims: int = 0, method: str = "svd", steps: int = 5,
                 ns_dtype: torch.dtype | str | None = "auto") -> Tensor:
    """Spectral-norm-ball LMO ``−U Vᵀ`` for ``m = U Σ Vᵀ`` (Muon), on the last two dims.

    ``method="svd"`` is exact (``torch.linalg.svd``); ``method="ns5"`` is Muon's Newton–Schulz approximation
    (:func:`newton_schulz5`) in working precision ``ns_dtype`` (``"auto"``: bfloat16 on CUDA as Muon does,
    the input's dtype elsewhere).
    """
    _check_batch_dims(m, batch_dims, need_matrix=True)
    if method == "svd":
        return -polar(m)
    if method == "ns5":
        if ns_dtype == "auto":
            ns_dtype = torch.bfloat16 if m.device.type == "cuda" else None
        return -newton_schulz5(m, steps=steps, dtype=ns_dtype)
    raise ValueError(f"unknown spectral LMO method {method!r}; use 'svd' or 'ns5'")


def get_lmo(name: str) -> Callable[..., Tensor]:
    """The LMO called ``name`` (one of :data:`LMO_NAMES`) as ``fn(m, batch_dims=0) -> Tensor``."""
    table: dict[str, Callable[..., Tensor]] = {
        "l2": lmo_l2, "sign": lmo_sign, "spectral": partial(lmo_spectral, method="svd"),
        "spectral-ns5": partial(lmo_spectral, method="ns5"),
    }
    if name not in table:
        raise ValueError(f"unknown LMO {name!r}; valid names are {', '.join(map(repr, LMO_NAMES))}")
    return table[name]


def dual_norm(m: Tensor, name: str, batch_dims: int = 0) -> Tensor:
    """The dual norm ``‖m‖_* = −⟨m, lmo(m)⟩`` of LMO ``name``: ℓ2, ℓ1, or nuclear (both spectral LMOs)."""
    if name not in LMO_NAMES:
        raise ValueError(f"unknown LMO {name!r}; valid names are {', '.join(map(repr, LMO_NAMES))}")
    spectral = name.startswith("spectral")
    _check_batch_dims(m, batch_dims, need_matrix=spectral)
    if spectral:
        return torch.linalg.svdvals(m).sum(-1)
    dims = tuple(range(batch_dims, m.ndim))
    return torch.linalg.vector_norm(m, ord=2 if name == "l2" else 1, dim=dims)


def unit_length(name: str, shape: Sequence[int]) -> float:
    """Euclidean (Frobenius) length of an exact LMO output for a generic ``m`` of ``shape``: 1 for ℓ2,
    ``√numel`` for sign, ``√min(rows, cols)`` for spectral. Divide a learning rate by it to compare LMOs at
    equal Euclidean step length."""
    if name == "l2":
        return 1.0
    if name == "sign":
        return math.sqrt(math.prod(shape))
    if name.startswith("spectral") and len(shape) == 2:
        return math.sqrt(min(shape))
    raise ValueError(f"unknown LMO {name!r} or wrong shape {tuple(shape)} for it")


# --------------------------------------------------------------------------------------------------------------
# The optimizer
# --------------------------------------------------------------------------------------------------------------

def momentum_direction(m: Tensor, g: Tensor, alpha: float | Tensor, nesterov: bool = False) -> Tensor:
    """Update the momentum in place, ``m ← (1 − α) m + α g`` (α: weight of the fresh gradient; PyTorch's
    β = 1 − α), and return what the LMO is applied to: ``m``, or with Nesterov ``(1 − α) m + α g``
    (Muon's ``grad.lerp(buf, β)``). ``alpha`` may be a tensor broadcasting against ``m`` (one α per config)."""
    m.lerp_(g, alpha)
    return g.lerp(m, 1 - alpha) if nesterov else m


class LMOMomentum(Optimizer):
    """Momentum LMO method ``m ← (1 − α) m + α g``, ``p ← p + lr · lmo(m)`` (paper's Algorithm family).

    Args:
        lr: the step length η (radius of the norm ball; the ℓ2 step has Euclidean length exactly ``lr``).
        alpha: weight of the FRESH gradient in ``(0, 1]`` (paper's convention). PyTorch's momentum
            coefficient is ``β = 1 − alpha``: Muon's default ``momentum=0.95`` is ``alpha=0.05``;
            ``alpha=1`` is memory-less normalized SGD / sign descent / orthogonalized SGD.
        lmo: ``"l2"``, ``"sign"``, ``"spectral"`` (exact SVD), ``"spectral-ns5"`` (Muon's Newton–Schulz), or a
            callable ``fn(m) -> direction``. The LMO acts on each parameter tensor separately; the spectral
            LMOs need ≥ 2-D parameters (higher-D ones are flattened to ``(shape[0], -1)`` as Muon does).
        nesterov: apply the LMO to ``(1 − α) m + α g`` instead of ``m``.

    The momentum starts at the first gradient (``m₀ = g₀``), so no bias correction is needed.
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], lr: float = 0.02, alpha: float = 0.1,
                 lmo: str | Callable[[Tensor], Tensor] = "l2", nesterov: bool = False):
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha (weight of the fresh gradient; PyTorch's beta = 1 - alpha) must be in (0, 1], "
                             f"got {alpha}")
        if isinstance(lmo, str):
            get_lmo(lmo)  # validates the name
        elif not callable(lmo):
            raise ValueError(f"lmo must be a name in {LMO_NAMES} or a callable, got {lmo!r}")
        super().__init__(params, dict(lr=lr, alpha=alpha, lmo=lmo, nesterov=nesterov))
        for group in self.param_groups:
            if isinstance(group["lmo"], str) and group["lmo"].startswith("spectral"):
                bad = [tuple(p.shape) for p in group["params"] if p.ndim < 2]
                if bad:
                    raise ValueError(f"the spectral LMO needs matrix parameters; got shapes {bad} (use another "
                                     "optimizer or the 'l2'/'sign' LMO for vectors)")

    @staticmethod
    def _direction(lmo: str | Callable[[Tensor], Tensor], m: Tensor) -> Tensor:
        if callable(lmo):
            return lmo(m)
        if lmo.startswith("spectral"):
            return get_lmo(lmo)(m.reshape(m.shape[0], -1)).reshape(m.shape)
        return get_lmo(lmo)(m)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "m" not in state:
                    state["m"] = p.grad.detach().clone()
                    src = state["m"]
                else:
                    src = momentum_direction(state["m"], p.grad, group["alpha"], group["nesterov"])
                p.add_(self._direction(group["lmo"], src), alpha=group["lr"])
        return loss


# --------------------------------------------------------------------------------------------------------------
# τ-nice sampling and its expected-smoothness (ABC) constants
# --------------------------------------------------------------------------------------------------------------

def _check_tau(n: int, tau: int) -> None:
    if not (isinstance(n, int | np.integer) and isinstance(tau, int | np.integer)) or not 1 <= tau <= n:
        raise ValueError(f"need integers 1 <= tau <= n, got tau={tau!r}, n={n!r}")


def tau_nice_variance_factor(n: int, tau: int) -> float:
    """``v(τ) = (n − τ)/(τ (n − 1))``: the variance of a τ-nice mean gradient is ``v`` times the per-sample
    variance ``(1/n) Σ ‖∇f_i − ∇f‖²`` (0 at ``τ = n``; 1 at ``τ = 1``)."""
    _check_tau(n, tau)
    return 0.0 if n == 1 else (n - tau) / (tau * (n - 1))


@dataclass(frozen=True)
class ABC:
    """Expected-smoothness constants: ``E‖g‖² ≤ 2A (f − f_inf) + B ‖∇f‖² + C``."""

    A: float
    B: float
    C: float


def tau_nice_abc(L: Sequence[float] | Tensor, f_inf_i: Sequence[float] | Tensor, f_inf: float, tau: int) -> ABC:
    """ABC constants of τ-nice sampling for ``f = (1/n) Σ f_i`` with ``f_i`` ``L_i``-smooth and ``f_i ≥ f_inf_i``:
    ``A = v max L_i``, ``B = 1 − v``, ``C = 2 A Δ_inf`` with ``Δ_inf = f_inf − mean(f_inf_i) ≥ 0`` (module doc)."""
    L = np.asarray(L, dtype=float)
    f_inf_i = np.asarray(f_inf_i, dtype=float)
    if L.ndim != 1 or L.shape != f_inf_i.shape or (L < 0).any():
        raise ValueError("L and f_inf_i must be 1-D of equal length, L >= 0")
    v = tau_nice_variance_factor(len(L), tau)
    delta_inf = f_inf - float(f_inf_i.mean())
    if delta_inf < -1e-9 * max(1.0, abs(f_inf)):
        raise ValueError(f"f_inf must be >= mean(f_inf_i) (got Δ_inf = {delta_inf})")
    A = v * float(L.max())
    return ABC(A=A, B=1.0 - v, C=2 * A * max(delta_inf, 0.0))


def tau_nice_second_moment(grads: Tensor, tau: int) -> Tensor:
    """Exact ``E‖g‖²`` of the τ-nice mean of the rows of ``grads`` (shape ``(n, d)``):
    ``(1 − v) ‖mean‖² + v · mean_i ‖grads_i‖²``."""
    if grads.ndim != 2:
        raise ValueError(f"grads must have shape (n, d), got {tuple(grads.shape)}")
    v = tau_nice_variance_factor(grads.shape[0], tau)
    return (1 - v) * grads.mean(0).square().sum() + v * grads.square().sum(1).mean()


def tau_nice_indices(n: int, tau: int, size: Sequence[int], generator: torch.Generator | None = None,
                     device: torch.device | str | None = None) -> Tensor:
    """``size + (τ,)`` indices: each row a uniformly random τ-subset of ``range(n)`` (without replacement)."""
    _check_tau(n, tau)
    keys = torch.rand(*size, n, generator=generator, device=device)
    if tau == 1:
        return keys.argmax(-1, keepdim=True)
    return keys.topk(tau, dim=-1, sorted=False).indices


# --------------------------------------------------------------------------------------------------------------
# The bound proxy (bounded-variance form, ABC-induced variance)
# --------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProxyConstants:
    """What the bound proxy needs: ``delta0 = f(x₀) − f_inf``, ``L`` (smoothness of f), ``L_max = max L_i``,
    ``delta_inf`` (module doc) and the number of samples ``n``."""

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


# --------------------------------------------------------------------------------------------------------------
# Finite-sum least squares and the batched (τ, α, lr, seed) grid
# --------------------------------------------------------------------------------------------------------------

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
        index set); full gradient if ``idx`` is None."""
        flat = x.reshape(*x.shape[: x.ndim - len(self.shape)], -1)
        if idx is None:
            return (((flat @ self.a.mT) - self.b) @ self.a / self.n).reshape(x.shape)
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


def lr_grid(center: float, taus: Sequence[int], alphas: Sequence[float], count: int, ratio: float = 2.0,
            tau_power: float = 0.5, alpha_power: float = 0.5) -> np.ndarray:
    """Learning rates of shape ``(len(taus), len(alphas), count)``: ``count`` values spaced by ``ratio`` around
    ``center · τ^tau_power · α^alpha_power``. The default powers follow the bound proxy's optimal step,
    ``η* ≈ √(Δ₀ α / (2 L K))`` with ``K = N/τ``, so that the best rate stays inside the grid."""
    if center <= 0 or count < 1 or ratio <= 1:
        raise ValueError("need center > 0, count >= 1, ratio > 1")
    offs = ratio ** (np.arange(count) - (count - 1) / 2)
    t = np.asarray(taus, dtype=float)[:, None, None] ** tau_power
    a = np.asarray(alphas, dtype=float)[None, :, None] ** alpha_power
    return center * t * a * offs[None, None, :]


@dataclass
class GridResult:
    """Excess losses ``loss[τ, seed, α, lr, checkpoint]`` of a grid run; ``samples[j]`` is the number of samples
    processed at checkpoint ``j`` (the last one is the budget); ``lrs[τ, α, lr]`` the learning rates."""

    lmo: str
    taus: np.ndarray
    alphas: np.ndarray
    lrs: np.ndarray
    samples: np.ndarray
    loss: np.ndarray

    @property
    def final(self) -> np.ndarray:
        """``log10`` excess loss at the budget, shape ``(τ, seed, α, lr)``."""
        return np.log10(self.loss[..., -1])


def _check_grid(taus: Sequence[int], alphas: Sequence[float], lrs: np.ndarray, budget: int, checkpoints: int,
                n: int) -> None:
    if not all(1 <= t <= n for t in taus) or any(budget % (checkpoints * t) for t in taus):
        raise ValueError(f"every tau must lie in [1, n={n}] and divide budget/checkpoints = {budget}/{checkpoints}")
    if not all(0 < a <= 1 for a in alphas):
        raise ValueError("alphas (weight of the fresh gradient; PyTorch's beta = 1 - alpha) must lie in (0, 1]")
    if lrs.ndim != 3 or lrs.shape[:2] != (len(taus), len(alphas)) or (lrs <= 0).any():
        raise ValueError("lrs must have shape (len(taus), len(alphas), count) with positive entries")


def run_grid(problem: LeastSquares, lmo: str, taus: Sequence[int], alphas: Sequence[float], lrs: np.ndarray,
             budget: int, seeds: int, checkpoints: int = 32, seed: int = 0, nesterov: bool = False) -> GridResult:
    """Run the momentum LMO method from ``x₀ = 0`` for every (τ, seed, α, lr) at a fixed sample budget.

    For each τ, all ``seeds × len(alphas) × lrs.shape[2]`` runs are one batched tensor computation of
    ``budget/τ`` steps; the runs of one seed share their τ-nice mini-batches (common random numbers: the
    configurations are compared on the same sample path). Momentum starts at ``m₀ = g₀``.
    """
    lrs = np.asarray(lrs, dtype=float)
    _check_grid(taus, alphas, lrs, budget, checkpoints, problem.n)
    fn = get_lmo(lmo)
    dev, dt, nb = problem.a.device, problem.a.dtype, len(problem.shape)
    na, nl = len(alphas), lrs.shape[2]
    alpha = torch.tensor(alphas, dtype=dt, device=dev).repeat_interleave(nl).reshape(1, -1, *[1] * nb)
    out = np.empty((len(taus), seeds, na, nl, checkpoints))
    for t_i, tau in enumerate(taus):
        lr = torch.tensor(lrs[t_i], dtype=dt, device=dev).reshape(1, -1, *[1] * nb)   # α-major, lr-minor
        gen = torch.Generator(device=dev).manual_seed(seed * 1_000_003 + int(tau))
        out[t_i] = _run_one_tau(problem, fn, int(tau), alpha, lr, budget, seeds, checkpoints, gen,
                                nesterov).reshape(seeds, na, nl, checkpoints)
    samples = budget // checkpoints * np.arange(1, checkpoints + 1)
    return GridResult(lmo=lmo, taus=np.asarray(taus), alphas=np.asarray(alphas, dtype=float), lrs=lrs,
                      samples=samples, loss=out)


def _run_one_tau(problem: LeastSquares, fn: Callable[..., Tensor], tau: int, alpha: Tensor, lr: Tensor,
                 budget: int, seeds: int, checkpoints: int, gen: torch.Generator, nesterov: bool,
                 chunk: int = 512) -> np.ndarray:
    steps, every = budget // tau, budget // tau // checkpoints
    x = torch.zeros(seeds, alpha.shape[1], *problem.shape, dtype=problem.a.dtype, device=problem.a.device)
    m, rec = None, []
    for start in range(0, steps, chunk):
        idx_chunk = tau_nice_indices(problem.n, tau, (min(chunk, steps - start), seeds), gen, x.device)
        for j, idx in enumerate(idx_chunk):
            g = problem.grad(x, idx)
            if m is None:
                m, src = g, g
            else:
                src = momentum_direction(m, g, alpha, nesterov)
            x.add_(lr * fn(src, batch_dims=2))
            if (start + j + 1) % every == 0:
                rec.append(problem.excess(x))
    return torch.stack(rec, -1).double().cpu().numpy()


# --------------------------------------------------------------------------------------------------------------
# Reading a grid: best learning rate per cell, soft-argmin over α, slope, samples to a target
# --------------------------------------------------------------------------------------------------------------

def best_over_lr(res: GridResult) -> tuple[np.ndarray, np.ndarray]:
    """Seed-mean final ``log10`` excess loss at the best learning rate of each (τ, α) cell, and that lr's index.
    Shapes ``(τ, α)``."""
    mean = res.final.mean(axis=1)             # (τ, α, lr)
    j = mean.argmin(-1)
    return np.take_along_axis(mean, j[..., None], -1)[..., 0], j


def soft_argmin(values: np.ndarray, grid: np.ndarray, temperature: float, axis: int = -1) -> np.ndarray:
    """Softmax-weighted mean of ``grid`` with weights ``exp(−values/temperature)`` along ``axis`` (a smooth
    argmin; ``temperature → 0`` gives the hard argmin)."""
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    v = np.moveaxis(np.asarray(values, dtype=float), axis, -1)
    w = np.exp(-(v - v.min(-1, keepdims=True)) / temperature)
    return (w * grid).sum(-1) / w.sum(-1)


def alpha_hat(res: GridResult, temperature: float, per_seed: bool = False) -> np.ndarray:
    """Soft-argmin α̂*(τ) over the α grid (in log2 α) of the best-lr seed-mean final log-loss; with
    ``per_seed`` one α̂* per seed (lr still chosen on the seed mean), shape ``(seed, τ)``."""
    best, j = best_over_lr(res)
    log_a = np.log2(res.alphas)
    if not per_seed:
        return 2.0 ** soft_argmin(best, log_a, temperature)
    fin = res.final                                                   # (τ, seed, α, lr)
    jj = np.broadcast_to(j[:, None, :, None], fin.shape[:3] + (1,))
    per = np.take_along_axis(fin, jj, -1)[..., 0]                     # (τ, seed, α)
    return 2.0 ** soft_argmin(per, log_a, temperature).T


def samples_to_target(res: GridResult, log10_target: float) -> np.ndarray:
    """Per τ, the fewest samples (checkpoint resolution) at which some (α, lr) has seed-mean ``log10`` excess
    loss ≤ ``log10_target``; ``inf`` where no configuration reaches it within the budget."""
    mean = np.log10(res.loss).mean(axis=1)                     # (τ, α, lr, ckpt)
    hit = (mean <= log10_target).reshape(len(res.taus), -1, len(res.samples)).any(1)
    first = np.where(hit.any(-1), hit.argmax(-1), -1)
    return np.where(first >= 0, res.samples[np.maximum(first, 0)], np.inf).astype(float)


def lr_edge_fraction(res: GridResult) -> float:
    """Fraction of (τ, α) cells whose best learning rate is the smallest or largest of the grid."""
    _, j = best_over_lr(res)
    return float(((j == 0) | (j == res.lrs.shape[-1] - 1)).mean())


def best_lr_curves(res: GridResult) -> np.ndarray:
    """Seed-mean ``log10`` excess loss over the checkpoints at each (τ, α) cell's best learning rate (chosen at
    the budget), shape ``(τ, α, checkpoint)``: the loss curves behind the heat-map."""
    _, j = best_over_lr(res)
    mean = np.log10(res.loss).mean(axis=1)                     # (τ, α, lr, ckpt)
    jj = np.broadcast_to(j[:, :, None, None], mean.shape[:2] + (1, mean.shape[-1]))
    return np.take_along_axis(mean, jj, 2)[:, :, 0]
