"""SpaRE's method: a sparse autoencoder on a language model's block outputs, concept vectors built from its
features, and generation that adds a concept vector to one block's output.

Paper: Z. Li, X. Sun, W. Lin, C. W. Chen, "Controllable Molecule Generation via Sparse Representation Editing"
(SpaRE), ICML 2026. Rules checked against the public code WanyuGroup/ICML2026_SpaRE @ b0ce480
(``src/spare_molgen/{sae,concepts,hooks,generation}.py``); the code here is our own.

* SAE (``sae.py``): ``h = norm(ReLU(W_e z + b_e))`` with ``norm`` the L2 normalisation of the code row (default;
  ``"max"`` and ``"none"`` are the other options), ``ẑ = W_d h + b_d``,
  loss ``mean((z − ẑ)²) + λ · mean(|h|)``; a decoder atom is a column of ``W_d``.
* Local concept (``build_local_concept``): features whose code is ``≥ 0.5`` in at least ``min_fraction`` (1.0)
  of the exemplar rows; the vector is the mean of their decoder columns; none is an error.
* Global concept (``build_global_concept``): features with code ``≥ 0.5`` on *every* positive row and ``< 0.5``
  on *every* negative row; ``δ_j = mean_pos h_j − mean_neg h_j`` on them, ``v = W_d δ`` (no bias). The public code
  falls back silently to ``δ`` over all features when none is selected; here that is an error unless the caller
  asks for the fallback (``fallback=True``), and the returned ``mode`` names it.
* Editing (``hooks.ActivationEditor``, ``generation.generate_with_edits``): a forward hook adds ``s · v`` to a
  block's output at the last position; a global edit acts at every generation step, a local one only at step
  ``k`` (the ``k``-th new token, counted from 0). The public loop re-runs the whole prefix at each step, so earlier
  positions are always recomputed unedited; :func:`generate_with_edits` gets the same numbers from a KV cache
  (tested against ``recompute=True``, the literal loop).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ...common.hooks import capture
from ...common.train import fit

__all__ = [
    "ActivationEditor", "Edit", "Generation", "SparseAutoencoder", "block_outputs", "filter_top_k_top_p",
    "generate_with_edits", "global_concept", "local_concept", "ranked_concept", "train_sae",
]

Tensor = torch.Tensor
NORMALIZATIONS = ("l2", "max", "none")
Positions = Literal["last", "all"] | tuple[int, ...]


def _check_acts(acts: Tensor, name: str = "acts", dim: int | None = None) -> Tensor:
    if not torch.is_tensor(acts) or acts.ndim != 2 or acts.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty (rows, d) tensor, got "
                         f"{tuple(acts.shape) if torch.is_tensor(acts) else type(acts).__name__}")
    if dim is not None and acts.shape[1] != dim:
        raise ValueError(f"{name} has width {acts.shape[1]}, the SAE expects {dim}")
    if not torch.isfinite(acts).all():
        raise ValueError(f"{name} contains NaN or inf")
    return acts


class SparseAutoencoder(nn.Module):
    """SpaRE's SAE (``sae.py``): ReLU encoder, code normalisation, linear decoder, MSE + λ·mean|h| loss."""

    def __init__(self, d_in: int, expansion: int = 40, l1: float = 1e-5, normalization: str = "l2",
                 latent: int | None = None):
        super().__init__()
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
        if d_in < 1 or expansion < 1 or l1 < 0:
            raise ValueError(f"need d_in >= 1, expansion >= 1, l1 >= 0; got {d_in}, {expansion}, {l1}")
        self.d_in, self.l1, self.normalization = d_in, float(l1), normalization
        self.latent = latent or d_in * expansion
        self.encoder = nn.Linear(d_in, self.latent)
        self.decoder = nn.Linear(self.latent, d_in)

    def encode(self, z: Tensor) -> Tensor:
        """``h = norm(ReLU(W_e z + b_e))``: an all-zero row stays zero under every normalisation."""
        h = F.relu(self.encoder(z))
        if self.normalization == "l2":
            return F.normalize(h, p=2, dim=-1)
        if self.normalization == "max":
            return h / h.amax(dim=-1, keepdim=True).clamp_min(1e-8)
        return h

    def decode(self, h: Tensor) -> Tensor:
        """``ẑ = W_d h + b_d``."""
        return self.decoder(h)

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor]:
        h = self.encode(z)
        return self.decode(h), h

    def loss(self, z: Tensor) -> Tensor:
        """``mean((z − ẑ)²) + λ · mean(|h|)`` (means over every entry, as the public code)."""
        z_hat, h = self(z)
        return torch.mean((z - z_hat) ** 2) + self.l1 * torch.mean(h.abs())

    @property
    def atoms(self) -> Tensor:
        """Decoder atoms as rows: ``(latent, d_in)``, row ``j`` = column ``j`` of ``W_d``."""
        return self.decoder.weight.T

    @torch.no_grad()
    def code_stats(self, acts: Tensor, threshold: float = 0.5, batch: int = 8192) -> tuple[Tensor, Tensor]:
        """Per feature: the fraction of rows whose code is ``≥ threshold``, and the mean code (chunked encoding)."""
        acts = _check_acts(acts, dim=self.d_in)
        p = next(self.parameters())
        hits = torch.zeros(self.latent, dtype=torch.float64, device=p.device)
        total = torch.zeros_like(hits)
        for start in range(0, len(acts), batch):
            h = self.encode(acts[start:start + batch].to(p.device, p.dtype))
            hits += (h >= threshold).sum(0, dtype=torch.float64)
            total += h.sum(0, dtype=torch.float64)
        return (hits / len(acts)).to(p.dtype), (total / len(acts)).to(p.dtype)

    @torch.no_grad()
    def fvu_l0(self, acts: Tensor, batch: int = 8192) -> tuple[float, float]:
        """Fraction of variance unexplained ``Σ‖z − ẑ‖² / Σ‖z − z̄‖²`` and the mean number of nonzero codes."""
        acts = _check_acts(acts, dim=self.d_in)
        p = next(self.parameters())
        mean = acts.to(p.device, p.dtype).mean(0)
        err = var = l0 = 0.0
        for start in range(0, len(acts), batch):
            z = acts[start:start + batch].to(p.device, p.dtype)
            z_hat, h = self(z)
            err += float(((z - z_hat) ** 2).sum())
            var += float(((z - mean) ** 2).sum())
            l0 += float((h > 0).sum())
        return err / var, l0 / len(acts)


