"""Checks of notebook 11 (attn_course.checks.inference): each pitfall rejected with its diagnosis, correct
alternatives accepted, and the same verdict when the grader replays the log."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.attention.bias  # noqa: F401 - causal_lower_right
import torch.nn.functional as F

from attn_course import inference as ref
from attn_course.checks.inference import (check_bottom_right_causal_mask, check_KVCache, check_merge_partials,
                                          check_sliding_window_attention, check_sliding_window_mask)
from attn_course.checks.result import Status
from tests.checks.test_voice import assert_voice


def attend_over(q, K, V, *, scale=None, dim=-1, naive=False):
    s = q @ K.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if naive:
        e = torch.exp(s)
        return (e / e.sum(-1, keepdim=True)) @ V
    return torch.softmax(s, dim=dim) @ V


# ================================================================================== KVCache: right
class CacheList:
    def __init__(self):
        self.keys, self.values = [], []

    def append(self, k, v):
        self.keys.append(k)
        self.values.append(v)
        return torch.cat(self.keys, dim=-2), torch.cat(self.values, dim=-2)

    def attend(self, q):
        K, V = torch.cat(self.keys, -2), torch.cat(self.values, -2)
        return F.scaled_dot_product_attention(q, K, V)


class CacheBuffer:
    """Pre-allocated storage that doubles when full; returns views of the filled part."""

    def __init__(self, capacity=2):
        self.capacity, self.t, self.k, self.v = capacity, 0, None, None

    def append(self, k, v):
        n = k.shape[-2]
        if self.k is None:
            self.k = k.new_zeros(*k.shape[:-2], self.capacity, k.shape[-1])
            self.v = v.new_zeros(*v.shape[:-2], self.capacity, v.shape[-1])
        while self.t + n > self.k.shape[-2]:
            self.k = torch.cat([self.k, torch.zeros_like(self.k)], dim=-2)
            self.v = torch.cat([self.v, torch.zeros_like(self.v)], dim=-2)
        self.k[..., self.t:self.t + n, :] = k
        self.v[..., self.t:self.t + n, :] = v
        self.t += n
        return self.k[..., :self.t, :], self.v[..., :self.t, :]

    def attend(self, q):
        K, V = self.k[..., :self.t, :], self.v[..., :self.t, :]
        w = torch.einsum("...qd,...kd->...qk", q, K) / q.shape[-1] ** 0.5
        return torch.einsum("...qk,...kv->...qv", w.softmax(-1), V)


class CacheManualStable:
    def __init__(self):
        self.k = self.v = None

    def append(self, k, v):
        self.k = k if self.k is None else torch.cat((self.k, k), -2)
        self.v = v if self.v is None else torch.cat((self.v, v), -2)
        return (self.k, self.v)

    def attend(self, q):
        s = q @ self.k.mT / math.sqrt(self.k.shape[-1])
        e = torch.exp(s - s.max(-1, keepdim=True).values)
        return (e / e.sum(-1, keepdim=True)) @ self.v


@pytest.mark.parametrize("cls", [ref.KVCache, CacheList, CacheBuffer, CacheManualStable])
def test_check_kvcache_accepts(cls, accepts):
    accepts(check_KVCache, cls)


# ================================================================================== KVCache: wrong
def cache_class(append_rule=None, attend_rule=None):
    """A KVCache whose append (old, new) → stored and attend (q, K, V) → out follow the given rules."""

    class Cache:
        def __init__(self):
            self.k = self.v = None

        def append(self, k, v):
            if self.k is None:
                self.k, self.v = k, v
            else:
                self.k = append_rule(self.k, k) if append_rule else torch.cat([self.k, k], -2)
                self.v = append_rule(self.v, v) if append_rule else torch.cat([self.v, v], -2)
            return self.k, self.v

        def attend(self, q):
            return attend_rule(q, self.k, self.v) if attend_rule else attend_over(q, self.k, self.v)

    return Cache


class CacheShared:
    keys, values = [], []  # class attributes: every cache shares them

    def append(self, k, v):
        self.keys.append(k)
        self.values.append(v)
        return torch.cat(self.keys, -2), torch.cat(self.values, -2)

    def attend(self, q):
        return attend_over(q, torch.cat(self.keys, -2), torch.cat(self.values, -2))


class CacheReturnsOld(ref.KVCache):
    def append(self, k, v):
        before = (self.k, self.v) if self.k is not None else (k, v)
        super().append(k, v)
        return before


class CacheReturnsNone(ref.KVCache):
    def append(self, k, v):
        super().append(k, v)


class CacheReturnsVK(ref.KVCache):
    def append(self, k, v):
        K, V = super().append(k, v)
        return V, K


class CacheAttendTuple(ref.KVCache):
    def attend(self, q):
        w = torch.softmax(q @ self.k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1)
        return w @ self.v, w


class CacheAttendSqueezed(ref.KVCache):
    def attend(self, q):
        return super().attend(q).squeeze(-2)


class CacheListsReturned(CacheList):
    def append(self, k, v):
        super().append(k, v)
        return self.keys, self.values


class CacheNeedsLength:
    def __init__(self, max_len):
        self.max_len = max_len


class CacheStackList:
    def __init__(self):
        self.keys, self.values = [], []

    def append(self, k, v):
        self.keys.append(k)
        self.values.append(v)
        return torch.stack(self.keys, -3), torch.stack(self.values, -3)

    def attend(self, q):
        return attend_over(q, torch.cat(self.keys, -2), torch.cat(self.values, -2))


@pytest.mark.parametrize("cls,phrases", [
    (cache_class(append_rule=lambda old, new: torch.cat([new, old], -2)), ["appended in the wrong order"]),
    (cache_class(append_rule=lambda old, new: torch.cat([old, new], -1)), ["wrong axis", "feature axis"]),
    (cache_class(append_rule=lambda old, new: torch.cat([old, new], 0)), ["wrong axis"]),
    (CacheReturnsOld, ["before appending"]),
    (CacheShared, ["share their storage", "__init__"]),
    (cache_class(attend_rule=lambda q, K, V: attend_over(q, K[..., :-1, :], V[..., :-1, :])), ["does not attend to itself"]),
    (cache_class(attend_rule=lambda q, K, V: attend_over(q, K, V, scale=1.0)), ["scores not scaled"]),
    (cache_class(attend_rule=lambda q, K, V: attend_over(q, K, V, scale=1 / q.shape[-1])), ["d_k instead of √d_k"]),
    (cache_class(attend_rule=lambda q, K, V: attend_over(q, K, V, dim=-2)), ["softmax over the wrong axis"]),
    (cache_class(attend_rule=lambda q, K, V: attend_over(q, K, V, naive=True)), ["no maximum subtracted"]),
    (cache_class(attend_rule=lambda q, K, V: V[..., -1:, :]), ["only to the newest token"]),
    (cache_class(attend_rule=lambda q, K, V: attend_over(q, K, K)), ["multiplied by K, not V"]),
    (CacheReturnsNone, ["append returned None", "return"]),
    (CacheReturnsVK, ["(V, K)"]),
    (CacheAttendTuple, ["2 tensors, not one", "only the attention output"]),
    (CacheAttendSqueezed, ["wrong shape", "axis of size 1 missing"]),
    (CacheNeedsLength, ["raised TypeError", "takes no arguments"]),
    (CacheStackList, ["wrong axis"]),
    (cache_class(attend_rule=lambda q, K, V: V.mean(-2, keepdim=True)), ["uniform weights"]),
    (cache_class(append_rule=lambda old, new: torch.cat([old, new], dim=2)), ["dim=-2"]),
    (CacheListsReturned, ["as a Python list", "torch.cat"]),
])
def test_check_kvcache_names_each_pitfall(cls, phrases, rejects):
    rejects(check_KVCache, cls, *phrases)


class CacheReturnsOnlyNew(ref.KVCache):
    """Stores every token (attend is right) but returns only the tokens it was just given."""

    def append(self, k, v):
        super().append(k, v)
        return k, v


def test_check_kvcache_tells_a_wrong_return_from_an_overwritten_cache(rejects):
    result = rejects(check_KVCache, CacheReturnsOnlyNew, "append returned only the new tokens",
                     "the cache itself is right", "return self.k, self.v")
    assert "overwritten" not in result.text()
    rejects(check_KVCache, cache_class(append_rule=lambda old, new: new), "cache overwritten",
            "and attend(q) sees only")
    # Only the new tokens returned and attend wrong too: neither cause is claimed, both are named as possible.
    both = cache_class(append_rule=lambda old, new: new, attend_rule=lambda q, K, V: attend_over(q, K, K))
    rejects(check_KVCache, both, "append returned only the new tokens", "cannot tell which")


def test_check_kvcache_messages_count_rows_in_good_english(rejects):
    class Shared(CacheShared):  # storage of its own, shared by its instances only: no other test touches it
        keys, values = [], []

    text = rejects(check_KVCache, Shared, "share their storage").text()
    assert "1 rows" not in text and "the 1 right ones" not in text
    assert "2 rows: the right one after 1 row never appended" in text


def test_check_kvcache_not_a_class_and_not_attempted(rejects):
    rejects(check_KVCache, ref.attention if hasattr(ref, "attention") else len, "not a class")

    class Stub:
        def __init__(self):
            pass

        def append(self, k, v):
            raise NotImplementedError()

        def attend(self, q):
            raise NotImplementedError()

    rejects(check_KVCache, Stub, "not attempted", status=Status.NOT_ATTEMPTED)


# ================================================================================== bottom-right mask
@pytest.mark.parametrize("fn", [
    ref.bottom_right_causal_mask,
    lambda n_q, n_k: torch.arange(n_k)[None, :] <= torch.arange(n_q)[:, None] + (n_k - n_q),
    lambda n_q, n_k: torch.nn.attention.bias.causal_lower_right(n_q, n_k)._materialize(),
    lambda n_q, n_k: np.tril(np.ones((n_q, n_k), dtype=bool), k=n_k - n_q),
    lambda n_q, n_k: ~torch.ones(n_q, n_k, dtype=torch.bool).triu(n_k - n_q + 1),
])
def test_check_bottom_right_accepts(fn, accepts):
    accepts(check_bottom_right_causal_mask, fn)


def looped_mask(shift):
    def fn(n_q, n_k):
        m = torch.zeros(n_q, n_k, dtype=torch.bool)
        for i in range(n_q):
            for j in range(n_k):
                m[i, j] = j <= i + n_k - n_q + shift
        return m
    return fn


@pytest.mark.parametrize("fn,phrases", [
    (lambda n_q, n_k: torch.ones(n_q, n_k, dtype=torch.bool).tril(), ["top-left alignment"]),
    (looped_mask(-1), ["off by one", "does not see itself"]),
    (looped_mask(+1), ["off by one", "one future key"]),
    (lambda n_q, n_k: torch.ones(n_q, n_k, dtype=torch.bool).tril(n_q - n_k), ["wrong sign"]),
    (lambda n_q, n_k: torch.ones(n_q, n_k, dtype=torch.bool).triu(n_k - n_q), ["upper triangle"]),
    (lambda n_q, n_k: ~torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q), ["polarity inverted"]),
    (lambda n_q, n_k: torch.ones(n_q, n_k, dtype=torch.bool), ["no mask at all"]),
    (lambda n_q, n_k: torch.ones(n_k, n_q, dtype=torch.bool).tril(n_k - n_q), ["rows and columns swapped"]),
    (lambda n_q, n_k: torch.ones(n_q, n_k).tril(n_k - n_q), ["float32, not bool", ".bool()"]),
    (lambda n_q, n_k: torch.zeros(n_q, n_k).masked_fill(~torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q),
                                                        float("-inf")), ["additive form"]),
    (lambda n_q, n_k: torch.ones(n_q, n_k, dtype=torch.long).tril(n_k - n_q), ["int64, not bool"]),
    (lambda n_q, n_k: torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)[:, :-1] if n_k > 1 else
     torch.ones(1, 1, dtype=torch.bool), ["wrong shape"]),
    (lambda n_q, n_k: torch.ones(n_q, n_k, dtype=torch.bool).tril(max(n_k - n_q - 2, -n_q)), ["wrong entries",
                                                                                             "allowed key(s) blocked"]),
    (lambda n_q, n_k: torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q).tolist(), ["Python list"]),
    (lambda n_q: None, ["raised TypeError"]),
])
def test_check_bottom_right_names_each_pitfall(fn, phrases, rejects):
    rejects(check_bottom_right_causal_mask, fn, *phrases)


def test_check_masks_name_an_all_false_mask(rejects):
    text = rejects(check_bottom_right_causal_mask, lambda n_q, n_k: torch.zeros(n_q, n_k, dtype=torch.bool),
                   "the mask blocks every key", "False everywhere").text()
    assert "same values for every" not in text
    # No known mistake keeps nothing here: what the check measured is the cause.
    rejects(check_sliding_window_mask, lambda n_q, n_k, window: torch.zeros(n_q, n_k, dtype=torch.bool),
            "the mask blocks every key", "even each query's own")
    # A known mistake that happens to give an all-False mask on some shape is still named as that mistake.
    rejects(check_bottom_right_causal_mask, lambda n_q, n_k: torch.ones(n_q, n_k, dtype=torch.bool).tril(n_q - n_k),
            "wrong sign")


def test_check_bottom_right_not_attempted(rejects, unfinished):
    rejects(check_bottom_right_causal_mask, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)


# ================================================================================== merge_partials
def merge_logaddexp(a, b):
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    m = torch.maximum(m_a, m_b)
    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    wa, wb = (m_a - safe).exp(), (m_b - safe).exp()
    return m, torch.addcmul(l_b * wb, l_a, wa), torch.addcmul(acc_b * wb, acc_a, wa)


def merge_nan_to_num(a, b):
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    m = torch.max(m_a, m_b)
    wa = torch.nan_to_num(torch.exp(m_a - m), nan=0.0)
    wb = torch.nan_to_num(torch.exp(m_b - m), nan=0.0)
    return (m, l_a * wa + l_b * wb, acc_a * wa + acc_b * wb)


def merge_list(a, b):
    return list(ref.merge_partials(a, b))


@pytest.mark.parametrize("fn", [ref.merge_partials, merge_logaddexp, merge_nan_to_num, merge_list])
def test_check_merge_accepts(fn, accepts):
    accepts(check_merge_partials, fn)


def merge_rule(rule):
    def fn(a, b):
        (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
        m = torch.maximum(m_a, m_b)
        safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        return rule(m_a, l_a, acc_a, m_b, l_b, acc_b, m, safe)
    return fn


@pytest.mark.parametrize("fn,phrases", [
    (merge_rule(lambda m_a, l_a, acc_a, m_b, l_b, acc_b, m, s: (m, l_a + l_b, acc_a + acc_b)),
     ["merge without rescaling", "exp(m_side − m)"]),
    (merge_rule(lambda m_a, l_a, acc_a, m_b, l_b, acc_b, m, s: (
        m, l_a * torch.exp(s - m_a) + l_b * torch.exp(s - m_b), acc_a * torch.exp(s - m_a) + acc_b * torch.exp(s - m_b))),
     ["wrong way round"]),
    (merge_rule(lambda m_a, l_a, acc_a, m_b, l_b, acc_b, m, s: (
        m, l_a * torch.exp(m_a - s) + l_b * torch.exp(m_b - s), acc_a + acc_b)), ["acc not rescaled"]),
    (merge_rule(lambda m_a, l_a, acc_a, m_b, l_b, acc_b, m, s: (
        m, l_a + l_b, acc_a * torch.exp(m_a - s) + acc_b * torch.exp(m_b - s))), ["l not rescaled"]),
    (merge_rule(lambda m_a, l_a, acc_a, m_b, l_b, acc_b, m, s: (
        m_a, l_a * torch.exp(m_a - s) + l_b * torch.exp(m_b - s), acc_a * torch.exp(m_a - s) + acc_b * torch.exp(m_b - s))),
     ["m not updated"]),
    (merge_rule(lambda m_a, l_a, acc_a, m_b, l_b, acc_b, m, s: (
        m, l_a * torch.exp(m_a - m) + l_b * torch.exp(m_b - m), acc_a * torch.exp(m_a - m) + acc_b * torch.exp(m_b - m))),
     ["NaN where neither chunk sees a key", "−inf − (−inf)"]),
    (merge_rule(lambda m_a, l_a, acc_a, m_b, l_b, acc_b, m, s: (
        m, l_a * torch.exp(m_a) + l_b * torch.exp(m_b), acc_a * torch.exp(m_a) + acc_b * torch.exp(m_b))),
     ["e^m instead of"]),
    (lambda a, b: ref.finish_partial(ref.merge_partials(a, b)), ["one tensor, not (m, l, acc)"]),
    (lambda a, b: (lambda m, l, acc: (m, l, acc / l))(*ref.merge_partials(a, b)), ["acc divided by l"]),
    (lambda a, b: (lambda m, l, acc: (l, m, acc))(*ref.merge_partials(a, b)), ["returned (l, m, acc)"]),
    (lambda a, b: (lambda m, l, acc: (a[0] + b[0], l, acc))(*ref.merge_partials(a, b)), ["m added"]),
    (lambda a, b: ref.merge_partials(a, b)[:2], ["did not return (m, l, acc)"]),
    (lambda a, b: (lambda m, l, acc: (torch.minimum(a[0], b[0]), l, acc))(*ref.merge_partials(a, b)), ["m:", "wrong values"]),
    (lambda a, b: ref.merge_partials(a, b)[2], ["one tensor, not (m, l, acc)", "only the merged acc"]),
    (lambda a, b: (lambda m, l, acc: (m, l, acc[..., :1]))(*ref.merge_partials(a, b)), ["wrong shape"]),
])
def test_check_merge_names_each_pitfall(fn, phrases, rejects):
    rejects(check_merge_partials, fn, *phrases)


def test_check_merge_not_attempted(rejects, unfinished):
    rejects(check_merge_partials, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)


# ================================================================================== sliding_window_mask
def window_rule(rule):
    def fn(n_q, n_k, window):
        p = torch.arange(n_q)[:, None] + n_k - n_q
        j = torch.arange(n_k)[None, :]
        return rule(p, j, window, n_q, n_k)
    return fn


@pytest.mark.parametrize("fn", [
    ref.sliding_window_mask,
    window_rule(lambda p, j, w, n_q, n_k: (j <= p) & (j > p - w)),
    window_rule(lambda p, j, w, n_q, n_k: ((p - j) >= 0) & ((p - j) < w)),
    lambda n_q, n_k, window: torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q) & ~torch.ones(
        n_q, n_k, dtype=torch.bool).tril(n_k - n_q - window),
])
def test_check_window_mask_accepts(fn, accepts):
    accepts(check_sliding_window_mask, fn)


@pytest.mark.parametrize("fn,phrases", [
    (window_rule(lambda p, j, w, n_q, n_k: (j <= p) & (j >= p - w)), ["one key too many"]),
    (window_rule(lambda p, j, w, n_q, n_k: (j <= p) & (j > p - w + 1)), ["one key too few"]),
    (lambda n_q, n_k, w: (torch.arange(n_k)[None] <= torch.arange(n_q)[:, None]) &
     (torch.arange(n_k)[None] > torch.arange(n_q)[:, None] - w), ["top-left alignment"]),
    (window_rule(lambda p, j, w, n_q, n_k: (j - p).abs() < w), ["not causal"]),
    (window_rule(lambda p, j, w, n_q, n_k: j <= p), ["window ignored"]),
    (window_rule(lambda p, j, w, n_q, n_k: (j < p) & (j > p - w - 1)), ["does not see itself"]),
    (window_rule(lambda p, j, w, n_q, n_k: ~((j <= p) & (j > p - w))), ["polarity inverted"]),
    (window_rule(lambda p, j, w, n_q, n_k: ((j <= p) & (j > p - w)).T), ["rows and columns swapped"]),
    (window_rule(lambda p, j, w, n_q, n_k: ((j <= p) & (j > p - w)).float()), ["float32, not bool"]),
    (window_rule(lambda p, j, w, n_q, n_k: (j <= p) & (j > p - 2 * w)), ["wrong entries"]),
    (window_rule(lambda p, j, w, n_q, n_k: (j <= p - 1) & (j > p - w)), ["does not see itself"]),
])
def test_check_window_mask_names_each_pitfall(fn, phrases, rejects):
    rejects(check_sliding_window_mask, fn, *phrases)


# ================================================================================== sliding_window_attention
def window_tiled(w_lo=0, causal_skip_only=False, local=False, rescale=True, divide=True, scale=None, tail=True,
                 full=False, sdpa=False, ragged=False, early=0, out_dtype=None, global_max=False, zero_init=False,
                 block_max=False, fill=-math.inf, guard=True, late=False, blocked="band", sum_reset=False,
                 q_tail=True, fixed_block=None, unaligned=False, acc_power=1):
    """A tiled sliding-window attention with switches: right with the defaults."""

    def fn(q, k, v, window, block_size):
        n = q.shape[-2]
        if sdpa:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=ref.sliding_window_mask(n, n, window))
        if full:
            s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            s = s.masked_fill(~ref.sliding_window_mask(n, n, window), float("-inf"))
            return torch.softmax(s, -1) @ v
        sc = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        block_size = fixed_block or block_size
        for qs in range(0, n if q_tail else n - n % block_size, block_size):
            qe = min(qs + block_size, n)
            qb = q[..., qs:qe, :] * sc
            m = torch.full(qb.shape[:-1] + (1,), 0.0 if zero_init else -math.inf, dtype=q.dtype)
            l = torch.zeros_like(m)
            acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
            first = max(0, qs - window + 1)
            if ragged:
                starts = [(first, qe)]
            else:
                start0 = 0 if causal_skip_only else max(0, first - early) // block_size * block_size
                if late:  # rounded up: the block holding the window's first key is skipped
                    start0 = -(-first // block_size) * block_size
                if unaligned:  # key blocks start at the window's first key, not on 09's grid
                    start0 = first
                stop = qe if tail else min(qe, n - n % block_size)
                starts = [(ks, min(ks + block_size, n)) for ks in range(start0, stop, block_size)]
            for ks, ke in starts:
                s = qb @ k[..., ks:ke, :].transpose(-2, -1)
                r, c = torch.arange(qs, qe)[:, None], torch.arange(ks, ke)[None, :]
                if local:
                    r, c = r - qs, c - ks
                hide = {"band": (c > r) | (c <= r - window + w_lo), "causal": c > r, "window": c <= r - window,
                        "edge": (c > r) | (c == r - window)}[blocked]
                s = s.masked_fill(hide, torch.finfo(q.dtype).min if fill == "finfo" else fill)
                m_new = torch.maximum(m, s.amax() if global_max else s.amax(-1, keepdim=True))
                if block_max:
                    m_new = s.amax(-1, keepdim=True)
                safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new) if guard else m_new
                alpha = torch.exp(m - safe) if rescale else torch.ones_like(m)
                p = torch.exp(s - safe)
                l = (0 if sum_reset else l * alpha) + p.sum(-1, keepdim=True)
                power = (2 if start0 > 0 else 1) if acc_power == "late" else acc_power  # "late": where blocks are skipped
                acc = acc * alpha ** power + p @ v[..., ks:ke, :]
                m = m_new
            out[..., qs:qe, :] = acc / l if divide else acc
        return out if out_dtype is None else out.to(out_dtype)

    return fn


def window_from_first_key(q, k, v, window, block_size):
    """Key blocks that start at the window's first key and stop at the query block's end (the last one shorter):
    what the docstring allows besides 09's grid."""
    n, scale = q.shape[-2], 1 / math.sqrt(q.shape[-1])
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, block_size):
        qe = min(qs + block_size, n)
        qb = q[..., qs:qe, :] * scale
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l, acc = torch.zeros_like(m), torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(max(0, qs - window + 1), qe, block_size):
            ke = min(ks + block_size, qe)
            r, c = torch.arange(qs, qe)[:, None], torch.arange(ks, ke)[None, :]
            s = (qb @ k[..., ks:ke, :].mT).masked_fill((c > r) | (c <= r - window), -math.inf)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            alpha, p = torch.exp(m - safe), torch.exp(s - safe)
            l, acc, m = l * alpha + p.sum(-1, keepdim=True), acc * alpha + p @ v[..., ks:ke, :], m_new
        out[..., qs:qe, :] = acc / l
    return out


