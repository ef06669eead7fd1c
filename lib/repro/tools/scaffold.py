"""``python -m repro new NN``: a new paper's notebook skeleton (the house skeleton of every notebook).

Writes ``notebooks/NN-slug.ipynb`` with the generated header and setup cells, the parameters cell, the setup
of the run, and the fixed sections (paper in brief, claims, method, experiments, explorer, paper vs. reproduced,
deviations), each with a short instruction. Refuses to overwrite an existing notebook.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

from .book import HEADER_TAG, SETUP_TAG, header_source, setup_source
from .provenance import write_text_atomic
from .registry import Paper, load_registry


def _md(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(text)


def _tagged(cell: nbformat.NotebookNode, *tags: str) -> nbformat.NotebookNode:
    cell.metadata["tags"] = list(tags)
    return cell


def _code(text: str, *tags: str) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(text)
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def skeleton(root: Path, paper: Paper) -> nbformat.NotebookNode:
    """The notebook every paper starts from (see CONTRIBUTING.md for what goes in each section)."""
    module = paper.module or "repro.papers.<module>"
    alias = module.rsplit(".", 1)[-1]
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.cells = [
        _tagged(_md(header_source(root, paper)), HEADER_TAG),
        _md("## The paper in brief\n\nIn our own words: the problem, the method, what is new "
            "{cite}`key-of-the-paper`.\n\n### Claims under test\n- **C1** ... (quote the paper; say which "
            "claims are asserted, which reported, and, for a planned-asserted claim that failed, \"planned "
            "asserted; did not hold\")."),
        _code(setup_source(root), SETUP_TAG, "hide-input"),
        _code('MODE = "quick"  # "quick": CI scale (<= 120 s on 2 CPU cores); "full": the larger run\n'
              "SEED = 0\n"
              'DEVICE = "auto"  # "auto" picks cuda > mps > cpu', "parameters"),
        _code("import matplotlib.pyplot as plt\nimport numpy as np\n\n"
              f"from repro import plotting, runtime\nfrom {module.rsplit('.', 1)[0]} import {alias}\n"
              "from repro.report import Claim\n\n"
              f'run = runtime.setup("{paper.stem}", MODE, SEED, DEVICE)\n'
              "plotting.use_style()\n"
              "CFG = run.config(quick=dict(n=1000), full=dict(n=100_000))  # full lists only what changes"),
        _md(f"## Method\n\nThe equations, then: *Implemented in `{module}.function`* (every dotted name is checked "
            "to resolve). **Data**: where it comes from (generated / shipped in a PyPI package / committed)."),
        _md("## Experiments\n\nOne section per reproduced figure or table (\"Reproduces Fig. 3\"), with the paper's "
            "values drawn on the same axes (`ax.plot(x, y, **plotting.PAPER)`) where it reports them."),
        _md("## Explorer\n\n`plotting.explorer(draw, frames, **sliders)`: a slider with a live kernel, an "
            "animation in the book."),
        _md("## Paper vs. reproduced\n\n`kind=\"paper\"` claims get Re / ~Re / not Re; `kind=\"check\"` claims "
            "(our code against a reference) pass or fail."),
        _code("# NBVAL_CHECK_OUTPUT\nclaims = [\n"
              '    Claim("C1", "what is measured", paper="what the paper says", measured=0.0, lo=0.0, hi=1.0),\n'
              "]\nrecord = run.finish(claims, metrics={})"),
        _md("## Deviations and scale\n\nWhat quick mode cannot show, what full mode changes, where the data comes "
            "from, every deliberate deviation from the paper."),
    ]
    return nb


def new_notebook(root: Path, number: str) -> Path:
    """Create ``notebooks/NN-slug.ipynb`` for registry entry ``number``; refuse to overwrite."""
    papers = {p.number: p for p in load_registry(root)[1]}
    number = number.zfill(2)
    if number not in papers:
        raise ValueError(f"no paper {number} in book/papers.yml; add its entry first")
    paper = papers[number]
    path = paper.notebook(root)
    if path.exists():
        raise FileExistsError(f"{path.relative_to(root)} exists; not overwriting it")
    nb = skeleton(root, paper)
    write_text_atomic(path, nbformat.writes(nb) + "\n")
    return path
