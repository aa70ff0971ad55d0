"""Checks for notebook 05: scaled dot-product attention and the size of its score matrix.

Oracle: ``F.scaled_dot_product_attention``. It does not return the weights, so the expected weights
are its output with the identity matrix as V (weights @ I = weights). Masks are boolean, True = may
attend (the course's convention, and PyTorch's for this function). As the exercise's docstring
states, every query is allowed at least one key here: fully masked rows are notebook 06's subject
(its ``masked_softmax`` exercise), so this check never tries one. Each call runs under notebook 01's
learner-side probe that reports arguments changed in place (the docstring rules that out).

How a wrong answer is named:

* a known mistake (:class:`Known`) is blamed only when the answer reproduces its output, and a
  mistake that an earlier, passed case already ruled out (its output differed from the right one
  there, while the answer's did not) is never blamed: two mistakes that coincide on one input are told
  apart by the cases before it (:class:`Elimination`, used by notebook 06's checks too), or by the
  cases after it (an ambiguous failure waits for a later case that names one of them);
* an exception is explained only when the check reproduces the very same message with the
  construct it blames (``K.T`` on a batch, ``torch.mm`` on 3-D input, a mask given an extra axis…);
* otherwise a property of the result is measured: a second call that differs (randomness), values on
  a narrower dtype's grid, NaN where exp overflowed or every allowed weight underflowed, all the weight
  on blocked keys, rounding, rows that do not sum to 1, or the scale the scores were really divided by.

``score_matrix_bytes`` runs every case first and blames a wrong formula only when it reproduces the
answer on all of them; otherwise it measures the bytes per entry or a constant factor.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .compare import Failure, same
from .core import Learner, LearnerRaised, Mistake, as_tensor, check, expect_close, expect_shape, fail, fmt, learner_error
from .dot import CALL_PROBE
from .kit import reproduce as _reproduce

__all__ = ["check_attention", "check_score_matrix_bytes", "Known", "Elimination", "explain_raise"]


# ============================================================================ cases
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
    def scaled(self) -> torch.Tensor:
        return self.Q @ self.K.transpose(-2, -1) / math.sqrt(self.Q.shape[-1])

    @property
    def batched(self) -> bool:
        return self.Q.dim() > 2 or self.K.dim() > 2


def _oracle(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    Q, K, V, mask = case.Q, case.K, case.V, case.mask
    n_k = K.shape[-2]
    eye = torch.eye(n_k, dtype=Q.dtype).expand(*K.shape[:-2], n_k, n_k)
    return (F.scaled_dot_product_attention(Q, K, V, attn_mask=mask),
            F.scaled_dot_product_attention(Q, K, eye, attn_mask=mask))


def _random_keep_mask(n_q: int, n_k: int, g: torch.Generator) -> torch.Tensor:
    """(n_q, n_k) bool with at least one True and one False in every row."""
    mask = torch.rand(n_q, n_k, generator=g) < 0.5
    for i in range(n_q):
        j, k = torch.randperm(n_k, generator=g)[:2].tolist()
        mask[i, j], mask[i, k] = True, False
    return mask


def _large(wanted: list[list[float]], keep: list[list[bool]], V: torch.Tensor, name: str, large: bool) -> Case:
    """A case whose scaled scores are exactly ``wanted`` (K = I, so Q Kᵀ / √d_k = Q / 2 with d_k = 4)."""
    wanted_t = torch.tensor(wanted, dtype=torch.float64)
    return Case(name, Q=2 * wanted_t, K=torch.eye(4, dtype=torch.float64), V=V, mask=torch.tensor(keep),
                atol=1e-7, large=large)


def _cases() -> list[Case]:
    from ..dot import worked_example

    g = torch.Generator().manual_seed(5)

    def rand(*shape, dtype=torch.float64):
        return torch.randn(*shape, generator=g, dtype=dtype)

    Q, K, V = worked_example()
    f32 = torch.float32
    # Key padding over a batch of 3: right padding, left padding, none.
    key_padding = torch.tensor([[True, True, True, False, False], [False, False, True, True, True],
                                [True] * 5])[:, None, None, :]  # (3, 1, 1, 5)
    lengths = torch.tensor([4, 2])
    per_batch = torch.ones(4, 4, dtype=torch.bool).tril() & (torch.arange(4) < lengths[:, None])[:, None, None, :]
    return [
        Case("the 4×8 worked example, no mask", Q, K, V, None, atol=1e-7),
        Case("the 4×8 worked example with a causal (4, 4) mask", Q, K, V, torch.ones(4, 4, dtype=torch.bool).tril(),
             atol=1e-7),
        Case("a batch of 2 in float32, n_q = 5, n_k = 7, d_k = 6, d_v = 3",
             rand(2, 5, 6, dtype=f32), rand(2, 7, 6, dtype=f32), rand(2, 7, 3, dtype=f32), None, atol=2e-5),
        Case("batch × heads (2, 3), n_q = 4, n_k = 6, d_k = 16, d_v = 5, with a (4, 6) mask",
             rand(2, 3, 4, 16), rand(2, 3, 6, 16), rand(2, 3, 6, 5), _random_keep_mask(4, 6, g), atol=1e-7),
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
        # Kept scores near +1000: e^1000 overflows (a softmax must subtract each row's maximum).
        # The last row lies 2000 below the others: a maximum taken over the whole tensor underflows it.
        _large([[1000.0, 990.0, 1003.0, -50.0], [-40.0, 1002.0, 995.0, 1001.0], [-999.0, -1000.0, -1000.5, -998.0]],
               [[True, False, True, False], [False, True, False, True], [True, True, True, True]],
               rand(4, 3), "large scores (about ±1000) with a mask", large=False),
        # Kept scores near -20000, blocked ones up to +30000: every finite fill weaker than about -1e5
        # leaks, and a softmax over all keys gives the kept ones weight 0 (0/0 when renormalised).
        _large([[-20000.0, 30000.0, -20001.5, 0.0], [30000.0, -20000.7, -5000.0, -20000.0],
                [-20002.0, -20000.0, 30000.0, -5000.0]],
               [[True, False, True, False], [False, True, False, True], [True, True, False, False]],
               rand(4, 3), "large scores (±3·10⁴) with a mask", large=True),
    ]


# ============================================================================ known mistakes
@dataclass
class Known(Mistake):
    """A :class:`Mistake` with a key that names this variant, so that a passed case can rule it out.

    ``any_group``: the mistake means the same on input of any number of axes (√n_q is √n_q), so a passed
    case of any group rules it out; ``shadowed_by``: the key of a mistake that always gives the same
    numbers on this input and is named in its place when both are possible (n_q is also Q.shape[-2]
    counted from the front)."""

    key: str = ""
    any_group: bool = False
    shadowed_by: str = ""


_DIM_FIX = "take the softmax over the last axis, torch.softmax(scores, dim=-1): each query's row of weights sums to 1"
_AFTER = ("mask applied after the softmax", "you masked the weights after the softmax, so the rows no longer sum "
          "to 1", "fill the blocked *scores* with float('-inf') before the softmax")
_RENORM = ("mask applied after the softmax, then renormalised", "you zeroed the blocked weights after a softmax over "
           "all keys and divided each row by its sum: right on paper, but when blocked scores are far larger than "
           "the allowed ones, the allowed weights underflow to 0 and the division is 0/0 = NaN",
           "fill the blocked scores with float('-inf') before the softmax")
_POLARITY = ("mask polarity inverted", "you blocked the positions where the mask is True; in this course (as in "
             "F.scaled_dot_product_attention) True means 'may attend'",
             "fill the scores where the mask is False: scores.masked_fill(~mask, float('-inf'))")
_WEAK = ("a fill value too weak for these scores", "you filled blocked scores with a finite negative number, but "
         "next to scores of ±3·10⁴ it is not 'minus infinity', so blocked keys still get weight",
         "fill with float('-inf') (or torch.finfo(scores.dtype).min)")
_NAIVE = ("softmax without subtracting the maximum", "your softmax exponentiates the raw scores: e^1000 overflows to "
          "inf and inf/inf is NaN", "subtract each row's maximum before exp, or use torch.softmax")


def _scale_mistakes(case: Case, masked: Callable) -> list[Known]:
    Q, K, V = case.Q, case.K, case.V
    scores = Q @ K.transpose(-2, -1)
    d_k = Q.shape[-1]
    out = [
        Known("scores not scaled", "you did not divide the scores by √d_k", "divide Q Kᵀ by math.sqrt(d_k) before "
              "the softmax, with d_k = Q.shape[-1]", lambda: torch.softmax(masked(scores), -1), "noscale"),
        Known("divided by d_k instead of √d_k", "you divided the scores by d_k", "divide by math.sqrt(d_k)",
              lambda: torch.softmax(masked(scores / d_k), -1), "dk"),
        Known("multiplied by √d_k", "you multiplied the scores by √d_k", "divide by math.sqrt(d_k) instead",
              lambda: torch.softmax(masked(scores * math.sqrt(d_k)), -1), "times"),
    ]
    # d_k taken from the wrong axis: √ of any other size of Q, K or V (sizes that coincide named together).
    sizes = [(V.shape[-1], "d_v, the width of V (V.shape[-1])", "√d_v"),
             (Q.shape[-2], "n_q, the number of queries (Q.shape[-2])", "√n_q"),
             (K.shape[-2], "n_k, the number of keys (K.shape[-2])", "√n_k")]
    # An axis counted from the front (Q.shape[1], len(K)…) is d_k only for input with exactly i + 2 axes.
    front = [(Q.shape[i], f"Q.shape[{i}]{' (or len(Q), len(K))' if i == 0 else ''}, an axis counted from the front: "
              f"it is d_k only on {i + 2}-D input", f"√Q.shape[{i}]") for i in range(Q.dim() - 1)]
    for size, what, short in sizes + front:  # sizes that coincide on one input are told apart by a later one
        if size != d_k:
            by_meaning = (size, what, short) in sizes
            out.append(Known(f"scaled by {short} instead of √d_k", f"you scaled by the square root of {what}",
                             "scale by √d_k, the width of Q and K, counted from the end: Q.shape[-1]",
                             lambda size=size: torch.softmax(masked(scores / math.sqrt(size)), -1), short,
                             any_group=by_meaning,
                             shadowed_by="√n_q" if short == f"√Q.shape[{Q.dim() - 2}]" else ""))
    return out


def _weight_mistakes(case: Case) -> list[Known]:
    Q, K, mask = case.Q, case.K, case.mask
    scores = Q @ K.transpose(-2, -1)
    scaled = case.scaled

    def masked(s, fill=float("-inf")):
        return s if mask is None else s.masked_fill(~mask, fill)

    out = []
    ndim = scaled.dim()
    for dim in range(ndim - 1):
        if dim == ndim - 2:
            summary, axis = "softmax over axis -2 (the queries)", f"axis {dim} (= -2, the queries' axis: each column sums to 1)"
        else:
            summary, axis = f"softmax over axis {dim} (a batch axis)", f"axis {dim}, a batch axis of this {ndim}-D input"
        out.append(Known(summary, f"you took the softmax over {axis}", _DIM_FIX,
                         lambda dim=dim: torch.softmax(masked(scaled), dim), f"dim{dim}"))
    out += [
        Known("softmax over the whole matrix", "you took one softmax over the whole (n_q, n_k) matrix", _DIM_FIX,
              lambda: torch.softmax(masked(scaled).flatten(-2), -1).reshape(scaled.shape), "flat"),
        *_scale_mistakes(case, masked),
        Known("weights transposed", "you returned the weights with queries and keys swapped",
              "keep weights[..., i, j] = how much query i attends to key j (queries on rows)",
              lambda: torch.softmax(masked(scaled), -1).transpose(-2, -1), "transposed"),
        Known("K reshaped instead of transposed", "you turned K (…, n_k, d_k) into (…, d_k, n_k) with reshape or "
              "view, which keeps the numbers in memory order: it does not swap rows and columns",
              "transpose: K.transpose(-2, -1) (or K.mT)",
              lambda: torch.softmax(masked(Q @ K.reshape(*K.shape[:-2], K.shape[-1], K.shape[-2])
                                           / math.sqrt(Q.shape[-1])), -1), "reshape"),
        Known("sigmoid instead of softmax", "you applied torch.sigmoid to each score on its own, so the weights of a "
              "row do not share one total", "use torch.softmax(scores, dim=-1): each row sums to 1",
              lambda: torch.sigmoid(masked(scaled)), "sigmoid"),
        Known("scores returned as weights", "you returned the scores from before the softmax as the weights",
              "return weights = torch.softmax(scaled scores, dim=-1)", lambda: masked(scaled), "scores"),
        Known("scores returned as weights", "you returned the scores from before the softmax as the weights",
              "return weights = torch.softmax(scaled scores, dim=-1)", lambda: masked(scaled, 0.0), "scores0"),
        Known(*_NAIVE, lambda: _naive_softmax(masked(scaled)), "naive"),
        Known("log-softmax instead of softmax", "you returned log-weights (log_softmax), which are ≤ 0, not weights",
              "use torch.softmax", lambda: torch.log_softmax(masked(scaled), -1), "log"),
        Known("row maximum subtracted without keepdim", "you subtracted scores.max(-1).values without keepdim=True: "
              "shape (..., n_q) lines up with the keys' axis, so each column, not each row, was shifted",
              "keep the axis: scores.amax(dim=-1, keepdim=True)",
              lambda: _naive_softmax(masked(scaled) - masked(scaled).amax(-1).unsqueeze(-2)), "nokeepdim-max"),
        Known("row sum taken without keepdim", "you divided by e.sum(-1) without keepdim=True: shape (..., n_q) lines "
              "up with the keys' axis, so entry (i, j) was divided by row j's sum", "keep the axis: "
              "e.sum(dim=-1, keepdim=True)", lambda: _nokeepdim_sum(masked(scaled)), "nokeepdim-sum"),
        Known("normalised by the sum of every entry", "you divided by e.sum() over the whole tensor, not by each row's sum",
              "divide by e.sum(dim=-1, keepdim=True)", lambda: torch.exp(masked(scaled)) / torch.exp(masked(scaled)).sum(),
              "sum-all"),
        Known("scaled after the softmax", "you divided the weights by √d_k after the softmax instead of the scores "
              "before it", "divide the scores Q Kᵀ by math.sqrt(d_k), then take the softmax",
              lambda: torch.softmax(masked(scores), -1) / math.sqrt(Q.shape[-1]), "scale-after"),
        Known("maximum over the whole tensor", "you subtracted the maximum of the whole tensor, not of each row: "
              "a row far below it underflows to 0 and 0/0 is NaN",
              "subtract each row's maximum: scores.amax(dim=-1, keepdim=True)",
              lambda: _naive_softmax(masked(scaled) - masked(scaled).max()), "globalmax"),
    ]
    if mask is None:
        n_q, n_k = scaled.shape[-2:]
        causal = torch.ones(n_q, n_k, dtype=torch.bool).tril()
        out.append(Known("a causal mask although none was given", "with mask=None your function still blocked the "
                         "later keys (j > i): a causal mask built into it", "block keys only where the mask argument "
                         "says so; with mask=None every query sees every key",
                         lambda: torch.softmax(scaled.masked_fill(~causal, float("-inf")), -1), "causal-always"))
        return out
    soft = torch.softmax(scaled, -1)
    m = mask.to(scaled.dtype)
    out += [
        Known("mask transposed", "you applied the mask with its last two axes swapped (mask.T or "
              "mask.transpose(-2, -1)): mask[..., i, j] says whether query i may attend to key j",
              "use the mask as it is: scores.masked_fill(~mask, float('-inf'))",
              lambda: torch.softmax(scaled.masked_fill(~mask.transpose(-2, -1), float("-inf")), -1)
              if mask.dim() >= 2 else None, "mask-T"),
        Known(f"mask of shape {tuple(mask.shape)} ignored", "you used the masks of the earlier cases but not this "
              "one: your code applies the mask only for some shapes (an `if` on mask.dim() or mask.shape, or a "
              "reshape that fits only some masks)", "apply any mask that broadcasts to the scores: "
              "scores.masked_fill(~mask, float('-inf')) broadcasts by itself", lambda: soft, f"ignored-{mask.dim()}"),
        Known("bool mask added to the scores", "you added a 0/1 version of the mask to the scores: adding 1 to some "
              "scores shifts them a little and blocks nothing", "fill the blocked scores with -inf: "
              "scores.masked_fill(~mask, float('-inf'))", lambda: torch.softmax(scaled + (1 - m), -1), "plus-inverted"),
        Known(*_AFTER, lambda: soft * m, "after*"),
        Known(*_AFTER, lambda: soft.masked_fill(~mask, float("-inf")), "after-inf"),
        Known(*_RENORM, lambda: (soft * m) / (soft * m).sum(-1, keepdim=True), "renorm"),
        Known(*_POLARITY, lambda: torch.softmax(scaled.masked_fill(mask, float("-inf")), -1), "polarity"),
        Known(*_POLARITY, lambda: torch.softmax(scaled.masked_fill(mask, -1e9), -1), "polarity9"),
        Known("mask ignored", "you did not use the mask, so blocked keys still get weight",
              "fill the scores where the mask is False with float('-inf') before the softmax", lambda: soft, "ignored"),
        Known("bool mask added to the scores", "you added the boolean mask to the scores: True counts as +1, "
              "which blocks nothing", "fill the blocked scores with -inf: scores.masked_fill(~mask, float('-inf'))",
              lambda: torch.softmax(scaled + m, -1), "plus"),
        Known("mask multiplied into the scores", "you multiplied the scores by the mask: a blocked score becomes 0, "
              "not -inf, and e^0 = 1 still gives it weight",
              "fill the blocked scores with -inf (masked_fill or torch.where) instead of multiplying",
              lambda: torch.softmax(scaled * m, -1), "times-mask"),
        Known("0 × (-inf) = NaN in an additive mask", "you built the additive mask as (~mask) * float('-inf'), and "
              "0 × (-inf) is NaN, so every row with an allowed key became NaN",
              "build it with masked_fill or torch.where: torch.zeros_like(scores).masked_fill(~mask, float('-inf'))",
              lambda: torch.softmax(scaled + (~mask).to(scaled.dtype) * float("-inf"), -1), "nan-additive"),
    ]
    weak = []
    for fill in (-1e4, -1e3, -1e5, -1e2):
        weak += [
            Known(*_WEAK, lambda fill=fill: torch.softmax(scaled.masked_fill(~mask, fill), -1), f"weak{fill}"),
            Known(*_WEAK, lambda fill=fill: torch.softmax(scores.masked_fill(~mask, fill) / math.sqrt(Q.shape[-1]), -1),
                  f"weak-pre{fill}"),
            Known(*_WEAK, lambda fill=fill: torch.softmax(scaled + (~mask).to(scaled.dtype) * fill, -1), f"weak+{fill}"),
        ]
    return out + weak


def _naive_softmax(x: torch.Tensor) -> torch.Tensor:
    e = torch.exp(x)
    return e / e.sum(-1, keepdim=True)


def _nokeepdim_sum(x: torch.Tensor) -> torch.Tensor:
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1).unsqueeze(-2)


def _index_fill(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out = scores.clone()
    out[~mask] = float("-inf")
    return out


def _output_mistakes(case: Case) -> list[Known]:
    Q, K, V, mask = case.Q, case.K, case.V, case.mask
    scaled = case.scaled
    masked = scaled if mask is None else scaled.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(masked, -1)
    before = ("V multiplied before the softmax", "you multiplied by V before taking the softmax, so the output is "
              "a softmax over features", "take the softmax of the scaled scores first; then output = weights @ V")
    out = [
        Known(*before, lambda: torch.softmax(scaled @ V, dim=-1), "before"),
        Known(*before, lambda: torch.softmax(masked @ V, dim=-1), "before-masked"),
        Known("output from the raw scores", "you multiplied V by the scores, not by the weights",
              "output = weights @ V, with weights = softmax(…)", lambda: scaled @ V, "scores@V"),
        Known("output from transposed weights", "you multiplied V by the transposed weights",
              "output = weights @ V", lambda: weights.transpose(-2, -1) @ V, "wT@V"),
        Known("output from K instead of V", "you multiplied the weights by K, not by V", "output = weights @ V",
              lambda: weights @ K, "w@K"),
        Known("V returned as the output", "you returned V itself, not the weighted sum of the values",
              "output = weights @ V", lambda: V, "V"),
    ]
    if mask is not None:
        out.append(Known("output from the unmasked weights", "you returned masked weights, but computed the output "
                         "from weights taken before the mask was applied", "compute the output from the same "
                         "(masked) weights you return: output = weights @ V",
                         lambda: torch.softmax(scaled, -1) @ V, "unmasked@V"))
    return out


class Elimination:
    """Known mistakes that the cases an answer passed rule out: a mistake whose output differed from the
    right one on a passed case is not what the learner did, so it is never blamed later.

    ``build(case)`` lists the mistakes of a case (each with a stable ``key``); ``group`` says which cases
    may rule out which (here the number of axes: ``softmax(dim=1)`` or ``Q.shape[1]`` is right on 2-D
    input and wrong on 3-D input). Mistakes are evaluated lazily, only when an answer fails."""

    def __init__(self, build: Callable[[object], list[Known]]):
        self.build = build
        self.history: list[tuple[object, torch.Tensor, float, object]] = []  # (case, expected, atol, group)

    def passed(self, case: object, expected: torch.Tensor, atol: float, group: object = None) -> None:
        self.history.append((case, expected, atol, group))

    def candidates(self, actual: torch.Tensor, case: object, *, atol: float, rtol: float = 1e-5,
                   group: object = None) -> list[Known]:
        """The mistakes of ``case`` whose output ``actual`` reproduces and that no passed case ruled out."""
        found = [m for m in self.build(case) if (v := m.value()) is not None and same(actual, v, atol=atol, rtol=rtol)]
        found = [m for m in found if not self._ruled_out(m.key, group, rtol, m.any_group)]
        keys = {m.key for m in found}
        return [m for m in found if m.shadowed_by not in keys]

    def _ruled_out(self, key: str, group: object, rtol: float, any_group: bool = False) -> bool:
        for case, expected, atol, g in self.history:
            if g != group and not any_group:
                continue
            for m in self.build(case):
                if m.key == key:
                    v = m.value()
                    if v is not None and not same(v, expected, atol=atol, rtol=rtol):
                        return True
        return False


# ============================================================================ exceptions
def explain_raise(exc: LearnerRaised, case: Case) -> dict[str, str]:
    """A cause and fix for the learner's exception, only when the check can reproduce its very message
    with the construct it blames (or the message itself names the cause)."""
    Q, K, V, mask = case.Q, case.K, case.V, case.mask
    message = exc.message
    if mask is not None and exc.type_name == "TypeError" and "positional argument" in message:
        return dict(cause="your function does not take the mask as its fourth argument",
                    fix="keep the signature attention(Q, K, V, mask=None)")
    if "Boolean value of Tensor" in message:
        return dict(cause="you tested the mask with `if mask:`, which asks a whole tensor for one truth value",
                    fix="test `if mask is not None:`")
    Kt = K.transpose(-2, -1)
    w = torch.softmax(case.scaled, -1)
    def reversed_axes(t: torch.Tensor) -> torch.Tensor:
        return t.permute(*reversed(range(t.dim())))

    # K.T on the whole input, or on one slice of it inside a loop over the first axes (Q[b] @ K[b].T).
    slices = [(0,) * i for i in range(max(Q.dim(), K.dim()) - 1)]
    constructs = [
        ("on batched input, K.T reverses every axis (the batch axes too)",
         "transpose only the last two axes: K.transpose(-2, -1) (or K.mT)",
         [lambda i=i: Q[i] @ reversed_axes(K[i]) for i in slices if len(i) <= min(Q.dim(), K.dim()) - 2]
         + [lambda: torch.matmul(Q, reversed_axes(K))]),
        ("K.t() works on 2-D matrices only", "transpose only the last two axes: K.transpose(-2, -1)", [lambda: K.t()]),
        ("torch.mm multiplies 2-D matrices only", "use the @ operator (torch.matmul), which handles leading batch axes",
         [lambda: torch.mm(Q, Kt), lambda: torch.mm(w, V)]),
        ("torch.bmm needs exactly 3-D tensors", "use the @ operator (torch.matmul), which handles any number of "
         "leading axes", [lambda: torch.bmm(Q, Kt), lambda: torch.bmm(w, V)]),
        ("K.transpose(1, 2) counts axes from the front: on input with fewer axes there is no axis 2",
         "count from the end: K.transpose(-2, -1)", [lambda: K.transpose(1, 2), lambda: K.permute(0, 2, 1)]),
        ("K.transpose(0, 1) swaps the first two axes, which on batched input are not the keys and features",
         "transpose the last two axes: K.transpose(-2, -1)", [lambda: Q @ K.transpose(0, 1)]),
        ("you multiplied the weights by Vᵀ instead of V", "output = weights @ V: (…, n_q, n_k) @ (…, n_k, d_v)",
         [lambda: w @ V.transpose(-2, -1)]),
        ("you subtracted scores.max(-1).values without keepdim=True, so its shape (…, n_q) does not line up with "
         "the rows", "keep the axis: scores.amax(dim=-1, keepdim=True)",
         [lambda: case.scaled - case.scaled.max(-1).values]),
        ("you divided by e.sum(-1) without keepdim=True, so its shape (…, n_q) does not line up with the rows",
         "keep the axis: e.sum(dim=-1, keepdim=True)", [lambda: w / w.sum(-1)]),
    ]
    if mask is not None:
        constructs.append(("you added an axis at the end of the mask (mask[..., None] or mask.unsqueeze(-1)), which "
                           "lines the mask's keys up with the queries' axis of the scores",
                           "use the mask as it is: it already broadcasts to (…, n_q, n_k)",
                           [lambda: case.scaled.masked_fill(~mask[..., None], float("-inf")),
                            lambda: torch.where(mask[..., None], case.scaled, float("-inf"))]))
        constructs.append(("indexing with a boolean mask (scores[~mask] = …) needs a mask of the scores' full shape: "
                           "it does not broadcast", "use scores.masked_fill(~mask, float('-inf')) or torch.where, "
                           "which broadcast", [lambda: _index_fill(case.scaled, mask)]))
    found = [(cause, fix) for cause, fix, attempts in constructs if any(_reproduce(a) == message for a in attempts)]
    if len(found) == 1:  # a message two constructs share (a generic broadcasting error) names neither
        return dict(cause=found[0][0], fix=found[0][1])
    return {}


_ARG_NAMES = ("Q", "K", "V", "mask")


def _call_attention(fn: Learner, case: Case, tried: str) -> tuple[object, list[str]]:
    """The learner's result on ``case`` and the names of the arguments it changed in place."""
    Q, K, V, mask = case.Q, case.K, case.V, case.mask
    args = (Q, K, V) if mask is None else (Q, K, V, mask)
    try:
        result = fn.observe(CALL_PROBE, *args)  # runs attention(*args) in the learner's process, watching the inputs
    except LearnerRaised as exc:
        raise Failure(learner_error(exc, tried=tried, expected="(output, weights)", **explain_raise(exc, case))) from None
    value, changed = result if isinstance(result, tuple) and len(result) == 2 else (result, [])
    return value, [_ARG_NAMES[int(i)] for i in changed if 0 <= int(i) < len(args)]


