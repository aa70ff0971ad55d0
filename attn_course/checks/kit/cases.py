"""A tensor function judged on its cases (:func:`judge_cases`): a known mistake that fits every wrong case, an
exception a mistake reproduces, else the first wrong result measured — what notebooks 01 and 02 use."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..boundary import LearnerRaised
from ..compare import Failure, as_tensor, describe_mismatch, expect_shape, fail, fmt
from ..core import learner_error
from .answers import KEPT_FIX, kept_cause, preview
from .calls import CALL_WITH
from .measure import DIGITS, made_of_half
from .mistakes import Known, Suspects, fits
from .raises import explain_raise, hard_coded_hint

__all__ = ["TensorCase", "judge_cases", "fresh_values"]


@dataclass
class TensorCase:
    """One call of a learner's tensor function, for :func:`judge_cases`: ``label`` ("f(…) with {label}"), ``args``
    and ``kwargs``, the ``expected`` result (float64), ``tags`` (what the case is: "batched", "float64"…, for "wrong
    only on …") and ``magnitude``: the largest Σ|products| the result adds up, which rounding errors grow with."""

    label: str
    args: tuple
    expected: torch.Tensor
    kwargs: dict = field(default_factory=dict)
    tags: frozenset = frozenset()
    magnitude: float = 1.0

    @property
    def key(self) -> tuple:
        """The case as the oracle and every Known take it: the arguments, then the keyword values."""
        return (*self.args, *self.kwargs.values())

    @property
    def atol(self) -> float:
        """Float32 rounding with a wide margin, for float64 input too (a float32 result is a correct answer)."""
        return (3e-5 if self.args[0].dtype == torch.float32 else 2e-6) * max(self.magnitude, 1e-30)


def _tensor_of(fn: Any, case: TensorCase, tried: str) -> tuple[torch.Tensor | None, LearnerRaised | None, list[int]]:
    """(result, None, inputs changed in place), or (None, the exception, []); a diagnosis when the result is no
    tensor."""
    try:
        value, changed = fn.observe(CALL_WITH, *case.args, **case.kwargs)
    except LearnerRaised as exc:
        return None, exc, []
    shape = f"a tensor of shape {tuple(case.expected.shape)}"
    if isinstance(value, np.ndarray):
        fail("returned a NumPy array, not a tensor", tried=tried, got=f"a NumPy array of shape {value.shape}",
             expected="a torch.Tensor, as the docstring says", cause="part of your computation went through NumPy "
             "(np.dot, .numpy(), np.sqrt of a tensor…), which returns an array", fix="stay with torch operations on "
             "the tensors (@, torch.matmul, .sum), or convert back with torch.from_numpy")
    if isinstance(value, (np.generic, int, float)) and not isinstance(value, bool):
        fail("returned a Python number, not a tensor", tried=tried, got=f"the number {fmt(float(value))}",
             expected=shape, cause=".item(), float(…), a sum over every entry or a constant returned turned the "
             "result into one number", fix="keep one score per pair in a tensor")
    if isinstance(value, (list, tuple)):
        kind = type(value).__name__
        fail(f"returned a Python {kind}, not a tensor", tried=tried, got=f"a {kind} of {len(value)} items",
             expected=shape, cause=f"a Python {kind} of scores is not a tensor (.tolist(), or a list built in a loop "
             "and returned as it is)", fix="turn a list of 0-d tensors into one tensor with torch.stack(scores); "
             "leave out .tolist()")
    return as_tensor(value, tried=tried, expected=shape), None, changed


def _close(a: torch.Tensor, b: torch.Tensor, atol: float) -> bool:
    return tuple(a.shape) == tuple(b.shape) and \
        bool(torch.allclose(a.detach().double(), b.detach().double(), atol=atol, rtol=1e-5, equal_nan=True))


def judge_cases(fn: Any, cases: Sequence[TensorCase], table: Sequence[Known], *, call: str, arg_names: Sequence[str],
                oracle: str, factors: Callable[[TensorCase], dict[str, float]] | None = None,
                tags: dict[str, tuple[str, str]] | None = None,
                measure: Callable[[int, list, str], None] | None = None) -> None:
    """Call ``fn`` on every case; return when every result is right and no input was changed in place, else end the
    check with a diagnosis. First a row of ``table`` (taking ``case.key``) that does what the learner's code did on
    every wrong case (raises there, or gives those very numbers) and that no right result rules out; an exception is
    named by a row that raises the very same message. Else the first wrong result is measured: ``measure(i, results,
    tried)`` (the topic's own measures of ``results[i]``), then all zeros, an argument it ignores, one shape whatever
    the input, a shape or values wrong only on the cases of one of ``tags`` (tag: (short, long) words), right for the
    first batch entry only, half precision, a factor of ``factors(case)``. ``call`` shows the call ("f(q, K)"),
    ``arg_names`` names the positional arguments, ``oracle`` the right computation."""
    tries = [f"{call} with {c.label}" for c in cases]
    outs = [_tensor_of(fn, c, t) for c, t in zip(cases, tries)]
    right = [v is not None and v.is_floating_point() and _close(v, c.expected, c.atol)
             for (v, _, _), c in zip(outs, cases)]
    if all(right):
        _in_place(outs, tries, arg_names, "the right result")
        return
    wrong = [i for i, ok in enumerate(right) if not ok]
    suspects = Suspects([k for k in table if all(fits(k, cases[i].key, raised=outs[i][1] is not None, value=outs[i][0],
                                                      atol=max(cases[i].atol, 1e-5)) for i in wrong)])
    for c, (v, _, _), ok in zip(cases, outs, right):
        if ok:
            suspects.expect(v, c.expected, c.key, tried="", atol=c.atol, rtol=1e-5)
    valued = [i for i in wrong if outs[i][0] is not None]

    def expect(i: int, **more: Any) -> None:
        suspects.expect(outs[i][0], cases[i].expected, cases[i].key, tried=tries[i], atol=cases[i].atol, rtol=1e-5,
                        again=lambda *key: fn.observe(CALL_WITH, *key)[0], oracle=oracle,
                        distinguish=[cases[j].key for j in wrong if j != i], **more)

    if valued and suspects.suspects(outs[valued[0]][0], cases[valued[0]].key):
        expect(valued[0])  # a known mistake gives this very result: named
    if (exc := outs[wrong[0]][1]) is not None:  # an exception: named when a mistake raises the very same message
        case = cases[wrong[0]]
        live = [k for k in suspects.table if not suspects.ruled_out(k)]  # none that a right result contradicts
        hint = explain_raise(exc, [(k.key, k.fix, lambda k=k: k.make(*case.key)) for k in live])
        ran = {n for c, ok in zip(cases, right) if ok for a in c.args if isinstance(a, torch.Tensor) for n in a.shape}
        d = learner_error(exc, tried=tries[wrong[0]], expected=preview(case.expected), **hard_coded_hint(exc, ran))
        k = next((k for k in live if k.key == hint.get("cause")), None)
        raise Failure(replace(d, summary=k.summary, cause=k.cause, fix=k.fix) if k else d)
    _in_place(outs, tries, arg_names, "a wrong result")  # no known mistake explains it: the changed input comes first
    i, values = valued[0], [o[0] for o in outs]
    if measure:
        measure(i, values, tries[i])
    named = factors(cases[i]) if factors else None
    _measure(fn, cases, values, wrong, i, tries[i], arg_names, oracle, named, tags or {})
    expect(i, factors=named)


def _in_place(outs: list, tries: list[str], arg_names: Sequence[str], result: str) -> None:
    """Fail on the first call that changed an input in place (``outs``: the (value, exception, changed) of each)."""
    moved = next((i for i, o in enumerate(outs) if o[2]), None)
    if moved is not None:
        names = " and ".join(arg_names[j] for j in outs[moved][2])
        fail(f"changed its input {names} in place", tried=tries[moved],
             got=f"{result}, and afterwards the caller's {names} holds different values",
             expected=f"{names} left as it was (the docstring: inputs are left unchanged)",
             cause=f"your code modifies {names} in place (an operation ending in _ such as mul_, div_ or "
                   "transpose_, +=, *=, /= or an assignment x[…] = … on an input)",
             fix="compute into a new tensor: write x = x * y (or x / n) instead of x *= y (x /= n), or start from "
                 "a copy: x = x.clone()")


def _measure(fn: Any, cases: Sequence[TensorCase], values: list, wrong: Sequence[int], i: int, tried: str,
             arg_names: Sequence[str], oracle: str, factors: dict[str, float] | None,
             tags: dict[str, tuple[str, str]]) -> None:
    """What is wrong with a result no known mistake gives (see :func:`judge_cases`)."""
    case, t = cases[i], values[i]
    a64, e64, expected = t.detach().double(), case.expected, preview(case.expected)
    if t.numel() and bool((a64 == 0).all()) and bool((e64 != 0).any()):
        fail("all zeros", tried=tried, got=f"every entry is 0 ({preview(t)})", expected=expected, fix="make sure "
             "every score is written into the tensor you return (a loop that fills another tensor, or returns "
             "before filling, leaves zeros)")
    ignored = []  # the arguments whose values make no difference: other random numbers there give the same result
    for j, arg in enumerate(case.args if t.is_floating_point() and bool(torch.isfinite(t).all()) else ()):
        g = torch.Generator().manual_seed(7919 + j)
        other = (float(arg.abs().max()) or 1.0) * torch.randn(*arg.shape, generator=g, dtype=torch.float64)
        try:
            again = fn.observe(CALL_WITH, *(other.to(arg.dtype) if m == j else a for m, a in enumerate(case.args)),
                               **case.kwargs)[0]
        except LearnerRaised:
            continue
        if isinstance(again, torch.Tensor) and again.shape == t.shape and torch.equal(again.double(), a64):
            ignored.append(arg_names[j])
    if ignored:
        names = " and ".join(ignored)
        fail(f"the result does not depend on {names}", tried=f"{tried}, then again with other values in {names}",
             got=f"the same result both times ({preview(t)})",
             expected=f"a result that changes with {names}: {expected}",
             cause=f"your function never uses the values of {names}" if len(ignored) < len(arg_names) else
             "your function returns the same thing whatever its inputs hold (a constant, or numbers typed in)",
             fix=f"compute the result from {names} as the docstring says")
    short, where = next((texts for tag, texts in tags.items() if len(wrong) < len(cases) and
                         set(wrong) == {j for j, c in enumerate(cases) if tag in c.tags}), ("", ""))
    if tuple(t.shape) != tuple(e64.shape):
        shapes = {tuple(v.shape) for v in values if v is not None}
        if len(shapes) == 1 and len({tuple(c.expected.shape) for c, v in zip(cases, values) if v is not None}) > 1:
            fixed = next(iter(shapes))
            fail(f"shape {fixed} whatever the input", tried=tried, got=f"shape {fixed} here and on every other input",
                 expected=f"shape {tuple(e64.shape)} here: the shape follows the inputs' shapes",
                 cause="a size is fixed in your code (a loop over a fixed range, or a number typed in) instead of "
                       "read from the inputs' shapes", fix="take every size from the inputs, e.g. K.shape[0] for the "
                       "number of keys")
        if where:
            fail(f"wrong shape with {short} only", tried=tried, got=f"shape {tuple(t.shape)}",
                 expected=f"shape {tuple(e64.shape)}",
                 cause=f"your result has the right shape on the other cases, so a step of your code breaks on {where}",
                 fix="follow the shapes in the docstring for any number of leading axes; print(x.shape) after each "
                     "step helps")
        expect_shape(t, e64.shape, tried=tried, what="your result")
    if t.ndim >= 3 and t.shape[:-2].numel() > 1:
        rows = [_close(x, e, case.atol) for x, e in zip(a64.flatten(0, -3), e64.flatten(0, -3))]
        if rows[0] and not any(rows[1:]):
            fail("right for the first batch entry only", tried=tried,
                 got="the first entry of the leading axes is right, every other one is wrong",
                 expected=f"{oracle} for every entry of the leading axes: {expected}",
                 cause="your code computes the scores of the first entry of the leading axes (index 0, e.g. "
                       "Q[0] @ K[0].T) and uses them for the others, or leaves the others out",
                 fix="let the product run over all leading axes: Q @ K.transpose(-2, -1)")
    # every entry a float16 or bfloat16 number (and not all small integers): computed in that dtype
    half = None if t.dtype not in (torch.float32, torch.float64) or not t.numel() or not torch.isfinite(t).all() or (
        bool((t == t.round()).all()) and float(t.abs().max()) < 2048) else made_of_half(t)
    if half and bool(((a64 - e64).abs() <= 2e-2 * max(case.magnitude, 1e-30)).all()):
        name = str(half).replace("torch.", "")
        fail(f"computed in {name}", tried=tried, got=f"values close to the expected ones but every one of them a "
             f"{name} number: {preview(t)}", expected=expected, cause=f"part of your computation ran in {name} "
             f"(.half(), .bfloat16()), which keeps about {DIGITS[half]} significant digits, and the "
             "result was converted back",
             fix="keep the computation in the inputs' dtype")
    if where and not describe_mismatch(t, e64, atol=case.atol, rtol=1e-5, factors=factors)[2]:
        fail(f"wrong with {short} only", tried=tried, got=preview(t), expected=expected,
             cause=f"your results are right on the other cases, so a step of your code mishandles {where}",
             fix="run your function on such an input yourself and compare each step with the docstring")


def fresh_values(fn: Any, case: TensorCase, oracle: Callable[..., torch.Tensor], *, call: str, seed: int,
                 magnitude: Callable[..., float] | None = None) -> None:
    """Once every case is right: ``fn`` again on ``case``'s shapes, dtypes and keywords with new values (seeded
    N(0, 1); ``magnitude`` of the new arguments, else the case's). A result kept between calls (a cache keyed by shape,
    a call counter) shows here, where no case repeats a shape. ``oracle`` takes the arguments in float64."""
    g = torch.Generator().manual_seed(seed)
    args = tuple(torch.randn(*a.shape, generator=g, dtype=torch.float64).to(a.dtype) if isinstance(a, torch.Tensor)
                 else a for a in case.args)
    new = replace(case, args=args, expected=oracle(*(a.double() if isinstance(a, torch.Tensor) else a for a in args),
                                                   **case.kwargs),
                  magnitude=magnitude(*args) if magnitude else case.magnitude)
    try:
        got = fn.observe(CALL_WITH, *args, **case.kwargs)[0]
    except LearnerRaised:
        return  # an exception on values like the cases' says nothing the cases did not
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(new.expected.shape) or \
            _close(got, new.expected, new.atol):
        return
    stale = _close(got, case.expected, case.atol)
    fail("an earlier result returned again" if stale else "wrong on new values of the same shapes",
         tried=f"{call} with {case.label} (right), then with new values of the same shapes and dtypes",
         got=preview(got), expected=preview(new.expected),
         cause=kept_cause() if stale else "your function was right on these shapes before and is wrong now: its result "
         "depends on something besides its arguments (a value kept between calls, a call counter)", fix=KEPT_FIX)
