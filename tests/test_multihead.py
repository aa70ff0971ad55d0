"""Notebook 07: the reference multi-head attention against PyTorch, and each check's diagnoses."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from attn_course.checks._core import NotAttempted
from attn_course.checks.multihead import check_merge_heads, check_multi_head_attention, check_split_heads
from attn_course.multihead import (
    MultiHeadAttention,
    copy_from_torch,
    copy_to_torch,
    kv_cache_bytes,
    merge_heads,
    parameter_count,
    split_heads,
)
from checking import rejects


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
    out, w = ours(q, kv, kv, mask=allowed)
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
    with pytest.raises(ValueError, match="pass d_head"):
        MultiHeadAttention(50, 3)
    with pytest.raises(ValueError, match="must divide"):
        MultiHeadAttention(12, 4, n_kv_heads=3)
    with pytest.raises(ValueError):
        copy_to_torch(MultiHeadAttention(10, 3, 4), nn.MultiheadAttention(10, 2))


# ---- check_split_heads ---------------------------------------------------------------------

def split_view(x, n_heads):
    b, n, d = x.shape
    return x.view(b, n, n_heads, d // n_heads).permute(0, 2, 1, 3)


def split_chunks(x, n_heads):
    return torch.stack(x.chunk(n_heads, dim=-1), dim=1)


def split_numpy(x, n_heads):
    a = np.asarray(x)
    b, n, d = a.shape
    return a.reshape(b, n, n_heads, d // n_heads).transpose(0, 2, 1, 3)


def split_einsum_free(x, n_heads):
    return torch.einsum("bnhd->bhnd", x.unflatten(-1, (n_heads, -1)))


@pytest.mark.parametrize("fn", [split_heads, split_view, split_chunks, split_numpy, split_einsum_free])
def test_split_check_accepts_alternatives(fn, capsys):
    check_split_heads(fn)
    assert "✓ split heads" in capsys.readouterr().out


def test_split_check_rejects_reshape_without_transpose():
    rejects(check_split_heads, lambda x, a: x.reshape(x.shape[0], a, x.shape[1], -1),
               "without a transpose", "heads mixed with positions")


def test_split_check_rejects_strided_split():
    rejects(check_split_heads, lambda x, a: x.reshape(*x.shape[:2], -1, a).permute(0, 3, 1, 2),
               "wrong order", "(A, d_head), not (d_head, A)")


def test_split_check_rejects_missing_transpose():
    rejects(check_split_heads, lambda x, a: x.reshape(*x.shape[:2], a, -1), "has shape", ".transpose(1, 2)")


def test_split_check_unfinished_and_malformed_answers():
    def unfinished(x, n_heads):
        raise NotImplementedError()

    rejects(check_split_heads, unfinished, "not attempted", kind=NotAttempted)
    rejects(check_split_heads, 42, "expected a function")
    rejects(check_split_heads, lambda x, a: [1, 2, 3], "Python list")
    rejects(check_split_heads, lambda x, a: x, "has shape (2, 5, 12), expected (2, 3, 5, 4)")
    rejects(check_split_heads, lambda x, a: split_heads(x, a) * float("nan"), "does not match")
    rejects(check_split_heads, lambda x, a: None, "None")


# ---- check_merge_heads ---------------------------------------------------------------------

def merge_cat(x):
    return torch.cat(x.unbind(1), dim=-1)


def merge_contiguous_view(x):
    b, a, n, d = x.shape
    return x.transpose(1, 2).contiguous().view(b, n, a * d)


def merge_einsum(x):
    return torch.einsum("bhnd->bnhd", x).flatten(-2)


def merge_numpy(x):
    a = np.asarray(x)
    b, h, n, d = a.shape
    return a.transpose(0, 2, 1, 3).reshape(b, n, h * d)


@pytest.mark.parametrize("fn", [merge_heads, merge_cat, merge_contiguous_view, merge_einsum, merge_numpy])
def test_merge_check_accepts_alternatives(fn, capsys):
    check_merge_heads(fn)
    assert "✓ merge heads" in capsys.readouterr().out


def test_merge_check_rejects_reshape_without_transpose():
    rejects(check_merge_heads, lambda x: x.reshape(x.shape[0], x.shape[2], -1),
               "without a transpose", "heads mixed with positions")


def test_merge_check_rejects_wrong_concat_order():
    rejects(check_merge_heads, lambda x: x.permute(0, 2, 3, 1).flatten(-2), "wrong concat order", "interleaved")
    rejects(check_merge_heads, lambda x: torch.cat(x.unbind(1)[::-1], dim=-1), "wrong concat order",
               "last head first")


def test_merge_check_rejects_missing_reshape_and_averaging():
    rejects(check_merge_heads, lambda x: x.transpose(1, 2), "reshape the last two axes")
    rejects(check_merge_heads, lambda x: x.mean(1), "averaged")


def test_merge_check_explains_view_on_a_transposed_tensor():
    def merge_view(x):
        b, a, n, d = x.shape
        return x.transpose(1, 2).view(b, n, a * d)

    rejects(check_merge_heads, merge_view, "RuntimeError", "use `.reshape(...)`")


def test_merge_check_unfinished_and_malformed_answers():
    def unfinished(x):
        raise NotImplementedError()

    rejects(check_merge_heads, unfinished, "not attempted", kind=NotAttempted)
    rejects(check_merge_heads, "merge", "expected a function")
    rejects(check_merge_heads, lambda x: x.tolist(), "Python list")
    rejects(check_merge_heads, lambda x: merge_heads(x).log() * float("nan"), "does not match")


# ---- check_multi_head_attention ------------------------------------------------------------

def make_learner_mha(*, split="ok", merge="ok", scale="d_head", softmax_dim=-1, out_in="width",
                     q_out="width", use_out_proj=True, returns="pair", fused=False, bias=True, style="matmul"):
    """A learner's MultiHeadAttention, correct unless one of the options injects a mistake."""

    class LearnerMHA(nn.Module):
        def __init__(self, d_model, n_heads, d_head=None):
            super().__init__()
            d_head = d_head or d_model // n_heads
            self.a, self.d, self.d_model = n_heads, d_head, d_model
            width = n_heads * d_head
            if fused:
                self.qkv_proj = nn.Linear(d_model, 3 * width, bias=bias)
            else:
                self.q_proj = nn.Linear(d_model, width if q_out == "width" else d_model, bias=bias)
                self.k_proj = nn.Linear(d_model, width, bias=bias)
                self.v_proj = nn.Linear(d_model, width, bias=bias)
            self.out_proj = nn.Linear(width if out_in == "width" else d_model, d_model, bias=bias)

        def forward(self, x):
            b, n, _ = x.shape
            if fused:
                q, k, v = self.qkv_proj(x).chunk(3, dim=-1)
            else:
                q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            if split == "no_transpose":
                q, k, v = (t.reshape(b, self.a, n, self.d) for t in (q, k, v))
            else:
                q, k, v = (t.view(b, n, self.a, self.d).transpose(1, 2) for t in (q, k, v))
            factor = {"d_head": 1 / math.sqrt(self.d), "d_model": 1 / math.sqrt(self.d_model), "none": 1.0}[scale]
            if style == "einsum":
                scores = torch.einsum("bhid,bhjd->bhij", q, k) * factor
            else:
                scores = q @ k.transpose(-2, -1) * factor
            w = scores.softmax(dim=softmax_dim)
            heads = w @ v  # (B, A, n, d_head)
            if merge == "no_transpose":
                cat = heads.reshape(b, n, -1)
            elif merge == "interleaved":
                cat = heads.permute(0, 2, 3, 1).reshape(b, n, -1)
            else:
                cat = heads.transpose(1, 2).reshape(b, n, -1)
            out = self.out_proj(cat) if use_out_proj else cat
            return out if returns == "out" else (out, w)

    LearnerMHA.__name__ = "MultiHeadAttention"
    return LearnerMHA


