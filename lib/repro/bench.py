"""Shared helpers for the benchmarks in ``benchmarks/``: time a callable fairly, print ratios to a peer
measured in the same run, write ``results/bench-<name>.json``.

Speed goals live here, never in timed tests: a benchmark reports ratios against a peer run on the same
machine in the same process, so a loaded CI machine changes both sides alike.
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
