"""Notebook 06: the reference masks against PyTorch, and each mask check against known mistakes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attn_course import masks as M
from attn_course.attention import attention
from attn_course.checks import NotAttempted
from attn_course.checks.masks import (
    check_additive_mask,
    check_causal_mask,
    check_cross_attention_mask,
    check_decoder_mask,
    check_padding_mask_from_ids,
    check_padding_mask_from_lengths,
)
from checking import rejects, accepts


def not_attempted(check, n_args):
    def unfinished(*args, **kwargs):
        raise NotImplementedError()

    with pytest.raises(NotAttempted, match="not attempted"):
        check(unfinished)


# ----------------------------------------------------------------------------- references vs PyTorch
def test_causal_mask_matches_pytorch_is_causal():
    q, k, v = (torch.randn(2, 3, 6, 4) for _ in range(3))
    out, _ = attention(q, k, v, M.causal_mask(6))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6, rtol=1e-5)


def test_padding_masks_agree_with_each_other_and_multihead_attention():
    batch = M.toy_batch()
    real = M.padding_mask_from_ids(batch.src_ids, batch.pad_id)
    assert torch.equal(real, M.padding_mask_from_lengths(real.sum(-1), batch.src_ids.shape[1]))
    # nn.MultiheadAttention's key_padding_mask is True = blocked: the opposite polarity.
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True, bias=False)
    x = torch.randn(*batch.src_ids.shape, 8)
    expected, _ = mha(x, x, x, key_padding_mask=~real)
    torch.testing.assert_close(mha(x, x, x, attn_mask=~M.encoder_mask(batch.src_ids, batch.pad_id).repeat_interleave(2, 0).squeeze(1))[0],
                               expected, atol=1e-6, rtol=1e-5)


def test_decoder_and_cross_masks_against_sdpa_over_heads():
    batch = M.toy_batch()
    B, T, S, H = *batch.tgt_ids.shape, batch.src_ids.shape[1], 4
    dec = M.decoder_mask(batch.tgt_ids, batch.pad_id)
    cross = M.cross_attention_mask(batch.tgt_ids, batch.src_ids, batch.pad_id)
    assert dec.shape == (B, 1, T, T) and cross.shape == (B, 1, T, S)
    assert dec.any(-1).all() and cross.any(-1).all()  # keys-only padding: no fully masked row
    q, k, v = torch.randn(B, H, T, 8), torch.randn(B, H, S, 8), torch.randn(B, H, S, 8)
    torch.testing.assert_close(attention(q, k, v, cross)[0], F.scaled_dot_product_attention(q, k, v, attn_mask=cross), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(attention(q, q, q, dec)[0], F.scaled_dot_product_attention(q, q, q, attn_mask=dec), atol=1e-6, rtol=1e-5)
    expected = torch.ones(T, T, dtype=torch.bool).tril() & (batch.tgt_ids != batch.pad_id)[:, None, None, :]
    assert torch.equal(dec, expected)


def test_additive_mask_equivalent_in_sdpa():
    mask = M.decoder_mask(M.toy_batch().tgt_ids, 0)
    q = torch.randn(2, 3, mask.shape[-1], 4)
    for dtype in (torch.float32, torch.float64):
        add = M.additive_mask(mask, dtype)
        assert add.dtype == dtype and set(add.unique().tolist()) <= {0.0, float("-inf")}
        torch.testing.assert_close(F.scaled_dot_product_attention(q.to(dtype), q.to(dtype), q.to(dtype), attn_mask=add),
                                   F.scaled_dot_product_attention(q.to(dtype), q.to(dtype), q.to(dtype), attn_mask=mask))
    assert M.additive_mask(mask, torch.float16).dtype == torch.float16


def test_toy_batch_and_figures():
    import matplotlib.pyplot as plt

    batch = M.toy_batch()
    assert M.PAD in batch.src_tokens[0] and M.PAD in batch.tgt_tokens[0]
    assert batch.tgt_tokens[0][0] == M.BOS
    for kind in M.KINDS:
        mask, weights, rows, cols = M.mask_example(kind, batch, 0)
        assert weights.shape[-2:] == (len(rows), len(cols))
        assert torch.all(weights[~torch.broadcast_to(mask, weights.shape)] == 0)
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    assert isinstance(M.mask_builder(batch), plt.Figure)  # no kernel: the static figure
    plt.close("all")


# ----------------------------------------------------------------------------- check_causal_mask
@pytest.mark.parametrize("fn", [
    M.causal_mask,
    lambda n: torch.tril(torch.ones(n, n)).bool(),
    lambda n: torch.arange(n)[:, None] >= torch.arange(n)[None, :],
    lambda n: np.tril(np.ones((n, n), dtype=bool)),  # NumPy result
    lambda n: torch.ones(n, n).tril().log(),  # additive: 0 kept, -inf blocked
    lambda n: torch.ones(n, n, dtype=torch.bool).tril()[None, None],  # (1, 1, n, n)
])
def test_causal_accepts(fn, capsys):
    accepts(check_causal_mask, fn, capsys)


@pytest.mark.parametrize("fn,phrase", [
    (lambda n: torch.ones(n, n, dtype=torch.bool).triu(), "upper triangle"),
    (lambda n: torch.ones(n, n, dtype=torch.bool).tril(-1), "diagonal excluded"),
    (lambda n: torch.ones(n, n, dtype=torch.bool).tril(1), "one diagonal too many"),
    (lambda n: torch.ones(n, n, dtype=torch.bool).triu(1), "polarity inverted"),
    (lambda n: torch.ones(n, n, dtype=torch.bool), "nothing is masked"),
    (lambda n: torch.ones(n, n).tril(), "float mask of 0s and 1s"),
    (lambda n: torch.ones(n, n, dtype=torch.long).tril(), "expected a bool mask"),
    (lambda n: torch.zeros(n, n).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -1e4), "weak fill value"),
    (lambda n: torch.ones(n + 1, n + 1, dtype=torch.bool).tril(), "does not broadcast"),
    (lambda n: torch.ones(n, n, dtype=torch.bool).tril().tolist(), "Python list"),
])
def test_causal_rejects(fn, phrase):
    rejects(check_causal_mask, fn, phrase)


def test_causal_not_attempted_and_not_callable():
    not_attempted(check_causal_mask, 1)
    rejects(check_causal_mask, torch.ones(3, 3), "expected a function")
    rejects(check_causal_mask, lambda n: None, "None")


# ----------------------------------------------------------------------------- padding masks
@pytest.mark.parametrize("fn", [
    M.padding_mask_from_lengths,
    lambda lengths, max_len=None: torch.stack([torch.arange(max_len or int(lengths.max())) < L for L in lengths]),
    lambda lengths, max_len=None: (torch.arange(max_len or int(max(lengths)))[None, :] < lengths[:, None]).numpy(),
])
def test_lengths_accepts(fn, capsys):
    accepts(check_padding_mask_from_lengths, fn, capsys)


@pytest.mark.parametrize("fn,phrase", [
    (lambda lengths, max_len=None: torch.arange(max_len or int(lengths.max())) <= lengths[:, None], "off by one"),
    (lambda lengths, max_len=None: torch.arange(max_len or int(lengths.max())) < lengths[:, None] - 1, "last real token"),
    (lambda lengths, max_len=None: torch.arange(max_len or int(lengths.max())) >= lengths[:, None], "polarity inverted"),
    (lambda lengths, max_len=None: (torch.arange(max_len or int(lengths.max())) < lengths[:, None]).T, "transposed"),
    (lambda lengths, max_len=None: torch.arange(int(lengths.max())) < lengths[:, None], "max_len was ignored"),
])
def test_lengths_rejects(fn, phrase):
    rejects(check_padding_mask_from_lengths, fn, phrase)


def test_lengths_not_attempted_and_bad_results():
    not_attempted(check_padding_mask_from_lengths, 2)
    rejects(check_padding_mask_from_lengths, lambda lengths, max_len=None: torch.full((2, 2), float("nan")), "NaN")
    rejects(check_padding_mask_from_lengths, lambda lengths: lengths, "raised TypeError")


@pytest.mark.parametrize("fn", [
    M.padding_mask_from_ids,
    lambda ids, pad_id: ids.ne(pad_id),
    lambda ids, pad_id: ~(ids == pad_id),
    lambda ids, pad_id: torch.where(ids == pad_id, float("-inf"), 0.0),  # additive
])
def test_ids_accepts(fn, capsys):
    accepts(check_padding_mask_from_ids, fn, capsys)


@pytest.mark.parametrize("fn,phrase", [
    (lambda ids, pad_id: ids != 0, "pad_id is ignored"),
    (lambda ids, pad_id: ids == pad_id, "polarity inverted"),
    (lambda ids, pad_id: (ids != pad_id).T, "transposed"),
    (lambda ids, pad_id: (ids != pad_id).float(), "float mask of 0s and 1s"),
    (lambda ids, pad_id: (ids != pad_id).tolist(), "Python list"),
])
def test_ids_rejects(fn, phrase):
    rejects(check_padding_mask_from_ids, fn, phrase)


def test_ids_not_attempted():
    not_attempted(check_padding_mask_from_ids, 2)
    rejects(check_padding_mask_from_ids, "ids != pad_id", "expected a function")


# ----------------------------------------------------------------------------- decoder mask
def _causal(T):
    return torch.ones(T, T, dtype=torch.bool).tril()


@pytest.mark.parametrize("fn", [
    M.decoder_mask,
    lambda ids, pad: _causal(ids.shape[1])[None, None] & (ids != pad)[:, None, None, :],
    lambda ids, pad: (_causal(ids.shape[1]) & (ids != pad).unsqueeze(1)).unsqueeze(1),
    lambda ids, pad: (_causal(ids.shape[1]) & (ids != pad)[:, None, None, :]).expand(-1, 3, -1, -1),  # (B, H, T, T)
    lambda ids, pad: M.additive_mask(M.decoder_mask(ids, pad)),  # additive form
    # seed 004's style, padding queries blocked too: accepted (harmless for real tokens)
    lambda ids, pad: _causal(ids.shape[1]) & (ids != pad)[:, None, None, :] & (ids != pad)[:, None, :, None],
])
def test_decoder_accepts(fn, capsys):
    accepts(check_decoder_mask, fn, capsys)


@pytest.mark.parametrize("fn,phrase", [
    (lambda ids, pad: _causal(ids.shape[1]) & (ids != pad)[:, None, :, None], "applied to the queries (rows) instead of the keys"),
    (lambda ids, pad: _causal(ids.shape[1]) & (ids != pad)[:, None, :], "no heads axis"),
    (lambda ids, pad: _causal(ids.shape[1])[None, None].expand(ids.shape[0], 1, -1, -1), "padding part is missing"),
    (lambda ids, pad: (ids != pad)[:, None, None, :].expand(-1, 1, ids.shape[1], -1), "causal part is missing"),
    (lambda ids, pad: _causal(ids.shape[1]) | (ids != pad)[:, None, None, :], "not | (OR)"),
    (lambda ids, pad: _causal(ids.shape[1]).T & (ids != pad)[:, None, None, :], "upper triangle"),
    (lambda ids, pad: _causal(ids.shape[1]).tril(-1) & (ids != pad)[:, None, None, :], "diagonal excluded"),
    (lambda ids, pad: ~(_causal(ids.shape[1]) & (ids != pad)[:, None, None, :]), "polarity inverted"),
    (lambda ids, pad: torch.zeros(ids.shape[0], 1, ids.shape[1], ids.shape[1]).masked_fill(
        ~(_causal(ids.shape[1]) & (ids != pad)[:, None, None, :]), -1e4), "weak fill value"),
])
def test_decoder_rejects(fn, phrase):
    rejects(check_decoder_mask, fn, phrase)


def test_decoder_not_attempted():
    not_attempted(check_decoder_mask, 2)
    rejects(check_decoder_mask, lambda ids, pad: [[True]], "Python list")


# ----------------------------------------------------------------------------- cross mask
@pytest.mark.parametrize("fn", [
    M.cross_attention_mask,
    lambda tgt, src, pad: (src != pad)[:, None, None, :],  # (B, 1, 1, S) broadcasts over heads and queries
    lambda tgt, src, pad: (src != pad)[:, None, None, :].repeat(1, 1, tgt.shape[1], 1),
    lambda tgt, src, pad: M.additive_mask(M.cross_attention_mask(tgt, src, pad), torch.float64),
])
def test_cross_accepts(fn, capsys):
    accepts(check_cross_attention_mask, fn, capsys)


@pytest.mark.parametrize("fn,phrase", [
    (lambda tgt, src, pad: M.cross_attention_mask(tgt, src, pad).transpose(-2, -1), "rows and columns swapped"),
    (lambda tgt, src, pad: (tgt != pad)[:, None, :, None].expand(-1, 1, -1, src.shape[1]), "target padding (the queries' rows) is blocked instead"),
    (lambda tgt, src, pad: M.cross_attention_mask(tgt, src, pad) & (tgt != pad)[:, None, :, None], "only the source padding"),
    (lambda tgt, src, pad: M.cross_attention_mask(tgt, src, pad) & torch.ones(tgt.shape[1], src.shape[1], dtype=torch.bool).tril(),
     "no causal constraint"),
    (lambda tgt, src, pad: M.cross_attention_mask(tgt, src, pad)[:, 0], "no heads axis"),
    (lambda tgt, src, pad: ~M.cross_attention_mask(tgt, src, pad), "polarity inverted"),
])
def test_cross_rejects(fn, phrase):
    rejects(check_cross_attention_mask, fn, phrase)


def test_cross_not_attempted():
    not_attempted(check_cross_attention_mask, 3)
    rejects(check_cross_attention_mask, lambda tgt, src, pad: torch.ones(2, 2, 2, 2, dtype=torch.bool), "does not broadcast")


# ----------------------------------------------------------------------------- additive mask
@pytest.mark.parametrize("fn", [
    M.additive_mask,
    lambda mask, dtype=torch.float32: torch.where(mask, torch.tensor(0.0, dtype=dtype), torch.tensor(float("-inf"), dtype=dtype)),
    lambda mask, dtype=torch.float32: torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min),
    lambda mask, dtype=torch.float32: torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, max(-1e9, torch.finfo(dtype).min)),
    lambda mask, dtype=torch.float32: ((~mask).to(dtype) * -1e9).to(dtype),  # 0·(-1e9) = 0; in float16 -1e9 → -inf
])
def test_additive_accepts(fn, capsys):
    accepts(check_additive_mask, fn, capsys)


@pytest.mark.parametrize("fn,phrase", [
    (lambda mask, dtype=torch.float32: torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, -1e4), "weak fill value"),
    (lambda mask, dtype=torch.float32: torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, -1e9), "cannot be stored in float16"),
    (lambda mask, dtype=torch.float32: (~mask).to(dtype) * float("-inf"), "0 × (-inf) is NaN"),
    (lambda mask, dtype=torch.float32: mask.to(dtype), "blocks nothing"),
    (lambda mask, dtype=torch.float32: torch.zeros(mask.shape, dtype=dtype).masked_fill(mask, float("-inf")), "polarity inverted"),
    (lambda mask, dtype=torch.float32: torch.zeros(mask.shape).masked_fill(~mask, float("-inf")), "expected float16"),
    (lambda mask, dtype=torch.float32: torch.zeros(3, dtype=dtype), "expected the mask's shape"),
    (lambda mask, dtype=torch.float32: mask.tolist(), "Python list"),
])
def test_additive_rejects(fn, phrase):
    rejects(check_additive_mask, fn, phrase)


def test_additive_not_attempted():
    not_attempted(check_additive_mask, 1)
    rejects(check_additive_mask, None, "expected a function")
