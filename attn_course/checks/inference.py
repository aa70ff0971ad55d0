"""Checks for notebook 11 (attention at inference): KVCache, the two masks, merge_partials and the tiled
sliding_window_attention. Oracles in float64: ``F.scaled_dot_product_attention``, ``tril(n_k − n_q)`` (what
``causal_lower_right`` builds) and the merge's definition. When no :class:`~.kit.Known` mistake reproduces a wrong
answer, the check measures what it can: which keys a query saw, which factor each side of a merge got, in which
setting (one tile, no window…) the answer goes wrong.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from .boundary import probe
from .compare import Failure, describe_mismatch, fmt, same
from .core import Learner, LearnerRaised, LearnerTimedOut, as_tensor, check, expect_shape, fail, learner_error
from .kit import Known, Suspects, call_explained, lower_precision, unpack, watch

__all__ = ["check_KVCache", "check_bottom_right_causal_mask", "check_merge_partials", "check_sliding_window_mask",
           "check_sliding_window_attention"]

LOOSE = dict(atol=3e-5, rtol=1e-3)  # what a suspect must match (float32 cases included); a pass uses _tol


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return dict(atol=1e-6, rtol=1e-5) if dtype == torch.float64 else dict(LOOSE)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _sdpa(q, k, v, mask=None) -> torch.Tensor:
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)


def _attn(q, k, v, *, scale=None, mask=None, dim=-1, naive=False) -> torch.Tensor:
    """softmax(q kᵀ · scale) v in float64 (rows with no kept key: 0); ``naive``: unshifted, in q's dtype."""
    q, k, v = (q, k, v) if naive else (q.double(), k.double(), v.double())
    s = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if naive:
        return (s.exp() / s.exp().sum(-1, keepdim=True)) @ v
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.nan_to_num(torch.softmax(s, dim=dim), nan=0.0) @ v


#: (type, regex, cause, fix): messages whose meaning the exercises of this notebook make certain.
_PATTERNS = [
    ("RuntimeError", r"upper bound and lower bound inconsistent with step sign",
     "torch.arange(start, end) got start > end: a bound on the line shown is wrong (or the two are swapped)",
     "print the bounds; a range of positions runs from the smaller to the larger"),
    ("RuntimeError", r"Subtraction, the `-` operator, with a bool tensor",
     "a `-` met a bool tensor: a mask stands where numbers were meant, or a mask is negated with − instead of ~",
     "negate masks with ~; subtract only numbers"),
    ("TypeError", r"'float' object cannot be interpreted as an integer",
     "a float where Python needs an integer (a range bound, a size): / gives a float even for whole numbers",
     "use // for positions and block counts (or int(...))"),
]
_AXIS_FROM_FRONT = ("IndexError", r"Dimension out of range", "your code numbers an axis from the front (transpose(2, "
                    "3), dim=2), which does not exist with fewer leading axes",
                    "count axes from the end: the sequence axis is dim=-2, K.transpose(-2, -1)")


# ================================================================================== KVCache
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
     "use torch.softmax (or subtract each row's maximum before exp)", lambda q, K, V: _attn(q, K, V, naive=True)),
    ("no_self", *_ITSELF, lambda q, K, V: _attn(q, K[..., :-1, :], V[..., :-1, :])),
    ("no_self_nan", *_ITSELF, lambda q, K, V: torch.full(q.shape[:-1] + V.shape[-1:], math.nan, dtype=torch.float64)
     if K.shape[-2] == 1 else None),
    ("unscaled", "scores not scaled", "you did not divide the scores by √d_k", "divide q Kᵀ by math.sqrt(d_k)",
     lambda q, K, V: _attn(q, K, V, scale=1.0)),
    ("by_dk", "divided by d_k instead of √d_k", "you divided the scores by d_k", "divide by math.sqrt(d_k)",
     lambda q, K, V: _attn(q, K, V, scale=1 / q.shape[-1])),
    ("dim", "softmax over the wrong axis", "you took the softmax over the query axis (-2): with one query every "
     "weight is 1", "torch.softmax(scores, dim=-1): over the keys", lambda q, K, V: _attn(q, K, V, dim=-2)),
    ("top_left", "top-left alignment used for decode", "your query sees only key 0: is_causal=True (or tril over "
     "(1, t)) aligns the mask at the top-left corner", "one new query sees every cached key: no mask (or a "
     "bottom-right one)", lambda q, K, V: V[..., :1, :].double() if K.shape[-2] > 1 else None),
    ("newest", "attended only to the newest token", "your output is the newest token's value: the query saw one key",
     "attend over the whole K and V", lambda q, K, V: V[..., -1:, :].double() if K.shape[-2] > 1 else None),
    ("k_as_v", "weights multiplied by K, not V", "you multiplied the weights by the keys", "output = weights @ V",
     lambda q, K, V: _attn(q, K, K)),
    ("weights", "returned the weights, not the output", "attend returned softmax(q Kᵀ / √d_k), shape (..., 1, t)",
     "return weights @ V, shape (..., 1, d_v)", lambda q, K, V: torch.softmax(_scaled(q, K), dim=-1)),
    ("no_softmax", "no softmax", "you multiplied V by the scaled scores, not by their softmax",
     "weights = torch.softmax(scores, dim=-1), then weights @ V", lambda q, K, V: _scaled(q, K) @ V.double()),
    ("mean", "uniform weights: the mean of V", "your output is the plain average of the cached values, whatever the "
     "scores", "weight each value by softmax(q Kᵀ / √d_k)",
     lambda q, K, V: V.double().mean(-2, keepdim=True) if K.shape[-2] > 1 else None),
    ("by_dv", "scores divided by √d_v instead of √d_k", "you scaled by the values' width d_v",
     "divide by math.sqrt(q.shape[-1]) (d_k)",
     lambda q, K, V: _attn(q, K, V, scale=1 / math.sqrt(V.shape[-1])) if V.shape[-1] != q.shape[-1] else None)]]


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
             qkv((), 24, 3, 2), [3] + [1] * 21)]


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def _construct(cls: Learner) -> Learner:
    try:
        return cls.construct()
    except LearnerRaised as exc:
        raise Failure(learner_error(exc, tried="KVCache()", expected="an empty cache",
                                    fix="KVCache() takes no arguments: start with self.k = self.v = None")) from None


_SHARE = "(a class attribute such as `keys = []` in the class body)"
_SHARED_AT_FIRST = ("RuntimeError", r"must match", f"the first append to a new KVCache() found tokens already stored: "
                    f"every KVCache object shares the storage {_SHARE}", _SHARED_FIX)


