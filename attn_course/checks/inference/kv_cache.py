"""The check of KVCache: append keeps every token, oldest first, in its own cache; attend(q) of the newest
token equals causal attention over the cache. Its cases, the known mistakes of append and attend."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import torch

from ..compare import Failure, fail_again, same
from ..core import Learner, LearnerRaised, LearnerTimedOut, as_tensor, check, fail, learner_error
from ..kit import (Known, Suspects, call_explained, expect_dtype, expect_float64_precision, expect_unchanged,
                   explain_raise, lower_precision, unpack)
from .oracle import LOOSE, PATTERNS, attn, rows, sdpa, tolerance

_AXIS_FROM_FRONT = ("IndexError", r"Dimension out of range", "your code numbers an axis from the front (transpose(2, "
                    "3), dim=2), which does not exist with fewer leading axes",
                    "count axes from the end: the sequence axis is dim=-2, K.transpose(-2, -1)")
_FIX_APPEND = "torch.cat([cached, new], dim=-2): the sequence axis, new tokens after the cached ones"
_WRONG_AXIS = "cache appended on the wrong axis"
_SHARED_FIX = "create the storage in __init__: self.k = self.v = None"


def _kept(old, part):
    return part if old is None else torch.cat([old, part], dim=-2)


#: A case of append: (old, new, keys) = the right cache before this call (None at first), the new tokens, the right
#: K (when judging V). (Caches sharing their storage are named by _expect_cache.)
APPEND = [
    *[Known(f"kept_{which}", f"append kept only the {which} of several new tokens", f"when a prompt arrives at once, "
            f"you stored only its {which} token", "store every new token: torch.cat([cached, k], dim=-2)",
            lambda old, new, *_, i=i: _kept(old, new[..., i:i + 1 or None, :]) if new.shape[-2] > 1 else None)
      for which, i in (("first", 0), ("last", -1))],
    Known("new_first", "cache appended in the wrong order", "you put the new token before the cached ones",
          "new tokens go last: " + _FIX_APPEND, lambda old, new, *_: torch.cat([new, old], dim=-2)),
    Known("stale", "returned the cache before appending", "you returned the cache as it was before the new token",
          "append first, then return the whole cache", lambda old, new, *_: old),
    *[Known(f"cat{dim}", _WRONG_AXIS, f"you concatenated along {axis}, not the sequence axis (-2)", _FIX_APPEND,
            lambda old, new, *_, dim=dim: torch.cat([old, new], dim=dim))
      for dim, axis in ((-1, "the feature axis (-1)"), (-3, "axis -3"), (-4, "axis -4"))],
    *[Known(f"stack{dim}", _WRONG_AXIS, "you stacked the tokens along a new axis instead of concatenating them along "
            "the sequence axis (-2)", _FIX_APPEND,
            lambda old, new, *_, dim=dim: torch.stack([new] if old is None else [old, new], dim=dim))
      for dim in range(-5, 0)],
    Known("keys_as_v", "append returned the keys as V", "the second element append returns is the keys",
          "return self.k, self.v", lambda old, new, keys: keys),
]


def _scaled(q, K, scale=None) -> torch.Tensor:
    return q.double() @ K.double().mT * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)


_ITSELF = ("the newest token does not attend to itself", "your query sees the tokens before it but not its own key",
           "append the new k and v first, then attend over every cached key")
#: A case of attend: (q, K, V) = the newest query (..., 1, d_k) and the right cache.
ATTEND = [Known(*row) for row in [
    ("naive", "no maximum subtracted", "your softmax exponentiates the raw scores: e^100 overflowed (inf/inf = NaN)",
     "use torch.softmax (or subtract each row's maximum before exp)", lambda q, K, V: attn(q, K, V, naive=True)),
    ("no_self", *_ITSELF, lambda q, K, V: attn(q, K[..., :-1, :], V[..., :-1, :])),
    # the same, where a lone first token does see itself (a guard): no verdict on that first token
    ("no_self_after_first", *_ITSELF, lambda q, K, V: attn(q, K[..., :-1, :], V[..., :-1, :]) if K.shape[-2] > 1
     else None),
    ("no_self_nan", *_ITSELF, lambda q, K, V: torch.full(q.shape[:-1] + V.shape[-1:], math.nan, dtype=torch.float64)
     if K.shape[-2] == 1 else None),
    ("unscaled", "scores not scaled", "you did not divide the scores by √d_k", "divide q Kᵀ by math.sqrt(d_k)",
     lambda q, K, V: attn(q, K, V, scale=1.0)),
    ("by_dk", "divided by d_k instead of √d_k", "you divided the scores by d_k", "divide by math.sqrt(d_k)",
     lambda q, K, V: attn(q, K, V, scale=1 / q.shape[-1])),
    ("dim", "softmax over the wrong axis", "you took the softmax over the query axis (-2): with one query every "
     "weight is 1", "torch.softmax(scores, dim=-1): over the keys", lambda q, K, V: attn(q, K, V, dim=-2)),
    ("top_left", "top-left alignment used for decode", "your query sees only key 0: is_causal=True (or tril over "
     "(1, t)) aligns the mask at the top-left corner", "one new query sees every cached key: no mask (or a "
     "bottom-right one)", lambda q, K, V: V[..., :1, :].double() if K.shape[-2] > 1 else None),
    ("newest", "attended only to the newest token", "your output is the newest token's value: the query saw one key",
     "attend over the whole K and V", lambda q, K, V: V[..., -1:, :].double() if K.shape[-2] > 1 else None),
    ("k_as_v", "weights multiplied by K, not V", "you multiplied the weights by the keys", "output = weights @ V",
     lambda q, K, V: attn(q, K, K)),
    ("weights", "returned the weights, not the output", "attend returned softmax(q Kᵀ / √d_k), shape (..., 1, t)",
     "return weights @ V, shape (..., 1, d_v)", lambda q, K, V: torch.softmax(_scaled(q, K), dim=-1)),
    ("no_softmax", "no softmax", "you multiplied V by the scaled scores, not by their softmax",
     "weights = torch.softmax(scores, dim=-1), then weights @ V", lambda q, K, V: _scaled(q, K) @ V.double()),
    ("mean", "uniform weights: the mean of V", "your output is the plain average of the cached values, whatever the "
     "scores", "weight each value by softmax(q Kᵀ / √d_k)",
     lambda q, K, V: V.double().mean(-2, keepdim=True) if K.shape[-2] > 1 else None),
    ("by_dv", "scores divided by √d_v instead of √d_k", "you scaled by the values' width d_v",
     "divide by math.sqrt(q.shape[-1]) (d_k)",
     lambda q, K, V: attn(q, K, V, scale=1 / math.sqrt(V.shape[-1])) if V.shape[-1] != q.shape[-1] else None)]]


_SLOTS_FIX = "attend over the filled part only: self.k[..., :self.t, :] and self.v[..., :self.t, :]"


def _slots(out: torch.Tensor, case: tuple) -> int | None:
    """Z when attend's output ``out`` on ``case`` = (q, K, V) is softmax(q Kᵀ/√d_k) V rescaled by Σ/(Σ + Z), Σ the
    softmax's sum of e^score over the cached keys: what Z extra all-zero keys and values give (Z = 0: right)."""
    q, K, V = case
    if tuple(out.shape) != tuple(q.shape[:-1] + V.shape[-1:]) or not bool(torch.isfinite(out).all()):
        return None
    right, total = sdpa(q, K, V).double(), torch.exp(_scaled(q, K)).sum(-1)  # (..., 1, d_v), (..., 1)
    if not bool(torch.isfinite(total).all()):
        return None
    ratio = (out.double() * right).sum(-1) / (right * right).sum(-1).clamp_min(1e-300)  # out ≈ ratio · right
    return round(float((total * (1 - ratio) / ratio.clamp_min(1e-300)).median()))