# ============================================================================ what the weights are, when no mistake matches
def _effective_scale(w: torch.Tensor, case: Case) -> float | None:
    """The c for which the weights equal softmax(Q Kᵀ / c) on the allowed keys, if one c fits every row."""
    scores = (case.Q @ case.K.transpose(-2, -1)).to(torch.float64)
    allowed = torch.ones_like(scores, dtype=torch.bool) if case.mask is None else torch.broadcast_to(case.mask, scores.shape)
    if tuple(w.shape) != tuple(scores.shape) or not (w[allowed] > 0).all():
        return None
    logw = torch.where(allowed, torch.log(w.clamp_min(1e-300)), torch.zeros_like(w))
    # Centre log-weights and scores over each row's allowed keys; then logw = scores / c on every row.
    count = allowed.sum(-1, keepdim=True).clamp_min(1)
    x = torch.where(allowed, scores - (scores * allowed).sum(-1, keepdim=True) / count, torch.zeros_like(scores))
    y = torch.where(allowed, logw - (logw * allowed).sum(-1, keepdim=True) / count, torch.zeros_like(logw))
    if float((x * x).sum()) < 1e-12:
        return None
    slope = float((x * y).sum() / (x * x).sum())
    if abs(slope) < 1e-9 or not torch.allclose(y, slope * x, atol=1e-4, rtol=1e-3):
        return None
    return 1 / slope


