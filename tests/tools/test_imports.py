"""The batch runner's modules import downwards only (issue 41 item 3): ``repro.tools.cluster`` never imports
``repro.tools.batch`` (which imports it), so the cycle the two once formed cannot come back. Imports are read with
``ast``, those inside functions included (a lazy import closes a cycle as surely as a top-level one)."""

from __future__ import annotations

import ast
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "lib" / "repro" / "tools"
# lowest first: each may import only the ones before it (and the other tools modules, none of which import these)
RUNNER = ("paths", "launcher", "manifest", "execute", "tasks", "cluster", "batch")


def tools_imports(path: Path) -> set[str]:
    """The ``repro.tools`` modules that ``path`` imports anywhere in its text (relative or absolute)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.level == 1 or (node.module or "").startswith("repro.tools")):
            base = (node.module or "").removeprefix("repro.tools").lstrip(".")  # relative: the module itself
            names = [f"repro.tools.{base}" if base else f"repro.tools.{a.name}" for a in node.names]
        else:
            continue
        found |= {n.split(".")[2] for n in names if n.startswith("repro.tools.") and len(n.split(".")) > 2}
    return found


def test_cluster_does_not_import_batch():
    assert "batch" not in tools_imports(TOOLS / "cluster.py")


def test_the_runner_modules_import_downwards_only():
    for i, name in enumerate(RUNNER):
        upward = tools_imports(TOOLS / f"{name}.py") & set(RUNNER[i:])
        assert not upward, f"repro.tools.{name} imports {sorted(upward)}, which are above it in {RUNNER}"


def test_the_check_sees_lazy_relative_and_absolute_imports(tmp_path):
    source = ("from . import paths, provenance as p\nfrom .manifest import Outcome\nimport repro.tools.execute\n"
              "def f():\n    from .batch import run\n    from repro.tools import tasks\n    import json\n")
    (tmp_path / "m.py").write_text(source)
    assert tools_imports(tmp_path / "m.py") == {"paths", "provenance", "manifest", "execute", "batch", "tasks"}
