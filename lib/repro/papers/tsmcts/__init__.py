"""SMC, SMCTS and TSMCTS as policy-improvement operators, against Gumbel MuZero, on mazes with exact ``Q*``.

Paper: Y. Oren, J. A. de Vries, P. R. van der Vaart, M. T. J. Spaan and W. Böhmer, "Twice Sequential Monte
Carlo for Tree Search", ICML 2026 (arXiv 2511.14220; v1 titled "Parallelizing Tree Search with Twice Sequential
Monte Carlo"). Notebook: ``notebooks/18-tsmcts.ipynb``.

Quick start::

    >>> import torch
    >>> from repro.papers import tsmcts
    >>> suite = tsmcts.make_maze_suite(20, seed=0); V, Q = tsmcts.value_iteration(suite.model)  # exact V*, Q*
    >>> net = tsmcts.make_network(suite.model, V, Q, sigma_v=0.3, seed=0)  # an imperfect prior/value network
    >>> roots, gen = suite.roots.repeat(4), torch.Generator().manual_seed(0)  # 40 roots, 4 searches each
    >>> smc = tsmcts.smc_search(suite.model, net, roots, 32, 32, tau=0.1, generator=gen)  # 32 particles, depth 32
    >>> ts = tsmcts.tsmcts_search(suite.model, net, roots, 32, 32, tau=0.1, generator=gen)  # same model calls
    >>> print(smc.diagnostics.model_calls == ts.diagnostics.model_calls, float(smc.diagnostics.unique_ancestors
    ...       .float().mean()) < 1.5, int(ts.diagnostics.unique_ancestors.min()))  # SMC degenerates, TSMCTS keeps 4
    True True 4

Public code: none found (searched for "TSMCTS" and the authors' names; ``hogunkee/TSMCTS`` is unrelated). The
paper's algorithm box was **not readable** here (only the abstract and introduction of arXiv v1/v2 and third-party
summaries), so the searches are a **reconstruction** from the paper's text, labelled as such in the notebook:

* :func:`smc_search` — the SMC baseline in the style of SPO (Macfarlane et al., NeurIPS 2024) / TRT-SMC (de Vries
  et al., ICML 2025): twisted SMC with advantage weights and ESS-triggered systematic resampling; policy target =
  weighted histogram of the final particles' root ancestors.
* :func:`smcts_search` — SMC read as a tree search (our reading of the paper's SMCTS): Gumbel-top-m root actions,
  one SMC group per action resampled only within itself, root Q backed up per group, Gumbel MuZero outputs.
* :func:`tsmcts_search` — SMCTS inside Sequential Halving over the particle budget, following Gumbel MuZero's
  schedule (``mctx``'s ``get_sequence_of_considered_visits``); each round's particles run the full depth, so
  every operator spends exactly ``N · K`` model calls per search.
* :func:`gumbel_mcts_reference` — Gumbel MuZero through ``mctx`` (import-guarded), the "modern MCTS".
* the controls of the harness (:data:`OPERATORS`): ``"SH-MC"`` (TSMCTS without twist, hence without resampling:
  Sequential Halving over plain rollouts) and ``"MC"`` (SMC without twist: plain Monte Carlo rollouts).

Deliberate choices, all stated in the notebook: halving is batched per round (mctx re-scores after every
simulation; a particle round re-scores once); ``σ`` uses particle counts as visit counts with mctx's constants
``c_visit = 50``, ``c_scale = 0.1``; the root value of (T)SMCTS is the particle-weighted mean of ``Q̂`` (MCTS's root
value); resampling is never done after the last step; no trust region on the proposal (TRT-SMC's) and no
terminal-state special-casing beyond absorbing zero-reward terminals.

Layout: :mod:`.method` (operators and Gumbel MuZero pieces, batched torch on any device), :mod:`.problems`
(tabular model, value iteration, mazes, the imperfect network), :mod:`.reference` (mctx), :mod:`.experiment`
(the notebook's harness).
"""

from .experiment import *
from .method import *
from .problems import *
from .reference import *

__all__ = [*experiment.__all__, *method.__all__, *problems.__all__, *reference.__all__]
