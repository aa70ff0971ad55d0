"""Checks for notebook 01 (queries, keys and the dot product), and the case runner notebook 02 shares.

Each check runs the learner's function on a set of :class:`Case` objects (non-square and square,
batched up to five axes, size-1 axes, float32 and float64, large values, zero vectors, a non-default
``eps``), compares every result with PyTorch, and then, when something is wrong, looks for the
mistake with evidence from *all* the cases:

* a :class:`Pitfall` is a known mistake written as code; it is blamed only when it reproduces the
  learner's outcome on every case — the same values, or the same exception with the same message
  (e.g. ``q @ K`` gives wrong numbers for a square ``K`` and a shape error for the others);
* an exception on some cases counts as reproduced when the mistake raises the same type there and
  also reproduces at least one of the learner's wrong values elsewhere (``q @ K``: a shape error for
  most ``K``, ``Kᵀ q`` for a square one);
* otherwise the first wrong case is measured (:func:`describe_cases`): a result that does not change
  when an argument does (the learner's function is called again with other values in it), one shape
  whatever the input, shape, dtype, precision, right for the first batch entry only, a constant factor,
  a transpose, the right values in another order, inputs changed in place, or "wrong only on batched
  input / only with eps passed / only with a zero vector…";
* an exception in the learner's code is shown with the learner's line, with no guessed hint.

Inputs reach the learner's function through one learner-side probe, :func:`_call_watching_inputs`,
which also reports whether the function changed its arguments in place.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .boundary import probe
from .compare import Failure, describe_mismatch, fmt
from .core import Learner, LearnerRaised, as_tensor, check, expect_shape, fail, learner_error

__all__ = ["check_query_scores_loop", "check_query_scores", "check_score_matrix", "check_cosine_scores",
           "Case", "Pitfall", "run_cases", "random_tensor", "transpose_pitfalls", "score_magnitude", "expect_signature",
           "d_factors"]


# ============================================================================ learner side
CALL_PROBE = "attn_course.checks.dot.call"


@probe(CALL_PROBE)
def _call_watching_inputs(fn: Callable, *args: Any, **kwargs: Any) -> tuple[Any, list[int]]:
    """Run ``fn(*args, **kwargs)`` in the learner's process; return its result and the positions of
    the tensor arguments it changed in place (values, shape or dtype)."""
    before = [a.clone() if isinstance(a, torch.Tensor) else None for a in args]
    result = fn(*args, **kwargs)
    changed = [i for i, (a, b) in enumerate(zip(args, before)) if b is not None and
               (a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b))]
    return result, changed


# ============================================================================ cases and pitfalls
#: What a case tag means, for "wrong only on …" diagnoses: (short form for the summary, long form).
TAGS = {
    "batched": ("batched input", "batched input (leading axes before the last two)"),
    "4-D": ("4-D input", "input with 4 or more axes (batch and heads)"),
    "size-1": ("size-1 axes", "inputs with an axis of size 1"),
    "float64": ("float64", "float64 input"),
    "float32": ("float32", "float32 input"),
    "large": ("large values", "large values (entries near 1000)"),
    "zero": ("zero vectors", "a zero vector"),
    "eps": ("a given eps", "an eps other than the default"),
    "square": ("square input", "square matrices"),
    "one key": ("one key", "a single key"),
}


def random_tensor(*shape: int, seed: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    """Seeded N(0, scale²) entries (drawn in float64, so a case's values do not depend on its dtype)."""
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)


@dataclass
class Case:
    """One call of the learner's function: its arguments, the expected result (float64) and its tags."""

    label: str
    args: tuple
    expected: torch.Tensor
    kwargs: dict = field(default_factory=dict)
    tags: frozenset = frozenset()
    #: largest rounding the computation may accumulate (for dot products: max Σ|qᵢ kᵢ|)
    magnitude: float = 1.0

    @property
    def dtype(self) -> torch.dtype:
        return self.args[0].dtype

    def tolerance(self) -> float:
        """Absolute tolerance: float32-level rounding with a wide margin, for float64 input too (a float32
        constant such as torch.sqrt(torch.tensor(d_k)), or a float32 result, is a correct answer: the
        docstrings ask for a floating-point result); float16 and bfloat16 errors are 15–100× larger."""
        return (3e-5 if self.dtype == torch.float32 else 2e-6) * max(self.magnitude, 1e-30)


@dataclass
class Pitfall:
    """A known mistake as code: ``impls`` are ways to write it (each called with a case's arguments).
    It is blamed when, on every case, one of them reproduces the learner's outcome."""

    summary: str
    cause: str
    fix: str
    impls: Sequence[Callable[..., Any]]

    def outcomes(self, case: Case) -> list[tuple]:
        """What each way of writing this mistake gives on ``case``."""
        return [_run_here(impl, case) for impl in self.impls]


def _run_here(impl: Callable, case: Case) -> tuple:
    """Run a pitfall's code on a case here (copies of the inputs): ("value", tensor) or ("raised", type, message)."""
    args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in case.args)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = impl(*args, **case.kwargs)
    except Exception as exc:  # noqa: BLE001 - the mistake fails on this input: that is its outcome
        return ("raised", type(exc).__name__, _norm(str(exc)))
    if isinstance(out, torch.Tensor):
        return ("value", out.detach())
    return ("other",)


def _norm(message: str) -> str:
    return " ".join(message.split())[:2000]


#: Mistakes any exercise of these notebooks can make.
COMMON_PITFALLS = [
    Pitfall("torch.from_numpy on a tensor", "torch.from_numpy takes a NumPy array, and the inputs are already "
            "torch tensors", "use the tensors as they are", [lambda x, *args, **kwargs: torch.from_numpy(x)]),
]


# ============================================================================ the learner's outcomes
@dataclass
class Outcome:
    value: torch.Tensor | None = None
    raised: LearnerRaised | None = None
    changed: tuple[int, ...] = ()


def _call(fn: Learner, case: Case, tried: str, arg_names: Sequence[str]) -> Outcome:
    try:
        result = fn.observe(CALL_PROBE, *case.args, **case.kwargs)
    except LearnerRaised as exc:
        return Outcome(raised=exc)
    value, changed = result if isinstance(result, tuple) and len(result) == 2 else (result, [])
    if isinstance(value, np.ndarray):
        fail("returned a NumPy array, not a tensor", tried=tried, got=f"a NumPy array of shape {value.shape}",
             expected="a torch.Tensor, as the docstring says",
             cause="part of your computation went through NumPy (np.dot, .numpy(), np.sum…), which returns an array",
             fix="stay with torch operations on the tensors (@, torch.matmul, .sum), or convert back with torch.from_numpy")
    if isinstance(value, (np.generic, int, float)) and not isinstance(value, bool):
        fail(f"returned a Python number, not a tensor", tried=tried, got=f"the number {fmt(float(value))}",
             expected=f"a tensor of shape {tuple(case.expected.shape)}",
             cause=".item(), float(…) or a sum over every entry turned the result into one number",
             fix="keep one score per pair in a tensor")
    if isinstance(value, (list, tuple)):
        kind = type(value).__name__
        fail(f"returned a Python {kind}, not a tensor", tried=tried, got=f"a {kind} of {len(value)} items",
             expected=f"a tensor of shape {tuple(case.expected.shape)}",
             cause=f"a Python {kind} of scores is not a tensor (.tolist(), or a list built in a loop and returned "
                   "as it is)", fix="turn a list of 0-d tensors into one tensor with torch.stack(scores); "
                                    "leave out .tolist()")
    t = as_tensor(value, tried=tried, expected=f"a tensor of shape {tuple(case.expected.shape)}")
    return Outcome(value=t, changed=tuple(int(i) for i in changed if 0 <= int(i) < len(arg_names)))


