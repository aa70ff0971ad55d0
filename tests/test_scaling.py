"""attn_course.scaling (notebook 02): the variance argument, the saturation experiment and its two
gradients, the worked example's numbers, the figures and the d_k explorer.

Every number notebook 02's text states is recomputed here from the reference code. The checks of
notebook 02 are tested in tests/checks/test_scaling.py.
"""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from attn_course import dot, plots, scaling  # noqa: E402


def test_reference_scaled_scores_match_sdpa_logits():
    # F.scaled_dot_product_attention with V = identity returns softmax(QKᵀ/√d_k) itself
    g = torch.Generator().manual_seed(0)
    Q, K = torch.randn(2, 3, 5, 16, generator=g, dtype=torch.float64), torch.randn(2, 3, 5, 16, generator=g, dtype=torch.float64)
    eye = torch.eye(5, dtype=torch.float64).expand(2, 3, 5, 5)
    torch.testing.assert_close(torch.softmax(scaling.scaled_scores(Q, K), -1), F.scaled_dot_product_attention(Q, K, eye))


def test_mc_score_variance_uses_every_argument():
    g = lambda seed: torch.Generator().manual_seed(seed)  # noqa: E731
    assert scaling.mc_score_variance(16, 1.0, 2000, g(1)) == scaling.mc_score_variance(16, 1.0, 2000, g(1))
    assert scaling.mc_score_variance(16, 1.0, 2000, g(1)) != scaling.mc_score_variance(16, 1.0, 2000, g(2))
    assert scaling.mc_score_variance(16, 2.0, 2000, g(1)) == pytest.approx(16 * scaling.mc_score_variance(16, 1.0, 2000, g(1)))
    assert isinstance(scaling.mc_score_variance(4, generator=g(0)), float)


def test_mc_standard_error_matches_the_spread_of_repeated_estimates():
    d, n, repeats = 16, 2000, 300
    g = torch.Generator().manual_seed(0)
    estimates = torch.tensor([scaling.mc_score_variance(d, 1.0, n, g) for _ in range(repeats)])
    se = scaling.mc_standard_error(d, 1.0, n)
    # the empirical spread of 300 estimates is within ~10% of the formula (its own relative SE is ~4–8%)
    assert 0.8 * se < estimates.std().item() < 1.2 * se
    assert abs(estimates.mean().item() - d) < 4 * se / math.sqrt(repeats)


def test_relative_standard_error_numbers_of_the_text():
    # 02[6]: √((2 + 6/d_k)/n) relative: 1.0 % at d_k = 64, 2.0 % at d_k = 1, for n = 20 000
    for d, percent in ((64, "1.0%"), (1, "2.0%")):
        relative = scaling.mc_standard_error(d, 1.0, 20_000) / d
        assert relative == pytest.approx(math.sqrt((2 + 6 / d) / 20_000))
        assert f"{relative:.1%}" == percent
    assert scaling.mc_standard_error(64, 0.5, 20_000) / (0.5**4 * 64) == pytest.approx(math.sqrt((2 + 6 / 64) / 20_000))


def test_variance_vs_dk_follows_sigma4_dk():
    dims = [4, 64, 1024]
    for sigma in (1.0, 0.5):
        measured = scaling.variance_vs_dk(dims, sigma=sigma, n_samples=2000, seed=3)
        for d, v in zip(dims, measured.tolist()):
            assert abs(v - sigma**4 * d) < 5 * scaling.mc_standard_error(d, sigma, 2000)


@pytest.fixture(scope="module")
def stats():
    return scaling.saturation_vs_dk(scaling.DIMS, n_keys=16, n_trials=1000, seed=0)


def test_saturation_the_text_s_numbers(stats):
    # what 02's text says, as the notebook prints it (d_k = 1024 is the last entry)
    last = {key: values[-1].item() for key, values in stats.items()}
    assert f"{last['max_weight_unscaled']:.3f}" == "0.961" and f"{last['max_weight_scaled']:.3f}" == "0.241"
    assert f"{last['grad_scores_scaled'] / last['grad_scores_unscaled']:.0f}" == "6"
    assert f"{last['top2_share_unscaled']:.2f}" == "0.95" and f"{last['top2_share_scaled']:.2f}" == "0.32"
    assert f"{last['grad_q_scaled']:.3f}" == "0.072"
    assert f"{last['grad_q_unscaled'] / last['grad_q_scaled']:.1f}" == "5.0"
    grad_q = stats["grad_q_unscaled"]
    assert f"{grad_q[0]:.3f}" == "0.130" and all(0.36 <= round(g, 2) <= 0.38 for g in grad_q[6:].tolist())  # levels off
    steps, scaled_steps = stats["score_step_unscaled"], stats["score_step_scaled"]
    assert f"{steps[-1]:.2f}" == "11.55" and f"{scaled_steps[-1]:.2f}" == "0.07" and f"{scaled_steps[0]:.2f}" == "0.14"
    assert f"{steps[-1] / steps[0]:.0f}" == "20" and f"{scaled_steps[0] / scaled_steps[-1]:.1f}" == "2.0"


