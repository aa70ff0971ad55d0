"""Checks for notebook 06: causal, padding, decoder, cross-attention and additive masks, and the masked softmax.

Convention: a boolean mask is True where a query may attend to a key. Each check holds the answer to
its docstring: a mask function returns a torch bool tensor of exactly the stated shape (a NumPy
array, an additive float mask or a shape that merely broadcasts is named as such); the decoder mask
blocks <pad> keys only (a <pad> query keeps its row); the additive mask holds 0 and -inf (no finite
fill); ``masked_softmax`` leaves its arguments unchanged (a learner-side probe watches them).

How a wrong mask is named: each check runs one :class:`~.kit.Suspects` over its table of known
mistakes (a function of the case: key, summary, cause, fix and the mask that mistake gives), so a
mistake is named when the answer equals its mask and no earlier, passed case ruled it out; otherwise
by *where* it differs — the allowed and blocked pairs that are wrong are described by the region that
holds them all ("later keys", "<pad> keys", "the diagonal", "rows of <pad> queries"…). Oracles:
``torch.tril``, comparisons with the ids, and ``F.scaled_dot_product_attention`` for the additive
mask and the masked softmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from . import kit
from .compare import Failure, same
from .core import Learner, LearnerRaised, as_tensor, check, fail, fmt, learner_error
from .kit import Known, Suspects, explain_raise, reproduce

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
    if isinstance(value, (int, float, np.number)) and not isinstance(value, (bool, np.bool_)):
        fail(f"returned the number {value}, not a mask", tried=tried, got=f"the Python number {value!r}",
             expected="a bool tensor (True = may attend)", cause=f"your function returns a plain number ({value!r}), "
             "not a tensor: the return line gives back a number where the mask belongs",
             fix="return the mask tensor you built (print(type(mask), mask.shape) before returning)")
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


def _table(rows: Callable[..., list[tuple]], cases: list[tuple], shape_of: Callable[..., tuple]) -> list[Known]:
    """A check's table of known mistakes: ``rows(*case)`` lists (key, summary, cause, fix, mask) — the mask that
    mistake gives on that case (a tensor, a function making it, or None where it cannot happen), broadcast to
    ``shape_of(*case)``. Keys and texts do not depend on the case; each case's rows are built once."""
    memo: dict[tuple, dict] = {}
    assert len({row[0] for row in rows(*cases[0])}) == len(rows(*cases[0])), "every key once"

    def value(key: str, *case: Any) -> torch.Tensor | None:
        ids = tuple(map(id, case))
        if ids not in memo:
            memo[ids] = {"case": case, **{row[0]: row[4] for row in rows(*case)}}
        v = memo[ids].get(key)
        v = v() if callable(v) else v
        return None if v is None else _broadcast(v, shape_of(*case))

    return [Known(k, summary, cause, fix, lambda *case, k=k: value(k, *case))
            for k, summary, cause, fix, _ in rows(*cases[0])]


def _row(summary: str, cause: str, fix: str, value: Any, key: str) -> tuple:
    return key, summary, cause, fix, value


@dataclass
class Region:
    """A named set of (query, key) pairs, for saying where a wrong mask is wrong."""

    name: str  # "later keys (j > i)"
    where: torch.Tensor  # bool, broadcastable to the compared shape


def _first(wrong: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in wrong.nonzero()[0])


class _Judge:
    """One check run: a :class:`~.kit.Suspects` over the table ``rows``, every case (where two suspects may be
    told apart), and the learner's ``fn`` as the engine calls it on another case (as ``call(fn, *case)`` when a
    case holds keyword arguments), its mask broadcast to ``shape_of(*case)``."""

    def __init__(self, fn: Learner, rows: Callable[..., list[tuple]], cases: list[tuple],
                 shape_of: Callable[..., tuple], call: Callable[..., Any] | None = None):
        self.suspects, self.cases = Suspects(_table(rows, cases, shape_of)), cases
        self.again = lambda *case: torch.broadcast_to(_as_bool_mask(call(fn, *case) if call else fn(*case), tried="",
                                                                    what=""), shape_of(*case))

    def found(self, got: torch.Tensor, case: tuple) -> list[Known]:
        """The known mistakes (not ruled out, told apart on other cases where they can be) whose mask is ``got``."""
        found = self.suspects.suspects(got, case)
        found = self.suspects.narrow(found, self.again, self.cases) if len(found) > 1 else found
        return list({m.summary: m for m in found}.values())


