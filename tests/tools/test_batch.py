"""The batch runner (python -m repro run): failures are recorded and the rest go on; timeouts kill the whole
process tree; a hung cell is reported by number within the cell timeout and the notebook retried once; a killed
run leaves earlier results and notebooks intact; kernels run offline; bad arguments fail at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from fixture_notebooks import make_notebook

from repro.tools import batch, manifest, provenance, tasks

FINISH = (
    "from repro.report import Claim, finish\n"
    "finish('{stem}', mode=MODE, seed=SEED, claims=[Claim('C1', 'x', paper=1, measured=1, lo=0, hi=2),\n"
    "       Claim('C2', 'y', paper=1, measured=5, hi=2, asserted=False)])"
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "results").mkdir()
    return tmp_path


def test_a_failing_notebook_is_recorded_and_the_others_run(root):
    ok = make_notebook(root, "01-ok", FINISH)
    bad = make_notebook(root, "02-bad", "raise ValueError('boom')")
    also_ok = make_notebook(root, "03-plain", "x = 1 + 1")
    bad_before = bad.read_text()
    outcomes = batch.run(root, "quick", progress=False)
    assert [o.status for o in outcomes] == ["ok", "failed", "ok"]
    assert "ValueError: boom" in outcomes[1].error
    assert bad.read_text() == bad_before  # a failed run never overwrites the notebook
    assert (root / outcomes[1].output).exists()  # the failed executed copy is kept for inspection
    assert "papermill" in nbformat.read(ok, as_version=4).metadata  # executed in place
    assert nbformat.read(also_ok, as_version=4).cells[1].outputs == []
    man = json.loads((root / "results" / "manifest.json").read_text())["notebooks"]
    assert man["01-ok"]["status"] == "ok" and man["02-bad"]["status"] == "failed"
    assert (man["01-ok"]["claims_passed"], man["01-ok"]["claims_failed"]) == (1, 1)
    assert man["01-ok"]["claims_failed_ids"] == ["C2"]
    assert {"sources", "versions", "hardware", "seconds", "attempts"} <= set(man["01-ok"])
    rec = json.loads((root / "results" / "01-ok.json").read_text())
    assert rec["mode"] == "quick"
    nb_hash = provenance.notebook_source_hash(ok)  # of the executed notebook, written in place
    assert rec["sources"]["notebook"] == man["01-ok"]["sources"]["notebook"] == nb_hash
    assert man["01-ok"]["sources"]["library"] == rec["sources"]["library"]  # the kernel's, as recorded
    assert rec["sources"]["library"].startswith("sha256:") and rec["sources"]["commit"] is None
    assert man["02-bad"]["sources"]["notebook"] == provenance.notebook_source_hash(bad)  # failed: the runner's
    assert "repro/report.py" in rec["sources"]["library_files"]


def test_a_notebook_past_its_timeout_is_killed(root):
    make_notebook(root, "01-slow", "import os, time\nopen('kernel.pid', 'w').write(str(os.getpid()))\n"
                                   "time.sleep(120)")
    start = time.time()
    [out] = batch.run(root, "quick", timeout=20, progress=False, retries=0)
    assert out.status == "timeout" and out.attempts == 1 and out.retried is None
    assert out.error == "timed out after 20 s (the whole notebook); cell 2 (import os, time) was running"
    assert time.time() - start < 60
    pid = int((root / "notebooks" / "kernel.pid").read_text())
    time.sleep(1)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the kernel died with papermill


HANG = "import time\ntime.sleep(300)"
HANG_ONCE = ("# blocks on the first attempt only\nimport os, time\nif not os.path.exists('tried'):\n"
             "    open('tried', 'w').close()\n    time.sleep(300)")


def test_a_hung_cell_is_reported_by_number_and_retried_once(root):  # on a 2-worker Dask LocalCluster
    ok = make_notebook(root, "01-ok", FINISH)
    once = make_notebook(root, "02-once", HANG_ONCE, FINISH)
    hang = make_notebook(root, "03-hang", "x = 1", HANG, FINISH)
    (root / "results" / "03-hang.json").write_text('{"slug": "03-hang", "old": true}\n')
    hang_before = hang.read_text()
    start = time.time()
    outcomes = batch.run(root, "quick", timeout=120, cell_timeout=3, jobs=2, progress=False)
    assert time.time() - start < 150  # the cell timeout, not the notebook's, stopped the hung runs
    first, second, third = outcomes
    assert (first.status, first.attempts, first.retried) == ("ok", 1, None)
    assert (second.status, second.attempts) == ("ok", 2)  # a hang that does not recur costs one retry
    assert second.retried["status"] == "timeout"
    assert second.retried["error"] == "cell 2 (import os, time) did not finish in 3 s"  # comments skipped
    assert (third.status, third.attempts) == ("timeout", 2)
    assert third.error == third.retried["error"] == "cell 3 (import time) did not finish in 3 s"
    assert third.output == "results/logs/03-hang.quick.failed.ipynb"
    assert hang.read_text() == hang_before
    assert (root / "results" / "03-hang.json").read_text() == '{"slug": "03-hang", "old": true}\n'
    for nb in (ok, once):  # the other notebooks' results are theirs, complete
        rec = json.loads((root / "results" / f"{nb.stem}.json").read_text())
        assert rec["slug"] == nb.stem and [c["id"] for c in rec["claims"]] == ["C1", "C2"]
    man = json.loads((root / "results" / "manifest.json").read_text())["notebooks"]
    assert man["02-once"]["attempts"] == 2 and man["02-once"]["retried"]["status"] == "timeout"
    assert man["03-hang"]["status"] == "timeout" and "did not finish in 3 s" in man["03-hang"]["error"]
    assert "attempt 2; first: cell 2 (import os, time) did not finish in 3 s" in batch.summary(outcomes)


def test_kernels_run_offline(root):
    make_notebook(root, "01-online", "from repro import runtime\nrun = runtime.setup('01-online', MODE, SEED, 'cpu')\n"
                                     "import urllib.request\nurllib.request.urlopen('http://192.0.2.1/', timeout=5)")
    [out] = batch.run(root, "quick", progress=False)
    assert out.status == "failed"
    assert "offline guard: refused a connection to 192.0.2.1:80" in out.error


def test_a_killed_run_leaves_earlier_results_intact(root):
    make_notebook(root, "01-quick", FINISH)
    slow = make_notebook(root, "02-slow", "import time\ntime.sleep(120)", FINISH)
    old_result = '{"slug": "02-slow", "claims": [], "mode": "quick"}\n'
    (root / "results" / "02-slow.json").write_text(old_result)
    (root / "results" / "manifest.json").write_text(json.dumps({"notebooks": {"02-slow": {"status": "ok"}}}))
    slow_before = slow.read_text()
    proc = subprocess.Popen([sys.executable, "-m", "repro", "--root", str(root), "run", "--no-progress"],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 90
    while time.time() < deadline:
        man = json.loads((root / "results" / "manifest.json").read_text())
        if "01-quick" in man["notebooks"]:
            break
        time.sleep(0.5)
    else:
        pytest.fail("the first notebook never finished")
    time.sleep(3)  # the second notebook is running now
    children = psutil.Process(proc.pid).children(recursive=True)  # papermill and its kernel
    assert children
    proc.kill()  # the runner alone, as an OOM killer or `kill -9 PID` would
    proc.wait()
    gone, alive = psutil.wait_procs(children, timeout=20)
    for p in alive:
        p.kill()
    assert not alive, f"still running after the runner died: {[p.cmdline() for p in alive]}"
    assert (root / "results" / "02-slow.json").read_text() == old_result
    assert slow.read_text() == slow_before
    man = json.loads((root / "results" / "manifest.json").read_text())["notebooks"]
    assert man["01-quick"]["status"] == "ok" and man["02-slow"] == {"status": "ok"}
    assert json.loads((root / "results" / "01-quick.json").read_text())["claims"]


def test_bad_mode_fails_at_once_with_the_valid_modes():
    start = time.time()
    out = subprocess.run([sys.executable, "-m", "repro", "run", "--mode", "bogus"], capture_output=True,
                         text=True, cwd=Path(__file__).parents[1])
    assert out.returncode == 2
    assert "unknown MODE 'bogus'" in out.stderr and "'quick'" in out.stderr and "'full'" in out.stderr
    assert time.time() - start < 30


def test_unknown_notebook_number_and_bad_arguments(root):
    make_notebook(root, "05-x", "pass")
    with pytest.raises(ValueError, match="no notebook numbered 07; available: 05"):
        batch.discover(root, ["07"])
    with pytest.raises(ValueError, match="jobs"):
        batch.run(root, "quick", jobs=0, progress=False)
    with pytest.raises(ValueError, match="not both"):
        batch.run(root, "quick", jobs=2, cluster="local:2", progress=False)
    with pytest.raises(ValueError, match="unknown MODE"):
        batch.run(root, "fast", progress=False)
    assert [p.name for p in batch.discover(root, ["5"])] == ["05-x.ipynb"]


def test_exit_status_is_nonzero_when_a_notebook_fails(root):
    make_notebook(root, "01-bad", "1 / 0")
    out = subprocess.run([sys.executable, "-m", "repro", "--root", str(root), "run", "--no-progress"],
                         capture_output=True, text=True)
    assert out.returncode == 1
    assert "ZeroDivisionError" in out.stdout


def test_full_mode_leaves_the_committed_notebook_alone(root):
    nb = make_notebook(root, "01-ok", FINISH)
    before = nb.read_text()
    [out] = batch.run(root, "full", progress=False)
    assert out.status == "ok" and out.output == "results/full/01-ok.ipynb"
    assert nb.read_text() == before
    assert json.loads((root / "results" / "full" / "01-ok.json").read_text())["mode"] == "full"


def _record_many(root: str, prefix: str) -> None:
    man = manifest.Manifest(Path(root))
    for i in range(15):
        man.record(manifest.Outcome(notebook=f"{prefix}-{i:02d}", mode="quick", seed=0, status="ok", seconds=0.0))


def test_two_runs_at_once_keep_each_others_manifest_records(root):
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_record_many, args=(str(root), p)) for p in ("aa", "bb")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    man = json.loads((root / "results" / "manifest.json").read_text())["notebooks"]
    assert len(man) == 30


def test_the_client_fills_in_the_commit_a_scratch_kernel_cannot_see(root, monkeypatch):
    """Kernels run in a scratch folder outside git; the client asks git as a kernel in the checkout would
    (provenance.commit_if_clean, tested in test_provenance) and writes the answer into the results and record."""
    nb = make_notebook(root, "01-ok", FINISH)
    asked = []

    def commit_if_clean(r, notebook, nb_hash, files, package=None):
        asked.append((r, notebook, nb_hash, sorted(files)))
        return "c0ffee"

    monkeypatch.setattr(provenance, "commit_if_clean", commit_if_clean)
    result = tasks.run_task(tasks.make_task(root, nb, "quick"))
    assert json.loads(result.files["results/01-ok.json"])["sources"]["commit"] is None  # as the kernel saw it
    out = tasks.deliver(root, nb, result)
    rec = json.loads((root / "results" / "01-ok.json").read_text())
    assert rec["sources"]["commit"] == out.sources["commit"] == "c0ffee"
    assert asked == [(root, nb, provenance.notebook_source_hash(nb), sorted(rec["sources"]["library_files"]))]
    with pytest.raises(ValueError, match="outside results/"):
        tasks.deliver(root, nb, tasks.TaskResult(out, {"../evil.py": b""}))
