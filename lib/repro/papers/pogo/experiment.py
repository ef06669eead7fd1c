"""Experiment harness of notebook 19: step-for-step agreement with the public code, the learning-rate sweeps of
every optimiser on one problem, the numbers the claims read off them, the contraction of the normal correction
and the time per step against the number of matrices. Functions that draw random numbers take the caller's
generator (or seed) and consume it in a fixed order, so the notebook's numbers do not depend on where the code
lives.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from ...common.numerics import loglog_slope
from ...common.timing import Timer
from .baselines import (
    GEOOPT_METHODS,
    METHODS,
    POGO_METHODS,
    SCALE_METHODS,
    import_pogo_torch,
    make_optimizer,
    stepper,
)
from .method import POGO, Tensor, normal_correction, orthogonality_error, random_stiefel
from .problems import PCAProblem, ProcrustesProblem

__all__ = [
    "DIVERGED", "GAP_FLOOR", "MATCH_DIGITS_CAP", "Contraction", "Trajectory", "best_lrs", "best_summary",
    "claim_numbers", "contraction", "eval_steps", "match_digits", "match_public", "reached", "round_sig",
    "run_method", "scaling_summary", "speed_to_target", "step_clock", "summary_table", "sweep", "time_per_step",
    "time_to_gap",
]

Problem = PCAProblem | ProcrustesProblem
GAP_FLOOR = 1e-6  # float32 iterates: relative gaps below this are at the resolution of the data type
DIVERGED = 10.0  # a run stops once its orthogonality error passes this (or is NaN)


def step_clock(device: torch.device | str) -> tuple[str, Callable[[], float]]:
    """The clock the timings read: on a CPU with one torch thread (quick mode), this thread's CPU time, which a
    machine shared with other jobs does not inflate (there the wall clock also counts the time spent waiting for
    a core, by different factors for short and long calls); otherwise the wall clock (CUDA is synchronised by the
    callers). Returns the clock's name and the function."""
    if torch.device(device).type == "cpu" and torch.get_num_threads() == 1:
        return "CPU time", time.thread_time
    return "wall clock", time.perf_counter


# ---------------------------------------------------------------------------------------------------------
# C1: our POGO against the public pogo-torch


def match_public(ours: Any, public: Any, lr: float, *, n: int, p: int, steps: int,
                 seed: int) -> tuple[float, float]:
    """Run our :class:`POGO` (base ``ours``) and the public ``pogo.POGO`` (base ``public``) side by side on the
    public code's online PCA (``n × p``, column form, float64, problem and start drawn from ``seed``), feeding both
    the gradient at their own iterate. Returns the largest entrywise difference over the run and our final
    relative gap."""
    pogo_torch, _ = import_pogo_torch()
    g = torch.Generator().manual_seed(seed)
    prob = PCAProblem.generate(n, p, generator=g, dtype=torch.float64)
    W0 = prob.init(g)
    W, W_ref = W0.clone().requires_grad_(), W0.clone().requires_grad_()
    opt = POGO([W], lr=lr, base=ours, rows=False)
    opt_ref = pogo_torch.POGO([W_ref], public, lr, rows=False)
    worst = 0.0
    for _ in range(steps):
        for X, o in ((W, opt), (W_ref, opt_ref)):
            X.grad = prob.grad(X.detach())
            o.step()
        worst = max(worst, float((W.detach() - W_ref.detach()).abs().max()))
    return worst, prob.gap(W.detach())


def round_sig(x: float, digits: int = 2) -> float:
    """``x`` rounded to ``digits`` significant digits (the claims' values, so that reruns print the same)."""
    return float(f"{x:.{digits}g}")


MATCH_DIGITS_CAP = 12


def match_digits(dev: float, cap: int = MATCH_DIGITS_CAP) -> int:
    """Matching decimal digits of two runs whose largest difference is ``dev``, capped at ``cap``. Two float64
    runs of the same algorithm through different code (our fused products, the public code's) differ by rounding,
    about 1e-16 to 1e-15 after 50 steps, and whether that counts as 14 or 15 digits depends on the BLAS kernels;
    any count at the cap means "equal up to rounding"."""
    return min(cap, int(math.floor(-math.log10(max(dev, 1e-300)))))


# ---------------------------------------------------------------------------------------------------------
# The learning-rate sweeps (C2-C4, C6)


@dataclass
class Trajectory:
    """One run: relative gap (NaN where not evaluated or after a divergence), worst orthogonality error over the
    batch and cumulative wall-clock at every iteration, and its summaries."""

    gap: np.ndarray
    orth: np.ndarray
    clock: np.ndarray
    final_gap: float
    worst_orth: float
    final_orth: float
    ms_per_step: float


