"""Entropy models for octree occupancy symbols: PACE and the baselines it is compared with.

Paper 09: Zhu, You, Ding, Ma, "PACE: Post-Causal Entropy Modeling for Learned LiDAR Point Cloud Compression",
ICML 2026 (arXiv 2605.01320). Notebook: ``notebooks/09-pace-lidar.ipynb``.

All models read the same node context (:func:`repro.papers.pace.octree.level_context`) and output a pmf over the 255
occupancy symbols. The nodes of one octree level are cut into windows of ``W`` consecutive nodes (Morton order).

* :class:`PACEModel` (the paper's idea). A **non-causal backbone** ``F = B(ctx)`` (context embedding, a 1-D
  convolution along the window, ``n_layers`` unmasked pre-norm transformer blocks with SwiGLU) runs **once** per
  window. Causality lives only in a light **predictor**: its input at position ``i`` is
  ``x_i = F_i + E(o_{i−1})`` (the previous node's symbol, shifted by one; the pad symbol 255 embeds to 0), followed by
  a diagonal linear state-space layer ``h_i = a ⊙ h_{i−1} + (1 − a) ⊙ W_u x_i`` (our CPU stand-in for the paper's
  Mamba block), a gated read-out and an MLP to 255 logits. **Stage-scalable decoding** from one set of weights:
  with ``k`` stages, node ``i`` has phase ``(i mod W) mod k``; stage ``r`` decodes the phase-``r`` nodes and the
  predictor input carries exactly the symbols of phases ``< r`` (all others are the pad symbol), so ``k`` predictor
  passes and one backbone pass decode a level. ``k = 1`` is fully parallel (ancestors only), ``k = W`` is
  autoregressive; the recurrent :meth:`SSMPredictor.step` gives the autoregressive path one node at a time.
* :class:`CoupledCausalModel`: the OctAttention-style baseline with the **same** embedding, convolution and
  transformer blocks, but causal, and the previous symbol enters the backbone itself; autoregressive decoding
  must re-run the backbone for every node (``cache=False``, as OctAttention does) or keep a KV cache
  (``cache=True``, shown for honesty).
* :class:`TwoGroupModel`: the EHEM-style grouped context, the same non-causal backbone run twice per window
  (group 2 given group 1's symbols), the lineage's step before PACE.
* :class:`AncestorMLP`: OctSqueeze-style MLP on the ancestors' context only (fully parallel).
* :class:`CountTable`: no network; empirical symbol counts per (parent symbol, octant) context (G-PCC-lite).

Training (:func:`train`, on :func:`repro.common.train.fit`) is teacher-forced cross-entropy. The paper's training
code is not released; to make one PACE checkpoint serve every ``k`` we sample ``k`` per batch and apply exactly the
decoder's stage masks (an assumption, stated in the notebook).

Every model exposes ``session(tokens, xyz, mode)``, the object the codec drives: ``steps`` (which nodes each
decoding step produces), ``scores(step, known)`` (the model's logits for those nodes, given the symbols decoded so
far) and ``pmf(step, known)`` (their float64 pmfs, :func:`probabilities`). The encoder and decoder make the same
calls, so both compute bit-identical pmfs; ``matmul_flops(m, mode)`` counts a session's matrix products (the work a
roofline reads against the machine's peak; :func:`decode_flops` sums it over a tree's levels).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...common.train import cosine_schedule, fit
from .octree import CTX_COLUMNS, MAX_DEPTH, N_SYMBOLS, PAD_OCTANT, PAD_SYMBOL

__all__ = [
    "AncestorMLP", "CountTable", "CoupledCausalModel", "PACEModel", "TwoGroupModel", "WindowData", "cross_entropy_bits",
    "pooled_rate", "stage_prev", "train", "window_bits",
]

Tensor = torch.Tensor
AR = "ar"


# ----------------------------------------------------------------------------------------------- windows


def n_windows(m: int, window: int) -> int:
    return max(1, -(-m // window))


def to_windows(x: Tensor, window: int, pad_value: float | int = 0) -> Tensor:
    """(M, ...) -> (B, W, ...) with B = ceil(M / W), the tail padded with ``pad_value``."""
    m = x.shape[0]
    b = n_windows(m, window)
    out = x.new_full((b * window, *x.shape[1:]), pad_value)
    out[:m] = x
    return out.reshape(b, window, *x.shape[1:])


def phases(window: int, k: int, device: torch.device | str | None = None) -> Tensor:
    """Phase ``(i mod W) mod k`` of the window positions (the stage that decodes each position)."""
    return torch.arange(window, device=device) % k


def stage_prev(sym: Tensor, k: int, r: int) -> Tensor:
    """Predictor input symbols at stage ``r`` of ``k``: position ``j`` carries ``sym[j−1]`` if ``j−1`` has phase
    ``< r`` (decoded in an earlier stage), else the pad symbol; position 0 always the pad. ``sym``: (B, W)."""
    if not 0 <= r < k:
        raise ValueError(f"stage r={r} outside 0..{k - 1}")
    prev = torch.full_like(sym, PAD_SYMBOL)
    known = phases(sym.shape[1], k, sym.device)[:-1] < r
    prev[:, 1:] = torch.where(known[None], sym[:, :-1], prev[:, 1:])
    return prev


def shift_prev(sym: Tensor) -> Tensor:
    """Teacher-forced autoregressive input: ``sym`` shifted right by one, pad first."""
    prev = torch.full_like(sym, PAD_SYMBOL)
    prev[:, 1:] = sym[:, :-1]
    return prev


def parse_mode(mode: str, window: int) -> int:
    """``"fp"`` -> 1, ``"<k>s"`` -> k stages (1 <= k <= W), ``"ar"`` -> 0 (the recurrent step path)."""
    if mode == "fp":
        return 1
    if mode == AR:
        return 0
    if isinstance(mode, str) and mode.endswith("s") and mode[:-1].isdigit():
        k = int(mode[:-1])
        if 1 <= k <= window:
            return k
    raise ValueError(f"unknown mode {mode!r}; use 'fp', '<k>s' with 1 <= k <= {window}, or 'ar'")


# ----------------------------------------------------------------------------------------------- layers


class ContextEmbedding(nn.Module):
    """Embed the node context: ancestors' occupancy symbols (a shared 256-row table, row 255 = 0), octants (9 rows),
    level, plus a linear map of the cell centre; LayerNorm. Output width ``d``."""

    def __init__(self, d: int, e_occ: int = 16, e_small: int = 8, max_level: int = MAX_DEPTH):
        super().__init__()
        self.occ = nn.Embedding(256, e_occ, padding_idx=PAD_SYMBOL)
        self.octant = nn.Embedding(PAD_OCTANT + 1, e_small)
        self.level = nn.Embedding(max_level + 1, e_small)
        self.proj = nn.Linear(3 * e_occ + 4 * e_small, d)
        self.pos = nn.Linear(3, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, tokens: Tensor, xyz: Tensor) -> Tensor:
        if tokens.shape[-1] != len(CTX_COLUMNS):
            raise ValueError(f"tokens must have {len(CTX_COLUMNS)} columns {CTX_COLUMNS}")
        parts = [self.occ(tokens[..., :3]).flatten(-2), self.octant(tokens[..., 3:6]).flatten(-2),
                 self.level(tokens[..., 6])]
        return self.norm(self.proj(torch.cat(parts, -1)) + self.pos(xyz))


class ConvBlock(nn.Module):
    """Residual 1-D convolution along the Morton sequence (the role of PACE's IRN block): LN, pointwise,
    depthwise (kernel ``kernel``; causal if asked), GELU, pointwise."""

    def __init__(self, d: int, kernel: int = 5, causal: bool = False):
        super().__init__()
        self.kernel, self.causal = kernel, causal
        self.norm = nn.LayerNorm(d)
        self.pw1 = nn.Linear(d, d)
        self.dw = nn.Conv1d(d, d, kernel, groups=d)
        self.pw2 = nn.Linear(d, d)

    def forward(self, x: Tensor) -> Tensor:
        z = self.pw1(self.norm(x)).transpose(1, 2)  # (B, d, W)
        left = self.kernel - 1 if self.causal else (self.kernel - 1) // 2
        z = self.dw(F.pad(z, (left, self.kernel - 1 - left)))
        return x + self.pw2(F.gelu(z.transpose(1, 2)))

    def step(self, x_t: Tensor, buf: list[Tensor]) -> Tensor:
        """Causal single-position update; ``buf`` holds the last ``kernel − 1`` pointwise outputs."""
        if not self.causal:
            raise ValueError("step() needs a causal convolution")
        z = self.pw1(self.norm(x_t))
        if not buf:
            buf.extend(torch.zeros_like(z) for _ in range(self.kernel - 1))
        stack = torch.stack([*buf, z], -1)  # (B, d, kernel), oldest first
        buf.append(z)
        del buf[0]
        out = (stack * self.dw.weight[:, 0][None]).sum(-1) + self.dw.bias
        return x_t + self.pw2(F.gelu(out))


class Block(nn.Module):
    """Pre-norm transformer block: multi-head self-attention and a SwiGLU feed-forward layer."""

    def __init__(self, d: int, heads: int, ffn: int):
        super().__init__()
        if d % heads:
            raise ValueError(f"d={d} must be divisible by heads={heads}")
        self.heads = heads
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.w13 = nn.Linear(d, 2 * ffn)
        self.w2 = nn.Linear(ffn, d)

    def _split(self, t: Tensor) -> Tensor:
        b, n, d = t.shape
        return t.reshape(b, n, self.heads, d // self.heads).transpose(1, 2)

    def _ffn(self, x: Tensor) -> Tensor:
        a, g = self.w13(self.n2(x)).chunk(2, -1)
        return x + self.w2(F.silu(a) * g)

    def forward(self, x: Tensor, mask: Tensor | None = None, causal: bool = False) -> Tensor:
        q, k, v = (self._split(t) for t in self.qkv(self.n1(x)).chunk(3, -1))
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        x = x + self.out(att.transpose(1, 2).reshape(x.shape))
        return self._ffn(x)

    def step(self, x_t: Tensor, cache: dict[str, Tensor]) -> Tensor:
        """One new position attending to all cached ones (KV cache)."""
        q, k, v = (self._split(t[:, None]) for t in self.qkv(self.n1(x_t)).chunk(3, -1))
        cache["k"] = k if "k" not in cache else torch.cat([cache["k"], k], 2)
        cache["v"] = v if "v" not in cache else torch.cat([cache["v"], v], 2)
        att = F.scaled_dot_product_attention(q, cache["k"], cache["v"])
        x_t = x_t + self.out(att.transpose(1, 2).reshape(x_t.shape))
        return self._ffn(x_t)


def _head(d: int) -> nn.Sequential:
    return nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU(), nn.Linear(d, N_SYMBOLS))


class SSMPredictor(nn.Module):
    """PACE's causal predictor: ``x_i = F_i + E(o_{i−1})``, a diagonal linear recurrence
    ``h_i = a ⊙ h_{i−1} + (1 − a) ⊙ W_u x_i`` (decays ``a ∈ (0, 1)`` learned, initialised on time scales 1.5..W/4),
    ``y_i = x_i + W_o (h_i ⊙ silu(W_g x_i))`` and an MLP to 255 logits. :meth:`forward` evaluates all positions at
    once (``h`` is the causal convolution of ``W_u x`` with the impulse response ``a^τ (1 − a)``, by FFT);
    :meth:`step` is the recurrence, one position at a time."""

    def __init__(self, d: int, window: int, n_state: int | None = None):
        super().__init__()
        n = n_state or d
        self.occ = nn.Embedding(256, d, padding_idx=PAD_SYMBOL)
        self.u = nn.Linear(d, n)
        self.g = nn.Linear(d, n)
        self.o = nn.Linear(n, d)
        tau = torch.logspace(math.log10(1.5), math.log10(max(2.0, window / 4)), n)
        self.decay_logit = nn.Parameter(torch.log(tau - 1))  # a = sigmoid(logit) = 1 − 1/tau
        self.head = _head(d)

    def decay(self) -> Tensor:
        return torch.sigmoid(self.decay_logit)

    def kernel(self, length: int) -> Tensor:
        """(length, n) impulse response ``a^τ (1 − a)``, τ = 0..length−1, of the recurrence."""
        a = self.decay()
        lag = torch.arange(length, device=a.device, dtype=a.dtype)
        return torch.exp(lag[:, None] * torch.log(a)[None]) * (1 - a)

    def spectrum(self, length: int, kernel: Tensor | None = None) -> Tensor:
        """(length + 1, n) complex: the zero-padded FFT (size ``2·length``) of the impulse response, the factor
        :meth:`features` multiplies by; it depends on the weights only, so a decoder computes it once."""
        k = self.kernel(length) if kernel is None else kernel
        return torch.fft.rfft(k, n=2 * length, dim=0)

    def forward(self, feats: Tensor, prev: Tensor, kernel: Tensor | None = None) -> Tensor:
        return self.head(self.features(feats, prev, kernel))

    def features(self, feats: Tensor, prev: Tensor, kernel: Tensor | None = None, *,
                 spectrum: Tensor | None = None) -> Tensor:
        """The read-out ``y`` before the MLP head, for all positions at once (``spectrum``: :meth:`spectrum`
        of this length, precomputed; else it is computed from ``kernel``)."""
        x = feats + self.occ(prev)
        length = x.shape[1]
        ks = self.spectrum(length, kernel) if spectrum is None else spectrum
        # h = causal convolution of W_u x with the kernel, through a zero-padded FFT (O(W log W), exact up to
        # rounding; the codec never mixes this path with :meth:`step` within one mode)
        u = torch.fft.rfft(self.u(x), n=2 * length, dim=1)
        h = torch.fft.irfft(u * ks[None], n=2 * length, dim=1)[:, :length]
        return x + self.o(h * F.silu(self.g(x)))

    def step(self, feat_t: Tensor, prev_t: Tensor, h: Tensor | None) -> tuple[Tensor, Tensor]:
        x = feat_t + self.occ(prev_t)
        a = self.decay()
        u = self.u(x)
        h = (1 - a) * u if h is None else a * h + (1 - a) * u
        return self.head(x + self.o(h * F.silu(self.g(x)))), h


# ----------------------------------------------------------------------------------------------- models


def _linear_flops(rows: int, *layers: nn.Linear) -> int:
    """``2 · rows · in · out`` summed over ``layers``: multiply-adds of the layers on ``rows`` inputs, times 2."""
    return 2 * rows * sum(x.in_features * x.out_features for x in layers)


def decode_flops(model: Any, level_sizes: Sequence[int], mode: str) -> int:
    """FLOPs of the matrix products that coding (or decoding: the same calls) a tree with ``level_sizes`` nodes on
    its coded levels ``1..L−1`` runs with ``model`` in ``mode`` (the models' ``matmul_flops`` per level)."""
    return int(sum(model.matmul_flops(int(m), mode) for m in level_sizes))


_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: Tensor) -> Tensor:
    """``t`` seen as integers of its element size (floats compared as bit patterns: −0.0 ≠ 0.0, NaN = same NaN)."""
    t = torch.view_as_real(t) if t.is_complex() else t
    return t.view(_INT[t.element_size()]) if t.is_floating_point() else t


def _same_bits(saved: list[tuple[str, Tensor]], state: list[tuple[str, Tensor]]) -> bool:
    """Whether two sorted state lists hold the same names and tensors of the same dtype, shape, device and bits."""
    return len(saved) == len(state) and all(
        n == m and (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device) and torch.equal(_bits(a), _bits(b))
        for (n, a), (m, b) in zip(saved, state, strict=True))


class _Learned(nn.Module):
    kind = "learned"
    modes: tuple[str, ...] = ()
    config: dict[str, int]  # the constructor's arguments that shape the computation (part of the fingerprint)

    def fingerprint(self) -> bytes:
        """8 bytes identifying the model: its kind, configuration (``self.config``: widths, heads, window, ...),
        parameter dtype and weights. A stream carries it; decoding with a model that differs in any of them (the
        same weights in another window or head count computes other pmfs) is refused by the header.

        The digest (SHA-256 of the weights widened to float64: about 2 ms for the notebook's model) is cached with
        a copy of the state it was computed from; a call whose state is bit for bit the same (compared byte-wise,
        so a 0.0 that became −0.0 counts as a change) and whose configuration and dtype are the same returns it."""
        state = sorted(self.state_dict().items())
        key = (self.kind, json.dumps(self.config, sort_keys=True), str(self.dtype))
        cached = self.__dict__.get("_fingerprint_cache")
        if cached is not None and cached[0] == key and _same_bits(cached[1], state):
            return cached[2]
        h = hashlib.sha256(self.kind.encode())
        h.update(json.dumps(self.config, sort_keys=True).encode())
        h.update(str(self.dtype).encode())
        for name, t in state:
            h.update(name.encode())
            h.update(t.detach().cpu().to(torch.float64).contiguous().numpy().tobytes())
        digest = h.digest()[:8]
        self.__dict__["_fingerprint_cache"] = (key, [(n, t.detach().clone()) for n, t in state], digest)
        return digest

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def _inputs(self, tokens: np.ndarray, xyz: np.ndarray) -> tuple[Tensor, Tensor]:
        t = torch.as_tensor(tokens, dtype=torch.long, device=self.device)
        x = torch.as_tensor(xyz, device=self.device).to(self.dtype)
        return t, x


class PACEModel(_Learned):
    """PACE: non-causal backbone once per window + stage-scalable causal predictor (see the module docstring)."""

    kind = "pace"

    def __init__(self, d: int = 64, n_layers: int = 2, n_heads: int = 4, window: int = 256, conv_kernel: int = 5,
                 chunk: int = 64):
        super().__init__()
        self.window, self.chunk = window, chunk
        self.config = dict(d=d, n_layers=n_layers, n_heads=n_heads, window=window, conv_kernel=conv_kernel)
        self.embed = ContextEmbedding(d)
        self.conv = ConvBlock(d, conv_kernel, causal=False)
        self.blocks = nn.ModuleList(Block(d, n_heads, 8 * d // 3) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d)
        self.predictor = SSMPredictor(d, window)

    def backbone(self, tokens: Tensor, xyz: Tensor, valid: Tensor, chunk: int | None = None) -> Tensor:
        """Window features (B, W, d) from contexts (B, W, 7) / (B, W, 3); ``valid`` (B, W) masks the tail padding.
        Non-causal: every node sees its whole window. Evaluated in chunks of ``chunk`` windows (default
        ``self.chunk``; the same result per window, bit for bit on CPU: ``tests/papers/test_pace_model.py``)."""
        chunk = chunk or self.chunk
        outs = []
        for s in range(0, tokens.shape[0], chunk):
            t, x, v = tokens[s:s + chunk], xyz[s:s + chunk], valid[s:s + chunk]
            full = bool(v.all())  # then the masks are skipped: x · 1 = x, bit for bit
            h = self.embed(t, x) if full else self.embed(t, x) * v[..., None]
            h = self.conv(h) if full else self.conv(h) * v[..., None]
            mask = None if full else v[:, None, None, :]  # the unmasked kernel when nothing is padded
            for blk in self.blocks:
                h = blk(h, mask=mask)
            outs.append(self.norm(h))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def predict_stages(self, feats: Tensor, sym: Tensor, k: int) -> Tensor:
        """Teacher-forced logits (B, W, 255) of ``k``-stage decoding: node ``i`` gets the output of the pass of its
        own stage ``r = phase(i)``, whose input holds exactly the symbols of phases ``< r``. ``k >= W`` is the
        autoregressive case, computed in one causal pass (identical by causality)."""
        if k < 1:
            raise ValueError("k must be >= 1")
        kern = self.predictor.kernel(feats.shape[1])
        if k >= feats.shape[1]:
            return self.predictor(feats, shift_prev(sym), kern)
        ph = phases(feats.shape[1], k, feats.device)
        y = None
        for r in range(k):  # one recurrence pass per stage; the MLP head once, on each node's own stage
            y_r = self.predictor.features(feats, stage_prev(sym, k, r), kern)
            y = y_r if y is None else torch.where((ph == r)[None, :, None], y_r, y)
        return self.predictor.head(y)

    def forward(self, tokens: Tensor, xyz: Tensor, valid: Tensor, sym: Tensor, k: int) -> Tensor:
        return self.predict_stages(self.backbone(tokens, xyz, valid), sym, k)

    def session(self, tokens: np.ndarray, xyz: np.ndarray, mode: str) -> _Session:
        k = parse_mode(mode, self.window)
        return _PaceAR(self, tokens, xyz) if k == 0 else _PaceStages(self, tokens, xyz, k)

    def matmul_flops(self, m: int, mode: str) -> int:
        """FLOPs of the matrix products that coding a level of ``m`` nodes in ``mode`` runs (the session's work):
        every linear layer on every window position (``B = ceil(m / W)`` windows, padding included), attention's
        two products ``4·B·W²·d`` per block, the depthwise convolution; the predictor once per stage (``k`` stages)
        or once per position (``ar``, the step path); the head on the ``m`` nodes (``ar``: on every window at every
        step). Norms, activations, the FFT and the softmax are not counted."""
        k = parse_mode(mode, self.window)
        w = self.window
        b = n_windows(m, w)
        pos = b * w
        flops = _linear_flops(pos, self.embed.proj, self.embed.pos, self.conv.pw1, self.conv.pw2)
        flops += 2 * pos * self.conv.dw.weight.numel()
        for blk in self.blocks:
            flops += _linear_flops(pos, blk.qkv, blk.out, blk.w13, blk.w2) + 4 * b * w * w * blk.qkv.in_features
        pr = self.predictor
        head = (pr.head[1], pr.head[3])
        if k == 0:
            return flops + _linear_flops(b * min(w, m), pr.u, pr.g, pr.o, *head)
        return flops + k * _linear_flops(pos, pr.u, pr.g, pr.o) + _linear_flops(m, *head)

    @property
    def modes(self) -> tuple[str, ...]:
        return ("fp", "2s", "4s", "8s", AR)


class CoupledCausalModel(_Learned):
    """OctAttention-style coupled model: the previous symbol enters the (causal) backbone, so autoregressive
    decoding re-runs the backbone per node (``"ar"``) or updates a KV cache (``"ar-kv"``). Same embedding,
    convolution (causal) and blocks as :class:`PACEModel`."""

    kind = "coupled"

    def __init__(self, d: int = 64, n_layers: int = 2, n_heads: int = 4, window: int = 256, conv_kernel: int = 5):
        super().__init__()
        self.window = window
        self.config = dict(d=d, n_layers=n_layers, n_heads=n_heads, window=window, conv_kernel=conv_kernel)
        self.embed = ContextEmbedding(d)
        self.occ = nn.Embedding(256, d, padding_idx=PAD_SYMBOL)
        self.conv = ConvBlock(d, conv_kernel, causal=True)
        self.blocks = nn.ModuleList(Block(d, n_heads, 8 * d // 3) for _ in range(n_layers))
        self.head = _head(d)

    def run(self, static: Tensor, prev: Tensor) -> Tensor:
        """Logits of every position of (prefixes of) windows: ``static`` = context embedding (B, n, d)."""
        h = self.conv(static + self.occ(prev))
        for blk in self.blocks:
            h = blk(h, causal=True)
        return self.head(h)

    def forward(self, tokens: Tensor, xyz: Tensor, valid: Tensor, sym: Tensor, k: int | None = None) -> Tensor:
        return self.run(self.embed(tokens, xyz), shift_prev(sym))

    def session(self, tokens: np.ndarray, xyz: np.ndarray, mode: str) -> _Session:
        if mode not in self.modes:
            raise ValueError(f"unknown mode {mode!r} for the coupled model; use one of {self.modes}")
        return _CoupledAR(self, tokens, xyz, cache=mode == "ar-kv")

    @property
    def modes(self) -> tuple[str, ...]:
        return (AR, "ar-kv")


class TwoGroupModel(_Learned):
    """EHEM-style grouped context (the step of the lineage before PACE): the nodes of a window are split into two
    groups by phase, ``(i mod W) mod 2``; the same non-causal backbone as :class:`PACEModel` (embedding,
    convolution, unmasked blocks) runs once for group 1 on the contexts alone, and once more for group 2 with group
    1's symbols embedded into its input. Two backbone passes per window, where PACE runs one and moves the
    remaining causality into its light predictor. Mode ``"2g"``."""

    kind = "two-group"

    def __init__(self, d: int = 64, n_layers: int = 2, n_heads: int = 4, window: int = 256, conv_kernel: int = 5,
                 chunk: int = 64):
        super().__init__()
        self.window, self.chunk = window, chunk
        self.config = dict(d=d, n_layers=n_layers, n_heads=n_heads, window=window, conv_kernel=conv_kernel)
        self.embed = ContextEmbedding(d)
        self.occ = nn.Embedding(256, d, padding_idx=PAD_SYMBOL)
        self.conv = ConvBlock(d, conv_kernel, causal=False)
        self.blocks = nn.ModuleList(Block(d, n_heads, 8 * d // 3) for _ in range(n_layers))
        self.head = _head(d)

    def run(self, tokens: Tensor, xyz: Tensor, valid: Tensor, known: Tensor) -> Tensor:
        """Logits (B, W, 255) of one backbone pass; ``known`` (B, W) holds the symbols the pass may see (the pad
        symbol, which embeds to 0, elsewhere). Evaluated in chunks of windows (same result per window)."""
        outs = []
        for s in range(0, tokens.shape[0], self.chunk):
            t, x, v, o = (a[s:s + self.chunk] for a in (tokens, xyz, valid, known))
            h = (self.embed(t, x) + self.occ(o)) * v[..., None]
            h = self.conv(h) * v[..., None]
            mask = None if bool(v.all()) else v[:, None, None, :]
            for blk in self.blocks:
                h = blk(h, mask=mask)
            outs.append(self.head(h))
        return torch.cat(outs)

    def forward(self, tokens: Tensor, xyz: Tensor, valid: Tensor, sym: Tensor, k: int | None = None) -> Tensor:
        """Teacher-forced logits: group 1 from the pass without symbols, group 2 from the pass given group 1."""
        first = self.run(tokens, xyz, valid, stage_prev(sym, 2, 0))
        second = self.run(tokens, xyz, valid, stage_prev(sym, 2, 1))
        return torch.where((phases(sym.shape[1], 2, sym.device) == 1)[None, :, None], second, first)

    def session(self, tokens: np.ndarray, xyz: np.ndarray, mode: str) -> _Session:
        if mode not in self.modes:
            raise ValueError(f"unknown mode {mode!r} for the two-group model; use one of {self.modes}")
        return _TwoGroups(self, tokens, xyz)

    @property
    def modes(self) -> tuple[str, ...]:
        return ("2g",)


class AncestorMLP(_Learned):
    """OctSqueeze-style: an MLP on the node's own ancestor context, every node independent (fully parallel)."""

    kind = "mlp"

    def __init__(self, d: int = 64, hidden: int = 128, window: int = 256):
        super().__init__()
        self.window = window
        self.config = dict(d=d, hidden=hidden, window=window)
        self.embed = ContextEmbedding(d)
        self.mlp = nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, N_SYMBOLS))

    def forward(self, tokens: Tensor, xyz: Tensor, valid: Tensor | None = None, sym: Tensor | None = None,
                k: int | None = None) -> Tensor:
        return self.mlp(self.embed(tokens, xyz))

    def session(self, tokens: np.ndarray, xyz: np.ndarray, mode: str) -> _Session:
        if mode != "fp":
            raise ValueError(f"the ancestor MLP only has mode 'fp', got {mode!r}")
        return _OneShot(lambda: self(*self._inputs(tokens, xyz)), len(tokens))

    def matmul_flops(self, m: int, mode: str = "fp") -> int:
        """FLOPs of the matrix products that coding a level of ``m`` nodes runs: the embedding's two linear maps
        and the MLP's three layers, once per node."""
        return _linear_flops(m, self.embed.proj, self.embed.pos, *(x for x in self.mlp if isinstance(x, nn.Linear)))

    modes = ("fp",)


class CountTable:
    """A static context model without a network: counts of symbols per (parent symbol, octant) context,
    estimated on training octrees with add-``alpha`` smoothing (``alpha = 0.5``: the Krichevsky–Trofimov rule)."""

    kind = "table"
    modes = ("fp",)

    def __init__(self, alpha: float = 0.5):
        if alpha <= 0:
            raise ValueError("alpha must be positive")
        self.alpha = alpha
        self.counts = np.zeros((256 * 9, N_SYMBOLS), dtype=np.int64)

    @staticmethod
    def context_id(tokens: np.ndarray) -> np.ndarray:
        return np.asarray(tokens[:, 0], dtype=np.int64) * 9 + np.asarray(tokens[:, 3], dtype=np.int64)

    def fit(self, data: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> CountTable:
        """Accumulate counts from ``(tokens, xyz, symbols)`` triples (e.g. :func:`octree_contexts`)."""
        for tokens, _, sym in data:
            np.add.at(self.counts, (self.context_id(tokens), np.asarray(sym, dtype=np.int64)), 1)
        return self

    def probs(self, tokens: np.ndarray) -> np.ndarray:
        c = self.counts[self.context_id(tokens)] + self.alpha
        return c / c.sum(1, keepdims=True)

    def fingerprint(self) -> bytes:
        h = hashlib.sha256(b"table")
        h.update(np.float64(self.alpha).tobytes())
        h.update(self.counts.tobytes())
        return h.digest()[:8]

    def matmul_flops(self, m: int, mode: str = "fp") -> int:
        """No network: no matrix products (its work is one table look-up per node)."""
        return 0

    def session(self, tokens: np.ndarray, xyz: np.ndarray, mode: str) -> _Session:
        if mode != "fp":
            raise ValueError(f"the count table only has mode 'fp', got {mode!r}")
        return _OneShot(lambda: torch.from_numpy(self.probs(tokens)), len(tokens), is_logits=False)


# ----------------------------------------------------------------------------------------------- sessions

STAGE_CHUNK = 4
"""Windows per backbone pass in the staged sessions (``fp``, ``<k>s``): a level's temporaries then stay near a
thousand rows, which the allocator reuses, where whole-level passes fault in fresh pages every level (measured: the
depth-9 backbone 45 → 39 ms, one thread). The per-window result is the same bit for bit (:meth:`PACEModel.backbone`;
the training path keeps ``model.chunk``)."""


def probabilities(scores: Tensor, is_logits: bool = True) -> Tensor:
    """The pmfs the codec quantises, float64 on the CPU: the softmax of ``scores`` (logits of any dtype and device,
    moved to the CPU and widened first, so the float64 softmax is always the CPU's), or ``scores`` as they are
    (widened) where ``is_logits`` is False (the count table's probabilities)."""
    if not is_logits:
        return scores.to(torch.float64)
    return torch.softmax(scores.detach().cpu().to(torch.float64), -1)


class _Session:
    """Decoding plan of one level: ``steps[j]`` = flat node indices produced at step ``j`` (ascending);
    ``scores(j, known)`` = the model's output rows for those nodes, in that order (logits; probabilities where
    ``is_logits`` is False), given ``known`` (M,) int64 symbols, :data:`PAD_SYMBOL` where not yet decoded;
    ``pmf(j, known)`` = their float64 pmfs (:func:`probabilities`)."""

    steps: list[np.ndarray]
    is_logits = True

    def scores(self, j: int, known: np.ndarray) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def pmf(self, j: int, known: np.ndarray) -> np.ndarray:
        return probabilities(self.scores(j, known), self.is_logits).numpy()


class _OneShot(_Session):
    def __init__(self, fn: Callable[[], Tensor], m: int, is_logits: bool = True):
        self.fn, self.is_logits = fn, is_logits
        self.steps = [np.arange(m)]

    @torch.inference_mode()
    def scores(self, j: int, known: np.ndarray) -> Tensor:
        return self.fn()


class _Windowed(_Session):
    def __init__(self, model: _Learned, tokens: np.ndarray, xyz: np.ndarray):
        self.model, self.m, self.w = model, len(tokens), model.window
        t, x = model._inputs(tokens, xyz)
        self.tokens = to_windows(t, self.w, 0)
        self.xyz = to_windows(x, self.w, 0.0)
        self.valid = to_windows(torch.ones(self.m, dtype=torch.bool, device=model.device), self.w, False)

    def known_windows(self, known: np.ndarray) -> Tensor:
        k = torch.as_tensor(np.asarray(known, dtype=np.int64), device=self.model.device)
        return to_windows(k, self.w, PAD_SYMBOL)

    def position_steps(self) -> list[np.ndarray]:
        flat = np.arange(self.m)
        return [flat[flat % self.w == t] for t in range(min(self.w, self.m))]


class _PaceStages(_Windowed):
    @torch.inference_mode()
    def __init__(self, model: PACEModel, tokens: np.ndarray, xyz: np.ndarray, k: int):
        super().__init__(model, tokens, xyz)
        self.k = k
        self.feats = model.backbone(self.tokens, self.xyz, self.valid, chunk=min(model.chunk, STAGE_CHUNK))
        self.spectrum = model.predictor.spectrum(self.w)  # the weights' factor, once per level, not once per stage
        flat = np.arange(self.m)
        self.steps = [s for s in (flat[(flat % self.w) % k == r] for r in range(k))]

    @torch.inference_mode()
    def scores(self, j: int, known: np.ndarray) -> Tensor:
        prev = stage_prev(self.known_windows(known), self.k, j)
        y = self.model.predictor.features(self.feats, prev, spectrum=self.spectrum)
        y = y.reshape(-1, y.shape[-1])
        # fully parallel: the step is every node, the first m rows (a view); else the step's rows (a gather)
        rows = y[: self.m] if self.k == 1 else y[torch.as_tensor(self.steps[j], device=y.device)]
        return self.model.predictor.head(rows)


class _PaceAR(_Windowed):
    @torch.inference_mode()
    def __init__(self, model: PACEModel, tokens: np.ndarray, xyz: np.ndarray):
        super().__init__(model, tokens, xyz)
        self.feats = model.backbone(self.tokens, self.xyz, self.valid)
        self.steps = self.position_steps()
        self.h: Tensor | None = None
        self.known_t = np.full(self.feats.shape[0], PAD_SYMBOL, dtype=np.int64)

    @torch.inference_mode()
    def scores(self, j: int, known: np.ndarray) -> Tensor:
        if j > 0:  # the previous position of every window that has one
            self.known_t[: len(self.steps[j - 1])] = known[self.steps[j - 1]]
        prev = torch.as_tensor(self.known_t, device=self.model.device)
        logits, self.h = self.model.predictor.step(self.feats[:, j], prev, self.h)
        return logits[: len(self.steps[j])]


class _TwoGroups(_Windowed):
    @torch.inference_mode()
    def __init__(self, model: TwoGroupModel, tokens: np.ndarray, xyz: np.ndarray):
        super().__init__(model, tokens, xyz)
        flat = np.arange(self.m)
        self.steps = [flat[(flat % self.w) % 2 == r] for r in range(2)]

    @torch.inference_mode()
    def scores(self, j: int, known: np.ndarray) -> Tensor:
        logits = self.model.run(self.tokens, self.xyz, self.valid, stage_prev(self.known_windows(known), 2, j))
        return logits.reshape(-1, logits.shape[-1])[torch.as_tensor(self.steps[j], device=logits.device)]


class _CoupledAR(_Windowed):
    @torch.inference_mode()
    def __init__(self, model: CoupledCausalModel, tokens: np.ndarray, xyz: np.ndarray, cache: bool):
        super().__init__(model, tokens, xyz)
        self.cache = cache
        self.static = model.embed(self.tokens, self.xyz)  # per-node context embedding: no causal dependence
        self.steps = self.position_steps()
        self.prev = torch.full(self.static.shape[:2], PAD_SYMBOL, dtype=torch.long, device=model.device)
        self.caches: list[dict[str, Tensor]] = [{} for _ in model.blocks]
        self.conv_buf: list[Tensor] = []

    @torch.inference_mode()
    def scores(self, j: int, known: np.ndarray) -> Tensor:
        model: CoupledCausalModel = self.model
        n = len(self.steps[j])
        if j > 0:
            self.prev[: len(self.steps[j - 1]), j] = torch.as_tensor(known[self.steps[j - 1]], device=self.prev.device)
        if not self.cache:  # re-run the whole causal backbone on the window prefix, as OctAttention does
            return model.run(self.static[:, : j + 1], self.prev[:, : j + 1])[:n, j]
        h = model.conv.step(self.static[:, j] + model.occ(self.prev[:, j]), self.conv_buf)
        for blk, cache in zip(model.blocks, self.caches, strict=True):
            h = blk.step(h, cache)
        return model.head(h)[:n]


# ----------------------------------------------------------------------------------------------- training


@dataclass
class WindowData:
    """Training windows: ``tokens`` (N, W, 7), ``xyz`` (N, W, 3), ``sym`` (N, W), ``valid`` (N, W)."""

    tokens: Tensor
    xyz: Tensor
    sym: Tensor
    valid: Tensor

    @classmethod
    def from_levels(cls, levels: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], window: int) -> WindowData:
        """Cut every level's ``(tokens, xyz, symbols)`` into windows (padding each level's tail)."""
        parts: list[list[Tensor]] = [[], [], [], []]
        for tokens, xyz, sym in levels:
            t = torch.as_tensor(tokens, dtype=torch.long)
            parts[0].append(to_windows(t, window, 0))
            parts[1].append(to_windows(torch.as_tensor(xyz, dtype=torch.float32), window, 0.0))
            parts[2].append(to_windows(torch.as_tensor(sym, dtype=torch.long), window, PAD_SYMBOL))
            parts[3].append(to_windows(torch.ones(len(t), dtype=torch.bool), window, False))
        return cls(*(torch.cat(p) for p in parts))

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def to(self, device: torch.device | str) -> WindowData:
        return WindowData(self.tokens.to(device), self.xyz.to(device), self.sym.to(device), self.valid.to(device))


def window_bits(model: nn.Module, data: WindowData, k: int, batch: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Teacher-forced code length of each window of ``data`` under ``model`` with ``k`` stages: (bits per window,
    coded symbols per window), both (N,) float64; the items a bootstrap over windows resamples."""
    bits, count = [], []
    with torch.no_grad():
        for s in range(0, len(data), batch):
            t, x, y, v = (a[s:s + batch] for a in (data.tokens, data.xyz, data.sym, data.valid))
            logits = model(t, x.to(model.dtype), v, y, k).double()
            nll = F.cross_entropy(logits.transpose(1, 2), y.clamp(max=logits.shape[-1] - 1), reduction="none")
            bits.append((nll * v).sum(1).cpu().numpy() / math.log(2))
            count.append(v.sum(1).cpu().numpy().astype(np.float64))
    return np.concatenate(bits), np.concatenate(count)


def cross_entropy_bits(model: nn.Module, data: WindowData, k: int, batch: int = 64) -> float:
    """Mean teacher-forced code length (bits per symbol) of ``model`` on ``data`` with ``k`` stages."""
    return pooled_rate(*window_bits(model, data, k, batch))


def pooled_rate(bits: np.ndarray, symbols: np.ndarray) -> float:
    """Bits per symbol of a set of windows, ``sum(bits) / sum(symbols)`` (the bootstrap statistic of
    :func:`window_bits`' items: a resample of windows is coded at this rate)."""
    return float(np.sum(bits) / max(float(np.sum(symbols)), 1.0))


def train(model: nn.Module, data: WindowData, *, steps: int, batch: int = 16, lr: float = 2e-3,
          ks: Sequence[int] = (1,), seed: int = 0, log_every: int = 0) -> list[float]:
    """Teacher-forced cross-entropy training (:func:`repro.common.train.fit`): AdamW (weight decay 0.01), a 20-step
    warm-up times a cosine over all steps (``cosine_schedule(i, steps, 20, overlap=True)``), gradients clipped to
    norm 1; for PACE a stage count ``k`` is drawn from ``ks`` for every batch (one checkpoint for all ``k``).
    Returns the loss (bits/symbol) per step."""
    if steps < 1 or batch < 1 or not ks:
        raise ValueError("need steps >= 1, batch >= 1 and at least one k")
    gen = torch.Generator().manual_seed(seed)
    dev = next(model.parameters()).device

    def step_loss(_: int) -> Tensor:
        idx = torch.randint(len(data), (batch,), generator=gen)
        k = int(ks[int(torch.randint(len(ks), (1,), generator=gen))])
        t, x, y, v = (a[idx].to(dev) for a in (data.tokens, data.xyz, data.sym, data.valid))
        logits = model(t, x, v, y, k)
        return F.cross_entropy(logits[v], y[v]) / math.log(2)

    return fit(model, step_loss, steps, lr=lr, optimizer="adamw", weight_decay=0.01,
               schedule=lambda i: cosine_schedule(i, steps, 20, overlap=True), clip=1.0, log_every=log_every,
               unit="bits/symbol")
