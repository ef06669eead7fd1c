"""Pseudo-labels for the unlabeled target: k-reciprocal Jaccard distance, DBSCAN, and SCALE's Bidirectional Cluster
Regularization (BCR).

Checked against the public code: ``spcl/utils/faiss_rerank.py`` (SpCL's ``compute_jaccard_distance``, used by SCALE
with ``k1=30, k2=6``) and ``utils/utils.py`` + ``train.py`` of whbdmu/SCALE @ c024bd4 (``compute_split_matrix``,
``compute_merge_matrix``, ``generate_corrected_distance_matrix``; DBSCAN ``eps=0.5, min_samples=4`` on the
precomputed Jaccard matrix, run twice). BCR, as the code does it:

1. ``D`` = Jaccard distance of the L2-normalised features; ``labels₀ = DBSCAN(D)``.
2. Split matrix ``M_s``: for each cluster with ``n ≥ 10`` members and mean intra-cluster Euclidean distance
   ``a_m ≥ 0.5``, spectral clustering (2 sub-clusters, k-NN affinity, ``k = min(10, n - 1)``); every pair across
   the two sub-clusters gets ``+min((ε/λ)·λ^{a_m}, 0.5)``.
3. Merge matrix ``M_m``: for each cluster with ``n ≤ 20``, every member votes for the other cluster at the smallest
   mean Euclidean distance ``b_x``; if one cluster gets ``≥ 70 %`` of the votes and ``b_m = mean(b_x) ≤ 0.4``, every
   pair between the two clusters gets ``-min((ε/λ)·λ^{1 - b_m}, 0.5)`` (assigned, clusters in label order).
4. ``D' = clip(sym(D + M_s + M_m), 0)`` with a zero diagonal; ``labels = DBSCAN(D')``.

Deviations: float32 instead of the code's float16 ``V``; the spectral clustering gets a fixed ``random_state`` (the
code leaves it unseeded), so BCR is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.cluster import DBSCAN, SpectralClustering

__all__ = [
    "BCRStats", "bcr_labels", "corrected_distance", "dbscan_labels", "jaccard_distance", "merge_matrix", "pseudo_ids",
    "split_matrix",
]


def _check_feats(feats: torch.Tensor) -> torch.Tensor:
    if feats.ndim != 2 or feats.shape[0] < 2:
        raise ValueError(f"features must be (N >= 2, D), got shape {tuple(feats.shape)}")
    if not torch.isfinite(feats).all():
        raise ValueError("features contain NaN or inf")
    if feats.dtype in (torch.int32, torch.int64, torch.bool):
        raise TypeError("features must be floating point (were labels passed by mistake?)")
    return F.normalize(feats if feats.is_floating_point() and feats.dtype != torch.float16 else feats.float(), dim=1)


def _reciprocal(rank: torch.Tensor, k: int) -> torch.Tensor:
    """``R[i, j]``: ``j`` is among the ``k + 1`` first neighbours of ``i`` and ``i`` among those of ``j`` (SpCL's
    ``k_reciprocal_neigh``; the rank list itself holds ``k1`` columns, so ``k + 1`` is capped there)."""
    n, m = rank.shape[0], min(k + 1, rank.shape[1])
    forward = torch.zeros(n, n, dtype=torch.bool, device=rank.device)
    forward.scatter_(1, rank[:, :m], True)
    return forward & forward.T


def _pair_min_sums(v: torch.Tensor, chunk: int = 2_000_000) -> torch.Tensor:
    """``S[i, j] = Σ_k min(V[i, k], V[j, k])`` from the nonzeros of ``V`` only: entries are grouped by column and
    every pair inside a column contributes its minimum (cost Σ_k nnz(column k)², not N³)."""
    n = v.shape[0]
    rows, cols = torch.nonzero(v, as_tuple=True)
    order = torch.argsort(cols, stable=True)
    rows, cols = rows[order], cols[order]
    vals = v[rows, cols]
    counts = torch.bincount(cols, minlength=n)
    starts = torch.cumsum(counts, 0) - counts
    reps = counts[cols]  # each entry pairs with every entry of its column
    s = torch.zeros(n * n, dtype=v.dtype, device=v.device)
    ends = torch.cumsum(reps, 0)
    e0 = 0
    while e0 < len(rows):  # chunks of entries whose pair lists fit in memory
        base = int(ends[e0 - 1]) if e0 else 0
        e1 = int(torch.searchsorted(ends, torch.tensor(base + chunk, device=v.device), right=True))
        e1 = max(e1, e0 + 1)
        first = torch.repeat_interleave(torch.arange(e0, e1, device=v.device), reps[e0:e1])
        block_start = (torch.cumsum(reps[e0:e1], 0) - reps[e0:e1]).repeat_interleave(reps[e0:e1])
        offs = torch.arange(len(first), device=v.device) - block_start
        second = starts[cols[first]] + offs
        s.index_add_(0, rows[first] * n + rows[second], torch.minimum(vals[first], vals[second]))
        e0 = e1
    return s.view(n, n)


def jaccard_distance(feats: torch.Tensor, k1: int = 30, k2: int = 6) -> torch.Tensor:
    """k-reciprocal Jaccard distance ``(N, N)`` (Zhong et al. 2017, as SpCL computes it), on ``feats``' device.

    Steps (SpCL's ``compute_jaccard_distance``): ranks = the ``k1`` nearest neighbours (self included) by
    Euclidean distance of the L2-normalised features; ``R(i)`` = k1-reciprocal neighbours; expansion by
    ``R_{k1/2}(c)`` of each candidate ``c ∈ R(i)`` that shares more than 2/3 of it with ``R(i)``;
    ``V[i, j] = softmax_j(-(2 - 2 f_i·f_j))`` over the expanded set; query expansion ``V[i] = mean of V`` over the
    ``k2`` first neighbours; ``J = 1 - Σ min(V_i, V_j) / (2 - Σ min(V_i, V_j))``, clipped at 0. The pair sums use
    only nonzeros (:func:`_pair_min_sums`), so memory and time are O(N²) for fixed ``k1``."""
    f = _check_feats(feats)
    n = f.shape[0]
    if not 1 <= k2 <= k1 <= n:
        raise ValueError(f"need 1 <= k2 <= k1 <= N, got k1={k1}, k2={k2}, N={n}")
    sim = f @ f.T
    dist = (2 - 2 * sim).clamp_min(0)
    dist_rank = dist.clone()
    dist_rank.fill_diagonal_(-1.0)  # self first, as a k-NN index returns it
    rank = torch.topk(dist_rank, k1, dim=1, largest=False).indices
    r_full = _reciprocal(rank, k1)
    half = int(np.around(k1 / 2))
    r_half = _reciprocal(rank, half)
    # expansion: candidate c of R(i) adds R_half(c) when |R_half(c) ∩ R(i)| > 2/3 |R_half(c)|
    cand_i, cand_c = torch.nonzero(r_full, as_tuple=True)
    half_idx = torch.topk(r_half.to(torch.int8), min(half + 1, n), dim=1).indices  # members of R_half, padded
    half_ok = torch.gather(r_half, 1, half_idx)  # which padded slots are real members
    members = half_idx[cand_c]
    valid = half_ok[cand_c]
    overlap = (r_full[cand_i[:, None], members] & valid).sum(1)
    accept = overlap > (2.0 / 3.0) * valid.sum(1)
    expanded = r_full.clone()
    ai, am, av = cand_i[accept], members[accept], valid[accept]
    expanded[ai[:, None].expand_as(am)[av], am[av]] = True
    # V: softmax of -dist over each expanded set; then query expansion over the k2 first neighbours
    v = torch.where(expanded, torch.exp(-(dist - dist.amin(1, keepdim=True))), torch.zeros((), device=f.device))
    v = v / v.sum(1, keepdim=True)
    if k2 != 1:
        v = v[rank[:, :k2]].mean(1)
    s = _pair_min_sums(v)
    s = (s + s.T) / 2  # exactly symmetric whatever the summation order
    jac = (1 - s / (2 - s)).clamp_min(0)
    jac.fill_diagonal_(0.0)
    return jac


def dbscan_labels(dist: torch.Tensor | np.ndarray, eps: float = 0.5, min_samples: int = 4) -> np.ndarray:
    """scikit-learn's DBSCAN on a precomputed distance matrix; ``-1`` marks outliers."""
    d = dist.detach().cpu().numpy() if isinstance(dist, torch.Tensor) else np.asarray(dist)
    if d.ndim != 2 or d.shape[0] != d.shape[1] or not np.isfinite(d).all() or (d < 0).any():
        raise ValueError("need a square, finite, non-negative distance matrix")
    return DBSCAN(eps=eps, min_samples=min_samples, metric="precomputed").fit_predict(d.astype(np.float64))


@dataclass
class BCRStats:
    """What BCR did: per split cluster its ``a_m``, per merged cluster its ``b_m``, and all clusters' ``a_m`` /
    (small clusters') ``b_m`` for histograms."""

    split_am: list[float]
    merge_bm: list[float]
    all_am: list[float]
    all_bm: list[float]


def _clusters(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ids = np.unique(labels[labels >= 0])
    return ids, np.array([(labels == c).sum() for c in ids], np.int64)


def split_matrix(feats: torch.Tensor, labels: np.ndarray, penalty_eps: float = 0.5, lam: float = 0.5, *,
                 min_size: int = 10, a_thresh: float = 0.5, clip: float = 0.5, seed: int = 0,
                 stats: BCRStats | None = None) -> torch.Tensor:
    """``M_s`` (BCR step 2): ``+min((ε/λ)·λ^{a_m}, clip)`` between the two spectral sub-clusters of every cluster
    with ``n ≥ min_size`` and ``a_m ≥ a_thresh`` (``a_m``: mean over members of the mean Euclidean distance to
    the other members)."""
    f = _check_feats(feats)
    labels = np.asarray(labels)
    n = f.shape[0]
    dist = torch.cdist(f, f)
    ms = torch.zeros(n, n, device=f.device)
    ids, sizes = _clusters(labels)
    for c, size in zip(ids, sizes, strict=True):
        if size < 2:
            continue
        idx = torch.as_tensor(np.nonzero(labels == c)[0], device=f.device)
        a_m = float((dist[idx][:, idx].sum(1) / (size - 1)).mean())
        if stats is not None:
            stats.all_am.append(a_m)
        if size < min_size or a_m < a_thresh:
            continue
        sub = SpectralClustering(n_clusters=2, affinity="nearest_neighbors", n_neighbors=min(10, int(size) - 1),
                                 assign_labels="kmeans", random_state=seed).fit_predict(
            f[idx].cpu().numpy().astype(np.float64))
        if stats is not None:
            stats.split_am.append(a_m)
        sub_t = torch.as_tensor(sub, device=f.device)
        cross = sub_t[:, None] != sub_t[None, :]
        val = min((penalty_eps / lam) * lam ** a_m, clip)
        block = ms[idx[:, None], idx[None, :]]
        ms[idx[:, None], idx[None, :]] = torch.where(cross, torch.full_like(block, val), block)
    return ms


def merge_matrix(feats: torch.Tensor, labels: np.ndarray, penalty_eps: float = 0.5, lam: float = 0.5, *,
                 max_size: int = 20, b_thresh: float = 0.4, vote: float = 0.7, clip: float = 0.5,
                 stats: BCRStats | None = None) -> torch.Tensor:
    """``M_m`` (BCR step 3): for each cluster with ``n ≤ max_size`` whose members vote ``≥ vote`` for one
    nearest cluster (smallest mean Euclidean distance) and ``b_m ≤ b_thresh``, every pair between the two gets
    ``-min((ε/λ)·λ^{1 - b_m}, clip)``; assigned cluster by cluster in label order (later ones overwrite)."""
    f = _check_feats(feats)
    labels = np.asarray(labels)
    n = f.shape[0]
    mm = torch.zeros(n, n, device=f.device)
    ids, sizes = _clusters(labels)
    if len(ids) < 2:
        return mm
    member = torch.as_tensor(labels[:, None] == ids[None, :], device=f.device, dtype=f.dtype)  # (N, C)
    mean_d = torch.cdist(f, f) @ member / member.sum(0)  # mean distance of each point to each cluster
    for ci, (c, size) in enumerate(zip(ids, sizes, strict=True)):
        if size > max_size:
            continue
        idx = torch.as_tensor(np.nonzero(labels == c)[0], device=f.device)
        d = mean_d[idx].clone()
        d[:, ci] = float("inf")
        b_x, nearest = d.min(1)  # each member's vote and its distance
        b_m = float(b_x.mean())
        if stats is not None:
            stats.all_bm.append(b_m)
        votes = torch.bincount(nearest, minlength=len(ids))
        top = int(torch.argmax(votes))
        if votes[top] < vote * size or b_m > b_thresh:
            continue
        if stats is not None:
            stats.merge_bm.append(b_m)
        val = -min((penalty_eps / lam) * lam ** (1 - b_m), clip)
        other = torch.as_tensor(np.nonzero(labels == ids[top])[0], device=f.device)
        mm[idx[:, None], other[None, :]] = val
        mm[other[:, None], idx[None, :]] = val
    return mm


def corrected_distance(dist: torch.Tensor, m_split: torch.Tensor, m_merge: torch.Tensor) -> torch.Tensor:
    """BCR step 4: ``clip(sym(D + M_s + M_m), 0)`` with a zero diagonal."""
    c = dist + m_split + m_merge
    c = 0.5 * (c + c.T)
    c.fill_diagonal_(0.0)
    return c.clamp_min(0.0)


def bcr_labels(feats: torch.Tensor, eps: float = 0.5, min_samples: int = 4, lam: float = 0.5, *,
               penalty_eps: float = 0.5, k1: int = 30, k2: int = 6, dist: torch.Tensor | None = None,
               seed: int = 0, stats: BCRStats | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(labels₀, labels)``: DBSCAN on the Jaccard distance, then DBSCAN on the BCR-corrected distance.
    ``eps``/``min_samples`` are DBSCAN's; ``penalty_eps``/``lam`` the penalties' ε and λ; ``dist`` reuses a
    precomputed Jaccard matrix."""
    f = _check_feats(feats)
    d = jaccard_distance(f, k1, k2) if dist is None else dist.to(f.device)
    labels0 = dbscan_labels(d, eps, min_samples)
    m_s = split_matrix(f, labels0, penalty_eps, lam, seed=seed, stats=stats)
    m_m = merge_matrix(f, labels0, penalty_eps, lam, stats=stats)
    labels = dbscan_labels(corrected_distance(d, m_s, m_m), eps, min_samples)
    return labels0, labels


def pseudo_ids(labels: np.ndarray) -> np.ndarray:
    """The code's ``generate_pseudo_labels``: clusters keep their ids ``0..C-1``, each outlier gets a new id of its
    own (un-clustered instances become singleton classes)."""
    labels = np.asarray(labels)
    out = labels.copy()
    n_clusters = int(labels.max()) + 1 if (labels >= 0).any() else 0
    noise = labels < 0
    out[noise] = n_clusters + np.arange(int(noise.sum()))
    return out
