"""The policies of the 2×2 ablation (arc-length × Sim(2) frame), the learned equivariant frame, the lookup controls,
and their training.

Inputs are the "language" task (skill id, one-hot inside the model, and the skill's continuous shape parameter ``a``)
and the "vision" pose (start, goal); outputs are planar trajectories.

===========================  =======================================  =======================================
                             no frame (absolute coordinates)          Sim(2) frame (GAM-lite's factorization)
===========================  =======================================  =======================================
time-indexed targets         ``AbsoluteMLP(arclength=False)``: **B**  ``GAMLite(arclength=False)``: **S-only**
arc-length targets           ``AbsoluteMLP(arclength=True)``: A-only  ``GAMLite(arclength=True)``: **GAM-lite**
===========================  =======================================  =======================================

``AbsoluteMLP`` regresses world coordinates from (token, a, start, goal); with ``augment=True`` in :func:`train` it
sees a fresh rotation about the start for every demonstration at every step (**B+aug**, the fair baseline).
``GAMLite``'s network sees the task only (token and ``a``, no pose: spec §7's leakage risk) and predicts the
canonical world line ``W`` and, for the arc-length model, timing logits; the pose enters only through the analytic
chord frame ``g(start, goal)``, so its output is Sim(2)-equivariant *by construction*. Its timing ``u(t)`` is
monotone (cumulative softmax increments). ``GAMEq`` learns its frame: the network predicts the frame's coefficients
in the basis (start, goal − start) beside the schema and is trained end to end on world paths, with no factorised
targets (the equivariant counterpart of a learned ξ head). :class:`SchemaLookup` is the control every learned schema
must beat: the per-skill mean of the training demos' schemas (what a token-only head converges to), or the schema
of the training demo with the nearest shape parameter, placed with the chord frame.

Every model is a *stack* of ``members`` independent networks (weights ``[E, d_in, d_out]``, one batched matmul) so
that variants of one architecture (data sizes, warps, seeds, baselines with and without augmentation) train in one
:func:`repro.common.train.fit` call: the loss is the sum over members of each member's own mean loss and Adam is
elementwise, so each member trains as it would alone. Inputs ``[N, …]`` are shared by all members, ``[E, N, …]`` are
per member; outputs always carry the member dim first, ``[E, N, …]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from repro.common.train import fit

from .method import arclength_resample, chord_frame, factorize, retime, sim2_act, sim2_inv
from .problems import SkillData, rotate_about

__all__ = ["AbsoluteMLP", "GAMEq", "GAMLite", "SchemaLookup", "StackedLinear", "mlp", "task_input", "train"]


class StackedLinear(nn.Module):
    """``E`` independent affine maps, each initialised like :class:`torch.nn.Linear` (``U(±1/√d_in)``):
    ``x [N, d_in]`` (shared) or ``[E, N, d_in]`` → ``[E, N, d_out]``."""

    def __init__(self, members: int, d_in: int, d_out: int):
        super().__init__()
        bound = 1.0 / math.sqrt(d_in)
        self.weight = nn.Parameter(torch.empty(members, d_in, d_out).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(members, 1, d_out).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x.expand(self.weight.shape[0], *x.shape[-2:]), self.weight)


def mlp(d_in: int, d_out: int, width: int = 128, depth: int = 2, members: int = 1) -> nn.Sequential:
    """``depth`` hidden ReLU layers of ``width``; ``members`` independent copies."""
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [StackedLinear(members, d_in if i == 0 else width, width), nn.ReLU()]
    return nn.Sequential(*layers, StackedLinear(members, width, d_out))


def task_input(skill: torch.Tensor, shape: torch.Tensor, n_skills: int, dtype: torch.dtype) -> torch.Tensor:
    """The pose-free task code ``[one-hot(skill), 2a − 1]`` (``[..., K + 1]``)."""
    onehot = nn.functional.one_hot(skill, n_skills).to(dtype)
    return torch.cat([onehot, (2 * shape.to(dtype) - 1).unsqueeze(-1)], -1)


def _cmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The complex product of (real, imaginary) pairs ``[..., 2]`` (broadcasting)."""
    re = a[..., 0] * b[..., 0] - a[..., 1] * b[..., 1]
    return torch.stack([re, a[..., 0] * b[..., 1] + a[..., 1] * b[..., 0]], -1)


