"""Experiment harness of notebook 01: the batched (τ, seed, α, learning rate) grid at a fixed sample budget, how a
grid is read (best learning rate per cell, soft-argmin α̂*(τ), samples to a target), the six-grid landscape, its
summary, the sample-cost curves (measured and bound proxy) and the Newton–Schulz inexactness figure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ...common.linalg import newton_schulz5
from ...common.numerics import loglog_slope
from ...common.seeding import derive
from .method import Tensor, get_lmo, lmo_spectral, momentum_direction, tau_nice_indices, unit_length
from .problems import LeastSquares
from .theory import ProxyConstants, optimal_alpha_theory, theory_sample_cost

__all__ = [
    "GridKey", "GridResult", "GridSummary", "LRGrid", "MeasuredCost", "NS5Inexactness", "OffsetStudy", "ProxyCost",
    "abc_rows", "alpha_hat", "best_lr_curves", "best_over_lr", "grid_offset_study", "lr_edge_fraction", "lr_grid",
    "measured_sample_cost", "ns5_inexactness", "proxy_alpha_min_step", "proxy_sample_cost", "run_grid", "run_landscape",
    "samples_to_target", "soft_argmin", "summarize",
]

# --------------------------------------------------------------------------------------------------------------
# The batched (τ, α, lr, seed) grid
# --------------------------------------------------------------------------------------------------------------

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
             budget: int, n_seeds: int, checkpoints: int = 32, seed: int = 0, nesterov: bool = False,
             exact_grad: bool = False) -> GridResult:
    """Run the momentum LMO method from ``x₀ = 0`` for every (τ, seed, α, lr) at a fixed sample budget.

    For each τ, all ``n_seeds × len(alphas) × lrs.shape[2]`` runs are one batched tensor computation of
    ``budget/τ`` steps; the runs of one seed share their τ-nice mini-batches (common random numbers: the
    configurations are compared on the same sample path). Momentum starts at ``m₀ = g₀``.

    ``exact_grad`` replaces every mini-batch gradient by the full gradient while keeping ``budget/τ`` steps:
    the step count of batch size τ without its sampling noise (then every seed is the same run). It separates
    what the batch size does through the number of steps from what it does through the ABC variance.
    """
    lrs = np.asarray(lrs, dtype=float)
    _check_grid(taus, alphas, lrs, budget, checkpoints, problem.n)
    fn = get_lmo(lmo)
    dev, dt, nb = problem.a.device, problem.a.dtype, len(problem.shape)
    na, nl = len(alphas), lrs.shape[2]
    alpha = torch.tensor(alphas, dtype=dt, device=dev).repeat_interleave(nl).reshape(1, -1, *[1] * nb)
    out = np.empty((len(taus), n_seeds, na, nl, checkpoints))
    for t_i, tau in enumerate(taus):
        lr = torch.tensor(lrs[t_i], dtype=dt, device=dev).reshape(1, -1, *[1] * nb)   # α-major, lr-minor
        gen = torch.Generator(device=dev).manual_seed(derive(seed, "tau", int(tau)))
        out[t_i] = _run_one_tau(problem, fn, int(tau), alpha, lr, budget, n_seeds, checkpoints, gen,
                                nesterov, exact_grad).reshape(n_seeds, na, nl, checkpoints)
    samples = budget // checkpoints * np.arange(1, checkpoints + 1)
    return GridResult(lmo=lmo, taus=np.asarray(taus), alphas=np.asarray(alphas, dtype=float), lrs=lrs,
                      samples=samples, loss=out)


def _run_one_tau(problem: LeastSquares, fn: Callable[..., Tensor], tau: int, alpha: Tensor, lr: Tensor,
                 budget: int, n_seeds: int, checkpoints: int, gen: torch.Generator, nesterov: bool,
                 exact_grad: bool = False, chunk: int = 512) -> np.ndarray:
    steps, every = budget // tau, budget // tau // checkpoints
    x = torch.zeros(n_seeds, alpha.shape[1], *problem.shape, dtype=problem.a.dtype, device=problem.a.device)
    m, rec = None, []
    for start in range(0, steps, chunk):
        idx_chunk = tau_nice_indices(problem.n, tau, (min(chunk, steps - start), n_seeds), gen, x.device)
        for j, idx in enumerate(idx_chunk):
            g = problem.grad(x, None if exact_grad else idx)
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


# --------------------------------------------------------------------------------------------------------------
# The notebook's experiments
# --------------------------------------------------------------------------------------------------------------

GridKey = tuple[str, str]  # (problem name, LMO name)


def run_landscape(problems: Mapping[str, LeastSquares], grids: Sequence[GridKey], taus: Sequence[int],
                  alphas: Sequence[float], budget: int, n_seeds: int, checkpoints: int, lr_count: int,
                  lr_ratio: float, seed: int = 0, lr_offset: float = 0.0) -> dict[GridKey, GridResult]:
    """Run :func:`run_grid` for every (problem, LMO) of ``grids``. Each grid's learning rates are ``lr_count``
    values ×``lr_ratio`` apart around the bound proxy's step ``η* ≈ √(Δ₀ τ α / (2 L N))`` (its small-α form at
    τ = α = 1, scaled by :func:`lr_grid`), divided by the LMO's Euclidean step length (:func:`unit_length`) so
    that the LMOs take comparable steps; ``lr_offset`` shifts the whole grid by that fraction of a step
    (×``lr_ratio ** lr_offset``)."""
    out = {}
    for prob, lmo in grids:
        P = problems[prob]
        lrs = lr_grid(_lr_center(P, lmo, budget) * lr_ratio**lr_offset, taus, alphas, lr_count, lr_ratio)
        out[prob, lmo] = run_grid(P, lmo, taus, alphas, lrs, budget, n_seeds, checkpoints, seed=seed)
    return out


def _lr_center(P: LeastSquares, lmo: str, budget: int) -> float:
    """The bound proxy's step ``√(Δ₀ / (2 L N))`` divided by the LMO's Euclidean step length."""
    c = P.proxy_constants()
    return math.sqrt(c.delta0 / (2 * c.L * budget)) / unit_length(lmo, P.shape)


@dataclass
class GridSummary:
    """What a grid says about the diagonal shift: the soft-argmin ``alpha_hat`` per τ, the least-squares
    ``slope`` of ``log α̂*`` on ``log τ`` (and per seed, ``seed_slopes``), ``ratio = α̂*(τ_max)/α̂*(τ_min)``, and
    ``edge``, the fraction of cells whose best learning rate is on the grid's edge (:func:`lr_edge_fraction`)."""

    alpha_hat: np.ndarray
    slope: float
    seed_slopes: np.ndarray
    ratio: float
    edge: float


