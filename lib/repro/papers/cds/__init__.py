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

from .experiment import (
    BruteForceCheck,
    OrderStudy,
    PoolStats,
    ShotCurve,
    SimilarityStudy,
    accuracy_vs_shots,
    bayes_cot_accuracy,
    brute_force_check,
    brute_force_tour,
    copy_rule,
    demo_states,
    draw_pools,
    mean_turning_degrees,
    order_spread,
    order_study,
    pca2,
    pool_statistics,
    shot_curve,
    similarity_study,
    template_switches,
    toy_model,
    train_toy,
)
from .llm import (
    QUERY,
    Generation,
    LLMStudy,
    demo_orders,
    demo_prompt,
    encode,
    finished,
    greedy_after_prefix,
    icl_answers,
    llm_order_study,
    parse_answer,
    prefix_cache,
)
from .method import (
    break_cycle,
    cds_cost_matrix,
    cds_order,
    curvature_score,
    nearest_neighbor_tour,
    tour_cost,
    turning_angles,
    two_opt,
)
from .problems import (
    ARITH_OPS,
    TEMPLATES,
    ArithmeticSet,
    ProblemPool,
    ToyFormat,
    affine_tasks,
    arithmetic_problems,
    demo_tokens,
    embed_texts,
    gaussian_pools,
    word_problems,
)

__all__ = [
    "ARITH_OPS", "QUERY", "ArithmeticSet", "Generation", "LLMStudy", "arithmetic_problems", "demo_orders",
    "demo_prompt", "encode", "finished", "greedy_after_prefix", "icl_answers", "llm_order_study", "parse_answer",
    "prefix_cache",
    "TEMPLATES", "BruteForceCheck", "OrderStudy", "PoolStats", "ProblemPool", "ToyFormat", "accuracy_vs_shots",
    "affine_tasks", "bayes_cot_accuracy", "break_cycle", "brute_force_check", "brute_force_tour", "cds_cost_matrix",
    "cds_order", "copy_rule", "curvature_score", "demo_states", "demo_tokens", "draw_pools", "embed_texts",
    "gaussian_pools",
    "mean_turning_degrees", "nearest_neighbor_tour", "order_spread", "order_study", "pca2", "pool_statistics",
    "ShotCurve", "SimilarityStudy", "shot_curve", "similarity_study", "template_switches",
    "toy_model", "tour_cost", "train_toy", "turning_angles", "two_opt", "word_problems",
]
