"""Checks for notebook 12 (position): is_permutation_equivariant (a test the learner writes), sinusoidal_encoding,
relative_position_bias, alibi_bias, apply_rope, rope_decode_step and additive_attention.

The learner's test runs learner-side (probe ``position.permutation_test``) under fixed seeds on six functions that treat
positions alike and five that see them; the pattern of its verdicts names its flaw. The others compare in float64 with
the conventions' formulas (held to ``attn_course.position`` and Hugging Face's T5 by ``tests/test_position.py``), name
a :class:`~.kit.Known` mistake, or else measure what the answer is (frequencies, slopes…).
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any, Callable

import numpy as np
import torch

from .. import position as ref
from . import kit
from .boundary import Opaque, probe
from .compare import Failure, as_tensor, call_or_skip, expect_shape, fail, fmt, same
from .core import Learner, check
from .kit import Known, Suspects

__all__ = ["check_is_permutation_equivariant", "check_sinusoidal_encoding", "check_relative_position_bias",
           "check_alibi_bias", "check_apply_rope", "check_rope_decode_step", "check_additive_attention"]


# ================================================================================== shared
#: torch.cat's complaint, explained better here than by the course-wide table: (type, regex, cause, fix).
PATTERNS = [("RuntimeError", r"Sizes of tensors must match except in dimension (-?\d+)", "torch.cat along axis {1} "
             "needs every other axis to agree: a join along the wrong axis, or a tensor that lost or gained an axis",
             "print the shapes you join; join the positions with dim=-2")]


def _call(fn: Learner, args: tuple, tried: str, expected: str, constructs=(), patterns=(), tensor=True) -> Any:
    """The learner's ``fn(*args)`` (as a tensor unless ``tensor`` is False), its exception explained."""
    out = kit.call_explained(fn, *args, tried=tried, expected=expected, constructs=constructs,
                             patterns=[*patterns, *PATTERNS])
    return as_tensor(out, tried=tried) if tensor else out


def _table(rows: list[tuple[str, str, str, str]], variant: Callable[..., Any]) -> list[Known]:
    """Known mistakes whose output is ``variant(*case, key)``."""
    return [Known(key, s, c, f, lambda *case, key=key: variant(*case, key)) for key, s, c, f in rows]


def _refine(failure: Failure, summary: str, cause: str, fix: str) -> None:
    """End the check with ``failure``'s measurement lines and a cause that a measurement found."""
    d = failure.diagnosis
    fail(summary, tried=d.tried, got=d.got, expected=d.expected, cause=cause, fix=fix)


def _kept_slice(failure: Failure, out: torch.Tensor, expected: torch.Tensor, names: tuple[str, ...]) -> None:
    """When ``out`` has size 1 on axes where ``expected`` is longer and equals ``expected`` at one index of them,
    say which slice the answer holds (``names``: each axis in the singular)."""
    axes = [a for a in range(out.dim()) if out.dim() == expected.dim() and out.shape[a] == 1 < expected.shape[a]]
    if failure.diagnosis.cause or not axes or not out.is_floating_point() or \
            any(out.shape[a] != expected.shape[a] for a in range(out.dim()) if a not in axes):
        return
    for index in itertools.product(*(range(expected.shape[a]) for a in axes)):
        at = dict(zip(axes, index))
        part = expected[tuple(slice(at[a], at[a] + 1) if a in at else slice(None) for a in range(out.dim()))]
        if same(out.double(), part.double(), atol=1e-5, rtol=1e-4):
            where = " and ".join(f"{names[a]} {i}" for a, i in at.items())
            lost = " and ".join(f"axis {a} ({expected.shape[a]} {names[a]}s)" for a in axes)
            _refine(failure, f"only {where} computed", f"your result holds the right values for {where} alone: "
                    f"{lost} came out of size 1, so the values for every other {names[axes[0]]} were never computed",
                    "keep that axis at its full size: print the shape after each step to find where it becomes 1")


def _floating(out: torch.Tensor, tried: str, fix: str) -> None:
    if not out.is_floating_point():
        kind = str(out.dtype)[6:]
        fail(f"integer result ({kind})", tried=tried, got=kind, expected="a floating-point tensor",
             cause="integer tensors (torch.arange(n) is int64) or a // made your arithmetic drop the fractions",
             fix=fix)


def _judge(suspects: Suspects, fn: Learner, out: torch.Tensor, expected: torch.Tensor, case: tuple, tried: str,
           measure: Callable[[Failure], None], **compare: Any) -> None:
    """``suspects.expect`` on one case (re-running ``fn`` to tell mistakes apart); ``measure(failure)`` may say more."""
    try:
        suspects.expect(out, expected, case, tried=tried, again=lambda *c: as_tensor(fn(*c), tried=tried), **compare)
    except Failure as failure:
        measure(failure)
        raise


# ================================================================================== the learner's test
SEED = 12  #: torch's, NumPy's and Python's seed while the learner's test runs


@probe("position.permutation_test")
def _run_test(test: Callable[..., Any], variant: str) -> dict[str, Any]:
    """Learner side: the learner's test on one attention variant: its verdict, whether an ``assert`` failed, and
    what it passed to attn."""
    attn, calls = ref.attention_variant(variant), []

    def watched(x):
        if (isinstance(x, torch.Tensor) or isinstance(x, np.ndarray) and x.dtype.kind == "f") and len(calls) < 50:
            t = torch.from_numpy(np.array(x, dtype=np.float64)) if isinstance(x, np.ndarray) else x.detach()
            x_ = t.double() if t.is_floating_point() else None
            calls.append({"shape": list(x.shape), "absmax": float(x_.abs().max()) if x_ is not None and x_.numel()
                          else 0.0})
            if len(calls) <= 8 and x_ is not None and x_.numel() <= 4096:
                calls[-1]["x"] = x_.clone()
        return attn(x)

    watched.__name__ = attn.__name__
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        with torch.random.fork_rng(devices=[]):  # the learner's unseeded draws: the same every run
            torch.manual_seed(SEED)
            np.random.seed(SEED)
            random.seed(SEED)
            verdict = test(watched)
    except AssertionError:
        return {"verdict": False, "asserted": True, "calls": calls}
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    if isinstance(verdict, torch.Tensor) and verdict.numel() == 1:
        verdict = bool(verdict.item()) if verdict.dtype == torch.bool else verdict.item()
    return {"verdict": verdict, "asserted": False, "calls": calls}


def _as_verdict(verdict: Any, tried: str) -> bool:
    """True (equivariant) or False; None counts as a pytest-style pass."""
    if verdict is None or isinstance(verdict, (bool, np.bool_)) or isinstance(verdict, (int, np.integer)) and \
            verdict in (0, 1):
        return verdict is None or bool(verdict)
    got = verdict.text if isinstance(verdict, Opaque) else repr(verdict)[:60]
    many = isinstance(verdict, torch.Tensor) and verdict.numel() > 1
    fail("the test did not return True or False", tried=tried, got=f"{type(verdict).__name__}: {got}",
         expected="True (equivariant) or False (not)",
         cause=f"your test returns a tensor of shape {tuple(verdict.shape)}: an output or an entry-by-entry "
               "comparison, where torch.allclose gives one bool" if many else "",
         fix="end with `return torch.allclose(...)` (a bool), or assert it pytest-style")


def _row_permutation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """perm with b = a[..., perm, :], when b reorders a's (distinct) rows and is not a itself; else None."""
    if a.shape != b.shape or a.dim() < 2 or a.shape[-2] < 2:
        return None
    rows_a, rows_b = (t.movedim(-2, 0).reshape(t.shape[-2], -1) for t in (a, b))  # (n, rest)
    perm = [(rows_a == row).all(-1).nonzero().flatten() for row in rows_b]
    if torch.equal(rows_a, rows_b) or any(len(p) != 1 for p in perm) or len({int(p) for p in perm}) < len(perm):
        return None
    return torch.tensor([int(p) for p in perm])


