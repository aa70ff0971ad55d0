"""Check of the masked softmax: cases, oracle (F.scaled_dot_product_attention), known mistakes, measured causes."""

from __future__ import annotations

import functools
import math
from collections import namedtuple

import torch
import torch.nn.functional as F

from .. import kit
from ..compare import Failure
from ..core import Learner, LearnerRaised, as_tensor, check, fail, fmt
from ..kit import Suspects, narrowing_calls
from .answers import POLARITY, call, table


_SoftCase = namedtuple("_SoftCase", "name scores mask atol", defaults=(1e-7,))


def _softmax_cases() -> list[_SoftCase]:
    g = torch.Generator().manual_seed(6)

    def rand(*shape, dtype=torch.float64):
        return torch.randn(*shape, generator=g, dtype=dtype) * 2

    keep = torch.tensor([[True, False, True, True], [False, True, False, False], [True, True, True, True]])
    padding = torch.tensor([[True, True, True, False, False], [False, False, True, True, True],
                            [False] * 5])[:, None, None, :]  # right, left, all <pad>: (3, 1, 1, 5)
    left = torch.tensor([[0, 0, 5, 6], [3, 4, 5, 6]]) != 0
    decoder = torch.ones(4, 4, dtype=torch.bool).tril() & left[:, None, None, :]  # (2, 1, 4, 4), rows 0–1 empty
    large = torch.tensor([[-20000.0, 30000.0, -20001.5, 0.0], [30000.0, -20000.7, -5000.0, -20000.0],
                          [5.0, 30000.0, 7.0, -1.0]], dtype=torch.float64)
    large_keep = torch.tensor([[True, False, True, False], [False, True, False, True], [False, False, False, False]])
    return [
        _SoftCase("scores (3, 4) with a (3, 4) mask, every row allowed a key", rand(3, 4), keep),
        _SoftCase("large scores (±3·10⁴) with a mask, every row allowed a key (the last row every key)", large,
                  torch.tensor([[True, False, True, False], [False, True, False, True], [True, True, True, True]])),
        _SoftCase("scores (3, 2, 4, 5) in float32 with a key-padding mask (3, 1, 1, 5): right, left and all-<pad>",
                  rand(3, 2, 4, 5, dtype=torch.float32), padding, 2e-6),
        _SoftCase("a decoder mask (2, 1, 4, 4) with left padding: rows 0 and 1 of the first sequence are empty",
                  rand(2, 3, 4, 4), decoder),
        _SoftCase("a 1-D mask (4,) that blocks every key", rand(2, 4), torch.zeros(4, dtype=torch.bool)),
        _SoftCase("one key (n_k = 1), allowed in one row and blocked in the other", rand(2, 1),
                  torch.tensor([[True], [False]])),
        _SoftCase("large scores (±3·10⁴) with a mask and an empty row", large, large_keep),
        _SoftCase("scores in float16 with a mask and an empty row", rand(3, 4, dtype=torch.float16), large_keep, 2e-3),
        _SoftCase("large scores (±3·10⁴) in float32 with a mask and an empty row", large.float(), large_keep,
                  2e-3),  # a log-space softmax (exp(s − logsumexp)) in float32 is off by up to ulp(2·10⁴)/2 ≈ 1e-3
    ]


