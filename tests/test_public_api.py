"""The public surface of the nineteen paper packages is a deliberate decision, not a side effect of a refactor.

``tests/public_api.json`` records, for every package of :data:`repro.papers.INDEX`, each name of its ``__all__``
with the kind of object it is (``type(obj).__name__``) and the module that defines it (``obj.__module__``; the
package itself for a submodule). A name added, removed, or moved to another module fails this test until the
snapshot is regenerated on purpose::

    .venv/bin/python tests/test_public_api.py     # rewrites tests/public_api.json; review and commit its diff

Names the package loads on first use (:func:`repro.papers.lazy_exports`) are imported here, so the test needs
every paper's extra installed (as the rest of the test suite does).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

SNAPSHOT = Path(__file__).with_name("public_api.json")
REGENERATE = "if the change is deliberate, regenerate the snapshot: .venv/bin/python tests/test_public_api.py"


def describe(module: str) -> dict[str, list[str | None]]:
    """``{name: [type name, defining module]}`` for each name of ``module.__all__``, sorted; a constant (a tuple,
    a float, ...) has no defining module (``None``), a submodule is its own."""
    package = importlib.import_module(module)
    out = {}
    for name in sorted(package.__all__):
        obj = getattr(package, name)
        kind = type(obj).__name__
        out[name] = [kind, obj.__name__ if kind == "module" else getattr(obj, "__module__", None)]
    return out


def snapshot() -> dict[str, Any]:
    """The current surface of every paper package, keyed by its dotted name."""
    index = importlib.import_module("repro.papers").INDEX
    return {module: describe(module) for module, _ in sorted(index.values())}


def dumps(snap: dict[str, Any]) -> str:
    """The snapshot as JSON with one line per name, so that its diff reads name by name."""
    blocks = []
    for module, names in snap.items():
        rows = ",\n".join(f"  {json.dumps(n)}: {json.dumps(v)}" for n, v in names.items())
        blocks.append(f" {json.dumps(module)}: {{\n{rows}\n }}")
    return "{\n" + ",\n".join(blocks) + "\n}\n"


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    return json.loads(SNAPSHOT.read_text())


def test_the_snapshot_covers_every_paper_package(recorded):
    index = importlib.import_module("repro.papers").INDEX
    assert sorted(recorded) == sorted(m for m, _ in index.values()), REGENERATE


@pytest.mark.parametrize("module", sorted(m for m, _ in importlib.import_module("repro.papers").INDEX.values()))
def test_the_public_names_are_the_recorded_ones(module, recorded):
    package = importlib.import_module(module)
    names = list(package.__all__)
    assert len(names) == len(set(names)), f"{module}.__all__ repeats {sorted(n for n in names if names.count(n) > 1)}"
    was = recorded.get(module, {})
    added, removed = sorted(set(names) - set(was)), sorted(set(was) - set(names))
    assert not added and not removed, f"{module}: added {added}, removed {removed}; {REGENERATE}"
    now = describe(module)
    moved = {n: (was[n], now[n]) for n in names if was[n] != now[n]}
    assert not moved, f"{module}: kind or defining module changed (recorded, now): {moved}; {REGENERATE}"


@pytest.mark.parametrize("module", sorted(m for m, _ in importlib.import_module("repro.papers").INDEX.values()))
def test_the_api_page_finds_the_same_names_in_the_source(module, recorded):
    """book/api.md reads ``__all__`` from the source without importing (``*method.__all__``, the lazy table): it
    must find every public name the package defines, and no other (a name re-exported from outside the package,
    such as ``knowedit.loglog_slope`` from ``repro.common``, has no row)."""
    from repro.tools.apidoc import public_names

    root = Path(__file__).resolve().parents[1]
    elsewhere = {n for n, (_, where) in recorded[module].items()
                 if where and where.startswith("repro.") and not where.startswith(module)}
    own = set(recorded[module]) - elsewhere
    assert {n.name for n in public_names(root, module)} == own


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
    SNAPSHOT.write_text(dumps(snapshot()))
    print(f"wrote {SNAPSHOT}")