def _close(a: torch.Tensor, b: torch.Tensor, atol: float) -> bool:
    if tuple(a.shape) != tuple(b.shape):
        return False
    if not (a.is_floating_point() or a.is_complex()) and not (b.is_floating_point()):
        return torch.equal(a.to(torch.float64), b.to(torch.float64))
    a64, b64 = a.detach().to(torch.float64), b.detach().to(torch.float64)
    return bool(torch.allclose(a64, b64, atol=atol, rtol=1e-5, equal_nan=True))


def _values_right(out: Outcome, case: Case) -> bool:
    return out.value is not None and _close(out.value, case.expected, case.tolerance()) and \
        out.value.is_floating_point()


def _right(out: Outcome, case: Case) -> bool:
    return _values_right(out, case) and not out.changed


def _same_value(out: Outcome, made: tuple, case: Case) -> bool:
    if made[0] != "value" or out.value is None:
        return False
    scale = max(float(made[1].detach().abs().nan_to_num(0, 0, 0).max()) if made[1].numel() else 0.0, case.magnitude)
    return _close(out.value, made[1], atol=max(case.tolerance(), 1e-5 * scale))


def _reproduces(pitfall: Pitfall, case: Case, out: Outcome, *, loose: bool = False) -> bool:
    """Does one way of writing ``pitfall`` give the learner's outcome on ``case``: the same values, or the same
    exception (with the same message; ``loose``: of the same type, whatever its message)?"""
    for made in pitfall.outcomes(case):
        if out.raised is not None:
            if made[0] == "raised" and made[1] == out.raised.type_name and \
                    (loose or made[2] == _norm(out.raised.message)):
                return True
        elif _same_value(out, made, case):
            return True
    return False


def _pitfalls_found(pitfalls: Sequence[Pitfall], cases: Sequence[Case], outcomes: Sequence[Outcome]) -> list[Pitfall]:
    """The known mistakes that reproduce the learner's outcome on every case. First with exceptions matched
    by type and message; if none, by type alone — then only a mistake that also reproduces at least one of
    the learner's wrong *values* counts (positive evidence: an exception alone, e.g. a shape error, has
    many possible causes)."""
    found = [p for p in pitfalls if all(_reproduces(p, c, o) for c, o in zip(cases, outcomes))]
    if not found:
        def reproduces_a_wrong_value(p: Pitfall) -> bool:
            return any(o.value is not None and not _values_right(o, c) and any(_same_value(o, m, c) for m in p.outcomes(c))
                       for c, o in zip(cases, outcomes))

        found = [p for p in pitfalls if all(_reproduces(p, c, o, loose=True) for c, o in zip(cases, outcomes))
                 and reproduces_a_wrong_value(p)]
    return list({(p.summary, p.cause, p.fix): p for p in found}.values())


# ============================================================================ running and judging
def preview(t: torch.Tensor, n: int = 6) -> str:
    """``shape (4,): 0.7, 0.14, -0.14, 0.51`` (at most ``n`` entries)."""
    flat = t.detach().reshape(-1).to(torch.float64)
    shown = ", ".join(fmt(float(v)) for v in flat[:n])
    more = ", …" if flat.numel() > n else ""
    return f"shape {tuple(t.shape)}: {shown}{more}" if flat.numel() else f"shape {tuple(t.shape)} (empty)"


def _got(out: Outcome) -> str:
    if out.raised is not None:
        where = out.raised.where()
        return f"{out.raised.type_name}: {out.raised.message}" + (f"\nat {where}" if where else "")
    return preview(out.value)


def run_cases(fn: Learner, *, name: str, call: str, cases: Sequence[Case], pitfalls: Sequence[Pitfall],
              arg_names: Sequence[str], factors: Callable[[Case], dict[str, float]] | None = None,
              expected_text: str = "the values computed with PyTorch",
              explain: Callable[[Sequence[Case], Sequence["Outcome"], str], None] | None = None) -> None:
    """Call ``fn`` on every case; return if every result is right, else end the check with a diagnosis.

    ``call`` shows the call in messages ("query_scores(q, K)"); ``arg_names`` names the positional
    arguments (for "you changed K in place"); ``factors`` names constants a result may be off by;
    ``explain(cases, outcomes, tried)`` may end the check with an exercise-specific measurement when no
    known mistake reproduces the results.
    """
    outcomes = []
    for case in cases:
        tried = f"{call} with {case.label}"
        outcomes.append(_call(fn, case, tried, arg_names))
    wrong = [i for i, (case, out) in enumerate(zip(cases, outcomes)) if not _right(out, case)]
    if not wrong:
        return
    first = wrong[0]
    case, out = cases[first], outcomes[first]
    tried = f"{call} with {case.label}"
    expected = preview(case.expected)

    values_wrong = [i for i in wrong if not _values_right(outcomes[i], cases[i])]
    if values_wrong:
        found = _pitfalls_found([*pitfalls, *COMMON_PITFALLS], cases, outcomes)
        first = values_wrong[0]
        case, out = cases[first], outcomes[first]
        tried, expected = f"{call} with {case.label}", preview(case.expected)
        if len(found) == 1:
            p = found[0]
            fail(p.summary, tried=tried, got=_got(out), expected=expected, cause=p.cause, fix=p.fix)
        if found:
            fail(" or ".join(p.summary for p in found), tried=tried, got=_got(out), expected=expected,
                 cause="on these inputs two mistakes give the same results: " + " — or ".join(p.cause for p in found),
                 fix="; otherwise ".join(p.fix for p in found))
        if explain is not None:
            explain(cases, outcomes, tried)
        describe_cases(cases, outcomes, values_wrong, tried=tried, expected_text=expected_text,
                       factors=factors(case) if factors else {}, fn=fn, call=call, arg_names=arg_names)
    # The values are right everywhere: an input was changed in place.
    case, out = cases[first], outcomes[first]
    names = " and ".join(arg_names[j] for j in out.changed)
    fail(f"changed its input {names} in place", tried=tried,
         got=f"the right result, but afterwards the caller's {names} holds different values",
         expected=f"{names} left as it was (the docstring: inputs are left unchanged)",
         cause=f"your code modifies {names} in place (an operation ending in _ such as mul_ or transpose_, "
               "or +=, *=, /= on an input)",
         fix="compute into a new tensor: write x = x * y (or x / n) instead of x *= y (x /= n)")


def _ignored_arguments(fn: Learner, case: Case, out: Outcome, arg_names: Sequence[str], call: str) -> list[str]:
    """The tensor arguments whose values make no difference to the learner's result: ``case`` is run again
    with that argument replaced by other random numbers (same shape and dtype), and the result is the same."""
    if out.value is None or not out.value.is_floating_point() or not bool(torch.isfinite(out.value).all()):
        return []
    ignored = []
    for i, arg in enumerate(case.args[:len(arg_names)]):
        if not isinstance(arg, torch.Tensor) or not arg.numel():
            continue
        scale = float(arg.abs().max()) or 1.0
        other = random_tensor(*arg.shape, seed=7919 + i, dtype=arg.dtype, scale=scale)
        args = tuple(other if j == i else a for j, a in enumerate(case.args))
        try:
            again = _call(fn, Case(case.label, args, case.expected, case.kwargs, case.tags, case.magnitude),
                          f"{call} with {arg_names[i]} replaced", arg_names)
        except Failure:
            continue
        if again.value is not None and tuple(again.value.shape) == tuple(out.value.shape) and \
                torch.equal(again.value.to(torch.float64), out.value.to(torch.float64)):
            ignored.append(arg_names[i])
    return ignored


def _fixed_shape(cases: Sequence[Case], outcomes: Sequence[Outcome]) -> tuple[int, ...] | None:
    """The one shape every returned result has, when the expected shapes differ between those cases."""
    shapes = {tuple(o.value.shape) for o in outcomes if o.value is not None}
    wanted = {tuple(c.expected.shape) for c, o in zip(cases, outcomes) if o.value is not None}
    if len(shapes) == 1 and len(wanted) > 1:
        return next(iter(shapes))
    return None


