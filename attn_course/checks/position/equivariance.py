"""The learner's test is_permutation_equivariant: run learner-side (probe ``position.permutation_test``) on
attentions that treat positions alike and ones that see them; the pattern of its verdicts names its flaw."""

from __future__ import annotations

import random
from typing import Any, Callable

import numpy as np
import torch

from ... import position as ref
from ..boundary import Opaque, probe
from ..compare import fail, fmt
from ..core import Learner, check
from .judge import call


SEED = 12  #: torch's, NumPy's and Python's seed while the learner's test runs
#: More seeds for the variant a permutation that keeps every distance misses: a test that never draws again when
#: torch.randperm gives the identity or the reversal passes on one seed by luck (a third of the seeds when n = 3).
MORE_SEEDS = (1, 2, 3, 4, 5, 6, 7, 8)
#: Plain attention's output rows put in an order of their own (by x's first column): the values of an equivariant
#: function, in places that do not move with the tokens (any reordering of x gives the very same output). A test that
#: compares sorted rows, means or norms over the tokens calls it equivariant; comparing row by row, it is not.
REORDERED = "plain attention, rows in an order of their own"
#: Learned positions at the scale real embeddings start from (0.01): a position-aware attention whose outputs move by
#: 1e-3 to 5e-2 under a reordering, far above rounding (the docstring's atol=1e-5), far below a loose tolerance.
SMALL = "learned positions at 1/100 scale"


def _variant(name: str) -> Callable[[Any], Any]:
    if name not in (REORDERED, SMALL):
        return ref.attention_variant(name)
    plain = ref.attention_variant("plain attention")
    if name == SMALL:
        def small(x):
            if isinstance(x, np.ndarray) and x.dtype.kind == "f":  # NumPy in, NumPy out
                return small(torch.from_numpy(x)).numpy()
            n, d = (x.shape[-2:] if isinstance(x, torch.Tensor) and x.dim() >= 2 else (1, 1))
            g = torch.Generator().manual_seed(7 * d + n)
            return plain(x + 0.01 * torch.randn(n, d, generator=g, dtype=torch.float64).to(x.dtype))

        return small

    def reordered(x):
        out = plain(x)
        if isinstance(out, np.ndarray):
            return np.take_along_axis(out, np.argsort(x[..., :, :1], axis=-2, kind="stable"), axis=-2)
        return out.gather(-2, x[..., :, :1].argsort(dim=-2, stable=True).expand(out.shape))

    return reordered


@probe("position.permutation_test")
def _run_test(test: Callable[..., Any], variant: str, seed: int = SEED) -> dict[str, Any]:
    """Learner side: the learner's test on one attention variant (its random draws seeded with ``seed``): its
    verdict, whether an ``assert`` failed, and what it passed to attn."""
    attn, calls = _variant(variant), []

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
            torch.manual_seed(seed)
            np.random.seed(seed)
            random.seed(seed)
            verdict = test(watched)
    except AssertionError:
        return {"verdict": False, "asserted": True, "calls": calls}
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    if isinstance(verdict, torch.Tensor) and verdict.numel() == 1:
        verdict = bool(verdict.item()) if verdict.dtype == torch.bool else verdict.item()
    return {"verdict": verdict, "asserted": False, "calls": calls}


_ATTN_HINT = [("ValueError", "attn takes", "you called attn with something other than a tensor of shape (n, d)",
               "call attn(x) with x = torch.randn(n, d)")]


def _verdict(fn: Learner, tried: str, *args: Any) -> tuple[dict[str, Any], bool]:
    """The learner's test run learner-side on ``args`` (a variant, a seed): what the probe returned, and True
    (equivariant) or False; None counts as a pytest-style pass."""
    result = call(fn.observe, ("position.permutation_test", *args), tried, "True or False", patterns=_ATTN_HINT,
                  tensor=False)
    result = result if isinstance(result, dict) else {"verdict": result}
    verdict = result.get("verdict")
    if verdict is None or isinstance(verdict, (bool, np.bool_)) or isinstance(verdict, (int, np.integer)) and \
            verdict in (0, 1):
        return result, verdict is None or bool(verdict)
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
    return ("your test never runs attn on a reordering of x, or its comparison lets every difference through (a "
            "tolerance far too loose); your inputs are too large for the check to keep and tell which (over 4096 "
            "numbers)")


def _moved_distances(calls: list[dict], when: str = "") -> str:
    """Why a test missed the symmetric distance bias although its permutation (seen in ``calls``) moves some distance
    |i − j| (neither the identity nor the reversal); "" when no such permutation was seen."""
    seen = _evidence([calls])
    perm = seen.get("perm")  # None: no reordering of one x seen (the identity among them)
    if perm is None or torch.equal(perm, torch.arange(len(perm)).flip(0)):
        return ""
    gap = ref.permutation_gap(ref.attention_variant("symmetric distance bias"), seen["x"], perm)
    size = max(c.get("absmax", 0.0) for c in calls)
    if gap > 1e-4:
        return f"{when}your permutation moves distances |i − j| and the outputs differ by {fmt(gap)}, but your " \
               "comparison lets that through"
    return f"{when}your permutation moves distances |i − j|, yet the outputs differ by only {fmt(gap)}" + (
        f": your inputs, up to {fmt(size)} in size (torch.randn's rarely pass 4), make the scores so large that a bias "
        "of |i − j| hardly moves the weights" if size > 5 else "")


