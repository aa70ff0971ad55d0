"""Checks for notebook 03 (softmax, stably): stable_softmax, logsumexp, log_softmax, softmax_temperature.

Oracle: ``torch.softmax``, ``torch.logsumexp`` and ``torch.log_softmax`` in float64. The cases (:func:`_cases`): every
kind of axis (``dim=-1``, ``0``, a middle axis, another negative axis, the default) on 1-D to 4-D inputs with size-1
axes besides the reduced one; float32, float64 and float16; and the edges that break careless versions — scores near
±1000 whose maximum sits at the start, middle or end of a slice, slices far apart in one tensor, ``-inf`` entries,
and a log-probability of −1005, far below what a float64 probability can hold. Functions written for tensors or for
NumPy arrays are both accepted (``kit.TensorOrArray``).

Every check is one body (:func:`_judge_cases`): its table of known mistakes (``kit.Known``) judged by one
``kit.Suspects``; what no mistake reproduces is measured (``kit.what_is_off``, :func:`explain_weights`: NaN from an
overflow, slices that sum to 1 along another axis, another temperature…). The probe ``kit.call`` says once whether
the function leaves its input as it was.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from . import kit
from .compare import Failure, Mistake
from .core import Learner, LearnerRaised, as_tensor, check, fail, fmt, learner_error

__all__ = ["check_stable_softmax", "check_logsumexp", "check_log_softmax", "check_softmax_temperature",
           "describe_input", "expect_floating", "explain_weights"]

INF = float("inf")
_HALF = (torch.float16, torch.bfloat16)
_SHIFT_FIX = "subtract the maximum of each slice along `dim` before exp: x - x.amax(dim, keepdim=True)"


def _literal(x: torch.Tensor) -> str:
    if x.ndim == 0:
        return {-INF: "-inf", INF: "inf"}.get(float(x), f"{float(x):g}")
    return "[" + ", ".join(_literal(row) for row in x) + "]"


def describe_input(x: torch.Tensor, name: str = "x") -> str:
    """``x of shape (4, 3), float32``, or for a small input of whole numbers (the hand-made edges) its values."""
    dtype, values = str(x.dtype).replace("torch.", ""), x.detach().double()
    finite = values[torch.isfinite(values)]
    if x.numel() <= 12 and x.ndim <= 3 and bool((finite == finite.round()).all()):
        return f"{name} = {_literal(values)} ({dtype})"
    return f"{name} of shape {tuple(x.shape)}, {dtype}"


def expect_floating(out: torch.Tensor, input_dtype: torch.dtype, *, tried: str, what: str = "your result") -> None:
    """Fail, naming the dtype, when ``out`` holds integers, booleans or complex numbers, or is in float16/bfloat16
    while the input was not (values then agree to about 3 digits only)."""
    dtype, wanted = str(out.dtype).replace("torch.", ""), str(input_dtype).replace("torch.", "")
    if out.dtype == torch.bool or not (out.is_floating_point() or out.is_complex()):
        fail(f"integer result ({dtype})", tried=tried, got=f"{what}: dtype {dtype}, which holds whole numbers only",
             expected=f"floating-point values ({wanted}, like the input)",
             fix="keep every step in floating point: no .long()/.int()/.bool(), no // division, and take values "
                 "(x.amax(…) or .values), not indices (argmax, .indices)")
    if out.is_complex():
        fail(f"complex result ({dtype})", tried=tried, got=f"{what}: the complex dtype {dtype}",
             expected=f"real values ({wanted})", fix="drop the step that makes the numbers complex")
    if out.dtype in _HALF and input_dtype not in _HALF:
        fail(f"result in {dtype}", tried=tried,
             got=f"{what}: dtype {dtype}, which keeps only about 3 significant digits",
             expected=f"{wanted}, the input's dtype", cause=f"your computation converted to {dtype}",
             fix=f"leave out the conversion (.half(), .to({dtype}), dtype={dtype}): compute in the input's dtype")


def raised_hint(exc: LearnerRaised, *, signature: str) -> dict[str, str]:
    """``cause``/``fix`` for an exception whose message points at one (else ``{}``: the course-wide table follows)."""
    if hint := kit.signature_hint(exc, signature):
        return hint
    if "torch.return_types" in exc.message:
        return dict(cause="x.max(dim) returns a pair (values, indices), not a tensor",
                    fix="use x.amax(dim, keepdim=True), or x.max(dim, keepdim=True).values")
    return kit.reduction_hint(exc, dim="dim" in signature)


# ============================================================================ one body for every check
class _Known(kit.Known):
    """A known mistake whose texts may name the case's ``dim`` (``{dim}``)."""

    def on(self, case: tuple) -> Mistake:
        dim = str(case[1]) if len(case) > 1 else "-1"
        return Mistake(*(t.replace("{dim}", dim) for t in (self.summary, self.cause, self.fix)),
                       lambda: self.make(*case))


def _dim(case: tuple) -> int:
    return (case[1] if len(case) > 1 else -1) % case[0].ndim


