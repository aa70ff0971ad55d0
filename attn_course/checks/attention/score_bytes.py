"""check_score_matrix_bytes: a wrong formula is named only when it fits every case, else what is off is measured."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .. import kit
from ..compare import Failure
from ..core import Learner, as_tensor, check, fail


#: (n, batch, heads, dtype); None: the call leaves batch, heads and dtype at their defaults (1, 1, float32).
_BYTE_CASES = [(6, 1, 1, torch.float32), (10, 3, 5, torch.float16), (7, 3, 1, torch.float64), (5, 1, 2, torch.bfloat16),
               (4096, 1, 12, torch.float16), (1, 1, 1, torch.float32), (9, 6, 7, torch.float64), (11, None, None, None),
               (65537, 2, 8, torch.float32)]  # ≈ 2³⁸ bytes: past a 32-bit integer, and not exact in float32
_ELEMENT_FIX = "take the bytes per entry from the dtype: torch.empty((), dtype=dtype).element_size()"
_PLAIN, _E = "return the plain number of bytes", "the bytes per entry"
#: A KeyError naming a dtype: a dict of bytes per dtype, one missing (its key shown without the quotes).
_NO_DTYPE_ENTRY = ("KeyError", r"(?s)^'*(.*?torch\..*?)'*$", "a table of bytes per dtype that has no entry for {1}",
                   _ELEMENT_FIX + " (it knows every dtype)")


def _shifted(k: int) -> str:
    return "n" if k == 0 else f"(n {'+' if k > 0 else '−'} {abs(k)})"


def _entries(a: int, c: int) -> str:
    """(n + a)(n + c) as written: n(n + 1), (n − 1)², (n − 1)(n + 1) = n² − 1."""
    if a == c:
        return f"{_shifted(a)}²"
    if 0 in (a, c):
        return f"n{_shifted(a or c)}"
    return f"{_shifted(a)}{_shifted(c)}" + (f" = n² − {c * c}" if a == -c else "")


def _routes(a: int, c: int) -> str:
    """How a count of (n + a)(n + c) comes about: a side off, or n² with a term added or taken away."""
    sides = "a side off by one or two (n + 1, n − 1…)"
    return {(-1, 0): "the diagonal left out (n * n - n), or " + sides, (0, 1): "the diagonal counted twice "
            "(n * n + n), or " + sides}.get((a, c), f"{c * c} subtracted from n², or sides off in opposite directions"
                                           if a == -c else sides)


_SIZES = "the score tensor has batch × heads matrices of n × n entries"
#: Counts off by one (or two): n ± 1 for a side of the matrix, batch ± 1 or heads ± 1 matrices.
_OFF_BY_ONE = [
    *[(f"{_entries(a, c)} entries per matrix, not n²", f"you counted {_entries(a, c)} entries in each score matrix: "
       + _routes(a, c) + " where the matrix has n rows and n columns",
       "each matrix is n × n: batch * heads * n * n * dtype.itemsize",
       lambda n, b, h, e, a=a, c=c: b * h * (n + a) * (n + c) * e)
      for a in (-2, -1, 0, 1, 2) for c in (-2, -1, 0, 1, 2) if a <= c and (a, c) != (0, 0)],
    *[(f"{name} {sign} 1 for {name}", f"you multiplied by {name} {sign} 1, not by {name}: an off-by-one in the "
       "number of score matrices", f"{_SIZES}: batch * heads * n * n * dtype.itemsize",
       lambda n, b, h, e, k=k, on=on: (b + k * (on == 0)) * (h + k * (on == 1)) * n * n * e)
      for on, name in enumerate(("batch", "heads")) for k, sign in ((-1, "−"), (1, "+"))],
]
#: Wrong formulas of (n, batch, heads, bytes per entry e): (summary, cause, fix, formula).
_BYTE_MISTAKES = [
    ("bits, not bytes", f"you counted bits: {_E} times 8", "leave out the factor 8",
     lambda n, b, h, e: 8 * b * h * n * n * e),
    ("batch size missing", "you left out the batch size", "multiply by batch", lambda n, b, h, e: h * n * n * e),
    ("number of heads missing", "you left out the number of heads", "multiply by heads",
     lambda n, b, h, e: b * n * n * e),
    ("n instead of n × n", "you counted n entries per matrix, not n × n", "the score matrix is n × n: square n",
     lambda n, b, h, e: b * h * n * e),
    ("n³ instead of n²", "you multiplied by n once too often", "the score matrix has n × n entries",
     lambda n, b, h, e: b * h * n ** 3 * e),
    ("entries, not bytes", "you returned the number of entries", f"multiply by {_E}", lambda n, b, h, e: b * h * n * n),
    ("batch counted twice", "you multiplied by the batch size twice", "multiply by batch once",
     lambda n, b, h, e: b * b * h * n * n * e),
    ("heads counted twice", "you multiplied by the number of heads twice", "multiply by heads once",
     lambda n, b, h, e: b * h * h * n * n * e),
    *[(f"{k} bytes per entry assumed", f"you used {k} bytes per entry whatever the dtype", _ELEMENT_FIX,
       lambda n, b, h, e, k=k: b * h * n * n * k) for k in (2, 4, 8)],
    (f"divided by {_E}", f"you divided by {_E} instead of multiplying", f"multiply by {_E}",
     lambda n, b, h, e: b * h * n * n / e),
    ("n × n missing", "you left out the n × n entries of each matrix", "multiply by n * n",
     lambda n, b, h, e: b * h * e),
    ("batch and heads missing", "you counted one (n, n) matrix, not batch × heads of them",
     "multiply by batch and by heads", lambda n, b, h, e: n * n * e),
    ("2 × n instead of n × n", "you doubled n (n * 2) where the matrix has n × n entries (n ** 2)",
     "the score matrix is n × n: n * n or n ** 2", lambda n, b, h, e: b * h * 2 * n * e),
    ("only one triangle counted", "you counted n(n + 1)/2 entries, one triangle with its diagonal; the score tensor "
     "holds all n × n entries, masked or not", "count every entry: n * n",
     lambda n, b, h, e: b * h * (n * (n + 1) // 2) * e),
    ("one triangle without the diagonal counted", "you counted n(n − 1)/2 entries, one triangle without its "
     "diagonal; the score tensor holds all n × n entries, masked or not", "count every entry: n * n",
     lambda n, b, h, e: b * h * (n * (n - 1) // 2) * e),
    *_OFF_BY_ONE,
    *[(f"bytes in {unit}, not bytes", f"you converted to {long} (÷ {shown})", _PLAIN,
       lambda n, b, h, e, d=d: b * h * n * n * e / d) for unit, long, shown, d in (
        ("GB", "gigabytes", "10⁹", 1e9), ("GiB", "gibibytes", "2³⁰", 2**30), ("MiB", "mebibytes", "2²⁰", 2**20),
        ("KiB", "kibibytes", "1024", 1024), ("MB", "megabytes", "10⁶", 1e6), ("kB", "kilobytes", "1000", 1e3))],
    *[(f"bytes in {unit}, not bytes", f"you converted to {long} with //, which also rounds down", _PLAIN,
       lambda n, b, h, e, d=d: b * h * n * n * e // d) for unit, long, d in (("KiB", "kibibytes", 1024),
                                                                                ("MiB", "mebibytes", 2**20))],
]


def _bytes_of(fn: Learner, n: int, b: int | None, h: int | None, dtype: torch.dtype | None) -> tuple[str, Any, float]:
    """(tried, the learner's raw answer, as a float) for one case; a Failure for an exception or a non-number."""
    tried = (f"score_matrix_bytes({n}) with the defaults batch=1, heads=1, dtype=torch.float32" if dtype is None
             else f"score_matrix_bytes({n}, batch={b}, heads={h}, dtype={dtype})")
    raw = kit.call_explained(lambda: fn(n) if dtype is None else fn(n, batch=b, heads=h, dtype=dtype), tried=tried,
                             expected="a number of bytes (an int)", patterns=[_NO_DTYPE_ENTRY])
    got = as_tensor(raw, tried=tried, expected="a number of bytes (an int)")
    if got.numel() != 1:
        fail("returned a tensor, not one number", tried=tried, got=f"a tensor of shape {tuple(got.shape)}",
             expected="one number of bytes (an int)", fix="return an int, e.g. with .item() or plain arithmetic")
    return tried, raw, got.to(torch.float64).item()


@check("score_matrix_bytes",
       expects="a function score_matrix_bytes(n, batch=1, heads=1, dtype=torch.float32) returning a number of bytes")
def check_score_matrix_bytes(fn: Learner) -> str:
    runs = []  # (n, batch, heads, dtype, expected bytes, bytes per entry, (tried, raw, got) or the Failure)
    for n, b, h, dtype in _BYTE_CASES:  # every case first: a formula is named only when it fits them all
        bb, hh, dd = b or 1, h or 1, dtype or torch.float32
        # Oracle: the nbytes of a real (batch, heads, n, n) tensor on the meta device (nothing is allocated).
        row = (n, bb, hh, dd, torch.empty(bb, hh, n, n, dtype=dd, device="meta").nbytes, dd.itemsize, dtype)
        try:
            runs.append((*row, _bytes_of(fn, n, b, h, dtype)))
        except Failure as failure:  # reported after any wrong count on an earlier case
            runs.append((*row, failure))
            break
    counted = [r for r in runs if not isinstance(r[-1], Failure)]
    every = [m for m in _BYTE_MISTAKES if all(math.isclose(r[-1][2], m[3](*r[:3], r[5]), rel_tol=1e-9)
                                               for r in counted if r[6] is not None)]
    ratios = {round(r[-1][2] / r[4], 9) for r in counted}
    for n, b, h, dtype, expected, element, given, answer in runs:
        if isinstance(answer, Failure):
            raise answer
        tried, raw, got = answer
        if got == expected:
            _expect_int(raw, tried, expected)
            continue
        found = [m for m in every if m[3](n, b, h, element) != expected]
        summary, cause, fix = found[0][:3] if len(found) == 1 else (f"{got:.10g} bytes, expected {expected}", "", "")
        if not found:
            name, per_entry = str(dtype).replace("torch.", ""), got / (b * h * n * n)
            summary, cause, fix = (_bytes_ratio(got / expected) if len(ratios) == 1 else None) or (
                (f"{per_entry:g} bytes per {name} entry, not {element}", f"you counted {per_entry:g} bytes per entry "
                 f"for {name}, which takes {element}", _ELEMENT_FIX) if per_entry in (1, 2, 4, 8, 16) and
                per_entry != element else _bytes_ratio(got / expected)) or (summary, cause, fix)
        if not found and expected >= 2 ** 31 and (got < 0 or (got - expected) % 2 ** 32 == 0):
            summary, cause, fix = ("overflowed a 32-bit integer", "your count went through a 32-bit integer (np.int32, "
                                   "torch.int32, or NumPy's default int on Windows before NumPy 2), which wraps round "
                                   "past 2³¹ − 1 ≈ 2.1 GB", "count with Python ints: batch * heads * n * n * "
                                   "dtype.itemsize")
        if not found and got.is_integer() and 0 < abs(got - expected) <= 1e-6 * expected:  # a float32 count
            summary, cause, fix = ("count rounded by float32", f"your count is off by {abs(got - expected):.0f} bytes: "
                                   "it went through float32 (or a narrower float), which keeps about 7 significant "
                                   "digits", "count with Python ints: batch * heads * n * n * dtype.itemsize")
        if given is None and not found:  # every case with explicit arguments passed: only the defaults differ
            summary, cause, fix = ("wrong default arguments", "with only n given, your function does not count "
                                   "batch=1, heads=1, dtype=torch.float32", "keep the defaults of the signature: "
                                   "score_matrix_bytes(n, batch=1, heads=1, dtype=torch.float32)")
        fail(summary, tried=tried, got=f"{got:.0f}" if got.is_integer() else f"{got:.10g}", cause=cause,
             expected=f"{expected} bytes (batch × heads × n × n × bytes per entry)",
             fix=fix or "multiply batch × heads × n × n × the bytes of one entry")
    return f"exact on {len(_BYTE_CASES)} cases (float16, bfloat16, float32, float64; batch, heads, defaults)"


def _expect_int(raw, tried: str, expected: int) -> None:
    """The docstring asks for an int: a float (even a whole one) or a tensor is named as such."""
    if isinstance(raw, (int, np.integer)) and not isinstance(raw, (bool, np.bool_)):
        return
    kind = ("a float" if isinstance(raw, (float, np.floating)) else "a NumPy array" if isinstance(raw, np.ndarray)
            else f"a {type(raw).__name__}")
    if isinstance(raw, torch.Tensor):
        kind = f"{'an' if str(raw.dtype)[6] in 'aeiou' else 'a'} {str(raw.dtype)[6:]} tensor"
    fail(f"returned {kind}, not an int", tried=tried, got=f"{kind} equal to {expected}", expected=f"the int {expected}",
         cause="a / division, math.pow, math.sqrt or a float factor makes a float; a tensor stays a tensor"
         if kind == "a float" else "the count was computed with tensor operations, which return a tensor",
         fix="count with ints: // instead of /, ** instead of math.pow; .item() or int(…) for a one-number tensor")


def _bytes_ratio(ratio: float) -> tuple[str, str, str] | None:
    """A count off by the same whole-number factor on every case."""
    for r, many in ((ratio, True), (1 / ratio if ratio else 0, False)):
        if r > 1.5 and abs(r - round(r)) < 1e-9:
            k, whose = round(r), "the right one" if many else "smaller than the right one"
            return (f"{k} times {'too many' if many else 'too few'} bytes", f"your count is {k} times {whose}: your "
                    f"formula has a factor {k} {'too many' if many else 'missing'}", "")
    return None
