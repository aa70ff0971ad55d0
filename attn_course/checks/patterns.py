"""Checks for notebook 08 (reading attention): the five per-query pattern metrics.

Each metric takes attention weights (..., n_q, n_k) as a tensor and returns one value per query,
(..., n_q), as a tensor (the docstrings say tensor: a NumPy array is named as such). Oracle: the
reference metrics of :mod:`attn_course.patterns` in float64 (entropy is :func:`attn_course.softmax.entropy`,
checked against ``torch.distributions.Categorical`` in the tests).

Every check starts on the same kind of input: one matrix of two-sided weights whose row maxima differ
from row to row and from the whole matrix's maximum, so that the known mistakes give numbers different
from the answer and from each other. Batches, masks, non-square and size-1 inputs follow; a mistake an
earlier case ruled out is never blamed later, and an exception is read against the inputs that ran.
"""

from __future__ import annotations

import math
import re

import numpy as np
import torch

from .. import patterns as ref
from ..masks import causal_mask
from .boundary import Opaque
from .compare import Failure
from .core import (Learner, LearnerRaised, LearnerTimedOut, Mistake, as_tensor, check, expect_close, fail, fmt,
                   learner_error)
from .kit import Evidence as _Evidence, bool_hint as _bool_hint, factors as _factors

__all__ = [
    "check_normalised_entropy",
    "check_peak_weight",
    "check_self_attention_weight",
    "check_attention_distance",
    "check_effective_positions",
]

ATOL, RTOL = 1e-5, 1e-4


def _rows(shape, gen, *, spread=2.0, mask=None, dtype=torch.float64) -> torch.Tensor:
    scores = spread * torch.randn(*shape, generator=gen, dtype=torch.float64)
    if mask is not None:
        scores = scores.masked_fill(~torch.broadcast_to(mask, scores.shape), float("-inf"))
    return torch.softmax(scores, -1).nan_to_num(0.0).to(dtype)


def _general(*, extremes: bool) -> dict:
    """The first case: (6, 6) two-sided weights in float64. Row maxima lie between 0.3 and 0.9 and differ from the
    matrix's maximum; with ``extremes`` row 2 is one-hot and row 5 uniform (entropy and effective positions)."""
    w = _rows((6, 6), torch.Generator().manual_seed(21), spread=1.5)
    name = "two-sided weights (6, 6) in float64"
    if extremes:
        w[2] = torch.nn.functional.one_hot(torch.tensor(4), 6).to(torch.float64)
        w[5] = torch.full((6,), 1 / 6, dtype=torch.float64)
        name += ", row 2 one-hot and row 5 uniform"
    return dict(name=name, w=w, mask=None)


def _cases(*, square_only: bool = False, single_key: bool = True, masks: bool = False, extremes: bool = False) -> list[dict]:
    """Weights to measure: the general case first, exact zeros above a causal diagonal, a batch with one-hot and
    uniform rows, non-square, size-1 axes, a single key; with ``masks``, the masks that made them (and mask shapes
    that broadcast), a fully masked row and allowed keys whose weight is exactly 0."""
    gen = torch.Generator().manual_seed(8)
    causal = causal_mask(6)
    batch = _rows((2, 3, 5, 5), gen)
    batch[0, 0, 1] = torch.nn.functional.one_hot(torch.tensor(3), 5).to(torch.float64)
    batch[1, 2, 4] = torch.full((5,), 0.2, dtype=torch.float64)
    cases = [_general(extremes=extremes)]
    if not square_only:
        cases.append(dict(name="non-square weights (4 queries, 7 keys)", w=_rows((4, 7), gen, dtype=torch.float32),
                          mask=None))
    cases += [
        dict(name="causal weights (6, 6) in float32, exact zeros above the diagonal",
             w=_rows((6, 6), gen, mask=causal, dtype=torch.float32), mask=causal if masks else None),
        dict(name="a batch (2, 3, 5, 5) in float64 with a one-hot and a uniform row", w=batch, mask=None),
    ]
    if masks:
        padding = (torch.arange(6) < torch.tensor([6, 4])[:, None])[:, None, None, :]  # (2, 1, 1, 6)
        half = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.0, 1.0, 0.0, 0.0],
                             [0.7, 0.0, 0.0, 0.3]], dtype=torch.float64)
        fully = torch.tensor([[True], [False], [True]])  # (3, 1): broadcast over the 5 keys
        w_fully = _rows((3, 5), gen, mask=fully)  # row 1 is all zeros: it may attend to nothing
        cases += [
            dict(name="a key-padding mask (2, 1, 1, 6) broadcast over 2 heads and 3 queries",
                 w=_rows((2, 2, 3, 6), gen, mask=padding), mask=padding),
            dict(name="every key allowed (mask all True), some allowed keys with weight exactly 0", w=half,
                 mask=torch.ones(4, 4, dtype=torch.bool)),
            dict(name="a mask (3, 1) broadcast over the keys: row 1 may attend to nothing (its weights are all 0)",
                 w=w_fully, mask=fully),
        ]
    if not square_only:
        cases.append(dict(name="size-1 axes (1, 2, 1, 5): one query per head", w=_rows((1, 2, 1, 5), gen), mask=None))
        if single_key:
            cases.append(dict(name="a single key (3 queries, 1 key)", w=torch.ones(3, 1), mask=None))
    else:
        cases.append(dict(name="size-1 axes (1, 1, 4, 4)", w=_rows((1, 1, 4, 4), gen), mask=None))
        cases.append(dict(name="one query and one key (1, 1)", w=torch.ones(1, 1), mask=None))
    return cases