def _judge_cases(fn: Learner, cases: list[tuple], *, signature: str, oracle: Callable, table: list[kit.Known],
                 explain: Callable, expected: str, shape_fix: str, what: str = "your result",
                 call: Callable[[tuple], str] | None = None,
                 dim: Callable[[tuple], int] = _dim, reduced: bool = True, atol: float = 1e-5) -> kit.TensorOrArray:
    """Run the learner's function on every case and judge each answer against ``oracle`` (same arguments): the shape,
    the dtype, then the values — a known mistake of ``table`` that reproduces them, else what ``kit.what_is_off`` and
    ``explain(out, case, passed, tried)`` measure. Then whether the input is left unchanged. ``call`` writes a case as
    a call (by default ``name(x, dim)``, the name taken from ``signature``)."""
    name = signature.split("(")[0]
    call = call or (lambda case: f"{name}(x{', ' + str(case[1]) if len(case) > 1 else ''})")
    run, suspects, passed = kit.TensorOrArray(fn), kit.Suspects(table, atol=atol, rtol=1e-4), []
    for case in cases:
        x, tried = case[0], f"{call(case)} on {describe_input(case[0])}" + (" (dim left at its default)"
                                                                              if len(case) == 1 else "")
        try:
            result = run(*case)
        except LearnerRaised as exc:
            hint, ndims = raised_hint(exc, signature=signature), {c[0].ndim for c in passed}
            if not hint or hint["cause"].startswith("your code uses an axis number"):
                hint = kit.works_elsewhere(x.shape, [
                    (c[0].shape, lambda c=c: kit.agrees(run(*c), oracle(*c), atol=1e-4, rtol=1e-3)) for c in cases
                    if c[0].ndim not in ndims and c[0].dtype not in _HALF],
                    fix="write every step for any shape: reduce along `dim` with keepdim=True, no loops over "
                        "entries") or hint
            raise Failure(learner_error(exc, tried=tried, expected=expected, **hint)) from None
        out = as_tensor(result, tried=tried)
        expect_floating(out, x.dtype, tried=tried, what=what)
        a, r = (2e-3, 1e-2) if x.dtype in _HALF else (atol, 1e-4)
        expected_out = oracle(*case)
        if not kit.agrees(out, expected_out, atol=a, rtol=r) and not suspects.suspects(out, case, expected_out):
            kit.what_is_off(out, expected_out, tried=tried, what=what, reduced=dim(case) if reduced else None, atol=a,
                            rtol=r, fix=shape_fix, explain=lambda o, case=case: explain(o, case, passed, tried),
                            along="the axis `dim`")
        suspects.expect(out, expected_out, case, tried=tried, again=run.tensor, what=what, atol=a, rtol=r,
                        fix=shape_fix if out.shape != expected_out.shape else "")
        passed.append(case)
    kit.expect_unchanged(fn, cases[0], call=call(cases[0]), name="x", shown=describe_input(cases[0][0]),
                         numpy=run.mode == "numpy")
    return run