class AbsoluteMLP(nn.Module):
    """Geometry-agnostic regression of absolute waypoints from ``[one-hot(skill), 2a − 1, start, goal]``: ``T``
    time-indexed points (``arclength=False``, baseline B) or ``n`` arc-length points (``arclength=True``, ablation
    A-only)."""

    def __init__(self, n_skills: int, n_points: int, *, arclength: bool, width: int = 128, depth: int = 2,
                 members: int = 1):
        super().__init__()
        self.n_skills, self.n_points, self.arclength, self.members = n_skills, n_points, arclength, members
        self.net = mlp(n_skills + 5, 2 * n_points, width, depth, members)

    def forward(self, skill: torch.Tensor, shape: torch.Tensor, start: torch.Tensor,
                goal: torch.Tensor) -> torch.Tensor:
        """World trajectory ``[E, N, n_points, 2]``."""
        out = self.net(torch.cat([task_input(skill, shape, self.n_skills, start.dtype), start, goal], -1))
        return out.view(*out.shape[:-1], self.n_points, 2)

    def target(self, data: SkillData) -> torch.Tensor:
        """What it regresses: the observed demo, or the demo's arc-length path."""
        return arclength_resample(data.x, self.n_points)[0] if self.arclength else data.x

    def sample_loss(self, skill: torch.Tensor, shape: torch.Tensor, start: torch.Tensor, goal: torch.Tensor,
                    target: torch.Tensor) -> torch.Tensor:
        """Mean squared coordinate error per member and demo ``[E, N]``."""
        return (self(skill, shape, start, goal) - target).pow(2).mean((-2, -1))


