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

A step is then: one subtraction and one comparison over the ``[replicas, nodes]`` thresholds (the only dense work,
bound by memory bandwidth), the recoveries due at this step (a comparison over the list of infectious nodes and
their drawn recovery steps), and an update of the infectious-neighbour counts ``n`` by scatter-add over the
neighbours of the nodes that changed (CSR adjacency), so the work of the counts is proportional to the events, not to
the edges. Replicas whose epidemic died out are dropped from the working arrays (compaction; FlashSpread does the
same), their final state kept: at the end of each decision interval, the last live rows moved into the places of the
extinct ones.

Speed (issue 43): the step is written against a dozen array operations (:class:`_TorchKernels`); on CPU they run on
NumPy views of the same tensors (:class:`_NumpyKernels`), since torch's single-threaded CPU kernels for gathers,
``nonzero`` and ``repeat_interleave`` at a step's sizes were 2-6x slower. Both give bit-identical outbreaks (tested),
and the random numbers are drawn as before (all of them in :meth:`RenewalSIR.reset` and the vaccination), so every
outbreak is the one the engine gave before. Measured side by side against the previous engine on one thread (CPU
time, BA graphs, Weibull(3, 5), β = 0.1): 0.64 → 0.31 ms per epidemic at N = 10³ (1024 replicas), 8.6 → 4.5 ms at
10⁴ (256), 66 → 28 ms at 10⁵ (4). Where the time goes and the roofline: ``benchmarks/bench_spreading.py``.

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

__all__ = ["CSRGraph", "MarkovSIR", "RenewalSIR", "StepResult", "csr_graph"]

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


