"""The comparison layer every check shares: turn an answer into a tensor, compare it with the oracle,
and, when it differs, say what is wrong in the course's one template (:class:`~.result.Diagnosis`).

A known mistake on one case (:class:`Mistake`, what the kit's ``Known.on`` makes) is blamed only when the
answer reproduces its output; when none does, :func:`describe_mismatch` measures what the difference *is*
(shape, dtype, NaN, a constant factor, swapped axes, wrong only in some rows…) and names a cause only when
the measurement supports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, NoReturn, Sequence

import numpy as np
import torch

from .boundary import Opaque, describe_value
from .result import Diagnosis

__all__ = ["Failure", "fail", "fail_again", "Mistake", "as_tensor", "expect_shape", "expect_finite", "expect_close",
           "expect_equal", "matching_mistakes", "describe_mismatch", "Mismatch", "same", "fmt", "fmt_apart"]


class Failure(Exception):
    """Raised inside a check body to end it with a diagnosis."""

    def __init__(self, diagnosis: Diagnosis):
        super().__init__(diagnosis.summary)
        self.diagnosis = diagnosis


def fail(summary: str, *, tried: str = "", got: str = "", expected: str = "", cause: str = "",
         fix: str = "") -> NoReturn:
    """End the check: ``summary`` is the short line; the other parts fill the template."""
    raise Failure(Diagnosis(summary, tried, got, expected, cause, fix))


def fail_again(failure: Failure, summary: str, cause: str, fix: str) -> NoReturn:
    """End the check with what ``failure`` showed (tried, got, expected) and a cause a measurement found."""
    d = failure.diagnosis
    fail(summary, tried=d.tried, got=d.got, expected=d.expected, cause=cause, fix=fix)


def fmt(x: float, digits: int = 4) -> str:
    """A number as a learner reads it: 4 significant digits, no noise."""
    if x != x:
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.{digits}g}"


def fmt_apart(a: float, b: float) -> tuple[str, str]:
    """Two numbers that differ, each with the fewest significant digits (4 at least) that show they differ."""
    digits = next((d for d in range(4, 18) if fmt(a, d) != fmt(b, d)), 17)
    return fmt(a, digits), fmt(b, digits)


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
    """Same shape and equal within tolerance, compared in float64 (NaN equals NaN, ±inf equal themselves); a complex
    tensor equals only a complex one (converting it to float64 would drop its imaginary part)."""
    if tuple(a.shape) != tuple(b.shape) or a.is_complex() != b.is_complex():
        return False
    if a.is_complex():
        return bool(torch.allclose(a.detach().to(torch.complex128), b.detach().to(torch.complex128), atol=atol,
                                   rtol=rtol, equal_nan=True))
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
        if value.is_complex():
            fail(f"{what} returned a complex tensor", tried=tried,
                 got=f"a {str(value.dtype).replace('torch.', '')} tensor of shape {tuple(value.shape)}",
                 expected=f"{expected} of real numbers", cause="a complex number entered the computation (1j, "
                 "torch.polar, torch.view_as_complex) and the result kept it",
                 fix="return real values: torch.view_as_real, or .real where the imaginary part is meant to vanish")
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
                 mistakes: Sequence[Mistake] = (), fix: str = "", values: torch.Tensor | None = None,
                 axes: Sequence[str | None] | None = None) -> None:
    """Fail unless ``t`` has exactly ``shape``; blame a mistake that produces this very shape and values.
    ``values`` (the expected result, when the caller has it) lets the diagnosis tell an axis lost to an
    index (``x[0]``) from one lost to a sum or a mean; ``axes`` names the expected axes in the plural
    ("heads", …), as in :func:`expect_close`, so that the lost one is called by its name ("only head 0 kept")."""
    shape = tuple(int(s) for s in shape)
    if tuple(t.shape) == shape:
        return
    got, expected = f"{what} of shape {tuple(t.shape)}", f"shape {shape}"
    found = matching_mistakes(t, mistakes, atol=1e-5, rtol=1e-4)
    if found:
        _blame(found, tried, got, expected)
    lost = _lost_axis(t, values, axes=axes) if values is not None and tuple(values.shape) == shape else None
    if lost:
        summary, cause, lost_fix = lost
        fail(summary, tried=tried, got=got, expected=expected, cause=cause, fix=lost_fix)
    cause = _shape_cause(tuple(t.shape), shape)
    fail(f"wrong shape {tuple(t.shape)}, expected {shape}", tried=tried, got=got, expected=expected, cause=cause,
         fix=fix or "follow the shapes in the docstring line by line; print(x.shape) after each step helps")


def _lost_axis(t: torch.Tensor, e: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-4,
               axes: Sequence[str | None] | None = None) -> tuple[str, str, str] | None:
    """(summary, cause, fix) when ``t`` is the expected ``e`` with one axis taken away: one index of it kept
    (``x[0]``), or its sum or mean; None otherwise."""
    if t.ndim + 1 != e.ndim or not (t.is_floating_point() and e.is_floating_point()):
        return None
    a, x = t.detach().to(torch.float64), e.detach().to(torch.float64)
    for axis in range(e.ndim):
        if e.shape[axis] < 2 or tuple(x.select(axis, 0).shape) != tuple(a.shape):
            continue  # an axis of size 1 dropped is a squeeze, which the shape alone tells
        ax = _Axis(axis, e.ndim, axes)
        for j in range(e.shape[axis]):
            if same(a, x.select(axis, j), atol=atol, rtol=rtol):
                index = _index_text(j, e.shape[axis]).split(" or ")[0]
                return (f"only {ax.item(j)} kept (axis {axis} dropped)",
                        f"your result is the right answer for {ax.item(j)} alone: an index {index} on axis {axis} "
                        f"picks one {ax.singular} and drops the axis",
                        f"keep axis {axis}: compute every {ax.singular}, without the index {index}")
        for reduction in ("sum", "mean"):
            if same(a, getattr(x, reduction)(axis), atol=atol, rtol=rtol):
                return (f"the {reduction} over axis {axis} (the axis is gone)",
                        f"your result is the right one's {reduction} over the {ax.plural} (axis {axis}): a "
                        f".{reduction}() the docstring does not have",
                        f"keep axis {axis}: remove the {reduction} over it")
    return None


def _shape_cause(got: tuple[int, ...], want: tuple[int, ...]) -> str:
    """A likely cause of a wrong shape, when the two shapes point at one."""
    if sorted(got) == sorted(want):
        return "the right sizes in a different order: an axis swap (transpose) or a reshape in the wrong order"
    if len(got) == len(want) + 1 and any(s == 1 and got[:i] + got[i + 1:] == want for i, s in enumerate(got)):
        return "one axis of size 1 too many (keepdim=True where the docstring drops the axis, or a missing squeeze)"
    if len(got) + 1 == len(want) and any(s == 1 and want[:i] + want[i + 1:] == got for i, s in enumerate(want)):
        return "one axis of size 1 missing (keepdim=True would keep it)"
    if math.prod(got) == math.prod(want):
        return "the right number of entries in the wrong shape: a reshape, view, split or stack to the wrong sizes"
    if len(got) < len(want):
        return ("an axis is missing: an index that picks one entry (x[0]) or a reduction (sum, mean, max) over "
                "an axis the docstring keeps")
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
                 factors: dict[str, float] | None = None, fix: str = "", oracle: str = "",
                 axes: Sequence[str | None] | None = None) -> None:
    """Fail unless ``actual`` matches ``expected``: blame a mistake whose output it reproduces, or else
    measure what the difference is (:func:`describe_mismatch`). ``factors`` names constants a wrong
    scale could be off by (``{"√d_k": 2.83}``); ``oracle`` names where ``expected`` comes from
    (``"F.scaled_dot_product_attention"``), for the diagnosis's "expected" line; ``axes`` names the axes
    in the plural (``("batch entries", "heads", "queries", "keys")``). ``fix`` is the advice when the
    measurement names no cause; when it does, the measurement's own advice comes first."""
    if tuple(actual.shape) != tuple(expected.shape):
        expect_shape(actual, expected.shape, tried=tried, what=what, mistakes=mistakes, fix=fix, values=expected,
                     axes=axes)
    if same(actual, expected, atol=atol, rtol=rtol):
        return
    found = matching_mistakes(actual, mistakes, atol=atol, rtol=rtol)
    mismatch = describe_mismatch(actual, expected, what=what, atol=atol, rtol=rtol, factors=factors, axes=axes)
    got, exp, cause, summary = mismatch
    if oracle and exp == _EXPECTED:
        exp = f"the values {oracle} gives"
    if found:
        _blame(found, tried, got, exp)
    measured = mismatch.fix if cause else ""  # advice that follows from what was measured outranks the general one
    fail(summary, tried=tried, got=got, expected=exp, cause=cause,
         fix=measured or fix or mismatch.fix or "compare your steps with the docstring on this input; print the "
         "intermediate tensors")


