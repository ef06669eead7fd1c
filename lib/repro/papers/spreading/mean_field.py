"""The mean-field ODE simulator: the deterministic simplification the paper's "MF-ODE" baseline trains in.

Degree-based (heterogeneous) mean field SIR (Pastor-Satorras & Vespignani; system (5.11) of Kiss, Miller & Simon,
which EoN implements as ``SIR_heterogeneous_meanfield``), with exponential recovery. Nodes are grouped by
(degree ``k_g``, tier); with ``S_g, I_g`` the expected numbers of susceptible and infectious nodes of group ``g`` and
``N_g`` its size,

    Θ = Σ_g k_g I_g / Σ_g k_g N_g,     dS_g/dt = −β k_g S_g Θ,     dI_g/dt = β k_g S_g Θ − γ I_g.

It has no variance and no extinction (the paper's "optimism bias": it replaces E[f(X)] by f(E[X])). Control
mirrors the stochastic engine: at the start of a decision interval a fraction ``action[tier]`` of each group's
susceptibles is vaccinated, scaled down to the remaining budget when it binds (the expectation of the engine's
random subset). Integration: classical RK4, batched over rows (e.g. CEM candidates), on any device.
"""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import torch
from torch import Tensor

from .engine import N_STATES, StepResult

__all__ = ["MeanFieldSIR", "mean_field_ode"]


