"""Checks for notebook 01 (queries, keys and the dot product): each runs the learner's function on its cases with the
kit's :func:`~.kit.judge_cases` over the check's table of known mistakes; what only this notebook measures is the right
scores in another order (:func:`_wrong_order`).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from .boundary import LearnerRaised
from .compare import Failure, same
from .core import Learner, check, fail
from .kit import CALL_WITH, fits
from .kit import TensorCase as Case
from .kit import expect_signature, fresh_values, judge_cases, known_rows, preview, product_rows

__all__ = ["check_query_scores_loop", "check_query_scores", "check_score_matrix", "check_cosine_scores"]

# ============================================================================ cases
#: What a case tag means, for "wrong only on …" diagnoses: (short form for the summary, long form).
TAGS = {"batched": ("batched input", "batched input (leading axes before the last two)"),
        "4-D": ("4-D input", "input with 4 or more axes (batch and heads)"),
        "size-1": ("size-1 axes", "inputs with an axis of size 1"), "float64": ("float64", "float64 input"),
        "float32": ("float32", "float32 input"), "large": ("large values", "large values (entries near 1000)"),
        "zero": ("zero vectors", "a zero vector"), "eps": ("a given eps", "an eps other than the default"),
        "square": ("square input", "square matrices"), "one key": ("one key", "a single key")}


def random_tensor(*shape: int, seed: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    """Seeded N(0, scale²) entries (drawn in float64, so a case's values do not depend on its dtype)."""
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)


def score_magnitude(Q: torch.Tensor, K: torch.Tensor) -> float:
    """Largest Σᵢ|qᵢ kᵢ| over all pairs: what rounding errors in a dot product scale with."""
    Qa, Ka = Q.abs().to(torch.float64), K.abs().to(torch.float64)
    return float((Ka @ Qa).max()) if Q.ndim == 1 else float((Qa @ Ka.transpose(-2, -1)).max())


def table(*rows: tuple) -> list:
    """A check's table: rows (key, summary, cause, fix, *ways), and the slip every check shares."""
    return known_rows(*rows, ("from-numpy", "torch.from_numpy on a tensor", "torch.from_numpy takes a NumPy array, and "
                              "the inputs are already torch tensors", "use the tensors as they are",
                              lambda x, *rest: torch.from_numpy(x)))


def judge(fn: Learner, cases: Sequence[Case], rows: list, **words) -> None:
    """:func:`~.kit.judge_cases` with this notebook's tags, naming a 1-D result of the right scores in another order."""
    def in_order(i: int, values: list, tried: str) -> None:
        a, e, tol = values[i].detach().double(), cases[i].expected, cases[i].atol
        if a.ndim == 1 and a.numel() > 1 and values[i].is_floating_point() and not torch.isnan(a).any() and \
                same(a.sort().values, e.sort().values, atol=tol, rtol=1e-5):
            summary, cause = _wrong_order(a, e, tol)
            fail(summary, tried=tried, got=preview(values[i]), expected=preview(e), cause=cause,
                 fix="put the score of K[j] at position j")

    judge_cases(fn, cases, rows, tags=TAGS, measure=in_order, **words)


def _wrong_order(a: torch.Tensor, e: torch.Tensor, tol: float) -> tuple[str, str]:
    """(summary, cause) for a 1-D result that holds the right scores in another order."""
    close = lambda b: same(a, b, atol=tol, rtol=1e-5)  # noqa: E731 - a is these scores in order b
    for how in ("ascending", "descending"):
        if close(e.sort(descending=how == "descending").values):
            return (f"right scores, sorted in {how} order", f"every score is right but your result is sorted ({how}): "
                    "entry j must be the score of key j, in the keys' order; a sort (torch.sort, sorted, .sort(), "
                    "topk) the docstring does not have")
    if close(e.flip(0)):
        return ("right scores in reverse order", "every score is right but in reverse order: your index counts down "
                "from the end (K[-1 - j], or a flip)")
    for shift in range(1, a.numel()):
        if close(e.roll(-shift)) or close(e.roll(shift)):
            return ("right scores, shifted", f"every score is right but shifted by {shift} place"
                    f"{'s' if shift > 1 else ''}, wrapping round: an index off by a constant (K[j + 1] or K[j - 1] "
                    "for K[j])")
    return ("right scores in the wrong order", "every score is right but they are not in the keys' order: entry j "
            "must be the score of key j (an index that picks the wrong key)")


