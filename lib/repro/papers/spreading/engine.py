"""Batched tau-leap renewal SIR engine on a graph: many independent replicas advance in lockstep, on any device.

The process (FlashSpread's renewal SIR, the paper's training simulator). Each node is susceptible (S), infectious
(I), recovered (R) or removed by the controller (V, vaccinated). An infectious node infects each susceptible
neighbour at rate ``beta`` (per edge); it recovers at the hazard ``h(a)`` of its age ``a`` in state I (a renewal
process). Time advances in fixed steps ``dt`` (tau-leaping); within a step the infectious set is frozen:

* infection: a susceptible node with ``n`` infectious neighbours is infected in the step with probability
  ``1 − exp(−beta·n·dt)``;
* recovery: an infectious node of age ``a`` recovers in the step with probability ``1 − S(a+dt)/S(a)`` (the exact
  survival ratio; ``rule="hazard"`` gives FlashSpread's ``1 − exp(−h(a)·dt)``), and transmits for the whole step.

Two exact reformulations make a step cheap (no random numbers per node per step), with the same law:

1. Infection by thresholds. Each node draws ``E ~ Exp(1)`` once; its remaining threshold falls by ``beta·n·dt``
   per step and it is infected in the first step where it reaches 0. By memorylessness of ``E`` the probability of
   that, given it has not happened, is ``1 − exp(−beta·n·dt)``: the Bernoulli rule above.
2. Recovery by a drawn period. With the per-step rule, the number of steps ``D`` a node stays infectious has
   ``P(D > k) = Π_j (1 − p_j)``, which the engine tabulates once (:func:`~.hazards.period_survival`) and samples by
   inverse CDF at infection; the node recovers at the end of step ``infected_at + D``.

A step is then: one subtraction over the ``[replicas, nodes]`` thresholds, two comparisons, and an update of the
infectious-neighbour counts ``n`` by scatter-add over the neighbours of the nodes that changed (CSR adjacency), so
the work of the counts is proportional to the events, not to the edges. Replicas whose epidemic died out are
dropped from the working arrays (compaction; FlashSpread does the same), their final state kept.

Control (:meth:`RenewalSIR.step`): at the start of a decision interval, each susceptible node of tier ``k`` is
vaccinated (S → V) with probability ``action[replica, k]``, at most ``budget`` doses per replica and episode (a
uniformly random subset of the chosen nodes when the budget binds). :class:`MarkovSIR` is the exponential special
case (constant recovery rate γ).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx
import numpy as np
import torch
from torch import Tensor

from .hazards import RULES, Exponential, Law, period_survival

SUS, INF, REC, VAC = 0, 1, 2, 3  # node states
N_STATES = 4


@dataclass(frozen=True)
class CSRGraph:
    """An undirected graph as CSR adjacency on a device: ``indptr [N+1]``, ``indices [2E]``, ``degree [N]``; node
    ``i`` is the ``i``-th node of the networkx graph's node order (``nodes``)."""

    indptr: Tensor
    indices: Tensor
    degree: Tensor
    nodes: tuple

    @property
    def n(self) -> int:
        return len(self.nodes)


def csr_graph(graph: nx.Graph, device: torch.device | str = "cpu") -> CSRGraph:
    """CSR adjacency of a networkx graph (self-loops and edge weights are not allowed)."""
    if not isinstance(graph, nx.Graph) or graph.is_directed():
        raise ValueError("the spreading engine needs an undirected networkx.Graph")
    if graph.number_of_nodes() == 0:
        raise ValueError("the graph has no nodes")
    if nx.number_of_selfloops(graph):
        raise ValueError("the graph has self-loops; remove them (a node cannot infect itself)")
    nodes = tuple(graph.nodes)
    A = nx.to_scipy_sparse_array(graph, nodelist=nodes, weight=None, format="csr")
    A.sort_indices()
    dev = torch.device(device)
    indptr = torch.as_tensor(A.indptr.astype(np.int64), device=dev)
    return CSRGraph(indptr=indptr, indices=torch.as_tensor(A.indices.astype(np.int64), device=dev),
                    degree=indptr[1:] - indptr[:-1], nodes=nodes)


@dataclass
class StepResult:
    """Per replica over one decision interval: new infections and doses given (both ``[R]``, int64)."""

    new_infections: Tensor
    doses: Tensor


