"""Divergence tracer: hash what every torch operation computes in a run, compare two runs, name the first operation
whose output differs (issue 44: which kernel makes quick mode give other numbers on another CPU).

Record: with ``$REPRO_TRACE=/path/run.trace`` set, :func:`repro.runtime.setup` calls :func:`install_if_requested`,
which pushes a ``TorchDispatchMode``: every ATen operation from then on (forward and backward, optimizer steps,
``.item()``) appends one line to the log ::

    <n>  op   aten.convolution.default  f32[8,3,32,32],f32[16,3,3,3]->f32[8,16,32,32]  <hash>  <where>

``<hash>`` hashes the bytes of the outputs (of the written arguments for in-place operations that return nothing;
the value for scalars); view operations are not logged (they compute nothing). ``<where>`` is the innermost frame
in ``lib/repro``, the notebook cell and line (``cell 7:12``), and the autograd node when the operation runs in a
backward pass. In a notebook (IPython), every cell boundary also logs a ``var`` line per variable of the user
namespace (arrays, tensors, numbers, modules' state, lists/dicts of them): this catches NumPy/SciPy/scikit-learn
divergence, which the dispatch mode cannot see. ``$REPRO_TRACE_OPS=0`` logs only those (cheap).

Compare: :func:`diff` (``python -m repro trace-diff A B``) walks two logs in step and reports the first line that
differs, with its op, shapes, call site and cell, and the first differing variable.

Isolate: ``$REPRO_TRACE_AT=<n>`` (with ``$REPRO_TRACE``) saves operation ``n``'s inputs (before it ran), outputs and
full Python stack to ``<log>.op<n>.pt`` and, unless ``$REPRO_TRACE_STOP=0``, stops the run there (raises
:class:`TraceStop`). ``$REPRO_TRACE_AGAINST=<reference log>`` does the same at the first operation whose output
differs from the reference run's (then run the reference again with ``$REPRO_TRACE_AT`` at that index): a run in
another environment stops where it diverges instead of running to its end. :func:`compare_dumps` of the two
environments' dumps says whether the inputs were identical (then this kernel is the one that depends on the
environment) and by how much the outputs differ; :func:`replay` re-runs the saved operation in this process (to try
a fix in isolation).

Imports no torch at module import (``repro.tools`` never does); :func:`install` imports it.
"""

from __future__ import annotations

import atexit
import hashlib
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV = "REPRO_TRACE"
OPS_ENV = "REPRO_TRACE_OPS"
AT_ENV = "REPRO_TRACE_AT"
AGAINST_ENV = "REPRO_TRACE_AGAINST"
STOP_ENV = "REPRO_TRACE_STOP"

_LIB = str(Path(__file__).resolve().parents[1])  # .../lib/repro
_SELF = str(Path(__file__).resolve())
_SKIP_OPS = {"aten.detach.default", "aten.lift_fresh.default", "aten.alias.default", "prim.device.default"}
_FLUSH_EVERY = 20000

_tracer: Tracer | None = None


class TraceStop(RuntimeError):
    """Raised at operation ``$REPRO_TRACE_AT`` once its dump is written: the rest of the run is not needed."""


# ---------------------------------------------------------------------------------------------------- hashing


def _hash_tensor(t: Any, h: Any) -> None:
    import torch

    t = t.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    h.update(t.view(torch.uint8).numpy().data if t.numel() else b"")


def _hash_value(obj: Any, h: Any, depth: int = 0) -> bool:
    """Feed ``obj`` into ``h``; ``False`` if it holds nothing hashable (then it is not logged)."""
    if depth > 4:
        return False
    if isinstance(obj, bool | int | str | bytes) or obj is None:
        h.update(repr(obj).encode())
        return True
    if isinstance(obj, float):
        h.update(obj.hex().encode())
        return True
    if isinstance(obj, complex):
        h.update(f"{obj.real.hex()},{obj.imag.hex()}".encode())
        return True
    mod = type(obj).__module__ or ""
    if mod.startswith("numpy"):
        import numpy as np

        if isinstance(obj, np.ndarray):
            if obj.dtype == object:
                return _hash_value(obj.tolist(), h, depth + 1)
            h.update(f"{obj.dtype.str}{obj.shape}".encode())
            h.update(np.ascontiguousarray(obj).view(np.uint8).data if obj.size else b"")
            return True
        if isinstance(obj, np.generic):
            h.update(np.asarray(obj).tobytes())
            return True
        return False
    if mod.startswith("torch"):
        import torch

        if isinstance(obj, torch.Tensor):
            h.update(f"{obj.dtype}{tuple(obj.shape)}".encode())
            _hash_tensor(obj, h)
            return True
        if isinstance(obj, torch.nn.Module):
            return _hash_value(dict(obj.state_dict()), h, depth + 1)
        return False
    if isinstance(obj, list | tuple):
        if len(obj) > 100_000:
            return False
        ok = False
        for x in obj:
            ok = _hash_value(x, h, depth + 1) or ok
        return ok
    if isinstance(obj, dict):
        if len(obj) > 100_000:
            return False
        ok = False
        for k, v in obj.items():
            if _hash_value(v, h, depth + 1):
                h.update(repr(k).encode())
                ok = True
        return ok
    if hasattr(obj, "to_numpy") and mod.startswith("pandas"):
        return _hash_value(obj.to_numpy(), h, depth + 1)
    return False


