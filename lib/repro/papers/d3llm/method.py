"""The method of d3LLM (paper 03, :mod:`repro.papers.d3llm`): entropy-based multi-block decoding, KV-cache refresh,
pseudo-trajectory distillation and AUP.

The rules below follow the public code (``generate_multi_block``, ``generate_multi_block_kv_cache``, the
distillation trainer, ``aup_utils.get_aup``); the implementation is ours, batched over prompts and device-agnostic.

Decoding a masked-diffusion LM (a *denoiser*: logits for every position of a partly masked sequence):

* token entropy ``H_j = -sum_v p_jv log(p_jv + 1e-12)`` in float64 (:func:`token_entropy`);
* entropy transfer rule: among the candidate masked positions, the lowest-entropy one is always decoded and
  every other one iff ``H_j <= threshold`` (:func:`transfer_rule`; the confidence rule of Fast-dLLM decodes
  ``max_v p_jv >= threshold`` instead);
* vanilla decoding (LLaDA, low-confidence remasking): one token per forward, block by block
  (:func:`decode_vanilla`);
* entropy-based multi-block decoding (:func:`decode_multiblock`): the answer is cut into blocks; a block is
  *added* once the last block's progress (decoded fraction) reaches ``block_add_threshold`` and becomes *fully
  activated* once its predecessor's progress reaches ``decoded_token_threshold``; candidates are the masked
  positions up to the end of the rightmost active block; if the first fully activated unfinished block got no
  token in a step, its lowest-entropy position is forced; with early stopping the first decoded EOS ends the
  answer (everything after it becomes EOS). Tokens per forward (TPF) = answer tokens / forwards;
* KV-cache refresh (:func:`decode_multiblock_kvcache`): finished blocks enter a prefix KV cache only
  ``cache_delay_iter`` forwards after they finished (delayed caching); while a block is stabilising, and every
  ``refresh_interval`` forwards, a full forward refreshes the cache.

Training (every loop is :func:`repro.common.train.fit`): Dream-style, an autoregressive warm-up of the same
network (:func:`train_autoregressive`), then the masked-diffusion loss on random masks (:func:`diffusion_loss`,
:func:`train_diffusion`; shifted logits via :class:`Denoiser`); pseudo-trajectory distillation
(:func:`pseudo_trajectory_mask`, :func:`d3llm_loss`, :func:`train_d3llm`): the student is trained on the teacher's
*decoding order* (not its text) inside a random block, with a mask-ratio curriculum ``r ~ U[r_cur, 0.8]``,
``r_cur`` rising linearly from 0 to 0.8, and the loss ``[CE(mask) + CE(complementary mask) + 2 * mean entropy of
softmax(logits / 0.5) on correctly predicted masked tokens] / 4``.

Metric: AUP (accuracy under parallelism, :func:`aup`): with points ``(rho_i, y_i)`` sorted by TPF ``rho`` and
accuracies ``y`` in percent, ``W(y) = min(exp(-alpha (1 - y / y_max)), 1)`` and only points with
``y >= y_1 - 5`` kept (``y_1``: the accuracy at the smallest TPF, or a common reference accuracy),
``AUP = rho_1 y_1 + sum_i (rho_i - rho_{i-1}) (y_i W(y_i) + y_{i-1} W(y_{i-1})) / 2``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...common.nn import KVCache, Transformer, TransformerConfig
from ...common.numerics import wide_float
from ...common.train import cosine_schedule, fit
from .problems import ChainTask

__all__ = [
    "RULES", "Decoded", "Denoiser", "aup", "aup_weight", "curriculum_block_size", "d3llm_loss", "decode_multiblock",
    "decode_multiblock_kvcache", "decode_vanilla", "diffusion_loss", "pseudo_trajectory_mask", "random_answer_mask",
    "token_entropy", "train_autoregressive", "train_d3llm", "train_diffusion", "transfer_rule", "wide",
]

Tensor = torch.Tensor
ModelFn = Callable[[Tensor], Tensor]
RULES = ("entropy", "confidence")


# --------------------------------------------------------------------------------------------------------
# AUP


def aup_weight(y: float, y_max: float, alpha: float = 3.0) -> float:
    """Quality weight ``W(y) = min(exp(-alpha (1 - y / y_max)), 1)`` of an accuracy ``y`` (percent)."""
    if y_max <= 0:
        raise ValueError(f"y_max must be positive, got {y_max}")
    return min(math.exp(-alpha * (1.0 - y / y_max)), 1.0)


def aup(rho: Sequence[float], y: Sequence[float], y_max: float, alpha: float = 3.0, y_min_offset: float = 5.0,
        strict: bool = True, y_ref: float | None = None) -> float:
    """Accuracy under parallelism of the points ``(rho_i, y_i)`` (TPF, accuracy in percent).

    ``y_max`` is the best accuracy over *all* methods on the task. Points more than ``y_min_offset`` below the
    reference accuracy are left out; the reference is the accuracy at the smallest TPF (the public code) or
    ``y_ref`` when given (to score several models against one bar). ``strict=True`` (the public code) instead
    raises if the point with the largest TPF is such a point. No point left: 0.
    """
    if len(rho) != len(y) or len(rho) == 0:
        raise ValueError("rho and y must be non-empty and of equal length")
    if any(not r > 0 for r in rho):
        raise ValueError("every TPF rho must be positive")
    if any(not 0 <= v <= 100 for v in y) or (y_ref is not None and not 0 <= y_ref <= 100):
        raise ValueError("accuracies must be percentages in [0, 100]")
    pts = sorted(zip(map(float, rho), map(float, y), strict=True), key=lambda p: p[0])
    ref = pts[0][1] if y_ref is None else float(y_ref)
    if strict and ref - pts[-1][1] > y_min_offset:
        raise ValueError(f"accuracy drops by {ref - pts[-1][1]:.2f} > {y_min_offset} points along the curve")
    pts = [p for p in pts if p[1] >= ref - y_min_offset]
    if not pts:
        return 0.0
    total = pts[0][0] * pts[0][1]  # the first rectangle, unweighted
    for (r0, y0), (r1, yy) in zip(pts[:-1], pts[1:], strict=True):
        total += 0.5 * (r1 - r0) * (yy * aup_weight(yy, y_max, alpha) + y0 * aup_weight(y0, y_max, alpha))
    return total


# --------------------------------------------------------------------------------------------------------
# Transfer rules


def wide(x: Tensor) -> Tensor:
    """``x`` in float64 as the public code computes probabilities (float32 on Apple MPS, which has no float64)."""
    return x.to(wide_float(x.device))


def token_entropy(logits: Tensor) -> Tensor:
    """Entropy ``-sum p log(p + 1e-12)`` of ``softmax(logits)`` over the last dimension, in float64."""
    p = torch.softmax(wide(logits), dim=-1)
    return -(p * torch.log(p + 1e-12)).sum(-1)


def _scores(logits: Tensor, rule: str, forbid: int | None = None) -> tuple[Tensor, Tensor]:
    """Greedy tokens and a score where lower is more certain (entropy, or minus the top probability); the token
    ``forbid`` (the mask token) is never predicted."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if forbid is not None:
        logits = logits.clone()
        logits[..., forbid] = -torch.inf
    tokens = logits.argmax(-1)
    if rule == "entropy":
        return tokens, token_entropy(logits)
    return tokens, -torch.softmax(wide(logits), dim=-1).amax(-1)


