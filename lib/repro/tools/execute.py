"""Executing one notebook with papermill (:func:`execute`): a fresh kernel with ``MODE`` and ``SEED`` injected,
everything it writes staged and moved in together only on success.

The kernel's ``$REPRO_RESULTS_DIR`` is a staging folder ``results/.tmp/<stem>.<host>.<pid>.<thread>/`` (its
results file, figures), papermill writes the executed copy beside it, and on success the results file and figures
are moved into ``results/``, then the notebook over the committed one (each an atomic rename, Ctrl-C held
meanwhile: :func:`deferred_interrupt`). A failing, timed-out or killed run therefore leaves the notebook, its
results and its figures as they were; the failed copy is kept in ``results/logs/`` (``NN-slug.<mode>.failed.ipynb``,
and what it wrote in ``NN-slug.<mode>.failed/``) for inspection. Leftovers of killed runs in ``results/.tmp/`` are
swept at the next run once their process is gone (:func:`sweep_tmp`). Full mode writes the executed notebook and
results under ``results/full/`` so the committed quick-mode outputs (which the tests compare against) stay as they
are (:mod:`repro.tools.paths`).

Two timeouts bound a run: nbclient's per-cell ``cell_timeout`` (papermill ``--execution-timeout``), reported as
"cell N (first line) did not finish in S s", and the per-notebook ``timeout``, after which the whole process tree
is killed. Both must be finite, positive and at most :data:`MAX_SECONDS` (:func:`check_seconds`). A notebook that
timed out either way is retried once (``retries``); the outcome keeps the first attempt's error under ``retried``.

Kernels run offline: in quick mode ``$REPRO_OFFLINE=1`` is set whatever the caller's environment says (full mode
keeps the caller's value, default 1), ``runtime.setup`` installs the guard of :mod:`repro.tools.offline`, and where
this machine lets an unprivileged process create a network namespace (:func:`repro.tools.offline.network_isolation`)
papermill and its kernel run in an empty one with only loopback up. Quick mode runs each kernel in the portable
environment of :mod:`repro.tools.portable` (one thread, fixed CPU kernels). Kernels also run headless
(``$REPRO_HEADLESS=1``: explorers render their animation, no widget). Papermill is started as
:mod:`repro.tools.launcher` (papermill with the runner's client fix; it dies with this process). The outcome
carries the content hashes of the notebook's sources and of the library as the kernel recorded them
(:func:`recorded_sources`, :mod:`repro.tools.provenance`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from . import launcher, offline, paths, portable, provenance
from .manifest import Outcome

POLL_S = 2.0  # how often a running notebook checks whether its task was cancelled
MAX_SECONDS = 1e6  # largest --timeout / --cell-timeout (11.6 days): poll() and nbclient overflow near 2^31 ms
WAIT_STEP_S = 3600.0  # the longest single wait on papermill (bounded, whatever the timeout)

HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"  # in staging names: sweep only our own
STAGE_RE = re.compile(r"^\d\d-[a-z0-9-]+\.(?:(?P<host>[A-Za-z0-9-]+)\.)?(?P<pid>\d+)\.\d+(?:\.ipynb)?$")


class Cancelled(Exception):
    """The task's run was cancelled (Ctrl-C on the client); its notebook was stopped, nothing is returned."""


def check_seconds(option: str, value: float | None) -> float | None:
    """``value`` (seconds) if it is a finite number in ``(0, MAX_SECONDS]``, ``None`` for no limit; else a
    ``ValueError`` naming ``option`` (``nan`` would never expire, ``inf`` and huge values overflow the waits)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0 < value <= MAX_SECONDS:
        raise ValueError(f"{option} must be a finite number of seconds in (0, {MAX_SECONDS:g}], got {value!r}")
    return float(value)


def kill_tree(pid: int) -> None:
    """Kill a process and all its descendants (papermill starts the kernel in a session of its own)."""
    import psutil

    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    procs = [*parent.children(recursive=True), parent]
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def error_of(executed: Path, log: str) -> str:
    """The first error a failed notebook shows (``ename: evalue``), else the tail of papermill's log."""
    try:
        nb = json.loads(executed.read_text())
        for cell in nb.get("cells", []):
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    return f"{out.get('ename')}: {out.get('evalue')}"[:2000]
    except (OSError, ValueError):
        pass
    lines = [ln for ln in log.strip().splitlines() if ln.strip()]
    return "\n".join(lines[-5:])[:2000] or "papermill failed without output"


