"""Checks for notebook 11 (attention at inference): KVCache, bottom_right_causal_mask, merge_partials,
sliding_window_mask and sliding_window_attention.

Oracles: ``F.scaled_dot_product_attention`` (causal, or with an explicit boolean mask), and for the
masks ``torch.ones(n_q, n_k).tril(n_k − n_q)`` (what ``torch.nn.attention.bias.causal_lower_right``
materialises). Partials (m, l, acc) are compared with their definition computed in float64.
Every check replays the classic mistakes of its exercise (a cache appended in the wrong order or on the
wrong axis, a query that does not see itself, top-left alignment, a merge without rescaling, a window
one key too wide…) and names the one the answer reproduces.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .attention import Case, explain_raise as _explain_raise, lower_precision
from .boundary import probe
from .compare import Failure, describe_mismatch, matching_mistakes, same
from .core import (Learner, LearnerRaised, LearnerTimedOut, Mistake, as_tensor, check, expect_close, expect_shape, fail,
                   learner_error)
from .kit import einsum_flops, reproduce as _reproduce

__all__ = ["check_KVCache", "check_bottom_right_causal_mask", "check_merge_partials", "check_sliding_window_mask",
           "check_sliding_window_attention"]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return dict(atol=1e-6, rtol=1e-5) if dtype == torch.float64 else dict(atol=3e-5, rtol=1e-3)


def _sdpa(q, k, v, mask=None, causal=False) -> torch.Tensor:
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask, is_causal=causal)


def _attn(q, k, v, *, scale=None, mask=None, dim=-1) -> torch.Tensor:
    """softmax(q kᵀ · scale) v in float64, with a bool mask (True = keep); rows without keys give zeros."""
    q, k, v = q.double(), k.double(), v.double()
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, dim=dim)
    return torch.nan_to_num(w, nan=0.0) @ v


def _naive_attn(q, k, v) -> torch.Tensor:
    """Softmax without the max shift, in the input's dtype: overflows for large scores."""
    e = torch.exp(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))
    return (e / e.sum(-1, keepdim=True)) @ v


_BITS = {torch.float64: 53, torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}


def _expect_precision(got: torch.Tensor, input_dtype: torch.dtype, *, tried: str, what: str) -> None:
    """Fail, naming the dtype, when ``got`` (already right to its own precision) is of a narrower floating-point
    dtype than the inputs: the docstrings ask for the inputs' dtype."""
    if got.is_floating_point() and _BITS.get(got.dtype, 99) < _BITS.get(input_dtype, 0):
        lower_precision(got, input_dtype, tried=tried, what=what)


def _one_tensor(value: Any, *, tried: str, what: str) -> torch.Tensor:
    if isinstance(value, (tuple, list)) and value and all(isinstance(x, torch.Tensor) for x in value):
        fail(f"{what} returned {len(value)} tensors, not one", tried=tried,
             got=f"a {type(value).__name__} of {len(value)} tensors", expected="one tensor",
             fix="return only the attention output (the weights are not needed here)")
    return as_tensor(value, tried=tried, what=what)


def _bool_mask(value: Any, expected: torch.Tensor, *, tried: str, what: str = "your mask") -> torch.Tensor:
    """The answer as a bool tensor; a 0/1 or additive float mask is named as such."""
    t = as_tensor(value, tried=tried, what="your function", expected="a bool tensor")
    if t.dtype == torch.bool:
        return t
    dtype = str(t.dtype).replace("torch.", "")
    if tuple(t.shape) == tuple(expected.shape):
        if same(t.double(), expected.double(), atol=0, rtol=0):
            fail(f"{what} has dtype {dtype}, not bool", tried=tried, got=f"the right 0/1 values as {dtype}",
                 expected="a bool tensor (True = may attend)",
                 cause=f"you built the mask as numbers ({dtype})", fix="build it with dtype=torch.bool, or end with .bool()")
        if t.is_floating_point() and same(t, torch.zeros(t.shape, dtype=t.dtype).masked_fill(~expected, float("-inf")),
                                          atol=0, rtol=0):
            fail("returned the additive form (0 / −inf), not a bool mask", tried=tried,
                 got=f"{dtype} with 0 where allowed and −inf where blocked", expected="a bool tensor (True = may attend)",
                 fix="return the bool mask itself; turn it into 0 / −inf only where scores are masked")
    fail(f"{what} has dtype {dtype}, not bool", tried=tried, got=f"a {dtype} tensor of shape {tuple(t.shape)}",
         expected="a bool tensor (True = may attend)", fix="build the mask with dtype=torch.bool (comparisons give bool)")


def _expect_mask(got: torch.Tensor, expected: torch.Tensor, *, tried: str, mistakes: list[Mistake], fix: str) -> None:
    """Exact comparison of two bool masks; when no known mistake matches, say which entries are wrong."""
    if tuple(got.shape) == tuple(expected.shape) and got.numel() and not bool(got.any()) and bool(expected.any()):
        alike = matching_mistakes(got, mistakes, atol=0, rtol=0)  # known mistakes that keep nothing on this shape
        fail("the mask blocks every key", tried=tried, got="False everywhere: no query may attend to any key",
             expected=f"{int(expected.sum())} of the {expected.numel()} entries True (True = may attend), at least "
                      "one per query",
             cause=" — or ".join(f"possibly {m.summary}: {m.cause} (on this shape that keeps no key at all)"
                                 for m in alike),
             fix=alike[0].fix if alike else fix)
    try:
        expect_close(got, expected, tried=tried, what="your mask", atol=0, rtol=0, mistakes=mistakes, fix=fix)
    except Failure as failure:
        if failure.diagnosis.cause or tuple(got.shape) != tuple(expected.shape):
            raise
        extra, missing = (got & ~expected).nonzero().tolist(), (~got & expected).nonzero().tolist()
        parts = []
        if extra:
            parts.append(f"{len(extra)} blocked key(s) allowed (the first: query {extra[0][0]}, key {extra[0][1]})")
        if missing:
            parts.append(f"{len(missing)} allowed key(s) blocked (the first: query {missing[0][0]}, key {missing[0][1]})")
        fail(f"wrong entries in the mask: {' and '.join(p.split(' (')[0] for p in parts)}", tried=tried,
             got="; ".join(parts), expected="the entries the docstring describes", fix=fix)


# ================================================================================== KVCache
_CACHE_EXPECTS = "a class KVCache with methods append(k, v) → (K, V) and attend(q) → output"
_FIX_APPEND = "torch.cat([cached, new], dim=-2): the sequence axis, new tokens after the cached ones"


def _cache_cases() -> list[dict]:
    cases = []
    g = _gen(11)

    def qkv(lead, n, d_k, d_v, dtype=torch.float64, scale=1.0):
        q = torch.randn(*lead, n, d_k, generator=g, dtype=torch.float64) * scale
        k = torch.randn(*lead, n, d_k, generator=g, dtype=torch.float64) * scale
        v = torch.randn(*lead, n, d_v, generator=g, dtype=torch.float64)
        return q.to(dtype), k.to(dtype), v.to(dtype)

    cases.append(dict(name="batch 2 × heads 3, 6 tokens one at a time, d_k = 8, d_v = 5", qkv=qkv((2, 3), 6, 8, 5),
                      chunks=[1] * 6))
    cases.append(dict(name="batch and heads of size 1, float32, 5 tokens, d_k = d_v = 4",
                      qkv=qkv((1, 1), 5, 4, 4, torch.float32), chunks=[1] * 5))
    cases.append(dict(name="no batch axes (k is (1, 6)), 4 tokens, d_v = 3", qkv=qkv((), 4, 6, 3), chunks=[1] * 4))
    cases.append(dict(name="a prompt of 4 tokens appended at once, then 3 tokens one at a time, batch 2 × heads 2",
                      qkv=qkv((2, 2), 7, 6, 4), chunks=[4, 1, 1, 1]))
    cases.append(dict(name="scores up to ±100, float32 (a softmax must subtract the row maximum)",
                      qkv=qkv((2,), 5, 4, 3, torch.float32, scale=6.0), chunks=[1] * 5, large=True))
    cases.append(dict(name="a longer sequence: 3 tokens at once, then 21 one at a time, no batch axes, d_k = 3, "
                           "d_v = 2", qkv=qkv((), 24, 3, 2), chunks=[3] + [1] * 21))
    return cases


