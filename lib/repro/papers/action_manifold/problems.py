"""Planar skills, time warps and demonstrations: the generated data of the GAM analogue (no download).

Six canonical "world lines" from ``(0, 0)`` to ``(1, 0)`` (straight, arc, S, L, zigzag, loop), each made uniform in
arc length on a dense grid. Every skill but the straight reach has one continuous **shape parameter**
``a ∈ [0, 1]`` (:data:`SHAPE_RANGES`: the arc's height, the S's amplitude, the L's corner height, the zigzag's tooth
height, the loop's curl), drawn per demonstration; ``a = 0.5`` is the fixed shape of the spec's prototype. A
demonstration applies a random similarity ``g = (θ, s, t)``, executes its path with a random monotone time warp
``u(t)`` and adds Gaussian noise: ``x_k = g·P_a(u(t_k)) + ε``. The "language" input is the skill's one-hot token
together with ``a`` (what a scene would show: how high the obstacle is, how wide the wipe), and the "vision" input is
the (start, goal) pair, ``start = t``, ``goal = t + s e^{iθ}``. With one fixed shape per skill a token-only policy can
only learn the per-skill mean of its demonstrations (a lookup table); the shape parameter makes the schema something
to learn and to interpolate.

The loop is *open* on purpose (a prolate-trochoid curl between distinct ends): a closed loop has start = goal, which
fixes no rotation or scale (spec §7).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch
from scipy.special import betainc

from .method import arclength_resample, retime, sim2_act, sim2_matrix, uniform_grid

__all__ = [
    "CORNERED", "SHAPE_RANGES", "SKILLS", "SMOOTH", "WARPS", "SkillData", "make_skill_dataset", "shape_value",
    "shaped_paths", "skill_paths", "time_warps",
]

SKILLS = ("straight", "arc", "S", "L", "zigzag", "loop")
SMOOTH = ("straight", "arc", "S", "loop")     # C¹ paths: arc-length resampling error is O(h²)
CORNERED = ("L", "zigzag")                   # corners: the chord cuts them, error O(h)
WARPS = ("none", "beta", "beta_strong", "stopgo", "softplus")
# the value each skill's shape parameter a ∈ [0, 1] maps to, lo + a (hi − lo); a = 0.5 is the prototype's shape
SHAPE_RANGES: dict[str, tuple[float, float] | None] = {
    "straight": None,         # no shape: the parameter is ignored (a policy must learn that it is)
    "arc": (0.2, 0.6),        # height of y = h sin πτ
    "S": (0.1, 0.4),          # amplitude of y = A sin 2πτ
    "L": (0.2, 0.6),          # height of the corner at x = 0.2
    "zigzag": (0.05, 0.25),   # tooth height of the 4-tooth triangle wave
    "loop": (0.25, 0.45),     # curl r of x = τ + r sin 2πτ (self-crossing for r > 1/2π)
}


def shape_value(name: str, a: np.ndarray | float) -> np.ndarray:
    """The geometric value (height, amplitude, curl) of skill ``name`` at shape parameter ``a``
    (:data:`SHAPE_RANGES`); 0 for the straight reach."""
    rng = SHAPE_RANGES[name]
    a = np.asarray(a, float)
    return np.zeros_like(a) if rng is None else rng[0] + a * (rng[1] - rng[0])


def _curve(name: str, tau: np.ndarray, a: np.ndarray | float = 0.5) -> np.ndarray:
    """The skill's parametric curve at ``tau ∈ [0, 1]`` (not yet arc-length uniform) for shape parameters ``a``
    (a scalar, or ``[N, 1]`` for ``N`` curves: the result is ``[..., len(tau), 2]``)."""
    h = shape_value(name, a)
    tau = np.broadcast_to(tau, np.broadcast_shapes(np.shape(tau), np.shape(h)))
    if name == "straight":
        return np.stack([tau, 0 * tau], -1)
    if name == "arc":
        return np.stack([tau, h * np.sin(np.pi * tau)], -1)
    if name == "S":
        return np.stack([tau, h * np.sin(2 * np.pi * tau)], -1)
    if name == "L":  # corner at (0.2, h) (a right angle at h = 0.4: (0.2, 0.4)·(0.8, −0.4) = 0)
        c = np.stack([np.full_like(tau, 0.2), h * np.ones_like(tau)], -1)
        a1 = np.minimum(tau / 0.3, 1.0)[..., None]
        b1 = np.clip((tau - 0.3) / 0.7, 0.0, 1.0)[..., None]
        return a1 * c + b1 * (np.array([1.0, 0.0]) - c)
    if name == "zigzag":  # 4 triangular teeth of height h
        z = 4 * tau
        return np.stack([tau, h * (1 - np.abs(2 * (z - np.floor(z)) - 1))], -1)
    if name == "loop":  # open prolate trochoid: x runs backwards near the middle, crossing itself once
        return np.stack([tau + h * np.sin(2 * np.pi * tau), 0.5 * np.sin(np.pi * tau) ** 2], -1)
    raise ValueError(f"unknown skill {name!r}; choose from {SKILLS}")


def skill_paths(n: int = 4001, skills: tuple[str, ...] = SKILLS, *, shape: float = 0.5,
                device: torch.device | str = "cpu", dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Canonical skills at one shape parameter as arc-length-uniform polylines ``[K, n, 2]`` from ``(0, 0)`` to
    ``(1, 0)`` (parametric curve on 40 001 points, then :func:`~.method.arclength_resample`)."""
    tau = np.linspace(0.0, 1.0, 40_001)
    dense = torch.as_tensor(np.stack([_curve(k, tau, shape) for k in skills]), device=device, dtype=dtype)
    P, _, _ = arclength_resample(dense, n)
    return P