def summarize(res: GridResult, temperature: float) -> GridSummary:
    """The :class:`GridSummary` of one grid (soft-argmin at ``temperature``, in log2 α)."""
    a_hat = alpha_hat(res, temperature)
    per_seed = alpha_hat(res, temperature, per_seed=True)
    return GridSummary(alpha_hat=a_hat, slope=loglog_slope(res.taus, a_hat),
                       seed_slopes=np.array([loglog_slope(res.taus, a) for a in per_seed]),
                       ratio=float(a_hat[-1] / a_hat[0]), edge=lr_edge_fraction(res))


@dataclass(frozen=True)
class LRGrid:
    """A learning-rate grid for :func:`run_landscape`: ``count`` rates ``ratio`` apart, on the α grid ``alphas``."""

    name: str
    ratio: float
    count: int
    alphas: tuple[float, ...]


@dataclass
class OffsetStudy:
    """The slope of ``log α̂*`` on ``log τ`` for one (problem, LMO) on every learning-rate grid of ``grids`` at every
    offset of ``offsets`` (fractions of a grid step): ``slopes[grid, offset]`` from the seed mean, and
    ``seed_slopes[grid, offset, seed]`` one per seed (the learning rate still chosen on the seed mean)."""

    grids: list[LRGrid]
    offsets: list[float]
    slopes: np.ndarray
    seed_slopes: np.ndarray

    @property
    def median(self) -> float:
        """The median slope over every grid and offset (seed-mean α̂*)."""
        return float(np.median(self.slopes))

    @property
    def seed_medians(self) -> np.ndarray:
        """Per seed, the median of its slopes over every grid and offset: one value per seed, for an interval
        over seeds that the placement of the learning rates cannot move much."""
        return np.median(self.seed_slopes.reshape(-1, self.seed_slopes.shape[-1]), axis=0)

    def with_run(self, summary: GridSummary, offset: float = 0.0) -> OffsetStudy:
        """This one-grid study with a run already made at ``offset`` (its :class:`GridSummary`, e.g. the main
        landscape at offset 0) added in front, so that offset is not run twice."""
        if len(self.grids) != 1:
            raise ValueError("with_run joins a run to a study of one learning-rate grid")
        return OffsetStudy(grids=self.grids, offsets=[offset, *self.offsets],
                           slopes=np.concatenate([[[summary.slope]], self.slopes], axis=1),
                           seed_slopes=np.concatenate([summary.seed_slopes[None, None], self.seed_slopes], axis=1))


