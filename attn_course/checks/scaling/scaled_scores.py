"""check_scaled_scores: the kit's judge_cases on shapes whose axis sizes all differ and whose d_k are not perfect
squares, over its table of known mistakes (SCALE_TABLE); else the divisor the results imply."""

from __future__ import annotations

import math

import torch

from ..core import Learner, check, fail, fmt
from ..kit import TensorCase as Case, fresh_values, judge_cases, known_rows, product_rows


def _scaled_cases() -> list[Case]:
    f32, f64 = torch.float32, torch.float64
    specs = [  # (what, Q shape, K shape, dtype, scale): every axis size differs; d_k not a square
        ("batch × heads: ", (2, 3, 5, 10), (2, 3, 7, 10), f32, 1.0), ("", (4, 6), (9, 6), f64, 1.0),
        ("a batch: ", (3, 2, 20), (3, 4, 20), f32, 1.0), ("d_k = 1: ", (3, 1), (2, 1), f64, 1.0),
        ("size-1 axes: ", (1, 1, 1, 12), (1, 1, 3, 12), f32, 1.0), ("square ", (5, 5), (5, 5), f64, 1.0),
        ("five axes: ", (2, 1, 2, 3, 6), (2, 1, 2, 4, 6), f64, 1.0), ("entries near 1000: ", (2, 7), (3, 7), f32, 1e3),
    ]
    cases = []
    for i, (what, qs, ks, dtype, scale) in enumerate(specs):
        label = f"{what}Q {qs} and K {ks}, {str(dtype)[6:]}"
        Q, K = [(scale * torch.randn(*shape, generator=torch.Generator().manual_seed(500 + 2 * i + j),
                                     dtype=torch.float64)).to(dtype) for j, shape in enumerate((qs, ks))]
        size = float((Q.abs().double() @ K.abs().double().transpose(-2, -1)).max()) / math.sqrt(qs[-1])
        cases.append(Case(label, (Q, K), _S(Q.double(), K.double()) / math.sqrt(qs[-1]), magnitude=size))
    return cases


def _S(Q, K):
    return Q @ K.transpose(-2, -1)


def _sqrt_d(S, Q):
    return S / math.sqrt(Q.shape[-1])


def _unit(x):
    return x / x.norm(dim=-1, keepdim=True)


_LAST_TWO = "transpose only the last two axes of K: Q @ K.transpose(-2, -1) / math.sqrt(d_k)"
_SQRT_FIX = "divide by math.sqrt(d_k) once, with d_k = Q.shape[-1] (the last axis)"
#: Notebook 01's products gone wrong (kit.PRODUCT_MISTAKES) that this check judges, in its order, each with its fix:
#: _LAST_TWO but for three (None: the family's own).
_PRODUCTS = dict.fromkeys(("dot-T", "t12", "t23", "bmm", "einsum-fixed", "squeeze", "QtK", "t01", "p021", "reshaped",
                           "inner", "2d-only", "flattened", "entrywise", "first-axis-loop"), _LAST_TWO) | {
    "einsum-fixed": None, "squeeze": "keep the product's shape (…, n_q, n_k)",
    "entrywise": "take the matrix product: Q @ K.transpose(-2, -1) / math.sqrt(d_k)"}