def window_rowwise(q, k, v, window, block_size):
    """One query at a time over exactly its window: fewer FLOPs than tiles, but no (block, block) tile at all."""
    n, out = q.shape[-2], []
    for i in range(n):
        lo = max(0, i - window + 1)
        s = q[..., i:i + 1, :] @ k[..., lo:i + 1, :].transpose(-2, -1) / math.sqrt(q.shape[-1])
        out.append(torch.softmax(s, -1) @ v[..., lo:i + 1, :])
    return torch.cat(out, -2)


@pytest.mark.parametrize("fn", [ref.sliding_window_attention, window_tiled(), window_tiled(fill=-1e4),
                                window_tiled(fill="finfo"), window_tiled(unaligned=True), window_from_first_key])
def test_check_window_attention_accepts(fn, accepts):
    accepts(check_sliding_window_attention, fn)


@pytest.mark.parametrize("fn,phrases", [
    (window_tiled(w_lo=-1), ["one key too many"]),
    (window_tiled(w_lo=1), ["one key too few"]),
    (window_tiled(local=True), ["positions inside the tile"]),
    (window_tiled(rescale=False), ["rescaled"]),
    (window_tiled(divide=False), ["no final division"]),
    (window_tiled(scale=1.0), ["scores not scaled"]),
    (window_tiled(tail=False), ["last key block dropped"]),
    (window_tiled(causal_skip_only=True), ["blocks outside the window are computed"]),
    (window_tiled(early=1), ["blocks outside the window are computed"]),
    (window_tiled(out_dtype=torch.float32), ["result in float32"]),
    (window_tiled(global_max=True), ["one running maximum for all rows"]),
    (window_tiled(zero_init=True), ["running maximum started at 0"]),
    (window_tiled(block_max=True), ["the block's maximum instead of the running maximum"]),
    (window_tiled(full=True), ["full n × n score matrix"]),
    (window_tiled(sdpa=True), ["calls F.scaled_dot_product_attention"]),
    (lambda q, k, v, window, block_size: ref.masked_attention(q, k, v, ref.bottom_right_causal_mask(
        q.shape[-2], q.shape[-2])), ["window ignored"]),
    (lambda q, k, v, window, block_size: ref.masked_attention(q, k, q, ref.sliding_window_mask(
        q.shape[-2], q.shape[-2], window)), ["as wide as q"]),
    (window_rowwise, ["not computed in (block_size, block_size) tiles", "row by row"]),
    (window_tiled(ragged=True), ["not computed in (block_size, block_size) tiles", "slab"]),
    (window_tiled(fixed_block=64), ["not computed in (block_size, block_size) tiles", "block_size is ignored"]),
    (window_tiled(guard=False), ["NaN where a row sees no key of a whole tile"]),
    (window_tiled(late=True), ["a key block inside the window skipped"]),
    (window_tiled(blocked="causal"), ["window not applied inside the tiles"]),
    (window_tiled(blocked="window"), ["keys after the query not masked"]),
    (window_tiled(sum_reset=True), ["running sum restarted in every block"]),
    (window_tiled(q_tail=False), ["last, shorter query block", "not a multiple of block_size"]),
])
@pytest.mark.slow
def test_check_window_attention_names_each_pitfall(fn, phrases, rejects):
    rejects(check_sliding_window_attention, fn, *phrases)


