"""Notebook and book hygiene: every notebook follows the skeleton, is committed executed and clean, has its
results file, and everything generated from book/papers.yml and _config.yml is in sync."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import json
import os
import re
from pathlib import Path

import nbformat
import pytest
import yaml

from repro import evidence, plotting, report
from repro.tools import book, claims, registry

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PAPERS = {p.stem: p for p in book.load_registry(ROOT)[1]}
LEGACY_CLAIMS = set(registry.legacy_claims(ROOT))  # notebooks still on old-style Claim lists (book/papers.yml)


def on_registry(path: Path) -> bool:
    return path.stem[:2] not in LEGACY_CLAIMS


def tags(cell) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


@pytest.fixture(params=NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def nb(request):
    return request.param, nbformat.read(request.param, as_version=4)


def test_there_is_a_notebook():
    assert NOTEBOOKS, "no notebooks found"


def test_the_verdict_box_opens_the_page_and_agrees_with_the_results(nb):
    """Issue 34: the first cell states the paper's headline claim and every paper claim's verdict, as in the
    committed results file, with the counts and a link to the full table."""
    path, notebook = nb
    paper = PAPERS[path.stem]
    rec = json.loads(paper.results(ROOT).read_text())
    header = notebook.cells[0].source
    assert paper.headline and f"**The paper claims:** {paper.headline}" in header
    assert f"paper claims {book.verdict_counts(rec)}; checks of our code {book.check_counts(rec)}." in header
    shown = re.findall(r"\*\*(C[0-9A-Za-z]+) ([^*]+)\*\*(?: \(full mode: \*\*([^*]+)\*\*\))?:", header)
    assert [s[:2] for s in shown] == [(c["id"], c["verdict"]) for c in rec["claims"] if c["verdict"] in report.VERDICTS]
    full = book.full_record(ROOT, paper)  # issue 42: a full-mode verdict that differs is named beside the quick one
    at_full = {c["id"]: c["verdict"] for c in (full or {}).get("claims", [])}
    assert [(cid, f) for cid, _, f in shown if f] == [(cid, at_full[cid]) for cid, v, _ in shown
                                                      if cid in at_full and at_full[cid] != v]
    assert "(#paper-vs-reproduced)" in header and any(
        c.cell_type == "markdown" and "## Paper vs. reproduced" in c.source for c in notebook.cells)


def test_name_is_a_registered_paper(nb):
    path, _ = nb
    assert path.stem in PAPERS, f"{path.name} is not NN-slug of book/papers.yml"


def test_skeleton(nb):
    path, notebook = nb
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    cells = notebook.cells
    assert book.HEADER_TAG in tags(cells[0]) and cells[0].cell_type == "markdown"
    colab = re.search(r"colab\.research\.google\.com/github/[^)]+/blob/[^/]+/(notebooks/[^)]+)\)", cells[0].source)
    assert colab and colab.group(1) == f"notebooks/{path.name}", "the Colab badge must point at this file"
    setup = [c for c in cells if book.SETUP_TAG in tags(c)]
    assert len(setup) == 1 and "hide-input" in tags(setup[0]) and "torch" not in setup[0].source.split("pip")[-1]
    params = [c for c in cells if "parameters" in tags(c)]
    assert len(params) == 1
    assert re.search(r'^MODE = "quick"', params[0].source, re.M)
    assert re.search(r"^SEED = \d+", params[0].source, re.M) and re.search(r"^DEVICE = ", params[0].source, re.M)
    last = [c for c in cells if c.cell_type == "code"][-1]
    finishing = [c for c in cells if c.cell_type == "code" and "finish(" in c.source]
    assert len(finishing) == 1
    assert last is finishing[0] or all(not c.source.strip() for c in cells[cells.index(finishing[0]) + 1:]
                                       if c.cell_type == "code")
    # the claims are compared with the committed results by the contract itself (REPRO_COMPARE_RESULTS: every
    # number on the same kind of CPU, verdicts and intervals on another), not as text; the table is the output
    assert "NBVAL_CHECK_OUTPUT" not in finishing[0].source and "hide-input" in tags(finishing[0])


def test_no_test_markers_or_lint_comments_on_the_page(nb):
    """Issue 34: what a reader sees of a code cell is code: no nbval markers, no ``# noqa`` / ``# type: ignore``
    (the lint configuration in pyproject.toml carries the notebooks' exceptions)."""
    path, notebook = nb
    marked = [i for i, c in enumerate(notebook.cells) if c.cell_type == "code"
              and re.search(r"#\s*(?:noqa|type:\s*ignore|NBVAL_|fmt:)", c.source)]
    assert not marked, f"cells {marked} carry test markers or lint comments"


def test_committed_with_clean_quick_outputs(nb):
    path, notebook = nb
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert any(c.outputs for c in code), "commit notebooks executed (the book renders committed outputs)"
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    injected = [c for c in code if "injected-parameters" in tags(c)]
    assert not injected or 'MODE = "quick"' in injected[0].source, "committed outputs must be quick mode"
    text = path.read_text()  # outputs and metadata: papermill's paths are made relative by the runner
    assert str(ROOT) not in text and "/root/" not in text and "/tmp/" not in text, "no machine paths in the notebook"


def test_results_file(nb):
    path, _ = nb
    rec = json.loads((ROOT / "results" / f"{path.stem}.json").read_text())
    assert rec["slug"] == path.stem and rec["mode"] == "quick"
    asserted = [c for c in rec["claims"] if c["asserted"]]
    if on_registry(path):
        # a registered claim that turned out not to hold is un-asserted only through a revision (marked on the page)
        assert len(asserted) >= 2, "each notebook asserts at least two claims"
        unasserted = [c["id"] for c in rec["claims"] if not c["asserted"] and c["kind"] == "paper"
                      and c["verdict"] not in evidence.HOLDING and not c.get("revisions") and not c.get("note")]
        assert not unasserted, f"reported paper claims that do not hold need a note or a revision: {unasserted}"
    else:
        assert len([c for c in asserted if c.get("kind", "paper") == "paper"]) >= 2, \
            "each notebook asserts at least two paper claims"
    assert all(c["holds"] for c in asserted)
    for c in rec["claims"]:
        kind = c.get("kind", "paper")
        assert c["verdict"] in (report.VERDICTS if kind == "paper" else report.CHECK_VERDICTS)
        assert c["holds"] == (c["verdict"] in evidence.HOLDING)


def _no_constants(name: str) -> None:
    raise ValueError(f"not strict JSON: {name}")


def test_every_results_file_is_strict_json():
    files = sorted((ROOT / "results").glob("*.json"))
    assert files
    for f in files:
        json.loads(f.read_text(), parse_constant=_no_constants)  # NaN / Infinity are not JSON


def test_registry_notebooks_measure_exactly_the_registered_claims(nb):
    """Notebooks on the claims registry: a generated claims list, no old-style Claim, and results that carry the
    registry's words and rules; the others have no registry file yet."""
    path, notebook = nb
    entries = claims.load_for(path.stem)
    if not on_registry(path):
        assert entries is None, f"{path.stem} has a claims registry: remove it from legacy_claims in book/papers.yml"
        return
    assert entries, f"{path.stem}: not in legacy_claims, but lib/repro/claims/{path.stem}.yml is missing"
    assert [c for c in notebook.cells if book.CLAIMS_TAG in tags(c)], "needs the generated claims list"
    code = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
    assert "Claim(" not in code, "measure the registered claims (run.finish({id: measurement})), no Claim lists"
    rec = json.loads((ROOT / "results" / f"{path.stem}.json").read_text())
    assert [c["id"] for c in rec["claims"]] == list(entries)
    for c in rec["claims"]:
        e = entries[c["id"]]
        assert (c["text"], c["paper"], c["rule"], c["kind"], c["asserted"]) == \
            (e.statement, e.paper, e.rule.text, e.kind, e.asserted), f"{c['id']}: results and registry disagree"


# Patterns of a standard error, a t- or bootstrap interval computed by hand: repro.common.stats is the one place.
STATS_PATTERNS = {
    "sample standard deviation": re.compile(r"ddof\s*=\s*1|unbiased\s*=\s*True"),
    "standard error": re.compile(r"(std|sd)\([^()]*(\([^()]*\))?[^()]*\)\s*/\s*(np\.|math\.)?sqrt"),
    "t quantile": re.compile(r"\bt\.ppf\(|\bsem\("),
    "percentile interval": re.compile(r"\(\s*1\s*[-+]\s*level\s*\)\s*/\s*2"),
    "bootstrap resampling": re.compile(r"multinomial\([^)]*np\.full\("),
}


def test_statistics_only_in_the_stats_module():
    hits = []
    for f in sorted((ROOT / "lib" / "repro").rglob("*.py")):
        if f.name == "stats.py" and f.parent.name == "common":
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            hits += [f"{f.relative_to(ROOT)}:{i} ({what})" for what, rx in STATS_PATTERNS.items() if rx.search(line)]
    assert not hits, "compute spreads and intervals with repro.common.stats: " + "; ".join(hits)


def test_generated_files_are_in_sync():
    assert book.out_of_sync(ROOT) == [], "run `python -m repro sync` and commit"


def test_toc_lists_exactly_the_notebooks():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [ch["file"] for part in toc["parts"] for ch in part["chapters"] if ch["file"].startswith("notebooks/")]
    assert sorted(files) == [f"notebooks/{p.stem}" for p in NOTEBOOKS]


def test_config_pins_what_the_design_requires():
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert cfg["execute"]["execute_notebooks"] == "off"
    reqs = (ROOT / "requirements.txt").read_text()
    assert re.search(r"^torch==2\.13\.0$", reqs, re.M)
    assert re.search(r"^jupyter-book==1\.", reqs, re.M)
    assert "torch==" not in (ROOT / "pyproject.toml").read_text()


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci.endswith("-m pytest") and ci in (ROOT / "README.md").read_text()


# ------------------------------------------------------------------ the house rules of the notebook API
# Notebooks not yet moved to the house rules (the architecture issue's refactor); shrinks to nothing.
LEGACY: set[str] = set()
MAX_CELL_LINES = 40
DOTTED = re.compile(r"`(repro(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`")


def house(nb):
    path, notebook = nb
    if path.stem in LEGACY and not os.environ.get("REPRO_CHECK_LEGACY"):
        pytest.skip("not yet on the house rules")
    return path, notebook


def test_code_cells_are_short(nb):
    path, notebook = house(nb)
    legacy_claims_cell = not on_registry(path)  # old-style Claim lists: the fidelity issues shorten them
    long = [(i, len(c.source.splitlines())) for i, c in enumerate(notebook.cells)
            if c.cell_type == "code" and not (legacy_claims_cell and "run.finish(" in c.source)
            and len(c.source.splitlines()) > MAX_CELL_LINES]
    assert not long, f"code cells over {MAX_CELL_LINES} lines (cell, lines): {long}; move the harness to the library"


def test_defs_only_for_drawing(nb):
    path, notebook = house(nb)
    names = [m for c in notebook.cells if c.cell_type == "code"
             for m in re.findall(r"^\s*def (\w+)", c.source, re.M)]
    bad = [n for n in names if not n.startswith(("draw", "plot"))]
    assert not bad, f"functions in a notebook are for drawing only (draw_*/plot_*); move {bad} to the library"


def test_one_run_handle_and_the_one_explorer(nb):
    path, notebook = house(nb)
    code = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
    assert f'runtime.setup("{path.stem}", MODE, SEED, DEVICE)' in code
    assert "run.finish(" in code and "widgets.interact" not in code and "to_jshtml" not in code


def _mode_uses(source: str) -> list[int]:
    """Lines of ``source`` that read the name ``MODE`` other than as an argument of ``runtime.setup``."""
    import ast

    tree = ast.parse(source)
    allowed = {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "runtime.setup"
               for a in n.args}
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "MODE" and id(n) not in allowed]


