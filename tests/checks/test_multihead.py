"""Checks of notebook 07 (attn_course.checks.multihead): every pitfall rejected with its diagnosis, correct
alternatives (view/permute/einsum/chunk styles, fused QKV, SDPA inside the module, other layer names)
accepted, and the same verdict when the grader replays the log."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from attn_course import multihead as mh
from attn_course.checks.multihead import check_merge_heads, check_MultiHeadAttention, check_split_heads
from attn_course.checks.result import Status
from attn_course.softmax import masked_softmax


# ============================================================================ split_heads
def split_view_permute(x, n_heads):
    b, n, d = x.shape
    return x.view(b, n, n_heads, d // n_heads).permute(0, 2, 1, 3)


def split_chunks(x, n_heads):
    return torch.stack(x.chunk(n_heads, dim=-1), dim=1)


def split_numpy(x, n_heads):
    a = np.asarray(x)
    b, n, d = a.shape
    return a.reshape(b, n, n_heads, d // n_heads).transpose(0, 2, 1, 3)


def split_einsum(x, n_heads):
    return torch.einsum("bnhd->bhnd", x.unflatten(-1, (n_heads, -1)))


def split_loop(x, n_heads):
    d = x.shape[-1] // n_heads
    return torch.stack([x[..., h * d:(h + 1) * d] for h in range(n_heads)], dim=1)


@pytest.mark.parametrize("fn", [mh.split_heads, split_view_permute, split_chunks, split_einsum, split_loop])
def test_split_accepts_alternatives(fn, accepts):
    accepts(check_split_heads, fn)


def split_one_sequence(x, n_heads):  # treats x as one (n, A·d_head) matrix: raises for B > 1
    n, width = x.shape[-2:]
    return x.reshape(n, n_heads, width // n_heads).transpose(0, 1)


@pytest.mark.parametrize("fn,phrases", [
    (lambda x, a: x.reshape(x.shape[0], a, x.shape[1], -1), ["heads split without a transpose", "heads mixed with positions"]),
    (lambda x, a: x.reshape(*x.shape[:2], -1, a).permute(0, 3, 1, 2), ["wrong order", "(A, d_head), not (d_head, A)"]),
    (lambda x, a: x.reshape(*x.shape[:2], a, -1), ["head axis not moved", ".transpose(1, 2)"]),
    (lambda x, a: x.reshape(*x.shape[:2], -1, a).transpose(1, 2), ["n_heads used as the head width"]),
    (lambda x, a: x.reshape(x.shape[0], x.shape[1], 3, -1).transpose(1, 2), ["split into 3 heads, not n_heads = 4", "hard-coded"]),
    (lambda x, a: x.reshape(*x.shape[:2], a, -1).transpose(0, 1), ["wrong shape", "= (n, B, A, d_head)"]),
    (lambda x, a: split_view_permute(x, a) * 2, ["off by a factor of 2"]),
    # the docstring's result[b, h, i] = x[b, i, …] is an equality: float64 rounded to float32 is not x's values
    (lambda x, a: split_view_permute(x, a).float(), ["result rounded to float32", ".float()"]),
    (lambda x, a: split_view_permute(x, a).double(), None),  # float32 input as float64: the same numbers
    (split_numpy, ["returned a NumPy array, not a tensor", "torch.from_numpy"]),  # the docstring asks for a tensor
    (lambda x, a: split_view_permute(x, a).flip(1) if a > 1 else split_view_permute(x, a), ["heads in reverse order"]),
    (lambda x, a: split_view_permute(x, a).reshape(-1, x.shape[1], x.shape[2] // a), ["batch and head axes merged", "d2l"]),
    (lambda x, a: split_view_permute(x, a).transpose(-2, -1), ["positions and features swapped"]),
    (lambda x, a: split_view_permute(x, a).flip(2), ["positions in reverse order"]),
    (lambda x, a: x[..., :x.shape[-1] // a].unsqueeze(1).expand(-1, a, -1, -1),
     ["head 0 repeated for every head", "every head holds head 0's values", "drop the index [0]"]),
    (lambda x, a: x.reshape(x.shape[0], x.shape[1], -1, 4).transpose(1, 2), ["the split of the previous case", "hard-coded"]),
    (split_one_sequence, ["ran with a batch of one (B = 1) but raised", "keep B as the first axis"]),
])
def test_split_names_each_pitfall(fn, phrases, rejects, accepts):
    if phrases is None:
        accepts(check_split_heads, fn)
    else:
        rejects(check_split_heads, fn, *phrases)


def test_split_bad_answers(rejects, unfinished):
    rejects(check_split_heads, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    rejects(check_split_heads, 42, "not a function")
    rejects(check_split_heads, lambda x, a: [1, 2, 3], "Python list")
    rejects(check_split_heads, lambda x, a: None, "returned None")
    rejects(check_split_heads, lambda x, a: x, "wrong shape (2, 5, 12)")
    rejects(check_split_heads, lambda x, a: mh.split_heads(x, a) * float("nan"), "NaN")
    rejects(check_split_heads, lambda x, a: x.view(x.shape[0], x.shape[1], a, -1).transpose(1, 2).view(
        x.shape[0], a, x.shape[1], -1).mean() / 0, "")  # a scalar: wrong shape, no crash


# ============================================================================ merge_heads
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


def merge_permute(x):
    return x.permute(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1)


def merge_loop(x):
    b, a, n, d = x.shape
    out = torch.empty(b, n, a * d, dtype=x.dtype)
    for h in range(a):
        out[:, :, h * d:(h + 1) * d] = x[:, h]
    return out


@pytest.mark.parametrize("fn", [mh.merge_heads, merge_cat, merge_contiguous_view, merge_einsum, merge_permute, merge_loop,
                                lambda x: x.transpose(1, 2).reshape(*x.shape[:1], x.shape[2], x.shape[3], -1).flatten(2),
                                lambda x: mh.merge_heads(x).double()])
def test_merge_accepts_alternatives(fn, accepts):
    accepts(check_merge_heads, fn)


def merge_one_sequence(x):  # treats x as one sequence's heads (A, n, d_head): raises for B > 1
    a, n, d = x.shape[-3:]
    return x.reshape(a, n, d).transpose(0, 1).reshape(1, n, a * d)


def _view_after_transpose(x):
    b, a, n, d = x.shape
    return x.transpose(1, 2).view(b, n, a * d)


@pytest.mark.parametrize("fn,phrases", [
    (lambda x: x.reshape(x.shape[0], x.shape[2], -1), ["heads merged without a transpose", "heads mixed with positions"]),
    (lambda x: x.permute(0, 2, 3, 1).flatten(-2), ["wrong concat order: features interleaved"]),
    (lambda x: torch.cat(x.unbind(1)[::-1], dim=-1), ["wrong concat order: last head first"]),
    (lambda x: x.transpose(1, 2), ["heads not concatenated", "reshape the last two axes"]),
    (lambda x: x.mean(1), ["heads averaged"]),
    (lambda x: x.sum(1), ["heads summed"]),
    (lambda x: x[:, 0], ["only one head kept"]),
    (_view_after_transpose, ["RuntimeError", "non-contiguous", ".reshape"]),
    (lambda x: x.transpose(2, 3).reshape(x.shape[0], x.shape[2], -1), ["heads merged without a transpose", "(B, A, d_head, n)"]),
    (lambda x: x.reshape(x.shape[0], -1, x.shape[2]).transpose(1, 2), ["heads merged without a transpose", "(B, A·d_head, n)"]),
    (lambda x: torch.cat([x[:, 0], x[:, 1]], dim=-1), ["only the first 2 of 3 heads concatenated", "hard-coded as 2"]),
    (lambda x: torch.cat(list(x), dim=-1), ["wrong shape (3, 5, 8) = (A, n, B·d_head)"]),
    (lambda x: torch.cat(x.unbind(1), dim=1), ["= (B, A·n, d_head)"]),
    (lambda x: mh.merge_heads(x) / x.shape[1], ["off by a factor of 1/A"]),
    (lambda x: mh.merge_heads(x.roll(1, dims=1)), ["features in the wrong order"]),
    (lambda x: mh.merge_heads(x).flip(1), ["positions in reverse order"]),
    (lambda x: mh.merge_heads(x).half(), ["result in float16"]),
    (lambda x: mh.merge_heads(x).float(), ["result rounded to float32"]),
    (merge_numpy, ["returned a NumPy array, not a tensor"]),  # the docstring asks for a tensor
    (merge_one_sequence, ["ran with a batch of one (B = 1) but raised"]),
])
def test_merge_names_each_pitfall(fn, phrases, rejects):
    rejects(check_merge_heads, fn, *phrases)


def test_merge_bad_answers(rejects, unfinished):
    rejects(check_merge_heads, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    rejects(check_merge_heads, "merge", "not a function")
    rejects(check_merge_heads, lambda x: x.tolist(), "Python list")
    rejects(check_merge_heads, lambda x: mh.merge_heads(x) + 1, "shifted by a constant")
    rejects(check_merge_heads, lambda x: 1 / 0, "ZeroDivisionError")


# ============================================================================ MultiHeadAttention
def _split(t, a):
    b, n, w = t.shape
    return t.view(b, n, a, w // a).transpose(1, 2)


def make_mha(*, names=("q_proj", "k_proj", "v_proj", "out_proj"), fused=None, bias=True, style="matmul",
             split="ok", merge="ok", scale="d_head", dim=-1, out_proj=True, returns="pair", mask_mode="ok",
             kv="ok", default_d_head="ceil", q_out="width", o_in="width", assert_divisible=False, signature="full",
             qk_swapped=False, v_from="v"):
    """A learner's MultiHeadAttention: correct unless an option injects one mistake."""

    class MultiHeadAttention(nn.Module):
        def __init__(self, d_model, n_heads, d_head=None):
            super().__init__()
            if assert_divisible:
                assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
            if d_head is None:
                d_head = -(-d_model // n_heads) if default_d_head == "ceil" else d_model // n_heads
            self.a, self.d, self.d_model = n_heads, d_head, d_model
            width = n_heads * d_head
            if fused:
                setattr(self, fused, nn.Linear(d_model, 3 * width, bias=bias))
            else:
                q, k, v, _ = names
                setattr(self, q, nn.Linear(d_model, width if q_out == "width" else d_model, bias=bias))
                setattr(self, k, nn.Linear(d_model, width, bias=bias))
                setattr(self, v, nn.Linear(d_model, width, bias=bias))
            setattr(self, names[3], nn.Linear(width if o_in == "width" else d_model, d_model, bias=bias))

        def attend(self, x_q, x_kv=None, mask=None):
            kv_src = x_q if x_kv is None or kv == "ignored" else x_kv
            q_src = x_q
            if kv == "swapped" and x_kv is not None:
                q_src, kv_src = x_kv, x_q
            if fused:
                proj = getattr(self, fused)
                q, _, _ = proj(q_src).chunk(3, dim=-1)
                _, k, v = proj(kv_src).chunk(3, dim=-1)
            else:
                qp, kp, vp = (getattr(self, n) for n in names[:3])
                if qk_swapped:
                    qp, kp = kp, qp
                q, k = qp(q_src), kp(kv_src)
                v = {"v": vp, "k": kp}[v_from](x_q if v_from == "v" and kv == "values_from_q" else kv_src)
            b, n_q, _ = q.shape
            if split == "no_transpose":
                q, k, v = (t.reshape(b, self.a, t.shape[1], -1) for t in (q, k, v))
            elif split == "strided":
                q, k, v = (t.reshape(b, t.shape[1], -1, self.a).permute(0, 3, 1, 2) for t in (q, k, v))
            else:
                q, k, v = (_split(t, self.a) for t in (q, k, v))
            factor = {"d_head": 1 / math.sqrt(self.d), "d_model": 1 / math.sqrt(self.d_model), "none": 1.0,
                      "d_head_linear": 1 / self.d, "width": 1 / math.sqrt(self.a * self.d), "after": 1.0}[scale]
            if style == "einsum":
                scores = torch.einsum("bhid,bhjd->bhij", q, k) * factor
            else:
                scores = q @ k.transpose(-2, -1) * factor
            if mask is None or mask_mode == "ignored":
                w = torch.softmax(scores, dim=dim)
            elif mask_mode == "ok":
                w = masked_softmax(scores, mask, dim)
            elif mask_mode == "where_nan_to_num":
                w = torch.softmax(torch.where(mask, scores, float("-inf")), dim=dim).nan_to_num(0.0)
            elif mask_mode == "inverted":
                w = masked_softmax(scores, ~mask, dim)
            elif mask_mode == "after":
                w = torch.softmax(scores, dim=dim) * mask
            elif mask_mode == "nan":
                w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=dim)
            elif mask_mode == "finite":
                w = torch.softmax(scores.masked_fill(mask == 0, -1e9), dim=dim)
            elif mask_mode == "unsqueeze":  # assumes a (B, n_q, n_k) mask
                w = masked_softmax(scores, mask.unsqueeze(1), dim)
            elif mask_mode == "transposed":
                w = masked_softmax(scores, mask.transpose(-2, -1), dim)
            elif mask_mode == "added":
                w = torch.softmax(scores + mask, dim=dim)
            elif mask_mode == "repeat":  # nn.MultiheadAttention's (B·A, n_q, n_k), built with repeat instead of repeat_interleave
                full = torch.broadcast_to(mask, scores.shape)[:, 0]  # (B, n_q, n_k): one mask per sequence
                flat = full.repeat(self.a, 1, 1)  # (A·B, …) head-major — wrong
                w = masked_softmax(scores.flatten(0, 1), flat, dim).view(scores.shape)
            else:
                raise ValueError(mask_mode)
            if scale == "after":
                w = w / math.sqrt(self.d)
            heads = w @ v  # (B, A, n_q, d_head)
            if merge == "no_transpose":
                cat = heads.reshape(b, n_q, -1)
            elif merge == "interleaved":
                cat = heads.permute(0, 2, 3, 1).reshape(b, n_q, -1)
            elif merge == "reversed":
                cat = torch.cat(heads.unbind(1)[::-1], dim=-1)
            else:
                cat = heads.transpose(1, 2).reshape(b, n_q, -1)
            out = getattr(self, names[3])(cat) if out_proj else cat
            if returns == "out":
                return out
            if returns == "swapped":
                return w, out
            if returns == "averaged":
                return out, w.mean(1)
            return out, w

        if signature == "full":
            def forward(self, x_q, x_kv=None, mask=None):
                return self.attend(x_q, x_kv, mask)
        else:
            def forward(self, x):
                return self.attend(x)

    return MultiHeadAttention


