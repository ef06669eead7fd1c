"""Cooperative Navigation with hidden tasks: the environment, the scripted behaviour policy and the offline data.

Our analogue of the CN benchmark of the D²TR paper (MPE ``simple_spread``), vectorised over a batch of worlds
(tasks × episodes) and over agents, in torch so that it runs on any device.

Physics: the MPE rules (``multiagent/core.py`` of the particle environments, e.g. as vendored in
github.com/zhaozijie2022/mg2l, read to check ours): for every agent the force is the action force
(``sensitivity · u``, ``u ∈ {0, ±e_x, ±e_y}``) plus the task's constant **wind** plus the soft contact forces from
the other agents (``F = c · Δp/|Δp| · k·softplus(−(|Δp| − 2·size)/k)``, equal and opposite); then, in this order,
``v ← v(1 − damping) + F/m · dt``, the speed is capped at ``max_speed`` and ``p ← p + v · dt``.

Tasks have two hidden components:

* **wind** (a constant force; an angle on a circle): every agent feels it, so one local transition (action, Δv)
  already reveals it; this is the component a decentralized agent can identify alone;
* **decoy** (which of the ``L = N + 1`` landmarks does *not* pay the shared reward): the team covers the other
  ``N`` landmarks, so one *global* snapshot of a settled team names the decoy, while one agent sees only the
  landmark it covers itself (other agents are visible only within the sight radius). This is the team-centric
  component the paper's distillation is about; it was added after a prototype found the wind alone locally
  identifiable (see the notebook).

Reward (shared, MPE spread): ``r = −Σ_{l ≠ decoy} min_i |p_i − l| − #colliding pairs``.
Local observation of agent ``i`` (``4 + 2L + 3(N−1)`` numbers): own velocity, own position, the relative positions
of the ``L`` landmarks, and for each other agent its relative position and a visibility flag (both zero when it is
farther than ``sight``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

__all__ = [
    "CoopNavEnv", "Dataset", "Physics", "TaskSet", "collect_dataset", "make_tasks", "obs_features", "pd_controller",
    "scripted_policy", "scripted_step",
]

Tensor = torch.Tensor

N_ACTIONS = 5  # MPE discrete moves: no-op, +x, −x, +y, −y
_MOVES = ((0.0, 0.0), (1.0, 0.0), (-1.0, 0.0), (0.0, 1.0), (0.0, -1.0))


@dataclass(frozen=True)
class Physics:
    """MPE constants (``simple_spread``: dt 0.1, damping 0.25, contact force 100, margin 1e-3, agent size 0.15,
    action sensitivity 5); ``max_speed`` 1.5 as in the spec's prototype (MPE spread leaves it unset)."""

    dt: float = 0.1
    damping: float = 0.25
    sensitivity: float = 5.0
    mass: float = 1.0
    size: float = 0.15
    contact_force: float = 100.0
    contact_margin: float = 1e-3
    max_speed: float | None = 1.5


@dataclass(frozen=True)
class TaskSet:
    """A list of tasks: ``wind (T, 2)`` force, ``decoy (T,)`` the landmark that does not pay, ``angle (T,)`` the
    wind direction in degrees, and ``wind_id``/``decoy_id`` class labels of the two components."""

    wind: Tensor
    decoy: Tensor
    angle: Tensor
    wind_id: Tensor

    def __len__(self) -> int:
        return len(self.wind)

    @property
    def decoy_id(self) -> Tensor:
        return self.decoy


