"""What every check of notebook 03 shares: one body that judges a learner's function on its cases, the cases, and
what is measurably wrong with softmax-like weights when no known mistake reproduces them."""

from __future__ import annotations

import math
from typing import Callable

import torch

from .. import kit
from ..compare import Failure, same
from ..core import Learner, LearnerRaised, LearnerTimedOut, as_tensor, fail, fmt, learner_error

INF = float("inf")
_HALF = (torch.float16, torch.bfloat16)


def _literal(x: torch.Tensor) -> str:
    if x.ndim == 0:
        return {-INF: "-inf", INF: "inf"}.get(float(x), f"{float(x):g}")
    return "[" + ", ".join(_literal(row) for row in x) + "]"


def describe_input(x: torch.Tensor) -> str:
    """``x of shape (4, 3), float32``, or for a small input of whole numbers (the hand-made edges) its values."""
    dtype, values = str(x.dtype).replace("torch.", ""), x.detach().double()
    finite = values[torch.isfinite(values)]
    if x.numel() <= 12 and x.ndim <= 3 and bool((finite == finite.round()).all()):
        return f"x = {_literal(values)} ({dtype})"
    return f"x of shape {tuple(x.shape)}, {dtype}"


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
K = kit.AlongDim  # a known mistake whose texts may name the case's dim


def case_dim(case: tuple) -> int:
    return (case[1] if len(case) > 1 else -1) % case[0].ndim


def judge_cases(fn: Learner, cases: list[tuple], *, signature: str, oracle: Callable, table: list[kit.Known],
                explain: Callable, expected: str, shape_fix: str, what: str = "your result",
                call: Callable[[tuple], str] | None = None,
                dim: Callable[[tuple], int] = case_dim, reduced: bool = True, atol: float = 1e-5,
                exact: Callable[[torch.Tensor, tuple, str], None] | None = None,
                early: Callable[[torch.Tensor, tuple, str], None] | None = None) -> kit.TensorOrArray:
    """Judge the answer on every case against ``oracle``: shape, dtype, then values (a mistake of ``table`` that
    reproduces them, else ``kit.what_is_off`` and ``explain(out, case, passed, tried)``), then what the docstring
    fixes exactly (``exact(out, case, tried)``, on results right within the tolerance); then the input unchanged.
    ``early(out, case, tried)`` measures a wrong result before the generic measures (a factor, a shift) can."""
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
        if early and x.dtype not in _HALF and out.shape == expected_out.shape and \
                not same(out, expected_out, atol=a, rtol=r) and not suspects.suspects(out, case, expected_out):
            early(out, case, tried)  # wrong, by the comparison below: named before a factor or a shift can be
        if not kit.agrees(out, expected_out, atol=a, rtol=r) and not suspects.suspects(out, case, expected_out):
            if x.dtype == torch.float64 and kit.agrees(out, expected_out, rtol=r,  # right to float32's precision
                                                        atol=1e-5 * max(1.0, float(x.nan_to_num(0, 0, 0).abs().max()))):
                kit.lower_precision(out, x.dtype, tried=tried, what=what)
            kit.what_is_off(out, expected_out, tried=tried, what=what, reduced=dim(case) if reduced else None, atol=a,
                            rtol=r, fix=shape_fix, explain=lambda o, case=case: explain(o, case, passed, tried),
                            along="the axis `dim`")
        suspects.expect(out, expected_out, case, tried=tried, again=run.tensor, what=what, atol=a, rtol=r,
                        fix=shape_fix if out.shape != expected_out.shape else "")
        if exact:
            exact(out, case, tried)
        passed.append(case)
    kit.expect_unchanged(fn, cases[0], call=call(cases[0]), name="x", shown=describe_input(cases[0][0]),
                         numpy=run.mode == "numpy")
    return run


# ============================================================================ the cases
def score_cases(seed: int, *extra: tuple) -> list[tuple]:
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


def default(key: str, text: str, op: Callable) -> list[kit.Known]:
    """The mistake "the default dim is not -1", for each axis a default could name instead."""
    return [kit.Known(f"{key}-default-{o}", "default dim is not -1", f"with dim left out, you {text} along axis {o}",
                      "keep the default dim=-1 (the last axis)",
                      lambda x, dim=None, o=o: op(x, o) if dim is None and o < x.ndim - 1 else None) for o in range(3)]


