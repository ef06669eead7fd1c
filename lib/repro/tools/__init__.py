"""Book tooling: paths, provenance, the batch runner, the book build and the command line.

Nothing here imports torch, and neither notebooks nor paper modules import from here (the notebook-facing API
``repro.runtime`` / ``repro.report`` / ``repro.plotting`` / ``repro.bench`` uses :mod:`paths` and
:mod:`provenance` on their behalf).
"""
