"""Checks of notebook 10 (attn_course.checks.backward): every pitfall rejected with its diagnosis,
correct alternatives accepted, the same verdict when the grader replays the log.

The wrong answers below are written the way a learner would write them (not taken from the check's
own list of mistakes), each with one bug."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attn_course import backward as ref
from attn_course.checks.backward import check_attention_backward, check_AttentionFunction, check_tiled_attention_backward
from attn_course.checks.result import Status
from attn_course.softmax import masked_softmax
from tests.checks.test_voice import assert_voice


def quick(params, keep):
    """pytest params: those whose first value is in ``keep`` run in the quick suite, the rest only in the
    whole suite (``-m slow`` selects them)."""
    return [pytest.param(*p, marks=() if p[0] in keep else (pytest.mark.slow,)) for p in params]


# ============================================================================ attention_backward
def chain_rule(q, k, v, dout, mask=None, *, bug=""):
    """A learner's attention_backward, with an optional bug."""
    d = q.shape[-1]
    s = q @ k.transpose(-2, -1) / math.sqrt(d)
    if bug == "softmax_nan":
        p = torch.softmax(s if mask is None else s.masked_fill(~mask, float("-inf")), dim=-1)
    elif bug == "fill_1e9":
        p = torch.softmax(s if mask is None else s.masked_fill(~mask, -1e9), dim=-1)
    elif bug == "exp_by_hand":
        e = torch.exp(s if mask is None else s.masked_fill(~mask, float("-inf")))
        p = e / e.sum(-1, keepdim=True)
        p = torch.nan_to_num(p, nan=0.0) if mask is not None else p
    elif bug == "mask_ignored":
        p = torch.softmax(s, -1)
    elif bug == "mask_inverted":
        p = masked_softmax(s, None if mask is None else ~mask)
    elif bug == "p_unscaled":
        p = masked_softmax(q @ k.transpose(-2, -1), mask)
    elif bug == "softmax_queries":
        p = torch.softmax(s if mask is None else s.masked_fill(~mask, float("-inf")), dim=-2)
    elif bug == "unscaled_all":
        p = masked_softmax(q @ k.transpose(-2, -1), mask)
    elif bug == "scale_from_v":
        p = masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(v.shape[-1]), mask)
    elif bug == "mask_on_ds":
        p = torch.softmax(s, -1)
    elif bug == "mask_times_weights":
        p = torch.softmax(s, -1) * (1 if mask is None else mask)
    elif bug == "mask_plus_scores":
        p = torch.softmax(s if mask is None else s + mask.float().to(s.dtype), -1)
    else:
        p = masked_softmax(s, mask)
    dv = p @ dout if bug == "dv_T" else p.transpose(-2, -1) @ (v if bug == "dv_from_v" else dout)
    if bug == "dv_scaled":
        dv = dv / math.sqrt(d)
    dp = v @ dout.transpose(-2, -1) if bug == "dp_T" else dout @ v.transpose(-2, -1)
    if bug == "no_rowsum":
        ds = p * dp
    elif bug == "rowsum_dim_-2":
        ds = p * (dp - (dp * p).sum(dim=-2, keepdim=True))
    elif bug == "rowsum_no_keepdim":
        ds = p * (dp - (dp * p).sum(dim=-1).unsqueeze(-2))
    elif bug == "rowsum_plain":
        ds = p * (dp - dp.sum(dim=-1, keepdim=True))
    elif bug == "rowsum_total":
        ds = p * (dp - (dp * p).sum())
    elif bug == "sign":
        ds = p * ((dp * p).sum(-1, keepdim=True) - dp)
    elif bug == "rowsum_mean":
        ds = p * (dp - (dp * p).mean(-1, keepdim=True))
    elif bug == "sigmoid_style":  # σ(1 − σ): the diagonal of the Jacobian only
        ds = p * (1 - p) * dp
    elif bug == "no_p":
        ds = dp - (dp * p).sum(-1, keepdim=True)
    else:
        ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    if bug == "mask_on_ds" and mask is not None:
        ds = ds * mask
    scale = 1 / math.sqrt(v.shape[-1] if bug == "scale_from_v" else d)
    sq = {"no_scale_dq": 1.0, "no_scale": 1.0, "unscaled_all": 1.0, "by_d": 1 / d}.get(bug, scale)
    sk = {"no_scale_dk": 1.0, "no_scale": 1.0, "unscaled_all": 1.0, "by_d": 1 / d}.get(bug, scale)
    dq = ds @ (q if bug == "dq_from_q" else k) * sq
    dk = (ds @ q if bug == "dk_T" else ds.transpose(-2, -1) @ (k if bug == "dk_from_k" else q)) * sk
    if bug == "order":
        return dk, dq, dv
    if bug == "float32":
        return dq.float(), dk.float(), dv.float()
    if bug == "float32_inside":  # computed in float32, handed back in the input's dtype
        return dq.float().to(q.dtype), dk.float().to(q.dtype), dv.float().to(q.dtype)
    return dq, dk, dv


# correct alternatives ---------------------------------------------------------------
def by_einsum(q, k, v, dout, mask=None):
    scale = q.shape[-1] ** -0.5
    s = torch.einsum("...nd,...md->...nm", q, k) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.nan_to_num(torch.softmax(s, -1), nan=0.0)  # a fully masked row: NaN → 0
    dv = torch.einsum("...nm,...nv->...mv", p, dout)
    dp = torch.einsum("...nv,...mv->...nm", dout, v)
    ds = p * (dp - torch.einsum("...nm,...nm->...n", dp, p)[..., None])
    return torch.einsum("...nm,...md->...nd", ds, k) * scale, torch.einsum("...nm,...nd->...md", ds, q) * scale, dv


def by_full_jacobian(q, k, v, dout, mask=None):
    """dS row by row through the full softmax Jacobian diag(p) − p pᵀ (more memory, same numbers)."""
    q_scaled = q / math.sqrt(q.shape[-1])
    p = masked_softmax(q_scaled @ k.mT, mask)
    jac = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)  # (..., n_q, n_k, n_k)
    dp = dout @ v.mT
    ds = (jac @ dp.unsqueeze(-1)).squeeze(-1)
    return ds @ k / math.sqrt(q.shape[-1]), ds.mT @ q_scaled, p.mT @ dout


def by_numpy(q, k, v, dout, mask=None):
    dq, dk, dv = chain_rule(q, k, v, dout, mask)
    return dq.numpy(), dk.numpy(), dv.numpy()


def by_rows(q, k, v, dout, mask=None):
    """One query at a time, with a stable softmax written by hand and a fully masked row set to zero."""
    d = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / d**0.5
    keep = torch.ones_like(scores, dtype=torch.bool) if mask is None else torch.broadcast_to(mask, scores.shape)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for i in range(q.shape[-2]):
        s_i = scores[..., i, :].masked_fill(~keep[..., i, :], float("-inf"))  # (..., M)
        top = s_i.amax(-1, keepdim=True)
        e = torch.where(keep[..., i, :], torch.exp(s_i - torch.where(torch.isinf(top), 0.0, top)), 0.0)
        total = e.sum(-1, keepdim=True)
        p_i = torch.where(total > 0, e / total.clamp_min(1e-300), 0.0)
        dp_i = (dout[..., i, None, :] * v).sum(-1)  # (..., M)
        ds_i = p_i * (dp_i - (dp_i * p_i).sum(-1, keepdim=True))
        dq[..., i, :] = (ds_i[..., None] * k).sum(-2) / d**0.5
        dk += ds_i[..., None] * q[..., i, None, :] / d**0.5
        dv += p_i[..., None] * dout[..., i, None, :]
    return dq, dk, dv


@pytest.mark.parametrize("fn", [ref.attention_backward, chain_rule, by_einsum, by_full_jacobian, by_numpy, by_rows])
def test_attention_backward_accepts_correct_answers(fn, accepts):
    accepts(check_attention_backward, fn)