class SdpaInside(nn.Module):
    """F.scaled_dot_product_attention for the output; the weights from masked_softmax (SDPA returns none)."""

    def __init__(self, d_model, n_heads, d_head=None):
        super().__init__()
        self.h = n_heads
        self.d = d_head or math.ceil(d_model / n_heads)
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d_model, n_heads * self.d) for _ in range(3))
        self.out_proj = nn.Linear(n_heads * self.d, d_model)

    def forward(self, x_q, x_kv=None, mask=None):
        x_kv = x_q if x_kv is None else x_kv
        q, k, v = _split(self.q_proj(x_q), self.h), _split(self.k_proj(x_kv), self.h), _split(self.v_proj(x_kv), self.h)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # zeros on a fully masked row (torch ≥ 2.5)
        weights = masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d), mask)
        return self.out_proj(out.transpose(1, 2).flatten(2)), weights


class PerHeadLoop(nn.Module):
    """A loop over heads, slicing the projections (a common first attempt, and right)."""

    def __init__(self, d_model, n_heads, d_head=None):
        super().__init__()
        self.h, self.d = n_heads, d_head or -(-d_model // n_heads)
        self.W_q = nn.Linear(d_model, n_heads * self.d)
        self.W_k = nn.Linear(d_model, n_heads * self.d)
        self.W_v = nn.Linear(d_model, n_heads * self.d)
        self.W_o = nn.Linear(n_heads * self.d, d_model)

    def forward(self, x_q, x_kv=None, mask=None):
        x_kv = x_q if x_kv is None else x_kv
        q, k, v = self.W_q(x_q), self.W_k(x_kv), self.W_v(x_kv)
        outs, weights = [], []
        for h in range(self.h):
            cols = slice(h * self.d, (h + 1) * self.d)
            s = q[..., cols] @ k[..., cols].transpose(-2, -1) / self.d ** 0.5  # (B, n_q, n_k)
            m = None if mask is None else torch.broadcast_to(mask, (q.shape[0], self.h, q.shape[1], k.shape[1]))[:, h]
            w = masked_softmax(s, m)
            outs.append(w @ v[..., cols])
            weights.append(w)
        return self.W_o(torch.cat(outs, dim=-1)), torch.stack(weights, dim=1)


class AnnotatedStyle(nn.Module):
    """The Annotated Transformer's four unnamed layers, in the order Q, K, V, O."""

    def __init__(self, d_model, n_heads, d_head=None):
        super().__init__()
        self.h, self.d = n_heads, d_head or -(-d_model // n_heads)
        w = n_heads * self.d
        self.linears = nn.ModuleList([nn.Linear(d_model, w), nn.Linear(d_model, w), nn.Linear(d_model, w),
                                      nn.Linear(w, d_model)])

    def forward(self, x_q, x_kv=None, mask=None):
        x_kv = x_q if x_kv is None else x_kv
        q, k, v = [_split(lin(x), self.h) for lin, x in zip(self.linears, (x_q, x_kv, x_kv))]
        w = masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d), mask)
        return self.linears[-1]((w @ v).transpose(1, 2).contiguous().view(q.shape[0], q.shape[2], -1)), w


