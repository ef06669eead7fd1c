"""Reference samples of the power posterior p_β(θ | x) ∝ π(θ) p(x | θ)^β: the non-amortised baselines.

Paper: Sun, Nicholls, Lee, ICML 2026 (arXiv 2601.22367). Notebook: ``notebooks/17-amortized-gbi.ipynb``.

* :func:`mcmc_power_posterior`: emcee's affine-invariant ensemble sampler (Goodman & Weare 2010;
  Foreman-Mackey et al. 2013) on the explicit tempered log-density, one run per (x, β), as the paper's
  MCMC baselines are. The stretch move needs no step size, so the same settings serve every β even though
  the posterior's width changes with β. Walkers start from prior draws importance-resampled by p(x | θ)^β.
  On tasks whose posterior has symmetric modes (two moons, SLCP) a share of the steps jumps a walker to a
  symmetric point, so that the walkers mix between the modes.
* :class:`GridPosterior`: an exact reference for two-dimensional tasks with a box prior. The log-likelihood
  is evaluated once per observation on a fine grid of cell centres; for any β the cells are drawn with
  probabilities ∝ π p^β and a point is placed uniformly in the cell.
* The Gaussian linear task's analytic power posterior is ``GaussianLinear.sample_power_posterior``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import emcee
import numpy as np
import torch

from .tasks import Task, _rand

__all__ = ["GridPosterior", "MCMCResult", "mcmc_power_posterior"]

Tensor = torch.Tensor


@dataclass
class MCMCResult:
    """Thinned samples (n, d), the ensemble's mean acceptance fraction and the number of log-density calls."""

    samples: Tensor
    acceptance: float
    n_evals: int


def _symmetry_move(maps: list[Callable[[Tensor], Tensor]]) -> emcee.moves.MHMove:
    """A Metropolis move that sends each walker to g(θ) for one of ``maps`` drawn uniformly. The maps are the
    task's symmetries: volume-preserving and closed under inverses, so the proposal is symmetric (log-ratio 0),
    and the target is invariant under them, so the move is accepted (up to rounding)."""
    def propose(coords: np.ndarray, random: np.random.RandomState) -> tuple[np.ndarray, np.ndarray]:
        pick = random.randint(len(maps), size=len(coords))
        out = coords.copy()
        for k, g in enumerate(maps):
            sel = pick == k
            if sel.any():
                out[sel] = g(torch.as_tensor(coords[sel])).numpy()
        return out, np.zeros(len(coords))

    return emcee.moves.MHMove(propose)


def mcmc_power_posterior(task: Task, x: Tensor, beta: float, n: int, *, walkers: int = 32, burn: int = 300,
                         thin: int = 5, init_pool: int = 4096, seed: int = 0, jump: float = 0.1) -> MCMCResult:
    """n samples of p_β(θ | x) from one emcee run: ``burn`` discarded steps, then ceil(n / walkers) · ``thin``
    steps thinned by ``thin``. The density is evaluated in float64 on the task's device, all walkers at once.

    Where the task has symmetries (:meth:`Task.symmetries`: two moons' two crescents, SLCP's four sign modes),
    a fraction ``jump`` of the steps is a mode jump (:func:`_symmetry_move`) instead of a stretch move: the stretch
    move alone cannot move a walker between well-separated modes, so the share of walkers in each mode stays at
    what the start gave it (on two moons, 41–60 % in one crescent instead of 50 %)."""
    if n < 1 or walkers < 2 * task.theta_dim or walkers % 2 or burn < 0 or thin < 1:
        raise ValueError("need n >= 1, an even number of walkers >= 2 * theta_dim, burn >= 0, thin >= 1")
    if not 0 <= jump < 1:
        raise ValueError(f"jump must be in [0, 1), got {jump}")
    b = float(task.check_beta(beta))
    x = task._x(x)
    if x.ndim != 1:
        raise ValueError("x must be one observation of shape (x_dim,)")
    g = torch.Generator(device="cpu").manual_seed(seed)
    pool = task.sample_prior(init_pool, g)
    logp = task.log_power_posterior_unnorm(pool, x, b).double().cpu()
    if not torch.isfinite(logp).any():
        raise ValueError("no prior draw has positive likelihood; cannot initialise the walkers")
    w = torch.softmax(torch.where(torch.isfinite(logp), logp, torch.tensor(-math.inf, dtype=logp.dtype)), 0)
    if int((w > 0).sum()) >= walkers:  # importance resampling without replacement: distinct walkers
        start = pool[torch.multinomial(w, walkers, replacement=False, generator=g)]
    else:  # a posterior too narrow for the pool: start from the best distinct draws, burn-in does the rest
        start = pool[torch.topk(logp, walkers).indices]
    n_evals = 0

    def log_prob(theta: np.ndarray) -> np.ndarray:
        nonlocal n_evals
        n_evals += theta.shape[0]
        th = torch.as_tensor(theta, dtype=task.dtype, device=task.device)
        return task.log_power_posterior_unnorm(th, x, b).double().cpu().numpy()

    maps = task.symmetries()
    moves = [(emcee.moves.StretchMove(), 1 - jump), (_symmetry_move(maps), jump)] if maps and jump > 0 else None
    sampler = emcee.EnsembleSampler(walkers, task.theta_dim, log_prob, vectorize=True, moves=moves)
    sampler.random_state = np.random.RandomState(seed).get_state()
    keep = math.ceil(n / walkers) * thin
    sampler.run_mcmc(start.double().cpu().numpy(), burn + keep)
    chain = sampler.get_chain(discard=burn, thin=thin, flat=True)  # (keep/thin · walkers, d)
    idx = np.linspace(0, len(chain) - 1, n).round().astype(int)
    samples = torch.as_tensor(chain[idx], dtype=task.dtype, device=task.device)
    return MCMCResult(samples, float(np.mean(sampler.acceptance_fraction)), n_evals)


