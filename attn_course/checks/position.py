"""Checks for notebook 12 (position): is_permutation_equivariant (a test the learner writes),
sinusoidal_encoding, relative_position_bias, alibi_bias, apply_rope, rope_decode_step and additive_attention.

The learner's *test* runs in the learner's process (probe ``position.permutation_test``) on functions whose
answer is known: six that treat every position alike (one with outputs near 0, where only an absolute
tolerance absorbs rounding) and five that see positions; the pattern of its verdicts names its flaw. Its
unseeded draws see fixed seeds, so its verdict never depends on chance (``tests/checks/test_position.py``
enumerates every permutation of 6 tokens).

The other checks compare in float64 with the conventions' formulas (held to ``attn_course.position`` and to
Hugging Face's T5 buckets by ``tests/test_position.py``); each has a table of known mistakes
(:class:`~.kit.Known`, judged by one :class:`~.kit.Suspects` per run) and, where no known mistake fits, a
measurement of what the answer is (its frequencies, slopes, buckets or rotation angles).
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any, Callable

import numpy as np
import torch

from .. import position as ref
from .boundary import LearnerRaised, Opaque, probe
from .compare import Failure, as_tensor, call_or_skip, expect_shape, fail, fmt, same
from .core import Learner, check, learner_error
from . import kit
from .kit import Known, Suspects, explain_raise

__all__ = ["check_is_permutation_equivariant", "check_sinusoidal_encoding", "check_relative_position_bias",
           "check_alibi_bias", "check_apply_rope", "check_rope_decode_step", "check_additive_attention"]


# ================================================================================== shared
#: Exceptions whose explanation here says more than the course-wide table's: (type, regex, cause, fix).
PATTERNS = [
    ("RuntimeError", r"Sizes of tensors must match except in dimension (-?\d+)", "torch.cat joins tensors along "
     "axis {1}, and every other axis must agree: they do not (the join is along another axis than meant, or "
     "one tensor lost or gained an axis)", "print the shapes you join; join the positions with dim=-2"),
]


def _call(fn: Learner, args: tuple, tried: str, expected: str, constructs=(), patterns=()) -> Any:
    """The learner's ``fn(*args)``; its exception explained by a construct, a pattern, or the course's table."""
    try:
        return fn(*args)
    except LearnerRaised as exc:
        hint = explain_raise(exc, constructs, [*patterns, *PATTERNS])
        raise Failure(learner_error(exc, tried=tried, expected=expected, **hint)) from None


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
        part = expected
        for a, i in zip(axes, index):
            part = part.narrow(a, i, 1)
        if same(out.double(), part.double(), atol=1e-5, rtol=1e-4):
            where = " and ".join(f"{names[a]} {i}" for a, i in zip(axes, index))
            lost = " and ".join(f"axis {a} ({expected.shape[a]} {names[a]}s)" for a in axes)
            _refine(failure, f"only {where} computed", f"your result holds the right values for {where} alone: "
                    f"{lost} came out of size 1, so the values for every other {names[axes[0]]} were never computed",
                    "keep that axis at its full size: print the shape after each step to find where it becomes 1")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


_HEAD_AXES = ("heads", "queries", "keys")
def _floating(out: torch.Tensor, tried: str, fix: str) -> None:
    if not out.is_floating_point():
        kind = str(out.dtype)[6:]
        fail(f"integer result ({kind})", tried=tried, got=kind, expected="a floating-point tensor",
             cause=f"your result has the integer dtype {kind}: integer tensors (torch.arange(n) is int64) or a // "
                   "made every step integer arithmetic, which drops the fractions", fix=fix)


def _pairs(result: Any, tried: str, names: tuple[str, str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The two tensors of a returned pair, or a diagnosis of what came back instead."""
    want = f"({names[0]}, {names[1]})"
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        got = f"one tensor of shape {tuple(result.shape)}" if isinstance(result, torch.Tensor) else \
            f"a {type(result).__name__}" + (f" of {len(result)} items" if isinstance(result, (tuple, list)) else "")
        fail(f"returned one tensor, not {want}" if isinstance(result, torch.Tensor) else f"did not return {want}",
             tried=tried, got=got, expected=f"a tuple {want}", fix=f"end with `return {names[0]}, {names[1]}`")
    for i, item in enumerate(result):
        if isinstance(item, (list, tuple)) and item and all(isinstance(t, torch.Tensor) for t in item):
            shapes = ", ".join(str(tuple(t.shape)) for t in item)
            fail(f"the {names[i]} is a list of {len(item)} tensors", tried=tried, got=f"a list of tensors of shapes "
                 f"{shapes}", expected="one tensor", cause=f"your {names[i]} holds the pieces ({shapes}) side by side "
                 "in a Python list instead of one tensor made of them", fix="join them into one tensor: torch.cat("
                 "[...], dim=-2) along the positions")
    return (as_tensor(result[0], tried=tried, what=f"the {names[0]} (first element)"),
            as_tensor(result[1], tried=tried, what=f"the {names[1]} (second element)"))


# ================================================================================== the learner's test
SEED = 12  #: torch's, NumPy's and Python's seed while the learner's test runs


@probe("position.permutation_test")
def _run_test(test: Callable[..., Any], variant: str) -> dict[str, Any]:
    """Learner-side: the learner's test on one attention variant: its verdict, whether an ``assert`` failed,
    and what it passed to attn (shapes, size, the first small inputs)."""
    attn = ref.attention_variant(variant)
    calls: list[dict[str, Any]] = []

    def watched(x):
        if isinstance(x, np.ndarray) and x.dtype.kind == "f":
            x_ = torch.from_numpy(np.array(x, dtype=np.float64))
        elif isinstance(x, torch.Tensor):
            x_ = x.detach().to(torch.float64) if x.is_floating_point() else None
        else:
            return attn(x)
        if len(calls) < 50:
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
    except AssertionError as exc:
        return {"verdict": False, "asserted": True, "message": str(exc)[:200], "calls": calls}
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    if isinstance(verdict, torch.Tensor) and verdict.numel() == 1:
        verdict = bool(verdict.item()) if verdict.dtype == torch.bool else verdict.item()
    return {"verdict": verdict, "asserted": False, "calls": calls}


def _as_verdict(result: dict, tried: str) -> bool:
    """True (equivariant) or False from what the test returned; None counts as a pytest-style pass."""
    verdict = result.get("verdict")
    if verdict is None or isinstance(verdict, (bool, np.bool_)):
        return verdict is None or bool(verdict)
    if isinstance(verdict, (int, np.integer)) and verdict in (0, 1):
        return bool(verdict)
    got = verdict.text if isinstance(verdict, Opaque) else repr(verdict)[:60]
    many = isinstance(verdict, torch.Tensor) and verdict.numel() > 1
    fail("the test did not return True or False", tried=tried, got=f"{type(verdict).__name__}: {got}",
         expected="True (equivariant) or False (not)",
         cause=f"your test returns a tensor of shape {tuple(verdict.shape)}, not one truth value: an output or an "
               "entry-by-entry comparison, where torch.allclose gives one bool" if many else "",
         fix="end with `return torch.allclose(...)` (a bool), or assert it pytest-style")


def _row_permutation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """perm with b = a[..., perm, :], when b reorders a's (distinct) rows and is not a itself; else None."""
    if a.shape != b.shape or a.dim() < 2 or a.shape[-2] < 2:
        return None
    rows_a, rows_b = (t.movedim(-2, 0).reshape(t.shape[-2], -1) for t in (a, b))  # (n, rest)
    if torch.equal(rows_a, rows_b):
        return None
    perm = [(rows_a == row).all(-1).nonzero().flatten() for row in rows_b]
    if any(len(p) != 1 for p in perm) or len({int(p) for p in perm}) < len(perm):
        return None
    return torch.tensor([int(p) for p in perm])


def _evidence(runs: list[list[dict]]) -> dict[str, Any]:
    """What the inputs passed to attn show over all runs: identical rows, one input only, a reordering of a
    batch axis, or a true reordering of one x's tokens (x and perm)."""
    found: dict[str, Any] = {}
    xss = [[c["x"] for c in calls if isinstance(c.get("x"), torch.Tensor) and c["x"].dim() >= 2] for calls in runs]
    found["identical"] = bool(xss) and all(
        xs and all(x.shape[-2] > 1 and bool((x == x[..., :1, :]).all()) for x in xs) for xs in xss)
    found["single"] = bool(xss) and all(xs and all(x.shape == xs[0].shape and torch.equal(x, xs[0]) for x in xs)
                                        for xs in xss)
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


_TEST_FIX = ("draw x = torch.randn(n, d) with a few tokens (n ≥ 3, d ≥ 2), a random permutation perm = "
             "torch.randperm(n) that is neither the identity nor the reversal, and return "
             "torch.allclose(attn(x[perm]), attn(x)[perm], atol=1e-5)")


