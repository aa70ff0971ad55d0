"""Checks for notebook 13 (beyond softmax): ``linear_attention``, ``causal_linear_attention``,
``chunked_linear_attention``, ``positive_random_features`` and ``block_sparse_attention``.

Oracles, in float64: kernel attention computed densely (A = φ(q) φ(k)ᵀ, masked by j ≤ i when causal,
A v / rowsum(A)) — itself equal to ``F.scaled_dot_product_attention`` with the additive mask log A
(``tests/test_beyond.py``); the feature map's formula; ``F.scaled_dot_product_attention`` with the
layout's boolean mask. Randomness is the check's: the projection Ω is an argument, so a right answer
never fails by chance.

Each check: its cases, the oracle, its table of known mistakes (one :class:`~.kit.Suspects` per run), what a
measurement shows when no mistake reproduces the answer (which rows, chunks or query blocks are wrong; the same
call with one chunk, or one key block per query block), and how the result is computed, seen on the learner's
side by the probe :func:`work`: no (n, n) matrix for the linear forms, (c, c) blocks for the chunkwise one, and
no work on the tiles a layout skips.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .boundary import probe
from .compare import Failure, as_tensor, call_or_skip, fail, same
from .core import Learner, check
from .kit import Known, Suspects, watch

__all__ = ["check_linear_attention", "check_causal_linear_attention", "check_chunked_linear_attention",
           "check_positive_random_features", "check_block_sparse_attention", "work"]

Tensor = torch.Tensor


def _table(variant: Callable[..., Tensor], rows: list[tuple[str, str, str, str]]) -> list[Known]:
    """Known mistakes (key, summary, cause, fix) whose output is ``variant(*case, key)``."""
    return [Known(key, s, c, f, lambda *case, key=key: variant(*case, key)) for key, s, c, f in rows]


def _qkv(lead: tuple[int, ...], n_q: int, n_k: int, d_k: int, d_v: int, seed: int, *, scale: float = 1.0,
         dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*lead, n, d, generator=g, dtype=torch.float64)
               for n, d in ((n_q, d_k), (n_k, d_k), (n_k, d_v)))
    return (scale * q).to(dtype), (scale * k).to(dtype), v.to(dtype)


def _dtype(label: str) -> torch.dtype:
    return torch.float32 if "float32" in label else torch.float64


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return dict(atol=1e-10, rtol=1e-9) if dtype == torch.float64 else dict(atol=2e-5, rtol=2e-3)


def _expect_close(suspects: Suspects, out: Tensor, expected: Tensor, case: tuple, *, tried: str,
                  measured: Callable[[Failure], None] | None = None, **compare: Any) -> None:
    """The engine's verdict at the tolerance of the input's dtype (``case[0]``); a float64 answer right only to
    float32's precision is named; then ``measured`` may name what a measurement of the answer shows. Last, the
    result must have the input's dtype."""
    dtype = case[0].dtype
    try:
        suspects.expect(out, expected, case, tried=tried, **_tol(dtype), **compare)
    except Failure as failure:
        d = failure.diagnosis
        if not d.cause and dtype == torch.float64 and same(out, expected, **_tol(torch.float32)):
            fail("computed in float32, not the input's float64", tried=tried, got=d.got,
                 expected="the values to float64's precision (the inputs are float64)",
                 cause="right to about 7 digits, as float32 gives: a tensor you created without dtype= (torch.zeros "
                       "and torch.empty make float32 by default), or a conversion, made part of the work float32",
                 fix=_DTYPE_FIX)
        if measured is not None and not d.cause:
            measured(failure)
        raise
    if out.dtype != dtype:
        got, want = (str(t).replace("torch.", "") for t in (out.dtype, dtype))
        fail(f"result in {got}, not the input's {want}", tried=tried, got=f"a {got} tensor",
             expected=f"a {want} tensor, like the input",
             cause="a tensor you created without dtype= (torch.zeros and torch.empty make float32 by default), or a "
                   "conversion", fix=_DTYPE_FIX)


_DTYPE_FIX = "create every tensor with the input's dtype (dtype=q.dtype, or *_like functions)"


def _rows_right(out: Tensor, expected: Tensor) -> Tensor:
    """(..., n) whether each output row is right (float32's tolerance; NaN where NaN is expected counts as right)."""
    return torch.isclose(out.double(), expected, atol=2e-5, rtol=2e-3, equal_nan=True).all(-1)


def _blocks_right(out: Tensor, expected: Tensor, size: int) -> list[bool] | None:
    """For each block of ``size`` rows (the last may be shorter): are all its rows right in every batch entry?
    None if the shapes differ."""
    if tuple(out.shape) != tuple(expected.shape):
        return None
    right = _rows_right(out, expected).reshape(-1, out.shape[-2]).all(0)  # (n,)
    return [bool(right[s:s + size].all()) for s in range(0, right.shape[0], size)]


def _refail(failure: Failure, summary: str, cause: str, fix: str) -> None:
    """Fail again with what the first failure showed, now with a measured cause."""
    d = failure.diagnosis
    fail(summary, tried=d.tried, got=d.got, expected=d.expected, cause=cause, fix=fix)