_SIZE_IN_ERROR = re.compile(r"size of tensor [ab] \((\d+)\)")


def _foreign_size(message: str, shape: tuple) -> int | None:
    """A size the learner's error message names that the input cannot explain (not an axis, a product of two,
    or an axis ± 1): the mark of a hard-coded size."""
    dims = [int(s) for s in shape]
    explained = set(dims) | {a * b for i, a in enumerate(dims) for b in dims[i + 1:]} | {d + 1 for d in dims} | \
        {d - 1 for d in dims} | {1}
    sizes = [int(s) for s in _SIZE_IN_ERROR.findall(message)]
    if len(sizes) == 2 and any(s in dims for s in sizes):
        return next((s for s in sizes if s not in explained), None)
    return None


class _Run:
    """One metric's check: calls the learner on each case, compares with the oracle, and keeps what passed
    (the mistakes it ruled out, the shapes that ran) to read a later failure against."""

    def __init__(self, fn: Learner, what: str):
        self.fn, self.what = fn, what
        self.evidence = _Evidence()
        self.ran: list[tuple[int, ...]] = []

    def tried(self, case: dict) -> str:
        return f"{self.what}(weights{', mask' if case['mask'] is not None else ''}) on {case['name']}"

    def call(self, case: dict) -> torch.Tensor:
        w, mask = case["w"], case["mask"]
        tried = self.tried(case)
        try:
            out = self.fn(w) if mask is None else self.fn(w, mask)
        except LearnerRaised as exc:
            raise Failure(learner_error(exc, tried=tried, expected=f"one value per query, shape {tuple(w.shape[:-1])}",
                                        **self._raise_hint(exc, case))) from None
        if isinstance(out, Opaque) and "return_types" in out.type_name:
            fail("returned a (values, indices) pair", tried=tried,
                 got=f"a {out.type_name}: the maximum values and their positions",
                 expected=f"a tensor of shape {tuple(w.shape[:-1])}",
                 cause="torch.max(w, dim=-1) returns both the values and the indices",
                 fix="return its .values (or use w.amax(dim=-1))")
        if isinstance(out, np.ndarray):
            fail("returned a NumPy array, not a tensor", tried=tried,
                 got=f"a NumPy array of shape {out.shape} ({out.dtype})", expected="a torch tensor, as the docstring says",
                 cause="you converted to NumPy along the way (.numpy(), np.asarray or a NumPy function)",
                 fix="stay with torch operations (torch.from_numpy(array) turns an array back into a tensor)")
        return as_tensor(out, tried=tried)

    def _raise_hint(self, exc: LearnerRaised, case: dict) -> dict:
        shape, mask = tuple(case["w"].shape), case["mask"]
        if mask is not None and exc.type_name == "TypeError" and "argument" in exc.message:
            return dict(cause="your function does not take the mask as its second argument",
                        fix=f"keep the signature {self.what}(weights, mask=None)")
        if _bool_hint(exc):
            return _bool_hint(exc)
        ran = self.ran
        if len(shape) > 2 and ran and all(len(s) == 2 for s in ran):
            return dict(cause=f"your function ran on single matrices such as {ran[0]} but raised on {shape}, a batch of "
                              "matrices: it assumes 2-D weights",
                        fix="index from the end so that leading axes pass through: dim=-1 for the keys, dim=-2 for the "
                            "queries, weights[..., i, j]")
        if shape[-2] != shape[-1] and ran and all(s[-2] == s[-1] for s in ran):
            return dict(cause=f"your function ran on square weights but raised on {shape[-2]} queries × {shape[-1]} "
                              "keys: it uses one size for both axes",
                        fix="take n_q = weights.shape[-2] and n_k = weights.shape[-1] separately")
        foreign = _foreign_size(exc.message, shape)
        if foreign is not None:
            return dict(cause=f"the error names a size {foreign} that weights of shape {shape} do not have: a size in "
                              "your code looks hard-coded",
                        fix="take every size from weights.shape")
        return {}

    def expect(self, out: torch.Tensor, want: torch.Tensor, case: dict, mistakes: list[Mistake], *,
               factors: dict[str, float] | None = None, explain=None) -> None:
        possible = self.evidence.possible([*mistakes, Mistake(
            "rounded to whole numbers", "your values are the right ones rounded to integers (.round(), .long(), "
            "// or an integer tensor along the way)", "keep the values as floats: no rounding, no integer division",
            want.round())])
        axes = (["batch entries"] + [None] * (want.ndim - 2) + ["queries"])[-want.ndim:]  # (B, …, n_q)
        try:
            expect_close(out, want, tried=self.tried(case), atol=ATOL, rtol=RTOL, mistakes=possible, factors=factors,
                         fix="return one value per query (the input's shape without its last axis); compare your "
                             "steps with the docstring on this input", axes=axes)
        except Failure as failure:
            if explain is not None and not failure.diagnosis.cause:
                explain(failure)
            raise
        self.evidence.passed(possible, want, atol=ATOL, rtol=RTOL)
        self.ran.append(tuple(case["w"].shape))


