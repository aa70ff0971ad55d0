"""The logsumexp check: its table of known mistakes, the wrong logsumexps (kept axis) that log_softmax reuses, and
what a wrong answer on -inf scores measures."""

from __future__ import annotations

import math

import torch

from .. import kit
from ..core import Learner, check, fail, fmt
from .body import K, case_dim, default, judge_cases, score_cases


_LSE = "logsumexp(x) = m + log Σ e^(x − m), m = x.amax(dim, keepdim=True)"
_NO_EXP = ("exponential missing", "you summed x − m (or its log) where logsumexp sums e^(x − m): those terms are ≤ 0, "
           "so the log of their sum is NaN", _LSE)
_LOG_BASE = ("log base 2 or 10", "you used log2 or log10 where logsumexp uses the natural log", "use torch.log (ln)")
m = lambda x, dim: x.amax(dim, keepdim=True)  # noqa: E731 - the maximum m of each slice, kept
s = lambda z, dim: torch.exp(z).sum(dim, keepdim=True)  # noqa: E731 - Σ e^z along dim, kept

#: Wrong versions of logsumexp with the reduced axis kept, (key, summary, cause, fix, value(x, dim)): the logsumexp
#: check squeezes them, the log_softmax check subtracts them from x.
SLIPS = [
    ("naive", "maximum not subtracted", "you computed log Σ e^x directly: e^x overflows to inf near 1000, and near "
     "-1000 the sum underflows to 0 and log 0 = -inf", _LSE, lambda x, d: torch.log(s(x, d))),
    ("no-add-back", "maximum not added back", "you subtracted the maximum inside the log but did not add it back: "
     "every slice is off by its maximum", _LSE, lambda x, d: torch.log(s(x - m(x, d), d))),
    ("whole-max", "maximum taken over the whole tensor", "you shifted by the maximum of the whole tensor: a slice far "
     "below it underflows to log 0 = -inf", _LSE, lambda x, d: x.max() + torch.log(s(x - x.max(), d))),
    ("lse-log-subtracted", "log term subtracted", "you subtracted log Σ e^(x − m) from m; logsumexp adds it", _LSE,
     lambda x, d: m(x, d) - torch.log(s(x - m(x, d), d))),
    ("lse-no-log", "log missing", "you added Σ e^(x − m) itself to m, without its log", _LSE,
     lambda x, d: m(x, d) + s(x - m(x, d), d)),
    ("lse-exp-for-log", "exp where the log belongs", "you applied exp to Σ e^(x − m) where logsumexp takes its log",
     _LSE, lambda x, d: m(x, d) + torch.exp(s(x - m(x, d), d))),
    ("lse-no-exp", *_NO_EXP, lambda x, d: m(x, d) + torch.log((x - m(x, d)).sum(d, keepdim=True))),
    ("lse-log-no-exp", *_NO_EXP, lambda x, d: m(x, d) + torch.log(torch.log(x - m(x, d)).sum(d, keepdim=True))),
    ("lse-exp-of-m", "exponential of the maximum, not of x − m", "you exponentiated m, the slice's maximum, where "
     "logsumexp exponentiates x − m: the scores drop out, the sum is the single term e^m, and each slice gives 2m",
     _LSE, lambda x, d: m(x, d) + torch.log(s(m(x, d), d))),
    ("lse-max-added", "maximum added inside the exponential", "you exponentiated x + m where it must be x − m", _LSE,
     lambda x, d: m(x, d) + torch.log(s(x + m(x, d), d))),
    ("lse-outside", "maximum subtracted only outside", "you exponentiated x itself and added m outside: the shift must "
     "happen inside the exponential too", _LSE, lambda x, d: m(x, d) + torch.log(s(x, d))),
    ("lse-mean", "mean instead of sum", "you took the log of the mean of e^(x − m), not of the sum: that is logsumexp "
     "minus log n", "sum the exponentials: .sum(dim), not .mean(dim)",
     lambda x, d: m(x, d) + torch.log(torch.exp(x - m(x, d)).mean(d, keepdim=True))),
    ("lse-log2", *_LOG_BASE, lambda x, d: m(x, d) + torch.log2(s(x - m(x, d), d))),
    ("lse-log10", *_LOG_BASE, lambda x, d: m(x, d) + torch.log10(s(x - m(x, d), d))),
    ("lse-log1p", "log1p for log", "you took log1p of the sum, log(1 + Σ e^(x − m)), where logsumexp takes "
     "log Σ e^(x − m)", "use torch.log: log1p(y) is log(1 + y), another function",
     lambda x, d: m(x, d) + torch.log1p(s(x - m(x, d), d))),
    ("lse-from-zero", "an extra 1 inside the log: log(1 + Σ e^x)", "your result is log(1 + Σ e^x): an extra e^0 = 1 "
     "inside the log, off wherever the scores are not far above 0 — a running logaddexp started from 0 (acc = 0, "
     "then acc = logaddexp(acc, v) for each score), a 1 + (or log1p) before the log, or a score 0 appended give "
     "these numbers", "add e^x of the scores only: start a running value at -inf (e^-inf = 0), or at the slice's "
     "first score; no 1 + or log1p",
     lambda x, d: torch.logaddexp(torch.logsumexp(x, d, keepdim=True), x.new_zeros(()))),
] + [row for o in range(4) for row in (
    (f"lse-sum-axis-{o}", "sum taken along the wrong axis", f"you summed e^(x − m) along axis {o}, not along dim", _LSE,
     lambda x, d, o=o: m(x, d) + torch.log(torch.exp(x - m(x, d)).sum(o, keepdim=True)) if kit.other_axis(o, d, x)
     else None),
    (f"lse-max-axis-{o}", "maximum taken along the wrong axis", f"you took the maximum along axis {o}, not along dim: m "
     "must be one number per slice along dim", _LSE,
     lambda x, d, o=o: m(x, o) + torch.log(s(x - m(x, o), d)) if kit.other_axis(o, d, x) else None))]

