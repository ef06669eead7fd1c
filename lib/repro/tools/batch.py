"""The batch runner behind ``python -m repro run``: papermill executes notebooks, one record per notebook.

Each notebook runs in its own papermill process (a fresh kernel) with ``MODE`` and ``SEED`` injected. Everything
a run writes is staged and moved in together only on success: the kernel's ``$REPRO_RESULTS_DIR`` is a staging
folder ``results/.tmp/<stem>.<host>.<pid>.<thread>/`` (its results file, figures), papermill writes the executed
copy beside it, and on success the results file and figures are moved into ``results/``, then the notebook over
the committed one (each an atomic rename, Ctrl-C held meanwhile). A failing, timed-out or killed run therefore
leaves the notebook, its results and its figures as they were; the failed copy is kept in ``results/logs/``
(``NN-slug.<mode>.failed.ipynb``, and what it wrote in ``NN-slug.<mode>.failed/``) for inspection. Leftovers of
killed runs in ``results/.tmp/`` are swept at the next run once their process is gone (:func:`sweep_tmp`).
``results/manifest.json`` is updated after every notebook, so a run killed half-way keeps the records of what
finished; a failed run keeps the notebook's last successful record under ``last_ok`` (the pages show that one),
and records are kept per notebook, mode and seed (:meth:`Manifest.key`). A manifest that exists but cannot be
read stops the run before anything runs (:func:`repro.tools.provenance.read_manifest`): it is never replaced by
an empty one. Quick mode runs each kernel in the portable environment of :mod:`repro.tools.portable` (one thread,
fixed CPU kernels).
By default the notebooks run one after another in this process, in the checkout, without Dask. With
``--cluster`` (``--jobs N`` is ``--cluster local:N``) each notebook is a :class:`Task` for a Dask worker
(:mod:`repro.tools.cluster`): its bytes, ``MODE``, ``SEED``, the timeouts and the client's library hash, nothing
that needs a shared filesystem. :func:`run_task` lays it out in a scratch folder shaped like a checkout and runs
the same :func:`execute` there (same papermill command, timeouts, retries and environment), then returns the
executed notebook, the results file and the figures as bytes (:class:`TaskResult`); only the client writes them
into the checkout (:func:`deliver`, each file atomically, Ctrl-C deferred until the notebook's files and its
manifest record are written). A cluster kernel's working folder is the scratch ``notebooks/``: files a notebook
writes beside itself are discarded with it.
Full mode writes executed notebooks and results under ``results/full/`` so the committed quick-mode
outputs (which the tests compare against) stay as they are.

Two timeouts bound a run: nbclient's per-cell ``cell_timeout`` (papermill ``--execution-timeout``), reported as
"cell N (first line) did not finish in S s", and the per-notebook ``timeout``, after which the whole process tree
is killed. Both must be finite, positive and at most :data:`MAX_SECONDS` (:func:`check_seconds`). A notebook that
timed out either way is retried once (``retries``); the manifest keeps the first attempt's error under
``retried``. Kernels run offline: in quick mode ``$REPRO_OFFLINE=1`` is set whatever the caller's environment
says (full mode keeps the caller's value, default 1), ``runtime.setup`` installs the guard of
:mod:`repro.tools.offline`, and where this machine lets an unprivileged process create a network namespace
(:func:`repro.tools.offline.network_isolation`) papermill and its kernel run in an empty one with only loopback
up. Kernels also run headless (``$REPRO_HEADLESS=1``: explorers render their animation, no widget). Each record
carries the content hashes of the notebook's sources and of the library (:mod:`repro.tools.provenance`); a kernel
in a cluster's scratch folder cannot see the checkout's git state, so the client fills in the commit
(:func:`_with_commit`) exactly as a kernel in the checkout would have.

Papermill runs as ``python -m repro.tools.batch`` (:func:`papermill_main`): papermill's own command line, with one
fix to its client (issue 12, ``benchmarks/stress_explorer.py``). jupyter_client >= 8 sends every message from an
asyncio socket through a plain shadow of it (``Session.send``), so pyzmq's asyncio layer never re-checks the
socket after the send as its own send path does (pyzmq #1208). The send consumes the edge-triggered ``ZMQ_FD``
wake-up; a reply that arrives meanwhile on the same socket then waits unread while nbclient awaits it without a
timeout: the run hangs, both processes idle. nbclient sends on the shell socket while it awaits an
``execute_reply`` only to mimic an ``Output`` widget (``ipywidgets.interact``), hence hangs at explorer cells
(nbclient #312, open). :func:`rearm_asyncio_sends` re-checks the socket after each such send (``get(EVENTS)``,
which re-arms pyzmq's pending receivers); jupyter_client 8.0 to 8.10.0 (pinned) all need it. The per-cell timeout
bounds such a stall even without the fix: a poll with a timeout polls the socket itself at its deadline and finds
the stranded reply, so the cell ends late instead of never (``tests/tools/test_client_fix.py``). On a Dask worker
(Linux) the papermill process asks to be killed when the worker that started it dies (``PR_SET_PDEATHSIG``), and
its kernel exits when papermill does (ipykernel's parent poller): a killed worker leaves no notebook running.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from . import offline, paths, portable, provenance

PARENT_ENV = "REPRO_RUNNER_PID"  # the process that started papermill (it dies with it: _die_with_parent)
POLL_S = 2.0  # how often a running notebook checks whether its task was cancelled
MAX_SECONDS = 1e6  # largest --timeout / --cell-timeout (11.6 days): poll() and nbclient overflow near 2^31 ms
WAIT_STEP_S = 3600.0  # the longest single wait on papermill (bounded, whatever the timeout)
MAX_SEED = 2**64 - 1  # torch.manual_seed takes at most this

NOTEBOOK_RE = re.compile(r"^(\d\d)-[a-z0-9-]+\.ipynb$")
HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"  # in staging names: sweep only our own
STAGE_RE = re.compile(r"^\d\d-[a-z0-9-]+\.(?:(?P<host>[A-Za-z0-9-]+)\.)?(?P<pid>\d+)\.\d+(?:\.ipynb)?$")


@dataclass
class Outcome:
    """What one notebook run produced, as recorded in the manifest."""

    notebook: str
    mode: str
    seed: int
    status: str  # "ok" | "failed" | "timeout"
    seconds: float
    error: str | None = None
    claims_passed: int | None = None
    claims_failed: int | None = None
    claims_failed_ids: list[str] | None = None
    output: str | None = None
    attempts: int = 1
    retried: dict[str, Any] | None = None  # the first attempt (status, error, seconds) when it was retried
    sources: dict[str, Any] | None = None  # notebook and library hashes, and the commit if clean
    worker: str | None = None  # the Dask worker that ran it (cluster runs only)


class Cancelled(Exception):
    """The task's run was cancelled (Ctrl-C on the client); its notebook was stopped, nothing is returned."""


