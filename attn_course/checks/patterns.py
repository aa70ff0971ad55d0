"""Checks for notebook 08 (reading attention): five per-query metrics of weights (..., n_q, n_k), each judged against
:mod:`attn_course.patterns` in float64 by one :class:`~.kit.Suspects` over its :class:`~.kit.Known` rows (``make(w,
mask)``). The first case (row maxima that differ from row to row and from the matrix's maximum) sets them apart.
"""

from __future__ import annotations

import math
import re
from itertools import combinations
from typing import Callable

import torch

from .. import patterns as ref
from ..masks import causal_mask
from .boundary import Opaque
from .compare import Failure
from .core import Learner, LearnerRaised, LearnerTimedOut, check, fail, fmt, learner_error
from .kit import Known, Suspects, bool_hint, expect_unchanged, explain_raise, factors, tensor_answer

__all__ = ["check_normalised_entropy", "check_peak_weight", "check_self_attention_weight", "check_attention_distance",
           "check_effective_positions"]

ATOL, RTOL = 1e-5, 1e-4


# ============================================================================ cases
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
    """Weights to measure, the general case first; with ``masks``, the masks that made them, masks that broadcast, a
    fully masked row and allowed keys whose weight is exactly 0."""
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


def _foreign_size(message: str, shape: tuple, ran: list[tuple[int, ...]]) -> int | None:
    """A size the learner's error message names that the input cannot explain (not an axis, a product of two,
    or an axis ± 1), or an axis of an earlier input only (the code ran there): the mark of a hard-coded size."""
    dims = [int(s) for s in shape]
    explained = {1, *dims, *(d + 1 for d in dims), *(d - 1 for d in dims), *(a * b for a, b in combinations(dims, 2))}
    explained -= {int(s) for r in ran for s in r} - set(dims)
    sizes = [int(s) for s in re.findall(r"size of tensor [ab] \((\d+)\)", message)]
    return next((s for s in sizes if s not in explained), None) if len(sizes) == 2 and set(sizes) & set(dims) else None


# ============================================================================ one metric's check
def _raise_hint(exc: LearnerRaised, what: str, shape: tuple[int, ...], mask, ran: list[tuple[int, ...]]) -> dict:
    """``cause``/``fix`` for an exception on weights of ``shape``, read against the shapes that ran before."""
    if mask is not None and exc.type_name == "TypeError" and "argument" in exc.message:
        return dict(cause="your function does not take the mask as its second argument",
                    fix=f"keep the signature {what}(weights, mask=None)")
    if bool_hint(exc):
        return bool_hint(exc)
    foreign = _foreign_size(exc.message, shape, ran)  # before the shape hints: a size the input has not
    if foreign is not None:
        return dict(cause=f"the error names a size {foreign} that weights of shape {shape} do not have: a size in "
                          "your code looks hard-coded", fix="take every size from weights.shape")
    if len(shape) > 2 and ran and all(len(s) == 2 for s in ran):
        return dict(cause=f"your function ran on single matrices such as {ran[0]} but raised on {shape}, a batch of "
                          "matrices: it assumes 2-D weights",
                    fix="index from the end so that leading axes pass through: dim=-1 for the keys, dim=-2 for the "
                        "queries, weights[..., i, j]")
    if shape[-2] != shape[-1] and ran and all(s[-2] == s[-1] for s in ran):
        return dict(cause=f"your function ran on square weights but raised on {shape[-2]} queries × {shape[-1]} "
                          "keys: it uses one size for both axes",
                    fix="take n_q = weights.shape[-2] and n_k = weights.shape[-1] separately")
    return explain_raise(exc)


def _judge(fn: Learner, what: str, cases: list[dict], table: list[Known], oracle: Callable, *,
           factors_of: Callable[[int, int], dict[str, float]] | None = None,
           explain: Callable[[Failure, torch.Tensor, dict], object] | None = None) -> int:
    """One metric's check: each answer judged by one :class:`~.kit.Suspects` over ``table`` and rounded values (``explain``
    adds a measurement when nothing names a cause); the inputs unchanged. Returns how many inputs it judged."""
    rounded = Known("rounded", "rounded to whole numbers", "your values are the right ones rounded to integers "
                    "(.round(), .long(), // or an integer tensor along the way)", "keep the values as floats: no "
                    "rounding, no integer division", lambda w, mask: oracle(w, mask).round())
    suspects, ran = Suspects([*table, rounded], atol=ATOL, rtol=RTOL), []
    learner = lambda w, mask: fn(w) if mask is None else fn(w, mask)  # noqa: E731 - the mask only when there is one
    far = [] if all(c["w"].shape[-2] == c["w"].shape[-1] for c in cases) else [dict(  # a probe, beyond the cases
        name="more queries than keys (40, 24), far apart", w=_rows((40, 24), torch.Generator().manual_seed(9)), mask=None)]
    for case in [*cases, *far]:
        w, mask, shape = case["w"], case["mask"], tuple(case["w"].shape)
        tried = f"{what}(weights{', mask' if mask is not None else ''}) on {case['name']}"
        try:
            out = learner(w, mask)
        except LearnerRaised as exc:
            raise Failure(learner_error(exc, tried=tried, expected=f"one value per query, shape {shape[:-1]}",
                                        **_raise_hint(exc, what, shape, mask, ran))) from None
        if isinstance(out, Opaque) and "return_types" in out.type_name:
            fail("returned a (values, indices) pair", tried=tried, expected=f"a tensor of shape {shape[:-1]}",
                 got=f"a {out.type_name}: the maximum values and their positions",
                 cause="torch.max(w, dim=-1) returns both the values and the indices",
                 fix="return its .values (or use w.amax(dim=-1))")
        out, args = tensor_answer(out, tried=tried), (w.to(torch.float64), mask)
        want = oracle(*args)
        try:
            suspects.expect(out, want, args, tried=tried, again=learner,
                            factors=factors_of(*shape[-2:]) if factors_of else None,
                            fix="return one value per query (the input's shape without its last axis); compare your "
                                "steps with the docstring on this input",
                            axes=(["batch entries"] + [None] * (want.ndim - 2) + ["queries"])[-want.ndim:])
        except Failure as failure:
            _batch_shape(failure, out, want, ran)
            if explain is not None and not failure.diagnosis.cause:
                explain(failure, out, case)
            raise
        ran.append(shape)
    case = next(c for c in cases if c["name"].startswith("causal weights"))  # small, exact zeros, a mask for entropy
    args = (case["w"],) if case["mask"] is None else (case["w"], case["mask"])
    expect_unchanged(fn, args, call=f"{what}(weights{', mask' if len(args) > 1 else ''})", name="weights",
                     shown=case["name"], others=("mask",))
    return len(cases) + len(far)