# ============================================================================ the cases
def _cases(seed: int, *extra: tuple) -> list[tuple]:
    """(scores, dim) pairs: ordinary ones first (structure mistakes show on clean data), then the edges (and
    ``extra``), then scores with dim left at its default."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, dtype=torch.float32, scale=2.0):
        return scale * torch.randn(*shape, generator=g, dtype=dtype)

    f64, t = torch.float64, torch.tensor
    return [
        (rand(3, 5), -1), (rand(4, 3), 0), (rand(2, 3, 4, dtype=f64), 1),
        (rand(4, 4, dtype=f64), -1),  # square: a keepdim slip broadcasts instead of failing
        (rand(6), 0), (rand(2, 1, 5, dtype=f64), -1),  # a size-1 axis besides the reduced one
        (rand(2, 3, 1, 4), -3),  # 4-D, a negative axis other than -1
        (rand(4, 1, dtype=f64), -1), (rand(3, 7, dtype=f64, scale=3.0), -1),  # one key per row
        (t([[50.0, 48.0, 49.0], [-3.0, 0.0, 1.0]]), -1),  # e^x finite in float32, e^(x + max) is not
        (t([[1000.0, 1001.0, 1002.0], [2.0, 1.0, 0.0]]), -1),  # maxima at the end and at the start, far apart
        (t([[-1000.0, -999.0, -998.0], [0.0, 1.0, 2.0]], dtype=f64), -1),
        (t([[1000.0, -1001.0], [1002.0, -1000.0], [1001.0, -999.0]], dtype=f64), 0),  # maxima in the middle, at the end
        (t([[0.0, -1000.0, 5.0], [3.0, 2.0, -200.0]]), -1),  # a wide spread: a shift by the minimum or mean overflows
        (t([[-300.0, 0.0, 2.0], [1.0, 200.0, 3.0]]), -1),  # the maximum in the middle: any other shift overflows
        (t([[0.0, -INF, 1.0], [2.0, 2.0, -INF], [-INF, -INF, 5.0]]), -1),  # masked scores; one key left in a row
        (t([[-INF, -20000.0, -19999.0], [-INF, 3.0, -INF]], dtype=f64), -1),  # a finite fill for -inf outweighs these
        (t([[[1000.0, 1001.0, 1002.0], [0.0, 1.0, 2.0]], [[-1000.0, -998.0, -999.0], [5.0, 4.0, 3.0]]]), -1),
        (t([[10.0, 11.0, 12.0], [30.0, 28.0, 20.0]], dtype=torch.float16), -1), *extra,
        (2 * torch.randn(3, 4, generator=torch.Generator().manual_seed(11 * seed)),),
    ]


def _axis(o: int, dim: int | None, x: torch.Tensor) -> bool:
    """Whether axis ``o`` is another axis than ``dim`` (given, not left at its default) of ``x``."""
    return dim is not None and o < x.ndim and o != dim % x.ndim


def _default(key: str, text: str, op: Callable) -> list[kit.Known]:
    """The mistake "the default dim is not -1", for each axis a default could name instead."""
    return [kit.Known(f"{key}-default-{o}", "default dim is not -1", f"with dim left out, you {text} along axis {o}",
                      "keep the default dim=-1 (the last axis)",
                      lambda x, dim=None, o=o: op(x, o) if dim is None and o < x.ndim - 1 else None) for o in range(3)]


# ============================================================================ stable_softmax: its mistakes
# Shorthands for the tables: e normalised along dim; the same with the denominator kept from 0 (an epsilon, a clamp:
# 0/0 gives 0); e^(x − max) along dim.
_norm = lambda e, dim: e / e.sum(dim, keepdim=True)  # noqa: E731
_eps = lambda e, dim: e / e.sum(dim, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)  # noqa: E731
_e = lambda x, dim: torch.exp(x - x.amax(dim, keepdim=True))  # noqa: E731
_NAIVE = ("maximum not subtracted", "you exponentiated the scores as they are: e^x overflows to inf for scores near "
          "1000 (and underflows to 0 near -1000), and inf/inf or 0/0 is NaN", _SHIFT_FIX)
_WHOLE = ("maximum taken over the whole tensor", "you subtracted the maximum of the whole tensor, not of each slice: a "
          "slice whose scores lie far below that maximum underflows to 0 (0/0 = NaN, or zeros behind an epsilon)",
          _SHIFT_FIX)
_AXIS_FIX = "use `dim` in both the maximum and the sum: x.amax(dim, keepdim=True), e.sum(dim, keepdim=True)"
_SUM_FIX = "divide by the sum along dim: e / e.sum(dim, keepdim=True)"
_KEEPDIM = ("keepdim missing", "you reduced without keepdim=True, so the result broadcast against the wrong axis of x "
            "(each slice got another slice's value)", "keep the reduced axis: x.amax(dim, keepdim=True) and "
            "e.sum(dim, keepdim=True)")
K = _Known
SOFTMAX = [
    K("naive", *_NAIVE, lambda x, dim=-1: _norm(torch.exp(x), dim)),
    K("naive-eps", *_NAIVE, lambda x, dim=-1: _eps(torch.exp(x), dim)),
    K("whole-max", *_WHOLE, lambda x, dim=-1: _norm(torch.exp(x - x.max()), dim)),
    K("whole-max-eps", *_WHOLE, lambda x, dim=-1: _eps(torch.exp(x - x.max()), dim)),
    K("min", "minimum subtracted instead of the maximum", "you subtracted each slice's minimum: the largest score minus "
      "the smallest can exceed what e^x can hold, so e^x overflows", _SHIFT_FIX,
      lambda x, dim=-1: _norm(torch.exp(x - x.amin(dim, keepdim=True)), dim)),
    K("max-added", "maximum added instead of subtracted", "you exponentiated x + max where the shift is x − max: the "
      "largest score doubles, so e^(x + max) overflows as soon as 2·max passes e^x's range", _SHIFT_FIX,
      lambda x, dim=-1: _norm(torch.exp(x + x.amax(dim, keepdim=True)), dim)),
    K("mean-shift", "mean subtracted instead of the maximum", "you subtracted each slice's mean: a score far above the "
      "mean still overflows e^x (only the maximum guarantees every exponent ≤ 0)", _SHIFT_FIX,
      lambda x, dim=-1: _norm(torch.exp(x - x.mean(dim, keepdim=True)), dim)),
    K("whole-sum", "divided by the sum of the whole tensor", "you divided by the sum of e^(x − max) over every entry of "
      "the tensor, not over each slice along dim", _SUM_FIX, lambda x, dim=-1: _e(x, dim) / _e(x, dim).sum()),
    K("mean-sum", "divided by the mean, not the sum", "you divided e^(x − max) by its mean along dim where softmax "
      "divides by its sum, so every weight is n times too large (n = the slice's length)", _SUM_FIX,
      lambda x, dim=-1: _e(x, dim) / _e(x, dim).mean(dim, keepdim=True)),
] + [row for o in range(4) for row in (
    K(f"axis-{o}", f"softmax along axis {o}, not dim={{dim}}", f"you normalised along axis {o}, so the slices along "
      f"axis {o} sum to 1, not those along dim={{dim}}", _AXIS_FIX,
      lambda x, dim=None, o=o: torch.softmax(x, o) if _axis(o, dim, x) else None),
    K(f"max-axis-{o}", "maximum taken along the wrong axis", f"you took the maximum along axis {o}, not along "
      "dim={dim}: that shift changes from entry to entry of a slice, so it does not cancel", _AXIS_FIX,
      lambda x, dim=None, o=o: _norm(torch.exp(x - x.amax(o, keepdim=True)), dim) if _axis(o, dim, x) else None),
    K(f"sum-axis-{o}", "sum taken along the wrong axis",
      f"you divided by the sum along axis {o}, not along dim={{dim}}", _AXIS_FIX,
      lambda x, dim=None, o=o: _e(x, dim) / _e(x, dim).sum(o, keepdim=True) if _axis(o, dim, x) else None))
] + [
    K("keepdim-max", *_KEEPDIM, lambda x, dim=-1: _norm(torch.exp(x - x.amax(dim)), dim)),
    K("keepdim-sum", *_KEEPDIM, lambda x, dim=-1: _e(x, dim) / _e(x, dim).sum(dim)),
    K("keepdim-both", *_KEEPDIM, lambda x, dim=-1: torch.exp(x - x.amax(dim)) / torch.exp(x - x.amax(dim)).sum(dim)),
    K("flat", "softmax over the whole tensor", "you took one softmax over every entry of the tensor", _AXIS_FIX,
      lambda x, dim=-1: torch.softmax(x.flatten(), 0).reshape(x.shape)),
    K("no-exp", "no exponential", "you divided the scores by their sum without exponentiating: weights can be negative "
      "or explode", "exponentiate first: e^(x - max) / Σ e^(x - max)", lambda x, dim=-1: _norm(x, dim)),
    K("unnormalised", "not normalised", "you returned e^(x - max) without dividing by the sum", _SUM_FIX,
      lambda x, dim=-1: _e(x, dim)),
    K("log-softmax", "log-softmax returned", "you returned x - logsumexp(x), the log of the weights",
      "return the weights themselves: exp of that, or e / e.sum(dim, keepdim=True)",
      lambda x, dim=-1: torch.log_softmax(x, dim)),
    K("sign", "sign flipped", "you exponentiated -x, so the smallest score gets the largest weight",
      "exponentiate x - max, not max - x", lambda x, dim=-1: torch.softmax(-x, dim)),
    K("times-sum", "multiplied by the sum", "you multiplied e^(x − max) by its sum where softmax divides by it",
      "divide: e / e.sum(dim, keepdim=True)", lambda x, dim=-1: _e(x, dim) * _e(x, dim).sum(dim, keepdim=True)),
    K("exp-missing", "exponential missing", "you normalised x − max without exponentiating it",
      "exponentiate before normalising: e = exp(x - max)", lambda x, dim=-1: _norm(x - x.amax(dim, keepdim=True), dim)),
    K("log-for-exp", "log instead of exp", "you took the log of x − max where softmax exponentiates it",
      "e = torch.exp(x - max), then e / e.sum(dim, keepdim=True)",
      lambda x, dim=-1: _norm(torch.log(x - x.amax(dim, keepdim=True)), dim)),
    K("argmax", "arg-max instead of softmax", "you put all the weight on the largest score (a one-hot of the arg-max): "
      "that is softmax's limit as the temperature goes to 0, not softmax", "weights = e / e.sum(dim, keepdim=True) with "
      "e = exp(x - max)", lambda x, dim=-1: (x == x.amax(dim, keepdim=True)).to(x.dtype)),
]


# ============================================================================ what is measurably wrong with weights
def _epsilon(o: torch.Tensor, xs: torch.Tensor, d: int, *, tried: str, what: str) -> None:
    """Fail when every slice of ``o`` is the softmax times S / (S + ε) for one small ε > 0, S being the slice's sum
    of e^(x − max) (or of e^x): an epsilon added to the denominator."""
    expected = torch.softmax(xs, d)
    if not (torch.isfinite(o).all() and torch.isfinite(xs).all()) or bool((expected <= 0).any()):
        return
    ratio = o / expected
    c = ratio.mean(d, keepdim=True)  # one factor per slice
    if not torch.allclose(ratio, c.expand_as(ratio), rtol=1e-6, atol=0) or not bool((c < 1 - 1e-7).all()):
        return
    for shifted in (True, False):
        eps = torch.exp(xs - xs.amax(d, keepdim=True) if shifted else xs).sum(d, keepdim=True) * (1 / c - 1)
        if bool(torch.isfinite(eps).all()) and float(eps.max() - eps.min()) <= 1e-2 * float(eps.max()):
            e = float(eps.mean())
            fail("epsilon in the denominator", tried=tried, expected="e / S exactly",
                 got=f"{what}: every slice is the softmax times S / (S + {e:.2g}), S being the slice's sum of "
                     f"{'e^(x − max)' if shifted else 'e^x'}",
                 fix="divide by the sum itself: e / e.sum(dim, keepdim=True)",
                 cause=f"you divided by the sum plus {e:.2g}" + (
                     ": with the maximum subtracted the sum is at least 1, so no epsilon is needed" if shifted else ""))


def _temperature_of(w: torch.Tensor, x: torch.Tensor, d: int) -> float | None:
    """If every slice of ``w`` is softmax(x / T') for one T' (fitted from log w against x), that T'."""
    w, x = w.double(), x.double()
    if not ((w > 1e-200) & torch.isfinite(x)).all() or x.shape[d] < 2:
        return None
    lw, xc = torch.log(w), x - x.mean(d, keepdim=True)
    lw = lw - lw.mean(d, keepdim=True)
    if (xc * xc).sum() < 1e-12:
        return None
    slope = float((lw * xc).sum() / (xc * xc).sum())
    return None if abs(slope) < 1e-9 or not torch.allclose(lw, slope * xc, atol=1e-4, rtol=1e-4) else 1.0 / slope


def _tie(o: torch.Tensor, expected: torch.Tensor, d: int) -> str:
    """Where two entries of one slice are equal in ``o`` but clearly different in ``expected``: a description."""
    a, e = o.movedim(d, -1).reshape(-1, o.shape[d]), expected.movedim(d, -1).reshape(-1, o.shape[d])
    for row in range(a.shape[0]):
        same_o = (a[row, :, None] - a[row, None, :]).abs() <= 1e-12 * a[row].abs().max().clamp(min=1e-300)
        hit = (same_o & ((e[row, :, None] - e[row, None, :]).abs() > 1e-3 * e[row].abs().max())).nonzero()
        if hit.numel():
            i, j = (int(v) for v in hit[0])
            return f"entries {i} and {j} of a slice both get {fmt(float(a[row, i]))}"
    return ""


def explain_weights(out: torch.Tensor, x: torch.Tensor, dim: int, *, tried: str, what: str = "your weights",
                    temperature: float = 1.0, known: dict[str, float] | None = None, normalise_fix: str = "") -> None:
    """Fail with what is measurably wrong with softmax-like weights ``out`` of scores ``x`` along ``dim`` (at
    ``temperature``): NaN or inf and where they come from, weight on -inf scores, an epsilon in the denominator,
    slices of zeros, equal weights for different scores, negative weights, slices that do not sum to 1 (or do along
    another axis), or weights of another temperature (``known`` names the temperatures the mistakes still possible
    would give; at T = 1 by default a sign slip). ``normalise_fix``: the advice for slices that do not sum to 1.
    Returns when it finds nothing."""
    d = dim % x.ndim
    o, xs, dtype = out.detach().double(), x.detach().double() / temperature, x.dtype
    if (bad := ~torch.isfinite(o)).any():
        kinds = kit.nan_or_inf(o)
        kit.explain_nonfinite(bad.any(d, keepdim=True).expand_as(xs), xs, dtype, tried=tried, kinds=kinds,
                              got=f"{what} hold {kinds} in {int(bad.sum())} of {o.numel()} entries",
                              expected="finite weights", scaled="x / T" if temperature != 1.0 else "x")
    if (masked := torch.isneginf(xs) & (o.abs() > 1e-12)).any():
        fail("weight on -inf scores", tried=tried, expected="weight 0 wherever the score is -inf (e^-inf = 0)",
             got=f"{int(masked.sum())} entries whose score is -inf get weight "
                 f"(up to {fmt(float(o[masked].abs().max()))})",
             cause="your code changes -inf scores into finite numbers before the exponential",
             fix="leave -inf scores as they are: exp(-inf - max) is 0, which is the weight they need")
    _epsilon(o, xs, d, tried=tried, what=what)
    sums, weights_fix = o.sum(d), "weights = e / e.sum(dim, keepdim=True) with e = exp(x - max)"
    if (zero := sums.abs() < 1e-12).any():
        # What made a slice all 0 shows in its scores: beyond e^z's range (an overflow whose NaN was turned into 0),
        # or far below the tensor's largest score (shifted by that, every e^z is tiny or 0).
        top, hi, cause = xs.masked_fill(torch.isnan(xs), -math.inf), kit.exp_limits(dtype)[0], ""
        if bool(((slice_top := top.amax(d)[zero]) > hi).all()):
            cause = (f"those slices hold scores above {hi:.2f}, where e^z overflows to inf in "
                     f"{str(dtype).replace('torch.', '')}: inf/inf is NaN, and something (nan_to_num, a where) turned "
                     "it into 0; you exponentiated without subtracting the slice's own maximum")
        elif (gap := float((top.amax() - slice_top).min())) > 20:
            cause = (f"those slices' scores lie {fmt(gap)} or more below the tensor's largest score: with the maximum "
                     "taken over the whole tensor, not per slice, their e^z are tiny or underflow to 0, and an epsilon "
                     "or a clamp in the denominator hid the 0/0")
        fail("slices of zeros", tried=tried, got=f"{int(zero.sum())} slice(s) along dim={dim} are all 0",
             expected="every slice along dim summing to 1", cause=cause, fix=_SHIFT_FIX if cause else weights_fix)
    if ties := _tie(o, torch.softmax(xs, d), d):
        fail("different scores, equal weights", tried=tried, expected="a larger weight for every larger score",
             got=f"{what} give equal weights to scores that differ ({ties})",
             cause="your code maps different scores to the same value before the exponential (a clamp, for example)",
             fix="exponentiate x - max exactly: no clamp is needed once the maximum is subtracted")
    if (o < -1e-12).any():
        fail("negative weights", tried=tried, got=f"{int((o < -1e-12).sum())} negative entries, down to "
             f"{fmt(float(o.min()))}", expected="weights ≥ 0 (e^z / Σ e^z is never negative)", fix=weights_fix,
             cause="a step that does not exponentiate, or subtracts after exponentiating")
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-3):
        span = f"{fmt(float(sums.min()))} … {fmt(float(sums.max()))}"
        expected = f"every slice along dim={dim} summing to 1"
        for other in (o_ for o_ in range(x.ndim) if o_ != d):
            if torch.allclose(o.sum(other), torch.ones_like(o.sum(other)), atol=1e-4):
                fail(f"normalised along axis {other}, not dim={dim}", tried=tried, expected=expected,
                     got=f"slices along axis {other} sum to 1; along dim={dim} they sum to {span}",
                     cause=f"you divided by a sum along axis {other}", fix="use `dim` in both the maximum and the sum")
        fail("slices do not sum to 1", tried=tried, got=f"{what}: slices along dim={dim} sum to {span}",
             expected=expected,
             fix=normalise_fix or "divide e = exp(x - max) by its sum along dim: e / e.sum(dim, keepdim=True)")
    t_eff, t = _temperature_of(o, x.detach().double(), d), temperature
    if t_eff is not None and abs(t_eff - t) > 1e-3 * max(1.0, t):
        names = {"-1 (a sign slip)": -1.0} if known is None else known
        named = next((n for n, v in names.items() if abs(t_eff - v) <= 1e-3 * max(1.0, abs(v))), "")
        fail(f"weights of temperature {fmt(t_eff)}, not {fmt(t)}", tried=tried, expected=f"softmax(x / {fmt(t)})",
             got=f"{what} equal softmax(x / {fmt(t_eff)})", cause=f"your weights are those of temperature {named}" if
             named else f"your scores end up divided by {fmt(t_eff)} before the softmax",
             fix="divide the scores by the temperature exactly once, then take the stable softmax" if t != 1.0 else
             "exponentiate x - max, unscaled")


