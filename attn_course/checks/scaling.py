"""Checks for notebook 02 (why divide by √d_k).

``check_mc_score_variance`` judges a Monte-Carlo estimate statistically. The learner's function is called with
a seeded ``torch.Generator`` (built in the learner's process by a probe, which also reports whether it was drawn
from) for five settings of (d_k, sigma, n_samples) that differ in every argument. Each estimate must land within
:data:`Z` standard errors of σ⁴·d_k (:func:`attn_course.scaling.mc_standard_error`): a correct estimator fails
with probability below 10⁻⁵, and a known mistake (:data:`PREDICTIONS`: off by d_k, σ², n_samples…) is named when
it predicts all five estimates. First, a few calls with 5 or 8 samples are *replayed*: the common ways of
drawing q and k from the same seeded generator are redone here, and a number the learner returned that is
exactly a known look-alike of the sample variance (:data:`LOOK_ALIKES`: the mean of the squares, a wrong
denominator…) is named for sure. Then: the same seed must give the same estimate (even after the global random
state moved), ``n_samples`` must matter, the estimates must scatter as a sample variance of random dot products
does (150 seeds), and ``generator=None`` must work.

``check_scaled_scores`` compares the learner's Q Kᵀ/√d_k with PyTorch's on shapes whose axis sizes all differ and
whose d_k are not perfect squares, so that scaling by the wrong size, or by a rounded √d_k, can be told apart:
a mistake of :data:`SCALE_TABLE` (judged by the kit's :class:`~.kit.Suspects`), else what the results measure.
"""


from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..scaling import mc_standard_error
from .boundary import Opaque, probe
from .compare import Failure, as_tensor, expect_shape, same
from .core import Check, Learner, LearnerRaised, check, fail, fmt, learner_error
from .kit import Known, Suspects, explain_raise, fits, watch

__all__ = ["check_mc_score_variance", "check_scaled_scores", "make_mc_check", "Z", "VARIANCE_CASES"]

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
                         seeds: Sequence[int] = (), **kwargs: Any) -> tuple[Any, bool | None] | list:
    """Call ``fn(d_k, generator=torch.Generator().manual_seed(seed), **kwargs)`` in the learner's process
    (no generator argument when ``seed`` is None). Returns the result and whether the generator was drawn
    from. ``disturb`` moves the global random state first; ``watched`` returns what the kit's watcher saw of
    the call instead of its result. The global random state is restored after the call, so checking leaves
    the learner's own random numbers alone. ``seeds``: one such call per seed, their answers in a list (one trip
    across the learner boundary for many estimates)."""
    if seeds:
        return [_call_with_generator(fn, d_k, s, **kwargs) for s in seeds]
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
        return result, not torch.equal(before, g.get_state())
    finally:
        torch.random.set_rng_state(state)


# ============================================================================ what each mistake predicts
def _look(summary: str, cause: str, fix: str, value: Callable[..., float | None]) -> Known:
    """A known mistake of this check, keyed by its summary: ``make`` gives the number it comes to."""
    return Known(summary, summary, cause, fix, value)


Prediction = _look  # make(d_k, σ, n): the value the mistake estimates (None where it predicts nothing usable)


_SUM_FIX = "q·k = (q * k).sum(dim=-1): add the d_k products of each pair, then take .var() over the n_samples pairs"
PREDICTIONS = [
    Prediction("σ⁴/d_k: divided by d_k or averaged", "you divided the dot product by d_k (or took the mean of the "
               "d_k products instead of their sum): that estimate is σ⁴/d_k", _SUM_FIX, lambda d, s, n: s**4 / d),
    Prediction("σ⁴ instead of σ⁴·d_k", "your estimate is σ⁴, d_k times too small: the variance of a single "
               "product qᵢ·kᵢ (the d_k products of a pair not added up into one score), or of the score divided by "
               "√d_k, or the variance divided by d_k — these give the same numbers",
               _SUM_FIX + "; no division by d_k or √d_k", lambda d, s, n: s**4),
    Prediction("σ²: the variance of q's entries", "your estimate is σ², the variance of the entries of q alone, "
               "not of the dot product q·k", "draw q and k, multiply them entry by entry and sum over the last axis, "
               "then take the variance over the samples", lambda d, s, n: s**2),
    Prediction("σ used as the variance", "you multiplied by σ² (or drew with standard deviation σ²): σ is the "
               "standard deviation, so the estimate became σ⁸·d_k", "multiply torch.randn(...) by sigma",
               lambda d, s, n: s**8 * d),
    Prediction("σ²·d_k instead of σ⁴·d_k", "your estimate is σ²·d_k: only one of q and k was multiplied by σ, "
               "or both by √σ (σ taken as the variance) — these give the same numbers; both have standard "
               "deviation σ", "multiply both q and k by sigma", lambda d, s, n: s**2 * d),
    Prediction("the variance of the mean", "your estimate is σ⁴·d_k / n_samples: you divided the variance by "
               "n_samples once more, which gives the variance of the *mean* of the dot products (the squared "
               "standard error), not of the dot products", "return scores.var() itself",
               lambda d, s, n: s**4 * d / n),
    Prediction("σ ignored", "your estimate is d_k whatever σ: the entries were not multiplied by σ",
               "draw q = sigma * torch.randn(..., generator=generator), and k the same way", lambda d, s, n: float(d)),
    Prediction("returned the standard deviation", "your estimate is σ²·√d_k, the standard deviation of q·k, not its "
               "variance", "return .var() (or square the standard deviation)", lambda d, s, n: s**2 * math.sqrt(d)),
    Prediction("torch.rand instead of torch.randn", "your estimate is (7/144)·σ⁴·d_k, which is what entries drawn "
               "from torch.rand (uniform on [0, 1), mean ½) give", "draw the entries from torch.randn (normal, mean 0)",
               lambda d, s, n: 7 * d * s**4 / 144),
    Prediction("the same vector for q and k", "your estimate is 2·σ⁴·d_k, the variance of q·q: q and k were the "
               "same random draw", "draw k separately from q (two torch.randn calls)", lambda d, s, n: 2 * d * s**4),
    Prediction("n_samples·σ⁴: a sum over the samples", "your estimate is about n_samples·σ⁴: something is added "
               "up over the n_samples axis where the d_k products of each pair should be added (a sum over axis 0, "
               "or a sum of per-sample variances)", _SUM_FIX,
               lambda d, s, n: None if d == 1 else n * s**4),
    Prediction("n_samples²·σ⁴·d_k: q or k not random", "your estimates are n_samples²·σ⁴·d_k: what q·k gives when one "
               "of q and k is the constant σ·n_samples instead of σ times random draws (sigma * (n_samples, …) with "
               "torch.randn left out)", "draw q = sigma * torch.randn(n_samples, d_k, generator=generator), and k the "
               "same way", lambda d, s, n: n * n * s**4 * d),
]
#: How far (as |log(estimate / prediction)|) an estimate may land from a prediction, given (d_k, n): 15 %, or for a
#: variance over only d_k sums (relative standard error √(2/(d_k − 1))) 3 of those.
SPREAD = {"n_samples·σ⁴: a sum over the samples": lambda d, n: max(math.log(1.15), 3 * math.sqrt(2 / (d - 1)))}
_MEAN = Prediction("returned the mean, not the variance", "your estimates are all ≈ 0: that is the *mean* of q·k",
                   "return the variance of the n_samples dot products: scores.var()", lambda d, s, n: 0.0)


