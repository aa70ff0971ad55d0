"""Notebook 05's reference module (attn_course.attention) against PyTorch, its figures and its explorer.
The checks of the notebook's exercises are tested in tests/checks/test_attention.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attn_course.attention import (
    MISTAKES,
    PUBLISHED,
    attention,
    attention_steps,
    attention_stepper,
    attention_with_mistake,
    measure_attention_cost,
    plot_attention_cost,
    plot_attention_steps,
    plot_step,
    score_matrix_bytes,
)
from attn_course.dot import format_matrix, worked_example
from attn_course.plots import readability_problems


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
    # scores[3, 1] is an exact 0 (the article prints -0.00): a residue whose sign depends on the BLAS, printed 0.00
    assert format_matrix(steps["scores"]).splitlines()[3].split()[1] == "0.00"


def test_mistakes_differ_from_reference():
    Q, K, V = worked_example()
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    right_out, right_w = attention(Q, K, V, causal)
    for mistake in MISTAKES:
        out, w = attention_with_mistake(Q, K, V, mistake, mask=causal)
        same = torch.allclose(out, right_out) and torch.allclose(w, right_w)
        # Renormalising after the softmax is right on paper, and right on this ordinary input:
        assert same == (mistake == "mask after softmax, renormalised"), mistake
    with pytest.raises(ValueError, match="unknown mistake"):
        attention_with_mistake(Q, K, V, "sideways")


def test_renormalised_mask_breaks_on_fully_masked_rows_and_underflow():
    """What notebook 05 shows: masking after the softmax and renormalising gives 0/0 = NaN where the
    reference gives zeros (a fully masked row) or the right weights (blocked scores far above the kept)."""
    Q = torch.tensor([[0.0, 120.0, 5.0], [1.0, 2.0, 3.0]])  # with K = I·√3 the scaled scores are Q
    K, V = torch.eye(3) * 3 ** 0.5, torch.randn(3, 2)
    mask = torch.tensor([[True, False, True], [False, False, False]])
    _, w = attention_with_mistake(Q, K, V, "mask after softmax, renormalised", mask=mask)
    _, right = attention(Q, K, V, mask)
    assert torch.isnan(w).all() and torch.isfinite(right).all()
    kept = torch.softmax(torch.tensor([0.0, 5.0]), -1)  # the softmax over the two allowed keys
    torch.testing.assert_close(right[0], torch.stack([kept[0], torch.tensor(0.0), kept[1]]))
    assert torch.equal(right[1], torch.zeros(3))


def test_steps_show_the_mask_and_the_weights_come_from_masked_softmax():
    from attn_course.softmax import masked_softmax

    Q, K, V = worked_example()
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    steps = dict(attention_steps(Q, K, V, causal))
    scaled, masked, weights = (steps[name] for name in ("2 · scaled ÷ √d_k", "3 · masked", "4 · weights (softmax)"))
    assert torch.isneginf(masked[~causal]).all() and torch.equal(masked[causal], scaled[causal])
    assert torch.equal(weights, masked_softmax(scaled, causal)) and torch.equal(weights, masked_softmax(masked))
    additive = torch.zeros(4, 4, dtype=torch.float64).masked_fill(~causal, float("-inf"))
    assert torch.equal(dict(attention_steps(Q, K, V, additive))["3 · masked"], masked)


def test_score_matrix_bytes_matches_real_tensors():
    for n, b, h, dtype in [(5, 2, 3, torch.float16), (4, 1, 1, torch.float64), (3, 2, 2, torch.bfloat16)]:
        assert score_matrix_bytes(n, batch=b, heads=h, dtype=dtype) == torch.empty(b, h, n, n, dtype=dtype).nbytes


@pytest.mark.slow
def test_measure_attention_cost_bytes_exact():
    rows = measure_attention_cost([8, 16], d=4, min_run_time=0.01, rounds=1)
    assert [r["score_bytes"] for r in rows] == [4 * 8 * 8, 4 * 16 * 16]
    assert all(r["ms"] > 0 for r in rows)
    assert torch.get_num_threads() >= 1  # restored after the measurement


@pytest.mark.slow
def test_figures_readable_at_1366x768():
    import matplotlib.pyplot as plt

    Q, K, V = worked_example()
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    steps = attention_steps(Q, K, V, causal)
    labels = ["tok0", "tok1", "tok2", "tok3"]
    figures = [plot_attention_steps(steps, query_labels=labels, key_labels=labels, title="a title"),
               attention_stepper(Q, K, V, causal, query_labels=labels, key_labels=labels),  # no kernel: step 1
               plot_step(steps, 3), plot_step(steps, 5),
               plot_attention_cost([{"n": n, "ms": n * n / 1e4, "score_bytes": 4 * n * n} for n in (64, 128, 256)])]
    for fig in figures:
        assert isinstance(fig, plt.Figure) and readability_problems(fig) == []
    # Step 4's colour scale is 0…1 whatever the weights (near-uniform rows must look near-uniform).
    weights_image = plot_step(steps, 4).axes[0].images[0]
    assert weights_image.get_clim() == (0.0, 1.0)
    # Step 3 marks the blocked scores.
    assert sum(t.get_text() == "−∞" for t in figures[0].axes[2].texts) == int((~causal).sum())
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


# ----------------------------------------------------------------------------- bad input: clear messages
@pytest.mark.parametrize("args, error, match", [
    ((torch.randn(4, 8), torch.randn(5, 7), torch.randn(5, 6)), ValueError, r"Q has d_k = 8 .* K has d_k = 7"),
    ((torch.randn(4, 8), torch.randn(5, 8), torch.randn(6, 6)), ValueError, r"K has n_k = 5 rows .* V has 6"),
    ((torch.ones(4, 8, dtype=torch.long), torch.ones(5, 8), torch.ones(5, 6)), TypeError, r"Q must be a floating-point .* torch.int64"),
    ((np.ones((4, 8), dtype=int), np.ones((5, 8)), np.ones((5, 6))), TypeError, r"Q must be a floating-point"),
    ((torch.randn(4, 8).double(), torch.randn(5, 8), torch.randn(5, 6)), TypeError, r"share one dtype"),
    (([[1.0] * 8], torch.randn(5, 8), torch.randn(5, 6)), TypeError, r"Q must be a torch.Tensor or a NumPy array.* list"),
    ((None, torch.randn(5, 8), torch.randn(5, 6)), TypeError, r"Q must be a torch.Tensor"),
])
def test_attention_bad_inputs_are_named(args, error, match):
    with pytest.raises(error, match=match):
        attention(*args)
    with pytest.raises(error, match=match):
        attention_steps(*args)


@pytest.mark.parametrize("mask, error, match", [
    (torch.ones(4, 5, dtype=torch.long).tril(), TypeError, r"mask must be a bool tensor .* torch.int64"),
    (torch.ones(4, 5).tril(), ValueError, r"only 0s and 1s.*mask.bool\(\)"),
    (torch.ones(5, 4, dtype=torch.bool), ValueError, r"mask has shape \(5, 4\).*\(4, 5\)"),
])
def test_attention_bad_masks_are_named(mask, error, match):
    with pytest.raises(error, match=match):
        attention(torch.randn(4, 8), torch.randn(5, 8), torch.randn(5, 6), mask)


def test_attention_float_additive_mask_still_works():
    mask = torch.zeros(4, 5).masked_fill(~torch.ones(4, 5, dtype=torch.bool).tril(), float("-inf"))
    _, weights = attention(torch.randn(4, 8), torch.randn(5, 8), torch.randn(5, 6), mask)
    assert torch.equal(weights > 0, torch.ones(4, 5, dtype=torch.bool).tril())


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(n=-5), ValueError, r"n must be a non-negative integer.*-5"),
    (dict(n=2.5), ValueError, r"n must be a non-negative integer.*2.5"),
    (dict(n=8, dtype="float16"), TypeError, r"dtype must be a torch.dtype"),
])
def test_score_matrix_bytes_bad_inputs(kwargs, error, match):
    with pytest.raises(error, match=match):
        score_matrix_bytes(**kwargs)