def _compare(got: torch.Tensor, expected: torch.Tensor, judge: _Judge, case: tuple, *, tried: str, what: str,
             regions: list[Region], hints: list[tuple] = (), index_names: str = "", unit: str = "pair") -> None:
    """Fail unless ``got`` equals ``expected``, shape included (the docstring states the shape); a right answer
    is recorded, so that it rules out the mistakes whose mask differs here."""
    target = tuple(expected.shape)
    shape_note = ""
    if tuple(got.shape) != target:
        _wrong_shape(got, expected, judge, case, tried=tried, what=what, hints=hints)
        shape_note = f"{what} has shape {tuple(got.shape)}, not {target}; broadcast to {target}, it "
        got = torch.broadcast_to(got, target)  # _wrong_shape returns only for a mask that broadcasts, with wrong values
    g, e = got, expected
    if torch.equal(g, e):
        judge.suspects.expect(g, e, case, tried=tried)
        return
    found = judge.found(g, case)
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
    parts, summary_bits = [], []
    for wrong, does, verb in ((extra, "allows {} it must block", "allowed"),
                              (missing, "blocks {} it must allow", "blocked")):
        if not wrong.any():
            continue
        count = int(wrong.sum())
        # the first region that holds every wrong pair, and whether it holds nothing else
        region = next((r for r in regions if not (wrong & ~torch.broadcast_to(r.where, wrong.shape)).any()), None)
        exact = region is not None and not (torch.broadcast_to(region.where, wrong.shape) & ~wrong).any()
        parts.append(does.format(f"{count} {unit}{'s' if count > 1 else ''}")
                     + (f" ({'exactly' if exact else 'all of them'} {region.name})" if region else ""))
        summary_bits += [f"{region.name} {verb}"] if region else []
    wrong = extra | missing
    first = _first(wrong)
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


def _wrong_shape(got: torch.Tensor, expected: torch.Tensor, judge: _Judge, case: tuple, *, tried: str, what: str,
                 hints: list[tuple]) -> None:
    """Fail on a mask whose shape differs from the docstring's, naming the likeliest reason."""
    want, shape = tuple(expected.shape), tuple(got.shape)
    g = _broadcast(got, want)
    if g is not None and not torch.equal(g, expected):  # a known mistake in the values says more than the shape
        found = judge.found(g, case)
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
    empty = 0 in shape and 0 not in want
    fail(f"shape {shape} does not fit {want}", tried=tried, got=f"{what} of shape {shape}",
         expected=f"shape {want}, as the docstring says", cause=f"your mask has an axis of size 0 (axis "
         f"{shape.index(0)}), so it holds no entries at all: a 0 where a size belongs (in expand, view, zeros or a "
         "slice that stops at once)" if empty else "",
         fix="follow the shapes in the docstring; print(mask.shape) after each step")