# ============================================================================ one query against every key
def _random_cases(seed: int, oracle: Callable, specs: list[tuple]) -> list[Case]:
    """Cases of seeded random queries and keys, from specs (label, q's shape, K's shape, dtype, scale, tags)."""
    cases = []
    for n, (label, qs, ks, dtype, scale, tags) in enumerate(specs):
        q = random_tensor(*qs, seed=seed + 2 * n, dtype=dtype, scale=scale)
        K = random_tensor(*ks, seed=seed + 2 * n + 1, dtype=dtype, scale=scale)
        cases.append(Case(label, (q, K), oracle(q.double(), K.double()), tags=frozenset(tags),
                          magnitude=score_magnitude(q, K)))
    return cases


def _one_query_cases() -> list[Case]:
    f32, f64 = torch.float32, torch.float64
    return _random_cases(100, lambda q, K: K @ q, [
        ("q of size 3 and 6 keys (K shape (6, 3)), float32", (3,), (6, 3), f32, 1.0, {"float32"}),
        ("q of size 5 and 2 keys (K shape (2, 5)), float64", (5,), (2, 5), f64, 1.0, {"float64"}),
        ("q of size 4 and 4 keys (square K), float32", (4,), (4, 4), f32, 1.0, {"float32", "square"}),
        ("one key (K shape (1, 6)), float64", (6,), (1, 6), f64, 1.0, {"float64", "size-1", "one key"}),
        ("vectors of size 1 (q shape (1,), K shape (5, 1)), float32", (1,), (5, 1), f32, 1.0, {"float32", "size-1"}),
        ("entries near 1000 (q size 8, K shape (3, 8)), float32", (8,), (3, 8), f32, 1000.0, {"float32", "large"}),
    ])


def _loop(q: torch.Tensor, K: torch.Tensor, keys) -> torch.Tensor:
    return torch.stack([(q * K[j]).sum() for j in keys])


def _first_entries(m: int, key_first: bool = False) -> Callable:
    """Scores whose sum over a vector's entries runs over range(m), a length typed in: an IndexError past the end of
    a shorter vector (q[i] first, or K[j, i] first: the message names dimension 0 or 1), m products of a longer one."""
    def product(q: torch.Tensor, K: torch.Tensor, j: int, i: int) -> torch.Tensor:
        return K[j, i] * q[i] if key_first else q[i] * K[j, i]

    return lambda q, K: torch.stack([sum(product(q, K, j, i) for i in range(m)) for j in range(len(K))])


#: The longest vector of the one-query cases: a length typed in above it is past every vector.
_LONGEST = max(case.args[0].shape[0] for case in _one_query_cases())


def _typed_in_lengths() -> list[tuple]:
    """A vector length typed in (range(m), q[:m]) where len(q) belongs, for every m that a case tells apart; a loop
    and a slice that stop at m give the same numbers wherever both run, so they share their words."""
    fix = "run over every entry: for i in range(len(q)), or (q * key).sum()"
    rows = [(f"typed-length-{m}", f"the vector length typed in as {m}", f"your sum over a vector's entries stops "
             f"after {m} of them (range({m}), or q[:{m}]: a length typed in), not len(q), so a longer vector loses its "
             "last products (and with range, a shorter one runs past its end)", fix, _first_entries(m),
             _first_entries(m, key_first=True), *([lambda q, K, m=m: K[:, :m] @ q[:m]] if m < _LONGEST else []))
            for m in range(2, _LONGEST + 1)]
    return rows + [("typed-length-long", "a vector length typed in", "your sum over a vector's entries runs a fixed "
                    "number of times (a length typed in, such as range(10)), more than this vector has, so it runs "
                    "past its end", fix, _first_entries(_LONGEST + 1), _first_entries(_LONGEST + 1, key_first=True))]


