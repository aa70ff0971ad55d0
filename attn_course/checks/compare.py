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
    "Mismatch",
    "same",
    "fmt",
    "explain_exception",
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
        return "the right number of entries in the wrong shape: a reshape or view to the wrong sizes"
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
                            f"{str(expected.dtype).replace('torch.', '')}, as the input",
                            f"your computation converted to {dtype} (.half() or dtype={dtype})", f"result in {dtype}",
                            f"compute in the input's dtype: leave out .half(), .to(torch.{dtype}) or dtype={dtype}")
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
    worst = _worst_index(a, e)
    detail = (f"largest difference {fmt(float((a - e).abs().nan_to_num(nan=math.inf)[worst]))} at index {worst}: "
              f"got {fmt(float(a[worst]))}, expected {fmt(float(e[worst]))}")
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
        return f" only in the first {len(bad_rows)} rows" if len(bad_rows) > 1 else " only in the first row"
    if len(bad_cols) < n_cols and bad_cols == list(range(bad_cols[0], n_cols)):
        return f" only from column {bad_cols[0]} on"
    if len(bad_rows) < n_rows:
        return f" only in row{'s' if len(bad_rows) > 1 else ''} {', '.join(map(str, bad_rows[:6]))}" + (
            "…" if len(bad_rows) > 6 else "")
    return ""


