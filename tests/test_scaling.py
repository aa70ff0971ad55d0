"""Notebook 02: the variance argument and the scaled scores, against PyTorch and statistics.

The Monte-Carlo check is tested for statistical honesty: its tolerance is derived from the
estimator's standard error (itself checked empirically here), correct estimators that sample in
different ways pass over many seeds, and biased ones — from the named mistakes down to a 10% bias —
are rejected on every seed.
"""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from attn_course import dot, scaling  # noqa: E402
from attn_course.checks._core import NotAttempted  # noqa: E402
from attn_course.checks.scaling import check_mc_score_variance, check_scaled_scores  # noqa: E402
from checking import rejects

SEEDS = range(8)  # the reference-style estimator and the biased ones; other variants use 3


def unfinished(*args, **kwargs):
    raise NotImplementedError()


# ---------------------------------------------------------------- reference implementations


def test_reference_scaled_scores_match_sdpa_logits():
    # F.scaled_dot_product_attention with V = identity returns softmax(QKᵀ/√d_k) itself
    g = torch.Generator().manual_seed(0)
    Q, K = torch.randn(2, 3, 5, 16, generator=g, dtype=torch.float64), torch.randn(2, 3, 5, 16, generator=g, dtype=torch.float64)
    eye = torch.eye(5, dtype=torch.float64).expand(2, 3, 5, 5)
    torch.testing.assert_close(torch.softmax(scaling.scaled_scores(Q, K), -1), F.scaled_dot_product_attention(Q, K, eye))


def test_mc_standard_error_matches_the_spread_of_repeated_estimates():
    d, n, repeats = 16, 2000, 300
    g = torch.Generator().manual_seed(0)
    estimates = torch.tensor([scaling.mc_score_variance(d, 1.0, n, g) for _ in range(repeats)])
    se = scaling.mc_standard_error(d, 1.0, n)
    # the empirical spread of 300 estimates is within ~10% of the formula (its own relative SE is ~4–8%)
    assert 0.8 * se < estimates.std().item() < 1.2 * se
    assert abs(estimates.mean().item() - d) < 4 * se / math.sqrt(repeats)


def test_variance_vs_dk_follows_sigma4_dk():
    dims = [4, 64, 1024]
    for sigma in (1.0, 0.5):
        measured = scaling.variance_vs_dk(dims, sigma=sigma, n_samples=2000, seed=3)
        for d, v in zip(dims, measured.tolist()):
            assert abs(v - sigma**4 * d) < 5 * scaling.mc_standard_error(d, sigma, 2000)


def test_saturation_grows_without_scaling_and_not_with_it():
    stats = scaling.saturation_vs_dk([4, 1024], n_keys=16, n_trials=200, seed=0)
    assert stats["max_weight_raw"][1] > 0.9 and stats["max_weight_scaled"][1] < 0.4
    assert stats["grad_norm_raw"][1] < stats["grad_norm_scaled"][1] / 5
    assert abs(stats["max_weight_scaled"][1] - stats["max_weight_scaled"][0]) < 0.05


def test_saturation_gradient_matches_the_softmax_jacobian():
    # autograd's gradient for one row equals J·u with J = diag(p) − p pᵀ
    stats = scaling.saturation_vs_dk([8], n_keys=4, n_trials=1, seed=5)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 1, 8, generator=g).double()
    K = torch.randn(1, 4, 8, generator=g).double()
    u = torch.randn(1, 4, generator=g).double()
    u = u / u.norm()
    p = torch.softmax(dot.score_matrix(q, K).squeeze(1)[0], -1)
    J = torch.diag(p) - torch.outer(p, p)
    assert math.isclose(stats["grad_norm_raw"][0].item(), (J @ u[0]).norm().item(), rel_tol=1e-9)


def test_worked_example_erratum_numbers():
    Q, K, _ = dot.worked_example()
    S = dot.score_matrix(Q, K)
    raw, scaled = S.var(unbiased=False).item(), (S / math.sqrt(8)).var(unbiased=False).item()
    assert round(raw, 2) == 0.22 and math.isclose(raw / scaled, 8.0)
    for value in (raw, scaled, S.var().item(), (S / math.sqrt(8)).var().item()):
        assert round(value, 2) not in (0.47, 0.16)  # the source's figures are not variances...
    assert round(S.std(unbiased=False).item(), 2) == 0.47  # ...they are standard deviations
    assert round((S / math.sqrt(8)).std(unbiased=False).item(), 2) == 0.16


def test_explorer_draws_a_static_figure_outside_a_kernel():
    fig = scaling.explore_dk(d_k=256)
    assert isinstance(fig, plt.Figure) and len(fig.axes) == 2
    assert "d_k = 256" in fig.axes[0].get_title()
    plt.close(fig)


def test_figures_build():
    dims = [4, 8]
    fig = scaling.plot_variance_vs_dk(dims, {"σ = 1": torch.tensor([4.0, 8.0])}, {"σ = 1": 1.0})
    assert fig.axes[0].get_xscale() == "log" and fig.axes[0].get_yscale() == "log"
    plt.close(fig)
    fig = scaling.plot_saturation(dims, scaling.saturation_vs_dk(dims, n_trials=10), 16)
    assert len(fig.axes) == 2
    plt.close(fig)


