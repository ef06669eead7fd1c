"""Test problems for the search operators: deterministic tabular MDPs with exact ``Q*`` and an imperfect "network".

A :class:`TabularModel` is the simulator that search queries (the paper's learned/true model ``step(s, a)``);
because it is tabular, :func:`value_iteration` gives the exact ``V*`` and ``Q*`` against which regret and
policy improvement are measured. :func:`make_maze` generates one gridworld maze; :func:`make_maze_suite` merges
many of them into one block-diagonal model (one batched search over all their roots). :func:`make_network`
turns ``Q*``/``V*`` into the prior logits and value estimates that search must correct (``Network``).

Everything is torch so that the search cores run on any device; generation uses NumPy generators (seeded).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import numpy as np
import torch

__all__ = ["Maze", "MazeSuite", "Network", "TabularModel", "make_maze", "make_maze_suite", "make_network",
           "value_iteration"]

MOVES = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]])  # up, down, left, right


@dataclass(frozen=True)
class TabularModel:
    """A deterministic MDP: ``next_state[s, a]``, ``reward[s, a]``, ``terminal[s]`` (absorbing, zero reward) and
    the discount ``gamma``. :meth:`step` is the batched model call the search operators count."""

    next_state: torch.Tensor  # (S, A) long
    reward: torch.Tensor  # (S, A) float
    terminal: torch.Tensor  # (S,) bool
    gamma: float

    def __post_init__(self) -> None:
        S, A = self.next_state.shape
        if self.reward.shape != (S, A) or self.terminal.shape != (S,):
            raise ValueError(f"TabularModel: reward must be {(S, A)} and terminal {(S,)}, got "
                             f"{tuple(self.reward.shape)} and {tuple(self.terminal.shape)}")
        if not 0.0 <= self.gamma < 1.0:
            raise ValueError(f"TabularModel: gamma must lie in [0, 1), got {self.gamma}")
        if int(self.next_state.min()) < 0 or int(self.next_state.max()) >= S:
            raise ValueError("TabularModel: next_state holds an index outside [0, S)")
        if not torch.isfinite(self.reward).all():
            raise ValueError("TabularModel: reward holds NaN or inf")

    @property
    def n_states(self) -> int:
        return int(self.next_state.shape[0])

    @property
    def n_actions(self) -> int:
        return int(self.next_state.shape[1])

    @property
    def device(self) -> torch.device:
        return self.next_state.device

    def step(self, s: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One batched model call: rewards and next states for same-shaped index tensors ``s`` and ``a``."""
        return self.reward[s, a], self.next_state[s, a]

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> TabularModel:
        return replace(self, next_state=self.next_state.to(device), terminal=self.terminal.to(device),
                       reward=self.reward.to(device=device, dtype=dtype or self.reward.dtype))


@dataclass(frozen=True)
class Network:
    """The search's learned guidance: prior ``logits[s, a]`` and value ``value[s]`` (zero on terminal states)."""

    logits: torch.Tensor  # (S, A)
    value: torch.Tensor  # (S,)

    def __post_init__(self) -> None:
        if self.logits.ndim != 2 or self.value.shape != self.logits.shape[:1]:
            raise ValueError(f"Network: logits must be (S, A) and value (S,), got {tuple(self.logits.shape)} and "
                             f"{tuple(self.value.shape)}")
        if not (torch.isfinite(self.logits).all() and torch.isfinite(self.value).all()):
            raise ValueError("Network: logits or values hold NaN or inf")

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Network:
        return Network(self.logits.to(device=device, dtype=dtype or self.logits.dtype),
                       self.value.to(device=device, dtype=dtype or self.value.dtype))


