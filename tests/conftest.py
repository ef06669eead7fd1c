"""Test-session settings: nothing a test runs may touch the committed results/ or figures."""

from __future__ import annotations

import os
import tempfile

# Set at import, before nbval starts any kernel (kernels inherit the environment): notebooks executed by the
# tests write their results and figures to a scratch folder, not to results/.
os.environ.setdefault("REPRO_RESULTS_DIR", tempfile.mkdtemp(prefix="repro-test-results-"))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# No person looks at the notebooks the tests execute: explorers render their static animation, no widget.
os.environ.setdefault("REPRO_HEADLESS", "1")
