"""Checks for notebook 03 (softmax, stably): stable_softmax, logsumexp, log_softmax, softmax_temperature.

Oracle: PyTorch's own ``torch.softmax``, ``torch.logsumexp`` and ``torch.log_softmax``, in float64.
Each check runs the learner's function on

* ordinary scores along every kind of axis — ``dim=-1``, ``0``, a middle axis, a negative axis other
  than -1, and the default — on 1-D to 4-D, square and non-square inputs, with size-1 axes besides the
  reduced one (so an ignored, hard-coded or mis-broadcast axis fails);
* float32, float64 and float16 inputs;
* the edge cases that break careless versions: scores near ±1000 whose maximum sits at the start, the
  middle or the end of a slice (overflow and underflow of e^x), slices far apart in one tensor (a
  maximum taken over the whole tensor), ``-inf`` entries (masked scores), and a log-probability
  of −1005, whose probability e^−1005 is far below the smallest float64 (the log of a weight that
  underflowed to 0).

Functions written for tensors or for NumPy arrays are both accepted: :class:`TensorOrArray` tries
tensors first and switches to arrays when the function only handles those.

When an answer is wrong, a known mistake is named only when the answer reproduces that mistake's
output on the check's input; otherwise :func:`explain_weights` measures what is off (NaN from an
overflow, slices that sum to 1 along another axis, a temperature other than the one asked for…).

Every call hands the learner fresh copies, so an in-place edit of the input cannot show in the answers:
the learner-side probe :func:`input_unchanged` (asked for once, after the cases) says whether the
function leaves its input as it was, which the docstrings require. When the learner's code raises on
one shape, :func:`works_elsewhere` tries inputs with another number of axes and says which work.

What notebook 04's checks share with these is public here and documented: :class:`TensorOrArray`,
:func:`expect_floating`, :func:`softmax_mistakes`, :func:`explain_weights`, :func:`raised_hint`,
:func:`works_elsewhere`, :func:`same_as`, :func:`expect_input_unchanged`.
"""

from __future__ import annotations

import math
import re
import warnings
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .boundary import probe
from .compare import Failure, matching_mistakes, same
from .core import (Learner, LearnerNotAttempted, LearnerRaised, LearnerTimedOut, Mistake, as_tensor, check,
                   expect_close, expect_shape, fail, fmt, learner_error)

__all__ = [
    "check_stable_softmax",
    "check_logsumexp",
    "check_log_softmax",
    "check_softmax_temperature",
    # shared with attn_course.checks.jacobian (notebook 04)
    "TensorOrArray",
    "expect_floating",
    "softmax_mistakes",
    "explain_weights",
    "explain_nonfinite",
    "raised_hint",
    "describe_input",
    "RuledOut",
    "compare",
    "same_as",
    "works_elsewhere",
    "probe_worth",
    "input_unchanged",
    "expect_input_unchanged",
]

INF = float("inf")
_HALF = (torch.float16, torch.bfloat16)


# ============================================================================ shared with notebook 04
def _arrays(args: tuple) -> tuple:
    return tuple(a.numpy() if isinstance(a, torch.Tensor) else a for a in args)


class TensorOrArray:
    """Calls a learner's function with tensors, or with NumPy arrays when it only handles those.

    The first call goes with tensors. If it raises, the same call is made once with NumPy arrays
    (``numpy=True``): when that works, every later call uses arrays (the learner wrote a NumPy
    function); when it does not, the tensor call's error is the one reported. After a first
    success, every call keeps to the kind that worked and its errors are reported as they are.
    Both attempts are learner operations, so a replay takes the same path.
    """

    def __init__(self, fn: Learner, *, numpy: bool = True):
        self.fn, self.numpy, self.mode = fn, numpy, ""

    @property
    def kind(self) -> str:
        """``"tensors"`` or ``"NumPy arrays"``: what the learner's function was given."""
        return "NumPy arrays" if self.mode == "numpy" else "tensors"

    def __call__(self, *args: Any) -> Any:
        if self.mode == "numpy":
            return self.fn(*_arrays(args))
        try:
            with warnings.catch_warnings():  # NumPy functions handed tensors warn about __array_wrap__
                warnings.simplefilter("ignore", DeprecationWarning)
                out = self.fn(*args)
        except LearnerRaised as tensor_error:
            if self.mode or not self.numpy:
                raise
            try:
                out = self.fn(*_arrays(args))
            except LearnerRaised as array_error:
                raise _more_telling(tensor_error, array_error) from None
            except (LearnerTimedOut, LearnerNotAttempted):
                raise tensor_error from None
            self.mode = "numpy"
            return out
        self.mode = "torch"
        return out


def _more_telling(tensor_error: LearnerRaised, array_error: LearnerRaised) -> LearnerRaised:
    """Of the errors a function raised on tensors and on arrays, the one that says more about its bug:
    the one that got further into the learner's code, else the one that is not an API mismatch (a
    TypeError or AttributeError from handing a NumPy function a tensor), else the tensor one."""
    if tensor_error.line is not None and array_error.line is not None and array_error.line > tensor_error.line:
        return array_error
    mismatch = ("TypeError", "AttributeError")
    if tensor_error.type_name in mismatch and array_error.type_name not in mismatch and \
            array_error.line == tensor_error.line:
        return array_error
    return tensor_error


def _literal(x: torch.Tensor) -> str:
    if x.ndim == 0:
        v = float(x)
        return "-inf" if v == -INF else ("inf" if v == INF else f"{v:g}")
    return "[" + ", ".join(_literal(row) for row in x) + "]"


def describe_input(x: torch.Tensor, name: str = "x") -> str:
    """``x of shape (4, 3), float32`` — or the values themselves, ``x = [[1000, 1001], [2, 1]] (float32)``,
    for a small input of whole numbers (the hand-made edge cases)."""
    dtype = str(x.dtype).replace("torch.", "")
    values = x.detach().double()
    finite = values[torch.isfinite(values)]
    if x.numel() <= 12 and x.ndim <= 3 and bool((finite == finite.round()).all()):
        return f"{name} = {_literal(values)} ({dtype})"
    return f"{name} of shape {tuple(x.shape)}, {dtype}"


class RuledOut:
    """The known mistakes an answer has already been seen *not* to make.

    :meth:`passed` records each case the answer passed (its expected value and the mistakes listed
    for it). When a later case fails, :meth:`keep` drops from the candidates every mistake whose output
    on one of those earlier cases differs from the right one: had the answer made that mistake, it
    would have failed there. So two mistakes that coincide on the failing case are told apart by the
    cases before it. A mistake is known by its summary and cause (the same words on every case name
    the same mistake) and, when several ways of making it are listed, by its place among them: one
    way being ruled out leaves the others. Nothing is computed until a case fails."""

    def __init__(self) -> None:
        self._passed: list[tuple[torch.Tensor, Sequence[Mistake], float, float]] = []
        self._seen: set[tuple[str, str, int]] | None = None

    @staticmethod
    def _keys(mistakes: Sequence[Mistake]) -> list[tuple[str, str, int]]:
        count: dict[tuple[str, str], int] = {}
        keys = []
        for m in mistakes:
            k = (m.summary, m.cause)
            count[k] = count.get(k, -1) + 1
            keys.append((*k, count[k]))
        return keys

    def passed(self, expected: torch.Tensor, mistakes: Sequence[Mistake], *, atol: float, rtol: float) -> None:
        self._passed.append((expected, mistakes, atol, rtol))
        self._seen = None

    def _ruled_out(self) -> set[tuple[str, str, int]]:
        if self._seen is None:
            self._seen = set()
            for expected, mistakes, atol, rtol in self._passed:
                for key, m in zip(self._keys(mistakes), mistakes):
                    if key not in self._seen:
                        wrong = m.value()
                        if wrong is not None and not same(wrong, expected, atol=atol, rtol=rtol):
                            self._seen.add(key)
        return self._seen

    def keep(self, mistakes: Sequence[Mistake]) -> list[Mistake]:
        seen = self._ruled_out() if self._passed else set()
        return [m for key, m in zip(self._keys(mistakes), mistakes) if key not in seen]


def _shape_text(shape: tuple[int, ...]) -> str:
    return f"({shape[0]},)" if len(shape) == 1 else str(tuple(shape))