def _batch_shape(failure: Failure, out: torch.Tensor, want: torch.Tensor, ran: list[tuple[int, ...]]) -> None:
    """Name a wrong shape on the first batch after single matrices were right: code that walks the first axis."""
    if not (failure.diagnosis.cause or out.shape == want.shape or want.dim() < 2 or not ran  # want.dim() < 2: no batch
            or any(len(s) != 2 for s in ran)):
        failure.diagnosis.cause = (f"your function gave the right values on single matrices such as {ran[0]} but a "
                                   f"result of shape {tuple(out.shape)} on a batch of matrices: it treats the first "
                                   "axis as the queries (a loop `for row in weights`, or weights[i, i], walks it)")
        failure.diagnosis.fix = "index from the end, so that leading axes pass through: dim=-1, weights[..., i, j]"


def _guarded(h: torch.Tensor, k: torch.Tensor, log=torch.log) -> torch.Tensor:
    """h / log(k) where k > 1, else 0 (the docstring's rule), in float64."""
    k = k.to(torch.float64)
    return torch.where(k > 1, h / log(k.clamp(min=2)), torch.zeros_like(h))


def _explain_with_simple_rows(fn: Learner, oracle, what: str) -> Callable[[Failure, torch.Tensor, dict], bool]:
    """An explanation in numbers a learner checks by hand: the metric on four rows whose answers are known."""
    rows = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.25] * 4, [0.5, 0.5, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]], dtype=torch.float64)
    names = ("a one-hot row", "a row uniform over 4 keys", "a row of 0.5, 0.5, 0, 0", "a row of 0.7, 0.1, 0.1, 0.1")
    num = lambda x, p=4: "NaN" if x != x else f"{x + 0.0:.{p}g}"  # noqa: E731 - (+ 0.0: no "-0")

    def explain(failure: Failure, out: torch.Tensor, case: dict) -> bool:
        try:
            got = fn(rows)
        except (LearnerRaised, LearnerTimedOut):
            return False
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (4,):
            return False
        pairs = [(n, float(g), float(e)) for n, g, e in zip(names, got.to(torch.float64), oracle(rows))]
        wrong = [(n, g, e) for n, g, e in pairs if not math.isclose(g, e, rel_tol=RTOL, abs_tol=ATOL)]
        if wrong:
            p = next((p for p in range(4, 18) if all(num(g, p) != num(e, p) for _, g, e in wrong)), 17)  # digits
            failure.diagnosis.summary = f"{wrong[0][0]} gives {num(wrong[0][1], p)}, not {num(wrong[0][2], p)}"
            failure.diagnosis.got += f"\n{what} on simple rows: " + ", ".join(
                f"{n} → {num(g, p)} (expected {num(e, p)})" for n, g, e in pairs)
        return bool(wrong)
    return explain


# ============================================================================ normalised entropy
def _full(w: torch.Tensor, mask) -> torch.Tensor:
    return torch.ones_like(w, dtype=torch.bool) if mask is None else torch.broadcast_to(mask, w.shape)


_allowed = lambda w, mask: _full(w, mask).sum(-1).double()  # noqa: E731 - (..., n_q): each row's allowed keys
_plain = lambda w: -(w * w.log()).sum(-1)  # noqa: E731 - the entropy, NaN where a weight is 0


_LOG0 = ("log(0) gives NaN", "you computed w·log(w) directly: a weight of exactly 0 gives 0·(−inf) = NaN",
         "count 0·log 0 as 0: torch.special.xlogy(w, w), or torch.where(w > 0, w * w.log(), 0.0)")
