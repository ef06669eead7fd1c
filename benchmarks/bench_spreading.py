"""Benchmark of the batched renewal SIR engine (paper 08; ``repro.papers.spreading.RenewalSIR``) against EoN.

Epidemics per second on Barabási–Albert graphs (m = 3, seed 0; β = 0.1 per edge; one random initial node; run to
extinction): our tau-leap engine (Δt = 0.1, exact survival-ratio recovery rule: the setting checked against EoN in
notebook 08) with several replicas per batch, against EoN 2.0's exact event-driven ``fast_nonMarkov_SIR`` (the
baseline), ``fast_SIR`` and ``Gillespie_SIR`` (Markov only). Cases: N = 1000 with Weibull(3, 5) infectious periods
(the goal's case) and with exponential periods of the same mean (Markov); N = 10⁴ and 10⁵ with the Weibull law, so
that the growth with N shows. EoN is slow at 10⁵ (about 2 s per epidemic): it runs 30 epidemics at 10⁴ and 5 at
10⁵ (300 at 10³), so those ratios carry the sampling noise of few runs (a minor outbreak costs EoN almost nothing);
the ratio of node-events per second (infections + recoveries, counted from the final sizes) is printed beside them
and does not depend on the mix of minor and major outbreaks.

Matched accuracy: the engine runs the notebook's setting unchanged; the extinction share and the mean major size of
the timed runs are printed for both simulators at N = 1000 (notebook 08's checks K1–K4 hold them to ±0.07 and
±0.03 with 4000 replicas and 1500 EoN runs; here, with fewer runs, they are shown, not asserted).

Roofline (issue 43): the run first measures this machine's peak (``repro.bench.measure_peak``: a 1024² float32
matrix product and a streaming add, same thread count). The engine does no matrix products; its work is counted by
the engine itself (``RenewalSIR.work``): node-updates (working replicas × N per tau-leap step: the dense threshold
scan), events and (event, neighbour) pairs of the count updates. Its bytes are a lower bound of what the step must
stream: 12 B per node-update (the float32 threshold read and written, the count read) and 16 B per pair (the count
read and written, the CSR neighbour index read); its FLOPs are one subtraction per node-update. EoN's work is
node-events (its cost is per event and per edge, in Python). Each method prints one line: rates, and the fraction
of the bandwidth and FLOP peaks. A profile of one instrumented engine run (N = 1000, Weibull, 1024 replicas) shows
where the time goes: the dense scan, the recovery rule, the neighbour-count update, the infections' bookkeeping,
compaction, the random numbers of ``reset``, and the Python glue between the array operations.

Clocks: on the CPU every timing reads this thread's CPU time (``--clock wall`` for the wall clock): the run is
single-threaded, so CPU time is the work done, and a loaded shared machine does not inflate it. On CUDA the wall
clock (synchronised).

Fairness: every simulator runs the same graph, β and law from one uniformly random node; EoN runs are seeded through
``rng=np.random.default_rng(...)`` only; engine timings include ``reset`` (its random numbers) and synchronise CUDA.
Node-steps are meaningless for an event-driven simulator, so the comparison is whole epidemics at matched accuracy.

Goals (issue 43): >= 10x EoN's ``fast_nonMarkov_SIR`` on one CPU thread in the N = 1000 Weibull case (the best
batch size; >= 10x on a GPU). The script prints whether they hold; it never fails on them (timings are
machine-dependent).

Run: ``.venv/bin/python benchmarks/bench_spreading.py`` (about 2 minutes on a CPU core; ``--device cuda`` on a GPU).
"""

from __future__ import annotations

import argparse
import functools
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import torch

from repro import bench
from repro.common.timing import Timer
from repro.papers import spreading as SP

BASELINE = "EoN fast_nonMarkov_SIR"
BETA, DT = 0.1, 0.1
GOAL = 10.0
# (N, law, engine batch sizes, EoN fast_nonMarkov_SIR runs)
CASES = [(1000, "Weibull(3,5)", (256, 1024, 4096), 300), (1000, "exponential (Markov)", (256, 1024, 4096), 300),
         (10_000, "Weibull(3,5)", (32, 256), 30), (100_000, "Weibull(3,5)", (8, 64), 5)]
GOAL_CASE = "N=1000 Weibull(3,5)"
BYTES_PER_NODE_UPDATE, BYTES_PER_PAIR = 12, 16


def clocked(fn: Callable[[], object], device: torch.device, clock: str) -> float:
    """Seconds of one call of ``fn``: this thread's CPU time, or the (CUDA-synchronised) wall clock."""
    if clock == "cpu":
        c0 = time.thread_time()
        fn()
        return time.thread_time() - c0
    with Timer(device) as t:
        fn()
    return t.seconds


def engine_row(case: str, G, law: SP.Law, replicas: int, device: torch.device, repeats: int, clock: str,
               peak: bench.Peak) -> tuple[bench.Row, np.ndarray]:
    """Median seconds per batch over ``repeats`` batches (after one warm-up), per epidemic; the mean work of the
    timed batches; their final sizes."""
    eng = SP.RenewalSIR(G, BETA, law, dt=DT, device=device)
    sizes, works, secs = [], [], []
    for seed in range(repeats + 1):
        sec = clocked(lambda s=seed: (eng.reset(replicas, seed=s), eng.run()), device, clock)
        if seed:  # the first batch warms up
            secs.append(sec)
            works.append(dict(eng.work))
            sizes.append(eng.final_size().cpu().numpy())
    sec = float(np.median(secs)) / replicas
    work = {k: float(np.mean([w[k] for w in works])) / replicas for k in works[0]}
    roof = bench.roofline(sec, peak, flops=work["node_updates"],
                          bytes_moved=BYTES_PER_NODE_UPDATE * work["node_updates"] + BYTES_PER_PAIR * work["pairs"],
                          count=work["node_updates"], unit="node-updates")
    roof["node-events_per_s"] = work["events"] / sec
    extra = {"epidemics_per_s": 1 / sec, "node_updates_per_epidemic": work["node_updates"],
             "node_events_per_epidemic": work["events"], **roof}
    return bench.Row(case, f"engine R={replicas}", sec, extra), np.concatenate(sizes)


def eon_row(case: str, G, law: SP.Law, runs: int, method: str, name: str, clock: str) -> tuple[bench.Row, np.ndarray]:
    out: dict = {}

    def one() -> None:
        out["sizes"], _ = SP.eon_final_sizes(G, BETA, law, runs, seed=7, method=method)

    sec = clocked(one, torch.device("cpu"), clock) / runs
    events = 2 * G.number_of_nodes() * float(out["sizes"].mean())  # each infected node: infection + recovery
    extra = {"epidemics_per_s": 1 / sec, "node_events_per_epidemic": events, "node-events_per_s": events / sec,
             "runs": runs}
    return bench.Row(case, name, sec, extra), out["sizes"]


def profile_engine(G, law: SP.Law, replicas: int, device: torch.device) -> dict[str, float]:
    """Where one engine batch's time goes (wall clock): the engine's phases and, inside them, the array operations,
    each wrapped in a timer (which adds a little time of its own, counted in the glue). The phases sum to the
    total; "Python glue" is the part of the steps spent outside array operations (inside the phases above it)."""
    eng = SP.RenewalSIR(G, BETA, law, dt=DT, device=device)
    eng.reset(replicas, seed=0)
    eng.run()  # warm-up
    spent: Counter = Counter()
    calls: Counter = Counter()

    def wrap(obj: object, name: str, label: str) -> None:
        fn = getattr(obj, name)

        @functools.wraps(fn)
        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[label] += time.perf_counter() - t0
                calls[label] += 1
        setattr(obj, name, timed)

    with Timer(device) as t:
        eng.reset(replicas, seed=1)
    t_reset = t.seconds
    ops = ("scan", "nonzero", "take", "cat", "repeat", "cumsum", "arange", "searchsorted", "fill", "put",
           "scatter_add")
    for op in ops:
        wrap(eng._kernels, op, op)
    for phase in ("_substep", "_pop_due", "_infect", "_neighbour_update", "_compact"):
        wrap(eng, phase, phase)
    with Timer(device) as t:
        eng.run()
    total = t_reset + t.seconds
    phases = {
        "dense threshold scan (E -= n; E < 0)": spent["scan"],
        "recovery rule (due list, period lookup)": spent["_pop_due"] + spent["searchsorted"],
        "neighbour-count update (CSR pairs, scatter-add)": spent["_neighbour_update"],
        "infections' bookkeeping (less the period lookup)": spent["_infect"] - spent["searchsorted"],
        "compaction and counts": spent["_compact"],
        "reset (random numbers)": t_reset,
    }
    phases["rest of step() and run()"] = total - sum(phases.values())
    glue = spent["_substep"] - sum(spent[op] for op in ops)
    return phases | {"Python glue in the steps (within the phases above)": glue, "total": total,
                     "steps": calls["_substep"], "array operations per step": sum(calls[op] for op in ops)
                     / calls["_substep"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gillespie-runs", type=int, default=40)
    ap.add_argument("--clock", choices=["cpu", "wall"], default=None)
    ap.add_argument("--max-n", type=int, default=100_000, help="skip the cases of larger graphs")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    clock = args.clock or ("cpu" if device.type == "cpu" else "wall")
    if clock == "cpu" and device.type != "cpu":
        raise SystemExit("--clock cpu measures this thread's CPU time: use it on the CPU only")
    peak = bench.measure_peak(torch.float32, device)
    print(peak.describe())
    weibull = SP.Weibull(3.0, 5.0)
    laws = {"Weibull(3,5)": weibull, "exponential (Markov)": weibull.markov()}
    rows: list[bench.Row] = []
    accuracy: dict[str, dict[str, float]] = {}
    graphs: dict[int, object] = {}
    for n, lname, replicas, eon_runs in CASES:
        if n > args.max_n:
            continue
        G = graphs.setdefault(n, SP.make_graph("ba", n, 0))
        law, case = laws[lname], f"N={n} {lname}"
        best: tuple[float, np.ndarray] | None = None
        for r in replicas:
            row, sizes = engine_row(case, G, law, r, device, args.repeats, clock, peak)
            rows.append(row)
            if best is None or row.seconds < best[0]:
                best = (row.seconds, sizes)
        row, eon_sizes = eon_row(case, G, law, eon_runs, "nonmarkov", BASELINE, clock)
        rows.append(row)
        if n == 1000:
            a, b = SP.outbreak_stats(eon_sizes), SP.outbreak_stats(best[1])
            accuracy[case] = {"EoN P_ext": a.p_ext, "engine P_ext": b.p_ext, "EoN major": a.major,
                              "engine major": b.major}
        if isinstance(law, SP.Exponential):
            rows.append(eon_row(case, G, law, eon_runs, "fast_sir", "EoN fast_SIR", clock)[0])
            rows.append(eon_row(case, G, law, args.gillespie_runs, "gillespie", "EoN Gillespie_SIR", clock)[0])
    report(rows, accuracy, peak, device, args, clock, laws)


def report(rows: list[bench.Row], accuracy: dict, peak: bench.Peak, device: torch.device, args, clock: str,
           laws: dict) -> None:
    t = {(r.case, r.method): r for r in rows}
    peers = (BASELINE, "EoN fast_SIR", "EoN Gillespie_SIR")
    speedups = {f"{r.method} vs {m} ({r.case})": round(t[r.case, m].seconds / r.seconds, 2)
                for r in rows if r.method.startswith("engine") for m in peers if (r.case, m) in t}
    per_event = {f"{r.method} vs {BASELINE} ({r.case})":
                 round(r.extra["node-events_per_s"] / t[r.case, BASELINE].extra["node-events_per_s"], 2)
                 for r in rows if r.method.startswith("engine") and (r.case, BASELINE) in t}
    best = {case: max(v for k, v in speedups.items() if BASELINE in k and k.endswith(f"({case})"))
            for case in dict.fromkeys(r.case for r in rows)}
    where = "a GPU" if device.type == "cuda" else "one CPU thread"
    goal_best = best.get(GOAL_CASE, float("nan"))
    goals = {f"best speed-up over EoN's {BASELINE.removeprefix('EoN ')}, {GOAL_CASE}": goal_best,
             f">= {GOAL:g}x EoN's {BASELINE.removeprefix('EoN ')} on {where}, {GOAL_CASE} (issue 43)":
                 bool(goal_best >= GOAL)}
    prof_law = laws["Weibull(3,5)"]
    profile = profile_engine(SP.make_graph("ba", 1000, 0), prof_law, 1024, device)
    notes = {"graph": "BA m=3 seed 0", "beta": BETA, "dt": DT, "rule": "exact", "threads": args.threads,
             "device": str(device), "clock": clock, "peak": peak.describe(), "speedups": speedups,
             "speedups_per_node_event": per_event, "best_speedup_per_case": best, "accuracy": accuracy,
             "profile_N1000_R1024_seconds": profile, "goals": goals}
    bench.publish("spreading", rows, baseline=BASELINE, notes=notes)
    print(f"\nroofline ({peak.describe()}):")
    for r in rows:
        keys = [k for k in r.extra if k.endswith("_per_s") and k != "epidemics_per_s"] + \
               [k for k in r.extra if k.startswith("of_peak")]
        print("  " + bench.roofline_line(f"{r.case}, {r.method}", {k: r.extra[k] for k in keys}))
    print("\nmatched accuracy (timed runs; notebook 08 asserts |engine - EoN| <= 0.07 on P_ext, 0.03 on major size):")
    for case, a in accuracy.items():
        print(f"  {case}: " + ", ".join(f"{k} {v:.3f}" for k, v in a.items()))
    print("\nprofile of one engine batch (N=1000, Weibull, R=1024, wall clock):")
    total = profile["total"]
    for k, v in profile.items():
        if k in ("steps", "array operations per step"):
            print(f"  {k}: {v:.0f}")
        elif k != "total":
            print(f"  {k}: {v * 1e3:.1f} ms ({100 * v / total:.0f} %)")
    print(f"  total: {total * 1e3:.1f} ms for {profile['steps']:.0f} steps "
          f"({total / profile['steps'] * 1e6:.0f} us per step)")
    print("\nspeed-ups (EoN seconds per epidemic / engine's):")
    for k, v in speedups.items():
        print(f"  {k}: {v}x")
    print("\nspeed-ups per node-event (engine node-events per second / EoN's):")
    for k, v in per_event.items():
        print(f"  {k}: {v}x")
    print("\ngoals:")
    for k, v in goals.items():
        print(f"  {k}: {v}")


if __name__ == "__main__":
    main()
