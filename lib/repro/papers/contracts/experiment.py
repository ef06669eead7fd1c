"""Experiment harness of notebook 05: rates in the sample size and in the number of actions, tail quantiles, the
two-point lower-bound instance. Each function consumes the caller's NumPy generator in a fixed order, so a
notebook that calls them in the same order reproduces its numbers exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats

from ...common.numerics import loglog_slope
from .method import Tensor, sup_deviation
from .problems import Population, random_population, staircase_population, two_point_population


@dataclass
class Trials:
    """Per-repetition outcomes of EUM on ``reps`` samples of size ``n``: sup deviation, EUM contract,
    its suboptimality ``u(α*) − u(α̂)``, and the optimal contract ``α*``."""

    n: int
    sup_dev: Tensor
    alpha_hat: Tensor
    subopt: Tensor
    alpha_star: float


def run_trials(pop: Population, n: int, reps: int, rng: np.random.Generator, chunk: int = 0) -> Trials:
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

    @property
    def scaled_gap(self) -> np.ndarray:
        """``√N · E[u(α*) − u(α̂)]``: bounded in ``N`` if EUM is ε-optimal with ``N = O(1/ε²)`` samples."""
        return np.sqrt(self.Ns) * self.sub_mean

    @property
    def gap_growth(self) -> float:
        """Largest ``√N · E[gap]`` over the upper half of the ``N`` range (in ``log N``) divided by the largest
        over the lower half: at most 1 when the scaled gap does not rise above its earlier level."""
        upper = np.log(self.Ns) >= np.log(self.Ns).mean()
        return float(self.scaled_gap[upper].max() / self.scaled_gap[~upper].max())


def rate_in_n(pop: Population, Ns: list[int], reps: int, rng: np.random.Generator) -> RateInN:
    """Independent samples of each size in ``Ns`` (``reps`` each), measured exactly (:func:`run_trials`)."""
    Ns_arr = np.asarray(Ns)
    trials = [run_trials(pop, int(n), reps, rng) for n in Ns_arr]
    sup_mean = np.array([float(tr.sup_dev.mean()) for tr in trials])
    band = np.array([np.quantile(tr.sup_dev.cpu().numpy(), [0.1, 0.9]) for tr in trials])
    sub_mean = np.array([float(tr.subopt.mean()) for tr in trials])
    violations = int(sum(int((tr.subopt > 2 * tr.sup_dev + 1e-12).sum()) for tr in trials))
    return RateInN(Ns=Ns_arr, sup_mean=sup_mean, sup_band=band, sub_mean=sub_mean,
                   slope_sup=loglog_slope(Ns_arr, sup_mean), slope_sub=loglog_slope(Ns_arr, sub_mean),
                   n_e2=Ns_arr * sup_mean**2, violations=violations, n_trials=len(Ns_arr) * reps)


@dataclass
class ActionSweep:
    """Mean sup deviation at a fixed ``N`` for ``pops`` random populations per number of actions ``k``."""

    ks: list[int]
    dev: np.ndarray  # (k, population)
    breaks_per_type: np.ndarray

    @property
    def mean(self) -> np.ndarray:
        return self.dev.mean(axis=1)

    @property
    def ratio(self) -> float:
        """max/min over ``k`` of the mean sup deviation (1 = perfectly flat)."""
        return float(self.mean.max() / self.mean.min())


def action_sweep(ks: list[int], n_types: int, n_outcomes: int, pops: int, n: int, reps: int,
                 rng: np.random.Generator, *, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float64) -> ActionSweep:
    """For each ``k`` in ``ks``, ``pops`` fresh random populations of ``n_types`` types with ``k`` actions, each
    measured over ``reps`` samples of size ``n``."""
    dev, breaks = [], []
    for k in ks:
        devs, nb = [], []
        for _ in range(pops):
            p_k = random_population(n_types, k, n_outcomes, rng=rng, device=device, dtype=dtype)
            devs.append(float(run_trials(p_k, n, reps, rng).sup_dev.mean()))
            nb.append(float(p_k.env.n_breaks.double().mean()))
        dev.append(devs)
        breaks.append(np.mean(nb))
    return ActionSweep(ks=list(ks), dev=np.array(dev), breaks_per_type=np.array(breaks))


@dataclass
class AdversarialSweep:
    """Mean sup deviation ``dev[k, family]`` at a fixed ``N`` on :func:`staircase_population` instances that use
    every action, for each family ``(total jump concentration, spread)`` of ``families`` (``None``: a smooth
    staircase); ``worst[k]`` is the worst family per ``k``."""

    ks: list[int]
    families: list[tuple[float | None, float]]
    n: int
    dev: np.ndarray

    @property
    def worst(self) -> np.ndarray:
        return self.dev.max(axis=1)

    @property
    def growth(self) -> float:
        """Worst case over ``k > k_min`` relative to the worst case at ``k_min`` (1: no growth with k)."""
        return float(self.worst[1:].max() / self.worst[0])


def adversarial_action_sweep(ks: list[int], families: list[tuple[float | None, float]], n_types: int, n: int,
                             reps: int, rng: np.random.Generator, *, device: torch.device | str = "cpu",
                             dtype: torch.dtype = torch.float64) -> AdversarialSweep:
    """For each ``k`` and each family ``(A, spread)``, one uniform population of ``n_types`` staircase types with
    ``k − 1`` switches in ``[0, spread)`` and reward jumps ``Dirichlet(A/(k − 1))`` (total concentration ``A``:
    small ``A`` leaves one dominant jump, a near 0/1 step; ``A = None`` uses concentration 5 per jump, a smooth
    staircase), measured over ``reps`` samples of size ``n`` (:func:`run_trials`)."""
    dev = np.empty((len(ks), len(families)))
    for i, k in enumerate(ks):
        for j, (total, spread) in enumerate(families):
            conc = 5.0 if total is None else total / max(k - 1, 1)
            pop = staircase_population(n_types, k, rng=rng, concentration=conc, spread=spread, device=device,
                                       dtype=dtype)
            dev[i, j] = float(run_trials(pop, n, reps, rng).sup_dev.mean())
    return AdversarialSweep(ks=list(ks), families=list(families), n=n, dev=dev)


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


def delta_scaling(pop: Population, Ns: list[int], deltas: list[float], reps: int,
                  rng: np.random.Generator) -> DeltaScaling:
    """Quantiles of the exact sup deviation at every ``N`` in ``Ns`` (``reps`` samples each) and their fit to the
    theorem's form ``ε(δ, N) = c·√(ln(1/δ)/N)``: one constant for all ``δ`` and ``N``."""
    d = np.asarray(deltas, dtype=float)
    if not ((d > 0) & (d < 1)).all():
        raise ValueError("deltas must lie in (0, 1)")
    Ns_arr = np.asarray(Ns)
    q = np.array([np.quantile(run_trials(pop, int(n), reps, rng).sup_dev.cpu().numpy(), 1 - d) for n in Ns_arr])
    x = np.sqrt(np.log(1 / d)[None, :] / Ns_arr[:, None])
    c = float(np.exp(np.mean(np.log(q / x))))
    return DeltaScaling(Ns=Ns_arr, deltas=d, q=q, x=x, c=c, max_rel_dev=float(np.abs(q / (c * x) - 1).max()))


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


def two_point_errors(eta: float, x: list[float], reps: int, rng: np.random.Generator, *,
                     device: torch.device | str = "cpu", dtype: torch.dtype = torch.float64) -> TwoPoint:
    """Simulate EUM on :func:`two_point_population` at ``N ≈ x/η²`` (``N`` a multiple of 3, so "fewer than N/3"
    has no rounding sawtooth) and compare with the exact tail ``P(Bin(N, 1/3 + η) < N/3)``."""
    p2 = two_point_population(eta, device=device, dtype=dtype)
    ns = np.unique(3 * np.maximum(1, np.round(np.asarray(x) / eta**2 / 3)).astype(int))
    wrong = np.array([float((run_trials(p2, int(n), reps, rng).alpha_hat != 0.25).double().mean()) for n in ns])
    dense = 3 * np.arange(1, ns.max() // 3 + 1)
    return TwoPoint(eta=eta, ns=ns, wrong=wrong, exact_at=stats.binom.cdf(ns // 3 - 1, ns, 1 / 3 + eta),
                    dense=dense, exact=stats.binom.cdf(dense // 3 - 1, dense, 1 / 3 + eta), reps=reps)