class NanoGPTStyle(nn.Module):
    """nanoGPT's c_attn (fused, split into q, k, v) and c_proj, with one weight matrix for K and V sources."""

    def __init__(self, d_model, n_heads, d_head=None):
        super().__init__()
        self.h, self.d = n_heads, d_head or -(-d_model // n_heads)
        self.c_attn = nn.Linear(d_model, 3 * n_heads * self.d)
        self.c_proj = nn.Linear(n_heads * self.d, d_model)

    def forward(self, x_q, x_kv=None, mask=None):
        x_kv = x_q if x_kv is None else x_kv
        w = self.h * self.d
        q = _split(self.c_attn(x_q)[..., :w], self.h)
        k, v = (_split(t, self.h) for t in self.c_attn(x_kv)[..., w:].split(w, dim=-1))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if mask is not None:
            att = att.masked_fill(mask == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = torch.where(torch.isnan(att), torch.zeros_like(att), att)  # a fully masked row: zeros
        y = (att @ v).transpose(1, 2).contiguous().view(q.size(0), q.size(2), w)
        return self.c_proj(y), att


class OutProjFirst(AnnotatedStyle):
    """Four unnamed layers created W^O first: right maths, but no name says which layer is which."""

    def __init__(self, d_model, n_heads, d_head=None):
        super().__init__(d_model, n_heads, d_head)
        w = n_heads * self.d
        self.linears = nn.ModuleList([nn.Linear(w, d_model), nn.Linear(d_model, w), nn.Linear(d_model, w),
                                      nn.Linear(d_model, w)])

    def forward(self, x_q, x_kv=None, mask=None):
        x_kv = x_q if x_kv is None else x_kv
        q, k, v = [_split(lin(x), self.h) for lin, x in zip(self.linears[1:], (x_q, x_kv, x_kv))]
        w = masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d), mask)
        return self.linears[0](mh.merge_heads(w @ v)), w


class ReferenceSubclass(mh.MultiHeadAttention):
    """The course's reference, with its extra keyword arguments left at their defaults."""


class WithDropout(mh.MultiHeadAttention):
    """Dropout on the weights, as in notebook 07's last section: the check runs the module in eval mode."""

    def __init__(self, d_model, n_heads, d_head=None):
        super().__init__(d_model, n_heads, d_head, dropout=0.2)


@pytest.mark.parametrize("cls", [
    mh.MultiHeadAttention,
    ReferenceSubclass,
    WithDropout,
    make_mha(),
    make_mha(style="einsum"),
    make_mha(fused="qkv_proj"),
    make_mha(fused="in_proj"),
    make_mha(bias=False),
    make_mha(names=("W_query", "W_key", "W_value", "out_proj")),
    make_mha(names=("to_q", "to_k", "to_v", "to_out")),
    make_mha(mask_mode="where_nan_to_num"),
    SdpaInside,
    PerHeadLoop,
    AnnotatedStyle,
    NanoGPTStyle,
    make_mha(names=("p0", "p1", "p2", "p3")),
], ids=lambda c: getattr(c, "__qualname__", str(c)))
def test_mha_accepts_alternatives(cls, accepts):
    accepts(check_MultiHeadAttention, cls)


@pytest.mark.parametrize("cls,phrases", [
    (make_mha(split="no_transpose"), ["heads split without a transpose", "heads mixed with positions"]),
    (make_mha(split="strided"), ["features split in the wrong order"]),
    (make_mha(merge="no_transpose"), ["heads merged without a transpose"]),
    (make_mha(merge="interleaved"), ["wrong concat order: features interleaved"]),
    (make_mha(merge="reversed"), ["wrong concat order: last head first"]),
    (make_mha(scale="d_model"), ["scaled by √d_model, not √d_head"]),
    (make_mha(scale="none"), ["scores not scaled"]),
    (make_mha(scale="d_head_linear"), ["divided by d_head instead of √d_head"]),
    (make_mha(scale="width"), ["√(A·d_head)"]),
    (make_mha(dim=-2), ["softmax over the queries"]),
    (make_mha(dim=1), ["softmax over the heads"]),
    (make_mha(dim=0), ["softmax over the batch"]),
    (make_mha(scale="after"), ["weights scaled instead of the scores"]),
    (make_mha(mask_mode="transposed"), ["mask transposed"]),
    (make_mha(mask_mode="added"), ["bool mask added to the scores"]),
    (make_mha(out_proj=False), ["W^O not applied"]),
    (make_mha(o_in="d_model"), ["W^O takes d_model inputs, not A·d_head", "nn.Linear(n_heads * d_head, d_model)"]),
    (make_mha(q_out="d_model"), ["W^Q gives 10 outputs, not A·d_head = 12", "projected to d_model"]),
    (make_mha(default_d_head="floor"), ["W^Q gives 8 outputs, not A·d_head = 12", "d_model // n_heads = 2"]),
    (make_mha(assert_divisible=True), ["AssertionError", "A need not divide d_model"]),
    (make_mha(kv="ignored"), ["x_kv ignored: keys and values from x_q"]),
    (make_mha(kv="swapped"), ["x_q and x_kv swapped"]),
    (make_mha(kv="values_from_q"), ["values from x_q in cross-attention"]),
    (make_mha(qk_swapped=True), ["queries and keys swapped"]),
    (make_mha(v_from="k"), ["values projected with W^K"]),
    (make_mha(mask_mode="inverted"), ["mask polarity inverted"]),
    (make_mha(mask_mode="ignored"), ["mask ignored"]),
    (make_mha(mask_mode="after"), ["mask applied after the softmax"]),
    (make_mha(mask_mode="nan"), ["NaN on a fully masked row", "masked_softmax"]),
    (make_mha(mask_mode="finite"), ["uniform weights on a fully masked row"]),
    (make_mha(mask_mode="unsqueeze"), ["not broadcast against the scores"]),
    (make_mha(mask_mode="repeat"), ["mask matched to the wrong batch entries and heads"]),
    (make_mha(returns="out"), ["returned one tensor, not (out, weights)"]),
    (make_mha(returns="averaged"), ["weights averaged over the heads"]),
    (make_mha(returns="swapped"), ["forward returned (weights, out), not (out, weights)"]),
    (make_mha(signature="x_only"), ["forward does not take (x_q, x_kv=None, mask=None)"]),
    (make_mha(names=("p0", "p1", "p2", "p3"), merge="reversed"), ["wrong concat order: last head first"]),
    (OutProjFirst, ["took them in the order they were created", "name them q_proj"]),
], ids=lambda p: p if isinstance(p, list) else None)
def test_mha_names_each_pitfall(cls, phrases, rejects):
    rejects(check_MultiHeadAttention, cls, *phrases)


