"""Checks for notebook 01 (queries, keys and the dot product).

``check_query_scores_loop``, ``check_query_scores``, ``check_score_matrix``, ``check_cosine_scores``:
each runs the learner's function on several cases (square and non-square, batched, float64, NumPy input
for query_scores, zero vectors), compares with PyTorch (``torch.matmul`` / ``einsum`` /
``F.cosine_similarity``) and names the likely mistake.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._core import CheckFailed, NotAttempted, as_tensor, call, check, diagnose, expect_close, expect_finite, expect_shape, fail

__all__ = ["check_query_scores_loop", "check_query_scores", "check_score_matrix", "check_cosine_scores"]


def _rand(*shape: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def _cosine_oracle(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    # (..., n_q, 1, d) against (..., 1, n_k, d) -> (..., n_q, n_k)
    return F.cosine_similarity(Q.unsqueeze(-2), K.unsqueeze(-3), dim=-1, eps=1e-8)


def _call_with_hint(fn, args, hint: str):
    """Call the learner's function; if it raises, add ``hint`` (the usual cause) to the message."""
    try:
        return call(fn, *args)
    except NotAttempted:
        raise
    except CheckFailed as exc:
        fail(f"{exc} {hint}")


# ----------------------------------------------------------------------------------------------
# one query against every key


def _one_query_pitfalls(q: torch.Tensor, K: torch.Tensor) -> list:
    return [
        ("each score must pair q with one *row* of K (a key), but your answer pairs q with the columns "
         "of K (q @ K, or a product summed over axis 0): use K @ q or (K * q).sum(dim=-1).",
         lambda: q @ K),
        ("these are cosine similarities (you divided by the vectors' lengths); the exercise asks for the "
         "raw dot product q · K[j].",
         lambda: (K @ q) / (K.norm(dim=-1) * q.norm()).clamp_min(1e-12)),
        ("the elementwise products were summed over the wrong axis (axis 0, across the keys): sum over the "
         "vector entries instead, (K * q).sum(dim=-1).",
         lambda: (K * q).sum(0)),
    ]


def _check_one_query(fn, name: str, numpy_inputs: bool) -> str:
    # Square case first (n_k == d), where a transposed K still runs and its wrong values can be named.
    cases = [
        ("4 keys of size 4 (square K)", _rand(4, seed=1), _rand(4, 4, seed=2)),
        ("6 keys of size 3", _rand(3, seed=3), _rand(6, 3, seed=4)),
        ("1 key of size 5", _rand(5, seed=5), _rand(1, 5, seed=6)),
        ("3 keys of size 8, float64", _rand(8, seed=7, dtype=torch.float64), _rand(3, 8, seed=8, dtype=torch.float64)),
    ]
    if numpy_inputs:
        cases.append(("5 keys of size 2, NumPy arrays", _rand(2, seed=9).numpy(), _rand(5, 2, seed=10).numpy()))
    for label, q, K in cases:
        qt, Kt = torch.as_tensor(q), torch.as_tensor(K)
        out = as_tensor(
            _call_with_hint(fn, (q, K),
                            f"(q has shape {tuple(qt.shape)}, K has shape {tuple(Kt.shape)}: K @ q multiplies "
                            "each row of K by q; q @ K needs K transposed.)"),
            f"{name}(q, K)",
        )
        expected = torch.einsum("kd,d->k", Kt.double(), qt.double())
        pitfalls = _one_query_pitfalls(qt.double(), Kt.double())
        n_k = Kt.shape[0]
        if tuple(out.shape) == (n_k, 1) or tuple(out.shape) == (1, n_k):
            fail(f"{name}(q, K) for {label} has shape {tuple(out.shape)}, expected ({n_k},): one score per key "
                 "in a 1-D tensor. Did you turn q into a column or row (q[:, None])? Squeeze it, or use K @ q.")
        if out.ndim == 0:
            fail(f"{name}(q, K) for {label} is a single number, expected {n_k} scores, shape ({n_k},): you summed "
                 "over the keys as well; sum only over the vector dimension (dim=-1).")
        expect_shape(out, (n_k,), f"{name}(q, K) for {label}",
                     hint=f"Expected one score per key (K has {n_k} rows). A result of length {qt.shape[0]} means "
                          "the sum ran over the keys instead of over the vector entries (use dim=-1).")
        expect_finite(out, f"{name}(q, K) for {label}")
        expect_close(out.double(), expected, f"{name}(q, K)", case=label, pitfalls=pitfalls, atol=1e-5, rtol=1e-4)
    return f"matches K @ q on {len(cases)} cases (square and non-square K, one key, float64" + (", NumPy)" if numpy_inputs else ")")


