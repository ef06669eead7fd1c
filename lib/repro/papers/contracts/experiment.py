"""Experiment harness of notebook 05: rates in the sample size and in the number of actions, tail quantiles, the
two-point lower-bound instance. Each function consumes the caller's NumPy generator in a fixed order, so a
notebook that calls them in the same order reproduces its numbers exactly.

Every summary keeps its per-trial values (``trials``, trials along axis 0), and its ``estimate`` methods give
each claim's statistic with a bootstrap interval over those trials (:func:`repro.common.stats.bootstrap`): the
instances are fixed, the interval covers the sampling of the trials.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
from scipy import stats

from ...common import stats as book_stats
from ...common.numerics import loglog_slope
from ...common.stats import Estimate
from .method import Tensor, sup_deviation
from .problems import (
    CurvePopulation,
    Population,
    alternating_population,
    random_population,
    staircase_population,
    two_point_population,
)

__all__ = [
    "ActionSweep", "AdversarialSweep", "DeltaScaling", "RateInN", "Trials", "TwoPoint", "action_sweep",
    "adversarial_action_sweep", "delta_scaling", "flatness", "form_misfit", "form_x", "n_e2_spread", "nested_weights",
    "rate_in_n", "run_trials", "scaled_gap_growth", "slope_of_means", "tail_quantiles", "two_point_errors",
    "two_point_misfit", "two_point_z", "utility_polyline", "worst_growth",
]

AnyPopulation = Population | CurvePopulation


@dataclass
class Trials:
    """Per-repetition outcomes of EUM on ``reps`` samples of size ``n``: sup deviation, EUM contract,
    its suboptimality ``u(α*) − u(α̂)``, and the optimal contract ``α*``."""

    n: int
    sup_dev: Tensor
    alpha_hat: Tensor
    subopt: Tensor
    alpha_star: float


def run_trials(pop: AnyPopulation, n: int, reps: int, rng: np.random.Generator, chunk: int = 0) -> Trials:
    """Draw ``reps`` samples of ``n`` types, run EUM on each and measure it exactly against the population.

    ``chunk`` bounds the repetitions handled at once (memory ~ chunk × breakpoints); 0 picks a size for ~2e7
    entries.
    """
    P = int(torch.isfinite(pop.env.breaks).sum()) + 1
    chunk = chunk or max(1, int(2e7 // P))
    a_star, u_star = pop.truth.eum()
    sup, a_hat, sub = [], [], []
    for start in range(0, reps, chunk):
        w = pop.sample_weights(n, min(chunk, reps - start), rng)
        emp = pop.empirical(w)
        dev, _ = sup_deviation(emp, pop.truth)
        ah, _ = emp.eum()
        sup.append(dev)
        a_hat.append(ah)
        sub.append(u_star - pop.truth.utility_grid(ah)[0])
    return Trials(n=n, sup_dev=torch.cat(sup), alpha_hat=torch.cat(a_hat), subopt=torch.cat(sub),
                  alpha_star=float(a_star[0]))


def nested_weights(draws: np.ndarray, n: int, n_types: int, *, device: torch.device | str = "cpu",
                   dtype: torch.dtype = torch.float64) -> Tensor:
    """Type frequencies of the first ``n`` of one long i.i.d. sequence of sampled types ``draws``: ``(1, T)``.
    Nested samples show one instance converging as ``n`` grows."""
    if not 1 <= n <= len(draws):
        raise ValueError(f"need 1 <= n <= {len(draws)} draws, got n={n}")
    w = np.bincount(draws[:n], minlength=n_types) / n
    return torch.as_tensor(w[None, :], dtype=dtype, device=device)


def utility_polyline(starts: np.ndarray, levels: np.ndarray, upto: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of the exact utility ``(1 − α)·level`` on each piece ``[start_j, start_{j+1})``, with NaN gaps at
    the jumps, for drawing a discontinuous step utility without false vertical segments."""
    starts, levels = np.asarray(starts, dtype=float), np.asarray(levels, dtype=float)
    ends = np.append(starts[1:], upto)
    xs = np.stack([starts, ends, np.full_like(starts, np.nan)], 1).ravel()
    ys = np.stack([(1 - starts) * levels, (1 - ends) * levels, np.full_like(starts, np.nan)], 1).ravel()
    return xs, ys