def _append(cache: Learner, k, v, *, tried: str, fresh: bool, expected) -> tuple[torch.Tensor, torch.Tensor]:
    result = call_explained(cache.method("append"), k, v, tried=tried, expected="the whole cache (K, V)",
                            patterns=[*([_SHARED_AT_FIRST] if fresh else []), _AXIS_FROM_FRONT, *_PATTERNS])
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
        every = f"{_rows(n_want)}: every token so far, oldest first"
        if seen is not None and same(seen, _sdpa(q_new, *kv), **tol):
            fail("append returned only the new tokens", tried=tried, got=f"{what} holds {tokens} only, yet attend(q) "
                 "sees every token so far", expected=f"{what} of the whole cache, {every}",
                 cause="the cache itself is right, but append returns the k and v it was given",
                 fix="end append with `return self.k, self.v`, after the concatenation")
        if seen is not None and same(seen, _sdpa(q_new, *(x[..., -new.shape[-2]:, :] for x in kv)), **tol):
            fail("cache overwritten", tried=tried, got=f"{what} holds {tokens} only, and attend(q) sees only "
                 f"{tokens} as well", expected=every, cause="you replaced the cache with the newest token(s)",
                 fix="keep what is cached and append: " + _FIX_APPEND)
        fail("append returned only the new tokens", tried=tried, got=f"{what} holds {tokens} only", expected=every,
             cause="either the cache is overwritten, or append returns the k and v it was given; attend is wrong "
                   "too, so the check cannot tell which", fix=f"keep what is cached and append ({_FIX_APPEND}), then "
                                                              "`return self.k, self.v`")
    alike = got.dim() == want.dim() and tuple(got.shape[:-2]) == tuple(want.shape[:-2])
    if alike and n_got > n_want and same(got[..., n_got - n_want:, :], want, **tol):
        right = "the right one" if n_want == 1 else f"the {n_want} right ones"
        fail(f"{what} holds tokens from another cache", tried=tried,
             got=f"{_rows(n_got)}: {right} after {_rows(n_got - n_want)} never appended to this cache",
             expected=f"{_rows(n_want)}: the tokens appended to this cache",
             cause=f"your KVCache objects share their storage {_SHARE}: a new cache starts with an old one's tokens",
             fix=_SHARED_FIX)
    if alike and 0 < n_got < n_want and got.shape[-1] == want.shape[-1] and not suspects.suspects(got, case):
        dropped, tokens = same(got, want[..., n_want - n_got:, :], **tol), "token" if n_got == 1 else f"{n_got} tokens"
        fail(f"{what} holds {n_got} of the {n_want} tokens", tried=tried,
             got=_rows(n_got) + (": the newest ones, the oldest dropped" if dropped else ""),
             expected=f"{_rows(n_want)}: every token appended so far",
             cause=(f"your cache keeps only the last {tokens} (a window or a fixed-size buffer)" if dropped
                    else f"your cache stopped growing at {n_got} token{'s' if n_got > 1 else ''} (a fixed buffer?)"),
             fix="keep every token: torch.cat([cached, new], dim=-2) (or enlarge a buffer when full)")
    suspects.expect(got, want, case, tried=tried, what=what, **tol,
                    fix="append returns the whole cache: every row so far, oldest first, shape (..., t, d)")


@check("KVCache", kind="class", expects="a class KVCache with methods append(k, v) → (K, V) and attend(q) → output")
def check_KVCache(cls: Learner) -> str:
    appends, attends = Suspects(APPEND, **LOOSE), Suspects(ATTEND, **LOOSE)
    # Two caches side by side first (before any other cache exists): each must keep its own tokens.
    _, (q, k, v), _ = _cache_cases()[0]
    tol = _tol(k.dtype)
    caches = [(_construct(cls), k, v, "first"), (_construct(cls), k.flip(-2) + 1, v.flip(-2) - 1, "second")]
    for t in range(3):
        for cache, kk, vv, which in caches:
            tried = f"two KVCache() objects, appending one token to each in turn: token {t} of the {which}"
            new, kv = kk[..., t:t + 1, :], (kk[..., :t + 1, :], vv[..., :t + 1, :])
            K, _ = _append(cache, new, vv[..., t:t + 1, :], tried=tried, fresh=t == 0, expected=kv)
            _expect_cache(cache, K, kv[0], (kk[..., :t, :] if t else None, new, None), appends,
                          q_new=q[..., t:t + 1, :], kv=kv, tried=tried, what="the returned K", tol=tol)
    cases = _cache_cases()
    for name, (q, k, v), chunks in cases:
        tol, cache, start = _tol(q.dtype), _construct(cls), 0
        steps: list[tuple[tuple, torch.Tensor, str]] = []  # (case, attend's output, tried): judged once all are in
        try:
            for n_new in chunks:
                stop = start + n_new
                tokens = f"tokens {start}…{stop - 1}" if n_new > 1 else f"token {start}"
                tried = f"append(k, v) of {tokens}, then attend(q) of token {stop - 1}, on {name}"
                kv, q_new = (k[..., :stop, :], v[..., :stop, :]), q[..., stop - 1:stop, :]
                K, V = _append(cache, k[..., start:stop, :], v[..., start:stop, :], tried=tried, fresh=start == 0,
                               expected=kv)
                for got, want, keys, part in ((K, kv[0], None, "K"), (V, kv[1], kv[0], "V")):
                    case = (want[..., :start, :] if start else None, want[..., start:, :], keys)
                    _expect_cache(cache, got, want, case, appends, q_new=q_new, kv=kv, tried=tried,
                                  what=f"the returned {part}", tol=tol)
                    lower_precision(got, want.dtype, tried=tried, what=f"the returned {part}", grid=False)
                out = call_explained(cache.method("attend"), q_new, tried=tried, expected="the output (..., 1, d_v)",
                                     constructs=_attend_constructs(q_new, *kv), patterns=[_AXIS_FROM_FRONT, *_PATTERNS])
                if isinstance(out, (tuple, list)) and out and all(isinstance(x, torch.Tensor) for x in out):
                    fail(f"attend returned {len(out)} tensors, not one", tried=tried, got=f"a {type(out).__name__} of "
                         f"{len(out)} tensors", expected="one tensor", fix="return only the attention output (the "
                         "weights are not needed here)")
                steps.append(((q_new, *kv), as_tensor(out, tried=tried, what="attend"), tried))
                start = stop
        except (Failure, LearnerRaised, LearnerTimedOut):
            if all(same(out, _sdpa(*case), **tol) for case, out, _ in steps):
                raise  # otherwise the earlier wrong output is the first thing to report
        for i, (case, out, tried) in enumerate(steps):
            attends.expect(out, _sdpa(*case), case, tried=tried, what="attend's output", **tol,
                           again=lambda q, K, V: next(o for c, o, _ in steps if c[0] is q),  # attend ran once per q
                           distinguish=[s[0] for s in steps[i + 1:]],
                           fix="attend returns softmax(q Kᵀ / √d_k) V over every cached key, shape (..., 1, d_v)")
            lower_precision(out, q.dtype, tried=tried, what="attend's output", grid=False)
    return (f"equals causal attention token by token on {len(cases)} cases (batch × heads, no batch axes, a prompt "
            "appended at once, scores ±100) and keeps two caches apart")


# ================================================================================== the two masks
def _bool_mask(value: Any, expected: torch.Tensor, *, tried: str) -> torch.Tensor:
    """The answer as a bool tensor; a 0/1 or additive float mask is named as such."""
    t = as_tensor(value, tried=tried, what="your function", expected="a bool tensor")
    if t.dtype == torch.bool:
        return t
    dtype, want = _name(t.dtype), "a bool tensor (True = may attend)"
    if t.is_floating_point() and same(t, torch.zeros(expected.shape, dtype=t.dtype).masked_fill(~expected, -math.inf),
                                      atol=0, rtol=0):
        fail("returned the additive form (0 / −inf), not a bool mask", tried=tried,
             got=f"{dtype} with 0 where allowed and −inf where blocked", expected=want,
             fix="return the bool mask itself; turn it into 0 / −inf only where scores are masked")
    right = same(t.double(), expected.double(), atol=0, rtol=0)  # the right 0/1 values
    fail(f"your mask has dtype {dtype}, not bool", tried=tried, expected=want,
         got=f"the right 0/1 values as {dtype}" if right else f"a {dtype} tensor of shape {tuple(t.shape)}",
         cause=f"you built the mask as numbers ({dtype})" if right else "",
         fix="build it with dtype=torch.bool, or end with .bool()" if right else
             "build the mask with dtype=torch.bool (comparisons give bool)")


def _keys(row: torch.Tensor) -> str:
    """The True positions of a bool row as runs: 'keys 2 … 4', 'keys 0, 3 … 5', 'no key'."""
    on = row.nonzero().flatten().tolist()
    runs = zip([j for j in on if j - 1 not in on], [j for j in on if j + 1 not in on])  # (first, last) of each run
    return ("no key" if not on else "key " if len(on) == 1 else "keys ") + ", ".join(
        str(a) if a == b else f"{a} … {b}" for a, b in runs)


