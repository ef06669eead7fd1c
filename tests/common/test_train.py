"""repro.common.train: the one fit loop reproduces a hand-written loop exactly, for every schedule kind."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from repro.common.train import cosine_schedule, fit


def _problem(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    X, y = torch.randn(64, 3), torch.randn(64, 1)
    return model, X, y


def _by_hand(model, X, y, steps, opt, sched, clip):
    g = torch.Generator().manual_seed(5)
    for _ in range(steps):
        idx = torch.randint(64, (16,), generator=g)
        loss = ((model(X[idx]) - y[idx]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if sched:
            sched.step()


@pytest.mark.parametrize("kind", ["constant-adam", "cosine-adam", "lambda-adamw"])
def test_fit_equals_a_hand_written_loop(kind):
    steps = 25
    ref, X, y = _problem()
    if kind == "lambda-adamw":
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, betas=(0.9, 0.98), weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: cosine_schedule(s, steps, 5))
        kw = dict(optimizer="adamw", betas=(0.9, 0.98), weight_decay=0.01,
                  schedule=lambda s: cosine_schedule(s, steps, 5))
    else:
        opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps) if kind == "cosine-adam" else None
        kw = dict(schedule="cosine" if kind == "cosine-adam" else None)
    _by_hand(ref, X, y, steps, opt, sched, clip=0.5)
    model, X, y = _problem()
    g = torch.Generator().manual_seed(5)

    def step_loss(i):
        idx = torch.randint(64, (16,), generator=g)
        return ((model(X[idx]) - y[idx]) ** 2).mean()

    losses = fit(model, step_loss, steps, lr=1e-2, clip=0.5, **kw)
    assert len(losses) == steps and not model.training
    for a, b in zip(ref.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_cosine_schedule_shapes():
    assert cosine_schedule(0, 100, 10) == pytest.approx(0.1)
    assert cosine_schedule(10, 100, 10) == pytest.approx(1.0)
    assert cosine_schedule(55, 100, 10) == pytest.approx(0.5)
    assert cosine_schedule(100, 100, 10) == pytest.approx(0.0, abs=1e-12)
    # overlapping warm-up: the ramp multiplies a cosine over the whole run
    assert cosine_schedule(4, 100, 20, overlap=True) == pytest.approx(0.25 * 0.5 * (1 + math.cos(math.pi * 0.04)))
    assert cosine_schedule(0, 100, 0) == 1.0


def test_bad_input():
    model, X, y = _problem()
    with pytest.raises(ValueError, match="steps"):
        fit(model, lambda i: model(X).sum(), 0, lr=0.1)
    with pytest.raises(ValueError, match="unknown optimizer"):
        fit(model, lambda i: model(X).sum(), 1, lr=0.1, optimizer="lion")
    with pytest.raises(ValueError, match="scalar"):
        fit(model, lambda i: model(X), 1, lr=0.1)
    with pytest.raises(ValueError, match="schedule"):
        fit(model, lambda i: model(X).sum(), 1, lr=0.1, schedule="linear")
