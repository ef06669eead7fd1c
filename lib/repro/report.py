"""The results contract: every notebook ends with ``run.finish(claims, metrics)`` (:func:`finish`).

``finish`` turns the notebook's claims into verdicts, writes ``results/NN-slug.json`` atomically, shows the
paper-vs-reproduced table and raises :class:`ClaimFailed` when a claim marked ``asserted`` does not hold, so
executing a notebook is a test of its claims. A :class:`Claim` is one of two kinds:

* ``kind="paper"``: a statement of the paper. Verdicts: ``Re`` (holds in our setting, which matches the
  paper's), ``~Re`` (holds on a smaller or different analogue: ``analogue=True``, the notebook says what
  differs), ``not Re`` (does not hold at our scale; the ``note`` says why). Never loosened until it passes.
* ``kind="check"``: our implementation against a reference (public code, an exact identity, a round trip).
  Verdicts: ``pass`` / ``fail``. A check is not a reproduction and is counted apart.

``timing=True`` marks a claim whose number depends on the machine (wall time, speed ratios): it is kept in the
JSON with its value and shown with :data:`TIMING_MARK` in the table, which the notebook tests' sanitizer masks.

Every results file records what produced it under ``sources`` (:func:`repro.tools.provenance.sources`): content
hashes of the notebook's source cells and of the library, a hash per library module the notebook used, and the
commit when the checkout holds exactly those sources. ``python -m repro sync --check`` compares them with the
checkout to show stale results.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .tools import paths, provenance

KINDS = ("paper", "check")
VERDICTS = ("Re", "~Re", "not Re")
CHECK_VERDICTS = ("pass", "fail")
TIMING_MARK = "⏱"
RESULTS_ENV = paths.RESULTS_ENV


class ClaimFailed(AssertionError):
    """An asserted claim did not hold; the results file was still written."""


@dataclass
class Claim:
    """One claim, checked against an acceptance interval ``[lo, hi]`` on ``measured``.

    ``paper`` holds only what the paper or its public code says (a number, or words when it states none);
    for a check, the reference we compare against. ``tolerance`` is the human-readable acceptance rule (derived
    from ``lo``/``hi`` when omitted); where a threshold was set after seeing data, ``note`` says so.
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
    kind: str = "paper"
    timing: bool = False
    holds: bool = field(init=False, default=False)
    verdict: str = field(init=False, default="not Re")

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"claim {self.id}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "check" and self.analogue:
            raise ValueError(f"claim {self.id}: a check has no analogue; it passes or fails")
        if self.lo is None and self.hi is None:
            raise ValueError(f"claim {self.id}: give at least one of lo / hi")
        self.measured = float(self.measured)
        if math.isinf(self.measured):
            raise ValueError(f"claim {self.id}: measured is {self.measured} (a ratio over zero?); "
                             "report NaN for a value that could not be measured")
        if not self.tolerance:
            self.tolerance = _interval_text(self.lo, self.hi)
        ok = not math.isnan(self.measured)
        ok = ok and (self.lo is None or self.measured >= self.lo)
        ok = ok and (self.hi is None or self.measured <= self.hi)
        self.holds = bool(ok)
        if self.kind == "check":
            self.verdict = "pass" if ok else "fail"
        else:
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
    if not math.isfinite(float(x)):
        return str(float(x))
    if float(x) == int(x) and abs(x) < 1e6:
        return str(int(x))
    return f"{float(x):.4g}"


def counts(claims: Iterable[Claim | Mapping[str, Any]]) -> dict[str, int]:
    """How many paper claims got each verdict, and how many checks passed / failed."""
    ds = [asdict(c) if isinstance(c, Claim) else c for c in claims]
    out = {v: 0 for v in (*VERDICTS, *CHECK_VERDICTS)}
    for d in ds:
        out[d["verdict"]] += 1
    return out


def finish(
    slug: str,
    *,
    mode: str,
    seed: int,
    claims: list[Claim],
    metrics: Mapping[str, Any] | None = None,
    packages: Iterable[str] = (),
    elapsed: float | None = None,
    display: bool = True,
) -> dict[str, Any]:
    """Write ``results/<slug>.json`` (full mode: ``results/full/<slug>.json``), show the claims table and
    raise :class:`ClaimFailed` if an asserted claim does not hold. Returns the written record.
    Notebooks call it through ``run.finish`` (:class:`repro.runtime.Run`), which fills in everything but the
    claims and metrics."""
    paths.check_mode(mode)
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
        "runtime_s": elapsed,
        "hardware": provenance.hardware(),
        "versions": provenance.versions(packages),
        "sources": provenance.sources(slug),
    }
    out = paths.results_file(slug, mode)
    provenance.write_json_atomic(out, record)
    if display:
        show(claims)
    failed = [c for c in claims if c.asserted and not c.holds]
    if failed:
        lines = "; ".join(f"{c.id}: measured {fmt(c.measured)}, needed {c.tolerance}" for c in failed)
        raise ClaimFailed(f"{len(failed)} asserted claim(s) failed ({lines}); results written to {out}")
    return record


def claims_markdown(claims: Iterable[Claim | Mapping[str, Any]]) -> str:
    """The paper-vs-reproduced table in Markdown (the notebook's last output and the book's results page).
    Timing claims carry :data:`TIMING_MARK` on their value and verdict (machine-dependent)."""
    rows = ["| claim | kind | paper | ours | tolerance | asserted | verdict | note |",
            "|---|---|---|---|---|---|---|---|"]
    timing = False
    for c in claims:
        d = asdict(c) if isinstance(c, Claim) else dict(c)
        mark = f" {TIMING_MARK}" if d.get("timing") else ""
        timing = timing or bool(mark)
        cells = [f"{d['id']}: {d['text']}", d.get("kind", "paper"), fmt(d["paper"]), fmt(d["measured"]) + mark,
                 d["tolerance"], "yes" if d["asserted"] else "reported", f"**{d['verdict']}**{mark}",
                 d.get("note", "")]
        rows.append("| " + " | ".join(str(x).replace("|", "\\|").replace("\n", " ") for x in cells) + " |")
    if timing:
        rows.append(f"\n{TIMING_MARK} machine-dependent (a timing): the value is this run's, kept in the results "
                    "file; the notebook tests do not compare it.")
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