def _matches(prediction: Prediction, estimates: list[float], settings: list[tuple[int, float, int]]) -> bool:
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
#: (d_k, sigma, n_samples, seed) of the replay calls: few samples, so that every candidate below gives a clearly
#: different number; two settings whose sizes (d_k, n_samples − 2 … n_samples + 1) and powers of σ all differ, so
#: that a wrong denominator or factor cannot pass for another one on both.
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


def _var(x: torch.Tensor, ddof: int) -> float:
    return float(((x - x.mean()) ** 2).sum() / (x.numel() - ddof))


def _dots(q, k):
    return (q * k).sum(-1)


_VAR_FIX = "return the sample variance of the dot products: scores.var() (or .var(unbiased=False))"


def _either_ddof(summary: str, cause: str, fix: str, estimate) -> list[Known]:
    """One answer with its variance taken either way, n − 1 or n in the denominator (the docstring allows both)."""
    return [Known(f"{summary}/{ddof}", summary, cause, fix, lambda q, k, ddof=ddof: estimate(q, k, ddof))
            for ddof in (1, 0)]


#: The right answers on the learner's own draws: the sample variance, dividing by n_samples − 1 or n_samples.
RIGHT = [lambda q, k, ddof=ddof: _var(_dots(q, k), ddof) for ddof in (1, 0)]
#: Numbers a learner may compute from their draws that are not the sample variance (statistics alone cannot
#: always tell them from it), each as a known mistake of (q, k).
LOOK_ALIKES = [
    _look("mean of the squares, not centred", "you averaged the squared dot products without subtracting their mean: "
          "that is E[s²], not the sample variance (on many samples the two are close because the mean is near 0, but "
          "they are different numbers)", _VAR_FIX, lambda q, k: float((_dots(q, k) ** 2).mean())),
    _look("sum of squares, not centred", "you divided the sum of the squared dot products by n_samples − 1 without "
          "subtracting their mean first", _VAR_FIX, lambda q, k: float((_dots(q, k) ** 2).sum() / (q.shape[0] - 1))),
    _look("the mean was not squared", "you computed mean(s²) − mean(s): the mean must be squared, mean(s²) − mean(s)²",
          _VAR_FIX, lambda q, k: float((_dots(q, k) ** 2).mean() - _dots(q, k).mean())),
    *_either_ddof("returned the standard deviation", "your estimate is the standard deviation of the dot products "
                  "(the square root of their variance)", "return .var() (or square the standard deviation)",
                  lambda q, k, ddof: _var(_dots(q, k), ddof) ** 0.5),
    *_either_ddof("the variance of the mean", "you divided the variance of the dot products by n_samples once more: "
                  "that is the variance of their *mean* (the squared standard error)", "return scores.var() itself",
                  lambda q, k, ddof: _var(_dots(q, k), ddof) / q.shape[0]),
    *_either_ddof("the products were not added up", "you took the variance of all the products qᵢ·kᵢ, one by one, "
                  "instead of first adding the d_k products of each pair into its dot product", _SUM_FIX,
                  lambda q, k, ddof: _var((q * k).flatten(), ddof)),
    *_either_ddof("the scores were divided by √d_k", "you took the variance of q·k/√d_k, the scaled score (the "
                  "exercise measures the unscaled q·k)", "leave out the division by √d_k",
                  lambda q, k, ddof: _var(_dots(q, k), ddof) / q.shape[1]),
    *_either_ddof("the same vector for q and k", "your estimate is the variance of q·q: q and k were the same random "
                  "draw", "draw k separately from q (two torch.randn calls)", lambda q, k, ddof: _var(_dots(q, q), ddof)),
    *_either_ddof("summed over the samples", "you added the products over the samples (axis 0) instead of over the "
                  "d_k entries of each pair, then took the variance of those d_k sums", _SUM_FIX,
                  lambda q, k, ddof: _var((q * k).sum(0), ddof)),
]

#: Denominators a learner may divide the sum of squared deviations by, with their names.
DENOMINATORS = {"n_samples − 2": lambda n, d: n - 2, "n_samples + 1": lambda n, d: n + 1, "d_k": lambda n, d: d,
                "n_samples²": lambda n, d: n * n, "1 (no division)": lambda n, d: 1}


def _same_number(a: float, b: float) -> bool:
    return math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-9)


def _replay(fn: Learner, seed: int) -> None:
    """Call the learner with a few samples and seeded generators, redo the draws of each common way of
    drawing here, and see which number the learner's estimate is. The sample variance (either convention):
    fine. A named wrong number on every seed: that mistake, named for sure. Nothing: the learner draws in
    some other way, and only the statistical tests judge it."""
    values = [_estimate(fn, d, s, n, seed * 1000 + r)[0] for d, s, n, r in REPLAY_CALLS]
    d, s, n, r = REPLAY_CALLS[0]
    tried = f"{_describe_call(d, s, n, seed * 1000 + r)} (and {len(REPLAY_CALLS) - 1} more calls with few samples)"
    for order, draw in DRAWS.items():
        draws = [draw(torch.Generator().manual_seed(seed * 1000 + r_), n_, d_, s_) for d_, s_, n_, r_ in REPLAY_CALLS]
        if any(all(_same_number(v, right(q, k)) for v, (q, k) in zip(values, draws)) for right in RIGHT):
            return
        for cand in LOOK_ALIKES:
            if all(_same_number(v, cand.make(q, k)) for v, (q, k) in zip(values, draws)):
                fail(cand.summary, tried=tried, got=f"{fmt(values[0])}, exactly the {cand.summary.lower()} for "
                     f"the {n} pairs that generator gives ({order})",
                     expected=f"their sample variance: {fmt(_var(_dots(*draws[0]), 1))} (or "
                              f"{fmt(_var(_dots(*draws[0]), 0))} dividing by n_samples)", cause=cand.cause, fix=cand.fix)
        # the sum of squared deviations divided by a wrong number
        ss = [float(((_dots(q, k) - _dots(q, k).mean()) ** 2).sum()) for q, k in draws]
        for name, denominator in DENOMINATORS.items():
            if all(_same_number(v, x / denominator(n_, d_)) for v, x, (d_, s_, n_, r_) in zip(values, ss, REPLAY_CALLS)):
                c = denominator(n, d)
                fail(f"divided by {name}", tried=tried,
                     got=f"{fmt(values[0])}: the sum of the squared deviations of the {n} dot products that generator "
                         f"gives ({order}) divided by {c} ({name})",
                     expected=f"that sum divided by n_samples − 1 = {n - 1} (or n_samples = {n}): {fmt(ss[0] / (n - 1))}",
                     cause=f"your variance divides by {name}; the sample variance divides by n_samples − 1 "
                           "(or n_samples)", fix=_VAR_FIX)