class LibraryMismatch(RuntimeError):
    """A worker's installed ``repro`` is not the client's: it refuses the task instead of running other code."""


class RunError(RuntimeError):
    """The run cannot go on because a file it must write cannot be written (a full or read-only disk). Nothing
    already written is damaged (every write is an atomic replace); ``outcomes`` are the notebooks that ran before
    it stopped, for the summary."""

    def __init__(self, message: str, outcomes: list[Outcome] | None = None):
        super().__init__(message)
        self.outcomes = list(outcomes or [])


def check_seconds(option: str, value: float | None) -> float | None:
    """``value`` (seconds) if it is a finite number in ``(0, MAX_SECONDS]``, ``None`` for no limit; else a
    ``ValueError`` naming ``option`` (``nan`` would never expire, ``inf`` and huge values overflow the waits)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0 < value <= MAX_SECONDS:
        raise ValueError(f"{option} must be a finite number of seconds in (0, {MAX_SECONDS:g}], got {value!r}")
    return float(value)


def check_seed(value: int) -> int:
    """``value`` if it is an int in ``[0, 2**64 - 1]`` (what every generator accepts), else a ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise ValueError(f"--seed must be an integer in [0, 2**64 - 1], got {value!r}")
    return value


def discover(root: Path, only: list[str] | None = None) -> list[Path]:
    """Notebooks ``notebooks/NN-slug.ipynb`` in number order, optionally only the numbers in ``only``."""
    found = sorted(p for p in (root / "notebooks").glob("*.ipynb") if NOTEBOOK_RE.match(p.name))
    if not only:
        return found
    wanted = {n.zfill(2) for n in only}
    have = {p.name[:2]: p for p in found}
    missing = sorted(wanted - set(have))
    if missing:
        raise ValueError(f"no notebook numbered {', '.join(missing)}; available: {', '.join(sorted(have))}")
    return [have[n] for n in sorted(wanted)]


def _kill_tree(pid: int) -> None:
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