def digest(obj: Any) -> str | None:
    """16 hex digits hashing the exact bytes of ``obj`` (tensors, arrays, numbers, containers of them), or
    ``None`` if it holds nothing of the kind."""
    h = hashlib.blake2b(digest_size=8)
    return h.hexdigest() if _hash_value(obj, h) else None


def _sig(x: Any) -> str:
    import torch

    if isinstance(x, torch.Tensor):
        dt = str(x.dtype).replace("torch.", "").replace("float", "f").replace("int", "i")
        return f"{dt}{list(x.shape)}".replace(" ", "")
    if isinstance(x, list | tuple):
        inner = [_sig(v) for v in x]
        inner = [s for s in inner if s]
        return "(" + ",".join(inner) + ")" if inner else ""
    return ""


# ---------------------------------------------------------------------------------------------------- recording


class Tracer:
    """Writes the trace log of this process (see the module docstring)."""

    def __init__(self, path: str | os.PathLike, ops: bool = True, at: int | None = None, stop: bool = True,
                 against: str | os.PathLike | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "w", buffering=1 << 20)  # noqa: SIM115 (closed at exit)
        self.n = 0
        self.cell = 0
        self.ops = ops
        self.at = at
        # the reference run's operations: the first one this run computes differently is dumped (and stops it)
        self.ref = {ln.n: (ln.name, ln.sig, ln.hash) for ln in read(against) if ln.kind == "op"} if against else None
        self.stop = stop
        self.lines: list[str] = []
        self.mode: Any = None
        self.seen_vars: dict[str, str] = {}
        atexit.register(self.close)

    # -- writing
    def write(self, line: str) -> None:
        self.lines.append(line)
        if len(self.lines) >= _FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        if self.lines and not self.file.closed:
            self.file.write("\n".join(self.lines) + "\n")
            self.file.flush()
        self.lines.clear()

    def close(self) -> None:
        self.flush()
        if not self.file.closed:
            self.file.close()

    # -- where
    def where(self) -> str:
        f = sys._getframe(1)
        lib = cell = other = None
        while f is not None:
            fn = f.f_code.co_filename
            if lib is None and fn.startswith(_LIB) and fn != _SELF:
                lib = f"{fn[len(_LIB) + 1:]}:{f.f_lineno} {f.f_code.co_name}"
            elif "ipykernel_" in fn or fn.startswith("<ipython-input"):
                cell = f"cell {self.cell}:{f.f_lineno}"
                break
            elif other is None and fn != _SELF and not _is_library(fn):
                other = f"{Path(fn).name}:{f.f_lineno} {f.f_code.co_name}"  # a script or test calling torch
            f = f.f_back
        parts = [p for p in (lib, cell) if p] or [p for p in (other,) if p]
        import torch

        node = torch._C._current_autograd_node()
        if node is not None:
            parts.append(f"backward {node.name()}")
        return " | ".join(parts) or "-"

    # -- the dispatch-mode callback
    def op(self, func: Any, args: tuple, kwargs: dict, call: Any) -> Any:
        name = str(func)
        if name in _SKIP_OPS or getattr(func, "is_view", False):
            return call()
        n = self.n
        self.n += 1
        dump_in = None
        if n == self.at:
            dump_in = _clone_tree((args, kwargs))
        out = call()
        h = hashlib.blake2b(digest_size=8)
        try:
            written = out is None or (isinstance(out, list | tuple) and not out)
            if written:  # in-place operations that return nothing (e.g. _foreach_add_): hash what they wrote
                schema = func._schema.arguments
                targets = [a for a, s in zip(args, schema, strict=False) if s.alias_info and s.alias_info.is_write]
                ok = _hash_value(targets, h)
            else:
                ok = _hash_value(out, h)
            digest_ = h.hexdigest() if ok else "-"
        except Exception as e:  # noqa: BLE001 (an unhashable output must not break the run)
            digest_ = f"?{type(e).__name__}"
        sig = f"{_sig(args)}->{_sig(out)}"
        self.write(f"{n}\top\t{name}\t{sig}\t{digest_}\t{self.where()}")
        if dump_in is None and self.ref is not None and self.ref.get(n) != (name, sig, digest_):
            self.ref = None  # the first mismatch only; inputs as they are now (an in-place op has changed its own)
            dump_in = _clone_tree((args, kwargs))
        if dump_in is not None:
            self.dump(n, name, dump_in, out)
        return out

    def dump(self, n: int, name: str, inputs: Any, out: Any) -> None:
        import traceback

        import torch

        stack = "".join(traceback.format_stack()[:-3])
        target = self.path.with_name(f"{self.path.name}.op{n}.pt")
        torch.save({"index": n, "op": name, "inputs": inputs, "outputs": _clone_tree(out), "stack": stack,
                    "where": self.where(), "env": _numeric_env()}, target)
        self.path.with_name(f"{self.path.name}.op{n}.txt").write_text(f"op {n}: {name}\n{stack}")
        self.flush()
        if self.stop:
            raise TraceStop(f"trace: operation {n} ({name}) dumped to {target}; stopping ($REPRO_TRACE_STOP=0 "
                            "runs on)")

    # -- cell boundaries (IPython)
    def pre_cell(self, *_: Any) -> None:
        try:
            from IPython import get_ipython

            self.cell = int(get_ipython().execution_count)
        except Exception:  # noqa: BLE001
            self.cell += 1
        self.write(f"{self.n}\tcell\t{self.cell}\t\t\t")

    def post_cell(self, *_: Any) -> None:
        try:
            from IPython import get_ipython

            ns = get_ipython().user_ns
        except Exception:  # noqa: BLE001
            return
        for key in sorted(ns):
            if key.startswith("_") or key in ("In", "Out", "exit", "quit", "get_ipython"):
                continue
            try:
                d = digest(ns[key])
            except Exception:  # noqa: BLE001
                continue
            if d is None or self.seen_vars.get(key) == d:
                continue  # log a variable when it first appears and whenever it changes
            self.seen_vars[key] = d
            self.write(f"{self.n}\tvar\t{key}\t{type(ns[key]).__name__}\t{d}\tcell {self.cell}")
        self.flush()


