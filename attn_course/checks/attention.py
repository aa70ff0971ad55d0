"""Checks for notebook 05: scaled dot-product attention and the size of its score matrix.

``attention`` — 12 cases (the worked example, batches, heads, masks of five shapes, one query, one key, scores of
±1000 and ±3·10⁴); oracle ``F.scaled_dot_product_attention`` (the weights: its output with V = I). The weights, then
the output, are judged by a :class:`~.kit.Suspects` over their table of known mistakes; an exception is explained by
a construct that raises the very same message; a wrong answer no mistake reproduces is measured (randomness, a
narrower dtype, NaN from overflow or underflow, weight on blocked keys, rounding, row sums, the scale really used).

``score_matrix_bytes`` — every case runs first; a wrong formula is named only when it fits them all, else the
bytes per entry or a constant factor are measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from . import kit
from .compare import Failure, same
from .core import Learner, LearnerRaised, as_tensor, check, fail, fmt, learner_error
from .kit import BOOL_HINT, Known, Suspects, explain_raise, reproduce

__all__ = ["check_attention", "check_score_matrix_bytes"]


# ============================================================================ cases and oracle
@dataclass
class Case:
    name: str
    Q: torch.Tensor
    K: torch.Tensor
    V: torch.Tensor
    mask: torch.Tensor | None
    atol: float
    large: bool = False  # scores so large that only a stable, -inf-masked softmax gets them right

    @property
    def args(self) -> tuple:
        return self.Q, self.K, self.V, self.mask

    @property
    def scaled(self) -> torch.Tensor:
        return _scaled(self.Q, self.K)

    @property
    def allowed(self) -> torch.Tensor:  # (..., n_q, n_k): True where query i may attend to key j
        return torch.broadcast_to(torch.tensor(True) if self.mask is None else self.mask, self.scaled.shape)


def _oracle(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    Q, K, V, mask = case.args
    eye = torch.eye(K.shape[-2], dtype=Q.dtype).expand(*K.shape[:-2], K.shape[-2], K.shape[-2])
    return (F.scaled_dot_product_attention(Q, K, V, attn_mask=mask),
            F.scaled_dot_product_attention(Q, K, eye, attn_mask=mask))


def _large(wanted: list[list[float]], keep: list[list[bool]], V: torch.Tensor, name: str, large: bool) -> Case:
    """A case whose scaled scores are exactly ``wanted`` (K = I, so Q Kᵀ / √d_k = Q / 2 with d_k = 4)."""
    return Case(name, 2 * torch.tensor(wanted, dtype=torch.float64), torch.eye(4, dtype=torch.float64), V,
                torch.tensor(keep), atol=1e-7, large=large)


def _cases() -> list[Case]:
    from ..dot import worked_example

    g = torch.Generator().manual_seed(5)

    def rand(*shape, dtype=torch.float64):
        return torch.randn(*shape, generator=g, dtype=dtype)

    Q, K, V = worked_example()
    f32, causal4 = torch.float32, torch.ones(4, 4, dtype=torch.bool).tril()
    keep = torch.rand(4, 6, generator=g) < 0.5  # (4, 6) with at least one True and one False in every row
    for i in range(4):
        j, k = torch.randperm(6, generator=g)[:2].tolist()
        keep[i, j], keep[i, k] = True, False
    key_padding = torch.tensor([[True, True, True, False, False], [False, False, True, True, True],
                                [True] * 5])[:, None, None, :]  # (3, 1, 1, 5): right, left and no padding
    per_batch = causal4 & (torch.arange(4) < torch.tensor([4, 2])[:, None])[:, None, None, :]  # (2, 1, 4, 4)
    return [
        Case("the 4×8 worked example, no mask", Q, K, V, None, atol=1e-7),
        Case("the 4×8 worked example with a causal (4, 4) mask", Q, K, V, causal4, atol=1e-7),
        Case("a batch of 2 in float32, n_q = 5, n_k = 7, d_k = 6, d_v = 3",
             rand(2, 5, 6, dtype=f32), rand(2, 7, 6, dtype=f32), rand(2, 7, 3, dtype=f32), None, atol=2e-5),
        Case("batch × heads (2, 3), n_q = 4, n_k = 6, d_k = 16, d_v = 5, with a (4, 6) mask",
             rand(2, 3, 4, 16), rand(2, 3, 6, 16), rand(2, 3, 6, 5), keep, atol=1e-7),
        Case("a causal (6, 6) mask on a batch of 2", rand(2, 6, 8), rand(2, 6, 8), rand(2, 6, 8),
             torch.ones(6, 6, dtype=torch.bool).tril(), atol=1e-7),
        Case("a key-padding mask (3, 1, 1, 5) (right, left and no padding) over 4 heads and 3 queries",
             rand(3, 4, 3, 8), rand(3, 4, 5, 8), rand(3, 4, 5, 2), key_padding, atol=1e-7),
        Case("a (2, 1, 4, 4) causal-and-padding mask over 2 heads", rand(2, 2, 4, 3), rand(2, 2, 4, 3),
             rand(2, 2, 4, 6), per_batch, atol=1e-7),
        Case("a 1-D mask (5,) for every query of a batch of 2", rand(2, 3, 4), rand(2, 5, 4), rand(2, 5, 4),
             torch.tensor([True, False, True, False, True]), atol=1e-7),
        Case("one query (batch 1, 1 head, n_q = 1, d_v = 1) in float32 with a (1, 6) mask",
             rand(1, 1, 1, 8, dtype=f32), rand(1, 1, 6, 8, dtype=f32), rand(1, 1, 6, 1, dtype=f32),
             torch.tensor([[True, True, False, True, False, True]]), atol=2e-5),
        Case("a single key (n_k = 1)", rand(3, 4), rand(1, 4), rand(1, 2), None, atol=1e-7),
        # Kept scores near +1000: e^1000 overflows; the last row, 2000 below, underflows under a global maximum.
        _large([[1000.0, 990.0, 1003.0, -50.0], [-40.0, 1002.0, 995.0, 1001.0], [-999.0, -1000.0, -1000.5, -998.0]],
               [[True, False, True, False], [False, True, False, True], [True, True, True, True]],
               rand(4, 3), "large scores (about ±1000) with a mask", large=False),
        # Kept scores near -20000, blocked ones up to +30000: a finite fill weaker than about -1e5 leaks, and a
        # softmax over all keys gives the kept ones weight 0 (0/0 when renormalised).
        _large([[-20000.0, 30000.0, -20001.5, 0.0], [30000.0, -20000.7, -5000.0, -20000.0],
                [-20002.0, -20000.0, 30000.0, -5000.0]],
               [[True, False, True, False], [False, True, False, True], [True, True, False, False]],
               rand(4, 3), "large scores (±3·10⁴) with a mask", large=True),
    ]


# ============================================================================ the weights' known mistakes
def _scaled(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    return Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])


def _fill(s: torch.Tensor, mask: torch.Tensor | None, value: float = -math.inf) -> torch.Tensor:
    return s if mask is None else s.masked_fill(~mask, value)


def _soft(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return torch.softmax(s, dim)


def _naive(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)


def _right(Q, K, mask):
    return _soft(_fill(_scaled(Q, K), mask))


_DIM_FIX = "take the softmax over the last axis, torch.softmax(scores, dim=-1): each query's row sums to 1"
_QUERIES = "you took the softmax over the queries' axis (axis -2): each column sums to 1, not each row"
_SCALE_FIX = "scale by √d_k, the width of Q and K, counted from the end: Q.shape[-1]"
_INF_FIX = "fill the blocked scores with float('-inf') before the softmax"
_MASK_FIX = "scores.masked_fill(~mask, float('-inf'))"
_AFTER = ("mask applied after the softmax", "you masked the weights after the softmax, so the rows no longer sum to 1",
          "fill the blocked *scores* with float('-inf') before the softmax")
_POLARITY = ("mask polarity inverted", "you blocked where the mask is True; here (as in F.scaled_dot_product_attention)"
             " True means 'may attend'", f"fill the scores where the mask is False: {_MASK_FIX}")
_WEAK = ("a fill value too weak for these scores", "you filled blocked scores with a finite negative number: next to "
         "scores of ±3·10⁴ it is not 'minus infinity', so blocked keys still get weight",
         "fill with float('-inf') (or torch.finfo(scores.dtype).min)")
_NAIVE = ("softmax without subtracting the maximum", "your softmax exponentiates the raw scores: e^1000 overflows to "
          "inf and inf/inf is NaN", "subtract each row's maximum before exp, or use torch.softmax")
_ADDED = ("bool mask added to the scores", f"fill the blocked scores with -inf: {_MASK_FIX}")
_FILLS = (-1e4, -1e3, -1e5, -1e2)
_NOKEEPDIM = "without keepdim=True: shape (..., n_q) lines up with the keys' axis, so"


def _mistakes_of_weights(cases: list[Case]) -> list[Known]:
    """The weights' table: each ``make`` takes (Q, K, V, mask), as the oracle does."""
    def scale(key, summary, cause, fix, by):  # softmax(Q Kᵀ / by(Q, K, V)), masked
        return Known(key, summary, cause, fix, lambda Q, K, V, m: _soft(_fill(Q @ K.mT / by(Q, K, V), m)))

    def scaled(key, summary, cause, fix, then):  # then(masked scaled scores, Q, K, mask)
        return Known(key, summary, cause, fix, lambda Q, K, V, m: then(_fill(_scaled(Q, K), m), Q, K, m))

    def raw(key, summary, cause, fix, then):  # then(scaled scores before any mask, mask)
        return Known(key, summary, cause, fix, lambda Q, K, V, m: then(_scaled(Q, K), m))

    return [
        # softmax(dim=-2), or softmax(dim=d) written for input of d + 1 axes: on n-D input it takes the queries'
        # axis (d = n - 2: the same text, so that two ways to one mistake are named once) or a batch axis
        scaled("dim-2", "softmax over axis -2 (the queries)", _QUERIES, _DIM_FIX, lambda s, *_: _soft(s, -2)),
        *[scaled(f"dim{d}-{n}D", "softmax over axis -2 (the queries)" if d == n - 2 else f"softmax over axis {d} (a "
                 "batch axis)", _QUERIES if d == n - 2 else f"you took the softmax over axis {d}, a batch axis of this "
                 "input", _DIM_FIX, lambda s, *_, d=d, n=n: _soft(s, d) if s.dim() in (n, d + 1) else None)
          for n in (2, 3, 4) for d in range(n - 1)],
        scaled("flat", "softmax over the whole matrix", "you took one softmax over the whole (n_q, n_k) matrix",
               _DIM_FIX, lambda s, *_: _soft(s.flatten(-2)).reshape(s.shape)),
        scale("noscale", "scores not scaled", "you did not divide the scores by √d_k", "divide Q Kᵀ by "
              "math.sqrt(d_k) before the softmax, with d_k = Q.shape[-1]", lambda Q, K, V: 1.0),
        scale("dk", "divided by d_k instead of √d_k", "you divided the scores by d_k", "divide by math.sqrt(d_k)",
              lambda Q, K, V: Q.shape[-1]),
        scale("times", "multiplied by √d_k", "you multiplied the scores by √d_k", "divide by math.sqrt(d_k) instead",
              lambda Q, K, V: Q.shape[-1] ** -0.5),
        # d_k taken from another size, by meaning or counted from the front (= d_k only on input of i + 2 axes)
        *[scale(key, f"scaled by √{key} instead of √d_k", f"you scaled by the square root of {key}, {what}",
                _SCALE_FIX, by) for key, what, by in (
            ("d_v", "the width of V (V.shape[-1])", lambda Q, K, V: math.sqrt(V.shape[-1])),
            ("n_q", "the number of queries (Q.shape[-2])", lambda Q, K, V: math.sqrt(Q.shape[-2])),
            ("n_k", "the number of keys (K.shape[-2])", lambda Q, K, V: math.sqrt(K.shape[-2])))],
        *[scale(f"front{i}", f"scaled by √Q.shape[{i}] instead of √d_k", f"you scaled by the square root of "
                f"Q.shape[{i}]{' (or len(Q), len(K))' if i == 0 else ''}, an axis counted from the front: it is d_k "
                f"only on {i + 2}-D input", _SCALE_FIX, lambda Q, K, V, i=i: math.sqrt(Q.shape[i])) for i in range(3)],
        Known("no-Q", "Q left out of the scores", "your scores are Kᵀ / √d_k: Q is missing from Q Kᵀ", "scores = "
              "Q @ K.mT / math.sqrt(d_k)", lambda Q, K, V, m: _soft(_fill(K.mT / math.sqrt(Q.shape[-1]), m))),
        Known("transposed", "weights transposed", "you returned the weights with queries and keys swapped",
              "keep weights[..., i, j] = how much query i attends to key j", lambda Q, K, V, m: _right(Q, K, m).mT),
        Known("reshape", "K reshaped instead of transposed", "reshape or view keeps K's numbers in memory order: it "
              "does not swap rows and columns", "transpose: K.transpose(-2, -1) (or K.mT)", lambda Q, K, V, m: _soft(
                  _fill(Q @ K.reshape(*K.shape[:-2], K.shape[-1], K.shape[-2]) / math.sqrt(Q.shape[-1]), m))),
        scaled("sigmoid", "sigmoid instead of softmax", "torch.sigmoid treats each score on its own, so a row's "
               "weights do not share one total", "use torch.softmax(scores, dim=-1)", lambda s, *_: torch.sigmoid(s)),
        *[Known(f"scores{fill}", "scores returned as weights", "you returned the scores from before the softmax",
                "return weights = torch.softmax(scaled scores, dim=-1)",
                lambda Q, K, V, m, fill=fill: _fill(_scaled(Q, K), m, fill)) for fill in (-math.inf, 0.0)],
        scaled("naive", *_NAIVE, lambda s, *_: _naive(s)),
        scaled("log", "log-softmax instead of softmax", "you returned log-weights (log_softmax), which are ≤ 0",
               "use torch.softmax", lambda s, *_: torch.log_softmax(s, -1)),
        scaled("nokeepdim-max", "row maximum subtracted without keepdim", f"you subtracted scores.max(-1).values "
               f"{_NOKEEPDIM} each column, not each row, was shifted", "keep the axis: scores.amax(dim=-1, "
               "keepdim=True)", lambda s, *_: _naive(s - s.amax(-1).unsqueeze(-2))),
        scaled("nokeepdim-sum", "row sum taken without keepdim", f"you divided by e.sum(-1) {_NOKEEPDIM} entry (i, j) "
               "was divided by row j's sum", "keep the axis: e.sum(dim=-1, keepdim=True)",
               lambda s, *_: (e := torch.exp(s - s.amax(-1, keepdim=True))) / e.sum(-1).unsqueeze(-2)),
        scaled("sum-all", "normalised by the sum of every entry", "you divided by e.sum() over the whole tensor, not "
               "by each row's sum", "divide by e.sum(dim=-1, keepdim=True)",
               lambda s, *_: (e := torch.exp(s)) / e.sum()),
        Known("scale-after", "scaled after the softmax", "you divided the weights by √d_k instead of the scores",
              "divide Q Kᵀ by math.sqrt(d_k), then take the softmax", lambda Q, K, V, m: _soft(_fill(Q @ K.mT, m))
              / math.sqrt(Q.shape[-1])),
        scaled("globalmax", "maximum over the whole tensor", "you subtracted the whole tensor's maximum, not each "
               "row's: a row far below it underflows to 0 and 0/0 is NaN", "subtract each row's maximum: "
               "scores.amax(dim=-1, keepdim=True)", lambda s, *_: _naive(s - s.max())),
        raw("causal-always", "a causal mask although none was given", "with mask=None your function still blocked "
            "the later keys (j > i)", "block keys only where the mask argument says so", lambda s, m: None if m is not
            None else _soft(s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf))),
        # -------- the mask (each make raises, so is no suspect, where mask is None)
        raw("mask-T", "mask transposed", "you applied the mask with its last two axes swapped (mask.T): mask[..., i, "
            "j] says whether query i may attend to key j", f"use the mask as it is: {_MASK_FIX}",
            lambda s, m: _soft(_fill(s, m.mT)) if m.dim() >= 2 else None),
        raw("ignored", "mask ignored", "you did not use the mask, so blocked keys still get weight", _INF_FIX,
            lambda s, m: _soft(s) if m is not None else None),
        *[raw(f"ignored-{shape}", f"mask of shape {shape} ignored", "your code applies the mask only for some shapes "
              "(an `if` on its shape, or a reshape)", f"apply any mask that broadcasts: {_MASK_FIX} broadcasts by "
              "itself", lambda s, m, shape=shape: _soft(s if tuple(m.shape) == shape else _fill(s, m)))
          for shape in dict.fromkeys(tuple(c.mask.shape) for c in cases if c.mask is not None)],
        raw("plus-inverted", _ADDED[0], "you added a 0/1 version of the mask to the scores: adding 1 shifts scores a "
            "little and blocks nothing", _ADDED[1], lambda s, m: _soft(s + (~m).to(s.dtype))),
        raw("plus", _ADDED[0], "you added the boolean mask to the scores: True counts as +1, which blocks nothing",
            _ADDED[1], lambda s, m: _soft(s + m.to(s.dtype))),
        raw("after*", *_AFTER, lambda s, m: _soft(s) * m),
        raw("after-inf", *_AFTER, lambda s, m: _soft(s).masked_fill(~m, -math.inf)),
        raw("renorm", "mask applied after the softmax, then renormalised", "you zeroed the blocked weights of a "
            "softmax over all keys, then divided by the row sums: next to far larger blocked scores the allowed "
            "weights underflow to 0, and 0/0 = NaN", _INF_FIX,
            lambda s, m: (w := _soft(s) * m) / w.sum(-1, keepdim=True)),
        *[raw(f"polarity{fill}", *_POLARITY, lambda s, m, fill=fill: _soft(s.masked_fill(m, fill)))
          for fill in (-math.inf, -1e9)],
        raw("times-mask", "mask multiplied into the scores", "you multiplied the scores by the mask: a blocked score "
            "becomes 0, not -inf, and e^0 = 1 still gives it weight", "fill the blocked scores with -inf "
            "(masked_fill or torch.where)", lambda s, m: _soft(s * m)),
        raw("nan-additive", "0 × (-inf) = NaN in an additive mask", "you built the additive mask as (~mask) * "
            "float('-inf'): 0 × (-inf) is NaN, so every row with an allowed key became NaN", "build it with "
            "masked_fill: torch.zeros_like(scores).masked_fill(~mask, float('-inf'))",
            lambda s, m: _soft(s + (~m).to(s.dtype) * -math.inf)),
        # a finite fill: on the scaled scores, before the scaling, or added
        *[raw(f"weak{f}", *_WEAK, lambda s, m, f=f: _soft(_fill(s, m, f))) for f in _FILLS],
        *[Known(f"weak-pre{f}", *_WEAK, lambda Q, K, V, m, f=f: _soft(_fill(Q @ K.mT, m, f) / math.sqrt(Q.shape[-1])))
          for f in _FILLS],
        *[raw(f"weak+{f}", *_WEAK, lambda s, m, f=f: _soft(s + (~m).to(s.dtype) * f)) for f in _FILLS],
    ]