def _evidence(runs: list[list[dict]]) -> dict[str, Any]:
    """What the inputs passed to attn show over all runs: identical rows, one input only, a reordering of a
    batch axis, or a true reordering of one x's tokens (x and perm)."""
    xss = [[c["x"] for c in calls if isinstance(c.get("x"), torch.Tensor) and c["x"].dim() >= 2] for calls in runs]
    found: dict[str, Any] = {
        "identical": bool(xss) and all(xs and all(x.shape[-2] > 1 and bool((x == x[..., :1, :]).all()) for x in xs)
                                       for xs in xss),
        "single": bool(xss) and all(xs and all(x.shape == xs[0].shape and torch.equal(x, xs[0]) for x in xs)
                                    for xs in xss)}
    for xs in xss:
        pairs = [(a, b) for i, a in enumerate(xs) for b in xs[i + 1:]]
        for a, b in pairs:  # a reordering of a leading (batch) axis instead of the tokens
            if a.dim() >= 3 and a.shape == b.shape and not torch.equal(a, b) and \
                    _row_permutation(a.flatten(1)[None], b.flatten(1)[None]) is not None:
                found.setdefault("batch_axis", tuple(a.shape))
        for a, b in pairs + [(b, a) for a, b in pairs]:
            if "perm" not in found and (perm := _row_permutation(a, b)) is not None:
                found.update(x=a, perm=perm)
    return found


_TEST_FIX = ("x = torch.randn(n, d) (n ≥ 3, d ≥ 2), perm = torch.randperm(n), not the identity or the reversal; "
             "return torch.allclose(attn(x[perm]), attn(x)[perm], atol=1e-5)")
_SAME_ROWS = "every row of your x is the same vector, so reordering the rows changes nothing"


def _blind_cause(results: dict, sizes: list[int], evidence: dict, seen_x: bool) -> str:
    """Why a test calls every attention equivariant, from what it passed to attn."""
    if sizes == [1]:
        return "your inputs have a single token (n = 1): there is nothing to permute"
    if all(r.get("verdict") is None and not r.get("asserted") for r in results.values()):
        return "your function returns None and never fails an assert: it computes a comparison but does not return it"
    if evidence["identical"]:
        return _SAME_ROWS
    if "batch_axis" in evidence:
        return (f"your permutation reorders the batch axis (axis 0 of x, shape {evidence['batch_axis']}), not the "
                "tokens (axis -2): batch entries are computed apart, so nothing can differ")
    if evidence["single"]:
        return ("your test never runs attn on a reordering of x: it calls attn on one and the same x (an output "
                "compared with itself, or a permutation that leaves every token in place)")
    if "perm" in evidence:
        gap, worst = max((ref.permutation_gap(ref.attention_variant(n), evidence["x"], evidence["perm"]), n)
                         for n in ref.POSITION_AWARE)
        return (f"your test runs attn on x and on x reordered, but for {worst} the outputs differ by up to "
                f"{fmt(gap)} and it says equivariant: the comparison lets that through (a tolerance far too loose, "
                "or a comparison with something that does not move with the rows)")
    if seen_x:
        return ("your test never runs attn on a reordering of the same x (the permutation leaves every token in "
                "place, or a new x is drawn): nothing can differ")
    return "your test never permutes the input (or leaves every token in place, or compares an output with itself)"


@check("is_permutation_equivariant", expects="a function is_permutation_equivariant(attn) returning True or False")
def check_is_permutation_equivariant(fn: Learner) -> str:
    results: dict[str, dict] = {}
    verdicts: dict[str, bool] = {}
    attn_hint = [("ValueError", "attn takes", "you called attn with something other than a tensor of shape (n, d)",
                  "call attn(x) with x = torch.randn(n, d)")]
    for name in ref.EQUIVARIANT + ref.POSITION_AWARE:
        tried = f"is_permutation_equivariant(attn) with attn = {name}"
        result = _call(fn.observe, ("position.permutation_test", name), tried, "True or False", patterns=attn_hint,
                       tensor=False)
        results[name] = result if isinstance(result, dict) else {"verdict": result}
        verdicts[name] = _as_verdict(results[name].get("verdict"), tried)
    runs = [[c for c in r.get("calls", []) if isinstance(c, dict)] for r in results.values()]
    calls = [c for run in runs for c in run]
    sizes = sorted({c["shape"][-2] for c in calls if len(c.get("shape", [])) >= 2})
    missed = [n for n in ref.POSITION_AWARE if verdicts[n]]
    rejected = [n for n in ref.EQUIVARIANT if not verdicts[n]]
    words = dict(tried=f"is_permutation_equivariant(attn) on {len(ref.EQUIVARIANT)} permutation-equivariant functions "
                       f"and {len(ref.POSITION_AWARE)} position-aware attentions",
                 got="; ".join(f"{n}: {'equivariant' if verdicts[n] else 'not equivariant'}" for n in verdicts))
    first = f"equivariant for the first {len(ref.EQUIVARIANT)}"
    for hit, summary, expected, cause, fix in [
        (not calls, "the test never calls attn", "a verdict computed from attn's outputs",
         "your function returns without running the attention it is given", _TEST_FIX),
        (set(rejected) == set(ref.EQUIVARIANT) and set(missed) == set(ref.POSITION_AWARE),
         "the test's verdicts are the wrong way round",
         f"True (equivariant) for the first {len(ref.EQUIVARIANT)}, False for the others",
         "your test returns True when the outputs differ (a `not` too many, or an assert of the opposite)",
         "return torch.allclose(attn(x[perm]), attn(x)[perm], atol=1e-5): True means equivariant"),
        ("elementwise tanh" in rejected, "the test rejects functions that ignore positions",
         f"{first} (even tanh(x))", "your comparison fails even where the answer is exact: compare attn(x[perm]) "
         "with attn(x)[perm], not with attn(x) or with the inverse permutation", _TEST_FIX),
        ("feature mixing" in rejected, "the test rejects functions that ignore positions", first,
         "your test rejects a function that only mixes each token's own features: your permutation moves the "
         "features (the last axis), not the tokens (the rows)",
         "permute the rows: x[perm] (or x[..., perm, :] with batch axes)"),
        (rejected, "the test rejects attention without positions", "equivariant for plain attention and its variants",
         "attention adds its sums in another order once the rows move, and you compared without a tolerance "
         "(==, torch.equal) or with one too tight for rounding", "compare with torch.allclose(a, b, atol=1e-5)")]:
        if hit:
            fail(summary, expected=expected, cause=cause, fix=fix, **words)
    evidence = _evidence(runs)
    if len(missed) == len(ref.POSITION_AWARE):
        fail("the test calls everything equivariant", **words,
             expected="not equivariant for the five attentions that see positions (even a causal mask)",
             cause=_blind_cause(results, sizes, evidence, any("x" in c for c in calls)), fix=_TEST_FIX)
    if missed:
        cause, fix = "", _TEST_FIX
        if evidence["identical"]:
            cause, fix = _SAME_ROWS, "draw x = torch.randn(n, d): different tokens"
        elif missed == ["symmetric distance bias"]:
            cause = ("your permutation keeps every distance |i − j| (a reversal does, or a swap in a sequence of 2), "
                     "so a bias of |i − j| goes unnoticed")
            fix = "perm = torch.randperm(n) with n ≥ 3, drawn again while it is the identity or the reversal"
        elif max(c.get("absmax", 1.0) for c in calls) < 0.1:
            cause = "your inputs are tiny (|x| < 0.1): the scores barely differ and positional effects vanish"
            fix = "use inputs of a typical size: x = torch.randn(n, d)"
        elif sizes and max(sizes) <= 2:
            cause = f"your inputs have only {max(sizes)} tokens: a permutation of 2 is a reversal or nothing"
            fix = "use a few more tokens (n ≥ 3) and a random permutation"
        fail(f"the test misses {', '.join(missed)}", expected=f"not equivariant for {', '.join(missed)}", cause=cause,
             fix=fix, **words)
    return (f"tells {len(ref.EQUIVARIANT)} permutation-equivariant functions from {len(ref.POSITION_AWARE)} attentions "
            "that see positions")