def _cache_mistakes_kv(old: torch.Tensor | None, new: torch.Tensor, shared_old: torch.Tensor | None = None) -> list[Mistake]:
    """Wrong versions of the returned K (or V) after appending ``new`` to ``old`` (the right cache so far);
    ``shared_old`` is every token appended to any cache so far, when two caches are in use."""
    out = []
    if shared_old is not None:
        out.append(Mistake("the two caches share their storage", "two KVCache objects returned each other's tokens: "
                           "the cache lives in a class attribute (e.g. `keys = []` written in the class body), "
                           "which every instance shares", "create the storage in __init__: self.k = None (or "
                           "self.keys = [])", torch.cat([shared_old, new], dim=-2)))
    if old is None:
        out += [Mistake("cache appended on the wrong axis", "you stacked the tokens along a new axis instead of "
                        "concatenating them along the sequence axis (-2)", _FIX_APPEND,
                        lambda dim=dim: torch.stack([new], dim=dim)) for dim in range(-new.dim() - 1, 0)]
    if new.shape[-2] > 1:
        for which, part in (("first", new[..., :1, :]), ("last", new[..., -1:, :])):
            out.append(Mistake(f"append kept only the {which} of several new tokens", f"when {new.shape[-2]} tokens "
                               f"arrive at once (a prompt), you stored only the {which} one",
                               "store every new token: torch.cat([cached, k], dim=-2) takes all n_new rows of k",
                               part if old is None else torch.cat([old, part], dim=-2)))
    if old is None:
        return out
    out += [
        Mistake("cache appended in the wrong order", "you put the new token before the cached ones (torch.cat([new, "
                "cached]))", "new tokens go last: " + _FIX_APPEND, torch.cat([new, old], dim=-2)),
        Mistake("returned the cache before appending", "you returned the cache as it was before the new token was added",
                "append first, then return the whole cache", old),
    ]
    for dim in range(-new.dim(), 0):
        if dim == -2:
            continue
        axis = "the feature axis (-1)" if dim == -1 else f"axis {dim}"
        out.append(Mistake("cache appended on the wrong axis", f"you concatenated along {axis}, not the sequence axis "
                           "(-2)", _FIX_APPEND, lambda dim=dim: torch.cat([old, new], dim=dim)))
    for dim in range(-new.dim() - 1, 0):
        out.append(Mistake("cache appended on the wrong axis", "you stacked the tokens along a new axis instead of "
                           "concatenating them along the sequence axis (-2)", _FIX_APPEND,
                           lambda dim=dim: torch.stack([old, new], dim=dim)))
    return out


def _unpack_kv(result: Any, tried: str) -> tuple[torch.Tensor, torch.Tensor]:
    if result is None:
        fail("append returned None", tried=tried, got="None", expected="the whole cache (K, V)",
             cause="append stores the tokens but has no `return`",
             fix="end append with `return self.k, self.v` (every key and value so far)")
    if isinstance(result, torch.Tensor) or not isinstance(result, (tuple, list)) or len(result) != 2:
        got = f"one tensor of shape {tuple(result.shape)}" if isinstance(result, torch.Tensor) else type(result).__name__
        fail("append did not return (K, V)", tried=tried, got=got, expected="a tuple (K, V) of the whole cache",
             fix="end append with `return self.k, self.v`")
    for item, name in zip(result, "KV"):
        if isinstance(item, (list, tuple)):
            fail(f"append returned {name} as a Python {type(item).__name__}", tried=tried,
                 got=f"a {type(item).__name__} of {len(item)} items as {name}", expected=f"{name} as one tensor",
                 fix=f"join the stored tokens into one tensor: torch.cat(list, dim=-2)")
    return (as_tensor(result[0], tried=tried, what="append's K"),
            as_tensor(result[1], tried=tried, what="append's V"))


def _attend_mistakes(q, K, V, large: bool) -> list[Mistake]:
    d_k = q.shape[-1]
    strict = K[..., :-1, :], V[..., :-1, :]
    itself = ("the newest token does not attend to itself", "your query attends to the tokens before it but not to "
              "its own key (positions off by one)", "append the new token's k and v first, then attend over every "
              "cached key, the newest included")
    return ([Mistake("no maximum subtracted", "your softmax exponentiates the raw scores, so e^100 overflowed (inf/inf "
                     "= NaN)", "use torch.softmax (or subtract each row's maximum before exp)",
                     lambda: _naive_attn(q, K, V))] if large else []) + [
        Mistake(*itself, lambda: _attn(q, *strict)),
        Mistake(*itself, lambda: torch.full(q.shape[:-1] + (V.shape[-1],), float("nan"), dtype=torch.float64)
                if K.shape[-2] == 1 else None),
        Mistake("scores not scaled", "you did not divide the scores by √d_k", "divide q Kᵀ by math.sqrt(d_k)",
                lambda: _attn(q, K, V, scale=1.0)),
        Mistake("divided by d_k instead of √d_k", "you divided the scores by d_k", "divide by math.sqrt(d_k)",
                lambda: _attn(q, K, V, scale=1 / d_k)),
        Mistake("softmax over the wrong axis", "you took the softmax over the query axis (-2): with one query every "
                "weight is 1", "torch.softmax(scores, dim=-1): over the keys", lambda: _attn(q, K, V, dim=-2)),
        Mistake("top-left alignment used for decode", "your query sees only key 0: with one query and several keys, "
                "is_causal=True (or a mask built as tril over (1, t)) aligns the mask at the top-left corner",
                "one new query may see every cached key: no mask at all (or a bottom-right aligned one)",
                lambda: V[..., :1, :].double() if K.shape[-2] > 1 else None),
        Mistake("attended only to the newest token", "your output is the newest token's value: the query saw one key",
                "attend over every cached key (the whole K and V)", lambda: V[..., -1:, :].double()
                if K.shape[-2] > 1 else None),
        Mistake("weights multiplied by K, not V", "you multiplied the weights by the keys", "output = weights @ V",
                lambda: _attn(q, K, K)),
        Mistake("returned the weights, not the output", "attend returned softmax(q Kᵀ / √d_k), shape (..., 1, t), "
                "without multiplying by V", "return weights @ V, shape (..., 1, d_v)",
                lambda: torch.softmax(q.double() @ K.double().transpose(-2, -1) / math.sqrt(d_k), dim=-1)),
        Mistake("no softmax", "you multiplied V by the scaled scores themselves, not by their softmax",
                "weights = torch.softmax(scores, dim=-1), then weights @ V",
                lambda: (q.double() @ K.double().transpose(-2, -1) / math.sqrt(d_k)) @ V.double()),
        Mistake("uniform weights: the mean of V", "your output is the plain average of the cached values: every key "
                "got the same weight, whatever the scores", "weight each value by softmax(q Kᵀ / √d_k)",
                lambda: V.double().mean(-2, keepdim=True) if K.shape[-2] > 1 else None),
        Mistake("scores divided by √d_v instead of √d_k", "you scaled by the values' width d_v",
                "divide by math.sqrt(q.shape[-1]) (d_k)",
                lambda: _attn(q, K, V, scale=1 / math.sqrt(V.shape[-1])) if V.shape[-1] != d_k else None),
    ]


def _attend_raised(exc: LearnerRaised, q, K, V, tried: str) -> Failure:
    """The diagnosis of an exception in attend, with a cause only when the check reproduces its very message."""
    if "out of range" in exc.message and "imension" in exc.message:
        return Failure(learner_error(
            exc, tried=tried, expected="the output (..., 1, d_v)",
            cause="your code names an axis by its number from the front (such as transpose(2, 3)), which "
                  "does not exist when there are fewer leading axes",
            fix="count axes from the end: K.transpose(-2, -1)"))
    hint = _explain_raise(exc, Case("attend", q, K, V, None, atol=0.0))
    if not hint and _reproduce(lambda: q @ V.transpose(-2, -1)) == exc.message:
        hint = dict(cause="you computed the scores with V instead of K (q Vᵀ: d_v ≠ d_k here)",
                    fix="scores = q @ K.transpose(-2, -1) / math.sqrt(d_k); then weights @ V")
    return Failure(learner_error(exc, tried=tried, expected="the output (..., 1, d_v)", **hint))


def _consistent(summary: str, steps: list[dict]) -> bool:
    """Whether an answer that made the mistake ``summary`` would have given every output of ``steps``: a mistake
    that coincides with another on one step is told apart by the others."""
    for step in steps:
        values = [v for v in (m.value() for m in step["mistakes"] if m.summary == summary) if v is not None]
        if values and not any(same(step["out"], v, **step["tol"]) for v in values) and not (
                same(step["out"], step["expected"], **step["tol"]) and any(same(step["expected"], v, **step["tol"])
                                                                          for v in values)):
            return False
    return True


