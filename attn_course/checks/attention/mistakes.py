"""check_attention's tables of known mistakes, each reproduced from (Q, K, V, mask) as the oracle is: the weights'
and the output's; then what is measured of the weights when no mistake reproduces them."""

from __future__ import annotations

import math

import torch

from ..core import fail, fmt
from ..kit import Known, clamp_cause, narrowing_calls
from ..kit import epsilon_in_the_sum as epsilon_in_the_sum_of
from ..kit.measure import DIGITS, lower_precision
from .cases import Case, oracle, scaled_scores


# ============================================================================ the weights' known mistakes
def _fill(s: torch.Tensor, mask: torch.Tensor | None, value: float = -math.inf) -> torch.Tensor:
    return s if mask is None else s.masked_fill(~mask, value)


def soft(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return torch.softmax(s, dim)


def _naive(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)


def _right(Q, K, mask):
    return soft(_fill(scaled_scores(Q, K), mask))


_DIM_FIX = "take the softmax over the last axis, torch.softmax(scores, dim=-1): each query's row sums to 1"
_QUERIES = "you took the softmax over the queries' axis (axis -2): each column sums to 1, not each row"
_SCALE_FIX = "scale by √d_k, the width of Q and K, counted from the end: Q.shape[-1]"
_INF_FIX = "fill the blocked scores with float('-inf') before the softmax"
MASK_FIX = "scores.masked_fill(~mask, float('-inf'))"
_AFTER = ("mask applied after the softmax", "you masked the weights after the softmax, so the rows no longer sum to 1",
          "fill the blocked *scores* with float('-inf') before the softmax")
_POLARITY = ("mask polarity inverted", "you blocked where the mask is True; here (as in F.scaled_dot_product_attention)"
             " True means 'may attend'", f"fill the scores where the mask is False: {MASK_FIX}")
_WEAK = ("a fill value too weak for these scores", "you filled blocked scores with a finite negative number: next to "
         "scores of ±3·10⁴ it is not 'minus infinity', so blocked keys still get weight",
         "fill with float('-inf') (or torch.finfo(scores.dtype).min)")
_NAIVE = ("softmax without subtracting the maximum", "your softmax exponentiates the raw scores: e^1000 overflows to "
          "inf and e^-1000 underflows to 0, and inf/inf or 0/0 is NaN",
          "subtract each row's maximum before exp, or use torch.softmax")
_ADDED = ("bool mask added to the scores", f"fill the blocked scores with -inf: {MASK_FIX}")
_FILLS = (-1e4, -1e3, -1e5, -1e2)
_NOKEEPDIM = "without keepdim=True: shape (..., n_q) lines up with the keys' axis, so"


def mistakes_of_weights(cases: list[Case]) -> list[Known]:
    """The weights' table: each ``make`` takes (Q, K, V, mask), as the oracle does."""
    def scale(key, summary, cause, fix, by):  # softmax(Q Kᵀ / by(Q, K, V)), masked
        return Known(key, summary, cause, fix, lambda Q, K, V, m: soft(_fill(Q @ K.mT / by(Q, K, V), m)))

    def scaled(key, summary, cause, fix, then):  # then(masked scaled scores, Q, K, mask)
        return Known(key, summary, cause, fix, lambda Q, K, V, m: then(_fill(scaled_scores(Q, K), m), Q, K, m))

    def raw(key, summary, cause, fix, then):  # then(scaled scores before any mask, mask)
        return Known(key, summary, cause, fix, lambda Q, K, V, m: then(scaled_scores(Q, K), m))

    return [
        # softmax(dim=-2), or softmax(dim=d) written for input of d + 1 axes: on n-D input it takes the queries'
        # axis (d = n - 2: the same text, so that two ways to one mistake are named once) or a batch axis
        scaled("dim-2", "softmax over axis -2 (the queries)", _QUERIES, _DIM_FIX, lambda s, *_: soft(s, -2)),
        *[scaled(f"dim{d}-{n}D", "softmax over axis -2 (the queries)" if d == n - 2 else f"softmax over axis {d} (a "
                 "batch axis)", _QUERIES if d == n - 2 else f"you took the softmax over axis {d}, a batch axis of this "
                 "input", _DIM_FIX, lambda s, *_, d=d, n=n: soft(s, d) if s.dim() in (n, d + 1) else None)
          for n in (2, 3, 4) for d in range(n - 1)],
        scaled("flat", "softmax over the whole matrix", "you took one softmax over the whole (n_q, n_k) matrix",
               _DIM_FIX, lambda s, *_: soft(s.flatten(-2)).reshape(s.shape)),
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
              "Q @ K.mT / math.sqrt(d_k)", lambda Q, K, V, m: soft(_fill(K.mT / math.sqrt(Q.shape[-1]), m))),
        Known("transposed", "weights transposed", "you returned the weights with queries and keys swapped",
              "keep weights[..., i, j] = how much query i attends to key j", lambda Q, K, V, m: _right(Q, K, m).mT),
        Known("reshape", "K reshaped instead of transposed", "reshape or view keeps K's numbers in memory order: it "
              "does not swap rows and columns", "transpose: K.transpose(-2, -1) (or K.mT)", lambda Q, K, V, m: soft(
                  _fill(Q @ K.reshape(*K.shape[:-2], K.shape[-1], K.shape[-2]) / math.sqrt(Q.shape[-1]), m))),
        scaled("sigmoid", "sigmoid instead of softmax", "torch.sigmoid treats each score on its own, so a row's "
               "weights do not share one total", "use torch.softmax(scores, dim=-1)", lambda s, *_: torch.sigmoid(s)),
        *[Known(f"scores{fill}", "scores returned as weights", "you returned the scores from before the softmax",
                "return weights = torch.softmax(scaled scores, dim=-1)",
                lambda Q, K, V, m, fill=fill: _fill(scaled_scores(Q, K), m, fill)) for fill in (-math.inf, 0.0)],
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
              "divide Q Kᵀ by math.sqrt(d_k), then take the softmax", lambda Q, K, V, m: soft(_fill(Q @ K.mT, m))
              / math.sqrt(Q.shape[-1])),
        scaled("globalmax", "maximum over the whole tensor", "you subtracted the whole tensor's maximum, not each "
               "row's: a row far below it underflows to 0 and 0/0 is NaN", "subtract each row's maximum: "
               "scores.amax(dim=-1, keepdim=True)", lambda s, *_: _naive(s - s.max())),
        raw("causal-always", "a causal mask although none was given", "with mask=None your function still blocked "
            "the later keys (j > i)", "block keys only where the mask argument says so", lambda s, m: None if m is not
            None else soft(s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf))),
        # -------- the mask (each make raises, so is no suspect, where mask is None)
        raw("mask-T", "mask transposed", "you applied the mask with its last two axes swapped (mask.T): mask[..., i, "
            "j] says whether query i may attend to key j", f"use the mask as it is: {MASK_FIX}",
            lambda s, m: soft(_fill(s, m.mT)) if m.dim() >= 2 else None),
        raw("ignored", "mask ignored", "you did not use the mask, so blocked keys still get weight", _INF_FIX,
            lambda s, m: soft(s) if m is not None else None),
        *[raw(f"ignored-{shape}", f"mask of shape {shape} ignored", "your code applies the mask only for some shapes "
              "(an `if` on its shape, or a reshape)", f"apply any mask that broadcasts: {MASK_FIX} broadcasts by "
              "itself", lambda s, m, shape=shape: soft(s if tuple(m.shape) == shape else _fill(s, m)))
          for shape in dict.fromkeys(tuple(c.mask.shape) for c in cases if c.mask is not None)],
        raw("plus-inverted", _ADDED[0], "you added a 0/1 version of the mask to the scores: adding 1 shifts scores a "
            "little and blocks nothing", _ADDED[1], lambda s, m: soft(s + (~m).to(s.dtype))),
        raw("plus", _ADDED[0], "you added the boolean mask to the scores: True counts as +1, which blocks nothing",
            _ADDED[1], lambda s, m: soft(s + m.to(s.dtype))),
        raw("after*", *_AFTER, lambda s, m: soft(s) * m),
        raw("after-inf", *_AFTER, lambda s, m: soft(s).masked_fill(~m, -math.inf)),
        raw("renorm", "mask applied after the softmax, then renormalised", "you zeroed the blocked weights of a "
            "softmax over all keys, then divided by the row sums: next to far larger blocked scores the allowed "
            "weights underflow to 0, and 0/0 = NaN", _INF_FIX,
            lambda s, m: (w := soft(s) * m) / w.sum(-1, keepdim=True)),
        *[raw(f"polarity{fill}", *_POLARITY, lambda s, m, fill=fill: soft(s.masked_fill(m, fill)))
          for fill in (-math.inf, -1e9)],
        raw("times-mask", "mask multiplied into the scores", "a blocked score became 0 (the scores multiplied by the "
            "mask, or the blocked ones filled with 0), not -inf, and e^0 = 1 still gives it weight",
            "fill the blocked scores with -inf (masked_fill or torch.where)", lambda s, m: soft(s * m)),
        raw("nan-additive", "0 × (-inf) = NaN in an additive mask", "you built the additive mask as (~mask) * "
            "float('-inf'): 0 × (-inf) is NaN, so every row with an allowed key became NaN", "build it with "
            "masked_fill: torch.zeros_like(scores).masked_fill(~mask, float('-inf'))",
            lambda s, m: soft(s + (~m).to(s.dtype) * -math.inf)),
        # a finite fill: on the scaled scores, before the scaling, or added
        *[raw(f"weak{f}", *_WEAK, lambda s, m, f=f: soft(_fill(s, m, f))) for f in _FILLS],
        *[Known(f"weak-pre{f}", *_WEAK, lambda Q, K, V, m, f=f: soft(_fill(Q @ K.mT, m, f) / math.sqrt(Q.shape[-1])))
          for f in _FILLS],
        *[raw(f"weak+{f}", *_WEAK, lambda s, m, f=f: soft(s + (~m).to(s.dtype) * f)) for f in _FILLS],
    ]


