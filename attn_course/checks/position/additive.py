"""additive_attention: Bahdanau's wᵀ tanh(W_q q + W_k k) scores, its known mistakes on the weights and the
output, and the wrong ways to pair queries with keys named by the learner's own exception."""

from __future__ import annotations

import math
from typing import Callable

import torch

from .. import kit
from ..compare import Failure, fail, fail_again, fmt, same
from ..core import Learner, check
from ..kit import Known, Suspects
from .judge import call


_MASKED = ("polarity", "after", "ignored", "zero_fill")


def _additive(q, k, v, Wq, Wk, w, mask=None, mistake: str = "") -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(output, weights) in float64, or under one classic mistake ((None, None) where it cannot happen: a mask
    mistake without a mask, no maximum subtracted where nothing overflows)."""
    if mistake in _MASKED and mask is None or mistake == "naive" and w.abs().max() < 50:
        return None, None
    q, k, v, Wq, Wk, w = (t.double() for t in (q, k, v, Wq, Wk, w))
    hq, hk = (x @ (W if mistake == "transposed" else W.T) for x, W in ((q, Wq), (k, Wk)))
    pre = hq[..., :, None, :] + hk[..., None, :, :]  # (..., n_q, n_k, d_h)
    hidden = {"no_tanh": pre, "separate": torch.tanh(hq)[..., :, None, :] + torch.tanh(hk)[..., None, :, :],
              "sigmoid": torch.sigmoid(pre), "relu": torch.relu(pre)}.get(mistake, torch.tanh(pre))
    scores = torch.tanh(pre @ w) if mistake == "w_before" else hq @ hk.transpose(-2, -1) if mistake == "dot" else \
        hidden @ (torch.ones_like(w) if mistake == "no_w" else w)
    scores = scores / {"scaled": math.sqrt(Wq.shape[0]), "scaled_dk": math.sqrt(k.shape[-1])}.get(mistake, 1.0)
    if mask is not None and mistake not in ("after", "ignored"):
        scores = scores.masked_fill(mask if mistake == "polarity" else ~mask,
                                    0.0 if mistake == "zero_fill" else float("-inf"))
    weights = torch.softmax(scores, dim=-2 if mistake == "dim" else -1)
    if mistake == "after":
        weights = weights.masked_fill(~mask, 0.0)
    if mistake == "naive":  # no maximum subtracted, in float32 (the large-w case): e^100 overflows
        e = torch.exp(scores.float())
        weights = (e / e.sum(-1, keepdim=True)).double()
    out = (scores if mistake == "scores_v" else weights) @ v
    return out, weights.transpose(-2, -1) if mistake == "weights_T" else weights


_ADD_FIX = ("scores[i, j] = w · tanh(W_q q_i + W_k k_j); weights = softmax over the keys (no scale); "
            "output = weights @ v")
_TANH = "torch.tanh(hq[..., :, None, :] + hk[..., None, :, :])"
_BEFORE = "fill blocked scores with float('-inf') before the softmax"
_TRANSPOSED = ("you computed q @ W_q, but W_q has shape (d_h, d_q): W_q q_i is q @ W_q.T",
               "project with q @ W_q.T and k @ W_k.T")
_ADD_ROWS = [
    ("transposed", "W_q and W_k used transposed", *_TRANSPOSED),
    ("no_tanh", "tanh missing", "you summed the projections without tanh: the score splits into a query part and a "
     "key part", "apply torch.tanh to W_q q_i + W_k k_j before the dot product with w"),
    ("separate", "tanh applied to each projection separately", "you computed tanh(W_q q) + tanh(W_k k); the tanh "
     "acts on their sum", _TANH),
    ("no_w", "w ignored", "you summed the hidden units instead of weighting them with w", "hidden @ w"),
    ("w_before", "w applied before the tanh", "you computed tanh(wᵀ(W_q q + W_k k)); the score is "
     "wᵀ tanh(W_q q + W_k k)", f"{_TANH} @ w"),
    ("dot", "dot-product scores, not additive ones", "your scores are (W_q q_i)·(W_k k_j), a dot product of the "
     "projections (multiplicative attention); additive attention adds them, applies tanh, then takes w's dot product",
     f"{_TANH} @ w"),
    ("sigmoid", "sigmoid instead of tanh", "your hidden units go through a sigmoid; Bahdanau's score uses tanh", _TANH),
    ("relu", "ReLU instead of tanh", "your hidden units go through a ReLU; Bahdanau's score uses tanh", _TANH),
    ("scaled", "scores scaled by √d_h", "additive attention has no 1/√d scale", "leave the scores unscaled"),
    ("scaled_dk", "scores scaled by √d_k", "additive attention has no 1/√d scale", "leave the scores unscaled"),
    ("dim", "softmax over the queries", "you took the softmax over axis -2", "torch.softmax(scores, dim=-1)"),
    ("polarity", "mask polarity inverted", "you blocked where the mask is True; True means 'may attend'",
     "scores.masked_fill(~mask, float('-inf'))"),
    ("after", "mask applied after the softmax", "you zeroed blocked weights after the softmax: rows no longer sum "
     "to 1", _BEFORE),
    ("ignored", "mask ignored", "blocked keys still get weight", _BEFORE),
    ("zero_fill", "blocked scores set to 0, not −inf", "a score of 0 still gets weight e^0 / Σ", _BEFORE),
    ("weights_T", "weights transposed", "your weights have one row per key", "keep (..., n_q, n_k)"),
    ("scores_v", "output from the scores", "you multiplied v by the scores, not the weights", "output = weights @ v"),
    ("naive", "no maximum subtracted", "your softmax exponentiates the raw scores: e^100 overflows float32 "
     "(inf / inf = NaN)", "use torch.softmax (or subtract each row's maximum first)"),
]
_ADD_W, _ADD_OUT = ([Known(key, s, c, f, lambda *case, key=key, part=part: _additive(*case, mistake=key)[part])
                     for key, s, c, f in _ADD_ROWS] for part in (1, 0))


def _constructs(q, k, v, Wq, Wk, w, mask=None) -> list[tuple[str, str, Callable[[], object]]]:
    """Wrong ways to pair the projections: one that raises the learner's very message is named."""
    hq, hk = q @ Wq.T, k @ Wk.T
    return [
        ("you added W_q q_i and W_k k_j position by position (query i with key i); every query must meet every key",
         "broadcast: hq[..., :, None, :] + hk[..., None, :, :] gives (..., n_q, n_k, d_h)", lambda: hq + hk),
        ("you paired queries and keys with unsqueeze(1) and unsqueeze(0), right for 2-D input only: with batch "
         "axes the new axes land among them", "count from the end: unsqueeze(-2) and unsqueeze(-3)",
         lambda: hq.unsqueeze(1) + hk.unsqueeze(0)),
        *[(*_TRANSPOSED, attempt) for attempt in (lambda: q @ Wq, lambda: k @ Wk)],
        *[("you projected q with W_k (or k with W_q)", "hq = q @ W_q.T, hk = k @ W_k.T", attempt)
          for attempt in (lambda: q @ Wk.T, lambda: k @ Wq.T)],
    ]


