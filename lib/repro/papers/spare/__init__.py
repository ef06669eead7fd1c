"""SpaRE: controllable molecule generation by editing a language model's representation with concept vectors
built from a sparse autoencoder (SAE).

Paper: Z. Li, X. Sun, W. Lin, C. W. Chen, "SpaRE: Controllable Molecule Generation via Sparse Representation
Editing", ICML 2026 (OpenReview ryO12fv5bJ).
Notebook: ``notebooks/04-spare-molecules.ipynb``.

Quick start::

    >>> import torch
    >>> from repro.papers import spare
    >>> _ = torch.manual_seed(0); acts = torch.randn(4096, 16)  # activation rows of some layer
    >>> sae = spare.train_sae(acts, expansion=4, epochs=4, batch_size=256, lr=3e-3)
    >>> pos, neg = acts[:256] + 3 * torch.eye(16)[0], acts[256:512]  # a concept planted along axis 0
    >>> vec, ids, mode = spare.global_concept(sae, pos, neg, fallback=True)  # the public 0.5 rule
    >>> print(len(ids), mode, torch.cosine_similarity(vec, torch.eye(16)[0], dim=0).item() > 0.9)  # no feature passes
    0 mean_decoder_difference True

Public code checked against: WanyuGroup/ICML2026_SpaRE @ b0ce480 (``src/spare_molgen/{sae,concepts,hooks,generation,
activation_store}.py``, ``configs/*.yaml``, ``docs/method_mapping.md``). The SAE (ReLU codes, L2 code
normalisation, MSE + λ·mean|h|), the local rule (code ≥ 0.5 in ``min_fraction`` of the exemplars, mean of decoder
atoms), the global rule (≥ 0.5 on every positive, < 0.5 on every negative, ``v = W_d δ``), the last-position hook
and the step-gated local edit follow that code; the implementation is ours.

Layout: :mod:`.method` (SAE, concept rules, :class:`ActivationEditor`, :func:`generate_with_edits`),
:mod:`.molecules` (MOSES data from the ``molsets`` wheel, SELFIES, RDKit properties, generation metrics),
:mod:`.experiment` (the notebook's harness: tiny GPT, activations, sweeps, controls, readout analysis, local probe).

Deliberate deviations:

* A zero-feature global concept raises instead of falling back silently; the public mean-difference fallback is
  available with ``global_concept(..., fallback=True)`` and its ``mode`` says so.
* Generation reads earlier positions from a KV cache filled by unedited passes; the public loop re-runs the prefix
  every step. Both give the same distributions (tested; ``recompute=True`` runs the literal loop), and the loop is
  batched.
* :func:`ranked_concept` (top-``k`` features by mean code difference) is ours, not the paper's: a sparse global
  vector for when the strict rule selects nothing.
* The notebook's model is a 2-layer GPT on plain SELFIES (Group SELFIES is not on PyPI) trained here on MOSES,
  unconditional (BOS prompt), instead of the fine-tuned MolXPT on ChEBI-20 text prompts.
"""

from repro.papers import lazy_exports

from .method import *

# The molecules (rdkit, selfies) and the notebook's harness load on first use (repro.papers.lazy_exports): the
# method itself, the SAE and the editor, needs only torch.
_LAZY: dict[str, list[str]] = {"experiment": [], "molecules": []}  # the submodules themselves
__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)

__all__ = [*method.__all__, *_LAZY]
