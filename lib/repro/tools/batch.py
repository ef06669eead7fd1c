"""The batch runner behind ``python -m repro run``: papermill executes notebooks, one record per notebook.

Each notebook runs in its own papermill process (a fresh kernel) with ``MODE`` and ``SEED`` injected. The
executed copy is written to a temporary file and moved over the notebook only on success, so a failing,
timed-out or killed run never leaves a half-written notebook; the failed copy is kept in
``results/logs/`` for inspection. Results files are written atomically by the notebooks themselves
(:func:`repro.report.finish`). ``results/manifest.json`` is updated after every notebook, so a run killed
half-way keeps the records of what finished. Quick mode runs each kernel in the portable environment of
:mod:`repro.tools.portable` (one thread, fixed CPU kernels).
Full mode writes executed notebooks and results under ``results/full/`` so the committed quick-mode
outputs (which the tests compare against) stay as they are.

Two timeouts bound a run: nbclient's per-cell ``cell_timeout`` (papermill ``--execution-timeout``), reported as
"cell N (first line) did not finish in S s", and the per-notebook ``timeout``, after which the whole process tree
is killed. A notebook that timed out either way is retried once (``retries``); the manifest keeps the first
attempt's error under ``retried``. Kernels run offline (``$REPRO_OFFLINE=1``: ``runtime.setup`` installs the
guard of :mod:`repro.tools.offline`) and headless (``$REPRO_HEADLESS=1``: explorers render their animation, no
widget). Each record carries the content hashes of the notebook's sources and of the library
(:mod:`repro.tools.provenance`).

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
the stranded reply, so the cell ends late instead of never (``tests/tools/test_client_fix.py``).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import offline, paths, portable, provenance

NOTEBOOK_RE = re.compile(r"^(\d\d)-[a-z0-9-]+\.ipynb$")


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


def _attempt(root: Path, notebook: Path, mode: str, seed: int, timeout: float | None,
             cell_timeout: float | None) -> Outcome:
    """One papermill run of ``notebook``; replace it (quick) or write ``results/full/`` (full) on success."""
    results = root / "results"
    tmp_dir, logs = results / ".tmp", results / "logs"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir / f"{notebook.stem}.{os.getpid()}.{threading.get_ident()}.ipynb"
    target = notebook if mode == "quick" else results / mode / notebook.name
    env = {**os.environ, paths.RESULTS_ENV: str(results), "PYTHONHASHSEED": "0", "REPRO_HEADLESS": "1",
           provenance.NOTEBOOK_ENV: str(notebook.resolve())}
    env.setdefault(offline.ENV, "1")
    if mode == "quick":
        env.update(portable.QUICK_ENV)  # the same numbers on any AVX2 machine (repro.tools.portable)
    cmd = [sys.executable, "-m", "repro.tools.batch", str(notebook), str(tmp), "-p", "MODE", mode, "-p", "SEED",
           str(seed), "-k", "python3", "--cwd", str(notebook.parent), "--no-progress-bar",
           "--log-level", "WARNING"]
    if cell_timeout:
        cmd += ["--execution-timeout", str(max(1, math.ceil(cell_timeout)))]
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
        status = "ok" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        log, _ = proc.communicate()
        status = "timeout"
    seconds = time.time() - start
    stem = notebook.stem
    res_file = results / ("" if mode == "quick" else mode) / f"{stem}.json"
    passed, failed, failed_ids = _claims(res_file, start)
    outcome = Outcome(notebook=stem, mode=mode, seed=seed, status=status, seconds=round(seconds, 1),
                      claims_passed=passed, claims_failed=failed, claims_failed_ids=failed_ids,
                      sources=_sources(notebook, res_file, start))
    if status == "ok":
        _tidy_executed(tmp, notebook, root)
        target.parent.mkdir(parents=True, exist_ok=True)
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
    if tmp.exists():
        logs.mkdir(parents=True, exist_ok=True)
        kept = logs / f"{stem}.{mode}.failed.ipynb"
        os.replace(tmp, kept)
        outcome.output = str(kept.relative_to(root))
    return outcome


def execute(root: Path, notebook: Path, mode: str, seed: int = 0, timeout: float | None = None,
            cell_timeout: float | None = None, retries: int = 1) -> Outcome:
    """Execute one notebook with papermill (:func:`_attempt`); a run that timed out (a cell past ``cell_timeout``
    or the notebook past ``timeout``) is retried up to ``retries`` times, the first attempt kept in ``retried``."""
    paths.check_mode(mode)
    outcome = _attempt(root, notebook, mode, seed, timeout, cell_timeout)
    first = outcome
    for n in range(2, retries + 2):
        if outcome.status != "timeout":
            break
        outcome = _attempt(root, notebook, mode, seed, timeout, cell_timeout)
        outcome.attempts = n
        outcome.retried = {"status": first.status, "error": first.error, "seconds": first.seconds}
    return outcome


class Manifest:
    """``results/manifest.json``: one record per notebook, merged with earlier runs and rewritten atomically
    after every notebook. Each update re-reads the file under a lock (threads and ``flock`` across
    processes), so two runs at once do not lose each other's records."""

    def __init__(self, root: Path):
        self.path = root / "results" / "manifest.json"
        self.root = root
        self.lock = threading.Lock()

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            data = {}
        data.setdefault("notebooks", {})
        return data

    def record(self, outcome: Outcome) -> None:
        import fcntl

        entry = {k: v for k, v in asdict(outcome).items() if v is not None}
        entry.update(finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"), versions=provenance.versions(),
                     hardware=_hardware())
        key = outcome.notebook if outcome.mode == "quick" else f"{outcome.notebook} ({outcome.mode})"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock, open(self.path.parent / ".manifest.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self._load()
            data["notebooks"][key] = entry
            data["notebooks"] = dict(sorted(data["notebooks"].items()))
            provenance.write_json_atomic(self.path, data)


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


def run(root: Path, mode: str = "quick", only: list[str] | None = None, jobs: int = 1,
        timeout: float | None = None, seed: int = 0, progress: bool = True, cell_timeout: float | None = None,
        retries: int = 1) -> list[Outcome]:
    """Execute the selected notebooks (``jobs`` at a time), keep going past failures, retry timed-out ones
    ``retries`` times, record each in the manifest. Returns the outcomes in notebook order."""
    paths.check_mode(mode)
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"--timeout must be positive, got {timeout}")
    if cell_timeout is not None and cell_timeout <= 0:
        raise ValueError(f"--cell-timeout must be positive, got {cell_timeout}")
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    notebooks = discover(root, only)
    if not notebooks:
        raise ValueError(f"no notebooks found in {root / 'notebooks'}")
    man = Manifest(root)
    from tqdm.auto import tqdm

    bar = tqdm(total=len(notebooks), desc=f"{mode} run", unit="nb", disable=not progress)
    outcomes: dict[str, Outcome] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(execute, root, nb, mode, seed, timeout, cell_timeout, retries): nb
                   for nb in notebooks}
        for fut in as_completed(futures):
            out = fut.result()
            man.record(out)
            outcomes[out.notebook] = out
            bar.set_postfix_str(f"{out.notebook}: {out.status} ({out.seconds:.0f} s)")
            bar.update()
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
            lines.append(f"\n{o.notebook} {o.status}: {o.error}\n  (executed copy: {o.output})")
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


def papermill_main(argv: list[str] | None = None) -> None:
    """``papermill`` with :func:`rearm_asyncio_sends` applied: what the runner executes each notebook with."""
    rearm_asyncio_sends()
    from papermill.cli import papermill

    papermill.main(args=argv, prog_name="papermill")


if __name__ == "__main__":
    papermill_main()
