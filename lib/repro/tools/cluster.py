"""The batch runner on Dask distributed: ``python -m repro run --cluster local:N | tcp://HOST:PORT``.

The runner hands notebooks to an existing distributed engine instead of growing a scheduler of its own: one Dask
task per notebook, each a self-contained :class:`repro.tools.tasks.Task` (the notebook's bytes, ``MODE``,
``SEED``, the timeouts, the client's library hash). A worker executes it with the runner's own papermill path in a
scratch folder (:func:`repro.tools.tasks.run_task`) and sends back the executed notebook, the results file and
the figures as bytes; only the client writes into the checkout and the manifest, as each task finishes
(the ``finished`` of :func:`repro.tools.batch.run`, with :func:`repro.tools.tasks.deliver`). No shared filesystem
is assumed: a worker needs the same environment (``pip install -r requirements.txt`` from the same checkout, and
``python -m repro prepare`` for the offline models). This module imports the runner's lower modules
(:mod:`.tasks`, :mod:`.manifest`), never :mod:`.batch`, which imports it.

* ``local:N`` starts a ``LocalCluster`` of N single-threaded worker processes on this machine (``--jobs N`` is the
  same). They import the client's own ``lib/repro``, so there is no library check (a library edited during the
  run is what the sequential runner would also have run, and each kernel records the hash it saw).
* ``tcp://HOST:PORT`` connects to a running ``dask scheduler`` (also what ``dask-jobqueue`` starts on Slurm/PBS).
  A worker whose ``repro`` library hashes differently from the client's (:func:`provenance.library_hash`)
  refuses the task (:class:`repro.tools.tasks.LibraryMismatch`), and the notebook is recorded failed with that
  message. In full mode, notebooks marked ``gpu: true`` in ``book/papers.yml`` request the resource ``GPU=1``:
  only workers started with ``--resources GPU=1`` take them. An unreachable scheduler is a :class:`ClusterError`
  after ``connect_timeout`` seconds.
* Kernels run as in the sequential runner: quick mode in the portable environment, full mode without the
  one-thread limits a Dask nanny puts into its worker's environment, and no mode with the nanny's malloc
  setting (:func:`_nanny_vars`).
* Longest first: tasks are prioritised by their last recorded run time (the manifest), which shortens the
  whole run when notebooks differ in length.
* Faults: a notebook that raises is recorded failed like any other (the task returns normally); a worker that
  dies mid-notebook has its task rerun on another worker until Dask's ``allowed-failures`` (default 3) is spent,
  then the notebook is recorded failed with the reason. Ctrl-C (or any error) on the client sets a Dask
  ``Event`` that the running tasks poll every :data:`repro.tools.execute.POLL_S` seconds (they then kill their
  papermill), cancels the rest, and leaves every finished notebook written and recorded.

Dask is imported only inside these functions, so :mod:`repro.tools` stays importable without it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import provenance
from .manifest import Manifest
from .tasks import LibraryMismatch, Task, TaskResult, failed_outcome, make_task, run_task

CONNECT_TIMEOUT = 30.0  # s to reach a remote scheduler before giving up with a ClusterError

ADDRESS_RE = re.compile(r"tcp://([A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):(\d{1,5})/?")


class ClusterError(RuntimeError):
    """The cluster could not be reached or started."""


@dataclass(frozen=True)
class Spec:
    """Where to run: ``local`` with ``workers`` processes, or ``remote`` at ``address``."""

    kind: str
    workers: int = 0
    address: str = ""

    def __str__(self) -> str:
        return f"local:{self.workers}" if self.kind == "local" else self.address


def parse(spec: str) -> Spec:
    """``local:N`` (N >= 1) or ``tcp://HOST:PORT``; anything else is a ``ValueError`` naming both forms."""
    text = spec.strip()
    if text.startswith("local:"):
        n = text.removeprefix("local:")
        if n.isdigit() and int(n) >= 1:
            return Spec("local", workers=int(n))
        raise ValueError(f"--cluster local:N needs N >= 1 worker processes, got {spec!r}")
    m = ADDRESS_RE.fullmatch(text)
    if m and 1 <= int(m[2]) <= 65535:
        return Spec("remote", address=f"tcp://{m[1]}:{int(m[2])}")
    raise ValueError(f"--cluster takes local:N (N worker processes on this machine) or tcp://HOST:PORT (a running "
                     f"`dask scheduler`, usually port 8786); got {spec!r}")


