"""Planar skills, time warps and demonstrations: the generated data of the GAM analogue (no download).

Six canonical "world lines" from ``(0, 0)`` to ``(1, 0)`` (straight, arc, S, L, zigzag, loop), each made uniform in
arc length on a dense grid. A demonstration applies a random similarity ``g = (θ, s, t)``, executes the path with a
random monotone time warp ``u(t)`` and adds Gaussian noise: ``x_k = g·P(u(t_k)) + ε``. The "language" input is the
skill's one-hot token and the "vision" input is the (start, goal) pair, ``start = t``, ``goal = t + s e^{iθ}``.

The loop is *open* on purpose (a prolate-trochoid curl between distinct ends): a closed loop has start = goal, which
fixes no rotation or scale (spec §7).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch
from scipy.special import betainc

from .method import arclength_resample, retime, sim2_act, sim2_matrix, uniform_grid

SKILLS = ("straight", "arc", "S", "L", "zigzag", "loop")
SMOOTH = ("straight", "arc", "S", "loop")     # C¹ paths: arc-length resampling error is O(h²)
CORNERED = ("L", "zigzag")                   # corners: the chord cuts them, error O(h)
WARPS = ("none", "beta", "beta_strong", "stopgo", "softplus")


def _curve(name: str, tau: np.ndarray) -> np.ndarray:
    """The skill's parametric curve at ``tau ∈ [0, 1]`` (not yet arc-length uniform)."""
    if name == "straight":
        return np.stack([tau, 0 * tau], -1)
    if name == "arc":
        return np.stack([tau, 0.4 * np.sin(np.pi * tau)], -1)
    if name == "S":
        return np.stack([tau, 0.25 * np.sin(2 * np.pi * tau)], -1)
    if name == "L":  # right-angle corner at (0.2, 0.4): (0.2, 0.4)·(0.8, −0.4) = 0
        a = np.minimum(tau / 0.3, 1.0)[:, None]
        b = np.clip((tau - 0.3) / 0.7, 0.0, 1.0)[:, None]
        return a * np.array([0.2, 0.4]) + b * np.array([0.8, -0.4])
    if name == "zigzag":  # 4 triangular teeth of height 0.15
        z = 4 * tau
        return np.stack([tau, 0.15 * (1 - np.abs(2 * (z - np.floor(z)) - 1))], -1)
    if name == "loop":  # open prolate trochoid: x runs backwards near the middle, crossing itself once
        return np.stack([tau + 0.35 * np.sin(2 * np.pi * tau), 0.5 * np.sin(np.pi * tau) ** 2], -1)
    raise ValueError(f"unknown skill {name!r}; choose from {SKILLS}")