def test_full_mode_code_is_reached_by_the_smoke_tier(nb):
    """Issue 42: the smoke tier (``MODE = "smoke"``) runs full mode's code path at a tiny size, so a notebook
    branches on ``run.full`` or on its settings (whose switches the smoke tier keeps as full mode sets them,
    ``repro.runtime.smoke_cut``), never on ``MODE``: a ``MODE == "full"`` branch would be skipped by the smoke
    tier and rot unseen. Every notebook with a full mode also declares its smoke tier."""
    path, notebook = nb
    cells = [c for c in notebook.cells if c.cell_type == "code" and not {"parameters", "injected-parameters"}
             & set(tags(c)) and book.SETUP_TAG not in tags(c)]
    reads = [(i, lines) for i, c in enumerate(cells) if (lines := _mode_uses(c.source))]
    assert not reads, f"code cells reading MODE (cell, lines): {reads}; branch on run.full or on a setting"
    code = "\n".join(c.source for c in cells)
    if re.search(r"\bfull\s*=", code):
        assert re.search(r"\bsmoke\s*=\s*dict\(", code), "run.config(...) needs smoke=dict(...): the smoke tier"


def _settings(code: str) -> list[tuple[str, ast.expr]]:
    """Every ``key=value`` of the ``run.config(...)`` call in ``code``, nested ``dict(...)`` settings included."""
    calls = [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call) and ast.unparse(n.func) == "run.config"]
    out = []
    for call in calls:
        todo = [k.value for k in call.keywords]
        while todo:
            node = todo.pop()
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "dict":
                out += [(k.arg, k.value) for k in node.keywords if k.arg]
                todo += [k.value for k in node.keywords]
    return out


