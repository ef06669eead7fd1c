"""benchmarks/gpu_check.sh (issue 42): the prepared GPU check runs end to end on the CPU under a tiny budget."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
STEPS = ["device", "device-tests", "bench-lmo", "bench-pogo", "bench-spreading", "bench-pace", "full-05"]


def digests() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((ROOT / "results").glob("bench-*.json"))}


def run(*args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(Path.home())}
    return subprocess.run([str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_every_step_is_reported_and_the_committed_benchmarks_are_left_alone(tmp_path):
    before = digests()
    out = run("--cap", "15", "--budget", "25", "--only", "05", "--out", str(tmp_path / "check"))
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split("\t") for line in (tmp_path / "check" / "summary.tsv").read_text().splitlines()[1:]]
    assert [r[0] for r in rows] == STEPS
    assert rows[0][1] == "ok" and "cpu" in out.stdout
    assert all(r[1] == "ok" or r[1].startswith(("timeout", "skipped")) for r in rows), rows
    assert any(r[1] == "skipped (budget)" for r in rows), "the budget must stop the run"
    assert digests() == before


def test_bad_options_are_named():
    out = run("--cap", "soon")
    assert out.returncode == 2 and "--cap and --budget take whole seconds" in out.stderr
    out = run("--fast")
    assert out.returncode == 2 and "unknown option --fast" in out.stderr
