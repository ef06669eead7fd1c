"""Python runs this at start-up when this folder is on ``$PYTHONPATH``: the offline guard of
``repro.tools.offline`` puts it there (with ``$REPRO_OFFLINE=1``) when it is installed, so a child Python of a
guarded process (``subprocess.run([sys.executable, ...])``, ``pip``) is guarded too. It loads ``offline.py`` by
path (the child need not be able to import ``repro``, and loading it costs no import of the package), installs the
guard if ``$REPRO_OFFLINE`` asks for it, then runs the ``sitecustomize`` this file shadows, if any."""

import importlib.util
import os
import sys


def _load(name: str, path: str) -> None:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


def _install_guard() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        _load("_repro_offline_guard", os.path.join(os.path.dirname(here), "offline.py"))
        guard = sys.modules["_repro_offline_guard"]
        if guard.requested():
            guard.install()
    except Exception as e:  # never stop the child from starting; say why it runs unguarded
        print(f"repro offline guard: not installed in this process ({type(e).__name__}: {e})", file=sys.stderr)
    for entry in sys.path:  # the sitecustomize this one shadows
        if os.path.abspath(entry or os.curdir) == here:
            continue
        other = os.path.join(entry or os.curdir, "sitecustomize.py")
        if os.path.isfile(other):
            _load("_repro_shadowed_sitecustomize", other)
            break


_install_guard()