def grid_offset_study(problems: Mapping[str, LeastSquares], key: GridKey, taus: Sequence[int],
                      grids: Sequence[LRGrid], offsets: Sequence[float], budget: int, n_seeds: int, checkpoints: int,
                      temperature: float, seed: int = 0, exact_grad: bool = False) -> OffsetStudy:
    """:func:`run_landscape` of the one grid ``key`` for every learning-rate grid and offset, summarised by the
    slope of :func:`summarize` (soft-argmin at ``temperature``). Shows how much the slope depends on where the
    learning rates happen to fall, instead of reporting the one grid that was kept.

    The offsets of one grid run as one batched :func:`run_grid` (their learning rates side by side): the same
    mini-batches as separate runs (they depend on the seed and τ only), at a fraction of the time.
    ``exact_grad`` runs the noise-free control of :func:`run_grid`."""
    prob, lmo = key
    P, slopes = problems[prob], np.empty((len(grids), len(offsets)))
    per_seed = np.empty((len(grids), len(offsets), n_seeds))
    for i, g in enumerate(grids):
        center = _lr_center(P, lmo, budget)
        lrs = np.concatenate([lr_grid(center * g.ratio**off, taus, g.alphas, g.count, g.ratio) for off in offsets],
                             axis=2)                                                   # (τ, α, offsets · count)
        res = run_grid(P, lmo, taus, g.alphas, lrs, budget, n_seeds, checkpoints, seed=seed, exact_grad=exact_grad)
        for j in range(len(offsets)):
            cut = slice(j * g.count, (j + 1) * g.count)
            part = GridResult(lmo=res.lmo, taus=res.taus, alphas=res.alphas, lrs=res.lrs[:, :, cut],
                              samples=res.samples, loss=res.loss[:, :, :, cut])
            s = summarize(part, temperature)
            slopes[i, j], per_seed[i, j] = s.slope, s.seed_slopes
    return OffsetStudy(grids=list(grids), offsets=list(offsets), slopes=slopes, seed_slopes=per_seed)


def abc_rows(problems: Mapping[str, LeastSquares], taus: Sequence[int], budget: int) -> list[dict[str, float]]:
    """One row per (problem, τ): the τ-nice ABC constants, the proxy's noise level σ_τ and its optimal α*(τ) at the
    sample budget (and PyTorch's β* = 1 − α*)."""
    rows = []
    for k, P in problems.items():
        c = P.proxy_constants()
        a_star = optimal_alpha_theory(taus, budget, c)
        for tau, a in zip(taus, a_star, strict=True):
            abc = P.abc(tau)
            rows.append({"problem": k, "τ": tau, "A": abc.A, "B": abc.B, "C": abc.C,
                         "σ_τ (proxy)": float(c.sigma(tau)), "proxy α*(τ)": a, "proxy β* = 1 − α*": 1 - a})
    return rows


@dataclass
class MeasuredCost:
    """Per grid: ``best_final[τ]`` (best seed-mean final log10 loss over α and lr), the common ``target``
    (worst τ's best, loosened by the slack), ``samples[τ]`` to reach it, and whether that curve has an
    ``interior`` minimum (strictly below both ends)."""

    best_final: np.ndarray
    target: float
    samples: np.ndarray
    interior: bool


