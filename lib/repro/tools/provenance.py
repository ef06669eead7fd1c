"""What produced a result: atomic writes, the git revision, package versions and the hardware.

Imports no torch: :func:`hardware` reads torch's threads and GPU only if the caller already imported it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

from .paths import project_root

BASE_PACKAGES = ("torch", "numpy", "scipy", "pandas", "matplotlib", "icml26-repro")


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
    """Write ``payload`` as indented JSON, atomically (see :func:`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(payload, indent=2, default=jsonable) + "\n")


def jsonable(x: Any) -> Any:
    """``json.dumps`` fallback: arrays and tensors as lists, paths as strings."""
    if hasattr(x, "tolist"):  # numpy arrays and scalars, torch tensors
        return x.tolist()
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


def versions(packages: Iterable[str] = ()) -> dict[str, str]:
    """Installed versions of Python, the base packages and ``packages`` (a paper's own libraries)."""
    found = {"python": platform.python_version()}
    for name in dict.fromkeys((*BASE_PACKAGES, *packages)):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def hardware() -> dict[str, Any]:
    """The machine in a few fields: OS, CPU, core count, torch threads and the GPU if any."""
    info: dict[str, Any] = {
        "platform": platform.platform(terse=True),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch_threads"] = torch.get_num_threads()
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return info