# ============================================================================ what the difference is
_EXPECTED = "the correct values (from the check's reference computation)"


class Mismatch(tuple):
    """What :func:`describe_mismatch` measured: unpacks as ``(got, expected, cause, summary)``; ``fix`` is the
    advice that goes with the measurement (empty when the measurement suggests none)."""

    fix: str

    def __new__(cls, got: str, expected: str, cause: str, summary: str, fix: str = "") -> "Mismatch":
        self = super().__new__(cls, (got, expected, cause, summary))
        self.fix = fix
        return self


def describe_mismatch(actual: torch.Tensor, expected: torch.Tensor, *, what: str = "your result", atol: float = 1e-5,
                      rtol: float = 1e-4, factors: dict[str, float] | None = None,
                      axes: Sequence[str | None] | None = None) -> Mismatch:
    """Measure how ``actual`` differs from ``expected`` (same shape). Returns a :class:`Mismatch`, which unpacks
    as (got, expected, cause, summary) and carries a ``fix``; ``cause`` is empty unless a measurement points at one.

    In order: the dtype (integers, float16), NaN or inf where the right values are finite, a constant
    factor (named from ``factors`` when only one name fits), a constant shift, a transposed matrix, the
    right values along one axis reversed, shuffled or one index's values repeated for every index (``axes``
    names the axes in the plural, one name per axis: "batch entries", "heads", "queries"…, or None for "slices
    along axis k"; without it the axes are batch entries, rows and columns), an affine map a·x + b of the right
    values; failing all, which entries differ and where."""
    a = actual.detach().to(torch.float64)
    e = expected.detach().to(torch.float64)
    dtype = str(actual.dtype).replace("torch.", "")
    if not (actual.is_floating_point() or actual.is_complex()) and expected.is_floating_point():
        int_fix = ("keep every step in floating point: no // division, no .long() or .int(), and write 1.0 rather "
                   "than 1 in torch.tensor([...])")
        if same(a, e.round(), atol=atol, rtol=rtol) or same(a, e.trunc(), atol=atol, rtol=rtol):
            return Mismatch(f"{what} has integer dtype {dtype}: the values were rounded to whole numbers",
                            "floating-point values", "your computation ran in integers, so every fraction was dropped",
                            f"integer result ({dtype})", int_fix)
        return Mismatch(f"{what} has integer dtype {dtype}", "floating-point values",
                        "integer arithmetic somewhere (an integer tensor, or // division)", f"integer result ({dtype})",
                        int_fix)
    if actual.dtype in (torch.float16, torch.bfloat16) and expected.dtype not in (torch.float16, torch.bfloat16):
        if same(a, e, atol=max(atol, 2e-2), rtol=max(rtol, 1e-2)):
            return Mismatch(f"{dtype} values ({what}), close but not equal: {dtype} keeps about 3 significant digits",
                            f"values at {str(expected.dtype).replace('torch.', '')} precision",
                            f"your computation converted to {dtype} (.half() or dtype={dtype})", f"result in {dtype}",
                            f"leave out .half(), .to(torch.{dtype}) or dtype={dtype}: compute in the inputs' dtype "
                            "(float32 or float64 where there is no input tensor)")
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    if (nan_a & ~nan_e).any():
        first = tuple(int(i) for i in (nan_a & ~nan_e).nonzero()[0])
        return Mismatch(f"NaN in {int((nan_a & ~nan_e).sum())} of {_count(a.numel(), 'entry', 'entries')} (the first "
                        f"at index {first})", "finite numbers there",
                        "", "NaN in the result",
                        "find the first step that makes a NaN (print torch.isnan(x).any() after each step) and compare it "
                        "with the docstring")
    inf_a = torch.isinf(a) & ~torch.isinf(e)
    if inf_a.any():
        first = tuple(int(i) for i in inf_a.nonzero()[0])
        return Mismatch(f"inf in {_count(int(inf_a.sum()), 'entry', 'entries')} (the first at index {first})",
                        "finite numbers there", "an overflow (an exp of a large number) or a division by zero",
                        "inf in the result")
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
            return Mismatch(f"every entry is {shown} × the expected value", _EXPECTED, cause,
                            f"off by a factor of {named or shown}", _factor_fix(named, shown))
        offset = float((af - ef).mean())
        if abs(offset) > atol and same(a, e + offset, atol=atol, rtol=rtol):
            return Mismatch(f"every entry is the expected value {'+' if offset > 0 else '−'} {fmt(abs(offset))}",
                            _EXPECTED, "", f"shifted by a constant {fmt(offset)}",
                            f"look for a constant that your code {'adds to' if offset > 0 else 'subtracts from'} "
                            f"every entry ({fmt(abs(offset))}): an offset, a stray ± 1 or an epsilon the docstring "
                            "does not have")
    if a.ndim >= 2 and a.shape[-1] == a.shape[-2] and a.shape[-1] > 1 and same(a, e.transpose(-2, -1), atol=atol, rtol=rtol):
        return Mismatch("the expected matrix with rows and columns swapped",
                        "rows and columns as the docstring orders them", "your result is transposed", "transposed",
                        "look for a matrix product in the wrong order (k @ qᵀ where the docstring has q @ kᵀ) or "
                        "one .transpose(-2, -1) (or .T) too many or too few")
    along = _along_an_axis(a, e, atol=atol, rtol=rtol, axes=axes, what=what)
    if along:
        return along
    affine = _affine(a, e, atol=atol, rtol=rtol)
    if affine:
        return affine
    wrong = ~close
    diff = _difference(a, e)
    worst = () if a.ndim == 0 else tuple(int(i) for i in torch.nonzero(diff == diff.max())[0])
    shown = fmt_apart(float(a[worst]), float(e[worst]))
    detail = f"largest difference {fmt(float(diff[worst]))} at index {worst}: got {shown[0]}, expected {shown[1]}"
    region = _where_wrong(wrong)
    got = f"{int(wrong.sum())} of {_count(a.numel(), 'entry', 'entries')} differ{region}; {detail}"
    return Mismatch(got, _EXPECTED, "", f"wrong values{region}")