_OUT_FIX = "output = weights @ V"
_BEFORE = ("V multiplied before the softmax", "you multiplied by V before taking the softmax, so the output is a "
           "softmax over features", "take the softmax of the scaled scores first; then output = weights @ V")
_MISTAKES_OF_OUTPUT = [
    Known("before", *_BEFORE, lambda Q, K, V, m: _soft(_scaled(Q, K) @ V)),
    Known("before-masked", *_BEFORE, lambda Q, K, V, m: _soft(_fill(_scaled(Q, K), m) @ V)),
    Known("scores@V", "output from the raw scores", "you multiplied V by the scores, not by the weights",
          "output = weights @ V, with weights = softmax(…)", lambda Q, K, V, m: _scaled(Q, K) @ V),
    Known("wT@V", "output from transposed weights", "you multiplied V by the transposed weights", _OUT_FIX,
          lambda Q, K, V, m: _right(Q, K, m).mT @ V),
    Known("w@K", "output from K instead of V", "you multiplied the weights by K, not by V", _OUT_FIX,
          lambda Q, K, V, m: _right(Q, K, m) @ K),
    Known("V", "V returned as the output", "you returned V itself, not weights @ V", _OUT_FIX, lambda Q, K, V, m: V),
    Known("w", "weights returned as the output", "you returned the weights where the output belongs", _OUT_FIX,
          lambda Q, K, V, m: _right(Q, K, m)),
    Known("unmasked@V", "output from the unmasked weights", "you computed the output from the weights before the "
          "mask", "compute the output from the masked weights you return: output = weights @ V",
          lambda Q, K, V, m: _soft(_scaled(Q, K)) @ V if m is not None else None),
]


