"""Notebook 08: the reference pattern metrics, the toy model, and each metric check's diagnoses."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest
import torch

matplotlib.use("Agg")

from attn_course import patterns as ref  # noqa: E402
from attn_course.checks._core import NotAttempted  # noqa: E402
from attn_course.checks.patterns import (  # noqa: E402
    check_effective_positions,
    check_locality,
    check_normalised_entropy,
    check_peak_weight,
    check_self_attention_weight,
)
from checking import rejects, accepts


def unfinished(weights):
    raise NotImplementedError()


ALL_CHECKS = [check_normalised_entropy, check_peak_weight, check_self_attention_weight, check_locality,
              check_effective_positions]


# ---- reference metrics vs independent computations ----------------------------------------

def test_entropy_matches_torch_categorical_and_handles_zeros():
    torch.manual_seed(0)
    w = torch.softmax(torch.randn(3, 5, 7, dtype=torch.float64), -1)
    torch.testing.assert_close(ref.entropy(w), torch.distributions.Categorical(probs=w).entropy())
    torch.testing.assert_close(ref.normalised_entropy(w), ref.entropy(w) / math.log(7))
    causal = torch.softmax(torch.randn(4, 4).masked_fill(torch.ones(4, 4).triu(1).bool(), -math.inf), -1)
    assert torch.isfinite(ref.normalised_entropy(causal)).all()
    assert ref.normalised_entropy(causal)[0] == 0  # the first row is one-hot
    assert (ref.normalised_entropy(torch.ones(2, 1)) == 0).all()


def test_metric_extremes_on_one_hot_and_uniform_rows():
    eye, uniform = torch.eye(5), torch.full((5, 5), 0.2)
    torch.testing.assert_close(ref.normalised_entropy(uniform), torch.ones(5))
    torch.testing.assert_close(ref.effective_positions(uniform), torch.full((5,), 5.0))
    torch.testing.assert_close(ref.effective_positions(eye), torch.ones(5))
    torch.testing.assert_close(ref.self_attention_weight(eye), torch.ones(5))
    torch.testing.assert_close(ref.locality(eye), torch.zeros(5))
    torch.testing.assert_close(ref.peak_weight(uniform), torch.full((5,), 0.2))
    # uniform: expected position 2 for every query, so locality |2 − i|
    torch.testing.assert_close(ref.locality(uniform), torch.tensor([2.0, 1.0, 0.0, 1.0, 2.0]))


def test_metrics_accept_numpy():
    w = np.full((3, 3), 1 / 3)
    np.testing.assert_allclose(ref.normalised_entropy(w).numpy(), np.ones(3))
    np.testing.assert_allclose(ref.locality(w).numpy(), [1.0, 0.0, 1.0])


def test_synthetic_patterns_have_their_signature():
    m = {k: {name: v.mean().item() for name, v in ref.pattern_metrics(ref.synthetic_pattern(k)).items()}
         for k in ref.PATTERN_TYPES}
    for kind in ref.PATTERN_TYPES:
        torch.testing.assert_close(ref.synthetic_pattern(kind).sum(-1), torch.ones(8, dtype=torch.float64))
    assert m["diagonal"]["self"] > 0.9 and m["diagonal"]["locality"] < 0.25
    assert m["previous-token"]["self"] < 0.2 and 0.8 < m["previous-token"]["locality"] < 1.0
    assert m["vertical"]["locality"] > 3
    assert m["uniform"]["entropy (norm.)"] == pytest.approx(1.0)
    assert m["block"]["eff. positions"] == pytest.approx(4.878, abs=1e-3)
    with pytest.raises(ValueError):
        ref.synthetic_pattern("spiral")


def test_metrics_table_lists_every_query():
    table = ref.metrics_table(ref.synthetic_pattern("uniform", 4), tokens=list("abcd"))
    assert len(table.splitlines()) == 6 and "eff. positions" in table and "4.00" in table


def test_toy_batch_targets():
    tokens, targets = ref.make_toy_batch(5, 8, 10, generator=torch.Generator().manual_seed(0))
    assert tokens.shape == (5, 8) and targets.shape == (5, 8, 2)
    assert (targets[:, 0, 0] == ref.IGNORE).all()
    assert torch.equal(targets[:, 1:, 0], tokens[:, :-1])
    assert torch.equal(targets[..., 1], tokens[:, :1].expand(5, 8))


def test_toy_model_learns_and_is_reproducible():
    torch.set_num_threads(1)
    model_a, losses_a = ref.train_toy_model(steps=60, progress=False)
    model_b, losses_b = ref.train_toy_model(steps=60, progress=False)
    assert losses_a == losses_b
    acc = ref.evaluate(model_a, n=200)
    assert acc == ref.evaluate(model_b, n=200)
    assert acc["previous token"] > 0.9 and acc["first token"] > 0.9
    assert losses_a[-1] < losses_a[0] / 5
    logits, weights = model_a(torch.zeros(1, 8, dtype=torch.long))
    assert logits.shape == (1, 8, 2, 10) and weights[0].shape == (1, 2, 8, 8)


def test_figures_and_explorer_build():
    w = torch.stack([ref.synthetic_pattern(k) for k in ("diagonal", "vertical")])
    fig = ref.plot_heads(list(w), list("abcdefgh"), ["a", "b"])
    assert len(fig.axes) == 3
    static = ref.head_explorer([w], list("abcdefgh"))  # no kernel here: a static figure
    assert isinstance(static, matplotlib.figure.Figure)


# ---- the checks: common behaviour ---------------------------------------------------------

@pytest.mark.parametrize("check", ALL_CHECKS)
def test_checks_accept_the_reference(check, capsys):
    fn = {check_normalised_entropy: ref.normalised_entropy, check_peak_weight: ref.peak_weight,
          check_self_attention_weight: ref.self_attention_weight, check_locality: ref.locality,
          check_effective_positions: ref.effective_positions}[check]
    accepts(check, fn, capsys)


@pytest.mark.parametrize("check", ALL_CHECKS)
def test_checks_handle_unfinished_and_malformed_answers(check):
    rejects(check, unfinished, "not attempted", kind=NotAttempted)
    rejects(check, 3.0, "expected a function")
    rejects(check, lambda w: [0.5] * w.shape[-2], "Python list")
    rejects(check, lambda w: w, "has shape", "one value per query")
    message = rejects(check, lambda w: w.sum(-1) * float("nan"))
    assert "nan" in message.lower() and "log(0)" not in message
    rejects(check, lambda w: 1 / 0, "ZeroDivisionError")


# ---- normalised entropy ------------------------------------------------------------------

def entropy_eps(w):  # the common "+ 1e-10" guard: close enough
    return -(w * torch.log(w + 1e-10)).sum(-1) / math.log(w.shape[-1]) if w.shape[-1] > 1 else w.sum(-1) * 0


def entropy_numpy(weights):
    w = np.asarray(weights, dtype=np.float64)
    logs = np.log(np.where(w > 0, w, 1.0))
    h = -(w * logs).sum(-1)
    n = w.shape[-1]
    return h / np.log(n) if n > 1 else np.zeros_like(h)


def entropy_where_log2(w):
    h = -torch.where(w > 0, w * torch.log2(w), torch.zeros_like(w)).sum(-1)
    return h / math.log2(w.shape[-1]) if w.shape[-1] > 1 else torch.zeros_like(h)


@pytest.mark.parametrize("fn", [entropy_eps, entropy_numpy, entropy_where_log2])
def test_entropy_check_accepts_alternatives(fn, capsys):
    accepts(check_normalised_entropy, fn, capsys)


def test_entropy_check_rejects_log_zero_nan():
    rejects(check_normalised_entropy, lambda w: -(w * w.log()).sum(-1) / math.log(w.shape[-1]),
               "contains NaN", "entropy with log(0) = NaN", "xlogy")


def test_entropy_check_rejects_unnormalised_entropy():
    rejects(check_normalised_entropy, lambda w: -torch.special.xlogy(w, w).sum(-1), "entropy not normalised")


def test_entropy_check_rejects_normalising_by_queries():
    def by_queries(w):
        h = -torch.special.xlogy(w, w).sum(-1)
        return h / math.log(w.shape[-2]) if w.shape[-2] > 1 else h

    rejects(check_normalised_entropy, by_queries, "log(n_q)", "number of keys")


def test_entropy_check_rejects_sign_axis_and_single_key_nan():
    rejects(check_normalised_entropy, lambda w: -ref.normalised_entropy(w), "sign is flipped")
    rejects(check_normalised_entropy, lambda w: -torch.special.xlogy(w, w).sum(-2) / math.log(w.shape[-1]),
               "over the queries (axis −2)")
    rejects(check_normalised_entropy, lambda w: -torch.special.xlogy(w, w).sum(-1) / math.log(w.shape[-1]),
               "single key", "0/0")


# ---- peak weight ---------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [lambda w: w.max(dim=-1).values, lambda w: np.asarray(w).max(axis=-1),
                                lambda w: torch.max(w, -1, keepdim=True)[0].squeeze(-1),
                                lambda w: w.double().amax(-1)])
def test_peak_check_accepts_alternatives(fn, capsys):
    accepts(check_peak_weight, fn, capsys)


def test_peak_check_rejects_its_pitfalls():
    rejects(check_peak_weight, lambda w: w.amax(-2), "over the queries (axis −2)")
    rejects(check_peak_weight, lambda w: w.argmax(-1), "argmax")
    rejects(check_peak_weight, lambda w: w.max(), "whole tensor")
    rejects(check_peak_weight, lambda w: w.max(dim=-1), "(values, indices)", ".values")


# ---- self-attention ------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [lambda w: torch.diagonal(w, dim1=-2, dim2=-1),
                                lambda w: np.diagonal(np.asarray(w), axis1=-2, axis2=-1),
                                lambda w: torch.einsum("...ii->...i", w),
                                lambda w: (w * torch.eye(w.shape[-1], dtype=w.dtype)).sum(-1)])
def test_self_check_accepts_alternatives(fn, capsys):
    accepts(check_self_attention_weight, fn, capsys)


def test_self_check_rejects_its_pitfalls():
    rejects(check_self_attention_weight, lambda w: torch.diagonal(w), "first two axes", "dim1=-2")
    rejects(check_self_attention_weight, lambda w: w.diagonal(-1, -2, -1), "below the main one")
    rejects(check_self_attention_weight, lambda w: w.diagonal(dim1=-2, dim2=-1).sum(-1), "trace")
    rejects(check_self_attention_weight, lambda w: np.diag(np.asarray(w)), "raised ValueError")


# ---- locality ------------------------------------------------------------------------------

def locality_numpy(weights):
    w = np.asarray(weights, dtype=np.float64)
    expected = w @ np.arange(w.shape[-1])
    return np.abs(expected - np.arange(w.shape[-2]))


def locality_einsum(w):
    keys = torch.arange(w.shape[-1], dtype=w.dtype)
    return (torch.einsum("...qk,k->...q", w, keys) - torch.arange(w.shape[-2], dtype=w.dtype)).abs()


@pytest.mark.parametrize("fn", [locality_numpy, locality_einsum, lambda w: ref.locality(w.double())])
def test_locality_check_accepts_alternatives(fn, capsys):
    accepts(check_locality, fn, capsys)


def test_locality_check_rejects_the_wrong_axis():
    def wrong_axis(w):
        q = torch.arange(w.shape[-2], dtype=w.dtype)
        return ((w * q[:, None]).sum(-2) - torch.arange(w.shape[-1], dtype=w.dtype)).abs()

    rejects(check_locality, wrong_axis, "locality measured from the wrong axis", "Σ_j w_ij·j")


def test_locality_check_rejects_its_other_pitfalls():
    idx = lambda w, axis: torch.arange(w.shape[axis], dtype=w.dtype)  # noqa: E731
    rejects(check_locality, lambda w: (w * idx(w, -1)).sum(-1) - idx(w, -2), "signed")
    rejects(check_locality, lambda w: (w.argmax(-1) - idx(w, -2)).abs(), "argmax")
    rejects(check_locality, lambda w: ((w * (idx(w, -1) + 1)).sum(-1) - idx(w, -2)).abs(), "counted from 1")
    rejects(check_locality, lambda w: (w * idx(w, -1)).sum(-1), "subtract the query's own position")


# ---- effective positions -------------------------------------------------------------------

@pytest.mark.parametrize("fn", [lambda w: ref.entropy(w).exp(),
                                lambda w: np.exp(-np.sum(np.asarray(w, dtype=np.float64)
                                                         * np.log(np.clip(np.asarray(w, dtype=np.float64), 1e-300, None)), -1)),
                                lambda w: torch.exp(torch.distributions.Categorical(probs=w.double()).entropy())])
def test_effective_check_accepts_alternatives(fn, capsys):
    accepts(check_effective_positions, fn, capsys)


def test_effective_check_rejects_its_pitfalls():
    n = lambda w: w.shape[-1]  # noqa: E731
    rejects(check_effective_positions, lambda w: ref.normalised_entropy(w).exp(), "normalised entropy")
    rejects(check_effective_positions, lambda w: (w > 1 / (2 * n(w))).sum(-1), "threshold")
    rejects(check_effective_positions, lambda w: 2 ** ref.entropy(w), "different bases")
    rejects(check_effective_positions, lambda w: 1 / (w ** 2).sum(-1), "inverse participation ratio")
    rejects(check_effective_positions, lambda w: ref.entropy(w), "exp(H)")
    rejects(check_effective_positions, lambda w: torch.exp(-(w * w.log()).sum(-1)), "log(0) = NaN")