def _broadcast(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor | None:
    try:
        return torch.broadcast_to(t, shape)
    except RuntimeError:
        return None


def _count(g: torch.Tensor, e: torch.Tensor, index_names: str) -> str:
    wrong = g != e
    return f"differs at {int(wrong.sum())} of {wrong.numel()} positions (the first at index {_first(wrong)}{index_names})"


_PATTERNS = [
    *[("RuntimeError", f"value cannot be converted to type .*{kind} without overflow", "you filled with a finite number "
       f"too large for the tensor's dtype: {where}", "fill with float('-inf'), which every floating-point dtype holds")
      for kind, where in (("Half", "float16 holds at most 65504 in magnitude, so a fill such as -1e9 or "
                                   "torch.finfo(torch.float32).min cannot be stored"),
                          ("BFloat16", "bfloat16 holds at most about 3.39·10³⁸ in magnitude, less than "
                                       "torch.finfo(torch.float32).min"), ("", "this dtype cannot store it"))],
    ("RuntimeError", "Boolean value of Tensor", "an `if` or `and`/`or` asked a whole tensor for one truth value",
     "combine masks with & and |, and test for None with `is not None`"),
    *[(kind, pattern, "a mask made of numbers (floats) where a bool mask is needed: ~ and masked_fill work on bool "
       "masks only", "make the mask bool: dtype=torch.bool, .bool(), or a comparison")
      for kind, pattern in (("TypeError", r"\(operator.invert\) is only implemented"),
                            ("RuntimeError", "only supports boolean masks"))],
]


def _call(fn: Learner, args: tuple, kwargs: dict, tried: str, expected: str, constructs: list[tuple] = (),
          probe_names: tuple[str, ...] = ()) -> Any:
    """The learner's result (and, with ``probe_names``, the names of the arguments it changed in place). An
    exception is explained by a construct (cause, fix, attempt[, confirm]) that raises the very same message
    and, where it has ``confirm`` (a broadcasting message alone is shared by many mistakes), is confirmed by
    another call of the learner's code; else by a pattern of this topic or of the course."""
    try:
        if not probe_names:
            return fn(*args, **kwargs)
        value, changed = fn.observe(kit.CALL, *args)
        return value, [probe_names[int(i)] for i in changed if 0 <= int(i) < len(probe_names)]
    except LearnerRaised as exc:
        same_message = [c[:3] for c in constructs if reproduce(c[2]) == exc.message and (len(c) < 4 or c[3]())]
        raise Failure(learner_error(exc, tried=tried, expected=expected,
                                    **explain_raise(exc, same_message, _PATTERNS))) from None


# ============================================================================ causal
def _ij(n_q: int, n_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]


def _causal_regions(n_q: int, n_k: int) -> list[Region]:
    i, j = _ij(n_q, n_k)
    return [Region("later keys (j > i)", j > i), Region("the diagonal (j = i)", j == i),
            Region("earlier keys (j < i)", j < i), Region("keys up to the diagonal (j ≤ i)", j <= i)]


def _causal_mistakes(n: int) -> list[tuple]:
    ones = torch.ones(n, n, dtype=torch.bool)
    return [
        _row("upper triangle instead of lower", "torch.triu keeps j ≥ i: each query sees itself and the future",
             "keep j ≤ i: torch.tril", ones.triu(), "triu"),
        _row("diagonal excluded (off by one)", "a token must be allowed to attend to itself; with the diagonal "
             "blocked, the first row has no key at all", "torch.tril with diagonal=0 (the default)", ones.tril(-1), "tril-1"),
        _row("one diagonal too many (off by one)", "query i also sees key i + 1, the next token",
             "torch.tril with diagonal=0 (the default)", ones.tril(1), "tril+1"),
        _row(_POLARITY[0], _POLARITY[1] + "; True marks the future here", "use torch.tril for the allowed pairs",
              ones.triu(1), "polarity"),
        _row("nothing is masked", "every query sees every key", "keep j ≤ i: torch.tril", ones, "ones"),
        _row("only the diagonal is allowed", "each token sees only itself (torch.eye)", "keep every j ≤ i: torch.tril",
             torch.eye(n, dtype=torch.bool), "eye"),
        _row("everything is masked", "no query may attend to any key", "keep j ≤ i: torch.tril",
             torch.zeros(n, n, dtype=torch.bool), "zeros"),
        _row("anti-diagonal triangle (flipped)", "you flipped the matrix left to right: the mask follows the "
             "anti-diagonal", "keep j ≤ i: torch.tril, without flipping", ones.tril().flip(-1), "flip"),
    ]


@check("causal_mask", expects="a function causal_mask(n) returning an (n, n) bool tensor")
def check_causal_mask(fn: Learner) -> str:
    sizes = [5, 8, 1, 2]
    judge = _Judge(fn, _causal_mistakes, [(n,) for n in sizes], lambda n: (n, n))
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
        _compare(got, torch.ones(n, n, dtype=torch.bool).tril(), judge, judge.cases[sizes.index(n)], tried=tried,
                 what="your mask", hints=hints, regions=_causal_regions(n, n), index_names=" (query, key)")
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
    args = [(torch.tensor(values, dtype=dtype), max_len) for values, max_len, dtype in cases]
    judge = _Judge(fn, _lengths_mistakes, args, lambda lengths, max_len: (len(lengths), max_len or int(lengths.max())),
                   lambda f, lengths, max_len: f(lengths) if max_len is None else f(lengths, max_len=max_len))
    for (values, max_len, dtype), case in zip(cases, args):
        lengths = case[0]
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
        _compare(got, expected, judge, case, tried=tried, what="your mask", hints=hints,
                 regions=_padding_regions(expected), index_names=" (sequence, position)", unit="position")
    return (f"correct on {len(cases)} batches (a zero length, no padding, one sequence, max_len given and "
            "default, int32 and int64 lengths)")


def _lengths_mistakes(lengths: torch.Tensor, max_len: int | None) -> list[tuple]:
    S = int(lengths.max()) if max_len is None else max_len
    positions, column = torch.arange(S)[None, :], lengths[:, None].long()
    return [
        _row("off by one (<= instead of <)", "position `length` is already padding: positions 0 … length−1 are "
             "the real tokens", "compare with <: torch.arange(max_len) < lengths[:, None]",
             positions <= column, "le"),
        _row("last real token marked as padding", "you compared with length − 1", "compare with the length itself: "
             "torch.arange(max_len) < lengths[:, None]", positions < column - 1, "lt-1"),
        _row(_POLARITY[0], _POLARITY[1] + "; real tokens should be True, padding False",
             "flip the comparison: torch.arange(max_len) < lengths[:, None]", positions >= column, "polarity"),
        _row(_POLARITY[0], _POLARITY[1] + "; real tokens should be True, padding False",
             "torch.arange(max_len) < lengths[:, None]", positions > column, "polarity+1"),
        _row("padding on the left", "you marked the last `length` positions as real; the course pads on the right "
             "(the first lengths[b] positions are real)", "torch.arange(max_len) < lengths[:, None]",
             positions >= S - column, "left"),
    ]


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


def _ids_mistakes(ids: torch.Tensor, pad_id: int) -> list[tuple]:
    real, S = ids != pad_id, ids.shape[1]
    count = real.sum(-1, keepdim=True)
    return [
        _row("pad_id ignored (compared with 0)", "you compared the ids with 0, not with the pad_id argument",
             "compare with the argument: ids != pad_id", ids != 0, "zero"),
        _row("pad_id ignored (compared with 0)", "you treated id 0 as padding instead of the pad_id argument",
             "compare with the argument: ids != pad_id", ids > 0, "positive"),
        _row(_POLARITY[0], _POLARITY[1] + "; real tokens should be True, <pad> False", "ids != pad_id",
             ids == pad_id, "polarity"),
        _row("padding assumed at the end", "you counted the real tokens and marked that many positions from the "
             "start; with padding on the left (or in the middle) the real tokens are elsewhere",
             "compare every id with pad_id: ids != pad_id", torch.arange(S)[None, :] < count, "count"),
        _row("padding assumed after the first <pad>", "you marked everything after the first <pad> as padding; "
             "with padding on the left the real tokens come after it", "compare every id with pad_id: ids != pad_id",
             torch.cumprod(real.long(), -1).bool(), "cumprod"),
        _row("ids below pad_id blocked (ids > pad_id)", "you kept only the ids greater than pad_id, as if <pad> "
             "had the smallest id; a real token may have a smaller id than pad_id", "compare for inequality: "
             "ids != pad_id", ids > pad_id, "greater"),
        _row("id 0 treated as padding too", "you blocked id 0 as well as pad_id; here id 0 is a real token",
             "compare with the argument only: ids != pad_id", real & (ids != 0), "zero-too"),
    ]


@check("padding_mask_from_ids", expects="a function padding_mask_from_ids(ids, pad_id) returning a (B, S) bool tensor")
def check_padding_mask_from_ids(fn: Learner) -> str:
    cases = [
        (torch.tensor([[5, 7, 2, 0, 0], [4, 4, 9, 8, 1]]), 0),
        (torch.tensor([[6, 3, 3, 3], [0, 2, 3, 3], [3, 3, 3, 3]]), 3),  # pad id 3; a token with id 0 is real
        (torch.tensor([[1, 1, 5, 6, 2], [1, 7, 8, 9, 4]]), 1),  # left padding
        (torch.tensor([[9, 12, 9], [4, 9, 9]], dtype=torch.int32), 9),
        (torch.tensor([[0]]), 0),  # one sequence of one <pad>
    ]
    judge = _Judge(fn, _ids_mistakes, cases, lambda ids, pad_id: tuple(ids.shape))
    for case in cases:
        (B, S), (ids, pad_id) = case[0].shape, case
        tried = f"padding_mask_from_ids(ids {tuple(ids.shape)} {str(ids.dtype).replace('torch.', '')}, pad_id={pad_id})"
        got = _as_bool_mask(_call(fn, (ids, pad_id), {}, tried, f"a ({B}, {S}) bool tensor"), tried=tried,
                            what="your mask")
        real = ids != pad_id
        hints = [((S, B), "transposed: one row per position", "you put the positions on the rows",
                  "return (B, S), one row per sequence")] if S != B else []
        hints.append(((B, 1, 1, S), "shape (B, 1, 1, S), not (B, S)", "you added the heads and queries axes that "
                      "attention needs; this function returns the plain (B, S) mask", "return ids != pad_id as it is, "
                      "(B, S); add axes where the mask is used"))
        _compare(got, real, judge, case, tried=tried, what="your mask", hints=hints, regions=_padding_regions(real),
                 index_names=" (sequence, position)", unit="position")
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


def _decoder_mistakes(ids: torch.Tensor, pad_id: int) -> list[tuple]:
    B, T = ids.shape
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
            _row("padding blocked on the queries instead of the keys", "you blocked the rows of <pad> queries "
                 "but not the <pad> keys, so real tokens still read <pad> (visible with left padding)",
                 "block the columns of <pad> tokens: (tgt_ids != pad_id)[:, None, None, :]",
                 causal & queries, "queries" + tag),
            _row("the padding part is missing", "you used the causal mask alone", "AND it with the key-padding "
                 "mask: causal & (tgt_ids != pad_id)[:, None, None, :]", None if q_too else causal, "nopad" + tag),
            _row("the causal part is missing", "you used the padding mask alone, so tokens see later tokens",
                 "AND it with torch.tril(torch.ones(T, T, dtype=torch.bool))", keys & rows, "nocausal" + tag),
            _row("causal OR padding instead of AND", "you combined the two masks with | (OR)",
                 "both must hold: combine with & (AND)", (causal | keys) & rows, "or" + tag),
            _row("upper triangle instead of lower", "the causal part lets queries see the future (torch.triu)",
                 "use torch.tril", ones.triu() & keys & rows, "triu" + tag),
            _row("diagonal excluded (off by one)", "a token must be allowed to attend to itself",
                 "torch.tril with diagonal=0 (the default)", ones.tril(-1) & keys & rows, "tril-1" + tag),
            _row("one diagonal too many (off by one)", "query i also sees key i + 1, the next token",
                 "torch.tril with diagonal=0 (the default)", ones.tril(1) & keys & rows, "tril+1" + tag),
            _row("pad_id ignored (compared with 0)", "you compared the ids with 0, not with the pad_id argument",
                 "compare with the argument: tgt_ids != pad_id",
                 causal & (ids != 0)[:, None, None, :] & (rows if not q_too else (ids != 0)[:, None, :, None]),
                 "zero" + tag),
            _row("padding assumed at the end", "you built the padding mask from the number of real tokens, "
                 "so with left padding the <pad> keys are allowed and real ones blocked",
                 "compare the ids themselves: tgt_ids != pad_id",
                 causal & counted[:, None, None, :] & (rows if not q_too else counted[:, None, :, None]), "count" + tag),
        ]
    mistakes.append(_row("everything is masked", "no query may attend to any key", "causal & (tgt_ids != pad_id)"
                         "[:, None, None, :], with causal = torch.ones(T, T, dtype=torch.bool).tril()",
                         torch.zeros(B, 1, T, T, dtype=torch.bool), "zeros"))
    mistakes.append(_row("transposed: rows and columns swapped", "your rows are the keys and your columns the "
                         "queries", "rows are queries, columns keys: mask[..., i, j] says whether query i may "
                         "attend to key j", key_only.transpose(-2, -1), "transposed"))
    mistakes.append(_row(_POLARITY[0], _POLARITY[1], "negate it: ~mask", ~key_only, "polarity"))
    mistakes.append(_row("padding part inverted (== pad_id)", "your padding part is True at the <pad> tokens "
                         "(tgt_ids == pad_id): it allows only <pad> keys and blocks the real ones",
                         "compare with !=: causal & (tgt_ids != pad_id)[:, None, None, :]",
                         causal & (ids == pad_id)[:, None, None, :], "pad-polarity"))
    mistakes.append(_row(_POLARITY[0], _POLARITY[1], "negate it: ~mask", ~both, "polarity+q"))
    mistakes.append(_row("<pad> query rows blocked as well", "you blocked the rows of <pad> queries too; the "
                         "docstring blocks only <pad> keys (a <pad> query still reads the real tokens before it, "
                         "and its output is simply never used), so every <pad> row of yours is fully masked",
                         "drop the query part: causal & (tgt_ids != pad_id)[:, None, None, :]", both, "rows-too"))
    return mistakes


