"""Wall-clock timing that counts GPU work: CUDA kernels run asynchronously, so a clock read right after a call
returns measures only the launch unless the device is synchronised first.

Users: ``repro.papers.d3llm`` (paper 03, the KV-cache sweep), ``repro.papers.spreading`` (paper 08, the engine's
final sizes), ``repro.papers.gbi`` (paper 17, flow sampling against MCMC), ``repro.papers.tsmcts`` (paper 18, one
batched search), ``repro.papers.pogo`` (paper 19, time per optimiser step); outside the papers ``repro.bench``
(:func:`repro.bench.time_call`) and ``repro.runtime`` (which re-exports :class:`Timer`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = ["Timer", "sync", "timed"]

T = TypeVar("T")


def sync(device: torch.device | str | None) -> None:
    """Wait for the work queued on ``device`` when it is a CUDA device; nothing on any other device (its work is
    done when the call returns) or for ``None``. Used by :class:`Timer`, hence by every user of this module."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Context manager measuring the seconds its body takes on ``clock`` (default: the wall clock,
    :func:`time.perf_counter`) into ``seconds``. CUDA on ``sync_device`` is synchronised (:func:`sync`) before the
    clock stops, also when the body raises, so GPU work is counted; and before it starts unless
    ``sync_start=False`` (then work queued before the ``with`` may be counted too).

    Used by ``repro.papers.d3llm``, ``repro.papers.spreading``, ``repro.papers.tsmcts``, ``repro.papers.pogo`` (on
    its CPU-time clock in quick mode), :func:`timed` (hence ``repro.papers.gbi``), ``repro.bench`` and
    ``repro.runtime`` (re-exported as ``repro.runtime.Timer``).

    >>> with Timer() as t:
    ...     pass
    >>> t.seconds >= 0
    True
    """

    def __init__(self, sync_device: torch.device | str | None = None, *, clock: Callable[[], float] = time.perf_counter,
                 sync_start: bool = True):
        self.sync_device = None if sync_device is None else torch.device(sync_device)
        self.clock = clock
        self.sync_start = sync_start
        self.seconds = math.nan

    def __enter__(self) -> Timer:
        if self.sync_start:
            sync(self.sync_device)
        self._t0 = self.clock()
        return self

    def __exit__(self, *exc: object) -> None:
        sync(self.sync_device)
        self.seconds = self.clock() - self._t0


def timed(device: torch.device | str | None, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> tuple[T, float]:
    """``fn(*args, **kwargs)`` and its wall time in seconds, CUDA on ``device`` synchronised before and after
    (a :class:`Timer`). Used by ``repro.papers.gbi``."""
    with Timer(device) as t:
        out = fn(*args, **kwargs)
    return out, t.seconds