def make_tasks(angles_deg: list[float], n_landmarks: int, magnitude: float = 1.0, *,
               device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> TaskSet:
    """All (wind angle × decoy landmark) tasks, wind outer and decoy inner: task ``w · L + d``."""
    if not angles_deg or n_landmarks < 2 or magnitude < 0:
        raise ValueError(f"need angles, n_landmarks >= 2 and magnitude >= 0; got {angles_deg}, {n_landmarks}, "
                         f"{magnitude}")
    ang = torch.tensor(angles_deg, dtype=torch.float64).repeat_interleave(n_landmarks)
    rad = ang * math.pi / 180
    wind = magnitude * torch.stack([torch.cos(rad), torch.sin(rad)], 1)
    decoy = torch.arange(n_landmarks).repeat(len(angles_deg))
    wind_id = torch.arange(len(angles_deg)).repeat_interleave(n_landmarks)
    return TaskSet(wind.to(device, dtype), decoy.to(device), ang.to(device, dtype), wind_id.to(device))


class CoopNavEnv:
    """A batch of Cooperative Navigation worlds: ``batch`` worlds, ``n_agents`` agents, ``n_landmarks`` landmarks.

    ``wind``: a force of shape ``(2,)`` or ``(batch, 2)``; ``decoy``: the non-paying landmark per world
    (``(batch,)`` long, ``-1`` = every landmark pays; default: every landmark pays). State tensors: ``pos``,
    ``vel`` ``(batch, N, 2)``, ``landmarks`` ``(batch, L, 2)``.
    """

    def __init__(self, n_agents: int, n_landmarks: int, wind: Tensor | tuple[float, float], batch: int, *,
                 decoy: Tensor | None = None, sight: float = 0.5, physics: Physics | None = None,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        if n_agents < 1 or n_landmarks < 1 or batch < 1:
            raise ValueError(f"need n_agents, n_landmarks, batch >= 1; got {n_agents}, {n_landmarks}, {batch}")
        self.n, self.L, self.batch = n_agents, n_landmarks, batch
        self.device, self.dtype = torch.device(device), dtype
        self.phys = physics or Physics()
        self.sight = float(sight)
        w = torch.as_tensor(wind, dtype=dtype, device=self.device)
        if w.shape not in ((2,), (batch, 2)) or not torch.isfinite(w).all():
            raise ValueError(f"wind must be finite with shape (2,) or ({batch}, 2), got {tuple(w.shape)}")
        self.wind = w.expand(batch, 2).clone()
        d = torch.full((batch,), -1, dtype=torch.long) if decoy is None else torch.as_tensor(decoy)
        if d.shape != (batch,) or int(d.max()) >= n_landmarks or int(d.min()) < -1:
            raise ValueError(f"decoy must have shape ({batch},) with values in [-1, {n_landmarks - 1}]")
        self.decoy = d.to(self.device, torch.long)
        self.moves = torch.tensor(_MOVES, dtype=dtype, device=self.device)
        self.pos = torch.zeros(batch, n_agents, 2, dtype=dtype, device=self.device)
        self.vel = torch.zeros_like(self.pos)
        self.landmarks = torch.zeros(batch, n_landmarks, 2, dtype=dtype, device=self.device)

    @property
    def obs_dim(self) -> int:
        return 4 + 2 * self.L + 3 * (self.n - 1)

    @property
    def paying(self) -> Tensor:
        """``(batch, L)`` mask of the landmarks that pay the reward."""
        ar = torch.arange(self.L, device=self.device)
        return ar[None, :] != self.decoy[:, None]

    def reset(self, generator: torch.Generator | None = None) -> Tensor:
        """Agents and landmarks uniform in ``[-1, 1]²`` (MPE spread), zero velocity; returns the local obs."""
        g = generator if generator is not None else torch.Generator().manual_seed(0)
        self.pos = (2 * torch.rand(self.batch, self.n, 2, generator=g, dtype=torch.float64) - 1).to(
            self.device, self.dtype)
        self.landmarks = (2 * torch.rand(self.batch, self.L, 2, generator=g, dtype=torch.float64) - 1).to(
            self.device, self.dtype)
        self.vel = torch.zeros_like(self.pos)
        return self.observe()

    def set_state(self, pos: Tensor, vel: Tensor, landmarks: Tensor) -> Tensor:
        """Place the worlds in a given state (for tests and hand-made scenes); returns the local obs."""
        for name, t, shape in (("pos", pos, (self.batch, self.n, 2)), ("vel", vel, (self.batch, self.n, 2)),
                               ("landmarks", landmarks, (self.batch, self.L, 2))):
            if tuple(t.shape) != shape or not torch.isfinite(t).all():
                raise ValueError(f"{name} must be finite with shape {shape}, got {tuple(t.shape)}")
        self.pos, self.vel = pos.to(self.device, self.dtype).clone(), vel.to(self.device, self.dtype).clone()
        self.landmarks = landmarks.to(self.device, self.dtype).clone()
        return self.observe()

    def contact_forces(self) -> Tensor:
        """MPE soft contact between every pair of agents, ``(batch, N, 2)`` (equal and opposite per pair)."""
        p = self.phys
        delta = self.pos[:, :, None, :] - self.pos[:, None, :, :]  # p_a − p_b
        dist = delta.norm(dim=-1)
        eye = torch.eye(self.n, dtype=torch.bool, device=self.device)
        safe = torch.where(eye, torch.ones_like(dist), dist).clamp_min(1e-9)
        # penetration = k · log(1 + exp(−(dist − dist_min)/k)), the MPE "softmax penetration"
        pen = p.contact_margin * torch.nn.functional.softplus(-(safe - 2 * p.size) / p.contact_margin)
        f = p.contact_force * delta / safe[..., None] * pen[..., None]
        return f.masked_fill(eye[None, :, :, None], 0.0).sum(2)

    def step(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        """Apply discrete actions ``(batch, N)``; returns ``(local obs, shared reward (batch,))``."""
        if actions.shape != (self.batch, self.n):
            raise ValueError(f"actions must have shape ({self.batch}, {self.n}), got {tuple(actions.shape)}")
        if int(actions.min()) < 0 or int(actions.max()) >= N_ACTIONS:
            raise ValueError(f"actions must lie in [0, {N_ACTIONS - 1}]")
        p = self.phys
        # forces: action (sensitivity · u) + the task's wind + contacts
        force = p.sensitivity * self.moves[actions.to(self.device)] + self.wind[:, None, :] + self.contact_forces()
        # MPE integrate_state: damp, accelerate, cap the speed, move
        vel = self.vel * (1 - p.damping) + force / p.mass * p.dt
        if p.max_speed is not None:
            speed = vel.norm(dim=-1, keepdim=True)
            vel = torch.where(speed > p.max_speed, vel / speed.clamp_min(1e-12) * p.max_speed, vel)
        self.vel = vel
        self.pos = self.pos + vel * p.dt
        return self.observe(), self.reward()

    def reward(self) -> Tensor:
        """Shared reward: ``−Σ_{paying l} min_i |p_i − l| − #(colliding pairs)``."""
        d = (self.pos[:, :, None, :] - self.landmarks[:, None, :, :]).norm(dim=-1)  # (B, N, L)
        cover = (d.min(1).values * self.paying).sum(1)
        dd = (self.pos[:, :, None, :] - self.pos[:, None, :, :]).norm(dim=-1)
        pairs = torch.triu(dd < 2 * self.phys.size, diagonal=1).sum((1, 2))
        return -(cover + pairs.to(self.dtype))

    def observe(self) -> Tensor:
        """Local observations ``(batch, N, obs_dim)`` (see the module docstring)."""
        lm = (self.landmarks[:, None, :, :] - self.pos[:, :, None, :]).flatten(2)
        rel = self.pos[:, None, :, :] - self.pos[:, :, None, :]  # rel[b, i, j] = p_j − p_i
        others = ~torch.eye(self.n, dtype=torch.bool, device=self.device)
        rel = rel[:, others].view(self.batch, self.n, self.n - 1, 2)
        vis = (rel.norm(dim=-1, keepdim=True) <= self.sight).to(self.dtype)
        return torch.cat([self.vel, self.pos, lm, (rel * vis).flatten(2), vis.flatten(2)], -1)


def _assignments(n_agents: int, targets: int, device: torch.device) -> Tensor:
    """Every injective map agents → target slots, ``(P, N)``."""
    return torch.tensor(list(itertools.permutations(range(targets), n_agents)), dtype=torch.long, device=device)


def _targets_assignment(env: CoopNavEnv) -> Tensor:
    """Global rule: the assignment of agents to distinct paying landmarks with the least total distance (all
    injective maps enumerated at once) → ``(batch, N)`` landmark index per agent."""
    B, N, L = env.batch, env.n, env.L
    if (env.decoy >= 0).all():  # paying slots: 0..L−2, shifted past the decoy
        slots = torch.arange(L - 1, device=env.device)[None, :]
        paying = slots + (slots >= env.decoy[:, None]).long()
    elif (env.decoy < 0).all():
        paying = torch.arange(L, device=env.device)[None, :].expand(B, L)
    else:
        raise ValueError("the assignment rule needs a decoy in every world or in none")
    if paying.shape[1] < N:
        raise ValueError(f"the assignment rule needs as many paying landmarks ({paying.shape[1]}) as agents ({N})")
    tgt_pos = torch.gather(env.landmarks, 1, paying[..., None].expand(*paying.shape, 2))
    dist = (env.pos[:, :, None, :] - tgt_pos[:, None, :, :]).norm(dim=-1)  # (B, N, targets)
    perms = _assignments(N, paying.shape[1], env.device)  # (P, N)
    cost = dist[:, torch.arange(N, device=env.device)[None, :], perms].sum(-1)  # (B, P)
    return torch.gather(paying, 1, perms[cost.argmin(1)])


def _targets_local(env: CoopNavEnv) -> Tensor:
    """Decentralized rule: agent ``i`` heads for the nearest paying landmark that no *visible* agent (within
    ``sight``) is closer to; if every paying landmark is claimed, the nearest paying one. Uses only what agent
    ``i`` observes, plus which landmark is the decoy."""
    d = (env.pos[:, :, None, :] - env.landmarks[:, None, :, :]).norm(dim=-1)  # (B, N, L)
    gap = (env.pos[:, :, None, :] - env.pos[:, None, :, :]).norm(dim=-1)  # (B, N, N)
    eye = torch.eye(env.n, dtype=torch.bool, device=env.device)
    visible = (gap <= env.sight) & ~eye
    claimed = (visible[..., None] & (d[:, None, :, :] < d[:, :, None, :])).any(2)  # (B, i, l): a visible j closer
    cost = d + 100.0 * (~env.paying)[:, None, :] + 10.0 * claimed
    return cost.argmin(-1)


def scripted_policy(env: CoopNavEnv, eps: Tensor | float, generator: torch.Generator, *, rule: str = "local"
                    ) -> Tensor:
    """The behaviour policy of the offline data: it knows the decoy, not the wind.

    Each step every agent picks a target landmark, by the decentralized ``rule="local"`` (nearest paying
    landmark not claimed by a closer visible agent; what a decentralized policy that knows the task can imitate)
    or the centralized ``rule="assignment"`` (least-total-distance matching, the spec's Hungarian rule); then a
    PD-like discrete controller (``des = target − pos − 0.3·vel``, move along its larger axis; no-op within
    0.02); with probability ``eps`` (per world, or a scalar) a uniformly random action. Returns ``(batch, N)``.
    """
    return scripted_step(env, eps, generator, rule=rule)[0]


def scripted_step(env: CoopNavEnv, eps: Tensor | float, generator: torch.Generator, *, rule: str = "local"
                  ) -> tuple[Tensor, Tensor]:
    """:func:`scripted_policy` that also returns the chosen target landmarks: ``(actions, targets)``."""
    B, N = env.batch, env.n
    if rule == "local":
        target = _targets_local(env)
    elif rule == "assignment":
        target = _targets_assignment(env)
    else:
        raise ValueError(f"rule must be 'local' or 'assignment', got {rule!r}")
    greedy = pd_controller(env, target)
    e = torch.as_tensor(eps, dtype=torch.float64).expand(B).reshape(B, 1)
    explore = torch.rand(B, N, generator=generator, dtype=torch.float64) < e
    rand = torch.randint(0, N_ACTIONS, (B, N), generator=generator)
    return torch.where(explore.to(env.device), rand.to(env.device), greedy), target


def pd_controller(env: CoopNavEnv, target: Tensor) -> Tensor:
    """The low-level skill: a discrete PD-like move towards landmark ``target (batch, N)``:
    ``des = l − p − 0.3·v``, move along its larger axis (no-op within 0.02). Wind-unaware."""
    B, N = env.batch, env.n
    if target.shape != (B, N) or int(target.min()) < 0 or int(target.max()) >= env.L:
        raise ValueError(f"targets must have shape ({B}, {N}) with values in [0, {env.L - 1}]")
    tgt = torch.gather(env.landmarks, 1, target.to(env.device)[..., None].expand(B, N, 2))
    des = tgt - env.pos - 0.3 * env.vel
    ax = des.abs().argmax(-1)
    sign = torch.gather(des, -1, ax[..., None])[..., 0] < 0
    greedy = 1 + 2 * ax + sign.long()  # +x → 1, −x → 2, +y → 3, −y → 4
    return torch.where(des.norm(dim=-1) < 0.02, torch.zeros_like(greedy), greedy)


def obs_features(obs: Tensor, n_landmarks: int) -> Tensor:
    """A local observation plus its landmark distances and their softmin (temperature 0.1): the policy's and the
    probes' input (a function of the observation, no extra information)."""
    lm = obs[..., 4:4 + 2 * n_landmarks].unflatten(-1, (n_landmarks, 2)).norm(dim=-1)
    return torch.cat([obs, lm, torch.softmax(-lm / 0.1, -1)], -1)


def transition_features(obs: Tensor, act: Tensor, rew: Tensor, nxt: Tensor, n_landmarks: int) -> Tensor:
    """One agent's view of a transition: ``(o_i, onehot a_i, r, o_i' − o_i, distances to the L landmarks at o_i')``
    (``obs``, ``nxt`` ``(..., N, D)``, ``act`` ``(..., N)``, shared ``rew`` ``(...)``). The distances are a
    function of ``o_i'`` (a convenience feature for the small encoders, not extra information)."""
    a = torch.nn.functional.one_hot(act, N_ACTIONS).to(obs.dtype)
    r = rew[..., None, None].expand(*act.shape, 1)
    dist = nxt[..., 4:4 + 2 * n_landmarks].unflatten(-1, (n_landmarks, 2)).norm(dim=-1)
    return torch.cat([obs, a, r, nxt - obs, dist], -1)


@dataclass
class Dataset:
    """Offline multi-task data: ``obs (T, E, S+1, N, D)`` local observations, ``act (T, E, S, N)``,
    ``rew (T, E, S)`` shared rewards, ``eps (T, E)`` the behaviour's noise level, ``target (T, E, S, N)`` the
    landmark the behaviour was heading for, and the tasks."""

    tasks: TaskSet
    obs: Tensor
    act: Tensor
    rew: Tensor
    eps: Tensor
    n_landmarks: int
    target: Tensor

    @property
    def shape(self) -> tuple[int, int, int, int]:
        T, E, S, N = self.act.shape
        return T, E, S, N

    def transitions(self) -> Tensor:
        """Local transition features ``(T, E, S, N, F)``: ``(o_i, onehot a_i, r, o_i' − o_i, |l − p_i'|)``."""
        return transition_features(self.obs[:, :, :-1], self.act, self.rew, self.obs[:, :, 1:], self.n_landmarks)

    def episodes(self, idx: slice) -> Dataset:
        """The same tasks restricted to the episodes ``idx`` (e.g. a train / held-out split)."""
        return Dataset(self.tasks, self.obs[:, idx], self.act[:, idx], self.rew[:, idx], self.eps[:, idx],
                       self.n_landmarks, self.target[:, idx])


def collect_dataset(tasks: TaskSet, episodes: int, steps: int, *, n_agents: int = 3, n_landmarks: int | None = None,
                    eps_levels: tuple[float, ...] = (0.1, 0.3, 0.5), sight: float = 0.5, rule: str = "local",
                    seed: int = 0, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> Dataset:
    """Roll the scripted behaviour policy in every task at once (``tasks × episodes`` worlds).

    Each episode draws its noise level ``eps`` uniformly from ``eps_levels`` (a medium/poor mixture). The same
    ``seed`` gives the same data on every device (all randomness is drawn on the CPU).
    """
    if episodes < 1 or steps < 1 or len(tasks) < 1:
        raise ValueError(f"need tasks, episodes >= 1 and steps >= 1; got {len(tasks)}, {episodes}, {steps}")
    L = n_landmarks if n_landmarks is not None else int(tasks.decoy.max()) + 1
    g = torch.Generator().manual_seed(seed)
    T, B = len(tasks), len(tasks) * episodes
    env = CoopNavEnv(n_agents, L, tasks.wind.repeat_interleave(episodes, 0), B,
                     decoy=tasks.decoy.repeat_interleave(episodes, 0).cpu(), sight=sight, device=device, dtype=dtype)
    levels = torch.tensor(eps_levels, dtype=torch.float64)
    eps = levels[torch.randint(0, len(levels), (B,), generator=g)]
    obs = [env.reset(g)]
    acts, rews, tgts = [], [], []
    for _ in range(steps):
        a, tgt = scripted_step(env, eps, g, rule=rule)
        o, r = env.step(a)
        obs.append(o)
        acts.append(a)
        rews.append(r)
        tgts.append(tgt)
    shape = (T, episodes)
    return Dataset(tasks, torch.stack(obs, 1).reshape(*shape, steps + 1, n_agents, -1),
                   torch.stack(acts, 1).reshape(*shape, steps, n_agents),
                   torch.stack(rews, 1).reshape(*shape, steps), eps.reshape(shape).to(device, dtype), L,
                   torch.stack(tgts, 1).reshape(*shape, steps, n_agents))
