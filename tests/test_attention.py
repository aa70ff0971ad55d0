"""Notebook 05: the reference attention against PyTorch, and the checks against known mistakes.

Every buggy function below is written the way a learner would write it (not taken from the check's
own pitfall list), so the tests show that the check recognises real mistakes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attn_course.attention import (
    PUBLISHED,
    attention,
    attention_steps,
    attention_stepper,
    attention_with_mistake,
    format_matrix,
    measure_attention_cost,
    plot_attention_steps,
    score_matrix_bytes,
    worked_example,
)
from attn_course.checks import NotAttempted
from attn_course.checks.attention import check_attention, check_score_matrix_bytes
from checking import rejects


# ----------------------------------------------------------------------------- reference vs PyTorch
@pytest.mark.parametrize("shape_q,shape_k,d_v", [((4, 8), (4, 8), 8), ((2, 5, 6), (2, 7, 6), 3), ((2, 3, 4, 16), (2, 3, 9, 16), 5)])
def test_reference_matches_sdpa(shape_q, shape_k, d_v):
    g = torch.Generator().manual_seed(0)
    Q, K = torch.randn(*shape_q, generator=g), torch.randn(*shape_k, generator=g)
    V = torch.randn(*shape_k[:-1], d_v, generator=g)
    out, w = attention(Q, K, V)
    assert out.shape == (*shape_q[:-1], d_v) and w.shape == (*shape_q[:-1], shape_k[-2])
    torch.testing.assert_close(out, F.scaled_dot_product_attention(Q, K, V), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))


def test_reference_masks_match_sdpa_bool_and_additive():
    g = torch.Generator().manual_seed(1)
    Q, K, V = (torch.randn(2, 3, 5, 8, generator=g) for _ in range(3))
    mask = torch.rand(5, 5, generator=g) < 0.6
    mask[:, 0] = True
    expected = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask)
    torch.testing.assert_close(attention(Q, K, V, mask)[0], expected, atol=1e-6, rtol=1e-5)
    additive = torch.zeros(5, 5).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(attention(Q, K, V, additive)[0], expected, atol=1e-6, rtol=1e-5)


def test_reference_fully_masked_row_is_zero_like_sdpa():
    Q, K, V = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 2)
    mask = torch.tensor([[True, False, True], [False, False, False], [True, True, True]])
    out, w = attention(Q, K, V, mask)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert torch.equal(w[1], torch.zeros(3)) and torch.equal(out[1], torch.zeros(2))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(Q, K, V, attn_mask=mask), atol=1e-6, rtol=1e-5)
    # The gradient stays finite too (no NaN from the blocked row).
    Qg = Q.clone().requires_grad_()
    attention(Qg, K, V, mask)[0].sum().backward()
    assert torch.isfinite(Qg.grad).all()


def test_reference_accepts_numpy():
    Q, K, V = (t.numpy() for t in worked_example())
    out, w = attention(Q, K, V)
    torch.testing.assert_close(out, attention(*worked_example())[0])


def test_worked_example_reproduces_published_matrices():
    steps = dict(zip(["scores", "scaled", "masked", "weights", "output"], (m for _, m in attention_steps(*worked_example()))))
    for name, published in PUBLISHED.items():
        worst = (steps[name] - torch.tensor(published, dtype=torch.float64)).abs().max().item()
        assert worst <= 0.005 + 1e-9, (name, worst)
    assert "-0.00" in format_matrix(steps["scores"])  # the article prints -0.00 for -0.0011


def test_mistakes_differ_from_reference():
    Q, K, V = worked_example()
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    right_out, right_w = attention(Q, K, V, causal)
    for mistake in ["softmax over queries", "no scale", "mask after softmax", "values before softmax"]:
        out, w = attention_with_mistake(Q, K, V, mistake, mask=causal)
        assert not (torch.allclose(out, right_out) and torch.allclose(w, right_w)), mistake


def test_score_matrix_bytes_matches_real_tensors():
    for n, b, h, dtype in [(5, 2, 3, torch.float16), (4, 1, 1, torch.float64), (3, 2, 2, torch.bfloat16)]:
        assert score_matrix_bytes(n, batch=b, heads=h, dtype=dtype) == torch.empty(b, h, n, n, dtype=dtype).nbytes


def test_measure_attention_cost_bytes_exact():
    rows = measure_attention_cost([8, 16], d=4, repeats=1, min_seconds=0.0)
    assert [r["score_bytes"] for r in rows] == [4 * 8 * 8, 4 * 16 * 16]
    assert all(r["seconds"] > 0 for r in rows)


def test_stepper_and_figures_without_kernel():
    import matplotlib.pyplot as plt

    Q, K, V = worked_example()
    fig = attention_stepper(Q, K, V)  # no kernel here: the static figure of step 1
    assert isinstance(fig, plt.Figure)
    assert isinstance(plot_attention_steps(attention_steps(Q, K, V)), plt.Figure)
    plt.close("all")


def test_step_buttons_move_and_clamp():
    from attn_course.attention import _step_buttons

    control = _step_buttons(5)
    assert control.value == 1 and control.previous.disabled
    control.next.click()
    control.next.click()
    assert control.value == 3
    for _ in range(5):
        control.next.click()
    assert control.value == 5 and control.next.disabled
    control.previous.click()
    assert control.value == 4


# ----------------------------------------------------------------------------- check_attention
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
def test_check_attention_accepts_correct_alternatives(fn, capsys):
    check_attention(fn)
    assert "✓ attention" in capsys.readouterr().out


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
    (attn_softmax_dim_minus2, ["softmax runs over axis -2", "dim=-1"]),
    (attn_softmax_dim1, ["softmax runs over axis", "dim=-1"]),
    (attn_no_scale, ["not scaled", "√d_k"]),
    (attn_divide_by_dk, ["divided by d_k instead of √d_k"]),
    (attn_scale_by_dv, ["√d_v"]),
    (attn_mask_after_softmax, ["mask is applied after the softmax"]),
    (attn_polarity_inverted, ["mask polarity inverted"]),
    (attn_weak_fill, ["weak fill value"]),
    (attn_weak_additive, ["weak fill value"]),
    (attn_values_before_softmax, ["V was multiplied in before the softmax"]),
    (attn_mask_ignored, ["mask was ignored"]),
    (attn_K_dot_T, ["K.transpose(-2, -1)"]),
    (attn_naive_softmax, ["NaN", "maximum"]),
    (attn_weights_transposed, ["weights are transposed"]),
    (attn_bool_added, ["bool mask was added"]),
    (attn_scale_by_seq_len, ["√n (the number of queries"]),
    # renormalising after a masked softmax is right on paper but 0/0 once the blocked scores dominate:
    (attn_softmax_then_renormalise, ["NaN for large scores", "before the softmax"]),
])
def test_check_attention_names_each_pitfall(fn, phrases):
    rejects(check_attention, fn, *phrases)


def test_check_attention_not_attempted():
    def attention(Q, K, V, mask=None):
        raise NotImplementedError()

    with pytest.raises(NotAttempted, match="not attempted"):
        check_attention(attention)


def test_check_attention_bad_types_and_shapes():
    rejects(check_attention, 42, "expected a function")
    rejects(check_attention, lambda Q, K, V, mask=None: attn_matmul(Q, K, V, mask)[0], "single tensor", "(output, weights)")
    rejects(check_attention, lambda Q, K, V, mask=None: attn_matmul(Q, K, V, mask)[0].tolist(), "expected a tuple")
    rejects(check_attention, lambda Q, K, V, mask=None: [x.tolist() for x in attn_matmul(Q, K, V, mask)], "Python list")
    rejects(check_attention, lambda Q, K, V, mask=None: attn_matmul(Q, K, V, mask)[::-1], "swapped")
    rejects(check_attention, lambda Q, K, V, mask=None: (attn_matmul(Q, K, V, mask)[0][..., :2], attn_matmul(Q, K, V, mask)[1]),
               "output", "has shape")
    rejects(check_attention, lambda Q, K, V, mask=None: (attn_matmul(Q, K, V, mask)[0], attn_matmul(Q, K, V, mask)[1][..., 1:]),
               "weights", "has shape")
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
def test_check_score_matrix_bytes_accepts(fn, capsys):
    check_score_matrix_bytes(fn)
    assert "✓ score_matrix_bytes" in capsys.readouterr().out


@pytest.mark.parametrize("fn,phrase", [
    (lambda n, batch=1, heads=1, dtype=torch.float32: 8 * bytes_ok(n, batch, heads, dtype), "bits, not bytes"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: heads * n * n * torch.empty((), dtype=dtype).element_size(), "batch size is missing"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * n * n * torch.empty((), dtype=dtype).element_size(), "number of heads is missing"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n * torch.empty((), dtype=dtype).element_size(), "square n"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n * n * 4, "depends on dtype"),
    (lambda n, batch=1, heads=1, dtype=torch.float32: batch * heads * n * n, "number of entries"),
])
def test_check_score_matrix_bytes_names_pitfalls(fn, phrase):
    rejects(check_score_matrix_bytes, fn, phrase)


def test_check_score_matrix_bytes_not_attempted_and_bad_values():
    def score_matrix_bytes(n, batch=1, heads=1, dtype=torch.float32):
        raise NotImplementedError()

    with pytest.raises(NotAttempted, match="not attempted"):
        check_score_matrix_bytes(score_matrix_bytes)
    rejects(check_score_matrix_bytes, "64", "expected a function")
    rejects(check_score_matrix_bytes, lambda n, batch=1, heads=1, dtype=None: [n * n], "Python list")
    rejects(check_score_matrix_bytes, lambda n, batch=1, heads=1, dtype=None: torch.ones(2), "one number")
    rejects(check_score_matrix_bytes, lambda n, batch=1, heads=1, dtype=None: float("nan"), "NaN")
    rejects(check_score_matrix_bytes, lambda n: n, "raised TypeError")
