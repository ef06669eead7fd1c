"""The results contract: every notebook ends with :func:`finish`.

``finish`` turns the notebook's claims into verdicts, writes ``results/NN-slug.json`` atomically, shows the
paper-vs-reproduced table and raises :class:`ClaimFailed` when a claim marked ``asserted`` does not hold, so
executing a notebook is a test of its claims. Verdicts:

* ``Re``: the claim holds in our setting, which matches the paper's;
* ``~Re``: it holds on a smaller or different analogue (``Claim(analogue=True)``; the notebook says what differs);
* ``not Re``: it does not hold at our scale (the claim's ``note`` says why). A claim is never loosened until it passes.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from . import runtime

VERDICTS = ("Re", "~Re", "not Re")
RESULTS_ENV = "REPRO_RESULTS_DIR"
_PACKAGES = ("torch", "numpy", "scipy", "pandas", "matplotlib", "icml26-repro")


class ClaimFailed(AssertionError):
    """An asserted claim did not hold; the results file was still written."""


@dataclass
class Claim:
    """One claim of a paper, checked against an acceptance interval ``[lo, hi]`` on ``measured``.

    ``paper`` is the paper's value (a number, or words when the paper states no number); ``tolerance`` is
    the human-readable acceptance rule (derived from ``lo``/``hi`` when omitted).
    """

    id: str
    text: str
    paper: float | str
    measured: float
    lo: float | None = None
    hi: float | None = None
    tolerance: str = ""
    asserted: bool = True
    analogue: bool = False
    note: str = ""
    holds: bool = field(init=False, default=False)
    verdict: str = field(init=False, default="not Re")

    def __post_init__(self) -> None:
        if self.lo is None and self.hi is None:
            raise ValueError(f"claim {self.id}: give at least one of lo / hi")
        self.measured = float(self.measured)
        if not self.tolerance:
            self.tolerance = _interval_text(self.lo, self.hi)
        ok = not math.isnan(self.measured)
        ok = ok and (self.lo is None or self.measured >= self.lo)
        ok = ok and (self.hi is None or self.measured <= self.hi)
        self.holds = bool(ok)
        self.verdict = ("~Re" if self.analogue else "Re") if ok else "not Re"


def _interval_text(lo: float | None, hi: float | None) -> str:
    if lo is None:
        return f"<= {hi:g}"
    if hi is None:
        return f">= {lo:g}"
    return f"[{lo:g}, {hi:g}]"


def fmt(x: Any) -> str:
    """Format a value for the claims table: 4 significant digits, so reruns print the same text."""
    if isinstance(x, str):
        return x
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if float(x) == int(x) and abs(x) < 1e6:
        return str(int(x))
    return f"{float(x):.4g}"


def project_root(start: Path | None = None) -> Path | None:
    """The book's root (the folder holding ``book/papers.yml`` and ``lib/repro``), searching upwards; ``None``
    if this process does not run inside a checkout (e.g. on Colab after a plain pip install)."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "book" / "papers.yml").exists() and (d / "lib" / "repro").is_dir():
            return d
    return None


def results_dir() -> Path:
    """Where results go: ``$REPRO_RESULTS_DIR``, else ``<root>/results``, else ``./results``."""
    if os.environ.get(RESULTS_ENV):
        return Path(os.environ[RESULTS_ENV])
    root = project_root()
    return (root / "results") if root else Path.cwd() / "results"


def write_text_atomic(path: Path, text: str) -> None:
    """Write through a temporary file and ``os.replace``: readers see the old or the new file, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write ``payload`` as indented JSON, atomically (see :func:`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(payload, indent=2, default=_jsonable) + "\n")


def _jsonable(x: Any) -> Any:
    if hasattr(x, "tolist"):  # numpy arrays and scalars, torch tensors
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def git_revision(root: Path | None = None) -> str | None:
    """``git describe``-style revision of the checkout (with ``-dirty``), or ``None`` outside git."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=12"],
            cwd=root or project_root() or Path.cwd(), capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def versions(packages: Iterable[str] = _PACKAGES) -> dict[str, str]:
    """Installed versions of the packages that shape the numbers (and Python)."""
    found = {"python": platform.python_version()}
    for name in packages:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def hardware() -> dict[str, Any]:
    """The machine in a few fields: OS, CPU, core count, torch threads and the GPU if any."""
    info: dict[str, Any] = {
        "platform": platform.platform(terse=True),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch_threads"] = torch.get_num_threads()
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return info


def finish(
    slug: str,
    *,
    mode: str,
    seed: int,
    claims: list[Claim],
    metrics: Mapping[str, Any] | None = None,
    display: bool = True,
) -> dict[str, Any]:
    """Write ``results/<slug>.json`` (full mode: ``results/full/<slug>.json``), show the claims table and
    raise :class:`ClaimFailed` if an asserted claim does not hold. Returns the written record."""
    runtime.check_mode(mode)
    if not claims:
        raise ValueError("finish() needs at least one claim")
    ids = [c.id for c in claims]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate claim ids: {ids}")
    record = {
        "slug": slug,
        "mode": mode,
        "seed": seed,
        "claims": [asdict(c) for c in claims],
        "metrics": dict(metrics or {}),
        "runtime_s": runtime.elapsed(),
        "hardware": hardware(),
        "versions": versions(),
        "git": git_revision(),
    }
    out = results_dir() / ("" if mode == "quick" else mode) / f"{slug}.json"
    write_json_atomic(out, record)
    if display:
        show(claims)
    failed = [c for c in claims if c.asserted and not c.holds]
    if failed:
        lines = "; ".join(f"{c.id}: measured {fmt(c.measured)}, needed {c.tolerance}" for c in failed)
        raise ClaimFailed(f"{len(failed)} asserted claim(s) failed ({lines}); results written to {out}")
    return record


def claims_markdown(claims: list[Claim] | list[dict[str, Any]]) -> str:
    """The paper-vs-reproduced table in Markdown (the notebook's last output and the book's results page)."""
    rows = ["| claim | paper | ours | tolerance | asserted | verdict | note |", "|---|---|---|---|---|---|---|"]
    for c in claims:
        d = asdict(c) if isinstance(c, Claim) else c
        cells = [f"{d['id']}: {d['text']}", fmt(d["paper"]), fmt(d["measured"]), d["tolerance"],
                 "yes" if d["asserted"] else "reported", f"**{d['verdict']}**", d.get("note", "")]
        rows.append("| " + " | ".join(str(x).replace("|", "\\|") for x in cells) + " |")
    return "\n".join(rows)


def show(claims: list[Claim]) -> None:
    """Display the claims table (Markdown in a notebook, plain text elsewhere)."""
    text = claims_markdown(claims)
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display

        if get_ipython() is not None:
            display(Markdown(text))
            return
    except ImportError:
        pass
    print(text)