class MeanFieldSIR:
    """Batched degree-based mean-field SIR on the degree sequence (and tiers) of a graph; ``reset``/``step`` like
    :class:`~.engine.RenewalSIR`, with expected (fractional) counts. ``alive``: at least ``extinct_below``
    expected infectious nodes (default ½ a node)."""

    def __init__(self, graph: nx.Graph | np.ndarray, beta: float, gamma: float, *,
                 tiers: Tensor | np.ndarray | None = None, budget: float | None = None, h: float = 0.1,
                 extinct_below: float = 0.5, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float64):
        for name, v in (("beta", beta), ("gamma", gamma), ("h", h)):
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite positive number, got {v!r}")
        deg = np.array([d for _, d in graph.degree()]) if isinstance(graph, nx.Graph) else np.asarray(graph)
        if deg.ndim != 1 or len(deg) == 0 or (deg < 0).any():
            raise ValueError("need a graph or a non-empty 1-D array of non-negative degrees")
        t = np.zeros(len(deg), dtype=np.int64) if tiers is None else np.asarray(torch.as_tensor(tiers).cpu())
        if t.shape != deg.shape:
            raise ValueError("tiers must give one tier per node")
        self.device, self.dtype = torch.device(device), dtype
        self.N, self.K = len(deg), int(t.max()) + 1
        pairs, size = np.unique(np.stack([deg, t], 1), axis=0, return_counts=True)
        self.k = torch.as_tensor(pairs[:, 0], dtype=dtype, device=self.device)
        self.group_tier = torch.as_tensor(pairs[:, 1], dtype=torch.long, device=self.device)
        self.size = torch.as_tensor(size, dtype=dtype, device=self.device)
        self.stubs = float((self.k * self.size).sum())
        if self.stubs == 0:
            raise ValueError("the graph has no edges")
        self.beta, self.gamma, self.h = float(beta), float(gamma), float(h)
        self.budget = None if budget is None else float(budget)
        self.extinct_below = extinct_below
        self.replicas = 0

    def reset(self, replicas: int, *, initial_infected: float = 1.0) -> None:
        """``replicas`` identical rows, ``initial_infected`` expected infectious nodes spread over the groups in
        proportion to their sizes (one uniformly random initial node)."""
        if not (isinstance(replicas, int) and replicas >= 1):
            raise ValueError(f"replicas must be a positive int, got {replicas!r}")
        if not 0 < initial_infected <= self.N:
            raise ValueError(f"initial_infected must be in (0, {self.N}], got {initial_infected!r}")
        i0 = self.size * (initial_infected / self.N)
        self.S = (self.size - i0).expand(replicas, -1).clone()
        self.I = i0.expand(replicas, -1).clone()
        self.Vac = torch.zeros_like(self.S)
        self._doses = torch.zeros(replicas, dtype=self.dtype, device=self.device)
        self.replicas, self.t = replicas, 0.0

    def _rhs(self, sus: Tensor, inf: Tensor) -> tuple[Tensor, Tensor]:
        theta = (inf * self.k).sum(-1, keepdim=True) / self.stubs  # Θ: infectious fraction of edge stubs
        force = self.beta * self.k * sus * theta
        return -force, force - self.gamma * inf

    def _integrate(self, dt: float) -> None:
        n = max(1, math.ceil(dt / self.h - 1e-9))
        h = dt / n
        sus, inf = self.S, self.I
        for _ in range(n):  # classical RK4
            a1, b1 = self._rhs(sus, inf)
            a2, b2 = self._rhs(sus + 0.5 * h * a1, inf + 0.5 * h * b1)
            a3, b3 = self._rhs(sus + 0.5 * h * a2, inf + 0.5 * h * b2)
            a4, b4 = self._rhs(sus + h * a3, inf + h * b3)
            sus = sus + h / 6 * (a1 + 2 * a2 + 2 * a3 + a4)
            inf = inf + h / 6 * (b1 + 2 * b2 + 2 * b3 + b4)
        self.S, self.I = sus.clamp(min=0), inf.clamp(min=0)

    @property
    def alive(self) -> Tensor:
        return self.I.sum(-1) >= self.extinct_below

    def _vaccinate(self, action: Tensor) -> Tensor:
        act = torch.as_tensor(action, dtype=self.dtype, device=self.device)
        if act.ndim == 1:
            act = act[None, :].expand(self.replicas, -1)
        if act.shape != (self.replicas, self.K):
            raise ValueError(f"action must be [{self.replicas}, {self.K}] or [{self.K}], got {tuple(act.shape)}")
        if torch.isnan(act).any() or (act < 0).any() or (act > 1).any():
            raise ValueError("actions are vaccination probabilities and must lie in [0, 1]")
        dose = act[:, self.group_tier] * self.S * self.alive[:, None]
        if self.budget is not None:
            total = dose.sum(-1)
            left = (self.budget - self._doses).clamp(min=0)
            dose = dose * torch.where(total > left, left / total.clamp(min=1e-300), 1.0)[:, None]
        self.S = self.S - dose
        self.Vac = self.Vac + dose
        given = dose.sum(-1)
        self._doses += given
        return given

    def step(self, action: Tensor | np.ndarray | None = None, dt: float = 1.0) -> StepResult:
        """Vaccinate by ``action`` (if given), then integrate ``dt``; new infections = the fall of S over it."""
        if self.replicas == 0:
            raise RuntimeError("call reset() before step()")
        if not dt > 0:
            raise ValueError(f"dt must be positive, got {dt!r}")
        doses = self._vaccinate(action) if action is not None else torch.zeros_like(self._doses)
        s0 = self.S.sum(-1)
        live = self.alive
        self._integrate(dt)
        self.t += dt
        new = torch.where(live, s0 - self.S.sum(-1), torch.zeros_like(s0))
        return StepResult(new_infections=new, doses=doses)

    def tier_counts(self) -> Tensor:
        """``[R, K, 4]`` expected node counts per tier and state (S, I, R, V)."""
        Rec = self.size - self.S - self.I - self.Vac
        out = torch.zeros(self.replicas, self.K, N_STATES, dtype=self.dtype, device=self.device)
        for c, x in enumerate((self.S, self.I, Rec, self.Vac)):
            out[:, :, c].index_add_(1, self.group_tier, x)
        return out

    def final_size(self) -> Tensor:
        c = self.tier_counts()
        return c[..., 1:3].sum((1, 2)) / self.N

    def doses_given(self) -> Tensor:
        return self._doses.clone()


def mean_field_ode(graph: nx.Graph | np.ndarray, beta: float, gamma: float, times: np.ndarray | list[float], *,
                   initial_infected: float = 1.0, h: float = 0.1, device: torch.device | str = "cpu",
                   ) -> dict[str, np.ndarray]:
    """Solve the degree-based mean-field SIR (no control) and report the fractions S, I, R at ``times``
    (increasing, from 0). Returns ``{"t", "S", "I", "R"}`` as NumPy arrays."""
    times = np.asarray(times, dtype=float)
    if times.ndim != 1 or len(times) == 0 or times[0] < 0 or (np.diff(times) <= 0).any():
        raise ValueError("times must be a non-empty increasing 1-D array of non-negative times")
    mf = MeanFieldSIR(graph, beta, gamma, h=h, device=device)
    mf.reset(1, initial_infected=initial_infected)
    out = np.zeros((len(times), 3))
    t = 0.0
    for j, tj in enumerate(times):
        if tj > t:
            mf.step(None, tj - t)
            t = tj
        c = mf.tier_counts()[0].sum(0).cpu().numpy() / mf.N
        out[j] = c[0], c[1], c[2]
    return {"t": times, "S": out[:, 0], "I": out[:, 1], "R": out[:, 2]}