def _only_first_batch_entry(t: torch.Tensor, case: Case) -> bool:
    """Batched input, and the result is right for the first entry of the leading axes only."""
    if t.ndim < 3 or tuple(t.shape) != tuple(case.expected.shape):
        return False
    a = t.detach().to(torch.float64).reshape(-1, *t.shape[-2:])
    e = case.expected.reshape(-1, *t.shape[-2:])
    if a.shape[0] < 2:
        return False
    right = [_close(a[i], e[i], case.tolerance()) for i in range(a.shape[0])]
    return right[0] and not any(right[1:])


def describe_cases(cases: Sequence[Case], outcomes: Sequence[Outcome], wrong: Sequence[int], *, tried: str,
                   expected_text: str, factors: dict[str, float], fn: Learner | None = None, call: str = "",
                   arg_names: Sequence[str] = ()) -> None:
    """No known mistake reproduces the answer: measure what is wrong on the first wrong case."""
    first = wrong[0]
    case, out = cases[first], outcomes[first]
    expected = preview(case.expected)
    if out.raised is not None:
        raise Failure(learner_error(out.raised, tried=tried, expected=expected))
    t = out.value
    a64, e64 = t.detach().to(torch.float64), case.expected
    if t.numel() and bool((a64 == 0).all()) and bool((e64 != 0).any()):
        fail("all zeros", tried=tried, got=f"every entry is 0 ({preview(t)})", expected=expected,
             fix="make sure every score is written into the tensor you return (a loop that fills another tensor, "
                 "or returns before filling, leaves zeros)")
    ignored = _ignored_arguments(fn, case, out, arg_names, call) if fn is not None else []
    if ignored:
        names = " and ".join(ignored)
        every = len(ignored) == len([a for a in case.args[:len(arg_names)] if isinstance(a, torch.Tensor)])
        fail(f"the result does not depend on {names}", tried=f"{tried}, then again with other values in {names}",
             got=f"the same result both times ({preview(t)})",
             expected=f"a result that changes with {names}: {expected}",
             cause=(f"your function never uses the values of {names}" if not every else
                    "your function returns the same thing whatever its inputs hold (a constant, or numbers typed in)"),
             fix=f"compute the result from {names} as the docstring says")
    short, where = _only_on(cases, wrong)
    if tuple(t.shape) != tuple(case.expected.shape):
        fixed = _fixed_shape(cases, outcomes)
        if fixed is not None:
            fail(f"shape {fixed} whatever the input", tried=tried, got=f"shape {fixed} here and on every other input",
                 expected=f"shape {tuple(case.expected.shape)} here: the shape follows the inputs' shapes",
                 cause=f"a size is fixed in your code (a loop over a fixed range, or a number typed in) instead of "
                       "read from the inputs' shapes",
                 fix="take every size from the inputs, e.g. K.shape[0] for the number of keys")
        if where:
            fail(f"wrong shape with {short} only", tried=tried, got=f"shape {tuple(t.shape)}",
                 expected=f"shape {tuple(case.expected.shape)}",
                 cause=f"your result has the right shape on the other cases, so a step of your code breaks on {where}",
                 fix="follow the shapes in the docstring for any number of leading axes; "
                     "print(x.shape) after each step helps")
        expect_shape(t, case.expected.shape, tried=tried, what="your result")
    if t.dtype in (torch.float16, torch.bfloat16) and case.dtype not in (torch.float16, torch.bfloat16):
        have = str(t.dtype).replace("torch.", "")
        fail(f"result in {have}", tried=tried, got=f"a {have} result: {preview(t)}", expected=expected,
             cause=f"your computation converted to {have} (.half(), .bfloat16() or dtype={have}), which keeps only "
                   "about 3 significant digits", fix="compute in the inputs' dtype")
    if _only_first_batch_entry(t, case):
        fail("right for the first batch entry only", tried=tried,
             got="the first entry of the leading axes is right, every other one is wrong",
             expected=f"{expected_text} for every entry of the leading axes: {expected}",
             cause="your code computes the scores of the first entry of the leading axes (index 0, e.g. Q[0] @ K[0].T) "
                   "and uses them for the others, or leaves the others out",
             fix="let the product run over all leading axes: Q @ K.transpose(-2, -1)")
    half = _half_precision(t)
    if half and bool(((a64 - e64).abs() <= 2e-2 * max(case.magnitude, 1e-30)).all()):
        fail(f"computed in {half}", tried=tried, got=f"values close to the expected ones but every one of them a "
             f"{half} number: {preview(t)}", expected=expected,
             cause=f"part of your computation ran in {half} (.half(), .bfloat16()), which keeps about 3 significant "
                   "digits, and the result was converted back", fix="keep the computation in the inputs' dtype")
    if t.ndim == 1 and t.numel() > 1 and t.is_floating_point() and not torch.isnan(a64).any() and \
            _close(a64.sort().values, e64.sort().values, case.tolerance()):
        summary, cause = _wrong_order(a64, e64, case.tolerance())
        fail(summary, tried=tried, got=preview(t), expected=expected, cause=cause,
             fix="put the score of K[j] at position j")
    mismatch = describe_mismatch(t, e64, what="your result", atol=case.tolerance(), rtol=1e-5, factors=factors)
    got, exp, cause, summary = mismatch
    if where and not cause:
        fail(f"wrong with {short} only", tried=tried, got=got, expected=expected,
             cause=f"your results are right on the other cases, so a step of your code mishandles {where}",
             fix="run your function on such an input yourself and compare each step with the docstring")
    fail(summary, tried=tried, got=got, expected=f"{expected_text}: {expected}", cause=cause,
         fix=mismatch.fix or "compare your steps with the docstring on this input; print the intermediate tensors")


def _wrong_order(a: torch.Tensor, e: torch.Tensor, tol: float) -> tuple[str, str]:
    """(summary, cause) for a 1-D result that holds the right scores in another order: sorted, reversed,
    rotated, or some other order."""
    n = a.numel()
    for descending, how in ((False, "ascending"), (True, "descending")):
        if _close(a, e.sort(descending=descending).values, tol):
            return (f"right scores, sorted in {how} order",
                    f"every score is right but your result is sorted ({how}): entry j must be the score of key j, "
                    "in the keys' order; a sort (torch.sort, sorted, .sort(), topk) the docstring does not have")
    if _close(a, e.flip(0), tol):
        return ("right scores in reverse order",
                "every score is right but in reverse order: your index counts down from the end (K[-1 - j], "
                "or a flip)")
    for shift in range(1, n):
        if _close(a, e.roll(-shift), tol) or _close(a, e.roll(shift), tol):
            return ("right scores, shifted",
                    f"every score is right but shifted by {shift} place{'s' if shift > 1 else ''}, wrapping round: an "
                    "index off by a constant (K[j + 1] or K[j - 1] for K[j])")
    return ("right scores in the wrong order",
            "every score is right but they are not in the keys' order: entry j must be the score of key j "
            "(an index that picks the wrong key)")


def _only_on(cases: Sequence[Case], wrong: Sequence[int]) -> tuple[str, str]:
    """The tag of exactly the wrong cases, as (short, long) text, or ("", "") when no tag singles them out."""
    bad = set(wrong)
    for tag, texts in TAGS.items():
        if bad == {i for i, c in enumerate(cases) if tag in c.tags} and len(bad) < len(cases):
            return texts
    return "", ""


def _half_precision(t: torch.Tensor) -> str:
    """"float16" or "bfloat16" when every entry of a float32/64 tensor is exactly such a number (and not all
    small integers): evidence that the values were computed in that dtype."""
    if t.dtype not in (torch.float32, torch.float64) or not t.numel() or not torch.isfinite(t).all():
        return ""
    if bool((t == t.round()).all()) and float(t.abs().max()) < 2048:
        return ""
    for dtype in (torch.float16, torch.bfloat16):
        if bool((t.to(dtype).to(t.dtype) == t).all()):
            return str(dtype).replace("torch.", "")
    return ""