def _structure(w: torch.Tensor, case: Case, tried: str, passed_dks: set[int] = frozenset()) -> None:
    """When no known mistake reproduces the weights, say which property of them is off."""
    w = w.to(torch.float64)
    scaled = case.scaled
    allowed = torch.ones_like(scaled, dtype=torch.bool) if case.mask is None else torch.broadcast_to(case.mask, scaled.shape)
    if torch.isnan(w).any() and tuple(w.shape) == tuple(scaled.shape):
        nan_rows = torch.isnan(w).any(-1)  # (..., n_q)
        where = f"{int(nan_rows.sum())} of {nan_rows.numel()} rows"
        overflow = torch.isinf(torch.exp(scaled.masked_fill(~allowed, float("-inf")))).any(-1)
        underflow = (torch.softmax(scaled, -1) * allowed).sum(-1) == 0
        if torch.equal(nan_rows, overflow):
            limit = fmt(math.log(torch.finfo(scaled.dtype).max))
            fail("NaN where exp overflowed", tried=tried, got=f"NaN in {where}: exactly the rows with an allowed score "
                 f"above {limit}, where e^score is inf", expected="finite weights, every row summing to 1",
                 cause=_NAIVE[1], fix=_NAIVE[2])
        if torch.equal(nan_rows, underflow):
            fail("NaN where the allowed weights underflow", tried=tried, got=f"NaN in {where}: exactly the rows "
                 "where a softmax over all keys gives every allowed key weight 0",
                 expected="finite weights, every row summing to 1",
                 cause="the blocked keys took part in a softmax (or a sum) before being removed, so the allowed "
                       "weights underflowed to 0 and a division gave 0/0",
                 fix="fill the blocked scores with float('-inf') before the softmax")
        fail("NaN in the weights", tried=tried, got=f"NaN in {where}", expected="finite weights, every row summing to 1",
             fix="print your intermediate tensors on this input: which step first holds NaN?")
    if tuple(w.shape) != tuple(scaled.shape):
        return
    if (w < -1e-12).any() or (w > 1 + 1e-9).any():
        fail("weights outside [0, 1]", tried=tried, got=f"weights from {fmt(float(w.min()))} to {fmt(float(w.max()))}",
             expected="weights between 0 and 1 (a softmax)", fix="the weights are torch.softmax(scaled scores, dim=-1)")
    decimals = _rounded_to(w)
    if decimals is not None and _rounded_to(_oracle(case)[1].to(torch.float64)) is None:
        fail(f"weights rounded to {decimals} decimal{'s' if decimals > 1 else ''}", tried=tried,
             got=f"every weight is a multiple of {10.0 ** -decimals:g}", expected="the weights at full precision",
             cause=f"you rounded the weights (round, or a conversion through printed text) to {decimals} decimals",
             fix="round only what you print, never the values you return")
    if case.mask is not None:
        leak = float(w[~allowed].abs().max()) if (~allowed).any() else 0.0
        on_blocked = (w * ~allowed).sum(-1)  # (..., n_q): each row's weight on blocked keys
        has_blocked = (~allowed).any(-1)  # (..., n_q)
        if leak > 1e-6 and torch.allclose(on_blocked[has_blocked], torch.ones_like(on_blocked[has_blocked]), atol=1e-6):
            fail("all the weight on blocked keys", tried=tried,
                 got="every row with a blocked key puts all its weight on blocked keys, and none on the allowed ones",
                 expected="weight 0 on every blocked key",
                 cause="the mask acts the wrong way round: blocked scores were raised (a + sign, or a fill of +inf "
                       "or +1e9) or the allowed ones lowered",
                 fix="lower the blocked scores: scores.masked_fill(~mask, float('-inf'))")
        if leak > 1e-6:
            weak = case.large  # earlier mask cases passed: only a finite fill explains a leak at these sizes
            fail(_WEAK[0] if weak else "weight on blocked keys", tried=tried,
                 got=f"blocked keys receive weight (up to {fmt(leak)})", expected="weight 0 on every key the mask blocks",
                 cause=_WEAK[1] if weak else "", fix=_WEAK[2] if weak else "fill the blocked scores with float('-inf') "
                 "before the softmax")
    exp_w = _oracle(case)[1].to(torch.float64)
    kept = w.abs() > 1e-12
    if kept.any() and (~kept & (exp_w > 1e-6)).any():
        ratio = w[kept] / exp_w[kept].clamp_min(1e-300)
        c = float(ratio.mean())
        if c > 1 + 1e-6 and torch.allclose(ratio, torch.full_like(ratio, c), rtol=1e-4):
            fail("weights randomly zeroed (dropout)", tried=tried, got=f"some weights are 0, the others {fmt(c)} × "
                 "the right ones", expected="the weights themselves",
                 cause=f"dropout in training mode: it zeroes entries at random and multiplies the rest by {fmt(c)}",
                 fix="leave dropout out of this function (or pass training=False)")
    sums = w.sum(-1)
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-5):
        c = float(sums.mean())
        if torch.allclose(sums, torch.full_like(sums, c), atol=1e-6) and c > 1e-9:
            p = 1 - 1 / c  # dropout with probability p scales the weights it keeps by 1 / (1 - p)
            dropout = c > 1 and abs(p * 20 - round(p * 20)) < 1e-3
            fail(f"every row sums to {fmt(c)}", tried=tried, got=f"every row of weights sums to {fmt(c)}",
                 expected="every row summing to 1", cause="the weights were multiplied by a constant after the softmax"
                 + (f" (dropout with p = {p:.2g} in training mode does that to the weights it keeps)" if dropout else ""),
                 fix="return the softmax itself as the weights" + (", without dropout" if dropout else ""))
        fail("rows of weights do not sum to 1", tried=tried,
             got=f"rows summing to {fmt(float(sums.min()))} … {fmt(float(sums.max()))}",
             expected="every row (one query) summing to 1 over the keys",
             fix="print the row sums after each step on this input: torch.softmax(scaled scores, dim=-1) gives "
                 "rows that sum to 1")
    c = _effective_scale(w, case)
    d_k = case.Q.shape[-1]
    if c is not None and abs(c - math.sqrt(d_k)) > 1e-3 * math.sqrt(d_k):
        k = round(c * c)
        fixed = c > 0 and abs(c * c - k) < 1e-3 * max(1, k) and k in passed_dks  # right earlier, where d_k was k
        cause = f"you divided the scores by {fmt(c)}" + (": a negative factor flips the scores' sign, so the "
                                                         "least similar key gets the most weight" if c < 0 else "")
        if fixed:
            cause = (f"you divided the scores by √{k}, which was right for an earlier input with d_k = {k} but not "
                     f"for this one (d_k = {d_k}): a fixed number sits in your code, or a variable from outside the "
                     "function" + (" (the notebook's worked example sets d_k = 8)" if k == 8 else ""))
        fail(f"scores divided by {f'√{k}' if fixed else fmt(c)} instead of √d_k = {fmt(math.sqrt(d_k))}", tried=tried,
             got=f"the weights of softmax(Q Kᵀ / {fmt(c)})", expected=f"softmax(Q Kᵀ / √d_k) with d_k = {d_k}",
             cause=cause, fix="divide Q Kᵀ by math.sqrt(Q.shape[-1]), computed inside the function")


