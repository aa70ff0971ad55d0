"""Checks for notebook 12 (position): is_permutation_equivariant (a test the learner writes),
sinusoidal_encoding, relative_position_bias, alibi_bias, apply_rope and additive_attention.

The learner's *test* is checked by running it, in the learner's process (the probe
``position.permutation_test``), on functions whose answer is known: six that treat every position
alike (it must say "equivariant"; one has outputs near 0, where only an absolute tolerance absorbs
rounding) and five that see positions in different ways (it must say "not equivariant") — a test that cannot tell them apart fails, and the pattern of its answers names the flaw
(no permutation at all, an exact comparison, a reversal, a permutation that keeps token 0 in place…).
The check seeds torch's, NumPy's and Python's random generators before each call of the learner's test
(and restores them after), so a test that draws without a seed of its own gets the same draws every
run: its verdict never depends on chance (``tests/checks/test_position.py`` enumerates every permutation
of 6 tokens).

``rope_decode_step`` (RoPE with a KV cache) is checked on prompts and single-token steps, against
``attn_course.position.rope_decode_step``, naming the classic mistakes: positions restarting at 0 at every
step, cached keys rotated a second time, new keys stored unrotated, positions off by one.

The other checks compare with the course's references in float64 (``attn_course.position``), which
``tests/test_position.py`` holds to the papers' formulas and to Hugging Face's T5 buckets, and name the
conventions' classic mistakes (RoPE pairs or angle sign, j − i vs i − j, slopes not geometric,
sin/cos interleaving…).
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable

import numpy as np
import torch

from .. import position as ref
from .attention import lower_precision
from .boundary import Opaque, probe
from .compare import Failure, call_or_skip, same
from .core import (Learner, LearnerRaised, Mistake, as_tensor, check, expect_close, expect_shape, fail, fmt,
                   learner_error)
from .kit import reproduce as _reproduce

__all__ = ["check_is_permutation_equivariant", "check_sinusoidal_encoding", "check_relative_position_bias",
           "check_alibi_bias", "check_apply_rope", "check_rope_decode_step", "check_additive_attention"]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ================================================================================== the learner's test
#: The seed of torch's, NumPy's and Python's generators while the learner's test runs.
SEED = 12

@probe("position.permutation_test")
def _run_test(test: Callable[..., Any], variant: str) -> dict[str, Any]:
    """Learner-side: call the learner's test on one of the course's attention variants. Returns its verdict
    (as returned), whether it failed an ``assert``, and what it passed to the attention (shapes, size)."""
    attn = ref.attention_variant(variant)
    calls: list[dict[str, Any]] = []

    def watched(x):
        if isinstance(x, np.ndarray) and x.dtype.kind == "f" and len(calls) < 50:
            calls.append({"shape": list(x.shape), "absmax": float(np.abs(x).max()) if x.size else 0.0})
            if len(calls) <= 8 and x.size <= 4096:
                calls[-1]["x"] = torch.from_numpy(np.array(x, dtype=np.float64))
        elif isinstance(x, torch.Tensor) and len(calls) < 50:
            calls.append({"shape": list(x.shape),
                          "absmax": float(x.detach().abs().max()) if x.numel() and x.is_floating_point() else 0.0})
            if len(calls) <= 8 and x.numel() <= 4096 and x.is_floating_point():
                calls[-1]["x"] = x.detach().to(torch.float64).clone()
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


def _as_verdict(result: Any, tried: str) -> bool:
    """True (equivariant) or False from what the learner's test returned; None counts as a pytest-style pass."""
    verdict = result.get("verdict") if isinstance(result, dict) else result
    if verdict is None or isinstance(verdict, (bool, np.bool_)):
        return True if verdict is None else bool(verdict)
    if isinstance(verdict, (int, np.integer)) and verdict in (0, 1):
        return bool(verdict)
    got = verdict.text if isinstance(verdict, Opaque) else repr(verdict)[:60]
    fail("the test did not return True or False", tried=tried, got=f"{type(verdict).__name__}: {got}",
         expected="True (equivariant) or False (not)",
         fix="end with `return torch.allclose(...)` (a bool), or assert it pytest-style")


def _row_permutation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """perm with b = a[..., perm, :], when b reorders a's (distinct) rows and is not a itself; else None."""
    if a.shape != b.shape or a.dim() < 2 or a.shape[-2] < 2:
        return None
    rows_a, rows_b = a.reshape(-1, *a.shape[-2:]).transpose(0, 1), b.reshape(-1, *b.shape[-2:]).transpose(0, 1)
    rows_a, rows_b = rows_a.reshape(a.shape[-2], -1), rows_b.reshape(b.shape[-2], -1)  # (n, rest)
    if torch.equal(rows_a, rows_b):
        return None
    perm = []
    for row in rows_b:
        hits = (rows_a == row).all(-1).nonzero().flatten()
        if len(hits) != 1:
            return None
        perm.append(int(hits[0]))
    return torch.tensor(perm) if len(set(perm)) == len(perm) else None


def _inputs_evidence(runs: list[list[dict]]) -> dict[str, Any]:
    """What the inputs the learner's test passed to attn show, run by run (one run per attention variant):
    identical rows, one input only, a reordering of the batch axis, or a true reordering of one x's tokens."""
    found: dict[str, Any] = {}
    singles = []
    for calls in runs:
        one = _run_evidence(calls)
        singles.append(one.pop("single"))
        for key, value in one.items():
            found.setdefault(key, value)
    found["identical"] = bool(runs) and all(_run_evidence(c)["identical"] for c in runs)
    found["single"] = bool(singles) and all(singles)
    return found


def _run_evidence(calls: list[dict]) -> dict[str, Any]:
    xs = [c["x"] for c in calls if isinstance(c.get("x"), torch.Tensor) and c["x"].dim() >= 2]
    identical = bool(xs) and all(x.shape[-2] > 1 and bool((x == x[..., :1, :]).all()) for x in xs)
    single = bool(xs) and all(x.shape == xs[0].shape and torch.equal(x, xs[0]) for x in xs)
    for i, a in enumerate(xs):  # a reordering of a leading (batch) axis instead of the tokens
        for b in xs[i + 1:]:
            if a.dim() >= 3 and a.shape == b.shape and not torch.equal(a, b) and \
                    _row_permutation(a.flatten(1).unsqueeze(0), b.flatten(1).unsqueeze(0)) is not None:
                return {"identical": identical, "single": single, "batch_axis": tuple(a.shape)}
    for i, a in enumerate(xs):
        for b in xs[i + 1:]:
            for first, second in ((a, b), (b, a)):
                perm = _row_permutation(first, second)
                if perm is not None:
                    return {"identical": identical, "single": single, "x": first, "perm": perm}
    return {"identical": identical, "single": single}


def _largest_gap(evidence: dict[str, Any], names: list[str]) -> tuple[float, str]:
    """The largest |attn(x[perm]) − attn(x)[perm]| over ``names`` on the learner's own x and permutation."""
    x, perm = evidence["x"], evidence["perm"]
    gaps = [(ref.permutation_gap(ref.attention_variant(name), x, perm), name) for name in names]
    return max(gaps)


_TEST_FIX = ("draw x = torch.randn(n, d) with a few tokens (n ≥ 3, d ≥ 2), a random permutation perm = "
             "torch.randperm(n) that is neither the identity nor the reversal, and return "
             "torch.allclose(attn(x[perm]), attn(x)[perm], atol=1e-5)")


@check("is_permutation_equivariant",
       expects="a function is_permutation_equivariant(attn) returning True or False")