def _blind_cause(results: dict, calls: list[dict], evidence: dict) -> str:
    """Why a test calls every attention equivariant, from what it passed to attn."""
    sizes = sorted({c["shape"][-2] for c in calls if len(c.get("shape", [])) >= 2})
    if sizes == [1]:
        return "your inputs have a single token (n = 1): there is nothing to permute"
    if all(r.get("verdict") is None and not r.get("asserted") for r in results.values()):
        return "your function returns None and never fails an assert: it computes a comparison but does not return it"
    if evidence["identical"]:
        return "every row of your x is the same vector, so reordering the rows changes nothing"
    if "batch_axis" in evidence:
        return (f"your permutation reorders the first axis of an x of shape {evidence['batch_axis']} (the batch), "
                "not its tokens (axis -2): every batch entry is computed alone, so nothing can differ")
    if evidence["single"]:
        return ("your test never runs attn on a reordering of x: it calls attn on one and the same x every time, so "
                "it compares an output with itself, or its permutation leaves every token in place")
    if "perm" in evidence:
        gap, worst = max((ref.permutation_gap(ref.attention_variant(n), evidence["x"], evidence["perm"]), n)
                         for n in ref.POSITION_AWARE)
        return (f"your test does run attn on x and on x with its rows reordered, but for {worst} the two outputs "
                f"differ by up to {fmt(gap)} after the permutation and it still says equivariant: the comparison "
                "lets that through (a tolerance far too loose, or an output compared with itself or with something "
                "that does not change when the rows move)")
    if any("x" in c for c in calls):
        return ("your test never runs attn on a reordering of the same x: its permutation leaves every token in "
                "place (or it draws a new x instead of permuting the old one), so nothing can differ")
    return ("your test never permutes the input, or its permutation leaves every token in place, or it compares an "
            "output with itself: nothing can differ")


@check("is_permutation_equivariant", expects="a function is_permutation_equivariant(attn) returning True or False")
def check_is_permutation_equivariant(fn: Learner) -> str:
    results: dict[str, dict] = {}
    verdicts: dict[str, bool] = {}
    attn_hint = [("ValueError", "attn takes", "you called attn with something other than a tensor of shape (n, d)",
                  "call attn(x) with x = torch.randn(n, d)")]
    for name in ref.EQUIVARIANT + ref.POSITION_AWARE:
        tried = f"is_permutation_equivariant(attn) with attn = {name}"
        result = _call(fn.observe, ("position.permutation_test", name), tried, "True or False", patterns=attn_hint)
        results[name] = result if isinstance(result, dict) else {"verdict": result}
        verdicts[name] = _as_verdict(results[name], tried)
    calls = [c for r in results.values() for c in r.get("calls", []) if isinstance(c, dict)]
    missed = [n for n in ref.POSITION_AWARE if verdicts[n]]
    rejected = [n for n in ref.EQUIVARIANT if not verdicts[n]]
    tried = (f"is_permutation_equivariant(attn) on {len(ref.EQUIVARIANT)} permutation-equivariant functions and "
             f"{len(ref.POSITION_AWARE)} position-aware attentions")
    shown = "; ".join(f"{n}: {'equivariant' if verdicts[n] else 'not equivariant'}" for n in verdicts)
    first = f"equivariant for the first {len(ref.EQUIVARIANT)}"
    if not calls:
        fail("the test never calls attn", tried=tried, got=shown, expected="a verdict computed from attn's outputs",
             cause="your function returns without running the attention it is given", fix=_TEST_FIX)
    if set(rejected) == set(ref.EQUIVARIANT) and set(missed) == set(ref.POSITION_AWARE):
        fail("the test's verdicts are the wrong way round", tried=tried, got=shown,
             expected=f"True (equivariant) for the first {len(ref.EQUIVARIANT)}, False for the others",
             cause="your test returns True when the outputs differ and False when they agree (a `not` too many, or "
                   "an assert of the opposite)",
             fix="return torch.allclose(attn(x[perm]), attn(x)[perm], atol=1e-5): True means equivariant")
    evidence = _evidence([[c for c in r.get("calls", []) if isinstance(c, dict)] for r in results.values()])
    if "elementwise tanh" in rejected:
        fail("the test rejects functions that ignore positions", tried=tried, got=shown,
             expected=f"{first} (even tanh(x), which treats every number alone)",
             cause="your comparison is wrong even where the answer is exact: permuting the input must permute the "
                   "output's rows the same way — compare attn(x[perm]) with attn(x)[perm], not with attn(x) or "
                   "with the inverse permutation", fix=_TEST_FIX)
    if "feature mixing" in rejected:
        fail("the test rejects functions that ignore positions", tried=tried, got=shown, expected=first,
             cause="your test accepts tanh(x) but rejects a function that only mixes each token's own features: "
                   "your permutation moves the features (the last axis), not the tokens (the rows)",
             fix="permute the rows: x[perm] (or x[..., perm, :] with batch axes)")
    if rejected:
        fail("the test rejects attention without positions", tried=tried, got=shown,
             expected="equivariant for plain attention and its variants",
             cause="your test accepts the functions whose permuted outputs are bit-for-bit equal but rejects "
                   "attention, whose sums are added up in another order once the rows move: you compared without a "
                   "tolerance (==, torch.equal) or with one too tight for rounding",
             fix="compare with a tolerance: torch.allclose(a, b, atol=1e-5)")
    if len(missed) == len(ref.POSITION_AWARE):
        fail("the test calls everything equivariant", tried=tried, got=shown,
             expected="not equivariant for the five attentions that see positions (even a causal mask)",
             cause=_blind_cause(results, calls, evidence), fix=_TEST_FIX)
    if missed:
        sizes = sorted({c["shape"][-2] for c in calls if len(c.get("shape", [])) >= 2})
        cause, fix = "", _TEST_FIX
        if evidence["identical"]:
            cause = "every row of your x is the same vector, so reordering the rows changes nothing"
            fix = "draw x = torch.randn(n, d): different tokens"
        elif missed == ["symmetric distance bias"]:
            cause = ("your permutation keeps every distance |i − j| (a reversal does, as does swapping two tokens "
                     "of a sequence of 2): a bias that depends only on |i − j| goes unnoticed")
            fix = ("use a random permutation of a few tokens (n ≥ 3), drawn again while it is the identity or the "
                   "reversal: perm = torch.randperm(n)")
        elif max(c.get("absmax", 1.0) for c in calls) < 0.1:
            cause = "your inputs are tiny (|x| < 0.1), so the scores barely differ and positional effects vanish"
            fix = "use inputs of a typical size: x = torch.randn(n, d)"
        elif sizes and max(sizes) <= 2:
            cause = f"your inputs have only {max(sizes)} tokens: a permutation of 2 is a reversal or nothing"
            fix = "use a few more tokens (n ≥ 3) and a random permutation"
        fail(f"the test misses {', '.join(missed)}", tried=tried, got=shown,
             expected=f"not equivariant for {', '.join(missed)}", cause=cause, fix=fix)
    return (f"tells {len(ref.EQUIVARIANT)} permutation-equivariant functions from {len(ref.POSITION_AWARE)} attentions "
            "that see positions")


# ================================================================================== frequencies, measured
def _frequency_cause(measured: torch.Tensor, expected: torch.Tensor, base: float, d: int) -> str:
    """What per-pair frequencies are, next to base^(−2r/d): one for all, a constant factor, another base or d."""
    shown, want = (", ".join(fmt(float(w)) for w in t[:5]) + ("…" if len(t) > 5 else "") for t in (measured, expected))
    text = f"pair frequencies {shown} (pair 0, 1, …); expected base^(−2r/d): {want}"
    if len(measured) >= 2 and torch.allclose(measured, measured[0].expand_as(measured), rtol=1e-3, atol=1e-6):
        return f"{text}. Every pair has the same frequency {fmt(float(measured[0]))}"
    ratio = measured / expected
    if torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-3):
        c = float(ratio[0])
        named = " (π/180: an angle converted between degrees and radians)" if abs(c - math.pi / 180) < 1e-4 else ""
        return f"{text}. Every frequency is {fmt(c)} × the expected one{named}"
    if len(measured) >= 2 and bool((measured > 0).all()) and abs(float(measured[0]) - 1) < 1e-3:
        logs = torch.log(measured[1:].double()) / torch.arange(1, len(measured), dtype=torch.float64)
        if torch.allclose(logs, logs[0].expand_as(logs), rtol=1e-3) and float(logs[0]) < 0:
            return (f"{text}. They are base'^(−2r/d) with base' = {fmt(math.exp(-float(logs[0]) * d / 2))} instead "
                    f"of {fmt(base)} — the same numbers as base^(−2r/d') with d' = "
                    f"{fmt(-2 * math.log(base) / float(logs[0]))} instead of d = {d}")
    return text