def _error_of(executed: Path, log: str) -> str:
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


def _sources(notebook: Path, results: Path, since: float) -> dict[str, Any]:
    """The notebook's and the library's hashes and the commit as the kernel recorded them in the results file
    this run wrote; without one (a failed run), the hashes of the notebook and library as they are now."""
    keys = ("notebook", "library", "commit")
    try:
        if results.stat().st_mtime >= since:
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


def _wait(proc: subprocess.Popen, timeout: float | None, cancelled: Callable[[], bool] | None) -> str:
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
        _kill_tree(proc.pid)
        proc.communicate()
        raise


def _kernel_env(notebook: Path, stage: Path, mode: str, unset: tuple[str, ...]) -> dict[str, str]:
    """The environment papermill and its kernel start with: this one less ``unset``, the staging results folder,
    the portable numerics (quick), the offline guard (forced on in quick mode) and, where available, the request
    for an empty network namespace (:func:`papermill_main`)."""
    env = {**os.environ, paths.RESULTS_ENV: str(stage), "PYTHONHASHSEED": "0", "REPRO_HEADLESS": "1",
           provenance.NOTEBOOK_ENV: str(notebook.resolve())}
    for key in unset:
        env.pop(key, None)
    env[PARENT_ENV] = str(os.getpid())  # papermill dies with this runner or Dask worker (_die_with_parent)
    if mode == "quick":
        env[offline.ENV] = "1"  # quick mode is offline whatever the caller's environment says
        env.update(portable.QUICK_ENV)  # the same numbers on any AVX2 machine (repro.tools.portable)
    else:
        env.setdefault(offline.ENV, "1")
    env.pop(offline.NETNS_ENV, None)
    if offline.requested(env) and env.get(offline.NETNS_OFF_ENV, "") != "1" and offline.network_isolation() is None:
        env[offline.NETNS_ENV] = "1"
    return env


def _move_in(stage: Path, results: Path) -> None:
    """Move every file a successful run staged into ``results/`` at the same relative path (atomic renames, in path
    order: the results file before ``figures/``, as :func:`deliver` writes a task's files)."""
    for src in sorted(p for p in stage.rglob("*") if p.is_file()):
        dst = results / src.relative_to(stage)
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)


def _keep_failed(stage: Path, tmp: Path, logs: Path, stem: str, mode: str) -> str | None:
    """A failed run's executed copy and staged files, kept in ``results/logs/`` (replacing an earlier failure's);
    returns the copy's path relative to ``results/``'s parent, or ``None`` if papermill wrote none."""
    logs.mkdir(parents=True, exist_ok=True)
    kept_dir = logs / f"{stem}.{mode}.failed"
    if kept_dir.exists():
        shutil.rmtree(kept_dir, ignore_errors=True)
    if any(p.is_file() for p in stage.rglob("*")):
        os.replace(stage, kept_dir)
    kept = None
    if tmp.exists():
        kept = logs / f"{stem}.{mode}.failed.ipynb"
        os.replace(tmp, kept)
    return None if kept is None else str(kept.relative_to(logs.parent.parent))


def _attempt(root: Path, notebook: Path, mode: str, seed: int, timeout: float | None,
             cell_timeout: float | None, cancelled: Callable[[], bool] | None = None,
             unset: tuple[str, ...] = ()) -> Outcome:
    """One papermill run of ``notebook``, staged (module docstring): on success its results and figures are moved
    into ``results/``, then the executed notebook replaces it (quick) or goes to ``results/full/`` (full); on failure
    they go to ``results/logs/``. ``cancelled`` (a Dask task): polled while it runs; papermill dies with this
    process in any case; ``unset``: variables of this process's environment the kernel must not inherit."""
    results = root / "results"
    logs = results / "logs"
    stage = results / ".tmp" / f"{notebook.stem}.{HOST}.{os.getpid()}.{threading.get_ident()}"
    tmp = stage.with_name(stage.name + ".ipynb")  # papermill's executed copy, beside the staging folder
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    target = notebook if mode == "quick" else results / mode / notebook.name
    cmd = [sys.executable, "-m", "repro.tools.batch", str(notebook), str(tmp), "-p", "MODE", mode, "-p", "SEED",
           str(seed), "-k", "python3", "--cwd", str(notebook.parent), "--no-progress-bar",
           "--log-level", "WARNING"]
    if cell_timeout:
        cmd += ["--execution-timeout", str(max(1, math.ceil(cell_timeout)))]
    try:
        return _run_staged(root, notebook, mode, seed, timeout, cell_timeout, cancelled, cmd,
                           _kernel_env(notebook, stage, mode, unset), stage, tmp, target, logs)
    finally:  # moved in or kept in logs/ on every normal path; this only clears an interrupted attempt
        shutil.rmtree(stage, ignore_errors=True)
        tmp.unlink(missing_ok=True)