class RenewalSIR:
    """Batched renewal SIR on a graph (see the module docstring). ``reset(replicas)`` seeds the replicas,
    ``step(action, dt)`` advances them by one decision interval, ``run()`` to extinction.

    ``beta``: transmission rate per edge; ``infectious_period``: a :class:`~.hazards.Law`; ``dt``: the tau-leap step
    (≤ 0.1 recommended: the bias of the final size grows ∝ dt); ``tiers``: node tier ``[N]`` (default: one tier),
    the action's resolution; ``budget``: doses per replica and episode (``None``: unlimited).
    """

    def __init__(self, graph: nx.Graph | CSRGraph, beta: float, infectious_period: Law, *, dt: float = 0.1,
                 rule: str = "exact", tiers: Tensor | np.ndarray | None = None, budget: int | None = None,
                 device: torch.device | str = "cpu"):
        if not (isinstance(beta, int | float) and math.isfinite(beta) and beta > 0):
            raise ValueError(f"beta must be a finite positive transmission rate, got {beta!r}")
        if not isinstance(infectious_period, Law):
            raise TypeError("infectious_period must be a repro.papers.spreading.hazards.Law")
        if not (isinstance(dt, int | float) and 0 < dt <= 1):
            raise ValueError(f"dt must be in (0, 1], got {dt!r}")
        if rule not in RULES:
            raise ValueError(f"unknown recovery rule {rule!r}; use one of {RULES}")
        if budget is not None and (int(budget) != budget or budget < 0):
            raise ValueError(f"budget must be a non-negative integer or None, got {budget!r}")
        self.device = torch.device(device)
        self.graph = graph if isinstance(graph, CSRGraph) else csr_graph(graph, self.device)
        if self.graph.indptr.device != self.device:
            raise ValueError("the CSR graph lives on another device than the engine")
        self.N = self.graph.n
        self.beta, self.law, self.dt, self.rule = float(beta), infectious_period, float(dt), rule
        self.budget = None if budget is None else int(budget)
        t = torch.zeros(self.N, dtype=torch.long) if tiers is None else torch.as_tensor(tiers, dtype=torch.long)
        if t.shape != (self.N,) or (t < 0).any():
            raise ValueError(f"tiers must be non-negative integers, one per node ({self.N}), "
                             f"got shape {tuple(t.shape)}")
        self.tiers = t.to(self.device)
        self.K = int(self.tiers.max()) + 1
        surv = period_survival(infectious_period, self.dt, rule)
        # inverse-CDF table of D >= 1: P(D <= k) = 1 - P(D > k) for k = 1..L
        self._period_cdf = (1.0 - surv[1:]).to(self.device, torch.float32)
        self.replicas = 0

    # ----------------------------------------------------------------------------------------------- set-up
    def reset(self, replicas: int, *, initial: Tensor | np.ndarray | None = None, thresholds: Tensor | None = None,
              period_quantiles: Tensor | None = None, seed: int | None = None) -> None:
        """Start ``replicas`` epidemics at time 0: every node susceptible except the ``initial`` ones (``[R]`` or
        ``[R, n0]`` node indices; default one uniformly random node per replica). ``thresholds`` ``[R, N]``: the
        nodes' Exp(1) infection thresholds; ``period_quantiles`` ``[R, N]``: the U(0, 1) quantiles of their infectious
        periods (a node is infected at most once, so drawing them up front changes nothing). Without control, an
        outbreak is a deterministic function of these and the initial nodes: pass the same ones to several
        engines or policies for common random numbers. ``seed`` seeds the engine's own generator (default: drawn
        from torch's global generator)."""
        if not (isinstance(replicas, int) and replicas >= 1):
            raise ValueError(f"replicas must be a positive int, got {replicas!r}")
        R_, N, dev = replicas, self.N, self.device
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        self.gen = torch.Generator(device=dev).manual_seed(int(seed))
        if initial is None:
            initial = torch.randint(0, N, (R_, 1), generator=self.gen, device=dev)
        initial = torch.as_tensor(initial, dtype=torch.long, device=dev)
        initial = initial[:, None] if initial.ndim == 1 else initial
        if initial.ndim != 2 or initial.shape[0] != R_ or (initial < 0).any() or (initial >= N).any():
            raise ValueError(f"initial must hold node indices in [0, {N}) for each of the {R_} replicas")
        if thresholds is None:
            E = torch.empty(R_, N, device=dev).exponential_(generator=self.gen)
        else:
            if thresholds.shape != (R_, N) or torch.isnan(thresholds).any() or (thresholds < 0).any():
                raise ValueError(f"thresholds must be a non-negative [{R_}, {N}] tensor without NaN")
            E = thresholds.to(dev, torch.float32)
        if period_quantiles is None:
            U = torch.rand(R_, N, generator=self.gen, device=dev)
        else:
            bad = torch.isnan(period_quantiles).any() or (period_quantiles < 0).any() or (period_quantiles >= 1).any()
            if period_quantiles.shape != (R_, N) or bad:
                raise ValueError(f"period_quantiles must be a [{R_}, {N}] tensor of values in [0, 1)")
            U = period_quantiles.to(dev, torch.float32)
        self._U = U
        self.replicas = R_
        # remaining infection threshold in units of beta*dt (a step subtracts the integer count n exactly);
        # +inf once the node is no longer susceptible
        self._E = E / (self.beta * self.dt)
        self._n = torch.zeros(R_, N, device=dev)  # infectious neighbours (float32, exact integers)
        self._state = torch.zeros(R_, N, dtype=torch.int8, device=dev)
        # the infectious nodes, an unordered list in a growable buffer: (flat working index row*N + node, the step
        # at whose end it recovers); entries [0, _m) are live
        self._inf = torch.zeros(max(1024, 4 * R_), 2, dtype=torch.long, device=dev)
        self._m = 0
        self._rows = torch.arange(R_, device=dev)  # working row -> replica id
        self._counts = torch.zeros(R_, self.K, N_STATES, device=dev)  # last known per-tier counts (all replicas)
        self._doses = torch.zeros(R_, dtype=torch.long, device=dev)
        self.steps = 0
        flat = torch.unique((torch.arange(R_, device=dev)[:, None] * N + initial).reshape(-1))  # once per node
        self._infect(flat)
        self._neighbour_update(flat, len(flat))
        self._record_counts()

    @property
    def t(self) -> float:
        """Simulated time."""
        return self.steps * self.dt

    # ----------------------------------------------------------------------------------------------- events
    def _periods(self, flat: Tensor) -> Tensor:
        """Number of steps the nodes at ``flat`` stay infectious: inverse CDF of the tabulated law at their
        period quantiles."""
        d = torch.searchsorted(self._period_cdf, self._U.view(-1)[flat], right=True) + 1
        return d.clamp_(max=len(self._period_cdf))

    def _infect(self, flat: Tensor) -> None:
        """Nodes at flat working indices ``flat`` become infectious at the end of the current step."""
        self._E.view(-1)[flat] = math.inf
        self._state.view(-1)[flat] = INF
        k, m = len(flat), self._m
        if m + k > len(self._inf):  # grow the buffer geometrically
            buf = torch.zeros(max(2 * len(self._inf), m + k), 2, dtype=torch.long, device=self.device)
            buf[:m] = self._inf[:m]
            self._inf = buf
        self._inf[m:m + k] = torch.stack([flat, self._periods(flat) + self.steps], 1)
        self._m = m + k

    def _pop_due(self) -> Tensor:
        """Remove and return the flat indices of the infectious nodes that recover at the end of this step. The
        list stays unordered: the due slots are refilled with live entries from its tail (swap-remove)."""
        m = self._m
        due = self._inf[:m, 1] == self.steps
        idx = torch.nonzero(due).squeeze(1)
        k = len(idx)
        if k == 0:
            return idx
        flat = self._inf[idx, 0]
        holes = idx[idx < m - k]  # due slots that survive the truncation
        movers = torch.nonzero(~due[m - k:]).squeeze(1) + (m - k)  # live entries beyond the new end
        self._inf[holes] = self._inf[movers]
        self._m = m - k
        return flat

    def _neighbour_update(self, flat: Tensor, n_plus: int) -> None:
        """``n[row, j] += 1`` for every neighbour ``j`` of the first ``n_plus`` events (new infections) and
        ``−= 1`` for the rest (recoveries): one scatter-add over the CSR rows of the nodes involved."""
        node = flat % self.N
        deg = self.graph.degree[node]
        rep = torch.repeat_interleave(deg)  # event index of each (event, neighbour) pair
        if rep.numel() == 0:
            return
        start = self.graph.indptr[node] - (torch.cumsum(deg, 0) - deg)  # CSR start minus the event's first slot
        nbr = self.graph.indices[start[rep] + torch.arange(rep.numel(), device=self.device)]
        sign = torch.where(rep < n_plus, 1.0, -1.0) if n_plus < len(flat) else torch.ones(len(rep), device=self.device)
        self._n.view(-1).index_add_(0, (flat - node)[rep] + nbr, sign)

    def _threshold_scan(self) -> Tensor:
        """``E -= n`` (thresholds fall by beta*n*dt) and the flat indices where a threshold went below 0. On CPU the
        two dense passes run on NumPy views of the same memory: torch's single-threaded comparison and nonzero
        kernels were 3-6x slower than NumPy's here (measured on [1000, 1000])."""
        if self.device.type == "cpu":
            E = self._E.numpy()
            np.subtract(E, self._n.numpy(), out=E)
            return torch.from_numpy(np.flatnonzero(E < 0))
        self._E.sub_(self._n)
        return torch.nonzero((self._E < 0).view(-1)).squeeze(1)

    def _substep(self) -> None:
        """One tau-leap step of length dt (the infectious set frozen within it)."""
        self.steps += 1
        # infection: thresholds fall by beta * n * dt; a susceptible node whose threshold crosses 0 is infected
        inf = self._threshold_scan()
        # recovery: nodes whose drawn period ends with this step (they transmitted during it)
        rec = self._pop_due()
        if len(rec):
            self._state.view(-1)[rec] = REC
        if len(inf):
            self._infect(inf)
        if len(inf) or len(rec):
            self._neighbour_update(torch.cat([inf, rec]) if len(rec) else inf, len(inf))

    # ----------------------------------------------------------------------------------------------- state
    def _live_rows(self) -> Tensor:
        """``[Ra]`` bool: working rows that still hold an infectious node."""
        return torch.bincount(self._inf[: self._m, 0] // self.N, minlength=len(self._rows)) > 0

    def _record_counts(self, rows: Tensor | None = None) -> None:
        """Per-tier state counts of the working rows (default all) into the all-replica buffer."""
        state = self._state if rows is None else self._state[rows]
        ids = self._rows if rows is None else self._rows[rows]
        Ra = len(ids)
        if Ra == 0:
            return
        idx = (torch.arange(Ra, device=self.device)[:, None] * (self.K * N_STATES)
               + (self.tiers * N_STATES)[None, :] + state.long())
        c = torch.bincount(idx.reshape(-1), minlength=Ra * self.K * N_STATES).view(Ra, self.K, N_STATES)
        self._counts[ids] = c.to(self._counts.dtype)

    def _compact(self) -> None:
        """Drop working rows whose epidemic is over (their final counts are kept)."""
        live = self._live_rows()
        if bool(live.all()):
            return
        self._record_counts(torch.nonzero(~live).squeeze(1))
        for name in ("_E", "_U", "_n", "_state", "_rows"):
            setattr(self, name, getattr(self, name)[live])
        # renumber the rows of the infectious list (extinct rows hold none)
        new_row = torch.cumsum(live.long(), 0) - 1
        flat = self._inf[: self._m, 0]
        node = flat % self.N
        self._inf[: self._m, 0] = new_row[flat // self.N] * self.N + node

    def tier_counts(self) -> Tensor:
        """``[R, K, 4]`` node counts per tier and state (S, I, R, V), all replicas."""
        self._record_counts()
        return self._counts.clone()

    @property
    def alive(self) -> Tensor:
        """``[R]`` bool: the replica still has infectious nodes."""
        out = torch.zeros(self.replicas, dtype=torch.bool, device=self.device)
        out[self._rows] = self._live_rows()
        return out

    def final_size(self) -> Tensor:
        """``[R]`` fraction of nodes ever infected (I + R) at the current time."""
        c = self.tier_counts()
        return c[..., INF:REC + 1].sum((1, 2)) / self.N

    def doses_given(self) -> Tensor:
        """``[R]`` doses given so far in the episode."""
        return self._doses.clone()

    # ----------------------------------------------------------------------------------------------- control
    def _vaccinate(self, action: Tensor) -> None:
        act = torch.as_tensor(action, dtype=torch.float32, device=self.device)
        if act.ndim == 1:
            act = act[None, :].expand(self.replicas, -1)
        if act.shape != (self.replicas, self.K):
            raise ValueError(f"action must be [{self.replicas}, {self.K}] (replicas x tiers) or [{self.K}], "
                             f"got {tuple(act.shape)}")
        if torch.isnan(act).any() or (act < 0).any() or (act > 1).any():
            raise ValueError("actions are vaccination probabilities and must lie in [0, 1]")
        act = act[self._rows]
        # only replicas that are alive, have doses left and a non-zero action draw anything
        need = self._live_rows() & (act.amax(1) > 0)
        if self.budget is not None:
            need &= self._doses[self._rows] < self.budget
        rows = torch.nonzero(need).squeeze(1)
        if len(rows) == 0:
            return
        p = act[rows][:, self.tiers]  # [rows, N]
        u = torch.rand(p.shape, generator=self.gen, device=self.device)
        chosen = (self._state[rows] == SUS) & (u < p)
        if self.budget is not None:
            left = self.budget - self._doses[self._rows[rows]]
            over = chosen.sum(1) > left
            if bool(over.any()):
                # keep a uniformly random subset of `left` chosen nodes: rank them by u/p, which is uniform on
                # [0, 1) given that the node was chosen and independent of the choice
                key = torch.where(chosen[over], u[over] / p[over].clamp(min=1e-12), 2.0)
                order = torch.sort(key, dim=1, stable=True).indices
                keep = torch.arange(self.N, device=self.device)[None, :] < left[over][:, None]
                sub = torch.zeros_like(chosen[over]).scatter_(1, order, keep)
                chosen[over] = sub & chosen[over]
        r, i = torch.nonzero(chosen, as_tuple=True)
        r = rows[r]
        self._E[r, i] = math.inf
        self._state[r, i] = VAC
        self._doses.index_add_(0, self._rows[r], torch.ones_like(r))

    def step(self, action: Tensor | np.ndarray | None = None, dt: float = 1.0) -> StepResult:
        """Apply ``action`` (``[R, K]`` or ``[K]`` vaccination probabilities per tier; ``None``: no control) and
        advance every replica by ``dt`` (a multiple of the engine's tau-leap step). Replicas already extinct
        stay as they are and get no doses."""
        if self.replicas == 0:
            raise RuntimeError("call reset() before step()")
        n_sub = round(dt / self.dt)
        if n_sub < 1 or abs(n_sub * self.dt - dt) > 1e-9 * max(1.0, dt):
            raise ValueError(f"dt={dt!r} must be a positive multiple of the engine step {self.dt}")
        doses0 = self._doses.clone()
        if action is not None:
            self._vaccinate(action)
        new = torch.zeros(self.replicas, dtype=torch.long, device=self.device)
        if len(self._rows) == 0:
            self.steps += n_sub
            return StepResult(new_infections=new, doses=self._doses - doses0)
        sus0 = (self._state == SUS).sum(1)
        for _ in range(n_sub):
            self._substep()
        new[self._rows] = sus0 - (self._state == SUS).sum(1)
        self._compact()
        return StepResult(new_infections=new, doses=self._doses - doses0)

    def run(self, tmax: float = math.inf, *, chunk: float = 1.0) -> Tensor:
        """Advance without control until every epidemic is over (or ``tmax``); return the final sizes ``[R]``."""
        if self.replicas == 0:
            raise RuntimeError("call reset() before run()")
        while len(self._rows) and self.t < tmax - 1e-12:
            left = round((tmax - self.t) / self.dt) * self.dt if math.isfinite(tmax) else chunk
            self.step(None, min(chunk, left))
        return self.final_size()


class MarkovSIR(RenewalSIR):
    """The Markov SIR model: :class:`RenewalSIR` with exponential infectious periods (recovery rate ``gamma``)."""

    def __init__(self, graph: nx.Graph | CSRGraph, beta: float, gamma: float, **kwargs):
        super().__init__(graph, beta, Exponential(gamma), **kwargs)
