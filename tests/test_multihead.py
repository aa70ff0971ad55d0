"""Notebook 07 (attn_course.multihead): the reference multi-head attention against nn.MultiheadAttention."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from attn_course import masks as M
from attn_course.multihead import (
    MultiHeadAttention,
    copy_from_torch,
    copy_to_torch,
    default_d_head,
    kv_cache_bytes,
    merge_heads,
    parameter_count,
    split_heads,
    torch_masks,
)


# ---- reference implementation vs PyTorch ---------------------------------------------------

@pytest.mark.parametrize("d_model,heads", [(12, 3), (16, 4), (8, 1)])
def test_reference_matches_torch_multihead_attention(d_model, heads):
    torch.manual_seed(0)
    ours = MultiHeadAttention(d_model, heads).eval()
    theirs = copy_to_torch(ours, nn.MultiheadAttention(d_model, heads, batch_first=True).eval())
    x = torch.randn(2, 5, d_model)
    out, w = ours(x)
    want_out, want_w = theirs(x, x, x, average_attn_weights=False)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(w, want_w)


def test_reference_cross_attention_and_mask_match_torch():
    torch.manual_seed(1)
    theirs = nn.MultiheadAttention(12, 3, batch_first=True).eval()
    ours = copy_from_torch(theirs, MultiHeadAttention(12, 3)).eval()
    q, kv = torch.randn(2, 4, 12), torch.randn(2, 6, 12)
    allowed = torch.rand(4, 6) > 0.3
    allowed[:, 0] = True  # no fully masked row
    out, w = ours(q, kv, mask=allowed)
    want_out, want_w = theirs(q, kv, kv, attn_mask=~allowed, average_attn_weights=False)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(w, want_w)
    assert (w[..., ~allowed] == 0).all()


def test_reference_matches_scaled_dot_product_attention_per_head():
    torch.manual_seed(2)
    m = MultiHeadAttention(10, 3, 4).eval()  # A·d_head = 12 ≠ d_model = 10
    x = torch.randn(2, 5, 10)
    out, _ = m(x)
    q, k, v = (split_heads(p(x), 3) for p in (m.q_proj, m.k_proj, m.v_proj))
    want = m.out_proj(merge_heads(F.scaled_dot_product_attention(q, k, v)))
    torch.testing.assert_close(out, want)
    assert m.out_proj.weight.shape == (10, 12) and m.q_proj.weight.shape == (12, 10)


def test_split_and_merge_heads_are_inverse_and_put_blocks_in_heads():
    x = torch.arange(2 * 3 * 12, dtype=torch.float32).reshape(2, 3, 12)
    heads = split_heads(x, 4)
    assert heads.shape == (2, 4, 3, 3)
    torch.testing.assert_close(heads[1, 2, 0], x[1, 0, 6:9])  # head 2 of position 0 = features 6..8
    torch.testing.assert_close(merge_heads(heads), x)


def test_grouped_query_attention_equals_mha_with_repeated_kv_weights():
    torch.manual_seed(3)
    gqa = MultiHeadAttention(16, 4, 4, n_kv_heads=2).eval()
    mha = MultiHeadAttention(16, 4, 4).eval()
    with torch.no_grad():
        mha.q_proj.load_state_dict(gqa.q_proj.state_dict())
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
        for full, shared in ((mha.k_proj, gqa.k_proj), (mha.v_proj, gqa.v_proj)):
            w = shared.weight.view(2, 4, 16).repeat_interleave(2, 0).reshape(16, 16)
            b = shared.bias.view(2, 4).repeat_interleave(2, 0).reshape(16)
            full.weight.copy_(w)
            full.bias.copy_(b)
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(gqa(x)[0], mha(x)[0])
    mqa = MultiHeadAttention(16, 4, 4, n_kv_heads=1)
    assert mqa.k_proj.weight.shape == (4, 16)
    assert parameter_count(mqa) < parameter_count(gqa) < parameter_count(mha)


def test_parameter_count_and_kv_cache_formula():
    m = MultiHeadAttention(50, 3, 16)
    assert parameter_count(m) == 3 * (50 * 48 + 48) + (48 * 50 + 50)
    assert parameter_count(MultiHeadAttention(12, 3)) == sum(
        p.numel() for p in nn.MultiheadAttention(12, 3).parameters())
    full = kv_cache_bytes(n_layers=32, n_kv_heads=32, d_head=128, seq_len=4096)
    assert full == 2 * 32 * 32 * 128 * 4096 * 2 == 2**31
    assert kv_cache_bytes(n_layers=32, n_kv_heads=8, d_head=128, seq_len=4096) * 4 == full


def test_dropout_rescales_kept_weights_in_training_only():
    torch.manual_seed(4)
    m = MultiHeadAttention(16, 2, dropout=0.5)
    x = torch.randn(4, 8, 16)
    m.eval()
    _, w_eval = m(x)
    torch.testing.assert_close(w_eval.sum(-1), torch.ones(4, 2, 8))
    m.train()
    torch.manual_seed(5)
    _, w_train = m(x)
    kept = w_train != 0
    torch.testing.assert_close(w_train[kept], 2 * w_eval[kept])  # 1/(1 − p) = 2
    assert not torch.allclose(w_train.sum(-1), torch.ones(4, 2, 8))


def test_module_rejects_bad_sizes():
    with pytest.raises(ValueError, match="must divide"):
        MultiHeadAttention(12, 4, n_kv_heads=3)
    with pytest.raises(ValueError):
        copy_to_torch(MultiHeadAttention(10, 3, 4), nn.MultiheadAttention(10, 2))




def test_default_d_head_is_the_ceiling():
    assert default_d_head(64, 8) == 8 and default_d_head(50, 8) == 7 and default_d_head(10, 4) == 3
    m = MultiHeadAttention(50, 8)
    assert m.d_head == 7 and m.q_proj.weight.shape == (56, 50) and m.out_proj.weight.shape == (50, 56)


@pytest.mark.parametrize("kind", ["self", "causal", "padding", "decoder", "cross", "cross_padding"])
def test_forward_equals_torch_with_its_masks_of_opposite_polarity(kind):
    """Self-, causal and cross-attention with notebook 06's masks (True = may attend) equal
    nn.MultiheadAttention given attn_mask / key_padding_mask (True = blocked)."""
    torch.manual_seed(5)
    batch = M.toy_batch()
    src_real = M.padding_mask_from_ids(batch.src_ids, batch.pad_id)  # (B, S)
    tgt_real = M.padding_mask_from_ids(batch.tgt_ids, batch.pad_id)  # (B, T)
    (B, S), T = batch.src_ids.shape, batch.tgt_ids.shape[1]
    theirs = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    ours = copy_from_torch(theirs, MultiHeadAttention(16, 4)).eval()
    x_tgt, x_src = torch.randn(B, T, 16), torch.randn(B, S, 16)
    if kind == "self":
        mine, torch_args = dict(x_q=x_tgt), dict(query=x_tgt, key=x_tgt, value=x_tgt)
    elif kind == "causal":
        mine = dict(x_q=x_tgt, mask=M.causal_mask(T))
        torch_args = dict(query=x_tgt, key=x_tgt, value=x_tgt, attn_mask=~M.causal_mask(T))
    elif kind == "padding":
        mine = dict(x_q=x_src, mask=M.encoder_mask(batch.src_ids, batch.pad_id))
        torch_args = dict(query=x_src, key=x_src, value=x_src, key_padding_mask=~src_real)
    elif kind == "decoder":
        mine = dict(x_q=x_tgt, mask=M.decoder_mask(batch.tgt_ids, batch.pad_id))
        torch_args = dict(query=x_tgt, key=x_tgt, value=x_tgt, attn_mask=~M.causal_mask(T), key_padding_mask=~tgt_real)
    elif kind == "cross":
        mine, torch_args = dict(x_q=x_tgt, x_kv=x_src), dict(query=x_tgt, key=x_src, value=x_src)
    else:
        mine = dict(x_q=x_tgt, x_kv=x_src, mask=M.cross_attention_mask(batch.tgt_ids, batch.src_ids, batch.pad_id))
        torch_args = dict(query=x_tgt, key=x_src, value=x_src, key_padding_mask=~src_real)
    with torch.no_grad():
        out, w = ours(**mine)
        want_out, want_w = theirs(**torch_args, average_attn_weights=False)
    torch.testing.assert_close(out, want_out, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(w, want_w, atol=1e-6, rtol=1e-5)


def test_torch_masks_converts_every_broadcast_shape():
    torch.manual_seed(6)
    theirs = nn.MultiheadAttention(12, 3, batch_first=True).eval()
    ours = copy_from_torch(theirs, MultiHeadAttention(12, 3)).eval()
    x_q, x_kv = torch.randn(2, 4, 12), torch.randn(2, 5, 12)
    per_head = torch.rand(2, 3, 4, 5) < 0.5
    per_head[..., 0] = True
    for mask in (None, torch.ones(4, 5, dtype=torch.bool).tril(), per_head[:, :1], per_head[:, :1, :1], per_head):
        with torch.no_grad():
            out, w = ours(x_q, x_kv, mask)
            want_out, want_w = theirs(x_q, x_kv, x_kv, attn_mask=torch_masks(mask, batch=2, n_heads=3, n_q=4, n_k=5),
                                      average_attn_weights=False)
        torch.testing.assert_close(out, want_out, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(w, want_w, atol=1e-6, rtol=1e-5)


def test_fully_masked_row_gives_zero_weights_and_the_output_bias():
    torch.manual_seed(7)
    m = MultiHeadAttention(8, 2).eval()
    x = torch.randn(1, 3, 8)
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[1] = False  # query 1 may attend to nothing
    with torch.no_grad():
        out, w = m(x, mask=mask)
    assert torch.isfinite(out).all() and (w[:, :, 1] == 0).all()
    torch.testing.assert_close(out[0, 1], m.out_proj.bias)  # zero attention output, then W^O's bias
    torch.testing.assert_close(w[:, :, [0, 2]].sum(-1), torch.ones(1, 2, 2))


# ----------------------------------------------------------------------------- bad input: clear messages
@pytest.mark.parametrize("call, error, match", [
    (lambda: split_heads(torch.randn(1, 4, 8), 0), ValueError, r"n_heads must be a positive integer.*0"),
    (lambda: merge_heads(torch.randn(4, 8)), ValueError, r"x must be a tensor of shape \(B, A, n, d_head\).*\(4, 8\)"),
    (lambda: MultiHeadAttention(8, 0), ValueError, r"n_heads must be a positive integer.*0"),
    (lambda: MultiHeadAttention(-8, 2), ValueError, r"d_model must be a positive integer.*-8"),
    (lambda: MultiHeadAttention(8, 2, n_kv_heads=0), ValueError, r"n_kv_heads must be a positive integer"),
    (lambda: MultiHeadAttention(8, 2)(torch.randn(1, 4, 6)), ValueError, r"x_q must have shape \(B, n, d_model=8\).*\(1, 4, 6\)"),
    (lambda: MultiHeadAttention(8, 2)(torch.randn(1, 4, 8).double()), TypeError, r"x_q has dtype torch.float64.*torch.float32"),
    (lambda: MultiHeadAttention(8, 2)(torch.randn(1, 4, 8), torch.randn(1, 5, 4)), ValueError, r"x_kv must have shape"),
])
def test_multihead_names_bad_inputs(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_bad_sizes_and_masks_get_a_clear_message():
    with pytest.raises(ValueError, match="n_layers must be a non-negative integer"):
        kv_cache_bytes(n_layers=-1, n_kv_heads=1, d_head=1, seq_len=1)  # used to return -4
    with pytest.raises(ValueError, match=r"mask has shape \(3, 3\), which does not broadcast to .* \(1, 2, 4, 4\)"):
        torch_masks(torch.ones(3, 3, dtype=torch.bool), batch=1, n_heads=2, n_q=4, n_k=4)
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        torch_masks(torch.ones(4, 4), batch=1, n_heads=2, n_q=4, n_k=4)
