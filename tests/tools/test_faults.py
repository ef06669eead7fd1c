"""Issue 35, nothing a user keeps is lost or silently wrong: the audit's smallest reproductions
(``shared/audits/reliability.md``, D1-D6, D13, D14), each on a scratch copy of the checkout or a throwaway root.

An unreadable manifest, results file or notebook is refused with its name (exit 2) and left as it is, never taken
for missing; bad timeouts and seeds fail at the command line; a failed or killed run leaves the notebook, its
results and figures as they were and keeps the last good manifest record; a full disk gives the run summary and
a clear error; leftovers of dead runs are swept."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from fixture_notebooks import make_notebook

from repro.tools import batch, book, cli, execute, provenance
from repro.tools.manifest import Manifest, Outcome

CHECKOUT = Path(__file__).resolve().parents[2]
LIB = Path(batch.__file__).resolve().parents[2]  # the lib/ of the repro under test, for child processes
FINISH = (
    "from repro.report import Claim, finish\n"
    "finish('{stem}', mode=MODE, seed=SEED, claims=[Claim('C1', 'x', paper=1, measured=1, lo=0, hi=2)])"
)
FIGURE = ("from repro.tools import paths\nfig = paths.figure_file('{stem}', 'dots')\n"
          "fig.parent.mkdir(parents=True, exist_ok=True)\nfig.write_bytes(b'new figure')")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A scratch copy of the book (pages, registry, notebooks, results): never the real results/."""
    root = tmp_path / "book"
    root.mkdir()
    for name in ("README.md", "_config.yml", "_toc.yml", "requirements-nodeps.txt"):  # the last: setup cells
        shutil.copy2(CHECKOUT / name, root / name)
    shutil.copytree(CHECKOUT / "book", root / "book")
    shutil.copytree(CHECKOUT / "notebooks", root / "notebooks")
    (root / "results" / "full").mkdir(parents=True)
    for f in [*(CHECKOUT / "results").glob("*.json"), *(CHECKOUT / "results" / "full").glob("*.json")]:
        shutil.copy2(f, root / f.relative_to(CHECKOUT))  # full/: the committed full-mode runs the pages show
    (root / "lib" / "repro").mkdir(parents=True)
    return root


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "results").mkdir()
    return tmp_path


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "lib" not in p.relative_to(root).parts}