def test_saturation_scaled_stays_put_unscaled_saturates(stats):
    for key in ("max_weight", "grad_scores", "top2_share", "grad_q"):
        scaled = stats[f"{key}_scaled"]
        assert scaled.max() / scaled.min() < 1.2, key  # flat across d_k = 4 … 1024
    assert stats["max_weight_unscaled"][-1] > 0.95
    assert stats["grad_scores_unscaled"][-1] < stats["grad_scores_scaled"][-1] / 5
    assert stats["top2_share_unscaled"][-1] > 0.9 > 0.4 > stats["top2_share_scaled"].max()


def test_saturation_the_gradient_at_the_query_grows_without_the_scale(stats):
    # E1: the gradient reaching q is not vanishing: unscaled it is larger, and grows with d_k
    unscaled, scaled = stats["grad_q_unscaled"], stats["grad_q_scaled"]
    assert (unscaled > scaled).all()
    assert unscaled[4] > 3 * scaled[4] and unscaled[-1] > 4 * scaled[-1]  # d_k = 64 and 1024
    assert unscaled[-1] > 2.5 * unscaled[0]
    steps = stats["score_step_unscaled"]
    assert (steps[1:] > steps[:-1]).all() and steps[-1] > 100 * stats["score_step_scaled"][-1]


def test_saturation_gradients_match_the_chain_rule():
    # ∂ℒ/∂s = J u with J = diag(w) − w wᵀ (notebook 04), ∂ℒ/∂q = Kᵀ ∂ℒ/∂s / divisor, Δs = −K ∂ℒ/∂q / divisor
    d, n_keys = 8, 4
    out = scaling.saturation_vs_dk([d], n_keys=n_keys, n_trials=1, seed=5)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 1, d, generator=g).double()[0, 0]
    K = torch.randn(1, n_keys, d, generator=g).double()[0]
    u = torch.randn(1, n_keys, generator=g).double()[0]
    u = u / u.norm()
    for kind, divisor in (("unscaled", 1.0), ("scaled", math.sqrt(d))):
        w = torch.softmax(K @ q / divisor, -1)
        grad_s = (torch.diag(w) - torch.outer(w, w)) @ u
        grad_q = K.T @ grad_s / divisor
        top2 = w.topk(2).indices
        assert out[f"grad_scores_{kind}"][0].item() == pytest.approx(grad_s.norm().item(), rel=1e-9)
        assert out[f"grad_q_{kind}"][0].item() == pytest.approx(grad_q.norm().item(), rel=1e-9)
        assert out[f"top2_share_{kind}"][0].item() == pytest.approx((grad_s.abs()[top2].sum() / grad_s.abs().sum()).item())
        assert out[f"score_step_{kind}"][0].item() == pytest.approx((K @ grad_q / divisor).norm().item(), rel=1e-9)
        assert out[f"max_weight_{kind}"][0].item() == pytest.approx(w.max().item())


def test_worked_example_erratum_numbers():
    Q, K, _ = dot.worked_example()
    S = dot.score_matrix(Q, K)
    unscaled, scaled = S.var(unbiased=False).item(), (S / math.sqrt(8)).var(unbiased=False).item()
    assert round(unscaled, 2) == 0.22 and math.isclose(unscaled / scaled, 8.0)
    for value in (unscaled, scaled, S.var().item(), (S / math.sqrt(8)).var().item()):
        assert round(value, 2) not in (0.47, 0.16)  # the source's figures are not variances...
    assert round(S.std(unbiased=False).item(), 2) == 0.47  # ...they are standard deviations
    assert round((S / math.sqrt(8)).std(unbiased=False).item(), 2) == 0.16


