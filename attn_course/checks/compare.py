"""The comparison layer every check shares: turn an answer into a tensor, compare it with the oracle,
and, when it differs, say what is wrong in the course's one template (:class:`~.result.Diagnosis`).

Known mistakes are :class:`Mistake` objects: the cause in the second person, the fix, and what a
learner who made that mistake would have returned. A mismatch is blamed on a mistake only when the
answer reproduces that mistake's output; when none does, :func:`describe_mismatch` measures what
the difference *is* (shape, dtype, NaN, a constant factor, swapped axes, wrong only in some rows…)
and names a cause only when the measurement supports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, NoReturn, Sequence

import numpy as np
import torch

from .boundary import Opaque, describe_value
from .result import Diagnosis

__all__ = [
    "Failure",
    "fail",
    "Mistake",
    "as_tensor",
    "expect_shape",
    "expect_finite",
    "expect_close",
    "expect_equal",
    "matching_mistakes",
    "describe_mismatch",
    "same",
    "fmt",
]


class Failure(Exception):
    """Raised inside a check body to end it with a diagnosis."""

    def __init__(self, diagnosis: Diagnosis):
        super().__init__(diagnosis.summary)
        self.diagnosis = diagnosis


def fail(summary: str, *, tried: str = "", got: str = "", expected: str = "", cause: str = "",
         fix: str = "") -> NoReturn:
    """End the check: ``summary`` is the short line; the other parts fill the template."""
    raise Failure(Diagnosis(summary, tried, got, expected, cause, fix))


def fmt(x: float) -> str:
    """A number as a learner reads it: 4 significant digits, no noise."""
    if x != x:
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.4g}"


@dataclass
class Mistake:
    """A known wrong answer: what it looks like and how to put it right.

    ``output`` is the value that mistake produces on the check's input, or a zero-argument function
    computing it (skipped when it raises, e.g. for shapes where the mistake cannot even run).
    ``summary`` is the short form for grade tables ("mask applied after the softmax").
    """

    summary: str
    cause: str
    fix: str
    output: Any

    def value(self) -> torch.Tensor | None:
        try:
            out = self.output() if callable(self.output) else self.output
        except Exception:  # noqa: BLE001 - this mistake cannot happen on this input
            return None
        return out if isinstance(out, torch.Tensor) else None


def same(a: torch.Tensor, b: torch.Tensor, *, atol: float, rtol: float) -> bool:
    """Same shape and equal within tolerance, compared in float64 (NaN equals NaN, ±inf equal themselves)."""
    if tuple(a.shape) != tuple(b.shape):
        return False
    return bool(torch.allclose(a.detach().to(torch.float64), b.detach().to(torch.float64), atol=atol, rtol=rtol,
                               equal_nan=True))


def matching_mistakes(actual: torch.Tensor, mistakes: Iterable[Mistake], *, atol: float, rtol: float) -> list[Mistake]:
    """Every mistake whose output the answer reproduces (usually none or one)."""
    found = []
    for mistake in mistakes:
        wrong = mistake.value()
        if wrong is not None and same(actual, wrong, atol=atol, rtol=rtol):
            found.append(mistake)
    return found


def _blame(found: list[Mistake], tried: str, got: str, expected: str) -> NoReturn:
    found = list({(m.summary, m.cause, m.fix): m for m in found}.values())  # one mistake, several ways to make it
    if len(found) == 1:
        m = found[0]
        fail(m.summary, tried=tried, got=got, expected=expected, cause=m.cause, fix=m.fix)
    causes = " — or ".join(m.cause for m in found)
    fixes = "; otherwise ".join(m.fix for m in found)
    fail(" or ".join(m.summary for m in found), tried=tried, got=got, expected=expected,
         cause=f"on this input two mistakes give the same numbers: {causes}", fix=fixes)


# ============================================================================ turning answers into tensors
def as_tensor(value: Any, *, tried: str, what: str = "your function", expected: str = "a torch.Tensor") -> torch.Tensor:
    """The answer as a tensor (a NumPy array or a number is converted), or a diagnosis of what came back."""
    if isinstance(value, torch.Tensor):
        if value.device.type == "meta":
            fail(f"{what} returned a tensor on the meta device", tried=tried,
                 got=f"a tensor of shape {tuple(value.shape)} on the 'meta' device, which holds no numbers",
                 expected=expected, cause="you created the result with device='meta' (or moved it there)",
                 fix="build the result from the inputs with ordinary tensor operations")
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, (np.generic, int, float)) and not isinstance(value, (bool, np.bool_)):
        return torch.tensor(float(value), dtype=torch.float64)
    if value is None:
        fail(f"{what} returned None", tried=tried, got="None", expected=expected,
             cause="your function has no `return` (or returns before computing the result)",
             fix="end the function with `return` and the result")
    if isinstance(value, (list, tuple)):
        fail(f"{what} returned a Python {type(value).__name__}", tried=tried,
             got=f"a {type(value).__name__} of {len(value)} items", expected=expected,
             fix="build the result with tensor operations, or turn a list of tensors into one with torch.stack")
    if isinstance(value, Opaque):
        fail(f"{what} returned a {value.type_name}", tried=tried, got=f"a {value.type_name} ({value.text})",
             expected=expected, fix="return the tensor itself")
    fail(f"{what} returned a {type(value).__name__}", tried=tried, got=describe_value(value), expected=expected,
         fix="return a tensor")


def expect_shape(t: torch.Tensor, shape: Sequence[int], *, tried: str, what: str = "your result",
                 mistakes: Sequence[Mistake] = (), fix: str = "") -> None:
    """Fail unless ``t`` has exactly ``shape``; blame a mistake that produces this very shape and values."""
    shape = tuple(int(s) for s in shape)
    if tuple(t.shape) == shape:
        return
    got, expected = f"{what} of shape {tuple(t.shape)}", f"shape {shape}"
    found = matching_mistakes(t, mistakes, atol=1e-5, rtol=1e-4)
    if found:
        _blame(found, tried, got, expected)
    cause = _shape_cause(tuple(t.shape), shape)
    fail(f"wrong shape {tuple(t.shape)}, expected {shape}", tried=tried, got=got, expected=expected, cause=cause,
         fix=fix or "follow the shapes in the docstring line by line; print(x.shape) after each step helps")


def _shape_cause(got: tuple[int, ...], want: tuple[int, ...]) -> str:
    """A likely cause of a wrong shape, when the two shapes point at one."""
    if sorted(got) == sorted(want):
        return "the right sizes in a different order: an axis swap (transpose) or a reshape in the wrong order"
    if len(got) == len(want) + 1 and any(s == 1 and got[:i] + got[i + 1:] == want for i, s in enumerate(got)):
        return "one axis of size 1 too many (keepdim=True where the docstring drops the axis, or a missing squeeze)"
    if len(got) + 1 == len(want) and any(s == 1 and want[:i] + want[i + 1:] == got for i, s in enumerate(want)):
        return "one axis of size 1 missing (keepdim=True would keep it)"
    if math.prod(got) == math.prod(want):
        return "the right number of entries in the wrong shape: a reshape or view to the wrong sizes"
    if len(got) < len(want):
        return "an axis is missing: a sum or a reduction over one axis too many"
    return ""


def expect_finite(t: torch.Tensor, *, tried: str, what: str = "your result", cause: str = "", fix: str = "") -> None:
    """Fail if ``t`` holds NaN or ±inf, saying how many and where the first one is."""
    if not (t.is_floating_point() or t.is_complex()):
        return
    bad = ~torch.isfinite(t)
    if bad.any():
        first = tuple(int(i) for i in bad.nonzero()[0])
        kinds = " and ".join(k for k, present in (("NaN", torch.isnan(t).any()), ("inf", torch.isinf(t).any())) if present)
        fail(f"{kinds} in the result", tried=tried,
             got=f"{what} holds {kinds} in {int(bad.sum())} of {t.numel()} entries (the first at index {first})",
             expected="finite numbers everywhere", cause=cause, fix=fix)


def expect_equal(actual: Any, expected: Any, *, tried: str, what: str = "your result", cause: str = "",
                 fix: str = "") -> None:
    """Exact equality for non-tensor answers (integers, booleans, strings)."""
    if actual == expected and type(actual) is type(expected) or (isinstance(actual, (int, np.integer)) and
                                                                 not isinstance(actual, bool) and actual == expected):
        return
    fail(f"{what} is {describe_value(actual)}, expected {describe_value(expected)}", tried=tried,
         got=describe_value(actual), expected=describe_value(expected), cause=cause, fix=fix)


def expect_close(actual: torch.Tensor, expected: torch.Tensor, *, tried: str, what: str = "your result",
                 atol: float = 1e-5, rtol: float = 1e-4, mistakes: Sequence[Mistake] = (),
                 factors: dict[str, float] | None = None, fix: str = "", oracle: str = "") -> None:
    """Fail unless ``actual`` matches ``expected``: blame a mistake whose output it reproduces, or else
    measure what the difference is (:func:`describe_mismatch`). ``factors`` names constants a wrong
    scale could be off by (``{"√d_k": 2.83}``); ``oracle`` names where ``expected`` comes from
    (``"F.scaled_dot_product_attention"``), for the diagnosis's "expected" line."""
    if tuple(actual.shape) != tuple(expected.shape):
        expect_shape(actual, expected.shape, tried=tried, what=what, mistakes=mistakes, fix=fix)
    if same(actual, expected, atol=atol, rtol=rtol):
        return
    found = matching_mistakes(actual, mistakes, atol=atol, rtol=rtol)
    got, exp, cause, summary = describe_mismatch(actual, expected, what=what, atol=atol, rtol=rtol, factors=factors)
    if oracle and exp == _EXPECTED:
        exp = f"the values {oracle} gives"
    if found:
        _blame(found, tried, got, exp)
    fail(summary, tried=tried, got=got, expected=exp, cause=cause,
         fix=fix or "compare your steps with the docstring on this input; print the intermediate tensors")


