"""Checks for notebook 05: scaled dot-product attention and the size of its score matrix.

Oracle: ``F.scaled_dot_product_attention``. It does not return the weights, so the expected weights
are its output for the identity matrix as V (weights @ I = weights). Masks are boolean, True = may
attend (the course's convention, and PyTorch's for this function).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ._core import as_tensor, call, check, describe, diagnose, expect_shape, fail, same

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
    """(n_q, n_k) bool with at least one True and one False in every row (so its inverse has no empty row)."""
    mask = torch.rand(n_q, n_k, generator=g) < 0.5
    for i in range(n_q):
        j, k = torch.randperm(n_k, generator=g)[:2].tolist()
        mask[i, j], mask[i, k] = True, False
    return mask


def _cases() -> list[dict]:
    from ..attention import worked_example

    g = torch.Generator().manual_seed(5)
    rand = lambda *shape, dtype=torch.float64: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    cases = []
    Q, K, V = worked_example()
    cases.append(dict(name="the 4×8 worked example, no mask", Q=Q, K=K, V=V, mask=None, atol=1e-7))
    cases.append(dict(name="batched (2, n, d) float32, n_q=5, n_k=7, d_k=6, d_v=3, no mask",
                      Q=rand(2, 5, 6, dtype=torch.float32), K=rand(2, 7, 6, dtype=torch.float32),
                      V=rand(2, 7, 3, dtype=torch.float32), mask=None, atol=2e-5))
    cases.append(dict(name="batch and heads (2, 3, n, d), n_q=4, n_k=6, d_k=16, d_v=5, a (4, 6) bool mask",
                      Q=rand(2, 3, 4, 16), K=rand(2, 3, 6, 16), V=rand(2, 3, 6, 5),
                      mask=_random_keep_mask(4, 6, g), atol=1e-7))
    cases.append(dict(name="causal (6, 6) mask on (2, 6, 8) inputs",
                      Q=rand(2, 6, 8), K=rand(2, 6, 8), V=rand(2, 6, 8),
                      mask=torch.ones(6, 6, dtype=torch.bool).tril(), atol=1e-7))
    lengths = torch.tensor([5, 3])
    key_padding = (torch.arange(5) < lengths[:, None])[:, None, None, :]  # (2, 1, 1, 5)
    cases.append(dict(name="key-padding mask (2, 1, 1, 5) broadcast over heads and queries, Q (2, 4, 3, 8)",
                      Q=rand(2, 4, 3, 8), K=rand(2, 4, 5, 8), V=rand(2, 4, 5, 2), mask=key_padding, atol=1e-7))
    # Large scores: kept ones near -20000, blocked ones up to +30000 (K = I, so scaled = Q / √4).
    wanted = torch.tensor([[-20000.0, 30000.0, -20001.5, 0.0],
                           [30000.0, -20000.7, -5000.0, -20000.0],
                           [-20002.0, -20000.0, 30000.0, -5000.0]], dtype=torch.float64)
    keep = torch.tensor([[True, False, True, False], [False, True, False, True], [True, True, False, False]])
    cases.append(dict(name="large scores (±3e4) with a mask", Q=2 * wanted, K=torch.eye(4, dtype=torch.float64),
                      V=rand(4, 3), mask=keep, atol=1e-7, large=True))
    cases.append(dict(name="a single key (n_k = 1)", Q=rand(3, 4), K=rand(1, 4), V=rand(1, 2), mask=None, atol=1e-7))
    return cases


# ----------------------------------------------------------------------------- pitfalls
POLARITY = ("mask polarity inverted: you blocked the positions where the mask is True. In this course "
            "(as in F.scaled_dot_product_attention) True means 'may attend' — fill the scores where the "
            "mask is False: scores.masked_fill(~mask, float('-inf')).")
WEAK_FILL = ("a weak fill value leaks weight onto masked keys: with scores this large, -1e4 is not "
             "'minus infinity'. Use float('-inf') (or torch.finfo(scores.dtype).min).")


def _plain_softmax(x, dim=-1):
    return torch.softmax(x, dim=dim)


def _weight_pitfalls(case) -> list[tuple[str, object]]:
    Q, K, V, mask = case["Q"], case["K"], case["V"], case["mask"]
    d_k, d_v, n_q = Q.shape[-1], V.shape[-1], Q.shape[-2]
    scores = Q @ K.transpose(-2, -1)
    scaled = scores / math.sqrt(d_k)

    def masked(s, fill=float("-inf")):
        return s if mask is None else s.masked_fill(~mask, fill)

    out = []
    for dim in range(scaled.dim() - 1):
        axis = "-2 (the queries)" if dim == scaled.dim() - 2 else f"{dim} (a batch axis)"
        out.append((f"the softmax runs over axis {axis} instead of the last axis (the keys): use dim=-1, "
                    "so that each query's row of weights sums to 1.", lambda dim=dim: _plain_softmax(masked(scaled), dim)))
    out.append(("the softmax runs over the whole matrix at once instead of over each row: use dim=-1.",
                lambda: _plain_softmax(masked(scaled).flatten(-2), -1).reshape(scaled.shape)))
    out += [
        ("the scores are not scaled: divide Q Kᵀ by √d_k before the softmax.", lambda: _plain_softmax(masked(scores))),
        ("the scores are divided by d_k instead of √d_k.", lambda: _plain_softmax(masked(scores / d_k))),
        ("the scores are multiplied by √d_k instead of divided by it.", lambda: _plain_softmax(masked(scores * math.sqrt(d_k)))),
        ("wrong scale: √d_v (V's width) instead of √d_k (the width of Q and K, Q.shape[-1]).",
         lambda: None if d_v == d_k else _plain_softmax(masked(scores / math.sqrt(d_v)))),
        ("wrong scale: √n (the number of queries, Q.shape[-2]) instead of √d_k (Q.shape[-1]).",
         lambda: None if n_q == d_k else _plain_softmax(masked(scores / math.sqrt(n_q)))),
        ("the weights are transposed: rows must be queries and columns keys (weights[..., i, j] = how much "
         "query i attends to key j).", lambda: _plain_softmax(masked(scaled)).transpose(-2, -1)),
    ]
    if mask is not None:
        soft = _plain_softmax(scaled)
        m = mask.to(scaled.dtype)
        out += [
            ("the mask is applied after the softmax: zeroing weights afterwards leaves rows that no longer sum "
             "to 1. Fill the blocked *scores* with -inf before the softmax.", lambda: soft * m),
            ("the mask is applied after the softmax (weights filled with -inf): mask the scores, before the softmax.",
             lambda: soft.masked_fill(~mask, float("-inf"))),
            (POLARITY, lambda: _plain_softmax(scaled.masked_fill(mask, float("-inf")))),
            (POLARITY, lambda: _plain_softmax(scaled.masked_fill(mask, -1e9))),
            ("the mask was ignored: blocked keys still get weight. Fill the scores where mask is False with -inf.",
             lambda: soft),
            ("the bool mask was added to the scores (True counts as +1, which blocks nothing): fill the blocked "
             "scores with -inf instead, e.g. scores.masked_fill(~mask, float('-inf')).",
             lambda: _plain_softmax(scaled + m)),
        ]
        weak = []
        for fill in (-1e4, -1e3, -1e5):
            weak += [
                (WEAK_FILL, lambda fill=fill: _plain_softmax(scaled.masked_fill(~mask, fill))),
                (WEAK_FILL, lambda fill=fill: _plain_softmax(scores.masked_fill(~mask, fill) / math.sqrt(d_k))),
                (WEAK_FILL, lambda fill=fill: _plain_softmax(scaled + (~mask).to(scaled.dtype) * fill)),
            ]
        # Where scores are huge, a leak can look like other mistakes too: the weak fill is the one that
        # passes every earlier case, so it is named first there.
        out = weak + out if case.get("large") else out + weak
    return out


def _output_pitfalls(case) -> list[tuple[str, object]]:
    Q, K, V, mask = case["Q"], case["K"], case["V"], case["mask"]
    scaled = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    masked = scaled if mask is None else scaled.masked_fill(~mask, float("-inf"))
    return [
        ("V was multiplied in before the softmax: take the softmax of the scaled scores first, then multiply the "
         "weights by V (output = weights @ V).", lambda: torch.softmax(scaled @ V, dim=-1)),
        ("V was multiplied in before the softmax (the mask and softmax were applied to scores @ V): "
         "output = softmax(masked scaled scores) @ V.", lambda: torch.softmax(masked @ V, dim=-1)),
        ("the output uses the scores before the softmax: output = weights @ V with weights = softmax(...).",
         lambda: scaled @ V),
        ("the output was computed with the transposed weights.", lambda: torch.softmax(masked, -1).transpose(-2, -1) @ V),
    ]


def _structural_hint(w: torch.Tensor, case) -> str:
    """A reason for wrong weights when no known mistake reproduces them exactly."""
    w = w.to(torch.float64)
    if torch.isnan(w).any():
        if case.get("large"):
            return ("the weights contain NaN for large scores: exp underflows or overflows — a hand-written "
                    "softmax must subtract each row's maximum before exp (torch.softmax does), and the mask "
                    "belongs on the scores before the softmax, not on the weights after it.")
        return "the weights contain NaN (a softmax over a row that is -inf everywhere, or exp overflowing?)."
    mask = case["mask"]
    if mask is not None:
        blocked = ~torch.broadcast_to(mask, w.shape)
        leak = w[blocked].abs().max().item() if blocked.any() else 0.0
        if leak > 1e-6:
            if case.get("large"):
                return WEAK_FILL + f" (largest weight on a masked key: {leak:.3g})"
            return f"masked keys receive weight (up to {leak:.3g}): block them with -inf before the softmax."
    sums = w.sum(-1)
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-5):
        return "each row of weights (one query) should sum to 1 over the keys (the last axis)."
    return ""


def _compare(actual, expected, what, case, pitfalls, hint_fn=None):
    atol = case["atol"]
    if same(actual, expected, atol=atol, rtol=1e-5):
        return
    hint = diagnose(actual, pitfalls, atol=atol, rtol=1e-5) or (hint_fn(actual, case) if hint_fn else "")
    a64, e64 = actual.to(torch.float64), expected.to(torch.float64)
    diff = (a64 - e64).abs().nan_to_num(nan=float("inf"))
    worst = tuple(int(i) for i in torch.nonzero(diff == diff.max())[0])
    detail = f"largest difference at index {worst}: got {a64[worst].item():.4g}, expected {e64[worst].item():.4g}"
    fail(f"{what} ({case['name']}) does not match F.scaled_dot_product_attention"
         + (f" — {hint}" if hint else ".") + f" [{detail}]")


def _unpack(result, name: str):
    if isinstance(result, (torch.Tensor, np.ndarray)):
        fail(f"attention returned a single {describe(result)}; expected a tuple (output, weights) — "
             "end with `return output, weights`.")
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        fail(f"attention returned {describe(result)}; expected a tuple of two tensors (output, weights).")
    return as_tensor(result[0], f"output (first element) for {name}"), as_tensor(result[1], f"weights (second element) for {name}")


@check("attention", expects="a function attention(Q, K, V, mask=None) returning (output, weights)")
def check_attention(fn):
    cases = _cases()
    for case in cases:
        Q, K, V, mask = case["Q"], case["K"], case["V"], case["mask"]
        args = (Q, K, V) if mask is None else (Q, K, V, mask)
        try:
            result = call(fn, *args)
        except Exception as exc:
            if Q.dim() > 2 and "not attempted" not in str(exc):
                raise type(exc)(f"{exc} — on batched input ({case['name']}): transpose only the last two axes, "
                                "K.transpose(-2, -1) (K.T reverses every axis).") from None
            raise
        out, w = _unpack(result, case["name"])
        exp_out, exp_w = _oracle(Q, K, V, mask)
        if tuple(out.shape) == tuple(exp_w.shape) and tuple(w.shape) == tuple(exp_out.shape) and exp_w.shape != exp_out.shape:
            fail(f"output and weights are swapped ({case['name']}): return (output, weights), in that order.")
        expect_shape(w, exp_w.shape, f"weights ({case['name']})",
                     "Expected (..., n_q, n_k): one row per query, one column per key.")
        _compare(w, exp_w, "weights", case, _weight_pitfalls(case), _structural_hint)
        expect_shape(out, exp_out.shape, f"output ({case['name']})", "Expected (..., n_q, d_v): weights @ V.")
        _compare(out, exp_out, "output", case, _output_pitfalls(case))
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


@check("score_matrix_bytes", expects="a function score_matrix_bytes(n, batch=1, heads=1, dtype=torch.float32) returning a number of bytes")
def check_score_matrix_bytes(fn):
    for case in _BYTE_CASES:
        n, b, h, dtype = case["n"], case["batch"], case["heads"], case["dtype"]
        # Oracle: the nbytes of a real (batch, heads, n, n) tensor (on the meta device: nothing is allocated).
        expected = torch.empty(b, h, n, n, dtype=dtype, device="meta").nbytes
        element = torch.empty((), dtype=dtype).element_size()
        shown = f"score_matrix_bytes({n}, batch={b}, heads={h}, dtype={str(dtype).replace('torch.', 'torch.')})"
        got_t = as_tensor(call(fn, n, batch=b, heads=h, dtype=dtype), shown)
        if got_t.numel() != 1:
            fail(f"{shown} returned {describe(got_t)}; expected one number (an int).")
        got = got_t.to(torch.float64).item()
        if math.isnan(got):
            fail(f"{shown} returned NaN; expected a number of bytes.")
        if got == expected:
            continue
        pitfalls = [
            (expected * 8, "that is bits, not bytes: do not multiply by 8 (element_size() is already in bytes)."),
            (expected // b if b > 1 else None, "the batch size is missing: multiply by batch."),
            (expected // h if h > 1 else None, "the number of heads is missing: multiply by heads."),
            (b * h * n * element if n > 1 else None, "the score matrix has n × n entries, not n: square n."),
            (b * h * n * n * 4 if element != 4 else None,
             "4 bytes per entry assumed: the size depends on dtype — torch.empty((), dtype=dtype).element_size()."),
            (b * h * n * n if element != 1 else None, "that is the number of entries: multiply by the bytes per entry."),
        ]
        hint = next((msg for value, msg in pitfalls if value is not None and got == value), "")
        fail(f"{shown} returned {got:.10g}, expected {expected} bytes (batch × heads × n × n × bytes per entry)."
             + (f" It looks like {hint}" if hint else ""))
    return f"exact on {len(_BYTE_CASES)} cases (float16/bfloat16/float32/float64, batch and heads)"
