"""From a notebook's configuration to a library dataclass: one hand-off, so a setting reaches the library the same
way in every paper. Users: ``repro.papers.d3llm.Recipe`` and ``repro.papers.pace.Recipe`` (``from_config``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["dataclass_from"]


def dataclass_from(cls: type[T], settings: Mapping[str, Any]) -> T:
    """``cls`` built from the keys of ``settings`` that name its fields; the other keys belong to the notebook
    (the fields it lacks keep their defaults). ``cls`` must be a dataclass."""
    if not (isinstance(cls, type) and is_dataclass(cls)):
        raise TypeError(f"dataclass_from needs a dataclass, got {cls!r}")
    return cls(**{f.name: settings[f.name] for f in fields(cls) if f.init and f.name in settings})
