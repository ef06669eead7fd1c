"""repro.bench's roofline: the fractions are the arithmetic they claim, and the measured peak is a real rate."""

from __future__ import annotations

import pytest
import torch

from repro import bench


def test_roofline_is_work_over_time_over_peak():
    peak = bench.Peak(flops=1e11, bandwidth=2e10, dtype="float32", threads=1, device="cpu")
    r = bench.roofline(0.5, peak, flops=1e10, bytes_moved=1e9, count=400, unit="node_updates")
    assert r["gflop_per_s"] == pytest.approx(20.0) and r["of_peak_flops"] == pytest.approx(0.2)
    assert r["gb_per_s"] == pytest.approx(2.0) and r["of_peak_bandwidth"] == pytest.approx(0.1)
    assert r["node_updates_per_s"] == pytest.approx(800)
    line = bench.roofline_line("POGO", r)
    assert line.startswith("POGO: 20.00 GFLOP/s = 20.0 % of peak; 2.00 GB/s = 10.0 % of peak; 800 node_updates/s")
    with pytest.raises(ValueError, match="seconds"):
        bench.roofline(0.0, peak, flops=1.0)


def test_measured_peak_beats_a_naive_kernel():
    """The matmul peak must exceed what an unvectorised row-by-row product reaches on the same machine, and the
    streaming bandwidth must be positive and finite: a broken timer or FLOP count would fail this."""
    torch.manual_seed(0)
    peak = bench.measure_peak(n=256, stream_bytes=16 * 2**20, repeats=3)
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    seconds = bench.time_call(lambda: torch.stack([(a[i, :, None] * b).sum(0) for i in range(64)]), repeats=3)
    naive = 2 * 64**3 / seconds
    assert peak.flops > naive and 0 < peak.bandwidth < float("inf")
    assert peak.threads == torch.get_num_threads() and peak.dtype == "float32" and "GFLOP/s" in peak.describe()
