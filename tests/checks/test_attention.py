"""Checks of notebook 05 (attn_course.checks.attention): each wrong answer rejected with its diagnosis,
correct alternatives accepted, and the same verdict when the grader replays the log.

The wrong answers are written the way learners write them (classic mistakes and unforeseen ones),
not generated from the check's own list of mistakes.
"""

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


def masked(s, mask, fill=float("-inf")):
    return s if mask is None else s.masked_fill(~mask, fill)


def _std(scores_fn=scaled_scores, softmax=lambda s: torch.softmax(s, -1), fill=float("-inf")):
    """Attention built from parts, so that one part at a time can be wrong."""
    def fn(Q, K, V, mask=None):
        w = softmax(masked(scores_fn(Q, K), mask, fill))
        return w @ V, w
    return fn


# ============================================================================ correct alternatives
def attn_matmul(Q, K, V, mask=None):
    w = torch.softmax(masked(scaled_scores(Q, K), mask), dim=-1)
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
    s = masked(scaled_scores(Q, K), mask)
    e = torch.exp(s - s.max(dim=-1, keepdim=True).values)
    w = e / e.sum(dim=-1, keepdim=True)
    return w @ V, w


def attn_annotated_transformer(query, key, value, mask=None, dropout=None):
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn


def attn_nanogpt_style(Q, K, V, mask=None):
    att = (Q @ K.transpose(-2, -1)) * (1.0 / math.sqrt(K.size(-1)))
    if mask is not None:
        att = att.masked_fill(mask == 0, float("-inf"))
    att = F.softmax(att, dim=-1)
    return att @ V, att


def attn_sdpa_plus_weights(Q, K, V, mask=None):
    out = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask)
    w = torch.softmax(masked(scaled_scores(Q, K), mask), -1)
    return out, w


def attn_scale_q_first(Q, K, V, mask=None):
    s = (Q / math.sqrt(Q.shape[-1])) @ K.swapaxes(-1, -2)
    w = torch.softmax(masked(s, mask), -1)
    return torch.matmul(w, V), w


def attn_quarter_root_each(Q, K, V, mask=None):
    c = Q.shape[-1] ** -0.25
    s = (Q * c) @ (K * c).transpose(-1, -2)
    w = masked(s, mask).softmax(dim=-1)
    return w @ V, w


def attn_log_softmax_exp(Q, K, V, mask=None):
    w = torch.log_softmax(masked(scaled_scores(Q, K), mask), -1).exp()
    return w @ V, w


def attn_logsumexp(Q, K, V, mask=None):
    s = masked(scaled_scores(Q, K), mask)
    w = torch.exp(s - torch.logsumexp(s, -1, keepdim=True))
    return w @ V, w


def attn_float64_inside(Q, K, V, mask=None):
    out, w = attn_matmul(Q.double(), K.double(), V.double(), mask)
    return out, w


