"""Experiment harness of notebook 16: the speciation scale of the entropy rate (VP and VE), the MMSE-gap check,
coarse-before-fine on a hierarchical mixture, guidance, and the digits analogue (references fixed before training,
the trained model, per-digit decisions and data-driven digit groups). Functions that take a generator consume it
in the notebook's original order, so calling them in the notebook's order reproduces its numbers exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...common import stats
from ...common.stats import Estimate
from .method import (
    VE,
    VP,
    GaussianMixture,
    Schedule,
    Tensor,
    _group,
    crossing_time,
    crossing_times,
    empirical_log_posterior,
    entropy,
    entropy_rate,
    entropy_two_class,
    fwhm,
    guided_flow,
    guided_trajectories,
    mmse_gap_entropy,
    peak_time,
    two_class_snr_statistic,
)
from .models import ConditionalDenoiser, NoisyClassifier, classifier_cross_entropy, train_classifier, train_denoiser
from .problems import Digits, two_class_mixture

__all__ = [
    "CoarseFine", "DigitGroups", "DigitsGMM", "DigitsGuidance", "DigitsModel", "DigitsReference", "GapCheck",
    "GuidanceSweep", "Speciation", "VEWindows", "coarse_vs_fine", "digit_groups", "digits_gmm", "digits_guidance",
    "digits_model", "digits_reference", "entropy_per_point", "guidance_sweep", "mmse_gap_check", "peak_delta",
    "peak_times", "smallest_decision_step", "speciation_vp", "ve_windows",
]

# --------------------------------------------------------------------------------------------------------------
# Speciation: the entropy rate of two classes ±m, ‖m‖² = d, under VP and VE
# --------------------------------------------------------------------------------------------------------------


@dataclass
class Speciation:
    """VP entropy curves ``curves[σ₀, d] = (H, dH/dt)`` on the time grid ``t``, the rate's ``peaks`` and FWHM
    ``widths``; per class width σ₀ the fitted ``slopes`` of ``t*`` on ``ln d`` and the FWHM ``width_spread``
    (max/min − 1 over d); ``min_step``, the smallest step of any exact ``H`` along forward time."""

    t: Tensor
    dims: list[int]
    curves: dict[tuple[float, int], tuple[Tensor, Tensor]]
    peaks: dict[tuple[float, int], float]
    widths: dict[tuple[float, int], float]
    slopes: dict[float, float]
    width_spread: dict[float, float]
    min_step: float


def speciation_vp(dims: Sequence[int], class_widths: Sequence[float], points: int) -> Speciation:
    """Exact ``H[Y | X_t]`` (:func:`entropy_two_class`) on ``points`` VP times up to ``½ ln d_max + 4``."""
    dims = list(dims)
    t = torch.linspace(1e-3, 0.5 * math.log(max(dims)) + 4, points, dtype=torch.float64)
    curves, peaks, widths = {}, {}, {}
    for w0 in class_widths:
        for d in dims:
            H = entropy_two_class(two_class_snr_statistic(t, VP(), float(d), w0**2))
            rate = entropy_rate(H, t)
            curves[w0, d] = (H, rate)
            peaks[w0, d] = peak_time(t, rate)
            widths[w0, d] = fwhm(t, rate)
    log_d = np.log(dims)
    slopes = {w0: float(np.polyfit(log_d, [peaks[w0, d] for d in dims], 1)[0]) for w0 in class_widths}
    spread = {w0: max(widths[w0, d] for d in dims) / min(widths[w0, d] for d in dims) - 1 for w0 in class_widths}
    min_step = min(float(torch.diff(curves[k][0]).min()) for k in curves)
    return Speciation(t=t, dims=dims, curves=curves, peaks=peaks, widths=widths, slopes=slopes,
                      width_spread=spread, min_step=min_step)


@dataclass
class VEWindows:
    """VE (σ-time) entropy rates ``rates[d]`` on the noise grid ``sigma``, the FWHM in σ ``widths[d]``, its
    ``growth`` from the smallest to the largest d and the ``√d`` ratio that predicts it; ``log_widths[d]``, the FWHM
    in ``ln σ`` of the rate per unit ``ln σ`` (``σ · dH/dσ``), and their spread ``log_width_spread`` (max/min − 1)."""

    sigma: Tensor
    rates: dict[int, Tensor]
    widths: dict[int, float]
    growth: float
    sqrt_prediction: float
    log_widths: dict[int, float]
    log_width_spread: float


def ve_windows(dims: Sequence[int], points: int = 6000) -> VEWindows:
    """Two classes (σ₀ = 1) under VE: ``S = 2‖m‖²/(1 + σ²)`` on ``points`` log-spaced σ up to ``50 √d_max``."""
    dims = list(dims)
    sig = torch.logspace(-2, math.log10(50 * math.sqrt(max(dims))), points, dtype=torch.float64)
    rates, widths = {}, {}
    for d in dims:
        H_ve = entropy_two_class(two_class_snr_statistic(sig, VE(), float(d), 1.0))
        rates[d] = entropy_rate(H_ve, sig)
        widths[d] = fwhm(sig, rates[d])
    log_widths = {d: fwhm(sig.log(), rates[d] * sig) for d in dims}
    return VEWindows(sigma=sig, rates=rates, widths=widths, growth=widths[dims[-1]] / widths[dims[0]],
                     sqrt_prediction=math.sqrt(dims[-1] / dims[0]), log_widths=log_widths,
                     log_width_spread=max(log_widths.values()) / min(log_widths.values()) - 1)


# --------------------------------------------------------------------------------------------------------------
# The MMSE gap with exact denoisers; coarse before fine; guidance
# --------------------------------------------------------------------------------------------------------------


@dataclass
class GapCheck:
    """MMSE-gap entropy ``H_gap`` and the exact ``H_exact`` on the time grid ``t`` (CPU), the indices ``idx`` of the
    checked noise levels and the largest absolute error there, ``error``."""

    t: Tensor
    H_gap: Tensor
    H_exact: Tensor
    idx: list[int]
    error: float


def mmse_gap_check(d: int, n: int, points: int, levels: Sequence[float], generator: torch.Generator, *,
                   device: torch.device | str = "cpu", dtype: torch.dtype = torch.float64) -> GapCheck:
    """:func:`mmse_gap_entropy` fed with the exact denoisers of :func:`two_class_mixture` (``n`` samples, VP times
    in ``[0.02, 12]``) against :func:`entropy_two_class`, compared at the grid points nearest to ``levels``.
    Draws the samples, then the noise, from ``generator``."""
    gmm = two_class_mixture(d, device=device, dtype=dtype)
    x0, y0 = gmm.sample(n, generator)
    grid = torch.linspace(0.02, 12, points, dtype=dtype, device=device)
    H_gap = mmse_gap_entropy(lambda x, tt, lab: gmm.denoiser(x, tt, VP(), lab), x0, y0, grid, VP(),
                             gmm.prior_entropy, generator).cpu()
    H_exact = entropy_two_class(two_class_snr_statistic(grid.cpu().double(), VP(), float(d)))
    idx = [int(torch.argmin((grid.cpu() - lv).abs())) for lv in levels]
    return GapCheck(t=grid.cpu(), H_gap=H_gap, H_exact=H_exact, idx=idx,
                    error=float((H_gap[idx] - H_exact[idx]).abs().max()))


@dataclass
class CoarseFine:
    """Monte-Carlo entropies of the fine label, of a coarse partition and of the subclass given the group
    (``H_within = H_fine − H_coarse``) on the time grid ``t`` (CPU), the peak times of their rates, and ``delta``:
    ``t_coarse − t_fine`` with its bootstrap interval over the samples (:func:`peak_delta`)."""

    t: Tensor
    H_fine: Tensor
    H_coarse: Tensor
    H_within: Tensor
    t_fine: float
    t_coarse: float
    t_within: float
    delta: Estimate


def coarse_vs_fine(gmm: GaussianMixture, partition: Tensor, n: int, points: int,
                   generator: torch.Generator) -> CoarseFine:
    """``H[Z | X_t]`` and ``H[π(Z) | X_t]`` on ``points`` VP times in ``[0.02, 4]`` from ``n`` samples, both with
    the same noise draw (common random numbers). Draws the samples, then the noise seed, from ``generator``."""
    dev, dt = gmm.means.device, gmm.means.dtype
    xh, _ = gmm.sample(n, generator)
    th = torch.linspace(0.02, 4, points, dtype=dt, device=dev)
    seed_h = int(torch.randint(2**31, (1,), generator=generator, device=dev))
    # one posterior per time serves both: the groups' log-probabilities are the classes' summed (what
    # conditional_entropy_mc with and without the partition computes, with the same noise draw, at half the cost)
    eps = torch.randn(xh.shape, generator=torch.Generator(device=dev).manual_seed(seed_h), dtype=dt, device=dev)
    per_f, per_c = torch.stack([
        torch.stack([entropy(lp), entropy(_group(lp, partition))])
        for lp in (gmm.log_posterior(VP().noise(xh, tt, eps), tt, VP()) for tt in th)]).cpu().unbind(1)
    H_fine, H_coarse = per_f.mean(1), per_c.mean(1)
    H_within = H_fine - H_coarse  # H[Z | X_t, π(Z)], the subclass decision inside a superclass
    tc = th.cpu()
    return CoarseFine(t=tc, H_fine=H_fine, H_coarse=H_coarse, H_within=H_within,
                      t_fine=peak_time(tc, entropy_rate(H_fine, tc)),
                      t_coarse=peak_time(tc, entropy_rate(H_coarse, tc)),
                      t_within=peak_time(tc, entropy_rate(H_within, tc)),
                      delta=peak_delta(tc.numpy(), per_c.numpy(), per_f.numpy()))


def peak_delta(t: np.ndarray, per_a: np.ndarray, per_b: np.ndarray, n_boot: int = stats.N_BOOT,
               seed: int = stats.BOOT_SEED) -> Estimate:
    """``t*(a) − t*(b)``, the difference of the rate-peak times of two mean entropy curves whose per-item values
    are ``per_a``/``per_b`` (``(T, n)`` on the increasing grid ``t``), with its percentile bootstrap interval over
    the items (resampled jointly: a resampled mean is a count-weighted mean)."""
    return _peak_delta(t, per_a, per_b, n_boot, seed)[0]


def _peak_delta(t: np.ndarray, per_a: np.ndarray, per_b: np.ndarray, n_boot: int, seed: int
                ) -> tuple[Estimate, np.ndarray]:
    n = per_a.shape[1]
    w = stats.resample_counts(n, n_boot, seed) / n                              # (B, n)
    value = float(_peaks(t, (per_a.mean(1),))[0] - _peaks(t, (per_b.mean(1),))[0])
    reps = _peaks(t, w @ per_a.T) - _peaks(t, w @ per_b.T)
    return stats.from_replicates(value, reps, n), reps


def _peaks(t: np.ndarray, curves: Any) -> np.ndarray:
    return peak_times(t, np.gradient(np.asarray(curves, dtype=float), t, axis=1))


def smallest_decision_step(t: np.ndarray, per_traj: Sequence[np.ndarray], level: float,
                           n_boot: int = stats.N_BOOT, seed: int = stats.BOOT_SEED) -> Estimate:
    """The smallest step of the decision time (:func:`crossing_times` of the mean entropy at ``level``) between
    successive guidance weights, whose per-trajectory entropies are ``per_traj`` (one ``(T, n)`` array per weight,
    ``t`` increasing, the same initial noise for every weight), with its bootstrap interval over trajectories
    (resampled jointly across the weights)."""
    arrs = [np.asarray(p, dtype=float) for p in per_traj]
    n = arrs[0].shape[1]
    w = stats.resample_counts(n, n_boot, seed) / n
    point = np.stack([crossing_times(t, a.mean(1)[None], level)[0] for a in arrs])
    reps = np.stack([crossing_times(t, w @ a.T, level) for a in arrs])       # (weights, B)
    return stats.from_replicates(float(np.diff(point).min()), np.diff(reps, axis=0).min(0), n)


@dataclass
class GuidanceSweep:
    """Mean unguided posterior entropy ``entropy[w]`` along guided trajectories on the decreasing time grid ``t``
    (CPU), the decision time ``decision[w]`` (where it falls to ``½ ln K``), and the number of consecutive weights
    where the decision time decreases, ``order_violations``; ``smallest_step``, the smallest step of the decision
    time between successive weights with its bootstrap interval over trajectories (:func:`smallest_decision_step`)."""

    t: Tensor
    entropy: dict[float, Tensor]
    decision: dict[float, float]
    order_violations: int
    smallest_step: Estimate


def guidance_sweep(gmm: GaussianMixture, weights: Sequence[float], n: int, steps: int, seed: int) -> GuidanceSweep:
    """:func:`guided_trajectories` of ``n`` samples of class 0 for each guidance weight, ``steps`` Heun steps
    from t = 4 to 1e-3, every weight from the same initial noise (a generator seeded with ``seed``)."""
    dev, dt = gmm.means.device, gmm.means.dtype
    tg = torch.linspace(4.0, 1e-3, steps, dtype=dt, device=dev)
    y_target = torch.zeros(n, dtype=torch.long, device=dev)
    half = 0.5 * math.log(gmm.means.shape[0])
    guided, decision, per = {}, {}, []
    for w in weights:
        _, Hw = guided_trajectories(gmm, y_target, w, tg, torch.Generator(device=dev).manual_seed(seed),
                                    per_trajectory=True)
        guided[w] = Hw.mean(1).cpu()
        per.append(Hw.flip(0).cpu().double().numpy())
        decision[w] = crossing_time(tg.flip(0).cpu(), guided[w].flip(0), half)
    violations = int(sum(decision[b] < decision[a] for a, b in zip(weights, weights[1:], strict=False)))
    step = smallest_decision_step(tg.flip(0).cpu().double().numpy(), per, half)
    return GuidanceSweep(t=tg.cpu(), entropy=guided, decision=decision, order_violations=violations,
                         smallest_step=step)


# --------------------------------------------------------------------------------------------------------------
# Digits: references fixed before training, the trained model, per-digit decisions and digit groups
# --------------------------------------------------------------------------------------------------------------


def entropy_per_point(log_posterior: Callable[[Tensor, Tensor], Tensor], X: Tensor, t_grid: Tensor, seed: int,
                      sched: Schedule | None = None) -> Tensor:
    """Entropy of ``log_posterior(x_t, t)`` for every point of ``X`` at every time of ``t_grid``, one noise draw
    (from ``seed``) reused at every t: shape ``(T, n)``, on the CPU."""
    sched = sched or VP()
    eps = torch.randn(X.shape, generator=torch.Generator(device=X.device).manual_seed(seed), dtype=X.dtype,
                      device=X.device)
    return torch.stack([entropy(log_posterior(sched.noise(X, tt, eps), tt)) for tt in t_grid]).cpu()


@dataclass
class DigitsReference:
    """The exact empirical posterior's entropy per time and point ``per_emp`` (``(T, n)``), its mean ``H_emp`` and
    standard error ``se_emp``, the leave-one-out ``H_loo``, the transition ``window`` (``H_emp`` within 1–99 % of
    the prior), the ``memorisation_gap`` and C6's ``tolerance`` (gap + 3 SE); ``t`` (on the data's device),
    the ``seed`` of the shared noise draw and ``X64``, the digits in the working dtype."""

    t: Tensor
    seed: int
    X64: Tensor
    per_emp: Tensor
    H_emp: Tensor
    H_loo: Tensor
    se_emp: Tensor
    window: Tensor
    memorisation_gap: float
    tolerance: float


def digits_reference(data: Digits, levels: int, generator: torch.Generator,
                     dtype: torch.dtype = torch.float64) -> DigitsReference:
    """References fixed before any training: the empirical and leave-one-out posteriors' entropies on ``levels``
    VP times with log-SNR uniform in ``[-8, 8]``; draws the noise seed from ``generator``."""
    dev = data.X.device
    Xd = data.X.to(dtype)
    lam = torch.linspace(-8, 8, levels, dtype=dtype)
    td = VP().t_of_snr(lam.exp()).flip(0).to(dev)  # increasing t
    seed = int(torch.randint(2**31, (1,), generator=generator, device=dev))
    k = data.n_classes
    per_emp = entropy_per_point(lambda x, tt: empirical_log_posterior(Xd, data.y, x, tt, VP(), k), Xd, td, seed)
    per_loo = entropy_per_point(lambda x, tt: empirical_log_posterior(Xd, data.y, x, tt, VP(), k, exclude_self=True),
                                Xd, td, seed)
    H_emp, H_loo = per_emp.mean(1), per_loo.mean(1)
    se_emp = torch.as_tensor(stats.se(per_emp.cpu().numpy(), axis=1), dtype=per_emp.dtype, device=per_emp.device)
    window = (H_emp > 0.01 * data.prior_entropy) & (H_emp < 0.99 * data.prior_entropy)
    gap = float((H_emp - H_loo).abs()[window].max())
    return DigitsReference(t=td, seed=seed, X64=Xd, per_emp=per_emp, H_emp=H_emp, H_loo=H_loo, se_emp=se_emp,
                           window=window, memorisation_gap=gap,
                           tolerance=round(gap + 3 * float(se_emp[window].max()), 3))


@dataclass
class DigitsModel:
    """The trained denoiser's ``losses`` and MMSE-gap entropy ``H_model``, the noisy classifier's cross-entropy
    ``ce``, the largest ``|H_model − H_emp|`` in the window (``model_gap``), the ``spurious`` information below
    zero at higher SNR than the window, and ``bound_slack = min(ce − H_emp)``; ``model`` is the trained
    denoiser; ``untrained_gap``, the same ``model_gap`` of the network at its initialisation (C6's control)."""

    losses: list[float]
    H_model: Tensor
    ce: Tensor
    model_gap: float
    spurious: float
    bound_slack: float
    model: ConditionalDenoiser | None = None
    untrained_gap: float = float("nan")


def digits_model(data: Digits, ref: DigitsReference, generator: torch.Generator, seed: int, *,
                 denoiser_steps: int, denoiser_width: int, clf_steps: int) -> DigitsModel:
    """Train the :class:`ConditionalDenoiser` (initialised from torch's global generator seeded with ``seed``,
    restored afterwards) and the :class:`NoisyClassifier` on the digits, batches drawn from ``generator``;
    evaluate both on the reference's times with its noise draw."""
    dev, dim, k = data.X.device, data.X.shape[1], data.n_classes
    t32 = ref.t.float()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ConditionalDenoiser(dim, k, width=denoiser_width).to(dev)
        H_init = _gap_entropy(model, data, t32, ref.seed)
        losses = train_denoiser(model, data.X, data.y, VP(), denoiser_steps, generator=generator)
        H_model = _gap_entropy(model, data, t32, ref.seed)
        clf = NoisyClassifier(dim, k).to(dev)
        train_classifier(clf, data.X, data.y, VP(), clf_steps, generator=generator)
    ce = classifier_cross_entropy(clf, data.X, data.y, t32, VP(), torch.Generator(device=dev).manual_seed(ref.seed))
    ce = ce.cpu()
    tc = ref.t.cpu()
    high_snr = tc < float(tc[ref.window].min())
    return DigitsModel(losses=losses, H_model=H_model, ce=ce,
                       model_gap=float((H_model - ref.H_emp).abs()[ref.window].max()),
                       spurious=float(-H_model[high_snr].min()) if high_snr.any() else 0.0,
                       bound_slack=float((ce.double() - ref.H_emp).min()), model=model,
                       untrained_gap=float((H_init - ref.H_emp).abs()[ref.window].max()))


def _gap_entropy(model: ConditionalDenoiser, data: Digits, t: Tensor, seed: int) -> Tensor:
    with torch.no_grad():
        return mmse_gap_entropy(lambda x, tt, lab: model.denoise(x, tt, VP(), lab), data.X, data.y, t, VP(),
                                data.prior_entropy, torch.Generator(device=data.X.device).manual_seed(seed)
                                ).cpu().double()


@dataclass
class DigitsGuidance:
    """Classifier-free guidance with the trained digits denoiser: along guided probability-flow trajectories (the
    decreasing time grid ``t``, on the CPU), the mean entropy of the exact empirical posterior ``entropy[w]``, the
    decision time ``decision[w]`` (where it falls to ``½ ln K``) and the number of consecutive weights where the
    decision time decreases, ``order_violations``; ``smallest_step`` as in :class:`GuidanceSweep`."""

    t: Tensor
    entropy: dict[float, Tensor]
    decision: dict[float, float]
    order_violations: int
    smallest_step: Estimate


def digits_guidance(model: ConditionalDenoiser, data: Digits, ref: DigitsReference, weights: Sequence[float],
                    per_class: int, steps: int, seed: int,
                    log_snr: tuple[float, float] = (-8.0, 6.0)) -> DigitsGuidance:
    """Guided sampling from the trained denoiser: ``per_class`` trajectories for every digit, ``steps`` Heun steps of
    the VP probability-flow ODE (:func:`guided_flow`) on a grid uniform in log-SNR over ``log_snr``, every weight from
    the same initial noise (a generator seeded with ``seed``). The model's score is ``(a D(x_t, y) − x_t)/s²``
    (Tweedie); along the trajectories the *unguided* posterior is the exact empirical one of the training set
    (:func:`empirical_log_posterior`)."""
    dev, k = data.X.device, data.n_classes
    sched = VP()
    lam = torch.linspace(log_snr[0], log_snr[1], steps, dtype=torch.float64)
    t_grid = sched.t_of_snr(lam.exp()).to(dev, data.X.dtype)             # decreasing: the reverse process
    y = torch.arange(k, device=dev).repeat_interleave(per_class)

    def score(label: Tensor | None) -> Callable[[Tensor, Tensor], Tensor]:
        return lambda x, t: (sched.alpha(t) * model.denoise(x, t, sched, label) - x) / sched.sigma(t) ** 2

    def observe(x: Tensor, t: Tensor) -> Tensor:
        return entropy(empirical_log_posterior(ref.X64, data.y, x.to(ref.X64.dtype), t.to(ref.X64.dtype), sched,
                                               k))

    half = 0.5 * math.log(k)
    curves, decision, per = {}, {}, []
    with torch.no_grad():
        for w in weights:
            x = torch.randn(len(y), data.X.shape[1], generator=torch.Generator(device=dev).manual_seed(seed),
                            dtype=data.X.dtype, device=dev)
            _, H = guided_flow(score(y), score(None), x, w, t_grid, observe)
            per.append(H.flip(0).cpu().double().numpy())
            curves[w] = H.mean(1).cpu().double()
            decision[w] = crossing_time(t_grid.flip(0).cpu().double(), curves[w].flip(0), half)
    violations = int(sum(decision[b] < decision[a] for a, b in zip(weights, weights[1:], strict=False)))
    step = smallest_decision_step(t_grid.flip(0).cpu().double().numpy(), per, half)
    return DigitsGuidance(t=t_grid.cpu().double(), entropy=curves, decision=decision, order_violations=violations,
                          smallest_step=step)


@dataclass
class DigitGroups:
    """Per digit the time at which its mean empirical entropy falls to ``½ ln 10`` (``decision``), the
    data-driven ``groups`` of the classes; on the fine time grid ``t`` the fine and coarse entropies
    ``H_fine``/``H_coarse``, the rate-peak times ``t_fine``/``t_coarse`` and the bootstrap (over the points) of
    ``Δ = t_coarse − t_fine``: ``boot`` (all resamples) and its 95 % interval ``ci``; ``delta``, the same as an
    :class:`Estimate`, and ``delta_random``, the same Δ for ``random_groups`` (the group labels permuted: groups of
    the same sizes, made without the data), the control of C9."""

    decision: dict[int, float]
    groups: np.ndarray
    t: Tensor
    H_fine: Tensor
    H_coarse: Tensor
    t_coarse: float
    t_fine: float
    boot: np.ndarray
    ci: tuple[float, float]
    delta: Estimate
    random_groups: np.ndarray
    delta_random: Estimate


def peak_times(t: np.ndarray, rates: np.ndarray) -> np.ndarray:
    """:func:`peak_time` for every row of ``rates`` (shape ``(B, T)``) at once: the argmax refined by the parabola
    through it and its two neighbours (the grid point itself at the ends or where the parabola is not concave)."""
    t, r = np.asarray(t, dtype=float), np.asarray(rates, dtype=float)
    i = np.clip(r.argmax(1), 1, len(t) - 2)
    x = np.stack([t[i - 1], t[i], t[i + 1]], 1)
    yv = np.take_along_axis(r, np.stack([i - 1, i, i + 1], 1), 1)
    A = np.stack([x**2, x, np.ones_like(x)], 2)
    c2, c1, _ = np.linalg.solve(A, yv[..., None])[..., 0].T
    concave = c2 < 0
    vertex = np.where(concave, -c1 / (2 * np.where(concave, c2, -1.0)), t[i])
    edge = (r.argmax(1) == 0) | (r.argmax(1) == len(t) - 1)
    return np.where(edge, t[r.argmax(1)], vertex)


def digit_groups(data: Digits, ref: DigitsReference, n_groups: int = 3, points: int = 64, boot: int = 1000,
                 seed: int = 0) -> DigitGroups:
    """Per-digit decision times from the exact empirical posterior (reference grid), ``n_groups`` superclasses from
    agglomerative clustering (scikit-learn, Ward) of the class means, and the coarse-before-fine comparison on a
    fine grid: ``points`` times uniform in log-SNR over the reference's transition window, the reference's noise
    draw, fine and coarse entropies per point from one posterior evaluation, and ``boot`` bootstrap resamples of
    the points (a NumPy generator seeded with ``seed``) for the interval of ``t_coarse − t_fine``."""
    from sklearn.cluster import AgglomerativeClustering

    k, tc = data.n_classes, ref.t.cpu()
    half = 0.5 * math.log(k)
    decision = {c: crossing_time(tc, ref.per_emp[:, (data.y == c).cpu()].mean(1), half) for c in range(k)}
    means = torch.stack([data.X[data.y == c].mean(0) for c in range(k)]).cpu().numpy()
    groups = AgglomerativeClustering(n_clusters=n_groups).fit_predict(means)
    rand = np.random.default_rng([seed, 16]).permutation(groups)
    part, part_r = (torch.as_tensor(g, device=data.X.device) for g in (groups, rand))
    # the fine grid: uniform in log-SNR over the window fixed before any training
    lam_w = torch.log(VP().snr(tc[ref.window].double()))
    lam = torch.linspace(float(lam_w.min()), float(lam_w.max()), points, dtype=torch.float64)
    tf = VP().t_of_snr(lam.exp()).flip(0)                                  # increasing t
    X = ref.X64
    eps = torch.randn(X.shape, generator=torch.Generator(device=X.device).manual_seed(ref.seed), dtype=X.dtype,
                      device=X.device)
    per_f, per_c, per_r = [], [], []
    for tt in tf.to(X.device, X.dtype):
        logp = empirical_log_posterior(X, data.y, VP().noise(X, tt, eps), tt, VP(), k)
        per_f.append(entropy(logp))
        for out, pa in ((per_c, part), (per_r, part_r)):
            out.append(entropy(torch.stack([torch.logsumexp(logp[:, pa == g], 1) for g in range(n_groups)], 1)))
    pf, pc, pr = (torch.stack(x).cpu().numpy() for x in (per_f, per_c, per_r))    # (T, n)
    t_np = tf.numpy()
    H_fine, H_coarse = pf.mean(1), pc.mean(1)
    t_fine = peak_time(tf, entropy_rate(torch.as_tensor(H_fine), tf))
    t_coarse = peak_time(tf, entropy_rate(torch.as_tensor(H_coarse), tf))
    delta, deltas = _peak_delta(t_np, pc, pf, boot, seed)       # bootstrap over the points
    return DigitGroups(decision=decision, groups=groups, t=tf, H_fine=torch.as_tensor(H_fine),
                       H_coarse=torch.as_tensor(H_coarse), t_coarse=t_coarse, t_fine=t_fine, boot=deltas,
                       ci=(delta.lo, delta.hi), delta=delta,
                       random_groups=rand, delta_random=peak_delta(t_np, pr, pf, boot, seed))


@dataclass
class DigitsGMM:
    """The paper's Gaussian-mixture theory fitted to the digits: one Gaussian per digit (its mean and covariance,
    ``ridge`` added), its entropy ``H`` on the reference's times ``t`` (CPU, Monte Carlo from the fitted mixture),
    the rate-peak times of the fitted mixture and of the empirical posterior, ``t_peak`` and ``t_peak_emp``, and the
    speciation time ``t_speciation = ½ ln Λ`` of the data covariance's top eigenvalue Λ."""

    t: Tensor
    H: Tensor
    t_peak: float
    t_peak_emp: float
    t_speciation: float
    mixture: GaussianMixture


def digits_gmm(data: Digits, ref: DigitsReference, n: int = 4000, ridge: float = 1e-3, seed: int = 0) -> DigitsGMM:
    """Fit one Gaussian per digit (maximum likelihood covariance plus ``ridge · I``, the classes' frequencies as
    weights) and compute its ``H[Y | X_t]`` from ``n`` draws of the fitted mixture (its own generator, seeded with
    ``seed``) on the reference's VP times: where the fitted theory puts the decision window against the data."""
    X, y, k = ref.X64, data.y, data.n_classes
    dev, dt = X.device, X.dtype
    eye = torch.eye(X.shape[1], dtype=dt, device=dev)
    means = torch.stack([X[y == c].mean(0) for c in range(k)])
    covs = torch.stack([torch.cov(X[y == c].T, correction=0) + ridge * eye for c in range(k)])
    weights = torch.bincount(y, minlength=k).to(dt) / len(y)
    gmm = GaussianMixture(means, covs, weights)
    g = torch.Generator(device=dev).manual_seed(seed)
    x0, _ = gmm.sample(n, g)
    eps = torch.randn(x0.shape, generator=g, dtype=dt, device=dev)
    H = torch.stack([entropy(gmm.log_posterior(VP().noise(x0, tt, eps), tt, VP())).mean() for tt in ref.t]).cpu()
    tc = ref.t.cpu()
    lam = float(torch.linalg.eigvalsh(torch.cov(X.T, correction=0)).max())
    return DigitsGMM(t=tc, H=H, t_peak=peak_time(tc, entropy_rate(H, tc)),
                     t_peak_emp=peak_time(tc, entropy_rate(ref.H_emp, tc)), t_speciation=0.5 * math.log(lam),
                     mixture=gmm)
