"""Stress reproduction of issue 12: does papermill ever hang on an explorer cell while the CPUs are busy?

Executes small fixture notebooks many times with papermill (the same command line as ``python -m repro run``)
and counts the runs that do not finish within ``--timeout`` (a hang: the normal run takes a few seconds).
Variants, interleaved round-robin so a load change hits all of them alike:

* ``interact``: a plain ``ipywidgets.interact`` cell with a ``SelectionSlider`` (what notebook 03 had);
* ``live``: ``repro.plotting.explorer`` with ``$REPRO_HEADLESS`` unset (it builds the same widget);
* ``headless``: ``repro.plotting.explorer`` with ``$REPRO_HEADLESS=1`` (static animation, no widget);
* ``handle``: a live explorer without an ``Output`` widget (sliders, and the figure in a display handle that the
  sliders update), the change proposed for ``plotting.explorer``'s live path;
* ``plain``: the same notebook without any explorer (a control).

``--launcher runner`` runs ``python -m repro.tools.launcher`` (papermill with the runner's client fix,
``repro.tools.launcher.rearm_asyncio_sends``) instead of plain ``python -m papermill``.

``--burn N`` keeps N busy-looping processes running for the whole stress (both cores busy). On a hang the
script dumps the Python stacks of papermill and the kernel (``faulthandler`` on SIGUSR1, installed through a
``sitecustomize`` put on ``PYTHONPATH``), records which cell papermill was waiting on, keeps the partial
output notebook and papermill's log in ``--out``, then kills the run. ``--trace`` also logs every Jupyter
message sent and received by both processes (``jupyter_client.session.Session``), to see which one was lost.
``--pin ipykernel==6.29.5`` style comparisons are done by pointing ``--python`` at another environment.

Run (about 5 s per run on an idle 2-core machine):
``.venv/bin/python benchmarks/stress_explorer.py --runs 50 --burn 2 --variants interact,live,headless``
This is a reproduction script, not a CI test; it prints a table and writes ``<out>/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import nbformat

from repro.tools.execute import kill_tree

VARIANTS = ("interact", "live", "headless", "handle", "plain")

PRELUDE = """\
import numpy as np
import matplotlib
import matplotlib.pyplot as plt
x = np.linspace(0, 1, 200)
print(round(float(np.sum(x)), 3))"""

INTERACT = """\
import ipywidgets as widgets


def live(t):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    axes[0].plot(x, np.sin(t * x))
    axes[1].plot(x, np.cos(t * x))
    plt.show()


widgets.interact(live, t=widgets.SelectionSlider(options=[1, 2, 3, 4, 5, 6], value=1, description="t"));"""

EXPLORER = """\
from repro import plotting


def draw_waves(axes, t):
    axes[0].plot(x, np.sin(t * x))
    axes[1].plot(x, np.cos(t * x))


plotting.explorer(draw_waves, nrows=1, ncols=2, t=[1, 2, 3, 4, 5, 6])"""

HANDLE = """\
import ipywidgets as widgets
from IPython.display import display


def explorer_handle(draw, nrows=1, ncols=2, figsize=(10, 3.4), **sliders):
    controls = {k: widgets.SelectionSlider(options=v, value=v[0], description=k) for k, v in sliders.items()}
    fig, axes = plt.subplots(nrows, ncols, figsize=figsize)
    plt.close(fig)

    def render():
        for ax in np.atleast_1d(axes).flat:
            ax.clear()
        draw(axes, **{k: c.value for k, c in controls.items()})
        return fig

    display(widgets.VBox(list(controls.values())))
    handle = display(render(), display_id=True)
    for c in controls.values():
        c.observe(lambda change: handle.update(render()), names="value")


def draw_waves(axes, t):
    axes[0].plot(x, np.sin(t * x))
    axes[1].plot(x, np.cos(t * x))


