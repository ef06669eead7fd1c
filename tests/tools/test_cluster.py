"""The runner on Dask distributed (repro.tools.cluster, issue 27), loopback only: a 2-worker cluster writes the
same results, figures, notebooks and manifest records as the sequential runner; a notebook that raises is
recorded failed; a worker killed mid-notebook costs a rerun, not the run; a worker that dies every time is
recorded with the reason; a worker with another library refuses; GPU notebooks go to GPU workers in full mode; a
bad address fails fast; Ctrl-C (on Dask or in the sequential runner) leaves the finished notebooks written, the
manifest valid and no kernel running; the runner imports no Dask (nor torch) without a cluster."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dask
import nbformat
import psutil
import pytest
from distributed import Client, LocalCluster
from fixture_notebooks import make_notebook

from repro.tools import batch, cli, cluster, provenance

FIGURE = ("from repro.tools import paths, registry\nfig = paths.figure_file('{stem}', 'dots')\n"
          "fig.parent.mkdir(parents=True, exist_ok=True)\nfig.write_bytes(bytes(range(256)))\n"
          "PACKAGES = registry.find('{stem}').packages  # as runtime.setup finds them")
FINISH = ("from repro.report import Claim, finish\n"
          "record = finish('{stem}', mode=MODE, seed=SEED, claims=[Claim('C1', 'x', paper=1, measured=1, lo=0, hi=2),\n"
          "       Claim('C2', 'y', paper=1, measured=5, hi=2, asserted=False)])")
# writes where its kernel, papermill and worker run (once: a rerun finds the file), then waits to be killed
ANNOUNCE = ("import json, os, time, psutil\nmarker = {marker!r}\nif not os.path.exists(marker):\n"
            "    papermill = psutil.Process().parent()\n"
            "    pids = dict(kernel=os.getpid(), papermill=papermill.pid, worker=papermill.parent().pid)\n"
            "    json.dump(pids, open(marker + '.tmp', 'w'))\n    os.replace(marker + '.tmp', marker)\n"
            "    time.sleep({sleep})")
SUICIDE = "import os, signal, psutil\nos.kill(psutil.Process().parent().parent().pid, signal.SIGKILL)"
VARIABLE = ("timing", "seconds", "finished", "worker", "hardware")  # may differ between two runs (hardware: below)


@pytest.fixture(autouse=True)
def scratch_in_tmp_path(tmp_path, monkeypatch):
    """Workers, papermill and kernels started by a test make their scratch folders under its ``tmp_path``: a
    worker killed mid-notebook cannot remove its own."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))


def registry(root: Path, papers: dict[str, str]) -> None:
    """A checkout-like root: ``book/papers.yml`` (``"NN-slug": extra fields``) and a ``lib/repro`` folder."""
    lines = ["parts: [Tests]", "papers:"]
    for stem, extra in papers.items():
        lines.append(f'  "{stem[:2]}": {{slug: {stem[3:]}, title: T, part: Tests{extra}}}')
    (root / "book").mkdir(parents=True)
    (root / "book" / "papers.yml").write_text("\n".join(lines) + "\n")
    (root / "lib" / "repro").mkdir(parents=True)


def book(root: Path) -> Path:
    """Two tiny notebooks (one with a figure and a package recorded from the registry) and one that raises
    after saving a figure."""
    (root / "results").mkdir(parents=True)
    registry(root, {"01-ok": "", "02-figure": ", packages: [pyyaml]", "03-raises": ""})
    make_notebook(root, "01-ok", FINISH)
    make_notebook(root, "02-figure", FIGURE, "import os\nprint('drawn', os.environ.get('MALLOC_TRIM_THRESHOLD_'))",
                  FINISH.replace("])", "], packages=PACKAGES)"))  # a nanny's malloc setting would show
    make_notebook(root, "03-raises", FIGURE, "raise ValueError('boom')")
    return root


def manifest(root: Path) -> dict:
    return json.loads((root / "results" / "manifest.json").read_text())["notebooks"]


def unlibrary(record: dict) -> dict:
    """``record`` with its whole-library hash checked and set aside: other work in the same checkout may edit
    some module of ``lib/repro`` between two runs (the modules a notebook used are still compared)."""
    assert record["sources"]["library"].startswith("sha256:")
    return {**record, "sources": {**record["sources"], "library": "sha256:..."}}


def cells(path: Path) -> list:
    nb = nbformat.read(path, as_version=4)
    return [(c.cell_type, c.source, c.get("outputs")) for c in nb.cells]


