"""The batch runner behind ``python -m repro run``: papermill executes notebooks, one record per notebook.

:func:`run` checks its arguments and the files it needs before anything runs (a bad argument, an unreadable
notebook or manifest is a ``ValueError``; a ``results/`` it cannot write a :class:`RunError`), sweeps what dead
runs left (:func:`repro.tools.execute.sweep_tmp`), then executes the selected notebooks (:func:`discover`) and
records each in ``results/manifest.json`` as it finishes (:mod:`repro.tools.manifest`), so a run killed half-way
keeps the records of what finished. By default the notebooks run one after another in this process, in the
checkout, without Dask (:func:`repro.tools.execute.execute`: each in its own papermill process and fresh kernel,
its files staged and moved in only on success, timeouts, retries, the offline guard). With ``--cluster`` (``--jobs
N`` is ``--cluster local:N``) each notebook is a :class:`repro.tools.tasks.Task` for a Dask worker
(:mod:`repro.tools.cluster`), whose files only the client writes into the checkout
(:func:`repro.tools.tasks.deliver`, Ctrl-C deferred until the notebook's files and its manifest record are
written). A file that cannot be written mid-run (a full or read-only disk) stops the run with a :class:`RunError`
carrying the outcomes so far; :func:`summary` is what the command prints.

The modules of the runner import downwards only: :mod:`.batch` (this one) → :mod:`.cluster` → :mod:`.tasks` →
:mod:`.execute` → :mod:`.manifest`, :mod:`.launcher` → :mod:`.paths`. Each notebook's papermill process is
``python -m repro.tools.launcher``.
"""

from __future__ import annotations

import errno
import re
import tempfile
from pathlib import Path

from . import cluster as dask_cluster
from . import paths, provenance
from .execute import check_seconds, deferred_interrupt, execute, sweep_tmp
from .manifest import Manifest, Outcome
from .tasks import TaskResult, deliver

MAX_SEED = 2**64 - 1  # torch.manual_seed takes at most this
NOTEBOOK_RE = re.compile(r"^(\d\d)-[a-z0-9-]+\.ipynb$")
WRITE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT, errno.EIO}


class RunError(RuntimeError):
    """The run cannot go on because a file it must write cannot be written (a full or read-only disk). Nothing
    already written is damaged (every write is an atomic replace); ``outcomes`` are the notebooks that ran before
    it stopped, for the summary."""

    def __init__(self, message: str, outcomes: list[Outcome] | None = None):
        super().__init__(message)
        self.outcomes = list(outcomes or [])


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


def _check_writable(root: Path) -> None:
    """A :class:`RunError` before anything runs if ``results/`` (its ``.tmp/``) cannot be written."""
    tmp = paths.tmp_dir(root)
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=tmp, prefix=".probe-"):
            pass
    except OSError as e:
        raise RunError(f"cannot write into {provenance.shown(paths.checkout_results(root))} ({e.strerror or e}); "
                       "nothing was run. Make it writable (or free some space) and run again") from None


def _write_error(e: OSError, where: str, outcomes: list[Outcome], left: list[Path]) -> RunError:
    """The :class:`RunError` for a file of ``where`` that could not be written (``left``: not run yet)."""
    again = f" (python -m repro run --only {','.join(nb.name[:2] for nb in left)})" if left else ""
    name = provenance.shown(Path(e.filename)) if e.filename else "a file under results/"
    return RunError(f"{where}: could not write {name} ({e.strerror or e}). Every file is replaced atomically, so "
                    "nothing written before was damaged; the summary above is what ran (the manifest may lack the "
                    f"last one's record). Free some space or make results/ writable, then run the rest again{again}",
                    outcomes)


def _checked(mode: str, seed: int, jobs: int, timeout: float | None, cell_timeout: float | None, retries: int,
             cluster: str | None) -> tuple[int, float | None, float | None, dask_cluster.Spec | None]:
    """:func:`run`'s arguments checked (a ``ValueError`` naming the first bad one): the seed, the timeouts and where
    the notebooks run (``None``: one after another in this process; ``jobs`` > 1 is ``local:<jobs>``)."""
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
    return seed, timeout, cell_timeout, None if cluster is None else dask_cluster.parse(cluster)


def _prepared(root: Path, only: list[str] | None) -> tuple[list[Path], Manifest]:
    """The selected notebooks and the manifest, once every notebook and the manifest read and ``results/`` is
    writable; what dead runs left in ``results/.tmp/`` is swept."""
    notebooks = discover(root, only)
    if not notebooks:
        raise ValueError(f"no notebooks found in {root / 'notebooks'}")
    for nb in notebooks:
        provenance.read_notebook(nb)  # a truncated notebook is named here, not in papermill's log
    man = Manifest(root)
    man.check()
    _check_writable(root)
    sweep_tmp(root)
    return notebooks, man


def run(root: Path, mode: str = "quick", only: list[str] | None = None, jobs: int = 1,
        timeout: float | None = None, seed: int = 0, progress: bool = True, cell_timeout: float | None = None,
        retries: int = 1, cluster: str | None = None, connect_timeout: float | None = None) -> list[Outcome]:
    """Execute the selected notebooks, keep going past failures, retry timed-out ones ``retries`` times, record
    each in the manifest as it finishes. Returns the outcomes in notebook order.

    Without ``cluster`` (and ``jobs`` 1) the notebooks run one after another in this process and in the checkout,
    without Dask (:func:`repro.tools.execute.execute`); with ``cluster="local:N"`` or ``"tcp://HOST:PORT"``
    (``jobs=N`` is ``local:N``) on Dask (:mod:`.cluster`).
    Bad arguments, an unreadable notebook or manifest (:class:`repro.tools.provenance.UnreadableFile`) are a
    ``ValueError`` before anything runs; a ``results/`` that cannot be written is a :class:`RunError` (before,
    or with the outcomes so far). Ctrl-C stops the run (``KeyboardInterrupt``) with every finished notebook
    written and recorded."""
    seed, timeout, cell_timeout, spec = _checked(mode, seed, jobs, timeout, cell_timeout, retries, cluster)
    notebooks, man = _prepared(root, only)
    from tqdm.auto import tqdm

    bar = tqdm(total=len(notebooks), desc=f"{mode} run", unit="nb", disable=not progress)
    outcomes: dict[str, Outcome] = {}
    recorded: set[str] = set()

    def shown(out: Outcome) -> None:
        bar.set_postfix_str(f"{out.notebook}: {out.status} ({out.seconds:.0f} s)")
        bar.update()

    def finished(notebook: Path, result: TaskResult | Outcome) -> None:
        with deferred_interrupt():
            if isinstance(result, TaskResult):
                out = outcomes[notebook.stem] = deliver(root, notebook, result)
                man.record(out, result.hardware, result.versions)
            else:  # a task that returned nothing: the machine and its versions are unknown
                out = outcomes[notebook.stem] = result
                man.record(out, {}, {})
            recorded.add(notebook.stem)
        shown(out)

    current = "the run"
    try:
        if spec is None:  # one after another in this process and in the checkout, without Dask
            for nb in notebooks:
                current = nb.stem
                out = outcomes[nb.stem] = execute(root, nb, mode, seed, timeout, cell_timeout, retries)
                man.record(out)
                recorded.add(nb.stem)
                shown(out)
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