@contextlib.contextmanager
def _environ_restored() -> Iterator[None]:
    """Undo what a ``LocalCluster`` writes into this process's ``os.environ``: its nannies set their
    ``pre-spawn-environ`` (one thread, ``MALLOC_TRIM_THRESHOLD_``) here and never take it back, so a sequential
    run later in the same process would hand them to its kernels."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        os.environ.update(saved)


@contextlib.contextmanager
def connect(spec: Spec, connect_timeout: float | None = None) -> Iterator[Any]:
    """A ``distributed.Client`` for ``spec``: a fresh ``LocalCluster`` (loopback only, no dashboard, its HTTP
    endpoints on a free port, closed on exit) or the scheduler at ``spec.address`` (:class:`ClusterError` if it
    does not answer in time)."""
    from distributed import Client, LocalCluster

    if spec.kind == "local":
        with _environ_restored(), \
                LocalCluster(n_workers=spec.workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                             dashboard_address=None, silence_logs=logging.ERROR, memory_limit=0,
                             scheduler_kwargs={"dashboard_address": "127.0.0.1:0"}) as local, \
                Client(local, set_as_default=False) as client:
            yield client
        return
    timeout = CONNECT_TIMEOUT if connect_timeout is None else connect_timeout
    try:
        client = Client(spec.address, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError) as e:
        raise ClusterError(f"no Dask scheduler answered at {spec.address} within {timeout:g} s ({e}); start one "
                           "with `dask scheduler` on that host and check the host, the port (8786 by default) "
                           "and the firewall") from None
    with client:
        yield client


THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
MALLOC_VAR = "MALLOC_TRIM_THRESHOLD_"


def _nanny_vars(mode: str, nanny: bool) -> tuple[str, ...]:
    """The variables a Dask nanny put into this worker's environment (``distributed.nanny.pre-spawn-environ``)
    that a kernel must not inherit, so that it runs as under the sequential runner:

    * ``MALLOC_TRIM_THRESHOLD_=65536`` (glibc returns freed memory to the OS at once), in every mode: measured on
      the quick book, it made torch-heavy notebooks 1.14–1.59× slower (06's training 27 → 37 ms a step);
    * the one-thread limits, in full mode only: a full-mode kernel keeps torch's default threading (quick mode
      sets one thread itself, :data:`repro.tools.portable.QUICK_ENV`).

    A value the user set differently is kept; without a nanny (``dask worker --no-nanny``) the environment is the
    one the worker was started with, and nothing is removed."""
    import dask

    if not nanny:
        return ()
    spawned = dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {}
    names = (MALLOC_VAR,) + (THREAD_VARS if mode != "quick" else ())
    return tuple(k for k in names if k in spawned and os.environ.get(k) == str(spawned[k]))


def _on_worker(task: Task, cancel_event: str) -> TaskResult:
    """The Dask task: :func:`repro.tools.tasks.run_task` on this worker, stopped when the client sets
    ``cancel_event``."""
    from distributed import Event, get_worker

    worker = get_worker()
    address = worker.address
    event = Event(cancel_event)

    def cancelled() -> bool:
        try:
            return event.is_set()
        except Exception:  # the scheduler did not answer this once: keep running, ask again later
            return False

    try:
        result = run_task(task, cancelled, _nanny_vars(task.mode, worker.nanny is not None))
    except LibraryMismatch as e:
        raise LibraryMismatch(f"worker {address}: {e}") from None
    result.outcome.worker = address
    return result


def _reason(exc: BaseException | None) -> str:
    """Why a task returned nothing, in a line for the manifest."""
    from distributed.scheduler import KilledWorker

    if isinstance(exc, KilledWorker):
        last = getattr(exc.last_worker, "address", exc.last_worker)
        return (f"the worker running it died {exc.allowed_failures + 1} times (Dask's allowed failures: "
                f"{exc.allowed_failures}); the last was {last}: see that worker's log")
    if isinstance(exc, LibraryMismatch):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if exc is not None else "cancelled"


def _warn_if_unplaceable(client: Any, spec: Spec, gpu_tasks: int) -> None:
    """Say so when tasks would wait: no worker at all, or GPU tasks and no worker offering ``GPU``."""
    workers = client.scheduler_info().get("workers", {})
    if not workers:
        print(f"warning: the scheduler at {spec} has no workers yet; the notebooks wait until one joins "
              "(dask worker <address> --nthreads 1)", file=sys.stderr)
    elif gpu_tasks and not any(w.get("resources", {}).get("GPU") for w in workers.values()):
        print(f"warning: {gpu_tasks} notebook(s) want a GPU in full mode and no worker offers one; they wait "
              "until a worker started with --resources GPU=1 joins", file=sys.stderr)


def run(root: Path, spec: Spec, notebooks: list[Path], mode: str, seed: int, timeout: float | None,
        cell_timeout: float | None, retries: int, finished: Callable[[Path, Any], None], manifest: Manifest,
        connect_timeout: float | None = None) -> None:
    """Submit one task per notebook to ``spec`` and pass each result (or the failed outcome of a task that
    returned nothing) to ``finished`` as it completes. On any exception, Ctrl-C included, the tasks still
    running are told to stop, the others cancelled, and the exception propagates."""
    from distributed import Event, as_completed

    library = None if spec.kind == "local" else provenance.library_hash()
    tasks = {nb: make_task(root, nb, mode, seed, timeout, cell_timeout, retries, library) for nb in notebooks}
    run_id = uuid.uuid4().hex[:10]
    with connect(spec, connect_timeout) as client:
        gpu = {nb for nb, t in tasks.items() if t.gpu and mode == "full" and spec.kind == "remote"}
        _warn_if_unplaceable(client, spec, len(gpu))
        cancel = Event(f"repro-cancel-{run_id}", client=client)
        start = time.time()
        futures: dict[Any, Path] = {}
        try:
            for nb, task in tasks.items():
                fut = client.submit(_on_worker, task, cancel.name, key=f"repro-{nb.stem}-{run_id}", pure=False,
                                    resources={"GPU": 1} if nb in gpu else None,
                                    priority=round(manifest.seconds(nb.stem, mode)))
                futures[fut] = nb
            for fut in as_completed(futures, loop=client.loop):
                nb = futures[fut]
                if fut.status == "finished":
                    finished(nb, fut.result())
                else:
                    exc = fut.exception() if fut.status == "error" else None
                    finished(nb, failed_outcome(nb, mode, seed, _reason(exc), time.time() - start))
                fut.release()
        except BaseException:
            with contextlib.suppress(Exception):
                cancel.set()  # running tasks stop their notebook within POLL_S
            with contextlib.suppress(Exception):
                client.cancel(list(futures), force=True)
            raise
