"""Run-time settings shared by every notebook: mode, seed, device, threads, timing, and the notebook's handle.

A notebook's parameters cell sets ``MODE``, ``SEED`` and ``DEVICE``; the next cell calls ::

    run = runtime.setup("05-linear-contracts", MODE, SEED, DEVICE)
    CFG = run.config(quick=dict(n=2000, seeds=1), full=dict(n=100_000, seeds=5), smoke=dict(n=300, seeds=2))

which validates them, seeds every generator, pins threads in quick mode and starts the clock. ``MODE = "smoke"``
is the smoke tier: full mode's code path (``run.full`` is true, every full-mode setting applies) with the sizes
that ``smoke`` cuts, so the tests execute in seconds what otherwise only a long full run reaches. The returned
:class:`Run` knows the notebook, so figures and results need nothing repeated: ``run.savefig(fig, "rates")``,
``run.finish(claims, metrics)``.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import random
import re
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .common import seeding
from .common.timing import Timer  # re-exported: the notebooks' timer, CUDA synchronised
from .tools import offline, paths, portable, registry, trace
from .tools.paths import CI_MODES, MODES, check_mode

__all__ = ["MODES", "DEVICES", "Run", "Timer", "check_mode", "device", "elapsed", "parallel_map", "seed_everything",
           "setup", "smoke_cut", "workers"]

DEVICES = ("auto", "cpu", "cuda", "mps")
SLUG_RE = re.compile(r"^\d\d-[a-z0-9-]+$")

_clock: dict[str, float] = {}


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


MAX_SEED = 2**64 - 1  # the largest seed torch.manual_seed takes


def seed_everything(seed: int) -> np.random.Generator:
    """Seed Python, NumPy and torch (all devices); return a fresh NumPy ``Generator`` for ``seed``, an int in
    ``[0, 2**64 - 1]`` (not a bool: ``True`` would be recorded as the seed)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"SEED must be a non-negative int of at most 2**64 - 1, got {seed!r}")
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 (legacy global RNG that third-party code may use)
    torch.manual_seed(seed)
    return np.random.default_rng(seed)