class _TorchKernels:
    """The array operations of a tau-leap step on torch tensors (any device). The step is written against this small
    set, so that on CPU it can run on NumPy views of the same memory (:class:`_NumpyKernels`)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._cache: dict = {}

    def native(self, t: Tensor) -> Tensor:
        return t

    def tensor(self, a: Tensor) -> Tensor:
        return a

    def nonzero(self, mask: Tensor) -> Tensor:
        return torch.nonzero(mask.view(-1)).squeeze(1)

    def scan(self, E: Tensor, n: Tensor) -> Tensor:
        E.sub_(n)
        return self.nonzero(E < 0)

    def take(self, x: Tensor, idx: Tensor) -> Tensor:
        return x.index_select(0, idx)

    def cat(self, a: Tensor, b: Tensor) -> Tensor:
        return torch.cat([a, b])

    def repeat(self, x: Tensor, counts: Tensor, total: int) -> Tensor:
        return torch.repeat_interleave(x, counts, output_size=total)  # the size given: no device sync

    def cumsum(self, x: Tensor) -> Tensor:
        return torch.cumsum(x, 0)

    def arange(self, n: int) -> Tensor:
        return torch.arange(n, device=self.device)

    def searchsorted(self, table: Tensor, v: Tensor) -> Tensor:
        return torch.searchsorted(table, v, right=True)

    def fill(self, x: Tensor, idx: Tensor, value: float) -> None:
        x.index_fill_(0, idx, value)

    def put(self, x: Tensor, idx: Tensor, values: Tensor) -> None:
        x.index_copy_(0, idx, values)

    def scatter_add(self, x: Tensor, idx: Tensor, value: float) -> None:
        x.scatter_add_(0, idx, self._constant(len(idx), value, x.dtype))

    def _constant(self, n: int, value: float, dtype: torch.dtype) -> Tensor:
        """A cached contiguous vector of ``n`` copies of ``value`` (scatter_add_ reads a contiguous source fastest)."""
        buf = self._cache.get((value, dtype))
        if buf is None or len(buf) < n:
            buf = torch.full((max(n, 2 * (0 if buf is None else len(buf))),), value, dtype=dtype, device=self.device)
            self._cache[(value, dtype)] = buf
        return buf[:n]


class _NumpyKernels(_TorchKernels):
    """The same operations on NumPy views of CPU tensors: at the sizes of a step (10³–10⁵ events) torch's
    single-threaded CPU gathers, comparisons, ``nonzero`` and ``repeat_interleave`` were 2-6x slower than NumPy's
    here (measured); the scatter-add stays torch's ``scatter_add_`` (NumPy's ``add.at`` was 50x slower)."""

    def native(self, t: Tensor) -> np.ndarray:
        return t.numpy()

    def tensor(self, a: np.ndarray) -> Tensor:
        return torch.from_numpy(a)

    def nonzero(self, mask: np.ndarray) -> np.ndarray:
        return np.flatnonzero(mask)

    def scan(self, E: np.ndarray, n: np.ndarray) -> np.ndarray:
        np.subtract(E, n, out=E)
        buf = self._cache.get("mask")
        if buf is None or buf.size < E.size:  # a reused mask: a fresh one per step costs page faults
            buf = self._cache["mask"] = np.empty(E.size, dtype=bool)
        mask = buf[: E.size].reshape(E.shape)
        np.less(E, 0, out=mask)
        return np.flatnonzero(mask)

    def take(self, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
        return x[idx]

    def cat(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.concatenate([a, b])

    def repeat(self, x: np.ndarray, counts: np.ndarray, total: int) -> np.ndarray:
        return np.repeat(x, counts)

    def cumsum(self, x: np.ndarray) -> np.ndarray:
        return np.cumsum(x)

    def arange(self, n: int) -> np.ndarray:
        return np.arange(n)

    def searchsorted(self, table: np.ndarray, v: np.ndarray) -> np.ndarray:
        return np.searchsorted(table, v, side="right")

    def fill(self, x: np.ndarray, idx: np.ndarray, value: float) -> None:
        x[idx] = value

    def put(self, x: np.ndarray, idx: np.ndarray, values: np.ndarray) -> None:
        x[idx] = values

    def scatter_add(self, x: np.ndarray, idx: np.ndarray, value: float) -> None:
        t = torch.from_numpy(x)
        t.scatter_add_(0, torch.from_numpy(idx), self._constant(len(idx), value, t.dtype))


class RenewalSIR:
    """Batched renewal SIR on a graph (see the module docstring). ``reset(replicas)`` seeds the replicas,
    ``step(action, dt)`` advances them by one decision interval, ``run()`` to extinction.

    ``beta``: transmission rate per edge; ``infectious_period``: a :class:`~.hazards.Law`; ``dt``: the tau-leap step
    (≤ 0.1 recommended: the bias of the final size grows ∝ dt); ``tiers``: node tier ``[N]`` (default: one tier),
    the action's resolution; ``budget``: doses per replica and episode (``None``: unlimited). ``work`` counts what
    the steps since ``reset`` did (node-updates of the dense scan, events, (event, neighbour) pairs): the
    benchmark's roofline reads it.
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
        self._use_kernels(_NumpyKernels(self.device) if self.device.type == "cpu" else _TorchKernels(self.device))
        self.replicas = 0
        self.work = {"node_updates": 0, "events": 0, "pairs": 0}

    def _use_kernels(self, kernels: _TorchKernels) -> None:
        """The step's array operations (:class:`_TorchKernels` on any device, :class:`_NumpyKernels` on CPU), and
        the CSR arrays and the period table in their native form."""
        self._kernels = kernels
        self._csr = tuple(kernels.native(x) for x in (self.graph.indptr, self.graph.indices, self.graph.degree))
        self._cdf = kernels.native(self._period_cdf)

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
        self._E = E.div_(self.beta * self.dt) if thresholds is None else E / (self.beta * self.dt)
        self._n = torch.zeros(R_, N, device=dev)  # infectious neighbours (float32, exact integers)
        self._state = torch.zeros(R_, N, dtype=torch.int8, device=dev)
        # the infectious nodes, an unordered list in two growable buffers: the flat working index row*N + node,
        # and the step at whose end it recovers; entries [0, _m) are live
        cap = max(1024, 4 * R_)
        self._inf_flat = torch.zeros(cap, dtype=torch.long, device=dev)
        self._inf_due = torch.zeros(cap, dtype=torch.long, device=dev)
        self._m = 0
        self._rows = torch.arange(R_, device=dev)  # working row -> replica id
        self._counts = torch.zeros(R_, self.K, N_STATES, device=dev)  # last known per-tier counts (all replicas)
        self._doses = torch.zeros(R_, dtype=torch.long, device=dev)
        self._new: list = []  # the infections of the current decision interval (flat working indices)
        self.steps = 0
        # the work done since reset, for the benchmark's roofline: threshold updates of the dense scan (working
        # rows x N per step), events (infections and recoveries) and (event, neighbour) pairs of the count updates
        self.work = {"node_updates": 0, "events": 0, "pairs": 0}
        flat = torch.unique((torch.arange(R_, device=dev)[:, None] * N + initial).reshape(-1))  # once per node
        flat = self._kernels.native(flat)
        self._infect(flat)
        self._neighbour_update(flat, len(flat))
        self._record_counts()

    @property
    def t(self) -> float:
        """Simulated time."""
        return self.steps * self.dt

    # ----------------------------------------------------------------------------------------------- events
    # The hot path: written against self._kernels on "native" arrays (NumPy views of the tensors on CPU, the
    # tensors themselves elsewhere); flat indices are row * N + node in the working arrays.
    def _infect(self, flat) -> None:
        """Nodes at flat working indices ``flat`` become infectious at the end of the current step; each is listed
        with the step at whose end it recovers, ``steps + D``, ``D`` the inverse CDF of the tabulated law at its
        period quantile."""
        k = self._kernels
        k.fill(k.native(self._E).reshape(-1), flat, math.inf)
        k.fill(k.native(self._state).reshape(-1), flat, INF)
        due = k.searchsorted(self._cdf, k.take(k.native(self._U).reshape(-1), flat))
        due += self.steps + 1  # D = (number of table entries <= u) + 1, in 1..L since the table ends at 1
        c, m = len(flat), self._m
        if m + c > len(self._inf_flat):  # grow the buffers geometrically
            size = max(2 * len(self._inf_flat), m + c)
            for name in ("_inf_flat", "_inf_due"):
                buf = torch.zeros(size, dtype=torch.long, device=self.device)
                buf[:m] = getattr(self, name)[:m]
                setattr(self, name, buf)
        k.native(self._inf_flat)[m:m + c] = flat
        k.native(self._inf_due)[m:m + c] = due
        self._m = m + c

    def _pop_due(self):
        """Remove and return the flat indices of the infectious nodes that recover at the end of this step. The
        list stays unordered: the due slots are refilled with live entries from its tail (swap-remove)."""
        k, m = self._kernels, self._m
        flat, due_at = k.native(self._inf_flat), k.native(self._inf_due)
        due = due_at[:m] == self.steps
        idx = k.nonzero(due)  # ascending
        c = len(idx)
        if c == 0:
            return idx
        out = k.take(flat, idx)
        movers = k.nonzero(~due[m - c:]) + (m - c)  # live entries beyond the new end
        holes = idx[: len(movers)]  # as many due slots before the new end, the first ones of idx
        k.put(flat, holes, k.take(flat, movers))
        k.put(due_at, holes, k.take(due_at, movers))
        self._m = m - c
        return out

    def _neighbour_update(self, flat, n_plus: int) -> None:
        """``n[row, j] += 1`` for every neighbour ``j`` of the first ``n_plus`` events at ``flat`` (new infections)
        and ``−= 1`` for the rest (recoveries): the (event, neighbour) pairs laid out from the CSR rows of the
        nodes involved, then one scatter-add per sign."""
        k, N, (indptr, indices, degree) = self._kernels, self.N, self._csr
        node = flat % N
        deg = k.take(degree, node)
        end = k.cumsum(deg)  # event i's pairs occupy [end[i] - deg[i], end[i]) of the pair list
        pairs = int(end[-1]) if len(end) else 0
        self.work["events"] += len(flat)
        self.work["pairs"] += pairs
        if pairs == 0:
            return
        slot = k.repeat(k.take(indptr, node) - (end - deg), deg, pairs)  # CSR start minus the event's first pair
        slot += k.arange(pairs)
        target = k.repeat(flat - node, deg, pairs)  # row * N
        target += k.take(indices, slot)
        n = k.native(self._n).reshape(-1)
        split = int(end[n_plus - 1]) if n_plus else 0
        if split:
            k.scatter_add(n, target[:split], 1.0)
        if split < pairs:
            k.scatter_add(n, target[split:], -1.0)

    def _substep(self) -> None:
        """One tau-leap step of length dt (the infectious set frozen within it)."""
        k = self._kernels
        self.steps += 1
        self.work["node_updates"] += self._E.numel()
        # infection: thresholds fall by beta * n * dt; a susceptible node whose threshold crosses 0 is infected
        inf = k.scan(k.native(self._E), k.native(self._n))
        # recovery: nodes whose drawn period ends with this step (they transmitted during it)
        rec = self._pop_due()
        if len(rec):
            k.fill(k.native(self._state).reshape(-1), rec, REC)
        if len(inf):
            self._infect(inf)
            self._new.append(inf)
        if len(inf) and len(rec):
            self._neighbour_update(k.cat(inf, rec), len(inf))
        elif len(inf) or len(rec):
            self._neighbour_update(inf if len(inf) else rec, len(inf))

    # ----------------------------------------------------------------------------------------------- state
    def _live_rows(self) -> Tensor:
        """``[Ra]`` bool: working rows that still hold an infectious node."""
        return torch.bincount(self._inf_flat[: self._m] // self.N, minlength=len(self._rows)) > 0

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
        """Drop the working rows whose epidemic is over (their final counts are kept): the last live rows move into
        the extinct rows' places (so a compaction copies as many rows as died, not every live row) and the arrays
        are cut to the live rows. Working rows are thus not in replica order; nothing depends on it (the
        vaccination draws its random numbers in replica order)."""
        live = self._live_rows()
        Ra, n_live = len(live), int(live.sum())
        if n_live == Ra:
            return
        self._record_counts(torch.nonzero(~live).squeeze(1))
        holes = torch.nonzero(~live[:n_live]).squeeze(1)  # extinct rows among the first n_live
        movers = torch.nonzero(live[n_live:]).squeeze(1) + n_live  # as many live rows beyond them
        for name in ("_E", "_U", "_n", "_state", "_rows"):
            x = getattr(self, name)
            x[holes] = x[movers]
            setattr(self, name, x[:n_live])
        # renumber the rows of the infectious list (extinct rows hold none)
        new_row = torch.arange(Ra, device=self.device)
        new_row[movers] = holes
        flat = self._inf_flat[: self._m]
        node = flat % self.N
        self._inf_flat[: self._m] = new_row[flat // self.N] * self.N + node

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
        rows = rows[torch.argsort(self._rows[rows])]  # in replica order: the draws below do not depend on compaction
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
        self._new = []
        for _ in range(n_sub):
            self._substep()
        if self._new:  # infections per working row, counted from the events
            k = self._kernels
            flat = torch.cat([k.tensor(f) for f in self._new]) if len(self._new) > 1 else k.tensor(self._new[0])
            new[self._rows] = torch.bincount(flat // self.N, minlength=len(self._rows))
            self._new = []
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
