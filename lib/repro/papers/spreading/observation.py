"""The Stratified Mean-Field Observer: per-tier compartment fractions, a fixed-size observation for any graph.

Nodes are ranked by an influence score (degree here) and cut into ``K`` tiers of (nearly) equal size, tier
``K − 1`` holding the hubs (:func:`degree_tiers`). The observation is, for each tier, the fraction of its nodes in
each state (S, I, R, V), plus the elapsed time and the remaining budget (:func:`stratified_observation`): ``4K + 2``
numbers whatever the graph's size or topology, computed in O(N) (one pass over the nodes). Fractions are per tier,
so a policy trained on a 1000-node graph reads a 100 000-node graph on the same scale (the paper's zero-shot
transfer). The global observer (:func:`global_observation`) pools all nodes into one tier: the "hub blind" baseline.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import torch
from torch import Tensor

__all__ = ["degree_tiers", "global_observation", "stratified_observation", "tier_sizes"]


def degree_tiers(graph: nx.Graph | np.ndarray, K: int, *, device: torch.device | str = "cpu") -> Tensor:
    """Tier of each node (``[N]``, 0 … K−1) by degree rank: nodes sorted by (degree, node order) and split into ``K``
    consecutive groups of sizes differing by at most one; the top tier holds the highest degrees. Ties in degree are
    broken by node order, so a degree class can straddle two tiers."""
    deg = np.array([d for _, d in graph.degree()]) if isinstance(graph, nx.Graph) else np.asarray(graph)
    if deg.ndim != 1 or len(deg) == 0:
        raise ValueError("need a graph or a non-empty 1-D degree array")
    if not (isinstance(K, int) and 1 <= K <= len(deg)):
        raise ValueError(f"K must be an int in [1, {len(deg)}], got {K!r}")
    order = np.argsort(deg, kind="stable")
    tiers = np.empty(len(deg), dtype=np.int64)
    tiers[order] = np.arange(len(deg)) * K // len(deg)
    return torch.as_tensor(tiers, device=device)


def tier_sizes(tiers: Tensor) -> Tensor:
    """Number of nodes per tier, ``[K]``."""
    return torch.bincount(tiers)


def stratified_observation(counts: Tensor, *, t: float | Tensor | None = None, horizon: float = 1.0,
                           budget_left: Tensor | None = None, budget: float | None = None) -> Tensor:
    """Observation from per-tier state counts ``[R, K, 4]`` (S, I, R, V): per-tier fractions ``[R, 4K]``, then the
    time fraction ``t / horizon`` and the budget fraction left (each only when given)."""
    if counts.ndim != 3 or counts.shape[-1] != 4:
        raise ValueError(f"counts must be [replicas, tiers, 4], got {tuple(counts.shape)}")
    sizes = counts.sum(-1, keepdim=True)
    if (sizes <= 0).any():
        raise ValueError("every tier must hold at least one node")
    parts = [(counts / sizes).reshape(counts.shape[0], -1)]
    parts += _extras(counts, t, horizon, budget_left, budget)
    return torch.cat(parts, 1)


def global_observation(counts: Tensor, *, t: float | Tensor | None = None, horizon: float = 1.0,
                       budget_left: Tensor | None = None, budget: float | None = None) -> Tensor:
    """The hub-blind observation: the same fractions pooled over all tiers, ``[R, 4]`` (+ time and budget)."""
    return stratified_observation(counts.sum(1, keepdim=True), t=t, horizon=horizon, budget_left=budget_left,
                                  budget=budget)


def _extras(counts: Tensor, t, horizon: float, budget_left, budget) -> list[Tensor]:
    R, out = counts.shape[0], []
    if t is not None:
        tt = torch.as_tensor(t, dtype=counts.dtype, device=counts.device).expand(R)
        out.append((tt / horizon).clamp(max=1.0)[:, None])
    if budget_left is not None:
        if not budget:
            raise ValueError("budget_left needs the total budget")
        out.append((budget_left.to(counts.dtype) / budget)[:, None])
    return out