def _count(n: int, singular: str, plural: str) -> str:
    """'1 entry', '3 entries'."""
    return f"{n} {singular if n == 1 else plural}"


def _factor_fix(named: str, shown: str) -> str:
    """Advice for a result ``named`` (or ``shown``) times the expected one."""
    if named == "−1":
        return "a sign is flipped: look for a subtraction the wrong way round (b − a for a − b) or a stray minus"
    if named.startswith("1/"):
        inner = named[2:]
        return (f"your result needs multiplying by {inner}: a division by {inner} is one too many, or a "
                f"multiplication by {inner} is missing")
    if named == "½":
        return "your result needs doubling: a division by 2 (or a factor ½) is one too many, or a factor 2 is missing"
    if named:
        return (f"your result needs dividing by {named}: a division by {named} is missing, or a multiplication by "
                f"{named} is one too many")
    return (f"every entry is off by the same factor {shown}: look for a scale the docstring does not have, or one it "
            "has that you left out")


class _Axis:
    """How a diagnosis names axis ``number`` of a tensor and the indices along it ("head 2", "every head")."""

    _SINGULAR = {"batch entries": "batch entry", "entries": "entry", "queries": "query", "keys": "key",
                 "heads": "head", "positions": "position", "features": "feature", "rows": "row", "columns": "column",
                 "tokens": "token", "values": "value"}

    def __init__(self, number: int, ndim: int, axes: Sequence[str | None] | None):
        self.number, self.suffix = number, ""
        named = axes is not None and len(axes) == ndim
        plural = axes[number] if named else None
        if plural is None:
            if named:  # the caller names the axes but not this one
                plural, self.suffix = "slices", f" along axis {number}"
            elif ndim >= 3 and number == 0:
                plural = "batch entries"
            elif ndim >= 2 and number == ndim - 2:
                plural = "rows"
            elif number == ndim - 1:
                plural = "columns" if ndim >= 2 else "entries"
            else:
                plural, self.suffix = "slices", f" along axis {number}"
        self.plural = plural + self.suffix
        self.singular = self._SINGULAR.get(plural) or (plural[:-3] + "y" if plural.endswith("ies") else
                                                       plural[:-1] if plural.endswith("s") else plural)

    def item(self, i: int) -> str:
        """'head 2', 'slice 2 along axis 1'."""
        return f"{self.singular} {i}{self.suffix}"

    def of(self, i: int) -> str:
        """'head 2's values', 'the values of slice 2 along axis 1'."""
        return f"the values of {self.item(i)}" if self.suffix else f"{self.item(i)}'s values"

    @property
    def every(self) -> str:
        return f"every {self.singular}{self.suffix}"


