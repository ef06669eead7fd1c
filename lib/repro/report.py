"""The results contract: every notebook ends with ``run.finish(measured, metrics)`` (:func:`finish`).

``finish`` turns the notebook's measurements into verdicts, writes ``results/NN-slug.json`` atomically (strict
JSON: a NaN is written as ``null``), shows the paper-vs-reproduced table and raises :class:`ClaimFailed` when a
claim marked ``asserted`` does not hold in quick mode, so executing a notebook is a test of its claims (full mode
records and names such a claim instead: a verdict at scale is a result, shown beside quick mode's).

**On the claims registry** (the contract): the claims are registered before the run in
``lib/repro/claims/NN-slug.yml`` (:mod:`repro.tools.claims`), and the notebook passes ``{claim id: measurement}``
(:class:`repro.evidence.Measure`: a number, per-seed values or per-item values, and the control's). The verdict is
computed from the measurement's interval (:mod:`repro.evidence`): paper claims are ``Re``, ``~Re``, ``not Re``,
``inconclusive`` or ``untested``; checks ``pass`` or ``fail``. A claim measured but not registered, or registered
but not measured, is an error naming both lists. With ``$REPRO_COMPARE_RESULTS`` set to a results folder (the
tests set it to the committed ``results/``), a quick-mode run is compared with the committed record there
(:func:`repro.evidence.differences`): on the same kind of CPU (:func:`repro.tools.provenance.cpu_identity`) every
number must be equal; on another, the same ids and verdicts, and every registered value inside its committed
interval (only the verdicts for a notebook marked ``numerics: verdicts`` in ``book/papers.yml`` and for old-style
claims, which have no interval). A difference raises :class:`ResultsChanged`.

**Old style** (the notebooks listed under ``legacy_claims`` in ``book/papers.yml``, until they move onto the
registry): a list of :class:`Claim`, each one point checked against an acceptance interval. A :class:`Claim` is
one of two kinds:

* ``kind="paper"``: a statement of the paper. Verdicts: ``Re`` (holds in our setting, which matches the
  paper's), ``~Re`` (holds on a smaller or different analogue: ``analogue=True``, the notebook says what
  differs), ``not Re`` (does not hold at our scale; the ``note`` says why). Never loosened until it passes.
* ``kind="check"``: our implementation against a reference (public code, an exact identity, a round trip).
  Verdicts: ``pass`` / ``fail``. A check is not a reproduction and is counted apart.

``timing=True`` marks a claim whose number depends on the machine (wall time, speed ratios): it is kept in the
JSON with its value and shown with :data:`TIMING_MARK` in the table; the notebook tests never compare it.

Every results file records what produced it under ``sources`` (:func:`repro.tools.provenance.sources`): content
hashes of the notebook's source cells and of the library, a hash per library module the notebook used, and the
commit when the checkout holds exactly those sources. ``python -m repro sync --check`` compares them with the
checkout to show stale results.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import evidence
from .evidence import Measure
from .tools import claims as registry
from .tools import paths, provenance
from .tools import registry as paper_registry

__all__ = ["Claim", "ClaimFailed", "Measure", "ResultsChanged", "claims_markdown", "counts", "finish", "fmt"]

KINDS = ("paper", "check")
VERDICTS = evidence.PAPER_VERDICTS  # Re, ~Re, not Re, inconclusive, untested (old-style claims: the first three)
CHECK_VERDICTS = evidence.CHECK_VERDICTS
# One colour per verdict, the same in every table and bar of the book (the overview's stacked bars, the verdict
# box, the claims tables).
VERDICT_COLORS = {"Re": "#1b6ca8", "~Re": "#66a182", "not Re": "#d1495b", "inconclusive": "#edae49",
                  "untested": "#ffffff", "pass": "#bbbbbb", "fail": "#2e4057"}
TIMING_MARK = "(timing)"  # old-style tables, in words so that it renders with any font (issue 34)
RESULTS_ENV = paths.RESULTS_ENV
COMPARE_ENV = "REPRO_COMPARE_RESULTS"


class ClaimFailed(AssertionError):
    """An asserted claim did not hold; the results file was still written."""


class ResultsChanged(AssertionError):
    """A quick-mode run differs from the committed results in what must hold on any machine (ids, verdicts, a
    value outside its committed interval)."""


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
        for name in ("lo", "hi"):
            bound = getattr(self, name)
            if bound is not None and (_not_a_number(bound) or math.isnan(float(bound))):
                raise ValueError(f"claim {self.id}: {name} must be a number (or inf), got {bound!r}")
        if self.lo is not None and self.hi is not None and self.lo > self.hi:
            raise ValueError(f"claim {self.id}: lo = {self.lo!r} lies above hi = {self.hi!r}; no value could hold")
        if _not_a_number(self.measured):
            raise TypeError(f"claim {self.id}: measured must be a real number, got {type(self.measured).__name__} "
                            f"{self.measured!r}")
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


def _not_a_number(x: Any) -> bool:
    """True for what a claim must not take as a number: text, bools, arrays, ``None`` (NumPy scalars are fine)."""
    import numbers

    return isinstance(x, str | bytes | bool) or type(x).__name__ == "bool_" or not isinstance(x, numbers.Real)


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
    claims: list[Claim] | Mapping[str, Any],
    metrics: Mapping[str, Any] | None = None,
    packages: Iterable[str] = (),
    elapsed: float | None = None,
    display: bool = True,
    registry_entries: Mapping[str, registry.Entry] | None = None,
    figures: Mapping[str, list[str]] | None = None,
    config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``results/<slug>.json`` (full mode: ``results/full/<slug>.json``; the smoke tier
    ``results/smoke/<slug>.json``), show the claims table and raise :class:`ClaimFailed` if an asserted claim does
    not hold. Quick mode only: the smoke tier's sizes are too small for evidence, and in full mode a claim that
    does not hold at scale is the finding itself (issue 42: 06's C1 is ``not Re`` at full scale), so the run
    succeeds, names those claims, and its record lands beside quick mode's in the book. Returns the written record.

    ``claims`` is ``{claim id: measurement}`` for a notebook on the claims registry (its entries are read from
    ``lib/repro/claims/<slug>.yml`` unless ``registry_entries`` are given), or an old-style list of :class:`Claim`.
    Notebooks call it through ``run.finish`` (:class:`repro.runtime.Run`), which fills in everything but the
    measurements and metrics. ``figures`` maps each saved figure to its figure-policy problems
    (:func:`repro.plotting.figure_problems`; ``run.savefig`` collects them). ``config`` is the notebook's resolved
    configuration (``run.config``), recorded as JSON (anything JSON cannot hold as its ``repr``)."""
    paths.check_mode(mode)
    if not claims:
        raise ValueError("finish() needs at least one claim")
    if isinstance(claims, Mapping):
        records = _registered(slug, claims, registry_entries)
    else:
        ids = [c.id for c in claims]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate claim ids: {ids}")
        records = [asdict(c) for c in claims]
    record = {
        "slug": slug,
        "mode": mode,
        "seed": seed,
        "claims": records,
        "metrics": dict(metrics or {}),
        "runtime_s": elapsed,
        "figures": {k: list(v) for k, v in (figures or {}).items()},
        "config": _jsonable(dict(config or {})),
        "hardware": provenance.hardware(),
        "versions": provenance.versions(packages),
        "sources": provenance.sources(slug),
    }
    out = paths.results_file(slug, mode)
    provenance.write_json_atomic(out, record)
    if display:
        show(records)
    if mode == "quick":
        _compare_with_committed(slug, records)
    if mode == "smoke":  # full mode's code path at a tiny size: every claim computed and shown, none asserted
        if display:
            print("smoke tier: full mode's code path at a tiny size; the verdicts above are not evidence and no "
                  "claim is asserted")
        return record
    failed = [c for c in records if c["asserted"] and not c["holds"]]
    if failed and mode == "full":  # a finding at scale, not a failed run: the record lands and the book shows it
        if display:
            print(f"full mode: {len(failed)} claim(s) asserted in quick mode do not hold at this scale "
                  f"({'; '.join(_failure(c) for c in failed)}); the record keeps them as measured")
        return record
    if failed:
        lines = "; ".join(_failure(c) for c in failed)
        raise ClaimFailed(f"{len(failed)} asserted claim(s) failed ({lines}); results written to {out}")
    return record