def test_mha_values_from_x_q_named_when_lengths_agree(rejects):
    """With n_k = n_q the mistake runs and gives wrong values: named by its output (the check meets this case
    before the one with n_k ≠ n_q, where the same code raises)."""
    from attn_course.checks.multihead import module as C, module_mistakes as M

    cls = make_mha(kv="values_from_q")
    cases = C._cases()
    same_length = [c for c in cases if c.get("m") == c["n"]]
    assert same_length, "the check needs a cross-attention case with n_k = n_q"
    assert cases.index(same_length[0]) < next(i for i, c in enumerate(cases) if c.get("m") and c["m"] != c["n"])
    case = same_length[0]
    torch.manual_seed(0)
    module = cls(case["d"], case["a"], case["h"])
    P = {r: (getattr(module, n).weight.detach().double(), getattr(module, n).bias.detach().double())
         for r, n in zip("qkvo", ("q_proj", "k_proj", "v_proj", "out_proj"))}
    x_q, x_kv = torch.randn(2, case["n"], case["d"]), torch.randn(2, case["m"], case["d"])
    got = module(x_q, x_kv)[0].detach().double()
    wrong = M.multihead(P, x_q, x_kv, None, case["a"], case["h"], inputs=("x_q", "x_kv", "x_q"))[0]
    torch.testing.assert_close(got, wrong, atol=1e-5, rtol=1e-4)


