"""check_mc_score_variance: what it knows in advance (the probe that calls the learner's function with a seeded
generator, what each known mistake predicts, what each common way of drawing q and k gives); the learner's estimates,
replayed on a few samples, then judged statistically in five settings, a wrong one named or else measured."""

from __future__ import annotations

import functools
import hashlib
import math
import warnings
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ...scaling import mc_standard_error
from ..boundary import Opaque, probe
from ..compare import Failure
from ..core import Check, Learner, LearnerRaised, check, fail, fmt, learner_error
from ..kit import Known, expect_signature, watch


#: Tolerance in standard errors: a correct estimate lands outside it with probability ≈ 6·10⁻⁷.
Z = 5.0
DEFAULT_N = 20_000
#: (d_k, sigma, n_samples): every argument varies; None means "not passed" (the default is used).
VARIANCE_CASES = [(64, None, None), (16, 2.0, 5_000), (128, 0.5, 20_000), (1, 1.0, 20_000), (8, 3.0, 10_000)]
#: n_samples = 2 on these many seeds: a function that ignores n_samples gives 8 accurate estimates.
SPREAD_SEEDS, SPREAD_DK = 8, 16
#: The scatter test: this many estimates with d_k = 1 and n_samples = SCATTER_N. Their relative variance, divided
#: by the theory 8/n, is 1 ± 0.12 for a correct sampler and 0.25 ± 0.03 when q or k is not random (2000
#: simulations each: ranges 0.60–1.50 and 0.16–0.37); the accepted range is ≥ 4 standard deviations from both.
SCATTER_SEEDS, SCATTER_N, SCATTER_RANGE = 150, 1000, (0.45, 3.0)


# ============================================================================ learner side
MC_PROBE = "attn_course.checks.scaling.mc"


@probe(MC_PROBE)
def _call_with_generator(fn: Callable, d_k: int, seed: int | None = None, disturb: bool = False, watched: bool = False,
                         seeds: Sequence[int] = (), end: bool = False, **kwargs: Any) -> tuple | list:
    """``fn(d_k, generator=torch.Generator().manual_seed(seed), **kwargs)`` in the learner's process (no generator when
    ``seed`` is None): the result and whether the generator was drawn from. ``disturb`` moves the global random state
    first (restored after); ``watched`` returns what the kit's watcher saw; ``seeds``: one call per seed, one trip,
    each with a digest of the generator's state after the call (``end``)."""
    if seeds:
        return [_call_with_generator(fn, d_k, s, end=True, **kwargs) for s in seeds]
    state = torch.random.get_rng_state()
    try:
        if disturb:
            torch.rand(7)
        if seed is None:
            return fn(d_k, **kwargs), None
        g = torch.Generator().manual_seed(seed)
        before = g.get_state()
        if watched:  # the learner saw this call's warnings already, from the same call unwatched
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return watch(fn, d_k, generator=g, **kwargs), None
        result = fn(d_k, generator=g, **kwargs)
        if end:
            return result, not torch.equal(before, g.get_state()), hashlib.sha256(g.get_state().numpy()).hexdigest()
        return result, not torch.equal(before, g.get_state())
    finally:
        torch.random.set_rng_state(state)


# ============================================================================ what each mistake predicts
def _look(summary: str, cause: str, fix: str, value: Callable[..., float | None]) -> Known:
    """A known mistake keyed by its summary; ``make`` gives its number (None where it predicts nothing usable)."""
    return Known(summary, summary, cause, fix, value)