def _jsonable(value: Any) -> Any:
    """``value`` with tuples as lists, keys as strings and anything else JSON cannot hold as its ``repr``."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    return repr(value)


def _registered(slug: str, measured: Mapping[str, Any], entries: Mapping[str, registry.Entry] | None
                ) -> list[dict[str, Any]]:
    """Evaluate every registered claim of ``slug`` on its measurement, in registry order."""
    if entries is None:
        entries = registry.load_for(slug)
        if entries is None:
            raise registry.RegistryError(f"{slug}: no claims registry at {registry.registry_file(slug)}; register the "
                                         "claims before measuring them (or pass an old-style list of Claim)")
    unregistered = [k for k in measured if k not in entries]
    unmeasured = [k for k in entries if k not in measured]
    if unregistered or unmeasured:
        raise registry.RegistryError(f"{slug}: measured but not registered: {unregistered}; registered but not "
                                     f"measured: {unmeasured}")
    return [evidence.evaluate(e, measured[cid]) for cid, e in entries.items()]


def _failure(c: Mapping[str, Any]) -> str:
    if "evidence" in c:
        return f"{c['id']}: {c['verdict']}, {fmt_value(c)} against {c['rule']}" + (f" ({c['reason']})"
                                                                                  if c.get("reason") else "")
    return f"{c['id']}: measured {fmt(c['measured'])}, needed {c['tolerance']}"


def _compare_with_committed(slug: str, records: list[dict[str, Any]]) -> None:
    """With ``$REPRO_COMPARE_RESULTS`` set, raise :class:`ResultsChanged` where this run differs from the committed
    record in what must hold on any machine (:func:`repro.evidence.differences`)."""
    folder = os.environ.get(COMPARE_ENV)
    if not folder:
        return
    path = Path(folder) / f"{slug}.json"
    if not path.exists():
        return
    old = provenance.read_json(path)
    here = provenance.cpu_identity()
    there = {k: (old.get("hardware") or {}).get(k) for k in here}
    if here == there:  # the same kind of CPU: quick mode is deterministic, every number must be the same
        diffs = evidence.differences(records, old.get("claims", []), values="exact")
        what = "on the same kind of CPU (every number must be equal)"
    else:
        entry = paper_registry.find(slug)
        registered = all("evidence" in c for c in records)
        values = registered and (entry is None or entry.numerics == "values")
        diffs = evidence.differences(records, old.get("claims", []), values=values)
        what = ("on another CPU (ids and verdicts, and each value inside its committed interval)" if values
                else "on another CPU (ids and verdicts)")
    if diffs:
        raise ResultsChanged(f"{slug}: this run differs from {path} {what}: " + "; ".join(diffs))


# ---------------------------------------------------------------------------------------------------------
# The claims table


def fmt_value(c: Mapping[str, Any]) -> str:
    """A registered claim's value with its interval, to the precision the interval justifies: ``9.9 [4.1, 15.7]``
    (two significant digits of the half-width), or the value alone for exact evidence."""
    v = c.get("measured")
    lo, hi = (c.get("interval") or [None, None])
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if lo is None or hi is None or lo == hi or math.isnan(lo) or math.isnan(hi):
        return fmt(v)
    digits = _decimals((hi - lo) / 2)
    return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _decimals(half: float) -> int:
    if not math.isfinite(half) or half <= 0:
        return 4
    return max(0, min(8, 1 - math.floor(math.log10(half))))


def _control_cell(c: Mapping[str, Any]) -> str:
    ctl = c.get("control") or {}
    if "none" in ctl:
        return f"none ({ctl['none']})"
    shown = fmt_value({"measured": ctl.get("value"), "interval": ctl.get("interval")})
    how = {"difference": "ours is the difference", "ratio": "ours is the ratio",
           "outside": "must fall outside the rule"}[ctl["compare"]]
    return f"{ctl['what']}: {shown} ({how})"


def _registered_row(c: Mapping[str, Any]) -> list[str]:
    unit = f" {c['unit']}" if c.get("unit") else ""
    timing = " (timing: machine-dependent, not compared between machines)" if c.get("timing") else ""
    mark = " †" if c.get("revisions") else ""
    paper = f"{c['paper']} ({c['where']})"
    return [f"**{c['id']}**{mark} {c['text']}", paper, fmt_value(c) + unit + timing, _control_cell(c),
            str(c.get("n", "")), f"{c['rule']}{unit}", "yes" if c["asserted"] else "reported",
            _verdict_cell(c["verdict"])]


def _legacy_row(d: Mapping[str, Any]) -> list[str]:
    mark = f" {TIMING_MARK}" if d.get("timing") else ""
    return [f"{d['id']}: {d['text']}", d.get("kind", "paper"), fmt(d["paper"]), fmt(d["measured"]) + mark,
            d["tolerance"], "yes" if d["asserted"] else "reported", _verdict_cell(d["verdict"], mark)]


def swatch(verdict: str, width: int = 10, title: str = "") -> str:
    """A block of ``verdict``'s colour (inline HTML; :data:`VERDICT_COLORS`), ``width`` px wide."""
    border = "box-sizing:border-box;border:1px solid #888;" if verdict == "untested" else ""
    tip = f' title="{title}"' if title else ""
    return (f'<span{tip} style="display:inline-block;width:{width}px;height:0.9em;{border}'
            f'background:{VERDICT_COLORS[verdict]}"></span>')