def transfer_rule(logits: Tensor, candidates: Tensor, threshold: float, rule: str = "entropy",
                  forbid: int | None = None) -> tuple[Tensor, Tensor]:
    """Greedy tokens ``(B, L)`` and which candidate positions to decode ``(B, L)`` bool.

    Entropy rule (d3LLM): the lowest-entropy candidate of each row is always decoded, the others iff their entropy
    is ``<= threshold``. Confidence rule (Fast-dLLM): the most confident always, the others iff their top
    probability is ``>= threshold``. The token ``forbid`` (the mask token) is excluded from the distribution.
    """
    if candidates.shape != logits.shape[:-1] or candidates.dtype != torch.bool:
        raise ValueError("candidates must be a bool tensor of shape logits.shape[:-1]")
    tokens, score = _scores(logits, rule, forbid)
    score = torch.where(candidates, score, torch.inf)
    limit = threshold if rule == "entropy" else -threshold
    accept = candidates & (score <= limit)
    best = score.argmin(-1, keepdim=True)
    has = candidates.any(-1, keepdim=True)
    accept = accept | (torch.zeros_like(accept).scatter(-1, best, True) & has)
    return tokens, accept


# --------------------------------------------------------------------------------------------------------
# Denoiser: a bidirectional transformer with optional Dream-style shifted logits


