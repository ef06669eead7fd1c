"""Test-session settings: nothing a test runs may touch the committed results/ or figures, and nothing goes online.

At the repository root, so that it also applies when pytest is given only a notebook
(``pytest notebooks/06-knowledge-editing-collapse.ipynb``): a conftest under ``tests/`` is not loaded then, and
the kernel ran without the portable environment (other numbers than the committed ones) and wrote its results
into results/."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from repro.tools.portable import QUICK_ENV

# Set at import, before nbval starts any kernel (kernels inherit the environment): notebooks executed by the
# tests write their results and figures to a scratch folder, not to results/.
os.environ.setdefault("REPRO_RESULTS_DIR", tempfile.mkdtemp(prefix="repro-test-results-"))
# The portable quick-mode environment (one thread, fixed CPU kernels): the committed outputs were made with it.
for _key, _value in QUICK_ENV.items():
    os.environ.setdefault(_key, _value)
# No person looks at the notebooks the tests execute: explorers render their static animation, no widget.
os.environ.setdefault("REPRO_HEADLESS", "1")
# Offline, enforced: runtime.setup in every notebook the tests execute (and in this process) installs the guard
# that refuses non-loopback connections (repro.tools.offline).
os.environ.setdefault("REPRO_OFFLINE", "1")
# Every notebook the tests execute compares its claims with the committed results/ (repro.report.COMPARE_ENV): on
# the kind of CPU that made them, every number must be equal; on another, the claim ids and verdicts, and every
# registered value inside its committed interval, so a test passes on any CPU where the verdicts hold and fails
# where one changes.
os.environ.setdefault("REPRO_COMPARE_RESULTS", str(Path(__file__).resolve().parent / "results"))

