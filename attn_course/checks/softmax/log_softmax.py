"""The log_softmax check: its table of known mistakes and what a wrong answer measures (a log of probabilities that
underflowed, -inf scores filled)."""

from __future__ import annotations

import torch

from .. import kit
from ..core import Learner, check, fail, fmt
from .body import K, case_dim, default, explain_weights, judge_cases, score_cases
from .logsumexp import SLIPS, m, s


_LOG_OF = ("log of the softmax", "you took the log of the weights: a weight that underflowed to 0 gives log 0 = -inf, "
           "although its true log-probability is an ordinary number", "compute x − logsumexp(x) along dim, never "
           "log(softmax(x))")
_LS_FIX = "x − (m + log Σ e^(x − m)) with m = x.amax(dim, keepdim=True)"
_RETURN = "return x − logsumexp(x)"
_LN = "compute x − logsumexp(x) (natural log throughout)"
LOG_SOFTMAX = [
    K("log-of", *_LOG_OF, lambda x, dim=-1: torch.log(torch.softmax(x, dim))),
    K("log-of-e", *_LOG_OF, lambda x, dim=-1: torch.log(kit.normalised(kit.exp_shifted(x, dim), dim))),
    K("naive-log-of", "maximum not subtracted", "you took the log of a softmax computed without subtracting the maximum",
      _LS_FIX, lambda x, dim=-1: torch.log(torch.exp(x) / s(x, dim))),
    K("keepdim", "keepdim missing", "you reduced without keepdim=True, so logsumexp broadcast against the wrong axis (each "
      "slice got another slice's normaliser)", "keep the axis: logsumexp with keepdim=True",
      lambda x, dim=-1: x - torch.logsumexp(x, dim)),
    K("softmax", "softmax returned", "you returned the weights, not their log", _RETURN,
      lambda x, dim=-1: torch.softmax(x, dim)),
    K("sign", "sign flipped", "you returned logsumexp(x) − x, the negative log-probabilities", _RETURN,
      lambda x, dim=-1: torch.logsumexp(x, dim, keepdim=True) - x),
    K("minus-max", "maximum subtracted instead of logsumexp", "you returned x − max, which is not normalised: exp of it "
      "does not sum to 1", "subtract logsumexp(x), not only the maximum", lambda x, dim=-1: x - m(x, dim)),
    K("log10", "log base 10", "you took log10 of the weights; log-probabilities use the natural log", _LN,
      lambda x, dim=-1: torch.log10(torch.softmax(x, dim))),
    K("log2", "log base 2", "you took log2 of the weights; log-probabilities use the natural log", _LN,
      lambda x, dim=-1: torch.log2(torch.softmax(x, dim))),
] + [K(f"axis-{o}", f"log-softmax along axis {o}", f"you normalised along axis {o}, not along dim",
       "use `dim` in the maximum and the sum",
       lambda x, dim=None, o=o: torch.log_softmax(x, o) if kit.other_axis(o, dim, x) else None)
     for o in range(4)] + [K(key, s, "in logsumexp, " + c, f, lambda x, dim=-1, v=v: x - v(x, dim))
                           for key, s, c, f, v in SLIPS] + [
    K("lse-added", "logsumexp added", "you returned x + logsumexp(x); log-softmax subtracts it", _RETURN,
      lambda x, dim=-1: x + torch.logsumexp(x, dim, keepdim=True)),
    K("unchanged", "scores returned unchanged", "you returned x without subtracting logsumexp(x)", _RETURN,
      lambda x, dim=-1: x.clone()),
]


