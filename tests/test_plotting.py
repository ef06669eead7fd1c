"""repro.plotting.explorer: a static animation headless (no widget, nothing waits on a frontend), a slider
widget live; bad sliders and frames are refused."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
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


def _good_figure():
    plotting.use_style()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot([0, 1, 2], [0, 1, 4], label="ours")
    ax.plot([0, 1, 2], [0, 2, 3], **plotting.PAPER)
    ax.set(xlabel="step", ylabel="loss")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig, ax


def test_a_figure_that_follows_the_policy_has_no_problems():
    fig, _ = _good_figure()
    assert plotting.figure_problems(fig) == []
    plt.close(fig)


def test_the_policy_finds_wide_figures_small_text_unlabelled_axes_and_covering_legends():
    fig, ax = _good_figure()
    fig.set_size_inches(14, 4)
    ax.set_ylabel("")
    ax.set_title("tiny", fontsize=7)
    ax.legend(loc="center")  # on top of the data
    ax.plot([1.0], [2.0], "o")
    problems = " | ".join(plotting.figure_problems(fig))
    assert "14 in wide" in problems and "text at 7 pt" in problems
    assert "the y axis has numeric tick labels but no label" in problems
    assert "the x axis" not in problems and "legend covers" in problems
    plt.close(fig)


def test_categorical_hidden_and_shared_tick_labels_need_no_axis_label():
    plotting.use_style()
    fig, axes = plt.subplots(1, 2, figsize=(6.4, 3), sharey=True)
    for ax in axes:
        ax.bar(["Adam", "Muon"], [1.0, 2.0])
    axes[0].set_ylabel("loss")  # the right panel's y tick labels are hidden (shared axis)
    assert plotting.figure_problems(fig) == []
    plt.close(fig)


def test_run_savefig_records_the_problems(tmp_path, monkeypatch):
    from repro.runtime import Run
    from repro.tools import paths

    monkeypatch.setattr(paths, "figure_file", lambda slug, name: tmp_path / f"{name}.png")
    run = Run(slug="99-test", mode="quick", seed=0, device=None, rng=np.random.default_rng(0))
    fig, ax = _good_figure()
    run.savefig(fig, "good")
    fig.set_size_inches(9, 3)
    run.savefig(fig, "wide")
    assert run.figures["good"] == [] and "9 in wide" in run.figures["wide"][0]
    plt.close(fig)
