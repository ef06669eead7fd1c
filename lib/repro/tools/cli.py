"""Command line: ``python -m repro run | book | sync | prepare | new | portability | trace-diff``.

* ``run``: execute notebooks with papermill (``--mode quick|full|smoke``, ``--only 05,19``, ``--stale``, ``--jobs N``,
  ``--cluster local:N|tcp://HOST:PORT``, ``--timeout S``, ``--cell-timeout S``, ``--seed K``), record
  ``results/manifest.json``, then sync the generated pages. One after another in this process by default; on
  Dask with ``--cluster`` (``--jobs N`` is ``--cluster local:N``; :mod:`repro.tools.cluster`). A notebook that
  timed out is retried once. Exit 1 if any notebook failed or timed out (or ``results/`` could not be written:
  the summary of what ran comes first), 2 on bad arguments, an unreadable notebook, results file or manifest
  (named, left as it is) or an unreachable scheduler, 130 on Ctrl-C (finished notebooks stay written and
  recorded). With ``--book`` the book is rendered afterwards whatever the notebooks' outcome (a failed notebook's
  page keeps its last successful outputs under a warning, :func:`repro.tools.book.failure_banner`); the exit
  code is then 1 if a notebook or the build failed.
* ``book``: sync, then render the HTML from the committed outputs into ``_build/html`` (never executes;
  Sphinx warnings are errors).
* ``prepare``: build every offline asset the notebooks need (``repro.common.assets``), once.
* ``new NN``: create paper NN's notebook skeleton (generated header and setup cells, the fixed sections).
* ``sync``: regenerate ``_toc.yml``, ``book/results.md``, the README table and the notebooks' header and setup
  cells (``--check`` only reports what is stale, exit 1 if anything is: a generated file, or a result whose
  notebook changed since it was written; results whose library modules changed are warnings).
* ``portability``: run notebooks' quick mode under the portable environment and an emulated other machine
  (``--b PRESET``, ``--set KEY=VALUE``) in scratch folders and compare claim values and verdicts (``--trace``:
  name the first differing torch operation; ``--isolate``: dump it); :mod:`repro.tools.portability`. Exit 1 if
  a verdict changed.
* ``trace-diff A B``: the first difference of two trace logs (``$REPRO_TRACE``, :mod:`repro.tools.trace`), or
  of two dumps of one operation (``.pt``); exit 1 if the logs differ.

``book``, ``sync`` and ``sync --check`` exit 2 with the file's name when a notebook, results file or the manifest
cannot be read (never treating it as missing); ``--root`` that is not a checkout exits 2 as well.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from .paths import CI_MODES, check_mode, project_root

QUICK_TIMEOUT = 900.0  # s per notebook in quick mode (the whole process tree is killed past it)
# s per cell in quick mode: about twice the slowest quick-mode cell measured so far (172 s, under load); a hang is
# reported as "cell N (first line) did not finish in 300 s" within minutes instead of at the notebook's limit.
QUICK_CELL_TIMEOUT = 300.0


def _root(arg: str | None) -> Path:
    root = Path(arg).resolve() if arg else project_root()
    if root is None or not (root / "notebooks").is_dir():
        where = f"--root {arg}: not the book's checkout (no notebooks/ folder there)" if arg else (
            "not inside the book's checkout (no book/papers.yml and lib/repro above here); use --root")
        print(f"error: {where}", file=sys.stderr)
        raise SystemExit(2)
    return root


def _seconds(option: str) -> Callable[[str], float]:
    def parse(value: str) -> float:
        from .execute import check_seconds

        try:
            return check_seconds(option, float(value))  # type: ignore[return-value]
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e) if "seconds" in str(e) else
                                             f"{option} takes a number of seconds, got {value!r}") from None
    return parse


def _seed(value: str) -> int:
    from .batch import check_seed

    try:
        return check_seed(int(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seed must be an integer in [0, 2**64 - 1], got {value!r}") from None


def _mode(value: str) -> str:
    try:
        return check_mode(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _only(value: str) -> list[str]:
    nums = [v.strip() for v in value.split(",") if v.strip()]
    if not nums or not all(v.isdigit() and 1 <= int(v) <= 99 for v in nums):
        raise argparse.ArgumentTypeError(f"--only takes notebook numbers like 05,19; got {value!r}")
    return nums


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m repro", description="The ICML 2026 reproduction book.")
    p.add_argument("--root", help="the book's checkout (default: found from the current directory)")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="execute notebooks with papermill and record the manifest")
    r.add_argument("--mode", type=_mode, default="quick",
                   help="quick (CI scale, default), full, or smoke (full mode's code path at a tiny size, into "
                   "results/smoke/; claims computed, not asserted)")
    r.add_argument("--only", type=_only, help="comma-separated notebook numbers, e.g. 05,19")
    r.add_argument("--jobs", type=int, default=1,
                   help="notebooks at once on this machine, the same as --cluster local:N (default 1: one after "
                        "another in this process, without Dask)")
    r.add_argument("--cluster", metavar="local:N|tcp://HOST:PORT",
                   help="run on Dask: local:N starts N single-threaded worker processes here; tcp://HOST:PORT "
                        "uses a running `dask scheduler` (README: Running on a cluster)")
    r.add_argument("--stale", action="store_true",
                   help="only the notebooks whose results are stale or missing (their notebook or library changed)")
    r.add_argument("--timeout", type=_seconds("--timeout"), default=None,
                   help="seconds per notebook before it is killed (default: 900 in quick and smoke mode, none in full "
                        "mode)")
    r.add_argument("--cell-timeout", type=_seconds("--cell-timeout"), default=None,
                   help="seconds per cell before the notebook is stopped and reported (default: 300 in quick "
                        "and smoke mode, none in full mode); a timed-out notebook is retried once")
    r.add_argument("--seed", type=_seed, default=0, help="SEED injected into every notebook (default 0)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--book", action="store_true",
                   help="then render the book whatever the run's outcome: a notebook that failed keeps its last "
                        "successful outputs, under a warning; exit 1 if a notebook or the build failed")
    b = sub.add_parser("book", help="render the HTML from the committed notebooks (never executes)")
    b.add_argument("--no-strict", action="store_true", help="do not turn Sphinx warnings into errors")
    pr = sub.add_parser("prepare", help="build the offline assets (pretrained models) once; idempotent")
    pr.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="only this asset (repeatable), e.g. SmolLM2-135M-Instruct; default: every asset")
    n = sub.add_parser("new", help="create the notebook skeleton of paper NN (from book/papers.yml)")
    n.add_argument("number", help="the paper's number, e.g. 07")
    pt = sub.add_parser("portability", help="compare quick-mode claims under two numeric environments")
    pt.add_argument("--only", type=_only, help="comma-separated notebook numbers, e.g. 14,17")
    pt.add_argument("--b", default="other", help="environment B's preset (repro.tools.portability.PRESETS)")
    pt.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a variable of B (repeatable)")
    pt.add_argument("--a-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a variable of A on top of QUICK_ENV (repeatable; e.g. to try a fix in both)")
    pt.add_argument("--trace", action="store_true", help="trace both runs and name the first differing op")
    pt.add_argument("--isolate", action="store_true", help="also dump that op in both and compare (implies --trace)")
    pt.add_argument("--keep", metavar="DIR", help="keep the scratch folders (executed notebooks, traces) in DIR")
    pt.add_argument("--timeout", type=float, default=900.0, help="seconds per notebook run (default 900)")
    td = sub.add_parser("trace-diff", help="first difference of two trace logs (or of two .pt op dumps)")
    td.add_argument("a")
    td.add_argument("b")
    s = sub.add_parser("sync", help="regenerate the toc, results page, README table and notebook headers")
    s.add_argument("--check", action="store_true", help="only report stale files; exit 1 if any")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.cmd == "trace-diff":
        from . import trace

        return trace.main([args.a, args.b])
    root = _root(args.root)
    from .book import SyncError
    from .claims import RegistryError
    from .provenance import UnreadableFile

    try:
        return _command(args, root)
    except UnreadableFile as e:  # a corrupt notebook, results file or manifest: named, never taken for missing
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (SyncError, RegistryError) as e:  # a notebook's tagged cells or a claims registry sync cannot use
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, root: Path) -> int:
    from . import batch, book
    from .cluster import ClusterError  # imports no Dask

    try:
        quick = args.mode in CI_MODES
        timeout = args.timeout if args.timeout is not None else (QUICK_TIMEOUT if quick else None)
        cell_timeout = args.cell_timeout if args.cell_timeout is not None else (
            QUICK_CELL_TIMEOUT if quick else None)
        only = args.only
        if args.stale:
            wanted = {o.zfill(2) for o in only or []}
            stale = [s for s in book.stale_results(root, args.mode) if not wanted or s.paper.number in wanted]
            if not stale:
                print("nothing stale: every selected result matches its notebook and library")
                return 0
            print("stale:\n" + "\n".join(f"  {s}" for s in stale))
            only = sorted({s.paper.number for s in stale})
        outcomes = batch.run(root, mode=args.mode, only=only, jobs=args.jobs, timeout=timeout,
                             seed=args.seed, progress=not args.no_progress, cell_timeout=cell_timeout,
                             cluster=args.cluster)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: the notebooks that finished are written and recorded in results/manifest.json "
              "(python -m repro sync updates the pages)", file=sys.stderr)
        return 130
    except ClusterError as e:  # an unreachable scheduler
        print(f"error: {e}", file=sys.stderr)
        return 2
    except batch.RunError as e:  # results/ full or read-only: what ran, then why the run stopped
        if e.outcomes:
            print(batch.summary(e.outcomes))
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(batch.summary(outcomes))
    if (root / "book" / "papers.yml").exists():
        try:
            book.sync(root)
        except OSError as e:
            print(f"error: the notebooks ran and are recorded, but the generated pages could not be updated "
                  f"({e.strerror or e}: {e.filename}); run python -m repro sync once that is fixed", file=sys.stderr)
            return 1
    failed = [o.notebook for o in outcomes if o.status != "ok"]
    if not args.book:
        return 1 if failed else 0
    built = book.build(root)
    if built:
        print("error: the notebooks ran and are recorded, but the book could not be rendered (above)", file=sys.stderr)
    elif failed:
        print(f"the book is rendered, but {len(failed)} notebook(s) did not succeed ({', '.join(failed)}): their "
              "pages show their last successful outputs under a warning; the failed runs are in results/logs/",
              file=sys.stderr)
    return 1 if failed or built else 0


def _command(args: argparse.Namespace, root: Path) -> int:
    if args.cmd == "portability":
        from . import portability

        try:
            return portability.main(root, args.only, args.b, args.set, args.a_set, args.trace, args.isolate,
                                    args.keep, args.timeout)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    from . import book

    if args.cmd == "run":
        return _run(args, root)
    if args.cmd == "prepare":
        from ..common import assets  # the one command that needs torch: it converts models

        try:
            return assets.prepare_all(only=args.only)
        except ValueError as e:  # an unknown asset name
            print(f"error: --only: {e}", file=sys.stderr)
            return 2
    if args.cmd == "new":
        from .scaffold import new_notebook

        try:
            path = new_notebook(root, args.number)
        except (ValueError, FileExistsError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"created {path.relative_to(root)}")
        return 0
    if args.cmd == "book":
        return book.build(root, strict=not args.no_strict)
    if args.check:
        stale = book.out_of_sync(root)
        warnings = [s for s in book.stale_results(root) if not s.blocking]
        print("\n".join([*(f"stale: {s}" for s in stale), *(f"warning: {w}" for w in warnings)])
              or "everything in sync")
        if stale or warnings:
            print("(python -m repro run --stale re-executes the notebooks of stale results and warnings)")
        return 1 if stale else 0
    changed = book.sync(root)
    print("\n".join(f"updated: {c}" for c in changed) or "nothing to update")
    return 0