def _explain_log_softmax(out: torch.Tensor, case: tuple, passed: list, tried: str) -> None:
    x, d = case[0], case_dim(case)
    o, expected, floor = out.detach().double(), torch.log_softmax(x.double(), d), kit.exp_limits(x.dtype)[1]
    tail, bad = torch.isfinite(expected) & (expected < floor), ~torch.isfinite(o) & torch.isfinite(expected)
    wrong, name = ~torch.isclose(o, expected, atol=1e-4, rtol=1e-5, equal_nan=True), str(x.dtype).replace("torch.", "")

    def tail_fail(hit: torch.Tensor, summary: str, rounds: str) -> None:
        i = tuple(int(k) for k in hit.nonzero()[0])
        fail(summary, tried=tried, expected="the log-probability itself, however negative",
             got=f"{int(hit.sum())} entries wrong, all where the true log-probability is tiny: at index {i} you return "
                 f"{fmt(float(o[i]))}, the true value is {fmt(float(expected[i]))}",
             cause=f"you took the log of a probability: below e^{floor:.0f} a {name} probability rounds to 0{rounds}",
             fix="compute x − logsumexp(x) along dim, never log(softmax(x))")

    if bad.any() and not (bad & ~tail).any():
        tail_fail(bad, "-inf for very unlikely entries" if torch.isneginf(o[bad]).all() else
                  "wrong for very unlikely entries", ", and log 0 = -inf")
    if bad.any():
        kinds = kit.nan_or_inf(o[bad])
        kit.explain_nonfinite(bad.any(d, keepdim=True).expand_as(x), x.double(), x.dtype, tried=tried, kinds=kinds,
                              got=f"{kinds} in {int(bad.sum())} of {o.numel()} entries",
                              expected="finite log-probabilities wherever x is finite")
    if tail.any() and wrong.any() and not (wrong & ~tail).any():
        tail_fail(wrong, "wrong for very unlikely entries",
                  " (or to whatever floor you clamp it to), so its log is lost")
    if (filled := torch.isneginf(expected) & torch.isfinite(o)).any():
        i = tuple(int(k) for k in filled.nonzero()[0])
        fail("finite where the score is -inf", tried=tried, got=f"{int(filled.sum())} entries whose score is -inf get a "
             f"finite log-probability (at index {i}: {fmt(float(o[i]))})",
             expected="-inf exactly where x is -inf (its probability is e^-inf = 0, and log 0 = -inf)",
             cause="your code turns -inf scores (or their results) into finite numbers: a fill such as -1e9, "
                   "nan_to_num, or a clamp",
             fix="leave -inf scores as they are: x − logsumexp(x) is -inf there by itself")
    if (o > 1e-6).any() and torch.isfinite(o).all():
        fail("positive log-probabilities", tried=tried, got=f"entries up to {fmt(float(o.max()))}",
             expected="log-probabilities ≤ 0", fix="return x − logsumexp(x) along dim")
    explain_weights(torch.exp(o), x, d, tried=tried, what="exp of your result",
                    normalise_fix="subtract logsumexp(x) along dim, computed with the natural log: x − (m + "
                                  "log Σ e^(x − m)), m = x.amax(dim, keepdim=True)")


@check("log_softmax", expects="a function log_softmax(x, dim=-1) returning log-probabilities shaped like x")
def check_log_softmax(fn: Learner) -> str:
    cases = score_cases(5, (torch.tensor([[0.0, -1000.0, 5.0], [-2000.0, 2.0, 1.0]], dtype=torch.float64), -1))  # −1005
    run = judge_cases(fn, cases, signature="log_softmax(x, dim=-1)", expected="log-probabilities shaped like x",
                      oracle=lambda x, dim=-1: torch.log_softmax(x.double(), dim), atol=1e-4,
                      table=default("ls", "normalised", torch.log_softmax) + LOG_SOFTMAX, explain=_explain_log_softmax,
                      shape_fix="log-probabilities have the shape of x: subtract logsumexp computed with keepdim=True")
    lowest = min(float(torch.log_softmax(c[0].double(), case_dim(c)).nan_to_num(neginf=0.0).min()) for c in cases)
    return (f"matches torch.log_softmax on {len(cases)} cases ({run.kind}): any axis, float16/32/64, finite for "
            f"log-probabilities down to {lowest:.0f}".replace("to -", "to −"))