# ============================================================================ the probe: what the code builds
@probe("beyond.work")
def work(fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
    """Learner-side: run ``fn(*args)`` under :class:`~.kit.Watch` and report the torch functions it called
    (``ops``), the shapes of the floating-point tensors it built (``shapes``), the shapes its matrix products
    returned with counts (``products``) and their FLOPs (``flops``)."""
    return watch(fn, *args)


def _squares(seen: dict[str, Any], n: int) -> list[tuple[int, ...]]:
    """The shapes of the floating-point tensors built whose last two axes are (n, n)."""
    return [tuple(s) for s in seen["shapes"] if tuple(s[-2:]) == (n, n)]


def _no_square(fn: Learner, n: int, tried: str, fix: str, *args: Any) -> dict[str, Any]:
    """What the probe saw of ``fn(*args)``, after failing when it built a floating-point (n, n) tensor."""
    seen = fn.observe("beyond.work", *args)
    if full := _squares(seen, n):
        fail(f"builds the full {n} × {n} matrix", tried=tried,
             got=f"a floating-point tensor of shape {full[0]}: one number per (query, key) pair",
             expected="nothing with one entry per (query, key) pair: only (d_k, d_v) sums over the keys",
             cause="the values are right, but computing φ(q) φ(k)ᵀ (or the scores) costs O(n²) time and memory, "
                   "which is exactly what linear attention removes",
             fix=fix)
    return seen


# ============================================================================ the forms, for the oracle and the mistakes
def _elu1(x: Tensor) -> Tensor:
    return F.elu(x.double()) + 1


def _kernel(fq: Tensor, fk: Tensor, v: Tensor, *, causal: bool = False, future: bool = False,
            normalise: bool = True) -> Tensor:
    """A v / rowsum(A) in float64, A = fq fkᵀ, masked to the past (j ≤ i) when causal, to the future (j ≥ i) when
    ``future``."""
    a = fq.double() @ fk.double().transpose(-2, -1)  # (..., n_q, n_k)
    if causal or future:
        ones = torch.ones(a.shape[-2:], dtype=torch.float64)
        a = a * (ones.triu() if future else ones.tril())
    out = a @ v.double()
    return out / a.sum(-1, keepdim=True) if normalise else out


_ELU1 = "φ(x) = elu(x) + 1"
_PHI_FIX = "apply φ(x) = F.elu(x) + 1 to q and to k (positive: x + 1 above 0, exp(x) below), with no other scale"
#: Feature maps that are not φ = elu + 1: (what it is, why it is wrong, the map).
_MAPS: list[tuple[str, str, Callable[[Tensor], Tensor]]] = [
    ("elu(x) without + 1", "elu is negative wherever x < 0 (down to −1), so the normaliser φ(q)ᵀ Σ φ(k) can be near 0 "
     "or negative", lambda x: F.elu(x.double())),
    ("no feature map (φ(x) = x)", "dot products of raw vectors are negative for about half the pairs, so the "
     "normaliser can be near 0 or negative", lambda x: x.double()),
    ("relu(x)", "every negative entry becomes 0, so features and even whole normalisers are 0 (0 / 0 = NaN)",
     lambda x: torch.relu(x.double())),
    ("exp(x)", "positive, but not the docstring's map", lambda x: torch.exp(x.double())),
    ("elu(x) − 1", "a sign flipped: elu(x) − 1 lies between −2 and x − 1, negative for most entries",
     lambda x: F.elu(x.double()) - 1),
    ("x + 1 (no elu)", "without elu, x + 1 is negative for every x < −1", lambda x: x.double() + 1),
    ("elu(x) + 2", "a constant other than 1: positive, but not the docstring's map", lambda x: F.elu(x.double()) + 2),
]


def _phi_table(causal: bool) -> list[Known]:
    """Kernel attention with a wrong feature map on the queries, on the keys, or on both; and with q (and k)
    scaled by 1/√d_k as softmax attention would."""
    found = []
    for what, why, phi in _MAPS:
        positive = not what.startswith(("elu(x) without", "no feature", "elu(x) −", "x + 1"))
        head = "φ = " + what if positive else "φ not positive: " + what
        for side, on_q, on_k in (("q and k", phi, phi), ("q", phi, _elu1), ("k", _elu1, phi)):
            summary = head + ("" if side == "q and k" else f" on {side} only")
            cause = f"you applied {what} to {side}" + ("" if side == "q and k" else f" (and {_ELU1} to the other)") + \
                f": {why}"
            found.append(Known(summary, summary, cause, _PHI_FIX, lambda q, k, v, *_, a=on_q, b=on_k:
                               _kernel(a(q), b(k), v, causal=causal)))
    for summary, both in (("q scaled by 1/√d_k", False), ("q and k scaled by 1/√d_k", True)):
        found.append(Known(summary, summary, "you divided by √d_k as softmax attention does; the docstring's "
                           "φ(q)·φ(k) has no scale", _PHI_FIX, lambda q, k, v, *_, both=both: _kernel(
                               _elu1(q / q.shape[-1] ** 0.5), _elu1(k / k.shape[-1] ** 0.5 if both else k), v,
                               causal=causal)))
    return found


_NORM_CAUSE = ("you returned φ(q)ᵀ Σ φ(k) vᵀ without dividing by φ(q)ᵀ Σ φ(k): the weights of a row do not sum "
               "to 1, so the output grows with the number of keys")
_MUL_CAUSE = ("you multiplied by the normaliser φ(q)ᵀ Σ φ(k) instead of dividing by it, so the weights of a row "
              "sum to its square, not to 1")
_ONES_CAUSE = ("you created the {what} with torch.ones instead of torch.zeros, so it starts with a sum of 1s before "
               "any key is added and every position sees keys that do not exist")
_MUL_FIX = "divide: out = numerator / normaliser"


# ============================================================================ exercise 1: linear attention
_LINEAR_FIX = ("kv = φ(k)ᵀ v (d_k × d_v) and u = Σ_j φ(k_j) (d_k) over the keys, then out = (φ(q) kv) / (φ(q) u): "
               "a matrix product and a row-wise division")
_LINEAR_TABLE = [
    Known("normaliser_missing", "normaliser missing", _NORM_CAUSE, "divide by φ(q_i)ᵀ Σ_j φ(k_j), one number per "
          "query row", lambda q, k, v: _kernel(_elu1(q), _elu1(k), v, normalise=False)),
    Known("multiplied_by_the_normaliser", "multiplied by the normaliser instead of dividing", _MUL_CAUSE, _MUL_FIX,
          lambda q, k, v: _kernel(_elu1(q), _elu1(k), v, normalise=False) * (_elu1(q) @ _elu1(k).sum(-2)[..., None])),
    *_phi_table(False),
    Known("softmax_attention_instead_of", "softmax attention instead of linear", "you computed softmax(q kᵀ/√d_k) v: "
          "right for softmax attention, but this exercise replaces exp(q·k/√d_k) by φ(q)·φ(k)", _LINEAR_FIX,
          lambda q, k, v: F.scaled_dot_product_attention(q.double(), k.double(), v.double())),
    Known("normaliser_summed_over_the", "normaliser summed over the queries", "you summed φ(q) (the queries' "
          "features) for the normaliser instead of φ(k)", "u = φ(k).sum(dim=-2): a sum over the keys",
          lambda q, k, v: (_elu1(q) @ (_elu1(k).transpose(-2, -1) @ v.double())) / (_elu1(q) @ _elu1(q).sum(-2)[..., None])),
    Known("k_and_v_swapped", "k and v swapped in the sum", "you built vᵀ φ(k) (d_v × d_k) instead of φ(k)ᵀ v (d_k × "
          "d_v); with d_k = d_v the shapes still fit", "kv = φ(k).transpose(-2, -1) @ v",
          lambda q, k, v: (_elu1(q) @ (v.double().transpose(-2, -1) @ _elu1(k))) / (_elu1(q) @ _elu1(k).sum(-2)[..., None])),
]
_LINEAR_CASES = [  # (label, (batch axes, n_q, n_k, d_k, d_v), scale of q and k)
    ("q (7, 4), k (11, 4), v (11, 3)", ((), 7, 11, 4, 3), 1.0),
    ("q, k, v (2, 3, 16, 5) (batch × heads)", ((2, 3), 16, 16, 5, 5), 1.0),
    ("q (1, 6) (one query), k (9, 6), v (9, 2)", ((), 1, 9, 6, 2), 1.0),
    ("q, k (2, 12, 4) with entries up to ±10, v (2, 12, 3)", ((2,), 12, 12, 4, 3), 3.0),
    ("q (2, 10, 8), k (2, 14, 8), v (2, 14, 4) in float32", ((2,), 10, 14, 8, 4), 1.0),
]


@check("linear_attention", expects="a function linear_attention(q, k, v) returning a tensor (..., n_q, d_v)")
def check_linear_attention(fn: Learner) -> str:
    suspects = Suspects(_LINEAR_TABLE)
    for i, (label, (lead, n_q, n_k, d_k, d_v), scale) in enumerate(_LINEAR_CASES):
        q, k, v = _qkv(lead, n_q, n_k, d_k, d_v, 100 + i, scale=scale, dtype=_dtype(label))
        tried = f"linear_attention(q, k, v) on {label}"
        _expect_close(suspects, as_tensor(fn(q, k, v), tried=tried), _kernel(_elu1(q), _elu1(k), v), (q, k, v),
                      tried=tried, again=fn, oracle="φ(q) (φ(k)ᵀ v) / φ(q) Σ φ(k) with φ = elu + 1, in float64",
                      fix=_LINEAR_FIX, factors={"n_k": float(n_k)})
    _no_square(fn, 64, "linear_attention(q, k, v) on q, k (64, 3), v (64, 2), watching the shapes it builds",
               "sum over the keys first: kv = φ(k)ᵀ v and u = φ(k).sum(-2); then φ(q) @ kv and φ(q) @ u",
               *_qkv((), 64, 64, 3, 2, 120))
    return (f"matches φ(q)(φ(k)ᵀv) / φ(q)Σφ(k) on {len(_LINEAR_CASES)} cases (n_q ≠ n_k, batch × heads, one "
            "query, large entries, float32) without an n × n matrix")


# ============================================================================ exercise 2: the recurrence
_RECUR_FIX = ("for t = 0 … n − 1: first C = C + φ(k_t) v_tᵀ and u = u + φ(k_t), then out_t = φ(q_t)ᵀ C / φ(q_t)ᵀ u")


def _recurrence(q: Tensor, k: Tensor, v: Tensor, mistake: str = "") -> Tensor:
    """The recurrence in float64 with one mistake switched on."""
    fq, fk, v = _elu1(q), _elu1(k), v.double()
    state = (torch.ones if mistake == "ones_C" else torch.zeros)(fq.shape[:-2] + (fk.shape[-1], v.shape[-1]),
                                                                  dtype=torch.float64)
    norm = (torch.ones if mistake == "ones_u" else torch.zeros)(fq.shape[:-2] + (fk.shape[-1],), dtype=torch.float64)
    rows = []
    for t in range(fq.shape[-2]):
        before, before_norm = state, norm
        add = v[..., t, None, :].expand_as(state) if mistake == "no_phik" else fk[..., t, :, None] * v[..., t, None, :]
        state = add if mistake in ("reset", "reset_C") else state + add
        norm = fk[..., t, :] if mistake in ("reset", "reset_u") else norm + fk[..., t, :]
        use, use_norm = (before, before_norm) if mistake.startswith("late") else (state, norm)
        num = (fq[..., t, None, :] @ use)[..., 0, :]
        den = (fq[..., t, :] * use_norm).sum(0 if mistake == "axis0" else -1, keepdim=True)
        if mistake in ("no_phiq", "no_u"):
            den = (use_norm if mistake == "no_phiq" else fq[..., t, :]).sum(-1, keepdim=True)
        if mistake == "late_guarded":
            rows.append(torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(num)))
        else:
            rows.append(num * den if mistake == "mul" else num if mistake == "no_norm" else num / den)
    return torch.stack(rows, dim=-2)


