"""attn_course.fast (notebook 09's references): the online softmax and the tiled loops agree with PyTorch,
the tile-by-tile state is the loop's, the cost model counts what PyTorch counts, and the figures are
readable."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attn_course import fast
from attn_course.attention import score_matrix_bytes
from attn_course.plots import readability_problems


def qkv(*shape, n_k=None, d_v=None, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    *lead, n, d = shape
    n_k = n if n_k is None else n_k
    d_v = d if d_v is None else d_v
    return (torch.randn(*lead, n, d, generator=g, dtype=dtype), torch.randn(*lead, n_k, d, generator=g, dtype=dtype),
            torch.randn(*lead, n_k, d_v, generator=g, dtype=dtype))


@pytest.mark.parametrize("block", [1, 3, 7, 16, 64])
@pytest.mark.parametrize("shape", [(17,), (4, 10), (2, 3, 33), (1, 1)])
def test_online_softmax_matches_torch(shape, block):
    x = torch.randn(*shape, dtype=torch.float64) * 5
    assert torch.allclose(fast.online_softmax(x, block), torch.softmax(x, -1), atol=1e-12)


def test_online_softmax_is_stable_at_large_values():
    x = torch.tensor([[1000.0, 1001.0, 999.0], [-1000.0, -1002.0, -1001.0]])
    out = fast.online_softmax(x, 2)
    assert torch.isfinite(out).all() and torch.allclose(out, torch.softmax(x, -1))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [1, 5, 16, 100])
@pytest.mark.parametrize("shape", [(37, 8), (2, 3, 50, 16)])
def test_tiled_and_naive_match_sdpa(shape, block, causal):
    q, k, v = qkv(*shape, d_v=shape[-1] + 3)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    tiled = (fast.causal_tiled_attention if causal else fast.tiled_attention)(q, k, v, block)
    assert torch.allclose(tiled, expected, atol=1e-12)
    assert torch.allclose(fast.naive_attention(q, k, v, causal=causal), expected, atol=1e-12)


def test_tiled_handles_more_keys_than_queries_and_float32():
    q, k, v = qkv(2, 9, 8, n_k=23, dtype=torch.float32)
    assert torch.allclose(fast.tiled_attention(q, k, v, 4), F.scaled_dot_product_attention(q, k, v), atol=1e-5)


def test_bad_arguments_get_clear_messages():
    q, k, v = qkv(8, 4)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="block_size"):
            fast.tiled_attention(q, k, v, bad)
        with pytest.raises(ValueError, match="block_size"):
            fast.online_softmax(q, bad)
    q2, k2, v2 = qkv(8, 4, n_k=9)
    with pytest.raises(ValueError, match="as many queries as keys"):
        fast.causal_tiled_attention(q2, k2, v2, 4)


def test_tile_steps_shows_the_running_state_of_the_loop():
    q, k, v = qkv(10, 4, d_v=3)
    tiles = list(fast.tile_steps(q, k, v, 4))
    assert [(t.q_start, t.q_end, t.k_start, t.k_end) for t in tiles] == [
        (qs, min(qs + 4, 10), ks, min(ks + 4, 10)) for qs in (0, 4, 8) for ks in (0, 4, 8)]
    assert [t.last for t in tiles] == [False, False, True] * 3
    s = q @ k.T / 2  # scaled scores, d_k = 4
    for t in tiles:  # m, l, acc after each tile are those of the keys seen so far
        seen = s[t.q_start:t.q_end, :t.k_end]
        m = seen.amax(-1, keepdim=True)
        assert torch.allclose(t.m, m) and torch.allclose(t.l, torch.exp(seen - m).sum(-1, keepdim=True))
        assert torch.allclose(t.acc, torch.exp(seen - m) @ v[:t.k_end])
    causal = list(fast.tile_steps(q, k, v, 4, causal=True))
    assert [(t.q_start, t.k_start) for t in causal] == [(0, 0), (4, 0), (4, 4), (8, 0), (8, 4), (8, 8)]


def test_causal_tiled_skips_the_tiles_above_the_diagonal():
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v = qkv(64, 8)
    counts = {}
    for causal in (False, True):
        with FlopCounterMode(display=False) as counter:
            (fast.causal_tiled_attention if causal else fast.tiled_attention)(q, k, v, 8)
        counts[causal] = counter.get_total_flops()
    assert counts[True] / counts[False] == pytest.approx(36 / 64)  # 8 blocks: 8·9/2 of 8·8 tiles
    grid = fast.tiles_computed(10, 4, causal=True)
    assert (grid[:4, 4:] == 0).all() and grid[0, 1] == 1 and grid[1, 0] == 2 and (grid[8:, :] > 0).all()


def test_attention_flops_equal_the_matmul_flops_pytorch_counts():
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v = qkv(2, 3, 40, 16)
    with FlopCounterMode(display=False) as counter:
        fast.naive_attention(q, k, v)
    assert counter.get_total_flops() == fast.attention_flops(2, 3, 40, 16)
    assert fast.attention_flops(2, 3, 40, 16, causal=True) == fast.attention_flops(2, 3, 40, 16) / 2
    assert fast.attention_flops(1, 1, 8, 4, backward=True) == 3.5 * fast.attention_flops(1, 1, 8, 4)


def test_longest_naive_length_uses_the_one_score_size_function():
    n = fast.max_naive_length(2e9, heads=16, dtype=torch.float16)
    assert 2 * score_matrix_bytes(n, heads=16, dtype=torch.float16) <= 2e9
    assert 2 * score_matrix_bytes(n + 1, heads=16, dtype=torch.float16) > 2e9
    assert fast.max_naive_length(2e9, heads=16, dtype=torch.bfloat16) == n
    assert fast.max_naive_length(2e9, heads=16, dtype=torch.float32) == math.isqrt(int(2e9 // (2 * 16 * 4)))


def test_memory_traffic_model():
    t = fast.memory_traffic(2048, 64, 512)
    assert t["score_matrix"] == 2048 * 2048 * 4
    assert t["naive"] == (4 * 2048 * 64 + 6 * 2048**2) * 4
    assert t["tiled"] == (2 * 2048 * 64 + 2 * 2048 * 64 * 4) * 4
    assert fast.memory_traffic(1000, 64, 512)["tiled"] == (2 * 1000 * 64 + 2 * 1000 * 64 * 2) * 4  # ⌈1000/512⌉ = 2
    big = fast.memory_traffic(4096, 64, 512, batch=2, heads=3, dtype=torch.float16)
    assert big["naive"] == 6 * fast.memory_traffic(4096, 64, 512, dtype=torch.float16)["naive"]


@pytest.mark.slow
def test_figures_are_readable_at_1366_by_768():
    figs = [fast.plot_naive_memory([2**k for k in range(9, 18)], {"Binder (2 GB)": 2e9, "H100 (80 GiB)": 80 * 2**30},
                                   heads=16),
            fast.plot_tile_map(10, 4), fast.plot_traffic([2**k for k in range(9, 15)], 64, 512)]
    for fig in figs:
        assert readability_problems(fig) == []
    assert "GiB" in figs[0].axes[0].get_ylabel()
    assert [ax.get_title() for ax in figs[1].axes] == ["non-causal: 9 of 9 tiles", "causal: 6 of 9 tiles"]


# ----------------------------------------------------------------------------- bad input: clear messages
@pytest.mark.parametrize("fn", [fast.naive_attention, fast.tiled_attention])
@pytest.mark.parametrize("shapes, match", [
    (((4, 8), (5, 7), (5, 6)), r"q has d_k = 8 .* k has d_k = 7"),
    (((4, 8), (5, 8), (6, 6)), r"k has n_k = 5 rows .* v has 6"),  # tiled: used to return a silently wrong output
])
def test_fast_attention_names_shape_mistakes(fn, shapes, match):
    with pytest.raises(ValueError, match=match):
        fn(*(torch.randn(s) for s in shapes))


def test_fast_attention_names_dtype_mistakes():
    q = torch.ones(4, 8, dtype=torch.long)
    with pytest.raises(TypeError, match=r"q must be a floating-point tensor.*torch.int64"):
        fast.tiled_attention(q, q.float(), q.float(), 2)
    with pytest.raises(TypeError, match=r"q must be a torch.Tensor.*ndarray"):
        fast.tiled_attention(q.float().numpy(), q.float(), q.float(), 2)
    with pytest.raises(TypeError, match=r"x must be a floating-point torch.Tensor.*torch.int64"):
        fast.online_softmax(q, 2)


def test_memory_traffic_needs_a_positive_block_size():
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        fast.memory_traffic(8, 4, 0)


def test_tiled_attention_with_no_keys_is_zero():
    q, k, v = qkv(4, 8, n_k=0, d_v=6)
    assert torch.equal(fast.tiled_attention(q, k, v, 2), torch.zeros(4, 6, dtype=torch.float64))