def train_sae(acts: Tensor, *, expansion: int = 40, l1: float = 1e-5, normalization: str = "l2", epochs: int = 8,
              batch_size: int = 1024, lr: float = 1e-4, seed: int = 0, latent: int | None = None
              ) -> SparseAutoencoder:
    """Train an SAE on activation rows (public defaults: 40×, λ = 1e-5, 8 epochs, batch 1024, AdamW 1e-4 without
    weight decay), one shuffled pass per epoch, through :func:`repro.common.train.fit`. It lives on ``acts``'
    device and dtype."""
    acts = _check_acts(acts)
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"need epochs >= 1 and batch_size >= 1, got {epochs}, {batch_size}")
    torch.manual_seed(seed)
    sae = SparseAutoencoder(acts.shape[1], expansion, l1, normalization, latent).to(acts.device, acts.dtype)
    per_epoch = math.ceil(len(acts) / batch_size)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    order: list[Tensor] = []

    def step_loss(i: int) -> Tensor:
        if i % per_epoch == 0:  # a fresh permutation per epoch, as the public loader shuffles
            order[:] = [torch.randperm(len(acts), generator=gen).to(acts.device)]
        j = i % per_epoch
        return sae.loss(acts[order[0][j * batch_size:(j + 1) * batch_size]])

    fit(sae, step_loss, epochs * per_epoch, lr=lr, optimizer="adamw", weight_decay=0.0)
    return sae


def local_concept(sae: SparseAutoencoder, acts: Tensor, threshold: float = 0.5, min_fraction: float = 1.0
                  ) -> tuple[Tensor, Tensor]:
    """SpaRE's local concept (``build_local_concept``): ``(vector, feature_ids)``.

    ``acts`` are the block outputs at the exemplar positions (where the model emits the target token)."""
    if not 0.0 < min_fraction <= 1.0:
        raise ValueError(f"min_fraction must lie in (0, 1], got {min_fraction}")
    # (1) fraction of exemplar rows in which each feature's normalised code reaches the threshold
    frac, _ = sae.code_stats(acts, threshold)
    # (2) keep the features active in at least min_fraction of the rows (1.0: in every row)
    ids = torch.nonzero(frac >= min_fraction - 1e-12).flatten()
    if ids.numel() == 0:
        raise ValueError(f"no SAE feature has code >= {threshold} in >= {min_fraction:.0%} of the {len(acts)} "
                         f"exemplars (highest fraction {float(frac.max()):.3f}); the local concept is empty")
    # (3) the concept vector is the mean of the selected decoder atoms
    return sae.atoms[ids].mean(0).detach(), ids