# ================================================================================== sinusoidal encoding
def _sinusoid(n: int, d: int, base: float, mistake: str = "") -> torch.Tensor:
    p = torch.arange(n, dtype=torch.float64)[:, None] + (1 if mistake == "from1" else 0)
    base = 10000.0 if mistake == "base" else base
    cols = torch.arange(d, dtype=torch.float64)
    pair = torch.div(cols, 2, rounding_mode="floor")
    exponent = {"col": cols / d, "half": pair / d, "twocol": 2 * cols / d}.get(mistake, 2 * pair / d)
    angle = p * base ** exponent if mistake == "times" else p / base ** exponent
    if mistake.startswith("halves"):  # tensor2tensor's layout: all sines, then all cosines (or the reverse)
        half = (d + 1) // 2
        a = p / base ** (2 * torch.arange(half, dtype=torch.float64) / d)
        first, second = (torch.cos, torch.sin) if mistake == "halves_cos_first" else (torch.sin, torch.cos)
        return torch.cat([first(a), second(a[:, : d - half])], dim=-1)
    if mistake == "intdiv":  # exponent 2r // d = 0: every pair turns at frequency 1
        angle = p.expand(n, d)
    even = cols % 2 == 0
    if mistake in ("swapped", "all_sin", "all_cos"):
        return {"swapped": torch.where(even, torch.cos(angle), torch.sin(angle)), "all_sin": torch.sin(angle),
                "all_cos": torch.cos(angle)}[mistake]
    out = torch.where(even, torch.sin(angle), torch.cos(angle))
    if mistake == "odd_last_cos" and d % 2:
        out[:, -1] = torch.cos(angle[:, -1])
    return out


_SIN_FIX = "column 2r = sin(t / base^(2r/d)) and column 2r + 1 = cos(t / base^(2r/d)), with t = 0 … n − 1"
_HALVES = ("sin and cos in halves, not interleaved", "pe[:, 0::2] = sin(…) and pe[:, 1::2] = cos(…)")
_SIN_TABLE = _table([
    ("swapped", "sin and cos swapped", "your even columns hold cosines and the odd ones sines", _SIN_FIX),
    ("halves", _HALVES[0], "you put all the sines in the first half of the columns and the cosines in the second "
     "(tensor2tensor's layout), but the docstring interleaves them: sin in even columns, cos in odd ones", _HALVES[1]),
    ("halves_cos_first", _HALVES[0], "you put all the cosines in the first half of the columns and the sines in the "
     "second", _HALVES[1]),
    ("col", "cos columns use the exponent (2r + 1)/d", "your exponent is the column index over d, so the cos column "
     "2r + 1 gets a frequency of its own instead of sharing its sine's", "both columns of pair r use base^(2r/d)"),
    ("half", "exponent r/d instead of 2r/d", "your frequencies use the pair index r over d", _SIN_FIX),
    ("twocol", "exponent 2j/d with j the column", "your exponent doubles the column index, not the pair index",
     _SIN_FIX),
    ("times", "multiplied by base^(2r/d) instead of dividing", "your angles grow with the dimension instead of "
     "shrinking", _SIN_FIX),
    ("from1", "positions start at 1", "your first row is position 1; it is position 0 (all sines 0, cosines 1)",
     _SIN_FIX),
    ("base", "base ignored", "your encoding uses 10000 whatever `base` is passed", "use the `base` argument"),
    ("intdiv", "every pair has frequency 1", "your exponent 2r/d came out 0 for every pair: integer division "
     "(2 * r // d) or integer tensors in the exponent", "compute the exponent in floating point: "
     "torch.arange(0, d, 2) / d (true division)"),
    ("all_sin", "sines in every column", "your odd columns hold sines too; they hold cosines", _SIN_FIX),
    ("all_cos", "cosines in every column", "your even columns hold cosines too; they hold sines", _SIN_FIX),
    ("odd_last_cos", "odd d: the last column is a cosine", "with an odd d the last column is column d − 1, an even "
     "one: a sine of the last pair's angle", "fill the even columns with sines first; an odd d has one sine more"),
], _sinusoid) + [
    Known("extra_column", "one column too many for an odd d", "you returned d + 1 columns: the cosine of the last "
          "pair", "keep d columns: the last one (column d − 1, even) is a sine",
          lambda n, d, b: _sinusoid(n, d + 1, b) if d % 2 else None),
    Known("transposed", "rows and columns swapped", "your result has one row per dimension",
          "return (n, d): one row per position", lambda n, d, b: _sinusoid(n, d, b).T),
]


def _sinusoid_measured(failure: Failure, out: torch.Tensor, n: int, d: int, base: float) -> None:
    """Re-raise ``failure``; when the answer is sin/cos of t·ω_r pair by pair with wrong ω, say what the ω are."""
    if failure.diagnosis.cause or tuple(out.shape) != (n, d) or n < 3 or d < 2:
        raise failure
    x, pairs = out.double(), d // 2
    omega = torch.atan2(x[1, 0:2 * pairs:2], x[1, 1:2 * pairs:2])  # (pairs,): the angle at t = 1
    p = torch.arange(n, dtype=torch.float64)[:, None]
    fitted = torch.stack([torch.sin(p * omega), torch.cos(p * omega)], dim=-1).flatten(-2)  # (n, 2·pairs)
    if same(x[:, : 2 * pairs], fitted, atol=1e-4, rtol=1e-4) and bool((omega > 0).all()):
        expected = base ** (-2 * torch.arange(pairs, dtype=torch.float64) / d)
        _refine(failure, "wrong frequencies", "your columns are sin and cos of t·ω_r pair by pair, as they should "
                "be, but with the " + _frequency_cause(omega, expected, base, d), _SIN_FIX)
    right = torch.isclose(x, _sinusoid(n, d, base), atol=1e-4, rtol=1e-4).all(0)  # (d,): columns right everywhere
    if bool(right.any()):
        wrong = [j for j in range(d) if not right[j]]
        kinds = {"sine": [j for j in wrong if j % 2 == 0], "cosine": [j for j in wrong if j % 2]}
        said = " and ".join(f"the {k} column{'s' if len(v) > 1 else ''} {', '.join(map(str, v[:6]))}"
                            for k, v in kinds.items() if v)
        good = ", ".join(str(j) for j in range(d) if right[j])
        _refine(failure, f"wrong values in {len(wrong)} of {d} columns", f"your columns {good} are right; {said} are not: "
                "look at the formula of those columns only (their frequency, or sin/cos)", _SIN_FIX)
    raise failure


def _sinusoid_sizes(fn: Learner, out: torch.Tensor, n: int, d: int, b: float, tried: str) -> None:
    """When the shape is wrong, how its sizes follow n and d, measured on a second call with other sizes."""
    if out.dim() != 2 or n < 2 or d < 2:
        return
    other = call_or_skip(lambda: as_tensor(fn(n + 3, d + 4, b), tried=tried))
    if other is None or other.dim() != 2 or tuple(other.shape) == (n + 3, d + 4):
        return
    said, follow = [], []
    for axis, what, size, name, rule in ((0, "rows", n, "n", "one row per position t = 0 … n − 1"),
                                          (1, "columns", d, "d", "d columns: sin and cos of each pair, interleaved")):
        if out.shape[axis] != size:
            said.append(f"{out.shape[axis]} {what} for {name} = {size} and {other.shape[axis]} for {name} = "
                        f"{size + (3 if axis == 0 else 4)}")
            follow.append(rule)
    fail(f"wrong shape {tuple(out.shape)}, expected {(n, d)}", tried=tried, got=f"your encoding of shape "
         f"{tuple(out.shape)}", expected=f"shape {(n, d)}", cause="your encoding has " + " and ".join(said) +
         ", where the docstring asks for " + " and ".join(follow) + ": print the shape after each step to see where "
         "it departs from that", fix=_SIN_FIX)


