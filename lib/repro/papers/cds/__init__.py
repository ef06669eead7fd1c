"""Curvilinear Demonstration Selection (CDS) and a toy many-shot chain-of-thought in-context learner.

Paper: Tsz Ting Chung, Lemao Liu, Mo Yu, Dit-Yan Yeung, "Many-Shot CoT-ICL: Making In-Context Learning Truly Learn",
ICML 2026 (Findings), arXiv 2605.13511. Notebook: ``notebooks/02-many-shot-cot-icl.ipynb``.
Public code checked against: ``github.com/TTChungC/Manyshot-CoT-ICL`` (``cot_icl/cds/tsp.py``: the cost matrix,
nearest-neighbour tours, 2-opt, cycle breaking and the score; reimplemented, not copied).

CDS *orders* a fixed set of demonstrations (it does not select a subset): a closed tour through the demos' embeddings
under an asymmetric cost mixing Euclidean distance and the turning angle towards the "anticipated next step", cut at
its most expensive edge, best of 10 deterministic starts by the path's smoothness ``1/(1 + mean turning angle)``.

Deliberate deviations:

* the published ``get_optimal_order`` passes ``strategy=`` to a function whose keyword is ``strat`` (a TypeError);
  the strategy is honoured here;
* 2-opt compares the cost change of a reversal (prefix sums) with ``-1e-12`` instead of recomputing the whole tour
  and comparing the totals with ``<``; the tours equal the literal loop's on the tests' instances;
* zero-length steps (duplicate demos, frequent in the toy task) give a turning angle of 0 in the cost matrix and
  are left out of the score, as the repo's ``continue`` does;
* embeddings: all-MiniLM-L6-v2 (offline wheel) instead of bge-m3; demos are generated worked word problems
  (:mod:`.problems`) instead of MATH subtasks; the toy learner (Part B) is an analogue of an LLM, not the paper's
  setting;
* the LLM tier (:mod:`.llm`, full mode only) uses SmolLM2-135M-Instruct (offline wheel) on generated 1-2 digit
  arithmetic word problems with one- or two-step chains of thought, 4-64 shots, instead of 14B+ models on MATH;
  prompts are raw text (no chat template), demos in the public code's "Problem:/Solution:" format.

Layout: :mod:`.method` (CDS), :mod:`.problems` (demo pools, embeddings, toy task, arithmetic problems),
:mod:`.experiment` (harness of Parts A and B: pool statistics, the brute-force check, the toy learner with the copy
rule as its null, held-out-input queries, order effects, the spread over orders and similarity-based selection),
:mod:`.llm` (the SmolLM2 tier: cached many-shot prompting).
"""

from .experiment import *
from .llm import *
from .method import *
from .problems import *

__all__ = [*experiment.__all__, *llm.__all__, *method.__all__, *problems.__all__]
