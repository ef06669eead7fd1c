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

Full mode adds a tier on a real pretrained LM (:mod:`.llm`): SmolLM2-135M-Instruct
(``repro.common.assets.load_smollm2``), up to 200 sequential ROME / MEMIT edits of facts it knows (written in
:mod:`.llm`, kept when the model answers them correctly by greedy decoding) at the MLP ``down_proj`` of layer 10 of
30, ``C`` from Python standard-library docstrings, against retrieval with the MiniLM gate; MEMIT also spread over
layers 6–10 as MEMIT does (:func:`.llm.memit_spread`). Its deviations: ``k*`` is the subject's key in the plain
prompt (ROME averages the direction over prefixed prompts); v* optimises the first token of the new object only
(single-token objects); no norm clamp on δ (an L2 penalty instead); the reasoning probe is few-shot one-digit
addition and word copying.

Layout: :mod:`.method` (editors, v*, R_k, effective rank, retrieval editor), :mod:`.problems` (the toy world),
:mod:`.experiment` (the notebook's harness), :mod:`.llm` (the SmolLM2 tier).
"""

from repro.common.numerics import loglog_slope

from .experiment import *
from .llm import *
from .method import *
from .problems import *

__all__ = [*experiment.__all__, *llm.__all__, *method.__all__, *problems.__all__, "loglog_slope"]
