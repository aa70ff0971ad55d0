"""Checks for notebook 06: causal, padding, decoder, cross-attention and additive masks, and the masked softmax.

Convention: a boolean mask is True where a query may attend to a key. Each check holds the answer to
its docstring: a mask function returns a torch bool tensor of exactly the stated shape (a NumPy
array, an additive float mask or a shape that merely broadcasts is named as such); the decoder mask
blocks <pad> keys only (a <pad> query keeps its row); the additive mask holds 0 and -inf (no finite
fill); ``masked_softmax`` leaves its arguments unchanged (a learner-side probe watches them).

How a wrong mask is named: a known mistake when the answer equals its mask (and no earlier, passed
case ruled that mistake out); otherwise by *where* it differs — the allowed and blocked pairs that
are wrong are described by the region that holds them all ("later keys", "<pad> keys", "the
diagonal", "rows of <pad> queries"…). Oracles: ``torch.tril``, comparisons with the ids, and
``F.scaled_dot_product_attention`` for the additive mask and the masked softmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from .attention import Elimination, Known, lower_precision
from .compare import Failure, same
from .core import Learner, LearnerRaised, as_tensor, check, expect_close, fail, fmt, learner_error
from .dot import CALL_PROBE
from .kit import reproduce as _reproduce

__all__ = [
    "check_causal_mask",
    "check_padding_mask_from_lengths",
    "check_padding_mask_from_ids",
    "check_decoder_mask",
    "check_cross_attention_mask",
    "check_additive_mask",
    "check_masked_softmax",
]

HEADS = 3  # heads of the attention the additive mask is tried in; differs from every batch size used

_POLARITY = ("mask polarity inverted", "your mask is True where attention is blocked; in this course True means "
             "'may attend' (the convention of F.scaled_dot_product_attention; nn.MultiheadAttention uses the opposite)")


# ============================================================================ answers as bool masks
def _as_bool_mask(value: Any, *, tried: str, what: str) -> torch.Tensor:
    """The answer as a bool tensor, or a diagnosis of what it is instead (an array, floats, integers…)."""
    if isinstance(value, np.ndarray):
        fail("returned a NumPy array, not a tensor", tried=tried, got=f"a NumPy array {value.shape} {value.dtype}",
             expected="a torch bool tensor (True = may attend), as the docstring says",
             cause="you built the mask with NumPy (np.tril, np.arange…) or called .numpy(): masked_fill and "
                   "F.scaled_dot_product_attention need a torch tensor",
             fix="build it with torch (torch.ones(…, dtype=torch.bool).tril(), torch.arange), or wrap the array in "
                 "torch.from_numpy(…)")
    t = as_tensor(value, tried=tried, what="your function", expected="a bool tensor (True = may attend)")
    if t.dtype == torch.bool:
        return t
    kind = str(t.dtype).replace("torch.", "")
    if t.is_floating_point():
        if torch.isnan(t).any():
            fail("NaN in the mask", tried=tried, got=f"{what} holds NaN", expected="a bool mask (True = may attend)",
                 cause="0 × (-inf) is NaN: an additive mask built as (~mask) * float('-inf') has NaN where it should hold 0",
                 fix="return a bool mask; an additive one needs masked_fill or torch.where")
        values = sorted({float(v) for v in t.flatten()[:1000].tolist()})
        if set(values) <= {0.0, 1.0}:
            fail(f"a float mask of 0s and 1s ({kind}), not a bool mask", tried=tried,
                 got=f"{what} is {kind} with values {values}", expected="a bool tensor (True = may attend)",
                 cause="0.0/1.0 floats are not a bool mask: ~ and & fail on them and masked_fill refuses them "
                       "(torch.ones and torch.tril make floats unless given dtype=torch.bool)",
                 fix="make it bool: .bool(), dtype=torch.bool, or a comparison such as j <= i")
        if 0.0 in values and all(v <= 0 for v in values):
            blocked = [v for v in values if v < 0]
            fail("an additive float mask, not a bool mask", tried=tried,
                 got=f"{what} is {kind}: 0 for kept positions, {fmt(blocked[0]) if blocked else '-inf'} for blocked ones",
                 expected="a bool tensor: True where a query may attend, False where it may not",
                 cause="you returned the additive form (0 = keep, a large negative number = block), which is exercise 6's "
                       "additive_mask; this function's docstring asks for the bool form",
                 fix="return the comparison itself (a bool tensor), e.g. torch.ones(n, n, dtype=torch.bool).tril()")
        fail(f"a {kind} mask with values {values[:4]}{'…' if len(values) > 4 else ''}", tried=tried,
             got=f"{what} is {kind}", expected="a bool tensor (True = may attend)",
             fix="build it from comparisons (==, !=, <, <=) and torch.tril, which give bools")
    fail(f"an integer mask ({kind}), not a bool mask", tried=tried, got=f"{what} has dtype {kind}",
         expected="a bool tensor (True = may attend)",
         cause="masked_fill and ~ need a bool mask: on integers ~ flips every bit (~1 = -2)",
         fix="make it bool: .bool(), dtype=torch.bool, or a comparison")


class _Ambiguity:
    """Runs a check's cases so that a failure blamed on two mistakes at once waits for a later case that
    tells them apart: ``with pending.case(): …`` for each case, then ``pending.finish()``."""

    def __init__(self) -> None:
        self.pending: Failure | None = None

    def case(self) -> "_Ambiguity":
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if not isinstance(exc, Failure):
            return False
        if exc.diagnosis.cause.startswith("on this input two mistakes give the same"):
            self.pending = self.pending or exc
            return True  # go on to the next case
        if self.pending is not None and not exc.diagnosis.cause:
            raise self.pending  # a later failure that names no cause says less than the first one
        return False

    def finish(self) -> None:
        if self.pending is not None:
            raise self.pending


@dataclass
class Region:
    """A named set of (query, key) pairs, for saying where a wrong mask is wrong."""

    name: str  # "later keys (j > i)"
    where: torch.Tensor  # bool, broadcastable to the compared shape


def _describe(wrong: torch.Tensor, regions: list[Region]) -> str:
    """'all of them later keys (j > i)' when one region holds every wrong pair."""
    for region in regions:
        inside = torch.broadcast_to(region.where, wrong.shape)
        if not (wrong & ~inside).any():
            return f"{'exactly' if not (inside & ~wrong).any() else 'all of them'} {region.name}"
    return ""


def _first(wrong: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in wrong.nonzero()[0])


def _compare(got: torch.Tensor, expected: torch.Tensor, *, tried: str, what: str, mistakes: list[Known],
             ruled: set[str], regions: list[Region], hints: list[tuple] = (), index_names: str = "",
             unit: str = "pair") -> None:
    """Fail unless ``got`` equals ``expected``, shape included (the docstring states the shape).
    ``ruled`` holds the mistakes earlier cases ruled out, and is updated."""
    target = tuple(expected.shape)
    shape_note = ""
    if tuple(got.shape) != target:
        _wrong_shape(got, expected, tried=tried, what=what, mistakes=mistakes, ruled=ruled, hints=hints)
        shape_note = f"{what} has shape {tuple(got.shape)}, not {target}; broadcast to {target}, it "
        got = torch.broadcast_to(got, target)  # _wrong_shape returns only for a mask that broadcasts, with wrong values
    g, e = got, expected
    if torch.equal(g, e):
        for m in mistakes:
            value = m.value()
            if value is not None and not _equal(value, e, target):
                ruled.add(m.key)
        return
    found = _found(g, e, mistakes, ruled)
    if found:
        summary = " or ".join(m.summary for m in found)
        cause = found[0].cause if len(found) == 1 else ("on this input two mistakes give the same mask: "
                                                         + " — or ".join(m.cause for m in found))
        fail(summary, tried=tried, got=f"{what}: {_count(g, e, index_names)}", expected="the mask the docstring "
             "describes", cause=cause, fix="; otherwise ".join(m.fix for m in found))
    if torch.equal(g, ~e):
        fail(_POLARITY[0], tried=tried, got=f"{what} is True exactly where it should be False",
             expected="True = may attend", cause=_POLARITY[1], fix="negate it (~mask), or flip the comparison")
    extra, missing = g & ~e, ~g & e
    parts = []
    if extra.any():
        parts.append(f"allows {int(extra.sum())} {unit}{'s' if int(extra.sum()) > 1 else ''} it must block"
                     + (f" ({_describe(extra, regions)})" if _describe(extra, regions) else ""))
    if missing.any():
        parts.append(f"blocks {int(missing.sum())} {unit}{'s' if int(missing.sum()) > 1 else ''} it must allow"
                     + (f" ({_describe(missing, regions)})" if _describe(missing, regions) else ""))
    wrong = extra | missing
    first = _first(wrong)
    summary_bits = [r for r in (_region_of(extra, regions, "allowed"), _region_of(missing, regions, "blocked")) if r]
    if not summary_bits and not extra.any() and g.dim() >= 2:
        rows = missing.any(-1)  # (..., n_q): rows with an allowed pair blocked
        if not (g & rows[..., None]).any():  # each such row is blocked entirely
            where = ", ".join(str(tuple(int(i) for i in r)) for r in rows.nonzero()[:6])
            summary_bits = ["whole query rows blocked"]
            parts.append(f"every key of the rows {where}{'…' if int(rows.sum()) > 6 else ''} is blocked")
    summary = "; ".join(summary_bits) if summary_bits else f"wrong at {int(wrong.sum())} positions"
    if shape_note:
        summary = f"wrong shape, and {summary}"
    fail(summary, tried=tried, got=f"{shape_note or what + ' '}{' and '.join(parts)}; the first at index {first}{index_names}: "
         f"{bool(g[first])} instead of {bool(e[first])}", expected="the mask the docstring describes",
         fix="print your mask next to the one the docstring describes on this input (.int() shows it as 0/1)")


def _found(g: torch.Tensor, e: torch.Tensor, mistakes: list[Known], ruled: set[str]) -> list[Known]:
    """The known mistakes (not ruled out) whose mask, broadcast to ``e``'s shape, is ``g``."""
    target = tuple(e.shape)
    found = [m for m in mistakes if m.key not in ruled and (v := m.value()) is not None and _equal(v, g, target)
             and not _equal(v, e, target)]
    return list({m.summary: m for m in found}.values())


