"""d3LLM: entropy-based multi-block decoding, KV-cache refresh, pseudo-trajectory distillation and AUP.

Paper: Y.-Y. Qian, J. Su, L. Hu, P. Zhang, Z. Deng, P. Zhao, H. Zhang, "d3LLM: Ultra-Fast Diffusion LLM using
Pseudo-Trajectory Distillation", ICML 2026 (arXiv 2601.07568). Notebook: ``notebooks/03-d3llm.ipynb``.
Public code checked against: github.com/hao-ai-lab/d3LLM (``generate_multi_block``,
``generate_multi_block_kv_cache``, ``get_transfer_index_entropy``, the distillation trainer,
``AUP_leaderboard/aup_utils.get_aup``); the implementation is ours, batched over prompts and device-agnostic.

Quick start::

    >>> import torch
    >>> from repro.papers import d3llm
    >>> task = d3llm.ChainTask(n_operands=3, modulus=3, eos_pad=2)  # BOS a1 a2 a3 = → a2 s2 a3 s3 EOS EOS
    >>> recipe = d3llm.Recipe(d_model=32, n_layers=2, n_heads=2, ar_steps=100, diff_steps=200, batch=32, lr=5e-3)
    >>> model, _, _ = d3llm.train_teacher(task, recipe, seed=0)  # autoregressive warm-up, then masked diffusion
    >>> prompt, answer = task.sample(200, torch.Generator().manual_seed(1))  # 200 fresh problems
    >>> slow, fast = (d3llm.decode_multiblock(model, prompt, task.answer_len, 8, tau, mask_id=task.mask_id,
    ...     eos_id=task.eos_id, early_stop=True, **d3llm.ENTROPY_DECODING) for tau in (0.3, 2.0))  # notebook 03's
    >>> acc = [d3llm.accuracy(out, answer, task) for out in (slow, fast)]  # settings; exact answers in %
    >>> print(fast.tpf > slow.tpf + 2, acc[0] > 90, acc[1] < acc[0] - 20)  # entropy threshold τ: speed vs accuracy
    True True True

Layout: :mod:`.method` (AUP, transfer rules, the :class:`Denoiser`, the decoders, the losses and trainings),
:mod:`.problems` (:class:`ChainTask`, the generated task), :mod:`.experiment` (the notebook's harness: teacher,
distillation, curves, AUP table, KV-cache sweep).

Deliberate deviations from the paper and its code:

* a small bidirectional transformer trained here on a generated chain task, not LLaDA-8B / Dream-7B on GSM8K
  (neither can be had offline); the teacher is trained Dream-style (autoregressive warm-up, then masked diffusion);
* the student is the teacher fine-tuned in full (the paper: LoRA, rank 256), with a constant learning rate; the
  block-size curriculum is the paper's scaled to our decoding block;
* full bidirectional attention with shifted logits (Dream's block-causal mask is not used); greedy decoding;
* the LLaDA code's always-accept-the-lowest-entropy rule is used for every model (the Dream code has none);
* KV refresh: the cache stands for a prefix of finished blocks; the public code also truncates a refreshed cache at
  the start of the latest stabilising block, we keep it at the cached prefix;
* early stopping is applied before the completion check, so everything after the first EOS is EOS in every case;
  the public code (its generators, e.g. ``d3llm/d3llm_DREAM/d3llm_dream_generate_util.py``: the
  ``total_masks == 0`` break comes before ``handle_early_stop`` in the decoding loop) checks for completion
  first, so an EOS decoded by the last forward (with the last masked positions) leaves the tokens decoded after
  it; it also counts a forward (``nfe += 1``) before the early stop can end the loop without one; we count
  forwards only when one runs;
* AUP comparisons of two models (:func:`aup_table`) use one reference accuracy for the 5-point cut, the teacher's
  at one token per forward (the public ``get_aup`` uses each curve's first point).
"""

from .experiment import *
from .method import *
from .problems import *

__all__ = [*experiment.__all__, *method.__all__, *problems.__all__]