SUM_FIX = "q·k = (q * k).sum(dim=-1): add the d_k products of each pair, then take .var() over the n_samples pairs"
DRAW = "sigma * torch.randn(n_samples, d_k, generator=generator)"
BOTH = f"draw q = {DRAW}, and k the same way"
RECIPE = f"draw q and k with {DRAW}, compute (q * k).sum(dim=-1) and return its .var()"
UNIFORM_FIX = f"draw the entries from torch.randn (standard normal: mean 0, variance 1), times sigma: {DRAW}"
LENGTH_FIX = f"give each vector d_k entries: {DRAW}"
SHORT, LONG = "σ⁴·(d_k − 1): one product's variance missing", "d_k + 1 entries per vector"
PREDICTIONS = [
    _look("σ⁴/d_k: divided by d_k or averaged", "you divided the dot product by d_k (or took the mean of the d_k "
          "products instead of their sum)", SUM_FIX, lambda d, s, n: s**4 / d),
    _look("σ⁴ instead of σ⁴·d_k", "your estimate is σ⁴, d_k times too small: the variance of one product qᵢ·kᵢ (not "
          "added up into a score), of the score divided by √d_k, or the variance divided by d_k give these numbers",
          SUM_FIX + "; no division by d_k or √d_k", lambda d, s, n: s**4),
    _look("σ²: the variance of q's entries", "your estimate is σ², the variance of the entries of q alone, not of q·k",
          "multiply q and k entry by entry, sum over the last axis, then take the variance over the samples",
          lambda d, s, n: s**2),
    _look("σ used as the variance", "you multiplied by σ² (or drew with standard deviation σ²), so the estimate "
          "became σ⁸·d_k", "multiply torch.randn(...) by sigma", lambda d, s, n: s**8 * d),
    _look("σ²·d_k instead of σ⁴·d_k", "your estimate is σ²·d_k: only one of q and k was multiplied by σ, or both by "
          "√σ — these give the same numbers", "multiply both q and k by sigma", lambda d, s, n: s**2 * d),
    _look("the variance of the mean", "your estimate is σ⁴·d_k / n_samples: you divided the variance by n_samples "
          "once more, which gives the variance of the *mean* (the squared standard error)",
          "return scores.var() itself", lambda d, s, n: s**4 * d / n),
    _look("σ ignored", "your estimate is d_k whatever σ: the entries were not multiplied by σ", BOTH,
          lambda d, s, n: float(d)),
    _look("returned the standard deviation", "your estimate is σ²·√d_k, the standard deviation of q·k",
          "return .var() (or square the standard deviation)", lambda d, s, n: s**2 * math.sqrt(d)),
    _look("torch.rand instead of torch.randn", "your estimate is (7/144)·σ⁴·d_k, what entries from torch.rand "
          "(uniform on [0, 1), mean ½) give", "draw the entries from torch.randn (normal, mean 0)",
          lambda d, s, n: 7 * d * s**4 / 144),
    _look("uniform entries on [−σ, σ], not normal", "your estimate is σ⁴·d_k / 9, what entries drawn uniformly on "
          "[−σ, σ] give (torch.rand(…) * 2 − 1, times σ): each has variance σ²/3, not σ², so each product qᵢ·kᵢ has "
          "variance σ⁴/9", UNIFORM_FIX, lambda d, s, n: d * s**4 / 9),
    _look("uniform entries on [−σ/2, σ/2], not normal", "your estimate is σ⁴·d_k / 144, what entries drawn uniformly "
          "on [−σ/2, σ/2] give (torch.rand(…) − 0.5, times σ): each has variance σ²/12, so each product qᵢ·kᵢ has "
          "variance σ⁴/144", UNIFORM_FIX, lambda d, s, n: d * s**4 / 144),
    _look(SHORT, "your estimate is σ⁴·(d_k − 1): each dot product varies as a sum of d_k − 1 products, not d_k — "
          "d_k − 1 entries per vector (torch.randn(n_samples, d_k - 1), range(1, d_k), or a slice that drops an "
          "entry), or vectors centred on their own mean (x - x.mean(-1, keepdim=True) takes one of the d_k "
          "directions away) give these numbers", LENGTH_FIX + ", and use them as drawn",
          lambda d, s, n: (d - 1) * s**4),
    _look(LONG, "your estimate is σ⁴·(d_k + 1): each dot product adds d_k + 1 products, not d_k (torch.randn("
          "n_samples, d_k + 1), or range(d_k + 1))", LENGTH_FIX, lambda d, s, n: (d + 1) * s**4),
    _look("the same vector for q and k", "your estimate is 2·σ⁴·d_k, the variance of q·q: q and k were the same "
          "random draw", "draw k separately from q (two torch.randn calls)", lambda d, s, n: 2 * d * s**4),
    _look("n_samples·σ⁴: a sum over the samples", "your estimate is about n_samples·σ⁴: you added up over the "
          "samples (axis 0, or a sum of per-sample variances), not the d_k products of each pair", SUM_FIX,
          lambda d, s, n: None if d == 1 else n * s**4),
    _look("n_samples²·σ⁴·d_k: q or k not random", "your estimates are n_samples²·σ⁴·d_k: one of q and k is the "
          "constant σ·n_samples (sigma * (n_samples, …) with torch.randn left out)", BOTH,
          lambda d, s, n: n * n * s**4 * d),
]
#: How far (as |log(estimate / prediction)|) an estimate may land from a prediction, given (d_k, n): 15 %, or for a
#: variance over only d_k sums (relative standard error √(2/(d_k − 1))) 3 of those.
#: An off-by-one in d_k is close to the theory for large d_k: it must match as closely as a right estimate of
#: σ⁴·(d_k ± 1) would, Z standard errors (relative standard error √((2 + 6/d)/n) for d products per pair).
SPREAD = {"n_samples·σ⁴: a sum over the samples": lambda d, n: max(math.log(1.15), 3 * math.sqrt(2 / (d - 1))),
          SHORT: lambda d, n: Z * math.sqrt((2 + 6 / max(d - 1, 1)) / n),
          LONG: lambda d, n: Z * math.sqrt((2 + 6 / (d + 1)) / n)}
MEAN = _look("returned the mean, not the variance", "your estimates are all ≈ 0: that is the *mean* of q·k",
              "return the variance of the n_samples dot products: scores.var()", lambda d, s, n: 0.0)


