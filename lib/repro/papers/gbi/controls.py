"""The claims' control and the statistics their bootstrap recomputes (notebook 17).

Paper: Sun, Nicholls, Lee, ICML 2026 (arXiv 2601.22367). Notebook: ``notebooks/17-amortized-gbi.ipynb``.

**The β-blind control** (:func:`blind_draws`): what an estimator that ignores β answers at best, the exact
ordinary posterior p_1(θ | x) (β = 1) for every β, drawn afresh for each (x, β) as a flow samples afresh for each
query. It is what standard NPE, trained at β = 1 only, would give if it were perfect; a claim about the
β-conditioned flow must fail for it. It is measured exactly like the flow: the same reference draws, C2ST, widths
and spreads (:func:`scores`).

**The statistics** take the per-case arrays of draws, C2ST outcomes (:func:`repro.papers.gbi.c2st_outcomes`, one
row per draw pair) or moon radii, all with the ``n`` draws along axis 0, so that
:func:`repro.common.stats.bootstrap` resamples the draw pairs jointly over the cases (the i-th reference draw and
the i-th draw of q at every (x, β)). Each statistic is a function of the arrays alone (the exact values it compares
with are bound when it is made), so the control is scored by the same function as the flow.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ...common import stats
from .experiment import References, Trained
from .metrics import c2st_outcomes, c2st_score

Tensor = torch.Tensor
Statistic = Callable[..., float]


def cases(betas: Sequence[float], n_obs: int) -> list[tuple[int, float]]:
    """The cases (x_i, β): observation by observation, each in the order of ``betas``."""
    return [(i, float(b)) for i in range(n_obs) for b in betas]


def scored_betas(spec: Mapping[str, object], claim_betas: Sequence[float]) -> set[float]:
    """Where a task's control needs a C2ST: the claims' β, the β of route (ii)'s range and of the emcee runs."""
    lo = spec["routes"].get("snis", (np.inf,))[0]
    return set(claim_betas) | set(spec["mcmc_betas"]) | {b for b in spec["betas"] if b >= lo}


def blind_control(trained: Trained, refs: References, specs: Mapping[str, Mapping[str, object]],
                  claim_betas: Mapping[str, Sequence[float]], generator: torch.Generator
                  ) -> tuple[dict[str, dict], dict[str, dict], pd.DataFrame]:
    """The β-blind control of every task in ``claim_betas``: its draws at every β of route (i)'s range
    (:func:`blind_draws`), its C2ST outcomes where :func:`scored_betas` needs them (:func:`scores`), and a table
    of those C2STs (task, obs, beta, c2st)."""
    draws, outcomes, rows = {}, {}, []
    for name, betas in claim_betas.items():
        spec = specs[name]
        cs = cases([b for b in spec["betas"] if b <= spec["routes"]["synth"][1]], spec["n_obs"])
        draws[name] = blind_draws(trained, refs, name, cs, generator)
        keep = scored_betas(spec, betas)
        outcomes[name] = scores(refs, name, {c: draws[name][c] for c in cs if c[1] in keep})
        rows += [dict(task=name, obs=i, beta=b, c2st=c2st_score(o)) for (i, b), o in outcomes[name].items()]
    return draws, outcomes, pd.DataFrame(rows)


