"""``results/manifest.json``: the runner's record of every notebook run (:class:`Outcome`), merged and rewritten
atomically after every notebook (:class:`Manifest`).

A run killed half-way therefore keeps the records of what finished; a failed run keeps the notebook's last
successful record under ``last_ok`` (the pages show that one), and records are kept per notebook, mode and seed
(:meth:`Manifest.key`). A manifest that exists but cannot be read stops the run before anything runs
(:func:`repro.tools.provenance.read_manifest`): it is never replaced by an empty one. Each record carries the
versions and hardware of the machine that ran the notebook and the content hashes of its sources
(:mod:`repro.tools.provenance`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import paths, provenance


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


class Manifest:
    """``results/manifest.json``: one record per notebook, mode and seed (:meth:`key`), merged with earlier runs and
    rewritten atomically after every notebook. Each update re-reads the file under a lock (threads and ``flock``
    across processes), so two runs at once do not lose each other's records. A file that exists but cannot be read
    is an error (:class:`repro.tools.provenance.UnreadableFile`), never replaced: :meth:`check` says so before a
    run starts. A failed run keeps the last successful record of its key under ``last_ok``."""

    def __init__(self, root: Path):
        self.path = paths.manifest_file(root)
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
            data["notebooks"][key] = _with_last_ok(entry, data["notebooks"].get(key))
            data["notebooks"] = dict(sorted(data["notebooks"].items()))
            try:
                provenance.write_json_atomic(self.path, data)
            except OSError as e:  # a full disk: name the file (a failed write() does not)
                e.filename = e.filename or str(self.path)
                raise


def _with_last_ok(entry: dict[str, Any], previous: Any) -> dict[str, Any]:
    """``entry``, and if it is not a success, the last successful record among ``previous`` (the key's record so
    far) and its own ``last_ok`` under ``last_ok``."""
    if entry["status"] != "ok" and isinstance(previous, dict):
        last_ok = previous if previous.get("status") == "ok" else previous.get("last_ok")
        if isinstance(last_ok, dict):
            entry["last_ok"] = {k: v for k, v in last_ok.items() if k != "last_ok"}
    return entry


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
