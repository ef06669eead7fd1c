"""The book's house style for figures, and the one explorer of every notebook.

One palette and one set of rcParams for all nineteen notebooks; the paper's reported values are drawn with
:data:`PAPER` (black open markers) so that a reader always knows which points are the paper's.
:func:`explorer` is the notebooks' interactive landscape: a slider widget when a person runs the notebook, a
static animation when the notebook is executed headless (the runner, the tests), which is what the book shows.
Figures are saved with ``run.savefig`` (:class:`repro.runtime.Run`), which also checks them against the figure
policy (:func:`figure_problems`) and records what it finds in the results file.

The figure policy (the reader issue), so that every figure can be read at the size the page shows it: at most
:data:`MAX_WIDTH_IN` inches wide (a row of four panels becomes two rows), no text below :data:`MIN_FONT_PT` points,
shown as a 2x PNG, every axis with numeric ticks labelled, legends off the data, and the paper's value drawn with
:data:`PAPER` wherever the paper reports one (the last one is for the author to keep; it cannot be checked).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np

PALETTE = ("#1b6ca8", "#d1495b", "#edae49", "#66a182", "#8d6a9f", "#2e4057", "#f28f3b", "#7f7f7f")
PAPER = {"color": "black", "marker": "o", "markerfacecolor": "none", "linestyle": "none", "label": "paper"}
REFERENCE = {"color": "0.45", "linestyle": "--", "linewidth": 1.2}

STYLE = {
    "figure.figsize": (6.4, 4.0),
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "savefig.bbox": "tight",
    "axes.prop_cycle": mpl.cycler(color=PALETTE),
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "font.size": 10,
    "svg.hashsalt": "repro",
}

HEADLESS_ENV = "REPRO_HEADLESS"  # set by the batch runner and the tests: no frontend, render the animation
EXPLORER_DPI = 72  # one frame/dpi policy keeps an explorer's animation well under 1 MB
EXPLORER_MAX_FRAMES = 12


MAX_WIDTH_IN = 7.0  # the book's text column shows a 7 in figure at about 1:1, so a 9 pt label stays 9 pt
MIN_FONT_PT = 9.0


def use_style() -> None:
    """Apply the house style to matplotlib and show inline figures as 2x PNG (idempotent)."""
    mpl.rcParams.update(STYLE)
    try:
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:  # matplotlib without a Jupyter kernel: nothing is shown inline
        return
    set_matplotlib_formats("retina")


def figure_problems(fig: Any) -> list[str]:
    """Where ``fig`` breaks the figure policy (module docstring), one sentence each; empty if it follows it.

    Draws the figure to measure it: the width, every visible text's size, each panel's axis labels (an axis
    whose tick labels are numbers needs a label; hidden, shared or categorical tick labels do not) and the data
    points (line vertices and scatter offsets in data coordinates) that a panel's legend covers."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    problems = []
    width = float(fig.get_size_inches()[0])
    if width > MAX_WIDTH_IN + 1e-6:
        problems.append(f"{width:g} in wide (at most {MAX_WIDTH_IN:g} in: put a row of panels into two rows)")
    small = sorted({round(float(t.get_fontsize()), 1) for t in fig.findobj(mpl.text.Text)
                    if t.get_visible() and t.get_text().strip() and t.get_fontsize() < MIN_FONT_PT - 1e-6})
    if small:
        problems.append(f"text at {', '.join(f'{s:g}' for s in small)} pt (at least {MIN_FONT_PT:g} pt)")
    for i, ax in enumerate(fig.axes):
        problems += [f"panel {i + 1}: {p}" for p in _panel_problems(ax, renderer)]
    return problems


def _panel_problems(ax: Any, renderer: Any) -> list[str]:
    if not ax.get_visible() or not ax.axison or ax.name != "rectilinear" or hasattr(ax, "_colorbar"):
        return []
    if not (ax.lines or ax.collections or ax.images or ax.patches):
        return []
    out = [f"the {name} axis has numeric tick labels but no label"
           for name, axis, label in (("x", ax.xaxis, ax.get_xlabel()), ("y", ax.yaxis, ax.get_ylabel()))
           if not label.strip() and _numeric_ticks(axis)]
    legend = ax.get_legend()
    if legend is not None and legend.get_visible():
        box = legend.get_window_extent(renderer)
        covered = int(sum(((xy >= (box.x0, box.y0)) & (xy <= (box.x1, box.y1))).all(axis=1).sum()
                          for xy in _data_points(ax)))
        if covered:
            out.append(f"the legend covers {covered} data point(s): place it off the data (e.g. outside the axes)")
    return out


def _numeric_ticks(axis: Any) -> bool:
    """True if ``axis`` shows tick labels that are numbers (not hidden, not category names)."""
    if not axis.get_visible():
        return False
    texts = [t.get_text().strip() for t in axis.get_ticklabels() if t.get_visible() and t.get_text().strip()]
    if not texts:
        return False
    def number(text: str) -> bool:
        cleaned = text.replace("\u2212", "-").replace("$", "").replace("\\mathdefault{", "").replace("}", "")
        cleaned = cleaned.replace("^", "e").replace("{", "").replace("%", "").replace("×", "")
        try:
            float(cleaned.replace("10e", "1e"))
        except ValueError:
            return False
        return True
    return sum(number(t) for t in texts) * 2 > len(texts)


