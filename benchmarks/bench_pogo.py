"""Benchmark of one optimiser step on batches of orthogonal matrices (paper 19, POGO; ``repro.papers.pogo``).

Time per step, orthogonality error and roofline of POGO (``repro.papers.pogo.POGO``, SGD base), the same step with
its two Grams as full products (``gram_rows=0``: the implementation before issue 43, "POGO (full Grams)", where
``p >= 256``), the same step without cache blocking (``block_bytes=0``, "POGO (one batch)", where the batch has
several matrices), the public ``pogo-torch``, our Landing, and geoopt's RiemannianSGD with the QR retraction
(``EuclideanStiefel``) and the Cayley retraction (``CanonicalStiefel``), on 1000×(16×16), 100×(64×64),
1×(512×1024), 10000×(16×16), 16×(256×1024) and 1×(1024×4096), float32 on CPU (or ``--device cuda``). Printed as
ratios to POGO measured in the same run and written to ``results/bench-pogo.json``; ``--growth`` adds the time per
step of POGO and geoopt-QR on 10, 100, 1000 and 10⁴ matrices of 16×16 and the log-log slope from 100 to 10⁴.

Roofline: the run measures this machine's peak before and after the cases (``repro.bench.measure_peak``: square
matrix products of 512 and 1024 and a streaming add, same dtype and thread count; the best reading counts); each row
then carries its method's FLOPs per step (``repro.papers.pogo.flops``: the products each method runs, counted
analytically; POGO's, Landing's and pogo-torch's are checked against torch's FLOP counter in the tests), the
achieved GFLOP/s and the fraction of the peak, and the same for the least memory traffic any method needs (read the
point and the gradient, write the point). The products per step are printed once per method.

Clocks: on the CPU every timing reads both the wall clock and the thread's CPU time, and the ratios and goals use
the CPU time (``--clock wall`` to use the wall clock). The run is single-threaded, so CPU time is the work done;
on a machine shared with other jobs the wall clock also counts the time the process waits for a core, which
scaled the short POGO calls by 7× and the long geoopt calls by 5× in one loaded run (load 12 on 2 cores) and moved
the ratios by up to 40 %. On CUDA only the wall clock (synchronised) is meaningful. Each reading of the peak is
the best of five wall-clock timings.

Why the blocking: the six products of a POGO step each stream a whole batch-sized tensor through memory; on
10⁴ matrices of 16×16 (10 MB per tensor, above a core's 2 MB L2 cache) the unblocked step took 15–20× the time of
1000 matrices (1 MB per tensor; log-log slope 1.21 from 10² to 10⁴), and POGO's lead over geoopt-QR fell from
3.2–3.6× to 2.0–2.6× (CPU time, same run; two runs). Processing ~150 matrices at a time keeps a block's
temporaries in L2 (``repro.papers.pogo.CPU_BLOCK_BYTES``).

One large matrix (issue 43): at 512×1024 the products of every method run near the matrix-product peak, so the
time per step follows the FLOPs (``repro.papers.pogo.flops``, which also counts why POGO's step cannot drop a
product): POGO's six products are ``12p²n`` = 3.22 GFLOP; computing its two symmetric Grams as block triangles
(``repro.papers.pogo.gram``) brings that to ``10.25 p²n`` = 2.75 GFLOP, still 1.28× Landing's four products
(2.15 GFLOP) and 1.40× geoopt-QR's two products and QR (1.97 GFLOP). In the run of ``results/bench-pogo.json`` (CPU
time, one thread): POGO 30.2 ms per step against 33.0 ms with full Grams (1.09×; 1.06× on 16×(256×1024), 1.10× on
1×(1024×4096)), with the same orthogonality error to the bit; geoopt-QR/POGO 1.28 (goal 1.5), Landing/POGO 0.90
(goal 1), pogo-torch/POGO 1.52. POGO ran at 87 % of the measured matmul peak (94 % with full Grams), Landing at
76 %, geoopt-QR at 49 % (its QR): Landing's time would need POGO's 2.75 GFLOP at 97 % of the peak, and 1.5×
geoopt-QR at 102 %. On 16×(256×1024) POGO was 1.09× faster than Landing and 1.56× than geoopt-QR.

Fairness: every method steps the same parameters with the same fixed gradient (a linear loss, each matrix's
gradient of unit Frobenius norm); the timings are interleaved (round-robin over the methods, median over
rounds), so a load change on the machine hits all methods alike. The step sizes give the same displacement
along the manifold: lr = 0.1 for all, 0.05 for the Cayley retraction, whose canonical gradient is twice POGO's
relative gradient. Orthogonality: the largest ‖X Xᵀ − I‖_F over ``--steps`` steps from the same start. Cases of
more than 5 GFLOP per POGO step are timed in rounds of one call (not the median of three) and their orthogonality
over at most 5 steps; geoopt-Cayley is left out at 1×(1024×4096) (its ``n × n`` solve: 252 GFLOP per step, seconds
per call).

Goals: >= 3x faster than geoopt-QR on 1000×(16×16) and on 10000×(16×16) at equal orthogonality; on 1×(512×1024)
>= 1.5x faster than geoopt-QR and at least Landing's speed, with the orthogonality error of the full-Gram step;
never slower than pogo-torch. The script prints whether they hold; it never fails on them (timings are
machine-dependent).

Run: ``.venv/bin/python benchmarks/bench_pogo.py`` (about two minutes of CPU time, more on a busy machine;
``--threads 2`` for both cores).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, replace

import numpy as np
import torch

from repro import bench
from repro.common.numerics import loglog_slope
from repro.papers import pogo as P
from repro.papers.pogo import flops as F

CASES = [(1000, 16, 16), (100, 64, 64), (1, 512, 1024), (10000, 16, 16), (16, 256, 1024), (1, 1024, 4096)]
METHODS = ["POGO", "POGO (full Grams)", "POGO (one batch)", "pogo-torch", "Landing", "geoopt-QR", "geoopt-Cayley"]
GROWTH_COUNTS = [10, 100, 1000, 10000]
LR = 0.1
HEAVY_FLOPS = 5e9  # POGO FLOPs per step above which a round times one call and the orthogonality runs 5 steps
LARGE = "1x(512x1024)"
PEAK_SIZES = (512, 1024)  # square products of the peak measurement


def case_name(b: int, p: int, n: int) -> str:
    return f"{b}x({p}x{n})"


def methods_for(b: int, p: int, n: int, device: torch.device) -> list[str]:
    """The methods timed on ``b`` matrices ``p × n``: the full-Gram step only where POGO's Grams are triangles,
    the one-batch step only for several matrices, geoopt-Cayley only where its ``n × n`` solve is not huge."""
    skip = set()
    if P.gram_block_rows(p, device) == 0:
        skip.add("POGO (full Grams)")
    if b == 1:
        skip.add("POGO (one batch)")
    if n >= 4096:
        skip.add("geoopt-Cayley")
    return [m for m in METHODS if m not in skip]


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
    if method == "POGO (full Grams)":
        return X, P.POGO([X], lr=LR, gram_rows=0).step
    if method == "POGO (one batch)":
        return X, P.POGO([X], lr=LR, block_bytes=0).step
    if method == "Landing":
        return X, P.Landing([X], lr=LR).step
    pogo, base = P.import_pogo_torch()
    return X, pogo.POGO([X], base.SGD(), LR).step


def step_flops(method: str, b: int, p: int, n: int, device: torch.device) -> float:
    """FLOPs per step of ``method`` on ``b`` matrices ``p × n`` (``repro.papers.pogo.flops``)."""
    if method == "POGO (full Grams)":
        return F.pogo_flops(b, p, n, device=device, gram_rows=0)
    if method.startswith("POGO"):
        return F.pogo_flops(b, p, n, device=device)
    return F.FLOPS[method](b, p, n)


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
            clock: str, repeats: int = 3) -> dict[str, float]:
    """Median seconds per step of each method, timed round-robin (``rounds`` rounds, each the median of
    ``repeats`` timings of ``budget_s``)."""
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
            times[m].append(statistics.median(time_both(s, number, device)[k] for _ in range(repeats)))
    return {m: statistics.median(v) for m, v in times.items()}


def run_case(b: int, p: int, n: int, *, device: torch.device, rounds: int, steps: int, budget_s: float,
             clock: str) -> list[bench.Row]:
    """The rows of one case: time per step and worst orthogonality error of each method."""
    methods = methods_for(b, p, n, device)
    heavy = F.pogo_flops(b, p, n, device=device) > HEAVY_FLOPS
    secs = timings(b, p, n, methods, device=device, rounds=rounds, budget_s=budget_s, clock=clock,
                   repeats=1 if heavy else 3)
    X0, G = inputs(b, p, n, device)
    return [bench.Row(case_name(b, p, n), m, secs[m], {"orth_err_worst": orthogonality(m, X0, G, min(steps, 5)
                                                                                     if heavy else steps)})
            for m in methods]


def best_peak(peaks: list[bench.Peak]) -> bench.Peak:
    """The highest of several measurements of the peak, per quantity. One reading can be low: at the start of a
    process the first ``measure_peak`` read 71–78 GFLOP/s where later ones in the same process read 97–104, and a
    1024² product ran slower than a 512² one (100 against 104 GFLOP/s); a low peak inflates every fraction."""
    return replace(peaks[0], flops=max(q.flops for q in peaks), bandwidth=max(q.bandwidth for q in peaks))


def measure_peaks(device: torch.device) -> list[bench.Peak]:
    """``repro.bench.measure_peak`` at float32 with square products of 512 and of 1024."""
    return [bench.measure_peak(torch.float32, device, n=n) for n in PEAK_SIZES]


def add_roofline(rows: list[bench.Row], peak: bench.Peak, device: torch.device) -> dict[str, dict[str, dict]]:
    """Each row's FLOPs per step and fraction of the peak (into its extra), and the roofline dicts per case."""
    shapes = {case_name(b, p, n): (b, p, n) for b, p, n in CASES}
    roofs: dict[str, dict[str, dict]] = {}
    for r in rows:
        b, p, n = shapes[r.case]
        roof = bench.roofline(r.seconds, peak, flops=step_flops(r.method, b, p, n, device),
                              bytes_moved=F.step_bytes(b, p, n))
        r.extra |= {"gflop": roof["gflop"], "of_peak_flops": roof["of_peak_flops"]}
        roofs.setdefault(r.case, {})[r.method] = roof
    return roofs


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
    cases = list(dict.fromkeys(r.case for r in rows))
    out: dict[str, object] = {}

    def ratio(case: str, method: str) -> float:
        return round(t[case, method].seconds / t[case, "POGO"].seconds, 2)

    for case in ("1000x(16x16)", "10000x(16x16)"):
        for g in ("geoopt-QR", "geoopt-Cayley"):
            same_orth = t[case, "POGO"].extra["orth_err_worst"] <= 2 * t[case, g].extra["orth_err_worst"]
            out[f"{g}/POGO on {case}"] = ratio(case, g)
            out[f">= 3x faster than {g} on {case}"] = ratio(case, g) >= 3
            out[f"POGO's worst orthogonality error within 2x of {g}'s on {case}"] = bool(same_orth)
        out[f"one batch/blocked POGO on {case}"] = ratio(case, "POGO (one batch)")
    for case in (case_name(b, p, n) for b, p, n in CASES if p >= 256):  # the large matrices (issue 43)
        tag = " (the goal)" if case == LARGE else ""
        out[f"geoopt-QR/POGO on {case}"] = ratio(case, "geoopt-QR")
        out[f">= 1.5x faster than geoopt-QR on {case}{tag}"] = ratio(case, "geoopt-QR") >= 1.5
        out[f"Landing/POGO on {case}"] = ratio(case, "Landing")
        out[f"at least Landing's speed on {case}{tag}"] = ratio(case, "Landing") >= 1
        if (case, "POGO (full Grams)") not in t:  # off the CPU the Grams are full products: no before/after
            continue
        out[f"before/after: full-Gram POGO/POGO on {case}"] = ratio(case, "POGO (full Grams)")
        before, after = t[case, "POGO (full Grams)"].extra["orth_err_worst"], t[case, "POGO"].extra["orth_err_worst"]
        out[f"orthogonality error after/before on {case}"] = round(after / before, 4)
        out[f"orthogonality error not worse than before on {case}"] = after <= before * (1 + 1e-3)
    slower = {c: ratio(c, "pogo-torch") for c in cases}
    out["pogo-torch/POGO per case"] = slower
    out["never slower than pogo-torch"] = all(v >= 1 for v in slower.values())
    out["POGO's fraction of the matmul peak per case"] = {c: round(t[c, "POGO"].extra["of_peak_flops"], 3)
                                                          for c in cases}
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
    peaks = measure_peaks(device)  # before the cases and after them
    print(best_peak(peaks).describe(), flush=True)
    rows: list[bench.Row] = []
    for b, p, n in CASES:
        rows += run_case(b, p, n, device=device, rounds=args.rounds, steps=args.steps, budget_s=args.budget,
                         clock=clock)
    peaks += measure_peaks(device)
    peak = best_peak(peaks)
    roofs = add_roofline(rows, peak, device)
    verdict = goals(rows)
    notes = {"dtype": "float32", "threads": args.threads, "device": str(device), "clock": clock, "lr": LR,
             "lr_cayley": LR / 2, "orth_steps": args.steps, "rounds": args.rounds,
             "block_bytes": P.CPU_BLOCK_BYTES, "gram_block_rows": P.GRAM_BLOCK_ROWS, "goals": verdict,
             "peak": asdict(peak), "peak_measurements": [asdict(q) for q in peaks], "roofline": roofs,
             "work_per_step": F.WORK,
             "roofline_note": "FLOPs of the matrix products per step (repro.papers.pogo.flops); bytes: the least "
                              "traffic of any method (read X and G, write X); fractions of the peak measured in "
                              "this run (square matmul, streaming add) at the same dtype and thread count"}
    if args.growth:
        notes["growth"] = growth(device=device, rounds=args.rounds, budget_s=args.budget, clock=clock)
    bench.publish("pogo", rows, baseline="POGO", notes=notes)
    print(f"\n{peak.describe()}\nproducts per step (p × n row matrices; geoopt holds x = n × p):")
    for m, w in F.WORK.items():
        print(f"  {m}: {w}")
    for case, roof in roofs.items():
        print(f"roofline {case}:")
        for m, r in roof.items():
            label = f"{m} ({r['gflop']:.3g} GFLOP/step)"
            print(f"  {bench.roofline_line(label, r)}")
    print(f"\nclock: {clock}\ngoals:")
    for k, v in verdict.items():
        print(f"  {k}: {v}")
    if args.growth:
        print(f"growth: {notes['growth']}")


if __name__ == "__main__":
    main()
