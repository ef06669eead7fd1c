"""repro.common.timing: CUDA-synchronised timing (users: papers 03, 08, 17, 18, 19, repro.bench, repro.runtime).

No GPU is needed: ``torch.cuda.synchronize`` is replaced by a recorder, and the clock by a counter, so the tests
see exactly when the device is synchronised and when the clock is read."""

from __future__ import annotations

import math

import pytest
import torch

from repro import bench, runtime
from repro.common import timing
from repro.common.timing import Timer, sync, timed


@pytest.fixture
def events(monkeypatch):
    """A log of ``("sync", device)`` and ``("clock", value)`` events; the clock returns 10, 11, 12, ..."""
    log: list[tuple[str, object]] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append(("sync", torch.device(device))))
    ticks = iter(range(10, 1000))

    def clock() -> float:
        t = float(next(ticks))
        log.append(("clock", t))
        return t

    return log, clock


def test_sync_waits_on_cuda_only(events):
    log, _ = events
    for dev in (None, "cpu", torch.device("cpu"), "meta"):
        sync(dev)
    assert log == []
    sync("cuda")
    sync(torch.device("cuda", 1))
    assert log == [("sync", torch.device("cuda")), ("sync", torch.device("cuda", 1))]


def test_timer_synchronises_before_and_after_the_clock(events):
    log, clock = events
    with Timer("cuda:0", clock=clock) as t:
        log.append(("body", None))
    cuda = torch.device("cuda", 0)
    assert log == [("sync", cuda), ("clock", 10.0), ("body", None), ("sync", cuda), ("clock", 11.0)]
    assert t.seconds == 1.0


def test_timer_without_start_sync_starts_the_clock_at_once(events):
    log, clock = events
    with Timer(torch.device("cuda"), clock=clock, sync_start=False) as t:
        pass
    assert log == [("clock", 10.0), ("sync", torch.device("cuda")), ("clock", 11.0)]
    assert t.seconds == 1.0


def test_timer_on_cpu_reads_the_clock_only(events):
    log, clock = events
    with Timer("cpu", clock=clock) as t:
        pass
    with Timer(clock=clock) as u:
        pass
    assert log == [("clock", 10.0), ("clock", 11.0), ("clock", 12.0), ("clock", 13.0)]
    assert (t.seconds, u.seconds) == (1.0, 1.0)


def test_timer_stops_also_when_the_body_raises(events):
    log, clock = events
    t = Timer("cuda", clock=clock)
    assert math.isnan(t.seconds)
    with pytest.raises(KeyError), t:
        raise KeyError("boom")
    assert log[-2:] == [("sync", torch.device("cuda")), ("clock", 11.0)]
    assert t.seconds == 1.0


def test_timer_default_clock_measures_wall_time():
    with Timer() as t:
        sum(range(10_000))
    assert 0 <= t.seconds < 5


def test_timed_returns_the_result_and_passes_any_argument(events):
    log, _ = events

    def fn(a, b, *, device, fn):  # keyword names that timed itself uses: its own are positional-only
        return a + b, device, fn

    out, seconds = timed("cuda", fn, 1, 2, device="x", fn="y")
    assert out == (3, "x", "y")
    assert seconds >= 0
    assert [e for e, _ in log] == ["sync", "sync"]


def test_runtime_and_bench_use_the_common_timer(events, monkeypatch):
    assert runtime.Timer is timing.Timer
    log, _ = events
    calls = []
    assert bench.time_call(lambda: calls.append(1), repeats=3, warmup=2, number=4, device="cuda") >= 0
    assert len(calls) == 2 + 3 * 4
    assert log == [("sync", torch.device("cuda"))] * 6  # before and after each of the 3 timings
