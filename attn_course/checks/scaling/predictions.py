"""What the Monte-Carlo check knows in advance: the probe that calls the learner's function with a seeded generator,
what each known mistake predicts (σ⁴·d_k gone wrong), and what each common way of drawing q and k gives."""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Sequence

import torch

from ..boundary import probe
from ..kit import Known, watch


#: Tolerance in standard errors: a correct estimate lands outside it with probability ≈ 6·10⁻⁷.
Z = 5.0


# ============================================================================ learner side
MC_PROBE = "attn_course.checks.scaling.mc"


@probe(MC_PROBE)
def _call_with_generator(fn: Callable, d_k: int, seed: int | None = None, disturb: bool = False, watched: bool = False,
                         seeds: Sequence[int] = (), **kwargs: Any) -> tuple[Any, bool | None] | list:
    """``fn(d_k, generator=torch.Generator().manual_seed(seed), **kwargs)`` in the learner's process (no generator
    when ``seed`` is None): the result and whether the generator was drawn from. ``disturb`` moves the global random
    state first; ``watched`` returns what the kit's watcher saw instead. The global random state is restored after,
    leaving the learner's own random numbers alone. ``seeds``: one call per seed, in one trip across the boundary."""
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
    """A known mistake keyed by its summary; ``make`` gives its number (None where it predicts nothing usable)."""
    return Known(summary, summary, cause, fix, value)


SUM_FIX = "q·k = (q * k).sum(dim=-1): add the d_k products of each pair, then take .var() over the n_samples pairs"
DRAW = "sigma * torch.randn(n_samples, d_k, generator=generator)"
BOTH = f"draw q = {DRAW}, and k the same way"
RECIPE = f"draw q and k with {DRAW}, compute (q * k).sum(dim=-1) and return its .var()"
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
SPREAD = {"n_samples·σ⁴: a sum over the samples": lambda d, n: max(math.log(1.15), 3 * math.sqrt(2 / (d - 1)))}
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
]

#: Denominators a learner may divide the sum of squared deviations by, with their names.
DENOMINATORS = {"n_samples − 2": lambda n, d: n - 2, "n_samples + 1": lambda n, d: n + 1, "d_k": lambda n, d: d,
                "n_samples²": lambda n, d: n * n, "1 (no division)": lambda n, d: 1}


def same_number(a: float, b: float) -> bool:
    return math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-9)