# ============================================================================ stable_softmax
@check("stable_softmax", expects="a function stable_softmax(x, dim=-1) returning weights shaped like x")
def check_stable_softmax(fn: Learner) -> str:
    cases = _cases(3)
    run = _judge_cases(fn, cases, signature="stable_softmax(x, dim=-1)", what="your weights",
                       oracle=lambda x, dim=-1: torch.softmax(x.double(), dim), expected="weights shaped like x",
                       table=_default("sm", "normalised", torch.softmax) + SOFTMAX,
                       explain=lambda o, case, passed, tried: explain_weights(o, case[0], _dim(case), tried=tried),
                       shape_fix="the weights have the shape of x: keep the reduced axis with keepdim=True before "
                                 "dividing")
    return (f"matches torch.softmax on {len(cases)} cases ({run.kind}): any axis, 1-D to 4-D, float16/32/64, "
            "stable at ±1000, -inf entries")


# ============================================================================ logsumexp: its mistakes
_LSE = "logsumexp(x) = m + log Σ e^(x − m), m = x.amax(dim, keepdim=True)"
_NO_EXP = ("exponential missing", "you summed x − m (or its log) where logsumexp sums e^(x − m): those terms are ≤ 0, "
           "so the log of their sum is NaN", _LSE)
_LOG_BASE = ("log base 2 or 10", "you used log2 or log10 where logsumexp uses the natural log", "use torch.log (ln)")
_m = lambda x, dim: x.amax(dim, keepdim=True)  # noqa: E731 - the maximum m of each slice, kept
_s = lambda z, dim: torch.exp(z).sum(dim, keepdim=True)  # noqa: E731 - Σ e^z along dim, kept