# ---------------------------------------------------------------- check_mc_score_variance


def correct(d_k, sigma=1.0, n_samples=20_000, generator=None):
    q = sigma * torch.randn(n_samples, d_k, generator=generator)
    k = sigma * torch.randn(n_samples, d_k, generator=generator)
    return (q * k).sum(-1).var()


def one_draw(d_k, sigma=1.0, n_samples=20_000, generator=None):  # both vectors from one call, float64
    qk = torch.randn(2, n_samples, d_k, generator=generator, dtype=torch.float64) * sigma
    return float(torch.einsum("nd,nd->n", qk[0], qk[1]).var(unbiased=False))


def via_numpy(d_k, sigma=1.0, n_samples=20_000, generator=None):  # NumPy result, seeded from the generator
    rng = np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=generator)))
    q, k = rng.normal(0, sigma, (n_samples, d_k)), rng.normal(0, sigma, (n_samples, d_k))
    return np.var(np.sum(q * k, axis=1), ddof=1)


def mean_of_squares(d_k, sigma=1.0, n_samples=20_000, generator=None):  # E[s²]: the mean is known to be 0
    s = (torch.randn(n_samples, d_k, generator=generator) * torch.randn(n_samples, d_k, generator=generator)).sum(-1)
    return (sigma**4 * s**2).mean().reshape(1)  # one-element tensor


@pytest.mark.parametrize("fn, seed", [(correct, seed) for seed in SEEDS] + [
    (fn, seed) for fn in (one_draw, via_numpy, mean_of_squares, scaling.mc_score_variance) for seed in range(3)])
def test_variance_check_accepts_correct_estimators_on_every_seed(fn, seed, capsys):
    check_mc_score_variance(fn, seed=seed)
    assert "✓ mc_score_variance" in capsys.readouterr().out


def biased(factor):
    def estimator(d_k, sigma=1.0, n_samples=20_000, generator=None):
        return factor * correct(d_k, sigma, n_samples, generator)

    return estimator


@pytest.mark.parametrize("seed", SEEDS)
def test_variance_check_rejects_a_10_percent_bias_on_every_seed(seed):
    rejects(check_mc_score_variance, biased(1.10), "standard errors", seed=seed)
    rejects(check_mc_score_variance, biased(0.90), "standard errors", seed=seed)


def _sampled(transform):
    def estimator(d_k, sigma=1.0, n_samples=20_000, generator=None):
        return transform(d_k, sigma, n_samples, generator)

    return estimator


def _scores(d_k, sigma_q, sigma_k, n, g, rand=torch.randn):
    return (sigma_q * rand(n, d_k, generator=g) * sigma_k * rand(n, d_k, generator=g)).sum(-1)


VARIANCE_PITFALLS = {
    "divided by d_k": _sampled(lambda d, s, n, g: (_scores(d, s, s, n, g) / d).var()),
    "mean instead of sum": _sampled(lambda d, s, n, g: (s * torch.randn(n, d, generator=g) * s * torch.randn(n, d, generator=g)).mean(-1).var()),
    "scaled score": _sampled(lambda d, s, n, g: (_scores(d, s, s, n, g) / math.sqrt(d)).var()),
    "variance of q": _sampled(lambda d, s, n, g: (s * torch.randn(n, d, generator=g)).var()),
    "sigma as variance": _sampled(lambda d, s, n, g: _scores(d, s * s, s * s, n, g).var()),
    "sigma on one side": _sampled(lambda d, s, n, g: _scores(d, s, 1.0, n, g).var()),
    "sigma ignored": _sampled(lambda d, s, n, g: _scores(d, 1.0, 1.0, n, g).var()),
    "std": _sampled(lambda d, s, n, g: _scores(d, s, s, n, g).std()),
    "uniform": _sampled(lambda d, s, n, g: _scores(d, s, s, n, g, rand=torch.rand).var()),
    "mean": _sampled(lambda d, s, n, g: _scores(d, s, s, n, g).mean()),
}
PHRASES = {
    "divided by d_k": "divided by d_k",
    "mean instead of sum": ".mean",
    "scaled score": "*scaled* score",
    "variance of q": "q's entries alone",
    "sigma as variance": "σ was used as a variance",
    "sigma on one side": "only one of q and k",
    "sigma ignored": "σ was ignored",
    "std": "standard deviation, not the variance",
    "uniform": "torch.rand",
    "mean": "*mean* of q·k",
}


@pytest.mark.parametrize("name", list(VARIANCE_PITFALLS))
@pytest.mark.parametrize("seed", range(2))
def test_variance_check_names_each_pitfall(name, seed):
    rejects(check_mc_score_variance, VARIANCE_PITFALLS[name], PHRASES[name], "σ⁴·d_k", seed=seed)