def _construct(cls: Learner, tried: str) -> Learner:
    try:
        return cls.construct()
    except LearnerRaised as exc:
        raise Failure(learner_error(exc, tried=tried, expected="an empty cache",
                                    fix="KVCache() takes no arguments: start with self.k = self.v = None")) from None


def _append(cache: Learner, k: torch.Tensor, v: torch.Tensor, tried: str, fresh: bool,
            expected: tuple[torch.Tensor, torch.Tensor]):
    try:
        K, V = _unpack_kv(cache.method("append")(k, v), tried)
        K_true, V_true = expected
        if K_true.shape != V_true.shape and tuple(K.shape) == tuple(V_true.shape) and tuple(V.shape) == tuple(K_true.shape):
            fail("append returned (V, K)", tried=tried, got="the values first, then the keys", expected="(K, V)",
                 fix="return self.k, self.v in that order")
        return K, V
    except LearnerRaised as exc:
        if "out of range" in exc.message and "imension" in exc.message:
            raise Failure(learner_error(
                exc, tried=tried, expected="the whole cache (K, V)",
                cause="your code names an axis by its number from the front (such as dim=2), which does not exist "
                      "(or is another axis) when there are fewer leading axes",
                fix="count axes from the end: the sequence axis is dim=-2")) from None
        if fresh and "must match" in exc.message:
            raise Failure(learner_error(
                exc, tried=tried, expected="the new token's (K, V)",
                cause="the first append to a new KVCache() found tokens already stored: the storage is shared by "
                      "every KVCache object (a class attribute such as `keys = []` in the class body)",
                fix="create the storage in __init__: self.k = self.v = None")) from None
        raise


def _rows(n: int) -> str:
    """'1 row', '3 rows'."""
    return f"{n} row" if n == 1 else f"{n} rows"


def _tokens(n: int) -> str:
    """'token' (the last token), '3 tokens'."""
    return "token" if n == 1 else f"{n} tokens"


def _the_right(n: int) -> str:
    """'the right one', 'the 3 right ones'."""
    return "the right one" if n == 1 else f"the {n} right ones"


def _only_new_returned(cache: Learner, got: torch.Tensor, new: torch.Tensor, *, has_old: bool, what: str,
                       q_new: torch.Tensor, kv_all: tuple[torch.Tensor, torch.Tensor],
                       kv_new: tuple[torch.Tensor, torch.Tensor], tried: str, tol: dict) -> None:
    """When append returned only the tokens it was just given, ask attend whether the cache itself kept the earlier
    ones: a cache that lost them ("overwritten") and one that kept them but returns the wrong thing are told apart."""
    if not has_old or not same(got, new, **tol):
        return
    try:
        seen = as_tensor(cache.method("attend")(q_new), tried=tried, what="attend")
    except (Failure, LearnerRaised, LearnerTimedOut):
        seen = None
    n_new = new.shape[-2]
    new_tokens = "the new token" if n_new == 1 else f"the {n_new} new tokens"
    if seen is not None and same(seen, _sdpa(q_new, *kv_all), **tol):
        fail("append returned only the new tokens", tried=tried,
             got=f"{what} holds {new_tokens} only, yet attend(q) sees every token appended so far: the cache "
                 "itself is right",
             expected=f"{what} of the whole cache, {_rows(kv_all[0].shape[-2])}: every token so far, oldest first",
             cause="append stores the tokens but returns the k and v it was given instead of the whole cache",
             fix="end append with `return self.k, self.v`, after the concatenation")
    if seen is not None and same(seen, _sdpa(q_new, *kv_new), **tol):
        fail("cache overwritten", tried=tried,
             got=f"{what} holds {new_tokens} only, and attend(q) sees only {new_tokens} as well",
             expected=f"{_rows(kv_all[0].shape[-2])}: every token so far, oldest first",
             cause="you replaced the cache with the newest token(s) instead of adding them to it",
             fix="keep what is cached and append: " + _FIX_APPEND)
    fail("append returned only the new tokens", tried=tried, got=f"{what} holds {new_tokens} only",
         expected=f"{_rows(kv_all[0].shape[-2])}: every token so far, oldest first",
         cause="either the cache keeps only the newest token(s) (it is overwritten), or it keeps them all but append "
               "returns the k and v it was given; attend's output is wrong as well, so it cannot tell which",
         fix="keep what is cached and append (" + _FIX_APPEND + "), then `return self.k, self.v`")


def _expect_cache(got: torch.Tensor, want: torch.Tensor, *, tried: str, what: str, mistakes: list[Mistake],
                  tol: dict) -> None:
    n_got, n_want = (got.shape[-2], want.shape[-2]) if got.dim() >= 2 else (0, 0)
    if got.dim() == want.dim() and n_got > n_want and tuple(got.shape[:-2]) == tuple(want.shape[:-2]) \
            and same(got[..., n_got - n_want:, :], want, **tol):
        fail(f"{what} holds tokens from another cache", tried=tried,
             got=f"{_rows(n_got)}: {_the_right(n_want)} after {_rows(n_got - n_want)} never appended to this cache",
             expected=f"{_rows(n_want)}: the tokens appended to this cache", cause="your KVCache objects share their storage (a class attribute such as "
             "`keys = []` in the class body), so a new cache starts with an old one's tokens",
             fix="create the storage in __init__: self.k = self.v = None")
    if got.dim() == want.dim() and 0 < n_got < n_want and tuple(got.shape[:-2]) == tuple(want.shape[:-2]) \
            and got.shape[-1] == want.shape[-1] and not any(same(got, m.value(), **tol) for m in mistakes
                                                            if m.value() is not None):
        dropped = same(got, want[..., n_want - n_got:, :], **tol)
        fail(f"{what} holds {n_got} of the {n_want} tokens", tried=tried,
             got=_rows(n_got) + (": the newest ones, the oldest dropped" if dropped else ""),
             expected=f"{_rows(n_want)}: every token appended so far",
             cause=(f"your cache keeps only the last {_tokens(n_got)} (a window or a fixed-size buffer)" if dropped else
                    f"your cache stopped growing at {_tokens(n_got)} (a buffer of fixed size?)"),
             fix="keep every token: grow the cache with torch.cat([cached, new], dim=-2) (or enlarge a buffer when full)")
    expect_close(got, want, tried=tried, what=what, mistakes=mistakes, **tol,
                 fix="append returns the whole cache: every row so far, oldest first, shape (..., t, d)")


