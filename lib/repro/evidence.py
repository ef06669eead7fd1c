"""Verdicts from evidence: a registered claim (:mod:`repro.tools.claims`) and what the notebook measured for it.

A notebook passes, per claim id, its measurement in the form the registry's ``evidence`` names:

* ``exact``: one number (an identity, a count, a deterministic computation);
* ``seeds: K``: one value per seed (at least K of them);
* ``bootstrap: ...``: the per-item values (or a tuple of per-item arrays and a ``statistic``), which
  :func:`repro.common.stats.bootstrap` resamples;

and, when the registry names a control, the control's measurement the same way, in a :class:`Measure`. With
``compare: difference`` (or ``ratio``) the claim's metric is the value minus (over) the control, paired by seed
or item; with ``compare: outside`` the control is measured by the same metric and must fall outside the rule. A
precomputed :class:`repro.common.stats.Estimate` may stand for a value; it is then taken as the claim's metric
itself (for ``difference``/``ratio``: already the comparison), and the control is shown beside it.

The verdict of a paper claim comes from the interval of its metric (:func:`verdict`):

========================================  ==========================================
the interval ...                          verdict
========================================  ==========================================
lies inside the rule (and, for            ``Re``, or ``~Re`` for an analogue
``outside``, the control's lies outside)
lies outside the rule                     ``not Re``
straddles an end of the rule, or the      ``inconclusive``
control meets the rule too
cannot be computed (NaN, fewer samples    ``untested``
than registered, marked ``untested``)
========================================  ==========================================

A check passes only when its interval lies inside the rule (and its control outside). An asserted claim must
hold: ``not Re``, ``inconclusive`` and ``untested`` all fail the notebook.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .common import stats
from .common.stats import Estimate
from .tools.claims import Entry, RegistryError

PAPER_VERDICTS = ("Re", "~Re", "not Re", "inconclusive", "untested")
CHECK_VERDICTS = ("pass", "fail")
HOLDING = ("Re", "~Re", "pass")
BOOTSTRAP_SAMPLES_KEPT = 1000  # per-item values up to this many are kept in the results file
EXACT_RTOL = 1e-6  # another machine may move an exact value by rounding, never more


@dataclass(frozen=True)
class Measure:
    """What a notebook measured for one claim: ``value`` (and ``control``) in the registry's evidence form,
    the bootstrap ``statistic`` of the items (default: their mean), a ``note`` shown in the claims table, and
    ``untested``: why the metric could not be measured here (e.g. "pass@8 is saturated at 1.0")."""

    value: Any
    control: Any = None
    statistic: Callable[..., float] | None = None
    note: str = ""
    untested: str = ""


def evaluate(entry: Entry, measured: Any) -> dict[str, Any]:
    """The results record of one registered claim: its estimate, its control, the verdict and why."""
    m = measured if isinstance(measured, Measure) else Measure(measured)
    where = f"claim {entry.id}"
    if entry.control.present and m.control is None:
        raise RegistryError(f"{where}: the registry names a control ({entry.control.what}); pass "
                            f"Measure(value, control=...) with its measurement")
    if not entry.control.present and m.control is not None:
        raise RegistryError(f"{where}: the registry says control: none ({entry.control.none}), but a control "
                            "was measured; register it")
    metric, control = _metric(entry, m, where)
    verdict, reason = decide(entry, metric, control, m.untested)
    return {
        "id": entry.id, "kind": entry.kind, "text": entry.statement, "paper": entry.paper, "where": entry.where,
        "metric": entry.metric, "unit": entry.unit, "rule": entry.rule.text, "lo": entry.rule.lo,
        "hi": entry.rule.hi, "asserted": entry.asserted, "analogue": entry.analogue, "timing": entry.timing,
        "evidence": entry.evidence.text(), "measured": metric.value, "interval": [metric.lo, metric.hi],
        "n": metric.n, "level": metric.level, "samples": list(metric.samples) or _kept_items(entry, m),
        "control": _control_record(entry, control), "verdict": verdict, "holds": verdict in HOLDING,
        "reason": reason, "note": "; ".join(t for t in (entry.note, m.note) if t),
        "revisions": [vars(r) for r in entry.revisions],
    }


def _metric(entry: Entry, m: Measure, where: str) -> tuple[Estimate, Estimate | None]:
    """The claim's metric as an Estimate (after the comparison with the control) and the control's own."""
    ev, compare = entry.evidence, entry.control.compare
    if m.statistic is not None and ev.kind != "bootstrap":
        raise RegistryError(f"{where}: a statistic is for bootstrap evidence; the registry says {ev.text()}")
    own = _estimate(ev.kind, m.value, m.statistic, where)
    ctl = None if m.control is None else _estimate(ev.kind, m.control, m.statistic, f"{where} (control)")
    if ctl is None or compare == "outside" or isinstance(m.value, Estimate):
        return own, ctl
    if ev.kind == "exact":
        v = own.value - ctl.value if compare == "difference" else _ratio(own.value, ctl.value)
        return stats.exact(v), ctl
    if ev.kind == "seeds":
        a, b = stats.as_samples(m.value), stats.as_samples(m.control)
        with np.errstate(divide="ignore", invalid="ignore"):
            per_seed = (stats.paired_differences(a, b, where) if compare == "difference"
                        else a / _denominator(a, b, where))
        return stats.over_seeds(per_seed), ctl
    return stats.bootstrap_compare(m.value, m.control, m.statistic, compare=compare), ctl


def _estimate(kind: str, value: Any, statistic: Callable[..., float] | None, where: str) -> Estimate:
    if isinstance(value, Estimate):
        if value.method != kind:
            raise RegistryError(f"{where}: the registry says evidence {kind}, the estimate is {value.method}")
        return value
    if kind == "exact":
        if np.size(value) != 1 or isinstance(value, tuple):
            raise RegistryError(f"{where}: the registry says evidence exact; pass one number, not {np.size(value)}")
        return stats.exact(stats.as_samples(value, where).reshape(-1)[0])
    if kind == "seeds":
        if isinstance(value, tuple) or np.ndim(value) != 1:
            raise RegistryError(f"{where}: the registry says evidence over seeds; pass one value per seed (a list)")
        return stats.over_seeds(value)
    if not isinstance(value, tuple) and np.ndim(value) == 0:
        raise RegistryError(f"{where}: the registry says a bootstrap; pass the per-item values, not one number")
    return stats.bootstrap(value, statistic)


def _denominator(a: np.ndarray, b: np.ndarray, where: str) -> np.ndarray:
    """The control's per-seed values as the denominator of a paired ratio (after the same length check)."""
    stats.paired_differences(a, b, where)
    return b


