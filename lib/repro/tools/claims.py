"""The claims registry: what each notebook tests, written down before it runs.

One YAML file per notebook, ``lib/repro/claims/NN-slug.yml`` (it ships with the library, so a notebook run on
Colab or on a Dask worker checks the same registered claims). Each top-level key is a claim id; its entry::

    C3:
      kind: paper                  # paper (a statement of the paper) | check (our code against a reference)
      statement: UDA gains over the source-only model on the target domain   # what we test, our words
      paper: "UDA transfers to the unlabeled target domain"   # only the paper's (or its code's) words or numbers
      where: abstract              # where they stand: abstract, Table 2, Fig. 3, README of the public code, ...
      metric: target-domain mAP of UDA minus that of the source-only model
      unit: mAP points
      rule: ">= 6"                 # ">= a", "<= b" or "in [a, b]", on the metric
      asserted: true               # an asserted claim that does not hold fails the notebook
      analogue: true               # measured on a smaller or different analogue (verdict ~Re, not Re)
      control:                     # the trivial alternative the measurement must beat, measured in the same run
        what: the source-only model (no adaptation)
        compare: difference        # difference | ratio: the metric is the claim's value minus (over) the
                                   #   control's, paired by seed or item; outside: the control, measured the same
                                   #   way, must fall outside the rule
      evidence: {seeds: 3}         # exact | {seeds: K} | {bootstrap: what is resampled}
      note: ...                    # optional, shown in the claims table
      revisions:                   # every change of rule, setting or seed count made after a result existed
        - {date: 2026-12-01, change: "rule >= 8 -> >= 6", why: "..."}

``control`` is either such a mapping or ``{none: the reason}`` (an exact identity needs no control). Optional keys:
``unit``, ``note``, ``timing`` (a machine-dependent number, not compared between machines), ``analogue``
(false), ``revisions`` ([]). :func:`load` validates a file and names the file and the claim in every error.
Imports no torch.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

KINDS = ("paper", "check")
COMPARES = ("difference", "ratio", "outside")
EVIDENCE = ("exact", "seeds", "bootstrap")
REQUIRED = ("kind", "statement", "paper", "where", "metric", "rule", "asserted", "control", "evidence")
OPTIONAL = ("unit", "note", "timing", "analogue", "revisions")
ID_RE = re.compile(r"^[A-Z][A-Za-z0-9]*$")
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_RULE_RE = re.compile(rf"^\s*(?:(>=|<=)\s*({_NUM})|in\s*\[\s*({_NUM})\s*,\s*({_NUM})\s*\])\s*$")


class RegistryError(ValueError):
    """A claims registry file is missing, malformed or disagrees with what a notebook measured."""


def registry_dir() -> Path:
    """The folder of the registry files (``lib/repro/claims``)."""
    return Path(__file__).resolve().parents[1] / "claims"


def registry_file(stem: str) -> Path:
    """``lib/repro/claims/NN-slug.yml`` for notebook ``NN-slug``."""
    return registry_dir() / f"{stem}.yml"


@dataclass(frozen=True)
class Rule:
    """An acceptance interval on a metric: ``lo <= x <= hi`` (either end may be open)."""

    lo: float | None
    hi: float | None
    text: str

    @classmethod
    def parse(cls, text: Any, where: str) -> Rule:
        m = _RULE_RE.match(str(text)) if isinstance(text, str) else None
        if not m:
            raise RegistryError(f"{where}: rule must read '>= a', '<= b' or 'in [a, b]', got {text!r}")
        op, x, a, b = m.groups()
        if op == ">=":
            rule = cls(float(x), None, f">= {float(x):g}")
        elif op == "<=":
            rule = cls(None, float(x), f"<= {float(x):g}")
        else:
            rule = cls(float(a), float(b), f"in [{float(a):g}, {float(b):g}]")
        if rule.lo is not None and rule.hi is not None and rule.lo > rule.hi:
            raise RegistryError(f"{where}: rule {text!r} is empty (lower end above upper end)")
        return rule

    def contains(self, x: float) -> bool:
        return not math.isnan(x) and (self.lo is None or x >= self.lo) and (self.hi is None or x <= self.hi)

    def position(self, lo: float, hi: float) -> str:
        """Where the interval ``[lo, hi]`` lies: ``inside`` the rule, ``outside`` it, ``straddles`` an end, or
        ``undefined`` (NaN)."""
        if math.isnan(lo) or math.isnan(hi):
            return "undefined"
        if self.contains(lo) and self.contains(hi):
            return "inside"
        if (self.lo is not None and hi < self.lo) or (self.hi is not None and lo > self.hi):
            return "outside"
        return "straddles"


@dataclass(frozen=True)
class Control:
    """The trivial alternative a claim is held against, or ``none`` with the reason."""

    what: str = ""
    compare: str = ""
    none: str = ""

    @property
    def present(self) -> bool:
        return not self.none


@dataclass(frozen=True)
class Evidence:
    """How the verdict is decided: ``exact``, over ``seeds`` (at least ``k`` of them) or by a ``bootstrap`` over
    ``over``."""

    kind: str
    k: int = 1
    over: str = ""

    def text(self) -> str:
        return {"exact": "exact", "seeds": f"{self.k} seeds", "bootstrap": f"bootstrap over {self.over}"}[self.kind]


@dataclass(frozen=True)
class Revision:
    date: str
    change: str
    why: str


@dataclass(frozen=True)
class Entry:
    """One registered claim (see the module docstring for the fields)."""

    id: str
    kind: str
    statement: str
    paper: str
    where: str
    metric: str
    rule: Rule
    asserted: bool
    control: Control
    evidence: Evidence
    analogue: bool = False
    unit: str = ""
    note: str = ""
    timing: bool = False
    revisions: tuple[Revision, ...] = field(default=())


def load(path: Path) -> dict[str, Entry]:
    """The registry file at ``path`` as ``{id: Entry}`` in file order; raises :class:`RegistryError` naming the file
    (and claim) for anything malformed."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise RegistryError(f"{path}: cannot read the claims registry ({err.strerror})") from err
    except yaml.YAMLError as err:
        raise RegistryError(f"{path}: not valid YAML ({err})") from err
    if not isinstance(data, dict) or not data:
        raise RegistryError(f"{path}: expected a mapping of claim ids to entries")
    return {str(cid): _entry(str(cid), body, f"{path.name}: claim {cid}") for cid, body in data.items()}