#: Wrong versions of logsumexp with the reduced axis kept, (key, summary, cause, fix, value(x, dim)): the logsumexp
#: check squeezes them, the log_softmax check subtracts them from x.
SLIPS = [
    ("naive", "maximum not subtracted", "you computed log Σ e^x directly: e^x overflows to inf near 1000, and near "
     "-1000 the sum underflows to 0 and log 0 = -inf", _LSE, lambda x, d: torch.log(_s(x, d))),
    ("no-add-back", "maximum not added back", "you subtracted the maximum inside the log but did not add it back: "
     "every slice is off by its maximum", _LSE, lambda x, d: torch.log(_s(x - _m(x, d), d))),
    ("whole-max", "maximum taken over the whole tensor", "you shifted by the maximum of the whole tensor: a slice far "
     "below it underflows to log 0 = -inf", _LSE, lambda x, d: x.max() + torch.log(_s(x - x.max(), d))),
    ("lse-log-subtracted", "log term subtracted", "you subtracted log Σ e^(x − m) from m; logsumexp adds it", _LSE,
     lambda x, d: _m(x, d) - torch.log(_s(x - _m(x, d), d))),
    ("lse-no-log", "log missing", "you added Σ e^(x − m) itself to m, without its log", _LSE,
     lambda x, d: _m(x, d) + _s(x - _m(x, d), d)),
    ("lse-exp-for-log", "exp where the log belongs", "you applied exp to Σ e^(x − m) where logsumexp takes its log",
     _LSE, lambda x, d: _m(x, d) + torch.exp(_s(x - _m(x, d), d))),
    ("lse-no-exp", *_NO_EXP, lambda x, d: _m(x, d) + torch.log((x - _m(x, d)).sum(d, keepdim=True))),
    ("lse-log-no-exp", *_NO_EXP, lambda x, d: _m(x, d) + torch.log(torch.log(x - _m(x, d)).sum(d, keepdim=True))),
    ("lse-exp-of-m", "exponential of the maximum, not of x − m", "you exponentiated m, the slice's maximum, where "
     "logsumexp exponentiates x − m: the scores drop out, the sum is the single term e^m, and each slice gives 2m",
     _LSE, lambda x, d: _m(x, d) + torch.log(_s(_m(x, d), d))),
    ("lse-max-added", "maximum added inside the exponential", "you exponentiated x + m where it must be x − m", _LSE,
     lambda x, d: _m(x, d) + torch.log(_s(x + _m(x, d), d))),
    ("lse-outside", "maximum subtracted only outside", "you exponentiated x itself and added m outside: the shift must "
     "happen inside the exponential too", _LSE, lambda x, d: _m(x, d) + torch.log(_s(x, d))),
    ("lse-mean", "mean instead of sum", "you took the log of the mean of e^(x − m), not of the sum: that is logsumexp "
     "minus log n", "sum the exponentials: .sum(dim), not .mean(dim)",
     lambda x, d: _m(x, d) + torch.log(torch.exp(x - _m(x, d)).mean(d, keepdim=True))),
    ("lse-log2", *_LOG_BASE, lambda x, d: _m(x, d) + torch.log2(_s(x - _m(x, d), d))),
    ("lse-log10", *_LOG_BASE, lambda x, d: _m(x, d) + torch.log10(_s(x - _m(x, d), d))),
    ("lse-log1p", "log1p for log", "you took log1p of the sum, log(1 + Σ e^(x − m)), where logsumexp takes "
     "log Σ e^(x − m)", "use torch.log: log1p(y) is log(1 + y), another function",
     lambda x, d: _m(x, d) + torch.log1p(_s(x - _m(x, d), d))),
] + [row for o in range(4) for row in (
    (f"lse-sum-axis-{o}", "sum taken along the wrong axis", f"you summed e^(x − m) along axis {o}, not along dim", _LSE,
     lambda x, d, o=o: _m(x, d) + torch.log(torch.exp(x - _m(x, d)).sum(o, keepdim=True)) if _axis(o, d, x) else None),
    (f"lse-max-axis-{o}", "maximum taken along the wrong axis", f"you took the maximum along axis {o}, not along dim: m "
     "must be one number per slice along dim", _LSE,
     lambda x, d, o=o: _m(x, o) + torch.log(_s(x - _m(x, o), d)) if _axis(o, d, x) else None))]