# ============================================================================ what an exception means
#: (type, pattern of the message, cause, fix): what the errors learners' tensor code raises most often mean.
#: Groups of the pattern may be used in the cause and fix ({1}, {2}...). Checked in order; the first match wins.
_EXCEPTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("NameError", r"name '(\w+)' is not defined",
     "`{1}` is used before anything is assigned to it: the line that computes it is missing, comes later, or "
     "spells the name differently",
     "compute `{1}` before the line that uses it (or correct the spelling)"),
    ("UnboundLocalError", r"'?(\w+)'? (?:referenced before assignment|where it is not associated with a value)",
     "`{1}` is used before anything is assigned to it: the line that computes it is missing or comes later",
     "compute `{1}` before the line that uses it"),
    ("NameError", r"cannot access free variable '(\w+)'",
     "`{1}` is used (in a generator expression or inner function) before anything is assigned to it",
     "compute `{1}` before the line that uses it"),
    ("RuntimeError", r"upper bound and lower bound inconsistent with step sign",
     "a torch.arange(start, end, step) whose step leads away from end: its arguments are in another order, or start "
     "lies beyond end", "print the arange's arguments: it counts from start up to end (excluded)"),
    ("RuntimeError", r"step must be nonzero", "a step of 0 in torch.arange or a slice",
     "use a step of 1 (or 2 to take every other one)"),
    ("RuntimeError", r"Boolean value of Tensor", "Python asked a tensor of several values for one True/False (`if`, "
     "`while`, `and`, `or`, `not`, any(...) over tensors): it has none",
     "reduce the comparison to one bool first: torch.equal(a, b), torch.allclose(a, b) or (a == b).all(); test for "
     "None with `is not None`"),
    ("RuntimeError", r"If you are trying to invert a mask", "- does not negate a bool mask",
     "negate it with ~mask (or mask.logical_not())"),
    ("RuntimeError", r"atol must be greater than or equal to zero", "a negative tolerance", "use atol=1e-5"),
    ("RuntimeError", r"clamp: At least one of 'min' or 'max' must not be None",
     "clamp() was called with neither min nor max (a clamp without its bound), so it has no bound to apply",
     "give the bound: .clamp(min=0) or .clamp(max=B - 1)"),
    ("RuntimeError", r"permute\(\): duplicate dims", "a permute that names one axis twice: each axis must appear "
     "exactly once", "list every axis once: .permute(2, 0, 1) turns (n, n, A) into (A, n, n)"),
    ("RuntimeError", r"diagonal dimensions cannot be identical (-?\d+), (-?\d+)",
     "diagonal() was given one axis twice: dim1 = {1} and dim2 = {2} are the same axis, and a diagonal runs over two "
     "different axes", "take the diagonal over the last two axes: w.diagonal(dim1=-2, dim2=-1)"),
    ("RuntimeError", r"Sizes of tensors must match except in dimension (-?\d+)", "torch.cat joins tensors along "
     "axis {1}, and every other axis must agree: they do not (the join is along another axis than meant, or "
     "one tensor lost or gained an axis)", "print the shapes you join, and join along the axis the docstring grows"),
    ("RuntimeError", r"The expanded size of the tensor \((-\d+)\) must match", "you gave expand the size {1}: "
     "expand takes the new size of each axis, or -1 to keep one as it is; no other negative number",
     "write -1 for each axis that keeps its size, and the size itself (e.g. T) for the axis you expand"),
    ("TypeError", r"bad operand type for unary ~: 'NoneType'", "`~` applied to None: the mask is None (its "
     "default) and was inverted without a test", "test `if mask is not None:` before using the mask"),
    ("TypeError", r"tuple of ints,? ?but (?:got|found element of type) float",
     "a size that is a float where PyTorch needs whole numbers: `/` always gives a float (12 / 3 is 4.0)",
     "compute sizes with integer division, `//` (or int(...))"),
    ("TypeError", r"'([<>=!]+)' not supported between instances of '([\w.]+)' and '([\w.]+)'",
     "a comparison ({1}) between values of types {2} and {3}: one side is not the number or tensor it should be (a "
     "name holds a {2})", "print the value of both sides on the line shown"),
    ("AttributeError", r"'torch.Size' object has no attribute '(\w+)'", "you called .{1} on a shape (a torch.Size, "
     "such as mask.shape), which is a tuple of sizes, not a tensor",
     "make a tensor of that shape first: torch.zeros(mask.shape, dtype=dtype).{1}(…)"),
    ("RuntimeError", r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) at non-singleton dimension (\d+)",
     "two tensors combined entry by entry (+, −, ×, ÷, where) have shapes that do not fit together: sizes {1} and {2} "
     "meet on one axis, so the two operands' axes do not line up (an axis lost or added on the way, or axes in "
     "another order)",
     "print the shapes of both operands on the line shown and make their axes line up"),
    ("RuntimeError", r"mat1 and mat2 shapes cannot be multiplied \((\w+) and (\w+)\)",
     "a matrix product whose inner sizes differ ({1} @ {2}): an operand is transposed the wrong way, or the "
     "product is written in the wrong order",
     "for A @ B the last size of A must equal the first (matrix) size of B: transpose the right operand, or swap them"),
    ("RuntimeError", r"(?:Expected size for first two dimensions of batch2 tensor|batch1 and batch2 shapes cannot be "
                     r"multiplied|shapes cannot be multiplied|size mismatch)",
     "a matrix product whose inner sizes differ: an operand is transposed the wrong way, or the product is "
     "written in the wrong order", "print both operands' shapes; for A @ B the last size of A must equal B's "
     "second-to-last"),
    ("IndexError", r"Dimension out of range \(expected to be in range of \[(-?\d+), (-?\d+)\], but got (-?\d+)\)",
     "an axis number the tensor does not have (axis {3}, where it has axes {1} to {2}): the tensor has fewer "
     "axes than the code expects (one was removed earlier), or the axis number is wrong",
     "print the tensor's shape on the line shown and use an axis it has (−1 is the last)"),
    ("RuntimeError", r"The expanded size of the tensor \((\d+)\) must match the existing size \((\d+)\) at "
                     r"non-singleton dimension (\d+)",
     "a tensor of size {2} on one axis is broadcast into (or assigned to) a place of size {1} there: the value "
     "written into a slice (x[...] = value) and the slice have different shapes, or an .expand to other sizes",
     "print the shapes of the slice and of the value on the line shown and make them agree"),
    ("RuntimeError", r"expand\([^)]*\): the number of sizes provided \((\d+)\) must be greater or equal to the "
                     r"number of dimensions in the tensor \((\d+)\)",
     "a tensor with {2} axes is broadcast into (or assigned to) a place with only {1}: the value written into a "
     "slice (x[...] = value) has more axes than the slice (an axis not summed away, or a keepdim=True too many)",
     "print the shapes of the slice and of the value on the line shown and make them agree"),
    ("RuntimeError", r"both arguments to matmul need to be at least 1D, but they are (\d)D and (\d)D",
     "a matrix product with a 0-D operand (a single number, {1}-D @ {2}-D): @ needs vectors or matrices on both "
     "sides, so a step reduced a tensor to one number (a sum over every axis?) or a number stands where a tensor "
     "was meant", "print both operands' shapes; for a number times a tensor use *"),
    ("RuntimeError", r"stack expects a non-empty TensorList",
     "torch.stack got an empty list: nothing was appended to it (the append is missing, or the loop never ran)",
     "append each result inside the loop, and check that the loop runs over every item"),
    ("RuntimeError", r"stack expects each tensor to be equal size",
     "torch.stack got tensors of different shapes: the items collected in the loop differ in shape",
     "make every item the same shape before stacking (print their shapes)"),
    ("TypeError", r"unsupported operand type\(s\) for ([^:]+): '(torch\.Size|tuple)' and '(torch\.Size|tuple)'",
     "an operation ({1}) between two shapes (a torch.Size is a tuple of sizes): shapes are not numbers, the only "
     "arithmetic they take is + (joining them) and * by an integer (repeating them)",
     "join shapes with + (q.shape[:-1] + (d,)); to compute with sizes, pick them out first (q.shape[-1])"),
    ("TypeError", r"can only concatenate tuple \(not \"?(\w+)\"?\) to (?:torch\.Size|tuple)",
     "a shape (a torch.Size, a tuple of sizes) + a {1}: + joins a shape only to another tuple, so one side holds a "
     "shape where a tensor was meant (a torch.zeros(shape) left out?) or the reverse",
     "print the type of both sides on the line shown"),
    ("TypeError", r"'([\w.]+)' object does not support item assignment",
     "an assignment into an entry of a {1}, which cannot be changed: the name holds a {1} where a tensor was meant "
     "(a torch.zeros(shape) or torch.empty(shape) left out?)",
     "print the type of the value you assign into on the line shown; create the tensor first"),
    ("TypeError", r"slice indices must be integers",
     "a slice bound that is not an integer: a / division (which gives a float) or a tensor where a[i:j] needs ints",
     "compute slice bounds with integers only (// for division, int(...) around a tensor)"),
    ("TypeError", r"only integer tensors of a single element can be converted to an index",
     "a tensor used as an index, a slice bound or a size where Python needs one integer: the tensor is a float "
     "tensor or holds more than one number",
     "print the value on the line shown: where an index or size is needed, pass a Python int"),
    ("TypeError", r"(\w+)\(\): argument '(\w+)' \(position (\d+)\) must be ([\w. ]+), not ([\w.]+)",
     "{1}() got a {5} as its argument `{2}` (position {3}), which must be {4}: a name holds something other than "
     "you think, or the arguments are in another order",
     "compare the call on the line shown with {1}'s documentation and print the argument"),
    ("TypeError", r"unsupported operand type\(s\) for ([^:]+): '([\w.]+)' and '([\w.]+)'",
     "an operation ({1}) between {2} and {3} values: one side is not the tensor it should be (a step that should "
     "produce a tensor gave a plain number, a shape or None)",
     "print the type of both sides on the line shown; each must be a tensor"),
    ("TypeError", r"'(\w+)' object is not (?:callable|subscriptable|iterable)",
     "a value of type {1} used as if it were a function, a tensor or a list: a name holds something other than "
     "you think",
     "print the value on the line shown and check which name holds it"),
    ("TypeError", r"(\w+)\(\) (?:missing \d+ required|takes \d+ positional|got an unexpected keyword|received an "
                  r"invalid combination)",
     "{1}() was called with arguments it does not take (a wrong number, order or name of arguments)",
     "compare the call on the line shown with {1}'s documentation"),
    ("IndexError", r"(\w+)\(\): Expected reduction dim (-?\d+) to have non-zero size",
     "{1}() over axis {2}, which has size 0: the tensor is empty along it, so a slice selected nothing (bounds "
     "past the end, or start ≥ stop)",
     "print the shape of the tensor on the line shown and check the slice bounds that built it"),
    ("IndexError", r"index (-?\d+) is out of bounds for dimension (\d+) with size (\d+)",
     "an index ({1}) past the end of an axis of size {3}: a loop or index runs one step too far",
     "make the loop or index stop before the axis's size (range(n) ends at n − 1)"),
    ("IndexError", r"(?:list index out of range|index out of range|too many indices)",
     "an index past the end of a list or tensor (or more indices than it has axes)",
     "print the length or shape of what you index on the line shown"),
    ("RuntimeError", r"(?:shape '\[[^\]]*\]' is invalid for input of size \d+|view size is not compatible)",
     "a view or reshape to sizes that do not hold the tensor's entries (or a .view of a transposed tensor)",
     "check the sizes you reshape to (their product must be the number of entries); after a transpose use .reshape"),
    ("RuntimeError", r"(?:expected (?:scalar type|m1 and m2 to have the same dtype|both vectors to have same dtype)|"
                     r"dtype|Found dtype)",
     "two tensors of different dtypes (e.g. float32 and float64, or an integer tensor) meet in one operation",
     "create new tensors with the inputs' dtype (dtype=x.dtype), and keep every step in floating point"),
    ("RuntimeError", r"(?:number of dims|dimension specified as|Expected \d+-dimensional|must be a matrix|"
                     r"1D tensors expected|expected 2D)",
     "a function got a tensor with a different number of axes than it takes (torch.dot and torch.mm take 1-D and "
     "2-D tensors only)", "use @ (torch.matmul), which handles any number of leading axes, or reshape first"),
    ("RuntimeError", r"(?:a leaf Variable that requires grad|modified by an inplace operation)",
     "an in-place change (+=, [...] =, .add_) of a tensor that autograd still needs",
     "write the step out of place (x = x + y), or work on a copy"),
    ("ZeroDivisionError", r".*", "a division by zero: a count or a size that is 0 here",
     "check what you divide by on the line shown"),
    ("RecursionError", r".*", "the function calls itself without end", "remove the call of the function inside itself"),
    ("AttributeError", r"module '([\w.]+)' has no attribute '(\w+)'",
     "{1}.{2} does not exist: the module {1} has nothing named {2} (misspelt, or it belongs to another module: "
     "torch has functions that math does not)",
     "look the function up in the module's documentation, or use the torch function of that name"),
    ("AttributeError", r"'(\w+)' object has no attribute '(\w+)'",
     "`.{2}` used on a value of type {1}, which has no such attribute: a value is not the type you expect (or the name is "
     "misspelt)", "print the value on the line shown; check its type and the attribute's spelling"),
    ("ValueError", r"(?:too many values to unpack|not enough values to unpack)",
     "an unpacking (a, b = ...) of something with a different number of items", "check how many items the "
     "right-hand side holds"),
)


def explain_exception(type_name: str, message: str) -> tuple[str, str] | None:
    """(cause, fix) for an exception the learner's code raised, when its type and message say what it means
    (a shape mismatch, an axis that does not exist, a name used before it is assigned...); None otherwise."""
    import re

    for kind, pattern, cause, fix in _EXCEPTIONS:
        if kind != type_name:
            continue
        match = re.search(pattern, message or "")
        if match:
            groups = [match.group(0), *match.groups()]
            fill = lambda text: re.sub(r"\{(\d)\}", lambda m: str(groups[int(m.group(1))] or ""), text)  # noqa: E731
            return fill(cause), fill(fix)
    return None


def call_or_skip(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` and return its value, or None when it raises (for optional oracle computations)."""
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return None