_OUT_FIX = "output = weights @ V"
_BEFORE = ("V multiplied before the softmax", "you multiplied by V before taking the softmax, so the output is a "
           "softmax over features", "take the softmax of the scaled scores first; then output = weights @ V")
MISTAKES_OF_OUTPUT = [
    Known("before", *_BEFORE, lambda Q, K, V, m: soft(scaled_scores(Q, K) @ V)),
    Known("before-masked", *_BEFORE, lambda Q, K, V, m: soft(_fill(scaled_scores(Q, K), m) @ V)),
    Known("scores@V", "output from the raw scores", "you multiplied V by the scores, not by the weights",
          "output = weights @ V, with weights = softmax(…)", lambda Q, K, V, m: scaled_scores(Q, K) @ V),
    Known("wT@V", "output from transposed weights", "you multiplied V by the transposed weights", _OUT_FIX,
          lambda Q, K, V, m: _right(Q, K, m).mT @ V),
    Known("w@K", "output from K instead of V", "you multiplied the weights by K, not by V", _OUT_FIX,
          lambda Q, K, V, m: _right(Q, K, m) @ K),
    Known("V", "V returned as the output", "you returned V itself, not weights @ V", _OUT_FIX, lambda Q, K, V, m: V),
    *[Known(f"{str(low)[6:]}-{key}", f"{what} rounded to {str(low)[6:]} for weights @ V", f"you converted {what} to "
            f"{str(low)[6:]} ({narrowing_calls(low).split(',')[0]}) before weights @ V: {str(low)[6:]} keeps about "
            f"{DIGITS[low]} significant digits, and the output inherits that rounding", "keep the inputs' dtype for "
            "weights @ V (a wider dtype inside is fine, a narrower one is not)",
            lambda Q, K, V, m, low=low, both=both: (_right(Q, K, m).to(low) if both else _right(Q, K, m)).to(V.dtype)
            @ V.to(low).to(V.dtype)) for low in (torch.float16, torch.bfloat16)
      for key, what, both in (("V", "V", False), ("wV", "the weights and V", True))],
    Known("w", "weights returned as the output", "you returned the weights where the output belongs", _OUT_FIX,
          lambda Q, K, V, m: _right(Q, K, m)),
    Known("unmasked@V", "output from the unmasked weights", "you computed the output from the weights before the "
          "mask", "compute the output from the masked weights you return: output = weights @ V",
          lambda Q, K, V, m: soft(scaled_scores(Q, K)) @ V if m is not None else None),
]