def _run_staged(root: Path, notebook: Path, mode: str, seed: int, timeout: float | None,
                cell_timeout: float | None, cancelled: Callable[[], bool] | None, cmd: list[str],
                env: dict[str, str], stage: Path, tmp: Path, target: Path, logs: Path) -> Outcome:
    """Run ``cmd`` (papermill) and put its staged files where they belong (see :func:`_attempt`)."""
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        log = _wait(proc, timeout, cancelled)
        status = "ok" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        log, _ = proc.communicate()
        status = "timeout"
    seconds = time.time() - start
    stem = notebook.stem
    res_file = stage / ("" if mode == "quick" else mode) / f"{stem}.json"
    passed, failed, failed_ids = _claims(res_file, start)
    outcome = Outcome(notebook=stem, mode=mode, seed=seed, status=status, seconds=round(seconds, 1),
                      claims_passed=passed, claims_failed=failed, claims_failed_ids=failed_ids,
                      sources=_sources(notebook, res_file, start))
    if status == "ok":
        _tidy_executed(tmp, notebook, root)
        target.parent.mkdir(parents=True, exist_ok=True)
        with _deferred_interrupt():  # results and figures, then the notebook: all of this run, or none of it
            _move_in(stage, root / "results")
            os.replace(tmp, target)
        outcome.output = str(target.relative_to(root))
        return outcome
    cell = _running_cell(tmp)
    if status == "failed" and "CellTimeoutError" in log:  # nbclient's per-cell timeout
        outcome.status = "timeout"
        outcome.error = f"{cell or 'a cell'} did not finish in {cell_timeout:g} s"
    elif status == "timeout":
        outcome.error = f"timed out after {timeout:g} s (the whole notebook)" + (
            f"; {cell} was running" if cell else "")
    else:
        outcome.error = _error_of(tmp, log)
    outcome.output = _keep_failed(stage, tmp, logs, stem, mode)
    return outcome


def sweep_tmp(results: Path) -> list[Path]:
    """Remove what killed or hung runs of this machine left in ``results/.tmp/`` (staging folders and executed
    copies named ``<stem>.<host>.<pid>.<thread>``, or ``<stem>.<pid>.<thread>.ipynb`` from before hosts were
    named) once their process is gone; another machine's (a shared filesystem) are left alone. Returns them."""
    import psutil

    removed = []
    for path in sorted((results / ".tmp").glob("*")):
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


@dataclass(frozen=True)
class Task:
    """One notebook to execute, self-contained: a worker needs no shared filesystem, only the same environment."""

    stem: str  # "NN-slug"
    notebook: bytes  # the notebook file as the client has it
    mode: str
    seed: int
    timeout: float | None = None
    cell_timeout: float | None = None
    retries: int = 1
    library: str | None = None  # the client's library hash; a worker with another refuses (None: no check)
    registry: bytes | None = None  # book/papers.yml: the kernel records the paper's own packages from it
    gpu: bool = False  # full mode wants a GPU (a cluster task then requests the resource GPU=1)


@dataclass
class TaskResult:
    """What a task sends back: its outcome and every file it produced, relative to the checkout's root."""

    outcome: Outcome
    files: dict[str, bytes] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)  # the machine it ran on
    versions: dict[str, str] = field(default_factory=dict)


def make_task(root: Path, notebook: Path, mode: str, seed: int = 0, timeout: float | None = None,
              cell_timeout: float | None = None, retries: int = 1, library: str | None = None) -> Task:
    """The :class:`Task` of ``notebook`` (in ``root/notebooks``); ``gpu`` from ``book/papers.yml`` if present."""
    registry = root / "book" / "papers.yml"
    gpu = False
    if registry.exists():
        from .registry import load_registry

        gpu = any(p.gpu for p in load_registry(root)[1] if p.stem == notebook.stem)
    return Task(stem=notebook.stem, notebook=notebook.read_bytes(), mode=paths.check_mode(mode), seed=seed,
                timeout=timeout, cell_timeout=cell_timeout, retries=retries, library=library,
                registry=registry.read_bytes() if registry.exists() else None, gpu=gpu)