def _index_text(j: int, size: int) -> str:
    """How code picks index ``j`` of ``size`` alone: '[0] or [:1]', '[-1] or [-1:]', '[2]'."""
    if j == 0:
        return "[0] or [:1]"
    if j == size - 1:
        return "[-1] or [-1:]"
    return f"[{j}]"


def _along_an_axis(a: torch.Tensor, e: torch.Tensor, *, atol: float, rtol: float,
                   axes: Sequence[str | None] | None, what: str = "your result") -> Mismatch | None:
    """The right values along one axis reversed, shuffled, or one index's values (or their mean or sum) for every
    index."""
    for axis in range(a.ndim):
        size = a.shape[axis]
        if size < 2:
            continue
        ax = _Axis(axis, a.ndim, axes)
        if same(a, e.flip(axis), atol=atol, rtol=rtol):
            return Mismatch(
                f"the right values with the {ax.plural} in reverse order (axis {axis} of {what}): your "
                f"{ax.item(0)} holds {ax.of(size - 1)}", f"{ax.item(0)} first, {ax.item(size - 1)} last",
                f"your code reverses the {ax.plural} (axis {axis}): a flip, or an index or loop that counts down "
                "from the end", f"{ax.plural} in reverse order",
                f"keep the {ax.plural} in their order: remove the flip of axis {axis}, or count the index up from 0")
        sa, se = a.movedim(axis, 0), e.movedim(axis, 0)
        if all(same(sa[i], sa[0], atol=atol, rtol=rtol) for i in range(1, size)) and \
                not all(same(se[i], se[0], atol=atol, rtol=rtol) for i in range(1, size)):
            return _repeated(sa, se, ax, atol=atol, rtol=rtol, what=what)
        if size > 32:
            continue  # matching every slice against every other would cost size² comparisons
        perm: list[int] = []
        for i in range(size):
            j = next((j for j in range(size) if j not in perm and same(sa[i], se[j], atol=atol, rtol=rtol)), None)
            if j is None:
                break
            perm.append(j)
        if len(perm) == size and perm != list(range(size)):
            moved = [i for i in range(size) if perm[i] != i]
            if len(moved) == 2:
                how = f"{ax.item(moved[0])} and {ax.item(moved[1])} swapped"
            else:
                shift = (perm[0]) % size
                rolled = all(perm[i] == (i + shift) % size for i in range(size))
                shown = ", ".join(map(str, perm[:8])) + ("…" if size > 8 else "")
                how = (f"your {ax.item(0)} holds {ax.of(perm[0])}, your {ax.item(1)} {ax.of(perm[1])}, and so on, "
                       "wrapping round at the end (a rotation)" if rolled else
                       f"yours are, in order, the expected {ax.plural} {shown}")
            return Mismatch(
                f"every {ax.singular}{ax.suffix} is right but in the wrong place (axis {axis} of {what}): {how}",
                f"the {ax.plural} in the docstring's order",
                f"your code puts the {ax.plural} in another order: a permute or transpose with the axes in another "
                "order, a view or reshape with its sizes in another order, or an index that picks the wrong "
                f"{ax.singular}", f"{ax.plural} in the wrong order",
                f"keep the {ax.plural} in the docstring's order: check the axis order in every permute and transpose, "
                "and the order of the sizes in every view or reshape")
    return None


def _repeated(sa: torch.Tensor, se: torch.Tensor, ax: _Axis, *, atol: float, rtol: float, what: str) -> Mismatch:
    """Every index along ``ax`` (moved first in ``sa`` and ``se``) holds the same values: say whose."""
    size, axis = sa.shape[0], ax.number
    expected = f"each {ax.singular}{ax.suffix} with its own values"
    match = next((j for j in range(size) if same(sa[0], se[j], atol=atol, rtol=rtol)), None)
    if match is not None:
        index = _index_text(match, size)
        return Mismatch(
            f"{ax.every} holds {ax.of(match)} (axis {axis} of {what})", expected,
            f"you computed {ax.item(match)} only and reused it for {ax.every}: a fixed index {index} on axis "
            f"{axis}, then broadcasting (expand, repeat) to the full shape",
            f"{ax.item(match)} repeated for {ax.every}",
            f"compute {ax.every}: drop the index {index} and let each step run over the whole axis {axis} (or loop "
            f"over {ax.every})")
    for reduction, op in (("mean", se.mean(0)), ("sum", se.sum(0))):
        if same(sa[0], op, atol=atol, rtol=rtol):
            return Mismatch(
                f"{ax.every} holds the {reduction} over all the {ax.plural} (axis {axis} of {what})", expected,
                f"your code takes the {reduction} over axis {axis} (the {ax.plural}) and broadcasts it back",
                f"the {reduction} over the {ax.plural} in {ax.every}",
                f"keep axis {axis}: no {reduction} over the {ax.plural}, each {ax.singular} stays on its own")
    return Mismatch(
        f"the same values for {ax.every} (axis {axis} of {what}), matching none of the expected {ax.plural}", expected,
        f"your result does not change from one {ax.singular}{ax.suffix} to the next: a step drops axis {axis}",
        f"the same values for {ax.every}",
        f"make each {ax.singular} depend on its own part of the input: look for the step that loses axis {axis} (a "
        "fixed index, a reduction, or a size-1 axis broadcast back)")