@check("decoder_mask", expects="a function decoder_mask(tgt_ids, pad_id) returning a (B, 1, T, T) bool tensor")
def check_decoder_mask(fn: Learner) -> str:
    judge = _Judge(fn, _decoder_mistakes, _DECODER_CASES, lambda ids, pad: (ids.shape[0], 1, ids.shape[1], ids.shape[1]))
    for case in _DECODER_CASES:
        (B, T), (ids, pad_id) = case[0].shape, case
        tried = f"decoder_mask(tgt_ids {(B, T)}, pad_id={pad_id})"
        keys_ = (ids != pad_id)[:, None, None, :]
        constructs = [("you built the causal part with tgt_ids.shape[0] (the batch size B) where T = tgt_ids.shape[1] "
                       "(the sequence length) belongs", "T = tgt_ids.shape[-1]; causal = torch.ones(T, T, "
                       "dtype=torch.bool).tril()", lambda: torch.ones(B, B, dtype=torch.bool).tril() & keys_)]
        got = _as_bool_mask(_call(fn, (ids, pad_id), {}, tried, f"a ({B}, 1, {T}, {T}) bool tensor", constructs),
                            tried=tried, what="your mask")
        causal, real = torch.ones(T, T, dtype=torch.bool).tril(), ids != pad_id
        key_only = causal & real[:, None, None, :]  # (B, 1, T, T)
        _compare(got, key_only, judge, case, tried=tried, what="your mask", hints=_heads_hints(B, T, T),
                 index_names=" (batch, head, query, key)", regions=_pair_regions(T, T, real, real, causal=True))
    return "causal AND key padding (right and left padding, an all-<pad> sequence), with a heads axis of size 1"


