"""Experiment harness of notebook 17: train one β-conditioned flow per (task, route), score it against exact or
MCMC power posteriors over β, time it against one emcee run per (x, β), and the SNIS weights' ESS.

Paper: Sun, Nicholls, Lee, ICML 2026 (arXiv 2601.22367). Notebook: ``notebooks/17-amortized-gbi.ipynb``.

Two random streams, consumed in a fixed order so that a notebook calling these functions in the order below
reproduces its numbers exactly: ``generator`` (a CPU ``torch.Generator``) draws observations, simulations and
reference samples; torch's global generator initialises and samples the flows.

1. :func:`train_all` (observations, then one :func:`train_tempered_npe` per route, task by task);
2. :func:`accuracy_table` (flow samples interleaved with :class:`References` draws), :func:`baselines`;
3. :func:`crescent_widths` (no randomness), :func:`ess_curves` (``generator``), :func:`amortization`;
4. :func:`explorer_frames` (flow samples).

A task's settings (``spec``) are a dict with ``kw`` (task keywords), ``n_obs``, ``betas``, ``reference``
(``"analytic"``, ``"grid"`` or ``"mcmc"``), ``routes`` (route → training β range), ``steps``, ``flow``
(:func:`make_flow` keywords), ``mcmc_betas``, ``mcmc_obs`` and optionally ``mcmc`` (emcee overrides).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from ...common.timing import timed
from .metrics import c2st, c2st_outcomes, c2st_score, mmd2
from .npe import TrainResult, ess, snis_weights, train_tempered_npe
from .reference import GridPosterior, MCMCResult, mcmc_power_posterior
from .tasks import Task, make_task

__all__ = [
    "RADIUS_EDGES", "ROUTE_LABELS", "MoonFrames", "References", "Trained", "accuracy_table", "amortization",
    "baselines", "crescent_widths", "ess_curves", "explorer_frames", "mass_levels", "train_all", "weighted_iqr",
]

Tensor = torch.Tensor
ROUTE_LABELS = {"synth": "route (i) synthesis", "snis": "route (ii) SNIS"}
RADIUS_EDGES = np.linspace(0.0, 0.25, 61)  # histogram bins of the two-moons radius (the crescent's thickness)


@dataclass
class Trained:
    """The tasks, their observations (drawn from the model at β = 1) and one trained estimator per
    (task, route)."""

    tasks: dict[str, Task]
    obs: dict[str, Tensor]
    fits: dict[tuple[str, str], TrainResult]


def train_all(specs: Mapping[str, Mapping[str, Any]], *, n_sims: int, batch: int, lr: float,
              generator: torch.Generator, device: torch.device | str = "cpu") -> Trained:
    """For each task in ``specs`` (in order): ``n_obs`` observations x = simulate(θ), θ ~ π, then one
    :func:`train_tempered_npe` per route on its β range, each on ``n_sims`` fresh simulations."""
    tasks, obs, fits = {}, {}, {}
    for name, spec in specs.items():
        task = make_task(name, device=device, **spec["kw"])
        tasks[name] = task
        obs[name] = task.simulate(task.sample_prior(spec["n_obs"], generator), generator)
        for route, beta_range in spec["routes"].items():
            fits[name, route] = train_tempered_npe(
                task, route, beta_range=beta_range, n_sims=n_sims, steps=spec["steps"], batch=batch, lr=lr,
                generator=generator, **spec["flow"])
    return Trained(tasks, obs, fits)


class References:
    """Reference draws of p_β(θ | x) for every (task, observation, β), made once and cached.

    ``draw(name, i, beta)`` gives ``n`` samples from the task's reference: the analytic power posterior, an
    exact :class:`GridPosterior` (``grid``² cells) or an emcee run (seed 1000 + ``rep``); ``rep=1`` is an
    independent second draw (the noise floor). Every emcee run is timed and kept in ``runs`` under
    ``(name, i, beta, seed)`` with its seconds: the non-amortised baseline of the amortization comparison.
    """

    def __init__(self, trained: Trained, specs: Mapping[str, Mapping[str, Any]], *, n: int, grid: int,
                 mcmc: Mapping[str, Any], generator: torch.Generator):
        if n < 10:
            raise ValueError(f"need n >= 10 reference draws (the two-sample metrics need 10), got {n}")
        self.tasks, self.obs, self.specs = trained.tasks, trained.obs, specs
        self.n, self.resolution, self.mcmc_settings, self.generator = n, grid, dict(mcmc), generator
        self.grids: dict[tuple[str, int], GridPosterior] = {}
        self.runs: dict[tuple[str, int, float, int], tuple[MCMCResult, float]] = {}
        self.draws: dict[tuple[str, int, float, int], Tensor] = {}
        self._radii: dict[tuple[str, int], Tensor] = {}

    def grid(self, name: str, i: int) -> GridPosterior:
        """The exact grid posterior of observation ``i`` (two-dimensional box-prior tasks)."""
        if (name, i) not in self.grids:
            self.grids[name, i] = GridPosterior(self.tasks[name], self.obs[name][i], self.resolution)
        return self.grids[name, i]

    def mcmc(self, name: str, i: int, beta: float, seed: int) -> MCMCResult:
        """One timed emcee run of ``n`` thinned samples for (x_i, β) (task-level settings override the rest)."""
        key = (name, i, beta, seed)
        if key not in self.runs:
            settings = {**self.mcmc_settings, **self.specs[name].get("mcmc", {})}
            task, x = self.tasks[name], self.obs[name][i]
            self.runs[key] = timed(task.device, mcmc_power_posterior, task, x, beta, self.n, seed=seed,
                                   **settings)
        return self.runs[key][0]

    def draw(self, name: str, i: int, beta: float, rep: int = 0) -> Tensor:
        """``n`` draws of p_β(θ | x_i) from the task's reference; ``rep`` > 0 gives independent repeats."""
        key = (name, i, beta, rep)
        if key not in self.draws:
            kind, task, x = self.specs[name]["reference"], self.tasks[name], self.obs[name][i]
            if kind == "analytic":
                self.draws[key] = task.sample_power_posterior(x, beta, self.n, self.generator)
            elif kind == "grid":
                self.draws[key] = self.grid(name, i).sample(beta, self.n, self.generator)
            elif kind == "mcmc":
                self.draws[key] = self.mcmc(name, i, beta, seed=1000 + rep).samples
            else:
                raise ValueError(f"unknown reference {kind!r}; valid: 'analytic', 'grid', 'mcmc'")
        return self.draws[key]

    def exact_radius(self, name: str, i: int, beta: float) -> tuple[Tensor, Tensor]:
        """The exact law of the two-moons radius under p_β(θ | x_i): every grid cell's radius (float64, CPU)
        and its probability."""
        g = self.grid(name, i)
        if (name, i) not in self._radii:
            task = self.tasks[name]
            self._radii[name, i] = task.radius(g.points.to(task.device, task.dtype), self.obs[name][i]).double().cpu()
        return self._radii[name, i], g.probs(beta)

    def radius_density(self, name: str, i: int, beta: float, edges: np.ndarray = RADIUS_EDGES) -> np.ndarray:
        """Histogram density of the exact radius law on ``edges``."""
        r, p = self.exact_radius(name, i, beta)
        return np.histogram(r.numpy(), bins=edges, weights=p.numpy(), density=True)[0]


