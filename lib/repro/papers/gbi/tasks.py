"""Four simulation-based-inference tasks with their *tempered joint* f_β(θ, x) ∝ π(θ) p(x | θ)^β.

Paper: Sun, Nicholls, Lee, "Amortized Simulation-Based Inference in Generalized Bayes via Neural Posterior
Estimation", ICML 2026 (arXiv 2601.22367). Notebook: ``notebooks/17-amortized-gbi.ipynb``.

The identity the paper's route (i) rests on: if (θ, x) ~ f_β, normalised jointly, then
f_β(θ | x) = π(θ) p(x | θ)^β / ∫ π p^β dθ = p_β(θ | x), the power posterior, because the normaliser
Z_β(θ) = ∫ p(x | θ)^β dx only reweights the θ-marginal: f_β(θ) ∝ π(θ) Z_β(θ). Per task (our derivations):

* Gaussian linear (location family, Gaussian noise): Z_β constant, x | θ ~ N(θ, σ²/β · I).
* Two moons (location family in x): Z_β constant; the moon noise p = (r cos a + 0.25, r sin a) has density
  p_r(r) / (π r) in polar coordinates, so its β-power is uniform in a and ∝ N(r; 0.1, 0.01²/β) r^(1−β) in r.
  Its normaliser diverges (logarithmically, at the crescent's centre r → 0) for β ≥ 2: refused.
* SLCP (Gaussian with θ-dependent covariance S): x_j | θ ~ N(m, S/β), θ ~ π(θ) |S(θ)|^(2(1−β)) (4 draws of
  dimension 2). Without the 1e-6 jitter this is improper for β ≥ 9/8 (|θ₃|^(−8(β−1)) near θ₃ = 0): refused.
* Lorenz-96 *toy analogue*: the deterministic RK4 trajectory's six summaries plus Gaussian observation noise,
  so again x | θ ~ N(s(θ), diag σ²/β). The real model's stochastic forcing makes its likelihood intractable;
  :func:`lorenz96_trajectory` simulates it (``phi``), but the task's likelihood is the toy's.

Task definitions (priors, simulators) follow the sbibm benchmark (Lueckmann et al. 2021) and, for Lorenz-96,
Wilks (2005) as used in ELFI; they are re-implemented here in batched torch (any device, any float dtype).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

__all__ = [
    "SLCP", "TASKS", "GaussianLinear", "Lorenz96Toy", "Task", "TwoMoons", "as_beta", "lorenz96_rhs",
    "lorenz96_summaries", "lorenz96_trajectory", "make_task", "rk4_step",
]

Tensor = torch.Tensor


def _rand(kind: str, shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device,
          dtype: torch.dtype) -> Tensor:
    """Uniform(0,1) or standard normal draws from ``generator`` (on its own device), moved to ``device``."""
    gdev = generator.device if generator is not None else device
    fn = torch.rand if kind == "rand" else torch.randn
    return fn(shape, generator=generator, device=gdev, dtype=dtype).to(device)


def as_beta(beta: float | Tensor, n: int | None = None, *, beta_max: float = math.inf,
            device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> Tensor:
    """Validate a temperature (scalar, or one per example) and return it as a tensor (shape () or (n,)).

    Raises ``ValueError`` for β ≤ 0, non-finite β, β ≥ ``beta_max`` (the task's tempered joint is improper
    there) or a per-example β of the wrong length.
    """
    b = torch.as_tensor(beta, dtype=dtype, device=device)
    if b.ndim > 1 or (b.ndim == 1 and n is not None and b.shape[0] != n):
        raise ValueError(f"beta must be a scalar or have shape ({n},), got {tuple(b.shape)}")
    if b.numel() == 0 or not torch.isfinite(b).all() or (b <= 0).any():
        raise ValueError("beta must be finite and > 0")
    if (b >= beta_max).any():
        raise ValueError(f"beta must be < {beta_max:g} for this task: its tempered joint is improper there "
                         f"(got max {float(b.max()):g})")
    return b


class Task:
    """A simulation-based-inference task with a tractable likelihood and an exact tempered-joint sampler.

    Subclasses set ``theta_dim``, ``x_dim``, ``beta_max`` (exclusive; ``inf`` if every β > 0 is allowed),
    ``lower``/``upper`` (box prior bounds, or ``None``) and implement the five methods below.
    """

    name = "task"
    theta_dim: int
    x_dim: int
    beta_max = math.inf
    lower: Tensor | None = None
    upper: Tensor | None = None

    def __init__(self, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating dtype, got {dtype}")
        self.device, self.dtype = torch.device(device), dtype

    # -- to implement ---------------------------------------------------------------------------------------
    def sample_prior(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        raise NotImplementedError

    def prior_log_prob(self, theta: Tensor) -> Tensor:
        raise NotImplementedError

    def simulate(self, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One draw x ~ p(x | θ) per row of ``theta`` (β = 1)."""
        return self.simulate_tempered(theta, torch.ones((), dtype=self.dtype, device=self.device), generator)

    def simulate_tempered(self, theta: Tensor, beta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """x ~ p(x | θ)^β / Z_β(θ) per row (β scalar or per row, already validated)."""
        raise NotImplementedError

    def log_likelihood(self, theta: Tensor, x: Tensor) -> Tensor:
        """log p(x | θ), broadcasting the leading dimensions of ``theta`` and ``x``."""
        raise NotImplementedError

    def sample_tempered_theta(self, n: int, beta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """θ ~ f_β(θ) ∝ π(θ) Z_β(θ). Location families: the prior."""
        return self.sample_prior(n, generator)

    def symmetries(self) -> list[Callable[[Tensor], Tensor]]:
        """Maps θ ↦ g(θ), other than the identity, under which prior and likelihood are invariant for every x, so
        every power posterior is too: each a linear isometry (volume-preserving), the set closed under inverses.
        An MCMC sampler may propose g(θ) and always accept it, which moves walkers between the symmetric modes
        (:func:`repro.papers.gbi.mcmc_power_posterior`). An empty list by default."""
        return []

    # -- shared ---------------------------------------------------------------------------------------------
    def _n(self, n: int) -> int:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        return n

    def _theta(self, theta: Tensor) -> Tensor:
        theta = torch.as_tensor(theta, dtype=self.dtype, device=self.device)
        if theta.shape[-1:] != (self.theta_dim,):
            raise ValueError(f"{self.name}: theta must end in dimension {self.theta_dim}, got {tuple(theta.shape)}")
        return theta

    def _x(self, x: Tensor) -> Tensor:
        x = torch.as_tensor(x, dtype=self.dtype, device=self.device)
        if x.shape[-1:] != (self.x_dim,):
            raise ValueError(f"{self.name}: x must end in dimension {self.x_dim}, got {tuple(x.shape)}")
        return x

    def check_beta(self, beta: float | Tensor, n: int | None = None) -> Tensor:
        """``as_beta`` with this task's ``beta_max``, device and dtype."""
        return as_beta(beta, n, beta_max=self.beta_max, device=self.device, dtype=self.dtype)

    def in_support(self, theta: Tensor) -> Tensor:
        """Boolean mask: θ inside the prior's support (always true for an unbounded prior)."""
        theta = self._theta(theta)
        if self.lower is None:
            return torch.ones(theta.shape[:-1], dtype=torch.bool, device=theta.device)
        return ((theta >= self.lower) & (theta <= self.upper)).all(-1)

    def sample_tempered_joint(self, n: int, beta: float | Tensor,
                              generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """(θ, x) ~ f_β(θ, x) ∝ π(θ) p(x | θ)^β, exactly; ``beta`` a scalar or one value per example.

        By the identity in the module docstring, θ | x under these pairs is the power posterior p_β(θ | x).
        """
        n = self._n(n)
        b = self.check_beta(beta, n)
        theta = self.sample_tempered_theta(n, b, generator)
        return theta, self.simulate_tempered(theta, b, generator)

    def log_power_posterior_unnorm(self, theta: Tensor, x: Tensor, beta: float | Tensor) -> Tensor:
        """log π(θ) + β log p(x | θ): the unnormalised log power posterior (−inf outside the support)."""
        b = self.check_beta(beta)
        lp = self.prior_log_prob(theta)
        ll = self.log_likelihood(theta, x)
        return torch.where(torch.isfinite(lp), lp + b * ll, lp)


def _uniform_log_prob(theta: Tensor, lower: Tensor, upper: Tensor) -> Tensor:
    inside = ((theta >= lower) & (theta <= upper)).all(-1)
    val = -torch.log(upper - lower).sum()
    return torch.where(inside, val, torch.full_like(val, -math.inf))


def _sample_uniform(n: int, lower: Tensor, upper: Tensor, generator: torch.Generator | None) -> Tensor:
    u = _rand("rand", (n, lower.shape[0]), generator, lower.device, lower.dtype)
    return lower + (upper - lower) * u


class GaussianLinear(Task):
    """θ ~ N(0, τ² I_d), x | θ ~ N(θ, σ² I_d) with τ² = σ² = 0.1 (sbibm's ``gaussian_linear``; variances).

    Power posterior (exact): p_β(θ | x) = N(β τ² / (σ² + β τ²) · x, τ² σ² / (σ² + β τ²) · I), which for
    τ² = σ² is N(β/(1+β) · x, 0.1/(1+β) · I).
    """

    name = "gaussian_linear"

    def __init__(self, dim: int = 10, prior_var: float = 0.1, noise_var: float = 0.1, **kw):
        super().__init__(**kw)
        if dim < 1 or prior_var <= 0 or noise_var <= 0:
            raise ValueError("need dim >= 1 and positive variances")
        self.theta_dim = self.x_dim = dim
        self.prior_var, self.noise_var = float(prior_var), float(noise_var)

    def sample_prior(self, n, generator=None):
        z = _rand("randn", (self._n(n), self.theta_dim), generator, self.device, self.dtype)
        return math.sqrt(self.prior_var) * z

    def prior_log_prob(self, theta):
        theta = self._theta(theta)
        norm = 0.5 * self.theta_dim * math.log(2 * math.pi * self.prior_var)
        return -0.5 * (theta**2).sum(-1) / self.prior_var - norm

    def simulate_tempered(self, theta, beta, generator=None):
        theta = self._theta(theta)
        z = _rand("randn", tuple(theta.shape), generator, self.device, self.dtype)
        std = torch.sqrt(self.noise_var / beta)
        return theta + (std[..., None] if std.ndim else std) * z

    def log_likelihood(self, theta, x):
        theta, x = self._theta(theta), self._x(x)
        return (-0.5 * ((x - theta) ** 2).sum(-1) / self.noise_var
                - 0.5 * self.x_dim * math.log(2 * math.pi * self.noise_var))

    def analytic_power_posterior(self, x: Tensor, beta: float) -> tuple[Tensor, Tensor]:
        """Mean (…, d) and per-dimension standard deviation (scalar tensor) of p_β(θ | x)."""
        b = float(self.check_beta(beta))
        x = self._x(x)
        denom = self.noise_var + b * self.prior_var
        mean = b * self.prior_var / denom * x
        std = torch.tensor(math.sqrt(self.prior_var * self.noise_var / denom), dtype=self.dtype, device=self.device)
        return mean, std

    def sample_power_posterior(self, x: Tensor, beta: float, n: int,
                               generator: torch.Generator | None = None) -> Tensor:
        """n exact draws from p_β(θ | x) for one observation ``x`` of shape (d,)."""
        mean, std = self.analytic_power_posterior(x, beta)
        if mean.ndim != 1:
            raise ValueError("x must be a single observation of shape (d,)")
        return mean + std * _rand("randn", (self._n(n), self.theta_dim), generator, self.device, self.dtype)


class TwoMoons(Task):
    """sbibm's ``two_moons``: θ ~ U[−1, 1]², a ~ U(−π/2, π/2), r ~ N(0.1, 0.01²) (truncated to r > 0, which
    removes a 1e-23 event), p = (r cos a + 0.25, r sin a), x = p + (−|z₀|, z₁) with z = R(−π/4) θ, i.e.
    z₀ = (θ₀ + θ₁)/√2, z₁ = (θ₁ − θ₀)/√2.

    Likelihood by change of variables: u = x − (−|z₀|, z₁) − (0.25, 0) must satisfy u₀ > 0, and
    p(x | θ) = N(|u|; 0.1, 0.01²) / (π |u| Φ(10)). Tempered noise: a uniform, r ∝ N(r; 0.1, 0.01²/β) r^(1−β),
    drawn by rejection (``_sample_tempered_radius``). ``beta_max = 2``: the normaliser diverges at r → 0.
    """

    name = "two_moons"
    theta_dim = 2
    x_dim = 2
    beta_max = 2.0
    r_mean, r_std = 0.1, 0.01

    def __init__(self, **kw):
        super().__init__(**kw)
        self.lower = torch.full((2,), -1.0, dtype=self.dtype, device=self.device)
        self.upper = torch.full((2,), 1.0, dtype=self.dtype, device=self.device)
        # log P(r > 0) of the untruncated radius (≈ −7.6e-24): kept so the density is exact
        self._log_trunc = math.log1p(-0.5 * math.erfc(self.r_mean / self.r_std / math.sqrt(2)))

    def sample_prior(self, n, generator=None):
        return _sample_uniform(self._n(n), self.lower, self.upper, generator)

    def prior_log_prob(self, theta):
        return _uniform_log_prob(self._theta(theta), self.lower, self.upper)

    def symmetries(self) -> list[Callable[[Tensor], Tensor]]:
        """The reflection (θ₀, θ₁) ↦ (−θ₁, −θ₀): it maps z₀ ↦ −z₀ and keeps z₁, and the likelihood depends on z₀
        only through |z₀|; the box prior is invariant. It swaps the posterior's two crescents."""
        return [lambda th: torch.stack([-th[..., 1], -th[..., 0]], -1)]

    @staticmethod
    def _shift(theta: Tensor) -> Tensor:
        z0 = (theta[..., 0] + theta[..., 1]) / math.sqrt(2)
        z1 = (theta[..., 1] - theta[..., 0]) / math.sqrt(2)
        return torch.stack([-z0.abs(), z1], -1)

    def simulate_tempered(self, theta, beta, generator=None):
        theta = self._theta(theta)
        n = theta.shape[0]
        a = math.pi * (_rand("rand", (n,), generator, self.device, self.dtype) - 0.5)
        r = self._sample_tempered_radius(beta.expand(n) if beta.ndim == 0 else beta, generator)
        p = torch.stack([r * torch.cos(a) + 0.25, r * torch.sin(a)], -1)
        return p + self._shift(theta)

    def _sample_tempered_radius(self, beta: Tensor, generator: torch.Generator | None) -> Tensor:
        """r ∝ N(r; μ, s²/β) r^(1−β) on r > 0 by rejection from the Gaussian restricted to [lo, hi].

        hi = μ + 12 s_β; lo = 0 for β ≤ 1 (where r^(1−β) → 0) and max(μ − 12 s_β, μ/20) for β > 1 (where it
        blows up). The target's mass outside [lo, hi] is below 1e-17 for β ≤ 1.9. The bound on r^(1−β) over
        [lo, hi] is at hi for β ≤ 1 and at lo for β > 1.
        """
        mu, s = self.r_mean, self.r_std / torch.sqrt(beta)
        lo = torch.where(beta <= 1, torch.zeros_like(s), torch.clamp(mu - 12 * s, min=mu / 20))
        hi = mu + 12 * s
        r = torch.empty_like(beta)
        todo = torch.ones_like(beta, dtype=torch.bool)
        for _ in range(1000):
            idx = todo.nonzero().squeeze(1)
            if idx.numel() == 0:
                return r
            b, si, lo_i, hi_i = beta[idx], s[idx], lo[idx], hi[idx]
            prop = mu + si * _rand("randn", (idx.numel(),), generator, self.device, self.dtype)
            u = _rand("rand", (idx.numel(),), generator, self.device, self.dtype)
            bound = torch.where(b <= 1, hi_i, lo_i)
            inside = (prop >= lo_i) & (prop <= hi_i)
            ratio = torch.exp((1 - b) * (torch.log(prop.clamp(min=1e-30)) - torch.log(bound)))
            ok = inside & (prop > 0) & (u < ratio)
            r[idx[ok]] = prop[ok]
            todo[idx[ok]] = False
        raise RuntimeError("tempered radius sampler did not finish in 1000 rounds")

    def radius(self, theta: Tensor, x: Tensor) -> Tensor:
        """The moon radius r = |x − (−|z₀|, z₁) − (0.25, 0)| that θ implies for x: the crescent's width in
        θ-space is the spread of r, N(0.1, 0.01²/β)-like under the power posterior."""
        theta, x = self._theta(theta), self._x(x)
        return (x - self._shift(theta) - torch.tensor([0.25, 0.0], dtype=self.dtype, device=self.device)).norm(dim=-1)

    def log_likelihood(self, theta, x):
        theta, x = self._theta(theta), self._x(x)
        u = x - self._shift(theta)
        u0, u1 = u[..., 0] - 0.25, u[..., 1]
        r = torch.sqrt(u0**2 + u1**2)
        logn = -0.5 * ((r - self.r_mean) / self.r_std) ** 2 - math.log(self.r_std * math.sqrt(2 * math.pi))
        ll = logn - math.log(math.pi) - torch.log(r.clamp(min=1e-300)) - self._log_trunc
        return torch.where(u0 > 0, ll, torch.full_like(ll, -math.inf))


class SLCP(Task):
    """sbibm's ``slcp``: θ ~ U[−3, 3]⁵, m = (θ₀, θ₁), s₁ = θ₂², s₂ = θ₃², ρ = tanh θ₄,
    S = [[s₁², ρ s₁ s₂], [ρ s₁ s₂, s₂²]] + 1e-6 I, x = four i.i.d. draws of N(m, S), flattened (8-dim).

    Tempered joint: x_j | θ ~ N(m, S/β) and θ ~ π(θ) |S(θ)|^(2(1−β)), drawn exactly by rejection from a
    factorised proposal (``_sample_tempered_theta``). ``beta_max = 9/8``.
    """

    name = "slcp"
    theta_dim = 5
    x_dim = 8
    n_draws = 4
    jitter = 1e-6
    beta_max = 1.125

    def __init__(self, **kw):
        super().__init__(**kw)
        self.lower = torch.full((5,), -3.0, dtype=self.dtype, device=self.device)
        self.upper = torch.full((5,), 3.0, dtype=self.dtype, device=self.device)

    def sample_prior(self, n, generator=None):
        return _sample_uniform(self._n(n), self.lower, self.upper, generator)

    def prior_log_prob(self, theta):
        return _uniform_log_prob(self._theta(theta), self.lower, self.upper)

    def symmetries(self) -> list[Callable[[Tensor], Tensor]]:
        """Sign flips of θ₂, of θ₃ and of both: S depends on them only through θ₂² and θ₃² (and ρ = tanh θ₄);
        the box prior is invariant. They permute the posterior's four modes."""
        def flip(*dims: int) -> Callable[[Tensor], Tensor]:
            sign = torch.ones(self.theta_dim, dtype=torch.float64)
            sign[list(dims)] = -1
            return lambda th: th * sign.to(th.device, th.dtype)

        return [flip(2), flip(3), flip(2, 3)]

    def mean_cov(self, theta: Tensor) -> tuple[Tensor, Tensor]:
        """m (…, 2) and S (…, 2, 2) of one draw."""
        theta = self._theta(theta)
        s1, s2, rho = theta[..., 2] ** 2, theta[..., 3] ** 2, torch.tanh(theta[..., 4])
        c = rho * s1 * s2
        S = torch.stack([torch.stack([s1**2 + self.jitter, c], -1), torch.stack([c, s2**2 + self.jitter], -1)], -2)
        return theta[..., :2], S

    def simulate_tempered(self, theta, beta, generator=None):
        m, S = self.mean_cov(theta)
        L = torch.linalg.cholesky(S / (beta[..., None, None] if beta.ndim else beta))
        z = _rand("randn", (theta.shape[0], self.n_draws, 2), generator, self.device, self.dtype)
        return (m[:, None, :] + (L[:, None] @ z[..., None]).squeeze(-1)).reshape(theta.shape[0], self.x_dim)

    def log_likelihood(self, theta, x):
        m, S = self.mean_cov(theta)
        x = self._x(x)
        x = x.reshape(*x.shape[:-1], self.n_draws, 2)
        det = S[..., 0, 0] * S[..., 1, 1] - S[..., 0, 1] ** 2
        d = x - m[..., None, :]
        quad = (S[..., None, 1, 1] * d[..., 0] ** 2 - 2 * S[..., None, 0, 1] * d[..., 0] * d[..., 1]
                + S[..., None, 0, 0] * d[..., 1] ** 2) / det[..., None]
        return (-0.5 * quad.sum(-1) - 0.5 * self.n_draws * torch.log(det)
                - self.n_draws * math.log(2 * math.pi))

    def _sample_power_of_quartic(self, n: int, p: Tensor, generator) -> Tensor:
        """t on [−3, 3] with density ∝ (t⁴ + ε)^p, one exponent per draw: rejection from the density
        ∝ max(t⁴, ε)^p (two pieces with closed-form inverse CDFs); acceptance ≥ 2^(−|p|)."""
        eps = self.jitter
        c = eps**0.25  # the pieces meet at |t| = c
        out = torch.empty(n, dtype=self.dtype, device=self.device)
        todo = torch.ones(n, dtype=torch.bool, device=self.device)
        for _ in range(1000):
            idx = todo.nonzero().squeeze(1)
            if idx.numel() == 0:
                return out
            pk = p[idx]
            k = 4 * pk + 1  # ∫_c^3 t^(4p) dt = (3^k − c^k)/k  (k > 0 since p > −1/4)
            m_in = c * eps**pk  # mass of |t| < c (one side)
            m_out = (3.0**k - c**k) / k
            u1, u2, u3, s = (_rand("rand", (idx.numel(),), generator, self.device, self.dtype) for _ in range(4))
            inner = u1 < m_in / (m_in + m_out)
            t_out = (c**k + u2 * (3.0**k - c**k)) ** (1 / k)
            t = torch.where(inner, u2 * c, t_out)
            t = torch.where(s < 0.5, -t, t)
            g = torch.maximum(t**4, torch.full_like(t, eps))
            log_ratio = pk * (torch.log(t**4 + eps) - torch.log(g))  # in [0, p ln 2] or [p ln 2, 0]
            log_bound = torch.clamp(pk, min=0) * math.log(2)
            ok = torch.log(u3) < log_ratio - log_bound
            out[idx[ok]] = t[ok]
            todo[idx[ok]] = False
        raise RuntimeError("SLCP tempered sampler did not finish in 1000 rounds")

    def sample_tempered_theta(self, n, beta, generator=None):
        """θ ~ π(θ) |S_jit(θ)|^q, q = 2(1−β). With a = s₁² + ε, b = s₂² + ε, c = 1 − ρ²:
        a b c ≤ |S_jit| ≤ a b, so |S_jit|^q ≤ (ab)^q · max(1, c^q) ≤ (ab)^q · cosh(3)^(2 max(0, −q)).
        Propose θ₂, θ₃ ∝ (t⁴ + ε)^q each, the rest uniform; accept with |S_jit|^q / bound."""
        b = beta.expand(n) if beta.ndim == 0 else beta
        q = 2 * (1 - b)
        out = torch.empty(n, self.theta_dim, dtype=self.dtype, device=self.device)
        todo = torch.ones(n, dtype=torch.bool, device=self.device)
        log_c_max = 2 * math.log(math.cosh(3.0))
        for _ in range(1000):
            idx = todo.nonzero().squeeze(1)
            if idx.numel() == 0:
                return out
            qk = q[idx]
            th = _sample_uniform(idx.numel(), self.lower, self.upper, generator)
            th[:, 2] = self._sample_power_of_quartic(idx.numel(), qk, generator)
            th[:, 3] = self._sample_power_of_quartic(idx.numel(), qk, generator)
            _, S = self.mean_cov(th)
            det = S[:, 0, 0] * S[:, 1, 1] - S[:, 0, 1] ** 2
            log_ab = torch.log(S[:, 0, 0]) + torch.log(S[:, 1, 1])
            log_ratio = qk * (torch.log(det) - log_ab) - torch.clamp(-qk, min=0) * log_c_max
            u = _rand("rand", (idx.numel(),), generator, self.device, self.dtype)
            ok = torch.log(u) < log_ratio
            out[idx[ok]] = th[ok]
            todo[idx[ok]] = False
        raise RuntimeError("SLCP tempered sampler did not finish in 1000 rounds")


def lorenz96_rhs(y: Tensor, theta: Tensor, forcing: float, eta: Tensor | float = 0.0) -> Tensor:
    """dy_k/dt = y_{k−1}(y_{k+1} − y_{k−2}) − y_k + F − (θ₁ + θ₂ y_k) + η_k on a ring of K sites (Wilks 2005)."""
    closure = theta[..., 0:1] + theta[..., 1:2] * y
    return (torch.roll(y, 1, -1) * (torch.roll(y, -1, -1) - torch.roll(y, 2, -1)) - y + forcing - closure + eta)


def rk4_step(f, y: Tensor, dt: float) -> Tensor:
    """One classical fourth-order Runge–Kutta step of dy/dt = f(y)."""
    k1 = f(y)
    k2 = f(y + 0.5 * dt * k1)
    k3 = f(y + 0.5 * dt * k2)
    k4 = f(y + dt * k3)
    return y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)


def lorenz96_trajectory(theta: Tensor, y0: Tensor, *, steps: int = 160, duration: float = 4.0,
                        forcing: float = 10.0, phi: float = 0.0,
                        generator: torch.Generator | None = None) -> Tensor:
    """RK4 trajectory (batch, steps, K) of the closure-parametrised Lorenz-96 system, started at ``y0`` (K,).

    ``phi > 0`` adds Wilks' AR(1) stochastic forcing η_t = φ η_{t−1} + √(1−φ²) e_t (held fixed within a step),
    as in the real benchmark (intractable likelihood); ``phi = 0`` is deterministic. The first row is y0.
    """
    if steps < 2 or duration <= 0 or not 0 <= phi < 1:
        raise ValueError("need steps >= 2, duration > 0 and 0 <= phi < 1")
    dt = duration / steps
    y = y0.expand(theta.shape[0], -1).clone()
    eta = torch.zeros_like(y)
    out = [y]
    for _ in range(steps - 1):
        if phi > 0:
            e = _rand("randn", tuple(y.shape), generator, y.device, y.dtype)
            eta = phi * eta + math.sqrt(1 - phi**2) * e
        y = rk4_step(lambda v, eta=eta: lorenz96_rhs(v, theta, forcing, eta), y, dt)
        out.append(y)
    return torch.stack(out, 1)


def lorenz96_summaries(traj: Tensor) -> Tensor:
    """Six summaries of (batch, T, K) trajectories, each averaged over sites: mean; variance in time; lag-1
    autocovariance; covariance with the next site; lag-1 cross-covariances with the previous and next site."""
    def cov(a: Tensor, b: Tensor) -> Tensor:
        return ((a - a.mean(1, keepdim=True)) * (b - b.mean(1, keepdim=True))).mean(1).mean(-1)

    prev, nxt = torch.roll(traj, 1, -1), torch.roll(traj, -1, -1)
    return torch.stack([traj.mean((1, 2)), traj.var(1, correction=0).mean(-1), cov(traj[:, :-1], traj[:, 1:]),
                        cov(traj, nxt), cov(traj[:, :-1], prev[:, 1:]), cov(traj[:, :-1], nxt[:, 1:])], -1)


class Lorenz96Toy(Task):
    """TOY ANALOGUE of the Lorenz-96 benchmark with a tractable likelihood.

    θ = (θ₁, θ₂) ~ U(0.5, 3.5) × U(0, 0.3); K = 40 sites, F = 10, 160 RK4 steps over 4 time units from a fixed
    initial state (the F = 10 system spun up for 50 time units from a one-site perturbation); x = s(θ) + σ ⊙ ε
    with s the six summaries of the *deterministic* trajectory (η = 0) and σ = ``noise_frac`` × the summaries'
    prior-predictive standard deviation (estimated once from 1024 prior draws, seed 0). The real benchmark's
    stochastic forcing is dropped, so the likelihood is Gaussian and MCMC is exact.
    """

    name = "lorenz96_toy"
    theta_dim = 2
    x_dim = 6

    def __init__(self, noise_frac: float = 0.1, sites: int = 40, steps: int = 160, duration: float = 4.0,
                 forcing: float = 10.0, **kw):
        super().__init__(**kw)
        if noise_frac <= 0 or sites < 4:
            raise ValueError("need noise_frac > 0 and at least 4 sites")
        self.sites, self.steps, self.duration, self.forcing = sites, steps, duration, forcing
        self.lower = torch.tensor([0.5, 0.0], dtype=self.dtype, device=self.device)
        self.upper = torch.tensor([3.5, 0.3], dtype=self.dtype, device=self.device)
        y = torch.full((1, sites), forcing, dtype=torch.float64, device=self.device)
        y[0, sites // 2] += 0.01
        zero = torch.zeros(1, 2, dtype=torch.float64, device=self.device)
        for _ in range(2000):
            y = rk4_step(lambda v: lorenz96_rhs(v, zero, forcing), y, 0.025)
        self.y0 = y[0].to(self.dtype)
        g = torch.Generator(device="cpu").manual_seed(0)
        s = self.summaries(_sample_uniform(1024, self.lower.cpu(), self.upper.cpu(), g).to(self.device))
        self.noise_std = noise_frac * s.std(0)

    def summaries(self, theta: Tensor) -> Tensor:
        """s(θ): the deterministic trajectory's six summaries, (n, 6)."""
        theta = self._theta(theta)
        traj = lorenz96_trajectory(theta, self.y0, steps=self.steps, duration=self.duration, forcing=self.forcing)
        return lorenz96_summaries(traj)

    def sample_prior(self, n, generator=None):
        return _sample_uniform(self._n(n), self.lower, self.upper, generator)

    def prior_log_prob(self, theta):
        return _uniform_log_prob(self._theta(theta), self.lower, self.upper)

    def simulate_tempered(self, theta, beta, generator=None):
        s = self.summaries(theta)
        z = _rand("randn", tuple(s.shape), generator, self.device, self.dtype)
        scale = self.noise_std / torch.sqrt(beta[..., None] if beta.ndim else beta)
        return s + scale * z

    def log_likelihood(self, theta, x):
        theta, x = self._theta(theta), self._x(x)
        s = self.summaries(theta.reshape(-1, 2)).reshape(*theta.shape[:-1], self.x_dim)
        r = (x - s) / self.noise_std
        return -0.5 * (r**2).sum(-1) - torch.log(self.noise_std).sum() - 0.5 * self.x_dim * math.log(2 * math.pi)


TASKS = {c.name: c for c in (GaussianLinear, TwoMoons, SLCP, Lorenz96Toy)}


def make_task(name: str, **kw) -> Task:
    """A task by its name: ``gaussian_linear``, ``two_moons``, ``slcp`` or ``lorenz96_toy``."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid: {', '.join(TASKS)}")
    return TASKS[name](**kw)
