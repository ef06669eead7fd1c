"""Class-conditional entropy H[Z | X_t] along a diffusion: exact for Gaussian mixtures, estimated by the MMSE gap.

Paper: F. Handke, D. Stančević, F. Koulischer, T. Demeester, L. Ambrogioni, "The Entropic Signature of Class
Speciation in Diffusion Models", ICML 2026 (arXiv 2602.09651).
Notebook: ``notebooks/16-diffusion-semantic-entropy.ipynb``.

Quick start::

    >>> import torch
    >>> from repro.papers import semantic_entropy as se
    >>> gmm, sched = se.two_class_mixture(8), se.VP()  # classes ±√8·e₁, unit covariance; VP noising
    >>> t, gen = torch.logspace(-2, 1, 60, dtype=torch.float64), torch.Generator().manual_seed(0)
    >>> x0, y = gmm.sample(4000, gen); denoise = lambda x, s, label: gmm.denoiser(x, s, sched, label)  # exact D
    >>> H = se.mmse_gap_entropy(denoise, x0, y, t, sched, gmm.prior_entropy, generator=gen)  # H(Y|X_t), MMSE gap
    >>> exact = se.entropy_two_class(se.two_class_snr_statistic(t, sched, mean_norm2=8.0))  # closed form
    >>> peak, peak_exact = (se.peak_time(t, se.entropy_rate(h, t)) for h in (H, exact))  # speciation time
    >>> print(float((H - exact).abs().max()) < 0.02, round(float(H[-1]), 3), abs(peak - peak_exact) < 0.05)
    True 0.693 True

Forward processes ``x_t = a(t) x_0 + s(t) ε`` (:class:`VP`: ``a = e^{-t}``, ``s² = 1 − e^{-2t}``; :class:`VE`,
which is also EDM's σ-time: ``a = 1``, ``s = t = σ``), signal-to-noise ratio ``γ = a²/s²``.

* Exact posteriors: for a Gaussian mixture ``x_0 | y ~ N(μ_y, Σ_y)``, ``x_t | y ~ N(a μ_y, a² Σ_y + s² I)`` and
  ``p(y | x_t)`` follows by Bayes (:class:`GaussianMixture`); the training set as a mixture of Diracs gives the
  empirical posterior (:func:`empirical_log_posterior`), the ideal denoiser of that finite set.
* Two symmetric classes ``±m`` with ``Σ = σ₀² I``: the log-likelihood ratio is ``N(S, 2S)`` given the class, with
  ``S = 2a²‖m‖²/(a²σ₀² + s²)``, so ``H = E log(1 + e^{−L})``, a one-dimensional Gauss–Hermite integral
  (:func:`entropy_two_class`).
* MMSE gap (the I-MMSE identity for the Markov chain ``Y → X_0 → X_γ``):
  ``H(Y | X_γ) = H(Y) − ½ ∫₀^γ E‖E[x₀|x_u] − E[x₀|x_u, y]‖² du``, i.e. the squared gap between the unconditional
  and conditional denoisers — what a classifier-free-guided model evaluates anyway (:func:`mmse_gap_entropy`,
  integrated in log-SNR with its Jacobian ``du = u dλ``).
* Partitions ``π`` of the classes (coarse semantics) replace ``y`` by ``π(y)``: ``H[π(Z)|X_t] ≤ H[Z|X_t]``.
* Entropy rate ``dH/dt``, its peak time and width (:func:`peak_time`, :func:`fwhm`), and classifier-free-guided
  probability-flow trajectories (:func:`guided_trajectories`).

Public code checked against: none was found for the paper or its predecessor (arXiv 2506.10433); the I-MMSE
identity follows Kong et al. (arXiv 2302.03792) and the MMSE-gap estimator the MMG paper (arXiv 2509.20609).
Deliberate deviations: no EDM2-XS or Stable Diffusion (their weights cannot be had offline); the learned analogue is
a small MLP v-prediction denoiser on scikit-learn's 8×8 digits, compared with the exact posterior of the training
set; the Gaussian-mixture statements are the paper's own theory and are computed exactly.

Layout: :mod:`.method` (schedules, exact posteriors, entropies, MMSE gap, rate analysis, guidance), :mod:`.models`
(the digits denoiser and noisy classifier, trained with :func:`repro.common.train.fit`), :mod:`.problems` (the
mixtures and the digits), :mod:`.experiment` (the notebook's harness).
"""

from .experiment import *
from .method import *
from .models import *
from .problems import *

__all__ = [*experiment.__all__, *method.__all__, *models.__all__, *problems.__all__]
