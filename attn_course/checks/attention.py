"""Checks for notebook 05: scaled dot-product attention and the size of its score matrix.

Oracle: ``F.scaled_dot_product_attention``. It does not return the weights, so the expected weights
are its output with the identity matrix as V (weights @ I = weights). Masks are boolean, True = may
attend (the course's convention, and PyTorch's for this function).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .core import Learner, LearnerRaised, Mistake, as_tensor, check, expect_close, expect_shape, fail, learner_error
from .compare import Failure

__all__ = ["check_attention", "check_score_matrix_bytes"]


# ----------------------------------------------------------------------------- oracle
def _oracle(Q, K, V, mask):
    n_k = K.shape[-2]
    eye = torch.eye(n_k, dtype=Q.dtype).expand(*K.shape[:-2], n_k, n_k)
    out = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask)
    weights = F.scaled_dot_product_attention(Q, K, eye, attn_mask=mask)
    return out, weights


# ----------------------------------------------------------------------------- cases
def _random_keep_mask(n_q: int, n_k: int, g: torch.Generator) -> torch.Tensor:
    """(n_q, n_k) bool with at least one True and one False in every row."""
    mask = torch.rand(n_q, n_k, generator=g) < 0.5
    for i in range(n_q):
        j, k = torch.randperm(n_k, generator=g)[:2].tolist()
        mask[i, j], mask[i, k] = True, False
    return mask


def _cases() -> list[dict]:
    from ..dot import worked_example

    g = torch.Generator().manual_seed(5)

    def rand(*shape, dtype=torch.float64):
        return torch.randn(*shape, generator=g, dtype=dtype)

    Q, K, V = worked_example()
    cases = [dict(name="the 4×8 worked example, no mask", Q=Q, K=K, V=V, mask=None, atol=1e-7)]
    cases.append(dict(name="a batch of 2 in float32, n_q = 5, n_k = 7, d_k = 6, d_v = 3",
                      Q=rand(2, 5, 6, dtype=torch.float32), K=rand(2, 7, 6, dtype=torch.float32),
                      V=rand(2, 7, 3, dtype=torch.float32), mask=None, atol=2e-5))
    cases.append(dict(name="batch × heads (2, 3), n_q = 4, n_k = 6, d_k = 16, d_v = 5, with a (4, 6) mask",
                      Q=rand(2, 3, 4, 16), K=rand(2, 3, 6, 16), V=rand(2, 3, 6, 5),
                      mask=_random_keep_mask(4, 6, g), atol=1e-7))
    cases.append(dict(name="a causal (6, 6) mask on a batch of 2",
                      Q=rand(2, 6, 8), K=rand(2, 6, 8), V=rand(2, 6, 8),
                      mask=torch.ones(6, 6, dtype=torch.bool).tril(), atol=1e-7))
    lengths = torch.tensor([5, 3])
    key_padding = (torch.arange(5) < lengths[:, None])[:, None, None, :]  # (2, 1, 1, 5)
    cases.append(dict(name="a key-padding mask (2, 1, 1, 5) broadcast over 4 heads and 3 queries",
                      Q=rand(2, 4, 3, 8), K=rand(2, 4, 5, 8), V=rand(2, 4, 5, 2), mask=key_padding, atol=1e-7))
    # Large scores: kept ones near -20000, blocked ones up to +30000 (K = I, so the scaled scores are Q / 2).
    wanted = torch.tensor([[-20000.0, 30000.0, -20001.5, 0.0],
                           [30000.0, -20000.7, -5000.0, -20000.0],
                           [-20002.0, -20000.0, 30000.0, -5000.0]], dtype=torch.float64)
    keep = torch.tensor([[True, False, True, False], [False, True, False, True], [True, True, False, False]])
    cases.append(dict(name="large scores (±3·10⁴) with a mask", Q=2 * wanted, K=torch.eye(4, dtype=torch.float64),
                      V=rand(4, 3), mask=keep, atol=1e-7, large=True))
    cases.append(dict(name="a single key (n_k = 1)", Q=rand(3, 4), K=rand(1, 4), V=rand(1, 2), mask=None, atol=1e-7))
    return cases


# ----------------------------------------------------------------------------- known mistakes
_DIM_FIX = "take the softmax over the last axis, torch.softmax(scores, dim=-1): each query's row of weights sums to 1"
_POLARITY = Mistake(
    "mask polarity inverted", "you blocked the positions where the mask is True; in this course (as in "
    "F.scaled_dot_product_attention) True means 'may attend'",
    "fill the scores where the mask is False: scores.masked_fill(~mask, float('-inf'))", None)
_WEAK = ("a fill value too weak for these scores", "you filled blocked scores with a large negative number, but "
         "next to scores of ±3·10⁴ it is not 'minus infinity', so blocked keys still get weight",
         "fill with float('-inf') (or torch.finfo(scores.dtype).min)")


def _weight_mistakes(case: dict) -> list[Mistake]:
    Q, K, V, mask = case["Q"], case["K"], case["V"], case["mask"]
    d_k, d_v, n_q = Q.shape[-1], V.shape[-1], Q.shape[-2]
    scores = Q @ K.transpose(-2, -1)
    scaled = scores / math.sqrt(d_k)

    def masked(s, fill=float("-inf")):
        return s if mask is None else s.masked_fill(~mask, fill)

    out = []
    for dim in range(scaled.dim() - 1):
        axis = "-2, the queries" if dim == scaled.dim() - 2 else f"{dim}, a batch axis"
        out.append(Mistake(f"softmax over axis {axis.split(',')[0]}", f"you took the softmax over axis {axis}",
                           _DIM_FIX, lambda dim=dim: torch.softmax(masked(scaled), dim)))
    out += [
        Mistake("softmax over the whole matrix", "you took one softmax over the whole (n_q, n_k) matrix", _DIM_FIX,
                lambda: torch.softmax(masked(scaled).flatten(-2), -1).reshape(scaled.shape)),
        Mistake("scores not scaled", "you did not divide the scores by √d_k", "divide Q Kᵀ by math.sqrt(d_k) before "
                "the softmax, with d_k = Q.shape[-1]", lambda: torch.softmax(masked(scores), -1)),
        Mistake("divided by d_k instead of √d_k", "you divided the scores by d_k", "divide by math.sqrt(d_k)",
                lambda: torch.softmax(masked(scores / d_k), -1)),
        Mistake("multiplied by √d_k", "you multiplied the scores by √d_k", "divide by math.sqrt(d_k) instead",
                lambda: torch.softmax(masked(scores * math.sqrt(d_k)), -1)),
        Mistake("scaled by √d_v", "you scaled by √d_v, the width of V", "scale by √d_k, the width of Q and K "
                "(Q.shape[-1])", lambda: None if d_v == d_k else torch.softmax(masked(scores / math.sqrt(d_v)), -1)),
        Mistake("scaled by √n_q", "you scaled by the square root of the number of queries (Q.shape[-2])",
                "scale by √d_k (Q.shape[-1])",
                lambda: None if n_q == d_k else torch.softmax(masked(scores / math.sqrt(n_q)), -1)),
        Mistake("weights transposed", "you returned the weights with queries and keys swapped",
                "keep weights[..., i, j] = how much query i attends to key j (queries on rows)",
                lambda: torch.softmax(masked(scaled), -1).transpose(-2, -1)),
    ]
    if mask is not None:
        soft = torch.softmax(scaled, -1)
        m = mask.to(scaled.dtype)
        after = ("mask applied after the softmax", "you masked the weights after the softmax, so the rows no "
                 "longer sum to 1", "fill the blocked *scores* with -inf before the softmax")
        out += [
            Mistake(*after, lambda: soft * m),
            Mistake(*after, lambda: soft.masked_fill(~mask, float("-inf"))),
            Mistake(*after, lambda: soft.masked_fill(~mask, 0.0)),
            Mistake(_POLARITY.summary, _POLARITY.cause, _POLARITY.fix,
                    lambda: torch.softmax(scaled.masked_fill(mask, float("-inf")), -1)),
            Mistake(_POLARITY.summary, _POLARITY.cause, _POLARITY.fix,
                    lambda: torch.softmax(scaled.masked_fill(mask, -1e9), -1)),
            Mistake("mask ignored", "you did not use the mask, so blocked keys still get weight",
                    "fill the scores where the mask is False with -inf before the softmax", lambda: soft),
            Mistake("bool mask added to the scores", "you added the boolean mask to the scores: True counts as +1, "
                    "which blocks nothing", "fill the blocked scores with -inf: scores.masked_fill(~mask, float('-inf'))",
                    lambda: torch.softmax(scaled + m, -1)),
        ]
        weak = []
        for fill in (-1e4, -1e3, -1e5):
            weak += [
                Mistake(*_WEAK, lambda fill=fill: torch.softmax(scaled.masked_fill(~mask, fill), -1)),
                Mistake(*_WEAK, lambda fill=fill: torch.softmax(scores.masked_fill(~mask, fill) / math.sqrt(d_k), -1)),
                Mistake(*_WEAK, lambda fill=fill: torch.softmax(scaled + (~mask).to(scaled.dtype) * fill, -1)),
            ]
        # Where scores are huge, a leak can look like other mistakes too: the weak fill is the one that
        # passes every earlier case, so it is named first there.
        out = weak + out if case.get("large") else out + weak
    return out


def _output_mistakes(case: dict) -> list[Mistake]:
    Q, K, V, mask = case["Q"], case["K"], case["V"], case["mask"]
    scaled = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    masked = scaled if mask is None else scaled.masked_fill(~mask, float("-inf"))
    before = ("V multiplied before the softmax", "you multiplied by V before taking the softmax, so the output is "
              "a softmax over features", "take the softmax of the scaled scores first; then output = weights @ V")
    return [
        Mistake(*before, lambda: torch.softmax(scaled @ V, dim=-1)),
        Mistake(*before, lambda: torch.softmax(masked @ V, dim=-1)),
        Mistake("output from the raw scores", "you multiplied V by the scores, not by the weights",
                "output = weights @ V, with weights = softmax(…)", lambda: scaled @ V),
        Mistake("output from transposed weights", "you multiplied V by the transposed weights",
                "output = weights @ V", lambda: torch.softmax(masked, -1).transpose(-2, -1) @ V),
    ]


def _structure(w: torch.Tensor, case: dict, tried: str) -> None:
    """When no known mistake reproduces the weights, say which property of them is off."""
    w = w.to(torch.float64)
    if torch.isnan(w).any():
        fail("NaN in the weights", tried=tried, got="NaN in the weights",
             expected="finite weights, every row summing to 1",
             cause="with scores this large, exp overflows (a hand-written softmax must subtract each row's maximum "
             "first), and weights masked and renormalised after the softmax become 0/0"
             if case.get("large") else "a softmax over a row that is -inf everywhere, or exp overflowing",
             fix="fill the blocked scores with -inf before the softmax, then use torch.softmax")
    if case["mask"] is not None:
        blocked = ~torch.broadcast_to(case["mask"], w.shape)
        leak = w[blocked].abs().max().item() if blocked.any() else 0.0
        if leak > 1e-6:
            fail("weight on masked keys", tried=tried, got=f"masked keys receive weight (up to {leak:.3g})",
                 expected="weight 0 on every key the mask blocks",
                 cause=_WEAK[1] if case.get("large") else "", fix="fill the blocked scores with float('-inf') "
                 "before the softmax")
    sums = w.sum(-1)
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-5):
        fail("rows of weights do not sum to 1", tried=tried,
             got=f"rows summing to {sums.min().item():.3g} … {sums.max().item():.3g}",
             expected="every row (one query) summing to 1 over the keys", fix=_DIM_FIX)


def _unpack(result, tried: str) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(result, torch.Tensor):
        fail("returned one tensor, not (output, weights)", tried=tried, got=f"one tensor of shape {tuple(result.shape)}",
             expected="a tuple (output, weights)", fix="end the function with `return output, weights`")
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        got = f"a {type(result).__name__} of {len(result)} items" if isinstance(result, (tuple, list)) else type(result).__name__
        fail("did not return (output, weights)", tried=tried, got=got, expected="a tuple of two tensors (output, weights)",
             fix="end the function with `return output, weights`")
    return (as_tensor(result[0], tried=tried, what="the output (first element)"),
            as_tensor(result[1], tried=tried, what="the weights (second element)"))


def _call_attention(fn: Learner, case: dict, tried: str):
    Q, K, V, mask = case["Q"], case["K"], case["V"], case["mask"]
    try:
        return fn(Q, K, V) if mask is None else fn(Q, K, V, mask)
    except LearnerRaised as exc:
        hint = {}
        if mask is not None and exc.type_name == "TypeError" and "argument" in exc.message:
            hint = dict(cause="your function does not take the mask as its fourth argument",
                        fix="keep the signature attention(Q, K, V, mask=None)")
        elif Q.dim() > 2 and ("size" in exc.message or "dimension" in exc.message or "shape" in exc.message) \
                and "transpose" not in exc.message:
            hint = dict(cause="on batched input, K.T reverses every axis (the batch axes too)",
                        fix="transpose only the last two axes: K.transpose(-2, -1)")
        raise Failure(learner_error(exc, tried=tried, expected="(output, weights)", **hint)) from None


@check("attention", expects="a function attention(Q, K, V, mask=None) returning (output, weights)")
def check_attention(fn: Learner) -> str:
    cases = _cases()
    for case in cases:
        Q, K, V, mask = case["Q"], case["K"], case["V"], case["mask"]
        tried = f"attention(Q, K, V{', mask' if mask is not None else ''}) on {case['name']}"
        out, w = _unpack(_call_attention(fn, case, tried), tried)
        exp_out, exp_w = _oracle(Q, K, V, mask)
        if tuple(out.shape) == tuple(exp_w.shape) and tuple(w.shape) == tuple(exp_out.shape) and exp_w.shape != exp_out.shape:
            fail("output and weights swapped", tried=tried, got="(weights, output)", expected="(output, weights)",
                 fix="return output first, then weights")
        atol = case["atol"]
        expect_shape(w, exp_w.shape, tried=tried, what="the weights", mistakes=_weight_mistakes(case),
                     fix="the weights have one row per query and one column per key: (..., n_q, n_k)")
        weight_mistakes = _weight_mistakes(case)
        try:
            expect_close(w, exp_w, tried=tried, what="the weights", atol=atol, rtol=1e-5, mistakes=weight_mistakes)
        except Failure as failure:
            if failure.diagnosis.cause:
                raise
            _structure(w, case, tried)
            raise
        expect_shape(out, exp_out.shape, tried=tried, what="the output", mistakes=_output_mistakes(case),
                     fix="the output is weights @ V: (..., n_q, d_v)")
        expect_close(out, exp_out, tried=tried, what="the output", atol=atol, rtol=1e-5, mistakes=_output_mistakes(case))
    return f"matches F.scaled_dot_product_attention on {len(cases)} cases (batched, d_k ≠ d_v, masks, large scores)"


# ----------------------------------------------------------------------------- score matrix bytes
_BYTE_CASES = [
    dict(n=6, batch=1, heads=1, dtype=torch.float32),
    dict(n=10, batch=2, heads=3, dtype=torch.float16),
    dict(n=7, batch=3, heads=1, dtype=torch.float64),
    dict(n=5, batch=1, heads=2, dtype=torch.bfloat16),
    dict(n=4096, batch=1, heads=12, dtype=torch.float16),
    dict(n=1, batch=1, heads=1, dtype=torch.float32),
]


@check("score_matrix_bytes",
       expects="a function score_matrix_bytes(n, batch=1, heads=1, dtype=torch.float32) returning a number of bytes")
def check_score_matrix_bytes(fn: Learner) -> str:
    for case in _BYTE_CASES:
        n, b, h, dtype = case["n"], case["batch"], case["heads"], case["dtype"]
        # Oracle: the nbytes of a real (batch, heads, n, n) tensor on the meta device (nothing is allocated).
        expected = torch.empty(b, h, n, n, dtype=dtype, device="meta").nbytes
        element = torch.empty((), dtype=dtype).element_size()
        tried = f"score_matrix_bytes({n}, batch={b}, heads={h}, dtype={dtype})"
        got_t = as_tensor(fn(n, batch=b, heads=h, dtype=dtype), tried=tried, expected="a number of bytes (an int)")
        if got_t.numel() != 1:
            fail("returned a tensor, not one number", tried=tried, got=f"a tensor of shape {tuple(got_t.shape)}",
                 expected="one number of bytes (an int)", fix="return an int, e.g. with .item() or plain arithmetic")
        got = got_t.to(torch.float64).item()
        if got == expected:
            continue
        mistakes = [
            (expected * 8, "bits, not bytes", "you multiplied by 8: element_size() is already in bytes",
             "leave out the factor 8"),
            (expected // b if b > 1 else None, "batch size missing", "you left out the batch size",
             "multiply by batch"),
            (expected // h if h > 1 else None, "number of heads missing", "you left out the number of heads",
             "multiply by heads"),
            (b * h * n * element if n > 1 else None, "n instead of n × n", "you counted n entries per matrix",
             "the score matrix is n × n: square n"),
            (b * h * n * n * 4 if element != 4 else None, "4 bytes per entry assumed",
             "you assumed 4 bytes per entry whatever the dtype",
             "take the bytes per entry from the dtype: torch.empty((), dtype=dtype).element_size()"),
            (b * h * n * n if element != 1 else None, "entries, not bytes", "you returned the number of entries",
             "multiply by the bytes per entry"),
        ]
        match = next((m for m in mistakes if m[0] is not None and got == m[0]), None)
        summary, cause, fix = match[1:] if match else (f"{got:.10g} bytes, expected {expected}", "", "")
        fail(summary, tried=tried, got=f"{got:.10g}", expected=f"{expected} bytes (batch × heads × n × n × bytes per entry)",
             cause=cause, fix=fix or "multiply batch × heads × n × n × the bytes of one entry")
    return f"exact on {len(_BYTE_CASES)} cases (float16, bfloat16, float32, float64; batch and heads)"
