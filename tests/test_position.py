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


def test_rope_score_is_not_monotone_but_its_bound_falls():
    """What notebook 12 says: the all-ones score rises on about half the steps and turns negative; RoFormer's
    quantity (2/d)Σ|S_s| starts at (d/2 + 1)/2 and its envelope falls."""
    d, distances = 128, range(0, 4097)
    score, bound = pos.rope_self_score(d, distances), pos.rope_decay_bound(d, distances)
    rises = (score[1:] > score[:-1]).double().mean().item()
    assert 0.4 < rises < 0.6 and bool((score < 0).any())
    assert bound[0].item() == pytest.approx((d / 2 + 1) / 2)
    envelope = [score[lo:hi].abs().max().item() for lo, hi in ((1, 10), (10, 100), (100, 1000), (1000, 4097))]
    assert envelope == sorted(envelope, reverse=True)
    bound_envelope = [bound[lo:hi].max().item() for lo, hi in ((10, 100), (100, 1000), (1000, 4097))]
    assert bound_envelope == sorted(bound_envelope, reverse=True) and bound_envelope[1] < 0.4 * bound[0]
    # The bound really bounds: |score| ≤ max_r |h_{r+1} − h_r| · (2/d)Σ|S_s| · (d/2), for random q and k.
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(d, generator=g, dtype=torch.float64), torch.randn(d, generator=g, dtype=torch.float64)
    h = torch.complex(q[0::2], q[1::2]) * torch.complex(k[0::2], k[1::2]).conj()  # (d/2,)
    h = torch.cat([h, torch.zeros(1, dtype=h.dtype)])  # h_{d/2} = 0 (Abel summation)
    for delta in (1, 10, 100, 1000):
        s = (pos.apply_rope(q[None], torch.tensor([0])) * pos.apply_rope(k[None], torch.tensor([delta]))).sum()
        limit = (h[1:] - h[:-1]).abs().max() * pos.rope_decay_bound(d, [delta])[0] * d / 2
        assert abs(s.item()) <= limit.item() + 1e-9


def test_rope_interpolation_and_ntk_base():
    d = 128
    base = pos.ntk_base(10000.0, 4, d)
    theta, theta_ntk = pos.rope_angles(torch.tensor([1]), d)[0], pos.rope_angles(torch.tensor([1]), d, base)[0]
    assert theta_ntk[0].item() == pytest.approx(1.0)  # the fastest pair is untouched
    assert (theta[-1] / theta_ntk[-1]).item() == pytest.approx(4.0)  # the slowest slowed by exactly the factor
    # Interpolation stretches the whole curve: its score at 4Δ is the original's at Δ.
    torch.testing.assert_close(pos.rope_self_score(d, [4 * x for x in range(50)], scale=4.0),
                               pos.rope_self_score(d, range(50)))


def test_rope_decode_step_and_decoding_equal_attention_at_once():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(10, 8, generator=g, dtype=torch.float64) for _ in range(3))
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    scores = pos.apply_rope(q) @ pos.apply_rope(k).T / math.sqrt(8)
    at_once = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1) @ v
    torch.testing.assert_close(pos.rope_decode(q, k, v, prompt=3), at_once)
    wrong = pos.rope_decode(q, k, v, prompt=3, restart_positions=True)
    torch.testing.assert_close(wrong[:3], at_once[:3])  # the prompt does start at 0
    assert (wrong[3:] - at_once[3:]).abs().amax(-1).min() > 1e-3  # every decoded token is off
    q_rot, cache = pos.rope_decode_step(q[5:7], k[5:7], pos.apply_rope(k[:5]))
    torch.testing.assert_close(q_rot, pos.apply_rope(q)[5:7])
    torch.testing.assert_close(cache, pos.apply_rope(k)[:7])