def accuracy_table(trained: Trained, refs: References, specs: Mapping[str, Mapping[str, Any]],
                   outcomes: dict[tuple[str, str, int, float], np.ndarray] | None = None
                   ) -> tuple[pd.DataFrame, dict[tuple[str, str, int, float], Tensor]]:
    """Every (task, route, observation, β in the route's range): ``refs.n`` draws of q_φ(· | x, β), timed,
    scored against as many reference draws by C2ST and MMD², with tr Cov_q and, for an analytic reference,
    the per-dimension ratio std(q) / std(exact) (column ``std_ratio``). Returns the table and the draws; with
    ``outcomes`` (a dict) it also keeps each C2ST's per-draw-pair outcomes (:func:`c2st_outcomes`) under the
    draws' key, for a bootstrap over the draws."""
    rows, samples = [], {}
    for (name, route), fitted in trained.fits.items():
        spec, task = specs[name], trained.tasks[name]
        lo, hi = spec["routes"][route]
        for i in range(spec["n_obs"]):
            x = trained.obs[name][i]
            for beta in [b for b in spec["betas"] if lo <= b <= hi]:
                q, seconds = timed(task.device, fitted.posterior.sample, x, beta, refs.n)
                ref = refs.draw(name, i, beta)
                right = c2st_outcomes(ref, q)
                row = dict(task=name, route=route, obs=i, beta=beta, c2st=c2st_score(right), mmd2=mmd2(ref, q),
                           seconds=seconds, trace=float(q.var(0).sum()))
                if outcomes is not None:
                    outcomes[name, route, i, beta] = right
                if spec["reference"] == "analytic":
                    row["std_ratio"] = (q.std(0) / task.analytic_power_posterior(x, beta)[1]).cpu().numpy()
                rows.append(row)
                samples[name, route, i, beta] = q
    return pd.DataFrame(rows), samples