def test_variance_check_requires_the_generator_to_be_used():
    def ignores_generator(d_k, sigma=1.0, n_samples=20_000, generator=None):
        return correct(d_k, sigma, n_samples, None)

    rejects(check_mc_score_variance, ignores_generator, "generator=generator", "seeded alike")


def test_variance_check_messages_for_unfinished_wrong_type_shape_nan():
    with pytest.raises(NotAttempted, match="not attempted"):
        check_mc_score_variance(unfinished)
    rejects(check_mc_score_variance, lambda d_k, sigma=1.0, n_samples=20_000, generator=None: [1.0], "Python list")
    rejects(check_mc_score_variance,
            lambda d_k, sigma=1.0, n_samples=20_000, generator=None: torch.randn(n_samples, d_k, generator=generator).var(0),
            "expected one number")
    rejects(check_mc_score_variance, lambda d_k, sigma=1.0, n_samples=20_000, generator=None: float("nan"), "NaN")
    rejects(check_mc_score_variance, lambda d_k, sigma=1.0, n_samples=20_000, generator=None: "64", "str")
    rejects(check_mc_score_variance, lambda d_k, sigma=1.0, n_samples=20_000, generator=None: None, "return")
    rejects(check_mc_score_variance, 64.0, "expected a function")
    rejects(check_mc_score_variance, lambda d_k: 1.0, "raised TypeError")  # missing the keyword arguments


# ---------------------------------------------------------------- check_scaled_scores


@pytest.mark.parametrize(
    "fn",
    [
        scaling.scaled_scores,
        lambda Q, K: Q @ K.transpose(-2, -1) / Q.shape[-1] ** 0.5,
        lambda Q, K: (Q / math.sqrt(Q.size(-1))) @ K.mT,  # scale before the product
        lambda Q, K: (Q * Q.shape[-1] ** -0.25) @ (K * K.shape[-1] ** -0.25).mT,  # split between Q and K
        lambda Q, K: torch.einsum("...qd,...kd->...qk", Q, K) * torch.rsqrt(torch.tensor(float(K.shape[-1]))),
        lambda Q, K: (Q.double() @ K.double().mT / np.sqrt(Q.shape[-1])).numpy(),  # float64 NumPy answer
    ],
    ids=["reference", "pow", "scale-Q-first", "split", "einsum-rsqrt", "numpy-out"],
)
def test_scaled_scores_accepts_correct_alternatives(fn, capsys):
    check_scaled_scores(fn)
    assert "✓ scaled_scores" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, phrase",
    [
        (lambda Q, K: Q @ K.mT, "not scaled at all"),
        (lambda Q, K: Q @ K.mT / Q.shape[-1], "divided by d_k instead of √d_k"),
        (lambda Q, K: (Q / math.sqrt(Q.shape[-1])) @ (K / math.sqrt(K.shape[-1])).mT, "divided by d_k instead of √d_k"),
        (lambda Q, K: Q @ K.mT * math.sqrt(Q.shape[-1]), "multiplied by √d_k"),
        (lambda Q, K: Q @ K.mT / math.sqrt(K.shape[-2]), "number of keys"),
        (lambda Q, K: Q @ K.mT / math.sqrt(Q.shape[-2]), "number of queries"),
        (lambda Q, K: Q @ K.mT / math.sqrt(Q.shape[0]), "first (batch) axis"),
        (lambda Q, K: Q @ K.mT / math.sqrt(Q.size(1)), "axis 1 (the heads)"),
        (lambda Q, K: Q @ K.mT / math.sqrt(Q.shape[1] * Q.shape[-1]) if Q.ndim == 4 else Q @ K.mT / math.sqrt(Q.shape[-1]),
         "d_model"),
    ],
    ids=["unscaled", "by-d_k", "both-by-sqrt", "multiplied", "n_keys", "n_queries", "batch", "heads", "d_model"],
)
def test_scaled_scores_pitfalls_are_named(fn, phrase):
    rejects(check_scaled_scores, fn, phrase)


def test_scaled_scores_transposed_K_is_explained():
    rejects(check_scaled_scores, lambda Q, K: Q @ K / math.sqrt(Q.shape[-1]), "raised", "K.transpose(-2, -1)")
    square = lambda Q, K: Q @ K.transpose(1, 2) if Q.ndim == 4 else Q @ K.mT  # noqa: E731
    rejects(check_scaled_scores, square, "raised")


def test_scaled_scores_messages_for_unfinished_wrong_type_shape_nan():
    with pytest.raises(NotAttempted, match="not attempted"):
        check_scaled_scores(unfinished)
    rejects(check_scaled_scores, lambda Q, K: scaling.scaled_scores(Q, K).tolist(), "Python list")
    rejects(check_scaled_scores, lambda Q, K: scaling.scaled_scores(Q, K).sum(-1), "has shape")
    rejects(check_scaled_scores, lambda Q, K: scaling.scaled_scores(Q, K) * float("nan"), "NaN")
    rejects(check_scaled_scores, [1, 2], "expected a function")
