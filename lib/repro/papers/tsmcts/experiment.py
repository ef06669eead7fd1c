"""The notebook's harness: operators at matched model calls on sets of mazes, and the statistics behind the claims.

A :class:`Problem` is one set of mazes (one block-diagonal model, its roots, exact ``V*``/``Q*`` and the
imperfect network). :func:`run_operator` runs one operator at one depth for every (root, seed) pair in a single
batched call and keeps per-(root, seed) arrays; :func:`depth_study` runs several operators over depths and
**asserts that all of them used the same number of model calls per root** at each depth. The summary helpers
turn runs into the numbers the notebook plots and claims.

Evidence. The claims are decided over **roots**: :func:`per_root` reduces a run to one number per root (the mean
over that root's independent searches, or the spread of its root value over them), :func:`pooled` concatenates
the roots of several maze sets, and the notebook hands these per-root items to the book's bootstrap
(:mod:`repro.common.stats` through :mod:`repro.evidence`). Ratios of means (:func:`ratio_of_means`) and
differences of depths (:func:`depth_gain`) are paired by root.
"""

from __future__ import annotations

import functools
import math
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ...common import stats
from ...common.seeding import derive
from ...common.timing import Timer
from .method import SearchResult, smc_search, smcts_search, tsmcts_search
from .problems import MazeSuite, Network, make_maze_suite, make_network, value_iteration

__all__ = ["FIELDS", "OPERATORS", "DepthStudy", "OperatorRun", "Problem", "depth_gain", "depth_study",
           "distinct_call_counts", "improved_fraction", "improvement_z", "make_problem", "mctx_run", "mean_regret",
           "per_root", "per_set", "pooled", "prior_greedy_regret", "ratio_of_means", "regret_se", "run_operator",
           "sh_bracket", "value_spread", "z_score"]


def _sh_mc(model, net, roots, n_particles, depth, tau=math.inf, **kw) -> SearchResult:  # noqa: ANN001
    """Sequential Halving over plain rollouts: TSMCTS with no twist, hence no resampling (``tau`` ignored)."""
    return tsmcts_search(model, net, roots, n_particles, depth, tau=math.inf, **kw)


def _mc(model, net, roots, n_particles, depth, tau=math.inf, **kw) -> SearchResult:  # noqa: ANN001
    """Plain Monte Carlo: SMC with no twist, hence no resampling (``tau`` ignored); the control that tells what
    the twist and resampling do to SMC's estimates."""
    return smc_search(model, net, roots, n_particles, depth, tau=math.inf, **kw)


OPERATORS: dict[str, Callable[..., SearchResult]] = {
    "SMC": smc_search, "SMCTS": smcts_search, "TSMCTS": tsmcts_search, "SH-MC": _sh_mc, "MC": _mc}
_NO_M = ("SMC", "MC")  # operators without considered root actions


@dataclass(frozen=True)
class Problem:
    """One set of mazes: the merged model, its roots, exact values and the network the searches use
    (``net`` in the search dtype); ``hard`` marks roots where the prior's greedy action is suboptimal."""

    suite: MazeSuite
    seed: int
    V: torch.Tensor  # (S,) float64, exact
    Q: torch.Tensor  # (S, A) float64, exact
    net: Network
    sigma_v: float
    hard: np.ndarray

    @property
    def roots(self) -> torch.Tensor:
        return self.suite.roots

    @property
    def n_roots(self) -> int:
        return int(self.suite.roots.numel())


@functools.lru_cache(maxsize=16)
def _suite_and_values(count: int, n: int, seed: int, roots_per_maze: int, min_distance: int
                      ) -> tuple[MazeSuite, torch.Tensor, torch.Tensor]:
    """The mazes and their exact values in float64 on the CPU, cached: problems that differ only in the network's
    noise or the dtype share them (never mutated)."""
    suite = make_maze_suite(count, n, roots_per_maze, min_distance, seed)
    return (suite, *value_iteration(suite.model))


