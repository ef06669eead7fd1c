"""The Discrete Cube MDP of paper 07, solved exactly, and the control tasks of its evaluation.

An ``n × n`` grid holds an agent and two cubes (red, blue); the agent may carry one cube. Six actions: UP/DOWN
(``y ± 1``), LEFT/RIGHT (``x ∓ 1``, ``x + 1``), moves clipped at the border; PICK (empty-handed, standing on a cube)
and PLACE (carrying, on a cell without a cube). A goal is a target colour and a cell; it is reached when the
target cube lies on the floor at that cell. Everything is enumerated: states in the released code's order (so its
seeded task sampler draws the same tasks), a successor table, the exact distance to success of every
(state, goal) pair by a backward sweep over the whole table at once, the optimal action distribution ``π*`` and the
value ``V = −distance``. Checked against ``discrete-cube/grid_two_cube_bayes_entropy_pipeline.py`` of
github.com/action-sufficient/action-sufficient (our own code, written from its rules).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["ACTIONS", "DiscreteCube", "Tasks"]

Tensor = torch.Tensor

ACTIONS = ("UP", "DOWN", "LEFT", "RIGHT", "PICK", "PLACE")
UP, DOWN, LEFT, RIGHT, PICK, PLACE = range(6)
HOLD_NONE, HOLD_RED, HOLD_BLUE = 0, 1, 2
RED, BLUE = 1, 2  # goal target colours (the released code's codes)
OFF = -1  # coordinate of a carried cube


def _cells(n: int, device: torch.device | str) -> Tensor:
    """All cells ``(x, y)`` with ``x`` outer and ``y`` inner, shape ``(n², 2)``."""
    xs, ys = torch.meshgrid(torch.arange(n, device=device), torch.arange(n, device=device), indexing="ij")
    return torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=1)


def _enumerate_states(n: int, device: torch.device | str) -> Tensor:
    """States ``(ax, ay, rx, ry, bx, by, holding)``, shape ``(S, 7)``: for each agent cell, first both cubes on the
    floor (red outer, blue inner, distinct cells), then carrying red (blue on any cell), then carrying blue."""
    cells = _cells(n, device)
    C = len(cells)
    r, b = torch.meshgrid(torch.arange(C, device=device), torch.arange(C, device=device), indexing="ij")
    r, b = r.reshape(-1), b.reshape(-1)
    keep = r != b
    off = torch.full((C, 2), OFF, device=device, dtype=cells.dtype)
    none = torch.cat([cells[r[keep]], cells[b[keep]], torch.zeros(int(keep.sum()), 1, dtype=cells.dtype,
                                                                   device=device)], 1)
    red = torch.cat([off, cells, torch.full((C, 1), HOLD_RED, device=device, dtype=cells.dtype)], 1)
    blue = torch.cat([cells, off, torch.full((C, 1), HOLD_BLUE, device=device, dtype=cells.dtype)], 1)
    block = torch.cat([none, red, blue], 0)  # (B, 5): rx, ry, bx, by, holding
    agent = cells.repeat_interleave(len(block), dim=0)
    return torch.cat([agent, block.repeat(C, 1)], 1)


@dataclass(frozen=True)
class Tasks:
    """Control tasks: start state, goal and the task's own horizon ``min(d* + margin, cap)``."""

    state: Tensor
    goal: Tensor
    horizon: Tensor

    def __len__(self) -> int:
        return len(self.state)


