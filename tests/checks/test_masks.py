"""Checks of notebook 06 (attn_course.checks.masks): each wrong mask rejected with its diagnosis, correct
alternatives accepted (tril/triu/arange/loops, where/ne/logical_not, expand/repeat, additive via log…), what
the docstrings rule out named as such (a NumPy array, an additive mask where a bool one is asked for, a shape
that only broadcasts, a finite fill), and the same verdict on replay.

The wrong answers are written the way learners write them, classic and unforeseen.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attn_course import masks as M
from attn_course.checks.masks import (
    check_additive_mask,
    check_causal_mask,
    check_cross_attention_mask,
    check_decoder_mask,
    check_masked_softmax,
    check_padding_mask_from_ids,
    check_padding_mask_from_lengths,
)
from attn_course.checks.result import Status
from attn_course.softmax import masked_softmax as reference_masked_softmax


def tri(n):
    return torch.ones(n, n, dtype=torch.bool)


# ============================================================================ causal_mask
@pytest.mark.parametrize("fn", [
    M.causal_mask,
    lambda n: torch.tril(torch.ones(n, n)).bool(),
    lambda n: torch.arange(n)[:, None] >= torch.arange(n)[None, :],
    lambda n: ~torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1),
    lambda n: torch.ones(n, n).tril() == 1,
    lambda n: torch.tensor([[j <= i for j in range(n)] for i in range(n)]),
    lambda n: torch.from_numpy(np.tril(np.ones((n, n), dtype=bool))),  # built with NumPy, returned as a tensor
    lambda n: torch.triu(torch.ones((1, n, n)), diagonal=1).type(torch.uint8)[0] == 0,  # the Annotated Transformer's
])
def test_causal_accepts(fn, accepts):
    accepts(check_causal_mask, fn)


@pytest.mark.parametrize("fn,phrases", [
    (lambda n: tri(n).triu(), ["upper triangle instead of lower", "torch.tril"]),
    (lambda n: tri(n).tril(-1), ["diagonal excluded"]),
    (lambda n: torch.arange(n)[:, None] > torch.arange(n)[None, :], ["diagonal excluded"]),
    (lambda n: tri(n).tril(1), ["one diagonal too many"]),
    (lambda n: tri(n).triu(1), ["mask polarity inverted"]),
    (lambda n: tri(n), ["nothing is masked"]),
    (lambda n: torch.eye(n, dtype=torch.bool), ["only the diagonal"]),
    (lambda n: torch.zeros(n, n, dtype=torch.bool), ["everything is masked"]),
    (lambda n: tri(n).tril().flip(-1), ["flipped"]),
    (lambda n: torch.ones(n, n).tril(), ["float mask of 0s and 1s", ".bool()"]),
    (lambda n: torch.ones(n, n, dtype=torch.long).tril(), ["integer mask"]),
    (lambda n: torch.zeros(n, n).masked_fill(tri(n).triu(1), -1e4), ["additive float mask, not a bool mask"]),
    (lambda n: torch.ones(n, n).tril().log(), ["additive float mask", "-inf"]),
    (lambda n: torch.zeros(n, n).masked_fill(tri(n).triu(1), torch.finfo(torch.float32).min), ["additive float mask"]),
    (lambda n: np.tril(np.ones((n, n), dtype=bool)), ["NumPy array, not a tensor", "torch.from_numpy"]),
    (lambda n: tri(n).tril()[None, None], ["shape (1, 1, 5, 5), not (5, 5)", "size-1 axes added"]),
    (lambda n: tri(n + 1).tril(), ["size n + 1"]),
    (lambda n: tri(n - 1).tril() if n > 1 else tri(1), ["size n - 1"]),
    (lambda n: tri(n).tril()[:, :-1], ["does not fit"]),
    (lambda n: tri(5).tril(), ["n is ignored"]),
    (lambda n: tri(n).tril().tolist(), ["Python list"]),
    (lambda n: (~tri(n).tril()).float() * float("-inf"), ["NaN", "0 × (-inf)"]),
    # unforeseen: the last column always allowed
    (lambda n: tri(n).tril() | (torch.arange(n) == n - 1), ["later keys (j > i) allowed"]),
    # unforeseen: the first row blocked entirely
    (lambda n: tri(n).tril() & (torch.arange(n)[:, None] > 0), ["blocks", "the diagonal"]),
])
def test_causal_rejects(fn, phrases, rejects):
    rejects(check_causal_mask, fn, *phrases)


def test_causal_not_attempted_and_not_callable(rejects, unfinished):
    rejects(check_causal_mask, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    rejects(check_causal_mask, torch.ones(3, 3), "not a function")
    rejects(check_causal_mask, lambda n: None, "None")


# ============================================================================ padding_mask_from_lengths
@pytest.mark.parametrize("fn", [
    M.padding_mask_from_lengths,
    lambda lengths, max_len=None: torch.stack([torch.arange(max_len or int(lengths.max())) < L for L in lengths]),
    lambda lengths, max_len=None: torch.arange(int(lengths.max()) if max_len is None else max_len).expand(
        len(lengths), -1) < lengths.unsqueeze(1),
    lambda lengths, max_len=None: torch.tensor([[j < int(L) for j in range(max_len if max_len is not None
                                                                            else int(max(lengths)))] for L in lengths]),
])
def test_lengths_accepts(fn, accepts):
    accepts(check_padding_mask_from_lengths, fn)


def _arange(lengths, max_len):
    return torch.arange(max_len if max_len is not None else int(lengths.max()))


@pytest.mark.parametrize("fn,phrases", [
    (lambda lengths, max_len=None: _arange(lengths, max_len) <= lengths[:, None], ["off by one", "<"]),
    (lambda lengths, max_len=None: _arange(lengths, max_len) < lengths[:, None] - 1, ["last real token"]),
    (lambda lengths, max_len=None: _arange(lengths, max_len) >= lengths[:, None], ["polarity inverted"]),
    (lambda lengths, max_len=None: (_arange(lengths, max_len) < lengths[:, None]).T, ["transposed"]),
    (lambda lengths, max_len=None: torch.arange(int(lengths.max())) < lengths[:, None], ["max_len ignored"]),
    (lambda lengths, max_len=None: torch.arange(max_len or len(lengths)) < lengths[:, None], ["default max_len wrong"]),
    (lambda lengths, max_len=None: (_arange(lengths, max_len) < lengths[:, None]).float(), ["float mask of 0s and 1s"]),
    (lambda lengths, max_len=None: _arange(lengths, max_len).flip(0) < lengths[:, None], ["padding on the left"]),
    (lambda lengths, max_len=None: _arange(lengths, max_len) < lengths[:1, None], ["wrong shape", "<pad> positions allowed"]),
    (lambda lengths, max_len=None: _arange(lengths, max_len) < lengths.max(), ["wrong shape", "<pad> positions allowed"]),
    (lambda lengths, max_len=None: (_arange(lengths, max_len)[None, :] < lengths[:, None]).numpy(), ["NumPy array"]),
    (lambda lengths, max_len=None: torch.arange(int(lengths[0]) if max_len is None else max_len) < lengths[:, None],
     ["default max_len wrong", "lengths[0]"]),
    (lambda lengths, max_len=None: torch.arange(int(lengths[-1]) if max_len is None else max_len) < lengths[:, None],
     ["default max_len wrong", "lengths[-1]"]),
    (lambda lengths, max_len=None: torch.arange(int(lengths.max()) + 1 if max_len is None else max_len) < lengths[:, None],
     ["default max_len wrong", "one more than the largest length"]),
    (lambda lengths, max_len=None: torch.arange(6) < lengths[:, None], ["width fixed at 6"]),
    (lambda lengths, max_len=None: torch.arange(int(lengths.max()) if max_len is None else max_len + 1)
     < lengths[:, None], ["one column more than max_len"]),
])
def test_lengths_rejects(fn, phrases, rejects):
    rejects(check_padding_mask_from_lengths, fn, *phrases)


def test_lengths_bad_results(rejects, unfinished):
    rejects(check_padding_mask_from_lengths, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    rejects(check_padding_mask_from_lengths, lambda lengths, max_len=None: torch.full((2, 2), float("nan")), "NaN")
    rejects(check_padding_mask_from_lengths, lambda lengths: lengths, "raised TypeError")


# ============================================================================ padding_mask_from_ids
@pytest.mark.parametrize("fn", [
    M.padding_mask_from_ids,
    lambda ids, pad_id: ids.ne(pad_id),
    lambda ids, pad_id: ~(ids == pad_id),
    lambda ids, pad_id: torch.logical_not(torch.eq(ids, pad_id)),
    lambda ids, pad_id: torch.where(ids == pad_id, False, True),
])
def test_ids_accepts(fn, accepts):
    accepts(check_padding_mask_from_ids, fn)


@pytest.mark.parametrize("fn,phrases", [
    (lambda ids, pad_id: ids != 0, ["pad_id ignored"]),
    (lambda ids, pad_id: ids > 0, ["pad_id ignored"]),
    (lambda ids, pad_id: ids == pad_id, ["polarity inverted"]),
    (lambda ids, pad_id: (ids != pad_id).T, ["transposed"]),
    (lambda ids, pad_id: (ids != pad_id).float(), ["float mask of 0s and 1s"]),
    (lambda ids, pad_id: (ids != pad_id).long(), ["integer mask"]),
    (lambda ids, pad_id: (ids != pad_id).tolist(), ["Python list"]),
    (lambda ids, pad_id: torch.arange(ids.shape[1]) < (ids != pad_id).sum(-1, keepdim=True), ["padding assumed at the end"]),
    (lambda ids, pad_id: torch.cumprod((ids != pad_id).long(), -1).bool(), ["after the first <pad>"]),
    (lambda ids, pad_id: ids > pad_id, ["ids below pad_id blocked"]),
    (lambda ids, pad_id: (ids != pad_id) & (ids != 0), ["id 0 treated as padding too"]),
    (lambda ids, pad_id: torch.where(ids == pad_id, float("-inf"), 0.0), ["additive float mask"]),
    (lambda ids, pad_id: (ids != pad_id).numpy(), ["NumPy array"]),
    (lambda ids, pad_id: (ids != pad_id)[:, None, None, :], ["shape (B, 1, 1, S), not (B, S)"]),
])
def test_ids_rejects(fn, phrases, rejects):
    rejects(check_padding_mask_from_ids, fn, *phrases)


def test_ids_not_attempted(rejects, unfinished):
    rejects(check_padding_mask_from_ids, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    rejects(check_padding_mask_from_ids, "ids != pad_id", "not a function")


# ============================================================================ decoder_mask
def causal(T):
    return tri(T).tril()


def real(ids, pad):
    return ids != pad


@pytest.mark.parametrize("fn", [
    M.decoder_mask,
    lambda ids, pad: causal(ids.shape[1])[None, None] & real(ids, pad)[:, None, None, :],
    lambda ids, pad: (causal(ids.shape[1]) & real(ids, pad).unsqueeze(1)).unsqueeze(1),
    lambda ids, pad: torch.logical_and(torch.tril(torch.ones(ids.shape[1], ids.shape[1])).bool(),
                                       (ids != pad)[:, None, None, :]),
    # annotated-transformer style, ported: (B, 1, T) & (1, T, T), then a heads axis
    lambda ids, pad: ((ids != pad).unsqueeze(-2) & (torch.triu(torch.ones(1, ids.shape[1], ids.shape[1]),
                                                                diagonal=1) == 0)).unsqueeze(1),
])
def test_decoder_accepts(fn, accepts):
    accepts(check_decoder_mask, fn)


def test_decoder_key_only_answer_gets_no_note(accepts, rejects):
    """E5: a key-only answer (the docstring's mask) passes without a remark; blocking the <pad> query rows as
    well is not what the docstring describes, and is named (seed 004's style)."""
    assert "query" not in accepts(check_decoder_mask, M.decoder_mask).summary
    rejects(check_decoder_mask, lambda ids, pad: M.decoder_mask(ids, pad) & real(ids, pad)[:, None, :, None],
            "<pad> query rows blocked as well", "fully masked")


@pytest.mark.parametrize("fn,phrases", [
    (lambda ids, pad: causal(ids.shape[1]) & real(ids, pad)[:, None, :, None], ["queries instead of the keys"]),
    (lambda ids, pad: causal(ids.shape[1]) & real(ids, pad)[:, None, :], ["no heads axis"]),
    (lambda ids, pad: causal(ids.shape[1])[None, None].expand(ids.shape[0], 1, -1, -1), ["padding part is missing"]),
    (lambda ids, pad: causal(ids.shape[1]), ["padding part is missing"]),
    (lambda ids, pad: real(ids, pad)[:, None, None, :].expand(-1, 1, ids.shape[1], -1), ["causal part is missing"]),
    (lambda ids, pad: causal(ids.shape[1]) | real(ids, pad)[:, None, None, :], ["OR padding instead of AND"]),
    (lambda ids, pad: causal(ids.shape[1]).T & real(ids, pad)[:, None, None, :], ["upper triangle"]),
    (lambda ids, pad: tri(ids.shape[1]).tril(-1) & real(ids, pad)[:, None, None, :], ["diagonal excluded"]),
    (lambda ids, pad: tri(ids.shape[1]).tril(1) & real(ids, pad)[:, None, None, :], ["one diagonal too many"]),
    (lambda ids, pad: ~(causal(ids.shape[1]) & real(ids, pad)[:, None, None, :]), ["polarity inverted"]),
    (lambda ids, pad: causal(ids.shape[1]) & (ids != 0)[:, None, None, :], ["pad_id ignored"]),
    (lambda ids, pad: causal(ids.shape[1]) & (torch.arange(ids.shape[1]) < real(ids, pad).sum(-1, keepdim=True))[:, None, None, :],
     ["padding assumed at the end"]),
    (lambda ids, pad: torch.zeros(ids.shape[0], 1, ids.shape[1], ids.shape[1]).masked_fill(
        ~(causal(ids.shape[1]) & real(ids, pad)[:, None, None, :]), -1e4), ["additive float mask"]),
    (lambda ids, pad: M.additive_mask(M.decoder_mask(ids, pad)), ["additive float mask", "additive_mask"]),
    (lambda ids, pad: (causal(ids.shape[1]) & real(ids, pad)[:, None, None, :]).expand(-1, 3, -1, -1),
     ["heads axis of size 3, not 1"]),
    (lambda ids, pad: causal(ids.shape[0]) & real(ids, pad)[:, None, None, :], ["tgt_ids.shape[0] (the batch size B)"]),
    (lambda ids, pad: causal(ids.shape[1]) & real(ids, pad)[None, :, None, :], ["the size-1 axis in the wrong place"]),
    (lambda ids, pad: (causal(ids.shape[1]) & real(ids, pad)[:, None, None, :]).float(), ["float mask of 0s and 1s"]),
    (lambda ids, pad: [[True]], ["Python list"]),
    (lambda ids, pad: ~torch.ones(ids.shape[1], ids.shape[1]).tril() & real(ids, pad)[:, None, None, :], ["~ and masked_fill"]),
    (lambda ids, pad: (1 - causal(ids.shape[1])) & real(ids, pad)[:, None, None, :], ["~mask"]),
    (lambda ids, pad: torch.zeros(ids.shape[0], 1, ids.shape[1], ids.shape[1], dtype=torch.bool), ["everything is masked"]),
    (lambda ids, pad: M.decoder_mask(ids, pad).transpose(-2, -1), ["transposed"]),
    # unforeseen: padding rows and columns both blocked, and the diagonal kept for <pad> queries
    (lambda ids, pad: (causal(ids.shape[1]) & real(ids, pad)[:, None, None, :]) | torch.eye(ids.shape[1], dtype=torch.bool),
     ["<pad> keys"]),
    # unforeseen: causal part from the number of real tokens (a square of size L)
    (lambda ids, pad: causal(ids.shape[1]) & real(ids, pad)[:, None, None, :] & real(ids, pad)[:, None, :, None]
     & (torch.arange(ids.shape[1]) > 0)[:, None], ["whole query rows blocked", "(0, 0, 0)"]),
    # the padding part inverted alone (== where != belongs)
    (lambda ids, pad: causal(ids.shape[1]) & (ids == pad)[:, None, None, :], ["padding part inverted (== pad_id)"]),
    # `and` between two masks asks a tensor for one truth value
    (lambda ids, pad: causal(ids.shape[1]) and real(ids, pad)[:, None, None, :],
     ["raised RuntimeError", "combine masks with & and |"]),
])
def test_decoder_rejects(fn, phrases, rejects):
    rejects(check_decoder_mask, fn, *phrases)


def test_decoder_not_attempted(rejects, unfinished):
    rejects(check_decoder_mask, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)


# ============================================================================ cross_attention_mask
@pytest.mark.parametrize("fn", [
    M.cross_attention_mask,
    lambda tgt, src, pad: (src != pad)[:, None, None, :].repeat(1, 1, tgt.shape[1], 1),
    lambda tgt, src, pad: (src != pad).unsqueeze(1).unsqueeze(1).expand(-1, -1, tgt.size(1), -1),
    lambda tgt, src, pad: torch.ones(tgt.shape[0], 1, tgt.shape[1], src.shape[1], dtype=torch.bool)
    & (src != pad)[:, None, None, :],
])
def test_cross_accepts(fn, accepts):
    accepts(check_cross_attention_mask, fn)


@pytest.mark.parametrize("fn,phrases", [
    (lambda tgt, src, pad: M.cross_attention_mask(tgt, src, pad).transpose(-2, -1), ["rows and columns swapped"]),
    (lambda tgt, src, pad: (tgt != pad)[:, None, :, None].expand(-1, 1, -1, src.shape[1]),
     ["target padding blocked instead of source padding"]),
    (lambda tgt, src, pad: M.cross_attention_mask(tgt, src, pad) & (tgt != pad)[:, None, :, None],
     ["target padding rows blocked as well"]),
    (lambda tgt, src, pad: M.cross_attention_mask(tgt, src, pad) & torch.ones(tgt.shape[1], src.shape[1],
                                                                               dtype=torch.bool).tril(),
     ["causal part in cross-attention"]),
    (lambda tgt, src, pad: M.cross_attention_mask(tgt, src, pad)[:, 0], ["no heads axis"]),
    (lambda tgt, src, pad: ~M.cross_attention_mask(tgt, src, pad), ["polarity inverted"]),
    (lambda tgt, src, pad: (src != 0)[:, None, None, :].expand(-1, 1, tgt.shape[1], -1), ["pad_id ignored"]),
    (lambda tgt, src, pad: (torch.arange(src.shape[1]) < (src != pad).sum(-1, keepdim=True))[:, None, None, :]
     .expand(-1, 1, tgt.shape[1], -1), ["padding assumed at the end"]),
    (lambda tgt, src, pad: (src == pad)[:, None, None, :], ["mask polarity inverted", "return shape (2, 1, 6, 4)"]),
    (lambda tgt, src, pad: (src != pad)[:, None, None, :], ["not expanded to the T target rows", "tgt_ids"]),
    (lambda tgt, src, pad: M.additive_mask(M.cross_attention_mask(tgt, src, pad), torch.float64), ["additive float mask"]),
    (lambda tgt, src, pad: M.cross_attention_mask(tgt, src, pad).numpy(), ["NumPy array"]),
    (lambda tgt, src, pad: (src != pad)[:, None, None, :].expand(-1, 1, src.shape[1], -1), ["one row per source token"]),
    (lambda tgt, src, pad: (src != pad)[:, None, None, :].expand(-1, 1, tgt.shape[0], -1),
     ["rows counted from tgt_ids.shape[0]"]),
    (lambda tgt, src, pad: (tgt != pad)[:, None, None, :], ["columns are target tokens"]),
    (lambda tgt, src, pad: M.decoder_mask(tgt, pad), ["columns are target tokens"]),
    (lambda tgt, src, pad: torch.ones(tgt.shape[0], 1, tgt.shape[1], src.shape[1], dtype=torch.bool), ["nothing is masked"]),
    (lambda tgt, src, pad: torch.ones(2, 2, 2, 2, dtype=torch.bool), ["does not fit"]),
    (lambda tgt, src, pad: (src != pad)[:, None, :], ["does not fit"]),
    (lambda tgt, src, pad: -1, ["returned the number -1, not a mask", "plain number"]),
    (lambda tgt, src, pad: (src != pad)[:, None, None, :].expand(-2, 1, tgt.shape[1], -1),
     ["raised RuntimeError", "you gave expand the size -2", "-1 to keep"]),
    (lambda tgt, src, pad: (src != pad)[:, None, None, :].expand(-1, 0, tgt.shape[1], -1),
     ["does not fit", "an axis of size 0 (axis 1)"]),
])
def test_cross_rejects(fn, phrases, rejects):
    rejects(check_cross_attention_mask, fn, *phrases)


def test_cross_not_attempted(rejects, unfinished):
    rejects(check_cross_attention_mask, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)


# ============================================================================ additive_mask
@pytest.mark.parametrize("fn", [
    M.additive_mask,
    lambda mask, dtype=torch.float32: torch.where(mask, torch.tensor(0.0, dtype=dtype), torch.tensor(float("-inf"), dtype=dtype)),
    lambda mask, dtype=torch.float32: mask.to(dtype).log(),  # log 1 = 0, log 0 = -inf
    lambda mask, dtype=torch.float32: torch.zeros(mask.shape).masked_fill(~mask, float("-inf")).to(dtype),
    lambda mask, dtype=torch.float32: torch.full(mask.shape, float("-inf"), dtype=dtype).masked_fill(mask, 0.0),
    lambda mask, dtype=torch.float32: torch.zeros_like(mask, dtype=dtype).masked_fill_(mask.logical_not(), float("-inf")),
])
def test_additive_accepts(fn, accepts):
    accepts(check_additive_mask, fn)


@pytest.mark.parametrize("fn,phrases", [
    (lambda mask, dtype=torch.float32: torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, -1e4), ["fill value too weak"]),
    (lambda mask, dtype=torch.float32: torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, -1e9),
     ["a finite fill instead of -inf", "-1e+09"]),
    (lambda mask, dtype=torch.float32: torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min),
     ["a finite fill instead of -inf", "torch.finfo(float32).min", "uniform weights"]),
    (lambda mask, dtype=torch.float32: ((~mask).to(dtype) * -1e9).to(dtype), ["a finite fill instead of -inf"]),
    (lambda mask, dtype=torch.float32: torch.zeros(mask.shape, dtype=dtype).masked_fill(
        ~mask, torch.finfo(torch.float32).min), ["a finite fill instead of -inf"]),  # float32's minimum, any dtype
    (lambda mask, dtype=torch.float32: (~mask).to(dtype) * float("-inf"), ["0 × (-inf) is NaN"]),
    (lambda mask, dtype=torch.float32: mask.to(dtype), ["blocks nothing"]),
    (lambda mask, dtype=torch.float32: torch.zeros(mask.shape, dtype=dtype).masked_fill(mask, float("-inf")),
     ["polarity inverted"]),
    (lambda mask, dtype=torch.float32: torch.zeros(mask.shape).masked_fill(~mask, float("-inf")), ["dtype float32, not float16",
                                                                                                   "ignored"]),
    (lambda mask, dtype=torch.float32: torch.where(mask, 0.0, float("-inf")), ["dtype float32, not float16"]),
    (lambda mask, dtype=torch.float32: torch.zeros(3, dtype=dtype), ["not the mask's"]),
    (lambda mask, dtype=torch.float32: mask.tolist(), ["Python list"]),
    (lambda mask, dtype=torch.float32: ~mask, ["bool mask, not the additive form"]),
    (lambda mask, dtype=torch.float32: torch.ones(mask.shape, dtype=dtype).masked_fill(~mask, float("-inf")),
     ["kept positions are not 0"]),
    (lambda mask, dtype=torch.float32: torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, 1e9),
     ["blocked positions not negative"]),
    (lambda mask, dtype=torch.float32: M.additive_mask(mask.squeeze(), dtype), ["not the mask's"]),
    (lambda mask, dtype=torch.float32: torch.log1p(mask.to(dtype)), ["kept positions are not 0"]),  # not polarity
    (lambda mask, dtype=torch.float32: torch.log((~mask).to(dtype)), ["polarity inverted"]),
    (lambda mask, dtype=torch.float32: M.additive_mask(mask, dtype).mT, ["last two axes swapped", ".mT"]),
    (lambda mask, dtype=torch.float32: ~mask, ["you returned ~mask, the negated mask"]),
    (lambda mask, dtype=torch.float32: mask.shape.masked_fill(~mask, float("-inf")),
     ["raised AttributeError", "on a shape (a torch.Size"]),
    (lambda mask, dtype=torch.float32: torch.full(mask.shape, 2.0, dtype=dtype).masked_fill(~mask, float("-inf")),
     ["kept positions are not 0", "every kept position of your result holds 2"]),
])
def test_additive_rejects(fn, phrases, rejects):
    rejects(check_additive_mask, fn, *phrases)


