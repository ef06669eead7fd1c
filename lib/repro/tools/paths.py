"""Every path rule of the book, once: the checkout's root, the results folders, figures, the asset cache.

* ``results/NN-slug.json`` quick-mode results (committed); ``results/full/`` full mode: its results files
  are committed where a full run has been made, its executed notebooks are not; ``results/smoke/`` the smoke tier
  (full mode's code path at a tiny size; never committed);
* ``results/figures/NN-slug/name.png`` figures saved by notebooks (not committed);
* ``results/manifest.json`` the runner's record of every run; ``results/logs/`` the failed runs it kept;
  ``results/.tmp/`` its staging folders;
* ``$REPRO_RESULTS_DIR`` replaces ``results/`` for what a kernel writes (:func:`results_dir`; the runner points
  it at a staging folder, the tests at a scratch one); the runner, the pages and every tool that takes a checkout's
  ``root`` use that checkout's own ``results/`` (:func:`checkout_results`);
* ``$REPRO_CACHE`` replaces the offline-asset cache (default ``~/.cache/icml26-repro``).
"""

from __future__ import annotations

import os
from pathlib import Path

RESULTS_ENV = "REPRO_RESULTS_DIR"
CACHE_ENV = "REPRO_CACHE"
MODES = ("quick", "full", "smoke")
# The modes that run like CI: one thread, the portable numeric environment, offline whatever the caller says.
# "smoke" is full mode's code path (every setting full mode switches, every arm it adds) at a tiny size, so that the
# tests execute what only full mode reaches (repro.runtime.Run.config).
CI_MODES = ("quick", "smoke")
RESULTS = "results"  # the results folder's name in a checkout


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


def checkout_results(root: Path) -> Path:
    """``<root>/results``: the results folder of the checkout at ``root`` (or of a scratch folder laid out like
    one), whatever ``$REPRO_RESULTS_DIR`` says. ``Path()`` as ``root`` gives the path relative to a checkout."""
    return root / RESULTS


def results_dir() -> Path:
    """Where results go: ``$REPRO_RESULTS_DIR``, else ``<root>/results``, else ``./results``."""
    if os.environ.get(RESULTS_ENV):
        return Path(os.environ[RESULTS_ENV])
    root = project_root()
    return checkout_results(root or Path.cwd())


def results_file(slug: str, mode: str, base: Path | None = None) -> Path:
    """``results/<slug>.json`` in quick mode, ``results/<mode>/<slug>.json`` otherwise, under the results folder
    ``base`` (default :func:`results_dir`; a checkout's is :func:`checkout_results`, a staging folder is one too)."""
    check_mode(mode)
    return (results_dir() if base is None else base) / ("" if mode == "quick" else mode) / f"{slug}.json"


def executed_notebook(root: Path, notebook: Path, mode: str) -> Path:
    """Where a successful run puts its executed copy of ``notebook``: over the notebook itself in quick mode (the
    committed outputs), ``<root>/results/<mode>/<name>.ipynb`` otherwise."""
    check_mode(mode)
    return notebook if mode == "quick" else checkout_results(root) / mode / notebook.name


def manifest_file(root: Path) -> Path:
    """``<root>/results/manifest.json``: the runner's record of every notebook, mode and seed."""
    return checkout_results(root) / "manifest.json"


def logs_dir(root: Path) -> Path:
    """``<root>/results/logs/``: what failed runs left, for inspection (:func:`failed_copy`, :func:`failed_dir`)."""
    return checkout_results(root) / "logs"


def failed_copy(root: Path, stem: str, mode: str) -> Path:
    """``results/logs/<stem>.<mode>.failed.ipynb``: the executed copy of ``stem``'s last failed run in ``mode``."""
    return logs_dir(root) / f"{stem}.{mode}.failed.ipynb"


def failed_dir(root: Path, stem: str, mode: str) -> Path:
    """``results/logs/<stem>.<mode>.failed/``: the files (results, figures) that run wrote."""
    return logs_dir(root) / f"{stem}.{mode}.failed"


def tmp_dir(root: Path) -> Path:
    """``<root>/results/.tmp/``: the runner's staging folders and executed copies while a notebook runs."""
    return checkout_results(root) / ".tmp"


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
