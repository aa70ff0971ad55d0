"""attn_course.softmax (notebook 03): the reference softmax family agrees with PyTorch; masked_softmax is
the course's one mask rule (as F.scaled_dot_product_attention, fully masked rows included); entropy;
the figures are readable at 1366×768."""

import math

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attn_course import plots
from attn_course import softmax as ref

INF = float("inf")


# ---------------------------------------------------------------- the softmax family vs PyTorch
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_family_matches_torch(dtype, dim):
    x = 3 * torch.randn(4, 5, 6, dtype=dtype, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ref.softmax(x, dim), torch.softmax(x, dim))
    torch.testing.assert_close(ref.logsumexp(x, dim), torch.logsumexp(x, dim))
    torch.testing.assert_close(ref.logsumexp(x, dim, keepdim=True), torch.logsumexp(x, dim, keepdim=True))
    torch.testing.assert_close(ref.log_softmax(x, dim), torch.log_softmax(x, dim))
    torch.testing.assert_close(ref.softmax_with_temperature(x, 0.3, dim), torch.softmax(x / 0.3, dim))


def test_stable_where_the_naive_formula_breaks():
    x = torch.tensor([[1000.0, 1001.0, 1002.0], [-1000.0, -999.0, -998.0]])
    assert torch.isnan(ref.naive_softmax(x)).all()
    torch.testing.assert_close(ref.softmax(x), torch.softmax(x, -1))
    torch.testing.assert_close(ref.logsumexp(x), torch.logsumexp(x, -1))
    tail = torch.tensor([0.0, -1000.0, 5.0])
    assert torch.isneginf(torch.log(ref.softmax(tail))).any()
    torch.testing.assert_close(ref.log_softmax(tail), torch.log_softmax(tail, -1))


def test_float16_softmax_within_half_precision():
    x = torch.tensor([[10.0, 11.0, 12.0], [30.0, 28.0, 20.0]], dtype=torch.float16)
    assert torch.isnan(ref.naive_softmax(x)).any()
    out = ref.softmax(x)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.double(), torch.softmax(x.double(), -1), atol=1e-3, rtol=1e-2)


def test_numpy_in_numpy_out():
    x = np.random.default_rng(0).normal(size=(3, 4))
    out = ref.softmax(x, 0)
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, torch.softmax(torch.from_numpy(x), 0).numpy())
    np.testing.assert_allclose(ref.logsumexp(x, 1), torch.logsumexp(torch.from_numpy(x), 1).numpy())
    np.testing.assert_allclose(ref.log_softmax(x, -1), torch.log_softmax(torch.from_numpy(x), -1).numpy())


def test_minus_inf_entries_and_fully_masked_slices_like_torch():
    x = torch.tensor([[0.0, -INF, 1.0], [-INF] * 3])
    torch.testing.assert_close(ref.softmax(x), torch.softmax(x, -1), equal_nan=True)  # NaN for the all -inf row
    torch.testing.assert_close(ref.logsumexp(x), torch.logsumexp(x, -1))  # -inf there


def test_temperature_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        ref.softmax_with_temperature(torch.zeros(3), 0.0)


# ---------------------------------------------------------------- masked_softmax: the course's one mask rule
def _sdpa_weights(scores: torch.Tensor, mask) -> torch.Tensor:
    """The weights F.scaled_dot_product_attention uses: its output with V = I, for Q, K built so that
    Q Kᵀ / √d equals ``scores`` (d = n_k, K = √d · I)."""
    n_k = scores.shape[-1]
    K = math.sqrt(n_k) * torch.eye(n_k, dtype=scores.dtype).expand(*scores.shape[:-2], n_k, n_k)
    eye = torch.eye(n_k, dtype=scores.dtype).expand_as(K)
    return F.scaled_dot_product_attention(scores, K, eye, attn_mask=mask)


@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
def test_masked_softmax_matches_sdpa_weights_including_fully_masked_rows(mask_kind):
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(2, 3, 4, 5, dtype=torch.float64, generator=g)  # (batch, heads, n_q, n_k)
    keep = torch.rand(2, 1, 4, 5, generator=g) < 0.6  # broadcast over heads
    keep[0, 0, 1] = False  # a fully masked row
    keep[1, 0, 3] = False  # another one
    keep[1, 0, 0] = True  # and a row that keeps everything
    mask = keep if mask_kind == "bool" else torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, -INF)
    weights = ref.masked_softmax(scores, mask)
    torch.testing.assert_close(weights, _sdpa_weights(scores, mask))
    assert torch.equal(weights[0, :, 1], torch.zeros(3, 5, dtype=torch.float64))  # zeros, not NaN
    assert (weights.masked_select(~keep.expand_as(weights)) == 0).all()
    rows = weights.sum(-1)
    torch.testing.assert_close(rows[keep.any(-1).expand_as(rows)], torch.ones_like(rows[keep.any(-1).expand_as(rows)]))