def _zero_slots(failure: Failure, out: torch.Tensor, case: tuple, tol: dict, steps: list) -> None:
    """Fail when attend's output is attention over the cached keys plus Z all-zero keys and values (one Z for every
    row): a preallocated buffer attended over whole, its unfilled slots included. A buffer's unfilled slots change
    in number as tokens are appended (or it grows): Z must differ at some step of the same cache (``steps``: its
    (case, output) pairs), or the output is only rescaled by Σ/(Σ + Z), as `e / (e.sum() + 1)` does."""
    q, K, V = case
    z = _slots(out, case)
    if z is None or z < 1 or len({_slots(o, c) for c, o in steps} - {z}) == 0:
        return
    pad = lambda x: torch.cat([x.double(), x.new_zeros(*x.shape[:-2], z, x.shape[-1]).double()], -2)  # noqa: E731
    right, padded = sdpa(q, K, V).double(), sdpa(q.double(), pad(K), pad(V))
    if same(out, padded, **tol) and not same(padded, right, **tol):
        fail_again(failure, "attended over unfilled zero slots of the buffer", "your output is attention over "
                   f"{_count(K.shape[-2], 'cached token')} plus {_count(z, 'slot')} whose key and value are all 0: the "
                   "unfilled slots of a preallocated buffer, each with score 0, so weight e⁰ = 1 in the softmax's sum",
                   _SLOTS_FIX)


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