@check("sinusoidal_encoding", expects="a function sinusoidal_encoding(n, d, base=10000.0) returning an (n, d) tensor")
def check_sinusoidal_encoding(fn: Learner) -> str:
    cases = [(6, 8, None), (12, 6, 100.0), (1, 4, None), (10, 7, None), (50, 16, None), (4, 2, 10.0), (9, 1, None),
             (20, 9, 500.0)]
    suspects = Suspects(_SIN_TABLE, atol=1e-4, rtol=1e-4)
    every = [(n, d, 10000.0 if b is None else b) for n, d, b in cases]
    for n, d, base in cases:
        tried = f"sinusoidal_encoding({n}, {d})" if base is None else f"sinusoidal_encoding({n}, {d}, {base:g})"
        b = 10000.0 if base is None else base
        odd = [("RuntimeError", r"size|shape|match", f"with an odd d = {d} there is one sine column more than cosine "
                "columns", "fill pe[:, 0::2] with sines and pe[:, 1::2] with the first d // 2 cosines")] if d % 2 else []
        out = as_tensor(_call(fn, (n, d) if base is None else (n, d, base), tried, f"an ({n}, {d}) tensor",
                              patterns=odd), tried=tried)
        _floating(out, tried, "compute in floating point (torch.arange(n, dtype=torch.float32))")
        try:
            suspects.expect(out, _sinusoid(n, d, b), (n, d, b), tried=tried, what="your encoding", fix=_SIN_FIX,
                            again=lambda *case: as_tensor(fn(*case), tried=tried), distinguish=every)
        except Failure as failure:
            if tuple(out.shape) != (n, d) and not failure.diagnosis.cause:
                _kept_slice(failure, out, _sinusoid(n, d, b), ("position", "column"))
                _sinusoid_sizes(fn, out, n, d, b, tried)
            _sinusoid_measured(failure, out, n, d, b)
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
    offset = torch.zeros_like(rel)
    if bidirectional:
        offset = ((rel < 0) if mistake == "offset_before" else (rel > 0)).long() * half * (mistake != "no_offset")
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
    out, alt = (torch.where(dist < exact, dist, b.clamp(max=cap).long()) + offset for b in (first, second))
    return out, alt


def _t5(n, table, bi, md, mistake=""):
    buckets = _t5_buckets(n, table.shape[0], bi, md, mistake)[0]
    return None if int(buckets.max()) >= table.shape[0] else table[buckets].permute(2, 0, 1).double()


_T5_FIX = ("bias[a, i, j] = table[bucket(j − i), a]: with bidirectional, keys after the query (j − i > 0) use the "
           "upper half of the buckets; distances below half a half are exact; larger ones are logarithmic up to "
           "max_distance, then clamped to the last bucket")
_T5_BI = ("bidirectional: halve the buckets, the upper half for j − i > 0; otherwise distance = max(i − j, 0)")
_T5_ROWS = [
    ("i_minus_j", "relative positions indexed i − j instead of j − i", "you measured the query's position relative "
     "to the key (i − j); the docstring's relative position is j − i, positive when the key comes after the query",
     "rel = positions[None, :] - positions[:, None]  # j − i"),
    ("always_bi", "`bidirectional` ignored", "your buckets are the bidirectional ones whatever `bidirectional` is "
     "passed", _T5_BI),
    ("never_bi", "`bidirectional` ignored", "your buckets are the unidirectional ones whatever `bidirectional` is "
     "passed", _T5_BI),
    ("no_halving", "buckets not halved for bidirectional", "in bidirectional mode you used all num_buckets for each "
     "direction", "num_buckets //= 2 first: each direction gets half of them"),
    ("max_exact", "max_exact from the whole number of buckets", "you computed max_exact = num_buckets // 2 before "
     "halving the buckets", "halve num_buckets first (bidirectional), then max_exact = num_buckets // 2"),
    ("round", "logarithmic bucket rounded instead of floored", "you rounded the logarithmic bucket to the nearest "
     "integer", "truncate it: .long() (or floor), as T5 does"),
    ("linear", "no logarithmic buckets", "your distances beyond max_exact each get their own bucket until the last",
     "for distance ≥ max_exact: max_exact + log(distance / max_exact) / log(max_distance / max_exact) "
     "× (num_buckets − max_exact)"),
    ("max_distance", "max_distance ignored", "your buckets use 128 whatever `max_distance` is passed",
     "use the max_distance argument"),
    ("no_offset", "no offset for keys after the query", "in bidirectional mode keys after the query (j − i > 0) "
     "use the upper half of the buckets; yours share the lower half with the keys before it",
     "add num_buckets // 2 to the bucket where j − i > 0: (rel > 0).long() * (num_buckets // 2)"),
    ("ceil", "logarithmic bucket rounded up instead of floored", "you rounded the logarithmic bucket up (ceil)",
     "truncate it: .long() (or floor), as T5 does"),
    ("offset_before", "upper half of the buckets given to the keys before the query", "you added num_buckets // 2 "
     "where j − i < 0; the upper half is for the keys after the query (j − i > 0)",
     "offset = (rel > 0).long() * (num_buckets // 2) with rel = j − i"),
    ("uni_sign", "not bidirectional: distance of the keys after the query", "with bidirectional=False you took "
     "the distance as max(j − i, 0), which counts the keys after the query; T5's causal buckets count the keys "
     "before it, max(i − j, 0)", "distance = (-rel).clamp(min=0) with rel = j − i"),
]
_T5_TABLE = _table(_T5_ROWS, _t5) + [
    Known("transposed", _T5_ROWS[0][1], _T5_ROWS[0][2], _T5_ROWS[0][3], lambda *case: _t5(*case).transpose(-2, -1))]
_T5_CLAMP = [(kind, r".*" if kind == "IndexError" else r"out of (?:bounds|range)", "a bucket index reached "
              "num_buckets or more: distances beyond max_distance must be clamped to the last bucket of their half, "
              "and in bidirectional mode each half has num_buckets // 2 buckets", "clamp the logarithmic bucket: "
              "torch.clamp(bucket, max=num_buckets - 1) (num_buckets already halved)")
             for kind in ("IndexError", "RuntimeError", "ValueError")]


def _t5_measured(failure: Failure, out: torch.Tensor, n: int, table: torch.Tensor, bi: bool, md: int) -> None:
    """Re-raise ``failure``; when each entry is a table lookup, say which relative positions get which bucket."""
    if failure.diagnosis.cause or tuple(out.shape) != (table.shape[1], n, n):
        raise failure
    hits = torch.isclose(out.double().permute(1, 2, 0)[:, :, None, :], table.double()[None, None], atol=1e-6,
                         rtol=1e-5).all(-1)  # (n, n, num_buckets): which buckets' rows this (i, j) holds
    if not bool(hits.any(-1).all()):
        _refine(failure, "entries that are not table values", "some of your entries are no row of `table` for their "
                "(i, j): each bias must be the table's value itself, table[bucket, head] (nothing added, scaled, "
                "averaged or mixed between heads)", _T5_FIX)
    if bool((hits.sum(-1) > 1).any()):
        raise failure  # equal rows in the table: the buckets cannot be read back
    mine, right = hits.float().argmax(-1), _t5_buckets(n, table.shape[0], bi, md)[0]
    rel = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    wrong = sorted({int(r) for r in rel[mine != right]})
    if any(len({int(b) for b in mine[rel == r]}) > 1 for r in wrong):
        _refine(failure, "buckets that depend on i and j, not on j − i", "your entries are table values, but two "
                "pairs (i, j) with the same j − i get different buckets: the bucket must be a function of j − i "
                "alone", _T5_FIX)
    half = table.shape[0] // 2 if bi else table.shape[0]
    dist = [abs(r) if bi else max(-r, 0) for r in wrong]
    region = " (all exact distances, below max_exact)" if max(dist) < half // 2 else \
        " (all in the logarithmic range, distance ≥ max_exact)" if min(dist) >= half // 2 else ""
    shown = "; ".join(f"j − i = {r} → bucket {int(mine[rel == r][0])}, T5's {int(right[rel == r][0])}"
                      for r in wrong[:5]) + ("…" if len(wrong) > 5 else "")
    many = f"{len(wrong)} relative positions get" if len(wrong) > 1 else "1 relative position gets"
    _refine(failure, "wrong buckets", f"your entries are table values, one bucket per j − i as they should be, but "
            f"{many} the wrong bucket{region}: {shown}", _T5_FIX)


def _t5_cases() -> list[tuple]:
    g = _gen(7)
    return [(n, torch.randn(nb, heads, generator=g, dtype=torch.float64).to(dtype), bi, md)
            for n, nb, heads, bi, md, dtype in [
                (6, 32, 2, True, 128, torch.float64), (40, 32, 3, True, 128, torch.float64),
                (40, 32, 1, False, 20, torch.float64), (1, 8, 4, True, 16, torch.float64),
                (30, 8, 2, True, 12, torch.float64), (25, 16, 2, False, 64, torch.float64),
                (35, 32, 2, True, 24, torch.float32), (12, 4, 2, True, 8, torch.float64),
                (30, 10, 2, True, 20, torch.float64), (30, 9, 1, False, 24, torch.float64),
                (8, 3, 2, False, 2, torch.float64), (60, 10, 2, False, 256, torch.float64)]]


@check("relative_position_bias",
       expects="a function relative_position_bias(n, table, bidirectional=True, max_distance=128) returning (A, n, n)")