_EPS_FIX = "count 0·log 0 as 0 exactly: torch.special.xlogy(w, w) or torch.where(w > 0, w * w.log(), 0.0)"
_SIGN = ("sign flipped", "you dropped the minus sign: H = −Σ_j w_ij log w_ij is never negative", "put the minus sign back")
_BY_QUERIES = ("summed over the queries", "you summed over axis −2 (the queries); each row (one query) sums over its keys, "
               "axis −1", "sum over dim=-1")
_SQUARE = lambda w: w.shape[-2] == w.shape[-1]  # noqa: E731 - only then does a sum over the queries have the right shape


def _eps_mistakes(then: Callable[[torch.Tensor, torch.Tensor, object], torch.Tensor]) -> list[Known]:
    """An epsilon inside the log large enough to change the answer: log(w + ε) or log(clamp(w, min=ε))."""
    return [Known(f"eps_{how}_{eps:g}", f"{text} instead of log(w)", f"you took {text}: the ε guards log(0), but at "
                  f"{eps:g} it also changes the entropy of the rows with small weights", _EPS_FIX,
                  lambda w, mask, log=log: then(-(w * log(w)).sum(-1), w, mask))
            for eps in (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6)
            for how, text, log in (("add", f"log(w + {eps:g})", lambda w, eps=eps: torch.log(w + eps)),
                                   ("clamp", f"log(w.clamp(min={eps:g}))", lambda w, eps=eps: torch.log(w.clamp(min=eps))))]


ENTROPY_MISTAKES = [
    Known("log0_n_k", *_LOG0, lambda w, mask: _plain(w) / math.log(w.shape[-1]) if w.shape[-1] > 1 else None),
    Known("log0_k", *_LOG0, lambda w, mask: _plain(w) / _allowed(w, mask).log()),
    Known("log0_guarded", *_LOG0, lambda w, mask: _guarded(_plain(w), _allowed(w, mask))),
    Known("unnormalised", "entropy not normalised", "you returned the entropy H itself", "divide H by the log of the "
          "number of allowed keys (log n_k when no mask is given)", lambda w, mask: ref.entropy(w)),
    Known("by_queries", "normalised by the number of queries", "you divided by log(n_q), the number of queries; a row's "
          "largest possible entropy is the log of its number of keys (the last axis)",
          "divide by log(number of allowed keys): log n_k when no mask is given",
          lambda w, mask: ref.entropy(w) / math.log(w.shape[-2]) if w.shape[-2] > 1 else None),
    Known("sign_normalised", *_SIGN, lambda w, mask: -ref.normalised_entropy(w, mask)),
    Known("sign_entropy", *_SIGN, lambda w, mask: -ref.entropy(w)),
    Known("over_queries", *_BY_QUERIES, lambda w, mask: -torch.special.xlogy(w, w).sum(-2) / math.log(w.shape[-1])
          if _SQUARE(w) else None),
    Known("over_queries_guarded", *_BY_QUERIES, lambda w, mask: _guarded(-torch.special.xlogy(w, w).sum(-2),
                                                                        _full(w, mask).sum(-2)) if _SQUARE(w) else None),
    Known("bits", "entropy in bits, not normalised", "you computed the entropy with log2 and did not normalise it",
          "divide by log2 of the number of allowed keys (or use natural logs throughout)",
          lambda w, mask: ref.entropy(w) / math.log(2)),
    Known("log2_ln", "log2 in the entropy, ln in the normaliser", "you took the entropy with log2 but divided by the "
          "natural log of the number of keys: the two logs must have the same base", "use the same log for both (their "
          "ratio does not depend on the base)", lambda w, mask: _guarded(ref.entropy(w) / math.log(2), _allowed(w, mask))),
    Known("ln_log2", "ln in the entropy, log2 in the normaliser", "you took the entropy with the natural log but divided "
          "by log2 of the number of keys: the two logs must have the same base", "use the same log for both (their "
          "ratio does not depend on the base)", lambda w, mask: _guarded(ref.entropy(w), _allowed(w, mask), torch.log2)),
    Known("single_key_nan", "0/0 on rows with a single allowed key", "a row with one allowed key has log(1) = 0, so "
          "H / log(1) is 0/0 = NaN", "return 0 for rows with at most one allowed key (one key: no uncertainty)",
          lambda w, mask: ref.entropy(w) / _allowed(w, mask).log()),
    Known("by_k", "divided by the number of keys, not its log", "you divided H by k, the number of allowed keys; the "
          "largest entropy over k keys is log k", "divide by the log of the number of allowed keys",
          lambda w, mask: torch.where(_allowed(w, mask) > 1, ref.entropy(w) / _allowed(w, mask), 0.0)),
    Known("mean_keys", "mean over the keys instead of a sum", "you averaged −w·log w over the n_k keys (.mean(-1)) "
          "instead of summing: H is a sum over the keys", "sum over the keys: .sum(-1)",
          lambda w, mask: _guarded(ref.entropy(w) / w.shape[-1], _allowed(w, mask))),
    Known("k_plus_1", "normalised by log(k + 1)", "you divided by the log of one key more than the row may attend to",
          "divide by log(k), k the number of allowed keys", lambda w, mask: _guarded(ref.entropy(w), _allowed(w, mask) + 1)),
    Known("k_over_queries", "allowed keys counted over the queries", "you counted the allowed keys along axis −2 (per "
          "key, over the queries) instead of along each row", "count each row's allowed keys: mask.sum(-1)",
          lambda w, mask: _guarded(ref.entropy(w), _full(w, mask).sum(-2)) if _SQUARE(w) else None),
    *_eps_mistakes(lambda h, w, mask: _guarded(h, _allowed(w, mask))),
    Known("all_keys", "normalised by all keys, not the allowed ones", "you divided by log n_k; a row that may attend to "
          "fewer keys (causal row i sees i + 1, padding hides some) can spread over those only",
          "divide by log(mask.sum(-1)), the number of keys each row may attend to",
          lambda w, mask: ref.entropy(w) / math.log(w.shape[-1]) if mask is not None and w.shape[-1] > 1 else None),
    Known("mask_inverted", "mask polarity inverted", "you counted the keys where the mask is False; True means 'may "
          "attend'", "count allowed keys with mask.sum(-1)",
          lambda w, mask: _guarded(ref.entropy(w), (~_full(w, mask)).sum(-1)) if mask is not None else None),
    Known("mask_not_broadcast", "mask not broadcast before counting", "you summed the mask as it was given; a mask with "
          "a size-1 key axis, shape (…, n_q, 1), allows or blocks every key of a row, so its keys must be counted after "
          "broadcasting it to the weights' shape", "count with torch.broadcast_to(mask, weights.shape).sum(-1)",
          lambda w, mask: _guarded(ref.entropy(w), mask.sum(-1)) if mask is not None and mask.shape[-1] == 1 else None),
    Known("nonzero_masked", "counted the nonzero weights, not the allowed keys", "you normalised by the number of keys "
          "with a weight above 0; an allowed key can have weight 0 (it was allowed, the head chose not to look)",
          "count the allowed keys from the mask: mask.sum(-1)",
          lambda w, mask: _guarded(ref.entropy(w), (w > 0).sum(-1)) if mask is not None else None),
    Known("nonzero", "counted the nonzero weights, not the keys", "you normalised by the number of keys with a weight "
          "above 0; without a mask every one of the n_k keys is allowed, even one the head gives weight 0",
          "without a mask, divide by log n_k", lambda w, mask: _guarded(ref.entropy(w), (w > 0).sum(-1)) if mask is None
          else None),
]


