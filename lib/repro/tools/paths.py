"""Every path rule of the book, once: the checkout's root, the results folders, figures, the asset cache.

* ``results/NN-slug.json`` quick-mode results (committed); ``results/full/`` full mode (not committed);
* ``results/figures/NN-slug/name.png`` figures saved by notebooks (not committed);
* ``$REPRO_RESULTS_DIR`` replaces ``results/`` (the tests use a scratch folder);
* ``$REPRO_CACHE`` replaces the offline-asset cache (default ``~/.cache/icml26-repro``).
"""

from __future__ import annotations

import os
from pathlib import Path

RESULTS_ENV = "REPRO_RESULTS_DIR"
CACHE_ENV = "REPRO_CACHE"
MODES = ("quick", "full")


def check_mode(mode: str) -> str:
    """Return ``mode`` if it is one of :data:`MODES`, else raise a ``ValueError`` naming the valid ones."""
    if mode not in MODES:
        raise ValueError(f"unknown MODE {mode!r}; valid modes are {', '.join(map(repr, MODES))}")
    return mode


def project_root(start: Path | None = None) -> Path | None:
    """The book's root (the folder holding ``book/papers.yml`` and ``lib/repro``), searching upwards; ``None``
    if this process does not run inside a checkout (e.g. on Colab after a plain pip install)."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "book" / "papers.yml").exists() and (d / "lib" / "repro").is_dir():
            return d
    return None


def results_dir() -> Path:
    """Where results go: ``$REPRO_RESULTS_DIR``, else ``<root>/results``, else ``./results``."""
    if os.environ.get(RESULTS_ENV):
        return Path(os.environ[RESULTS_ENV])
    root = project_root()
    return (root / "results") if root else Path.cwd() / "results"


def results_file(slug: str, mode: str) -> Path:
    """``results/<slug>.json`` in quick mode, ``results/<mode>/<slug>.json`` otherwise."""
    check_mode(mode)
    return results_dir() / ("" if mode == "quick" else mode) / f"{slug}.json"


def figure_file(slug: str, name: str) -> Path:
    """``results/figures/<slug>/<name>.png``; ``name`` must be a plain file stem."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"figure name must be a plain file stem, got {name!r}")
    return results_dir() / "figures" / slug / f"{name}.png"


def cache_dir() -> Path:
    """The offline-asset cache (prepared models): ``$REPRO_CACHE`` or ``~/.cache/icml26-repro``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "icml26-repro"
