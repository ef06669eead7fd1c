"""repro.plotting.explorer: a static animation headless (no widget, nothing waits on a frontend), a slider
widget live; bad sliders and frames are refused."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
from IPython.core.interactiveshell import InteractiveShell

from repro import plotting


def draw(axes, t, c="k"):
    axes.plot([0, 1], [0, t], color=c)


@pytest.fixture
def shown(monkeypatch):
    out = []
    monkeypatch.setattr("IPython.display.display", lambda *a, **k: out.extend(a))
    return out


def test_headless_explorer_is_a_static_animation(monkeypatch, shown):
    monkeypatch.setenv(plotting.HEADLESS_ENV, "1")
    import ipywidgets

    monkeypatch.setattr(ipywidgets, "interact", lambda *a, **k: pytest.fail("no widget headless"))
    plotting.explorer(draw, t=[0.1, 0.5, 0.9], c=["k", "r"])
    (html,) = shown
    assert "<script" in html.data and html.data.count("data:image/png;base64") == 3


def test_live_explorer_is_a_widget(monkeypatch):
    monkeypatch.delenv(plotting.HEADLESS_ENV, raising=False)
    InteractiveShell.instance()
    calls = []
    import ipywidgets

    monkeypatch.setattr(ipywidgets, "interact", lambda f, **k: calls.append(sorted(k)))
    plotting.explorer(draw, t=[0.1, 0.5], c=["k", "r"])
    assert calls == [["c", "t"]]


def test_explorer_refuses_bad_input(monkeypatch, shown):
    monkeypatch.setenv(plotting.HEADLESS_ENV, "1")
    with pytest.raises(ValueError, match="at least one slider"):
        plotting.explorer(draw)
    with pytest.raises(ValueError, match="without values"):
        plotting.explorer(draw, t=[])
    with pytest.raises(ValueError, match="not sliders"):
        plotting.explorer(draw, frames=[{"s": 1}], t=[1])
    with pytest.raises(ValueError, match="1 to 12 frames"):
        plotting.explorer(draw, t=list(range(13)))
