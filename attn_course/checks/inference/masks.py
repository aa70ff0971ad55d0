"""The checks of the two masks, bottom_right_causal_mask and sliding_window_mask: exact comparison with
the oracle, their tables of known mistakes, and which keys a wrong row lets a query see."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..compare import Failure, call_or_skip, same
from ..core import Learner, as_tensor, check, fail
from ..kit import Known, Suspects, call_explained
from .oracle import PATTERNS, dtype_name, rows, window


def _bool_mask(value: Any, expected: torch.Tensor, *, tried: str) -> torch.Tensor:
    """The answer as a bool tensor; a 0/1 or additive float mask is named as such."""
    t = as_tensor(value, tried=tried, what="your function", expected="a bool tensor")
    if t.dtype == torch.bool:
        return t
    dtype, want = dtype_name(t.dtype), "a bool tensor (True = may attend)"
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


def _quiet_bool(value: Any) -> Any:
    """The learner's answer on another case as a bool tensor, or None (what it is then is judged on its own case)."""
    return value if isinstance(value, torch.Tensor) and value.dtype == torch.bool else None


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
        answer = call_explained(fn, *case, tried=tried, expected="a bool (n_q, n_k) tensor", patterns=PATTERNS)
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
                 cause=f"your mask has {rows(got.shape[0])}{named} where the n_q = {n_q} queries need {n_q}: the "
                       "query positions run over the wrong range (they are n_k − n_q … n_k − 1)", fix=fix)
        if tuple(got.shape) == tuple(expected.shape) and not bool((got == expected).all()):
            suspects.confirm(fn, got, case, expected, cases, oracle, dict(atol=0, rtol=0), convert=_quiet_bool)
        try:
            suspects.expect(got, expected, case, tried=tried, what="your mask", atol=0, rtol=0, fix=fix, again=fn,
                            distinguish=cases)
        except Failure as failure:
            if failure.diagnosis.cause or tuple(got.shape) != tuple(expected.shape):
                raise
            fresh = (n_q, n_k + 1, *window)  # shapes never asked: right there, the window is read on a new shape
            if (kept := next((c for c in cases[:cases.index(case)] if c[:2] == case[:2] and c != case and
                              bool((got == oracle(*c)).all())), None)) and _right(fn, fresh, oracle):
                fail("the mask of an earlier call returned again", tried=tried, got=f"exactly the mask you returned "
                     f"for {name}({', '.join(map(str, kept[:2]))}, window={kept[2]})", expected=f"the mask for "
                     f"window={case[2]}", cause="your function returns the mask it made for the same n_q and n_k "
                     "before, whatever the window: a result kept by shape (a dict or cache keyed on the sizes only)",
                     fix="compute the mask from every argument on each call (or key a cache on all of them)")
            extra, missing = (got & ~expected).nonzero().tolist(), (~got & expected).nonzero().tolist()
            parts = [f"{len(e)} {what} (the first: query {e[0][0]}, key {e[0][1]})"
                     for e, what in ((extra, "blocked key(s) allowed"), (missing, "allowed key(s) blocked")) if e]
            i = min(e[0][0] for e in (extra, missing) if e)
            fail(f"wrong entries in the mask: {' and '.join(p.split(' (')[0] for p in parts)}", tried=tried,
                 got="; ".join(parts), expected="the entries the docstring describes",
                 cause=f"your mask lets query {i} (position {i + n_k - n_q}) see {_keys(got[i])}, where it may see "
                       f"{_keys(expected[i])}", fix=fix)


def _right(fn: Learner, case: tuple, oracle) -> bool:
    """Whether the learner's function gives the oracle's mask on ``case`` (raising is wrong)."""
    got = call_or_skip(lambda: fn(*case))
    return isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(oracle(*case).shape) and bool(
        (got == oracle(*case)).all())


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


_WINDOW_FIX = "query i sits at position p = i + n_k − n_q and sees key j iff p − window < j ≤ p: `window` keys"
#: A case of sliding_window_mask: (n_q, n_k, window).
WINDOW_MASK = [Known(key, summary, cause, _WINDOW_FIX, lambda n_q, n_k, w, band=band: window(n_q, n_k, w, **band))
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
               ] + [Known("polarity", *_POLARITY, lambda n_q, n_k, w: ~window(n_q, n_k, w)),
                    Known("swapped", *_SWAPPED, lambda n_q, n_k, w: window(n_q, n_k, w).T)]
_WINDOW_CASES = [(3, 10, 4), (6, 6, 3), (1, 9, 4), (5, 5, 1), (4, 4, 10), (2, 8, 8), (7, 12, 5), (1, 1, 1)]
#: then a window wider than the queries and one above 8, each inside the keys: the first with the first case's n_q
#: and n_k again, so a mask kept by shape shows
_WINDOW_MORE = [(3, 10, 7), (5, 20, 12)]


@check("sliding_window_mask",
       expects="a function sliding_window_mask(n_q, n_k, window) returning a bool (n_q, n_k) tensor")
def check_sliding_window_mask(fn: Learner) -> str:
    _check_masks(fn, "sliding_window_mask", WINDOW_MASK, _WINDOW_CASES + _WINDOW_MORE, window, _WINDOW_FIX)
    return (f"exact on {len(_WINDOW_CASES + _WINDOW_MORE)} cases (decode, chunks over a longer cache, window 1, window "
            "longer than the sequence)")

