"""D²TR-lite: centralized and decentralized task encoders, MI distillation, roles and a conditioned offline policy.

Our reconstruction from the abstract of Yuan, Xue & Yu (ICML 2026); no paper text beyond the abstract and no code
were available, so every equation here is *ours*, chosen to implement what the abstract names:

* a **centralized task encoder** ``z_c = E_c(global context)`` trained contrastively across tasks (InfoNCE,
  positives = two contexts of the same task), as in context-based offline meta-RL (FOCAL / CORRO style);
* **mutual-information knowledge distillation**: each agent's ``z_i = E_i(local context of agent i)`` maximises the
  InfoNCE lower bound on ``I(z_i; z_c)`` against the frozen teacher (positive = the teacher's embedding of the same
  transitions, negatives = other tasks), plus a cosine alignment term (:func:`distill_loss`);
* **roles**: the paper asks a large language model to label trajectories with semantic roles. We do **not** use an
  LLM: :func:`scripted_role_labeller` is a fixed, deterministic rule on the trajectory (named as such everywhere);
  :func:`kmeans_roles` and random roles are ablations; any ``role_labeller(traj) -> labels`` can be plugged in
  (e.g. an LLM reading :func:`trajectory_summaries`). A role encoder ``r_i = R(agent i's own transitions)`` is
  trained on the labels, with an HSIC penalty (:func:`hsic`) between ``r_i`` and ``z_i`` for disentanglement;
* a **policy** ``π(a | o_i, z_i, r_i)`` fitted by return-weighted behaviour cloning on the offline data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from repro.common.train import fit

from .problems import Dataset, obs_features

__all__ = [
    "ROLE_NAMES", "AgentTrajectories", "ConditionedPolicy", "Contexts", "D2TRConfig", "RoleEncoder", "TrajEncoder",
    "distill_loss", "hsic", "info_nce", "kmeans_roles", "random_roles", "sample_contexts", "scripted_role_labeller",
    "train_d2tr_lite", "train_role_encoder", "train_student", "train_teacher", "trajectory_features",
    "trajectory_summaries",
]

Tensor = torch.Tensor


# ----------------------------------------------------------------------------------------------------------------
# losses
# ----------------------------------------------------------------------------------------------------------------
def info_nce(q: Tensor, k: Tensor, temperature: float = 0.1) -> Tensor:
    """InfoNCE of matched rows: ``−mean_b log softmax_j(q_b·k_j/τ)[b]`` within each group.

    ``q``, ``k``: ``(..., B, d)``; row ``b`` of ``k`` is the positive of row ``b`` of ``q``, the other rows of the
    same group its negatives. ``log B − loss`` is the InfoNCE lower bound on the mutual information (van den Oord
    et al. 2018), so the loss is ``≥ 0`` and ``≈ log B`` for unrelated embeddings.
    """
    if q.shape != k.shape or q.ndim < 2 or q.shape[-2] < 2:
        raise ValueError(f"q and k need the same shape (..., B >= 2, d); got {tuple(q.shape)}, {tuple(k.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logits = q @ k.transpose(-1, -2) / temperature  # (..., B, B) similarity logits
    # log-softmax of the positive (the diagonal) against all keys of the group
    return (torch.logsumexp(logits, -1) - logits.diagonal(dim1=-2, dim2=-1)).mean()


def distill_loss(z_local: Tensor, z_central: Tensor, temperature: float = 0.1) -> Tensor:
    """MI knowledge distillation (our reading of D²TR): InfoNCE(z_i, sg[z_c]) + mean(1 − cos(z_i, z_c)).

    ``z_local``, ``z_central``: ``(..., B, d)``, row ``b`` of both from the same transitions (the teacher sees the
    global view, the student one agent's view); the teacher is detached, so only the student moves.
    """
    zc = z_central.detach()
    return info_nce(z_local, zc, temperature) + (1 - F.cosine_similarity(z_local, zc, dim=-1)).mean()


def _gaussian_gram(x: Tensor, sigma: float | None) -> Tensor:
    d2 = torch.cdist(x, x).square()
    if sigma is None:  # median heuristic on the off-diagonal distances, held fixed (no gradient)
        n = len(x)
        off = d2.detach()[~torch.eye(n, dtype=torch.bool, device=x.device)]
        sigma2 = 0.5 * off.median().clamp_min(1e-12)
    else:
        sigma2 = torch.as_tensor(sigma, dtype=x.dtype, device=x.device) ** 2
    return torch.exp(-d2 / (2 * sigma2))


def hsic(x: Tensor, y: Tensor, sigma_x: float | None = None, sigma_y: float | None = None) -> Tensor:
    """Biased HSIC estimator (Gretton et al. 2005) with Gaussian kernels: ``tr(K H L H) / (n − 1)²``.

    ``x (n, p)``, ``y (n, q)``; bandwidths by the median heuristic unless given. ``≈ 0`` when ``x`` and ``y`` are
    independent, ``> 0`` under dependence; differentiable in both (used as a disentanglement penalty).
    """
    if x.ndim != 2 or y.ndim != 2 or len(x) != len(y) or len(x) < 2:
        raise ValueError(f"hsic needs x (n, p), y (n, q) with the same n >= 2; got {tuple(x.shape)}, "
                         f"{tuple(y.shape)}")
    if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
        raise ValueError("hsic got non-finite values")
    n = len(x)
    K, Lm = _gaussian_gram(x, sigma_x), _gaussian_gram(y, sigma_y)
    Kc = K - K.mean(0, keepdim=True) - K.mean(1, keepdim=True) + K.mean()  # H K H
    return (Kc * Lm).sum() / (n - 1) ** 2  # tr(HKH · L) = Σ_ij (HKH)_ij L_ij


# ----------------------------------------------------------------------------------------------------------------
# encoders
# ----------------------------------------------------------------------------------------------------------------
class TrajEncoder(nn.Module):
    """A set encoder over transitions: ``ρ(mean_t φ(x_t))``, L2-normalised (``normalize=True``).

    ``forward(x, mask)``: ``x (..., K, F)``, ``mask (..., K)`` (True = real transition) → ``(..., d)``.
    ``prefix(x)``: the embeddings of every prefix ``x[..., :t]``, ``t = 0..K`` (``t = 0``: the empty context),
    → ``(..., K + 1, d)``, computed with one cumulative sum (used online by the policy).
    Inputs are standardised with statistics set by :meth:`fit_normaliser`.
    """

    def __init__(self, in_dim: int, hidden: int = 64, out_dim: int = 16, *, normalize: bool = True):
        super().__init__()
        self.phi = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.rho = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out_dim))
        self.normalize = normalize
        self.register_buffer("mu", torch.zeros(in_dim))
        self.register_buffer("sd", torch.ones(in_dim))

    def fit_normaliser(self, x: Tensor) -> TrajEncoder:
        flat = x.reshape(-1, x.shape[-1])
        self.mu.copy_(flat.mean(0))
        self.sd.copy_(flat.std(0).clamp_min(1e-3))
        return self

    def _out(self, pooled: Tensor) -> Tensor:
        z = self.rho(pooled)
        return F.normalize(z, dim=-1) if self.normalize else z

    def features(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.mu.shape[0]:
            raise ValueError(f"encoder expects {self.mu.shape[0]} features per transition, got {x.shape[-1]}")
        return self.phi((x - self.mu) / self.sd)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        h = self.features(x)
        if mask is None:
            return self._out(h.mean(-2))
        m = mask[..., None].to(h.dtype)
        if (m.sum(-2) == 0).any():
            raise ValueError("every context needs at least one transition (mask is all False somewhere)")
        return self._out((h * m).sum(-2) / m.sum(-2))

    def prefix(self, x: Tensor) -> Tensor:
        h = self.features(x)
        zero = torch.zeros_like(h[..., :1, :])
        csum = torch.cat([zero, h.cumsum(-2)], -2)
        count = torch.arange(h.shape[-2] + 1, device=h.device, dtype=h.dtype).clamp_min(1)[:, None]
        return self._out(csum / count)


# ----------------------------------------------------------------------------------------------------------------
# context sampling
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class Contexts:
    """Contexts of ``k`` transitions, each from a different episode of one task, at a random time step:
    ``local (..., N, K, F)`` (each agent's own view), ``glob (..., K·N, F)`` (the team's view of the same
    transitions: all agents' transitions as one set), ``mask (..., K)``, ``task (...)``; :meth:`glob_mask` is the
    mask of ``glob``."""

    local: Tensor
    glob: Tensor
    mask: Tensor
    task: Tensor

    def glob_mask(self) -> Tensor:
        N = self.local.shape[-3]
        return self.mask.repeat_interleave(N, -1)


def sample_contexts(trans: Tensor, task: Tensor, k: Tensor | int, k_max: int, generator: torch.Generator) -> Contexts:
    """Draw one context per entry of ``task`` from ``trans (T, E, S, N, F)``.

    ``k``: the context length of each entry (a tensor shaped like ``task``) or one int; episodes are drawn without
    replacement within a context (so ``k <= E``), time steps uniformly. Randomness on the CPU (device-independent).
    """
    T, E, S, N, Fd = trans.shape
    if k_max > E:
        raise ValueError(f"a context of {k_max} transitions needs >= {k_max} episodes per task, have {E}")
    shape = task.shape
    kk = torch.as_tensor(k).expand(shape).cpu()
    if int(kk.min()) < 1 or int(kk.max()) > k_max:
        raise ValueError(f"context lengths must lie in [1, {k_max}]")
    n = int(np.prod(shape)) if len(shape) else 1
    ep = torch.rand(n, E, generator=generator).argsort(1)[:, :k_max]  # distinct episodes
    ts = torch.randint(0, S, (n, k_max), generator=generator)
    tk = task.reshape(n).cpu()[:, None].expand(n, k_max)
    dev = trans.device
    x = trans[tk.to(dev), ep.to(dev), ts.to(dev)]  # (n, K, N, F)
    mask = (torch.arange(k_max)[None, :] < kk.reshape(n, 1)).to(dev)
    local = x.permute(0, 2, 1, 3).reshape(*shape, N, k_max, Fd)
    glob = x.reshape(*shape, k_max * N, Fd)
    return Contexts(local, glob, mask.reshape(*shape, k_max), task)


# ----------------------------------------------------------------------------------------------------------------
# roles
# ----------------------------------------------------------------------------------------------------------------
ROLE_NAMES = ("near-coverer", "far-coverer", "idle")


@dataclass
class AgentTrajectories:
    """Each agent's own trajectory, as its local observations show it: ``pos (..., S+1, 2)`` and the landmarks'
    relative positions ``landmark_rel (..., S+1, L, 2)``. Built from a :class:`Dataset` by :meth:`of`
    (leading dims ``(T, E, N)``)."""

    pos: Tensor
    landmark_rel: Tensor

    @classmethod
    def of(cls, ds: Dataset) -> AgentTrajectories:
        o = ds.obs.movedim(2, 3)  # (T, E, N, S+1, D)
        L = ds.n_landmarks
        return cls(o[..., 2:4], o[..., 4:4 + 2 * L].unflatten(-1, (L, 2)))


def trajectory_features(traj: AgentTrajectories) -> Tensor:
    """``(..., 3)``: distance to the landmark nearest at the end, at the start and at the end, and the path length."""
    d = traj.landmark_rel.norm(dim=-1)  # (..., S+1, L)
    last = d[..., -1, :].argmin(-1, keepdim=True)
    d_end = torch.gather(d[..., -1, :], -1, last)[..., 0]
    d_start = torch.gather(d[..., 0, :], -1, last)[..., 0]
    path = (traj.pos[..., 1:, :] - traj.pos[..., :-1, :]).norm(dim=-1).sum(-1)
    return torch.stack([d_start, d_end, path], -1)


def scripted_role_labeller(traj: AgentTrajectories, *, settle: float = 0.25, near: float = 0.8) -> Tensor:
    """Our deterministic stand-in for the paper's LLM role assignment (it is **not** an LLM).

    Rules on the agent's own trajectory: ``idle`` (2) if it ends farther than ``settle`` from every landmark;
    otherwise ``near-coverer`` (0) if the landmark it ends on was within ``near`` at the start, else
    ``far-coverer`` (1). Returns long labels shaped like the trajectories' leading dims.
    """
    f = trajectory_features(traj)
    if not torch.isfinite(f).all():
        raise ValueError("trajectories contain non-finite values")
    role = torch.where(f[..., 0] < near, 0, 1)
    return torch.where(f[..., 1] > settle, 2, role).long()


def trajectory_summaries(traj: AgentTrajectories) -> list[str]:
    """One English sentence per trajectory (flattened leading dims): the text an LLM labeller would read."""
    f = trajectory_features(traj).reshape(-1, 3).tolist()
    d = traj.landmark_rel.norm(dim=-1)
    lm = d[..., -1, :].argmin(-1).reshape(-1).tolist()
    return [f"ends {e:.2f} from landmark {m} (it was {s:.2f} away at the start); path length {p:.2f}"
            for (s, e, p), m in zip(f, lm, strict=True)]


def kmeans_roles(features: Tensor, k: int, seed: int = 0) -> Tensor:
    """Role ablation: KMeans (scikit-learn) on standardised trajectory features → cluster labels."""
    from sklearn.cluster import KMeans

    x = features.reshape(-1, features.shape[-1]).double().cpu().numpy()
    if len(x) < k or not np.isfinite(x).all():
        raise ValueError(f"kmeans_roles needs >= k={k} finite samples, got {len(x)}")
    x = (x - x.mean(0)) / x.std(0).clip(1e-9)
    lab = KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(x)
    return torch.as_tensor(lab, dtype=torch.long).reshape(features.shape[:-1]).to(features.device)


def random_roles(shape: tuple[int, ...], k: int, seed: int = 0) -> Tensor:
    """Role ablation: labels uniform on ``{0..k−1}``, independent of the trajectory."""
    return torch.randint(0, k, shape, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------------------------
# training
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class D2TRConfig:
    """Settings of :func:`train_d2tr_lite` (quick-mode defaults)."""

    dz: int = 16
    dr: int = 8
    hidden: int = 64
    temperature: float = 0.1
    k_max: int = 8
    groups: int = 2
    lr: float = 3e-3
    teacher_steps: int = 800
    student_steps: int = 800
    role_steps: int = 400
    policy_steps: int = 600
    role_k: int = 3
    role_steps_per_episode: int = 8
    role_batch: int = 128
    hsic_weight: float = 1.0
    hsic_samples: int = 64
    policy_batch: int = 1024
    awr_beta: float = 1.0
    distill: bool = True
    roles: bool = True
    seed: int = 0
    extra: dict = field(default_factory=dict)


def _k_draw(shape: tuple[int, ...], k_max: int, g: torch.Generator) -> Tensor:
    return torch.randint(1, k_max + 1, shape, generator=g)


def train_teacher(trans: Tensor, cfg: D2TRConfig, generator: torch.Generator) -> tuple[TrajEncoder, list[float]]:
    """Centralized task encoder: InfoNCE between two global contexts of the same task (other tasks negatives).

    It is a set encoder over the team's transitions (every agent's transitions at the context's time steps)."""
    T, E, S, N, Fd = trans.shape
    enc = TrajEncoder(Fd, cfg.hidden, cfg.dz).to(trans.device, trans.dtype)
    enc.fit_normaliser(trans)
    task = torch.arange(T).repeat(cfg.groups, 1)  # (G, T): one context per task per group

    pair = task.expand(2, *task.shape)

    def step(_: int) -> Tensor:
        c = sample_contexts(trans, pair, _k_draw(pair.shape, cfg.k_max, generator), cfg.k_max, generator)
        za, zb = enc(c.glob, c.glob_mask())  # two independent contexts of every task
        return 0.5 * (info_nce(za, zb, cfg.temperature) + info_nce(zb, za, cfg.temperature))

    return enc, fit(enc, step, cfg.teacher_steps, lr=cfg.lr, schedule="cosine")


def train_student(trans: Tensor, teacher: TrajEncoder | None, cfg: D2TRConfig,
                  generator: torch.Generator) -> tuple[TrajEncoder, list[float]]:
    """Decentralized task encoder, shared by the agents, fed only agent ``i``'s own transitions.

    With a teacher: MI distillation (:func:`distill_loss`) to the teacher's embedding of the *same* transitions.
    Without (``teacher=None``, the local-only baseline): the teacher's own objective on local contexts
    (InfoNCE between two local contexts of the same task, possibly of different agents).
    """
    T, E, S, N, Fd = trans.shape
    enc = TrajEncoder(Fd, cfg.hidden, cfg.dz).to(trans.device, trans.dtype)
    enc.fit_normaliser(trans)
    task = torch.arange(T).repeat(cfg.groups, 1)

    pair = task.expand(2, *task.shape)

    def step(_: int) -> Tensor:
        if teacher is not None:
            a = sample_contexts(trans, task, _k_draw(task.shape, cfg.k_max, generator), cfg.k_max, generator)
            za = enc(a.local, a.mask[..., None, :].expand(*a.mask.shape[:-1], N, cfg.k_max))  # (G, T, N, d)
            za = za.movedim(-2, 0)  # (N, G, T, d): each agent's group against the other tasks
            with torch.no_grad():
                zc = teacher(a.glob, a.glob_mask())  # (G, T, d): the team's view of the same transitions
            return distill_loss(za, zc.expand_as(za), cfg.temperature)
        c = sample_contexts(trans, pair, _k_draw(pair.shape, cfg.k_max, generator), cfg.k_max, generator)
        z = enc(c.local, c.mask[..., None, :].expand(*c.mask.shape[:-1], N, cfg.k_max)).movedim(-2, 1)
        za, zb = z[0], z[1][torch.randperm(N, generator=generator)]  # the positive may be another agent's
        return 0.5 * (info_nce(za, zb, cfg.temperature) + info_nce(zb, za, cfg.temperature))

    return enc, fit(enc, step, cfg.student_steps, lr=cfg.lr, schedule="cosine")


class RoleEncoder(nn.Module):
    """``r_i = R(agent i's own transitions, with their time steps)``: a :class:`TrajEncoder` (not normalised) on
    the transition features plus the step's clock ``t / horizon`` (an agent knows its own clock; a set encoder
    would otherwise not know which transition came first), and a linear role head."""

    def __init__(self, in_dim: int, hidden: int, dr: int, n_roles: int, horizon: int):
        super().__init__()
        self.enc = TrajEncoder(in_dim + 1, hidden, dr, normalize=False)
        self.head = nn.Linear(dr, n_roles)
        self.horizon = horizon

    def clocked(self, x: Tensor, t: Tensor) -> Tensor:
        return torch.cat([x, (t.to(x.device, x.dtype) / self.horizon)[..., None].expand(*x.shape[:-1], 1)], -1)

    def forward(self, x: Tensor, t: Tensor, mask: Tensor | None = None) -> Tensor:
        """``x (..., K, F)`` transitions taken at steps ``t (..., K)`` (or ``(K,)``)."""
        return self.enc(self.clocked(x, t), mask)

    def prefix(self, x: Tensor) -> Tensor:
        """Role embeddings of every prefix of the episodes ``x (..., S, F)`` → ``(..., S + 1, dr)``."""
        return self.enc.prefix(self.clocked(x, torch.arange(x.shape[-2])))

    def empty(self, like: Tensor, shape: tuple[int, ...]) -> Tensor:
        """The embedding of an empty history (before the first step)."""
        return self.enc._out(like.new_zeros(*shape, self.enc.rho[0].in_features))


def train_role_encoder(trans: Tensor, roles: Tensor, student: TrajEncoder | None, cfg: D2TRConfig,
                       generator: torch.Generator, *, hsic_weight: float | None = None
                       ) -> tuple[RoleEncoder, list[float]]:
    """Role cross-entropy on ``role_steps_per_episode`` random transitions of an agent's episode, plus
    ``hsic_weight · HSIC(r_i, sg[z_i])`` (disentanglement from the student's task embedding of the same
    transitions; skipped without a student or with weight 0). ``roles (T, E, N)`` from any labeller."""
    T, E, S, N, Fd = trans.shape
    if roles.shape != (T, E, N):
        raise ValueError(f"roles must have shape {(T, E, N)}, got {tuple(roles.shape)}")
    w = cfg.hsic_weight if hsic_weight is None else hsic_weight
    n_roles = int(roles.max()) + 1
    model = RoleEncoder(Fd, cfg.hidden, cfg.dr, max(n_roles, 2), S).to(trans.device, trans.dtype)
    per = torch.as_tensor(trans.shape[:2]).prod().item() * N
    flat = trans.movedim(3, 2).reshape(per, S, Fd)  # (T·E·N, S, F)
    model.enc.fit_normaliser(model.clocked(flat, torch.arange(S)))
    labels = roles.reshape(per).to(trans.device)
    batch, m = cfg.role_batch, cfg.role_steps_per_episode

    def step(_: int) -> Tensor:
        idx = torch.randint(0, per, (batch,), generator=generator)
        ts = torch.rand(batch, S, generator=generator).argsort(1)[:, :m]
        x = flat[idx.to(trans.device)[:, None], ts.to(trans.device)]  # (batch, m, F)
        r = model(x, ts)
        loss = F.cross_entropy(model.head(r), labels[idx.to(trans.device)])
        if student is not None and w > 0:
            n = cfg.hsic_samples  # HSIC on the first n rows of the batch: only those need the task embedding
            with torch.no_grad():
                z = student(x[:n])
            loss = loss + w * hsic(r[:n], z)
        return loss

    return model, fit(model, step, cfg.role_steps, lr=cfg.lr, schedule="cosine")


class Actor(nn.Module):
    """``π(l | o_i, c_i)``: which landmark to head for (the :func:`~.problems.pd_controller` skill moves there),
    an MLP on the local observation's features (:func:`~.problems.obs_features`) and a conditioning vector
    (task ⊕ role embedding)."""

    def __init__(self, obs_dim: int, cond_dim: int, n_landmarks: int, hidden: int = 64):
        super().__init__()
        feat = obs_dim + 2 * n_landmarks
        self.net = nn.Sequential(nn.Linear(feat + cond_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, n_landmarks))
        self.register_buffer("mu", torch.zeros(feat))
        self.register_buffer("sd", torch.ones(feat))
        self.n_landmarks, self.cond_dim = n_landmarks, cond_dim

    def features(self, obs: Tensor) -> Tensor:
        return obs_features(obs, self.n_landmarks)

    def forward(self, obs: Tensor, cond: Tensor) -> Tensor:
        return self.net(torch.cat([(self.features(obs) - self.mu) / self.sd, cond], -1))


def advantage_weights(rew: Tensor, beta: float, cap: float = 20.0) -> Tensor:
    """Return-weighted BC weights ``min(exp(β·A), cap)`` with ``A`` the return-to-go standardised over the
    episodes of the same task and time step (a Monte-Carlo advantage). ``rew (T, E, S)`` → ``(T, E, S)``."""
    rtg = rew.flip(-1).cumsum(-1).flip(-1)
    a = (rtg - rtg.mean(1, keepdim=True)) / rtg.std(1, keepdim=True).clamp_min(1e-6)
    return torch.exp(beta * a).clamp_max(cap)


def train_actor(ds: Dataset, cond: Tensor, cfg: D2TRConfig, generator: torch.Generator
                ) -> tuple[Actor, list[float]]:
    """Return-weighted behaviour cloning of the behaviour's landmark choice, ``π(l | o_i, cond)``, on every
    (task, episode, step, agent). ``cond (T, E, S, N, C)`` (``C = 0`` for plain BC): the conditioning each
    transition's agent would have had."""
    T, E, S, N = ds.shape
    obs = ds.obs[:, :, :-1]
    actor = Actor(obs.shape[-1], cond.shape[-1], ds.n_landmarks, cfg.hidden).to(obs.device, obs.dtype)
    a = ds.target.reshape(-1)
    o, c = obs.reshape(len(a), obs.shape[-1]), cond.reshape(len(a), cond.shape[-1])
    f = actor.features(o)
    actor.mu.copy_(f.mean(0))
    actor.sd.copy_(f.std(0).clamp_min(1e-3))
    w = advantage_weights(ds.rew, cfg.awr_beta)[..., None].expand(T, E, S, N).reshape(-1)

    def step(_: int) -> Tensor:
        idx = torch.randint(0, len(a), (cfg.policy_batch,), generator=generator).to(o.device)
        ce = F.cross_entropy(actor(o[idx], c[idx]), a[idx], reduction="none")
        return (w[idx] * ce).sum() / w[idx].sum()

    return actor, fit(actor, step, cfg.policy_steps, lr=cfg.lr, schedule="cosine")


# ----------------------------------------------------------------------------------------------------------------
# the conditioned policy (decentralized unless centralized=True)
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class ConditionedPolicy:
    """``π(a | o_i, z_i, r_i)``. ``task_encoder``: None (plain BC), a local encoder (decentralized: agent ``i``'s
    ``z_i`` is computed from agent ``i``'s local context only) or, with ``centralized=True``, the teacher on the
    global context (the oracle: not decentralized). ``role_encoder``: None or a :class:`RoleEncoder` run online on
    the agent's own transitions so far."""

    actor: Actor
    task_encoder: TrajEncoder | None = None
    role_encoder: RoleEncoder | None = None
    centralized: bool = False
    name: str = ""

    def task_embedding(self, local_ctx: Tensor, mask: Tensor, global_ctx: Tensor | None = None) -> Tensor:
        """``(B, N, dz)`` from ``local_ctx (B, N, K, F)`` (each agent's own) or, for the oracle only,
        ``global_ctx (B, K·N, F)`` (the team's transitions); a decentralized policy never reads ``global_ctx``."""
        B, N = local_ctx.shape[:2]
        if self.task_encoder is None:
            return local_ctx.new_zeros(B, N, 0)
        if self.centralized:
            if global_ctx is None:
                raise ValueError("the centralized oracle needs the global context")
            return self.task_encoder(global_ctx, mask.repeat_interleave(N, -1))[:, None, :].expand(B, N, -1)
        return self.task_encoder(local_ctx, mask[:, None, :].expand(B, N, -1))

    def role_embedding(self, history: Tensor | None, B: int, N: int, like: Tensor) -> Tensor:
        """The role encoder on each agent's own transitions so far ``(B, N, t, F)`` (``None`` = none yet)."""
        if self.role_encoder is None:
            return like.new_zeros(B, N, 0)
        if history is None:
            return self.role_encoder.empty(like, (B, N))
        return self.role_encoder(history, torch.arange(history.shape[-2]))

    @torch.no_grad()
    def act(self, obs: Tensor, z: Tensor, r: Tensor) -> Tensor:
        """The landmark each agent heads for (greedy), ``(B, N)``."""
        return self.actor(obs, torch.cat([z, r], -1)).argmax(-1)


def train_d2tr_lite(ds: Dataset, cfg: D2TRConfig, *, role_labeller: Callable[[AgentTrajectories], Tensor] | None
                    = None, teacher: TrajEncoder | None = None) -> dict:
    """Train D²TR-lite on offline data: teacher (unless given), distilled student (``cfg.distill``; otherwise the
    local-only InfoNCE encoder), role encoder on ``role_labeller``'s labels (``cfg.roles``; default
    :func:`scripted_role_labeller`) and the conditioned policy. Returns the parts and their loss curves."""
    g = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    trans = ds.transitions()
    out: dict = {}
    if cfg.distill and teacher is None:
        teacher, out["teacher_loss"] = train_teacher(trans, cfg, g)
    student, out["student_loss"] = train_student(trans, teacher if cfg.distill else None, cfg, g)
    role = None
    if cfg.roles:
        labeller = role_labeller or scripted_role_labeller
        labels = labeller(AgentTrajectories.of(ds))
        role, out["role_loss"] = train_role_encoder(trans, labels, student, cfg, g)
        out["role_labels"] = labels
    cond = conditioning(ds, student, role, cfg, g)
    actor, out["policy_loss"] = train_actor(ds, cond, cfg, g)
    out.update(teacher=teacher, student=student, role=role,
               policy=ConditionedPolicy(actor, student, role, name="D²TR-lite" if cfg.roles else "no roles"))
    return out


@torch.no_grad()
def conditioning(ds: Dataset, task_encoder: TrajEncoder | None, role: RoleEncoder | None, cfg: D2TRConfig,
                 generator: torch.Generator, *, centralized: bool = False) -> Tensor:
    """The conditioning each training transition's agent gets: ``z`` from a ``k_max`` context of the same task
    (other episodes; the agent's own view, or the team's with ``centralized``) and the role embedding of the
    agent's own transitions before ``t`` → ``(T, E, S, N, C)``."""
    trans = ds.transitions()
    T, E, S, N, Fd = trans.shape
    parts = []
    if task_encoder is not None:
        task = torch.arange(T)[:, None].expand(T, E)
        ctx = sample_contexts(trans, task, cfg.k_max, cfg.k_max, generator)
        if centralized:
            z = task_encoder(ctx.glob, ctx.glob_mask())[:, :, None, :].expand(T, E, N, -1)
        else:
            z = task_encoder(ctx.local, ctx.mask[..., None, :].expand(T, E, N, cfg.k_max))
        parts.append(z[:, :, None].expand(T, E, S, N, -1))
    if role is not None:
        pre = role.prefix(trans.movedim(3, 2))[..., :-1, :]  # (T, E, N, S, dr): transitions before t
        parts.append(pre.movedim(3, 2))
    if not parts:
        return trans.new_zeros(T, E, S, N, 0)
    return torch.cat(parts, -1)
