"""What produced a result: atomic writes, content hashes of the sources, package versions and the hardware.

A results file names the code that produced it by content, not by a ``git describe`` that is ``-dirty`` whenever
anything in the checkout is uncommitted (:func:`sources`):

* ``notebook``: a hash of the notebook's source cells (type and source of every cell, markdown included; never
  outputs or metadata, never the generated header and setup cells nor papermill's injected parameters), so
  executing a notebook or regenerating its header does not change it;
* ``library``: a hash of every ``.py`` file of the ``repro`` package (``lib/repro``);
* ``library_files``: a hash per library module the notebook had loaded when it finished, so a later check can
  name the modules that changed since (:func:`changed_files`), and an edit to one paper's package does not make
  every other paper's results stale;
* ``claims``: the hash of the notebook's claims registry (``repro/claims/<slug>.yml``), ``None`` without one;
* ``commit``: the commit whose tree holds exactly those notebook sources, modules and registry, else ``None``.

Hashes are ``sha256:`` and 16 hex digits over relative POSIX paths, sorted, with line endings normalised to LF,
so they are the same on every machine and checkout. Imports no torch: :func:`hardware` reads torch's threads and
GPU only if the caller already imported it.

Reading what the book keeps (:func:`read_json`, :func:`read_results`, :func:`read_manifest`, :func:`read_notebook`)
tells a missing file (``None``, or an empty manifest) from one that exists but cannot be used: that is an
:class:`UnreadableFile` error naming the file and the parse error (line and column), never "no results" and never
an empty manifest that the next write would put in its place.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from .paths import project_root

BASE_PACKAGES = ("torch", "numpy", "scipy", "pandas", "matplotlib", "icml26-repro")


class UnreadableFile(ValueError):
    """A file the book keeps (a results record, the manifest, a notebook) exists but cannot be read or is not what
    it should be. The message names the file, says what is wrong with it and how to get it back; the file is left
    as it is."""

    def __init__(self, path: Path, problem: str, fix: str = "restore it (e.g. from git) and try again"):
        self.path = Path(path)
        super().__init__(f"{shown(self.path)} {problem}; {fix}")


def shown(path: Path) -> str:
    """``path`` for a message: relative to the current folder when it lies inside it, else as given."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except (ValueError, OSError):
        return str(path)


def read_json(path: Path, fix: str | None = None) -> Any | None:
    """The JSON value in ``path``; ``None`` if the file does not exist; :class:`UnreadableFile` (saying ``fix``)
    if it exists but cannot be read or is not valid JSON (a merge conflict, a truncated write)."""
    more = {} if fix is None else {"fix": fix}
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as e:
        raise UnreadableFile(path, f"is not UTF-8 text ({e.reason} at byte {e.start})", **more) from None
    except OSError as e:
        raise UnreadableFile(path, f"cannot be read ({e.strerror or e})", **more) from None
    try:
        return json.loads(text)
    except ValueError as e:  # json.JSONDecodeError says where: "Expecting ',' delimiter: line 3 column 5 (char 40)"
        raise UnreadableFile(path, f"is not valid JSON ({e})", **more) from None


def read_results(path: Path) -> dict[str, Any] | None:
    """A results record ``results/NN-slug.json`` (:func:`repro.report.finish`): ``None`` if there is none,
    :class:`UnreadableFile` if the file is not valid JSON or not a record (an object with a ``claims`` list)."""
    fix = (f"restore it (git checkout -- {shown(path)}) or re-run its notebook "
           f"(python -m repro run --only {Path(path).name[:2]})")
    record = read_json(path, fix)
    if record is None:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("claims"), list):
        raise UnreadableFile(path, "is not a results record (a JSON object with a 'claims' list)", fix)
    return record


MANIFEST_FIX = ("it holds the run record of every notebook, so nothing overwrites it: repair it (after a merge "
                "conflict keep the records of both sides) or move it aside, then try again")


def read_manifest(path: Path) -> dict[str, Any]:
    """``results/manifest.json``: ``{"notebooks": {}}`` if it does not exist yet; :class:`UnreadableFile` (the
    file kept as it is) if it exists but is not valid JSON or not a manifest, so no run replaces its records."""
    if not Path(path).exists():
        return {"notebooks": {}}
    data = read_json(path, MANIFEST_FIX)
    if not isinstance(data, dict) or not isinstance(data.setdefault("notebooks", {}), dict):
        raise UnreadableFile(path, "is not a run manifest (a JSON object with a 'notebooks' object)", MANIFEST_FIX)
    return data


def read_notebook(path: Path) -> Any:
    """The notebook at ``path`` as an ``nbformat`` v4 node; :class:`UnreadableFile` (naming the file, and the line
    and column where its JSON breaks) if it is missing, truncated or not a notebook."""
    import nbformat

    fix = f"restore it (git checkout -- {shown(path)}, or from a backup)"
    data = read_json(path, fix)
    if data is None:
        raise UnreadableFile(path, "does not exist", "check the path")
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise UnreadableFile(path, "is not a notebook (a JSON object with a 'cells' list)", fix)
    try:
        return nbformat.reads(json.dumps(data), as_version=4)
    except Exception as e:  # nbformat raises assorted errors for a notebook it cannot convert
        raise UnreadableFile(path, f"is not a notebook nbformat can read ({type(e).__name__}: {e})", fix) from None