def test_settings_follow_the_glossary(nb):
    """Issue 41 item 7 (CONTRIBUTING.md, section 7): a count is ``n_<things>``; ``seeds``, ``layers`` and ``heads``
    are never counts (a list of seeds, of layer indices); ``steps_<part>``, ``tiny_*`` and ``num_*`` are the
    names the glossary replaced."""
    path, notebook = nb
    code = "\n".join(c.source for c in notebook.cells if c.cell_type == "code" and "run.config(" in c.source)
    bad = [f"{k}={ast.unparse(v)}" for k, v in _settings(code)
           if (k in ("seeds", "layers", "heads") and isinstance(v, ast.Constant) and isinstance(v.value, int))
           or re.match(r"(steps_|tiny_|num_)", k)]
    assert not bad, f"{path.name}: settings against the glossary: {bad}"


def test_registry_module_names_the_notebook(nb):
    path, _ = nb
    paper = PAPERS[path.stem]
    assert paper.module, f"book/papers.yml: paper {paper.number} needs module:"
    module = importlib.import_module(paper.module)
    assert f"notebooks/{path.name}" in (module.__doc__ or ""), f"{paper.module}'s docstring must name the notebook"


def test_implemented_in_names_resolve(nb):
    path, notebook = house(nb)
    text = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    names = sorted(set(DOTTED.findall(text)))
    assert names, "the Method section names what implements it: *Implemented in `repro.papers.x.fn`*"
    unresolved = [n for n in names if not _resolves(n)]
    assert not unresolved, f"names that do not resolve: {unresolved}"


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def test_registry_lists_only_modules_and_packages_that_exist():
    for paper in registry.load_registry(ROOT)[1]:
        if paper.notebook(ROOT).exists():
            for pkg in paper.packages:
                assert importlib.metadata.version(pkg), pkg


