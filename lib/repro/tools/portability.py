"""Emulate another machine on this one (issue 44): run a notebook's quick mode under two numeric environments and
compare every claim value and verdict, optionally every intermediate tensor (:mod:`repro.tools.trace`).

``python -m repro portability --only 14 [--b other] [--trace] [--isolate] [--keep DIR]``

Environment A is the portable quick-mode environment (:data:`repro.tools.portable.QUICK_ENV`); environment B is A
with the overrides of a preset (:data:`PRESETS`, ``--b NAME``) or of ``--set KEY=VALUE``. Each notebook is
executed with papermill (the batch runner's client, :mod:`repro.tools.launcher`) in a scratch folder laid out
like a checkout (as a cluster task is), with ``$REPRO_RESULTS_DIR`` in that folder: nothing is written into
``results/`` or ``notebooks/``. The kernels import the library of this checkout (``lib/`` first on
``PYTHONPATH``). Per notebook it prints one of

* ``identical``: every claim value and verdict, and every metric, the same (timing claims and metrics aside);
* ``values differ``: the largest relative change of a claim value, and which claims;
* ``verdicts differ``: which claims changed verdict (the acceptance criterion of issue 44 forbids it).

``--b committed`` compares A with the committed results instead (the machine that made them is a real other
machine); ``--b none`` runs B as A (two runs, same environment: bit-identical reruns).

With ``--trace`` A runs traced, and B runs once more traced against A's trace, stopping at the first operation it
computes differently, which is named (op, shapes, call site in ``lib/repro``, notebook cell) and dumped;
``--isolate`` then reruns A up to that operation, dumps it too and says whether the inputs were identical (then
this kernel depends on the environment) and by how many ulps the outputs differ. B's claims always come from an
untraced run.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import batch, execute, launcher, offline, paths, portable, provenance, trace

# Environment B: overrides on top of QUICK_ENV that emulate another x86-64 machine (see the module docstring of
# repro.tools.portable for what each cap governs). Lower caps change every kernel that honours them; a result that
# changes is computed by an ISA-dependent kernel.
PRESETS: dict[str, dict[str, str]] = {
    # NumPy's own SIMD loops as on a CPU without AVX-512 (einsum, sorting, ufunc loops): QUICK_ENV caps them
    "npy-avx2": {"NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR"},
    # oneDNN (convolutions, when torch uses it) on SSE4.1 kernels: other blocking, as another cache size gives
    "onednn-sse41": {"ONEDNN_MAX_CPU_ISA": "SSE41"},
    # ATen's vectorised kernels compiled without AVX (scalar libm instead of Sleef)
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
    # OpenBLAS (NumPy, SciPy, scikit-learn) with another CPU's kernels
    "openblas-sandybridge": {"OPENBLAS_CORETYPE": "Sandybridge"},
    # MKL (torch's BLAS/LAPACK) on its SSE4.2 branch (on an AMD CPU: AUTO, MKL honours its ISA branches on Intel only)
    "mkl-sse42": {"MKL_CBWR": "SSE4_2,STRICT"},
    # MKL's own choice of kernels for this CPU (AUTO): what a machine of the other vendor runs, against COMPATIBLE
    "mkl-auto": {"MKL_CBWR": "AUTO"},
    # the one MKL branch Intel and AMD both run (QUICK_ENV's since issue 44; against BEFORE_44's AVX2,STRICT)
    "mkl-compatible": {"MKL_CBWR": "COMPATIBLE"},
}
# the environment before issue 44's fixes (the committed outputs): B = the unfixed code, for the cost of the fixes
PRESETS["before-44"] = dict(portable.BEFORE_44)
# what another AVX2 machine can change that QUICK_ENV must absorb: oneDNN's blocking, NumPy's AVX-512 loops, MKL's
# dispatch on a CPU with fewer features
PRESETS["other"] = {**PRESETS["npy-avx2"], **PRESETS["onednn-sse41"], "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
TIMEOUT = 900.0
# metrics that are timings (machine- and load-dependent, never compared), by the words of their keys
TIMING_RE = re.compile(r"seconds|elapsed|speedup|throughput|(?:^|_)(?:us|ms)_per|_s$|_s_")


@dataclass
class RunResult:
    """One papermill run of one notebook under one environment."""

    label: str
    env: dict[str, str]
    status: str  # ok | failed | timeout
    seconds: float
    results: dict[str, Any] | None = None
    error: str | None = None
    trace: Path | None = None
    folder: Path | None = None


@dataclass
class Comparison:
    notebook: str
    a: RunResult
    b: RunResult
    verdict: str  # identical | values differ | verdicts differ | failed
    changed: list[tuple[str, Any, Any, float]] = field(default_factory=list)  # (claim, A, B, rel change)
    verdicts: list[tuple[str, str, str]] = field(default_factory=list)
    metrics_changed: int = 0
    metrics_total: int = 0
    max_rel: float = 0.0
    trace_report: str | None = None
    trace_identical: bool | None = None  # None: not traced
    isolate_report: str | None = None

    def line(self) -> str:
        t = f"{self.a.seconds:6.1f}/{self.b.seconds:6.1f} s"
        if self.verdict == "failed":
            err = (self.a.error if self.a.status != "ok" else self.b.error) or ""
            return f"{self.notebook:36s} {t}  run failed: A {self.a.status}, B {self.b.status}: {err[:300]}"
        if self.verdict == "identical":
            inner = {None: "", True: ", every traced tensor too", False: "; intermediate tensors differ"}
            return f"{self.notebook:36s} {t}  identical ({self.metrics_total} metrics){inner[self.trace_identical]}"
        claims = ", ".join(f"{c} {_fmt(x)} -> {_fmt(y)}" for c, x, y, _ in self.changed[:8])
        more = f" (+{len(self.changed) - 8} more)" if len(self.changed) > 8 else ""
        verdicts = "; verdicts: " + ", ".join(f"{c} {x} -> {y}" for c, x, y in self.verdicts) if self.verdicts else ""
        return (f"{self.notebook:36s} {t}  {self.verdict}: max rel change {self.max_rel:.3g}; "
                f"{len(self.changed)} claims: {claims}{more}{verdicts}; metrics differing "
                f"{self.metrics_changed}/{self.metrics_total}")


def _fmt(x: Any) -> str:
    return f"{x:.6g}" if isinstance(x, float) else repr(x)


def kernel_env(root: Path, overrides: Mapping[str, str], results: Path) -> dict[str, str]:
    """The environment a kernel of this comparison runs in: the batch runner's quick-mode environment (QUICK_ENV,
    offline, headless, results in ``results``) with ``overrides`` on top (an empty value unsets the variable) and
    this checkout's library first."""
    env = {**os.environ, paths.RESULTS_ENV: str(results), "PYTHONHASHSEED": "0", "REPRO_HEADLESS": "1"}
    env.setdefault(offline.ENV, "1")
    for key in (trace.ENV, trace.AT_ENV, trace.OPS_ENV, trace.STOP_ENV, launcher.PARENT_ENV):
        env.pop(key, None)
    env.update(portable.QUICK_ENV)
    for key, value in overrides.items():  # KEY= (empty): the kernel runs without KEY
        if value:
            env[key] = value
        else:
            env.pop(key, None)
    lib = str(root / "lib")
    env["PYTHONPATH"] = os.pathsep.join([lib, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                 if p and p != lib]])
    return env