def global_concept(sae: SparseAutoencoder, pos_acts: Tensor, neg_acts: Tensor, threshold: float = 0.5,
                   fallback: bool = False) -> tuple[Tensor, Tensor, str]:
    """SpaRE's global concept (``build_global_concept``): ``(vector, feature_ids, mode)``.

    ``mode`` is ``"thresholded_decoder_difference"`` when features are selected. With none selected this raises,
    unless ``fallback=True``: then ``δ`` is the mean code difference over all features, ``feature_ids`` is empty and
    ``mode`` is ``"mean_decoder_difference"`` (the public code's silent fallback, made explicit)."""
    frac_pos, mean_pos = sae.code_stats(pos_acts, threshold)
    frac_neg, mean_neg = sae.code_stats(neg_acts, threshold)
    # (1) selected: code >= threshold on every positive row AND < threshold on every negative row
    selected = (frac_pos >= 1.0 - 1e-12) & (frac_neg <= 1e-12)
    ids = torch.nonzero(selected).flatten()
    delta = mean_pos - mean_neg
    if ids.numel() == 0:
        if not fallback:
            gap = float((frac_pos - frac_neg).max())
            raise ValueError(f"no SAE feature is >= {threshold} on all {len(pos_acts)} positives and < {threshold} "
                             f"on all {len(neg_acts)} negatives (best frequency gap {gap:.3f}); the global concept "
                             "is empty (pass fallback=True for the public code's mean-difference fallback)")
        mode = "mean_decoder_difference"
    else:
        # (2) δ_j = mean_pos h_j − mean_neg h_j on the selected features, 0 elsewhere
        delta = torch.where(selected, delta, torch.zeros_like(delta))
        mode = "thresholded_decoder_difference"
    # (3) v = W_d δ, without the decoder bias
    return (sae.decoder.weight @ delta).detach(), ids, mode