def test_check_window_attention_not_attempted(rejects, unfinished):
    rejects(check_sliding_window_attention, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)


# ================================================================================== ports of common code
class CacheHuggingFaceStyle:
    """Hugging Face's DynamicCache.update, for one layer: cat along -2, return the whole cache."""

    def __init__(self):
        self.key_cache, self.value_cache = [], []

    def append(self, k, v):
        if not self.key_cache:
            self.key_cache.append(k)
            self.value_cache.append(v)
        else:
            self.key_cache[0] = torch.cat([self.key_cache[0], k], dim=-2)
            self.value_cache[0] = torch.cat([self.value_cache[0], v], dim=-2)
        return self.key_cache[0], self.value_cache[0]

    def attend(self, q):
        return F.scaled_dot_product_attention(q, self.key_cache[0], self.value_cache[0])


class CachePreallocated:
    def __init__(self, max_len=64):
        self.max_len, self.k, self.t = max_len, None, 0

    def append(self, k, v):
        n = k.shape[-2]
        if self.k is None:
            self.k = k.new_zeros(*k.shape[:-2], self.max_len, k.shape[-1])
            self.v = v.new_zeros(*v.shape[:-2], self.max_len, v.shape[-1])
        if self.t + n > self.k.shape[-2]:  # full: a buffer twice as large (or enough for the prompt)
            size = max(2 * self.k.shape[-2], self.t + n)
            self.k = torch.cat([self.k, self.k.new_zeros(*k.shape[:-2], size - self.k.shape[-2], k.shape[-1])], -2)
            self.v = torch.cat([self.v, self.v.new_zeros(*v.shape[:-2], size - self.v.shape[-2], v.shape[-1])], -2)
        self.k[..., self.t:self.t + n, :], self.v[..., self.t:self.t + n, :] = k, v
        self.t += n
        return self.k[..., :self.t, :], self.v[..., :self.t, :]

    def attend(self, q):
        K, V = self.k[..., :self.t, :], self.v[..., :self.t, :]
        return torch.softmax(q @ K.transpose(-1, -2) / q.shape[-1] ** 0.5, -1) @ V


