"""Closed-form parameter editors (ROME, MEMIT, AlphaEdit), v* optimisation, relative change rates R_k and a
retrieval editor (the SCR analogue) for paper 06.

Conventions: a linear layer ``y = W k + b`` with ``W`` of shape ``(d_out, d_in)`` (torch's ``nn.Linear.weight``);
keys are the rows of ``K`` (``(n, d_in)``) and targets the rows of ``V`` (``(n, d_out)``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from repro.common.hooks import capture, hooked

__all__ = [
    "CachedEmbedder", "RetrievalEditor", "VStarProblem", "alphaedit_projector", "alphaedit_update", "effective_rank",
    "key_covariance", "mean_key", "memit_update", "optimize_v_star", "optimize_v_stars", "relative_change_rates",
    "rome_update",
]

Tensor = torch.Tensor


def _check(name: str, x: Tensor, ndim: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name} is empty")
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or inf")


def key_covariance(keys: Tensor, lam: float = 0.0) -> Tensor:
    """ROME's key statistics ``C = E[k kᵀ] + λ I`` (uncentred second moment) from keys ``(n, d)``."""
    _check("keys", keys, 2)
    if lam < 0:
        raise ValueError(f"lam must be >= 0, got {lam}")
    c = keys.T @ keys / keys.shape[0]
    return c + lam * torch.eye(c.shape[0], dtype=c.dtype, device=c.device)


def rome_update(W: Tensor, k_star: Tensor, v_star: Tensor, C_inv: Tensor) -> Tensor:
    """ROME's rank-one update (Meng et al. 2022, eq. 2): ``ΔW = (v* − W k*) (C⁻¹k*)ᵀ / ((C⁻¹k*)ᵀ k*)``.

    Then ``(W + ΔW) k* = v*`` exactly and ``ΔW k = 0`` for every key with ``kᵀ C⁻¹ k* = 0``.
    """
    _check("W", W, 2)
    _check("k_star", k_star, 1)
    _check("v_star", v_star, 1)
    _check("C_inv", C_inv, 2)
    if k_star.shape[0] != W.shape[1] or v_star.shape[0] != W.shape[0] or C_inv.shape != (W.shape[1],) * 2:
        raise ValueError(f"shapes do not fit: W {tuple(W.shape)}, k* {tuple(k_star.shape)}, "
                         f"v* {tuple(v_star.shape)}, C⁻¹ {tuple(C_inv.shape)}")
    u = C_inv @ k_star  # the update's row direction C⁻¹k*
    denom = u @ k_star
    if not denom > 0:
        raise ValueError("k*ᵀ C⁻¹ k* must be positive (C⁻¹ not positive definite on k*)")
    residual = v_star - W @ k_star  # what the layer must add at k*
    return torch.outer(residual, u) / denom


def memit_update(W: Tensor, K: Tensor, V: Tensor, C: Tensor) -> Tensor:
    """MEMIT's batch update for one layer (Meng et al. 2023, eq. 14): ``Δ = R Kᵀ (C + K Kᵀ)⁻¹`` with
    ``R = V − W K`` (keys as columns there; rows here). It minimises ``‖Δ K − R‖² + tr(Δ C Δᵀ)``, a ridge
    regression whose prior is the preserved keys' (unnormalised) second moment ``C``."""
    _check("W", W, 2)
    _check("K", K, 2)
    _check("V", V, 2)
    _check("C", C, 2)
    if K.shape[0] != V.shape[0] or K.shape[1] != W.shape[1] or V.shape[1] != W.shape[0]:
        raise ValueError(f"shapes do not fit: W {tuple(W.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)}")
    R = V - K @ W.T  # residuals, (n, d_out)
    A = C + K.T @ K  # (d_in, d_in), symmetric positive definite
    return torch.linalg.solve(A, K.T @ R).T  # Δ = Rᵀ K A⁻¹ (A symmetric)


def alphaedit_projector(K0: Tensor, tol: float = 1e-3) -> Tensor:
    """AlphaEdit's null-space projector (Fang et al. 2025, eq. 7): eigenvectors ``Û`` of ``K0ᵀ K0`` whose
    eigenvalue is below ``tol × (largest eigenvalue)``, ``P = Û Ûᵀ``; then ``P k ≈ 0`` for every preserved key."""
    _check("K0", K0, 2)
    if not 0 < tol < 1:
        raise ValueError(f"tol must lie in (0, 1), got {tol}")
    evals, evecs = torch.linalg.eigh(K0.T @ K0)
    keep = evecs[:, evals < tol * evals.max()]
    return keep @ keep.T


