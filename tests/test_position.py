"""The reference implementations of notebook 12 (attn_course.position), against the papers' formulas and
Hugging Face's T5 code."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from attn_course import position as pos  # noqa: E402
from attn_course.plots import readability_problems  # noqa: E402


def test_attention_variants_are_what_they_claim():
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 7, 6, generator=g)
    perm = torch.randperm(7, generator=g)
    for name in pos.EQUIVARIANT:
        f = pos.attention_variant(name)
        assert torch.allclose(f(x[:, perm]), f(x)[:, perm], atol=1e-6), name
    for name in pos.POSITION_AWARE:
        f = pos.attention_variant(name)
        assert (f(x[:, perm]) - f(x)[:, perm]).abs().max() > 0.05, name
    for d in (1, 3):  # any width
        for name in pos.EQUIVARIANT + pos.POSITION_AWARE:
            assert pos.attention_variant(name)(torch.randn(4, d)).shape == (4, d)
    with pytest.raises(ValueError, match="shape"):
        pos.attention_variant("plain attention")(torch.randn(4))
    with pytest.raises(ValueError):
        pos.attention_variant("nonsense")


def test_sinusoid_formula_and_rotation_property():
    n, d, base = 30, 10, 10000.0
    pe = pos.sinusoidal_encoding(n, d, base, dtype=torch.float64)
    for p in (0, 7, 29):
        for i in range(d // 2):
            angle = p / base ** (2 * i / d)
            assert pe[p, 2 * i].item() == pytest.approx(math.sin(angle))
            assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(angle))
    # PE(p + k) is a fixed rotation of PE(p) in every (sin, cos) pair (Vaswani et al. 2017, §3.5).
    k = 3
    for i in range(d // 2):
        w = 1 / base ** (2 * i / d)
        rot = torch.tensor([[math.cos(k * w), -math.sin(k * w)], [math.sin(k * w), math.cos(k * w)]], dtype=torch.float64)
        torch.testing.assert_close(pe[: n - k, 2 * i: 2 * i + 2] @ rot, pe[k:, 2 * i: 2 * i + 2])
    odd = pos.sinusoidal_encoding(5, 7)
    assert odd.shape == (5, 7) and odd.dtype == torch.float32
    torch.testing.assert_close(odd[:, 6], torch.sin(torch.arange(5.0) / 10000 ** (6 / 7)))


def hf_bucket(rel, bidirectional, num_buckets, max_distance):
    buckets = 0
    if bidirectional:
        num_buckets //= 2
        buckets += (rel > 0).to(torch.long) * num_buckets
        rel = torch.abs(rel)
    else:
        rel = -torch.min(rel, torch.zeros_like(rel))
    max_exact = num_buckets // 2
    is_small = rel < max_exact
    large = max_exact + (torch.log(rel.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, rel, large)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (32, 20), (8, 16), (8, 12), (16, 64)])
def test_buckets_equal_hugging_face_t5(bidirectional, num_buckets, max_distance):
    rel = torch.arange(-300, 301)
    assert torch.equal(pos.relative_position_bucket(rel, bidirectional, num_buckets, max_distance),
                       hf_bucket(rel, bidirectional, num_buckets, max_distance))


def test_relative_bias_depends_only_on_j_minus_i():
    table = torch.randn(32, 3, generator=torch.Generator().manual_seed(0))
    bias = pos.relative_position_bias(20, table)
    assert bias.shape == (3, 20, 20)
    for i in range(19):
        assert torch.equal(bias[:, i, i + 1], table[16 + 1])  # key after the query: upper half of the buckets
        assert torch.equal(bias[:, i + 1, i], table[1])
        torch.testing.assert_close(bias[:, i + 1, 1:], bias[:, i, :-1])  # constant along diagonals


def test_alibi_slopes_and_bias():
    assert pos.alibi_slopes(8).tolist() == [2.0 ** -k for k in range(1, 9)]
    s16 = pos.alibi_slopes(16)
    assert s16[0].item() == pytest.approx(2 ** -0.5) and torch.allclose(s16[1:] / s16[:-1], torch.full((15,), 2 ** -0.5,
                                                                                                       dtype=torch.float64))
    twelve = pos.alibi_slopes(12)  # the authors' rule: 8 slopes, then every other one of 16
    assert twelve[:8].tolist() == pos.alibi_slopes(8).tolist() and twelve[8:].tolist() == pos.alibi_slopes(16)[0::2][:4].tolist()
    bias = pos.alibi_bias(5, 4)
    assert bias.shape == (4, 5, 5) and torch.equal(bias, bias.transpose(-2, -1))
    assert bias[0, 4, 1].item() == pytest.approx(-3 * 2 ** -2)


def test_rope_relative_property_norms_and_conventions():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 16, generator=g, dtype=torch.float64), torch.randn(1, 16, generator=g, dtype=torch.float64)
    scores = [(pos.apply_rope(q, torch.tensor([m])) * pos.apply_rope(k, torch.tensor([m + 5]))).sum().item()
              for m in (0, 3, 100, 4000)]
    assert max(scores) - min(scores) < 1e-9
    x = torch.randn(2, 6, 8, generator=g, dtype=torch.float64)
    rotated = pos.apply_rope(x)
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))  # a rotation keeps lengths
    torch.testing.assert_close(rotated[:, 0], x[:, 0])  # position 0 is not rotated
    # The halves convention is the interleaved one on reordered dimensions.
    order = torch.cat([torch.arange(0, 8, 2), torch.arange(1, 8, 2)])  # (x0, x2, x4, x6, x1, x3, x5, x7)
    torch.testing.assert_close(pos.apply_rope_halves(x[..., order]), pos.apply_rope(x)[..., order])
    assert pos.apply_rope(x.float()).dtype == torch.float32
    with pytest.raises(ValueError, match="even"):
        pos.apply_rope(torch.randn(3, 5))


def test_rope_scores_decay_with_distance():
    values = pos.rope_self_score(128, range(0, 2001))
    assert values[0].item() == pytest.approx(1.0)
    assert values[500:].abs().mean() < 0.2 * values[:5].abs().mean()


def test_additive_attention_against_a_loop_and_masks():
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(3, 4, generator=g), torch.randn(5, 6, generator=g), torch.randn(5, 2, generator=g)
    W_q, W_k, w = torch.randn(7, 4, generator=g), torch.randn(7, 6, generator=g), torch.randn(7, generator=g)
    scores = torch.tensor([[float(w @ torch.tanh(W_q @ q[i] + W_k @ k[j])) for j in range(5)] for i in range(3)])
    torch.testing.assert_close(pos.additive_scores(q, k, W_q, W_k, w), scores)
    mask = torch.tensor([True, False, True, True, False])
    out, weights = pos.additive_attention(q, k, v, W_q, W_k, w, mask)
    assert (weights[:, ~mask] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(3))
    torch.testing.assert_close(out, weights @ v)


def test_saturation_experiment_shows_the_history():
    dims = [4, 64, 1024]
    stats = pos.saturation_vs_dk(dims, trials=100)
    unscaled, scaled, additive = (stats[k]["max weight"] for k in ("dot, unscaled", "dot / √d_k", "additive"))
    assert unscaled[-1] > 0.9 > max(scaled[-1], additive[-1])
    assert stats["dot, unscaled"]["gradient"][-1] < 0.5 * stats["additive"]["gradient"][-1]


def test_figures_are_readable():
    figs = [pos.plot_encoding(pos.sinusoidal_encoding(32, 24)),
            pos.plot_bias_heads(pos.alibi_bias(12, 8), "ALiBi"),
            pos.plot_rope(pos.rope_angles(torch.arange(32), 16), torch.randn(12, 12)),
            pos.plot_rope_decay(range(0, 300), pos.rope_self_score(64, range(0, 300)), 64),
            pos.plot_saturation([4, 16], {"a": {"max weight": [0.1, 0.2], "gradient": [1, 2]}})]
    for fig in figs:
        assert readability_problems(fig) == []
        plt.close(fig)
