"""The reference implementations of notebook 11 (attn_course.inference), against PyTorch's own."""

from __future__ import annotations


import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention.bias import causal_lower_right  # noqa: E402

from attn_course import inference as inf  # noqa: E402
from attn_course.plots import readability_problems  # noqa: E402


def qkv(*lead, n=7, m=None, d=8, dv=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    return (torch.randn(*lead, n, d, generator=g, dtype=dtype), torch.randn(*lead, m, d, generator=g, dtype=dtype),
            torch.randn(*lead, m, dv, generator=g, dtype=dtype))


def test_kv_cache_token_by_token_equals_causal_attention():
    q, k, v = qkv(2, 3)
    cache, outs = inf.KVCache(), []
    for t in range(q.shape[-2]):
        K, V = cache.append(k[..., t:t + 1, :], v[..., t:t + 1, :])
        assert torch.equal(K, k[..., :t + 1, :]) and torch.equal(V, v[..., :t + 1, :])
        outs.append(cache.attend(q[..., t:t + 1, :]))
    assert len(cache) == q.shape[-2]
    torch.testing.assert_close(torch.cat(outs, -2), F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_kv_cache_chunk_of_queries_is_bottom_right_aligned():
    q, k, v = qkv(2, n=9)
    cache = inf.KVCache()
    cache.append(k[..., :6, :], v[..., :6, :])
    cache.append(k[..., 6:, :], v[..., 6:, :])
    out = cache.attend(q[..., 6:, :])  # the last 3 queries over all 9 keys
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True)[..., 6:, :])
    with pytest.raises(ValueError):
        inf.KVCache().attend(q)


@pytest.mark.parametrize("n_q,n_k", [(1, 1), (1, 6), (3, 7), (5, 5), (2, 9)])
def test_bottom_right_mask_equals_causal_lower_right(n_q, n_k):
    assert torch.equal(inf.bottom_right_causal_mask(n_q, n_k), causal_lower_right(n_q, n_k)._materialize())
    assert torch.equal(inf.top_left_causal_mask(n_q, n_k), torch.ones(n_q, n_k, dtype=torch.bool).tril())


def test_bottom_right_mask_rejects_more_queries_than_keys():
    with pytest.raises(ValueError, match="n_q ≤ n_k"):
        inf.bottom_right_causal_mask(4, 3)


def test_top_left_is_what_is_causal_does():
    q, k, v = qkv(n=2, m=5)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, is_causal=True),
                               inf.masked_attention(q, k, v, inf.top_left_causal_mask(2, 5)))


@pytest.mark.parametrize("n_q,n_k,window", [(6, 6, 3), (1, 9, 4), (3, 10, 4), (5, 5, 1), (4, 4, 10)])
def test_sliding_window_mask_counts_and_flash_attn_convention(n_q, n_k, window):
    mask = inf.sliding_window_mask(n_q, n_k, window)
    for i in range(n_q):
        p = i + n_k - n_q
        # flash-attn's window_size=(window - 1, 0): keys p − (window − 1) … p, inclusive
        expected = [max(0, p - (window - 1)) <= j <= p for j in range(n_k)]
        assert mask[i].tolist() == expected
        assert int(mask[i].sum()) == min(window, p + 1)
    with pytest.raises(ValueError):
        inf.sliding_window_mask(3, 3, 0)


@pytest.mark.parametrize("n_chunks", [1, 2, 3, 7])
def test_split_k_equals_sdpa(n_chunks):
    q, k, v = qkv(2, 2, n=3, m=7)
    torch.testing.assert_close(inf.split_k_attention(q, k, v, n_chunks), F.scaled_dot_product_attention(q, k, v))
    mask = inf.sliding_window_mask(3, 7, 2)  # chunks that some queries see nothing of
    torch.testing.assert_close(inf.split_k_attention(q, k, v, n_chunks, mask=mask),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_merge_is_symmetric_associative_and_handles_empty_chunks():
    q, k, v = qkv(n=4, m=9)
    parts = [inf.partial_attention(q, k[..., s:s + 3, :], v[..., s:s + 3, :]) for s in (0, 3, 6)]
    left = inf.merge_partials(inf.merge_partials(parts[0], parts[1]), parts[2])
    right = inf.merge_partials(parts[0], inf.merge_partials(parts[2], parts[1]))
    for a, b in zip(left, right):
        torch.testing.assert_close(a, b)
    empty = inf.partial_attention(q, k[..., :3, :], v[..., :3, :], torch.zeros(4, 3, dtype=torch.bool))
    assert torch.isneginf(empty[0]).all() and (empty[1] == 0).all() and (empty[2] == 0).all()
    for a, b in zip(inf.merge_partials(parts[0], empty), parts[0]):
        torch.testing.assert_close(a, b)
    both = inf.merge_partials(empty, empty)
    assert torch.isneginf(both[0]).all() and not torch.isnan(both[1]).any() and not torch.isnan(both[2]).any()
    assert (inf.finish_partial(both) == 0).all()


@pytest.mark.parametrize("n,window,block", [(10, 3, 4), (37, 8, 16), (40, 20, 8), (12, 1, 4), (9, 20, 4), (8, 3, 1),
                                            (1, 2, 4)])
def test_sliding_window_attention_equals_sdpa(n, window, block):
    q, k, v = qkv(2, n=n, seed=n)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=inf.sliding_window_mask(n, n, window))
    torch.testing.assert_close(inf.sliding_window_attention(q, k, v, window, block), expected)
    q32, k32, v32 = (t.float() for t in (q, k, v))
    torch.testing.assert_close(inf.sliding_window_attention(q32, k32, v32, window, block), expected.float(),
                               atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError):
        inf.sliding_window_attention(q, k, v, 0, block)