def alphaedit_update(W: Tensor, K: Tensor, V: Tensor, P: Tensor, K_prev: Tensor | None = None) -> Tensor:
    """AlphaEdit's projected update (Fang et al. 2025, eq. 11): ``Δ = R Kᵀ P (K_p K_pᵀ P + K Kᵀ P + I)⁻¹``, applied
    as ``Δ P`` so that preserved keys (``P k0 = 0``) keep their outputs. ``K_prev``: keys of earlier edits."""
    _check("P", P, 2)
    d = W.shape[1]
    prev = torch.zeros(d, d, dtype=W.dtype, device=W.device) if K_prev is None else K_prev.T @ K_prev
    _check("W", W, 2)
    _check("K", K, 2)
    R = V - K @ W.T
    A = prev @ P + K.T @ K @ P + torch.eye(d, dtype=W.dtype, device=W.device)
    delta = torch.linalg.solve(A.T, (R.T @ K @ P).T).T  # Δ = Rᵀ K P A⁻¹
    return delta @ P


# ---------------------------------------------------------------------------------------------------------------
# keys and v* of a model


def mean_key(model: nn.Module, module: nn.Linear, tokens: Tensor, positions: Tensor) -> Tensor:
    """k*: the mean input of ``module`` at ``positions`` (one per row of ``tokens``), as in ROME (mean over
    prompts that end in the subject)."""
    with capture([module], inputs=True) as got, torch.no_grad():
        model(tokens)
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    return got[0][rows, positions].mean(0)


@dataclass(frozen=True)
class VStarProblem:
    """One edit's v* problem (ROME eq. 4): prompt groups ``(tokens (B, L), subject positions (B,), answer
    positions (B,))`` whose answer should become ``target``, and groups whose predictions the KL term keeps."""

    prompts: Sequence[tuple[Tensor, Tensor, Tensor]]
    target: int
    kl_prompts: Sequence[tuple[Tensor, Tensor, Tensor]] = ()


def optimize_v_star(model: nn.Module, module: nn.Linear, prompts: Sequence[tuple[Tensor, Tensor, Tensor]],
                    target: int, *, kl_prompts: Sequence[tuple[Tensor, Tensor, Tensor]] = (), steps: int = 50,
                    lr: float = 0.5, kl_weight: float = 1.0, l2: float = 1e-3,
                    stop_below: float | None = 5e-2) -> Tensor:
    """ROME's v* (Meng et al. 2022, eq. 4): a vector δ added to ``module``'s output at the subject position,
    optimised (Adam) to make ``target`` the prediction at the answer position of every prompt, with a KL term
    keeping the predictions of other prompts about the same subject and a penalty ``l2‖δ‖²``. As in ROME's public
    code (``compute_v``), the loop stops before a step once the loss is below ``stop_below`` (``None``: never).

    ``prompts`` / ``kl_prompts``: groups ``(tokens (B, L), subject positions (B,), answer positions (B,))`` (one
    group per prompt length). Returns δ; the caller forms ``v* = W k* + δ``.
    """
    return optimize_v_stars(model, module, [VStarProblem(prompts, target, kl_prompts)], steps=steps, lr=lr,
                            kl_weight=kl_weight, l2=l2, stop_below=stop_below)[0]


