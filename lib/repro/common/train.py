"""The one fit loop of the library: optimiser, learning-rate schedule, gradient clipping, loss log.

Every paper that trains a network calls :func:`fit` with a ``step_loss(i)`` closure that draws its own batch
and returns the loss; the loop does the rest in one fixed order (zero the gradients, backward, clip, step the
optimiser, step the schedule), so two papers never differ in how they train by accident.

Users: ``repro.papers.d3llm`` (paper 03), ``repro.papers.pace`` (09), ``repro.papers.semantic_entropy`` (16),
``repro.papers.gbi`` (17), and the papers that land after them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

OPTIMIZERS = ("adam", "adamw", "sgd")


def cosine_schedule(step: int, total: int, warmup: int = 0, *, overlap: bool = False) -> float:
    """Learning-rate factor for step ``step`` of ``total``: a linear warm-up over ``warmup`` steps and a cosine
    decay to 0 at ``total``. By default the decay starts after the warm-up; with ``overlap=True`` the warm-up
    ramp multiplies a cosine that runs over all ``total`` steps (``min(1, (s+1)/warmup)·½(1 + cos(π s/total))``)."""
    if total < 1 or warmup < 0:
        raise ValueError(f"need total >= 1 and warmup >= 0, got total={total}, warmup={warmup}")
    ramp = min(1.0, (step + 1) / warmup) if warmup else 1.0
    if overlap:
        return ramp * 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total))
    if step < warmup:
        return ramp
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def make_optimizer(params, name: str, lr: float, *, betas: tuple[float, float] | None = None,
                   weight_decay: float = 0.0, momentum: float = 0.0) -> torch.optim.Optimizer:
    """``adam`` / ``adamw`` / ``sgd`` with explicit weight decay (AdamW's default 0.01 is never implied)."""
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=betas or (0.9, 0.999), weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas or (0.9, 0.999), weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; use one of {OPTIMIZERS}")


def _scheduler(opt: torch.optim.Optimizer, schedule: str | Callable[[int], float] | None, steps: int):
    if schedule is None:
        return None
    if schedule == "cosine":  # torch's recursive cosine annealing to 0 over all steps
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    if callable(schedule):
        return torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    raise ValueError(f"schedule must be None, 'cosine' or a callable step -> factor, got {schedule!r}")


def fit(model: nn.Module, step_loss: Callable[[int], torch.Tensor], steps: int, *, lr: float,
        optimizer: str = "adam", betas: tuple[float, float] | None = None, weight_decay: float = 0.0,
        momentum: float = 0.0, schedule: str | Callable[[int], float] | None = None, clip: float | None = None,
        log_every: int = 0, unit: str = "loss") -> list[float]:
    """Train ``model`` for ``steps`` steps and return the loss of every step.

    ``step_loss(i)`` draws batch ``i`` and returns a scalar loss tensor. ``schedule``: ``None`` (constant),
    ``"cosine"`` (torch's ``CosineAnnealingLR`` over ``steps``), or a callable giving the learning-rate factor of
    step ``i`` (e.g. ``lambda i: cosine_schedule(i, steps, 50)``). ``clip`` bounds the gradients' global norm.
    The model is in training mode during the loop and in evaluation mode afterwards.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    opt = make_optimizer(model.parameters(), optimizer, lr, betas=betas, weight_decay=weight_decay,
                         momentum=momentum)
    sched = _scheduler(opt, schedule, steps)
    losses: list[float] = []
    model.train()
    for i in range(steps):
        loss = step_loss(i)
        if loss.ndim != 0:
            raise ValueError(f"step_loss must return a scalar, got shape {tuple(loss.shape)}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(float(loss.detach()))
        if log_every and (i + 1) % log_every == 0:
            print(f"step {i + 1}/{steps}: {np.mean(losses[-log_every:]):.4g} {unit}")
    model.eval()
    return losses