@pytest.mark.parametrize("cls", [CacheHuggingFaceStyle, CachePreallocated])
def test_ported_caches_are_accepted(cls, accepts):
    accepts(check_KVCache, cls)


class CacheFixed64(CachePreallocated):
    def append(self, k, v):  # a buffer of 64 slots that never grows
        if self.k is None:
            self.k = k.new_zeros(*k.shape[:-2], 64, k.shape[-1])
            self.v = v.new_zeros(*v.shape[:-2], 64, v.shape[-1])
        n = k.shape[-2]
        self.k[..., self.t:self.t + n, :], self.v[..., self.t:self.t + n, :] = k, v
        self.t += n
        return self.k[..., :self.t, :], self.v[..., :self.t, :]


class CacheFixed1024Narrowed(CachePreallocated):
    def append(self, k, v):  # 1,024 slots, written with narrow, never grown
        if self.k is None:
            self.k = torch.zeros(*k.shape[:-2], 1024, k.shape[-1], dtype=k.dtype)
            self.v = torch.zeros(*v.shape[:-2], 1024, v.shape[-1], dtype=v.dtype)
        self.k.narrow(-2, self.t, k.shape[-2]).copy_(k)
        self.v.narrow(-2, self.t, v.shape[-2]).copy_(v)
        self.t += k.shape[-2]
        return self.k.narrow(-2, 0, self.t), self.v.narrow(-2, 0, self.t)

    def attend(self, q):
        K, V = self.k.narrow(-2, 0, self.t), self.v.narrow(-2, 0, self.t)
        return torch.softmax(q @ K.mT / math.sqrt(q.shape[-1]), -1) @ V


class CacheFixed2048TokenByToken(CachePreallocated):
    def append(self, k, v):  # one token at a time into 2,048 slots
        if self.k is None:
            self.k = k.new_zeros(*k.shape[:-2], 2048, k.shape[-1])
            self.v = v.new_zeros(*v.shape[:-2], 2048, v.shape[-1])
        for i in range(k.shape[-2]):
            self.k[..., self.t, :], self.v[..., self.t, :] = k[..., i, :], v[..., i, :]
            self.t += 1
        return self.k[..., :self.t, :], self.v[..., :self.t, :]


@pytest.mark.parametrize("cls, slots", [(CacheFixed64, "64"), (CacheFixed1024Narrowed, "1024"),
                                        (CacheFixed2048TokenByToken, "2048")])
def test_kv_cache_names_a_fixed_buffer_that_cannot_hold_a_long_prompt(cls, slots, rejects):
    """The docstring's cache keeps every token: a buffer with a fixed number of slots (here up to 2,048; the check's
    longest sequence has 4,100 tokens) fails by name, with the size it had."""
    assert_voice(rejects(check_KVCache, cls, f"a buffer of {slots} slots that never grows", "4,096 new tokens",
                         "allocate a larger one"))


class CacheTransposeFromFront(ref.KVCache):
    def attend(self, q):
        return torch.softmax(q @ self.k.transpose(2, 3) / math.sqrt(q.shape[-1]), -1) @ self.v


class CacheReturnsKK(ref.KVCache):
    def append(self, k, v):
        K, _ = super().append(k, v)
        return K, K