def test_mha_bad_classes(rejects, unfinished):
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

    class Crashes(mh.MultiHeadAttention):
        def forward(self, x_q, x_kv=None, mask=None):
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    class NaNs(mh.MultiHeadAttention):
        def forward(self, x_q, x_kv=None, mask=None):
            out, w = super().forward(x_q, x_kv, mask)
            return out, w * float("nan")

    class Exits(mh.MultiHeadAttention):
        def forward(self, x_q, x_kv=None, mask=None):
            raise SystemExit(1)

    rejects(check_MultiHeadAttention, Unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    rejects(check_MultiHeadAttention, NotAModule, "not an nn.Module")
    rejects(check_MultiHeadAttention, NoLayers, "W^Q, W^K, W^V, W^O not found", "proj (15 → 15)")
    rejects(check_MultiHeadAttention, Crashes, "raised RuntimeError", "mat1 and mat2")
    rejects(check_MultiHeadAttention, NaNs, "NaN")
    rejects(check_MultiHeadAttention, Exits, "SystemExit")
    rejects(check_MultiHeadAttention, mh.MultiHeadAttention(12, 3), "not a class")
    rejects(check_MultiHeadAttention, lambda x: x, "not a class")
    assert check_MultiHeadAttention.evaluate(namespace={}).status is Status.NOT_ATTEMPTED


def test_mha_oracle_model_equals_torch():
    """The float64 model of the check (used where nn.MultiheadAttention cannot be) equals it where it can."""
    from attn_course.checks.multihead import module_mistakes as C

    g = torch.Generator().manual_seed(0)
    P = {r: (torch.randn(12, 12, generator=g, dtype=torch.float64) / 3, torch.randn(12, generator=g, dtype=torch.float64))
         for r in "qkvo"}
    x_q, x_kv = torch.randn(2, 4, 12, generator=g), torch.randn(2, 6, 12, generator=g)
    mask = torch.rand(2, 3, 4, 6, generator=g) < 0.6
    mask[..., 0] = True
    for kv, m in ((None, None), (x_kv, None), (x_kv, mask), (None, torch.ones(4, 4, dtype=torch.bool).tril())):
        ours = C.multihead(P, x_q, kv, m, 3, 4)
        theirs = C._oracle(P, x_q, kv, m, 3, 4, 12)
        assert theirs[2]  # computed by nn.MultiheadAttention
        torch.testing.assert_close(ours[0], theirs[0])
        torch.testing.assert_close(ours[1], theirs[1])


# ============================================================================ red-team cases (issue 13)
# Learner-style modules written from the docstring, each with one mistake (or none): the check must name the
# mistake, or accept the answer. Sources are compiled as a learner's cell would be.
_LEARNER = """
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, d_head=None):
        super().__init__()
        self.n_heads = n_heads
        self.d_head = d_head if d_head is not None else math.ceil(d_model / n_heads)
        width = n_heads * self.d_head
        self.q_proj = nn.Linear(d_model, width)
        self.k_proj = nn.Linear(d_model, width)
        self.v_proj = nn.Linear(d_model, width)
        self.out_proj = nn.Linear(width, d_model)

    def forward(self, x_q, x_kv=None, mask=None):
        if x_kv is None:
            x_kv = x_q
        B, n_q, _ = x_q.shape
        n_k = x_kv.shape[1]
        A, d = self.n_heads, self.d_head
        q = self.q_proj(x_q).view(B, n_q, A, d).transpose(1, 2)
        k = self.k_proj(x_kv).view(B, n_k, A, d).transpose(1, 2)
        v = self.v_proj(x_kv).view(B, n_k, A, d).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        weights = torch.nan_to_num(weights, nan=0.0)
        out = (weights @ v).transpose(1, 2).reshape(B, n_q, A * d)
        return self.out_proj(out), weights
"""
_FUSED = """
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, d_head=None, dropout=0.0):
        super().__init__()
        self.n_head, self.head_dim = n_heads, d_head or -(-d_model // n_heads)
        self.qkv_proj = nn.Linear(d_model, 3 * n_heads * self.head_dim)
        self.out_proj = nn.Linear(n_heads * self.head_dim, d_model)
        self.attn_dropout = nn.Dropout(dropout)

    def forward(self, x_q, x_kv=None, mask=None):
        B, T, C = x_q.size()
        x_kv = x_q if x_kv is None else x_kv
        S, width = x_kv.size(1), self.n_head * self.head_dim
        q = self.qkv_proj(x_q).split(width, dim=2)[0]
        _, k, v = self.qkv_proj(x_kv).split(width, dim=2)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, S, self.n_head, self.head_dim).transpose(1, 2)
        v = v.view(B, S, self.n_head, self.head_dim).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if mask is not None:
            att = att.masked_fill(mask == False, float("-inf"))  # noqa: E712
        att = torch.where(torch.isnan(torch.softmax(att, -1)), 0.0, torch.softmax(att, -1))
        att = self.attn_dropout(att)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, width)
        return self.out_proj(y), att
"""


def _learner(source: str, *changes: str):
    """The class a learner's cell defines: ``source`` with each (old, new) pair of ``changes`` applied."""
    for old, new in zip(changes[::2], changes[1::2]):
        assert old in source, old
        source = source.replace(old, new)
    namespace = {"math": math, "torch": torch, "nn": nn, "F": F, "masked_softmax": masked_softmax}
    exec(compile(source, "<learner cell>", "exec"), namespace)
    return namespace["MultiHeadAttention"]


_MASKING = """        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        weights = torch.nan_to_num(weights, nan=0.0)"""
_RETURN = "return self.out_proj(out), weights"


@pytest.mark.parametrize("changes,phrases", [
    (("/ math.sqrt(d)", "/ math.sqrt(x_q.shape[-1] / A)"), ["scaled by √(d_model / A), not √d_head"]),
    (("/ math.sqrt(d)", "/ (2 * math.sqrt(d))"), ["scores multiplied by 1/(2·√d_head), not 1/√d_head"]),
    (("/ math.sqrt(d)", "/ math.sqrt(A)"), ["scores multiplied by 1/√n_heads"]),
    (("/ math.sqrt(d)", "/ math.sqrt(x_q.shape[-1] // A)"), ["1/√(d_model // n_heads)"]),  # 10 // 3 = 3 = A there
    (('float("-inf")', "0.0"), ["blocked scores set to 0"]),
    (('scores = scores.masked_fill(~mask, float("-inf"))', "scores = scores * mask"), ["blocked scores set to 0"]),
    ((_MASKING, _MASKING.replace("        if mask is not None:\n            scores = scores.masked_fill(~mask,",
                                 "        if True:\n            scores = scores.masked_fill(~torch.ones(n_q, n_k, "
                                 "dtype=torch.bool).tril(),")), ["always causal", "here none was given"]),
    ((_RETURN, "return self.out_proj(out), scores"), ["scores returned as the weights"]),
    (("k = self.k_proj(x_kv)", "k = self.k_proj(x_q)"), ["keys from x_q in cross-attention"]),
    (("q = self.q_proj(x_q).view(B, n_q", "q = self.q_proj(x_kv).view(B, n_k"), ["queries from x_kv in cross-attention"]),
    (("q = self.q_proj(x_q)", "q = self.k_proj(x_q)"), ["queries projected with W^K"]),
    (("self.n_heads = n_heads", "self.n_heads = 2",
      "math.ceil(d_model / n_heads)", "math.ceil(d_model / 2)", "width = n_heads", "width = 2"),
     ["W^Q gives 10 outputs, not A·d_head = 15", "makes 2 heads of width d_head = 5", "hard-coded"]),
    (("        weights = torch.nan_to_num(weights, nan=0.0)\n",
      "        weights = torch.nan_to_num(weights, nan=0.0)\n        weights = F.dropout(weights, p=0.1)\n"),
     ["different results for the same input", "training=self.training"]),
    ((_RETURN, "return self.out_proj(out).detach(), weights"), ["no gradient flows back through out", ".detach()"]),
    ((_RETURN, "return self.out_proj(out) + x_q, weights"), ["residual added inside attention"]),
    ((_RETURN, "return F.layer_norm(self.out_proj(out), (x_q.shape[-1],)), weights"), ["layer norm inside attention"]),
    ((_RETURN, "return out @ self.out_proj.weight.T, weights"), ["out_proj's bias not added"]),
    ((_RETURN, "return self.out_proj(out), weights[:, :1].expand_as(weights)"),
     ["head 0 repeated for every head", "axis 1 of the weights"]),
    (("v = self.v_proj(x_kv)", "v = (self.v_proj(x_kv) / math.sqrt(d))"), ["values scaled instead of the scores"]),
    (("weights = torch.softmax(scores, dim=-1)", "weights = torch.softmax(scores, dim=-1) ** 2"),
     ["weight rows do not sum to 1"]),
    (("weights = torch.softmax(scores, dim=-1)", "weights = torch.relu(scores) / torch.relu(scores).sum(-1, "
      "keepdim=True).clamp_min(1e-9)"), ["zero weight on keys the mask allows"]),
    ((_RETURN, "out = self.out_proj(out)\n        if mask is not None:\n            out = out * mask.expand(B, A, "
      "n_q, n_k).any(-1).any(1).unsqueeze(-1)\n        return out, weights"),
     ["out wrong only for the queries that may attend to nothing", "the bias"]),
    (("        if x_kv is None:\n            x_kv = x_q\n", "        x_kv = x_kv or x_q\n"),
     ["raised RuntimeError", "`x_kv or x_q`", "is None"]),
    (("        weights = torch.nan_to_num(weights, nan=0.0)\n", ""), ["NaN on a fully masked row"]),
    (('float("-inf")', "-1e9"), ["uniform weights on a fully masked row"]),
    (("self.out_proj = nn.Linear(width, d_model)", "self.out_proj = nn.Linear(d_model, d_model)"),
     ["W^O takes d_model inputs, not A·d_head"]),
], ids=lambda p: p[0] if isinstance(p, list) else None)
def test_mha_names_red_team_mistakes(changes, phrases, rejects):
    rejects(check_MultiHeadAttention, _learner(_LEARNER, *changes), *phrases)


@pytest.mark.parametrize("changes,phrases", [
    (("q = self.qkv_proj(x_q).split(width, dim=2)[0]", "q = self.qkv_proj(x_q).split(width, dim=2)[1]",
      "_, k, v = self.qkv_proj(x_kv).split(width, dim=2)", "k, _, v = self.qkv_proj(x_kv).split(width, dim=2)"),
     ["qkv_proj split in the order k, q, v"]),
    (("q = self.qkv_proj(x_q).split(width, dim=2)[0]",
      "q = self.qkv_proj(x_q).view(B, T, self.n_head, 3 * self.head_dim).chunk(3, dim=-1)[0].reshape(B, T, width)",
      "_, k, v = self.qkv_proj(x_kv).split(width, dim=2)",
      "_, k, v = [t.reshape(B, S, width) for t in self.qkv_proj(x_kv).view(B, S, self.n_head, "
      "3 * self.head_dim).chunk(3, dim=-1)]"), ["qkv_proj split head by head"]),
    (("view(B, T, width)", "view(B, T, C)"), ["raised RuntimeError", "assumes A·d_head = d_model"]),
])
def test_mha_names_fused_mistakes(changes, phrases, rejects):
    rejects(check_MultiHeadAttention, _learner(_FUSED, *changes), *phrases)


@pytest.mark.parametrize("source,changes", [
    (_LEARNER, ()),
    (_LEARNER, ("nn.Linear(d_model, width)", "nn.Linear(d_model, width, bias=False)")),  # biases are optional
    (_LEARNER, ("nn.Linear(width, d_model)", "nn.Linear(width, d_model, bias=False)")),
    (_LEARNER, (_MASKING, "        weights = masked_softmax(scores, mask)")),
    (_LEARNER, (_MASKING, _MASKING.replace("weights = torch.nan_to_num(weights, nan=0.0)",
                                           "weights = weights * (mask.any(-1, keepdim=True) if mask is not None else 1)")
                .replace('float("-inf")', "torch.finfo(scores.dtype).min"))),
    (_LEARNER, (_MASKING, "        weights = torch.softmax(scores, dim=-1)\n        if mask is not None:\n"
                          "            weights = weights * mask\n"
                          "            weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-30)")),
    (_LEARNER, ("scores = q @ k.transpose(-2, -1) / math.sqrt(d)", "scores = (q * d ** -0.5) @ k.mT")),
    (_LEARNER, ("weights = torch.softmax(scores, dim=-1)", "weights = F.softmax(scores.double(), -1).to(scores.dtype)")),
    (_LEARNER, (_RETURN, "return self.out_proj(out), weights.detach()")),  # the weights need no gradient
    (_FUSED, ()),  # nanoGPT's fused projection, split q | k | v
    (_FUSED, ("dropout=0.0", "dropout=0.1")),  # nn.Dropout is off in eval mode
])
def test_mha_accepts_red_team_alternatives(source, changes, accepts):
    accepts(check_MultiHeadAttention, _learner(source, *changes))


def test_first_case_separates_the_scale_mistakes():
    """On the first case the classic scales give different numbers: 1/√d_head, 1/d_head, 1/(2√d_head), 1/√d_model,
    1/√A and 1 are all distinct (with d_head = 4, 2·√d_head = d_head would make two mistakes one)."""
    from attn_course.checks.multihead import module as C

    first = C._cases()[0]
    d, a, h = first["d"], first["a"], first["h"]
    scales = [1 / math.sqrt(h), 1 / h, 1 / (2 * math.sqrt(h)), 1 / math.sqrt(d), 1 / math.sqrt(a), 1.0, math.sqrt(h)]
    assert len({round(s, 9) for s in scales}) == len(scales)


# ============================================================================ named causes (issue 22)
def _split_float_width(x, n_heads):
    b, n, width = x.shape
    return x.reshape(b, n, n_heads, width / n_heads).transpose(1, 2)  # `/`: a float size


@pytest.mark.parametrize("check,fn,phrases", [
    (check_split_heads, lambda x, a: x.reshape(*x.shape[:2], a, -1).transpose(0, 2),
     ["wrong shape (3, 5, 2, 4) = (A, n, B, d_head)", "axes in another order", "A, n and B"]),
    (check_split_heads, lambda x, a: x.transpose(1, 2), ["= (B, A·d_head, n)", "A·d_head where the docstring has A and d_head"]),
    (check_split_heads, _split_float_width, ["raised TypeError", "`/` always gives a float", "`//`"]),
    (check_merge_heads, lambda x: x.transpose(0, 2).reshape(x.shape[0], x.shape[2], -1),
     ["axes arranged as (n, A, B, d_head) before the reshape", "memory order"]),
    (check_merge_heads, lambda x: x.transpose(1, 3).reshape(x.shape[0], x.shape[2], -1),
     ["axes arranged as (B, d_head, n, A) before the reshape"]),
    (check_merge_heads, lambda x: mh.merge_heads(x).transpose(0, 1), ["= (n, B, A·d_head)", "another order, (n, B, A·d_head)"]),
])
def test_shapes_and_orders_are_named(check, fn, phrases, rejects):
    rejects(check, fn, *phrases)


@pytest.mark.parametrize("changes,phrases", [
    (("        self.q_proj = nn.Linear(d_model, width)\n", ""), ["W^Q, W^K, W^V, W^O not found",
                                                               "no nn.Linear layer of yours is named as W^Q (q_proj)"]),
    (("self.out_proj = nn.Linear(width, d_model)", "self.out_proj = width"), ["named as W^O (out_proj)"]),
    (("self.k_proj = nn.Linear(d_model, width)", "self.k_proj = nn.Linear(width, d_model)"),
     ["W^K takes 12 inputs, not d_model = 10", "the other way round: 12"]),
    (("math.ceil(d_model / n_heads)", "math.ceil(n_heads)"),
     ["W^Q gives 16 outputs, not A·d_head = 12", "n_heads = 4 heads of width 4, but d_head = 3"]),
    (("math.ceil(d_model / n_heads)", "d_model / n_heads"), ["raised TypeError", "`/` always gives a float"]),
], ids=lambda p: p[0] if isinstance(p, list) else None)
def test_mha_layer_causes_are_named(changes, phrases, rejects):
    rejects(check_MultiHeadAttention, _learner(_LEARNER, *changes), *phrases)


# ============================================================================ branches the tests above leave out
n_heads_in_the_notebook = 2  # a variable of the notebook, not the argument


def split_with_the_notebooks_head_count(x, n_heads):
    b, n, width = x.shape
    return x.view(b, n, n_heads_in_the_notebook, width // n_heads_in_the_notebook).transpose(1, 2)


def test_split_into_a_head_count_from_elsewhere_is_named(rejects):
    result = rejects(check_split_heads, split_with_the_notebooks_head_count, "split into 2 heads, not n_heads = 3",
                     "taken from somewhere else")
    assert "previous case" not in result.text()  # the very first case: no previous split to compare with


class _Learned(nn.Module):
    """q_proj, k_proj, v_proj, out_proj as the docstring names them; each subclass writes its forward."""

    def __init__(self, d_model, n_heads, d_head=None):
        super().__init__()
        self.h, self.d = n_heads, d_head or -(-d_model // n_heads)
        w = n_heads * self.d
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d_model, w) for _ in range(3))
        self.out_proj = nn.Linear(w, d_model)

    def heads(self, x_q, x_kv):
        x_kv = x_q if x_kv is None else x_kv
        return _split(self.q_proj(x_q), self.h), _split(self.k_proj(x_kv), self.h), _split(self.v_proj(x_kv), self.h)

    def out(self, heads):
        return self.out_proj(heads.transpose(1, 2).flatten(2))


class ValuesWithoutBias(_Learned):
    """v from v_proj's weight alone: each row of weights sums to 1, so out lacks W^O·b_v at every position."""

    def forward(self, x_q, x_kv=None, mask=None):
        q, k, _ = self.heads(x_q, x_kv)
        v = _split((x_q if x_kv is None else x_kv) @ self.v_proj.weight.mT, self.h)
        w = masked_softmax(q @ k.mT / math.sqrt(self.d), mask)
        return self.out(w @ v), w


class FillMinusTen(_Learned):
    def forward(self, x_q, x_kv=None, mask=None):
        q, k, v = self.heads(x_q, x_kv)
        s = q @ k.mT / math.sqrt(self.d)
        w = torch.softmax(s if mask is None else s.masked_fill(~mask, -10.0), -1)  # "e^-10 is as good as 0"
        return self.out(w @ v), w


class OutFromUnmaskedWeights(_Learned):
    def forward(self, x_q, x_kv=None, mask=None):
        q, k, v = self.heads(x_q, x_kv)
        s = q @ k.mT / math.sqrt(self.d)
        w = masked_softmax(s, mask)
        return self.out(torch.softmax(s, -1) @ v), w  # the weights returned are masked, out's are not


class KeysShapedLikeQueries(_Learned):
    def forward(self, x_q, x_kv=None, mask=None):
        b, n, _ = x_q.shape
        x_kv = x_q if x_kv is None else x_kv
        q, k, v = (proj(x).view(b, n, self.h, self.d).transpose(1, 2)  # n = x_q's length, for k and v too
                   for proj, x in ((self.q_proj, x_q), (self.k_proj, x_kv), (self.v_proj, x_kv)))
        w = masked_softmax(q @ k.mT / math.sqrt(self.d), mask)
        return self.out(w @ v), w


class FusedThreeDModel(nn.Module):
    """nanoGPT's c_attn sized 3·d_model: right while A·d_head = d_model."""

    def __init__(self, d_model, n_heads, d_head=None):
        super().__init__()
        self.h = n_heads
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x_q, x_kv=None, mask=None):
        x_kv = x_q if x_kv is None else x_kv
        d_model = x_q.shape[-1]
        q = _split(self.qkv_proj(x_q)[..., :d_model], self.h)
        k, v = (_split(t, self.h) for t in self.qkv_proj(x_kv)[..., d_model:].split(d_model, dim=-1))
        w = masked_softmax(q @ k.mT / math.sqrt(q.shape[-1]), mask)
        return self.out_proj((w @ v).transpose(1, 2).flatten(2)), w


