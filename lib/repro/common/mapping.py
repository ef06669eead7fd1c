"""The ``mapper`` hand-off: a paper's experiment runs independent jobs through ``mapper(fn, items)``, so that a
notebook can pass ``run.map`` (:meth:`repro.runtime.Run.map`: both cores in quick mode on CPU) while the library,
which may not import ``repro.runtime``, defaults to the plain loop :func:`serial_map`.

Users: ``repro.papers.knowedit`` (paper 06, the editors as jobs), ``repro.papers.pace`` (paper 09, the models'
trainings) and ``repro.papers.scale_ps`` (paper 14, seeds and (seed, arm) pairs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Mapper", "serial_map"]

Mapper = Callable[[Callable[[Any], Any], Sequence[Any]], list[Any]]


def serial_map(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """``[fn(x) for x in items]``: every ``mapper``'s default."""
    return [fn(x) for x in items]