def value_iteration(model: TabularModel, tol: float = 1e-12, max_iter: int = 100_000) -> tuple[torch.Tensor,
                                                                                                 torch.Tensor]:
    """Exact ``(V*, Q*)`` by value iteration, ``Q(s,a) = r(s,a) + γ V(s')``, ``V = max_a Q`` (terminal: 0),
    in float64 until the sup-norm change is below ``tol``."""
    ns, r = model.next_state.cpu().numpy(), model.reward.double().cpu().numpy()  # small tables: NumPy is fastest
    alive = ~model.terminal.cpu().numpy()
    V = np.zeros(model.n_states)
    for _ in range(max_iter):
        V_new = (r + model.gamma * V[ns]).max(1) * alive
        if np.abs(V_new - V).max() < tol:
            V = torch.as_tensor(V_new, device=model.device)
            return V, torch.as_tensor(r, device=model.device) + model.gamma * V[model.next_state]
        V = V_new
    raise RuntimeError(f"value_iteration did not converge to {tol} in {max_iter} sweeps")


@dataclass(frozen=True)
class Maze:
    """One gridworld: ``walls`` / ``traps`` boolean grids, the ``goal`` cell, the model and BFS distances to the
    goal (``-1``: unreachable). State ``i`` is cell ``(i // n, i % n)``."""

    n: int
    walls: np.ndarray
    traps: np.ndarray
    goal: tuple[int, int]
    model: TabularModel
    distance: np.ndarray


def _bfs(n: int, walls: np.ndarray, traps: np.ndarray, goal: tuple[int, int]) -> np.ndarray:
    """Moves-to-goal from every cell through free cells (traps are terminal: not passed through)."""
    dist = -np.ones((n, n), dtype=int)
    dist[goal] = 0
    queue = deque([goal])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES:
            rr, cc = r + dr, c + dc
            if 0 <= rr < n and 0 <= cc < n and not walls[rr, cc] and not traps[rr, cc] and dist[rr, cc] < 0:
                dist[rr, cc] = dist[r, c] + 1
                queue.append((rr, cc))
    return dist


def make_maze(n: int = 8, trap_frac: float = 0.08, seed: int = 0, wall_frac: float = 0.2, gamma: float = 0.97,
              step_cost: float = 0.01) -> Maze:
    """A random ``n × n`` maze: ``wall_frac`` of the cells are walls, ``trap_frac`` of the free cells traps, the
    goal sits in the bottom-right 2×2 corner. Four deterministic moves (bumping into a wall or the edge stays
    put), reward ``-step_cost`` per step, ``+1`` on entering the goal and ``-1`` on entering a trap, both
    terminal (absorbing, zero reward). Redraws (up to 100 times) until at least one cell can reach the goal."""
    if n < 3:
        raise ValueError(f"make_maze: n must be >= 3, got {n}")
    if not (0 <= trap_frac < 1 and 0 <= wall_frac < 1):
        raise ValueError(f"make_maze: fractions must lie in [0, 1), got trap {trap_frac}, wall {wall_frac}")
    rng = np.random.default_rng(seed)
    for _ in range(100):
        goal = (n - 1 - int(rng.integers(2)), n - 1 - int(rng.integers(2)))
        walls = rng.random((n, n)) < wall_frac
        walls[goal] = False
        free = np.argwhere(~walls)
        traps = np.zeros((n, n), dtype=bool)
        cand = [tuple(x) for x in free if tuple(x) != goal]
        k = int(round(trap_frac * len(cand)))
        for i in rng.choice(len(cand), size=k, replace=False):
            traps[cand[i]] = True
        dist = _bfs(n, walls, traps, goal)
        if (dist > 0).sum() >= 4:
            break
    else:
        raise RuntimeError(f"make_maze: no connected maze in 100 draws (seed {seed})")
    rc = np.stack(np.meshgrid(np.arange(n), np.arange(n), indexing="ij"), -1).reshape(-1, 2)  # (S, 2)
    dest = rc[:, None, :] + MOVES[None]  # (S, A, 2)
    inside = ((dest >= 0) & (dest < n)).all(-1)
    dest = np.where(inside[..., None], dest, rc[:, None, :])
    blocked = walls[dest[..., 0], dest[..., 1]]
    dest = np.where(blocked[..., None], rc[:, None, :], dest)
    nxt = dest[..., 0] * n + dest[..., 1]
    terminal = (traps | (np.arange(n * n).reshape(n, n) == goal[0] * n + goal[1])).reshape(-1)
    reward = np.full(nxt.shape, -step_cost)
    reward = np.where(traps.reshape(-1)[nxt], -1.0, reward)
    reward = np.where(nxt == goal[0] * n + goal[1], 1.0, reward)
    nxt = np.where(terminal[:, None], np.arange(n * n)[:, None], nxt)  # absorbing terminal states
    reward = np.where(terminal[:, None], 0.0, reward)
    model = TabularModel(torch.as_tensor(nxt), torch.as_tensor(reward, dtype=torch.float64),
                         torch.as_tensor(terminal), gamma)
    return Maze(n, walls, traps, goal, model, dist)