def make_problem(count: int, n: int = 8, seed: int = 0, sigma_v: float = 0.3, roots_per_maze: int = 2,
                 min_distance: int = 6, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
                 ) -> Problem:
    """``count`` mazes of size ``n`` from ``seed``, with ``roots_per_maze`` roots each and the network of
    :func:`repro.papers.tsmcts.make_network` (value noise ``sigma_v``, from the stream
    ``derive(seed, "value-noise")``)."""
    suite, V, Q = _suite_and_values(count, n, seed, roots_per_maze, min_distance)
    net = make_network(suite.model, V, Q, sigma_v, seed=derive(seed, "value-noise"))
    model = suite.model.to(device, dtype)
    suite = MazeSuite(suite.mazes, model, suite.roots.to(device), suite.maze_of_root, suite.offsets)
    Qr = Q[suite.roots.cpu()]
    greedy = net.logits[suite.roots.cpu()].argmax(-1)
    hard = (Qr.max(-1).values - Qr.gather(1, greedy[:, None])[:, 0] > 1e-9).numpy()
    return Problem(suite, seed, V.to(device), Q.to(device), net.to(device, dtype), sigma_v, hard)


def prior_greedy_regret(problem: Problem, sample: bool = False) -> float:
    """Mean regret over the problem's roots of acting on the prior without search: greedily, or (``sample``)
    by sampling from it (the fair baseline for operators that act through Gumbel noise)."""
    Q = problem.Q[problem.roots]
    logits = problem.net.logits[problem.roots]
    if sample:
        return float((Q.max(-1).values - (torch.softmax(logits.double(), -1) * Q).sum(-1)).mean())
    return float((Q.max(-1).values - Q.gather(1, logits.argmax(-1, keepdim=True))[:, 0]).mean())


@dataclass
class OperatorRun:
    """One operator at one depth on every (root, seed): arrays of shape (roots, seeds)."""

    op: str
    depth: int
    tau: float
    regret: np.ndarray
    value: np.ndarray
    improvement: np.ndarray
    ancestors: np.ndarray
    resamples: np.ndarray
    covered0: np.ndarray | None
    ess_trace: np.ndarray  # (rounds, K), mean over roots and seeds
    model_calls: int
    seconds: float
    compile_seconds: float = 0.0


def _generator(device: torch.device | str, *key: object) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(zlib.crc32(repr(key).encode()))


def _score(problem: Problem, res: SearchResult, n_seeds: int) -> dict[str, np.ndarray]:
    roots = problem.roots.repeat(n_seeds)
    Q = problem.Q[roots]
    V = Q.max(-1).values
    prior = torch.softmax(problem.net.logits[roots].double(), -1)
    regret = V - Q.gather(1, res.action[:, None])[:, 0]
    improvement = (res.policy.double() * Q).sum(-1) - (prior * Q).sum(-1)

    def grid(x: torch.Tensor) -> np.ndarray:
        return x.double().reshape(n_seeds, -1).T.cpu().numpy()

    return {"regret": grid(regret), "value": grid(res.value), "improvement": grid(improvement)}


def run_operator(problem: Problem, op: str, depth: int, tau: float, n_seeds: int, n_particles: int = 32, m: int = 4,
                 seed: int = 0, ess_threshold: float = 0.5) -> OperatorRun:
    """Operator ``op`` (a key of :data:`OPERATORS`) at ``depth`` with ``n_particles``, ``n_seeds`` independent
    searches from every root, in one batched call (its generator seeded from the arguments)."""
    if op not in OPERATORS:
        raise ValueError(f"unknown operator {op!r}; choose from {sorted(OPERATORS)}")
    roots = problem.roots.repeat(n_seeds)
    gen = _generator(roots.device, seed, problem.seed, op, depth, tau, n_particles, problem.sigma_v)
    kw = {"m": m} if op not in _NO_M else {}
    with Timer(roots.device, sync_start=False) as timer:
        res = OPERATORS[op](problem.suite.model, problem.net, roots, n_particles, depth, tau=tau, generator=gen,
                            ess_threshold=ess_threshold, **kw)
    seconds = timer.seconds
    d = res.diagnostics
    out = _score(problem, res, n_seeds)

    def grid(x: torch.Tensor) -> np.ndarray:
        return x.double().reshape(n_seeds, -1).T.cpu().numpy()

    return OperatorRun(op, depth, tau, out["regret"], out["value"], out["improvement"], grid(d.unique_ancestors),
                       grid(d.resamples), None if d.covered_round0 is None else grid(d.covered_round0),
                       d.ess_trace.double().mean(0).cpu().numpy(), d.model_calls, seconds)