def check_relative_position_bias(fn: Learner) -> str:
    cases = _t5_cases()
    suspects = Suspects(_T5_TABLE, atol=1e-6, rtol=1e-5)
    for n, table, bi, md in cases:
        nb, heads = table.shape
        tried = (f"relative_position_bias({n}, table ({nb} buckets × {heads} heads), bidirectional={bi}, "
                 f"max_distance={md})")
        out = as_tensor(_call(fn, (n, table, bi, md), tried, f"a ({heads}, {n}, {n}) tensor", patterns=_T5_CLAMP),
                        tried=tried)
        buckets, alt = _t5_buckets(n, nb, bi, md)
        expected, alt_expected = (table[b].permute(2, 0, 1).double() for b in (buckets, alt))
        if tuple(out.shape) == (n, n, heads) and heads != n:
            fail("heads last: shape (n, n, A)", tried=tried, got=f"shape {tuple(out.shape)}",
                 expected=f"shape {(heads, n, n)}", cause="table[buckets] has the heads last",
                 fix="move them first: table[buckets].permute(2, 0, 1)")
        try:
            expect_shape(out, expected.shape, tried=tried, what="your bias", fix="(A, n, n): one (n, n) matrix per head")
        except Failure as failure:
            _kept_slice(failure, out, expected, ("head", "query", "key"))
            raise
        # where the logarithm lands on a whole number, float32 code may take the bucket below: both are right
        took_alt = torch.isclose(out.double(), alt_expected, atol=1e-6, rtol=1e-5)
        expected = torch.where(took_alt, alt_expected, expected)
        try:
            suspects.expect(out, expected, (n, table, bi, md), tried=tried, what="your bias", fix=_T5_FIX, axes=_HEAD_AXES,
                            again=lambda *case: as_tensor(fn(*case), tried=tried), distinguish=cases)
        except Failure as failure:
            _t5_measured(failure, out, n, table, bi, md)
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


_SLOPE_FIX = ("slope_a = 2^(−8(a+1)/A) for a = 0 … A − 1: a geometric sequence starting at 2^(−8/A) with ratio "
              "2^(−8/A)")
_ABS = "use the distance: (i − j).abs()"
_ALIBI_TABLE = _table([
    ("halve", "slopes halve from head to head whatever A", "your slopes are 1/2, 1/4, 1/8, …: right only for 8 heads",
     _SLOPE_FIX),
    ("from1", "slopes start at 1", "your first slope is 2^0 = 1: you counted heads from 0 in 2^(−8a/A)", _SLOPE_FIX),
    ("reversed", "slopes in reverse order", "your smallest slope is on head 0", "head 0 has the largest slope, "
     "2^(−8/A)"),
    ("linear", "slopes not geometric", "your slopes grow linearly ((a + 1)/A)", _SLOPE_FIX),
    ("inverse", "slopes not geometric", "your slopes are 1/(a + 1)", _SLOPE_FIX),
    ("falling", "slopes not geometric", "your slopes fall linearly (1 − (a + 1)/(A + 1))", _SLOPE_FIX),
    ("positive", "bias positive", "your bias grows with distance (+slope·|i − j|): far keys are favoured",
     "negate it: bias = −slope_a·|i − j|"),
    ("signed", "not symmetric: −slope·(i − j) without the absolute value", "your bias is positive above the diagonal "
     "(keys after the query); the docstring asks for −slope_a·|i − j| everywhere", _ABS),
    ("signed_T", "not symmetric: −slope·(i − j) without the absolute value", "your bias is positive below the "
     "diagonal", _ABS),
    ("causal", "zero for keys after the query", "your bias is −slope·(i − j) for j ≤ i and 0 above the diagonal (the "
     "causal form, as if a mask hid those keys); the docstring asks for −slope_a·|i − j| everywhere", _ABS),
    ("heads_last", "heads last: shape (n, n, A)", "your heads are on the last axis", "stack the heads first: (A, n, n)"),
], _alibi)


def _alibi_measured(failure: Failure, out: torch.Tensor, heads: int) -> None:
    """Re-raise ``failure``; when the bias has the form −slope_a·|i − j| with wrong slopes, say what they are."""
    n = out.shape[-1]
    if failure.diagnosis.cause or n < 2 or tuple(out.shape) != (heads, n, n):
        raise failure
    distance = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().double()
    slopes = -out[:, 1, 0].double()  # (A,)
    if not same(out.double(), -slopes[:, None, None] * distance, atol=1e-6, rtol=1e-5):
        raise failure
    shown, expected = (", ".join(fmt(float(s)) for s in t[:6]) + ("…" if heads > 6 else "")
                       for t in (slopes, ref.alibi_slopes(heads)))
    got, summary = f"your slopes are {shown}", "wrong slopes"
    if heads > 2 and bool((slopes[:-1] != 0).all()):
        ratios = slopes[1:] / slopes[:-1]
        if torch.allclose(ratios, ratios[0].expand_as(ratios), rtol=1e-4):
            got = (f"your slopes {shown} are geometric with ratio {fmt(float(ratios[0]))}, expected 2^(−8/A) = "
                   f"{fmt(2 ** (-8 / heads))} starting at the same value")
        else:
            got = f"your slopes {shown} are not geometric (ratios {', '.join(fmt(float(r)) for r in ratios[:4])}…)"
            summary = "slopes not geometric"
    fail(summary, tried=failure.diagnosis.tried, got=got,
         expected=f"slopes {expected}: 2^(−8(a+1)/A) for a = 0 … A − 1",
         cause="the form −slope·|i − j| is right; the slopes are not", fix="slope = 2 ** (-8 * (a + 1) / A)")


_ALIBI_CASES = [(5, 8), (7, 4), (1, 4), (6, 1), (6, 16), (12, 2), (3, 32)]


@check("alibi_bias", expects="a function alibi_bias(n, n_heads) returning an (n_heads, n, n) tensor")
def check_alibi_bias(fn: Learner) -> str:
    suspects = Suspects(_ALIBI_TABLE, atol=1e-7, rtol=1e-5)
    for n, heads in _ALIBI_CASES:
        tried = f"alibi_bias({n}, {heads})"
        out = as_tensor(_call(fn, (n, heads), tried, f"an ({heads}, {n}, {n}) tensor"), tried=tried)
        _floating(out, tried, "the slopes are fractions: compute in floating point")
        try:
            suspects.expect(out, _alibi(n, heads), (n, heads), tried=tried, what="your bias", axes=_HEAD_AXES,
                            again=lambda *case: as_tensor(fn(*case), tried=tried), distinguish=_ALIBI_CASES,
                            fix="bias[a, i, j] = −slope_a·|i − j| with slope_a = 2^(−8(a+1)/A)")
        except Failure as failure:
            if tuple(out.shape) != (heads, n, n):
                _kept_slice(failure, out, _alibi(n, heads), ("head", "query", "key"))
            _alibi_measured(failure, out, heads)
    return f"matches −slope_a·|i − j| on {len(_ALIBI_CASES)} cases (1 to 32 heads, n = 1, slopes 2^(−8(a+1)/A))"


