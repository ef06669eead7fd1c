"""repro.report (the results contract) and repro.runtime (mode, device, seeds, threads, the notebook handle)."""

from __future__ import annotations

import json
import math
import os
import time

import numpy as np
import pytest
import torch

from repro import report, runtime
from repro.report import Claim, ClaimFailed, finish
from repro.tools import provenance


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setenv(report.RESULTS_ENV, str(tmp_path))
    return tmp_path


def test_unknown_mode_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown MODE 'fast'; valid modes are 'quick', 'full', 'smoke'"):
        runtime.check_mode("fast")
    with pytest.raises(ValueError, match="unknown MODE"):
        runtime.setup("99-test", "Quick")
    with pytest.raises(ValueError, match="slug"):
        runtime.setup("quick", "quick")
    assert runtime.check_mode("full") == "full"


def test_devices():
    assert runtime.device("cpu") == torch.device("cpu")
    assert runtime.device("auto").type in {"cpu", "cuda", "mps"}
    with pytest.raises(ValueError, match="unknown DEVICE 'tpu'"):
        runtime.device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            runtime.device("cuda")


def test_seeds_and_quick_mode_threads():
    run = runtime.setup("99-test", "quick", seed=3, device_name="cpu")
    a = (torch.rand(3), run.rng.random())
    run = runtime.setup("99-test", "quick", seed=3, device_name="cpu")
    b = (torch.rand(3), run.rng.random())
    assert torch.equal(a[0], b[0]) and a[1] == b[1]
    assert torch.get_num_threads() == 1 and run.quick
    assert runtime.elapsed() is not None and runtime.elapsed() >= 0
    with pytest.raises(ValueError, match="SEED"):
        runtime.seed_everything(-1)


def test_claim_verdicts():
    assert Claim("C1", "t", paper=-0.5, measured=-0.48, lo=-0.6, hi=-0.4).verdict == "Re"
    assert Claim("C1", "t", paper=-0.5, measured=-0.48, lo=-0.6, hi=-0.4, analogue=True).verdict == "~Re"
    c = Claim("C1", "t", paper=-0.5, measured=-0.3, lo=-0.6, hi=-0.4, analogue=True)
    assert c.verdict == "not Re" and not c.holds and c.tolerance == "[-0.6, -0.4]"
    assert Claim("C1", "t", paper=1, measured=math.nan, hi=2).verdict == "not Re"
    assert Claim("C1", "t", paper=1, measured=2, hi=2).tolerance == "<= 2"
    with pytest.raises(ValueError, match="lo / hi"):
        Claim("C1", "t", paper=1, measured=1)


def test_finish_writes_the_record_and_raises_on_a_failed_asserted_claim(results):
    ok = Claim("C1", "holds", paper=1, measured=1.0, lo=0.5)
    reported = Claim("C2", "reported only", paper=1, measured=0.0, lo=0.5, asserted=False)
    rec = finish("99-test", mode="quick", seed=0, claims=[ok, reported], metrics={"x": [1, 2]}, display=False)
    on_disk = json.loads((results / "99-test.json").read_text())
    assert on_disk["claims"][1]["verdict"] == "not Re" and rec["metrics"] == {"x": [1, 2]}
    assert {"runtime_s", "hardware", "versions", "sources", "seed", "mode"} <= set(on_disk)
    bad = Claim("C3", "fails", paper=1, measured=0.0, lo=0.5)
    with pytest.raises(ClaimFailed, match="C3: measured 0, needed >= 0.5"):
        finish("99-test", mode="quick", seed=0, claims=[ok, bad], display=False)
    assert json.loads((results / "99-test.json").read_text())["claims"][1]["id"] == "C3"  # still written
    finish("99-test", mode="full", seed=1, claims=[ok], display=False)
    assert json.loads((results / "full" / "99-test.json").read_text())["mode"] == "full"
    assert not list(results.glob(".*.tmp"))