def test_tiny_model_shapes_and_schemes():
    ids = pos.recency_sequences(3, 20, torch.Generator().manual_seed(0))
    assert ids.shape == (3, 20) and ids.dtype == torch.long and int(ids.max()) < 8
    for scheme in pos.EXTRAPOLATION_SCHEMES:
        assert pos.TinyPositionModel(scheme)(ids).shape == (3, 20, 8)
    with pytest.raises(ValueError, match="unknown scheme"):
        pos.TinyPositionModel("learned")


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_alibi_extrapolates_best_on_the_tiny_model(seed):
    """What notebook 12's text says of its (unchecked, float32) table, on three seeds: about equal at the
    training length; past it ALiBi is best at every length and rises by less than half as much as the others."""
    threads = torch.get_num_threads()
    losses = pos.length_extrapolation(seed=seed)
    assert torch.get_num_threads() == threads
    at_train = [v[0] for v in losses.values()]
    assert max(at_train) - min(at_train) < 0.06
    rise = {s: max(v[1:]) - v[0] for s, v in losses.items()}
    for i in range(1, 4):
        assert losses["ALiBi"][i] < min(losses["sinusoidal"][i], losses["RoPE"][i])
    assert rise["ALiBi"] < 0.5 * min(rise["sinusoidal"], rise["RoPE"])


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
    """Without the scale ∂ℒ/∂S shrinks while the gradient reaching the query grows; with it both stay put; the
    additive pre-activations have variance 2."""
    dims = [4, 64, 1024]
    stats = pos.saturation_vs_dk(dims, trials=100)
    unscaled, scaled, additive = (stats[k] for k in ("dot, unscaled", "dot / √d_k", "additive"))
    assert unscaled["max weight"][-1] > 0.9 > max(scaled["max weight"][-1], additive["max weight"][-1])
    assert unscaled["dL/dS"][-1] < 0.5 * unscaled["dL/dS"][0]
    assert unscaled["dL/dq"] == sorted(unscaled["dL/dq"]) and unscaled["dL/dq"][-1] > 2 * unscaled["dL/dq"][0]
    assert max(scaled["dL/dq"]) < 1.3 * min(scaled["dL/dq"])
    assert all(abs(v - 2) < 0.15 for v in additive["tanh input variance"])


@pytest.mark.slow
def test_figures_are_readable():
    figs = [pos.plot_encoding(pos.sinusoidal_encoding(32, 24)),
            pos.plot_bias_heads(pos.alibi_bias(12, 8), "ALiBi"),
            pos.plot_rope(pos.rope_angles(torch.arange(32), 16), torch.randn(12, 12)),
            pos.plot_rope_decay(range(0, 300), pos.rope_self_score(64, range(0, 300)), 64),
            pos.plot_rope_decay(range(0, 300), pos.rope_self_score(64, range(0, 300)), 64,
                                pos.rope_decay_bound(64, range(0, 300))),
            pos.plot_rope_extension(range(0, 300), {"a": pos.rope_self_score(64, range(0, 300)),
                                                    "b": pos.rope_self_score(64, range(0, 300), scale=4.0)}, 100),
            pos.plot_length_extrapolation([32, 64], {"ALiBi": [1.7, 1.8], "RoPE": [1.6, 1.9]}, 32),
            pos.plot_saturation([4, 16], {"a": {"max weight": [0.1, 0.2], "dL/dS": [1, 2], "dL/dq": [1, 2]}})]
    for fig in figs:
        assert readability_problems(fig) == []
        plt.close(fig)


def test_bad_input_gets_a_clear_message():
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        pos.apply_rope(torch.ones(4, 8, dtype=torch.long))  # used to return an int tensor
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        pos.apply_rope(torch.randn(4, 8).numpy())
    with pytest.raises(ValueError, match=r"positions must have shape \(n,\) = \(4,\)"):
        pos.apply_rope(torch.randn(4, 8), torch.arange(3))
    with pytest.raises(ValueError, match="d must be even, got 5"):
        pos.apply_rope_halves(torch.randn(4, 5))
    with pytest.raises(ValueError, match="n_heads must be a non-negative integer"):
        pos.alibi_slopes(-2)
    for d in (2, 3):
        with pytest.raises(ValueError, match="d must be an even integer ≥ 4"):
            pos.ntk_base(10000.0, 2.0, d)
    with pytest.raises(ValueError, match="table has 3 rows"):
        pos.relative_position_bias(4, torch.randn(3, 2))
    with pytest.raises(ValueError, match=r"table must be a \(num_buckets, A\) tensor"):
        pos.relative_position_bias(4, torch.randn(32))
    with pytest.raises(ValueError, match="max_distance must be larger than 8"):
        pos.relative_position_bucket(torch.arange(4), num_buckets=32, max_distance=8)
    with pytest.raises(ValueError, match="n must be a non-negative integer"):
        pos.sinusoidal_encoding(-1, 4)