# ================================================================================== RoPE
def _rope(x: torch.Tensor, positions=None, base: float = 10000.0, mistake: str = "") -> torch.Tensor:
    x = x.double()
    n, d = x.shape[-2:]
    pos = torch.arange(n) if positions is None or mistake == "positions" else torch.as_tensor(positions)
    pos = pos.double() + (1 if mistake == "from1" else 0)
    base = 10000.0 if mistake == "base" else base
    exponent = (torch.arange(d // 2) if mistake == "half" else torch.arange(0, d, 2)).double() / d  # (d/2,)
    angles = {"divide": pos[:, None] / base ** (-exponent), "intdiv": pos[:, None].expand(-1, d // 2)}.get(
        mistake, pos[:, None] * base ** (-exponent)) * (-1 if mistake == "sign" else 1)
    if mistake == "none":
        return x
    cos, sin = torch.cos(angles), torch.sin(angles)
    if mistake == "swap":
        cos, sin = sin, cos
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
    ("halves", "rotated pairs (r, r + d/2) instead of (2r, 2r + 1)", "you paired each dimension with the one half a "
     "vector away (GPT-NeoX / Hugging Face LLaMA's rotate_half); the docstring pairs neighbours, as the RoFormer paper",
     "rotate x[..., 0::2] with x[..., 1::2]"),
    ("sign", "rotated by −θ instead of +θ", "your rotation goes the other way: (x_2r cos + x_2r+1 sin, −x_2r sin + "
     "x_2r+1 cos)", _ROPE_FIX),
    ("half", "frequencies base^(−r/d) instead of base^(−2r/d)", "your exponent uses the pair index r over d",
     "θ_r = base ** (-2 * r / d) for r = 0 … d/2 − 1 (torch.arange(0, d, 2) / d)"),
    ("swap", "cos and sin swapped", "you multiplied by sin where cos belongs and the other way round", _ROPE_FIX),
    ("unpaired", "rotated pairs written back as halves", "you rotated the right pairs but returned all the rotated "
     "first members, then all the second members, instead of putting each pair back in place",
     "interleave them back: torch.stack([first, second], dim=-1).flatten(-2)"),
    ("positions", "positions ignored", "you rotated by 0 … n − 1 whatever `positions` is passed",
     "use the positions argument when it is given (a KV cache passes the true positions of the new tokens)"),
    ("from1", "positions off by one", "you counted positions from 1", "position 0 is not rotated at all"),
    ("base", "base ignored", "your angles use 10000 whatever `base` is passed", "use the base argument"),
    ("divide", "angles t / θ_r instead of t · θ_r", "you divided the position by θ_r = base^(−2r/d), so the "
     "angles grow with r instead of shrinking", "angle = t * base ** (-2 * r / d)"),
    ("intdiv", "every pair turns by the same angle t", "your θ_r came out 1 for every pair: the exponent 2r/d was "
     "computed with integer division (or integer tensors)", "compute the exponent in floating point: "
     "torch.arange(0, d, 2) / d"),
    ("none", "x returned unrotated", "your result is x itself: nothing was rotated", _ROPE_FIX),
    ("inplace", "the second line used the already rotated x_2r", "you overwrote x_2r with its rotated value and "
     "then computed x_2r+1 from it (an in-place update, or one variable reused): the new x_2r+1 must use the old x_2r",
     "compute both from the originals: even, odd = x[..., 0::2], x[..., 1::2], then stack (even·cos − odd·sin, "
     "even·sin + odd·cos)"),
    ("repeat", "cos and sin laid out with .repeat, not .repeat_interleave", "with neighbouring pairs (2r, 2r + 1) "
     "both members need angle r: cos and sin repeated as c0 c0 c1 c1 … (repeat_interleave); .repeat gives c0 c1 … "
     "c0 c1 …, so most pairs mix two frequencies", "cos.repeat_interleave(2, dim=-1)"),
    ("mixed", "rotate_half with interleaved cos and sin", "you mixed the two conventions: rotate_half pairs i with "
     "i + d/2, while your cos and sin are laid out for neighbouring pairs", "for neighbouring pairs turn x as "
     "(−x_2r+1, x_2r) pair by pair: torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)"),
], _rope)


def _rope_measured(fn: Learner, failure: Failure, out: torch.Tensor, x, given, base) -> None:
    """Re-raise ``failure``, or say what the learner's rotation does, measured on extra calls: on unit pairs
    (1, 0), whether each pair turns within itself and by which angle, whether the positions passed are used as
    such, and whether ``base`` changes anything."""
    n, d = x.shape[-2:]
    if failure.diagnosis.cause or tuple(out.shape) != tuple(x.shape):
        raise failure
    unit = torch.zeros(n, d, dtype=torch.float64)
    unit[:, 0::2] = 1.0  # every pair (1, 0): rotated by a, it becomes (cos a, sin a)
    ask = lambda *args: call_or_skip(lambda: as_tensor(fn(*args), tried=failure.diagnosis.tried).double())  # noqa: E731
    turned = ask(unit, given, base)
    if turned is None or tuple(turned.shape) != (n, d):
        raise failure
    first, second = turned[:, 0::2], turned[:, 1::2]  # (n, d/2)
    positions = (torch.arange(n) if given is None else torch.as_tensor(given)).double()
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    if not torch.allclose(first ** 2 + second ** 2, torch.ones_like(first), atol=1e-4):
        _refine(failure, "not a rotation of each pair", "given pairs (x_2r, x_2r+1) = (1, 0), your function returns "
                "pairs whose length is not 1: it does not turn each neighbouring pair within itself (it mixes "
                "dimensions of different pairs, or the two members use different angles)", _ROPE_FIX)
    angles = torch.atan2(second, first)  # (n, d/2)
    turns = lambda t, a: torch.allclose(t[:, 0::2], torch.cos(a), atol=1e-4) and \
        torch.allclose(t[:, 1::2], torch.sin(a), atol=1e-4)  # noqa: E731
    if given is not None and not turns(turned, positions[:, None] * theta):
        default = ask(unit, None, base)
        if default is not None and default.shape == (n, d) and turns(default, torch.arange(n)[:, None] * theta):
            _refine(failure, "positions mishandled", "with positions=None your rotation is right, but with the "
                    "positions passed it is not: the angles must be t·θ_r with t the given position itself (not "
                    "shifted, added to, or mixed with 0 … n − 1)", "positions = torch.arange(n) if positions is None "
                    "else positions; then angles = positions[:, None] * θ")
    other_base = 500.0 if base != 500.0 else 10000.0
    if bool((angles.abs() > 1e-6).any()) and d >= 4:
        other = ask(x, given, other_base)
        if other is not None and same(other, out.double(), atol=0, rtol=0):
            _refine(failure, "base ignored", f"your result is the same for base = {base:g} and base = "
                    f"{other_base:g}: a fixed base sits in your code", "use the base argument: θ_r = base ** (-2 * r / d)")
    moving = positions != 0
    if not moving.any():
        _rope_coefficients(failure, ask(1.0 - unit, given, base), turned, out, x, positions[:, None] * theta)
        raise failure
    per_position = angles[moving] / positions[moving, None]  # (moving, d/2): the angle per unit of position
    if not turns(turned, positions[:, None] * per_position[:1]):
        _refine(failure, "angles not proportional to the positions", f"given pairs (1, 0) at positions "
                f"{', '.join(str(int(p)) for p in positions[:6])}, your rotation angles are not t·θ_r for one θ_r per "
                "pair: check how the positions enter the angles", _ROPE_FIX)
    omega = per_position[0]
    if not (torch.allclose(torch.cos(omega), torch.cos(theta), atol=1e-4) and
            torch.allclose(torch.sin(omega), torch.sin(theta), atol=1e-4)):
        _refine(failure, "wrong rotation frequencies", "given pairs (1, 0), your function turns each pair within "
                "itself by t·ω_r, as it should, but with the " + _frequency_cause(omega, theta, base, d), _ROPE_FIX)
    _rope_coefficients(failure, ask(1.0 - unit, given, base), turned, out, x, positions[:, None] * theta)
    raise failure


def _rope_coefficients(failure: Failure, other: torch.Tensor | None, turned: torch.Tensor, out: torch.Tensor,
                       x: torch.Tensor, angle: torch.Tensor) -> None:
    """When the learner's map turns each pair (x_2r, x_2r+1) into a linear combination of that pair alone (read off
    the unit pairs (1, 0) and (0, 1), and checked on x), name the coefficients that differ from the rotation's."""
    if other is None or other.shape != turned.shape:
        return
    coef = [[turned[:, 0::2], other[:, 0::2]], [turned[:, 1::2], other[:, 1::2]]]  # new (even, odd) from (x_2r, x_2r+1)
    xe, xo = x.double()[..., 0::2], x.double()[..., 1::2]
    mine = torch.stack([coef[0][0] * xe + coef[0][1] * xo, coef[1][0] * xe + coef[1][1] * xo], -1).flatten(-2)
    if not same(mine, out.double(), atol=1e-4, rtol=1e-4):
        return  # not a map of each pair alone: the other measurements say more
    c, s_ = torch.cos(angle), torch.sin(angle)
    names = {"cos(t·θ_r)": c, "−cos(t·θ_r)": -c, "sin(t·θ_r)": s_, "−sin(t·θ_r)": -s_, "0": 0 * c, "1": 1 + 0 * c}
    right = [["cos(t·θ_r)", "−sin(t·θ_r)"], ["sin(t·θ_r)", "cos(t·θ_r)"]]
    said = []
    for row, new in enumerate(("x_2r", "x_2r+1")):
        for col, old in enumerate(("x_2r", "x_2r+1")):
            if not torch.allclose(coef[row][col], names[right[row][col]], atol=1e-4):
                seen = next((k for k, v in names.items() if torch.allclose(coef[row][col], v, atol=1e-4)), None)
                said.append(f"the new {new} takes {old} × {seen or 'another factor'} (a rotation: × {right[row][col]})")
    if said:
        _refine(failure, "not the rotation's coefficients", "your function maps each pair (x_2r, x_2r+1) to a "
                "combination of that pair, as a rotation does, but " + "; ".join(said), _ROPE_FIX)


def _rope_cases() -> list[tuple[str, tuple]]:
    g = _gen(12)
    x = lambda *shape, dtype=torch.float64: torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)  # noqa: E731
    return [("x (6, 8), default positions", (x(6, 8),)),
            ("x (2, 3, 5, 16): batch × heads, default positions", (x(2, 3, 5, 16),)),
            ("x (3, 8) at positions [0, 5, 2]", (x(3, 8), torch.tensor([0, 5, 2]))),
            ("x (1, 4): one new token at position 7", (x(1, 4), torch.tensor([7]))),
            ("x (4, 2): d = 2", (x(4, 2), torch.arange(4))),
            ("x (2, 6, 8) at positions 10 … 15", (x(2, 6, 8), torch.arange(10, 16))),
            ("x (5, 8), base 500", (x(5, 8), torch.arange(5), 500.0)),
            ("x (2, 7, 12) float32, default positions", (x(2, 7, 12, dtype=torch.float32),)),
            ("x (3, 8) at positions [1000, 2500, 4096]", (x(3, 8), torch.tensor([1000, 2500, 4096])))]