@pytest.mark.parametrize("cls,phrases", [
    (CacheTransposeFromFront, ["raised IndexError", "transpose(-2, -1)"]),
    (CacheReturnsKK, ["keys as V"]),
])
def test_check_kvcache_more_pitfalls(cls, phrases, rejects):
    rejects(check_KVCache, cls, *phrases)


def test_masks_built_from_a_square_one(accepts, rejects):
    accepts(check_bottom_right_causal_mask, lambda n_q, n_k: torch.ones(n_k, n_k, dtype=torch.bool).tril()[-n_q:])
    rejects(check_bottom_right_causal_mask, lambda n_q, n_k: torch.ones(n_k, n_k, dtype=torch.bool).tril()[:n_q],
            "top-left alignment")
    accepts(check_sliding_window_mask,
            lambda n_q, n_k, w: torch.ones(n_k, n_k, dtype=torch.bool).tril().triu(-(w - 1))[-n_q:])
    rejects(check_sliding_window_mask,
            lambda n_q, n_k, w: torch.ones(n_k, n_k, dtype=torch.bool).tril().triu(-w)[-n_q:], "one key too many")


# ================================================================================== found by an independent red team
class CacheRing8:
    """A fixed buffer of 8 slots: the ninth token overwrites the first."""

    def __init__(self):
        self.k = self.v = None
        self.t = 0

    def append(self, k, v):
        if self.k is None:
            self.k = k.new_zeros(*k.shape[:-2], 8, k.shape[-1])
            self.v = v.new_zeros(*v.shape[:-2], 8, v.shape[-1])
        slots = [(self.t + i) % 8 for i in range(k.shape[-2])]
        self.k[..., slots, :], self.v[..., slots, :] = k, v
        self.t += k.shape[-2]
        return self.k[..., :min(self.t, 8), :], self.v[..., :min(self.t, 8), :]

    def attend(self, q):
        K, V = self.k[..., :min(self.t, 8), :], self.v[..., :min(self.t, 8), :]
        return attend_over(q, K, V)


class CachePromptFirstOnly(ref.KVCache):
    def append(self, k, v):
        return super().append(k[..., :1, :], v[..., :1, :])


class CacheFloat32(ref.KVCache):
    def append(self, k, v):
        return super().append(k.float(), v.float())

    def attend(self, q):
        return super().attend(q.float())


class CacheKeepsLastOfMany(ref.KVCache):  # several new tokens on a filled cache: only the last one kept
    def append(self, k, v):
        started = getattr(self, "_started", False)
        self._started = True
        return super().append(k[..., -1:, :], v[..., -1:, :]) if started and k.shape[-2] > 1 else super().append(k, v)


@pytest.mark.parametrize("cls,phrases", [
    (CacheRing8, ["holds 8 of the 9 tokens", "stopped growing"]),
    (CachePromptFirstOnly, ["append kept only the first of several new tokens"]),
    (CacheFloat32, ["computed in float32, not float64"]),
    (cache_class(attend_rule=lambda q, K, V: (q @ K.mT / math.sqrt(q.shape[-1])) @ V), ["no softmax"]),
    (cache_class(attend_rule=lambda q, K, V: attend_over(q, K, V, scale=1 / math.sqrt(V.shape[-1]))), ["√d_v"]),
    (cache_class(attend_rule=lambda q, K, V: torch.softmax(q @ K.T / math.sqrt(q.shape[-1]), -1) @ V),
     ["raised RuntimeError", "K.T reverses every axis"]),
    (cache_class(attend_rule=lambda q, K, V: torch.softmax(q @ V.mT / math.sqrt(q.shape[-1]), -1) @ V),
     ["scores with V instead of K"]),
    (cache_class(attend_rule=lambda q, K, V: attend_over(q, K, V).float()), ["computed in float32"]),
    (cache_class(attend_rule=lambda q, K, V: attend_over(q.double(), K.double(), V.double())),
     ["attend's output in float64, not float32"]),
    (cache_class(attend_rule=lambda q, K, V: attend_over(q.float(), K.float(), V.float()).to(q.dtype)),
     ["float64 input, float32 precision"]),
    (CacheKeepsLastOfMany, ["the returned K holds"]),
])
@pytest.mark.filterwarnings("ignore:The use of `x.T`:UserWarning")
def test_check_kvcache_red_team_pitfalls(cls, phrases, rejects):
    rejects(check_KVCache, cls, *phrases)


def test_check_kvcache_tells_top_left_from_a_missing_self(rejects):
    """On the second token both leave the query with key 0 only; the third token tells them apart."""
    result = rejects(check_KVCache, cache_class(attend_rule=lambda q, K, V: F.scaled_dot_product_attention(
        q, K, V, is_causal=True)), "top-left alignment")
    assert "attend to itself" not in result.text()
    result = rejects(check_KVCache, cache_class(attend_rule=lambda q, K, V: attend_over(q, K[..., :-1, :], V[..., :-1, :])
                                                if K.shape[-2] > 1 else torch.zeros_like(q[..., :V.shape[-1]])),
                     "does not attend to itself")
    assert "top-left" not in result.text()
    # the same with a guard that lets a lone first token see itself: right at t = 1, so told apart at t = 3
    result = rejects(check_KVCache, cache_class(attend_rule=lambda q, K, V: attend_over(q, K[..., :-1, :], V[..., :-1, :])
                                                if K.shape[-2] > 1 else attend_over(q, K, V)),
                     "does not attend to itself")
    assert "top-left" not in result.text()


def merge_ties_drop_b(a, b):  # equal maxima: side b dropped (a "winner" test with > on both sides)
    m, l, acc = ref.merge_partials(a, b)
    tie = a[0] == b[0]
    return m, torch.where(tie, a[1], l), torch.where(tie, a[2], acc)


@pytest.mark.parametrize("fn,phrases", [
    (merge_rule(lambda m_a, l_a, acc_a, m_b, l_b, acc_b, m, s: (
        m, torch.where(m_a >= m_b, l_a, l_b), torch.where(m_a >= m_b, acc_a, acc_b))), ["only the side with the larger"]),
    (merge_rule(lambda m_a, l_a, acc_a, m_b, l_b, acc_b, m, s: (m, (l_a + l_b) / 2, (acc_a + acc_b) / 2)), ["averaged"]),
    (merge_rule(lambda m_a, l_a, acc_a, m_b, l_b, acc_b, m, s: (
        m, l_a * torch.exp(m_b - s) + l_b * torch.exp(m_a - s), acc_a * torch.exp(m_b - s) + acc_b * torch.exp(m_a - s))),
     ["the other side's factor"]),
    (merge_rule(lambda m_a, l_a, acc_a, m_b, l_b, acc_b, m, s: (
        m, l_a * torch.exp2(m_a - s) + l_b * torch.exp2(m_b - s), acc_a * torch.exp2(m_a - s) + acc_b * torch.exp2(m_b - s))),
     ["2^(m_side − m)"]),
    (lambda a, b: (lambda m, l, acc: (torch.nan_to_num(m), l, acc))(*ref.merge_partials(a, b)), ["m is not −inf"]),
    (lambda a, b: (lambda m, l, acc: (torch.logaddexp(a[0], b[0]), l, acc))(*ref.merge_partials(a, b)), ["m:"]),
    (lambda a, b: (lambda m, l, acc: (acc, l, m))(*ref.merge_partials(a, b)), ["returned (acc, l, m)"]),
    (lambda a, b: (a[0], a[1] + b[1] * torch.exp(b[0] - a[0]), a[2] + b[2] * torch.exp(b[0] - a[0])),
     ["m not updated to the larger maximum"]),
    (lambda a, b: tuple(t.float() for t in ref.merge_partials(a, b)), ["computed in float32"]),
    (lambda a, b: ref.merge_partials(tuple(t.double() for t in a), tuple(t.double() for t in b)),
     ["in float64, not float32", "convert the result back"]),
    (lambda a, b: tuple(t.to(a[0].dtype) for t in ref.merge_partials(tuple(t.float() for t in a),
                                                                      tuple(t.float() for t in b))),
     ["float64 input, float32 precision"]),
    (merge_ties_drop_b, ["l:"]),
])
def test_check_merge_red_team_pitfalls(fn, phrases, rejects):
    rejects(check_merge_partials, fn, *phrases)