@pytest.mark.parametrize("bug,phrases", quick([
    ("no_scale_dq", ["1/√d_k missing in dQ"]),
    ("no_scale_dk", ["1/√d_k missing in dK"]),
    ("no_scale", ["1/√d_k missing in dQ and dK"]),
    ("by_d", ["divided by d_k instead of √d_k"]),
    ("p_unscaled", ["scores not scaled when P is recomputed"]),
    ("dk_T", ["dK transposed"]),
    ("dv_T", ["dV = P dO instead of Pᵀ dO"]),
    ("no_rowsum", ["rowsum term is missing"]),
    ("rowsum_dim_-2", ["rowsum over the wrong axis"]),
    ("rowsum_no_keepdim", ["subtracted along the wrong axis", "keepdim=True"]),
    ("rowsum_plain", ["rowsum(dP) instead of rowsum(dP ⊙ P)"]),
    ("sign", ["sign flipped"]),
    ("softmax_queries", ["softmax over the wrong axis"]),
    ("dv_scaled", ["dV scaled by 1/√d_k"]),
    ("rowsum_total", ["one sum over the whole matrix"]),
    ("mask_ignored", ["mask ignored in the backward"]),
    ("mask_inverted", ["mask polarity inverted"]),
    ("softmax_nan", ["NaN from a fully masked row", "masked_softmax"]),
    ("fill_1e9", ["fully masked row attends uniformly"]),
    ("exp_by_hand", ["maximum subtracted"]),
    ("order", ["wrong order", "return dq, dk, dv"]),
    ("float32", ["float32, not float64", "dtype"]),
    ("float32_inside", ["float64 inputs, float32 precision", "dtype=q.dtype"]),
    ("unscaled_all", ["1/√d_k missing everywhere"]),
    ("scale_from_v", ["scale from d_v instead of d_k"]),
    ("dk_from_k", ["dK from K instead of Q"]),
    ("dq_from_q", ["dQ from Q instead of K"]),
    ("dv_from_v", ["dV from V instead of dO"]),
    ("dp_T", ["dP transposed"]),
    ("rowsum_mean", ["mean instead of sum"]),
    ("sigmoid_style", ["only the Jacobian's diagonal"]),
    ("no_p", ["the factor P is missing"]),
    ("mask_on_ds", ["mask applied to dS but not to P"]),
    ("mask_times_weights", ["mask applied after the softmax"]),
    ("mask_plus_scores", ["mask added to the scores"]),
], keep={"no_scale_dq", "dk_T", "no_rowsum", "softmax_nan", "order", "float32_inside", "mask_on_ds"}))
def test_attention_backward_names_each_pitfall(bug, phrases, rejects):
    rejects(check_attention_backward, lambda q, k, v, dout, mask=None: chain_rule(q, k, v, dout, mask, bug=bug), *phrases)


def scales_q_in_place(q, k, v, dout, mask=None):
    q /= math.sqrt(q.shape[-1])  # the right numbers, but the caller's q is changed
    p = masked_softmax(q @ k.mT, mask)
    dp = dout @ v.mT
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    return ds @ k / math.sqrt(q.shape[-1]), ds.mT @ q, p.mT @ dout


def with_autograd(q, k, v, dout, mask=None):
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = masked_softmax(q @ k.mT / math.sqrt(q.shape[-1]), mask) @ v
    return torch.autograd.grad(out, (q, k, v), dout)


def with_backward_call(q, k, v, dout, mask=None):
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.backward(dout)
    return q.grad, k.grad, v.grad