def write_text_atomic(path: Path, text: str) -> None:
    """Write through a temporary file and ``os.replace``: readers see the old or the new file, never half."""
    write_bytes_atomic(path, text.encode())


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Bytes version of :func:`write_text_atomic`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write ``payload`` as indented, strict JSON (NaN and infinities as ``null``: :func:`strict_json`),
    atomically (see :func:`write_text_atomic`)."""
    text = json.dumps(strict_json(payload), indent=2, allow_nan=False)
    write_text_atomic(path, text + "\n")


def strict_json(x: Any) -> Any:
    """``x`` with what strict JSON cannot hold converted: arrays and tensors as lists, paths as strings, NaN and
    infinities as ``None`` (read back as ``null``); raises ``TypeError`` for anything else."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if x is None or isinstance(x, bool | int | str):
        return x
    if isinstance(x, Mapping):
        return {str(k): strict_json(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [strict_json(v) for v in x]
    if hasattr(x, "tolist"):  # numpy arrays and scalars, torch tensors
        return strict_json(x.tolist())
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def git_revision(root: Path | None = None) -> str | None:
    """``git describe``-style revision of the checkout (with ``-dirty``), or ``None`` outside git."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=12"],
            cwd=root or project_root() or Path.cwd(), capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


# Cells that are not the notebook's own source: generated by `repro sync` (the claims list from the claims registry,
# whose own hash is recorded apart) or injected by papermill.
GENERATED_TAGS = ("book-header", "setup", "injected-parameters", "claims-registry")
NOTEBOOK_ENV = "REPRO_NOTEBOOK"  # the notebook being executed, set by the batch runner for its kernel
MISSING = "missing"


def _lf(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def digest(parts: Iterable[tuple[str, str]]) -> str:
    """``sha256:`` and 16 hex digits over (name, text) pairs, each length-prefixed, text normalised to LF."""
    h = hashlib.sha256()
    for name, text in parts:
        for piece in (name, _lf(text)):
            data = piece.encode("utf-8")
            h.update(len(data).to_bytes(8, "big"))
            h.update(data)
    return "sha256:" + h.hexdigest()[:16]


def library_dir() -> Path:
    """The ``repro`` package's folder (``lib/repro`` in a checkout)."""
    return Path(__file__).resolve().parents[1]


def _rel(path: Path, base: Path) -> str:
    return path.relative_to(base).as_posix()


def library_sources(package: Path | None = None) -> list[str]:
    """Every ``.py`` file of the package, as sorted POSIX paths relative to its parent (``repro/...``)."""
    package = package or library_dir()
    return sorted(_rel(p, package.parent) for p in package.rglob("*.py") if "__pycache__" not in p.parts)


def file_hash(path: Path) -> str:
    """The hash of one text file's content (LF-normalised), or ``"missing"``."""
    try:
        return digest([("", path.read_bytes().decode("utf-8", errors="replace"))])
    except OSError:
        return MISSING


def library_hash(package: Path | None = None) -> str:
    """One hash over every ``.py`` file of the library: relative path and content, in path order."""
    package = package or library_dir()
    return digest((rel, (package.parent / rel).read_bytes().decode("utf-8", errors="replace"))
                  for rel in library_sources(package))


def loaded_library_files() -> dict[str, str]:
    """``{"repro/...py": hash}`` for every library module loaded in this process (what a notebook used)."""
    package = library_dir()
    found = {}
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if not f or not f.endswith(".py"):
            continue
        path = Path(f).resolve()
        if path.is_relative_to(package):
            found[_rel(path, package.parent)] = file_hash(path)
    return dict(sorted(found.items()))


def changed_files(recorded: Mapping[str, str], package: Path | None = None) -> list[str]:
    """The recorded library modules whose content differs now (or that are gone), sorted."""
    base = (package or library_dir()).parent
    return sorted(rel for rel, h in recorded.items() if file_hash(base / rel) != h)


def notebook_source_hash(nb: Path | Mapping[str, Any]) -> str:
    """The hash of a notebook's own source cells (see the module docstring): cell type and source, in order."""
    if isinstance(nb, Path):
        path, nb = nb, read_json(nb, f"restore it (git checkout -- {shown(nb)}, or from a backup)")
        if not isinstance(nb, dict):
            raise UnreadableFile(path, "does not exist" if nb is None else "is not a notebook", "check the path")
    parts = []
    for cell in nb.get("cells", []):
        tags = cell.get("metadata", {}).get("tags", [])
        if any(t in GENERATED_TAGS for t in tags):
            continue
        src = cell.get("source", "")
        parts.append((cell.get("cell_type", ""), "".join(src) if isinstance(src, list) else src))
    return digest(parts)


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def commit_if_clean(root: Path | None, notebook: Path | None, notebook_hash: str | None,
                    files: Iterable[str], package: Path | None = None) -> str | None:
    """The ``HEAD`` commit if it holds exactly these sources: the notebook's source cells hash the same at
    ``HEAD`` and none of the library ``files`` (``repro/...``, under ``lib/``) differ from ``HEAD``. Else ``None``
    (uncommitted changes, outside a git checkout, or the library is not the checkout's ``lib/repro``)."""
    if root is None or notebook is None or notebook_hash is None:
        return None
    root = root.resolve()
    if (package or library_dir()).resolve() != root / "lib" / "repro" or not notebook.resolve().is_relative_to(root):
        return None
    head = _git(root, "rev-parse", "--verify", "HEAD")
    if not head:
        return None
    rel_nb = notebook.resolve().relative_to(root).as_posix()
    committed = _git(root, "show", f"HEAD:{rel_nb}")
    try:
        if committed is None or notebook_source_hash(json.loads(committed)) != notebook_hash:
            return None
    except ValueError:
        return None
    paths = [f"lib/{f}" for f in files]
    if paths:
        status = _git(root, "status", "--porcelain", "--untracked-files=all", "--", *paths)
        if status is None or status.strip():
            return None
    return head.strip()


def current_notebook(slug: str) -> Path | None:
    """The notebook being run: ``$REPRO_NOTEBOOK`` (set by the batch runner), else ``notebooks/<slug>.ipynb`` of
    the checkout, else ``None`` (e.g. on Colab without a checkout)."""
    if os.environ.get(NOTEBOOK_ENV):
        return Path(os.environ[NOTEBOOK_ENV])
    root = project_root()
    path = root / "notebooks" / f"{slug}.ipynb" if root else None
    return path if path is not None and path.exists() else None


def sources(slug: str) -> dict[str, Any]:
    """What produced the results of notebook ``slug`` (see the module docstring), for its results file."""
    nb = current_notebook(slug)
    try:
        nb_hash = notebook_source_hash(nb) if nb is not None else None
    except (OSError, ValueError):
        nb_hash = None
    files = loaded_library_files()
    root = project_root(nb.parent) if nb is not None else project_root()
    registry = claims_file(slug)
    clean = [*files, _rel(registry, library_dir().parent)] if registry.exists() else list(files)
    return {"notebook": nb_hash, "library": library_hash(), "library_files": files,
            "claims": file_hash(registry) if registry.exists() else None,
            "commit": commit_if_clean(root, nb, nb_hash, clean)}


def claims_file(slug: str) -> Path:
    """The claims registry of notebook ``slug`` (``repro/claims/<slug>.yml``; it may not exist)."""
    return library_dir() / "claims" / f"{slug}.yml"


def versions(packages: Iterable[str] = ()) -> dict[str, str]:
    """Installed versions of Python, the base packages and ``packages`` (a paper's own libraries)."""
    found = {"python": platform.python_version()}
    for name in dict.fromkeys((*BASE_PACKAGES, *packages)):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def cpu_identity() -> dict[str, str]:
    """The CPU as numerical libraries see it: vendor and model (``/proc/cpuinfo``, else ``platform.processor()``), a
    hash of its feature flags, and a hash of the variables that choose kernels (:data:`NUMERIC_ENV`). Two runs whose
    identities agree ran the same kernels, where quick mode must give bit-identical numbers; elsewhere only what the
    evidence contract guarantees must agree."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("vendor_id", "model name", "flags") and key not in fields:
                fields[key] = value.strip()
            if len(fields) == 3:
                break
    except OSError:
        pass
    model = " ".join(v for v in (fields.get("vendor_id"), fields.get("model name")) if v) or platform.processor()
    flags = " ".join(sorted(fields.get("flags", "").split()))
    knobs = [(k, os.environ.get(k, "")) for k in NUMERIC_ENV]
    return {"cpu": model or "unknown", "cpu_flags": digest([("flags", flags)]) if flags else "unknown",
            "numeric_env": digest(knobs)}


# The variables that choose numerical kernels (repro.tools.portable): two runs agree bit for bit only when these agree
# too, so an emulated other machine (the same CPU, other settings) is compared as another machine.
NUMERIC_ENV = ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
               "NPY_DISABLE_CPU_FEATURES", "OPENBLAS_CORETYPE", "REPRO_PORTABLE_KERNELS", "OMP_NUM_THREADS",
               "MKL_NUM_THREADS")


def hardware() -> dict[str, Any]:
    """The machine in a few fields: OS, CPU (:func:`cpu_identity`), core count, torch threads and the GPU if any."""
    info: dict[str, Any] = {
        "platform": platform.platform(terse=True),
        "machine": platform.machine(),
        **cpu_identity(),
        "cpu_count": os.cpu_count(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch_threads"] = torch.get_num_threads()
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return info