@dataclass
class DepthStudy:
    """Operators × depths on one problem at one twist temperature: ``runs[(op, K)]``."""

    tau: float
    depths: list[int]
    ops: list[str]
    runs: dict[tuple[str, int], OperatorRun]

    def curve(self, op: str, stat: Callable[[OperatorRun], float]) -> np.ndarray:
        return np.array([stat(self.runs[(op, k)]) for k in self.depths])


def depth_study(problem: Problem, ops: Sequence[str], depths: Sequence[int], tau: float, n_seeds: int,
                n_particles: int = 32, m: int = 4, seed: int = 0) -> DepthStudy:
    """Every operator at every depth; raises AssertionError if two operators used different model-call counts
    at the same depth (the comparison is at matched model calls, ``N · K`` per search)."""
    runs = {(op, k): run_operator(problem, op, k, tau, n_seeds, n_particles, m, seed) for k in depths for op in ops}
    for k in depths:
        calls = {op: runs[(op, k)].model_calls for op in ops}
        assert len(set(calls.values())) == 1 and calls[ops[0]] == n_particles * k, \
            f"model calls differ at depth {k}: {calls}"
    return DepthStudy(tau, list(depths), list(ops), runs)


def mctx_run(problem: Problem, num_simulations: int, n_seeds: int, m: int = 4, seed: int = 0) -> OperatorRun:
    """Gumbel MuZero (mctx) from every root, scored like :func:`run_operator`. Two batched calls of ``n_seeds``
    searches per root: the first compiles (``compile_seconds``: compile and run), the second is timed
    (``seconds``); both count, so the arrays hold ``2 · n_seeds`` searches per root."""
    from .reference import gumbel_mcts_reference

    roots = problem.roots.repeat(n_seeds)
    out, times = [], []
    for key in (derive(seed, "mctx-compile"), derive(seed, "mctx")):
        t0 = time.perf_counter()
        res = gumbel_mcts_reference(problem.suite.model, problem.net, roots, num_simulations, m, key)
        times.append(time.perf_counter() - t0)
        out.append((_score(problem, res, n_seeds), res.diagnostics))
    cat = {k: np.concatenate([o[0][k] for o in out], 1) for k in ("regret", "value", "improvement")}
    anc = np.concatenate([d.unique_ancestors.double().reshape(n_seeds, -1).T.cpu().numpy() for _, d in out], 1)
    return OperatorRun("Gumbel MCTS (mctx)", num_simulations, math.nan, cat["regret"], cat["value"],
                       cat["improvement"], anc, np.zeros_like(anc), None, np.full((1, 1), np.nan),
                       out[0][1].model_calls, times[1], times[0])


# ------------------------------------------------------------------------------------------------------- statistics
def mean_regret(run: OperatorRun, mask: np.ndarray | None = None) -> float:
    """Mean regret ``V*(s0) − Q*(s0, a)`` over roots (``mask``: a subset) and seeds."""
    r = run.regret if mask is None else run.regret[mask]
    return float(r.mean())


def regret_se(run: OperatorRun, mask: np.ndarray | None = None) -> float:
    """Standard error of :func:`mean_regret` over roots (of each root's seed mean)."""
    return stats.se((run.regret if mask is None else run.regret[mask]).mean(1))


