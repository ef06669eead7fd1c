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
    token_similarity,
    top_activations,
    zero_sink_value,
)
from .problems import bigram_backcopy
from .tinylm import TinyLM, TinyLMConfig

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


def next_token_nll(logits: Tensor, ids: Tensor, skip: int = 1) -> float:
    """Mean next-token negative log-likelihood (nats) of ``ids[:, skip + 1:]`` given their prefixes (the first
    ``skip`` predictions, made from the first token(s) alone, are left out)."""
    logp = torch.log_softmax(logits[:, skip:-1].double(), dim=-1)
    return float(-logp.gather(2, ids[:, skip + 1:, None]).mean())


@dataclass
class Measurement:
    """One forward pass of the batch of texts under one condition (the stack of layers ``0..L-1``)."""

    name: str
    nll: float
    sink: Tensor  # (L, H) sink scores (attention to position 0)
    ratio: Tensor  # (L,) massive ratio of the residual stream entering each layer, over all texts
    ratio_per_text: Tensor  # (B, L)
    top_channel: Tensor  # (B, L) channel of the largest |h| entering each layer
    top_position: Tensor  # (B, L) its position
    value_ratio: Tensor  # (L, n_kv) ||v_0|| / mean_t ||v_t||
    share: Tensor  # (L, H) sink's share of the attention update
    similarity: Tensor  # (L,) mean cosine similarity of the non-sink tokens entering each layer (mean over texts)
    attention_example: Tensor  # (L, H, T, T) attention probabilities of the first text
    hidden_first: Tensor  # (B, L, D) residual stream of position 0 entering each layer
    channel_peak: Tensor  # (B, L, D) max over positions of |h| per channel
    median: Tensor  # (B, L) median |h| per text and layer

    def channel_ratio(self, channel: int) -> Tensor:
        """``(B, L)``: ``max_t |h[t, channel]| / median |h|`` per text and layer (the massive ratio carried by
        one channel; equal to the ratio where that channel holds the maximum)."""
        return self.channel_peak[:, :, channel] / self.median


def measure(model: Any, ids: Tensor, name: str = "base", *, zero_layers: Sequence[int] = (),
            clamp_layers: Sequence[int] = (), channels: Sequence[int] = ()) -> Measurement:
    """Run ``model`` on ``ids`` with the sink's value zeroed in ``zero_layers`` and/or its ``channels`` clamped
    in ``clamp_layers`` (:func:`zero_sink_value`, :func:`clamp_channels`), and measure everything."""
    head_dim = int(model.config.head_dim)
    n_layers = len(decoder_layers(model))
    with torch.no_grad(), contextlib.ExitStack() as stack:
        if clamp_layers:
            stack.enter_context(clamp_channels(model, channels, clamp_layers, token=0))
        if zero_layers:
            stack.enter_context(zero_sink_value(model, zero_layers, token=0))
        values = stack.enter_context(record_values(model))
        out = model(ids, output_attentions=True, output_hidden_states=True)
    hidden = out.hidden_states[:n_layers]  # the input of each layer (the last entry is after the final norm)
    per_text = [[h[b:b + 1] for h in hidden] for b in range(ids.shape[0])]
    tops = [top_activations(ht, 1) for ht in per_text]
    return Measurement(
        name=name,
        nll=next_token_nll(out.logits, ids),
        sink=sink_scores(out.attentions),
        ratio=massive_ratio(hidden),
        ratio_per_text=torch.stack([massive_ratio(ht) for ht in per_text]),
        top_channel=torch.stack([t[2][:, 0] for t in tops]),
        top_position=torch.stack([t[1][:, 0] for t in tops]),
        value_ratio=torch.stack([sink_value_ratio(values[i], head_dim) for i in range(n_layers)]),
        share=torch.stack([sink_share(out.attentions[i], values[i], head_dim) for i in range(n_layers)]),
        similarity=torch.stack([token_similarity(h).mean() for h in hidden]),
        attention_example=torch.stack([a[0] for a in out.attentions]),
        hidden_first=torch.stack([h[:, 0] for h in hidden], dim=1),
        channel_peak=torch.stack([h.abs().amax(dim=1) for h in hidden], dim=1),
        median=torch.stack([h.abs().flatten(1).median(dim=1).values for h in hidden], dim=1),
    )