@check("apply_rope", expects="a function apply_rope(x, positions=None, base=10000.0) returning a tensor shaped like x")
def check_apply_rope(fn: Learner) -> str:
    cases = _rope_cases()
    suspects = Suspects(_ROPE_TABLE, atol=1e-4, rtol=1e-4)
    signature = [("TypeError", "argument", "your function does not take positions and base",
                  "keep the signature apply_rope(x, positions=None, base=10000.0)")]
    for name, args in cases:
        x = args[0]
        shown = ["x", "positions" if len(args) > 1 and args[1] is not None else "None", "base=500"][:len(args)]
        tried = f"apply_rope({', '.join(shown)}) on {name}"
        out = as_tensor(_call(fn, args, tried, "a tensor shaped like x", patterns=signature), tried=tried)
        expect_shape(out, x.shape, tried=tried, what="your result", fix="the result has x's shape (..., n, d)")
        if out.dtype != x.dtype and out.is_floating_point():
            fail(f"dtype changed from {str(x.dtype)[6:]} to {str(out.dtype)[6:]}", tried=tried, got=str(out.dtype),
                 expected=str(x.dtype), cause="your cos and sin are in another dtype, and multiplying promoted the "
                 "result", fix="convert cos and sin to x.dtype before multiplying")
        case = (x, args[1] if len(args) > 1 else None, args[2] if len(args) > 2 else 10000.0)
        atol = 3e-3 if "4096" in name else 1e-5 if x.dtype == torch.float64 else 1e-4
        try:
            suspects.expect(out, _rope(*case), case, tried=tried, what="your rotated x", atol=atol, rtol=1e-4,
                            fix=_ROPE_FIX, again=lambda *c: as_tensor(fn(*c), tried=tried))
        except Failure as failure:
            _rope_measured(fn, failure, out, *case)
    # The relative property, on the learner's own rotations: q·k depends only on the distance.
    g = _gen(13)
    q, k = torch.randn(1, 16, generator=g, dtype=torch.float64), torch.randn(1, 16, generator=g, dtype=torch.float64)
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
_DECODE_ROWS = [
    ("restart", "positions restart at 0", "you rotated the new tokens by positions 0 … n_new − 1, as if each step "
     "began a new sequence: a new token's position is its absolute one, the cache length plus its offset, so its "
     "scores against the cached keys see the wrong distances", _DECODE_FIX),
    ("rerotate", "cached keys rotated again", "you rotated the cached keys once more by 0 … n_cache − 1: they were "
     "stored rotated, each by its own position, and must be kept as they are", "leave k_cache alone; rotate only "
     "the new keys, then append them"),
    ("all_again", "cache rotated again with the new keys", "you appended the new keys and rotated the whole cache "
     "by 0 … n_cache + n_new − 1: the cached keys were already rotated, so they are turned twice", "rotate only "
     "the new keys, then append them"),
    ("k_plain", "new keys stored unrotated", "you appended the new keys without rotating them: every later query "
     "would meet them as if they sat at position 0", "rotate k_new by the new positions before appending it"),
    ("q_plain", "queries not rotated", "you returned q_new unrotated", "rotate q_new by the new positions too"),
    ("plus1", "positions off by one (one too far)", "you started the new positions at n_cache + 1; the first new "
     "token sits right after the n_cache cached ones, at position n_cache (positions count from 0)", _DECODE_FIX),
    ("minus1", "positions off by one (one too early)", "you started the new positions at n_cache − 1, the last "
     "cached token's position", _DECODE_FIX),
    ("same", "every new token at the same position", "you rotated every new token by n_cache; each sits one "
     "further: n_cache, n_cache + 1, …", _DECODE_FIX),
    ("end", "every new token at the last position", "you rotated every new token by the new length minus 1", _DECODE_FIX),
    ("prepend", "new keys put before the cache", "you put the new keys first; the cache keeps the order of the "
     "positions: old keys first, new ones appended", "torch.cat([k_cache, k_rotated], dim=-2)"),
]
_DECODE_Q, _DECODE_K = (_table(_DECODE_ROWS, lambda *c, part=part: _decode(*c)[part]) for part in (0, 1))


def _decode_cases() -> list[tuple[str, tuple]]:
    g = _gen(31)
    r = lambda *shape, dtype=torch.float64: torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)  # noqa: E731
    cached = lambda x: ref.apply_rope(x, torch.arange(x.shape[-2]))  # noqa: E731 - stored rotated, as a cache holds them
    return [("a prompt of 4 tokens, empty cache (0, 8)", (r(4, 8), r(4, 8), r(0, 8))),
            ("one new token after 5 cached ones, d = 8", (r(1, 8), r(1, 8), cached(r(5, 8)))),
            ("3 new tokens after 6 cached ones", (r(3, 8), r(3, 8), cached(r(6, 8)))),
            ("batch × heads (2, 4): one new token after 7 cached ones, d = 16",
             (r(2, 4, 1, 16), r(2, 4, 1, 16), cached(r(2, 4, 7, 16)))),
            ("float32: 2 new tokens after 3 cached ones", (r(2, 4, dtype=torch.float32), r(2, 4, dtype=torch.float32),
                                                           cached(r(3, 4, dtype=torch.float32)))),
            ("one new token after 1000 cached ones, d = 4", (r(1, 4), r(1, 4), cached(r(1000, 4))))]


@check("rope_decode_step",
       expects="a function rope_decode_step(q_new, k_new, k_cache) returning (q_rotated, extended k_cache)")
def check_rope_decode_step(fn: Learner) -> str:
    cases = _decode_cases()
    on_q, on_k = Suspects(_DECODE_Q, atol=1e-4, rtol=1e-4), Suspects(_DECODE_K, atol=1e-4, rtol=1e-4)
    for name, case in cases:
        tried = f"rope_decode_step(q_new, k_new, k_cache) with {name}"
        q_out, k_out = _pairs(_call(fn, case, tried, "(q_rotated, k_cache extended)"), tried, ("q_rotated", "k_cache"))
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
def _additive(q, k, v, Wq, Wk, w, mask=None, mistake: str = "") -> tuple[torch.Tensor, torch.Tensor]:
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
    if mistake == "after" and mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    if mistake == "naive":  # no maximum subtracted, in the input's dtype: e^100 overflows float32
        e = torch.exp(scores.to(q.dtype if w.abs().max() < 50 else torch.float32))
        weights = (e / e.sum(-1, keepdim=True)).double()
    out = (scores if mistake == "scores_v" else weights) @ v
    return out, weights.transpose(-2, -1) if mistake == "weights_T" else weights