@check("query_scores_loop", expects="a function query_scores_loop(q, K) returning a tensor of shape (n_keys,)")
def check_query_scores_loop(fn):
    return _check_one_query(fn, "query_scores_loop", numpy_inputs=False)


@check("query_scores", expects="a function query_scores(q, K) returning a tensor of shape (n_keys,)")
def check_query_scores(fn):
    return _check_one_query(fn, "query_scores", numpy_inputs=True)


# ----------------------------------------------------------------------------------------------
# the full score matrix


_TRANSPOSE_HINT = (
    "(Q has shape {q}, K has shape {k}. Scores need K with its last two axes swapped: "
    "K.transpose(-2, -1) or K.mT. Plain K is not transposed at all, and K.T reverses *every* axis of "
    "a batched tensor, batch axes included.)"
)


def _matrix_pitfalls(Q: torch.Tensor, K: torch.Tensor) -> list:
    pits = [
        ("you multiplied by K instead of Kᵀ (Q @ K): each score pairs a row of Q with a *row* of K, so K "
         "must be transposed on its last two axes: Q @ K.transpose(-2, -1).",
         lambda: Q @ K),
        ("rows and columns are swapped: you computed K Qᵀ (keys down the rows). Rows must be queries and "
         "columns keys: Q @ K.transpose(-2, -1).",
         lambda: K @ Q.transpose(-2, -1)),
    ]
    if Q.ndim >= 3:
        pits += [
            ("you used K.T on a batched tensor: .T reverses every axis (batch axes too), so keys from "
             "different batch entries got mixed. Use K.transpose(-2, -1) (or K.mT).",
             lambda: Q @ K.permute(*reversed(range(K.ndim)))),
            ("you transposed fixed axes (e.g. K.transpose(1, 2) or K.transpose(0, 1)) instead of the last "
             "two; with more leading dimensions that swaps the wrong axes. Use K.transpose(-2, -1).",
             lambda: Q @ K.transpose(0, 1)),
        ]
    if Q.ndim == 4:
        pits.append(("you transposed axes 1 and 2 (K.transpose(1, 2)): with (batch, heads, n, d) input that "
                     "swaps heads and positions. Use K.transpose(-2, -1).",
                     lambda: Q @ K.transpose(1, 2)))
    return pits


@check("score_matrix", expects="a function score_matrix(Q, K) returning a tensor of shape (..., n_q, n_k)")
def check_score_matrix(fn):
    cases = [
        ("Q (3, 4), K (4, 4): square K", _rand(3, 4, seed=11), _rand(4, 4, seed=12)),
        ("Q (2, 5), K (3, 5)", _rand(2, 5, seed=13), _rand(3, 5, seed=14)),
        ("batched: Q (4, 2, 4), K (4, 4, 4)", _rand(4, 2, 4, seed=15), _rand(4, 4, 4, seed=16)),
        ("batched: Q (2, 3, 5), K (2, 6, 5)", _rand(2, 3, 5, seed=17), _rand(2, 6, 5, seed=18)),
        ("batch and heads: Q (2, 3, 4, 3), K (2, 3, 3, 3)", _rand(2, 3, 4, 3, seed=19), _rand(2, 3, 3, 3, seed=20)),
        ("one query, one key: Q (1, 6), K (1, 6)", _rand(1, 6, seed=21), _rand(1, 6, seed=22)),
        ("float64: Q (3, 7), K (5, 7)", _rand(3, 7, seed=23, dtype=torch.float64), _rand(5, 7, seed=24, dtype=torch.float64)),
    ]
    for label, Q, K in cases:
        Qt, Kt = torch.as_tensor(Q).double(), torch.as_tensor(K).double()
        hint = _TRANSPOSE_HINT.format(q=tuple(Qt.shape), k=tuple(Kt.shape))
        out = as_tensor(_call_with_hint(fn, (Q, K), hint), "score_matrix(Q, K)")
        expected = torch.einsum("...qd,...kd->...qk", Qt, Kt)
        pitfalls = _matrix_pitfalls(Qt, Kt)
        if out.shape != expected.shape:
            named = diagnose(out.double(), pitfalls)
            fail(f"score_matrix(Q, K) for {label} has shape {tuple(out.shape)}, expected {tuple(expected.shape)}: "
                 + (named or f"keep Q's leading axes {tuple(Qt.shape[:-2])} and end with (n_q, n_k) = "
                             f"{tuple(expected.shape[-2:])}, queries on rows and keys on columns."))
        expect_finite(out, f"score_matrix(Q, K) for {label}")
        expect_close(out.double(), expected, "score_matrix(Q, K)", case=label, pitfalls=pitfalls, atol=1e-5, rtol=1e-4)
    return f"matches Q @ Kᵀ on {len(cases)} cases (2-D, batched, batch × heads, one query, float64)"