LOGSUMEXP = [
    K("max-only", "maximum only", "you returned the maximum of each slice, without the log Σ e^(x − m) term",
      "add log Σ e^(x − m)", lambda x, dim=-1: x.amax(dim)),
    K("max-subtracted", "maximum subtracted outside the log", "you subtracted the maximum outside the log where it must "
      "be added: logsumexp(x) = m + log Σ e^(x − m)", "add m: m + log Σ e^(x − m)",
      lambda x, dim=-1: torch.log(torch.exp(x - _m(x, dim)).sum(dim)) - x.amax(dim)),
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
      lambda x, dim=-1: _m(x, dim).squeeze() + torch.log(torch.exp(x - _m(x, dim)).sum(dim))),
] + [K(f"axis-{o}", f"reduced along axis {o}, not along dim", f"you reduced along axis {o}",
       "reduce along `dim` in the maximum and in the sum",
       lambda x, dim=None, o=o: torch.logsumexp(x, o) if _axis(o, dim, x) else None) for o in range(4)
     ] + [K(key, s, c, f, lambda x, dim=-1, v=v: v(x, dim).squeeze(dim)) for key, s, c, f, v in SLIPS] + [
    K("squeeze-last", "squeezed the wrong axis", "you removed the last axis, not the reduced axis `dim`",
      "squeeze the axis you reduced: .squeeze(dim)", lambda x, dim=-1: None if x.ndim < 2 or dim % x.ndim == x.ndim - 1
      else torch.logsumexp(x, dim, keepdim=True).squeeze(-1)),
    K("keepdim-sum", "keepdim missing on the sum", "you summed without keepdim=True and added the kept maximum, so the two "
      "broadcast into a matrix", "keep both axes (keepdim=True), squeeze once at the end",
      lambda x, dim=-1: (_m(x, dim) + torch.log(torch.exp(x - _m(x, dim)).sum(dim))).squeeze(dim)),
]


