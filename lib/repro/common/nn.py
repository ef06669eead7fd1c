"""One small transformer for the book's language-model papers.

A pre-LayerNorm transformer stack (token embedding, positions, ``n_layers`` blocks of multi-head
self-attention and a GELU MLP, a final LayerNorm and a linear head) in about a hundred lines, so that a reader
sees every piece. Three switches cover what the papers need:

* ``causal``: ``True`` gives a GPT-style left-to-right model; ``False`` a bidirectional one, as in the masked
  diffusion LMs (LLaDA, Dream) of paper 03 (``repro.papers.d3llm``).
* ``positions``: ``"learned"`` absolute position embeddings (added to the tokens) or ``"rotary"`` embeddings
  (RoPE, Su et al. 2021: the query and key of each head are rotated by an angle proportional to the position,
  so that their dot product depends only on the relative offset).
* an optional **prefix KV cache** (:class:`KVCache`): ``forward(tokens, cache=c)`` treats ``tokens`` as the
  positions ``c.length, c.length + 1, ...`` of a longer sequence whose first ``c.length`` positions are
  represented only by their cached keys and values; ``return_cache=True`` also returns the cache extended by the
  new positions (cut it back with :meth:`KVCache.prefix`). With ``causal=False`` the new positions attend to the
  whole prefix and to each other; the prefix does not see them (that approximation is what a dLLM KV cache is).

Parameters keep PyTorch's default initialisation (embeddings N(0, 1), linear layers Kaiming-uniform): on the
small algorithmic tasks of the book it trains markedly faster than the GPT-2 style N(0, 0.02) (paper 03's task
stayed at chance for 800 steps with the latter and was solved with the former, same seed).
Everything works on the tensors' device and dtype; nothing is specific to a paper.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

Tensor = torch.Tensor
POSITIONS = ("learned", "rotary")


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes and switches of :class:`Transformer` (``d_ff`` defaults to ``4 * d_model``)."""

    vocab_size: int
    max_len: int
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int | None = None
    causal: bool = False
    positions: str = "learned"
    dropout: float = 0.0
    rope_base: float = 10_000.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_len", "d_model", "n_layers", "n_heads"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        if self.positions == "rotary" and (self.d_model // self.n_heads) % 2:
            raise ValueError("rotary positions need an even head dimension")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout}")


@dataclass
class KVCache:
    """Keys and values of a sequence prefix, one ``(batch, heads, length, head_dim)`` pair per layer."""

    keys: list[Tensor]
    values: list[Tensor]

    @property
    def length(self) -> int:
        """Number of cached positions."""
        return int(self.keys[0].shape[2]) if self.keys else 0

    def prefix(self, n: int) -> KVCache:
        """The cache of the first ``n`` positions only."""
        if not 0 <= n <= self.length:
            raise ValueError(f"prefix length {n} outside [0, {self.length}]")
        return KVCache([k[:, :, :n] for k in self.keys], [v[:, :, :n] for v in self.values])

    def rows(self, index: Tensor) -> KVCache:
        """The cache of some batch rows (``index``: a long or bool tensor over the batch)."""
        return KVCache([k[index] for k in self.keys], [v[index] for v in self.values])


def rotary_tables(positions: Tensor, head_dim: int, base: float = 10_000.0, dtype: torch.dtype = torch.float32
                  ) -> tuple[Tensor, Tensor]:
    """Cosine and sine tables ``(len(positions), head_dim)`` of RoPE: pair ``(x_i, x_{i+d/2})`` turns by the angle
    ``position * base^(-2i/d)``."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float64) / head_dim)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the last dimension of ``x`` (``(..., length, head_dim)``) by the RoPE tables."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Block(nn.Module):
    """Pre-LN transformer block: ``x + Attn(LN(x))``, then ``x + MLP(LN(x))``."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.n_heads, self.head_dim = cfg.n_heads, cfg.d_model // cfg.n_heads
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        d_ff = cfg.d_ff or 4 * cfg.d_model
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, d_ff), nn.GELU(), nn.Linear(d_ff, cfg.d_model))
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None, past: tuple[Tensor, Tensor] | None,
                mask: Tensor | None, is_causal: bool) -> tuple[Tensor, Tensor, Tensor]:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        p = self.cfg.dropout if self.training else 0.0
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=is_causal)
        x = x + self.drop(self.proj(att.transpose(1, 2).reshape(b, t, d)))
        x = x + self.drop(self.mlp(self.ln2(x)))
        return x, k, v


