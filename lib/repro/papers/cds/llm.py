"""Many-shot CoT-ICL with a real small LM (the full-mode tier of notebook 02): SmolLM2-135M-Instruct answers 1-2
digit arithmetic word problems after ``k`` worked demonstrations, placed in random, CDS or high-curvature order.

Paper: Chung, Liu, Yu, Yeung, "Many-Shot CoT-ICL: Making In-Context Learning Truly Learn", ICML 2026 (Findings),
arXiv 2605.13511. CDS orders a fixed demo set (it selects nothing); the abstract's "up to 5.42 percentage-point
gain on a math task with 64 demonstrations" is gpt-5.2 on MATH geometry (Table 3: 75.37 -> 80.79).

Prompt: the demos as the public code writes them, ``"Problem:\\n{problem}\\nSolution:\\n{solution}"``, separated by
a blank line, then the question and ``"Solution:\\n"``; greedy decoding until a blank line (or a line break after
"The answer is N"); the answer is the number after "The answer is" (:func:`parse_answer`).

Cost: the demo prefix (about 2.5k tokens at 64 shots) runs once per (shots, order) (:func:`prefix_cache`); its
key/value cache is copied for a batch of questions (:func:`greedy_after_prefix`). The questions are left-padded
*after* the prefix, the pads masked out and the positions continuing the prefix's, so each question sees exactly
the tokens ``prefix + question`` (the tests compare the logits with one plain forward pass of the whole text);
finished rows leave the batch. transformers is imported only when a cache is built.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...common import stats
from ...common.seeding import derive
from .method import cds_order
from .problems import ArithmeticSet

__all__ = [
    "QUERY", "Generation", "LLMStudy", "demo_orders", "demo_prompt", "encode", "finished", "greedy_after_prefix",
    "icl_answers", "llm_order_study", "parse_answer", "prefix_cache",
]

Tensor = torch.Tensor
DEMO = "Problem:\n{q}\nSolution:\n{s}\n\n"
QUERY = "Problem:\n{q}\nSolution:\n"
_ANSWER = re.compile(r"The answer is\s*(-?\d+(?:\.\d+)?)")


def demo_prompt(pool: ArithmeticSet, order: Sequence[int]) -> str:
    """The many-shot prefix: demos ``pool[order[0]], pool[order[1]], ...`` each followed by a blank line."""
    order = [int(i) for i in order]
    if not order:
        raise ValueError("need at least one demonstration")
    if min(order) < 0 or max(order) >= len(pool):
        raise ValueError(f"demo indices must lie in [0, {len(pool) - 1}], got {min(order)}..{max(order)}")
    return "".join(DEMO.format(q=pool.questions[i], s=pool.solutions[i]) for i in order)


def parse_answer(text: str) -> float | None:
    """The number after the first "The answer is" in the completion's first block (up to a blank line), or
    ``None`` when there is none."""
    m = _ANSWER.search(text.split("\n\n")[0])
    return float(m.group(1)) if m else None


def finished(text: str) -> bool:
    """Stop rule of the decoder: a blank line, or a line break after "The answer is"."""
    i = text.find("The answer is")
    return "\n\n" in text or (i >= 0 and "\n" in text[i:])


def encode(tokenizer: Any, text: str) -> Tensor:
    """Token ids ``(n,)`` of ``text`` without special tokens (SmolLM2's tokenizer adds none anyway)."""
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if not ids:
        raise ValueError("empty text")
    return torch.tensor(ids, dtype=torch.long)


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def prefix_cache(model: Any, prefix_ids: Tensor) -> Any:
    """Run the demo prefix ``(L,)`` once (only the last position's logits are computed); returns its key/value
    cache, a transformers ``DynamicCache`` of batch 1 and length ``L``."""
    if prefix_ids.ndim != 1 or prefix_ids.numel() == 0:
        raise ValueError(f"prefix_ids must be a non-empty 1-d tensor, got shape {tuple(prefix_ids.shape)}")
    return model(input_ids=prefix_ids[None].to(_device(model)), use_cache=True, logits_to_keep=1).cache


def _copy_cache(cache: Any, rows: int) -> Any:
    """A fresh ``DynamicCache`` holding ``rows`` copies of a batch-1 cache (the original is left untouched)."""
    from transformers import DynamicCache

    return DynamicCache([(layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1))
                         for layer in cache.layers])


@dataclass
class Generation:
    """Greedy continuations: ``tokens[b]`` the generated ids of question ``b``; ``logits[b]`` ``(steps, vocab)``
    the logits each was chosen from (when asked for)."""

    tokens: list[list[int]]
    logits: list[Tensor] | None = None