def _attend_constructs(q, K, V) -> list:
    """Wrong constructs whose exception attend may raise, reproduced on this call's q and cache."""
    matmul, last_two = "use the @ operator, which takes any leading axes", "transpose the last two axes: K.mT"
    return [("on batched input, K.T reverses every axis (the batch axes too)", last_two,
             lambda: q @ K.permute(*reversed(range(K.dim())))),
            ("K.t() works on 2-D matrices only", last_two, lambda: K.t()),
            ("torch.mm multiplies 2-D matrices only", matmul, lambda: torch.mm(q, K.mT)),
            ("torch.bmm needs exactly 3-D tensors", matmul, lambda: torch.bmm(q, K.mT)),
            ("you computed the scores with V instead of K (q Vᵀ: d_v ≠ d_k here)",
             "scores = q @ K.mT / math.sqrt(d_k)", lambda: q @ V.mT)]


def _cache_cases() -> list[tuple[str, tuple, list[int]]]:
    g = torch.Generator().manual_seed(11)

    def qkv(lead, n, d_k, d_v, dtype=torch.float64, scale=1.0):
        q, k = (torch.randn(*lead, n, d_k, generator=g, dtype=torch.float64) * scale for _ in range(2))
        return q.to(dtype), k.to(dtype), torch.randn(*lead, n, d_v, generator=g, dtype=torch.float64).to(dtype)

    return [("batch 2 × heads 3, 6 tokens one at a time, d_k = 8, d_v = 5", qkv((2, 3), 6, 8, 5), [1] * 6),
            ("batch and heads of size 1, float32, 5 tokens, d_k = d_v = 4", qkv((1, 1), 5, 4, 4, torch.float32),
             [1] * 5),
            ("no batch axes (k is (1, 6)), 4 tokens, d_v = 3", qkv((), 4, 6, 3), [1] * 4),
            ("a prompt of 4 tokens appended at once, then 3 tokens one at a time, batch 2 × heads 2",
             qkv((2, 2), 7, 6, 4), [4, 1, 1, 1]),
            ("scores up to ±100, float32 (a softmax must subtract the row maximum)",
             qkv((2,), 5, 4, 3, torch.float32, scale=6.0), [1] * 5),
            ("a longer sequence: 3 tokens at once, then 21 one at a time, no batch axes, d_k = 3, d_v = 2",
             qkv((), 24, 3, 2), [3] + [1] * 21),
            ("a prompt of 2 tokens, then 3 at once on a filled cache (chunked prefill), then 1, batch 2",
             qkv((2,), 6, 4, 3), [2, 3, 1]),
            # a cache keeps every token: a buffer of a fixed size (64, …, 4,096 slots) must grow
            ("a long prompt: 4,096 tokens at once, then 4 one at a time, no batch axes, d_k = d_v = 2",
             qkv((), 4100, 2, 2), [4096] + [1] * 4)]