def pin_threads(n: int = 1) -> None:
    """Use ``n`` intra-op threads. One thread is fastest for small models on 2-core machines
    (measured on the 2-core development machines: 2 threads are up to 60x slower when another process holds
    a core)."""
    os.environ["OMP_NUM_THREADS"] = str(n)
    os.environ["MKL_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)


def portable_kernels() -> None:
    """Convolutions through ATen's own im2col and BLAS instead of oneDNN and NNPACK (issue 44).

    oneDNN's convolution kernels are ISA-capped by ``ONEDNN_MAX_CPU_ISA``, but their blocking (and so the order of
    the sums) follows the CPU's cache sizes, which no variable caps; NNPACK (which torch uses for some convolutions
    once oneDNN is off) picks its kernels and tiles from the CPU alone. Measured on notebook 14: its first
    differing tensor between ``ONEDNN_MAX_CPU_ISA=AVX2`` and ``SSE41`` is the first convolution's output; with
    this, none depends on oneDNN's ISA. ATen's ``slow_conv2d`` (unfold + one GEMM per image) runs on MKL, which
    ``MKL_CBWR`` pins. oneDNN's other fp32 use, ``nn.LSTM``/``nn.GRU``, also falls back to ATen. Called by
    :func:`setup` when ``$REPRO_PORTABLE_KERNELS=1`` (:data:`repro.tools.portable.QUICK_ENV` sets it)."""
    torch.backends.mkldnn.enabled = False
    torch.backends.nnpack.set_flags(False)


@dataclass(frozen=True)
class Run:
    """One notebook run, as :func:`setup` resolved it: which notebook, the validated mode, the seed, the torch
    device and a NumPy RNG; saves the notebook's figures and writes its results."""

    slug: str
    mode: str
    seed: int
    device: torch.device
    rng: np.random.Generator
    packages: tuple[str, ...] = field(default=())
    figures: dict[str, list[str]] = field(default_factory=dict)  # name -> figure-policy problems (run.savefig)
    settings: dict[str, Any] = field(default_factory=dict)  # the resolved configuration (run.config)

    @property
    def quick(self) -> bool:
        return self.mode == "quick"

    @property
    def full(self) -> bool:
        """Whether this run takes full mode's code path: in full mode and in the smoke tier (full mode, cut small).
        A notebook branches on this (or on its settings), never on ``MODE`` itself."""
        return self.mode in ("full", "smoke")

    def config(self, quick: Mapping[str, Any], full: Mapping[str, Any] | None = None,
               smoke: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The quick settings, with ``full``'s overrides applied in full mode, and ``smoke``'s cuts applied on top of
        those in the smoke tier. ``full`` may only change keys that ``quick`` has, so a typo cannot add a setting
        that quick mode never uses. ``smoke`` may only make full mode smaller (:func:`smoke_cut`): numbers and
        lists of numbers, on the same side of 0 and 1, merged into nested settings key by key; every switch stays
        as full mode sets it, so the smoke tier runs full mode's code path. Both are checked in every mode."""
        full = dict(full or {})
        unknown = sorted(set(full) - set(quick))
        if unknown:
            raise KeyError(f"full-mode settings {unknown} have no quick-mode default")
        wrong = [f"{k} ({_kind(quick[k])} in quick mode, {_kind(v)} in full)" for k, v in full.items()
                 if _kind(v) != _kind(quick[k]) and "NoneType" not in (_kind(v), _kind(quick[k]))]
        if wrong:
            raise TypeError(f"full-mode settings of another type than their quick-mode default: {', '.join(wrong)}")
        tiers = {"quick": dict(quick), "full": {**quick, **full}}
        tiers["smoke"] = smoke_cut(tiers["full"], smoke or {})
        resolved = tiers[self.mode]
        self.settings.clear()
        self.settings.update(resolved)  # recorded in the results file by finish()
        return resolved

    def seed_for(self, name: str, *index: int) -> int:
        """The seed of this run's stream ``name`` (``index`` numbers a family of streams, e.g. one per problem):
        ``run.seed_for("eval")`` in place of ``SEED + 1``, so that no stream coincides with another seed's
        (:func:`repro.common.seeding.derive`). The replicate seeds of a notebook stay ``SEED + i``."""
        return seeding.derive(self.seed, name, *index)

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """``[fn(x) for x in items]``, the items shared among this machine's cores when that cannot change a
        number: in quick mode on CPU (one thread per process, so each core runs one item at a time). On CUDA
        and in full mode (torch's own threading) it is the plain loop. See :func:`parallel_map`."""
        n = workers() if self.quick and self.device.type == "cpu" else 1
        return parallel_map(fn, items, n, seed=self.seed)

    def savefig(self, fig: Any, name: str) -> None:
        """Save ``fig`` as ``results/figures/<slug>/<name>.png`` (for readers who want the files); the notebook
        still shows it inline, and the book renders that inline copy. Returns nothing, so a cell may end with it
        without printing a path (the outputs hold no paths)."""
        from . import plotting

        out = paths.figure_file(self.slug, name)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, metadata={"Software": None})
        self.figures[name] = plotting.figure_problems(fig)

    def finish(self, claims: list[Any], metrics: Mapping[str, Any] | None = None,
               display: bool = True) -> dict[str, Any]:
        """Verdicts, ``results/<slug>.json`` and the claims table (:func:`repro.report.finish`); raises
        :class:`repro.report.ClaimFailed` if an asserted claim does not hold."""
        from . import report

        return report.finish(self.slug, mode=self.mode, seed=self.seed, claims=claims, metrics=metrics,
                             packages=self.packages, elapsed=elapsed(), display=display,
                             figures=self.figures, config=self.settings)


def setup(slug: str, mode: str, seed: int = 0, device_name: str = "auto") -> Run:
    """Validate the notebook parameters, seed everything, pin threads in quick and smoke mode, start the clock.

    ``slug`` is the notebook's ``NN-name`` (its file stem). Quick mode is the CI configuration: one thread and
    deterministic algorithms on CPU, so two runs give identical numbers; the smoke tier runs the same way. Full
    mode keeps torch's default threading. The paper's own packages (``packages:`` in ``book/papers.yml``) are
    recorded with the results.
    With ``$REPRO_PORTABLE_KERNELS=1`` (quick mode's portable environment) convolutions avoid oneDNN and NNPACK
    (:func:`portable_kernels`), except in a notebook marked ``numerics: verdicts`` in ``book/papers.yml`` (its
    values are not kept between CPUs anyway, and ATen's convolution path made notebook 14 3.3x slower).
    With ``$REPRO_OFFLINE`` set (the batch runner and the tests set it), every
    non-loopback network connection is refused from here on (:mod:`repro.tools.offline`). With ``$REPRO_TRACE``
    set, every torch operation from here on is hashed into that log (:mod:`repro.tools.trace`: which operation
    differs between two runs).
    """
    if not isinstance(slug, str) or not SLUG_RE.match(slug):
        raise ValueError(f"setup() takes the notebook's slug 'NN-name' first, got {slug!r}")
    check_mode(mode)
    offline.install_if_requested()
    dev = device(device_name)
    if mode in CI_MODES:
        pin_threads(1)
        if dev.type == "cpu":
            torch.use_deterministic_algorithms(True)
    entry = registry.find(slug)
    verdicts_only = entry is not None and entry.numerics == "verdicts"
    if dev.type == "cpu" and os.environ.get(portable.KERNELS_ENV) == "1" and not verdicts_only:
        portable_kernels()
    rng = seed_everything(seed)
    trace.install_if_requested()
    start_clock()
    return Run(slug=slug, mode=mode, seed=seed, device=dev, rng=rng, packages=entry.packages if entry else ())


def smoke_cut(full: Mapping[str, Any], cuts: Mapping[str, Any], where: str = "smoke") -> dict[str, Any]:
    """Full mode's settings with the smoke tier's ``cuts`` applied: the smoke tier may only make full mode smaller.

    A cut replaces a number or a list of numbers (a size, a count, a grid); a nested mapping is cut key by key, so
    its keys (tasks, arms) stay. A cut must keep what decides a code path: it stays on the same side of 0 and of 1
    as full mode's value (a count of 0 switches a part off, a count of 1 skips the spread over seeds), and a list
    stays empty, single or longer as it was. Everything else (bools, strings, None, lists of names or of dicts,
    a mapping's keys) is a switch that the smoke tier cannot change: a ``KeyError`` names a cut of a setting full
    mode does not have, a ``TypeError`` a cut of a switch or one that crosses 0 or 1."""
    out = dict(full)
    for key, value in cuts.items():
        name = f"{where}.{key}"
        if key not in full:
            raise KeyError(f"smoke-tier setting {name} is not a setting of full mode")
        base = full[key]
        if isinstance(base, Mapping) and isinstance(value, Mapping):
            out[key] = smoke_cut(base, value, name)
        elif _size(base) and _size(value) and _kind(base) == _kind(value) and _side(base) == _side(value):
            out[key] = value
        else:
            raise TypeError(f"smoke-tier setting {name} = {value!r}: the smoke tier may only cut numbers and lists "
                            f"of numbers on the same side of 0 and 1 as full mode's {base!r} (a switch stays as "
                            "full mode sets it)")
    return out


def _size(value: Any) -> bool:
    """A number, or a (possibly nested) list or tuple of numbers: what the smoke tier may cut."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return True
    return isinstance(value, list | tuple) and all(_size(v) for v in value)


def _side(value: Any) -> tuple[int, int]:
    """Where a size sits against 0 and 1 (a number's sign and whether it exceeds 1; a list's the same of its
    length): the smoke tier keeps it, so a part full mode runs is never switched off by a cut."""
    x = len(value) if isinstance(value, list | tuple) else value
    return (x > 0) - (x < 0), int(x > 1)


def _kind(value: Any) -> str:
    """The kind of a setting that a full-mode override must keep: bool, number (int or float), sequence (list or
    tuple), mapping, str, None, or the type's name."""
    if value is None or isinstance(value, bool | str):
        return type(value).__name__
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, list | tuple):
        return "sequence"
    return "mapping" if isinstance(value, Mapping) else type(value).__name__