def _running_cell(executed: Path) -> str | None:
    """'cell N (first line)' of the last cell papermill started, counting the notebook's own cells from 1 (the
    injected parameters cell is not counted), or ``None`` if the executed copy is unreadable."""
    try:
        cells = json.loads(executed.read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return None
    own = [c for c in cells if "injected-parameters" not in c.get("metadata", {}).get("tags", [])]
    started = [i for i, c in enumerate(own) if c.get("metadata", {}).get("papermill", {}).get("start_time")]
    if not started:
        return None
    src = own[started[-1]].get("source", "")
    src = "".join(src) if isinstance(src, list) else src
    first = next((ln.strip() for ln in src.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
    first = first if len(first) <= 60 else first[:57] + "..."
    return f"cell {started[-1] + 1} ({first})"


def _claims(results: Path, since: float) -> tuple[int | None, int | None, list[str] | None]:
    """Passed/failed asserted-or-reported claim counts from a results file written after ``since``."""
    try:
        if results.stat().st_mtime < since:
            return None, None, None
        claims = json.loads(results.read_text())["claims"]
    except (OSError, ValueError, KeyError):
        return None, None, None
    failed = [c["id"] for c in claims if not c["holds"]]
    return len(claims) - len(failed), len(failed), failed


def _tidy_executed(path: Path, notebook: Path, root: Path) -> None:
    """Tag papermill's injected-parameters cell ``remove-cell`` so the book does not show it twice (the
    parameters cell above it already shows the values), and record the notebook's path relative to the
    checkout instead of this machine's absolute (temporary) paths."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            tags.append("remove-cell")
    pm = nb.metadata.get("papermill", {})
    rel = str(notebook.relative_to(root)) if notebook.is_relative_to(root) else notebook.name
    pm.update(input_path=rel, output_path=rel)
    nbformat.write(nb, path)


def recorded_sources(notebook: Path, results: Path | None, since: float) -> dict[str, Any]:
    """The notebook's and the library's hashes and the commit as the kernel recorded them in the results file
    this run wrote (``results``, if written after ``since``); without one (a failed run, or ``None``: a run that
    returned nothing), the hashes of the notebook and library as they are now."""
    keys = ("notebook", "library", "commit")
    try:
        if results is not None and results.stat().st_mtime >= since:
            recorded = json.loads(results.read_text()).get("sources") or {}
            if recorded.get("notebook"):
                return {k: recorded.get(k) for k in keys}
    except (OSError, ValueError):
        pass
    try:
        nb_hash: str | None = provenance.notebook_source_hash(notebook)
    except (OSError, ValueError):
        nb_hash = None
    return {"notebook": nb_hash, "library": provenance.library_hash(), "commit": None}


def wait(proc: subprocess.Popen, timeout: float | None, cancelled: Callable[[], bool] | None) -> str:
    """Papermill's log once it exits; ``TimeoutExpired`` past ``timeout``; on a Dask worker (``cancelled`` given),
    :class:`Cancelled` (the process tree killed) as soon as ``cancelled()`` says so. Any other interruption
    (Ctrl-C in the sequential runner) kills the tree and propagates: no kernel keeps running behind a stopped run
    (papermill runs in a session of its own, so the terminal's Ctrl-C does not reach it)."""
    deadline = None if timeout is None or not math.isfinite(timeout) else time.monotonic() + timeout
    try:
        while True:
            left = WAIT_STEP_S if deadline is None else min(WAIT_STEP_S, max(0.0, deadline - time.monotonic()))
            step = left if cancelled is None else min(POLL_S, left)
            try:
                return proc.communicate(timeout=step)[0]
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                if cancelled is not None and cancelled():
                    raise Cancelled from None
    except subprocess.TimeoutExpired:
        raise
    except BaseException:
        kill_tree(proc.pid)
        proc.communicate()
        raise


def _kernel_env(notebook: Path, stage: Path, mode: str, unset: tuple[str, ...]) -> dict[str, str]:
    """The environment papermill and its kernel start with: this one less ``unset``, the staging results folder,
    the portable numerics (quick and smoke), the offline guard (forced on in quick and smoke mode) and, where
    available, the request for an empty network namespace (:func:`repro.tools.launcher.papermill_main`)."""
    env = {**os.environ, paths.RESULTS_ENV: str(stage), "PYTHONHASHSEED": "0", "REPRO_HEADLESS": "1",
           provenance.NOTEBOOK_ENV: str(notebook.resolve())}
    for key in unset:
        env.pop(key, None)
    env[launcher.PARENT_ENV] = str(os.getpid())  # papermill dies with this runner or Dask worker
    if mode in paths.CI_MODES:
        env[offline.ENV] = "1"  # quick and smoke mode are offline whatever the caller's environment says
        env.update(portable.QUICK_ENV)  # the same numbers on any AVX2 machine (repro.tools.portable)
    else:
        env.setdefault(offline.ENV, "1")
    env.pop(offline.NETNS_ENV, None)
    if offline.requested(env) and env.get(offline.NETNS_OFF_ENV, "") != "1" and offline.network_isolation() is None:
        env[offline.NETNS_ENV] = "1"
    return env


def _move_in(stage: Path, results: Path) -> None:
    """Move every file a successful run staged into ``results/`` at the same relative path (atomic renames, in path
    order: the results file before ``figures/``, as :func:`repro.tools.tasks.deliver` writes a task's files)."""
    for src in sorted(p for p in stage.rglob("*") if p.is_file()):
        dst = results / src.relative_to(stage)
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)


def _keep_failed(root: Path, stage: Path, tmp: Path, stem: str, mode: str) -> str | None:
    """A failed run's executed copy and staged files, kept in ``results/logs/`` (replacing an earlier failure's);
    returns the copy's path relative to ``root``, or ``None`` if papermill wrote none."""
    kept_dir = paths.failed_dir(root, stem, mode)
    kept_dir.parent.mkdir(parents=True, exist_ok=True)
    if kept_dir.exists():
        shutil.rmtree(kept_dir, ignore_errors=True)
    if any(p.is_file() for p in stage.rglob("*")):
        os.replace(stage, kept_dir)
    kept = None
    if tmp.exists():
        kept = paths.failed_copy(root, stem, mode)
        os.replace(tmp, kept)
    return None if kept is None else str(kept.relative_to(root))


def _attempt(root: Path, notebook: Path, mode: str, seed: int, timeout: float | None,
             cell_timeout: float | None, cancelled: Callable[[], bool] | None = None,
             unset: tuple[str, ...] = ()) -> Outcome:
    """One papermill run of ``notebook``, staged (module docstring): on success its results and figures are moved
    into ``results/``, then the executed notebook replaces it (quick) or goes to ``results/full/`` (full); on failure
    they go to ``results/logs/``. ``cancelled`` (a Dask task): polled while it runs; papermill dies with this
    process in any case; ``unset``: variables of this process's environment the kernel must not inherit."""
    stage = paths.tmp_dir(root) / f"{notebook.stem}.{HOST}.{os.getpid()}.{threading.get_ident()}"
    tmp = stage.with_name(stage.name + ".ipynb")  # papermill's executed copy, beside the staging folder
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    cmd = launcher.command(notebook, tmp, mode, seed, cell_timeout)
    try:
        return _run_staged(root, notebook, mode, seed, timeout, cell_timeout, cancelled, cmd,
                           _kernel_env(notebook, stage, mode, unset), stage, tmp)
    finally:  # moved in or kept in logs/ on every normal path; this only clears an interrupted attempt
        shutil.rmtree(stage, ignore_errors=True)
        tmp.unlink(missing_ok=True)


def _run_staged(root: Path, notebook: Path, mode: str, seed: int, timeout: float | None,
                cell_timeout: float | None, cancelled: Callable[[], bool] | None, cmd: list[str],
                env: dict[str, str], stage: Path, tmp: Path) -> Outcome:
    """Run ``cmd`` (papermill) and put its staged files where they belong (see :func:`_attempt`)."""
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        log = wait(proc, timeout, cancelled)
        status = "ok" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        log, _ = proc.communicate()
        status = "timeout"
    seconds = time.time() - start
    res_file = paths.results_file(notebook.stem, mode, stage)
    passed, failed, failed_ids = _claims(res_file, start)
    outcome = Outcome(notebook=notebook.stem, mode=mode, seed=seed, status=status, seconds=round(seconds, 1),
                      claims_passed=passed, claims_failed=failed, claims_failed_ids=failed_ids,
                      sources=recorded_sources(notebook, res_file, start))
    if status == "ok":
        target = paths.executed_notebook(root, notebook, mode)
        _tidy_executed(tmp, notebook, root)
        target.parent.mkdir(parents=True, exist_ok=True)
        with deferred_interrupt():  # results and figures, then the notebook: all of this run, or none of it
            _move_in(stage, paths.checkout_results(root))
            os.replace(tmp, target)
        outcome.output = str(target.relative_to(root))
        return outcome
    outcome.status, outcome.error = _failure(status, log, tmp, timeout, cell_timeout)
    outcome.output = _keep_failed(root, stage, tmp, notebook.stem, mode)
    return outcome


def _failure(status: str, log: str, executed: Path, timeout: float | None,
             cell_timeout: float | None) -> tuple[str, str]:
    """The status and error of a run that did not succeed: a cell past ``cell_timeout`` (nbclient's
    ``CellTimeoutError``), the notebook past ``timeout`` (with the cell that was running), or its first error."""
    cell = _running_cell(executed)
    if status == "failed" and "CellTimeoutError" in log:  # nbclient's per-cell timeout
        return "timeout", f"{cell or 'a cell'} did not finish in {cell_timeout:g} s"
    if status == "timeout":
        return status, f"timed out after {timeout:g} s (the whole notebook)" + (f"; {cell} was running" if cell else "")
    return status, error_of(executed, log)


def sweep_tmp(root: Path) -> list[Path]:
    """Remove what killed or hung runs of this machine left in ``results/.tmp/`` (staging folders and executed
    copies named ``<stem>.<host>.<pid>.<thread>``, or ``<stem>.<pid>.<thread>.ipynb`` from before hosts were
    named) once their process is gone; another machine's (a shared filesystem) are left alone. Returns them."""
    import psutil

    removed = []
    for path in sorted(paths.tmp_dir(root).glob("*")):
        m = STAGE_RE.match(path.name)
        if not m or (m["host"] is not None and m["host"] != HOST) or psutil.pid_exists(int(m["pid"])):
            continue
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        except OSError:  # another run swept it first, or it cannot be removed: leave it, it is only clutter
            continue
        removed.append(path)
    return removed


def execute(root: Path, notebook: Path, mode: str, seed: int = 0, timeout: float | None = None,
            cell_timeout: float | None = None, retries: int = 1,
            cancelled: Callable[[], bool] | None = None, unset: tuple[str, ...] = ()) -> Outcome:
    """Execute one notebook with papermill (:func:`_attempt`); a run that timed out (a cell past ``cell_timeout``
    or the notebook past ``timeout``) is retried up to ``retries`` times, the first attempt kept in ``retried``.
    On a Dask worker, ``cancelled`` is polled while the notebook runs (:class:`Cancelled` once it returns true)
    and ``unset`` names the worker's environment variables the kernel must not inherit."""
    paths.check_mode(mode)
    outcome = _attempt(root, notebook, mode, seed, timeout, cell_timeout, cancelled, unset)
    first = outcome
    for n in range(2, retries + 2):
        if outcome.status != "timeout":
            break
        outcome = _attempt(root, notebook, mode, seed, timeout, cell_timeout, cancelled, unset)
        outcome.attempts = n
        outcome.retried = {"status": first.status, "error": first.error, "seconds": first.seconds}
    return outcome


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) until the block is done, then raise it: a notebook's files and manifest record are
    written whole. Only in the main thread (elsewhere signals cannot be handled, nor arrive)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[Any] = []
    previous = signal.signal(signal.SIGINT, lambda *a: caught.append(a))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt
