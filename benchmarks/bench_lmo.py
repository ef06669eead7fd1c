"""Muon's Newton–Schulz-5 against the exact spectral LMO (the SVD polar factor ``U Vᵀ``): time and distance.

Run ``python benchmarks/bench_lmo.py`` (CPU, under a minute on 2 cores) or, where a GPU is available,
``python benchmarks/bench_lmo.py --device cuda --dtype bfloat16 --big`` (adds 4096², NS5 in bfloat16 as Muon runs it).
Writes ``results/bench-lmo.json``. For each shape it reports the seconds per call of ``newton_schulz5`` and of
``torch.linalg.svd`` + ``U @ Vh`` (same input, same dtype for the SVD: float32; LAPACK/cuSOLVER has no bfloat16),
the time ratio, and how far NS5 lands from the polar factor: relative Frobenius distance, cosine, and the range of
its singular values (Muon documents roughly [0.5, 1.5]; the real band is [0.68, 1.21] for singular values above
1.6e-3 of ‖G‖_F, and square matrices have smaller ones, which fall short of it: see
:func:`repro.common.linalg.newton_schulz5`). Inputs are Gaussian matrices.

The big shapes use fewer repeats (see ``CASES``); timings are medians. CPU runs use one thread by default: with two
OpenMP threads on a 2-core machine that another process shares, timings vary by 10x between runs.

Roofline: the run measures this machine's peak before and after the cases (``repro.bench.measure_peak``: square
matrix products of 512 and 1024 and a streaming add at the same dtype and thread count, the best reading; the
bfloat16 peak too when NS5 runs in bfloat16), then prints for each row its FLOPs per call, the achieved GFLOP/s and
the fraction of the peak (also in the rows' extra and the notes). FLOPs (:func:`ns5_flops`,
:func:`svd_polar_flops`): NS5 runs ``steps`` iterations of three products on the ``m × k`` matrix (``m <= k``):
``A = X Xᵀ`` (``2m²k``), ``A·A`` (``2m³``) and ``(b A + c A²) X`` (``2m²k``), exact by the code of
:func:`repro.common.linalg.newton_schulz5` (it equals torch's FlopCounterMode on it). The SVD's is a lower bound:
the Householder bidiagonalisation every dense SVD starts with (``4km² − 4m³/3``, Golub & Van Loan, *Matrix
Computations*, 4th ed., §5.4.8) and ``U Vh`` (``2km²``); LAPACK's ``gesdd`` does more (the bidiagonal SVD and the
singular vectors), so its fraction of the peak is a lower bound too.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, replace

import torch

from repro.bench import Peak, Row, measure_peak, publish, roofline, roofline_line, time_call
from repro.common.linalg import newton_schulz5

# (case name, batch shape + matrix shape, repeats); the big ones are timed fewer times to keep the CPU run short
CASES = [
    ("256x256", (256, 256), 20),
    ("1024x1024", (1024, 1024), 5),
    ("4096x1024", (4096, 1024), 3),
    ("batch 32 x 256x256", (32, 256, 256), 5),
    ("batch 4 x 1024x1024", (4, 1024, 1024), 3),
]
BIG = [("4096x4096", (4096, 4096), 3), ("batch 8 x 4096x1024", (8, 4096, 1024), 3)]


def ns5_flops(shape: tuple[int, ...], steps: int = 5) -> int:
    """FLOPs of :func:`newton_schulz5` on a batch ``shape = (*batch, a, b)``: per iteration ``4m²k + 2m³`` with
    ``m = min(a, b)``, ``k = max(a, b)`` (the normalisation and the elementwise terms are left out)."""
    *batch, a, b = shape
    m, k = min(a, b), max(a, b)
    return math.prod(batch) * steps * (4 * m * m * k + 2 * m**3)


def svd_polar_flops(shape: tuple[int, ...]) -> float:
    """A lower bound on the FLOPs of :func:`polar_svd`, per matrix: the bidiagonalisation ``4km² − 4m³/3`` and the
    product ``U Vh`` (``2km²``), ``m = min(a, b)``, ``k = max(a, b)``."""
    *batch, a, b = shape
    m, k = min(a, b), max(a, b)
    return math.prod(batch) * (4 * k * m * m - 4 * m**3 / 3 + 2 * k * m * m)


def measure_peaks(dtype: torch.dtype, device: torch.device) -> list[Peak]:
    """``measure_peak`` with square products of 512 and of 1024 (a 1024² product ran slower than a 512² one here,
    and the first reading in a process came out 20–30 % low)."""
    return [measure_peak(dtype, device, n=n) for n in (512, 1024)]


def best_peak(peaks: list[Peak]) -> Peak:
    """The highest reading per quantity: a peak read low would inflate every fraction."""
    return replace(peaks[0], flops=max(q.flops for q in peaks), bandwidth=max(q.bandwidth for q in peaks))


def polar_svd(G: torch.Tensor) -> torch.Tensor:
    U, _, Vh = torch.linalg.svd(G, full_matrices=False)
    return U @ Vh


def distance(X: torch.Tensor, P: torch.Tensor) -> dict[str, float]:
    """How far the NS5 output ``X`` is from the polar factor ``P`` (worst over the batch)."""
    X, P = X.double(), P.double()
    rel = torch.linalg.matrix_norm(X - P) / torch.linalg.matrix_norm(P)
    cos = (X * P).sum((-2, -1)) / (torch.linalg.matrix_norm(X) * torch.linalg.matrix_norm(P))
    sv = torch.linalg.svdvals(X)
    return {"rel_frobenius_dist": float(rel.max()), "cosine": float(cos.min()),
            "sv_min": float(sv.min()), "sv_max": float(sv.max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="NS5 working precision (the SVD always runs in float32)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: on a shared 2-core machine 2 OpenMP threads time erratically; "
                         "0 leaves torch's default)")
    ap.add_argument("--big", action="store_true", help="add 4096x4096 and a batch of 8 x 4096x1024 (GPU)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    ns_dtype = getattr(torch, args.dtype)
    dtypes = {"float32": torch.float32, args.dtype: ns_dtype}
    readings = {k: measure_peaks(d, dev) for k, d in dtypes.items()}  # before the cases; again after them
    gen = torch.Generator(device=dev).manual_seed(0)
    rows, shapes = [], {}
    for case, shape, repeats in CASES + (BIG if args.big else []):
        G = torch.randn(*shape, generator=gen, device=dev, dtype=torch.float32)
        X, P = newton_schulz5(G, dtype=ns_dtype), polar_svd(G)
        ns_name = "ns5" if ns_dtype == torch.float32 else f"ns5-{args.dtype}"
        t_ns = time_call(lambda G=G: newton_schulz5(G, dtype=ns_dtype), repeats=repeats, warmup=1, device=dev)
        t_svd = time_call(lambda G=G: polar_svd(G), repeats=repeats, warmup=1, device=dev)
        rows.append(Row(case, ns_name, t_ns, distance(X, P)))
        rows.append(Row(case, "svd-polar", t_svd))
        shapes[case] = shape
        print(f"{case}: svd/ns5 time ratio {t_svd / t_ns:.2f}", flush=True)
    peaks = {k: best_peak(readings[k] + measure_peaks(d, dev)) for k, d in dtypes.items()}
    roofs: dict[str, dict[str, dict[str, float]]] = {}
    for r in rows:
        ns = r.method != "svd-polar"
        flops = ns5_flops(shapes[r.case]) if ns else svd_polar_flops(shapes[r.case])
        roof = roofline(r.seconds, peaks[args.dtype if ns else "float32"], flops=flops)
        r.extra |= {"gflop": roof["gflop"], "of_peak_flops": roof["of_peak_flops"]}
        roofs.setdefault(r.case, {})[r.method] = roof
    publish("lmo", rows, baseline="svd-polar", notes={
        "device": str(dev), "ns5_dtype": args.dtype, "svd_dtype": "float32", "torch_threads": torch.get_num_threads(),
        "repeats": {c: r for c, _, r in CASES + (BIG if args.big else [])},
        "input": "standard Gaussian matrices; distances are the worst over a batch",
        "ratio": "ratio_to_svd-polar < 1 means NS5 is faster",
        "peak": {k: asdict(v) for k, v in peaks.items()}, "roofline": roofs,
        "flops": "NS5: exact count of its products (ns5_flops); SVD polar: a lower bound, the bidiagonalisation plus "
                 "U Vh (svd_polar_flops); fractions of the best peak measured in this run at the same dtype and "
                 "threads",
    })
    for peak in peaks.values():
        print(peak.describe())
    for case, roof in roofs.items():
        print(f"roofline {case}:")
        for m, r in roof.items():
            label = f"{m} ({r['gflop']:.3g} GFLOP{' at least' if m == 'svd-polar' else ''})"
            print(f"  {roofline_line(label, r)}")


if __name__ == "__main__":
    main()