def run_task(task: Task, cancelled: Callable[[], bool] | None = None, unset: tuple[str, ...] = ()) -> TaskResult:
    """Execute ``task`` here with :func:`execute` in a scratch folder laid out like a checkout (``notebooks/``,
    ``results/``, ``book/papers.yml``), and return the files it wrote (``cancelled`` and ``unset`` as there).
    Raises :class:`LibraryMismatch` before running anything if this machine's ``repro`` library hashes
    differently from the client's."""
    if task.library is not None:
        here = provenance.library_hash()
        if here != task.library:
            raise LibraryMismatch(
                f"{socket.gethostname()} refused {task.stem}: its repro library ({provenance.library_dir()}) hashes "
                f"{here}, the client's {task.library}; install the client's code on every worker "
                "(pip install -r requirements.txt from the same checkout) and restart the worker")
    with tempfile.TemporaryDirectory(prefix=f"repro-{task.stem}-") as tmp:
        scratch = Path(tmp)
        notebook = scratch / "notebooks" / f"{task.stem}.ipynb"
        notebook.parent.mkdir()
        notebook.write_bytes(task.notebook)
        (scratch / "results").mkdir()
        if task.registry is not None:  # registry.find() in the kernel sees this folder as the book's root
            (scratch / "book").mkdir()
            (scratch / "book" / "papers.yml").write_bytes(task.registry)
            (scratch / "lib" / "repro").mkdir(parents=True)
        outcome = execute(scratch, notebook, task.mode, task.seed, task.timeout, task.cell_timeout, task.retries,
                          cancelled, unset)
        files = {p.relative_to(scratch).as_posix(): p.read_bytes()
                 for p in sorted((scratch / "results").rglob("*"))
                 if p.is_file() and ".tmp" not in p.relative_to(scratch).parts}
        if outcome.output and outcome.output.startswith("notebooks/"):  # quick mode: executed in place
            files[outcome.output] = (scratch / outcome.output).read_bytes()
    return TaskResult(outcome, files, hardware=_task_hardware(_recorded_hardware(files, task)),
                      versions=provenance.versions())


def _recorded_hardware(files: dict[str, bytes], task: Task) -> dict[str, Any] | None:
    """The ``hardware`` a task's kernel wrote into its results file, if it wrote one."""
    rel = f"results/{task.stem}.json" if task.mode == "quick" else f"results/{task.mode}/{task.stem}.json"
    try:
        hardware = json.loads(files[rel])["hardware"]
    except (KeyError, ValueError, TypeError):
        return None
    return hardware if isinstance(hardware, dict) else None


def _checked_path(root: Path, stem: str, rel: str) -> Path:
    """``root/rel`` if ``rel`` is a file a task may write: under ``results/`` (not the manifest) or the
    task's own notebook; anything else (an absolute path, ``..``) is refused."""
    parts = PurePosixPath(rel).parts
    ok = (len(parts) >= 2 and parts[0] == "results" and ".." not in parts and rel != "results/manifest.json"
          and not PurePosixPath(rel).is_absolute()) or rel == f"notebooks/{stem}.ipynb"
    if not ok:
        raise ValueError(f"task {stem} returned a file outside results/: {rel!r}")
    return root / rel


def _with_commit(root: Path, notebook: Path, data: bytes) -> tuple[bytes, str | None]:
    """A results file with ``sources.commit`` filled in as a kernel in the checkout fills it
    (:func:`provenance.commit_if_clean`), provided the library modules the kernel used are the client's as they
    are now (:func:`provenance.changed_files`); else unchanged."""
    try:
        record = json.loads(data)
        src = record["sources"]
        files = dict(src.get("library_files") or {})
    except (ValueError, KeyError, TypeError, AttributeError):
        return data, None
    if src.get("commit") or not files or provenance.changed_files(files):
        return data, None
    commit = provenance.commit_if_clean(root, notebook, src.get("notebook"), files)
    if commit is None:
        return data, None
    src["commit"] = commit
    return (json.dumps(provenance.strict_json(record), indent=2, allow_nan=False) + "\n").encode(), commit