def check_is_permutation_equivariant(fn: Learner) -> str:
    results: dict[str, dict] = {}
    verdicts: dict[str, bool] = {}
    for name in ref.EQUIVARIANT + ref.POSITION_AWARE:
        tried = f"is_permutation_equivariant(attn) with attn = {name}"
        try:
            result = fn.observe("position.permutation_test", name)
        except LearnerRaised as exc:
            hint = {}
            if "attn takes" in exc.message:
                hint = dict(cause="you called attn with something other than a tensor of shape (n, d)",
                            fix="call attn(x) with x = torch.randn(n, d)")
            raise Failure(learner_error(exc, tried=tried, expected="True or False", **hint)) from None
        results[name] = result if isinstance(result, dict) else {"verdict": result}
        verdicts[name] = _as_verdict(result, tried)
    calls = [c for r in results.values() for c in r.get("calls", []) if isinstance(c, dict)]
    missed = [n for n in ref.POSITION_AWARE if verdicts[n]]
    rejected = [n for n in ref.EQUIVARIANT if not verdicts[n]]
    tried = (f"is_permutation_equivariant(attn) on {len(ref.EQUIVARIANT)} permutation-equivariant functions and "
             f"{len(ref.POSITION_AWARE)} position-aware attentions")
    shown = "; ".join(f"{n}: {'equivariant' if verdicts[n] else 'not equivariant'}" for n in verdicts)
    if not calls:
        fail("the test never calls attn", tried=tried, got=shown, expected="a verdict computed from attn's outputs",
             cause="your function returns without running the attention it is given",
             fix=_TEST_FIX)
    if set(rejected) == set(ref.EQUIVARIANT) and set(missed) == set(ref.POSITION_AWARE):
        fail("the test's verdicts are the wrong way round", tried=tried, got=shown,
             expected=f"True (equivariant) for the first {len(ref.EQUIVARIANT)}, False for the others",
             cause="your test returns True when the outputs differ and False when they agree (a `not` too many, or "
                   "an assert of the opposite)",
             fix="return torch.allclose(attn(x[perm]), attn(x)[perm], atol=1e-5): True means equivariant")
    evidence = _inputs_evidence([[c for c in r.get("calls", []) if isinstance(c, dict)] for r in results.values()])
    if rejected:
        if "elementwise tanh" in rejected:
            fail("the test rejects functions that ignore positions", tried=tried, got=shown,
                 expected=f"equivariant for the first {len(ref.EQUIVARIANT)} (even tanh(x), which treats every number alone)",
                 cause="your comparison is wrong even where the answer is exact: permuting the input must permute "
                       "the output's rows the same way — compare attn(x[perm]) with attn(x)[perm], not with attn(x) "
                       "or with the inverse permutation",
                 fix=_TEST_FIX)
        if "feature mixing" in rejected:
            fail("the test rejects functions that ignore positions", tried=tried, got=shown,
                 expected=f"equivariant for the first {len(ref.EQUIVARIANT)}",
                 cause="your test accepts tanh(x) but rejects a function that only mixes each token's own features: "
                       "your permutation moves the features (the last axis), not the tokens (the rows)",
                 fix="permute the rows: x[perm] (or x[..., perm, :] with batch axes)")
        fail("the test rejects attention without positions", tried=tried, got=shown,
             expected="equivariant for plain attention and its variants",
             cause="your test accepts the functions whose permuted outputs are bit-for-bit equal but rejects "
                   "attention, whose sums are added up in another order once the rows move: you compared without a "
                   "tolerance (==, torch.equal) or with one too tight for rounding",
             fix="compare with a tolerance: torch.allclose(a, b, atol=1e-5)")
    if len(missed) == len(ref.POSITION_AWARE):
        sizes = sorted({c["shape"][-2] for c in calls if len(c.get("shape", [])) >= 2})
        none = all(r.get("verdict") is None and not r.get("asserted") for r in results.values())
        if sizes == [1]:
            cause = "your inputs have a single token (n = 1): there is nothing to permute"
        elif none:
            cause = "your function returns None and never fails an assert: it computes a comparison but does not " \
                    "return it"
        elif evidence["identical"]:
            cause = "every row of your x is the same vector, so reordering the rows changes nothing"
        elif "batch_axis" in evidence:
            cause = (f"your permutation reorders the first axis of an x of shape {evidence['batch_axis']} (the batch), "
                     "not its tokens (axis -2): every batch entry is computed alone, so nothing can differ")
        elif evidence["single"]:
            cause = ("your test never runs attn on a reordering of x: it calls attn on one and the same x every "
                     "time, so it compares an output with itself, or its permutation leaves every token in place")
        elif "perm" in evidence:
            gap, worst = _largest_gap(evidence, list(ref.POSITION_AWARE))
            cause = (f"your test does run attn on x and on x with its rows reordered, but for {worst} the two outputs "
                     f"differ by up to {fmt(gap)} after the permutation and it still says equivariant: the "
                     "comparison lets that through (a tolerance far too loose, or an output compared with itself or "
                     "with something that does not change when the rows move)")
        elif any("x" in c for c in calls):
            cause = ("your test never runs attn on a reordering of the same x: its permutation leaves every token in "
                     "place (or it draws a new x instead of permuting the old one), so nothing can differ")
        else:
            cause = ("your test never permutes the input, or its permutation leaves every token in place, or it "
                     "compares an output with itself: nothing can differ")
        fail("the test calls everything equivariant", tried=tried, got=shown,
             expected="not equivariant for the five attentions that see positions (even a causal mask)",
             cause=cause, fix=_TEST_FIX)
    if missed:
        small = calls and max(c.get("absmax", 1.0) for c in calls) < 0.1
        sizes = sorted({c["shape"][-2] for c in calls if len(c.get("shape", [])) >= 2})
        if evidence["identical"]:
            cause = "every row of your x is the same vector, so reordering the rows changes nothing"
            fix = "draw x = torch.randn(n, d): different tokens"
        elif missed == ["symmetric distance bias"]:
            cause = ("your permutation keeps every distance |i − j| (a reversal does, as does swapping two tokens "
                     "of a sequence of 2): a bias that depends only on |i − j| goes unnoticed")
            fix = ("use a random permutation of a few tokens (n ≥ 3), drawn again while it is the identity or the "
                   "reversal: perm = torch.randperm(n)")
        elif small:
            cause = "your inputs are tiny (|x| < 0.1), so the scores barely differ and positional effects vanish"
            fix = "use inputs of a typical size: x = torch.randn(n, d)"
        elif sizes and max(sizes) <= 2:
            cause = f"your inputs have only {max(sizes)} tokens: a permutation of 2 is a reversal or nothing"
            fix = "use a few more tokens (n ≥ 3) and a random permutation"
        else:
            cause, fix = "", _TEST_FIX
        fail(f"the test misses {', '.join(missed)}", tried=tried, got=shown,
             expected=f"not equivariant for {', '.join(missed)}", cause=cause, fix=fix)
    return (f"tells {len(ref.EQUIVARIANT)} permutation-equivariant functions from {len(ref.POSITION_AWARE)} attentions "
            "that see positions")


# ================================================================================== shared by the value checks
class Refuted:
    """Mistakes an earlier case already ruled out: where the answer was right, a mistake whose output differed
    from the right one cannot be what the learner did. Two mistakes that coincide on one input are told apart
    by the cases before it."""

    def __init__(self) -> None:
        self.summaries: set[str] = set()

    def passed(self, mistakes: list[Mistake], expected: torch.Tensor, **tol: float) -> None:
        for m in mistakes:
            value = m.value()
            if value is not None and not same(value, expected, **tol):
                self.summaries.add((m.summary, m.cause))

    def remaining(self, mistakes: list[Mistake]) -> list[Mistake]:
        return [m for m in mistakes if (m.summary, m.cause) not in self.summaries]


def _frequency_cause(measured: torch.Tensor, expected: torch.Tensor, base: float, d: int) -> str:
    """What a set of per-pair frequencies (or angles per position) is, next to base^(−2r/d): a constant
    factor, one frequency for all, or base'^(−2r/d) for another base (= base^(−2r/d') for another d)."""
    shown = ", ".join(fmt(float(w)) for w in measured[:5]) + ("…" if len(measured) > 5 else "")
    want = ", ".join(fmt(float(w)) for w in expected[:5]) + ("…" if len(expected) > 5 else "")
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
            d_fit = -2 * math.log(base) / float(logs[0])
            base_fit = math.exp(-float(logs[0]) * d / 2)
            return (f"{text}. They are base'^(−2r/d) with base' = {fmt(base_fit)} instead of {fmt(base)} — the same "
                    f"numbers as base^(−2r/d') with d' = {fmt(d_fit)} instead of d = {d}")
    return text


