"""Checks for notebook 02 (why divide by √d_k).

``check_mc_score_variance`` judges a Monte-Carlo estimate statistically: the learner's sampling is
seeded through the ``generator`` argument, and each estimate must land within five standard errors
of the theory σ⁴·d_k (the standard error of a sample variance, :func:`attn_course.scaling.mc_standard_error`).
A correct estimator then fails with probability below 10⁻⁵ per check, while the usual mistakes —
which change the answer by a factor of d_k, σ² or more — are rejected every time and named by
comparing all the estimates with what each mistake would give.

``check_scaled_scores`` compares ``scaled_scores(Q, K)`` with ``Q Kᵀ / √d_k`` on shapes whose axis
sizes all differ, so that scaling by the wrong size can be told apart and named.
"""

from __future__ import annotations

import math

import torch

from ..scaling import mc_standard_error
from ._core import as_tensor, call, check, diagnose, expect_close, expect_finite, fail
from .dot import _TRANSPOSE_HINT, _call_with_hint, _rand

__all__ = ["check_mc_score_variance", "check_scaled_scores"]

N_SAMPLES = 20_000
Z = 5.0  # tolerance in standard errors: P(|N(0,1)| > 5) ≈ 6e-7 per case
# (d_k, sigma): the sizes and spreads differ so that each mistake predicts a different set of answers
VARIANCE_CASES = [(64, 1.0), (16, 2.0), (128, 0.5), (1, 1.0)]

# What each known mistake would return for (d, σ), and how to say it.
VARIANCE_PITFALLS = [
    ("It looks like the dot product was divided by d_k (or the products were averaged with .mean "
     "instead of added with .sum): that estimate is σ⁴/d_k. Add the d_k products, q·k = (q * k).sum(-1).",
     lambda d, s: s**4 / d),
    ("It looks like you measured the variance of the *scaled* score q·k/√d_k (≈ σ⁴); this exercise "
     "asks for the raw dot product q·k, whose variance grows with d_k.",
     lambda d, s: s**4),
    ("It looks like the variance of q's entries alone (≈ σ²), not of the dot product q·k: draw q and k, "
     "multiply them entrywise and sum over the last axis, then take the variance over the samples.",
     lambda d, s: s**2),
    ("It looks like σ was used as a variance (randn * σ²); σ is the standard deviation: multiply "
     "torch.randn(...) by σ.",
     lambda d, s: d * s**8),
    ("It looks like only one of q and k was multiplied by σ; both have standard deviation σ.",
     lambda d, s: d * s**2),
    ("It looks like σ was ignored: scale both q and k by σ.",
     lambda d, s: float(d)),
    ("It looks like the standard deviation, not the variance, was returned: use .var() (or square the std).",
     lambda d, s: math.sqrt(d) * s**2),
    ("It looks like the entries came from torch.rand (uniform on [0, 1), mean ½) instead of torch.randn "
     "(normal, mean 0).",
     lambda d, s: 7 * d * s**4 / 144),
]


def _as_number(value, what: str) -> float:
    t = as_tensor(value, what)
    if t.numel() != 1:
        fail(f"{what} has shape {tuple(t.shape)}; expected one number (a float or a 0-d tensor). "
             "Take the variance over the samples of q·k: scores.var(), not per sample or per dimension.")
    expect_finite(t.reshape(()), what, hint="Is n_samples ≥ 2, and are q and k drawn with torch.randn?")
    return float(t.reshape(()).item())


@check("mc_score_variance",
       expects="a function mc_score_variance(d_k, sigma=1.0, n_samples=20000, generator=None) returning a number")
def check_mc_score_variance(fn, seed: int = 0):
    estimates = []
    for index, (d, s) in enumerate(VARIANCE_CASES):
        g = torch.Generator().manual_seed(seed * 1000 + index)
        what = f"mc_score_variance({d}, sigma={s}, n_samples={N_SAMPLES}, generator=g)"
        estimates.append(_as_number(call(fn, d, sigma=s, n_samples=N_SAMPLES, generator=g), what))

    # Same seed, same answer: the sampling must use the generator it is given.
    last = len(VARIANCE_CASES) - 1  # the cheapest case, d_k = 1
    d, s = VARIANCE_CASES[last]
    again = _as_number(call(fn, d, sigma=s, n_samples=N_SAMPLES, generator=torch.Generator().manual_seed(seed * 1000 + last)),
                       f"mc_score_variance({d}, sigma={s}, ...)")
    if again != estimates[last]:
        fail("two calls with generators seeded alike gave different estimates "
             f"({estimates[last]:.4g} and {again:.4g}): pass `generator=generator` to every torch.randn call, "
             "so that results are reproducible.")

    misses = []
    for (d, s), est in zip(VARIANCE_CASES, estimates):
        expected, se = s**4 * d, mc_standard_error(d, s, N_SAMPLES)
        if abs(est - expected) > Z * se:
            misses.append((d, s, est, expected, se))
    if not misses:
        return (f"estimates agree with σ⁴·d_k in {len(VARIANCE_CASES)} cases "
                f"(d_k from 1 to 128, σ = 0.5, 1, 2), each within {Z:.0f} standard errors")

    d, s, est, expected, se = misses[0]
    msg = (f"mc_score_variance({d}, sigma={s}) returned {est:.4g}, but Var(q·k) = σ⁴·d_k = {expected:.4g}; "
           f"with {N_SAMPLES} samples an estimate lands within ±{Z * se:.3g} ({Z:.0f} standard errors) of it.")
    named = _name_variance_mistake(estimates)
    if named:
        msg += " " + named
    elif all(abs(e) <= Z * math.sqrt(dd * ss**4 / N_SAMPLES) for (dd, ss), e in zip(VARIANCE_CASES, estimates)):
        msg += " The answers are all ≈ 0: that is the *mean* of q·k; return its variance."
    fail(msg)


