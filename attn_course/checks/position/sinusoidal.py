"""sinusoidal_encoding: Vaswani et al.'s interleaved sin/cos, its known mistakes, and what a wrong encoding's
shape or frequencies are, measured."""

from __future__ import annotations

import torch

from .. import kit
from ..compare import Failure, as_tensor, call_or_skip, fail, fail_again, same
from ..core import Learner, check
from ..kit import Suspects, variants
from .judge import call, floating, frequency_cause, judge, kept_slice


def _sinusoid(n: int, d: int, base: float, mistake: str = "") -> torch.Tensor | None:
    if mistake in ("transposed", "extra_column"):
        return _sinusoid(n, d, base).T if mistake == "transposed" else _sinusoid(n, d + 1, base) if d % 2 else None
    p = torch.arange(n, dtype=torch.float64)[:, None] + (1 if mistake == "from1" else 0)
    base = 10000.0 if mistake == "base" else base
    cols = torch.arange(d, dtype=torch.float64)
    pair = torch.div(cols, 2, rounding_mode="floor")
    exponent = {"col": cols / d, "half": pair / d, "twocol": 2 * cols / d}.get(mistake, 2 * pair / d)
    angle = p * base ** exponent if mistake == "times" else p.expand(n, d) if mistake == "intdiv" else \
        p / base ** exponent  # intdiv: the exponent 2r // d is 0, every pair turns at frequency 1
    sin, cos = torch.sin(angle), torch.cos(angle)
    if mistake.startswith("halves"):  # tensor2tensor's layout: all sines, then all cosines (or the reverse)
        first, second = (cos, sin) if mistake == "halves_cos_first" else (sin, cos)
        return torch.cat([first[:, 0::2], second[:, 0::2][:, : d // 2]], dim=-1)
    even = cols % 2 == 0
    out = {"swapped": torch.where(even, cos, sin), "all_sin": sin, "all_cos": cos}.get(
        mistake, torch.where(even, sin, cos))
    if mistake == "odd_last_cos" and d % 2:
        out[:, -1] = cos[:, -1]
    return out


_SIN_FIX = "column 2r = sin(t / base^(2r/d)) and column 2r + 1 = cos(t / base^(2r/d)), with t = 0 … n − 1"
_HALVES = ("sin and cos in halves, not interleaved", "pe[:, 0::2] = sin(…) and pe[:, 1::2] = cos(…)")
_SIN_TABLE = variants(_sinusoid, [
    ("swapped", "sin and cos swapped", "your even columns hold cosines and the odd ones sines", _SIN_FIX),
    ("halves", _HALVES[0], "you put all the sines in the first half of the columns, then the cosines "
     "(tensor2tensor's layout); the docstring interleaves them", _HALVES[1]),
    ("halves_cos_first", _HALVES[0], "you put all the cosines in the first half of the columns, then the sines",
     _HALVES[1]),
    ("col", "cos columns use the exponent (2r + 1)/d", "your exponent is the column index over d: the cos column "
     "2r + 1 must share its sine's frequency", "both columns of pair r use base^(2r/d)"),
    ("half", "exponent r/d instead of 2r/d", "your frequencies use the pair index r over d", _SIN_FIX),
    ("twocol", "exponent 2j/d with j the column", "your exponent doubles the column index, not the pair index",
     _SIN_FIX),
    ("times", "multiplied by base^(2r/d) instead of dividing", "your angles grow with the dimension", _SIN_FIX),
    ("from1", "positions start at 1", "your first row is position 1; it is position 0 (sines 0, cosines 1)",
     _SIN_FIX),
    ("base", "base ignored", "your encoding uses 10000 whatever `base` is passed", "use the `base` argument"),
    ("intdiv", "every pair has frequency 1", "your exponent 2r/d came out 0 for every pair: integer division "
     "or integer tensors", "compute the exponent in floating point: torch.arange(0, d, 2) / d"),
    ("all_sin", "sines in every column", "your odd columns hold sines too; they hold cosines", _SIN_FIX),
    ("all_cos", "cosines in every column", "your even columns hold cosines too; they hold sines", _SIN_FIX),
    ("odd_last_cos", "odd d: the last column is a cosine", "with an odd d the last column, d − 1, is even: a sine",
     "fill the even columns with sines first; an odd d has one sine more"),
    ("extra_column", "one column too many for an odd d", "you returned d + 1 columns: the cosine of the last pair",
     "keep d columns: the last one (column d − 1, even) is a sine"),
    ("transposed", "rows and columns swapped", "your result has one row per dimension",
     "return (n, d): one row per position"),
])


def _sinusoid_measured(fn: Learner, failure: Failure, out: torch.Tensor, n: int, d: int, base: float) -> None:
    """Of a wrong shape: which slice it holds, or how its sizes follow n and d (a second call). Of the right shape:
    the frequencies, when the columns are sin and cos of t·ω_r with wrong ω; else which columns are wrong."""
    if failure.diagnosis.cause:
        return
    right = _sinusoid(n, d, base)
    if tuple(out.shape) != (n, d):
        kept_slice(failure, out, right, ("position", "column"))
        if out.dim() != 2 or n < 2 or d < 2:
            return
        other = call_or_skip(lambda: as_tensor(fn(n + 3, d + 4, base), tried=failure.diagnosis.tried))
        if other is None or other.dim() != 2 or tuple(other.shape) == (n + 3, d + 4):
            return
        said, follow = [], []
        for axis, what, size, name, rule in ((0, "rows", n, "n", "one row per position t = 0 … n − 1"), (
                1, "columns", d, "d", "d columns: sin and cos of each pair, interleaved")):
            if out.shape[axis] != size:
                said.append(f"{out.shape[axis]} {what} for {name} = {size} and {other.shape[axis]} for {name} = "
                            f"{size + (3 if axis == 0 else 4)}")
                follow.append(rule)
        fail(f"wrong shape {tuple(out.shape)}, expected {(n, d)}", tried=failure.diagnosis.tried, got=f"your "
             f"encoding of shape {tuple(out.shape)}", expected=f"shape {(n, d)}", cause="your encoding has " +
             " and ".join(said) + ", where the docstring asks for " + " and ".join(follow) + ": print the shape after "
             "each step to see where it departs from that", fix=_SIN_FIX)
    if n < 3 or d < 2:
        return
    x, pairs = out.double(), d // 2
    omega = torch.atan2(x[1, 0:2 * pairs:2], x[1, 1:2 * pairs:2])  # (pairs,): the angle at t = 1
    p = torch.arange(n, dtype=torch.float64)[:, None]
    fitted = torch.stack([torch.sin(p * omega), torch.cos(p * omega)], dim=-1).flatten(-2)  # (n, 2·pairs)
    if same(x[:, : 2 * pairs], fitted, atol=1e-4, rtol=1e-4) and bool((omega > 0).all()):
        expected = base ** (-2 * torch.arange(pairs, dtype=torch.float64) / d)
        fail_again(failure, "wrong frequencies", "your columns are sin and cos of t·ω_r pair by pair, as they should "
               "be, but with the " + frequency_cause(omega, expected, base, d), _SIN_FIX)
    good = torch.isclose(x, right, atol=1e-4, rtol=1e-4).all(0)  # (d,): the columns right everywhere
    if bool(good.any()):
        wrong = [j for j in range(d) if not good[j]]
        kinds = (("sine", [j for j in wrong if j % 2 == 0]), ("cosine", [j for j in wrong if j % 2]))
        said = " and ".join(f"the {k} column{'s' if len(js) > 1 else ''} {', '.join(map(str, js[:6]))}"
                            for k, js in kinds if js)
        fail_again(failure, f"wrong values in {len(wrong)} of {d} columns", f"your columns "
               f"{', '.join(str(j) for j in range(d) if good[j])} are right; {said} are not: look at the formula of "
               "those columns only (their frequency, or sin/cos)", _SIN_FIX)


@check("sinusoidal_encoding", expects="a function sinusoidal_encoding(n, d, base=10000.0) returning an (n, d) tensor")
def check_sinusoidal_encoding(fn: Learner) -> str:
    cases = [(6, 8, None), (12, 6, 100.0), (1, 4, None), (10, 7, None), (50, 16, None), (4, 2, 10.0), (9, 1, None),
             (20, 9, 500.0)]
    suspects, every = Suspects(_SIN_TABLE, atol=1e-4, rtol=1e-4), [(n, d, b or 10000.0) for n, d, b in cases]
    for (n, d, given), case in zip(cases, every):
        args = case if given else (n, d)
        tried = f"sinusoidal_encoding({', '.join(f'{a:g}' for a in args)})"
        odd = [("RuntimeError", r"size|shape|match", f"with an odd d = {d} there is one sine column more than "
                "cosine columns", "fill pe[:, 0::2] with sines and pe[:, 1::2] with the first d // 2 cosines")] \
            if d % 2 else []
        out = call(fn, args, tried, f"an ({n}, {d}) tensor", patterns=odd)
        floating(out, tried, "compute in floating point (torch.arange(n, dtype=torch.float32))")
        kit.half_rounded(out, _sinusoid(*case), tried=tried, what="your encoding", fix="compute the angles, sines and "
                         "cosines in float32 or float64: leave out .half() and .bfloat16()")
        judge(suspects, fn, out, _sinusoid(*case), case, tried, lambda f: _sinusoid_measured(fn, f, out, *case),
              what="your encoding", fix=_SIN_FIX, distinguish=every)
    return f"matches Vaswani et al.'s interleaved sin/cos on {len(cases)} cases (odd d, d = 1, other bases)"
