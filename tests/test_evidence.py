"""The evidence contract: the claims registry (repro.tools.claims), verdicts from intervals (repro.evidence) and
``finish`` with measurements by claim id (repro.report)."""

from __future__ import annotations

import json
import math
import textwrap

import numpy as np
import pytest

from repro import evidence, report
from repro.common import stats
from repro.evidence import Measure
from repro.report import ClaimFailed, ResultsChanged, finish
from repro.tools import claims

ENTRY = dict(kind="paper", statement="s", paper="p", where="abstract", metric="m", rule=">= 1", asserted=True,
             control={"none": "an identity"}, evidence="exact")


def entry(cid: str = "C1", **changes) -> claims.Entry:
    return claims._entry(cid, {**ENTRY, **changes}, f"test: claim {cid}")


def write(tmp_path, text: str):
    path = tmp_path / "99-test.yml"
    path.write_text(textwrap.dedent(text))
    return path


# ------------------------------------------------------------------------------------------- the registry


def test_registry_file_parses_in_order(tmp_path):
    path = write(tmp_path, """
        C2:
          kind: paper
          statement: gains
          paper: '"it gains"'
          where: Table 2
          metric: gain
          unit: points
          rule: "in [1, 5.5]"
          asserted: false
          analogue: true
          control: {what: the untrained model, compare: difference}
          evidence: {seeds: 3}
          revisions:
            - {date: 2026-12-01, change: "rule >= 2 -> in [1, 5.5]", why: "test"}
        K1:
          kind: check
          statement: round trip
          paper: exact
          where: our code
          metric: error
          rule: "<= 1e-12"
          asserted: true
          control: {none: an identity}
          evidence: exact
        """)
    e = claims.load(path)
    assert list(e) == ["C2", "K1"]
    c2 = e["C2"]
    assert (c2.rule.lo, c2.rule.hi, c2.rule.text) == (1.0, 5.5, "in [1, 5.5]")
    assert c2.evidence.kind == "seeds" and c2.evidence.k == 3 and c2.control.compare == "difference"
    assert c2.revisions[0].date == "2026-12-01" and c2.paper == '"it gains"' and c2.analogue
    assert e["K1"].rule.hi == 1e-12 and not e["K1"].control.present


@pytest.mark.parametrize("change, message", [
    (dict(kind="reproduction"), "kind must be one of"),
    (dict(rule="> 1"), "rule must read"),
    (dict(rule="in [2, 1]"), "empty"),
    (dict(evidence={"seeds": 1}), "evidence must be"),
    (dict(evidence="bootstrap"), "evidence must be"),
    (dict(control={"what": "x"}), "exactly 'what' and 'compare'"),
    (dict(control={"what": "x", "compare": "beats"}), "compare must be one of"),
    (dict(asserted="yes"), "asserted must be true or false"),
    (dict(kind="check", analogue=True), "a check has no analogue"),
    (dict(statement=""), "statement must be a non-empty text"),
    (dict(colour="red"), "unknown fields"),
])
def test_registry_errors_name_the_claim(change, message):
    with pytest.raises(claims.RegistryError, match=message) as err:
        entry(**change)
    assert "claim C1" in str(err.value)


def test_registry_file_errors_name_the_file(tmp_path):
    with pytest.raises(claims.RegistryError, match="99-test.yml: not valid YAML"):
        claims.load(write(tmp_path, "C1: [unclosed\n"))
    with pytest.raises(claims.RegistryError, match="missing fields"):
        claims.load(write(tmp_path, "C1: {kind: paper}\n"))
    with pytest.raises(claims.RegistryError, match="cannot read"):
        claims.load(tmp_path / "absent.yml")


def test_every_committed_registry_parses():
    files = sorted(claims.registry_dir().glob("*.yml"))
    assert files
    for f in files:
        assert claims.load(f)


# ------------------------------------------------------------------------------------------- verdicts


def verdict(e: claims.Entry, measured) -> tuple[str, str]:
    rec = evidence.evaluate(e, measured)
    return rec["verdict"], rec["reason"]


