"""repro.tools.book: the results page's overview (verdict bars counted from the claims) and the README table."""

from __future__ import annotations

import re

from repro.report import Claim
from repro.tools import book


def _record(*claims):
    from dataclasses import asdict

    return {"claims": [asdict(c) for c in claims], "mode": "quick", "seed": 0}


def test_verdict_bar_has_one_block_per_claim_in_verdict_order():
    rec = _record(Claim("C1", "a", paper=1, measured=1, hi=2), Claim("C2", "b", paper=1, measured=3, hi=2),
                  Claim("C3", "c", paper=1, measured=1, hi=2, analogue=True),
                  Claim("C4", "d", paper=1, measured=1, hi=2, analogue=True),
                  Claim("K1", "e", paper="ref", measured=0, hi=0, kind="check"))
    bar = book.verdict_bar(rec)
    segments = re.findall(r'title="(\d+) ([^"]+)" style="[^"]*width:(\d+)px', bar)
    u = book.BAR_UNIT_PX
    assert segments == [("1", "Re", f"{u}"), ("2", "~Re", f"{2 * u}"), ("1", "not Re", f"{u}"), ("1", "pass", f"{u}")]
    assert book.verdict_counts(rec) == "1 Re, 2 ~Re, 1 not Re" and book.check_counts(rec) == "1 of 1 pass"
    assert book.verdict_bar(None) == "" and book.check_counts(_record(Claim("C1", "a", paper=1, measured=1, hi=2))) \
        == "none"


def _figure_notebook():
    import nbformat

    png = {"output_type": "display_data", "data": {"image/png": "iVBOR", "text/plain": "<Figure>"}, "metadata": {}}
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("## Rate in N (checks C1, C3–C5)"),
                nbformat.v4.new_code_cell('fig, ax = plt.subplots()\nrun.savefig(fig, "rate")'),
                nbformat.v4.new_code_cell('run.savefig(fig, "full-only")'),  # shows nothing in quick mode
                nbformat.v4.new_markdown_cell("## Confidence (claim C6)"),
                nbformat.v4.new_code_cell('run.savefig(fig, "confidence")')]
    nb.cells[1].outputs = [nbformat.from_dict(png)]
    nb.cells[4].outputs = [nbformat.from_dict(png)]
    return nb


def test_figures_are_numbered_per_notebook_and_captioned_by_their_section():
    from repro.tools.registry import Paper

    paper = Paper("05", "demo", "Demo", "Theory")
    nb = _figure_notebook()
    figs = book.figures(paper, nb)
    assert [(i, f.label, f.number, f.caption, f.claims) for i, f in figs] == [
        (1, "fig-05-rate", "05.1", "Rate in N (checks C1, C3–C5)", ("C1", "C3", "C4", "C5")),
        (4, "fig-05-confidence", "05.2", "Confidence (claim C6)", ("C6",))]
    assert book._figure_metadata(nb, paper) and not book._figure_metadata(nb, paper)  # idempotent
    assert nb.cells[1].metadata["mystnb"]["figure"] == {"name": "fig-05-rate",
                                                        "caption": "Fig. 05.1 · Rate in N (checks C1, C3–C5)"}
    assert "mystnb" not in nb.cells[2].metadata
    nb.cells[4].outputs = []  # the figure is gone: so is its caption
    assert book._figure_metadata(nb, paper) and "mystnb" not in nb.cells[4].metadata
    links = book._figure_links(paper, nb)[0]
    assert links.startswith("Figures on the page") and "{ref}`Fig. 05.1 <fig-05-rate>` (C1, C3, C4, C5)" in links


def test_the_api_page_lists_every_public_name_and_imports_nothing():
    """book/api.md comes from the source alone (rendering the book needs no torch), one section per paper
    package with every name of its __all__ and where it is defined."""
    import importlib
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = ("import sys\nfor m in ('torch', 'matplotlib', 'scipy', 'pandas'):\n    sys.modules[m] = None\n"
            "from pathlib import Path\nfrom repro.tools.apidoc import render_api_page\n"
            f"print(len(render_api_page(Path({str(root)!r}))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and int(done.stdout) > 10_000, done.stderr[-1500:]
    page = (root / "book" / "api.md").read_text()
    for number, (module, _) in importlib.import_module("repro.papers").INDEX.items():
        assert f"## {number} · `{module}`" in page
        names = getattr(importlib.import_module(module), "__all__", [])
        missing = [n for n in names if f"| `{n}" not in page]
        assert not missing, f"{module}: {missing} not on the API page"
