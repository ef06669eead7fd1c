"""Amortized generalized Bayesian inference: one neural posterior estimator q_φ(θ | x, β) for the whole family of
power posteriors p_β(θ | x) ∝ π(θ) p(x | θ)^β, against per-(x, β) MCMC.

Paper: Sun, Nicholls, Lee, "Amortized Simulation-Based Inference in Generalized Bayes via Neural Posterior
Estimation", ICML 2026 (arXiv 2601.22367). Notebook: ``notebooks/17-amortized-gbi.ipynb``.

* :mod:`repro.gbi.tasks`: Gaussian linear (analytic power posterior), two moons, SLCP and a Lorenz-96 toy
  analogue, each with prior, simulator, log-likelihood and an exact sampler of the tempered joint
  f_β(θ, x) ∝ π(θ) p(x | θ)^β, whose conditional f_β(θ | x) is the power posterior.
* :mod:`repro.gbi.npe`: the flow and its training by route (i) (tempered-joint synthesis) and route (ii)
  (SNIS reweighting of one β = 1 base set, w̃ ∝ p(x | θ)^(β−1)), with the weights' effective sample size.
* :mod:`repro.gbi.reference`: emcee power posteriors per (x, β) and exact grid references in two dimensions.
* :mod:`repro.gbi.metrics`: C2ST (sbibm protocol) and unbiased MMD².
"""

from .metrics import c2st, mmd2
from .npe import (
    ROUTES,
    AmortizedPosterior,
    TrainResult,
    ess,
    gaussian_ess_fraction,
    make_flow,
    sample_log_uniform,
    snis_weights,
    train_tempered_npe,
)
from .reference import GridPosterior, MCMCResult, mcmc_power_posterior
from .tasks import (
    SLCP,
    TASKS,
    GaussianLinear,
    Lorenz96Toy,
    Task,
    TwoMoons,
    as_beta,
    lorenz96_rhs,
    lorenz96_summaries,
    lorenz96_trajectory,
    make_task,
    rk4_step,
)

__all__ = [
    "ROUTES", "SLCP", "TASKS", "AmortizedPosterior", "GaussianLinear", "GridPosterior", "Lorenz96Toy", "MCMCResult",
    "Task", "TrainResult", "TwoMoons", "as_beta", "c2st", "ess", "gaussian_ess_fraction", "lorenz96_rhs",
    "lorenz96_summaries", "lorenz96_trajectory", "make_flow", "make_task", "mcmc_power_posterior", "mmd2", "rk4_step",
    "sample_log_uniform", "snis_weights", "train_tempered_npe",
]