_DIVISORS = {"1/log k": lambda k: 1 / math.log(k), "k": float, "e^k": math.exp, "log₂ k": math.log2,
             "√k": math.sqrt, "log(k + 1)": lambda k: math.log(k + 1), "log(k − 1)": lambda k: math.log(k - 1)}


def _divisor_name(d: float, k: int) -> str:
    if math.isinf(d):
        return "∞ (your value is 0)"
    name = next((n for n, f in _DIVISORS.items() if k > 2 and math.isclose(d, f(k), rel_tol=1e-4)), "")
    c = round(math.exp(d)) if d < 5 else 0
    name = name or (f"log {c}" if 2 <= c <= 64 and math.isclose(math.exp(d), c, rel_tol=1e-4) else "")
    return f"{fmt(d)}" + (f" = {name}" if name else "")


def _normaliser_by_k(failure: Failure, out: torch.Tensor, case: dict) -> bool:
    """Name the divisor D = H / value of each row when it depends only on the row's number k of allowed keys and is
    not log k (a value of 0 is D = ∞; one number log c for every k: hard-coded), the rows of zero entropy right."""
    w, mask = case["w"].to(torch.float64), case["mask"]
    h, k, o, want = ref.entropy(w), _allowed(w, mask), out.detach().to(torch.float64), ref.normalised_entropy(w, mask)
    if tuple(o.shape) != tuple(h.shape) or not torch.isfinite(o).all():
        return False
    rows = h > 1e-3  # the rows whose value tells the divisor; the others must be right
    if int(rows.sum()) < 2 or not torch.allclose(o[~rows], want[~rows], atol=ATOL, rtol=RTOL):
        return False
    found = {}
    for kk in sorted({int(v) for v in k[rows].tolist()}):
        d = h[rows & (k == kk)] / o[rows & (k == kk)]
        if not torch.allclose(d, d[:1].expand_as(d), rtol=1e-4, atol=0.0):
            return False  # not one divisor per k
        found[kk] = float(d[0])
    wrong = {kk: d for kk, d in found.items() if not math.isclose(d, math.log(kk), rel_tol=1e-4)}
    if not wrong:
        return False
    d, c = failure.diagnosis, round(math.exp(min(found.values()))) if max(found.values()) < 5 else 0
    if 2 <= c <= 64 and all(math.isclose(v, math.log(c), rel_tol=1e-4) for v in found.values()):
        d.summary = f"normalised by log {c}, a fixed number"
        d.cause = (f"you divided every row by log {c}; each row's own number of allowed keys belongs there (n_k = "
                   f"{w.shape[-1]} here, or fewer under a mask)")
    else:
        d.summary = "entropy divided by the wrong number"
        d.cause = "your value for each row is its entropy H divided by a number that depends only on its number k of " \
                  "allowed keys, but is not log k: " + "; ".join(
                      f"for rows with k = {kk} allowed keys, {_divisor_name(v, kk)} instead of log {kk} = "
                      f"{fmt(math.log(kk))}" for kk, v in wrong.items())
    d.fix = "divide each row's entropy by log k, k its number of allowed keys (mask.sum(-1), or n_k without a mask)"
    return True