class HiddenSize64(_Learned):
    """Projections to a hidden size of 64, as in the paper's d_k = 64."""

    def __init__(self, d_model, n_heads, d_head=None):
        super().__init__(d_model, n_heads, d_head)
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d_model, 64) for _ in range(3))
        self.out_proj = nn.Linear(64, d_model)

    def forward(self, x_q, x_kv=None, mask=None):
        return self.out(self.heads(x_q, x_kv)[2]), None


@pytest.mark.parametrize("cls,phrases", [
    (ValuesWithoutBias, ["out off by one vector at every position", "a constant (a bias) added or missing"]),
    (FillMinusTen, ["weight on blocked keys", "(batch, head, query, key)", "a causal mask (5, 5)"]),
    (OutFromUnmaskedWeights, ["wrong values only in the first 4 rows", "a causal mask (5, 5)"]),
    (KeysShapedLikeQueries, ["raised RuntimeError", "your code mixes the two lengths", "reshape each with its own"]),
    (FusedThreeDModel, ["the fused projection gives 30 outputs, not 3·A·d_head = 36", "qkv_proj = nn.Linear(10, 30)"]),
    (HiddenSize64, ["W^Q gives 64 outputs, not A·d_head = 15", "q_proj = nn.Linear(15, 64)"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_mha_measures_what_no_known_mistake_explains(cls, phrases, rejects):
    cls = type("MultiHeadAttention", (cls,), {})
    result = rejects(check_MultiHeadAttention, cls, *phrases)
    if cls.__mro__[1] in (OutFromUnmaskedWeights, FusedThreeDModel, HiddenSize64):  # nothing measured to name
        assert not result.diagnosis.cause, result.text()


def split_heads_of_width_n_heads(x, n_heads):
    return torch.stack([x[..., h * n_heads:(h + 1) * n_heads] for h in range(n_heads)], dim=1)


def test_shape_read_as_a_letter_twice_or_an_axis_missing(rejects):
    rejects(check_split_heads, split_heads_of_width_n_heads, "(B, A, n, A)", "your result has A where the docstring "
            "has d_head")
    rejects(check_merge_heads, lambda x: x.sum(dim=(1, 3)), "(B, n)", "your result has no A·d_head axis")


# ============================================================================ audit: keys and values swapped
def test_mha_names_keys_and_values_swapped(rejects):
    """k_proj and v_proj mixed up (keys from v_proj, values from k_proj) is named, not left as 'wrong values'."""
    cls = _learner(_LEARNER, "k = self.k_proj(x_kv)", "k = self.v_proj(x_kv)", "v = self.v_proj(x_kv)",
                   "v = self.k_proj(x_kv)")
    rejects(check_MultiHeadAttention, cls, "keys and values swapped", "the keys with v_proj")


# ============================================================================ in place, half precision, moved entries
# The docstrings say "x is left unchanged": an in-place change of x is named, whatever the operation; a returned view
# of x, or an in-place step on a copy, is not one.
def split_transpose_in_place(x, n_heads):
    b, n, width = x.shape
    x.resize_(b, n, n_heads, width // n_heads)
    return x.transpose_(1, 2)


def split_scaled_and_back(x, n_heads):  # x * 3 / 3 rounds: the caller's x comes back changed
    x.mul_(3)
    x.div_(3)
    return mh.split_heads(x, n_heads)


def split_unsqueezed(x, n_heads):
    x.unsqueeze_(0)
    return mh.split_heads(x[0], n_heads)


def merge_transpose_in_place(x):
    b, a, n, d = x.shape
    return x.transpose_(1, 2).reshape(b, n, a * d)


def merge_doubled_then_halved_result(x):
    x.mul_(2)
    return mh.merge_heads(x) / 2


@pytest.mark.parametrize("check,fn", [(check_split_heads, split_transpose_in_place),
                                      (check_split_heads, split_scaled_and_back),
                                      (check_split_heads, split_unsqueezed),
                                      (check_merge_heads, merge_transpose_in_place),
                                      (check_merge_heads, merge_doubled_then_halved_result)])
def test_heads_name_x_changed_in_place(check, fn, rejects):
    rejects(check, fn, "x changed in place", "x = x.clone()")


def split_unflatten_movedim(x, n_heads):
    return torch.movedim(x.unflatten(-1, (n_heads, -1)), 2, 1)


def split_view_swapaxes(x, n_heads):
    b, n, _ = x.shape
    return x.view(b, n, n_heads, -1).swapaxes(1, 2)  # a view of x: x itself is untouched


def split_by_torch_split(x, n_heads):
    return torch.stack(torch.split(x, x.shape[-1] // n_heads, dim=-1), dim=1)


def split_copy_then_in_place(x, n_heads):
    b, n, width = x.shape
    return x.clone().reshape(b, n, n_heads, width // n_heads).transpose_(1, 2)


def split_contiguous(x, n_heads):
    b, n, width = x.shape
    return x.reshape(b, n, n_heads, width // n_heads).permute(0, 2, 1, 3).contiguous()


def merge_flatten(x):
    return x.permute(0, 2, 1, 3).flatten(2)


def merge_movedim(x):
    return torch.movedim(x, 1, 2).flatten(-2)


def merge_copy_then_in_place(x):
    b, a, n, d = x.shape
    return x.clone().transpose_(1, 2).reshape(b, n, a * d)


def merge_view_of_contiguous(x):
    b, a, n, d = x.shape
    return x.swapaxes(1, 2).contiguous().view(b, n, -1)


def merge_hstack_heads(x):
    return torch.cat([x[:, h] for h in range(x.shape[1])], dim=-1)


@pytest.mark.parametrize("check,fn", [
    *((check_split_heads, f) for f in (split_unflatten_movedim, split_view_swapaxes, split_by_torch_split,
                                       split_copy_then_in_place, split_contiguous)),
    *((check_merge_heads, f) for f in (merge_flatten, merge_movedim, merge_copy_then_in_place, merge_view_of_contiguous,
                                       merge_hstack_heads))])
def test_heads_accept_views_and_copies(check, fn, accepts):
    accepts(check, fn)


def split_through_half(x, n_heads):
    return mh.split_heads(x.half(), n_heads).to(x.dtype)


def split_through_bfloat16(x, n_heads):
    return mh.split_heads(x.to(torch.bfloat16), n_heads).to(x.dtype)


def merge_through_half(x):
    return mh.merge_heads(x).half().float() if x.dtype == torch.float32 else mh.merge_heads(x).half().double()


@pytest.mark.parametrize("check,fn,phrases", [
    (check_split_heads, split_through_half, ["float16 precision", "every value is a float16 number",
                                             "went through float16"]),
    (check_split_heads, split_through_bfloat16, ["bfloat16 precision", "went through bfloat16"]),
    (check_merge_heads, merge_through_half, ["float16 precision", "went through float16"]),
])
def test_heads_name_a_trip_through_half_precision(check, fn, phrases, rejects):
    rejects(check, fn, *phrases)


def split_batch_and_positions_mixed(x, n_heads):  # (B·n, A, d_head) then heads first: rows of two sequences mixed
    b, n, width = x.shape
    return x.reshape(b * n, n_heads, -1).transpose(0, 1).reshape(b, n_heads, n, -1)


def merge_positions_taken_batch_first(x):  # rows read batch entry fastest
    b, a, n, d = x.shape
    rows = x.transpose(1, 2).reshape(b * n, a * d)
    return rows[torch.arange(b * n).reshape(n, b).T.flatten()].reshape(b, n, a * d)


@pytest.mark.parametrize("check,fn,phrases", [
    (check_split_heads, split_batch_and_positions_mixed,
     ["x's entries moved across axes B and A·d_head", "holds x[1, 0, 0]", "puts x[0, 0, 4]"]),
    (check_merge_heads, merge_positions_taken_batch_first,
     ["x's entries moved across axes B and n", "each of x's values exactly once"]),
])
def test_heads_name_entries_moved_across_axes(check, fn, phrases, rejects):
    rejects(check, fn, *phrases)


def test_a_wrong_answer_with_other_values_is_not_said_to_move_entries(rejects):
    result = rejects(check_split_heads, lambda x, n_heads: split_batch_and_positions_mixed(x, n_heads) + 1e-3)
    assert "moved" not in result.text()


_HALF_WEIGHTS = ("weights = torch.softmax(scores, dim=-1)", "weights = torch.softmax(scores.half(), dim=-1).float()")


@pytest.mark.parametrize("changes,phrases", [
    (_HALF_WEIGHTS, ["float16 precision", "the weights agree", "went through float16"]),
    (("weights = torch.nan_to_num(weights, nan=0.0)",
      "weights = torch.nan_to_num(weights, nan=0.0).bfloat16().float()"),
     ["bfloat16 precision", "went through bfloat16"]),  # not "weight rows do not sum to 1"
    ((_RETURN, "return self.out_proj(out).half().float(), weights"), ["float16 precision", "out's values agree"]),
    (("q = self.q_proj(x_q).view(B, n_q, A, d).transpose(1, 2)", "q = self.q_proj(x_q).view(B, A, n_q, d)"),
     ["heads split without a transpose (queries only)", "for the queries only"]),
    (("v = self.v_proj(x_kv).view(B, n_k, A, d).transpose(1, 2)", "v = self.v_proj(x_kv).view(B, n_k, d, A)"
      ".permute(0, 3, 1, 2)"), ["features split in the wrong order (values only)", "(A, d_head), not (d_head, A)"]),
])
def test_mha_names_half_precision_and_one_projection_split_wrong(changes, phrases, rejects):
    rejects(check_MultiHeadAttention, _learner(_LEARNER, *changes), *phrases)


@pytest.mark.parametrize("changes", [
    ("scores = q @ k.transpose(-2, -1) / math.sqrt(d)",
     'scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(d)'),
    ("q = self.q_proj(x_q).view(B, n_q, A, d).transpose(1, 2)",
     "q = self.q_proj(x_q).unflatten(-1, (A, d)).movedim(2, 1)"),
    ("out = (weights @ v).transpose(1, 2).reshape(B, n_q, A * d)", "out = torch.cat((weights @ v).unbind(1), dim=-1)"),
    ("scores = q @ k.transpose(-2, -1) / math.sqrt(d)", "scores = torch.matmul(q, k.mT).div(d ** 0.5)"),
    ('scores = scores.masked_fill(~mask, float("-inf"))', 'scores = torch.where(mask, scores, float("-inf"))'),
    ("weights = torch.softmax(scores, dim=-1)", "weights = torch.softmax(scores.double(), dim=-1).float()"),
])
def test_mha_accepts_more_styles(changes, accepts):
    accepts(check_MultiHeadAttention, _learner(_LEARNER, *changes))


# Red team: values cut to a fixed grid, or bits cut off, lie on float16's grid without a trip through it: not named.
def split_fixed_grid(x, n_heads):
    return mh.split_heads(torch.round(x * 256) / 256, n_heads)


def split_bits_cut(x, n_heads):  # float32 with the 13 lowest mantissa bits cleared: float16's grid, cut towards 0
    return mh.split_heads((x.float().view(torch.int32) & ~8191).view(torch.float32).to(x.dtype), n_heads)


def merge_fixed_grid(x):
    return mh.merge_heads(torch.round(x * 256) / 256)


@pytest.mark.parametrize("check,fn", [(check_split_heads, split_fixed_grid), (check_split_heads, split_bits_cut),
                                      (check_merge_heads, merge_fixed_grid)])
def test_heads_do_not_call_a_fixed_grid_a_trip_through_half(check, fn, rejects):
    assert "float16" not in rejects(check, fn).text()


# ============================================================================ round 3: state, grad mode, slow answers
class GradModeOff(mh.MultiHeadAttention):
    """Turns gradients off for good (the function form, not a with-block) before its forward."""

    def forward(self, x_q, x_kv=None, mask=None):
        torch.set_grad_enabled(False)
        return super().forward(x_q, x_kv, mask)


class CountsItsCalls(mh.MultiHeadAttention):
    """Right on the first call only: every later call adds a running offset kept on self."""

    def forward(self, x_q, x_kv=None, mask=None):
        self.calls = getattr(self, "calls", 0) + 1
        out, weights = super().forward(x_q, x_kv, mask)
        return out + 1e-3 * (self.calls - 1), weights


def test_mha_grad_mode_turned_off_is_the_learners_fault_not_the_checks(rejects):
    try:
        result = rejects(check_MultiHeadAttention, GradModeOff, "changed PyTorch's global settings", "torch.set_grad_enabled")
    finally:
        torch.set_grad_enabled(True)
    assert "not your fault" not in result.text()


def test_mha_names_state_kept_between_calls(rejects):
    rejects(check_MultiHeadAttention, CountsItsCalls, "different results for the same input", "state kept on self")


class RowByRow(nn.Module):
    """Slow but right: one Python loop per batch entry, head and query."""

    def __init__(self, d_model, n_heads, d_head=None):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_head or math.ceil(d_model / n_heads)
        width = n_heads * self.d_head
        self.q_proj, self.k_proj = nn.Linear(d_model, width), nn.Linear(d_model, width)
        self.v_proj, self.out_proj = nn.Linear(d_model, width), nn.Linear(width, d_model)

    def forward(self, x_q, x_kv=None, mask=None):
        x_kv = x_q if x_kv is None else x_kv
        b, n_q, _ = x_q.shape
        q, k, v = (p(t).view(b, t.shape[1], self.n_heads, self.d_head).transpose(1, 2)
                   for p, t in ((self.q_proj, x_q), (self.k_proj, x_kv), (self.v_proj, x_kv)))
        allowed = None if mask is None else torch.broadcast_to(mask, (b, self.n_heads, n_q, k.shape[2]))
        weights = []
        for i in range(b):
            for a in range(self.n_heads):
                for j in range(n_q):
                    s = k[i, a] @ q[i, a, j] / math.sqrt(self.d_head)
                    if allowed is not None and not allowed[i, a, j].any():
                        weights.append(torch.zeros_like(s))
                    else:
                        weights.append(torch.softmax(s if allowed is None else s.masked_fill(~allowed[i, a, j],
                                                                                          float("-inf")), -1))
        w = torch.stack(weights).view(b, self.n_heads, n_q, -1)
        return self.out_proj((w @ v).transpose(1, 2).reshape(b, n_q, -1)), w


class FinfoMinFill(mh.MultiHeadAttention):
    """masked_fill with the dtype's lowest number, then fully masked rows zeroed; *args and **kwargs accepted."""

    def forward(self, x_q, x_kv=None, mask=None, *args, need_weights=True, **kwargs):
        x_kv = x_q if x_kv is None else x_kv
        b, n_q, _ = x_q.shape
        q, k, v = (p(t).unflatten(-1, (self.n_heads, -1)).transpose(1, 2)
                   for p, t in ((self.q_proj, x_q), (self.k_proj, x_kv), (self.v_proj, x_kv)))
        s = q @ k.mT / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, torch.finfo(s.dtype).min)
        w = torch.softmax(s, -1) * (1.0 if mask is None else mask.any(-1, keepdim=True))
        return self.out_proj((w @ v).transpose(1, 2).flatten(2)), w


@pytest.mark.parametrize("cls", [RowByRow, FinfoMinFill])
def test_mha_accepts_slow_and_finfo_answers(cls, accepts):
    accepts(check_MultiHeadAttention, cls)


def _split_through_float32(x, n_heads):
    return x.float().view(x.shape[0], x.shape[1], n_heads, -1).transpose(1, 2).to(x.dtype)


def _merge_through_float32(x):
    return x.float().transpose(1, 2).flatten(2).to(x.dtype)


@pytest.mark.parametrize("check,fn", [(check_split_heads, _split_through_float32),
                                      (check_merge_heads, _merge_through_float32)])
def test_heads_name_a_trip_through_float32(check, fn, rejects):
    rejects(check, fn, "computed in float32, not float64")


def _split_element_by_element(x, n_heads):
    b, n, width = x.shape
    d_head = width // n_heads
    out = torch.empty(b, n_heads, n, d_head, dtype=x.dtype)
    for i in range(b):
        for a in range(n_heads):
            for t in range(n):
                for c in range(d_head):
                    out[i, a, t, c] = x[i, t, a * d_head + c]
    return out


def _merge_recursively(x):
    return x[:, 0] if x.shape[1] == 1 else torch.cat([x[:, 0], _merge_recursively(x[:, 1:])], dim=-1)


@pytest.mark.parametrize("check,fn", [(check_split_heads, _split_element_by_element),
                                      (check_split_heads, torch.no_grad()(lambda x, n_heads, *args, **kw:
                                                                         x.unflatten(-1, (n_heads, -1)).transpose(1, 2))),
                                      (check_merge_heads, _merge_recursively)])
def test_heads_accept_slow_and_decorated_answers(check, fn, accepts):
    accepts(check, fn)


def test_heads_name_arithmetic_on_values_they_only_move(rejects):
    rejects(check_merge_heads, lambda x: (x * 3).transpose(1, 2).flatten(2) / 3, "values changed", "only moves numbers")