def matches(prediction: Known, estimates: list[float], settings: list[tuple[int, float, int]]) -> bool:
    used = 0
    for est, (d, s, n) in zip(estimates, settings):
        p = prediction.make(d, s, n)
        if p is None:
            continue
        used += 1
        if not math.isfinite(est):
            return False
        if p == 0.0:
            if abs(est) > Z * s**2 * math.sqrt(d / n):  # 5 standard errors of a mean of q·k
                return False
        elif est <= 0 or abs(math.log(est / p)) > SPREAD.get(prediction.key, lambda d, n: math.log(1.15))(d, n):
            return False
    return used >= 3


# ============================================================================ replaying the learner's draws
#: (d_k, sigma, n_samples, seed) of the replay calls: few samples, so that every candidate gives a clearly different
#: number; two settings whose sizes and powers of σ all differ, so that no wrong denominator passes for another.
REPLAY_CALLS = ((7, 1.5, 5, 31), (7, 1.5, 5, 32), (4, 0.7, 8, 33), (4, 0.7, 8, 34))


#: q and k, each (n, d), as a learner who draws them this way from generator g gets them (as float64).
DRAWS = {
    "q then k": lambda g, n, d, s: [(s * torch.randn(n, d, generator=g)).double() for _ in "qk"],
    "q then k, float64": lambda g, n, d, s: [s * torch.randn(n, d, generator=g, dtype=torch.float64) for _ in "qk"],
    "one (n, 2, d) draw": lambda g, n, d, s: (s * torch.randn(n, 2, d, generator=g)).double().unbind(1),
    "one (2, n, d) draw": lambda g, n, d, s: (s * torch.randn(2, n, d, generator=g)).double().unbind(0),
    "one (2n, d) draw": lambda g, n, d, s: (s * torch.randn(2 * n, d, generator=g)).double().split(n),
    "(d, n) layout": lambda g, n, d, s: [(s * torch.randn(d, n, generator=g)).double().T for _ in "qk"],
    "one pair at a time": lambda g, n, d, s: torch.stack([torch.stack([s * torch.randn(d, generator=g) for _ in "qk"])
                                                          for _ in range(n)]).double().unbind(1),
}


def var(x: torch.Tensor, ddof: int) -> float:
    return float(((x - x.mean()) ** 2).sum() / (x.numel() - ddof))


def dots(q, k):
    return (q * k).sum(-1)


VAR_FIX = "return the sample variance of the dot products: scores.var() (or .var(unbiased=False))"


def _either_ddof(summary: str, cause: str, fix: str, estimate) -> list[Known]:
    """One answer with its variance taken either way, n − 1 or n in the denominator (the docstring allows both)."""
    return [Known(f"{summary}/{ddof}", summary, cause, fix, lambda q, k, ddof=ddof: estimate(q, k, ddof))
            for ddof in (1, 0)]


#: The right answers on the learner's own draws: the sample variance, dividing by n_samples − 1 or n_samples.
RIGHT = [lambda q, k, ddof=ddof: var(dots(q, k), ddof) for ddof in (1, 0)]
#: Numbers computed from the learner's draws that statistics alone cannot always tell from the sample variance.
LOOK_ALIKES = [
    _look("mean of the squares, not centred", "you averaged the squared dot products without subtracting their mean: "
          "that is E[s²], not the sample variance (close on many samples, but a different number)", VAR_FIX,
          lambda q, k: float((dots(q, k) ** 2).mean())),
    _look("sum of squares, not centred", "you divided the sum of the squared dot products by n_samples − 1 without "
          "subtracting their mean first", VAR_FIX, lambda q, k: float((dots(q, k) ** 2).sum() / (q.shape[0] - 1))),
    _look("the mean was not squared", "you computed mean(s²) − mean(s): the mean must be squared, mean(s²) − mean(s)²",
          VAR_FIX, lambda q, k: float((dots(q, k) ** 2).mean() - dots(q, k).mean())),
    *_either_ddof("returned the standard deviation", "your estimate is the standard deviation of the dot products",
                  "return .var() (or square the standard deviation)",
                  lambda q, k, ddof: var(dots(q, k), ddof) ** 0.5),
    *_either_ddof("the variance of the mean", "you divided the variance of the dot products by n_samples once more: "
                  "that is the variance of their *mean* (the squared standard error)", "return scores.var() itself",
                  lambda q, k, ddof: var(dots(q, k), ddof) / q.shape[0]),
    *_either_ddof("the products were not added up", "you took the variance of all the products qᵢ·kᵢ, one by one, "
                  "not of each pair's sum", SUM_FIX, lambda q, k, ddof: var((q * k).flatten(), ddof)),
    *_either_ddof("the scores were divided by √d_k", "you took the variance of the scaled score q·k/√d_k; the "
                  "exercise measures q·k", "leave out the division by √d_k",
                  lambda q, k, ddof: var(dots(q, k), ddof) / q.shape[1]),
    *_either_ddof("the same vector for q and k", "your estimate is the variance of q·q: q and k were the same random "
                  "draw", "draw k separately from q (two torch.randn calls)",
                  lambda q, k, ddof: var(dots(q, q), ddof)),
    *_either_ddof("every q against every k", "you took the variance of q @ k.T, the n_samples × n_samples matrix of "
                  "every q against every k; each sample is one pair, q[i] · k[i]", SUM_FIX,
                  lambda q, k, ddof: var(q @ k.T, ddof)),
    *_either_ddof("summed over the samples", "you added the products over the samples (axis 0), not over each "
                  "pair's d_k entries, then took the variance of those d_k sums", SUM_FIX,
                  lambda q, k, ddof: var((q * k).sum(0), ddof)),
    *_either_ddof("d_k × the variance of one product", "you took the variance of the single products qᵢ·kᵢ and "
                  "multiplied it by d_k: that assumes the answer (variances add up) instead of measuring the variance "
                  "of the dot products", SUM_FIX, lambda q, k, ddof: q.shape[1] * var((q * k).flatten(), ddof)),
    *_either_ddof("a variance per entry, then summed", "you took the variance of each entry's product qᵢ·kᵢ over the "
                  "samples (axis 0) and added the d_k variances up: that assumes the answer (variances add up) instead "
                  "of measuring the variance of the dot products", SUM_FIX,
                  lambda q, k, ddof: sum(var((q * k)[:, i], ddof) for i in range(q.shape[1]))),
]