# ============================================================================ what the difference is
_EXPECTED = "the correct values (from the check's reference computation)"
def describe_mismatch(actual: torch.Tensor, expected: torch.Tensor, *, what: str = "your result", atol: float = 1e-5,
                      rtol: float = 1e-4, factors: dict[str, float] | None = None,
                      axes: Sequence[str] | None = None) -> tuple[str, str, str, str]:
    """Measure how ``actual`` differs from ``expected`` (same shape). Returns (got, expected, cause, summary);
    ``cause`` is empty unless a measurement points at one.

    In order: the dtype (integers, float16), NaN or inf where the right values are finite, a constant
    factor (named from ``factors`` when only one name fits), a constant shift, a transposed matrix, the
    right values along one axis reversed, shuffled or repeated (``axes`` names the axes: "queries",
    "keys"…), an affine map a·x + b of the right values; failing all, which entries differ and where."""
    a = actual.detach().to(torch.float64)
    e = expected.detach().to(torch.float64)
    dtype = str(actual.dtype).replace("torch.", "")
    if not (actual.is_floating_point() or actual.is_complex()) and expected.is_floating_point():
        if same(a, e.round(), atol=atol, rtol=rtol) or same(a, e.trunc(), atol=atol, rtol=rtol):
            return (f"{what} has integer dtype {dtype}: the values were rounded to whole numbers",
                    "floating-point values", "your computation ran in integers, so every fraction was dropped",
                    f"integer result ({dtype})")
        return (f"{what} has integer dtype {dtype}", "floating-point values",
                "integer arithmetic somewhere (an integer tensor, or // division)", f"integer result ({dtype})")
    if actual.dtype in (torch.float16, torch.bfloat16) and expected.dtype not in (torch.float16, torch.bfloat16):
        if same(a, e, atol=max(atol, 2e-2), rtol=max(rtol, 1e-2)):
            return (f"{dtype} values ({what}), close but not equal: {dtype} keeps about 3 significant digits",
                    f"{str(expected.dtype).replace('torch.', '')}, as the input",
                    f"your computation converted to {dtype} (.half() or dtype={dtype})", f"result in {dtype}")
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    if (nan_a & ~nan_e).any():
        first = tuple(int(i) for i in (nan_a & ~nan_e).nonzero()[0])
        return (f"NaN in {int((nan_a & ~nan_e).sum())} of {a.numel()} entries (the first at index {first})",
                "finite numbers there", "", "NaN in the result")
    inf_a = torch.isinf(a) & ~torch.isinf(e)
    if inf_a.any():
        first = tuple(int(i) for i in inf_a.nonzero()[0])
        return (f"inf in {int(inf_a.sum())} entries (the first at index {first})", "finite numbers there",
                "an overflow", "inf in the result")
    finite = torch.isfinite(a) & torch.isfinite(e)
    af, ef = a[finite], e[finite]
    close = torch.isclose(a, e, atol=atol, rtol=rtol, equal_nan=True)
    # A constant factor: actual ≈ c · expected.
    if ef.numel() and ef.abs().max() > 1e-9:
        c = float((af * ef).sum() / (ef * ef).sum())
        # A factor close to 1 (rounding-level) is no factor: leave it to the entry-by-entry report.
        if abs(c) > 1e-9 and abs(c - 1) > 1e-3 and same(a, c * e, atol=atol * max(1, abs(c)), rtol=rtol):
            named = _name_factor(c, factors or {})
            shown = fmt(c) if abs(c - 1) > 0.01 else f"{c:.6g}"
            cause = f"your result is {named} times the expected one" if named else ""
            return (f"every entry is {shown} × the expected value", "the expected values", cause,
                    f"off by a factor of {named or shown}")
        offset = float((af - ef).mean())
        if abs(offset) > atol and same(a, e + offset, atol=atol, rtol=rtol):
            return (f"every entry is the expected value {'+' if offset > 0 else '−'} {fmt(abs(offset))}",
                    "the expected values", "", f"shifted by a constant {fmt(offset)}")
    if a.ndim >= 2 and a.shape[-1] == a.shape[-2] and a.shape[-1] > 1 and same(a, e.transpose(-2, -1), atol=atol, rtol=rtol):
        return ("the expected matrix with rows and columns swapped", "rows and columns as the docstring orders them",
                "your result is transposed", "transposed")
    along = _along_an_axis(a, e, atol=atol, rtol=rtol, axes=axes)
    if along:
        return along
    affine = _affine(a, e, atol=atol, rtol=rtol)
    if affine:
        return affine
    wrong = ~close
    worst = _worst_index(a, e)
    detail = (f"largest difference {fmt(float((a - e).abs().nan_to_num(nan=math.inf)[worst]))} at index {worst}: "
              f"got {fmt(float(a[worst]))}, expected {fmt(float(e[worst]))}")
    region = _where_wrong(wrong)
    got = f"{int(wrong.sum())} of {a.numel()} entries differ{region}; {detail}"
    return got, _EXPECTED, "", f"wrong values{region}"