def _guarded(h: torch.Tensor, k: torch.Tensor, log=torch.log) -> torch.Tensor:
    """h / log(k) where k > 1, else 0 (the docstring's rule), in float64."""
    k = k.to(torch.float64)
    return torch.where(k > 1, h / log(k.clamp(min=2)), torch.zeros_like(h))


def _simple_rows(fn: Learner, oracle, what: str) -> tuple[str, str] | None:
    """What the learner's metric gives on four rows whose answers are known by heart (one-hot, uniform over 4 keys,
    half on 2 keys, 0.7 on one key): (a summary of the first property it breaks, the four values), or None."""
    rows = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.25] * 4, [0.5, 0.5, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]],
                        dtype=torch.float64)
    try:
        got = fn(rows)
    except (LearnerRaised, LearnerTimedOut):
        return None
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != (4,):
        return None
    want = oracle(rows)
    names = ("a one-hot row", "a row uniform over 4 keys", "a row of 0.5, 0.5, 0, 0", "a row of 0.7, 0.1, 0.1, 0.1")
    values = ", ".join(f"{n} → {_num(float(g))} (expected {_num(float(e))})" for n, g, e in zip(names, got, want))
    for name, g, e in zip(names, got.to(torch.float64), want):
        if not math.isclose(float(g), float(e), rel_tol=RTOL, abs_tol=ATOL):
            return f"{name} gives {_num(float(g))}, not {_num(float(e))}", f"{what} on simple rows: {values}"
    return None


def _num(x: float) -> str:
    return "NaN" if x != x else f"{x + 0.0:.4g}"  # (+ 0.0: no "-0")


def _explain_with_simple_rows(fn: Learner, oracle, what: str):
    def explain(failure: Failure) -> None:
        found = _simple_rows(fn, oracle, what)
        if found:
            failure.diagnosis.summary = found[0]
            failure.diagnosis.got += f"\n{found[1]}"
    return explain


# ============================================================================ normalised entropy
_LOG0 = ("log(0) gives NaN", "you computed w·log(w) directly: a weight of exactly 0 gives 0·(−inf) = NaN",
         "count 0·log 0 as 0: torch.special.xlogy(w, w), or torch.where(w > 0, w * w.log(), 0.0)")
_EPS_FIX = "count 0·log 0 as 0 exactly: torch.special.xlogy(w, w) or torch.where(w > 0, w * w.log(), 0.0)"


def _eps_mistakes(w: torch.Tensor, then) -> list[Mistake]:
    """An epsilon inside the log large enough to change the answer: log(w + ε) or log(clamp(w, min=ε))."""
    out = []
    for eps in (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6):
        for how, logw in ((f"log(w + {eps:g})", torch.log(w + eps)),
                          (f"log(w.clamp(min={eps:g}))", torch.log(w.clamp(min=eps)))):
            out.append(Mistake(f"{how} instead of log(w)", f"you took {how}: the ε guards log(0), but at {eps:g} it "
                               "also changes the entropy of the rows with small weights", _EPS_FIX,
                               lambda logw=logw: then(-(w * logw).sum(-1))))
    return out