def deliver(root: Path, notebook: Path, result: TaskResult) -> Outcome:
    """Write a task's files into the checkout, each atomically: results and figures first, the executed
    notebook last. Returns its outcome with the commit filled in where the kernel could not see it."""
    outcome = result.outcome
    results_json = {f"results/{notebook.stem}.json", f"results/{outcome.mode}/{notebook.stem}.json"}
    failed_dir = f"results/logs/{notebook.stem}.{outcome.mode}.failed/"
    if any(rel.startswith(failed_dir) for rel in result.files):  # this failure's files replace an earlier one's
        shutil.rmtree(root / failed_dir, ignore_errors=True)
    ordered = sorted(result.files, key=lambda rel: (rel.endswith(".ipynb"), rel))
    for rel in ordered:
        data = result.files[rel]
        target = _checked_path(root, notebook.stem, rel)
        if rel in results_json:
            data, commit = _with_commit(root, notebook, data)
            if commit and outcome.sources and outcome.sources.get("commit") is None:
                outcome.sources["commit"] = commit
        provenance.write_bytes_atomic(target, data)
    return outcome


@contextlib.contextmanager
def _deferred_interrupt() -> Iterator[None]:
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


def failed_outcome(root: Path, notebook: Path, mode: str, seed: int, error: str, seconds: float,
                   worker: str | None = None) -> Outcome:
    """The record of a task that returned nothing: it raised on its worker, or its workers kept dying."""
    return Outcome(notebook=notebook.stem, mode=mode, seed=seed, status="failed", seconds=round(seconds, 1),
                   error=error[:2000], sources=_sources(notebook, root / "results" / "-", time.time()),
                   worker=worker)


class Manifest:
    """``results/manifest.json``: one record per notebook, mode and seed (:meth:`key`), merged with earlier runs and
    rewritten atomically after every notebook. Each update re-reads the file under a lock (threads and ``flock``
    across processes), so two runs at once do not lose each other's records. A file that exists but cannot be read
    is an error (:class:`repro.tools.provenance.UnreadableFile`), never replaced: :meth:`check` says so before a
    run starts. A failed run keeps the last successful record of its key under ``last_ok``."""

    def __init__(self, root: Path):
        self.path = root / "results" / "manifest.json"
        self.root = root
        self.lock = threading.Lock()

    def _load(self) -> dict[str, Any]:
        return provenance.read_manifest(self.path)

    def check(self) -> None:
        """Raise :class:`repro.tools.provenance.UnreadableFile` (naming the file) if the manifest exists but
        cannot be read: a run would otherwise have nowhere to record its notebooks."""
        self._load()

    @staticmethod
    def key(notebook: str, mode: str, seed: int = 0) -> str:
        """``NN-slug`` for quick mode and seed 0 (what the pages show), ``NN-slug (full)``, and with another seed
        ``NN-slug (quick, seed 3)``: a run with another seed never replaces the seed-0 record."""
        if seed == 0:
            return notebook if mode == "quick" else f"{notebook} ({mode})"
        return f"{notebook} ({mode}, seed {seed})"

    def seconds(self, notebook: str, mode: str, seed: int = 0) -> float:
        """The last recorded run time of ``notebook`` in ``mode`` (0 if none): longest first on a cluster."""
        entry = self._load()["notebooks"].get(self.key(notebook, mode, seed)) or {}
        value = entry.get("seconds")
        return float(value) if isinstance(value, int | float) else 0.0

    def record(self, outcome: Outcome, hardware: dict[str, Any] | None = None,
               versions: dict[str, str] | None = None) -> None:
        """Merge ``outcome`` in, with the versions and hardware of the machine that ran it (``None``: this one;
        ``{}`` where unknown, e.g. a task whose worker died). A failed outcome keeps the key's last successful
        record under ``last_ok``."""
        import fcntl

        entry = {k: v for k, v in asdict(outcome).items() if v is not None}
        entry.update(finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                     versions=provenance.versions() if versions is None else versions,
                     hardware=_hardware() if hardware is None else hardware)
        key = self.key(outcome.notebook, outcome.mode, outcome.seed)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock, open(self.path.parent / ".manifest.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self._load()
            previous = data["notebooks"].get(key)
            if entry["status"] != "ok" and isinstance(previous, dict):
                last_ok = previous if previous.get("status") == "ok" else previous.get("last_ok")
                if isinstance(last_ok, dict):
                    entry["last_ok"] = {k: v for k, v in last_ok.items() if k != "last_ok"}
            data["notebooks"][key] = entry
            data["notebooks"] = dict(sorted(data["notebooks"].items()))
            try:
                provenance.write_json_atomic(self.path, data)
            except OSError as e:  # a full disk: name the file (a failed write() does not)
                e.filename = e.filename or str(self.path)
                raise


def _hardware() -> dict[str, Any]:
    """The runner's machine; notebook kernels record their own (with torch threads) in their results."""
    info = provenance.hardware()
    info.pop("torch_threads", None)
    try:
        import torch

        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        info["gpu"] = None
    return info


def _task_hardware(recorded: dict[str, Any] | None) -> dict[str, Any]:
    """The machine a Dask task ran on, for its manifest record: what its kernel recorded in its results file (the
    GPU included: the notebooks import torch), without torch's thread count; without a results file, the
    platform and CPU only (finding the GPU would import torch into the worker: 3-12 s)."""
    info = dict(recorded) if recorded else {k: v for k, v in provenance.hardware().items() if k != "gpu"}
    info.pop("torch_threads", None)
    return info


def _check_writable(results: Path) -> None:
    """A :class:`RunError` before anything runs if ``results/`` (its ``.tmp/``) cannot be written."""
    try:
        (results / ".tmp").mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=results / ".tmp", prefix=".probe-"):
            pass
    except OSError as e:
        raise RunError(f"cannot write into {provenance.shown(results)} ({e.strerror or e}); nothing was run. Make it "
                       "writable (or free some space) and run again") from None