def same_as(out: Any, expected: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> bool:
    """Whether a learner's answer is a tensor (or array) of ``expected``'s shape and values."""
    try:
        t = as_tensor(out, tried="")
    except Failure:
        return False
    return tuple(t.shape) == tuple(expected.shape) and same(t, expected, atol=atol, rtol=rtol)


def probe_worth(hint: dict[str, str]) -> bool:
    """Whether trying other shapes can say more than ``hint`` (from :func:`raised_hint`): yes when the error
    message pointed at nothing, or only at an axis that does not exist."""
    return not hint or hint.get("cause", "").startswith("your code uses an axis number")


def works_elsewhere(failed: tuple[int, ...], others: Sequence[tuple[tuple[int, ...], Callable[[], bool]]], *,
                    fix: str) -> dict[str, str]:
    """After the learner's code raised on an input of shape ``failed``: try it on inputs with another number of
    axes (``others``: a shape and a call saying whether the answer there is right) and, when one works, return
    a ``cause``/``fix`` saying so (else ``{}``). Stops at the first that works; each attempt is a learner
    operation, so a replay asks for the same ones."""
    for shape, attempt in others:
        if len(shape) == len(failed):
            continue
        try:
            ok = attempt()
        except (LearnerRaised, LearnerTimedOut, Failure):
            ok = False
        if ok:
            return dict(cause=f"your code works on input of shape {_shape_text(shape)} but raises on "
                              f"{_shape_text(failed)}: it handles one number of axes only (torch.bmm, torch.dot, "
                              "torch.diag, torch.outer, math functions or a loop over the first axis fix that "
                              "number), and the docstring allows any number of axes", fix=fix)
    return {}


@probe("softmax_input_unchanged")
def input_unchanged(fn: Callable, x: torch.Tensor, *rest: Any, numpy: bool = False, apply: bool = False) -> bool:
    """Learner side: whether ``fn(x, *rest)`` (``fn.apply(x)`` for an autograd Function) leaves x as it was.
    ``numpy``: call with arrays. Only this yes or no crosses back."""
    arg = x.numpy().copy() if numpy else x.clone()
    before = arg.copy() if numpy else arg.clone()
    rest = tuple(r.numpy() if numpy and isinstance(r, torch.Tensor) else r for r in rest)
    (fn.apply if apply else fn)(arg, *rest)
    if numpy:
        return bool(np.array_equal(arg, before, equal_nan=True))
    return bool(torch.equal(arg, before))


def expect_input_unchanged(fn: Learner, x: torch.Tensor, *rest: Any, call: str, numpy: bool = False,
                           apply: bool = False, name: str = "x") -> None:
    """Fail when the learner's code changes its input ``x`` in place (measured by :func:`input_unchanged`
    in the learner's process; the cases themselves cannot see it, since every call gets fresh copies)."""
    try:
        unchanged = fn.observe("softmax_input_unchanged", x, *rest, numpy=numpy, apply=apply)
    except (LearnerRaised, LearnerTimedOut):
        return  # the cases already ran this code without trouble: nothing to say about its input
    if unchanged is False:
        fail(f"{name} changed in place", tried=f"{call} on {describe_input(x, name)}, comparing {name} with a copy "
             "taken before the call", got=f"after the call, {name} no longer holds the values it was given",
             expected=f"{name} left as it was: the function only reads it",
             cause="an in-place operation on the input (x -= …, x /= …, x.sub_(…), x.exp_(), or out=x) overwrites "
                   "the caller's tensor",
             fix="compute new tensors (x - m, torch.exp(…)), or start from a copy: x = x.clone()")


def expect_floating(out: torch.Tensor, input_dtype: torch.dtype, *, tried: str, what: str = "your result") -> None:
    """Fail, naming the dtype, when ``out`` holds integers, booleans or complex numbers, or is in
    float16/bfloat16 while the input was not (values then agree to about 3 digits only)."""
    dtype = str(out.dtype).replace("torch.", "")
    wanted = str(input_dtype).replace("torch.", "")
    if out.dtype == torch.bool or not (out.is_floating_point() or out.is_complex()):
        fail(f"integer result ({dtype})", tried=tried,
             got=f"{what}: dtype {dtype}, which holds whole numbers only",
             expected=f"floating-point values ({wanted}, like the input)",
             fix="keep every step in floating point: no .long()/.int()/.bool(), no // division, and take "
                 "values (x.amax(…) or .values), not indices (argmax, .indices)")
    if out.is_complex():
        fail(f"complex result ({dtype})", tried=tried, got=f"{what}: the complex dtype {dtype}",
             expected=f"real values ({wanted})", fix="drop the step that makes the numbers complex")
    if out.dtype in _HALF and input_dtype not in _HALF:
        fail(f"result in {dtype}", tried=tried,
             got=f"{what}: dtype {dtype}, which keeps only about 3 significant digits",
             expected=f"{wanted}, the input's dtype", cause=f"your computation converted to {dtype}",
             fix=f"leave out the conversion (.half(), .to({dtype}), dtype={dtype}): compute in the input's dtype")


def raised_hint(exc: LearnerRaised, *, signature: str, batched: bool = False, reductions: bool = True,
                new_size: str = "") -> dict[str, str]:
    """``cause``/``fix`` for an exception the learner's code raised, when its message points at one
    (a wrong signature, a reduction that lost its axis, an axis that does not exist, code for one
    vector only); ``batched``: the same function already worked on inputs with fewer axes;
    ``reductions``: the exercise reduces along an axis (so a failed broadcast means a lost axis);
    ``new_size``: the input has a size no earlier case had (``"n = 5, though it worked for n = 3"``)."""
    msg = exc.message
    binding = re.match(r"\S+\(\) (takes|got an unexpected keyword|missing \d+ required)", msg)
    if exc.type_name == "TypeError" and binding and exc.line is None:  # raised before the body ran
        return dict(cause="your function does not take the arguments the docstring lists",
                    fix=f"keep the signature {signature}")
    if "torch.return_types" in msg:
        return dict(cause="x.max(dim) returns a pair (values, indices), not a tensor",
                    fix="use x.amax(dim, keepdim=True), or x.max(dim, keepdim=True).values")
    if batched and (not reductions or re.search(r"\b(outer|diag)\b", msg + " " + exc.code)):
        return dict(cause="your function worked on inputs with fewer axes and fails once there are batch axes "
                          "in front",
                    fix="write every step for any number of leading axes: torch.diag_embed rather than torch.diag, "
                        "s.unsqueeze(-1) * s.unsqueeze(-2) rather than torch.outer or np.outer")
    if reductions and ("must match the size" in msg or "could not be broadcast" in msg):
        return dict(cause="a maximum or sum reduced without keepdim=True lost the reduced axis, so it no longer "
                          "lines up with the input's axes",
                    fix="keep the reduced axis: .amax(dim, keepdim=True) and .sum(dim, keepdim=True) "
                        "(NumPy: keepdims=True)")
    if new_size and ("must match the size" in msg or "could not be broadcast" in msg or "shape" in msg):
        return dict(cause=f"a size written into your code: your function fails for {new_size}",
                    fix="take every size from the input (s.shape[-1]), never write a number for it")
    if ("out of range" in msg and "imension" in msg) or "out of bounds for array" in msg:
        return dict(cause="your code uses an axis number that this input does not have",
                    fix="use the `dim` argument (or -1 for the last axis) rather than a fixed axis number"
                    if re.search(r"\bdim\b", signature) else
                    "count axes from the end (-1 for the last) rather than with a fixed axis number, and keep every "
                    "axis the input has (no .squeeze() without an axis)")
    if batched:
        return dict(cause="your function worked on inputs with fewer axes and fails once there are batch axes "
                          "in front",
                    fix="write every step for any number of leading axes: index and reduce along negative axes "
                        "(-1), never loop over or index a fixed axis")
    return {}


def _others(ndim: int, d: int) -> list[int]:
    return [o for o in range(ndim) if o != d]


def softmax_mistakes(x: torch.Tensor, dim: int) -> list[Mistake]:
    """Known wrong versions of a softmax of ``x`` along ``dim``, each computed in ``x``'s dtype, as a
    learner who made that mistake would get it (NaN included)."""
    d = dim % x.ndim
    shift_fix = "subtract the maximum of each slice along `dim` before exp: x - x.amax(dim, keepdim=True)"
    axis_fix = "use `dim` in both the maximum and the sum: x.amax(dim, keepdim=True), e.sum(dim, keepdim=True)"

    def normalise(e, axis=d):
        return e / e.sum(axis, keepdim=True)

    def eps(e):  # a denominator kept away from 0 (an epsilon or a clamp): underflowed slices come out as 0
        return e / e.sum(d, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)

    naive = ("maximum not subtracted", "you exponentiated the scores as they are: e^x overflows to inf for scores "
             "near 1000 (and underflows to 0 near -1000), and inf/inf or 0/0 is NaN", shift_fix)
    whole = ("maximum taken over the whole tensor", "you subtracted the maximum of the whole tensor, not of each "
             "slice: a slice whose scores lie far below that maximum underflows to 0 (0/0 = NaN, or zeros "
             "behind an epsilon)", shift_fix)
    minimum = ("minimum subtracted instead of the maximum", "you subtracted each slice's minimum: the largest "
               "score minus the smallest can exceed what e^x can hold, so e^x overflows", shift_fix)
    out = [
        Mistake(*naive, lambda: normalise(torch.exp(x))),
        Mistake(*naive, lambda: eps(torch.exp(x))),
        Mistake(*whole, lambda: normalise(torch.exp(x - x.max()))),
        Mistake(*whole, lambda: eps(torch.exp(x - x.max()))),
        Mistake(*minimum, lambda: normalise(torch.exp(x - x.amin(d, keepdim=True)))),
        Mistake("maximum added instead of subtracted", "you exponentiated x + max where the shift is x − max: the "
                "largest score doubles, so e^(x + max) overflows as soon as 2·max passes e^x's range", shift_fix,
                lambda: normalise(torch.exp(x + x.amax(d, keepdim=True)))),
        Mistake("mean subtracted instead of the maximum", "you subtracted each slice's mean: a score far above the "
                "mean still overflows e^x (only the maximum guarantees every exponent ≤ 0)", shift_fix,
                lambda: normalise(torch.exp(x - x.mean(d, keepdim=True)))),
        Mistake("divided by the sum of the whole tensor", "you divided by the sum of e^(x − max) over every entry "
                "of the tensor, not over each slice along dim", "divide by the sum along dim: e / e.sum(dim, "
                "keepdim=True)", lambda: torch.exp(x - x.amax(d, keepdim=True)) /
                torch.exp(x - x.amax(d, keepdim=True)).sum()),
    ]
    for o in _others(x.ndim, d):
        out += [
            Mistake(f"softmax along axis {o}, not dim={dim}", f"you normalised along axis {o}, so the slices "
                    f"along axis {o} sum to 1, not those along dim={dim}", axis_fix, lambda o=o: torch.softmax(x, o)),
            Mistake("maximum taken along the wrong axis", f"you took the maximum along axis {o}, not along "
                    f"dim={dim}: that shift changes from entry to entry of a slice, so it does not cancel",
                    axis_fix, lambda o=o: normalise(torch.exp(x - x.amax(o, keepdim=True)))),
            Mistake("sum taken along the wrong axis", f"you divided by the sum along axis {o}, not along dim={dim}",
                    axis_fix, lambda o=o: torch.exp(x - x.amax(d, keepdim=True)) /
                    torch.exp(x - x.amax(d, keepdim=True)).sum(o, keepdim=True)),
        ]
    keepdim = ("keepdim missing", "you reduced without keepdim=True, so the result broadcast against the wrong "
               "axis of x (each slice got another slice's value)",
               "keep the reduced axis: x.amax(dim, keepdim=True) and e.sum(dim, keepdim=True)")
    e_right = lambda: torch.exp(x - x.amax(d, keepdim=True))  # noqa: E731
    out += [
        Mistake(*keepdim, lambda: normalise(torch.exp(x - x.amax(d)))),
        Mistake(*keepdim, lambda: e_right() / e_right().sum(d)),
        Mistake(*keepdim, lambda: torch.exp(x - x.amax(d)) / torch.exp(x - x.amax(d)).sum(d)),
        Mistake("softmax over the whole tensor", "you took one softmax over every entry of the tensor",
                axis_fix, lambda: torch.softmax(x.flatten(), 0).reshape(x.shape)),
        Mistake("no exponential", "you divided the scores by their sum without exponentiating: weights can be "
                "negative or explode", "exponentiate first: e^(x - max) / Σ e^(x - max)",
                lambda: x / x.sum(d, keepdim=True)),
        Mistake("not normalised", "you returned e^(x - max) without dividing by the sum", "divide by the sum "
                "along dim: e / e.sum(dim, keepdim=True)", e_right),
        Mistake("log-softmax returned", "you returned x - logsumexp(x), the log of the weights",
                "return the weights themselves: exp of that, or e / e.sum(dim, keepdim=True)",
                lambda: torch.log_softmax(x, d)),
        Mistake("sign flipped", "you exponentiated -x, so the smallest score gets the largest weight",
                "exponentiate x - max, not max - x", lambda: torch.softmax(-x, d)),
        Mistake("multiplied by the sum", "you multiplied e^(x − max) by its sum where softmax divides by it",
                "divide: e / e.sum(dim, keepdim=True)",
                lambda: e_right() * e_right().sum(d, keepdim=True)),
        Mistake("exponential missing", "you normalised x − max without exponentiating it",
                "exponentiate before normalising: e = exp(x - max)", lambda: normalise(x - x.amax(d, keepdim=True))),
        Mistake("log instead of exp", "you took the log of x − max where softmax exponentiates it",
                "e = torch.exp(x - max), then e / e.sum(dim, keepdim=True)",
                lambda: normalise(torch.log(x - x.amax(d, keepdim=True)))),
        Mistake("arg-max instead of softmax", "you put all the weight on the largest score (a one-hot of the "
                "arg-max): that is softmax's limit as the temperature goes to 0, not softmax",
                "weights = e / e.sum(dim, keepdim=True) with e = exp(x - max)",
                lambda: (x == x.amax(d, keepdim=True)).to(x.dtype)),
    ]
    return out


def _overflow_limit(dtype: torch.dtype) -> float:
    return math.log(torch.finfo(dtype).max)


def _underflow_limit(dtype: torch.dtype) -> float:
    """Below this, e^z rounds to 0 (half the smallest subnormal)."""
    exponent = {torch.float16: -24, torch.bfloat16: -133, torch.float32: -149, torch.float64: -1074}.get(dtype, -149)
    return (exponent - 1) * math.log(2.0)  # log of half the smallest subnormal, 2^exponent


def _effective_temperature(w: torch.Tensor, x: torch.Tensor, d: int) -> float | None:
    """If every slice of ``w`` is softmax(x / T') for one T' (fitted from log w against x), that T'."""
    w, x = w.double(), x.double()
    ok = (w > 1e-200) & torch.isfinite(x)
    if not ok.all() or x.shape[d] < 2:
        return None
    lw = torch.log(w)
    lw, xc = lw - lw.mean(d, keepdim=True), x - x.mean(d, keepdim=True)
    denom = (xc * xc).sum()
    if denom < 1e-12:
        return None
    slope = float((lw * xc).sum() / denom)
    if abs(slope) < 1e-9 or not torch.allclose(lw, slope * xc, atol=1e-4, rtol=1e-4):
        return None
    return 1.0 / slope


def _tied_but_different(o: torch.Tensor, expected: torch.Tensor, d: int) -> str:
    """Where two entries of one slice are equal in ``o`` but clearly different in ``expected``: a description."""
    a, e = o.movedim(d, -1).reshape(-1, o.shape[d]), expected.movedim(d, -1).reshape(-1, o.shape[d])
    for row in range(a.shape[0]):
        same_o = (a[row, :, None] - a[row, None, :]).abs() <= 1e-12 * a[row].abs().max().clamp(min=1e-300)
        diff_e = (e[row, :, None] - e[row, None, :]).abs() > 1e-3 * e[row].abs().max()
        hit = (same_o & diff_e).nonzero()
        if hit.numel():
            i, j = (int(v) for v in hit[0])
            return f"entries {i} and {j} of a slice both get {fmt(float(a[row, i]))}"
    return ""


def explain_nonfinite(slices: torch.Tensor, xs: torch.Tensor, dtype: torch.dtype, *, tried: str, got: str,
                      kinds: str, expected: str, scaled: str = "x") -> None:
    """Fail saying where NaN or inf in an answer come from. ``slices`` marks (shaped like the scores
    ``xs``, float64) the slices whose answer is not finite; ``dtype`` is the dtype the learner computed in.
    Scores beyond e^z's range in ``dtype``, or spread wider than that range, mean the slice's own maximum
    was not what was subtracted; -inf scores mean an operation on -inf."""
    finite = slices & torch.isfinite(xs)
    scores = xs[finite]
    hi, lo = _overflow_limit(dtype), _underflow_limit(dtype)
    name = str(dtype).replace("torch.", "")
    fix = "subtract the maximum of each slice along `dim` before exp: x - x.amax(dim, keepdim=True)"
    if scores.numel():
        top, bottom = float(scores.max()), float(scores.min())
        if top > hi:
            fail(f"{kinds} from an overflow", tried=tried, got=got, expected=expected,
                 cause=f"in those slices {scaled} reaches {fmt(top)}, and in {name} e^z is inf for z > {hi:.2f}: you "
                       "exponentiated without subtracting the slice's own maximum", fix=fix)
        if top < lo:
            fail(f"{kinds} from an underflow", tried=tried, got=got, expected=expected,
                 cause=f"in those slices every score is below {lo:.1f}, where e^z rounds to 0 in {name}, so the sum "
                       "is 0 (0/0 is NaN, log 0 is -inf): you exponentiated without subtracting the slice's own maximum",
                 fix=fix)
        if top - bottom > hi:
            fail(f"{kinds} in slices of widely spread scores", tried=tried, got=got, expected=expected,
                 cause=f"in those slices {scaled} spans {fmt(top - bottom)} (from {fmt(bottom)} to {fmt(top)}). In "
                       f"{name}, e^(x − c) neither overflows nor underflows to all zeros only for a shift c between "
                       f"max − {hi:.2f} and max + {-lo:.1f}, and yours was outside (the mean, the minimum or the first "
                       "entry of such a slice lies far from its maximum)", fix=fix)
    if torch.isneginf(xs)[slices].any():
        fail(f"{kinds} where scores are -inf", tried=tried, got=got + " (in slices holding -inf scores)",
             expected=expected + " (a -inf score contributes e^-inf = 0)",
             cause="an operation on -inf gave NaN: -inf - (-inf), -inf · 0, or inf / inf",
             fix="let exp turn -inf into 0: subtract the slice maximum (finite here), then exponentiate")
    fail(f"{kinds} in the result", tried=tried, got=got, expected=expected,
         fix="look for a division by zero or a log of 0 in your steps")


def _epsilon_denominator(o: torch.Tensor, xs: torch.Tensor, d: int, *, tried: str, what: str) -> None:
    """Fail when every slice of ``o`` is the softmax scaled by S / (S + ε) for one small ε > 0, where S is the
    slice's sum of e^(x − max) (or of e^x): an epsilon added to the denominator."""
    expected = torch.softmax(xs, d)
    if not (torch.isfinite(o).all() and torch.isfinite(xs).all()) or bool((expected <= 0).any()):
        return
    ratio = o / expected
    c = ratio.mean(d, keepdim=True)  # one factor per slice
    if not torch.allclose(ratio, c.expand_as(ratio), rtol=1e-6, atol=0) or not bool((c < 1 - 1e-7).all()):
        return
    for shifted in (True, False):
        z = xs - xs.amax(d, keepdim=True) if shifted else xs
        total = torch.exp(z).sum(d, keepdim=True)
        eps = total * (1 / c - 1)  # S / (S + ε) = c  ⇒  ε = S (1/c − 1)
        if bool(torch.isfinite(eps).all()) and float(eps.max() - eps.min()) <= 1e-2 * float(eps.max()):
            e = float(eps.mean())
            fail("epsilon in the denominator", tried=tried,
                 got=f"{what}: every slice is the softmax times S / (S + {e:.2g}), S being the slice's sum of "
                     f"{'e^(x − max)' if shifted else 'e^x'}",
                 expected="e / S exactly", cause=f"you divided by the sum plus {e:.2g}" + (
                     ": with the maximum subtracted the sum is at least 1, so no epsilon is needed" if shifted else ""),
                 fix="divide by the sum itself: e / e.sum(dim, keepdim=True)")


def explain_weights(out: torch.Tensor, x: torch.Tensor, dim: int, *, tried: str, what: str = "your weights",
                    temperature: float = 1.0, known: dict[str, float] | None = None, normalise_fix: str = "") -> None:
    """Fail with what is measurably wrong with softmax-like weights ``out`` of scores ``x`` along ``dim``
    (at ``temperature``): NaN or inf and where they come from, weight on -inf scores, equal weights
    for different scores, slices that sum to 0 or that sum to 1 along another axis, negative weights,
    or weights of another temperature (``known``, when given, names the temperatures that the mistakes
    still possible would give, in place of the usual 1/T, 1, T², √T, -T). ``normalise_fix`` replaces the
    advice for slices that do not sum to 1 (log-softmax normalises by subtracting, not dividing).
    Returns when it finds nothing it can name (the caller then reports the plain mismatch)."""
    d = dim % x.ndim
    o, xs = out.detach().double(), x.detach().double() / temperature
    dtype = x.dtype
    shift_fix = "subtract the maximum of each slice along `dim` before exp: x - x.amax(dim, keepdim=True)"
    bad = ~torch.isfinite(o)
    if bad.any():
        kinds = " and ".join(k for k, hit in (("NaN", torch.isnan(o).any()), ("inf", torch.isinf(o).any())) if hit)
        explain_nonfinite(bad.any(d, keepdim=True).expand_as(xs), xs, dtype, tried=tried,
                          got=f"{what} hold {kinds} in {int(bad.sum())} of {o.numel()} entries", kinds=kinds,
                          expected="finite weights", scaled="x / T" if temperature != 1.0 else "x")
    masked = torch.isneginf(xs) & (o.abs() > 1e-12)
    if masked.any():
        fail("weight on -inf scores", tried=tried,
             got=f"{int(masked.sum())} entries whose score is -inf get weight (up to {fmt(float(o[masked].abs().max()))})",
             expected="weight 0 wherever the score is -inf (e^-inf = 0)",
             cause="your code changes -inf scores into finite numbers before the exponential",
             fix="leave -inf scores as they are: exp(-inf - max) is 0, which is the weight they need")
    _epsilon_denominator(o, xs, d, tried=tried, what=what)
    sums = o.sum(d)
    zero = sums.abs() < 1e-12
    if zero.any():
        # What made a slice all 0 shows in its scores: beyond e^z's range (an overflow whose NaN was turned into
        # 0), or far below the tensor's largest score (shifted by that, every e^z is tiny or 0).
        top = xs.masked_fill(torch.isnan(xs), -math.inf)
        slice_top = top.amax(d)[zero]
        gap = float((top.amax() - slice_top).min())
        cause = ""
        if bool((slice_top > _overflow_limit(dtype)).all()):
            cause = (f"those slices hold scores above {_overflow_limit(dtype):.2f}, where e^z overflows to inf in "
                     f"{str(dtype).replace('torch.', '')}: inf/inf is NaN, and something (nan_to_num, a where) turned "
                     "it into 0; you exponentiated without subtracting the slice's own maximum")
        elif gap > 20:
            cause = (f"those slices' scores lie {fmt(gap)} or more below the tensor's largest score: with the maximum "
                     "taken over the whole tensor, not per slice, their e^z are tiny or underflow to 0, and an epsilon "
                     "or a clamp in the denominator hid the 0/0")
        fail("slices of zeros", tried=tried, got=f"{int(zero.sum())} slice(s) along dim={dim} are all 0",
             expected="every slice along dim summing to 1", cause=cause,
             fix=shift_fix if cause else "weights = e / e.sum(dim, keepdim=True) with e = exp(x - max)")
    expected = torch.softmax(xs, d)
    ties = _tied_but_different(o, expected, d)
    if ties:
        fail("different scores, equal weights", tried=tried,
             got=f"{what} give equal weights to scores that differ ({ties})",
             expected="a larger weight for every larger score",
             cause="your code maps different scores to the same value before the exponential (a clamp, for example)",
             fix="exponentiate x - max exactly: no clamp is needed once the maximum is subtracted")
    if (o < -1e-12).any():
        fail("negative weights", tried=tried, got=f"{int((o < -1e-12).sum())} negative entries, down to {fmt(float(o.min()))}",
             expected="weights ≥ 0 (e^z / Σ e^z is never negative)",
             cause="a step that does not exponentiate, or subtracts after exponentiating",
             fix="weights = e / e.sum(dim, keepdim=True) with e = exp(x - max)")
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-3):
        for other in _others(x.ndim, d):
            s_other = o.sum(other)
            if torch.allclose(s_other, torch.ones_like(s_other), atol=1e-4):
                fail(f"normalised along axis {other}, not dim={dim}", tried=tried,
                     got=f"slices along axis {other} sum to 1; along dim={dim} they sum to "
                         f"{fmt(float(sums.min()))} … {fmt(float(sums.max()))}",
                     expected=f"every slice along dim={dim} summing to 1",
                     cause=f"you divided by a sum along axis {other}",
                     fix="use `dim` in both the maximum and the sum")
        fail("slices do not sum to 1", tried=tried,
             got=f"{what}: slices along dim={dim} sum to {fmt(float(sums.min()))} … {fmt(float(sums.max()))}",
             expected=f"every slice along dim={dim} summing to 1",
             fix=normalise_fix or "divide e = exp(x - max) by its sum along dim: e / e.sum(dim, keepdim=True)")
    t_eff = _effective_temperature(o, x.detach().double(), d)
    if t_eff is not None and abs(t_eff - temperature) > 1e-3 * max(1.0, temperature):
        names = {"1/T (you multiplied by T)": 1 / temperature, "1 (the temperature is not used)": 1.0,
                 "T² (you divided by T twice)": temperature ** 2, "√T": math.sqrt(temperature),
                 "-T (a sign slip)": -temperature} if temperature != 1.0 else {"-1 (a sign slip)": -1.0}
        if known is not None:  # names that earlier cases leave possible (the temperature check knows them)
            names = dict(known)
        named = next((n for n, v in names.items() if abs(t_eff - v) <= 1e-3 * max(1.0, abs(v))), "")
        fail(f"weights of temperature {fmt(t_eff)}, not {fmt(temperature)}", tried=tried,
             got=f"{what} equal softmax(x / {fmt(t_eff)})", expected=f"softmax(x / {fmt(temperature)})",
             cause=f"your weights are those of temperature {named}" if named else
             f"your scores end up divided by {fmt(t_eff)} before the softmax",
             fix="divide the scores by the temperature exactly once, then take the stable softmax"
             if temperature != 1.0 else "exponentiate x - max, unscaled")