def test_attention_backward_rejects_autograd_and_bad_results(rejects, unfinished):
    rejects(check_attention_backward, with_autograd, "used autograd instead of the chain rule", "torch.autograd.grad")
    rejects(check_attention_backward, with_backward_call, "called a fused attention")
    rejects(check_attention_backward, scales_q_in_place, "overwrote its input q")
    rejects(check_attention_backward, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    rejects(check_attention_backward, lambda q, k, v, dout, mask=None: chain_rule(q, k, v, dout, mask)[0],
            "returned one tensor, not (dq, dk, dv)")
    rejects(check_attention_backward, lambda q, k, v, dout, mask=None: chain_rule(q, k, v, dout, mask)[:2],
            "did not return (dq, dk, dv)")
    rejects(check_attention_backward, lambda q, k, v, dout, mask=None: None, "did not return", "no `return`")
    rejects(check_attention_backward, lambda q, k, v, dout: chain_rule(q, k, v, dout), "fifth argument")
    rejects(check_attention_backward, lambda q, k, v, dout, mask=None: (q @ v, k, v), "raised RuntimeError")
    rejects(check_attention_backward, "attention", "not a function")
    rejects(check_attention_backward, lambda q, k, v, dout, mask=None: tuple(2 * g for g in chain_rule(q, k, v, dout, mask)),
            "factor of 2")


def batch_of_one_axis(q, k, v, dout, mask=None):
    """torch.bmm: exactly one batch axis."""
    p = masked_softmax(torch.bmm(q, k.transpose(1, 2)) / math.sqrt(q.shape[-1]), mask)
    dp = torch.bmm(dout, v.transpose(1, 2))
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    return torch.bmm(ds, k) / math.sqrt(q.shape[-1]), torch.bmm(ds.transpose(1, 2), q) / math.sqrt(q.shape[-1]), \
        torch.bmm(p.transpose(1, 2), dout)


def test_attention_backward_explains_errors_and_measures_the_unforeseen(rejects):
    rejects(check_attention_backward, batch_of_one_axis, "raised IndexError", "exactly one batch axis")
    rejects(check_attention_backward, lambda q, k, v, dout, mask=None: chain_rule(q, k, v, dout, ~(~mask)),
            "with mask=None (no mask) your code still uses the mask")
    rejects(check_attention_backward, lambda q, k, v, dout, mask=None: tuple(torch.zeros_like(t) for t in (q, k, v)),
            "dq is all zeros")
    rejects(check_attention_backward, lambda q, k, v, dout, mask=None: chain_rule(q, k, v, dout.mul_(2), mask),
            "overwrote its input dout")


def test_attention_backward_says_what_it_expected(rejects):
    """A wrong factor that no known mistake explains: the "expected" line names the gradient and its oracle, never an
    empty "the expected values" (issue 22)."""
    def doubled_dq(q, k, v, dout, mask=None):
        dq, dk, dv = ref.attention_backward(q, k, v, dout, mask)
        return 2 * dq, dk, dv

    result = rejects(check_attention_backward, doubled_dq, "dq: off by a factor of 2", "in your dq: every entry is 2 ×",
                     "the dq that autograd computes through F.scaled_dot_product_attention")
    assert result.diagnosis.expected != "the expected values"
    named = rejects(check_attention_backward, lambda q, k, v, dout, mask=None: chain_rule(q, k, v, dout, mask,
                                                                                          bug="no_scale_dq"),
                    "1/√d_k missing in dQ")
    assert named.diagnosis.expected.startswith("the dq that autograd computes")


# ============================================================================ AttentionFunction
class SavesP(torch.autograd.Function):
    """Stores P in forward (more memory, same numbers) and writes the backward inline."""

    @staticmethod
    def forward(ctx, q, k, v, mask=None):
        scale = 1 / math.sqrt(q.shape[-1])
        p = masked_softmax(q @ k.mT * scale, mask)
        ctx.save_for_backward(q, k, v, p)
        ctx.scale = scale
        return p @ v

    @staticmethod
    def backward(ctx, dout):
        q, k, v, p = ctx.saved_tensors
        dp = dout @ v.mT
        ds = p * (dp - (dp * p).sum(-1, keepdim=True))
        dq = ds @ k * ctx.scale if ctx.needs_input_grad[0] else None
        dk = ds.mT @ q * ctx.scale if ctx.needs_input_grad[1] else None
        dv = p.mT @ dout if ctx.needs_input_grad[2] else None
        return dq, dk, dv, None


def function_with(backward=None, forward=None, base=torch.autograd.Function):
    """An AttentionFunction whose forward or backward is replaced."""

    def default_forward(ctx, q, k, v, mask=None):
        ctx.save_for_backward(q, k, v)
        ctx.mask = mask
        return masked_softmax(q @ k.mT / math.sqrt(q.shape[-1]), mask) @ v

    def default_backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        return (*ref.attention_backward(q, k, v, dout, ctx.mask), None)

    return type("AttentionFunction", (base,), {"forward": staticmethod(forward or default_forward),
                                                "backward": staticmethod(backward or default_backward)})


def _bwd(bug):
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        return (*chain_rule(q, k, v, dout, ctx.mask, bug=bug), None)
    return backward


def _three_grads(ctx, dout):
    q, k, v = ctx.saved_tensors
    return ref.attention_backward(q, k, v, dout, ctx.mask)


def _mask_forgotten(ctx, dout):
    q, k, v = ctx.saved_tensors
    return (*ref.attention_backward(q, k, v, dout), None)


def _no_dv(ctx, dout):
    q, k, v = ctx.saved_tensors
    dq, dk, _ = ref.attention_backward(q, k, v, dout, ctx.mask)
    return dq, dk, None, None


def _forward_no_scale(ctx, q, k, v, mask=None):
    ctx.save_for_backward(q, k, v)
    ctx.mask = mask
    return masked_softmax(q @ k.mT, mask) @ v


def _forward_no_mask(ctx, q, k, v):
    ctx.save_for_backward(q, k, v)
    ctx.mask = None
    return masked_softmax(q @ k.mT / math.sqrt(q.shape[-1])) @ v


@pytest.mark.parametrize("cls", [ref.AttentionFunction, SavesP, function_with()])
def test_attention_function_accepts_correct_answers(cls, accepts):
    accepts(check_AttentionFunction, cls)


@pytest.mark.parametrize("cls,phrases", [
    (function_with(backward=_three_grads), ["incorrect number of gradients", "return dq, dk, dv, None"]),
    (function_with(backward=_bwd("no_scale_dq")), ["1/√d_k missing in dQ"]),
    (function_with(backward=_bwd("order")), ["invalid gradient at index 0", "in the order forward takes its inputs"]),
    (function_with(backward=_bwd("no_rowsum")), ["rowsum term is missing"]),
    (function_with(backward=_mask_forgotten), ["mask ignored in the backward"]),
    (function_with(backward=_no_dv), ["backward returned None for dv"]),
    (function_with(forward=_forward_no_scale), ["forward: ", "the output of forward"]),
    (function_with(forward=_forward_no_mask), ["forward does not take the mask", "mask=None"]),
    (function_with(base=object), ["not a torch.autograd.Function"]),
])
def test_attention_function_names_each_pitfall(cls, phrases, rejects):
    rejects(check_AttentionFunction, cls, *phrases)


def _backward_by_autograd(ctx, dout):
    q, k, v = (t.detach().requires_grad_(True) for t in ctx.saved_tensors)
    with torch.enable_grad():
        out = masked_softmax(q @ k.mT / math.sqrt(q.shape[-1]), ctx.mask) @ v
        return (*torch.autograd.grad(out, (q, k, v), dout), None)


class _Shared:
    tensors = None


def _forward_on_class(ctx, q, k, v, mask=None):
    _Shared.tensors = (q, k, v, mask)  # one slot for every call: the second call overwrites the first
    return masked_softmax(q @ k.mT / math.sqrt(q.shape[-1]), mask) @ v


def _backward_from_class(ctx, dout):
    q, k, v, mask = _Shared.tensors
    return (*ref.attention_backward(q, k, v, dout, mask), None)


def _forward_saves_a_number(ctx, q, k, v, mask=None):
    ctx.save_for_backward(q, k, v, 1 / math.sqrt(q.shape[-1]))
    return masked_softmax(q @ k.mT / math.sqrt(q.shape[-1]), mask) @ v


def _forward_nan_rows(ctx, q, k, v, mask=None):
    ctx.save_for_backward(q, k, v)
    ctx.mask = mask
    s = q @ k.mT / math.sqrt(q.shape[-1])
    return torch.softmax(s if mask is None else s.masked_fill(~mask, float("-inf")), -1) @ v


def _forward_weights(ctx, q, k, v, mask=None):
    ctx.save_for_backward(q, k, v)
    ctx.mask = mask
    return masked_softmax(q @ k.mT / math.sqrt(q.shape[-1]), mask)  # P, not P V


def _forward_mask_ignored(ctx, q, k, v, mask=None):
    ctx.save_for_backward(q, k, v)
    ctx.mask = mask
    return masked_softmax(q @ k.mT / math.sqrt(q.shape[-1])) @ v


def _backward_float32(ctx, dout):
    q, k, v = ctx.saved_tensors
    return (*ref.attention_backward(q.float(), k.float(), v.float(), dout.float(), ctx.mask), None)


@pytest.mark.parametrize("cls,phrases", [
    (function_with(backward=_backward_by_autograd), ["backward uses autograd", "torch.autograd.grad"]),
    (function_with(forward=_forward_on_class, backward=_backward_from_class), ["two calls share their state", "ctx"]),
    (function_with(forward=_forward_saves_a_number), ["save_for_backward can only save", "attributes of ctx"]),
    (function_with(forward=_forward_nan_rows), ["forward: NaN from a fully masked row"]),
    (function_with(forward=_forward_weights), ["Mismatch in shape", "does not have the attention output's shape"]),
    (function_with(forward=_forward_mask_ignored), ["forward: mask ignored"]),
    (function_with(backward=_backward_float32), ["float64 inputs, float32 precision"]),
])
def test_attention_function_names_the_unforeseen(cls, phrases, rejects):
    rejects(check_AttentionFunction, cls, *phrases)


def test_attention_function_not_attempted_and_not_a_class(rejects):
    class Stub(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, mask=None):
            raise NotImplementedError()

        @staticmethod
        def backward(ctx, dout):
            raise NotImplementedError()

    rejects(check_AttentionFunction, Stub, "not attempted", status=Status.NOT_ATTEMPTED)
    rejects(check_AttentionFunction, ref.attention_fn, "not a class")


# ============================================================================ tiled_attention_backward
def tiled(q, k, v, o, lse, dout, block_size=64, causal=False, *, bug=""):
    """A learner's FlashAttention-2 backward (key blocks outer), with an optional bug."""
    n, m, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1 / math.sqrt(d)
    if bug == "ignore_block":
        block_size = 32
    if bug == "key_strip":  # query blocks of block_size, but every key at once
        return tiled_key_strip(q, k, v, o, lse, dout, block_size, causal)
    delta = (dout * o).sum(-1, keepdim=True)  # (..., n_q, 1)
    if bug == "delta_pass":  # right numbers, but not the docstring's D = rowsum(dout ⊙ o): a first pass over every tile
        delta = torch.zeros_like(delta)
        for qs in range(0, n, block_size):
            for ks in range(0, min(qs + block_size, n) if causal else m, block_size):
                s = q[..., qs:qs + block_size, :] @ k[..., ks:ks + block_size, :].mT * scale
                if causal:
                    s = s.masked_fill(torch.arange(ks, ks + s.shape[-1])[None, :] >
                                      torch.arange(qs, qs + s.shape[-2])[:, None], float("-inf"))
                p = torch.exp(s - lse[..., qs:qs + block_size, None])
                dp = dout[..., qs:qs + block_size, :] @ v[..., ks:ks + block_size, :].mT
                delta[..., qs:qs + block_size, :] += (dp * p).sum(-1, keepdim=True)
    dq = torch.zeros(q.shape) if bug == "float32_acc" else torch.zeros_like(q)
    dk, dv = (k, v) if bug == "dk_is_k" else (torch.zeros_like(k), torch.zeros_like(v))
    n_stop = (n // block_size) * block_size if bug in ("tail", "q_tail") else n
    m_stop = (m // block_size) * block_size if bug in ("tail", "k_tail") else m
    if bug == "full_p":  # the whole (..., n_q, n_k) matrix at once
        s_full = q @ k.mT * scale
        if causal:
            s_full = s_full.masked_fill(torch.ones(n, m, dtype=torch.bool).triu(1), float("-inf"))
        p_full = torch.exp(s_full - lse[..., None])
    for ks in range(0, m_stop, block_size):
        ke = min(ks + block_size, m)
        kj, vj = k[..., ks:ke, :], v[..., ks:ke, :]
        dkj, dvj = torch.zeros_like(kj), torch.zeros_like(vj)
        if bug == "full_block_acc":  # accumulators of a full block: the last, shorter block no longer fits
            dkj, dvj = (torch.zeros(*t.shape[:-2], block_size, t.shape[-1], dtype=t.dtype) for t in (kj, vj))
        start = 0 if not causal or bug in ("no_causal", "mask_all", "all_tiles_where") else (
            ks + block_size if bug == "skip_diag" else max(ks - block_size, 0) if bug == "one_early" else ks)
        for qs in range(start, n - 1 if bug == "q_range_short" else n_stop, block_size):
            qe = min(qs + block_size, n)
            qi, doi = q[..., qs:qe, :], dout[..., qs:qe, :]
            s = qi @ kj.mT * (1.0 if bug == "s_unscaled" else scale)
            future = None
            if causal and bug not in ("no_causal", "diag_unmasked", "full_p"):
                r = torch.arange(qs, qe)[:, None] - (qs if bug == "local_mask" else 0)
                c = torch.arange(ks, ke)[None, :] - (ks if bug == "local_mask" else 0)
                future = c >= r if bug == "mask_self" else (c > r + 1 if bug == "mask_ahead" else c > r)
                if bug == "triu_offset_flipped":  # triu(k_start - q_start + 1) where q_start - k_start + 1 belongs
                    future = torch.ones(qe - qs, ke - ks, dtype=torch.bool).triu(ks - qs + 1)
                if bug in ("where_after_exp", "all_tiles_where"):  # right: the blocked entries selected away after exp
                    pass
                elif bug == "additive_nan":  # an additive mask built as blocked × (−inf): 0 × (−inf) is NaN
                    s = s + future.to(s.dtype) * float("-inf")
                elif bug != "times_keep_after_exp":
                    s = s.masked_fill(future, float("-inf"))
            li = lse[..., qs:qe]
            if bug == "fresh_max":
                p = torch.exp(s - s.max(dim=-1, keepdim=True).values)
            elif bug == "tile_softmax":
                p = torch.softmax(s, dim=-1)
            elif bug == "lse_as_sum":
                p = torch.exp(s) / li.unsqueeze(-1)
            elif bug == "lse_no_axis":
                p = torch.exp(s - li)
            elif bug == "exp_separately":
                p = torch.exp(s) / torch.exp(li).unsqueeze(-1)
            elif bug == "full_p":
                p = p_full[..., qs:qe, ks:ke]
            elif bug == "exp2_no_log2e":
                p = torch.exp2(s - li.unsqueeze(-1))
            elif bug == "exp2":  # right: exp(x) = 2^(x·log2 e), the GPU's fast exponential
                p = torch.exp2((s - li.unsqueeze(-1)) / math.log(2))
            elif bug == "exp_no_lse":
                p = torch.exp(s)
            elif bug == "exp_plus_lse":
                p = torch.exp(s + li.unsqueeze(-1))
            elif bug == "stable_split":  # right: exp(S − m)·exp(m − L) with the tile's own max m
                m_t = s.amax(-1, keepdim=True)
                m_t = torch.where(torch.isinf(m_t), torch.zeros_like(m_t), m_t)
                p = torch.exp(s - m_t) * torch.exp(m_t - li.unsqueeze(-1))
            else:
                p = torch.exp(s - li.unsqueeze(-1))
            if bug in ("where_after_exp", "all_tiles_where") and future is not None:
                p = torch.where(future, 0.0, p)
            if bug == "times_keep_after_exp" and future is not None:
                p = p * ~future
            pv = p @ doi if bug == "dv_T" else p.mT @ doi
            pv = pv * scale if bug == "dv_scaled" else pv
            dp = doi @ vj.mT
            if bug == "no_rowsum":
                ds = p * dp
            elif bug == "delta_from_tile":
                ds = p * (dp - (dp * p).sum(-1, keepdim=True))
            elif bug == "delta_tile_dim_-2":
                ds = p * (dp - (dp * p).sum(-2, keepdim=True))
            elif bug == "delta_no_axis":
                ds = p * (dp - delta[..., qs:qe, 0])
            elif bug == "delta_plus":
                ds = p * (dp + delta[..., qs:qe, :])
            elif bug == "no_p":
                ds = dp - delta[..., qs:qe, :]
            else:
                ds = p * (dp - delta[..., qs:qe, :])
            sq = {"no_scale_dq": 1.0, "no_scale": 1.0, "by_d": 1 / d}.get(bug, scale)
            sk = {"no_scale_dk": 1.0, "no_scale": 1.0, "by_d": 1 / d}.get(bug, scale)
            if bug == "dq_assigned":
                dq[..., qs:qe, :] = ds @ kj * sq
            else:
                dq[..., qs:qe, :] += ds @ kj * sq
            dk_term = (ds @ qi if bug == "dk_T" else ds.mT @ (kj if bug == "dk_from_k" else qi)) * sk
            if bug == "dkdv_assigned":
                dkj, dvj = dk_term, pv
            elif bug == "dk_assigned":
                dkj, dvj = dk_term, dvj + pv
            else:
                dkj, dvj = dkj + dk_term, dvj + pv
        if bug == "dk_is_k":  # right numbers (block j of k is not read again), but k and v are overwritten
            dk[..., ks:ke, :], dv[..., ks:ke, :] = dkj.clone(), dvj.clone()
        else:
            dk[..., ks:ke, :], dv[..., ks:ke, :] = dkj, dvj
    if bug == "order":
        return dk, dq, dv
    if bug == "float32_inside":
        return dq.float().to(q.dtype), dk.float().to(q.dtype), dv.float().to(q.dtype)
    return dq, dk, dv


def tiled_key_strip(q, k, v, o, lse, dout, block_size=64, causal=False):
    """Right values, wrong structure: each query block against all keys at once (a (block, n_k) strip)."""
    n, m, scale = q.shape[-2], k.shape[-2], q.shape[-1] ** -0.5
    delta = (dout * o).sum(-1, keepdim=True)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for qs in range(0, n, block_size):
        s = q[..., qs:qs + block_size, :] @ k.mT * scale  # (..., b, n_k)
        if causal:
            s = s.masked_fill(torch.arange(m)[None, :] > torch.arange(qs, qs + s.shape[-2])[:, None], float("-inf"))
        p = torch.exp(s - lse[..., qs:qs + block_size, None])
        do = dout[..., qs:qs + block_size, :]
        ds = p * (do @ v.mT - delta[..., qs:qs + block_size, :])
        dq[..., qs:qs + block_size, :] = ds @ k * scale
        dk += ds.mT @ q[..., qs:qs + block_size, :] * scale
        dv += p.mT @ do
    return dq, dk, dv


def tiled_query_outer(q, k, v, o, lse, dout, block_size=64, causal=False):
    """The other loop order: query blocks outer (dQ finished per block), dK and dV added into place."""
    n, m = q.shape[-2], k.shape[-2]
    scale = q.shape[-1] ** -0.5
    delta = torch.einsum("...nv,...nv->...n", dout, o)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for qs in range(0, n, block_size):
        qe = min(qs + block_size, n)
        dq_i = torch.zeros_like(q[..., qs:qe, :])
        for ks in range(0, qe if causal else m, block_size):
            ke = min(ks + block_size, m)
            s = torch.einsum("...id,...jd->...ij", q[..., qs:qe, :], k[..., ks:ke, :]) * scale
            if causal:
                s = torch.where(torch.arange(ks, ke)[None, :] <= torch.arange(qs, qe)[:, None], s, float("-inf"))
            p = torch.exp(s - lse[..., qs:qe, None])
            dv[..., ks:ke, :] += torch.einsum("...ij,...iv->...jv", p, dout[..., qs:qe, :])
            ds = p * (torch.einsum("...iv,...jv->...ij", dout[..., qs:qe, :], v[..., ks:ke, :]) - delta[..., qs:qe, None])
            dq_i += torch.einsum("...ij,...jd->...id", ds, k[..., ks:ke, :]) * scale
            dk[..., ks:ke, :] += torch.einsum("...ij,...id->...jd", ds, q[..., qs:qe, :]) * scale
        dq[..., qs:qe, :] = dq_i
    return dq, dk, dv


def tiled_exp2_numpy(q, k, v, o, lse, dout, block_size=64, causal=False):
    """exp2 with log2(e) folded in (as GPU kernels do), NumPy results."""
    return tuple(g.numpy() for g in tiled(q, k, v, o, lse, dout, block_size, causal, bug="exp2"))


def tiled_query_blocks_doubled(q, k, v, o, lse, dout, block_size=64, causal=False):
    """Right values, wrong tiles: query blocks of 2·block_size against key blocks of block_size."""
    n, m, scale = q.shape[-2], k.shape[-2], q.shape[-1] ** -0.5
    delta = (dout * o).sum(-1, keepdim=True)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for ks in range(0, m, block_size):
        ke = min(ks + block_size, m)
        for qs in range(0, n, 2 * block_size):
            qe = min(qs + 2 * block_size, n)
            if causal and qe <= ks:
                continue
            s = q[..., qs:qe, :] @ k[..., ks:ke, :].mT * scale
            if causal:
                s = s.masked_fill(torch.arange(ks, ke)[None, :] > torch.arange(qs, qe)[:, None], float("-inf"))
            p = torch.exp(s - lse[..., qs:qe, None])
            dv[..., ks:ke, :] += p.mT @ dout[..., qs:qe, :]
            ds = p * (dout[..., qs:qe, :] @ v[..., ks:ke, :].mT - delta[..., qs:qe, :])
            dq[..., qs:qe, :] += ds @ k[..., ks:ke, :] * scale
            dk[..., ks:ke, :] += ds.mT @ q[..., qs:qe, :] * scale
    return dq, dk, dv


def tiled_where_after_exp(q, k, v, o, lse, dout, block_size=64, causal=False):
    return tiled(q, k, v, o, lse, dout, block_size, causal, bug="where_after_exp")


def tiled_stable_split(q, k, v, o, lse, dout, block_size=64, causal=False):
    return tiled(q, k, v, o, lse, dout, block_size, causal, bug="stable_split")


@pytest.mark.parametrize("fn", [ref.tiled_attention_backward, tiled, tiled_query_outer, tiled_exp2_numpy,
                                tiled_where_after_exp, tiled_stable_split])
def test_tiled_backward_accepts_correct_answers(fn, accepts):
    accepts(check_tiled_attention_backward, fn)


@pytest.mark.parametrize("bug,phrases", quick([
    ("no_scale_dq", ["1/√d_k missing in dQ"]),
    ("no_scale_dk", ["1/√d_k missing in dK"]),
    ("no_scale", ["1/√d_k missing in dQ and dK"]),
    ("by_d", ["divided by d_k instead of √d_k"]),
    ("s_unscaled", ["scores not scaled when P is recomputed"]),
    ("dk_T", ["dK transposed"]),
    ("dv_T", ["dV = P dO instead of Pᵀ dO"]),
    ("no_rowsum", ["rowsum term is missing"]),
    ("dv_scaled", ["dV scaled by 1/√d_k"]),
    ("exp2_no_log2e", ["exp2 without the log₂e factor"]),
    ("fresh_max", ["fresh max instead of the stored L"]),
    ("tile_softmax", ["P normalised within each tile"]),
    ("lse_as_sum", ["L used as a sum"]),
    ("lse_no_axis", ["L subtracted along the wrong axis"]),
    ("delta_from_tile", ["D computed from the recomputed P instead of dO ⊙ O"]),
    ("delta_tile_dim_-2", ["D summed over the wrong axis"]),
    ("delta_no_axis", ["D subtracted along the wrong axis"]),
    ("no_causal", ["causal mask forgotten in the backward"]),
    ("diag_unmasked", ["diagonal tiles not masked"]),
    ("skip_diag", ["diagonal tiles skipped"]),
    ("mask_self", ["a query cannot see itself"]),
    ("mask_ahead", ["each query sees the next key"]),
    ("local_mask", ["positions inside the tile"]),
    ("dq_assigned", ["dQ not accumulated over key blocks"]),
    ("dkdv_assigned", ["dK, dV not accumulated over query blocks"]),
    ("q_tail", ["last partial query block dropped"]),
    ("k_tail", ["last partial key block dropped"]),
    ("tail", ["last partial block dropped"]),
    ("order", ["wrong order"]),
    ("float32_acc", ["dq is float32, not float64", "dtype=q.dtype"]),
    ("float32_inside", ["float64 inputs, float32 precision"]),
    ("exp_separately", ["exp(S) and exp(L) taken separately", "NaN"]),
    ("times_keep_after_exp", ["blocked entries zeroed after exp", "inf · 0"]),
    ("exp_no_lse", ["L not subtracted"]),
    ("exp_plus_lse", ["L added instead of subtracted"]),
    ("delta_plus", ["D added instead of subtracted"]),
    ("no_p", ["the factor P is missing"]),
    ("dk_from_k", ["dK from K instead of Q"]),
    ("dk_assigned", ["dK not accumulated over query blocks"]),
    ("triu_offset_flipped", ["causal mask offset the wrong way"]),
    ("q_range_short", ["the last query rows get no gradient"]),
    ("delta_pass", ["D not computed from o", "(dout * o).sum(-1, keepdim=True)"]),
    ("one_early", ["tiles above the diagonal not skipped", "masked entirely"]),
    ("full_p", ["built an n × n tensor"]),
    ("mask_all", ["tiles above the diagonal not skipped"]),
    ("ignore_block", ["block_size ignored", "32×32"]),
    ("key_strip", ["block_size ignored", "a whole strip"]),
    ("dk_is_k", ["overwrote its input k", "torch.zeros_like(k)"]),
], keep={"fresh_max", "delta_from_tile", "no_causal", "dq_assigned", "tail", "full_p", "delta_pass", "times_keep_after_exp"}))
def test_tiled_backward_names_each_pitfall(bug, phrases, rejects):
    def learner(q, k, v, o, lse, dout, block_size=64, causal=False):
        return tiled(q, k, v, o, lse, dout, block_size, causal, bug=bug)

    rejects(check_tiled_attention_backward, learner, *phrases)


def tiled_by_autograd(q, k, v, o, lse, dout, block_size=64, causal=False):
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return torch.autograd.grad(out, (q, k, v), dout)


@pytest.mark.slow
def test_tiled_backward_rejects_shortcuts_and_bad_calls(rejects, unfinished):
    rejects(check_tiled_attention_backward, tiled_by_autograd, "called a fused attention")
    rejects(check_tiled_attention_backward, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    rejects(check_tiled_attention_backward, lambda q, k, v, o, lse, dout, block_size=64: tiled(q, k, v, o, lse, dout, block_size),
            "causal argument")
    rejects(check_tiled_attention_backward,
            lambda q, k, v, o, lse, dout, block_size=64, causal=False: ref.attention_backward(q, k, v, dout),
            "causal mask forgotten")
    rejects(check_tiled_attention_backward, tiled_query_blocks_doubled, "block_size ignored", "more than block_size = 128")


def test_tiled_structure_probe_reports_plain_numbers():
    from attn_course.checks.backward.probes import _watch_probe

    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, 256, 8, generator=g) for _ in range(4))
    o, lse = ref.tiled_attention_forward(q, k, v, 64)
    report = _watch_probe(ref.tiled_attention_backward, q, k, v, o, lse, dout, 64)
    assert report["largest"] < 256 * 256 // 8 and report["exp_tile"] == [64, 64] and report["calls"] == []
    assert report["flops"] == 5 * 2 * 256 * 256 * 8  # five matrix products per tile, 2 FLOPs per multiply-add
    causal = _watch_probe(ref.tiled_attention_backward, q, k, v, o, lse, dout, 64, causal=True)
    assert causal["exp_elements"] == 10 * 64 * 64  # 4 + 3 + 2 + 1 tiles
    assert all(type(x) in (int, list, str) for x in report.values())


# ============================================================================ named causes added with the check kit (issue 22)
def _chain(q, k, v, dout, mask=None, *, scale=None, weights=None, ds_of=None, dv_of=None):
    """A learner's chain rule with one step replaced: the scale, P from the scores, dS from (P, dP), dV from (P, dO)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale(q, k, v)
    s = q @ k.mT * scale
    p = weights(s) if weights else masked_softmax(s, mask)
    dp = dout @ v.mT
    ds = ds_of(p, dp) if ds_of else p * (dp - (dp * p).sum(-1, keepdim=True))
    return ds @ k * scale, ds.mT @ q * scale, dv_of(p, dout) if dv_of else p.mT @ dout


@pytest.mark.parametrize("change,phrases", [pytest.param(*p, marks=() if i in (0, 6) else pytest.mark.slow) for i, p in enumerate([
    (dict(scale=lambda q, k, v: 2 / math.sqrt(q.shape[-1])), ["scores scaled by", "2/√d_k", "dQ, dK scaled by"]),
    (dict(scale=lambda q, k, v: 1 / math.sqrt(q.shape[-2])), ["scores scaled by 0.4472", "instead of 1/√d_k"]),
    (dict(scale=lambda q, k, v: math.sqrt(q.shape[-1])), ["multiplied by √d_k instead of dividing by it"]),
    (dict(weights=lambda s: s), ["softmax forgotten: P = S"]),
    (dict(ds_of=lambda p, dp: p * (dp - p.sum(-1, keepdim=True))), ["rowsum(P) instead of rowsum(dP ⊙ P)"]),
    (dict(ds_of=lambda p, dp: p), ["dS = P: the bracket (dP − D) is missing"]),
    (dict(ds_of=lambda p, dp: p / (dp - (dp * p).sum(-1, keepdim=True))), ["dS wrong", "for one and the same"]),
    (dict(dv_of=lambda p, dout: dout), ["dV = dO: the factor Pᵀ is missing"]),
])])
def test_attention_backward_names_more_causes(change, phrases, rejects):
    rejects(check_attention_backward, lambda q, k, v, dout, mask=None: _chain(q, k, v, dout, mask, **change), *phrases)


def _forward_scaled_by(scale):
    def forward(ctx, q, k, v, mask=None):
        ctx.save_for_backward(q, k, v)
        ctx.mask = mask
        return masked_softmax(q @ k.mT * scale(q), mask) @ v
    return forward


@pytest.mark.slow
def test_attention_function_names_a_wrong_scale_in_forward(rejects):
    rejects(check_AttentionFunction, function_with(forward=_forward_scaled_by(lambda q: math.sqrt(q.shape[-1]))),
            "forward: multiplied by √d_k instead of dividing by it")
    rejects(check_AttentionFunction, function_with(forward=_forward_scaled_by(lambda q: q.shape[-2] ** -0.5)),
            "forward: scores scaled by", "= 1/√n_q")


def tiled_tile_bug(bug):
    """ref's tiled backward written out with one tile-level mistake."""
    def learner(q, k, v, o, lse, dout, block_size=64, causal=False):
        n, m, scale = q.shape[-2], k.shape[-2], q.shape[-1] ** -0.5
        delta = (dout * o).mean(-1, keepdim=True) if bug == "delta_mean" else (dout * o).sum(-1, keepdim=True)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for ks in range(0, m, block_size):
            for qs in range(ks if causal else 0, n, block_size):
                qi, kj, vj, doi = q[..., qs:qs + block_size, :], k[..., ks:ks + block_size, :], \
                    v[..., ks:ks + block_size, :], dout[..., qs:qs + block_size, :]
                s = qi @ kj.mT * scale
                if causal:
                    rows = torch.arange(qs, qs + qi.shape[-2])[:, None]
                    cols = (torch.arange(ks + kj.shape[-2], ks) if bug == "arange_swapped" else
                            torch.arange(ks, ks + kj.shape[-2]))[None, :]
                    s = s.masked_fill(cols > rows, {"plus_inf": math.inf, "zero_fill": 0.0}.get(bug, -math.inf))
                p = s - lse[..., qs:qs + block_size, None] if bug == "no_exp" else torch.exp(s - lse[..., qs:qs + block_size, None])
                ds = p * (doi @ vj.mT - delta[..., qs:qs + block_size, :])
                dv[..., ks:ks + block_size, :] += p.mT @ doi
                dq[..., qs:qs + block_size, :] += (kj if bug == "dq_no_ds" else ds @ kj) * scale
                dk[..., ks:ks + block_size, :] += ds.mT @ qi * scale
        return dq, dk, dv
    return learner


@pytest.mark.parametrize("bug,phrases", quick([
    ("no_exp", ["exp forgotten: P = S − L"]),
    ("delta_mean", ["D as a mean instead of a sum"]),
    ("plus_inf", ["blocked scores set to +∞ instead of −∞"]),
    ("zero_fill", ["blocked scores set to 0 instead of −∞", "exp(0 − L) is not 0"]),
    ("dq_no_ds", ["dQ = K/√d_k: the factor dS is missing"]),
    ("arange_swapped", ["raised RuntimeError", "torch.arange(start, end) got an end"]),
], keep={"delta_mean"}))
def test_tiled_backward_names_more_causes(bug, phrases, rejects):
    rejects(check_tiled_attention_backward, tiled_tile_bug(bug), *phrases)


@pytest.mark.slow
def test_tiled_tile_bug_without_a_bug_is_right(accepts):
    accepts(check_tiled_attention_backward, tiled_tile_bug(""))


@pytest.mark.slow
def test_attention_backward_names_two_mistakes_at_once(rejects):
    """dQ without its 1/√d_k and dV with one: two known mistakes, each reproducing the gradients it changes."""
    def two_bugs(q, k, v, dout, mask=None):
        dq, dk, _ = chain_rule(q, k, v, dout, mask, bug="no_scale_dq")
        return dq, dk, chain_rule(q, k, v, dout, mask, bug="dv_scaled")[2]

    result = rejects(check_attention_backward, two_bugs, "1/√d_k missing in dQ; and dV scaled by 1/√d_k",
                     "2 mistakes at once")
    assert "dq, dv are wrong" in result.diagnosis.got


# ============================================================================ branches the tests above leave out
def dq_without_k(q, k, v, dout, mask=None):
    d = q.shape[-1]
    p = masked_softmax(q @ k.mT / math.sqrt(d), mask)
    dp = dout @ v.mT
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    return ds / math.sqrt(d), ds.mT @ q / math.sqrt(d), p.mT @ dout  # dQ = dS K/√d_k without its K


def dv_from_dout_transposed(q, k, v, dout, mask=None):
    dq, dk, _ = ref.attention_backward(q, k, v, dout, mask)
    p = masked_softmax(q @ k.mT / math.sqrt(q.shape[-1]), mask)
    return dq, dk, dout.mT @ p  # dOᵀ P: Pᵀ dO transposed


def nan_rows_then_ds_masked(q, k, v, dout, mask=None):
    """torch.softmax over −inf (NaN in a fully masked row), then dS zeroed where blocked: NaN is left in dV only."""
    d = q.shape[-1]
    s = q @ k.mT / math.sqrt(d)
    p = torch.softmax(s if mask is None else s.masked_fill(~mask, float("-inf")), -1)
    dp = dout @ v.mT
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    if mask is not None:
        ds = ds.masked_fill(~mask, 0.0)  # "blocked positions get no gradient"
    return ds @ k / math.sqrt(d), ds.mT @ q / math.sqrt(d), p.mT @ dout


def dq_from_dp_and_dk_unscaled(q, k, v, dout, mask=None):
    """Two slips at once, neither a known mistake's: dQ from dP instead of dS, dK without 1/√d_k."""
    d = q.shape[-1]
    p = masked_softmax(q @ k.mT / math.sqrt(d), mask)
    dp = dout @ v.mT
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    return dp @ k / math.sqrt(d), ds.mT @ q, p.mT @ dout


@pytest.mark.parametrize("fn,phrases", [
    (dq_without_k, ["dQ = dS/√d_k: the factor K is missing", "your dq of shape (5, 5)", "shape (5, 7)"]),
    (dv_from_dout_transposed, ["wrong shape (3, 5), expected (5, 3)", "dv has v's shape (..., n_k, d_v)"]),
    (nan_rows_then_ds_masked, ["NaN in dv", "NaN in 84 of 84 entries of your dv",
                               "a fully masked row went through a softmax over -inf everywhere"]),
    (dq_from_dp_and_dk_unscaled, ["dq: wrong values", "the dq that autograd computes"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_attention_backward_shapes_nan_and_unrelated_slips(fn, phrases, rejects):
    result = rejects(check_attention_backward, fn, *phrases)
    if fn is dq_from_dp_and_dk_unscaled:  # dQ and dK do not follow from one dS′: no "dS wrong" claimed
        assert "dS wrong" not in result.text()


def _tiled_learner(bug):
    def learner(q, k, v, o, lse, dout, block_size=64, causal=False):
        return tiled(q, k, v, o, lse, dout, block_size, causal, bug=bug)
    return learner


@pytest.mark.parametrize("bug,phrases", quick([
    ("additive_nan", ["dq: NaN in the result", "causal=True"]),
    ("full_block_acc", ["raised RuntimeError", "every block is full",
                        "min(start + block_size, n)"]),
    ("all_tiles_where", ["causal: tiles above the diagonal not skipped", "causal work is 1.00 × the non-causal work",
                         "at twice the cost"]),
], keep={"additive_nan", "full_block_acc"}))
def test_tiled_backward_nan_full_blocks_and_dense_causal_work(bug, phrases, rejects):
    result = rejects(check_tiled_attention_backward, _tiled_learner(bug), *phrases)
    if bug == "additive_nan":  # NaN: no scale is fitted (nor claimed)
        assert "scaled by" not in result.text()


class NumpyForward(torch.autograd.Function):
    """forward computed with NumPy, returning an array: autograd never reaches the backward."""

    @staticmethod
    def forward(ctx, q, k, v, mask=None):
        ctx.save_for_backward(q, k, v)
        ctx.mask = mask
        s = q.numpy() @ k.numpy().swapaxes(-1, -2) / math.sqrt(q.shape[-1])
        return masked_softmax(torch.from_numpy(s), mask).numpy() @ v.numpy()

    @staticmethod
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        return (*ref.attention_backward(q, k, v, dout, ctx.mask), None)


class CacheFreedInBackward(torch.autograd.Function):
    """What backward needs kept on the class, and deleted once used to free the memory: a second call's backward
    finds nothing."""

    @staticmethod
    def forward(ctx, q, k, v, mask=None):
        CacheFreedInBackward.saved = (q, k, v, mask)
        return masked_softmax(q @ k.mT / math.sqrt(q.shape[-1]), mask) @ v

    @staticmethod
    def backward(ctx, dout):
        q, k, v, mask = CacheFreedInBackward.saved
        del CacheFreedInBackward.saved
        return (*ref.attention_backward(q, k, v, dout, mask), None)


class PReusedForDS(torch.autograd.Function):
    """dS written into P's memory (p.mul_): right once, other gradients when backward runs a second time."""

    @staticmethod
    def forward(ctx, q, k, v, mask=None):
        scale = 1 / math.sqrt(q.shape[-1])
        p = masked_softmax(q @ k.mT * scale, mask)
        ctx.save_for_backward(q, k, v)
        ctx.p, ctx.scale = p, scale
        return p @ v

    @staticmethod
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        p = ctx.p
        dv = p.mT @ dout
        dp = dout @ v.mT
        ds = p.mul_(dp - (dp * p).sum(-1, keepdim=True))
        return ds @ k * ctx.scale, ds.mT @ q * ctx.scale, dv, None


class PSavedMulInPlace(PReusedForDS):
    """The same p.mul_, but P saved with save_for_backward: autograd's version check raises on the second backward."""

    @staticmethod
    def forward(ctx, q, k, v, mask=None):
        p = masked_softmax(q @ k.mT / math.sqrt(q.shape[-1]), mask)
        ctx.save_for_backward(q, k, v, p)
        ctx.scale = 1 / math.sqrt(q.shape[-1])
        return p @ v

    @staticmethod
    def backward(ctx, dout):
        q, k, v, p = ctx.saved_tensors
        dv, dp = p.mT @ dout, dout @ v.mT
        ds = p.mul_(dp - (dp * p).sum(-1, keepdim=True))
        return ds @ k * ctx.scale, ds.mT @ q * ctx.scale, dv, None


@pytest.mark.parametrize("cls,phrases", [
    (PSavedMulInPlace, ["gradcheck fails", "fails or gives other gradients", "changes a tensor forward kept",
                        "never change the saved ones in place"]),
    (NumpyForward, ["no gradient reaches the inputs", "forward returned a NumPy array",
                    "compute forward's output with torch operations"]),
    (CacheFreedInBackward, ["raised AttributeError", "one backward through both", "the gradients of both calls"]),
    (PReusedForDS, ["gradcheck fails", "Backward is not reentrant", "changes a tensor forward kept",
                    "never change the saved ones in place"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_attention_function_numpy_forward_freed_state_and_in_place_backward(cls, phrases, rejects):
    cls.__name__ = cls.__qualname__ = "AttentionFunction"
    rejects(check_AttentionFunction, cls, *phrases)


@pytest.mark.parametrize("which", ["chain rule", "tiled"])
def test_no_two_known_backward_mistakes_agree_where_they_first_go_wrong(which):
    """judge names every known mistake that reproduces an answer without telling them apart on other cases: that is
    right only while no two rows of a table give the same gradients on the first case where they are wrong."""
    from attn_course.checks.backward.attention_backward import _backward_cases
    from attn_course.checks.backward.judge import oracle
    from attn_course.checks.backward.mistakes import CAUSAL, MASKED, NAIVE, TILED, flat, naive, table
    from attn_course.checks.backward.mistakes import tiled as tiled_variant
    from attn_course.checks.backward.tiled_backward import _tiled_cases
    from attn_course.checks.compare import same

    if which == "tiled":
        rows, inputs = table(TILED + CAUSAL, tiled_variant), ("q", "k", "v", "o", "lse", "dout", "block", "causal")
        cases = [(tuple(c[x] for x in inputs), oracle(c["q"], c["k"], c["v"], c["dout"], causal=c["causal"])[1])
                 for c in _tiled_cases()]
    else:
        rows, inputs = table(NAIVE + MASKED, naive), ("q", "k", "v", "dout", "mask")
        cases = [(args := tuple(c[x] for x in inputs), oracle(*args)[1]) for c in _backward_cases()]
    first = {}  # key → (the first case where the row is wrong, its gradients there)
    for row in rows:
        for i, (args, expected) in enumerate(cases):
            try:
                out = row.make(*args)
            except Exception:  # noqa: BLE001 - the row cannot run here: not a suspect on this case
                continue
            if not same(out, flat(expected), atol=1e-6, rtol=1e-4):
                first[row.key] = (i, out)
                break
    keys = list(first)
    alike = [(a, b) for n, a in enumerate(keys) for b in keys[n + 1:]
             if first[a][0] == first[b][0] and same(first[a][1], first[b][1], atol=1e-6, rtol=1e-4)]
    assert not alike, alike


def _unmasked_in_ds(factor_unmasked, rowsum_unmasked, zeroed):
    """dV from the masked P, but dS with the softmax of the unmasked scores in its factor and/or its row sum."""
    def attention_backward(q, k, v, dout, mask=None):
        scale = 1 / math.sqrt(q.shape[-1])
        s = q @ k.mT * scale
        p = masked_softmax(s, mask)
        p_all = torch.softmax(s, dim=-1)  # forgot the mask here
        dp = dout @ v.mT
        ds = (p_all if factor_unmasked else p) * (dp - (dp * (p_all if rowsum_unmasked else p)).sum(-1, keepdim=True))
        if zeroed and mask is not None:
            ds = torch.where(mask, ds, torch.zeros_like(ds))
        return ds @ k * scale, ds.mT @ q * scale, p.mT @ dout
    return attention_backward


@pytest.mark.parametrize("answer,phrases", [
    (_unmasked_in_ds(True, True, False), ["dS from the unmasked P", "blocked keys get weight"]),
    (_unmasked_in_ds(True, True, True), ["dS from the unmasked P, zeroed at masked keys"]),
    (_unmasked_in_ds(True, False, False), ["unmasked P as the factor of dS"]),
    (_unmasked_in_ds(True, False, True), ["unmasked P as dS's factor, zeroed at masked keys"]),
    (_unmasked_in_ds(False, True, False), ["unmasked P in dS's rowsum(dP ⊙ P)"]),
    (_unmasked_in_ds(False, True, True), ["unmasked P in dS's rowsum(dP ⊙ P)"]),
])
def test_attention_backward_names_an_unmasked_p_in_ds(answer, phrases, rejects):
    assert_voice(rejects(check_attention_backward, answer, *phrases))


def _tiled_delta(delta_of):
    """A learner's FlashAttention-2 backward, right except for D."""
    def tiled_attention_backward(q, k, v, o, lse, dout, block_size=64, causal=False):
        scale = 1 / math.sqrt(q.shape[-1])
        delta = delta_of(dout, o)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for ks in range(0, k.shape[-2], block_size):
            kj, vj = k[..., ks:ks + block_size, :], v[..., ks:ks + block_size, :]
            for qs in range(ks if causal else 0, q.shape[-2], block_size):
                qi, do = q[..., qs:qs + block_size, :], dout[..., qs:qs + block_size, :]
                s = qi @ kj.mT * scale
                if causal:
                    rows, cols = torch.arange(qs, qs + s.shape[-2]), torch.arange(ks, ks + s.shape[-1])
                    s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
                p = torch.exp(s - lse[..., qs:qs + block_size, None])
                dv[..., ks:ks + block_size, :] += p.mT @ do
                ds = p * (do @ vj.mT - delta[..., qs:qs + block_size, :])
                dq[..., qs:qs + block_size, :] += ds @ kj * scale
                dk[..., ks:ks + block_size, :] += ds.mT @ qi * scale
        return dq, dk, dv
    return tiled_attention_backward


@pytest.mark.parametrize("answer,phrases", [
    (_tiled_delta(lambda dout, o: (dout * dout).sum(-1, keepdim=True)), ["D = rowsum(dO ⊙ dO): O replaced by dO"]),
    (_tiled_delta(lambda dout, o: (dout ** 2).sum(dim=-1).unsqueeze(-1)), ["D = rowsum(dO ⊙ dO)"]),
    (_tiled_delta(lambda dout, o: torch.einsum("...nd,...nd->...n", o, o)[..., None]), ["D = rowsum(O ⊙ O)"]),
])
def test_tiled_backward_names_d_from_the_wrong_pair(answer, phrases, rejects):
    assert_voice(rejects(check_tiled_attention_backward, answer, *phrases))


@pytest.mark.parametrize("answer", [
    _tiled_delta(lambda dout, o: (dout * o).sum(-1, keepdim=True)),
    _tiled_delta(lambda dout, o: torch.einsum("...nd,...nd->...n", dout, o)[..., None]),
    _tiled_delta(lambda dout, o: (dout[..., None, :] @ o[..., :, None])[..., 0]),
    _unmasked_in_ds(False, False, False),
    _unmasked_in_ds(False, False, True),
])
def test_right_d_and_right_p_in_ds_pass(answer, accepts):
    accepts(check_attention_backward if answer.__name__ == "attention_backward" else check_tiled_attention_backward,
            answer)


# ============================================================================ round 3: kept results, finite fills, grad mode
def _cached_attention_backward():
    cache = {}

    def attention_backward(q, k, v, dout, mask=None):
        key = (q.shape, k.shape, v.shape)  # "the same problem again": reuse the answer
        if key not in cache:
            scale = 1 / math.sqrt(q.shape[-1])
            p = masked_softmax(q @ k.mT * scale, mask)
            dp = dout @ v.mT
            ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))
            cache[key] = (ds @ k * scale, ds.mT @ q * scale, p.mT @ dout)
        return cache[key]
    return attention_backward


def _cached_tiled_backward():
    cache = {}

    def tiled_attention_backward(q, k, v, o, lse, dout, block_size=64, causal=False):
        key = (q.shape, k.shape, causal)
        if key not in cache:
            cache[key] = ref.tiled_attention_backward(q, k, v, o, lse, dout, block_size, causal=causal)
        return cache[key]
    return tiled_attention_backward


@pytest.mark.parametrize("check, answer", [(check_attention_backward, _cached_attention_backward()),
                                           (check_tiled_attention_backward, _cached_tiled_backward())])
def test_a_result_kept_from_an_earlier_call_is_named(check, answer, rejects):
    result = rejects(check, answer, "an earlier result returned again")
    assert "a cache keyed by the shapes" in result.diagnosis.cause and "same shapes" in result.diagnosis.got
    assert_voice(result)


def _tiled_fill(fill):
    def tiled_attention_backward(q, k, v, o, lse, dout, block_size=64, causal=False):
        n, m, scale = q.shape[-2], k.shape[-2], 1 / math.sqrt(q.shape[-1])
        delta = (dout * o).sum(dim=-1, keepdim=True)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for ks in range(0, m, block_size):
            for qs in range(ks if causal else 0, n, block_size):
                s = q[..., qs:qs + block_size, :] @ k[..., ks:ks + block_size, :].mT * scale
                if causal:
                    rows, cols = torch.arange(qs, qs + s.shape[-2]), torch.arange(ks, ks + s.shape[-1])
                    s = s.masked_fill(cols[None, :] > rows[:, None], fill(s))
                p = torch.exp(s - lse[..., qs:qs + block_size, None])
                do = dout[..., qs:qs + block_size, :]
                dv[..., ks:ks + block_size, :] += p.mT @ do
                ds = p * (do @ v[..., ks:ks + block_size, :].mT - delta[..., qs:qs + block_size, :])
                dq[..., qs:qs + block_size, :] += ds @ k[..., ks:ks + block_size, :] * scale
                dk[..., ks:ks + block_size, :] += ds.mT @ q[..., qs:qs + block_size, :] * scale
        return dq, dk, dv
    return tiled_attention_backward


def test_tiled_backward_rejects_a_finite_fill_for_blocked_scores(rejects):
    d = rejects(check_tiled_attention_backward, _tiled_fill(lambda s: -1e4), "NaN").diagnosis  # "−10⁴ is small enough"
    assert "every score near −2·10⁴" in d.tried, d.tried


def test_tiled_backward_accepts_the_lowest_finite_fill(accepts):
    accepts(check_tiled_attention_backward, _tiled_fill(lambda s: torch.finfo(s.dtype).min))


def test_attention_backward_that_turns_gradients_off_does_not_break_the_check():
    def attention_backward(q, k, v, dout, mask=None):
        torch.set_grad_enabled(False)  # "no graph needed here"
        return ref.attention_backward(q, k, v, dout, mask)
    try:  # the oracle's autograd runs whatever mode the answer left: a verdict on the answer, never "the check failed"
        result = check_attention_backward.evaluate(attention_backward)
    finally:
        torch.set_grad_enabled(True)
    assert result.status in (Status.PASSED, Status.FAILED), result.text()
    assert "does not require grad" not in result.text(), result.text()


def tiled_backward_own_lse(q, k, v, o, lse, dout, block_size=64, causal=False):
    scale, n = 1 / math.sqrt(q.shape[-1]), q.shape[-2]
    mine = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)  # "I'd rather not trust lse": a first pass for L
    for qs in range(0, n, block_size):
        for ks in range(0, k.shape[-2], block_size):
            s = q[..., qs:qs + block_size, :] @ k[..., ks:ks + block_size, :].mT * scale
            if causal:
                rows, cols = torch.arange(qs, qs + s.shape[-2]), torch.arange(ks, ks + s.shape[-1])
                s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
            mine[..., qs:qs + block_size] = torch.logaddexp(mine[..., qs:qs + block_size], torch.logsumexp(s, dim=-1))
    return ref.tiled_attention_backward(q, k, v, o, mine, dout, block_size, causal=causal)


def test_tiled_backward_that_ignores_lse_is_named(rejects):
    d = rejects(check_tiled_attention_backward, tiled_backward_own_lse, "lse not used").diagnosis
    assert "does not depend on lse" in d.got and "lse + 1" in d.tried, d.tried


# ============================================================================ round 4: a cache that leaves one input out
def _cached_without(name):
    cache = {}

    def tiled_attention_backward(q, k, v, o, lse, dout, block_size=64, causal=False):
        given = dict(q=q, k=k, v=v, o=o, lse=lse, dout=dout)
        key = (tuple(t.numpy().tobytes() for n, t in given.items() if n != name), block_size, causal)
        if key not in cache:  # "same inputs, same gradients" — but the key leaves one input out
            cache[key] = ref.tiled_attention_backward(q, k, v, o, lse, dout, block_size, causal=causal)
        return cache[key]
    return tiled_attention_backward


@pytest.mark.parametrize("name", ["lse", "o"])
def test_a_cache_keyed_without_lse_or_o_is_not_called_a_recomputation(name, rejects):
    """Memoised by the values of every input but one: it does use lse and o; only its cache ignores one. Named as a kept
    result, not as "lse not used: the logsumexp found again" or "D not computed from o"."""
    d = rejects(check_tiled_attention_backward, _cached_without(name), "an earlier result returned again").diagnosis
    assert f"not by {name}" in d.cause and "dout doubled" in d.tried, d


def test_a_cache_keyed_on_every_value_is_accepted(accepts):
    cache = {}

    def tiled_attention_backward(q, k, v, o, lse, dout, block_size=64, causal=False):
        key = (tuple(t.numpy().tobytes() for t in (q, k, v, o, lse, dout)), tuple(q.shape), q.dtype, block_size, causal)
        if key not in cache:
            cache[key] = ref.tiled_attention_backward(q, k, v, o, lse, dout, block_size, causal=causal)
        return cache[key]
    accepts(check_tiled_attention_backward, tiled_attention_backward)