@check("additive_attention",
       expects="a function additive_attention(q, k, v, W_q, W_k, w, mask=None) returning (output, weights)")
def check_additive_attention(fn: Learner) -> str:
    g = torch.Generator().manual_seed(21)
    r = lambda *shape, dtype=torch.float64, scale=1.0: (  # noqa: E731
        torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)
    keep = torch.rand(4, 5, generator=g) < 0.6
    keep[torch.arange(4), torch.randint(0, 5, (4,), generator=g)] = True
    keep[0] = torch.tensor([True, False, True, False, False])
    padding = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])[:, None, :]  # (2, 1, 7)
    f32 = torch.float32
    cases = [
        ("q (4, 3), k (6, 5), v (6, 2), d_h = 7", (r(4, 3), r(6, 5), r(6, 2), r(7, 3), r(7, 5), r(7))),
        ("batch × heads (2, 3), n_q = 4, n_k = 5, d_h = 8, with a (4, 5) mask",
         (r(2, 3, 4, 6), r(2, 3, 5, 6), r(2, 3, 5, 3), r(8, 6), r(8, 6), r(8), keep)),
        ("square weights: d_q = d_k = d_h = 4", (r(3, 4), r(5, 4), r(5, 2), r(4, 4), r(4, 4), r(4))),
        ("one query per sequence, key padding mask (2, 1, 7)",
         (r(2, 1, 5), r(2, 7, 5), r(2, 7, 4), r(6, 5), r(6, 5), r(6), padding)),
        ("float32, n_q = 3, n_k = 3", tuple(r(*s, dtype=f32) for s in ((3, 4), (3, 4), (3, 2), (5, 4), (5, 4), (5,)))),
        ("large w (scores beyond ±100, float32)",
         (*(r(*s, dtype=f32) for s in ((2, 4), (6, 4), (6, 3), (8, 4), (8, 4))), r(8, dtype=f32, scale=120.0))),
    ]
    on_w, on_out = Suspects(_ADD_W, atol=3e-5, rtol=1e-3), Suspects(_ADD_OUT, atol=3e-5, rtol=1e-3)
    for name, case in cases:
        masked = len(case) == 7
        tried = f"additive_attention(q, k, v, W_q, W_k, w{', mask' if masked else ''}) on {name}"
        takes_mask = [("TypeError", "argument", "your function does not take the mask", "keep the signature "
                       "additive_attention(q, k, v, W_q, W_k, w, mask=None)")] if masked else []
        result = call(fn, case, tried, "(output, weights)", _constructs(*case), takes_mask, tensor=False)
        out, weights = kit.unpack(result, ("output", "weights"), tried=tried)
        exp_out, exp_w = _additive(*case)
        tol = dict(atol=1e-6, rtol=1e-5) if case[0].dtype == torch.float64 else dict(atol=3e-5, rtol=1e-3)
        if same(out, exp_w, **tol) and same(weights, exp_out, **tol) and not same(out, exp_out, **tol):
            fail("returned (weights, output), not (output, weights)", tried=tried,
                 got="the right weights first, then the right output", expected="(output, weights)",
                 cause="you returned the two in the other order", fix="end with `return output, weights`")
        for given, what in ((exp_w, "the right weights"), (case[2], "v itself")):
            if tuple(out.shape) != tuple(exp_out.shape) and same(out, given.to(out.dtype), atol=1e-4, rtol=1e-3):
                fail(f"the output is {what}", tried=tried, got=f"an output of shape {tuple(out.shape)}: {what}",
                     expected=f"shape {tuple(exp_out.shape)}: weights @ v", cause=f"your output equals {what}: "
                     "`weights @ v` was never taken", fix="return weights @ v as the output")
        try:
            on_w.expect(weights, exp_w, case, tried=tried, what="the weights", fix=_ADD_FIX, **tol)
        except Failure as failure:  # finite weights whose rows do not sum to 1: no softmax over the keys
            sums = weights.double().sum(-1)
            if failure.diagnosis.cause or tuple(weights.shape) != tuple(exp_w.shape) or \
                    not bool(torch.isfinite(weights).all()) or bool(((sums - 1).abs() < 1e-3).all()):
                raise
            fail_again(failure, "the weights' rows do not sum to 1", f"your rows sum to {fmt(float(sums.min()))} … "
                   f"{fmt(float(sums.max()))}: no softmax over the keys (a missing division, or another axis)",
                   "weights = torch.softmax(scores, dim=-1) (blocked scores filled with -inf first)")
        on_out.expect(out, exp_out, case, tried=tried, what="the output", fix=_ADD_FIX, **tol)
        for got, what in ((out, "the output"), (weights, "the weights")):
            kit.lower_precision(got, case[0].dtype, tried=tried, what=what, grid=False)
            if got.is_floating_point() and got.dtype.itemsize > case[0].dtype.itemsize:
                kind, given = str(got.dtype)[6:], str(case[0].dtype)[6:]
                fail(f"{what} in {kind}, not q's {given}", tried=tried, got=f"{what} in {kind}",
                     expected=f"{given}, q's dtype, as the docstring says", cause=f"your computation converted to "
                     f"{kind} (.double(), dtype={kind}, or a {kind} tensor of your own) and did not convert back",
                     fix="compute in q's dtype, or convert the results back with .to(q.dtype)")
    kit.expect_unchanged(fn, cases[1][1], call="additive_attention(q, k, v, W_q, W_k, w, mask)", name="q",
                         others=("k", "v", "W_q", "W_k", "w", "mask"), shown=f"{cases[1][0]}, float64")
    return (f"matches wᵀ tanh(W_q q + W_k k) attention on {len(cases)} cases (batched, masks, n_q = 1, square "
            "weights, large scores)")