def _ratio(a: float, b: float) -> float:
    return a / b if b != 0 else float("nan")


def decide(entry: Entry, metric: Estimate, control: Estimate | None, untested: str = "") -> tuple[str, str]:
    """The verdict and, unless it follows plainly from the interval, why (see the module docstring)."""
    why = _untested(entry, metric, control, untested)
    if why:
        return ("untested" if entry.kind == "paper" else "fail"), why
    pos = entry.rule.position(metric.lo, metric.hi)
    reason = ""
    if pos == "inside" and entry.control.compare == "outside":
        cpos = entry.rule.position(control.lo, control.hi)
        if cpos != "outside":
            pos = "control"
            reason = ("the control meets the rule too: the measurement cannot tell the paper's effect from it"
                      if cpos == "inside" else "the control's interval straddles the rule")
    if pos == "straddles":
        reason = f"the interval straddles the rule {entry.rule.text}"
    if entry.kind == "check":
        return ("pass" if pos == "inside" else "fail"), reason
    if pos == "inside":
        return ("~Re" if entry.analogue else "Re"), reason
    return ("not Re" if pos == "outside" else "inconclusive"), reason


def _untested(entry: Entry, metric: Estimate, control: Estimate | None, untested: str) -> str:
    if untested:
        return untested
    if entry.evidence.kind == "seeds" and metric.n < entry.evidence.k:
        return f"{metric.n} seed(s) of the {entry.evidence.k} the registry asks"
    if not metric.defined:
        return "not measurable here (NaN)" if math.isnan(metric.value) else "no interval (fewer than two samples)"
    if control is not None and entry.control.compare == "outside" and not control.defined:
        return "the control could not be measured"
    return ""


