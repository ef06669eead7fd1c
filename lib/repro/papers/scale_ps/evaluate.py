"""Person-search mAP and top-1 with the CUHK-SYSU/PRW protocol of SeqNet's ``eval_func.py`` (used by SCALE).

For each query box: the gallery is every other scene (PRW style, ``ignore_cam_id=True``); a scene that holds the
query's identity counts once in ``count_gt``; among that scene's detections whose IoU with the identity's ground-truth
box reaches ``min(0.5, w·h / ((w + 10)(h + 10)))``, only the one with the highest similarity is a true positive;
``AP = average_precision_score(y_true, y_score) · recall`` with ``recall = count_tp / count_gt`` (0 when nothing is
found) and top-1 is whether the best-scoring detection is a true positive. Batched over queries; the average
precision is computed in torch, with tied scores grouped as scikit-learn does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["SearchResult", "average_precision", "oracle_search", "person_search_map"]


@dataclass
class SearchResult:
    """mAP and top-1 (percent), per-query AP and recall (fractions), and how many queries had a gallery match."""

    mAP: float
    top1: float
    ap: np.ndarray
    recall: np.ndarray
    n_queries: int


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU ``(n, m)`` of boxes ``x1, y1, x2, y2``."""
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp_min(0).prod(-1)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return inter / (area_a[:, None] + area_b[None, :] - inter)


def average_precision(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Row-wise ``sklearn.metrics.average_precision_score``: ``Σ_n (R_n - R_{n-1}) P_n`` over distinct thresholds
    (tied scores form one threshold); rows without a positive get 0. ``-inf`` scores may pad rows."""
    order = torch.argsort(scores, dim=1, descending=True, stable=True)
    s, y = torch.gather(scores, 1, order), torch.gather(labels.to(scores.dtype), 1, order)
    n = s.shape[1]
    pos = torch.arange(n, device=s.device).expand_as(s)
    last = torch.ones_like(s, dtype=torch.bool)
    last[:, :-1] = s[:, 1:] != s[:, :-1]  # the last element of each group of tied scores
    ends = torch.where(last, pos, torch.full_like(pos, n))
    group_end = torch.flip(torch.cummin(torch.flip(ends, [1]), 1).values, [1])  # end of the group of each element
    tp = torch.cumsum(y, 1)
    precision = torch.gather(tp, 1, group_end) / (group_end + 1).to(s.dtype)
    n_pos = y.sum(1)
    return torch.where(n_pos > 0, (y * precision).sum(1) / n_pos.clamp_min(1), torch.zeros_like(n_pos))


def person_search_map(query_feats: torch.Tensor, query_pids: torch.Tensor, query_scenes: torch.Tensor,
                      det_feats: torch.Tensor, det_boxes: torch.Tensor, det_scenes: torch.Tensor,
                      gt_boxes: torch.Tensor, gt_pids: torch.Tensor, gt_scenes: torch.Tensor, *, iou: float = 0.5,
                      chunk: int = 256) -> SearchResult:
    """mAP / top-1 of ``query_feats`` against the detections of every other scene (see the module docstring).
    Features are L2-normalised (cosine similarity). Queries whose identity appears in no other scene are
    skipped (``n_queries`` counts the others)."""
    dev = det_feats.device
    if len(query_feats) == 0 or len(det_feats) == 0:
        raise ValueError("need at least one query and one detection")
    for name, t in (("query_feats", query_feats), ("det_feats", det_feats), ("det_boxes", det_boxes)):
        if not torch.isfinite(t).all():
            raise ValueError(f"{name} contains NaN or inf")
    pid_vals, gt_pid_idx = torch.unique(gt_pids, return_inverse=True)
    n_scenes = int(max(gt_scenes.max(), det_scenes.max(), query_scenes.max())) + 1
    table = torch.full((len(pid_vals), n_scenes), -1, dtype=torch.long, device=dev)  # gt index of (pid, scene)
    table[gt_pid_idx, gt_scenes] = torch.arange(len(gt_pids), device=dev)
    w, h = gt_boxes[:, 2] - gt_boxes[:, 0], gt_boxes[:, 3] - gt_boxes[:, 1]
    thr = torch.clamp(w * h / ((w + 10) * (h + 10)), max=iou)
    iou_dg = box_iou(det_boxes, gt_boxes)
    q_idx = torch.searchsorted(pid_vals, query_pids).clamp(max=len(pid_vals) - 1)
    known = pid_vals[q_idx] == query_pids
    aps, hits, recalls, keep = [], [], [], []
    d_index = torch.arange(len(det_feats), device=dev)
    for c0 in range(0, len(query_feats), chunk):
        sl = slice(c0, c0 + chunk)
        qi, qs, qk = q_idx[sl], query_scenes[sl], known[sl]
        sims = query_feats[sl] @ det_feats.T
        valid = det_scenes[None, :] != qs[:, None]
        g = torch.where(qk[:, None], table[qi][:, det_scenes], -1)  # the query identity's gt box in each det's scene
        cand = valid & (g >= 0)
        cand &= iou_dg[d_index[None, :].expand_as(g), g.clamp_min(0)] >= thr[g.clamp_min(0)]
        # one true positive per (query, scene): the candidate with the highest similarity, first index on ties
        key = torch.arange(len(sims), device=dev)[:, None] * n_scenes + det_scenes[None, :]
        best = torch.full((len(sims) * n_scenes,), -torch.inf, device=dev, dtype=sims.dtype)
        best = best.scatter_reduce(0, key[cand], sims[cand], "amax")
        is_best = cand & (sims == best[key])
        first = torch.full((len(sims) * n_scenes,), len(det_feats), device=dev, dtype=torch.long)
        first = first.scatter_reduce(0, key[is_best], d_index[None, :].expand_as(key)[is_best], "amin")
        tp = is_best & (d_index[None, :] == first[key])
        in_scene = torch.where(qk[:, None], table[qi] >= 0, False)
        count_gt = in_scene.sum(1) - in_scene.gather(1, qs[:, None]).squeeze(1).long()
        count_tp = tp.sum(1)
        scores = torch.where(valid, sims, -torch.inf)
        ap = average_precision(scores, tp) * count_tp / count_gt.clamp_min(1)
        top = torch.argmax(scores, dim=1)
        aps.append(ap)
        hits.append(tp.gather(1, top[:, None]).squeeze(1))
        recalls.append(count_tp / count_gt.clamp_min(1))
        keep.append(count_gt > 0)
    keep_t = torch.cat(keep)
    if not keep_t.any():
        raise ValueError("no query has its identity in another scene")
    ap_all, hit_all, rec_all = torch.cat(aps)[keep_t], torch.cat(hits)[keep_t], torch.cat(recalls)[keep_t]
    return SearchResult(mAP=100 * float(ap_all.double().mean()), top1=100 * float(hit_all.double().mean()),
                        ap=ap_all.cpu().numpy(), recall=rec_all.cpu().numpy(), n_queries=int(keep_t.sum()))


def oracle_search(feats: torch.Tensor, boxes: torch.Tensor, pids: torch.Tensor, scenes: torch.Tensor) -> SearchResult:
    """Re-ID with oracle detection: the detections are the ground-truth boxes themselves and every box is a query
    against the other scenes (recall is then 1 by construction)."""
    return person_search_map(feats, pids, scenes, feats, boxes, scenes, boxes, pids, scenes)