def _construct(cls: Learner) -> Learner:
    try:
        return cls.construct()
    except LearnerRaised as exc:
        raise Failure(learner_error(exc, tried="KVCache()", expected="an empty cache",
                                    fix="KVCache() takes no arguments: start with self.k = self.v = None")) from None


_SHARE = "(a class attribute such as `keys = []` in the class body)"
_SHARED_AT_FIRST = ("RuntimeError", r"must match", f"the first append to a new KVCache() found tokens already stored: "
                    f"every KVCache object shares the storage {_SHARE}", _SHARED_FIX)


def _full_buffer(k, cached: int):
    """The constructs of a buffer of c slots, ``cached`` ≤ c < ``cached`` + n (c ≥ 1), too small for the n new tokens
    ``k``: each writes them past its end, as a slice or with narrow (their messages name c − ``cached``) or token by
    token (it names c)."""
    n, lead, d = k.shape[-2], k.shape[:-2], k.shape[-1]
    for cap in range(max(cached, 1), cached + n):
        for how in ("slice", "narrow", "token"):
            def attempt(cap=cap, how=how):
                buf = k.new_zeros(*lead, cap, d)
                if how == "slice":
                    buf[..., cached:cached + n, :] = k
                if how == "narrow":
                    buf.narrow(-2, cached, n).copy_(k)
                buf[..., cap, :] = k[..., 0, :]  # token by token: the first one past the end
            yield (f"your cache keeps its tokens in a buffer of {cap} slots that never grows: writing the "
                   f"{_count(n, 'new token')} " + (f"after the {cached} cached ones " if cached else "into it ") +
                   "goes past its end",
                   "when the buffer is full, allocate a larger one (twice the size) and copy the cached tokens over, "
                   "or store with torch.cat([cached, new], dim=-2): a cache keeps every token", attempt)


def _never_grows(cls: Learner, k, v, cap: int) -> bool:
    """Whether a new cache, given ``cap`` − 1 tokens at once and then two more, fails writing them past a buffer of
    ``cap`` slots: a buffer that never grows (one that grows, if too little for a long prompt at once, holds them)."""
    kk, vv = (x[..., :1, :].expand(*x.shape[:-2], cap + 1, x.shape[-1]).clone() for x in (k, v))
    try:
        cache = _construct(cls)
        if cap > 1:
            cache.method("append")(kk[..., :cap - 1, :], vv[..., :cap - 1, :])
        cache.method("append")(kk[..., cap - 1:, :], vv[..., cap - 1:, :])
    except LearnerRaised as exc:
        return explain_raise(exc, list(_full_buffer(kk[..., cap - 1:, :], cap - 1))).get("cause", "").startswith(
            f"your cache keeps its tokens in a buffer of {cap} slots")
    except (Failure, LearnerTimedOut):
        pass
    return False