def load_for(stem: str) -> dict[str, Entry] | None:
    """The registry of notebook ``NN-slug``, or ``None`` if it has none (a notebook not yet on the registry)."""
    path = registry_file(stem)
    return load(path) if path.exists() else None


def _entry(cid: str, body: Any, where: str) -> Entry:
    if not ID_RE.match(cid):
        raise RegistryError(f"{where}: ids are a capital letter and letters/digits (C1, K2, C4b)")
    if not isinstance(body, dict):
        raise RegistryError(f"{where}: expected a mapping of fields")
    missing = [k for k in REQUIRED if k not in body]
    unknown = sorted(set(body) - set(REQUIRED) - set(OPTIONAL))
    if missing or unknown:
        raise RegistryError(f"{where}: missing fields {missing}" + (f", unknown fields {unknown}" if unknown else ""))
    kind = body["kind"]
    if kind not in KINDS:
        raise RegistryError(f"{where}: kind must be one of {KINDS}, got {kind!r}")
    for key in ("asserted", "analogue", "timing"):
        if key in body and not isinstance(body[key], bool):
            raise RegistryError(f"{where}: {key} must be true or false, got {body[key]!r}")
    if kind == "check" and body.get("analogue"):
        raise RegistryError(f"{where}: a check has no analogue; it passes or fails")
    texts = {k: _text(body, k, where) for k in ("statement", "paper", "where", "metric")}
    return Entry(id=cid, kind=kind, rule=Rule.parse(body["rule"], where), asserted=body["asserted"],
                 control=_control(body["control"], where), evidence=_evidence(body["evidence"], where),
                 analogue=bool(body.get("analogue", False)), unit=_text(body, "unit", where, ""),
                 note=_text(body, "note", where, ""), timing=bool(body.get("timing", False)),
                 revisions=_revisions(body.get("revisions") or [], where), **texts)


def _text(body: dict, key: str, where: str, default: str | None = None) -> str:
    value = body.get(key, default)
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = f"{value:g}"
    if not isinstance(value, str) or (default is None and not value.strip()):
        raise RegistryError(f"{where}: {key} must be a non-empty text, got {value!r}")
    return value.strip()


def _control(value: Any, where: str) -> Control:
    if not isinstance(value, dict):
        raise RegistryError(f"{where}: control must be {{what: ..., compare: ...}} or {{none: the reason}}")
    if "none" in value:
        if set(value) != {"none"} or not isinstance(value["none"], str) or not value["none"].strip():
            raise RegistryError(f"{where}: control {{none: ...}} takes only the reason, a text")
        return Control(none=value["none"].strip())
    if set(value) != {"what", "compare"}:
        raise RegistryError(f"{where}: control needs exactly 'what' and 'compare' (or 'none'), got {sorted(value)}")
    if value["compare"] not in COMPARES:
        raise RegistryError(f"{where}: control.compare must be one of {COMPARES}, got {value['compare']!r}")
    return Control(what=_text(value, "what", where), compare=value["compare"])


def _evidence(value: Any, where: str) -> Evidence:
    if value == "exact":
        return Evidence("exact")
    if isinstance(value, dict) and len(value) == 1:
        (key, arg), = value.items()
        if key == "seeds" and isinstance(arg, int) and not isinstance(arg, bool) and arg >= 2:
            return Evidence("seeds", k=arg)
        if key == "bootstrap" and isinstance(arg, str) and arg.strip():
            return Evidence("bootstrap", over=arg.strip())
    raise RegistryError(f"{where}: evidence must be 'exact', {{seeds: K}} with K >= 2 or "
                        f"{{bootstrap: what is resampled}}, got {value!r}")


def _revisions(value: Any, where: str) -> tuple[Revision, ...]:
    if not isinstance(value, list):
        raise RegistryError(f"{where}: revisions must be a list")
    out = []
    for i, r in enumerate(value):
        if not isinstance(r, dict) or set(r) != {"date", "change", "why"}:
            raise RegistryError(f"{where}: revision {i + 1} needs exactly date, change and why")
        date = r["date"].isoformat() if isinstance(r["date"], _dt.date) else str(r["date"])
        out.append(Revision(date, _text(r, "change", where), _text(r, "why", where)))
    return tuple(out)