def _affine(a: torch.Tensor, e: torch.Tensor, *, atol: float, rtol: float) -> Mismatch | None:
    """actual = α·expected + β for every entry (neither a pure factor nor a pure shift: those come first)."""
    if not (torch.isfinite(a).all() and torch.isfinite(e).all()) or e.numel() < 3 or float(e.std()) < 1e-9:
        return None
    design = torch.stack([e.flatten(), torch.ones(e.numel(), dtype=torch.float64)], 1)
    alpha, beta = (float(v) for v in torch.linalg.lstsq(design, a.flatten()[:, None]).solution.flatten())
    if abs(beta) <= atol or abs(alpha) <= 1e-6 or abs(alpha - 1) < 1e-6 or not same(a, alpha * e + beta, atol=atol, rtol=rtol):
        return None
    said = (f"{fmt(beta)} − the expected value" if abs(alpha + 1) < 1e-6 else
            f"{fmt(alpha)} × the expected value {'+' if beta > 0 else '−'} {fmt(abs(beta))}")
    if abs(alpha + 1) < 1e-6 and abs(beta - 1) < 1e-6:
        cause, fix = ("your values are the right ones subtracted from 1: a `1 −` too many, or one missing",
                      "remove the `1 −`, or add it where the docstring asks for the complement")
    elif abs(alpha + 1) < 1e-6:
        cause, fix = (f"your values are the right ones subtracted from {fmt(beta)}: a subtraction written the wrong "
                      "way round", "swap the two sides of that subtraction")
    else:
        cause, fix = (f"your values are the right ones times {fmt(alpha)}, {'plus' if beta > 0 else 'minus'} "
                      f"{fmt(abs(beta))}: a rescaling or a shift that the docstring does not have",
                      "find the step that rescales or shifts every value, and remove it")
    return Mismatch(f"every entry is {said}", _EXPECTED, cause, f"every value is {said}", fix)


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


def _difference(a: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """|a − e|: 0 where they are equal (equal infinities too), inf where either is NaN."""
    return torch.where(a == e, 0.0, (a - e).abs()).nan_to_num(nan=math.inf, posinf=math.inf)


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
        return f" only in the first {len(bad_rows)} rows" if len(bad_rows) > 1 else " only in the first row"
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