# ================================================================================== what the checks measure
@pytest.mark.parametrize("check,fn,phrases", [
    (check_sliding_window_mask, lambda n_q, n_k, w: torch.arange(n_k, n_k - n_q)[:, None] > torch.arange(n_k)[None],
     ["raised RuntimeError", "torch.arange(start, end) got start > end"]),
    (check_sliding_window_attention, window_tiled(fixed_block=2.0), ["raised TypeError", "a float where Python needs an"]),
    (check_merge_partials, lambda a, b: ref.merge_partials(a, b)[:2] + (a[2] * (b[0] > a[0]) - (a[0] > b[0]),),
     ["raised RuntimeError", "a `-` met a bool tensor"]),
])
def test_exceptions_this_notebook_makes_certain_are_explained(check, fn, phrases, rejects):
    rejects(check, fn, *phrases)


def test_masks_say_what_a_wrong_row_sees(rejects):
    rejects(check_sliding_window_mask, lambda n_q, n_k, w: torch.ones(n_k, n_k, dtype=torch.bool).tril()[n_q:],
            "wrong shape (7, 10)", "7 rows = n_k − n_q where the n_q = 3 queries need 3")
    rejects(check_sliding_window_mask, window_rule(lambda p, j, w, n_q, n_k: (j > p) & (j < p + w)),
            "wrong entries", "lets query 0 (position 7) see keys 8 … 9, where it may see keys 4 … 7")


def merge_factors(l_rule):
    """The right merge except l, computed by ``l_rule(l_a, alpha, l_b, beta)``."""
    def fn(a, b):
        m, _, acc = ref.merge_partials(a, b)
        s = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        return m, l_rule(a[1], torch.exp(a[0] - s), b[1], torch.exp(b[0] - s)), acc
    return fn


@pytest.mark.parametrize("fn,phrases", [
    (merge_factors(lambda la, al, lb, be: la * al + lb * torch.log(be)), ["multiplies part b's l by -2, 0, 0",
                                                                           "the exp is missing"]),
    (merge_factors(lambda la, al, lb, be: al + lb * be), ["part a's l by 0, 0, 0", "adds 1, 0.1353, 1 to l"]),
    (merge_factors(lambda la, al, lb, be: la * al + lb / be), ["part b's l by 7.389, 1, 1", "the inverse"]),
    (lambda a, b: (b[0],) + ref.merge_partials(a, b)[1:], ["your m equals part b's m_b in every row"]),
])
def test_merge_measures_the_factor_each_side_gets(fn, phrases, rejects):
    rejects(check_merge_partials, fn, *phrases)


@pytest.mark.parametrize("fn,phrases", [
    (window_tiled(w_lo=-2), ["query 3's output is attention over keys 0 … 3", "where it may see keys 1 … 3"]),
    (window_tiled(scale=0.3), ["wrong even on one tile and no window"]),
    (window_tiled(blocked="edge"), ["right on one tile and no window", "but wrong on one tile with window 3"]),
    (window_tiled(acc_power=2), ["blocks of 4 and no window", "what changes with several blocks"]),
    (window_tiled(acc_power="late"), ["wrong only where tiles and the window meet"]),
])
def test_window_attention_measures_where_it_goes_wrong(fn, phrases, rejects):
    rejects(check_sliding_window_attention, fn, *phrases)


# ================================================================================== branches the tests above leave out
class CacheAttendUnfinished(ref.KVCache):
    """append returns the tokens it was given; attend, not finished yet, raises: the check cannot ask attend which
    of the two append mistakes it is."""

    def append(self, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], -2)
        self.v = v if self.v is None else torch.cat([self.v, v], -2)
        return k, v

    def attend(self, q):
        return attend_over(q, self.keys, self.values)  # attributes named differently in append


def test_check_kvcache_only_new_tokens_returned_and_attend_raising(rejects):
    rejects(check_KVCache, CacheAttendUnfinished, "append returned only the new tokens", "cannot tell which")


def merge_weighted_outputs(a, b):
    """The merge of two *normalised* outputs (weighted by l·exp(m_side − m)) applied to the accumulators."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    m = torch.maximum(m_a, m_b)
    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    wa, wb = l_a * torch.exp(m_a - safe), l_b * torch.exp(m_b - safe)
    l = wa + wb
    return m, l, (wa * acc_a + wb * acc_b) / l


def merge_nan_fixed_in_l_only(a, b):
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    m = torch.maximum(m_a, m_b)
    wa, wb = torch.exp(m_a - m), torch.exp(m_b - m)  # NaN where m_a = m_b = −inf
    return m, torch.nan_to_num(l_a * wa + l_b * wb), acc_a * wa + acc_b * wb


@pytest.mark.parametrize("fn,phrases", [
    (merge_weighted_outputs, ["acc: wrong values"]),
    (merge_nan_fixed_in_l_only, ["acc: NaN in the result", "NaN where a chunk sees no key", "exp(−inf − (−inf))"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_check_merge_measures_what_no_known_mistake_explains(fn, phrases, rejects):
    result = rejects(check_merge_partials, fn, *phrases)
    if fn is merge_weighted_outputs:  # acc is not affine in the sums: no factor is read off (nor claimed)
        assert "multiplies part" not in result.text()


# ================================================================================== inputs changed in place
class CacheScalesQInPlace(ref.KVCache):
    def attend(self, q):
        q /= math.sqrt(q.shape[-1])  # scaled once, in place: the caller's query changes
        return torch.softmax(q @ self.k.mT, dim=-1) @ self.v


def merge_into_a(a, b):  # right values, but part a's l and acc are rescaled in place and returned
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    m = torch.maximum(m_a, m_b)
    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    alpha, beta = torch.exp(m_a - safe), torch.exp(m_b - safe)
    l_a.mul_(alpha).add_(l_b * beta)
    acc_a.mul_(alpha).add_(acc_b * beta)
    return m, l_a, acc_a


def merge_scales_b_in_place(a, b):  # right values, but part b's sums are rescaled in place
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    m = torch.maximum(m_a, m_b)
    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    alpha, beta = torch.exp(m_a - safe), torch.exp(m_b - safe)
    l_b *= beta
    acc_b *= beta
    return m, l_a * alpha + l_b, acc_a * alpha + acc_b


def window_scales_q_in_place(q, k, v, window, block_size):
    q *= 1 / math.sqrt(q.shape[-1])  # the scale applied once, up front, to the caller's q
    return window_tiled(scale=1.0)(q, k, v, window, block_size)


@pytest.mark.parametrize("check,fn,phrases", [
    (check_KVCache, CacheScalesQInPlace, ["q changed in place", "attend(q)"]),
    (check_merge_partials, merge_into_a, ["part_a changed in place"]),
    (check_merge_partials, merge_scales_b_in_place, ["part_b changed in place"]),
    (check_sliding_window_attention, window_scales_q_in_place, ["q changed in place"]),
])
def test_checks_reject_an_input_changed_in_place(check, fn, phrases, rejects):
    """The docstrings say the inputs are left unchanged: right values that overwrite an input are rejected."""
    rejects(check, fn, "changed in place", *phrases)


# ============================================================================ audit D: named for what they did
class CacheScalesKInPlace(ref.KVCache):
    def append(self, k, v):
        k *= 1 / math.sqrt(k.shape[-1])  # the caller's keys scaled once, in place, then cached
        return super().append(k, v)

    def attend(self, q):
        return torch.softmax(q @ self.k.mT, dim=-1) @ self.v  # already scaled


def test_a_cache_returning_keys_it_scaled_in_place_is_named_in_place(rejects):
    """Attend is right, the returned K is k/√d_k: the cause is the caller's k changed in place, not a factor."""
    d = rejects(check_KVCache, CacheScalesKInPlace, "k changed in place").diagnosis
    assert "off by a factor" not in d.summary, d


def window_arguments_swapped(q, k, v, block_size, window):  # the last two parameters in the other order
    return ref.sliding_window_attention(q, k, v, window, block_size)


def window_mask_n_q_as_window(n_q, n_k, window):  # n_q where window belongs
    p = torch.arange(n_k - n_q, n_k)[:, None]
    j = torch.arange(n_k)[None, :]
    return (j <= p) & (j > p - n_q)


@pytest.mark.parametrize("check, fn", [(check_sliding_window_attention, window_arguments_swapped),
                                       (check_sliding_window_mask, window_mask_n_q_as_window)])