@dataclass
class Items:
    """The bootstrap items of the claims at given cases, for the flow (``q_*``) and its β-blind control (``c_*``):
    C2ST outcomes, draws as NumPy arrays, moon radii; ``mcmc`` the emcee runs' outcomes; ``exact_sd`` the analytic
    std (Gaussian linear)."""

    trained: Trained
    samples: Mapping[tuple, Tensor]  # accuracy_table's draws
    outcomes: Mapping[tuple, np.ndarray]  # accuracy_table's and baselines' C2ST outcomes
    blind: Mapping[str, Mapping[tuple[int, float], Tensor]]
    blind_outcomes: Mapping[str, Mapping[tuple[int, float], np.ndarray]]

    def q_out(self, name: str, route: str, cs: Sequence[tuple[int, float]]) -> tuple[np.ndarray, ...]:
        return tuple(self.outcomes[name, route, i, b] for i, b in cs)

    def mcmc(self, name: str, cs: Sequence[tuple[int, float]]) -> tuple[np.ndarray, ...]:
        return self.q_out(name, "mcmc", cs)

    def c_out(self, name: str, cs: Sequence[tuple[int, float]]) -> tuple[np.ndarray, ...]:
        return tuple(self.blind_outcomes[name][c] for c in cs)

    def q_draws(self, name: str, route: str, cs: Sequence[tuple[int, float]]) -> tuple[np.ndarray, ...]:
        return as_numpy(self.samples, [(name, route, i, b) for i, b in cs])

    def c_draws(self, name: str, cs: Sequence[tuple[int, float]]) -> tuple[np.ndarray, ...]:
        return as_numpy(self.blind[name], list(cs))

    def q_radii(self, name: str, cs: Sequence[tuple[int, float]], route: str = "synth") -> tuple[np.ndarray, ...]:
        return self._radii(name, {c: self.samples[name, route, *c] for c in cs})

    def c_radii(self, name: str, cs: Sequence[tuple[int, float]]) -> tuple[np.ndarray, ...]:
        return self._radii(name, {c: self.blind[name][c] for c in cs})

    def exact_sd(self, name: str, cs: Sequence[tuple[int, float]]) -> list[float]:
        task, obs = self.trained.tasks[name], self.trained.obs[name]
        return [float(task.analytic_power_posterior(obs[i], b)[1]) for i, b in cs]

    def _radii(self, name: str, draws: Mapping[tuple[int, float], Tensor]) -> tuple[np.ndarray, ...]:
        task, obs = self.trained.tasks[name], self.trained.obs[name]
        return tuple(task.radius(d, obs[i]).double().cpu().numpy() for (i, _), d in draws.items())


