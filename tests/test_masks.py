"""Notebook 06's reference module (attn_course.masks) against PyTorch, its figures and its explorer.
The checks of the notebook's exercises are tested in tests/checks/test_masks.py."""

from __future__ import annotations

import matplotlib
import pytest
import torch
import torch.nn.functional as F

from attn_course import masks as M
from attn_course.attention import attention
from attn_course.plots import readability_problems


def test_causal_mask_matches_pytorch_is_causal():
    q, k, v = (torch.randn(2, 3, 6, 4) for _ in range(3))
    out, _ = attention(q, k, v, M.causal_mask(6))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6, rtol=1e-5)


def test_is_causal_aligns_top_left_when_n_q_differs_from_n_k():
    """What notebook 06 says about is_causal with n_q ≠ n_k: the mask is tril of the (n_q, n_k) rectangle
    from the top-left corner; decoding needs the bottom-right alignment (torch's causal_lower_right)."""
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = torch.randn(2, 4), torch.randn(5, 4), torch.randn(5, 3)
    top_left = torch.ones(2, 5, dtype=torch.bool).tril()
    bottom_right = torch.ones(2, 5, dtype=torch.bool).tril(diagonal=5 - 2)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, is_causal=True),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=top_left))
    assert torch.equal(causal_lower_right(2, 5)._materialize(), bottom_right)


def test_padding_masks_agree_with_each_other_and_multihead_attention():
    batch = M.toy_batch()
    real = M.padding_mask_from_ids(batch.src_ids, batch.pad_id)
    assert torch.equal(real, M.padding_mask_from_lengths(real.sum(-1), batch.src_ids.shape[1]))
    assert torch.equal(M.padding_mask_from_lengths(torch.tensor([2, 0]), 3),
                       torch.tensor([[True, True, False], [False, False, False]]))
    # nn.MultiheadAttention's key_padding_mask is True = blocked: the opposite polarity.
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True, bias=False)
    x = torch.randn(*batch.src_ids.shape, 8)
    expected, _ = mha(x, x, x, key_padding_mask=~real)
    attn_mask = ~M.encoder_mask(batch.src_ids, batch.pad_id).repeat_interleave(2, 0).squeeze(1)
    torch.testing.assert_close(mha(x, x, x, attn_mask=attn_mask)[0], expected, atol=1e-6, rtol=1e-5)


def test_decoder_and_cross_masks_against_sdpa_over_heads():
    batch = M.toy_batch()
    B, T, S, H = *batch.tgt_ids.shape, batch.src_ids.shape[1], 4
    dec = M.decoder_mask(batch.tgt_ids, batch.pad_id)
    cross = M.cross_attention_mask(batch.tgt_ids, batch.src_ids, batch.pad_id)
    assert dec.shape == (B, 1, T, T) and cross.shape == (B, 1, T, S)
    assert dec.any(-1).all() and cross.any(-1).all()  # right padding, keys only: every row has a key
    q, k, v = torch.randn(B, H, T, 8), torch.randn(B, H, S, 8), torch.randn(B, H, S, 8)
    torch.testing.assert_close(attention(q, k, v, cross)[0], F.scaled_dot_product_attention(q, k, v, attn_mask=cross),
                               atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(attention(q, q, q, dec)[0], F.scaled_dot_product_attention(q, q, q, attn_mask=dec),
                               atol=1e-6, rtol=1e-5)
    expected = torch.ones(T, T, dtype=torch.bool).tril() & (batch.tgt_ids != batch.pad_id)[:, None, None, :]
    assert torch.equal(dec, expected)


def test_fully_masked_rows_occur_with_left_padding_and_all_pad_sequences():
    """The module docstring's claim (and notebook 06's): key-only padding still gives fully masked rows
    for the <pad> queries before the first real token, and for every row of an all-<pad> sequence;
    the reference gives them zero weights and a zero output, like F.scaled_dot_product_attention."""
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 0], [0, 0, 0, 0]])  # left padding, right padding, all <pad>
    dec = M.decoder_mask(ids, 0)  # (3, 1, 4, 4)
    empty = ~dec.any(-1)[:, 0]  # (3, 4)
    assert empty.tolist() == [[True, True, False, False], [False] * 4, [True] * 4]
    assert (~M.encoder_mask(ids, 0).any(-1))[2].all()
    q = torch.randn(3, 2, 4, 8)
    out, weights = attention(q, q, q, dec)
    assert torch.equal(weights[empty[:, None].expand(-1, 2, -1)], torch.zeros(12, 4))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, q, q, attn_mask=dec), atol=1e-6, rtol=1e-5)