def _entropy_mistakes(case: dict) -> list[Mistake]:
    w, mask = case["w"].to(torch.float64), case["mask"]
    n_q, n_k = w.shape[-2], w.shape[-1]
    h = ref.entropy(w)
    full = torch.ones_like(w, dtype=torch.bool) if mask is None else torch.broadcast_to(mask, w.shape)
    allowed = full.sum(-1).double()
    plain = -(w * w.log()).sum(-1)
    ln2 = math.log(2)
    mistakes = [
        Mistake(*_LOG0, lambda: plain / math.log(n_k) if n_k > 1 else None),
        Mistake(*_LOG0, lambda: plain / allowed.log()),
        Mistake(*_LOG0, lambda: _guarded(plain, allowed)),
        Mistake("entropy not normalised", "you returned the entropy H itself", "divide H by the log of the number "
                "of allowed keys (log n_k when no mask is given)", h),
        Mistake("normalised by the number of queries", "you divided by log(n_q), the number of queries; a row's "
                "largest possible entropy is the log of its number of keys (the last axis)",
                "divide by log(number of allowed keys): log n_k when no mask is given",
                lambda: h / math.log(n_q) if n_q > 1 else None),
        Mistake("sign flipped", "you dropped the minus sign: H = −Σ_j w_ij log w_ij is never negative",
                "put the minus sign back", lambda: -ref.normalised_entropy(w, mask)),
        Mistake("sign flipped", "you dropped the minus sign: H = −Σ_j w_ij log w_ij is never negative",
                "put the minus sign back", -h),
        Mistake("summed over the queries", "you summed over axis −2 (the queries); each row (one query) sums over "
                "its keys, axis −1", "sum over dim=-1",
                lambda: -torch.special.xlogy(w, w).sum(-2) / math.log(n_k) if n_q == n_k else None),
        Mistake("summed over the queries", "you summed over axis −2 (the queries); each row (one query) sums over "
                "its keys, axis −1", "sum over dim=-1",
                lambda: _guarded(-torch.special.xlogy(w, w).sum(-2), full.sum(-2)) if n_q == n_k else None),
        Mistake("entropy in bits, not normalised", "you computed the entropy with log2 and did not normalise it",
                "divide by log2 of the number of allowed keys (or use natural logs throughout)", h / ln2),
        Mistake("log2 in the entropy, ln in the normaliser", "you took the entropy with log2 but divided by the "
                "natural log of the number of keys: the two logs must have the same base",
                "use the same log for both (their ratio does not depend on the base)", lambda: _guarded(h / ln2, allowed)),
        Mistake("ln in the entropy, log2 in the normaliser", "you took the entropy with the natural log but divided by "
                "log2 of the number of keys: the two logs must have the same base",
                "use the same log for both (their ratio does not depend on the base)",
                lambda: _guarded(h, allowed, torch.log2)),
        Mistake("0/0 on rows with a single allowed key", "a row with one allowed key has log(1) = 0, so H / log(1) "
                "is 0/0 = NaN", "return 0 for rows with at most one allowed key (one key: no uncertainty)",
                lambda: h / allowed.log()),
        Mistake("divided by the number of keys, not its log", "you divided H by k, the number of allowed keys; the "
                "largest entropy over k keys is log k", "divide by the log of the number of allowed keys",
                lambda: torch.where(allowed > 1, h / allowed, torch.zeros_like(h))),
        Mistake("mean over the keys instead of a sum", "you averaged −w·log w over the n_k keys (.mean(-1)) instead of "
                "summing: H is a sum over the keys", "sum over the keys: .sum(-1)",
                lambda: _guarded(h / n_k, allowed)),
        Mistake("normalised by log(k + 1)", "you divided by the log of one key more than the row may attend to",
                "divide by log(k), k the number of allowed keys", lambda: _guarded(h, allowed + 1)),
        Mistake("allowed keys counted over the queries", "you counted the allowed keys along axis −2 (per key, over "
                "the queries) instead of along each row", "count each row's allowed keys: mask.sum(-1)",
                lambda: _guarded(h, full.sum(-2)) if n_q == n_k else None),
        *_eps_mistakes(w, lambda hh: _guarded(hh, allowed)),
    ]
    if mask is not None:
        blocked = (~full).sum(-1).double()
        mistakes += [
            Mistake("normalised by all keys, not the allowed ones", "you divided by log n_k; a row that may attend "
                    "to fewer keys (causal row i sees i + 1, padding hides some) can spread over those only",
                    "divide by log(mask.sum(-1)), the number of keys each row may attend to",
                    lambda: h / math.log(n_k) if n_k > 1 else None),
            Mistake("mask polarity inverted", "you counted the keys where the mask is False; True means 'may "
                    "attend'", "count allowed keys with mask.sum(-1)", lambda: _guarded(h, blocked)),
            Mistake("mask not broadcast before counting", "you summed the mask as it was given; a mask with a "
                    "size-1 key axis, shape (…, n_q, 1), allows or blocks every key of a row, so its keys must be "
                    "counted after broadcasting it to the weights' shape",
                    "count with torch.broadcast_to(mask, weights.shape).sum(-1)",
                    lambda: _guarded(h, mask.sum(-1)) if mask.shape[-1] == 1 else None),
            Mistake("counted the nonzero weights, not the allowed keys", "you normalised by the number of keys with "
                    "a weight above 0; an allowed key can have weight 0 (it was allowed, the head chose not to "
                    "look)", "count the allowed keys from the mask: mask.sum(-1)", lambda: _guarded(h, (w > 0).sum(-1))),
        ]
    else:
        mistakes.append(Mistake("counted the nonzero weights, not the keys", "you normalised by the number of keys with "
                                "a weight above 0; without a mask every one of the n_k keys is allowed, even one the head "
                                "gives weight 0", "without a mask, divide by log n_k", lambda: _guarded(h, (w > 0).sum(-1))))
    return mistakes