def expect_signature(fn: Learner, names: Sequence[str], *, call: str, signature: str) -> None:
    """Fail unless the learner's function accepts every keyword in ``names`` (or **kwargs), each with a
    default value (the checks call it with and without them)."""
    params = fn.inspect().get("signature")
    if not params:
        return
    by_name = {p["name"]: p for p in params}
    listed = f"a function with parameters ({', '.join(p['name'] for p in params)})"
    if not any(p["kind"] == "VAR_KEYWORD" for p in params):
        missing = [n for n in names if n not in by_name]
        if missing:
            fail(f"no parameter {missing[0]}", tried=f"calling {call}", got=listed,
                 expected=f"the signature {signature}", cause=f"the parameter `{missing[0]}` was removed or renamed",
                 fix=f"keep the exercise's signature: def {signature}:")
    no_default = [n for n in names if n in by_name and not by_name[n]["has_default"]]
    if no_default:
        fail(f"{no_default[0]} has no default value", tried=f"calling {call}", got=listed,
             expected=f"the signature {signature}", cause=f"`{no_default[0]}` lost its default, so a call without "
             "it fails", fix=f"keep the exercise's signature: def {signature}:")


# ============================================================================ one query against every key
def score_magnitude(Q: torch.Tensor, K: torch.Tensor) -> float:
    """Largest Σᵢ|qᵢ kᵢ| over all pairs: what rounding errors in a dot product scale with."""
    Qa, Ka = Q.abs().to(torch.float64), K.abs().to(torch.float64)
    if Q.ndim == 1:
        return float((Ka @ Qa).max())
    return float((Qa @ Ka.transpose(-2, -1)).max())


def _one_query_cases() -> list[Case]:
    specs = [  # (label, d, n_k, dtype, scale, tags)
        ("q of size 3 and 6 keys (K shape (6, 3)), float32", 3, 6, torch.float32, 1.0, {"float32"}),
        ("q of size 5 and 2 keys (K shape (2, 5)), float64", 5, 2, torch.float64, 1.0, {"float64"}),
        ("q of size 4 and 4 keys (square K), float32", 4, 4, torch.float32, 1.0, {"float32", "square"}),
        ("one key (K shape (1, 6)), float64", 6, 1, torch.float64, 1.0, {"float64", "size-1", "one key"}),
        ("vectors of size 1 (q shape (1,), K shape (5, 1)), float32", 1, 5, torch.float32, 1.0,
         {"float32", "size-1"}),
        ("entries near 1000 (q size 8, K shape (3, 8)), float32", 8, 3, torch.float32, 1000.0,
         {"float32", "large"}),
    ]
    cases = []
    for n, (label, d, n_k, dtype, scale, tags) in enumerate(specs):
        q = random_tensor(d, seed=100 + 2 * n, dtype=dtype, scale=scale)
        K = random_tensor(n_k, d, seed=101 + 2 * n, dtype=dtype, scale=scale)
        expected = K.to(torch.float64) @ q.to(torch.float64)
        cases.append(Case(label, (q, K), expected, tags=frozenset(tags), magnitude=score_magnitude(q, K)))
    return cases


def _unit(x: torch.Tensor, dim: int = -1, eps: float = 1e-12) -> torch.Tensor:
    return x / x.norm(dim=dim, keepdim=True).clamp_min(eps)


def _loop(q: torch.Tensor, K: torch.Tensor, keys) -> torch.Tensor:
    return torch.stack([(q * K[j]).sum() for j in keys])


_ROW_FIX = "use K @ q, or (K * q).sum(dim=-1): row j of K is key j"
ONE_QUERY_PITFALLS = [
    Pitfall("q multiplied by the columns of K", "you paired q with the columns of K (q @ K, K.T @ q or an "
            "einsum like 'd,dn->n'), but each key is a *row* of K", _ROW_FIX,
            [lambda q, K: q @ K, lambda q, K: K.T @ q, lambda q, K: torch.mv(K.T, q), lambda q, K: torch.matmul(K.T, q),
             lambda q, K: torch.einsum("d,dn->n", q, K), lambda q, K: torch.einsum("i,ij->j", q, K)]),
    Pitfall("summed over the keys (axis 0)", "you added up the products over axis 0, down the keys (a sum with "
            "dim=0, or an einsum such as 'd,nd->d' that keeps the entry index), so each number mixes every key",
            "sum over the vector entries, the last axis: (K * q).sum(dim=-1), or torch.einsum('d,nd->n', q, K)",
            [lambda q, K: (K * q).sum(0), lambda q, K: torch.sum(q * K, dim=0),
             lambda q, K: torch.einsum("d,nd->d", q, K)]),
    Pitfall("products not added up", "you multiplied q and K entry by entry but did not add the products "
            "of each key", "add them: (K * q).sum(dim=-1)", [lambda q, K: K * q]),
    Pitfall("summed over everything", "you added up every product of every key, which leaves one number",
            "sum only over the last axis, (K * q).sum(dim=-1), so that one score per key remains",
            [lambda q, K: (K * q).sum(), lambda q, K: (K @ q).sum(), lambda q, K: (K * q).sum().reshape(1)]),
    Pitfall("a column (n_k, 1) instead of a vector", "the right scores with an extra axis of size 1 at the end: "
            "q used as a column (q[:, None], q.unsqueeze(-1)), keepdim=True, or an unsqueeze(-1) of the result",
            "return shape (n_k,): K @ q, or .squeeze(-1) on the column",
            [lambda q, K: K @ q[:, None], lambda q, K: (K * q).sum(-1, keepdim=True)]),
    Pitfall("a row (1, n_k) instead of a vector", "the right scores with an extra axis of size 1 in front: q "
            "used as a row (q[None] @ K.T), or an unsqueeze(0) of the result",
            "return shape (n_k,): K @ q, or .squeeze(0) on the row", [lambda q, K: q[None] @ K.T]),
    Pitfall(".squeeze() removed the key axis", ".squeeze() removes every axis of size 1, so with a single key "
            "your result loses the key axis", "squeeze only the axis you added: .squeeze(-1), or write K @ q",
            [lambda q, K: (K @ q[:, None]).squeeze(), lambda q, K: (q[None] @ K.T).squeeze()]),
    Pitfall("cosine similarity instead of the dot product", "you divided by the vectors' lengths: that is cosine "
            "similarity (exercise 4); a score is the plain dot product q · K[j]", "leave out the division by the norms",
            [lambda q, K: F.cosine_similarity(K, q[None], dim=-1), lambda q, K: (K @ q) / (K.norm(dim=-1) * q.norm())]),
    Pitfall("averaged the products instead of adding them", "you took the mean of the d products (or divided the "
            "sum by d)", "add the products: (K * q).sum(dim=-1)",
            [lambda q, K: (K * q).mean(-1), lambda q, K: K @ q / q.shape[0]]),
    Pitfall("divided by √d", "you divided by √d: that is notebook 02's scaled score; this exercise asks for the "
            "plain dot product", "leave out the division", [lambda q, K: K @ q / math.sqrt(q.shape[0])]),
    Pitfall("softmax of the scores", "you turned the scores into weights with a softmax (notebook 03)",
            "return the scores themselves", [lambda q, K: torch.softmax(K @ q, -1)]),
    Pitfall("a distance instead of a dot product", "you measured the distance between q and each key, not their "
            "dot product", "use the dot product: K @ q",
            [lambda q, K: (K - q).norm(dim=-1), lambda q, K: ((K - q) ** 2).sum(-1), lambda q, K: -((K - q) ** 2).sum(-1),
             lambda q, K: -(K - q).norm(dim=-1)]),
    Pitfall("absolute values of the scores", "you took the absolute value (or the square) of each score; a dot "
            "product keeps its sign", "return q · K[j] itself",
            [lambda q, K: (K @ q).abs(), lambda q, K: (K @ q) ** 2]),
    Pitfall("the loop stops one key early", "your loop runs over range(len(K) - 1) (or stops early), so the last "
            "key gets no score", "loop over every key: for j in range(K.shape[0])", [lambda q, K: _loop(q, K, range(len(K) - 1))]),
    Pitfall("the loop skips the first key", "your loop starts at 1, so key 0 gets no score",
            "loop over every key: for j in range(K.shape[0]) starts at 0", [lambda q, K: _loop(q, K, range(1, len(K)))]),
    Pitfall("the loop runs over the vector's entries", "your loop runs over range(len(q)) (d steps) instead of "
            "over the keys (K.shape[0] steps)", "loop over the keys: for j in range(K.shape[0]), or for key in K",
            [lambda q, K: _loop(q, K, range(q.shape[0]))]),
    Pitfall("returned inside the loop", "your `return` is indented inside the loop, so the function returns after "
            "the first key", "dedent the return so it runs after the loop",
            [lambda q, K: _loop(q, K, range(1)), lambda q, K: (q * K[0]).sum(), lambda q, K: q @ K[0]]),
    Pitfall("only the last key's score kept", "each pass of your loop overwrites the score of the key before "
            "(score = … instead of scores.append(…)), so only the last key's score is left",
            "collect every key's score: scores.append(…) in the loop, then torch.stack(scores)",
            [lambda q, K: _loop(q, K, range(len(K) - 1, len(K))), lambda q, K: (q * K[-1]).sum()]),
    Pitfall("a running total instead of one score per key", "your loop keeps adding to the same total, so "
            "entry j holds the sum of the scores of keys 0 to j (the total is never reset for a new key)",
            "start each key's score from 0: compute (q * key).sum() afresh for every key",
            [lambda q, K: torch.cumsum(K @ q, 0)]),
    Pitfall("only the first product of each key", "your sum over a vector's entries keeps only the first product "
            "q[0] · K[j, 0] (a `return` or an assignment inside the loop over the entries)",
            "add all d products: (q * key).sum()", [lambda q, K: K[:, 0] * q[0]]),
    Pitfall("the sum skips the last entry of each vector", "your sum over a vector's entries stops one early "
            "(range(len(q) - 1), or a slice :-1), so the last product is missing", "add all d products",
            [lambda q, K: K[:, :-1] @ q[:-1]]),
    Pitfall("the sum skips the first entry of each vector", "your sum over a vector's entries starts at 1, so the "
            "first product is missing", "add all d products, starting at entry 0", [lambda q, K: K[:, 1:] @ q[1:]]),
    Pitfall("torch.dot on a matrix", "torch.dot takes two vectors (1-D), and K is a matrix",
            "use K @ q (or torch.mv(K, q)); torch.dot(q, K[j]) works inside a loop",
            [lambda q, K: torch.dot(q, K), lambda q, K: q.dot(K)]),
    Pitfall("torch.mm with a vector", "torch.mm multiplies two matrices, and q is a vector",
            "use torch.mv(K, q) or K @ q", [lambda q, K: torch.mm(K, q), lambda q, K: K.mm(q)]),
]


