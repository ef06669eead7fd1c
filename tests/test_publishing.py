"""What a reader expects of a published book's repository: licenses, citation, workflows that validate against
their schemas (check-jsonschema's bundled copies: no network), and links from the README and the book."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from repro.tools import book

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def _validate(schema: str, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", schema, str(path)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.name for p in WORKFLOWS])
def test_workflow_validates(path):
    out = _validate("vendor.github-workflows", path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_schema_check_can_fail(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("name: x\njobs: {}\n")  # no `on:`
    assert _validate("vendor.github-workflows", bad).returncode != 0


def test_citation_validates_and_names_the_repository():
    out = _validate("vendor.citation-file-format", ROOT / "CITATION.cff")
    assert out.returncode == 0, out.stdout + out.stderr
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["repository-code"] == book.repository(ROOT)[0]


def test_workflows_use_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    tests = yaml.safe_load((ROOT / ".github" / "workflows" / "tests.yml").read_text())
    runs = [s.get("run", "") for s in tests["jobs"]["tests"]["steps"]]
    assert "bash .ci/run" in runs  # .ci/run's command is the README's (tests/test_hygiene.py)
    pages = yaml.safe_load((ROOT / ".github" / "workflows" / "book.yml").read_text())
    for step in pages["jobs"]["build"]["steps"]:
        if "run" in step:
            assert step["run"].strip() in readme, f"not a README command: {step['run']}"


def test_licenses_are_linked():
    readme = (ROOT / "README.md").read_text()
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert "CC BY 4.0" in (ROOT / "LICENSE-CONTENT.md").read_text()
    for name in ("LICENSE", "LICENSE-CONTENT.md", "CITATION.cff", "CONTRIBUTING.md"):
        assert (ROOT / name).exists() and f"({name})" in readme, name
    footer = yaml.safe_load((ROOT / "_config.yml").read_text())["html"]["extra_footer"]
    assert "CC BY 4.0" in footer and "MIT" in footer


def test_book_links_results_contributing_and_repository():
    intro = (ROOT / "book" / "intro.md").read_text()
    for target in ("(results.md)", "(contributing.md)", f"<{book.repository(ROOT)[0]}>"):
        assert target in intro, target
    assert "../CONTRIBUTING.md" in (ROOT / "book" / "contributing.md").read_text()
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    assert "book/contributing" in files and "book/results" in files


def test_the_version_agrees_in_pyproject_citation_and_changelog():
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    top = next(ln for ln in (ROOT / "CHANGELOG.md").read_text().splitlines()
               if ln.startswith("## ") and ln != "## Unreleased")  # changes since the release may wait above it
    assert str(cff["version"]) == version and top.startswith(f"## {version} (")
    assert f"({cff['date-released']})" in top
    tags = subprocess.run(["git", "tag", "--list", "v*"], capture_output=True, text=True, cwd=ROOT).stdout.split()
    assert all(re.fullmatch(r"v\d+\.\d+\.\d+", t) for t in tags)  # a release tag names a version ...
    older = [t for t in tags if t != f"v{version}"]
    assert all(_ver(t[1:]) < _ver(version) for t in older), f"tags {older} are not older than {version}"


def _ver(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def test_citation_lists_every_reproduced_paper():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    papers = book.load_registry(ROOT)[1]
    notes = [r["notes"] for r in cff["references"]]
    assert notes == [f"Reproduced in notebooks/{p.stem}.ipynb" for p in papers]
    assert all(r["authors"] and r["title"] for r in cff["references"])


def test_a_wheel_and_an_sdist_build_and_carry_the_claims_registry(tmp_path):
    """The distribution a user installs: the library with its claims registry (package data), no notebooks."""
    import shutil
    import tarfile
    import zipfile

    src = tmp_path / "src"  # a copy: building writes build/ and *.egg-info next to the sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "lib", src / "lib", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    code = ("import sys\nfrom setuptools import build_meta as b\n"
            f"w = b.build_wheel({str(tmp_path)!r}); s = b.build_sdist({str(tmp_path)!r})\nprint('BUILT', w, s)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=src, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    wheel_name, sdist_name = done.stdout.split("BUILT", 1)[1].split()
    wheel = zipfile.ZipFile(tmp_path / wheel_name).namelist()
    assert "repro/claims/05-linear-contracts.yml" in wheel and "repro/papers/pogo/method.py" in wheel
    assert not [n for n in wheel if n.endswith(".ipynb") or n.startswith("tests/")]
    with tarfile.open(tmp_path / sdist_name) as sdist:
        names = sdist.getnames()
    assert any(n.endswith("lib/repro/papers/pace/codec.py") for n in names)
