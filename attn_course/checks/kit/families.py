"""Known mistakes that several topics' checks judge, each written once with its reproductions; each check adapts
them to its own call. :data:`SOFTMAX_MISTAKES` (the stable softmax, on ``(x, dim)``): notebook 03, and notebook 04's
SoftmaxFunction through :func:`along_last_axis`. :data:`PRODUCT_MISTAKES` (Q Kᵀ formed wrong): notebook 01's
score_matrix and cosine_scores, notebook 02's scaled_scores, each through :func:`product_rows`."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch
import torch.nn.functional as F

from .mistakes import AlongDim as K, Known

__all__ = ["SHIFT_FIX", "WEIGHTS_FIX", "SOFTMAX_MISTAKES", "along_last_axis", "normalised", "exp_shifted",
           "other_axis", "PRODUCT_MISTAKES", "product_rows"]


# ============================================================================ the stable softmax
normalised = lambda e, dim: e / e.sum(dim, keepdim=True)  # noqa: E731 - e normalised along dim
exp_shifted = lambda x, dim: torch.exp(x - x.amax(dim, keepdim=True))  # noqa: E731 - e^(x − max) along dim
# the same as normalised, with the denominator kept from 0 (an epsilon, a clamp: 0/0 gives 0)
_eps = lambda e, dim: e / e.sum(dim, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)  # noqa: E731
_norm, _e = normalised, exp_shifted  # the tables' shorthands


def other_axis(o: int, dim: int | None, x: torch.Tensor) -> bool:
    """Whether axis ``o`` is another axis than ``dim`` (given, not left at its default) of ``x``."""
    return dim is not None and o < x.ndim and o != dim % x.ndim


SHIFT_FIX = "subtract the maximum of each slice along `dim` before exp: x - x.amax(dim, keepdim=True)"
WEIGHTS_FIX = "weights = e / e.sum(dim, keepdim=True) with e = exp(x - max)"
_NAIVE = ("maximum not subtracted", "you exponentiated the scores as they are: e^x overflows to inf for scores near "
          "1000 (and underflows to 0 near -1000), and inf/inf or 0/0 is NaN", SHIFT_FIX)
_WHOLE = ("maximum taken over the whole tensor", "you subtracted the maximum of the whole tensor, not of each slice: a "
          "slice whose scores lie far below that maximum underflows to 0 (0/0 = NaN, or zeros behind an epsilon)",
          SHIFT_FIX)
_AXIS_FIX = "use `dim` in both the maximum and the sum: x.amax(dim, keepdim=True), e.sum(dim, keepdim=True)"
_SUM_FIX = "divide by the sum along dim: e / e.sum(dim, keepdim=True)"
_KEEPDIM = ("keepdim missing", "you reduced without keepdim=True, so the result broadcast against the wrong axis of x "
            "(each slice got another slice's value)", "keep the reduced axis: x.amax(dim, keepdim=True) and "
            "e.sum(dim, keepdim=True)")
#: The stable softmax gone wrong, each made on ``(x, dim)`` (an axis row only where ``dim`` is given and another axis).
SOFTMAX_MISTAKES = [
    K("naive", *_NAIVE, lambda x, dim=-1: _norm(torch.exp(x), dim)),
    K("naive-eps", *_NAIVE, lambda x, dim=-1: _eps(torch.exp(x), dim)),
    K("whole-max", *_WHOLE, lambda x, dim=-1: _norm(torch.exp(x - x.max()), dim)),
    K("whole-max-eps", *_WHOLE, lambda x, dim=-1: _eps(torch.exp(x - x.max()), dim)),
    K("min", "minimum subtracted instead of the maximum", "you subtracted each slice's minimum: the largest score minus "
      "the smallest can exceed what e^x can hold, so e^x overflows", SHIFT_FIX,
      lambda x, dim=-1: _norm(torch.exp(x - x.amin(dim, keepdim=True)), dim)),
    K("max-added", "maximum added instead of subtracted", "you exponentiated x + max where the shift is x − max: the "
      "largest score doubles, so e^(x + max) overflows as soon as 2·max passes e^x's range", SHIFT_FIX,
      lambda x, dim=-1: _norm(torch.exp(x + x.amax(dim, keepdim=True)), dim)),
    K("mean-shift", "mean subtracted instead of the maximum", "you subtracted each slice's mean: a score far above the "
      "mean still overflows e^x (only the maximum guarantees every exponent ≤ 0)", SHIFT_FIX,
      lambda x, dim=-1: _norm(torch.exp(x - x.mean(dim, keepdim=True)), dim)),
    K("whole-sum", "divided by the sum of the whole tensor", "you divided by the sum of e^(x − max) over every entry of "
      "the tensor, not over each slice along dim", _SUM_FIX,
      lambda x, dim=-1: _e(x, dim) / _e(x, dim).sum()),
    K("mean-sum", "divided by the mean, not the sum", "you divided e^(x − max) by its mean along dim where softmax "
      "divides by its sum, so every weight is n times too large (n = the slice's length)", _SUM_FIX,
      lambda x, dim=-1: _e(x, dim) / _e(x, dim).mean(dim, keepdim=True)),
] + [row for o in range(4) for row in (
    K(f"axis-{o}", f"softmax along axis {o}, not dim={{dim}}", f"you normalised along axis {o}, so the slices along "
      f"axis {o} sum to 1, not those along dim={{dim}}", _AXIS_FIX,
      lambda x, dim=None, o=o: torch.softmax(x, o) if other_axis(o, dim, x) else None),
    K(f"max-axis-{o}", "maximum taken along the wrong axis", f"you took the maximum along axis {o}, not along "
      "dim={dim}: that shift changes from entry to entry of a slice, so it does not cancel", _AXIS_FIX,
      lambda x, dim=None, o=o: _norm(torch.exp(x - x.amax(o, keepdim=True)), dim) if other_axis(o, dim, x) else None),
    K(f"sum-axis-{o}", "sum taken along the wrong axis",
      f"you divided by the sum along axis {o}, not along dim={{dim}}", _AXIS_FIX,
      lambda x, dim=None, o=o: _e(x, dim) / _e(x, dim).sum(o, keepdim=True) if other_axis(o, dim, x) else None))
] + [
    K("keepdim-max", *_KEEPDIM, lambda x, dim=-1: _norm(torch.exp(x - x.amax(dim)), dim)),
    K("keepdim-sum", *_KEEPDIM, lambda x, dim=-1: _e(x, dim) / _e(x, dim).sum(dim)),
    K("keepdim-both", *_KEEPDIM, lambda x, dim=-1: torch.exp(x - x.amax(dim)) / torch.exp(x - x.amax(dim)).sum(dim)),
    K("flat", "softmax over the whole tensor", "you took one softmax over every entry of the tensor", _AXIS_FIX,
      lambda x, dim=-1: torch.softmax(x.flatten(), 0).reshape(x.shape)),
    K("no-exp", "no exponential", "you divided the scores by their sum without exponentiating: weights can be negative "
      "or explode", "exponentiate first: e^(x - max) / Σ e^(x - max)", lambda x, dim=-1: _norm(x, dim)),
    K("unnormalised", "not normalised", "you returned e^(x - max) without dividing by the sum", _SUM_FIX,
      lambda x, dim=-1: _e(x, dim)),
    K("log-softmax", "log-softmax returned", "you returned x - logsumexp(x), the log of the weights",
      "return the weights themselves: exp of that, or e / e.sum(dim, keepdim=True)",
      lambda x, dim=-1: torch.log_softmax(x, dim)),
    K("sign", "sign flipped", "you exponentiated -x, so the smallest score gets the largest weight",
      "exponentiate x - max, not max - x", lambda x, dim=-1: torch.softmax(-x, dim)),
    K("times-sum", "multiplied by the sum", "you multiplied e^(x − max) by its sum where softmax divides by it",
      "divide: e / e.sum(dim, keepdim=True)", lambda x, dim=-1: _e(x, dim) * _e(x, dim).sum(dim, keepdim=True)),
    K("exp-missing", "exponential missing", "you normalised x − max without exponentiating it",
      "exponentiate before normalising: e = exp(x - max)", lambda x, dim=-1: _norm(x - x.amax(dim, keepdim=True), dim)),
    K("log-for-exp", "log instead of exp", "you took the log of x − max where softmax exponentiates it",
      "e = torch.exp(x - max), then e / e.sum(dim, keepdim=True)",
      lambda x, dim=-1: _norm(torch.log(x - x.amax(dim, keepdim=True)), dim)),
    K("argmax", "arg-max instead of softmax", "you put all the weight on the largest score (a one-hot of the arg-max): "
      "that is softmax's limit as the temperature goes to 0, not softmax", WEIGHTS_FIX,
      lambda x, dim=-1: (x == x.amax(dim, keepdim=True)).to(x.dtype)),
]


def along_last_axis(table: list[Known], *keys: str) -> list[Known]:
    """The rows of ``table`` named by ``keys`` (in that order), made on ``(z,)`` along the last axis: a table written
    for ``(x, dim)`` judging a function that takes no ``dim`` (their texts then say dim=-1)."""
    rows = {k.key: k for k in table}
    return [replace(rows[key], make=lambda z, k=rows[key]: k.make(z, -1)) for key in keys]


# ============================================================================ Q Kᵀ
_LAST_TWO = "transpose only the last two axes: K.transpose(-2, -1) (or K.mT)"
#: Q Kᵀ formed wrong, as rows (key, summary, cause, fix, *products): each product one way of writing the mistake,
#: taking (Q, K).
PRODUCT_MISTAKES = [
    ("not-transposed", "K not transposed", "you multiplied by K itself (Q @ K); each score pairs a row of Q with a "
     "*row* of K, so K must be transposed", _LAST_TWO,
     lambda Q, K: Q @ K, lambda Q, K: torch.einsum("...ij,...jk->...ik", Q, K)),
    ("swapped", "rows and columns swapped (K Qᵀ)", "your matrix has the keys on the rows and the queries on the "
     "columns (K Qᵀ, the product transposed, or an einsum ending in '->...kq')", "put the queries on the rows: "
     "Q @ K.transpose(-2, -1), or torch.einsum('...qd,...kd->...qk', Q, K)",
     lambda Q, K: K @ Q.transpose(-2, -1), lambda Q, K: K @ Q.T),
    ("QtK", "Qᵀ K instead of Q Kᵀ", "you transposed Q instead of K: Qᵀ K pairs the vectors' entries with each "
     "other, not queries with keys", "transpose K on its last two axes: Q @ K.transpose(-2, -1)",
     lambda Q, K: Q.transpose(-2, -1) @ K, lambda Q, K: Q.T @ K, lambda Q, K: Q.t() @ K),
    ("dot-T", "K.T on batched input", "K.T reverses *every* axis of a batched tensor (batch axes too), so keys from "
     "different batch entries get mixed", _LAST_TWO,
     lambda Q, K: Q @ K.T, lambda Q, K: Q @ K.permute(*reversed(range(K.ndim)))),
    ("t01", "K.transpose(0, 1) names fixed axes", "K.transpose(0, 1) swaps the first two axes: right for 2-D input, "
     "but for batched input it swaps the batch axis", _LAST_TWO,
     lambda Q, K: Q @ K.transpose(0, 1), lambda Q, K: Q @ K.transpose(1, 0)),
    ("t12", "K.transpose(1, 2) names fixed axes", "K.transpose(1, 2) is right for 3-D input only: 2-D input has no "
     "axis 2, and with (batch, heads, n, d) it swaps heads and positions", _LAST_TWO,
     lambda Q, K: Q @ K.transpose(1, 2), lambda Q, K: Q @ K.transpose(2, 1)),
    ("p021", "K.permute(0, 2, 1) names fixed axes", "K.permute(0, 2, 1) fits 3-D input only", _LAST_TWO,
     lambda Q, K: Q @ K.permute(0, 2, 1)),
    ("t23", "K.transpose(2, 3) names fixed axes", "K.transpose(2, 3) (or permute(0, 1, 3, 2)) is right for 4-D "
     "input (batch, heads, n, d) only: 2-D and 3-D input have no axis 3, and with 5 axes it swaps the wrong pair",
     _LAST_TWO, lambda Q, K: Q @ K.transpose(2, 3), lambda Q, K: Q @ K.transpose(3, 2),
     lambda Q, K: Q @ K.permute(0, 1, 3, 2)),
    ("reshaped", "K reshaped instead of transposed", "K.reshape(…, d, n_k) (or .view) keeps the entries in memory "
     "order and cuts them into new rows: it does not turn K's rows into columns", _LAST_TWO,
     lambda Q, K: Q @ K.reshape(*K.shape[:-2], K.shape[-1], K.shape[-2])),
    ("inner", "torch.inner pairs every batch entry", "torch.inner (like torch.tensordot over the last axis) "
     "multiplies every query with every key of *every* batch entry, so the leading axes appear twice", _LAST_TWO,
     lambda Q, K: torch.inner(Q, K), lambda Q, K: torch.tensordot(Q, K, dims=([-1], [-1]))),
    ("2d-only", "2-D only: .t() or torch.mm", "K.t(), torch.mm and F.linear handle 2-D tensors only, but the "
     "docstring asks for any number of leading axes", "use Q @ K.transpose(-2, -1) (or torch.matmul), which works "
     "for any number of axes", lambda Q, K: Q @ K.t(), lambda Q, K: torch.mm(Q, K.transpose(-2, -1)),
     lambda Q, K: Q.mm(K.T), lambda Q, K: F.linear(Q, K), lambda Q, K: torch.mm(Q, K.t())),
    ("bmm", "3-D only: torch.bmm", "torch.bmm takes exactly 3-D tensors, but the docstring asks for any number of "
     "leading axes", "use Q @ K.transpose(-2, -1) (or torch.matmul)",
     lambda Q, K: torch.bmm(Q, K.transpose(-2, -1)), lambda Q, K: torch.bmm(Q, K.transpose(1, 2))),
    ("einsum-fixed", "einsum without '...'", "your einsum names a fixed number of axes, so it fits one input rank "
     "only", "let '...' stand for the leading axes: torch.einsum('...qd,...kd->...qk', Q, K)",
     *(lambda Q, K, e=e: torch.einsum(e, Q, K) for e in ("qd,kd->qk", "bqd,bkd->bqk", "bhqd,bhkd->bhqk"))),
    ("flattened", "batch axes flattened together", "you flattened the leading axes into the rows, so every query is "
     "scored against the keys of every batch entry", "keep the leading axes: Q @ K.transpose(-2, -1) multiplies "
     "matching batch entries only", lambda Q, K: Q.reshape(-1, Q.shape[-1]) @ K.reshape(-1, K.shape[-1]).T),
    ("sum-positions", "summed over the keys axis", "after multiplying with broadcasting you summed over an axis of "
     "positions, not over the vector entries (the last axis)", "sum over the last axis: "
     "(Q.unsqueeze(-2) * K.unsqueeze(-3)).sum(-1)", lambda Q, K: (Q.unsqueeze(-2) * K.unsqueeze(-3)).sum(-2),
     lambda Q, K: (Q.unsqueeze(-2) * K.unsqueeze(-3)).sum(-3)),
    ("entrywise", "entry-by-entry product Q * K", "Q * K multiplies entry by entry, pairing query i only with key "
     "i", "take the matrix product: Q @ K.transpose(-2, -1)", lambda Q, K: Q * K, lambda Q, K: (Q * K).sum(-1)),
    ("first-axis-loop", "a loop over the first axis", "your loops run over the first axis of Q and K, which is the "
     "batch axis once the input is batched", "use Q @ K.transpose(-2, -1), which loops over the leading axes for "
     "you", lambda Q, K: torch.stack([torch.stack([q @ k for k in K]) for q in Q]),
     lambda Q, K: torch.stack([q @ k.T for q, k in zip(Q, K)]),
     lambda Q, K: torch.stack([q @ k.transpose(-2, -1) for q, k in zip(Q, K)])),
    ("squeeze", ".squeeze() removed a size-1 axis", ".squeeze() removes every axis of size 1, here a batch axis or "
     "the single query or key", "leave the result's shape as the product gives it (…, n_q, n_k)",
     lambda Q, K: (Q @ K.transpose(-2, -1)).squeeze()),
]


def product_rows(fixes: dict[str, str | None] | None = None, *, prepare: Callable | None = None,
                 then: Callable | None = None) -> list[tuple]:
    """Rows of :data:`PRODUCT_MISTAKES` for :func:`~.mistakes.known_rows`, each product taken of ``prepare(Q, eps)``
    and ``prepare(K, eps)`` (cosine: unit rows, with the case's eps) and mapped by ``then(S, Q)`` (scaled: S / √d_k).
    ``fixes`` picks the rows by key, in its order, each with the check's own fix (None: the row's); without it, all."""
    def made(product: Callable) -> Callable:
        def way(Q: torch.Tensor, K: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
            S = product(prepare(Q, eps), prepare(K, eps)) if prepare else product(Q, K)
            return then(S, Q) if then else S
        return way

    rows = {row[0]: row for row in PRODUCT_MISTAKES}
    picked = [(rows[key], fix) for key, fix in fixes.items()] if fixes else [(row, None) for row in PRODUCT_MISTAKES]
    return [(key, summary, cause, fix or own, *map(made, products))
            for (key, summary, cause, own, *products), fix in picked]