#: Significant bits of each floating-point dtype.
_BITS = {torch.float64: 53, torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}


def lower_precision(got: torch.Tensor, input_dtype: torch.dtype, *, tried: str, what: str) -> None:
    """Fail, naming the dtype, when a wrong ``got`` went through a dtype narrower than the inputs': its own dtype
    is narrower, or every entry lies exactly on that dtype's grid (a float64 computation lands there by chance
    with probability about 2⁻²⁹ per entry)."""
    bits = _BITS.get(input_dtype)
    if bits is None or not got.is_floating_point():
        return
    low = got.dtype if _BITS.get(got.dtype, 99) < bits else None
    if low is None:
        values = got[torch.isfinite(got)]
        telling = values[(values != 0) & (values.abs() != 1) & (values.abs() != 0.5)]
        for candidate in (torch.bfloat16, torch.float16, torch.float32):
            if _BITS[candidate] < bits and telling.numel() >= 4 and torch.equal(telling.to(candidate).to(got.dtype), telling):
                low = candidate
                break
    if low is None:
        return
    name, inputs = str(low).replace("torch.", ""), str(input_dtype).replace("torch.", "")
    digits = {torch.float32: 7, torch.float16: 3, torch.bfloat16: 2}[low]
    fail(f"computed in {name}, not {inputs}", tried=tried,
         got=f"{what}: {name} values" + ("" if got.dtype == low else f" (every entry exactly representable in {name})")
         + f", although the inputs are {inputs}",
         expected=f"the results at {inputs} precision",
         cause=f"part of your computation ran in {name}{'' if got.dtype != low else ' or narrower'} (.float(), "
               f".half(), .to({name}) or dtype={name}), which keeps about {digits} significant digits: too few for "
               "these inputs",
         fix="keep the inputs' dtype from start to end (a wider dtype inside is fine, a narrower one is not)")