@dataclass(frozen=True)
class MazeSuite:
    """Many mazes merged into one block-diagonal model, with the chosen ``roots`` (global state indices),
    ``maze_of_root`` and the ``offsets`` of each maze's states."""

    mazes: list[Maze]
    model: TabularModel
    roots: torch.Tensor
    maze_of_root: np.ndarray
    offsets: np.ndarray


def make_maze_suite(count: int, n: int = 8, roots_per_maze: int = 2, min_distance: int = 6, seed: int = 0,
                    trap_frac: float = 0.08, wall_frac: float = 0.2, gamma: float = 0.97) -> MazeSuite:
    """``count`` mazes (seeds derived from ``seed``) merged block-diagonally; in each, ``roots_per_maze`` root
    states drawn among free non-trap cells at BFS distance ``>= min_distance`` from the goal (mazes with too few
    such cells are redrawn)."""
    if count < 1 or roots_per_maze < 1:
        raise ValueError(f"make_maze_suite: count and roots_per_maze must be >= 1, got {count}, {roots_per_maze}")
    seeds = np.random.default_rng(seed).integers(2**31, size=50 * count)
    mazes, roots, owner, offsets, off, used = [], [], [], [], 0, 0
    while len(mazes) < count:
        if used >= len(seeds):
            raise RuntimeError("make_maze_suite: too few mazes with distant roots; lower min_distance")
        maze = make_maze(n, trap_frac, int(seeds[used]), wall_frac, gamma)
        rng = np.random.default_rng(int(seeds[used]) + 1)
        used += 1
        cells = np.flatnonzero((maze.distance >= min_distance).reshape(-1))
        if len(cells) < roots_per_maze:
            continue
        pick = np.sort(rng.choice(cells, size=roots_per_maze, replace=False))
        roots.extend((pick + off).tolist())
        owner.extend([len(mazes)] * roots_per_maze)
        offsets.append(off)
        mazes.append(maze)
        off += n * n
    model = TabularModel(torch.cat([m.model.next_state + o for m, o in zip(mazes, offsets, strict=True)]),
                         torch.cat([m.model.reward for m in mazes]), torch.cat([m.model.terminal for m in mazes]),
                         gamma)
    return MazeSuite(mazes, model, torch.as_tensor(roots), np.asarray(owner), np.asarray(offsets))


def make_network(model: TabularModel, V: torch.Tensor, Q: torch.Tensor, sigma_v: float, seed: int = 0,
                 sigma_eps: float = 0.05, temperature: float = 0.05) -> Network:
    """The imperfect network of the experiments: prior logits ``(Q* + ε)/T`` with ``ε ~ N(0, sigma_eps²)`` and
    values ``V* + N(0, sigma_v²)``, both noises drawn once per state and fixed (a network's systematic error,
    not fresh noise per query); terminal states keep value 0."""
    if sigma_v < 0 or sigma_eps < 0 or temperature <= 0:
        raise ValueError(f"make_network: need sigma_v, sigma_eps >= 0 and temperature > 0, got {sigma_v}, "
                         f"{sigma_eps}, {temperature}")
    rng = np.random.default_rng(seed)
    eps = torch.as_tensor(rng.normal(0.0, sigma_eps, Q.shape), dtype=Q.dtype, device=Q.device)
    noise = torch.as_tensor(rng.normal(0.0, sigma_v, V.shape), dtype=V.dtype, device=V.device)
    value = torch.where(model.terminal.to(V.device), torch.zeros_like(V), V + noise)
    return Network((Q + eps) / temperature, value)