def test_additive_not_attempted(rejects, unfinished):
    rejects(check_additive_mask, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    rejects(check_additive_mask, None, "not a function")


# ============================================================================ masked_softmax
def ms_solution(scores, mask):
    empty = ~mask.any(dim=-1, keepdim=True)  # fully masked rows
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")).masked_fill(empty, 0.0), dim=-1)
    return weights.masked_fill(~mask | empty, 0.0)


def ms_nan_to_num(scores, mask):
    return torch.nan_to_num(torch.softmax(scores.masked_fill(~mask, float("-inf")), -1), nan=0.0)


def ms_where(scores, mask):
    w = torch.softmax(torch.where(mask, scores, float("-inf")), dim=-1)
    return torch.where(mask.any(-1, keepdim=True), w, torch.zeros_like(w))


def ms_manual(scores, mask):
    s = scores.masked_fill(~mask, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    total = e.sum(-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


def ms_finfo_then_zero(scores, mask):
    w = torch.softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), -1)
    return w * mask  # a fully masked row: uniform × 0 = 0


def ms_sdpa(scores, mask):
    n_k = scores.shape[-1]
    eye = torch.eye(n_k, dtype=scores.dtype)
    mask = torch.broadcast_to(mask, scores.shape)
    return F.scaled_dot_product_attention(scores, eye * n_k ** 0.5, eye.expand(*scores.shape[:-2], n_k, n_k),
                                          attn_mask=mask)


def ms_float64(scores, mask):
    return ms_nan_to_num(scores.double(), mask)


@pytest.mark.parametrize("fn", [
    ms_solution, ms_nan_to_num, ms_where, ms_manual, ms_finfo_then_zero, ms_sdpa, ms_float64,
    lambda scores, mask: reference_masked_softmax(scores, mask),
    lambda scores, mask: reference_masked_softmax(scores, M.additive_mask(torch.broadcast_to(mask, scores.shape),
                                                                          scores.dtype)),
])
def test_masked_softmax_accepts(fn, accepts):
    accepts(check_masked_softmax, fn)


def ms_log_softmax(scores, mask):
    empty = ~mask.any(dim=-1, keepdim=True)
    weights = torch.log_softmax(scores.masked_fill(~mask, float("-inf")).masked_fill(empty, 0.0), dim=-1)
    return weights.masked_fill(empty, 0.0)


@pytest.mark.parametrize("fn,phrases", [
    (lambda s, m: torch.softmax(s.masked_fill(~m, float("-inf")), -1), ["NaN in fully masked rows", "~mask.any"]),
    (lambda s, m: torch.softmax(s.masked_fill(~m, -1e9), -1), ["uniform weights in fully masked rows"]),
    (lambda s, m: torch.softmax(s.masked_fill(~m, torch.finfo(s.dtype).min), -1), ["uniform weights"]),
    (lambda s, m: torch.nan_to_num(torch.softmax(s.masked_fill(~m, float("-inf")), -2)), ["axis -2"]),
    (lambda s, m: torch.nan_to_num(torch.softmax(s.masked_fill(m, float("-inf")), -1)), ["polarity inverted"]),
    (lambda s, m: torch.softmax(s, -1), ["mask ignored"]),
    (lambda s, m: torch.softmax(s, -1) * m, ["mask applied after the softmax"]),
    (lambda s, m: (torch.softmax(s, -1) * m) / (torch.softmax(s, -1) * m).sum(-1, keepdim=True), ["renormalised"]),
    (lambda s, m: torch.nan_to_num((torch.softmax(s, -1) * m) / (torch.softmax(s, -1) * m).sum(-1, keepdim=True)),
     ["renormalised", "underflow"]),
    # the same, with the division guarded: no NaN, the row comes out 0
    (lambda s, m: (lambda e: torch.where(e.sum(-1, keepdim=True) > 0, e / e.sum(-1, keepdim=True), 0.0))(
        torch.exp(s - s.amax(-1, keepdim=True)) * m), ["renormalised", "row came out 0"]),
    (lambda s, m: ms_nan_to_num(s, m).masked_fill(~m.all(-1, keepdim=True), 0.0), ["any blocked key set to 0"]),
    (lambda s, m: torch.where(m.any(-1, keepdim=True), ms_nan_to_num(s, m), torch.ones_like(s)), ["filled with 1"]),
    (lambda s, m: torch.where(m.any(-1, keepdim=True), ms_nan_to_num(s, m), torch.softmax(s, -1)),
     ["fully masked rows not masked"]),
    (lambda s, m: torch.softmax(s.masked_fill(~m, -1e4), -1).masked_fill(~m.any(-1, keepdim=True), 0.0),
     ["fill value too weak"]),
    (lambda s, m: torch.softmax(s.masked_fill(~m, float("-inf")), -1).nan_to_num(1 / s.shape[-1]),
     ["uniform weights in fully masked rows"]),
    (lambda s, m: torch.softmax(s.masked_fill(~m, float("-inf")), -1).nan_to_num(0.5), ["fully masked rows are not zero"]),
    (lambda s, m: ms_nan_to_num(s, m)[..., :-1], ["shape"]),
    (ms_log_softmax, ["log-softmax"]),
    (lambda s, m: torch.log_softmax(s.masked_fill(~m, float("-inf")), -1).nan_to_num(nan=0.0), ["outside [0, 1]"]),
    (lambda s, m: s.masked_fill(~m, float("-inf")).masked_fill(~m.any(-1, keepdim=True), 0.0), ["scores returned"]),
])
def test_masked_softmax_rejects(fn, phrases, rejects):
    rejects(check_masked_softmax, fn, *phrases)


def ms_in_place(scores, mask):
    scores.masked_fill_(~mask, float("-inf"))  # changes the caller's scores
    return torch.nan_to_num(torch.softmax(scores, -1), nan=0.0)


def ms_keepdim_forgotten(scores, mask):
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
    return w.masked_fill(~mask.any(-1), 0.0)  # (..., n_q) lines up with the keys


def ms_exp_without_max(scores, mask):
    e = torch.exp(scores) * mask
    total = e.sum(-1, keepdim=True)
    return torch.where(total > 0, e / total, torch.zeros_like(e))


def ms_float32_inside(scores, mask):
    empty = ~mask.any(-1, keepdim=True)
    w = torch.softmax(scores.float().masked_fill(~mask, float("-inf")).masked_fill(empty, 0.0), -1)
    return w.masked_fill(empty, 0.0).to(scores.dtype)


@pytest.mark.parametrize("fn,phrases", [
    (ms_exp_without_max, ["softmax without subtracting the maximum", "e^30000"]),
    (ms_float32_inside, ["computed in float32, not float64"]),
    (ms_in_place, ["changed scores in place", "masked_fill_"]),
    (ms_keepdim_forgotten, ["without keepdim=True"]),
    # the same broadcasting error message, another mistake: no keepdim cause unless a second call confirms it
    (lambda s, m: torch.nan_to_num(torch.softmax(s.masked_fill(~m.mT if m.dim() > 1 else ~m, float("-inf")), -1)),
     ["raised RuntimeError"]),
    (lambda s, m: torch.softmax(s + m, -1), ["bool mask added to the scores"]),
    (lambda s, m: ms_nan_to_num(s, m).numpy(), ["NumPy array"]),
    (lambda s, m: torch.softmax(s.masked_fill(~m, -1e9), -1).masked_fill(~m.any(-1, keepdim=True), 0.0),
     ["float16", "65504"]),
    (lambda s, m: ms_solution(s, m) if m.dim() < 2 else torch.softmax(
        s.masked_fill(~m, float("-inf")).masked_fill(~m.any(-2, keepdim=True), 0.0), -1)
     .masked_fill(~m.any(-2, keepdim=True), 0.0), ["fully masked rows looked for over axis -2", "mask.any(dim=-2)"]),
    (lambda s, m: ~m.any(dim=-1, keepdim=True), ["returned a bool tensor, not weights", "fully masked rows"]),
    (lambda s, m: ms_solution(s.float(), m).to(s.dtype), ["computed in float32, not float64", ".float()"]),
    (lambda s, m: torch.nan_to_num(torch.softmax(s.half().masked_fill(~m, float("-inf")), -1)).to(s.dtype),
     ["computed in float16, not float64", ".half()"]),
    # no known mistake: the property that is off is named
    (lambda s, m: ms_nan_to_num(s, m).masked_fill(ms_nan_to_num(s, m) > 0.3, float("nan")),
     ["NaN in rows that have an allowed key"]),
    (lambda s, m: ms_nan_to_num(s, m) * 0.9 + 0.1 / s.shape[-1] * ~torch.broadcast_to(m, s.shape),
     ["weight on blocked keys"]),
    (lambda s, m: torch.where(m.any(-1, keepdim=True), 0.99 * ms_nan_to_num(s, m), float("nan")),
     ["rows do not sum to 1"]),
    (lambda s, m: (lambda e: torch.where(e.sum(-1, keepdim=True) > 0, e / e.sum(-1, keepdim=True), 0.0))(
        torch.exp(s) * m), ["softmax without subtracting the maximum", "e^score is inf"]),
])
def test_masked_softmax_names_unforeseen_mistakes(fn, phrases, rejects):
    result = rejects(check_masked_softmax, fn, *phrases)
    if phrases == ["raised RuntimeError"]:
        assert "keepdim" not in result.text()


def test_masked_softmax_not_attempted(rejects, unfinished):
    rejects(check_masked_softmax, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)


def test_masked_softmax_cases_hold_fully_masked_rows_of_every_kind():
    from attn_course.checks.masks.masked_softmax import _softmax_cases

    cases = _softmax_cases()
    empty_rows = [~torch.broadcast_to(c.mask, c.scores.shape).any(-1) for c in cases]
    assert sum(bool(e.any()) for e in empty_rows) >= 5 and not empty_rows[0].any()  # the first case has none
    assert {c.scores.dtype for c in cases} == {torch.float16, torch.float32, torch.float64}
    assert {c.mask.dim() for c in cases} >= {1, 2, 4}


# ============================================================================ branches the tests above leave out
def causal_ones_and_minus_inf(n):  # the bool and additive forms mixed: 1 where kept, -inf where blocked
    mask = torch.ones(n, n).tril()
    mask[mask == 0] = float("-inf")
    return mask


def lengths_default_branch_inverted(lengths, max_len=None):
    """Right when max_len is given; the max_len=None branch, copied from a recipe that marks the padding, inverted."""
    if max_len is None:
        max_len = int(lengths.max())
        return torch.arange(max_len)[None, :] >= lengths[:, None]
    return torch.arange(max_len)[None, :] < lengths[:, None]


def lengths_one_row_when_nothing_is_padded(lengths, max_len=None):
    max_len = int(lengths.max()) if max_len is None else max_len
    if bool((lengths == max_len).all()):  # "every sequence is full: one row of True serves them all"
        return torch.ones(1, max_len, dtype=torch.bool)
    return torch.arange(max_len)[None, :] < lengths[:, None]


def softmax_all_pad_sequences_zeroed(scores, mask):
    """Zeroes the sequences that are all padding (one test per batch entry), not every row without a key."""
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
    empty = ~mask.reshape(mask.shape[0], -1).any(-1)
    return w.masked_fill(empty.view(-1, *[1] * (w.dim() - 1)), 0.0)


@pytest.mark.parametrize("check,fn,phrases", [
    (check_causal_mask, causal_ones_and_minus_inf, ["a float32 mask with values [-inf, 1.0]", "comparisons"]),
    (check_padding_mask_from_lengths, lengths_default_branch_inverted,
     ["mask polarity inverted", "True exactly where it should be False", "torch.tensor([2, 6, 4])"]),
    (check_padding_mask_from_lengths, lengths_one_row_when_nothing_is_padded,
     ["shape (1, 3), not (2, 3)", "right once broadcast", "mask.expand(2, 3)"]),
    (check_masked_softmax, softmax_all_pad_sequences_zeroed,
     ["NaN in fully masked rows", "rows 0 and 1 of the first sequence are empty", "~mask.any(dim=-1, keepdim=True)"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_masks_diagnose_what_no_known_mistake_reproduces(check, fn, phrases, rejects):
    rejects(check, fn, *phrases)


def softmax_global_max(scores, mask):
    s = scores.masked_fill(~mask, float("-inf"))
    e = torch.exp(s - s.max())  # "the maximum, for stability"
    return torch.nan_to_num(e / e.sum(dim=-1, keepdim=True))


def softmax_global_max_empty_rows_zeroed(scores, mask):
    s = scores.masked_fill(~mask, float("-inf"))
    e = torch.exp(s - s.max())
    return (e / e.sum(dim=-1, keepdim=True)).masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)


def softmax_epsilon_in_the_sum(scores, mask):
    s = scores.masked_fill(~mask, float("-inf"))
    e = torch.exp(s - s.amax(dim=-1, keepdim=True).nan_to_num(neginf=0.0))
    return e / (e.sum(dim=-1, keepdim=True) + 1e-4)  # "no 0/0 in empty rows": rows sum to 1 / (1 + 1e-4)


@pytest.mark.parametrize("fn,phrases", [
    # not "mask applied after the softmax, then renormalised": they agree here, not where the empty row is the largest
    (softmax_global_max, ["maximum over the whole tensor", "which your code then set to 0"]),
    (softmax_global_max_empty_rows_zeroed, ["maximum over the whole tensor", "0/0 is NaN"]),
    (softmax_epsilon_in_the_sum, ["an epsilon added to the row sum", "about 0.0001"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_masked_softmax_global_maximum_and_epsilon(fn, phrases, rejects):
    rejects(check_masked_softmax, fn, *phrases)


def test_float_padding_mask_fix_names_no_causal_comparison(rejects):
    result = rejects(check_padding_mask_from_ids, lambda ids, pad_id: (ids != pad_id).float(), "float mask of 0s and 1s")
    assert "j <= i" not in result.text()


# ============================================================================ inputs changed in place
def lengths_unsqueezed_in_place(lengths, max_len=None):
    max_len = int(lengths.max()) if max_len is None else max_len
    lengths.unsqueeze_(-1)  # "a column, to compare with the positions"
    return torch.arange(max_len) < lengths


def ids_padding_overwritten(ids, pad_id):
    ids[ids == pad_id] = -1  # "mark the padding"
    return ids != -1


def decoder_ids_overwritten(tgt_ids, pad_id):
    n = tgt_ids.shape[1]
    tgt_ids[tgt_ids != pad_id] = 1  # "real tokens as 1"
    return torch.ones(n, n, dtype=torch.bool).tril() & (tgt_ids == 1)[:, None, None, :]


def cross_src_shifted_in_place(tgt_ids, src_ids, pad_id):
    src_ids -= pad_id  # "padding is now 0"
    return (src_ids != 0)[:, None, None, :].expand(-1, 1, tgt_ids.shape[1], -1)


def additive_mask_flipped_in_place(mask, dtype=torch.float32):
    mask.logical_not_()  # "the blocked positions"
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(mask, float("-inf"))


@pytest.mark.parametrize("check,fn,phrase", [
    (check_padding_mask_from_lengths, lengths_unsqueezed_in_place, "lengths changed in place"),
    (check_padding_mask_from_ids, ids_padding_overwritten, "ids changed in place"),
    (check_decoder_mask, decoder_ids_overwritten, "tgt_ids changed in place"),
    (check_cross_attention_mask, cross_src_shifted_in_place, "src_ids changed in place"),
    (check_additive_mask, additive_mask_flipped_in_place, "mask changed in place"),
], ids=lambda v: getattr(v, "__name__", ""))
def test_mask_builders_that_change_their_input_in_place_are_named(check, fn, phrase, rejects):
    # every returned mask is right: only the caller's tensor, changed by the call, tells these apart
    result = rejects(check, fn, phrase)
    assert "a copy taken before the call" in result.diagnosis.tried


@pytest.mark.parametrize("check,fn", [
    (check_padding_mask_from_lengths, lambda lengths, max_len=None: (
        lambda L: torch.arange(int(L.max()) if max_len is None else max_len) < L.unsqueeze_(-1))(lengths.clone())),
    (check_padding_mask_from_ids, lambda ids, pad_id: (lambda c: c.ne_(pad_id).bool())(ids.clone())),
    (check_additive_mask, lambda mask, dtype=torch.float32: torch.zeros(mask.shape, dtype=dtype).masked_fill_(
        mask.clone().logical_not_(), float("-inf"))),
], ids=["lengths", "ids", "additive"])
def test_in_place_steps_on_copies_are_accepted(check, fn, accepts):
    accepts(check, fn)


# ============================================================================ audit: scores rounded to half precision
def ms_scores_through_half(scores, mask):  # "float16 scores save memory", the rest in float32
    s = scores.half().float()
    return torch.nan_to_num(torch.softmax(s.masked_fill(~mask, float("-inf")), -1), nan=0.0)


def ms_scores_through_half_back_to_dtype(scores, mask):
    s = scores.to(torch.float16).to(scores.dtype)
    return ms_nan_to_num(s, mask)


def ms_scores_through_bfloat16(scores, mask):
    return ms_nan_to_num(scores.bfloat16().float(), mask).to(scores.dtype)


def ms_float32_scores_through_half(scores, mask):  # only the float32 case is rounded
    s = scores.half().float() if scores.dtype == torch.float32 else scores
    return ms_nan_to_num(s, mask)


@pytest.mark.parametrize("fn,phrases", [
    (ms_scores_through_half, ["scores rounded to float16", ".half()", "about 3 significant digits"]),
    (ms_scores_through_half_back_to_dtype, ["scores rounded to float16", "float64 precision"]),
    (ms_scores_through_bfloat16, ["scores rounded to bfloat16", ".bfloat16()"]),
    (ms_float32_scores_through_half, ["scores rounded to float16", "float32 precision"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_masked_softmax_names_scores_rounded_to_half(fn, phrases, rejects):
    result = rejects(check_masked_softmax, fn, *phrases)
    assert "wrong values only in rows" not in result.text()


def ms_float64_throughout(scores, mask):
    s = scores.to(torch.float64).masked_fill(~mask, float("-inf"))
    return torch.nan_to_num(torch.softmax(s, -1), nan=0.0).to(scores.dtype)


def ms_softmax_dtype_argument(scores, mask):
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1, dtype=torch.float64)
    return torch.nan_to_num(w, nan=0.0).to(scores.dtype)


def ms_logsumexp(scores, mask):
    s = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1, keepdim=True)
    return torch.where(torch.isfinite(lse), torch.exp(s - lse), torch.zeros_like(s))


def ms_additive_float_mask(scores, mask):
    bias = torch.zeros(mask.shape, dtype=scores.dtype).masked_fill(~mask, float("-inf"))
    return torch.nan_to_num(torch.softmax(scores + bias, -1), nan=0.0)


def ms_exp_of_shifted(scores, mask):
    full = torch.broadcast_to(mask, scores.shape)
    m = torch.where(full, scores, torch.full_like(scores, float("-inf"))).amax(-1, keepdim=True)
    e = torch.where(full, torch.exp(scores - m.nan_to_num(0.0, neginf=0.0)), torch.zeros_like(scores))
    total = e.sum(-1, keepdim=True)
    return e / total.clamp(min=torch.finfo(scores.dtype).tiny)


@pytest.mark.parametrize("fn", [ms_float64_throughout, ms_softmax_dtype_argument, ms_logsumexp, ms_additive_float_mask,
                                ms_exp_of_shifted])
def test_masked_softmax_accepts_wider_or_other_routes(fn, accepts):
    accepts(check_masked_softmax, fn)


# ============================================================================ red team: rounding named only when proven
def ms_scores_clamped(scores, mask):  # large scores clamped: on the ±3·10⁴ case as if rounded to float16, not rounded
    return ms_nan_to_num(scores.clamp(-1e4, 1e4), mask)


def ms_scores_clamped_to_100(scores, mask):
    return ms_nan_to_num(scores.clamp(-100.0, 100.0), mask)


@pytest.mark.parametrize("fn", [ms_scores_clamped, ms_scores_clamped_to_100])
def test_masked_softmax_does_not_call_a_clamp_rounding(fn, rejects):
    """The first float64 case passed, where float16 scores would have shown: the later match is a coincidence."""
    result = rejects(check_masked_softmax, fn)
    assert "rounded" not in result.text() and "float16" not in result.text()


# ============================================================================ round 3: float64's digits, exact zeros, sizes
def softmax_epsilon_of_a_millionth(scores, mask):
    s = scores.masked_fill(~mask, float("-inf"))
    e = torch.exp(s - s.amax(dim=-1, keepdim=True).nan_to_num(neginf=0.0))
    return e / (e.sum(dim=-1, keepdim=True) + 1e-6)  # "no 0/0": within the tolerance, not float64's digits


def softmax_float32_running_sum(scores, mask):
    s = scores.masked_fill(~mask, float("-inf"))
    e = torch.exp(s - s.amax(dim=-1, keepdim=True).nan_to_num(neginf=0.0))
    total = torch.zeros(*e.shape[:-1], 1)  # float32: made without dtype=
    for j in range(e.shape[-1]):
        total += e[..., j:j + 1]
    return (e / total).nan_to_num(0.0)


def softmax_clamped_weights(scores, mask):
    return reference_masked_softmax(scores, mask).clamp_min(1e-12)  # "so that log(weights) is finite"


def softmax_weak_fill_unless_float64(scores, mask):
    if scores.dtype == torch.float64:
        return reference_masked_softmax(scores, mask)
    return torch.softmax(scores.masked_fill(~mask, -1e4), dim=-1) * mask.any(dim=-1, keepdim=True)


@pytest.mark.parametrize("fn,phrases", [
    (softmax_epsilon_of_a_millionth, ["an epsilon added to the row sum", "about 1e-06"]),
    (softmax_float32_running_sum, ["weights not at float64 precision", "correct digits"]),
    (softmax_clamped_weights, ["blocked keys get a tiny weight, not 0", "clamped the weights to at least 1e-12"]),
    (softmax_weak_fill_unless_float64, ["weight on blocked keys", "float32"]),
    (lambda s, m: reference_masked_softmax(s, m).bfloat16().to(s.dtype), ["bfloat16 precision", "converted back"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_masked_softmax_names_lost_digits_and_tiny_weights(fn, phrases, rejects):
    rejects(check_masked_softmax, fn, *phrases)


def softmax_log_space(scores, mask):
    s = scores.masked_fill(~mask, float("-inf"))
    return torch.exp(s - torch.logsumexp(s, dim=-1, keepdim=True)).nan_to_num(0.0)  # empty rows: exp(nan) → 0


def softmax_pure_python(scores, mask):
    full = torch.broadcast_to(mask, scores.shape).reshape(-1, scores.shape[-1]).tolist()
    rows = []
    for row, keep in zip(scores.reshape(-1, scores.shape[-1]).double().tolist(), full):
        if not any(keep):
            rows.append([0.0] * len(row))
            continue
        top = max(x for x, k in zip(row, keep) if k)
        e = [math.exp(x - top) if k else 0.0 for x, k in zip(row, keep)]
        rows.append([x / math.fsum(e) for x in e])
    return torch.tensor(rows, dtype=scores.dtype).reshape(scores.shape)


def softmax_finfo_min_fill(scores, mask):
    full = torch.broadcast_to(mask, scores.shape)
    return torch.softmax(scores.masked_fill(~full, torch.finfo(scores.dtype).min), dim=-1) * full.any(-1, keepdim=True)


@pytest.mark.parametrize("fn", [softmax_log_space, softmax_pure_python, softmax_finfo_min_fill],
                         ids=lambda v: v.__name__)
def test_masked_softmax_accepts_log_space_and_loops_in_every_dtype(fn, accepts):
    accepts(check_masked_softmax, fn)


_BLOCK = torch.ones(8, 8, dtype=torch.bool).tril()  # "registered once, like a GPT's block_size buffer"


@pytest.mark.parametrize("check,fn,phrase", [
    (check_causal_mask, lambda n: _BLOCK[:n, :n], "n used only up to 8"),  # not "n is ignored": n cuts the block
    (check_padding_mask_from_lengths,
     lambda lengths, max_len=None: torch.arange(int(lengths.max()) if max_len is None else max_len,
                                                dtype=torch.uint8) < lengths.to(torch.uint8)[:, None],
     "(sequence, position)"),
])
def test_masks_past_small_sizes_are_checked(check, fn, phrase, rejects):
    rejects(check, fn, phrase)


# ============================================================================ round 4: misnamings past the cases
def softmax_blocked_set_to_tiny(scores, mask):  # the blocked weights set to 1e-30, not a clamp of the weights
    return reference_masked_softmax(scores, mask).masked_fill(~mask, 1e-30)


def test_masked_softmax_names_a_fill_of_the_blocked_weights_as_either_a_clamp_or_a_fill(rejects):
    result = rejects(check_masked_softmax, softmax_blocked_set_to_tiny, "blocked keys get a tiny weight, not 0",
                     "every blocked weight is exactly 1e-30", "or set the blocked ones to 1e-30 (masked_fill")
    assert not result.diagnosis.cause.startswith("you clamped"), result.text()


def test_causal_mask_cut_from_a_fixed_block_is_not_called_ignoring_n(rejects):
    result = rejects(check_causal_mask, lambda n: _BLOCK[:n, :n], "n used only up to 8", "fixed size 8 × 8",
                     "build the mask from the argument n")
    assert "n is ignored" not in result.text(), result.text()
