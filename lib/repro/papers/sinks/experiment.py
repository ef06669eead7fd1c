"""Experiment harness of notebook 10: sinks, massive activations and the four interventions on a pretrained LM
(:func:`sink_study`), the removal of every massive activation (:func:`suppression_sweep`), and the from-scratch
architecture-variant study on Bigram-Backcopy (:func:`variant_study`).

All numbers of :func:`sink_study` come from deterministic forward passes of a fixed model on fixed text, so a
rerun reproduces them exactly (the same holds for :func:`suppression_sweep`); :func:`variant_study` seeds its
data and initialisations from ``seed``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ...common import stats
from ...common.train import cosine_schedule, fit
from .method import (
    clamp_channels,
    clip_massive,
    decoder_layers,
    massive_ratio,
    record_values,
    sink_scores,
    sink_share,
    sink_value_ratio,
    small_value_share,
    token_similarity,
    top_activations,
    uniform_attention,
    value_norms,
    zero_sink_value,
)
from .problems import bigram_backcopy
from .tinylm import TinyLM, TinyLMConfig

__all__ = [
    "CONDITIONS", "Measurement", "SinkStudy", "Suppression", "VariantResult", "encode", "group_means",
    "massive_channels", "measure", "measure_variant", "next_token_nll", "ordinary_channels", "ranked_channels",
    "recovered_share", "sink_study", "suppression_sweep", "train_variant", "variant_study",
]

Tensor = torch.Tensor
CONDITIONS = ("base", "zero sink value", "clamp massive", "clamp + zero value")


# ---------------------------------------------------------------------------------------------------------------
# The pretrained model


def encode(tokenizer: Any, texts: Sequence[str], n_tokens: int, bos: bool = True) -> Tensor:
    """``(len(texts), n_tokens [+ 1])`` token ids: each text's first ``n_tokens`` tokens, after the tokenizer's
    BOS token when ``bos`` (SmolLM2's tokenizer adds none by itself). Equal lengths, so no padding is needed."""
    rows = [tokenizer(t, return_tensors="pt").input_ids[0] for t in texts]
    short = [len(r) for r in rows if len(r) < n_tokens]
    if not rows or short:
        raise ValueError(f"need texts of at least {n_tokens} tokens (got lengths {short or 'none'})")
    ids = torch.stack([r[:n_tokens] for r in rows])
    if bos:
        ids = torch.cat([torch.full((len(rows), 1), int(tokenizer.bos_token_id)), ids], dim=1)
    return ids


def next_token_nll(logits: Tensor, ids: Tensor, skip: int = 1, per_row: bool = False) -> Any:
    """Mean next-token negative log-likelihood (nats) of ``ids[:, skip + 1:]`` given their prefixes (the first
    ``skip`` predictions, made from the first token(s) alone, are left out); with ``per_row`` one value per text,
    ``(B,)`` (every text has the same length, so their mean is the pooled value)."""
    logp = torch.log_softmax(logits[:, skip:-1].double(), dim=-1)
    nll = -logp.gather(2, ids[:, skip + 1:, None])[..., 0]  # (B, T - skip - 1)
    return nll.mean(dim=1) if per_row else float(nll.mean())


@dataclass
class Measurement:
    """One forward pass of the batch of texts under one condition (the stack of layers ``0..L-1``). The ``*_text``
    fields keep one value per text (the bootstrap of the claims resamples the texts)."""

    name: str
    nll: float
    nll_text: Tensor  # (B,) next-token NLL per text
    sink: Tensor  # (L, H) sink scores (attention to position 0), pooled over the texts
    sink_text: Tensor  # (B, L, H) the same per text
    ratio: Tensor  # (L,) massive ratio of the residual stream entering each layer, over all texts
    ratio_per_text: Tensor  # (B, L)
    top_channel: Tensor  # (B, L) channel of the largest |h| entering each layer
    top_position: Tensor  # (B, L) its position
    value_ratio: Tensor  # (L, n_kv) ||v_0|| / mean_t ||v_t||
    value_norm: Tensor  # (B, L, n_kv, T) ||v_t|| per text, layer, value head and position
    share: Tensor  # (L, H) sink's share of the attention update
    share_text: Tensor  # (B, L, H)
    similarity: Tensor  # (L,) mean cosine similarity of the non-sink tokens entering each layer (mean over texts)
    similarity_text: Tensor  # (B, L)
    attention_example: Tensor  # (L, H, T, T) attention probabilities of the first text
    hidden_first: Tensor  # (B, L, D) residual stream of position 0 entering each layer
    channel_peak: Tensor  # (B, L, D) max over positions of |h| per channel
    channel_peak_rest: Tensor  # (B, L, D) max over positions >= 1 (every token but the first)
    median: Tensor  # (B, L) median |h| per text and layer

    def channel_ratio(self, channel: int, rest: bool = False) -> Tensor:
        """``(B, L)``: ``max_t |h[t, channel]| / median |h|`` per text and layer (the massive ratio carried by
        one channel; equal to the ratio where that channel holds the maximum); ``rest``: over positions ``t >= 1``
        only."""
        peak = self.channel_peak_rest if rest else self.channel_peak
        return peak[:, :, channel] / self.median


def measure(model: Any, ids: Tensor, name: str = "base", *, zero_layers: Sequence[int] = (),
            clamp_layers: Sequence[int] = (), channels: Sequence[int] = (), zero_token: int = 0) -> Measurement:
    """Run ``model`` on ``ids`` with the value of position ``zero_token`` (the sink: 0) zeroed in ``zero_layers``
    and/or the sink's ``channels`` clamped in ``clamp_layers`` (:func:`zero_sink_value`, :func:`clamp_channels`),
    and measure everything."""
    head_dim = int(model.config.head_dim)
    n_layers = len(decoder_layers(model))
    with torch.no_grad(), contextlib.ExitStack() as stack:
        if clamp_layers:
            stack.enter_context(clamp_channels(model, channels, clamp_layers, token=0))
        if zero_layers:
            stack.enter_context(zero_sink_value(model, zero_layers, token=zero_token))
        values = stack.enter_context(record_values(model))
        out = model(ids, output_attentions=True, output_hidden_states=True)
    hidden = out.hidden_states[:n_layers]  # the input of each layer (the last entry is after the final norm)
    per_text = [[h[b:b + 1] for h in hidden] for b in range(ids.shape[0])]
    tops = [top_activations(ht, 1) for ht in per_text]
    sink_text = sink_scores(out.attentions, per_row=True).transpose(0, 1)  # (B, L, H)
    share_text = torch.stack([sink_share(out.attentions[i], values[i], head_dim, per_row=True)
                              for i in range(n_layers)], dim=1)
    similarity_text = torch.stack([token_similarity(h) for h in hidden], dim=1)
    nll_text = next_token_nll(out.logits, ids, per_row=True)
    return Measurement(
        name=name,
        nll=float(nll_text.mean()),
        nll_text=nll_text,
        sink=sink_text.mean(dim=0),
        sink_text=sink_text,
        ratio=massive_ratio(hidden),
        ratio_per_text=torch.stack([massive_ratio(ht) for ht in per_text]),
        top_channel=torch.stack([t[2][:, 0] for t in tops]),
        top_position=torch.stack([t[1][:, 0] for t in tops]),
        value_ratio=torch.stack([sink_value_ratio(values[i], head_dim) for i in range(n_layers)]),
        value_norm=torch.stack([value_norms(values[i], head_dim) for i in range(n_layers)], dim=1),
        share=share_text.mean(dim=0),
        share_text=share_text,
        similarity=similarity_text.mean(dim=0),
        similarity_text=similarity_text,
        attention_example=torch.stack([a[0] for a in out.attentions]),
        hidden_first=torch.stack([h[:, 0] for h in hidden], dim=1),
        channel_peak=torch.stack([h.abs().amax(dim=1) for h in hidden], dim=1),
        channel_peak_rest=torch.stack([h[:, 1:].abs().amax(dim=1) for h in hidden], dim=1),
        median=torch.stack([h.abs().flatten(1).median(dim=1).values for h in hidden], dim=1),
    )


def massive_channels(m: Measurement, k: int = 2) -> list[int]:
    """The ``k`` channels of position 0 with the largest mean ``|h|`` over texts, at the layer where the massive
    ratio peaks (SmolLM2: 507 and 247)."""
    return ranked_channels(m)[:k]


def ranked_channels(m: Measurement) -> list[int]:
    """Every channel of position 0, by mean ``|h|`` over the texts at the layer where the massive ratio peaks,
    largest first."""
    layer = int(m.ratio.argmax())
    return [int(c) for c in m.hidden_first[:, layer].abs().mean(dim=0).argsort(descending=True)]


def ordinary_channels(m: Measurement, k: int = 2) -> list[int]:
    """``k`` ordinary channels of position 0 for the null clamp: those at the median rank of
    :func:`ranked_channels` (typical magnitude, neither massive nor near zero)."""
    ranked = ranked_channels(m)
    mid = len(ranked) // 2
    return ranked[mid:mid + k]


def _np(x: Tensor) -> np.ndarray:
    return x.detach().double().cpu().numpy()


@dataclass
class SinkStudy:
    """The measurements of :func:`sink_study` and the numbers the claims use (``*_text``: one value per text)."""

    conditions: dict[str, Measurement]
    plain: Measurement  # the first texts without the BOS token: the first token is an ordinary word
    channels: list[int]
    null_channels: list[int]
    layers: list[int]
    mid: slice
    groups: list[str]  # per text, the text set it comes from

    @property
    def channel_ratio_per_text(self) -> Tensor:
        """``(B,)``: per text, the largest ratio over layers carried by the first massive channel (base run)."""
        return self.conditions["base"].channel_ratio(self.channels[0]).max(dim=1).values

    @property
    def channel_ratio_rest_per_text(self) -> Tensor:
        """``(B,)``: the same channel's largest ratio over layers at every position but the first (base run)."""
        return self.conditions["base"].channel_ratio(self.channels[0], rest=True).max(dim=1).values

    def sink_mid(self, name: str = "base") -> float:
        """Mean sink score over the middle layers and all heads."""
        return float(self.conditions[name].sink[self.mid].mean())

    def sink_mid_text(self, name: str = "base") -> np.ndarray:
        """``(B,)``: per text, the mean sink score over the middle layers and all heads."""
        return _np(self.conditions[name].sink_text[:, self.mid].mean(dim=(1, 2)))

    def uniform_mid_text(self) -> np.ndarray:
        """``(B,)``: the sink score of uniform causal attention over the same texts (no sink at all)."""
        base = self.conditions["base"]
        b, t = base.sink_text.shape[0], base.attention_example.shape[-1]
        return np.full(b, float(sink_scores([uniform_attention(1, 1, t)]).mean()))

    def share_mid_text(self, name: str = "base") -> np.ndarray:
        """``(B,)``: the sink's share of the attention update, mean over the middle layers and heads."""
        return _np(self.conditions[name].share_text[:, self.mid].mean(dim=(1, 2)))

    def similarity_last_text(self, name: str = "base") -> np.ndarray:
        """``(B,)``: mean pairwise cosine similarity of the non-sink tokens entering the last layer."""
        return _np(self.conditions[name].similarity_text[:, -1])

    def nll(self, name: str) -> float:
        return self.conditions[name].nll

    def nll_text(self, name: str) -> np.ndarray:
        return _np(self.conditions[name].nll_text)

    def small_value_text(self, first_layer: int = 3, threshold: float = 0.5, ordinary: bool = False) -> np.ndarray:
        """``(B,)``: share of layers ``first_layer..`` where the sink's value norm is at most ``threshold`` times
        the other tokens' mean (base run); ``ordinary``: the same for every other position, averaged over them."""
        norms = self.conditions["base"].value_norm
        if not ordinary:
            return _np(small_value_share(norms, 0, first_layer, threshold))
        per = [small_value_share(norms, t, first_layer, threshold) for t in range(1, norms.shape[-1])]
        return _np(torch.stack(per).mean(dim=0))

    @property
    def loss_rise(self) -> float:
        """NLL(clamp massive) - NLL(base), nats."""
        return self.nll("clamp massive") - self.nll("base")

    @property
    def recovered(self) -> float:
        """Share of the clamp's NLL increase that zeroing the sink value as well removes."""
        return (self.nll("clamp massive") - self.nll("clamp + zero value")) / self.loss_rise


def group_means(values: Any, groups: Sequence[str]) -> dict[str, float]:
    """The mean of per-text ``values`` within each text set of ``groups`` (in order of first appearance), and over
    all texts (``"all"``)."""
    arr = np.asarray(values, dtype=float).reshape(-1)
    if arr.size != len(groups):
        raise ValueError(f"{arr.size} values for {len(groups)} group labels")
    labels = list(dict.fromkeys(groups))
    out = {g: stats.mean(arr[[x == g for x in groups]]) for g in labels}
    out["all"] = stats.mean(arr)
    return out


def recovered_share(clamped: np.ndarray, repaired: np.ndarray, base: np.ndarray) -> float:
    """``(mean clamped - mean repaired) / (mean clamped - mean base)``: the share of a loss rise that a repair
    removes, from per-text losses (the statistic the bootstrap of claim C4 recomputes)."""
    return float((np.mean(clamped) - np.mean(repaired)) / (np.mean(clamped) - np.mean(base)))


def sink_study(model: Any, tokenizer: Any, texts: Sequence[str], n_tokens: int = 48, from_layer: int = 4,
               mid: tuple[int, int] = (12, 28), k_channels: int = 2, groups: Sequence[str] | None = None,
               n_plain: int | None = None, other_token: int = 1) -> SinkStudy:
    """Measure the pretrained model on ``texts`` (BOS + ``n_tokens`` tokens each) under the four conditions of
    the intervention table, two null interventions, and (the first ``n_plain`` texts) without the BOS token.
    The clamped channels are found in the base run (:func:`massive_channels`); both interventions act on layers
    ``from_layer..L-1`` (from layer 0, zeroing the value would stop the massive activation from forming at all,
    which is a different experiment). The nulls: ``"clamp ordinary"`` clamps ``k_channels`` ordinary channels of
    the sink instead (:func:`ordinary_channels`); ``"clamp + zero other value"`` clamps the massive channels and
    zeroes the value of position ``other_token`` instead of the sink's."""
    n_layers = len(decoder_layers(model))
    if not 0 <= from_layer < n_layers or not 0 <= mid[0] < mid[1] <= n_layers:
        raise ValueError(f"from_layer={from_layer} or mid={mid} outside the model's {n_layers} layers")
    if not 0 < other_token < n_tokens:
        raise ValueError(f"other_token must be an ordinary position in [1, {n_tokens}), got {other_token}")
    groups = list(groups) if groups is not None else ["texts"] * len(texts)
    if len(groups) != len(texts):
        raise ValueError("one group label per text")
    ids = encode(tokenizer, texts, n_tokens, bos=True)
    layers = list(range(from_layer, n_layers))
    base = measure(model, ids, "base")
    channels = massive_channels(base, k_channels)
    null = ordinary_channels(base, k_channels)
    conds = {"base": base,
             "zero sink value": measure(model, ids, "zero sink value", zero_layers=layers),
             "clamp massive": measure(model, ids, "clamp massive", clamp_layers=layers, channels=channels),
             "clamp + zero value": measure(model, ids, "clamp + zero value", zero_layers=layers,
                                           clamp_layers=layers, channels=channels),
             "clamp ordinary": measure(model, ids, "clamp ordinary", clamp_layers=layers, channels=null),
             "clamp + zero other value": measure(model, ids, "clamp + zero other value", zero_layers=layers,
                                                 clamp_layers=layers, channels=channels, zero_token=other_token)}
    plain_texts = texts[:n_plain] if n_plain is not None else texts
    plain = measure(model, encode(tokenizer, plain_texts, n_tokens, bos=False), "no BOS")
    return SinkStudy(conditions=conds, plain=plain, channels=channels, null_channels=null, layers=layers,
                     mid=slice(*mid), groups=groups)


@dataclass
class Suppression:
    """:func:`suppression_sweep`: per clip factor, without (index 0) and with (index 1) the sink's value zeroed."""

    factors: list[float]
    nll: Tensor  # (F, 2) next-token NLL
    sink: Tensor  # (F, 2, L) attention to position 0 per layer (mean over heads and texts)
    sink_text: Tensor  # (F, 2, B, L) the same per text
    max_ratio: Tensor  # (F, 2) the largest per-text massive ratio entering the clipped layers

    def sink_mid(self, mid: slice) -> Tensor:
        """``(F, 2)``: mean attention to position 0 over the layers ``mid``."""
        return self.sink[:, :, mid].mean(dim=-1)

    def sink_mid_text(self, mid: slice) -> np.ndarray:
        """``(F, 2, B)``: per text, the mean attention to position 0 over the layers ``mid``."""
        return _np(self.sink_text[..., mid].mean(dim=-1))

    def recovered(self, base_nll: float) -> Tensor:
        """``(F,)``: share of the clip's NLL rise that zeroing the sink's value removes."""
        return (self.nll[:, 0] - self.nll[:, 1]) / (self.nll[:, 0] - base_nll)


def suppression_sweep(model: Any, ids: Tensor, factors: Sequence[float], from_layer: int = 4) -> Suppression:
    """Remove *all* massive activations in layers ``from_layer..L-1`` (:func:`clip_massive` at each ``factor``
    times the median), with and without zeroing the sink's value in the same layers (:func:`zero_sink_value`),
    and record the loss, the sink per layer and the largest massive ratio left (one forward pass each)."""
    n_layers = len(decoder_layers(model))
    if not factors or not 0 <= from_layer < n_layers - 1:
        raise ValueError(f"need factors and 0 <= from_layer < {n_layers - 1}")
    layers = list(range(from_layer, n_layers))
    nll, sink, ratio = [], [], []
    for f in factors:
        for zero in (False, True):
            with torch.no_grad(), clip_massive(model, layers, f), \
                    (zero_sink_value(model, layers) if zero else contextlib.nullcontext()):
                out = model(ids, output_attentions=True, output_hidden_states=True)
            hidden = out.hidden_states[from_layer + 1:n_layers]  # the inputs of the layers after a clipped one
            nll.append(next_token_nll(out.logits, ids))
            sink.append(sink_scores(out.attentions, per_row=True).mean(dim=2).transpose(0, 1))  # (B, L)
            ratio.append(max(float(massive_ratio([h[b:b + 1] for h in hidden]).max()) for b in range(ids.shape[0])))
    k = len(factors)
    sink_text = torch.stack(sink).reshape(k, 2, ids.shape[0], -1)
    return Suppression(factors=[float(f) for f in factors], nll=torch.tensor(nll).reshape(k, 2),
                       sink=sink_text.mean(dim=2), sink_text=sink_text, max_ratio=torch.tensor(ratio).reshape(k, 2))


# ---------------------------------------------------------------------------------------------------------------
# The variant study (TinyLM on Bigram-Backcopy)


@dataclass
class VariantResult:
    """One trained TinyLM variant, measured on held-out sequences."""

    label: str
    losses: list[float]
    val_nll: float
    optimal_nll: float
    sink: float  # mean attention to <bos> over layers, heads and queries >= 4
    bias_mass: float  # mean attention to the KV-bias slot (0 without one)
    max_ratio: float  # largest massive ratio over the residual streams after layer 0
    value_ratio: float  # mean over layers of ||v_bos|| / mean ||v_t||
    sink_layers: list[float] = field(default_factory=list)  # per-layer mean attention to <bos>


def train_variant(cfg: TinyLMConfig, data: Tensor, steps: int, batch: int, lr: float,
                  seed: int, device: torch.device | str = "cpu") -> tuple[TinyLM, list[float]]:
    """Train a TinyLM with next-token cross-entropy on the rows of ``data`` (``steps * batch`` sequences, drawn
    in order) through :func:`repro.common.train.fit` (AdamW, warm-up then cosine decay, clip 1)."""
    if data.shape[0] < steps * batch:
        raise ValueError(f"need {steps * batch} training sequences, got {data.shape[0]}")
    torch.manual_seed(seed)
    model = TinyLM(cfg).to(device)
    data = data.to(device)

    def step_loss(i: int) -> Tensor:
        x = data[i * batch:(i + 1) * batch]
        logits = model(x[:, :-1]).logits
        return F.cross_entropy(logits.reshape(-1, cfg.vocab_size), x[:, 1:].reshape(-1))

    losses = fit(model, step_loss, steps, lr=lr, optimizer="adamw", weight_decay=0.0, clip=1.0,
                 schedule=lambda i: cosine_schedule(i, steps, max(1, steps // 20)))
    return model, losses


def measure_variant(model: TinyLM, val: Tensor, optimal: float, losses: list[float]) -> VariantResult:
    """Sink, KV-bias mass, massive ratio and value ratio of a trained variant on ``val``."""
    with torch.no_grad(), record_values(model) as values:
        out = model(val, output_attentions=True, output_hidden_states=True)
    scores = sink_scores(out.attentions)
    bias = (torch.stack([b[:, :, 4:].mean() for b in out.bias_attention]).mean()
            if out.bias_attention is not None else torch.tensor(0.0))
    vr = torch.stack([sink_value_ratio(values[i], model.cfg.head_dim).mean() for i in range(model.cfg.n_layers)])
    return VariantResult(
        label=model.cfg.label(), losses=losses,
        val_nll=float(F.cross_entropy(out.logits[:, :-1].reshape(-1, model.cfg.vocab_size), val[:, 1:].reshape(-1))),
        optimal_nll=optimal, sink=float(scores.mean()), bias_mass=float(bias),
        max_ratio=float(massive_ratio(out.hidden_states[1:]).max()), value_ratio=float(vr.mean()),
        sink_layers=scores.mean(dim=1).tolist())


def variant_study(variants: Sequence[dict[str, Any]], *, steps: int, batch: int = 64, length: int = 64,
                  d_model: int = 128, n_layers: int = 3, n_heads: int = 4, lr: float = 1e-3, vocab: int = 32,
                  seed: int = 0, device: torch.device | str = "cpu") -> list[VariantResult]:
    """Train one TinyLM per entry of ``variants`` (keyword switches of :class:`TinyLMConfig`, e.g.
    ``{"kv_bias": True}``) on the same Bigram-Backcopy data, same initial seed, and measure each."""
    if not variants:
        return []
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    task = bigram_backcopy(vocab, rng=rng)
    data, val = task.sample(steps * batch, length, gen), task.sample(512, length, gen)
    optimal = task.optimal_nll(val)
    results = []
    for switches in variants:
        cfg = TinyLMConfig(vocab, length, d_model=d_model, n_layers=n_layers, n_heads=n_heads, **switches)
        model, losses = train_variant(cfg, data, steps, batch, lr, seed, device)
        results.append(measure_variant(model, val.to(device), optimal, losses))
    return results