def repro(root: Path, *args: str, capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    """``python -m repro --root ROOT ARGS`` in this process: its exit code, stdout and stderr."""
    try:
        code = cli.main(["--root", str(root), *args])
    except SystemExit as e:  # argparse and --root
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


# ------------------------------------------------------------------------------------------- D1, D5, D6


def test_an_unreadable_manifest_is_refused_by_name_and_kept(checkout, capsys):
    """D1: a merge-conflict line made the manifest read as empty; the next run wrote back 1 of 22 records and sync
    turned 18 README rows into "not yet measured". Now every command refuses with the file's name, before anything
    runs or is written."""
    man = checkout / "results" / "manifest.json"
    man.write_bytes(b"<<<<<<< HEAD\n" + man.read_bytes())
    before = snapshot(checkout)
    for args in (["sync", "--check"], ["sync"], ["run", "--only", "05", "--no-progress"], ["book"]):
        code, _, err = repro(checkout, *args, capsys=capsys)
        assert code == 2, args
        assert "results/manifest.json is not valid JSON (Expecting value: line 1 column 1" in err, err
        assert "nothing overwrites it" in err
    assert snapshot(checkout) == before  # nothing ran, nothing was written, the bad file is kept byte for byte
    with pytest.raises(provenance.UnreadableFile, match="manifest.json"):
        Manifest(checkout).record(Outcome("05-linear-contracts", "quick", 0, "ok", 1.0))
    assert man.read_bytes() == before["results/manifest.json"]
    man.write_text("[]")
    with pytest.raises(provenance.UnreadableFile, match="is not a run manifest"):
        book.manifest(checkout)


def test_a_corrupt_results_file_is_an_error_not_a_missing_one(checkout, capsys):
    """D5: a truncated results JSON read as "no results file" and sync dropped the paper from the results page and
    the README, exit 0."""
    res = checkout / "results" / "05-linear-contracts.json"
    res.write_bytes(res.read_bytes()[:3000])
    before = snapshot(checkout)
    for args in (["sync", "--check"], ["sync"], ["run", "--stale", "--no-progress"]):
        code, _, err = repro(checkout, *args, capsys=capsys)
        assert code == 2, args
        assert "results/05-linear-contracts.json is not valid JSON" in err and "line " in err, err
        assert "python -m repro run --only 05" in err
    assert snapshot(checkout) == before
    res.write_text('{"slug": "05-linear-contracts"}')
    with pytest.raises(provenance.UnreadableFile, match="is not a results record"):
        book.stale_results(checkout)


def test_a_truncated_notebook_is_named_by_run_sync_and_book(checkout, capsys):
    """D6: a truncated notebook crashed run (after recording), sync --check and book with nbformat's NotJSONError,
    which does not name the file."""
    nb = checkout / "notebooks" / "05-linear-contracts.ipynb"
    nb.write_bytes(nb.read_bytes()[:50000])
    before = snapshot(checkout)
    for args in (["sync", "--check"], ["sync"], ["book"], ["run", "--only", "05", "--no-progress"]):
        code, _, err = repro(checkout, *args, capsys=capsys)
        assert code == 2, args
        assert "notebooks/05-linear-contracts.ipynb is not valid JSON" in err and "line " in err, err
        assert "git checkout -- " in err
    assert snapshot(checkout) == before  # not run, not recorded, no page rewritten


def test_the_pristine_copy_is_in_sync(checkout, capsys):
    """The readers change nothing for good files: the scratch copy syncs to itself."""
    before = snapshot(checkout)
    assert book.sync(checkout) == []
    assert snapshot(checkout) == before


# ------------------------------------------------------------------------------------------- D2, D13 arguments


@pytest.mark.parametrize("option, value", [("--timeout", "nan"), ("--timeout", "inf"), ("--timeout", "3e6"),
                                           ("--timeout", "1e12"), ("--cell-timeout", "nan"),
                                           ("--cell-timeout", "inf"), ("--timeout", "-1"), ("--timeout", "abc")])
def test_bad_timeouts_fail_at_the_command_line_naming_the_option(root, option, value):
    """D2: --timeout nan looped for good after the notebook ended; inf and large values crashed with OverflowError;
    --cell-timeout nan said "cannot convert float NaN to integer" without naming the option. (A child process with
    a time limit: the old code hung here.)"""
    make_notebook(root, "01-x", "x = 1")
    out = subprocess.run([sys.executable, "-m", "repro", "--root", str(root), "run", option, value, "--no-progress"],
                         capture_output=True, text=True, timeout=90, env={**os.environ, "PYTHONPATH": str(LIB)})
    assert out.returncode == 2 and f"{option} " in out.stderr and "number of seconds" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not (root / "results" / "manifest.json").exists()


@pytest.mark.parametrize("kwargs", [dict(timeout=float("inf")), dict(timeout=3e6), dict(cell_timeout=float("inf")),
                                    dict(timeout=float("nan")), dict(cell_timeout=0.0)])
def test_the_library_checks_timeouts_before_running(root, kwargs):
    make_notebook(root, "01-x", "x = 1")
    option = "--" + next(iter(kwargs)).replace("_", "-")
    if kwargs.get("timeout") != kwargs.get("timeout"):  # nan: the old code hung in its wait, so ask the checker only
        with pytest.raises(ValueError, match=option):
            execute.check_seconds(option, kwargs["timeout"])
        return
    with pytest.raises(ValueError, match=f"{option} must be a finite number of seconds"):
        batch.run(root, "quick", progress=False, **kwargs)
    assert not (root / "results" / "manifest.json").exists()


def test_a_nan_timeout_cannot_hang_the_wait():
    """D2 at its root: the runner's wait on papermill (execute.wait) with nan computed max(0, nan - t) = 0 and
    never expired; bounded waits now."""
    code = ("import subprocess, sys\nfrom repro.tools import execute\n"
            "p = subprocess.Popen([sys.executable, '-c', 'print(1)'], stdout=subprocess.PIPE, text=True)\n"
            "print(execute.wait(p, float('nan'), None).strip())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(LIB)})
    assert out.returncode == 0 and out.stdout.strip() == "1"


@pytest.mark.parametrize("value", ["-1", str(2**64), "1.5", "True"])
def test_bad_seeds_fail_at_the_command_line(root, capsys, value):
    """D13: --seed -1 was accepted and failed 16 s later inside the kernel (costing the manifest record)."""
    make_notebook(root, "01-x", "x = 1")
    code, _, err = repro(root, "run", "--seed", value, "--no-progress", capsys=capsys)
    assert code == 2 and "--seed must be an integer in [0, 2**64 - 1]" in err
    assert not (root / "results" / "manifest.json").exists()


def test_runtime_seed_rejects_bools_and_overflowing_ints():
    from repro import runtime

    for bad in (True, False, 2**64, -1, 1.0):
        with pytest.raises(ValueError, match="SEED must be a non-negative int"):
            runtime.seed_everything(bad)  # type: ignore[arg-type]
    runtime.seed_everything(2**64 - 1)  # the largest seed torch takes


def test_a_root_that_is_not_a_checkout_exits_2(capsys):
    code, _, err = repro(Path("/nonexistent"), "run", capsys=capsys)
    assert code == 2 and "--root /nonexistent: not the book's checkout" in err


# ------------------------------------------------------------------------------------------- D4


def test_a_failed_run_keeps_the_last_good_record_and_seeds_are_kept_apart(checkout):
    """D4: a failed run replaced the notebook's last ok record, so its README row and badge regressed to "not yet
    measured"; a --seed 3 run replaced the seed-0 record."""
    man = Manifest(checkout)
    stem = "05-linear-contracts"
    good = json.loads((checkout / "results" / "manifest.json").read_text())["notebooks"][stem]
    assert good["status"] == "ok"
    readme = (checkout / "README.md").read_text()
    man.record(Outcome(stem, "quick", 0, "failed", 3.0, error="RuntimeError: probe"))
    man.record(Outcome(stem, "quick", 0, "timeout", 9.0, error="timed out"))
    entry = json.loads((checkout / "results" / "manifest.json").read_text())["notebooks"][stem]
    assert entry["status"] == "timeout" and entry["last_ok"]["finished"] == good["finished"]
    assert {k: v for k, v in entry["last_ok"].items()} == good
    assert book.manifest(checkout)["notebooks"][stem] == good  # what the pages show
    book.sync(checkout)
    assert (checkout / "README.md").read_text() == readme  # no row regressed
    man.record(Outcome(stem, "quick", 3, "ok", 5.0))
    data = json.loads((checkout / "results" / "manifest.json").read_text())["notebooks"]
    assert data[stem]["status"] == "timeout" and data[f"{stem} (quick, seed 3)"]["seconds"] == 5.0
    man.record(Outcome(stem, "quick", 0, "ok", 4.0))
    assert "last_ok" not in json.loads((checkout / "results" / "manifest.json").read_text())["notebooks"][stem]
    assert Manifest.key(stem, "full", 0) == f"{stem} (full)"


# ------------------------------------------------------------------------------------------- D3


def test_a_failed_claim_leaves_results_figures_and_notebook_as_they_were(root):
    """D3 (probe 2.4): the kernel wrote results/NN.json at finish(), so a run whose asserted claim failed left new
    results beside the old notebook and manifest. Now a run's results and figures move in with its notebook, only
    on success; a failure keeps them in results/logs/ for inspection."""
    nb = make_notebook(root, "01-claim", "FAIL = False", FIGURE,
                       FINISH.replace("measured=1", "measured=5 if FAIL else 1"))
    [ok] = batch.run(root, "quick", progress=False)
    assert ok.status == "ok"
    good = {p: (root / p).read_bytes() for p in ("notebooks/01-claim.ipynb", "results/01-claim.json",
                                                 "results/figures/01-claim/dots.png")}
    assert json.loads(good["results/01-claim.json"])["claims"][0]["measured"] == 1
    (root / "notebooks/01-claim.ipynb").write_text(nb.read_text().replace("FAIL = False", "FAIL = True"))
    changed = (root / "notebooks/01-claim.ipynb").read_bytes()
    (root / "results/figures/01-claim/dots.png").write_bytes(b"old figure")
    [failed] = batch.run(root, "quick", progress=False)
    assert failed.status == "failed" and "ClaimFailed" in failed.error
    assert (root / "notebooks/01-claim.ipynb").read_bytes() == changed  # not replaced
    assert (root / "results/01-claim.json").read_bytes() == good["results/01-claim.json"]  # the last good results
    assert (root / "results/figures/01-claim/dots.png").read_bytes() == b"old figure"
    kept = root / "results/logs/01-claim.quick.failed"
    assert json.loads((kept / "01-claim.json").read_text())["claims"][0]["measured"] == 5  # for inspection
    assert (kept / "figures/01-claim/dots.png").read_bytes() == b"new figure"
    assert failed.output == "results/logs/01-claim.quick.failed.ipynb" and (root / failed.output).exists()
    assert failed.claims_failed == 1  # read from the staged results
    assert not list((root / "results/.tmp").iterdir())


def test_a_run_killed_after_finish_leaves_the_old_results(root):
    """D3 (probe 2.2): kill -9 of the runner right after the kernel's finish() left the killed run's results with
    the old notebook and manifest; sync --check did not notice. D14: its leftovers are swept by the next run."""
    nb = make_notebook(root, "01-slow", FINISH, "import time\ntime.sleep(120)")
    old = '{"slug": "01-slow", "claims": [], "mode": "quick"}\n'
    (root / "results" / "01-slow.json").write_text(old)
    before = nb.read_bytes()
    proc = subprocess.Popen([sys.executable, "-m", "repro", "--root", str(root), "run", "--no-progress"],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(LIB)})
    deadline = time.time() + 120
    while not list((root / "results").glob(".tmp/*/01-slow.json")) and time.time() < deadline:
        if (root / "results" / "01-slow.json").read_text() != old:
            break  # the old code: finish() wrote into results/ itself
        time.sleep(0.2)
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.kill()
    proc.wait()
    for p in psutil.wait_procs(children, timeout=20)[1]:
        p.kill()
    assert (root / "results" / "01-slow.json").read_text() == old
    assert nb.read_bytes() == before and not (root / "results" / "manifest.json").exists()
    left = list((root / "results" / ".tmp").iterdir())
    assert left  # the staging folder (and maybe the executed copy) of the killed run
    assert sorted(execute.sweep_tmp(root)) == sorted(left)
    assert not list((root / "results" / ".tmp").iterdir())


# ------------------------------------------------------------------------------------------- D13 disk, D14


def test_a_full_disk_gives_the_summary_and_a_clear_error(root, capsys, monkeypatch):
    """D13 (probes 2.12-2.14): with results/ full, Manifest.record's OSError came out as a raw traceback before
    the run summary. Now the summary of what ran, then the file and the cause; nothing earlier is damaged."""
    make_notebook(root, "01-ok", FINISH)
    make_notebook(root, "02-next", "x = 1")
    real = provenance.write_json_atomic

    def full(path: Path, payload: object) -> None:
        if path.name == "manifest.json":
            raise OSError(28, "No space left on device", str(path))
        real(path, payload)

    monkeypatch.setattr(provenance, "write_json_atomic", full)
    code, out, err = repro(root, "run", "--no-progress", capsys=capsys)
    assert code == 1
    assert "01-ok" in out and "ok" in out  # the summary first
    assert "01-ok: could not write" in err and "manifest.json (No space left on device)" in err
    assert "--only 01,02" in err and "the summary above is what ran" in err and "Traceback" not in err + out
    assert json.loads((root / "results" / "01-ok.json").read_text())["claims"]  # its files are whole


def test_a_read_only_results_folder_is_refused_before_anything_runs(root, capsys, monkeypatch):
    make_notebook(root, "01-ok", FINISH)

    def read_only(*args: object, **kwargs: object) -> None:
        raise OSError(30, "Read-only file system", str(root / "results" / ".tmp"))

    monkeypatch.setattr(batch.tempfile, "NamedTemporaryFile", read_only)
    code, out, err = repro(root, "run", "--no-progress", capsys=capsys)
    assert code == 1 and "cannot write into" in err and "(Read-only file system); nothing was run" in err
    assert not (root / "results" / "manifest.json").exists()


def test_leftovers_of_dead_runs_are_swept_and_live_ones_kept(root):
    """D14: every killed or hung run left results/.tmp/<stem>.<pid>.<tid>.ipynb, never swept."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    tmp = root / "results" / ".tmp"
    tmp.mkdir()
    gone = [tmp / f"05-x.{execute.HOST}.{dead.pid}.1.ipynb", tmp / f"05-x.{dead.pid}.7.ipynb"]
    (tmp / f"05-x.{execute.HOST}.{dead.pid}.1").mkdir()
    gone.append(tmp / f"05-x.{execute.HOST}.{dead.pid}.1")
    kept = [tmp / f"05-x.{execute.HOST}.{os.getpid()}.1.ipynb", tmp / f"05-x.otherhost.{dead.pid}.1.ipynb",
            tmp / "notes.txt"]
    for p in [*gone, *kept]:
        if not p.exists():
            p.write_text("x")
    assert sorted(execute.sweep_tmp(root)) == sorted(gone)
    assert sorted(tmp.iterdir()) == sorted(kept)


# ------------------------------------------------------------------------------------------- one command, a book


def test_a_failed_notebook_keeps_its_page_under_a_warning(checkout):
    """Issue 34 item 5: a failed run leaves the notebook's last good outputs in place (D3); its page then says so
    (the generated header), and the warning goes when a run succeeds again."""
    stem = "05-linear-contracts"
    nb_path = checkout / "notebooks" / f"{stem}.ipynb"
    man = Manifest(checkout)
    man.record(Outcome(stem, "quick", 0, "ok", 28.0))
    book.sync(checkout)
    assert "did not succeed" not in json.dumps(json.loads(nb_path.read_text())["cells"][0])
    before = provenance.notebook_source_hash(nb_path)
    man.record(Outcome(stem, "quick", 0, "failed", 3.0, error="ClaimFailed: C6 `not Re`\nmore lines",
                             output=f"results/logs/{stem}.quick.failed.ipynb"))
    book.sync(checkout)
    header = "".join(json.loads(nb_path.read_text())["cells"][0]["source"])
    assert "did not succeed** (failed" in header and "ClaimFailed: C6 'not Re'" in header
    assert "more lines" not in header and f"results/logs/{stem}.quick.failed.ipynb" in header
    assert "what it wrote" not in header  # the kernel wrote nothing: no folder is named
    assert "last successful run" in header and "28 s on" in header  # the badge keeps the last good runtime
    assert provenance.notebook_source_hash(nb_path) == before  # a generated cell: the results stay current
    man.record(Outcome(stem, "quick", 0, "ok", 27.0))
    book.sync(checkout)
    assert "did not succeed" not in "".join(json.loads(nb_path.read_text())["cells"][0]["source"])


def test_run_with_book_renders_the_book_even_when_a_notebook_fails(root, capsys, monkeypatch):
    """Issue 34 item 5: `run --book` builds the book after a failed notebook and exits 1 at the end."""
    make_notebook(root, "01-bad", "raise RuntimeError('probe')")
    built = []
    monkeypatch.setattr(book, "build", lambda r, strict=True: built.append(r) or 0)
    code, _, err = repro(root, "run", "--book", "--no-progress", capsys=capsys)
    assert code == 1 and built == [root] and "did not succeed (01-bad)" in err
    built.clear()
    code, _, _ = repro(root, "run", "--no-progress", capsys=capsys)
    assert code == 1 and built == []


def test_an_unwritable_build_folder_is_a_clear_error(checkout, capsys):
    """Reliability probe 1.42: `repro book` with an unwritable _build/ printed jupyter-book's raw traceback."""
    (checkout / "_build").write_text("not a folder")
    code, _, err = repro(checkout, "book", capsys=capsys)
    assert code == 2 and "cannot write the book into" in err and "_build" in err and "Traceback" not in err