def _append(cache: Learner, k, v, *, tried: str, cached: int, expected, cls: Learner) -> tuple[torch.Tensor,
                                                                                                torch.Tensor]:
    try:
        result = call_explained(cache.method("append"), k, v, tried=tried, expected="the whole cache (K, V)",
                                constructs=_full_buffer(k, cached),
                                patterns=[*([] if cached else [_SHARED_AT_FIRST]), _AXIS_FROM_FRONT, *PATTERNS])
    except Failure as failure:  # a full buffer: "never grows" only when a new cache shows it (else it grew too little)
        d, n = failure.diagnosis, k.shape[-2]
        cap = re.match(r"your cache keeps its tokens in a buffer of (\d+) slots that never grows", d.cause or "")
        if cap and not _never_grows(cls, k, v, int(cap[1])):
            raise Failure(replace(d, cause=f"your cache writes the {_count(n, 'new token')} " + (
                f"after the {cached} cached ones " if cached else "") + f"into a buffer of {int(cap[1]):,} slots, past "
                "its end: it did not grow enough to hold them (growing once, to twice the size or by a fixed step, "
                "is too little for a long prompt appended at once)", fix="before writing, grow the buffer until the "
                "new tokens fit, to max(2 × its size, t + n_new) slots, copying the cached tokens over (or store "
                "with torch.cat([cached, new], dim=-2)): a cache keeps every token")) from None
        raise
    if result is None:
        fail("append returned None", tried=tried, got="None", expected="the whole cache (K, V)",
             cause="append stores the tokens but has no `return`", fix="end append with `return self.k, self.v`")
    for item, name in zip(result if isinstance(result, (tuple, list)) else (), "KV"):
        if isinstance(item, (list, tuple)):  # more specific than unpack's words: the axis to join along
            fail(f"append returned {name} as a Python {type(item).__name__}", tried=tried,
                 got=f"a {type(item).__name__} of {len(item)} items as {name}", expected=f"{name} as one tensor",
                 fix="join the stored tokens into one tensor: torch.cat(list, dim=-2)")
    K, V = unpack(result, ("K", "V"), tried=tried, fix="end append with `return self.k, self.v`")
    if expected[0].shape != expected[1].shape and (K.shape, V.shape) == (expected[1].shape, expected[0].shape):
        fail("append returned (V, K)", tried=tried, got="the values first, then the keys", expected="(K, V)",
             fix="return self.k, self.v in that order")
    return K, V


