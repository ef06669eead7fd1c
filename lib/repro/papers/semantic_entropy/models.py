"""The learned side of paper 16 at digits scale: a small class-conditional v-prediction denoiser (one network for
``D(x_t)`` and ``D(x_t, y)``, classifier-free guidance's null label) and a noisy classifier, both trained with
:func:`repro.common.train.fit` on inputs noised at log-SNR uniform in a range.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ...common.train import fit
from .method import VP, Schedule, Tensor

__all__ = [
    "ConditionalDenoiser", "FourierTime", "NoisyClassifier", "classifier_cross_entropy", "train_classifier",
    "train_denoiser",
]


class FourierTime(nn.Module):
    """Random Fourier features of ``log γ`` (the noise level), a common time embedding."""

    def __init__(self, dim: int = 32, scale: float = 1.0, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("freq", torch.randn(dim // 2, generator=g) * scale)

    def forward(self, log_snr: Tensor) -> Tensor:
        z = log_snr[:, None] * self.freq[None] * 2 * math.pi / 10
        return torch.cat([z.sin(), z.cos()], dim=1)


class ConditionalDenoiser(nn.Module):
    """MLP v-predictor ``v̂(x_t, log γ, y)`` (``v = a ε − s x_0`` for VP) with a learned label embedding; label
    ``n_classes`` means "no label" (classifier-free guidance's null token), so one network gives both ``D(x_t)``
    and ``D(x_t, y)``.

    Why v: in the MMSE-gap integrand per unit log-SNR, a label-dependent output error ``δ`` costs ``½ a² ‖δ‖²``
    with v-prediction but ``½ ‖δ‖²`` with ε-prediction; at low SNR (``a → 0``), where the true information
    rate is tiny, ε-prediction turns network noise into spurious information."""

    def __init__(self, dim: int, n_classes: int, width: int = 512, depth: int = 3, time_dim: int = 32):
        super().__init__()
        self.n_classes = n_classes
        self.time = FourierTime(time_dim)
        self.label = nn.Embedding(n_classes + 1, time_dim)
        layers: list[nn.Module] = []
        d_in = dim + 2 * time_dim
        for _ in range(depth):
            layers += [nn.Linear(d_in, width), nn.SiLU()]
            d_in = width
        layers.append(nn.Linear(width, dim))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor, log_snr: Tensor, y: Tensor) -> Tensor:
        return self.net(torch.cat([x, self.time(log_snr), self.label(y)], dim=1))

    def denoise(self, x: Tensor, t: Tensor, sched: Schedule, y: Tensor | None) -> Tensor:
        """``E[x_0 | x_t(, y)]`` from the v-prediction: ``a x_t − s v̂`` (VP, ``a² + s² = 1``); ``y=None``
        uses the null label."""
        a, s = sched.alpha(t), sched.sigma(t)
        labels = torch.full((len(x),), self.n_classes, device=x.device) if y is None else y
        log_snr = torch.full((len(x),), float(torch.log(sched.snr(t))), dtype=x.dtype, device=x.device)
        return a * x - s * self(x, log_snr, labels)


def _check_data(X: Tensor, y: Tensor, steps: int) -> None:
    if len(X) == 0 or steps < 1:
        raise ValueError("need a non-empty data set and at least one step")
    if X.ndim != 2 or y.shape != (len(X),):
        raise ValueError(f"need X of shape (n, d) and labels y of shape (n,), got {tuple(X.shape)}, {tuple(y.shape)}")
    if not torch.isfinite(X).all():
        raise ValueError("X contains NaN or infinite values")


def _noised_batch(X: Tensor, sched: Schedule, batch: int, log_snr_range: tuple[float, float],
                  generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """One training batch, drawn in a fixed order: indices, log-SNR ``λ`` uniform on the range, noise ``ε``.
    Returns ``idx``, ``λ``, the time ``t`` with that SNR, ``x_0`` and ``ε``."""
    lo, hi = log_snr_range
    idx = torch.randint(len(X), (batch,), generator=generator, device=X.device)
    x0 = X[idx]
    lam = lo + (hi - lo) * torch.rand(batch, generator=generator, dtype=X.dtype, device=X.device)
    t = sched.t_of_snr(lam.exp())
    eps = torch.randn(x0.shape, generator=generator, dtype=X.dtype, device=X.device)
    return idx, lam, t, x0, eps


def train_denoiser(model: ConditionalDenoiser, X: Tensor, y: Tensor, sched: Schedule, steps: int,
                   batch: int = 256, lr: float = 2e-3, p_uncond: float = 0.5,
                   log_snr_range: tuple[float, float] = (-9.0, 9.0),
                   generator: torch.Generator | None = None) -> list[float]:
    """Denoising score matching (v-prediction MSE, VP schedule only) with log-SNR uniform on ``log_snr_range`` and
    the label dropped with probability ``p_uncond``; Adam with cosine annealing over ``steps``
    (:func:`repro.common.train.fit`). Returns the loss curve."""
    _check_data(X, y, steps)
    if not isinstance(sched, VP):
        raise ValueError("the v-prediction denoiser is defined for the VP schedule")

    def step_loss(_: int) -> Tensor:
        idx, lam, t, x0, eps = _noised_batch(X, sched, batch, log_snr_range, generator)
        lab = y[idx].clone()
        a, s = sched.alpha(t)[:, None], sched.sigma(t)[:, None]
        xt = a * x0 + s * eps
        drop = torch.rand(batch, generator=generator, device=X.device) < p_uncond
        lab[drop] = model.n_classes                                  # classifier-free guidance's null label
        return ((model(xt, lam, lab) - (a * eps - s * x0)) ** 2).mean()   # v = a ε − s x_0

    return fit(model, step_loss, steps, lr=lr, optimizer="adam", schedule="cosine")


class NoisyClassifier(nn.Module):
    """MLP classifier ``q(y | x_t, log γ)``; its cross-entropy upper-bounds ``H(Y | X_t)``."""

    def __init__(self, dim: int, n_classes: int, width: int = 256, time_dim: int = 32):
        super().__init__()
        self.time = FourierTime(time_dim, seed=1)
        self.net = nn.Sequential(nn.Linear(dim + time_dim, width), nn.SiLU(), nn.Linear(width, width), nn.SiLU(),
                                 nn.Linear(width, n_classes))

    def forward(self, x: Tensor, log_snr: Tensor) -> Tensor:
        return self.net(torch.cat([x, self.time(log_snr)], dim=1))


def train_classifier(model: NoisyClassifier, X: Tensor, y: Tensor, sched: Schedule, steps: int, batch: int = 256,
                     lr: float = 2e-3, log_snr_range: tuple[float, float] = (-9.0, 9.0),
                     generator: torch.Generator | None = None) -> list[float]:
    """Cross-entropy training on noised inputs at log-SNR uniform on ``log_snr_range`` (Adam, constant learning
    rate, :func:`repro.common.train.fit`). Returns the loss curve."""
    _check_data(X, y, steps)

    def step_loss(_: int) -> Tensor:
        idx, lam, t, x0, eps = _noised_batch(X, sched, batch, log_snr_range, generator)
        xt = sched.alpha(t)[:, None] * x0 + sched.sigma(t)[:, None] * eps
        return nn.functional.cross_entropy(model(xt, lam), y[idx])

    return fit(model, step_loss, steps, lr=lr, optimizer="adam")


@torch.no_grad()
def classifier_cross_entropy(model: NoisyClassifier, X: Tensor, y: Tensor, t_grid: Tensor, sched: Schedule,
                             generator: torch.Generator | None = None) -> Tensor:
    """``E[−log q(y | x_t)]`` on ``t_grid`` (an upper bound on ``H(Y | X_t)``)."""
    eps = torch.randn(X.shape, generator=generator, dtype=X.dtype, device=X.device)
    out = []
    for t in t_grid:
        lam = torch.full((len(X),), float(torch.log(sched.snr(t))), dtype=X.dtype, device=X.device)
        out.append(nn.functional.cross_entropy(model(sched.noise(X, t, eps), lam), y))
    return torch.stack(out)