def _wrong_shape(got: torch.Tensor, expected: torch.Tensor, *, tried: str, what: str, mistakes: list[Known],
                 ruled: set[str], hints: list[tuple]) -> None:
    """Fail on a mask whose shape differs from the docstring's, naming the likeliest reason."""
    want, shape = tuple(expected.shape), tuple(got.shape)
    g = _broadcast(got, want)
    if g is not None:  # the values can be compared: a known mistake in them says more than the shape
        found = _found(g, expected, mistakes, ruled)
        if len(found) == 1:
            m = found[0]
            fail(m.summary, tried=tried, got=f"{what} of shape {shape}; broadcast to {want}, it is exactly this "
                 "mistake's mask", expected=f"the mask the docstring describes, of shape {want}", cause=m.cause,
                 fix=f"{m.fix}; and return shape {want}")
    for hint_shape, summary, cause, fix in hints:
        if shape == tuple(hint_shape) and tuple(hint_shape) != want:
            fail(summary, tried=tried, got=f"{what} of shape {shape}", expected=f"shape {want}", cause=cause, fix=fix)
    if [s for s in shape if s != 1] == [s for s in want if s != 1] and len(shape) == len(want):
        fail(f"shape {shape}, not {want}: the size-1 axis in the wrong place", tried=tried,
             got=f"{what} of shape {shape}", expected=f"shape {want}, as the docstring says",
             cause="your axis of size 1 sits at another position: in (B, 1, n_q, n_k) it is the heads axis, second, "
                   "after the batch (mask[:, None] puts it there; mask[None] puts it first)",
             fix=f"return exactly shape {want}: print(mask.shape) before returning")
    if [s for s in shape if s != 1] == [s for s in want if s != 1]:
        more = len(shape) > len(want)
        fail(f"shape {shape}, not {want}: size-1 axes {'added' if more else 'missing'}", tried=tried,
             got=f"{what} of shape {shape}" + (" (its values are right)" if g is not None and torch.equal(g, expected)
                                                else ""),
             expected=f"shape {want}, as the docstring says",
             cause=("you added axes of size 1 (a [None] or unsqueeze too many)" if more else
                    "an axis of size 1 is missing (a [None] or unsqueeze too few)"),
             fix=f"return exactly shape {want}: print(mask.shape) before returning")
    if g is not None and torch.equal(g, expected):
        fail(f"shape {shape}, not {want}", tried=tried, got=f"{what} of shape {shape}: right once broadcast, but "
             "not expanded to the docstring's shape", expected=f"shape {want}",
             cause="your mask only broadcasts to the asked-for shape", fix=f"expand it: mask.expand({', '.join(map(str, want))})")
    if g is not None:
        return  # broadcastable, wrong values: the caller says where they are wrong
    fail(f"shape {shape} does not fit {want}", tried=tried, got=f"{what} of shape {shape}",
         expected=f"shape {want}, as the docstring says",
         fix="follow the shapes in the docstring; print(mask.shape) after each step")


