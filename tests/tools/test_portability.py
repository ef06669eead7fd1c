"""The machine emulation (python -m repro portability): kernels get QUICK_ENV with B's overrides and this checkout's
library; claims and verdicts are compared exactly (NaN equal to NaN, timing claims aside); end to end on a tiny
notebook, two runs in one environment are identical, and an environment whose sigmoid kernel differs is named as the
first differing operation (though the claim, a sum, rounds alike)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from fixture_notebooks import make_notebook

from repro.tools import portability, portable, trace


def _claim(cid, measured, verdict="Re", holds=True, timing=False):
    return {"id": cid, "measured": measured, "verdict": verdict, "holds": holds, "timing": timing}


def _run(claims, metrics=None, status="ok"):
    return portability.RunResult("x", {}, status, 1.0, {"claims": claims, "metrics": metrics or {}})


def test_kernel_env_is_quick_env_with_the_overrides(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv(trace.ENV, "/tmp/leftover.trace")
    env = portability.kernel_env(tmp_path, {"ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_CBWR": ""}, tmp_path / "res")
    assert env["ONEDNN_MAX_CPU_ISA"] == "SSE41"
    assert "MKL_CBWR" not in env  # an empty value unsets
    assert all(env[k] == v for k, v in portable.QUICK_ENV.items() if k not in ("ONEDNN_MAX_CPU_ISA", "MKL_CBWR"))
    assert env["PYTHONPATH"].split(":")[0] == str(tmp_path / "lib") and "/elsewhere" in env["PYTHONPATH"]
    assert trace.ENV not in env  # the runs decide whether they are traced
    assert env["REPRO_RESULTS_DIR"] == str(tmp_path / "res")


def test_claims_are_compared_exactly():
    base = [_claim("C1", 0.5), _claim("C2", math.nan), _claim("C3", 2.0, timing=True), _claim("C4", [1.0, 2.0])]
    same = portability.compare_results("nb", _run(base), _run([dict(c) for c in base]))
    assert same.verdict == "identical" and not same.changed
    other = [_claim("C1", 0.5 + 1e-16), _claim("C2", math.nan), _claim("C3", 3.0, timing=True),
             _claim("C4", [1.0, 2.0])]
    c = portability.compare_results("nb", _run(base), _run(other))
    assert c.verdict == "values differ" and [x[0] for x in c.changed] == ["C1"]  # timing claims aside
    assert 0 < c.max_rel < 1e-15
    flipped = [_claim("C1", 0.4, verdict="not Re", holds=False), *base[1:]]
    c = portability.compare_results("nb", _run(base), _run(flipped, status="failed"))
    assert c.verdict == "verdicts differ" and c.verdicts == [("C1", "Re", "not Re")]
    assert "C1 Re -> not Re" in c.line()
    m = portability.compare_results("nb", _run(base, {"a": {"b": [1.0, 2.0]}, "fit": {"seconds": 1.0, "train_s": 2}}),
                                    _run(base, {"a": {"b": [1.0, 2.5]}, "fit": {"seconds": 1.5, "train_s": 3}}))
    assert m.verdict == "values differ" and (m.metrics_changed, m.metrics_total) == (1, 2)  # timings aside
    assert [k for k in ("fit.seconds", "train_s", "stage_decode_s_scan0", "slice_us_per_node", "decision_time",
                        "time_to_target.steps", "S-only.mAP", "arms.oracle.S_src[0]") if portability.is_timing(k)] \
        == ["fit.seconds", "train_s", "stage_decode_s_scan0", "slice_us_per_node"]
    assert portability.compare_results("nb", _run(base), portability.RunResult("x", {}, "failed", 1.0)).verdict \
        == "failed"


NOTEBOOK = (
    "import torch\n"
    "from repro import runtime\n"
    "from repro.report import Claim\n"
    "run = runtime.setup('{stem}', MODE, SEED)\n"
    "x = torch.tensor([i / 997.0 - 3.0 for i in range(4000)])  # built in Python: the same bits everywhere\n"
    "y = (x * 1.5).sigmoid()\n"
    "total = float(y.sum())  # the same float in both: the claims agree, the tensors do not\n"
    "run.finish([Claim('C1', 'sum', paper=1, measured=total, lo=0, asserted=False)], display=False)"
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "lib").symlink_to(Path(portability.__file__).resolve().parents[2])  # this checkout's library
    make_notebook(tmp_path, "01-tiny", NOTEBOOK)
    return tmp_path


def test_reruns_are_identical_and_an_other_sigmoid_kernel_is_found(root, tmp_path):
    nb = root / "notebooks" / "01-tiny.ipynb"
    scratch = tmp_path / "scratch"
    same = portability.compare(root, nb, {}, scratch)
    assert same.a.status == same.b.status == "ok", (same.a.error, same.b.error)
    assert same.verdict == "identical" and same.trace_identical is None, same.line()
    assert not (root / "results").exists()  # everything went to the scratch folders
    # ATen without AVX2: a scalar sigmoid instead of the vectorised one, other last bits
    c = portability.compare(root, nb, portability.PRESETS["aten-default"], scratch, traced=True)
    assert c.verdict == "identical" and c.trace_identical is False, c.line()  # the sum happens to round alike
    assert "intermediate tensors differ" in c.line()
    assert "aten.sigmoid.default" in c.trace_report and "cell 4:6" in c.trace_report  # the 6th line of cell 4
    assert "aten.mul.Tensor" not in c.trace_report.split("first difference")[1].splitlines()[1]
    assert "REPRO_TRACE_AT=1" in c.trace_report  # dumping it: tests/tools/test_trace.py
    assert c.b.status == "ok" and (scratch / "01-tiny" / "B-trace" / "01-tiny.trace.op1.pt").exists()  # stopped
    results = json.loads((scratch / "01-tiny" / "A" / "results" / "01-tiny.json").read_text())
    assert results["claims"][0]["id"] == "C1"