def ranked_concept(sae: SparseAutoencoder, pos_acts: Tensor, neg_acts: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """A relaxed global concept (our deviation, not in the paper): the ``k`` features with the largest mean code
    difference ``mean_pos h − mean_neg h``, ``v = W_d δ`` restricted to them. Returns ``(vector, feature_ids)``."""
    if not 1 <= k <= sae.latent:
        raise ValueError(f"k must lie in [1, {sae.latent}], got {k}")
    _, mean_pos = sae.code_stats(pos_acts)
    _, mean_neg = sae.code_stats(neg_acts)
    delta = mean_pos - mean_neg
    ids = torch.topk(delta, k).indices.sort().values
    return (sae.decoder.weight[:, ids] @ delta[ids]).detach(), ids


@dataclass(frozen=True)
class Edit:
    """Add ``strength · vector`` to block ``layer``'s output at ``positions``; ``step`` (generation only) gates a
    local edit to the ``step``-th new token (``None``: a global edit, every step)."""

    layer: int
    vector: Tensor
    strength: float = 1.0
    positions: Positions = "last"
    step: int | None = None


def _blocks(model: nn.Module) -> Callable[[int], nn.Module]:
    return lambda i: model.blocks[i]


class ActivationEditor:
    """Context manager: forward hooks that add each edit's ``strength · vector`` to its block's output at its
    positions (``hooks.ActivationEditor``). Every hook is removed on exit, also when the body raises."""

    def __init__(self, model: nn.Module, edits: Sequence[Edit], layer: Callable[[int], nn.Module] | None = None):
        self.model, self.edits = model, list(edits)
        self.layer = layer or _blocks(model)
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> ActivationEditor:
        by_layer: dict[int, list[Edit]] = {}
        for e in self.edits:
            by_layer.setdefault(e.layer, []).append(e)
        try:
            for i, es in by_layer.items():
                self._handles.append(self.layer(i).register_forward_hook(self._hook(es)))
        except Exception:
            self._remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._remove()

    def _remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    @staticmethod
    def _hook(edits: list[Edit]):
        def hook(_module: nn.Module, _inputs: tuple, output):
            hidden = output[0] if isinstance(output, tuple) else output
            edited = hidden.clone()
            t = edited.shape[1]
            for e in edits:
                v = e.vector.to(edited.device, edited.dtype)
                if v.shape != (edited.shape[-1],):
                    raise ValueError(f"edit vector of shape {tuple(v.shape)} does not match hidden size "
                                     f"{edited.shape[-1]}")
                if e.positions == "all":
                    edited += e.strength * v
                elif e.positions == "last":
                    edited[:, -1] += e.strength * v
                else:
                    pos = [p if p >= 0 else t + p for p in e.positions]
                    pos = [p for p in pos if 0 <= p < t]
                    edited[:, pos] += e.strength * v
            return (edited, *output[1:]) if isinstance(output, tuple) else edited
        return hook


def filter_top_k_top_p(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Nucleus / top-k filtering (the public ``_filter_top_k_top_p`` rule): keep the ``top_k`` largest logits, then
    the smallest prefix of the sorted distribution whose mass before the token is ``≤ top_p`` (the top token
    always stays); the rest get ``−inf``."""
    out = logits.clone()
    if top_k > 0:
        kth = torch.topk(out, min(top_k, out.shape[-1]), dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, -math.inf)
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, descending=True, dim=-1)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = torch.zeros_like(cum, dtype=torch.bool)
        drop[..., 1:] = cum[..., :-1] > top_p  # mass before this token already exceeds top_p
        out = out.scatter(-1, order, sorted_logits.masked_fill(drop, -math.inf))
    return out


@dataclass
class Generation:
    """Sampled ids ``(n, steps)`` (``eos`` repeated after the first ``eos``), and the unfiltered next-token
    probabilities ``(n, steps, vocab)`` at temperature 1 when asked for."""

    tokens: Tensor
    probs: Tensor | None


@torch.no_grad()
def generate_with_edits(model: nn.Module, edits: Sequence[Edit], *, n: int, max_new_tokens: int, bos: int, eos: int,
                        temperature: float = 1.0, top_p: float = 0.95, top_k: int = 0, seed: int = 0,
                        recompute: bool = False, return_probs: bool = False) -> Generation:
    """Sample ``n`` sequences from a causal :class:`repro.common.nn.Transformer` started at ``bos``, with SpaRE's
    edits (``generation.generate_with_edits``, batched): at step ``k`` the edits with ``step in (None, k)`` act
    at the newest position only; earlier positions keep their unedited states.

    ``recompute=True`` re-runs the whole prefix every step, as the public loop does; the default reads the
    earlier positions from a KV cache filled by unedited passes, which gives the same distributions at lower cost.
    """
    if n < 1 or max_new_tokens < 1 or temperature <= 0:
        raise ValueError(f"need n >= 1, max_new_tokens >= 1, temperature > 0; got {n}, {max_new_tokens}, "
                         f"{temperature}")
    dev = next(model.parameters()).device
    n_layers = len(model.blocks)
    for e in edits:
        if not 0 <= e.layer < n_layers:
            raise ValueError(f"edit layer {e.layer} outside [0, {n_layers})")
    gen = torch.Generator(device=dev).manual_seed(seed)
    seq = torch.full((n, 1), bos, dtype=torch.long, device=dev)
    cache, done = None, torch.zeros(n, dtype=torch.bool, device=dev)
    probs = []
    model.eval()
    for step in range(max_new_tokens):
        active = [e for e in edits if e.step is None or e.step == step]
        inp = seq if recompute else seq[:, -1:]
        with ActivationEditor(model, active):
            logits, new_cache = model(inp, cache=cache, return_cache=True)
        if not recompute:
            # an edit below the last block changes later blocks' keys and values: refill the cache unedited
            if any(e.layer < n_layers - 1 for e in active):
                _, new_cache = model(inp, cache=cache, return_cache=True)
            cache = new_cache
        logits = logits[:, -1]
        logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
        if return_probs:
            probs.append(torch.softmax(logits, -1))
        filtered = filter_top_k_top_p(logits / temperature, top_k, top_p)
        nxt = torch.multinomial(torch.softmax(filtered, -1), 1, generator=gen).squeeze(1)
        nxt = torch.where(done, torch.full_like(nxt, eos), nxt)
        done |= nxt == eos
        seq = torch.cat([seq, nxt[:, None]], dim=1)
        if bool(done.all()):
            break
    tokens = seq[:, 1:]
    if tokens.shape[1] < max_new_tokens:
        pad = torch.full((n, max_new_tokens - tokens.shape[1]), eos, dtype=torch.long, device=dev)
        tokens = torch.cat([tokens, pad], dim=1)
    return Generation(tokens, torch.stack(probs, 1) if return_probs else None)


@torch.no_grad()
def block_outputs(model: nn.Module, tokens: Tensor, layers: Sequence[int]) -> list[Tensor]:
    """Block outputs ``(B, T, d)`` of ``layers`` for ``tokens`` (the activations SpaRE's SAEs read, ``hidden_states
    [layer + 1]`` of a Hugging Face model)."""
    with capture({i: model.blocks[i] for i in layers}) as got:
        model(tokens)
    return [got[i] for i in layers]