WORKERS_ENV = "REPRO_WORKERS"


def workers() -> int:
    """How many processes :meth:`Run.map` may use: ``$REPRO_WORKERS`` if set, else the cores this process may
    run on."""
    raw = os.environ.get(WORKERS_ENV, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"${WORKERS_ENV} must be a positive integer, got {raw!r}")
        return int(raw)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _item_seed(seed: int, index: int) -> int:
    """The global-RNG seed item ``index`` starts from: a function of the run's seed and the index alone."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1, np.uint64)[0])


def _run_item(fn: Callable[[Any], Any], items: Sequence[Any], i: int, seed: int) -> Any:
    """Item ``i``, from the global random states of (``seed``, ``i``) alone; an error names the item."""
    seed_everything(_item_seed(seed, i))
    try:
        return fn(items[i])
    except BaseException as e:  # noqa: BLE001 (re-raised with the item and the traceback, in any process)
        raise _ItemError(f"parallel_map: item {i} raised:\n{type(e).__name__}: {e}\n{traceback.format_exc()}") from e


class _ItemError(RuntimeError):
    """An item's exception, with its index and traceback (what a worker sends back)."""


def _take(fn: Callable[[Any], Any], items: Sequence[Any], counter: Any, seed: int) -> list[tuple[int, Any]]:
    """Run items until none is left, each time taking the next index from the shared ``counter`` (so a process
    that finishes early takes more: the load balances whatever the items cost)."""
    done = []
    while True:
        with counter.get_lock():
            i = counter.value
            counter.value += 1
        if i >= len(items):
            return done
        done.append((i, _run_item(fn, items, i, seed)))


