"""Experiment harness of notebook 11: the synthetic FIR/power study, the π̂₁-against-π₁ study, the digits
membership pipeline and one-trial examples for the figures. Each function draws from the caller's
``torch.Generator`` in a fixed order, so a notebook that calls them in the same order reproduces its numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ...common import stats
from .method import bh_select, conformal_pvalues, estimate_pi0, fir_power, scaled_bh
from .problems import DigitsScores, draw_scores, resample_membership

__all__ = [
    "ESTIMATORS", "METHODS", "DigitsStudy", "Example", "Pi0Curve", "Selection", "Study", "digits_pvalues",
    "digits_study", "example", "pi1_curve", "select_all", "synthetic_study",
]

Tensor = torch.Tensor

# name -> π̂₀ rule ("naive" is the per-point test p ≤ α, no multiplicity correction; "oracle" uses the true π₀)
METHODS: dict[str, str] = {
    "naive": "naive threshold (p ≤ α)",
    "bh": "BH",
    "storey": "Storey-BH",
    "bb": "BB-BH (no jackknife)",
    "jkbb": "PTDI (JKBB)",
    "oracle": "oracle π₀",
    "anti": "negative control (JKBB − 0.03)",
}
ANTI_SHIFT = 0.03  # the negative control: JKBB moved down by this much, an anti-conservative π̂₀ C1's rule must flag
ESTIMATORS = ("storey", "bb", "jkbb")


@dataclass
class Selection:
    """Mean false identification proportion (FIR), its standard error over trials and mean power, per
    ``(alpha, method)``; plus the π̂₀ of every estimator in every trial."""

    alphas: list[float]
    methods: list[str]
    fir: np.ndarray
    fir_se: np.ndarray
    power: np.ndarray
    pi0_hat: dict[str, np.ndarray]
    trials: int


def select_all(p: Tensor, is_member: Tensor, alphas: list[float], pi0_true: float) -> Selection:
    """Run every method of :data:`METHODS` at every level on the same p-values ``(trials, m)``."""
    pi0 = {name: estimate_pi0(p, name) for name in ("bh", *ESTIMATORS)}
    pi0["oracle"] = estimate_pi0(p, pi0_true)
    pi0["anti"] = (pi0["jkbb"] - ANTI_SHIFT).clamp(min=1e-3)
    methods = list(METHODS)
    shape = (len(alphas), len(methods))
    fir, se, power = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    for a, alpha in enumerate(alphas):
        for k, name in enumerate(methods):
            sel = p <= alpha if name == "naive" else scaled_bh(p, pi0[name], alpha)
            fdp, tpp = fir_power(sel, is_member)
            fir[a, k], power[a, k] = float(fdp.mean()), float(tpp.mean())
            se[a, k] = stats.se(fdp.cpu().numpy())
    return Selection(list(alphas), methods, fir, se, power,
                     {k: v.cpu().numpy() for k, v in pi0.items() if k in ESTIMATORS}, p.shape[0])


@dataclass
class Study:
    """The synthetic study: :class:`Selection` per ``(law, π₁)``; arrays indexed ``[law, π₁, α, method]``."""

    laws: list[str]
    pi1s: list[float]
    alphas: list[float]
    methods: list[str]
    fir: np.ndarray
    fir_se: np.ndarray
    power: np.ndarray
    pi0_hat: dict[str, np.ndarray] = field(default_factory=dict)  # estimator -> [law, π₁, trial]
    trials: int = 0
    bh_mismatch: int = 0  # trials where bh_select and statsmodels' fdr_bh disagree (one trial per setting)

    def index(self, name: str) -> int:
        return self.methods.index(name)

    def excess(self, name: str) -> np.ndarray:
        """``FIR − (α + 2 SE)`` of a method per ``[law, π₁, α]`` (≤ 0: controlled at the claims' tolerance)."""
        k = self.index(name)
        return self.fir[..., k] - (np.asarray(self.alphas)[None, None, :] + 2 * self.fir_se[..., k])


def _statsmodels_mismatch(p: Tensor, alpha: float) -> int:
    """1 if our BH and statsmodels' ``multipletests(method="fdr_bh")`` disagree on the first trial."""
    from statsmodels.stats.multitest import multipletests

    ref = multipletests(p[0].cpu().numpy(), alpha=alpha, method="fdr_bh")[0]
    return int(not np.array_equal(bh_select(p[0], alpha).cpu().numpy(), ref))


def synthetic_study(laws: list[str], pi1s: list[float], alphas: list[float], trials: int, m: int, n: int,
                    gen: torch.Generator, *, device: torch.device | str = "cpu",
                    dtype: torch.dtype = torch.float64) -> Study:
    """FIR and power of every method, every score law × member share × level, ``trials`` independent problems
    each (fresh calibration and test sets per trial)."""
    shape = (len(laws), len(pi1s), len(alphas), len(METHODS))
    fir, se, power = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    pi0_hat = {k: np.zeros((len(laws), len(pi1s), trials)) for k in ESTIMATORS}
    mismatch = 0
    for i, law in enumerate(laws):
        for j, pi1 in enumerate(pi1s):
            cal, test, mem = draw_scores(law, pi1, trials, m, n, gen, device=device, dtype=dtype)
            p = conformal_pvalues(cal, test)
            res = select_all(p, mem, alphas, 1.0 - mem[0].double().mean().item())
            fir[i, j], se[i, j], power[i, j] = res.fir, res.fir_se, res.power
            for k in ESTIMATORS:
                pi0_hat[k][i, j] = res.pi0_hat[k]
            mismatch += sum(_statsmodels_mismatch(p, a) for a in alphas)
    return Study(list(laws), list(pi1s), list(alphas), list(METHODS), fir, se, power, pi0_hat, trials, mismatch)


@dataclass
class Pi0Curve:
    """π̂₁ = 1 − π̂₀ of each estimator against the true π₁: mean and standard deviation over trials,
    indexed ``[law, π₁]`` per estimator."""

    laws: list[str]
    pi1s: list[float]
    mean: dict[str, np.ndarray]
    sd: dict[str, np.ndarray]


def pi1_curve(laws: list[str], pi1s: list[float], trials: int, m: int, n: int, gen: torch.Generator, *,
              device: torch.device | str = "cpu", dtype: torch.dtype = torch.float64) -> Pi0Curve:
    """Estimate the member share with Storey, the Beta boundary and JKBB on a grid of true shares."""
    mean = {k: np.zeros((len(laws), len(pi1s))) for k in ESTIMATORS}
    sd = {k: np.zeros((len(laws), len(pi1s))) for k in ESTIMATORS}
    for i, law in enumerate(laws):
        for j, pi1 in enumerate(pi1s):
            cal, test, _ = draw_scores(law, pi1, trials, m, n, gen, device=device, dtype=dtype)
            p = conformal_pvalues(cal, test)
            for k in ESTIMATORS:
                est = 1.0 - estimate_pi0(p, k)
                mean[k][i, j], sd[k][i, j] = float(est.mean()), stats.sd(est.cpu().numpy())
    return Pi0Curve(list(laws), list(pi1s), mean, sd)


@dataclass
class Example:
    """One test set: p-values, member mask and each estimator's π̂₀ (for histograms and the explorer)."""

    p: np.ndarray
    is_member: np.ndarray
    pi0_hat: dict[str, float]


def example(law: str, pi1: float, m: int, n: int, gen: torch.Generator) -> Example:
    """One synthetic trial of the given law and member share."""
    cal, test, mem = draw_scores(law, pi1, 1, m, n, gen)
    p = conformal_pvalues(cal, test)
    return Example(p[0].numpy(), mem[0].numpy(), {k: float(estimate_pi0(p, k)[0]) for k in ESTIMATORS})


@dataclass
class DigitsStudy:
    """The digits pipeline: :class:`Selection` per member share (``[π₁, α, method]``)."""

    pi1s: list[float]
    alphas: list[float]
    methods: list[str]
    fir: np.ndarray
    fir_se: np.ndarray
    power: np.ndarray
    pi0_hat: dict[str, np.ndarray]
    m: int
    n: int
    trials: int

    def excess(self, name: str) -> np.ndarray:
        k = self.methods.index(name)
        return self.fir[..., k] - (np.asarray(self.alphas)[None, :] + 2 * self.fir_se[..., k])


def digits_study(scores: DigitsScores, pi1s: list[float], alphas: list[float], m: int, n: int, trials: int,
                 gen: torch.Generator) -> DigitsStudy:
    """Random calibration/test splits of the digits score pools (no retraining), every method and level."""
    shape = (len(pi1s), len(alphas), len(METHODS))
    fir, se, power = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    pi0_hat = {k: np.zeros((len(pi1s), trials)) for k in ESTIMATORS}
    for j, pi1 in enumerate(pi1s):
        cal, test, mem = resample_membership(scores.member, scores.nonmember, pi1, m, n, trials, gen)
        p = conformal_pvalues(cal, test)
        res = select_all(p, mem, alphas, 1.0 - mem[0].double().mean().item())
        fir[j], se[j], power[j] = res.fir, res.fir_se, res.power
        for k in ESTIMATORS:
            pi0_hat[k][j] = res.pi0_hat[k]
    return DigitsStudy(list(pi1s), list(alphas), list(METHODS), fir, se, power, pi0_hat, m, n, trials)


def digits_pvalues(scores: DigitsScores, pi1: float, m: int, n: int, gen: torch.Generator) -> Example:
    """One digits split (for the p-value histogram)."""
    cal, test, mem = resample_membership(scores.member, scores.nonmember, pi1, m, n, 1, gen)
    p = conformal_pvalues(cal, test)
    return Example(p[0].cpu().numpy(), mem[0].cpu().numpy(), {k: float(estimate_pi0(p, k)[0]) for k in ESTIMATORS})
