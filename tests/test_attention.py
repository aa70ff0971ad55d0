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