# ========================================================================= the weights, when no mistake matches
NO_DROPOUT = "leave dropout out of this function (or pass training=False)"
_FINITE = "finite weights, every row summing to 1"


def _effective_scale(w: torch.Tensor, case: Case) -> float | None:
    """The one c for which the weights (shaped as the scores) are softmax(Q Kᵀ / c) on every row's allowed keys."""
    scores, allowed = (case.Q @ case.K.mT).to(torch.float64), case.allowed
    if not (w[allowed] > 0).all():
        return None
    logw = torch.where(allowed, torch.log(w.clamp_min(1e-300)), 0.0)
    # Centre log-weights and scores over each row's allowed keys; then logw = scores / c on every row.
    count = allowed.sum(-1, keepdim=True).clamp_min(1)
    x = torch.where(allowed, scores - (scores * allowed).sum(-1, keepdim=True) / count, 0.0)
    y = torch.where(allowed, logw - (logw * allowed).sum(-1, keepdim=True) / count, 0.0)
    slope = float((x * y).sum() / (x * x).sum()) if float((x * x).sum()) >= 1e-12 else 0.0
    return 1 / slope if abs(slope) >= 1e-9 and torch.allclose(y, slope * x, atol=1e-4, rtol=1e-3) else None


def structure(w: torch.Tensor, case: Case, tried: str, passed_dks: set[int]) -> None:
    """When no known mistake reproduces the weights, say which property of them is off."""
    w, scaled, allowed = w.to(torch.float64), case.scaled, case.allowed
    if w.shape != scaled.shape:
        return
    if torch.isnan(w).any():
        nan_rows = torch.isnan(w).any(-1)  # (..., n_q)
        where = f"NaN in {int(nan_rows.sum())} of {nan_rows.numel()} rows"
        limit = math.log(torch.finfo(scaled.dtype).max)  # e^x overflows above it
        if torch.equal(nan_rows, torch.isinf(torch.exp(scaled.masked_fill(~allowed, -math.inf))).any(-1)):
            fail("NaN where exp overflowed", tried=tried, got=f"{where}: exactly the rows with an allowed score above "
                 f"{fmt(limit)}, where e^score is inf", expected=_FINITE, cause=_NAIVE[1], fix=_NAIVE[2])
        spread = scaled.masked_fill(~allowed, -math.inf).amax(-1) - scaled.masked_fill(~allowed, math.inf).amin(-1)
        if torch.equal(nan_rows, spread > limit):
            fail("NaN where exp overflowed after a shift by the minimum", tried=tried, got=f"{where}: exactly the rows "
                 f"whose allowed scores span more than {fmt(limit)}", expected=_FINITE,
                 cause="you subtracted each row's minimum, not its maximum: in a row whose scores span more than "
                 "that, the largest shifted score overflows e^x to inf, and inf/inf is NaN",
                 fix="subtract each row's maximum: scores.amax(dim=-1, keepdim=True)")
        if torch.equal(nan_rows, (soft(scaled) * allowed).sum(-1) == 0):
            fail("NaN where the allowed weights underflow", tried=tried, got=f"{where}: exactly the rows where a "
                 "softmax over all keys gives every allowed key weight 0", expected=_FINITE, cause="blocked keys took "
                 "part in a softmax before being removed: the allowed weights underflowed to 0, then 0/0", fix=_INF_FIX)
        fail("NaN in the weights", tried=tried, got=where, expected=_FINITE,
             fix="print your intermediate tensors on this input: which step first holds NaN?")
    if (w < -1e-12).any() or (w > 1 + 1e-9).any():
        fail("weights outside [0, 1]", tried=tried, got=f"weights from {fmt(float(w.min()))} to {fmt(float(w.max()))}",
             expected="weights between 0 and 1 (a softmax)", fix="the weights are torch.softmax(scaled scores, dim=-1)")
    exp_w = oracle(case)[1].to(torch.float64)
    # rounding to d decimals moves no weight by more than half a unit of the last decimal: weights that merely
    # land on round values (ties of 1/2, 1/4 from clamped or collapsed scores) are off by far more
    if (decimals := _rounded_to(w)) and not _rounded_to(exp_w) and \
            float((w - exp_w).abs().max()) <= 0.5 * 10.0 ** -decimals + 1e-9:
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
                 fix=f"lower the blocked scores: {MASK_FIX}")
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
                 f"at random and multiplies the rest by {fmt(c)}", fix=NO_DROPOUT)
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


