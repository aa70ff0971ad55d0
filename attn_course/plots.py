"""Figures shared by the notebooks: one consistent look, token-labelled heatmaps, quick line plots.

The course's look (:data:`STYLE`) is applied per figure, never to matplotlib's global settings: figure
functions are decorated with :func:`styled` (or build their figure inside :func:`course_style`), so
importing ``attn_course`` changes nothing in a learner's own plots.

Readability at 1366×768 (JupyterLab shrinks a figure wider than its output area, and its text with
it): figures are at most :data:`MAX_WIDTH` inches wide at 100 dpi and no text is smaller than
:data:`MIN_FONT` points, so text is never drawn under 9 pixels. :func:`readability_problems` tests a
figure against both rules.

Every function returns the matplotlib ``Figure`` (the notebooks end a cell with ``plt.show()`` or
just the figure), so figures can also be saved or embedded in widgets.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator, Sequence, TypeVar

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

__all__ = ["STYLE", "MAX_WIDTH", "MIN_FONT", "WEIGHTS_CMAP", "SIGNED_CMAP", "course_style", "styled",
           "readability_problems", "heatmap", "line_plot"]

# A sequential colour map that stays readable in grey-scale and for colour-blind readers.
WEIGHTS_CMAP = "viridis"
# A diverging one for signed values (scores, differences), centred on zero.
SIGNED_CMAP = "RdBu_r"
#: Widest figure, in inches at :data:`STYLE`'s 100 dpi: 960 px fit JupyterLab's output area at 1366×768.
MAX_WIDTH = 9.6
#: Smallest font size, in points (9 pt at 100 dpi is 12.5 px; still 10 px if the figure is shrunk to 80 %).
MIN_FONT = 9.0

STYLE = {
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "font.size": 11,
    "axes.titlesize": 12,
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": False,
}

F = TypeVar("F", bound=Callable)


@contextlib.contextmanager
def course_style() -> Iterator[None]:
    """Build figures in the course's look inside this block; matplotlib's settings are restored after it."""
    with matplotlib.rc_context(STYLE):
        yield


def styled(fn: F) -> F:
    """Decorate a function that builds a figure so that it builds it in the course's look."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with course_style():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def readability_problems(fig: plt.Figure) -> list[str]:
    """What keeps ``fig`` from being readable at 1366×768: too wide, or text under :data:`MIN_FONT` pt."""
    problems = []
    width = fig.get_figwidth() * fig.dpi / 100
    if width > MAX_WIDTH + 1e-9:
        problems.append(f"figure is {width:.1f} in wide at 100 dpi (at most {MAX_WIDTH})")
    fig.canvas.draw()  # tick labels exist only once drawn
    for text in fig.findobj(matplotlib.text.Text):
        if text.get_visible() and text.get_text().strip() and text.get_fontsize() < MIN_FONT:
            problems.append(f"text {text.get_text()[:30]!r} is {text.get_fontsize():g} pt (at least {MIN_FONT:g})")
    return problems


def _to_numpy(values) -> np.ndarray:
    if hasattr(values, "detach"):
        import torch

        values = values.detach().cpu().to(dtype=torch.float64).numpy()
    return np.asarray(values, dtype=float)


@styled
def heatmap(
    values,
    *,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    title: str = "",
    xlabel: str = "key",
    ylabel: str = "query",
    annotate: bool | None = None,
    fmt: str = "{:.2f}",
    signed: bool | None = None,
    vmin: float | None = None,
    vmax: float | None = None,
    ax: plt.Axes | None = None,
    colorbar: bool = True,
) -> plt.Figure:
    """Draw a 2-D matrix (e.g. attention weights, shape (queries, keys)) with labelled rows and columns.

    Cells are annotated with their values when the matrix is small enough to read (≤ 12×12);
    masked entries (``-inf`` or NaN) are drawn in light grey and left blank.
    """
    data = _to_numpy(values)
    if data.ndim != 2:
        raise ValueError(f"heatmap needs a 2-D matrix, got shape {data.shape}")
    finite = np.isfinite(data)
    if signed is None:
        signed = bool(finite.any() and data[finite].min() < 0)
    if ax is None:
        n_rows, n_cols = data.shape
        fig, ax = plt.subplots(figsize=(min(1.0 + 0.55 * n_cols, MAX_WIDTH - 1.2) + 1.2, min(0.8 + 0.5 * n_rows, 8)))
    else:
        fig = ax.figure
    shown = np.ma.masked_invalid(data)
    if signed:
        bound = float(np.abs(data[finite]).max()) if finite.any() else 1.0
        vmin, vmax = (-bound, bound) if vmin is None and vmax is None else (vmin, vmax)
        cmap = plt.get_cmap(SIGNED_CMAP)
    else:
        cmap = plt.get_cmap(WEIGHTS_CMAP)
    cmap = cmap.with_extremes(bad="#e6e6e6")  # masked entries (-inf, NaN) in light grey
    image = ax.imshow(shown, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    if row_labels is not None:
        ax.set_yticks(range(len(row_labels)), labels=list(row_labels))
    if col_labels is not None:
        long = max(map(len, col_labels), default=0) > 3
        ax.set_xticks(range(len(col_labels)), labels=list(col_labels), rotation=45 if long else 0,
                      ha="right" if long else "center")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if annotate is None:
        annotate = data.shape[0] <= 12 and data.shape[1] <= 12
    if annotate:
        lo, hi = image.get_clim()
        for (i, j), v in np.ndenumerate(data):
            if not np.isfinite(v):
                continue
            level = (v - lo) / (hi - lo) if hi > lo else 0.5
            dark_cell = level < 0.6 if not signed else abs(level - 0.5) > 0.3
            text = fmt.format(v)
            if text.startswith("-") and not text.strip("-0.,"):
                text = text[1:]  # -0.00: a tiny negative number shows as 0.00
            ax.text(j, i, text, ha="center", va="center", fontsize=MIN_FONT,
                    color="white" if dark_cell else "black")
    if colorbar:
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    return fig


@styled
def line_plot(
    x,
    series: dict[str, Sequence[float]],
    *,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    logx: bool = False,
    logy: bool = False,
    ax: plt.Axes | None = None,
    markers: bool = True,
) -> plt.Figure:
    """Plot several named series against ``x`` with a legend (log axes on request)."""
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
    else:
        fig = ax.figure
    for name, ys in series.items():
        style = "--" if name.lower().startswith(("theory", "expected", "reference")) else "-"
        ax.plot(_to_numpy(x), _to_numpy(ys), style, marker="o" if markers and style == "-" else None, label=name)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if len(series) > 1:
        ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig
