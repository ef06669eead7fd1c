"""Multi-adversary Group DRO for GRPO: Prompt-GDRO and Rollout-GDRO.

Paper: K. Panaganti, Z. Liang, W. Yu, H. Mi, D. Yu, "Group Distributionally Robust Optimization-Driven
Reinforcement Learning for LLM Reasoning", ICML 2026 (arXiv 2601.19280).
Notebook: ``notebooks/15-grpo-gdro.ipynb``.
Public code checked against: github.com/kishanpb/verl-gdro (``verl/trainer/group_dro_grpo.py``,
``verl/trainer/ppo/ray_trainer.py``, ``algorithm_comparison/run_*.sh`` for the hyper-parameters).

Quick start::

    >>> import torch
    >>> from repro.papers import gdro
    >>> rewards, prompt = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0]), torch.tensor([0, 0, 0, 0, 1, 1])
    >>> print(gdro.grpo_advantages(rewards, prompt).round(decimals=3))  # GRPO: (r − group mean) / group std
    tensor([ 1., -1., -1.,  1.,  0.,  0.])
    >>> adversary, bins = gdro.PromptGDRO(num_bins=3), torch.tensor([0, 0, 1, 1, 2, 2])  # difficulty bin per prompt
    >>> for _ in range(50): _ = adversary.update(bins, losses=torch.tensor([0.1, 0.2, 0.5, 0.6, 0.9, 1.0]))
    >>> w = adversary.weights(bins); print(bool(w[0] < w[2] < w[4]), round(float(w.mean()), 3))  # hard bins weigh more
    True 1.0

Layout: :mod:`.method` (GRPO advantages, the online difficulty bins, the two adversaries, the arm-selection DP and
the theory: entropic GDRO, the square-root allocation, its shadow-price form, the WSE), :mod:`.problems` (the
heterogeneous modular-sum task with a chain-of-thought answer, and a pool of known pass rates), :mod:`.experiment`
(the tiny policy, SFT, the GRPO loop with either adversary, evaluation and diagnostics, and Rollout-GDRO on the
pool of known pass rates, where sigma differs across bins).

Deliberate deviations from the paper and the repo (each also stated in the notebook):

* The model and data: a 2-layer transformer on a modular-sum toy instead of Qwen3-Base on DAPO 14.1k.
* The difficulty statistic is the per-visit mean reward (a pass@1 estimate), not "any rollout correct" (pass@n):
  pass@n depends on n, which Rollout-GDRO varies.
* The per-prompt loss fed to both adversaries is ``1 - mean reward``: with one on-policy update per batch the
  GRPO surrogate of every prompt is exactly 0 (advantages sum to 0 per group), and so is the repo's per-sample
  policy-gradient loss in our equal-length setting.
* No KL term (the repo's coefficient is 0.001) and one update per batch (ratio 1, clip inactive).
* Hysteresis across several bins and the budget rule when no exact split exists (see :mod:`.method`).
* A warm-up epoch of plain GRPO before the adversaries act.
"""

from .experiment import *
from .method import *
from .problems import *

__all__ = [*experiment.__all__, *method.__all__, *problems.__all__]