@dataclass
class RateInN:
    """Per sample size ``N``: mean and 10–90 % band of the exact sup deviation, mean EUM suboptimality, their
    log-log slopes, ``N·(E sup)²`` and the trials where EUM's gap exceeded twice the sup deviation."""

    Ns: np.ndarray
    sup_mean: np.ndarray
    sup_band: np.ndarray
    sub_mean: np.ndarray
    slope_sup: float
    slope_sub: float
    n_e2: np.ndarray
    violations: int
    n_trials: int
    sup: np.ndarray | None = field(default=None, repr=False)  # (reps, N): per-trial sup deviation
    sub: np.ndarray | None = field(default=None, repr=False)  # (reps, N): per-trial EUM suboptimality

    @property
    def scaled_gap(self) -> np.ndarray:
        """``√N · E[u(α*) − u(α̂)]``: bounded in ``N`` if EUM is ε-optimal with ``N = O(1/ε²)`` samples."""
        return np.sqrt(self.Ns) * self.sub_mean

    @property
    def gap_growth(self) -> float:
        """Largest ``√N · E[gap]`` over the upper half of the ``N`` range (in ``log N``) divided by the largest
        over the lower half: at most 1 when the scaled gap does not rise above its earlier level."""
        return scaled_gap_growth(self.Ns, self.sub_mean[None, :])

    def estimates(self, seed: int = book_stats.BOOT_SEED) -> dict[str, Estimate]:
        """Bootstrap estimates over the trials: ``slope`` of log E sup on log N, ``n_e2`` (max/min of N·(E sup)²),
        ``gap_growth`` (:attr:`gap_growth`)."""
        if self.sup is None or self.sub is None:
            raise ValueError("estimates() needs the per-trial values (rate_in_n keeps them)")
        boot = partial(book_stats.bootstrap, seed=seed)
        return {"slope": boot(self.sup, partial(slope_of_means, self.Ns)),
                "n_e2": boot(self.sup, partial(n_e2_spread, self.Ns)),
                "gap_growth": boot(self.sub, partial(scaled_gap_growth, self.Ns))}


def slope_of_means(Ns: np.ndarray, trials: np.ndarray) -> float:
    """Log-log slope of the per-``N`` mean of ``trials`` (shape ``(reps, len(Ns))``) against ``N``."""
    return loglog_slope(Ns, trials.mean(0))


def n_e2_spread(Ns: np.ndarray, trials: np.ndarray) -> float:
    """max/min over ``N`` of ``N · (mean of trials)²``: 1 when the rate is exactly ``N^(-1/2)``."""
    v = np.asarray(Ns) * trials.mean(0) ** 2
    return float(v.max() / v.min())


def scaled_gap_growth(Ns: np.ndarray, trials: np.ndarray) -> float:
    """Largest ``√N · mean`` over the upper half of the ``N`` range (in ``log N``) over the largest over the lower
    half (see :attr:`RateInN.gap_growth`)."""
    g = np.sqrt(Ns) * trials.mean(0)
    upper = np.log(Ns) >= np.log(Ns).mean()
    return float(g[upper].max() / g[~upper].max())


def rate_in_n(pop: Population, Ns: list[int], reps: int, rng: np.random.Generator) -> RateInN:
    """Independent samples of each size in ``Ns`` (``reps`` each), measured exactly (:func:`run_trials`)."""
    Ns_arr = np.asarray(Ns)
    trials = [run_trials(pop, int(n), reps, rng) for n in Ns_arr]
    sup_mean = np.array([float(tr.sup_dev.mean()) for tr in trials])
    band = np.array([np.quantile(tr.sup_dev.cpu().numpy(), [0.1, 0.9]) for tr in trials])
    sub_mean = np.array([float(tr.subopt.mean()) for tr in trials])
    violations = int(sum(int((tr.subopt > 2 * tr.sup_dev + 1e-12).sum()) for tr in trials))
    sup = np.stack([tr.sup_dev.cpu().numpy() for tr in trials], axis=1)
    sub = np.stack([tr.subopt.cpu().numpy() for tr in trials], axis=1)
    return RateInN(Ns=Ns_arr, sup_mean=sup_mean, sup_band=band, sub_mean=sub_mean,
                   slope_sup=loglog_slope(Ns_arr, sup_mean), slope_sub=loglog_slope(Ns_arr, sub_mean),
                   n_e2=Ns_arr * sup_mean**2, violations=violations, n_trials=len(Ns_arr) * reps, sup=sup, sub=sub)