explorer_handle(draw_waves, t=[1, 2, 3, 4, 5, 6])"""

AFTER = 'print("after", round(float(np.mean(x)), 3))'

SITECUSTOMIZE = '''\
"""Stress diagnostics (benchmarks/stress_explorer.py): stacks on SIGUSR1, optionally a log of every message."""
import faulthandler
import os
import signal
import sys
import threading
import time

_dir = os.environ.get("STRESS_DIAG_DIR")
if _dir:
    try:  # sys.argv is not set yet while site runs
        with open("/proc/self/cmdline", "rb") as f:
            _cmd = f.read().decode(errors="replace")
    except OSError:
        _cmd = " ".join(sys.orig_argv)
    _role = "kernel" if "ipykernel" in _cmd else "client"
    _stacks = open(os.path.join(_dir, f"{_role}-{os.getpid()}.stacks"), "w")
    faulthandler.register(signal.SIGUSR1, file=_stacks, all_threads=True)

    def _probe(signum, frame):
        """SIGUSR2: where is the lost message? First the pure-Python state of every pyzmq stream and asyncio
        socket (queued sends, pending futures, watched events), then libzmq's EVENTS of each socket (reading
        EVENTS processes pending commands, so it comes last)."""
        import gc
        try:
            import zmq
            from zmq.eventloop.zmqstream import ZMQStream
        except Exception:
            return
        lines = [f"probe at {time.time():.6f}"]
        objs = gc.get_objects()
        for o in objs:
            if isinstance(o, ZMQStream) and o.socket is not None:
                lines.append(f"ZMQStream type={o.socket.socket_type} send_queue={o._send_queue.qsize()} "
                             f"recv_cb={o._recv_callback is not None} state={o._state}")
        socks = [o for o in objs if isinstance(o, zmq.Socket) and not o.closed]
        for o in socks:
            futs = getattr(o, "_recv_futures", None)
            kinds = [f.kind for f in futs] if futs is not None else None
            lines.append(f"{type(o).__module__}.{type(o).__name__} type={o.socket_type} "
                         f"recv_futures={kinds} state={getattr(o, '_state', None)}")
        for o in socks:
            try:
                lines.append(f"EVENTS type={o.socket_type} fd={o.FD} events={o.get(zmq.EVENTS)}")
            except Exception as e:
                lines.append(f"EVENTS error {e!r}")
        with open(os.path.join(_dir, f"{_role}-{os.getpid()}.probe"), "a") as f:
            f.write("\\n".join(lines) + "\\n")

    signal.signal(signal.SIGUSR2, _probe)

if _dir and os.environ.get("STRESS_TRACE"):
    import importlib.abc
    import importlib.util

    _log = open(os.path.join(_dir, f"{_role}-{os.getpid()}.msgs"), "a", buffering=1)
    _lock = threading.Lock()

    def _write(direction, where, msg):
        try:
            hdr = msg.get("header", {})
            par = msg.get("parent_header", {}) or {}
            extra = ""
            if hdr.get("msg_type") == "status":
                extra = msg.get("content", {}).get("execution_state", "")
            line = (f"{time.time():.6f} {threading.current_thread().name} {direction} {where} "
                    f"{hdr.get('msg_type')} {hdr.get('msg_id', '')[-12:]} parent={par.get('msg_id', '')[-12:]} "
                    f"{extra}\\n")
            with _lock:
                _log.write(line)
        except Exception as e:  # never break the process being diagnosed
            _log.write(f"trace error {e!r}\\n")

    def _where(stream):
        sock = getattr(stream, "socket", stream)
        try:
            import zmq
            return {zmq.ROUTER: "router", zmq.DEALER: "dealer", zmq.PUB: "pub", zmq.SUB: "sub",
                    zmq.REQ: "req", zmq.REP: "rep"}.get(sock.socket_type, str(sock.socket_type))
        except Exception:
            return type(stream).__name__

    def _patch(mod):
        S = mod.Session
        send, deserialize = S.send, S.deserialize

        def traced_send(self, stream, msg_or_type, *a, **k):
            msg = send(self, stream, msg_or_type, *a, **k)
            if isinstance(msg, dict):
                _write("send", _where(stream), msg)
            return msg

        def traced_deserialize(self, *a, **k):
            msg = deserialize(self, *a, **k)
            _write("recv", "-", msg)
            return msg

        S.send, S.deserialize = traced_send, traced_deserialize

    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "jupyter_client.session":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                _patch(module)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Hook())
'''


def make_notebook(path: Path, variant: str, explorers: int) -> None:
    """The fixture: parameters, a prelude, ``explorers`` explorer cells of the variant, a last cell."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('MODE = "quick"\nSEED = 0')
    params.metadata["tags"] = ["parameters"]
    body = {"interact": INTERACT, "live": EXPLORER, "headless": EXPLORER, "handle": HANDLE, "plain": AFTER}[variant]
    nb.cells = [params, nbformat.v4.new_code_cell(PRELUDE),
                *(nbformat.v4.new_code_cell(body) for _ in range(explorers)), nbformat.v4.new_code_cell(AFTER)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def burn(stop: mp.Event) -> None:
    """A CPU burner: busy-loop until told to stop."""
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x = (x * 1103515245 + 12345) % 2**31


def _waiting_cell(partial: Path) -> str:
    """Which cell papermill was executing when the run was stopped (from its autosaved output notebook)."""
    try:
        nb = nbformat.read(partial, as_version=4)
    except Exception as e:  # noqa: BLE001 (diagnostics only)
        return f"unreadable output notebook ({e.__class__.__name__})"
    for i, cell in enumerate(nb.cells):
        if cell.get("metadata", {}).get("papermill", {}).get("status") == "running":
            first = cell.source.strip().splitlines()[-1] if cell.source.strip() else ""
            return f"cell {i} ({first[:60]})"
    return "no cell running"


def _cell_seconds(executed: Path) -> list[float | None]:
    """Each cell's duration as papermill recorded it."""
    try:
        nb = nbformat.read(executed, as_version=4)
    except Exception:  # noqa: BLE001 (diagnostics only)
        return []
    return [c.get("metadata", {}).get("papermill", {}).get("duration") for c in nb.cells]


def _dump_stacks(pid: int) -> list[int]:
    """SIGUSR1 to papermill and its kernel (faulthandler writes their stacks); returns the pids signalled."""
    import psutil

    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        for p in procs:
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        time.sleep(1.0)
    return [p.pid for p in procs]


def run_once(python: str, nb: Path, out: Path, variant: str, timeout: float, diag: Path, trace: bool,
             execution_timeout: int | None, extra_env: dict[str, str], launcher: str = "papermill") -> dict:
    """One papermill run of ``nb``; returns its record (status ok | failed | hang, seconds, where it hung)."""
    run_diag = diag / f"{variant}-{time.time_ns()}"
    run_diag.mkdir(parents=True)
    env = {**os.environ, **extra_env, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "STRESS_DIAG_DIR": str(run_diag), "PYTHONPATH": os.pathsep.join(
               [str(diag / "site"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    env.pop("REPRO_HEADLESS", None)
    if variant == "headless":
        env["REPRO_HEADLESS"] = "1"
    if trace:
        env["STRESS_TRACE"] = "1"
    partial = run_diag / "executed.ipynb"
    module = "repro.tools.launcher" if launcher == "runner" else "papermill"
    cmd = [python, "-m", module, str(nb), str(partial), "-k", "python3", "--cwd", str(nb.parent),
           "--no-progress-bar", "--log-level", "DEBUG" if trace else "WARNING"]
    if execution_timeout:
        cmd += ["--execution-timeout", str(execution_timeout)]
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    record = {"variant": variant, "dir": str(run_diag)}
    try:
        log, _ = proc.communicate(timeout=timeout)
        record["status"] = "ok" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        record["status"] = "hang"
        record["where"] = _waiting_cell(partial)
        record["pids"] = _dump_stacks(proc.pid)
        try:  # did probing the sockets (reading EVENTS) wake the stranded message up?
            log, _ = proc.communicate(timeout=30)
            record["after_probe"] = f"finished, rc {proc.returncode}"
        except subprocess.TimeoutExpired:
            record["after_probe"] = "still hung"
            kill_tree(proc.pid)
            log, _ = proc.communicate()
    record["seconds"] = round(time.time() - start, 2)
    if record["status"] != "ok":
        (run_diag / "papermill.log").write_text(log)
        record["log_tail"] = "\n".join(log.strip().splitlines()[-3:])
        if record["status"] == "failed" and "timed out" in log.lower():
            record["status"] = "cell-timeout"  # papermill's own --execution-timeout caught it
            record["where"] = _waiting_cell(partial)
    elif execution_timeout and record["seconds"] >= execution_timeout:
        record["cells_s"] = _cell_seconds(partial)  # a reply recovered at the cell timeout's deadline?
    else:
        import shutil

        shutil.rmtree(run_diag, ignore_errors=True)  # keep only what went wrong
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20, help="runs per variant")
    p.add_argument("--variants", default="interact,live,headless", help=f"comma-separated, of {VARIANTS}")
    p.add_argument("--explorers", type=int, default=1, help="explorer cells per notebook")
    p.add_argument("--burn", type=int, default=0, help="CPU burner processes running throughout")
    p.add_argument("--jobs", type=int, default=1, help="papermill runs at once")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before a run counts as hung")
    p.add_argument("--execution-timeout", type=int, default=None, help="papermill's per-cell timeout")
    p.add_argument("--trace", action="store_true", help="log every Jupyter message of both processes")
    p.add_argument("--launcher", choices=("papermill", "runner"), default="papermill",
                   help="plain `python -m papermill`, or the runner's `python -m repro.tools.launcher` (client fix)")
    p.add_argument("--python", default=sys.executable, help="interpreter with papermill, ipykernel, repro")
    p.add_argument("--env", action="append", default=[], help="extra KEY=VALUE for papermill and the kernel")
    p.add_argument("--out", type=Path, default=None, help="where hung runs' diagnostics go (default: a tempdir)")
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = sorted(set(variants) - set(VARIANTS))
    if bad:
        p.error(f"unknown variants {bad}; choose from {VARIANTS}")
    out = args.out or Path(tempfile.mkdtemp(prefix="stress-explorer-"))
    (out / "site").mkdir(parents=True, exist_ok=True)
    (out / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    nbs = {}
    for v in variants:
        nbs[v] = out / f"fixture-{v}.ipynb"
        make_notebook(nbs[v], v, args.explorers)
    extra_env = dict(kv.split("=", 1) for kv in args.env)
    versions = subprocess.run([args.python, "-c", textwrap.dedent("""\
        from importlib.metadata import version as v
        print(' '.join(f'{p}=={v(p)}' for p in ('ipykernel', 'jupyter_client', 'nbclient', 'papermill',
              'pyzmq', 'ipywidgets', 'tornado', 'comm')))""")], capture_output=True, text=True).stdout.strip()
    print(f"versions: {versions}\nlauncher: {args.launcher}, burners: {args.burn}, jobs: {args.jobs}, "
          f"timeout: {args.timeout:g} s, execution timeout: {args.execution_timeout}, "
          f"explorer cells per notebook: {args.explorers}, diagnostics: {out}", flush=True)

    stop = mp.Event()
    burners = [mp.Process(target=burn, args=(stop,), daemon=True) for _ in range(args.burn)]
    for b in burners:
        b.start()
    records: list[dict] = []
    order = [v for _ in range(args.runs) for v in variants]
    t0 = time.time()
    try:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futs = [pool.submit(run_once, args.python, nbs[v], out, v, args.timeout, out, args.trace,
                                args.execution_timeout, extra_env, args.launcher) for v in order]
            for i, f in enumerate(futs, 1):
                r = f.result()
                records.append(r)
                with open(out / "runs.jsonl", "a") as log:  # a stress stopped early keeps what it measured
                    log.write(json.dumps({k: r[k] for k in ("variant", "status", "seconds", "cells_s")
                                          if k in r}) + "\n")
                if r["status"] != "ok":
                    print(f"[{i}/{len(order)}] {r['variant']}: {r['status']} after {r['seconds']} s at "
                          f"{r.get('where', '?')}; after probe: {r.get('after_probe', '-')} ({r['dir']})",
                          flush=True)
                elif i % 10 == 0:
                    print(f"[{i}/{len(order)}] {time.time() - t0:.0f} s elapsed", flush=True)
    finally:
        stop.set()
        for b in burners:
            b.join(5)
    rows = {}
    for v in variants:
        rs = [r for r in records if r["variant"] == v]
        ok = [r["seconds"] for r in rs if r["status"] == "ok"]
        rows[v] = {"runs": len(rs), "ok": len(ok), "hangs": sum(r["status"] == "hang" for r in rs),
                   "cell_timeouts": sum(r["status"] == "cell-timeout" for r in rs),
                   "failed": sum(r["status"] == "failed" for r in rs),
                   "slow": sum(t > statistics.median(ok) + 10 for t in ok) if ok else 0,
                   "median_s": round(statistics.median(ok), 2) if ok else None,
                   "max_s": max(ok) if ok else None}
    print(f"\n{'variant':10s} {'runs':>5s} {'ok':>5s} {'hangs':>6s} {'cell-to':>8s} {'failed':>7s} "
          f"{'slow ok':>8s} {'median s':>9s} {'max s':>7s}")
    for v, r in rows.items():
        print(f"{v:10s} {r['runs']:5d} {r['ok']:5d} {r['hangs']:6d} {r['cell_timeouts']:8d} {r['failed']:7d} "
              f"{r['slow']:8d} {r['median_s']!s:>9s} {r['max_s']!s:>7s}")
    summary = {"versions": versions, "launcher": args.launcher, "execution_timeout": args.execution_timeout,
               "burn": args.burn, "jobs": args.jobs, "timeout": args.timeout,
               "explorers": args.explorers, "wall_s": round(time.time() - t0, 1), "variants": rows,
               "problems": [r for r in records if r["status"] != "ok"]}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"summary: {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