@pytest.mark.parametrize("cls", [
    MultiHeadAttention,
    make_learner_mha(),
    make_learner_mha(style="einsum"),
    make_learner_mha(fused=True),
    make_learner_mha(bias=False),
])
def test_mha_check_accepts_alternatives(cls, capsys):
    check_multi_head_attention(cls)
    assert "✓ multi-head attention" in capsys.readouterr().out


def test_mha_check_rejects_heads_split_without_transpose():
    rejects(check_multi_head_attention, make_learner_mha(split="no_transpose"),
               "split by a reshape", "heads mixed with positions")


def test_mha_check_rejects_wrong_merge_and_concat_order():
    rejects(check_multi_head_attention, make_learner_mha(merge="no_transpose"), "merged by a reshape")
    rejects(check_multi_head_attention, make_learner_mha(merge="interleaved"), "wrong concat order")


def test_mha_check_rejects_out_proj_sized_for_d_model():
    rejects(check_multi_head_attention, make_learner_mha(out_in="d_model"),
               "W^O (out_proj) has the wrong input size when A·d_head ≠ d_model", "takes 10 = d_model inputs",
               "A·d_head = 3·4 = 12")


def test_mha_check_rejects_q_projection_to_d_model():
    rejects(check_multi_head_attention, make_learner_mha(q_out="d_model"), "W^Q", "expected A·d_head")


def test_mha_check_rejects_scale_with_d_model_and_no_scale():
    rejects(check_multi_head_attention, make_learner_mha(scale="d_model"), "√d_model", "1/√d_head")
    rejects(check_multi_head_attention, make_learner_mha(scale="none"), "not scaled")


def test_mha_check_rejects_softmax_over_queries_and_missing_out_proj():
    rejects(check_multi_head_attention, make_learner_mha(softmax_dim=-2), "dim=-2")
    rejects(check_multi_head_attention, make_learner_mha(use_out_proj=False), "W^O was not applied")


def test_mha_check_unfinished_and_malformed_answers():
    class Unfinished(nn.Module):
        def __init__(self, d_model, n_heads, d_head=None):
            super().__init__()
            raise NotImplementedError()

    class NotAModule:
        def __init__(self, d_model, n_heads, d_head=None):
            pass

    class NoLayers(nn.Module):
        def __init__(self, d_model, n_heads, d_head=None):
            super().__init__()
            self.proj = nn.Linear(d_model, d_model)

    rejects(check_multi_head_attention, Unfinished, "not attempted", kind=NotAttempted)
    rejects(check_multi_head_attention, NotAModule, "expected an nn.Module")
    rejects(check_multi_head_attention, NoLayers, "q_proj, k_proj, v_proj and out_proj", "['proj']")
    rejects(check_multi_head_attention, make_learner_mha(returns="out"), "expected a pair (out, weights)")
    rejects(check_multi_head_attention, MultiHeadAttention(12, 3), "pass the class itself")


def test_mha_check_reports_nan_and_crashes_without_traceback():
    class NaNs(MultiHeadAttention):
        def forward(self, x):
            out, w = super().forward(x)
            return out * float("nan"), w

    class Crashes(MultiHeadAttention):
        def forward(self, x):
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    rejects(check_multi_head_attention, NaNs, "out", "does not match")
    rejects(check_multi_head_attention, Crashes, "raised RuntimeError", "mat1 and mat2")