# ============================================================================ what is measurably wrong with weights
def _epsilon(o: torch.Tensor, xs: torch.Tensor, d: int, *, tried: str, what: str, scores: str = "x",
             overflows: Callable[[], bool] | None = None) -> None:
    """Fail when ``o`` is e / (S + ε) for one ε > 0 in every slice, e being e^(x − max) (or e^x) and S its sum along
    ``d``: an epsilon added to the denominator. Proven only where that fits ``o`` far better than a constant factor
    (one slice, or slices with equal sums, cannot tell the two apart). ``scores``: what x is, in words; ``overflows()``
    whether the answer is not finite for scores near 1000, the proof that e^x itself is computed (e^(x − max)
    with e^(−max)·ε added to its sum gives the same weights, and is stable)."""
    expected = torch.softmax(xs, d)
    if not (torch.isfinite(o).all() and torch.isfinite(xs).all()) or bool((expected <= 0).any()):
        return
    gap = float((o - expected).abs().max())
    c = (o / expected).mean(d, keepdim=True)  # one factor per slice
    if gap == 0 or not bool((c < 1).all()) or float((o - expected * c).abs().max()) > 1e-6 * float(o.abs().max()):
        return
    factor = float((o - expected * c.mean()).abs().max())  # what one constant factor for every slice leaves
    for shifted in (True, False):
        e = torch.exp(xs - xs.amax(d, keepdim=True) if shifted else xs)
        sums = e.sum(d, keepdim=True)
        eps = float((sums * (1 / c - 1)).flatten()[int((1 - c).flatten().argmax())])  # the clearest slice's ε
        if not 0 < eps <= 1:  # an epsilon someone writes; not a shift by another maximum in disguise
            continue
        off = float((o - e / (sums + eps)).abs().max())
        if off <= 0.05 * gap and (off <= 0.05 * factor or shifted and c.numel() > 1 and factor > 0.2 * gap):
            ex = f"e^({scores})" if " " in scores else f"e^{scores}"
            if shifted:
                how = ": with the maximum subtracted the sum is at least 1, so no epsilon is needed"
            elif overflows is not None and overflows():
                how = (f", and the sum is of {ex} with no maximum subtracted: {ex} overflows to inf for scores near "
                       "1000, where an epsilon does not help")
            else:  # the weights alone do not tell which was written
                how = (f", the sum being of {ex}: an epsilon added to that sum, or e^(−max)·{eps:.2g} added to the sum "
                       f"of e^({scores} − max) (what an extra score 0 in every slice gives)")
            fail("epsilon in the denominator", tried=tried, expected="e / S exactly",
                 got=f"{what}: every slice is the softmax times S / (S + {eps:.2g}), S being the slice's sum of "
                     f"{f'e^({scores} − max)' if shifted else ex}",
                 fix="divide by the sum itself: e / e.sum(dim, keepdim=True)" + ("" if shifted else
                     ", with e = exp(x - x.amax(dim, keepdim=True))"),
                 cause=f"you divided by the sum plus {eps:.2g}" + how)


def early_epsilon(out: torch.Tensor, x: torch.Tensor, dim: int, *, tried: str, temperature: float | None = None,
                  overflows: Callable[[], bool] | None = None) -> None:
    """:func:`_epsilon` on a wrong result, before the generic measures name it a factor or a shift (``temperature``:
    the weights are of x / T; ``overflows``: see :func:`_epsilon`)."""
    _epsilon(out.detach().double(), x.detach().double() / (temperature or 1.0), dim % x.ndim, tried=tried,
             what="your weights", scores="x" if temperature is None else "x / T", overflows=overflows)


def overflows_near_1000(run: Callable[..., object], *extra: object) -> Callable[[], bool]:
    """Whether ``run(x, *extra)`` is not finite for scores near 1000 (an exception proves nothing)."""
    def probe() -> bool:
        try:
            out = as_tensor(run(torch.tensor([[1000.0, 1001.0, 1002.0], [2.0, 1.0, 0.0]]), *extra), tried="")
        except (LearnerRaised, LearnerTimedOut, Failure):
            return False
        return out.is_floating_point() and not bool(torch.isfinite(out).all())
    return probe


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
    ``temperature``; ``known`` names the temperatures the mistakes still possible would give); return if nothing."""
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
    _epsilon(o, xs, d, tried=tried, what=what, scores="x" if temperature == 1.0 else "x / T")
    sums = o.sum(d)
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
                     "taken over the whole tensor, not per slice, their e^z are tiny or underflow to 0, so an epsilon "
                     "or a clamp in the denominator outweighs them (or hides the 0/0)")
        fail("slices of zeros", tried=tried, got=f"{int(zero.sum())} slice(s) along dim={dim} summing to less than 10⁻¹² (all ≈ 0)",
             expected="every slice along dim summing to 1", cause=cause,
             fix=kit.SHIFT_FIX if cause else kit.WEIGHTS_FIX)
    if ties := _tie(o, torch.softmax(xs, d), d):
        fail("different scores, equal weights", tried=tried, expected="a larger weight for every larger score",
             got=f"{what} give equal weights to scores that differ ({ties})",
             cause="your code maps different scores to the same value before the exponential (a clamp, for example)",
             fix="exponentiate x - max exactly: no clamp is needed once the maximum is subtracted")
    if (o < -1e-12).any():
        fail("negative weights", tried=tried, got=f"{int((o < -1e-12).sum())} negative entries, down to "
             f"{fmt(float(o.min()))}", expected="weights ≥ 0 (e^z / Σ e^z is never negative)", fix=kit.WEIGHTS_FIX,
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