def value_spread(run: OperatorRun) -> float:
    """The root value's spread over seeds: each root's standard deviation over seeds, averaged over roots."""
    return float(stats.sd(run.value, axis=1).mean())


def improved_fraction(run: OperatorRun) -> float:
    """Fraction of roots whose seed-mean ``E_π'Q* − E_πQ*`` is ``>= 0`` (to 1e-12: a tie counts as improved)."""
    return float((run.improvement.mean(1) >= -1e-12).mean())


def improvement_z(run: OperatorRun) -> tuple[float, float]:
    """Mean policy improvement ``E_π'Q* − E_πQ*`` over roots and seeds, and its standard error over roots."""
    items = run.improvement.mean(1)
    return float(items.mean()), stats.se(items)


def sh_bracket(n_particles: int, m: int) -> list[tuple[int, ...]]:
    """The particles per considered action in each Sequential Halving round (for the bracket diagram)."""
    from .method import sequential_halving_schedule

    return sequential_halving_schedule(m, n_particles)


# ------------------------------------------------------------------------------------------------ evidence over roots
FIELDS = ("regret", "improvement", "ancestors", "resamples", "spread")


def per_root(run: OperatorRun, field: str) -> np.ndarray:
    """One number per root of ``run``: the mean over the root's searches of ``regret``, ``improvement``
    (``E_π'Q* − E_πQ*``), ``ancestors`` or ``resamples``; or ``spread``, the standard deviation of the root value
    over the root's searches. These are the items a bootstrap over roots resamples."""
    if field not in FIELDS:
        raise ValueError(f"per_root: field must be one of {FIELDS}, got {field!r}")
    if field == "spread":
        return np.asarray(stats.sd(run.value, axis=1), dtype=float)
    return np.asarray(getattr(run, field), dtype=float).mean(1)


def pooled(studies: Sequence[DepthStudy], op: str, depth: int, field: str) -> np.ndarray:
    """:func:`per_root` of ``op`` at ``depth`` in every study (one per maze set), concatenated: the roots of all
    maze sets as one sample, in the same order for every operator and depth (so that items pair by root)."""
    return np.concatenate([per_root(st.runs[(op, depth)], field) for st in studies])


def per_set(studies: Sequence[DepthStudy], op: str, depth: int, field: str) -> list[float]:
    """The mean over roots of :func:`per_root`, one value per study (maze set), for the notes."""
    return [float(per_root(st.runs[(op, depth)], field).mean()) for st in studies]


def depth_gain(studies: Sequence[DepthStudy], op: str, deep: int, shallow: int) -> np.ndarray:
    """Per root (pooled over the studies): ``op``'s regret at depth ``deep`` minus its regret at ``shallow``.
    Negative: the deeper search, at ``N · deep`` model calls, chooses better actions."""
    return pooled(studies, op, deep, "regret") - pooled(studies, op, shallow, "regret")


def ratio_of_means(a: np.ndarray, b: np.ndarray) -> float:
    """``mean(a) / mean(b)`` for items paired by root (the bootstrap statistic of a ratio of spreads)."""
    return float(np.mean(a) / np.mean(b))


def z_score(items: np.ndarray) -> float:
    """The mean of per-root items over its standard error over roots (:func:`repro.common.stats.se`)."""
    return float(np.mean(items) / stats.se(items))


def distinct_call_counts(runs: Sequence[tuple[int, OperatorRun]]) -> int:
    """The largest number of different model-call counts among runs of the same depth, given as ``(depth, run)``
    pairs (a Gumbel MuZero run of ``N · K`` simulations paired with ``K``): 1 when every comparison is at matched
    model calls."""
    by_depth: dict[int, set[int]] = {}
    for k, r in runs:
        by_depth.setdefault(k, set()).add(r.model_calls)
    return max(len(v) for v in by_depth.values())
