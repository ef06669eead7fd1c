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


def test_live_explorer_is_sliders_and_a_display_handle(monkeypatch):
    """Live: one slider per keyword and a figure shown through a display handle that each slider updates; no
    ``interact`` (its Output widget is what made headless clients lose messages, issue 12)."""
    monkeypatch.delenv(plotting.HEADLESS_ENV, raising=False)
    InteractiveShell.instance()
    import ipywidgets

    monkeypatch.setattr(ipywidgets, "interact", lambda *a, **k: pytest.fail("no interact: it needs an Output widget"))
    shown, updates, drawn = [], [], []

    class Handle:
        def update(self, obj):
            updates.append(obj)

    def fake_display(*objs, display_id=None, **kw):
        shown.extend(objs)
        return Handle() if display_id else None

    monkeypatch.setattr("IPython.display.display", fake_display)
    plotting.explorer(lambda axes, t, c: drawn.append((t, c)), t=[0.1, 0.5], c=["k", "r"])
    box, fig = shown
    sliders = {w.description: w for w in box.children}
    assert sorted(sliders) == ["c", "t"] and drawn == [(0.1, "k")]
    sliders["t"].value = 0.5
    assert drawn[-1] == (0.5, "k") and updates == [fig]


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