# ========================================================================= precision: narrower scores, float64 digits
def _rounded_ways(case: Case, low: torch.dtype) -> list[torch.Tensor]:
    """The weights when the scores go through ``low``: Q and K rounded (the product too, or not), or the product
    rounded before or after the division by √d_k; the rest in float64."""
    Q, K, mask = case.Q.double(), case.K.double(), case.mask
    r = lambda t: t.to(low).to(torch.float64)  # noqa: E731
    root = math.sqrt(Q.shape[-1])
    return [soft(_fill(s, mask)) for s in (r(Q) @ r(K).mT / root, r(r(Q) @ r(K).mT) / root, r(Q @ K.mT) / root,
                                             r(Q @ K.mT / root))]


def rounded_scores(w: torch.Tensor, case: Case, tried: str) -> None:
    """Fail naming the dtype when the weights, wrong, are the softmax of scores computed in float16 or bfloat16 (to a
    float32 softmax's rounding), which no right answer is."""
    right = oracle(case)[1].double()
    if tuple(w.shape) != tuple(right.shape) or not w.is_floating_point():
        return
    for low in (torch.float16, torch.bfloat16):
        if _BITS.get(low, 0) >= _BITS.get(case.Q.dtype, 0):
            continue
        for made in _rounded_ways(case, low):
            if not torch.allclose(made, right, atol=case.atol, rtol=1e-5) and \
                    torch.allclose(w.double(), made, atol=1e-5, rtol=1e-4):
                name = str(low)[6:]
                fail(f"scores computed in {name}", tried=tried, got=f"the weights of a softmax of the scores rounded to "
                     f"{name}, to the last digits", expected=f"the weights at {str(case.Q.dtype)[6:]} precision",
                     cause=f"you computed Q Kᵀ in {name} ({narrowing_calls(low).split(',')[0]} on Q and K, or on the "
                     f"scores): {name} keeps about {DIGITS[low]} significant digits, and every weight inherits that "
                     "rounding, even with the softmax in a wider dtype",
                     fix="keep the inputs' dtype for Q @ K.transpose(-2, -1) (a wider dtype inside is fine)")