# ============================================================================ exceptions
def _constructs(case: Case) -> list[tuple[str, str, Callable[[], object]]]:
    """Wrong constructs, run on ``case``: (cause, fix, attempt)."""
    Q, K, V, mask = case.args
    s, w = case.scaled, _soft(case.scaled)
    rev = lambda t: t.permute(*reversed(range(t.dim())))  # noqa: E731 - what .T does
    last_two, lost = "transpose only the last two axes: K.transpose(-2, -1)", "without keepdim=True: shape (…, n_q)"
    front = ("K.transpose(1, 2) counts axes from the front: on input with fewer axes there is no axis 2",
             "count from the end: K.transpose(-2, -1)")
    out = [("on batched input, K.T reverses every axis (the batch axes too)", f"{last_two} (or K.mT)", a)
           for a in [lambda: torch.matmul(Q, rev(K))] + [
               lambda i=(0,) * i: Q[i] @ rev(K[i]) for i in range(min(Q.dim(), K.dim()) - 1)]]
    out += [(cause, f"use the @ operator (torch.matmul), which handles {many}leading batch axes",
             lambda op=op, a=a, b=b: op(a, b))
            for op, cause, many in ((torch.mm, "torch.mm multiplies 2-D matrices only", ""),
                                    (torch.bmm, "torch.bmm needs exactly 3-D tensors", "any number of "))
            for a, b in ((Q, K.mT), (w, V))]
    out += [("K.t() works on 2-D matrices only", last_two, lambda: K.t()),
            (*front, lambda: K.transpose(1, 2)), (*front, lambda: K.permute(0, 2, 1)),
            ("K.transpose(0, 1) swaps the first two axes, which on batched input are not the keys and features",
             last_two, lambda: Q @ K.transpose(0, 1)),
            ("you multiplied the weights by Vᵀ instead of V", "output = weights @ V: (…, n_q, n_k) @ (…, n_k, d_v)",
             lambda: w @ V.mT),
            (f"you subtracted scores.max(-1).values {lost} does not line up with the rows",
             "keep the axis: scores.amax(dim=-1, keepdim=True)", lambda: s - s.max(-1).values),
            (f"you divided by e.sum(-1) {lost} does not line up with the rows",
             "keep the axis: e.sum(dim=-1, keepdim=True)", lambda: w / w.sum(-1))]
    if mask is not None:
        last = ("you added an axis at the end of the mask (mask[..., None] or mask.unsqueeze(-1)): its keys line up "
                "with the scores' queries", "use the mask as it is: it already broadcasts to (…, n_q, n_k)")
        out += [(*last, lambda: s.masked_fill(~mask[..., None], -math.inf)),
                (*last, lambda: torch.where(mask[..., None], s, -math.inf)),
                ("indexing with a boolean mask (scores[~mask] = …) needs the scores' full shape: it does not broadcast",
                 f"use {_MASK_FIX} or torch.where, which broadcast", lambda: s.clone().__setitem__(~mask, -math.inf))]
    return out