def massive_channels(m: Measurement, k: int = 2) -> list[int]:
    """The ``k`` channels of position 0 with the largest mean ``|h|`` over texts, at the layer where the massive
    ratio peaks (SmolLM2: 507 and 247)."""
    layer = int(m.ratio.argmax())
    mags = m.hidden_first[:, layer].abs().mean(dim=0)
    return [int(c) for c in mags.topk(k).indices]


@dataclass
class SinkStudy:
    """The measurements of :func:`sink_study` and the numbers the claims use."""

    conditions: dict[str, Measurement]
    plain: Measurement  # the same texts without the BOS token: the first token is an ordinary word
    channels: list[int]
    layers: list[int]
    mid: slice

    @property
    def channel_ratio_per_text(self) -> Tensor:
        """``(B,)``: per text, the largest ratio over layers carried by the first massive channel (base run)."""
        return self.conditions["base"].channel_ratio(self.channels[0]).max(dim=1).values

    def sink_mid(self, name: str = "base") -> float:
        """Mean sink score over the middle layers and all heads."""
        return float(self.conditions[name].sink[self.mid].mean())

    def nll(self, name: str) -> float:
        return self.conditions[name].nll

    @property
    def loss_rise(self) -> float:
        """NLL(clamp massive) - NLL(base), nats."""
        return self.nll("clamp massive") - self.nll("base")

    @property
    def recovered(self) -> float:
        """Share of the clamp's NLL increase that zeroing the sink value as well removes."""
        return (self.nll("clamp massive") - self.nll("clamp + zero value")) / self.loss_rise


def sink_study(model: Any, tokenizer: Any, texts: Sequence[str], n_tokens: int = 48, from_layer: int = 4,
               mid: tuple[int, int] = (12, 28), k_channels: int = 2) -> SinkStudy:
    """Measure the pretrained model on ``texts`` (BOS + ``n_tokens`` tokens each) under the four conditions of
    the intervention table, plus the no-BOS control. The clamped channels are found in the base run
    (:func:`massive_channels`); both interventions act on layers ``from_layer..L-1`` (from layer 0, zeroing the
    value would stop the massive activation from forming at all, which is a different experiment)."""
    n_layers = len(decoder_layers(model))
    if not 0 <= from_layer < n_layers or not 0 <= mid[0] < mid[1] <= n_layers:
        raise ValueError(f"from_layer={from_layer} or mid={mid} outside the model's {n_layers} layers")
    ids = encode(tokenizer, texts, n_tokens, bos=True)
    layers = list(range(from_layer, n_layers))
    base = measure(model, ids, "base")
    channels = massive_channels(base, k_channels)
    conds = {"base": base,
             "zero sink value": measure(model, ids, "zero sink value", zero_layers=layers),
             "clamp massive": measure(model, ids, "clamp massive", clamp_layers=layers, channels=channels),
             "clamp + zero value": measure(model, ids, "clamp + zero value", zero_layers=layers,
                                           clamp_layers=layers, channels=channels)}
    plain = measure(model, encode(tokenizer, texts, n_tokens, bos=False), "no BOS")
    return SinkStudy(conditions=conds, plain=plain, channels=channels, layers=layers, mid=slice(*mid))


@dataclass
class Suppression:
    """:func:`suppression_sweep`: per clip factor, without (index 0) and with (index 1) the sink's value zeroed."""

    factors: list[float]
    nll: Tensor  # (F, 2) next-token NLL
    sink: Tensor  # (F, 2, L) attention to position 0 per layer (mean over heads)
    max_ratio: Tensor  # (F, 2) the largest per-text massive ratio entering the clipped layers

    def sink_mid(self, mid: slice) -> Tensor:
        """``(F, 2)``: mean attention to position 0 over the layers ``mid``."""
        return self.sink[:, :, mid].mean(dim=-1)

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
            sink.append(sink_scores(out.attentions).mean(dim=1))
            ratio.append(max(float(massive_ratio([h[b:b + 1] for h in hidden]).max()) for b in range(ids.shape[0])))
    k = len(factors)
    return Suppression(factors=[float(f) for f in factors], nll=torch.tensor(nll).reshape(k, 2),
                       sink=torch.stack(sink).reshape(k, 2, -1), max_ratio=torch.tensor(ratio).reshape(k, 2))


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