def _rounded_to(t: torch.Tensor) -> int | None:
    """The number of decimals (1 to 4) every entry of ``t`` is rounded to, or None."""
    values = t[torch.isfinite(t)].to(torch.float64)
    if values.numel() < 4:
        return None
    for decimals in range(1, 5):
        scaled = values * 10**decimals
        if torch.allclose(scaled, scaled.round(), atol=1e-6, rtol=0):
            return decimals
    return None


# ============================================================================ results
def _squeezed(t: torch.Tensor, shape: torch.Size, tried: str, what: str) -> None:
    """Fail, naming squeeze, when ``t`` is the expected shape with its size-1 axes dropped."""
    shape = tuple(shape)
    if tuple(t.shape) != shape and 1 in shape and tuple(t.shape) == tuple(s for s in shape if s != 1):
        fail(f"size-1 axes dropped from {what}", tried=tried, got=f"{what} of shape {tuple(t.shape)}",
             expected=f"shape {shape}", cause="you squeezed the tensor (.squeeze() drops every axis of size 1, "
             "here the batch, heads or queries axis)", fix="leave out .squeeze(); keep every axis the inputs have")


def _unpack(result, tried: str) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(result, torch.Tensor):
        fail("returned one tensor, not (output, weights)", tried=tried, got=f"one tensor of shape {tuple(result.shape)}",
             expected="a tuple (output, weights)", fix="end the function with `return output, weights`")
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        got = f"a {type(result).__name__} of {len(result)} items" if isinstance(result, (tuple, list)) else type(result).__name__
        fail("did not return (output, weights)", tried=tried, got=got, expected="a tuple of two tensors (output, weights)",
             fix="end the function with `return output, weights`")
    if any(isinstance(r, np.ndarray) for r in result):
        fail("returned NumPy arrays, not tensors", tried=tried,
             got=", ".join(f"{what}: {'a NumPy array' if isinstance(r, np.ndarray) else type(r).__name__}"
                           for what, r in zip(("output", "weights"), result)),
             expected="two torch tensors (output, weights), as the docstring says",
             cause="part of your computation went through NumPy (.numpy(), np.exp, np.matmul…), which returns arrays",
             fix="stay with torch operations on the tensors (@, torch.softmax, masked_fill)")
    return (as_tensor(result[0], tried=tried, what="the output (first element)"),
            as_tensor(result[1], tried=tried, what="the weights (second element)"))