def _axis_name(axis: int, ndim: int, axes: Sequence[str] | None) -> str:
    if axes is not None and len(axes) == ndim:
        return axes[axis]
    if ndim >= 3 and axis == 0:
        return "batch entries"
    if ndim >= 2 and axis == ndim - 2:
        return "rows"
    if axis == ndim - 1:
        return "columns" if ndim >= 2 else "entries"
    return f"entries along axis {axis}"


def _along_an_axis(a: torch.Tensor, e: torch.Tensor, *, atol: float, rtol: float,
                   axes: Sequence[str] | None) -> tuple[str, str, str, str] | None:
    """The right values along one axis reversed, shuffled, or the same for every index."""
    for axis in range(a.ndim):
        size = a.shape[axis]
        if size < 2:
            continue
        name = _axis_name(axis, a.ndim, axes)
        if same(a, e.flip(axis), atol=atol, rtol=rtol):
            return (f"the right values with the {name} in reverse order (axis {axis})", f"the {name} in order",
                    f"your result has the {name} in reverse order: the first belongs last", f"{name} in reverse order")
        sa, se = a.movedim(axis, 0), e.movedim(axis, 0)
        if all(same(sa[i], sa[0], atol=atol, rtol=rtol) for i in range(1, size)) and \
                not all(same(se[i], se[0], atol=atol, rtol=rtol) for i in range(1, size)):
            match = next((j for j in range(size) if same(sa[0], se[j], atol=atol, rtol=rtol)), None)
            source = f"the values that belong to number {match}" if match is not None else "the same values"
            return (f"the same values for every one of the {name} (axis {axis}): {source}",
                    f"values that differ from one of the {name} to the next",
                    f"your result does not change along axis {axis} (the {name})", f"the same values for all {name}")
        if size > 32:
            continue  # matching every slice against every other would cost size² comparisons
        perm: list[int] = []
        for i in range(size):
            j = next((j for j in range(size) if j not in perm and same(sa[i], se[j], atol=atol, rtol=rtol)), None)
            if j is None:
                break
            perm.append(j)
        if len(perm) == size and perm != list(range(size)):
            shown = ", ".join(map(str, perm[:8])) + ("…" if size > 8 else "")
            return (f"the right values with the {name} in another order (axis {axis}): yours are numbers {shown}",
                    f"the {name} in order", f"your result mixes up the {name}", f"{name} in the wrong order")
    return None