def _broadcast(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor | None:
    try:
        return torch.broadcast_to(t, shape)
    except RuntimeError:
        return None


def _region_of(wrong: torch.Tensor, regions: list[Region], verb: str) -> str:
    if not wrong.any():
        return ""
    for region in regions:
        if not (wrong & ~torch.broadcast_to(region.where, wrong.shape)).any():
            return f"{region.name} {verb}"
    return ""


def _count(g: torch.Tensor, e: torch.Tensor, index_names: str) -> str:
    wrong = g != e
    return f"differs at {int(wrong.sum())} of {wrong.numel()} positions (the first at index {_first(wrong)}{index_names})"


def _equal(value: torch.Tensor, other: torch.Tensor, target: tuple[int, ...]) -> bool:
    try:
        return torch.equal(torch.broadcast_to(value, target), torch.broadcast_to(other, target))
    except RuntimeError:
        return False


def _call(fn: Learner, args: tuple, kwargs: dict, tried: str, expected: str,
          constructs: list[tuple[str, str, list[Callable[[], object]]]] = ()) -> Any:
    """The learner's result; an exception is explained when its message names the cause, or when one of
    ``constructs`` (cause, fix, attempts) reproduces the very same message."""
    try:
        return fn(*args, **kwargs)
    except LearnerRaised as exc:
        extra = _explain_raise(exc) or _construct(exc, constructs)
        raise Failure(learner_error(exc, tried=tried, expected=expected, **extra)) from None


def _watched(fn: Learner, args: tuple, tried: str, expected: str, names: tuple[str, ...],
             constructs: list[tuple[str, str, list[Callable[[], object]]]] = ()) -> tuple[Any, list[str]]:
    """The learner's result and the names of the arguments it changed in place (a learner-side probe)."""
    try:
        result = fn.observe(CALL_PROBE, *args)
    except LearnerRaised as exc:
        extra = _explain_raise(exc) or _construct(exc, constructs)
        raise Failure(learner_error(exc, tried=tried, expected=expected, **extra)) from None
    value, changed = result if isinstance(result, tuple) and len(result) == 2 else (result, [])
    return value, [names[int(i)] for i in changed if 0 <= int(i) < len(names)]


def _construct(exc: LearnerRaised, constructs) -> dict[str, str]:
    """The cause of the first construct that reproduces the learner's very message and, where it has a
    ``confirm`` (a fourth element: a function returning True when another call of the learner's code
    behaves as the construct does), is confirmed by it: a broadcasting error's message alone is shared by
    many mistakes."""
    for cause, fix, attempts, *confirm in constructs:
        if any(_reproduce(a) == exc.message for a in attempts) and (not confirm or confirm[0]()):
            return dict(cause=cause, fix=fix)
    return {}


def _explain_raise(exc: LearnerRaised) -> dict[str, str]:
    message = exc.message
    if message.startswith("value cannot be converted to type") and "without overflow" in message:
        if "Half" in message:
            where = ("float16 holds at most 65504 in magnitude, so a fill such as -1e9 or "
                     "torch.finfo(torch.float32).min cannot be stored")
        elif "BFloat16" in message:
            where = "bfloat16 holds at most about 3.39·10³⁸ in magnitude, less than torch.finfo(torch.float32).min"
        else:
            where = "this dtype cannot store it"
        return dict(cause=f"you filled with a finite number too large for the tensor's dtype: {where}",
                    fix="fill with float('-inf'), which every floating-point dtype holds")
    if "Boolean value of Tensor" in message:
        return dict(cause="an `if` or `and`/`or` asked a whole tensor for one truth value",
                    fix="combine masks with & and |, and test for None with `is not None`")
    if "(operator.invert) is only implemented" in message or "only supports boolean masks" in message:
        return dict(cause="a mask made of numbers (floats) where a bool mask is needed: ~ and masked_fill work on "
                          "bool masks only", fix="make the mask bool: dtype=torch.bool, .bool(), or a comparison")
    if "If you are trying to invert a mask" in message:
        return dict(cause="- does not negate a bool mask", fix="negate it with ~mask (or mask.logical_not())")
    return {}


# ============================================================================ causal
def _ij(n_q: int, n_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]


def _causal_regions(n_q: int, n_k: int) -> list[Region]:
    i, j = _ij(n_q, n_k)
    return [Region("later keys (j > i)", j > i), Region("the diagonal (j = i)", j == i),
            Region("earlier keys (j < i)", j < i), Region("keys up to the diagonal (j ≤ i)", j <= i)]


def _causal_mistakes(n: int) -> list[Known]:
    ones = torch.ones(n, n, dtype=torch.bool)
    return [
        Known("upper triangle instead of lower", "torch.triu keeps j ≥ i: each query sees itself and the future",
              "keep j ≤ i: torch.tril", ones.triu(), "triu"),
        Known("diagonal excluded (off by one)", "a token must be allowed to attend to itself; with the diagonal "
              "blocked, the first row has no key at all", "torch.tril with diagonal=0 (the default)", ones.tril(-1), "tril-1"),
        Known("one diagonal too many (off by one)", "query i also sees key i + 1, the next token",
              "torch.tril with diagonal=0 (the default)", ones.tril(1), "tril+1"),
        Known(_POLARITY[0], _POLARITY[1] + "; True marks the future here", "use torch.tril for the allowed pairs",
              ones.triu(1), "polarity"),
        Known("nothing is masked", "every query sees every key", "keep j ≤ i: torch.tril", ones, "ones"),
        Known("only the diagonal is allowed", "each token sees only itself (torch.eye)", "keep every j ≤ i: torch.tril",
              torch.eye(n, dtype=torch.bool), "eye"),
        Known("everything is masked", "no query may attend to any key", "keep j ≤ i: torch.tril",
              torch.zeros(n, n, dtype=torch.bool), "zeros"),
        Known("anti-diagonal triangle (flipped)", "you flipped the matrix left to right: the mask follows the "
              "anti-diagonal", "keep j ≤ i: torch.tril, without flipping", ones.tril().flip(-1), "flip"),
    ]


@check("causal_mask", expects="a function causal_mask(n) returning an (n, n) bool tensor")
def check_causal_mask(fn: Learner) -> str:
    sizes = [5, 8, 1, 2]
    ruled: set[str] = set()
    amb = _Ambiguity()
    shapes: dict[tuple, int] = {}
    for n in sizes:
        tried = f"causal_mask({n})"
        got = _as_bool_mask(_call(fn, (n,), {}, tried, f"an ({n}, {n}) bool tensor"), tried=tried,
                            what="your mask")
        shape = tuple(got.shape)
        if shape[-2:] != (n, n) and shape not in shapes:  # one more call tells a fixed size from a wrong formula
            other = 7 if n != 7 else 3
            again = as_tensor(_call(fn, (other,), {}, f"causal_mask({other})", f"a ({other}, {other}) bool tensor"),
                              tried=f"causal_mask({other})", what="your function")
            shapes[tuple(again.shape)] = other
        if shape in shapes and shape[-2:] != (n, n):
            fail("n is ignored", tried=tried, got=f"a mask of shape {shape}, as for n = {shapes[shape]}",
                 expected=f"shape ({n}, {n})", cause="your function returns the same size whatever n is (a size "
                 "written into the code, or an outer variable)", fix="build the mask from the argument n")
        shapes[shape] = n
        hints = [((n + 1, n + 1), f"size n + 1 = {n + 1}, not n", "your mask has one row and one column too many",
                  "torch.ones(n, n, dtype=torch.bool): n, not n + 1"),
                 ((n - 1, n - 1), f"size n - 1 = {n - 1}, not n", "your mask has one row and one column too few "
                  "(a range that stops one early)", "make it n × n")] if n > 1 else []
        with amb.case():
            _compare(got, torch.ones(n, n, dtype=torch.bool).tril(), tried=tried, what="your mask", hints=hints,
                     mistakes=_causal_mistakes(n), ruled=ruled, regions=_causal_regions(n, n), index_names=" (query, key)")
    amb.finish()
    return f"lower-triangular with the diagonal, for n in {sizes}"


# ============================================================================ padding
def _padding_regions(real: torch.Tensor) -> list[Region]:
    B, S = real.shape
    return [Region("<pad> positions", ~real), Region("real tokens", real),
            Region("the first position of a sequence", torch.arange(S)[None, :].expand(B, S) == 0),
            Region("the last real token of a sequence", real & ~torch.cat([real[:, 1:], torch.zeros(B, 1, dtype=torch.bool)], 1))]


@check("padding_mask_from_lengths",
       expects="a function padding_mask_from_lengths(lengths, max_len=None) returning a (B, max_len) bool tensor")
def check_padding_mask_from_lengths(fn: Learner) -> str:
    # Defaults: [2, 5, 3] has a largest length (5), a first length (2) and a batch size (3) that all differ.
    cases = [([3, 1, 4], 6, torch.int64), ([2, 5, 3], None, torch.int64), ([0, 2], 3, torch.int64),
             ([4, 2, 1], None, torch.int32), ([1], 1, torch.int64), ([3, 3], None, torch.int64), ([1, 2], 5, torch.int64)]
    ruled: set[str] = set()
    amb = _Ambiguity()
    for values, max_len, dtype in cases:
        lengths = torch.tensor(values, dtype=dtype)
        B, S = len(values), max(values) if max_len is None else max_len
        tried = f"padding_mask_from_lengths(torch.tensor({values})" + ("" if max_len is None else f", max_len={max_len}") + ")"
        raw = _call(fn, (lengths,), {} if max_len is None else {"max_len": max_len}, tried, f"a ({B}, {S}) bool tensor")
        got = _as_bool_mask(raw, tried=tried, what="your mask")
        if got.dim() == 2 and got.shape[0] == B and got.shape[1] != S:
            _fixed_width(fn, got.shape[1], tried)
        positions, column = torch.arange(S)[None, :], lengths[:, None].long()
        expected = positions < column  # (B, S)
        hints = []
        if S != B:
            hints.append(((S, B), "transposed: one row per position", "you put the positions on the rows and the "
                          "sequences on the columns", f"return (B, max_len) = {(B, S)}: one row per sequence"))
        if max_len is not None and max(values) != S:
            hints.append(((B, max(values)), "max_len ignored", f"your mask has max(lengths) = {max(values)} columns "
                          f"although max_len = {S} was given", "use max_len when it is given; default to the largest length"))
        if max_len is not None:
            hints += [((B, S + 1), "one column more than max_len", f"your mask has {S + 1} columns although "
                       f"max_len = {S} was given", "torch.arange(max_len): exactly max_len columns")]
        if max_len is None:
            for width, why in ((B, f"B = {B} columns (the number of sequences)"),
                               (values[0], f"lengths[0] = {values[0]} columns (the first length; the lengths are not sorted)"),
                               (S + 1, f"{S + 1} columns, one more than the largest length"),
                               (S - 1, f"{S - 1} columns, one fewer than the largest length")):
                if width != S and width > 0:
                    hints.append(((B, width), "default max_len wrong", f"with max_len=None your mask has {why}, not the "
                                  f"largest length {S}", "max_len = int(lengths.max()) when max_len is None"))
        mistakes = [
            Known("off by one (<= instead of <)", "position `length` is already padding: positions 0 … length−1 are "
                  "the real tokens", "compare with <: torch.arange(max_len) < lengths[:, None]",
                  positions <= column, "le"),
            Known("last real token marked as padding", "you compared with length − 1", "compare with the length itself: "
                  "torch.arange(max_len) < lengths[:, None]", positions < column - 1, "lt-1"),
            Known(_POLARITY[0], _POLARITY[1] + "; real tokens should be True, padding False",
                  "flip the comparison: torch.arange(max_len) < lengths[:, None]", positions >= column, "polarity"),
            Known(_POLARITY[0], _POLARITY[1] + "; real tokens should be True, padding False",
                  "torch.arange(max_len) < lengths[:, None]", positions > column, "polarity+1"),
            Known("padding on the left", "you marked the last `length` positions as real; the course pads on the right "
                  "(the first lengths[b] positions are real)", "torch.arange(max_len) < lengths[:, None]",
                  positions >= S - column, "left"),
        ]
        with amb.case():
            _compare(got, expected, tried=tried, what="your mask", mistakes=mistakes, ruled=ruled, hints=hints,
                     regions=_padding_regions(expected), index_names=" (sequence, position)", unit="position")
    amb.finish()
    return (f"correct on {len(cases)} batches (a zero length, no padding, one sequence, max_len given and "
            "default, int32 and int64 lengths)")


def _fixed_width(fn: Learner, width: int, tried: str) -> None:
    """Fail with "width fixed" when another call, with other lengths and max_len, gives the same width again."""
    probe, probe_len = torch.tensor([1, 2]), 9 if width != 9 else 11
    shown = f"padding_mask_from_lengths(torch.tensor([1, 2]), max_len={probe_len})"
    again = as_tensor(_call(fn, (probe,), {"max_len": probe_len}, shown, f"a (2, {probe_len}) bool tensor"),
                      tried=shown, what="your function")
    if again.dim() == 2 and again.shape[1] == width:
        fail(f"width fixed at {width}", tried=f"{tried}, then {shown}",
             got=f"{width} column{'s' if width != 1 else ''} both times", expected="max_len columns when max_len is given, else the largest length",
             cause="the width does not follow the arguments: a number written into your code, or a variable from "
                   "outside the function", fix="build the mask from the arguments: torch.arange(max_len) < lengths[:, None]")


@check("padding_mask_from_ids", expects="a function padding_mask_from_ids(ids, pad_id) returning a (B, S) bool tensor")
def check_padding_mask_from_ids(fn: Learner) -> str:
    cases = [
        (torch.tensor([[5, 7, 2, 0, 0], [4, 4, 9, 8, 1]]), 0),
        (torch.tensor([[6, 3, 3, 3], [0, 2, 3, 3], [3, 3, 3, 3]]), 3),  # pad id 3; a token with id 0 is real
        (torch.tensor([[1, 1, 5, 6, 2], [1, 7, 8, 9, 4]]), 1),  # left padding
        (torch.tensor([[9, 12, 9], [4, 9, 9]], dtype=torch.int32), 9),
        (torch.tensor([[0]]), 0),  # one sequence of one <pad>
    ]
    ruled: set[str] = set()
    amb = _Ambiguity()
    for ids, pad_id in cases:
        B, S = ids.shape
        tried = f"padding_mask_from_ids(ids {tuple(ids.shape)} {str(ids.dtype).replace('torch.', '')}, pad_id={pad_id})"
        got = _as_bool_mask(_call(fn, (ids, pad_id), {}, tried, f"a ({B}, {S}) bool tensor"), tried=tried,
                            what="your mask")
        real = ids != pad_id
        count = real.sum(-1, keepdim=True)
        mistakes = [
            Known("pad_id ignored (compared with 0)", "you compared the ids with 0, not with the pad_id argument",
                  "compare with the argument: ids != pad_id", ids != 0, "zero"),
            Known("pad_id ignored (compared with 0)", "you treated id 0 as padding instead of the pad_id argument",
                  "compare with the argument: ids != pad_id", ids > 0, "positive"),
            Known(_POLARITY[0], _POLARITY[1] + "; real tokens should be True, <pad> False", "ids != pad_id",
                  ids == pad_id, "polarity"),
            Known("padding assumed at the end", "you counted the real tokens and marked that many positions from the "
                  "start; with padding on the left (or in the middle) the real tokens are elsewhere",
                  "compare every id with pad_id: ids != pad_id", torch.arange(S)[None, :] < count, "count"),
            Known("padding assumed after the first <pad>", "you marked everything after the first <pad> as padding; "
                  "with padding on the left the real tokens come after it", "compare every id with pad_id: ids != pad_id",
                  torch.cumprod(real.long(), -1).bool(), "cumprod"),
            Known("ids below pad_id blocked (ids > pad_id)", "you kept only the ids greater than pad_id, as if <pad> "
                  "had the smallest id; a real token may have a smaller id than pad_id", "compare for inequality: "
                  "ids != pad_id", ids > pad_id, "greater"),
            Known("id 0 treated as padding too", "you blocked id 0 as well as pad_id; here id 0 is a real token",
                  "compare with the argument only: ids != pad_id", real & (ids != 0), "zero-too"),
        ]
        hints = [((S, B), "transposed: one row per position", "you put the positions on the rows",
                  "return (B, S), one row per sequence")] if S != B else []
        hints.append(((B, 1, 1, S), "shape (B, 1, 1, S), not (B, S)", "you added the heads and queries axes that "
                      "attention needs; this function returns the plain (B, S) mask", "return ids != pad_id as it is, "
                      "(B, S); add axes where the mask is used"))
        with amb.case():
            _compare(got, real, tried=tried, what="your mask", mistakes=mistakes, ruled=ruled, hints=hints,
                     regions=_padding_regions(real), index_names=" (sequence, position)", unit="position")
    amb.finish()
    return f"correct on {len(cases)} batches (pad ids 0, 1, 3 and 9; left and right padding; an all-<pad> sequence)"


# ============================================================================ decoder and cross
_DECODER_CASES = [
    # pad id 2: right padding, left padding, and a real token with id 0 in one batch
    (torch.tensor([[1, 5, 6, 2, 2], [2, 2, 1, 0, 7], [1, 3, 4, 6, 0]]), 2),
    (torch.tensor([[1, 5, 6, 7, 0, 0], [1, 8, 9, 4, 3, 2]]), 0),  # right padding
    (torch.tensor([[0, 0, 1, 5, 6], [0, 1, 7, 8, 9], [1, 4, 3, 2, 5]]), 0),  # left padding (batched generation)
    (torch.tensor([[0, 0, 0], [1, 5, 6]]), 0),  # a sequence of <pad> only
    (torch.tensor([[4]]), 0),  # T = 1, B = 1
]


def _heads_hints(B: int, n_q: int, n_k: int) -> list[tuple]:
    """Shapes that get the heads axis wrong: missing, or bigger than 1."""
    hints = [((B, n_q, n_k), "no heads axis", "a (B, n_q, n_k) mask lines B up with the heads axis of scores "
              "(B, H, n_q, n_k)", "return (B, 1, n_q, n_k), e.g. mask[:, None] or mask.unsqueeze(1)")]
    hints += [((B, h, n_q, n_k), f"a heads axis of size {h}, not 1", f"you repeated the mask for {h} heads; the "
               "docstring asks for a heads axis of size 1, which broadcasts over any number of heads",
               "keep the heads axis at size 1: mask[:, None] (no expand or repeat over heads)") for h in range(2, 17)]
    return hints


def _pair_regions(n_q: int, n_k: int, real_q: torch.Tensor, real_k: torch.Tensor, causal: bool) -> list[Region]:
    """Regions of a (B, 1, n_q, n_k) mask."""
    i, j = _ij(n_q, n_k)
    pad_keys, pad_queries = ~real_k[:, None, None, :], ~real_q[:, None, :, None]
    regions = [Region("<pad> keys", pad_keys), Region("rows of <pad> queries", pad_queries),
               Region("<pad> keys or rows of <pad> queries", pad_keys | pad_queries)]
    if causal:
        regions += [Region("later keys (j > i)", j > i), Region("the diagonal (j = i)", j == i),
                     Region("real earlier keys (j < i)", (j < i) & ~pad_keys)]
    else:
        regions.append(Region("real source keys", ~pad_keys))
    return regions


@check("decoder_mask", expects="a function decoder_mask(tgt_ids, pad_id) returning a (B, 1, T, T) bool tensor")
def check_decoder_mask(fn: Learner) -> str:
    ruled: set[str] = set()
    amb = _Ambiguity()
    for ids, pad_id in _DECODER_CASES:
        B, T = ids.shape
        tried = f"decoder_mask(tgt_ids {(B, T)}, pad_id={pad_id})"
        keys_ = (ids != pad_id)[:, None, None, :]
        constructs = [("you built the causal part with tgt_ids.shape[0] (the batch size B) where T = tgt_ids.shape[1] "
                       "(the sequence length) belongs", "T = tgt_ids.shape[-1]; causal = torch.ones(T, T, "
                       "dtype=torch.bool).tril()", [lambda: torch.ones(B, B, dtype=torch.bool).tril() & keys_])]
        got = _as_bool_mask(_call(fn, (ids, pad_id), {}, tried, f"a ({B}, 1, {T}, {T}) bool tensor", constructs),
                            tried=tried, what="your mask")
        ones = torch.ones(T, T, dtype=torch.bool)
        causal, real = ones.tril(), ids != pad_id
        keys, queries = real[:, None, None, :], real[:, None, :, None]  # (B, 1, 1, T), (B, 1, T, 1)
        key_only = causal & keys  # (B, 1, T, T)
        both = key_only & queries  # rows of <pad> queries blocked too: not what the docstring asks for
        counted = torch.arange(T)[None, :] < real.sum(-1, keepdim=True)  # padding assumed at the end
        mistakes = []
        for q_too, tag in ((False, ""), (True, "+q")):
            rows = queries if q_too else torch.ones_like(queries)
            mistakes += [
                Known("padding blocked on the queries instead of the keys", "you blocked the rows of <pad> queries "
                      "but not the <pad> keys, so real tokens still read <pad> (visible with left padding)",
                      "block the columns of <pad> tokens: (tgt_ids != pad_id)[:, None, None, :]",
                      causal & queries, "queries" + tag),
                Known("the padding part is missing", "you used the causal mask alone", "AND it with the key-padding "
                      "mask: causal & (tgt_ids != pad_id)[:, None, None, :]", None if q_too else causal, "nopad"),
                Known("the causal part is missing", "you used the padding mask alone, so tokens see later tokens",
                      "AND it with torch.tril(torch.ones(T, T, dtype=torch.bool))", keys & rows, "nocausal" + tag),
                Known("causal OR padding instead of AND", "you combined the two masks with | (OR)",
                      "both must hold: combine with & (AND)", (causal | keys) & rows, "or" + tag),
                Known("upper triangle instead of lower", "the causal part lets queries see the future (torch.triu)",
                      "use torch.tril", ones.triu() & keys & rows, "triu" + tag),
                Known("diagonal excluded (off by one)", "a token must be allowed to attend to itself",
                      "torch.tril with diagonal=0 (the default)", ones.tril(-1) & keys & rows, "tril-1" + tag),
                Known("one diagonal too many (off by one)", "query i also sees key i + 1, the next token",
                      "torch.tril with diagonal=0 (the default)", ones.tril(1) & keys & rows, "tril+1" + tag),
                Known("pad_id ignored (compared with 0)", "you compared the ids with 0, not with the pad_id argument",
                      "compare with the argument: tgt_ids != pad_id",
                      causal & (ids != 0)[:, None, None, :] & (rows if not q_too else (ids != 0)[:, None, :, None]),
                      "zero" + tag),
                Known("padding assumed at the end", "you built the padding mask from the number of real tokens, "
                      "so with left padding the <pad> keys are allowed and real ones blocked",
                      "compare the ids themselves: tgt_ids != pad_id",
                      causal & counted[:, None, None, :] & (rows if not q_too else counted[:, None, :, None]), "count" + tag),
            ]
        mistakes.append(Known("everything is masked", "no query may attend to any key", "causal & (tgt_ids != pad_id)"
                              "[:, None, None, :], with causal = torch.ones(T, T, dtype=torch.bool).tril()",
                              torch.zeros(B, 1, T, T, dtype=torch.bool), "zeros"))
        mistakes.append(Known("transposed: rows and columns swapped", "your rows are the keys and your columns the "
                              "queries", "rows are queries, columns keys: mask[..., i, j] says whether query i may "
                              "attend to key j", key_only.transpose(-2, -1), "transposed"))
        mistakes.append(Known(_POLARITY[0], _POLARITY[1], "negate it: ~mask", ~key_only, "polarity"))
        mistakes.append(Known(_POLARITY[0], _POLARITY[1], "negate it: ~mask", ~both, "polarity+q"))
        mistakes.append(Known("<pad> query rows blocked as well", "you blocked the rows of <pad> queries too; the "
                              "docstring blocks only <pad> keys (a <pad> query still reads the real tokens before it, "
                              "and its output is simply never used), so every <pad> row of yours is fully masked",
                              "drop the query part: causal & (tgt_ids != pad_id)[:, None, None, :]", both, "rows-too"))
        with amb.case():
            _compare(got, key_only, tried=tried, what="your mask", mistakes=mistakes, ruled=ruled,
                     hints=_heads_hints(B, T, T), index_names=" (batch, head, query, key)",
                     regions=_pair_regions(T, T, real, real, causal=True))
    amb.finish()
    return "causal AND key padding (right and left padding, an all-<pad> sequence), with a heads axis of size 1"


_CROSS_CASES = [
    (torch.tensor([[1, 5, 6, 7, 0, 0], [1, 8, 9, 4, 3, 2]]), torch.tensor([[4, 9, 0, 0], [3, 5, 7, 2]]), 0),
    (torch.tensor([[1, 5, 2, 2, 2], [1, 3, 4, 6, 2], [1, 2, 2, 2, 2]]),
     torch.tensor([[7, 8, 9, 2, 2, 2, 2], [5, 6, 2, 2, 2, 2, 2], [4, 4, 4, 4, 4, 4, 4]]), 2),
    (torch.tensor([[1, 2, 3], [1, 0, 0]]), torch.tensor([[0, 0, 4, 5], [6, 7, 8, 9]]), 0),  # left-padded source
    (torch.tensor([[1, 4], [1, 5]]), torch.tensor([[0, 0, 0], [5, 6, 7]]), 0),  # a source of <pad> only
    (torch.tensor([[1]]), torch.tensor([[3]]), 0),  # T = S = 1, B = 1
]


@check("cross_attention_mask",
       expects="a function cross_attention_mask(tgt_ids, src_ids, pad_id) returning a (B, 1, T, S) bool tensor")
def check_cross_attention_mask(fn: Learner) -> str:
    ruled: set[str] = set()
    amb = _Ambiguity()
    for tgt, src, pad_id in _CROSS_CASES:
        (B, T), S = tgt.shape, src.shape[1]
        tried = f"cross_attention_mask(tgt_ids {(B, T)}, src_ids {(B, S)}, pad_id={pad_id})"
        got = _as_bool_mask(_call(fn, (tgt, src, pad_id), {}, tried, f"a ({B}, 1, {T}, {S}) bool tensor"), tried=tried,
                            what="your mask")
        src_real, tgt_real = src != pad_id, tgt != pad_id
        keys, queries = src_real[:, None, None, :], tgt_real[:, None, :, None]
        expected = keys.expand(B, 1, T, S)
        swapped = ("rows and columns swapped", "rows must be the target queries (T = tgt length) and columns the "
                   "source keys (S = src length)", f"return (B, 1, T, S) = {(B, 1, T, S)}")
        hints = [((B, 1, S, T), *swapped), ((B, S, T), *swapped), *_heads_hints(B, T, S),
                 ((B, 1, 1, S), "not expanded to the T target rows", "you returned the (B, 1, 1, S) key-padding mask: "
                  "it never looks at tgt_ids, and the docstring asks for one row per target query, (B, 1, T, S)",
                  "expand it over the target length: mask.expand(-1, 1, T, -1), with T = tgt_ids.shape[1]"),
                 ((B, 1, S, S), "one row per source token", "your rows count the source tokens (S); the rows of "
                  "cross-attention are the target queries", "take T from tgt_ids: T = tgt_ids.shape[1]"),
                 ((B, 1, B, S), "rows counted from tgt_ids.shape[0]", "you took the number of rows from "
                  "tgt_ids.shape[0], the batch size, not from tgt_ids.shape[1], the target length",
                  "T = tgt_ids.shape[1] (or shape[-1])"),
                 ((B, 1, T, T), "columns are target tokens", "the keys of cross-attention are the source tokens, so "
                  "there is one column per source token", "build the columns from src_ids: (src_ids != pad_id)"),
                 ((B, 1, 1, T), "columns are target tokens", "the keys are the source tokens",
                  "build the columns from src_ids")]
        rect = torch.ones(T, S, dtype=torch.bool).tril()
        mistakes = [
            Known("target padding blocked instead of source padding", "you blocked the rows of target <pad> queries "
                  "and let every query read the source <pad> keys", "block the columns of source <pad> tokens: "
                  "(src_ids != pad_id)[:, None, None, :]", queries.expand(B, 1, T, S), "tgt"),
            Known("target padding rows blocked as well", "in cross-attention only the source padding (the columns) "
                  "is blocked; every target query keeps the real source tokens",
                  "drop the target part: (src_ids != pad_id)[:, None, None, :]", expected & queries, "tgt-too"),
            Known("a causal part in cross-attention", "cross-attention has no causal constraint: the whole source "
                  "sentence is known before the decoder starts", "block only the source padding", expected & rect, "causal"),
            Known(_POLARITY[0], _POLARITY[1] + "; real source tokens should be True", "negate it: ~mask",
                  ~expected, "polarity"),
            Known("pad_id ignored (compared with 0)", "you compared the ids with 0, not with the pad_id argument",
                  "compare with the argument: src_ids != pad_id", (src != 0)[:, None, None, :], "zero"),
            Known("padding assumed at the end", "you built the source mask from the number of real tokens, so with "
                  "left padding the <pad> keys are allowed and real ones blocked", "compare the ids: src_ids != pad_id",
                  (torch.arange(S)[None, :] < src_real.sum(-1, keepdim=True))[:, None, None, :], "count"),
            Known("nothing is masked", "every target query sees every source key, <pad> included",
                  "block the source <pad> keys: (src_ids != pad_id)[:, None, None, :]",
                  torch.ones(B, 1, T, S, dtype=torch.bool), "ones"),
        ]
        with amb.case():
            _compare(got, expected, tried=tried, what="your mask", mistakes=mistakes, ruled=ruled,
                     hints=hints, regions=_pair_regions(T, S, tgt_real, src_real, causal=False),
                     index_names=" (batch, head, query, key)")
    amb.finish()
    return ("rows = target, columns = source, only source padding blocked (right and left padding, an all-<pad> "
            "source), with a heads axis of size 1")


# ============================================================================ additive
def _large_scores(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(2, 1, 3, 4) scores: kept ones near -2e4, blocked ones up to +3e4, and the keep mask."""
    s = torch.tensor([[-20000.0, 30000.0, -20016.0, 0.0],
                      [30000.0, -20000.0, -5000.0, -20032.0],
                      [-20032.0, -20000.0, 30000.0, -5000.0]])
    keep = torch.tensor([[True, False, True, False], [False, True, False, True], [True, True, False, False]])
    return torch.stack([s, s.flip(-1)])[:, None].to(dtype), torch.stack([keep, keep.flip(-1)])[:, None]


def _additive_cases() -> list[tuple[torch.Tensor, torch.dtype | None]]:
    _, keep = _large_scores(torch.float32)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()[None, None]  # (1, 1, 4, 4)
    return [(keep, torch.float32), (keep, torch.float16), (keep, torch.float64), (keep, torch.bfloat16),
            (keep, None), (causal, torch.float64), (torch.tensor([True, False, True, True, False]), torch.float32),
            (torch.zeros(2, 3, dtype=torch.bool), torch.float32), (torch.ones(1, 1, dtype=torch.bool), torch.float16)]


@check("additive_mask", expects="a function additive_mask(mask, dtype=torch.float32) returning a float tensor")
def check_additive_mask(fn: Learner) -> str:
    for mask, dtype in _additive_cases():
        want = dtype or torch.float32
        name = str(want).replace("torch.", "")
        shown = f"additive_mask(mask {tuple(mask.shape)}" + (f", dtype=torch.{name})" if dtype else ") with the default dtype")
        raw = _call(fn, (mask,), {"dtype": dtype} if dtype else {}, shown, f"a {name} tensor of shape {tuple(mask.shape)}")
        got = as_tensor(raw, tried=shown, what="your function", expected=f"a {name} tensor")
        kind = str(got.dtype).replace("torch.", "")
        if got.dtype == torch.bool:
            fail("returned a bool mask, not the additive form", tried=shown, got=f"a bool tensor {tuple(got.shape)}",
                 expected=f"a {name} tensor: 0 where the mask is True, -inf where it is False",
                 fix="start from zeros in the dtype asked for and fill the blocked places with float('-inf')")
        if got.dtype != want:
            fail(f"dtype {kind}, not {name}", tried=shown, got=f"a {kind} tensor", expected=f"dtype {name}, the one asked for",
                 cause="the dtype argument is ignored (torch.zeros and torch.where default to float32)" if kind == "float32"
                 else "", fix="create the result with dtype=dtype, or convert it with .to(dtype)")
        if tuple(got.shape) != tuple(mask.shape):
            fail(f"shape {tuple(got.shape)}, not the mask's {tuple(mask.shape)}", tried=shown,
                 got=f"a tensor of shape {tuple(got.shape)}", expected=f"the mask's shape {tuple(mask.shape)}",
                 fix="build the result with the mask's shape: torch.zeros(mask.shape, dtype=dtype)")
        g = got
        if torch.isnan(g).any():
            fail("NaN in the additive mask", tried=shown, got=f"NaN in {int(torch.isnan(g).sum())} places",
                 expected="0 and -inf only", cause="0 × (-inf) is NaN, so (~mask) * float('-inf') does not work",
                 fix="torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, float('-inf')), or torch.where")
        if mask.any() and mask.logical_not().any() and torch.equal(g, mask.to(want)):
            fail("1 for kept, 0 for blocked: blocks nothing", tried=shown, got="mask.to(dtype): 1 where True, 0 where False",
                 expected="0 where True, -inf where False",
                 cause="adding 1 to the kept scores and 0 to the blocked ones shifts the scores and blocks nothing",
                 fix="use 0 for kept positions and float('-inf') for blocked ones")
        if (g[mask] != 0).any():
            if (g[~mask] == 0).all() and (~mask).any() and (g[mask] < 0).all():
                fail(_POLARITY[0], tried=shown, got="-inf (or a large negative) where the mask is True, 0 where False",
                     expected="0 where True, -inf where False", cause="you filled where the mask is True",
                     fix="fill where it is False: masked_fill(~mask, float('-inf'))")
            fail("kept positions are not 0", tried=shown, got=f"{fmt(float(g[mask][g[mask] != 0][0]))} where the mask is True",
                 expected="0 where the mask is True", fix="start from zeros: torch.zeros(mask.shape, dtype=dtype)")
        if (~mask).any():
            blocked = g[~mask].to(torch.float64)
            if (blocked >= 0).any():
                fail("blocked positions not negative", tried=shown, got=f"{fmt(float(blocked.max()))} where the mask is False",
                     expected="-inf where the mask is False", fix="fill where the mask is False with float('-inf')")
        if mask.shape == (2, 1, 3, 4):  # the large-score test: softmax(scores + mask) must ignore blocked keys
            scores, _ = _large_scores(want)
            weights = torch.softmax((scores + g).to(torch.float32), dim=-1)
            reference = torch.softmax(scores.to(torch.float32).masked_fill(~mask, float("-inf")), dim=-1)
            leak = weights[~mask].max().item()
            if not torch.allclose(weights, reference, atol=1e-4) or leak > 1e-6:
                fail("a fill value too weak", tried=shown + " added to scores of ±3·10⁴",
                     got=f"blocked with {fmt(float(g[~mask].max()))}: blocked keys get weight up to {fmt(leak)}",
                     expected="weight 0 on every blocked key",
                     cause="a finite fill is not 'minus infinity': next to scores this large, blocked keys still win",
                     fix="fill with float('-inf')")
            g_ = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(2, HEADS, n, 5, generator=g_) for n in (3, 4, 4))
            ours = F.scaled_dot_product_attention(q, k, v, attn_mask=g.to(torch.float32))
            oracle = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            if not torch.allclose(ours, oracle, atol=1e-5):
                fail("does not act like the bool mask", tried=shown + " in F.scaled_dot_product_attention",
                     got="a different attention output", expected="the output with the bool mask",
                     fix="0 where the mask is True, float('-inf') where it is False")
        blocked = g[~mask]
        if torch.isfinite(blocked).any():
            value = float(blocked[torch.isfinite(blocked)][0])
            named = f"torch.finfo({name}).min" if value == torch.finfo(want).min else fmt(value)
            fail("a finite fill instead of -inf", tried=shown, got=f"{named} where the mask is False",
                 expected="-inf where the mask is False, as the docstring says",
                 cause=f"you filled with {named}, a finite number, not -inf: a query whose every key is blocked then "
                       "gets uniform weights over exactly those keys (softmax of equal scores) instead of the course's "
                       "zeros, and a finite fill blocks only while the scores stay smaller than it",
                 fix="fill with float('-inf'), which every floating-point dtype holds")
    return "0 / -inf in float16, bfloat16, float32 and float64 (and the default); no leak with scores of ±3·10⁴"


# ============================================================================ masked softmax
@dataclass
class _SoftCase:
    name: str
    scores: torch.Tensor
    mask: torch.Tensor
    atol: float


def _softmax_cases() -> list[_SoftCase]:
    g = torch.Generator().manual_seed(6)

    def rand(*shape, dtype=torch.float64):
        return torch.randn(*shape, generator=g, dtype=dtype) * 2

    keep = torch.tensor([[True, False, True, True], [False, True, False, False], [True, True, True, True]])
    padding = torch.tensor([[True, True, True, False, False], [False, False, True, True, True],
                            [False] * 5])[:, None, None, :]  # right, left, all <pad>: (3, 1, 1, 5)
    left = torch.tensor([[0, 0, 5, 6], [3, 4, 5, 6]]) != 0
    decoder = torch.ones(4, 4, dtype=torch.bool).tril() & left[:, None, None, :]  # (2, 1, 4, 4), rows 0–1 empty
    large = torch.tensor([[-20000.0, 30000.0, -20001.5, 0.0], [30000.0, -20000.7, -5000.0, -20000.0],
                          [5.0, 30000.0, 7.0, -1.0]], dtype=torch.float64)
    large_keep = torch.tensor([[True, False, True, False], [False, True, False, True], [False, False, False, False]])
    return [
        _SoftCase("scores (3, 4) with a (3, 4) mask, every row allowed a key", rand(3, 4), keep, 1e-7),
        _SoftCase("large scores (±3·10⁴) with a mask, every row allowed a key (the last row every key)", large,
                  torch.tensor([[True, False, True, False], [False, True, False, True], [True, True, True, True]]),
                  1e-7),
        _SoftCase("scores (3, 2, 4, 5) in float32 with a key-padding mask (3, 1, 1, 5): right, left and all-<pad>",
                  rand(3, 2, 4, 5, dtype=torch.float32), padding, 2e-6),
        _SoftCase("a decoder mask (2, 1, 4, 4) with left padding: rows 0 and 1 of the first sequence are empty",
                  rand(2, 3, 4, 4), decoder, 1e-7),
        _SoftCase("a 1-D mask (4,) that blocks every key", rand(2, 4), torch.zeros(4, dtype=torch.bool), 1e-7),
        _SoftCase("one key (n_k = 1), allowed in one row and blocked in the other", rand(2, 1),
                  torch.tensor([[True], [False]]), 1e-7),
        _SoftCase("large scores (±3·10⁴) with a mask and an empty row", large, large_keep, 1e-7),
        _SoftCase("scores in float16 with a mask and an empty row", rand(3, 4, dtype=torch.float16), large_keep, 2e-3),
    ]


def _softmax_oracle(case: _SoftCase) -> torch.Tensor:
    """Weights from F.scaled_dot_product_attention: with K = I·√n_k and V = I, its output is the weights."""
    scores, mask = case.scores.to(torch.float64), torch.broadcast_to(case.mask, case.scores.shape)
    n_k = scores.shape[-1]
    eye = torch.eye(n_k, dtype=torch.float64)
    out = F.scaled_dot_product_attention(scores, eye * math.sqrt(n_k), eye.expand(*scores.shape[:-2], n_k, n_k),
                                         attn_mask=mask)
    return out.to(case.scores.dtype)


def _naive(s: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """e^s over the allowed keys divided by its row sum, without subtracting a maximum."""
    e = torch.exp(s) * allowed
    return e / e.sum(-1, keepdim=True)


def _softmax_mistakes(case: _SoftCase) -> list[Known]:
    s, mask = case.scores, case.mask
    full = torch.broadcast_to(mask, s.shape)
    empty = ~full.any(-1, keepdim=True)
    inf = float("-inf")
    plain = torch.softmax(s.masked_fill(~full, inf), -1)
    soft = torch.softmax(s, -1)
    nan_rows = ("NaN in fully masked rows", "softmax over a row that is -inf everywhere is 0/0 = NaN",
                "give a row with no allowed key all-zero weights: find such rows with ~mask.any(dim=-1, keepdim=True) "
                "and set their weights to 0 (torch.where or masked_fill)")
    uniform = ("uniform weights in fully masked rows", "a row with every key blocked gets uniform weights (what a "
               "finite fill such as -1e9 gives): it averages exactly the keys it must not see",
               "set the weights of rows with no allowed key to 0 (~mask.any(dim=-1, keepdim=True))")
    out = [
        Known(*nan_rows, plain, "nan"),
        Known(*uniform, lambda: torch.softmax(s.masked_fill(~full, -1e9), -1), "uniform9"),
        Known(*uniform, lambda: torch.softmax(s.masked_fill(~full, torch.finfo(s.dtype).min), -1), "uniformmin"),
        Known("fully masked rows not masked", "in a row with no allowed key you kept the softmax of the unmasked scores",
              "give such rows all-zero weights", torch.where(empty, soft, plain), "unmasked-rows"),
        Known("softmax over axis -2 (the queries)", "you normalised each column instead of each row",
              "softmax over the last axis, dim=-1", lambda: torch.nan_to_num(torch.softmax(s.masked_fill(~full, inf), -2)),
              "dim-2"),
        Known(_POLARITY[0], _POLARITY[1], "fill the scores where the mask is False: scores.masked_fill(~mask, "
              "float('-inf'))", lambda: torch.nan_to_num(torch.softmax(s.masked_fill(full, inf), -1)), "polarity"),
        Known("mask ignored", "you did not use the mask, so blocked keys get weight", "fill the blocked scores with "
              "float('-inf') before the softmax", soft, "ignored"),
        Known("bool mask added to the scores", "you added the mask to the scores: True counts as +1, which shifts the "
              "allowed scores a little and blocks nothing", "fill the blocked scores with float('-inf'): "
              "scores.masked_fill(~mask, float('-inf'))", lambda: torch.softmax(s + full.to(s.dtype), -1), "plus"),
        Known("mask applied after the softmax", "you zeroed the blocked weights after a softmax over all keys, so "
              "rows no longer sum to 1", "fill the blocked *scores* with float('-inf') before the softmax",
              soft * full, "after"),
        Known("mask applied after the softmax, then renormalised", "you zeroed the blocked weights after a softmax "
              "over all keys and divided by the row sum: 0/0 = NaN in fully masked rows and where the allowed weights "
              "underflow", "fill the blocked scores with float('-inf') before the softmax",
              (soft * full) / (soft * full).sum(-1, keepdim=True), "renorm"),
        Known("mask applied after the softmax, then renormalised", "you zeroed the blocked weights after a softmax "
              "over all keys and divided by the row sum: where the allowed weights underflow, that is 0/0",
              "fill the blocked scores with float('-inf') before the softmax",
              torch.nan_to_num((soft * full) / (soft * full).sum(-1, keepdim=True)), "renorm-nan0"),
        Known("rows with any blocked key set to 0", "you zeroed every row that has a blocked key (all instead of any)",
              "zero only the rows with no allowed key: ~mask.any(dim=-1, keepdim=True)",
              plain.masked_fill(~full.all(-1, keepdim=True), 0.0), "all"),
        Known("log-softmax instead of softmax", "you returned log-weights (log_softmax), not weights",
              "use torch.softmax", lambda: torch.log_softmax(s.masked_fill(~full, inf).masked_fill(empty, 0.0), -1)
              .masked_fill(empty, 0.0), "log"),
        Known("scores returned as weights", "you returned the masked scores, not their softmax",
              "return torch.softmax(masked scores, dim=-1), with fully masked rows set to 0",
              lambda: s.masked_fill(~full, inf).masked_fill(empty, 0.0), "scores"),
        Known("softmax without subtracting the maximum", "you exponentiated the raw scores: e^30000 overflows to "
              "inf, and inf/inf (or inf × 0) is NaN", "subtract each row's maximum over the allowed keys before exp, or "
              "use torch.softmax", lambda: _naive(s, full), "naive"),
        Known("softmax without subtracting the maximum", "you exponentiated the raw scores: e^30000 overflows to "
              "inf, and inf/inf (or inf × 0) is NaN, which your code then set to 0", "subtract each row's maximum "
              "over the allowed keys before exp, or use torch.softmax", lambda: torch.nan_to_num(_naive(s, full)),
              "naive-nan0"),
        Known("fully masked rows filled with 1", "a row with no allowed key must get weights 0, not 1",
              "use 0 for such rows", torch.where(empty, torch.ones_like(plain), plain), "ones"),
    ]
    weak = []
    for fill in (-1e4, -1e3, -1e5):
        weak.append(Known("a fill value too weak for these scores", "you filled blocked scores with a finite negative "
                          "number, but next to scores of ±3·10⁴ blocked keys still get weight", "fill with float('-inf')",
                          lambda fill=fill: torch.softmax(s.masked_fill(~full, fill), -1).masked_fill(empty, 0.0),
                          f"weak{fill}"))
    return out + weak


def _confirm_no_keepdim(fn: Learner) -> bool:
    """On square scores (where a (…, n_q) row mask broadcasts without an error) the learner's function gives
    what a missing keepdim gives: rows left as they are, and column i zeroed where row i has no key."""
    s = torch.tensor([[0.3, -1.2, 2.0], [0.7, 0.1, -0.4], [1.5, -0.6, 0.2]], dtype=torch.float64)  # (3, 3)
    mask = torch.tensor([[True, False, True], [False, False, False], [True, True, False]])
    try:
        got = as_tensor(fn(s, mask), tried="", what="")
    except (LearnerRaised, Failure):
        return False
    wrong_axis = torch.softmax(s.masked_fill(~mask, float("-inf")), -1).masked_fill(~mask.any(-1), 0.0)
    return same(got, wrong_axis, atol=1e-9, rtol=1e-7)


@check("masked_softmax", expects="a function masked_softmax(scores, mask) returning weights shaped like scores")
def check_masked_softmax(fn: Learner) -> str:
    known = Elimination(_softmax_mistakes)
    amb = _Ambiguity()
    for case in _softmax_cases():
        s, mask = case.scores, case.mask
        tried = f"masked_softmax(scores {tuple(s.shape)} {str(s.dtype).replace('torch.', '')}, mask {tuple(mask.shape)}) on {case.name}"
        full = torch.broadcast_to(mask, s.shape)
        plain = torch.softmax(s.masked_fill(~full, float("-inf")), -1)
        constructs = [("you found the fully masked rows with mask.any(dim=-1) without keepdim=True: its shape (…, n_q) "
                       "lines up with the keys' axis of the weights, not with the rows",
                       "keep the axis: ~mask.any(dim=-1, keepdim=True) has shape (…, n_q, 1)",
                       [lambda: plain.masked_fill(~mask.any(-1), 0.0), lambda: plain.masked_fill(~full.any(-1), 0.0),
                        lambda: torch.where(mask.any(-1), plain, 0.0), lambda: torch.where(full.any(-1), plain, 0.0)],
                       lambda: _confirm_no_keepdim(fn))]
        raw, changed = _watched(fn, (s, mask), tried, f"weights of shape {tuple(s.shape)}", ("scores", "mask"),
                                constructs)
        if isinstance(raw, np.ndarray):
            fail("returned a NumPy array, not a tensor", tried=tried, got=f"a NumPy array {raw.shape} {raw.dtype}",
                 expected="a torch tensor of weights, as the docstring says",
                 cause="part of your computation went through NumPy (.numpy(), np.exp…), which returns an array",
                 fix="stay with torch operations: masked_fill, torch.softmax, torch.where")
        got = as_tensor(raw, tried=tried, what="your function")
        expected = _softmax_oracle(case)
        if not same(got, expected, atol=case.atol, rtol=1e-4):
            mistakes = known.candidates(got, case, atol=case.atol, rtol=1e-4)
            with amb.case():
                try:
                    expect_close(got, expected, tried=tried, what="your weights", atol=case.atol, rtol=1e-4,
                                 mistakes=mistakes)
                except Failure as failure:
                    if failure.diagnosis.cause:
                        raise
                    lower_precision(got, s.dtype, tried=tried, what="your weights")
                    _softmax_structure(got, case, tried)
                    raise
            continue  # a failure that waits for a later case to tell two mistakes apart
        if changed:
            names = " and ".join(changed)
            fail(f"changed {names} in place", tried=tried, got=f"right weights, but after the call {names} held "
                 "different values than before", expected="the arguments left as they were",
                 cause=f"an in-place operation on {names} (a method ending in _ such as masked_fill_, or an assignment "
                       "into it) changes the caller's tensor too",
                 fix="compute new tensors: scores.masked_fill(~mask, float('-inf')), without the trailing _")
        known.passed(case, expected, case.atol)
    amb.finish()
    shapes = {tuple(c.mask.shape) for c in _softmax_cases()}
    return ("zero weights on blocked keys and in fully masked rows, rows of allowed keys summing to 1 "
            f"(masks of {len(shapes)} shapes, left padding, large scores, float16/32/64)")


def _softmax_structure(got: torch.Tensor, case: _SoftCase, tried: str) -> None:
    """When no known mistake reproduces the weights, say which property is off."""
    if tuple(got.shape) != tuple(case.scores.shape):
        return
    w = got.to(torch.float64)
    full = torch.broadcast_to(case.mask, w.shape)
    empty = ~full.any(-1)  # (..., n_q)
    rows = f"{int(empty.sum())} fully masked row{'s' if int(empty.sum()) != 1 else ''}"
    if empty.any():
        bad = w[empty]
        if torch.isnan(bad).any():
            fail("NaN in fully masked rows", tried=tried, got=f"NaN in the {rows}", expected="all-zero weights there",
                 cause="softmax over a row that is -inf everywhere is 0/0 = NaN",
                 fix="give rows with no allowed key all-zero weights (~mask.any(dim=-1, keepdim=True))")
        if (bad.abs() > 1e-6).any():
            fail("fully masked rows are not zero", tried=tried, got=f"weights up to {fmt(float(bad.abs().max()))} in "
                 f"the {rows}", expected="all-zero weights in a row with no allowed key",
                 fix="set such rows to 0 (~mask.any(dim=-1, keepdim=True))")
    finite = w[torch.isfinite(w)]
    if (w < -1e-12).any() or (w > 1 + 1e-6).any():
        fail("weights outside [0, 1]", tried=tried, got=f"weights from {fmt(float(w.min()))} to {fmt(float(w.max()))}"
             + ("" if finite.numel() == w.numel() else " (some of them infinite)"),
             expected="weights between 0 and 1", fix="the weights are a softmax over the allowed keys: torch.softmax")
    if torch.isnan(w).any():
        nan_rows = torch.isnan(w).any(-1)  # (..., n_q)
        overflow = torch.isinf(torch.exp(case.scores.to(w.dtype)).masked_fill(~full, 0.0)).any(-1)
        if torch.equal(nan_rows, overflow):
            fail("softmax without subtracting the maximum", tried=tried,
                 got=f"NaN in exactly the {int(nan_rows.sum())} rows where an allowed score is so large that e^score is inf",
                 expected="finite weights in every row with an allowed key",
                 cause="you exponentiated the raw scores: e^30000 overflows to inf, and inf/inf is NaN",
                 fix="subtract each row's maximum over the allowed keys before exp, or use torch.softmax")
        fail("NaN in rows that have an allowed key", tried=tried, got=f"NaN in {int(torch.isnan(w).any(-1).sum())} rows "
             "with allowed keys", expected="finite weights", fix="print each step on this input: where does NaN first appear?")
    leak = float(w[~full].abs().max()) if (~full).any() else 0.0
    if leak > 1e-6:
        fail("weight on blocked keys", tried=tried, got=f"blocked keys get weight up to {fmt(leak)}",
             expected="weight 0 wherever the mask is False", fix="fill blocked scores with float('-inf') before the softmax")
    sums = w.sum(-1)[~empty]
    if sums.numel() and not torch.allclose(sums, torch.ones_like(sums), atol=1e-3):
        fail("rows do not sum to 1", tried=tried, got=f"rows with allowed keys summing to {fmt(float(sums.min()))} … "
             f"{fmt(float(sums.max()))}", expected="each row with an allowed key summing to 1",
             fix="take the softmax over the last axis (dim=-1) after masking")