_CROSS_CASES = [
    (torch.tensor([[1, 5, 6, 7, 0, 0], [1, 8, 9, 4, 3, 2]]), torch.tensor([[4, 9, 0, 0], [3, 5, 7, 2]]), 0),
    (torch.tensor([[1, 5, 2, 2, 2], [1, 3, 4, 6, 2], [1, 2, 2, 2, 2]]),
     torch.tensor([[7, 8, 9, 2, 2, 2, 2], [5, 6, 2, 2, 2, 2, 2], [4, 4, 4, 4, 4, 4, 4]]), 2),
    (torch.tensor([[1, 2, 3], [1, 0, 0]]), torch.tensor([[0, 0, 4, 5], [6, 7, 8, 9]]), 0),  # left-padded source
    (torch.tensor([[1, 4], [1, 5]]), torch.tensor([[0, 0, 0], [5, 6, 7]]), 0),  # a source of <pad> only
    (torch.tensor([[1]]), torch.tensor([[3]]), 0),  # T = S = 1, B = 1
]


def _cross_mistakes(tgt: torch.Tensor, src: torch.Tensor, pad_id: int) -> list[tuple]:
    (B, T), S = tgt.shape, src.shape[1]
    src_real, tgt_real = src != pad_id, tgt != pad_id
    queries, expected = tgt_real[:, None, :, None], src_real[:, None, None, :].expand(B, 1, T, S)
    rect = torch.ones(T, S, dtype=torch.bool).tril()
    return [
        _row("target padding blocked instead of source padding", "you blocked the rows of target <pad> queries "
             "and let every query read the source <pad> keys", "block the columns of source <pad> tokens: "
             "(src_ids != pad_id)[:, None, None, :]", queries.expand(B, 1, T, S), "tgt"),
        _row("target padding rows blocked as well", "in cross-attention only the source padding (the columns) "
             "is blocked; every target query keeps the real source tokens",
             "drop the target part: (src_ids != pad_id)[:, None, None, :]", expected & queries, "tgt-too"),
        _row("a causal part in cross-attention", "cross-attention has no causal constraint: the whole source "
             "sentence is known before the decoder starts", "block only the source padding", expected & rect, "causal"),
        _row(_POLARITY[0], _POLARITY[1] + "; real source tokens should be True", "negate it: ~mask",
             ~expected, "polarity"),
        _row("pad_id ignored (compared with 0)", "you compared the ids with 0, not with the pad_id argument",
             "compare with the argument: src_ids != pad_id", (src != 0)[:, None, None, :], "zero"),
        _row("padding assumed at the end", "you built the source mask from the number of real tokens, so with "
             "left padding the <pad> keys are allowed and real ones blocked", "compare the ids: src_ids != pad_id",
             (torch.arange(S)[None, :] < src_real.sum(-1, keepdim=True))[:, None, None, :], "count"),
        _row("nothing is masked", "every target query sees every source key, <pad> included",
             "block the source <pad> keys: (src_ids != pad_id)[:, None, None, :]",
             torch.ones(B, 1, T, S, dtype=torch.bool), "ones"),
    ]