@torch.no_grad()
def greedy_after_prefix(model: Any, cache: Any, queries: Sequence[Tensor], max_new: int,
                        done: Callable[[list[int]], bool] | None = None, pad_id: int = 0,
                        keep_logits: bool = False) -> Generation:
    """Greedy decoding of every query ``(n_b,)`` after the cached prefix, the queries batched.

    Each row's text is ``prefix + query + generated``: the queries are left-padded to a common length *after* the
    prefix, the pads masked out of the attention and the positions continuing from the prefix length, so padding
    changes nothing. A row stops once ``done(its tokens)`` is true (it then leaves the batch) or after ``max_new``.
    """
    if not queries or any(q.ndim != 1 or q.numel() == 0 for q in queries):
        raise ValueError("need a non-empty list of non-empty 1-d query tensors")
    if max_new < 1:
        raise ValueError(f"max_new must be >= 1, got {max_new}")
    dev, L, B = _device(model), int(cache.get_seq_length()), len(queries)
    lens = torch.tensor([q.numel() for q in queries], device=dev)
    Q = int(lens.max())
    ids = torch.full((B, Q), pad_id, dtype=torch.long, device=dev)
    qmask = torch.zeros(B, Q, dtype=torch.long, device=dev)
    for b, q in enumerate(queries):  # left-pad each question right after the prefix
        ids[b, Q - q.numel():] = q.to(dev)
        qmask[b, Q - q.numel():] = 1
    attn = torch.cat([torch.ones(B, L, dtype=torch.long, device=dev), qmask], 1)
    pos = L + (qmask.cumsum(1) - 1).clamp_min(0)  # real tokens at L, L+1, ...; pads are masked anyway
    kv = _copy_cache(cache, B)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, cache=kv, use_cache=True,
                   logits_to_keep=1).logits[:, -1]
    nxt, rows = L + lens, torch.arange(B, device=dev)
    out: list[list[int]] = [[] for _ in range(B)]
    kept: list[list[Tensor]] = [[] for _ in range(B)]
    for step in range(max_new):
        tok = logits.argmax(-1)
        stop = []
        for r, (b, t) in enumerate(zip(rows.tolist(), tok.tolist(), strict=True)):
            out[b].append(t)
            if keep_logits:
                kept[b].append(logits[r].float().cpu())
            stop.append(done is not None and done(out[b]))
        keep = ~torch.tensor(stop, device=dev)
        if step == max_new - 1 or not keep.any():
            break
        if not keep.all():  # finished rows leave the batch (and the cache)
            idx = keep.nonzero().squeeze(-1)
            kv.batch_select_indices(idx)
            attn, nxt, tok, rows = attn[idx], nxt[idx], tok[idx], rows[idx]
        attn = torch.cat([attn, torch.ones(len(rows), 1, dtype=torch.long, device=dev)], 1)
        logits = model(input_ids=tok[:, None], attention_mask=attn, position_ids=nxt[:, None], cache=kv,
                       use_cache=True).logits[:, -1]
        nxt = nxt + 1
    return Generation(out, [torch.stack(k) for k in kept] if keep_logits else None)