def test_a_row_that_fits_one_case_by_chance_is_not_named(check, fn, rejects):
    """window = 3 with block_size = 4 (or n_q = 3 with window = 4) looks like "one key too many (few)" on the first
    case only: a known mistake is named when it also fits the answer's other wrong cases."""
    d = rejects(check, fn).diagnosis
    assert "window off by one" not in d.summary, d
    assert "query 3" in d.cause or "query 0" in d.cause, d


# ========================================================================= preallocated buffers, rows never written
class CacheAttendsWholeBuffer(CachePreallocated):
    def attend(self, q):  # the whole buffer: its unfilled zero slots too
        return torch.softmax(q @ self.k.transpose(-1, -2) / q.shape[-1] ** 0.5, -1) @ self.v


class CacheDoublingAttendsWholeBuffer(CacheBuffer):
    def attend(self, q):
        return F.scaled_dot_product_attention(q, self.k, self.v)


class CacheReturnsWholeBuffer(CachePreallocated):
    def append(self, k, v):
        super().append(k, v)
        return self.k, self.v


@pytest.mark.parametrize("cls,phrases", [
    (CacheAttendsWholeBuffer, ["attended over unfilled zero slots of the buffer", "plus 63 slots"]),
    (CacheDoublingAttendsWholeBuffer, ["attended over unfilled zero slots of the buffer", "plus 1 slot whose"]),
    (CacheReturnsWholeBuffer, ["the returned K includes the buffer's unfilled slots", "63 rows of zeros"]),
])
def test_check_kvcache_names_unfilled_buffer_slots(cls, phrases, rejects):
    assert_voice(rejects(check_KVCache, cls, *phrases))


class CacheFilledLength(CachePreallocated):
    def attend(self, q):
        return F.scaled_dot_product_attention(q, self.k[..., :self.t, :], self.v[..., :self.t, :])


class CacheNarrowed:
    def __init__(self):
        self.k = self.v = None
        self.t = 0

    def append(self, k, v):
        if self.k is None:
            self.k = torch.zeros(*k.shape[:-2], 128, k.shape[-1], dtype=k.dtype)
            self.v = torch.zeros(*v.shape[:-2], 128, v.shape[-1], dtype=v.dtype)
        while self.t + k.shape[-2] > self.k.shape[-2]:  # full: twice the slots, the cached tokens copied over
            self.k, self.v = (torch.cat([x, torch.zeros_like(x)], -2) for x in (self.k, self.v))
        self.k.narrow(-2, self.t, k.shape[-2]).copy_(k)
        self.v.narrow(-2, self.t, v.shape[-2]).copy_(v)
        self.t += k.shape[-2]
        return self.k.narrow(-2, 0, self.t), self.v.narrow(-2, 0, self.t)

    def attend(self, q):
        K, V = self.k.narrow(-2, 0, self.t), self.v.narrow(-2, 0, self.t)
        return torch.softmax(torch.einsum("...qd,...kd->...qk", q, K) / math.sqrt(q.shape[-1]), -1) @ V


class CacheMaskedBuffer(CachePreallocated):
    def attend(self, q):  # the whole buffer, but its unfilled slots masked out
        filled = (torch.arange(self.k.shape[-2]) < self.t)[None, :]  # (1, capacity): one query row
        return F.scaled_dot_product_attention(q, self.k, self.v, attn_mask=filled)


class CacheTupleList:
    def __init__(self):
        self.items = []

    def append(self, k, v):
        self.items.append((k, v))
        return torch.cat([a for a, _ in self.items], -2), torch.cat([b for _, b in self.items], -2)

    def attend(self, q):
        K, V = (torch.cat(x, -2) for x in zip(*self.items))
        w = torch.softmax((q / math.sqrt(q.shape[-1])) @ K.mT, dim=-1)
        return w @ V


class CacheLogSumExp(CacheManualStable):
    def attend(self, q):
        s = q @ self.k.mT / math.sqrt(self.k.shape[-1])
        return torch.exp(s - torch.logsumexp(s, -1, keepdim=True)) @ self.v


@pytest.mark.parametrize("cls", [CacheFilledLength, CacheNarrowed, CacheMaskedBuffer, CacheTupleList, CacheLogSumExp])
def test_check_kvcache_accepts_more_buffers(cls, accepts):
    accepts(check_KVCache, cls)