class GridPosterior:
    """Exact power posteriors of a two-dimensional box-prior task for one observation, on a grid."""

    def __init__(self, task: Task, x: Tensor, resolution: int = 1500, chunk: int = 250_000):
        if task.theta_dim != 2 or task.lower is None:
            raise ValueError("GridPosterior needs a two-dimensional task with a box prior")
        if resolution < 10:
            raise ValueError("resolution must be >= 10")
        self.task, self.resolution = task, resolution
        lo, hi = task.lower.double().cpu(), task.upper.double().cpu()
        self.cell = (hi - lo) / resolution
        axes = [lo[i] + (torch.arange(resolution, dtype=torch.float64) + 0.5) * self.cell[i] for i in range(2)]
        self.axes = axes
        g0, g1 = torch.meshgrid(axes[0], axes[1], indexing="ij")
        pts = torch.stack([g0.reshape(-1), g1.reshape(-1)], -1)
        xx = task._x(x)
        ll = [task.log_likelihood(c.to(task.device, task.dtype), xx).double().cpu() for c in pts.split(chunk)]
        self.points, self.loglik = pts, torch.cat(ll)  # prior is flat on the box: π p^β ∝ p^β on the grid
        if not torch.isfinite(self.loglik).any():
            raise ValueError("the likelihood vanishes on the whole grid")

    def probs(self, beta: float) -> Tensor:
        """Cell probabilities of p_β(θ | x), shape (resolution², ), summing to 1."""
        b = float(self.task.check_beta(beta))
        return torch.softmax(b * self.loglik, 0)

    def density(self, beta: float) -> Tensor:
        """The power posterior's density on the grid, (resolution, resolution), indexed [i0, i1]."""
        return (self.probs(beta) / self.cell.prod()).reshape(self.resolution, self.resolution)

    def moments(self, beta: float) -> tuple[Tensor, Tensor]:
        """Mean (2,) and covariance (2, 2) of p_β(θ | x) (cell-centre quadrature plus the uniform-cell term)."""
        p = self.probs(beta)
        mean = p @ self.points
        d = self.points - mean
        cov = (p[:, None] * d).T @ d + torch.diag(self.cell**2 / 12)
        return mean, cov

    def sample(self, beta: float, n: int, generator: torch.Generator | None = None) -> Tensor:
        """n exact draws (up to the grid's resolution) from p_β(θ | x)."""
        if n < 1:
            raise ValueError("n must be >= 1")
        p = self.probs(beta)
        gdev = generator.device if generator is not None else torch.device("cpu")
        idx = torch.multinomial(p.to(gdev), n, replacement=True, generator=generator).cpu()
        u = _rand("rand", (n, 2), generator, torch.device("cpu"), torch.float64) - 0.5
        th = self.points[idx] + u * self.cell
        return th.to(self.task.device, self.task.dtype)
