"""Measurements and interventions of paper 10: attention sinks, massive activations, value norms.

Metrics (from the prior literature the paper builds on; the paper's own definitions were not available to us):

* sink score (Gu et al. 2025, "When attention sink emerges"): for layer ``l`` and head ``h``, the mean attention
  that queries ``i >= min_query`` pay to the key at position ``first``,
  ``a_{l,h} = mean_{b, i >= min_query} A^{(l,h)}_{b,i,first}`` (:func:`sink_scores`); the share of heads with
  ``a > eps`` is Gu et al.'s ``Sink_eps`` (:func:`sink_fraction`).
* massive-activation ratio (Sun et al. 2024, "Massive activations in LLMs"): for the residual stream ``h`` of a
  layer, ``max |h| / median |h|`` over all tokens and channels (:func:`massive_ratio`), and where the maximum sits
  (:func:`top_activations`).
* value norms: ``||v_t||`` per key/value head, the value projection's output cut into heads of ``head_dim``
  (:func:`value_norms`; with grouped-query attention there are fewer value heads than query heads).

Interventions (forward hooks, always removed on exit, also when the body raises):

* :func:`zero_sink_value`: the value vector of one token (the sink) is set to 0 in chosen layers; the attention
  probabilities are untouched, so the attention output of query ``i`` loses exactly ``A_{i,0} v_0``.
* :func:`clamp_channels`: in the residual stream leaving chosen layers, chosen channels of one token are replaced
  by the mean of the other tokens' values in those channels (removes its massive activations).
* :func:`clip_massive`: in the residual stream leaving chosen layers, every entry above ``factor`` times the
  median magnitude is replaced by its channel's median over the tokens (removes all massive activations).

Models: a Hugging Face Llama-style causal LM (``model.model.layers[l].self_attn.v_proj``) or
:class:`repro.papers.sinks.TinyLM` (``model.layers[l].self_attn.v_proj``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from ...common.hooks import capture, hooked

__all__ = [
    "clamp_channels", "clip_massive", "decoder_layers", "kv_head_of", "massive_ratio", "record_values", "sink_fraction",
    "sink_scores", "sink_share", "sink_value_ratio", "small_value_share", "token_similarity", "top_activations",
    "uniform_attention", "value_norms", "zero_sink_value",
]

Tensor = torch.Tensor


# ---------------------------------------------------------------------------------------------------------------
# Metrics


def _stack(xs: Tensor | Sequence[Tensor], ndim: int, what: str) -> Tensor:
    """Layers stacked on a new first axis; each layer must have ``ndim`` dimensions and finite entries."""
    if isinstance(xs, Tensor):
        x = xs if xs.ndim == ndim + 1 else None
    else:
        xs = list(xs)
        if not xs:
            raise ValueError(f"{what}: got no layers")
        if any(not isinstance(t, Tensor) or t.ndim != ndim for t in xs):
            raise ValueError(f"{what}: every layer must be a tensor with {ndim} dimensions")
        x = torch.stack(list(xs))
    if x is None:
        raise ValueError(f"{what}: expected a sequence of {ndim}-d tensors or one {ndim + 1}-d tensor")
    if x.numel() == 0:
        raise ValueError(f"{what}: empty tensors")
    if not torch.isfinite(x).all():
        raise ValueError(f"{what}: contains NaN or inf")
    return x


def sink_scores(attentions: Tensor | Sequence[Tensor], first: int = 0, min_query: int = 4,
                per_row: bool = False) -> Tensor:
    """Sink score per layer and head, ``(L, H)``: the mean attention paid to position ``first`` by the queries
    ``i >= min_query`` (and over the batch), from attention probabilities ``(B, H, T, S)`` per layer (as
    ``output_attentions=True`` returns them; ``S >= T`` keys, the first ``T`` being the tokens). With ``per_row``,
    one score per batch row, ``(L, B, H)`` (their mean over rows is the pooled score).

    Skipping the first queries follows Gu et al. 2025: early queries see few keys, so they attend to position
    0 by necessity (query 0 sees only itself)."""
    a = _stack(attentions, 4, "sink_scores")
    t = a.shape[3]
    if not 0 <= first <= min_query < t:
        raise ValueError(f"need 0 <= first <= min_query < sequence length {t}, got first={first}, "
                         f"min_query={min_query}")
    if a.shape[4] < t:
        raise ValueError(f"attention over {a.shape[4]} keys for {t} queries: not causal self-attention")
    per = a[:, :, :, min_query:, first].mean(dim=3)  # (L, B, H, Q) -> (L, B, H)
    return per if per_row else per.mean(dim=1)


def uniform_attention(batch: int, n_heads: int, length: int) -> Tensor:
    """Causal attention probabilities ``(batch, n_heads, length, length)`` that spread every query evenly over the
    keys it sees (``A_ij = 1 / (i + 1)`` for ``j <= i``): a layer without any sink, the null of a sink score."""
    if batch < 1 or n_heads < 1 or length < 1:
        raise ValueError("uniform_attention needs positive sizes")
    mask = torch.tril(torch.ones(length, length, dtype=torch.float64))
    return (mask / mask.sum(dim=1, keepdim=True)).expand(batch, n_heads, length, length)


def sink_fraction(scores: Tensor, eps: float = 0.3) -> float:
    """Gu et al.'s ``Sink_eps``: the share of (layer, head) pairs whose sink score exceeds ``eps``."""
    if not 0.0 < eps < 1.0:
        raise ValueError(f"eps must lie in (0, 1), got {eps}")
    if scores.numel() == 0 or not torch.isfinite(scores).all():
        raise ValueError("sink_fraction: scores are empty or not finite")
    return float((scores > eps).float().mean())