def _explain_lse(out: torch.Tensor, case: tuple, passed: list, tried: str) -> None:
    x, d = case[0], _dim(case)
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
    cases = _cases(4)
    run = _judge_cases(fn, cases, signature="logsumexp(x, dim=-1)", expected="log Σ e^x along dim, dim removed",
                       oracle=lambda x, dim=-1: torch.logsumexp(x.double(), dim), atol=1e-4, reduced=False,
                       table=_default("lse", "reduced", torch.logsumexp) + LOGSUMEXP, explain=_explain_lse,
                       shape_fix="the result has the shape of x with `dim` removed, like torch.logsumexp(x, dim)")
    return f"matches torch.logsumexp on {len(cases)} cases ({run.kind}): any axis, 1-D to 4-D, finite at ±1000"


# ============================================================================ log_softmax: its mistakes
_LOG_OF = ("log of the softmax", "you took the log of the weights: a weight that underflowed to 0 gives log 0 = -inf, "
           "although its true log-probability is an ordinary number", "compute x − logsumexp(x) along dim, never "
           "log(softmax(x))")
_LS_FIX = "x − (m + log Σ e^(x − m)) with m = x.amax(dim, keepdim=True)"
_RETURN = "return x − logsumexp(x)"
_LN = "compute x − logsumexp(x) (natural log throughout)"
LOG_SOFTMAX = [
    K("log-of", *_LOG_OF, lambda x, dim=-1: torch.log(torch.softmax(x, dim))),
    K("log-of-e", *_LOG_OF, lambda x, dim=-1: torch.log(_e(x, dim) / _e(x, dim).sum(dim, keepdim=True))),
    K("naive-log-of", "maximum not subtracted", "you took the log of a softmax computed without subtracting the maximum",
      _LS_FIX, lambda x, dim=-1: torch.log(torch.exp(x) / _s(x, dim))),
    K("keepdim", "keepdim missing", "you reduced without keepdim=True, so logsumexp broadcast against the wrong axis (each "
      "slice got another slice's normaliser)", "keep the axis: logsumexp with keepdim=True",
      lambda x, dim=-1: x - torch.logsumexp(x, dim)),
    K("softmax", "softmax returned", "you returned the weights, not their log", _RETURN,
      lambda x, dim=-1: torch.softmax(x, dim)),
    K("sign", "sign flipped", "you returned logsumexp(x) − x, the negative log-probabilities", _RETURN,
      lambda x, dim=-1: torch.logsumexp(x, dim, keepdim=True) - x),
    K("minus-max", "maximum subtracted instead of logsumexp", "you returned x − max, which is not normalised: exp of it "
      "does not sum to 1", "subtract logsumexp(x), not only the maximum", lambda x, dim=-1: x - _m(x, dim)),
    K("log10", "log base 10", "you took log10 of the weights; log-probabilities use the natural log", _LN,
      lambda x, dim=-1: torch.log10(torch.softmax(x, dim))),
    K("log2", "log base 2", "you took log2 of the weights; log-probabilities use the natural log", _LN,
      lambda x, dim=-1: torch.log2(torch.softmax(x, dim))),
] + [K(f"axis-{o}", f"log-softmax along axis {o}", f"you normalised along axis {o}, not along dim",
       "use `dim` in the maximum and the sum",
       lambda x, dim=None, o=o: torch.log_softmax(x, o) if _axis(o, dim, x) else None)
     for o in range(4)] + [K(key, s, "in logsumexp, " + c, f, lambda x, dim=-1, v=v: x - v(x, dim))
                           for key, s, c, f, v in SLIPS] + [
    K("lse-added", "logsumexp added", "you returned x + logsumexp(x); log-softmax subtracts it", _RETURN,
      lambda x, dim=-1: x + torch.logsumexp(x, dim, keepdim=True)),
    K("unchanged", "scores returned unchanged", "you returned x without subtracting logsumexp(x)", _RETURN,
      lambda x, dim=-1: x.clone()),
]


def _explain_log_softmax(out: torch.Tensor, case: tuple, passed: list, tried: str) -> None:
    x, d = case[0], _dim(case)
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
    cases = _cases(5, (torch.tensor([[0.0, -1000.0, 5.0], [-2000.0, 2.0, 1.0]], dtype=torch.float64), -1))  # −1005
    run = _judge_cases(fn, cases, signature="log_softmax(x, dim=-1)", expected="log-probabilities shaped like x",
                       oracle=lambda x, dim=-1: torch.log_softmax(x.double(), dim), atol=1e-4,
                       table=_default("ls", "normalised", torch.log_softmax) + LOG_SOFTMAX, explain=_explain_log_softmax,
                       shape_fix="log-probabilities have the shape of x: subtract logsumexp computed with keepdim=True")
    lowest = min(float(torch.log_softmax(c[0].double(), _dim(c)).nan_to_num(neginf=0.0).min()) for c in cases)
    return (f"matches torch.log_softmax on {len(cases)} cases ({run.kind}): any axis, float16/32/64, finite for "
            f"log-probabilities down to {lowest:.0f}".replace("to -", "to −"))


