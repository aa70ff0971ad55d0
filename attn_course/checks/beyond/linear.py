"""Checks of notebook 13's exercises 1–3, linear attention in three forms (``linear_attention``,
``causal_linear_attention``, ``chunked_linear_attention``), with the kernel-attention forms their oracle and
their mistakes are computed with."""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..compare import Failure, as_tensor, call_or_skip, fail, fail_again, same
from ..core import Learner, check
from ..kit import Known, Suspects, expect_unchanged, variants
from .judge import blocks_right, dtype_of, expect_close_at_dtype, no_square, qkv, rows_right, tolerance


# ============================================================================ the forms, for the oracle and the mistakes
def _elu1(x: Tensor) -> Tensor:
    return F.elu(x.double()) + 1


def _kernel(fq: Tensor, fk: Tensor, v: Tensor, *, causal: bool = False, future: bool = False,
            normalise: bool = True) -> Tensor:
    """A v / rowsum(A) in float64, A = fq fkᵀ, masked to j ≤ i when causal, to j ≥ i when ``future``."""
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
    ("relu(x) + 1", "positive, but not the docstring's map: every negative entry becomes 1 where elu + 1 gives "
     "exp(x)", lambda x: torch.relu(x.double()) + 1),
]


def _phi_table(causal: bool) -> list[Known]:
    """Kernel attention with a wrong feature map on q, on k or on both; or with q (and k) scaled by 1/√d_k."""
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
    on_v = [("φ = elu(x) + 1", "", _elu1), *(m for m in _MAPS if not m[0].startswith("no feature"))]  # φ(v) ≠ v
    for what, why, phi in on_v:  # the map applied to v as well
        summary = ("φ" if phi is _elu1 else what if what.startswith("φ") else "φ = " + what) + " applied to v too"
        found.append(Known(summary, summary, f"you applied {what} to v as well as to q and k: the values are averaged "
                           "as they are, only q and k go through the feature map" + (f"; and {why}" if why else ""),
                           _PHI_FIX, lambda q, k, v, *_, phi=phi: _kernel(phi(q), phi(k), phi(v), causal=causal)))
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
#: Rows the recurrence and the chunkwise form share: the states started at ones, the normaliser multiplied.
_ONES_C = ("ones_C", "state C starts at ones", _ONES_CAUSE.format(what="state C"), "start from C = torch.zeros(…)")
_ONES_U = ("ones_u", "normaliser state u starts at ones", _ONES_CAUSE.format(what="normaliser state u"),
           "start from u = torch.zeros(…)")
_ONES = ("ones", "states C and u start at ones", _ONES_CAUSE.format(what="state C and the normaliser state u").replace(
    "so it starts", "so each starts"), "start from C = torch.zeros(…) and u = torch.zeros(…)")
_MUL = ("mul", "multiplied by the normaliser instead of dividing", _MUL_CAUSE, _MUL_FIX)


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
        q, k, v = qkv(lead, n_q, n_k, d_k, d_v, 100 + i, scale=scale, dtype=dtype_of(label))
        tried = f"linear_attention(q, k, v) on {label}"
        expect_close_at_dtype(suspects, as_tensor(fn(q, k, v), tried=tried), _kernel(_elu1(q), _elu1(k), v), (q, k, v),
                              tried=tried, again=fn, oracle="φ(q) (φ(k)ᵀ v) / φ(q) Σ φ(k) with φ = elu + 1, in float64",
                              fix=_LINEAR_FIX, factors={"n_k": float(n_k)}, normaliser="φ(q_i)ᵀ Σ_j φ(k_j)")
    no_square(fn, 64, "linear_attention(q, k, v) on q, k (64, 3), v (64, 2), watching the shapes it builds",
              "sum over the keys first: kv = φ(k)ᵀ v and u = φ(k).sum(-2); then φ(q) @ kv and φ(q) @ u",
              *qkv((), 64, 64, 3, 2, 120))
    expect_unchanged(fn, qkv((), 6, 5, 3, 2, 121), call="linear_attention(q, k, v)", name="q",
                     shown="q (6, 3), k (5, 3), v (5, 2), float64", others=("k", "v"))
    return (f"matches φ(q)(φ(k)ᵀv) / φ(q)Σφ(k) on {len(_LINEAR_CASES)} cases (n_q ≠ n_k, batch × heads, one "
            "query, large entries, float32) without an n × n matrix")