def _check_masks(fn: Learner, name: str, table: list[Known], cases: list[tuple], oracle, fix: str) -> None:
    """Exact comparison with ``oracle``; when no known mistake matches, say which keys a wrong row lets a query see."""
    suspects = Suspects(table, atol=0, rtol=0)
    for case in cases:
        (n_q, n_k, *window), expected = case, oracle(*case)
        tried = f"{name}({n_q}, {n_k}{''.join(f', window={w}' for w in window)})"
        answer = call_explained(fn, *case, tried=tried, expected="a bool (n_q, n_k) tensor", patterns=_PATTERNS)
        got = _bool_mask(answer, expected, tried=tried)
        if tuple(got.shape) == tuple(expected.shape) and got.numel() and not bool(got.any()) and bool(expected.any()):
            alike = suspects.suspects(got, case)  # known mistakes that keep nothing on this shape
            fail("the mask blocks every key", tried=tried, got="False everywhere: no query may attend to any key",
                 expected=f"{int(expected.sum())} of the {expected.numel()} entries True, at least one per query",
                 cause=" — or ".join(f"possibly {k.summary}: {k.cause} (on this shape that keeps no key at all)"
                                     for k in alike) or "the conditions your mask combines exclude every key, even "
                                                        "each query's own position",
                 fix=alike[0].fix if alike else fix)
        if got.dim() == 2 and got.shape[0] != n_q and got.shape[1] == n_k and not suspects.suspects(got, case):
            named = {n_k: " = n_k, one per key", n_k - n_q: " = n_k − n_q", n_k + n_q: " = n_k + n_q"}.get(
                got.shape[0], "")
            fail(f"wrong shape {tuple(got.shape)}, expected {(n_q, n_k)}", tried=tried,
                 got=f"your mask of shape {tuple(got.shape)}", expected=f"shape {(n_q, n_k)}: one row per query",
                 cause=f"your mask has {_rows(got.shape[0])}{named} where the n_q = {n_q} queries need {n_q}: the "
                       "query positions run over the wrong range (they are n_k − n_q … n_k − 1)", fix=fix)
        try:
            suspects.expect(got, expected, case, tried=tried, what="your mask", atol=0, rtol=0, fix=fix, again=fn,
                            distinguish=cases)
        except Failure as failure:
            if failure.diagnosis.cause or tuple(got.shape) != tuple(expected.shape):
                raise
            extra, missing = (got & ~expected).nonzero().tolist(), (~got & expected).nonzero().tolist()
            parts = [f"{len(e)} {what} (the first: query {e[0][0]}, key {e[0][1]})"
                     for e, what in ((extra, "blocked key(s) allowed"), (missing, "allowed key(s) blocked")) if e]
            i = min(e[0][0] for e in (extra, missing) if e)
            fail(f"wrong entries in the mask: {' and '.join(p.split(' (')[0] for p in parts)}", tried=tried,
                 got="; ".join(parts), expected="the entries the docstring describes",
                 cause=f"your mask lets query {i} (position {i + n_k - n_q}) see {_keys(got[i])}, where it may see "
                       f"{_keys(expected[i])}", fix=fix)


def _ones(n_q: int, n_k: int) -> torch.Tensor:
    return torch.ones(n_q, n_k, dtype=torch.bool)


_ALIGN_FIX = ("the n_q queries are the last n_q positions (query i at i + n_k − n_q): "
              "torch.ones(n_q, n_k, dtype=torch.bool).tril(diagonal=n_k - n_q)")
_SWAPPED = ("rows and columns swapped", "your mask has one row per key", "shape (n_q, n_k): one row per query")
_POLARITY = ("mask polarity inverted", "True marks the blocked keys; in this course True means 'may attend'",
             "negate it: ~mask")
_NO_SELF = "positions off by one: the query does not see itself"
#: A case of bottom_right_causal_mask: (n_q, n_k).
BOTTOM_RIGHT = [Known(key, summary, cause, _ALIGN_FIX, make) for key, summary, cause, make in [
    ("top_left", "top-left alignment used for decode", "you aligned the mask at the top-left corner (query i sees "
     "keys 0 … i, as is_causal=True does): the new queries lose the cached keys",
     lambda n_q, n_k: _ones(n_q, n_k).tril()),
    ("no_self", _NO_SELF, "your diagonal is one to the left", lambda n_q, n_k: _ones(n_q, n_k).tril(n_k - n_q - 1)),
    ("future", "positions off by one: one future key visible", "your diagonal is one to the right",
     lambda n_q, n_k: _ones(n_q, n_k).tril(n_k - n_q + 1)),
    ("sign", "offset with the wrong sign", "you shifted the diagonal by n_q − n_k instead of n_k − n_q",
     lambda n_q, n_k: _ones(n_q, n_k).tril(n_q - n_k)),
    ("upper", "upper triangle kept", "you kept the keys after the query instead of those before it",
     lambda n_q, n_k: _ones(n_q, n_k).triu(n_k - n_q)),
    ("none", "no mask at all", "every key is visible to every query", _ones)]] + [
    Known("polarity", *_POLARITY, lambda n_q, n_k: ~_ones(n_q, n_k).tril(n_k - n_q)),
    Known("swapped", *_SWAPPED, lambda n_q, n_k: _ones(n_k, n_q).tril(n_k - n_q)),
    Known("transposed", *_SWAPPED, lambda n_q, n_k: _ones(n_q, n_k).tril(n_k - n_q).T)]
_MASK_CASES = [(3, 7), (1, 6), (5, 5), (1, 1), (2, 9), (4, 6), (6, 13)]


@check("bottom_right_causal_mask",
       expects="a function bottom_right_causal_mask(n_q, n_k) returning a bool (n_q, n_k) tensor")
def check_bottom_right_causal_mask(fn: Learner) -> str:
    _check_masks(fn, "bottom_right_causal_mask", BOTTOM_RIGHT, _MASK_CASES,
                 lambda n_q, n_k: _ones(n_q, n_k).tril(n_k - n_q), _ALIGN_FIX)
    return (f"equals causal_lower_right on {len(_MASK_CASES)} shapes (decode n_q = 1, a chunk of queries over a "
            "longer cache, square)")


def _window(n_q, n_k, window, lo=0, hi=0, top_left=False, causal=True) -> torch.Tensor:
    """Key j seen from position p iff p − window + lo < j ≤ p + hi (not causal: |j − p| < window − lo)."""
    p = torch.arange(n_q)[:, None] + (0 if top_left else n_k - n_q)
    j = torch.arange(n_k)[None, :]
    return (j > p - window + lo) & ((j <= p + hi) if causal else (j < p + window - lo))


_WINDOW_FIX = "query i sits at position p = i + n_k − n_q and sees key j iff p − window < j ≤ p: `window` keys"
#: A case of sliding_window_mask: (n_q, n_k, window).
WINDOW_MASK = [Known(key, summary, cause, _WINDOW_FIX, lambda n_q, n_k, w, band=band: _window(n_q, n_k, w, **band))
               for key, summary, cause, band in [
    ("wide", "window off by one: one key too many", "each query sees window + 1 keys (p − window ≤ j ≤ p)",
     dict(lo=-1)),
    ("narrow", "window off by one: one key too few", "each query sees window − 1 keys", dict(lo=1)),
    ("top_left", "top-left alignment used for decode", "you put query i at position i, but the queries are the last "
     "n_q of the n_k positions", dict(top_left=True)),
    ("acausal", "window not causal", "your band reaches `window` keys into the future too", dict(causal=False)),
    ("ignored", "window ignored", "your mask is causal but keeps every earlier key", dict(lo=-math.inf)),
    ("no_self", _NO_SELF, "your band stops one key before the query's own position", dict(hi=-1)),
    ("shifted", _NO_SELF, "your band is shifted one key into the past: keys p − window … p − 1",
     dict(lo=-1, hi=-1))]
               ] + [Known("polarity", *_POLARITY, lambda n_q, n_k, w: ~_window(n_q, n_k, w)),
                    Known("swapped", *_SWAPPED, lambda n_q, n_k, w: _window(n_q, n_k, w).T)]