# ================================================================================== sinusoidal encoding
def _sinusoid(n: int, d: int, base: float, mistake: str = "") -> torch.Tensor:
    p = torch.arange(n, dtype=torch.float64)[:, None] + (1 if mistake == "from1" else 0)
    base = 10000.0 if mistake == "base" else base
    cols = torch.arange(d, dtype=torch.float64)
    pair = torch.div(cols, 2, rounding_mode="floor")
    exponent = {"col": cols / d, "half": pair / d, "twocol": 2 * cols / d}.get(mistake, 2 * pair / d)
    angle = p * base ** exponent if mistake == "times" else p / base ** exponent
    even = (cols % 2 == 0)
    if mistake == "halves":
        half = (d + 1) // 2
        angle = p / base ** (2 * torch.arange(half, dtype=torch.float64) / d)
        return torch.cat([torch.sin(angle), torch.cos(angle[:, : d - half])], dim=-1)
    if mistake == "halves_cos_first":
        half = (d + 1) // 2
        angle = p / base ** (2 * torch.arange(half, dtype=torch.float64) / d)
        return torch.cat([torch.cos(angle), torch.sin(angle[:, : d - half])], dim=-1)
    if mistake == "intdiv":  # exponent 2r // d = 0: every pair turns at frequency 1
        angle = p.expand(n, d)
    if mistake == "swapped":
        return torch.where(even, torch.cos(angle), torch.sin(angle))
    if mistake == "all_sin":
        return torch.sin(angle)
    if mistake == "all_cos":
        return torch.cos(angle)
    out = torch.where(even, torch.sin(angle), torch.cos(angle))
    if mistake == "odd_last_cos" and d % 2:
        out[:, -1] = torch.cos(angle[:, -1])
    return out


_SIN_FIX = "column 2r = sin(t / base^(2r/d)) and column 2r + 1 = cos(t / base^(2r/d)), with t = 0 … n − 1"
_SIN_MISTAKES = [
    ("swapped", "sin and cos swapped", "your even columns hold cosines and the odd ones sines", _SIN_FIX),
    ("halves", "sin and cos in halves, not interleaved", "you put all the sines in the first half of the columns "
     "and the cosines in the second (tensor2tensor's layout), but the docstring interleaves them: sin in even "
     "columns, cos in odd ones", "pe[:, 0::2] = sin(…) and pe[:, 1::2] = cos(…)"),
    ("halves_cos_first", "sin and cos in halves, not interleaved", "you put all the cosines in the first half of the "
     "columns and the sines in the second", "pe[:, 0::2] = sin(…) and pe[:, 1::2] = cos(…)"),
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
]


def _sinusoid_frequencies(failure: Failure, out: torch.Tensor, n: int, d: int, base: float) -> None:
    """Re-raise ``failure``; when the answer is sin/cos of t·ω_r pair by pair, with wrong ω, say what the ω are."""
    if failure.diagnosis.cause or tuple(out.shape) != (n, d) or n < 3 or d < 2 or not out.is_floating_point():
        raise failure
    x = out.double()
    pairs = d // 2
    omega = torch.atan2(x[1, 0:2 * pairs:2], x[1, 1:2 * pairs:2])  # (pairs,): the angle at t = 1
    p = torch.arange(n, dtype=torch.float64)[:, None]
    fitted = torch.stack([torch.sin(p * omega), torch.cos(p * omega)], dim=-1).flatten(-2)  # (n, 2·pairs)
    if not same(x[:, : 2 * pairs], fitted, atol=1e-4, rtol=1e-4) or bool((omega <= 0).any()):
        raise failure
    expected = base ** (-2 * torch.arange(pairs, dtype=torch.float64) / d)
    d_ = failure.diagnosis
    fail("wrong frequencies", tried=d_.tried, got=d_.got, expected=d_.expected,
         cause="your columns are sin and cos of t·ω_r pair by pair, as they should be, but with the " +
               _frequency_cause(omega, expected, base, d), fix=_SIN_FIX)


@check("sinusoidal_encoding", expects="a function sinusoidal_encoding(n, d, base=10000.0) returning an (n, d) tensor")
def check_sinusoidal_encoding(fn: Learner) -> str:
    cases = [(6, 8, None), (12, 6, 100.0), (1, 4, None), (10, 7, None), (50, 16, None), (4, 2, 10.0), (9, 1, None),
             (20, 9, 500.0)]
    refuted = Refuted()
    for n, d, base in cases:
        tried = f"sinusoidal_encoding({n}, {d})" if base is None else f"sinusoidal_encoding({n}, {d}, {base:g})"
        b = 10000.0 if base is None else base
        try:
            out = as_tensor(fn(n, d) if base is None else fn(n, d, base), tried=tried)
        except LearnerRaised as exc:
            hint = {}
            if d % 2 and any(w in exc.message for w in ("size", "shape", "match")):
                hint = dict(cause=f"with an odd d = {d} there is one sine column more than cosine columns",
                            fix="fill pe[:, 0::2] with sines and pe[:, 1::2] with the first d // 2 cosines")
            raise Failure(learner_error(exc, tried=tried, expected=f"an ({n}, {d}) tensor", **hint)) from None
        expected = _sinusoid(n, d, b)
        mistakes = [Mistake(s, c, f, lambda m=m: _sinusoid(n, d, b, m)) for m, s, c, f in _SIN_MISTAKES
                    if m != "base" or base not in (None, 10000.0)]
        if d % 2:
            mistakes.append(Mistake("one column too many for an odd d", f"you returned d + 1 = {d + 1} columns",
                                    "keep d columns: the last one (column d − 1, even) is a sine",
                                    lambda: _sinusoid(n, d + 1, b)))
        mistakes.append(Mistake("rows and columns swapped", "your result has one row per dimension", "return (n, d): "
                                "one row per position", lambda: expected.T))
        if not (out.is_floating_point()):
            fail(f"integer result ({str(out.dtype).replace('torch.', '')})", tried=tried, got=str(out.dtype),
                 expected="a floating-point tensor", fix="compute in floating point (torch.arange(n, dtype=torch.float32))")
        if same(out, expected, atol=1e-4, rtol=1e-4):
            refuted.passed(mistakes, expected, atol=1e-4, rtol=1e-4)
            continue
        try:
            expect_close(out, expected, tried=tried, what="your encoding", atol=1e-4, rtol=1e-4,
                         mistakes=refuted.remaining(mistakes), fix=_SIN_FIX)
        except Failure as failure:
            _sinusoid_frequencies(failure, out, n, d, b)
    return f"matches Vaswani et al.'s interleaved sin/cos on {len(cases)} cases (odd d, d = 1, other bases)"