def optimize_v_stars(model: nn.Module, module: nn.Linear, problems: Sequence[VStarProblem], *, steps: int = 50,
                     lr: float = 0.5, kl_weight: float = 1.0, l2: float = 1e-3,
                     stop_below: float | None = 5e-2) -> Tensor:
    """:func:`optimize_v_star` for several edits of the *same* model at once (MEMIT computes every v* of a batch
    from the unedited model, Meng et al. 2023 §4.3): one δ per edit, all prompts of one length in one forward
    pass. The edits' losses are independent and Adam acts per coordinate, so each δ follows its own optimisation;
    each edit stops on its own loss. Returns ``(n_edits, d_out)``."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not problems or any(not pb.prompts for pb in problems):
        raise ValueError("optimize_v_stars needs at least one edit, each with at least one prompt group")
    p = next(model.parameters())
    delta = torch.zeros(len(problems), module.out_features, dtype=p.dtype, device=p.device, requires_grad=True)
    buckets = _v_star_buckets(problems, kl_weight, p.device, p.dtype)
    state: dict[str, Tensor] = {}

    def hook(m: nn.Module, inp: tuple[Tensor, ...], out: Tensor) -> Tensor:
        add = torch.zeros_like(out)
        add[torch.arange(out.shape[0], device=out.device), state["pos"]] = delta[state["edit"]]  # δ at the subject
        return out + add

    def logp(tokens: Tensor, ans: Tensor) -> Tensor:
        return torch.log_softmax(model(tokens)[torch.arange(tokens.shape[0], device=tokens.device), ans], -1)

    with torch.no_grad():
        refs = [logp(b["tokens"], b["ans"]) for b in buckets]
    opt = torch.optim.Adam([delta], lr=lr)
    active = torch.ones(len(problems), dtype=torch.bool, device=p.device)
    frozen = [q for q in model.parameters() if q.requires_grad]
    for q in frozen:  # only δ is optimised: skip the weights' gradients (a third of the backward's work)
        q.requires_grad_(False)
    try:
        with hooked([module], hook):
            for _ in range(steps):
                loss = l2 * (delta * delta).sum(1)
                for b, ref in zip(buckets, refs, strict=True):
                    state["pos"], state["edit"] = b["subj"], b["edit"]
                    lp = logp(b["tokens"], b["ans"])
                    nll = -lp.gather(1, b["target"][:, None])[:, 0]
                    kl = torch.sum(ref.exp() * (ref - lp), -1)
                    loss = loss.index_add(0, b["edit"], b["weight"] * torch.where(b["is_kl"], kl, nll))
                if stop_below is not None:
                    active &= loss.detach() >= stop_below
                if not active.any():
                    break
                keep = delta.detach().clone()
                opt.zero_grad()
                loss[active].sum().backward()
                opt.step()
                with torch.no_grad():
                    delta[~active] = keep[~active]  # stopped edits keep their δ (Adam's momentum would move them)
    finally:
        for q in frozen:
            q.requires_grad_(True)
    return delta.detach()


def _v_star_buckets(problems: Sequence[VStarProblem], kl_weight: float, device: torch.device, dtype: torch.dtype
                    ) -> list[dict]:
    """Every prompt row of every edit, grouped by length: tokens, subject and answer positions, the edit it belongs
    to, its weight in that edit's loss (NLL: mean over the group, groups averaged; KL: ``kl_weight`` × mean over the
    group) and whether it is a KL row."""
    rows: dict[int, list[tuple]] = {}
    for e, pb in enumerate(problems):
        for groups, is_kl in ((pb.prompts, False), (pb.kl_prompts, True)):
            for tok, subj, ans in groups:
                w = (kl_weight if is_kl else 1.0 / len(pb.prompts)) / tok.shape[0]
                rows.setdefault(tok.shape[1], []).append((tok, subj, ans, e, w, is_kl, pb.target))
    out = []
    for group in rows.values():
        n = torch.tensor([r[0].shape[0] for r in group], device=device)

        def col(i: int, dtype: torch.dtype, group: list[tuple] = group, n: Tensor = n) -> Tensor:
            return torch.tensor([r[i] for r in group], dtype=dtype, device=device).repeat_interleave(n)

        tok, subj, ans = (torch.cat([r[i] for r in group]).to(device) for i in range(3))
        out.append({"tokens": tok, "subj": subj, "ans": ans, "edit": col(3, torch.long), "weight": col(4, dtype),
                    "is_kl": col(5, torch.bool), "target": col(6, torch.long)})
    return out


# ---------------------------------------------------------------------------------------------------------------
# dimensional collapse


def relative_change_rates(H_before: Tensor, dH: Tensor) -> tuple[Tensor, Tensor]:
    """Singular values ``σ_k`` of the hidden states ``H`` (``(n, d)``, uncentred SVD ``H = U S Vᵀ``) and the paper's
    relative change rates ``R_k = ‖dH v_k‖ / σ_k = √n · rms(dH v_k) / σ_k`` (the perturbation's RMS along the
    principal direction ``v_k`` over that direction's own RMS ``σ_k/√n``). Both sorted by decreasing σ."""
    _check("H_before", H_before, 2)
    _check("dH", dH, 2)
    if dH.shape != H_before.shape:
        raise ValueError(f"dH {tuple(dH.shape)} must have H's shape {tuple(H_before.shape)}")
    H, D = H_before.double(), dH.double()
    _, S, Vh = torch.linalg.svd(H, full_matrices=False)
    if not S[-1] > 0:
        raise ValueError("H is rank deficient: some σ_k = 0, R_k undefined")
    return S, torch.linalg.vector_norm(D @ Vh.T, dim=0) / S


def effective_rank(S: Tensor) -> float:
    """Entropy effective rank (Roy & Vetterli 2007): ``exp(−Σ p_k log p_k)``, ``p_k = σ_k / Σ σ``."""
    _check("S", S, 1)
    if (S < 0).any() or not S.sum() > 0:
        raise ValueError("singular values must be >= 0 and not all zero")
    p = S.double() / S.double().sum()
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


# ---------------------------------------------------------------------------------------------------------------
# retrieval (the SCR analogue)


class CachedEmbedder:
    """``embed_fn`` with a memory: each text is embedded once, new texts of one call in one batch (the notebook
    embeds the same facts and queries at every checkpoint and in the single setting). :meth:`warm` embeds a list
    ahead. Returns ``(n, dim)`` tensors like ``embed_fn``."""

    def __init__(self, embed_fn: Callable[[Sequence[str]], Tensor]):
        self.embed_fn = embed_fn
        self._rows: dict[str, Tensor] = {}

    def warm(self, texts: Sequence[str]) -> None:
        new = sorted({t for t in texts if t not in self._rows})
        if new:
            self._rows.update(zip(new, self.embed_fn(new), strict=True))

    def __call__(self, texts: Sequence[str]) -> Tensor:
        texts = list(texts)
        self.warm(texts)
        return torch.stack([self._rows[t] for t in texts])


class RetrievalEditor:
    """Selective contextual reasoning without weight changes (He, Song, Sun 2025): edited facts are stored as text;
    a query retrieves the most similar stored fact by cosine similarity of ``embed_fn`` embeddings, and the
    confirmation step (an LLM judge in SCR) is a similarity threshold. A confirmed fact is prepended as context.
    ``embed_fn(list[str]) -> (n, dim)`` tensor (e.g. ``repro.common.assets.load_minilm()``)."""

    def __init__(self, embed_fn: Callable[[Sequence[str]], Tensor], threshold: float):
        if not -1.0 <= threshold <= 1.0:
            raise ValueError(f"threshold is a cosine similarity in [-1, 1], got {threshold}")
        self.embed_fn, self.threshold = embed_fn, float(threshold)
        self.facts: list[str] = []
        self._emb: Tensor | None = None
        self._seen: dict[str, Tensor] = {}  # query embeddings, computed once

    def _embed(self, texts: Sequence[str]) -> Tensor:
        e = self.embed_fn(list(texts)).double()
        return e / torch.linalg.vector_norm(e, dim=-1, keepdim=True).clamp_min(1e-12)

    def add(self, fact: str) -> None:
        """Store one edited fact (text)."""
        if not isinstance(fact, str) or not fact.strip():
            raise ValueError("a fact must be a non-empty string")
        e = self._embed([fact])
        self._emb = e if self._emb is None else torch.cat([self._emb, e])
        self.facts.append(fact)

    def retrieve(self, queries: Sequence[str]) -> list[str | None]:
        """The confirmed fact of each query (``None`` below the threshold or with an empty store)."""
        if isinstance(queries, str):
            raise TypeError("retrieve() takes a sequence of strings")
        if self._emb is None:
            return [None] * len(queries)
        new = sorted({q for q in queries if q not in self._seen})
        if new:
            self._seen.update(zip(new, self._embed(new), strict=True))
        sim = torch.stack([self._seen[q] for q in queries]) @ self._emb.T
        best, idx = sim.max(dim=1)
        return [self.facts[i] if s >= self.threshold else None for s, i in zip(best.tolist(), idx.tolist(),
                                                                                  strict=True)]

    def contextualize(self, query: str) -> str:
        """``"fact ; query"`` when a stored fact passes the gate, else the query unchanged."""
        fact = self.retrieve([query])[0]
        return query if fact is None else f"{fact} ; {query}"