_WINDOW_CASES = [(3, 10, 4), (6, 6, 3), (1, 9, 4), (5, 5, 1), (4, 4, 10), (2, 8, 8), (7, 12, 5), (1, 1, 1)]


@check("sliding_window_mask",
       expects="a function sliding_window_mask(n_q, n_k, window) returning a bool (n_q, n_k) tensor")
def check_sliding_window_mask(fn: Learner) -> str:
    _check_masks(fn, "sliding_window_mask", WINDOW_MASK, _WINDOW_CASES, _window, _WINDOW_FIX)
    return (f"exact on {len(_WINDOW_CASES)} cases (decode, chunks over a longer cache, window 1, window longer "
            "than the sequence)")


# ================================================================================== merge of partials
def _partials(q, k, v, mask=None):
    from ..inference import partial_attention  # lazily: the reference module imports matplotlib

    return partial_attention(q.double(), k.double(), v.double(), mask)


def _pack(m, l, acc) -> torch.Tensor:
    """(m, l, acc) as one tensor (..., n_q, 2 + d_v): what the engine compares."""
    return torch.cat([m.double(), l.double(), acc.double()], dim=-1)


def _merge_variant(a, b, mistake: str = ""):
    """The merge in float64, or one of its classic mistakes."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = [[t.double() for t in p] for p in (a, b)]
    m = {"min": torch.minimum(m_a, m_b), "logaddexp": torch.logaddexp(m_a, m_b),
         "m_first_rel": m_a}.get(mistake, torch.maximum(m_a, m_b))  # m_first_rel: both sides rescaled relative to m_a
    shift = m if mistake == "unguarded" else torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    alpha, beta = {"inverted": (torch.exp(shift - m_a), torch.exp(shift - m_b)), "absolute": (m_a.exp(), m_b.exp()),
                   "exp2": (torch.exp2(m_a - shift), torch.exp2(m_b - shift)),
                   "swapped": (torch.exp(m_b - shift), torch.exp(m_a - shift))}.get(
        mistake, (torch.exp(m_a - shift), torch.exp(m_b - shift)))
    l, acc = l_a * alpha + l_b * beta, acc_a * alpha + acc_b * beta
    pick = m_a >= m_b
    l, acc = {"winner": (torch.where(pick, l_a, l_b), torch.where(pick, acc_a, acc_b)),
              "average": ((l_a + l_b) / 2, (acc_a + acc_b) / 2), "none": (l_a + l_b, acc_a + acc_b),
              "only_l": (l, acc_a + acc_b), "only_acc": (l_a + l_b, acc), "normalised": (l, acc / l)}.get(
        mistake, (l, acc))
    m = {"m_first": m_a, "m_sum": m_a + m_b}.get(mistake, m)
    return m, l, acc


_EACH = "l = l_a·exp(m_a − m) + l_b·exp(m_b − m), and the same for acc"
_MAX = "m = torch.maximum(m_a, m_b)"
#: A case of merge_partials: (part_a, part_b).
MERGE = [Known(key, summary, cause, fix, lambda x, y, key=key: _pack(*_merge_variant(x, y, key)))
         for key, summary, cause, fix in [
    ("none", "merge without rescaling", "you added l_a + l_b and acc_a + acc_b, computed relative to different maxima",
     "rescale each side by exp(m_side − m) with m = max(m_a, m_b) before adding"),
    ("inverted", "rescaled by exp(m − m_side) instead of exp(m_side − m)", "your factors are ≥ 1: the rescaling is "
     "the wrong way round", "multiply by exp(m_a − m) and exp(m_b − m), each ≤ 1"),
    ("absolute", "rescaled by e^m instead of e^(m_side − m)", "you multiplied by exp(m_a) and exp(m_b), which "
     "overflow and forget the new maximum", "multiply by exp(m_a − m) and exp(m_b − m) with m = max(m_a, m_b)"),
    ("only_l", "acc not rescaled", "you rescaled l but not the accumulators", "rescale acc_a and acc_b as l_a and l_b"),
    ("only_acc", "l not rescaled", "you rescaled the accumulators but not l", "rescale l_a and l_b as acc_a and acc_b"),
    ("m_first", "m not updated to the larger maximum", "you returned m_a as the merged m", "return m = max(m_a, m_b)"),
    ("m_first_rel", "m not updated to the larger maximum", "you kept m = m_a and rescaled side b by exp(m_b − m_a), "
     "which overflows when m_b is much larger", "m = max(m_a, m_b); rescale each side by exp(m_side − m)"),
    ("m_sum", "m added instead of maximised", "you returned m_a + m_b as the merged m", "return " + _MAX),
    ("normalised", "acc divided by l", "you returned the normalised output acc / l instead of the accumulator",
     "keep acc unnormalised: divide by l once, after the last merge"),
    ("unguarded", "NaN where neither chunk sees a key", "where m_a = m_b = −inf, exp(m_a − m) is exp(−inf − (−inf)) "
     "= exp(NaN)", "shift by 0 where m is −inf: torch.where(torch.isinf(m), torch.zeros_like(m), m)"),
    ("min", "m = min(m_a, m_b), not the maximum", "with the smaller maximum the factors exp(m_side − m) are ≥ 1 and "
     "overflow for large scores", _MAX),
    ("logaddexp", "m = logsumexp(m_a, m_b), not max(m_a, m_b)", "you combined the two maxima with logaddexp",
     _MAX + "; the sums l carry the rest"),
    ("winner", "kept only the side with the larger maximum", "you dropped the keys of the chunk whose m is smaller; "
     "it contributes too, rescaled by exp(m_side − m)", _EACH),
    ("average", "averaged the two sides instead of rescaling and adding", "you returned (l_a + l_b) / 2 and "
     "(acc_a + acc_b) / 2", _EACH),
    ("swapped", "each side rescaled by the other side's factor", "you multiplied side a by exp(m_b − m) and side b by "
     "exp(m_a − m)", "side a gets exp(m_a − m), side b gets exp(m_b − m)"),
    ("exp2", "rescaled with 2^(m_side − m) instead of e^(m_side − m)", "you used exp2 (or 2 ** …), but m and l "
     "come from the natural exponential", "use torch.exp(m_side − m)")]]


def _merge_cases() -> list[tuple[str, tuple]]:
    g = torch.Generator().manual_seed(31)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    def split(q, k, v, at, masks=(None, None)):
        return tuple(_partials(q, k[..., part, :], v[..., part, :], mask)
                     for part, mask in zip((slice(None, at), slice(at, None)), masks))

    cases = []
    q, k, v = rand(2, 2, 3, 8), rand(2, 2, 10, 8), rand(2, 2, 10, 5)
    k[..., 5:, :] += 1.5 * q.mean(-2, keepdim=True)  # the second chunk's scores are larger: the maximum rises
    cases.append(("batch 2 × heads 2, 3 queries, the second chunk holding the larger scores", split(q, k, v, 5)))
    q, k, v = rand(2, 3, 6), rand(2, 9, 6), rand(2, 9, 4)
    k[..., :4, :] += 1.5 * q.mean(-2, keepdim=True)  # the first chunk's scores are larger: the maximum falls
    cases.append(("batch 2, 3 queries, the first chunk holding the larger scores", split(q, k, v, 4)))
    q, k, v = rand(1, 4), rand(7, 4), rand(7, 1)
    cases.append(("decoding: one query, no batch axes, d_v = 1", split(q, k, v, 3)))
    q, k, v = rand(2, 4, 6), rand(2, 8, 6), rand(2, 8, 3)
    masks = (torch.tensor([True, True, True, False])[:, None].expand(4, 4),  # row 3 sees nothing at all
             torch.tensor([True, False, True, False])[:, None].expand(4, 4))  # rows 1, 3 see nothing of chunk b
    cases.append(("chunks with no visible key for some queries (m = −inf, l = 0, acc = 0), query 3 seeing no key at "
                  "all", split(q, k, v, 4, masks)))
    q, k, v = rand(3, 8) * 40, rand(12, 8) * 40, rand(12, 6)
    cases.append(("scores up to ±1000, float32", tuple(tuple(t.float() for t in p) for p in split(q, k, v, 6))))
    return cases


def _unpack_partial(result: Any, tried: str, want) -> tuple[torch.Tensor, ...]:
    if isinstance(result, torch.Tensor):  # which tensor it is, before unpack's general words
        finished = torch.where(want[1] > 0, want[2] / want[1].clamp(min=1e-300), torch.zeros_like(want[2]))
        tol = _tol(result.dtype) if result.is_floating_point() else dict(atol=0, rtol=0)
        fail("returned one tensor, not (m, l, acc)", tried=tried, got=f"one tensor of shape {tuple(result.shape)}",
             expected="a tuple (m, l, acc)", fix="return the merged (m, l, acc); divide by l after the last merge",
             cause="you returned the finished output acc / l" if same(result, finished, **tol)
             else "you returned only the merged acc" if same(result, want[2], **tol) else "")
    return unpack(result, ("m", "l", "acc"), tried=tried)


_PROBE_M = ((0.0, -2.0), (-1.5, 0.5), (0.3, 0.3))  # (m_a, m_b) per row: a larger, b larger, equal


def _measured_factors(fn: Learner, dtype: torch.dtype) -> str:
    """A cause naming the factor the learner's merge gives a side's l or acc where it is not exp(m_side − m), read off
    by changing one side's sums at a time (a merge is affine in them); "" when none can be read."""
    m_a, m_b = (torch.tensor([[r[i]] for r in _PROBE_M], dtype=dtype) for i in (0, 1))

    def run(s_a: float, s_b: float):
        out = fn((m_a, torch.full_like(m_a, s_a), torch.full_like(m_a, s_a)),
                 (m_b, torch.full_like(m_b, s_b), torch.full_like(m_b, s_b)))
        if not (isinstance(out, (tuple, list)) and len(out) == 3 and all(
                isinstance(t, torch.Tensor) and tuple(t.shape) == (3, 1) for t in out)):
            raise ValueError("not a partial")
        return [t.double() for t in out]

    try:
        base, a2, b2, lin = run(1, 1), run(2, 1), run(1, 2), run(3, 2)
    except (Failure, LearnerRaised, LearnerTimedOut, ValueError):
        return ""
    m_a, m_b = m_a.double(), m_b.double()
    m = torch.maximum(m_a, m_b)
    rows = ", ".join(f"({fmt(a)}, {fmt(b)})" for a, b in _PROBE_M)
    def show(t: torch.Tensor) -> str:
        return ", ".join(map(fmt, t.flatten().tolist()))
    for i, part in ((1, "l"), (2, "acc")):  # the merge as c + α·s_a + β·s_b, read off three runs, checked on a fourth
        alpha, beta = a2[i] - base[i], b2[i] - base[i]
        const = base[i] - alpha - beta
        if not same(lin[i], const + 3 * alpha + 2 * beta, **LOOSE):
            continue  # not affine in the sums: no factor to read
        wrong = [(side, got, m_s, torch.exp(m_s - m)) for side, got, m_s in (("a", alpha, m_a), ("b", beta, m_b))
                 if not same(got, torch.exp(m_s - m), **LOOSE)]
        extra = "" if same(const, 0 * const, **LOOSE) else f" adds {show(const)} to {part} that no sum multiplies"
        if not (wrong or extra):
            continue
        text = f"measured on rows with (m_a, m_b) = {rows}: your merge"
        if wrong:
            side, got, m_s, want = wrong[0]
            labels = ((torch.ones_like(want), "1 in every row: not rescaled"),
                      (torch.zeros_like(want), f"0: that side's {part} is left out"),
                      (-want, "minus the right factor: subtracted instead of added"),
                      (1 / want, "the inverse of the right factor: divided by it, or exp(m − m_side)"),
                      (m_s - m, "m_side − m itself: the exp is missing"))
            label = next((name for value, name in labels if same(got, value, **LOOSE)), "")
            text += (f" multiplies part {side}'s {part} by {show(got)} where exp(m_{side} − m) is {show(want)}"
                     + (f" ({label})" if label else "") + (" and" if extra else ""))
        return text + extra
    return ""