class Denoiser(nn.Module):
    """Masked-diffusion LM on top of :class:`repro.common.nn.Transformer` (bidirectional).

    ``shift=True`` is Dream's convention: the prediction for position ``j`` is read from the hidden state at
    ``j - 1`` (attention stays bidirectional). ``forward(x)`` returns logits aligned with the positions.
    """

    def __init__(self, cfg: TransformerConfig, mask_id: int, shift: bool = True):
        super().__init__()
        if cfg.causal:
            raise ValueError("a masked-diffusion denoiser needs a bidirectional transformer (causal=False)")
        if not 0 <= mask_id < cfg.vocab_size:
            raise ValueError(f"mask_id {mask_id} outside the vocabulary of {cfg.vocab_size}")
        self.net = Transformer(cfg)
        self.mask_id, self.shift = mask_id, int(bool(shift))

    def _align(self, logits: Tensor) -> Tensor:
        return torch.cat([logits[:, :1], logits[:, :-1]], dim=1) if self.shift else logits

    def forward(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        return self._align(self.net(x, attn_mask=attn_mask))

    def forward_from(self, x: Tensor, start: int, cache: KVCache | None) -> tuple[Tensor, KVCache]:
        """Logits of positions ``start..`` of ``x`` given ``cache``, the cached prefix ``x[:, :start]`` (from
        :meth:`prefix_cache`); also returns the cache of all positions, to be cut by :meth:`prefix_cache`."""
        begin = max(start - self.shift, 0)
        if (cache.length if cache is not None else 0) != begin:
            raise ValueError("the cache does not cover the prefix before `start`")
        logits, full = self.net(x[:, begin:], cache=cache, return_cache=True)
        if self.shift and start > 0:
            return logits[:, :-1], full
        return self._align(logits)[:, start - begin:], full

    def prefix_cache(self, full: KVCache, prefix: int) -> KVCache | None:
        """The cache that stands for the first ``prefix`` positions (``None`` if empty)."""
        n = max(prefix - self.shift, 0)
        return full.prefix(n) if n > 0 else None


# --------------------------------------------------------------------------------------------------------
# Decoders


@dataclass
class Decoded:
    """Decoder output: answer tokens ``(B, G)``, forwards per row, the forward (1-based) that decoded each
    position (``timeline``; EOS-filled positions get the forward that decoded the EOS and ``filled=True``), and
    the positions fed through the network per row (a compute measure that a KV cache lowers)."""

    tokens: Tensor
    nfe: Tensor
    timeline: Tensor
    filled: Tensor
    positions: Tensor

    @property
    def tpf(self) -> float:
        """Tokens per forward over the batch: answer tokens / forwards."""
        return self.tokens.numel() / max(int(self.nfe.sum()), 1)


def _check_prompt(prompt: Tensor, gen_len: int, block_size: int, mask_id: int) -> None:
    if prompt.ndim != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must have shape (batch, length >= 1), got {tuple(prompt.shape)}")
    if gen_len < 1 or block_size < 1:
        raise ValueError(f"gen_len and block_size must be >= 1, got {gen_len}, {block_size}")
    if (prompt == mask_id).any():
        raise ValueError("the prompt contains the mask token")


@torch.no_grad()
def decode_vanilla(model_fn: ModelFn, prompt: Tensor, gen_len: int, block_size: int, *, mask_id: int,
                   rank: str = "confidence", per_forward: int = 1) -> Decoded:
    """LLaDA's baseline: blocks left to right; each forward decodes greedily the ``per_forward`` masked positions
    of the current block with the highest confidence (``rank="entropy"``: the lowest entropy), fewer where fewer
    are left in the block. ``per_forward=1`` is one token per forward; more is LLaDA run with fewer steps than
    tokens, the fixed-count parallel decoder (``ceil(block / per_forward)`` forwards per block, whatever the
    model's uncertainty)."""
    _check_prompt(prompt, gen_len, block_size, mask_id)
    if per_forward < 1:
        raise ValueError(f"per_forward must be >= 1, got {per_forward}")
    b, p = prompt.shape
    x = torch.cat([prompt, torch.full((b, gen_len), mask_id, dtype=prompt.dtype, device=prompt.device)], 1)
    timeline = torch.zeros(b, gen_len, dtype=torch.long, device=prompt.device)
    rows = torch.arange(b, device=prompt.device)
    step = 0
    for lo in range(0, gen_len, block_size):
        hi = min(lo + block_size, gen_len)
        for left in range(hi - lo, 0, -per_forward):
            step += 1
            logits = model_fn(x)[:, p + lo: p + hi]
            tokens, score = _scores(logits, "entropy" if rank == "entropy" else "confidence", mask_id)
            score = torch.where(x[:, p + lo: p + hi] == mask_id, score, torch.inf)
            for _ in range(min(per_forward, left)):  # the best-ranked first (the first index among ties)
                j = score.argmin(-1)
                x[rows, p + lo + j] = tokens[rows, j]
                timeline[rows, lo + j] = step
                score[rows, j] = torch.inf
    nfe = torch.full((b,), step, dtype=torch.long, device=prompt.device)
    return Decoded(x[:, p:], nfe, timeline, torch.zeros_like(timeline, dtype=torch.bool), nfe * (p + gen_len))


class _Blocks:
    """Book-keeping of multi-block decoding for a batch (one row per prompt), as tensors."""

    def __init__(self, prompt: Tensor, gen_len: int, block_size: int, mask_id: int, add_thr: float,
                 act_thr: float, eos_id: int | None):
        dev = prompt.device
        self.b, self.p = prompt.shape
        self.g, self.mask_id, self.eos_id = gen_len, mask_id, eos_id
        self.add_thr, self.act_thr = add_thr, act_thr
        self.nb = -(-gen_len // block_size)
        self.x = torch.cat([prompt, torch.full((self.b, gen_len), mask_id, dtype=prompt.dtype, device=dev)], 1)
        pos = torch.arange(gen_len, device=dev)
        self.block_of = pos // block_size + 1  # block id of each answer position (0 is the prompt)
        self.start = torch.arange(self.nb + 1, device=dev).clamp(min=1).sub(1) * block_size
        self.start[0] = -self.p
        self.end = torch.cat([torch.zeros(1, device=dev, dtype=torch.long),
                              (torch.arange(1, self.nb + 1, device=dev) * block_size).clamp(max=gen_len)])
        self.size = wide(self.end - self.start)
        self.created = torch.ones(self.b, dtype=torch.long, device=dev)
        self.active = torch.zeros(self.b, self.nb + 1, dtype=torch.bool, device=dev)
        self.active[:, 0] = True
        self.active[:, 1] = 1.0 >= act_thr
        self.done = torch.zeros(self.b, dtype=torch.bool, device=dev)
        self.eos_seen = torch.zeros(self.b, dtype=torch.bool, device=dev)
        self.nfe = torch.zeros(self.b, dtype=torch.long, device=dev)
        self.timeline = torch.zeros(self.b, gen_len, dtype=torch.long, device=dev)
        self.filled = torch.zeros(self.b, gen_len, dtype=torch.bool, device=dev)
        self.positions = torch.zeros(self.b, dtype=torch.long, device=dev)

    def masked(self) -> Tensor:
        return self.x[:, self.p:] == self.mask_id

    def mask_counts(self) -> Tensor:
        """Masked positions per block ``(B, nb + 1)`` (column 0: the prompt, always 0)."""
        m = self.masked()
        counts = torch.zeros(self.b, self.nb + 1, dtype=torch.long, device=m.device)
        return counts.scatter_add_(1, self.block_of.expand(self.b, -1), m.long())

    def early_stop(self) -> None:
        """Everything after the first decoded EOS becomes EOS, whether still masked or already decoded (in every
        case, including an EOS decoded by the last forward); the blocks after it count as finished."""
        if self.eos_id is None:
            return
        gen = self.x[:, self.p:]
        is_eos = (gen == self.eos_id) & ~self.done[:, None]
        has = is_eos.any(1)
        if not has.any():
            return
        pos = torch.arange(self.g, device=gen.device)
        first = torch.where(is_eos, pos, self.g).amin(1)
        after = has[:, None] & (pos[None, :] > first[:, None])
        newly = after & (gen == self.mask_id)
        self.filled |= newly
        self.timeline = torch.where(newly, self.timeline.amax(1, keepdim=True), self.timeline)
        gen[after] = self.eos_id
        self.created = torch.where(has, self.nb, self.created)
        later = has[:, None] & (self.start[None, :] > first[:, None])
        self.active |= later
        self.eos_seen |= has

    def prepare(self) -> Tensor:
        """Stop finished rows, apply early stopping, activation and block addition; return the end (answer
        coordinates) of the rightmost active block per row."""
        # early stopping first: an EOS decoded by the last forward (together with the last masked positions) must
        # still turn everything after it into EOS (the public code checks for completion first and keeps them)
        self.early_stop()
        counts = self.mask_counts()
        # a row with no masked position left is finished
        self.done |= counts.sum(1) == 0
        # progress of block k: the decoded fraction of its positions (block 0, the prompt, is complete)
        progress = 1.0 - wide(counts) / self.size
        ids = torch.arange(self.nb + 1, device=counts.device)
        exists = ids[None, :] <= self.created[:, None]
        # activation: a created block k becomes fully activated once block k - 1 has reached τ_act
        # (a semi-activated block is decoded where confident, but forced progress happens only in active ones)
        self.active[:, 1:] |= exists[:, 1:] & (progress[:, :-1] >= self.act_thr)
        rows = torch.arange(self.b, device=counts.device)
        last = self.created
        last_prog = progress[rows, last]
        # block addition: a new block of masks joins once the newest block has reached τ_add (or is complete),
        # unless the row is finished, has decoded an EOS, or already holds all nb blocks
        add = ~self.done & ~self.eos_seen & (last < self.nb)
        add &= (last_prog >= self.add_thr) | (counts[rows, last] == 0)
        new = (last + 1).clamp(max=self.nb)
        # the new block is born fully activated if its predecessor has already passed τ_act
        self.active[rows[add], new[add]] = last_prog[add] >= self.act_thr
        self.created = torch.where(add, last + 1, self.created)
        # the decoding window ends with the rightmost created block that is active or still has masks
        exists = ids[None, :] <= self.created[:, None]
        live = exists & (self.active | (counts > 0))
        live[:, 0] = False
        rightmost = torch.where(live, ids, 0).amax(1)
        self.done |= rightmost == 0
        return self.end[rightmost]

    def decide(self, logits: Tensor, rows: Tensor, active_end: Tensor, threshold: float, rule: str) -> None:
        """Apply one forward's logits (answer positions, rows ``rows``): transfer rule and forced progress."""
        masked = self.masked()[rows]
        pos = torch.arange(self.g, device=logits.device)
        # candidates: still-masked positions inside the decoding window (every created block up to its end)
        cand = masked & (pos[None, :] < active_end[rows, None])
        # the transfer rule: a candidate's greedy token is accepted when it passes τ (entropy <= τ, or top probability
        # >= τ), and each row's best candidate always
        tokens, accept = transfer_rule(logits, cand, threshold, rule, forbid=self.mask_id)
        # forced progress in the first fully activated block that still has masked positions
        counts = self.mask_counts()[rows]
        ids = torch.arange(self.nb + 1, device=logits.device)
        exists = ids[None, :] <= self.created[rows, None]
        first_ok = exists & self.active[rows] & (counts > 0)
        first_ok[:, 0] = False
        has = first_ok.any(1)
        first = torch.where(first_ok, ids, self.nb + 1).amin(1)
        in_first = (self.block_of[None, :] == first[:, None]) & masked
        # a row whose first active block would gain nothing this forward decodes its single best-scored position
        # there, so that every forward makes progress
        stuck = has & ~(accept & in_first).any(1)
        if stuck.any():
            _, score = _scores(logits, rule, self.mask_id)
            j = torch.where(in_first, score, torch.inf).argmin(1)
            force = torch.zeros_like(accept).scatter(1, j[:, None], True) & stuck[:, None]
            accept |= force
        # one forward (NFE) per row; write the accepted tokens and the forward that decoded each of them
        self.nfe[rows] += 1
        gen = self.x[rows, self.p:]
        self.x[rows, self.p:] = torch.where(accept, tokens, gen)
        self.timeline[rows] = torch.where(accept, self.nfe[rows, None], self.timeline[rows])

    def result(self) -> Decoded:
        return Decoded(self.x[:, self.p:], self.nfe, self.timeline, self.filled, self.positions)


def _check_thresholds(block_add_threshold: float, decoded_token_threshold: float, rule: str) -> None:
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    for name, v in (("block_add_threshold", block_add_threshold),
                    ("decoded_token_threshold", decoded_token_threshold)):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {v}")


@torch.no_grad()
def decode_multiblock(model_fn: ModelFn, prompt: Tensor, gen_len: int, block_size: int, threshold: float, *,
                      mask_id: int, block_add_threshold: float = 0.5, decoded_token_threshold: float = 0.5,
                      eos_id: int | None = None, early_stop: bool = False, rule: str = "entropy",
                      max_nfe: int = 10_000) -> Decoded:
    """d3LLM's entropy-based multi-block decoding (no cache), batched over the rows of ``prompt``.

    Every forward runs the whole sequence. ``block_add_threshold = decoded_token_threshold = 1`` gives sequential
    block decoding; ``rule="confidence"`` with both at 1 is Fast-dLLM's single-block confidence threshold.
    """
    _check_prompt(prompt, gen_len, block_size, mask_id)
    _check_thresholds(block_add_threshold, decoded_token_threshold, rule)
    st = _Blocks(prompt, gen_len, block_size, mask_id, block_add_threshold, decoded_token_threshold,
                 eos_id if early_stop else None)
    while True:
        active_end = st.prepare()
        st.done |= st.nfe >= max_nfe
        rows = (~st.done).nonzero().squeeze(1)
        if rows.numel() == 0:
            return st.result()
        logits = model_fn(st.x[rows])[:, st.p:]
        st.positions[rows] += st.x.shape[1]
        st.decide(logits, rows, active_end, threshold, rule)


@torch.no_grad()
def decode_multiblock_kvcache(model: Denoiser, prompt: Tensor, gen_len: int, block_size: int, threshold: float, *,
                              mask_id: int, block_add_threshold: float = 0.5, decoded_token_threshold: float = 0.5,
                              cache_delay_iter: int = 2, refresh_interval: int = 3, eos_id: int | None = None,
                              early_stop: bool = False, rule: str = "entropy", max_nfe: int = 10_000) -> Decoded:
    """Multi-block decoding with a delayed, periodically refreshed prefix KV cache; one prompt at a time.

    Before each forward the finished blocks right after the cached prefix are scanned in order: a block finished
    ``cache_delay_iter`` or more forwards ago joins the cache; one finished more recently is *stabilising* and
    stops the scan. A full forward (no cache) runs while a block is stabilising or when the forward count is a
    multiple of ``refresh_interval``; it rebuilds the cache from fresh keys and values. Otherwise only the
    positions after the cached prefix are fed, with the cache. ``refresh_interval=1`` therefore reproduces
    :func:`decode_multiblock` exactly.
    """
    _check_prompt(prompt, gen_len, block_size, mask_id)
    _check_thresholds(block_add_threshold, decoded_token_threshold, rule)
    if cache_delay_iter < 0 or refresh_interval < 1:
        raise ValueError("cache_delay_iter must be >= 0 and refresh_interval >= 1")
    outs = [_decode_one_cached(model, prompt[i:i + 1], gen_len, block_size, threshold, mask_id, block_add_threshold,
                               decoded_token_threshold, cache_delay_iter, refresh_interval,
                               eos_id if early_stop else None, rule, max_nfe) for i in range(prompt.shape[0])]
    return Decoded(*(torch.cat([getattr(o, f) for o in outs]) for f in
                     ("tokens", "nfe", "timeline", "filled", "positions")))


def _decode_one_cached(model: Denoiser, prompt: Tensor, gen_len: int, block_size: int, threshold: float,
                       mask_id: int, add_thr: float, act_thr: float, delay: int, refresh: int,
                       eos_id: int | None, rule: str, max_nfe: int) -> Decoded:
    st = _Blocks(prompt, gen_len, block_size, mask_id, add_thr, act_thr, eos_id)
    p, total = st.p, st.x.shape[1]
    rows = torch.zeros(1, dtype=torch.long, device=prompt.device)
    finished_at: dict[int, int] = {0: 0}  # block -> first forward that saw it finished (prompt: 0)
    cached_blocks, cache = 0, None  # blocks 0..cached_blocks-1 are in the cache
    while True:
        active_end = st.prepare()
        if bool(st.done[0]) or int(st.nfe[0]) >= max_nfe:
            return st.result()
        n = int(st.nfe[0]) + 1  # the forward about to run
        counts = st.mask_counts()[0]
        ready, stabilising = cached_blocks, False
        for blk in range(cached_blocks, st.nb + 1):
            if blk > int(st.created[0]) or int(counts[blk]) > 0:
                break
            finished_at.setdefault(blk, n)
            if n - finished_at[blk] < delay:
                stabilising = True
                break
            ready = blk + 1
        prefix = p + int(st.end[ready - 1]) if ready > 0 else 0
        old_prefix = p + int(st.end[cached_blocks - 1]) if cached_blocks > 0 else 0
        if cache is None or stabilising or n % refresh == 0:
            logits, full = model.forward_from(st.x, 0, None)
            cache = model.prefix_cache(full, prefix)
            st.positions[0] += total
            logits = logits[:, p:]
        else:
            logits, full = model.forward_from(st.x, old_prefix, cache)
            st.positions[0] += total - old_prefix + model.shift
            if prefix > old_prefix:
                cache = model.prefix_cache(full, prefix)
            pad = torch.full((1, old_prefix - p, logits.shape[-1]), 0.0, dtype=logits.dtype, device=logits.device)
            logits = torch.cat([pad, logits], 1)
        cached_blocks = ready
        st.decide(logits, rows, active_end, threshold, rule)


# --------------------------------------------------------------------------------------------------------
# Training


def random_answer_mask(answer: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Mask each answer token with probability ``t ~ U(0, 1)`` drawn per example, at least one token per row."""
    b, g = answer.shape
    t = torch.rand(b, 1, generator=generator).to(answer.device)
    mask = torch.rand(b, g, generator=generator).to(answer.device) < t
    one = torch.randint(0, g, (b,), generator=generator).to(answer.device)
    mask[torch.arange(b, device=answer.device), one] = True
    return mask


def diffusion_loss(model: Denoiser, prompt: Tensor, answer: Tensor, mask: Tensor) -> Tensor:
    """Mean cross-entropy over the masked answer tokens (no ``1/t`` weight), the prompt kept clean."""
    x = torch.cat([prompt, torch.where(mask, model.mask_id, answer)], 1)
    logits = model(x)[:, prompt.shape[1]:]
    return F.cross_entropy(logits[mask], answer[mask])


ADAMW = dict(optimizer="adamw", betas=(0.9, 0.98), weight_decay=0.0)  # every training of this paper


def train_diffusion(model: Denoiser, task: ChainTask, *, steps: int, batch: int, lr: float = 1e-3, warmup: int = 50,
                    generator: torch.Generator | None = None, clip: float = 1.0) -> list[float]:
    """Train the denoiser on fresh problems with random answer masks (AdamW, warm-up + cosine); losses."""
    if steps < 1 or batch < 1:
        raise ValueError("steps and batch must be >= 1")
    dev = next(model.parameters()).device

    def step_loss(_: int) -> Tensor:
        prompt, answer = task.sample(batch, generator, dev)
        return diffusion_loss(model, prompt, answer, random_answer_mask(answer, generator))

    return fit(model, step_loss, steps, lr=lr, **ADAMW, schedule=lambda s: cosine_schedule(s, steps, warmup),
               clip=clip)


def train_autoregressive(model: Denoiser, task: ChainTask, *, steps: int, batch: int, lr: float = 1e-3,
                         warmup: int = 50, generator: torch.Generator | None = None, clip: float = 1.0) -> list[float]:
    """Dream-style initialisation: train the same network as a left-to-right LM first (causal attention mask,
    next-token cross-entropy on the answer; with ``shift=True`` the logits at ``j`` are read at ``j - 1``, so this
    is ordinary next-token prediction), then continue with :func:`train_diffusion` (bidirectional, masks).
    Constant learning rate after a linear warm-up; returns the losses."""
    if steps < 1 or batch < 1 or warmup < 1:
        raise ValueError("steps, batch and warmup must be >= 1")
    if not model.shift:
        raise ValueError("autoregressive initialisation needs shifted logits (shift=True)")
    dev = next(model.parameters()).device
    n = task.prompt_len + task.answer_len
    causal = torch.ones(n, n, dtype=torch.bool, device=dev).tril()

    def step_loss(_: int) -> Tensor:
        prompt, answer = task.sample(batch, generator, dev)
        logits = model(torch.cat([prompt, answer], 1), attn_mask=causal)[:, task.prompt_len:]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), answer.reshape(-1))

    return fit(model, step_loss, steps, lr=lr, **ADAMW, schedule=lambda s: min(1.0, (s + 1) / warmup), clip=clip)


def pseudo_trajectory_mask(order: Tensor, block_start: Tensor, block_end: Tensor, mask_ratio: float) -> Tensor:
    """Masks ``(B, G)`` from a teacher's one-token-per-step decoding order.

    ``order[b, j]`` is the step (1-based) at which the teacher decoded answer position ``j``. For a block
    ``[s, e)`` and ratio ``r`` the teacher's state after ``s + floor((1 - r)(e - s))`` steps is taken: inside the
    block the positions still masked in that state are masked; every position after the block is masked, every
    position before it is clean.
    """
    if not 0.0 <= mask_ratio <= 1.0:
        raise ValueError(f"mask_ratio must lie in [0, 1], got {mask_ratio}")
    if order.ndim != 2 or block_start.shape != (order.shape[0],) or block_end.shape != block_start.shape:
        raise ValueError("order must be (B, G) and block_start / block_end of shape (B,)")
    if ((block_start < 0) | (block_end <= block_start) | (block_end > order.shape[1])).any():
        raise ValueError("blocks must satisfy 0 <= start < end <= G")
    pos = torch.arange(order.shape[1], device=order.device)[None, :]
    s, e = block_start[:, None], block_end[:, None]
    state = s + torch.floor((1.0 - mask_ratio) * wide(e - s)).long()
    inside = (pos >= s) & (pos < e)
    return (inside & (order > state)) | (pos >= e)


def d3llm_loss(model: Denoiser, prompt: Tensor, answer: Tensor, order: Tensor, block_start: Tensor,
               block_end: Tensor, mask_ratio: float, entropy_weight: float = 2.0, temperature: float = 0.5
               ) -> tuple[Tensor, dict[str, float]]:
    """The d3LLM distillation loss on one batch and its parts.

    ``[CE on the pseudo-trajectory mask + CE on the complementary mask (inside the block; later positions masked
    in both) + entropy_weight * mean entropy of softmax(logits / temperature) over the masked positions the model
    already predicts correctly] / 4``; cross-entropies are means over the loss positions, which are the masked
    positions inside the block.
    """
    mask = pseudo_trajectory_mask(order, block_start, block_end, mask_ratio)
    pos = torch.arange(order.shape[1], device=order.device)[None, :]
    inside = (pos >= block_start[:, None]) & (pos < block_end[:, None])
    after = pos >= block_end[:, None]
    target, target_rev = mask & inside, ~mask & inside
    p = prompt.shape[1]
    logits = model(torch.cat([prompt, torch.where(mask, model.mask_id, answer)], 1))[:, p:]
    zero = logits.sum() * 0.0
    ce = F.cross_entropy(logits[target], answer[target]) if target.any() else zero
    ce_rev = zero
    if target_rev.any():
        logits_rev = model(torch.cat([prompt, torch.where(target_rev | after, model.mask_id, answer)], 1))[:, p:]
        ce_rev = F.cross_entropy(logits_rev[target_rev], answer[target_rev])
    right = target & (logits.argmax(-1) == answer)
    ent = zero
    if right.any():
        q = torch.softmax(logits[right] / temperature, -1)
        ent = -(q * torch.log(q + 1e-12)).sum(-1).mean()
    loss = (ce + ce_rev + entropy_weight * ent) / 4.0
    return loss, {"ce": ce.item(), "ce_rev": ce_rev.item(), "entropy": ent.item()}


def curriculum_block_size(progress: float, sizes: Sequence[int]) -> int:
    """Training block size at ``progress`` in [0, 1): the epochs split training evenly, and within epoch ``i``
    the size moves linearly from ``sizes[i]`` to ``sizes[i + 1]`` (the paper's schedule 16, 16, 24, 24, 32, 32)."""
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError("sizes must be positive block sizes")
    epoch = min(progress, 1.0) * len(sizes)
    i = min(int(epoch), len(sizes) - 1)
    if i == len(sizes) - 1:
        return int(sizes[-1])
    return int(sizes[i] + (epoch - i) * (sizes[i + 1] - sizes[i]))


def train_d3llm(student: Denoiser, prompts: Tensor, answers: Tensor, order: Tensor, *, steps: int, batch: int,
                block_sizes: Sequence[int], lr: float = 3e-4, max_ratio: float = 0.8, entropy_weight: float = 2.0,
                temperature: float = 0.5, generator: torch.Generator | None = None, clip: float = 1.0
                ) -> list[dict[str, float]]:
    """Pseudo-trajectory distillation: minibatches of the teacher's trajectories (``order`` of its decoding of
    ``prompts``; targets are the true ``answers``), a random block per example, mask ratio
    ``r ~ U[r_cur, max_ratio]`` per batch with ``r_cur`` rising linearly from 0 to ``max_ratio``; constant lr."""
    if steps < 1 or batch < 1 or len(prompts) != len(answers) or order.shape != answers.shape:
        raise ValueError("need steps, batch >= 1 and matching prompts / answers / order")
    if len(prompts) == 0:
        raise ValueError("no trajectories to distil (did the teacher decode none of the prompts correctly?)")
    dev = next(student.parameters()).device
    g = answers.shape[1]
    history: list[dict[str, float]] = []

    def step_loss(step: int) -> Tensor:
        progress = step / steps
        bs = min(curriculum_block_size(progress, block_sizes), g)
        # mask ratio r ~ U[r_cur, max_ratio], r_cur rising linearly from 0 to max_ratio
        r_cur = max_ratio * progress
        ratio = r_cur + (max_ratio - r_cur) * float(torch.rand((), generator=generator))
        idx = torch.randint(0, len(prompts), (batch,), generator=generator).to(dev)
        # one random block [start, end) of the current size per example
        n_blocks = -(-g // bs)
        k = torch.randint(0, n_blocks, (batch,), generator=generator).to(dev)
        start = k * bs
        end = (start + bs).clamp(max=g)
        loss, parts = d3llm_loss(student, prompts[idx], answers[idx], order[idx], start, end, ratio,
                                 entropy_weight, temperature)
        history.append({"loss": loss.item(), "ratio": ratio, "block": bs, **parts})
        return loss

    fit(student, step_loss, steps, lr=lr, **ADAMW, clip=clip)
    return history
