"""The book's house style for figures, and :func:`savefig`.

One palette and one set of rcParams for all nineteen notebooks; the paper's reported values are drawn with
:data:`PAPER` (black open markers) so that a reader always knows which points are the paper's.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib as mpl
import matplotlib.pyplot as plt

from .report import results_dir

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


def use_style() -> None:
    """Apply the house style to matplotlib (idempotent)."""
    mpl.rcParams.update(STYLE)


def savefig(fig: plt.Figure, slug: str, name: str) -> Path:
    """Save ``fig`` as ``results/figures/<slug>/<name>.png`` (for readers who want the files) and return the
    path. The figure is still shown inline by the notebook; the book renders that inline copy."""
    if not name or "/" in name:
        raise ValueError(f"figure name must be a plain file stem, got {name!r}")
    out = results_dir() / "figures" / slug / f"{name}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"Software": None})
    return out