def attn_where_inf_tensor(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = torch.where(mask, s, torch.full_like(s, float("-inf")))
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_bool_cast_mask(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s.masked_fill(~mask.bool(), float("-inf"))
    w = s.softmax(-1)
    return w @ V, w


def attn_additive_minus_1e9(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s + (1.0 - mask.to(s.dtype)) * -1e9
    w = s.softmax(-1)
    return w @ V, w


def attn_tuple_with_baddbmm_free_matmul(Q, K, V, mask=None):
    d = Q.shape[-1]
    s = torch.matmul(Q, torch.transpose(K, -1, -2)).div(math.sqrt(d))
    if mask is not None:
        s = s.masked_fill(torch.logical_not(mask), -math.inf)
    w = torch.nn.functional.softmax(s, dim=-1)
    return (torch.matmul(w, V), w)


@pytest.mark.parametrize("fn", [
    attention, attn_matmul, attn_einsum_where_1e9, attn_finfo_before_scale, attn_additive_list_return,
    attn_manual_stable_softmax, attn_annotated_transformer, attn_nanogpt_style,
    attn_sdpa_plus_weights, attn_scale_q_first, attn_quarter_root_each, attn_log_softmax_exp, attn_logsumexp,
    attn_float64_inside, attn_where_inf_tensor, attn_bool_cast_mask, attn_additive_minus_1e9,
    attn_tuple_with_baddbmm_free_matmul, _std(fill=-1e5),  # -1e5 blocks as well as -inf at the check's ±3·10⁴
])
def test_check_attention_accepts_correct_alternatives(fn, accepts):
    accepts(check_attention, fn)


# ============================================================================ wrong answers
def attn_renormalise_after(Q, K, V, mask=None):
    w = torch.softmax(scaled_scores(Q, K), -1)
    if mask is not None:
        w = w * mask
        w = w / w.sum(-1, keepdim=True)
    return w @ V, w


def attn_mask_after_zero(Q, K, V, mask=None):
    w = torch.softmax(scaled_scores(Q, K), -1)
    if mask is not None:
        w = w.masked_fill(~mask, 0.0)
    return w @ V, w


def attn_polarity(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))  # nn.MultiheadAttention's convention
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_weak_additive(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s + (~mask) * -10000.0
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_values_before_softmax(Q, K, V, mask=None):
    w = torch.softmax(masked(scaled_scores(Q, K), mask), -1)
    return torch.softmax(scaled_scores(Q, K) @ V, -1), w


def attn_mask_ignored(Q, K, V, mask=None):
    w = torch.softmax(scaled_scores(Q, K), -1)
    return w @ V, w


def attn_K_dot_T(Q, K, V, mask=None):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = Q @ K.T / math.sqrt(Q.shape[-1])
    w = torch.softmax(masked(s, mask), -1)
    return w @ V, w


def attn_K_t(Q, K, V, mask=None):
    w = torch.softmax(masked(Q @ K.t() / math.sqrt(Q.shape[-1]), mask), -1)
    return w @ V, w


def attn_mm(Q, K, V, mask=None):
    w = torch.softmax(masked(torch.mm(Q, K.transpose(-2, -1)) / math.sqrt(Q.shape[-1]), mask), -1)
    return torch.mm(w, V), w


def attn_bmm(Q, K, V, mask=None):
    w = torch.softmax(masked(torch.bmm(Q, K.transpose(-2, -1)) / math.sqrt(Q.shape[-1]), mask), -1)
    return torch.bmm(w, V), w


def attn_transpose12(Q, K, V, mask=None):
    w = torch.softmax(masked(Q @ K.transpose(1, 2) / math.sqrt(Q.shape[-1]), mask), -1)
    return w @ V, w


def attn_transpose01(Q, K, V, mask=None):
    w = torch.softmax(masked(Q @ K.transpose(0, 1) / math.sqrt(Q.shape[-1]), mask), -1)
    return w @ V, w


def attn_no_mask_parameter(Q, K, V):
    w = torch.softmax(scaled_scores(Q, K), -1)
    return w @ V, w


def attn_if_mask(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_boolean_index(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s[~mask] = float("-inf")
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_mask_times_scores(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s * mask
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_blocked_filled_with_zero(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = torch.where(mask, s, 0.0)
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_nan_additive(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s + (~mask).float() * float("-inf")
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_scores_as_weights(Q, K, V, mask=None):
    s = masked(scaled_scores(Q, K), mask)
    return torch.softmax(s, -1) @ V, s


def attn_output_unmasked(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    w = torch.softmax(masked(s, mask), -1)
    return torch.softmax(s, -1) @ V, w


def attn_output_from_K(Q, K, V, mask=None):
    w = torch.softmax(masked(scaled_scores(Q, K), mask), -1)
    return w @ K, w


def attn_half(Q, K, V, mask=None):
    out, w = attn_matmul(Q, K, V, mask)
    return out.half(), w.half()


def attn_temperature_two(Q, K, V, mask=None):
    w = torch.softmax(masked(scaled_scores(Q, K) / 2, mask), -1)
    return w @ V, w


def attn_squeeze(Q, K, V, mask=None):
    w = torch.softmax(masked(scaled_scores(Q, K), mask), -1).squeeze()
    return (w @ V.squeeze(0).squeeze(0)), w


def attn_scale_after_softmax(Q, K, V, mask=None):
    w = torch.softmax(masked(Q @ K.transpose(-2, -1), mask), -1) / math.sqrt(Q.shape[-1])
    return w @ V, w


def attn_max_without_keepdim(Q, K, V, mask=None):
    s = masked(scaled_scores(Q, K), mask)
    e = torch.exp(s - s.max(-1).values)
    w = e / e.sum(-1, keepdim=True)
    return w @ V, w


def attn_sum_without_keepdim(Q, K, V, mask=None):
    s = masked(scaled_scores(Q, K), mask)
    e = torch.exp(s - s.amax(-1, keepdim=True))
    w = e / e.sum(-1)
    return w @ V, w


def attn_sum_all(Q, K, V, mask=None):
    e = torch.exp(masked(scaled_scores(Q, K), mask))
    w = e / e.sum()
    return w @ V, w


def attn_global_max(Q, K, V, mask=None):
    s = masked(scaled_scores(Q, K), mask)
    e = torch.exp(s - s.max())
    w = e / e.sum(-1, keepdim=True)
    return w @ V, w


def attn_dk_from_axis1(Q, K, V, mask=None):
    w = torch.softmax(masked(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[1]), mask), -1)
    return w @ V, w


def attn_dk_from_len(Q, K, V, mask=None):
    w = torch.softmax(masked(Q @ K.transpose(-2, -1) / math.sqrt(len(K)), mask), -1)
    return w @ V, w


def attn_weights_times_V_T(Q, K, V, mask=None):
    w = torch.softmax(masked(scaled_scores(Q, K), mask), -1)
    return w @ V.transpose(-2, -1), w


def attn_returns_output_only(Q, K, V, mask=None):
    return attn_matmul(Q, K, V, mask)[0]


def attn_dropout_train(Q, K, V, mask=None):
    w = F.dropout(torch.softmax(masked(scaled_scores(Q, K), mask), -1), p=0.5, training=True)
    return w @ V, w


def attn_mask_on_raw_then_weak(Q, K, V, mask=None):
    s = Q @ K.transpose(-2, -1)
    if mask is not None:
        s = s.masked_fill(~mask, -1e4)
    w = torch.softmax(s / math.sqrt(Q.shape[-1]), -1)
    return w @ V, w


WRONG = [
    (_std(softmax=lambda s: torch.softmax(s, -2)), ["softmax over axis -2", "dim=-1"]),
    (_std(softmax=lambda s: torch.softmax(s, 1)), ["softmax over axis -2", "dim=-1"]),
    (_std(softmax=lambda s: torch.softmax(s, 0)), ["softmax over axis -2", "dim=-1"]),
    (_std(scores_fn=lambda Q, K: Q @ K.transpose(-2, -1)), ["scores not scaled", "√d_k"]),
    (_std(scores_fn=lambda Q, K: Q @ K.transpose(-2, -1) / Q.shape[-1]), ["divided by d_k instead of √d_k"]),
    (_std(scores_fn=lambda Q, K: Q @ K.transpose(-2, -1) * math.sqrt(Q.shape[-1])), ["multiplied by √d_k"]),
    (_std(scores_fn=lambda Q, K: Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-2])), ["√n_q"]),
    (attn_dk_from_axis1, ["√Q.shape[1]", "counted from the front", "Q.shape[-1]"]),
    (attn_dk_from_len, ["√Q.shape[0]", "len(K)"]),
    (attn_mask_after_zero, ["mask applied after the softmax"]),
    (attn_renormalise_after, ["then renormalised", "0/0"]),
    (attn_polarity, ["mask polarity inverted"]),
    (_std(fill=-1e4), ["fill value too weak"]),
    (_std(fill=-100.0), ["fill value too weak"]),
    (attn_weak_additive, ["fill value too weak"]),
    (attn_mask_on_raw_then_weak, ["fill value too weak"]),
    (attn_values_before_softmax, ["V multiplied before the softmax"]),
    (attn_mask_ignored, ["mask ignored"]),
    (attn_K_dot_T, ["K.T reverses every axis", "K.transpose(-2, -1)"]),
    (attn_K_t, ["K.t() works on 2-D matrices only"]),
    (attn_mm, ["torch.mm multiplies 2-D matrices only"]),
    (attn_bmm, ["torch.bmm needs exactly 3-D tensors"]),
    (attn_transpose12, ["K.transpose(1, 2) counts axes from the front", "K.transpose(-2, -1)"]),
    (attn_transpose01, ["K.transpose(0, 1)"]),
    (attn_no_mask_parameter, ["does not take the mask"]),
    (attn_if_mask, ["if mask:"]),
    (attn_boolean_index, ["does not broadcast", "masked_fill"]),
    (attn_mask_times_scores, ["mask multiplied into the scores"]),
    (attn_blocked_filled_with_zero, ["mask multiplied into the scores", "filled with 0"]),
    (attn_nan_additive, ["0 × (-inf) = NaN"]),
    (attn_scores_as_weights, ["scores returned as weights"]),
    (attn_output_unmasked, ["output from the unmasked weights"]),
    (attn_output_from_K, ["output from K instead of V"]),
    (attn_weights_times_V_T, ["instead of V"]),
    (attn_half, ["float16"]),
    (attn_temperature_two, ["divided by 5.657 instead of √d_k = 2.828"]),
    (attn_squeeze, ["size-1 axes dropped", "squeeze"]),
    (attn_scale_after_softmax, ["scaled after the softmax"]),
    (attn_max_without_keepdim, ["without keepdim"]),
    (attn_sum_without_keepdim, ["without keepdim"]),
    (attn_sum_all, ["normalised by the sum of every entry"]),
    (attn_global_max, ["maximum over the whole tensor"]),
    (_std(softmax=lambda s: torch.exp(s) / torch.exp(s).sum(-1, keepdim=True)), ["softmax without subtracting the maximum"]),
    (lambda Q, K, V, mask=None: attn_matmul(Q, K, V, mask)[::-1], ["output and weights swapped"]),
    (lambda Q, K, V, mask=None: (attn_matmul(Q, K, V, mask)[0], attn_matmul(Q, K, V, mask)[1].transpose(-2, -1)),
     ["weights transposed"]),
    (lambda Q, K, V, mask=None: attn_matmul(Q, K, V, None if mask is None else mask.bool() | True), ["mask ignored"]),
    (attn_returns_output_only, ["one tensor", "(output, weights)"]),
    (_std(softmax=lambda s: torch.log_softmax(s, -1)), ["log-softmax instead of softmax"]),
    (lambda Q, K, V, mask=None: (V, attn_matmul(Q, K, V, mask)[1]), ["V returned as the output"]),
    (attn_dropout_train, ["dropout", "training"]),
    (lambda Q, K, V, mask=None: tuple(t * 1.5 for t in attn_matmul(Q, K, V, mask)), ["every row sums to 1.5"]),
]


# ---------------------------------------------------------------------------- unforeseen mistakes (red team)
def attn_divides_Q_in_place(Q, K, V, mask=None):
    Q /= math.sqrt(Q.shape[-1])  # changes the caller's Q
    w = torch.softmax(masked(Q @ K.transpose(-2, -1), mask), -1)
    return w @ V, w


def attn_flips_mask_in_place(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s.masked_fill(mask.logical_not_(), float("-inf"))  # logical_not_ flips the caller's mask
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_mask_transposed(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s.masked_fill(~(mask.mT if mask.dim() >= 2 else mask), float("-inf"))
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_always_causal(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    s = s.masked_fill(~torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool).tril(), float("-inf"))
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_K_reshaped(Q, K, V, mask=None):
    s = Q @ K.reshape(*K.shape[:-2], K.shape[-1], K.shape[-2]) / math.sqrt(Q.shape[-1])
    w = torch.softmax(masked(s, mask), -1)
    return w @ V, w


def attn_mask_only_when_2d(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None and mask.dim() == 2:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_inverted_mask_added(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s + (~mask).float()  # "1 blocks"
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_blocked_raised(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s + (1.0 - mask.float()) * 1e9  # the sign of the fill is wrong
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_rounded(Q, K, V, mask=None):
    out, w = attn_matmul(Q, K, V, mask)
    return out, w.round(decimals=3)


d_k = 8  # a notebook variable, as the worked example's cell defines


def attn_global_dk(Q, K, V, mask=None):
    w = torch.softmax(masked(Q @ K.transpose(-2, -1) / math.sqrt(d_k), mask), -1)
    return w @ V, w


def attn_loop_with_K_T(Q, K, V, mask=None):
    if Q.dim() == 2:
        return attn_matmul(Q, K, V, mask)
    outs, ws = [], []
    for b in range(Q.shape[0]):
        w = torch.softmax(masked(Q[b] @ K[b].T / math.sqrt(Q.shape[-1]), mask), -1)
        outs.append(w @ V[b])
        ws.append(w)
    return torch.stack(outs), torch.stack(ws)


def attn_mask_last_axis(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s.masked_fill(~mask[..., None] if mask.dim() == 1 else ~mask, float("-inf"))
    w = torch.softmax(s, -1)
    return w @ V, w


def attn_float32_inside(Q, K, V, mask=None):
    out, w = attn_matmul(Q.float(), K.float(), V.float(), mask)
    return out.to(Q.dtype), w.to(Q.dtype)  # float64 inputs lose their digits on the way


def attn_mask_unsqueezed(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s.masked_fill(~mask.unsqueeze(1), float("-inf"))  # as if every mask were (B, n_q, n_k)
    w = torch.softmax(s, -1)
    return w @ V, w


WRONG += [
    (attn_numpy_result, ["NumPy arrays, not tensors"]),
    (attn_float32_inside, ["computed in float32, not float64", "exactly representable in float32"]),
    (attn_mask_unsqueezed, ["the mask got an extra axis", "mask.unsqueeze(1)"]),
    (_std(scores_fn=lambda Q, K: -scaled_scores(Q, K)), ["divided by -2.828", "flips the scores' sign"]),
    (attn_divides_Q_in_place, ["changed Q in place", "/="]),
    (attn_flips_mask_in_place, ["changed mask in place", "logical_not_"]),
    (attn_mask_transposed, ["mask transposed"]),
    (attn_always_causal, ["causal mask although none was given"]),
    (attn_K_reshaped, ["K reshaped instead of transposed", "K.transpose(-2, -1)"]),
    (_std(softmax=torch.sigmoid), ["sigmoid instead of softmax"]),
    (attn_mask_only_when_2d, ["mask of shape (3, 1, 1, 5) ignored", "only for some shapes"]),
    (attn_inverted_mask_added, ["bool mask added to the scores"]),
    (attn_blocked_raised, ["all the weight on blocked keys", "wrong way round"]),
    (attn_rounded, ["rounded to 3 decimals"]),
    (attn_global_dk, ["divided by √8", "earlier input with d_k = 8", "worked example"]),
    (attn_loop_with_K_T, ["K.T reverses every axis"]),
    (attn_mask_last_axis, ["added an axis at the end of the mask"]),
]


def attn_without_Q(Q, K, V, mask=None):
    w = torch.softmax(masked(K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), mask), -1)  # Q forgotten
    return w @ V, w


def attn_negates_none(Q, K, V, mask=None):
    keep = None  # meant to hold the mask
    s = scaled_scores(Q, K)
    if mask is not None:
        s = s.masked_fill(~keep, float("-inf"))
    w = torch.softmax(s, -1)
    return w @ V, w


WRONG += [  # named causes added with the check kit (issue 22)
    (attn_without_Q, ["Q left out of the scores", "Q is missing"]),
    (attn_negates_none, ["raised TypeError", "you applied ~ to None"]),
    (lambda Q, K, V, mask=None: (attn_matmul(Q, K, V, mask)[1],) * 2, ["weights returned as the output"]),
]


@pytest.mark.parametrize("fn,phrases", WRONG, ids=[f"{i}" for i in range(len(WRONG))])
def test_check_attention_names_each_wrong_answer(fn, phrases, rejects):
    rejects(check_attention, fn, *phrases)


def test_the_bool_mask_added_to_scores_is_named(rejects):
    def fn(Q, K, V, mask=None):
        s = scaled_scores(Q, K)
        if mask is not None:
            s = s + mask
        w = torch.softmax(s, -1)
        return w @ V, w

    rejects(check_attention, fn, "bool mask added")


def test_no_fixed_hint_on_unrelated_batched_errors(rejects):
    """A batched failure that no known construct reproduces gets the learner's line, not a guessed cause."""
    def fn(Q, K, V, mask=None):
        if Q.dim() > 2:
            raise ValueError("my own check failed")
        return attn_matmul(Q, K, V, mask)

    result = rejects(check_attention, fn, "ValueError", "my own check failed")
    assert "transpose" not in result.text() and not result.diagnosis.cause


def test_check_attention_not_attempted(rejects, unfinished):
    rejects(check_attention, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    assert check_attention.evaluate(namespace={}).status is Status.NOT_ATTEMPTED


def test_check_attention_bad_types_and_shapes(rejects):
    rejects(check_attention, 42, "not a function")
    rejects(check_attention, lambda Q, K, V, mask=None: attn_matmul(Q, K, V, mask)[0].tolist(), "(output, weights)")
    rejects(check_attention, lambda Q, K, V, mask=None: [x.tolist() for x in attn_matmul(Q, K, V, mask)], "Python list")
    rejects(check_attention, lambda Q, K, V, mask=None: (attn_matmul(Q, K, V, mask)[0][..., :2], attn_matmul(Q, K, V, mask)[1]),
            "the output of shape")
    rejects(check_attention, lambda Q, K, V, mask=None: (attn_matmul(Q, K, V, mask)[0], attn_matmul(Q, K, V, mask)[1][..., 1:]),
            "the weights of shape")
    rejects(check_attention, lambda Q, K, V, mask=None: tuple(x * float("nan") for x in attn_matmul(Q, K, V, mask)), "NaN")
    rejects(check_attention, lambda Q, K, V, mask=None: 1 / 0, "ZeroDivisionError")
    rejects(check_attention, lambda Q, K, V, mask=None: (torch.empty(4, 8, device="meta"), torch.empty(4, 4, device="meta")),
            "meta")


def test_every_mask_shape_and_size_one_axis_is_tried():
    """The check's own inputs cover what its docstring promises: masks of several shapes, n_q ≠ n_k, size-1 axes."""
    from attn_course.checks.attention.cases import attention_cases

    cases = attention_cases()
    mask_shapes = {tuple(c.mask.shape) for c in cases if c.mask is not None}
    assert len({len(s) for s in mask_shapes}) >= 3 and any(len(s) == 1 for s in mask_shapes)
    assert any(c.Q.shape[-2] != c.K.shape[-2] for c in cases)
    assert any(c.Q.shape[-2] == 1 and c.V.shape[-1] == 1 for c in cases) and any(c.K.shape[-2] == 1 for c in cases)
    assert {c.Q.dtype for c in cases} == {torch.float32, torch.float64}
    for c in cases:  # the docstring's precondition: every query may attend to at least one key
        if c.mask is not None:
            assert torch.broadcast_to(c.mask, c.scaled.shape).any(-1).all(), c.name


# ============================================================================ check_score_matrix_bytes
def bytes_ok(n, batch=1, heads=1, dtype=torch.float32):
    return batch * heads * n * n * torch.empty((), dtype=dtype).element_size()


@pytest.mark.parametrize("fn", [
    bytes_ok,
    score_matrix_bytes,
    lambda n, batch=1, heads=1, dtype=torch.float32: np.int64(bytes_ok(n, batch, heads, dtype)),
    lambda n, batch=1, heads=1, dtype=torch.float32: torch.tensor(bytes_ok(n, batch, heads, dtype)).item(),
    lambda n, batch=1, heads=1, dtype=torch.float32: torch.zeros(batch, heads, n, n, dtype=dtype, device="meta").nbytes,
    lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n**2 * (torch.finfo(dtype).bits // 8),
    lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n * n * dtype.itemsize,
])
def test_check_score_matrix_bytes_accepts(fn, accepts):
    accepts(check_score_matrix_bytes, fn)


def _element(dtype):
    return torch.empty((), dtype=dtype).element_size()


@pytest.mark.parametrize("fn,phrase", [
    (lambda n, batch=1, heads=1, dtype=torch.float32: 8 * bytes_ok(n, batch, heads, dtype), "bits, not bytes"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n * n * torch.finfo(dtype).bits, "bits, not bytes"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: heads * n * n * _element(dtype), "batch size missing"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * n * n * _element(dtype), "number of heads missing"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n * _element(dtype), "square n"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n ** 3 * _element(dtype), "n³ instead of n²"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n * n * 4, "4 bytes per entry assumed"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n * n * 2, "2 bytes per entry assumed"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n * n, "entries, not bytes"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * batch * heads * n * n * _element(dtype), "batch counted twice"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: bytes_ok(n, batch, heads, dtype) / 1e9, "GB"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n * n / _element(dtype), "divided by the bytes"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: n * n * _element(dtype), "batch and heads missing"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: bytes_ok(n, batch, heads, dtype) / 2**30, "GiB"),
    (lambda n, batch=2, heads=1, dtype=torch.float32: bytes_ok(n, batch, heads, dtype), "wrong default"),
    (lambda n, batch=1, heads=1, dtype=torch.float16: bytes_ok(n, batch, heads, dtype), "wrong default"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: int(torch.tensor(batch, dtype=torch.int32) * heads * n * n *
                                                          _element(dtype)), "overflowed a 32-bit integer"),
])
def test_check_score_matrix_bytes_names_pitfalls(fn, phrase, rejects):
    rejects(check_score_matrix_bytes, fn, phrase)


@pytest.mark.parametrize("fn,phrases", [
    (lambda n, batch=1, heads=1, dtype=torch.float32: float(bytes_ok(n, batch, heads, dtype)), ["a float, not an int"]),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * math.pow(n, 2) * _element(dtype),
     ["a float, not an int", "math.pow"]),
    (lambda n, batch=1, heads=1, dtype=torch.float32: torch.tensor(bytes_ok(n, batch, heads, dtype)),
     ["an int64 tensor, not an int", ".item()"]),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * 2 * n * _element(dtype), ["2 × n instead of n × n"]),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n * (n + 1) // 2 * _element(dtype),
     ["one triangle"]),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n * n * {torch.float16: 2, torch.float32: 4,
                                                                               torch.float64: 8}[dtype],
     ["KeyError", "no entry for torch.bfloat16"]),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n * n * (4 if dtype == torch.float32 else 2),
     ["2 bytes per float64 entry, not 8"]),
    (lambda n, batch=1, heads=1, dtype=torch.float32: 64 * bytes_ok(n, batch, heads, dtype), ["64 times too many"]),
    (lambda n, batch=1, heads=1, dtype=torch.float32: bytes_ok(n, batch, heads, dtype) // 1024, ["KiB"]),
    # half the bytes for every dtype: not "2 bytes per entry assumed" (float64 would get 4), but the factor
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n * n * torch.finfo(dtype).bits // 16,
     ["2 times too few bytes"]),
    # a wrong count on an early case is reported before an error on a later one
    (lambda n, batch=1, heads=1, dtype=torch.float32: 2 * bytes_ok(n, batch, heads, dtype) if dtype != torch.bfloat16
     else {}[dtype], ["2 times too many"]),
])
def test_check_score_matrix_bytes_measures_unforeseen_mistakes(fn, phrases, rejects):
    rejects(check_score_matrix_bytes, fn, *phrases)


def test_check_score_matrix_bytes_not_attempted_and_bad_values(rejects, unfinished):
    rejects(check_score_matrix_bytes, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    rejects(check_score_matrix_bytes, "64", "not a function")
    rejects(check_score_matrix_bytes, lambda n, batch=1, heads=1, dtype=None: [n * n], "Python list")
    rejects(check_score_matrix_bytes, lambda n, batch=1, heads=1, dtype=None: torch.ones(2), "one number")
    rejects(check_score_matrix_bytes, lambda n, batch=1, heads=1, dtype=None: float("nan"), "nan")
    rejects(check_score_matrix_bytes, lambda n: n, "raised TypeError")


# ============================================================================ measured causes (no known mistake)
def attn_batch_heads_merged(Q, K, V, mask=None):
    """Batch and heads merged for 3-D matmuls; the output reshaped back, the weights forgotten."""
    if Q.dim() == 4:
        B, H, n_q, d = Q.shape
        out, w = attn_batch_heads_merged(Q.reshape(B * H, n_q, d), K.reshape(B * H, -1, d),
                                         V.reshape(B * H, K.shape[-2], -1), mask)
        return out.reshape(B, H, n_q, -1), w
    return attn_matmul(Q, K, V, mask)


def attn_naive_with_epsilon(Q, K, V, mask=None):
    e = torch.exp(masked(scaled_scores(Q, K), mask))
    w = e / (e.sum(-1, keepdim=True) + 1e-9)  # "an epsilon, in case the sum is 0"
    return w @ V, w


def attn_renormalise_then_zero(Q, K, V, mask=None):
    w = torch.softmax(scaled_scores(Q, K), -1)
    if mask is not None:
        w = w / (w * mask).sum(-1, keepdim=True)  # renormalise over the allowed keys
        w = w.masked_fill(~mask, 0.0)
    return w @ V, w


def attn_scores_normalised_without_exp(Q, K, V, mask=None):
    s = masked(scaled_scores(Q, K), mask, 0.0)
    w = s / s.sum(-1, keepdim=True)
    return w @ V, w


def attn_fill_minus_ten(Q, K, V, mask=None):
    w = torch.softmax(masked(scaled_scores(Q, K), mask, -10.0), -1)  # "e^-10 is as good as 0"
    return w @ V, w


def attn_seeded_dropout(Q, K, V, mask=None):
    w = torch.softmax(masked(scaled_scores(Q, K), mask), -1)
    keep = torch.rand(w.shape, generator=torch.Generator().manual_seed(0)) > 0.1  # reproducible dropout, p = 0.1
    w = w * keep / 0.9
    return w @ V, w


def attn_no_denominator(Q, K, V, mask=None):
    s = masked(scaled_scores(Q, K), mask)
    w = torch.exp(s - s.amax(-1, keepdim=True))  # the division by the row sum forgotten
    return w @ V, w


def attn_top_two_keys(Q, K, V, mask=None):
    s = masked(scaled_scores(Q, K), mask)
    kth = s.topk(min(2, s.shape[-1]), -1).values[..., -1:]
    w = torch.softmax(s.masked_fill(s < kth, float("-inf")), -1)  # each query keeps its two best keys only
    return w @ V, w


def attn_shifted_by_the_minimum(Q, K, V, mask=None):
    s = scaled_scores(Q, K)
    low = s if mask is None else s.masked_fill(~mask, float("inf"))
    e = torch.exp(masked(s, mask) - low.amin(-1, keepdim=True))  # "any shift works: softmax(x - c) = softmax(x)"
    w = e / e.sum(-1, keepdim=True)
    return w @ V, w


@pytest.mark.parametrize("fn,phrases", [
    (attn_batch_heads_merged, ["wrong shape (6, 4, 6), expected (2, 3, 4, 6)", "a reshape, view, split or stack"]),
    (attn_shifted_by_the_minimum, ["NaN where exp overflowed after a shift by the minimum", "span more than 709.8",
                                   "subtract each row's maximum"]),
    (attn_naive_with_epsilon, ["NaN where exp overflowed", "an allowed score above 709.8",
                               "subtract each row's maximum"]),
    (attn_renormalise_then_zero, ["NaN where the allowed weights underflow", "took part in a softmax before"]),
    (attn_scores_normalised_without_exp, ["weights outside [0, 1]", "between 0 and 1"]),
    (attn_fill_minus_ten, ["weight on blocked keys", "fill the blocked scores with float('-inf')"]),
    (attn_seeded_dropout, ["weights randomly zeroed (dropout)", "1.111 × the right ones"]),
    (attn_no_denominator, ["rows of weights do not sum to 1", "print the row sums"]),
    (attn_top_two_keys, ["wrong values", "16 of 16 entries differ"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_check_attention_measures_what_no_known_mistake_explains(fn, phrases, rejects):
    result = rejects(check_attention, fn, *phrases)
    if fn is attn_fill_minus_ten:  # at scores this small no claim about ±3·10⁴ scores
        assert "a fill value too weak" not in result.text()
    if fn is attn_top_two_keys:  # zero weights on allowed keys: no scale is fitted through log 0
        assert "divided by" not in result.text()


@pytest.mark.parametrize("fn,phrases", [
    # counted in a float32 tensor: exact below 2²⁴, 64 bytes off at n = 65537
    (lambda n, batch=1, heads=1, dtype=torch.float32: int(torch.tensor([batch, heads, n, n], dtype=torch.float32)
                                                          .prod()) * _element(dtype),
     ["count rounded by float32", "off by 64 bytes", "274886295552"]),
    (lambda n, batch=1, heads=1, dtype=torch.float32: bytes_ok(n, batch, heads, dtype) / 1e6, ["MB", "10⁶"]),
])
def test_check_score_matrix_bytes_float32_count_and_megabytes(fn, phrases, rejects):
    rejects(check_score_matrix_bytes, fn, *phrases)


def attn_scores_clamped(Q, K, V, mask=None):  # "clamp the scores, against overflow"
    scores = (Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])).clamp(-100, 100)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ V, weights


def test_weights_that_land_on_round_values_are_not_called_rounded(rejects):
    # clamped, the ±1000 scores of a row tie: weights of 1/2 and 1/4, far from the right ones, not rounded ones
    result = rejects(check_attention, attn_scores_clamped)
    assert "rounded" not in result.text(), result.text()


# ============================================================================ audit: off-by-one counts named
@pytest.mark.parametrize("fn,phrase", [
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n * (n + 1) * _element(dtype),
     "n(n + 1) entries per matrix, not n²"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * (n - 1) ** 2 * dtype.itemsize,
     "(n − 1)² entries per matrix"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * (n + 1) ** 2 * dtype.itemsize,
     "(n + 1)² entries per matrix"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n * (n - 1) * dtype.itemsize,
     "n(n − 1) entries per matrix"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * (n * n - 1) * dtype.itemsize,
     "(n − 1)(n + 1) = n² − 1 entries"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * len(range(n + 1)) * n * dtype.itemsize,
     "n(n + 1) entries per matrix"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: sum(range(n)) * batch * heads * dtype.itemsize,
     "one triangle without the diagonal"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: (batch + 1) * heads * n * n * dtype.itemsize,
     "batch + 1 for batch"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * (heads - 1) * n * n * dtype.itemsize,
     "heads − 1 for heads"),
])
def test_check_score_matrix_bytes_names_off_by_one_counts(fn, phrase, rejects):
    result = rejects(check_score_matrix_bytes, fn, phrase)
    assert "expected 144" not in result.diagnosis.summary


def _off_by_one_and_four_bytes(n, batch=1, heads=1, dtype=torch.float32):
    return batch * heads * n * (n + 1) * 4  # two mistakes at once: no single formula is named


def test_check_score_matrix_bytes_names_no_formula_for_two_mistakes(rejects):
    result = rejects(check_score_matrix_bytes, _off_by_one_and_four_bytes, "168 bytes, expected 144")
    assert not result.diagnosis.cause


@pytest.mark.parametrize("fn", [
    lambda n, batch=1, heads=1, dtype=torch.float32: math.prod((batch, heads, n, n)) * dtype.itemsize,
    lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n ** 2
    * torch.tensor([], dtype=dtype).element_size(),
    lambda n, batch=1, heads=1, dtype=torch.float32: int(np.prod([batch, heads, n, n], dtype=np.int64))
    * dtype.itemsize,
    lambda n, batch=1, heads=1, dtype=torch.float32: len(range(n)) * len(range(n)) * batch * heads * dtype.itemsize,
    lambda n, batch=1, heads=1, dtype=torch.float32: sum(n for _ in range(n)) * batch * heads * dtype.itemsize,
    lambda n, batch=1, heads=1, dtype=torch.float32: (n * (n + 1) // 2 + n * (n - 1) // 2) * batch * heads
    * dtype.itemsize,  # both triangles, the diagonal once
])
def test_check_score_matrix_bytes_accepts_other_counts(fn, accepts):
    accepts(check_score_matrix_bytes, fn)


# ============================================================================ red team: what an off-by-one count says
@pytest.mark.parametrize("fn,phrase", [
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * (n * n - n) * dtype.itemsize,
     "the diagonal left out"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * (n * (n + 1) // 2) * 2 * dtype.itemsize,
     "the diagonal counted twice"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * (n * n - 1) * dtype.itemsize,
     "1 subtracted from"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * (n * n - 4) * dtype.itemsize,
     "4 subtracted from"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * (n + 1) * (n + 2) * dtype.itemsize,
     "a side off by one or two"),
])
def test_check_score_matrix_bytes_off_by_one_cause_names_each_route(fn, phrase, rejects):
    rejects(check_score_matrix_bytes, fn, phrase)


# ============================================================================ round 3: narrower steps and float64's digits
def _masked_softmax_of(s, mask):
    return torch.softmax(s if mask is None else s.masked_fill(~mask, float("-inf")), dim=-1)


def attn_scores_in_half(Q, K, V, mask=None):
    scores = (Q.half() @ K.half().transpose(-2, -1)).to(Q.dtype) / math.sqrt(Q.shape[-1])  # "faster in half"
    weights = _masked_softmax_of(scores, mask)
    return weights @ V, weights


def attn_scores_in_bfloat16_softmax_in_float32(Q, K, V, mask=None):
    scores = (Q.bfloat16() @ K.bfloat16().transpose(-2, -1)).float() / math.sqrt(Q.shape[-1])
    weights = _masked_softmax_of(scores, mask).to(Q.dtype)
    return weights @ V, weights


def attn_scaled_scores_rounded_to_half(Q, K, V, mask=None):
    scores = (Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])).half().to(Q.dtype)
    weights = _masked_softmax_of(scores, mask)
    return weights @ V, weights


def attn_values_in_half(Q, K, V, mask=None):
    weights = _masked_softmax_of(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), mask)
    return weights @ V.half().to(V.dtype), weights


def attn_product_in_half(Q, K, V, mask=None):
    weights = _masked_softmax_of(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), mask)
    return (weights.half().float() @ V.half().float()).to(V.dtype), weights


def attn_epsilon_in_the_sum(Q, K, V, mask=None):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    weights = e / (e.sum(dim=-1, keepdim=True) + 1e-6)  # "never divide by 0"
    return weights @ V, weights


def attn_float32_scale(Q, K, V, mask=None):
    scores = Q @ K.transpose(-2, -1) * torch.rsqrt(torch.tensor(float(Q.shape[-1])))  # a float32 1/√d_k
    weights = _masked_softmax_of(scores, mask)
    return weights @ V, weights


def attn_float32_running_sum(Q, K, V, mask=None):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    m = scores.amax(dim=-1, keepdim=True)
    total = torch.zeros(*scores.shape[:-1], 1)  # float32: made without dtype=
    for j in range(scores.shape[-1]):
        total += torch.exp(scores[..., j:j + 1] - m)
    weights = torch.exp(scores - m) / total
    return weights @ V, weights


def attn_weights_clamped(Q, K, V, mask=None):
    weights = _masked_softmax_of(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), mask).clamp_min(1e-12)  # "no log 0"
    return weights @ V, weights


@pytest.mark.parametrize("fn,phrases", [
    (attn_scores_in_half, ["scores computed in float16", "Q @ K.transpose(-2, -1)"]),
    (attn_scores_in_bfloat16_softmax_in_float32, ["scores computed in bfloat16"]),
    (attn_scaled_scores_rounded_to_half, ["scores computed in float16"]),
    (attn_values_in_half, ["V rounded to float16 for weights @ V"]),
    (attn_product_in_half, ["the weights and V rounded to float16"]),
    (attn_epsilon_in_the_sum, ["an epsilon added to the softmax's sum", "about 1e-06"]),
    (attn_float32_scale, ["weights not at float64 precision", "correct digits"]),
    (attn_float32_running_sum, ["weights not at float64 precision"]),
    (attn_weights_clamped, ["blocked keys get a tiny weight, not 0", "clamped the weights to at least 1e-12"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_check_attention_names_narrow_steps_and_lost_digits(fn, phrases, rejects):
    rejects(check_attention, fn, *phrases)


def attn_pure_python(Q, K, V, mask=None):
    shape = torch.broadcast_shapes(Q.shape[:-2], K.shape[:-2], V.shape[:-2])
    n_q, n_k, d_k, d_v = Q.shape[-2], K.shape[-2], Q.shape[-1], V.shape[-1]
    m = torch.broadcast_to(torch.tensor(True) if mask is None else mask, (*shape, n_q, n_k)).reshape(-1, n_q, n_k)
    q, k, v = (t.expand(*shape, *t.shape[-2:]).reshape(-1, *t.shape[-2:]).tolist() for t in (Q, K, V))
    m = m.tolist()
    weights, output = [], []
    for b in range(len(q)):
        for i in range(n_q):
            s = [sum(q[b][i][t] * k[b][j][t] for t in range(d_k)) / math.sqrt(d_k) for j in range(n_k)]
            top = max(s[j] for j in range(n_k) if m[b][i][j])
            e = [math.exp(s[j] - top) if m[b][i][j] else 0.0 for j in range(n_k)]
            row = [x / math.fsum(e) for x in e]
            weights.append(row)
            output.append([math.fsum(row[j] * v[b][j][c] for j in range(n_k)) for c in range(d_v)])
    return (torch.tensor(output, dtype=Q.dtype).reshape(*shape, n_q, d_v),
            torch.tensor(weights, dtype=Q.dtype).reshape(*shape, n_q, n_k))


def attn_online_softmax(Q, K, V, mask=None):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    m = torch.full(scores.shape[:-1], float("-inf"), dtype=scores.dtype)
    total = torch.zeros(scores.shape[:-1], dtype=scores.dtype)
    for j in range(scores.shape[-1]):  # one pass over the keys: running maximum and sum
        new = torch.maximum(m, scores[..., j])
        total = total * torch.exp(m - new).nan_to_num(0.0) + torch.exp(scores[..., j] - new).nan_to_num(0.0)
        m = new
    weights = torch.exp(scores - m[..., None]) / total[..., None]
    return weights @ V, weights


def attn_log_space(Q, K, V, mask=None):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.exp(scores - torch.logsumexp(scores, dim=-1, keepdim=True))
    return weights @ V, weights


def attn_clamped_sum(Q, K, V, mask=None):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    weights = e / e.sum(dim=-1, keepdim=True).clamp_min(1e-12)  # the sum is at least 1: the clamp changes nothing
    return weights @ V, weights


class AttentionModule:
    def __call__(self, Q, K, V, mask=None):
        return attention(Q, K, V, mask)


@torch.inference_mode()
def attn_inference_mode(Q, K, V, mask=None):
    return attention(Q, K, V, mask)


@pytest.mark.parametrize("fn", [attn_pure_python, attn_online_softmax, attn_log_space, attn_clamped_sum,
                                AttentionModule(), attn_inference_mode,
                                lambda Q, K, V, mask=None: tuple(t.mT.contiguous().mT for t in attention(Q, K, V, mask))],
                         ids=lambda v: getattr(v, "__name__", type(v).__name__))
def test_check_attention_accepts_slow_one_pass_and_log_space_answers(fn, accepts):
    accepts(check_attention, fn)


# ============================================================================ round 4: a clamp is named only when proven
def attn_blocked_set_to_tiny(Q, K, V, mask=None):  # "no log 0": the blocked weights set to 1e-20, not a clamp
    weights = _masked_softmax_of(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), mask)
    if mask is not None:
        weights = weights.masked_fill(~mask, 1e-20)
    return weights @ V, weights


def test_check_attention_names_a_fill_of_the_blocked_weights_as_either_a_clamp_or_a_fill(rejects):
    # every allowed weight of the first float64 masked case is above 1e-20: a clamp and a fill give the same numbers,
    # so the cause names both, not the clamp alone
    result = rejects(check_attention, attn_blocked_set_to_tiny, "blocked keys get a tiny weight, not 0",
                     "every blocked weight is exactly 1e-20", "or set the blocked ones to 1e-20 (masked_fill")
    assert not result.diagnosis.cause.startswith("you clamped"), result.text()
