"""Exact class-conditional entropies of paper 16: noise schedules, Gaussian-mixture posteriors, denoisers and
scores, the two-class quadrature, the empirical (training-set) posterior, the MMSE-gap estimator, the entropy rate
and its peak, and classifier-free-guided probability-flow trajectories.

See :mod:`repro.papers.semantic_entropy` for the formulas.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "VE", "VP", "GaussianMixture", "Schedule", "conditional_entropy_mc", "crossing_time", "crossing_times",
    "empirical_log_posterior", "entropy", "entropy_rate", "entropy_two_class", "fwhm", "guided_flow",
    "guided_trajectories", "mmse_gap_entropy", "peak_time", "two_class_snr_statistic",
]

Tensor = torch.Tensor


# --------------------------------------------------------------------------------------------------------
# Noise schedules


class Schedule:
    """``x_t = alpha(t) x_0 + sigma(t) ε``; subclasses define ``alpha``, ``sigma`` and ``t_of_snr``."""

    def alpha(self, t: Tensor) -> Tensor:
        raise NotImplementedError

    def sigma(self, t: Tensor) -> Tensor:
        raise NotImplementedError

    def t_of_snr(self, snr: Tensor) -> Tensor:
        raise NotImplementedError

    def snr(self, t: Tensor) -> Tensor:
        """Signal-to-noise ratio ``γ = alpha² / sigma²``."""
        return (self.alpha(t) / self.sigma(t)) ** 2

    def noise(self, x0: Tensor, t: Tensor, eps: Tensor) -> Tensor:
        """``x_t`` for clean data ``x0`` (``(n, d)``), a scalar time ``t`` and noise ``eps``."""
        return self.alpha(t) * x0 + self.sigma(t) * eps


class VP(Schedule):
    """Variance preserving (Ornstein–Uhlenbeck ``dx = −x dt + √2 dW``): ``a = e^{−t}``, ``s² = 1 − e^{−2t}``."""

    def alpha(self, t: Tensor) -> Tensor:
        return torch.exp(-torch.as_tensor(t))

    def sigma(self, t: Tensor) -> Tensor:
        return torch.sqrt(-torch.expm1(-2 * torch.as_tensor(t)))

    def t_of_snr(self, snr: Tensor) -> Tensor:
        snr = torch.as_tensor(snr)
        return 0.5 * torch.log1p(1 / snr)


class VE(Schedule):
    """Variance exploding in σ-time (EDM's parametrisation): ``a = 1``, ``s = t = σ``."""

    def alpha(self, t: Tensor) -> Tensor:
        return torch.ones_like(torch.as_tensor(t))

    def sigma(self, t: Tensor) -> Tensor:
        return torch.as_tensor(t)

    def t_of_snr(self, snr: Tensor) -> Tensor:
        return torch.as_tensor(snr) ** -0.5


# --------------------------------------------------------------------------------------------------------
# Gaussian mixtures: exact posteriors, denoisers, scores


def entropy(logp: Tensor) -> Tensor:
    """Entropy (nats) of each row of log-probabilities (``−Σ p log p`` over the last axis)."""
    return -(logp.exp() * logp).nan_to_num().sum(dim=-1)


def _group(logp: Tensor, partition: Tensor | None) -> Tensor:
    """Log-probabilities of the groups of a partition (``partition[k]`` = group of class ``k``)."""
    if partition is None:
        return logp
    partition = torch.as_tensor(partition, device=logp.device)
    if partition.shape != logp.shape[-1:]:
        raise ValueError(f"partition needs one group index per class ({logp.shape[-1]}), got {tuple(partition.shape)}")
    groups = int(partition.max()) + 1
    if set(partition.tolist()) != set(range(groups)):
        raise ValueError("partition groups must be numbered 0..G-1 with none empty")
    return torch.stack([torch.logsumexp(logp[..., partition == g], dim=-1) for g in range(groups)], dim=-1)


@dataclass
class GaussianMixture:
    """``x_0 | y ~ N(means[y], covs[y])`` with class probabilities ``weights`` (shapes ``(K, d)``, ``(K, d, d)``,
    ``(K,)``)."""

    means: Tensor
    covs: Tensor
    weights: Tensor

    def __post_init__(self) -> None:
        K, d = self.means.shape
        if self.covs.shape != (K, d, d) or self.weights.shape != (K,):
            raise ValueError("means (K, d), covs (K, d, d) and weights (K,) must agree")
        if (self.weights < 0).any() or not torch.isclose(self.weights.sum(), self.weights.new_tensor(1.0)):
            raise ValueError("weights must be a probability vector")
        torch.linalg.cholesky(self.covs)  # raises if a covariance is not positive definite

    @classmethod
    def isotropic(cls, means: Tensor, var: float | Tensor = 1.0, weights: Tensor | None = None) -> GaussianMixture:
        """Classes with covariance ``var · I`` (equal weights by default)."""
        K, d = means.shape
        var = torch.as_tensor(var, dtype=means.dtype, device=means.device).expand(K)
        eye = torch.eye(d, dtype=means.dtype, device=means.device)
        w = weights if weights is not None else means.new_full((K,), 1.0 / K)
        return cls(means, var[:, None, None] * eye, w)

    @property
    def prior_entropy(self) -> float:
        w = self.weights[self.weights > 0]
        return float(-(w * w.log()).sum())

    def sample(self, n: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """``n`` draws ``(x_0, y)``."""
        y = torch.multinomial(self.weights, n, replacement=True, generator=generator)
        z = torch.randn(n, self.means.shape[1], generator=generator, dtype=self.means.dtype,
                        device=self.means.device)
        L = torch.linalg.cholesky(self.covs)
        return self.means[y] + (L[y] @ z[:, :, None])[:, :, 0], y

    def _noisy(self, t: Tensor, sched: Schedule) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        a, s = sched.alpha(t), sched.sigma(t)
        eye = torch.eye(self.means.shape[1], dtype=self.means.dtype, device=self.means.device)
        C = a**2 * self.covs + s**2 * eye
        return a, s, C, torch.linalg.cholesky(C)

    def log_likelihood(self, x: Tensor, t: Tensor, sched: Schedule) -> Tensor:
        """``log p(x_t | y)`` for every class: shape ``(n, K)``."""
        a, _, _, L = self._noisy(t, sched)
        diff = (x[:, None, :] - a * self.means[None]).transpose(0, 1)  # (K, n, d)
        z = torch.linalg.solve_triangular(L, diff.mT, upper=False)  # (K, d, n)
        maha = (z**2).sum(dim=1).T  # (n, K)
        logdet = 2 * torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
        d = x.shape[1]
        return -0.5 * (maha + logdet + d * math.log(2 * math.pi))

    def log_posterior(self, x: Tensor, t: Tensor, sched: Schedule, partition: Tensor | None = None) -> Tensor:
        """``log p(y | x_t)`` (or of the partition's groups): shape ``(n, K)`` (``(n, G)``)."""
        ll = self.log_likelihood(x, t, sched) + self.weights.log()
        return _group(ll - torch.logsumexp(ll, dim=1, keepdim=True), partition)

    def _whitened(self, x: Tensor, t: Tensor, sched: Schedule) -> tuple[Tensor, Tensor]:
        """``a`` and ``C_k^{-1}(x − a μ_k)`` for every sample and class: shape ``(n, K, d)``."""
        a, _, C, _ = self._noisy(t, sched)
        diff = x[:, None, :] - a * self.means[None]
        return a, torch.einsum("kij,nkj->nki", torch.linalg.inv(C), diff)

    def denoiser(self, x: Tensor, t: Tensor, sched: Schedule, y: Tensor | None = None) -> Tensor:
        """``E[x_0 | x_t]`` (``y=None``) or ``E[x_0 | x_t, y]`` for labels ``y`` (shape ``(n,)``):
        ``μ_k + a Σ_k C_k^{-1}(x − a μ_k)`` per class, averaged over the posterior when unconditional."""
        a, sol = self._whitened(x, t, sched)
        per_class = self.means[None] + a * torch.einsum("kij,nkj->nki", self.covs, sol)
        if y is not None:
            return per_class[torch.arange(len(x)), y]
        post = self.log_posterior(x, t, sched).exp()
        return (post[..., None] * per_class).sum(dim=1)

    def score(self, x: Tensor, t: Tensor, sched: Schedule, y: Tensor | None = None) -> Tensor:
        """``∇ log p(x_t)`` (``y=None``) or ``∇ log p(x_t | y)``: ``−C_k^{-1}(x − a μ_k)`` per class."""
        per_class = -self._whitened(x, t, sched)[1]
        if y is not None:
            return per_class[torch.arange(len(x)), y]
        post = self.log_posterior(x, t, sched).exp()
        return (post[..., None] * per_class).sum(dim=1)


# --------------------------------------------------------------------------------------------------------
# Entropy curves


def entropy_two_class(S: Tensor, nodes: int = 80) -> Tensor:
    """Exact ``H(Y | X_t)`` (nats) of two equiprobable symmetric classes from ``S = 2a²‖m‖²/(a²σ₀² + s²)``:
    ``E log(1 + e^{−L})`` with ``L ~ N(S, 2S)``, by Gauss–Hermite quadrature (probabilists' nodes)."""
    S = torch.as_tensor(S, dtype=torch.float64)
    if (S < 0).any():
        raise ValueError("S must be non-negative")
    x, w = np.polynomial.hermite_e.hermegauss(nodes)
    x = torch.as_tensor(x, dtype=S.dtype, device=S.device)
    w = torch.as_tensor(w / w.sum(), dtype=S.dtype, device=S.device)
    L = S[..., None] + torch.sqrt(2 * S[..., None]) * x
    return (torch.nn.functional.softplus(-L) * w).sum(-1)


def two_class_snr_statistic(t: Tensor, sched: Schedule, mean_norm2: float, var0: float = 1.0) -> Tensor:
    """``S(t) = 2a²‖m‖²/(a²σ₀² + s²)`` for classes ``±m`` with covariance ``σ₀² I``."""
    a, s = sched.alpha(t), sched.sigma(t)
    return 2 * a**2 * mean_norm2 / (a**2 * var0 + s**2)


def conditional_entropy_mc(log_posterior: Callable[[Tensor, Tensor], Tensor], x0: Tensor, t_grid: Tensor,
                           sched: Schedule, generator: torch.Generator | None = None) -> Tensor:
    """Monte-Carlo ``H(Z | X_t) = E[−Σ p log p]`` on ``t_grid`` from clean samples ``x0``, with one noise draw
    reused at every ``t`` (common random numbers give smooth curves). ``log_posterior(x_t, t)`` returns
    ``(n, K)`` log-probabilities (pass a partition inside it for coarse semantics)."""
    eps = torch.randn(x0.shape, generator=generator, dtype=x0.dtype, device=x0.device)
    return torch.stack([entropy(log_posterior(sched.noise(x0, t, eps), t)).mean() for t in t_grid])


def empirical_log_posterior(X: Tensor, y: Tensor, x: Tensor, t: Tensor, sched: Schedule, n_classes: int,
                            partition: Tensor | None = None, exclude_self: bool = False) -> Tensor:
    """``log p(y | x_t)`` when the data distribution is the training set ``(X, y)`` itself (Diracs, equal
    weights): ``p(y|x_t) ∝ Σ_{i: y_i = y} N(x_t; a X_i, s² I)``, by log-sum-exp. With ``exclude_self`` the
    ``j``-th query ignores the ``j``-th training point (leave-one-out: the posterior a model that has not
    memorised that point could reach). A class without training points gets ``−inf``."""
    if y.shape != X.shape[:1] or (y.numel() and not (0 <= int(y.min()) and int(y.max()) < n_classes)):
        raise ValueError(f"y needs one label in [0, {n_classes}) per training point")
    if exclude_self and x.shape[0] != X.shape[0]:
        raise ValueError("exclude_self needs the queries to be the (noised) training points, in order")
    a, s = sched.alpha(t), sched.sigma(t)
    aX = a * X
    # log N(x_t; a X_i, s² I) up to a constant: −‖x_t − a X_i‖² / (2 s²), the square expanded into one matmul
    logk = ((x * x).sum(1, keepdim=True) + (aX * aX).sum(1) - 2 * x @ aX.T).mul_(-0.5 / s**2)   # (n, N)
    if exclude_self:
        logk.fill_diagonal_(float("-inf"))
    # per class log Σ exp: shift by the row's largest kernel, sum the classes with one matmul, shift back
    top = logk.amax(1, keepdim=True)
    onehot = torch.nn.functional.one_hot(y, n_classes).to(logk.dtype)
    out = (logk.sub_(top).exp_() @ onehot).log_() + top
    out = out - torch.logsumexp(out, dim=1, keepdim=True)
    return _group(out, partition)


def mmse_gap_entropy(denoise: Callable[[Tensor, Tensor, Tensor | None], Tensor], x0: Tensor, y: Tensor,
                     t_grid: Tensor, sched: Schedule, prior_entropy: float,
                     generator: torch.Generator | None = None, form: str = "squared") -> Tensor:
    """``H(Y | X_t)`` on ``t_grid`` from a denoiser ``denoise(x_t, t, y_or_None)`` by the MMSE-gap identity
    ``H = H(Y) − ½ ∫₀^γ E‖D(x_u) − D(x_u, y)‖² du``, integrated in ``λ = ln γ`` (``du = u dλ``) by the
    trapezoid rule over the grid; the integral below the smallest SNR on the grid is ``γ_min · gap(γ_min)`` (the
    gap tends to a constant as ``γ → 0``). ``t_grid`` must be dense enough; the result is in the grid's order.

    ``form="squared"`` uses ``E‖D − D_y‖²``; ``form="difference"`` uses ``E‖x₀ − D‖² − E‖x₀ − D_y‖²`` (the
    difference of the two denoising errors). For exact denoisers the two agree (orthogonality principle); for a
    trained one, errors that do not depend on the label cancel in the difference, while the squared form counts
    every label-dependent error as information."""
    if form not in ("squared", "difference"):
        raise ValueError(f"form must be 'squared' or 'difference', got {form!r}")
    t_grid = torch.as_tensor(t_grid, dtype=x0.dtype, device=x0.device)
    snr = sched.snr(t_grid)
    order = torch.argsort(snr)
    eps = torch.randn(x0.shape, generator=generator, dtype=x0.dtype, device=x0.device)
    gaps = []
    for t in t_grid[order]:
        xt = sched.noise(x0, t, eps)
        d_u, d_y = denoise(xt, t, None), denoise(xt, t, y)
        if form == "squared":
            gaps.append(((d_u - d_y) ** 2).sum(dim=1).mean())
        else:
            gaps.append(((x0 - d_u) ** 2).sum(dim=1).mean() - ((x0 - d_y) ** 2).sum(dim=1).mean())
    gap = torch.stack(gaps)
    u, lam = snr[order], torch.log(snr[order])
    f = 0.5 * gap * u  # integrand in λ
    info = torch.cat([0.5 * u[:1] * gap[:1], 0.5 * (f[1:] + f[:-1]) * torch.diff(lam)]).cumsum(0)
    H = prior_entropy - info
    out = torch.empty_like(H)
    out[order] = H
    return out


def entropy_rate(H: Tensor, t: Tensor) -> Tensor:
    """``dH/dt`` on a (non-uniform) time grid by second-order finite differences."""
    return torch.gradient(torch.as_tensor(H), spacing=(torch.as_tensor(t),))[0]


def peak_time(t: Tensor, rate: Tensor) -> float:
    """Time of the maximum of ``rate``, refined by a parabola through the three grid points around it."""
    t, rate = torch.as_tensor(t, dtype=torch.float64), torch.as_tensor(rate, dtype=torch.float64)
    i = int(torch.argmax(rate))
    if i == 0 or i == len(t) - 1:
        return float(t[i])
    x, yv = t[i - 1: i + 2], rate[i - 1: i + 2]
    A = torch.stack([x**2, x, torch.ones_like(x)], 1)
    c2, c1, _ = torch.linalg.solve(A, yv)
    return float(-c1 / (2 * c2)) if c2 < 0 else float(t[i])


def fwhm(t: Tensor, rate: Tensor) -> float:
    """Full width at half maximum of a single-peaked ``rate`` curve (linear interpolation of the crossings)."""
    t, r = np.asarray(t, dtype=float), np.asarray(rate, dtype=float)
    i, half = int(np.argmax(r)), r.max() / 2
    left = np.nonzero(r[:i] < half)[0]
    right = np.nonzero(r[i:] < half)[0]
    if not len(left) or not len(right):
        raise ValueError("the rate does not fall below half its maximum on both sides of the peak")
    j, k = left[-1], i + right[0]
    tl = t[j] + (half - r[j]) * (t[j + 1] - t[j]) / (r[j + 1] - r[j])
    tr = t[k - 1] + (half - r[k - 1]) * (t[k] - t[k - 1]) / (r[k] - r[k - 1])
    return float(tr - tl)


def crossing_time(t: Tensor, H: Tensor, level: float) -> float:
    """Largest ``t`` (first in the reverse process) at which ``H`` falls to ``level``, linearly interpolated;
    ``t`` increasing."""
    t, h = np.asarray(t, dtype=float), np.asarray(H, dtype=float)
    above = h >= level
    idx = np.nonzero(~above[:-1] & above[1:])[0]
    if not len(idx):
        raise ValueError(f"H never crosses {level:.4g} on the grid")
    j = idx[-1]
    return float(t[j] + (level - h[j]) * (t[j + 1] - t[j]) / (h[j + 1] - h[j]))


def crossing_times(t: np.ndarray, H: np.ndarray, level: float) -> np.ndarray:
    """:func:`crossing_time` for every row of ``H`` (shape ``(B, T)``, ``t`` increasing) at once; NaN for a row
    that never falls to ``level``."""
    t, h = np.asarray(t, dtype=float), np.asarray(H, dtype=float)
    up = (h[:, :-1] < level) & (h[:, 1:] >= level)
    has = up.any(1)
    j = np.where(has, up.shape[1] - 1 - np.argmax(up[:, ::-1], 1), 0)
    rows = np.arange(len(h))
    h0, h1 = h[rows, j], h[rows, j + 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        out = t[j] + (level - h0) * (t[j + 1] - t[j]) / (h1 - h0)
    return np.where(has, out, np.nan)


# --------------------------------------------------------------------------------------------------------
# Classifier-free guidance


def guided_flow(score_cond: Callable[[Tensor, Tensor], Tensor], score_uncond: Callable[[Tensor, Tensor], Tensor],
                x: Tensor, w: float, t_grid: Tensor,
                observe: Callable[[Tensor, Tensor], Tensor]) -> tuple[Tensor, Tensor]:
    """VP probability-flow ODE ``dx/dt = −x − s_w(x, t)`` run backwards from ``x`` along the decreasing ``t_grid``
    with the classifier-free-guided score ``s_w = (1 + w) s(x|y) − w s(x)`` (second-order Heun steps; with
    ``w = 0`` the unconditional score is not evaluated). Returns the states ``(steps, n, d)`` and
    ``observe(x_t, t)`` at every step, stacked."""
    t_grid = torch.as_tensor(t_grid, dtype=x.dtype, device=x.device)
    if not (torch.diff(t_grid) < 0).all():
        raise ValueError("t_grid must be strictly decreasing (the reverse process)")

    def drift(x: Tensor, t: Tensor) -> Tensor:
        s = score_cond(x, t) if w == 0 else (1 + w) * score_cond(x, t) - w * score_uncond(x, t)
        return -x - s

    states, obs = [x], [observe(x, t_grid[0])]
    for t0, t1 in zip(t_grid[:-1], t_grid[1:], strict=True):
        h = t1 - t0
        d0 = drift(x, t0)
        x_pred = x + h * d0
        x = x + 0.5 * h * (d0 + drift(x_pred, t1))
        states.append(x)
        obs.append(observe(x, t1))
    return torch.stack(states), torch.stack(obs)


def guided_trajectories(gmm: GaussianMixture, y: Tensor, w: float, t_grid: Tensor,
                        generator: torch.Generator | None = None, *,
                        per_trajectory: bool = False) -> tuple[Tensor, Tensor]:
    """:func:`guided_flow` with the mixture's exact scores, from ``x_T ~ N(0, I)``. Returns the states
    ``(steps, n, d)`` and, along them, the entropy of the *unguided* posterior ``H[Y | x_t]`` averaged over
    trajectories ``(steps,)``, or per trajectory ``(steps, n)`` with ``per_trajectory``."""
    sched = VP()
    t_grid = torch.as_tensor(t_grid, dtype=gmm.means.dtype, device=gmm.means.device)
    if not (torch.diff(t_grid) < 0).all():
        raise ValueError("t_grid must be strictly decreasing (the reverse process)")
    x = torch.randn(len(y), gmm.means.shape[1], generator=generator, dtype=gmm.means.dtype,
                    device=gmm.means.device)
    return guided_flow(lambda x, t: gmm.score(x, t, sched, y), lambda x, t: gmm.score(x, t, sched), x, w, t_grid,
                       lambda x, t: _mean_unless(entropy(gmm.log_posterior(x, t, sched)), per_trajectory))


def _mean_unless(h: Tensor, keep: bool) -> Tensor:
    return h if keep else h.mean()