def _name_variance_mistake(estimates: list[float]) -> str | None:
    """The pitfall whose predictions match every estimate within 15% (they differ by far more)."""
    for message, predict in VARIANCE_PITFALLS:
        predicted = [predict(d, s) for d, s in VARIANCE_CASES]
        if all(abs(e - p) <= 0.15 * abs(p) for e, p in zip(estimates, predicted)):
            return message
    return None


def _scaling_pitfalls(Qt: torch.Tensor, Kt: torch.Tensor) -> list:
    raw = Qt @ Kt.transpose(-2, -1)
    d_k, n_q, n_k = Qt.shape[-1], Qt.shape[-2], Kt.shape[-2]
    pits = [
        ("the scores were not scaled at all: divide Q Kᵀ by √d_k.", raw),
        ("you divided by d_k instead of √d_k (or scaled both Q and K by √d_k): divide Q Kᵀ by math.sqrt(d_k) once.",
         raw / d_k),
        ("you multiplied by √d_k; the scores must be *divided* by √d_k.", raw * math.sqrt(d_k)),
        (f"you divided by √(number of keys) = √{n_k} (K.shape[-2]); d_k is the size of each vector, "
         "the last axis: Q.shape[-1].", raw / math.sqrt(n_k)),
        (f"you divided by √(number of queries) = √{n_q} (Q.shape[-2]); d_k is the last axis, Q.shape[-1].",
         raw / math.sqrt(n_q)),
    ]
    if Qt.ndim >= 3:
        pits.append((f"you divided by √{Qt.shape[0]}, the size of the first (batch) axis; d_k is the last axis, "
                     "Q.shape[-1] (Q.size(1) or Q.shape[0] change meaning with batched input).",
                     raw / math.sqrt(Qt.shape[0])))
    if Qt.ndim == 4:
        heads = Qt.shape[1]
        pits += [
            (f"you divided by √{heads}, the size of axis 1 (the heads); d_k is the last axis, Q.shape[-1].",
             raw / math.sqrt(heads)),
            (f"you divided by √(heads · d_k) = √{heads * d_k}, the model width d_model; each head scales by its "
             "own vector size d_k = Q.shape[-1].", raw / math.sqrt(heads * d_k)),
        ]
    return pits


@check("scaled_scores", expects="a function scaled_scores(Q, K) returning a tensor of shape (..., n_q, n_k)")
def check_scaled_scores(fn):
    cases = [
        ("batch 2, heads 3: Q (2, 3, 5, 16), K (2, 3, 7, 16)", _rand(2, 3, 5, 16, seed=51), _rand(2, 3, 7, 16, seed=52)),
        ("Q (4, 9), K (6, 9), float64", _rand(4, 9, seed=53, dtype=torch.float64), _rand(6, 9, seed=54, dtype=torch.float64)),
        ("batched: Q (3, 2, 25), K (3, 4, 25)", _rand(3, 2, 25, seed=55), _rand(3, 4, 25, seed=56)),
        ("d_k = 1: Q (3, 1), K (2, 1)", _rand(3, 1, seed=57), _rand(2, 1, seed=58)),
    ]
    for label, Q, K in cases:
        Qt, Kt = Q.double(), K.double()
        out = as_tensor(_call_with_hint(fn, (Q, K), _TRANSPOSE_HINT.format(q=tuple(Q.shape), k=tuple(K.shape))),
                        "scaled_scores(Q, K)")
        expected = torch.einsum("...qd,...kd->...qk", Qt, Kt) / math.sqrt(Qt.shape[-1])
        pitfalls = _scaling_pitfalls(Qt, Kt)
        if out.shape != expected.shape:
            named = diagnose(out.double(), [("you multiplied by K instead of Kᵀ.", lambda: Qt @ Kt)])
            fail(f"scaled_scores(Q, K) for {label} has shape {tuple(out.shape)}, expected {tuple(expected.shape)} "
                 "(..., n_q, n_k). " + (named or "Compute Q @ K.transpose(-2, -1), then divide by √d_k."))
        expect_finite(out, f"scaled_scores(Q, K) for {label}")
        expect_close(out.double(), expected, "scaled_scores(Q, K)", case=label, pitfalls=pitfalls, atol=1e-5, rtol=1e-4)
    return f"matches Q Kᵀ/√d_k on {len(cases)} cases (batch × heads, float64, d_k = 1)"
