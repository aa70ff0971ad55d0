"""Notebook 09: the fast-attention references agree with PyTorch, the cost model is right, and each
check rejects its pitfalls with the right diagnosis while accepting correct alternatives."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attn_course import fast
from attn_course.checks import fast as cf
from attn_course.checks._core import CheckFailed, NotAttempted
from attn_course.checks.fast import check_causal_tiled_attention, check_online_softmax, check_tiled_attention


def qkv(*shape, m=None, dv=None, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    *lead, n, d = shape
    m = n if m is None else m
    dv = d if dv is None else dv
    return (torch.randn(*lead, n, d, generator=g, dtype=dtype), torch.randn(*lead, m, d, generator=g, dtype=dtype),
            torch.randn(*lead, m, dv, generator=g, dtype=dtype))


# ------------------------------------------------------------------------- references vs PyTorch


@pytest.mark.parametrize("block", [1, 3, 7, 16, 64])
@pytest.mark.parametrize("shape", [(17,), (4, 10), (2, 3, 33)])
def test_online_softmax_matches_torch(shape, block):
    x = torch.randn(*shape, dtype=torch.float64) * 5
    assert torch.allclose(fast.online_softmax(x, block), torch.softmax(x, -1), atol=1e-12)


def test_online_softmax_is_stable_at_large_scores():
    x = torch.tensor([[1000.0, 1001.0, 999.0], [-1000.0, -1002.0, -1001.0]])
    out = fast.online_softmax(x, 2)
    assert torch.isfinite(out).all() and torch.allclose(out, torch.softmax(x, -1))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [1, 5, 16, 100])
@pytest.mark.parametrize("shape", [(37, 8), (2, 3, 50, 16)])
def test_tiled_and_naive_match_sdpa(shape, block, causal):
    q, k, v = qkv(*shape, dv=shape[-1] + 3)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    tiled = (fast.causal_tiled_attention if causal else fast.tiled_attention)(q, k, v, block)
    assert torch.allclose(tiled, expected, atol=1e-12)
    assert torch.allclose(fast.naive_attention(q, k, v, causal=causal), expected, atol=1e-12)


def test_tiled_handles_more_keys_than_queries_and_float32():
    q, k, v = qkv(2, 9, 8, m=23, dtype=torch.float32)
    assert torch.allclose(fast.tiled_attention(q, k, v, 4), F.scaled_dot_product_attention(q, k, v), atol=1e-5)


def test_tiled_rejects_bad_arguments():
    q, k, v = qkv(8, 4)
    with pytest.raises(ValueError, match="block_size"):
        fast.tiled_attention(q, k, v, 0)
    q2, k2, v2 = qkv(8, 4, m=9)
    with pytest.raises(ValueError, match="as many queries as keys"):
        fast.causal_tiled_attention(q2, k2, v2, 4)


def test_causal_tiled_skips_the_tiles_above_the_diagonal():
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v = qkv(64, 8)
    counts = {}
    for causal in (False, True):
        with FlopCounterMode(display=False) as counter:
            (fast.causal_tiled_attention if causal else fast.tiled_attention)(q, k, v, 8)
        counts[causal] = counter.get_total_flops()
    assert counts[True] / counts[False] == pytest.approx(36 / 64)  # 8 blocks: 8·9/2 of 8·8 tiles


# ------------------------------------------------------------------------- cost model


def test_attention_flops_equal_the_matmul_flops_pytorch_counts():
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v = qkv(2, 3, 40, 16)
    with FlopCounterMode(display=False) as counter:
        fast.naive_attention(q, k, v)
    assert counter.get_total_flops() == fast.attention_flops(2, 3, 40, 16)
    assert fast.attention_flops(2, 3, 40, 16, causal=True) == fast.attention_flops(2, 3, 40, 16) / 2
    assert fast.attention_flops(1, 1, 8, 4, backward=True) == 3.5 * fast.attention_flops(1, 1, 8, 4)


def test_score_memory_and_longest_naive_length():
    assert fast.score_elements(2, 3, 10) == 600
    assert fast.score_bytes(1, 16, 1024, torch.float16) == 16 * 1024 * 1024 * 2
    n = fast.max_naive_length(2e9, heads=16, dtype=torch.float16)
    assert 2 * fast.score_bytes(1, 16, n, torch.float16) <= 2e9 < 2 * fast.score_bytes(1, 16, n + 1, torch.float16)


# ------------------------------------------------------------------------- learners' answers


def unfinished(*args, **kwargs):
    raise NotImplementedError()


def message(check, fn):
    with pytest.raises(CheckFailed) as info:
        check(fn)
    return str(info.value)


# online_softmax: the mistakes replayed by the check itself are independent re-implementations here.


def softmax_variant(mistake):
    def online(x, block_size=1):
        n = x.shape[-1]
        m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
        l = torch.zeros_like(m)
        stop = (n // block_size) * block_size if mistake == "tail" else n
        for s in range(0, stop, block_size):
            blk = x[..., s:s + block_size]
            new = torch.maximum(m, blk.amax(-1, keepdim=True))
            if mistake == "no_max":
                new = torch.zeros_like(m)
            if mistake == "sum":
                l = l + torch.exp(blk - new).sum(-1, keepdim=True)
            elif mistake == "inverted":
                factor = torch.where(torch.isinf(m), torch.ones_like(m), torch.exp(new - m))
                l = l * factor + torch.exp(blk - new).sum(-1, keepdim=True)
            else:
                l = l * torch.exp(m - new) + torch.exp(blk - new).sum(-1, keepdim=True)
            m = new
        if mistake == "division":
            return torch.exp(x - m)
        return torch.exp(x - m) / l

    return online


@pytest.mark.parametrize("mistake, phrase", [
    ("sum", "running sum is not rescaled"),
    ("inverted", "rescaled the wrong way round"),
    ("division", "final division is missing"),
    ("tail", "last, shorter block is dropped"),
    ("no_max", "no running maximum is subtracted"),
])
def test_online_softmax_pitfalls_are_named(mistake, phrase):
    assert phrase in message(check_online_softmax, softmax_variant(mistake))


def test_online_softmax_calling_torch_softmax_is_named():
    assert "calls torch.softmax" in message(check_online_softmax, lambda x, block_size=1: torch.softmax(x, -1))
    assert "calls torch.softmax" in message(check_online_softmax, lambda x, block_size=1: F.log_softmax(x, -1).exp())


def online_split(x, block_size=1):  # torch.split instead of index arithmetic
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for blk in torch.split(x, block_size, dim=-1):
        new = torch.maximum(m, blk.max(dim=-1, keepdim=True).values)
        l = l * (m - new).exp() + (blk - new).exp().sum(-1, keepdim=True)
        m = new
    return (x - m).exp() / l


def online_numpy(x, block_size=1):  # NumPy inside, a NumPy array out
    a = x.numpy()
    m = np.full(a.shape[:-1] + (1,), -np.inf)
    l = np.zeros_like(m)
    for s in range(0, a.shape[-1], block_size):
        blk = a[..., s:s + block_size]
        new = np.maximum(m, blk.max(-1, keepdims=True))
        l = l * np.exp(m - new) + np.exp(blk - new).sum(-1, keepdims=True)
        m = new
    return np.exp(a - m) / l


def online_scalar_update(x, block_size=1):  # the max/sum recurrence with a per-block log-sum-exp
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=torch.float64)
    l = torch.zeros_like(m)
    for s in range(0, x.shape[-1], block_size):
        blk = x[..., s:s + block_size].double()
        lse = torch.logsumexp(blk, -1, keepdim=True)
        new = torch.maximum(m, lse)
        l = l * torch.exp(m - new) + torch.exp(lse - new)
        m = new
    return torch.exp(x.double() - m) / l


@pytest.mark.parametrize("fn", [fast.online_softmax, online_split, online_numpy, online_scalar_update])
def test_online_softmax_accepts_correct_alternatives(fn, capsys):
    check_online_softmax(fn)
    assert "✓ online softmax" in capsys.readouterr().out


# tiled / causal: independent re-implementations of each mistake.


def tiled_variant(mistake="", causal=False):
    def attend(q, k, v, block_size=64):
        n, mk, d = q.shape[-2], k.shape[-2], q.shape[-1]
        scale = 1.0 if mistake == "no_scale" else (1.0 / d if mistake == "scale_d" else d ** -0.5)
        out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        q_stop = (n // block_size) * block_size if mistake == "q_tail" else n
        for qs in range(0, q_stop, block_size):
            qe = min(qs + block_size, n)
            qb = q[..., qs:qe, :]
            m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
            l = torch.zeros_like(m)
            acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
            if not causal or mistake in ("all_blocks_masked", "not_causal", "above_unmasked"):
                k_stop = mk
            elif mistake == "skip_diagonal":
                k_stop = qs
            else:
                k_stop = qe
            if mistake == "k_tail":
                k_stop = min(k_stop, (mk // block_size) * block_size)
            for ks in range(0, k_stop, block_size):
                ke = min(ks + block_size, mk)
                s = torch.einsum("...id,...jd->...ij", qb, k[..., ks:ke, :]) * scale
                if causal and mistake != "not_causal":
                    i = torch.arange(qs, qe)[:, None]
                    j = torch.arange(ks, ke)[None, :]
                    hide = {
                        "diagonal_unmasked": torch.zeros_like(j > i),
                        "excludes_self": j >= i,
                        "one_ahead": j > i + 1,
                        "local_mask": (j - ks) > (i - qs),
                        "above_unmasked": (j > i) & (ks == qs),
                    }.get(mistake, j > i)
                    s = s.masked_fill(hide, -math.inf)
                new = torch.maximum(m, s.amax(-1, keepdim=True))
                p = torch.exp(s - new)
                alpha = torch.exp(m - new)
                l = (l if mistake in ("sum", "neither") else l * alpha) + p.sum(-1, keepdim=True)
                acc = (acc if mistake in ("acc", "neither") else acc * alpha) + p @ v[..., ks:ke, :]
                m = new
            out[..., qs:qe, :] = acc if mistake == "division" else acc / l
        return out

    return attend


COMMON = [
    ("sum", "running sum is not rescaled"),
    ("acc", "output accumulator is not rescaled"),
    ("neither", "neither the running sum nor the output accumulator"),
    ("division", "final division is missing"),
    ("k_tail", "last, shorter key/value block is dropped"),
    ("q_tail", "last, shorter query block is never computed"),
    ("no_scale", "scores are not scaled"),
    ("scale_d", "divided by D instead of √D"),
]


@pytest.mark.parametrize("mistake, phrase", COMMON)
def test_tiled_attention_pitfalls_are_named(mistake, phrase):
    assert phrase in message(check_tiled_attention, tiled_variant(mistake))


@pytest.mark.parametrize("mistake, phrase", COMMON + [
    ("not_causal", "non-causal result"),
    ("skip_diagonal", "the diagonal block is skipped"),
    ("above_unmasked", "blocks above the diagonal are computed and not masked"),
    ("diagonal_unmasked", "diagonal block is not masked"),
    ("excludes_self", "also hides the key at the query's own position"),
    ("one_ahead", "each query also sees the next key"),
    ("local_mask", "positions inside the tile"),
    ("all_blocks_masked", "computes the blocks above the diagonal too"),
])
def test_causal_tiled_attention_pitfalls_are_named(mistake, phrase):
    assert phrase in message(check_causal_tiled_attention, tiled_variant(mistake, causal=True))


def test_diagonal_skipped_with_a_zero_guard_is_named_too():
    def guarded(q, k, v, block_size=64):
        n = q.shape[-2]
        out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for qs in range(0, n, block_size):
            qe = min(qs + block_size, n)
            s_all = []
            for ks in range(0, qs, block_size):
                s_all.append((ks, q[..., qs:qe, :] @ k[..., ks:ks + block_size, :].transpose(-2, -1) / q.shape[-1] ** 0.5))
            if not s_all:
                continue  # first block: no key seen, leave zeros
            s = torch.cat([t for _, t in s_all], -1)
            out[..., qs:qe, :] = torch.softmax(s, -1) @ v[..., :s.shape[-1], :]
        return out

    assert "the diagonal block is skipped" in message(check_causal_tiled_attention, guarded)


def test_work_and_shape_diagnoses():
    naive = lambda q, k, v, block_size=64: fast.naive_attention(q, k, v)  # noqa: E731
    naive_causal = lambda q, k, v, block_size=64: fast.naive_attention(q, k, v, causal=True)  # noqa: E731
    sdpa = lambda q, k, v, block_size=64: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
    assert "full N×M score matrix" in message(check_tiled_attention, naive)
    assert "full N×M score matrix" in message(check_causal_tiled_attention, naive_causal)
    assert "calls F.scaled_dot_product_attention" in message(check_tiled_attention, sdpa)

    def width_of_q(q, k, v, block_size=64):
        return fast.tiled_attention(q, k, v[..., :q.shape[-1]], block_size)

    assert "must come from v" in message(check_tiled_attention, width_of_q)


def tiled_einsum_split(q, k, v, block_size=64):  # einsum, torch.split, torch.cat of the rows
    rows = []
    scale = q.shape[-1] ** -0.5
    for qb in torch.split(q, block_size, dim=-2):
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for kb, vb in zip(torch.split(k, block_size, -2), torch.split(v, block_size, -2)):
            s = torch.einsum("...id,...jd->...ij", qb * scale, kb)
            new = torch.maximum(m, s.amax(-1, keepdim=True))
            p, a = torch.exp(s - new), torch.exp(m - new)
            l, acc, m = a * l + p.sum(-1, keepdim=True), a * acc + torch.einsum("...ij,...jd->...id", p, vb), new
        rows.append(acc / l)
    return torch.cat(rows, dim=-2)


def tiled_numpy_out(q, k, v, block_size=64):
    return fast.tiled_attention(q.double(), k.double(), v.double(), block_size).numpy()


def causal_minus_1e9_where(q, k, v, block_size=64):  # a large negative fill and torch.where
    n, scale = q.shape[-2], 1 / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, block_size):
        qe = min(qs + block_size, n)
        qb = q[..., qs:qe, :]
        m = torch.full(qb.shape[:-1] + (1,), -1e30, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, qe, block_size):
            ke = min(ks + block_size, n)
            s = qb @ k[..., ks:ke, :].mT * scale
            if ks == qs:  # aligned blocks: the local triangle is the global one on the diagonal tile
                s = torch.where(torch.ones(qe - qs, ke - ks, dtype=torch.bool).triu(1), torch.tensor(-1e9, dtype=q.dtype), s)
            new = torch.maximum(m, s.amax(-1, keepdim=True))
            p, a = torch.exp(s - new), torch.exp(m - new)
            l, acc, m = a * l + p.sum(-1, keepdim=True), a * acc + p @ v[..., ks:ke, :], new
        out[..., qs:qe, :] = acc / l
    return out


@pytest.mark.parametrize("fn", [fast.tiled_attention, tiled_einsum_split, tiled_numpy_out])
def test_tiled_attention_accepts_correct_alternatives(fn, capsys):
    check_tiled_attention(fn)
    assert "✓ tiled attention" in capsys.readouterr().out


@pytest.mark.parametrize("fn", [fast.causal_tiled_attention, causal_minus_1e9_where, tiled_variant(causal=True)])
def test_causal_tiled_attention_accepts_correct_alternatives(fn, capsys):
    check_causal_tiled_attention(fn)
    assert "✓ causal tiled attention" in capsys.readouterr().out


@pytest.mark.parametrize("check", [check_online_softmax, check_tiled_attention, check_causal_tiled_attention])
def test_unfinished_is_not_attempted(check):
    with pytest.raises(NotAttempted, match="not attempted"):
        check(unfinished)


@pytest.mark.parametrize("check", [check_online_softmax, check_tiled_attention, check_causal_tiled_attention])
def test_bad_answers_get_clear_messages(check):
    assert "without calling it" in message(check, torch.zeros(3))
    assert "Python list" in message(check, lambda *a, **kw: [0.0, 1.0])
    assert "forget to `return`" in message(check, lambda *a, **kw: None)
    assert "has shape" in message(check, lambda *a, **kw: torch.zeros(2, 2))
    nan = message(check, lambda *a, **kw: torch.full_like(a[0], float("nan")) if check is check_online_softmax
                  else torch.full(a[0].shape[:-1] + (a[2].shape[-1],), float("nan"), dtype=a[0].dtype))
    assert "does not match" in nan and "nan" in nan.lower()

    def crashes(*a, **kw):
        raise IndexError("too far")

    assert "raised IndexError: too far" in message(check, crashes)


def test_check_replays_match_the_independent_versions():
    """The check's own mistake replays agree with the independent ones above (same diagnosis source)."""
    q, k, v = qkv(10, 4, dv=5)
    for mistake in ("sum", "acc", "division", "k_tail"):
        assert torch.allclose(cf._tiled_variant(q, k, v, 4, causal=False, mistake=mistake),
                              tiled_variant(mistake)(q, k, v, 4), equal_nan=True)
