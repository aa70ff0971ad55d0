"""Notebook 10's reference module (attn_course.backward) against PyTorch: every gradient equals autograd
through F.scaled_dot_product_attention (float64, within 1e-10), the tiled backward never holds an n × n
tensor, the FLOP counts agree with torch.utils.flop_counter, and the figures are readable."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from attn_course import backward as ref
from attn_course import fast, plots
from attn_course.checks.backward.probes import _watch_probe
from attn_course.softmax import masked_softmax


def _inputs(*lead, n_q, n_k, d_k, d_v, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*lead, n_q, d_k, generator=g, dtype=dtype)
    k = torch.randn(*lead, n_k, d_k, generator=g, dtype=dtype)
    v = torch.randn(*lead, n_k, d_v, generator=g, dtype=dtype)
    dout = torch.randn(*lead, n_q, d_v, generator=g, dtype=dtype)
    return q, k, v, dout


def _autograd(q, k, v, dout, mask=None, causal=False):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, attn_mask=mask, is_causal=causal)
    return out.detach(), torch.autograd.grad(out, leaves, dout)


def _max_diff(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b))


# ============================================================================ the chain rule
@pytest.mark.parametrize("lead,n_q,n_k,d_k,d_v", [((), 5, 7, 4, 3), ((2, 3), 6, 6, 8, 8), ((1,), 1, 1, 1, 1)])
def test_attention_backward_equals_autograd(lead, n_q, n_k, d_k, d_v):
    q, k, v, dout = _inputs(*lead, n_q=n_q, n_k=n_k, d_k=d_k, d_v=d_v)
    _, oracle = _autograd(q, k, v, dout)
    assert _max_diff(ref.attention_backward(q, k, v, dout), oracle) < 1e-10


def test_attention_backward_masks_and_fully_masked_rows():
    q, k, v, dout = _inputs(2, n_q=5, n_k=6, d_k=4, d_v=3, seed=1)
    mask = torch.rand(5, 6, generator=torch.Generator().manual_seed(2)) < 0.6
    mask[:, 0], mask[2] = True, False  # row 2 sees nothing
    _, oracle = _autograd(q, k, v, dout, mask)
    dq, dk, dv = ref.attention_backward(q, k, v, dout, mask)
    assert _max_diff((dq, dk, dv), oracle) < 1e-10
    assert torch.equal(dq[:, 2], torch.zeros_like(dq[:, 2]))  # a query that attends to nothing gets no gradient
    blocked_everywhere = ~mask.any(0)
    if blocked_everywhere.any():
        assert torch.equal(dv[:, blocked_everywhere], torch.zeros_like(dv[:, blocked_everywhere]))


@pytest.mark.parametrize("masked", [False, True])
def test_attention_backward_from_stored_p_equals_autograd(masked):
    q, k, v, dout = _inputs(2, 3, n_q=6, n_k=7, d_k=5, d_v=4, seed=13)
    mask = None
    if masked:
        mask = torch.rand(6, 7, generator=torch.Generator().manual_seed(14)) < 0.6
        mask[:, 0], mask[3] = True, False  # row 3 sees nothing: zero weights, zero gradients
    p = masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(5), mask)  # what the forward stored
    _, oracle = _autograd(q, k, v, dout, mask)
    assert _max_diff(ref.attention_backward_stored(q, k, v, p, dout), oracle) < 1e-10
    # It really uses the P it receives: a different P gives different gradients.
    other = ref.attention_backward_stored(q, k, v, torch.softmax(q @ k.transpose(-2, -1), -1), dout)
    assert _max_diff(other, oracle) > 1e-3


def test_key_gradients_sum_to_zero():
    q, k, v, dout = _inputs(3, n_q=7, n_k=9, d_k=5, d_v=4, seed=3)
    _, dk, _ = ref.attention_backward(q, k, v, dout)
    assert dk.sum(dim=-2).abs().max() < 1e-12


def test_attention_function_gradcheck_and_values():
    q, k, v, dout = _inputs(2, n_q=3, n_k=5, d_k=4, d_v=2, seed=4)
    mask = torch.tensor([[True, False, True, True, False], [False] * 5, [True] * 5])
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    assert torch.autograd.gradcheck(ref.AttentionFunction.apply, (*leaves, mask))
    assert torch.autograd.gradcheck(ref.AttentionFunction.apply, tuple(leaves))
    out = ref.attention_fn(*leaves, mask)
    expected, oracle = _autograd(q, k, v, dout, mask)
    torch.testing.assert_close(out.detach(), expected)
    assert _max_diff(torch.autograd.grad(out, leaves, dout), oracle) < 1e-10


# ============================================================================ the tiled passes
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [1, 3, 4, 16, 64])
def test_tiled_forward_and_backward_equal_autograd(causal, block):
    n_k = 13 if causal else 17
    q, k, v, dout = _inputs(2, 2, n_q=13, n_k=n_k, d_k=6, d_v=5, seed=block)
    expected, oracle = _autograd(q, k, v, dout, causal=causal)
    o, lse = ref.tiled_attention_forward(q, k, v, block, causal=causal)
    torch.testing.assert_close(o, expected, atol=1e-12, rtol=0)
    scores = q @ k.transpose(-2, -1) / math.sqrt(6)
    if causal:
        scores = scores.masked_fill(torch.ones(13, 13, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1), atol=1e-12, rtol=0)
    grads = ref.tiled_attention_backward(q, k, v, o, lse, dout, block, causal=causal)
    assert _max_diff(grads, oracle) < 1e-10
    assert all(g.dtype == torch.float64 and g.shape == t.shape for g, t in zip(grads, (q, k, v)))


def test_tiled_backward_float32_and_extreme_scores():
    q, k, v, dout = _inputs(1, n_q=33, n_k=33, d_k=8, d_v=4, seed=7, dtype=torch.float32)
    o, lse = ref.tiled_attention_forward(q, k, v, 8, causal=True)
    _, oracle = _autograd(q.double(), k.double(), v.double(), dout.double(), causal=True)
    grads = ref.tiled_attention_backward(q, k, v, o, lse, dout, 8, causal=True)
    assert all(g.dtype == torch.float32 for g in grads) and _max_diff(grads, oracle) < 1e-4
    q, k, v, dout = _inputs(n_q=9, n_k=9, d_k=4, d_v=3, seed=8)
    q = q * 300  # scores up to ~10³: exp(S) would overflow, exp(S − L) does not
    o, lse = ref.tiled_attention_forward(q, k, v, 4)
    grads = ref.tiled_attention_backward(q, k, v, o, lse, 1e4 * dout, 4)
    _, oracle = _autograd(q, k, v, 1e4 * dout)
    assert all(torch.isfinite(g).all() for g in grads) and _max_diff(grads, oracle) < 1e-6


@pytest.mark.slow  # gradcheck of a Python loop: seconds on a busy CPU
def test_flash_attention_is_differentiable_and_gradchecks():
    q, k, v, _ = _inputs(2, n_q=6, n_k=6, d_k=3, d_v=2, seed=9)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    for causal in (False, True):
        assert torch.autograd.gradcheck(lambda a, b, c: ref.flash_attention(a, b, c, 4, causal), tuple(leaves))


def test_tiled_backward_holds_no_n_by_n_tensor_and_skips_causal_tiles():
    q, k, v, dout = _inputs(1, n_q=512, n_k=512, d_k=16, d_v=16, seed=10, dtype=torch.float32)
    o, lse = ref.tiled_attention_forward(q, k, v, 64)
    full = _watch_probe(ref.tiled_attention_backward, q, k, v, o, lse, dout, 64)
    causal = _watch_probe(ref.tiled_attention_backward, q, k, v, o, lse, dout, 64, causal=True)
    assert full["largest"] <= 512 * 16 and full["exp_tile"] == [64, 64]
    assert causal["exp_elements"] / full["exp_elements"] == pytest.approx(36 / 64)  # 8·9/2 of 8·8 tiles
    naive = _watch_probe(ref.attention_backward, q, k, v, dout)
    assert naive["largest"] >= 512 * 512


def test_tiled_backward_rejects_bad_arguments():
    q, k, v, dout = _inputs(n_q=4, n_k=5, d_k=3, d_v=2)
    o, lse = ref.tiled_attention_forward(q, k, v, 2)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="block_size"):
            ref.tiled_attention_backward(q, k, v, o, lse, dout, bad)
    with pytest.raises(ValueError, match="as many queries as keys"):
        ref.tiled_attention_backward(q, k, v, o, lse, dout, 2, causal=True)
    with pytest.raises(ValueError, match="lse must have shape"):
        ref.tiled_attention_backward(q, k, v, o, lse[..., None], dout, 2)
    with pytest.raises(ValueError, match="o and dout"):
        ref.tiled_attention_backward(q, k, v, o, lse, dout.T, 2)
    with pytest.raises(ValueError, match="q, k, v must be"):
        ref.tiled_attention_forward(q, k.T, v, 2)


# ============================================================================ the backward in practice
def test_key_order_changes_dq_by_rounding_only_and_dk_dv_not_at_all():
    q, k, v, dout = _inputs(1, n_q=256, n_k=256, d_k=16, d_v=16, seed=15, dtype=torch.float32)
    o, lse = ref.tiled_attention_forward(q, k, v, 32)
    ascending = ref.tiled_attention_backward(q, k, v, o, lse, dout, 32)
    order = torch.randperm(8, generator=torch.Generator().manual_seed(0)).tolist()
    shuffled = ref.tiled_attention_backward(q, k, v, o, lse, dout, 32, key_order=order)
    assert torch.equal(ascending[1], shuffled[1]) and torch.equal(ascending[2], shuffled[2])
    assert not torch.equal(ascending[0], shuffled[0])  # the same terms, added in another order
    torch.testing.assert_close(ascending[0], shuffled[0], atol=1e-5, rtol=1e-5)
    for causal in (False, True):  # any order gives autograd's gradients
        q, k, v, dout = _inputs(2, n_q=11, n_k=11, d_k=4, d_v=3, seed=16)
        o, lse = ref.tiled_attention_forward(q, k, v, 3, causal=causal)
        _, oracle = _autograd(q, k, v, dout, causal=causal)
        got = ref.tiled_attention_backward(q, k, v, o, lse, dout, 3, causal=causal, key_order=[2, 0, 3, 1])
        assert _max_diff(got, oracle) < 1e-10
    with pytest.raises(ValueError, match="permutation"):
        ref.tiled_attention_backward(q, k, v, o, lse, dout, 3, key_order=[0, 1, 2])


@pytest.mark.parametrize("causal", [False, True])
def test_two_pass_backward_equals_autograd_and_is_order_free(causal):
    n_k = 13 if causal else 17
    q, k, v, dout = _inputs(2, n_q=13, n_k=n_k, d_k=6, d_v=5, seed=17)
    _, oracle = _autograd(q, k, v, dout, causal=causal)
    o, lse = ref.tiled_attention_forward(q, k, v, 4, causal=causal)
    assert _max_diff(ref.two_pass_attention_backward(q, k, v, o, lse, dout, 4, causal=causal), oracle) < 1e-10


@pytest.mark.slow  # FlopCounterMode's first use imports sympy: seconds on a busy CPU
def test_two_pass_backward_does_seven_products_per_tile():
    q, k, v, dout = _inputs(1, n_q=128, n_k=128, d_k=32, d_v=32, dtype=torch.float32)
    o, lse = ref.tiled_attention_forward(q, k, v, 64)
    with FlopCounterMode(display=False) as two:
        ref.two_pass_attention_backward(q, k, v, o, lse, dout, 64)
    assert two.get_total_flops() == 7 * 2 * 128 * 128 * 32


def test_low_precision_backward_float32_statistics_are_what_keeps_it_accurate():
    g = torch.Generator().manual_seed(18)
    q, k, v, dout = (torch.randn(1, 256, 32, generator=g).to(torch.bfloat16).double() for _ in range(4))
    o, oracle = _autograd(q, k, v, dout)
    lse = torch.logsumexp(q @ k.transpose(-2, -1) / math.sqrt(32), dim=-1)

    def error(**dtypes):
        grads = ref.lowp_tiled_attention_backward(q, k, v, o, lse, dout, 32, **dtypes)
        assert all(gr.dtype == torch.float32 for gr in grads)
        return max(float((gr.double() - e).norm() / e.norm()) for gr, e in zip(grads, oracle))

    good = error()
    assert good < 5e-3  # bf16 operands, float32 statistics and sums: bf16-level error
    assert error(lse_dtype=torch.bfloat16) > 2 * good  # L rounded to bf16: every weight of a row off together
    assert error(delta_dtype=torch.bfloat16) >= good * 0.9  # D rounded: runs, no better than float32
    assert error(acc_dtype=torch.bfloat16) > 1.5 * good  # the sums rounded to bf16 after every addition
    # Not a float32 backward in disguise: P and dS go through bf16, which costs accuracy.
    o32, lse32 = ref.tiled_attention_forward(q.float(), k.float(), v.float(), 32)
    full32 = ref.tiled_attention_backward(q.float(), k.float(), v.float(), o32, lse32, dout.float(), 32)
    assert max(float((gr.double() - e).norm() / e.norm()) for gr, e in zip(full32, oracle)) < good / 100


def test_dropout_mask_is_replayed_from_seed_and_offset():
    first = ref.dropout_keep_tile(7, 3, (64, 64), 0.1)
    assert first.dtype == torch.bool and first.shape == (64, 64)
    assert torch.equal(first, ref.dropout_keep_tile(7, 3, (64, 64), 0.1))  # replayed: the same bits
    assert not torch.equal(first, ref.dropout_keep_tile(7, 4, (64, 64), 0.1))  # another tile
    assert not torch.equal(first, ref.dropout_keep_tile(8, 3, (64, 64), 0.1))  # another step
    assert abs(first.float().mean().item() - 0.9) < 0.03
    with pytest.raises(ValueError, match="p_drop"):
        ref.dropout_keep_tile(0, 0, (2, 2), 1.0)


# ============================================================================ what the notebook shows
def test_delta_identity_and_p_from_lse():
    q, k, v, dout = _inputs(n_q=20, n_k=20, d_k=5, d_v=5, seed=11)
    o, lse = ref.tiled_attention_forward(q, k, v, 8)
    s = q @ k.T / math.sqrt(5)
    p = torch.softmax(s, -1)
    torch.testing.assert_close(torch.exp(s - lse[:, None]), p)
    torch.testing.assert_close(((dout @ v.T) * p).sum(-1), (dout * o).sum(-1))


def test_output_query_jacobian_is_the_covariance():
    q, k, v, _ = _inputs(n_q=1, n_k=6, d_k=4, d_v=3, seed=12)
    q = q[0]
    jac = torch.autograd.functional.jacobian(lambda x: torch.softmax(k @ x / 2, -1) @ v, q)
    torch.testing.assert_close(ref.output_query_jacobian(q, k, v), jac)
    # Saturated weights: the covariance of a point mass is zero.
    assert ref.output_query_jacobian(q * 1e3, k, v).abs().max() < 1e-6


@pytest.mark.slow  # FlopCounterMode's first use imports sympy: seconds on a busy CPU
def test_flop_counts_match_torch_flop_counter():
    counts = ref.backward_flops(256, 256, 64)
    assert counts["backward"] / counts["forward"] == 2.5
    assert ref.backward_flops(256, 256, 64, recompute=False)["backward"] / counts["forward"] == 2.0
    q, k, v, dout = _inputs(1, 1, n_q=256, n_k=256, d_k=64, d_v=64, dtype=torch.float32)
    with FlopCounterMode(display=False) as fwd:
        fast.naive_attention(q, k, v)
    o, lse = ref.tiled_attention_forward(q, k, v, 64)
    with FlopCounterMode(display=False) as bwd:
        ref.tiled_attention_backward(q, k, v, o, lse, dout, 64)
    assert fwd.get_total_flops() == counts["forward"] and bwd.get_total_flops() == counts["backward"]


def test_saturation_study_tells_the_corrected_story():
    study = ref.saturation_study([4, 64, 1024], n_trials=50)
    scaled, raw = study["scaled"], study["raw"]
    assert raw["dS"][-1] < raw["dS"][0] / 4  # the gradient reaching the scores vanishes without the scale
    assert all(r > s for r, s in zip(raw["dq"], scaled["dq"]))  # the one reaching q does not: it is larger
    assert raw["winner_dv"][-1] > 0.95 and scaled["winner_dv"][-1] < 0.6
    assert max(scaled["dS"]) / min(scaled["dS"]) < 1.3  # with the scale it stays put


def test_visit_order():
    order = ref.visit_order(10, 4, causal=True)
    assert order.tolist() == [[1, 0, 0], [2, 4, 0], [3, 5, 6]]
    assert (ref.visit_order(10, 4, causal=False) > 0).sum() == 9


@pytest.mark.parametrize("make", [
    lambda: ref.plot_visit_order(10, 4),
    lambda: ref.plot_memory([256, 512, 1024], {"store P": [1e6, 4e6, 16e6], "recompute P": [1e6, 1.2e6, 1.5e6]},
                            extrapolate_to=8192, fit={"store P": (16.0, 2.0)}, limit=("Binder: 2 GB", 2e9)),
    lambda: ref.plot_saturation([4, 16], {m: {k: [0.1, 0.2] for k in ("max_weight", "dS", "dq", "winner_dv")}
                                          for m in ("scaled", "raw")}),
])
def test_figures_are_readable(make):
    fig = make()
    try:
        assert plots.readability_problems(fig) == []
    finally:
        plt.close(fig)


def test_attention_backward_shape_mismatch_gets_a_clear_message():
    q, k, v = torch.randn(4, 8), torch.randn(5, 8), torch.randn(5, 6)
    with pytest.raises(ValueError, match="need the same last axis"):
        ref.attention_backward(q, torch.randn(5, 7), v, torch.randn(4, 6))
    with pytest.raises(ValueError, match="one value row per key"):
        ref.attention_backward(q, k, torch.randn(6, 6), torch.randn(4, 6))
    with pytest.raises(ValueError, match=r"dout must have the output's shape \(..., n_q, d_v\) = \(4, 6\)"):
        ref.attention_backward(q, k, v, torch.randn(4, 5))
