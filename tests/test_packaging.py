"""The library as people install it (issue 40): one extra per paper that matches book/papers.yml, paper packages
that import with only their own extra (the harness and baselines load their dependencies on first use, and a
missing one is named with the extra that installs it), and setup cells that install what each notebook imports."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat
import pytest

from repro.tools import book

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
PAPERS = [p for p in book.load_registry(ROOT)[1] if p.module]
NODEPS = set(book.nodeps_wheels(ROOT))
TOOLING = {"book", "test", "all"}  # extras that are not a paper's


def norm(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def names(requirements: list[str]) -> set[str]:
    return {norm(re.split(r"[<>=!~ \[;]", r, maxsplit=1)[0]) for r in requirements}


BASE = names(PYPROJECT["project"]["dependencies"])
OPTIONAL = set().union(*(names(v) for k, v in EXTRAS.items() if k not in TOOLING))
_PROVIDERS = importlib.metadata.packages_distributions()  # top-level module -> the distributions providing it


def import_names(distributions: set[str]) -> set[str]:
    """The top-level modules the installed ``distributions`` provide."""
    return {m for m, ds in _PROVIDERS.items() if m.isidentifier() and any(norm(d) in distributions for d in ds)}


@pytest.mark.parametrize("paper", PAPERS, ids=[p.stem for p in PAPERS])
def test_each_paper_has_an_extra_with_exactly_its_packages(paper):
    extra = book.extra_name(paper)
    assert extra in EXTRAS, f"pyproject.toml has no extra [{extra}] for paper {paper.number}"
    wanted = {norm(p) for p in paper.packages} - BASE - {norm(w) for w in NODEPS}
    assert names(EXTRAS[extra]) == wanted, f"[{extra}] in pyproject.toml and packages: of paper {paper.number}"


def test_the_all_extra_is_every_papers_extra_and_nothing_else():
    assert set(EXTRAS) - TOOLING == {book.extra_name(p) for p in PAPERS}
    assert names(EXTRAS["all"]) == OPTIONAL and "torch" not in OPTIONAL


_PROBE = """
import importlib, json, sys
for name in {blocked!r}:
    sys.modules[name] = None  # what an uninstalled module looks like to import and find_spec
out = {{}}
for package in {packages!r}:
    try:
        module = importlib.import_module(package)
        for name in dir(module):  # the lazy names too: the harness and its baselines
            getattr(module, name)
        out[package] = "ok"
    except ModuleNotFoundError as e:
        out[package] = "missing: " + str(e)
print(json.dumps(out))
"""


def probe(packages: list[str], blocked: set[str]) -> dict[str, str]:
    code = _PROBE.format(blocked=sorted(blocked), packages=packages)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


WITH_EXTRA = [p for p in PAPERS if EXTRAS.get(book.extra_name(p))]  # an empty extra: the next test covers it


@pytest.mark.parametrize("paper", WITH_EXTRA, ids=[p.stem for p in WITH_EXTRA])
def test_a_paper_package_imports_with_only_its_extra(paper):
    """Every other paper's optional dependencies blocked: the package and all its names (harness included) load.
    (A paper with an empty extra must load with every optional dependency blocked: the next test.)"""
    blocked = import_names(OPTIONAL - names(EXTRAS[book.extra_name(paper)]))
    assert probe([paper.module], blocked) == {paper.module: "ok"}


def test_without_any_extra_a_package_imports_or_names_what_is_missing():
    """Every optional dependency blocked: each package (with every lazy name) either loads, or the error names
    one of its own extra's packages and the extra that installs it."""
    got = probe([p.module for p in PAPERS], import_names(OPTIONAL))
    for paper in PAPERS:
        extra = book.extra_name(paper)
        result = got[paper.module]
        if result != "ok":
            own = import_names(names(EXTRAS[extra]))
            assert f'pip install "icml26-repro[{extra}]"' in result and any(f"'{m}'" in result for m in own), result
    assert got["repro.papers.pace"].startswith("missing: repro.papers.pace.experiment needs 'DracoPy'")


def test_the_pace_codec_imports_without_the_pace_extra():
    """The issue's example: the codec needs constriction (a base dependency), not Draco (the harness's peer),
    and importing the package does not load the harness."""
    code = ("import sys\nsys.modules['DracoPy'] = sys.modules['bjontegaard'] = None\n"
            "from repro.papers import pace\n"
            "print(callable(pace.encode) and callable(pace.decode), 'repro.papers.pace.experiment' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["True", "False"], done.stderr[-2000:]


def _notebook_imports(path: Path) -> set[str]:
    """The top-level modules a notebook's code cells import (magics and shell lines skipped)."""
    found: set[str] = set()
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        src = "\n".join(ln for ln in cell.source.splitlines() if not ln.lstrip().startswith(("%", "!")))
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("paper", PAPERS, ids=[p.stem for p in PAPERS])
def test_the_setup_cell_installs_what_the_notebook_imports(paper):
    """Each import of the notebook comes with the standard library, the library itself, its base dependencies,
    the extra the setup cell installs, or the kernel (IPython); and the cell pins the extra to the outputs'
    commit, with the data wheels and assets the paper needs."""
    path = paper.notebook(ROOT)
    library, ref, data, assets = book.install_plan(ROOT, paper)
    extra = book.extra_name(paper)
    provided = import_names(BASE | names(EXTRAS[extra]) | {"ipython", "ipykernel"}) | {"repro"}
    missing = sorted(m for m in _notebook_imports(path) - provided if m not in sys.stdlib_module_names)
    assert not missing, f"{path.name} imports {missing}, which [{extra}] does not install"
    setup = book.setup_source(ROOT, paper)
    assert f"icml26-repro[{extra}] @ git+" in library and json.dumps(ref) in setup and "torch" not in data
    assert all(d in setup for d in data) and all(a in setup for a in assets)
    rec = json.loads(paper.results(ROOT).read_text())
    assert ref == (rec["sources"].get("commit") or book.repository(ROOT)[1])