#: Denominators a learner may divide the sum of squared deviations by, with their names.
DENOMINATORS = {"n_samples − 2": lambda n, d: n - 2, "n_samples + 1": lambda n, d: n + 1, "d_k": lambda n, d: d,
                "n_samples²": lambda n, d: n * n, "1 (no division)": lambda n, d: 1}


def same_number(a: float, b: float) -> bool:
    return math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-9)


def _replay(fn: Learner, seed: int) -> None:
    """Redo each common way of drawing on the learner's few-sample calls: the sample variance (either convention) is
    fine; a named wrong number on every call is that mistake, for sure; else only the statistical tests judge."""
    values = [_estimate(fn, d, s, n, seed * 1000 + r)[0] for d, s, n, r in REPLAY_CALLS]
    d, s, n, r = REPLAY_CALLS[0]
    tried = f"{_describe_call(d, s, n, seed * 1000 + r)} (and {len(REPLAY_CALLS) - 1} more calls with few samples)"
    for order, draw in DRAWS.items():
        draws = [draw(torch.Generator().manual_seed(seed * 1000 + r_), n_, d_, s_) for d_, s_, n_, r_ in REPLAY_CALLS]
        if any(all(same_number(v, right(q, k)) for v, (q, k) in zip(values, draws)) for right in RIGHT):
            return
        for cand in LOOK_ALIKES:
            if all(same_number(v, cand.make(q, k)) for v, (q, k) in zip(values, draws)):
                fail(cand.summary, tried=tried, got=f"{fmt(values[0])}: exactly the number this mistake gives on "
                     f"the {n} pairs that generator gives ({order})", cause=cand.cause, fix=cand.fix,
                     expected=f"their sample variance: {fmt(var(dots(*draws[0]), 1))} (or "
                              f"{fmt(var(dots(*draws[0]), 0))} dividing by n_samples)")
        # the sum of squared deviations divided by a wrong number
        ss = [float(((dots(q, k) - dots(q, k).mean()) ** 2).sum()) for q, k in draws]
        for name, over in DENOMINATORS.items():
            if all(same_number(v, x / over(n_, d_)) for v, x, (d_, s_, n_, r_) in zip(values, ss, REPLAY_CALLS)):
                fail(f"divided by {name}", tried=tried, got=f"{fmt(values[0])}: the sum of the squared deviations of "
                     f"the {n} dot products that generator gives ({order}) divided by {over(n, d)} ({name})",
                     expected=f"that sum divided by n_samples − 1 = {n - 1} (or n_samples = {n}): "
                              f"{fmt(ss[0] / (n - 1))}", fix=VAR_FIX,
                     cause=f"your variance divides by {name}; the sample variance by n_samples − 1 (or n_samples)")