def _transposed_state(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The state built as v_t φ(k_t)ᵀ (d_v × d_k, needs d_k = d_v): out_t = Σ_{j ≤ t} (φ(q_t)·v_j) φ(k_j) / φ(q_t)ᵀ u_t."""
    fq, fk, v = _elu1(q), _elu1(k), v.double()
    keep = torch.ones(fq.shape[-2], fq.shape[-2], dtype=torch.float64).tril()
    return (((fq @ v.transpose(-2, -1)) * keep) @ fk) / ((fq @ fk.transpose(-2, -1)) * keep).sum(-1, keepdim=True)


_LATE_CAUSE = ("you computed out_t from the state before adding token t (C_{t−1} instead of C_t): every "
               "position misses its own key and value")
_CAUSAL_TABLE = _table(_recurrence, [
    ("late", "state update off by one: token t not in its own output",
     _LATE_CAUSE + ", and position 0 sees nothing at all (0 / 0 = NaN)", _RECUR_FIX),
    ("late_guarded", "state update off by one: token t not in its own output", _LATE_CAUSE, _RECUR_FIX),
    ("no_norm", "normaliser missing", _NORM_CAUSE, "divide by φ(q_t)ᵀ u_t, with u_t = Σ_{j ≤ t} φ(k_j)"),
    ("reset", "state not accumulated", "you set the state to φ(k_t) v_tᵀ at every step instead of adding it to "
     "C_{t−1}, so position t only sees itself (its output is v_t)", _RECUR_FIX),
    ("reset_C", "state C not accumulated", "you set C to φ(k_t) v_tᵀ at every step instead of adding it to C_{t−1} "
     "(u is accumulated), so the numerator of position t only sees key t", _RECUR_FIX),
    ("reset_u", "normaliser state u not accumulated", "you set u to φ(k_t) at every step instead of adding it to "
     "u_{t−1} (C is accumulated), so the normaliser of position t only counts key t", _RECUR_FIX),
    ("ones_C", "state C starts at ones", _ONES_CAUSE.format(what="state C"), "start from C = torch.zeros(…)"),
    ("ones_u", "normaliser state u starts at ones", _ONES_CAUSE.format(what="normaliser state u"),
     "start from u = torch.zeros(…)"),
    ("no_phik", "φ(k_t) missing from the state update", "you added v_t to every row of C instead of φ(k_t) v_tᵀ, so "
     "the numerator weighs every earlier value by the sum of φ(q_t), not by φ(q_t)·φ(k_j)", _RECUR_FIX),
    ("mul", "multiplied by the normaliser instead of dividing", _MUL_CAUSE, _MUL_FIX),
    ("no_phiq", "normaliser without φ(q_t)", "you divided by the sum of u_t's entries (Σ_{j ≤ t} of every feature of "
     "φ(k_j)) instead of the dot product φ(q_t)ᵀ u_t", "divide by (φ(q_t) * u).sum(dim=-1, keepdim=True)"),
    ("no_u", "normaliser without u_t", "you divided by the sum of φ(q_t)'s entries instead of the dot product "
     "φ(q_t)ᵀ u_t with the running sum of the keys' features", "divide by (φ(q_t) * u).sum(dim=-1, keepdim=True)"),
    ("axis0", "normaliser summed over axis 0", "you summed φ(q_t) * u over dim=0, which is the feature axis only for "
     "a single sequence: with batch (and head) axes in front it sums over the batch instead",
     "sum over the features, the last axis: .sum(dim=-1, keepdim=True)"),
]) + [
    Known("not_causal_every_position", "not causal: every position sees the whole sequence",
          "you summed over all the keys (the non-causal form), so position t also sees the keys after it", _RECUR_FIX,
          lambda q, k, v: _kernel(_elu1(q), _elu1(k), v)),
    Known("sums_over_the_future", "sums over the future instead of the past", "your sums run over j ≥ t (the "
          "sequence read backwards)", "loop forwards, t = 0, 1, …, and add token t before computing out_t",
          lambda q, k, v: _kernel(_elu1(q), _elu1(k), v, future=True)),
    Known("state_transposed", "state transposed", "you built v_t φ(k_t)ᵀ (d_v × d_k) instead of φ(k_t) v_tᵀ (d_k × "
          "d_v); with d_k = d_v the shapes still fit", "state = state + φ(k_t)[:, None] * v_t[None, :]: rows are "
          "features", _transposed_state),
    *_phi_table(True),
]
# (label, (batch axes, n, d_k, d_v), scale of q and k, the chunk size the chunkwise check uses: not dividing n,
# dividing it, 1, …)
_CAUSAL_CASES = [
    ("q, k (9, 3), v (9, 2)", ((), 9, 3, 2), 1.0, 2),
    ("q, k, v (2, 3, 12, 4) (batch × heads)", ((2, 3), 12, 4, 4), 1.0, 4),
    ("q, k (1, 5), v (1, 2) (a single position)", ((), 1, 5, 2), 1.0, 1),
    ("q, k (2, 10, 4) with entries up to ±10, v (2, 10, 3)", ((2,), 10, 4, 3), 3.0, 3),
    ("q, k (16, 8), v (16, 3) in float32", ((), 16, 8, 3), 1.0, 5),
]


def _run_causal(fn: Learner, name: str, table: list[Known], seed: int, *, chunked: bool, fix: str) -> None:
    """The learner on every case of ``_CAUSAL_CASES`` (with its chunk size when ``chunked``) against causal kernel
    attention computed densely. A failure no known mistake explains is measured: are exactly the rows a loop
    over d_k covers right (:func:`_loop_bound`)? and for chunks, which chunks are wrong (:func:`_chunks_measured`)?"""
    suspects = Suspects(table)
    for i, (label, (lead, n, d_k, d_v), scale, c) in enumerate(_CAUSAL_CASES):
        q, k, v = _qkv(lead, n, n, d_k, d_v, seed + i, scale=scale, dtype=_dtype(label))
        case = (q, k, v, c) if chunked else (q, k, v)
        tried = f"{name}(q, k, v{f', {c}' if chunked else ''}) on {label}"
        out = as_tensor(fn(*case), tried=tried)
        expected = _kernel(_elu1(q), _elu1(k), v, causal=True)

        def measured(failure: Failure) -> None:
            _loop_bound(failure, out, expected, d_k, case[3] if chunked else 1)
            if chunked:
                _chunks_measured(fn, failure, out, expected, case)

        _expect_close(suspects, out, expected, case, tried=tried, again=fn, measured=measured, fix=fix,
                      oracle="causal kernel attention computed densely in float64",
                      factors=None if chunked else {"d_k": float(d_k)})


def _loop_bound(failure: Failure, out: Tensor, expected: Tensor, d_k: int, c: int) -> None:
    """Fail with a cause when exactly the rows a loop over range(0, d_k, c) covers are right: the loop's bound
    is the feature axis, q.shape[-1], not the positions."""
    n = expected.shape[-2]
    done = min(n, -(-d_k // c) * c)
    if done >= n or tuple(out.shape) != tuple(expected.shape):
        return
    close = _rows_right(out, expected)
    if bool(close[..., :done].all()) and not bool(close[..., done:].any()):
        _refail(failure, f"only the first {done} rows computed: loop bound d_k instead of n",
                f"rows 0 … {done - 1} are right and every later row is wrong: your loop stops at d_k = {d_k}"
                + ("" if c == 1 else " (after the chunks that start before it)") + ", as a range over q.shape[-1] "
                f"(the features) does, where the positions are q.shape[-2] (n = {n})",
                "loop over the positions: range(q.shape[-2])" + ("" if c == 1 else " in steps of chunk_size"))


@check("causal_linear_attention",
       expects="a function causal_linear_attention(q, k, v) returning a tensor (..., n, d_v)")
def check_causal_linear_attention(fn: Learner) -> str:
    _run_causal(fn, "causal_linear_attention", _CAUSAL_TABLE, 200, chunked=False, fix=_RECUR_FIX)
    _no_square(fn, 40, "causal_linear_attention(q, k, v) on q, k (40, 3), v (40, 2), watching the shapes it builds",
               "carry only the state C (d_k, d_v) and u (d_k) from one position to the next, as the docstring's loop",
               *_qkv((), 40, 40, 3, 2, 220))
    return (f"matches causal kernel attention on {len(_CAUSAL_CASES)} cases (batch × heads, one position, large "
            "entries, float32), carrying only the state")


# ============================================================================ exercise 3: chunkwise
_CHUNK_FIX = ("for each chunk [s, e): A = (φ(q_c) φ(k_c)ᵀ) with the lower triangle kept, diagonal included; "
              "numerator A v_c + φ(q_c) C, normaliser rowsum(A) + φ(q_c) u; only then C += φ(k_c)ᵀ v_c, "
              "u += Σ φ(k_c)")


def _chunked(q: Tensor, k: Tensor, v: Tensor, c: int, mistake: str = "") -> Tensor:
    """The chunkwise form in float64 with one mistake switched on."""
    fq, fk, v = _elu1(q), _elu1(k), v.double()
    n = fq.shape[-2]
    state = (torch.ones if mistake == "ones_C" else torch.zeros)(fq.shape[:-2] + (fk.shape[-1], v.shape[-1]),
                                                                  dtype=torch.float64)
    norm = (torch.ones if mistake == "ones_u" else torch.zeros)(fq.shape[:-2] + (fk.shape[-1], 1), dtype=torch.float64)
    out = torch.zeros(fq.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
    for s in range(0, n - n % c if mistake == "tail" else n, c):
        a_q, a_k, a_v = fq[..., s:s + c, :], fk[..., s:s + c, :], v[..., s:s + c, :]
        ones = torch.ones(a_q.shape[-2], a_q.shape[-2], dtype=torch.float64)
        a = (a_q @ a_k.transpose(-2, -1)) * {"strict": ones.tril(-1), "full": ones, "upper": ones.triu()}.get(
            mistake, ones.tril())
        if mistake == "early":
            state, norm = state + a_k.transpose(-2, -1) @ a_v, norm + a_k.sum(-2)[..., None]
        own = {"no_own": 0, "elementwise": a * a_v}.get(mistake, a @ a_v)
        num = own + (a_q @ state if mistake not in ("no_state", "no_C") else 0)
        rowsum = {"colsum": a.sum(-2, keepdim=True), "no_keepdim": a.sum(-1)[..., None, :],
                  "rowmean": a.mean(-1, keepdim=True)}.get(mistake, a.sum(-1, keepdim=True))
        den = rowsum + (a_q @ norm if mistake not in ("no_state", "no_u") else 0)
        out[..., s:s + c, :] = num if mistake == "no_norm" else num * den if mistake == "mul" else num / den
        if mistake != "early":
            add_c = a_k.transpose(-2, -1) @ a_v
            add_u = {"u_mean": a_k.mean(-2)[..., None], "u_all": a_k.sum()}.get(mistake, a_k.sum(-2)[..., None])
            state = add_c if mistake in ("reset", "reset_C") else state + add_c
            norm = add_u if mistake in ("reset", "reset_u") else norm + add_u
    return out


_CHUNK_TABLE = _table(_chunked, [
    ("early", "chunk counted twice: state updated before it is read", "you added the chunk's own φ(k)ᵀ v to the "
     "state before reading it, so each chunk's keys count twice (once through A, once through C) and later keys of "
     "the chunk leak to earlier queries", _CHUNK_FIX),
    ("strict", "chunk boundary: the diagonal left out inside a chunk", "your mask inside a chunk keeps j < i "
     "(tril(-1)), so each position misses its own key", _CHUNK_FIX),
    ("full", "no causal mask inside a chunk", "you used the whole chunk's φ(q) φ(k)ᵀ, so a position sees the later "
     "keys of its own chunk", _CHUNK_FIX),
    ("upper", "mask inside a chunk is the upper triangle", "you kept j ≥ i inside each chunk (triu): the future "
     "instead of the past", _CHUNK_FIX),
    ("no_state", "state not carried across chunks", "each chunk only attends to itself: the state C, u of the "
     "earlier chunks is never added", _CHUNK_FIX),
    ("no_C", "state C not carried across chunks: earlier chunks missing from the numerator",
     "the numerator lacks φ(q_c) C (C is never updated, or never read) while the normaliser counts the earlier keys",
     _CHUNK_FIX),
    ("no_u", "normaliser state u not carried across chunks: earlier chunks missing from the normaliser",
     "the normaliser lacks φ(q_c) u (u is never updated, or never read) while the numerator counts the earlier keys",
     _CHUNK_FIX),
    ("reset", "state not accumulated: only the previous chunk carried", "you set C and u to the last chunk's φ(k_c)ᵀ "
     "v_c and Σ φ(k_c) instead of adding them, so a chunk sees only the chunk before it", _CHUNK_FIX),
    ("reset_C", "state C not accumulated: only the previous chunk carried", "you set C to the last chunk's φ(k_c)ᵀ "
     "v_c instead of adding it (u is accumulated)", _CHUNK_FIX),
    ("reset_u", "normaliser state u not accumulated: only the previous chunk carried", "you set u to the last "
     "chunk's Σ φ(k_c) instead of adding it (C is accumulated)", _CHUNK_FIX),
    ("ones_C", "state C starts at ones", _ONES_CAUSE.format(what="state C"), "start from C = torch.zeros(…)"),
    ("no_own", "the chunk's own keys missing from the numerator", "the numerator is only φ(q_c) C (the earlier "
     "chunks): A v_c, the chunk's own masked part, is left out while the normaliser counts it", _CHUNK_FIX),
    ("elementwise", "A * v_c instead of A @ v_c", "you multiplied A and v_c entry by entry (*) where the chunk's own "
     "part is a matrix product (@); the shapes fit only because d_v = chunk_size here", "a @ v_c"),
    ("ones_u", "normaliser state u starts at ones", _ONES_CAUSE.format(what="normaliser state u"),
     "start from u = torch.zeros(…)"),
    ("colsum", "row sums of A taken over the queries", "you summed A = φ(q_c) φ(k_c)ᵀ over dim=-2 (down its columns, "
     "over the queries) instead of over the keys (along its rows); the (1, c) result + φ(q_c) u (c, 1) even "
     "broadcasts to a (c, c) matrix", "a.sum(dim=-1, keepdim=True)"),
    ("no_keepdim", "keepdim missing in the row sum: the normaliser broadcast to (c, c)",
     "a.sum(dim=-1) without keepdim=True has shape (c,), which + φ(q_c) u (c, 1) broadcasts to a (c, c) matrix, so "
     "each row is divided by other rows' sums (the shapes fit only because d_v = chunk_size here)",
     "a.sum(dim=-1, keepdim=True)"),
    ("mul", "multiplied by the normaliser instead of dividing", _MUL_CAUSE, _MUL_FIX),
    ("rowmean", "row sums of A as a mean", "you took the mean of each row of A (.mean) instead of its sum, so the "
     "chunk's own keys count 1/c as much in the normaliser", "a.sum(dim=-1, keepdim=True)"),
    ("u_mean", "u grows by the mean of φ(k_c), not the sum", "you added the mean of the chunk's key features "
     "(.mean(dim=-2)) to u instead of their sum, so earlier keys count too little in the normaliser",
     "u = u + φ(k_c).sum(dim=-2) (as a column)"),
    ("u_all", "u grows by the sum of every entry of φ(k_c)", "you summed φ(k_c) without dim= (over every axis, one "
     "number) instead of over the chunk's keys (dim=-2, one sum per feature)", "u = u + φ(k_c).sum(dim=-2) (as a "
     "column)"),
    ("no_norm", "normaliser missing", _NORM_CAUSE, "divide by rowsum(A) + φ(q_c) u for each chunk"),
    ("tail", "last, shorter chunk never computed", "your loop stops before the last chunk when n is not a multiple "
     "of chunk_size, so those rows stay 0", "loop with range(0, n, chunk_size): slicing stops at the end by itself"),
]) + [
    Known("not_causal_every_position", "not causal: every position sees the whole sequence",
          "you summed over all the keys", _CHUNK_FIX, lambda q, k, v, c: _kernel(_elu1(q), _elu1(k), v)),
    *_phi_table(True),
]


def _chunks_measured(fn: Learner, failure: Failure, out: Tensor, expected: Tensor, case: tuple) -> None:
    """Fail with a cause when only the last, shorter chunk is wrong, or the first chunk is right and every later
    one wrong; else with what the learner's function gives on the whole sequence as one chunk."""
    q, k, v, c = case
    n, right = q.shape[-2], _blocks_right(out, expected, c)
    if right is None or len(right) < 2:
        return
    if n % c and all(right[:-1]) and not right[-1]:
        _refail(failure, f"wrong only in the last, shorter chunk (rows {n - n % c} … {n - 1})",
                f"n = {n} is not a multiple of chunk_size = {c}, and your loop mishandles the last {n % c} positions "
                "(a range that stops before them, or a chunk length taken as chunk_size)",
                "loop with range(0, n, chunk_size) and use each chunk's own length for its mask")
    if right[0] and not any(right[1:]):
        _refail(failure, "only the first chunk right", f"rows 0 … {c - 1} (the first chunk, which sees no earlier "
                "chunk) are right and every later chunk is wrong: what a chunk takes from the chunks before it, "
                "φ(q_c) C and φ(q_c) u with the carried state, goes wrong (how C and u are updated, or how they are "
                "read)", _CHUNK_FIX)
    whole = call_or_skip(lambda: as_tensor(fn(q, k, v, n), tried=failure.diagnosis.tried))
    if whole is None or tuple(whole.shape) != tuple(out.shape):
        return
    if same(whole, expected, **_tol(torch.float32)):
        _refail(failure, "right as one chunk, wrong with several", f"with chunk_size = n (one chunk) your function is "
                f"right, with chunks of {c} it is not: what goes wrong is what passes from chunk to chunk (the state C "
                "and u: how they are updated, or how φ(q_c) C and φ(q_c) u are added)", _CHUNK_FIX)
    _refail(failure, "wrong even as one chunk", "with chunk_size = n (the whole sequence as one chunk, no state "
            "carried) your result is wrong as well: the error is in the work inside a chunk (A = φ(q_c) φ(k_c)ᵀ with "
            "its causal mask, A v_c, the row sums of A, or the division)", _CHUNK_FIX)


@check("chunked_linear_attention",
       expects="a function chunked_linear_attention(q, k, v, chunk_size) returning a tensor (..., n, d_v)")
def check_chunked_linear_attention(fn: Learner) -> str:
    _run_causal(fn, "chunked_linear_attention", _CHUNK_TABLE, 300, chunked=True, fix=_CHUNK_FIX)
    n, d_k, d_v = 48, 3, 2
    for c, seed in ((6, 320), (8, 321)):
        tried = f"chunked_linear_attention(q, k, v, {c}) on q, k ({n}, {d_k}), v ({n}, {d_v}), watching what it builds"
        seen = _no_square(fn, n, tried, "work chunk by chunk: only (chunk_size, chunk_size) blocks of φ(q) φ(k)ᵀ",
                          *_qkv((), n, n, d_k, d_v, seed), c)
        squares = sum(int(count) for shape, count in seen["products"] if tuple(shape[-2:]) == (c, c))
        if squares < n // c:
            fail("not computed in chunks of chunk_size", tried=tried,
                 got=f"{squares} matrix products of shape (…, {c}, {c})",
                 expected=f"at least {n // c}: one (chunk_size, chunk_size) block φ(q_c) φ(k_c)ᵀ per chunk",
                 cause="the values are right, but your code works another way (one token at a time, or chunks of "
                       "another size): chunk_size is not used as the docstring asks",
                 fix="cut the sequence into chunks of chunk_size positions and compute each chunk's φ(q_c) φ(k_c)ᵀ "
                     "with one matrix product")
    return (f"matches causal kernel attention on {len(_CAUSAL_CASES)} cases (chunks of 1 to 5, n not a multiple "
            "of the chunk) and works in (chunk_size, chunk_size) blocks")


# ============================================================================ exercise 4: random features
_RF_FIX = "φ(x) = torch.exp(x @ omega.T − (x * x).sum(-1, keepdim=True) / 2) / math.sqrt(n_f), with n_f = omega.shape[0]"


def _features(x: Tensor, omega: Tensor, mistake: str = "") -> Tensor:
    x, omega = x.double(), omega.double()
    r = omega.shape[0]
    proj = x if mistake == "no_proj" else x @ (omega if mistake == "transposed" else omega.T)
    sq = {"mean": (x * x).mean(-1, keepdim=True), "col": (x * x).sum(-2, keepdim=True),
          "unsquared": x.sum(-1, keepdim=True)}.get(mistake, (x * x).sum(-1, keepdim=True))
    half = {"no_half": sq, "norm": sq.sqrt() / 2, "none": 0 * sq, "plus": -sq / 2}.get(mistake, sq / 2)
    scale = {"no_scale": 1.0, "r": 1 / r, "sqrt_d": 1 / math.sqrt(x.shape[-1])}.get(mistake, 1 / math.sqrt(r))
    if mistake == "no_exp":
        return (proj - half) * scale
    if mistake == "trig":
        return torch.cat([torch.sin(proj), torch.cos(proj)], -1) * torch.exp(sq / 2) / math.sqrt(r)
    return torch.exp(proj - half) * scale


_RF_TABLE = _table(_features, [
    ("no_scale", "features not rescaled: 1/√n_f missing", "you left out the division by √n_f, so φ(x)·φ(y) sums n_f "
     "terms instead of averaging them", "divide by math.sqrt(omega.shape[0])"),
    ("r", "features divided by n_f instead of √n_f", "you divided each feature by n_f; φ(x)·φ(y) multiplies two "
     "features, so each gets 1/√n_f", "divide by math.sqrt(omega.shape[0])"),
    ("sqrt_d", "features divided by √d instead of √n_f", "you divided by the square root of the input width d, not "
     "of the number of features n_f = omega.shape[0]", "divide by math.sqrt(omega.shape[0])"),
    ("none", "features not rescaled: exp(−|x|²/2) missing", "you computed exp(ω·x) without the factor exp(−|x|²/2), "
     "so φ(x)·φ(y) estimates exp(x·y + |x|²/2 + |y|²/2), not exp(x·y)", _RF_FIX),
    ("no_half", "|x|² not halved", "you subtracted |x|² instead of |x|²/2", _RF_FIX),
    ("norm", "|x| instead of |x|²", "you subtracted the norm |x| (halved), not the squared norm |x|²/2", _RF_FIX),
    ("plus", "sign of |x|²/2 reversed", "you added |x|²/2 instead of subtracting it", _RF_FIX),
    ("no_proj", "random projection missing: x instead of ω·x", "you used x itself in the exponent instead of its "
     "projections x Ωᵀ; with n_f = d the shapes still fit", _RF_FIX),
    ("mean", "|x|² as a mean", "you took the mean of the squares (.mean) instead of their sum, which is |x|²/d",
     "(x * x).sum(dim=-1, keepdim=True)"),
    ("col", "|x|² summed over the rows", "you summed x * x over dim=-2 (over the n vectors) instead of over each "
     "vector's d entries (dim=-1)", "(x * x).sum(dim=-1, keepdim=True)"),
    ("unsquared", "|x|² without the squares", "you summed the entries of x, not their squares: Σ x_i instead of |x|² "
     "= Σ x_i²", "(x * x).sum(dim=-1, keepdim=True)"),
    ("transposed", "projection transposed", "you multiplied by omega instead of omega.T; with n_f = d the shapes "
     "still fit, but feature i must be ω_i·x, the dot product with row i of omega", "x @ omega.T"),
    ("no_exp", "exp missing: features not positive", "you returned the exponent ω·x − |x|²/2 (divided by √n_f) "
     "without taking exp, so features are negative", _RF_FIX),
    ("trig", "trigonometric features instead of positive ones", "you returned sin and cos features (the random "
     "Fourier features of the Gaussian kernel): they take negative values, and the docstring asks for n_f positive "
     "features", _RF_FIX),
])
_RF_CASES = [("x (4, 3), Ω (3, 3) (as many features as inputs)", ((4, 3), 3), 1.0),
             ("x (5, 4), Ω (16, 4)", ((5, 4), 16), 1.0),
             ("x (2, 3, 6, 4) (batch × heads), Ω (8, 4)", ((2, 3, 6, 4), 8), 1.0),
             ("x (3, 5), Ω (1, 5) (one feature)", ((3, 5), 1), 1.0),
             ("x (6, 8) of norm ≈ 4, Ω (32, 8)", ((6, 8), 32), 1.5),
             ("x (4, 5) in float32, Ω (10, 5)", ((4, 5), 10), 1.0)]


def _rf_cases() -> list[tuple[str, Tensor, Tensor]]:
    """``_RF_CASES`` drawn, then float32 x with |x|²/2 ≈ 98 and rows of Ω nearly parallel to x, so ω·x ≈ 90:
    exp(ω·x) overflows and exp(−|x|²/2) underflows in float32, while exp(ω·x − |x|²/2) is an ordinary number."""
    cases = []
    for i, (label, (shape, r), scale) in enumerate(_RF_CASES):
        g = torch.Generator().manual_seed(400 + i)
        x = scale * torch.randn(*shape, generator=g, dtype=torch.float64)
        omega = torch.randn(r, shape[-1], generator=g, dtype=torch.float64)
        cases.append((label, x.to(_dtype(label)), omega.to(_dtype(label))))
    g = torch.Generator().manual_seed(406)
    x = torch.randn(3, 6, generator=g, dtype=torch.float64)
    x = 14 * x / x.norm(dim=-1, keepdim=True)  # |x| = 14
    omega = torch.randn(8, 6, generator=g, dtype=torch.float64)
    omega[:3] = 6.6 * x / 14 + 0.05 * omega[:3]  # ω·x ≈ 92 for row i = x_i
    return cases + [("float32 x (3, 6) with |x|²/2 ≈ 98 and ω·x up to ≈ 92, Ω (8, 6)", x.float(), omega.float())]


@check("positive_random_features",
       expects="a function positive_random_features(x, omega) returning a tensor (..., n, n_f)")
def check_positive_random_features(fn: Learner) -> str:
    suspects, cases = Suspects(_RF_TABLE), _rf_cases()
    for label, x, omega in cases:
        tried = f"positive_random_features(x, omega) on {label}"
        out, expected = as_tensor(fn(x, omega), tried=tried), _features(x, omega)
        split = (torch.exp(x @ omega.T) * torch.exp(-(x * x).sum(-1, keepdim=True) / 2)) / math.sqrt(omega.shape[0])
        if "98" in label and not same(out, expected, **_tol(x.dtype)) and same(out, split, atol=0, rtol=0):
            fail("exp(ω·x) and exp(−|x|²/2) taken separately: overflow", tried=tried,
                 got="inf, NaN or 0 where the right features are ordinary numbers",
                 expected="finite features (the combined exponent ω·x − |x|²/2 is small)",
                 cause="you exponentiated ω·x (≈ 90: exp overflows float32 to inf) and −|x|²/2 (≈ −98: exp "
                       "underflows to 0) separately before multiplying, so inf · 0 = NaN",
                 fix="subtract inside one exp: torch.exp(x @ omega.T − |x|²/2)")
        _expect_close(suspects, out, expected, (x, omega), tried=tried, again=fn, fix=_RF_FIX,
                      oracle="exp(x Ωᵀ − |x|²/2) / √n_f in float64",
                      factors={"√n_f": math.sqrt(omega.shape[0]), "n_f": float(omega.shape[0])})
    return (f"matches exp(ω·x − |x|²/2)/√n_f on {len(cases)} cases (batch × heads, n_f = d, one feature, float32, "
            "exponents that overflow when split)")


# ============================================================================ exercise 5: block-sparse attention
_SPARSE_FIX = ("for query block i, visit only the key blocks j with layout[i, j] True, keeping 09's running max, "
               "sum and accumulator; divide once at the end")


def _mask(q: Tensor, k: Tensor, layout: Tensor, b: int) -> Tensor:
    """(n_q, n_k) True where the layout keeps the (query block, key block) tile."""
    return layout.repeat_interleave(b, 0)[:q.shape[-2]].repeat_interleave(b, 1)[:, :k.shape[-2]]


def _sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None = None) -> Tensor:
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask, scale=scale)