def listening(pid: int) -> set[int]:
    return {c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def test_a_local_cluster_writes_what_the_sequential_runner_writes(tmp_path):
    seq, dist = book(tmp_path / "seq"), book(tmp_path / "dist")
    raises_before = (dist / "notebooks/03-raises.ipynb").read_bytes()
    by_seq = batch.run(seq, "quick", progress=False)
    by_dist = batch.run(dist, "quick", progress=False, jobs=2)  # = cluster="local:2"
    assert [o.status for o in by_dist] == [o.status for o in by_seq] == ["ok", "ok", "failed"]
    assert by_dist[2].error == by_seq[2].error == "ValueError: boom"  # a notebook that raises: recorded failed
    assert all(o.worker.startswith("tcp://127.0.0.1:") for o in by_dist) and all(o.worker is None for o in by_seq)
    for rel in ("results/01-ok.json", "results/02-figure.json"):
        a, b = (json.loads((r / rel).read_text()) for r in (seq, dist))
        a.pop("runtime_s"), b.pop("runtime_s")
        assert unlibrary(a) == unlibrary(b)  # claims, metrics, versions, hardware, sources (notebook, modules used)
        assert a["claims"]
    assert "pyyaml" in json.loads((dist / "results/02-figure.json").read_text())["versions"]  # from papers.yml
    for rel in ("results/figures/02-figure/dots.png", "results/logs/03-raises.quick.failed/figures/03-raises/dots.png"):
        assert (seq / rel).read_bytes() == (dist / rel).read_bytes() == bytes(range(256))
    for root in (seq, dist):  # a failed run's figures stay with its failed copy, out of results/figures
        assert not (root / "results/figures/03-raises").exists()
    for rel in ("notebooks/01-ok.ipynb", "notebooks/02-figure.ipynb", "results/logs/03-raises.quick.failed.ipynb"):
        assert cells(seq / rel) == cells(dist / rel)  # executed in place (failed: kept in logs/), same outputs
    assert nbformat.read(dist / "notebooks/02-figure.ipynb", as_version=4).metadata.papermill.input_path == \
        "notebooks/02-figure.ipynb"
    assert (dist / "notebooks/03-raises.ipynb").read_bytes() == raises_before  # a failed run leaves it alone
    ms, md = manifest(seq), manifest(dist)
    assert list(ms) == list(md) == ["01-ok", "02-figure", "03-raises"]
    for key in ms:
        assert {k: v for k, v in unlibrary(md[key]).items() if k not in VARIABLE} == \
            {k: v for k, v in unlibrary(ms[key]).items() if k not in VARIABLE}
        # the GPU: the sequential runner asks torch itself; a task reports its kernel's (these import no torch)
        assert {**md[key]["hardware"], "gpu": None} == ms[key]["hardware"]
    assert not list(dist.glob("results/.tmp/*")) and not list(seq.glob("results/.tmp/*"))


def test_a_worker_killed_mid_notebook_has_its_task_rerun(tmp_path):
    root = tmp_path
    (root / "results").mkdir()
    marker = root / "pids.json"
    make_notebook(root, "01-killed", ANNOUNCE.format(marker=str(marker), sleep=120), FINISH)
    make_notebook(root, "02-ok", FINISH)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(batch.run, root, "quick", progress=False, cluster="local:2")
        deadline = time.time() + 120
        while not marker.exists() and time.time() < deadline and not running.done():
            time.sleep(0.2)
        pids = json.loads(marker.read_text())
        ports = listening(pids["worker"])
        os.kill(pids["worker"], signal.SIGKILL)
        killed, ok = running.result(timeout=180)
    assert (killed.status, ok.status) == ("ok", "ok")
    assert int(killed.worker.rsplit(":", 1)[1]) not in ports  # rerun on another worker process
    assert json.loads((root / "results" / "01-killed.json").read_text())["claims"]
    assert manifest(root)["01-killed"]["status"] == "ok"
    for pid in (pids["papermill"], pids["kernel"]):  # the killed worker left no notebook running
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_worker_that_always_dies_is_recorded_with_the_reason(tmp_path):
    (tmp_path / "results").mkdir()
    make_notebook(tmp_path, "01-suicide", SUICIDE, FINISH)
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):  # one rerun (Dask's default: 3)
        [out] = batch.run(tmp_path, "quick", progress=False, cluster="local:1")
    assert out.status == "failed"
    assert out.error.startswith("the worker running it died 2 times (Dask's allowed failures: 1); the last was tcp://")
    assert manifest(tmp_path)["01-suicide"]["error"] == out.error
    assert not (tmp_path / "results" / "01-suicide.json").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def library_copy(tmp_path: Path, edit: str = "") -> Path:
    """A copy of the repro library (``<returned>/repro``), ``edit`` appended to one module: what a worker
    installed from this checkout, or from another commit, imports."""
    lib = tmp_path / "installed"
    shutil.copytree(provenance.library_dir(), lib / "repro", ignore=shutil.ignore_patterns("__pycache__"))
    with open(lib / "repro" / "tools" / "registry.py", "a") as f:
        f.write(edit)
    return lib