def trace_falls(accuracy: pd.DataFrame, name: str, route: str = "synth") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The relative falls 1 − tr Cov_q(β_{k+1}) / tr Cov_q(β_k) of ``accuracy_table``'s traces: the β grid, the
    falls (step × observation) and the analytic Gaussian-linear ones, 1 − (1 + β_k) / (1 + β_{k+1})."""
    tr = accuracy[(accuracy.task == name) & (accuracy.route == route)].pivot(index="beta", columns="obs",
                                                                               values="trace")
    b, t = tr.index.to_numpy(dtype=float), tr.to_numpy()
    return b, 1 - t[1:] / t[:-1], 1 - (1 + b[:-1]) / (1 + b[1:])


def blind_draws(trained: Trained, refs: References, name: str, cases: Sequence[tuple[int, float]],
                generator: torch.Generator) -> dict[tuple[int, float], Tensor]:
    """``refs.n`` fresh draws of the exact β = 1 posterior p_1(θ | x_i) for each case (i, β): the β-blind
    control. Needs an exact reference (analytic or grid); draws in the order of ``cases``."""
    kind, task = refs.specs[name]["reference"], trained.tasks[name]
    out = {}
    for i, beta in cases:
        x = trained.obs[name][i]
        if kind == "analytic":
            out[i, beta] = task.sample_power_posterior(x, 1.0, refs.n, generator)
        elif kind == "grid":
            out[i, beta] = refs.grid(name, i).sample(1.0, refs.n, generator)
        else:
            raise ValueError(f"{name}: the β-blind control needs an exact reference, not {kind!r}")
    return out


def scores(refs: References, name: str, draws: Mapping[tuple[int, float], Tensor]
           ) -> dict[tuple[int, float], np.ndarray]:
    """C2ST outcomes (``(n, 2)``, one row per draw pair) of each case's draws against the reference draw the flow
    was scored against (``refs.draw(name, i, beta)``)."""
    return {(i, beta): c2st_outcomes(refs.draw(name, i, beta), d) for (i, beta), d in draws.items()}


def as_numpy(draws: Mapping[object, Tensor], keys: Sequence[object]) -> tuple[np.ndarray, ...]:
    """The draws of ``keys``, in that order, as float64 NumPy arrays (the bootstrap's items)."""
    return tuple(draws[k].detach().double().cpu().numpy() for k in keys)


def max_accuracy(*outcomes: np.ndarray) -> float:
    """The largest C2ST accuracy over the cases (each case's outcomes: one array)."""
    return float(max(o.mean() for o in outcomes))


def max_accuracy_gap(*outcomes: np.ndarray) -> float:
    """The largest C2ST(first) − C2ST(second) over the cases: the first half of ``outcomes`` are the estimator's
    cases, the second half the baseline's at the same cases, in the same order."""
    k, rest = divmod(len(outcomes), 2)
    if rest or not k:
        raise ValueError("max_accuracy_gap: pass the estimator's outcomes, then as many of the baseline's")
    return float(max(a.mean() - b.mean() for a, b in zip(outcomes[:k], outcomes[k:], strict=True)))


def std_deviation(exact_std: Sequence[float | np.ndarray]) -> Statistic:
    """The statistic max over cases and dimensions of |std(draws) / exact std − 1| (the sample std,
    :func:`repro.common.stats.sd`, as ``Tensor.std``), the exact std of each case bound here."""
    exact = [np.asarray(e, dtype=float) for e in exact_std]

    def statistic(*draws: np.ndarray) -> float:
        _same_count(draws, exact, "std_deviation")
        return float(max(np.abs(stats.sd(d, axis=0) / e - 1).max() for d, e in zip(draws, exact, strict=True)))

    return statistic


def smallest_fall(groups: Sequence[int]) -> Statistic:
    """The statistic min over observations and consecutive β of 1 − tr Cov(β_{k+1}) / tr Cov(β_k): the smallest
    relative fall of the spread as β grows (negative: it grew). ``groups`` gives the number of cases of each
    observation; the draws come observation by observation, each in increasing β."""
    groups = list(groups)
    if any(g < 2 for g in groups):
        raise ValueError("smallest_fall: every observation needs at least two temperatures")

    def statistic(*draws: np.ndarray) -> float:
        if len(draws) != sum(groups):
            raise ValueError(f"smallest_fall: {len(draws)} cases, the groups say {sum(groups)}")
        tr = np.array([(stats.sd(d, axis=0) ** 2).sum() for d in draws])
        falls, start = [], 0
        for g in groups:
            t = tr[start:start + g]
            falls.append(1 - t[1:] / t[:-1])
            start += g
        return float(np.concatenate(falls).min())

    return statistic


def width_deviation(exact_sd: Sequence[float]) -> Statistic:
    """The statistic max over cases of |std(r) / exact std(r) − 1| of the two-moons radius r (the crescent's
    width, :func:`repro.papers.gbi.crescent_widths`' ``ratio``)."""
    exact = [float(e) for e in exact_sd]

    def statistic(*radii: np.ndarray) -> float:
        _same_count(radii, exact, "width_deviation")
        return float(max(abs(stats.sd(r) / e - 1) for r, e in zip(radii, exact, strict=True)))

    return statistic


def failing_cases(exact_sd: Sequence[float], c2st_max: float, width_tol: float) -> Statistic:
    """The statistic: how many cases fail C2ST ≤ ``c2st_max`` or a width within ± ``width_tol`` of exact. The
    arrays are each case's C2ST outcomes, then each case's radii, in the same case order."""
    exact = [float(e) for e in exact_sd]
    k = len(exact)

    def statistic(*arrays: np.ndarray) -> float:
        if len(arrays) != 2 * k:
            raise ValueError(f"failing_cases: pass {k} cases' outcomes, then their radii; got {len(arrays)} arrays")
        bad = [o.mean() > c2st_max or abs(stats.sd(r) / e - 1) > width_tol
               for o, r, e in zip(arrays[:k], arrays[k:], exact, strict=True)]
        return float(sum(bad))

    return statistic


def _same_count(arrays: Sequence[np.ndarray], exact: Sequence[object], name: str) -> None:
    if len(arrays) != len(exact):
        raise ValueError(f"{name}: {len(arrays)} cases, {len(exact)} exact values")