LOGSUMEXP = [
    K("max-only", "maximum only", "you returned the maximum of each slice, without the log Σ e^(x − m) term",
      "add log Σ e^(x − m)", lambda x, dim=-1: x.amax(dim)),
    K("max-subtracted", "maximum subtracted outside the log", "you subtracted the maximum outside the log where it must "
      "be added: logsumexp(x) = m + log Σ e^(x − m)", "add m: m + log Σ e^(x − m)",
      lambda x, dim=-1: torch.log(torch.exp(x - m(x, dim)).sum(dim)) - x.amax(dim)),
    K("sum-of-scores", "sum of the scores", "you summed the scores: logsumexp sums e^x and then takes the log",
      "compute m + log Σ e^(x − m)", lambda x, dim=-1: x.sum(dim)),
    K("max-log-n", "maximum plus log n", "you returned max + log n, which is logsumexp only when all scores are equal",
      "compute m + log Σ e^(x − m): the sum depends on every score",
      lambda x, dim=-1: x.amax(dim) + math.log(x.shape[dim])),
    K("log-softmax", "log-softmax returned", "you returned x − logsumexp(x) (log-softmax), not logsumexp",
      "return m + log Σ e^(x − m), one number per slice", lambda x, dim=-1: torch.log_softmax(x, dim)),
    K("kept", "reduced axis kept", "you kept the reduced axis (keepdim=True): the docstring removes it, like "
      "torch.logsumexp(x, dim)", "drop the axis: .squeeze(dim) at the end, or reduce without keepdim",
      lambda x, dim=-1: torch.logsumexp(x, dim, keepdim=True)),
    K("squeeze-all", "squeeze() removed every size-1 axis", "you called .squeeze() without an axis, so size-1 axes other "
      "than dim were removed too", "squeeze only the reduced axis: .squeeze(dim)",
      lambda x, dim=-1: torch.logsumexp(x, dim, keepdim=True).squeeze()),
    K("keepdim-max", "keepdim missing on the maximum", "you took the maximum without keepdim=True, so it broadcast against "
      "the wrong axis of x", "m = x.amax(dim, keepdim=True); squeeze only at the end",
      lambda x, dim=-1: x.amax(dim) + torch.log(torch.exp(x - x.amax(dim)).sum(dim))),
    K("squeeze-max", "squeeze() on the maximum", "you removed m's axes with .squeeze() (no axis), which also drops the "
      "other size-1 axes, so m no longer lines up with the sum it is added to",
      "m.squeeze(dim), or keep both with keepdim=True and squeeze(dim) once at the end",
      lambda x, dim=-1: m(x, dim).squeeze() + torch.log(torch.exp(x - m(x, dim)).sum(dim))),
] + [K(f"axis-{o}", f"reduced along axis {o}, not along dim", f"you reduced along axis {o}",
       "reduce along `dim` in the maximum and in the sum",
       lambda x, dim=None, o=o: torch.logsumexp(x, o) if kit.other_axis(o, dim, x) else None) for o in range(4)
     ] + [K(key, s, c, f, lambda x, dim=-1, v=v: v(x, dim).squeeze(dim)) for key, s, c, f, v in SLIPS] + [
    K("squeeze-last", "squeezed the wrong axis", "you removed the last axis, not the reduced axis `dim`",
      "squeeze the axis you reduced: .squeeze(dim)", lambda x, dim=-1: None if x.ndim < 2 or dim % x.ndim == x.ndim - 1
      else torch.logsumexp(x, dim, keepdim=True).squeeze(-1)),
    K("keepdim-sum", "keepdim missing on the sum", "you summed without keepdim=True and added the kept maximum, so the two "
      "broadcast into a matrix", "keep both axes (keepdim=True), squeeze once at the end",
      lambda x, dim=-1: (m(x, dim) + torch.log(torch.exp(x - m(x, dim)).sum(dim))).squeeze(dim)),
]