def test_the_fates_of_a_fully_masked_row_that_notebook_06_states():
    """Notebook 06's list, on the installed PyTorch (the course requires >= 2.5, tests with 2.13): -inf then
    softmax gives NaN, -1e9 gives uniform weights, F.scaled_dot_product_attention gives zeros with each of its
    CPU kernels, nn.MultiheadAttention gives NaN with need_weights=True and zeros with need_weights=False."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    scores = torch.tensor([[0.5, -0.3, 0.8]])  # (1, 3): one query whose every key is blocked
    none = torch.zeros(1, 3, dtype=torch.bool)
    assert torch.isnan(torch.softmax(scores.masked_fill(~none, float("-inf")), -1)).all()
    torch.testing.assert_close(torch.softmax(scores.masked_fill(~none, -1e9), -1), torch.full((1, 3), 1 / 3))
    q, k, v = torch.randn(1, 1, 2, 8), torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8)
    allowed = torch.tensor([[True, True, False], [False, False, False]])
    for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION):
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        assert torch.equal(out[0, 0, 1], torch.zeros(8)), backend
    mha = torch.nn.MultiheadAttention(embed_dim=3, num_heads=1, batch_first=True)
    x_q, x_k = torch.randn(1, 2, 3), torch.randn(1, 3, 3)
    out, _ = mha(x_q, x_k, x_k, attn_mask=~allowed, need_weights=True)
    assert torch.isnan(out[0, 1]).all()
    out, _ = mha(x_q, x_k, x_k, attn_mask=~allowed, need_weights=False)
    assert torch.equal(out[0, 1], torch.zeros(3))  # the attention output is zero, the output projection's bias is 0


def test_additive_mask_equivalent_in_sdpa():
    mask = M.decoder_mask(M.toy_batch().tgt_ids, 0)
    q = torch.randn(2, 3, mask.shape[-1], 4)
    for dtype in (torch.float32, torch.float64):
        add = M.additive_mask(mask, dtype)
        assert add.dtype == dtype and set(add.unique().tolist()) <= {0.0, float("-inf")}
        torch.testing.assert_close(F.scaled_dot_product_attention(q.to(dtype), q.to(dtype), q.to(dtype), attn_mask=add),
                                   F.scaled_dot_product_attention(q.to(dtype), q.to(dtype), q.to(dtype), attn_mask=mask))
    assert M.additive_mask(mask, torch.float16).dtype == torch.float16


def test_toy_batch_and_mask_examples():
    batch = M.toy_batch()
    assert M.PAD in batch.src_tokens[0] and M.PAD in batch.tgt_tokens[0]
    assert batch.tgt_tokens[0][0] == M.BOS
    for kind in M.KINDS:
        mask, weights, rows, cols = M.mask_example(kind, batch, 0)
        assert weights.shape[-2:] == (len(rows), len(cols))
        assert torch.all(weights[~torch.broadcast_to(mask, weights.shape)] == 0)
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    with pytest.raises(ValueError, match="unknown kind"):
        M.mask_example("sideways", batch, 0)


@pytest.mark.slow
def test_figures_are_readable_at_1366x768():
    import matplotlib.pyplot as plt

    batch = M.toy_batch()
    for kind, b in zip(M.KINDS, (0, 1, 1)):  # the longest sentences' labels included
        mask, weights, rows, cols = M.mask_example(kind, batch, b)
        fig = M.plot_mask_and_weights(mask[b, 0], weights[b, 0], rows, cols, title=kind)
        assert readability_problems(fig) == [], kind
        plt.close(fig)
    fig = M.mask_builder(batch)  # no kernel here: the static figure
    assert isinstance(fig, matplotlib.figure.Figure) and readability_problems(fig) == []
    plt.close("all")


@pytest.mark.slow
def test_mask_builder_offers_the_sentences(monkeypatch):
    """The "sentences" dropdown shows each pair's words, not 0/1 (issue 11)."""
    import matplotlib.pyplot as plt

    from attn_course import widgets

    monkeypatch.setattr(widgets, "_live_kernel", lambda: True)
    explorer = M.mask_builder(M.toy_batch())
    labels = [label for label, _ in explorer.controls["pair"].options]
    assert labels == ["the cat sleeps → il gatto dorme", "my sister reads a new book → mia sorella legge un libro nuovo"]
    explorer.controls["pair"].value = 1  # redraws without error
    assert explorer.image.value
    plt.close("all")


# ----------------------------------------------------------------------------- bad input: clear messages
@pytest.mark.parametrize("call, error, match", [
    (lambda: M.causal_mask(-3), ValueError, r"n must be a non-negative integer.*-3"),
    (lambda: M.causal_mask(2.5), ValueError, r"n must be a non-negative integer.*2.5"),
    (lambda: M.padding_mask_from_lengths([3, 5], max_len=4), ValueError, r"max_len=4 is shorter .*\(5 tokens\)"),
    (lambda: M.padding_mask_from_lengths([-1, 5]), ValueError, r"lengths must be non-negative"),
    (lambda: M.padding_mask_from_lengths([2.5, 5]), ValueError, r"lengths must be a 1-D sequence of integers"),
    (lambda: M.padding_mask_from_lengths(3), ValueError, r"lengths must be a 1-D sequence"),
    (lambda: M.encoder_mask(torch.tensor([1, 2, 0]), 0), ValueError, r"src_ids must have shape \(B, n\).*\(3,\)"),
    (lambda: M.decoder_mask(torch.tensor([1, 2, 0]), 0), ValueError, r"tgt_ids must have shape \(B, n\)"),
    (lambda: M.cross_attention_mask(torch.ones(2, 3, dtype=torch.long), torch.ones(3, 4, dtype=torch.long), 0),
     ValueError, r"tgt_ids has 2 sequences .* src_ids has 3"),
    (lambda: M.additive_mask(torch.ones(3, 3)), TypeError, r"mask must be a bool tensor.*torch.float32"),
    (lambda: M.additive_mask(torch.ones(3, 3, dtype=torch.bool), dtype=torch.long), TypeError, r"dtype must be a floating-point"),
    (lambda: M.mask_example("cross-attention", M.toy_batch(), 5), ValueError, r"b must pick one of the batch's 2"),
])
def test_mask_builders_name_bad_inputs(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_padding_mask_from_ids_accepts_lists():
    assert torch.equal(M.padding_mask_from_ids([[1, 2, 0]], 0), torch.tensor([[True, True, False]]))