@check("cross_attention_mask",
       expects="a function cross_attention_mask(tgt_ids, src_ids, pad_id) returning a (B, 1, T, S) bool tensor")
def check_cross_attention_mask(fn: Learner) -> str:
    judge = _Judge(fn, _cross_mistakes, _CROSS_CASES, lambda tgt, src, pad: (len(tgt), 1, tgt.shape[1], src.shape[1]))
    for case in _CROSS_CASES:
        tgt, src, pad_id = case
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
        _compare(got, expected, judge, case, tried=tried, what="your mask", hints=hints,
                 regions=_pair_regions(T, S, tgt_real, src_real, causal=False), index_names=" (batch, head, query, key)")
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
            negated = got.shape == mask.shape and torch.equal(got, ~mask)
            fail("returned a bool mask, not the additive form", tried=shown, got=f"a bool tensor {tuple(got.shape)}",
                 expected=f"a {name} tensor: 0 where the mask is True, -inf where it is False",
                 cause=("you returned ~mask, the negated mask: still" if negated else "you returned") + " True/False "
                 "values, not the numbers 0 and -inf that are added to the scores",
                 fix="start from zeros in the dtype asked for and fill the blocked places with float('-inf')")
        if got.dtype != want:
            fail(f"dtype {kind}, not {name}", tried=shown, got=f"a {kind} tensor", expected=f"dtype {name}, the one asked for",
                 cause="the dtype argument is ignored (torch.zeros and torch.where default to float32)" if kind == "float32"
                 else "", fix="create the result with dtype=dtype, or convert it with .to(dtype)")
        right = torch.zeros(mask.shape, dtype=want).masked_fill(~mask, float("-inf"))
        if mask.dim() >= 2 and got.shape == right.mT.shape != mask.shape and torch.equal(got, right.mT):
            fail("last two axes swapped", tried=shown, got=f"a tensor of shape {tuple(got.shape)}: the right additive "
                 "mask, transposed", expected=f"the mask's shape {tuple(mask.shape)}", cause="your result is the right "
                 "additive mask with its last two axes swapped (a transpose, .T or .mT)", fix="leave the axes as the "
                 "mask has them: torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, float('-inf'))")
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
            kept = g[mask].to(torch.float64)
            c = fmt(float(kept[0])) if bool((kept == kept[0]).all()) else ""  # one value in every kept place
            fail("kept positions are not 0", tried=shown, got=f"{fmt(float(kept[kept != 0][0]))} where the mask is True",
                 expected="0 where the mask is True", cause=f"every kept position of your result holds {c}, so it "
                 f"adds {c} to every kept score (a start from torch.ones or torch.full rather than torch.zeros does "
                 "that)" if c else "", fix="start from zeros: torch.zeros(mask.shape, dtype=dtype)")
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