WRITE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT, errno.EIO}


def _write_error(e: OSError, where: str, outcomes: list[Outcome], left: list[Path]) -> RunError:
    """The :class:`RunError` for a file of ``where`` that could not be written (``left``: not run yet)."""
    again = f" (python -m repro run --only {','.join(nb.name[:2] for nb in left)})" if left else ""
    name = provenance.shown(Path(e.filename)) if e.filename else "a file under results/"
    return RunError(f"{where}: could not write {name} ({e.strerror or e}). Every file is replaced atomically, so "
                    "nothing written before was damaged; the summary above is what ran (the manifest may lack the "
                    f"last one's record). Free some space or make results/ writable, then run the rest again{again}",
                    outcomes)


def run(root: Path, mode: str = "quick", only: list[str] | None = None, jobs: int = 1,
        timeout: float | None = None, seed: int = 0, progress: bool = True, cell_timeout: float | None = None,
        retries: int = 1, cluster: str | None = None, connect_timeout: float | None = None) -> list[Outcome]:
    """Execute the selected notebooks, keep going past failures, retry timed-out ones ``retries`` times, record
    each in the manifest as it finishes. Returns the outcomes in notebook order.

    Without ``cluster`` (and ``jobs`` 1) the notebooks run one after another in this process and in the checkout,
    without Dask (:func:`execute`); with ``cluster="local:N"`` or ``"tcp://HOST:PORT"`` (``jobs=N`` is
    ``local:N``) on Dask (:mod:`.cluster`).
    Bad arguments, an unreadable notebook or manifest (:class:`repro.tools.provenance.UnreadableFile`) are a
    ``ValueError`` before anything runs; a ``results/`` that cannot be written is a :class:`RunError` (before,
    or with the outcomes so far). Ctrl-C stops the run (``KeyboardInterrupt``) with every finished notebook
    written and recorded."""
    paths.check_mode(mode)
    seed = check_seed(seed)
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    if jobs > 1:
        if cluster is not None:
            raise ValueError("give --jobs N or --cluster, not both (--jobs N is --cluster local:N)")
        cluster = f"local:{jobs}"
    timeout, cell_timeout = check_seconds("--timeout", timeout), check_seconds("--cell-timeout", cell_timeout)
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    spec = None
    if cluster is not None:
        from . import cluster as dask_cluster  # imports Dask only when it runs

        spec = dask_cluster.parse(cluster)
    notebooks = discover(root, only)
    if not notebooks:
        raise ValueError(f"no notebooks found in {root / 'notebooks'}")
    for nb in notebooks:
        provenance.read_notebook(nb)  # a truncated notebook is named here, not in papermill's log
    man = Manifest(root)
    man.check()
    _check_writable(root / "results")
    sweep_tmp(root / "results")
    from tqdm.auto import tqdm

    bar = tqdm(total=len(notebooks), desc=f"{mode} run", unit="nb", disable=not progress)
    outcomes: dict[str, Outcome] = {}
    recorded: set[str] = set()

    def finished(notebook: Path, result: TaskResult | Outcome) -> None:
        with _deferred_interrupt():
            if isinstance(result, TaskResult):
                out = outcomes[notebook.stem] = deliver(root, notebook, result)
                man.record(out, result.hardware, result.versions)
            else:  # a task that returned nothing: the machine and its versions are unknown
                out = outcomes[notebook.stem] = result
                man.record(out, {}, {})
            recorded.add(notebook.stem)
        bar.set_postfix_str(f"{out.notebook}: {out.status} ({out.seconds:.0f} s)")
        bar.update()

    current = "the run"
    try:
        if spec is None:  # one after another in this process and in the checkout, without Dask
            for nb in notebooks:
                current = nb.stem
                out = outcomes[nb.stem] = execute(root, nb, mode, seed, timeout, cell_timeout, retries)
                man.record(out)
                recorded.add(nb.stem)
                bar.set_postfix_str(f"{out.notebook}: {out.status} ({out.seconds:.0f} s)")
                bar.update()
        else:
            dask_cluster.run(root, spec, notebooks, mode, seed, timeout, cell_timeout, retries, finished, man,
                             connect_timeout)
    except OSError as e:
        if e.errno not in WRITE_ERRNOS and e.filename is None:
            raise
        done = [outcomes[nb.stem] for nb in notebooks if nb.stem in outcomes]
        raise _write_error(e, current, done, [nb for nb in notebooks if nb.stem not in recorded]) from e
    finally:
        bar.close()
    return [outcomes[nb.stem] for nb in notebooks]


