"""Checks for notebook 08 (reading attention): the five per-query pattern metrics.

Each metric takes attention weights (..., n_q, n_k) as a tensor and returns one value per query,
(..., n_q), as a tensor or a NumPy array. Oracle: the reference metrics in
:mod:`attn_course.patterns` (entropy via ``torch.special.xlogy``), computed in float64.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import patterns as ref
from ._core import as_tensor, call, check, expect_close, expect_shape, fail

__all__ = [
    "check_normalised_entropy",
    "check_peak_weight",
    "check_self_attention_weight",
    "check_locality",
    "check_effective_positions",
]


def _softmax_rows(shape, gen, *, spread=2.0, dtype=torch.float32):
    return torch.softmax(spread * torch.randn(*shape, generator=gen, dtype=torch.float64), -1).to(dtype)


def _cases(*, square_only=False, single_key=True):
    """(description, weights) pairs: causal rows with exact zeros, a batch with one-hot and uniform
    rows (float64), a non-square matrix, and a single key."""
    gen = torch.Generator().manual_seed(8)
    n = 6
    causal = torch.tril(torch.ones(n, n, dtype=torch.bool))
    scores = 2.0 * torch.randn(n, n, generator=gen, dtype=torch.float64)
    masked = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1).to(torch.float32)
    batch = _softmax_rows((2, 3, 5, 5), gen, dtype=torch.float64)
    batch[0, 0, 1] = torch.nn.functional.one_hot(torch.tensor(3), 5).to(torch.float64)
    batch[1, 2, 4] = torch.full((5,), 0.2, dtype=torch.float64)
    cases = [("causal weights (6, 6) with exact zeros above the diagonal", masked),
             ("a batch (2, 3, 5, 5) in float64 with a one-hot and a uniform row", batch)]
    if not square_only:
        cases.append(("non-square weights (4 queries, 7 keys)", _softmax_rows((4, 7), gen)))
        if single_key:
            cases.append(("a single key (3 queries, 1 key)", torch.ones(3, 1)))
    return cases


def _result(fn, w, what):
    out = call(fn, w)
    if hasattr(out, "values") and hasattr(out, "indices") and not isinstance(out, (torch.Tensor, np.ndarray)):
        fail(f"{what} returned a (values, indices) pair: torch.max(w, dim=-1) gives both; return its .values "
             "(or use w.amax(dim=-1)).")
    return as_tensor(out, what).to(torch.float64)


def _expected_shape(out, w, what, case, pitfalls):
    want = tuple(w.shape[:-1])
    if tuple(out.shape) != want:
        from ._core import diagnose
        hint = diagnose(out, pitfalls) or ""
        expect_shape(out, want, f"{what} ({case})", (hint + " " if hint else "") +
                     "Return one value per query: the input's shape without its last axis.")


# ---- entropy ------------------------------------------------------------------------------

LOG0_NAN = ("entropy with log(0) = NaN: log(0) = −inf and 0·(−inf) = NaN. Count 0·log 0 as 0: "
            "torch.special.xlogy(w, w), or torch.where(w > 0, w * w.log(), 0.0).")
NOT_NORMALISED = "entropy not normalised: divide by its maximum, log(n_k) (n_k = number of keys)."
NORMALISED_BY_QUERIES = ("normalised by log(n_q), the number of queries; a row's maximum entropy is "
                         "log(n_k), the number of keys (the last axis).")
ENTROPY_SIGN = "the sign is flipped: H = −Σ_j w_ij log w_ij is never negative."
ENTROPY_AXIS = "the sum ran over the queries (axis −2); each row (query) sums over its keys, axis −1."
SINGLE_KEY = ("with a single key log(n_k) = 0, so H / log(n_k) is 0/0: return 0 in that case (one key "
              "means no uncertainty).")
BITS = "this looks like the entropy in bits (log2) without the normalisation; divide by log(n_k) in the same base."


def _no_nan(out, w, what, case):
    """Fail on NaN, naming log(0) when the NaNs sit exactly on the rows that hold a zero weight."""
    nan_rows = torch.isnan(out)
    if not nan_rows.any():
        return
    if w.shape[-1] == 1 and "entropy" in what:
        fail(f"{what} ({case}) contains NaN — {SINGLE_KEY}")
    if torch.equal(nan_rows, (w == 0).any(-1)):
        fail(f"{what} ({case}) contains NaN exactly on the rows that hold a zero weight — {LOG0_NAN}")
    fail(f"{what} ({case}) contains NaN ({int(nan_rows.sum())} of {nan_rows.numel()} values).")


def _entropy_pitfalls(w):
    w = w.to(torch.float64)
    h = ref.entropy(w)
    n_q, n_k = w.shape[-2], w.shape[-1]
    return [
        (NOT_NORMALISED, lambda: h),
        (NORMALISED_BY_QUERIES, lambda: h / math.log(n_q)),
        (ENTROPY_SIGN, lambda: -ref.normalised_entropy(w)),
        (ENTROPY_SIGN, lambda: -h),
        (ENTROPY_AXIS, lambda: -torch.special.xlogy(w, w).sum(-2) / math.log(n_q)),
        (ENTROPY_AXIS, lambda: -torch.special.xlogy(w, w).sum(-2) / math.log(n_k)),
        (BITS, lambda: h / math.log(2)),
    ]


@check("normalised entropy", expects="a function normalised_entropy(weights) returning one value per query")
def check_normalised_entropy(fn):
    for case, w in _cases():
        out = _result(fn, w, "normalised_entropy(weights)")
        pitfalls = _entropy_pitfalls(w)
        _expected_shape(out, w, "normalised_entropy(weights)", case, pitfalls)
        _no_nan(out, w, "normalised_entropy(weights)", case)
        expect_close(out, ref.normalised_entropy(w.to(torch.float64)), "normalised_entropy(weights)",
                     case=case, pitfalls=pitfalls)
    return "matches the reference on 4 cases: zeros (0·log 0 = 0), batches, non-square, a single key; values in [0, 1]"


# ---- peak weight --------------------------------------------------------------------------

PEAK_AXIS = "the maximum was taken over the queries (axis −2); take it over each row's keys, axis −1."
PEAK_ARGMAX = "this is the position of the peak (argmax); the exercise asks for the peak weight itself (max)."
PEAK_GLOBAL = "this is the maximum of the whole tensor; take one maximum per row, w.amax(dim=-1)."


@check("peak weight", expects="a function peak_weight(weights) returning one value per query")
def check_peak_weight(fn):
    for case, w in _cases(single_key=False):
        out = _result(fn, w, "peak_weight(weights)")
        w64 = w.to(torch.float64)
        pitfalls = [(PEAK_AXIS, lambda: w64.amax(-2)), (PEAK_ARGMAX, lambda: w64.argmax(-1).to(torch.float64)),
                    (PEAK_GLOBAL, lambda: w64.max())]
        _expected_shape(out, w, "peak_weight(weights)", case, pitfalls)
        expect_close(out, ref.peak_weight(w64), "peak_weight(weights)", case=case, pitfalls=pitfalls)
    return "matches the reference on 3 cases (zeros, batches, non-square)"


# ---- self-attention -----------------------------------------------------------------------

DIAG_DIMS = ("the diagonal was taken over the first two axes; for a batch of matrices take it over the last "
             "two: w.diagonal(dim1=-2, dim2=-1).")
DIAG_OFFSET = ("this is the diagonal below the main one (each query's previous token); self-attention is "
               "w_ii, the main diagonal.")
DIAG_TRACE = "the diagonal was summed (a trace); return one value per query, w_ii."
DIAG_ROWS = "this looks like each row's total (1 for every query); self-attention is the diagonal entry w_ii."


@check("self-attention weight", expects="a function self_attention_weight(weights) returning one value per query")
def check_self_attention_weight(fn):
    for case, w in _cases(square_only=True):
        out = _result(fn, w, "self_attention_weight(weights)")
        w64 = w.to(torch.float64)
        pitfalls = [(DIAG_DIMS, lambda: torch.diagonal(w64)), (DIAG_OFFSET, lambda: w64.diagonal(-1, -2, -1)),
                    (DIAG_TRACE, lambda: w64.diagonal(dim1=-2, dim2=-1).sum(-1)), (DIAG_ROWS, lambda: w64.sum(-1))]
        _expected_shape(out, w, "self_attention_weight(weights)", case, pitfalls)
        expect_close(out, ref.self_attention_weight(w64), "self_attention_weight(weights)", case=case,
                     pitfalls=pitfalls)
    return "matches the reference on 2 cases (one matrix, a batch of matrices)"


# ---- locality -----------------------------------------------------------------------------

LOCALITY_AXIS = ("locality measured from the wrong axis: you averaged positions over the queries (axis −2). "
                 "For query i, the expected attended position is Σ_j w_ij·j over the keys j (axis −1), then "
                 "subtract i.")
LOCALITY_SIGNED = "the distance is signed; take its absolute value, |Σ_j w_ij·j − i|."
LOCALITY_ARGMAX = ("this uses the most-attended position (argmax); locality uses the expected position, "
                   "the weighted average Σ_j w_ij·j.")
LOCALITY_ONE_BASED = "the keys were counted from 1 but the queries from 0 (or the reverse): count both from 0."
LOCALITY_NO_QUERY = "this is the expected position itself; subtract the query's own position i."


def _locality_pitfalls(w):
    w = w.to(torch.float64)
    n_q, n_k = w.shape[-2], w.shape[-1]
    keys, queries = torch.arange(n_k, dtype=w.dtype), torch.arange(n_q, dtype=w.dtype)
    expected = (w * keys).sum(-1)
    return [
        (LOCALITY_AXIS, lambda: ((w * queries[:, None]).sum(-2) - keys).abs()),
        (LOCALITY_AXIS, lambda: ((w * queries[:, None]).sum(-2) - keys[:n_q] if n_q == n_k else None)),
        (LOCALITY_SIGNED, lambda: expected - queries),
        (LOCALITY_SIGNED, lambda: queries - expected),
        (LOCALITY_ARGMAX, lambda: (w.argmax(-1).to(w.dtype) - queries).abs()),
        (LOCALITY_ONE_BASED, lambda: (expected + 1 - queries).abs()),
        (LOCALITY_ONE_BASED, lambda: (expected - 1 - queries).abs()),
        (LOCALITY_NO_QUERY, lambda: expected),
    ]


@check("locality", expects="a function locality(weights) returning one value per query")
def check_locality(fn):
    for case, w in _cases(single_key=False):
        out = _result(fn, w, "locality(weights)")
        pitfalls = _locality_pitfalls(w)
        _expected_shape(out, w, "locality(weights)", case, pitfalls)
        expect_close(out, ref.locality(w.to(torch.float64)), "locality(weights)", case=case, pitfalls=pitfalls)
    return "matches the reference on 3 cases (causal, batches, non-square); distances ≥ 0"


# ---- effective positions ------------------------------------------------------------------

EFF_NORMALISED = "this is exp of the normalised entropy; use the entropy itself (in nats): exp(H)."
EFF_THRESHOLD = ("this counts the weights above a threshold (one definition you may meet); here effective "
                 "positions are exp(H), a smooth count between 1 and n_k.")
EFF_BASES = "the log and the exponential use different bases: with H in nats (natural log) use exp(H), not 2**H."
EFF_PARTICIPATION = ("this is 1 / Σ_j w_ij², the inverse participation ratio, another effective count; the "
                     "exercise asks for exp(H).")
EFF_ENTROPY = "this is the entropy H itself; effective positions are exp(H)."


def _effective_pitfalls(w):
    w = w.to(torch.float64)
    h = ref.entropy(w)
    n_k = w.shape[-1]
    return [
        (EFF_NORMALISED, lambda: ref.normalised_entropy(w).exp()),
        (EFF_THRESHOLD, lambda: (w > 1.0 / (2 * n_k)).sum(-1).to(torch.float64)),
        (EFF_THRESHOLD, lambda: (w > 1.0 / n_k).sum(-1).to(torch.float64)),
        (EFF_BASES, lambda: 2.0 ** h),
        (EFF_PARTICIPATION, lambda: 1.0 / (w ** 2).sum(-1)),
        (EFF_ENTROPY, lambda: h),
    ]


@check("effective positions", expects="a function effective_positions(weights) returning one value per query")
def check_effective_positions(fn):
    for case, w in _cases():
        out = _result(fn, w, "effective_positions(weights)")
        pitfalls = _effective_pitfalls(w)
        _expected_shape(out, w, "effective_positions(weights)", case, pitfalls)
        _no_nan(out, w, "effective_positions(weights)", case)
        expect_close(out, ref.effective_positions(w.to(torch.float64)), "effective_positions(weights)",
                     case=case, pitfalls=pitfalls)
    return "matches the reference on 4 cases; between 1 (one-hot) and n_k (uniform)"