def _check_one_query(fn: Learner, name: str) -> str:
    cases = _one_query_cases()
    run_cases(fn, name=name, call=f"{name}(q, K)", cases=cases, pitfalls=ONE_QUERY_PITFALLS, arg_names=("q", "K"),
              factors=lambda c: {"d": float(c.args[0].shape[0]), "√d": math.sqrt(c.args[0].shape[0])},
              expected_text="K @ q")
    return f"matches K @ q on {len(cases)} cases (square K, one key, d = 1, float32/64, large values)"


_LOOP_EXPECTS = "a function query_scores_loop(q, K) returning a tensor of shape (n_k,)"


@check("query_scores_loop", expects=_LOOP_EXPECTS)
def check_query_scores_loop(fn: Learner) -> str:
    return _check_one_query(fn, "query_scores_loop")


@check("query_scores", expects="a function query_scores(q, K) returning a tensor of shape (n_k,)")
def check_query_scores(fn: Learner) -> str:
    return _check_one_query(fn, "query_scores")


# ============================================================================ every query against every key
def _score_cases(seed: int, *, large: bool = True) -> list[Case]:
    specs = [  # (label, Q shape, K shape, dtype, scale, tags)
        ("Q (3, 5) and K (4, 5), float32", (3, 5), (4, 5), torch.float32, 1.0, {"float32"}),
        ("square Q (4, 4) and K (4, 4), float64", (4, 4), (4, 4), torch.float64, 1.0, {"float64", "square"}),
        ("a batch: Q (2, 3, 6) and K (2, 5, 6), float32", (2, 3, 6), (2, 5, 6), torch.float32, 1.0,
         {"float32", "batched"}),
        ("batch × heads: Q (2, 3, 4, 5) and K (2, 3, 6, 5), float64", (2, 3, 4, 5), (2, 3, 6, 5), torch.float64, 1.0,
         {"float64", "batched", "4-D"}),
        ("five axes: Q (2, 1, 3, 2, 4) and K (2, 1, 3, 5, 4), float32", (2, 1, 3, 2, 4), (2, 1, 3, 5, 4),
         torch.float32, 1.0, {"float32", "batched", "4-D", "size-1"}),
        ("size-1 axes: Q (1, 2, 1, 7) and K (1, 2, 1, 7), float64", (1, 2, 1, 7), (1, 2, 1, 7), torch.float64, 1.0,
         {"float64", "batched", "4-D", "size-1", "one key"}),
        ("vectors of size 1: Q (3, 1) and K (2, 1), float32", (3, 1), (2, 1), torch.float32, 1.0,
         {"float32", "size-1"}),
    ]
    if large:
        specs.append(("entries near 1000: Q (2, 8) and K (3, 8), float32", (2, 8), (3, 8), torch.float32, 1000.0,
                      {"float32", "large"}))
    cases = []
    for n, (label, qs, ks, dtype, scale, tags) in enumerate(specs):
        Q = random_tensor(*qs, seed=seed + 2 * n, dtype=dtype, scale=scale)
        K = random_tensor(*ks, seed=seed + 2 * n + 1, dtype=dtype, scale=scale)
        cases.append(Case(label, (Q, K), Q.double() @ K.double().transpose(-2, -1), tags=frozenset(tags),
                          magnitude=score_magnitude(Q, K)))
    return cases


def _loop_2d(Q, K):
    return torch.stack([torch.stack([q @ k for k in K]) for q in Q])