def _affine(a: torch.Tensor, e: torch.Tensor, *, atol: float, rtol: float) -> tuple[str, str, str, str] | None:
    """actual = α·expected + β for every entry (neither a pure factor nor a pure shift: those come first)."""
    if not (torch.isfinite(a).all() and torch.isfinite(e).all()) or e.numel() < 3 or float(e.std()) < 1e-9:
        return None
    design = torch.stack([e.flatten(), torch.ones(e.numel(), dtype=torch.float64)], 1)
    alpha, beta = (float(v) for v in torch.linalg.lstsq(design, a.flatten()[:, None]).solution.flatten())
    if abs(beta) <= atol or abs(alpha) <= 1e-6 or abs(alpha - 1) < 1e-6 or not same(a, alpha * e + beta, atol=atol, rtol=rtol):
        return None
    said = (f"{fmt(beta)} − the expected value" if abs(alpha + 1) < 1e-6 else
            f"{fmt(alpha)} × the expected value {'+' if beta > 0 else '−'} {fmt(abs(beta))}")
    return f"every entry is {said}", "the expected values", "", f"every value is {said}"


def _name_factor(c: float, factors: dict[str, float]) -> str:
    """A name for the factor ``c``: the check's own name for it (``√d_k``) only when no other name, nor the
    plain 2, ½ or −1, has the same value on this input (so a factor 2 is never called √d_k when d_k = 4)."""
    builtin = {"−1": -1.0, "2": 2.0, "½": 0.5}
    candidates = {**factors, **{f"1/{k}": 1 / v for k, v in factors.items() if v}}
    matches = [name for name, value in {**candidates, **builtin}.items()
               if abs(c - value) <= 1e-3 * max(1.0, abs(value))]
    if len(matches) == 1:
        return matches[0]
    return ""