@check("KVCache", kind="class", expects=_CACHE_EXPECTS)
def check_KVCache(cls: Learner) -> str:
    # Two caches side by side first (before any other cache exists): each must keep its own tokens.
    q, k, v = _cache_cases()[0]["qkv"]
    k2, v2 = k.flip(-2) + 1.0, v.flip(-2) - 1.0
    first, second = _construct(cls, "KVCache()"), _construct(cls, "KVCache()")
    appended: list[torch.Tensor] = []  # every key appended to either cache, in order
    for t in range(3):
        for which, kk, vv, cache in (("first", k, v, first), ("second", k2, v2, second)):
            tried = f"two KVCache() objects, appending one token to each in turn: token {t} of the {which}"
            new = kk[..., t:t + 1, :]
            K, V = _append(cache, new, vv[..., t:t + 1, :], tried, fresh=t == 0,
                           expected=(kk[..., :t + 1, :], vv[..., :t + 1, :]))
            shared = torch.cat(appended, dim=-2) if appended else None
            if shared is None or not same(K, torch.cat([shared, new], dim=-2), **_tol(k.dtype)):
                _only_new_returned(cache, K, new, has_old=t > 0, what="the returned K", q_new=q[..., t:t + 1, :],
                                   kv_all=(kk[..., :t + 1, :], vv[..., :t + 1, :]),
                                   kv_new=(new, vv[..., t:t + 1, :]), tried=tried, tol=_tol(k.dtype))
            _expect_cache(K, kk[..., :t + 1, :], tried=tried, what="the returned K", tol=_tol(k.dtype),
                          mistakes=_cache_mistakes_kv(kk[..., :t, :] if t else None, new, shared))
            appended.append(new)
    cases = _cache_cases()
    for case in cases:
        q, k, v = case["qkv"]
        tol = _tol(q.dtype)
        cache = _construct(cls, "KVCache()")
        start = 0
        steps: list[dict] = []  # each attend's output; judged once the case is over (or stops early)
        wrong = None  # the first step whose output is wrong
        try:
            for n_new in case["chunks"]:
                stop = start + n_new
                what_token = f"tokens {start}…{stop - 1}" if n_new > 1 else f"token {start}"
                tried = f"append(k, v) of {what_token}, then attend(q) of token {stop - 1}, on {case['name']}"
                K_true, V_true = k[..., :stop, :], v[..., :stop, :]
                K, V = _append(cache, k[..., start:stop, :], v[..., start:stop, :], tried, fresh=start == 0,
                               expected=(K_true, V_true))
                for got, want, new, name in ((K, K_true, k[..., start:stop, :], "K"),
                                             (V, V_true, v[..., start:stop, :], "V")):
                    old = want[..., :start, :] if start else None
                    _only_new_returned(cache, got, new, has_old=start > 0, what=f"the returned {name}",
                                       q_new=q[..., stop - 1:stop, :], kv_all=(K_true, V_true),
                                       kv_new=(k[..., start:stop, :], v[..., start:stop, :]), tried=tried, tol=tol)
                    extra = [Mistake("append returned the keys as V", "the second element append returns is the keys",
                                     "return self.k, self.v", K_true)] if name == "V" else []
                    _expect_cache(got, want, tried=tried, what=f"the returned {name}", tol=tol,
                                  mistakes=_cache_mistakes_kv(old, new) + extra)
                    _expect_precision(got, want.dtype, tried=tried, what=f"the returned {name}")
                q_new = q[..., stop - 1:stop, :]
                try:
                    out = _one_tensor(cache.method("attend")(q_new), tried=tried, what="attend")
                except LearnerRaised as exc:
                    raise _attend_raised(exc, q_new, K_true, V_true, tried) from None
                expected = _sdpa(q_new, K_true, V_true)
                steps.append(dict(tried=tried, out=out, expected=expected, tol=tol,
                                  mistakes=_attend_mistakes(q_new, K_true, V_true, case.get("large", False))))
                if wrong is None and not same(out, expected, **tol):
                    wrong = steps[-1]
                start = stop
        except (Failure, LearnerRaised, LearnerTimedOut):
            if wrong is None:
                raise  # otherwise the earlier wrong output is the first thing to report
        if wrong is not None:
            told_apart = [m for m in wrong["mistakes"] if _consistent(m.summary, steps)]
            expect_close(wrong["out"], wrong["expected"], tried=wrong["tried"], what="attend's output", **tol,
                         mistakes=told_apart,
                         fix="attend returns softmax(q Kᵀ / √d_k) V over every cached key, shape (..., 1, d_v)")
        for step in steps:
            _expect_precision(step["out"], q.dtype, tried=step["tried"], what="attend's output")
    return (f"equals causal attention token by token on {len(cases)} cases (batch × heads, no batch axes, a prompt "
            "appended at once, scores ±100) and keeps two caches apart")


# ================================================================================== bottom-right causal mask
_ALIGN_FIX = ("the n_q queries are the last n_q positions: query i sits at position i + n_k − n_q, so "
              "mask = torch.ones(n_q, n_k, dtype=torch.bool).tril(diagonal=n_k - n_q)")


def _mask_mistakes(n_q: int, n_k: int) -> list[Mistake]:
    ones = torch.ones(n_q, n_k, dtype=torch.bool)
    right = ones.tril(n_k - n_q)
    return [
        Mistake("top-left alignment used for decode", "you aligned the mask at the top-left corner (query i sees keys "
                "0 … i, what is_causal=True does): the new queries lose the keys of the cached tokens", _ALIGN_FIX,
                lambda: ones.tril()),
        Mistake("positions off by one: the query does not see itself", "your diagonal is one to the left: query i "
                "sees keys before its own position but not itself", _ALIGN_FIX, lambda: ones.tril(n_k - n_q - 1)),
        Mistake("positions off by one: one future key visible", "your diagonal is one to the right: each query also "
                "sees the key after its own position", _ALIGN_FIX, lambda: ones.tril(n_k - n_q + 1)),
        Mistake("offset with the wrong sign", "you shifted the diagonal by n_q − n_k instead of n_k − n_q",
                _ALIGN_FIX, lambda: ones.tril(n_q - n_k)),
        Mistake("upper triangle kept", "you kept the upper triangle (keys after the query) instead of the lower one",
                _ALIGN_FIX, lambda: ones.triu(n_k - n_q)),
        Mistake("mask polarity inverted", "True marks the blocked keys in your mask; in this course True means 'may "
                "attend'", "negate it: ~mask", lambda: ~right),
        Mistake("no mask at all", "every key is visible to every query", _ALIGN_FIX, lambda: ones),
        Mistake("rows and columns swapped", "your mask has one row per key and one column per query",
                "shape (n_q, n_k): one row per query", lambda: torch.ones(n_k, n_q, dtype=torch.bool).tril(n_k - n_q)),
        Mistake("rows and columns swapped", "your mask has one row per key and one column per query",
                "shape (n_q, n_k): one row per query", lambda: right.T),
    ]


_MASK_CASES = [(3, 7), (1, 6), (5, 5), (1, 1), (2, 9), (4, 6), (6, 13)]


@check("bottom_right_causal_mask", expects="a function bottom_right_causal_mask(n_q, n_k) returning a bool (n_q, n_k) tensor")
def check_bottom_right_causal_mask(fn: Learner) -> str:
    for n_q, n_k in _MASK_CASES:
        tried = f"bottom_right_causal_mask({n_q}, {n_k})"
        expected = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)
        got = _bool_mask(fn(n_q, n_k), expected, tried=tried)
        _expect_mask(got, expected, tried=tried, mistakes=_mask_mistakes(n_q, n_k), fix=_ALIGN_FIX)
    return (f"equals causal_lower_right on {len(_MASK_CASES)} shapes (decode n_q = 1, a chunk of queries over a "
            "longer cache, square)")


# ================================================================================== merge of partials
def _partials(q, k, v, mask=None):
    from ..inference import partial_attention

    return partial_attention(q.double(), k.double(), v.double(), mask)


