"""Checks of notebook 02 (attn_course.checks.scaling): wrong answers rejected with their diagnosis,
correct alternatives accepted, the same verdict on replay.

The Monte-Carlo check is statistical, so it is tested for honesty on many seeds: correct estimators
that sample in different ways pass on every seed, and biased ones — the named mistakes down to a
10 % bias — are rejected on every seed (:func:`make_mc_check` runs the check with other generator
seeds). Its tolerance rests on the estimator's standard error, itself checked in tests/test_scaling.py.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from attn_course import scaling
from attn_course.checks.result import Status
from attn_course.checks.scaling import check_mc_score_variance, check_scaled_scores, make_mc_check

from .test_dot import W, rejects_as

warnings.filterwarnings("ignore", message="The use of `x.T`")


# ============================================================================ Monte-Carlo variance
def reference_style(d_k, sigma=1.0, n_samples=20_000, generator=None):
    q = sigma * torch.randn(n_samples, d_k, generator=generator)
    k = sigma * torch.randn(n_samples, d_k, generator=generator)
    return (q * k).sum(-1).var()


def one_draw_float64(d_k, sigma=1.0, n_samples=20_000, generator=None):
    qk = torch.randn(2, n_samples, d_k, generator=generator, dtype=torch.float64) * sigma
    return float(torch.einsum("nd,nd->n", qk[0], qk[1]).var(unbiased=False))


def via_numpy(d_k, sigma=1.0, n_samples=20_000, generator=None):  # NumPy, seeded from the generator
    rng = np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=generator)))
    q, k = rng.normal(0, sigma, (n_samples, d_k)), rng.normal(0, sigma, (n_samples, d_k))
    return np.var(np.sum(q * k, axis=1), ddof=1)


def via_cov(d_k, sigma=1.0, n_samples=20_000, generator=None):  # torch.cov of one variable is its variance
    q = sigma * torch.randn(n_samples, d_k, generator=generator)
    k = sigma * torch.randn(n_samples, d_k, generator=generator)
    return torch.cov((q * k).sum(-1)).reshape(1)  # a one-element tensor


def shifted_scores(d_k, sigma=1.0, n_samples=20_000, generator=None):  # a shift leaves the variance alone
    q = sigma * torch.randn(n_samples, d_k, generator=generator)
    k = sigma * torch.randn(n_samples, d_k, generator=generator)
    return float(np.cov(((q * k).sum(-1) + 3.0).numpy()))


def normal_with_std(d_k, sigma=1.0, n_samples=20_000, generator=None):
    q = torch.normal(0.0, sigma, (n_samples, d_k), generator=generator)
    k = torch.empty(n_samples, d_k).normal_(0.0, sigma, generator=generator)
    return torch.var_mean(torch.einsum("nd,nd->n", q, k))[0].item()


def keys_by_column(d_k, sigma=1.0, n_samples=20_000, generator=None):  # (d_k, n) layout, summed over axis 0
    q = sigma * torch.randn(d_k, n_samples, generator=generator)
    k = sigma * torch.randn(d_k, n_samples, generator=generator)
    s = (q * k).sum(0)
    return ((s - s.mean()) ** 2).mean()


def in_chunks(d_k, sigma=1.0, n_samples=20_000, generator=None):  # n_samples need not divide evenly
    scores = []
    for start in range(0, n_samples, 3000):
        n = min(3000, n_samples - start)
        scores.append((sigma * torch.randn(n, d_k, generator=generator)
                       * sigma * torch.randn(n, d_k, generator=generator)).sum(-1))
    return torch.cat(scores).var().item()


def numpy_scalar(d_k, sigma=1.0, n_samples=20_000, generator=None):
    return np.float64(reference_style(d_k, sigma, n_samples, generator).item())


def numpy_from_initial_seed(d_k, sigma=1.0, n_samples=20_000, generator=None):  # the seed, not a draw, from it
    rng = np.random.default_rng(generator.initial_seed() if generator is not None else None)
    q, k = rng.normal(0, sigma, (n_samples, d_k)), rng.normal(0, sigma, (n_samples, d_k))
    return float(np.var(np.einsum("nd,nd->n", q, k)))


MC_RIGHT = [numpy_from_initial_seed, reference_style, one_draw_float64, via_numpy, via_cov, shifted_scores,
            normal_with_std, keys_by_column,
            in_chunks, numpy_scalar, scaling.mc_score_variance]


@pytest.mark.parametrize("fn", MC_RIGHT)
@pytest.mark.slow
def test_variance_check_accepts_correct_estimators(fn, accepts):
    accepts(check_mc_score_variance, fn)


@pytest.mark.parametrize("seed", range(1, 4))
@pytest.mark.parametrize("fn", [reference_style, one_draw_float64, via_numpy])
@pytest.mark.slow
def test_variance_check_accepts_correct_estimators_on_every_seed(fn, seed, accepts):
    accepts(make_mc_check(seed), fn)


def biased(factor):
    def estimator(d_k, sigma=1.0, n_samples=20_000, generator=None):
        return factor * reference_style(d_k, sigma, n_samples, generator)

    estimator.__name__ = f"biased_{factor}"
    return estimator


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("factor", [1.10, 0.90])
def test_variance_check_rejects_a_10_percent_bias_on_every_seed(factor, seed, rejects):
    result = rejects(make_mc_check(seed), biased(factor), "standard errors")
    assert "factor of" in result.summary


def mk(body):
    def estimator(d_k, sigma=1.0, n_samples=20_000, generator=None):
        return body(d_k, sigma, n_samples, generator)

    estimator.__name__ = body.__name__
    return estimator


def R(n, d, g, sigma=1.0):
    return sigma * torch.randn(n, d, generator=g)


def _scores(d, s, n, g):
    return (R(n, d, g, s) * R(n, d, g, s)).sum(-1)


@mk
def divided_by_dk(d, s, n, g):
    return (_scores(d, s, n, g) / d).var()


@mk
def mean_not_sum(d, s, n, g):
    return (R(n, d, g, s) * R(n, d, g, s)).mean(-1).var()


@mk
def scaled_score(d, s, n, g):
    return (_scores(d, s, n, g) / math.sqrt(d)).var()


@mk
def products_not_summed(d, s, n, g):
    return (R(n, d, g, s) * R(n, d, g, s)).var()


@mk
def variance_of_q(d, s, n, g):
    return R(n, d, g, s).var()


@mk
def sigma_as_variance(d, s, n, g):
    return (R(n, d, g, s * s) * R(n, d, g, s * s)).sum(-1).var()


@mk
def sigma_on_one_side(d, s, n, g):
    return (R(n, d, g, s) * R(n, d, g)).sum(-1).var()


@mk
def sigma_ignored(d, s, n, g):
    return (R(n, d, g) * R(n, d, g)).sum(-1).var()


@mk
def std_returned(d, s, n, g):
    return _scores(d, s, n, g).std()


@mk
def uniform_draws(d, s, n, g):
    return (s * torch.rand(n, d, generator=g) * s * torch.rand(n, d, generator=g)).sum(-1).var()


@mk
def mean_returned(d, s, n, g):
    return _scores(d, s, n, g).mean()


@mk
def summed_over_samples(d, s, n, g):
    return (R(n, d, g, s) * R(n, d, g, s)).sum(0).var()


@mk
def same_vector(d, s, n, g):
    q = R(n, d, g, s)
    return (q * q).sum(-1).var()


@mk
def fixed_dk(d, s, n, g):
    return _scores(64, s, n, g).var()


@mk
def fixed_n(d, s, n, g):
    return _scores(d, s, 20_000, g).var()


@mk
def global_random_state(d, s, n, g):
    return (s * torch.randn(n, d) * s * torch.randn(n, d)).sum(-1).var()


@mk
def generator_for_q_only(d, s, n, g):
    return (R(n, d, g, s) * s * torch.randn(n, d)).sum(-1).var()


@mk
def reseeds_generator(d, s, n, g):
    g.manual_seed(0)
    return _scores(d, s, n, g).var()


@mk
def own_fixed_generator(d, s, n, g):
    return _scores(d, s, n, torch.Generator().manual_seed(0)).var()


@mk
def integer_result(d, s, n, g):
    return int(_scores(d, s, n, g).var())


@mk
def variance_per_entry(d, s, n, g):
    return (R(n, d, g, s) * R(n, d, g, s)).var(0)


@mk
def variance_per_sample(d, s, n, g):
    return (R(n, d, g, s) * R(n, d, g, s)).var(-1)


@mk
def negated(d, s, n, g):
    return -_scores(d, s, n, g).var()


@mk
def list_result(d, s, n, g):
    return [_scores(d, s, n, g).var().item()]


@mk
def sample_size_one(d, s, n, g):
    return _scores(d, s, 1, g).var()


@mk
def q_not_random(d, s, n, g):  # the surviving mutant of `q = sigma * torch.randn(...)`: right mean, wrong spread
    q = s
    return (q * R(n, d, g, s)).sum(-1).var()


@mk
def one_q_shared(d, s, n, g):  # one query for every pair: its length sets the estimate (it looked like a sample cap)
    return (R(n, d, g, s) @ R(1, d, g, s)[0]).var()


@mk
def mean_of_squares(d, s, n, g):  # E[s²]: close to the variance on many samples, but not the sample variance
    return (_scores(d, s, n, g) ** 2).mean().reshape(1)


@mk
def mean_not_squared(d, s, n, g):
    x = _scores(d, s, n, g)
    return (x ** 2).mean() - x.mean()


def _deviations(d, s, n, g):
    x = _scores(d, s, n, g)
    return ((x - x.mean()) ** 2).sum()


@mk
def denominator_n_minus_2(d, s, n, g):
    return _deviations(d, s, n, g) / (n - 2)


@mk
def denominator_dk(d, s, n, g):  # on average n_samples·σ⁴, like a sum over the samples
    return _deviations(d, s, n, g) / d


@mk
def variance_of_the_mean(d, s, n, g):
    return _scores(d, s, n, g).var() / n


@mk
def formula_returned(d, s, n, g):
    return s**4 * d


@mk
def float16_draws(d, s, n, g):
    return (R(n, d, g, s).half() * R(n, d, g, s).half()).sum(-1).var()


@mk
def capped_samples(d, s, n, g):  # at most 1000 pairs, whatever n_samples asks for
    return _scores(d, s, min(n, 1000), g).var()


@mk
def variance_over_entries(d, s, n, g):  # a variance over each pair's products: NaN when d_k = 1
    return torch.var(R(n, d, g, s) * R(n, d, g, s), dim=-1).mean()


@mk
def sqrt_sigma_both(d, s, n, g):  # σ taken as the variance: the same numbers as σ on one side
    return (R(n, d, g, math.sqrt(s)) * R(n, d, g, math.sqrt(s))).sum(-1).var()


@mk
def reseeds_at_random(d, s, n, g):
    g.seed()
    return _scores(d, s, n, g).var()


@mk
def one_key_for_all_samples(d, s, n, g):
    q, k = R(n, d, g, s), R(1, d, g, s)
    return (q * k).sum(-1).var()


@mk
def single_number(d, s, n, g):  # .sum() over everything: the variance of one number is NaN
    return (R(n, d, g, s) * R(n, d, g, s)).sum().var()


@mk
def constant_q(d, s, n, g):  # sigma * n_samples where sigma * torch.randn(n_samples, d_k) was meant
    return (s * n * R(n, d, g, s)).sum(-1).var()


MC_WRONG = [
    # issue 22: named from what the watcher saw (a variance over one value) and from the estimates' pattern
    W(single_number, "NaN: the variance of a single number"),
    W(constant_q, "n_samples²·σ⁴·d_k", "constant σ·n_samples"),
    W(divided_by_dk, "σ⁴/d_k", "divided the dot product by d_k"),
    W(mean_not_sum, "σ⁴/d_k", "mean"),
    W(scaled_score, "the scores were divided by √d_k"),
    W(products_not_summed, "the products were not added up"),
    W(variance_of_q, "σ²", "q alone"),
    W(sigma_as_variance, "σ used as the variance"),
    W(sigma_on_one_side, "σ²·d_k instead of σ⁴·d_k", "only one of q and k"),
    W(sqrt_sigma_both, "σ²·d_k instead of σ⁴·d_k", "both by √σ"),
    W(sigma_ignored, "σ ignored"),
    W(std_returned, "standard deviation", "exactly the number this mistake gives"),
    W(uniform_draws, "torch.rand"),
    W(mean_returned, "mean, not the variance"),
    W(summed_over_samples, "summed over the samples"),
    W(same_vector, "same vector for q and k"),
    W(fixed_dk, "does not grow with d_k"),
    W(fixed_n, "n_samples ignored"),
    W(global_random_state, "generator was not used", "generator=generator"),
    W(generator_for_q_only, "some draws ignore the generator"),
    W(reseeds_generator, "seed makes no difference", "re-seed"),
    W(own_fixed_generator, "generator was not used", "never drawn from"),
    W(integer_result, "returned an integer"),
    W(variance_per_entry, "not one number", "per sample or per entry"),
    W(variance_per_sample, "not one number", "per sample or per entry"),
    W(negated, "negative", "never negative"),
    W(q_not_random, "scatter too little", "not random"),
    W(one_q_shared, "scatter far too much", "drawn once and shared"),
    W(one_key_for_all_samples, "scatter far too much", "shared by all the pairs"),
    # red-team review of notebooks 01/02: named from the learner's own draws (few samples, seeded generators)
    W(mean_of_squares, "mean of the squares, not centred"),
    W(mean_not_squared, "the mean was not squared"),
    W(denominator_n_minus_2, "divided by n_samples − 2"),
    W(denominator_dk, "divided by d_k"),
    W(variance_of_the_mean, "the variance of the mean"),
    W(formula_returned, "returned σ⁴·d_k itself"),
    W(float16_draws, "float16 tensor"),
    W(capped_samples, "fewer samples than n_samples"),
    W(variance_over_entries, "NaN when d_k = 1", "single entry"),
    W(reseeds_at_random, "some draws ignore the generator", "generator.seed()"),
    W(list_result, "returned a list", named=False),
    W(sample_size_one, "NaN: the variance of a single number"),  # one sample: one dot product, NaN variance
    W(lambda d_k, sigma=1.0, n_samples=20_000: 1.0, "no parameter generator", "renamed"),
    W(lambda d_k, sigma, n_samples=20_000, generator=None: 1.0, "sigma has no default value"),
    W(lambda d_k, sigma=1.0, n_samples=20_000, generator=None: None, "returned None", "return"),
    W(lambda d_k, sigma=1.0, n_samples=20_000, generator=None: "64", "returned a str", named=False),
]


@pytest.mark.parametrize("fn, phrases, named", MC_WRONG)
def test_variance_check_names_each_mistake(fn, phrases, named, rejects):
    rejects_as(rejects, check_mc_score_variance, fn, phrases, named)


def fixed_seed_without_generator(d_k, sigma=1.0, n_samples=20_000, generator=None):
    if generator is None:
        generator = torch.Generator()  # a generator of its own, always the same seed: not the global random state
    return _scores(d_k, sigma, n_samples, generator).var()


def test_variance_check_names_a_fixed_seed_without_generator(rejects):  # adversarial audit g1
    rejects(check_mc_score_variance, fixed_seed_without_generator, "the same estimate every time without a generator",
            "draws from a fixed seed")


def test_variance_check_names_every_q_against_every_k(rejects):  # adversarial audit g1
    @mk
    def all_pairs(d, s, n, g):
        """var(q @ k.T), the variance of every q_i · k_j, from its sums: Σ q_i·k_j = (Σ q_i)·(Σ k_j) and
        Σ (q_i·k_j)² = Σ (QᵀQ ∘ KᵀK). The same number without the n × n matrix (1.6 GB and O(n² d) work at
        n = 20000, past the check's time limit on a slow machine)."""
        q, k = R(n, d, g, s).double(), R(n, d, g, s).double()
        total, squares, pairs = q.sum(0) @ k.sum(0), ((q.T @ q) * (k.T @ k)).sum(), n * n
        return (squares - total**2 / pairs) / (pairs - 1)

    rejects(check_mc_score_variance, all_pairs, "every q against every k", "exactly the number this mistake gives")


@pytest.mark.parametrize("seed", range(1, 3))
@pytest.mark.parametrize("fn", [divided_by_dk, scaled_score, std_returned, summed_over_samples, fixed_n,
                                q_not_random, one_q_shared])
def test_variance_check_names_the_same_mistake_on_every_seed(fn, seed, rejects):
    expected = next(p.values[1] for p in MC_WRONG if p.values[0] is fn)
    rejects(make_mc_check(seed), fn, *expected)


def test_variance_check_not_attempted_and_not_a_function(rejects, unfinished):
    rejects(check_mc_score_variance, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    rejects(check_mc_score_variance, 64.0, "not a function")


def test_variance_check_leaves_the_global_random_state_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    check_mc_score_variance.evaluate(global_random_state)
    check_mc_score_variance.evaluate(reference_style)
    assert torch.equal(before, torch.random.get_rng_state())


# ============================================================================ scaled scores
def S(Q, K):
    return Q @ K.transpose(-2, -1)


SCALED_RIGHT = [
    scaling.scaled_scores,
    lambda Q, K: S(Q, K) / Q.shape[-1] ** 0.5,
    lambda Q, K: (Q / math.sqrt(Q.size(-1))) @ K.mT,  # scale before the product
    lambda Q, K: (Q * Q.shape[-1] ** -0.25) @ (K * K.shape[-1] ** -0.25).mT,  # split between Q and K
    lambda Q, K: torch.einsum("...qd,...kd->...qk", Q, K) * torch.rsqrt(torch.tensor(float(K.shape[-1]))),
    lambda Q, K: S(Q, K) / torch.sqrt(torch.tensor(Q.shape[-1])),  # a float32 constant, float64 input too
    lambda Q, K: S(Q, K) / np.sqrt(Q.shape[-1]),
    lambda Q, K: S(Q, K).div(math.sqrt(K.size(-1))),
    lambda Q, K: torch.matmul(Q, K.transpose(-1, -2)) * (1.0 / math.sqrt(Q.size()[-1])),
    lambda Q, K: (Q.double() @ K.double().mT / math.sqrt(Q.shape[-1])).to(Q.dtype),
    lambda Q, K: torch.baddbmm(torch.zeros(1, dtype=Q.dtype), Q.reshape(-1, *Q.shape[-2:]),
                               K.reshape(-1, *K.shape[-2:]).mT, alpha=Q.shape[-1] ** -0.5).reshape(
        *Q.shape[:-1], K.shape[-2]),
]


def divide_Q_in_place(Q, K):
    Q /= math.sqrt(Q.shape[-1])
    return S(Q, K)


SCALED_WRONG = [
    W(lambda Q, K: S(Q, K), "scores not scaled"),
    W(lambda Q, K: S(Q, K) / Q.shape[-1], "divided by d_k instead of √d_k"),
    W(lambda Q, K: S(Q / math.sqrt(Q.shape[-1]), K / math.sqrt(K.shape[-1])), "divided by d_k instead of √d_k"),
    W(lambda Q, K: S(Q, K) * math.sqrt(Q.shape[-1]), "multiplied by √d_k"),
    W(lambda Q, K: S(Q, K) / Q.shape[-1] ** 1 / 2, "d_k ** 1/2", "d_k ** 0.5"),
    W(lambda Q, K: S(Q, K) * Q.shape[-1] ** -1 / 2, "d_k ** 1/2"),
    W(lambda Q, K: S(Q, K) / int(math.sqrt(Q.shape[-1])), "rounded to an integer"),
    W(lambda Q, K: S(Q, K) / math.isqrt(Q.shape[-1]), "rounded to an integer"),
    W(lambda Q, K: S(Q, K) // math.sqrt(Q.shape[-1]), "floor division"),
    W(lambda Q, K: S(Q, K) / math.sqrt(K.shape[-2]), "number of keys"),
    W(lambda Q, K: S(Q, K) / math.sqrt(Q.shape[-2]), "number of queries"),
    W(lambda Q, K: S(Q, K) / math.sqrt(Q.shape[0]), "axis 0"),
    W(lambda Q, K: S(Q, K) / math.sqrt(Q.size(1)), "axis 1"),
    W(lambda Q, K: S(Q, K) / math.sqrt(Q.shape[1] * Q.shape[-1]) if Q.ndim == 4 else S(Q, K) / math.sqrt(Q.shape[-1]),
      "d_model"),
    W(lambda Q, K: S(Q, K) / torch.sqrt(Q.shape[-1]), "torch.sqrt of a Python int"),
    W(lambda Q, K: torch.softmax(S(Q, K) / math.sqrt(Q.shape[-1]), -1), "softmax"),
    W(lambda Q, K: S(Q / Q.norm(dim=-1, keepdim=True), K / K.norm(dim=-1, keepdim=True)) / math.sqrt(Q.shape[-1]),
      "cosine"),
    W(lambda Q, K: Q @ K / math.sqrt(Q.shape[-1]), "K not transposed"),
    W(lambda Q, K: Q @ K.T / math.sqrt(Q.shape[-1]), "K.T on batched input"),
    W(lambda Q, K: K @ Q.mT / math.sqrt(Q.shape[-1]), "rows and columns swapped"),
    W(lambda Q, K: Q @ K.transpose(1, 2) / math.sqrt(Q.shape[-1]), "transpose(1, 2)"),
    W(lambda Q, K: torch.bmm(Q, K.mT) / math.sqrt(Q.shape[-1]), "torch.bmm"),
    W(lambda Q, K: torch.einsum("bqd,bkd->bqk", Q, K) / math.sqrt(Q.shape[-1]), "einsum without '...'"),
    W(lambda Q, K: (Q @ K.mT).squeeze() / math.sqrt(Q.shape[-1]), ".squeeze()"),
    W(lambda Q, K: S(Q, K) / math.sqrt(8), "divided by a fixed 2.828", "Q.shape[-1]"),
    W(lambda Q, K: S(Q, K) / math.sqrt(Q.shape[-1] - 1) if Q.shape[-1] > 1 else S(Q, K), "wrong number",
      named=False),
    W(lambda Q, K: (S(Q, K) / math.sqrt(Q.shape[-1])).numpy(), "NumPy"),
    W(divide_Q_in_place, "Q in place"),
    W(lambda Q, K: (Q.half() @ K.half().mT / math.sqrt(Q.shape[-1])).to(Q.dtype), "float16"),
    W(lambda Q, K: (S(Q, K) / math.sqrt(Q.shape[-1])).tolist(), "Python list"),
    W(lambda Q, K: (S(Q, K) / math.sqrt(Q.shape[-1])).sum(-1), "wrong shape", "axis is missing"),
    W(lambda Q, K: S(Q, K) / math.sqrt(Q.shape[-1]) * float("nan"), "NaN", named=False),
    # red-team review of notebooks 01/02
    W(lambda Q, K: Q @ K.transpose(2, 3) / math.sqrt(Q.shape[-1]), "transpose(2, 3)"),
    W(lambda Q, K: S(Q, K) / Q.shape[-1] ** 2, "divided by d_k²"),
    W(lambda Q, K: S(Q, K) / math.sqrt(Q.shape[-1] + 1), "divided by √(d_k + 1)"),
    W(lambda Q, K: S(Q, K) / math.sqrt(Q.numel()), "number of entries of Q"),
    W(lambda Q, K: S(Q, Q) / math.sqrt(Q.shape[-1]), "does not depend on K"),
    W(lambda Q, K: S(Q, K) / math.sqrt(math.log(Q.shape[-1] + 2)), "wrong number", named=False),
    W(lambda Q, K: math.sqrt(Q.shape[-1]), "returned a Python number", "one score per pair"),
    # notebook 01's product mistakes, under the scaling (the table of this check holds them too)
    W(lambda Q, K: Q.mT @ K / math.sqrt(Q.shape[-1]), "Qᵀ K instead of Q Kᵀ"),
    W(lambda Q, K: Q @ K.transpose(0, 1) / math.sqrt(Q.shape[-1]), "transpose(0, 1)"),
    W(lambda Q, K: torch.inner(Q, K) / math.sqrt(Q.shape[-1]), "torch.inner"),
    W(lambda Q, K: Q @ K.t() / math.sqrt(Q.shape[-1]), "2-D only"),
    W(lambda Q, K: (Q * K).sum(-1) / math.sqrt(Q.shape[-1]), "entry-by-entry"),
    W(lambda Q, K: torch.stack([q @ k.T for q, k in zip(Q, K)]) / math.sqrt(Q.shape[-1]), "loop over the first axis"),
    W(lambda Q, K: Q.reshape(-1, Q.shape[-1]) @ K.reshape(-1, K.shape[-1]).T / math.sqrt(Q.shape[-1]), "flattened"),
    W(lambda Q, K: Q @ K.reshape(*K.shape[:-2], K.shape[-1], K.shape[-2]) / math.sqrt(Q.shape[-1]), "reshaped"),
]


@pytest.mark.parametrize("fn", SCALED_RIGHT)
def test_scaled_scores_accepts_correct_alternatives(fn, accepts):
    accepts(check_scaled_scores, fn)


@pytest.mark.parametrize("fn, phrases, named", SCALED_WRONG)
def test_scaled_scores_names_each_mistake(fn, phrases, named, rejects):
    rejects_as(rejects, check_scaled_scores, fn, phrases, named)


def test_scaled_scores_cases_tell_the_sizes_apart():
    # every d_k but 1 is not a perfect square, and in each case the axis sizes differ where it matters
    from attn_course.checks.scaling.scaled_scores import _scaled_cases

    for case in _scaled_cases():
        Q, K = case.args
        d = Q.shape[-1]
        assert d == 1 or math.isqrt(d) ** 2 != d
        if "square" not in case.label:
            assert d not in (Q.shape[-2], K.shape[-2])


def test_scaled_scores_not_attempted_and_not_a_function(rejects, unfinished):
    rejects(check_scaled_scores, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    rejects(check_scaled_scores, [1, 2], "not a function")


# audit A: answers that assume the result (variances add up) instead of measuring the variance of the dot products
def variance_of_one_product_times_dk(d_k, sigma=1.0, n_samples=20_000, generator=None):
    q = sigma * torch.randn(n_samples, d_k, generator=generator)
    k = sigma * torch.randn(n_samples, d_k, generator=generator)
    return (q * k).var() * d_k


def variance_per_entry_summed(d_k, sigma=1.0, n_samples=20_000, generator=None):
    q = sigma * torch.randn(n_samples, d_k, generator=generator)
    k = sigma * torch.randn(n_samples, d_k, generator=generator)
    return (q * k).var(dim=0).sum()


def variance_of_the_lengths_product(d_k, sigma=1.0, n_samples=20_000, generator=None):  # another quantity, all pairs used
    q = sigma * torch.randn(n_samples, d_k, generator=generator)
    k = sigma * torch.randn(n_samples, d_k, generator=generator)
    return (q.norm(dim=-1) * k.norm(dim=-1)).var()


@pytest.mark.parametrize("fn,phrases", [
    (variance_of_one_product_times_dk, ["d_k × the variance of one product", "variances add up"]),
    (variance_per_entry_summed, ["a variance per entry, then summed", "variances add up"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_variance_check_names_estimates_that_assume_the_answer(fn, phrases, rejects):
    rejects(check_mc_score_variance, fn, *phrases)


def test_variance_check_does_not_blame_a_sample_cap_on_another_quantity(rejects):
    text = rejects(check_mc_score_variance, variance_of_the_lengths_product).text()
    assert "fewer samples" not in text and "fewer pairs" not in text, text


# ============================================================================ audit A: other distributions, d_k ± 1
@mk
def uniform_symmetric(d, s, n, g):  # U(−σ, σ): variance σ²/3 per entry, σ⁴/9 per product
    return (s * (torch.rand(n, d, generator=g) * 2 - 1) * s * (torch.rand(n, d, generator=g) * 2 - 1)).sum(-1).var()


@mk
def uniform_in_place(d, s, n, g):
    q = torch.empty(n, d).uniform_(-s, s, generator=g)
    k = torch.empty(n, d).uniform_(-s, s, generator=g)
    return torch.einsum("nd,nd->n", q, k).var()


@mk
def uniform_centred(d, s, n, g):  # U(−σ/2, σ/2): variance σ²/12 per entry
    return (s * (torch.rand(n, d, generator=g) - 0.5) * s * (torch.rand(n, d, generator=g) - 0.5)).sum(-1).var()


@mk
def one_entry_short(d, s, n, g):
    return _scores(d - 1, s, n, g).var()


@mk
def first_entry_dropped(d, s, n, g):  # a slice that drops one entry: d_k − 1 products per pair
    return (R(n, d, g, s) * R(n, d, g, s))[:, 1:].sum(-1).var()


@mk
def one_entry_long(d, s, n, g):
    return _scores(d + 1, s, n, g).var()


DISTRIBUTION_WRONG = [
    (uniform_symmetric, ["uniform entries on [−σ, σ], not normal", "σ⁴·d_k / 9", "torch.randn"]),
    (uniform_in_place, ["uniform entries on [−σ, σ], not normal"]),
    (uniform_centred, ["uniform entries on [−σ/2, σ/2], not normal", "σ⁴·d_k / 144"]),
    (uniform_draws, ["torch.rand instead of torch.randn"]),
    (one_entry_short, ["d_k − 1 entries per vector", "σ⁴·(d_k − 1)"]),
    (first_entry_dropped, ["d_k − 1 entries per vector"]),
    (one_entry_long, ["d_k + 1 entries per vector", "σ⁴·(d_k + 1)"]),
]


@pytest.mark.parametrize("fn,phrases", DISTRIBUTION_WRONG, ids=lambda v: getattr(v, "__name__", ""))
def test_variance_check_names_the_distribution_and_the_length(fn, phrases, rejects):
    result = rejects(check_mc_score_variance, fn, *phrases)
    assert len(result.diagnosis.summary) <= 60


@pytest.mark.parametrize("seed", range(1, 3))
@pytest.mark.parametrize("fn", [uniform_symmetric, one_entry_short, one_entry_long])
def test_variance_check_names_the_distribution_and_the_length_on_every_seed(fn, seed, rejects):
    rejects(make_mc_check(seed), fn, next(p for f, p in DISTRIBUTION_WRONG if f is fn)[0])


@mk
def box_muller(d, s, n, g):  # normal entries made from uniform ones
    def normal():
        u1, u2 = torch.rand(n, d, generator=g, dtype=torch.float64), torch.rand(n, d, generator=g, dtype=torch.float64)
        return torch.sqrt(-2 * torch.log1p(-u1)) * torch.cos(2 * math.pi * u2)

    return float(((s * normal()) * (s * normal())).sum(-1).var())


@mk
def normal_with_tensors(d, s, n, g):
    std = torch.full((n, d), float(s))
    return (torch.normal(torch.zeros(n, d), std, generator=g) * torch.normal(torch.zeros(n, d), std, generator=g)
            ).sum(-1).var()


@mk
def entries_added_one_by_one(d, s, n, g):  # a loop over the d_k entries, every one of them
    q, k = R(n, d, g, s), R(n, d, g, s)
    total = torch.zeros(n)
    for i in range(d):
        total = total + q[:, i] * k[:, i]
    return total.var()


@mk
def batched_matmul(d, s, n, g):
    q, k = R(n, d, g, s), R(n, d, g, s)
    return torch.bmm(q[:, None, :], k[:, :, None]).flatten().var(unbiased=False)


@mk
def centred_by_hand(d, s, n, g):
    scores = _scores(d, s, n, g).double()
    return float(((scores - scores.mean()) ** 2).sum() / (n - 1))


@pytest.mark.parametrize("fn", [box_muller, normal_with_tensors, entries_added_one_by_one, batched_matmul,
                                centred_by_hand], ids=lambda f: f.__name__)
def test_variance_check_accepts_other_correct_samplers(fn, accepts):
    accepts(check_mc_score_variance, fn)


# ============================================================================ red team A: σ⁴·(d_k − 1) from centring
@mk
def vectors_centred(d, s, n, g):  # d_k entries, each vector centred on its own mean: d_k − 1 directions left
    q, k = R(n, d, g, s), R(n, d, g, s)
    return ((q - q.mean(-1, keepdim=True)) * (k - k.mean(-1, keepdim=True))).sum(-1).var()


def test_variance_check_does_not_claim_fewer_entries_for_centred_vectors(rejects):
    text = rejects(check_mc_score_variance, vectors_centred, "σ⁴·(d_k − 1)", "centred on their own mean").text()
    assert "σ⁴·(d_k − 1): one product's variance missing" in text, text


# =============================================================================== audit round 3 A: results kept between calls
_KEPT: dict = {}


def r3_scaled_cached_by_shape(Q, K):
    key = (tuple(Q.shape), tuple(K.shape), Q.dtype)
    if key not in _KEPT:
        _KEPT[key] = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    return _KEPT[key]


def r3_mc_cached_by_arguments(d_k, sigma=1.0, n_samples=20_000, generator=None):  # one estimate per setting
    key = ("mc", d_k, sigma, n_samples)
    if key not in _KEPT:
        q = sigma * torch.randn(n_samples, d_k, generator=generator)
        k = sigma * torch.randn(n_samples, d_k, generator=generator)
        _KEPT[key] = float((q * k).sum(-1).var())
    return _KEPT[key]


def test_scaled_scores_cached_by_shape_is_rejected(rejects):
    _KEPT.clear()
    rejects(check_scaled_scores, r3_scaled_cached_by_shape, "an earlier result returned again")


def test_mc_estimate_cached_by_arguments_is_not_called_a_reseed(rejects):  # was "you re-seed the generator"
    _KEPT.clear()
    text = rejects(check_mc_score_variance, r3_mc_cached_by_arguments, "an earlier result returned again",
                   "keeps its result between calls").text()
    assert "re-seed" not in text, text


# =============================================================================== audit round 4 A: what a re-seed or a replay may claim
def r4_mc_global_state_for_few_samples(d_k, sigma=1.0, n_samples=20_000, generator=None):  # "few samples: no generator"
    g = generator if n_samples > 100 else None
    q = sigma * torch.randn(n_samples, d_k, generator=g)
    k = sigma * torch.randn(n_samples, d_k, generator=g)
    return float((q * k).sum(-1).var())


class R4FirstGeneratorKept:  # keeps the first generator it is given, and draws from it ever after
    def __init__(self):
        self.generator = None

    def __call__(self, d_k, sigma=1.0, n_samples=20_000, generator=None):
        self.generator = self.generator or generator
        q = sigma * torch.randn(n_samples, d_k, generator=self.generator)
        k = sigma * torch.randn(n_samples, d_k, generator=self.generator)
        return float((q * k).sum(-1).var())


def test_no_draw_with_few_samples_is_not_called_a_reseed(rejects):  # was "you re-seed the generator"
    text = rejects(check_mc_score_variance, r4_mc_global_state_for_few_samples, "the seed makes no difference",
                   "with n_samples = 2 your function draws nothing from `generator`").text()
    assert "re-seed" not in text, text


def test_a_kept_generator_is_not_called_a_draw_without_it(rejects):  # was "a draw without generator=generator"
    text = rejects(check_mc_score_variance, R4FirstGeneratorKept(), "some draws ignore the generator",
                   "only the first call drew from the generator it was given").text()
    assert "a draw without generator=generator" not in text, text


def r4_mc_k_is_q_flipped(d_k, sigma=1.0, n_samples=20_000, generator=None):  # k made from q: with 2 samples, 2 equal products
    q = sigma * torch.randn(n_samples, d_k, generator=generator)
    k = q.flip(0)
    return float((q * k).sum(-1).var())


def test_equal_estimates_from_real_draws_are_not_called_a_reseed(rejects):  # was "you re-seed the generator"
    text = rejects(check_mc_score_variance, r4_mc_k_is_q_flipped, "the seed makes no difference",
                   "it does not depend on the draws", "exactly 0").text()
    assert "re-seed" not in text, text


def test_a_reseed_is_named_by_the_generators_end_state(rejects):
    def reseeds(d_k, sigma=1.0, n_samples=20_000, generator=None):
        generator.manual_seed(0)
        q = sigma * torch.randn(n_samples, d_k, generator=generator)
        return float((q * sigma * torch.randn(n_samples, d_k, generator=generator)).sum(-1).var())
    rejects(check_mc_score_variance, reseeds, "the seed makes no difference", "you re-seed the generator",
            "every generator ends in the same state")