def test_exact_verdicts():
    assert verdict(entry(), 1.5)[0] == "Re"
    assert verdict(entry(analogue=True), 1.5)[0] == "~Re"
    assert verdict(entry(), 0.5)[0] == "not Re"
    assert verdict(entry(), float("nan"))[0] == "untested"
    assert verdict(entry(kind="check"), 1.0)[0] == "pass"
    assert verdict(entry(kind="check"), float("nan"))[0] == "fail"
    assert verdict(entry(), Measure(2.0, untested="saturated at 1.0")) == ("untested", "saturated at 1.0")


def test_seed_intervals_decide_and_straddling_is_inconclusive():
    e = entry(evidence={"seeds": 3})
    assert verdict(e, [2.0, 2.1, 1.9])[0] == "Re"                 # interval [1.75, 2.25] inside >= 1
    v, why = verdict(e, [0.2, 2.0, 1.4])                            # mean 1.2, interval straddles 1
    assert v == "inconclusive" and "straddles" in why
    assert verdict(e, [0.1, 0.2, 0.15])[0] == "not Re"
    v, why = verdict(e, [2.0, 2.1])
    assert v == "untested" and "2 seed(s) of the 3" in why
    with pytest.raises(claims.RegistryError, match="one value per seed"):
        evidence.evaluate(e, 2.0)


def test_paired_control_difference_over_seeds():
    e = entry(evidence={"seeds": 3}, control={"what": "baseline", "compare": "difference"})
    ours, base = [5.0, 6.0, 7.0], [3.0, 4.1, 5.0]
    rec = evidence.evaluate(e, Measure(ours, control=base))
    d = np.subtract(ours, base)
    assert rec["measured"] == pytest.approx(d.mean()) and rec["interval"] == pytest.approx(
        [stats.over_seeds(d).lo, stats.over_seeds(d).hi])
    assert rec["control"]["value"] == pytest.approx(np.mean(base)) and rec["verdict"] == "Re"
    with pytest.raises(claims.RegistryError, match="names a control"):
        evidence.evaluate(e, ours)
    with pytest.raises(ValueError, match="pairing needs equal counts"):
        evidence.evaluate(e, Measure(ours, control=base[:2]))


def test_paired_control_ratio_over_seeds():
    """compare: ratio over seeds: the per-seed ratios, their t interval (this path raised a TypeError while a
    second ``_same`` shadowed the pairing helper)."""
    e = entry(evidence={"seeds": 3}, control={"what": "baseline", "compare": "ratio"}, rule=">= 1.1")
    ours, base = [6.0, 6.6, 7.5], [5.0, 5.5, 6.0]
    rec = evidence.evaluate(e, Measure(ours, control=base))
    r = np.divide(ours, base)
    assert rec["measured"] == pytest.approx(r.mean()) and rec["interval"] == pytest.approx(
        [stats.over_seeds(r).lo, stats.over_seeds(r).hi])
    assert rec["control"]["value"] == pytest.approx(np.mean(base))
    with pytest.raises(ValueError, match="pairing needs equal counts"):
        evidence.evaluate(e, Measure(ours, control=base[:2]))


def test_a_control_that_meets_the_rule_makes_the_claim_inconclusive():
    e = entry(evidence={"bootstrap": "items"}, control={"what": "copying", "compare": "outside"})
    rng = np.random.default_rng(0)
    ours, good_control, bad_control = rng.normal(2, 0.1, 100), rng.normal(0, 0.1, 100), rng.normal(2, 0.1, 100)
    assert verdict(e, Measure(ours, control=good_control))[0] == "Re"
    v, why = verdict(e, Measure(ours, control=bad_control))
    assert v == "inconclusive" and "control meets the rule too" in why
    assert verdict(e, Measure(ours, control=[float("nan")] * 5))[0] == "untested"


def test_bootstrap_evidence_with_a_statistic_and_estimates():
    e = entry(evidence={"bootstrap": "items"}, rule="<= 0.5")
    x = np.random.default_rng(1).uniform(size=300)
    rec = evidence.evaluate(e, Measure(x, statistic=lambda a: float(np.median(a))))
    assert rec["measured"] == pytest.approx(np.median(x)) and rec["n"] == 300
    assert rec["verdict"] in ("inconclusive", "Re")
    est = stats.bootstrap(x)
    assert evidence.evaluate(e, est)["measured"] == est.value
    with pytest.raises(claims.RegistryError, match="evidence bootstrap, the estimate is seeds"):
        evidence.evaluate(e, stats.over_seeds([1.0, 2.0]))
    with pytest.raises(claims.RegistryError, match="per-item values"):
        evidence.evaluate(e, 0.3)
    with pytest.raises(claims.RegistryError, match="a statistic is for bootstrap"):
        evidence.evaluate(entry(), Measure(1.0, statistic=np.mean))