def eval_steps(steps: int) -> set[int]:
    """Iterations at which the gap is evaluated: 30 log-spaced ones, and every ``steps // 30`` from 0."""
    logs = np.unique(np.round(np.logspace(0, np.log10(steps), 30)).astype(int))
    return set(logs.tolist()) | set(range(0, steps + 1, max(1, steps // 30)))


def run_method(prob: Problem, method: str, lr: float, X0: Tensor, steps: int, rows: bool, *,
               target: float | None = None) -> Trajectory:
    """``steps`` steps of ``method`` (:data:`METHODS`) at learning rate ``lr`` from ``X0`` with the problem's
    exact gradient; stops when the orthogonality error passes :data:`DIVERGED`. Only the gradient and the step
    (with the projection, if any) are timed, on :func:`step_clock`. With ``target``, the gap is evaluated after
    every step and the run stops once it is ``<= target`` (the time to a target gap, :func:`time_to_gap`);
    otherwise at :func:`eval_steps`."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    X, opt, project = make_optimizer(method, X0, lr, rows)
    clock = step_clock(X.device)[1]
    gap, orth, secs = np.full(steps + 1, np.nan), np.full(steps + 1, np.nan), np.zeros(steps + 1)
    at = set(range(steps + 1)) if target is not None else eval_steps(steps)
    gap[0], orth[0] = prob.gap(X.detach()), float(orthogonality_error(X.detach()).max())
    for t in range(1, steps + 1):
        with Timer(X.device, clock=clock, sync_start=False) as timer:
            X.grad = prob.grad(X.detach())
            opt.step()
            if project is not None:
                with torch.no_grad():
                    X.copy_(project(X))
        secs[t] = timer.seconds
        orth[t] = float(orthogonality_error(X.detach()).max())
        if not orth[t] < DIVERGED:  # diverged (or NaN)
            break
        if t in at:
            gap[t] = prob.gap(X.detach())
            if target is not None and gap[t] <= target:
                break
    return Trajectory(gap=gap, orth=orth, clock=np.cumsum(secs), final_gap=gap[t], worst_orth=np.nanmax(orth),
                      final_orth=orth[t], ms_per_step=1e3 * secs[1:t + 1].mean())


def sweep(prob: Problem, X0: Tensor, steps: int, rows: bool, lrs: Sequence[float],
          methods: Sequence[str] = METHODS) -> dict[tuple[str, float], Trajectory]:
    """Every method at every learning rate, from the same start with the same gradients: ``{(method, lr): run}``."""
    return {(m, lr): run_method(prob, m, lr, X0, steps, rows) for m in methods for lr in lrs}


def best_lrs(res: Mapping[tuple[str, float], Trajectory], lrs: Sequence[float],
             methods: Sequence[str] = METHODS) -> dict[str, float]:
    """Each method's learning rate with the smallest final gap (a diverged run counts as infinite)."""
    out = {}
    for m in methods:
        finals = [res[m, lr].final_gap for lr in lrs]
        finals = [f if np.isfinite(f) else np.inf for f in finals]
        out[m] = lrs[int(np.argmin(finals))]
    return out


def summary_table(res: Mapping[tuple[str, float], Trajectory], best: Mapping[str, float]) -> pd.DataFrame:
    """One row per method at its best learning rate: gap, worst and final orthogonality error, ms per step."""
    rows = [dict(method=m, best_lr=lr, final_gap=res[m, lr].final_gap, worst_orth_err=res[m, lr].worst_orth,
                 final_orth_err=res[m, lr].final_orth, ms_per_step=res[m, lr].ms_per_step) for m, lr in best.items()]
    return pd.DataFrame(rows).set_index("method")


def best_summary(res: Mapping[tuple[str, float], Trajectory], best: Mapping[str, float]) -> dict[str, dict]:
    """The results file's record of each method's best run."""
    return {m: {"lr": lr, "final_gap": float(res[m, lr].final_gap), "worst_orth": float(res[m, lr].worst_orth)}
            for m, lr in best.items()}


def claim_numbers(res: Mapping[tuple[str, float], Trajectory], lrs: Sequence[float], lr_max: float,
                  floor: float = GAP_FLOOR) -> dict[str, Any]:
    """The numbers the claims read off one sweep. Over the learning rates ``<= lr_max``: the worst orthogonality
    error of every POGO base (``worst_pogo``, and ``worst_by_base``), the smallest ratio of Landing's worst error
    to POGO (SGD)'s (``landing_ratio``) and the largest ratio of POGO (SGD)'s final gap to Landing's
    (``gap_ratio``, gaps floored at ``floor``). At each POGO base's best learning rate (smallest final gap over the
    whole grid): its worst orthogonality error (``worst_at_best``, ``worst_at_best_by_base``). Over the whole
    grid: the best geoopt final gap over the best POGO one, with the gaps floored (``geoopt_over_pogo``) and
    without (``geoopt_over_pogo_raw``); diverged runs are left out of the best gaps. The controls of C2: Landing's
    worst error over the same learning rates (``landing_worst``) and at its own best one (``landing_worst_at_best``)."""
    lr_claim = [lr for lr in lrs if lr <= lr_max]
    if not lr_claim:
        raise ValueError(f"no learning rate of {list(lrs)} is <= {lr_max}")
    worst_by_base = {m: max(res[m, lr].worst_orth for lr in lr_claim) for m in POGO_METHODS}
    ratio = min(res["Landing", lr].worst_orth / res["POGO (SGD)", lr].worst_orth for lr in lr_claim)
    gap_ratio = max(max(res["POGO (SGD)", lr].final_gap, floor) / max(res["Landing", lr].final_gap, floor)
                    for lr in lr_claim)
    best = best_lrs(res, lrs, POGO_METHODS)
    at_best = {m: res[m, best[m]].worst_orth for m in POGO_METHODS}
    landing_best = best_lrs(res, lrs, ["Landing"])["Landing"]

    def best_gap(methods: Sequence[str], fl: float) -> float:
        return min(max(res[m, lr].final_gap, fl) for m in methods for lr in lrs if np.isfinite(res[m, lr].final_gap))

    return dict(worst_pogo=max(worst_by_base.values()), worst_by_base=worst_by_base, landing_ratio=ratio,
                gap_ratio=gap_ratio, worst_at_best=max(at_best.values()), worst_at_best_by_base=at_best,
                best_lr_by_base=best, geoopt_over_pogo=best_gap(GEOOPT_METHODS, floor) / best_gap(POGO_METHODS, floor),
                geoopt_over_pogo_raw=best_gap(GEOOPT_METHODS, 0.0) / best_gap(POGO_METHODS, 0.0),
                landing_worst=max(res["Landing", lr].worst_orth for lr in lr_claim),
                landing_worst_at_best=res["Landing", landing_best].worst_orth)


def time_to_gap(prob: Problem, X0: Tensor, best: Mapping[str, float], target: float, max_steps: int,
                rows: bool) -> dict[str, Trajectory]:
    """Each method of ``best`` at its learning rate, from ``X0``, until the relative gap is ``<= target`` (at most
    ``max_steps`` steps): the paper's "minutes instead of hours" measure, wall-clock to a given accuracy. A run's
    time to the target is ``clock[-1]`` of the trajectory's last evaluated step, see :func:`reached`."""
    return {m: run_method(prob, m, lr, X0, max_steps, rows, target=target) for m, lr in best.items()}


def reached(run: Trajectory, target: float) -> tuple[int, float]:
    """(steps, seconds) at which ``run`` first had a gap ``<= target``; (-1, inf) if it never did."""
    hit = np.flatnonzero(np.isfinite(run.gap) & (run.gap <= target))
    if hit.size == 0:
        return -1, math.inf
    return int(hit[0]), float(run.clock[hit[0]])


def speed_to_target(runs: Mapping[str, Trajectory], target: float) -> dict[str, Any]:
    """Claim C7 from :func:`time_to_gap`: the fastest geoopt time to the target over the fastest POGO time
    (``ratio``: inf if only POGO reached it, 0 if only geoopt did, NaN if neither), and every method's steps and
    seconds to the target (``-1`` and ``None`` for a run that never reached it, so the record is plain JSON)."""
    hits = {m: reached(r, target) for m, r in runs.items()}
    fastest = {grp: min((hits[m][1] for m in ms if m in hits), default=math.inf)
               for grp, ms in (("pogo", POGO_METHODS), ("geoopt", GEOOPT_METHODS))}
    if math.isfinite(fastest["pogo"]):
        ratio = fastest["geoopt"] / fastest["pogo"]  # inf if no geoopt run reached the target
    else:
        ratio = 0.0 if math.isfinite(fastest["geoopt"]) else math.nan
    return dict(ratio=ratio, steps={m: h[0] for m, h in hits.items()},
                seconds={m: h[1] if math.isfinite(h[1]) else None for m, h in hits.items()},
                fastest_pogo_s=fastest["pogo"], fastest_geoopt_s=fastest["geoopt"])


# ---------------------------------------------------------------------------------------------------------
# C5: the normal correction contracts quadratically


@dataclass
class Contraction:
    """Distances to the manifold before (``d0``) and after (``d1``) one normal correction, the least-squares line
    of ``log d1`` on ``log d0`` (``slope``, ``intercept``), and the largest distance over the batch as the
    correction is iterated from a distance of order one (``chain``)."""

    d0: np.ndarray
    d1: np.ndarray
    slope: float
    intercept: float
    chain: list[float]


def contraction(b: int, p: int, n: int, points: int, iters: int, seed: int) -> Contraction:
    """Build ``b`` matrices ``U diag(1 + δu) Vᵀ`` off the manifold, with independent Haar-random ``U`` (``p × p``)
    and ``V`` (``n × p``), ``u ~ U[−1, 1]`` per singular value, plus noise of size ``10⁻³ δ``, for ``points``
    values of ``δ`` in ``[10⁻⁴, 10^−½]``; correct once with ``λ = ½``; then iterate the correction ``iters`` times
    from ``δ = 0.2``. Float64 on the CPU. (Taking ``U``, ``V`` from the SVD of an orthonormal matrix instead would
    make them depend on the LAPACK code path: all its singular values are 1, so its singular vectors are not
    unique.)"""
    g = torch.Generator().manual_seed(seed)
    U = random_stiefel(b, p, p, generator=g, dtype=torch.float64)
    Vt = random_stiefel(b, p, n, generator=g, dtype=torch.float64)

    def off_manifold(delta: float) -> Tensor:
        u = 2 * torch.rand(b, p, generator=g, dtype=torch.float64) - 1
        noise = torch.randn(b, p, n, generator=g, dtype=torch.float64)
        return (U * (1 + delta * u)[:, None, :]) @ Vt + 1e-3 * delta * noise

    d0, d1 = [], []
    for delta in np.logspace(-4, -0.5, points):
        M = off_manifold(float(delta))
        d0.append(orthogonality_error(M).numpy())
        d1.append(orthogonality_error(normal_correction(M)).numpy())
    d0a, d1a = np.concatenate(d0), np.concatenate(d1)
    slope, intercept = np.polyfit(np.log(d0a), np.log(d1a), 1)
    M = off_manifold(0.2)
    chain = [float(orthogonality_error(M).max())]
    for _ in range(iters):
        M = normal_correction(M)
        chain.append(float(orthogonality_error(M).max()))
    return Contraction(d0=d0a, d1=d1a, slope=float(slope), intercept=float(intercept), chain=chain)


# ---------------------------------------------------------------------------------------------------------
# C7, C8: time per step against the number of matrices


def time_per_step(counts: Sequence[int], p: int, budget_s: float, repeats: int, generator: torch.Generator, *,
                  device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                  methods: Sequence[str] = SCALE_METHODS) -> dict[str, list[float]]:
    """Milliseconds per optimiser step (:func:`repro.papers.pogo.stepper`, a fixed gradient of unit norm per
    matrix) on ``b`` Haar-random ``p × p`` matrices for each ``b`` in ``counts``, on :func:`step_clock`: the
    median of ``repeats`` timings of as many calls as fit in ``budget_s``, after one warm-up call; the methods
    take turns within each repeat, so that a change of load hits them alike."""
    clock = step_clock(device)[1]

    def seconds(fn: Callable[[], object], number: int) -> float:
        with Timer(device, clock=clock) as timer:
            for _ in range(number):
                fn()
        return timer.seconds / number

    step_ms: dict[str, list[float]] = {m: [] for m in methods}
    for b in counts:
        X = random_stiefel(b, p, p, generator=generator, dtype=dtype).to(device)
        G = torch.randn(X.shape, generator=generator, dtype=dtype).to(device)
        G = G / torch.linalg.matrix_norm(G)[:, None, None]
        fns = {m: stepper(m, X, G) for m in methods}
        number = {}
        for m, fn in fns.items():
            fn()  # warm-up
            number[m] = max(1, int(budget_s / max(seconds(fn, 1), 1e-6)))
        times: dict[str, list[float]] = {m: [] for m in methods}
        for _ in range(repeats):
            for m, fn in fns.items():
                times[m].append(seconds(fn, number[m]))
        for m in methods:
            step_ms[m].append(1e3 * float(np.median(times[m])))
    return step_ms


def scaling_summary(counts: Sequence[int], step_ms: Mapping[str, Sequence[float]], at: int = 1000,
                    start: int = 100) -> dict[str, float]:
    """Claims C7 and C8 from :func:`time_per_step`: geoopt's time per step over POGO's on ``at`` matrices (QR and
    Cayley retractions), and the log-log slope of POGO's time per step from ``start`` matrices to the last count."""
    counts = list(counts)
    i, i0 = counts.index(at), counts.index(start)
    pogo = np.asarray(step_ms["POGO"])
    return dict(qr_ratio=step_ms["geoopt RSGD (QR)"][i] / pogo[i],
                cayley_ratio=step_ms["geoopt RSGD (Cayley)"][i] / pogo[i],
                growth=loglog_slope(np.asarray(counts[i0:]), pogo[i0:]))