def _sparse_tiles(q: Tensor, k: Tensor, v: Tensor, layout: Tensor, b: int, mistake: str) -> Tensor:
    """09's loop over the layout's tiles (float64) with one mistake switched on."""
    q, k, v = q.double(), k.double(), v.double()
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
    for qb in range(layout.shape[0]):
        qs = q[..., qb * b:(qb + 1) * b, :] * (1 / math.sqrt(q.shape[-1]))
        m = torch.full(qs.shape[:-1] + (1,), -math.inf, dtype=torch.float64)
        l, acc = torch.zeros_like(m), torch.zeros(qs.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
        for kb in layout[qb].nonzero().flatten().tolist():
            s = qs @ k[..., kb * b:(kb + 1) * b, :].transpose(-2, -1)
            m_new = torch.maximum(m, s.amax(keepdim=True) if mistake == "tile_max" else s.amax(-1, keepdim=True))
            p = torch.exp(s if mistake == "no_max" else s - m_new)
            corr = torch.exp(m - m_new)
            if mistake == "tile_softmax":
                p = p / p.sum(-1, keepdim=True)
            l_corr = {"sum": 1.0, "l_plain": 1.0, "last": 0.0, "l_last": 0.0}.get(mistake, corr)
            acc_corr = {"sum": 1.0, "acc_plain": 1.0, "last": 0.0, "acc_last": 0.0}.get(mistake, corr)
            l = l * l_corr + p.sum(-1, keepdim=True)
            acc = acc * acc_corr + p @ v[..., kb * b:(kb + 1) * b, :]
            m = m_new
        out[..., qb * b:(qb + 1) * b, :] = {"division": acc, "mul": acc * l}.get(mistake, acc / l)
    return out


def _zero_filled(q: Tensor, k: Tensor, v: Tensor, layout: Tensor, b: int) -> Tensor:
    """Attention with the skipped tiles' scores set to 0 rather than left out."""
    s = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(~_mask(q, k, layout, b), 0.0), -1) @ v.double()