def test_visited_key_blocks_cover_the_window_and_nothing_wholly_outside():
    n, block, window = 64, 8, 8
    for qs in range(0, n, block):
        visited = list(inf.visited_key_blocks(qs, qs + block, window, block))
        needed = {j // block * block for j in range(max(0, qs - window + 1), qs + block)}
        assert set(visited) == needed
    assert sum(len(inf.visited_key_blocks(qs, qs + 8, 8, 8)) for qs in range(0, 64, 8)) == 15


def test_mistral_cache_sizes():
    c = inf.MISTRAL_7B
    assert c.n_heads * c.d_head == 4096
    gqa = inf.kv_cache_bytes(c, c.context)
    assert gqa == 2 * 32 * 8 * 128 * 8192 * 2 == 2**30
    assert inf.kv_cache_bytes(c, c.context, n_kv_heads=32) == 4 * gqa
    assert inf.kv_cache_bytes(c, c.context, n_kv_heads=1) == gqa // 8
    assert inf.kv_cache_bytes(c, 32768, use_window=True) == inf.kv_cache_bytes(c, 4096)


def test_decode_traffic_intensity_is_heads_over_kv_heads():
    c = inf.MISTRAL_7B
    for g in (32, 8, 1):
        flops, nbytes = inf.decode_attention_traffic(c, 4096, n_kv_heads=g)
        assert flops / nbytes == pytest.approx(c.n_heads / g)
    assert inf.H100_SXM.ridge == pytest.approx(989.4 / 3.35)


def test_cached_layer_gives_the_same_tokens_with_and_without_cache():
    layer = inf.CachedLayer(16, dtype=torch.float64)
    x = torch.randn(6, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    K, V = layer.prefill(x[:1])
    for t in range(1, 6):
        with_cache, K, V = layer.step_with_cache(x[t:t + 1], K, V)
        torch.testing.assert_close(with_cache, layer.step_without_cache(x[:t + 1]))
    torch.testing.assert_close(K, layer.prefill(x)[0])
    assert inf.decode_step_flops(0, 16, cache=True) == inf.decode_step_flops(0, 16, cache=False)
    assert inf.decode_step_flops(99, 16, cache=False) > 50 * inf.decode_step_flops(99, 16, cache=True)


def test_sink_head_parks_weight_on_token_zero_and_a_sink_rescues_the_window():
    from attn_course.softmax import masked_softmax

    scores, v = inf.sink_head()
    n, window = scores.shape[0], 8
    weights = masked_softmax(scores, inf.bottom_right_causal_mask(n, n))
    assert weights[1:, 0].min() > 0.5 and (v[0] == 0).all()
    full = weights @ v
    alone = masked_softmax(scores, inf.sliding_window_mask(n, n, window)) @ v
    with_sink = inf.sliding_window_mask(n, n, window - 1)
    with_sink[:, 0] = True
    kept = masked_softmax(scores, with_sink) @ v
    err_alone = (alone - full).norm(dim=-1)[window:].mean()
    err_sink = (kept - full).norm(dim=-1)[window:].mean()
    assert err_alone > 20 * err_sink


@pytest.mark.slow
def test_figures_are_readable():
    figs = [inf.plot_alignment(3, 8), inf.plot_window_tiles(24, 4, 6),
            inf.plot_cost_per_token([1, 2, 4], {"a": [1, 2, 3], "b": [2, 3, 4]}, {"a": [1, 2, 3], "b": [1, 1, 1]}),
            inf.plot_sink(torch.rand(20, 20), {"window": [0.1] * 20, "window + sink": [0.0] * 20}, 8)]
    for fig in figs:
        assert readability_problems(fig) == []
        plt.close(fig)


# ----------------------------------------------------------------------------- bad input: clear messages
def _qkv(n_q=4, n_k=5, d=8):
    return torch.randn(n_q, d), torch.randn(n_k, d), torch.randn(n_k, 6)


@pytest.mark.parametrize("call, match", [
    (lambda: inf.split_k_attention(*_qkv(), 0), r"n_chunks must be an integer ≥ 1.*0"),
    (lambda: inf.split_k_attention(*_qkv(), 10), r"n_chunks=10 is more than the 5 keys"),
    (lambda: inf.sliding_window_attention(*_qkv(), 2, 2), r"as many queries as keys.*\(4, 8\).*\(5, 8\)"),
    (lambda: inf.sliding_window_attention(*_qkv(4, 4), 2.5, 2), r"window must be an integer ≥ 1.*2.5"),
    (lambda: inf.masked_attention(torch.randn(4, 8), torch.randn(5, 7), torch.randn(5, 6)), r"q has d_k = 8 .* k has d_k = 7"),
    (lambda: inf.KVCache().append(torch.randn(2, 8), torch.randn(1, 6)), r"k has n_k = 2 rows .* v has 1"),
])
def test_inference_names_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_kv_cache_refuses_a_token_of_another_width():
    cache = inf.KVCache()
    cache.append(torch.randn(1, 8), torch.randn(1, 6))
    with pytest.raises(ValueError, match=r"the cache holds k \(1, 8\).*you appended k \(1, 7\)"):
        cache.append(torch.randn(1, 7), torch.randn(1, 6))


def test_partial_attention_names_a_non_bool_mask():
    with pytest.raises(TypeError, match=r"mask must be a bool tensor .* torch.int64"):
        inf.partial_attention(*_qkv(), torch.ones(4, 5, dtype=torch.long))