# ============================================================================ the Monte-Carlo check
def _number(value: Any, tried: str) -> float:
    """The learner's estimate as a float, or a diagnosis of what came back instead."""
    expected = "one number (a float, or a tensor holding one value)"
    if isinstance(value, (bool, np.bool_)):
        fail("returned a bool", tried=tried, got=repr(value), expected=expected, fix="return the variance itself")
    if isinstance(value, (int, np.integer)) or (isinstance(value, (torch.Tensor, np.ndarray)) and
                                                value.dtype in (torch.int64, torch.int32, np.int64, np.int32)):
        fail("returned an integer", tried=tried, got=f"the integer {int(value)}", expected=expected,
             cause="int(…), // or an integer tensor dropped the fractional part of the estimate",
             fix="return the variance as a float (or a float tensor)")
    if isinstance(value, (float, np.generic)):
        return float(value)
    if isinstance(value, (torch.Tensor, np.ndarray)):
        t = torch.as_tensor(value)
        if t.numel() != 1:
            shape = tuple(t.shape)
            fail(f"returned shape {shape}, not one number", tried=tried, got=f"a tensor of shape {shape}",
                 expected=expected, cause="you took a variance (or sum) per sample or per entry; one number comes from "
                 ".var() over the n_samples dot products" if shape and shape[-1] != 1 else "",
                 fix="compute scores = (q * k).sum(dim=-1) (shape (n_samples,)), then return scores.var()")
        if t.is_complex():
            fail("returned a complex number", tried=tried, got=str(value), expected=expected,
                 fix="return the variance of real dot products")
        if t.dtype in (torch.float16, torch.bfloat16):
            have = str(t.dtype).replace("torch.", "")
            fail(f"returned a {have} tensor", tried=tried, got=f"a {have} tensor ({fmt(float(t.reshape(()).item()))})",
                 expected="a float, or a float32/float64 tensor holding one value",
                 cause=f"your computation ran in {have} (.half() or dtype={have}), which keeps only about 3 "
                       "significant digits of each product and sum",
                 fix="draw and compute in float32 (torch.randn's default) or float64")
        return float(t.reshape(()).item())
    if value is None:
        fail("returned None", tried=tried, got="None", expected=expected,
             cause="your function has no `return` (or returns before computing the result)",
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
              expected: str = "") -> tuple[float, bool | None]:
    kwargs = {k: v for k, v in (("sigma", s), ("n_samples", n)) if v is not None}
    tried = _describe_call(d, s, n, seed)
    try:
        result = fn.observe(MC_PROBE, d, seed=seed, disturb=disturb, **kwargs)
    except LearnerRaised as exc:
        raise Failure(learner_error(exc, tried=tried, expected=expected or "one number")) from None
    return _number(result[0], tried), result[1]


def _estimates(fn: Learner, d: int, n: int, seeds: list[int], tried: str) -> list[float]:
    """The learner's estimates for d_k = d, n_samples = n and each seed, in one trip across the learner boundary."""
    try:
        results = fn.observe(MC_PROBE, d, seeds=seeds, n_samples=n)
    except LearnerRaised as exc:
        raise Failure(learner_error(exc, tried=tried, expected="one number")) from None
    return [_number(value, _describe_call(d, None, n, s)) for (value, _), s in zip(results, seeds)]


def _mc_body(fn: Learner, seed: int = 0) -> str:
    expect_signature(fn, ["sigma", "n_samples", "generator"], call="mc_score_variance(d_k, sigma=…, n_samples=…, generator=…)",
                   signature="mc_score_variance(d_k, sigma=1.0, n_samples=20_000, generator=None)")
    seeds = [seed * 1000 + i for i in range(len(VARIANCE_CASES))]
    settings = [(d, 1.0 if s is None else s, DEFAULT_N if n is None else n) for d, s, n in VARIANCE_CASES]
    calls = [_describe_call(d, s, n, g_seed) for (d, s, n), g_seed in zip(VARIANCE_CASES, seeds)]
    estimates, used = [], []
    for (d, s, n), (_, s_used, _), g_seed in zip(VARIANCE_CASES, settings, seeds):
        est, drew = _estimate(fn, d, s, n, g_seed, expected=f"≈ σ⁴·d_k = {fmt(s_used**4 * d)}")
        estimates.append(est)
        used.append(drew)
    if all(e == s_**4 * d_ for e, (d_, s_, n_) in zip(estimates, settings)):
        fail("returned σ⁴·d_k itself", tried=calls[0], got=f"exactly {fmt(estimates[0])} = σ⁴·d_k, and exactly σ⁴·d_k "
             f"in all {len(estimates)} settings", expected="a Monte-Carlo estimate: close to σ⁴·d_k, but never exactly",
             cause="your function returns the formula's value instead of measuring the variance of sampled dot products",
             fix="draw q and k with sigma * torch.randn(n_samples, d_k, generator=generator), compute "
                 "(q * k).sum(dim=-1) and return its .var()")
    _replay(fn, seed)
    if not all(math.isfinite(e) for e in estimates):
        _name_variance_mistake(estimates, settings, calls, fn, seed)
    never_drawn = all(u is False for u in used)
    not_drawn = ("your random draws do not come from `generator`: it was never drawn from (the global random state, "
                 "or a generator of your own)")

    # The same seed must give the same estimate, even when the global random state has moved on.
    d, s, n = VARIANCE_CASES[3]
    again, _ = _estimate(fn, d, s, n, seeds[3], disturb=True)
    if not math.isclose(again, estimates[3], rel_tol=1e-9, abs_tol=1e-12):
        fail("the generator was not used" if never_drawn else "some draws ignore the generator",
             tried=f"{_describe_call(d, s, n, seeds[3])} twice, the global random state moved in between",
             got=f"{fmt(estimates[3])}, then {fmt(again)}", expected="the same estimate twice: the seed fixes the answer",
             cause=not_drawn if never_drawn else "the same seed gave two different estimates, so part of your "
                   "sampling does not follow the generator you are given (a draw without generator=generator, "
                   "NumPy's random state, or a generator re-seeded inside your function with generator.seed())",
             fix="pass generator=generator to every random draw")

    # Different seeds: estimates with n_samples = 2 must scatter (and must differ at all).
    tried_spread = f"mc_score_variance({SPREAD_DK}, n_samples=2, generator=…) with {SPREAD_SEEDS} different seeds"
    spread = _estimates(fn, SPREAD_DK, 2, [seed * 1000 + 100 + i for i in range(SPREAD_SEEDS)], tried_spread)
    if not all(math.isfinite(e) for e in spread):
        bad = next(e for e in spread if not math.isfinite(e))
        fail(f"{fmt(bad)} with n_samples = 2", tried=tried_spread, got=", ".join(fmt(e) for e in spread),
             expected="finite estimates: the sample variance of 2 dot products is a number (≥ 0)",
             fix="compute scores = (q * k).sum(dim=-1), shape (n_samples,), and return scores.var(); the docstring "
                 "allows any n_samples ≥ 2")
    if len(set(spread)) == 1:
        fail("the generator was not used" if never_drawn else "the seed makes no difference", tried=tried_spread,
             got=f"{fmt(spread[0])} every time", expected="a different estimate for each seed",
             cause=not_drawn if never_drawn else "you re-seed the generator inside your function "
                   "(generator.manual_seed(…)), so every seed gives the same draws",
             fix="pass generator=generator to every torch.randn call, and use it as it is passed in")

    close = sum(abs(e - SPREAD_DK) <= 0.1 * SPREAD_DK for e in spread)
    if close >= SPREAD_SEEDS - 2:
        fail("n_samples ignored", tried=tried_spread,
             got=f"{close} of the {SPREAD_SEEDS} estimates within 10 % of σ⁴·d_k = {SPREAD_DK}: "
                 + ", ".join(fmt(e) for e in spread),
             expected="estimates scattered widely: the variance of just 2 dot products is far from exact",
             cause="your function draws a fixed number of samples, whatever n_samples says",
             fix="draw n_samples pairs: torch.randn(n_samples, d_k, generator=generator)")

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
                 "random dot products has", expected=f"between {SCATTER_RANGE[0]:g} and {SCATTER_RANGE[1]:g} × (1 within "
                 "sampling error): relative to σ⁴·d_k, such estimates have variance (2 + 6/d_k)/n_samples",
             cause=("that is what q·k gives when one of q and k is not random (q = sigma instead of "
                    "sigma * torch.randn(…)): a fixed vector times a random one is exactly Gaussian")
             if narrow and 0.15 <= spread <= 0.4 else "",
             fix="draw both q and k afresh for every sample: sigma * torch.randn(n_samples, d_k, generator=generator)")

    # generator=None (the default) must work too.
    d, s, n = 32, 1.0, DEFAULT_N
    est, _ = _estimate(fn, d, s, n, None, expected=f"≈ {d}")
    se = mc_standard_error(d, s, n)
    if not math.isfinite(est) or abs(est - d) > Z * se:
        fail("wrong without a generator", tried=_describe_call(d, s, n, None), got=fmt(est),
             expected=f"σ⁴·d_k = {d} ± {fmt(Z * se)} ({Z:g} standard errors)",
             cause="with generator=None your function samples differently",
             fix="pass generator=generator to torch.randn: None is what torch.randn expects for 'no generator'")
    return (f"within {Z:g} standard errors of σ⁴·d_k in {len(estimates)} settings (d_k 1–128, σ 0.5–3, "
            "n_samples 5000–20000); seeded")