def test_masked_softmax_without_mask_and_along_another_axis():
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(ref.masked_softmax(x), torch.softmax(x, -1))
    keep = torch.tensor([[True, False, True, True], [False] * 4, [True, True, True, False]]).T  # (4, 3)
    along_rows = ref.masked_softmax(x.T, keep, dim=0)  # normalise along axis 0 of (4, 3)
    torch.testing.assert_close(along_rows, ref.masked_softmax(x, keep.T, dim=-1).T)
    assert torch.equal(along_rows[:, 1], torch.zeros(4))


def test_masked_softmax_gradient_is_finite_on_fully_masked_rows():
    scores = torch.randn(2, 3, requires_grad=True)
    keep = torch.tensor([[True, False, True], [False, False, False]])
    ref.masked_softmax(scores, keep).sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert torch.equal(scores.grad[1], torch.zeros(3))


# ---------------------------------------------------------------- entropy: the course's one entropy
def test_entropy_values_and_zero_weights():
    w = torch.tensor([[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]])
    torch.testing.assert_close(ref.entropy(w), torch.tensor([math.log(4.0), 0.0, math.log(2.0)], dtype=torch.float64))


def test_entropy_matches_the_definition_along_any_axis():
    p = torch.softmax(torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(3)), dim=1)
    manual = -(p.double() * p.double().log()).sum(1)
    torch.testing.assert_close(ref.entropy(p, dim=1), manual)
    assert ref.entropy(p.numpy(), dim=1).dtype == torch.float64  # NumPy input, float64 result


def test_normalised_entropy_bounds():
    n = 6
    assert ref.entropy(torch.full((n,), 1 / n)).item() / math.log(n) == pytest.approx(1.0)
    assert ref.entropy(torch.eye(n)[2]).item() == 0.0


# ---------------------------------------------------------------- figures and explorer
TOKENS = ["the", "cat", "sat", "on", "the", "mat"]
SCORES = torch.tensor([0.5, 2.0, 1.2, -0.3, 0.4, 1.6])


@pytest.mark.slow
def test_temperature_sweep_figure_is_readable():
    fig = ref.temperature_sweep_figure(SCORES, [0.1, 0.5, 1.0, 2.0, 10.0], labels=TOKENS)
    try:
        assert len(fig.axes) == 5
        assert plots.readability_problems(fig) == []
    finally:
        plt.close(fig)


def test_temperature_explorer_static_figure_and_readout_agree():
    t = 10 ** 1.3  # the slider's largest value, 19.95…
    fig = ref.temperature_explorer(SCORES, labels=TOKENS, temperature=t)  # no kernel: a static figure
    try:
        assert isinstance(fig, plt.Figure)
        assert plots.readability_problems(fig) == []
        title = fig.axes[0].get_title()
        assert title.startswith(f"T = {t:.2f}")  # 19.95, as the slider's readout (format .2f)
    finally:
        plt.close(fig)


def test_explorer_slider_uses_the_titles_format(monkeypatch):
    import ipywidgets as widgets

    from attn_course import widgets as course_widgets

    seen = {}

    def fake_explorer(draw, controls, title=""):
        seen.update(controls)
        return draw(**{k: c.value for k, c in controls.items()})

    monkeypatch.setattr(course_widgets, "explorer", fake_explorer)
    plt.close(ref.temperature_explorer(SCORES, labels=TOKENS))
    slider = seen["temperature"]
    assert isinstance(slider, widgets.FloatLogSlider) and slider.readout_format == ".2f"
    assert f"{10 ** slider.max:.2f}" == "19.95" and f"{10 ** slider.min:.2f}" == "0.05"


# ----------------------------------------------------------------------------- bad input: clear messages
@pytest.mark.parametrize("scores, mask, error, match", [
    (torch.randn(4, 5), torch.ones(4, 5, dtype=torch.long), TypeError, r"mask must be a bool tensor .* torch.int64"),
    (torch.randn(4, 5), torch.ones(4, 5).tril(), ValueError, r"only 0s and 1s"),
    (torch.randn(4, 5), torch.ones(3, 5, dtype=torch.bool), ValueError, r"mask has shape \(3, 5\).*\(4, 5\)"),
    (np.zeros((4, 5)), None, TypeError, r"scores must be a torch.Tensor.*ndarray"),
    (torch.ones(4, 5, dtype=torch.long), None, TypeError, r"scores must be a floating-point tensor.*torch.int64"),
])
def test_masked_softmax_bad_inputs_are_named(scores, mask, error, match):
    with pytest.raises(error, match=match):
        ref.masked_softmax(scores, mask)


@pytest.mark.parametrize("call, error, match", [
    (lambda: ref.softmax([1.0, 2.0]), TypeError, r"x must be a torch.Tensor or a NumPy array.*list"),
    (lambda: ref.log_softmax(torch.ones(3), 5), ValueError, r"dim=5 must name an axis.*\(3,\)"),
    (lambda: ref.logsumexp(torch.empty(2, 0)), ValueError, r"at least one entry.*\(2, 0\)"),
    (lambda: ref.softmax_with_temperature(torch.ones(3), None), ValueError, r"temperature must be a positive.*None"),
    (lambda: ref.softmax_with_temperature(torch.ones(3), 0.0), ValueError, r"temperature must be a positive"),
])
def test_softmax_family_bad_inputs_are_named(call, error, match):
    with pytest.raises(error, match=match):
        call()
