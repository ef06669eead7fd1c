"""Shared helpers for the benchmarks in ``benchmarks/``: time a callable fairly, print ratios to a peer
measured in the same run, write ``results/bench-<name>.json``.

Speed goals live here, never in timed tests: a benchmark reports ratios against a peer run on the same
machine in the same process, so a loaded CI machine changes both sides alike. Each benchmark also reads its
rates against this machine's limits (:func:`measure_peak`, :func:`roofline`): the work a method does (FLOPs of
its matrix products, bytes it streams, or a count such as node-updates), the achieved rate, and the fraction of
the peak measured in the same run at the same dtype and thread count.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .common.timing import Timer
from .tools import paths, provenance


def time_call(fn: Callable[[], Any], *, repeats: int = 5, warmup: int = 1, number: int = 1,
              device: torch.device | str | None = None) -> float:
    """Median seconds per call of ``fn`` over ``repeats`` timings of ``number`` calls each, after ``warmup``
    untimed calls; CUDA is synchronised around every timing."""
    if repeats < 1 or number < 1:
        raise ValueError("repeats and number must be >= 1")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        with Timer(device) as t:
            for _ in range(number):
                fn()
        times.append(t.seconds / number)
    return statistics.median(times)


@dataclass
class Row:
    """One measured configuration: ``case`` (e.g. a shape), ``method``, seconds per call, extra numbers."""

    case: str
    method: str
    seconds: float
    extra: dict[str, float] = field(default_factory=dict)


def ratios(rows: list[Row], baseline: str) -> list[dict[str, Any]]:
    """Each row with ``ratio`` = its time / the baseline method's time in the same case (> 1: slower)."""
    base = {r.case: r.seconds for r in rows if r.method == baseline}
    out = []
    for r in rows:
        d = asdict(r)
        d["ratio_to_" + baseline] = r.seconds / base[r.case] if r.case in base else None
        out.append(d)
    return out


@dataclass(frozen=True)
class Peak:
    """This machine's measured limits at one dtype, thread count and device: ``flops`` (FLOP/s of a square
    matrix product, the best a dense kernel reaches) and ``bandwidth`` (bytes/s of a streaming ``a + b`` over
    arrays far larger than the caches: read two, write one)."""

    flops: float
    bandwidth: float
    dtype: str
    threads: int
    device: str

    def describe(self) -> str:
        return (f"peak on {self.device} ({self.dtype}, {self.threads} thread(s)): {self.flops / 1e9:.1f} GFLOP/s "
                f"(square matmul), {self.bandwidth / 1e9:.1f} GB/s (streaming add)")


def measure_peak(dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", *, n: int = 1024,
                 stream_bytes: int = 256 * 2**20, repeats: int = 5) -> Peak:
    """The peak a benchmark's roofline fractions are read against, measured now, in this process (so at its
    thread count): an ``n``×``n`` matrix product (``2 n³`` FLOPs; the best of ``repeats``) and an elementwise
    add of two ``stream_bytes`` arrays (``3 × stream_bytes`` moved)."""
    device = torch.device(device)
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(device=device, dtype=dtype) for _ in range(2))
    out = torch.empty_like(a)
    t_mm = _best(lambda: torch.mm(a, b, out=out), repeats, device)
    m = stream_bytes // torch.finfo(dtype).bits * 8
    x, y = torch.ones(m, device=device, dtype=dtype), torch.ones(m, device=device, dtype=dtype)
    z = torch.empty_like(x)
    t_add = _best(lambda: torch.add(x, y, out=z), repeats, device)
    moved = 3 * m * x.element_size()
    return Peak(flops=2 * n**3 / t_mm, bandwidth=moved / t_add, dtype=str(dtype).removeprefix("torch."),
                threads=torch.get_num_threads(), device=str(device))


def _best(fn: Callable[[], Any], repeats: int, device: torch.device, warm_s: float = 0.3) -> float:
    """The fastest of ``repeats`` timed calls after ``warm_s`` seconds of untimed calls (a peak is what the machine
    can do: the first products of a process ran at 70-75 % of the later rate on the development machine, while the
    clock and the library's thread pool warmed up)."""
    with Timer(device) as warm:
        fn()
    calls = max(2, int(warm_s / max(warm.seconds, 1e-6)))
    for _ in range(calls):
        fn()
    best = float("inf")
    for _ in range(repeats):
        with Timer(device) as t:
            fn()
        best = min(best, t.seconds)
    return best


def roofline(seconds: float, peak: Peak, *, flops: float | None = None, bytes_moved: float | None = None,
             count: float | None = None, unit: str = "") -> dict[str, float]:
    """One method's work per call against the machine: achieved GFLOP/s and its fraction of ``peak.flops``
    (given ``flops``), GB/s and its fraction of ``peak.bandwidth`` (given ``bytes_moved``, a lower bound on the
    traffic: each operand read and each result written once), and a rate of ``count`` ``unit`` per second (e.g.
    node-updates). ``seconds`` is the time per call that did that work."""
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    out: dict[str, float] = {}
    if flops is not None:
        out |= {"gflop": flops / 1e9, "gflop_per_s": flops / seconds / 1e9,
                "of_peak_flops": flops / seconds / peak.flops}
    if bytes_moved is not None:
        out |= {"gb": bytes_moved / 1e9, "gb_per_s": bytes_moved / seconds / 1e9,
                "of_peak_bandwidth": bytes_moved / seconds / peak.bandwidth}
    if count is not None:
        out[f"{unit or 'items'}_per_s"] = count / seconds
    return out


def roofline_line(method: str, r: dict[str, float]) -> str:
    """``roofline`` as one printed line: ``method: 3.1 GFLOP/s = 4.2 % of peak; 1.2 GB/s = 9.0 % of peak``."""
    parts = []
    if "gflop_per_s" in r:
        parts.append(f"{r['gflop_per_s']:.2f} GFLOP/s = {100 * r['of_peak_flops']:.1f} % of peak")
    if "gb_per_s" in r:
        parts.append(f"{r['gb_per_s']:.2f} GB/s = {100 * r['of_peak_bandwidth']:.1f} % of peak")
    parts += [f"{v:.3g} {k.removesuffix('_per_s')}/s" for k, v in r.items() if k.endswith("_per_s")
              and k not in ("gflop_per_s", "gb_per_s")]
    return f"{method}: " + "; ".join(parts)


def publish(name: str, rows: list[Row], baseline: str, notes: dict[str, Any] | None = None) -> dict[str, Any]:
    """Print the rows as a table of times and ratios to ``baseline``; write ``results/bench-<name>.json``."""
    table = ratios(rows, baseline)
    key = "ratio_to_" + baseline
    width = max(len(r.method) for r in rows)
    for case in dict.fromkeys(r.case for r in rows):
        print(f"\n{case}")
        for d in (d for d in table if d["case"] == case):
            ratio = "" if d[key] is None else f"  x{d[key]:.2f} vs {baseline}"
            extra = "  ".join(f"{k}={v:.3g}" for k, v in d["extra"].items())
            print(f"  {d['method']:<{width}}  {d['seconds'] * 1e3:10.3f} ms{ratio}  {extra}")
    record = {"benchmark": name, "baseline": baseline, "rows": table, "notes": notes or {},
              "hardware": provenance.hardware(), "versions": provenance.versions(), "git": provenance.git_revision(),
              "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    out = paths.results_dir() / f"bench-{name}.json"
    provenance.write_json_atomic(out, record)
    print(f"\nwritten: {out}")
    return record