def transpose_pitfalls(after: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = lambda S, Q: S,
                       prepare: Callable[..., torch.Tensor] = lambda x, **kw: x) -> list[Pitfall]:
    """Mistakes in forming Q Kᵀ. ``prepare(x, **kwargs)`` maps Q and K before the product (cosine: unit
    rows, with the case's eps), ``after(S, Q)`` maps the product (scaled scores: divide by √d_k)."""

    def made(product):
        return lambda Q, K, **kw: after(product(prepare(Q, **kw), prepare(K, **kw)), Q)

    last_two = "transpose only the last two axes: K.transpose(-2, -1) (or K.mT)"
    return [
        Pitfall("K not transposed", "you multiplied by K itself (Q @ K); each score pairs a row of Q with a *row* "
                "of K, so K must be transposed", last_two,
                [made(lambda Q, K: Q @ K), made(lambda Q, K: torch.einsum("...ij,...jk->...ik", Q, K))]),
        Pitfall("rows and columns swapped (K Qᵀ)", "your matrix has the keys on the rows and the queries on the "
                "columns (K Qᵀ, the product transposed, or an einsum ending in '->...kq')",
                "put the queries on the rows: Q @ K.transpose(-2, -1), or torch.einsum('...qd,...kd->...qk', Q, K)",
                [made(lambda Q, K: K @ Q.transpose(-2, -1)), made(lambda Q, K: K @ Q.T)]),
        Pitfall("Qᵀ K instead of Q Kᵀ", "you transposed Q instead of K: Qᵀ K pairs the vectors' entries with each "
                "other, not queries with keys", "transpose K on its last two axes: Q @ K.transpose(-2, -1)",
                [made(lambda Q, K: Q.transpose(-2, -1) @ K), made(lambda Q, K: Q.T @ K), made(lambda Q, K: Q.t() @ K)]),
        Pitfall("K.T on batched input", "K.T reverses *every* axis of a batched tensor (batch axes too), so keys "
                "from different batch entries get mixed", last_two,
                [made(lambda Q, K: Q @ K.T), made(lambda Q, K: Q @ K.permute(*reversed(range(K.ndim))))]),
        Pitfall("K.transpose(0, 1) names fixed axes", "K.transpose(0, 1) swaps the first two axes: right for "
                "2-D input, but for batched input it swaps the batch axis", last_two,
                [made(lambda Q, K: Q @ K.transpose(0, 1)), made(lambda Q, K: Q @ K.transpose(1, 0))]),
        Pitfall("K.transpose(1, 2) names fixed axes", "K.transpose(1, 2) is right for 3-D input only: 2-D input "
                "has no axis 2, and with (batch, heads, n, d) it swaps heads and positions", last_two,
                [made(lambda Q, K: Q @ K.transpose(1, 2)), made(lambda Q, K: Q @ K.transpose(2, 1))]),
        Pitfall("K.permute(0, 2, 1) names fixed axes", "K.permute(0, 2, 1) fits 3-D input only", last_two,
                [made(lambda Q, K: Q @ K.permute(0, 2, 1))]),
        Pitfall("K.transpose(2, 3) names fixed axes", "K.transpose(2, 3) (or permute(0, 1, 3, 2)) is right for 4-D "
                "input (batch, heads, n, d) only: 2-D and 3-D input have no axis 3, and with 5 axes it swaps the "
                "wrong pair", last_two,
                [made(lambda Q, K: Q @ K.transpose(2, 3)), made(lambda Q, K: Q @ K.transpose(3, 2)),
                 made(lambda Q, K: Q @ K.permute(0, 1, 3, 2))]),
        Pitfall("K reshaped instead of transposed", "K.reshape(…, d, n_k) (or .view) keeps the entries in memory "
                "order and cuts them into new rows: it does not turn K's rows into columns", last_two,
                [made(lambda Q, K: Q @ K.reshape(*K.shape[:-2], K.shape[-1], K.shape[-2])),
                 made(lambda Q, K: Q @ K.view(*K.shape[:-2], K.shape[-1], K.shape[-2]))]),
        Pitfall("torch.inner pairs every batch entry", "torch.inner (like torch.tensordot over the last axis) "
                "multiplies every query with every key of *every* batch entry, so the leading axes appear twice",
                last_two, [made(lambda Q, K: torch.inner(Q, K)),
                           made(lambda Q, K: torch.tensordot(Q, K, dims=([-1], [-1])))]),
        Pitfall("2-D only: .t() or torch.mm", "K.t(), torch.mm and F.linear handle 2-D tensors only, but the "
                "docstring asks for any number of leading axes",
                "use Q @ K.transpose(-2, -1) (or torch.matmul), which works for any number of axes",
                [made(lambda Q, K: Q @ K.t()), made(lambda Q, K: torch.mm(Q, K.transpose(-2, -1))),
                 made(lambda Q, K: Q.mm(K.T)), made(lambda Q, K: F.linear(Q, K)), made(lambda Q, K: torch.mm(Q, K.t()))]),
        Pitfall("3-D only: torch.bmm", "torch.bmm takes exactly 3-D tensors, but the docstring asks for any "
                "number of leading axes", "use Q @ K.transpose(-2, -1) (or torch.matmul)",
                [made(lambda Q, K: torch.bmm(Q, K.transpose(-2, -1))), made(lambda Q, K: torch.bmm(Q, K.transpose(1, 2)))]),
        Pitfall("einsum without '...'", "your einsum names a fixed number of axes, so it fits one input rank only",
                "let '...' stand for the leading axes: torch.einsum('...qd,...kd->...qk', Q, K)",
                [made(lambda Q, K: torch.einsum("qd,kd->qk", Q, K)), made(lambda Q, K: torch.einsum("bqd,bkd->bqk", Q, K)),
                 made(lambda Q, K: torch.einsum("bhqd,bhkd->bhqk", Q, K))]),
        Pitfall("batch axes flattened together", "you flattened the leading axes into the rows, so every query is "
                "scored against the keys of every batch entry", "keep the leading axes: Q @ K.transpose(-2, -1) "
                "multiplies matching batch entries only",
                [made(lambda Q, K: Q.reshape(-1, Q.shape[-1]) @ K.reshape(-1, K.shape[-1]).T)]),
        Pitfall("summed over the keys axis", "after multiplying with broadcasting you summed over an axis of "
                "positions, not over the vector entries (the last axis)", "sum over the last axis: "
                "(Q.unsqueeze(-2) * K.unsqueeze(-3)).sum(-1)",
                [made(lambda Q, K: (Q.unsqueeze(-2) * K.unsqueeze(-3)).sum(-2)),
                 made(lambda Q, K: (Q.unsqueeze(-2) * K.unsqueeze(-3)).sum(-3))]),
        Pitfall("entry-by-entry product Q * K", "Q * K multiplies entry by entry, pairing query i only with key i",
                "take the matrix product: Q @ K.transpose(-2, -1)",
                [made(lambda Q, K: Q * K), made(lambda Q, K: (Q * K).sum(-1))]),
        Pitfall("a loop over the first axis", "your loops run over the first axis of Q and K, which is the batch "
                "axis once the input is batched", "use Q @ K.transpose(-2, -1), which loops over the leading axes for you",
                [made(_loop_2d), made(lambda Q, K: torch.stack([q @ k.T for q, k in zip(Q, K)])),
                 made(lambda Q, K: torch.stack([q @ k.transpose(-2, -1) for q, k in zip(Q, K)]))]),
        Pitfall(".squeeze() removed a size-1 axis", ".squeeze() removes every axis of size 1, here a batch axis "
                "or the single query or key", "leave the result's shape as the product gives it (…, n_q, n_k)",
                [made(lambda Q, K: (Q @ K.transpose(-2, -1)).squeeze())]),
    ]


_PLAIN_SCORE_PITFALLS = [
    Pitfall("cosine similarity instead of the dot product", "you divided by the vectors' lengths: that is cosine "
            "similarity (exercise 4)", "leave out the division by the norms",
            [lambda Q, K: _unit(Q) @ _unit(K).transpose(-2, -1)]),
    Pitfall("divided by √d", "you divided by √d: that is notebook 02's scaled score; this exercise asks for the "
            "plain dot products", "leave out the division", [lambda Q, K: Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])]),
    Pitfall("averaged the products instead of adding them", "you took the mean of the d products (or divided "
            "by d)", "add them: Q @ K.transpose(-2, -1)", [lambda Q, K: Q @ K.transpose(-2, -1) / Q.shape[-1]]),
    Pitfall("softmax of the scores", "you turned the scores into weights with a softmax (notebook 03)",
            "return the scores themselves", [lambda Q, K: torch.softmax(Q @ K.transpose(-2, -1), -1)]),
]