def _is_library(filename: str) -> bool:
    """A frame of torch, the standard library or an installed package (not where a computation is written)."""
    return ("site-packages" in filename or "/lib/python3" in filename or filename.startswith("<")
            or f"{os.sep}torch{os.sep}" in filename)


def _clone_tree(obj: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, list | tuple):
        return type(obj)(_clone_tree(x) for x in obj) if not hasattr(obj, "_fields") else obj
    if isinstance(obj, dict):
        return {k: _clone_tree(v) for k, v in obj.items()}
    if isinstance(obj, int | float | bool | str | type(None)):
        return obj
    return repr(obj)


def _numeric_env() -> dict[str, str]:
    keys = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "OPENBLAS_CORETYPE",
            "NPY_DISABLE_CPU_FEATURES", "OMP_NUM_THREADS")
    return {k: os.environ[k] for k in keys if k in os.environ}


def install(path: str | os.PathLike, ops: bool = True, at: int | None = None, stop: bool = True,
            against: str | os.PathLike | None = None) -> Tracer:
    """Start tracing this process into ``path`` (idempotent: a second call returns the running tracer); ``at``:
    dump operation ``at``; ``against``: a reference trace, dump the first operation that differs from it."""
    global _tracer
    if _tracer is not None:
        return _tracer
    tracer = Tracer(path, ops=ops, at=at, stop=stop, against=against)
    if ops:
        from torch.utils._python_dispatch import TorchDispatchMode

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None):
                kwargs = kwargs or {}
                return tracer.op(func, args, kwargs, lambda: func(*args, **kwargs))

        tracer.mode = _Mode()
        tracer.mode.__enter__()
    try:
        from IPython import get_ipython

        ip = get_ipython()
    except ImportError:
        ip = None
    if ip is not None:
        tracer.cell = int(getattr(ip, "execution_count", 0) or 0)  # numbered as in the executed notebook
        ip.events.register("pre_run_cell", tracer.pre_cell)
        ip.events.register("post_run_cell", tracer.post_cell)
    _tracer = tracer
    return tracer