def _data_points(ax: Any) -> list[np.ndarray]:
    """The display coordinates of ``ax``'s line vertices and scatter offsets drawn in data coordinates."""
    points = []
    for line in ax.lines:
        if line.get_visible() and line.get_transform() == ax.transData and len(line.get_xydata()):
            points.append(ax.transData.transform(np.asarray(line.get_xydata(), dtype=float)))
    for coll in ax.collections:
        offsets = np.asarray(coll.get_offsets(), dtype=float)
        if coll.get_visible() and offsets.ndim == 2 and len(offsets) and coll.get_offset_transform() == ax.transData:
            points.append(ax.transData.transform(offsets))
    return [p[np.isfinite(p).all(axis=1)] for p in points]


def headless() -> bool:
    """True when no person is looking at a live frontend (``$REPRO_HEADLESS`` set, as the runner and tests do)."""
    return os.environ.get(HEADLESS_ENV, "") not in ("", "0")


def _frames(frames: Sequence[Mapping[str, Any]] | None, sliders: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """Complete each frame with the other sliders' first values; default: walk the first slider."""
    first = {k: v[0] for k, v in sliders.items()}
    if frames is None:
        name = next(iter(sliders))
        frames = [{name: v} for v in sliders[name]]
    out = []
    for f in frames:
        unknown = sorted(set(f) - set(sliders))
        if unknown:
            raise ValueError(f"explorer frame names {unknown}, which are not sliders ({sorted(sliders)})")
        out.append({**first, **f})
    if not out or len(out) > EXPLORER_MAX_FRAMES:
        raise ValueError(f"explorer needs 1 to {EXPLORER_MAX_FRAMES} frames, got {len(out)}")
    return out


def _draw_into(draw: Callable[..., None], axes: Any, values: Mapping[str, Any]) -> None:
    for ax in np.atleast_1d(axes).flat:
        ax.clear()
    draw(axes, **values)


def explorer(draw: Callable[..., None], frames: Sequence[Mapping[str, Any]] | None = None, *,
             nrows: int = 1, ncols: int = 1, figsize: tuple[float, float] = (10.0, 3.4),
             interval_ms: int = 1200, **sliders: Sequence[Any]) -> None:
    """Explore a landscape: ``draw(axes, **values)`` draws one setting into freshly cleared axes (``axes`` as
    ``plt.subplots(nrows, ncols)`` returns them); each keyword names a slider and its values.

    With a live frontend this shows one selection slider per keyword. Executed headless (:func:`headless`), it
    shows a static animation over ``frames`` (dicts of slider values; default: every value of the first slider,
    the others at their first value), at most :data:`EXPLORER_MAX_FRAMES` frames at :data:`EXPLORER_DPI`. No
    widget is created headless, so nothing waits on a frontend that is not there.
    """
    if not sliders:
        raise ValueError("explorer needs at least one slider, e.g. threshold=[0.1, 0.3]")
    sliders = {k: list(v) for k, v in sliders.items()}
    empty = [k for k, v in sliders.items() if not v]
    if empty:
        raise ValueError(f"explorer sliders without values: {empty}")
    frame_list = _frames(frames, sliders)
    from IPython.display import HTML, display

    if not headless():
        import ipywidgets as widgets

        # Sliders and a display handle, no Output widget (so no ``interact``): a client without a frontend
        # (papermill, nbconvert) mimics an Output widget by writing on the shell channel while it awaits the
        # cell's reply, and jupyter_client >= 8 can lose that reply (issue 12; repro.tools.launcher).
        controls = {k: widgets.SelectionSlider(options=v, value=v[0], description=k) for k, v in sliders.items()}
        fig, axes = plt.subplots(nrows, ncols, figsize=figsize, layout="constrained")
        plt.close(fig)

        def render() -> Any:
            _draw_into(draw, axes, {k: c.value for k, c in controls.items()})
            return fig

        display(widgets.VBox(list(controls.values())))
        handle = display(render(), display_id=True)
        for c in controls.values():
            c.observe(lambda _change: handle.update(render()), names="value")
        return
    from matplotlib import animation

    with plt.rc_context({"savefig.dpi": EXPLORER_DPI, "savefig.bbox": None, "figure.dpi": EXPLORER_DPI}):
        fig, axes = plt.subplots(nrows, ncols, figsize=figsize, layout="constrained")
        anim = animation.FuncAnimation(fig, lambda i: _draw_into(draw, axes, frame_list[i]),
                                       frames=len(frame_list), interval=interval_ms)
        html = anim.to_jshtml(default_mode="once")
        plt.close(fig)
    display(HTML(html))