def _expect_cache(cache: Learner, got, want, case, suspects: Suspects, *, q_new, kv, tried: str, what: str,
                  tol: dict) -> None:
    """Judge ``got``, what append returned, against ``want`` on ``case`` of :data:`APPEND` (``kv``: the right (K, V)).
    When it holds only the new tokens, attend(``q_new``) tells an overwritten cache from a wrong return."""
    old, new = case[:2]
    n_got, n_want = (got.shape[-2], want.shape[-2]) if got.dim() >= 2 else (0, 0)
    if old is not None and same(got, new, **tol):
        try:
            seen = as_tensor(cache.method("attend")(q_new), tried=tried, what="attend")
        except (Failure, LearnerRaised, LearnerTimedOut):
            seen = None
        tokens = "the new token" if new.shape[-2] == 1 else f"the {new.shape[-2]} new tokens"
        every = f"{rows(n_want)}: every token so far, oldest first"
        if seen is not None and same(seen, sdpa(q_new, *kv), **tol):
            fail("append returned only the new tokens", tried=tried, got=f"{what} holds {tokens} only, yet attend(q) "
                 "sees every token so far", expected=f"{what} of the whole cache, {every}",
                 cause="the cache itself is right, but append returns the k and v it was given",
                 fix="end append with `return self.k, self.v`, after the concatenation")
        if seen is not None and same(seen, sdpa(q_new, *(x[..., -new.shape[-2]:, :] for x in kv)), **tol):
            fail("cache overwritten", tried=tried, got=f"{what} holds {tokens} only, and attend(q) sees only "
                 f"{tokens} as well", expected=every, cause="you replaced the cache with the newest token(s)",
                 fix="keep what is cached and append: " + _FIX_APPEND)
        fail("append returned only the new tokens", tried=tried, got=f"{what} holds {tokens} only", expected=every,
             cause="either the cache is overwritten, or append returns the k and v it was given; attend is wrong "
                   "too, so the check cannot tell which", fix=f"keep what is cached and append ({_FIX_APPEND}), then "
                                                              "`return self.k, self.v`")
    alike = got.dim() == want.dim() and tuple(got.shape[:-2]) == tuple(want.shape[:-2])
    right = "the right one" if n_want == 1 else f"the {n_want} right ones"
    if alike and n_got > n_want and same(got[..., n_got - n_want:, :], want, **tol) and \
            not bool(got[..., :n_got - n_want, :].any()):  # no token appended anywhere in this check is all zero
        extra, held = n_got - n_want, _attends_to_zeros(cache, q_new, kv, n_got - n_want, tol)
        fail(f"{what} starts with {'an extra all-zero token' if extra == 1 else f'{extra} extra all-zero tokens'}",
             tried=tried, got=f"{rows(n_got)}: {_count(extra, 'row')} of zeros, then {right}",
             expected=f"{rows(n_want)}: only the tokens appended to this cache",
             cause=f"your cache holds {_count(extra, 'all-zero token')} before the first one appended (attend(q) "
                   "attends to it too): storage that starts as torch.zeros(1, d), not empty, then grows by "
                   "torch.cat" if held else "",
             fix="start empty: self.k = self.v = None in __init__, and store the first tokens as they come" if held
             else "append returns the tokens appended so far and nothing else, oldest first: `return self.k, self.v`")
    if alike and n_got > n_want and same(got[..., n_got - n_want:, :], want, **tol):
        fail(f"{what} holds tokens from another cache", tried=tried,
             got=f"{rows(n_got)}: {right} after {rows(n_got - n_want)} never appended to this cache",
             expected=f"{rows(n_want)}: the tokens appended to this cache",
             cause=f"your KVCache objects share their storage {_SHARE}: a new cache starts with an old one's tokens",
             fix=_SHARED_FIX)
    if alike and 0 < n_got < n_want and got.shape[-1] == want.shape[-1] and not suspects.suspects(got, case):
        dropped, tokens = same(got, want[..., n_want - n_got:, :], **tol), "token" if n_got == 1 else f"{n_got} tokens"
        fail(f"{what} holds {n_got} of the {n_want} tokens", tried=tried,
             got=rows(n_got) + (": the newest ones, the oldest dropped" if dropped else ""),
             expected=f"{rows(n_want)}: every token appended so far",
             cause=(f"your cache keeps only the last {tokens} (a window or a fixed-size buffer)" if dropped
                    else f"your cache stopped growing at {n_got} token{'s' if n_got > 1 else ''} (a fixed buffer?)"),
             fix="keep every token: torch.cat([cached, new], dim=-2) (or enlarge a buffer when full)")
    if alike and n_got > n_want and same(got[..., :n_want, :], want, **tol) and not bool(got[..., n_want:, :].any()) \
            and (left := _unfilled_left(cache, got, want, kv, what, tol)) is not None:
        fail(f"{what} includes the buffer's unfilled slots", tried=tried,
             got=f"{rows(n_got)}: {_count(n_want, 'right row')}, then {_count(n_got - n_want, 'row')} of zeros; "
                 f"after one more append, {_count(left, 'row')} of zeros",
             expected=f"{rows(n_want)}: only the tokens appended so far",
             cause="you returned the whole preallocated buffer, its unfilled zero slots included",
             fix="return the filled part only: self.k[..., :self.t, :], self.v[..., :self.t, :]")
    suspects.expect(got, want, case, tried=tried, what=what, **tol,
                    fix="append returns the whole cache: every row so far, oldest first, shape (..., t, d)")