def uninstall() -> None:
    """Stop tracing (tests): pop the dispatch mode, unregister the cell hooks, close the log."""
    global _tracer
    tracer, _tracer = _tracer, None
    if tracer is None:
        return
    if tracer.mode is not None:
        tracer.mode.__exit__(None, None, None)
    try:
        from IPython import get_ipython

        ip = get_ipython()
        if ip is not None:
            ip.events.unregister("pre_run_cell", tracer.pre_cell)
            ip.events.unregister("post_run_cell", tracer.post_cell)
    except (ImportError, ValueError):
        pass
    tracer.close()


def install_if_requested() -> Tracer | None:
    """:func:`install` if ``$REPRO_TRACE`` names a log (``runtime.setup`` calls this)."""
    path = os.environ.get(ENV)
    if not path:
        return None
    at = os.environ.get(AT_ENV)
    return install(path, ops=os.environ.get(OPS_ENV, "1") != "0", at=int(at) if at else None,
                   stop=os.environ.get(STOP_ENV, "1") != "0", against=os.environ.get(AGAINST_ENV) or None)


# ---------------------------------------------------------------------------------------------------- comparing


@dataclass
class Line:
    lineno: int
    n: int
    kind: str  # op | cell | var
    name: str
    sig: str
    hash: str
    where: str

    @property
    def key(self) -> tuple[str, str, str, str]:
        return self.kind, self.name, self.sig, self.hash

    def __str__(self) -> str:
        if self.kind == "op":
            return f"op {self.n} {self.name} {self.sig} [{self.hash}] at {self.where}"
        if self.kind == "var":
            return f"variable {self.name} ({self.sig}) [{self.hash}] after {self.where}"
        return f"start of cell {self.name}"


def read(path: str | os.PathLike) -> Iterator[Line]:
    with open(path) as f:
        for i, raw in enumerate(f, 1):
            parts = raw.rstrip("\n").split("\t")
            if len(parts) < 6:
                continue
            yield Line(i, int(parts[0]), parts[1], parts[2], parts[3], parts[4], parts[5])


@dataclass
class Divergence:
    """The first differing line of two traces (``None`` fields: the traces agree, or one ended)."""

    ops_a: int
    ops_b: int
    first: tuple[Line | None, Line | None] | None  # first differing line, any kind
    first_op: tuple[Line | None, Line | None] | None  # first differing op line
    first_var: tuple[Line | None, Line | None] | None  # first differing cell-boundary variable
    kind: str  # "identical" | "values" (same op, other output) | "sequence" (other op or shape) | "length"

    @property
    def identical(self) -> bool:
        return self.kind == "identical"

    def report(self) -> str:
        if self.identical:
            return f"identical: {self.ops_a} operations and every cell-boundary variable agree"
        lines = [f"traces differ ({self.kind}); operations logged: {self.ops_a} vs {self.ops_b}"]
        for label, pair in (("first difference", self.first), ("first differing op", self.first_op),
                            ("first differing variable", self.first_var)):
            if pair is None or pair == self.first and label != "first difference":
                continue
            a, b = pair
            lines.append(f"{label}:\n  A: {a or '(trace ended)'}\n  B: {b or '(trace ended)'}")
        if self.first_op and self.first_op[0] and self.first_op[1] and self.kind == "values":
            lines.append(f"(isolate it: rerun both with ${AT_ENV}={self.first_op[0].n} and compare the dumps)")
        return "\n".join(lines)


def diff(a: str | os.PathLike, b: str | os.PathLike) -> Divergence:
    """Compare two trace logs line by line (see the module docstring)."""
    first = first_op = first_var = None
    kind = "identical"
    ops = [0, 0]
    sentinel = None
    ia, ib = read(a), read(b)
    while True:
        la, lb = next(ia, sentinel), next(ib, sentinel)
        if la is None and lb is None:
            break
        for i, ln in enumerate((la, lb)):
            if ln is not None and ln.kind == "op":
                ops[i] = ln.n + 1
        if la is not None and lb is not None and la.key == lb.key:
            continue
        if first is None:
            first = (la, lb)
            if la is None or lb is None:
                kind = "length"
            elif la.kind == lb.kind and la.name == lb.name and la.sig == lb.sig:
                kind = "values"
            else:
                kind = "sequence"
        if first_op is None and "op" in (getattr(la, "kind", None), getattr(lb, "kind", None)):
            first_op = (la, lb)
        if first_var is None and "var" in (getattr(la, "kind", None), getattr(lb, "kind", None)) and (
                la is not None and lb is not None and la.kind == lb.kind == "var"):
            first_var = (la, lb)
        if first_op is not None and first_var is not None:
            break
        if kind == "sequence":  # the runs took other paths: later lines no longer pair up
            break
    # the counts of the rest (for the report), without pairing
    for ln in ia:
        if ln.kind == "op":
            ops[0] = ln.n + 1
    for ln in ib:
        if ln.kind == "op":
            ops[1] = ln.n + 1
    return Divergence(ops[0], ops[1], first, first_op, first_var, kind)