# ============================================================================ exercise 2: the recurrence
_RECUR_FIX = ("for t = 0 … n − 1: first C = C + φ(k_t) v_tᵀ and u = u + φ(k_t), then out_t = φ(q_t)ᵀ C / φ(q_t)ᵀ u")


def _start(fq: Tensor, v: Tensor, mistake: str, *u_shape: int) -> tuple[Tensor, Tensor]:
    """The states C (d_k × d_v) and u (d_k, ``*u_shape``): zeros, or ones under the mistakes that start them so."""
    zeros_or_ones = lambda *keys: torch.ones if mistake in keys else torch.zeros  # noqa: E731
    return (zeros_or_ones("ones", "ones_C")(fq.shape[:-2] + (fq.shape[-1], v.shape[-1]), dtype=torch.float64),
            zeros_or_ones("ones", "ones_u")(fq.shape[:-2] + (fq.shape[-1], *u_shape), dtype=torch.float64))


def _recurrence(q: Tensor, k: Tensor, v: Tensor, mistake: str = "") -> Tensor:
    """The recurrence in float64 with one mistake switched on."""
    fq, fk, v = _elu1(q), _elu1(k), v.double()
    state, norm = _start(fq, v, mistake)
    rows = []
    for t in range(fq.shape[-2]):
        before, before_norm = state, norm
        add = v[..., t, None, :].expand_as(state) if mistake == "no_phik" else fk[..., t, :, None] * v[..., t, None, :]
        state = add if mistake in ("reset", "reset_C") else state + add
        norm = fk[..., t, :] if mistake in ("reset", "reset_u") else norm + fk[..., t, :]
        use, use_norm = (before, before_norm) if mistake.startswith("late") else (state, norm)
        num = (fq[..., t, None, :] @ use)[..., 0, :]
        den = {"no_phiq": use_norm, "no_u": fq[..., t, :]}.get(mistake, fq[..., t, :] * use_norm).sum(
            0 if mistake == "axis0" else -1, keepdim=True)
        row = num * den if mistake == "mul" else num if mistake == "no_norm" else num / den
        rows.append(torch.where(den > 0, row, torch.zeros_like(row)) if mistake == "late_guarded" else row)
    return torch.stack(rows, dim=-2)


