"""Provenance by content (repro.tools.provenance) and stale results (repro.tools.book.stale_results, sync --check):
hashes ignore outputs and generated cells, do not depend on the machine, and a changed notebook is flagged."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

from repro.tools import book, provenance

LIB = provenance.library_dir()


def notebook(*cells: tuple[str, str, list[str]]) -> dict:
    nb = nbformat.v4.new_notebook()
    made = []
    for kind, src, tags in cells:
        c = nbformat.v4.new_code_cell(src) if kind == "code" else nbformat.v4.new_markdown_cell(src)
        if tags:
            c.metadata["tags"] = tags
        made.append(c)
    nb.cells = made
    return json.loads(nbformat.writes(nb))


BASE = [("markdown", "# header v1", ["book-header"]), ("markdown", "## The paper", []),
        ("code", "pip install", ["setup", "hide-input"]), ("code", 'MODE = "quick"', ["parameters"]),
        ("code", "x = 1\nprint(x)", [])]


def test_notebook_hash_covers_sources_only():
    nb = notebook(*BASE)
    h = provenance.notebook_source_hash(nb)
    assert h.startswith("sha256:") and len(h) == len("sha256:") + 16
    executed = json.loads(json.dumps(nb))
    executed["cells"][4]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "1\n"}]
    executed["cells"][4]["execution_count"] = 7
    executed["cells"][4]["metadata"]["papermill"] = {"duration": 1.5}
    executed["metadata"]["papermill"] = {"input_path": "/somewhere/else.ipynb"}
    executed["cells"][0]["source"] = "# header v2 (regenerated runtime badge)"
    executed["cells"][2]["source"] = "another install line"
    executed["cells"].insert(4, notebook(("code", 'MODE = "full"', ["injected-parameters"]))["cells"][0])
    assert provenance.notebook_source_hash(executed) == h
    crlf = json.loads(json.dumps(nb))
    crlf["cells"][4]["source"] = ["x = 1\r\n", "print(x)"]  # list form, Windows line ends
    assert provenance.notebook_source_hash(crlf) == h
    for i, new in ((4, "x = 2\nprint(x)"), (1, "## The paper, edited"), (3, 'MODE = "full"')):
        edited = json.loads(json.dumps(nb))
        edited["cells"][i]["source"] = new
        assert provenance.notebook_source_hash(edited) != h, f"an edit of cell {i} must change the hash"
    swapped = json.loads(json.dumps(nb))
    swapped["cells"][4]["cell_type"] = "markdown"
    assert provenance.notebook_source_hash(swapped) != h


def test_library_hash_does_not_depend_on_the_machine(tmp_path):
    a, b = tmp_path / "a" / "repro", tmp_path / "deeper" / "b" / "repro"
    shutil.copytree(LIB, a, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(LIB, b, ignore=shutil.ignore_patterns("__pycache__"))
    for f in b.rglob("*.py"):  # another checkout with CRLF line ends and stray bytecode
        f.write_bytes(f.read_bytes().replace(b"\n", b"\r\n"))
    (b / "__pycache__").mkdir(exist_ok=True)
    (b / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (b / "notes.txt").write_text("not a source")
    assert provenance.library_hash(a) == provenance.library_hash(b) == provenance.library_hash()
    assert provenance.library_sources(a)[0].startswith("repro/")
    (a / "tools" / "paths.py").write_text((a / "tools" / "paths.py").read_text() + "\n# edit\n")
    assert provenance.library_hash(a) != provenance.library_hash(b)
    assert provenance.changed_files({"repro/tools/paths.py": provenance.file_hash(b / "tools" / "paths.py"),
                                     "repro/report.py": provenance.file_hash(b / "report.py"),
                                     "repro/gone.py": "sha256:0"}, package=a) == ["repro/gone.py",
                                                                                  "repro/tools/paths.py"]


def test_loaded_library_files_are_the_modules_in_use():
    import repro.report  # noqa: F401

    files = provenance.loaded_library_files()
    assert "repro/report.py" in files and "repro/tools/provenance.py" in files
    assert all(k.startswith("repro/") and v.startswith("sha256:") for k, v in files.items())
    assert provenance.changed_files(files) == []


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


def test_commit_is_recorded_only_when_the_sources_are_committed(tmp_path):
    root = tmp_path / "book"
    pkg = root / "lib" / "repro"
    (pkg / "papers").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "papers" / "x.py").write_text("A = 1\n")
    (pkg / "papers" / "y.py").write_text("B = 1\n")
    nbp = root / "notebooks" / "01-x.ipynb"
    nbp.parent.mkdir()
    nbp.write_text(json.dumps(notebook(*BASE)))
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "c")
    head = _git(root, "rev-parse", "HEAD").strip()
    files = ["repro/__init__.py", "repro/papers/x.py"]

    def commit() -> str | None:
        return provenance.commit_if_clean(root, nbp, provenance.notebook_source_hash(nbp), files, package=pkg)

    assert commit() == head
    executed = json.loads(nbp.read_text())
    executed["cells"][4]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "1\n"}]
    nbp.write_text(json.dumps(executed))  # executing the notebook leaves its sources as committed
    (pkg / "papers" / "y.py").write_text("B = 2\n")  # a module this notebook did not use
    assert commit() == head
    (pkg / "papers" / "x.py").write_text("A = 2\n")
    assert commit() is None
    _git(root, "checkout", "-q", "--", "lib")
    executed["cells"][1]["source"] = "## The paper, edited"
    nbp.write_text(json.dumps(executed))
    assert commit() is None
    assert provenance.commit_if_clean(None, nbp, "sha256:x", files, package=pkg) is None


# ------------------------------------------------------------------------------ stale results in a small book


def make_book(root: Path, stems: list[str]) -> None:
    (root / "book").mkdir(parents=True)
    (root / "_config.yml").write_text("repository:\n  url: https://github.com/o/b\n  branch: main\n")
    (root / "README.md").write_text(f"# b\n\n{book.README_START}\n{book.README_END}\n")
    papers = {s[:2]: {"slug": s[3:], "title": f"Paper {s[:2]}", "part": "P"} for s in stems}
    (root / "book" / "papers.yml").write_text(json.dumps({"parts": ["P"], "papers": papers}))
    (root / "notebooks").mkdir()
    for stem in stems:
        cells = [("markdown", "", ["book-header"]), ("markdown", "## The paper", []),
                 ("code", "", ["setup", "hide-input"]), ("code", 'MODE = "quick"\nSEED = 0', ["parameters"]),
                 ("code", f"from repro.report import Claim, finish\nfinish('{stem}', mode=MODE, seed=SEED, "
                          "claims=[Claim('C1', 'x', paper=1, measured=1, lo=0, hi=2)], display=False)", [])]
        nb = notebook(*cells)
        nb["metadata"]["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        (root / "notebooks" / f"{stem}.ipynb").write_text(json.dumps(nb))


def write_result(root: Path, stem: str, **sources) -> None:
    nb_hash = provenance.notebook_source_hash(root / "notebooks" / f"{stem}.ipynb")
    rec = {"slug": stem, "mode": "quick", "seed": 0, "claims": [],  # no library files: others edit them now
           "sources": {"notebook": nb_hash, "library": "sha256:0", "library_files": {}, "commit": None, **sources}}
    (root / "results").mkdir(exist_ok=True)
    (root / "results" / f"{stem}.json").write_text(json.dumps(rec))


def edit_markdown(root: Path, stem: str, text: str) -> None:
    path = root / "notebooks" / f"{stem}.ipynb"
    nb = json.loads(path.read_text())
    nb["cells"][1]["source"] = text
    path.write_text(json.dumps(nb))


def test_a_changed_notebook_makes_its_result_stale(tmp_path):
    stems = ["01-a", "02-b", "03-c"]
    make_book(tmp_path, stems)
    book.sync(tmp_path)  # generated header and setup cells: not part of the hash
    for s in stems[:2]:
        write_result(tmp_path, s)
    book.sync(tmp_path)
    assert book.out_of_sync(tmp_path) == []
    assert [(s.results, s.reason, s.blocking) for s in book.stale_results(tmp_path)] == [
        ("results/03-c.json", "no results file", False)]
    edit_markdown(tmp_path, "01-a", "## The paper, with a new claim")
    write_result(tmp_path, "02-b", library_files={"repro/tools/no_such_module.py": "sha256:0000000000000000"})
    stale = book.stale_results(tmp_path)
    assert [(s.results, s.reason, s.blocking) for s in stale] == [
        ("results/01-a.json", "notebook changed", True),
        ("results/02-b.json", "library changed: repro/tools/no_such_module.py", False),
        ("results/03-c.json", "no results file", False)]
    assert book.out_of_sync(tmp_path) == ["results/01-a.json (notebook changed)"]
    out = subprocess.run([sys.executable, "-m", "repro", "--root", str(tmp_path), "sync", "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 1
    assert "stale: results/01-a.json (notebook changed)" in out.stdout
    assert "warning: results/02-b.json (library changed: repro/tools/no_such_module.py)" in out.stdout


def test_run_stale_reexecutes_only_the_stale_notebooks(tmp_path):
    make_book(tmp_path, ["01-a", "02-b"])
    book.sync(tmp_path)
    run = [sys.executable, "-m", "repro", "--root", str(tmp_path), "run", "--no-progress"]
    assert subprocess.run(run, capture_output=True, text=True).returncode == 0
    rec = {s: json.loads((tmp_path / "results" / f"{s}.json").read_text()) for s in ("01-a", "02-b")}
    assert rec["01-a"]["sources"]["notebook"] == provenance.notebook_source_hash(
        tmp_path / "notebooks" / "01-a.ipynb")  # executing in place leaves the source hash as recorded
    assert book.stale_results(tmp_path) == []
    out = subprocess.run([*run, "--stale"], capture_output=True, text=True)
    assert out.returncode == 0 and "nothing stale" in out.stdout
    edit_markdown(tmp_path, "02-b", "## The paper, edited")
    before = (tmp_path / "results" / "01-a.json").read_text()
    out = subprocess.run([*run, "--stale"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "02-b" in out.stdout and "01-a" not in out.stdout
    assert (tmp_path / "results" / "01-a.json").read_text() == before
    assert book.stale_results(tmp_path) == []
    man = json.loads((tmp_path / "results" / "manifest.json").read_text())["notebooks"]
    assert man["02-b"]["sources"]["notebook"] == provenance.notebook_source_hash(
        tmp_path / "notebooks" / "02-b.ipynb")
    assert man["02-b"]["sources"] == {k: v for k, v in json.loads(
        (tmp_path / "results" / "02-b.json").read_text())["sources"].items() if k in ("notebook", "library", "commit")}


def test_cpu_identity_is_stable_and_recorded_with_the_hardware():
    a, b = provenance.cpu_identity(), provenance.cpu_identity()
    assert a == b and set(a) == {"cpu", "cpu_flags", "numeric_env"} and all(isinstance(v, str) for v in a.values())
    assert set(a) <= set(provenance.hardware())


def test_an_emulated_other_machine_has_another_numeric_identity(monkeypatch):
    here = provenance.cpu_identity()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "SSE41")
    there = provenance.cpu_identity()
    assert (here["cpu"], here["cpu_flags"]) == (there["cpu"], there["cpu_flags"])
    assert here["numeric_env"] != there["numeric_env"]


def test_a_committed_full_mode_run_is_shown_beside_quick_mode_and_a_changed_verdict_is_named(tmp_path):
    make_book(tmp_path, ["01-a", "02-b"])
    book.sync(tmp_path)
    for stem in ("01-a", "02-b"):
        write_result(tmp_path, stem)
    claim = {"id": "C1", "kind": "paper", "text": "It works.", "paper": '"it works"', "where": "abstract",
             "metric": "gain", "unit": "", "rule": ">= 0", "lo": 0.0, "hi": None, "asserted": False, "analogue": True,
             "timing": False, "evidence": "3 seeds", "measured": 1.0, "interval": [0.5, 1.5], "n": 3, "level": 0.95,
             "control": {"none": "a test"}, "verdict": "~Re"}
    for stem in ("01-a", "02-b"):
        rec = json.loads((tmp_path / "results" / f"{stem}.json").read_text())
        rec["claims"] = [claim]
        (tmp_path / "results" / f"{stem}.json").write_text(json.dumps(rec))
    full = json.loads((tmp_path / "results" / "01-a.json").read_text())
    full.update(mode="full", runtime_s=2160, hardware={"cpu_count": 2, "gpu": None},
                claims=[{**claim, "interval": [-1.0, -0.5], "verdict": "not Re"}])
    (tmp_path / "results" / "full").mkdir()
    (tmp_path / "results" / "full" / "01-a.json").write_text(json.dumps(full))
    book.sync(tmp_path)
    papers = {p.stem: p for p in book.load_registry(tmp_path)[1]}
    box = book.verdict_box(tmp_path, papers["01-a"])
    assert "> **Full mode** (2 CPU cores, 36 min, an uncommitted tree): paper claims 1 not Re" in box
    assert "verdicts that differ from quick mode: **C1** ~Re → **not Re**" in box
    assert "**C1 ~Re** (full mode: **not Re**): It works." in box
    assert "Full mode" not in book.verdict_box(tmp_path, papers["02-b"])  # no full run: nothing claimed
    page = (tmp_path / "book" / "results.md").read_text()
    assert "| 1 verdict differs |" in page and "| — |" in page
    assert page.count("| **C1** ") == 3  # quick tables of both papers, and 01's full-mode table
    readme = (tmp_path / "README.md").read_text()
    assert "The counts are quick mode's" in readme and "Full-mode runs committed: 01 (2 CPU cores, 36 min" in readme
    edit_markdown(tmp_path, "01-a", "## The paper, edited")
    assert "the notebook has changed since" in book.verdict_box(tmp_path, papers["01-a"])


def test_the_readme_lists_full_modes_cost_measured_where_a_run_is_committed(tmp_path):
    """Issue 42 item 3: per notebook, full mode's runtime (a committed run's, else papers.yml's estimate) and
    whether it wants a GPU; a README without the markers keeps working."""
    make_book(tmp_path, ["01-a", "02-b"])
    reg = json.loads((tmp_path / "book" / "papers.yml").read_text())
    reg["papers"]["01"] |= {"full_runtime": "estimated 5 min", "gpu": True}
    (tmp_path / "book" / "papers.yml").write_text(json.dumps(reg))
    book.sync(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text() + f"\n{book.FULL_START}\n{book.FULL_END}\n")
    write_result(tmp_path, "02-b")
    full = json.loads((tmp_path / "results" / "02-b.json").read_text())
    full.update(mode="full", runtime_s=2160, hardware={"cpu_count": 2, "gpu": None})
    (tmp_path / "results" / "full").mkdir()
    (tmp_path / "results" / "full" / "02-b.json").write_text(json.dumps(full))
    book.sync(tmp_path)
    text = readme.read_text()
    assert "| 01 | " in text and "| estimated 5 min | wanted |" in text
    assert "| measured: 2 CPU cores, 36 min, an uncommitted tree | not needed |" in text