# ================================================================================== T5 relative position bias
def _t5_buckets(n: int, nb: int, bidirectional: bool, max_distance: int, mistake: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """(n, n) buckets of j − i computed in float64, and an alternative bucket where the logarithm lands on a
    whole number (float32 code may fall one below there). With ``mistake``, one classic error."""
    pos = torch.arange(n)
    rel = pos[None, :] - pos[:, None]  # j − i
    if mistake == "i_minus_j":
        rel = -rel
    bidirectional = {"always_bi": True, "never_bi": False}.get(mistake, bidirectional)
    md = 128 if mistake == "max_distance" else max_distance
    offset = torch.zeros_like(rel)
    half = nb // 2 if bidirectional and mistake != "no_halving" else nb
    if bidirectional:
        offset = ((rel < 0) if mistake == "offset_before" else (rel > 0)).long() * half * (mistake != "no_offset")
        dist = rel.abs()
    else:
        dist = rel.clamp(min=0) if mistake == "uni_sign" else (-rel).clamp(min=0)
    max_exact = (nb // 2 if mistake == "max_exact" else half // 2)
    out = torch.empty_like(rel)
    alt = torch.empty_like(rel)
    for idx, dd in np.ndenumerate(dist.numpy()):
        dd = int(dd)
        if dd < max_exact:
            out[idx] = alt[idx] = dd
            continue
        if mistake == "linear":
            val = float(dd)
        else:
            val = max_exact + math.log(dd / max_exact) / math.log(md / max_exact) * (half - max_exact)
        near = round(val)
        if mistake == "round":
            first = second = near
        elif mistake == "ceil":
            first = second = math.ceil(val - 1e-9) if abs(val - near) < 1e-6 else math.ceil(val)
        elif abs(val - near) < 1e-6:
            first, second = near, near - 1
        else:
            first = second = math.floor(val)
        cap = half - 1 if mistake != "no_clamp" else 10**9
        out[idx], alt[idx] = min(first, cap), min(second, cap)
    return out + offset, alt + offset


_T5_FIX = ("bias[a, i, j] = table[bucket(j − i), a]: with bidirectional, keys after the query (j − i > 0) use the "
           "upper half of the buckets; distances below half a half are exact; larger ones are logarithmic up to "
           "max_distance, then clamped to the last bucket")
_T5_MISTAKES = [
    ("i_minus_j", "relative positions indexed i − j instead of j − i", "you measured the query's position relative "
     "to the key (i − j); the docstring's relative position is j − i, positive when the key comes after the query",
     "rel = positions[None, :] - positions[:, None]  # j − i"),
    ("always_bi", "`bidirectional` ignored", "your buckets are the bidirectional ones whatever `bidirectional` is "
     "passed", "bidirectional: halve the buckets, the upper half for j − i > 0; otherwise distance = max(i − j, 0)"),
    ("never_bi", "`bidirectional` ignored", "your buckets are the unidirectional ones whatever `bidirectional` is "
     "passed", "bidirectional: halve the buckets, the upper half for j − i > 0; otherwise distance = max(i − j, 0)"),
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


def _t5_cases() -> list[dict]:
    g = _gen(7)
    cases = []
    for n, nb, heads, bi, md, dtype in [(6, 32, 2, True, 128, torch.float64), (40, 32, 3, True, 128, torch.float64),
                                         (40, 32, 1, False, 20, torch.float64), (1, 8, 4, True, 16, torch.float64),
                                         (30, 8, 2, True, 12, torch.float64), (25, 16, 2, False, 64, torch.float64),
                                         (35, 32, 2, True, 24, torch.float32), (12, 4, 2, True, 8, torch.float64),
                                         (30, 10, 2, True, 20, torch.float64), (30, 9, 1, False, 24, torch.float64),
                                         (8, 3, 2, False, 2, torch.float64), (60, 10, 2, False, 256, torch.float64)]:
        table = torch.randn(nb, heads, generator=g, dtype=torch.float64).to(dtype)
        cases.append(dict(n=n, table=table, bidirectional=bi, max_distance=md))
    return cases


@check("relative_position_bias",
       expects="a function relative_position_bias(n, table, bidirectional=True, max_distance=128) returning (A, n, n)")
def check_relative_position_bias(fn: Learner) -> str:
    cases = _t5_cases()
    refuted = Refuted()
    for case in cases:
        n, table, bi, md = case["n"], case["table"], case["bidirectional"], case["max_distance"]
        nb, heads = table.shape
        tried = (f"relative_position_bias({n}, table ({nb} buckets × {heads} heads), bidirectional={bi}, "
                 f"max_distance={md})")
        try:
            out = as_tensor(fn(n, table, bi, md), tried=tried)
        except LearnerRaised as exc:
            hint = {}
            if exc.type_name == "IndexError" or "out of bounds" in exc.message or "out of range" in exc.message:
                hint = dict(cause="a bucket index reached num_buckets or more: distances beyond max_distance must be "
                                  "clamped to the last bucket of their half, and in bidirectional mode each half has "
                                  "num_buckets // 2 buckets", fix="clamp the logarithmic bucket: "
                                  "torch.clamp(bucket, max=num_buckets - 1) (num_buckets already halved)")
            raise Failure(learner_error(exc, tried=tried, expected=f"a ({heads}, {n}, {n}) tensor", **hint)) from None
        buckets, alt = _t5_buckets(n, nb, bi, md)
        expected = table[buckets].permute(2, 0, 1).double()
        if tuple(out.shape) == (n, n, heads) and heads != n:
            fail("heads last: shape (n, n, A)", tried=tried, got=f"shape {tuple(out.shape)}",
                 expected=f"shape {(heads, n, n)}", cause="table[buckets] has the heads last",
                 fix="move them first: table[buckets].permute(2, 0, 1)")
        expect_shape(out, expected.shape, tried=tried, what="your bias", fix="(A, n, n): one (n, n) matrix per head")
        tol = dict(atol=1e-6, rtol=1e-5)
        alt_expected = table[alt].permute(2, 0, 1).double()
        ok = torch.isclose(out.double(), expected, **tol) | torch.isclose(out.double(), alt_expected, **tol)
        mistakes = []
        for key, summary, cause, fix in _T5_MISTAKES:
            if key == "max_distance" and md == 128 or key == "uni_sign" and bi or key in ("no_offset", "offset_before") \
                    and not bi:
                continue

            def wrong(key=key):
                b, a = _t5_buckets(n, nb, bi, md, key)
                if int(b.max()) >= nb:
                    return None
                return table[b].permute(2, 0, 1)
            mistakes.append(Mistake(summary, cause, fix, wrong))
        mistakes.append(Mistake("relative positions indexed i − j instead of j − i", _T5_MISTAKES[0][2],
                                _T5_MISTAKES[0][3], lambda: expected.transpose(-2, -1)))
        if bool(ok.all()):
            refuted.passed(mistakes, expected, **tol)
            continue
        expect_close(out, expected, tried=tried, what="your bias", mistakes=refuted.remaining(mistakes), fix=_T5_FIX,
                     **tol)
    return (f"matches T5's buckets on {len(cases)} cases (bidirectional and not, logarithmic buckets, clamping "
            "beyond max_distance)")


# ================================================================================== ALiBi
def _alibi(n: int, heads: int, slopes: torch.Tensor | None = None, form: str = "abs") -> torch.Tensor:
    i = torch.arange(n, dtype=torch.float64)
    diff = i[:, None] - i[None, :]  # i − j
    m = ref.alibi_slopes(heads) if slopes is None else slopes
    shape = {"abs": -diff.abs(), "signed": -diff, "positive": diff.abs(), "causal": -diff.clamp(min=0)}[form]
    return m[:, None, None] * shape


def _alibi_mistakes(n: int, heads: int) -> list[Mistake]:
    h = torch.arange(1, heads + 1, dtype=torch.float64)
    slope_fix = "slope_a = 2^(−8(a+1)/A) for a = 0 … A − 1: a geometric sequence starting at 2^(−8/A) with ratio 2^(−8/A)"
    return [
        Mistake("slopes halve from head to head whatever A", "your slopes are 1/2, 1/4, 1/8, …: right only for 8 heads",
                slope_fix, lambda: _alibi(n, heads, 0.5 ** h) if heads != 8 else None),
        Mistake("slopes start at 1", "your first slope is 2^0 = 1: you counted heads from 0 in 2^(−8a/A)", slope_fix,
                lambda: _alibi(n, heads, 2.0 ** (-8 * (h - 1) / heads))),
        Mistake("slopes in reverse order", "your smallest slope is on head 0", "head 0 has the largest slope, "
                "2^(−8/A)", lambda: _alibi(n, heads, ref.alibi_slopes(heads).flip(0)) if heads > 1 else None),
        Mistake("slopes not geometric", "your slopes grow linearly ((a + 1)/A)", slope_fix,
                lambda: _alibi(n, heads, h / heads)),
        Mistake("slopes not geometric", "your slopes are 1/(a + 1)", slope_fix, lambda: _alibi(n, heads, 1 / h)),
        Mistake("slopes not geometric", "your slopes fall linearly (1 − (a + 1)/(A + 1))", slope_fix,
                lambda: _alibi(n, heads, 1 - h / (heads + 1))),
        Mistake("bias positive", "your bias grows with distance (+slope·|i − j|): far keys are favoured",
                "negate it: bias = −slope_a·|i − j|", lambda: _alibi(n, heads, form="positive")),
        Mistake("not symmetric: −slope·(i − j) without the absolute value", "your bias is positive above the diagonal "
                "(keys after the query); the docstring asks for −slope_a·|i − j| everywhere",
                "use the distance: (i − j).abs()", lambda: _alibi(n, heads, form="signed")),
        Mistake("not symmetric: −slope·(i − j) without the absolute value", "your bias is positive below the diagonal",
                "use the distance: (i − j).abs()", lambda: -_alibi(n, heads, form="signed")),
        Mistake("zero for keys after the query", "your bias is −slope·(i − j) for j ≤ i and 0 above the diagonal (the "
                "causal form, as if a mask hid those keys); the docstring asks for −slope_a·|i − j| everywhere",
                "use the distance: (i − j).abs()", lambda: _alibi(n, heads, form="causal") if n > 1 else None),
        Mistake("heads last: shape (n, n, A)", "your heads are on the last axis", "stack the heads first: (A, n, n)",
                lambda: _alibi(n, heads).permute(1, 2, 0) if heads != n else None),
    ]


def _slope_report(out: torch.Tensor, heads: int) -> tuple[str, str] | None:
    """When the bias has the right form −slope_a·|i − j| but wrong slopes, say what the slopes are."""
    n = out.shape[-1]
    if n < 2:
        return None
    distance = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().double()
    slopes = -out[:, 1, 0].double()  # (A,)
    if not same(out.double(), -slopes[:, None, None] * distance, atol=1e-6, rtol=1e-5):
        return None
    shown = ", ".join(fmt(float(s)) for s in slopes[:6]) + ("…" if heads > 6 else "")
    expected = ", ".join(fmt(float(s)) for s in ref.alibi_slopes(heads)[:6]) + ("…" if heads > 6 else "")
    if heads > 2 and (slopes[:-1] != 0).all():
        ratios = slopes[1:] / slopes[:-1]
        if not torch.allclose(ratios, ratios[0].expand_as(ratios), rtol=1e-4):
            return (f"your slopes {shown} are not geometric (ratios {', '.join(fmt(float(r)) for r in ratios[:4])}…)",
                    expected)
        return (f"your slopes {shown} are geometric with ratio {fmt(float(ratios[0]))}, expected 2^(−8/A) = "
                f"{fmt(2 ** (-8 / heads))} starting at the same value", expected)
    return f"your slopes are {shown}", expected


_ALIBI_CASES = [(5, 8), (7, 4), (1, 4), (6, 1), (6, 16), (12, 2), (3, 32)]


@check("alibi_bias", expects="a function alibi_bias(n, n_heads) returning an (n_heads, n, n) tensor")
def check_alibi_bias(fn: Learner) -> str:
    refuted = Refuted()
    for n, heads in _ALIBI_CASES:
        tried = f"alibi_bias({n}, {heads})"
        out = as_tensor(fn(n, heads), tried=tried)
        expected = _alibi(n, heads)
        if not out.is_floating_point():
            fail(f"integer result ({str(out.dtype).replace('torch.', '')})", tried=tried, got=str(out.dtype),
                 expected="a floating-point tensor", fix="the slopes are fractions: compute in floating point")
        mistakes = _alibi_mistakes(n, heads)
        if tuple(out.shape) != tuple(expected.shape):
            expect_shape(out, expected.shape, tried=tried, what="your bias", mistakes=mistakes,
                         fix="(n_heads, n, n): one (n, n) matrix per head")
        if same(out, expected, atol=1e-7, rtol=1e-5):
            refuted.passed(mistakes, expected, atol=1e-7, rtol=1e-5)
            continue
        try:
            expect_close(out, expected, tried=tried, what="your bias", atol=1e-7, rtol=1e-5,
                         mistakes=refuted.remaining(mistakes), fix="bias[a, i, j] = −slope_a·|i − j| with slope_a = 2^(−8(a+1)/A)")
        except Failure as failure:
            named = {m.summary for m in mistakes}  # a known mistake wins; otherwise the slopes say more than a
            report = None if failure.diagnosis.summary in named else _slope_report(out, heads)  # generic mismatch
            if report is None:
                raise
            fail("slopes not geometric" if "not geometric" in report[0] else "wrong slopes", tried=tried,
                 got=report[0], expected=f"slopes {report[1]}: 2^(−8(a+1)/A) for a = 0 … A − 1",
                 cause="the form −slope·|i − j| is right; the slopes are not", fix="slope = 2 ** (-8 * (a + 1) / A)")
    return f"matches −slope_a·|i − j| on {len(_ALIBI_CASES)} cases (1 to 32 heads, n = 1, slopes 2^(−8(a+1)/A))"


# ================================================================================== RoPE
def _rope(x: torch.Tensor, positions=None, base: float = 10000.0, mistake: str = "") -> torch.Tensor:
    x = x.double()
    n, d = x.shape[-2:]
    pos = torch.arange(n) if positions is None or mistake == "positions" else torch.as_tensor(positions)
    pos = pos.double() + (1 if mistake == "from1" else 0)
    base = 10000.0 if mistake == "base" else base
    exponent = torch.arange(d // 2, dtype=torch.float64) / d if mistake == "half" else \
        torch.arange(0, d, 2, dtype=torch.float64) / d
    angles = pos[:, None] * base ** (-exponent)
    if mistake == "sign":
        angles = -angles
    if mistake == "divide":
        angles = pos[:, None] / base ** (-exponent)
    if mistake == "intdiv":  # θ_r = base^(−(2r // d)) = 1 for every pair
        angles = pos[:, None].expand(-1, d // 2)
    if mistake == "none":
        return x
    cos, sin = torch.cos(angles), torch.sin(angles)
    if mistake == "swap":
        cos, sin = sin, cos
    if mistake == "halves":
        a, b = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    if mistake in ("repeat", "mixed"):
        c2 = cos.repeat(1, 2) if mistake == "repeat" else cos.repeat_interleave(2, dim=-1)  # (n, d)
        s2 = sin.repeat(1, 2) if mistake == "repeat" else sin.repeat_interleave(2, dim=-1)
        if mistake == "repeat":  # GPT-J's rotate_every_two with cos laid out c0 c1 … c0 c1 …
            turned = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
        else:  # Hugging Face's rotate_half with cos laid out c0 c0 c1 c1 …
            turned = torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1)
        return x * c2 + turned * s2
    a, b = x[..., 0::2], x[..., 1::2]
    first = a * cos - b * sin
    second = first * sin + b * cos if mistake == "inplace" else a * sin + b * cos
    if mistake == "unpaired":
        return torch.cat([first, second], dim=-1)
    return torch.stack([first, second], dim=-1).flatten(-2)


_ROPE_FIX = ("pair dimensions (2r, 2r + 1) and rotate the pair at position t by +t·θ_r, θ_r = base^(−2r/d): "
             "(x_2r cos − x_2r+1 sin, x_2r sin + x_2r+1 cos)")
_ROPE_MISTAKES = [
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
]


def _rope_cases() -> list[dict]:
    g = _gen(12)

    def x(*shape, dtype=torch.float64):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    return [
        dict(name="x (6, 8), default positions", x=x(6, 8)),
        dict(name="x (2, 3, 5, 16): batch × heads, default positions", x=x(2, 3, 5, 16)),
        dict(name="x (3, 8) at positions [0, 5, 2]", x=x(3, 8), positions=torch.tensor([0, 5, 2])),
        dict(name="x (1, 4): one new token at position 7", x=x(1, 4), positions=torch.tensor([7])),
        dict(name="x (4, 2): d = 2", x=x(4, 2), positions=torch.arange(4)),
        dict(name="x (2, 6, 8) at positions 10 … 15", x=x(2, 6, 8), positions=torch.arange(10, 16)),
        dict(name="x (5, 8), base 500", x=x(5, 8), positions=torch.arange(5), base=500.0),
        dict(name="x (2, 7, 12) float32, default positions", x=x(2, 7, 12, dtype=torch.float32)),
        dict(name="x (3, 8) at positions [1000, 2500, 4096]", x=x(3, 8), positions=torch.tensor([1000, 2500, 4096]),
             atol=3e-3),
    ]


def _call_rope(fn: Learner, case: dict):
    args = [case["x"]]
    if "positions" in case or "base" in case:
        args.append(case.get("positions"))
    if "base" in case:
        args.append(case["base"])
    return fn(*args)


def _rope_probe(fn: Learner, failure: Failure, out: torch.Tensor, case: dict) -> None:
    """Re-raise ``failure`` with what the learner's rotation does, measured on extra calls: on unit pairs (1, 0),
    whether each pair is turned within itself and by which angle, whether the positions passed are used as
    such, and whether ``base`` changes anything."""
    x, given, base = case["x"], case.get("positions"), case.get("base", 10000.0)
    d_ = failure.diagnosis
    n, d = x.shape[-2:]
    unit = torch.zeros(n, d, dtype=torch.float64)
    unit[:, 0::2] = 1.0  # every pair (1, 0): rotated by a, it becomes (cos a, sin a)
    turned = call_or_skip(lambda: as_tensor(fn(unit, given, base), tried=d_.tried))
    if not isinstance(turned, torch.Tensor) or tuple(turned.shape) != (n, d) or not turned.is_floating_point():
        raise failure
    turned = turned.double()
    first, second = turned[:, 0::2], turned[:, 1::2]  # (n, d/2)
    positions = (torch.arange(n) if given is None else torch.as_tensor(given)).double()
    if not torch.allclose(first ** 2 + second ** 2, torch.ones_like(first), atol=1e-4):
        fail("not a rotation of each pair", tried=d_.tried, got=d_.got, expected=d_.expected,
             cause="given pairs (x_2r, x_2r+1) = (1, 0), your function returns pairs whose length is not 1: it does "
                   "not turn each neighbouring pair within itself (it mixes dimensions of different pairs, or the "
                   "two members use different angles)", fix=_ROPE_FIX)
    angles = torch.atan2(second, first)  # (n, d/2)
    expected = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    right = positions[:, None] * expected  # (n, d/2)
    if given is not None and not (torch.allclose(first, torch.cos(right), atol=1e-4)
                                  and torch.allclose(second, torch.sin(right), atol=1e-4)):
        default = call_or_skip(lambda: as_tensor(fn(unit, None, base), tried=d_.tried))
        arange = torch.arange(n, dtype=torch.float64)[:, None] * expected
        if isinstance(default, torch.Tensor) and tuple(default.shape) == (n, d) and \
                torch.allclose(default.double()[:, 0::2], torch.cos(arange), atol=1e-4) and \
                torch.allclose(default.double()[:, 1::2], torch.sin(arange), atol=1e-4):
            fail("positions mishandled", tried=d_.tried, got=d_.got, expected=d_.expected,
                 cause="with positions=None your rotation is right, but with the positions passed it is not: the "
                       "angles must be t·θ_r with t the given position itself (not shifted, added to, or mixed with "
                       "0 … n − 1)", fix="positions = torch.arange(n) if positions is None else positions; then "
                                        "angles = positions[:, None] * θ")
    rotates = bool((angles.abs() > 1e-6).any())
    other_base = 500.0 if base != 500.0 else 10000.0
    if rotates and d >= 4:
        other = call_or_skip(lambda: as_tensor(fn(x, given, other_base), tried=d_.tried))
        if isinstance(other, torch.Tensor) and same(other, out, atol=0, rtol=0):
            fail("base ignored", tried=d_.tried, got=d_.got, expected=d_.expected,
                 cause=f"your result is the same for base = {base:g} and base = {other_base:g}: a fixed base sits in "
                       "your code", fix="use the base argument: θ_r = base ** (-2 * r / d)")
    moving = positions != 0
    if not moving.any():
        raise failure
    per_position = angles[moving] / positions[moving, None]  # (moving, d/2): the angle per unit of position
    if not torch.allclose(torch.cos(angles), torch.cos(positions[:, None] * per_position[:1]), atol=1e-4) or \
            not torch.allclose(torch.sin(angles), torch.sin(positions[:, None] * per_position[:1]), atol=1e-4):
        fail("angles not proportional to the positions", tried=d_.tried, got=d_.got, expected=d_.expected,
             cause=f"given pairs (1, 0) at positions {', '.join(str(int(p)) for p in positions[:6])}, your rotation "
                   "angles are not t·θ_r for one θ_r per pair: check how the positions enter the angles",
             fix=_ROPE_FIX)
    omega = per_position[0]
    if not torch.allclose(torch.cos(omega), torch.cos(expected), atol=1e-4) or \
            not torch.allclose(torch.sin(omega), torch.sin(expected), atol=1e-4):
        fail("wrong rotation frequencies", tried=d_.tried, got=d_.got, expected=d_.expected,
             cause="given pairs (1, 0), your function turns each pair within itself by t·ω_r, as it should, but with "
                   "the " + _frequency_cause(omega, expected, base, d), fix=_ROPE_FIX)
    raise failure


@check("apply_rope", expects="a function apply_rope(x, positions=None, base=10000.0) returning a tensor shaped like x")
def check_apply_rope(fn: Learner) -> str:
    cases = _rope_cases()
    refuted = Refuted()
    for case in cases:
        x = case["x"]
        pos_text = "" if "positions" not in case and "base" not in case else \
            (", positions" if case.get("positions") is not None else ", None")
        tried = f"apply_rope(x{pos_text}{', base=' + format(case['base'], 'g') if 'base' in case else ''}) on {case['name']}"
        try:
            out = as_tensor(_call_rope(fn, case), tried=tried)
        except LearnerRaised as exc:
            hint = {}
            if exc.type_name == "TypeError" and "argument" in exc.message:
                hint = dict(cause="your function does not take positions and base", fix="keep the signature "
                            "apply_rope(x, positions=None, base=10000.0)")
            raise Failure(learner_error(exc, tried=tried, expected="a tensor shaped like x", **hint)) from None
        expected = _rope(x, case.get("positions"), case.get("base", 10000.0))
        expect_shape(out, x.shape, tried=tried, what="your result", fix="the result has x's shape (..., n, d)")
        if out.dtype != x.dtype and out.is_floating_point():
            fail(f"dtype changed from {str(x.dtype).replace('torch.', '')} to {str(out.dtype).replace('torch.', '')}",
                 tried=tried, got=str(out.dtype), expected=str(x.dtype), cause="your cos and sin are in another dtype, "
                 "and multiplying promoted the result", fix="convert cos and sin to x.dtype before multiplying")
        given = case.get("positions")
        mistakes = [Mistake(s, c, f, lambda m=m: _rope(x, given, case.get("base", 10000.0), m))
                    for m, s, c, f in _ROPE_MISTAKES
                    if not (m == "positions" and (given is None or torch.equal(given, torch.arange(x.shape[-2]))))
                    and not (m == "base" and "base" not in case)]
        atol = case.get("atol", 1e-5 if x.dtype == torch.float64 else 1e-4)
        if same(out, expected, atol=atol, rtol=1e-4):
            refuted.passed(mistakes, expected, atol=atol, rtol=1e-4)
            continue
        try:
            expect_close(out, expected, tried=tried, what="your rotated x", atol=atol, rtol=1e-4,
                         mistakes=refuted.remaining(mistakes), fix=_ROPE_FIX)
        except Failure as failure:
            if failure.diagnosis.cause or tuple(out.shape) != tuple(x.shape):
                raise
            _rope_probe(fn, failure, out, case)
    # The relative property, on the learner's own rotations: q·k depends only on the distance.
    g = _gen(13)
    q, k = torch.randn(1, 16, generator=g, dtype=torch.float64), torch.randn(1, 16, generator=g, dtype=torch.float64)
    pairs = [(0, 3), (5, 8), (40, 43), (200, 203)]
    scores = []
    for i, j in pairs:
        tried = f"apply_rope(q, tensor([{i}])) · apply_rope(k, tensor([{j}]))"
        rq = as_tensor(fn(q, torch.tensor([i])), tried=tried)
        rk = as_tensor(fn(k, torch.tensor([j])), tried=tried)
        scores.append(float((rq.double() * rk.double()).sum()))
    if max(scores) - min(scores) > 1e-3 * max(1.0, abs(scores[0])):  # float32 angles at position 200: ~1e-5
        fail("scores depend on absolute positions", tried="q at position t, k at t + 3, for t = 0, 5, 40, 200",
             got="scores " + ", ".join(fmt(s) for s in scores), expected="the same score for every t",
             fix=_ROPE_FIX)
    return (f"matches RoFormer's interleaved rotation on {len(cases)} cases, and q·k depends only on j − i "
            f"(checked at distance 3 from positions 0 to 200)")


# ================================================================================== RoPE with a KV cache
def _decode(q_new, k_new, k_cache, mistake: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """The right step (``mistake`` empty) or one classic mistake, in float64."""
    q_new, k_new, k_cache = q_new.double(), k_new.double(), k_cache.double()
    n_cache, n_new = k_cache.shape[-2], q_new.shape[-2]
    start = {"restart": 0, "plus1": n_cache + 1, "minus1": n_cache - 1}.get(mistake, n_cache)
    positions = torch.arange(start, start + n_new)
    if mistake == "same":  # every new token at the cache length
        positions = torch.full((n_new,), n_cache)
    if mistake == "end":  # every new token at the last position
        positions = torch.full((n_new,), n_cache + n_new - 1)
    q_rot = q_new if mistake == "q_plain" else ref.apply_rope(q_new, positions)
    k_rot = k_new if mistake == "k_plain" else ref.apply_rope(k_new, positions)
    cache = ref.apply_rope(k_cache, torch.arange(n_cache)) if mistake == "rerotate" else k_cache
    if mistake == "all_again":  # the whole cache with the new keys rotated from 0 … again
        return q_rot, ref.apply_rope(torch.cat([k_cache, k_rot], dim=-2), torch.arange(n_cache + n_new))
    keys = torch.cat([k_rot, cache], dim=-2) if mistake == "prepend" else torch.cat([cache, k_rot], dim=-2)
    return q_rot, keys


_DECODE_FIX = ("positions = torch.arange(n_cache, n_cache + n_new) (n_cache = k_cache.shape[-2]); rotate q_new and "
               "k_new with pos.apply_rope(x, positions); return (q_rotated, torch.cat([k_cache, k_rotated], dim=-2))")
_DECODE_MISTAKES = [
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


def _decode_cases() -> list[dict]:
    g = _gen(31)

    def r(*shape, dtype=torch.float64):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    def cached(x, n_cache):  # keys already rotated by their own positions, as the cache holds them
        return ref.apply_rope(x, torch.arange(n_cache))

    return [
        dict(name="a prompt of 4 tokens, empty cache (0, 8)", q=r(4, 8), k=r(4, 8), cache=r(0, 8)),
        dict(name="one new token after 5 cached ones, d = 8", q=r(1, 8), k=r(1, 8), cache=cached(r(5, 8), 5)),
        dict(name="3 new tokens after 6 cached ones", q=r(3, 8), k=r(3, 8), cache=cached(r(6, 8), 6)),
        dict(name="batch × heads (2, 4): one new token after 7 cached ones, d = 16", q=r(2, 4, 1, 16),
             k=r(2, 4, 1, 16), cache=cached(r(2, 4, 7, 16), 7)),
        dict(name="float32: 2 new tokens after 3 cached ones", q=r(2, 4, dtype=torch.float32),
             k=r(2, 4, dtype=torch.float32), cache=cached(r(3, 4, dtype=torch.float32), 3)),
        dict(name="one new token after 1000 cached ones, d = 4", q=r(1, 4), k=r(1, 4), cache=cached(r(1000, 4), 1000)),
    ]


@check("rope_decode_step",
       expects="a function rope_decode_step(q_new, k_new, k_cache) returning (q_rotated, extended k_cache)")
def check_rope_decode_step(fn: Learner) -> str:
    refuted = Refuted()
    cases = _decode_cases()
    for case in cases:
        q, k, cache = case["q"], case["k"], case["cache"]
        tried = f"rope_decode_step(q_new, k_new, k_cache) with {case['name']}"
        try:
            result = fn(q, k, cache)
        except LearnerRaised as exc:
            raise Failure(learner_error(exc, tried=tried, expected="(q_rotated, k_cache extended)")) from None
        if isinstance(result, torch.Tensor) or not isinstance(result, (tuple, list)) or len(result) != 2:
            got = f"one tensor of shape {tuple(result.shape)}" if isinstance(result, torch.Tensor) else \
                f"a {type(result).__name__}" + (f" of {len(result)} items" if isinstance(result, (tuple, list)) else "")
            fail("did not return (q_rotated, k_cache)", tried=tried, got=got, expected="a tuple of two tensors",
                 fix="end with `return q_rotated, k_cache`")
        q_out = as_tensor(result[0], tried=tried, what="the rotated queries (first element)")
        k_out = as_tensor(result[1], tried=tried, what="the extended cache (second element)")
        exp_q, exp_k = _decode(q, k, cache)
        tol = dict(atol=1e-6, rtol=1e-5) if q.dtype == torch.float64 else dict(atol=1e-4, rtol=1e-4)
        expect_shape(k_out, exp_k.shape, tried=tried, what="the extended cache",
                     fix="append the new keys along the positions: torch.cat([k_cache, k_rotated], dim=-2)")
        expect_shape(q_out, exp_q.shape, tried=tried, what="the rotated queries", fix="keep q_new's shape")
        q_mistakes = [Mistake(s_, c, f, lambda m=m: _decode(q, k, cache, m)[0]) for m, s_, c, f in _DECODE_MISTAKES]
        k_mistakes = [Mistake(s_, c, f, lambda m=m: _decode(q, k, cache, m)[1]) for m, s_, c, f in _DECODE_MISTAKES]
        if same(q_out, exp_q, **tol) and same(k_out, exp_k, **tol):
            refuted.passed(q_mistakes, exp_q, **tol)
            refuted.passed(k_mistakes, exp_k, **tol)
            for got, name in ((q_out, "the rotated queries"), (k_out, "the extended cache")):
                if got.is_floating_point() and _BITS.get(got.dtype, 99) < _BITS.get(q.dtype, 0):
                    lower_precision(got, q.dtype, tried=tried, what=name)
            continue
        expect_close(k_out, exp_k, tried=tried, what="the extended cache", mistakes=refuted.remaining(k_mistakes),
                     fix=_DECODE_FIX, **tol)
        expect_close(q_out, exp_q, tried=tried, what="the rotated queries", mistakes=refuted.remaining(q_mistakes),
                     fix=_DECODE_FIX, **tol)
    return (f"matches cache length + offset on {len(cases)} cases (a prompt, single tokens, batch × heads, "
            "1000 cached keys); cached keys kept as they were")


# ================================================================================== additive attention
def _additive(q, k, v, Wq, Wk, w, mask=None, mistake: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v, Wq, Wk, w = (t.double() for t in (q, k, v, Wq, Wk, w))
    hq = q @ (Wq if mistake == "transposed" else Wq.T)
    hk = k @ (Wk if mistake == "transposed" else Wk.T)
    pre = hq[..., :, None, :] + hk[..., None, :, :]  # (..., n_q, n_k, d_h)
    hidden = {"no_tanh": pre, "separate": torch.tanh(hq)[..., :, None, :] + torch.tanh(hk)[..., None, :, :],
              "sigmoid": torch.sigmoid(pre), "relu": torch.relu(pre)}.get(mistake, torch.tanh(pre))
    scores = hidden @ (torch.ones_like(w) if mistake == "no_w" else w)
    if mistake == "w_before":
        scores = torch.tanh(pre @ w)
    if mistake == "scaled":
        scores = scores / math.sqrt(Wq.shape[0])
    if mistake == "scaled_dk":
        scores = scores / math.sqrt(k.shape[-1])
    dim = -2 if mistake == "dim" else -1
    if mask is not None and mistake == "polarity":
        scores = scores.masked_fill(mask, float("-inf"))
    elif mask is not None and mistake == "zero_fill":
        scores = scores.masked_fill(~mask, 0.0)
    elif mask is not None and mistake not in ("after", "ignored"):
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=dim)
    if mistake == "after" and mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    if mistake == "weights_T":
        return weights @ v, weights.transpose(-2, -1)
    if mistake == "scores_v":
        return scores @ v, weights
    return weights @ v, weights


_ADD_FIX = "scores[i, j] = w · tanh(W_q q_i + W_k k_j); weights = softmax over the keys (no scale); output = weights @ v"
_ADD_MISTAKES = [
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
]


def _additive_cases() -> list[dict]:
    g = _gen(21)

    def r(*shape, dtype=torch.float64, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

    keep = torch.rand(4, 5, generator=g) < 0.6
    keep[torch.arange(4), torch.randint(0, 5, (4,), generator=g)] = True
    keep[0] = torch.tensor([True, False, True, False, False])
    padding = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])[:, None, :]  # (2, 1, 7)
    return [
        dict(name="q (4, 3), k (6, 5), v (6, 2), d_h = 7", q=r(4, 3), k=r(6, 5), v=r(6, 2), Wq=r(7, 3), Wk=r(7, 5),
             w=r(7)),
        dict(name="batch × heads (2, 3), n_q = 4, n_k = 5, d_h = 8, with a (4, 5) mask", q=r(2, 3, 4, 6),
             k=r(2, 3, 5, 6), v=r(2, 3, 5, 3), Wq=r(8, 6), Wk=r(8, 6), w=r(8), mask=keep),
        dict(name="square weights: d_q = d_k = d_h = 4", q=r(3, 4), k=r(5, 4), v=r(5, 2), Wq=r(4, 4), Wk=r(4, 4),
             w=r(4)),
        dict(name="one query per sequence, key padding mask (2, 1, 7)", q=r(2, 1, 5), k=r(2, 7, 5), v=r(2, 7, 4),
             Wq=r(6, 5), Wk=r(6, 5), w=r(6), mask=padding),
        dict(name="float32, n_q = 3, n_k = 3", q=r(3, 4, dtype=torch.float32), k=r(3, 4, dtype=torch.float32),
             v=r(3, 2, dtype=torch.float32), Wq=r(5, 4, dtype=torch.float32), Wk=r(5, 4, dtype=torch.float32),
             w=r(5, dtype=torch.float32)),
        dict(name="large w (scores beyond ±100, float32)", q=r(2, 4, dtype=torch.float32),
             k=r(6, 4, dtype=torch.float32), v=r(6, 3, dtype=torch.float32), Wq=r(8, 4, dtype=torch.float32),
             Wk=r(8, 4, dtype=torch.float32), w=r(8, dtype=torch.float32, scale=120.0), large=True),
    ]


def _unpack_pair(result, tried: str) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(result, torch.Tensor):
        fail("returned one tensor, not (output, weights)", tried=tried, got=f"one tensor of shape {tuple(result.shape)}",
             expected="a tuple (output, weights)", fix="end with `return output, weights`")
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        got = f"a {type(result).__name__} of {len(result)} items" if isinstance(result, (tuple, list)) else \
            ("None" if result is None else type(result).__name__)
        fail("did not return (output, weights)", tried=tried, got=got, expected="a tuple (output, weights)",
             fix="end with `return output, weights`")
    return (as_tensor(result[0], tried=tried, what="the output (first element)"),
            as_tensor(result[1], tried=tried, what="the weights (second element)"))


_BITS = {torch.float64: 53, torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}


def _weights_not_normalised(failure: Failure, weights: torch.Tensor, expected: torch.Tensor,
                            named: set[str]) -> None:
    """Re-raise ``failure``, with the row sums as its cause when the weights are finite but their rows do not
    sum to 1 (no known mistake, whose summaries are ``named``, matched)."""
    if failure.diagnosis.summary in named or tuple(weights.shape) != tuple(expected.shape) or not weights.is_floating_point() \
            or not bool(torch.isfinite(weights).all()):
        raise failure
    sums = weights.double().sum(-1)
    if bool(((sums - 1).abs() < 1e-3).all()):
        raise failure
    d = failure.diagnosis
    fail("the weights' rows do not sum to 1", tried=d.tried, got=d.got, expected=d.expected,
         cause=f"your rows sum to {fmt(float(sums.min()))} … {fmt(float(sums.max()))}: the weights are not a softmax "
               "over the keys (the division by the sum is missing, or the softmax runs over another axis)",
         fix="weights = torch.softmax(scores, dim=-1) (blocked scores filled with -inf first)")


@check("additive_attention",
       expects="a function additive_attention(q, k, v, W_q, W_k, w, mask=None) returning (output, weights)")
def check_additive_attention(fn: Learner) -> str:
    cases = _additive_cases()
    for case in cases:
        q, k, v, Wq, Wk, w = (case[n] for n in ("q", "k", "v", "Wq", "Wk", "w"))
        mask = case.get("mask")
        args = (q, k, v, Wq, Wk, w) if mask is None else (q, k, v, Wq, Wk, w, mask)
        tried = f"additive_attention(q, k, v, W_q, W_k, w{', mask' if mask is not None else ''}) on {case['name']}"
        try:
            result = fn(*args)
        except LearnerRaised as exc:
            hint = {}
            hq, hk = q @ Wq.T, k @ Wk.T
            if _reproduce(lambda: hq + hk) == exc.message:
                hint = dict(cause="you added W_q q_i and W_k k_j position by position (query i with key i); every "
                                  "query must meet every key", fix="broadcast: hq[..., :, None, :] + hk[..., None, :, :]"
                                  " gives (..., n_q, n_k, d_h)")
            elif q.dim() > 2 and _reproduce(lambda: hq.unsqueeze(1) + hk.unsqueeze(0)) == exc.message:
                hint = dict(cause="you paired queries and keys with unsqueeze(1) and unsqueeze(0), which is right "
                                  "for 2-D input only: with leading batch axes the new axes land among them",
                            fix="count from the end: hq[..., :, None, :] + hk[..., None, :, :] (or unsqueeze(-2) "
                                "and unsqueeze(-3))")
            elif _reproduce(lambda: q @ Wq) == exc.message or _reproduce(lambda: k @ Wk) == exc.message:
                hint = dict(cause="you computed q @ W_q, but W_q has shape (d_h, d_q): W_q q_i is q @ W_q.T",
                            fix="project with q @ W_q.T and k @ W_k.T")
            elif _reproduce(lambda: q @ Wk.T) == exc.message or _reproduce(lambda: k @ Wq.T) == exc.message:
                hint = dict(cause="you projected q with W_k (or k with W_q)", fix="hq = q @ W_q.T, hk = k @ W_k.T")
            elif exc.type_name == "TypeError" and mask is not None and "argument" in exc.message:
                hint = dict(cause="your function does not take the mask", fix="keep the signature "
                            "additive_attention(q, k, v, W_q, W_k, w, mask=None)")
            raise Failure(learner_error(exc, tried=tried, expected="(output, weights)", **hint)) from None
        out, weights = _unpack_pair(result, tried)
        exp_out, exp_w = _additive(q, k, v, Wq, Wk, w, mask)
        tol = dict(atol=1e-6, rtol=1e-5) if q.dtype == torch.float64 else dict(atol=3e-5, rtol=1e-3)
        if same(out, exp_w, **tol) and same(weights, exp_out, **tol) and not same(out, exp_out, **tol):
            fail("returned (weights, output), not (output, weights)", tried=tried,
                 got="the right weights first, then the right output", expected="(output, weights)",
                 cause="you returned the two in the other order", fix="end with `return output, weights`")

        def variant(m):
            return lambda: _additive(q, k, v, Wq, Wk, w, mask, m)

        applicable = [row for row in _ADD_MISTAKES
                      if mask is not None or row[0] not in ("polarity", "after", "ignored", "zero_fill")]
        w_mistakes = [Mistake(s, c, f, lambda m=m: variant(m)()[1]) for m, s, c, f in applicable]
        if case.get("large"):
            s = ref.additive_scores(q.double(), k.double(), Wq.double(), Wk.double(), w.double()).to(q.dtype)
            e = torch.exp(s)
            w_mistakes.insert(0, Mistake("no maximum subtracted", "your softmax exponentiates the raw scores, and "
                                         "e^100 overflows float32 (inf / inf = NaN)",
                                         "use torch.softmax (or subtract each row's maximum first)",
                                         lambda: e / e.sum(-1, keepdim=True)))
        try:
            expect_close(weights, exp_w, tried=tried, what="the weights", mistakes=w_mistakes, fix=_ADD_FIX, **tol)
        except Failure as failure:
            _weights_not_normalised(failure, weights, exp_w, {m.summary for m in w_mistakes})
        o_mistakes = [Mistake(s, c, f, lambda m=m: variant(m)()[0]) for m, s, c, f in applicable]
        expect_close(out, exp_out, tried=tried, what="the output", mistakes=o_mistakes, fix=_ADD_FIX, **tol)
        for got, name in ((out, "the output"), (weights, "the weights")):
            if got.is_floating_point() and _BITS.get(got.dtype, 99) < _BITS.get(q.dtype, 0):
                lower_precision(got, q.dtype, tried=tried, what=name)
    return f"matches wᵀ tanh(W_q q + W_k k) attention on {len(cases)} cases (batched, masks, n_q = 1, square weights, large scores)"