def summary(outcomes: list[Outcome]) -> str:
    """A few lines for the terminal: one per notebook, then the failures' errors."""
    lines = []
    for o in outcomes:
        claims = "" if o.claims_passed is None else f", claims {o.claims_passed} held / {o.claims_failed} not"
        retry = f" (attempt {o.attempts}; first: {o.retried['error']})" if o.retried else ""
        lines.append(f"{o.notebook:40s} {o.status:8s} {o.seconds:7.1f} s{claims}{retry}")
    for o in outcomes:
        if o.status != "ok":
            where = f" on {o.worker}" if o.worker else ""
            copy = f"\n  (executed copy: {o.output})" if o.output else ""
            lines.append(f"\n{o.notebook} {o.status}{where}: {o.error}{copy}")
    return "\n".join(lines)


def rearm_asyncio_sends() -> None:
    """Patch ``jupyter_client.session.Session.send`` so that a send on a ``zmq.asyncio`` socket is followed by
    ``socket.get(zmq.EVENTS)``: pyzmq's asyncio socket then schedules its pending receivers if a message is
    waiting (see the module docstring). Harmless where nothing waits; idempotent."""
    import zmq
    import zmq.asyncio
    from jupyter_client import session

    original = session.Session.send
    if getattr(original, "_repro_rearms", False):
        return

    def send(self: Any, stream: Any, *args: Any, **kwargs: Any) -> Any:
        msg = original(self, stream, *args, **kwargs)
        if isinstance(stream, zmq.asyncio.Socket) and not stream.closed:
            stream.get(zmq.EVENTS)
        return msg

    send._repro_rearms = True  # type: ignore[attr-defined]
    session.Session.send = send  # type: ignore[method-assign]


def _die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this process when the runner that started it (``$REPRO_RUNNER_PID``) dies,
    so a killed runner or Dask worker leaves no papermill behind (its kernel follows: ipykernel exits when its
    parent does). Elsewhere, or outside the runner, nothing."""
    parent = os.environ.get(PARENT_ENV, "")
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):  # the runner died before the request took effect
        os._exit(1)


def _isolate_if_asked() -> None:
    """Enter an empty network namespace (loopback only) when the runner asked for one (``$REPRO_NETNS=1``, set
    only where :func:`repro.tools.offline.network_isolation` found that it works); the kernel inherits it. First
    thing in the process: a new user namespace needs a single-threaded one."""
    if os.environ.get(offline.NETNS_ENV) != "1":
        return
    try:
        offline.isolate_network()
    except OSError as e:
        print(f"error: the offline guard could not put this notebook in an empty network namespace ({e}); "
              f"set {offline.NETNS_OFF_ENV}=1 to run with the in-process guard only", file=sys.stderr)
        sys.exit(1)


def papermill_main(argv: list[str] | None = None) -> None:
    """``papermill`` with :func:`rearm_asyncio_sends` applied: what the runner executes each notebook with (in an
    empty network namespace where the runner asked for one)."""
    _isolate_if_asked()
    _die_with_parent()
    rearm_asyncio_sends()
    from papermill.cli import papermill

    papermill.main(args=argv, prog_name="papermill")


if __name__ == "__main__":
    papermill_main()