_PATTERNS = [("RuntimeError", "Boolean value of Tensor", BOOL_HINT["cause"], BOOL_HINT["fix"]),
             ("TypeError", r"bad operand type for unary ~: 'NoneType'", "you applied ~ to None: the name you negated "
              "holds None, not the mask", "negate the mask argument itself, inside `if mask is not None:`: ~mask")]
_NO_MASK_ARGUMENT = ("TypeError", "positional argument", "your function does not take the mask as its fourth argument",
                     "keep the signature attention(Q, K, V, mask=None)")


# ============================================================================ check_attention
def _call(fn: Learner, case: Case, tried: str) -> tuple[object, list[str]]:
    """The learner's result on ``case`` and the names of the arguments it changed in place."""
    args = case.args if case.mask is not None else case.args[:3]
    try:
        result = fn.observe(kit.CALL, *args)
    except LearnerRaised as exc:  # a construct is named only when it alone raises the very same message
        constructs = [c for c in _constructs(case) if reproduce(c[2]) == exc.message]
        hint = explain_raise(exc, constructs if len({c[0] for c in constructs}) == 1 else (),
                             _PATTERNS + ([_NO_MASK_ARGUMENT] if case.mask is not None else []))
        raise Failure(learner_error(exc, tried=tried, expected="(output, weights)", **hint)) from None
    value, changed = result if isinstance(result, tuple) and len(result) == 2 else (result, [])
    return value, [("Q", "K", "V", "mask")[int(i)] for i in changed if 0 <= int(i) < len(args)]