_SPARSE_TABLE = _table(_sparse_tiles, [
    ("tile_max", "one running maximum for all rows", "you took the maximum over the whole tile (amax without "
     "dim=-1), so a row whose scores are far below another row's underflows to 0 / 0", "keep one maximum per query "
     "row: s.amax(dim=-1, keepdim=True)"),
    ("sum", "running sum not rescaled", "when the maximum grows you add to ℓ and acc without multiplying them by "
     "exp(m_old − m_new)", "rescale ℓ and acc by exp(m_old − m_new) before adding the tile"),
    ("division", "final division missing", "you returned the accumulator without dividing by the running sum ℓ",
     "after the last tile, divide: acc / ℓ"),
    ("mul", "multiplied by the running sum instead of dividing", "you returned acc × ℓ instead of acc / ℓ",
     "after the last tile, divide: acc / ℓ"),
    ("last", "only the last tile counted", "ℓ and acc hold only the last kept tile's part: the running maximum is "
     "never updated (m = m_new missing, so m stays −inf and exp(m − m_new) = 0 wipes ℓ and acc at every tile), or ℓ "
     "and acc are overwritten instead of updated", "rescale and add: ℓ = ℓ·exp(m − m_new) + rowsum(p), acc likewise, "
     "then m = m_new"),
    ("l_last", "running sum ℓ overwritten at each tile", "you set ℓ to the tile's rowsum(p) instead of adding it to "
     "the rescaled ℓ, so only the last tile is in the denominator", "ℓ = ℓ·exp(m − m_new) + rowsum(p)"),
    ("acc_last", "accumulator overwritten at each tile", "you set acc to the tile's p @ v instead of adding it to "
     "the rescaled acc, so only the last tile is in the numerator", "acc = acc·exp(m − m_new) + p @ v_tile"),
    ("l_plain", "running sum ℓ not rescaled", "when the maximum grows you rescale acc but add to ℓ without "
     "multiplying it by exp(m_old − m_new)", "ℓ = ℓ·exp(m − m_new) + rowsum(p)"),
    ("acc_plain", "accumulator not rescaled", "when the maximum grows you rescale ℓ but add to acc without "
     "multiplying it by exp(m_old − m_new)", "acc = acc·exp(m − m_new) + p @ v_tile"),
    ("no_max", "maximum not subtracted inside exp", "you computed p = exp(s) instead of exp(s − m_new) while still "
     "rescaling ℓ and acc by exp(m − m_new), so the tiles are weighed inconsistently", "p = torch.exp(s − m_new)"),
    ("tile_softmax", "each tile normalised on its own", "you normalised each tile's probabilities by their own sum",
     "add the unnormalised p @ v_block to acc and divide by ℓ once, at the end"),
]) + [
    Known("block_layout_transposed", "block layout transposed", "you read layout[j, i] (key block, query block) "
          "instead of layout[i, j]: rows of the layout are query blocks, columns key blocks",
          "query block i visits the key blocks j with layout[i, j] True: layout[i].nonzero()",
          lambda q, k, v, layout, b: _sdpa(q, k, v, _mask(q, k, layout.T, b))),
    Known("layout_ignored_dense_attention", "layout ignored: dense attention", "every query sees every key: the "
          "layout's skipped tiles are not left out", _SPARSE_FIX, lambda q, k, v, layout, b: _sdpa(q, k, v, None)),
    Known("skipped_tiles_kept_with", "skipped tiles kept with weight", "the skipped tiles' scores were set to 0 "
          "instead of being left out, so their keys still get weight exp(0 − m)", "leave the skipped tiles out of "
          "the softmax entirely (or mask them with −inf)", _zero_filled),
    # the scale of the scores: (key, summary, cause, fix, the scale as a function of q)
    *[Known(key, summary, cause, fix, lambda q, k, v, layout, b, scale=scale: _sdpa(
        q, k, v, _mask(q, k, layout, b), scale=scale(q))) for key, summary, cause, fix, scale in [
        ("scores_not_scaled", "scores not scaled", "you did not multiply q kᵀ by 1/√d_k",
         "scale the scores by 1 / math.sqrt(d_k)", lambda q: 1.0),
        ("divided_by_d_k", "divided by d_k instead of √d_k", "you divided the scores by d_k",
         "scale by 1 / math.sqrt(d_k)", lambda q: 1 / q.shape[-1]),
        ("scores_multiplied_by_d", "scores multiplied by √d_k instead of divided", "you multiplied q kᵀ by √d_k (or "
         "divided q by 1/√d_k)", "scale the scores by 1 / math.sqrt(d_k)", lambda q: math.sqrt(q.shape[-1])),
        ("scaled_by_1_n", "scaled by 1/√n_q instead of 1/√d_k", "you took the size of the wrong axis: q.shape[-2] "
         "(the number of queries) instead of q.shape[-1] (d_k)", "scale by 1 / math.sqrt(q.shape[-1])",
         lambda q: 1 / math.sqrt(q.shape[-2]))]],
]


