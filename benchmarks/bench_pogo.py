"""Benchmark of one optimiser step on batches of orthogonal matrices (paper 19, POGO; ``repro.papers.pogo``).

Time per step and orthogonality error for POGO (``repro.papers.pogo.POGO``, SGD base), the same step without cache
blocking (``block_bytes=0``: the whole batch in one set of products, the implementation before the blocking), the
public ``pogo-torch``, our Landing, and geoopt's RiemannianSGD with the QR retraction (``EuclideanStiefel``) and the
Cayley retraction (``CanonicalStiefel``), on 1000×(16×16), 100×(64×64), 1×(512×1024) and 10000×(16×16), float32 on
CPU (or ``--device cuda``). Printed as ratios to POGO measured in the same run and written to
``results/bench-pogo.json``; ``--growth`` adds the time per step of POGO and geoopt-QR on 10, 100, 1000 and 10⁴
matrices of 16×16 and the log-log slope from 100 to 10⁴.

Clocks: on the CPU every timing reads both the wall clock and the thread's CPU time, and the ratios and goals use
the CPU time (``--clock wall`` to use the wall clock). The run is single-threaded, so CPU time is the work done;
on a machine shared with other jobs the wall clock also counts the time the process waits for a core, which
scaled the short POGO calls by 7× and the long geoopt calls by 5× in one loaded run (load 12 on 2 cores) and moved
the ratios by up to 40 %. On CUDA only the wall clock (synchronised) is meaningful.

Why the blocking: the six products of a POGO step each stream a whole batch-sized tensor through memory; on
10⁴ matrices of 16×16 (10 MB per tensor, above a core's 2 MB L2 cache) the unblocked step took 15–20× the time of
1000 matrices (1 MB per tensor; log-log slope 1.21 from 10² to 10⁴), and POGO's lead over geoopt-QR fell from
3.2–3.6× to 2.0–2.6× (CPU time, same run; two runs). Processing ~150 matrices at a time keeps a block's
temporaries in L2 (``repro.papers.pogo.CPU_BLOCK_BYTES``): slope 0.99, lead 5.4–5.8× on 10³ and 7.7–7.8× on 10⁴
in the run of ``results/bench-pogo.json``.

Fairness: every method steps the same parameters with the same fixed gradient (a linear loss, each matrix's
gradient of unit Frobenius norm); the timings are interleaved (round-robin over the methods, median over
rounds), so a load change on the machine hits all methods alike. The step sizes give the same displacement
along the manifold: lr = 0.1 for all, 0.05 for the Cayley retraction, whose canonical gradient is twice POGO's
relative gradient. Orthogonality: the largest ‖X Xᵀ − I‖_F over ``--steps`` steps from the same start.

Goals: >= 3x faster than geoopt-QR on 1000×(16×16) and on 10000×(16×16) at equal orthogonality; never slower
than pogo-torch. The script prints whether they hold; it never fails on them (timings are machine-dependent).

Run: ``.venv/bin/python benchmarks/bench_pogo.py`` (a few minutes on 2 busy CPU cores; ``--threads 2`` for both
cores).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from repro import bench
from repro.common.numerics import loglog_slope
from repro.papers import pogo as P

CASES = [(1000, 16, 16), (100, 64, 64), (1, 512, 1024), (10000, 16, 16)]
METHODS = ["POGO", "POGO (one batch)", "pogo-torch", "Landing", "geoopt-QR", "geoopt-Cayley"]
GROWTH_COUNTS = [10, 100, 1000, 10000]
LR = 0.1


def make(method: str, X0: torch.Tensor, G: torch.Tensor) -> tuple[torch.Tensor, Callable[[], object]]:
    """A parameter holding ``X0`` (row form, or its transpose for geoopt's column convention), its gradient set
    to ``G``, and the optimiser's ``step``."""
    if method in ("geoopt-QR", "geoopt-Cayley"):
        geoopt = P.import_geoopt()
        manifold = geoopt.EuclideanStiefel() if method == "geoopt-QR" else geoopt.CanonicalStiefel()
        X = geoopt.ManifoldParameter(X0.mT.clone(), manifold=manifold)
        X.grad = G.mT.clone()
        lr = LR if method == "geoopt-QR" else LR / 2
        return X, geoopt.optim.RiemannianSGD([X], lr=lr).step
    X = X0.clone().requires_grad_()
    X.grad = G.clone()
    if method == "POGO":
        return X, P.POGO([X], lr=LR).step
    if method == "POGO (one batch)":
        return X, P.POGO([X], lr=LR, block_bytes=0).step
    if method == "Landing":
        return X, P.Landing([X], lr=LR).step
    pogo, base = P.import_pogo_torch()
    return X, pogo.POGO([X], base.SGD(), LR).step


def time_both(fn: Callable[[], object], number: int, device: torch.device) -> tuple[float, float]:
    """Seconds per call of ``fn`` over ``number`` calls: (wall clock, this thread's CPU time)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    w0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(number):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - w0) / number, (time.thread_time() - c0) / number


def orthogonality(method: str, X0: torch.Tensor, G: torch.Tensor, steps: int) -> float:
    """Largest per-matrix ‖X Xᵀ − I‖_F over ``steps`` steps."""
    X, step = make(method, X0, G)
    worst = 0.0
    for _ in range(steps):
        step()
        worst = max(worst, float(P.orthogonality_error(X.detach()).max()))
    return worst


def inputs(b: int, p: int, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(b * 7919 + p * 31 + n)
    X0 = P.random_stiefel(b, p, n, generator=g).to(device)
    G = torch.randn(b, p, n, generator=g).to(device)
    return X0, G / torch.linalg.matrix_norm(G)[:, None, None]


def timings(b: int, p: int, n: int, methods: list[str], *, device: torch.device, rounds: int, budget_s: float,
            clock: str) -> dict[str, float]:
    """Median seconds per step of each method, timed round-robin (``rounds`` rounds of ``budget_s`` each)."""
    X0, G = inputs(b, p, n, device)
    steppers = {m: make(m, X0, G)[1] for m in methods}
    for s in steppers.values():  # warm-up (first-call allocations, geoopt's jit)
        s()
        s()
    per_call = {m: max(time_both(s, 1, device)[0], 1e-6) for m, s in steppers.items()}
    times: dict[str, list[float]] = {m: [] for m in methods}
    k = 0 if clock == "wall" else 1
    for _ in range(rounds):
        for m, s in steppers.items():
            number = max(1, int(budget_s / per_call[m]))
            times[m].append(statistics.median(time_both(s, number, device)[k] for _ in range(3)))
    return {m: statistics.median(v) for m, v in times.items()}


def run_case(b: int, p: int, n: int, *, device: torch.device, rounds: int, steps: int, budget_s: float,
             clock: str) -> list[bench.Row]:
    secs = timings(b, p, n, METHODS, device=device, rounds=rounds, budget_s=budget_s, clock=clock)
    X0, G = inputs(b, p, n, device)
    case = f"{b}x({p}x{n})"
    return [bench.Row(case, m, secs[m], {"orth_err_worst": orthogonality(m, X0, G, steps)}) for m in METHODS]


def growth(*, device: torch.device, rounds: int, budget_s: float, clock: str) -> dict[str, object]:
    """Time per step of POGO, its unblocked form and geoopt-QR against the number of 16×16 matrices."""
    methods = ["POGO", "POGO (one batch)", "geoopt-QR"]
    ms: dict[str, list[float]] = {m: [] for m in methods}
    for b in GROWTH_COUNTS:
        secs = timings(b, 16, 16, methods, device=device, rounds=rounds, budget_s=budget_s, clock=clock)
        for m in methods:
            ms[m].append(1e3 * secs[m])
    counts = np.asarray(GROWTH_COUNTS)
    return {"counts": GROWTH_COUNTS, "ms_per_step": ms,
            "slope_100_to_10000": {m: round(loglog_slope(counts[1:], np.asarray(v[1:])), 3) for m, v in ms.items()},
            "geoopt-QR/POGO": [round(q / g, 2) for q, g in zip(ms["geoopt-QR"], ms["POGO"], strict=True)]}


def goals(rows: list[bench.Row]) -> dict[str, object]:
    """The goals, evaluated on this run's numbers."""
    t = {(r.case, r.method): r for r in rows}
    out: dict[str, object] = {}
    for case in ("1000x(16x16)", "10000x(16x16)"):
        for g in ("geoopt-QR", "geoopt-Cayley"):
            ratio = t[case, g].seconds / t[case, "POGO"].seconds
            same_orth = t[case, "POGO"].extra["orth_err_worst"] <= 2 * t[case, g].extra["orth_err_worst"]
            out[f"{g}/POGO on {case}"] = round(ratio, 2)
            out[f">= 3x faster than {g} on {case}"] = bool(ratio >= 3)
            out[f"POGO's worst orthogonality error within 2x of {g}'s on {case}"] = bool(same_orth)
        out[f"one batch/blocked POGO on {case}"] = round(t[case, "POGO (one batch)"].seconds
                                                          / t[case, "POGO"].seconds, 2)
    slower = {r.case: round(t[r.case, "pogo-torch"].seconds / r.seconds, 2) for r in rows if r.method == "POGO"}
    out["pogo-torch/POGO per case"] = slower
    out["never slower than pogo-torch"] = all(v >= 1 for v in slower.values())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20, help="steps for the orthogonality error")
    ap.add_argument("--budget", type=float, default=0.04, help="seconds per timing (sets the calls per timing)")
    ap.add_argument("--clock", choices=["cpu", "wall"], default=None,
                    help="what the ratios use (default: cpu on the CPU, wall on CUDA)")
    ap.add_argument("--growth", action="store_true", help="also time 10 … 10⁴ matrices of 16×16 (slope)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    clock = args.clock or ("cpu" if device.type == "cpu" else "wall")
    if clock == "cpu" and device.type != "cpu":
        raise SystemExit("--clock cpu measures this thread's CPU time: use it on the CPU only")
    rows: list[bench.Row] = []
    for b, p, n in CASES:
        rows += run_case(b, p, n, device=device, rounds=args.rounds, steps=args.steps, budget_s=args.budget,
                         clock=clock)
    verdict = goals(rows)
    notes = {"dtype": "float32", "threads": args.threads, "device": str(device), "clock": clock, "lr": LR,
             "lr_cayley": LR / 2, "orth_steps": args.steps, "rounds": args.rounds,
             "block_bytes": P.CPU_BLOCK_BYTES, "goals": verdict}
    if args.growth:
        notes["growth"] = growth(device=device, rounds=args.rounds, budget_s=args.budget, clock=clock)
    bench.publish("pogo", rows, baseline="POGO", notes=notes)
    print(f"\nclock: {clock}\ngoals:")
    for k, v in verdict.items():
        print(f"  {k}: {v}")
    if args.growth:
        print(f"growth: {notes['growth']}")


if __name__ == "__main__":
    main()