@dataclass
class ActionSweep:
    """Mean sup deviation at a fixed ``N`` for ``pops`` random populations per number of actions ``k``."""

    ks: list[int]
    dev: np.ndarray  # (k, population)
    breaks_per_type: np.ndarray
    trials: np.ndarray | None = field(default=None, repr=False)  # (reps, k, population)

    @property
    def mean(self) -> np.ndarray:
        return self.dev.mean(axis=1)

    @property
    def ratio(self) -> float:
        """max/min over ``k`` of the mean sup deviation (1 = perfectly flat)."""
        return float(self.mean.max() / self.mean.min())

    def estimate(self, seed: int = book_stats.BOOT_SEED) -> Estimate:
        """:attr:`ratio` with a bootstrap interval over the trials (the populations fixed)."""
        return book_stats.bootstrap(self.trials, flatness, seed=seed)


def flatness(trials: np.ndarray) -> float:
    """max/min over ``k`` of the mean over trials and populations (``trials``: ``(reps, k, population)``)."""
    m = trials.mean(axis=(0, 2))
    return float(m.max() / m.min())


def action_sweep(ks: list[int], n_types: int, n_outcomes: int, pops: int, n: int, reps: int,
                 rng: np.random.Generator, *, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float64) -> ActionSweep:
    """For each ``k`` in ``ks``, ``pops`` fresh random populations of ``n_types`` types with ``k`` actions, each
    measured over ``reps`` samples of size ``n``."""
    per_trial, breaks = [], []
    for k in ks:
        devs, nb = [], []
        for _ in range(pops):
            p_k = random_population(n_types, k, n_outcomes, rng=rng, device=device, dtype=dtype)
            devs.append(run_trials(p_k, n, reps, rng).sup_dev.cpu().numpy())
            nb.append(float(p_k.env.n_breaks.double().mean()))
        per_trial.append(devs)
        breaks.append(np.mean(nb))
    trials = np.asarray(per_trial).transpose(2, 0, 1)  # (reps, k, population)
    return ActionSweep(ks=list(ks), dev=trials.mean(0), breaks_per_type=np.array(breaks), trials=trials)


@dataclass
class AdversarialSweep:
    """Mean sup deviation ``dev[k, family]`` at a fixed ``N`` on :func:`staircase_population` instances that use
    every action, for each family ``(total jump concentration, spread)`` of ``families`` (``None``: a smooth
    staircase); ``worst[k]`` is the worst family per ``k``."""

    ks: list[int]
    families: list[tuple[float | None, float]]
    n: int
    dev: np.ndarray
    trials: np.ndarray | None = field(default=None, repr=False)  # (reps, k, family)

    @property
    def worst(self) -> np.ndarray:
        return self.dev.max(axis=1)

    @property
    def growth(self) -> float:
        """Worst case over ``k > k_min`` relative to the worst case at ``k_min`` (1: no growth with k)."""
        return float(self.worst[1:].max() / self.worst[0])

    def estimate(self, seed: int = book_stats.BOOT_SEED) -> Estimate:
        """:attr:`growth` with a bootstrap interval over the trials (the populations fixed)."""
        return book_stats.bootstrap(self.trials, worst_growth, seed=seed)


def worst_growth(trials: np.ndarray) -> float:
    """The worst family's mean at ``k > k_min`` over the worst at ``k_min`` (``trials``: ``(reps, k, family)``)."""
    worst = trials.mean(0).max(axis=1)
    return float(worst[1:].max() / worst[0])