def _sparse_measured(fn: Learner, failure: Failure, out: Tensor, expected: Tensor, case: tuple) -> None:
    """Fail with what the query blocks show: right exactly where one key block is kept, or only some wrong; else
    with what the learner's function gives when each query block keeps one key block only (its first): right
    there means the tiles are combined wrongly, wrong there means one tile's own work is wrong."""
    q, k, v, layout, b = case
    right = _blocks_right(out, expected, b)
    if right is None:
        return
    wrong, kept = [i for i, r in enumerate(right) if not r], [int(t) for t in layout.sum(-1)]
    shown = ", ".join(map(str, wrong[:8]))
    if wrong and len(wrong) < len(right) and all(r == (t == 1) for r, t in zip(right, kept)):
        _refail(failure, "wrong where a query block keeps several key blocks", f"the query blocks that keep one key "
                f"block are right and those that keep several ({shown}) are wrong: one tile alone is right, so what "
                "goes wrong is " + _COMBINED, _SPARSE_FIX)
    if wrong and len(wrong) < len(right):
        rows = ", ".join(f"{i * b}–{min((i + 1) * b, out.shape[-2]) - 1}" for i in wrong[:6])
        _refail(failure, f"wrong only in query blocks {shown}", f"query blocks {shown} (rows {rows}) are wrong and the "
                f"other {len(right) - len(wrong)} right: compare what your loop does for those blocks (their key "
                "blocks: " + "; ".join(f"{i}: {layout[i].nonzero().flatten().tolist()}" for i in wrong[:4]) + ")",
                _SPARSE_FIX)
    one = torch.zeros_like(layout)
    one[torch.arange(layout.shape[0]), layout.float().argmax(-1)] = True  # each row's first kept key block
    mine = call_or_skip(lambda: as_tensor(fn(q, k, v, one, b), tried=failure.diagnosis.tried))
    if mine is None or tuple(mine.shape) != tuple(out.shape) or bool((layout.sum(-1) == 1).all()):
        return
    if same(mine, _sdpa(q, k, v, _mask(q, k, one, b)), **_tol(torch.float32)):
        _refail(failure, "right with one tile per query block, wrong with several", "with a layout that keeps one key "
                "block per query block your function is right, with several it is not: what goes wrong is "
                + _COMBINED, _SPARSE_FIX)
    _refail(failure, "wrong even with one tile per query block", "with a layout that keeps one key block per query "
            f"block your result is wrong as well{' (NaN)' if bool(torch.isnan(mine).any()) else ''}: the error is in "
            "what one tile computes (its scores q kᵀ/√d_k, p = exp(s − m), ℓ, acc, or the final acc / ℓ), not only "
            "in how tiles are combined", _SPARSE_FIX)