def massive_ratio(hidden_states: Tensor | Sequence[Tensor]) -> Tensor:
    """Massive-activation ratio per layer, ``(L,)``: ``max |h| / median |h|`` over every batch row, token and
    channel of that layer's residual stream ``h`` (``(B, T, D)`` per layer). Sun et al. 2024 call activations
    massive when they are ~1000x (up to 10^5x) the median magnitude."""
    h = _stack(hidden_states, 3, "massive_ratio").abs().flatten(1)  # (L, B*T*D)
    med = h.median(dim=1).values
    if (med <= 0).any():
        raise ValueError("massive_ratio: a layer has median |activation| 0; the ratio is undefined")
    return h.max(dim=1).values / med


def top_activations(hidden_states: Tensor | Sequence[Tensor], k: int = 2) -> tuple[Tensor, Tensor, Tensor]:
    """The ``k`` largest ``|h|`` per layer and where they sit: ``(values, position, channel)``, each ``(L, k)``
    (position within the sequence; rows of a batch are pooled)."""
    h = _stack(hidden_states, 3, "top_activations").abs()
    n_layers, _, t, d = h.shape
    if not 1 <= k <= h[0].numel():
        raise ValueError(f"k must lie in [1, {h[0].numel()}], got {k}")
    vals, idx = h.flatten(1).topk(k, dim=1)
    return vals, (idx // d) % t, idx % d


def value_norms(values: Tensor, head_dim: int) -> Tensor:
    """Norms ``||v_t||`` of the value vectors per key/value head, ``(B, n_kv_heads, T)``, from the value
    projection's output ``(B, T, n_kv_heads * head_dim)``. With grouped-query attention (SmolLM2: 9 query heads,
    3 value heads of 64) the output is cut by ``head_dim``, not by the number of query heads."""
    if values.ndim != 3:
        raise ValueError(f"values must be (B, T, n_kv_heads * head_dim), got shape {tuple(values.shape)}")
    if head_dim < 1 or values.shape[-1] % head_dim:
        raise ValueError(f"width {values.shape[-1]} is not a multiple of head_dim={head_dim}")
    b, t, w = values.shape
    return values.reshape(b, t, w // head_dim, head_dim).norm(dim=-1).transpose(1, 2)


def sink_value_ratio(values: Tensor, head_dim: int, token: int = 0) -> Tensor:
    """``||v_token|| / mean_{t != token} ||v_t||`` per value head, ``(n_kv_heads,)`` (mean over the batch)."""
    n = value_norms(values, head_dim)
    if not 0 <= token < n.shape[-1] or n.shape[-1] < 2:
        raise ValueError(f"token {token} outside a sequence of {n.shape[-1]} (need >= 2 tokens)")
    others = torch.cat([n[..., :token], n[..., token + 1:]], dim=-1).mean(dim=-1)
    return (n[..., token] / others).mean(dim=0)


def small_value_share(norms: Tensor, token: int = 0, first_layer: int = 3, threshold: float = 0.5) -> Tensor:
    """Per batch row, the share of layers ``first_layer..L-1`` in which ``||v_token||`` is at most ``threshold``
    times the other tokens' mean (the ratio averaged over the value heads first), ``(B,)``; ``norms`` is
    ``(B, L, n_kv_heads, T)`` (:func:`value_norms` of every layer)."""
    if norms.ndim != 4 or not 0 <= token < norms.shape[-1] or norms.shape[-1] < 2:
        raise ValueError("norms must be (B, L, n_kv, T) with T >= 2 and token inside it")
    if not 0 <= first_layer < norms.shape[1]:
        raise ValueError(f"first_layer {first_layer} outside {norms.shape[1]} layers")
    others = (norms.sum(dim=-1) - norms[..., token]) / (norms.shape[-1] - 1)
    ratio = (norms[..., token] / others).mean(dim=2)  # (B, L)
    return (ratio[:, first_layer:] <= threshold).double().mean(dim=1)


def kv_head_of(n_heads: int, n_kv_heads: int) -> Tensor:
    """The value head each query head reads under grouped-query attention: ``h // (n_heads / n_kv_heads)``
    (Hugging Face's ``repeat_kv`` repeats each key/value head for consecutive query heads)."""
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"{n_heads} query heads cannot share {n_kv_heads} key/value heads")
    return torch.arange(n_heads) // (n_heads // n_kv_heads)


def sink_share(attention: Tensor, values: Tensor, head_dim: int, token: int = 0, min_query: int = 4,
               per_row: bool = False) -> Tensor:
    """How much of each head's attention update comes from the sink, ``(H,)`` (``(B, H)`` with ``per_row``): for
    query ``i``,
    ``A_{i,token} ||v_token|| / sum_j A_{i,j} ||v_j||`` (the sink's share of the update's total norm, in [0, 1]),
    averaged over queries ``i >= min_query`` and the batch.

    ``attention``: one layer's probabilities ``(B, H, T, T)``; ``values``: its value-projection output
    ``(B, T, n_kv_heads * head_dim)``. A sink that takes much attention but has a small value contributes little:
    attending to it is (close to) a no-op, which is how we read the paper's "suppressing mixing"."""
    if attention.ndim != 4 or values.ndim != 3 or attention.shape[0] != values.shape[0]:
        raise ValueError("attention must be (B, H, T, T) and values (B, T, width) of the same batch")
    b, n_heads, t, _ = attention.shape
    if not 0 <= token <= min_query < t:
        raise ValueError(f"need 0 <= token <= min_query < {t}")
    norms = value_norms(values, head_dim)  # (B, n_kv, T)
    norms = norms[:, kv_head_of(n_heads, norms.shape[1]).to(norms.device)]  # (B, H, T): per query head
    weighted = attention * norms[:, :, None, :]  # A_ij ||v_j||
    share = weighted[..., token] / weighted.sum(dim=-1).clamp_min(torch.finfo(weighted.dtype).tiny)
    per = share[:, :, min_query:].mean(dim=2)  # (B, H)
    return per if per_row else per.mean(dim=0)


def token_similarity(hidden: Tensor, skip: int = 1) -> Tensor:
    """Mean pairwise cosine similarity of the hidden states of positions ``>= skip`` (the non-sink tokens),
    per batch row, ``(B,)``: 1 means the tokens have collapsed onto one direction (over-mixing)."""
    if hidden.ndim != 3 or hidden.shape[1] - skip < 2:
        raise ValueError("hidden must be (B, T, D) with at least two positions after skip")
    x = torch.nn.functional.normalize(hidden[:, skip:], dim=-1)
    n = x.shape[1]
    gram = x @ x.transpose(1, 2)
    return (gram.sum(dim=(1, 2)) - n) / (n * (n - 1))


# ---------------------------------------------------------------------------------------------------------------
# Hooks


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder blocks of a Llama-style Hugging Face model (``model.model.layers``) or of a TinyLM
    (``model.layers``); each has ``self_attn.v_proj``."""
    for owner in (getattr(model, "model", None), model):
        layers = getattr(owner, "layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers) and hasattr(layers[0], "self_attn"):
            return layers
    raise TypeError(f"{type(model).__name__} has no decoder layers with self_attn (model.model.layers / "
                    "model.layers)")


def _layer_ids(model: nn.Module, layers: Sequence[int] | range) -> list[int]:
    n = len(decoder_layers(model))
    ids = [int(i) for i in layers]
    bad = [i for i in ids if not 0 <= i < n]
    if bad:
        raise ValueError(f"layers {bad} outside [0, {n})")
    return ids


def _hooks(modules: Sequence[nn.Module], hook: Any) -> contextlib.AbstractContextManager[None]:
    """Register ``hook`` on every module for the duration of the context; removed also on an exception.

    The hook is put *first* (``prepend=True``): hooks registered earlier (Hugging Face's ``output_hidden_states``
    recorder installs its own once, on the first call) then see the modified output, whatever the order."""
    return hooked(modules, hook, prepend=True)


def _check_token(x: Tensor, token: int) -> None:
    if not 0 <= token < x.shape[1]:
        raise ValueError(f"token {token} outside a sequence of length {x.shape[1]}")


@contextlib.contextmanager
def zero_sink_value(model: nn.Module, layers: Sequence[int] | range, token: int = 0) -> Iterator[None]:
    """Within the context, the value vector of position ``token`` is 0 in the given layers (every value head).

    The hook replaces the value projection's output row of ``token``: keys, queries and hence the attention
    probabilities are unchanged, so query ``i``'s attention output loses exactly ``A_{i,token} v_token``."""
    mods = [decoder_layers(model)[i].self_attn.v_proj for i in _layer_ids(model, layers)]

    def hook(_module: nn.Module, _inputs: Any, out: Tensor) -> Tensor:
        _check_token(out, token)
        out = out.clone()
        out[:, token] = 0.0  # v_token := 0 (all heads)
        return out

    with _hooks(mods, hook):
        yield


@contextlib.contextmanager
def clamp_channels(model: nn.Module, channels: Sequence[int], layers: Sequence[int] | range,
                   token: int = 0) -> Iterator[None]:
    """Within the context, the residual stream leaving each given layer has, at position ``token``, its
    ``channels`` replaced by the mean over the other positions of the same channels (per batch row).

    Applied to the massive channels of the sink token this removes its massive activations while keeping every
    other entry of the hidden state."""
    ch = [int(c) for c in channels]
    if not ch:
        raise ValueError("clamp_channels: no channels given")
    mods = [decoder_layers(model)[i] for i in _layer_ids(model, layers)]

    def hook(_module: nn.Module, _inputs: Any, out: Any) -> Any:
        h = out[0] if isinstance(out, tuple) else out
        _check_token(h, token)
        if h.shape[1] < 2:
            raise ValueError("clamp_channels needs at least 2 positions (the others' mean)")
        if max(ch) >= h.shape[-1] or min(ch) < 0:
            raise ValueError(f"channels {ch} outside [0, {h.shape[-1]})")
        keep = torch.ones(h.shape[1], dtype=torch.bool, device=h.device)
        keep[token] = False
        h = h.clone()
        h[:, token, ch] = h[:, keep][:, :, ch].mean(dim=1)  # h_token[c] := mean_{t != token} h_t[c]
        return (h, *out[1:]) if isinstance(out, tuple) else h

    with _hooks(mods, hook):
        yield


@contextlib.contextmanager
def clip_massive(model: nn.Module, layers: Sequence[int] | range, factor: float = 1000.0) -> Iterator[None]:
    """Within the context, *every* massive activation leaving the given layers is removed, whatever its token or
    channel: an entry with ``|h[t, c]| > factor * median_{t', c'} |h[t', c']|`` (per batch row; Sun et al. 2024
    call activations massive from about 1000x the median) is replaced by its channel's median over the tokens,
    ``median_{t'} h[t', c]``, a typical value of that channel. Unlike :func:`clamp_channels`, the massive entries
    cannot move to another channel or token."""
    if not factor > 1.0:
        raise ValueError(f"factor must be > 1 (a multiple of the median), got {factor}")
    mods = [decoder_layers(model)[i] for i in _layer_ids(model, layers)]

    def hook(_module: nn.Module, _inputs: Any, out: Any) -> Any:
        h = out[0] if isinstance(out, tuple) else out
        if h.ndim != 3 or h.shape[1] < 2:
            raise ValueError("clip_massive needs a (B, T, D) residual stream with at least 2 positions")
        mag = h.abs()
        median = mag.flatten(1).median(dim=1).values[:, None, None]  # median |h| of each row
        typical = h.median(dim=1, keepdim=True).values  # each channel's median over the tokens, (B, 1, D)
        h = torch.where(mag > factor * median, typical.expand_as(h), h)  # massive -> typical
        return (h, *out[1:]) if isinstance(out, tuple) else h

    with _hooks(mods, hook):
        yield


@contextlib.contextmanager
def record_values(model: nn.Module, layers: Sequence[int] | range | None = None) -> Iterator[dict[int, Tensor]]:
    """Yields a dict filled, on each forward pass, with every chosen layer's value-projection output
    ``(B, T, n_kv_heads * head_dim)`` (detached)."""
    ids = _layer_ids(model, range(len(decoder_layers(model))) if layers is None else layers)
    with capture({i: decoder_layers(model)[i].self_attn.v_proj for i in ids}) as store:
        yield store
