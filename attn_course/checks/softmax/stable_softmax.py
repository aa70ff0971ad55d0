"""The stable_softmax check: its table of known mistakes (which softmax_temperature reuses on x / T) and its
check."""

from __future__ import annotations

import torch

from ..core import Learner, check
from .body import SHIFT_FIX, K, axis, case_dim, default, explain_weights, judge_cases, score_cases


# ============================================================================ stable_softmax: its mistakes
# Shorthands for the tables: e normalised along dim; the same with the denominator kept from 0 (an epsilon, a clamp:
# 0/0 gives 0); e^(x − max) along dim.
norm = lambda e, dim: e / e.sum(dim, keepdim=True)  # noqa: E731
_eps = lambda e, dim: e / e.sum(dim, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)  # noqa: E731
e = lambda x, dim: torch.exp(x - x.amax(dim, keepdim=True))  # noqa: E731
_NAIVE = ("maximum not subtracted", "you exponentiated the scores as they are: e^x overflows to inf for scores near "
          "1000 (and underflows to 0 near -1000), and inf/inf or 0/0 is NaN", SHIFT_FIX)
_WHOLE = ("maximum taken over the whole tensor", "you subtracted the maximum of the whole tensor, not of each slice: a "
          "slice whose scores lie far below that maximum underflows to 0 (0/0 = NaN, or zeros behind an epsilon)",
          SHIFT_FIX)
_AXIS_FIX = "use `dim` in both the maximum and the sum: x.amax(dim, keepdim=True), e.sum(dim, keepdim=True)"
_SUM_FIX = "divide by the sum along dim: e / e.sum(dim, keepdim=True)"
_KEEPDIM = ("keepdim missing", "you reduced without keepdim=True, so the result broadcast against the wrong axis of x "
            "(each slice got another slice's value)", "keep the reduced axis: x.amax(dim, keepdim=True) and "
            "e.sum(dim, keepdim=True)")