# ================================================================================== frequencies, measured
def _frequency_cause(measured: torch.Tensor, expected: torch.Tensor, base: float, d: int) -> str:
    """What per-pair frequencies are, next to base^(−2r/d): one for all, a constant factor, another base or d."""
    shown, want = (", ".join(fmt(float(w)) for w in t[:5]) + ("…" if len(t) > 5 else "")
                   for t in (measured, expected))
    text, ratio = f"pair frequencies {shown} (pair 0, 1, …); expected base^(−2r/d): {want}", measured / expected
    if len(measured) >= 2 and torch.allclose(measured, measured[0].expand_as(measured), rtol=1e-3, atol=1e-6):
        return f"{text}. Every pair has the same frequency {fmt(float(measured[0]))}"
    if torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-3):
        named = " (π/180: an angle converted between degrees and radians)" if abs(ratio[0] - math.pi / 180) < 1e-4 \
            else ""
        return f"{text}. Every frequency is {fmt(float(ratio[0]))} × the expected one{named}"
    if len(measured) >= 2 and bool((measured > 0).all()) and abs(float(measured[0]) - 1) < 1e-3:
        logs = torch.log(measured[1:].double()) / torch.arange(1, len(measured), dtype=torch.float64)
        if torch.allclose(logs, logs[0].expand_as(logs), rtol=1e-3) and float(logs[0]) < 0:
            return (f"{text}. They are base'^(−2r/d) with base' = {fmt(math.exp(-float(logs[0]) * d / 2))} instead "
                    f"of {fmt(base)} — the same numbers as base^(−2r/d') with d' = "
                    f"{fmt(-2 * math.log(base) / float(logs[0]))} instead of d = {d}")
    return text


# ================================================================================== sinusoidal encoding
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
_SIN_TABLE = _table([
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
], _sinusoid)