def test_worked_example_breaks_the_independence_assumption():
    # E20: σ_Q²·σ_K²·d_k predicts 0.068 but the scores' variance is 0.22, because K ≈ Q entry by entry
    Q, K, _ = dot.worked_example()
    predicted = Q.var(unbiased=False).item() * K.var(unbiased=False).item() * 8
    measured = dot.score_matrix(Q, K).var(unbiased=False).item()
    assert f"{predicted:.3f}" == "0.068" and f"{measured:.2f}" == "0.22"
    assert f"{torch.corrcoef(torch.stack([Q.flatten(), K.flatten()]))[0, 1].item():.2f}" == "0.95"


def test_explorer_draws_a_static_figure_outside_a_kernel():
    fig = scaling.explore_dk(d_k=256)
    assert isinstance(fig, plt.Figure) and len(fig.axes) == 2
    assert "d_k = 256" in fig.axes[0].get_title()
    plt.close(fig)


@pytest.mark.slow
def test_explorer_redraws_when_the_slider_moves():
    widgets = pytest.importorskip("ipywidgets")
    from attn_course.widgets import Explorer

    slider = widgets.SelectionSlider(options=scaling.DIMS, value=64, description="d_k")
    live = Explorer(scaling.draw_dk, {"d_k": slider})
    first = bytes(live.image.value)
    slider.value = 1024
    assert bytes(live.image.value) != first and live.values() == {"d_k": 1024}


@pytest.mark.parametrize("d_k", [64, 256, 1024])
@pytest.mark.slow
def test_explorer_scaled_histogram_keeps_its_shape(d_k):
    # the scaled scores (std 1, close to normal for large d_k) get bins of their own: their histogram peaks near
    # 1/√(2π) ≈ 0.40 for every d_k, instead of a spike squashed into the unscaled scores' wide bins
    fig = scaling.draw_dk(d_k)
    scaled = [p for p in fig.axes[0].patches if p.get_facecolor()[:3] == fig.axes[0].patches[-1].get_facecolor()[:3]]
    assert 0.33 < max(p.get_height() for p in scaled) < 0.47
    plt.close(fig)


@pytest.mark.parametrize("d_k", [4, 64, 1024])
@pytest.mark.slow
def test_explorer_histogram_range_follows_d_k(d_k):
    # 02[18]: a fixed ±100 range squashed d_k = 64; the range is ±4 standard deviations of the unscaled scores
    fig = scaling.draw_dk(d_k)
    left = fig.axes[0]
    assert left.get_xlim() == pytest.approx((-max(4, 4 * math.sqrt(d_k)), max(4, 4 * math.sqrt(d_k))))
    assert plots.readability_problems(fig) == []
    plt.close(fig)


@pytest.mark.slow
def test_figures_are_readable_at_1366x768(stats):
    measured = {"σ = 1": scaling.variance_vs_dk(seed=0), "σ = 0.5": scaling.variance_vs_dk(sigma=0.5, seed=0)}
    figures = {
        "variance": scaling.plot_variance_vs_dk(scaling.DIMS, measured, {"σ = 1": 1.0, "σ = 0.5": 0.5}),
        "saturation": scaling.plot_saturation(scaling.DIMS, stats, 16),
    }
    assert figures["variance"].axes[0].get_xscale() == "log" and len(figures["saturation"].axes) == 4
    for name, fig in figures.items():
        assert plots.readability_problems(fig) == [], name
        plt.close(fig)


@pytest.mark.slow
def test_saturation_log_panels_have_a_tick_label_below_every_point(stats):
    # the lowest ‖∂ℒ/∂scores‖ (0.011) sat under the last labelled tick (2·10⁻²): each log axis now starts at a
    # round number (1, 2, 3 or 5 × 10^k) at or below its lowest point
    fig = scaling.plot_saturation(scaling.DIMS, stats, 16)
    for ax in fig.axes:
        if ax.get_yscale() == "log":
            lowest = min(min(line.get_ydata()) for line in ax.get_lines())
            bottom = ax.get_ylim()[0]
            assert bottom <= lowest and f"{bottom:.0e}"[0] in "1235"
    plt.close(fig)


def test_mismatched_d_gets_a_clear_message():
    with pytest.raises(ValueError, match="Q has d = 8 .* but K has d = 7"):
        scaling.scaled_scores(torch.randn(4, 8), torch.randn(5, 7))
