"""Knowledge editing, dimensional collapse and reasoning collapse: ROME / MEMIT / AlphaEdit against retrieval.

Paper: Ren, Song, Wang, He, Sun, "Revisiting Parameter-Based Knowledge Editing in LLMs: Theoretical Limits and
Empirical Evidence", ICML 2026 (arXiv 2606.00570). Notebook: ``notebooks/06-knowledge-editing-collapse.ipynb``.

No official code was found. The editors follow their original papers: ROME (Meng et al. 2022, rank-one update
with key statistics C), MEMIT (Meng et al. 2023, batch ridge update ``Δ = R Kᵀ (C + K Kᵀ)⁻¹``), AlphaEdit
(Fang et al. 2025, update projected onto the null space of preserved keys); the retrieval editor is the SCR
baseline (He, Song, Sun 2025) with a cosine-similarity gate standing in for SCR's LLM confirmation step.

Deliberate deviations (a toy analogue of the paper's 8B models):

* a 3-layer, d = 96 causal transformer (``repro.common.nn``) trained on facts, chain-of-thought modular sums and
  in-context overrides (:mod:`.problems`), instead of pretrained reasoning LLMs;
* edits at the MLP output matrix of block 0 (where this toy stores subject → object; the middle block gave poor
  reliability in the spec's prototype); MEMIT edits this one layer (the original spreads over several) with
  ``C = memit_weight · E[kkᵀ]``; AlphaEdit's null space uses a relative eigenvalue tolerance;
* ROME's key statistics C come from fact and context sequences only, the analogue of ROME's Wikipedia statistics
  that do not cover the tested skill; C from the full training mix is run as a control;
* metrics by greedy decoding with exact match (the paper uses an LLM judge); no paraphrase generalisation (one
  surface form per fact in the toy);
* R_k from the exact hidden-state change ``dH`` (after minus before), not the first-order estimate.

Layout: :mod:`.method` (editors, v*, R_k, effective rank, retrieval editor), :mod:`.problems` (the toy world),
:mod:`.experiment` (the notebook's harness).
"""

from repro.common.numerics import loglog_slope

from .experiment import (
    EDITORS,
    Suite,
    Trace,
    block_outputs,
    compare_editors,
    edit_target,
    edit_targets,
    evaluate,
    key_statistics,
    make_suite,
    mlp_keys,
    rk_summary,
    run_parametric,
    run_retrieval,
    single_edit_reliability,
    train_toy,
)
from .method import (
    RetrievalEditor,
    VStarProblem,
    alphaedit_projector,
    alphaedit_update,
    effective_rank,
    key_covariance,
    mean_key,
    memit_update,
    optimize_v_star,
    optimize_v_stars,
    relative_change_rates,
    rome_update,
)
from .problems import World, make_world, render

__all__ = [
    "EDITORS", "RetrievalEditor", "Suite", "Trace", "VStarProblem", "World", "alphaedit_projector",
    "alphaedit_update", "block_outputs", "compare_editors", "edit_target", "edit_targets", "effective_rank",
    "evaluate", "key_covariance", "key_statistics", "loglog_slope", "make_suite", "make_world", "mean_key",
    "memit_update", "mlp_keys", "optimize_v_star", "optimize_v_stars", "relative_change_rates", "render",
    "rk_summary", "rome_update", "run_parametric", "run_retrieval", "single_edit_reliability", "train_toy",
]