def _fixed_normaliser(failure: Failure, out: torch.Tensor, case: dict) -> bool:
    """Name a normaliser that is one number c for every row (H / log c: a hard-coded number of keys)."""
    w = case["w"].to(torch.float64)
    h = ref.entropy(w)
    if tuple(out.shape) != tuple(h.shape):
        return False
    o = out.to(torch.float64)
    rows = (h > 1e-3) & torch.isfinite(o) & (o.abs() > 1e-9)
    if not rows.any():
        return False
    c = round(math.exp(float((h[rows] / o[rows]).median())))
    if not 2 <= c <= 64 or not torch.allclose(o, h / math.log(c), atol=ATOL, rtol=RTOL):
        return False
    d = failure.diagnosis
    d.summary = f"normalised by log {c}, a fixed number"
    d.cause = (f"you divided every row by log {c}; each row's own number of allowed keys belongs there (n_k = "
               f"{w.shape[-1]} here, or fewer under a mask)")
    d.fix = "divide by log(k) with k the number of allowed keys of that row: mask.sum(-1), or n_k without a mask"
    return True


@check("normalised_entropy", expects="a function normalised_entropy(weights, mask=None) returning one value per query")
def check_normalised_entropy(fn: Learner) -> str:
    cases = _cases(masks=True, extremes=True)
    run = _Run(fn, "normalised_entropy")
    for case in cases:
        out = run.call(case)
        want = ref.normalised_entropy(case["w"].to(torch.float64), case["mask"])
        simple_rows = _explain_with_simple_rows(fn, ref.normalised_entropy, "normalised_entropy")
        run.expect(out, want, case, _entropy_mistakes(case),
                   factors={"ln 2": math.log(2), **_factors(n_k=case["w"].shape[-1], n_q=case["w"].shape[-2])},
                   explain=lambda failure: _fixed_normaliser(failure, out, case) or simple_rows(failure))
    return (f"matches the reference on {len(cases)} cases: causal and padding masks (normalised by the allowed keys), "
            "exact zeros (0·log 0 = 0), a fully masked row, a single key, batches and size-1 axes")


# ============================================================================ peak weight
def _peak_mistakes(w: torch.Tensor) -> list[Mistake]:
    w = w.to(torch.float64)
    fix = "take one maximum per row, over the keys: w.amax(dim=-1)"
    whole = "you took one maximum over all the weights at once (every query and key together), not one per row"
    mistakes = [
        Mistake("maximum over the queries", "you took the maximum over axis −2 (the queries)", fix, lambda: w.amax(-2)),
        Mistake("position of the peak, not its weight", "you returned argmax, the position of the largest weight",
                "return the largest weight itself: w.amax(dim=-1)", lambda: w.argmax(-1).to(torch.float64)),
        Mistake("maximum of the whole tensor", whole, fix, lambda: w.max() * torch.ones(w.shape[:-1], dtype=torch.float64)),
        Mistake("maximum of the whole tensor", whole, fix, lambda: w.max()),
        Mistake("maximum of each matrix", "you took one maximum over the last two axes (the whole matrix) instead of "
                "one per row", fix, lambda: w.flatten(-2).amax(-1) if w.ndim > 2 else None),
        Mistake("minimum instead of maximum", "you took each row's smallest weight", fix, lambda: w.amin(-1)),
        Mistake("row sums, not the peak", "you summed each row (which gives 1)", fix, lambda: w.sum(-1)),
        Mistake("row means, not the peak", "you averaged each row (which gives 1/n_k)", fix, lambda: w.mean(-1)),
        Mistake("weight of the first key", "you returned w[..., 0], the weight on key 0, not the largest one", fix,
                lambda: w[..., 0]),
        Mistake("weight of the last key", "you returned w[..., -1], the weight on the last key, not the largest one",
                fix, lambda: w[..., -1]),
        Mistake("second-largest weight", "you took the second entry of the weights sorted in decreasing order", fix,
                lambda: w.sort(-1, descending=True).values[..., 1] if w.shape[-1] > 1 else None),
        Mistake("one maximum per batch entry", "you looped over the first axis (`for row in weights`): for one matrix "
                "that visits the rows, for a batch it visits whole matrices", fix,
                lambda: w.reshape(w.shape[0], -1).amax(-1) if w.ndim > 2 else None),
    ]
    for axis in range(w.ndim - 2):  # an axis counted from the front: the keys only for 2-D weights
        mistakes.append(Mistake(f"maximum over axis {axis}", f"you took the maximum over axis {axis}; the keys are "
                                f"the last axis, which is axis 1 only for a single matrix", fix,
                                lambda axis=axis: w.amax(axis)))
    return mistakes