def _few_keys_rows(failure: Failure, out: torch.Tensor, case: dict) -> bool:
    """Name a value other than 0 on exactly the rows with at most one allowed key, every other row right."""
    w, mask = case["w"].to(torch.float64), case["mask"]
    o, want, k = out.detach().to(torch.float64), ref.normalised_entropy(w, mask), _allowed(w, mask)
    bad = ~torch.isclose(o, want, atol=ATOL, rtol=RTOL) if o.shape == want.shape else None
    if bad is None or not bad.any() or (bad & (k > 1)).any():
        return False
    failure.diagnosis.cause = (f"your value is {' or '.join(sorted({fmt(float(v)) for v in o[bad][:4]}))} on the rows "
                               "with at most one allowed key (a single key, or a fully masked row), where the "
                               "docstring gives 0: one key leaves no uncertainty; every other row is right")
    failure.diagnosis.fix = "return 0 for the rows with at most one allowed key (torch.where(k > 1, H / log k, 0))"
    return True


def _zero_rows(failure: Failure, out: torch.Tensor, case: dict) -> bool:
    """Name the rows that are 0 where the answer is positive (a value the metric takes only for one-hot rows or rows
    with at most one allowed key)."""
    w, mask = case["w"].to(torch.float64), case["mask"]
    o, want = out.detach().to(torch.float64), ref.normalised_entropy(w, mask)
    if tuple(o.shape) != tuple(want.shape):
        return False
    zero = (o.abs() <= 1e-12) & (want > 1e-3)
    if not zero.any():
        return False
    where = [tuple(int(i) for i in idx) for idx in zero.nonzero()[:4]]
    failure.diagnosis.cause = (f"your value is 0 at index {', '.join(map(str, where))}" + ("…" if int(zero.sum()) > 4
                               else "") + f" (the last index is the query), where {fmt(float(want[where[0]]))} is "
                               "expected there: a row's normalised entropy is 0 only when its weights are one-hot or "
                               "it has at most one allowed key")
    return True


@check("normalised_entropy", expects="a function normalised_entropy(weights, mask=None) returning one value per query")
def check_normalised_entropy(fn: Learner) -> str:
    cases = _cases(masks=True, extremes=True)
    simple_rows = _explain_with_simple_rows(fn, ref.normalised_entropy, "normalised_entropy")

    def explain(failure: Failure, out: torch.Tensor, case: dict) -> None:
        if not _normaliser_by_k(failure, out, case) and not _few_keys_rows(failure, out, case):
            simple_rows(failure, out, case)  # a summary in numbers a learner checks by hand…
            _zero_rows(failure, out, case)  # … and where the values are 0 that should not be

    n = _judge(fn, "normalised_entropy", cases, ENTROPY_MISTAKES, ref.normalised_entropy, explain=explain,
               factors_of=lambda n_q, n_k: {"ln 2": math.log(2), **factors(n_k=n_k, n_q=n_q)})
    return (f"matches the reference on {n} cases: causal and padding masks (normalised by the allowed keys), "
            "exact zeros (0·log 0 = 0), a fully masked row, a single key, batches and size-1 axes")


# ============================================================================ peak weight
_PEAK_FIX = "take one maximum per row, over the keys: w.amax(dim=-1)"
_WHOLE = "you took one maximum over all the weights at once (every query and key together), not one per row"

PEAK_MISTAKES = [
    Known("over_queries", "maximum over the queries", "you took the maximum over axis −2 (the queries)", _PEAK_FIX,
          lambda w, mask: w.amax(-2)),
    Known("argmax", "position of the peak, not its weight", "you returned argmax, the position of the largest weight",
          "return the largest weight itself: w.amax(dim=-1)", lambda w, mask: w.argmax(-1).to(torch.float64)),
    Known("whole_expanded", "maximum of the whole tensor", _WHOLE, _PEAK_FIX,
          lambda w, mask: w.max() * torch.ones(w.shape[:-1], dtype=torch.float64)),
    Known("whole", "maximum of the whole tensor", _WHOLE, _PEAK_FIX, lambda w, mask: w.max()),
    Known("matrix", "maximum of each matrix", "you took one maximum over the last two axes (the whole matrix) instead "
          "of one per row", _PEAK_FIX, lambda w, mask: w.flatten(-2).amax(-1) if w.ndim > 2 else None),
    Known("min", "minimum instead of maximum", "you took each row's smallest weight", _PEAK_FIX, lambda w, m: w.amin(-1)),
    Known("sum", "row sums, not the peak", "you summed each row (which gives 1)", _PEAK_FIX, lambda w, mask: w.sum(-1)),
    Known("mean", "row means, not the peak", "you averaged each row (which gives 1/n_k)", _PEAK_FIX,
          lambda w, mask: w.mean(-1)),
    Known("first", "weight of the first key", "you returned w[..., 0], the weight on key 0, not the largest one",
          _PEAK_FIX, lambda w, mask: w[..., 0]),
    Known("last", "weight of the last key", "you returned w[..., -1], the weight on the last key, not the largest one",
          _PEAK_FIX, lambda w, mask: w[..., -1]),
    Known("second", "second-largest weight", "you took the second entry of the weights sorted in decreasing order",
          _PEAK_FIX, lambda w, mask: w.sort(-1, descending=True).values[..., 1] if w.shape[-1] > 1 else None),
    Known("per_batch_entry", "one maximum per batch entry", "you looped over the first axis (`for row in weights`): "
          "for one matrix that visits the rows, for a batch it visits whole matrices", _PEAK_FIX,
          lambda w, mask: w.reshape(w.shape[0], -1).amax(-1) if w.ndim > 2 else None),
    *(Known(f"axis_{axis}", f"maximum over axis {axis}", f"you took the maximum over axis {axis}; the keys are the last "
            "axis, which is axis 1 only for a single matrix", _PEAK_FIX,
            lambda w, mask, axis=axis: w.amax(axis) if axis < w.ndim - 2 else None) for axis in (0, 1)),
]