class GAMLite(nn.Module):
    """GAM's factorized policy: task (token, ``a``) → canonical world line ``W`` (and timing logits), analytic
    affine modulation ``g = chord_frame(start, goal)``, world path ``g·W``. ``arclength=True``: ``W`` on ``n`` equal
    arc-length fractions (GAM-lite) with a timing ``u [T]`` (``u_0 = 0``, ``u_{T−1} = 1``, monotone); ``False``:
    ``T`` time-indexed canonical waypoints (ablation S-only)."""

    def __init__(self, n_skills: int, n_points: int, T: int, *, arclength: bool, width: int = 128, depth: int = 2,
                 members: int = 1):
        super().__init__()
        self.n_skills, self.n_points, self.T, self.arclength, self.members = n_skills, n_points, T, arclength, members
        self.net = mlp(n_skills + 1, 2 * n_points + (T - 1 if arclength else 0), width, depth, members)

    def _out(self, skill: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
        return self.net(task_input(skill, shape, self.n_skills, self.net[0].weight.dtype))

    def _schema_of(self, out: torch.Tensor) -> torch.Tensor:
        W = out[..., : 2 * self.n_points]
        return W.reshape(*W.shape[:-1], self.n_points, 2)

    def _timing_of(self, out: torch.Tensor) -> torch.Tensor:
        inc = torch.softmax(out[..., 2 * self.n_points:], -1)
        return torch.cat([torch.zeros_like(inc[..., :1]), inc.cumsum(-1)], -1).clamp(0.0, 1.0)

    def schema(self, skill: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
        """The canonical world line ``W [E, N, n_points, 2]`` (pose-free)."""
        return self._schema_of(self._out(skill, shape))

    def timing(self, skill: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
        """Monotone timing ``u [E, N, T]``: cumulative softmax increments (arc-length model only)."""
        if not self.arclength:
            raise ValueError("a time-indexed GAMLite (arclength=False) has no timing head")
        return self._timing_of(self._out(skill, shape))

    def forward(self, skill: torch.Tensor, shape: torch.Tensor, start: torch.Tensor,
                goal: torch.Tensor) -> torch.Tensor:
        """World path ``g(start, goal)·W`` ``[E, N, n_points, 2]``."""
        return sim2_act(chord_frame(start, goal), self.schema(skill, shape))

    def timed(self, skill: torch.Tensor, shape: torch.Tensor, start: torch.Tensor, goal: torch.Tensor,
              u: torch.Tensor | None = None) -> torch.Tensor:
        """Time-indexed execution ``g·W(u(t))`` ``[E, N, T, 2]`` with the commanded timing ``u [N, T]`` (default: the
        model's own timing). A time-indexed model (S-only) ignores ``u``: its timing is baked into its waypoints."""
        if not self.arclength:
            return self(skill, shape, start, goal)
        W = self.schema(skill, shape)
        u = self.timing(skill, shape) if u is None else u.expand(W.shape[0], *u.shape[-2:])
        return sim2_act(chord_frame(start, goal), retime(W, u))

    def target(self, data: SkillData) -> tuple[torch.Tensor, torch.Tensor]:
        """``(W, u)``: each demo in its own chord frame (first → last sample), and its arc-length fractions."""
        P, _, u = arclength_resample(data.x, self.n_points if self.arclength else 2)
        x = P if self.arclength else data.x
        return sim2_act(sim2_inv(chord_frame(data.x[:, 0], data.x[:, -1])), x), u

    def sample_loss(self, skill: torch.Tensor, shape: torch.Tensor, start: torch.Tensor, goal: torch.Tensor,
                    target: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Squared schema error (+ squared timing error for the arc-length model) per member and demo ``[E, N]``."""
        W, u = target
        out = self._out(skill, shape)   # one forward for both heads
        loss = (self._schema_of(out) - W).pow(2).mean((-2, -1))
        return loss + (self._timing_of(out) - u).pow(2).mean(-1) if self.arclength else loss


class GAMEq(nn.Module):
    """A *learned* equivariant frame: the network reads the task (token, ``a``) and predicts a schema ``V`` on ``n``
    arc-length points together with the frame's coefficients ``c₁, c₂ ∈ ℂ`` in the basis of the pose,
    ``g = (t = start + c₁ d, e^w = c₂ d)`` with ``d = goal − start`` (complex), so the world path is
    ``start + d (c₁ + c₂ V)``. It is trained end to end on the demos' world arc-length paths (A-only's targets): no
    factorised targets, no chord frame handed over. Every Sim(2)-equivariant function of (start, goal) with a
    pose-free network has this form, so it is the fair "learned g" (a ReLU MLP from raw coordinates to
    ξ = log g cannot extrapolate an angle); the chord frame is the special case ``c₁ = 0, c₂ = 1``. The split into
    ``(c₁, c₂)`` and ``V`` is not unique (only ``c₁ + c₂ V`` is observed)."""

    def __init__(self, n_skills: int, n_points: int, *, width: int = 128, depth: int = 2, members: int = 1):
        super().__init__()
        self.n_skills, self.n_points, self.members, self.arclength = n_skills, n_points, members, True
        self.net = mlp(n_skills + 1, 2 * n_points + 4, width, depth, members)

    def parts(self, skill: torch.Tensor, shape: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(V [E, N, n, 2], c₁ [E, N, 2], c₂ [E, N, 2])``, complex numbers as (real, imaginary) pairs."""
        out = self.net(task_input(skill, shape, self.n_skills, self.net[0].weight.dtype))
        V = out[..., : 2 * self.n_points].reshape(*out.shape[:-1], self.n_points, 2)
        return V, out[..., -4:-2], out[..., -2:]

    def forward(self, skill: torch.Tensor, shape: torch.Tensor, start: torch.Tensor,
                goal: torch.Tensor) -> torch.Tensor:
        """World path ``start + d (c₁ + c₂ V)`` ``[E, N, n_points, 2]`` (complex products in real arithmetic, which
        trains faster than complex autograd on a CPU)."""
        V, c1, c2 = self.parts(skill, shape)
        local = c1.unsqueeze(-2) + _cmul(c2.unsqueeze(-2), V)          # c₁ + c₂ V in the frame of the chord
        return start.unsqueeze(-2) + _cmul((goal - start).unsqueeze(-2), local)

    def target(self, data: SkillData) -> torch.Tensor:
        """The demo's world arc-length path."""
        return arclength_resample(data.x, self.n_points)[0]

    def sample_loss(self, skill: torch.Tensor, shape: torch.Tensor, start: torch.Tensor, goal: torch.Tensor,
                    target: torch.Tensor) -> torch.Tensor:
        """Mean squared world coordinate error per member and demo ``[E, N]``."""
        return (self(skill, shape, start, goal) - target).pow(2).mean((-2, -1))


class SchemaLookup:
    """The no-learning control: the training demos' schemas (``factorize``, chord frame of each demo's first and last
    sample) looked up by task and placed with the chord frame of the query's (start, goal).

    ``mode="mean"``: the per-skill mean schema, ignoring the shape parameter (the MSE optimum of a token-only schema
    head, which is what GAM-lite learns when a skill has one fixed shape). ``mode="nearest"``: the schema of the
    training demo of the same skill whose shape parameter is nearest (a lookup that uses ``a``, without
    interpolating or averaging noise). Called like the models: ``(skill, shape, start, goal) → [1, N, n, 2]``."""

    def __init__(self, train: SkillData, n_points: int, mode: str = "mean"):
        if mode not in ("mean", "nearest"):
            raise ValueError(f"mode must be 'mean' or 'nearest', got {mode!r}")
        self.mode, self.n_points, self.n_skills = mode, n_points, train.n_skills
        W = factorize(train.x.to(torch.float64), n_points)[0]
        self.skill, self.shape, self.schemas = train.skill, train.shape.to(torch.float64), W
        onehot = nn.functional.one_hot(train.skill, train.n_skills).to(W.dtype)       # [M, K]
        counts = onehot.sum(0)
        if (counts == 0).any():
            raise ValueError("every skill needs at least one training demonstration")
        self.mean = torch.einsum("mk,mnd->knd", onehot, W) / counts[:, None, None]   # [K, n, 2]

    def schema(self, skill: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
        """``[N, n, 2]``: the looked-up canonical world line of each query."""
        if self.mode == "mean":
            return self.mean[skill]
        gap = (shape.to(torch.float64)[:, None] - self.shape[None, :]).abs()
        gap = torch.where(skill[:, None] == self.skill[None, :], gap, torch.full_like(gap, math.inf))
        return self.schemas[gap.argmin(1)]

    def __call__(self, skill: torch.Tensor, shape: torch.Tensor, start: torch.Tensor,
                 goal: torch.Tensor) -> torch.Tensor:
        W = self.schema(skill, shape).to(start.dtype)
        return sim2_act(chord_frame(start, goal), W).unsqueeze(0)


def _pad_stack(parts: Sequence, size: int):
    """Stack per-member tensors (or tuples of them) on a new dim 0, padding each to ``size`` rows (zeros)."""
    if isinstance(parts[0], tuple):
        return tuple(_pad_stack([p[i] for p in parts], size) for i in range(len(parts[0])))
    return torch.stack([torch.cat([p, p.new_zeros(size - len(p), *p.shape[1:])]) for p in parts])


def _take(x, rows: torch.Tensor, idx: torch.Tensor):
    if isinstance(x, tuple):
        return tuple(_take(t, rows, idx) for t in x)
    return x[rows, idx]


def train(model: AbsoluteMLP | GAMLite | GAMEq, data: SkillData | Sequence[SkillData], *, steps: int = 1500,
          lr: float = 1e-3, batch: int = 96, augment: bool | Sequence[bool] = False, seed: int = 0) -> list[float]:
    """Adam with cosine decay through :func:`repro.common.train.fit`. Member ``e`` trains on ``data[e]`` (a single
    data set: every member), on the whole set when it has at most ``batch`` demonstrations and on a fresh random
    ``batch`` of it every step otherwise (equal work per step at every data size). ``augment`` (absolute models only;
    per member): every step rotates each demonstration (start, goal and target) about its start by a fresh angle
    ``~ U[0, 2π)``. Returns the loss log (sum over members of each member's mean loss)."""
    datas = [data] * model.members if isinstance(data, SkillData) else list(data)
    augs = [augment] * model.members if isinstance(augment, bool) else list(augment)
    if len(datas) != model.members or len(augs) != model.members:
        raise ValueError(f"need one data set and one augment flag per member ({model.members} members)")
    if any(len(d) == 0 for d in datas):
        raise ValueError("a member has no demonstrations to train on")
    if any(augs) and not isinstance(model, AbsoluteMLP):
        raise ValueError("rotation augmentation is for the absolute-coordinate models; GAM-lite is equivariant")
    dev, dtype = datas[0].x.device, datas[0].x.dtype
    model.to(device=dev, dtype=dtype)
    sizes = [len(d) for d in datas]
    b = min(batch, max(sizes))
    skill, shape, start, goal = (_pad_stack([getattr(d, k) for d in datas], max(sizes))
                                 for k in ("skill", "shape", "start", "goal"))
    target = _pad_stack([model.target(d) for d in datas], max(sizes))
    rows = torch.arange(model.members, device=dev)[:, None]
    slot = torch.arange(b, device=dev)
    # members with at most b demos use all of them every step; padded slots get weight 0
    weight = torch.stack([(slot < n).to(dtype) / min(n, b) for n in sizes])
    fixed = torch.stack([torch.where(slot < n, slot, 0) for n in sizes])
    aug = torch.as_tensor(augs, device=dev)[:, None]
    gen = torch.Generator(device=dev).manual_seed(int(np.random.SeedSequence(seed).generate_state(1)[0]))

    def step_loss(_: int) -> torch.Tensor:
        idx = fixed.clone()
        for e, n in enumerate(sizes):
            if n > b:
                idx[e] = torch.randperm(n, generator=gen, device=dev)[:b]
        s, h, a, g = skill[rows, idx], shape[rows, idx], start[rows, idx], goal[rows, idx]
        tgt = _take(target, rows, idx)
        if aug.any():
            angle = torch.rand(idx.shape, generator=gen, device=dev, dtype=dtype) * (2 * torch.pi)
            angle = torch.where(aug, angle, torch.zeros_like(angle)).flatten()
            flat = a.reshape(-1, 2)
            g = rotate_about(g.reshape(-1, 1, 2), flat, angle).view_as(g)
            tgt = rotate_about(tgt.reshape(-1, *tgt.shape[2:]), flat, angle).view_as(tgt)
        return (model.sample_loss(s, h, a, g, tgt) * weight).sum()

    return fit(model, step_loss, steps, lr=lr, optimizer="adam", schedule="cosine")