def _attends_to_zeros(cache: Learner, q_new, kv, extra: int, tol: dict) -> bool:
    """Whether attend(``q_new``) is attention over ``extra`` all-zero keys and values, then the right cache ``kv``
    (and not over the right cache alone): the cache itself holds the zero rows, not only what append returns."""
    try:
        seen = as_tensor(cache.method("attend")(q_new), tried="", what="")
    except (Failure, LearnerRaised, LearnerTimedOut):
        return False
    front = [torch.cat([x.new_zeros(*x.shape[:-2], extra, x.shape[-1]), x], -2) for x in kv]
    right, padded = sdpa(q_new, *kv), sdpa(q_new, *front)
    return tuple(seen.shape) == tuple(right.shape) and same(seen, padded, **tol) and not same(padded, right, **tol)


def _unfilled_left(cache: Learner, got, want, kv, what: str, tol: dict) -> int | None:
    """How many all-zero rows follow the right ones once one more token is appended, when that number differs from
    ``got``'s: a buffer's unfilled slots, which the new token fills (or a buffer that grew); None otherwise (zero
    rows added at every return, which stay as many, are no buffer). ``got`` (``what`` of ``kv``, the right (K, V))
    holds the right rows ``want``, then zeros. The cache is appended to: call only on the way to a failure."""
    part, zeros = "KV".index(what[-1]), got.shape[-2] - want.shape[-2]
    more = tuple(x[..., -1:, :].clone() for x in kv)  # the newest token once more
    try:
        result = cache.method("append")(*more)
        again = as_tensor(result[part], tried="", what="") if isinstance(result, (tuple, list)) and len(
            result) == 2 else None
    except (Failure, LearnerRaised, LearnerTimedOut):
        return None
    longer = torch.cat([want, more[part].to(want.dtype)], -2)
    n = longer.shape[-2]
    if again is None or again.dim() != got.dim() or tuple(again.shape[:-2]) != tuple(got.shape[:-2]) or \
            again.shape[-1] != got.shape[-1] or again.shape[-2] < n:
        return None
    left = again.shape[-2] - n
    if left == zeros or not same(again[..., :n, :], longer, **tol) or bool(again[..., n:, :].any()):
        return None
    return left


def _unchanged(cls: Learner) -> None:
    """Fail when append or attend changes the k, v or q it is given (measured on a new cache)."""
    g = torch.Generator().manual_seed(12)  # a prompt of 3 tokens on a new cache, then the newest query
    q, k, v = (torch.randn(3, d, generator=g, dtype=torch.float64) for d in (4, 4, 3))
    cache = _construct(cls)
    expect_unchanged(cache.method("append"), (k, v), call="KVCache().append(k, v)", name="k", others=("v",),
                     shown="k (3, 4), v (3, 3): a prompt of 3 tokens, float64")
    expect_unchanged(cache.method("attend"), (q[-1:],), call="KVCache().append(k, v), then attend(q)", name="q",
                     shown="q (1, 4), the newest token's query, float64")


@check("KVCache", kind="class", expects="a class KVCache with methods append(k, v) → (K, V) and attend(q) → output")
def check_KVCache(cls: Learner) -> str:
    try:
        count = _values(cls)
    except Failure as failure:
        # a cache that stores (and returns) the very k it was given shows an input changed in place as wrong values:
        # name the in-place change, its cause, when there is one
        try:
            _unchanged(cls)
        except Failure as unchanged:
            if unchanged.diagnosis.summary.endswith("changed in place"):
                raise unchanged from None
        raise failure from None
    _unchanged(cls)
    return (f"equals causal attention token by token on {count} cases (batch × heads, no batch axes, a prompt "
            "appended at once, scores ±100, 4,100 tokens) and keeps two caches apart")


