"""The smoke tier (issue 42): every notebook's full-mode code path, executed at a tiny size.

``MODE = "smoke"`` takes every branch full mode takes (``run.full`` is true; every setting full mode switches
stays switched, :func:`repro.runtime.smoke_cut`) with the sizes the notebook's ``smoke=dict(...)`` cuts, so code
that only a long full run reaches cannot rot unseen. Each notebook runs once, offline, under the portable
environment, into a scratch folder; its claims are computed and shown (``results/smoke/NN-slug.json``) but not
asserted. The hygiene suite checks that no notebook branches on ``MODE`` itself, so nothing full mode does is
skipped here."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import nbformat
import pytest

from repro.tools import claims, execute, launcher, paths

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
TIMEOUT_S = 300  # per notebook; each takes seconds to about a minute (the language-model ones load SmolLM2)


@pytest.fixture(params=NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def notebook(request) -> Path:
    return request.param


def run_smoke(notebook: Path, out_dir: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """Execute ``notebook`` with ``MODE = "smoke"`` into ``out_dir`` (results there too); the process tree is
    killed past :data:`TIMEOUT_S`."""
    out = out_dir / notebook.name
    env = {**os.environ, paths.RESULTS_ENV: str(out_dir / "results"), "PYTHONHASHSEED": "0",
           "REPRO_HEADLESS": "1", "REPRO_OFFLINE": "1"}
    cmd = launcher.command(notebook, out, "smoke", 0, cell_timeout=TIMEOUT_S)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        execute.kill_tree(proc.pid)
        proc.communicate()
        pytest.fail(f"{notebook.name}: the smoke tier ran past {TIMEOUT_S} s")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, ""), out


def test_the_smoke_tier_runs_full_mode_code_and_computes_every_claim(notebook, tmp_path):
    done, out = run_smoke(notebook, tmp_path)
    assert done.returncode == 0, f"{notebook.name} failed in the smoke tier:\n{done.stdout[-4000:]}"
    executed = nbformat.read(out, as_version=4)
    errors = [o for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.output_type == "error"]
    assert not errors
    rec = json.loads(paths.results_file(notebook.stem, "smoke", tmp_path / "results").read_text())
    assert rec["mode"] == "smoke" and rec["claims"]
    registered = claims.load_for(notebook.stem)
    assert registered is None or [c["id"] for c in rec["claims"]] == list(registered)
    assert "smoke tier" in "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code"
                                   for o in c.get("outputs", []) if o.output_type == "stream")