def run_notebook(root: Path, notebook: Path, label: str, overrides: Mapping[str, str], scratch: Path,
                 trace_log: bool = False, at: int | None = None, against: Path | None = None,
                 timeout: float = TIMEOUT) -> RunResult:
    """Execute ``notebook`` in quick mode in ``scratch/label`` (a folder laid out like a checkout); traced with
    ``trace_log``, up to operation ``at`` (dumped), or up to the first operation that differs from the trace
    ``against`` (dumped)."""
    folder = scratch / label
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "notebooks").mkdir(parents=True)
    results = paths.checkout_results(folder)
    results.mkdir()
    (folder / "lib" / "repro").mkdir(parents=True)  # registry.find() takes this folder for the book's root
    (folder / "book").mkdir()
    if (root / "book" / "papers.yml").exists():
        shutil.copy(root / "book" / "papers.yml", folder / "book" / "papers.yml")
    nb = folder / "notebooks" / notebook.name
    shutil.copy(notebook, nb)
    env = kernel_env(root, overrides, results)
    env[provenance.NOTEBOOK_ENV] = str(nb)
    log = folder / f"{notebook.stem}.trace"
    if trace_log or at is not None or against is not None:
        env[trace.ENV] = str(log)
        if at is not None:
            env[trace.AT_ENV] = str(at)
        if against is not None:
            env[trace.AGAINST_ENV] = str(against)
    out = folder / "executed.ipynb"
    cmd = launcher.command(nb, out, "quick", 0)
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=str(folder), start_new_session=True)
    try:
        text = execute.wait(proc, timeout, None)
        status = "ok" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        execute.kill_tree(proc.pid)
        text, _ = proc.communicate()
        status = "timeout"
    seconds = time.time() - start
    res_file = paths.results_file(notebook.stem, "quick", results)
    results = json.loads(res_file.read_text()) if res_file.exists() else None
    error = None if status == "ok" else execute.error_of(out, text or "")
    return RunResult(label, dict(overrides), status, round(seconds, 1), results, error,
                     log if log.exists() else None, folder)


