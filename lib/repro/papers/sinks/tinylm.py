"""TinyLM: a small Llama-style causal LM with the architecture switches of paper 10's variant study.

The paper's abstract says that "KV-biases, gating mechanisms, and normalization layers can remove massive
activations while largely preserving attention sinks". The switches (our reading of those three families; the
paper's exact variants were not available to us):

* ``kv_bias``: a learned extra key/value slot per head (Sun et al. 2024, "explicit attention bias"): every query
  attends over ``[k'; K]`` and mixes ``[v'; V]``, so attention can be parked on ``k'`` instead of on a token.
* ``out_gate``: an elementwise sigmoid gate on the attention output, computed from the block's input
  (Qiu et al. 2025, gated attention "G1"): ``o = (softmax(QK^T/sqrt d) V) * sigmoid(x W_g)``.
* ``qk_norm``: RMSNorm over each head's query and key before the rotary embedding (as in OLMo 2 / Qwen 3).
* ``norm``: ``"pre"`` (Llama: ``x + f(norm(x))``) or ``"post"`` (original Transformer: ``norm(x + f(x))``).

Everything else is Llama's: RMSNorm, rotary positions (:func:`repro.common.nn.rotary_tables`), a SwiGLU MLP, no
biases. The attention submodules are named as in Hugging Face's Llama (``layers[l].self_attn.{q,k,v,o}_proj``)
so that the hooks of :mod:`repro.papers.sinks.method` work on both. ``forward`` returns logits and, on request,
the attention probabilities over the tokens (``(B, H, T, T)`` per layer; with ``kv_bias`` the bias slot's share is
in ``bias_attention``) and the residual stream entering each layer plus the last layer's output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...common.nn import apply_rotary, rotary_tables

__all__ = ["TinyLM", "TinyLMConfig", "TinyLMOutput"]

Tensor = torch.Tensor
NORMS = ("pre", "post")


@dataclass(frozen=True)
class TinyLMConfig:
    """Sizes and switches of :class:`TinyLM` (``d_ff`` defaults to ``4 * d_model``)."""

    vocab_size: int
    max_len: int
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int | None = None
    kv_bias: bool = False
    out_gate: bool = False
    qk_norm: bool = False
    norm: str = "pre"
    rope_base: float = 10_000.0
    eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_len", "d_model", "n_layers", "n_heads"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(f"d_model={self.d_model} / n_heads={self.n_heads} must give an even head dimension")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def label(self) -> str:
        """A short name of the variant, e.g. ``pre``, ``pre+kv-bias``, ``post+gate+qk-norm``."""
        parts = [self.norm]
        parts += ["kv-bias"] * self.kv_bias + ["gate"] * self.out_gate + ["qk-norm"] * self.qk_norm
        return "+".join(parts)


@dataclass
class TinyLMOutput:
    """What :meth:`TinyLM.forward` returns (``attentions``/``hidden_states`` only when asked for)."""

    logits: Tensor
    attentions: tuple[Tensor, ...] | None = None
    bias_attention: tuple[Tensor, ...] | None = None
    hidden_states: tuple[Tensor, ...] | None = None


class RMSNorm(nn.Module):
    """``x / rms(x) * w`` over the last dimension (Zhang & Sennrich 2019)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