SCALE_TABLE = known_rows(  # first the products of notebook 01 gone wrong, then the scaling
    # these two keep this check's own words, which its graded diagnoses quote (the kit's rows word them more fully)
    ("not-transposed", "K not transposed", "you multiplied by K itself (Q @ K); each score pairs a row of Q with a "
     "*row* of K", _LAST_TWO, lambda Q, K: _sqrt_d(Q @ K, Q)),
    ("swapped", "rows and columns swapped (K Qᵀ)", "your matrix has the keys on the rows and the queries on the "
     "columns (K Qᵀ, or the product transposed)", _LAST_TWO, lambda Q, K: _sqrt_d(_S(K, Q), Q)),
    *product_rows(_PRODUCTS, then=_sqrt_d),
    ("not-scaled", "scores not scaled", "you did not divide the scores by √d_k", _SQRT_FIX, _S),
    ("by-d", "divided by d_k instead of √d_k", "you divided by d_k (or divided both Q and K by √d_k, which divides the "
     "product by d_k)", _SQRT_FIX, lambda Q, K: _S(Q, K) / Q.shape[-1]),
    ("times", "multiplied by √d_k", "you multiplied the scores by √d_k; they must be *divided* by it", _SQRT_FIX,
     lambda Q, K: _S(Q, K) * math.sqrt(Q.shape[-1])),
    ("half-power", "d_k ** 1/2 is d_k / 2", "d_k ** 1/2 means (d_k ** 1) / 2 (** binds tighter than /): S / d_k ** 1/2 "
     "divides by d_k and then by 2 (by 2·d_k in all), S / (d_k ** 1/2) by d_k/2; neither is √d_k", "write d_k ** 0.5 or math.sqrt(d_k)",
     lambda Q, K: _S(Q, K) / Q.shape[-1] / 2, lambda Q, K: _S(Q, K) / (Q.shape[-1] / 2)),
    ("rounded", "√d_k rounded to an integer", "you rounded √d_k to a whole number (int(math.sqrt(d_k)), math.isqrt, "
     "//): wrong unless d_k is a perfect square", "divide by math.sqrt(d_k) itself",
     *(lambda Q, K, r=r: _S(Q, K) / r(math.sqrt(Q.shape[-1])) for r in (int, round, math.ceil))),
    ("floor", "floor division //", "// rounds every scaled score down to a whole number", "use / (true division)",
     lambda Q, K: _S(Q, K) // math.sqrt(Q.shape[-1])),
    *[(f"n_{x}", f"scaled by the number of {what}", f"you divided by √n_{x}, the number of {what} ({x.upper()}.shape"
       "[-2]); d_k is the size of each vector, the last axis", _SQRT_FIX,
       lambda Q, K, i=i: _S(Q, K) / math.sqrt((Q, K)[i].shape[-2]))
      for i, x, what in ((1, "k", "keys"), (0, "q", "queries"))],
    ("axis-0", "d_k taken from axis 0", "you took d_k from Q.shape[0] (or K.shape[0]): the queries of 2-D input, the "
     "batch of batched input", _SQRT_FIX,
     lambda Q, K: _S(Q, K) / math.sqrt(Q.shape[0]), lambda Q, K: _S(Q, K) / math.sqrt(K.shape[0])),
    ("axis-1", "d_k taken from axis 1", "you took d_k from Q.shape[1] (or Q.size(1)): right for 2-D input only; with "
     "batched input axis 1 counts queries or heads", _SQRT_FIX,
     lambda Q, K: _S(Q, K) / math.sqrt(Q.shape[1]), lambda Q, K: _S(Q, K) / math.sqrt(K.shape[1])),
    ("d_model", "scaled by √d_model", "you divided by √(heads · d_k), the model width; each head scales by its own "
     "d_k", _SQRT_FIX,
     lambda Q, K: _S(Q, K) / math.sqrt(Q.shape[1] * Q.shape[-1] if Q.ndim == 4 else Q.shape[-1])),
    ("torch-sqrt-int", "torch.sqrt of a Python int", "torch.sqrt takes a tensor, but d_k = Q.shape[-1] is a Python "
     "int", "use math.sqrt(d_k) (or d_k ** 0.5)", lambda Q, K: _S(Q, K) / torch.sqrt(Q.shape[-1])),
    ("softmax", "softmax applied", "you took the softmax of the scaled scores: that is the next step (notebook 05)",
     "return the scaled scores themselves", lambda Q, K: torch.softmax(_sqrt_d(_S(Q, K), Q), -1)),
    ("cosine", "cosine similarity instead of the dot product", "you divided by the vectors' lengths (cosine "
     "similarity) before scaling", "divide the dot products Q Kᵀ by √d_k only",
     lambda Q, K: _sqrt_d(_S(_unit(Q), _unit(K)), Q), lambda Q, K: _S(_unit(Q), _unit(K))),
)

#: Divisors a learner may use by mistake, each a function of (Q, K), for "divided by …" diagnoses.
NAMED_DIVISORS = {
    "d_k²": lambda Q, K: Q.shape[-1] ** 2, "√(d_k + 1)": lambda Q, K: math.sqrt(Q.shape[-1] + 1),
    "√(d_k − 1)": lambda Q, K: math.sqrt(Q.shape[-1] - 1), "2·√d_k": lambda Q, K: 2 * math.sqrt(Q.shape[-1]),
    "√d_k / 2": lambda Q, K: math.sqrt(Q.shape[-1]) / 2,
    "√ of the number of entries of Q": lambda Q, K: math.sqrt(Q.numel()),
    "√ of the number of entries of K": lambda Q, K: math.sqrt(K.numel()),
    "√(n_q · n_k)": lambda Q, K: math.sqrt(Q.shape[-2] * K.shape[-2]),
}


@check("scaled_scores", expects="a function scaled_scores(Q, K) returning a tensor of shape (..., n_q, n_k)")
def check_scaled_scores(fn: Learner) -> str:
    cases = _scaled_cases()
    judge_cases(fn, cases, SCALE_TABLE, call="scaled_scores(Q, K)", arg_names=("Q", "K"), oracle="Q Kᵀ / √d_k",
                measure=lambda i, values, tried: _implied_divisors(cases, values, tried),
                factors=lambda c: {"√d_k": math.sqrt(c.args[0].shape[-1]), "d_k": float(c.args[0].shape[-1]),
                                   "√n_k": math.sqrt(c.args[1].shape[-2]), "√n_q": math.sqrt(c.args[0].shape[-2])})
    fresh_values(fn, cases[0], lambda Q, K: _S(Q, K) / math.sqrt(Q.shape[-1]), call="scaled_scores(Q, K)", seed=590,
                 magnitude=lambda Q, K: float((Q.abs().double() @ K.abs().double().mT).max()) / math.sqrt(Q.shape[-1]))
    return f"matches Q Kᵀ/√d_k on {len(cases)} cases (2-D to 5-D, d_k = 1 and non-squares, float32/64)"


def _implied_divisors(cases: list[Case], values: list, tried: str) -> None:
    """When every result is Q Kᵀ divided by *some* number, say which number for each d_k."""
    divisors = []
    for case, out in zip(cases, values):
        Q, K = case.args
        if out is None or tuple(out.shape) != tuple(case.expected.shape):
            return
        S, a = _S(Q.double(), K.double()), out.detach().double()
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
        fail(f"divided by a fixed {fmt(cs[0])}", tried=tried,
             got=f"Q Kᵀ divided by {fmt(cs[0])} for every d_k ({pairs})",
             expected="Q Kᵀ / √d_k, a divisor that follows the input's d_k",
             cause="your divisor does not depend on the input: d_k (or √d_k) is a fixed number in your code",
             fix="take d_k from the input: d_k = Q.shape[-1], then divide by math.sqrt(d_k)")
    fail("scores divided by the wrong number", tried=tried, got=f"Q Kᵀ divided by the wrong number ({pairs})",
         expected=right, fix="divide by math.sqrt(Q.shape[-1])")