FIGURE_PENDING = set(registry.figure_policy_pending(ROOT))  # notebooks whose figures predate the policy
_FIGSIZE = re.compile(r"figsize\s*=\s*\(\s*([0-9.]+)")
_FONTSIZE = re.compile(r"\b(?:fontsize|labelsize|titlesize)\s*=\s*([0-9.]+)|[\"']font\.size[\"']\s*:\s*([0-9.]+)")


def test_figures_follow_the_figure_policy(nb):
    """Issue 34: every figure at most 7 in wide with no text below 9 pt, labelled axes and legends off the data
    (repro.plotting.figure_problems, which run.savefig applies to each figure and records in the results file);
    the source holds no wider figsize or smaller font size either. Notebooks listed in figure_policy_pending
    (book/papers.yml) are exempt until their fidelity pass; one that already follows the policy must leave it."""
    path, notebook = nb
    code = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
    wide = [w for w in _FIGSIZE.findall(code) if float(w) > plotting.MAX_WIDTH_IN]
    small = [a or b for a, b in _FONTSIZE.findall(code) if float(a or b) < plotting.MIN_FONT_PT]
    rec = json.loads(PAPERS[path.stem].results(ROOT).read_text())
    problems = {name: p for name, p in rec.get("figures", {}).items() if p}
    follows = not wide and not small and "figures" in rec and not problems
    if path.stem[:2] in FIGURE_PENDING:
        assert not follows, f"{path.stem} follows the figure policy: remove it from figure_policy_pending"
        return
    assert not wide, f"figsize widths {wide} in (at most {plotting.MAX_WIDTH_IN:g} in)"
    assert not small, f"font sizes {small} pt (at least {plotting.MIN_FONT_PT:g} pt)"
    assert "figures" in rec, "the results file predates the figure check: re-run the notebook"
    assert not problems, f"figures that break the policy: {problems}"