# ----------------------------------------------------------------------------------------------
# cosine similarity


def _cosine_pitfalls(Q: torch.Tensor, K: torch.Tensor) -> list:
    def unit(x, dim):
        return x / x.norm(dim=dim, keepdim=True).clamp_min(1e-12)

    return [
        ("these are raw dot products: divide each query and each key by its length first "
         "(x / x.norm(dim=-1, keepdim=True)).", lambda: Q @ K.transpose(-2, -1)),
        ("only the queries were normalised; the keys must be divided by their lengths too.",
         lambda: unit(Q, -1) @ K.transpose(-2, -1)),
        ("only the keys were normalised; the queries must be divided by their lengths too.",
         lambda: Q @ unit(K, -1).transpose(-2, -1)),
        ("the norms were taken over the wrong axis (dim=-2, down the positions): each *vector* (a row, "
         "the last axis) must be divided by its own length, x.norm(dim=-1, keepdim=True).",
         lambda: unit(Q, -2) @ unit(K, -2).transpose(-2, -1)),
        ("this is the cosine *distance* 1 − cos; the exercise asks for the similarity cos itself.",
         lambda: 1 - unit(Q, -1) @ unit(K, -1).transpose(-2, -1)),
        ("you divided the dot products by the product of *squared* lengths; divide by the lengths "
         "themselves (‖q‖·‖k‖).",
         lambda: (Q @ K.transpose(-2, -1)) / ((Q * Q).sum(-1, keepdim=True) * (K * K).sum(-1).unsqueeze(-2)).clamp_min(1e-12)),
    ]


@check("cosine_scores", expects="a function cosine_scores(Q, K) returning a tensor of shape (..., n_q, n_k)")
def check_cosine_scores(fn):
    long_key = _rand(3, 4, seed=31)
    long_key[1] *= 10.0  # lengths must not matter
    cases = [
        ("Q (2, 4), K (3, 4) with one key 10× longer", _rand(2, 4, seed=30), long_key),
        ("Q (3, 3), K (3, 3)", _rand(3, 3, seed=32), _rand(3, 3, seed=33)),
        ("batched: Q (2, 3, 5), K (2, 4, 5)", _rand(2, 3, 5, seed=34), _rand(2, 4, 5, seed=35)),
        ("float64: Q (4, 6), K (2, 6)", _rand(4, 6, seed=36, dtype=torch.float64), _rand(2, 6, seed=37, dtype=torch.float64)),
    ]
    for label, Q, K in cases:
        Qt, Kt = torch.as_tensor(Q).double(), torch.as_tensor(K).double()
        out = as_tensor(_call_with_hint(fn, (Q, K), _TRANSPOSE_HINT.format(q=tuple(Qt.shape), k=tuple(Kt.shape))),
                        "cosine_scores(Q, K)")
        expected = _cosine_oracle(Qt, Kt)
        expect_finite(out, f"cosine_scores(Q, K) for {label}")
        expect_close(out.double(), expected, "cosine_scores(Q, K)", case=label, pitfalls=_cosine_pitfalls(Qt, Kt),
                     atol=1e-5, rtol=1e-4)
        if out.abs().max() > 1 + 1e-5:
            fail(f"cosine_scores(Q, K) for {label} has values outside [-1, 1]")

    # Edge case: a zero key has no direction; its similarities must be 0 (norm clamped at eps), not NaN.
    Q = _rand(2, 4, seed=40)
    K = torch.cat([_rand(1, 4, seed=41), torch.zeros(1, 4)])
    out = as_tensor(call(fn, Q, K), "cosine_scores(Q, K)")
    expect_finite(out, "cosine_scores(Q, K) with an all-zero key",
                  hint="A zero vector has length 0, and 0/0 is NaN: clamp the lengths, "
                       "x.norm(dim=-1, keepdim=True).clamp_min(1e-8), as the docstring says.")
    expect_close(out.double(), _cosine_oracle(Q.double(), K.double()), "cosine_scores(Q, K)",
                 case="an all-zero key", atol=1e-5, rtol=1e-4)
    return f"matches F.cosine_similarity on {len(cases) + 1} cases (lengths ignored, batched, float64, a zero key)"