def _sinusoid_measured(fn: Learner, failure: Failure, out: torch.Tensor, n: int, d: int, base: float) -> None:
    """Of a wrong shape: which slice it holds, or how its sizes follow n and d (measured on a second call with other
    sizes). Of the right shape: the frequencies, when the columns are sin and cos of t·ω_r pair by pair with wrong ω;
    else which columns are wrong."""
    if failure.diagnosis.cause:
        return
    right = _sinusoid(n, d, base)
    if tuple(out.shape) != (n, d):
        _kept_slice(failure, out, right, ("position", "column"))
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
        _refine(failure, "wrong frequencies", "your columns are sin and cos of t·ω_r pair by pair, as they should "
                "be, but with the " + _frequency_cause(omega, expected, base, d), _SIN_FIX)
    good = torch.isclose(x, right, atol=1e-4, rtol=1e-4).all(0)  # (d,): the columns right everywhere
    if bool(good.any()):
        wrong = [j for j in range(d) if not good[j]]
        kinds = (("sine", [j for j in wrong if j % 2 == 0]), ("cosine", [j for j in wrong if j % 2]))
        said = " and ".join(f"the {k} column{'s' if len(js) > 1 else ''} {', '.join(map(str, js[:6]))}"
                            for k, js in kinds if js)
        _refine(failure, f"wrong values in {len(wrong)} of {d} columns", f"your columns "
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
        out = _call(fn, args, tried, f"an ({n}, {d}) tensor", patterns=odd)
        _floating(out, tried, "compute in floating point (torch.arange(n, dtype=torch.float32))")
        _judge(suspects, fn, out, _sinusoid(*case), case, tried, lambda f: _sinusoid_measured(fn, f, out, *case),
               what="your encoding", fix=_SIN_FIX, distinguish=every)
    return f"matches Vaswani et al.'s interleaved sin/cos on {len(cases)} cases (odd d, d = 1, other bases)"


# ================================================================================== T5 relative position bias
def _t5_buckets(n: int, nb: int, bidirectional: bool, max_distance: int, mistake: str = "") -> tuple[torch.Tensor, ...]:
    """(n, n) buckets of j − i computed in float64, and an alternative where the logarithm lands on a whole
    number (float32 code may fall one below there). With ``mistake``, one classic error."""
    pos = torch.arange(n)
    rel = (pos[:, None] - pos[None, :]) if mistake == "i_minus_j" else (pos[None, :] - pos[:, None])  # j − i
    bidirectional = {"always_bi": True, "never_bi": False}.get(mistake, bidirectional)
    md = 128 if mistake == "max_distance" else max_distance
    half = nb // 2 if bidirectional and mistake != "no_halving" else nb
    offset = ((rel < 0) if mistake == "offset_before" else (rel > 0)).long() * half * (mistake != "no_offset") * \
        bidirectional
    dist = rel.abs() if bidirectional else rel.clamp(min=0) if mistake == "uni_sign" else (-rel).clamp(min=0)
    exact = nb // 2 if mistake == "max_exact" else half // 2
    val = dist.double() if mistake == "linear" else \
        exact + torch.log(dist.double().clamp(min=1) / exact) / math.log(md / exact) * (half - exact)
    near = val.round()
    on_whole = (val - near).abs() < 1e-6
    first = {"round": near, "ceil": torch.where(on_whole, near, val.ceil())}.get(mistake, torch.where(
        on_whole, near, val.floor()))
    second = first if mistake in ("round", "ceil") else torch.where(on_whole, near - 1, first)
    cap = 10 ** 9 if mistake == "no_clamp" else half - 1
    return tuple(torch.where(dist < exact, dist, b.clamp(max=cap).long()) + offset for b in (first, second))


def _t5(n, table, bi, md, mistake=""):
    buckets = _t5_buckets(n, table.shape[0], bi, md, mistake)[0]
    out = None if int(buckets.max()) >= table.shape[0] else table[buckets].permute(2, 0, 1).double()
    return out.transpose(-2, -1) if mistake == "transposed" else out


_T5_FIX = ("bias[a, i, j] = table[bucket(j − i), a]: bidirectional, keys after the query (j − i > 0) use the upper "
           "half; distances below half a half are exact, larger ones logarithmic up to max_distance, then clamped")
_T5_BI = "bidirectional: halve the buckets, the upper half for j − i > 0; otherwise distance = max(i − j, 0)"
_T5_SIGN = ("relative positions indexed i − j instead of j − i", "the docstring's relative position is j − i, "
            "positive when the key comes after the query", "rel = positions[None, :] - positions[:, None]  # j − i")
_T5_TRUNC = "truncate it: .long() (or floor), as T5 does"
_T5_TABLE = _table([
    ("i_minus_j", *_T5_SIGN), ("transposed", *_T5_SIGN),
    ("always_bi", "`bidirectional` ignored", "your buckets are bidirectional whatever `bidirectional` is", _T5_BI),
    ("never_bi", "`bidirectional` ignored", "your buckets are unidirectional whatever `bidirectional` is", _T5_BI),
    ("no_halving", "buckets not halved for bidirectional", "in bidirectional mode you used all num_buckets for each "
     "direction", "num_buckets //= 2 first: each direction gets half of them"),
    ("max_exact", "max_exact from the whole number of buckets", "you computed max_exact = num_buckets // 2 before "
     "halving the buckets", "halve num_buckets first (bidirectional), then max_exact = num_buckets // 2"),
    ("round", "logarithmic bucket rounded instead of floored", "you rounded the logarithmic bucket", _T5_TRUNC),
    ("linear", "no logarithmic buckets", "your distances beyond max_exact each get their own bucket",
     "beyond max_exact: max_exact + log(dist/max_exact) / log(max_distance/max_exact) × (num_buckets − max_exact)"),
    ("max_distance", "max_distance ignored", "your buckets use 128 whatever `max_distance` is passed",
     "use the max_distance argument"),
    ("no_offset", "no offset for keys after the query", "your keys after the query (j − i > 0) share the lower "
     "half of the buckets; they use the upper half", "add (rel > 0).long() * (num_buckets // 2)"),
    ("ceil", "logarithmic bucket rounded up instead of floored", "you rounded the logarithmic bucket up", _T5_TRUNC),
    ("offset_before", "upper half of the buckets given to the keys before the query", "you added "
     "num_buckets // 2 where j − i < 0; the upper half is for j − i > 0", "offset = (rel > 0) * num_buckets // 2"),
    ("uni_sign", "not bidirectional: distance of the keys after the query", "with bidirectional=False your distance "
     "is max(j − i, 0); T5's causal buckets count the keys before the query, max(i − j, 0)",
     "distance = (-rel).clamp(min=0) with rel = j − i"),
], _t5)
_T5_CLAMP = [(kind, r".*" if kind == "IndexError" else r"out of (?:bounds|range)", "a bucket index reached "
              "num_buckets: distances beyond max_distance go to the last bucket of their half (num_buckets // 2 "
              "buckets per half when bidirectional)", "torch.clamp(bucket, max=num_buckets - 1), num_buckets halved")
             for kind in ("IndexError", "RuntimeError", "ValueError")]


def _t5_measured(failure: Failure, out: torch.Tensor, n: int, table: torch.Tensor, bi: bool, md: int) -> None:
    """When each entry is a table value, say which relative positions get which bucket."""
    if failure.diagnosis.cause or tuple(out.shape) != (table.shape[1], n, n):
        return
    hits = torch.isclose(out.double().permute(1, 2, 0)[:, :, None, :], table.double()[None, None], atol=1e-6,
                         rtol=1e-5).all(-1)  # (n, n, num_buckets): which buckets' rows this (i, j) holds
    if not bool(hits.any(-1).all()):
        _refine(failure, "entries that are not table values", "some of your entries are no value of `table`: each "
                "bias is table[bucket, head] itself (nothing added, scaled, averaged or mixed between heads)", _T5_FIX)
    if bool((hits.sum(-1) > 1).any()):
        return  # equal rows in the table: the buckets cannot be read back
    mine, right = hits.float().argmax(-1), _t5_buckets(n, table.shape[0], bi, md)[0]
    rel = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    wrong = sorted({int(r) for r in rel[mine != right]})
    if any(len({int(b) for b in mine[rel == r]}) > 1 for r in wrong):
        _refine(failure, "buckets that depend on i and j, not on j − i", "your entries are table values, but two "
                "pairs (i, j) with the same j − i get different buckets", _T5_FIX)
    half = table.shape[0] // 2 if bi else table.shape[0]
    dist = [abs(r) if bi else max(-r, 0) for r in wrong]
    region = " (all exact distances, below max_exact)" if max(dist) < half // 2 else \
        " (all in the logarithmic range, distance ≥ max_exact)" if min(dist) >= half // 2 else ""
    shown = "; ".join(f"j − i = {r} → bucket {int(mine[rel == r][0])}, T5's {int(right[rel == r][0])}"
                      for r in wrong[:5]) + ("…" if len(wrong) > 5 else "")
    many = f"{len(wrong)} relative positions get" if len(wrong) > 1 else "1 relative position gets"
    _refine(failure, "wrong buckets", f"your entries are table values, one bucket per j − i as they should be, but "
            f"{many} the wrong bucket{region}: {shown}", _T5_FIX)


_HEAD_AXES = ("heads", "queries", "keys")
_T5_CASES = [(6, 32, 2, True, 128), (40, 32, 3, True, 128), (40, 32, 1, False, 20), (1, 8, 4, True, 16),
             (30, 8, 2, True, 12), (25, 16, 2, False, 64), (35, 32, 2, True, 24, torch.float32), (12, 4, 2, True, 8),
             (30, 10, 2, True, 20), (30, 9, 1, False, 24), (8, 3, 2, False, 2), (60, 10, 2, False, 256)]


@check("relative_position_bias",
       expects="a function relative_position_bias(n, table, bidirectional=True, max_distance=128) returning (A, n, n)")
def check_relative_position_bias(fn: Learner) -> str:
    g = torch.Generator().manual_seed(7)
    cases = [(n, torch.randn(nb, heads, generator=g, dtype=torch.float64).to(*dtype or [torch.float64]), bi, md)
             for n, nb, heads, bi, md, *dtype in _T5_CASES]
    suspects = Suspects(_T5_TABLE, atol=1e-6, rtol=1e-5)
    for case in cases:
        (n, table, bi, md), (nb, heads) = case, case[1].shape
        expected, alt = (table[b].permute(2, 0, 1).double() for b in _t5_buckets(n, nb, bi, md))
        tried = (f"relative_position_bias({n}, table ({nb} buckets × {heads} heads), bidirectional={bi}, "
                 f"max_distance={md})")
        out = _call(fn, case, tried, f"a ({heads}, {n}, {n}) tensor", patterns=_T5_CLAMP)
        if tuple(out.shape) == (n, n, heads) and heads != n:
            fail("heads last: shape (n, n, A)", tried=tried, got=f"shape {tuple(out.shape)}",
                 expected=f"shape {(heads, n, n)}", cause="table[buckets] has the heads last",
                 fix="move them first: table[buckets].permute(2, 0, 1)")
        try:
            expect_shape(out, expected.shape, tried=tried, what="your bias", fix="(A, n, n): an (n, n) matrix per head")
        except Failure as failure:
            _kept_slice(failure, out, expected, ("head", "query", "key"))
            raise
        # where the logarithm lands on a whole number, float32 code may take the bucket below: both are right
        expected = torch.where(torch.isclose(out.double(), alt, atol=1e-6, rtol=1e-5), alt, expected)
        _judge(suspects, fn, out, expected, case, tried, lambda f: _t5_measured(f, out, *case), what="your bias",
               fix=_T5_FIX, axes=_HEAD_AXES, distinguish=cases)
    return (f"matches T5's buckets on {len(cases)} cases (bidirectional and not, logarithmic buckets, clamping "
            "beyond max_distance)")


# ================================================================================== ALiBi
def _alibi(n: int, heads: int, mistake: str = "") -> torch.Tensor | None:
    i, h = torch.arange(n, dtype=torch.float64), torch.arange(1, heads + 1, dtype=torch.float64)
    diff = i[:, None] - i[None, :]  # i − j
    m = {"halve": 0.5 ** h, "from1": 2.0 ** (-8 * (h - 1) / heads), "reversed": ref.alibi_slopes(heads).flip(0),
         "linear": h / heads, "inverse": 1 / h, "falling": 1 - h / (heads + 1)}.get(mistake, ref.alibi_slopes(heads))
    shape = {"positive": diff.abs(), "signed": -diff, "signed_T": diff, "causal": -diff.clamp(min=0)}.get(
        mistake, -diff.abs())
    out = m.double()[:, None, None] * shape
    return out.permute(1, 2, 0) if mistake == "heads_last" else out


_SLOPE_FIX = "slope_a = 2^(−8(a+1)/A) for a = 0 … A − 1: geometric, from 2^(−8/A) with ratio 2^(−8/A)"
_ABS = "use the distance: (i − j).abs()"
_SIGNED = "not symmetric: −slope·(i − j) without the absolute value"
_ALIBI_TABLE = _table([
    ("halve", "slopes halve from head to head whatever A", "your slopes are 1/2, 1/4, …: right for 8 heads only",
     _SLOPE_FIX),
    ("from1", "slopes start at 1", "your first slope is 2^0 = 1: you counted heads from 0 in 2^(−8a/A)", _SLOPE_FIX),
    ("reversed", "slopes in reverse order", "your smallest slope is on head 0", "head 0 has the largest, 2^(−8/A)"),
    ("linear", "slopes not geometric", "your slopes grow linearly ((a + 1)/A)", _SLOPE_FIX),
    ("inverse", "slopes not geometric", "your slopes are 1/(a + 1)", _SLOPE_FIX),
    ("falling", "slopes not geometric", "your slopes fall linearly (1 − (a + 1)/(A + 1))", _SLOPE_FIX),
    ("positive", "bias positive", "your bias grows with distance (+slope·|i − j|): far keys are favoured",
     "negate it: bias = −slope_a·|i − j|"),
    ("signed", _SIGNED, "your bias is positive above the diagonal (keys after the query)", _ABS),
    ("signed_T", _SIGNED, "your bias is positive below the diagonal", _ABS),
    ("causal", "zero for keys after the query", "your bias is 0 above the diagonal (the causal form); the docstring "
     "asks for −slope_a·|i − j| everywhere", _ABS),
    ("heads_last", "heads last: shape (n, n, A)", "your heads are on the last axis", "put the heads first: (A, n, n)"),
], _alibi)


def _alibi_measured(failure: Failure, out: torch.Tensor, n: int, heads: int) -> None:
    """Which slice a wrong shape holds; when the bias is −slope_a·|i − j| with wrong slopes, what they are."""
    if tuple(out.shape) != (heads, n, n):
        _kept_slice(failure, out, _alibi(n, heads), ("head", "query", "key"))
    if failure.diagnosis.cause or n < 2 or tuple(out.shape) != (heads, n, n):
        return
    distance = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().double()
    slopes = -out[:, 1, 0].double()  # (A,)
    if not same(out.double(), -slopes[:, None, None] * distance, atol=1e-6, rtol=1e-5):
        return
    shown, expected = (", ".join(fmt(float(s)) for s in t[:6]) + ("…" if heads > 6 else "")
                       for t in (slopes, ref.alibi_slopes(heads)))
    got, summary, ratios = f"your slopes are {shown}", "wrong slopes", slopes[1:] / slopes[:-1]
    if heads > 2 and bool((slopes[:-1] != 0).all()) and torch.allclose(ratios, ratios[0].expand_as(ratios), rtol=1e-4):
        got = (f"your slopes {shown} are geometric with ratio {fmt(float(ratios[0]))}, expected 2^(−8/A) = "
               f"{fmt(2 ** (-8 / heads))} starting at the same value")
    elif heads > 2 and bool((slopes[:-1] != 0).all()):
        got = f"your slopes {shown} are not geometric (ratios {', '.join(fmt(float(r)) for r in ratios[:4])}…)"
        summary = "slopes not geometric"
    fail(summary, tried=failure.diagnosis.tried, got=got,
         expected=f"slopes {expected}: 2^(−8(a+1)/A) for a = 0 … A − 1",
         cause="the form −slope·|i − j| is right; the slopes are not", fix="slope = 2 ** (-8 * (a + 1) / A)")


_ALIBI_CASES = [(5, 8), (7, 4), (1, 4), (6, 1), (6, 16), (12, 2), (3, 32)]


@check("alibi_bias", expects="a function alibi_bias(n, n_heads) returning an (n_heads, n, n) tensor")
def check_alibi_bias(fn: Learner) -> str:
    suspects = Suspects(_ALIBI_TABLE, atol=1e-7, rtol=1e-5)
    for case in _ALIBI_CASES:
        tried = f"alibi_bias{case}"
        out = _call(fn, case, tried, f"an ({case[1]}, {case[0]}, {case[0]}) tensor")
        _floating(out, tried, "the slopes are fractions: compute in floating point")
        _judge(suspects, fn, out, _alibi(*case), case, tried, lambda f: _alibi_measured(f, out, *case),
               what="your bias", axes=_HEAD_AXES, distinguish=_ALIBI_CASES,
               fix="bias[a, i, j] = −slope_a·|i − j| with slope_a = 2^(−8(a+1)/A)")
    return f"matches −slope_a·|i − j| on {len(_ALIBI_CASES)} cases (1 to 32 heads, n = 1, slopes 2^(−8(a+1)/A))"


# ================================================================================== RoPE
def _rope(x: torch.Tensor, positions=None, base: float = 10000.0, mistake: str = "") -> torch.Tensor:
    x = x.double()
    n, d = x.shape[-2:]
    if mistake == "none":
        return x
    pos = torch.arange(n) if positions is None or mistake == "positions" else torch.as_tensor(positions)
    pos = pos.double() + (1 if mistake == "from1" else 0)
    base = 10000.0 if mistake == "base" else base
    exponent = (torch.arange(d // 2) if mistake == "half" else torch.arange(0, d, 2)).double() / d  # (d/2,)
    angles = {"divide": pos[:, None] / base ** (-exponent), "intdiv": pos[:, None].expand(-1, d // 2)}.get(
        mistake, pos[:, None] * base ** (-exponent)) * (-1 if mistake == "sign" else 1)
    cos, sin = (torch.sin(angles), torch.cos(angles)) if mistake == "swap" else (torch.cos(angles), torch.sin(angles))
    if mistake == "halves":
        a, b = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    if mistake in ("repeat", "mixed"):  # GPT-J's layout c0 c1 … c0 c1 …, or rotate_half with c0 c0 c1 c1 …
        c2, s2 = (t.repeat(1, 2) if mistake == "repeat" else t.repeat_interleave(2, dim=-1) for t in (cos, sin))
        turned = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2) if mistake == "repeat" else \
            torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1)
        return x * c2 + turned * s2
    a, b = x[..., 0::2], x[..., 1::2]
    first = a * cos - b * sin
    second = (first if mistake == "inplace" else a) * sin + b * cos
    return torch.cat([first, second], dim=-1) if mistake == "unpaired" else \
        torch.stack([first, second], dim=-1).flatten(-2)


_ROPE_FIX = ("pair dimensions (2r, 2r + 1) and rotate the pair at position t by +t·θ_r, θ_r = base^(−2r/d): "
             "(x_2r cos − x_2r+1 sin, x_2r sin + x_2r+1 cos)")
_ROPE_TABLE = _table([
    ("halves", "rotated pairs (r, r + d/2) instead of (2r, 2r + 1)", "you paired each dimension with the one d/2 "
     "away (GPT-NeoX / LLaMA's rotate_half); the docstring pairs neighbours, as RoFormer does",
     "rotate x[..., 0::2] with x[..., 1::2]"),
    ("sign", "rotated by −θ instead of +θ", "your rotation goes the other way: (x_2r cos + x_2r+1 sin, "
     "−x_2r sin + x_2r+1 cos)", _ROPE_FIX),
    ("half", "frequencies base^(−r/d) instead of base^(−2r/d)", "your exponent uses the pair index r over d",
     "θ_r = base ** (-2 * r / d) for r = 0 … d/2 − 1 (torch.arange(0, d, 2) / d)"),
    ("swap", "cos and sin swapped", "you multiplied by sin where cos belongs and the other way round", _ROPE_FIX),
    ("unpaired", "rotated pairs written back as halves", "you returned all the rotated first members, then all the "
     "second ones, instead of putting each pair back in place", "torch.stack([first, second], dim=-1).flatten(-2)"),
    ("positions", "positions ignored", "you rotated by 0 … n − 1 whatever `positions` is passed",
     "use the positions argument when it is given (a KV cache passes the new tokens' positions)"),
    ("from1", "positions off by one", "you counted positions from 1", "position 0 is not rotated at all"),
    ("base", "base ignored", "your angles use 10000 whatever `base` is passed", "use the base argument"),
    ("divide", "angles t / θ_r instead of t · θ_r", "you divided the position by θ_r = base^(−2r/d): the angles "
     "grow with r", "angle = t * base ** (-2 * r / d)"),
    ("intdiv", "every pair turns by the same angle t", "your θ_r came out 1 for every pair: integer division (or "
     "integer tensors) in the exponent 2r/d", "compute the exponent in floating point: torch.arange(0, d, 2) / d"),
    ("none", "x returned unrotated", "your result is x itself: nothing was rotated", _ROPE_FIX),
    ("inplace", "the second line used the already rotated x_2r", "you overwrote x_2r (in place, or by reusing a "
     "variable) before computing x_2r+1 from it", "compute both from the originals: even, odd = x[..., 0::2], "
     "x[..., 1::2]"),
    ("repeat", "cos and sin laid out with .repeat, not .repeat_interleave", "neighbouring pairs need cos and sin "
     "as c0 c0 c1 c1 … (repeat_interleave); .repeat gives c0 c1 … c0 c1 …, mixing two frequencies in most pairs",
     "cos.repeat_interleave(2, dim=-1)"),
    ("mixed", "rotate_half with interleaved cos and sin", "you mixed two conventions: rotate_half pairs i with "
     "i + d/2, but your cos and sin are laid out for neighbouring pairs", "turn each pair as (−x_2r+1, x_2r): "
     "torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)"),
], _rope)


def _rope_measured(fn: Learner, failure: Failure, out: torch.Tensor, x, given, base) -> None:
    """What the learner's rotation does, measured on extra calls with unit pairs (1, 0) and (0, 1): whether each pair
    turns within itself, by which angles, from which positions and base; else which 2 × 2 coefficients are off."""
    n, d = x.shape[-2:]
    if failure.diagnosis.cause or tuple(out.shape) != tuple(x.shape):
        return
    unit = torch.zeros(n, d, dtype=torch.float64)
    unit[:, 0::2] = 1.0  # every pair (1, 0): rotated by a, it becomes (cos a, sin a)
    ask = lambda *args: call_or_skip(lambda: as_tensor(fn(*args), tried=failure.diagnosis.tried).double())  # noqa: E731
    turned = ask(unit, given, base)
    if turned is None or tuple(turned.shape) != (n, d):
        return
    first, second = turned[:, 0::2], turned[:, 1::2]  # (n, d/2)
    positions = (torch.arange(n) if given is None else torch.as_tensor(given)).double()
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    if not torch.allclose(first ** 2 + second ** 2, torch.ones_like(first), atol=1e-4):
        _refine(failure, "not a rotation of each pair", "given pairs (x_2r, x_2r+1) = (1, 0), your function returns "
                "pairs of length ≠ 1: it mixes dimensions of different pairs, or the two members use different "
                "angles", _ROPE_FIX)
    angles = torch.atan2(second, first)  # (n, d/2)
    turns = lambda t, a: torch.allclose(t[:, 0::2], torch.cos(a), atol=1e-4) and \
        torch.allclose(t[:, 1::2], torch.sin(a), atol=1e-4)  # noqa: E731
    if given is not None and not turns(turned, positions[:, None] * theta):
        default = ask(unit, None, base)
        if default is not None and default.shape == (n, d) and turns(default, torch.arange(n)[:, None] * theta):
            _refine(failure, "positions mishandled", "your rotation is right with positions=None but not with the "
                    "positions passed: the angles are t·θ_r with t the given position itself",
                    "angles = positions[:, None] * θ, with positions = torch.arange(n) only when None is passed")
    other_base = 500.0 if base != 500.0 else 10000.0
    if bool((angles.abs() > 1e-6).any()) and d >= 4 and (other := ask(x, given, other_base)) is not None and \
            same(other, out.double(), atol=0, rtol=0):
        _refine(failure, "base ignored", f"your result is the same for base = {base:g} and base = {other_base:g}: a "
                "fixed base sits in your code", "use the base argument: θ_r = base ** (-2 * r / d)")
    moving = positions != 0
    if moving.any():
        per_position = angles[moving] / positions[moving, None]  # (moving, d/2): the angle per unit of position
        if not turns(turned, positions[:, None] * per_position[:1]):
            _refine(failure, "angles not proportional to the positions", f"given pairs (1, 0) at positions "
                    f"{', '.join(str(int(p)) for p in positions[:6])}, your rotation angles are not t·θ_r for one "
                    "θ_r per pair: check how the positions enter the angles", _ROPE_FIX)
        omega = per_position[0]
        if not (torch.allclose(torch.cos(omega), torch.cos(theta), atol=1e-4) and
                torch.allclose(torch.sin(omega), torch.sin(theta), atol=1e-4)):
            _refine(failure, "wrong rotation frequencies", "given pairs (1, 0), your function turns each pair "
                    "within itself by t·ω_r, as it should, but with the " + _frequency_cause(omega, theta, base, d),
                    _ROPE_FIX)
    # Each pair mapped from itself alone? Read the 2 × 2 coefficients off the pairs (1, 0) and (0, 1), check on x.
    other = ask(1.0 - unit, given, base)
    if other is None or other.shape != turned.shape:
        return
    coef = [[turned[:, 0::2], other[:, 0::2]], [turned[:, 1::2], other[:, 1::2]]]  # new (even, odd) from (x_2r, x_2r+1)
    xe, xo = x.double()[..., 0::2], x.double()[..., 1::2]
    mine = torch.stack([coef[0][0] * xe + coef[0][1] * xo, coef[1][0] * xe + coef[1][1] * xo], -1).flatten(-2)
    if not same(mine, out.double(), atol=1e-4, rtol=1e-4):
        return  # not a map of each pair alone: the other measurements say more
    c, s = torch.cos(positions[:, None] * theta), torch.sin(positions[:, None] * theta)
    names = {"cos(t·θ_r)": c, "−cos(t·θ_r)": -c, "sin(t·θ_r)": s, "−sin(t·θ_r)": -s, "0": 0 * c, "1": 1 + 0 * c}
    right = [["cos(t·θ_r)", "−sin(t·θ_r)"], ["sin(t·θ_r)", "cos(t·θ_r)"]]
    said = [f"the new {new} takes {old} × "
            f"{next((k for k, v in names.items() if torch.allclose(coef[i][j], v, atol=1e-4)), 'another factor')} "
            f"(a rotation: × {right[i][j]})" for i, new in enumerate(("x_2r", "x_2r+1"))
            for j, old in enumerate(("x_2r", "x_2r+1"))
            if not torch.allclose(coef[i][j], names[right[i][j]], atol=1e-4)]
    if said:
        _refine(failure, "not the rotation's coefficients", "your function maps each pair (x_2r, x_2r+1) to a "
                "combination of that pair, as a rotation does, but " + "; ".join(said), _ROPE_FIX)


@check("apply_rope", expects="a function apply_rope(x, positions=None, base=10000.0) returning a tensor shaped like x")
def check_apply_rope(fn: Learner) -> str:
    g = torch.Generator().manual_seed(12)
    x = lambda *shape, dtype=torch.float64: torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)  # noqa
    cases = [("x (6, 8), default positions", (x(6, 8),)),
             ("x (2, 3, 5, 16): batch × heads, default positions", (x(2, 3, 5, 16),)),
             ("x (3, 8) at positions [0, 5, 2]", (x(3, 8), torch.tensor([0, 5, 2]))),
             ("x (1, 4): one new token at position 7", (x(1, 4), torch.tensor([7]))),
             ("x (4, 2): d = 2", (x(4, 2), torch.arange(4))),
             ("x (2, 6, 8) at positions 10 … 15", (x(2, 6, 8), torch.arange(10, 16))),
             ("x (5, 8), base 500", (x(5, 8), torch.arange(5), 500.0)),
             ("x (2, 7, 12) float32, default positions", (x(2, 7, 12, dtype=torch.float32),)),
             ("x (3, 8) at positions [1000, 2500, 4096]", (x(3, 8), torch.tensor([1000, 2500, 4096])))]
    suspects = Suspects(_ROPE_TABLE, atol=1e-4, rtol=1e-4)
    signature = [("TypeError", "argument", "your function does not take positions and base",
                  "keep the signature apply_rope(x, positions=None, base=10000.0)")]
    for name, args in cases:
        case = (*args, *(None, 10000.0)[len(args) - 1:])  # (x, positions, base)
        shown = ["x", "None" if case[1] is None else "positions", "base=500"][:len(args)]
        tried = f"apply_rope({', '.join(shown)}) on {name}"
        out = _call(fn, args, tried, "a tensor shaped like x", patterns=signature)
        expect_shape(out, case[0].shape, tried=tried, what="your result", fix="the result has x's shape (..., n, d)")
        if out.dtype != case[0].dtype and out.is_floating_point():
            fail(f"dtype changed from {str(case[0].dtype)[6:]} to {str(out.dtype)[6:]}", tried=tried,
                 got=str(out.dtype), expected=str(case[0].dtype), cause="your cos and sin are in another dtype, "
                 "which promoted the product", fix="convert cos and sin to x.dtype before multiplying")
        atol = 3e-3 if "4096" in name else 1e-5 if case[0].dtype == torch.float64 else 1e-4
        _judge(suspects, fn, out, _rope(*case), case, tried, lambda f: _rope_measured(fn, f, out, *case),
               what="your rotated x", atol=atol, rtol=1e-4, fix=_ROPE_FIX)
    # The relative property, on the learner's own rotations: q·k depends only on the distance.
    q, k = x(1, 16), x(1, 16)
    scores = []
    for i, j in [(0, 3), (5, 8), (40, 43), (200, 203)]:
        tried = f"apply_rope(q, tensor([{i}])) · apply_rope(k, tensor([{j}]))"
        rq, rk = (as_tensor(fn(t, torch.tensor([p])), tried=tried).double() for t, p in ((q, i), (k, j)))
        scores.append(float((rq * rk).sum()))
    if max(scores) - min(scores) > 1e-3 * max(1.0, abs(scores[0])):  # float32 angles at position 200: ~1e-5
        fail("scores depend on absolute positions", tried="q at position t, k at t + 3, for t = 0, 5, 40, 200",
             got="scores " + ", ".join(fmt(s) for s in scores), expected="the same score for every t", fix=_ROPE_FIX)
    return (f"matches RoFormer's interleaved rotation on {len(cases)} cases, and q·k depends only on j − i "
            f"(checked at distance 3 from positions 0 to 200)")


# ================================================================================== RoPE with a KV cache
def _decode(q_new, k_new, k_cache, mistake: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """The right step (``mistake`` empty) or one classic mistake, in float64: (q rotated, keys)."""
    q_new, k_new, k_cache = q_new.double(), k_new.double(), k_cache.double()
    n_cache, n_new = k_cache.shape[-2], q_new.shape[-2]
    start = {"restart": 0, "plus1": n_cache + 1, "minus1": n_cache - 1}.get(mistake, n_cache)
    positions = {"same": torch.full((n_new,), n_cache), "end": torch.full((n_new,), n_cache + n_new - 1)}.get(
        mistake, torch.arange(start, start + n_new))
    q_rot = q_new if mistake == "q_plain" else ref.apply_rope(q_new, positions)
    k_rot = k_new if mistake == "k_plain" else ref.apply_rope(k_new, positions)
    cache = ref.apply_rope(k_cache, torch.arange(n_cache)) if mistake == "rerotate" else k_cache
    if mistake == "all_again":  # the whole cache with the new keys rotated from 0 … again
        return q_rot, ref.apply_rope(torch.cat([k_cache, k_rot], dim=-2), torch.arange(n_cache + n_new))
    return q_rot, torch.cat([k_rot, cache] if mistake == "prepend" else [cache, k_rot], dim=-2)


_DECODE_FIX = ("positions = torch.arange(n_cache, n_cache + n_new) (n_cache = k_cache.shape[-2]); rotate q_new and "
               "k_new with pos.apply_rope(x, positions); return (q_rotated, torch.cat([k_cache, k_rotated], dim=-2))")
_ONLY_NEW = "leave k_cache alone; rotate only the new keys, then append them"
_DECODE_ROWS = [
    ("restart", "positions restart at 0", "you rotated the new tokens by 0 … n_new − 1; each new position is the "
     "absolute one: the cache length plus the offset", _DECODE_FIX),
    ("rerotate", "cached keys rotated again", "you rotated the cached keys by 0 … n_cache − 1: they were stored "
     "rotated, each by its own position", _ONLY_NEW),
    ("all_again", "cache rotated again with the new keys", "you rotated the whole extended cache by 0 … n_cache + "
     "n_new − 1: the cached keys were already rotated, so they turn twice", _ONLY_NEW),
    ("k_plain", "new keys stored unrotated", "you appended the new keys without rotating them: later queries meet "
     "them as if at position 0", "rotate k_new by the new positions before appending it"),
    ("q_plain", "queries not rotated", "you returned q_new unrotated", "rotate q_new by the new positions too"),
    ("plus1", "positions off by one (one too far)", "you started the new positions at n_cache + 1; the first new "
     "token sits at position n_cache (positions count from 0)", _DECODE_FIX),
    ("minus1", "positions off by one (one too early)", "you started the new positions at n_cache − 1, the last "
     "cached token's position", _DECODE_FIX),
    ("same", "every new token at the same position", "you rotated every new token by n_cache; they sit at "
     "n_cache, n_cache + 1, …", _DECODE_FIX),
    ("end", "every new token at the last position", "you rotated every new token by the new length minus 1",
     _DECODE_FIX),
    ("prepend", "new keys put before the cache", "you put the new keys first; old keys come first, new ones are "
     "appended", "torch.cat([k_cache, k_rotated], dim=-2)"),
]
_DECODE_Q, _DECODE_K = (_table(_DECODE_ROWS, lambda *c, part=part: _decode(*c)[part]) for part in (0, 1))


@check("rope_decode_step",
       expects="a function rope_decode_step(q_new, k_new, k_cache) returning (q_rotated, extended k_cache)")
def check_rope_decode_step(fn: Learner) -> str:
    g = torch.Generator().manual_seed(31)
    r = lambda *shape, dtype=torch.float64: torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)  # noqa
    cached = lambda x: ref.apply_rope(x, torch.arange(x.shape[-2]))  # noqa: E731 - stored rotated, as caches hold them
    cases = [("a prompt of 4 tokens, empty cache (0, 8)", (r(4, 8), r(4, 8), r(0, 8))),
             ("one new token after 5 cached ones, d = 8", (r(1, 8), r(1, 8), cached(r(5, 8)))),
             ("3 new tokens after 6 cached ones", (r(3, 8), r(3, 8), cached(r(6, 8)))),
             ("batch × heads (2, 4): one new token after 7 cached ones, d = 16",
              (r(2, 4, 1, 16), r(2, 4, 1, 16), cached(r(2, 4, 7, 16)))),
             ("float32: 2 new tokens after 3 cached ones", (r(2, 4, dtype=torch.float32), r(2, 4, dtype=torch.float32),
                                                            cached(r(3, 4, dtype=torch.float32)))),
             ("one new token after 1000 cached ones, d = 4", (r(1, 4), r(1, 4), cached(r(1000, 4))))]
    on_q, on_k = Suspects(_DECODE_Q, atol=1e-4, rtol=1e-4), Suspects(_DECODE_K, atol=1e-4, rtol=1e-4)
    for name, case in cases:
        tried = f"rope_decode_step(q_new, k_new, k_cache) with {name}"
        q_out, k_out = kit.unpack(_call(fn, case, tried, "(q_rotated, k_cache extended)", tensor=False),
                                  ("q_rotated", "k_cache"), tried=tried)
        exp_q, exp_k = _decode(*case)
        tol = dict(atol=1e-6, rtol=1e-5) if case[0].dtype == torch.float64 else dict(atol=1e-4, rtol=1e-4)
        expect_shape(k_out, exp_k.shape, tried=tried, what="the extended cache",
                     fix="append the new keys along the positions: torch.cat([k_cache, k_rotated], dim=-2)")
        expect_shape(q_out, exp_q.shape, tried=tried, what="the rotated queries", fix="keep q_new's shape")
        on_k.expect(k_out, exp_k, case, tried=tried, what="the extended cache", fix=_DECODE_FIX, **tol)
        on_q.expect(q_out, exp_q, case, tried=tried, what="the rotated queries", fix=_DECODE_FIX, **tol)
        for got, what in ((q_out, "the rotated queries"), (k_out, "the extended cache")):
            kit.lower_precision(got, case[0].dtype, tried=tried, what=what, grid=False)
    return (f"matches cache length + offset on {len(cases)} cases (a prompt, single tokens, batch × heads, "
            "1000 cached keys); cached keys kept as they were")


# ================================================================================== additive attention
_MASKED = ("polarity", "after", "ignored", "zero_fill")


def _additive(q, k, v, Wq, Wk, w, mask=None, mistake: str = "") -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(output, weights) in float64, or under one classic mistake ((None, None) where it cannot happen: a mask
    mistake without a mask, no maximum subtracted where nothing overflows)."""
    if mistake in _MASKED and mask is None or mistake == "naive" and w.abs().max() < 50:
        return None, None
    q, k, v, Wq, Wk, w = (t.double() for t in (q, k, v, Wq, Wk, w))
    hq, hk = (x @ (W if mistake == "transposed" else W.T) for x, W in ((q, Wq), (k, Wk)))
    pre = hq[..., :, None, :] + hk[..., None, :, :]  # (..., n_q, n_k, d_h)
    hidden = {"no_tanh": pre, "separate": torch.tanh(hq)[..., :, None, :] + torch.tanh(hk)[..., None, :, :],
              "sigmoid": torch.sigmoid(pre), "relu": torch.relu(pre)}.get(mistake, torch.tanh(pre))
    scores = torch.tanh(pre @ w) if mistake == "w_before" else hidden @ (torch.ones_like(w) if mistake == "no_w" else w)
    scores = scores / {"scaled": math.sqrt(Wq.shape[0]), "scaled_dk": math.sqrt(k.shape[-1])}.get(mistake, 1.0)
    if mask is not None and mistake not in ("after", "ignored"):
        scores = scores.masked_fill(mask if mistake == "polarity" else ~mask,
                                    0.0 if mistake == "zero_fill" else float("-inf"))
    weights = torch.softmax(scores, dim=-2 if mistake == "dim" else -1)
    if mistake == "after":
        weights = weights.masked_fill(~mask, 0.0)
    if mistake == "naive":  # no maximum subtracted, in float32 (the large-w case): e^100 overflows
        e = torch.exp(scores.float())
        weights = (e / e.sum(-1, keepdim=True)).double()
    out = (scores if mistake == "scores_v" else weights) @ v
    return out, weights.transpose(-2, -1) if mistake == "weights_T" else weights


_ADD_FIX = ("scores[i, j] = w · tanh(W_q q_i + W_k k_j); weights = softmax over the keys (no scale); "
            "output = weights @ v")
_TANH = "torch.tanh(hq[..., :, None, :] + hk[..., None, :, :])"
_BEFORE = "fill blocked scores with float('-inf') before the softmax"
_ADD_ROWS = [
    ("transposed", "W_q and W_k used transposed", "you computed q @ W_q, but W_q has shape (d_h, d_q): W_q q_i is "
     "q @ W_q.T", "project with q @ W_q.T and k @ W_k.T"),
    ("no_tanh", "tanh missing", "you summed the projections without tanh: the score splits into a query part and a "
     "key part", "apply torch.tanh to W_q q_i + W_k k_j before the dot product with w"),
    ("separate", "tanh applied to each projection separately", "you computed tanh(W_q q) + tanh(W_k k); the tanh "
     "acts on their sum", _TANH),
    ("no_w", "w ignored", "you summed the hidden units instead of weighting them with w", "hidden @ w"),
    ("w_before", "w applied before the tanh", "you computed tanh(wᵀ(W_q q + W_k k)); the score is "
     "wᵀ tanh(W_q q + W_k k)", f"{_TANH} @ w"),
    ("sigmoid", "sigmoid instead of tanh", "your hidden units go through a sigmoid; Bahdanau's score uses tanh", _TANH),
    ("relu", "ReLU instead of tanh", "your hidden units go through a ReLU; Bahdanau's score uses tanh", _TANH),
    ("scaled", "scores scaled by √d_h", "additive attention has no 1/√d scale", "leave the scores unscaled"),
    ("scaled_dk", "scores scaled by √d_k", "additive attention has no 1/√d scale", "leave the scores unscaled"),
    ("dim", "softmax over the queries", "you took the softmax over axis -2", "torch.softmax(scores, dim=-1)"),
    ("polarity", "mask polarity inverted", "you blocked where the mask is True; True means 'may attend'",
     "scores.masked_fill(~mask, float('-inf'))"),
    ("after", "mask applied after the softmax", "you zeroed blocked weights after the softmax: rows no longer sum "
     "to 1", _BEFORE),
    ("ignored", "mask ignored", "blocked keys still get weight", _BEFORE),
    ("zero_fill", "blocked scores set to 0, not −inf", "a score of 0 still gets weight e^0 / Σ", _BEFORE),
    ("weights_T", "weights transposed", "your weights have one row per key", "keep (..., n_q, n_k)"),
    ("scores_v", "output from the scores", "you multiplied v by the scores, not the weights", "output = weights @ v"),
    ("naive", "no maximum subtracted", "your softmax exponentiates the raw scores: e^100 overflows float32 "
     "(inf / inf = NaN)", "use torch.softmax (or subtract each row's maximum first)"),
]
_ADD_W, _ADD_OUT = ([Known(key, s, c, f, lambda *case, key=key, part=part: _additive(*case, mistake=key)[part])
                     for key, s, c, f in _ADD_ROWS] for part in (1, 0))


def _constructs(q, k, v, Wq, Wk, w, mask=None) -> list[tuple[str, str, Callable[[], object]]]:
    """Wrong ways to pair the projections: one that raises the learner's very message is named."""
    hq, hk = q @ Wq.T, k @ Wk.T
    return [
        ("you added W_q q_i and W_k k_j position by position (query i with key i); every query must meet every key",
         "broadcast: hq[..., :, None, :] + hk[..., None, :, :] gives (..., n_q, n_k, d_h)", lambda: hq + hk),
        ("you paired queries and keys with unsqueeze(1) and unsqueeze(0), right for 2-D input only: with batch "
         "axes the new axes land among them", "count from the end: unsqueeze(-2) and unsqueeze(-3)",
         lambda: hq.unsqueeze(1) + hk.unsqueeze(0)),
        *[("you computed q @ W_q, but W_q has shape (d_h, d_q): W_q q_i is q @ W_q.T", "project with q @ W_q.T and "
           "k @ W_k.T", attempt) for attempt in (lambda: q @ Wq, lambda: k @ Wk)],
        *[("you projected q with W_k (or k with W_q)", "hq = q @ W_q.T, hk = k @ W_k.T", attempt)
          for attempt in (lambda: q @ Wk.T, lambda: k @ Wq.T)],
    ]


@check("additive_attention",
       expects="a function additive_attention(q, k, v, W_q, W_k, w, mask=None) returning (output, weights)")
def check_additive_attention(fn: Learner) -> str:
    g = torch.Generator().manual_seed(21)
    r = lambda *shape, dtype=torch.float64, scale=1.0: (  # noqa: E731
        torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)
    keep = torch.rand(4, 5, generator=g) < 0.6
    keep[torch.arange(4), torch.randint(0, 5, (4,), generator=g)] = True
    keep[0] = torch.tensor([True, False, True, False, False])
    padding = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])[:, None, :]  # (2, 1, 7)
    f32 = torch.float32
    cases = [
        ("q (4, 3), k (6, 5), v (6, 2), d_h = 7", (r(4, 3), r(6, 5), r(6, 2), r(7, 3), r(7, 5), r(7))),
        ("batch × heads (2, 3), n_q = 4, n_k = 5, d_h = 8, with a (4, 5) mask",
         (r(2, 3, 4, 6), r(2, 3, 5, 6), r(2, 3, 5, 3), r(8, 6), r(8, 6), r(8), keep)),
        ("square weights: d_q = d_k = d_h = 4", (r(3, 4), r(5, 4), r(5, 2), r(4, 4), r(4, 4), r(4))),
        ("one query per sequence, key padding mask (2, 1, 7)",
         (r(2, 1, 5), r(2, 7, 5), r(2, 7, 4), r(6, 5), r(6, 5), r(6), padding)),
        ("float32, n_q = 3, n_k = 3", tuple(r(*s, dtype=f32) for s in ((3, 4), (3, 4), (3, 2), (5, 4), (5, 4), (5,)))),
        ("large w (scores beyond ±100, float32)",
         (*(r(*s, dtype=f32) for s in ((2, 4), (6, 4), (6, 3), (8, 4), (8, 4))), r(8, dtype=f32, scale=120.0))),
    ]
    on_w, on_out = Suspects(_ADD_W, atol=3e-5, rtol=1e-3), Suspects(_ADD_OUT, atol=3e-5, rtol=1e-3)
    for name, case in cases:
        masked = len(case) == 7
        tried = f"additive_attention(q, k, v, W_q, W_k, w{', mask' if masked else ''}) on {name}"
        takes_mask = [("TypeError", "argument", "your function does not take the mask", "keep the signature "
                       "additive_attention(q, k, v, W_q, W_k, w, mask=None)")] if masked else []
        result = _call(fn, case, tried, "(output, weights)", _constructs(*case), takes_mask, tensor=False)
        out, weights = kit.unpack(result, ("output", "weights"), tried=tried)
        exp_out, exp_w = _additive(*case)
        tol = dict(atol=1e-6, rtol=1e-5) if case[0].dtype == torch.float64 else dict(atol=3e-5, rtol=1e-3)
        if same(out, exp_w, **tol) and same(weights, exp_out, **tol) and not same(out, exp_out, **tol):
            fail("returned (weights, output), not (output, weights)", tried=tried,
                 got="the right weights first, then the right output", expected="(output, weights)",
                 cause="you returned the two in the other order", fix="end with `return output, weights`")
        for given, what in ((exp_w, "the right weights"), (case[2], "v itself")):
            if tuple(out.shape) != tuple(exp_out.shape) and same(out, given.to(out.dtype), atol=1e-4, rtol=1e-3):
                fail(f"the output is {what}", tried=tried, got=f"an output of shape {tuple(out.shape)}: {what}",
                     expected=f"shape {tuple(exp_out.shape)}: weights @ v", cause=f"your output equals {what}: "
                     "`weights @ v` was never taken", fix="return weights @ v as the output")
        try:
            on_w.expect(weights, exp_w, case, tried=tried, what="the weights", fix=_ADD_FIX, **tol)
        except Failure as failure:  # finite weights whose rows do not sum to 1: no softmax over the keys
            sums = weights.double().sum(-1)
            if failure.diagnosis.cause or tuple(weights.shape) != tuple(exp_w.shape) or \
                    not bool(torch.isfinite(weights).all()) or bool(((sums - 1).abs() < 1e-3).all()):
                raise
            _refine(failure, "the weights' rows do not sum to 1", f"your rows sum to {fmt(float(sums.min()))} … "
                    f"{fmt(float(sums.max()))}: no softmax over the keys (a missing division, or another axis)",
                    "weights = torch.softmax(scores, dim=-1) (blocked scores filled with -inf first)")
        on_out.expect(out, exp_out, case, tried=tried, what="the output", fix=_ADD_FIX, **tol)
        for got, what in ((out, "the output"), (weights, "the weights")):
            kit.lower_precision(got, case[0].dtype, tried=tried, what=what, grid=False)
    return (f"matches wᵀ tanh(W_q q + W_k k) attention on {len(cases)} cases (batched, masks, n_q = 1, square "
            "weights, large scores)")