@check("merge_partials", expects="a function merge_partials(part_a, part_b) returning (m, l, acc)")
def check_merge_partials(fn: Learner) -> str:
    suspects, names, cases = Suspects(MERGE, **LOOSE), ("m", "l", "acc"), _merge_cases()
    for name, (a, b) in cases:
        for order, (x, y) in (("(a, b)", (a, b)), ("(b, a)", (b, a))):
            tried, tol, want = f"merge_partials{order} on {name}", _tol(a[0].dtype), _merge_variant(x, y)
            got = _unpack_partial(call_explained(fn, x, y, tried=tried, expected="(m, l, acc)", patterns=_PATTERNS),
                                  tried, want)
            right = [same(g, w, **tol) for g, w in zip(got, want)]
            for perm in ((0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)):
                if not all(right) and all(same(got[i], want[j], **tol) for i, j in enumerate(perm)):
                    order = ", ".join(names[j] for j in perm)
                    fail(f"returned ({order}), not (m, l, acc)", tried=tried,
                         got=f"the right values in the order ({order})", expected="the tuple (m, l, acc)",
                         cause=f"you returned them in the order ({order})", fix="return m, l, acc in that order")
            for g, w, part in zip(got, want, names):
                expect_shape(g, w.shape, tried=tried, what=f"the merged {part}",
                             fix="m and l are (..., n_q, 1) and acc is (..., n_q, d_v), like the inputs")
            if all(right):
                suspects.passed((x, y), _pack(*want))  # a right case rules out the mistakes that change it
                for g, part in zip(got, names):
                    lower_precision(g, x[0].dtype, tried=tried, what=f"the merged {part}", grid=False)
                continue
            empty = torch.isinf(x[0]) & torch.isinf(y[0]) & (x[0] < 0) & (y[0] < 0)  # neither chunk sees a key
            if empty.any() and torch.isfinite(got[0][empty]).all() and same(got[0][~empty], want[0][~empty], **tol):
                fail("m is not −inf where neither chunk sees a key", tried=tried,
                     got=f"m = {got[0][empty].flatten()[0].item():.4g} where m_a = m_b = −inf",
                     expected="m = −inf there (with l = 0 and acc = 0)",
                     cause="you turned −inf into a finite number (nan_to_num, a clamp, or a large negative fill)",
                     fix="keep m = max(m_a, m_b) as it is; guard only the shift used inside exp")
            i = right.index(False)
            g_desc, e_desc, cause, summary = describe_mismatch(got[i], want[i], what=f"your {names[i]}", **tol)
            try:
                suspects.expect(_pack(*got), _pack(*want), (x, y), tried=tried, **tol,
                                again=lambda x, y: _pack(*fn(x, y)), distinguish=[p for _, p in cases])
            except Failure as failure:
                if (d := failure.diagnosis).cause:
                    fail(d.summary, tried=tried, got=g_desc, expected=e_desc, cause=d.cause, fix=d.fix)
            if i == 0 and (side := next((s for s, p in (("a", x), ("b", y)) if same(got[0], p[0], **tol)), None)):
                cause = f"your m equals part {side}'s m_{side} in every row, not the larger of m_a and m_b"
            elif got[i].isnan().any() and not want[i].isnan().any() and (x[0].isinf().any() or y[0].isinf().any()):
                cause = "NaN where a chunk sees no key: with m = −inf, exp(m_a − m) can be exp(−inf − (−inf)) = NaN"
            fail(f"{names[i]}: {summary}", tried=tried, got=g_desc, expected=e_desc,
                 cause=cause or _measured_factors(fn, a[0].dtype),
                 fix="m = max(m_a, m_b); each side is rescaled by exp(m_side − m) (0 when m_side = −inf); "
                     "l and acc are the rescaled sums")
    return (f"matches the definition on {len(cases)} cases, both orders (rising and falling maxima, chunks with "
            "no visible key, scores ±1000)")