def _again(fn: Learner, which: int) -> Callable[..., torch.Tensor]:
    """The learner's function as the engine calls it on another case: the output (0) or the weights (1)."""
    def call(Q, K, V, mask):
        result = fn(Q, K, V) if mask is None else fn(Q, K, V, mask)
        return as_tensor(result[which], tried="", what="")
    return call


@check("attention", expects="a function attention(Q, K, V, mask=None) returning (output, weights)")
def check_attention(fn: Learner) -> str:
    cases = _cases()
    weights = Suspects(_mistakes_of_weights(cases), atol=2e-5, rtol=1e-5)
    outputs = Suspects(_MISTAKES_OF_OUTPUT, atol=2e-5, rtol=1e-5)
    every, passed_dks = [c.args for c in cases], set()
    for case in cases:
        tried = f"attention(Q, K, V{', mask' if case.mask is not None else ''}) on {case.name}"
        result, changed = _call(fn, case, tried)
        out, w = kit.unpack(result, ("output", "weights"), tried=tried)
        exp_out, exp_w = _oracle(case)
        if out.shape == exp_w.shape and w.shape == exp_out.shape and exp_w.shape != exp_out.shape:
            fail("output and weights swapped", tried=tried, got="(weights, output)", expected="(output, weights)",
                 fix="return output first, then weights")
        _squeezed(w, exp_w.shape, tried, "the weights")
        _mask_axis_added(w, case, tried)
        try:
            weights.expect(w, exp_w, case.args, tried=tried, again=_again(fn, 1), distinguish=every,
                           what="the weights", atol=case.atol,
                           fix="the weights have one row per query, one column per key: (..., n_q, n_k)")
        except Failure as failure:
            if not failure.diagnosis.cause:
                _random(fn, case, tried, w)
                kit.lower_precision(w, case.Q.dtype, tried=tried, what="the weights")
                _structure(w, case, tried, passed_dks)
            raise
        _squeezed(out, exp_out.shape, tried, "the output")
        d_k = case.Q.shape[-1]
        try:
            outputs.expect(out, exp_out, case.args, tried=tried, again=_again(fn, 0), distinguish=every,
                           what="the output", atol=case.atol, factors={"√d_k": math.sqrt(d_k), "d_k": float(d_k)},
                           fix="the output is weights @ V: (..., n_q, d_v)")
        except Failure as failure:
            if not failure.diagnosis.cause:
                kit.lower_precision(out, case.Q.dtype, tried=tried, what="the output")
            raise
        if changed:
            names = " and ".join(changed)
            fail(f"changed {names} in place", tried=tried, got=f"right results, but the call changed {names}",
                 expected="the arguments left as they were", cause=f"an in-place operation on {names} (/=, *=, +=, "
                 "a method ending in _ such as masked_fill_, an assignment into it) changes the caller's tensor too",
                 fix="compute new tensors: scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k); ~mask, not "
                     "mask.logical_not_()")
        passed_dks.add(d_k)
    shapes = {tuple(c.mask.shape) for c in cases if c.mask is not None}
    return (f"matches F.scaled_dot_product_attention on {len(cases)} cases (batched, n_q ≠ n_k, d_k ≠ d_v, "
            f"masks of {len(shapes)} shapes, large scores)")


# ============================================================================ shapes and randomness
def _squeezed(t: torch.Tensor, shape: torch.Size, tried: str, what: str) -> None:
    """Fail, naming squeeze, when ``t`` is the expected shape with its size-1 axes dropped."""
    shape = tuple(shape)
    if tuple(t.shape) != shape and 1 in shape and tuple(t.shape) == tuple(s for s in shape if s != 1):
        fail(f"size-1 axes dropped from {what}", tried=tried, got=f"{what} of shape {tuple(t.shape)}",
             expected=f"shape {shape}", cause="you squeezed the tensor (.squeeze() drops every axis of size 1, "
             "here the batch, heads or queries axis)", fix="leave out .squeeze(); keep every axis the inputs have")


def _mask_axis_added(w: torch.Tensor, case: Case, tried: str) -> None:
    """Fail, naming it, when the weights have the shape the scores broadcast to with an axis added to the mask."""
    want = tuple(case.scaled.shape)
    for i in range(case.mask.dim() + 1) if case.mask is not None and tuple(w.shape) != want else ():
        try:
            shape = tuple(torch.broadcast_shapes(want, case.mask.unsqueeze(i).shape))
        except RuntimeError:
            continue
        if shape == tuple(w.shape):
            fail(f"weights of shape {shape}: the mask got an extra axis", tried=tried, got=f"the weights of shape "
                 f"{shape}", expected=f"shape {want}", cause=f"you added an axis to the mask {tuple(case.mask.shape)} "
                 f"(mask.unsqueeze({i}) or a None index): broadcast against the scores {want}, it made them bigger",
                 fix="use the mask as it is: any mask that broadcasts to (…, n_q, n_k) works unchanged")