# ============================================================================ softmax_temperature
def _temperature_cases() -> list[tuple[torch.Tensor, float]]:
    g = torch.Generator().manual_seed(6)
    x, t = 2 * torch.randn(3, 6, generator=g), torch.tensor
    return [
        (x, 0.5), (x, 2.0), (x, 1.0),  # the same scores at other temperatures: an ignored temperature shows at once
        (torch.randn(2, 2, 5, generator=g, dtype=torch.float64), 3.0), (torch.randn(7, generator=g), 0.25),
        (torch.randn(4, 1, generator=g), 0.7), (torch.randn(1, 5, generator=g, dtype=torch.float64), 10.0),
        (2 * torch.randn(4, 4, generator=g), 1.5),  # square: a keepdim slip broadcasts instead of failing
        (t([[50.0, 48.0, 49.0], [-3.0, 0.0, 1.0]]), 1.0),  # e^x finite in float32, e^(x + max) not
        (t([[1000.0, 1001.0, 1002.0], [2.0, 1.0, 0.0]]), 1.0),
        (t([[-1000.0, -998.0, -999.0], [0.0, 1.0, 2.0]], dtype=torch.float64), 0.5),
        (t([[3.0, 1.0, -2.0, 2.9], [0.5, 0.4, 0.3, 0.2]]), 0.01),  # x / T reaches 300
        (t([[0.0, -INF, 1.0], [-INF, 2.0, 2.0]]), 0.3),
        (3 * torch.randn(3, 5, generator=g, dtype=torch.float64), 100.0),
        (t([[1.0, 2.0, 3.0], [6.0, 4.0, 5.0]], dtype=torch.float16), 0.5),
    ]


_AFTER = ("temperature applied after the softmax", "divide the scores by T first, then take the softmax")
TEMPERATURE = [
    K("multiplied", "temperature multiplied", "you multiplied the scores by T; softmax(x / T) divides them, so a high T "
      "flattens the weights and a low T sharpens them", "divide: softmax(x / temperature)",
      lambda x, t: torch.softmax(x * t, -1)),
    K("ignored", "temperature ignored", "the temperature has no effect on your weights", "divide the scores by the "
      "temperature before the softmax", lambda x, t: None if t == 1.0 else torch.softmax(x, -1)),
    K("after", _AFTER[0], "you applied the temperature to the weights, after the softmax", _AFTER[1],
      lambda x, t: torch.softmax(x, -1) / t),
    K("power", _AFTER[0], "you raised the weights to the power 1/T without normalising again", _AFTER[1],
      lambda x, t: torch.softmax(x, -1) ** (1 / t)),
    K("twice", "temperature applied twice", "you divided by T twice (x / T²)", "divide once: x / temperature",
      lambda x, t: torch.softmax(x / t ** 2, -1)),
    K("sqrt", "divided by √T", "you divided by √T, not by T", "divide by the temperature itself",
      lambda x, t: torch.softmax(x / math.sqrt(t), -1)),
    K("numerator", "temperature only in the numerator", "you divided only the exponent of the numerator by T, so the "
      "weights no longer sum to 1", "compute z = x / T once and take the softmax of z",
      lambda x, t: _e(x / t, -1) / _e(x, -1).sum(-1, keepdim=True)),
    K("power-renormalised", "weights raised to 1/T and renormalised", "you raised softmax(x) to the power 1/T and "
      "normalised again: equal on paper, but for a small T the powers underflow to 0 (0/0 = NaN)",
      "divide the scores by T first, then take the stable softmax",
      lambda x, t: _norm(torch.softmax(x, -1) ** (1 / t), -1)),
] + [K(k.key, k.summary.replace("{dim}", "-1"), k.cause.replace("{dim}", "-1"), k.fix,
       lambda x, t, k=k: k.make(x / t, -1)) for k in SOFTMAX]  # and every softmax mistake, on x / T


def _explain_temperature(out: torch.Tensor, case: tuple, passed: list, tried: str) -> None:
    # The temperatures a wrong answer could be using that the cases it passed leave possible: a whole number made of
    # T, a fixed value seen before; 1/T, 1, T², √T and -T only while every case passed had T = 1.
    x, t = case
    known: dict[str, float] = {}
    if float(int(t)) != t and int(t) != 0:
        known[f"{int(t)}: you cut the temperature to a whole number (int)"] = float(int(t))
    if float(round(t)) != t and round(t) != 0:
        known[f"{round(t)}: you rounded the temperature to a whole number"] = float(round(t))
    known.update({f"{p:g}, the temperature of an earlier case: your function does not use the temperature it is given": p
                  for _, p in passed if p != t})
    if all(p == 1.0 for _, p in passed):
        known.update({"1/T (you multiplied by T)": 1 / t, "1 (the temperature is not used)": 1.0,
                      "T² (you divided by T twice)": t * t, "√T": math.sqrt(t), "-T (a sign slip)": -t})
    explain_weights(out, x, -1, tried=tried, temperature=t, known=known)


@check("softmax_temperature", expects="a function softmax_temperature(x, temperature) returning weights shaped like x")
def check_softmax_temperature(fn: Learner) -> str:
    cases = _temperature_cases()
    run = _judge_cases(fn, cases, signature="softmax_temperature(x, temperature)", what="your weights",
                       oracle=lambda x, t: torch.softmax(x.double() / t, -1), expected="weights shaped like x",
                       table=TEMPERATURE, explain=_explain_temperature, shape_fix="the weights have the shape of x",
                       call=lambda c: f"softmax_temperature(x, {c[1]:g})", dim=lambda c: c[0].ndim - 1)
    temps = sorted({t for _, t in cases})
    return (f"matches torch.softmax(x / T) on {len(cases)} cases, T from {temps[0]:g} to {temps[-1]:g} "
            f"({run.kind}), stable at ±1000")