SOFTMAX = [
    K("naive", *_NAIVE, lambda x, dim=-1: norm(torch.exp(x), dim)),
    K("naive-eps", *_NAIVE, lambda x, dim=-1: _eps(torch.exp(x), dim)),
    K("whole-max", *_WHOLE, lambda x, dim=-1: norm(torch.exp(x - x.max()), dim)),
    K("whole-max-eps", *_WHOLE, lambda x, dim=-1: _eps(torch.exp(x - x.max()), dim)),
    K("min", "minimum subtracted instead of the maximum", "you subtracted each slice's minimum: the largest score minus "
      "the smallest can exceed what e^x can hold, so e^x overflows", SHIFT_FIX,
      lambda x, dim=-1: norm(torch.exp(x - x.amin(dim, keepdim=True)), dim)),
    K("max-added", "maximum added instead of subtracted", "you exponentiated x + max where the shift is x − max: the "
      "largest score doubles, so e^(x + max) overflows as soon as 2·max passes e^x's range", SHIFT_FIX,
      lambda x, dim=-1: norm(torch.exp(x + x.amax(dim, keepdim=True)), dim)),
    K("mean-shift", "mean subtracted instead of the maximum", "you subtracted each slice's mean: a score far above the "
      "mean still overflows e^x (only the maximum guarantees every exponent ≤ 0)", SHIFT_FIX,
      lambda x, dim=-1: norm(torch.exp(x - x.mean(dim, keepdim=True)), dim)),
    K("whole-sum", "divided by the sum of the whole tensor", "you divided by the sum of e^(x − max) over every entry of "
      "the tensor, not over each slice along dim", _SUM_FIX, lambda x, dim=-1: e(x, dim) / e(x, dim).sum()),
    K("mean-sum", "divided by the mean, not the sum", "you divided e^(x − max) by its mean along dim where softmax "
      "divides by its sum, so every weight is n times too large (n = the slice's length)", _SUM_FIX,
      lambda x, dim=-1: e(x, dim) / e(x, dim).mean(dim, keepdim=True)),
] + [row for o in range(4) for row in (
    K(f"axis-{o}", f"softmax along axis {o}, not dim={{dim}}", f"you normalised along axis {o}, so the slices along "
      f"axis {o} sum to 1, not those along dim={{dim}}", _AXIS_FIX,
      lambda x, dim=None, o=o: torch.softmax(x, o) if axis(o, dim, x) else None),
    K(f"max-axis-{o}", "maximum taken along the wrong axis", f"you took the maximum along axis {o}, not along "
      "dim={dim}: that shift changes from entry to entry of a slice, so it does not cancel", _AXIS_FIX,
      lambda x, dim=None, o=o: norm(torch.exp(x - x.amax(o, keepdim=True)), dim) if axis(o, dim, x) else None),
    K(f"sum-axis-{o}", "sum taken along the wrong axis",
      f"you divided by the sum along axis {o}, not along dim={{dim}}", _AXIS_FIX,
      lambda x, dim=None, o=o: e(x, dim) / e(x, dim).sum(o, keepdim=True) if axis(o, dim, x) else None))
] + [
    K("keepdim-max", *_KEEPDIM, lambda x, dim=-1: norm(torch.exp(x - x.amax(dim)), dim)),
    K("keepdim-sum", *_KEEPDIM, lambda x, dim=-1: e(x, dim) / e(x, dim).sum(dim)),
    K("keepdim-both", *_KEEPDIM, lambda x, dim=-1: torch.exp(x - x.amax(dim)) / torch.exp(x - x.amax(dim)).sum(dim)),
    K("flat", "softmax over the whole tensor", "you took one softmax over every entry of the tensor", _AXIS_FIX,
      lambda x, dim=-1: torch.softmax(x.flatten(), 0).reshape(x.shape)),
    K("no-exp", "no exponential", "you divided the scores by their sum without exponentiating: weights can be negative "
      "or explode", "exponentiate first: e^(x - max) / Σ e^(x - max)", lambda x, dim=-1: norm(x, dim)),
    K("unnormalised", "not normalised", "you returned e^(x - max) without dividing by the sum", _SUM_FIX,
      lambda x, dim=-1: e(x, dim)),
    K("log-softmax", "log-softmax returned", "you returned x - logsumexp(x), the log of the weights",
      "return the weights themselves: exp of that, or e / e.sum(dim, keepdim=True)",
      lambda x, dim=-1: torch.log_softmax(x, dim)),
    K("sign", "sign flipped", "you exponentiated -x, so the smallest score gets the largest weight",
      "exponentiate x - max, not max - x", lambda x, dim=-1: torch.softmax(-x, dim)),
    K("times-sum", "multiplied by the sum", "you multiplied e^(x − max) by its sum where softmax divides by it",
      "divide: e / e.sum(dim, keepdim=True)", lambda x, dim=-1: e(x, dim) * e(x, dim).sum(dim, keepdim=True)),
    K("exp-missing", "exponential missing", "you normalised x − max without exponentiating it",
      "exponentiate before normalising: e = exp(x - max)", lambda x, dim=-1: norm(x - x.amax(dim, keepdim=True), dim)),
    K("log-for-exp", "log instead of exp", "you took the log of x − max where softmax exponentiates it",
      "e = torch.exp(x - max), then e / e.sum(dim, keepdim=True)",
      lambda x, dim=-1: norm(torch.log(x - x.amax(dim, keepdim=True)), dim)),
    K("argmax", "arg-max instead of softmax", "you put all the weight on the largest score (a one-hot of the arg-max): "
      "that is softmax's limit as the temperature goes to 0, not softmax", "weights = e / e.sum(dim, keepdim=True) with "
      "e = exp(x - max)", lambda x, dim=-1: (x == x.amax(dim, keepdim=True)).to(x.dtype)),
]


# ============================================================================ stable_softmax
@check("stable_softmax", expects="a function stable_softmax(x, dim=-1) returning weights shaped like x")
def check_stable_softmax(fn: Learner) -> str:
    cases = score_cases(3)
    run = judge_cases(fn, cases, signature="stable_softmax(x, dim=-1)", what="your weights",
                      oracle=lambda x, dim=-1: torch.softmax(x.double(), dim), expected="weights shaped like x",
                      table=default("sm", "normalised", torch.softmax) + SOFTMAX,
                      explain=lambda o, case, passed, tried: explain_weights(o, case[0], case_dim(case), tried=tried),
                      shape_fix="the weights have the shape of x: keep the reduced axis with keepdim=True before "
                                "dividing")
    return (f"matches torch.softmax on {len(cases)} cases ({run.kind}): any axis, 1-D to 4-D, float16/32/64, "
            "stable at ±1000, -inf entries")