@check("attention", expects="a function attention(Q, K, V, mask=None) returning (output, weights)")
def check_attention(fn: Learner) -> str:
    cases = _cases()
    known = (Elimination(_weight_mistakes), Elimination(_output_mistakes))
    pending: Failure | None = None  # a failure blamed on two mistakes at once: later cases may tell them apart
    for case in cases:
        tried = f"attention(Q, K, V{', mask' if case.mask is not None else ''}) on {case.name}"
        try:
            _check_case(fn, case, tried, known)
        except Failure as failure:
            if _ambiguous(failure):
                pending = pending or failure
                continue
            if pending is not None and not failure.diagnosis.cause:
                raise pending from None  # a later failure that names no cause says less than the first one
            raise
    if pending is not None:
        raise pending
    shapes = {tuple(c.mask.shape) for c in cases if c.mask is not None}
    return (f"matches F.scaled_dot_product_attention on {len(cases)} cases (batched, n_q ≠ n_k, d_k ≠ d_v, "
            f"masks of {len(shapes)} shapes, large scores)")


def _ambiguous(failure: Failure) -> bool:
    return failure.diagnosis.cause.startswith("on this input two mistakes give the same numbers")


def _check_case(fn: Learner, case: Case, tried: str, known: tuple[Elimination, Elimination]) -> None:
    """Fail unless the learner's attention is right on ``case``; afterwards the case rules mistakes out."""
    weights_known, output_known = known
    result, changed = _call_attention(fn, case, tried)
    out, w = _unpack(result, tried)
    exp_out, exp_w = _oracle(case)
    if tuple(out.shape) == tuple(exp_w.shape) and tuple(w.shape) == tuple(exp_out.shape) and exp_w.shape != exp_out.shape:
        fail("output and weights swapped", tried=tried, got="(weights, output)", expected="(output, weights)",
             fix="return output first, then weights")
    ndim = max(case.Q.dim(), case.K.dim(), case.V.dim())
    d_k = case.Q.shape[-1]
    _squeezed(w, exp_w.shape, tried, "the weights")
    if not same(w, exp_w, atol=case.atol, rtol=1e-5):
        w_mistakes = weights_known.candidates(w, case, atol=case.atol, group=ndim)
        if any(m.key == "ignored" for m in w_mistakes):  # a mask ignored always, not only for some shapes
            w_mistakes = [m for m in w_mistakes if not m.key.startswith("ignored-")]
        _mask_axis_added(w, case, tried)
        expect_shape(w, exp_w.shape, tried=tried, what="the weights", mistakes=w_mistakes,
                     fix="the weights have one row per query and one column per key: (..., n_q, n_k)")
        try:
            expect_close(w, exp_w, tried=tried, what="the weights", atol=case.atol, rtol=1e-5, mistakes=w_mistakes)
        except Failure as failure:
            if failure.diagnosis.cause:
                raise
            _random(fn, case, tried, w)
            lower_precision(w, case.Q.dtype, tried=tried, what="the weights")
            _structure(w, case, tried, {c.Q.shape[-1] for c, *_ in weights_known.history})
            raise
    _squeezed(out, exp_out.shape, tried, "the output")
    if not same(out, exp_out, atol=case.atol, rtol=1e-5):
        out_mistakes = output_known.candidates(out, case, atol=case.atol, group=ndim)
        expect_shape(out, exp_out.shape, tried=tried, what="the output", mistakes=out_mistakes,
                     fix="the output is weights @ V: (..., n_q, d_v)")
        try:
            expect_close(out, exp_out, tried=tried, what="the output", atol=case.atol, rtol=1e-5,
                         mistakes=out_mistakes, factors={"√d_k": math.sqrt(d_k), "d_k": float(d_k)})
        except Failure as failure:
            if not failure.diagnosis.cause:
                lower_precision(out, case.Q.dtype, tried=tried, what="the output")
            raise
    if changed:
        names = " and ".join(changed)
        fail(f"changed {names} in place", tried=tried, got=f"right results, but after the call {names} "
             f"held different values than before", expected="the arguments left as they were",
             cause=f"an in-place operation on {names} (/=, *=, +=, a method ending in _ such as masked_fill_, or an "
                   "assignment into it) changes the caller's tensor too",
             fix="compute new tensors instead: scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k); "
                 "mask.logical_not() or ~mask, not mask.logical_not_()")
    weights_known.passed(case, exp_w, case.atol, ndim)
    output_known.passed(case, exp_out, case.atol, ndim)


