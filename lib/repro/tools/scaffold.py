"""``python -m repro new NN``: a new paper's notebook skeleton (the house skeleton of every notebook) and its
claims registry.

Writes ``lib/repro/claims/NN-slug.yml`` (one example claim to replace: the claims are registered before the run)
and ``notebooks/NN-slug.ipynb`` with the generated header, claims-list and setup cells, the parameters cell, the
setup of the run, and the fixed sections (paper in brief, method, experiments, explorer, paper vs. reproduced,
deviations), each with a short instruction. Refuses to overwrite an existing notebook or registry.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

from . import claims as claims_registry
from .book import CLAIMS_TAG, HEADER_TAG, SETUP_TAG, claims_source, header_source, setup_source
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
            "{cite}`key-of-the-paper`; what the controls are and why they would fail without the paper's effect."),
        _tagged(_md(claims_source(root, paper) or "### Claims under test"), CLAIMS_TAG),
        _code(setup_source(root, paper), SETUP_TAG, "hide-input"),
        _code('MODE = "quick"  # "quick": CI scale (<= 120 s on 2 CPU cores); "full": the larger run\n'
              "SEED = 0\n"
              'DEVICE = "auto"  # "auto" picks cuda > mps > cpu', "parameters"),
        _code("import matplotlib.pyplot as plt\nimport numpy as np\n\n"
              f"from repro import plotting, runtime\nfrom {module.rsplit('.', 1)[0]} import {alias}\n"
              "from repro.report import Measure\n\n"
              f'run = runtime.setup("{paper.stem}", MODE, SEED, DEVICE)\n'
              "plotting.use_style()\n"
              "CFG = run.config(quick=dict(n=1000), full=dict(n=100_000),  # full lists only what changes\n"
              "                 smoke=dict(n=200))  # the smoke tier: full mode's code path, cut small"),
        _md(f"## Method\n\nThe equations, then: *Implemented in `{module}.function`* (every dotted name is checked "
            "to resolve). **Data**: where it comes from (generated / shipped in a PyPI package / committed)."),
        _md("## Experiments\n\nOne section per reproduced figure or table (\"Reproduces Fig. 3\"), with the paper's "
            "values drawn on the same axes (`ax.plot(x, y, **plotting.PAPER)`) where it reports them."),
        _md("## Explorer\n\n`plotting.explorer(draw, frames, **sliders)`: a slider with a live kernel, an "
            "animation in the book."),
        _md("## Paper vs. reproduced\n\nThe verdicts are computed from the registered rules and the measurements' "
            "intervals: paper claims get Re / ~Re / not Re / inconclusive / untested; checks pass or fail."),
        _code("measured = {\n"
              '    "C1": Measure([0.0, 0.1, 0.2], control=[0.0, 0.0, 0.0]),  # per seed, paired with the control\n'
              "}\nrecord = run.finish(measured, metrics={})", "hide-input"),
        _md("## Deviations and scale\n\nWhat quick mode cannot show, what full mode changes, where the data comes "
            "from, every deliberate deviation from the paper."),
    ]
    return nb


REGISTRY_SKELETON = """\
# {number} · {title}: the claims, registered before the run. Schema: repro.tools.claims and CONTRIBUTING.md.
C1:
  kind: paper
  statement: what we test, in our words
  paper: '"the words or number of the paper, quoted"'
  where: abstract
  metric: what is measured
  unit: points
  rule: ">= 0"
  asserted: true
  analogue: true
  control: {{what: the trivial alternative that must fail without the paper's effect, compare: difference}}
  evidence: {{seeds: 3}}
  revisions: []
"""


def new_notebook(root: Path, number: str) -> Path:
    """Create ``lib/repro/claims/NN-slug.yml`` and ``notebooks/NN-slug.ipynb`` for registry entry ``number``;
    refuse to overwrite either."""
    papers = {p.number: p for p in load_registry(root)[1]}
    number = number.zfill(2)
    if number not in papers:
        raise ValueError(f"no paper {number} in book/papers.yml; add its entry first")
    paper = papers[number]
    path = paper.notebook(root)
    if path.exists():
        raise FileExistsError(f"{path.relative_to(root)} exists; not overwriting it")
    claims_file = root / "lib" / "repro" / "claims" / claims_registry.registry_file(paper.stem).name
    if claims_file.exists():
        raise FileExistsError(f"{claims_file.relative_to(root)} exists; not overwriting it")
    write_text_atomic(claims_file, REGISTRY_SKELETON.format(number=paper.number, title=paper.title))
    nb = skeleton(root, paper)
    write_text_atomic(path, nbformat.writes(nb) + "\n")
    return path
