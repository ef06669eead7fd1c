"""A tiny CenterNet-style person detector for full mode (quick mode uses oracle boxes).

Not part of SCALE: the paper's detector is SeqNet's Faster R-CNN with domain-adversarial heads. This stand-in lets
full mode evaluate *person search* (detection, then re-ID, with the recall factor of the CUHK-SYSU protocol) instead
of re-ID with oracle boxes. It is trained on labeled source scenes only, so on the target it also suffers the scale
gap. Design (Zhou et al. 2019, "Objects as Points", reduced): a stride-4 fully convolutional net predicts a centre
heat-map (Gaussian targets, penalty-reduced focal loss with α = 2, β = 4) and the log box size at centres (L1);
decoding keeps 3×3 local maxima above a score threshold.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from repro.common.train import cosine_schedule, fit

from .synth import Split


class TinyCenterNet(nn.Module):
    """Two stride-2 convs, two more, then a 1-channel centre heat-map and a 2-channel log-size map at stride 4."""

    def __init__(self, width: int = 32):
        super().__init__()

        def block(cin, cout, stride=1):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

        self.body = nn.Sequential(block(3, width // 2, 2), block(width // 2, width, 2), block(width, width),
                                  block(width, width))
        self.heat = nn.Conv2d(width, 1, 1)
        self.size = nn.Conv2d(width, 2, 1)
        nn.init.constant_(self.heat.bias, -2.19)  # prior 0.1, as CenterNet

    def forward(self, img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.body(img * 2.0 - 1.0)
        return self.heat(f), self.size(f)


def _targets(boxes: list[np.ndarray], shape: tuple[int, int], device) -> tuple[torch.Tensor, ...]:
    """Per image: Gaussian centre heat-map (σ = max(0.8, box width / 16) cells), log-size targets, centre mask."""
    rows, cols = shape
    heat = torch.zeros(len(boxes), rows, cols, device=device)
    size = torch.zeros(len(boxes), 2, rows, cols, device=device)
    mask = torch.zeros(len(boxes), rows, cols, dtype=torch.bool, device=device)
    yy = torch.arange(rows, device=device, dtype=torch.float32)[:, None]
    xx = torch.arange(cols, device=device, dtype=torch.float32)[None, :]
    for k, bxs in enumerate(boxes):
        for b in bxs:
            cx, cy = (b[0] + b[2]) / 8.0, (b[1] + b[3]) / 8.0
            w, h = float(b[2] - b[0]), float(b[3] - b[1])
            sig = max(0.8, w / 16.0)
            heat[k] = torch.maximum(heat[k], torch.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * sig**2)))
            iy, ix = min(int(cy), rows - 1), min(int(cx), cols - 1)
            heat[k, iy, ix] = 1.0
            mask[k, iy, ix] = True
            size[k, :, iy, ix] = torch.tensor([np.log(w), np.log(h)], device=device)
    return heat, size, mask


def focal_loss(logits: torch.Tensor, heat: torch.Tensor) -> torch.Tensor:
    """CenterNet's penalty-reduced pixel-wise focal loss (α = 2, β = 4), normalised by the number of centres."""
    p = torch.sigmoid(logits).clamp(1e-4, 1 - 1e-4)
    pos = heat.eq(1.0).float()
    pos_loss = -torch.log(p) * (1 - p) ** 2 * pos
    neg_loss = -torch.log(1 - p) * p**2 * (1 - heat) ** 4 * (1 - pos)
    return (pos_loss.sum() + neg_loss.sum()) / pos.sum().clamp_min(1)


