"""The process each notebook runs in: ``python -m repro.tools.launcher`` is papermill's own command line
(:func:`papermill_main`), with one fix to its client, started by the runner (:mod:`repro.tools.execute`) and by
``python -m repro portability`` (:func:`command`).

The fix (issue 12, ``benchmarks/stress_explorer.py``): jupyter_client >= 8 sends every message from an asyncio
socket through a plain shadow of it (``Session.send``), so pyzmq's asyncio layer never re-checks the socket after
the send as its own send path does (pyzmq #1208). The send consumes the edge-triggered ``ZMQ_FD`` wake-up; a reply
that arrives meanwhile on the same socket then waits unread while nbclient awaits it without a timeout: the run
hangs, both processes idle. nbclient sends on the shell socket while it awaits an ``execute_reply`` only to mimic
an ``Output`` widget (``ipywidgets.interact``), hence hangs at explorer cells (nbclient #312, open).
:func:`rearm_asyncio_sends` re-checks the socket after each such send (``get(EVENTS)``, which re-arms pyzmq's
pending receivers); jupyter_client 8.0 to 8.10.0 (pinned) all need it. The per-cell timeout bounds such a stall
even without the fix: a poll with a timeout polls the socket itself at its deadline and finds the stranded reply,
so the cell ends late instead of never (``tests/tools/test_client_fix.py``).

On Linux the papermill process asks to be killed when the runner or Dask worker that started it dies
(``PR_SET_PDEATHSIG``, :func:`_die_with_parent`), and its kernel exits when papermill does (ipykernel's parent
poller): a killed runner leaves no notebook running. Where the runner asked for it (``$REPRO_NETNS=1``), the
process first enters an empty network namespace that its kernel inherits (:mod:`repro.tools.offline`).
"""

from __future__ import annotations

import math
import os
import signal
import sys
from pathlib import Path
from typing import Any

from . import offline

PARENT_ENV = "REPRO_RUNNER_PID"  # the process that started papermill (it dies with it: _die_with_parent)
MODULE = "repro.tools.launcher"


def command(notebook: Path, output: Path, mode: str, seed: int, cell_timeout: float | None = None) -> list[str]:
    """The command line that executes ``notebook`` into ``output`` with ``MODE`` and ``SEED`` injected, in the
    notebook's folder, with papermill's per-cell ``--execution-timeout`` when ``cell_timeout`` is given."""
    cmd = [sys.executable, "-m", MODULE, str(notebook), str(output), "-p", "MODE", mode, "-p", "SEED", str(seed),
           "-k", "python3", "--cwd", str(notebook.parent), "--no-progress-bar", "--log-level", "WARNING"]
    if cell_timeout:
        cmd += ["--execution-timeout", str(max(1, math.ceil(cell_timeout)))]
    return cmd


def rearm_asyncio_sends() -> None:
    """Patch ``jupyter_client.session.Session.send`` so that a send on a ``zmq.asyncio`` socket is followed by
    ``socket.get(zmq.EVENTS)``: pyzmq's asyncio socket then schedules its pending receivers if a message is
    waiting (see the module docstring). Harmless where nothing waits; idempotent."""
    import zmq
    import zmq.asyncio
    from jupyter_client import session

    original = session.Session.send
    if getattr(original, "_repro_rearms", False):
        return

    def send(self: Any, stream: Any, *args: Any, **kwargs: Any) -> Any:
        msg = original(self, stream, *args, **kwargs)
        if isinstance(stream, zmq.asyncio.Socket) and not stream.closed:
            stream.get(zmq.EVENTS)
        return msg

    send._repro_rearms = True  # type: ignore[attr-defined]
    session.Session.send = send  # type: ignore[method-assign]


def _die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this process when the runner that started it (``$REPRO_RUNNER_PID``) dies,
    so a killed runner or Dask worker leaves no papermill behind (its kernel follows: ipykernel exits when its
    parent does). Elsewhere, or outside the runner, nothing."""
    parent = os.environ.get(PARENT_ENV, "")
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):  # the runner died before the request took effect
        os._exit(1)


def _isolate_if_asked() -> None:
    """Enter an empty network namespace (loopback only) when the runner asked for one (``$REPRO_NETNS=1``, set
    only where :func:`repro.tools.offline.network_isolation` found that it works); the kernel inherits it. First
    thing in the process: a new user namespace needs a single-threaded one."""
    if os.environ.get(offline.NETNS_ENV) != "1":
        return
    try:
        offline.isolate_network()
    except OSError as e:
        print(f"error: the offline guard could not put this notebook in an empty network namespace ({e}); "
              f"set {offline.NETNS_OFF_ENV}=1 to run with the in-process guard only", file=sys.stderr)
        sys.exit(1)


def papermill_main(argv: list[str] | None = None) -> None:
    """``papermill`` with :func:`rearm_asyncio_sends` applied: what the runner executes each notebook with (in an
    empty network namespace where the runner asked for one)."""
    _isolate_if_asked()
    _die_with_parent()
    rearm_asyncio_sends()
    from papermill.cli import papermill

    papermill.main(args=argv, prog_name="papermill")


if __name__ == "__main__":
    papermill_main()