def test_differences_accept_a_move_inside_the_interval_and_catch_verdict_changes():
    old = [{"id": "C1", "verdict": "~Re", "measured": 2.0, "interval": [1.5, 2.5]},
           {"id": "C2", "verdict": "pass", "measured": 3.0, "interval": [3.0, 3.0]},
           {"id": "C3", "verdict": "~Re", "measured": 9.0, "interval": [1.0, 2.0], "timing": True}]
    new = [{"id": "C1", "verdict": "~Re", "measured": 2.4, "interval": [1.9, 2.9]},
           {"id": "C2", "verdict": "pass", "measured": 3.0 + 1e-9, "interval": [3.0, 3.0]},
           {"id": "C3", "verdict": "not Re", "measured": 0.1, "interval": [0.0, 0.2], "timing": True}]
    assert evidence.differences(new, old) == []
    new[0]["measured"] = 2.6
    assert "outside the committed interval" in evidence.differences(new, old)[0]
    assert evidence.differences(new, old, values=False) == []  # a verdict-stable-only notebook
    assert "the same CPU must give the same numbers" in evidence.differences(new, old, values="exact")[0]
    assert evidence.differences(old, [dict(c) for c in old], values="exact") == []
    new[0].update(measured=2.0, verdict="inconclusive")
    assert "verdict inconclusive (committed: ~Re)" in evidence.differences(new, old)[0]
    new[1]["measured"] = 3.01
    assert any("C2" in d for d in evidence.differences(new, old))
    assert "claim ids" in evidence.differences(new[:2], old)[0]


# ------------------------------------------------------------------------------------------- finish


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setenv(report.RESULTS_ENV, str(tmp_path / "out"))
    monkeypatch.delenv(report.COMPARE_ENV, raising=False)
    return tmp_path / "out"


REG = {"C1": entry("C1", evidence={"seeds": 3}, control={"what": "base", "compare": "difference"}),
       "K1": entry("K1", kind="check", rule="<= 0")}


