"""The divergence tracer (repro.tools.trace): identical runs give identical traces; a kernel that computes other
bits is named as the first differing operation, with its call site; its dump shows identical inputs."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from repro.tools import trace


def _work() -> float:
    """A tiny training step: matmul, a nonlinearity, a loss, backward, an SGD update, .item()."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 8, generator=g)
    w = torch.randn(8, 4, generator=g, requires_grad=True)
    h = torch.tanh(x @ w)
    z = h.exp()
    loss = (z - 1).pow(2).mean()
    loss.backward()
    with torch.no_grad():
        w -= 0.1 * w.grad
    return float(((x @ w).exp()).sum().item())


class _OneUlpExp(TorchDispatchMode):
    """An 'other machine': its exp kernel rounds the other way in the last bit."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.exp.default:
            out = torch.nextafter(out, torch.full_like(out, float("inf")))
        return out


def _record(path, perturb: bool = False, **kw) -> float:
    outer = _OneUlpExp() if perturb else None
    if outer is not None:
        outer.__enter__()  # below the tracer's mode: the tracer sees the perturbed output, as from a kernel
    try:
        trace.install(path, **kw)
        try:
            return _work()
        finally:
            trace.uninstall()
    finally:
        if outer is not None:
            outer.__exit__(None, None, None)


def test_identical_runs_give_identical_traces(tmp_path):
    a, b = tmp_path / "a.trace", tmp_path / "b.trace"
    assert _record(a) == _record(b)
    d = trace.diff(a, b)
    assert d.identical, d.report()
    assert d.ops_a == d.ops_b > 10
    assert "identical" in d.report()
    text = a.read_text()
    assert "aten.mm.default" in text and "backward MmBackward0" in text
    assert "test_trace.py:" in text  # outside lib/repro and a notebook, the innermost caller is the site


def test_a_perturbed_kernel_is_named_with_its_site(tmp_path):
    a, b = tmp_path / "a.trace", tmp_path / "b.trace"
    _record(a)
    _record(b, perturb=True)
    d = trace.diff(a, b)
    assert d.kind == "values"
    la, lb = d.first_op
    assert la.name == lb.name == "aten.exp.default"
    assert la.sig == "(f32[16,4])->f32[16,4]"
    assert la.hash != lb.hash
    lines = a.read_text().splitlines()
    ops_before = [ln for ln in lines if ln.split("\t")[1] == "op" and int(ln.split("\t")[0]) < la.n]
    assert any("aten.tanh.default" in ln for ln in ops_before)  # everything upstream agreed
    assert "aten.exp.default" in d.report() and f"REPRO_TRACE_AT={la.n}" in d.report()
    assert "_work" in la.where

    # isolate it: dump op n in both "environments"; the dump shows identical inputs, outputs 1 ulp apart
    for path, perturb in ((a, False), (b, True)):
        with pytest.raises(trace.TraceStop):
            _record(path, perturb=perturb, at=la.n)
    dumps = [p.with_name(f"{p.name}.op{la.n}.pt") for p in (a, b)]
    report = trace.compare_dumps(*dumps)
    assert "inputs[0][0]: identical" in report
    assert "max 1 ulp" in report
    assert "inputs are identical" in report
    assert torch.equal(trace.replay(dumps[0]), torch.load(dumps[0], weights_only=False)["outputs"])
    assert "exp" in dumps[0].with_suffix(".txt").read_text()


def test_digest_of_values():
    x = np.arange(6.0).reshape(2, 3)
    assert trace.digest(x) == trace.digest(x.copy()) != trace.digest(x.T.copy())
    y = x.copy()
    y[0, 0] = np.nextafter(0.0, 1.0)
    assert trace.digest(y) != trace.digest(x)
    assert trace.digest({"a": 0.1, "b": [1, 2]}) == trace.digest({"a": 0.1, "b": [1, 2]})
    assert trace.digest(0.1) != trace.digest(0.1 + 1e-17 + 2**-56)
    m = torch.nn.Linear(2, 2)
    assert trace.digest(m) == trace.digest(m.state_dict())
    assert trace.digest(object()) is None


def test_importing_the_tracer_imports_no_torch():
    code = "import sys, repro.tools.trace; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_run_traced_against_a_reference_stops_at_its_first_difference(tmp_path):
    a, b = tmp_path / "a.trace", tmp_path / "b.trace"
    _record(a)
    with pytest.raises(trace.TraceStop, match="aten.exp.default"):
        _record(b, perturb=True, against=a)
    n = trace.diff(a, b).first_op[0].n
    assert b.read_text().splitlines()[-1].split("\t")[:3] == [str(n), "op", "aten.exp.default"]  # stopped there
    with pytest.raises(trace.TraceStop):
        _record(tmp_path / "a-at.trace", at=n)  # the reference, up to that operation
    report = trace.compare_dumps(tmp_path / f"a-at.trace.op{n}.pt", tmp_path / f"b.trace.op{n}.pt")
    assert "inputs are identical" in report and "max 1 ulp" in report
    _record(tmp_path / "c.trace", against=a)  # an identical run goes to its end
    assert trace.diff(a, tmp_path / "c.trace").identical