@contextlib.contextmanager
def scheduler(*workers: tuple[str, Path, list[str]]) -> Iterator[tuple[str, dict[str, str]]]:
    """A scheduler and `dask worker --nthreads 1` processes (name, library, extra options) importing the given
    library copies; yields the scheduler's address and {worker name: address}."""
    with LocalCluster(n_workers=0, host="127.0.0.1", dashboard_address=None, silence_logs=50) as sched:
        procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", sched.scheduler_address,
                                   "--nthreads", "1", "--no-nanny", "--no-dashboard", "--host", "127.0.0.1",
                                   "--name", name, *extra], env={**os.environ, "PYTHONPATH": str(lib)},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for name, lib, extra in workers]
        try:
            with Client(sched, set_as_default=False) as client:
                client.wait_for_workers(len(workers), timeout=120)
                names = {w["name"]: a for a, w in client.scheduler_info()["workers"].items()}
            yield sched.scheduler_address, names
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()


def test_a_worker_with_another_library_refuses(tmp_path):
    other = library_copy(tmp_path, "# a worker installed from another commit\n")
    root = tmp_path / "book"
    (root / "results").mkdir(parents=True)
    make_notebook(root, "01-ok", FINISH)
    with scheduler(("other", other, [])) as (address, names):
        [out] = batch.run(root, "quick", progress=False, cluster=address)
    assert out.status == "failed" and out.worker is None
    assert out.error.startswith(f"worker {names['other']}: ")
    assert f"refused 01-ok: its repro library ({other / 'repro'}) hashes sha256:" in out.error
    assert "the client's sha256:" in out.error and "install the client's code on every worker" in out.error
    assert manifest(root)["01-ok"]["error"] == out.error
    assert not (root / "results" / "01-ok.json").exists()
    assert "papermill" not in nbformat.read(root / "notebooks" / "01-ok.ipynb", as_version=4).metadata


RUN_FULL = ("import sys\nfrom pathlib import Path\nfrom repro.tools import batch\n"
            "outs = batch.run(Path(sys.argv[1]), 'full', progress=False, cluster=sys.argv[2])\n"
            "print(batch.summary(outs))\nsys.exit(any(o.status != 'ok' for o in outs))")


def test_gpu_notebooks_run_only_on_workers_offering_a_gpu(tmp_path):
    lib = library_copy(tmp_path)  # client and workers: the same code, whatever else changes meanwhile
    root = tmp_path / "book"
    (root / "results").mkdir(parents=True)
    registry(root, {"01-gpu-a": ", gpu: true", "02-gpu-b": ", gpu: true", "03-cpu": ""})
    for stem in ("01-gpu-a", "02-gpu-b", "03-cpu"):
        make_notebook(root, stem, FINISH)
    with scheduler(("gpu", lib, ["--resources", "GPU=1"]), ("cpu", lib, [])) as (address, names):
        out = subprocess.run([sys.executable, "-c", RUN_FULL, str(root), address], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(lib)}, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    man = manifest(root)
    assert man["01-gpu-a (full)"]["worker"] == man["02-gpu-b (full)"]["worker"] == names["gpu"]
    assert man["03-cpu (full)"]["status"] == "ok"
    assert json.loads((root / "results" / "full" / "01-gpu-a.json").read_text())["mode"] == "full"
    assert (root / "results" / "full" / "02-gpu-b.ipynb").exists()


def test_an_unreachable_scheduler_fails_fast_with_a_clear_error(tmp_path):
    make_notebook(tmp_path, "01-ok", FINISH)
    address = f"tcp://127.0.0.1:{_free_port()}"
    start = time.time()
    with pytest.raises(cluster.ClusterError, match=f"no Dask scheduler answered at {address} within 2 s"):
        batch.run(tmp_path, "quick", progress=False, cluster=address, connect_timeout=2)
    assert time.time() - start < 15
    assert not (tmp_path / "results" / "manifest.json").exists()