def _child(conn: Any, fn: Callable[[Any], Any], items: Sequence[Any], counter: Any, seed: int) -> None:
    try:
        payload = ("ok", _take(fn, items, counter, seed))
    except _ItemError as e:
        payload = ("error", str(e))
    except BaseException as e:  # noqa: BLE001 (handed to the parent, which raises it)
        payload = ("error", f"parallel_map: a worker raised:\n{type(e).__name__}: {e}\n{traceback.format_exc()}")
    conn.send_bytes(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
    conn.close()


def parallel_map(fn: Callable[[Any], Any], items: Sequence[Any], n_workers: int = 1, *, seed: int = 0) -> list[Any]:
    """``[fn(x) for x in items]`` in up to ``n_workers`` processes (forked, so ``fn`` may be a closure; POSIX
    only, else the plain loop). Item ``i`` starts from global random states that depend on ``seed`` and ``i``
    alone (:func:`seed_everything`), so the results are the same for any number of workers, and the same as
    ``n_workers=1``. The processes (this one included) take the items in order, each the next one as soon as it is
    free, so list the costliest items first. An exception in an item is raised here as a ``RuntimeError`` naming the
    item, with its traceback. Results travel back pickled: keep them to tensors and plain objects (and do not use
    this with CUDA tensors)."""
    if n_workers < 1:
        raise ValueError(f"n_workers must be >= 1, got {n_workers}")
    items = list(items)
    n = min(n_workers, len(items))
    if n <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        results = {i: _run_item(fn, items, i, seed) for i in range(len(items))}
    else:
        results = _forked(fn, items, n, seed)
    seed_everything(_item_seed(seed, len(items)))  # the same state after the map for any number of workers
    return [results[i] for i in range(len(items))]


def _forked(fn: Callable[[Any], Any], items: list[Any], n: int, seed: int) -> dict[int, Any]:
    """Item index -> result, the items taken one at a time by ``n - 1`` forked workers and this process."""
    ctx = multiprocessing.get_context("fork")
    counter = ctx.Value("q", 0)
    procs = []
    try:
        for _ in range(n - 1):
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(send, fn, items, counter, seed), daemon=True)
            proc.start()
            send.close()
            procs.append((proc, recv))
        results = dict(_take(fn, items, counter, seed))
        for proc, recv in procs:
            results.update(_receive(proc, recv))
    finally:
        for proc, _ in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join()
    return results


def _receive(proc: Any, recv: Any) -> list[tuple[int, Any]]:
    """A worker's (index, result) pairs, or its error raised here."""
    try:
        status, value = pickle.loads(recv.recv_bytes())
    except EOFError:
        proc.join()
        raise RuntimeError(f"a worker of parallel_map died (exit code {proc.exitcode})") from None
    if status == "error":
        raise RuntimeError(value)
    return value


def start_clock() -> None:
    """(Re)start the notebook clock read by :func:`elapsed`."""
    _clock["start"] = time.perf_counter()


def elapsed() -> float | None:
    """Seconds since :func:`setup` (``None`` if it was never called in this process)."""
    start = _clock.get("start")
    return None if start is None else time.perf_counter() - start