# ============================================================================ the cases
def _cases(seed: int, *, extremes: bool = True, half: bool = True) -> list[tuple[torch.Tensor, int]]:
    """(scores, dim) pairs: ordinary ones first (structure mistakes show on clean data), then the edges."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, dtype=torch.float32, scale=2.0):
        return scale * torch.randn(*shape, generator=g, dtype=dtype)

    f64 = torch.float64
    cases = [
        (rand(3, 5), -1),
        (rand(4, 3), 0),
        (rand(2, 3, 4, dtype=f64), 1),
        (rand(4, 4, dtype=f64), -1),  # square: a keepdim slip broadcasts instead of failing
        (rand(6), 0),
        (rand(2, 1, 5, dtype=f64), -1),  # a size-1 axis besides the reduced one
        (rand(2, 3, 1, 4), -3),  # 4-D, a negative axis other than -1
        (rand(4, 1, dtype=f64), -1),  # one key per row
        (rand(3, 7, dtype=f64, scale=3.0), -1),
    ]
    if extremes:
        cases += [
            # scores of a few tens: e^x is still finite in float32, but e^(x + max) is not (a shift the wrong way)
            (torch.tensor([[50.0, 48.0, 49.0], [-3.0, 0.0, 1.0]]), -1),
            # maxima at the end and at the start: overflow of e^x, and a whole-tensor maximum
            (torch.tensor([[1000.0, 1001.0, 1002.0], [2.0, 1.0, 0.0]]), -1),
            (torch.tensor([[-1000.0, -999.0, -998.0], [0.0, 1.0, 2.0]], dtype=f64), -1),
            # along dim=0, maxima in the middle and at the end, far apart
            (torch.tensor([[1000.0, -1001.0], [1002.0, -1000.0], [1001.0, -999.0]], dtype=f64), 0),
            # a wide spread within one slice: a shift by the minimum (or the mean) overflows
            (torch.tensor([[0.0, -1000.0, 5.0], [3.0, 2.0, -200.0]]), -1),
            # the maximum in the middle, far above the first entry: any shift but the maximum overflows
            (torch.tensor([[-300.0, 0.0, 2.0], [1.0, 200.0, 3.0]]), -1),
            # masked scores; the last row keeps one key
            (torch.tensor([[0.0, -INF, 1.0], [2.0, 2.0, -INF], [-INF, -INF, 5.0]]), -1),
            # masked scores next to very negative ones: a -inf turned into a finite fill (-1e4) outweighs them
            (torch.tensor([[-INF, -20000.0, -19999.0], [-INF, 3.0, -INF]], dtype=f64), -1),
            # a batch whose elements sit at different heights: a maximum per batch element is not per slice
            (torch.tensor([[[1000.0, 1001.0, 1002.0], [0.0, 1.0, 2.0]],
                           [[-1000.0, -998.0, -999.0], [5.0, 4.0, 3.0]]]), -1),
        ]
    if half:
        cases.append((torch.tensor([[10.0, 11.0, 12.0], [30.0, 28.0, 20.0]], dtype=torch.float16), -1))
    return cases


def _tolerance(x: torch.Tensor) -> tuple[float, float]:
    return (2e-3, 1e-2) if x.dtype in _HALF else (1e-5, 1e-4)


_ANY_SHAPE_FIX = "write every step for any shape: reduce along `dim` with keepdim=True, no loops over entries"


def _call(run: TensorOrArray, args: tuple, *, tried: str, expected: str, signature: str, batched: bool = False,
          others: Callable[[], list] | None = None):
    """Call the learner's function; when it raises, say why as well as the message allows, and (``others``:
    a list of other inputs to try, built only then) whether it works on inputs with another number of axes."""
    try:
        return run(*args)
    except LearnerRaised as exc:
        hint = raised_hint(exc, signature=signature, batched=batched)
        if others is not None and probe_worth(hint):
            hint = works_elsewhere(tuple(args[0].shape), others(), fix=_ANY_SHAPE_FIX) or hint
        raise Failure(learner_error(exc, tried=tried, expected=expected, **hint)) from None


def _elsewhere(run: TensorOrArray, cases: Sequence[tuple], passed: set[int], oracle: Callable[..., torch.Tensor],
               atol: float = 1e-4) -> Callable[[], list]:
    """The ``others`` of :func:`_call`: the cases (argument tuples) whose number of axes no passed case had."""
    def build() -> list:
        return [(tuple(c[0].shape), lambda c=c: same_as(run(*c), oracle(*c), atol=atol, rtol=1e-3))
                for c in cases if c[0].ndim not in passed and c[0].dtype not in _HALF]
    return build


def compare(out: torch.Tensor, expected: torch.Tensor, *, tried: str, what: str, mistakes: Sequence[Mistake],
            atol: float, rtol: float, ruled_out: RuledOut | None = None,
            explain: Callable[[torch.Tensor], None] | None = None, shape_fix: str = "",
            reduced: int | None = None, factors: dict[str, float] | None = None) -> None:
    """Compare an answer with the oracle: shape, then values, blaming a known mistake only when the
    answer reproduces it (and ``ruled_out`` has not seen the answer avoid it on an earlier case).
    When no mistake matches and the plain comparison names no cause, the precision, ``explain`` (what is
    off, measured) and the batch entries are looked at, in that order; a passed case is noted in
    ``ruled_out``. ``reduced``: the axis a shape-preserving answer must not collapse to size 1;
    ``factors``: named constants a result off by a constant factor is compared with (``{"n": 5.0}``)."""
    if tuple(out.shape) == tuple(expected.shape) and same(out, expected, atol=atol, rtol=rtol):
        if ruled_out is not None:
            ruled_out.passed(expected, mistakes, atol=atol, rtol=rtol)
        return
    candidates = ruled_out.keep(mistakes) if ruled_out is not None else list(mistakes)
    if reduced is not None and tuple(out.shape) != tuple(expected.shape) and \
            not matching_mistakes(out, candidates, atol=1e-5, rtol=1e-4):
        collapsed = list(expected.shape)
        collapsed[reduced] = 1
        if tuple(out.shape) == tuple(collapsed) and expected.shape[reduced] > 1:
            fail("one value per slice", tried=tried,
                 got=f"{what} of shape {tuple(out.shape)}: one number for each slice along dim", expected=f"shape "
                 f"{tuple(expected.shape)}, one value for each entry of x",
                 cause="you returned a reduction along dim (the maximum, or the sum) instead of the entry-wise result",
                 fix=shape_fix or "return the entry-wise result, shaped like x")
    _squeezed(out, expected, tried=tried, what=what, mistakes=candidates, atol=atol, rtol=rtol)
    expect_shape(out, expected.shape, tried=tried, what=what, mistakes=candidates, fix=shape_fix)
    if matching_mistakes(out, candidates, atol=atol, rtol=rtol):
        expect_close(out, expected, tried=tried, what=what, atol=atol, rtol=rtol, mistakes=candidates)
    a, e = out.detach().double(), expected.detach().double()
    if explain is not None and bool((~torch.isfinite(a) & torch.isfinite(e)).any()):
        explain(out)  # NaN or inf: where they come from says more than the plain comparison
    try:
        expect_close(out, expected, tried=tried, what=what, atol=atol, rtol=rtol, factors=factors)
    except Failure as failure:
        if failure.diagnosis.cause or failure.diagnosis.summary.startswith(("off by a factor", "shifted by")):
            raise
        _precision(out, expected, tried=tried, what=what, half_only=True)
        if explain is not None:
            explain(out)
        _batch_entries(out, expected, tried=tried, what=what, atol=atol, rtol=rtol)
        _precision(out, expected, tried=tried, what=what)
        raise


def _squeezed(out: torch.Tensor, expected: torch.Tensor, *, tried: str, what: str, mistakes: Sequence[Mistake],
              atol: float, rtol: float) -> None:
    """Fail when ``out`` holds the right values with every size-1 axis of the expected shape removed (and no
    known mistake explains it): a ``.squeeze()`` without an axis."""
    kept = tuple(s for s in expected.shape if s != 1)
    if tuple(out.shape) == tuple(expected.shape) or tuple(out.shape) != kept or len(kept) == expected.ndim:
        return
    if matching_mistakes(out, mistakes, atol=atol, rtol=rtol) or \
            not same(out, expected.reshape(kept), atol=atol, rtol=rtol):
        return
    fail("size-1 axes dropped", tried=tried, got=f"{what} of shape {tuple(out.shape)}, with the right values",
         expected=f"shape {tuple(expected.shape)}",
         cause="your code removes the axes of size 1: .squeeze() without an axis drops every one of them",
         fix="keep every axis: squeeze nothing, or only the axis you added (.squeeze(-1))")


def _precision(out: torch.Tensor, expected: torch.Tensor, *, tried: str, what: str, half_only: bool = False) -> None:
    """Fail when ``out`` is within a few float16 rounding steps of the truth everywhere: a step in half precision
    when every value is a half-precision number, else (unless ``half_only``) a plain "3 digits right"."""
    a, e = out.detach().double(), expected.detach().double()
    if not (torch.isfinite(a).all() and torch.isfinite(e).all()) or out.dtype in _HALF:
        return
    scale = float(e.abs().max())
    step = torch.clamp(e.abs(), min=scale) * 2.0 ** -10  # float16's spacing near the largest value
    err = (a - e).abs()
    if float(err.max()) > 2.0 ** -14 * scale and bool((err <= 4 * step).all()):
        got = (f"{what} agree with the expected values to about 3 significant digits only (largest difference "
               f"{fmt(float(err.max()))})")
        # Only a result that passed through half precision is made of half-precision numbers.
        half = next((name for name, dt in (("float16", torch.float16), ("bfloat16", torch.bfloat16))
                     if torch.equal(a, a.to(dt).double())), "")
        if half:
            fail(f"{half} precision", tried=tried, got=got + f"; every value is a {half} number",
                 expected="the input's precision",
                 cause=f"your result went through {half}, which keeps about 3 significant digits, and was converted "
                       "back afterwards",
                 fix="compute in the input's dtype: leave out .half(), .to(torch.float16) or .to(torch.bfloat16)")
        if half_only:
            return
        fail("about 3 digits right", tried=tried, got=got, expected="the input's precision",
             fix="look for a step that rounds: round(…), a conversion to a smaller dtype, or values printed and "
                 "read back")


def _batch_entries(out: torch.Tensor, expected: torch.Tensor, *, tried: str, what: str, atol: float,
                   rtol: float) -> None:
    """For 3-D and larger results: say which entries along the first (batch) axis are wrong."""
    if out.ndim < 3 or out.shape[0] < 2 or tuple(out.shape) != tuple(expected.shape):
        return
    right = [same(out[i], expected[i], atol=atol, rtol=rtol) for i in range(out.shape[0])]
    if all(right) or not any(right):
        return
    wrong = [i for i, r in enumerate(right) if not r]
    first = right.index(True)
    if all(same(out[i], out[first], atol=atol, rtol=rtol) for i in wrong):
        fail(f"batch entry {first} repeated", tried=tried,
             got=f"{what} repeat batch entry {first}'s values in entries {', '.join(map(str, wrong))}",
             expected="each batch entry computed from its own input",
             cause=f"your code computes batch entry {first} and reuses it for the others",
             fix="compute every step for all batch entries at once (reduce along the axis `dim`, not over [0])")
    fail("wrong for some batch entries", tried=tried,
         got=f"{what} are right for batch entr{'y' if right.count(True) == 1 else 'ies'} "
             f"{', '.join(str(i) for i, r in enumerate(right) if r)} and wrong for {', '.join(map(str, wrong))}",
         expected="every batch entry right", fix="make every step treat all batch entries alike: no loop over a "
         "fixed range, no indexing with a fixed number")


def _dim_text(dim: int | None) -> str:
    return "" if dim is None else f", {dim}"


# ============================================================================ stable_softmax
_SOFTMAX_SIG = "stable_softmax(x, dim=-1)"


@check("stable_softmax", expects="a function stable_softmax(x, dim=-1) returning weights shaped like x")
def check_stable_softmax(fn: Learner) -> str:
    run, ruled = TensorOrArray(fn), RuledOut()
    cases: list[tuple[torch.Tensor, int | None]] = list(_cases(3))
    cases.append((2 * torch.randn(3, 4, generator=torch.Generator().manual_seed(33)), None))  # the default dim
    arglist = [(x,) if dim is None else (x, dim) for x, dim in cases]
    passed: set[int] = set()
    for x, dim in cases:
        d = -1 if dim is None else dim
        tried = (f"stable_softmax(x{_dim_text(dim)}) on {describe_input(x)}" +
                 (" (dim left at its default)" if dim is None else ""))
        args = (x,) if dim is None else (x, dim)
        out = as_tensor(_call(run, args, tried=tried, expected="weights shaped like x", signature=_SOFTMAX_SIG,
                              others=_elsewhere(run, arglist, passed, lambda x, dim=-1: torch.softmax(x.double(), dim))),
                        tried=tried)
        expect_floating(out, x.dtype, tried=tried, what="your weights")
        atol, rtol = _tolerance(x)
        mistakes = softmax_mistakes(x, d)
        if dim is None:
            mistakes = [Mistake("default dim is not -1", f"with dim left out, you normalised along axis {o}",
                                "keep the default dim=-1 (the last axis)", lambda o=o: torch.softmax(x, o))
                        for o in range(x.ndim - 1)] + mistakes
        compare(out, torch.softmax(x.double(), d), tried=tried, what="your weights", mistakes=mistakes,
                 atol=atol, rtol=rtol, ruled_out=ruled, explain=lambda o, x=x, d=d: explain_weights(o, x, d, tried=tried),
                 shape_fix="the weights have the shape of x: keep the reduced axis with keepdim=True before dividing",
                 reduced=d % x.ndim)
        passed.add(x.ndim)
    expect_input_unchanged(fn, cases[0][0], cases[0][1], call=f"stable_softmax(x, {cases[0][1]})",
                           numpy=run.mode == "numpy")
    return (f"matches torch.softmax on {len(cases)} cases ({run.kind}): any axis, 1-D to 4-D, float16/32/64, "
            "stable at ±1000, -inf entries")


# ============================================================================ logsumexp
def _lse_slips(x: torch.Tensor, d: int) -> list[tuple[str, str, str, Callable[[], torch.Tensor]]]:
    """Wrong versions of logsumexp, with the reduced axis kept: (summary, cause, fix, value). Shared by
    the logsumexp and log_softmax checks (log_softmax = x − logsumexp)."""
    m = x.amax(d, keepdim=True)
    e = lambda z: torch.exp(z).sum(d, keepdim=True)  # noqa: E731
    formula = "logsumexp(x) = m + log Σ e^(x − m), m = x.amax(dim, keepdim=True)"
    no_exp = ("exponential missing", "you summed x − m (or its log) where logsumexp sums e^(x − m): those terms are "
              "≤ 0, so the log of their sum is NaN", formula)
    out = [
        ("log term subtracted", "you subtracted log Σ e^(x − m) from m; logsumexp adds it", formula,
         lambda: m - torch.log(e(x - m))),
        ("log missing", "you added Σ e^(x − m) itself to m, without its log", formula, lambda: m + e(x - m)),
        ("exp where the log belongs", "you applied exp to Σ e^(x − m) where logsumexp takes its log", formula,
         lambda: m + torch.exp(e(x - m))),
        (*no_exp, lambda: m + torch.log((x - m).sum(d, keepdim=True))),
        (*no_exp, lambda: m + torch.log(torch.log(x - m).sum(d, keepdim=True))),
        ("maximum added inside the exponential", "you exponentiated x + m where it must be x − m", formula,
         lambda: m + torch.log(e(x + m))),
        ("maximum subtracted only outside", "you exponentiated x itself and added m outside: the shift must happen "
         "inside the exponential too", formula, lambda: m + torch.log(e(x))),
        ("mean instead of sum", "you took the log of the mean of e^(x − m), not of the sum: that is logsumexp minus "
         "log n", "sum the exponentials: .sum(dim), not .mean(dim)",
         lambda: m + torch.log(torch.exp(x - m).mean(d, keepdim=True))),
        ("log base 2 or 10", "you used log2 or log10 where logsumexp uses the natural log", "use torch.log (ln)",
         lambda: m + torch.log2(e(x - m))),
        ("log base 2 or 10", "you used log2 or log10 where logsumexp uses the natural log", "use torch.log (ln)",
         lambda: m + torch.log10(e(x - m))),
        ("log1p for log", "you took log1p of the sum, log(1 + Σ e^(x − m)), where logsumexp takes log Σ e^(x − m)",
         "use torch.log: log1p(y) is log(1 + y), another function", lambda: m + torch.log1p(e(x - m))),
    ]
    for o in _others(x.ndim, d):
        out.append(("sum taken along the wrong axis", f"you summed e^(x − m) along axis {o}, not along dim", formula,
                    lambda o=o: m + torch.log(torch.exp(x - m).sum(o, keepdim=True))))
        mo = x.amax(o, keepdim=True)
        out.append(("maximum taken along the wrong axis", f"you took the maximum along axis {o}, not along dim: m "
                    "must be one number per slice along dim", formula,
                    lambda mo=mo: mo + torch.log(e(x - mo))))
    return out


def _lse_mistakes(x: torch.Tensor, d: int) -> list[Mistake]:
    m = x.amax(d, keepdim=True)
    shift_fix = "compute m + log Σ e^(x − m) with m = x.amax(dim, keepdim=True), then drop the axis"
    out = [
        Mistake("maximum not subtracted", "you computed log Σ e^x directly: e^x overflows to inf near 1000, and "
                "near -1000 the sum underflows to 0 and log 0 = -inf", shift_fix,
                lambda: torch.log(torch.exp(x).sum(d))),
        Mistake("maximum not added back", "you subtracted the maximum inside the log but did not add it back: "
                "logsumexp(x) = m + log Σ e^(x − m)", "add m back outside the log",
                lambda: torch.log(torch.exp(x - m).sum(d))),
        Mistake("maximum taken over the whole tensor", "you shifted by the maximum of the whole tensor: a slice "
                "far below it underflows to log 0 = -inf", shift_fix,
                lambda: x.max() + torch.log(torch.exp(x - x.max()).sum(d))),
        Mistake("maximum only", "you returned the maximum of each slice, without the log Σ e^(x − m) term",
                "add log Σ e^(x − m)", lambda: m.squeeze(d)),
        Mistake("maximum subtracted outside the log", "you subtracted the maximum outside the log where it must "
                "be added: logsumexp(x) = m + log Σ e^(x − m)", "add m: m + log Σ e^(x − m)",
                lambda: torch.log(torch.exp(x - m).sum(d)) - m.squeeze(d)),
        Mistake("sum of the scores", "you summed the scores: logsumexp sums e^x and then takes the log",
                "compute m + log Σ e^(x − m)", lambda: x.sum(d)),
        Mistake("maximum plus log n", "you returned max + log n, which is logsumexp only when all scores are equal",
                "compute m + log Σ e^(x − m): the sum depends on every score", lambda: m.squeeze(d) + math.log(x.shape[d])),
        Mistake("log-softmax returned", "you returned x − logsumexp(x) (log-softmax), not logsumexp",
                "return m + log Σ e^(x − m), one number per slice", lambda: torch.log_softmax(x, d)),
        Mistake("reduced axis kept", "you kept the reduced axis (keepdim=True): the docstring removes it, like "
                "torch.logsumexp(x, dim)", "drop the axis: .squeeze(dim) at the end, or reduce without keepdim",
                lambda: torch.logsumexp(x, d, keepdim=True)),
        Mistake("squeeze() removed every size-1 axis", "you called .squeeze() without an axis, so size-1 axes "
                "other than dim were removed too", "squeeze only the reduced axis: .squeeze(dim)",
                lambda: torch.logsumexp(x, d, keepdim=True).squeeze()),
        Mistake("keepdim missing on the maximum", "you took the maximum without keepdim=True, so it broadcast "
                "against the wrong axis of x", "m = x.amax(dim, keepdim=True); squeeze only at the end",
                lambda: x.amax(d) + torch.log(torch.exp(x - x.amax(d)).sum(d))),
        Mistake("squeeze() on the maximum", "you removed m's axes with .squeeze() (no axis), which also drops the "
                "other size-1 axes, so m no longer lines up with the sum it is added to",
                "m.squeeze(dim), or keep both with keepdim=True and squeeze(dim) once at the end",
                lambda: m.squeeze() + torch.log(torch.exp(x - m).sum(d))),
    ]
    for o in _others(x.ndim, d):
        out.append(Mistake(f"reduced along axis {o}, not along dim", f"you reduced along axis {o}",
                           "reduce along `dim` in the maximum and in the sum", lambda o=o: torch.logsumexp(x, o)))
    out += [Mistake(summary, cause, fix, lambda value=value: value().squeeze(d))
            for summary, cause, fix, value in _lse_slips(x, d)]
    if x.ndim > 1:
        out.append(Mistake("squeezed the wrong axis", "you removed the last axis, not the reduced axis `dim`",
                           "squeeze the axis you reduced: .squeeze(dim)",
                           lambda: None if d == x.ndim - 1 else torch.logsumexp(x, d, keepdim=True).squeeze(-1)))
    out.append(Mistake("keepdim missing on the sum", "you summed without keepdim=True and added the kept maximum, "
                       "so the two broadcast into a matrix", "keep both axes (keepdim=True), squeeze once at the end",
                       lambda: (m + torch.log(torch.exp(x - m).sum(d))).squeeze(d)))
    return out


def _kinds(o: torch.Tensor) -> str:
    return " and ".join(k for k, hit in (("NaN", torch.isnan(o).any()), ("inf", torch.isinf(o).any())) if hit)


def _explain_lse(out: torch.Tensor, x: torch.Tensor, d: int, tried: str) -> None:
    o, e = out.detach().double(), torch.logsumexp(x.double(), d)
    bad = ~torch.isfinite(o) & torch.isfinite(e)
    if bad.any():
        explain_nonfinite(bad.unsqueeze(d).expand_as(x), x.double(), x.dtype, tried=tried, kinds=_kinds(o[bad]),
                          got=f"{_kinds(o[bad])} in {int(bad.sum())} of {o.numel()} entries", expected="finite values")
    if o.shape != e.shape:
        return
    wrong = ~torch.isclose(o, e, atol=1e-4, rtol=1e-4, equal_nan=True)
    masked = torch.isneginf(x).any(d)  # slices holding -inf scores
    if not wrong.any() or (wrong & ~masked).any() or not torch.isfinite(o[wrong]).all():
        return
    # Had every -inf score been replaced by one finite c, each wrong slice would give o = log(e^e + k·e^c):
    # solve for c (k = the slice's number of -inf scores) and see whether one c explains them all.
    k = torch.isneginf(x).sum(d).double()
    gap = (o - e)[wrong]
    fills = o[wrong] + torch.log(-torch.expm1(-gap.clamp(min=1e-300))) - torch.log(k[wrong])
    one_fill = bool((gap > 0).all()) and float(fills.max() - fills.min()) <= 1e-3 * max(1.0, float(fills.abs().max()))
    c = float(fills.mean())
    if abs(c - round(c)) <= 1e-3 * max(1.0, abs(c)):  # the answer's own rounding blurs a whole-number fill
        c = float(round(c))
    fail("-inf scores counted as finite" if one_fill else "wrong in slices with -inf scores", tried=tried,
         got=f"in {int(wrong.sum())} of the {int(masked.sum())} slices holding -inf, your result is what every -inf "
             f"score replaced by {fmt(c)} would give" if one_fill else
             f"your result is wrong in {int(wrong.sum())} slice(s) holding -inf scores (right wherever a slice has "
             "no -inf, and on the cases before this one)",
         expected="-inf scores adding nothing to the sum (e^-inf = 0)",
         cause=f"your code turns -inf scores into {fmt(c)} (a fill, nan_to_num or a clamp), so each adds "
               f"e^{fmt(c)} to the sum" if one_fill else "",
         fix="leave -inf scores as they are: m + log Σ e^(x − m) handles them, since e^(-inf − m) = 0")


@check("logsumexp", expects="a function logsumexp(x, dim=-1) returning log Σ e^x along dim, dim removed")
def check_logsumexp(fn: Learner) -> str:
    run, ruled = TensorOrArray(fn), RuledOut()
    cases: list[tuple[torch.Tensor, int | None]] = list(_cases(4))
    cases.append((2 * torch.randn(3, 4, generator=torch.Generator().manual_seed(44)), None))
    arglist = [(x,) if dim is None else (x, dim) for x, dim in cases]
    passed: set[int] = set()
    for x, dim in cases:
        d = (-1 if dim is None else dim) % x.ndim
        tried = (f"logsumexp(x{_dim_text(dim)}) on {describe_input(x)}" +
                 (" (dim left at its default)" if dim is None else ""))
        args = (x,) if dim is None else (x, dim)
        out = as_tensor(_call(run, args, tried=tried, expected="log Σ e^x along dim, dim removed",
                              signature="logsumexp(x, dim=-1)",
                              others=_elsewhere(run, arglist, passed,
                                                lambda x, dim=-1: torch.logsumexp(x.double(), dim))), tried=tried)
        expect_floating(out, x.dtype, tried=tried)
        atol, rtol = _tolerance(x)
        mistakes = _lse_mistakes(x, d)
        if dim is None:
            mistakes = [Mistake("default dim is not -1", f"with dim left out, you reduced along axis {o}",
                                "keep the default dim=-1 (the last axis)", lambda o=o: torch.logsumexp(x, o))
                        for o in range(x.ndim - 1)] + mistakes
        compare(out, torch.logsumexp(x.double(), d), tried=tried, what="your result", mistakes=mistakes,
                 atol=max(atol, 1e-4), rtol=rtol, ruled_out=ruled,
                 explain=lambda o, x=x, d=d: _explain_lse(o, x, d, tried),
                 shape_fix="the result has the shape of x with `dim` removed, like torch.logsumexp(x, dim)")
        passed.add(x.ndim)
    expect_input_unchanged(fn, cases[0][0], cases[0][1], call=f"logsumexp(x, {cases[0][1]})",
                           numpy=run.mode == "numpy")
    return f"matches torch.logsumexp on {len(cases)} cases ({run.kind}): any axis, 1-D to 4-D, finite at ±1000"


# ============================================================================ log_softmax
def _log_softmax_mistakes(x: torch.Tensor, d: int) -> list[Mistake]:
    m = x.amax(d, keepdim=True)
    lse = torch.logsumexp(x, d, keepdim=True)
    log_of = ("log of the softmax", "you took the log of the weights: a weight that underflowed to 0 gives log 0 "
              "= -inf, although its true log-probability is an ordinary number",
              "compute x − logsumexp(x) along dim, never log(softmax(x))")
    shift_fix = "x − (m + log Σ e^(x − m)) with m = x.amax(dim, keepdim=True)"
    out = [
        Mistake(*log_of, lambda: torch.log(torch.softmax(x, d))),
        Mistake(*log_of, lambda: torch.log(torch.exp(x - m) / torch.exp(x - m).sum(d, keepdim=True))),
        Mistake("maximum not subtracted", "you computed log Σ e^x directly: e^x overflows near 1000 and the sum "
                "underflows near -1000", shift_fix, lambda: x - torch.log(torch.exp(x).sum(d, keepdim=True))),
        Mistake("maximum not subtracted", "you took the log of a softmax computed without subtracting the maximum",
                shift_fix, lambda: torch.log(torch.exp(x) / torch.exp(x).sum(d, keepdim=True))),
        Mistake("maximum taken over the whole tensor", "you shifted by the maximum of the whole tensor, so a slice "
                "far below it underflows", shift_fix,
                lambda: x - x.max() - torch.log(torch.exp(x - x.max()).sum(d, keepdim=True))),
        Mistake("maximum not added back", "inside logsumexp you subtracted the maximum but did not add it back, so "
                "every slice is off by its maximum", "logsumexp(x) = m + log Σ e^(x − m)",
                lambda: x - torch.log(torch.exp(x - m).sum(d, keepdim=True))),
        Mistake("keepdim missing", "you reduced without keepdim=True, so logsumexp broadcast against the wrong axis "
                "(each slice got another slice's normaliser)", "keep the axis: logsumexp with keepdim=True",
                lambda: x - torch.logsumexp(x, d)),
        Mistake("softmax returned", "you returned the weights, not their log", "return x − logsumexp(x)",
                lambda: torch.softmax(x, d)),
        Mistake("sign flipped", "you returned logsumexp(x) − x, the negative log-probabilities",
                "return x − logsumexp(x)", lambda: lse - x),
        Mistake("maximum subtracted instead of logsumexp", "you returned x − max, which is not normalised: "
                "exp of it does not sum to 1", "subtract logsumexp(x), not only the maximum", lambda: x - m),
        Mistake("log base 10", "you took log10 of the weights; log-probabilities use the natural log",
                "compute x − logsumexp(x) (natural log throughout)", lambda: torch.log10(torch.softmax(x, d))),
        Mistake("log base 2", "you took log2 of the weights; log-probabilities use the natural log",
                "compute x − logsumexp(x) (natural log throughout)", lambda: torch.log2(torch.softmax(x, d))),
    ]
    for o in _others(x.ndim, d):
        out.append(Mistake(f"log-softmax along axis {o}", f"you normalised along axis {o}, not along dim",
                           "use `dim` in the maximum and the sum", lambda o=o: torch.log_softmax(x, o)))
    out += [Mistake(summary, "in logsumexp, " + cause, fix, lambda value=value: x - value())
            for summary, cause, fix, value in _lse_slips(x, d)]
    out += [
        Mistake("logsumexp added", "you returned x + logsumexp(x); log-softmax subtracts it",
                "return x − logsumexp(x)", lambda: x + lse),
        Mistake("scores returned unchanged", "you returned x without subtracting logsumexp(x)",
                "return x − logsumexp(x)", lambda: x.clone()),
    ]
    return out


def _explain_log_softmax(out: torch.Tensor, x: torch.Tensor, d: int, tried: str) -> None:
    o, expected = out.detach().double(), torch.log_softmax(x.double(), d)
    tail = torch.isfinite(expected) & (expected < _underflow_limit(x.dtype))
    wrong = ~torch.isclose(o, expected, atol=1e-4, rtol=1e-5, equal_nan=True)
    bad = ~torch.isfinite(o) & torch.isfinite(expected)
    if bad.any() and not (bad & ~tail).any():
        fail("-inf for very unlikely entries" if torch.isneginf(o[bad]).all() else "wrong for very unlikely entries",
             tried=tried, got=_tail_text(o, expected, bad), expected="the log-probability itself, however negative",
             cause=f"you took the log of a probability: below e^{_underflow_limit(x.dtype):.0f} a "
                   f"{str(x.dtype).replace('torch.', '')} probability rounds to 0, and log 0 = -inf",
             fix="compute x − logsumexp(x) along dim, never log(softmax(x))")
    if bad.any():
        explain_nonfinite(bad.any(d, keepdim=True).expand_as(x), x.double(), x.dtype, tried=tried,
                          kinds=_kinds(o[bad]), got=f"{_kinds(o[bad])} in {int(bad.sum())} of {o.numel()} entries",
                          expected="finite log-probabilities wherever x is finite")
    if tail.any() and wrong.any() and not (wrong & ~tail).any():
        fail("wrong for very unlikely entries", tried=tried,
             got=f"{_tail_text(o, expected, wrong)}",
             expected="the log-probability itself, however negative",
             cause=f"you took the log of a probability: below e^{_underflow_limit(x.dtype):.0f} a "
                   f"{str(x.dtype).replace('torch.', '')} probability rounds to 0 (or to whatever floor you clamp "
                   "it to), so its log is lost",
             fix="compute x − logsumexp(x) along dim, never log(softmax(x))")
    filled = torch.isneginf(expected) & torch.isfinite(o)
    if filled.any():
        i = tuple(int(k) for k in filled.nonzero()[0])
        fail("finite where the score is -inf", tried=tried,
             got=f"{int(filled.sum())} entries whose score is -inf get a finite log-probability (at index {i}: "
                 f"{fmt(float(o[i]))})",
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


def _tail_text(o: torch.Tensor, e: torch.Tensor, wrong: torch.Tensor) -> str:
    i = tuple(int(k) for k in wrong.nonzero()[0])
    return (f"{int(wrong.sum())} entries wrong, all where the true log-probability is tiny: at index {i} you "
            f"return {fmt(float(o[i]))}, the true value is {fmt(float(e[i]))}")


@check("log_softmax", expects="a function log_softmax(x, dim=-1) returning log-probabilities shaped like x")
def check_log_softmax(fn: Learner) -> str:
    run, ruled = TensorOrArray(fn), RuledOut()
    cases: list[tuple[torch.Tensor, int | None]] = list(_cases(5))  # the float32 tail [0, -1000, 5] among them
    cases.append((torch.tensor([[0.0, -1000.0, 5.0], [-2000.0, 2.0, 1.0]], dtype=torch.float64), -1))
    cases.append((2 * torch.randn(3, 4, generator=torch.Generator().manual_seed(55)), None))
    arglist = [(x,) if dim is None else (x, dim) for x, dim in cases]
    passed: set[int] = set()
    for x, dim in cases:
        d = (-1 if dim is None else dim) % x.ndim
        tried = (f"log_softmax(x{_dim_text(dim)}) on {describe_input(x)}" +
                 (" (dim left at its default)" if dim is None else ""))
        args = (x,) if dim is None else (x, dim)
        out = as_tensor(_call(run, args, tried=tried, expected="log-probabilities shaped like x",
                              signature="log_softmax(x, dim=-1)",
                              others=_elsewhere(run, arglist, passed,
                                                lambda x, dim=-1: torch.log_softmax(x.double(), dim))), tried=tried)
        expect_floating(out, x.dtype, tried=tried)
        atol, rtol = _tolerance(x)
        mistakes = _log_softmax_mistakes(x, d)
        if dim is None:
            mistakes = [Mistake("default dim is not -1", f"with dim left out, you normalised along axis {o}",
                                "keep the default dim=-1 (the last axis)", lambda o=o: torch.log_softmax(x, o))
                        for o in range(x.ndim - 1)] + mistakes
        compare(out, torch.log_softmax(x.double(), d), tried=tried, what="your result", mistakes=mistakes,
                 atol=max(atol, 1e-4), rtol=rtol, ruled_out=ruled,
                 explain=lambda o, x=x, d=d: _explain_log_softmax(o, x, d, tried),
                 shape_fix="log-probabilities have the shape of x: subtract logsumexp computed with keepdim=True",
                 reduced=d)
        passed.add(x.ndim)
    expect_input_unchanged(fn, cases[0][0], cases[0][1], call=f"log_softmax(x, {cases[0][1]})",
                           numpy=run.mode == "numpy")
    lowest = min(float(torch.log_softmax(x.double(), -1 if dim is None else dim).nan_to_num(neginf=0.0).min())
                 for x, dim in cases)
    return (f"matches torch.log_softmax on {len(cases)} cases ({run.kind}): any axis, float16/32/64, finite for "
            f"log-probabilities down to {lowest:.0f}".replace("to -", "to −"))


# ============================================================================ softmax_temperature
def _temperature_cases() -> list[tuple[torch.Tensor, float]]:
    g = torch.Generator().manual_seed(6)
    x = 2 * torch.randn(3, 6, generator=g)
    return [
        (x, 0.5),
        (x, 2.0),  # the same scores at another temperature: an ignored temperature shows at once
        (x, 1.0),
        (torch.randn(2, 2, 5, generator=g, dtype=torch.float64), 3.0),
        (torch.randn(7, generator=g), 0.25),
        (torch.randn(4, 1, generator=g), 0.7),  # one key per row
        (torch.randn(1, 5, generator=g, dtype=torch.float64), 10.0),
        (2 * torch.randn(4, 4, generator=g), 1.5),  # square: a keepdim slip broadcasts instead of failing
        (torch.tensor([[50.0, 48.0, 49.0], [-3.0, 0.0, 1.0]]), 1.0),  # e^x finite in float32, e^(x + max) not
        (torch.tensor([[1000.0, 1001.0, 1002.0], [2.0, 1.0, 0.0]]), 1.0),
        (torch.tensor([[-1000.0, -998.0, -999.0], [0.0, 1.0, 2.0]], dtype=torch.float64), 0.5),
        (torch.tensor([[3.0, 1.0, -2.0, 2.9], [0.5, 0.4, 0.3, 0.2]]), 0.01),  # x / T reaches 300
        (torch.tensor([[0.0, -INF, 1.0], [-INF, 2.0, 2.0]]), 0.3),
        (3 * torch.randn(3, 5, generator=g, dtype=torch.float64), 100.0),
        (torch.tensor([[1.0, 2.0, 3.0], [6.0, 4.0, 5.0]], dtype=torch.float16), 0.5),
    ]


def _temperature_mistakes(x: torch.Tensor, t: float) -> list[Mistake]:
    soft = torch.softmax(x, -1)
    return [
        Mistake("temperature multiplied", "you multiplied the scores by T; softmax(x / T) divides them, so a high T "
                "flattens the weights and a low T sharpens them", "divide: softmax(x / temperature)",
                lambda: torch.softmax(x * t, -1)),
        Mistake("temperature ignored", "the temperature has no effect on your weights", "divide the scores by the "
                "temperature before the softmax", lambda: None if t == 1.0 else soft),
        Mistake("temperature applied after the softmax", "you applied the temperature to the weights, after the "
                "softmax", "divide the scores by T first, then take the softmax", lambda: soft / t),
        Mistake("temperature applied after the softmax", "you raised the weights to the power 1/T without "
                "normalising again", "divide the scores by T first, then take the softmax", lambda: soft ** (1 / t)),
        Mistake("temperature applied twice", "you divided by T twice (x / T²)", "divide once: x / temperature",
                lambda: torch.softmax(x / t ** 2, -1)),
        Mistake("divided by √T", "you divided by √T, not by T", "divide by the temperature itself",
                lambda: torch.softmax(x / math.sqrt(t), -1)),
        Mistake("temperature only in the numerator", "you divided only the exponent of the numerator by T, so the "
                "weights no longer sum to 1", "compute z = x / T once and take the softmax of z",
                lambda: torch.exp(x / t - (x / t).amax(-1, keepdim=True)) /
                torch.exp(x - x.amax(-1, keepdim=True)).sum(-1, keepdim=True)),
        Mistake("weights raised to 1/T and renormalised", "you raised softmax(x) to the power 1/T and normalised "
                "again: equal on paper, but for a small T the powers underflow to 0 (0/0 = NaN)",
                "divide the scores by T first, then take the stable softmax",
                lambda: (soft ** (1 / t)) / (soft ** (1 / t)).sum(-1, keepdim=True)),
    ] + softmax_mistakes(x / t, -1)


@check("softmax_temperature", expects="a function softmax_temperature(x, temperature) returning weights shaped like x")
def check_softmax_temperature(fn: Learner) -> str:
    run, ruled = TensorOrArray(fn), RuledOut()
    cases = _temperature_cases()
    passed: list[float] = []
    passed_ndims: set[int] = set()
    for x, t in cases:
        # The temperatures a wrong answer could be using that the cases it passed leave possible: a whole
        # number made of T, a fixed value seen before; 1/T, 1, T², √T and -T only while every case passed had T = 1.
        known: dict[str, float] = {}
        if float(int(t)) != t and int(t) != 0:
            known[f"{int(t)}: you cut the temperature to a whole number (int)"] = float(int(t))
        if float(round(t)) != t and round(t) != 0:
            known[f"{round(t)}: you rounded the temperature to a whole number"] = float(round(t))
        known.update({f"{p:g}, the temperature of an earlier case: your function does not use the temperature it "
                      f"is given": p for p in passed if p != t})
        if all(p == 1.0 for p in passed):
            known.update({"1/T (you multiplied by T)": 1 / t, "1 (the temperature is not used)": 1.0,
                          "T² (you divided by T twice)": t * t, "√T": math.sqrt(t), "-T (a sign slip)": -t})
        tried = f"softmax_temperature(x, {t:g}) on {describe_input(x)}"
        out = as_tensor(_call(run, (x, t), tried=tried, expected="weights shaped like x",
                              signature="softmax_temperature(x, temperature)",
                              others=_elsewhere(run, cases, passed_ndims,
                                                lambda x, t: torch.softmax(x.double() / t, -1))), tried=tried)
        expect_floating(out, x.dtype, tried=tried, what="your weights")
        atol, rtol = _tolerance(x)
        compare(out, torch.softmax(x.double() / t, -1), tried=tried, what="your weights",
                 mistakes=_temperature_mistakes(x, t), atol=atol, rtol=rtol, ruled_out=ruled,
                 explain=lambda o, x=x, t=t: explain_weights(o, x, -1, tried=tried, temperature=t, known=known),
                 shape_fix="the weights have the shape of x", reduced=x.ndim - 1)
        passed.append(t)
        passed_ndims.add(x.ndim)
    expect_input_unchanged(fn, cases[0][0], cases[0][1], call=f"softmax_temperature(x, {cases[0][1]:g})",
                           numpy=run.mode == "numpy")
    temps = sorted({t for _, t in cases})
    return (f"matches torch.softmax(x / T) on {len(cases)} cases, T from {temps[0]:g} to {temps[-1]:g} "
            f"({run.kind}), stable at ±1000")