def test_bad_cluster_arguments_fail_at_once(tmp_path, capsys):
    make_notebook(tmp_path, "01-ok", "pass")
    assert cluster.parse("local:3") == cluster.Spec("local", workers=3)
    assert str(cluster.parse("tcp://gpu-1.lab:08786")) == "tcp://gpu-1.lab:8786"
    for bad in ("local:0", "local:x", "gpu-1:8786", "tcp://gpu-1", "tcp://h:70000", "http://h:8786"):
        with pytest.raises(ValueError, match="--cluster"):
            cluster.parse(bad)
    assert cli.main(["--root", str(tmp_path), "run", "--cluster", "gpu-1:8786"]) == 2
    assert "--cluster takes local:N" in capsys.readouterr().err
    assert cli.main(["--root", str(tmp_path), "run", "--jobs", "2", "--cluster", "local:2"]) == 2
    assert "not both" in capsys.readouterr().err
    assert "distributed" in sys.modules  # this test file imported it; the runner itself only in cluster runs


@pytest.mark.parametrize("jobs", ["1", "2"])  # 1: the sequential runner, without Dask
def test_ctrl_c_leaves_finished_notebooks_written_and_the_manifest_valid(tmp_path, jobs):
    root = tmp_path
    marker = root / "pids.json"
    make_notebook(root, "01-quick", FINISH)
    slow = make_notebook(root, "02-slow", ANNOUNCE.format(marker=str(marker), sleep=300), FINISH)
    (root / "results").mkdir()
    old_result = '{"slug": "02-slow", "claims": [], "mode": "quick"}\n'
    (root / "results" / "02-slow.json").write_text(old_result)
    (root / "results" / "manifest.json").write_text(json.dumps({"notebooks": {"02-slow": {"status": "ok"}}}))
    slow_before = slow.read_text()
    # A terminal's runner has Python's SIGINT handler; a test session started in the background by a shell may
    # hand SIGINT down ignored, so the child installs the handler itself (not a preexec_fn: a fork that runs
    # Python code in a multithreaded process, JAX's after test_tsmcts, can deadlock).
    argv = ["repro", "--root", str(root), "run", "--no-progress", "--jobs", jobs]
    shim = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            f"sys.argv = {argv!r}; runpy.run_module('repro', run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", shim], start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if marker.exists() and "01-quick" in manifest(root):
            break
        time.sleep(0.3)
    else:
        proc.kill()
        pytest.fail(f"the run never got going: {proc.communicate()}")
    pids = json.loads(marker.read_text())
    start = time.time()
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends: the whole foreground group
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # say what was still running, then leave nothing behind
        states = []
        with contextlib.suppress(psutil.Error):
            runner = psutil.Process(proc.pid)
            for q in [runner, *runner.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    states.append((q.pid, q.status(), " ".join(q.cmdline())[:120]))
        for pid in (proc.pid, pids["papermill"], pids["kernel"]):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)
        pytest.fail(f"the runner did not stop within 60 s of SIGINT; still running: {states}")
    assert proc.returncode == 130, err
    assert time.time() - start < 30
    assert "interrupted: the notebooks that finished are written" in err
    man = manifest(root)
    assert man["01-quick"]["status"] == "ok" and man["02-slow"] == {"status": "ok"}
    assert json.loads((root / "results" / "01-quick.json").read_text())["claims"]
    assert (root / "results" / "02-slow.json").read_text() == old_result
    assert slow.read_text() == slow_before
    time.sleep(3)  # the kernel's parent poller checks once a second
    for pid in (pids["papermill"], pids["kernel"]):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_runner_imports_no_dask_without_a_cluster():
    code = ("import sys\nfrom repro.tools import batch, book, cli, cluster\n"
            "print(sorted(m for m in ('dask', 'distributed', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr



def test_kernels_do_not_inherit_the_nanny_environment(monkeypatch):
    """A Dask nanny starts its worker with one thread for OpenMP, MKL and OpenBLAS and with glibc's
    MALLOC_TRIM_THRESHOLD_=65536; a full-mode kernel must not inherit the threads (the sequential runner's keeps
    torch's default threading), and no kernel the malloc setting (it slowed the quick book by 1.4×). A value the
    user set is kept."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as the nanny sets it
    monkeypatch.setenv("MKL_NUM_THREADS", "4")  # set by whoever started the worker: kept
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    assert cluster._nanny_vars("full", nanny=True) == ("MALLOC_TRIM_THRESHOLD_", "OMP_NUM_THREADS")
    assert cluster._nanny_vars("full", nanny=False) == ()  # `dask worker --no-nanny`: its own environment
    assert cluster._nanny_vars("quick", nanny=True) == ("MALLOC_TRIM_THRESHOLD_",)  # one thread: QUICK_ENV
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000000")  # the user's own value: kept
    assert cluster._nanny_vars("quick", nanny=True) == ()