class DiscreteCube:
    """The two-cube grid MDP of paper 07, exactly: ``states (S, 7)``, ``goals (G, 3)``, ``succ (S, 6)``,
    ``success (S, G)``, ``dist (S, G)`` (−1 if unreachable), ``valid (S, G)`` (the pairs the paper averages over).

    Sizes: ``n = 3`` has 810 states, 18 goals and 11 088 valid pairs; ``n = 4`` has 4352 states and 32 goals.
    """

    def __init__(self, n: int, *, device: torch.device | str = "cpu"):
        if not isinstance(n, int) or n < 2:
            raise ValueError(f"grid size n must be an int >= 2 (three distinct cells are needed), got {n!r}")
        self.n = n
        self.device = torch.device(device)
        self.states = _enumerate_states(n, self.device)
        self.goals = torch.cat([
            torch.cat([torch.full((n * n, 1), t, device=self.device, dtype=torch.long), _cells(n, self.device)], 1)
            for t in (RED, BLUE)])
        self._lookup = torch.full((self._radix(),), -1, dtype=torch.long, device=self.device)
        self._lookup[self._code(self.states)] = torch.arange(len(self.states), device=self.device)
        self.succ = self._successors()
        self.success = self._success()
        self.dist = self.distances()
        self.valid = self._valid()

    # ---------------------------------------------------------------- enumeration and dynamics
    @property
    def num_states(self) -> int:
        return len(self.states)

    @property
    def num_goals(self) -> int:
        return len(self.goals)

    def _radix(self) -> int:
        n = self.n
        return n * n * (n + 1) ** 4 * 3

    def _code(self, st: Tensor) -> Tensor:
        """Mixed-radix code of states ``(..., 7)`` (cube coordinates shifted by one so that OFF is 0)."""
        n, m = self.n, self.n + 1
        ax, ay, rx, ry, bx, by, h = st.unbind(-1)
        return (((((ax * n + ay) * m + rx + 1) * m + ry + 1) * m + bx + 1) * m + by + 1) * 3 + h

    def index_of(self, st: Tensor) -> Tensor:
        """Index of each state row ``(..., 7)``; raises if a row is not a state of this MDP."""
        idx = self._lookup[self._code(st)]
        if (idx < 0).any():
            raise ValueError("not a state of this Discrete Cube")
        return idx

    def _successors(self) -> Tensor:
        """``succ[s, a]``: the next state. Moves are clipped; PICK lifts the cube under an empty-handed agent;
        PLACE drops the carried cube on the agent's cell unless the other cube lies there; otherwise no change."""
        n, st = self.n, self.states
        ax, ay, rx, ry, bx, by, h = st.unbind(-1)
        nxt = st[:, None, :].repeat(1, 6, 1)
        nxt[:, UP, 1] = (ay + 1).clamp(max=n - 1)
        nxt[:, DOWN, 1] = (ay - 1).clamp(min=0)
        nxt[:, LEFT, 0] = (ax - 1).clamp(min=0)
        nxt[:, RIGHT, 0] = (ax + 1).clamp(max=n - 1)
        on_red = (h == HOLD_NONE) & (ax == rx) & (ay == ry)
        on_blue = (h == HOLD_NONE) & (ax == bx) & (ay == by)
        pick = nxt[:, PICK]
        pick[on_red, 2:4] = OFF
        pick[on_red, 6] = HOLD_RED
        pick[on_blue, 4:6] = OFF
        pick[on_blue, 6] = HOLD_BLUE
        place = nxt[:, PLACE]
        put_red = (h == HOLD_RED) & ~((ax == bx) & (ay == by))
        put_blue = (h == HOLD_BLUE) & ~((ax == rx) & (ay == ry))
        place[put_red, 2] = ax[put_red]
        place[put_red, 3] = ay[put_red]
        place[put_blue, 4] = ax[put_blue]
        place[put_blue, 5] = ay[put_blue]
        place[put_red | put_blue, 6] = HOLD_NONE
        return self.index_of(nxt)

    def _success(self) -> Tensor:
        """``success[s, g]``: the target cube lies on the floor at the goal cell."""
        st, g = self.states[:, None, :], self.goals[None, :, :]
        red = (g[..., 0] == RED) & (st[..., 6] != HOLD_RED) & (st[..., 2] == g[..., 1]) & (st[..., 3] == g[..., 2])
        blue = (g[..., 0] == BLUE) & (st[..., 6] != HOLD_BLUE) & (st[..., 4] == g[..., 1]) & (st[..., 5] == g[..., 2])
        return red | blue

    def _valid(self) -> Tensor:
        """The paper's filter: empty-handed, red, blue and goal cells are distinct; carrying, the agent, the cube
        on the floor and the goal cells are distinct (success pairs are excluded by either rule)."""
        st, g = self.states[:, None, :], self.goals[None, :, :]
        h = st[..., 6]
        gx, gy = g[..., 1], g[..., 2]
        ne = lambda x1, y1, x2, y2: (x1 != x2) | (y1 != y2)  # noqa: E731
        none = ne(st[..., 2], st[..., 3], gx, gy) & ne(st[..., 4], st[..., 5], gx, gy)
        fx = torch.where(h == HOLD_RED, st[..., 4], st[..., 2])  # the cube still on the floor
        fy = torch.where(h == HOLD_RED, st[..., 5], st[..., 3])
        held = ne(st[..., 0], st[..., 1], fx, fy) & ne(st[..., 0], st[..., 1], gx, gy) & ne(fx, fy, gx, gy)
        return torch.where(h == HOLD_NONE, none, held)

    # ---------------------------------------------------------------- exact solution
    def distances(self) -> Tensor:
        """Exact steps-to-success of every pair, all goals at once: ``d = 0`` on success, then
        ``d(s) = k + 1`` for every unlabelled ``s`` with a successor at ``k`` (a backward breadth-first sweep).
        Unreachable pairs keep −1."""
        dist = torch.where(self.success, 0, -1)
        k = 0
        while True:
            nxt = dist[self.succ.reshape(-1)].reshape(self.num_states, 6, self.num_goals)
            new = (dist < 0) & (nxt == k).any(dim=1)
            if not new.any():
                return dist
            dist = torch.where(new, k + 1, dist)
            k += 1

    def values(self) -> Tensor:
        """``V(s, g) = −d(s, g)`` (the released code's convention; unreachable pairs get −10⁹)."""
        return torch.where(self.dist >= 0, -self.dist, -10**9)

    def optimal_action_dist(self, dtype: torch.dtype = torch.float64) -> Tensor:
        """``π*(a | s, g)``, shape ``(S, G, 6)``: uniform over the actions that lower the distance by one; at a
        success or unreachable pair all mass on UP (the released code's convention; such pairs never act)."""
        if getattr(self, "_pi", None) is not None:
            return self._pi.to(dtype=dtype, copy=True)
        d = self.dist
        nd = d[self.succ.reshape(-1)].reshape(self.num_states, 6, self.num_goals).permute(0, 2, 1)
        good = (nd == (d - 1)[..., None]) & (d > 0)[..., None]
        none = ~good.any(-1)
        good[..., UP] |= none
        good = good.to(torch.float64)
        self._pi = good / good.sum(-1, keepdim=True)
        return self._pi.to(dtype=dtype, copy=True)

    def valid_pairs(self) -> tuple[Tensor, Tensor]:
        """``(state_idx, goal_idx)`` of the valid pairs, state-major (the released code's row order)."""
        s, g = torch.nonzero(self.valid, as_tuple=True)
        return s, g

    def pair_features(self, s: Tensor | None = None, g: Tensor | None = None) -> dict[str, Tensor]:
        """Integer features of pairs (default: the valid pairs) that the paper's representations are built from:
        ``holding``, ``target``, the target's effective position (the agent's when carried), the offsets
        agent→target ``dx1, dy1`` and target→goal ``dx2, dy2``, their L1 lengths ``d_at, d_bg``, and ``V``."""
        if s is None or g is None:
            s, g = self.valid_pairs()
        st, go = self.states[s], self.goals[g]
        ax, ay, rx, ry, bx, by, h = st.unbind(-1)
        t, gx, gy = go.unbind(-1)
        is_red = t == RED
        carried = ((h == HOLD_RED) & is_red) | ((h == HOLD_BLUE) & ~is_red)
        tx = torch.where(carried, ax, torch.where(is_red, rx, bx))
        ty = torch.where(carried, ay, torch.where(is_red, ry, by))
        dx1, dy1, dx2, dy2 = tx - ax, ty - ay, gx - tx, gy - ty
        return {"s": s, "g": g, "holding": h, "target": t, "dx1": dx1, "dy1": dy1, "dx2": dx2, "dy2": dy2,
                "d_at": dx1.abs() + dy1.abs(), "d_bg": dx2.abs() + dy2.abs(), "V": self.values()[s, g]}

    def one_hot(self, s: Tensor, g: Tensor, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """Network inputs for learned representations: one-hot state (agent x, y; red x, y; blue x, y with an
        extra "carried" slot; holding) and one-hot goal (target, x, y)."""
        n = self.n
        st, go = self.states[s], self.goals[g]
        sizes = [n, n, n + 1, n + 1, n + 1, n + 1, 3]
        shift = torch.tensor([0, 0, 1, 1, 1, 1, 0], device=self.device)
        parts = [torch.nn.functional.one_hot(st[:, i] + shift[i], k) for i, k in enumerate(sizes)]
        gparts = [torch.nn.functional.one_hot(go[:, 0] - 1, 2), torch.nn.functional.one_hot(go[:, 1], n),
                  torch.nn.functional.one_hot(go[:, 2], n)]
        return torch.cat(parts, 1).to(dtype), torch.cat(gparts, 1).to(dtype)

    # ---------------------------------------------------------------- evaluation tasks
    def sample_tasks(self, num: int, rng: np.random.Generator, *, margin: int = 6, cap: int = 30) -> Tasks:
        """The released evaluation's tasks: an empty-handed start state and a goal drawn uniformly (``rng.choice``
        then ``rng.integers``, in that order), rejected when already solved or unreachable; horizon
        ``min(d* + margin, cap)``. With the same seed this draws the released code's tasks."""
        if num < 1:
            raise ValueError(f"need at least one task, got {num}")
        empty = torch.nonzero(self.states[:, 6] == HOLD_NONE).squeeze(1).cpu().numpy()
        dist = self.dist.cpu().numpy()
        out: list[tuple[int, int, int]] = []
        attempts = 0
        while len(out) < num:
            attempts += 1
            if attempts > 100 * num:
                raise RuntimeError("could not draw enough solvable tasks")
            s, g = int(rng.choice(empty)), int(rng.integers(0, self.num_goals))
            if dist[s, g] <= 0:
                continue
            out.append((s, g, min(int(dist[s, g]) + margin, cap)))
        arr = torch.tensor(out, dtype=torch.long, device=self.device)
        return Tasks(state=arr[:, 0], goal=arr[:, 1], horizon=arr[:, 2])