def measured_sample_cost(res: GridResult, target_slack: float) -> MeasuredCost:
    """Samples to a target fixed in advance as the worst τ's best final log10 loss plus ``target_slack`` decades,
    so that every τ reaches it within the budget (:func:`samples_to_target`)."""
    best_final = best_over_lr(res)[0].min(axis=1)
    target = best_final.max() + target_slack
    cost = samples_to_target(res, target)
    return MeasuredCost(best_final=best_final, target=float(target), samples=cost,
                        interior=bool(cost[1:-1].min() < min(cost[0], cost[-1])))


@dataclass
class ProxyCost:
    """Bound-proxy sample cost ``cost[eps_frac][τ]`` on ``taus`` (1..n, log-spaced) at ``ε = eps_frac·‖∇f(x₀)‖``,
    its minimiser ``tau_star`` at ``eps_main``, and ``grad0 = ‖∇f(x₀)‖``."""

    taus: np.ndarray
    grad0: float
    cost: dict[float, np.ndarray]
    tau_star: int


def proxy_sample_cost(problem: LeastSquares, eps_fracs: Sequence[float], eps_main: float,
                      points: int = 400) -> ProxyCost:
    """:func:`theory_sample_cost` of ``problem`` for τ = 1..n (``points`` log-spaced values, rounded and
    de-duplicated) at each tolerance ``ε = f·‖∇f(x₀)‖``, ``f`` in ``eps_fracs``, from ``x₀ = 0``."""
    if eps_main not in eps_fracs:
        raise ValueError(f"eps_main={eps_main} must be one of eps_fracs={list(eps_fracs)}")
    x0 = torch.zeros(1, 1, *problem.shape, device=problem.a.device, dtype=problem.a.dtype)
    g0 = float(torch.linalg.vector_norm(problem.grad(x0)))
    taus = np.unique(np.round(np.logspace(0, math.log10(problem.n), points)).astype(int))
    c = problem.proxy_constants()
    cost = {f: theory_sample_cost(taus, f * g0, c) for f in eps_fracs}
    return ProxyCost(taus=taus, grad0=g0, cost=cost, tau_star=int(taus[cost[eps_main].argmin()]))


def proxy_alpha_min_step(consts: ProxyConstants, n: int, budget: int) -> float:
    """Smallest step of ``log2 α*(τ)`` over τ = 1..n (bound proxy at the sample budget): ≥ 0 iff α* never
    decreases in τ."""
    return float(np.diff(np.log2(optimal_alpha_theory(np.arange(1, n + 1), budget, consts))).min())


@dataclass
class NS5Inexactness:
    """Newton–Schulz-5 as an LMO: ``sv_in`` (input singular values / ‖G‖_F) and ``sv_out`` (what NS5 maps them
    to) for one diagonal input; for random Gaussian matrices the ``cosine`` between NS5's output and the exact
    polar factor, and NS5's output singular values ``sv_random``."""

    sv_in: np.ndarray
    sv_out: np.ndarray
    cosine: np.ndarray
    sv_random: np.ndarray


def ns5_inexactness(p: int, q: int, count: int = 2000, seed: int = 0, points: int = 400) -> NS5Inexactness:
    """Feed NS5 (float64, CPU) a diagonal matrix with singular values spread over 1e-4..1, and ``count`` random
    Gaussian ``p × q`` matrices (from ``seed``) compared with the exact polar factor."""
    s = torch.logspace(-4, 0, points, dtype=torch.float64)
    X0 = torch.diag(s)
    ns = torch.diagonal(newton_schulz5(X0)).numpy()
    x_in = (s / torch.linalg.matrix_norm(X0)).numpy()
    G = torch.randn(count, p, q, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    exact, approx = lmo_spectral(G, batch_dims=1), lmo_spectral(G, batch_dims=1, method="ns5")
    cos = ((exact * approx).sum((-2, -1)) / (exact.norm(dim=(-2, -1)) * approx.norm(dim=(-2, -1)))).numpy()
    return NS5Inexactness(sv_in=x_in, sv_out=ns, cosine=cos, sv_random=torch.linalg.svdvals(approx).numpy().ravel())