TRIED_SCATTER = (f"mc_score_variance(1, n_samples={SCATTER_N}, generator=…) with {SCATTER_SEEDS} different seeds, "
                 "to see how much the estimates scatter")


def _scatter(fn: Learner, seed: int) -> float:
    """The relative variance (variance / mean²) of SCATTER_SEEDS estimates with d_k = 1, σ = 1, divided by the
    theory's 8 / n_samples: 1 for a correct sampler, whatever constant factor the estimates may be off by."""
    scatter = _estimates(fn, 1, SCATTER_N, [seed * 1000 + 500 + i for i in range(SCATTER_SEEDS)], TRIED_SCATTER)
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
    se = mc_standard_error(d, s, n)
    got = f"{fmt(est)}"
    expected = f"σ⁴·d_k = {fmt(s**4 * d)} ± {fmt(Z * se)} ({Z:g} standard errors with n_samples = {n})"
    found = [p for p in PREDICTIONS if _matches(p, estimates, settings)]
    if not found and _matches(_MEAN, estimates, settings):
        found = [_MEAN]  # after the variance of the mean, which is ≈ 0 too but always σ⁴·d_k / n_samples
    if len(found) == 1:
        p = found[0]
        fail(p.summary, tried=tried, got=got, expected=expected, cause=p.cause, fix=p.fix)
    not_finite = [d_ for e, (d_, s_, n_) in zip(estimates, settings) if not math.isfinite(e)]
    if not_finite == [1]:
        j = next(j for j, (d_, s_, n_) in enumerate(settings) if d_ == 1)
        fail("NaN when d_k = 1", tried=calls[j], got=f"{fmt(estimates[j])} (all your estimates: " + "; ".join(
             f"d_k = {d_}: {fmt(e)}" for e, (d_, s_, n_) in zip(estimates, settings)) + ")",
             expected=f"a finite number ≈ {fmt(settings[j][1] ** 4)}",
             cause="your estimate is NaN only when each pair has a single entry: you take a variance over the d_k "
                   "products of each pair (undefined for one product) instead of adding them into one dot product",
             fix=_SUM_FIX)
    if not math.isfinite(est):
        seen = fn.observe(MC_PROBE, d, seed=seed * 1000 + i, watched=True, sigma=s, n_samples=n)[0]
        one = 1 in seen["reductions"] and {"var", "std", "var_mean", "std_mean"} & set(seen["calls"])
        fail("NaN: the variance of a single number" if one and est != est else f"{got} for d_k = {d}", tried=tried,
             got=got, expected=f"a finite number ≈ {fmt(s**4 * d)}",
             cause="in your function a reduction (.var() or .std() among them) was taken over a single value, and the "
                   "variance of one number is NaN: the tensor whose variance you take holds one number, not one dot "
                   "product per sample" if one and est != est else "",
             fix="print the shape of the tensor whose variance you take: it should be (n_samples,), one dot "
                 "product per sample (the variance of a single number is NaN)")
    if all(e < 0 for e in estimates):
        fail("negative estimates", tried=tried, got=f"{got} (every estimate is below 0)", expected=expected,
             cause="a variance is never negative: a sign slipped into your estimate", fix="return scores.var()")
    ratios = [e / (s_**4 * d_) for e, (d_, s_, n_) in zip(estimates, settings)]
    all_estimates = "; ".join(f"d_k = {d_}, σ = {s_:g}: {fmt(e)}" for e, (d_, s_, n_) in zip(estimates, settings))
    # Settings 0 and 3 differ only in d_k (64 and 1, σ = 1): the theory says 64 times apart.
    small, large = estimates[3], estimates[0]
    if small > 0 and large > 0 and max(small, large) <= 1.3 * min(small, large):
        fail("the estimate does not grow with d_k", tried=tried, got=f"{got} (all your estimates: {all_estimates})",
             expected=expected, cause=f"your estimates for d_k = 1 and d_k = 64 (σ = 1 both) are about equal "
                                      f"({fmt(small)} and {fmt(large)}): the function does not use d_k",
             fix="draw q and k with d_k entries each: torch.randn(n_samples, d_k, generator=generator)")
    mean_ratio = sum(ratios) / len(ratios) if all(math.isfinite(r) for r in ratios) else float("nan")
    # A constant factor: the estimates agree with each other far better than with the theory.
    if math.isfinite(mean_ratio) and mean_ratio > 0 and \
            all(abs(r - mean_ratio) <= min(0.1 * mean_ratio, 0.75 * abs(mean_ratio - 1)) for r in ratios):
        fail(f"off by a factor of {fmt(mean_ratio)}", tried=tried, got=f"{got} (all your estimates: {all_estimates})",
             expected=expected, cause="", fix=f"every estimate is about {fmt(mean_ratio)} × σ⁴·d_k: look for a "
             "constant that scales q, k or the result")
    # No common factor, estimates on both sides of the theory, but too far from it: too few samples.
    if all(math.isfinite(r) for r in ratios) and min(ratios) < 1 < max(ratios):
        per_setting = [2 + 6 / d_ for d_, s_, n_ in settings]
        effective = sum(per_setting) / sum((r - 1) ** 2 for r in ratios)
        # (below 30 pairs the estimates are too far off for sampling noise: the scatter test below names that)
        if 30 <= effective < min(n_ for _, _, n_ in settings) / 4:
            fail("fewer samples than n_samples", tried=tried, got=f"{got} (all your estimates: {all_estimates})",
                 expected=expected, cause=f"your estimates land on both sides of σ⁴·d_k, as far from it as estimates "
                 f"from about {fmt(effective)} pairs would: your function uses fewer pairs than n_samples asks for "
                 "(a cap on the number of samples, or only part of the draws)",
                 fix="draw n_samples pairs, torch.randn(n_samples, d_k, generator=generator), and use all of them")
    spread = _scatter(fn, seed)
    if spread > 30:
        fail("the estimates scatter far too much", tried=tried, got=f"{got} (all your estimates: {all_estimates}); "
             f"and {SCATTER_SEEDS} estimates for d_k = 1 scatter {fmt(spread)} × as much as they should",
             expected=expected, cause="an estimate that scatters this much rests on far fewer independent dot products "
             "than n_samples: a q or a k drawn once and shared by all the pairs",
             fix="draw n_samples independent pairs: torch.randn(n_samples, d_k, generator=generator) for q and for k")
    fail(f"{fmt(est)}, expected {fmt(s**4 * d)}", tried=tried, got=f"{got} (all your estimates: {all_estimates})",
         expected=expected, fix="draw q and k with sigma * torch.randn(n_samples, d_k, generator=generator), "
         "compute (q * k).sum(dim=-1) and return its .var()")