def test_finish_decides_writes_strict_json_and_raises_on_asserted_inconclusive(results):
    ok = {"C1": Measure([5.0, 6.0, 7.0], control=[1.0, 2.0, 3.0]), "K1": 0}
    rec = finish("99-test", mode="quick", seed=0, claims=ok, metrics={"x": float("nan")}, display=False,
                 registry_entries=REG)
    text = (results / "99-test.json").read_text()
    on_disk = json.loads(text, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert on_disk["metrics"]["x"] is None and rec["claims"][0]["verdict"] == "Re"
    assert on_disk["claims"][0]["samples"] == [4.0, 4.0, 4.0] and on_disk["claims"][1]["verdict"] == "pass"
    shaky = {"C1": Measure([5.0, 0.0, 9.0], control=[1.0, 2.0, 3.0]), "K1": 0}
    with pytest.raises(ClaimFailed, match="C1: inconclusive"):
        finish("99-test", mode="quick", seed=0, claims=shaky, display=False, registry_entries=REG)
    assert json.loads((results / "99-test.json").read_text())["claims"][0]["verdict"] == "inconclusive"


def test_finish_names_unregistered_and_unmeasured_claims(results):
    with pytest.raises(claims.RegistryError, match=r"measured but not registered: \['C9'\]; registered but not "
                                                   r"measured: \['K1'\]"):
        finish("99-test", mode="quick", seed=0, claims={"C1": Measure([1, 2, 3], control=[0, 0, 0]), "C9": 1},
               display=False, registry_entries=REG)
    with pytest.raises(claims.RegistryError, match="no claims registry"):
        finish("99-test", mode="quick", seed=0, claims={"C1": 1.0}, display=False)


def test_finish_compares_with_the_committed_results(results, tmp_path, monkeypatch):
    good = {"C1": Measure([5.0, 6.0, 7.0], control=[1.0, 2.2, 2.8]), "K1": 0}  # differences 4, 3.8, 4.2
    finish("99-test", mode="quick", seed=0, claims=good, display=False, registry_entries=REG)
    committed = tmp_path / "committed"
    committed.mkdir()
    rec = json.loads((results / "99-test.json").read_text())
    (committed / "99-test.json").write_text(json.dumps(rec))
    monkeypatch.setenv(report.COMPARE_ENV, str(committed))
    moved = {"C1": Measure([5.5, 6.2, 7.1], control=[1.0, 2.2, 2.8]), "K1": 0}
    with pytest.raises(ResultsChanged, match="same kind of CPU"):  # committed on this CPU: every number equal
        finish("99-test", mode="quick", seed=0, claims=moved, display=False, registry_entries=REG)
    finish("99-test", mode="quick", seed=0, claims=good, display=False, registry_entries=REG)
    rec["hardware"]["cpu"] = "another CPU"  # from here on: committed on another kind of CPU
    (committed / "99-test.json").write_text(json.dumps(rec))
    moved = {"C1": Measure([5.5, 6.2, 7.1], control=[1.0, 2.2, 2.8]), "K1": 0}  # 4.27, inside [3.5, 4.5]
    finish("99-test", mode="quick", seed=0, claims=moved, display=False, registry_entries=REG)
    far = {"C1": Measure([6.5, 6.9, 7.1], control=[1.0, 2.2, 2.8]), "K1": 0}  # 4.83: same verdict, outside
    with pytest.raises(ResultsChanged, match="C1: value .* outside the committed interval"):
        finish("99-test", mode="quick", seed=0, claims=far, display=False, registry_entries=REG)
    failing = {"C1": Measure([5.5, 6.2, 7.1], control=[1.0, 2.2, 2.8]), "K1": 1}
    with pytest.raises(ResultsChanged, match="K1: verdict fail"):
        finish("99-test", mode="quick", seed=0, claims=failing, display=False, registry_entries=REG)
    finish("99-test", mode="full", seed=0, claims=failing | {"K1": 0}, display=False, registry_entries=REG)


def test_the_table_shows_interval_control_n_and_the_revision_mark():
    e = entry("C1", evidence={"seeds": 3}, control={"what": "base", "compare": "difference"}, unit="mAP",
              revisions=[{"date": "2026-12-01", "change": "a", "why": "b"}])
    rec = evidence.evaluate(e, Measure([5.0, 6.0, 7.0], control=[1.0, 2.2, 2.8]))
    row = report.claims_markdown([rec]).splitlines()[2]
    assert "**C1** †" in row and "4.00 [3.50, 4.50] mAP" in row and "base: 2.0 [-0.3, 4.3]" in row
    assert "| 3 |" in row and "**Re**" in row
    assert report.fmt_value({"measured": 1.23456, "interval": [1.2, 1.3]}) == "1.235 [1.200, 1.300]"
    assert report.fmt_value({"measured": None, "interval": [None, None]}) == "n/a"
    assert report.fmt_value({"measured": 0.0123, "interval": [math.nan, math.nan]}) == "0.0123"


def test_new_paper_gets_a_registry_skeleton_and_a_registry_notebook(tmp_path):
    from repro.tools import scaffold

    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "papers.yml").write_text('parts: [Optimization]\npapers:\n  "20": {slug: toy-paper, '
                                                  'module: repro.papers.pogo, part: Optimization, title: "A toy"}\n')
    (tmp_path / "_config.yml").write_text("repository: {url: 'https://github.com/o/r', branch: main}\n")
    nb_path = scaffold.new_notebook(tmp_path, "20")
    reg = tmp_path / "lib" / "repro" / "claims" / "20-toy-paper.yml"
    entries = claims.load(reg)
    assert list(entries) == ["C1"] and entries["C1"].control.compare == "difference"
    text = nb_path.read_text()
    assert "claims-registry" in text and "Measure(" in text and "NBVAL_CHECK_OUTPUT" not in text
    assert "smoke=dict(" in text  # the skeleton declares its smoke tier (tests/test_smoke.py runs it)
    with pytest.raises(FileExistsError, match="20-toy-paper"):
        scaffold.new_notebook(tmp_path, "20")