_ADD_FIX = "scores[i, j] = w · tanh(W_q q_i + W_k k_j); weights = softmax over the keys (no scale); output = weights @ v"
_MASKED = ("polarity", "after", "ignored", "zero_fill")
_ADD_ROWS = [
    ("transposed", "W_q and W_k used transposed", "you computed q @ W_q, but W_q has shape (d_h, d_q): W_q q_i is "
     "q @ W_q.T", "project with q @ W_q.T and k @ W_k.T"),
    ("no_tanh", "tanh missing", "you summed the projections without tanh, so the score is linear and splits into a "
     "query part and a key part", "apply torch.tanh to W_q q_i + W_k k_j before the dot product with w"),
    ("separate", "tanh applied to each projection separately", "you computed tanh(W_q q) + tanh(W_k k); the tanh "
     "acts on their sum", "torch.tanh(hq[..., :, None, :] + hk[..., None, :, :])"),
    ("no_w", "w ignored", "you summed the hidden units instead of weighting them with w", "take the dot product "
     "with w: hidden @ w"),
    ("w_before", "w applied before the tanh", "you computed tanh(wᵀ(W_q q + W_k k)); the tanh acts on each hidden "
     "unit first, then w weights them: wᵀ tanh(W_q q + W_k k)", "torch.tanh(hq[..., :, None, :] + hk[..., None, :, :]) "
     "@ w"),
    ("sigmoid", "sigmoid instead of tanh", "your hidden units go through a sigmoid; Bahdanau's score uses tanh",
     "torch.tanh(W_q q + W_k k)"),
    ("relu", "ReLU instead of tanh", "your hidden units go through a ReLU; Bahdanau's score uses tanh",
     "torch.tanh(W_q q + W_k k)"),
    ("scaled", "scores scaled by √d_h", "additive attention has no 1/√d scale", "leave the scores unscaled"),
    ("scaled_dk", "scores scaled by √d_k", "additive attention has no 1/√d scale", "leave the scores unscaled"),
    ("dim", "softmax over the queries", "you took the softmax over axis -2", "torch.softmax(scores, dim=-1)"),
    ("polarity", "mask polarity inverted", "you blocked the positions where the mask is True; True means 'may "
     "attend'", "scores.masked_fill(~mask, float('-inf'))"),
    ("after", "mask applied after the softmax", "you zeroed the blocked weights after the softmax, so the rows no "
     "longer sum to 1", "fill blocked scores with -inf before the softmax"),
    ("ignored", "mask ignored", "blocked keys still get weight", "fill blocked scores with -inf before the softmax"),
    ("zero_fill", "blocked scores set to 0, not −inf", "a score of 0 still gets weight e^0 / Σ: the blocked keys "
     "keep part of the attention", "fill blocked scores with float('-inf') before the softmax"),
    ("weights_T", "weights transposed", "your weights have one row per key", "keep (..., n_q, n_k)"),
    ("scores_v", "output from the scores", "you multiplied v by the scores, not by the weights",
     "output = weights @ v"),
    ("naive", "no maximum subtracted", "your softmax exponentiates the raw scores, and e^100 overflows float32 "
     "(inf / inf = NaN)", "use torch.softmax (or subtract each row's maximum first)"),
]


def _variant(part: int, key: str) -> Callable[..., Any]:
    def make(q, k, v, Wq, Wk, w, mask=None):
        return None if mask is None and key in _MASKED or key == "naive" and w.abs().max() < 50 else \
            _additive(q, k, v, Wq, Wk, w, mask, key)[part]
    return make


_ADD_W, _ADD_OUT = ([Known(key, s, c, f, _variant(part, key)) for key, s, c, f in _ADD_ROWS] for part in (1, 0))


def _additive_cases() -> list[tuple[str, tuple]]:
    g = _gen(21)
    r = lambda *shape, dtype=torch.float64, scale=1.0: (  # noqa: E731
        torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)
    keep = torch.rand(4, 5, generator=g) < 0.6
    keep[torch.arange(4), torch.randint(0, 5, (4,), generator=g)] = True
    keep[0] = torch.tensor([True, False, True, False, False])
    padding = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])[:, None, :]  # (2, 1, 7)
    f32 = torch.float32
    return [
        ("q (4, 3), k (6, 5), v (6, 2), d_h = 7", (r(4, 3), r(6, 5), r(6, 2), r(7, 3), r(7, 5), r(7))),
        ("batch × heads (2, 3), n_q = 4, n_k = 5, d_h = 8, with a (4, 5) mask",
         (r(2, 3, 4, 6), r(2, 3, 5, 6), r(2, 3, 5, 3), r(8, 6), r(8, 6), r(8), keep)),
        ("square weights: d_q = d_k = d_h = 4", (r(3, 4), r(5, 4), r(5, 2), r(4, 4), r(4, 4), r(4))),
        ("one query per sequence, key padding mask (2, 1, 7)",
         (r(2, 1, 5), r(2, 7, 5), r(2, 7, 4), r(6, 5), r(6, 5), r(6), padding)),
        ("float32, n_q = 3, n_k = 3", tuple(r(*s, dtype=f32) for s in ((3, 4), (3, 4), (3, 2), (5, 4), (5, 4), (5,)))),
        ("large w (scores beyond ±100, float32)", (r(2, 4, dtype=f32), r(6, 4, dtype=f32), r(6, 3, dtype=f32),
                                                   r(8, 4, dtype=f32), r(8, 4, dtype=f32), r(8, dtype=f32, scale=120.0))),
    ]


def _constructs(q, k, v, Wq, Wk, w, mask=None) -> list[tuple[str, str, Callable[[], object]]]:
    """Wrong ways to pair the projections, run on the case: one that raises the learner's very message is named."""
    hq, hk = q @ Wq.T, k @ Wk.T
    return [
        ("you added W_q q_i and W_k k_j position by position (query i with key i); every query must meet every key",
         "broadcast: hq[..., :, None, :] + hk[..., None, :, :] gives (..., n_q, n_k, d_h)", lambda: hq + hk),
        ("you paired queries and keys with unsqueeze(1) and unsqueeze(0), which is right for 2-D input only: with "
         "leading batch axes the new axes land among them", "count from the end: hq[..., :, None, :] + "
         "hk[..., None, :, :] (or unsqueeze(-2) and unsqueeze(-3))", lambda: hq.unsqueeze(1) + hk.unsqueeze(0)),
        *[("you computed q @ W_q, but W_q has shape (d_h, d_q): W_q q_i is q @ W_q.T", "project with q @ W_q.T and "
           "k @ W_k.T", attempt) for attempt in (lambda: q @ Wq, lambda: k @ Wk)],
        *[("you projected q with W_k (or k with W_q)", "hq = q @ W_q.T, hk = k @ W_k.T", attempt)
          for attempt in (lambda: q @ Wk.T, lambda: k @ Wq.T)],
    ]


def _row_sums(failure: Failure, weights: torch.Tensor, expected: torch.Tensor) -> None:
    """Re-raise ``failure``, with the row sums as its cause when finite weights' rows do not sum to 1."""
    if failure.diagnosis.cause or tuple(weights.shape) != tuple(expected.shape) or \
            not bool(torch.isfinite(weights).all()):
        raise failure
    sums = weights.double().sum(-1)
    if bool(((sums - 1).abs() < 1e-3).all()):
        raise failure
    _refine(failure, "the weights' rows do not sum to 1", f"your rows sum to {fmt(float(sums.min()))} … "
            f"{fmt(float(sums.max()))}: the weights are not a softmax over the keys (the division by the sum is "
            "missing, or the softmax runs over another axis)",
            "weights = torch.softmax(scores, dim=-1) (blocked scores filled with -inf first)")


@check("additive_attention",
       expects="a function additive_attention(q, k, v, W_q, W_k, w, mask=None) returning (output, weights)")
def check_additive_attention(fn: Learner) -> str:
    cases = _additive_cases()
    on_w, on_out = Suspects(_ADD_W, atol=3e-5, rtol=1e-3), Suspects(_ADD_OUT, atol=3e-5, rtol=1e-3)
    for name, case in cases:
        masked = len(case) == 7
        tried = f"additive_attention(q, k, v, W_q, W_k, w{', mask' if masked else ''}) on {name}"
        takes_mask = [("TypeError", "argument", "your function does not take the mask", "keep the signature "
                       "additive_attention(q, k, v, W_q, W_k, w, mask=None)")] if masked else []
        result = _call(fn, case, tried, "(output, weights)", _constructs(*case), takes_mask)
        out, weights = _pairs(result, tried, ("output", "weights"))
        exp_out, exp_w = _additive(*case)
        tol = dict(atol=1e-6, rtol=1e-5) if case[0].dtype == torch.float64 else dict(atol=3e-5, rtol=1e-3)
        if same(out, exp_w, **tol) and same(weights, exp_out, **tol) and not same(out, exp_out, **tol):
            fail("returned (weights, output), not (output, weights)", tried=tried,
                 got="the right weights first, then the right output", expected="(output, weights)",
                 cause="you returned the two in the other order", fix="end with `return output, weights`")
        for given, what in ((exp_w, "the right weights"), (case[2], "v itself")):
            if tuple(out.shape) != tuple(exp_out.shape) and same(out, given.to(out.dtype), atol=1e-4, rtol=1e-3):
                fail(f"the output is {what}", tried=tried, got=f"an output of shape {tuple(out.shape)}: {what}",
                     expected=f"shape {tuple(exp_out.shape)}: weights @ v", cause=f"your output equals {what}: the "
                     "product of the weights with v was never taken (one operand of `weights @ v` is missing)",
                     fix="return weights @ v as the output")
        try:
            on_w.expect(weights, exp_w, case, tried=tried, what="the weights", fix=_ADD_FIX, **tol)
        except Failure as failure:
            _row_sums(failure, weights, exp_w)
        on_out.expect(out, exp_out, case, tried=tried, what="the output", fix=_ADD_FIX, **tol)
        for got, what in ((out, "the output"), (weights, "the weights")):
            kit.lower_precision(got, case[0].dtype, tried=tried, what=what, grid=False)
    return (f"matches wᵀ tanh(W_q q + W_k k) attention on {len(cases)} cases (batched, masks, n_q = 1, square weights, "
            "large scores)")