def _mask_axis_added(w: torch.Tensor, case: Case, tried: str) -> None:
    """Fail, naming it, when the weights have the shape the scores broadcast to with an axis added to the mask."""
    if case.mask is None or tuple(w.shape) == tuple(case.scaled.shape):
        return
    for i in range(case.mask.dim() + 1):
        try:
            shape = torch.broadcast_shapes(case.scaled.shape, case.mask.unsqueeze(i).shape)
        except RuntimeError:
            continue
        if tuple(shape) == tuple(w.shape):
            fail(f"weights of shape {tuple(w.shape)}: the mask got an extra axis", tried=tried,
                 got=f"the weights of shape {tuple(w.shape)}", expected=f"shape {tuple(case.scaled.shape)}",
                 cause=f"you added an axis to the mask (mask.unsqueeze({i}) or a None index): broadcast against the "
                       f"scores {tuple(case.scaled.shape)}, the mask {tuple(case.mask.shape)} made them bigger",
                 fix="use the mask as it is: any mask that broadcasts to (…, n_q, n_k) works unchanged")


def _random(fn: Learner, case: Case, tried: str, first: torch.Tensor, calls: int = 3) -> None:
    """Fail, naming randomness, when one of ``calls`` more calls on the same input gives other weights (several:
    dropout with a small p may leave every weight of a small matrix in place once, rarely three times more)."""
    for _ in range(calls):
        again, _ = _call_attention(fn, case, tried)
        _, w = _unpack(again, tried)
        if tuple(w.shape) == tuple(first.shape) and not same(w, first, atol=0.0, rtol=0.0):
            break
    else:
        return
    fail("different results for the same input", tried=tried + ", more than once",
         got="calls with the same Q, K, V and mask gave different weights",
         expected="the same weights every time (attention is deterministic)",
         cause="randomness in your function: dropout in training mode (F.dropout's default training=True, or an "
               "nn.Dropout module) zeroes random weights and scales the rest up",
         fix="leave dropout out of this function (or pass training=False)")


# ============================================================================ score matrix bytes
_BYTE_CASES = [
    dict(n=6, batch=1, heads=1, dtype=torch.float32),
    dict(n=10, batch=3, heads=5, dtype=torch.float16),
    dict(n=7, batch=3, heads=1, dtype=torch.float64),
    dict(n=5, batch=1, heads=2, dtype=torch.bfloat16),
    dict(n=4096, batch=1, heads=12, dtype=torch.float16),
    dict(n=1, batch=1, heads=1, dtype=torch.float32),
    dict(n=9, batch=6, heads=7, dtype=torch.float64),
    dict(n=11),  # the defaults: batch 1, heads 1, float32
]