def _softmax_oracle(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Weights from F.scaled_dot_product_attention: with K = I·√n_k and V = I, its output is the weights."""
    n_k, eye = scores.shape[-1], torch.eye(scores.shape[-1], dtype=torch.float64)
    out = F.scaled_dot_product_attention(scores.to(torch.float64), eye * math.sqrt(n_k), eye.expand(
        *scores.shape[:-2], n_k, n_k), attn_mask=torch.broadcast_to(mask, scores.shape))
    return out.to(scores.dtype)


def _bits(dtype: torch.dtype) -> int:
    """Significant bits of a floating dtype (float16 keeps 11, bfloat16 8)."""
    return {torch.float64: 53, torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}.get(dtype, 0)


_NAIVE = ("softmax without subtracting the maximum", "you exponentiated the raw scores: e^30000 overflows to inf, and "
          "inf/inf (or inf × 0) is NaN", "subtract each row's maximum allowed score before exp, or use torch.softmax")
_EMPTY_ROWS = "~mask.any(dim=-1, keepdim=True)"  # the fully masked rows, one per query


def _softmax_mistakes(s: torch.Tensor, mask: torch.Tensor) -> list[tuple]:
    full = torch.broadcast_to(mask, s.shape)
    empty, empty_q = ~full.any(-1, keepdim=True), ~mask.any(-2, keepdim=True)  # empty_q: over the queries (axis -2)
    inf, before = -math.inf, "fill the blocked scores with float('-inf') before the softmax"
    blocked = s.masked_fill(~full, inf)
    plain, soft = torch.softmax(blocked, -1), torch.softmax(s, -1)
    after, exps, glob = soft * full, torch.exp(s) * full, torch.exp(blocked - blocked.max())
    glob = glob / glob.sum(-1, keepdim=True)  # a softmax shifted by the whole tensor's maximum
    uniform = ("uniform weights in fully masked rows", "a finite fill such as -1e9 gives a row with every key blocked "
               "uniform weights over exactly the keys it must not see", f"set such rows to 0 ({_EMPTY_ROWS})")
    renormalised = ("mask applied after the softmax, then renormalised", "you zeroed the blocked weights after the "
                    "softmax and divided by the row sum: ")
    return [
        ("nan", "NaN in fully masked rows", "softmax over a row that is -inf everywhere is 0/0 = NaN",
         f"set the rows with no allowed key ({_EMPTY_ROWS}) to 0 with torch.where or masked_fill", plain),
        ("uniform9", *uniform, lambda: torch.softmax(s.masked_fill(~full, -1e9), -1)),
        ("uniformmin", *uniform, lambda: torch.softmax(s.masked_fill(~full, torch.finfo(s.dtype).min), -1)),
        ("unmasked-rows", "fully masked rows not masked", "your rows with no allowed key hold the softmax of the "
         "unmasked scores", "give such rows all-zero weights", torch.where(empty, soft, plain)),
        ("dim-2", "softmax over axis -2 (the queries)", "you normalised each column instead of each row",
         "softmax over the last axis, dim=-1", lambda: torch.nan_to_num(torch.softmax(s.masked_fill(~full, inf), -2))),
        ("polarity", *POLARITY, "fill the scores where the mask is False: scores.masked_fill(~mask, float('-inf'))",
         lambda: torch.nan_to_num(torch.softmax(s.masked_fill(full, inf), -1))),
        ("ignored", "mask ignored", "you did not use the mask, so blocked keys get weight", before, soft),
        ("plus", "bool mask added to the scores", "added to a score, True counts as +1: it blocks nothing",
         "scores.masked_fill(~mask, float('-inf'))", lambda: torch.softmax(s + full.to(s.dtype), -1)),
        ("after", "mask applied after the softmax", "you zeroed the blocked weights after the softmax, so rows no "
         "longer sum to 1", before, after),
        ("renorm", renormalised[0], renormalised[1] + "0/0 = NaN in fully masked rows and where the allowed weights "
         "underflow", before, after / after.sum(-1, keepdim=True)),
        ("renorm-nan0", renormalised[0], renormalised[1] + "where every allowed weight underflows to 0 the row sum is "
         "0 too, and such a row came out 0 (0/0 turned into 0) instead of a softmax over its allowed keys", before,
         torch.nan_to_num(after / after.sum(-1, keepdim=True))),
        ("all", "rows with any blocked key set to 0", "you zeroed every row with a blocked key (all instead of any)",
         f"zero only the rows with no allowed key: {_EMPTY_ROWS}", plain.masked_fill(~full.all(-1, keepdim=True), 0.0)),
        ("log", "log-softmax instead of softmax", "you returned log-weights (log_softmax), not weights",
         "use torch.softmax", lambda: torch.log_softmax(s.masked_fill(~full, inf).masked_fill(empty, 0.0), -1)
         .masked_fill(empty, 0.0)),
        ("scores", "scores returned as weights", "you returned the masked scores, not their softmax",
         "return their torch.softmax(…, dim=-1)", lambda: s.masked_fill(~full, inf).masked_fill(empty, 0.0)),
        ("naive", *_NAIVE, lambda: exps / exps.sum(-1, keepdim=True)),
        *[(f"globalmax{tag}", "maximum over the whole tensor", "you subtracted the whole tensor's maximum, not each "
           f"row's: a row far below it underflows to 0, and 0/0 is NaN{said}", "subtract each row's own maximum "
           "allowed score (amax(dim=-1, keepdim=True)), or use torch.softmax", made)
          for tag, said, made in (("", "", glob.masked_fill(empty, 0.0)),
                                  ("-nan0", ", which your code then set to 0", glob.nan_to_num(0.0)))],
        ("naive-nan0", _NAIVE[0], _NAIVE[1] + ", which your code then set to 0", _NAIVE[2],
         lambda: torch.nan_to_num(exps / exps.sum(-1, keepdim=True))),
        ("ones", "fully masked rows filled with 1", "a row with no allowed key must get weights 0, not 1",
         "use 0 for such rows", torch.where(empty, torch.ones_like(plain), plain)),
        ("any-2", "fully masked rows looked for over axis -2", "mask.any(dim=-2) looks down each column (over the "
         "queries), not along each row", f"{_EMPTY_ROWS}: one True/False per query row",
         lambda: torch.softmax(s.masked_fill(~mask, inf).masked_fill(empty_q, 0.0), -1).masked_fill(empty_q, 0.0)),
        *[(f"in-{name}", f"computed in {name}, not float64", f"part of your computation ran in {name} "
           f"({narrowing_calls(low)}), too few digits for these inputs", "keep the scores' dtype (or a wider one)",
           lambda low=low: _softmax_oracle(s.to(low), mask).to(s.dtype) if s.dtype == torch.float64 else None)
          for low, name in ((torch.float32, "float32"), (torch.float16, "float16"))],  # right, but computed narrower
        *[(f"weak{fill}", "a fill value too weak for these scores", "next to scores of ±3·10⁴, a finite fill still "
           "gives blocked keys weight", "fill with float('-inf')",
           lambda fill=fill: torch.softmax(s.masked_fill(~full, fill), -1).masked_fill(empty, 0.0))
          for fill in (-1e4, -1e3, -1e5)],
    ]


@check("masked_softmax", expects="a function masked_softmax(scores, mask) returning weights shaped like scores")
def check_masked_softmax(fn: Learner) -> str:
    cases = _softmax_cases()
    every = [(c.scores, c.mask) for c in cases]
    suspects = Suspects(table(_softmax_mistakes, every, lambda s, m: tuple(s.shape)))
    no_keepdim = ("mask.any(dim=-1) without keepdim=True has shape (…, n_q), which lines up with the keys' axis, not "
                  "the rows", f"keep the axis: {_EMPTY_ROWS} has shape (…, n_q, 1)")
    # A broadcasting message is shared by many mistakes: a construct raising it is named only when one more call of
    # the learner's code confirms it.
    confirm = functools.cache(lambda: _confirm_no_keepdim(fn))
    passed: list[_SoftCase] = []
    judged: list[tuple] = []  # (weights, case, tried) of every case passed
    for case, (s, mask) in zip(cases, every):
        tried = (f"masked_softmax(scores {tuple(s.shape)} {str(s.dtype).replace('torch.', '')}, mask "
                 f"{tuple(mask.shape)}) on {case.name}")
        plain = torch.softmax(s.masked_fill(~mask, -math.inf), -1)
        constructs = [(*no_keepdim, lambda attempt=attempt: confirm() and attempt()) for attempt in (
            lambda: plain.masked_fill(~mask.any(-1), 0.0), lambda: torch.where(mask.any(-1), plain, 0.0),
            lambda: plain.masked_fill(~torch.broadcast_to(mask, s.shape).any(-1), 0.0))]
        raw, changed = call(fn.observe, (kit.CALL, s, mask), tried, f"weights of shape {tuple(s.shape)}",
                            constructs=constructs)
        got = kit.tensor_answer(raw, tried=tried)
        if got.dtype == torch.bool:
            rows = torch.equal(got, ~torch.broadcast_to(mask, s.shape).any(-1, keepdim=True))
            fail("returned a bool tensor, not weights", tried=tried, got=f"a bool tensor of shape {tuple(got.shape)}",
                 expected=f"float weights of shape {tuple(s.shape)}", cause=f"you returned the fully masked rows "
                 f"({_EMPTY_ROWS}) in place of the weights" if rows else "", fix="return the softmax weights")
        try:
            suspects.expect(got, _softmax_oracle(s, mask), (s, mask), tried=tried, distinguish=every,
                            again=lambda *a: as_tensor(fn(*a), tried=""), what="your weights", atol=case.atol,
                            rtol=1e-5)  # rows summing to 1 - 1e-4 (an epsilon added to the sum) are wrong
        except Failure as failure:
            if not failure.diagnosis.cause:
                _epsilon_in_the_sum(got, case, tried)
                _rounded_scores(got, case, tried, passed)
                kit.half_rounded(got, _softmax_oracle(s, mask), tried=tried, what="your weights",  # the weights, rounded
                                 fix="keep the scores' dtype to the end: leave out .half() or .bfloat16()")
                _softmax_structure(got, case, tried)
            raise
        passed.append(case)
        judged.append((got, case, tried))
        if changed:
            names = " and ".join(("scores", "mask")[int(i)] for i in changed)
            fail(f"changed {names} in place", tried=tried, got=f"right weights, but {names} changed by the call",
                 expected="the arguments left as they were", cause=f"an in-place operation on {names} (masked_fill_, "
                 "or an assignment into it) changes the caller's tensor",
                 fix="scores.masked_fill(~mask, float('-inf')), without the trailing _")
    for got, case, tried in judged:  # right within the tolerance everywhere: now exact zeros and float64's digits
        _exact_zeros(got, case, tried)
        _float64_digits(got, case, tried)
    return ("zero weights on blocked keys and in fully masked rows, rows of allowed keys summing to 1 "
            f"(masks of {len({tuple(c.mask.shape) for c in cases})} shapes, left padding, large scores, float16/32/64)")


def _confirm_no_keepdim(fn: Learner) -> bool:
    """On square scores, where a (…, n_q) row mask broadcasts, the learner's function zeroes column i where row i has
    no key, as a missing keepdim does."""
    s = torch.tensor([[0.3, -1.2, 2.0], [0.7, 0.1, -0.4], [1.5, -0.6, 0.2]], dtype=torch.float64)  # (3, 3)
    mask = torch.tensor([[True, False, True], [False, False, False], [True, True, False]])
    no_keepdim = torch.softmax(s.masked_fill(~mask, -math.inf), -1).masked_fill(~mask.any(-1), 0.0)
    try:
        return kit.agrees(fn(s, mask), no_keepdim, atol=1e-9, rtol=1e-7)
    except LearnerRaised:
        return False


def _rounded(case: _SoftCase, low: torch.dtype) -> torch.Tensor:
    """The weights of ``case`` with its scores rounded to ``low`` (and back to their dtype)."""
    return _softmax_oracle(case.scores.to(low).to(case.scores.dtype), case.mask)


def _rounded_scores(got: torch.Tensor, case: _SoftCase, tried: str, passed: list[_SoftCase] = ()) -> None:
    """Fail naming the dtype when the weights are, to the case's own tolerance, the exact softmax of the scores rounded
    to float16 or bfloat16 (x.half().float(): the rest of the computation may run wider), and no case of the same dtype
    that the answer ``passed`` would have shown that rounding (there it did not round: a clamp of large scores, say,
    coincides with the rounding on this case only)."""
    s = case.scores
    if tuple(got.shape) != tuple(s.shape) or not got.is_floating_point():
        return
    for low in (torch.float16, torch.bfloat16):
        if _bits(low) >= _bits(s.dtype) or torch.equal(rounded := s.to(low).to(s.dtype), s):
            continue
        if any(c.scores.dtype == s.dtype and not kit.agrees(_rounded(c, low).double(), _softmax_oracle(
                c.scores, c.mask).double(), atol=c.atol, rtol=1e-5) for c in passed):
            continue
        if kit.agrees(got.double(), _softmax_oracle(rounded, case.mask).double(), atol=case.atol, rtol=1e-5):
            name = str(low).replace("torch.", "")
            digits = kit.measure.DIGITS[low]
            fail(f"scores rounded to {name}", tried=tried, got=f"your weights are the softmax of the scores rounded "
                 f"to {name}, to the last digits", expected=f"the weights at {str(s.dtype).replace('torch.', '')} "
                 "precision", cause=f"you rounded the scores to {name} ({narrowing_calls(low)}) before the softmax: "
                 f"{name} keeps about {digits} significant digits, and every weight inherits that rounding, "
                 "even when the rest runs in a wider dtype",
                 fix=f"keep the scores' dtype: leave out {narrowing_calls(low).split(',')[0]} (a wider dtype inside "
                     "is fine)")


def _softmax_structure(got: torch.Tensor, case: _SoftCase, tried: str) -> None:
    """When no known mistake reproduces the weights, say which property is off."""
    if tuple(got.shape) != tuple(case.scores.shape):
        return
    w, full = got.to(torch.float64), torch.broadcast_to(case.mask, got.shape)
    empty = ~full.any(-1)  # (..., n_q)
    rows, bad = f"{int(empty.sum())} fully masked row{'s' if int(empty.sum()) != 1 else ''}", w[empty]
    if torch.isnan(bad).any():
        fail("NaN in fully masked rows", tried=tried, got=f"NaN in the {rows}", expected="all-zero weights there",
             cause="softmax over a row that is -inf everywhere is 0/0 = NaN", fix=f"set such rows to 0 ({_EMPTY_ROWS})")
    if (bad.abs() > 1e-6).any():
        fail("fully masked rows are not zero", tried=tried, got=f"weights up to {fmt(float(bad.abs().max()))} in "
             f"the {rows}", expected="all-zero weights there", fix=f"set such rows to 0 ({_EMPTY_ROWS})")
    if (w < -1e-12).any() or (w > 1 + 1e-6).any():
        fail("weights outside [0, 1]", tried=tried, got=f"weights from {fmt(float(w.min()))} to {fmt(float(w.max()))}",
             expected="weights between 0 and 1", fix="the weights are a softmax over the allowed keys: torch.softmax")
    if torch.isnan(w).any():
        nan_rows = torch.isnan(w).any(-1)  # (..., n_q)
        if torch.equal(nan_rows, torch.isinf(torch.exp(case.scores.to(w.dtype)).masked_fill(~full, 0.0)).any(-1)):
            fail(_NAIVE[0], tried=tried, expected="finite weights in every row with an allowed key", got=f"NaN in "
                 f"exactly the {int(nan_rows.sum())} rows where an allowed score is so large that e^score is inf",
                 cause=_NAIVE[1], fix=_NAIVE[2])
        fail("NaN in rows that have an allowed key", tried=tried, got=f"NaN in {int(nan_rows.sum())} rows with allowed "
             "keys", expected="finite weights", fix="print each step on this input: where does NaN first appear?")
    leak = float(w[~full].abs().max()) if (~full).any() else 0.0
    if leak > 1e-6:
        fail("weight on blocked keys", tried=tried, got=f"blocked keys get weight up to {fmt(leak)}",
             expected="weight 0 wherever the mask is False", fix="fill blocked scores with float('-inf') first")
    sums = w.sum(-1)[~empty]
    if sums.numel() and not torch.allclose(sums, torch.ones_like(sums), atol=1e-3):
        fail("rows do not sum to 1", tried=tried, got=f"rows with allowed keys summing to {fmt(float(sums.min()))} … "
             f"{fmt(float(sums.max()))}", expected="1 in each row with an allowed key",
             fix="take the softmax over the last axis (dim=-1) after masking")


def _epsilon_in_the_sum(got: torch.Tensor, case: _SoftCase, tried: str) -> None:
    """Fail naming it when the weights are, to float64 rounding, e / (Σe + ε) for one ε > 0 on every row with an allowed
    key, e = exp(scores − the row's maximum allowed score) (Σe ≥ 1; :func:`~..kit.epsilon_in_the_sum`)."""
    s, full = case.scores.double(), torch.broadcast_to(case.mask, case.scores.shape)
    if tuple(got.shape) != tuple(s.shape) or not got.is_floating_point():
        return
    shifted = torch.exp(s.masked_fill(~full, -math.inf) - s.masked_fill(~full, -math.inf).amax(-1, keepdim=True))
    sums, rows = shifted.nan_to_num(0.0).sum(-1), full.any(-1)  # S: one per row (0 where no key is allowed)
    value = kit.epsilon_in_the_sum(got, _softmax_oracle(s, case.mask).double(), sums, atol=1e-12,
                                   rtol=1e-9 if s.dtype == torch.float64 else 1e-5)
    if value is not None:
        w = got.double()
        fail("an epsilon added to the row sum", tried=tried, got=f"your weights are e / (Σe + {value:.2g}): the "
             f"rows with an allowed key sum to {fmt(float(w.sum(-1)[rows].min()))} … "
             f"{fmt(float(w.sum(-1)[rows].max()))}", expected="rows of allowed keys summing to 1",
             cause=f"you added an epsilon (about {value:.2g}) to each row's sum of exponentials, so no row sums to "
                   "1; after subtracting the row's maximum allowed score, that sum is at least 1 in every row with "
                   "an allowed key, and only the rows with none need care",
             fix=f"divide by the sum itself, and give the rows with no allowed key 0 ({_EMPTY_ROWS})")


def _float64_digits(got: torch.Tensor, case: _SoftCase, tried: str) -> None:
    """On float64 scores, fail when the weights, right within the tolerance, are off by more than float64 rounding
    (the docstring: computed at the scores' precision): an epsilon in the sum, else float32 (or a float32 step) inside."""
    if case.scores.dtype != torch.float64 or not got.is_floating_point():
        return
    right = _softmax_oracle(case.scores, case.mask).double()
    error = float((got.double() - right).abs().max())  # the weights are at most 1
    if error <= 1e-10:  # float64 rounding stays near 1e-16
        return
    _epsilon_in_the_sum(got, case, tried)
    kit.lower_precision(got, case.scores.dtype, tried=tried, what="your weights")
    fail("weights not at float64 precision", tried=tried, got=f"your weights are off by up to {error:.1e}: about "
         f"{-math.log10(error):.0f} correct digits", expected="float64's ~16 digits (the docstring: computed at the "
         "scores' precision)", fix="keep every step in the scores' dtype: no .float(), no float32 constants or "
         "accumulators (tensors made without dtype=), no epsilon in the sum")


def _exact_zeros(got: torch.Tensor, case: _SoftCase, tried: str) -> None:
    """Fail when a weight the docstring makes 0 (a blocked key, a row with no allowed key) is not exactly 0, though
    within the tolerance: a clamp of the weights is named when it reproduces them."""
    full = torch.broadcast_to(case.mask, case.scores.shape)
    blocked = got.detach()[~full].double() if tuple(got.shape) == tuple(full.shape) else torch.zeros(0)
    if not bool((blocked != 0).any()):
        return
    low = float(blocked.min())
    fail("blocked keys get a tiny weight, not 0", tried=tried, got=f"weights up to {fmt(float(blocked.abs().max()))} "
         "where the mask is False", expected="exactly 0 wherever the mask is False, as the docstring says",
         cause=kit.clamp_cause(got, _softmax_oracle(case.scores, case.mask), full, low),
         fix="return the softmax as it is: a blocked score of -inf gives e^-inf = 0 exactly")