class Transformer(nn.Module):
    """The shared small transformer (see the module docstring); ``forward`` returns logits ``(B, T, vocab)``."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model) if cfg.positions == "learned" else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size)
        self.drop = nn.Dropout(cfg.dropout)

    def num_parameters(self) -> int:
        """Number of trainable parameters."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def _mask(self, t: int, start: int, attn_mask: Tensor | None, device: torch.device) -> tuple[Tensor | None, bool]:
        """Boolean attention mask (True = may attend) for ``t`` queries at ``start..`` over ``start + t`` keys."""
        if attn_mask is not None:
            if attn_mask.dtype != torch.bool or attn_mask.shape[-2:] != (t, start + t):
                raise ValueError(f"attn_mask must be bool with trailing shape ({t}, {start + t}), "
                                 f"got {attn_mask.dtype} {tuple(attn_mask.shape)}")
            mask = attn_mask if attn_mask.ndim == 2 else attn_mask[:, None]
            if self.cfg.causal:
                mask = mask & self._causal(t, start, device)
            return mask, False
        if not self.cfg.causal:
            return None, False
        if start == 0:
            return None, True
        return self._causal(t, start, device), False

    @staticmethod
    def _causal(t: int, start: int, device: torch.device) -> Tensor:
        q = torch.arange(start, start + t, device=device)
        return torch.arange(start + t, device=device)[None, :] <= q[:, None]

    def forward(self, tokens: Tensor, *, cache: KVCache | None = None, attn_mask: Tensor | None = None,
                return_cache: bool = False) -> Tensor | tuple[Tensor, KVCache]:
        """Logits for ``tokens`` ``(B, T)``, which sit at positions ``cache.length ..`` (0 without a cache).

        ``attn_mask`` (bool, ``(T, S)`` or ``(B, T, S)`` with ``S = cache.length + T``, True = may attend) restricts
        attention further (e.g. a block-causal mask); ``return_cache=True`` also returns the extended cache.
        """
        if tokens.ndim != 2:
            raise ValueError(f"tokens must have shape (batch, length), got {tuple(tokens.shape)}")
        start = cache.length if cache is not None else 0
        b, t = tokens.shape
        if start + t > self.cfg.max_len:
            raise ValueError(f"sequence of {start + t} positions exceeds max_len={self.cfg.max_len}")
        if cache is not None and (len(cache.keys) != self.cfg.n_layers or cache.keys[0].shape[0] != b):
            raise ValueError("cache does not match this model's layers or the batch size")
        positions = torch.arange(start, start + t, device=tokens.device)
        x = self.tok(tokens)
        rope = None
        if self.pos is not None:
            x = x + self.pos(positions)[None]
        else:
            rope = rotary_tables(positions, self.cfg.d_model // self.cfg.n_heads, self.cfg.rope_base, x.dtype)
        x = self.drop(x)
        mask, is_causal = self._mask(t, start, attn_mask, tokens.device)
        keys, values = [], []
        for i, block in enumerate(self.blocks):
            past = (cache.keys[i], cache.values[i]) if cache is not None else None
            x, k, v = block(x, rope, past, mask, is_causal)
            keys.append(k)
            values.append(v)
        logits = self.head(self.ln_f(x))
        return (logits, KVCache(keys, values)) if return_cache else logits