def _not_the_peak(out: torch.Tensor, case: dict):
    """For an unexplained mismatch: which row's value is not its largest weight, and what it is instead."""
    def explain(failure: Failure) -> None:
        w = case["w"].to(torch.float64)
        o = out.to(torch.float64)
        if tuple(o.shape) != tuple(w.shape[:-1]):
            return
        peak = w.amax(-1)
        bad = ~torch.isclose(o, peak, atol=ATOL, rtol=RTOL)
        if not bad.any():
            return
        i = tuple(int(k) for k in bad.nonzero()[0])
        row, value = w[i], float(o[i])
        keys = [j for j in range(row.numel()) if math.isclose(float(row[j]), value, rel_tol=RTOL, abs_tol=ATOL)]
        where = f"query {i[-1]}" + (f" of batch entry {i[:-1]}" if len(i) > 1 else "")
        failure.diagnosis.summary = "not each row's largest weight"
        failure.diagnosis.cause = (f"for {where} you return {fmt(value)}, "
                                   + (f"the weight of key {keys[0]}, " if keys else "which is none of its weights, ")
                                   + f"while its largest weight is {fmt(float(peak[i]))}")
    return explain


@check("peak_weight", expects="a function peak_weight(weights) returning one value per query")
def check_peak_weight(fn: Learner) -> str:
    cases = _cases(single_key=False)
    run = _Run(fn, "peak_weight")
    for case in cases:
        out = run.call(case)
        run.expect(out, ref.peak_weight(case["w"].to(torch.float64)), case, _peak_mistakes(case["w"]),
                   explain=_not_the_peak(out, case))
    return f"matches the reference on {len(cases)} cases (exact zeros, batches, non-square, size-1 axes)"


# ============================================================================ self-attention weight
def _self_mistakes(w: torch.Tensor) -> list[Mistake]:
    w = w.to(torch.float64)
    fix = "take the main diagonal over the last two axes: w.diagonal(dim1=-2, dim2=-1)"
    return [
        Mistake("diagonal over the first two axes", "torch.diagonal(w) takes the diagonal over axes 0 and 1; for a "
                "batch of matrices it must be the last two", fix, lambda: torch.diagonal(w)),
        Mistake("diagonal below the main one", "you took the diagonal below the main one (each query's previous "
                "token); self-attention is w_ii", fix, lambda: w.diagonal(-1, -2, -1)),
        Mistake("diagonal above the main one", "you took the diagonal above the main one (each query's next token)",
                fix, lambda: w.diagonal(1, -2, -1)),
        Mistake("diagonal summed (a trace)", "you summed the diagonal; the exercise wants one value per query", fix,
                lambda: w.diagonal(dim1=-2, dim2=-1).sum(-1)),
        Mistake("row sums, not the diagonal", "you summed each row (which gives 1)", fix, lambda: w.sum(-1)),
        Mistake("anti-diagonal", "you took w[i, n − 1 − i], the anti-diagonal", fix,
                lambda: w.flip(-1).diagonal(dim1=-2, dim2=-1)),
        Mistake("column sums, not the diagonal", "you summed each column (over the queries), which is the total "
                "weight each key receives, not the weight a query puts on itself", fix, lambda: w.sum(-2)),
        Mistake("largest weight, not the diagonal", "you took each row's largest weight; the query's own position is "
                "the diagonal entry w_ii, whether or not it is the largest", fix, lambda: w.amax(-1)),
        Mistake("weight of the first key", "you returned w[..., 0], each query's weight on key 0, not on itself", fix,
                lambda: w[..., 0]),
        Mistake("weight of the last key", "you returned w[..., -1], each query's weight on the last key, not on itself",
                fix, lambda: w[..., -1]),
    ]