def adversarial_action_sweep(ks: list[int], families: list[tuple[float | None, float]], n_types: int, n: int,
                             reps: int, rng: np.random.Generator, *, alternating: bool = False,
                             device: torch.device | str = "cpu", dtype: torch.dtype = torch.float64
                             ) -> AdversarialSweep:
    """For each ``k`` and each family ``(A, spread)``, one uniform population of ``n_types`` staircase types with
    ``k − 1`` switches in ``[0, spread)`` and reward jumps ``Dirichlet(A/(k − 1))`` (total concentration ``A``:
    small ``A`` leaves one dominant jump, a near 0/1 step; ``A = None`` uses concentration 5 per jump, a smooth
    staircase), measured over ``reps`` samples of size ``n`` (:func:`run_trials`).

    ``alternating=True`` is the control: the same switch-point families, with a reward that alternates 0/1 at
    every switch (:func:`alternating_population`; not monotone, so not an agent's best response)."""
    trials = np.empty((reps, len(ks), len(families)))
    for i, k in enumerate(ks):
        for j, (total, spread) in enumerate(families):
            if alternating:
                pop = alternating_population(n_types, k, rng=rng, spread=spread, device=device, dtype=dtype)
            else:
                conc = 5.0 if total is None else total / max(k - 1, 1)
                pop = staircase_population(n_types, k, rng=rng, concentration=conc, spread=spread, device=device,
                                           dtype=dtype)
            trials[:, i, j] = run_trials(pop, n, reps, rng).sup_dev.cpu().numpy()
    return AdversarialSweep(ks=list(ks), families=list(families), n=n, dev=trials.mean(0), trials=trials)


@dataclass
class DeltaScaling:
    """The ``(1 − δ)``-quantiles ``q[N, δ]`` of the sup deviation against ``x = √(ln(1/δ)/N)``, the one-constant
    fit ``q ≈ c·x`` (least squares in log space) and the largest relative deviation from it."""

    Ns: np.ndarray
    deltas: np.ndarray
    q: np.ndarray
    x: np.ndarray
    c: float
    max_rel_dev: float
    trials: np.ndarray | None = field(default=None, repr=False)  # (reps, N): per-trial sup deviation

    def estimate(self, form: str = "log", seed: int = book_stats.BOOT_SEED) -> Estimate:
        """The largest relative deviation of the quantiles from one-constant ``form`` (:func:`form_misfit`), with a
        bootstrap interval over the trials."""
        return book_stats.bootstrap(self.trials, partial(form_misfit, self.Ns, self.deltas, form), seed=seed)


FORMS = ("log", "chebyshev")


def form_x(Ns: np.ndarray, deltas: np.ndarray, form: str = "log") -> np.ndarray:
    """The bound's shape at every ``(N, δ)``: ``√(ln(1/δ)/N)`` (``"log"``, the theorem's) or ``√(1/(δN))``
    (``"chebyshev"``, the form a variance-only bound gives, the control)."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    num = np.log(1 / deltas) if form == "log" else 1 / deltas
    return np.sqrt(num[None, :] / np.asarray(Ns)[:, None])


def form_misfit(Ns: np.ndarray, deltas: np.ndarray, form: str, trials: np.ndarray) -> float:
    """Largest ``|q / (c·x) − 1|`` over ``(N, δ)``, ``q`` the ``(1 − δ)``-quantiles of ``trials`` (``(reps, N)``),
    ``x`` = :func:`form_x` and ``c`` the one constant fitted in log space."""
    q = np.quantile(trials, 1 - deltas, axis=0).T
    x = form_x(Ns, deltas, form)
    c = np.exp(np.mean(np.log(q / x)))
    return float(np.abs(q / (c * x) - 1).max())


def delta_scaling(pop: Population, Ns: list[int], deltas: list[float], reps: int,
                  rng: np.random.Generator) -> DeltaScaling:
    """Quantiles of the exact sup deviation at every ``N`` in ``Ns`` (``reps`` samples each) and their fit to the
    theorem's form ``ε(δ, N) = c·√(ln(1/δ)/N)``: one constant for all ``δ`` and ``N``."""
    d = np.asarray(deltas, dtype=float)
    if not ((d > 0) & (d < 1)).all():
        raise ValueError("deltas must lie in (0, 1)")
    Ns_arr = np.asarray(Ns)
    trials = np.stack([run_trials(pop, int(n), reps, rng).sup_dev.cpu().numpy() for n in Ns_arr], axis=1)
    q = np.quantile(trials, 1 - d, axis=0).T
    x = form_x(Ns_arr, d)
    c = float(np.exp(np.mean(np.log(q / x))))
    return DeltaScaling(Ns=Ns_arr, deltas=d, q=q, x=x, c=c, max_rel_dev=form_misfit(Ns_arr, d, "log", trials),
                        trials=trials)