def _verdict_cell(verdict: str, mark: str = "") -> str:
    shown = f"{swatch(verdict)} **{verdict}**" if verdict in VERDICT_COLORS else f"**{verdict}**"
    return f'<span style="white-space:nowrap">{shown}</span>{mark}'


def _notes(ds: list[dict[str, Any]], key: str) -> list[str]:
    """Every claim's note (why it got its verdict, what differs from the paper) in full, below the table."""
    lines = [f"- **{d['id']}**: {d[key]}" for d in ds if str(d.get(key) or "").strip()]
    return ["", "Why, claim by claim:", "", *lines] if lines else []


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(str(x).replace("|", "\\|").replace("\n", " ") for x in cells) + " |"


def claims_markdown(claims: Iterable[Claim | Mapping[str, Any]]) -> str:
    """The paper-vs-reproduced table in Markdown (the notebook's last output and the book's results page).
    Registered claims show the value with its interval, n, the control, the rule and the verdict (in its colour,
    :data:`VERDICT_COLORS`); every claim's note follows the table in full; claims with revisions carry †.
    Old-style timing claims carry :data:`TIMING_MARK` on their value and verdict."""
    ds = [asdict(c) if isinstance(c, Claim) else dict(c) for c in claims]
    if ds and all("evidence" in d for d in ds):
        rows = ["| claim | paper says | ours [95 % interval] | control | n | rule | asserted | verdict |",
                "|---|---|---|---|---|---|---|---|"]
        rows += [_row(_registered_row(d)) for d in ds]
        for d in ds:
            d["why"] = "; ".join(t for t in (d.get("reason", ""), d.get("note", "")) if t)
        rows += _notes(ds, "why")
        if any(d.get("revisions") for d in ds):
            rows.append("\n† changed after a result existed: the revisions are in the claims registry and on the "
                        "results page.")
        return "\n".join(rows)
    rows = ["| claim | kind | paper | ours | tolerance | asserted | verdict |",
            "|---|---|---|---|---|---|---|"]
    rows += [_row(_legacy_row(d)) for d in ds]
    rows += _notes(ds, "note")
    if any(d.get("timing") for d in ds):
        rows.append(f"\n{TIMING_MARK}: machine-dependent, the value is this run's, kept in the results "
                    "file; the notebook tests do not compare it between machines.")
    return "\n".join(rows)


def show(claims: list[Claim] | list[Mapping[str, Any]]) -> None:
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
