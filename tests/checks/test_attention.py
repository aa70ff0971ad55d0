"""Checks of notebook 05 (attn_course.checks.attention): each pitfall rejected with its diagnosis,
correct alternatives accepted, and the same verdict when the grader replays the log."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attn_course.attention import attention, score_matrix_bytes
from attn_course.checks.attention import check_attention, check_score_matrix_bytes
from attn_course.checks.result import Status

def scaled_scores(Q, K):
    return Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])


# correct alternatives ----------------------------------------------------------
def attn_matmul(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, dim=-1)
    return w @ V, w


def attn_einsum_where_1e9(Q, K, V, mask=None):
    s = torch.einsum("...qd,...kd->...qk", Q, K) / Q.shape[-1] ** 0.5
    if mask is not None:
        s = torch.where(mask, s, torch.tensor(-1e9, dtype=s.dtype))
    w = s.softmax(-1)
    return torch.einsum("...qk,...kv->...qv", w, V), w


def attn_finfo_before_scale(Q, K, V, mask=None):
    s = Q @ K.mT
    if mask is not None:
        s = s.masked_fill(mask.logical_not(), torch.finfo(s.dtype).min)
    w = torch.softmax(s / math.sqrt(K.shape[-1]), -1)
    return (w @ V), w


def attn_additive_list_return(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s + torch.zeros_like(s).masked_fill(~mask, float("-inf"))
    w = F.softmax(s, dim=-1)
    return [w @ V, w]


def attn_numpy_result(Q, K, V, mask=None):
    out, w = attn_matmul(Q, K, V, mask)
    return out.numpy(), w.numpy()


def attn_manual_stable_softmax(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    e = torch.exp(s - s.max(dim=-1, keepdim=True).values)
    w = e / e.sum(dim=-1, keepdim=True)
    return w @ V, w


def attn_softmax_then_renormalise(Q, K, V, mask=None):
    w = torch.softmax(scaled_scores(Q, K), -1)
    if mask is not None:
        w = w * mask
        w = w / w.sum(-1, keepdim=True)
    return w @ V, w


@pytest.mark.parametrize("fn", [attn_matmul, attn_einsum_where_1e9, attn_finfo_before_scale, attn_additive_list_return,
                                attn_numpy_result, attn_manual_stable_softmax, attention])
def test_check_attention_accepts_correct_alternatives(fn, accepts):
    accepts(check_attention, fn)


# pitfalls ------------------------------------------------------------------------
def attn_softmax_dim_minus2(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, dim=-2)
    return w @ V, w


def attn_softmax_dim1(Q, K, V, mask=None):  # right for 2-D input only
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, dim=1)
    return w @ V, w


def attn_no_scale(Q, K, V, mask=None):
    s = Q @ K.transpose(-2, -1)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_divide_by_dk(Q, K, V, mask=None):
    s = Q @ K.transpose(-2, -1) / Q.shape[-1]
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_scale_by_dv(Q, K, V, mask=None):
    s = Q @ K.transpose(-2, -1) / math.sqrt(V.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_mask_after_softmax(Q, K, V, mask=None):
    w = torch.softmax(scaled_scores(Q, K), -1)
    if mask is not None:
        w = w.masked_fill(~mask, 0.0)
    return w @ V, w


def attn_polarity_inverted(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))  # nn.MultiheadAttention's convention
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_weak_fill(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s.masked_fill(~mask, -1e4)
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_weak_additive(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s + (~mask) * -10000.0
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_values_before_softmax(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, -1)
    return torch.softmax(scaled_scores(Q, K) @ V, -1), w


def attn_mask_ignored(Q, K, V, mask=None):
    w = torch.softmax(scaled_scores(Q, K), -1)
    return w @ V, w


def attn_K_dot_T(Q, K, V, mask=None):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = Q @ K.T / math.sqrt(Q.shape[-1])
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_weights_transposed(Q, K, V, mask=None):
    out, w = attn_matmul(Q, K, V, mask)
    return out, w.transpose(-2, -1)


def attn_bool_added(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s + mask
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_scale_by_seq_len(Q, K, V, mask=None):
    s = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-2])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_naive_softmax(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    e = torch.exp(s)
    w = e / e.sum(-1, keepdim=True)
    return w @ V, w


@pytest.mark.parametrize("fn,phrases", [
    (attn_softmax_dim_minus2, ["softmax over axis -2", "dim=-1"]),
    (attn_softmax_dim1, ["softmax over axis", "dim=-1"]),
    (attn_no_scale, ["scores not scaled", "√d_k"]),
    (attn_divide_by_dk, ["divided by d_k instead of √d_k"]),
    (attn_scale_by_dv, ["√d_v"]),
    (attn_mask_after_softmax, ["mask applied after the softmax"]),
    (attn_polarity_inverted, ["mask polarity inverted"]),
    (attn_weak_fill, ["fill value too weak"]),
    (attn_weak_additive, ["fill value too weak"]),
    (attn_values_before_softmax, ["V multiplied before the softmax"]),
    (attn_mask_ignored, ["mask ignored"]),
    (attn_K_dot_T, ["K.transpose(-2, -1)"]),
    (attn_naive_softmax, ["NaN", "maximum"]),
    (attn_weights_transposed, ["weights transposed"]),
    (attn_bool_added, ["bool mask added"]),
    (attn_scale_by_seq_len, ["√n_q"]),
    # renormalising after a masked softmax is right on paper but 0/0 once the blocked scores dominate:
    (attn_softmax_then_renormalise, ["NaN", "before the softmax"]),
])
def test_check_attention_names_each_pitfall(fn, phrases, rejects):
    rejects(check_attention, fn, *phrases)


def test_check_attention_not_attempted(rejects, unfinished):
    rejects(check_attention, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    assert check_attention.evaluate(namespace={}).status is Status.NOT_ATTEMPTED


def test_check_attention_bad_types_and_shapes(rejects):
    rejects(check_attention, 42, "not a function")
    rejects(check_attention, lambda Q, K, V, mask=None: attn_matmul(Q, K, V, mask)[0], "one tensor", "(output, weights)")
    rejects(check_attention, lambda Q, K, V, mask=None: attn_matmul(Q, K, V, mask)[0].tolist(), "(output, weights)")
    rejects(check_attention, lambda Q, K, V, mask=None: [x.tolist() for x in attn_matmul(Q, K, V, mask)], "Python list")
    rejects(check_attention, lambda Q, K, V, mask=None: attn_matmul(Q, K, V, mask)[::-1], "swapped")
    rejects(check_attention, lambda Q, K, V, mask=None: (attn_matmul(Q, K, V, mask)[0][..., :2], attn_matmul(Q, K, V, mask)[1]),
            "the output of shape")
    rejects(check_attention, lambda Q, K, V, mask=None: (attn_matmul(Q, K, V, mask)[0], attn_matmul(Q, K, V, mask)[1][..., 1:]),
            "the weights of shape")
    rejects(check_attention, lambda Q, K, V, mask=None: tuple(x * float("nan") for x in attn_matmul(Q, K, V, mask)), "NaN")
    rejects(check_attention, lambda Q, K, V, mask=None: 1 / 0, "ZeroDivisionError")


# ----------------------------------------------------------------------------- check_score_matrix_bytes
def bytes_ok(n, batch=1, heads=1, dtype=torch.float32):
    return batch * heads * n * n * torch.empty((), dtype=dtype).element_size()


@pytest.mark.parametrize("fn", [
    bytes_ok,
    score_matrix_bytes,
    lambda n, batch=1, heads=1, dtype=torch.float32: float(bytes_ok(n, batch, heads, dtype)),  # an integral float
    lambda n, batch=1, heads=1, dtype=torch.float32: np.int64(bytes_ok(n, batch, heads, dtype)),
    lambda n, batch=1, heads=1, dtype=torch.float32: torch.tensor(bytes_ok(n, batch, heads, dtype)),
    lambda n, batch=1, heads=1, dtype=torch.float32: torch.zeros(batch, heads, n, n, dtype=dtype, device="meta").nbytes,
    lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n**2 * (torch.finfo(dtype).bits // 8),
])
def test_check_score_matrix_bytes_accepts(fn, accepts):
    accepts(check_score_matrix_bytes, fn)


@pytest.mark.parametrize("fn,phrase", [
    (lambda n, batch=1, heads=1, dtype=torch.float32: 8 * bytes_ok(n, batch, heads, dtype), "bits, not bytes"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: heads * n * n * torch.empty((), dtype=dtype).element_size(), "batch size missing"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * n * n * torch.empty((), dtype=dtype).element_size(), "number of heads missing"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n * torch.empty((), dtype=dtype).element_size(), "square n"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n * n * 4, "4 bytes per entry assumed"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n * n, "entries, not bytes"),
])
def test_check_score_matrix_bytes_names_pitfalls(fn, phrase, rejects):
    rejects(check_score_matrix_bytes, fn, phrase)


def test_check_score_matrix_bytes_not_attempted_and_bad_values(rejects, unfinished):
    rejects(check_score_matrix_bytes, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    rejects(check_score_matrix_bytes, "64", "not a function")
    rejects(check_score_matrix_bytes, lambda n, batch=1, heads=1, dtype=None: [n * n], "Python list")
    rejects(check_score_matrix_bytes, lambda n, batch=1, heads=1, dtype=None: torch.ones(2), "one number")
    rejects(check_score_matrix_bytes, lambda n, batch=1, heads=1, dtype=None: float("nan"), "nan")
    rejects(check_score_matrix_bytes, lambda n: n, "raised TypeError")
