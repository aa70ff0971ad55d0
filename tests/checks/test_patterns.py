"""Checks of notebook 08 (attn_course.checks.patterns): every pitfall rejected with its diagnosis, correct
alternatives (einsum, log2, an epsilon guard, Categorical, loops, float64…) accepted, same verdict on replay.
The docstrings ask for a tensor: a NumPy result is named ("returned a NumPy array"), not accepted."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attn_course import patterns as ref
from attn_course.checks.patterns import (
    check_attention_distance,
    check_effective_positions,
    check_normalised_entropy,
    check_peak_weight,
    check_self_attention_weight,
)
from attn_course.checks.result import Status

CHECKS = {
    check_normalised_entropy: ref.normalised_entropy,
    check_peak_weight: ref.peak_weight,
    check_self_attention_weight: ref.self_attention_weight,
    check_attention_distance: ref.attention_distance,
    check_effective_positions: ref.effective_positions,
}


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.exercise)
def test_accepts_the_reference(check, accepts):
    accepts(check, CHECKS[check])


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.exercise)
def test_bad_answers(check, rejects, unfinished):
    rejects(check, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    rejects(check, 3.0, "not a function")
    rejects(check, lambda w, mask=None: [0.5] * w.shape[-2], "Python list")
    rejects(check, lambda w, mask=None: w, "wrong shape")
    rejects(check, lambda w, mask=None: w.sum(-1) * float("nan"), "NaN")
    rejects(check, lambda w, mask=None: 1 / 0, "ZeroDivisionError")
    rejects(check, lambda w, mask=None: None, "returned None")


# ============================================================================ normalised entropy
def _allowed(w, mask):
    return torch.full(w.shape[:-1], w.shape[-1], dtype=torch.float64) if mask is None else \
        torch.broadcast_to(mask, w.shape).sum(-1).double()


def entropy_eps(w, mask=None):  # the common "+ 1e-10" guard: close enough
    h = -(w * torch.log(w + 1e-10)).sum(-1).double()
    n = _allowed(w, mask)
    return torch.where(n > 1, h / n.clamp(min=2).log(), torch.zeros_like(h))


def entropy_numpy(weights, mask=None):
    w = np.asarray(weights, dtype=np.float64)
    h = -(w * np.log(np.where(w > 0, w, 1.0))).sum(-1)
    n = np.full(h.shape, w.shape[-1]) if mask is None else np.broadcast_to(np.asarray(mask), w.shape).sum(-1)
    return np.where(n > 1, h / np.log(np.maximum(n, 2)), 0.0)


def entropy_log2(w, mask=None):
    h = -torch.where(w > 0, w * torch.log2(w), torch.zeros_like(w)).sum(-1)
    n = _allowed(w, mask).to(h.dtype)
    return torch.where(n > 1, h / torch.log2(n.clamp(min=2)), torch.zeros_like(h))


def entropy_categorical(w, mask=None):
    h = torch.distributions.Categorical(probs=w.double() + 1e-300).entropy()
    n = _allowed(w, mask)
    out = h / n.log()
    return torch.nan_to_num(out, nan=0.0, posinf=0.0).where(n > 1, torch.zeros_like(out))


def entropy_keyword_loop(weights, mask=None):
    rows = weights.reshape(-1, weights.shape[-1]).double()
    allowed = (torch.ones_like(weights, dtype=torch.bool) if mask is None else torch.broadcast_to(mask, weights.shape))
    allowed = allowed.reshape(-1, weights.shape[-1])
    out = []
    for row, ok in zip(rows, allowed):
        k = int(ok.sum())
        h = -sum(p * math.log(p) for p in row.tolist() if p > 0)
        out.append(h / math.log(k) if k > 1 else 0.0)
    return torch.tensor(out).reshape(weights.shape[:-1])


def entropy_k0_over_neg_inf(w, mask=None):  # k = 0 (fully masked): 0 / log 0 = 0 / −inf = −0, right without a guard
    h = -torch.special.xlogy(w, w).sum(-1)
    k = torch.as_tensor(w.shape[-1] if mask is None else torch.broadcast_to(mask, w.shape).sum(-1), dtype=w.dtype)
    out = h / torch.log(k)
    return torch.where(k == 1, torch.zeros_like(out), out)


def entropy_masked_fill(w, mask=None):
    allowed = torch.ones_like(w, dtype=torch.bool) if mask is None else mask.expand_as(w)
    p = w.masked_fill(~allowed, 0.0)
    h = -(p * torch.where(p > 0, p, 1.0).log()).sum(-1)
    k = allowed.sum(-1)
    return torch.where(k > 1, h / torch.log(k.clamp(min=2).to(h.dtype)), 0.0)


@pytest.mark.parametrize("fn", [entropy_eps, entropy_log2, entropy_categorical, entropy_keyword_loop,
                                entropy_k0_over_neg_inf, entropy_masked_fill])
def test_entropy_accepts_alternatives(fn, accepts):
    accepts(check_normalised_entropy, fn)


def _h(w):
    return -torch.special.xlogy(w, w).sum(-1).double()


@pytest.mark.parametrize("fn,phrases", [
    (lambda w, mask=None: -(w * w.log()).sum(-1) / math.log(w.shape[-1]), ["log(0) gives NaN", "xlogy"]),
    (lambda w, mask=None: _h(w), ["entropy not normalised"]),
    (lambda w, mask=None: _h(w) / math.log(w.shape[-1]) if w.shape[-1] > 1 else _h(w) * 0,
     ["normalised by all keys, not the allowed ones", "mask.sum(-1)"]),
    (lambda w, mask=None: _h(w) / math.log(w.shape[-2]) if w.shape[-2] > 1 else _h(w),
     ["normalised by the number of queries"]),
    (lambda w, mask=None: -ref.normalised_entropy(w, mask), ["sign flipped"]),
    (lambda w, mask=None: -torch.special.xlogy(w, w).sum(-2) / math.log(w.shape[-1]), ["summed over the queries"]),
    (lambda w, mask=None: _h(w) / _allowed(w, mask).log(), ["0/0 on rows with a single allowed key"]),
    (lambda w, mask=None: ref.normalised_entropy(w, None if mask is None else ~mask), ["mask polarity inverted"]),
    (lambda w, mask=None: ref.normalised_entropy(w, w > 0), ["counted the nonzero weights"]),
    (lambda w, mask=None: _h(w) / math.log(2), ["entropy in bits, not normalised"]),
    (lambda w: ref.normalised_entropy(w), ["does not take the mask"]),
    (lambda w, mask=None: (lambda h, k: torch.where(k > 1, h / k.clamp(min=2).log(), 0.0))(
        _h(w), _allowed(w, None) if mask is None else mask.sum(-1).double()), ["mask not broadcast before counting"]),
])
def test_entropy_names_each_pitfall(fn, phrases, rejects):
    rejects(check_normalised_entropy, fn, *phrases)


def entropy_one_matrix(weights, mask=None):  # a loop over the rows of one (n_q, n_k) matrix: raises on a batch
    n_q, n_k = weights.shape
    out = torch.zeros(n_q, dtype=weights.dtype)
    for i in range(n_q):
        k = n_k if mask is None else int(torch.broadcast_to(mask, weights.shape)[i].sum())
        if k > 1:
            out[i] = -torch.special.xlogy(weights[i], weights[i]).sum() / math.log(k)
    return out


def _k(w, mask):
    return _allowed(w, mask).to(torch.float64)


@pytest.mark.parametrize("fn,phrases", [
    (entropy_numpy, ["returned a NumPy array, not a tensor"]),  # the docstring asks for a tensor
    (lambda w, mask=None: -torch.special.xlogy(w, w).mean(-1) / math.log(w.shape[-1]), ["mean over the keys"]),
    (lambda w, mask=None: torch.where(_k(w, mask) > 1, _h(w) / _k(w, mask), 0.0), ["divided by the number of keys, not its log"]),
    (lambda w, mask=None: torch.where(_k(w, mask) > 1, _h(w) / (_k(w, mask) + 1).log(), 0.0), ["normalised by log(k + 1)"]),
    (lambda w, mask=None: _h(w) / math.log(8), ["normalised by log 8, a fixed number"]),
    (lambda w, mask=None: torch.where(_k(w, mask) > 1, _h(w) / math.log(2) / _k(w, mask).clamp(min=2).log(), 0.0),
     ["log2 in the entropy, ln in the normaliser"]),
    (lambda w, mask=None: torch.where(_k(w, mask) > 1, -(w * torch.log(w + 1e-3)).sum(-1) / _k(w, mask).clamp(min=2).log(),
                                      0.0), ["log(w + 0.001) instead of log(w)"]),
    (lambda w, mask=None: 1 - ref.normalised_entropy(w, mask), ["every value is 1 − the expected value"]),
    (lambda w, mask=None: ref.normalised_entropy(w, mask).sqrt(), ["a row of 0.5, 0.5, 0, 0 gives 0.7071, not 0.5"]),
    (entropy_one_matrix, ["ran on single matrices such as (6, 6) but raised on (2, 3, 5, 5)"]),
])
def test_entropy_names_red_team_mistakes(fn, phrases, rejects):
    rejects(check_normalised_entropy, fn, *phrases)


# ============================================================================ peak weight
@pytest.mark.parametrize("fn", [lambda w: w.max(dim=-1).values, lambda w: w.float().amax(-1),
                                lambda w: w.topk(1, dim=-1).values.squeeze(-1),
                                lambda w: w.gather(-1, w.argmax(-1, keepdim=True)).squeeze(-1),
                                lambda w: torch.max(w, -1, keepdim=True)[0].squeeze(-1),
                                lambda w: w.double().amax(-1), lambda w: w.sort(-1).values[..., -1]])
def test_peak_accepts_alternatives(fn, accepts):
    accepts(check_peak_weight, fn)


@pytest.mark.parametrize("fn,phrases", [
    (lambda w: w.amax(-2), ["maximum over the queries"]),
    (lambda w: w.argmax(-1), ["position of the peak"]),
    (lambda w: w.max(), ["maximum of the whole tensor"]),
    (lambda w: w.max(dim=-1), ["(values, indices) pair", ".values"]),
    (lambda w: w.amin(-1), ["minimum instead of maximum"]),
    (lambda w: w.sum(-1), ["row sums"]),
    (lambda w: w.amax(-1, keepdim=True), ["wrong shape", "keepdim"]),
    (lambda w: np.asarray(w).max(axis=-1), ["returned a NumPy array, not a tensor"]),
    (lambda w: w.amax(-1).round(), ["rounded to whole numbers"]),  # on the first case peaks lie on both sides of ½
    (lambda w: w.max(1).values, ["maximum over axis 1", "the keys are the last axis"]),
    (lambda w: torch.stack([row.max() for row in w]), ["one maximum per batch entry"]),
    (lambda w: w[..., 0], ["weight of the first key"]),
    (lambda w: w.mean(-1), ["row means"]),
    (lambda w: w.topk(2, dim=-1).values[..., 1], ["second-largest weight"]),
    (lambda w: w.flatten(-2).amax(-1) if w.ndim > 2 else w.max(), ["maximum of the whole tensor"]),
    (lambda w: w.median(-1).values, ["not each row's largest weight", "the weight of key"]),
    (lambda w: 1 - w.amax(-1), ["every value is 1 − the expected value"]),
    (lambda w: w.amax(-1).half(), ["result in float16"]),
])
def test_peak_names_each_pitfall(fn, phrases, rejects):
    rejects(check_peak_weight, fn, *phrases)


# ============================================================================ self-attention weight
@pytest.mark.parametrize("fn", [lambda w: torch.diagonal(w, dim1=-2, dim2=-1),
                                lambda w: w[..., torch.arange(w.shape[-1]), torch.arange(w.shape[-1])],
                                lambda w: w.masked_fill(~torch.eye(w.shape[-1], dtype=torch.bool), 0).sum(-1),
                                lambda w: torch.einsum("...ii->...i", w),
                                lambda w: (w * torch.eye(w.shape[-1], dtype=w.dtype)).sum(-1)])
def test_self_accepts_alternatives(fn, accepts):
    accepts(check_self_attention_weight, fn)


@pytest.mark.parametrize("fn,phrases", [
    (lambda w: torch.diagonal(w), ["diagonal over the first two axes", "dim1=-2"]),
    (lambda w: w.diagonal(-1, -2, -1), ["diagonal below the main one"]),
    (lambda w: w.diagonal(1, -2, -1), ["diagonal above the main one"]),
    (lambda w: w.diagonal(dim1=-2, dim2=-1).sum(-1), ["trace"]),
    (lambda w: w.sum(-1), ["row sums"]),
    (lambda w: w.flip(-1).diagonal(dim1=-2, dim2=-1), ["anti-diagonal"]),
    (lambda w: np.diag(np.asarray(w)), ["returned a NumPy array, not a tensor"]),
    (lambda w: torch.diag(w), ["raised RuntimeError", "ran on single matrices", "assumes 2-D weights"]),
    (lambda w: (w * torch.eye(8)).sum(-1), ["raised RuntimeError", "a size 8", "hard-coded"]),
    (lambda w: (w * torch.eye(6)).sum(-1), ["a size 6 that weights of shape (2, 3, 5, 5) do not have", "hard-coded"]),
    (lambda w: w.amax(-1), ["largest weight, not the diagonal"]),
    (lambda w: w[..., 0], ["weight of the first key"]),
    (lambda w: w.sum(-2), ["column sums, not the diagonal"]),
    (lambda w: w.diagonal(dim1=-2, dim2=-1).flip(-1), ["queries in reverse order"]),
])
def test_self_names_each_pitfall(fn, phrases, rejects):
    rejects(check_self_attention_weight, fn, *phrases)


# ============================================================================ attention distance
def distance_numpy(weights):
    w = np.asarray(weights, dtype=np.float64)
    j, i = np.arange(w.shape[-1]), np.arange(w.shape[-2])
    return (w * np.abs(j[None, :] - i[:, None])).sum(-1)


def distance_einsum(w):
    d = (torch.arange(w.shape[-1])[None, :] - torch.arange(w.shape[-2])[:, None]).abs().to(w.dtype)
    return torch.einsum("...qk,qk->...q", w, d)


def distance_loop(w):
    out = torch.zeros(w.shape[:-1], dtype=torch.float64)
    for i in range(w.shape[-2]):
        for j in range(w.shape[-1]):
            out[..., i] += w[..., i, j].double() * abs(j - i)
    return out


def distance_cdist(w):
    pos_q = torch.arange(w.shape[-2], dtype=w.dtype)[:, None]
    pos_k = torch.arange(w.shape[-1], dtype=w.dtype)[:, None]
    return (w * torch.cdist(pos_q, pos_k, p=1)).sum(-1)


def distance_transposed_table(w):
    table = (torch.arange(w.shape[-1])[:, None] - torch.arange(w.shape[-2])[None, :]).abs()  # (n_k, n_q)
    return (w * table.T).sum(-1)


@pytest.mark.parametrize("fn", [distance_einsum, distance_loop, distance_cdist, distance_transposed_table])
def test_distance_accepts_alternatives(fn, accepts):
    accepts(check_attention_distance, fn)


def _idx(w, axis):
    return torch.arange(w.shape[axis], dtype=w.dtype)


def _signed(w):
    return _idx(w, -1)[None, :] - _idx(w, -2)[:, None]


@pytest.mark.parametrize("fn,phrases", [
    (lambda w: ((w * _idx(w, -1)).sum(-1) - _idx(w, -2)).abs(), ["distance of the mean position, not the mean distance"]),
    (lambda w: (w * _signed(w)).sum(-1), ["signed distances"]),
    (lambda w: (w.argmax(-1) - _idx(w, -2)).abs(), ["distance to the most-attended key only"]),
    (lambda w: (w * (_signed(w) + 1).abs()).sum(-1), ["keys counted from 1"]),
    (lambda w: (w * _signed(w) ** 2).sum(-1), ["squared distances"]),
    (lambda w: _signed(w).abs().mean(-1).expand(w.shape[:-1]), ["distances not weighted"]),
    (lambda w: (w * _signed(w).abs()).sum(-1) / w.shape[-1], ["divided by the number of keys"]),
    (lambda w: (w * _idx(w, -1)).sum(-1), ["mean attended position"]),
    (lambda w: (w * _signed(w).abs()).sum(-2), ["summed over the queries"]),
    (distance_numpy, ["returned a NumPy array, not a tensor"]),
    (lambda w: (w * (_signed(w) - (w.shape[-1] - w.shape[-2])).abs()).sum(-1), ["queries placed at the end of the keys"]),
    (lambda w: (w * (-_signed(w)).clamp(min=0)).sum(-1), ["only the keys before the query counted"]),
    (lambda w: (w * _signed(w).abs()).sum(-1) / max(w.shape[-1] - 1, 1), ["divided by the largest distance"]),
    (lambda w: (w * _signed(w).abs()).sum(-1).round(), ["rounded to whole numbers"]),
    (lambda w: (w * (torch.arange(w.shape[-1])[None, :] - torch.arange(w.shape[-1])[:, None]).abs()).sum(-1),
     ["ran on square weights but raised on 4 queries × 7 keys"]),
    (lambda w: (w * (torch.arange(6)[None, :] - torch.arange(6)[:, None]).abs()).sum(-1),  # the first case's size
     ["a size 6 that weights of shape (4, 7) do not have", "hard-coded"]),
])
def test_distance_names_each_pitfall(fn, phrases, rejects):
    rejects(check_attention_distance, fn, *phrases)


# ============================================================================ effective positions
@pytest.mark.parametrize("fn", [
    lambda w: ref.entropy(w).exp(),
    lambda w: torch.exp(torch.distributions.Categorical(probs=w.double()).entropy()),
    lambda w: torch.pow(w, -w).prod(-1),
    lambda w: torch.special.entr(w).sum(-1).exp(),

    lambda w: 2 ** (-torch.where(w > 0, w * torch.log2(w), torch.zeros_like(w)).sum(-1)),
])
def test_effective_accepts_alternatives(fn, accepts):
    accepts(check_effective_positions, fn)


@pytest.mark.parametrize("fn,phrases", [
    (lambda w: ref.normalised_entropy(w).exp(), ["exp of the normalised entropy"]),
    (lambda w: (w > 1 / (2 * w.shape[-1])).sum(-1), ["weights above a threshold"]),
    (lambda w: (w > 0).sum(-1), ["nonzero weights counted"]),
    (lambda w: 2 ** ref.entropy(w), ["log and exp in different bases"]),
    (lambda w: 1 / (w ** 2).sum(-1), ["inverse participation ratio"]),
    (lambda w: ref.entropy(w), ["entropy, not its exponential"]),
    (lambda w: torch.exp(-(w * w.log()).sum(-1)), ["log(0) gives NaN"]),
    (lambda w: torch.exp((w * torch.log(w + 1e-12)).sum(-1)), ["sign flipped"]),
    (lambda w: np.exp(-np.sum(np.asarray(w, dtype=np.float64) * np.log(np.clip(np.asarray(w, dtype=np.float64), 1e-300,
                                                                              None)), -1)),
     ["returned a NumPy array, not a tensor"]),
    (lambda w: torch.exp(torch.special.entr(w).mean(-1)), ["mean over the keys instead of a sum"]),
    (lambda w: 1 / w.amax(-1), ["one over the peak weight"]),
    (lambda w: torch.exp(torch.special.entr(w).sum(-1) / math.log(2)), ["log and exp in different bases"]),
    (lambda w: torch.exp(torch.special.entr(w).sum(-1)) - 1, ["one less than exp(H)"]),
    (lambda w: torch.exp(-(w * torch.log(w + 1e-3)).sum(-1)), ["log(w + 0.001) instead of log(w)"]),
    (lambda w: torch.exp(torch.special.entr(w).sum(-1)).round(), ["rounded to whole numbers"]),
    (lambda w: 1 + torch.special.entr(w).sum(-1), ["a row uniform over 4 keys gives 2.386, not 4"]),
])
def test_effective_names_each_pitfall(fn, phrases, rejects):
    rejects(check_effective_positions, fn, *phrases)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.exercise)
def test_first_case_separates_the_classic_mistakes(check):
    """On the general first case, row maxima lie on both sides of ½ and below the matrix's maximum, so that the
    whole-tensor maximum, row sums and rounded peaks give different numbers (a first case with a one-hot row made
    three of them look alike)."""
    from attn_course.checks import patterns as C

    w = C._general(extremes=False)["w"]
    peaks = w.amax(-1)
    assert (peaks < 0.5).any() and (peaks > 0.5).any() and float(w.max()) < 0.99
    outputs = [w.max().expand(6), w.sum(-1), peaks.round(), peaks, w.amin(-1), w.mean(-1), w[..., 0]]
    assert all(not torch.allclose(a, b) for i, a in enumerate(outputs) for b in outputs[i + 1:])


# ============================================================================ named causes (issue 22)
def _k_of(w, mask):
    return _allowed(w, mask).to(torch.float64)


@pytest.mark.parametrize("fn,phrases", [
    (lambda w, mask=None: torch.where(_k_of(w, mask) > 1, _h(w) * _k_of(w, mask).clamp(min=2).log(), 0.0),
     ["entropy divided by the wrong number", "0.5581 = 1/log k instead of log 6 = 1.792"]),
    (lambda w, mask=None: torch.where(_k_of(w, mask) > 1, _h(w) / _k_of(w, mask).clamp(min=2).exp(), 0.0),
     ["= e^k instead of log 6"]),
    (lambda w, mask=None: torch.where(_k_of(w, mask) > 1, _h(w) / _k_of(w, mask).clamp(min=3).log(), 0.0),
     ["1.099 = log 3 instead of log 2"]),
    (lambda w, mask=None: torch.where(_k_of(w, mask) > 2, _h(w) / _k_of(w, mask).clamp(min=2).log(), 0.0),
     ["∞", "(your value is 0) instead of log 2"]),
    (lambda w, mask=None: torch.where(_h(w) > 1, _h(w) / _h(w).clamp(min=2).log(), 0.0),
     ["your value is 0 at index (3,)", "only when its weights are one-hot"]),
    (lambda w, mask=None: torch.where(w.dtype > 1, _h(w), 0.0), ["raised TypeError", "a comparison (>) between values of "
                                                                  "types torch.dtype and int"]),
    (lambda w, mask=None: _h(w) / _k_of(w, mask).clamp().log(), ["clamp() was called with neither min nor max"]),
])
def test_entropy_names_measured_causes(fn, phrases, rejects):
    rejects(check_normalised_entropy, fn, *phrases)


@pytest.mark.parametrize("check,fn,phrases", [
    (check_self_attention_weight, lambda w: w.diagonal(dim1=-1, dim2=-1),
     ["diagonal() was given one axis twice", "dim1 = -1 and dim2 = -1"]),
    (check_self_attention_weight, lambda w: w.diagonal(dim1=-2, dim2=0), ["dim1 = -2 and dim2 = 0 are the same axis"]),
    (check_attention_distance, lambda w: (w * (_idx(w, -1)[None, :] + _idx(w, -2)[:, None]).abs()).sum(-1),
     ["positions added, not subtracted", "|j + i|"]),
    (check_attention_distance, lambda w: (w * _idx(w, -2)[:, None]).sum(-1), ["each query's own position"]),
    (check_attention_distance, lambda w: _signed(w).abs().sum(-1), ["distances not weighted", "summed |j − i|"]),
])
def test_other_metrics_name_measured_causes(check, fn, phrases, rejects):
    rejects(check, fn, *phrases)


# ============================================================================ branches the tests above leave out
def entropy_if_mask(weights, mask=None):
    h = -torch.special.xlogy(weights, weights).sum(-1)
    k = torch.full(h.shape, weights.shape[-1], dtype=weights.dtype)
    if mask:  # `is not None` meant
        k = torch.broadcast_to(mask, weights.shape).sum(-1).to(weights.dtype)
    return torch.where(k > 1, h / torch.log(k.clamp(min=2)), torch.zeros_like(h))


def entropy_one_key_as_uniform(weights, mask=None):
    h = -torch.special.xlogy(weights, weights).sum(-1)
    k = (torch.ones_like(weights, dtype=torch.bool) if mask is None else torch.broadcast_to(mask, weights.shape)).sum(-1)
    return torch.where(k > 1, h / torch.log(k.clamp(min=2).to(h.dtype)), torch.ones_like(h))  # "one key: uniform"


@pytest.mark.parametrize("fn,phrases", [
    (entropy_if_mask, ["raised RuntimeError", "Boolean value of Tensor", "if mask is not None:"]),
    (entropy_one_key_as_uniform, ["wrong values", "1 of 6 entries differ", "at index (0,): got 1, expected 0"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_entropy_truth_value_of_a_mask_and_rows_with_one_key(fn, phrases, rejects):
    result = rejects(check_normalised_entropy, fn, *phrases)
    if fn is entropy_one_key_as_uniform:  # the rows with entropy are right: no divisor is blamed
        assert "divided by" not in result.text() and "normalised by log" not in result.text()


# ============================================================================ inputs left unchanged
def entropy_zeros_patched_in_place(weights, mask=None):  # log(0) avoided by overwriting the zeros of weights
    weights[weights == 0] = 1e-45
    h = -(weights * weights.log()).sum(-1)
    k = _allowed(weights, mask).to(h.dtype)
    return torch.where(k > 1, h / k.clamp(min=2).log(), torch.zeros_like(h))


def peak_rest_zeroed_in_place(weights):  # every weight below its row's largest set to 0, in weights itself
    weights[weights < weights.amax(-1, keepdim=True)] = 0
    return weights.amax(-1)


def self_eye_multiplied_in_place(weights):
    weights *= torch.eye(weights.shape[-1], dtype=weights.dtype)
    return weights.sum(-1)


def distance_multiplied_in_place(weights):
    weights *= (torch.arange(weights.shape[-1])[None, :] - torch.arange(weights.shape[-2])[:, None]).abs()
    return weights.sum(-1)


def effective_zeros_set_to_one_in_place(weights):  # 1·log 1 = 0 stands in for 0·log 0, written into weights
    weights[weights == 0] = 1.0
    return torch.exp(-(weights * weights.log()).sum(-1))


@pytest.mark.parametrize("check,fn", [
    (check_normalised_entropy, entropy_zeros_patched_in_place),
    (check_peak_weight, peak_rest_zeroed_in_place),
    (check_self_attention_weight, self_eye_multiplied_in_place),
    (check_attention_distance, distance_multiplied_in_place),
    (check_effective_positions, effective_zeros_set_to_one_in_place),
], ids=lambda v: getattr(v, "__name__", ""))
def test_an_answer_that_overwrites_the_weights_is_rejected(check, fn, rejects):
    """Each docstring leaves the weights unchanged: right values computed by overwriting them are rejected."""
    text = rejects(check, fn, "changed in place", "weights changed in place").text()
    assert "causal weights (6, 6) in float32" in text, text


# ============================================================================ audit: causes named
def peak_row_by_row(weights):  # `for row in weights` visits rows of one matrix, whole matrices of a batch
    return torch.tensor([max(row) for row in weights.tolist()])


def self_weight_by_index(weights):  # weights[i, i] indexes the first two axes
    return torch.stack([weights[i, i] for i in range(weights.shape[0])])


def entropy_one_for_single_keys(weights, mask=None):  # rows with at most one allowed key given 1, not 0
    h = -torch.special.xlogy(weights, weights).sum(-1)
    k = _allowed(weights, mask).to(h.dtype)
    return torch.where(k > 1, h / k.clamp(min=2).log(), 1.0)


def entropy_in_half(weights, mask=None):  # the entropy summed in float16: right to about 3 digits only
    w = weights.half()
    h = -torch.special.xlogy(w, w).sum(-1).to(weights.dtype)
    k = _allowed(weights, mask).to(h.dtype)
    return torch.where(k > 1, h / k.clamp(min=2).log(), 0.0)


@pytest.mark.parametrize("check,fn,phrases", [
    (check_peak_weight, peak_row_by_row, ["wrong shape (2, 5, 5)", "treats the first axis as the queries"]),
    (check_self_attention_weight, self_weight_by_index, ["wrong shape (2, 5, 5)", "right values on single matrices"]),
    (check_self_attention_weight, lambda w: w.flip(-2).diagonal(dim1=-2, dim2=-1),
     ["anti-diagonal", "w[n − 1 − i, i]"]),
    (check_normalised_entropy, entropy_one_for_single_keys, ["wrong values", "your value is 1 on the rows with at "
                                                             "most one allowed key", "where the docstring gives 0"]),
    (check_normalised_entropy, entropy_in_half, ["gives 1.0003, not 1"]),
], ids=lambda v: getattr(v, "__name__", None) if callable(v) else None)
def test_audit_named_causes(check, fn, phrases, rejects):
    rejects(check, fn, *phrases)


# ============================================================================ round 3: more queries than keys, far apart
def _distance_positions_from_the_keys(weights):
    """Query positions taken from arange(n_k): right while n_q ≤ n_k, not beyond."""
    n_q, n_k = weights.shape[-2:]
    if n_q > n_k:
        return weights.sum(-1)
    keys = torch.arange(n_k)
    return (weights * (keys[None, :] - keys[:n_q, None]).abs()).sum(-1)


@pytest.mark.parametrize("fn", [_distance_positions_from_the_keys,
                                lambda w: ref.attention_distance(w).clamp(max=10.0)])
def test_distance_probes_more_queries_than_keys_far_apart(fn, rejects):
    rejects(check_attention_distance, fn, "more queries than keys (40, 24)")


def _entropy_row_by_row(weights, mask=None):
    rows = weights.reshape(-1, weights.shape[-1]).tolist()
    allowed = None if mask is None else torch.broadcast_to(mask, weights.shape).reshape(len(rows), -1).tolist()
    out = []
    for r, row in enumerate(rows):
        count = len(row) if allowed is None else sum(allowed[r])
        h = -sum(p * math.log(p) for p in row if p > 0)
        out.append(h / math.log(count) if count > 1 else 0.0)
    return torch.tensor(out, dtype=weights.dtype).reshape(weights.shape[:-1])


class _PeakObject:
    def __call__(self, weights, *args, **kwargs):
        return weights.mT.amax(-2)


@pytest.mark.parametrize("check,fn", [
    (check_normalised_entropy, _entropy_row_by_row),
    (check_peak_weight, _PeakObject()),
    (check_attention_distance, torch.no_grad()(lambda w: torch.tensor(
        [[sum(p * abs(j - i) for j, p in enumerate(row)) for i, row in enumerate(m)]
         for m in w.reshape(-1, *w.shape[-2:]).tolist()], dtype=w.dtype).reshape(w.shape[:-1]))),
    (check_effective_positions, lambda w: torch.where(w > 0, w ** -w, torch.ones_like(w)).prod(-1)),
])
def test_patterns_accept_slow_and_decorated_answers(check, fn, accepts):
    accepts(check, fn)


def test_a_wrong_shape_on_non_square_weights_is_not_called_a_batch(rejects):
    text = rejects(check_peak_weight, lambda w: w.amax(-2) if w.shape[-1] != w.shape[-2] else w.amax(-1),
                   "wrong shape (7,), expected (4,)").text()
    assert "batch of matrices" not in text, text