def shaped_paths(skill: np.ndarray, shape: np.ndarray, n: int = 2001, skills: tuple[str, ...] = SKILLS, *,
                 dense: int = 8001, chunk: int = 256, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """One canonical path per demonstration, ``[N, n, 2]``: skill ``skills[skill[i]]`` at shape parameter
    ``shape[i]``, arc-length uniform (parametric curve on ``dense`` points, then
    :func:`~.method.arclength_resample`, in chunks of ``chunk`` curves to bound the memory)."""
    skill, shape = np.asarray(skill), np.asarray(shape, float)
    if skill.shape != shape.shape or skill.ndim != 1:
        raise ValueError(f"need one shape parameter per skill id, got {skill.shape} and {shape.shape}")
    tau = np.linspace(0.0, 1.0, dense)
    out = torch.empty(len(skill), n, 2, device=device, dtype=dtype)
    for k, name in enumerate(skills):
        idx = np.nonzero(skill == k)[0]
        for lo in range(0, len(idx), chunk):
            part = idx[lo:lo + chunk]
            curves = torch.as_tensor(_curve(name, tau, shape[part, None]), device=device, dtype=dtype)
            out[torch.as_tensor(part, device=device)] = arclength_resample(curves, n)[0]
    return out


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
    are the evaluation targets; ``shape`` is the skill's shape parameter ``a ∈ [0, 1]``, an input of every policy."""

    skill: torch.Tensor        # [N] long
    shape: torch.Tensor        # [N] shape parameter a in [0, 1]
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
                       scale: tuple[float, float] = (0.8, 1.2), trans: float = 1.0,
                       shape: tuple[float, float] = (0.0, 1.0), warp: str = "beta", noise: float = 0.005,
                       T: int = 50, n_eval: int = 32, rng: np.random.Generator | int = 0,
                       skills: tuple[str, ...] = SKILLS, device: torch.device | str = "cpu",
                       dtype: torch.dtype = torch.float32) -> SkillData:
    """``n_per_skill`` demonstrations of every skill: pose ``θ ~ U[theta_deg]`` (degrees), ``s ~ U[scale]``,
    ``t ~ U[−trans, trans]²``; shape parameter ``a ~ U[shape]`` (``(0.5, 0.5)``: the prototype's fixed shapes);
    timing from :func:`time_warps` (``warp``); noise ``N(0, noise²)`` per coordinate. The pose and shape are drawn
    before the warp, so two sets with the same ``rng`` seed and different ``warp`` share poses and shapes.
    Geometry is computed in float64 and stored in ``dtype``."""
    if n_per_skill < 1:
        raise ValueError(f"n_per_skill must be >= 1, got {n_per_skill}")
    if noise < 0 or scale[0] <= 0 or scale[0] > scale[1] or theta_deg[0] > theta_deg[1]:
        raise ValueError(f"bad ranges: noise={noise}, scale={scale}, theta_deg={theta_deg}")
    if not 0.0 <= shape[0] <= shape[1] <= 1.0:
        raise ValueError(f"shape parameters lie in [0, 1], got {shape}")
    rng = np.random.default_rng(rng) if isinstance(rng, int) else rng
    K, N = len(skills), len(skills) * n_per_skill
    skill = np.repeat(np.arange(K), n_per_skill)
    theta = np.deg2rad(rng.uniform(*theta_deg, N))
    s = rng.uniform(*scale, N)
    t = rng.uniform(-trans, trans, (N, 2))
    a = rng.uniform(*shape, N)
    u = time_warps(warp, N, T, rng)
    eps = rng.normal(0.0, noise, (N, T, 2))
    f64 = dict(device=device, dtype=torch.float64)
    if shape[0] == shape[1]:   # one shape per skill: compute K paths, not N
        base = skill_paths(skills=skills, shape=shape[0], **f64)[torch.as_tensor(skill, device=device)]
    else:
        base = shaped_paths(skill, a, skills=skills, **f64)
    rot = torch.polar(torch.as_tensor(s, **f64), torch.as_tensor(theta, **f64))
    g = sim2_matrix(rot, torch.complex(*torch.as_tensor(t, **f64).unbind(-1)))
    u_t = torch.as_tensor(u, **f64)
    clean_timed = sim2_act(g, retime(base, u_t))                       # g·P(u(t))
    clean_path = sim2_act(g, retime(base, uniform_grid(n_eval, u_t)))  # similarity keeps arc-length fractions
    out = dict(skill=torch.as_tensor(skill, device=device), shape=torch.as_tensor(a, **f64), start=clean_path[:, 0],
               goal=clean_path[:, -1], theta=torch.as_tensor(theta, **f64), scale=torch.as_tensor(s, **f64),
               x=clean_timed + torch.as_tensor(eps, **f64), u=u_t, clean_timed=clean_timed, clean_path=clean_path)
    return SkillData(**{k: (v.to(dtype) if v.is_floating_point() else v) for k, v in out.items()}, n_skills=K)


def rotate_about(points: torch.Tensor, center: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """Rotate ``points [N, m, 2]`` about ``center [N, 2]`` by ``angle [N]`` (the baseline's augmentation)."""
    c, s = angle.cos()[:, None], angle.sin()[:, None]
    d = points - center[:, None]
    return center[:, None] + torch.stack([c * d[..., 0] - s * d[..., 1], s * d[..., 0] + c * d[..., 1]], -1)