@check("is_permutation_equivariant", expects="a function is_permutation_equivariant(attn) returning True or False")
def check_is_permutation_equivariant(fn: Learner) -> str:
    results: dict[str, dict] = {}
    verdicts: dict[str, bool] = {}
    for name in ref.EQUIVARIANT + ref.POSITION_AWARE:
        results[name], verdicts[name] = _verdict(fn, f"is_permutation_equivariant(attn) with attn = {name}", name)
    runs = [[c for c in r.get("calls", []) if isinstance(c, dict)] for r in results.values()]
    calls = [c for run in runs for c in run]
    sizes = sorted({c["shape"][-2] for c in calls if len(c.get("shape", [])) >= 2})
    widths = sorted({c["shape"][-1] for c in calls if len(c.get("shape", [])) >= 2})
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
            cause = _moved_distances(runs[list(results).index("symmetric distance bias")])
            cause, fix = (cause, fix) if cause else (
                "your permutation keeps every distance |i − j| (a reversal does, or a swap in a sequence of 2), so a "
                "bias of |i − j| goes unnoticed", "perm = torch.randperm(n) with n ≥ 3, drawn again while it is the "
                "identity or the reversal")
        elif max(c.get("absmax", 1.0) for c in calls) < 0.1:
            cause = "your inputs are tiny (|x| < 0.1): the scores barely differ and positional effects vanish"
            fix = "use inputs of a typical size: x = torch.randn(n, d)"
        elif sizes and max(sizes) <= 2:  # 2 tokens miss the symmetric bias only (above); RoPE needs d ≥ 2 too
            one = widths == [1] and "RoPE" in missed
            cause = f"your inputs have only {max(sizes)} tokens: a permutation of 2 is a reversal or nothing" + (
                "; and a single feature (d = 1), where RoPE has no pair of features to rotate" if one else "")
            fix = f"use a few more tokens (n ≥ 3){' and features (d ≥ 2)' if one else ''} and a random permutation"
        elif widths == [1] and "RoPE" in missed:
            cause = "your inputs have a single feature (d = 1): RoPE rotates pairs of features, so it turns nothing"
            fix = "use inputs with a few features: x = torch.randn(n, d) with d ≥ 2"
        fail(f"the test misses {', '.join(missed)}", expected=f"not equivariant for {', '.join(missed)}", cause=cause,
             fix=fix, **words)
    # the same test on what its one run could not show: rows moved but not changed, and other random draws
    tried = (f"is_permutation_equivariant(attn) with attn = {REORDERED} (plain attention's rows, ordered by x's first "
             "column: x and any reordering of it give the same output)")
    if _verdict(fn, tried, REORDERED)[1]:
        fail("the test ignores where the rows go", tried=tried, got="equivariant",
             expected="not equivariant: permuting x moves the output's rows somewhere else than perm says",
             cause="your comparison does not depend on the order of the rows (sorted rows, a mean, a sum or a norm "
                   "over the tokens): an output whose rows are right but in the wrong places passes it",
             fix="compare row by row: torch.allclose(attn(x[perm]), attn(x)[perm], atol=1e-5)")
    tried = f"is_permutation_equivariant(attn) with attn = {SMALL} (x + 0.01·p_t, p_t a random vector per position)"
    result, verdict = _verdict(fn, tried, SMALL)
    if verdict:
        small = _evidence([[c for c in result.get("calls", []) if isinstance(c, dict)]])
        gap = ref.permutation_gap(_variant(SMALL), small["x"], small["perm"]) if "perm" in small else None
        fail("the test misses small positional effects", tried=tried, got="equivariant" + (
             "" if gap is None else f", though on your x and permutation the outputs differ by up to {fmt(gap)}"),
             expected="not equivariant: learned positions change the output, if only a little",
             cause="your test runs attn on x and on x reordered, but the comparison lets a difference far above "
                   "rounding through: a tolerance far too loose (the docstring's atol=1e-5 only forgives rounding), or "
                   "a comparison of part of the outputs" if gap is not None and gap > 1e-4 else "", fix=_TEST_FIX)
    for seed in MORE_SEEDS:
        tried = f"is_permutation_equivariant(attn) with attn = symmetric distance bias, random draws seeded with {seed}"
        result, verdict = _verdict(fn, tried, "symmetric distance bias", seed)
        if not verdict:
            continue
        cause = _moved_distances([c for c in result.get("calls", []) if isinstance(c, dict)], "on this draw ")
        fail("the test misses symmetric distance bias on other random draws", tried=tried, got="equivariant",
             expected=f"not equivariant, whatever the seed (it was with seed {SEED})", cause=cause or (
                 "your permutation is sometimes one that keeps every distance |i − j|: torch.randperm can give the "
                 "identity or the reversal (for 3 tokens, 2 draws in 6), and your test does not draw again then"),
             fix=_TEST_FIX if cause else "perm = torch.randperm(n) with n ≥ 3, drawn again while it is the identity "
             "or the reversal")
    return (f"tells {len(ref.EQUIVARIANT)} permutation-equivariant functions from {len(ref.POSITION_AWARE)} attentions "
            "that see positions")