# ---------------------------------------------------------------------------------------------------------
# The layers of the library (issue 41): papers never import another paper, the notebook runtime or the tools;
# the tools import no torch when they are loaded (the book renders without it).


def _imports(path: Path, top_level_only: bool = False) -> list[tuple[int, str]]:
    """(level, absolute-or-relative module) of every import in ``path`` (only those run at import time when
    ``top_level_only``: module body, including its if/try blocks, not function bodies)."""
    import ast

    tree = ast.parse(path.read_text())
    nodes = ast.walk(tree) if not top_level_only else _module_level(tree.body)
    out = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out += [(0, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or ""))
            if node.module is None or node.level:  # from . import x / from .. import y: the names are modules
                out += [(node.level, f"{node.module + '.' if node.module else ''}{a.name}") for a in node.names]
    return out


def _module_level(body):
    import ast

    for node in body:
        yield node
        if isinstance(node, ast.If | ast.Try | ast.With):
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, []):
                    yield from _module_level(child.body if isinstance(child, ast.ExceptHandler) else [child])


def layer_violations(lib: Path) -> list[str]:
    """Where ``lib/repro`` breaks its layering: a paper package importing another paper, ``repro.runtime``,
    ``repro.report`` or ``repro.tools``; a ``tools`` module importing torch at import time."""
    bad = []
    papers = lib / "repro" / "papers"
    for path in sorted(papers.glob("*/**/*.py")):
        own = path.relative_to(papers).parts[0]
        depth = len(path.relative_to(papers).parts) - 1  # the level of a relative import that reaches papers/
        for level, module in _imports(path):
            target = module if level == 0 else ("repro.papers." + module if level == depth + 1 else
                                                "repro." + module if level == depth + 2 else f"{own}.{module}")
            parts = target.split(".")
            if parts[:2] == ["repro", "papers"] and len(parts) > 2 and parts[2] not in (own, "lazy_exports",
                                                                                       "require"):
                bad.append(f"{path.relative_to(lib)} imports another paper: {parts[2]}")
            if parts[:2] in (["repro", "runtime"], ["repro", "report"], ["repro", "tools"]):
                bad.append(f"{path.relative_to(lib)} imports {'.'.join(parts[:2])} (papers use repro.common only)")
    for path in sorted((lib / "repro" / "tools").glob("*.py")):
        for _, module in _imports(path, top_level_only=True):
            if module.split(".")[0] == "torch":
                bad.append(f"{path.relative_to(lib)} imports torch when loaded")
    return list(dict.fromkeys(bad))


def test_the_library_keeps_its_layers():
    assert layer_violations(ROOT / "lib") == []


def test_the_layer_check_finds_a_paper_importing_another_and_a_tool_importing_torch(tmp_path):
    for rel, text in {"repro/papers/alpha/__init__.py": "from .method import f\n",
                      "repro/papers/alpha/method.py": "from repro.papers.beta import g\nfrom ..beta.core import h\n",
                      "repro/papers/beta/__init__.py": "from repro.runtime import setup\n",
                      "repro/papers/beta/core.py": "from repro.common import stats\nfrom . import helpers\n",
                      "repro/tools/fine.py": "def f():\n    import torch\n",
                      "repro/tools/heavy.py": "try:\n    import torch\nexcept ImportError:\n    pass\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = layer_violations(tmp_path)
    assert found == ["repro/papers/alpha/method.py imports another paper: beta",
                     "repro/papers/beta/__init__.py imports repro.runtime (papers use repro.common only)",
                     "repro/tools/heavy.py imports torch when loaded"], found


def test_every_tools_module_loads_without_torch():
    """The transitive form of the rule: with torch absent, every repro.tools module imports (what the book
    workflow relies on)."""
    import subprocess
    import sys

    mods = [f"repro.tools.{p.stem}" for p in sorted((ROOT / "lib" / "repro" / "tools").glob("*.py"))
            if p.stem != "__init__"]
    code = "import importlib, sys\nsys.modules['torch'] = None\n" + "".join(
        f"importlib.import_module({m!r})\n" for m in mods)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-1500:]