def _softmax_mistakes(s: torch.Tensor, mask: torch.Tensor) -> list[tuple]:
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
        _row(*nan_rows, plain, "nan"),
        _row(*uniform, lambda: torch.softmax(s.masked_fill(~full, -1e9), -1), "uniform9"),
        _row(*uniform, lambda: torch.softmax(s.masked_fill(~full, torch.finfo(s.dtype).min), -1), "uniformmin"),
        _row("fully masked rows not masked", "in a row with no allowed key you kept the softmax of the unmasked scores",
             "give such rows all-zero weights", torch.where(empty, soft, plain), "unmasked-rows"),
        _row("softmax over axis -2 (the queries)", "you normalised each column instead of each row",
             "softmax over the last axis, dim=-1", lambda: torch.nan_to_num(torch.softmax(s.masked_fill(~full, inf), -2)),
             "dim-2"),
        _row(_POLARITY[0], _POLARITY[1], "fill the scores where the mask is False: scores.masked_fill(~mask, "
             "float('-inf'))", lambda: torch.nan_to_num(torch.softmax(s.masked_fill(full, inf), -1)), "polarity"),
        _row("mask ignored", "you did not use the mask, so blocked keys get weight", "fill the blocked scores with "
             "float('-inf') before the softmax", soft, "ignored"),
        _row("bool mask added to the scores", "you added the mask to the scores: True counts as +1, which shifts the "
             "allowed scores a little and blocks nothing", "fill the blocked scores with float('-inf'): "
             "scores.masked_fill(~mask, float('-inf'))", lambda: torch.softmax(s + full.to(s.dtype), -1), "plus"),
        _row("mask applied after the softmax", "you zeroed the blocked weights after a softmax over all keys, so "
             "rows no longer sum to 1", "fill the blocked *scores* with float('-inf') before the softmax",
             soft * full, "after"),
        _row("mask applied after the softmax, then renormalised", "you zeroed the blocked weights after a softmax "
             "over all keys and divided by the row sum: 0/0 = NaN in fully masked rows and where the allowed weights "
             "underflow", "fill the blocked scores with float('-inf') before the softmax",
             (soft * full) / (soft * full).sum(-1, keepdim=True), "renorm"),
        _row("mask applied after the softmax, then renormalised", "you zeroed the blocked weights after a softmax "
             "over all keys and divided by the row sum: where the allowed weights underflow, that is 0/0",
             "fill the blocked scores with float('-inf') before the softmax",
             torch.nan_to_num((soft * full) / (soft * full).sum(-1, keepdim=True)), "renorm-nan0"),
        _row("rows with any blocked key set to 0", "you zeroed every row that has a blocked key (all instead of any)",
             "zero only the rows with no allowed key: ~mask.any(dim=-1, keepdim=True)",
             plain.masked_fill(~full.all(-1, keepdim=True), 0.0), "all"),
        _row("log-softmax instead of softmax", "you returned log-weights (log_softmax), not weights",
             "use torch.softmax", lambda: torch.log_softmax(s.masked_fill(~full, inf).masked_fill(empty, 0.0), -1)
              .masked_fill(empty, 0.0), "log"),
        _row("scores returned as weights", "you returned the masked scores, not their softmax",
             "return torch.softmax(masked scores, dim=-1), with fully masked rows set to 0",
             lambda: s.masked_fill(~full, inf).masked_fill(empty, 0.0), "scores"),
        _row("softmax without subtracting the maximum", "you exponentiated the raw scores: e^30000 overflows to "
             "inf, and inf/inf (or inf × 0) is NaN", "subtract each row's maximum over the allowed keys before exp, or "
             "use torch.softmax", lambda: _naive(s, full), "naive"),
        _row("softmax without subtracting the maximum", "you exponentiated the raw scores: e^30000 overflows to "
             "inf, and inf/inf (or inf × 0) is NaN, which your code then set to 0", "subtract each row's maximum "
             "over the allowed keys before exp, or use torch.softmax", lambda: torch.nan_to_num(_naive(s, full)),
             "naive-nan0"),
        _row("fully masked rows filled with 1", "a row with no allowed key must get weights 0, not 1",
             "use 0 for such rows", torch.where(empty, torch.ones_like(plain), plain), "ones"),
    ]
    empty_q = ~mask.any(-2, keepdim=True)  # blocked columns: "fully masked rows" looked for over the queries
    out.append(_row("fully masked rows looked for over axis -2", "you looked for the rows with no allowed key with "
                    "mask.any(dim=-2), which looks down each column (over the queries), not along each row",
                    "~mask.any(dim=-1, keepdim=True): one True/False per query row",
                    lambda: torch.softmax(s.masked_fill(~mask, inf).masked_fill(empty_q, 0.0), -1)
                    .masked_fill(empty_q, 0.0),
                    "any-2"))
    for low in (torch.float32, torch.float16):  # the right weights, computed in a narrower dtype than the scores'
        name = str(low).replace("torch.", "")
        out.append(_row(f"computed in {name}, not float64", f"part of your computation ran in {name} (.float(), "
                        f".half() or dtype=torch.{name}), which keeps too few significant digits for these inputs",
                        "keep the scores' dtype from start to end (a wider dtype inside is fine, a narrower one is not)",
                        lambda low=low: _softmax_oracle(_SoftCase("", s.to(low), mask, 0)).to(s.dtype)
                        if s.dtype == torch.float64 else None, f"in-{name}"))
    weak = []
    for fill in (-1e4, -1e3, -1e5):
        weak.append(_row("a fill value too weak for these scores", "you filled blocked scores with a finite negative "
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
    cases = _softmax_cases()
    suspects = Suspects(_table(_softmax_mistakes, [(c.scores, c.mask) for c in cases], lambda s, m: tuple(s.shape)))
    every = [(c.scores, c.mask) for c in cases]
    for case, args in zip(cases, every):
        s, mask = args
        tried = f"masked_softmax(scores {tuple(s.shape)} {str(s.dtype).replace('torch.', '')}, mask {tuple(mask.shape)}) on {case.name}"
        plain = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
        cause = ("you found the fully masked rows with mask.any(dim=-1) without keepdim=True: its shape (…, n_q) lines "
                 "up with the keys' axis of the weights, not with the rows")
        fix = "keep the axis: ~mask.any(dim=-1, keepdim=True) has shape (…, n_q, 1)"
        constructs = [(cause, fix, attempt, lambda: _confirm_no_keepdim(fn)) for attempt in (
            lambda: plain.masked_fill(~mask.any(-1), 0.0), lambda: torch.where(mask.any(-1), plain, 0.0),
            lambda: plain.masked_fill(~torch.broadcast_to(mask, s.shape).any(-1), 0.0))]
        raw, changed = _call(fn, args, {}, tried, f"weights of shape {tuple(s.shape)}", constructs, ("scores", "mask"))
        if isinstance(raw, np.ndarray):
            fail("returned a NumPy array, not a tensor", tried=tried, got=f"a NumPy array {raw.shape} {raw.dtype}",
                 expected="a torch tensor of weights, as the docstring says",
                 cause="part of your computation went through NumPy (.numpy(), np.exp…), which returns an array",
                 fix="stay with torch operations: masked_fill, torch.softmax, torch.where")
        got = as_tensor(raw, tried=tried, what="your function")
        if got.dtype == torch.bool:
            rows = torch.equal(got, ~torch.broadcast_to(mask, s.shape).any(-1, keepdim=True))
            fail("returned a bool tensor, not weights", tried=tried, got=f"a bool tensor of shape {tuple(got.shape)}",
                 expected=f"float weights of shape {tuple(s.shape)}", cause="your function returned True/False values"
                 + (": exactly the marks of the fully masked rows (~mask.any(dim=-1, keepdim=True)), a helper returned "
                    "in place of the weights" if rows else ", not softmax weights"),
                 fix="return the weights: the softmax of the masked scores, with fully masked rows set to 0")
        try:
            suspects.expect(got, _softmax_oracle(case), args, tried=tried, again=lambda *a: as_tensor(fn(*a), tried=""),
                            distinguish=every, what="your weights", atol=case.atol)
        except Failure as failure:
            if not failure.diagnosis.cause:
                _softmax_structure(got, case, tried)
            raise
        if changed:
            names = " and ".join(changed)
            fail(f"changed {names} in place", tried=tried, got=f"right weights, but after the call {names} held "
                 "different values than before", expected="the arguments left as they were",
                 cause=f"an in-place operation on {names} (a method ending in _ such as masked_fill_, or an assignment "
                       "into it) changes the caller's tensor too",
                 fix="compute new tensors: scores.masked_fill(~mask, float('-inf')), without the trailing _")
    return ("zero weights on blocked keys and in fully masked rows, rows of allowed keys summing to 1 "
            f"(masks of {len({tuple(c.mask.shape) for c in cases})} shapes, left padding, large scores, float16/32/64)")


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