def baselines(refs: References, specs: Mapping[str, Mapping[str, Any]],
              outcomes: dict[tuple[str, str, int, float], np.ndarray] | None = None
              ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per task: the noise floor (reference against an independent reference draw: first observation, every
    other β) and one emcee run per (x_i, β) for the first ``mcmc_obs`` observations and ``mcmc_betas`` (seed
    i), scored against the same reference as the flow, with its acceptance fraction. With ``outcomes`` (a dict)
    it keeps each emcee run's C2ST outcomes under ``(task, "mcmc", i, β)``."""
    floor_rows, mcmc_rows = [], []
    for name, spec in specs.items():
        for beta in spec["betas"][::2]:
            a, b = refs.draw(name, 0, beta), refs.draw(name, 0, beta, rep=1)
            floor_rows.append(dict(task=name, beta=beta, c2st=c2st(a, b), mmd2=mmd2(a, b)))
        for i in range(spec["mcmc_obs"]):
            for beta in spec["mcmc_betas"]:
                run = refs.mcmc(name, i, beta, seed=i)
                ref = refs.draw(name, i, beta)
                right = c2st_outcomes(ref, run.samples)
                if outcomes is not None:
                    outcomes[name, "mcmc", i, beta] = right
                mcmc_rows.append(dict(task=name, obs=i, beta=beta, c2st=c2st_score(right),
                                      mmd2=mmd2(ref, run.samples), acceptance=run.acceptance))
    return pd.DataFrame(floor_rows), pd.DataFrame(mcmc_rows)


def weighted_iqr(values: Tensor, weights: Tensor) -> float:
    """Interquartile range of the discrete law putting mass ``weights`` (summing to 1) on ``values``: the
    quantile u is the smallest value whose cumulative weight reaches u (numpy's ``inverted_cdf``)."""
    order = torch.argsort(values)
    cum = torch.cumsum(weights[order], 0)
    q25, q75 = (values[order][torch.searchsorted(cum, torch.tensor(u, dtype=cum.dtype))] for u in (0.25, 0.75))
    return float(q75 - q25)


def crescent_widths(refs: References, samples: Mapping[tuple[str, str, int, float], Tensor], name: str,
                    betas: list[float], route: str = "synth") -> pd.DataFrame:
    """Two moons: the crescent's width as the spread of the moon radius r implied by θ, learned against exact,
    per observation and β: ``ratio`` = std_q(r) / std_exact(r) (outlier-sensitive), ``iqr_ratio`` the same for
    the interquartile range."""
    rows = []
    for i in range(refs.specs[name]["n_obs"]):
        for beta in betas:
            r_cells, p = refs.exact_radius(name, i, beta)
            m = float((p * r_cells).sum())
            exact_sd = float(torch.sqrt((p * (r_cells - m) ** 2).sum()))
            rq = refs.tasks[name].radius(samples[name, route, i, beta], refs.obs[name][i]).double().cpu()
            q_iqr = float(rq.quantile(0.75) - rq.quantile(0.25))
            rows.append(dict(obs=i, beta=beta, exact=exact_sd, learned=float(rq.std()),
                             ratio=float(rq.std()) / exact_sd, iqr_ratio=q_iqr / weighted_iqr(r_cells, p)))
    return pd.DataFrame(rows)


def ess_curves(tasks: Mapping[str, Task], n: int, claim_betas: list[float], generator: torch.Generator, *,
               points: int = 40, beta_hi: float = 2.0) -> tuple[pd.DataFrame, dict[str, list[float]]]:
    """Route (ii)'s weights on one base set of ``n`` simulations at β = 1 per task: ESS/N of
    w̃ ∝ p(x | θ)^(β−1) on ``points`` log-spaced β in [0.1, min(``beta_hi``, 0.95 β_max)], and at ``claim_betas``."""
    rows, at_claim = [], {}
    for name, task in tasks.items():
        th, x = task.sample_tempered_joint(n, 1.0, generator)
        ll = task.log_likelihood(th, x).double()
        for beta in np.geomspace(0.1, min(beta_hi, 0.95 * task.beta_max), points):
            rows.append(dict(task=name, beta=float(beta), ess_frac=float(ess(snis_weights(ll, float(beta)))) / n))
        at_claim[name] = [float(ess(snis_weights(ll, b))) / n for b in claim_betas]
    return pd.DataFrame(rows), at_claim


def amortization(trained: Trained, accuracy: pd.DataFrame, refs: References, route: str = "synth"
                 ) -> tuple[dict[str, dict[str, float]], pd.DataFrame]:
    """Wall-clock of the amortized estimator against one emcee run per (x, β), per task.

    Pairs every timed emcee baseline run (seed = observation index; for tasks whose reference *is* MCMC, the
    reference runs, seed 1000) with the time to draw as many samples from q at the same (x, β). Per task: the
    one-off cost C (simulation + training), the median per-query times t_q and t_MCMC, the speed-up
    t_MCMC / t_q and the break-even number of queries Q* = C / (t_MCMC − t_q) (∞ if q is not faster)."""
    timing, pairs = {}, []
    for name in trained.tasks:
        fitted = trained.fits[name, route]
        rows = accuracy[(accuracy.task == name) & (accuracy.route == route)]
        flow_t = rows.set_index(["obs", "beta"]).seconds
        runs = {(i, b): s for (n_, i, b, seed), (_, s) in refs.runs.items() if n_ == name and seed == i}
        if not runs:
            runs = {(i, b): s for (n_, i, b, seed), (_, s) in refs.runs.items() if n_ == name and seed == 1000}
        if not runs:
            raise ValueError(f"{name}: no timed emcee run to compare with; run baselines() first")
        for key, s in runs.items():
            if key in flow_t.index:
                pairs.append(dict(task=name, obs=key[0], beta=key[1], mcmc=s, flow=float(flow_t[key])))
        t_mcmc, t_q = float(np.median(list(runs.values()))), float(flow_t.median())
        timing[name] = dict(one_off_s=fitted.seconds, sim_s=fitted.sim_seconds, train_s=fitted.train_seconds,
                            flow_per_query_s=t_q, mcmc_per_query_s=t_mcmc, speedup_per_query=t_mcmc / t_q,
                            break_even_queries=fitted.seconds / (t_mcmc - t_q) if t_mcmc > t_q else float("inf"))
    return timing, pd.DataFrame(pairs)


def mass_levels(density: np.ndarray, masses: tuple[float, ...] = (0.9, 0.5)) -> list[float]:
    """Density thresholds, ascending, of the highest-density regions of a gridded density (equal cells) that
    hold each fraction in ``masses`` of the total: the contour levels of credible regions."""
    flat = np.sort(np.asarray(density, dtype=float).ravel())[::-1]
    if flat.size == 0 or not np.isfinite(flat).all() or flat[-1] < 0 or flat.sum() <= 0:
        raise ValueError("density must be a non-empty array of finite, non-negative values with positive sum")
    if not all(0 < m < 1 for m in masses):
        raise ValueError(f"masses must lie in (0, 1), got {masses}")
    cum = np.cumsum(flat) / flat.sum()
    return sorted(float(flat[np.searchsorted(cum, m)]) for m in masses)


@dataclass
class MoonFrames:
    """What the two-moons explorer draws per β: flow samples ``q`` and their radii ``r``, the exact radius
    density ``exact`` on ``edges`` (fine grid) and a coarse ``grid`` for the density contours."""

    betas: list[float]
    grid: GridPosterior
    q: dict[float, np.ndarray]
    r: dict[float, np.ndarray]
    exact: dict[float, np.ndarray]
    edges: np.ndarray

    @property
    def ymax(self) -> float:
        """A common y-limit for the radius histograms."""
        return 1.1 * max(float(v.max()) for v in self.exact.values())


def explorer_frames(trained: Trained, refs: References, name: str, betas: list[float], *, i: int = 0,
                    route: str = "synth", contour_grid: int = 300, edges: np.ndarray = RADIUS_EDGES) -> MoonFrames:
    """Precompute the explorer's frames for observation ``i`` of ``name`` at every β in ``betas``."""
    task, x, post = trained.tasks[name], trained.obs[name][i], trained.fits[name, route].posterior
    q = {b: post.sample(x, b, refs.n).cpu().numpy() for b in betas}
    r = {b: task.radius(torch.as_tensor(q[b], device=task.device), x).cpu().numpy() for b in betas}
    exact = {b: refs.radius_density(name, i, b, edges) for b in betas}
    return MoonFrames(list(betas), GridPosterior(task, x, contour_grid), q, r, exact, edges)