# ============================================================================ the Monte-Carlo check
def _number(value: Any, tried: str) -> float:
    """The learner's estimate as a float, or a diagnosis of what came back instead."""
    expected = "one number (a float, or a tensor holding one value)"
    if isinstance(value, (bool, np.bool_)):
        fail("returned a bool", tried=tried, got=repr(value), expected=expected, fix="return the variance itself")
    if isinstance(value, (int, np.integer)) or (isinstance(value, (torch.Tensor, np.ndarray)) and
                                                value.dtype in (torch.int64, torch.int32, np.int64, np.int32)):
        fail("returned an integer", tried=tried, got=f"the integer {int(value)}", expected=expected, fix="return the "
             "variance as a float", cause="int(…), // or an integer tensor dropped the fractional part of the estimate")
    if isinstance(value, (float, np.generic)):
        return float(value)
    if isinstance(value, (torch.Tensor, np.ndarray)):
        t = torch.as_tensor(value)
        if t.numel() != 1:
            fail(f"returned shape {tuple(t.shape)}, not one number", tried=tried, got=f"a tensor of shape "
                 f"{tuple(t.shape)}", expected=expected, cause="you took a variance (or sum) per sample or per entry"
                 if t.dim() and t.shape[-1] != 1 else "", fix="compute scores = (q * k).sum(dim=-1) (shape "
                 "(n_samples,)), then return scores.var()")
        if t.is_complex():
            fail("returned a complex number", tried=tried, got=str(value), expected=expected,
                 fix="return the variance of real dot products")
        if t.dtype in (torch.float16, torch.bfloat16):
            have = str(t.dtype)[6:]
            fail(f"returned a {have} tensor", tried=tried, got=f"a {have} tensor ({fmt(float(t.reshape(()).item()))})",
                 expected="a float, or a float32/float64 tensor holding one value", cause=f"your computation ran in "
                 f"{have}, which keeps only about 3 significant digits", fix="compute in float32 or float64")
        return float(t.reshape(()).item())
    if value is None:
        fail("returned None", tried=tried, got="None", expected=expected, cause="your function has no `return`",
             fix="end the function with `return` and the estimate")
    got = f"a {type(value).__name__}" if not isinstance(value, Opaque) else f"a {value.type_name}"
    fail(f"returned {got}", tried=tried, got=got if not isinstance(value, (list, tuple)) else
         f"a {type(value).__name__} of {len(value)} items", expected=expected,
         fix="return one number: scores.var() (a 0-d tensor) or its .item()")


def _describe_call(d: int, s: float | None, n: int | None, seed: int | None) -> str:
    parts = [str(d)] + ([f"sigma={s:g}"] if s is not None else []) + ([f"n_samples={n}"] if n is not None else [])
    parts.append(f"generator=torch.Generator().manual_seed({seed})" if seed is not None else "(no generator)")
    return f"mc_score_variance({', '.join(parts)})"


def _estimate(fn: Learner, d: int, s: float | None, n: int | None, seed: int | None, *, disturb: bool = False,
              expected: str = "one number", seeds: Sequence[int] = (), tried: str = "", drawn: list | None = None,
              ends: list | None = None) -> Any:
    """(estimate, whether the generator was drawn from); with ``seeds``, the estimate for each seed (and in ``drawn``,
    whether each call drew from its generator; in ``ends``, a digest of each generator's state after the call)."""
    kwargs = {k: v for k, v in (("sigma", s), ("n_samples", n)) if v is not None}
    try:
        result = fn.observe(MC_PROBE, d, seed=seed, disturb=disturb, seeds=seeds, **kwargs)
    except LearnerRaised as exc:
        raise Failure(learner_error(exc, tried=tried or _describe_call(d, s, n, seed), expected=expected)) from None
    if seeds:
        if drawn is not None:
            drawn.extend(used for _, used, _ in result)
        if ends is not None:
            ends.extend(end for _, _, end in result)
        return [_number(value, _describe_call(d, s, n, g)) for (value, _, _), g in zip(result, seeds)]
    return _number(result[0], _describe_call(d, s, n, seed)), result[1]


