"""Interactive explorers with a static fallback.

:func:`explorer` turns a drawing function and a few ipywidgets controls into a live figure: moving a
control redraws it. The cell's stored output carries both the live widget and a PNG of its first
state, so a notebook opened without a running kernel (GitHub, nbviewer, an untrusted notebook in
JupyterLab) still shows a figure, and plain Python (no IPython kernel) simply draws the figure.
"""

from __future__ import annotations

import base64
import io
from typing import Callable

import matplotlib.pyplot as plt


def _live_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with the course
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _png(fig: plt.Figure) -> str:
    """The figure as base64-encoded PNG text."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


class Explorer:
    """A set of controls and an image that ``draw(**values)`` redraws whenever a control moves.

    The figure is rendered to PNG into an ``ipywidgets.Image``: it lives in the widget's state, so
    the live view needs no output capture, and every redraw is one small state update.
    """

    def __init__(self, draw: Callable[..., plt.Figure], controls: dict, title: str = ""):
        import ipywidgets as widgets

        self.draw = draw
        self.controls = controls
        self.title = title
        self.image = widgets.Image(format="png", layout=widgets.Layout(max_width="100%", height="auto", align_self="flex-start"))
        header = [widgets.HTML(f"<b>{title}</b>")] if title else []
        self.widget = widgets.VBox(header + [widgets.HBox(list(controls.values())), self.image])
        self.widget.add_class("attn-course-explorer")
        for control in controls.values():
            control.observe(lambda change: self.refresh(), names="value")
        self.refresh()

    def values(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    def figure(self) -> plt.Figure:
        return self.draw(**self.values())

    def refresh(self) -> None:
        fig = self.figure()
        self.image.value = base64.b64decode(_png(fig))
        plt.close(fig)

    def _repr_mimebundle_(self, **kwargs):
        bundle = dict(self.widget._repr_mimebundle_(**kwargs) or {})
        bundle["image/png"] = base64.b64encode(self.image.value).decode("ascii")
        bundle["text/plain"] = f"{self.title or 'Interactive explorer'} (run the cell in JupyterLab to use the controls)"
        return bundle


def explorer(draw: Callable[..., plt.Figure], controls: dict, title: str = ""):
    """Show an explorer: live in a Jupyter kernel, a static figure of the first state elsewhere.

    ``controls`` maps each keyword argument of ``draw`` to an ipywidgets control (slider, dropdown…).
    Returns the :class:`Explorer` (display it, or let it be the cell's last value) in a kernel, or the
    static ``Figure`` outside one.
    """
    if not _live_kernel():
        return draw(**{name: control.value for name, control in controls.items()})
    return Explorer(draw, controls, title)