def _not_the_peak(failure: Failure, out: torch.Tensor, case: dict) -> None:
    """For an unexplained mismatch: which row's value is not its largest weight, and what it is instead."""
    w, o = case["w"].to(torch.float64), out.to(torch.float64)
    if tuple(o.shape) != tuple(w.shape[:-1]):
        return
    peak = w.amax(-1)  # the oracle: a row is off, as the comparison at this tolerance has just found
    i = tuple(int(k) for k in (~torch.isclose(o, peak, atol=ATOL, rtol=RTOL)).nonzero()[0])
    row, value = w[i], float(o[i])
    keys = [j for j in range(row.numel()) if math.isclose(float(row[j]), value, rel_tol=RTOL, abs_tol=ATOL)]
    where = f"query {i[-1]}" + (f" of batch entry {i[:-1]}" if len(i) > 1 else "")
    failure.diagnosis.summary = "not each row's largest weight"
    failure.diagnosis.cause = (f"for {where} you return {fmt(value)}, "
                               + (f"the weight of key {keys[0]}, " if keys else "which is none of its weights, ")
                               + f"while its largest weight is {fmt(float(peak[i]))}")


@check("peak_weight", expects="a function peak_weight(weights) returning one value per query")
def check_peak_weight(fn: Learner) -> str:
    n = _judge(fn, "peak_weight", _cases(single_key=False), PEAK_MISTAKES, lambda w, mask: ref.peak_weight(w),
               explain=_not_the_peak)
    return f"matches the reference on {n} cases (exact zeros, batches, non-square, size-1 axes)"


# ============================================================================ self-attention weight
_DIAG_FIX = "take the main diagonal over the last two axes: w.diagonal(dim1=-2, dim2=-1)"

SELF_MISTAKES = [
    Known("first_axes", "diagonal over the first two axes", "torch.diagonal(w) takes the diagonal over axes 0 and 1; "
          "for a batch of matrices it must be the last two", _DIAG_FIX, lambda w, mask: torch.diagonal(w)),
    Known("below", "diagonal below the main one", "you took the diagonal below the main one (each query's previous "
          "token); self-attention is w_ii", _DIAG_FIX, lambda w, mask: w.diagonal(-1, -2, -1)),
    Known("above", "diagonal above the main one", "you took the diagonal above the main one (each query's next token)",
          _DIAG_FIX, lambda w, mask: w.diagonal(1, -2, -1)),
    Known("trace", "diagonal summed (a trace)", "you summed the diagonal; the exercise wants one value per query",
          _DIAG_FIX, lambda w, mask: w.diagonal(dim1=-2, dim2=-1).sum(-1)),
    Known("row_sums", "row sums, not the diagonal", "you summed each row (which gives 1)", _DIAG_FIX,
          lambda w, mask: w.sum(-1)),
    Known("anti", "anti-diagonal", "you took w[i, n − 1 − i], the anti-diagonal", _DIAG_FIX,
          lambda w, mask: w.flip(-1).diagonal(dim1=-2, dim2=-1)),
    Known("anti_up", "anti-diagonal", "you took w[n − 1 − i, i], the anti-diagonal read from the bottom row",
          _DIAG_FIX, lambda w, mask: w.flip(-2).diagonal(dim1=-2, dim2=-1)),
    Known("column_sums", "column sums, not the diagonal", "you summed each column (over the queries), which is the "
          "total weight each key receives, not the weight a query puts on itself", _DIAG_FIX, lambda w, mask: w.sum(-2)),
    Known("peak", "largest weight, not the diagonal", "you took each row's largest weight; the query's own position "
          "is the diagonal entry w_ii, whether or not it is the largest", _DIAG_FIX, lambda w, mask: w.amax(-1)),
    Known("first", "weight of the first key", "you returned w[..., 0], each query's weight on key 0, not on itself",
          _DIAG_FIX, lambda w, mask: w[..., 0]),
    Known("last", "weight of the last key", "you returned w[..., -1], each query's weight on the last key, not on "
          "itself", _DIAG_FIX, lambda w, mask: w[..., -1]),
]