def _mc_body(fn: Learner, seed: int = 0) -> str:
    expect_signature(fn, ["sigma", "n_samples", "generator"], call="mc_score_variance(d_k, sigma=…, n_samples=…, "
                     "generator=…)", signature="mc_score_variance(d_k, sigma=1.0, n_samples=20_000, generator=None)")
    seeds = [seed * 1000 + i for i in range(len(VARIANCE_CASES))]
    settings = [(d, 1.0 if s is None else s, DEFAULT_N if n is None else n) for d, s, n in VARIANCE_CASES]
    calls = [_describe_call(d, s, n, g_seed) for (d, s, n), g_seed in zip(VARIANCE_CASES, seeds)]
    estimates, used = zip(*(_estimate(fn, d, s, n, g_seed, expected=f"≈ σ⁴·d_k = {fmt(s_used**4 * d)}")
                            for (d, s, n), (_, s_used, _), g_seed in zip(VARIANCE_CASES, settings, seeds)))
    if all(e == s_**4 * d_ for e, (d_, s_, n_) in zip(estimates, settings)):
        fail("returned σ⁴·d_k itself", tried=calls[0], got=f"exactly {fmt(estimates[0])} = σ⁴·d_k, and exactly σ⁴·d_k "
             f"in all {len(estimates)} settings", expected="a Monte-Carlo estimate: close to σ⁴·d_k, but never exactly",
             cause="your function returns the formula's value instead of measuring it", fix=RECIPE)
    _replay(fn, seed)
    if not all(math.isfinite(e) for e in estimates):
        _name_variance_mistake(estimates, settings, calls, fn, seed)
    never_drawn = all(u is False for u in used)
    not_drawn = "`generator` was never drawn from (you used the global random state, or a generator of your own)"

    # The same seed must give the same estimate, even when the global random state has moved on.
    d, s, n = VARIANCE_CASES[3]
    again, _ = _estimate(fn, d, s, n, seeds[3], disturb=True)
    if not math.isclose(again, estimates[3], rel_tol=1e-9, abs_tol=1e-12):
        fail("the generator was not used" if never_drawn else "some draws ignore the generator",
             tried=f"{_describe_call(d, s, n, seeds[3])} twice, the global random state moved in between",
             got=f"{fmt(estimates[3])}, then {fmt(again)}", expected="the same estimate twice: the seed fixes it",
             cause=not_drawn if never_drawn else "only the first call drew from the generator it was given: the later "
                   "ones drew from something else (a generator or samples kept from that first call, or the global "
                   "random state)" if used[0] is True and not any(used[1:]) else "part of your sampling does not "
                   "follow the generator (a draw without generator=generator, NumPy's random state, or a re-seed with "
                   "generator.seed())",
             fix="pass generator=generator to every random draw")

    # Different seeds: estimates with n_samples = 2 must scatter (and must differ at all).
    tried_spread = f"mc_score_variance({SPREAD_DK}, n_samples=2, generator=…) with {SPREAD_SEEDS} different seeds"
    drawn: list = []
    ends: list = []
    spread = _estimate(fn, SPREAD_DK, None, 2, None, seeds=[seed * 1000 + 100 + i for i in range(SPREAD_SEEDS)],
                       tried=tried_spread, drawn=drawn, ends=ends)
    if not all(math.isfinite(e) for e in spread):
        bad = next(e for e in spread if not math.isfinite(e))
        fail(f"{fmt(bad)} with n_samples = 2", tried=tried_spread, got=", ".join(fmt(e) for e in spread),
             expected="finite estimates: the sample variance of 2 dot products is a number (≥ 0)",
             fix="return scores.var() of scores = (q * k).sum(dim=-1), shape (n_samples,): any n_samples ≥ 2 works")
    if len(set(spread)) == 1 and not never_drawn and drawn[0] is True and not any(drawn[1:]):
        fail("an earlier result returned again", tried=tried_spread, got=f"{fmt(spread[0])} every time, and only the "
             "first call drew from its generator", expected="a different estimate for each seed",
             cause="your function keeps its result between calls (a cache or a stored value, looked up by d_k, sigma "
                   "and n_samples): called again with the same arguments it draws nothing and returns the stored "
                   "estimate", fix="draw new samples on every call, from the generator it is given; keep nothing "
                                   "between calls")
    if len(set(spread)) == 1:
        fail("the generator was not used" if never_drawn else "the seed makes no difference", tried=tried_spread,
             got=f"{fmt(spread[0])} every time", expected="a different estimate for each seed",
             cause=not_drawn if never_drawn else "with n_samples = 2 your function draws nothing from `generator` (a "
                   "branch for few samples that uses the global random state, a generator of its own, or no draw at "
                   "all), so every seed gives the same estimate" if not any(drawn) else "you re-seed the generator "
                   "inside your function (generator.manual_seed(…)), so every seed gives the same draws: every "
                   "generator ends in the same state" if all(drawn) and len(set(ends)) == 1 else "every call drew from "
                   "its generator, and the generators end in different states, yet the estimate is the same: it does "
                   "not depend on the draws" + (" (it is exactly 0: your 2 dot products are always equal, k made from "
                                                "q or one draw used twice)" if spread[0] == 0 else ""),
             fix="pass generator=generator, as it is passed in, to every torch.randn call")

    close = sum(abs(e - SPREAD_DK) <= 0.1 * SPREAD_DK for e in spread)
    if close >= SPREAD_SEEDS - 2:
        fail("n_samples ignored", tried=tried_spread, got=f"{close} of the {SPREAD_SEEDS} estimates within 10 % of "
             f"σ⁴·d_k = {SPREAD_DK}: " + ", ".join(fmt(e) for e in spread), expected="estimates scattered widely: "
             "the variance of 2 dot products is far from exact", cause="your function draws a fixed number of "
             "samples, whatever n_samples says", fix=f"draw n_samples pairs: {DRAW}")

    # Each estimate within Z standard errors of the theory.
    if any(abs(est - s**4 * d) > Z * mc_standard_error(d, s, n) for est, (d, s, n) in zip(estimates, settings)):
        _name_variance_mistake(estimates, settings, calls, fn, seed)

    # The estimates must scatter as a sample variance of n_samples random dot products does: with d_k = 1,
    # σ = 1, their variance is 8/n (E[s⁴] = 9). A q (or k) that is not random makes q·k Gaussian, 2/n.
    spread = _scatter(fn, seed)
    if not SCATTER_RANGE[0] <= spread <= SCATTER_RANGE[1]:
        narrow = spread < SCATTER_RANGE[0]
        fail("the estimates scatter too " + ("little" if narrow else "much"), tried=TRIED_SCATTER,
             got=f"estimates whose relative variance is {fmt(spread)} × what a sample variance of {SCATTER_N} "
                 "random dot products has", expected=f"between {SCATTER_RANGE[0]:g} and {SCATTER_RANGE[1]:g} × (1 "
                 "within sampling error): relative to σ⁴·d_k, such estimates have variance (2 + 6/d_k)/n_samples",
             cause="one of q and k is not random (q = sigma, not sigma * torch.randn(…)): a fixed vector times a "
                   "random one is exactly Gaussian" if narrow and 0.15 <= spread <= 0.4 else "",
             fix=f"draw both q and k afresh for every sample: {DRAW}")

    # generator=None (the default) must work too, drawing from the global random state.
    d, s, n = 32, 1.0, DEFAULT_N
    est, _ = _estimate(fn, d, s, n, None, expected=f"≈ {d}")
    se = mc_standard_error(d, s, n)
    if not math.isfinite(est) or abs(est - d) > Z * se:
        fail("wrong without a generator", tried=_describe_call(d, s, n, None), got=fmt(est), expected=f"σ⁴·d_k = {d} "
             f"± {fmt(Z * se)} ({Z:g} standard errors)", cause="with generator=None your function samples differently",
             fix="pass generator=generator to torch.randn: None is what torch.randn expects for 'no generator'")
    if _estimate(fn, d, s, n, None, disturb=True)[0] == est:
        fail("the same estimate every time without a generator", got=f"{fmt(est)} both times",
             tried=f"{_describe_call(d, s, n, None)} twice, the global random state moved in between",
             expected="two different estimates: with generator=None the draws come from the global random state",
             cause="with generator=None your function draws from a fixed seed: a torch.Generator() of its own (which "
                   "always starts from the same seed) or a torch.manual_seed(…) call",
             fix="pass generator=generator, as it is, to every torch.randn call: None makes them use the global "
                 "random state")
    return (f"within {Z:g} standard errors of σ⁴·d_k in {len(estimates)} settings (d_k 1–128, σ 0.5–3, "
            "n_samples 5000–20000); seeded")


