"""Shared figures and the explorer plumbing: labelled heatmaps, and widgets with a static fallback."""

import base64

import ipywidgets as widgets
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from attn_course import plots  # noqa: E402
from attn_course.widgets import Explorer, explorer  # noqa: E402


def draw_line(slope):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, slope])
    return fig


def test_heatmap_labels_annotations_and_masked_cells():
    weights = torch.tensor([[0.25, 0.75], [float("-inf"), 1.0]])
    fig = plots.heatmap(weights, row_labels=["the", "cat"], col_labels=["the", "cat"], title="w")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["the", "cat"]
    texts = sorted(t.get_text() for t in ax.texts)
    assert texts == ["0.25", "0.75", "1.00"]  # the masked (-inf) cell is left blank
    plt.close(fig)


def test_heatmap_rejects_non_matrices_with_a_message():
    with pytest.raises(ValueError, match="2-D matrix"):
        plots.heatmap(torch.zeros(2, 2, 2))


def test_heatmap_uses_a_diverging_map_for_signed_values():
    fig = plots.heatmap(torch.tensor([[-1.0, 2.0]]))
    image = fig.axes[0].images[0]
    assert image.cmap.name.startswith(plots.SIGNED_CMAP)
    assert image.get_clim() == (-2.0, 2.0)
    plt.close(fig)


def test_line_plot_draws_every_series():
    fig = plots.line_plot([1, 2, 4], {"measured": [1, 2, 4], "theory": [1, 2, 4]}, logx=True)
    assert len(fig.axes[0].lines) == 2 and fig.axes[0].get_legend() is not None
    plt.close(fig)


def test_explorer_outside_a_kernel_returns_the_static_figure():
    fig = explorer(draw_line, {"slope": widgets.FloatSlider(value=2.0, min=0, max=4)})
    assert isinstance(fig, plt.Figure)
    assert fig.axes[0].lines[0].get_ydata()[-1] == 2.0
    plt.close(fig)


def test_explorer_bundle_carries_the_widget_and_a_png_fallback():
    slider = widgets.FloatSlider(value=1.0, min=0, max=4)
    live = Explorer(draw_line, {"slope": slider}, title="Slope")
    bundle = live._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert base64.b64decode(bundle["image/png"]).startswith(b"\x89PNG")
    assert "Slope" in bundle["text/plain"]


def test_explorer_redraws_when_a_control_moves():
    drawn = []

    def draw(slope):
        drawn.append(slope)
        return draw_line(slope)

    slider = widgets.FloatSlider(value=1.0, min=0, max=4)
    Explorer(draw, {"slope": slider})
    slider.value = 3.0
    assert drawn[-1] == 3.0


def test_explorer_image_changes_when_a_control_moves():
    slider = widgets.FloatSlider(value=1.0, min=0, max=4)
    live = Explorer(draw_line, {"slope": slider})
    before = bytes(live.image.value)
    slider.value = 3.0
    after = bytes(live.image.value)
    assert after.startswith(b"\x89PNG") and after != before
