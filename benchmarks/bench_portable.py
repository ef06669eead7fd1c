"""The cost of issue 44's portable kernels, as ratios measured in one process (one thread).

``python benchmarks/bench_portable.py`` times, interleaved round by round, one source-training step of notebook 14's
re-ID CNN (forward and backward, batch 64 at 48x24) and its inference over 512 crops with torch's default
convolution backends (oneDNN, NNPACK) and with :func:`repro.runtime.portable_kernels` (ATen's im2col + BLAS); and
the GEMMs of the other notebooks. MKL's branch is fixed at process start (``MKL_CBWR``), so run it once per branch
and compare the printed times: ``MKL_CBWR=AVX2,STRICT python ...`` (before issue 44) and ``MKL_CBWR=COMPATIBLE``.
Roofline (issue 43 item 1): every case's FLOPs (torch's ``FlopCounterMode``; a training step counted as its forward,
backward and optimiser products) over its time, against the square-matmul peak measured in this process
(:func:`repro.bench.measure_peak`, so under this process's MKL branch: run it once per branch to see what the branch
costs against the machine). Prints JSON.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from repro import bench
from repro.papers.scale_ps.network import CosineClassifier, ReIDNet

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "7"))


def _time(fn, min_s: float = 0.3) -> float:
    fn()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        if (dt := time.perf_counter() - t0) >= min_s:
            return dt / n


def _backends(enabled: bool) -> None:
    torch.backends.mkldnn.enabled = enabled
    torch.backends.nnpack.set_flags(enabled)


def flops(fn) -> int:
    """Floating-point operations of one call of ``fn`` (torch's counter: matrix products and convolutions)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    g = torch.Generator().manual_seed(0)
    net, clf = ReIDNet(), CosineClassifier(128, 100)
    opt = torch.optim.Adam([*net.parameters(), *clf.parameters()], lr=1e-3)
    x, y = torch.rand(64, 3, 48, 24, generator=g), torch.randint(0, 100, (64,), generator=g)
    crops = torch.rand(512, 3, 48, 24, generator=g)

    def train_step():
        opt.zero_grad()
        F.cross_entropy(clf(net(x)), y).backward()
        opt.step()

    def infer():
        with torch.no_grad():
            net.eval()
            net(crops)
            net.train()

    a, b = torch.randn(512, 512, generator=g), torch.randn(512, 512, generator=g)
    s, t = torch.randn(1000, 16, 16, generator=g), torch.randn(1000, 16, 16, generator=g)
    cases = {"cnn train step": train_step, "cnn inference 512": infer}
    times: dict[str, dict[str, list[float]]] = {k: {"default": [], "portable": []} for k in cases}
    gemm: dict[str, list[float]] = {"mm 512^3": [], "bmm 1000x16^2": []}
    for _ in range(ROUNDS):
        for name, fn in cases.items():
            for label, on in (("default", True), ("portable", False)):
                _backends(on)
                times[name][label].append(_time(fn))
        _backends(True)
        gemm["mm 512^3"].append(_time(lambda: a @ b))
        gemm["bmm 1000x16^2"].append(_time(lambda: torch.bmm(s, t)))
    peak = bench.measure_peak(torch.float32, "cpu")
    work = {**{k: flops(fn) for k, fn in cases.items()}, "mm 512^3": 2 * 512**3, "bmm 1000x16^2": 1000 * 2 * 16**3}
    out = {"MKL_CBWR": os.environ.get("MKL_CBWR"), "rounds": ROUNDS, "peak": peak.describe()}
    for name, d in times.items():
        med = {k: statistics.median(v) for k, v in d.items()}
        out[name] = {"default_ms": round(med["default"] * 1e3, 2), "portable_ms": round(med["portable"] * 1e3, 2),
                     "ratio": round(med["portable"] / med["default"], 2),
                     **{f"{label}_of_peak": round(bench.roofline(sec, peak, flops=work[name])["of_peak_flops"], 3)
                        for label, sec in med.items()}}
    for k, v in gemm.items():
        sec = statistics.median(v)
        frac = bench.roofline(sec, peak, flops=work[k])["of_peak_flops"]
        out[k] = {"ms": round(sec * 1e3, 3), "of_peak": round(frac, 3)}
    out["gflop_per_call"] = {k: round(w / 1e9, 4) for k, w in work.items()}
    print(json.dumps(out, indent=1))
    for k, w in work.items():
        sec = statistics.median(gemm[k]) if k in gemm else statistics.median(times[k]["default"])
        print(bench.roofline_line(k, bench.roofline(sec, peak, flops=w)))


if __name__ == "__main__":
    main()
