"""The book's API reference page (``book/api.md``), written by ``python -m repro sync`` from the library's source.

It reads the source with :mod:`ast` and imports nothing, so rendering the book needs neither torch nor any
paper's extra: one section per paper package (its docstring's opening paragraph, its quick-start, the extra that
installs it, and a table of its public names with the first line of each docstring, the names its harness loads
on first use marked), then the shared modules. A name's row says where it is defined, so a reader can open the
source. Sphinx's autodoc would import every package (and torch) at build time; this page does not.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from .registry import Paper, load_registry

SHARED = ("repro.common.stats", "repro.common.train", "repro.common.linalg", "repro.common.numerics",
          "repro.common.nn", "repro.common.timing", "repro.common.hooks", "repro.common.settings",
          "repro.common.assets", "repro.common.seeding", "repro.evidence", "repro.report", "repro.runtime",
          "repro.plotting")
_ROLE = re.compile(r":(?:py:)?(?:mod|func|class|data|meth|attr|obj|exc):`~?([^`]+)`")


@dataclass(frozen=True)
class Name:
    """One public name: where it is defined, what it is, the first line of its docstring, and whether the
    package loads it on first use (``lazy``)."""

    name: str
    module: str
    kind: str
    summary: str
    lazy: bool = False
    signature: str = ""  # "(X, G, lr=…)" for a function or a class's constructor


def _module_file(root: Path, module: str) -> Path:
    base = root / "lib" / Path(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _parse(root: Path, module: str) -> ast.Module:
    return ast.parse(_module_file(root, module).read_text())


def _plain(text: str) -> str:
    """reST roles to Markdown code, so the page needs no Sphinx domain: :func:`~a.b` -> `a.b`."""
    return _ROLE.sub(lambda m: f"`{m.group(1)}`", text).replace("``", "`")


SUMMARY_CHARS = 160


def _first_line(doc: str | None) -> str:
    """A docstring's first sentence, in plain Markdown, at most :data:`SUMMARY_CHARS` characters."""
    para = _plain(" ".join((doc or "").strip().split("\n\n")[0].split()))
    sentence = re.split(r"(?<=[.;])\s+(?=[A-Z(])", para, maxsplit=1)[0]
    return sentence if len(sentence) <= SUMMARY_CHARS else sentence[: SUMMARY_CHARS - 1].rstrip() + "…"


def _signature(args: ast.arguments, skip_self: bool = False) -> str:
    """``(a, b, *, c=…)``: the parameter names, defaults elided (annotations and values are in the source)."""
    positional = [*args.posonlyargs, *args.args][1 if skip_self else 0:]
    n_plain = len(positional) - len(args.defaults)
    parts = [a.arg + ("=…" if i >= n_plain else "") for i, a in enumerate(positional)]
    if args.vararg:
        parts.append(f"*{args.vararg.arg}")
    elif args.kwonlyargs:
        parts.append("*")
    parts += [a.arg + ("" if d is None else "=…") for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    if args.kwarg:
        parts.append(f"**{args.kwarg.arg}")
    return f"({', '.join(parts)})"


def _class_signature(node: ast.ClassDef) -> str:
    init = next((b for b in node.body if isinstance(b, ast.FunctionDef) and b.name == "__init__"), None)
    if init is not None:
        return _signature(init.args, skip_self=True)
    fields = [b.target.id for b in node.body if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name)
              and b.simple]  # a dataclass: its fields
    return f"({', '.join(fields)})" if fields else ""