def skill_paths(n: int = 4001, skills: tuple[str, ...] = SKILLS, *, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Canonical skills as arc-length-uniform polylines ``[K, n, 2]`` from ``(0, 0)`` to ``(1, 0)`` (parametric curve
    on 40 001 points, then :func:`~.method.arclength_resample`)."""
    tau = np.linspace(0.0, 1.0, 40_001)
    dense = torch.as_tensor(np.stack([_curve(k, tau) for k in skills]), device=device, dtype=dtype)
    P, _, _ = arclength_resample(dense, n)
    return P


def time_warps(family: str, count: int, T: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` monotone time warps ``u [count, T]`` on ``t_k = k/(T−1)``, ``u(0) = 0``, ``u(1) = 1``.

    ``none``: ``u = t``. ``beta``: Beta(a, b) CDF, ``a, b ~ U[1, 3]`` (the training family). ``beta_strong``:
    ``a, b ~ U[0.6, 5]``. ``stopgo``: ``u = t − A sin(2πkt)/(2πk)``, ``k ∈ {2, 3}``, ``A ~ U[0.7, 0.95]`` (near-pauses).
    ``softplus``: normalised cumulative softplus of 6 random cosines."""
    if count < 1 or T < 2:
        raise ValueError(f"need count >= 1 and T >= 2, got {count}, {T}")
    t = np.linspace(0.0, 1.0, T)[None, :]
    if family == "none":
        return np.repeat(t, count, 0)
    if family in ("beta", "beta_strong"):
        lo, hi = (1.0, 3.0) if family == "beta" else (0.6, 5.0)
        a, b = rng.uniform(lo, hi, (2, count, 1))
        return betainc(a, b, t)
    if family == "stopgo":
        k = rng.choice([2, 3], (count, 1))
        amp = rng.uniform(0.7, 0.95, (count, 1))
        return t - amp * np.sin(2 * np.pi * k * t) / (2 * np.pi * k)
    if family == "softplus":
        j = np.arange(1, 7)[None, :, None]
        coef, phase = rng.normal(0, 1, (count, 6, 1)), rng.uniform(0, 2 * np.pi, (count, 6, 1))
        speed = np.logaddexp(0.0, (coef * np.cos(2 * np.pi * j * t[:, None] + phase)).sum(1))
        u = np.concatenate([np.zeros((count, 1)), np.cumsum((speed[:, 1:] + speed[:, :-1]) / 2, 1)], 1)
        return u / u[:, -1:]
    raise ValueError(f"unknown warp family {family!r}; choose from {WARPS}")


@dataclass
class SkillData:
    """Demonstrations (all tensors share a device). ``x`` is what a demonstrator records; ``clean_path`` (the
    noise-free world path at ``n_eval`` equal arc-length fractions) and ``clean_timed`` (noise-free ``g·P(u(t))``)
    are the evaluation targets."""

    skill: torch.Tensor        # [N] long
    start: torch.Tensor        # [N, 2]
    goal: torch.Tensor         # [N, 2]
    theta: torch.Tensor        # [N] rotation (rad)
    scale: torch.Tensor        # [N]
    x: torch.Tensor            # [N, T, 2] observed (noisy, warped)
    u: torch.Tensor            # [N, T] the true time warp
    clean_timed: torch.Tensor  # [N, T, 2]
    clean_path: torch.Tensor   # [N, n_eval, 2]
    n_skills: int

    def __len__(self) -> int:
        return int(self.skill.shape[0])

    def subset(self, mask: torch.Tensor) -> SkillData:
        """The demonstrations where ``mask`` holds (a bool or index tensor)."""
        return SkillData(**{f.name: (getattr(self, f.name)[mask] if f.name != "n_skills" else self.n_skills)
                            for f in fields(self)})


def make_skill_dataset(n_per_skill: int, *, theta_deg: tuple[float, float] = (-30.0, 30.0),
                       scale: tuple[float, float] = (0.8, 1.2), trans: float = 1.0, warp: str = "beta",
                       noise: float = 0.005, T: int = 50, n_eval: int = 32, rng: np.random.Generator | int = 0,
                       skills: tuple[str, ...] = SKILLS, paths: torch.Tensor | None = None,
                       device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> SkillData:
    """``n_per_skill`` demonstrations of every skill: pose ``θ ~ U[theta_deg]`` (degrees), ``s ~ U[scale]``,
    ``t ~ U[−trans, trans]²``; timing from :func:`time_warps` (``warp``); noise ``N(0, noise²)`` per coordinate.
    Geometry is computed in float64 and stored in ``dtype``."""
    if n_per_skill < 1:
        raise ValueError(f"n_per_skill must be >= 1, got {n_per_skill}")
    if noise < 0 or scale[0] <= 0 or scale[0] > scale[1] or theta_deg[0] > theta_deg[1]:
        raise ValueError(f"bad ranges: noise={noise}, scale={scale}, theta_deg={theta_deg}")
    rng = np.random.default_rng(rng) if isinstance(rng, int) else rng
    K, N = len(skills), len(skills) * n_per_skill
    skill = np.repeat(np.arange(K), n_per_skill)
    theta = np.deg2rad(rng.uniform(*theta_deg, N))
    s = rng.uniform(*scale, N)
    t = rng.uniform(-trans, trans, (N, 2))
    u = time_warps(warp, N, T, rng)
    eps = rng.normal(0.0, noise, (N, T, 2))
    f64 = dict(device=device, dtype=torch.float64)
    base = (paths if paths is not None else skill_paths(skills=skills, **f64)).to(**f64)[torch.as_tensor(skill)]
    rot = torch.polar(torch.as_tensor(s, **f64), torch.as_tensor(theta, **f64))
    g = sim2_matrix(rot, torch.complex(*torch.as_tensor(t, **f64).unbind(-1)))
    u_t = torch.as_tensor(u, **f64)
    clean_timed = sim2_act(g, retime(base, u_t))                       # g·P(u(t))
    clean_path = sim2_act(g, retime(base, uniform_grid(n_eval, u_t)))  # similarity keeps arc-length fractions
    out = dict(skill=torch.as_tensor(skill, device=device), start=clean_path[:, 0], goal=clean_path[:, -1],
               theta=torch.as_tensor(theta, **f64), scale=torch.as_tensor(s, **f64),
               x=clean_timed + torch.as_tensor(eps, **f64), u=u_t, clean_timed=clean_timed, clean_path=clean_path)
    return SkillData(**{k: (v.to(dtype) if v.is_floating_point() else v) for k, v in out.items()}, n_skills=K)


def rotate_about(points: torch.Tensor, center: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """Rotate ``points [N, m, 2]`` about ``center [N, 2]`` by ``angle [N]`` (the baseline's augmentation)."""
    c, s = angle.cos()[:, None], angle.sin()[:, None]
    d = points - center[:, None]
    return center[:, None] + torch.stack([c * d[..., 0] - s * d[..., 1], s * d[..., 0] + c * d[..., 1]], -1)

