"""Amortized generalized Bayesian inference: one neural posterior estimator q_φ(θ | x, β) for the whole family of
power posteriors p_β(θ | x) ∝ π(θ) p(x | θ)^β, against per-(x, β) MCMC.

Paper: Sun, Nicholls, Lee, "Amortized Simulation-Based Inference in Generalized Bayes via Neural Posterior
Estimation", ICML 2026 (arXiv 2601.22367). Notebook: ``notebooks/17-amortized-gbi.ipynb``.
Public code: none was available to us (the spec names a repository we could not reach); the tasks follow the
sbibm definitions (Lueckmann et al. 2021), the flows are zuko's, the MCMC baseline is emcee's.

Quick start::

    >>> import torch
    >>> from repro.papers import gbi
    >>> _ = torch.manual_seed(0); task = gbi.GaussianLinear(dim=2)  # power posterior known in closed form
    >>> res = gbi.train_tempered_npe(task, "synth", beta_range=(0.5, 2.0), n_sims=5000, steps=400, batch=128,
    ...     lr=3e-3, kind="maf", transforms=2, hidden=(32,), generator=torch.Generator().manual_seed(0))
    >>> x, betas = torch.tensor([0.2, -0.1]), (0.5, 1.0, 2.0)  # one observation; one network for every β
    >>> sd = [float(res.posterior.sample(x, b, 4000).std(0).mean()) for b in betas]  # q(θ | x, β): no MCMC
    >>> exact = [float(task.analytic_power_posterior(x, b)[1]) for b in betas]  # p_β ∝ π(θ) p(x|θ)^β
    >>> print(sd[0] > sd[1] > sd[2], all(abs(s / e - 1) < 0.15 for s, e in zip(sd, exact)))
    True True

* :mod:`repro.papers.gbi.tasks`: Gaussian linear (analytic power posterior), two moons, SLCP and a Lorenz-96
  toy analogue, each with prior, simulator, log-likelihood and an exact sampler of the tempered joint
  f_β(θ, x) ∝ π(θ) p(x | θ)^β, whose conditional f_β(θ | x) is the power posterior.
* :mod:`repro.papers.gbi.npe`: the flow and its training by route (i) (tempered-joint synthesis) and route (ii)
  (SNIS reweighting of one β = 1 base set, w̃ ∝ p(x | θ)^(β−1)), with the weights' effective sample size;
  training runs on :func:`repro.common.train.fit`.
* :mod:`repro.papers.gbi.reference`: emcee power posteriors per (x, β), with mode jumps along the task's
  symmetries (two moons' mirror-image crescents, SLCP's sign modes) so that the walkers mix between modes, and
  exact grid references in two dimensions.
* :mod:`repro.papers.gbi.metrics`: C2ST (sbibm protocol, with its per-draw outcomes) and unbiased MMD².
* :mod:`repro.papers.gbi.experiment`: the notebook's harness (training every task and route, cached
  references, accuracy over β, noise floor and emcee baseline, crescent widths, ESS curves, amortization
  timing, the explorer's frames).
* :mod:`repro.papers.gbi.controls`: the claims' β-blind control (the exact β = 1 posterior answered for every β)
  and the statistics that the claims' bootstrap over the draws recomputes.

Deliberate deviations: C2ST's classifier stops early (sbibm trains up to 10 000 epochs); two moons' radius is
truncated to r > 0 (so its density is exact) and refuses β ≥ 2 (improper tempered joint); SLCP refuses
β ≥ 9/8; the Lorenz-96 task is a toy analogue without stochastic forcing (tractable likelihood); route (ii)
normalises the SNIS weights over the whole base set and resamples minibatches with them (``snis="batch"``: the
cheaper within-minibatch variant).
"""

from . import controls
from .experiment import *
from .metrics import *
from .npe import *
from .reference import *
from .tasks import *

__all__ = [*experiment.__all__, *metrics.__all__, *npe.__all__, *reference.__all__, *tasks.__all__, "controls"]
