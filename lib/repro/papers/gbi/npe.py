"""One β-conditioned neural posterior estimator q_φ(θ | x, β), trained by the paper's two routes.

Paper: Sun, Nicholls, Lee, ICML 2026 (arXiv 2601.22367). Notebook: ``notebooks/17-amortized-gbi.ipynb``.

Both routes minimise the forward KL E_{β ~ ρ} E_{x ~ f_β} KL(p_β(· | x) ‖ q_φ(· | x, β)), i.e. up to a constant
the expected negative log-likelihood  L(φ) = −E_β E_{(θ, x) ~ f_β} log q_φ(θ | x, β).

* Route (i), ``route="synth"`` (off-manifold synthesis): draw β_i ~ ρ (log-uniform on ``beta_range``) and
  (θ_i, x_i) ~ f_{β_i} with the task's exact tempered-joint sampler, then fit by maximum likelihood.
* Route (ii), ``route="snis"``: keep one base set (θ_i, x_i) ~ π(θ) p(x | θ) (β = 1) and its log-likelihoods
  ℓ_i = log p(x_i | θ_i). Because f_β(θ, x) ∝ f_1(θ, x) p(x | θ)^(β−1), the self-normalised weights
  w̃_i(β) = exp((β−1) ℓ_i) / Σ_j exp((β−1) ℓ_j)  (:func:`snis_weights`, in log space) give the consistent
  estimate L_β(φ) ≈ −Σ_i w̃_i(β) log q_φ(θ_i | x_i, β). We normalise over the **whole base set** (the
  paper's consistency is in its size N) and estimate the sum stochastically by drawing each minibatch from
  the base set with probabilities w̃(β) (``snis="resample"``, unbiased for L_β); ``snis="batch"`` instead
  normalises within a uniform minibatch, the cheaper and biased variant. :func:`ess` reports
  ESS = 1 / Σ w̃², so weight collapse at small β is visible.

The flow is a zuko neural spline flow (``kind="nsf"``) or masked autoregressive flow (``"maf"``) with context
(x, log β); θ, x and log β are standardised with fixed statistics stored in :class:`AmortizedPosterior`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import zuko
from torch import nn

from ...common.train import fit
from .tasks import Task, _rand

__all__ = [
    "ROUTES", "AmortizedPosterior", "TrainResult", "ess", "gaussian_ess_fraction", "make_flow", "sample_log_uniform",
    "snis_weights", "train_tempered_npe",
]

Tensor = torch.Tensor
ROUTES = ("synth", "snis")


def snis_weights(loglik: Tensor, beta: float | Tensor) -> Tensor:
    """Self-normalised importance weights w̃_i ∝ p(x_i | θ_i)^(β−1) from log-likelihoods ``loglik`` (…, N).

    ``beta`` is a scalar or has shape (…, 1) / (B, 1) to get one weight vector per temperature. Computed with a
    log-sum-exp, so log-likelihoods of −1e4 or +1e4 neither overflow nor underflow to NaN; −inf entries get
    weight 0 (for β < 1 they would get +inf and are refused).
    """
    loglik = torch.as_tensor(loglik)
    b = torch.as_tensor(beta, dtype=loglik.dtype, device=loglik.device)
    if loglik.numel() == 0 or torch.isnan(loglik).any() or (loglik == math.inf).any():
        raise ValueError("loglik must be non-empty, without NaN or +inf")
    if not torch.isfinite(b).all() or (b <= 0).any():
        raise ValueError("beta must be finite and > 0")
    if (b < 1).any() and (loglik == -math.inf).any():
        raise ValueError("loglik = -inf gets infinite weight for beta < 1")
    logw = (b - 1) * loglik
    logw = torch.where(loglik == -math.inf, torch.full_like(logw, -math.inf), logw)
    return torch.softmax(logw, dim=-1)


def ess(weights: Tensor) -> Tensor:
    """Kish effective sample size 1 / Σ w̃² of normalised weights (last dimension)."""
    w = torch.as_tensor(weights)
    if (w < 0).any() or not torch.allclose(w.sum(-1), torch.ones((), dtype=w.dtype, device=w.device), atol=1e-4):
        raise ValueError("weights must be non-negative and sum to 1")
    return 1.0 / (w**2).sum(-1)


def gaussian_ess_fraction(beta: float | np.ndarray, dim: int) -> np.ndarray:
    """Large-N limit of ESS/N for the Gaussian linear task (any prior), weights p(x|θ)^(β−1):
    E[w]² / E[w²] = β^(−d) (2β − 1)^(d/2) for β > 1/2 (χ² moment generating function), 0 for β ≤ 1/2
    (the weights' variance is infinite)."""
    b = np.asarray(beta, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        val = b ** (-dim) * np.clip(2 * b - 1, 0, None) ** (dim / 2)
    return np.where(b > 0.5, val, 0.0)


def sample_log_uniform(n: int, beta_range: tuple[float, float], generator: torch.Generator | None = None, *,
                       device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> Tensor:
    """n temperatures log-uniform on [lo, hi] (the training distribution ρ(β))."""
    lo, hi = _check_range(beta_range)
    u = _rand("rand", (n,), generator, torch.device(device), dtype)
    return torch.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))


def _check_range(beta_range: tuple[float, float]) -> tuple[float, float]:
    lo, hi = (float(b) for b in beta_range)
    if not (0 < lo <= hi < math.inf):
        raise ValueError(f"beta_range must satisfy 0 < lo <= hi < inf, got {beta_range}")
    return lo, hi


def make_flow(theta_dim: int, context_dim: int, kind: str = "nsf", transforms: int = 3,
              hidden: tuple[int, ...] = (64, 64), bins: int = 8) -> zuko.flows.Flow:
    """A conditional zuko flow: neural spline (``nsf``) or affine masked autoregressive (``maf``)."""
    if kind == "nsf":
        return zuko.flows.NSF(theta_dim, context_dim, bins=bins, transforms=transforms, hidden_features=hidden)
    if kind == "maf":
        return zuko.flows.MAF(theta_dim, context_dim, transforms=transforms, hidden_features=hidden)
    raise ValueError(f"unknown flow kind {kind!r}; valid: 'nsf', 'maf'")


class AmortizedPosterior(nn.Module):
    """q_φ(θ | x, β): a conditional flow on standardised θ with context (standardised x, standardised log β)."""

    def __init__(self, task: Task, flow: nn.Module, theta_loc: Tensor, theta_scale: Tensor, x_loc: Tensor,
                 x_scale: Tensor, beta_range: tuple[float, float]):
        super().__init__()
        self.task, self.flow = task, flow
        lo, hi = _check_range(beta_range)
        self.beta_range = (lo, hi)
        for name, t in (("theta_loc", theta_loc), ("theta_scale", theta_scale), ("x_loc", x_loc),
                        ("x_scale", x_scale)):
            self.register_buffer(name, t.detach().clone())
        self.logb_loc = 0.5 * (math.log(lo) + math.log(hi))
        self.logb_scale = max(0.5 * (math.log(hi) - math.log(lo)), 1e-3)

    def context(self, x: Tensor, beta: Tensor) -> Tensor:
        """(…, x_dim + 1) context: standardised x and standardised log β (β broadcast to x's batch shape)."""
        b = torch.as_tensor(beta, dtype=x.dtype, device=x.device)
        if (b <= 0).any():
            raise ValueError("beta must be > 0")
        logb = (torch.log(b) - self.logb_loc) / self.logb_scale
        logb = logb.expand(x.shape[:-1]) if logb.ndim == 0 else logb
        return torch.cat([(x - self.x_loc) / self.x_scale, logb[..., None]], -1)

    def log_prob(self, theta: Tensor, x: Tensor, beta: Tensor) -> Tensor:
        """log q_φ(θ | x, β) in the original θ coordinates (includes the standardisation's Jacobian)."""
        z = (theta - self.theta_loc) / self.theta_scale
        return self.flow(self.context(x, beta)).log_prob(z) - torch.log(self.theta_scale).sum()

    @torch.no_grad()
    def sample(self, x: Tensor, beta: float, n: int, *, within_prior: bool = True, max_rounds: int = 100) -> Tensor:
        """n draws θ ~ q_φ(θ | x, β) for one observation ``x`` (x_dim,) and one β: a single batched pass
        through the flow (plus redraws of the few samples that leak outside a bounded prior). A β outside the
        training range is accepted but is an extrapolation of the flow."""
        x = self.task._x(x)
        if x.ndim != 1:
            raise ValueError("sample() takes one observation of shape (x_dim,)")
        self.task.check_beta(beta)
        dist = self.flow(self.context(x, torch.as_tensor(float(beta), dtype=x.dtype, device=x.device)))
        out, have = [], 0
        for _ in range(max_rounds):
            z = dist.sample((max(n - have, 16) if have else n,))
            th = self.theta_loc + self.theta_scale * z
            if within_prior and self.task.lower is not None:
                th = th[self.task.in_support(th)]
            out.append(th)
            have += th.shape[0]
            if have >= n:
                return torch.cat(out)[:n]
        raise RuntimeError(f"fewer than {n} of the flow's samples fell inside the prior after {max_rounds} rounds")


@dataclass
class TrainResult:
    """A trained estimator and what it cost: simulations, wall time of simulation and of training, losses."""

    posterior: AmortizedPosterior
    route: str
    n_sims: int
    sim_seconds: float
    train_seconds: float
    losses: np.ndarray = field(repr=False)

    @property
    def seconds(self) -> float:
        """Total one-off cost (simulation + training)."""
        return self.sim_seconds + self.train_seconds


def _training_set(task: Task, route: str, n_sims: int, beta_range, generator):
    """Route (i): (θ, x, β) from the tempered joint at per-example β; route (ii): the β = 1 base set and ℓ."""
    if route == "synth":
        beta = sample_log_uniform(n_sims, beta_range, generator, device=task.device, dtype=task.dtype)
        theta, x = task.sample_tempered_joint(n_sims, beta, generator)
        return theta, x, beta
    theta, x = task.sample_tempered_joint(n_sims, 1.0, generator)
    return theta, x, task.log_likelihood(theta, x)


def train_tempered_npe(task: Task, route: str = "synth", *, beta_range: tuple[float, float] = (0.1, 2.0),
                       n_sims: int = 20_000, steps: int = 1500, batch: int = 256, lr: float = 1e-3,
                       kind: str = "nsf", transforms: int = 3, hidden: tuple[int, ...] = (64, 64),
                       betas_per_step: int = 8, snis: str = "resample", clip: float | None = 5.0,
                       generator: torch.Generator | None = None) -> TrainResult:
    """Train q_φ(θ | x, β) on ``n_sims`` simulations by route ``"synth"`` (i) or ``"snis"`` (ii).

    Adam with a cosine-decayed learning rate and the gradients' global norm clipped at ``clip``, ``steps``
    minibatches of ``batch`` examples, trained by :func:`repro.common.train.fit`; route (ii) draws
    ``betas_per_step`` temperatures per step, each with its own SNIS weights. Flow sampling and
    initialisation use torch's global RNG (seed it for reproducibility); data use ``generator``.
    """
    if route not in ROUTES:
        raise ValueError(f"unknown route {route!r}; valid: {', '.join(ROUTES)}")
    if snis not in ("resample", "batch"):
        raise ValueError("snis must be 'resample' or 'batch'")
    for name, v in (("n_sims", n_sims), ("steps", steps), ("batch", batch), ("betas_per_step", betas_per_step)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    lo, hi = _check_range(beta_range)
    task.check_beta(hi)
    if route == "snis" and batch % betas_per_step:
        raise ValueError("batch must be a multiple of betas_per_step")
    t0 = time.perf_counter()
    theta, x, aux = _training_set(task, route, n_sims, (lo, hi), generator)
    sim_seconds = time.perf_counter() - t0

    t0 = time.perf_counter()
    flow = make_flow(task.theta_dim, task.x_dim + 1, kind, transforms, hidden).to(task.device, task.dtype)
    post = AmortizedPosterior(task, flow, theta.mean(0), theta.std(0), x.mean(0), x.std(0), (lo, hi))
    step_fn = _synth_loss if route == "synth" else (_snis_resample_loss if snis == "resample" else _snis_batch_loss)

    def step_loss(_: int) -> Tensor:  # draws its own minibatch (and, for route (ii), its temperatures)
        return step_fn(post, theta, x, aux, batch, betas_per_step, (lo, hi), generator)

    # the flow's parameters are the posterior's only parameters (the standardisation is kept in buffers)
    losses = fit(post, step_loss, steps, lr=lr, optimizer="adam", schedule="cosine", clip=clip)
    return TrainResult(post, route, n_sims, sim_seconds, time.perf_counter() - t0, np.asarray(losses))


def _randint(high: int, size: tuple[int, ...], generator, device) -> Tensor:
    gdev = generator.device if generator is not None else device
    return torch.randint(high, size, generator=generator, device=gdev).to(device)


def _synth_loss(post, theta, x, beta, batch, _k, _range, generator) -> Tensor:
    idx = _randint(theta.shape[0], (batch,), generator, theta.device)
    return -post.log_prob(theta[idx], x[idx], beta[idx]).mean()


def _snis_resample_loss(post, theta, x, loglik, batch, k, beta_range, generator) -> Tensor:
    betas = sample_log_uniform(k, beta_range, generator, device=theta.device, dtype=theta.dtype)
    w = snis_weights(loglik[None, :], betas[:, None])  # (k, N), each row over the whole base set
    gdev = generator.device if generator is not None else theta.device
    idx = torch.multinomial(w.to(gdev), batch // k, replacement=True, generator=generator).to(theta.device)
    b = betas[:, None].expand(-1, batch // k).reshape(-1)
    idx = idx.reshape(-1)
    return -post.log_prob(theta[idx], x[idx], b).mean()


def _snis_batch_loss(post, theta, x, loglik, batch, k, beta_range, generator) -> Tensor:
    idx = _randint(theta.shape[0], (batch,), generator, theta.device)
    betas = sample_log_uniform(k, beta_range, generator, device=theta.device, dtype=theta.dtype)
    w = snis_weights(loglik[idx][None, :], betas[:, None])  # (k, batch), normalised within the minibatch
    th, xx = theta[idx].repeat(k, 1), x[idx].repeat(k, 1)
    lq = post.log_prob(th, xx, betas.repeat_interleave(batch)).reshape(k, batch)
    return -(w * lq).sum(-1).mean()