_ELEMENT_FIX = "take the bytes per entry from the dtype: torch.empty((), dtype=dtype).element_size()"
#: Wrong formulas, each a function of (n, batch, heads, bytes per entry): (summary, cause, fix, formula).
_BYTE_MISTAKES = [
    ("bits, not bytes", "you counted bits: the bytes per entry times 8", "leave out the factor 8",
     lambda n, b, h, e: 8 * b * h * n * n * e),
    ("batch size missing", "you left out the batch size", "multiply by batch", lambda n, b, h, e: h * n * n * e),
    ("number of heads missing", "you left out the number of heads", "multiply by heads", lambda n, b, h, e: b * n * n * e),
    ("n instead of n × n", "you counted n entries per matrix, not n × n", "the score matrix is n × n: square n",
     lambda n, b, h, e: b * h * n * e),
    ("n³ instead of n²", "you multiplied by n once too often", "the score matrix has n × n entries",
     lambda n, b, h, e: b * h * n ** 3 * e),
    ("entries, not bytes", "you returned the number of entries", "multiply by the bytes per entry",
     lambda n, b, h, e: b * h * n * n),
    ("batch counted twice", "you multiplied by the batch size twice", "multiply by batch once",
     lambda n, b, h, e: b * b * h * n * n * e),
    ("heads counted twice", "you multiplied by the number of heads twice", "multiply by heads once",
     lambda n, b, h, e: b * h * h * n * n * e),
    ("2 bytes per entry assumed", "you used 2 bytes per entry whatever the dtype", _ELEMENT_FIX,
     lambda n, b, h, e: b * h * n * n * 2),
    ("4 bytes per entry assumed", "you used 4 bytes per entry whatever the dtype", _ELEMENT_FIX,
     lambda n, b, h, e: b * h * n * n * 4),
    ("8 bytes per entry assumed", "you used 8 bytes per entry whatever the dtype", _ELEMENT_FIX,
     lambda n, b, h, e: b * h * n * n * 8),
    ("divided by the bytes per entry", "you divided by the bytes per entry instead of multiplying",
     "multiply by the bytes per entry", lambda n, b, h, e: b * h * n * n / e),
    ("n × n missing", "you left out the n × n entries of each matrix", "multiply by n * n",
     lambda n, b, h, e: b * h * e),
    ("batch and heads missing", "you counted one (n, n) matrix, not batch × heads of them",
     "multiply by batch and by heads", lambda n, b, h, e: n * n * e),
    ("bytes in GB, not bytes", "you converted to gigabytes (÷ 10⁹)", "return the plain number of bytes",
     lambda n, b, h, e: b * h * n * n * e / 1e9),
    ("bytes in GiB, not bytes", "you converted to gibibytes (÷ 2³⁰)", "return the plain number of bytes",
     lambda n, b, h, e: b * h * n * n * e / 2**30),
    ("bytes in MiB, not bytes", "you converted to mebibytes (÷ 2²⁰)", "return the plain number of bytes",
     lambda n, b, h, e: b * h * n * n * e / 2**20),
    ("2 × n instead of n × n", "you doubled n (n * 2) where the matrix has n × n entries (n ** 2)",
     "the score matrix is n × n: n * n or n ** 2", lambda n, b, h, e: b * h * 2 * n * e),
    ("bytes in KiB, not bytes", "you converted to kibibytes (÷ 1024)", "return the plain number of bytes",
     lambda n, b, h, e: b * h * n * n * e / 1024),
    ("bytes in KiB, not bytes", "you converted to kibibytes with //, which also rounds down",
     "return the plain number of bytes", lambda n, b, h, e: b * h * n * n * e // 1024),
    ("bytes in MiB, not bytes", "you converted to mebibytes with //, which also rounds down",
     "return the plain number of bytes", lambda n, b, h, e: b * h * n * n * e // 2**20),
    ("only one triangle counted", "you counted n(n + 1)/2 entries, one triangle with its diagonal; the score tensor "
     "holds all n × n entries, masked or not", "count every entry: n * n", lambda n, b, h, e: b * h * (n * (n + 1) // 2) * e),
]


def _call_bytes(fn: Learner, tried: str, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except LearnerRaised as exc:
        extra = {}
        if exc.type_name == "KeyError" and "torch." in exc.message:
            extra = dict(cause=f"a table of bytes per dtype that has no entry for {exc.message.strip(chr(39))}",
                         fix=_ELEMENT_FIX + " (it knows every dtype)")
        raise Failure(learner_error(exc, tried=tried, expected="a number of bytes (an int)", **extra)) from None


@check("score_matrix_bytes",
       expects="a function score_matrix_bytes(n, batch=1, heads=1, dtype=torch.float32) returning a number of bytes")
def check_score_matrix_bytes(fn: Learner) -> str:
    # Every case first: a wrong formula is named only when it reproduces the answer on every case.
    runs = []  # (case, tried, raw result, expected bytes, bytes per entry)
    for case in _BYTE_CASES:
        n = case["n"]
        b, h, dtype = case.get("batch", 1), case.get("heads", 1), case.get("dtype", torch.float32)
        # Oracle: the nbytes of a real (batch, heads, n, n) tensor on the meta device (nothing is allocated).
        expected = torch.empty(b, h, n, n, dtype=dtype, device="meta").nbytes
        element = torch.empty((), dtype=dtype).element_size()
        try:
            if "dtype" in case:
                tried = f"score_matrix_bytes({n}, batch={b}, heads={h}, dtype={dtype})"
                raw = _call_bytes(fn, tried, n, batch=b, heads=h, dtype=dtype)
            else:
                tried = f"score_matrix_bytes({n}) with the defaults batch=1, heads=1, dtype=torch.float32"
                raw = _call_bytes(fn, tried, n)
            got_t = as_tensor(raw, tried=tried, expected="a number of bytes (an int)")
            if got_t.numel() != 1:
                fail("returned a tensor, not one number", tried=tried, got=f"a tensor of shape {tuple(got_t.shape)}",
                     expected="one number of bytes (an int)", fix="return an int, e.g. with .item() or plain arithmetic")
        except Failure as failure:  # reported after any wrong count on an earlier case
            runs.append((case, tried, failure, math.nan, expected, element))
            break
        runs.append((case, tried, raw, got_t.to(torch.float64).item(), expected, element))
    every = [m for m in _BYTE_MISTAKES
             if all(math.isclose(got, m[3](c["n"], c.get("batch", 1), c.get("heads", 1), e), rel_tol=1e-9)
                    for c, _, raw, got, _, e in runs if "dtype" in c and not isinstance(raw, Failure))]
    for case, tried, raw, got, expected, element in runs:
        if isinstance(raw, Failure):
            raise raw
        n = case["n"]
        b, h, dtype = case.get("batch", 1), case.get("heads", 1), case.get("dtype", torch.float32)
        if got == expected:
            _expect_int(raw, tried, expected)
            continue
        found = [m for m in every if m[3](n, b, h, element) != expected]
        summary, cause, fix = found[0][:3] if len(found) == 1 else (f"{got:.10g} bytes, expected {expected}", "", "")
        if not found:
            ratios = {round(r[3] / r[4], 9) for r in runs if not isinstance(r[2], Failure) and r[4]}
            summary, cause, fix = (_bytes_ratio(got / expected) if len(ratios) == 1 else None) or \
                _bytes_measured(got, expected, n, b, h, dtype, element) or (summary, cause, fix)
        if "dtype" not in case and not found:  # every case with explicit arguments passed: only the defaults differ
            summary, cause, fix = ("wrong default arguments", "with only n given, your function does not count "
                                   "batch=1, heads=1, dtype=torch.float32", "keep the defaults of the signature: "
                                   "score_matrix_bytes(n, batch=1, heads=1, dtype=torch.float32)")
        fail(summary, tried=tried, got=f"{got:.10g}", expected=f"{expected} bytes (batch × heads × n × n × bytes per entry)",
             cause=cause, fix=fix or "multiply batch × heads × n × n × the bytes of one entry")
    return f"exact on {len(_BYTE_CASES)} cases (float16, bfloat16, float32, float64; batch, heads, defaults)"


def _expect_int(raw, tried: str, expected: int) -> None:
    """The docstring asks for an int: a float (even a whole one) or a tensor is named as such."""
    if isinstance(raw, (int, np.integer)) and not isinstance(raw, (bool, np.bool_)):
        return
    kind = "a float" if isinstance(raw, (float, np.floating)) else _describe_kind(raw)
    fail(f"returned {kind}, not an int", tried=tried, got=f"{kind} equal to {expected}", expected=f"the int {expected}",
         cause="a / division, math.pow, math.sqrt or a float factor makes a float; a tensor stays a tensor"
         if kind == "a float" else "the count was computed with tensor operations, which return a tensor",
         fix="count with ints: // instead of /, ** instead of math.pow; .item() or int(…) turns a one-number "
             "tensor into an int")


def _describe_kind(raw) -> str:
    if isinstance(raw, torch.Tensor):
        kind = str(raw.dtype).replace("torch.", "")
        return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} tensor"
    if isinstance(raw, np.ndarray):
        return "a NumPy array"
    return f"a {type(raw).__name__}"


def _bytes_measured(got: float, expected: int, n: int, b: int, h: int, dtype: torch.dtype,
                    element: int) -> tuple[str, str, str] | None:
    """What a wrong byte count is, measured: a wrong size per entry, or a whole-number factor off."""
    name = str(dtype).replace("torch.", "")
    per_entry = got / (b * h * n * n)
    if per_entry in (1, 2, 4, 8, 16) and per_entry != element:
        return (f"{per_entry:g} bytes per {name} entry, not {element}", f"you counted {per_entry:g} bytes per entry "
                f"for {name}, which takes {element}", _ELEMENT_FIX)
    return _bytes_ratio(got / expected)


def _bytes_ratio(ratio: float) -> tuple[str, str, str] | None:
    """A count off by the same whole-number factor on every case."""
    for r, many in ((ratio, True), (1 / ratio if ratio else 0, False)):
        if r > 1 and abs(r - round(r)) < 1e-9:
            k = round(r)
            return (f"{k} times {'too many' if many else 'too few'} bytes",
                    f"your count is {k} times {'the right one' if many else 'smaller than the right one'}: "
                    f"your formula has a factor {k} {'too many' if many else 'missing'}", "")
    return None