REPLICATE_CONTEXTS = (ast.List, ast.JoinedStr, ast.FormattedValue, ast.BinOp)  # [SEED, SEED + 1], f"{SEED + 1}"


def seed_offsets(code: str, library: bool = False) -> list[str]:
    """Issue 41 item 5: seeds offset by hand instead of named streams (``run.seed_for(name)`` in a notebook,
    ``repro.common.seeding.derive`` in the library). In a notebook, ``SEED`` may be offset only to list replicate
    seeds: by an index (``SEED + i``, ``SEED + np.arange(n)``), or by a constant inside a list, ``range(...)``,
    an f-string or a longer index expression (``[SEED + 1, SEED + 2]``, ``SEED + 1 + i``); ``SEED * k`` and
    ``seed=SEED + 7`` are offsets. In the library no name ending in ``seed`` is added to or multiplied at all."""
    tree = ast.parse(code)
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def is_seed(node: ast.AST) -> bool:
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        return name.lower().endswith("seed") if library else name == "SEED"

    def replicate(node: ast.BinOp) -> bool:
        other = node.right if is_seed(node.left) else node.left
        spaced = isinstance(other, ast.BinOp) and isinstance(other.op, ast.Mult)  # SEED + 10 * i: a family
        if isinstance(node.op, ast.Add) and not isinstance(other, ast.Constant) and not spaced:
            return True  # an index: SEED + i
        up = parent.get(node)
        in_range = isinstance(up, ast.Call) and isinstance(up.func, ast.Name) and up.func.id == "range"
        return isinstance(node.op, ast.Add) and is_seed(node.left) and (isinstance(up, REPLICATE_CONTEXTS) or in_range)

    return [ast.unparse(node) for node in ast.walk(tree)
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult)
            and (is_seed(node.left) or is_seed(node.right)) and (library or not replicate(node))]


def test_seeds_are_named_streams_in_notebooks(nb):
    path, notebook = nb
    bad = [s for c in notebook.cells if c.cell_type == "code" for s in seed_offsets(c.source)]
    assert not bad, f"{path.name}: seed offsets, use run.seed_for(name) (CONTRIBUTING.md, seeds): {bad}"


def test_seeds_are_named_streams_in_the_library():
    bad = [f"{p.relative_to(ROOT)}: {s}" for p in sorted((ROOT / "lib" / "repro").rglob("*.py"))
           for s in seed_offsets(p.read_text(), library=True)]
    assert not bad, f"seed offsets, use repro.common.seeding.derive(seed, name): {bad}"


def test_the_seed_check_finds_offsets_and_spares_replicate_seeds():
    notebook = ("a = f(seed=SEED + 1)\nb = SEED * 1000 + 7\nc = 10_000 + SEED\n"
                "seeds = [SEED, SEED + 1]\nmore = [SEED + 1 + i for i in range(3)]\nd = g(seed=SEED + s)\n"
                "e = range(SEED + 1, SEED + n)\nprint(f'{SEED + 2}')\nm = h(seed=SEED + 10 * i)\n")
    assert sorted(seed_offsets(notebook)) == ["10000 + SEED", "SEED * 1000", "SEED + 1", "SEED + 10 * i"]
    library = "g.manual_seed(seed + 7919)\nh(cfg.seed + 400 + 1000 * k)\nrng(derive(seed, 'eval'))\nx = n + 1\n"
    assert sorted(seed_offsets(library, library=True)) == ["cfg.seed + 400", "seed + 7919"]