def _worst_index(a: torch.Tensor, e: torch.Tensor) -> tuple[int, ...]:
    diff = (a - e).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    if a.ndim == 0:
        return ()
    return tuple(int(i) for i in torch.nonzero(diff == diff.max())[0])


def _where_wrong(wrong: torch.Tensor) -> str:
    """' only in the last 2 columns' / ' only in rows 3 and later' when the wrong entries form such a region."""
    if wrong.ndim < 2 or not wrong.any() or bool(wrong.all()):
        return ""
    rows = wrong.flatten(0, -3).any(0).any(-1) if wrong.ndim > 2 else wrong.any(-1)  # (n_rows,)
    cols = wrong.flatten(0, -3).any(0).any(-2) if wrong.ndim > 2 else wrong.any(-2)  # (n_cols,)
    n_rows, n_cols = rows.numel(), cols.numel()
    bad_rows = [int(i) for i in rows.nonzero()]
    bad_cols = [int(j) for j in cols.nonzero()]
    if len(bad_rows) < n_rows and bad_rows == list(range(bad_rows[0], n_rows)):
        return f" only from row {bad_rows[0]} on"
    if len(bad_rows) < n_rows and bad_rows == list(range(0, bad_rows[-1] + 1)):
        return f" only in the first {len(bad_rows)} row{'s' if len(bad_rows) > 1 else ''}"
    if len(bad_cols) < n_cols and bad_cols == list(range(bad_cols[0], n_cols)):
        return f" only from column {bad_cols[0]} on"
    if len(bad_rows) < n_rows:
        return f" only in row{'s' if len(bad_rows) > 1 else ''} {', '.join(map(str, bad_rows[:6]))}" + (
            "…" if len(bad_rows) > 6 else "")
    return ""


def call_or_skip(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` and return its value, or None when it raises (for optional oracle computations)."""
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return None