TRIED_SCATTER = (f"mc_score_variance(1, n_samples={SCATTER_N}, generator=…) with {SCATTER_SEEDS} different seeds, "
                 "to see how much the estimates scatter")


def _scatter(fn: Learner, seed: int) -> float:
    """The relative variance (variance / mean²) of SCATTER_SEEDS estimates with d_k = 1, σ = 1 over the theory's
    8 / n_samples: 1 for a correct sampler, whatever constant factor the estimates are off by."""
    scatter = _estimate(fn, 1, None, SCATTER_N, None, seeds=[seed * 1000 + 500 + i for i in range(SCATTER_SEEDS)],
                        tried=TRIED_SCATTER)
    finite = [e for e in scatter if math.isfinite(e)]
    if len(finite) < 3 or np.mean(finite) <= 0:
        return float("nan")
    return float(np.var(finite, ddof=1) / np.mean(finite) ** 2) / (8 / SCATTER_N)


def _name_variance_mistake(estimates: list[float], settings: list[tuple[int, float, int]], calls: list[str],
                           fn: Learner, seed: int) -> None:
    """Some estimate is off (or not finite): name the mistake that predicts all of them, or measure how they are off."""
    i = next(i for i, (e, (d, s, n)) in enumerate(zip(estimates, settings))
             if not math.isfinite(e) or abs(e - s**4 * d) > Z * mc_standard_error(d, s, n))
    est, (d, s, n), tried = estimates[i], settings[i], calls[i]
    got = fmt(est)
    expected = f"σ⁴·d_k = {fmt(s**4 * d)} ± {fmt(Z * mc_standard_error(d, s, n))} ({Z:g} standard errors with " \
               f"n_samples = {n})"
    found = [p for p in PREDICTIONS if matches(p, estimates, settings)]
    if not found and matches(MEAN, estimates, settings):
        found = [MEAN]  # after the variance of the mean, which is ≈ 0 too but always σ⁴·d_k / n_samples
    if len(found) == 1:
        fail(found[0].summary, tried=tried, got=got, expected=expected, cause=found[0].cause, fix=found[0].fix)
    not_finite = [d_ for e, (d_, s_, n_) in zip(estimates, settings) if not math.isfinite(e)]
    if not_finite == [1]:
        j = next(j for j, (d_, s_, n_) in enumerate(settings) if d_ == 1)
        fail("NaN when d_k = 1", tried=calls[j], got=f"{fmt(estimates[j])} (all your estimates: " + "; ".join(
             f"d_k = {d_}: {fmt(e)}" for e, (d_, s_, n_) in zip(estimates, settings)) + ")",
             expected=f"a finite number ≈ {fmt(settings[j][1] ** 4)}",
             cause="your estimate is NaN only when each pair has a single entry: you take a variance over each pair's "
                   "d_k products (undefined for one) instead of adding them into one dot product",
             fix=SUM_FIX)
    if not math.isfinite(est):
        seen = fn.observe(MC_PROBE, d, seed=seed * 1000 + i, watched=True, sigma=s, n_samples=n)[0]
        one = est != est and 1 in seen["reductions"] and {"var", "std", "var_mean", "std_mean"} & set(seen["calls"])
        fail("NaN: the variance of a single number" if one else f"{got} for d_k = {d}", tried=tried, got=got,
             expected=f"a finite number ≈ {fmt(s**4 * d)}", cause="your function took .var() or .std() over a single "
             "value, and the variance of one number is NaN" if one else "", fix="print the shape of the tensor whose "
             "variance you take: it should be (n_samples,), one dot product per sample (the variance of a single "
             "number is NaN)")
    if all(e < 0 for e in estimates):
        fail("negative estimates", tried=tried, got=f"{got} (every estimate is below 0)", expected=expected,
             cause="a variance is never negative: a sign slipped into your estimate", fix="return scores.var()")
    ratios = [e / (s_**4 * d_) for e, (d_, s_, n_) in zip(estimates, settings)]
    got_all = f"{got} (all your estimates: " + "; ".join(
        f"d_k = {d_}, σ = {s_:g}: {fmt(e)}" for e, (d_, s_, n_) in zip(estimates, settings)) + ")"
    # Settings 0 and 3 differ only in d_k (64 and 1, σ = 1): the theory says 64 times apart.
    small, large = estimates[3], estimates[0]
    if small > 0 and large > 0 and max(small, large) <= 1.3 * min(small, large):
        fail("the estimate does not grow with d_k", tried=tried, got=got_all, expected=expected, cause="your estimates "
             f"for d_k = 1 and d_k = 64 (σ = 1 both) are about equal ({fmt(small)} and {fmt(large)}): the function "
             "does not use d_k", fix=f"draw q and k as {DRAW}")
    spread = functools.cache(lambda: _scatter(fn, seed))  # the scatter of estimates at d_k = 1, measured when needed
    finite = all(math.isfinite(r) for r in ratios)
    mean_ratio = sum(ratios) / len(ratios) if finite else float("nan")
    # A constant factor: the estimates agree with each other far better than with the theory.
    if math.isfinite(mean_ratio) and mean_ratio > 0 and \
            all(abs(r - mean_ratio) <= min(0.1 * mean_ratio, 0.75 * abs(mean_ratio - 1)) for r in ratios):
        fail(f"off by a factor of {fmt(mean_ratio)}", tried=tried, got=got_all, expected=expected, cause="",
             fix=f"every estimate is about {fmt(mean_ratio)} × σ⁴·d_k: look for a constant that scales q, k or the "
             "result")
    # No common factor, estimates on both sides of the theory, but too far from it: too few samples.
    if finite and min(ratios) < 1 < max(ratios):
        per_setting = [2 + 6 / d_ for d_, s_, n_ in settings]
        effective = sum(per_setting) / sum((r - 1) ** 2 for r in ratios)
        # (below 30 pairs the estimates are too far off for sampling noise: the scatter test below names that; a q or
        # a k shared by all the pairs looks the same here, and its scatter at d_k = 1 tells it apart)
        # (a function that uses m < SCATTER_N pairs also scatters about SCATTER_N / m times too much at d_k = 1: an
        # answer whose scatter there is far below what its effective count implies measures another quantity)
        if 30 <= effective < min(n_ for _, _, n_ in settings) / 4 and \
                max(1.0, SCATTER_N / effective) / 4 <= spread() <= 30:
            fail("fewer samples than n_samples", tried=tried, got=got_all, expected=expected, cause="your estimates "
                 f"land on both sides of σ⁴·d_k, as far as from about {fmt(effective)} pairs: your function uses fewer "
                 "pairs than n_samples (a cap, or part of the draws)", fix=f"draw n_samples pairs, {DRAW}, and use "
                 "all of them")
    if spread() > 30:
        fail("the estimates scatter far too much", tried=tried, got=f"{got_all}; and {SCATTER_SEEDS} estimates for "
             f"d_k = 1 scatter {fmt(spread())} × as much as they should",
             expected=expected, cause="such estimates rest on far fewer independent dot products than n_samples: a q "
             "or a k drawn once and shared by all the pairs", fix=f"draw n_samples independent pairs: {BOTH}")
    fail(f"{fmt(est)}, expected {fmt(s**4 * d)}", tried=tried, got=got_all, expected=expected, fix=RECIPE)


_MC_EXPECTS = "a function mc_score_variance(d_k, sigma=1.0, n_samples=20000, generator=None) returning a number"


def make_mc_check(seed: int) -> Check:
    """The Monte-Carlo check with another set of generator seeds (the tests run it on many)."""
    # 30 s of CPU for the whole check, not 10: it draws about 290,000 samples in all, and a right answer that loops
    # over them in Python needs about 5 s on a quiet 2-core machine.
    return check("mc_score_variance", expects=_MC_EXPECTS, timeout=30.0)(functools.partial(_mc_body, seed=seed))


check_mc_score_variance = make_mc_check(0)