_PLAIN_SCORE_PITFALLS += [
    Pitfall("the sum skips the last entry of each vector", "your sum over a vector's entries stops one early "
            "(range(d - 1), or a slice :-1), so the last product is missing", "add all d products",
            [lambda Q, K: Q[..., :-1] @ K[..., :-1].transpose(-2, -1)]),
    Pitfall("the sum skips the first entry of each vector", "your sum over a vector's entries starts at 1, so the "
            "first product is missing", "add all d products, starting at entry 0",
            [lambda Q, K: Q[..., 1:] @ K[..., 1:].transpose(-2, -1)]),
]


def d_factors(case: Case) -> dict[str, float]:
    d = float(case.args[0].shape[-1])
    return {"d": d, "√d": math.sqrt(d)}


@check("score_matrix", expects="a function score_matrix(Q, K) returning a tensor of shape (..., n_q, n_k)")
def check_score_matrix(fn: Learner) -> str:
    cases = _score_cases(200)
    run_cases(fn, name="score_matrix", call="score_matrix(Q, K)", cases=cases,
              pitfalls=transpose_pitfalls() + _PLAIN_SCORE_PITFALLS, arg_names=("Q", "K"), factors=d_factors,
              expected_text="Q @ K.transpose(-2, -1)")
    return f"matches Q Kᵀ on {len(cases)} cases (2-D to 5-D, size-1 axes, float32/64, large values)"