@check("self_attention_weight", expects="a function self_attention_weight(weights) returning one value per query")
def check_self_attention_weight(fn: Learner) -> str:
    cases = _cases(square_only=True)
    run = _Run(fn, "self_attention_weight")
    for case in cases:
        run.expect(run.call(case), ref.self_attention_weight(case["w"].to(torch.float64)), case,
                   _self_mistakes(case["w"]))
    return f"matches the reference on {len(cases)} cases (one matrix, batches of matrices, size-1 axes)"


# ============================================================================ attention distance
def _distance_mistakes(w: torch.Tensor) -> list[Mistake]:
    w = w.to(torch.float64)
    n_q, n_k = w.shape[-2], w.shape[-1]
    keys, queries = torch.arange(n_k, dtype=torch.float64), torch.arange(n_q, dtype=torch.float64)
    signed = keys[None, :] - queries[:, None]  # (n_q, n_k)
    mean_position = (w * keys).sum(-1)  # (..., n_q)
    fix = "sum the weighted distances: (w * (j − i).abs()).sum(-1), with j the key index and i the query index"
    return [
        Mistake("distance of the mean position, not the mean distance", "you computed |Σ_j w_ij·j − i|: where the "
                "average attended position lies, not how far the head looks (keys on both sides of the query cancel)",
                fix, lambda: (mean_position - queries).abs()),
        Mistake("signed distances", "you summed w_ij·(j − i) without the absolute value, so keys before and after "
                "the query cancel", fix, lambda: (w * signed).sum(-1)),
        Mistake("signed distances", "you summed w_ij·(i − j) without the absolute value, so keys before and after "
                "the query cancel", fix, lambda: -(w * signed).sum(-1)),
        Mistake("only the keys before the query counted", "you summed w_ij·(i − j) only where j ≤ i (clamped at 0): "
                "right for causal rows, but keys after the query count as |j − i| too", fix,
                lambda: (w * (-signed).clamp(min=0)).sum(-1)),
        Mistake("only the keys after the query counted", "you summed w_ij·(j − i) only where j ≥ i (clamped at 0), "
                "so keys before the query count for nothing", fix, lambda: (w * signed.clamp(min=0)).sum(-1)),
        Mistake("distance to the most-attended key only", "you used |argmax_j w_ij − i|, the distance to the peak",
                "weight every key's distance by its weight: " + fix,
                lambda: (w.argmax(-1).to(torch.float64) - queries).abs()),
        Mistake("keys counted from 1", "you counted the keys from 1 and the queries from 0 (or the reverse)",
                "count both from 0: j = torch.arange(n_k), i = torch.arange(n_q)",
                lambda: (w * (signed + 1).abs()).sum(-1)),
        Mistake("keys counted from 1", "you counted the keys from 1 and the queries from 0 (or the reverse)",
                "count both from 0: j = torch.arange(n_k), i = torch.arange(n_q)",
                lambda: (w * (signed - 1).abs()).sum(-1)),
        Mistake("queries placed at the end of the keys", "you put query i at position i + n_k − n_q (bottom-right "
                "alignment); the docstring puts query i at position i", "use i = torch.arange(n_q) as the query "
                "positions", lambda: (w * (signed - (n_k - n_q)).abs()).sum(-1) if n_k != n_q else None),
        Mistake("squared distances", "you weighted (j − i)², not |j − i|", fix, lambda: (w * signed ** 2).sum(-1)),
        Mistake("distances not weighted", "you averaged |j − i| over the keys without the weights", fix,
                lambda: signed.abs().mean(-1).expand(w.shape[:-1])),
        Mistake("divided by the number of keys", "you divided the weighted sum by n_k; the weights already sum to 1",
                fix, lambda: (w * signed.abs()).sum(-1) / n_k),
        Mistake("divided by the largest distance", "you divided the weighted sum by n_k − 1, the largest possible "
                "distance; the docstring's distance is in positions", fix,
                lambda: (w * signed.abs()).sum(-1) / (n_k - 1) if n_k > 2 else None),
        Mistake("summed over the queries", "you summed over axis −2 (the queries); each query's distances sum over "
                "its keys, axis −1", fix, lambda: (w * signed.abs()).sum(-2) if n_q == n_k else None),
        Mistake("mean attended position", "you returned Σ_j w_ij·j, the average attended position, without "
                "comparing it with the query's own position", fix, mean_position),
    ]


