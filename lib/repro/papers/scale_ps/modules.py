"""SDH, the Scale-aware Domain Harmonization module of SCALE, and its parts.

Checked against the public code (whbdmu/SCALE @ c024bd4, ``models/resnet_scale.py``), where SDH sits in the RoI box
head between a 1×1 conv 1024→256 and a 1×1 conv back to 1024, before res5:

* :class:`TripletAttention` (Misra et al., 2021): three gates, each "Z-pool (max and mean over one axis) → 7×7 conv →
  BN → sigmoid", on the (C, W), (H, C) and (H, W) views of the map, averaged; ``no_spatial=True`` drops the
  (H, W) gate (the "channel" variant).
* :class:`MultiScaleConv`: parallel 1×1 and depthwise 3×3 / 5×5 / 7×7 convs (ReLU each), concatenated, fused by a
  1×1 conv, BN, ReLU (the paper's "semantic vs structural scales" and "cross-path interaction").
* :class:`SCR` (the paper's "consistency refinement"): the parameter-free SimAM energy,
  ``y = (x - μ)² / (4 (σ² + λ)) + 1/2`` with ``μ``, ``σ²`` the per-channel spatial mean and variance (divisor
  ``HW - 1``), ``out = x · sigmoid(y)``, ``λ = 1e-4``.
* :class:`SIA`: ``SIA(x) = x + w·MSC_s(TA_spatial(x)) + w·MSC_c(TA_channel(x))``.
* :class:`SDH`: ``SDH(x) = x + w·SIA(x) + w·SCR(x)``; the code's global ``WEIGHT`` is 0.2, its configs set 1.0.
  With ``w = 0`` SDH is the identity.

Deviation: the code's domain-specific BN (``is_source``) inside these modules is not used (one BN for both domains).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SCR", "SDH", "SIA", "MultiScaleConv", "TripletAttention"]


class SCR(nn.Module):
    """SimAM energy attention: ``x · sigmoid((x - μ)² / (4 (Σ(x - μ)²/(HW - 1) + λ)) + 1/2)`` per channel."""

    def __init__(self, lam: float = 1e-4):
        super().__init__()
        if lam < 0:
            raise ValueError(f"lambda must be >= 0, got {lam}")
        self.lam = lam

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[2] * x.shape[3] - 1
        if n < 1:
            raise ValueError("SCR needs a feature map with at least 2 positions")
        d2 = (x - x.mean(dim=(2, 3), keepdim=True)).pow(2)  # (x - μ)²
        y = d2 / (4 * (d2.sum(dim=(2, 3), keepdim=True) / n + self.lam)) + 0.5  # inverse energy
        return x * torch.sigmoid(y)


class _Gate(nn.Module):
    """Z-pool over dim 1 (max and mean) → k×k conv (no bias) → BN → sigmoid, multiplied back onto the input."""

    def __init__(self, kernel: int = 7):
        super().__init__()
        self.conv = nn.Conv2d(2, 1, kernel, padding=kernel // 2, bias=False)
        self.bn = nn.BatchNorm2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.cat([x.amax(dim=1, keepdim=True), x.mean(dim=1, keepdim=True)], dim=1)
        return x * torch.sigmoid(self.bn(self.conv(z)))


class TripletAttention(nn.Module):
    """Average of gates on the (C, W) view (pool over H), the (H, C) view (pool over W) and, unless
    ``no_spatial``, the (H, W) view (pool over C)."""

    def __init__(self, no_spatial: bool = False, kernel: int = 7):
        super().__init__()
        self.cw, self.hc = _Gate(kernel), _Gate(kernel)
        self.hw = None if no_spatial else _Gate(kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y1 = self.cw(x.permute(0, 2, 1, 3)).permute(0, 2, 1, 3)  # H plays the channel role
        y2 = self.hc(x.permute(0, 3, 2, 1)).permute(0, 3, 2, 1)  # W plays the channel role
        if self.hw is None:
            return (y1 + y2) / 2
        return (y1 + y2 + self.hw(x)) / 3


class MultiScaleConv(nn.Module):
    """1×1 and depthwise 3×3 / 5×5 / 7×7 paths (ReLU each) → concat → 1×1 → BN → ReLU."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        if out_channels % in_channels:
            raise ValueError("depthwise paths need out_channels to be a multiple of in_channels")
        self.paths = nn.ModuleList(
            [nn.Conv2d(in_channels, out_channels, 1)]
            + [nn.Conv2d(in_channels, out_channels, k, padding=k // 2, groups=in_channels) for k in (3, 5, 7)])
        self.fuse = nn.Conv2d(4 * out_channels, out_channels, 1)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([torch.relu(p(x)) for p in self.paths], dim=1)
        return torch.relu(self.bn(self.fuse(y)))


class SIA(nn.Module):
    """``x + w·MSC_s(TA_spatial(x)) + w·MSC_c(TA_channel(x))``."""

    def __init__(self, channels: int, weight: float = 1.0):
        super().__init__()
        self.weight = weight
        self.ta_spatial, self.ta_channel = TripletAttention(no_spatial=False), TripletAttention(no_spatial=True)
        self.msc_spatial, self.msc_channel = MultiScaleConv(channels, channels), MultiScaleConv(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        return x + w * self.msc_spatial(self.ta_spatial(x)) + w * self.msc_channel(self.ta_channel(x))


class SDH(nn.Module):
    """Scale-aware Domain Harmonization: ``x + w·SIA(x) + w·SCR(x)`` (the identity at ``w = 0``)."""

    def __init__(self, channels: int, weight: float = 1.0, lam: float = 1e-4):
        super().__init__()
        if weight < 0:
            raise ValueError(f"SDH weight must be >= 0, got {weight}")
        self.weight = weight
        self.sia, self.scr = SIA(channels, weight), SCR(lam)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.weight * self.sia(x) + self.weight * self.scr(x)
