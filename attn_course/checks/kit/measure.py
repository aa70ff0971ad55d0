"""What is off in an answer that no known mistake reproduces, measured: the batch entries that are wrong, a
narrower dtype, one value per slice, dropped axes, rounding (:func:`what_is_off`), where NaN or inf come from
in a softmax-like answer (:func:`explain_nonfinite`), and an input of another number of axes that works."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

import torch

from ..boundary import LearnerRaised, LearnerTimedOut
from ..compare import Failure, as_tensor, describe_mismatch, fail, fmt, same
from .families import SHIFT_FIX

__all__ = ["agrees", "epsilon_in_the_sum", "clamp_cause", "works_elsewhere", "what_is_off", "batch_entries", "lower_precision", "narrowing_calls", "expect_dtype",
           "expect_float64_precision",
           "exp_limits", "nan_or_inf", "explain_nonfinite"]


def agrees(out: Any, expected: torch.Tensor, *, atol: float, rtol: float) -> bool:
    """Whether a learner's answer (a tensor, an array or a number) has ``expected``'s shape and values."""
    try:
        t = as_tensor(out, tried="")
    except Failure:
        return False
    return tuple(t.shape) == tuple(expected.shape) and same(t, expected, atol=atol, rtol=rtol)


def epsilon_in_the_sum(got: torch.Tensor, right: torch.Tensor, sums: torch.Tensor, *, atol: float,
                       rtol: float) -> float | None:
    """The ε > 0 for which ``got`` is, within ``atol``/``rtol``, ``right`` · S / (S + ε) on every row: an epsilon added
    to a softmax's sum S (``sums``: each row's S, shape ``got.shape[:-1]``; rows with S = 0, which hold no softmax, are
    left out). None when no one ε fits, or when the rows' S lie within 1e-3 of each other (one ε is then a constant
    factor, which it cannot be told from)."""
    a, e, s = got.detach().double(), right.detach().double(), sums.detach().double()
    if tuple(a.shape) != tuple(e.shape) or tuple(a.shape[:-1]) != tuple(s.shape) or not bool(torch.isfinite(a).all()):
        return None
    rows = s > 0
    if not bool(rows.any()) or float(s[rows].max() - s[rows].min()) < 1e-3:
        return None
    factor = ((a * e).sum(-1) / (e * e).sum(-1).clamp_min(1e-300))[rows]  # S / (S + ε) on each row
    if not bool((factor > 0).all()):
        return None
    eps = s[rows] * (1 / factor - 1)
    value = float(eps.mean())
    if not (value > 0 and torch.allclose(eps, torch.full_like(eps, value), rtol=1e-3, atol=0.0)):
        return None
    made = torch.where(rows[..., None], e * (s / (s + value))[..., None], e)
    return value if bool(torch.allclose(a, made, atol=atol, rtol=rtol)) else None


def clamp_cause(w: torch.Tensor, right: torch.Tensor, allowed: torch.Tensor, low: float) -> str:
    """The cause when every blocked weight (``allowed`` False) is exactly ``low`` and the rest are the ``right`` weights
    with those below ``low`` lifted to it: a clamp, proven only when an allowed weight below ``low`` was lifted too (else
    a fill of the blocked weights with ``low`` gives the same numbers, and both are named); "" when it is neither."""
    w, right = w.detach().double(), right.double()
    if not (bool((w[~allowed] == low).all()) and agrees(w, right.clamp_min(low), atol=1e-12, rtol=1e-9)):
        return ""
    lifted = allowed & (right < low)
    if bool(lifted.any()) and bool((w[lifted] == low).all()):
        return f"you clamped the weights to at least {low:.2g} (clamp_min, or clamp(min=…)), which lifts every " \
               "blocked weight off 0"
    return f"every blocked weight is exactly {low:.2g}: you clamped the weights to at least {low:.2g} (clamp_min, or " \
           f"clamp(min=…)) or set the blocked ones to {low:.2g} (masked_fill, torch.where), either of which lifts " \
           "every blocked weight off 0"


def works_elsewhere(failed: Sequence[int], others: Iterable[tuple[Sequence[int], Callable[[], bool]]], *,
                    fix: str) -> dict:
    """After the learner's code raised on an input of shape ``failed``: ``cause``/``fix`` naming the first of ``others``
    (a shape, and a call saying whether the answer on it is right) that has another number of axes and on which the
    code works — one that raises or times out does not; else ``{}``."""
    text = lambda s: f"({s[0]},)" if len(s) == 1 else str(tuple(s))  # noqa: E731
    for shape, works in others:
        if len(shape) == len(failed):
            continue
        try:
            ok = works()
        except (LearnerRaised, LearnerTimedOut, Failure):
            ok = False
        if ok:
            return dict(cause=f"your code works on input of shape {text(shape)} but raises on {text(failed)}: it "
                              "handles one number of axes only (torch.bmm, torch.dot, torch.diag, torch.outer, math "
                              "functions or a loop over the first axis fix that number), and the docstring allows any "
                              "number of axes", fix=fix)
    return {}


def what_is_off(out: torch.Tensor, expected: torch.Tensor, *, tried: str, what: str, atol: float, rtol: float,
                fix: str, reduced: int | None = None, explain: Callable[[torch.Tensor], None] = lambda out: None,
                along: str = "-1") -> None:
    """Fail saying what is off in a floating-point answer that no known mistake reproduces, where the plain comparison
    would name no cause; return when nothing here fits.

    A wrong shape: one value per slice along axis ``reduced`` (a reduction returned where the entries belong; ``fix``
    is the advice), or the right values with the size-1 axes dropped. The right shape: NaN or inf where the truth is
    finite go to ``explain(out)`` (the topic's own measurements: where they come from); then a result that went
    through float16 or bfloat16 (asked first: on a few values its rounding looks like a factor and a shift); then,
    unless :func:`~.compare.describe_mismatch` names a cause, a constant factor or a shift, in order:
    ``explain(out)``, some batch entries wrong (:func:`batch_entries`, ``along`` naming the reduced axis), values
    right to about 3 significant digits only."""
    got, want = tuple(out.shape), tuple(expected.shape)
    if got != want:
        if reduced is not None and want[reduced] > 1 and got == want[:reduced] + (1,) + want[reduced + 1:]:
            fail("one value per slice", tried=tried, got=f"{what} of shape {got}: one number for each slice along dim",
                 expected=f"shape {want}, one value for each entry of x", fix=fix,
                 cause="you returned a reduction along dim (the maximum, or the sum) instead of the entry-wise result")
        kept = tuple(s for s in want if s != 1)
        if got == kept and len(kept) < len(want) and same(out, expected.reshape(kept), atol=atol, rtol=rtol):
            fail("size-1 axes dropped", tried=tried, got=f"{what} of shape {got}, with the right values",
                 expected=f"shape {want}",
                 fix="keep every axis: squeeze nothing, or only the axis you added (.squeeze(-1))",
                 cause="your code removes the axes of size 1: .squeeze() without an axis drops every one of them")
        return
    a, e = out.detach().double(), expected.detach().double()
    if bool((~torch.isfinite(a) & torch.isfinite(e)).any()):
        explain(out)
    # Rounded: within a few float16 rounding steps of the truth everywhere, yet not equal to it (asked before the
    # comparison's causes: on a few values float16's rounding can look like a factor and a shift).
    scale, err = float(e.abs().max()), (a - e).abs()
    rounded = out.dtype not in (torch.float16, torch.bfloat16) and bool(torch.isfinite(a).all()) and bool(
        torch.isfinite(e).all()) and float(err.max()) > 2.0 ** -14 * scale and bool(
        (err <= 4 * torch.clamp(e.abs(), min=scale) * 2.0 ** -10).all())
    got = f"{what} agree with the expected values to about 3 significant digits only (largest difference " \
          f"{fmt(float(err.max()))})"
    if rounded and (half := made_of_half(a)):  # only a result that went through half precision is made of its numbers
        name = str(half).replace("torch.", "")
        fail(f"{name} precision", tried=tried, got=got + f"; every value is a {name} number",
             expected="the input's precision", cause=f"your result went through {name}, which keeps about "
             f"{DIGITS[half]} significant digits, and was converted back afterwards",
             fix="compute in the input's dtype: leave out .half(), .to(torch.float16) or .to(torch.bfloat16)")
    mismatch = describe_mismatch(out, expected, what=what, atol=atol, rtol=rtol)
    if mismatch[2] or mismatch[3].startswith(("off by a factor", "shifted by")):
        return
    explain(out)
    batch_entries(out, expected, tried=tried, what=what, atol=atol, rtol=rtol, along=along)
    if rounded:
        fail("about 3 digits right", tried=tried, got=got, expected="the input's precision",
             fix="look for a step that rounds: round(…), a conversion to a smaller dtype, or values printed "
                 "and read back")


def batch_entries(out: torch.Tensor, expected: torch.Tensor, *, tried: str, what: str, atol: float, rtol: float,
                  along: str) -> None:
    """For 3-D and larger results: fail naming which entries along the first (batch) axis are wrong, when some are
    right and some not (``along`` names the axis a reduction should run along, for the fix)."""
    if out.ndim < 3 or out.shape[0] < 2:
        return
    right = [same(out[i], expected[i], atol=atol, rtol=rtol) for i in range(out.shape[0])]
    if all(right) or not any(right):
        return
    wrong, first = [i for i, r in enumerate(right) if not r], right.index(True)
    if all(same(out[i], out[first], atol=atol, rtol=rtol) for i in wrong):
        fail(f"batch entry {first} repeated", tried=tried, expected="each batch entry computed from its own input",
             got=f"{what} repeat batch entry {first}'s values in entries {', '.join(map(str, wrong))}",
             cause=f"your code computes batch entry {first} and reuses it for the others",
             fix=f"compute every step for all batch entries at once (reduce along {along}, not over [0])")
    fail("wrong for some batch entries", tried=tried, expected="every batch entry right",
         got=f"{what} are right for batch entr{'y' if right.count(True) == 1 else 'ies'} "
             f"{', '.join(str(i) for i, r in enumerate(right) if r)} and wrong for {', '.join(map(str, wrong))}",
         fix="make every step treat all batch entries alike: no loop over a fixed range, no indexing with a fixed "
             "number")


_BITS = {torch.float64: 53, torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}  # significant bits


#: significant decimal digits each floating-point dtype keeps, as the messages state them
DIGITS = {torch.float32: 7, torch.float16: 3, torch.bfloat16: 2}


def made_of_half(t: torch.Tensor) -> torch.dtype | None:
    """The half-precision dtype every value of ``t`` is a number of, or None. bfloat16 is asked first: a bfloat16
    number in float16's range is a float16 number too, not the other way round."""
    return next((h for h in (torch.bfloat16, torch.float16) if torch.equal(t.to(h).to(t.dtype), t)), None)


def half_rounded(out: torch.Tensor, expected: torch.Tensor, *, tried: str, what: str, fix: str) -> None:
    """Fail naming float16 or bfloat16 when ``out``, in the input's dtype, went through it and was converted back:
    every value lies on that dtype's grid and within a few of its rounding steps of ``expected``, yet not equal to it
    (the test of :func:`what_is_off`, which then says so). A float32 or float64 computation lands on the grid by
    chance with probability about 2⁻¹³ per value; a wrong step is far more than a few rounding steps off."""
    got = out.detach()
    if tuple(got.shape) != tuple(expected.shape) or not got.is_floating_point() or got.dtype.itemsize < 4 or \
            not got.numel() or made_of_half(got) is None:
        return
    a, e = got.double(), expected.detach().double()
    if not (bool(torch.isfinite(a).all()) and bool(torch.isfinite(e).all())):
        return
    scale, err = float(e.abs().max()), float((a - e).abs().max())
    if 2.0 ** -14 * scale < err <= 4 * scale * 2.0 ** -10:  # rounded, by no more than a few float16 steps
        what_is_off(out, expected, tried=tried, what=what, atol=0.0, rtol=0.0, fix=fix)


def lower_precision(got: torch.Tensor, input_dtype: torch.dtype, *, tried: str, what: str, grid: bool = True) -> None:
    """Fail, naming the dtype, when ``got`` went through a dtype narrower than the inputs': its own dtype is narrower,
    or (``grid``, for an answer already known to be wrong) every entry lies exactly on that dtype's grid (a float64
    computation lands there by chance with probability about 2⁻²⁹ per entry)."""
    bits = _BITS.get(input_dtype)
    if bits is None or not got.is_floating_point():
        return
    low = got.dtype if _BITS.get(got.dtype, 99) < bits else None
    values = got[torch.isfinite(got)]
    telling = values[(values != 0) & (values.abs() != 1) & (values.abs() != 0.5)]
    narrower = (torch.bfloat16, torch.float16, torch.float32) if grid and low is None and telling.numel() >= 4 else ()
    for candidate in narrower:
        if _BITS[candidate] < bits and torch.equal(telling.to(candidate).to(got.dtype), telling):
            low = candidate
            break
    if low is None:
        return
    name, inputs = str(low).replace("torch.", ""), str(input_dtype).replace("torch.", "")
    fail(f"computed in {name}, not {inputs}", tried=tried, got=f"{what}: {name} values" + (
        "" if got.dtype == low else f" (every entry exactly representable in {name})") + f", although the inputs are "
         f"{inputs}", expected=f"the results at {inputs} precision",
         cause=f"part of your computation ran in {name}{'' if got.dtype != low else ' or narrower'} "
               f"({narrowing_calls(low)}), which keeps about {DIGITS[low]} significant digits: too few for these "
               "inputs",
         fix="keep the inputs' dtype from start to end (a wider dtype inside is fine, a narrower one is not)")


def expect_dtype(got: torch.Tensor, dtype: torch.dtype, *, tried: str, what: str) -> None:
    """Fail when ``got`` (right values, at least ``dtype``'s precision: :func:`lower_precision` has looked) is not
    of ``dtype``, the dtype the docstring returns: a wider result that was never converted back."""
    if got.dtype == dtype:
        return
    name, want = (str(t).replace("torch.", "") for t in (got.dtype, dtype))
    fail(f"{what} in {name}, not {want}", tried=tried, got=f"{what}: {name}, with the right values",
         expected=f"{want}, the inputs' dtype", cause=f"your computation converted to {name} ({narrowing_calls(got.dtype)}) "
         "and the result was not converted back", fix=f"computing in a wider dtype is fine; convert the result back at "
         f"the end: .to({dtype})")


def expect_float64_precision(got: torch.Tensor, expected: torch.Tensor, *, tried: str, what: str, first: str = "q") -> None:
    """Fail when ``got``, float64 and right within the check's tolerance, is off by more than float64 rounding from
    ``expected`` (the float64 oracle): float32 somewhere inside (running state made without ``dtype=`` and updated in
    place, a ``.float()`` cast back), which the tolerance alone lets through. ``first`` names the input whose dtype
    the tensors should take."""
    if got.dtype != torch.float64 or expected.dtype != torch.float64 or not got.numel():
        return
    finite = torch.isfinite(expected) & torch.isfinite(got.detach())
    if not finite.any():
        return
    scale = float(expected[finite].abs().max()) or 1.0
    error = float((got.detach()[finite] - expected[finite]).abs().max()) / scale
    if error > 1e-10:  # float64 rounding stays near 1e-15 of the largest value
        fail("float64 input, float32 precision", tried=tried,
             got=f"{what} off by up to {error:.1e} of its largest value: about {-math.log10(error):.0f} correct "
                 "digits, float32's precision", expected="float64's ~16 digits",
             cause="part of your computation runs in float32: a tensor created without dtype= (torch.zeros, "
                   "torch.full and torch.empty make float32) kept so by in-place updates (mul_, add_, copy_), or a "
                   ".float() converted back at the end",
             fix=f"create every tensor with dtype={first}.dtype (or with *_like functions), and leave out .float()")


def narrowing_calls(dtype: torch.dtype) -> str:
    """The calls that turn a tensor into ``dtype``, for a diagnosis: ``.half(), .to(torch.float16) or
    dtype=torch.float16``."""
    full = str(dtype)
    method = {torch.float32: ".float()", torch.float16: ".half()", torch.bfloat16: ".bfloat16()",
              torch.float64: ".double()"}.get(dtype)
    return f"{method + ', ' if method else ''}.to({full}) or dtype={full}"


def exp_limits(dtype: torch.dtype) -> tuple[float, float]:
    """Above the first, e^z overflows to inf in ``dtype``; below the second (half the smallest subnormal), it rounds
    to 0."""
    exponent = {torch.float16: -24, torch.bfloat16: -133, torch.float64: -1074}.get(dtype, -149)
    return math.log(torch.finfo(dtype).max), (exponent - 1) * math.log(2.0)


def nan_or_inf(t: torch.Tensor) -> str:
    """What ``t`` holds that is not finite: "NaN", "inf" or "NaN and inf"."""
    return " and ".join(k for k, hit in (("NaN", torch.isnan(t).any()), ("inf", torch.isinf(t).any())) if hit)


def explain_nonfinite(slices: torch.Tensor, xs: torch.Tensor, dtype: torch.dtype, *, tried: str, got: str, kinds: str,
                      expected: str, scaled: str = "x", last: bool = True) -> None:
    """Fail saying where the NaN or inf (``kinds``) of a softmax-like answer come from. ``slices`` marks (shaped like
    the float64 scores ``xs``) the slices whose answer is not finite; ``dtype`` is the one the learner computed in.
    Scores beyond e^z's range, or spread wider than it, mean that the slice's own maximum was not what was
    subtracted; -inf scores, an operation on -inf. Otherwise, when ``last``, a plain "{kinds} in the result"."""
    scores, (hi, lo), name = xs[slices & torch.isfinite(xs)], exp_limits(dtype), str(dtype).replace("torch.", "")
    top, bottom = (float(scores.max()), float(scores.min())) if scores.numel() else (-math.inf, math.inf)
    if top > hi:
        fail(f"{kinds} from an overflow", tried=tried, got=got, expected=expected, fix=SHIFT_FIX,
             cause=f"the largest {scaled} in those slices is {fmt(top)}, and in {name} e^z is inf for z > {hi:.2f}: "
                   "you exponentiated without subtracting each slice's own maximum")
    if scores.numel() and top < lo:
        fail(f"{kinds} from an underflow", tried=tried, got=got, expected=expected, fix=SHIFT_FIX,
             cause=f"in those slices every score is below {lo:.1f}, where e^z rounds to 0 in {name}, so the sum is 0 "
                   "(0/0 is NaN, log 0 is -inf): you exponentiated without subtracting the slice's own maximum")
    if top - bottom > hi:
        fail(f"{kinds} in slices of widely spread scores", tried=tried, got=got, expected=expected, fix=SHIFT_FIX,
             cause=f"in those slices {scaled} spans {fmt(top - bottom)} (from {fmt(bottom)} to {fmt(top)}). In {name}, "
                   f"e^(x − c) neither overflows nor underflows to all zeros only for a shift c between "
                   f"max − {hi:.2f} and max + {-lo:.1f}, and yours was outside (the mean, the minimum or the first "
                   "entry of such a slice lies far from its maximum)")
    if torch.isneginf(xs)[slices].any():
        fail(f"{kinds} where scores are -inf", tried=tried, got=got + " (in slices holding -inf scores)",
             expected=expected + " (a -inf score contributes e^-inf = 0)",
             cause="an operation on -inf gave NaN: -inf - (-inf), -inf · 0, or inf / inf",
             fix="let exp turn -inf into 0: subtract the slice maximum (finite here), then exponentiate")
    if last:
        fail(f"{kinds} in the result", tried=tried, got=got, expected=expected,
             fix="look for a division by zero or a log of 0 in your steps")