@check("attention_distance", expects="a function attention_distance(weights) returning one value per query")
def check_attention_distance(fn: Learner) -> str:
    cases = _cases(single_key=False)
    run = _Run(fn, "attention_distance")
    for case in cases:
        n_q, n_k = case["w"].shape[-2:]
        run.expect(run.call(case), ref.attention_distance(case["w"].to(torch.float64)), case,
                   _distance_mistakes(case["w"]), factors=_factors(**{"n_k": n_k, "(n_k − 1)": n_k - 1, "n_q": n_q}))
    return f"matches the reference on {len(cases)} cases (causal rows, two-sided rows, batches, non-square, size-1 axes)"


# ============================================================================ effective positions
def _effective_mistakes(w: torch.Tensor) -> list[Mistake]:
    w = w.to(torch.float64)
    h = ref.entropy(w)
    n_q, n_k = w.shape[-2], w.shape[-1]
    ln2 = math.log(2)
    return [
        Mistake("exp of the normalised entropy", "you exponentiated the normalised entropy", "use the entropy "
                "itself, in nats: exp(H)", lambda: ref.normalised_entropy(w).exp()),
        Mistake("weights above a threshold counted", "you counted the weights above a threshold (one definition you may "
                "meet); here effective positions are exp(H), a smooth count between 1 and n_k",
                "return exp(H) with H = −Σ_j w_ij log w_ij", lambda: (w > 1.0 / (2 * n_k)).sum(-1).to(torch.float64)),
        Mistake("weights above a threshold counted", "you counted the weights above a threshold (one definition you may "
                "meet); here effective positions are exp(H), a smooth count between 1 and n_k",
                "return exp(H) with H = −Σ_j w_ij log w_ij", lambda: (w > 1.0 / n_k).sum(-1).to(torch.float64)),
        Mistake("nonzero weights counted", "you counted the keys with a weight above 0", "return exp(H)",
                lambda: (w > 0).sum(-1).to(torch.float64)),
        Mistake("log and exp in different bases", "with H in nats (natural log), 2**H mixes bases",
                "use torch.exp(H) with the natural log, or 2**H with log2", lambda: 2.0 ** h),
        Mistake("log and exp in different bases", "you took the entropy with log2 (bits) and then exp, which mixes "
                "bases", "use torch.exp(H) with the natural log, or 2**H with log2", lambda: torch.exp(h / ln2)),
        Mistake("inverse participation ratio", "you returned 1 / Σ_j w_ij², another effective count; the exercise asks "
                "for exp(H)", "return exp(H)", lambda: 1.0 / (w ** 2).sum(-1)),
        Mistake("one over the peak weight", "you returned 1 / max_j w_ij, another effective count; the exercise asks "
                "for exp(H)", "return exp(H)", lambda: 1.0 / w.amax(-1)),
        Mistake("entropy, not its exponential", "you returned the entropy H itself", "return torch.exp(H)", h),
        Mistake("sign flipped", "you exponentiated +Σ w log w, so the result is 1/exp(H)", "H = −Σ_j w_ij log w_ij: "
                "keep the minus sign", lambda: (-h).exp()),
        Mistake("one less than exp(H)", "your result is exp(H) − 1", "return exp(H) itself: a one-hot row counts as "
                "1 position", lambda: h.exp() - 1),
        Mistake("mean over the keys instead of a sum", "you averaged −w·log w over the keys (.mean(-1)) instead of "
                "summing, so you got exp(H / n_k)", "H is a sum over the keys: .sum(-1), then exp",
                lambda: torch.exp(h / n_k)),
        Mistake("summed over the queries", "you summed −w log w over axis −2 (the queries); each query's entropy sums "
                "over its keys, axis −1", "sum over dim=-1",
                lambda: torch.exp(-torch.special.xlogy(w, w).sum(-2)) if n_q == n_k else None),
        Mistake(*_LOG0, lambda: torch.exp(-(w * w.log()).sum(-1))),
        *_eps_mistakes(w, torch.exp),
    ]


@check("effective_positions", expects="a function effective_positions(weights) returning one value per query")
def check_effective_positions(fn: Learner) -> str:
    cases = _cases(extremes=True)
    run = _Run(fn, "effective_positions")
    for case in cases:
        run.expect(run.call(case), ref.effective_positions(case["w"].to(torch.float64)), case,
                   _effective_mistakes(case["w"]),
                   explain=_explain_with_simple_rows(fn, ref.effective_positions, "effective_positions"))
    return f"matches the reference on {len(cases)} cases; between 1 (one-hot) and n_k (uniform), 0·log 0 = 0"