def _mT(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    return Q @ K.transpose(-2, -1)


def _unit(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(eps)


def _slips(scores: Callable) -> list[tuple]:
    """Mistakes about what a score is, for one query (``scores(q, K) = K @ q``) and for a matrix (Q Kᵀ)."""
    return [
        ("cosine", "cosine similarity instead of the dot product", "you divided by the vectors' lengths: that is "
         "cosine similarity (exercise 4); a score is the plain dot product", "leave out the division by the norms",
         lambda q, K: scores(_unit(q), _unit(K))),
        ("mean", "averaged the products instead of adding them", "you took the mean of the d products (or divided the "
         "sum by d)", "add the products: (K * q).sum(dim=-1), or Q @ K.transpose(-2, -1)",
         lambda q, K: scores(q, K) / q.shape[-1]),
        ("sqrt-d", "divided by √d", "you divided by √d: that is notebook 02's scaled score; this exercise asks for the "
         "plain dot product", "leave out the division", lambda q, K: scores(q, K) / math.sqrt(q.shape[-1])),
        ("softmax", "softmax of the scores", "you turned the scores into weights with a softmax (notebook 03)",
         "return the scores themselves", lambda q, K: torch.softmax(scores(q, K), -1)),
        ("abs", "absolute values of the scores", "you took the absolute value (or the square) of each score; a dot "
         "product keeps its sign", "return the dot products themselves", lambda q, K: scores(q, K).abs(),
         lambda q, K: scores(q, K) ** 2),
        ("skip-last", "the sum skips the last entry of each vector", "your sum over a vector's entries stops one early "
         "(range(d - 1), or a slice :-1), so the last product is missing", "add all d products",
         lambda q, K: scores(q[..., :-1], K[..., :-1])),
        ("skip-first", "the sum skips the first entry of each vector", "your sum over a vector's entries starts at 1, "
         "so the first product is missing", "add all d products, starting at entry 0",
         lambda q, K: scores(q[..., 1:], K[..., 1:])),
    ]


_ROW_FIX = "use K @ q, or (K * q).sum(dim=-1): row j of K is key j"
ONE_QUERY_TABLE = table(
    *_slips(lambda q, K: K @ q),
    ("columns", "q multiplied by the columns of K", "you paired q with the columns of K (q @ K, K.T @ q or an einsum "
     "like 'd,dn->n'), but each key is a *row* of K", _ROW_FIX, lambda q, K: q @ K, lambda q, K: K.T @ q,
     lambda q, K: torch.mv(K.T, q), lambda q, K: torch.einsum("d,dn->n", q, K), lambda q, K: torch.einsum("i,ij->j", q, K)),
    ("sum-axis-0", "summed over the keys (axis 0)", "you added up the products over axis 0, down the keys (a sum with "
     "dim=0, or an einsum such as 'd,nd->d' that keeps the entry index), so each number mixes every key",
     "sum over the vector entries, the last axis: (K * q).sum(dim=-1), or torch.einsum('d,nd->n', q, K)",
     lambda q, K: (K * q).sum(0)),
    ("not-added", "products not added up", "you multiplied q and K entry by entry but did not add the products of each "
     "key", "add them: (K * q).sum(dim=-1)", lambda q, K: K * q),
    ("sum-all", "summed over everything", "you added up every product of every key, which leaves one number", "sum only "
     "over the last axis, (K * q).sum(dim=-1), so that one score per key remains", lambda q, K: (K * q).sum(),
     lambda q, K: (K * q).sum().reshape(1)),
    ("column", "a column (n_k, 1) instead of a vector", "the right scores with an extra axis of size 1 at the end: q used "
     "as a column (q[:, None], q.unsqueeze(-1)), keepdim=True, or an unsqueeze(-1) of the result",
     "return shape (n_k,): K @ q, or .squeeze(-1) on the column", lambda q, K: K @ q[:, None]),
    ("row", "a row (1, n_k) instead of a vector", "the right scores with an extra axis of size 1 in front: q used as a "
     "row (q[None] @ K.T), or an unsqueeze(0) of the result", "return shape (n_k,): K @ q, or .squeeze(0) on the row",
     lambda q, K: q[None] @ K.T),
    ("squeeze", ".squeeze() removed the key axis", ".squeeze() removes every axis of size 1, so with a single key your "
     "result loses the key axis", "squeeze only the axis you added: .squeeze(-1), or write K @ q",
     lambda q, K: (K @ q[:, None]).squeeze()),
    ("distance", "a distance instead of a dot product", "you measured the distance between q and each key, not their "
     "dot product", "use the dot product: K @ q", lambda q, K: (K - q).norm(dim=-1), lambda q, K: ((K - q) ** 2).sum(-1),
     lambda q, K: -((K - q) ** 2).sum(-1), lambda q, K: -(K - q).norm(dim=-1)),
    ("divided", "q divided by the keys, not multiplied", "your products are q[i] / K[j, i]: a division where the dot "
     "product multiplies the entries", "multiply the entries, then add: (q * K[j]).sum()", lambda q, K: (q / K).sum(-1)),
    ("loop-short", "the loop stops one key early", "your loop runs over range(len(K) - 1) (or stops early), so the last "
     "key gets no score", "loop over every key: for j in range(K.shape[0])", lambda q, K: _loop(q, K, range(len(K) - 1))),
    ("loop-from-1", "the loop skips the first key", "your loop starts at 1, so key 0 gets no score", "loop over every "
     "key: for j in range(K.shape[0]) starts at 0", lambda q, K: _loop(q, K, range(1, len(K)))),
    ("loop-entries", "the loop runs over the vector's entries", "your loop runs over range(len(q)) (d steps) instead of "
     "over the keys (K.shape[0] steps)", "loop over the keys: for j in range(K.shape[0]), or for key in K",
     lambda q, K: _loop(q, K, range(q.shape[0]))),
    ("return-in-loop", "returned inside the loop", "your `return` is indented inside the loop, so the function returns "
     "after the first key", "dedent the return so it runs after the loop", lambda q, K: _loop(q, K, range(1)),
     lambda q, K: (q * K[0]).sum()),
    ("last-only", "only the last key's score kept", "each pass of your loop overwrites the score of the key before "
     "(score = … instead of scores.append(…)), so only the last key's score is left", "collect every key's score: "
     "scores.append(…) in the loop, then torch.stack(scores)", lambda q, K: _loop(q, K, range(len(K) - 1, len(K))),
     lambda q, K: (q * K[-1]).sum()),
    ("running-total", "a running total instead of one score per key", "your loop keeps adding to the same total, so "
     "entry j holds the sum of the scores of keys 0 to j (the total is never reset for a new key)", "start each key's "
     "score from 0: compute (q * key).sum() afresh for every key", lambda q, K: torch.cumsum(K @ q, 0)),
    ("first-product", "only the first product of each key", "your sum over a vector's entries keeps only the first "
     "product q[0] · K[j, 0] (a `return` or an assignment inside the loop over the entries)", "add all d products: "
     "(q * key).sum()", lambda q, K: K[:, 0] * q[0]),
    ("dot-matrix", "torch.dot on a matrix", "torch.dot takes two vectors (1-D), and K is a matrix", "use K @ q (or "
     "torch.mv(K, q)); torch.dot(q, K[j]) works inside a loop", lambda q, K: torch.dot(q, K), lambda q, K: q.dot(K)),
    *_typed_in_lengths(),
    ("mm-vector", "torch.mm with a vector", "torch.mm multiplies two matrices, and q is a vector", "use torch.mv(K, q) "
     "or K @ q", lambda q, K: torch.mm(K, q), lambda q, K: K.mm(q)),
)


#: Each typed-in length's summary, and its m (None: longer than every vector of the cases).
_TYPED_SUMMARIES = {k.summary: (None if k.key.startswith("typed-length-long") else int(k.key.split("/")[0][13:]))
                    for k in ONE_QUERY_TABLE if k.key.startswith("typed-length-")}
#: Far longer than every case's vector: a length typed in below 64 sums only its first products here.
_PROBE_LENGTH = 64


def _typed_length_proven(fn: Learner, cases: Sequence[Case], m: int | None) -> bool:
    """Whether the learner's function does on EVERY case (the right ones too) what one way of a typed-in length m
    does (past the end of a shorter vector: an exception with range, the whole vector with a slice; m products of a
    longer one), and, where no case has a vector longer than m (m = the longest, or None: longer than every one),
    sums the first m products of a 64-entry vector, m > the longest for None. A bound of len(q) + 1, indices counted
    from 1, or max(len(q), len(K)) also runs past the end of a short vector, but not like this on every vector."""
    keys = (f"typed-length-{m}" if m else "typed-length-long",)
    ways = [k for k in ONE_QUERY_TABLE if k.key.split("/")[0] in keys]
    outcomes = []
    for c in cases:
        try:
            outcomes.append((False, fn.observe(CALL_WITH, *c.args, **c.kwargs)[0]))
        except LearnerRaised:
            outcomes.append((True, None))
    if not any(all(fits(k, c.key, raised=raised, value=value if isinstance(value, torch.Tensor) else None,
                        atol=max(c.atol, 1e-5)) for c, (raised, value) in zip(cases, outcomes)) for k in ways):
        return False
    if m is not None and m < _LONGEST:
        return True  # the longest vector's m products, and every other case, prove it
    q = random_tensor(_PROBE_LENGTH, seed=190, dtype=torch.float64)
    K = random_tensor(2, _PROBE_LENGTH, seed=191, dtype=torch.float64)
    try:
        got = fn.observe(CALL_WITH, q, K)[0]
    except LearnerRaised:
        return False
    lengths = [m] if m else range(_LONGEST + 1, _PROBE_LENGTH)
    return isinstance(got, torch.Tensor) and tuple(got.shape) == (2,) and got.is_floating_point() and any(
        same(got.detach().double(), K[:, :n] @ q[:n], atol=1e-5 * _PROBE_LENGTH, rtol=1e-5) for n in lengths)


def _check_one_query(fn: Learner, name: str) -> str:
    cases = _one_query_cases()

    def judged(table: list) -> None:
        judge(fn, cases, table, call=f"{name}(q, K)", arg_names=("q", "K"), oracle="K @ q",
              factors=lambda c: {"d": float(c.args[0].shape[0]), "√d": math.sqrt(c.args[0].shape[0])})

    try:
        judged(ONE_QUERY_TABLE)
    except Failure as failure:  # a typed-in length is named only when the learner's function does it everywhere
        summary = failure.diagnosis.summary
        if summary not in _TYPED_SUMMARIES or _typed_length_proven(fn, cases, _TYPED_SUMMARIES[summary]):
            raise
        judged([k for k in ONE_QUERY_TABLE if not k.key.startswith("typed-length-")])
    fresh_values(fn, cases[0], lambda q, K: K @ q, call=f"{name}(q, K)", seed=170, magnitude=score_magnitude)
    return f"matches K @ q on {len(cases)} cases (square K, one key, d = 1, float32/64, large values)"


@check("query_scores_loop", expects="a function query_scores_loop(q, K) returning a tensor of shape (n_k,)")
def check_query_scores_loop(fn: Learner) -> str:
    return _check_one_query(fn, "query_scores_loop")


@check("query_scores", expects="a function query_scores(q, K) returning a tensor of shape (n_k,)")
def check_query_scores(fn: Learner) -> str:
    return _check_one_query(fn, "query_scores")


# ============================================================================ every query against every key
def _score_cases() -> list[Case]:
    f32, f64 = torch.float32, torch.float64
    specs = [  # (what, Q shape, K shape, dtype, scale, tags)
        ("", (3, 5), (4, 5), f32, 1.0, {"float32"}), ("square ", (4, 4), (4, 4), f64, 1.0, {"float64", "square"}),
        ("a batch: ", (2, 3, 6), (2, 5, 6), f32, 1.0, {"float32", "batched"}),
        ("batch × heads: ", (2, 3, 4, 5), (2, 3, 6, 5), f64, 1.0, {"float64", "batched", "4-D"}),
        ("five axes: ", (2, 1, 3, 2, 4), (2, 1, 3, 5, 4), f32, 1.0, {"float32", "batched", "4-D", "size-1"}),
        ("size-1 axes: ", (1, 2, 1, 7), (1, 2, 1, 7), f64, 1.0, {"float64", "batched", "4-D", "size-1", "one key"}),
        ("vectors of size 1: ", (3, 1), (2, 1), f32, 1.0, {"float32", "size-1"}),
        ("entries near 1000: ", (2, 8), (3, 8), f32, 1000.0, {"float32", "large"}),
    ]
    return _random_cases(200, _mT, [(f"{what}Q {qs} and K {ks}, {str(dtype)[6:]}", qs, ks, dtype, scale, tags)
                                    for what, qs, ks, dtype, scale, tags in specs])


#: Q Kᵀ formed wrong (the kit's PRODUCT_MISTAKES, which notebook 02's scaled_scores judges too), then what a score is.
SCORE_TABLE = table(*product_rows(), *_slips(_mT))


@check("score_matrix", expects="a function score_matrix(Q, K) returning a tensor of shape (..., n_q, n_k)")
def check_score_matrix(fn: Learner) -> str:
    cases = _score_cases()
    judge(fn, cases, SCORE_TABLE, call="score_matrix(Q, K)", arg_names=("Q", "K"), oracle="Q @ K.transpose(-2, -1)",
          factors=lambda c: {"d": float(c.args[0].shape[-1]), "√d": math.sqrt(c.args[0].shape[-1])})
    fresh_values(fn, cases[0], _mT, call="score_matrix(Q, K)", seed=270, magnitude=score_magnitude)
    return f"matches Q Kᵀ on {len(cases)} cases (2-D to 5-D, size-1 axes, float32/64, large values)"


# ============================================================================ cosine similarity
def cosine_reference(Q: torch.Tensor, K: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """The oracle: F.cosine_similarity of every query with every key, in float64."""
    return F.cosine_similarity(Q.double().unsqueeze(-2), K.double().unsqueeze(-3), dim=-1, eps=eps)


def _rows_with_norms(norms: Sequence[float], d: int, seed: int, dtype) -> torch.Tensor:
    """Rows of random direction with exactly these lengths (0 gives a zero row)."""
    x = random_tensor(len(norms), d, seed=seed, dtype=torch.float64)
    return (x / x.norm(dim=-1, keepdim=True) * torch.tensor(norms, dtype=torch.float64)[:, None]).to(dtype)


def _cosine_cases() -> list[Case]:
    K0, Qz, Kz = random_tensor(3, 4, seed=301), random_tensor(3, 4, seed=308), random_tensor(2, 4, seed=309)
    K0[1], Qz[1], Kz[0] = 10.0 * K0[1], 0.0, 0.0
    f64 = dict(dtype=torch.float64)
    specs = [  # (label, Q, K, tags, eps or None)
        ("Q (2, 4) and K (3, 4), one key 10× longer, float32", random_tensor(2, 4, seed=300), K0, {"float32"}, None),
        ("square Q (3, 3) and K (3, 3), float64", random_tensor(3, 3, seed=302, **f64),
         random_tensor(3, 3, seed=303, **f64), {"float64", "square"}, None),
        ("a batch: Q (2, 3, 5) and K (2, 4, 5), float32", random_tensor(2, 3, 5, seed=304),
         random_tensor(2, 4, 5, seed=305), {"float32", "batched"}, None),
        ("batch × heads: Q (2, 2, 3, 4) and K (2, 2, 5, 4), float64", random_tensor(2, 2, 3, 4, seed=306, **f64),
         random_tensor(2, 2, 5, 4, seed=307, **f64), {"float64", "batched", "4-D"}, None),
        ("a zero query and a zero key (Q (3, 4), K (2, 4)), float32", Qz, Kz, {"float32", "zero"}, None),
        # lengths below eps count as eps; length 3 with 0.3 tells clamping each length (the docstring) from
        # clamping their product (0.9 ≥ eps)
        ("eps=0.5, queries of length 1 and 3 (Q (2, 3)) and keys of length 1, 0.3, 0.1, 0 (K (4, 3)), float64",
         _rows_with_norms([1, 3], 3, 310, torch.float64), _rows_with_norms([1, 0.3, 0.1, 0], 3, 311, torch.float64),
         {"float64", "eps", "zero"}, 0.5),
        ("eps=0.2, queries of length 0.05 and 1 (Q (1, 2, 5)) and unit-length keys (K (1, 3, 5)), float32",
         _rows_with_norms([0.05, 1], 5, 312, torch.float32)[None], _rows_with_norms([1, 1, 1], 5, 313, torch.float32)[None],
         {"float32", "eps", "batched", "size-1"}, 0.2),
        ("vectors of size 1: Q (3, 1) and K (2, 1), float64", random_tensor(3, 1, seed=314, **f64),
         random_tensor(2, 1, seed=315, **f64), {"float64", "size-1"}, None),
        ("entries near 1000: Q (2, 6) and K (3, 6), float32", random_tensor(2, 6, seed=316, scale=1000.0),
         random_tensor(3, 6, seed=317, scale=1000.0), {"float32", "large"}, None),
    ]
    return [Case(label, (Q, K), cosine_reference(Q, K, eps or 1e-8), kwargs={} if eps is None else {"eps": eps},
                 tags=frozenset(tags)) for label, Q, K, tags, eps in specs]


def _norms(key: str, summary: str, cause: str, fix: str, *preps: Callable) -> list[tuple]:
    """A mistake in dividing rows by their lengths, ``prep(x, eps)``: made on Q and K, or on one of them only."""
    def cos(prep_q, prep_k):
        return lambda Q, K, eps=1e-8: prep_q(Q, eps) @ prep_k(K, eps).transpose(-2, -1)

    return [(key, summary, cause, fix, *(cos(p, p) for p in preps)),
            (key + ":Q", f"{summary} (queries)", f"{cause} — in the queries only (the keys are right)", fix,
             *(cos(p, _unit) for p in preps)),
            (key + ":K", f"{summary} (keys)", f"{cause} — in the keys only (the queries are right)", fix,
             *(cos(_unit, p) for p in preps))]


def _outer(Q: torch.Tensor, K: torch.Tensor, norm=lambda x: x.norm(dim=-1)) -> torch.Tensor:
    return norm(Q).unsqueeze(-1) * norm(K).unsqueeze(-2)  # ‖Q[i]‖ · ‖K[j]‖ for every pair


def _pairs(way: Callable) -> Callable:  # a wrong formula for every (query, key) pair, from the oracle's values
    return lambda Q, K, eps=1e-8: way(cosine_reference(Q, K, eps))


_NORM_FIX = "divide each row by its own length, clamped at eps: x / x.norm(dim=-1, keepdim=True).clamp_min(eps)"
_EACH = "clamp each length: x / x.norm(dim=-1, keepdim=True).clamp_min(eps), for Q and for K"
_UNCLAMPED = ("lengths not clamped", "a zero vector has length 0 and 0/0 is NaN: your lengths are not clamped at eps",
              "clamp the lengths: x.norm(dim=-1, keepdim=True).clamp_min(eps)")
_EPS_IGNORED = ("eps ignored", "a length below the eps you are given is not raised to eps: your results are what a "
                "fixed eps gives (1e-8, or F.normalize's or F.cosine_similarity's own default), or eps used only for "
                "zero lengths", "pass eps on: .clamp_min(eps), F.normalize(x, dim=-1, eps=eps) or "
                "F.cosine_similarity(…, eps=eps)")
_SQUARED = ("divided by squared lengths", "you divided by the squared lengths (x · x), not the lengths", _NORM_FIX)
COSINE_TABLE = table(
    *[row for row in product_rows(prepare=_unit) if row[0] != "entrywise"],  # Q Kᵀ formed wrong, on unit rows
    ("plain", "lengths not divided out", "you returned the plain dot products: cosine similarity divides each by the two "
     "vectors' lengths", _NORM_FIX, lambda Q, K, eps=1e-8: _mT(Q, K)),
    ("only-Q", "only the queries normalised", "you divided the queries by their lengths but not the keys", _NORM_FIX,
     lambda Q, K, eps=1e-8: _mT(_unit(Q, eps), K)),
    ("only-K", "only the keys normalised", "you divided the keys by their lengths but not the queries", _NORM_FIX,
     lambda Q, K, eps=1e-8: _mT(Q, _unit(K, eps))),
    *_norms("axis", "norm over the wrong axis", "you took each length over axis -2 or 0 (across the positions or the "
            "batch) instead of each vector's own entries (the last axis)", _NORM_FIX,
            lambda x, e: x / x.norm(dim=-2, keepdim=True).clamp_min(e), lambda x, e: F.normalize(x, dim=-2, eps=e),
            lambda x, e: x / x.norm(dim=0, keepdim=True).clamp_min(e)),
    *_norms("normalize-dim1", "F.normalize along dim=1", "F.normalize normalises along dim=1 unless told otherwise; for "
            "batched input that is the positions axis, not the vectors' entries", "pass dim=-1: F.normalize(Q, dim=-1, "
            "eps=eps)", lambda x, e: F.normalize(x, eps=e), lambda x, e: F.normalize(x)),
    *_norms("whole", "norm of the whole matrix", "you divided by the norm of the whole tensor (x.norm() with no dim), "
            "not each row's own length", _NORM_FIX, lambda x, e: x / x.norm().clamp_min(e)),
    *_norms("l1", "the L1 norm", "you divided by the sum of absolute values (norm(p=1)); length is the Euclidean (L2) "
            "norm", _NORM_FIX, lambda x, e: x / x.norm(p=1, dim=-1, keepdim=True).clamp_min(e)),
    *_norms("squared", *_SQUARED, lambda x, e: x / (x * x).sum(-1, keepdim=True).clamp_min(e)),
    ("squared-pair", *_SQUARED, lambda Q, K, eps=1e-8: _mT(Q, K) / _outer(Q, K, lambda x: (x * x).sum(-1)).clamp_min(eps)),
    *_norms("by-eps", "rows divided by eps, not by their lengths", "you divided each row by eps itself where it is "
            "divided by its length clamped at eps", _NORM_FIX, lambda x, e: x / e),
    *_norms("times-length", "multiplied by the lengths", "you multiplied the rows by their lengths where cosine "
            "similarity divides by them", _NORM_FIX, lambda x, e: x * x.norm(dim=-1, keepdim=True).clamp_min(e),
            lambda x, e: x * x.norm(dim=-1, keepdim=True)),
    ("distance", "cosine distance 1 − cos", "you returned the cosine distance 1 − cos θ; the exercise asks for the "
     "similarity cos θ", "return the cosine itself", _pairs(lambda c: 1 - c)),
    ("abs", "absolute values", "you took the absolute value; a cosine keeps its sign (−1 for opposite directions)",
     "return the cosine itself", _pairs(torch.abs)),
    ("clamped", "negative cosines set to 0", "you clamped the cosines at 0 (.clamp(min=0), relu, or clamp(0, 1)): "
     "a cosine keeps its sign, down to −1 for opposite directions", "return the cosine itself, without a clamp",
     _pairs(lambda c: c.clamp(min=0))),
    ("angle", "the angle instead of its cosine", "you returned the angle θ (arccos); the exercise asks for cos θ",
     "return the cosine itself", _pairs(lambda c: torch.arccos(c.clamp(-1, 1)))),
    *_norms("unclamped", *_UNCLAMPED, lambda x, e: x / x.norm(dim=-1, keepdim=True)),
    ("unclamped-pair", *_UNCLAMPED, lambda Q, K, eps=1e-8: _mT(Q, K) / _outer(Q, K)),
    *_norms("eps-ignored", *_EPS_IGNORED, lambda x, e: _unit(x, 1e-8), lambda x, e: _unit(x, 1e-12)),
    ("eps-ignored-pair", *_EPS_IGNORED, lambda Q, K, eps=1e-8: F.cosine_similarity(Q.unsqueeze(-2), K.unsqueeze(-3), dim=-1)),
    *_norms("eps-added", "eps added instead of clamped", "you divided by length + eps; the docstring clamps: a length "
            "below eps counts as eps, a longer one is used as it is", "use x.norm(dim=-1, keepdim=True).clamp_min(eps)",
            lambda x, e: x / (x.norm(dim=-1, keepdim=True) + e)),
    ("eps-added-pair", "eps added instead of clamped", "you divided by ‖q‖·‖k‖ + eps; the docstring clamps each length: "
     "one below eps counts as eps, a longer one is used as it is", _EACH,
     lambda Q, K, eps=1e-8: _mT(Q, K) / (_outer(Q, K) + eps)),
    *_norms("sq-clamp", "clamped the squared length at eps", "you clamped x · x (the squared length) at eps, which "
            "clamps the length at √eps", "clamp the length itself, or the squared length at eps ** 2",
            lambda x, e: x / (x * x).sum(-1, keepdim=True).clamp_min(e).sqrt()),
    *_norms("clamp-max", "clamp_max instead of clamp_min", "clamp_max(eps) caps every length at eps instead of raising "
            "the short ones to eps", "use clamp_min(eps) (or clamp(min=eps))",
            lambda x, e: x / x.norm(dim=-1, keepdim=True).clamp_max(e)),
    *_norms("keepdim", "keepdim missing", "x.norm(dim=-1) drops the last axis, so dividing x by it lines the lengths "
            "up with the vectors' entries instead of the rows", "keep the axis: x.norm(dim=-1, keepdim=True)",
            lambda x, e: x / x.norm(dim=-1).clamp_min(e)),
    ("product-clamped", "clamped the product of the lengths", "you divided by max(‖q‖·‖k‖, eps), the product of the two "
     "lengths clamped once; the docstring clamps each length on its own, max(‖q‖, eps)·max(‖k‖, eps), so a short "
     "vector counts as length eps even when the other one is long", _EACH,
     lambda Q, K, eps=1e-8: _mT(Q, K) / _outer(Q, K).clamp_min(eps)),
    ("norms-entrywise", "norms multiplied entry by entry", "you divided by Q.norm(…) * K.norm(…) entry by entry, which "
     "pairs query i's length with key i's; each score needs ‖Q[i]‖ · ‖K[j]‖ (an outer product)", "divide Q and K by "
     "their own lengths first, then multiply",
     lambda Q, K, eps=1e-8: _mT(Q, K) / (Q.norm(dim=-1) * K.norm(dim=-1)).clamp_min(eps),
     lambda Q, K, eps=1e-8: _mT(Q, K) / (Q.norm(dim=-1, keepdim=True) * K.norm(dim=-1, keepdim=True)).clamp_min(eps)),
    ("pairwise", "paired query i with key i only", "F.cosine_similarity(Q, K, dim=-1), like an entry-by-entry product "
     "Q * K, compares row i of Q with row i of K only", "compare every pair: F.cosine_similarity(Q.unsqueeze(-2), "
     "K.unsqueeze(-3), dim=-1, eps=eps)", lambda Q, K, eps=1e-8: F.cosine_similarity(Q, K, dim=-1, eps=eps),
     lambda Q, K, eps=1e-8: F.cosine_similarity(Q, K, dim=-1), lambda Q, K, eps=1e-8: (_unit(Q, eps) * _unit(K, eps)).sum(-1),
     lambda Q, K, eps=1e-8: _unit(Q, eps) * _unit(K, eps)),
)


@check("cosine_scores", expects="a function cosine_scores(Q, K, eps=1e-8) returning a tensor of shape (..., n_q, n_k)")
def check_cosine_scores(fn: Learner) -> str:
    expect_signature(fn, ["eps"], call="cosine_scores(Q, K, eps=0.5)", signature="cosine_scores(Q, K, eps=1e-8)")
    cases = _cosine_cases()
    judge(fn, cases, COSINE_TABLE, call="cosine_scores(Q, K)", arg_names=("Q", "K"),
          oracle="F.cosine_similarity of every pair")
    fresh_values(fn, cases[0], cosine_reference, call="cosine_scores(Q, K)", seed=370)
    return f"matches F.cosine_similarity on {len(cases)} cases (batched, zero vectors, eps = 0.5 and 0.2)"