def icl_answers(model: Any, tokenizer: Any, pool: ArithmeticSet, order: Sequence[int], questions: Sequence[str],
                batch: int = 8, max_new: int = 40) -> list[str]:
    """Greedy completions of every question after the demos ``pool[order]`` (one prefix pass, then batches of
    questions, shortest first to waste little padding)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    cache = prefix_cache(model, encode(tokenizer, demo_prompt(pool, order)))
    queries = [encode(tokenizer, QUERY.format(q=q)) for q in questions]
    by_len = np.argsort([q.numel() for q in queries], kind="stable")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    texts: list[str] = [""] * len(queries)
    for s in range(0, len(queries), batch):
        idx = by_len[s : s + batch]
        gen = greedy_after_prefix(model, cache, [queries[i] for i in idx], max_new,
                                  done=lambda t: finished(tokenizer.decode(t)), pad_id=pad)
        for i, toks in zip(idx, gen.tokens, strict=True):
            texts[i] = tokenizer.decode(toks)
    return texts


def demo_orders(E: Tensor, shots: Sequence[int], n_random: int, n_starts: int = 10, seed: int = 0,
                ) -> dict[str, list[Tensor]]:
    """For each ``k`` in ``shots``, orders of the first ``k`` demos (rows of ``E``, their sentence embeddings):
    ``"random0".."random{R-1}"`` (independent permutations), ``"cds"`` and ``"high_curvature"``
    (:func:`repro.papers.cds.method.cds_order` on ``E[:k]``)."""
    if not shots or min(shots) < 3 or max(shots) > E.shape[0]:
        raise ValueError(f"shots must lie in [3, {E.shape[0]}] (CDS needs 3 demos), got {list(shots)}")
    if n_random < 1:
        raise ValueError(f"n_random must be >= 1, got {n_random}")
    out: dict[str, list[Tensor]] = {f"random{r}": [] for r in range(n_random)}
    out.update(cds=[], high_curvature=[])
    for k in shots:
        for r in range(n_random):
            g = torch.Generator().manual_seed(derive(seed, "order", r, k))
            out[f"random{r}"].append(torch.randperm(k, generator=g))
        for name in ("cds", "high_curvature"):
            out[name].append(cds_order(E[:k], name, n_starts)[0].cpu())
    return out


@dataclass
class LLMStudy:
    """Per-question correctness ``correct[name]`` ``(K, N)`` for every order (``random0..``, ``cds``,
    ``high_curvature``) at each shot count of ``shots``, and the prefix length in tokens per shot count."""

    shots: list[int]
    correct: dict[str, np.ndarray]
    prefix_tokens: list[int] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)

    def per_question(self, name: str) -> np.ndarray:
        """Correctness ``(K, N)`` as floats; ``"random"``: averaged over the random orders (for a paired
        bootstrap over questions)."""
        return self._per_question(name)

    def _per_question(self, name: str) -> np.ndarray:
        """Correctness ``(K, N)`` as floats; ``"random"``: averaged over the random orders."""
        if name == "random":
            return np.mean([self.correct[m] for m in self.random_names], 0, dtype=float)
        return self.correct[name].astype(float)

    @property
    def random_names(self) -> list[str]:
        return [n for n in self.correct if n.startswith("random")]

    def accuracy(self, name: str) -> np.ndarray:
        """Accuracy ``(K,)`` of one order; ``"random"``: the mean over the random orders."""
        if name == "random":
            return np.mean([self.accuracy(n) for n in self.random_names], 0)
        return self.correct[name].mean(-1)

    @property
    def random_spread(self) -> np.ndarray:
        """Standard deviation ``(K,)`` of the accuracy over the random orders (NaN with a single one: one order
        says nothing about the spread; :func:`repro.common.stats.sd`)."""
        return stats.sd(np.array([self.accuracy(n) for n in self.random_names]), axis=0)

    def diff(self, name: str, base: str = "random") -> tuple[np.ndarray, np.ndarray]:
        """Accuracy of ``name`` minus ``base`` ``(K,)`` and its standard error: the paired (same questions) SE
        over questions, combined with the spread of the random orders' mean when either side is random."""
        d = self._per_question(name) - self._per_question(base)
        se_q = stats.se(d, axis=-1)
        se_r = self.random_spread / math.sqrt(len(self.random_names)) if "random" in (name, base) else 0.0
        return d.mean(-1), np.sqrt(se_q**2 + se_r**2)

    def gain(self, k0: int, k1: int, name: str = "random") -> tuple[float, float]:
        """Accuracy at ``k1`` shots minus at ``k0`` shots for one order (``"random"``: the random orders' mean),
        and its standard error (paired over questions; plus the random orders' spread at both shot counts)."""
        if k0 not in self.shots or k1 not in self.shots:
            raise ValueError(f"shot counts {k0}, {k1} must be among {self.shots}")
        i0, i1 = self.shots.index(k0), self.shots.index(k1)
        c = self._per_question(name)
        d = c[i1] - c[i0]
        se = stats.se(d.reshape(-1))
        if name == "random":
            sd = self.random_spread
            se = math.sqrt(se**2 + (sd[i0] ** 2 + sd[i1] ** 2) / len(self.random_names))
        return float(d.mean()), float(se)


def llm_order_study(model: Any, tokenizer: Any, pool: ArithmeticSet, E: Tensor, test: ArithmeticSet,
                    shots: Sequence[int], n_random: int = 3, n_starts: int = 10, batch: int = 8, max_new: int = 40,
                    seed: int = 0) -> LLMStudy:
    """Accuracy of greedy CoT answers to ``test`` after the first ``k`` demos of ``pool`` (embeddings ``E``, one
    row per demo) in every order of :func:`demo_orders`, for each ``k`` in ``shots``."""
    if E.shape[0] != len(pool):
        raise ValueError(f"E has {E.shape[0]} rows for {len(pool)} demos")
    orders = demo_orders(E, shots, n_random, n_starts, seed)
    answers = np.asarray(test.answers, dtype=float)
    correct, examples = {}, []
    for name, per_k in orders.items():
        rows = []
        for order in per_k:
            texts = icl_answers(model, tokenizer, pool, order.tolist(), test.questions, batch, max_new)
            pred = np.array([np.nan if (p := parse_answer(t)) is None else p for t in texts])
            rows.append(pred == answers)
            if name == "cds" and len(order) == max(shots):
                examples = texts[:3]
        correct[name] = np.array(rows)
    tokens = [len(encode(tokenizer, demo_prompt(pool, range(k)))) for k in shots]
    return LLMStudy(list(shots), correct, tokens, examples)
