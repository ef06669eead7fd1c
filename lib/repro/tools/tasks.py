"""A notebook as a self-contained task for a Dask worker (:mod:`repro.tools.cluster`), run in a scratch folder and
delivered into the checkout by the client.

A :class:`Task` holds the notebook's bytes, ``MODE``, ``SEED``, the timeouts and the client's library hash, nothing
that needs a shared filesystem (:func:`make_task`). :func:`run_task` lays it out in a scratch folder shaped like a
checkout and runs the same :func:`repro.tools.execute.execute` there (same papermill command, timeouts, retries
and environment), then returns the executed notebook, the results file and the figures as bytes
(:class:`TaskResult`); only the client writes them into the checkout (:func:`deliver`, each file atomically, the
notebook last). A cluster kernel's working folder is the scratch ``notebooks/``: files a notebook writes beside
itself are discarded with it. A kernel in a scratch folder cannot see the checkout's git state, so the client fills
in the commit (:func:`_with_commit`) exactly as a kernel in the checkout would have. A worker whose library hashes
differently from the client's refuses the task (:class:`LibraryMismatch`); a task that returns nothing is recorded
with :func:`failed_outcome`.
"""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from . import paths, provenance
from .execute import execute, recorded_sources
from .manifest import Outcome

HERE = Path()  # a checkout's root in the relative paths (``results/...``) that key a task's files


class LibraryMismatch(RuntimeError):
    """A worker's installed ``repro`` is not the client's: it refuses the task instead of running other code."""


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


def _check_library(task: Task) -> None:
    """:class:`LibraryMismatch` if this machine's ``repro`` library hashes differently from the client's."""
    if task.library is None:
        return
    here = provenance.library_hash()
    if here != task.library:
        raise LibraryMismatch(
            f"{socket.gethostname()} refused {task.stem}: its repro library ({provenance.library_dir()}) hashes "
            f"{here}, the client's {task.library}; install the client's code on every worker "
            "(pip install -r requirements.txt from the same checkout) and restart the worker")


def _lay_out(scratch: Path, task: Task) -> Path:
    """Write ``task`` into ``scratch`` as a checkout (``notebooks/``, ``results/``, ``book/papers.yml``); returns
    the notebook's path there."""
    notebook = scratch / "notebooks" / f"{task.stem}.ipynb"
    notebook.parent.mkdir()
    notebook.write_bytes(task.notebook)
    paths.checkout_results(scratch).mkdir()
    if task.registry is not None:  # registry.find() in the kernel sees this folder as the book's root
        (scratch / "book").mkdir()
        (scratch / "book" / "papers.yml").write_bytes(task.registry)
        (scratch / "lib" / "repro").mkdir(parents=True)
    return notebook


def run_task(task: Task, cancelled: Callable[[], bool] | None = None, unset: tuple[str, ...] = ()) -> TaskResult:
    """Execute ``task`` here with :func:`repro.tools.execute.execute` in a scratch folder laid out like a checkout
    (``notebooks/``, ``results/``, ``book/papers.yml``), and return the files it wrote (``cancelled`` and ``unset``
    as there). Raises :class:`LibraryMismatch` before running anything if this machine's ``repro`` library hashes
    differently from the client's."""
    _check_library(task)
    with tempfile.TemporaryDirectory(prefix=f"repro-{task.stem}-") as tmp:
        scratch = Path(tmp)
        notebook = _lay_out(scratch, task)
        outcome = execute(scratch, notebook, task.mode, task.seed, task.timeout, task.cell_timeout, task.retries,
                          cancelled, unset)
        staging = paths.tmp_dir(scratch).name  # staging leftovers are never sent back
        files = {p.relative_to(scratch).as_posix(): p.read_bytes()
                 for p in sorted(paths.checkout_results(scratch).rglob("*"))
                 if p.is_file() and staging not in p.relative_to(scratch).parts}
        if outcome.output and outcome.output.startswith("notebooks/"):  # quick mode: executed in place
            files[outcome.output] = (scratch / outcome.output).read_bytes()
    return TaskResult(outcome, files, hardware=_task_hardware(_recorded_hardware(files, task)),
                      versions=provenance.versions())


def _results_key(stem: str, mode: str) -> str:
    """The key of a notebook's results file among a task's files: ``results/NN-slug.json`` (quick) or
    ``results/<mode>/NN-slug.json``."""
    return paths.results_file(stem, mode, paths.checkout_results(HERE)).as_posix()


def _recorded_hardware(files: dict[str, bytes], task: Task) -> dict[str, Any] | None:
    """The ``hardware`` a task's kernel wrote into its results file, if it wrote one."""
    try:
        hardware = json.loads(files[_results_key(task.stem, task.mode)])["hardware"]
    except (KeyError, ValueError, TypeError):
        return None
    return hardware if isinstance(hardware, dict) else None


def _task_hardware(recorded: dict[str, Any] | None) -> dict[str, Any]:
    """The machine a Dask task ran on, for its manifest record: what its kernel recorded in its results file (the
    GPU included: the notebooks import torch), without torch's thread count; without a results file, the
    platform and CPU only (finding the GPU would import torch into the worker: 3-12 s)."""
    info = dict(recorded) if recorded else {k: v for k, v in provenance.hardware().items() if k != "gpu"}
    info.pop("torch_threads", None)
    return info


def _checked_path(root: Path, stem: str, rel: str) -> Path:
    """``root/rel`` if ``rel`` is a file a task may write: under ``results/`` (not the manifest) or the
    task's own notebook; anything else (an absolute path, ``..``) is refused."""
    parts = PurePosixPath(rel).parts
    ok = (len(parts) >= 2 and parts[0] == paths.RESULTS and ".." not in parts
          and rel != paths.manifest_file(HERE).as_posix() and not PurePosixPath(rel).is_absolute()) \
        or rel == f"notebooks/{stem}.ipynb"
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
    results_json = {_results_key(notebook.stem, mode) for mode in ("quick", outcome.mode)}
    failed = paths.failed_dir(root, notebook.stem, outcome.mode)
    failed_prefix = failed.relative_to(root).as_posix() + "/"
    if any(rel.startswith(failed_prefix) for rel in result.files):  # this failure's files replace an earlier one's
        shutil.rmtree(failed, ignore_errors=True)
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


def failed_outcome(notebook: Path, mode: str, seed: int, error: str, seconds: float,
                   worker: str | None = None) -> Outcome:
    """The record of a task that returned nothing: it raised on its worker, or its workers kept dying."""
    return Outcome(notebook=notebook.stem, mode=mode, seed=seed, status="failed", seconds=round(seconds, 1),
                   error=error[:2000], sources=recorded_sources(notebook, None, time.time()), worker=worker)
