"""The re-ID network of the toy: a small CNN standing in for SeqNet's ResNet-50 RoI head, with an optional SDH.

Layout (mirroring the public code's box head): a :class:`Backbone` (stem and two stages) gives the RoI feature map
(the "res4" output, ``12 × 6`` at a 48×24 input); the :class:`Head` is ``1×1 conv → SDH → 1×1 conv`` (SDH absent in
the baseline), a "res5" stage, global max pooling (as the code's ``adaptive_max_pool2d``), a linear embedding with
BN, L2-normalised.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .modules import SDH

__all__ = ["Backbone", "Head", "ReIDNet", "adabn"]


def _conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class Backbone(nn.Sequential):
    """Stem, stage 2 and the "res4" conv: crops ``(n, 3, H, W)`` in [0, 1] → RoI feature maps ``(n, w2, H/4, W/4)``."""

    def __init__(self, widths: tuple[int, int, int] = (16, 32, 64)):
        w0, w1, w2 = widths
        super().__init__(_conv(3, w0), nn.MaxPool2d(2), _conv(w0, w1), _conv(w1, w1), nn.MaxPool2d(2), _conv(w1, w2))
        self.out_channels = w2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x * 2.0 - 1.0)


class Head(nn.Module):
    """The RoI head: ``1×1 conv → SDH → 1×1 conv`` (SDH absent when ``sdh_weight is None``), "res5" (pool and two
    convs), global max pooling, linear embedding with BN, L2-normalised."""

    def __init__(self, in_channels: int = 64, width: int = 96, dim: int = 128, sdh_weight: float | None = None,
                 sdh_channels: int = 16):
        super().__init__()
        self.down = nn.Conv2d(in_channels, sdh_channels, 1)
        self.sdh = nn.Identity() if sdh_weight is None else SDH(sdh_channels, sdh_weight)
        self.up = nn.Conv2d(sdh_channels, in_channels, 1)
        self.res5 = nn.Sequential(nn.MaxPool2d(2), _conv(in_channels, width), _conv(width, width))
        self.embed = nn.Linear(width, dim)
        self.bn = nn.BatchNorm1d(dim)

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        f = self.up(self.sdh(self.down(f)))
        f = F.adaptive_max_pool2d(self.res5(f), 1).flatten(1)
        return F.normalize(self.bn(self.embed(f)), dim=1)


class ReIDNet(nn.Module):
    """Backbone + head; ``widths`` of the stem, stage 2, "res4" and "res5"."""

    def __init__(self, widths: tuple[int, int, int, int] = (16, 32, 64, 96), dim: int = 128,
                 sdh_weight: float | None = None, sdh_channels: int = 16):
        super().__init__()
        self.backbone = Backbone(widths[:3])
        self.head = Head(widths[2], widths[3], dim, sdh_weight, sdh_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """L2-normalised embeddings ``(n, dim)`` of crops ``(n, 3, H, W)`` in [0, 1]."""
        return self.head(self.backbone(x))


class CosineClassifier(nn.Module):
    """Logits ``s · cos(embedding, class weight)`` for source pre-training."""

    def __init__(self, dim: int, classes: int, scale: float = 16.0):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(classes, dim) * 0.01)
        self.scale = scale

    def forward(self, emb: torch.Tensor) -> torch.Tensor:
        return self.scale * emb @ F.normalize(self.weight, dim=1).T


@torch.no_grad()
def embed(model: nn.Module, crops: torch.Tensor, batch: int = 256) -> torch.Tensor:
    """``model``'s outputs for ``crops`` (or feature maps) in evaluation mode, in batches."""
    was = model.training
    model.eval()
    out = torch.cat([model(crops[i:i + batch]) for i in range(0, len(crops), batch)])
    model.train(was)
    return out


@torch.no_grad()
def adabn(model: nn.Module, crops: torch.Tensor, batch: int = 128) -> nn.Module:
    """AdaBN: re-estimate every BatchNorm's running statistics on ``crops`` (cumulative average, no gradient);
    returns the model in evaluation mode."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    for i in range(0, len(crops), batch):
        model(crops[i:i + batch])
    for m, mom in zip(bns, saved, strict=True):
        m.momentum = mom
    return model.eval()