_BITS = {torch.float64: 53, torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}


def epsilon_in_the_sum(w: torch.Tensor, case: Case, tried: str) -> None:
    """Fail naming it when the weights are, to float64 rounding, e / (Σe + ε) for one ε > 0 on every row,
    e = exp(scaled scores − the row's maximum allowed one) (Σe ≥ 1; :func:`~..kit.epsilon_in_the_sum`)."""
    right, s = oracle(case)[1].double(), _fill(case.scaled.double(), case.mask)
    if tuple(w.shape) != tuple(right.shape) or not w.is_floating_point():
        return
    sums = torch.broadcast_to(torch.exp(s - s.amax(-1, keepdim=True)).sum(-1), right.shape[:-1])
    value = epsilon_in_the_sum_of(w, right, sums, atol=1e-12, rtol=1e-9)
    if value is not None:
        w = w.double()
        fail("an epsilon added to the softmax's sum", tried=tried, got=f"the weights are e / (Σe + {value:.2g}): "
             f"rows summing to {fmt(float(w.sum(-1).min()))} … {fmt(float(w.sum(-1).max()))}",
             expected="every row summing to 1", cause=f"you added an epsilon (about {value:.2g}) to each row's sum "
             "of exponentials; after subtracting the row's maximum that sum is at least 1, never 0 (every query "
             "may attend to a key)", fix="divide by the sum itself, or use torch.softmax")


def float64_digits(w: torch.Tensor, out: torch.Tensor, case: Case, tried: str) -> None:
    """On float64 input, fail when the results, right within the tolerance, are off by more than float64 rounding (the
    docstring: computed at the inputs' precision), or a blocked key's weight is not exactly 0."""
    if case.Q.dtype != torch.float64:
        return
    exp_out, exp_w = (t.double() for t in oracle(case))
    blocked = w.detach().double()[~case.allowed]
    if bool((blocked != 0).any()):
        low = float(blocked.min())
        fail("blocked keys get a tiny weight, not 0", tried=tried, got=f"weights up to {fmt(float(blocked.max()))} on "
             "blocked keys", expected="weight exactly 0 on every blocked key, as the docstring says",
             cause=clamp_cause(w, exp_w, case.allowed, low), fix=f"{MASK_FIX}: e^-inf is 0 exactly")
    for what, got, right in (("the weights", w, exp_w), ("the output", out, exp_out)):
        error = float((got.double() - right).abs().max() / right.abs().max().clamp_min(1e-300))
        if error > 1e-10:  # float64 rounding stays near 1e-16
            if what == "the weights":
                epsilon_in_the_sum(got, case, tried)
            lower_precision(got, case.Q.dtype, tried=tried, what=what)
            fail(f"{what[4:]} not at float64 precision", tried=tried, got=f"{what} off by up to {error:.1e} of the largest "
                 f"value: about {-math.log10(error):.0f} correct digits", expected="float64's ~16 digits (the "
                 "docstring: computed at the inputs' precision)", fix="keep every step in the inputs' dtype: no "
                 ".float(), no float32 constants or accumulators (tensors made without dtype=), no epsilon in the sum")