def _random(fn: Learner, case: Case, tried: str, first: torch.Tensor, calls: int = 3) -> None:
    """Fail when one of ``calls`` more calls gives other weights (dropout with a small p may keep all once)."""
    for _ in range(calls):
        w = kit.unpack(_call(fn, case, tried)[0], ("output", "weights"), tried=tried)[1]
        if tuple(w.shape) == tuple(first.shape) and not same(w, first, atol=0.0, rtol=0.0):
            fail("different results for the same input", tried=tried + ", more than once", got="calls with the same "
                 "Q, K, V and mask gave different weights", expected="the same weights every time (attention is "
                 "deterministic)", cause="dropout in training mode (F.dropout's default training=True, or an "
                 "nn.Dropout module) zeroes random weights and scales the rest up", fix=_NO_DROPOUT)


# ========================================================================= the weights, when no mistake matches
_NO_DROPOUT = "leave dropout out of this function (or pass training=False)"
_FINITE = "finite weights, every row summing to 1"


def _effective_scale(w: torch.Tensor, case: Case) -> float | None:
    """The c for which the weights equal softmax(Q Kᵀ / c) on the allowed keys, if one c fits every row."""
    scores = (case.Q @ case.K.mT).to(torch.float64)
    allowed = case.allowed
    if tuple(w.shape) != tuple(scores.shape) or not (w[allowed] > 0).all():
        return None
    logw = torch.where(allowed, torch.log(w.clamp_min(1e-300)), 0.0)
    # Centre log-weights and scores over each row's allowed keys; then logw = scores / c on every row.
    count = allowed.sum(-1, keepdim=True).clamp_min(1)
    x = torch.where(allowed, scores - (scores * allowed).sum(-1, keepdim=True) / count, 0.0)
    y = torch.where(allowed, logw - (logw * allowed).sum(-1, keepdim=True) / count, 0.0)
    slope = float((x * y).sum() / (x * x).sum()) if float((x * x).sum()) >= 1e-12 else 0.0
    return 1 / slope if abs(slope) >= 1e-9 and torch.allclose(y, slope * x, atol=1e-4, rtol=1e-3) else None


def _structure(w: torch.Tensor, case: Case, tried: str, passed_dks: set[int]) -> None:
    """When no known mistake reproduces the weights, say which property of them is off."""
    w, scaled, allowed = w.to(torch.float64), case.scaled, case.allowed
    if torch.isnan(w).any() and w.shape == scaled.shape:
        nan_rows = torch.isnan(w).any(-1)  # (..., n_q)
        where = f"NaN in {int(nan_rows.sum())} of {nan_rows.numel()} rows"
        if torch.equal(nan_rows, torch.isinf(torch.exp(scaled.masked_fill(~allowed, -math.inf))).any(-1)):
            fail("NaN where exp overflowed", tried=tried, got=f"{where}: exactly the rows with an allowed score above "
                 f"{fmt(math.log(torch.finfo(scaled.dtype).max))}, where e^score is inf", expected=_FINITE,
                 cause=_NAIVE[1], fix=_NAIVE[2])
        if torch.equal(nan_rows, (_soft(scaled) * allowed).sum(-1) == 0):
            fail("NaN where the allowed weights underflow", tried=tried, got=f"{where}: exactly the rows where a "
                 "softmax over all keys gives every allowed key weight 0", expected=_FINITE, cause="blocked keys took "
                 "part in a softmax before being removed: the allowed weights underflowed to 0, then 0/0",
                 fix=_INF_FIX)
        fail("NaN in the weights", tried=tried, got=where, expected=_FINITE,
             fix="print your intermediate tensors on this input: which step first holds NaN?")
    if w.shape != scaled.shape:
        return
    if (w < -1e-12).any() or (w > 1 + 1e-9).any():
        fail("weights outside [0, 1]", tried=tried, got=f"weights from {fmt(float(w.min()))} to {fmt(float(w.max()))}",
             expected="weights between 0 and 1 (a softmax)", fix="the weights are torch.softmax(scaled scores, dim=-1)")
    exp_w = _oracle(case)[1].to(torch.float64)
    if (decimals := _rounded_to(w)) and not _rounded_to(exp_w):
        fail(f"weights rounded to {decimals} decimal{'s' if decimals > 1 else ''}", tried=tried,
             got=f"every weight is a multiple of {10.0 ** -decimals:g}", expected="the weights at full precision",
             cause=f"you rounded the weights (round, or a conversion through printed text) to {decimals} decimals",
             fix="round only what you print, never the values you return")
    leak = float(w[~allowed].abs().max()) if (~allowed).any() else 0.0
    if leak > 1e-6:
        has_blocked = (~allowed).any(-1)  # (..., n_q)
        if torch.allclose((w * ~allowed).sum(-1)[has_blocked], torch.tensor(1.0, dtype=w.dtype), atol=1e-6):
            fail("all the weight on blocked keys", tried=tried, got="every row with a blocked key puts all its "
                 "weight on blocked keys", expected="weight 0 on every blocked key", cause="the mask acts the wrong "
                 "way round: blocked scores raised (a + sign, a fill of +inf or +1e9) or allowed ones lowered",
                 fix=f"lower the blocked scores: {_MASK_FIX}")
        # earlier mask cases passed: at these sizes only a finite fill explains a leak
        fail(_WEAK[0] if case.large else "weight on blocked keys", tried=tried, got=f"blocked keys receive weight "
             f"(up to {fmt(leak)})", expected="weight 0 on every key the mask blocks",
             cause=_WEAK[1] if case.large else "", fix=_WEAK[2] if case.large else _INF_FIX)
    kept = w.abs() > 1e-12
    if kept.any() and (~kept & (exp_w > 1e-6)).any():
        ratio = w[kept] / exp_w[kept].clamp_min(1e-300)
        if (c := float(ratio.mean())) > 1 + 1e-6 and torch.allclose(ratio, torch.full_like(ratio, c), rtol=1e-4):
            fail("weights randomly zeroed (dropout)", tried=tried, got=f"some weights are 0, the others {fmt(c)} × the "
                 "right ones", expected="the weights themselves", cause=f"dropout in training mode: it zeroes entries "
                 f"at random and multiplies the rest by {fmt(c)}", fix=_NO_DROPOUT)
    sums = w.sum(-1)
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-5):
        if torch.allclose(sums, torch.full_like(sums, c := float(sums.mean())), atol=1e-6) and c > 1e-9:
            p = 1 - 1 / c  # dropout with probability p scales the weights it keeps by 1 / (1 - p)
            dropout = c > 1 and abs(p * 20 - round(p * 20)) < 1e-3
            fail(f"every row sums to {fmt(c)}", tried=tried, got=f"every row of weights sums to {fmt(c)}",
                 expected="every row summing to 1", cause="the weights were multiplied by a constant after the "
                 "softmax" + (f" (dropout with p = {p:.2g} in training mode does that to the weights it keeps)"
                              if dropout else ""),
                 fix="return the softmax itself as the weights" + (", without dropout" if dropout else ""))
        fail("rows of weights do not sum to 1", tried=tried, got=f"rows summing to {fmt(float(sums.min()))} … "
             f"{fmt(float(sums.max()))}", expected="every row (one query) summing to 1 over the keys",
             fix="print the row sums after each step on this input: torch.softmax(scaled scores, dim=-1) sums to 1")
    c, d_k = _effective_scale(w, case), case.Q.shape[-1]
    if c is not None and abs(c - math.sqrt(d_k)) > 1e-3 * math.sqrt(d_k):
        k = round(c * c)
        fixed = c > 0 and abs(c * c - k) < 1e-3 * max(1, k) and k in passed_dks  # right earlier, where d_k was k
        cause = f"you divided the scores by {fmt(c)}" + (": a negative factor flips the scores' sign, so the least "
                                                         "similar key gets the most weight" if c < 0 else "")
        if fixed:
            cause = (f"you divided the scores by √{k}, right for an earlier input with d_k = {k} but not this one "
                     f"(d_k = {d_k}): a fixed number, or a variable from outside the function" +
                     (" (the notebook's worked example sets d_k = 8)" if k == 8 else ""))
        fail(f"scores divided by {f'√{k}' if fixed else fmt(c)} instead of √d_k = {fmt(math.sqrt(d_k))}", tried=tried,
             got=f"the weights of softmax(Q Kᵀ / {fmt(c)})", expected=f"softmax(Q Kᵀ / √d_k) with d_k = {d_k}",
             cause=cause, fix="divide Q Kᵀ by math.sqrt(Q.shape[-1]), computed inside the function")