def _ulps(a: Any, b: Any) -> float:
    """Largest distance in units in the last place between two float tensors of one dtype."""
    import torch

    if a.dtype not in (torch.float32, torch.float64) or a.shape != b.shape:
        return math.nan
    it = torch.int32 if a.dtype == torch.float32 else torch.int64
    ia, ib = a.contiguous().view(it).to(torch.int64), b.contiguous().view(it).to(torch.int64)
    # map the sign-magnitude bit patterns onto a monotone integer line
    top = 1 << (31 if a.dtype == torch.float32 else 63)
    ia = torch.where(ia < 0, -(ia + top) if a.dtype == torch.float32 else -(ia & (top - 1)), ia)
    ib = torch.where(ib < 0, -(ib + top) if a.dtype == torch.float32 else -(ib & (top - 1)), ib)
    return float((ia - ib).abs().max()) if ia.numel() else 0.0


def _tensors(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield prefix or "out", obj
    elif isinstance(obj, list | tuple):
        for i, x in enumerate(obj):
            yield from _tensors(x, f"{prefix}[{i}]")
    elif isinstance(obj, dict):
        for k, x in obj.items():
            yield from _tensors(x, f"{prefix}.{k}")


def compare_dumps(a: str | os.PathLike, b: str | os.PathLike) -> str:
    """What differs between two dumps of one operation (``$REPRO_TRACE_AT``): inputs, then outputs, with the
    largest absolute and relative change and the distance in ulps."""
    import torch

    da, db = torch.load(a, weights_only=False), torch.load(b, weights_only=False)
    out = [f"op {da['index']} {da['op']} at {da['where']}", f"  env A: {da['env']}", f"  env B: {db['env']}"]
    if da["op"] != db["op"]:
        return "\n".join([*out, f"  other operations: {da['op']} vs {db['op']}"])
    same_inputs = True
    for part in ("inputs", "outputs"):
        for (name, x), (_, y) in zip(_tensors(da[part]), _tensors(db[part]), strict=False):
            if x.shape != y.shape or x.dtype != y.dtype:
                out.append(f"  {part}{name}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}")
                same_inputs &= part != "inputs"
                continue
            if torch.equal(x, y) or (x.is_floating_point() and torch.equal(x.isnan(), y.isnan())
                                     and torch.equal(torch.nan_to_num(x), torch.nan_to_num(y))):
                out.append(f"  {part}{name}: identical {x.dtype}{list(x.shape)}")
                continue
            if part == "inputs":
                same_inputs = False
            if x.is_floating_point():
                d = (x.double() - y.double()).abs()
                rel = d / x.double().abs().clamp_min(1e-300)
                out.append(f"  {part}{name}: differ in {int((d > 0).sum())} of {x.numel()} elements, max abs "
                           f"{float(d.max()):.3g}, max rel {float(rel.max()):.3g}, max {_ulps(x, y):.0f} ulp")
            else:
                out.append(f"  {part}{name}: differ in {int((x != y).sum())} of {x.numel()} elements")
    out.append("  => the inputs are identical: this kernel's result depends on the environment" if same_inputs
               else "  => the inputs already differ: the divergence is upstream (outside torch: NumPy, SciPy, "
                    "Python)")
    return "\n".join(out)


def replay(dump: str | os.PathLike) -> Any:
    """Re-run a dumped operation on its saved inputs in this process; returns its output."""
    import torch

    d = torch.load(dump, weights_only=False)
    ns, name, overload = d["op"].split(".")
    func = getattr(getattr(getattr(torch.ops, ns), name), overload)
    args, kwargs = d["inputs"]
    return func(*args, **kwargs)


def main(argv: list[str] | None = None) -> int:
    """``python -m repro.tools.trace A B``: diff two logs (exit 1 if they differ); two ``.pt`` dumps: compare."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m repro.tools.trace A.trace B.trace | A.opN.pt B.opN.pt", file=sys.stderr)
        return 2
    if args[0].endswith(".pt"):
        print(compare_dumps(*args))
        return 0
    d = diff(*args)
    print(d.report())
    return 0 if d.identical else 1


if __name__ == "__main__":
    sys.exit(main())