def _explain_lse(out: torch.Tensor, case: tuple, passed: list, tried: str) -> None:
    x, d = case[0], case_dim(case)
    o, e = out.detach().double(), torch.logsumexp(x.double(), d)
    if (bad := ~torch.isfinite(o) & torch.isfinite(e)).any():
        kinds = kit.nan_or_inf(o[bad])
        kit.explain_nonfinite(bad.unsqueeze(d).expand_as(x), x.double(), x.dtype, tried=tried, kinds=kinds,
                              got=f"{kinds} in {int(bad.sum())} of {o.numel()} entries", expected="finite values")
    wrong, masked = ~torch.isclose(o, e, atol=1e-4, rtol=1e-4, equal_nan=True), torch.isneginf(x).any(d)
    if not wrong.any() or (wrong & ~masked).any() or not torch.isfinite(o[wrong]).all():
        return
    # Had every -inf score been replaced by one finite c, each wrong slice would give o = log(e^e + k·e^c): solve for
    # c (k = the slice's number of -inf scores) and see whether one c explains them all.
    gap, k = (o - e)[wrong], torch.isneginf(x).sum(d).double()[wrong]
    fills = o[wrong] + torch.log(-torch.expm1(-gap.clamp(min=1e-300))) - torch.log(k)
    one = bool((gap > 0).all()) and float(fills.max() - fills.min()) <= 1e-3 * max(1.0, float(fills.abs().max()))
    c = float(fills.mean())
    c = float(round(c)) if abs(c - round(c)) <= 1e-3 * max(1.0, abs(c)) else c  # rounding blurs a whole-number fill
    fail("-inf scores counted as finite" if one else "wrong in slices with -inf scores", tried=tried,
         got=f"in {int(wrong.sum())} of the {int(masked.sum())} slices holding -inf, your result is what every -inf "
             f"score replaced by {fmt(c)} would give" if one else f"your result is wrong in {int(wrong.sum())} slice(s) "
             "holding -inf scores (right wherever a slice has no -inf, and on the cases before this one)",
         expected="-inf scores adding nothing to the sum (e^-inf = 0)",
         cause=f"your code turns -inf scores into {fmt(c)} (a fill, nan_to_num or a clamp), so each adds e^{fmt(c)} to "
               "the sum" if one else "",
         fix="leave -inf scores as they are: m + log Σ e^(x − m) handles them, since e^(-inf − m) = 0")


@check("logsumexp", expects="a function logsumexp(x, dim=-1) returning log Σ e^x along dim, dim removed")
def check_logsumexp(fn: Learner) -> str:
    cases = score_cases(4)
    run = judge_cases(fn, cases, signature="logsumexp(x, dim=-1)", expected="log Σ e^x along dim, dim removed",
                      oracle=lambda x, dim=-1: torch.logsumexp(x.double(), dim), atol=1e-4, reduced=False,
                      table=default("lse", "reduced", torch.logsumexp) + LOGSUMEXP, explain=_explain_lse,
                      shape_fix="the result has the shape of x with `dim` removed, like torch.logsumexp(x, dim)")
    return f"matches torch.logsumexp on {len(cases)} cases ({run.kind}): any axis, 1-D to 4-D, finite at ±1000"