def expect_signature(fn: Learner, names: Sequence[str], *, call: str, signature: str) -> None:
    """Fail unless the learner's function accepts every keyword in ``names`` (or **kwargs), each with a default."""
    params = fn.inspect().get("signature")
    if not params:
        return
    by_name = {p["name"]: p for p in params}
    listed = f"a function with parameters ({', '.join(p['name'] for p in params)})"
    for n in names:
        if n not in by_name and not any(p["kind"] == "VAR_KEYWORD" for p in params):
            fail(f"no parameter {n}", tried=f"calling {call}", got=listed, expected=f"the signature {signature}",
                 cause=f"the parameter `{n}` was removed or renamed", fix=f"keep the exercise's signature: def {signature}:")
        if n in by_name and not by_name[n]["has_default"]:
            fail(f"{n} has no default value", tried=f"calling {call}", got=listed, expected=f"the signature {signature}",
                 cause=f"`{n}` lost its default, so a call without it fails", fix=f"keep the exercise's signature: def {signature}:")


_MC_EXPECTS = "a function mc_score_variance(d_k, sigma=1.0, n_samples=20000, generator=None) returning a number"


def make_mc_check(seed: int) -> Check:
    """The Monte-Carlo check with another set of generator seeds (the tests run it on many)."""
    return check("mc_score_variance", expects=_MC_EXPECTS)(functools.partial(_mc_body, seed=seed))


check_mc_score_variance = make_mc_check(0)


# ============================================================================ scaled scores
CALL_PROBE = "attn_course.checks.scaling.call"


@probe(CALL_PROBE)
def _call_watching_inputs(fn: Callable, *args: Any) -> tuple[Any, list[int]]:
    """Run ``fn(*args)`` in the learner's process; return its result and the positions of the tensor arguments it
    changed in place."""
    before = [a.clone() for a in args]
    result = fn(*args)
    return result, [i for i, (a, b) in enumerate(zip(args, before))
                    if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b)]


@dataclass
class Case:
    """One call scaled_scores(Q, K): its label, (Q, K), the expected result (float64) and its tolerance."""

    label: str
    args: tuple
    expected: torch.Tensor
    magnitude: float  #: the largest Σ|qᵢ kᵢ| / √d_k, which rounding grows with

    @property
    def atol(self) -> float:  # float32 rounding with a wide margin, for float64 input too (a float32 constant is fine)
        return (3e-5 if self.args[0].dtype == torch.float32 else 2e-6) * self.magnitude


def _scaled_cases() -> list[Case]:
    specs = [  # (label, Q shape, K shape, dtype, scale): every axis size differs; d_k not a square
        ("batch × heads: Q (2, 3, 5, 10) and K (2, 3, 7, 10), float32", (2, 3, 5, 10), (2, 3, 7, 10), torch.float32, 1.0),
        ("Q (4, 6) and K (9, 6), float64", (4, 6), (9, 6), torch.float64, 1.0),
        ("a batch: Q (3, 2, 20) and K (3, 4, 20), float32", (3, 2, 20), (3, 4, 20), torch.float32, 1.0),
        ("d_k = 1: Q (3, 1) and K (2, 1), float64", (3, 1), (2, 1), torch.float64, 1.0),
        ("size-1 axes: Q (1, 1, 1, 12) and K (1, 1, 3, 12), float32", (1, 1, 1, 12), (1, 1, 3, 12), torch.float32, 1.0),
        ("square Q (5, 5) and K (5, 5), float64", (5, 5), (5, 5), torch.float64, 1.0),
        ("five axes: Q (2, 1, 2, 3, 6) and K (2, 1, 2, 4, 6), float64", (2, 1, 2, 3, 6), (2, 1, 2, 4, 6), torch.float64, 1.0),
        ("entries near 1000: Q (2, 7) and K (3, 7), float32", (2, 7), (3, 7), torch.float32, 1000.0),
    ]
    cases = []
    for i, (label, qs, ks, dtype, scale) in enumerate(specs):
        Q, K = [(scale * torch.randn(*shape, generator=torch.Generator().manual_seed(500 + 2 * i + j),
                                     dtype=torch.float64)).to(dtype) for j, shape in enumerate((qs, ks))]
        size = float((Q.abs().double() @ K.abs().double().transpose(-2, -1)).max()) / math.sqrt(qs[-1])
        cases.append(Case(label, (Q, K), _S(Q.double(), K.double()) / math.sqrt(qs[-1]), size))
    return cases