def _window_rows(alloc, starts):
    """A tiled sliding-window attention whose query loop visits the blocks ``starts(n, b)`` of an ``alloc`` output."""
    def sliding_window_attention(q, k, v, window, block_size):
        n, b = q.shape[-2], block_size
        out = alloc(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for qs in starts(n, b):
            qe = min(qs + b, n)
            qb = q[..., qs:qe, :] / math.sqrt(q.shape[-1])
            m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
            l, acc = torch.zeros_like(m), torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
            for ks in range(max(0, qs - window + 1) // b * b, qe, b):
                ke = min(ks + b, n)
                r, c = torch.arange(qs, qe)[:, None], torch.arange(ks, ke)[None, :]
                s = (qb @ k[..., ks:ke, :].mT).masked_fill((c > r) | (c <= r - window), -math.inf)
                m_new = torch.maximum(m, s.amax(-1, keepdim=True))
                safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
                alpha, p = torch.exp(m - safe), torch.exp(s - safe)
                l, acc, m = l * alpha + p.sum(-1, keepdim=True), acc * alpha + p @ v[..., ks:ke, :], m_new
            out[..., qs:qe, :] = acc / l
        return out
    return sliding_window_attention


@pytest.mark.parametrize("fn,phrases", [
    (_window_rows(torch.zeros, lambda n, b: range(b, n, b)), ["output rows never written (0, 1, 2, 3)", "are 0"]),
    (_window_rows(torch.zeros, lambda n, b: range(0, n, 2 * b)), ["output rows never written (4, 5, 6, 7)"]),
    (_window_rows(torch.zeros, lambda n, b: range(2 * b, n, b)), ["output rows never written (0, 1, 2, 3, 4, 5…)"]),
])
def test_window_attention_names_rows_never_written(fn, phrases, rejects):
    assert_voice(rejects(check_sliding_window_attention, fn, *phrases))


@pytest.mark.parametrize("fn", [
    _window_rows(torch.empty, lambda n, b: range(0, n, b)),
    _window_rows(torch.zeros, lambda n, b: range(0, n, b)),
    _window_rows(lambda shape, dtype: torch.full(shape, math.nan, dtype=dtype), lambda n, b: range(0, n, b)),
    _window_rows(torch.ones, lambda n, b: reversed(range(0, n, b))),
    _window_rows(torch.zeros, lambda n, b: [s for s in range(0, n, b) if s % (2 * b) == 0]
                 + [s for s in range(0, n, b) if s % (2 * b)]),
])
def test_window_attention_accepts_any_block_order_and_buffer(fn, accepts):
    accepts(check_sliding_window_attention, fn)


# ============================================== red team: causes that only look like unfilled slots or unwritten rows
class CachePlusOneDenominator(CacheManualStable):
    def attend(self, q):  # e / (Σe + 1): the output of one zero slot at every step, yet no buffer
        e = torch.exp(q @ self.k.mT / math.sqrt(q.shape[-1]))
        return e @ self.v / (e.sum(-1, keepdim=True) + 1)


def test_check_kvcache_does_not_name_slots_for_a_constant_extra_term(rejects):
    d = rejects(check_KVCache, CachePlusOneDenominator).diagnosis
    assert "unfilled" not in d.summary and "slot" not in d.cause, d


def _window_no_max_zeroed(q, k, v, window, block_size):
    """No running max; overflowing rows (inf / inf) zeroed by torch.nan_to_num: rows written, yet 0."""
    n, b = q.shape[-2], block_size
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, b):
        qe = min(qs + b, n)
        qb = q[..., qs:qe, :] / math.sqrt(q.shape[-1])
        l, acc = torch.zeros(qb.shape[:-1] + (1,), dtype=q.dtype), torch.zeros(qb.shape[:-1] + (v.shape[-1],),
                                                                                 dtype=q.dtype)
        for ks in range(max(0, qs - window + 1) // b * b, qe, b):
            ke = min(ks + b, n)
            r, c = torch.arange(qs, qe)[:, None], torch.arange(ks, ke)[None, :]
            p = torch.exp((qb @ k[..., ks:ke, :].mT).masked_fill((c > r) | (c <= r - window), -math.inf))
            l, acc = l + p.sum(-1, keepdim=True), acc + p @ v[..., ks:ke, :]
        out[..., qs:qe, :] = torch.nan_to_num(acc / l, nan=0.0, posinf=0.0, neginf=0.0)
    return out


def test_window_attention_does_not_call_overflowed_rows_unwritten(rejects):
    d = rejects(check_sliding_window_attention, _window_no_max_zeroed).diagnosis
    assert "never written" not in d.summary and "never writes" not in d.cause, d


# ================================== red team: zero rows that are no buffer, no other cache; a row of 0 by chance
class CachePadsOneZeroRow(ref.KVCache):
    def append(self, k, v):  # no buffer: one all-zero row added to K at every return
        K, V = super().append(k, v)
        return torch.cat([K, K.new_zeros(*K.shape[:-2], 1, K.shape[-1])], -2), V


class CacheStartsWithZeros:
    def __init__(self):
        self.k = self.v = None

    def append(self, k, v):
        if self.k is None:  # storage that starts as one all-zero token, not empty
            self.k = torch.zeros(1, k.shape[-1], dtype=k.dtype).expand(*k.shape[:-2], 1, k.shape[-1])
            self.v = torch.zeros(1, v.shape[-1], dtype=v.dtype).expand(*v.shape[:-2], 1, v.shape[-1])
        self.k, self.v = torch.cat([self.k, k], -2), torch.cat([self.v, v], -2)
        return self.k, self.v

    def attend(self, q):
        return F.scaled_dot_product_attention(q, self.k, self.v)


def test_check_kvcache_names_zero_rows_only_as_what_they_are(rejects):
    d = rejects(check_KVCache, CachePadsOneZeroRow).diagnosis
    assert "buffer" not in d.summary + d.cause and "unfilled" not in d.summary, d
    result = rejects(check_KVCache, CacheStartsWithZeros, "starts with an extra all-zero token", "1 row of zeros",
                     "self.k = self.v = None")
    assert "another cache" not in result.text() and "share" not in result.text(), result.text()
    assert_voice(result)


def _window_zero_max_nan_to_num(q, k, v, window, block_size):
    """The running maximum started at 0; the rows that underflow (0 / 0) zeroed by torch.nan_to_num."""
    return torch.nan_to_num(_tiled_reference(q, k, v, window, block_size, zero_init=True))


def _window_float32_accumulator(q, k, v, window, block_size):
    """acc and l made without dtype= (float32) and updated in place: float64 input, float32 precision."""
    return _tiled_reference(q, k, v, window, block_size, acc_dtype=torch.float32)


def _tiled_reference(q, k, v, window, block_size, *, zero_init=False, acc_dtype=None):
    n, b = q.shape[-2], block_size
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, b):
        qe = min(qs + b, n)
        qb = q[..., qs:qe, :] / math.sqrt(q.shape[-1])
        m = torch.full(qb.shape[:-1] + (1,), 0.0 if zero_init else -math.inf, dtype=q.dtype)
        l = torch.zeros(qb.shape[:-1] + (1,), dtype=acc_dtype or q.dtype)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=acc_dtype or q.dtype)
        for ks in range(max(0, qs - window + 1) // b * b, qe, b):
            ke = min(ks + b, n)
            r, c = torch.arange(qs, qe)[:, None], torch.arange(ks, ke)[None, :]
            s = (qb @ k[..., ks:ke, :].mT).masked_fill((c > r) | (c <= r - window), -math.inf)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            alpha, p = torch.exp(m - safe), torch.exp(s - safe)
            l.mul_(alpha).add_(p.sum(-1, keepdim=True))
            acc.mul_(alpha).add_(p @ v[..., ks:ke, :])
            m = m_new
        out[..., qs:qe, :] = acc / l
    return out


def test_window_attention_names_an_axis_dropped_only_when_it_is(rejects, accepts):
    d = rejects(check_sliding_window_attention, _window_zero_max_nan_to_num).diagnosis
    assert "batch entry" not in d.summary + d.cause and "drops axis" not in d.cause, d
    accepts(check_sliding_window_attention, _tiled_reference)
    # "a tensor of q's dtype", read as in 09: float64 input, float64 precision
    assert_voice(rejects(check_sliding_window_attention, _window_float32_accumulator,
                         "float64 input, float32 precision"))


# ============================================================================ round 3: a full buffer, masks kept by shape
class CacheTokenByToken(CachePreallocated):
    """A fixed buffer written one token at a time: the first token past the end raises an IndexError."""

    def append(self, k, v):
        if self.k is None:
            self.k = k.new_zeros(*k.shape[:-2], self.max_len, k.shape[-1])
            self.v = v.new_zeros(*v.shape[:-2], self.max_len, v.shape[-1])
        for i in range(k.shape[-2]):
            self.k[..., self.t, :], self.v[..., self.t, :] = k[..., i, :], v[..., i, :]
            self.t += 1
        return self.k[..., :self.t, :], self.v[..., :self.t, :]


class CacheTokenByToken16(CacheTokenByToken):
    def __init__(self):
        super().__init__(max_len=16)


class CacheTokenByToken24(CacheTokenByToken):  # as many slots as the check's 24-token sequence, not its longest
    def __init__(self):
        super().__init__(max_len=24)


def test_kv_cache_names_a_buffer_written_token_by_token_past_its_end(rejects, accepts):
    d = rejects(check_KVCache, CacheTokenByToken16, "IndexError", "a buffer of 16 slots that never grows",
                "twice the size").diagnosis
    assert "after the 16 cached ones" in d.cause, d
    assert_voice(rejects(check_KVCache, CacheTokenByToken16))
    rejects(check_KVCache, CacheTokenByToken24, "a buffer of 24 slots that never grows", "4,096 new tokens")
    accepts(check_KVCache, CacheBuffer)  # grown by doubling


def window_mask_kept_by_shape():
    kept = {}

    def sliding_window_mask(n_q, n_k, window):
        if (n_q, n_k) not in kept:  # the window is not part of the key
            p, j = torch.arange(n_k - n_q, n_k)[:, None], torch.arange(n_k)[None, :]
            kept[n_q, n_k] = (j <= p) & (j > p - window)
        return kept[n_q, n_k]
    return sliding_window_mask


def window_mask_capped(n_q, n_k, window):  # the window capped at n_q + 1: (3, 10, 7) gives (3, 10, 4)'s mask too
    p, j = torch.arange(n_k - n_q, n_k)[:, None], torch.arange(n_k)[None, :]
    return (j <= p) & (j > p - min(window, n_q + 1))


def window_mask_capped_at_8(n_q, n_k, window):
    p, j = torch.arange(n_k - n_q, n_k)[:, None], torch.arange(n_k)[None, :]
    return (j <= p) & (j > p - min(window, 8))


def test_sliding_window_mask_names_a_mask_kept_by_shape(rejects):
    assert_voice(rejects(check_sliding_window_mask, window_mask_kept_by_shape(), "the mask of an earlier call",
                         "window=4", "kept by shape"))
    for answer in (window_mask_capped, window_mask_capped_at_8):  # wrong on new shapes too: not a mask kept by shape
        d = rejects(check_sliding_window_mask, answer, "wrong entries in the mask").diagnosis
        assert "kept by shape" not in d.cause, d


# ============================================================================ round 4: a buffer that grows, too little
class CacheDoubledOnce(CachePreallocated):
    """64 slots, doubled once when full (`if`, not `while`): too small for a 4,096-token prompt, yet it grows."""

    def append(self, k, v):
        if self.k is None:
            self.k = k.new_zeros(*k.shape[:-2], 64, k.shape[-1])
            self.v = v.new_zeros(*v.shape[:-2], 64, v.shape[-1])
        n = k.shape[-2]
        if self.t + n > self.k.shape[-2]:
            self.k, self.v = (torch.cat([x, torch.zeros_like(x)], -2) for x in (self.k, self.v))
        self.k[..., self.t:self.t + n, :], self.v[..., self.t:self.t + n, :] = k, v
        self.t += n
        return self.k[..., :self.t, :], self.v[..., :self.t, :]


def test_kv_cache_does_not_call_a_buffer_that_grows_too_little_one_that_never_grows(rejects):
    d = rejects(check_KVCache, CacheDoubledOnce, "a buffer of 128 slots", "did not grow enough", "4,096 new tokens",
                "max(2 × its size").diagnosis
    assert "never grows" not in d.cause, d
    assert_voice(rejects(check_KVCache, CacheDoubledOnce))