def test_finish_rejects_bad_input(results):
    c = Claim("C1", "x", paper=1, measured=1, hi=2)
    with pytest.raises(ValueError, match="unknown MODE"):
        finish("99-test", mode="bogus", seed=0, claims=[c], display=False)
    with pytest.raises(ValueError, match="duplicate"):
        finish("99-test", mode="quick", seed=0, claims=[c, c], display=False)
    with pytest.raises(ValueError, match="at least one claim"):
        finish("99-test", mode="quick", seed=0, claims=[], display=False)


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "r.json"
    provenance.write_json_atomic(path, {"a": 1})
    with pytest.raises(TypeError):
        provenance.write_json_atomic(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_table_is_rounded_text():
    text = report.claims_markdown([Claim("C1", "a|b", paper=-0.5, measured=-0.50412345, lo=-0.6, hi=-0.4)])
    row = text.splitlines()[2]
    verdict = f'<span style="white-space:nowrap">{report.swatch("Re")} **Re**</span>'
    assert row == f"| C1: a\\|b | paper | -0.5 | -0.5041 | [-0.6, -0.4] | yes | {verdict} |"
    noted = report.claims_markdown([Claim("C2", "x", paper=1, measured=1, lo=0, note="why | in full")])
    assert noted.endswith("Why, claim by claim:\n\n- **C2**: why | in full")


def test_an_infinite_measurement_is_refused_and_formatting_never_crashes():
    with pytest.raises(ValueError, match="C9: measured is inf"):
        Claim("C9", "ratio", paper=1.08, measured=float("inf"), lo=0.9)
    assert report.fmt(float("-inf")) == "-inf" and report.fmt(float("nan")) == "n/a"
    assert Claim("C9", "ratio", paper=1.08, measured=float("nan"), lo=0.9).verdict == "not Re"


def test_checks_pass_or_fail_and_are_counted_apart():
    ok = Claim("K1", "matches the public code", paper="pogo-torch 1.0.2", measured=1e-14, hi=1e-12, kind="check")
    bad = Claim("K2", "round trip", paper="exact", measured=1.0, hi=0.0, kind="check", asserted=False)
    assert (ok.verdict, bad.verdict) == ("pass", "fail")
    with pytest.raises(ValueError, match="kind"):
        Claim("C1", "x", paper=1, measured=1, hi=2, kind="reproduction")
    with pytest.raises(ValueError, match="analogue"):
        Claim("K3", "x", paper=1, measured=1, hi=2, kind="check", analogue=True)
    paper = Claim("C1", "x", paper=1, measured=1, hi=2, analogue=True)
    n = report.counts([ok, bad, paper])
    assert (n["pass"], n["fail"], n["~Re"], n["Re"]) == (1, 1, 1, 0)


def test_timing_claims_are_marked():
    fast = Claim("C9", "speed-up", paper=10, measured=3.21, lo=2, timing=True, asserted=False)
    text = report.claims_markdown([fast])
    assert f"3.21 {report.TIMING_MARK}" in text and f"**Re**</span> {report.TIMING_MARK}" in text
    assert "machine-dependent" in text


def test_run_config_savefig_and_finish(results):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = runtime.setup("99-test", "quick", seed=0, device_name="cpu")
    assert run.config(quick={"n": 10, "k": 2}, full={"n": 1000}) == {"n": 10, "k": 2}
    full = runtime.Run("99-test", "full", 0, torch.device("cpu"), run.rng)
    assert full.config(quick={"n": 10, "k": 2}, full={"n": 1000}) == {"n": 1000, "k": 2}
    with pytest.raises(KeyError, match="no quick-mode default"):
        run.config(quick={"n": 10}, full={"m": 1})
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    assert run.savefig(fig, "line") is None  # a cell may end with it: no path in the outputs
    assert (results / "figures" / "99-test" / "line.png").stat().st_size > 0
    with pytest.raises(ValueError, match="plain file stem"):
        run.savefig(fig, "../up")
    plt.close(fig)
    rec = run.finish([Claim("C1", "x", paper=1, measured=1, hi=2)], {"m": 1}, display=False)
    on_disk = json.loads((results / "99-test.json").read_text())
    assert on_disk["slug"] == "99-test" and rec["runtime_s"] >= 0 and on_disk["metrics"] == {"m": 1}


def test_finish_records_what_produced_the_result(results, tmp_path, monkeypatch):
    nb = tmp_path / "99-test.ipynb"
    nb.write_text(json.dumps({"cells": [{"cell_type": "code", "source": "x = 1", "metadata": {}, "outputs": []}],
                              "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    monkeypatch.setenv(provenance.NOTEBOOK_ENV, str(nb))  # as the batch runner sets it for its kernels
    ok = Claim("C1", "holds", paper=1, measured=1.0, lo=0.5)
    src = finish("99-test", mode="quick", seed=0, claims=[ok], display=False)["sources"]
    assert src["notebook"] == provenance.notebook_source_hash(nb)
    assert src["library"] == provenance.library_hash()
    assert src["library_files"]["repro/report.py"] == provenance.file_hash(provenance.library_dir() / "report.py")
    assert src["commit"] is None  # a notebook outside any checkout
    assert json.loads((results / "99-test.json").read_text())["sources"] == src


def test_claim_refuses_impossible_rules_and_values_that_are_not_numbers():
    import numpy as np

    for kwargs, message in [(dict(lo=float("nan")), "lo must be a number"), (dict(hi=float("nan")), "hi must be"),
                            (dict(lo=2, hi=0), "lies above hi"), (dict(lo="0.5"), "lo must be a number")]:
        with pytest.raises(ValueError, match=message):
            Claim("C4", "x", paper=1, measured=1.0, **kwargs)
    for bad in ("0.5", True, np.bool_(True), None, np.array([1.0, 2.0])):
        with pytest.raises(TypeError, match="C4: measured must be a real number"):
            Claim("C4", "x", paper=1, measured=bad, lo=0)
    assert Claim("C4", "x", paper=1, measured=np.float32(0.5), lo=0, hi=float("inf")).holds
    assert Claim("C4", "x", paper=1, measured=np.int64(3), lo=0).verdict == "Re"


def _noisy(x: int) -> tuple[int, float, float]:
    """Uses the global generators, so the result depends on the state each item starts from."""
    import numpy as np

    return x * x, float(torch.rand(1)), float(np.random.rand())  # noqa: NPY002 (the global state is the point)


@pytest.mark.parametrize("n_workers", [2, 3, 5])
def test_parallel_map_gives_the_serial_results_for_any_worker_count(n_workers):
    serial = runtime.parallel_map(_noisy, range(5), 1, seed=7)
    after_serial = float(torch.rand(1))
    assert [r[0] for r in serial] == [0, 1, 4, 9, 16]
    assert len({r[1] for r in serial}) == 5  # each item its own stream
    assert runtime.parallel_map(_noisy, range(5), n_workers, seed=7) == serial
    assert float(torch.rand(1)) == after_serial  # the state after the map does not depend on the workers
    assert runtime.parallel_map(_noisy, range(5), n_workers, seed=8) != serial


def test_parallel_map_takes_closures_and_raises_a_workers_error_with_its_traceback():
    offset = 10
    assert runtime.parallel_map(lambda x: x + offset, [1, 2, 3], 2) == [11, 12, 13]

    def bad(x):
        if x == 0:  # whichever process takes item 0
            raise ValueError("item zero is bad")
        return x

    with pytest.raises(RuntimeError, match=r"item 0 raised:\nValueError: item zero is bad\nTraceback"):
        runtime.parallel_map(bad, [0, 1], 2)
    with pytest.raises(RuntimeError, match=r"item 0 raised:\nValueError: item zero is bad"):
        runtime.parallel_map(bad, [0, 1], 1)
    with pytest.raises(ValueError, match="n_workers"):
        runtime.parallel_map(bad, [0, 1], 0)


def test_workers_reads_the_environment_and_refuses_nonsense(monkeypatch):
    monkeypatch.setenv(runtime.WORKERS_ENV, "3")
    assert runtime.workers() == 3
    monkeypatch.setenv(runtime.WORKERS_ENV, "0")
    with pytest.raises(ValueError, match="REPRO_WORKERS"):
        runtime.workers()
    monkeypatch.delenv(runtime.WORKERS_ENV)
    assert runtime.workers() >= 1


def test_parallel_map_balances_the_load_dynamically():
    """Each process takes the next item when it is free: one slow item first and four quick ones go 1 / 4 between
    two processes (a static split would give each two or three), and the results keep the items' order."""
    def work(x):
        time.sleep(1.5 if x == 0 else 0.05)
        return x, os.getpid()

    out = runtime.parallel_map(work, range(5), 2)
    assert [x for x, _ in out] == [0, 1, 2, 3, 4]
    slow = out[0][1]
    assert [pid for _, pid in out[1:]].count(slow) == 0


def test_run_map_is_the_plain_loop_outside_quick_mode_on_cpu(monkeypatch):
    monkeypatch.setenv(runtime.WORKERS_ENV, "2")
    pids = runtime.setup("05-linear-contracts", "quick", 0, "cpu").map(lambda _: (time.sleep(0.3), os.getpid())[1],
                                                                        [0, 1])
    assert len(set(pids)) == 2 and os.getpid() in pids  # a forked worker and this process, one item each
    full = runtime.setup("05-linear-contracts", "full", 0, "cpu")
    assert full.map(lambda _: os.getpid(), [0, 1]) == [os.getpid()] * 2


def test_full_mode_overrides_keep_their_kind_and_the_resolved_config_is_recorded(results):
    full = runtime.setup("99-test", "full", 0, "cpu")
    with pytest.raises(TypeError, match=r"n \(number in quick mode, str in full\)"):
        full.config(quick=dict(n=10, name="a"), full=dict(n="100"))
    with pytest.raises(TypeError, match="flag"):
        full.config(quick=dict(flag=False), full=dict(flag=1))  # a bool is not a number here
    cfg = full.config(quick=dict(n=10, lr=0.1, sizes=(1, 2), opt=None), full=dict(n=100, lr=1, sizes=[3], opt="x"))
    assert cfg == dict(n=100, lr=1, sizes=[3], opt="x")
    quick = runtime.setup("99-test", "quick", 0, "cpu")
    quick.config(quick=dict(n=10, sizes=(1, 2), f=float("nan"), d={1: np.float32(0.5)}), full=dict(n=100))
    rec = quick.finish([Claim("C1", "x", paper=1, measured=1, lo=0, hi=2)], display=False)
    assert rec["config"] == {"n": 10, "sizes": [1, 2], "f": "nan", "d": {"1": repr(np.float32(0.5))}}
    assert json.loads(json.dumps(rec["config"])) == rec["config"]


# ------------------------------------------------------------------------------ the smoke tier (issue 42 item 1)

QUICK = dict(n=100, seeds=1, steps=500, grid=[1, 2, 4], llm=False, arms=["a"], name="x", opt=None,
             tasks={"a": dict(steps=50, kind="maf", hidden=(64, 64)), "b": dict(steps=50, kind="maf", hidden=(64, 64))})
FULL = dict(n=10_000, seeds=5, steps=6000, grid=[1, 2, 4, 8, 16], llm=True, arms=["a", "b"], opt="x",
            tasks={"a": dict(steps=900, kind="nsf", hidden=(128, 128)),
                   "b": dict(steps=900, kind="nsf", hidden=(8, 8))})


def test_the_smoke_tier_is_full_mode_cut_small(results):
    smoke = runtime.setup("99-test", "smoke", 0, "cpu")
    assert smoke.full and not smoke.quick and runtime.setup("99-test", "full", 0, "cpu").full
    assert not runtime.setup("99-test", "quick", 0, "cpu").full
    cfg = smoke.config(quick=QUICK, full=FULL, smoke=dict(n=50, seeds=2, steps=3, grid=[1, 2],
                                                          tasks={"a": dict(steps=5, hidden=(8, 8))}))
    # every switch full mode sets is kept; the cuts apply, nested ones key by key (task b keeps full mode's)
    assert cfg == {**QUICK, **FULL, "n": 50, "seeds": 2, "steps": 3, "grid": [1, 2],
                   "tasks": {"a": dict(steps=5, kind="nsf", hidden=(8, 8)), "b": FULL["tasks"]["b"]}}
    assert smoke.settings == cfg  # recorded in the results file like any mode's
    # quick and full mode ignore the cuts, but check them: a broken smoke tier fails in every mode
    quick = runtime.setup("99-test", "quick", 0, "cpu")
    assert quick.config(quick=QUICK, full=FULL, smoke=dict(n=50)) == QUICK
    with pytest.raises(KeyError, match="smoke.tasks.c is not a setting of full mode"):
        quick.config(quick=QUICK, full=FULL, smoke=dict(tasks={"c": dict(steps=1)}))


@pytest.mark.parametrize("cut, why", [
    (dict(llm=False), "a bool switch"),
    (dict(arms=["a"]), "a list of names (arms)"),
    (dict(opt=None), "a string switch"),
    (dict(tasks={"a": dict(kind="maf")}), "a nested switch"),
    (dict(tasks=dict(steps=1)), "a mapping's keys"),
    (dict(seeds=1), "a count crossing 1 (the spread over seeds)"),
    (dict(n=0), "a count crossing 0 (a part switched off)"),
    (dict(grid=[4]), "a list cut to one element"),
    (dict(grid=[]), "a list cut to none"),
    (dict(n=[1, 2]), "a number replaced by a list"),
])
def test_the_smoke_tier_cannot_switch_off_what_full_mode_runs(results, cut, why):
    smoke = runtime.setup("99-test", "smoke", 0, "cpu")
    with pytest.raises((TypeError, KeyError), match="smoke"):
        smoke.config(quick=QUICK, full=FULL, smoke=cut)


def test_the_smoke_tier_writes_its_own_results_and_asserts_nothing(results, capsys):
    smoke = runtime.setup("99-test", "smoke", 0, "cpu")
    smoke.config(quick=dict(n=1), full=dict(n=20), smoke=dict(n=2))
    failing = Claim("C1", "x", paper=1, measured=5, hi=2)  # asserted, and it does not hold
    rec = smoke.finish([failing], display=True)
    assert rec["mode"] == "smoke" and rec["claims"][0]["holds"] is False
    assert json.loads((results / "smoke" / "99-test.json").read_text())["mode"] == "smoke"
    assert not (results / "99-test.json").exists()
    assert "no claim is asserted" in capsys.readouterr().out
    quick = runtime.setup("99-test", "quick", 0, "cpu")
    with pytest.raises(ClaimFailed):
        quick.finish([failing], display=False)


def test_full_mode_records_an_asserted_claim_that_fails_at_scale(results, capsys):
    """Issue 42: a verdict at full scale that differs from quick mode's (06's C1) is a finding the book shows, so
    full mode writes it and succeeds instead of failing the run (which would leave the record in results/logs/)."""
    failing = Claim("C1", "x", paper=1, measured=5, hi=2)
    rec = runtime.setup("99-test", "full", 0, "cpu").finish([failing], display=True)
    assert rec["mode"] == "full" and rec["claims"][0]["holds"] is False and rec["claims"][0]["asserted"] is True
    assert json.loads((results / "full" / "99-test.json").read_text())["claims"][0]["holds"] is False
    assert "1 claim(s) asserted in quick mode do not hold at this scale (C1: measured 5" in capsys.readouterr().out