# ============================================================================ cosine similarity
def cosine_reference(Q: torch.Tensor, K: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """The oracle: F.cosine_similarity of every query with every key, in float64."""
    return F.cosine_similarity(Q.double().unsqueeze(-2), K.double().unsqueeze(-3), dim=-1, eps=eps)


def _rows_with_norms(norms: Sequence[float], d: int, seed: int, dtype) -> torch.Tensor:
    """Rows of random direction with exactly these lengths (0 gives a zero row)."""
    x = random_tensor(len(norms), d, seed=seed, dtype=torch.float64)
    x = x / x.norm(dim=-1, keepdim=True) * torch.tensor(norms, dtype=torch.float64)[:, None]
    return x.to(dtype)


def _cosine_cases() -> list[Case]:
    cases = []

    def add(label, Q, K, tags, **kwargs):
        expected = cosine_reference(Q, K, kwargs.get("eps", 1e-8))
        cases.append(Case(label, (Q, K), expected, kwargs=kwargs, tags=frozenset(tags), magnitude=1.0))

    K0 = random_tensor(3, 4, seed=301)
    K0[1] *= 10.0
    add("Q (2, 4) and K (3, 4), one key 10× longer, float32", random_tensor(2, 4, seed=300), K0, {"float32"})
    add("square Q (3, 3) and K (3, 3), float64", random_tensor(3, 3, seed=302, dtype=torch.float64),
        random_tensor(3, 3, seed=303, dtype=torch.float64), {"float64", "square"})
    add("a batch: Q (2, 3, 5) and K (2, 4, 5), float32", random_tensor(2, 3, 5, seed=304),
        random_tensor(2, 4, 5, seed=305), {"float32", "batched"})
    add("batch × heads: Q (2, 2, 3, 4) and K (2, 2, 5, 4), float64", random_tensor(2, 2, 3, 4, seed=306, dtype=torch.float64),
        random_tensor(2, 2, 5, 4, seed=307, dtype=torch.float64), {"float64", "batched", "4-D"})
    Qz = random_tensor(3, 4, seed=308)
    Qz[1] = 0.0
    Kz = random_tensor(2, 4, seed=309)
    Kz[0] = 0.0
    add("a zero query and a zero key (Q (3, 4), K (2, 4)), float32", Qz, Kz, {"float32", "zero"})
    # eps = 0.5: queries of length 1 and 3, keys of length 1, 0.3, 0.1 and 0 (lengths below eps count as eps).
    # Length 3 with 0.3 tells clamping each length (the docstring) from clamping their product (0.9 ≥ eps).
    add("eps=0.5, queries of length 1 and 3 (Q (2, 3)) and keys of length 1, 0.3, 0.1, 0 (K (4, 3)), float64",
        _rows_with_norms([1, 3], 3, 310, torch.float64), _rows_with_norms([1, 0.3, 0.1, 0], 3, 311, torch.float64),
        {"float64", "eps", "zero"}, eps=0.5)
    add("eps=0.2, queries of length 0.05 and 1 (Q (1, 2, 5)) and unit-length keys (K (1, 3, 5)), float32",
        _rows_with_norms([0.05, 1], 5, 312, torch.float32)[None], _rows_with_norms([1, 1, 1], 5, 313, torch.float32)[None],
        {"float32", "eps", "batched", "size-1"}, eps=0.2)
    add("vectors of size 1: Q (3, 1) and K (2, 1), float64", random_tensor(3, 1, seed=314, dtype=torch.float64),
        random_tensor(2, 1, seed=315, dtype=torch.float64), {"float64", "size-1"})
    add("entries near 1000: Q (2, 6) and K (3, 6), float32", random_tensor(2, 6, seed=316, scale=1000.0),
        random_tensor(3, 6, seed=317, scale=1000.0), {"float32", "large"})
    return cases


def _cos(prep_q, prep_k):
    return lambda Q, K, eps=1e-8: prep_q(Q, eps) @ prep_k(K, eps).transpose(-2, -1)


def _clamp(x, eps):
    return x / x.norm(dim=-1, keepdim=True).clamp_min(eps)


def _keep(x, eps):
    return x


_NORM_FIX = "divide each row by its own length, clamped at eps: x / x.norm(dim=-1, keepdim=True).clamp_min(eps)"
COSINE_PITFALLS = [p for p in transpose_pitfalls(prepare=lambda x, eps=1e-8: _clamp(x, eps))
                   if not p.summary.startswith("entry-by-entry")] + [
    Pitfall("lengths not divided out", "you returned the plain dot products: cosine similarity divides each by "
            "the two vectors' lengths", _NORM_FIX, [_cos(_keep, _keep)]),
    Pitfall("only the queries normalised", "you divided the queries by their lengths but not the keys", _NORM_FIX,
            [_cos(_clamp, _keep)]),
    Pitfall("only the keys normalised", "you divided the keys by their lengths but not the queries", _NORM_FIX,
            [_cos(_keep, _clamp)]),
    Pitfall("norm over the wrong axis", "you took each length over axis -2 (down the positions) instead of each "
            "vector's own entries (the last axis)", _NORM_FIX,
            [_cos(lambda x, e: x / x.norm(dim=-2, keepdim=True).clamp_min(e),
                  lambda x, e: x / x.norm(dim=-2, keepdim=True).clamp_min(e)),
             lambda Q, K, eps=1e-8: F.normalize(Q, dim=-2, eps=eps) @ F.normalize(K, dim=-2, eps=eps).transpose(-2, -1)]),
    Pitfall("F.normalize along dim=1", "F.normalize normalises along dim=1 unless told otherwise; for batched "
            "input that is the positions axis, not the vectors' entries", "pass dim=-1: F.normalize(Q, dim=-1, eps=eps)",
            [lambda Q, K, eps=1e-8: F.normalize(Q, eps=eps) @ F.normalize(K, eps=eps).transpose(-2, -1),
             lambda Q, K, eps=1e-8: F.normalize(Q) @ F.normalize(K).transpose(-2, -1)]),
    Pitfall("norm of the whole matrix", "you divided by the norm of the whole tensor (x.norm() with no dim), not "
            "each row's own length", _NORM_FIX,
            [_cos(lambda x, e: x / x.norm().clamp_min(e), lambda x, e: x / x.norm().clamp_min(e))]),
    Pitfall("the L1 norm", "you divided by the sum of absolute values (norm(p=1)); length is the Euclidean (L2) "
            "norm", _NORM_FIX, [_cos(lambda x, e: x / x.norm(p=1, dim=-1, keepdim=True).clamp_min(e),
                                   lambda x, e: x / x.norm(p=1, dim=-1, keepdim=True).clamp_min(e))]),
    Pitfall("divided by squared lengths", "you divided by the squared lengths (x · x), not the lengths", _NORM_FIX,
            [_cos(lambda x, e: x / (x * x).sum(-1, keepdim=True).clamp_min(e), lambda x, e: x / (x * x).sum(-1, keepdim=True).clamp_min(e)),
             lambda Q, K, eps=1e-8: (Q @ K.transpose(-2, -1)) / ((Q * Q).sum(-1, keepdim=True) * (K * K).sum(-1).unsqueeze(-2)).clamp_min(eps)]),
    Pitfall("cosine distance 1 − cos", "you returned the cosine distance 1 − cos θ; the exercise asks for the "
            "similarity cos θ", "return the cosine itself", [lambda Q, K, eps=1e-8: 1 - cosine_reference(Q, K, eps).to(Q.dtype)]),
    Pitfall("absolute values", "you took the absolute value; a cosine keeps its sign (−1 for opposite directions)",
            "return the cosine itself", [lambda Q, K, eps=1e-8: cosine_reference(Q, K, eps).abs().to(Q.dtype)]),
    Pitfall("lengths not clamped", "a zero vector has length 0 and 0/0 is NaN: your lengths are not clamped at eps",
            "clamp the lengths: x.norm(dim=-1, keepdim=True).clamp_min(eps)",
            [_cos(lambda x, e: x / x.norm(dim=-1, keepdim=True), lambda x, e: x / x.norm(dim=-1, keepdim=True)),
             lambda Q, K, eps=1e-8: (Q @ K.transpose(-2, -1)) / (Q.norm(dim=-1, keepdim=True) * K.norm(dim=-1).unsqueeze(-2))]),
    Pitfall("eps ignored", "a length below the eps you are given is not raised to eps: your results are what a "
            "fixed eps gives (1e-8, or F.normalize's or F.cosine_similarity's own default), or eps used only for "
            "zero lengths",
            "pass eps on: .clamp_min(eps), F.normalize(x, dim=-1, eps=eps) or F.cosine_similarity(…, eps=eps)",
            [lambda Q, K, eps=1e-8: _cos(_clamp, _clamp)(Q, K, 1e-8),
             lambda Q, K, eps=1e-8: _cos(_clamp, _clamp)(Q, K, 1e-12),
             lambda Q, K, eps=1e-8: F.cosine_similarity(Q.unsqueeze(-2), K.unsqueeze(-3), dim=-1),
             lambda Q, K, eps=1e-8: F.normalize(Q, dim=-1) @ F.normalize(K, dim=-1).transpose(-2, -1)]),
    Pitfall("eps added instead of clamped", "you divided by length + eps; the docstring clamps: a length below "
            "eps counts as eps, a longer one is used as it is", "use x.norm(dim=-1, keepdim=True).clamp_min(eps)",
            [_cos(lambda x, e: x / (x.norm(dim=-1, keepdim=True) + e), lambda x, e: x / (x.norm(dim=-1, keepdim=True) + e)),
             lambda Q, K, eps=1e-8: (Q @ K.transpose(-2, -1)) / (Q.norm(dim=-1, keepdim=True) * K.norm(dim=-1).unsqueeze(-2) + eps)]),
    Pitfall("clamped the squared length at eps", "you clamped x · x (the squared length) at eps, which clamps the "
            "length at √eps", "clamp the length itself, or the squared length at eps ** 2",
            [_cos(lambda x, e: x / (x * x).sum(-1, keepdim=True).clamp_min(e).sqrt(),
                  lambda x, e: x / (x * x).sum(-1, keepdim=True).clamp_min(e).sqrt())]),
    Pitfall("clamp_max instead of clamp_min", "clamp_max(eps) caps every length at eps instead of raising the "
            "short ones to eps", "use clamp_min(eps) (or clamp(min=eps))",
            [_cos(lambda x, e: x / x.norm(dim=-1, keepdim=True).clamp_max(e), lambda x, e: x / x.norm(dim=-1, keepdim=True).clamp_max(e))]),
    Pitfall("keepdim missing", "x.norm(dim=-1) drops the last axis, so dividing x by it lines the lengths up with "
            "the vectors' entries instead of the rows", "keep the axis: x.norm(dim=-1, keepdim=True)",
            [_cos(lambda x, e: x / x.norm(dim=-1).clamp_min(e), lambda x, e: x / x.norm(dim=-1).clamp_min(e))]),
    Pitfall("clamped the product of the lengths", "you divided by max(‖q‖·‖k‖, eps), the product of the two "
            "lengths clamped once; the docstring clamps each length on its own, max(‖q‖, eps)·max(‖k‖, eps), so a "
            "short vector counts as length eps even when the other one is long",
            "clamp each length: x / x.norm(dim=-1, keepdim=True).clamp_min(eps), for Q and for K",
            [lambda Q, K, eps=1e-8: (Q @ K.transpose(-2, -1))
             / (Q.norm(dim=-1, keepdim=True) * K.norm(dim=-1).unsqueeze(-2)).clamp_min(eps),
             lambda Q, K, eps=1e-8: (Q @ K.transpose(-2, -1))
             / (Q.norm(dim=-1, keepdim=True) @ K.norm(dim=-1, keepdim=True).transpose(-2, -1)).clamp_min(eps)]),
    Pitfall("norms multiplied entry by entry", "you divided by Q.norm(…) * K.norm(…) entry by entry, which pairs "
            "query i's length with key i's; each score needs ‖Q[i]‖ · ‖K[j]‖ (an outer product)",
            "divide Q and K by their own lengths first, then multiply",
            [lambda Q, K, eps=1e-8: (Q @ K.transpose(-2, -1)) / (Q.norm(dim=-1) * K.norm(dim=-1)).clamp_min(eps),
             lambda Q, K, eps=1e-8: (Q @ K.transpose(-2, -1)) / (Q.norm(dim=-1, keepdim=True) * K.norm(dim=-1, keepdim=True)).clamp_min(eps)]),
    Pitfall("paired query i with key i only", "F.cosine_similarity(Q, K, dim=-1), like an entry-by-entry product "
            "Q * K, compares row i of Q with row i of K only", "compare every pair: F.cosine_similarity(Q.unsqueeze(-2), K.unsqueeze(-3), dim=-1, eps=eps)",
            [lambda Q, K, eps=1e-8: F.cosine_similarity(Q, K, dim=-1, eps=eps),
             lambda Q, K, eps=1e-8: F.cosine_similarity(Q, K, dim=-1),
             lambda Q, K, eps=1e-8: (_clamp(Q, eps) * _clamp(K, eps)).sum(-1),
             lambda Q, K, eps=1e-8: _clamp(Q, eps) * _clamp(K, eps)]),
    Pitfall("the angle instead of its cosine", "you returned the angle θ (arccos); the exercise asks for cos θ",
            "return the cosine itself",
            [lambda Q, K, eps=1e-8: torch.arccos(cosine_reference(Q, K, eps).clamp(-1, 1)).to(Q.dtype)]),
]


@check("cosine_scores", expects="a function cosine_scores(Q, K, eps=1e-8) returning a tensor of shape (..., n_q, n_k)")
def check_cosine_scores(fn: Learner) -> str:
    expect_signature(fn, ["eps"], call="cosine_scores(Q, K, eps=0.5)", signature="cosine_scores(Q, K, eps=1e-8)")
    cases = _cosine_cases()
    run_cases(fn, name="cosine_scores", call="cosine_scores(Q, K)", cases=cases, pitfalls=COSINE_PITFALLS,
              arg_names=("Q", "K"), expected_text="F.cosine_similarity of every pair")
    return f"matches F.cosine_similarity on {len(cases)} cases (batched, zero vectors, eps = 0.5 and 0.2)"
