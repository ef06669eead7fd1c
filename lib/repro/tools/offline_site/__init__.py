"""Not imported: this folder goes on a guarded process's ``$PYTHONPATH`` so that child Pythons run its
``sitecustomize`` (see :mod:`repro.tools.offline`). A package only so that it ships in the wheel."""