def _merge_variant(a, b, mistake: str = ""):
    """The merge in float64, or one of its classic mistakes."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = [[t.double() for t in p] for p in (a, b)]
    m = {"min": torch.minimum(m_a, m_b), "logaddexp": torch.logaddexp(m_a, m_b)}.get(mistake, torch.maximum(m_a, m_b))
    if mistake == "finite_m":  # −inf replaced by the most negative float (nan_to_num, clamp)
        m = torch.nan_to_num(m, neginf=torch.finfo(a[0].dtype).min)
    shift = m if mistake == "unguarded" else torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    alpha, beta = torch.exp(m_a - shift), torch.exp(m_b - shift)
    if mistake == "inverted":
        alpha, beta = torch.exp(shift - m_a), torch.exp(shift - m_b)
    if mistake == "absolute":
        alpha, beta = torch.exp(m_a), torch.exp(m_b)
    if mistake == "exp2":
        alpha, beta = torch.exp2(m_a - shift), torch.exp2(m_b - shift)
    if mistake == "swapped":
        alpha, beta = beta, alpha
    l, acc = l_a * alpha + l_b * beta, acc_a * alpha + acc_b * beta
    if mistake == "winner":  # the side with the larger maximum alone
        pick = m_a >= m_b
        l, acc = torch.where(pick, l_a, l_b), torch.where(pick, acc_a, acc_b)
    if mistake == "average":
        l, acc = (l_a + l_b) / 2, (acc_a + acc_b) / 2
    if mistake == "none":
        l, acc = l_a + l_b, acc_a + acc_b
    elif mistake == "only_l":
        acc = acc_a + acc_b
    elif mistake == "only_acc":
        l = l_a + l_b
    elif mistake == "m_first":
        m = m_a
    elif mistake == "m_first_rel":  # m = m_a, and both sides rescaled relative to it
        shift_a = torch.where(torch.isfinite(m_a), m_a, torch.zeros_like(m_a))
        alpha, beta = torch.exp(m_a - shift_a), torch.exp(m_b - shift_a)
        m, l, acc = m_a, l_a * alpha + l_b * beta, acc_a * alpha + acc_b * beta
    elif mistake == "m_sum":
        m = m_a + m_b
    elif mistake == "normalised":
        acc = acc / l
    return m, l, acc


_MERGE_MISTAKES = [
    ("none", "merge without rescaling", "you added l_a + l_b and acc_a + acc_b, but the two were computed relative to "
     "different maxima m_a and m_b", "rescale each side by exp(m_side − m) with m = max(m_a, m_b) before adding"),
    ("inverted", "rescaled by exp(m − m_side) instead of exp(m_side − m)", "your factors are ≥ 1: the rescaling is the "
     "wrong way round", "multiply by exp(m_a − m) and exp(m_b − m), each ≤ 1"),
    ("absolute", "rescaled by e^m instead of e^(m_side − m)", "you multiplied by exp(m_a) and exp(m_b), which overflow "
     "and forget the new maximum", "multiply by exp(m_a − m) and exp(m_b − m) with m = max(m_a, m_b)"),
    ("only_l", "acc not rescaled", "you rescaled l but added the two accumulators as they were",
     "rescale acc_a and acc_b by the same factors as l_a and l_b"),
    ("only_acc", "l not rescaled", "you rescaled the accumulators but added l_a + l_b as they were",
     "rescale l_a and l_b by the same factors as acc_a and acc_b"),
    ("m_first", "m not updated to the larger maximum", "you returned m_a as the merged m", "return m = max(m_a, m_b)"),
    ("m_first_rel", "m not updated to the larger maximum", "you kept m_a as the merged m and rescaled side b by "
     "exp(m_b − m_a), which overflows when m_b is much larger", "m = max(m_a, m_b); rescale each side by "
     "exp(m_side − m)"),
    ("m_sum", "m added instead of maximised", "you returned m_a + m_b as the merged m",
     "return m = torch.maximum(m_a, m_b)"),
    ("normalised", "acc divided by l", "you returned the normalised output acc / l instead of the accumulator",
     "keep acc unnormalised: the division by l happens once, after the last merge"),
    ("unguarded", "NaN where neither chunk sees a key", "where m_a = m_b = −inf, exp(m_a − m) is exp(−inf − (−inf)) "
     "= exp(NaN)", "shift by 0 where m is −inf: m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)"),
    ("min", "m = min(m_a, m_b), not the maximum", "you took the smaller maximum, so the factors exp(m_side − m) are "
     "≥ 1 and overflow for large scores", "m = torch.maximum(m_a, m_b)"),
    ("logaddexp", "m = logsumexp(m_a, m_b), not max(m_a, m_b)", "you combined the two maxima with logaddexp; m is "
     "the largest score, the max of the two", "m = torch.maximum(m_a, m_b); the sums l carry the rest"),
    ("finite_m", "m is not −inf where neither chunk sees a key", "where both sides have m = −inf you returned a "
     "finite m (nan_to_num or a clamp turned −inf into the most negative number)",
     "keep m = max(m_a, m_b) as it is; guard only the shift used inside exp"),
    ("winner", "kept only the side with the larger maximum", "you returned the l and acc of the chunk whose m is "
     "larger and dropped the other chunk's keys; both contribute, the smaller one rescaled by exp(m_side − m)",
     "l = l_a·exp(m_a − m) + l_b·exp(m_b − m), and the same for acc"),
    ("average", "averaged the two sides instead of rescaling and adding", "you returned (l_a + l_b) / 2 and "
     "(acc_a + acc_b) / 2: the chunks are neither rescaled to the common maximum nor summed",
     "l = l_a·exp(m_a − m) + l_b·exp(m_b − m), and the same for acc"),
    ("swapped", "each side rescaled by the other side's factor", "you multiplied side a by exp(m_b − m) and side b by "
     "exp(m_a − m)", "side a gets exp(m_a − m), side b gets exp(m_b − m)"),
    ("exp2", "rescaled with 2^(m_side − m) instead of e^(m_side − m)", "you used exp2 (or 2 ** …), but m and l "
     "were computed with the natural exponential", "use torch.exp(m_side − m)"),
]


def _merge_cases() -> list[dict]:
    cases = []
    g = _gen(31)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    q, k, v = rand(2, 2, 3, 8), rand(2, 2, 10, 8), rand(2, 2, 10, 5)
    k[..., 5:, :] += 1.5 * q.mean(-2, keepdim=True)  # the second chunk's scores are larger: the maximum rises
    cases.append(dict(name="batch 2 × heads 2, 3 queries, the second chunk holding the larger scores",
                      parts=(_partials(q, k[..., :5, :], v[..., :5, :]), _partials(q, k[..., 5:, :], v[..., 5:, :]))))
    q, k, v = rand(2, 3, 6), rand(2, 9, 6), rand(2, 9, 4)
    k[..., :4, :] += 1.5 * q.mean(-2, keepdim=True)  # the first chunk's scores are larger: the maximum falls
    cases.append(dict(name="batch 2, 3 queries, the first chunk holding the larger scores",
                      parts=(_partials(q, k[..., :4, :], v[..., :4, :]), _partials(q, k[..., 4:, :], v[..., 4:, :]))))
    q, k, v = rand(1, 4), rand(7, 4), rand(7, 1)
    cases.append(dict(name="decoding: one query, no batch axes, d_v = 1",
                      parts=(_partials(q, k[:3], v[:3]), _partials(q, k[3:], v[3:]))))
    q, k, v = rand(2, 4, 6), rand(2, 8, 6), rand(2, 8, 3)
    mask_b = torch.tensor([True, False, True, False])[:, None].expand(4, 4)  # rows 1, 3 see nothing of chunk b
    mask_a = torch.tensor([True, True, True, False])[:, None].expand(4, 4)  # row 3 sees nothing at all
    cases.append(dict(name="chunks with no visible key for some queries (m = −inf, l = 0, acc = 0), "
                           "query 3 seeing no key at all",
                      parts=(_partials(q, k[..., :4, :], v[..., :4, :], mask_a),
                             _partials(q, k[..., 4:, :], v[..., 4:, :], mask_b))))
    q, k, v = rand(3, 8) * 40, rand(12, 8) * 40, rand(12, 6)
    cases.append(dict(name="scores up to ±1000, float32",
                      parts=tuple(tuple(t.float() for t in p)
                                  for p in (_partials(q, k[:6], v[:6]), _partials(q, k[6:], v[6:])))))
    return cases


def _unpack_partial(result: Any, tried: str, want=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if isinstance(result, torch.Tensor):
        cause = ""
        if want is not None:
            finished = torch.where(want[1] > 0, want[2] / want[1].clamp(min=1e-300), torch.zeros_like(want[2]))
            tol = _tol(result.dtype) if result.is_floating_point() else dict(atol=0, rtol=0)
            cause = ("you returned the finished output acc / l" if same(result, finished, **tol) else
                     "you returned only the merged acc" if same(result, want[2], **tol) else "")
        fail("returned one tensor, not (m, l, acc)", tried=tried, got=f"one tensor of shape {tuple(result.shape)}",
             expected="a tuple (m, l, acc)", cause=cause,
             fix="return the merged partial (m, l, acc); the division by l comes after the last merge")
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        got = f"a {type(result).__name__} of {len(result)} items" if isinstance(result, (tuple, list)) else \
            ("None" if result is None else type(result).__name__)
        fail("did not return (m, l, acc)", tried=tried, got=got, expected="a tuple (m, l, acc)",
             fix="end with `return m, l, acc`")
    names = ("m (first element)", "l (second element)", "acc (third element)")
    return tuple(as_tensor(x, tried=tried, what=n) for x, n in zip(result, names))  # type: ignore[return-value]


@check("merge_partials", expects="a function merge_partials(part_a, part_b) returning (m, l, acc)")
def check_merge_partials(fn: Learner) -> str:
    cases = _merge_cases()
    for case in cases:
        a, b = case["parts"]
        for order, (x, y) in (("(part_a, part_b)", (a, b)), ("(part_b, part_a)", (b, a))):
            tried = f"merge_partials{order.replace('part_a', 'a').replace('part_b', 'b')} on {case['name']}"
            want = _merge_variant(x, y)
            got = _unpack_partial(fn(x, y), tried, want)
            tol = _tol(x[0].dtype)
            variants = {key: _merge_variant(x, y, key) for key, *_ in _MERGE_MISTAKES}
            names = ("m", "l", "acc")
            for perm in ((0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)):
                if all(tuple(got[i].shape) == tuple(want[j].shape) and same(got[i], want[j], **tol)
                       for i, j in enumerate(perm)) and not all(same(g_t, w_t, **tol) for g_t, w_t in zip(got, want)):
                    order = ", ".join(names[j] for j in perm)
                    fail(f"returned ({order}), not (m, l, acc)", tried=tried, got=f"the right values in the order ({order})",
                         expected="the tuple (m, l, acc)", cause=f"you returned them in the order ({order})",
                         fix="return m, l, acc in that order")
            for i, (g_t, w_t) in enumerate(zip(got, want)):
                if tuple(g_t.shape) != tuple(w_t.shape):
                    expect_shape(g_t, w_t.shape, tried=tried, what=f"the merged {names[i]}",
                                 fix="m and l are (..., n_q, 1) and acc is (..., n_q, d_v), like the inputs")
            if all(same(g_t, w_t, **tol) for g_t, w_t in zip(got, want)):
                for g_t, name in zip(got, names):
                    _expect_precision(g_t, x[0].dtype, tried=tried, what=f"the merged {name}")
                continue
            empty = torch.isinf(x[0]) & torch.isinf(y[0]) & (x[0] < 0) & (y[0] < 0)  # neither chunk sees a key
            if empty.any() and tuple(got[0].shape) == tuple(empty.shape) and torch.isfinite(got[0][empty]).all() \
                    and same(got[0][~empty], want[0][~empty], **tol):
                fail("m is not −inf where neither chunk sees a key", tried=tried,
                     got=f"m = {got[0][empty].flatten()[0].item():.4g} where m_a = m_b = −inf",
                     expected="m = −inf there (with l = 0 and acc = 0)",
                     cause="you turned −inf into a finite number (nan_to_num, a clamp, or a large negative fill)",
                     fix="keep m = max(m_a, m_b) as it is; guard only the shift used inside exp")
            found = [(summary, cause, fix) for key, summary, cause, fix in _MERGE_MISTAKES
                     if all(same(g_t, w_t, **tol) for g_t, w_t in zip(got, variants[key]))]
            first_wrong = next(i for i, (g_t, w_t) in enumerate(zip(got, want)) if not same(g_t, w_t, **tol))
            g_desc, e_desc, cause, summary = describe_mismatch(got[first_wrong], want[first_wrong],
                                                               what=f"your {names[first_wrong]}", **tol)
            if found:
                summary, cause, fix = found[0]
                fail(summary, tried=tried, got=g_desc, expected=e_desc, cause=cause, fix=fix)
            if torch.isnan(got[first_wrong]).any() and not torch.isnan(want[first_wrong]).any() and (
                    torch.isinf(x[0]).any() or torch.isinf(y[0]).any()):
                cause = "NaN where a chunk sees no key: with m = −inf, exp(m_a − m) can be exp(−inf − (−inf)) = NaN"
            fail(f"{names[first_wrong]}: {summary}", tried=tried, got=g_desc, expected=e_desc, cause=cause,
                 fix="m = max(m_a, m_b); each side is rescaled by exp(m_side − m) (0 when m_side = −inf); "
                     "l and acc are the rescaled sums")
    return (f"matches the definition on {len(cases)} cases, both orders (rising and falling maxima, chunks with "
            "no visible key, scores ±1000)")


# ================================================================================== sliding-window mask
_WINDOW_FIX = ("query i sits at position p = i + n_k − n_q and sees key j iff p − window < j ≤ p: exactly `window` "
               "keys, itself included")


def _window(n_q, n_k, lo_offset=0, hi_offset=0, top_left=False, causal=True, window=1) -> torch.Tensor:
    pos = torch.arange(n_q)[:, None] + (0 if top_left else n_k - n_q)
    j = torch.arange(n_k)[None, :]
    keep = j > pos - window + lo_offset
    if causal:
        keep &= j <= pos + hi_offset
    else:
        keep &= j < pos + window - lo_offset
    return keep


def _window_mask_mistakes(n_q: int, n_k: int, w: int) -> list[Mistake]:
    right = _window(n_q, n_k, window=w)
    return [
        Mistake("window off by one: one key too many", "each query sees window + 1 keys (p − window ≤ j ≤ p)",
                _WINDOW_FIX, lambda: _window(n_q, n_k, lo_offset=-1, window=w)),
        Mistake("window off by one: one key too few", "each query sees window − 1 keys", _WINDOW_FIX,
                lambda: _window(n_q, n_k, lo_offset=1, window=w)),
        Mistake("top-left alignment used for decode", "you counted the queries' positions from 0 (query i at position "
                "i), but they are the last n_q of the n_k positions", _WINDOW_FIX,
                lambda: _window(n_q, n_k, top_left=True, window=w)),
        Mistake("window not causal", "your band reaches `window` keys into the future too", _WINDOW_FIX,
                lambda: _window(n_q, n_k, causal=False, window=w)),
        Mistake("window ignored", "your mask is causal but keeps every earlier key", _WINDOW_FIX,
                lambda: torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)),
        Mistake("positions off by one: the query does not see itself", "your band stops one key before the query's "
                "own position", _WINDOW_FIX, lambda: _window(n_q, n_k, hi_offset=-1, window=w)),
        Mistake("positions off by one: the query does not see itself", "your band is shifted one key into the past: "
                "keys p − window … p − 1", _WINDOW_FIX, lambda: _window(n_q, n_k, lo_offset=-1, hi_offset=-1, window=w)),
        Mistake("mask polarity inverted", "True marks the blocked keys in your mask; in this course True means "
                "'may attend'", "negate it: ~mask", lambda: ~right),
        Mistake("rows and columns swapped", "your mask has one row per key", "shape (n_q, n_k): one row per query",
                lambda: right.T),
    ]


_WINDOW_CASES = [(3, 10, 4), (6, 6, 3), (1, 9, 4), (5, 5, 1), (4, 4, 10), (2, 8, 8), (7, 12, 5), (1, 1, 1)]


@check("sliding_window_mask", expects="a function sliding_window_mask(n_q, n_k, window) returning a bool (n_q, n_k) tensor")
def check_sliding_window_mask(fn: Learner) -> str:
    for n_q, n_k, w in _WINDOW_CASES:
        tried = f"sliding_window_mask({n_q}, {n_k}, window={w})"
        expected = _window(n_q, n_k, window=w)
        got = _bool_mask(fn(n_q, n_k, w), expected, tried=tried)
        _expect_mask(got, expected, tried=tried, mistakes=_window_mask_mistakes(n_q, n_k, w), fix=_WINDOW_FIX)
    return (f"exact on {len(_WINDOW_CASES)} cases (decode, chunks over a longer cache, window 1, window longer "
            "than the sequence)")


# ================================================================================== sliding-window attention (tiled)

_MATMULS = {"matmul", "__matmul__", "mm", "bmm", "mv", "dot", "vdot", "inner", "linear", "addmm", "baddbmm",
            "addbmm", "addmv", "__rmatmul__", "tensordot"}


class _Watch(TorchFunctionMode):
    """Which torch functions ran, the shapes of the floating-point tensors (≥ 2-D) they returned, and the
    FLOPs (2 per multiply-add) of their matrix products. (A torch-function mode costs nothing to enter;
    PyTorch's FlopCounterMode imports torch._dynamo, seconds on a small machine.)"""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()
        self.shapes: set[tuple[int, ...]] = set()
        self.products: dict[tuple[int, ...], int] = {}  # how many matrix products returned each shape
        self.flops = 0.0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", str(func))
        self.ops.add(name)
        if isinstance(out, torch.Tensor):
            if (name == "einsum" or name in _MATMULS) and out.dim() >= 2:
                self.products[tuple(out.shape)] = self.products.get(tuple(out.shape), 0) + 1
            if name == "einsum":
                self.flops += einsum_flops(args, out)
            elif name in _MATMULS:
                operand = args[1] if name in ("addmm", "baddbmm", "addbmm", "addmv", "__rmatmul__") else args[0]
                if isinstance(operand, torch.Tensor) and operand.dim() and name != "tensordot":
                    self.flops += 2.0 * out.numel() * operand.shape[-1]
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() >= 2:
                self.shapes.add(tuple(t.shape))
        return out


@probe("inference.work")
def _work(fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
    """Learner-side: run ``fn(*args)`` and report its matrix-multiply FLOPs, the torch functions it called
    and the shapes of the floating-point tensors it built."""
    watch = _Watch()
    with watch:
        fn(*args)
    return {"flops": watch.flops, "ops": sorted(watch.ops), "shapes": [list(s) for s in sorted(watch.shapes)][:500],
            "products": [[list(s), c] for s, c in sorted(watch.products.items())][:500]}


def _window_qkv(lead, n, d, seed, dtype=torch.float64):
    """q, k, v whose scores rise along the sequence for some rows and fall for others: every rescaling matters."""
    g = _gen(seed)
    q = torch.randn(*lead, n, d, generator=g, dtype=torch.float64) + 1.0
    trend = torch.linspace(-2.5, 2.5, n, dtype=torch.float64)[:, None]
    k = torch.randn(*lead, n, d, generator=g, dtype=torch.float64)
    k[..., : n // 2, :] -= trend[: n // 2]  # falling, then rising
    k[..., n // 2:, :] += trend[n // 2:]
    v = torch.randn(*lead, n, d + 1, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _window_tiled_variant(q, k, v, w, b, mistake: str, skip: bool = False) -> torch.Tensor:
    """A tiled sliding-window loop (float64) with one classic mistake switched on; ``skip`` starts each query
    block's key loop at the window's first block (instead of block 0)."""
    q, k, v = q.double(), k.double(), v.double()
    n = q.shape[-2]
    scale = {"no_scale": 1.0, "scale_d": 1 / q.shape[-1]}.get(mistake, 1 / math.sqrt(q.shape[-1]))
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
    for qs in range(0, n, b):
        qe = min(qs + b, n)
        m = torch.full(q[..., qs:qe, :1].shape, 0.0 if mistake == "zero_init" else float("-inf"), dtype=torch.float64)
        l, acc = torch.zeros_like(m), torch.zeros(q.shape[:-2] + (qe - qs, v.shape[-1]), dtype=torch.float64)
        stop = n - n % b if mistake == "k_tail" else qe
        first = max(0, qs - w + 1) // b * b if skip else 0
        if mistake == "ceil_start":  # the first block rounded up: keys of the window in it are never seen
            first = -(-max(0, qs - w + 1) // b) * b
        for ks in range(first, stop, b):
            ke = min(ks + b, n)
            s = q[..., qs:qe, :] @ k[..., ks:ke, :].transpose(-2, -1) * scale
            rows, cols = torch.arange(qs, qe)[:, None], torch.arange(ks, ke)[None, :]
            if mistake == "local":
                rows, cols = rows - qs, cols - ks
            blocked = {"causal_only": cols > rows, "band_only": cols <= rows - w,
                       "no_self": (cols >= rows) | (cols <= rows - w)}.get(mistake, (cols > rows) | (cols <= rows - w))
            s = s.masked_fill(blocked, float("-inf"))
            if mistake == "global_max":  # one maximum shared by every row (and batch entry)
                m_new = torch.maximum(m.amax(), s.amax()).expand_as(m)
            elif mistake == "block_max":  # this block's maximum, not the running one
                m_new = s.amax(-1, keepdim=True)
            else:
                m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            shift = m_new if mistake == "unguarded" else torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            alpha, p = torch.exp(m - shift), torch.exp(s - shift)
            l = (l if mistake in ("sum", "neither") else 0 if mistake == "sum_block" else l * alpha) + p.sum(-1, keepdim=True)
            acc = (acc if mistake in ("acc", "neither") else acc * alpha) + p @ v[..., ks:ke, :]
            m = m_new
        out[..., qs:qe, :] = acc if mistake == "division" else acc / l
    return out


def _window_attention_mistakes(q, k, v, w, b) -> list[Mistake]:
    n = q.shape[-2]

    def masked(m):
        return lambda: _attn(q, k, v, mask=m)

    def tiled(kind, skip=False):
        return lambda: _window_tiled_variant(q, k, v, w, b, kind, skip)

    def in_either_loop(summary, cause, fix, kind, skip_first=True):
        """The same mistake in a loop that skips the blocks outside the window and in one that visits them all."""
        order = (True, False) if skip_first else (False, True)
        return [Mistake(summary, cause, fix, tiled(kind, skip=skip)) for skip in order]

    return [
        Mistake("window off by one: one key too many", "each query sees window + 1 keys (key ≥ query − window)",
                "keep key j for query i iff i − window < j ≤ i", masked(_window(n, n, lo_offset=-1, window=w))),
        Mistake("window off by one: one key too few", "each query sees window − 1 keys",
                "keep key j for query i iff i − window < j ≤ i", masked(_window(n, n, lo_offset=1, window=w))),
        Mistake("window ignored", "the output is plain causal attention: every earlier key is visible",
                "mask keys j ≤ i − window too, and skip the blocks that hold only such keys",
                masked(torch.ones(n, n, dtype=torch.bool).tril())),
        Mistake("window not causal", "your queries also see up to `window` keys in the future",
                "mask keys after the query (j > i) as well", masked(_window(n, n, causal=False, window=w))),
        Mistake("not causal", "every query sees every key", "mask keys j > i and j ≤ i − window",
                lambda: _attn(q, k, v)),
        Mistake("the query does not see itself", "your band stops one key before the query",
                "keep key j for query i iff i − window < j ≤ i", masked(_window(n, n, hi_offset=-1, window=w))),
        Mistake("the query does not see itself", "your band is shifted one key into the past (keys i − window … i − 1)",
                "keep key j for query i iff i − window < j ≤ i",
                masked(_window(n, n, lo_offset=-1, hi_offset=-1, window=w))),
        Mistake("the query does not see itself", "your tiles mask key j = i as well (j ≥ i instead of j > i), so "
                "query 0 sees no key at all (0 / 0 = NaN) and every other query misses its own key",
                "keep key j for query i iff i − window < j ≤ i", tiled("no_self", skip=True)),
        Mistake("mask built from positions inside the tile", "you compared the row and column numbers inside each "
                "tile instead of the global positions q_start + r and k_start + c",
                "compare global positions: rows = torch.arange(q_start, q_end), cols = torch.arange(k_start, k_end)",
                tiled("local")),
        Mistake("mask built from positions inside the tile", "you compared the row and column numbers inside each "
                "tile instead of the global positions q_start + r and k_start + c",
                "compare global positions: rows = torch.arange(q_start, q_end), cols = torch.arange(k_start, k_end)",
                tiled("local", skip=True)),
        Mistake("running sum not rescaled", "when the maximum grows you add to l without multiplying it by "
                "exp(m_old − m_new)", "rescale l (and acc) by exp(m_old − m_new) before adding the block", tiled("sum")),
        Mistake("accumulator not rescaled", "when the maximum grows you add to acc without multiplying it by "
                "exp(m_old − m_new)", "rescale acc (as l) by exp(m_old − m_new) before adding the block", tiled("acc")),
        Mistake("neither l nor acc rescaled", "when the maximum grows neither the running sum nor the accumulator "
                "is rescaled", "multiply both by exp(m_old − m_new) before adding the block", tiled("neither")),
        Mistake("no final division", "the output is the unnormalised accumulator", "divide acc by l once, after the "
                "last key block", tiled("division")),
        *in_either_loop("last key block dropped", "the last, shorter key block is never visited when n is not a "
                        "multiple of the block", "loop over key blocks with range(start, q_end, block_size): slicing "
                        "stops at the end", "k_tail", skip_first=False),
        *in_either_loop("one running maximum for all rows", "you took the maximum over the whole tile (amax without "
                        "dim=-1), so a row whose scores are far below another row's underflows to 0 / 0", "keep one "
                        "maximum per query row: scores.amax(dim=-1, keepdim=True)", "global_max"),
        *in_either_loop("running maximum started at 0", "you started the running maximum at 0 instead of −inf: when "
                        "every score of a row is far below 0, exp(s − 0) underflows to 0 and the row becomes 0 / 0",
                        "start it at −inf: torch.full(..., -math.inf)", "zero_init"),
        *in_either_loop("the block's maximum instead of the running maximum", "you rescaled by each block's own "
                        "maximum: when a block's scores fall far below an earlier block's, exp(m_old − m_block) "
                        "overflows", "m_new = torch.maximum(m_old, block maximum)", "block_max"),
        *in_either_loop("NaN where a row sees no key of a whole tile", "for a row whose keys in this tile are all "
                        "outside the window, the running maximum is still −inf and exp(−inf − (−inf)) = NaN", "shift "
                        "by 0 where the new maximum is −inf: torch.where(torch.isinf(m_new), torch.zeros_like(m_new), "
                        "m_new)", "unguarded"),
        Mistake("a key block inside the window skipped", "your key loop starts one block too late (the first block "
                "rounded up instead of down), so the keys at the window's start are never seen", "start at the block "
                "holding key max(0, q_start − window + 1): max(0, q_start − window + 1) // block_size * block_size",
                tiled("ceil_start")),
        Mistake("window not applied inside the tiles", "you skipped the blocks outside the window but masked only "
                "the future keys: a visited block's keys before the window still count", "mask key j for query i "
                "unless i − window < j ≤ i, in every tile", tiled("causal_only", skip=True)),
        Mistake("keys after the query not masked", "your tiles mask the keys before the window but not the keys "
                "after the query (j > i) in the diagonal tile", "mask key j for query i unless i − window < j ≤ i, "
                "in every tile", tiled("band_only", skip=True)),
        Mistake("running sum restarted in every block", "you set l to the block's own sum instead of adding it to "
                "the rescaled running sum", "l = l·exp(m_old − m_new) + block sum", tiled("sum_block", skip=True)),
        Mistake("scores not scaled", "you did not multiply q kᵀ by 1/√d_k", "scale the scores by 1 / math.sqrt(d_k)",
                tiled("no_scale")),
        Mistake("divided by d_k instead of √d_k", "you divided the scores by d_k", "scale by 1 / math.sqrt(d_k)",
                tiled("scale_d")),
    ]


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
#: (n, d_k, block, window, batch) of the work measurements. The window's first key falls one past a block
#: boundary in the first and on a boundary in the second, so a loop that starts one block early is seen
#: there; the two block sizes differ (and differ from d_k, d_v and 64), so tiles of a fixed size are seen too.
_WORK_CASES = [(80, 6, 8, 8, 2), (80, 6, 4, 9, 2)]


def _needed_tiles(n: int, b: int, w: int) -> int:
    """Tiles (query block × key block) holding at least one key some query of the block may see."""
    from ..inference import visited_key_blocks

    return sum(len(visited_key_blocks(qs, min(qs + b, n), w, b)) for qs in range(0, n, b))


def _measure_work(fn: Learner, n: int, d: int, b: int, w: int, batch: int, seed: int) -> tuple[str, dict]:
    q, k, v = _window_qkv((batch,), n, d, seed)
    tried = f"sliding_window_attention(q, k, v, window={w}, block_size={b}) on q, k ({batch}, {n}, {d})"
    work = fn.observe("inference.work", q, k, v, w, b)
    if not isinstance(work, dict):
        fail("the work could not be measured", tried=tried, got=repr(work), expected="a measurement",
             fix="run the cell again; if it repeats, tell your instructor")
    return tried, work


def _check_work(fn: Learner) -> None:
    measured = [(case, *_measure_work(fn, *case, seed=70 + j)) for j, case in enumerate(_WORK_CASES)]
    squares: list[dict[int, int]] = []  # per run: side s ≥ 2 → how many (…, s, s) matrix products it computed
    for (n, d, b, w, batch), tried, work in measured:
        ops = set(work.get("ops", []))
        if any("scaled_dot_product" in op or "flash_attention" in op for op in ops):
            fail("calls F.scaled_dot_product_attention", tried=tried, got="a call to a fused attention kernel",
                 expected="the tiled loop, written out",
                 cause="the values are right, but the exercise is the loop itself",
                 fix="compute each tile's scores with q_block @ k_blockᵀ and keep the running max, sum and accumulator")
        shapes = [tuple(s) for s in work.get("shapes", [])]
        full = [s for s in shapes if s[-2:] == (n, n)]
        if full:
            fail("built the full n × n score matrix", tried=tried, got=f"a floating-point tensor of shape {full[0]}",
                 expected="no tensor larger than a (block, block) tile of scores",
                 cause="the values are right, but the memory is O(n²): that is what tiling avoids",
                 fix="compute scores one (block, block) tile at a time")
        square: dict[int, int] = {}
        for shape, count in work.get("products", []):
            if len(shape) >= 2 and shape[-1] == shape[-2] and shape[-1] >= 2:
                square[shape[-1]] = square.get(shape[-1], 0) + int(count)
        squares.append(square)
    for ((n, d, b, w, batch), tried, work), square in zip(measured, squares):
        full_tiles = _needed_tiles(n - n % b, b, w)  # tiles of the full query blocks: every one is (b, b)
        if square.get(b, 0) < full_tiles / 2:
            common = sorted(set.intersection(*(set(sq) for sq in squares)) - {c[2] for c in _WORK_CASES})
            if common:
                cause = (f"your tiles are {common[-1]} × {common[-1]} whatever block_size is passed "
                         f"(block_size = {', '.join(str(c[2]) for c in _WORK_CASES)} here): block_size is ignored")
                fix = "cut the queries and keys into blocks of block_size (the argument), not of a fixed size"
            else:
                cause = (f"your code computed {square.get(b, 0)} ({b}, {b}) products where the window needs "
                         f"{full_tiles} tiles of scores: it computes the scores in pieces of another shape (row by "
                         "row, or one slab of keys per query block)")
                fix = ("loop over query blocks of block_size rows and, inside, over key blocks of block_size keys: "
                       "each tile of scores is q_block @ k_blockᵀ, (block_size, block_size)")
            fail("scores not computed in (block_size, block_size) tiles", tried=tried,
                 got=f"{square.get(b, 0)} matrix products of shape (…, {b}, {b})",
                 expected=f"score tiles of shape (…, {b}, {b}) (shorter only at the end of the sequence)",
                 cause=cause, fix=fix)
    for (n, d, b, w, batch), tried, work in measured:
        per_tile = batch * (2.0 * b * b * d + 2.0 * b * b * (d + 1))  # q·kᵀ and p·v of one full tile
        needed = per_tile * _needed_tiles(n, b, w)
        flops = float(work.get("flops", 0.0))
        if flops > needed + 0.5:
            fail("blocks outside the window are computed", tried=tried,
                 got=f"{flops:.0f} matrix-multiply FLOPs ({flops / per_tile:.1f} tiles' worth)",
                 expected=f"at most {needed:.0f} ({needed / per_tile:.0f} tiles: for each query block, only the key "
                          f"blocks that hold keys q_start − window + 1 … q_end − 1)",
                 cause="the values are right, but your loop also computes key blocks that lie wholly before the "
                       "window (or after the diagonal), which the mask then erases entirely",
                 fix="start the key loop at the block holding key max(0, q_start − window + 1) and stop it at q_end")


def _last_block_cause(failure: Failure, out: torch.Tensor, expected: torch.Tensor, n: int, b: int, tol: dict) -> None:
    """Re-raise ``failure`` with a cause when only the rows of the last, shorter query block are wrong."""
    if failure.diagnosis.cause or n % b == 0 or tuple(out.shape) != tuple(expected.shape) or n <= b:
        raise failure
    tail = n - n % b
    close = torch.isclose(out.double(), expected, equal_nan=True, **tol)
    if bool(close[..., :tail, :].all()) and not bool(close[..., tail:, :].all()):
        d = failure.diagnosis
        fail(f"wrong only in the last, shorter query block (rows {tail} … {n - 1})", tried=d.tried, got=d.got,
             expected=d.expected, cause=f"n = {n} is not a multiple of block_size = {b}, and your loop mishandles the "
             f"last {_rows(n % b)} (a range that stops before them, or a block length taken as block_size)",
             fix="loop with range(0, n, block_size) and slice q[..., q_start:q_start + block_size, :]: the last "
                 "slice is simply shorter; use its own length for the accumulators")
    raise failure


@check("sliding_window_attention",
       expects="a function sliding_window_attention(q, k, v, window, block_size) returning a tensor (..., n, d_v)")
def check_sliding_window_attention(fn: Learner) -> str:
    for i, (label, (lead, n, d), w, b) in enumerate(_ATTN_CASES):
        dtype = torch.float32 if "float32" in label else torch.float64
        q, k, v = _window_qkv(lead, n, d, 50 + i, dtype)
        if "differ by more" in label:
            q[..., 0, :] *= 1000.0  # row 0's scores are in the thousands, the others near 1
        if "below −1000" in label:
            q, k = q.abs() + 0.5, k - 600.0  # q·k/√d_k ≈ −600·Σ q_i / 2 for every query and key
        if "fall by hundreds" in label:
            q = q.abs() + 1.0
            k = torch.linspace(1600, -5600, n, dtype=torch.float64)[:, None] / q.sum(-1).mean() * 2 + 0.1 * k
        tried = f"sliding_window_attention(q, k, v, window={w}, block_size={b}) on {label}"
        out = as_tensor(fn(q, k, v, w, b), tried=tried)
        expected = _sdpa(q, k, v, mask=_window(n, n, window=w))
        if tuple(out.shape) == tuple(q.shape) and q.shape[-1] != v.shape[-1]:
            fail("output as wide as q, not v", tried=tried, got=f"shape {tuple(out.shape)}",
                 expected=f"shape {tuple(expected.shape)}", cause="you allocated the output or the accumulator with "
                 "q's width d_k", fix="use v.shape[-1] (d_v) for the output and the accumulator")
        try:
            expect_close(out, expected, tried=tried, **_tol(dtype), mistakes=_window_attention_mistakes(q, k, v, w, b))
        except Failure as failure:
            _last_block_cause(failure, out, expected, n, b, _tol(dtype))
        if out.dtype != q.dtype:
            fail(f"result in {str(out.dtype).replace('torch.', '')}, not q's {str(q.dtype).replace('torch.', '')}",
                 tried=tried, got=str(out.dtype), expected=str(q.dtype),
                 cause="you created the output (or the accumulator) without dtype=q.dtype",
                 fix="allocate with dtype=q.dtype (or torch.zeros_like / empty_like from q's tensors)")
    _check_work(fn)
    return (f"matches F.scaled_dot_product_attention with the window mask on {len(_ATTN_CASES)} cases and computes "
            "only the key blocks inside the window")
