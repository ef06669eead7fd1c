"""Provable training-data identification: conformal p-values, π₀ estimation, BH with FIR control.

Paper: Z. Liu, H. Zeng, W. Huang, H. Wei, "Provable Training Data Identification for Large Language Models",
ICML 2026 (arXiv 2510.09717 v2; v1: "High-Power Training Data Identification with Provable Statistical
Guarantees"). Notebook: ``notebooks/11-ptdi.ipynb``.

Quick start::

    >>> import torch
    >>> from repro.papers import ptdi
    >>> gen = torch.Generator().manual_seed(0)  # 200 trials: 500 known non-members, 500 test points, half members
    >>> cal, test, is_member = ptdi.draw_scores("gaussian", 0.5, 200, 500, 500, gen)
    >>> fir, power = ptdi.fir_power(ptdi.ptdi_select(cal, test, alpha=0.1), is_member)  # PTDI (JKBB π̂₀)
    >>> _, power_bh = ptdi.fir_power(ptdi.ptdi_select(cal, test, alpha=0.1, pi0_method="bh"), is_member)  # π̂₀ = 1
    >>> print(float(fir.mean()) < 0.11, round(float(power.mean()), 2), bool(power.mean() > power_bh.mean()))
    True 0.71 True

PTDI selects, from a test set mixing a model's training data (members, share π₁) and unseen data, a subset whose
false identification rate FIR = E[#non-members selected / max(#selected, 1)] is at most α, distribution-free:
(1) a conformal p-value per test point against a calibration set of known non-members, (2) an estimate π̂₀ of
the non-member share of the test set, (3) Benjamini–Hochberg at level α on the scaled p-values π̂₀·p.

Public code checked against: none is public (searched by name and by "JKBB"); the conformal p-values, BH and
Storey's estimator are checked against statsmodels and hand computations in ``tests/papers/test_ptdi.py``.

Deliberate deviations:

* **JKBB is a reconstruction.** Only the name "Jackknife-corrected Beta boundary" is public. Here: a per-λ
  Clopper–Pearson (Beta-quantile) upper bound on π₀ from the count of p-values above λ, jackknifed per λ, then
  the minimum over λ ∈ {0.5, …, 0.9}, clipped to [0, 1] (:func:`jkbb_pi0`). Jackknifing the minimum instead is
  not monotone in the p-values, so we jackknife each boundary; these choices were made on a development seed
  before the notebook's claims were computed.
* No LLM: the scores are synthetic (two laws) and the membership pipeline is an over-fitted MLP on scikit-learn's
  bundled digits; Min-K% Prob and the zlib ratio are implemented and unit-tested but not used by the notebook.

Layout: :mod:`.method` (the statistics), :mod:`.problems` (score laws, the digits pipeline), :mod:`.experiment`
(the notebook's harness).
"""

from .experiment import *
from .method import *
from .problems import *

__all__ = [*experiment.__all__, *method.__all__, *problems.__all__]