# ================================================================================== sliding-window attention (tiled)
def _window_qkv(lead, n, d, seed, dtype=torch.float64):
    """q, k, v whose scores rise along the sequence for some rows and fall for others: every rescaling matters."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*lead, n, d, generator=g, dtype=torch.float64) + 1.0
    trend = torch.linspace(-2.5, 2.5, n, dtype=torch.float64)[:, None]
    k = torch.randn(*lead, n, d, generator=g, dtype=torch.float64)
    k[..., : n // 2, :] -= trend[: n // 2]  # falling, then rising
    k[..., n // 2:, :] += trend[n // 2:]
    return q.to(dtype), k.to(dtype), torch.randn(*lead, n, d + 1, generator=g, dtype=torch.float64).to(dtype)


def _tiled(q, k, v, w, b, mistake: str = "", skip: bool = False) -> torch.Tensor:
    """A tiled sliding-window loop (float64) with one classic mistake switched on; ``skip``: each query block's key
    loop starts at the window's first block (not block 0)."""
    q, k, v = q.double(), k.double(), v.double()
    n = q.shape[-2]
    scale = {"no_scale": 1.0, "scale_d": 1 / q.shape[-1]}.get(mistake, 1 / math.sqrt(q.shape[-1]))
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
    for qs in range(0, n, b):
        qe = min(qs + b, n)
        m = torch.full(q[..., qs:qe, :1].shape, 0.0 if mistake == "zero_init" else -math.inf, dtype=torch.float64)
        l, acc = torch.zeros_like(m), torch.zeros(q.shape[:-2] + (qe - qs, v.shape[-1]), dtype=torch.float64)
        first = max(0, qs - w + 1) // b * b if skip else 0
        if mistake == "ceil_start":  # the first block rounded up: keys of the window in it are never seen
            first = -(-max(0, qs - w + 1) // b) * b
        for ks in range(first, n - n % b if mistake == "k_tail" else qe, b):
            ke = min(ks + b, n)
            s = q[..., qs:qe, :] @ k[..., ks:ke, :].transpose(-2, -1) * scale
            rows, cols = torch.arange(qs, qe)[:, None], torch.arange(ks, ke)[None, :]
            if mistake == "local":
                rows, cols = rows - qs, cols - ks
            blocked = {"causal_only": cols > rows, "band_only": cols <= rows - w, "no_self_tiles": (cols >= rows) | (
                cols <= rows - w)}.get(mistake, (cols > rows) | (cols <= rows - w))
            s = s.masked_fill(blocked, -math.inf)
            m_new = {"global_max": torch.maximum(m.amax(), s.amax()).expand_as(m),  # one maximum for every row
                     "block_max": s.amax(-1, keepdim=True)}.get(mistake, torch.maximum(m, s.amax(-1, keepdim=True)))
            finite = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            shift = m_new if mistake == "unguarded" else finite
            alpha, p = torch.exp(m - shift), torch.exp(s - shift)
            l = {"sum": l, "neither": l, "sum_block": 0}.get(mistake, l * alpha) + p.sum(-1, keepdim=True)
            acc = (acc if mistake in ("acc", "neither") else acc * alpha) + p @ v[..., ks:ke, :]
            m = m_new
        out[..., qs:qe, :] = acc if mistake == "division" else acc / l
    return out


_BAND = "keep key j for query i iff i − window < j ≤ i"
_LOCAL = ("mask built from positions inside the tile", "you compared row and column numbers inside each tile, not the "
          "positions q_start + r and k_start + c", "rows = torch.arange(q_start, q_end), cols = torch.arange(k_start, "
          "k_end)")


def _masked(**band):
    return lambda q, k, v, w, b: _attn(q, k, v, mask=_window(q.shape[-2], q.shape[-2], w, **band))


_MEMO: dict[tuple, tuple] = {}  # (id(q), mistake, skip) → (q, output): the engine asks for one more than once


def _loop(key: str, summary: str, cause: str, fix: str, skips=(False,)) -> list[Known]:
    """Mistake ``key`` of :func:`_tiled`, in a loop that visits every key block and/or one that skips those outside."""

    def make(q, k, v, w, b, skip):
        if (memo := (id(q), key, skip)) not in _MEMO:  # the stored q keeps its id from being reused
            _MEMO[memo] = (q, _tiled(q, k, v, w, b, key, skip))
        return _MEMO[memo][1]

    return [Known(f"{key}{'_skip' if skip else ''}", summary, cause, fix, lambda *case, skip=skip: make(*case, skip))
            for skip in skips]


BOTH, SKIP = (True, False), (True,)
_RESCALE = "before adding the block, rescale by exp(m_old − m_new)"
_WITHIN = "mask key j for query i unless i − window < j ≤ i, in every tile"
#: A case of sliding_window_attention: (q, k, v, window, block_size).
WINDOW_ATTENTION = [
    Known("wide", "window off by one: one key too many", "each query sees window + 1 keys (key ≥ query − window)",
          _BAND, _masked(lo=-1)),
    Known("narrow", "window off by one: one key too few", "each query sees window − 1 keys", _BAND, _masked(lo=1)),
    Known("ignored", "window ignored", "the output is plain causal attention: every earlier key is visible",
          "mask keys j ≤ i − window too, and skip the blocks that hold only such keys", _masked(lo=-math.inf)),
    Known("acausal", "window not causal", "your queries also see up to `window` keys in the future",
          "mask keys after the query (j > i) as well", _masked(causal=False)),
    Known("not_causal", "not causal", "every query sees every key", "mask keys j > i and j ≤ i − window",
          lambda q, k, v, w, b: _attn(q, k, v)),
    Known("no_self", "the query does not see itself", "your band stops one key before the query", _BAND,
          _masked(hi=-1)),
    Known("shifted", "the query does not see itself", "your band is shifted one key into the past (keys i − window "
          "… i − 1)", _BAND, _masked(lo=-1, hi=-1)),
] + [known for key, summary, cause, fix, skips in [
    ("no_self_tiles", "the query does not see itself", "your tiles mask key j = i too (j ≥ i, not j > i): query 0 "
     "sees no key (0 / 0 = NaN), the others miss their own", _BAND, SKIP),
    ("local", *_LOCAL, BOTH),
    ("sum", "running sum not rescaled", "when the maximum grows you add to l without rescaling it",
     _RESCALE + " (l and acc)", ()),
    ("acc", "accumulator not rescaled", "when the maximum grows you add to acc without rescaling it",
     _RESCALE + " (acc as l)", ()),
    ("neither", "neither l nor acc rescaled", "when the maximum grows neither l nor acc is rescaled",
     _RESCALE + " (both)", ()),
    ("division", "no final division", "the output is the unnormalised accumulator",
     "divide acc by l once, after the last key block", ()),
    ("k_tail", "last key block dropped", "the last, shorter key block is never visited when n is not a multiple of "
     "the block", "loop with range(start, q_end, block_size): slicing stops at the end", BOTH),
    ("global_max", "one running maximum for all rows", "you took the maximum over the whole tile (amax without "
     "dim=-1): a row far below another underflows to 0 / 0", "one maximum per row: scores.amax(dim=-1, "
     "keepdim=True)", BOTH),
    ("zero_init", "running maximum started at 0", "with every score of a row far below 0, exp(s − 0) underflows and "
     "the row becomes 0 / 0", "start it at −inf: torch.full(..., -math.inf)", BOTH),
    ("block_max", "the block's maximum instead of the running maximum", "when a block's scores fall far below an "
     "earlier block's, exp(m_old − m_block) overflows", "m_new = torch.maximum(m_old, block maximum)", BOTH),
    ("unguarded", "NaN where a row sees no key of a whole tile", "when a tile holds none of a row's keys, its "
     "running maximum is still −inf and exp(−inf − (−inf)) = NaN", "shift by 0 where the new maximum is −inf: "
     "torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)", BOTH),
    ("ceil_start", "a key block inside the window skipped", "your key loop starts one block too late (rounded up, "
     "not down): the keys at the window's start are never seen", "start at max(0, q_start − window + 1) // "
     "block_size * block_size", ()),
    ("causal_only", "window not applied inside the tiles", "you skipped the blocks outside the window but masked "
     "only future keys: a visited block's keys before the window count", _WITHIN, SKIP),
    ("band_only", "keys after the query not masked", "your tiles mask the keys before the window but not those "
     "after the query (j > i)", _WITHIN, SKIP),
    ("sum_block", "running sum restarted in every block", "you set l to the block's own sum instead of adding it to "
     "the rescaled running sum", "l = l·exp(m_old − m_new) + block sum", SKIP),
    ("no_scale", "scores not scaled", "you did not multiply q kᵀ by 1/√d_k", "scale the scores by 1 / "
     "math.sqrt(d_k)", ()),
    ("scale_d", "divided by d_k instead of √d_k", "you divided the scores by d_k", "scale by 1 / math.sqrt(d_k)", ()),
] for known in _loop(key, summary, cause, fix, skips or (False,))]

_ATTN_CASES = [
    ("q, k (10, 4), v (10, 5), window 3, block 4", ((), 10, 4), 3, 4),
    ("q, k (2, 3, 37, 8), window 8, block 16", ((2, 3), 37, 8), 8, 16),
    ("q, k (2, 40, 8), window 20 (not a multiple of the block), block 8", ((2,), 40, 8), 20, 8),
    ("q, k (12, 4), window 1 (each query sees only itself), block 4", ((), 12, 4), 1, 4),
    ("q, k (9, 4), window 20 (longer than the sequence), block 4", ((), 9, 4), 20, 4),
    ("q, k (8, 4), window 3, block 1", ((), 8, 4), 3, 1),
    ("q, k (1, 1, 4): a single token, window 2, block 4", ((1,), 1, 4), 2, 4),
    ("q, k (2, 9, 4) whose rows' scores differ by more than 10³ (each row needs its own maximum), window 4, "
     "block 4", ((2,), 9, 4), 4, 4),
    ("q, k (2, 24, 8) float32, window 5, block 8", ((2,), 24, 8), 5, 8),
    ("q, k (2, 10, 4) with every score below −1000, window 5, block 2", ((2,), 10, 4), 5, 2),
    ("q, k (10, 4) whose scores fall by hundreds from one key to the next, window 6, block 2", ((), 10, 4), 6, 2),
]


def _attn_case(i: int) -> tuple[str, tuple]:
    label, (lead, n, d), w, b = _ATTN_CASES[i]
    q, k, v = _window_qkv(lead, n, d, 50 + i, torch.float32 if "float32" in label else torch.float64)
    if "differ by more" in label:
        q[..., 0, :] *= 1000.0  # row 0's scores are in the thousands, the others near 1
    if "below −1000" in label:
        q, k = q.abs() + 0.5, k - 600.0  # q·k/√d_k ≈ −600·Σ q_i / 2 for every query and key
    if "fall by hundreds" in label:
        q = q.abs() + 1.0
        k = torch.linspace(1600, -5600, n, dtype=torch.float64)[:, None] / q.sum(-1).mean() * 2 + 0.1 * k
    return label, (q, k, v, w, b)


_WINDOW_LOOP = (_BAND + "; visit the key blocks from the one holding key max(0, q_start − window + 1) to q_end; "
                "rescale l and acc by exp(m_old − m_new) at every block")


def _right_on(fn: Learner, args: tuple, expected: torch.Tensor, tol: dict, rows: slice = slice(None)) -> bool:
    """Whether the learner's function gives ``expected`` on ``args`` (in the query rows ``rows``); raising is wrong."""
    try:
        return same(as_tensor(fn(*args), tried="", what="")[..., rows, :], expected[..., rows, :], **tol)
    except (Failure, LearnerRaised, LearnerTimedOut, IndexError):  # IndexError: an answer with too few axes
        return False


def _window_cause(fn: Learner, out: torch.Tensor, case: tuple, tol: dict) -> tuple[str, str, str]:
    """(summary or "", cause, fix) of a wrong answer no known mistake reproduces: only the last, shorter query block
    wrong; which keys a wrong row attended to; or the simplest setting where the function is already wrong."""
    q, k, v, w, b = case
    n = q.shape[-2]
    expected = _sdpa(q, k, v, _window(n, n, w))
    close = torch.isclose(out.double(), expected, equal_nan=True, **tol).all(-1)
    close = close.reshape(-1, n).all(0)  # (n,): which query rows are right in every batch entry
    m = n - b  # rows right in a full query block: wrong as the last, shorter block of the first m tokens too?
    first_m = (q[..., :m, :], k[..., :m, :], v[..., :m, :], w, b)
    if n % b and n > 2 * b and bool(close[:n - n % b].all()) and not _right_on(
            fn, first_m, expected[..., :m, :], tol, slice(m - m % b, None)):
        return (f"wrong only in the last, shorter query block (rows {n - n % b} … {n - 1})", f"n = {n} is not a "
                f"multiple of block_size = {b}, and your loop mishandles the last {_rows(n % b)} (a range that stops "
                "before them, or a block length taken as block_size)", "loop with range(0, n, block_size); the last "
                "slice is shorter: use its own length for the accumulators")
    if bool(close.all()):
        return "", "", ""  # wrong only beyond isclose's reach (nothing to locate)
    i = int((~close).nonzero()[0])
    for lo in range(i + 1):  # the keys lo … hi this row attended to, if a contiguous run explains it
        for hi in range(lo, n):
            seen = _attn(q[..., i:i + 1, :], k[..., lo:hi + 1, :], v[..., lo:hi + 1, :])[..., 0, :]
            if same(out[..., i, :], seen, **tol):
                return "", (f"query {i}'s output is attention over keys {lo} … {hi}, where it may see keys "
                            f"{max(0, i - w + 1)} … {i} (window {w}, blocks of {b}): check the mask, the key blocks "
                            "visited, and weights that underflow to 0"), _BAND
    settings = [(n, n, "one tile and no window (block_size = window = n: plain causal attention)", "the steps every "
                 "tile takes are wrong (scores, mask, exponentials, sums or the final division)"),
                (w, n, f"one tile with window {w} (block_size = n)", "what depends on the window is wrong (the band's "
                 "lower edge j > i − window, or which key blocks you visit)"),
                (n, b, f"blocks of {b} and no window (window = n)", "what changes with several blocks is wrong (the "
                 "block loops, the running maximum, the rescaling by exp(m_old − m_new), or the running sums)")]
    right = []
    for ww, bb, text, where in settings:
        if not _right_on(fn, (q, k, v, ww, bb), _sdpa(q, k, v, _window(n, n, ww)), tol):
            verdict = f"right on {' and on '.join(right)}, but wrong on" if right else "wrong even on"
            return "", f"your function is {verdict} {text}: so {where}", _WINDOW_LOOP
        right.append(text)
    return "", (f"your function is right on {', on '.join(right)}, and wrong only where tiles and the window meet: "
                "which key blocks each query block visits, or the mask in the tiles the band's edge cuts"), _WINDOW_LOOP


def _needed_tiles(n: int, b: int, w: int) -> int:
    """Tiles (query block × key block) holding at least one key some query of the block may see."""
    from ..inference import visited_key_blocks

    return sum(len(visited_key_blocks(qs, min(qs + b, n), w, b)) for qs in range(0, n, b))


@probe("inference.work")
def _work(fn, *args) -> dict[str, Any]:
    """Learner-side: ``fn(*args)``'s matmul FLOPs, the torch functions it called, the shapes of the float tensors it
    built and how many products returned each shape."""
    seen = watch(fn, *args)
    return {key: seen[key] for key in ("flops", "ops", "shapes", "products")}


#: (n, d_k, block, window, batch) of the work measurements. The window's first key falls one past a block boundary
#: in the first, on one in the second (a loop starting a block early shows); the block sizes differ from each other,
#: d_k, d_v and 64 (so do tiles of a fixed size).
_WORK_CASES = [(80, 6, 8, 8, 2), (80, 6, 4, 9, 2)]


def _check_work(fn: Learner) -> None:
    measured = []  # per work case: (n, d, b, w, batch), tried, the probe's report, side s → (…, s, s) products
    for j, (n, d, b, w, batch) in enumerate(_WORK_CASES):
        tried = f"sliding_window_attention(q, k, v, window={w}, block_size={b}) on q, k ({batch}, {n}, {d})"
        work = fn.observe("inference.work", *_window_qkv((batch,), n, d, 70 + j), w, b)
        if any("scaled_dot_product" in op or "flash_attention" in op for op in work["ops"]):
            fail("calls F.scaled_dot_product_attention", tried=tried, got="a call to a fused attention kernel",
                 expected="the tiled loop, written out", cause="the values are right, but the exercise is the loop",
                 fix="compute each tile's scores with q_block @ k_blockᵀ; keep the running max, sum and accumulator")
        if full := [tuple(s) for s in work["shapes"] if tuple(s[-2:]) == (n, n)]:
            fail("built the full n × n score matrix", tried=tried, got=f"a floating-point tensor of shape {full[0]}",
                 expected="no tensor larger than a (block, block) tile of scores",
                 cause="the values are right, but the memory is O(n²): that is what tiling avoids",
                 fix="compute scores one (block, block) tile at a time")
        square: dict[int, int] = {}
        for shape, count in work["products"]:
            if len(shape) >= 2 and shape[-1] == shape[-2] >= 2:
                square[shape[-1]] = square.get(shape[-1], 0) + int(count)
        measured.append(((n, d, b, w, batch), tried, work, square))
    for (n, d, b, w, batch), tried, work, square in measured:
        full_tiles = _needed_tiles(n - n % b, b, w)  # tiles of the full query blocks: every one is (b, b)
        if square.get(b, 0) < full_tiles / 2:
            if common := sorted(set.intersection(*(set(m[3]) for m in measured)) - {c[2] for c in _WORK_CASES}):
                cause = (f"your tiles are {common[-1]} × {common[-1]} whatever block_size is passed "
                         f"(block_size = {', '.join(str(c[2]) for c in _WORK_CASES)} here): block_size is ignored")
                fix = "cut the queries and keys into blocks of block_size (the argument), not of a fixed size"
            else:
                cause = (f"your code computed {square.get(b, 0)} ({b}, {b}) products where the window needs "
                         f"{full_tiles} tiles: the scores come in pieces of another shape (row by row, or one slab of "
                         "keys per query block)")
                fix = "loop over query blocks and, inside, key blocks: each tile is q_block @ k_blockᵀ"
            fail("scores not computed in (block_size, block_size) tiles", tried=tried,
                 got=f"{square.get(b, 0)} matrix products of shape (…, {b}, {b})",
                 expected=f"score tiles of shape (…, {b}, {b}) (shorter only at the end of the sequence)",
                 cause=cause, fix=fix)
    for (n, d, b, w, batch), tried, work, _ in measured:
        per_tile = batch * (2.0 * b * b * d + 2.0 * b * b * (d + 1))  # q·kᵀ and p·v of one full tile
        needed, flops = per_tile * _needed_tiles(n, b, w), float(work["flops"])
        if flops > needed + 0.5:
            fail("blocks outside the window are computed", tried=tried,
                 got=f"{flops:.0f} matrix-multiply FLOPs ({flops / per_tile:.1f} tiles' worth)",
                 expected=f"at most {needed:.0f} ({needed / per_tile:.0f} tiles: for each query block, only the key "
                          f"blocks that hold keys q_start − window + 1 … q_end − 1)",
                 cause="the values are right, but your loop also computes key blocks wholly before the window (or "
                       "after the diagonal), which the mask then erases",
                 fix="start the key loop at the block holding key max(0, q_start − window + 1) and stop it at q_end")


@check("sliding_window_attention",
       expects="a function sliding_window_attention(q, k, v, window, block_size) returning a tensor (..., n, d_v)")
def check_sliding_window_attention(fn: Learner) -> str:
    suspects = Suspects(WINDOW_ATTENTION, **LOOSE)
    _MEMO.clear()
    for i in range(len(_ATTN_CASES)):
        label, case = _attn_case(i)
        (q, k, v, w, b), n = case, case[0].shape[-2]
        tried, tol = f"sliding_window_attention(q, k, v, window={w}, block_size={b}) on {label}", _tol(q.dtype)
        out = as_tensor(call_explained(fn, *case, tried=tried, expected="a tensor (..., n, d_v)", patterns=_PATTERNS),
                        tried=tried)
        expected = _sdpa(q, k, v, mask=_window(n, n, w))
        if tuple(out.shape) == tuple(q.shape) and q.shape[-1] != v.shape[-1]:
            fail("output as wide as q, not v", tried=tried, got=f"shape {tuple(out.shape)}",
                 expected=f"shape {tuple(expected.shape)}", cause="you sized the output or the accumulator with d_k",
                 fix="use v.shape[-1] (d_v) for the output and the accumulator")
        try:
            suspects.expect(out, expected, case, tried=tried, **tol, again=fn)
        except Failure as failure:
            d = failure.diagnosis
            if d.cause or tuple(out.shape) != tuple(expected.shape):
                raise
            summary, cause, fix = _window_cause(fn, out, case, tol)
            fail(summary or d.summary, tried=tried, got=d.got, expected=d.expected, cause=cause, fix=fix)
        if out.dtype != q.dtype:
            fail(f"result in {_name(out.dtype)}, not q's {_name(q.dtype)}", tried=tried, got=_name(out.dtype),
                 expected=_name(q.dtype), cause="you created the output (or the accumulator) without dtype=q.dtype",
                 fix="allocate with dtype=q.dtype (or torch.zeros_like from q's tensors)")
    _MEMO.clear()
    _check_work(fn)
    return (f"matches F.scaled_dot_product_attention with the window mask on {len(_ATTN_CASES)} cases and computes "
            "only the key blocks inside the window")