def _rounded_to(t: torch.Tensor) -> int | None:
    """The number of decimals (1 to 4) every entry of ``t`` is rounded to, or None."""
    x = t[torch.isfinite(t)].to(torch.float64)
    return next((d for d in range(1, 5) if x.numel() >= 4 and torch.allclose(x * 10**d, (x * 10**d).round(), atol=1e-6,
                                                                              rtol=0)), None)


# ============================================================================ score matrix bytes
#: (n, batch, heads, dtype); None: the call leaves batch, heads and dtype at their defaults (1, 1, float32).
_BYTE_CASES = [(6, 1, 1, torch.float32), (10, 3, 5, torch.float16), (7, 3, 1, torch.float64), (5, 1, 2, torch.bfloat16),
               (4096, 1, 12, torch.float16), (1, 1, 1, torch.float32), (9, 6, 7, torch.float64), (11, None, None, None)]
_ELEMENT_FIX = "take the bytes per entry from the dtype: torch.empty((), dtype=dtype).element_size()"
_PLAIN, _E = "return the plain number of bytes", "the bytes per entry"
#: Wrong formulas of (n, batch, heads, bytes per entry e): (summary, cause, fix, formula).
_BYTE_MISTAKES = [
    ("bits, not bytes", f"you counted bits: {_E} times 8", "leave out the factor 8",
     lambda n, b, h, e: 8 * b * h * n * n * e),
    ("batch size missing", "you left out the batch size", "multiply by batch", lambda n, b, h, e: h * n * n * e),
    ("number of heads missing", "you left out the number of heads", "multiply by heads",
     lambda n, b, h, e: b * n * n * e),
    ("n instead of n × n", "you counted n entries per matrix, not n × n", "the score matrix is n × n: square n",
     lambda n, b, h, e: b * h * n * e),
    ("n³ instead of n²", "you multiplied by n once too often", "the score matrix has n × n entries",
     lambda n, b, h, e: b * h * n ** 3 * e),
    ("entries, not bytes", "you returned the number of entries", f"multiply by {_E}", lambda n, b, h, e: b * h * n * n),
    ("batch counted twice", "you multiplied by the batch size twice", "multiply by batch once",
     lambda n, b, h, e: b * b * h * n * n * e),
    ("heads counted twice", "you multiplied by the number of heads twice", "multiply by heads once",
     lambda n, b, h, e: b * h * h * n * n * e),
    *[(f"{k} bytes per entry assumed", f"you used {k} bytes per entry whatever the dtype", _ELEMENT_FIX,
       lambda n, b, h, e, k=k: b * h * n * n * k) for k in (2, 4, 8)],
    (f"divided by {_E}", f"you divided by {_E} instead of multiplying", f"multiply by {_E}",
     lambda n, b, h, e: b * h * n * n / e),
    ("n × n missing", "you left out the n × n entries of each matrix", "multiply by n * n",
     lambda n, b, h, e: b * h * e),
    ("batch and heads missing", "you counted one (n, n) matrix, not batch × heads of them",
     "multiply by batch and by heads", lambda n, b, h, e: n * n * e),
    ("2 × n instead of n × n", "you doubled n (n * 2) where the matrix has n × n entries (n ** 2)",
     "the score matrix is n × n: n * n or n ** 2", lambda n, b, h, e: b * h * 2 * n * e),
    ("only one triangle counted", "you counted n(n + 1)/2 entries, one triangle with its diagonal; the score tensor "
     "holds all n × n entries, masked or not", "count every entry: n * n",
     lambda n, b, h, e: b * h * (n * (n + 1) // 2) * e),
    *[(f"bytes in {unit}, not bytes", f"you converted to {long} (÷ {shown})", _PLAIN,
       lambda n, b, h, e, d=d: b * h * n * n * e / d) for unit, long, shown, d in (
        ("GB", "gigabytes", "10⁹", 1e9), ("GiB", "gibibytes", "2³⁰", 2**30), ("MiB", "mebibytes", "2²⁰", 2**20),
        ("KiB", "kibibytes", "1024", 1024))],
    *[(f"bytes in {unit}, not bytes", f"you converted to {long} with //, which also rounds down", _PLAIN,
       lambda n, b, h, e, d=d: b * h * n * n * e // d) for unit, long, d in (("KiB", "kibibytes", 1024),
                                                                                ("MiB", "mebibytes", 2**20))],
]


def _bytes_of(fn: Learner, n: int, b: int | None, h: int | None, dtype: torch.dtype | None) -> tuple[str, Any, float]:
    """(tried, the learner's raw answer, as a float) for one case; a Failure for an exception or a non-number."""
    tried = (f"score_matrix_bytes({n}) with the defaults batch=1, heads=1, dtype=torch.float32" if dtype is None
             else f"score_matrix_bytes({n}, batch={b}, heads={h}, dtype={dtype})")
    try:
        raw = fn(n) if dtype is None else fn(n, batch=b, heads=h, dtype=dtype)
    except LearnerRaised as exc:
        table = exc.type_name == "KeyError" and "torch." in exc.message  # a dict of bytes per dtype, one missing
        extra = dict(cause=f"a table of bytes per dtype that has no entry for {exc.message.strip(chr(39))}",
                     fix=_ELEMENT_FIX + " (it knows every dtype)") if table else {}
        raise Failure(learner_error(exc, tried=tried, expected="a number of bytes (an int)", **extra)) from None
    got = as_tensor(raw, tried=tried, expected="a number of bytes (an int)")
    if got.numel() != 1:
        fail("returned a tensor, not one number", tried=tried, got=f"a tensor of shape {tuple(got.shape)}",
             expected="one number of bytes (an int)", fix="return an int, e.g. with .item() or plain arithmetic")
    return tried, raw, got.to(torch.float64).item()


@check("score_matrix_bytes",
       expects="a function score_matrix_bytes(n, batch=1, heads=1, dtype=torch.float32) returning a number of bytes")
def check_score_matrix_bytes(fn: Learner) -> str:
    runs = []  # (n, batch, heads, dtype, expected bytes, bytes per entry, (tried, raw, got) or the Failure)
    for n, b, h, dtype in _BYTE_CASES:  # every case first: a formula is named only when it fits them all
        bb, hh, dd = b or 1, h or 1, dtype or torch.float32
        # Oracle: the nbytes of a real (batch, heads, n, n) tensor on the meta device (nothing is allocated).
        row = (n, bb, hh, dd, torch.empty(bb, hh, n, n, dtype=dd, device="meta").nbytes, dd.itemsize, dtype)
        try:
            runs.append((*row, _bytes_of(fn, n, b, h, dtype)))
        except Failure as failure:  # reported after any wrong count on an earlier case
            runs.append((*row, failure))
            break
    counted = [r for r in runs if not isinstance(r[-1], Failure)]
    every = [m for m in _BYTE_MISTAKES if all(math.isclose(r[-1][2], m[3](*r[:3], r[5]), rel_tol=1e-9)
                                               for r in counted if r[6] is not None)]
    ratios = {round(r[-1][2] / r[4], 9) for r in counted}
    for n, b, h, dtype, expected, element, given, answer in runs:
        if isinstance(answer, Failure):
            raise answer
        tried, raw, got = answer
        if got == expected:
            _expect_int(raw, tried, expected)
            continue
        found = [m for m in every if m[3](n, b, h, element) != expected]
        summary, cause, fix = found[0][:3] if len(found) == 1 else (f"{got:.10g} bytes, expected {expected}", "", "")
        if not found:
            name, per_entry = str(dtype).replace("torch.", ""), got / (b * h * n * n)
            summary, cause, fix = (_bytes_ratio(got / expected) if len(ratios) == 1 else None) or (
                (f"{per_entry:g} bytes per {name} entry, not {element}", f"you counted {per_entry:g} bytes per entry "
                 f"for {name}, which takes {element}", _ELEMENT_FIX) if per_entry in (1, 2, 4, 8, 16) and
                per_entry != element else _bytes_ratio(got / expected)) or (summary, cause, fix)
        if given is None and not found:  # every case with explicit arguments passed: only the defaults differ
            summary, cause, fix = ("wrong default arguments", "with only n given, your function does not count "
                                   "batch=1, heads=1, dtype=torch.float32", "keep the defaults of the signature: "
                                   "score_matrix_bytes(n, batch=1, heads=1, dtype=torch.float32)")
        fail(summary, tried=tried, got=f"{got:.10g}", expected=f"{expected} bytes (batch × heads × n × n × bytes per "
             "entry)", cause=cause, fix=fix or "multiply batch × heads × n × n × the bytes of one entry")
    return f"exact on {len(_BYTE_CASES)} cases (float16, bfloat16, float32, float64; batch, heads, defaults)"


def _expect_int(raw, tried: str, expected: int) -> None:
    """The docstring asks for an int: a float (even a whole one) or a tensor is named as such."""
    if isinstance(raw, (int, np.integer)) and not isinstance(raw, (bool, np.bool_)):
        return
    kind = ("a float" if isinstance(raw, (float, np.floating)) else "a NumPy array" if isinstance(raw, np.ndarray)
            else f"a {type(raw).__name__}")
    if isinstance(raw, torch.Tensor):
        kind = f"{'an' if str(raw.dtype)[6] in 'aeiou' else 'a'} {str(raw.dtype)[6:]} tensor"
    fail(f"returned {kind}, not an int", tried=tried, got=f"{kind} equal to {expected}", expected=f"the int {expected}",
         cause="a / division, math.pow, math.sqrt or a float factor makes a float; a tensor stays a tensor"
         if kind == "a float" else "the count was computed with tensor operations, which return a tensor",
         fix="count with ints: // instead of /, ** instead of math.pow; .item() or int(…) for a one-number tensor")


def _bytes_ratio(ratio: float) -> tuple[str, str, str] | None:
    """A count off by the same whole-number factor on every case."""
    for r, many in ((ratio, True), (1 / ratio if ratio else 0, False)):
        if r > 1 and abs(r - round(r)) < 1e-9:
            k, whose = round(r), "the right one" if many else "smaller than the right one"
            return (f"{k} times {'too many' if many else 'too few'} bytes", f"your count is {k} times {whose}: your "
                    f"formula has a factor {k} {'too many' if many else 'missing'}", "")
    return None
