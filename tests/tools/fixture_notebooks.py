"""Throwaway notebooks for the runner's tests (test_batch, test_cluster): a parameters cell, then the given cells."""

from __future__ import annotations

from pathlib import Path

import nbformat

PARAMS = 'MODE = "quick"\nSEED = 0\nDEVICE = "auto"'


def make_notebook(root: Path, stem: str, *body: str) -> Path:
    """``root/notebooks/<stem>.ipynb``: the parameters cell, then one code cell per ``body`` ("{stem}" filled in)."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(PARAMS)
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, *(nbformat.v4.new_code_cell(b.replace("{stem}", stem)) for b in body)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = root / "notebooks" / f"{stem}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path