def tail_quantiles(pop: Population, n: int, reps: int, deltas: list[float], rng: np.random.Generator
                   ) -> tuple[np.ndarray, np.ndarray, float, float, float]:
    """The ``(1 − δ)``-quantiles of the sup deviation at sample size ``n``, against ``x = √ln(1/δ)``: returns
    ``(x, quantiles, intercept, slope, R²)`` of the least-squares line (a sub-Gaussian tail is linear in x)."""
    tr = run_trials(pop, n, reps, rng)
    d = np.asarray(deltas, dtype=float)
    q = np.quantile(tr.sup_dev.cpu().numpy(), 1 - d)
    x = np.sqrt(np.log(1 / d))
    fit = stats.linregress(x, q)
    return x, q, float(fit.intercept), float(fit.slope), float(fit.rvalue**2)


@dataclass
class TwoPoint:
    """EUM's error probability on the two-point instance: simulated at ``ns`` (``reps`` trials each), exact binomial
    tail on a dense grid of multiples of 3 and at ``ns``."""

    eta: float
    ns: np.ndarray
    wrong: np.ndarray
    exact_at: np.ndarray
    dense: np.ndarray
    exact: np.ndarray
    reps: int = 0
    trials: np.ndarray | None = field(default=None, repr=False)  # (reps, ns): 1 where EUM erred


def two_point_misfit(exact_at: np.ndarray, trials: np.ndarray) -> float:
    """Largest ``|simulated − exact|`` error probability over the points, in standard errors of a frequency at
    p = 1/2 (the largest): ``trials`` ``(reps, points)`` of 0/1 errors, ``exact_at`` the exact tails."""
    return float(np.abs(trials.mean(0) - exact_at).max() / book_stats.proportion_se(0.5, trials.shape[0]))


def two_point_z(tps: list[TwoPoint]) -> float:
    """:func:`two_point_misfit` over every point of ``tps`` (one ``reps`` for all): a z-type statistic, compared
    with a number of standard errors that already allows for the Monte-Carlo noise."""
    trials = np.concatenate([tp.trials for tp in tps], axis=1)
    return two_point_misfit(np.concatenate([tp.exact_at for tp in tps]), trials)


def two_point_errors(eta: float, x: list[float], reps: int, rng: np.random.Generator, *,
                     device: torch.device | str = "cpu", dtype: torch.dtype = torch.float64) -> TwoPoint:
    """Simulate EUM on :func:`two_point_population` at ``N ≈ x/η²`` (``N`` a multiple of 3, so "fewer than N/3"
    has no rounding sawtooth) and compare with the exact tail ``P(Bin(N, 1/3 + η) < N/3)``."""
    p2 = two_point_population(eta, device=device, dtype=dtype)
    ns = np.unique(3 * np.maximum(1, np.round(np.asarray(x) / eta**2 / 3)).astype(int))
    trials = np.stack([(run_trials(p2, int(n), reps, rng).alpha_hat != 0.25).cpu().numpy() for n in ns], axis=1)
    dense = 3 * np.arange(1, ns.max() // 3 + 1)
    return TwoPoint(eta=eta, ns=ns, wrong=trials.mean(0), exact_at=stats.binom.cdf(ns // 3 - 1, ns, 1 / 3 + eta),
                    dense=dense, exact=stats.binom.cdf(dense // 3 - 1, dense, 1 / 3 + eta), reps=reps,
                    trials=trials.astype(float))