def _control_record(entry: Entry, control: Estimate | None) -> dict[str, Any] | None:
    if not entry.control.present:
        return {"none": entry.control.none}
    assert control is not None
    return {"what": entry.control.what, "compare": entry.control.compare, "value": control.value,
            "interval": [control.lo, control.hi], "n": control.n}


def _kept_items(entry: Entry, m: Measure) -> list[float]:
    if entry.evidence.kind != "bootstrap" or isinstance(m.value, Estimate | tuple) or np.ndim(m.value) != 1:
        return []
    arr = stats.as_samples(m.value)
    return arr.tolist() if arr.size <= BOOTSTRAP_SAMPLES_KEPT else []


# ---------------------------------------------------------------------------------------------------------
# What must hold on any machine


def differences(new: Sequence[Mapping[str, Any]], old: Sequence[Mapping[str, Any]], values: bool | str = True
                ) -> list[str]:
    """How a run's claims differ from a committed run's: the ids, every verdict, and (``values=True``) each value at
    the precision its committed interval justifies (inside that interval; an exact value to a relative 1e-6), or
    (``values="exact"``, two runs on the same kind of CPU) each value and interval exactly. ``values=False`` for a
    notebook listed as verdict-stable only (``numerics: verdicts`` in ``book/papers.yml``) and for old-style claims.
    Timing claims are not compared. Empty when they agree."""
    out = []
    new_ids, old_ids = [c["id"] for c in new], [c["id"] for c in old]
    if new_ids != old_ids:
        return [f"claim ids {new_ids} differ from the committed {old_ids}"]
    for a, b in zip(new, old, strict=True):
        if a.get("timing") or b.get("timing"):
            continue
        if a["verdict"] != b["verdict"]:
            out.append(f"{a['id']}: verdict {a['verdict']} (committed: {b['verdict']})")
        elif values == "exact" and not _same(a, b):
            out.append(f"{a['id']}: value {a.get('measured')!r} {a.get('interval')!r}, committed "
                       f"{b.get('measured')!r} {b.get('interval')!r} (the same CPU must give the same numbers)")
        elif values is True and not _within(a.get("measured"), b):
            out.append(f"{a['id']}: value {a.get('measured')!r} outside the committed {_span(b)}")
    return out


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Equal measured values (and intervals, where recorded), NaN equal to NaN (JSON ``null``)."""
    pairs = [(a.get("measured"), b.get("measured"))]
    pairs += list(zip(a.get("interval") or [], b.get("interval") or [], strict=False))
    for x, y in pairs:
        if isinstance(x, str) or isinstance(y, str):
            if x != y:
                return False
            continue
        u, v = _num(x), _num(y)
        if not (u == v or (math.isnan(u) and math.isnan(v))):
            return False
    return True


def _num(x: Any) -> float:
    return float("nan") if x is None else float(x)


def _within(value: Any, old: Mapping[str, Any]) -> bool:
    v, ref = _num(value), _num(old.get("measured"))
    if math.isnan(v) or math.isnan(ref):
        return math.isnan(v) and math.isnan(ref)
    lo, hi = (_num(x) for x in (old.get("interval") or [None, None]))
    if math.isnan(lo) or math.isnan(hi) or lo == hi:
        return abs(v - ref) <= EXACT_RTOL * max(1.0, abs(ref))
    slack = EXACT_RTOL * max(1.0, abs(lo), abs(hi))
    return lo - slack <= v <= hi + slack


def _span(old: Mapping[str, Any]) -> str:
    lo, hi = (old.get("interval") or [None, None])
    if lo is None or hi is None or lo == hi:
        return f"value {old.get('measured')!r} (exact, relative tolerance {EXACT_RTOL:g})"
    return f"interval [{lo!r}, {hi!r}]"
