"""The control problem: vaccinate by influence tier during an outbreak, in one of three simulators.

The paper's exact action, reward ("profit") and horizon are not public (its repository was not available; the
README reports profits and "hub retention" only), so this task is **our design**, stated here once and used by the
gymnasium environment, the batched evaluator and the notebook alike:

* one uniformly random initial infectious node; decisions every ``interval`` time units while the outbreak lives,
  until ``horizon``;
* action ``a ∈ [0, 1]^K``: each susceptible node of tier ``k`` is vaccinated (removed) with probability ``a_k``,
  at most ``budget_frac · N`` doses per episode;
* reward per interval ``−(new infections + dose_cost · doses) / N``, so the return is minus the attack rate
  (beyond the initial node) minus the cost of the doses.

Simulators (:data:`SIMULATORS`): ``"renewal"`` (the faithful one: the task's non-exponential infectious period),
``"markov"`` (exponential periods with the same mean) and ``"ode"`` (the degree-based mean-field ODE with that
rate). :class:`SpreadingControlEnv` is the gymnasium view of one episode (for stable-baselines3 agents);
:func:`policy_returns` runs many episodes of many constant-intensity policies at once, with common random numbers
(the same initial nodes and infection thresholds for every policy), for CEM and evaluation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import gymnasium as gym
import networkx as nx
import numpy as np
import torch
from torch import Tensor

from ...common.seeding import derive
from .engine import RenewalSIR
from .hazards import Law, Weibull
from .mean_field import MeanFieldSIR
from .observation import degree_tiers, global_observation, stratified_observation

SIMULATORS = ("renewal", "markov", "ode")
OBSERVERS = ("stratified", "global")


@dataclass(frozen=True)
class ControlTask:
    """The control problem (our design; see the module docstring)."""

    beta: float = 0.1
    law: Law = field(default_factory=lambda: Weibull(3.0, 5.0))
    tiers: int = 4
    interval: float = 1.0
    horizon: float = 100.0
    budget_frac: float | None = 0.1
    dose_cost: float = 1.0
    dt: float = 0.1

    def budget(self, n: int) -> int | None:
        return None if self.budget_frac is None else int(round(self.budget_frac * n))


def make_simulator(graph: nx.Graph, dynamics: str, task: ControlTask, *, tiers: Tensor | None = None,
                   device: torch.device | str = "cpu") -> RenewalSIR | MeanFieldSIR:
    """The simulator ``dynamics`` of :data:`SIMULATORS` for ``task`` on ``graph`` (tiers by degree rank)."""
    if dynamics not in SIMULATORS:
        raise ValueError(f"unknown simulator {dynamics!r}; use one of {SIMULATORS}")
    tiers = degree_tiers(graph, task.tiers, device=device) if tiers is None else tiers
    budget = task.budget(graph.number_of_nodes())
    if dynamics == "ode":
        return MeanFieldSIR(graph, task.beta, 1.0 / task.law.mean, tiers=tiers, budget=budget, device=device)
    law = task.law if dynamics == "renewal" else task.law.markov()
    return RenewalSIR(graph, task.beta, law, dt=task.dt, tiers=tiers, budget=budget, device=device)


def _observe(sim: RenewalSIR | MeanFieldSIR, task: ControlTask, observer: str) -> Tensor:
    counts = sim.tier_counts()
    budget = task.budget(sim.N)
    left = None if budget is None else budget - sim.doses_given()
    fn = stratified_observation if observer == "stratified" else global_observation
    return fn(counts, t=sim.t, horizon=task.horizon, budget_left=left, budget=budget)


def rollout(sim: RenewalSIR | MeanFieldSIR, policy: Tensor | Callable[[Tensor], Tensor], task: ControlTask, *,
            observer: str = "stratified") -> dict[str, Tensor]:
    """Run the episodes already reset in ``sim`` to the end under ``policy``: a ``[R, K]`` (or ``[K]``) tensor of
    constant intensities, or a callable from the ``[R, D]`` observation to ``[R, K]`` actions. Returns per replica
    the ``return``, ``attack`` (final size), ``doses``, ``duration`` and ``hubs_kept`` (the share of the top tier
    never infected)."""
    if observer not in OBSERVERS:
        raise ValueError(f"unknown observer {observer!r}; use one of {OBSERVERS}")
    ret = torch.zeros(sim.replicas, dtype=torch.float64, device=sim.device)
    duration = torch.zeros_like(ret)
    while sim.t < task.horizon - 1e-9:
        alive = sim.alive
        if not bool(alive.any()):
            break
        action = policy(_observe(sim, task, observer)) if callable(policy) else policy
        res = sim.step(action, task.interval)
        ret -= (res.new_infections.double() + task.dose_cost * res.doses.double()) / sim.N
        duration += alive.double() * task.interval
    top = sim.tier_counts()[:, -1].double()  # the hub tier: share never infected (S or V), "hub retention"
    return {"return": ret, "attack": sim.final_size().double(), "doses": sim.doses_given().double(),
            "duration": duration, "hubs_kept": (top[:, 0] + top[:, 3]) / top.sum(-1)}


def crn_draws(n_nodes: int, episodes: int, seed: int, device: torch.device | str = "cpu",
              ) -> tuple[Tensor, Tensor, Tensor]:
    """Common random numbers for ``episodes`` episodes: initial nodes ``[E]``, Exp(1) infection thresholds
    ``[E, N]`` and infectious-period quantiles ``[E, N]`` (see :meth:`~.engine.RenewalSIR.reset`)."""
    g = torch.Generator(device=device).manual_seed(int(seed))
    initial = torch.randint(0, n_nodes, (episodes,), generator=g, device=device)
    thresholds = torch.empty(episodes, n_nodes, device=device).exponential_(generator=g)
    quantiles = torch.rand(episodes, n_nodes, generator=g, device=device)
    return initial, thresholds, quantiles


def policy_returns(graph: nx.Graph, dynamics: str, thetas: Tensor, task: ControlTask, *, episodes: int, seed: int,
                   device: torch.device | str = "cpu", max_batch: int = 4096,
                   sim: RenewalSIR | MeanFieldSIR | None = None) -> dict[str, Tensor]:
    """Returns (and attack, doses) of ``P`` constant-intensity policies ``thetas [P, K]`` over ``episodes``
    episodes each, as ``[P, E]`` tensors. Stochastic simulators use common random numbers across policies
    (episode ``e`` has the same initial node, infection thresholds and period quantiles for every policy, and for
    every simulator given the same ``seed``); the ODE is deterministic (one episode, broadcast to ``E`` columns)."""
    thetas = torch.as_tensor(thetas, dtype=torch.float32, device=device)
    if thetas.ndim != 2:
        raise ValueError(f"thetas must be [policies, tiers], got shape {tuple(thetas.shape)}")
    sim = make_simulator(graph, dynamics, task, device=device) if sim is None else sim
    P = thetas.shape[0]
    if dynamics == "ode":
        sim.reset(P)
        out = rollout(sim, thetas.double(), task)
        return {k: v[:, None].expand(P, episodes) for k, v in out.items()}
    initial, thresholds, quantiles = crn_draws(sim.N, episodes, seed, device)
    per = max(1, max_batch // episodes)
    parts: list[dict[str, Tensor]] = []
    for start in range(0, P, per):
        th = thetas[start:start + per]
        p = th.shape[0]
        sim.reset(p * episodes, initial=initial.repeat(p), thresholds=thresholds.repeat(p, 1),
                  period_quantiles=quantiles.repeat(p, 1), seed=derive(seed, "batch", start))
        parts.append(rollout(sim, th.repeat_interleave(episodes, 0), task))
    return {k: torch.cat([d[k] for d in parts]).view(P, episodes) for k in parts[0]}


class SpreadingControlEnv(gym.Env):
    """Gymnasium environment of one episode of the control task (observation: the stratified observer, or the
    global one; action: ``[0, 1]^K`` vaccination intensities per tier). ``dynamics`` picks the simulator."""

    metadata = {"render_modes": []}

    def __init__(self, graph: nx.Graph, task: ControlTask | None = None, *, dynamics: str = "renewal",
                 observer: str = "stratified", device: torch.device | str = "cpu"):
        if observer not in OBSERVERS:
            raise ValueError(f"unknown observer {observer!r}; use one of {OBSERVERS}")
        self.task = task or ControlTask()
        self.dynamics, self.observer = dynamics, observer
        self.sim = make_simulator(graph, dynamics, self.task, device=device)
        dim = (4 * self.task.tiers if observer == "stratified" else 4) + 1 + (self.task.budget_frac is not None)
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(dim,), dtype=np.float32)
        self.action_space = gym.spaces.Box(0.0, 1.0, shape=(self.task.tiers,), dtype=np.float32)

    def _obs(self) -> np.ndarray:
        o = _observe(self.sim, self.task, self.observer)[0]
        return o.clamp(0.0, 1.0).cpu().numpy().astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if self.dynamics == "ode":
            self.sim.reset(1)
        else:
            self.sim.reset(1, seed=int(self.np_random.integers(0, 2**62)))
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        a = np.asarray(action, dtype=np.float64).reshape(-1)
        if a.shape != (self.task.tiers,) or not np.isfinite(a).all():
            raise ValueError(f"action must be {self.task.tiers} finite numbers, got {action!r}")
        res = self.sim.step(torch.as_tensor(np.clip(a, 0.0, 1.0))[None, :], self.task.interval)
        n = float(res.new_infections[0])
        d = float(res.doses[0])
        reward = -(n + self.task.dose_cost * d) / self.sim.N
        terminated = not bool(self.sim.alive[0])
        truncated = not terminated and self.sim.t >= self.task.horizon - 1e-9
        info = {"new_infections": n, "doses": d, "t": self.sim.t}
        return self._obs(), float(reward), terminated, truncated, info


def hubs_only(K: int) -> Tensor:
    """The heuristic that vaccinates only the top tier (hubs) at full intensity."""
    th = torch.zeros(K)
    th[-1] = 1.0
    return th


def random_allocation(K: int) -> Tensor:
    """The null of :func:`hubs_only`: full intensity in every tier. Whenever the budget is below the number of
    susceptible nodes (10 % of N against a top tier of N/K nodes), it binds at the first decision, and the engine
    keeps a uniformly random subset of the chosen nodes: the same doses at the same time as hubs-only, given to
    nodes drawn without regard to their degree."""
    return torch.ones(K)

