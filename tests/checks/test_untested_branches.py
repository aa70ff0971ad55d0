"""Diagnoses of notebook 02's Monte-Carlo check and notebook 04's Jacobian check that no other test reaches: each
is reached here by a learner's answer, written as a learner would write it, and the verdict names its mistake.

(These checks' own test files, tests/checks/test_scaling.py and tests/checks/test_jacobian.py, are edited by others
at the same time; the tests live here until they move there.)"""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.checks.jacobian import check_softmax_jacobian
from attn_course.checks.scaling import check_mc_score_variance


# ============================================================================ notebook 02: mc_score_variance
def checks_the_theory(d_k, sigma=1.0, n_samples=20_000, generator=None):  # "estimate it and compare with σ⁴·d_k"
    q = sigma * torch.randn(n_samples, d_k, generator=generator)
    k = sigma * torch.randn(n_samples, d_k, generator=generator)
    return math.isclose((q * k).sum(-1).var().item(), sigma**4 * d_k, rel_tol=0.05)


def neighbouring_rows_paired(d_k, sigma=1.0, n_samples=20_000, generator=None):
    """One draw, each row paired with the next as (q, k): n_samples − 1 dot products, one when n_samples = 2."""
    x = sigma * torch.randn(n_samples, d_k, generator=generator)
    return (x[1:] * x[:-1]).sum(-1).var()


def rand_when_no_generator(d_k, sigma=1.0, n_samples=20_000, generator=None):
    """Two branches written separately; the one for generator=None has torch.rand for torch.randn."""
    if generator is None:
        q, k = sigma * torch.rand(n_samples, d_k), sigma * torch.rand(n_samples, d_k)
    else:
        q = sigma * torch.randn(n_samples, d_k, generator=generator)
        k = sigma * torch.randn(n_samples, d_k, generator=generator)
    return (q * k).sum(-1).var()


def per_sample_variances_summed(d_k, sigma=1.0, n_samples=20_000, generator=None):
    q = sigma * torch.randn(n_samples, d_k, generator=generator)
    k = sigma * torch.randn(n_samples, d_k, generator=generator)
    return (q * k).var(dim=-1).sum()  # NaN when d_k = 1: a variance over one product


def normal_with_sigma_as_the_mean(d_k, sigma=1.0, n_samples=20_000, generator=None):
    q = torch.normal(sigma, 1.0, (n_samples, d_k), generator=generator)  # torch.normal(mean, std): mean σ, std 1
    k = torch.normal(sigma, 1.0, (n_samples, d_k), generator=generator)
    return (q * k).sum(-1).var()


@pytest.mark.parametrize("fn,phrases", [
    (checks_the_theory, ["returned a bool", "True", "return the variance itself"]),
    (neighbouring_rows_paired, ["NaN with n_samples = 2", "NaN, NaN", "n_samples ≥ 2 works"]),
    (rand_when_no_generator, ["wrong without a generator", "(no generator)", "samples differently"]),
    (per_sample_variances_summed, ["n_samples·σ⁴: a sum over the samples", "per-sample variances"]),
    (normal_with_sigma_as_the_mean, ["190.8, expected 64", "all your estimates", "return its .var()"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_mc_score_variance_names_each_mistake(fn, phrases, rejects):
    result = rejects(check_mc_score_variance, fn, *phrases)
    if fn is normal_with_sigma_as_the_mean:  # no known mistake, no constant factor, no shared draw: no cause claimed
        assert not result.diagnosis.cause


# ============================================================================ notebook 04: softmax_jacobian
def jacobian_with_a_dim_argument(p, dim):  # a dim argument, as torch.softmax has, without a default
    p = p.movedim(dim, -1)
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)


def jacobian_off_diagonal_sign_forgotten(p):  # J[i, j] = p_i (δ_ij − p_j), the i ≠ j branch without its minus
    outer = p.unsqueeze(-1) * p.unsqueeze(-2)
    eye = torch.eye(p.shape[-1], dtype=torch.bool)
    return torch.where(eye, p.unsqueeze(-1) - outer, outer)


def jacobian_p_times_identity_minus_outer(p):  # "J = diag(p) − p pᵀ = p ⊙ (I − p pᵀ)", misremembered
    eye = torch.eye(p.shape[-1], dtype=p.dtype)
    return p.unsqueeze(-1) * (eye - p.unsqueeze(-1) * p.unsqueeze(-2))


@pytest.mark.parametrize("fn,phrases", [
    (jacobian_with_a_dim_argument, ["raised TypeError", "missing 1 required positional argument",
                                    "does not take the arguments the docstring lists", "softmax_jacobian(p)"]),
    (jacobian_off_diagonal_sign_forgotten, ["off-diagonal entries wrong", "the diagonal of your J is right",
                                            "J[i, j] = −p_i p_j for i ≠ j"]),
    (jacobian_p_times_identity_minus_outer, ["J not symmetric", "differs from its transpose"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_softmax_jacobian_names_each_mistake(fn, phrases, rejects):
    rejects(check_softmax_jacobian, fn, *phrases)
