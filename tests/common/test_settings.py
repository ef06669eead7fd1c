"""repro.common.settings: the one hand-off from a notebook configuration to a library dataclass."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from repro.common.settings import dataclass_from
from repro.papers.d3llm.experiment import Recipe as D3Recipe
from repro.papers.pace.experiment import Recipe as PaceRecipe


@dataclass
class _R:
    a: int = 1
    b: str = "x"


def test_takes_the_fields_it_names_and_keeps_the_other_defaults():
    assert dataclass_from(_R, {"a": 5, "notebook_only": 3}) == _R(5, "x")
    assert dataclass_from(_R, {}) == _R()
    with pytest.raises(TypeError, match="needs a dataclass"):
        dataclass_from(dict, {"a": 1})


@pytest.mark.parametrize("cls", [D3Recipe, PaceRecipe])
def test_the_papers_recipes_use_it(cls):
    default = cls()
    first = next(iter(vars(default)))
    changed = cls.from_config({first: getattr(default, first), "seeds": [1, 2]})
    assert changed == default