def _definitions(tree: ast.Module) -> dict[str, tuple[str, str, str]]:
    """Top-level ``def``/``class``/assignments of a module: name -> (kind, first docstring line, signature)."""
    out: dict[str, tuple[str, str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out[node.name] = ("function", _first_line(ast.get_docstring(node)), _signature(node.args))
        elif isinstance(node, ast.ClassDef):
            out[node.name] = ("class", _first_line(ast.get_docstring(node)), _class_signature(node))
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    out.setdefault(t.id, ("constant", "", ""))
    return out


def _assigned(tree: ast.Module, name: str) -> ast.expr | None:
    """The value of a module-level ``name = ...`` (or ``name: T = ...``), if there is one."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == name for t in node.targets):
            return node.value
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == name:
            return node.value
    return None


def _strings(root: Path, module: str, tree: ast.Module, node: ast.expr | None) -> list[str]:
    """The names a module-level expression lists, read from the source: string literals in a list or tuple,
    ``*sub.__all__`` (the ``__all__`` of the package's submodule ``sub``), ``*NAME`` (a module-level list, or a
    dict's keys) and ``*NAME["key"]`` (one of the dict's lists)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.List | ast.Tuple):
        return [s for e in node.elts for s in _strings(root, module, tree, e)]
    if isinstance(node, ast.Starred):
        return _strings(root, module, tree, node.value)
    if isinstance(node, ast.Dict):
        return [s for k in node.keys for s in _strings(root, module, tree, k)]
    if isinstance(node, ast.Name):
        return _strings(root, module, tree, _assigned(tree, node.id))
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and isinstance(node.slice, ast.Constant):
        table = _assigned(tree, node.value.id)
        if isinstance(table, ast.Dict):
            values = {getattr(k, "value", None): v for k, v in zip(table.keys, table.values, strict=True)}
            return _strings(root, module, tree, values.get(node.slice.value))
    if isinstance(node, ast.Attribute) and node.attr == "__all__" and isinstance(node.value, ast.Name):
        sub = f"{module}.{node.value.id}"
        return _exports(root, sub, _parse(root, sub))
    return []


def _lazy_table(root: Path, module: str, tree: ast.Module) -> dict[str, str]:
    """The names a package's ``lazy_exports(__name__, globals(), {...})`` call loads on first use -> submodule
    (the table may be a module-level dict passed by name)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "lazy_exports" and len(node.args) == 3:
            table = node.args[2]
            if isinstance(table, ast.Name):
                table = _assigned(tree, table.id)
            if not isinstance(table, ast.Dict):
                continue
            for key, value in zip(table.keys, table.values, strict=True):
                if isinstance(key, ast.Constant):
                    out.update({n: key.value for n in _strings(root, module, tree, value)})
                    out[key.value] = key.value  # the submodule itself is reachable too
    return out


def _exports(root: Path, module: str, tree: ast.Module) -> list[str]:
    """A module's ``__all__`` (see :func:`_strings` for the forms it may take), or ``[]``."""
    return _strings(root, module, tree, _assigned(tree, "__all__"))


def public_names(root: Path, package: str) -> list[Name]:
    """The public names of ``package`` (its ``__all__``, sorted; for a plain module its top-level definitions, in
    order), each traced to the submodule that defines it."""
    tree = _parse(root, package)
    exported = _exports(root, package, tree)
    if not _module_file(root, package).name == "__init__.py":
        defs = _definitions(tree)
        return [Name(n, package, defs[n][0], defs[n][1], False, defs[n][2])
                for n in (exported or [n for n in defs if not n.startswith("_")]) if n in defs]
    where: dict[str, str] = {}
    submodules: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            names = [a.asname or a.name for a in node.names]
            if names == ["*"]:  # from .method import *: the submodule's __all__
                sub = f"{package}.{node.module}"
                names = _exports(root, sub, _parse(root, sub))
            where.update({n: node.module for n in names})
        elif isinstance(node, ast.ImportFrom) and node.level == 1:  # from . import experiment
            submodules |= {a.name for a in node.names}
    lazy = _lazy_table(root, package, tree)
    where.update(lazy)
    out = []
    submodules |= {sub for name, sub in lazy.items() if name == sub}
    for n in sorted(exported):  # __all__ is assembled from the submodules': the page lists it alphabetically
        if n in submodules:
            doc = ast.get_docstring(_parse(root, f"{package}.{n}"))
            out.append(Name(n, f"{package}.{n}", "module", _first_line(doc)))
            continue
        sub = where.get(n)
        if sub is None:
            continue
        module = f"{package}.{sub}"
        kind, summary, sig = _definitions(_parse(root, module)).get(n, ("name", "", ""))
        out.append(Name(n, module, kind, summary, n in lazy, sig))
    return out


def _doc_parts(root: Path, module: str) -> tuple[str, str]:
    """A module docstring's opening paragraph and its quick-start code (empty if it has none)."""
    doc = ast.get_docstring(_parse(root, module)) or ""
    opening = _plain(" ".join(doc.split("\n\n")[0].split()))
    lines = doc.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip().lower().startswith("quick start")), None)
    if start is None:
        return opening, ""
    code: list[str] = []
    for ln in lines[start + 1:]:  # the doctest block: from its first line to the next blank line
        if not ln.strip():
            if code:
                break
            continue
        code.append(ln)
    return opening, textwrap.dedent("\n".join(code)).strip()


def _table(names: list[Name]) -> list[str]:
    """Two columns, so the summaries get the width: the name with its kind and defining submodule, the summary."""
    rows = ["| name | what it is |", "|:--|:--|"]
    for n in names:
        lazy = ", loaded on first use" if n.lazy else ""
        summary = n.summary.replace("|", "\\|") or "&nbsp;"
        where = f"<small>{n.kind} in `{n.module.rsplit('.', 1)[-1]}`{lazy}</small>"
        rows.append(f"| `{n.name}{n.signature}`<br>{where} | {summary} |")
    return rows


def _paper_section(root: Path, paper: Paper) -> list[str]:
    assert paper.module is not None
    opening, quick = _doc_parts(root, paper.module)
    extra = paper.module.rsplit(".", 1)[-1]
    lines = [f"## {paper.number} · `{paper.module}`", "",
             f"{opening} Notebook: [{paper.number} · {paper.title}](../notebooks/{paper.stem}.ipynb). "
             f"Install: `pip install \"icml26-repro[{extra}]\"`.", ""]
    if quick:
        lines += ["```python", quick, "```", ""]
    names = public_names(root, paper.module)
    core = [n for n in names if not n.module.endswith(".experiment")]
    harness = [n for n in names if n.module.endswith(".experiment")]
    if core:
        lines += ["The method and its problems:", "", *_table(core), ""]
    if harness:
        lines += ["The notebook's harness (experiments at the notebook's settings):", "", *_table(harness), ""]
    return lines


def render_api_page(root: Path) -> str:
    """``book/api.md``: every paper package, then the shared modules (:data:`SHARED`)."""
    from .book import GENERATED

    papers = [p for p in load_registry(root)[1] if p.module and _module_file(root, p.module).exists()]
    lines = ["# The library: API reference", "", f"<!-- {GENERATED} -->", "",
             "Each paper's algorithm core is one package of `repro.papers` (the index: `repro.papers.INDEX`); "
             "the shared statistics, training loop, claims contract, notebook runtime and plotting live beside "
             "them. Each name shows its parameters (defaults elided) and the submodule that defines it; its "
             "docstring (`help(...)`, or the source) has the rest. Names *loaded on first use* belong to the "
             "notebook's harness or baselines and import their own dependencies only when used. Quick-starts "
             "run as written (they are tested as doctests).", ""]
    for paper in papers:
        lines += _paper_section(root, paper)
    lines += ["## Shared modules", ""]
    for module in SHARED:
        if _module_file(root, module).exists():
            opening, _ = _doc_parts(root, module)
            lines += [f"### `{module}`", "", opening, "", *_table(public_names(root, module)), ""]
    return "\n".join(lines)