def _values(cls: Learner) -> int:
    """Two caches side by side, then every case token by token: what append returns and what attend gives; the
    number of cases."""
    appends, attends = Suspects(APPEND, **LOOSE), Suspects(ATTEND, **LOOSE)
    # Two caches side by side first (before any other cache exists): each must keep its own tokens.
    _, (q, k, v), _ = _cache_cases()[0]
    tol = tolerance(k.dtype)
    caches = [(_construct(cls), k, v, "first"), (_construct(cls), k.flip(-2) + 1, v.flip(-2) - 1, "second")]
    for t in range(3):
        for cache, kk, vv, which in caches:
            tried = f"two KVCache() objects, appending one token to each in turn: token {t} of the {which}"
            new, kv = kk[..., t:t + 1, :], (kk[..., :t + 1, :], vv[..., :t + 1, :])
            K, _ = _append(cache, new, vv[..., t:t + 1, :], tried=tried, cached=t, expected=kv, cls=cls)
            _expect_cache(cache, K, kv[0], (kk[..., :t, :] if t else None, new, None), appends,
                          q_new=q[..., t:t + 1, :], kv=kv, tried=tried, what="the returned K", tol=tol)
    cases = _cache_cases()
    for name, (q, k, v), chunks in cases:
        tol, cache, start = tolerance(q.dtype), _construct(cls), 0
        steps: list[tuple[tuple, torch.Tensor, str]] = []  # (case, attend's output, tried): judged once all are in
        try:
            for n_new in chunks:
                stop = start + n_new
                tokens = f"tokens {start}…{stop - 1}" if n_new > 1 else f"token {start}"
                tried = f"append(k, v) of {tokens}, then attend(q) of token {stop - 1}, on {name}"
                kv, q_new = (k[..., :stop, :], v[..., :stop, :]), q[..., stop - 1:stop, :]
                K, V = _append(cache, k[..., start:stop, :], v[..., start:stop, :], tried=tried, cached=start,
                               expected=kv, cls=cls)
                for got, want, keys, part in ((K, kv[0], None, "K"), (V, kv[1], kv[0], "V")):
                    case = (want[..., :start, :] if start else None, want[..., start:, :], keys)
                    _expect_cache(cache, got, want, case, appends, q_new=q_new, kv=kv, tried=tried,
                                  what=f"the returned {part}", tol=tol)
                    lower_precision(got, want.dtype, tried=tried, what=f"the returned {part}", grid=False)
                    expect_dtype(got, want.dtype, tried=tried, what=f"the returned {part}")
                out = call_explained(cache.method("attend"), q_new, tried=tried, expected="the output (..., 1, d_v)",
                                     constructs=_attend_constructs(q_new, *kv), patterns=[_AXIS_FROM_FRONT, *PATTERNS])
                if isinstance(out, (tuple, list)) and out and all(isinstance(x, torch.Tensor) for x in out):
                    fail(f"attend returned {len(out)} tensors, not one", tried=tried, got=f"a {type(out).__name__} of "
                         f"{len(out)} tensors", expected="one tensor", fix="return only the attention output (the "
                         "weights are not needed here)")
                steps.append(((q_new, *kv), as_tensor(out, tried=tried, what="attend"), tried))
                start = stop
        except (Failure, LearnerRaised, LearnerTimedOut):
            if all(same(out, sdpa(*case), **tol) for case, out, _ in steps):
                raise  # otherwise the earlier wrong output is the first thing to report
        for i, (case, out, tried) in enumerate(steps):
            try:
                attends.expect(out, sdpa(*case), case, tried=tried, what="attend's output", **tol,
                               again=lambda q, K, V: next(o for c, o, _ in steps if c[0] is q),  # once per q
                               distinguish=[s[0] for s in steps[i + 1:]],
                               fix="attend returns softmax(q Kᵀ / √d_k) V over every cached key, shape (..., 1, d_v)")
            except Failure as failure:
                if not failure.diagnosis.cause:
                    _zero_slots(failure, out, case, tol, [(c, o) for c, o, _ in steps])
                raise
            lower_precision(out, q.dtype, tried=tried, what="attend's output", grid=False)
            expect_dtype(out, q.dtype, tried=tried, what="attend's output")
            expect_float64_precision(out, sdpa(*case), tried=tried, what="attend's output")
    return len(cases)

