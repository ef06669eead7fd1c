"""Run-time settings shared by every notebook: mode, seed, device, threads and timing.

A notebook's parameters cell sets ``MODE``, ``SEED`` and ``DEVICE``; the next cell calls
:func:`setup`, which validates them, seeds every generator, pins threads in quick mode and starts the
clock that :func:`repro.report.finish` reads.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass

import numpy as np
import torch

MODES = ("quick", "full")
DEVICES = ("auto", "cpu", "cuda", "mps")

_clock: dict[str, float] = {}


def check_mode(mode: str) -> str:
    """Return ``mode`` if it is one of :data:`MODES`, else raise a ``ValueError`` naming the valid ones."""
    if mode not in MODES:
        raise ValueError(f"unknown MODE {mode!r}; valid modes are {', '.join(map(repr, MODES))}")
    return mode


def device(name: str = "auto") -> torch.device:
    """Resolve a device name: ``"auto"`` picks cuda > mps > cpu; an unavailable device raises."""
    if name not in DEVICES and not name.startswith("cuda:"):
        raise ValueError(f"unknown DEVICE {name!r}; valid devices are {', '.join(map(repr, DEVICES))}")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"DEVICE {name!r} requested but CUDA is not available on this machine")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ValueError("DEVICE 'mps' requested but MPS is not available on this machine")
    return torch.device(name)


def seed_everything(seed: int) -> np.random.Generator:
    """Seed Python, NumPy and torch (all devices); return a fresh NumPy ``Generator`` for ``seed``."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"SEED must be a non-negative int, got {seed!r}")
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 (legacy global RNG that third-party code may use)
    torch.manual_seed(seed)
    return np.random.default_rng(seed)


def pin_threads(n: int = 1) -> None:
    """Use ``n`` intra-op threads. One thread is fastest for small models on 2-core machines
    (TOOLCHAIN.md: 2 threads are up to 60x slower when another process holds a core)."""
    os.environ["OMP_NUM_THREADS"] = str(n)
    os.environ["MKL_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)


@dataclass(frozen=True)
class Run:
    """What :func:`setup` resolved: the validated mode, the seed, the torch device and a NumPy RNG."""

    mode: str
    seed: int
    device: torch.device
    rng: np.random.Generator

    @property
    def quick(self) -> bool:
        return self.mode == "quick"


def setup(mode: str, seed: int = 0, device_name: str = "auto") -> Run:
    """Validate the notebook parameters, seed everything, pin threads in quick mode, start the clock.

    Quick mode is the CI configuration: one thread and deterministic algorithms on CPU, so two runs give
    identical numbers. Full mode keeps torch's default threading.
    """
    check_mode(mode)
    dev = device(device_name)
    if mode == "quick":
        pin_threads(1)
        if dev.type == "cpu":
            torch.use_deterministic_algorithms(True)
    rng = seed_everything(seed)
    start_clock()
    return Run(mode=mode, seed=seed, device=dev, rng=rng)


def start_clock() -> None:
    """(Re)start the notebook clock read by :func:`elapsed`."""
    _clock["start"] = time.perf_counter()


def elapsed() -> float | None:
    """Seconds since :func:`setup` (``None`` if it was never called in this process)."""
    start = _clock.get("start")
    return None if start is None else time.perf_counter() - start


class Timer:
    """Context manager measuring wall time; synchronises CUDA so GPU work is counted.

    >>> with Timer() as t:
    ...     pass
    >>> t.seconds >= 0
    True
    """

    def __init__(self, sync_device: torch.device | None = None):
        self.sync_device = sync_device
        self.seconds = float("nan")

    def _sync(self) -> None:
        if self.sync_device is not None and self.sync_device.type == "cuda":
            torch.cuda.synchronize(self.sync_device)

    def __enter__(self) -> Timer:
        self._sync()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._sync()
        self.seconds = time.perf_counter() - self._t0