def _same(x: Any, y: Any) -> bool:
    """Equal, NaN included (a claim that measured NaN in both agrees)."""
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    if isinstance(x, list | tuple) and isinstance(y, list | tuple):
        return len(x) == len(y) and all(_same(u, v) for u, v in zip(x, y, strict=True))
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    return x == y


def _rel(x: float, y: float) -> float:
    if _same(x, y):
        return 0.0
    if math.isnan(x) or math.isnan(y):
        return math.inf
    return abs(x - y) / max(abs(x), abs(y), 1e-300)


def _numbers(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten a metrics tree to ``{path: leaf}``."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_numbers(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(obj, list):
        out = {}
        for i, v in enumerate(obj):
            out.update(_numbers(v, f"{prefix}[{i}]"))
        return out
    return {prefix: obj}


def is_timing(key: str) -> bool:
    """A metric key that names a timing (``fit.seconds``, ``train_s``, ``stage_decode_s_scan0``,
    ``slice_us_per_node``); ``decision_time``, ``time_to_target.steps`` or ``S-only`` are not."""
    return any(TIMING_RE.search(w) for w in re.split(r"[^a-z0-9_]+", key.lower()))


def _change(x: Any, y: Any) -> float:
    if isinstance(x, int | float) and isinstance(y, int | float) and not isinstance(x, bool):
        return _rel(float(x), float(y))
    return 0.0 if _same(x, y) else math.inf


def compare_results(name: str, a: RunResult, b: RunResult) -> Comparison:
    """Claim by claim (timing claims aside): values, verdicts; then the metrics."""
    c = Comparison(name, a, b, "failed")
    if a.results is None or b.results is None:
        return c
    ca = {x["id"]: x for x in a.results["claims"] if not x.get("timing")}
    cb = {x["id"]: x for x in b.results["claims"] if not x.get("timing")}
    for cid in sorted(set(ca) | set(cb), key=lambda s: (len(s), s)):
        x, y = ca.get(cid, {}), cb.get(cid, {})
        if not _same(x.get("measured"), y.get("measured")):
            rel = _change(x.get("measured"), y.get("measured"))
            c.changed.append((cid, x.get("measured"), y.get("measured"), rel))
            c.max_rel = max(c.max_rel, rel)
        if x.get("verdict") != y.get("verdict") or x.get("holds") != y.get("holds"):
            c.verdicts.append((cid, f"{x.get('verdict')}", f"{y.get('verdict')}"))
    ma, mb = (_numbers(r.results.get("metrics") or {}) for r in (a, b))  # type: ignore[union-attr]
    ma, mb = ({k: v for k, v in m.items() if not is_timing(k)} for m in (ma, mb))
    c.metrics_total = len(set(ma) | set(mb))
    c.metrics_changed = sum(not _same(ma.get(k), mb.get(k)) for k in set(ma) | set(mb))
    c.verdict = ("verdicts differ" if c.verdicts else "values differ" if c.changed or c.metrics_changed
                 else "identical")
    if a.status != "ok" or b.status != "ok":  # e.g. an asserted claim failed in one of them
        c.verdict = "verdicts differ" if c.verdicts else c.verdict
    return c


def committed(root: Path, notebook: Path) -> RunResult:
    """The committed quick-mode results of ``notebook`` (``results/NN-slug.json``, read only) as a run: the
    machine that made them is a real other machine."""
    path = paths.results_file(notebook.stem, "quick", paths.checkout_results(root))
    results = json.loads(path.read_text()) if path.exists() else None
    return RunResult("committed", {}, "ok" if results else "failed", float(results.get("runtime_s") or 0)
                     if results else 0.0, results, None if results else f"no {path.name}")


def compare(root: Path, notebook: Path, b_env: Mapping[str, str] | None, scratch: Path, traced: bool = False,
            isolate: bool = False, a_env: Mapping[str, str] | None = None, timeout: float = TIMEOUT,
            echo: Any = None) -> Comparison:
    """Run ``notebook`` under A (QUICK_ENV with ``a_env``) and B (QUICK_ENV with ``b_env``), one after the other,
    and compare (see the module docstring)."""
    say = echo or (lambda *_: None)
    work = scratch / notebook.stem
    a = run_notebook(root, notebook, "A", a_env or {}, work, trace_log=traced, timeout=timeout)
    say(f"  A {a.status} in {a.seconds:.0f} s")
    if b_env is None:  # B: the committed results, made on another machine
        b = committed(root, notebook)
        traced = isolate = False
    else:
        b = run_notebook(root, notebook, "B", b_env, work, timeout=timeout)
        say(f"  B {b.status} in {b.seconds:.0f} s")
    c = compare_results(notebook.stem, a, b)
    if traced and a.trace and b_env is not None:
        # B again, traced against A's trace: it stops at the first operation it computes differently, dumped
        bt = run_notebook(root, notebook, "B-trace", b_env, work, against=a.trace, timeout=timeout)
        say(f"  B traced against A: {bt.seconds:.0f} s")
        if bt.trace is None:
            c.trace_report = f"B's traced run wrote no trace ({bt.status}: {bt.error})"
            return c
        d = trace.diff(a.trace, bt.trace)
        c.trace_report = d.report()
        c.trace_identical = d.identical
        if isolate and d.kind == "values" and d.first_op and d.first_op[0]:
            n = d.first_op[0].n
            at = run_notebook(root, notebook, "A-at", a_env or {}, work, at=n, timeout=timeout)
            say(f"  A dumped op {n} in {at.seconds:.0f} s")
            dumps = [at.folder / f"{notebook.stem}.trace.op{n}.pt", bt.folder / f"{notebook.stem}.trace.op{n}.pt"]
            if all(p.exists() for p in dumps):
                c.isolate_report = trace.compare_dumps(*dumps)
    return c


def parse_set(values: list[str]) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep or not key:
            raise ValueError(f"--set takes KEY=VALUE, got {v!r}")
        out[key] = val
    return out


def main(root: Path, only: list[str] | None, preset: str = "other", sets: list[str] | None = None,
         a_sets: list[str] | None = None, traced: bool = False, isolate: bool = False, keep: str | None = None,
         timeout: float = TIMEOUT) -> int:
    """The ``python -m repro portability`` command: exit 0 if no notebook changed a verdict (or failed in one
    environment only), 1 otherwise."""
    if preset not in (*PRESETS, "committed", "none"):
        raise ValueError(f"unknown preset {preset!r}; presets: {', '.join(PRESETS)}, none, committed")
    b_env: dict[str, str] | None = {**PRESETS.get(preset, {}), **parse_set(sets or [])}
    if preset == "committed":
        b_env = None
    a_env = parse_set(a_sets or [])
    notebooks = batch.discover(root, only)
    scratch = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="repro-portability-"))
    scratch.mkdir(parents=True, exist_ok=True)
    b_text = "the committed results/ (read only)" if b_env is None else f"QUICK_ENV with {b_env}"
    print(f"A: QUICK_ENV {a_env or ''}\nB: {b_text}\nscratch: {scratch}", flush=True)
    bad = 0
    try:
        for nb in notebooks:
            print(f"{nb.stem} ...", flush=True)
            c = compare(root, nb, b_env, scratch, traced=traced or isolate, isolate=isolate, a_env=a_env,
                        timeout=timeout, echo=lambda s: print(s, flush=True))
            print(c.line(), flush=True)
            for extra in (c.trace_report, c.isolate_report):
                if extra:
                    print("  " + extra.replace("\n", "\n  "), flush=True)
            bad += c.verdict in ("verdicts differ", "failed") and not (
                c.a.status == c.b.status == "failed" and not c.verdicts)
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)
    return 1 if bad else 0
