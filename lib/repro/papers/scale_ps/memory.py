"""The cluster-proxy memory of SCALE (and DAPS / SpCL before it).

Checked against ``models/cpm.py`` of whbdmu/SCALE @ c024bd4: one L2-normalised proxy per source class and per target
cluster (un-clustered target instances are proxies of their own); the loss is cross-entropy over
``x · proxies / τ`` (``τ = 0.05``); after the gradient is taken, each sample moves its own proxy,
``p_y ← m·p_y + (1 - m)·x`` then renormalised (``m = 0.2``), samples in batch order. Deviation: the code also
appends hard-negative proposal features as extra proxies; with oracle boxes there are no background proposals.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ClusterMemory"]


class ClusterMemory(nn.Module):
    """Proxies ``(K, D)``; ``forward(x, targets)`` returns the contrastive loss and then updates the proxies."""

    def __init__(self, proxies: torch.Tensor, temp: float = 0.05, momentum: float = 0.2):
        super().__init__()
        if proxies.ndim != 2 or len(proxies) < 2:
            raise ValueError(f"need at least 2 proxies of shape (K, D), got {tuple(proxies.shape)}")
        if not torch.isfinite(proxies).all():
            raise ValueError("proxies contain NaN or inf")
        if temp <= 0 or not 0 <= momentum <= 1:
            raise ValueError(f"need temp > 0 and momentum in [0, 1], got {temp}, {momentum}")
        self.register_buffer("proxies", F.normalize(proxies.detach().float(), dim=1).clone())
        self.temp, self.momentum = temp, momentum

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if targets.min() < 0 or targets.max() >= len(self.proxies):
            raise ValueError(f"targets must lie in [0, {len(self.proxies)}), got [{targets.min()}, {targets.max()}]")
        logits = x @ self.proxies.clone().T / self.temp  # gradient w.r.t. x uses the proxies before the update
        loss = F.cross_entropy(logits, targets)
        self.update(x.detach(), targets)
        return loss

    @torch.no_grad()
    def update(self, x: torch.Tensor, targets: torch.Tensor) -> None:
        """Sequential momentum update, batched: the r-th occurrence of every target is applied in round r, so a
        proxy hit twice in a batch is updated twice, in batch order, exactly as the code's per-sample loop."""
        order = torch.argsort(targets, stable=True)
        t_sorted = targets[order]
        first = torch.ones_like(t_sorted, dtype=torch.bool)
        first[1:] = t_sorted[1:] != t_sorted[:-1]
        group_start = torch.cummax(torch.where(first, torch.arange(len(t_sorted), device=x.device), 0), 0).values
        occurrence = torch.empty_like(targets)
        occurrence[order] = torch.arange(len(t_sorted), device=x.device) - group_start
        for r in range(int(occurrence.max()) + 1):
            sel = occurrence == r
            y = targets[sel]
            p = self.momentum * self.proxies[y] + (1.0 - self.momentum) * x[sel]
            self.proxies[y] = p / p.norm(dim=1, keepdim=True)