def _transposed_state(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The state built as v_t φ(k_t)ᵀ (d_v × d_k, needs d_k = d_v): out_t = Σ_{j ≤ t} (φ(q_t)·v_j) φ(k_j) / φ(q_t)ᵀ u_t."""
    fq, fk, v = _elu1(q), _elu1(k), v.double()
    keep = torch.ones(fq.shape[-2], fq.shape[-2], dtype=torch.float64).tril()
    return (((fq @ v.transpose(-2, -1)) * keep) @ fk) / ((fq @ fk.transpose(-2, -1)) * keep).sum(-1, keepdim=True)


_LATE_CAUSE = ("you computed out_t from the state before adding token t (C_{t−1} instead of C_t): every "
               "position misses its own key and value")
_CAUSAL_TABLE = variants(_recurrence, [
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
    _ONES_C, _ONES_U, _ONES,
    ("no_phik", "φ(k_t) missing from the state update", "you added v_t to every row of C instead of φ(k_t) v_tᵀ, so "
     "the numerator weighs every earlier value by the sum of φ(q_t), not by φ(q_t)·φ(k_j)", _RECUR_FIX),
    _MUL,
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
    attention computed densely; a failure no known mistake explains is measured."""
    suspects = Suspects(table)
    for i, (label, (lead, n, d_k, d_v), scale, c) in enumerate(_CAUSAL_CASES):
        q, k, v = qkv(lead, n, n, d_k, d_v, seed + i, scale=scale, dtype=dtype_of(label))
        case = (q, k, v, c) if chunked else (q, k, v)
        tried = f"{name}(q, k, v{f', {c}' if chunked else ''}) on {label}"
        out = as_tensor(fn(*case), tried=tried)
        expected = _kernel(_elu1(q), _elu1(k), v, causal=True)

        def measured(failure: Failure) -> None:
            _loop_bound(failure, out, expected, d_k, case[3] if chunked else 1)
            if chunked:
                _chunks_measured(fn, failure, out, expected, case)

        expect_close_at_dtype(suspects, out, expected, case, tried=tried, again=fn, measured=measured, fix=fix,
                              oracle="causal kernel attention computed densely in float64",
                              factors=None if chunked else {"d_k": float(d_k)}, normaliser="φ(q_t)ᵀ Σ_{j ≤ t} φ(k_j)")


def _loop_bound(failure: Failure, out: Tensor, expected: Tensor, d_k: int, c: int) -> None:
    """Fail when exactly the rows a loop over range(0, d_k, c) covers are right: a bound of q.shape[-1], not n."""
    n = expected.shape[-2]
    done = min(n, -(-d_k // c) * c)
    if done >= n or tuple(out.shape) != tuple(expected.shape):
        return
    close = rows_right(out, expected)
    if bool(close[..., :done].all()) and not bool(close[..., done:].any()):
        fail_again(failure, f"only the first {done} rows computed: loop bound d_k instead of n",
               f"rows 0 … {done - 1} are right and every later row is wrong: your loop stops at d_k = {d_k}"
               + ("" if c == 1 else " (after the chunks that start before it)") + ", as a range over q.shape[-1] "
               f"(the features) does, where the positions are q.shape[-2] (n = {n})",
               "loop over the positions: range(q.shape[-2])" + ("" if c == 1 else " in steps of chunk_size"))


@check("causal_linear_attention",
       expects="a function causal_linear_attention(q, k, v) returning a tensor (..., n, d_v)")
def check_causal_linear_attention(fn: Learner) -> str:
    _run_causal(fn, "causal_linear_attention", _CAUSAL_TABLE, 200, chunked=False, fix=_RECUR_FIX)
    expect_unchanged(fn, qkv((), 6, 6, 3, 2, 221), call="causal_linear_attention(q, k, v)", name="q",
                     shown="q, k (6, 3), v (6, 2), float64", others=("k", "v"))
    no_square(fn, 40, "causal_linear_attention(q, k, v) on q, k (40, 3), v (40, 2), watching the shapes it builds",
              "carry only the state C (d_k, d_v) and u (d_k) from one position to the next, as the docstring's loop",
              *qkv((), 40, 40, 3, 2, 220))
    return (f"matches causal kernel attention on {len(_CAUSAL_CASES)} cases (batch × heads, one position, large "
            "entries, float32), carrying only the state")


# ============================================================================ exercise 3: chunkwise
_CHUNK_FIX = ("for each chunk [s, e): A = (φ(q_c) φ(k_c)ᵀ) with the lower triangle kept, diagonal included; "
              "numerator A v_c + φ(q_c) C, normaliser rowsum(A) + φ(q_c) u; only then C += φ(k_c)ᵀ v_c, "
              "u += Σ φ(k_c)")


def _chunked(q: Tensor, k: Tensor, v: Tensor, c: int, mistake: str = "") -> Tensor:
    """The chunkwise form in float64 with one mistake switched on."""
    fq, fk, v = _elu1(q), _elu1(k), v.double()
    n, (state, norm) = fq.shape[-2], _start(fq, v, mistake, 1)
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


_CHUNK_TABLE = variants(_chunked, [
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
    _ONES_C,
    ("no_own", "the chunk's own keys missing from the numerator", "the numerator is only φ(q_c) C (the earlier "
     "chunks): A v_c, the chunk's own masked part, is left out while the normaliser counts it", _CHUNK_FIX),
    ("elementwise", "A * v_c instead of A @ v_c", "you multiplied A and v_c entry by entry (*) where the chunk's own "
     "part is a matrix product (@); the shapes fit only because d_v = chunk_size here", "a @ v_c"),
    _ONES_U, _ONES,
    ("colsum", "row sums of A taken over the queries", "you summed A = φ(q_c) φ(k_c)ᵀ over dim=-2 (down its columns, "
     "over the queries) instead of over the keys (along its rows); the (1, c) result + φ(q_c) u (c, 1) even "
     "broadcasts to a (c, c) matrix", "a.sum(dim=-1, keepdim=True)"),
    ("no_keepdim", "keepdim missing in the row sum: the normaliser broadcast to (c, c)",
     "a.sum(dim=-1) without keepdim=True has shape (c,), which + φ(q_c) u (c, 1) broadcasts to a (c, c) matrix, so "
     "each row is divided by other rows' sums (the shapes fit only because d_v = chunk_size here)",
     "a.sum(dim=-1, keepdim=True)"),
    _MUL,
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
    """Which chunks are wrong; else what the learner's function gives on the whole sequence as one chunk."""
    q, k, v, c = case
    n, right = q.shape[-2], blocks_right(out, expected, c)
    if right is None or len(right) < 2:
        return
    if n % c and all(right[:-1]) and not right[-1]:
        fail_again(failure, f"wrong only in the last, shorter chunk (rows {n - n % c} … {n - 1})",
               f"n = {n} is not a multiple of chunk_size = {c}, and your loop mishandles the last {n % c} positions "
               "(a range that stops before them, or a chunk length taken as chunk_size)",
               "loop with range(0, n, chunk_size) and use each chunk's own length for its mask")
    if right[0] and not any(right[1:]):
        fail_again(failure, "only the first chunk right", f"rows 0 … {c - 1} (the first chunk, which sees no earlier "
               "chunk) are right and every later chunk is wrong: what a chunk takes from the chunks before it, "
               "φ(q_c) C and φ(q_c) u with the carried state, goes wrong (how C and u are updated, or how they are "
               "read)", _CHUNK_FIX)
    whole = call_or_skip(lambda: as_tensor(fn(q, k, v, n), tried=failure.diagnosis.tried))
    if whole is None or tuple(whole.shape) != tuple(out.shape):
        return
    if same(whole, expected, **tolerance(torch.float32)):
        fail_again(failure, "right as one chunk, wrong with several", f"with chunk_size = n (one chunk) your function is "
               f"right, with chunks of {c} it is not: what goes wrong is what passes from chunk to chunk (the state C "
               "and u: how they are updated, or how φ(q_c) C and φ(q_c) u are added)", _CHUNK_FIX)
    fail_again(failure, "wrong even as one chunk", "with chunk_size = n (the whole sequence as one chunk, no state "
           "carried) your result is wrong as well: the error is in the work inside a chunk (A = φ(q_c) φ(k_c)ᵀ with "
           "its causal mask, A v_c, the row sums of A, or the division)", _CHUNK_FIX)


@check("chunked_linear_attention",
       expects="a function chunked_linear_attention(q, k, v, chunk_size) returning a tensor (..., n, d_v)")
def check_chunked_linear_attention(fn: Learner) -> str:
    _run_causal(fn, "chunked_linear_attention", _CHUNK_TABLE, 300, chunked=True, fix=_CHUNK_FIX)
    expect_unchanged(fn, (*qkv((), 7, 7, 3, 2, 321), 3), call="chunked_linear_attention(q, k, v, 3)", name="q",
                     shown="q, k (7, 3), v (7, 2), float64", others=("k", "v"))
    n, d_k, d_v = 48, 3, 2
    for c, seed in ((6, 320), (8, 321)):
        tried = f"chunked_linear_attention(q, k, v, {c}) on q, k ({n}, {d_k}), v ({n}, {d_v}), watching what it builds"
        seen = no_square(fn, n, tried, "work chunk by chunk: only (chunk_size, chunk_size) blocks of φ(q) φ(k)ᵀ",
                         *qkv((), n, n, d_k, d_v, seed), c)
        if not seen["shapes"] and not seen["products"]:
            continue  # no torch tensor built at all (the work done in NumPy): nothing to count the chunks by
        # (c, c) blocks made by matrix products: one product per chunk, or one batched over every chunk
        squares = sum(int(count) * math.prod(shape[:-2]) for shape, count in seen["products"]
                      if tuple(shape[-2:]) == (c, c))
        if squares < n // c:
            fail("not computed in chunks of chunk_size", tried=tried,
                 got=f"{squares} ({c}, {c}) blocks from matrix products",
                 expected=f"at least {n // c}: one (chunk_size, chunk_size) block φ(q_c) φ(k_c)ᵀ per chunk",
                 cause="the values are right, but your code works another way (one token at a time, or chunks of "
                       "another size): chunk_size is not used as the docstring asks",
                 fix="cut the sequence into chunks of chunk_size positions and compute each chunk's φ(q_c) φ(k_c)ᵀ "
                     "with one matrix product")
    return (f"matches causal kernel attention on {len(_CAUSAL_CASES)} cases (chunks of 1 to 5, n not a multiple "
            "of the chunk) and works in (chunk_size, chunk_size) blocks")