def train_detector(split: Split, steps: int, batch: int = 8, lr: float = 2e-3, seed: int = 0,
                   device: torch.device | str = "cpu", width: int = 32, scales: tuple[float, float] = (0.25, 1.0),
                   ) -> TinyCenterNet:
    """Train on the labeled scenes of ``split`` (source only) through :func:`repro.common.train.fit`, with the
    usual multi-scale augmentation: each batch is resized by a factor drawn from ``scales`` (source labels only)."""
    torch.manual_seed(seed)
    net = TinyCenterNet(width).to(device)
    imgs = torch.as_tensor(split.images, device=device).permute(0, 3, 1, 2).float() / 255
    rng = np.random.default_rng([seed, 5])
    picks = [rng.choice(len(imgs), batch, replace=False) for _ in range(steps)]
    factors = rng.uniform(*scales, size=steps)

    def step_loss(i: int) -> torch.Tensor:
        b, f = picks[i], float(factors[i])
        rows, cols = (int(imgs.shape[2] * f) // 4) * 4, (int(imgs.shape[3] * f) // 4) * 4
        x = F.interpolate(imgs[torch.as_tensor(b, device=device)], size=(rows, cols), mode="bilinear",
                          antialias=True, align_corners=False)
        sx, sy = cols / imgs.shape[3], rows / imgs.shape[2]
        scaled = [split.boxes[split.scene == s] * np.array([sx, sy, sx, sy], np.float32) for s in b]
        heat, size, mask = _targets(scaled, (rows // 4, cols // 4), device)
        hl, sl = net(x)
        l1 = (sl.permute(0, 2, 3, 1)[mask] - size.permute(0, 2, 3, 1)[mask]).abs().mean()
        return focal_loss(hl[:, 0], heat) + 0.5 * l1

    fit(net, step_loss, steps, lr=lr, optimizer="adam",
        schedule=lambda i: cosine_schedule(i, steps, max(1, steps // 10)))
    return net.eval()


@dataclass
class Detections:
    """Boxes ``(n, 4)``, scores and scene index of every kept detection."""

    boxes: torch.Tensor
    scores: torch.Tensor
    scenes: torch.Tensor


@torch.no_grad()
def detect(net: TinyCenterNet, split: Split, thresh: float = 0.3, top_k: int = 20, batch: int = 32) -> Detections:
    """3×3 local maxima of the heat-map with score ≥ ``thresh`` (at most ``top_k`` per scene), boxes from the
    predicted log sizes around each peak (stride 4)."""
    boxes, scores, scenes = [], [], []
    dev = next(net.parameters()).device
    for s0 in range(0, len(split.images), batch):
        imgs = torch.as_tensor(split.images[s0:s0 + batch], device=dev).permute(0, 3, 1, 2).float() / 255
        hl, sl = net(imgs)
        p = torch.sigmoid(hl[:, 0])
        peaks = p * (F.max_pool2d(p[:, None], 3, 1, 1)[:, 0] == p)
        val, flat = peaks.flatten(1).topk(min(top_k, peaks[0].numel()), dim=1)
        keep = val >= thresh
        cols = p.shape[2]
        iy, ix = flat // cols, flat % cols
        b_idx = torch.arange(len(p), device=dev)[:, None].expand_as(flat)
        wh = torch.exp(sl[b_idx, :, iy, ix])  # (B, K, 2)
        cx, cy = (ix.float() + 0.5) * 4, (iy.float() + 0.5) * 4
        bx = torch.stack([cx - wh[..., 0] / 2, cy - wh[..., 1] / 2, cx + wh[..., 0] / 2, cy + wh[..., 1] / 2], -1)
        h, w = split.images.shape[1:3]
        bx = torch.stack([bx[..., 0].clamp(0, w - 2), bx[..., 1].clamp(0, h - 2), bx[..., 2].clamp(1, w),
                          bx[..., 3].clamp(1, h)], -1)
        boxes.append(bx[keep])
        scores.append(val[keep])
        scenes.append(b_idx[keep] + s0)
    return Detections(torch.cat(boxes), torch.cat(scores), torch.cat(scenes))


def detections_as_split(split: Split, det: Detections) -> Split:
    """A :class:`Split` whose boxes are the detections (pid ``-1``), to crop them with ``synth.crop_rois``."""
    return replace(split, boxes=det.boxes.cpu().numpy(), pids=np.full(len(det.scores), -1, np.int64),
                   scene=det.scenes.cpu().numpy())