_COMBINED = ("how the tiles of a query block are combined (the running maximum m, and the rescaling of ℓ and acc "
             "by exp(m_old − m_new))")
_SPARSE_CASES = [  # (label, (batch axes, n_q, n_k, d_k, d_v), block size)
    ("q, k (32, 4), v (32, 3), 4 × 4 tiles of 8", ((), 32, 32, 4, 3), 8),
    ("q, k, v (2, 3, 24, 4) (batch × heads), tiles of 4", ((2, 3), 24, 24, 4, 4), 4),
    ("q (21, 4), k (30, 4), v (30, 2): n not a multiple of the block (tiles of 8)", ((), 21, 30, 4, 2), 8),
    ("q, k (10, 3), v (10, 2), tiles of 1", ((), 10, 10, 3, 2), 1),
    ("q, k (2, 20, 4) with scores in the hundreds and query 0's in the tens of thousands (each row needs its own "
     "maximum), v (2, 20, 3), tiles of 4", ((2,), 20, 20, 4, 3), 4),
    ("q, k (2, 16, 8), v (2, 16, 4) in float32, tiles of 4", ((2,), 16, 16, 8, 4), 4),
]


def _layout(rows: int, cols: int, seed: int) -> Tensor:
    """A random, asymmetric layout with at least one tile per row (and the diagonal for square ones)."""
    layout = torch.rand(rows, cols, generator=torch.Generator().manual_seed(seed)) < 0.35
    layout[torch.arange(rows), torch.arange(rows) % cols] = True
    return layout