@check("self_attention_weight", expects="a function self_attention_weight(weights) returning one value per query")
def check_self_attention_weight(fn: Learner) -> str:
    cases = _cases(square_only=True)
    _judge(fn, "self_attention_weight", cases, SELF_MISTAKES, lambda w, mask: ref.self_attention_weight(w))
    return f"matches the reference on {len(cases)} cases (one matrix, batches of matrices, size-1 axes)"


# ============================================================================ attention distance
def _offsets(w: torch.Tensor) -> torch.Tensor:
    """j − i for query i and key j: (n_q, n_k), float64."""
    return torch.arange(w.shape[-1], dtype=torch.float64)[None, :] - torch.arange(w.shape[-2], dtype=torch.float64)[:, None]


def _mean_position(w: torch.Tensor) -> torch.Tensor:
    return (w * torch.arange(w.shape[-1], dtype=torch.float64)).sum(-1)  # (..., n_q): Σ_j w_ij·j


_DIST_FIX = "sum the weighted distances: (w * (j − i).abs()).sum(-1), with j the key index and i the query index"
_QUERIES = lambda w: torch.arange(w.shape[-2], dtype=torch.float64)  # noqa: E731 - i, the query positions
_SIGNED = ("signed distances", "you summed w_ij·({}) without the absolute value, so keys before and after the query "
           "cancel", _DIST_FIX)
_FROM_1 = ("keys counted from 1", "you counted the keys from 1 and the queries from 0 (or the reverse)",
           "count both from 0: j = torch.arange(n_k), i = torch.arange(n_q)")

DISTANCE_MISTAKES = [
    Known("mean_position_distance", "distance of the mean position, not the mean distance", "you computed "
          "|Σ_j w_ij·j − i|: where the average attended position lies, not how far the head looks (keys on both sides "
          "of the query cancel)", _DIST_FIX, lambda w, mask: (_mean_position(w) - _QUERIES(w)).abs()),
    Known("signed", _SIGNED[0], _SIGNED[1].format("j − i"), _SIGNED[2], lambda w, mask: (w * _offsets(w)).sum(-1)),
    Known("signed_back", _SIGNED[0], _SIGNED[1].format("i − j"), _SIGNED[2], lambda w, mask: -(w * _offsets(w)).sum(-1)),
    Known("before_only", "only the keys before the query counted", "you summed w_ij·(i − j) only where j ≤ i (clamped "
          "at 0): right for causal rows, but keys after the query count as |j − i| too", _DIST_FIX,
          lambda w, mask: (w * (-_offsets(w)).clamp(min=0)).sum(-1)),
    Known("after_only", "only the keys after the query counted", "you summed w_ij·(j − i) only where j ≥ i (clamped at "
          "0), so keys before the query count for nothing", _DIST_FIX,
          lambda w, mask: (w * _offsets(w).clamp(min=0)).sum(-1)),
    Known("to_peak", "distance to the most-attended key only", "you used |argmax_j w_ij − i|, the distance to the peak",
          "weight every key's distance by its weight: " + _DIST_FIX,
          lambda w, mask: (w.argmax(-1).to(torch.float64) - _QUERIES(w)).abs()),
    Known("from_1_keys", *_FROM_1, lambda w, mask: (w * (_offsets(w) + 1).abs()).sum(-1)),
    Known("from_1_queries", *_FROM_1, lambda w, mask: (w * (_offsets(w) - 1).abs()).sum(-1)),
    Known("bottom_right", "queries placed at the end of the keys", "you put query i at position i + n_k − n_q "
          "(bottom-right alignment); the docstring puts query i at position i", "use i = torch.arange(n_q) as the "
          "query positions", lambda w, mask: (w * (_offsets(w) - (w.shape[-1] - w.shape[-2])).abs()).sum(-1)
          if not _SQUARE(w) else None),
    Known("squared", "squared distances", "you weighted (j − i)², not |j − i|", _DIST_FIX,
          lambda w, mask: (w * _offsets(w) ** 2).sum(-1)),
    Known("unweighted_mean", "distances not weighted", "you averaged |j − i| over the keys without the weights",
          _DIST_FIX, lambda w, mask: _offsets(w).abs().mean(-1).expand(w.shape[:-1])),
    Known("unweighted_sum", "distances not weighted", "you summed |j − i| over the keys without the weights",
          _DIST_FIX, lambda w, mask: _offsets(w).abs().sum(-1).expand(w.shape[:-1])),
    Known("added", "positions added, not subtracted", "your distances are |j + i|: you added the query's position to "
          "the key's instead of subtracting it", _DIST_FIX, lambda w, mask: (w * (_offsets(w) + 2 * _QUERIES(w)[:, None])
                                                                             .abs()).sum(-1)),
    Known("own_position", "each query's own position, not a distance", "your value for query i is i, its own position: "
          "the key positions j are missing from your distances (|i| instead of |j − i|)", _DIST_FIX,
          lambda w, mask: _QUERIES(w).expand(w.shape[:-1])),
    Known("by_n_k", "divided by the number of keys", "you divided the weighted sum by n_k; the weights already sum to "
          "1", _DIST_FIX, lambda w, mask: (w * _offsets(w).abs()).sum(-1) / w.shape[-1]),
    Known("by_largest", "divided by the largest distance", "you divided the weighted sum by n_k − 1, the largest "
          "possible distance; the docstring's distance is in positions", _DIST_FIX,
          lambda w, mask: (w * _offsets(w).abs()).sum(-1) / (w.shape[-1] - 1) if w.shape[-1] > 2 else None),
    Known("over_queries", "summed over the queries", "you summed over axis −2 (the queries); each query's distances "
          "sum over its keys, axis −1", _DIST_FIX,
          lambda w, mask: (w * _offsets(w).abs()).sum(-2) if _SQUARE(w) else None),
    Known("mean_position", "mean attended position", "you returned Σ_j w_ij·j, the average attended position, without "
          "comparing it with the query's own position", _DIST_FIX, lambda w, mask: _mean_position(w)),
]


@check("attention_distance", expects="a function attention_distance(weights) returning one value per query")
def check_attention_distance(fn: Learner) -> str:
    n = _judge(fn, "attention_distance", _cases(single_key=False), DISTANCE_MISTAKES,
               lambda w, mask: ref.attention_distance(w),
               factors_of=lambda n_q, n_k: factors(**{"n_k": n_k, "(n_k − 1)": n_k - 1, "n_q": n_q}))
    return f"matches the reference on {n} cases (causal rows, two-sided rows, batches, non-square, size-1 axes)"


# ============================================================================ effective positions
_THRESHOLD = ("weights above a threshold counted", "you counted the weights above a threshold (one definition you may "
              "meet); here effective positions are exp(H), a smooth count between 1 and n_k",
              "return exp(H) with H = −Σ_j w_ij log w_ij")
_BASES = ("log and exp in different bases", "use torch.exp(H) with the natural log, or 2**H with log2")

EFFECTIVE_MISTAKES = [
    Known("exp_normalised", "exp of the normalised entropy", "you exponentiated the normalised entropy", "use the "
          "entropy itself, in nats: exp(H)", lambda w, mask: ref.normalised_entropy(w).exp()),
    Known("half_uniform", *_THRESHOLD, lambda w, mask: (w > 1.0 / (2 * w.shape[-1])).sum(-1).to(torch.float64)),
    Known("uniform", *_THRESHOLD, lambda w, mask: (w > 1.0 / w.shape[-1]).sum(-1).to(torch.float64)),
    Known("nonzero", "nonzero weights counted", "you counted the keys with a weight above 0", "return exp(H)",
          lambda w, mask: (w > 0).sum(-1).to(torch.float64)),
    Known("two_to_h", _BASES[0], "with H in nats (natural log), 2**H mixes bases", _BASES[1],
          lambda w, mask: 2.0 ** ref.entropy(w)),
    Known("bits_exp", _BASES[0], "you took the entropy with log2 (bits) and then exp, which mixes bases", _BASES[1],
          lambda w, mask: torch.exp(ref.entropy(w) / math.log(2))),
    Known("participation", "inverse participation ratio", "you returned 1 / Σ_j w_ij², another effective count; the "
          "exercise asks for exp(H)", "return exp(H)", lambda w, mask: 1.0 / (w ** 2).sum(-1)),
    Known("one_over_peak", "one over the peak weight", "you returned 1 / max_j w_ij, another effective count; the "
          "exercise asks for exp(H)", "return exp(H)", lambda w, mask: 1.0 / w.amax(-1)),
    Known("entropy", "entropy, not its exponential", "you returned the entropy H itself", "return torch.exp(H)",
          lambda w, mask: ref.entropy(w)),
    Known("sign", "sign flipped", "you exponentiated +Σ w log w, so the result is 1/exp(H)", "H = −Σ_j w_ij log w_ij: "
          "keep the minus sign", lambda w, mask: (-ref.entropy(w)).exp()),
    Known("minus_one", "one less than exp(H)", "your result is exp(H) − 1", "return exp(H) itself: a one-hot row counts "
          "as 1 position", lambda w, mask: ref.entropy(w).exp() - 1),
    Known("mean_keys", "mean over the keys instead of a sum", "you averaged −w·log w over the keys (.mean(-1)) instead "
          "of summing, so you got exp(H / n_k)", "H is a sum over the keys: .sum(-1), then exp",
          lambda w, mask: torch.exp(ref.entropy(w) / w.shape[-1])),
    Known("over_queries", "summed over the queries", "you summed −w log w over axis −2 (the queries); each query's "
          "entropy sums over its keys, axis −1", "sum over dim=-1",
          lambda w, mask: torch.exp(-torch.special.xlogy(w, w).sum(-2)) if _SQUARE(w) else None),
    Known("log0", *_LOG0, lambda w, mask: torch.exp(_plain(w))),
    *_eps_mistakes(lambda h, w, mask: torch.exp(h)),
]


@check("effective_positions", expects="a function effective_positions(weights) returning one value per query")
def check_effective_positions(fn: Learner) -> str:
    n = _judge(fn, "effective_positions", _cases(extremes=True), EFFECTIVE_MISTAKES,
               lambda w, mask: ref.effective_positions(w),
               explain=_explain_with_simple_rows(fn, ref.effective_positions, "effective_positions"))
    return f"matches the reference on {n} cases; between 1 (one-hot) and n_k (uniform), 0·log 0 = 0"