class SinkAttention(nn.Module):
    """Causal multi-head self-attention with the optional KV bias, output gate and QK-norm."""

    def __init__(self, cfg: TinyLMConfig):
        super().__init__()
        d, self.h, self.hd = cfg.d_model, cfg.n_heads, cfg.head_dim
        self.q_proj, self.k_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.v_proj, self.o_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.g_proj = nn.Linear(d, d, bias=False) if cfg.out_gate else None
        self.q_norm = RMSNorm(self.hd, cfg.eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.hd, cfg.eps) if cfg.qk_norm else None
        if cfg.kv_bias:  # one learned key and value per head, seen by every query, with no position
            self.k_bias = nn.Parameter(torch.randn(self.h, self.hd) / math.sqrt(self.hd))
            self.v_bias = nn.Parameter(torch.zeros(self.h, self.hd))
        else:
            self.k_bias = self.v_bias = None

    def _heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.h, self.hd).transpose(1, 2)  # (B, H, T, hd)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(output, probs over tokens (B, H, T, T), probs of the bias slot (B, H, T) or None)``."""
        b, t, d = x.shape
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.hd)  # (B, H, T, T)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        if self.k_bias is not None:
            # softmax over [k'; K]: the bias key's logit q_i . k' / sqrt(d) is prepended to every row
            bias_logit = (q @ self.k_bias[None, :, :, None]) / math.sqrt(self.hd)  # (B, H, T, 1)
            probs = torch.softmax(torch.cat([bias_logit, scores], dim=-1), dim=-1)
            bias_p, probs = probs[..., 0], probs[..., 1:]
            out = probs @ v + bias_p[..., None] * self.v_bias[None, :, None, :]  # mix [v'; V]
        else:
            probs, bias_p = torch.softmax(scores, dim=-1), None
            out = probs @ v
        out = out.transpose(1, 2).reshape(b, t, d)
        if self.g_proj is not None:
            out = out * torch.sigmoid(self.g_proj(x))  # elementwise output gate
        return self.o_proj(out), probs, bias_p


class TinyBlock(nn.Module):
    """One decoder layer, pre-norm ``x + f(norm(x))`` or post-norm ``norm(x + f(x))``; returns
    ``(h, probs, bias_probs)`` (Hugging Face's decoder layers return a tensor or a tuple too)."""

    def __init__(self, cfg: TinyLMConfig):
        super().__init__()
        self.pre = cfg.norm == "pre"
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.eps), RMSNorm(cfg.d_model,
                                                                                                       cfg.eps)
        self.self_attn = SinkAttention(cfg)
        d_ff = cfg.d_ff or 4 * cfg.d_model
        self.gate_proj, self.up_proj = nn.Linear(cfg.d_model, d_ff, bias=False), nn.Linear(cfg.d_model, d_ff,
                                                                                            bias=False)
        self.down_proj = nn.Linear(d_ff, cfg.d_model, bias=False)

    def mlp(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # SwiGLU

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor | None]:
        if self.pre:
            a, probs, bias_p = self.self_attn(self.input_layernorm(x), rope)
            x = x + a
            x = x + self.mlp(self.post_attention_layernorm(x))
        else:
            a, probs, bias_p = self.self_attn(x, rope)
            x = self.input_layernorm(x + a)
            x = self.post_attention_layernorm(x + self.mlp(x))
        return x, probs, bias_p


class TinyLM(nn.Module):
    """The variant-study model (module docstring). ``forward(tokens)`` -> :class:`TinyLMOutput`."""

    def __init__(self, cfg: TinyLMConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(TinyBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.eps) if cfg.norm == "pre" else nn.Identity()
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, tokens: Tensor, *, output_attentions: bool = False,
                output_hidden_states: bool = False) -> TinyLMOutput:
        if tokens.ndim != 2 or tokens.dtype != torch.long:
            raise ValueError(f"tokens must be a (batch, length) long tensor, got {tuple(tokens.shape)} "
                             f"{tokens.dtype}")
        t = tokens.shape[1]
        if not 1 <= t <= self.cfg.max_len:
            raise ValueError(f"sequence length {t} outside [1, max_len={self.cfg.max_len}]")
        if int(tokens.min()) < 0 or int(tokens.max()) >= self.cfg.vocab_size:
            raise ValueError(f"token ids outside [0, {self.cfg.vocab_size})")
        x = self.embed_tokens(tokens)
        rope = rotary_tables(torch.arange(t, device=tokens.device), self.cfg.head_dim, self.cfg.rope_base, x.dtype)
        attns, biases, hidden = [], [], []
        for layer in self.layers:
            hidden.append(x)
            out = layer(x, rope)
            x, probs, bias_p = out if isinstance(out, tuple) else (out, None, None)
            attns.append(probs)
            biases.append(bias_p)
        hidden.append(x)
        logits = self.lm_head(self.norm(x))
        return TinyLMOutput(
            logits=logits,
            attentions=tuple(attns) if output_attentions else None,
            bias_attention=tuple(biases) if output_attentions and self.cfg.kv_bias else None,
            hidden_states=tuple(hidden) if output_hidden_states else None,
        )