@check("block_sparse_attention",
       expects="a function block_sparse_attention(q, k, v, layout, block_size) returning a tensor (..., n_q, d_v)")
def check_block_sparse_attention(fn: Learner) -> str:
    suspects = Suspects(_SPARSE_TABLE)
    for i, (label, (lead, n_q, n_k, d_k, d_v), b) in enumerate(_SPARSE_CASES):
        big = "hundreds" in label
        q, k, v = _qkv(lead, n_q, n_k, d_k, d_v, 500 + i, scale=12.0 if big else 1.0, dtype=_dtype(label))
        if big:
            q[..., 0, :] *= 100.0
        layout = _layout(-(-n_q // b), -(-n_k // b), 510 + i)
        case, tried = (q, k, v, layout, b), f"block_sparse_attention(q, k, v, layout, {b}) on {label}"
        out, expected = as_tensor(fn(*case), tried=tried), _sdpa(q, k, v, _mask(q, k, layout, b))
        _expect_close(suspects, out, expected, case, tried=tried, again=fn, fix=_SPARSE_FIX,
                      oracle="F.scaled_dot_product_attention with the layout's mask",
                      factors={"√d_k": math.sqrt(d_k), "block_size": float(b)},
                      measured=lambda failure: _sparse_measured(fn, failure, out, expected, case))
    n, d_k, d_v, b = 48, 6, 2, 8
    layout = _layout(n // b, n // b, 521)
    tried = f"block_sparse_attention(q, k, v, layout, {b}) on q, k ({n}, {d_k}), v ({n}, {d_v}), counting its work"
    seen = fn.observe("beyond.work", *_qkv((), n, n, d_k, d_v, 520), layout, b)
    needed, dense, flops = 2.0 * b * b * (d_k + d_v) * int(layout.sum()), 2.0 * n * n * (d_k + d_v), seen["flops"]
    kept = f"the {int(layout.sum())} tiles of {layout.numel()} the layout keeps"
    if fused := [op for op in seen["ops"] if "scaled_dot_product" in op or "multi_head_attention" in op]:
        fail("skipped blocks still computed: a fused attention call", tried=tried,
             got=f"a call to {fused[0]} (with the layout as a mask, presumably)",
             expected=f"only {kept}, computed by your loop",
             cause="the values are right, but the fused kernel computes every tile of the score matrix and masks "
                   "the skipped ones afterwards: the work is dense",
             fix="loop over layout[i].nonzero() for each query block i and compute only those tiles with @")
    full = _squares(seen, n)
    if flops > needed * 1.05 or full:
        fail("skipped blocks still computed", tried=tried,
             got=f"{flops:.0f} matrix-multiply FLOPs ({flops / dense:.0%} of dense attention's)"
                 + (f" and a tensor of shape {full[0]}" if full else ""),
             expected=f"at most {needed:.0f} FLOPs: {kept} ({needed / dense:.0%} of dense)",
             cause="the values are right, but your code also computes the tiles the layout leaves out (a full "
                   "score matrix masked afterwards, or every tile visited and then dropped): the work is dense",
             fix="loop over layout[i].nonzero() for each query block i and compute only those tiles")
    return (f"matches F.scaled_dot_product_attention with the layout's mask on {len(_SPARSE_CASES)} cases and "
            "computes only the tiles the layout keeps")