def _S(Q, K):
    return Q @ K.transpose(-2, -1)


def table(*rows: tuple) -> list[Known]:
    """Rows (key, summary, cause, fix, *ways): a known mistake per way of writing it (run on float64 copies)."""
    return [Known(f"{key}/{i}" if i else key, summary, cause, fix, lambda Q, K, w=w: w(Q.double(), K.double()))
            for key, summary, cause, fix, *ways in rows for i, w in enumerate(ways)]


def _sqrt_d(S, Q):
    return S / math.sqrt(Q.shape[-1])


def _unit(x):
    return x / x.norm(dim=-1, keepdim=True)


_LAST_TWO = "transpose only the last two axes of K: Q @ K.transpose(-2, -1) / math.sqrt(d_k)"
_SQRT_FIX = "divide by math.sqrt(d_k) once, with d_k = Q.shape[-1] (the last axis)"
SCALE_TABLE = table(  # first the products of notebook 01 gone wrong, then the scaling
    ("not-transposed", "K not transposed", "you multiplied by K itself (Q @ K); each score pairs a row of Q "
           "with a *row* of K", _LAST_TWO, lambda Q, K: _sqrt_d(Q @ K, Q)),
    ("swapped", "rows and columns swapped (K Qᵀ)", "your matrix has the keys on the rows and the queries on "
           "the columns (K Qᵀ, or the product transposed)", _LAST_TWO, lambda Q, K: _sqrt_d(_S(K, Q), Q)),
    ("dot-T", "K.T on batched input", "K.T reverses *every* axis of a batched tensor (batch axes too), so "
           "keys from different batch entries get mixed", _LAST_TWO, lambda Q, K: _sqrt_d(Q @ K.T, Q)),
    ("t12", "K.transpose(1, 2) names fixed axes", "K.transpose(1, 2) is right for 3-D input only: 2-D input "
           "has no axis 2, and with (batch, heads, n, d) it swaps heads and positions", _LAST_TWO,
           lambda Q, K: _sqrt_d(Q @ K.transpose(1, 2), Q)),
    ("t23", "K.transpose(2, 3) names fixed axes", "K.transpose(2, 3) is right for 4-D input (batch, heads, n, "
           "d) only: 2-D and 3-D input have no axis 3, and with 5 axes it swaps the wrong pair", _LAST_TWO,
           lambda Q, K: _sqrt_d(Q @ K.transpose(2, 3), Q)),
    ("bmm", "3-D only: torch.bmm", "torch.bmm takes exactly 3-D tensors, but the docstring asks for any "
           "number of leading axes", _LAST_TWO, lambda Q, K: _sqrt_d(torch.bmm(Q, K.transpose(-2, -1)), Q)),
    ("einsum-fixed", "einsum without '...'", "your einsum names a fixed number of axes, so it fits one input "
           "rank only", "let '...' stand for the leading axes: torch.einsum('...qd,...kd->...qk', Q, K)",
           *(lambda Q, K, e=e: _sqrt_d(torch.einsum(e, Q, K), Q) for e in ("qd,kd->qk", "bqd,bkd->bqk", "bhqd,bhkd->bhqk"))),
    ("squeeze", ".squeeze() removed a size-1 axis", ".squeeze() removes every axis of size 1, here a batch "
           "axis or the single query", "leave the result's shape as the product gives it (…, n_q, n_k)",
           lambda Q, K: _sqrt_d(_S(Q, K).squeeze(), Q)),
    ("QtK", "Qᵀ K instead of Q Kᵀ", "you transposed Q instead of K: Qᵀ K pairs the vectors' entries with each other, "
     "not queries with keys", _LAST_TWO, lambda Q, K: _sqrt_d(Q.transpose(-2, -1) @ K, Q)),
    ("t01", "K.transpose(0, 1) names fixed axes", "K.transpose(0, 1) swaps the first two axes: right for 2-D input, "
     "but for batched input it swaps the batch axis", _LAST_TWO, lambda Q, K: _sqrt_d(Q @ K.transpose(0, 1), Q)),
    ("p021", "K.permute(0, 2, 1) names fixed axes", "K.permute(0, 2, 1) fits 3-D input only", _LAST_TWO,
     lambda Q, K: _sqrt_d(Q @ K.permute(0, 2, 1), Q)),
    ("reshaped", "K reshaped instead of transposed", "K.reshape(…, d, n_k) keeps the entries in memory order and cuts "
     "them into new rows: it does not turn K's rows into columns", _LAST_TWO,
     lambda Q, K: _sqrt_d(Q @ K.reshape(*K.shape[:-2], K.shape[-1], K.shape[-2]), Q)),
    ("inner", "torch.inner pairs every batch entry", "torch.inner (like torch.tensordot over the last axis) multiplies "
     "every query with every key of *every* batch entry", _LAST_TWO, lambda Q, K: _sqrt_d(torch.inner(Q, K), Q)),
    ("2d-only", "2-D only: .t() or torch.mm", "K.t(), torch.mm and F.linear handle 2-D tensors only, but the docstring "
     "asks for any number of leading axes", _LAST_TWO, lambda Q, K: _sqrt_d(Q @ K.t(), Q),
     lambda Q, K: _sqrt_d(torch.mm(Q, K.transpose(-2, -1)), Q)),
    ("flattened", "batch axes flattened together", "you flattened the leading axes into the rows, so every query is "
     "scored against the keys of every batch entry", _LAST_TWO,
     lambda Q, K: _sqrt_d(Q.reshape(-1, Q.shape[-1]) @ K.reshape(-1, K.shape[-1]).T, Q)),
    ("entrywise", "entry-by-entry product Q * K", "Q * K multiplies entry by entry, pairing query i only with key i",
     "take the matrix product: Q @ K.transpose(-2, -1) / math.sqrt(d_k)", lambda Q, K: _sqrt_d(Q * K, Q),
     lambda Q, K: _sqrt_d((Q * K).sum(-1), Q)),
    ("first-axis-loop", "a loop over the first axis", "your loop runs over the first axis of Q and K, which is the "
     "batch axis once the input is batched", _LAST_TWO,
     lambda Q, K: _sqrt_d(torch.stack([q @ k.T for q, k in zip(Q, K)]), Q),
     lambda Q, K: _sqrt_d(torch.stack([q @ k.transpose(-2, -1) for q, k in zip(Q, K)]), Q)),
    ("not-scaled", "scores not scaled", "you did not divide the scores by √d_k",
           "divide Q Kᵀ by math.sqrt(Q.shape[-1])", _S),
    ("by-d", "divided by d_k instead of √d_k", "you divided by d_k (or divided both Q and K by √d_k, which "
           "divides the product by d_k)", _SQRT_FIX, lambda Q, K: _S(Q, K) / Q.shape[-1]),
    ("times", "multiplied by √d_k", "you multiplied the scores by √d_k; they must be *divided* by it",
           _SQRT_FIX, lambda Q, K: _S(Q, K) * math.sqrt(Q.shape[-1])),
    ("half-power", "d_k ** 1/2 is d_k / 2", "in Python, d_k ** 1/2 means (d_k ** 1) / 2: ** binds tighter "
           "than /, so you scaled by d_k/2, not √d_k", "write d_k ** 0.5 or math.sqrt(d_k)",
           lambda Q, K: _S(Q, K) / Q.shape[-1] / 2, lambda Q, K: _S(Q, K) / (Q.shape[-1] / 2)),
    ("rounded", "√d_k rounded to an integer", "you rounded √d_k to a whole number (int(math.sqrt(d_k)), "
           "math.isqrt or //), which is wrong whenever d_k is not a perfect square", "divide by math.sqrt(d_k) itself",
           *(lambda Q, K, r=r: _S(Q, K) / r(math.sqrt(Q.shape[-1])) for r in (int, round, math.ceil))),
    ("floor", "floor division //", "// rounds every scaled score down to a whole number", "use / (true division)",
           lambda Q, K: _S(Q, K) // math.sqrt(Q.shape[-1])),
    ("n_k", "scaled by the number of keys", "you divided by √n_k, the number of keys (K.shape[-2]); d_k is the "
           "size of each vector, the last axis", _SQRT_FIX, lambda Q, K: _S(Q, K) / math.sqrt(K.shape[-2])),
    ("n_q", "scaled by the number of queries", "you divided by √n_q, the number of queries (Q.shape[-2]); "
           "d_k is the last axis", _SQRT_FIX, lambda Q, K: _S(Q, K) / math.sqrt(Q.shape[-2])),
    ("axis-0", "d_k taken from axis 0", "you took d_k from Q.shape[0] (or K.shape[0]), which counts the "
           "queries of 2-D input and the batch of batched input; d_k is the last axis", _SQRT_FIX,
           lambda Q, K: _S(Q, K) / math.sqrt(Q.shape[0]), lambda Q, K: _S(Q, K) / math.sqrt(K.shape[0])),
    ("axis-1", "d_k taken from axis 1", "you took d_k from Q.shape[1] (or Q.size(1)): right for 2-D input "
           "only; with batched input axis 1 counts queries or heads", _SQRT_FIX,
           lambda Q, K: _S(Q, K) / math.sqrt(Q.shape[1]), lambda Q, K: _S(Q, K) / math.sqrt(K.shape[1])),
    ("d_model", "scaled by √d_model", "you divided by √(heads · d_k), the model width; each head scales by its "
           "own vector size d_k = Q.shape[-1]", _SQRT_FIX,
           lambda Q, K: _S(Q, K) / math.sqrt(Q.shape[1] * Q.shape[-1] if Q.ndim == 4 else Q.shape[-1])),
    ("torch-sqrt-int", "torch.sqrt of a Python int", "torch.sqrt takes a tensor, but d_k = Q.shape[-1] is a "
           "Python int", "use math.sqrt(d_k) (or d_k ** 0.5)", lambda Q, K: _S(Q, K) / torch.sqrt(Q.shape[-1])),
    ("softmax", "softmax applied", "you took the softmax of the scaled scores: that is the next step "
           "(notebook 05)", "return the scaled scores themselves", lambda Q, K: torch.softmax(_sqrt_d(_S(Q, K), Q), -1)),
    ("cosine", "cosine similarity instead of the dot product", "you divided by the vectors' lengths (cosine "
           "similarity) before scaling", "divide the dot products Q Kᵀ by √d_k only",
           lambda Q, K: _sqrt_d(_S(_unit(Q), _unit(K)), Q), lambda Q, K: _S(_unit(Q), _unit(K))),
)

#: Divisors a learner may use by mistake, each a function of (Q, K), for "divided by …" diagnoses.
NAMED_DIVISORS = {
    "d_k²": lambda Q, K: Q.shape[-1] ** 2,
    "√(d_k + 1)": lambda Q, K: math.sqrt(Q.shape[-1] + 1),
    "√(d_k − 1)": lambda Q, K: math.sqrt(Q.shape[-1] - 1),
    "2·√d_k": lambda Q, K: 2 * math.sqrt(Q.shape[-1]),
    "√d_k / 2": lambda Q, K: math.sqrt(Q.shape[-1]) / 2,
    "√ of the number of entries of Q": lambda Q, K: math.sqrt(Q.numel()),
    "√ of the number of entries of K": lambda Q, K: math.sqrt(K.numel()),
    "√(n_q · n_k)": lambda Q, K: math.sqrt(Q.shape[-2] * K.shape[-2]),
}


@check("scaled_scores", expects="a function scaled_scores(Q, K) returning a tensor of shape (..., n_q, n_k)")
def check_scaled_scores(fn: Learner) -> str:
    cases = _scaled_cases()
    tries = [f"scaled_scores(Q, K) with {c.label}" for c in cases]
    outs = [_scores_of(fn, c, t) for c, t in zip(cases, tries)]  # (tensor, changed) or the LearnerRaised
    right = [isinstance(o, tuple) and o[0].is_floating_point() and
             same(o[0], c.expected, atol=c.atol, rtol=1e-5) for o, c in zip(outs, cases)]
    if all(right):
        moved = next((i for i, o in enumerate(outs) if o[1]), None)
        if moved is None:
            return f"matches Q Kᵀ/√d_k on {len(cases)} cases (2-D to 5-D, d_k = 1 and non-squares, float32/64)"
        names = " and ".join("QK"[j] for j in outs[moved][1])
        fail(f"changed its input {names} in place", tried=tries[moved],
             got=f"the right result, but afterwards the caller's {names} holds different values",
             expected=f"{names} left as it was (the docstring: inputs are left unchanged)",
             cause=f"your code modifies {names} in place (/=, *= or an operation ending in _ such as div_)",
             fix="compute into a new tensor: write Q = Q / n instead of Q /= n")
    wrong = [i for i, ok in enumerate(right) if not ok]
    fitting = lambda k, c, o: fits(k, c.args, raised=not isinstance(o, tuple),  # noqa: E731 - a tuple: it returned
                                   value=o[0] if isinstance(o, tuple) else None, atol=max(c.atol, 1e-5))
    suspects = Suspects([k for k in SCALE_TABLE if all(fitting(k, cases[i], outs[i]) for i in wrong)])
    for c, o, ok in zip(cases, outs, right):
        if ok:
            suspects.expect(o[0], c.expected, c.args, tried="", atol=c.atol, rtol=1e-5)
    valued = [i for i in wrong if isinstance(outs[i], tuple)]
    i = valued[0] if valued else wrong[0]
    case, out, tried = cases[i], outs[i], tries[i]

    def expect(**more):
        suspects.expect(out[0], case.expected, case.args, tried=tried, atol=case.atol, rtol=1e-5, oracle="Q Kᵀ / √d_k",
                        again=lambda Q, K: fn.observe(CALL_PROBE, Q, K)[0], distinguish=[cases[j].args for j in wrong],
                        **more)

    if valued and suspects.suspects(out[0], case.args):
        expect()  # a known mistake gives this very result: named
    if not isinstance(outs[wrong[0]], tuple):  # an exception: named when a mistake raises the very same message
        exc, case = outs[wrong[0]], cases[wrong[0]]
        hint = explain_raise(exc, [(k.key, k.fix, lambda k=k: k.make(*case.args)) for k in suspects.table])
        d = learner_error(exc, tried=tries[wrong[0]], expected=f"shape {tuple(case.expected.shape)}")
        k = next((k for k in suspects.table if k.key == hint.get("cause")), None)
        raise Failure(replace(d, summary=k.summary, cause=k.cause, fix=k.fix) if k else d)
    _implied_divisors(cases, outs, tried)
    t = out[0]
    if t.is_floating_point() and torch.isfinite(t).all():  # does the result change when Q or K does?
        other = [fn.observe(CALL_PROBE, *(float(x.abs().max()) * torch.randn(x.shape, dtype=torch.float64, generator=
                                            torch.Generator().manual_seed(7919 + j)).to(x.dtype) if j == m else x
                                            for m, x in enumerate(case.args)))[0] for j in range(2)]
        ignored = [n for n, o in zip("QK", other) if isinstance(o, torch.Tensor) and o.shape == t.shape and
                   torch.equal(o.double(), t.double())]
        if ignored:
            names = " and ".join(ignored)
            fail(f"the result does not depend on {names}", tried=f"{tried}, then again with other values in {names}",
                 got="the same result both times", expected=f"a result that changes with {names}",
                 cause=f"your function never uses the values of {names}" if len(ignored) == 1 else
                 "your function returns the same thing whatever its inputs hold (a constant, or numbers typed in)",
                 fix=f"compute the result from {names} as the docstring says")
    if tuple(t.shape) != tuple(case.expected.shape):
        expect_shape(t, case.expected.shape, tried=tried)
    half = next((h for h in (torch.float16, torch.bfloat16) if t.dtype in (torch.float32, torch.float64) and
                 bool((t.to(h).to(t.dtype) == t).all()) and not bool((t == t.round()).all())), None)
    if half is not None and same(t, case.expected, atol=2e-2 * case.magnitude, rtol=0):
        have = str(half).replace("torch.", "")
        fail(f"computed in {have}", tried=tried, got=f"values close to the expected ones but every one of them a "
             f"{have} number", expected=f"shape {tuple(case.expected.shape)}, values of Q Kᵀ / √d_k",
             cause=f"part of your computation ran in {have} (.half(), .bfloat16()), which keeps about 3 significant "
                   "digits, and the result was converted back", fix="keep the computation in the inputs' dtype")
    Q, K = case.args
    expect(factors={"√d_k": math.sqrt(Q.shape[-1]), "d_k": float(Q.shape[-1]), "√n_k": math.sqrt(K.shape[-2]),
                    "√n_q": math.sqrt(Q.shape[-2])})


def _scores_of(fn: Learner, case: Case, tried: str) -> tuple[torch.Tensor, list[int]] | LearnerRaised:
    """The learner's (result, inputs changed in place) on a case, or the exception it raised."""
    try:
        value, changed = fn.observe(CALL_PROBE, *case.args)
    except LearnerRaised as exc:
        return exc
    if isinstance(value, np.ndarray):
        fail("returned a NumPy array, not a tensor", tried=tried, got=f"a NumPy array of shape {value.shape}",
             expected="a torch.Tensor, as the docstring says", cause="part of your computation went through NumPy "
             "(.numpy(), np.sqrt of a tensor…), which returns an array", fix="stay with torch operations on the tensors")
    if isinstance(value, (np.generic, int, float)) and not isinstance(value, bool):
        fail("returned a Python number, not a tensor", tried=tried, got=f"the number {fmt(float(value))}",
             expected="a tensor", cause="your function returns one number, not one score per pair (a `return` of a "
             "constant such as math.sqrt(d_k), .item() or float(…))", fix="return the scaled scores tensor")
    if isinstance(value, list):
        fail("returned a Python list, not a tensor", tried=tried, got=f"a list of {len(value)} items",
             expected="a tensor", cause="a Python list is not a tensor (.tolist())", fix="leave out .tolist()")
    return as_tensor(value, tried=tried, expected=f"a tensor of shape {tuple(case.expected.shape)}"), changed


def _implied_divisors(cases: list[Case], outs: list, tried: str) -> None:
    """When every result is Q Kᵀ divided by *some* number, say which number for each d_k."""
    divisors = []
    for case, out in zip(cases, outs):
        Q, K = case.args
        if not isinstance(out, tuple) or tuple(out[0].shape) != tuple(case.expected.shape):
            return
        S, a = _S(Q.double(), K.double()), out[0].detach().double()
        if not torch.isfinite(a).all() or float((a * S).sum()) == 0:
            return
        c = float((S * S).sum() / (a * S).sum())  # least squares: a ≈ S / c
        if not torch.allclose(a, S / c, rtol=1e-4, atol=1e-6 * float(S.abs().max())):
            return
        divisors.append((Q.shape[-1], c))
    pairs = "; ".join(f"d_k = {d}: ÷ {fmt(c)}" for d, c in divisors)
    right = "Q Kᵀ / √d_k: " + "; ".join(f"d_k = {d}: ÷ {fmt(math.sqrt(d))}" for d, _ in divisors)
    cs = [c for _, c in divisors]
    for name, size in NAMED_DIVISORS.items():
        sizes = [size(*case.args) for case in cases]
        if all(abs(c - z) <= 1e-3 * abs(z) for c, z in zip(cs, sizes)) and len(set(sizes)) > 1:
            fail(f"divided by {name}", tried=tried, got=f"Q Kᵀ divided by {name} ({pairs})", expected=right,
                 cause=f"your divisor is {name}, not √d_k (d_k = Q.shape[-1], the size of each vector)",
                 fix="divide by math.sqrt(Q.shape[-1])")
    if max(cs) - min(cs) <= 1e-3 * max(abs(c) for c in cs):
        fail(f"divided by a fixed {fmt(cs[0])}", tried=tried, got=f"Q Kᵀ divided by {fmt(cs[0])} for every d_k ({pairs})",
             expected="Q Kᵀ / √d_k, a divisor that follows the input's d_k",
             cause="your divisor does not depend on the input: d_k (or √d_k) is a fixed number in your code",
             fix="take d_k from the input: d_k = Q.shape[-1], then divide by math.sqrt(d_k)")
    fail("scores divided by the wrong number", tried=tried, got=f"Q Kᵀ divided by the wrong number ({pairs})",
         expected=right, fix="divide by math.sqrt(Q.shape[-1])")
