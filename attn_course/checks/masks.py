"""Checks for notebook 06: causal, padding, decoder, cross-attention and additive masks, and the masked softmax.

A bool mask is True where a query may attend to a key. A wrong mask is named by one :class:`~.kit.Suspects` per check
run over the check's table of known mistakes, else by the region that holds its wrong pairs ("later keys", "<pad>
keys"…). Oracles: ``torch.tril`` and comparisons of the ids; ``masked_fill`` (additive);
``F.scaled_dot_product_attention`` (masked softmax).
"""

from __future__ import annotations

import functools
import math
from collections import namedtuple
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from . import kit
from .compare import Failure, same
from .core import Learner, LearnerRaised, as_tensor, check, fail, fmt
from .kit import Known, Suspects

__all__ = ["check_causal_mask", "check_padding_mask_from_lengths", "check_padding_mask_from_ids", "check_decoder_mask",
           "check_cross_attention_mask", "check_additive_mask", "check_masked_softmax"]

_BOOL = "a bool tensor (True = may attend)"
_MAKE_BOOL = "make it bool: .bool(), dtype=torch.bool, or a comparison"
_POLARITY = ("mask polarity inverted", "your mask is True where attention is blocked; in this course True means "
             "'may attend' (the convention of F.scaled_dot_product_attention; nn.MultiheadAttention uses the opposite)")
_PAD_ID = ("pad_id ignored (compared with 0)", "you compared the ids with 0, not with the pad_id argument")
_KEY_PADDING = "(src_ids != pad_id)[:, None, None, :]"
_COUNTED = ("padding assumed at the end", "you marked as many positions from the start as there are real tokens; with "
            "left padding the real tokens are elsewhere")


# ============================================================================ answers as bool masks
def _as_bool_mask(value: Any, *, tried: str, what: str = "your mask") -> torch.Tensor:
    """The answer as a bool tensor, or a diagnosis of what it is instead (an array, a number, floats, integers)."""
    if isinstance(value, (int, float, np.number)) and not isinstance(value, (bool, np.bool_)):
        fail(f"returned the number {value}, not a mask", tried=tried, got=f"the Python number {value!r}",
             expected=_BOOL, cause="your function returns a plain number where the mask belongs",
             fix="return the mask tensor you built (print(type(mask), mask.shape) before returning)")
    t = kit.tensor_answer(value, tried=tried)
    kind = str(t.dtype).replace("torch.", "")
    if t.dtype == torch.bool:
        return t
    if not t.is_floating_point():
        fail(f"an integer mask ({kind}), not a bool mask", tried=tried, got=f"{what} has dtype {kind}", expected=_BOOL,
             cause="masked_fill and ~ need a bool mask: on integers ~ flips every bit (~1 = -2)", fix=_MAKE_BOOL)
    if torch.isnan(t).any():
        fail("NaN in the mask", tried=tried, got=f"{what} holds NaN", expected=_BOOL,
             cause="0 × (-inf) is NaN: (~mask) * float('-inf') has NaN where it should hold 0",
             fix="return a bool mask; an additive one needs masked_fill or torch.where")
    values = sorted({float(v) for v in t.flatten()[:1000].tolist()})
    if set(values) <= {0.0, 1.0}:
        fail(f"a float mask of 0s and 1s ({kind}), not a bool mask", tried=tried,
             got=f"{what} is {kind} with values {values}", expected=_BOOL, fix=f"{_MAKE_BOOL} such as j <= i",
             cause="~, & and masked_fill need bool masks (torch.ones and torch.tril make floats unless given "
             "dtype=torch.bool)")
    if 0.0 in values and values[-1] <= 0:  # 0 to keep, a negative number to block
        fail("an additive float mask, not a bool mask", tried=tried, got=f"{what} is {kind}: 0 for kept positions, "
             f"{fmt(values[0]) if values[0] < 0 else '-inf'} for blocked ones", expected=_BOOL,
             cause="you returned the additive form (exercise 6's additive_mask); this docstring asks for the bool form",
             fix="return the comparison itself (a bool tensor), e.g. torch.ones(n, n, dtype=torch.bool).tril()")
    fail(f"a {kind} mask with values {values[:4]}{'…' if len(values) > 4 else ''}", tried=tried,
         got=f"{what} is {kind}", expected=_BOOL, fix="build it from comparisons (==, !=, <, <=) and torch.tril")


def _broadcast(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor | None:
    try:
        return torch.broadcast_to(t, shape)
    except RuntimeError:
        return None


def _table(rows: Callable[..., list[tuple]], cases: list[tuple], shape_of: Callable[..., tuple]) -> list[Known]:
    """Known mistakes from ``rows(*case)``: (key, summary, cause, fix, mask) tuples, the mask being what the mistake
    gives on that case (a tensor, a function making it, or None where it cannot happen), broadcast to
    ``shape_of(*case)``. Keys and texts do not depend on the case; each case's rows are built once."""
    memo: dict[tuple, tuple] = {}

    def mask(key: str, *case: Any) -> torch.Tensor | None:
        if (ids := tuple(map(id, case))) not in memo:  # the case is kept with its rows, so its ids stay its own
            memo[ids] = (case, {row[0]: row[4] for row in rows(*case)})
        value = memo[ids][1].get(key)
        value = value() if callable(value) else value
        return None if value is None else _broadcast(value, shape_of(*case))

    return [Known(key, summary, cause, fix, lambda *case, key=key: mask(key, *case))
            for key, summary, cause, fix, _ in rows(*cases[0])]


class _Judge:
    """One check run: a :class:`~.kit.Suspects` over the table ``rows``, and the learner's ``fn`` (called as
    ``call(fn, *case)`` where given) to tell two suspects apart on the other ``cases``."""

    def __init__(self, fn: Learner, rows: Callable[..., list[tuple]], cases: list[tuple],
                 shape_of: Callable[..., tuple], call: Callable[..., Any] | None = None):
        self.suspects, self.cases = Suspects(_table(rows, cases, shape_of)), cases
        self.again = lambda *case: torch.broadcast_to(_as_bool_mask(call(fn, *case) if call else fn(*case), tried=""),
                                                      shape_of(*case))

    def found(self, got: torch.Tensor, case: tuple) -> list[Known]:
        """The known mistakes (not ruled out, told apart on other cases where they can be) whose mask is ``got``."""
        found = self.suspects.suspects(got, case)
        found = self.suspects.narrow(found, self.again, self.cases) if len(found) > 1 else found
        return list({m.summary: m for m in found}.values())


def _compare(got: torch.Tensor, expected: torch.Tensor, judge: _Judge, case: tuple, *, tried: str,
             regions: list[tuple[str, torch.Tensor]], hints: list[tuple] = (), index_names: str = "",
             unit: str = "pair", what: str = "your mask") -> None:
    """Fail unless ``got`` equals ``expected``, shape included, naming a known mistake, else a wrong shape, else the
    ``regions`` (name, where) that hold the wrong pairs. A right answer rules out the mistakes whose mask differs."""
    target, shape = tuple(expected.shape), tuple(got.shape)
    g = _broadcast(got, target)
    if shape == target and torch.equal(got, expected):
        judge.suspects.passed(case, expected)
        return
    found = judge.found(g, case) if g is not None and not torch.equal(g, expected) else []
    if shape != target and len(found) != 1:  # one known mistake in the values says more than the shape
        _wrong_shape(shape, g, expected, tried=tried, what=what, hints=hints)  # returns if g is not None
    wrong, reshape = g != expected, f"; and return shape {target}" if shape != target else ""
    first = tuple(int(i) for i in wrong.nonzero()[0])  # the first wrong position
    if found:
        fail(" or ".join(m.summary for m in found), tried=tried, got=f"{what} of shape {shape}; broadcast to "
             f"{target}, it is exactly this mistake's mask" if reshape else f"{what}: differs at {int(wrong.sum())} "
             f"of {wrong.numel()} positions (the first at index {first}{index_names})",
             expected="the mask the docstring describes" + (f", of shape {target}" if reshape else ""),
             cause=("" if len(found) == 1 else "on this input two mistakes give the same mask: ")
             + " — or ".join(m.cause for m in found), fix="; otherwise ".join(m.fix for m in found) + reshape)
    if torch.equal(g, ~expected):
        fail(_POLARITY[0], tried=tried, got=f"{what} is True exactly where it should be False",
             expected="True = may attend", cause=_POLARITY[1], fix="negate it (~mask), or flip the comparison")
    extra, missing = g & ~expected, ~g & expected
    parts, summary = [], []
    for pairs, does, verb in ((extra, "allows {} it must block", "allowed"),
                              (missing, "blocks {} it must allow", "blocked")):
        if pairs.any():
            count = int(pairs.sum())
            # the regions that hold every wrong pair, and whether each holds nothing else: the first one is named
            held = [(name, not (where & ~pairs).any()) for name, where in regions if not (pairs & ~where).any()]
            parts.append(does.format(f"{count} {unit}{'s' if count > 1 else ''}")
                         + (f" ({'exactly' if held[0][1] else 'all of them'} {held[0][0]})" if held else ""))
            summary += [f"{held[0][0]} {verb}"] if held else []
    rows = missing.any(-1)  # (..., n_q): rows with an allowed pair blocked
    if not summary and not extra.any() and g.dim() >= 2 and not (g & rows[..., None]).any():  # blocked entirely
        where = ", ".join(str(tuple(int(i) for i in r)) for r in rows.nonzero()[:6])
        summary = ["whole query rows blocked"]
        parts.append(f"every key of the rows {where}{'…' if int(rows.sum()) > 6 else ''} is blocked")
    summary = "; ".join(summary) or f"wrong at {int(wrong.sum())} positions"
    fail(f"wrong shape, and {summary}" if reshape else summary, tried=tried, got=(f"{what} has shape {shape}, not "
         f"{target}; broadcast to {target}, it " if reshape else f"{what} ") + f"{' and '.join(parts)}; the first at "
         f"index {first}{index_names}: {bool(g[first])} instead of {bool(expected[first])}",
         expected="the mask the docstring describes",
         fix="print your mask next to the one the docstring describes on this input (.int() shows it as 0/1)")


def _wrong_shape(shape: tuple, g: torch.Tensor | None, expected: torch.Tensor, *, tried: str, what: str,
                 hints: list[tuple]) -> None:
    """Fail on a mask of the wrong ``shape`` (``g``: it broadcast to the right one, or None), naming a shape of
    ``hints`` (shape, summary, cause, fix), size-1 axes, or a mask that only broadcasts; return only for a mask that
    broadcasts with wrong values."""
    want = tuple(expected.shape)
    right = g is not None and torch.equal(g, expected)
    for hint_shape, summary, cause, fix in hints:
        if shape == hint_shape != want:
            fail(summary, tried=tried, got=f"{what} of shape {shape}", expected=f"shape {want}", cause=cause, fix=fix)
    if [s for s in shape if s != 1] == [s for s in want if s != 1]:  # only axes of size 1 differ
        more, fewer = len(shape) > len(want), len(shape) < len(want)
        fail(f"shape {shape}, not {want}: " + ("size-1 axes added" if more else "size-1 axes missing" if fewer else
                                               "the size-1 axis in the wrong place"), tried=tried,
             got=f"{what} of shape {shape}" + (" (its values are right)" if right else ""),
             expected=f"shape {want}, as the docstring says", fix=f"return exactly shape {want}",
             cause="a [None] or unsqueeze too many" if more else "a [None] or unsqueeze too few" if fewer else
             "in (B, 1, n_q, n_k) the size-1 heads axis comes second: mask[:, None], not mask[None]")
    if right:
        fail(f"shape {shape}, not {want}", tried=tried, got=f"{what} of shape {shape}: right once broadcast",
             expected=f"shape {want}", cause="your mask only broadcasts to the asked-for shape",
             fix=f"expand it: mask.expand({', '.join(map(str, want))})")
    if g is None:
        fail(f"shape {shape} does not fit {want}", tried=tried, got=f"{what} of shape {shape}",
             expected=f"shape {want}, as the docstring says", cause=f"your mask has an axis of size 0 (axis "
             f"{shape.index(0)}): a 0 where a size belongs (in expand, view, zeros or a slice)"
             if 0 in shape and 0 not in want else "", fix="print(mask.shape) after each step")


_PATTERNS = [
    *[("RuntimeError", f"value cannot be converted to type .*{kind} without overflow",
       f"you filled with a finite number too large for the tensor's dtype: {where}",
       "fill with float('-inf'), which every floating-point dtype holds")
      for kind, where in (("Half", "float16 holds at most 65504 in magnitude (not -1e9, nor float32's finfo.min)"),
                          ("BFloat16", "bfloat16 holds at most about 3.39·10³⁸, less than float32's finfo.min"),
                          ("", "this dtype cannot store it"))],
    ("RuntimeError", "Boolean value of Tensor", "an `if` or `and`/`or` asked a whole tensor for one truth value",
     "combine masks with & and |, and test for None with `is not None`"),
    *[(kind, pattern, "a float mask where a bool one is needed: ~ and masked_fill work on bool masks only", _MAKE_BOOL)
      for kind, pattern in (("TypeError", r"\(operator.invert\) is only implemented"),
                            ("RuntimeError", "only supports boolean masks"))],
]


def _call(fn: Callable, args: tuple, tried: str, expected: str, kwargs: dict | None = None,
          constructs: list = ()) -> Any:
    """The learner's result. A construct (cause, fix, attempt[, confirm]) explains an exception whose message its
    attempt reproduces, where it has ``confirm`` (a broadcasting message is shared by many mistakes) only when
    another call of the learner's code confirms it."""
    confirmed = [(c[0], c[1], (lambda c=c: c[3]() and c[2]()) if len(c) > 3 else c[2]) for c in constructs]
    return kit.call_explained(lambda *a: fn(*a, **(kwargs or {})), *args, tried=tried, expected=expected,
                              constructs=confirmed, patterns=_PATTERNS)


def _mask_of(fn: Learner, args: tuple, tried: str, shape: tuple, kwargs: dict | None = None,
             constructs: list = ()) -> torch.Tensor:
    return _as_bool_mask(_call(fn, args, tried, f"a {shape} bool tensor", kwargs, constructs), tried=tried)


# ============================================================================ causal
_TRIANGLES = [  # (key, summary, cause, fix, the causal part it makes of a square of ones): causal and decoder masks
    ("triu", "upper triangle instead of lower", "torch.triu keeps j ≥ i: each query sees itself and the future",
     "keep j ≤ i: torch.tril", lambda ones: ones.triu()),
    ("tril-1", "diagonal excluded (off by one)", "a token must attend to itself; without the diagonal the first row "
     "has no key at all", "torch.tril with diagonal=0 (the default)", lambda ones: ones.tril(-1)),
    ("tril+1", "one diagonal too many (off by one)", "query i also sees key i + 1, the next token",
     "torch.tril with diagonal=0 (the default)", lambda ones: ones.tril(1)),
]


def _causal_mistakes(n: int) -> list[tuple]:
    ones, tril = torch.ones(n, n, dtype=torch.bool), "keep j ≤ i: torch.tril"
    return [*[(key, summary, cause, fix, part(ones)) for key, summary, cause, fix, part in _TRIANGLES],
            ("polarity", _POLARITY[0], _POLARITY[1] + "; True marks the future here", tril, ones.triu(1)),
            ("ones", "nothing is masked", "every query sees every key", tril, ones),
            ("eye", "only the diagonal is allowed", "each token sees only itself (torch.eye)", tril,
             torch.eye(n, dtype=torch.bool)),
            ("zeros", "everything is masked", "no query may attend to any key", tril, ~ones),
            ("flip", "anti-diagonal triangle (flipped)", "you flipped the matrix left to right",
             tril + ", without flipping", ones.tril().flip(-1))]


@check("causal_mask", expects="a function causal_mask(n) returning an (n, n) bool tensor")
def check_causal_mask(fn: Learner) -> str:
    sizes = [5, 8, 1, 2]
    judge = _Judge(fn, _causal_mistakes, [(n,) for n in sizes], lambda n: (n, n))
    shapes: dict[tuple, int] = {}  # the shapes returned so far, and for which n
    for case in judge.cases:
        n, tried = case[0], f"causal_mask({case[0]})"
        got = _mask_of(fn, case, tried, (n, n))
        shape = tuple(got.shape)
        if shape[-2:] != (n, n) and shape not in shapes:  # one more call tells a fixed size from a wrong formula
            again = _call(fn, (7,), "causal_mask(7)", "a (7, 7) bool tensor")  # 7: a size the cases do not use
            shapes[tuple(as_tensor(again, tried="causal_mask(7)", what="your function").shape)] = 7
        if shape in shapes and shape[-2:] != (n, n):
            fail("n is ignored", tried=tried, got=f"a mask of shape {shape}, as for n = {shapes[shape]}",
                 expected=f"shape ({n}, {n})", cause="your size is written into the code, or an outer variable",
                 fix="build the mask from the argument n")
        shapes[shape] = n
        hints = [((n + d, n + d), f"size n {sign} 1 = {n + d}, not n", f"one row and one column too {word}",
                  "make it n × n: torch.ones(n, n, dtype=torch.bool)")
                 for d, sign, word in ((1, "+", "many"), (-1, "-", "few")) if n > 1]
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        _compare(got, j <= i, judge, case, tried=tried, hints=hints, index_names=" (query, key)",
                 regions=[("later keys (j > i)", j > i), ("the diagonal (j = i)", j == i),
                          ("earlier keys (j < i)", j < i), ("keys up to the diagonal (j ≤ i)", j <= i)])
    return f"lower-triangular with the diagonal, for n in {sizes}"


# ============================================================================ padding
def _padding_regions(real: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    last = real & ~torch.cat([real[:, 1:], torch.zeros(len(real), 1, dtype=torch.bool)], 1)
    return [("<pad> positions", ~real), ("real tokens", real),
            ("the first position of a sequence", (torch.arange(real.shape[1]) == 0).expand_as(real)),
            ("the last real token of a sequence", last)]


def _lengths_mistakes(lengths: torch.Tensor, max_len: int | None) -> list[tuple]:
    S = int(lengths.max()) if max_len is None else max_len
    positions, column = torch.arange(S)[None, :], lengths[:, None].long()
    right = "torch.arange(max_len) < lengths[:, None]"
    polarity = (_POLARITY[0], _POLARITY[1] + "; real tokens should be True, padding False",
                f"flip the comparison: {right}")
    return [("le", "off by one (<= instead of <)", "the real tokens are positions 0 … length−1",
             f"compare with <: {right}", positions <= column),
            ("lt-1", "last real token marked as padding", "you compared with length − 1",
             f"compare with the length itself: {right}", positions < column - 1),
            ("polarity", *polarity, positions >= column), ("polarity+1", *polarity, positions > column),
            ("left", "padding on the left", "you marked the last `length` positions as real; the course pads on the "
             "right", right, positions >= S - column)]


@check("padding_mask_from_lengths",
       expects="a function padding_mask_from_lengths(lengths, max_len=None) returning a (B, max_len) bool tensor")
def check_padding_mask_from_lengths(fn: Learner) -> str:
    # Defaults: [2, 5, 3] has a largest length (5), a first length (2) and a batch size (3) that all differ.
    cases = [([3, 1, 4], 6, torch.int64), ([2, 5, 3], None, torch.int64), ([0, 2], 3, torch.int64),
             ([4, 2, 1], None, torch.int32), ([1], 1, torch.int64), ([3, 3], None, torch.int64),
             ([1, 2], 5, torch.int64)]
    judge = _Judge(fn, _lengths_mistakes, [(torch.tensor(values, dtype=dtype), n) for values, n, dtype in cases],
                   lambda lengths, max_len: (len(lengths), max_len or int(lengths.max())),
                   lambda f, lengths, max_len: f(lengths) if max_len is None else f(lengths, max_len=max_len))
    for case in judge.cases:
        (lengths, max_len), values = case, case[0].tolist()
        B, longest = len(values), max(values)
        S = longest if max_len is None else max_len
        tried = f"padding_mask_from_lengths(torch.tensor({values}){'' if max_len is None else f', max_len={max_len}'})"
        got = _mask_of(fn, (lengths,), tried, (B, S), None if max_len is None else {"max_len": max_len})
        if got.dim() == 2 and got.shape[0] == B and got.shape[1] != S:  # the same width on other arguments too?
            width, other = got.shape[1], 9 if got.shape[1] != 9 else 11
            shown = f"padding_mask_from_lengths(torch.tensor([1, 2]), max_len={other})"
            again = as_tensor(_call(fn, (torch.tensor([1, 2]),), shown, f"a (2, {other}) bool tensor",
                                    {"max_len": other}), tried=shown, what="your function")
            if again.dim() == 2 and again.shape[1] == width:
                fail(f"width fixed at {width}", tried=f"{tried}, then {shown}", got=f"{width} column"
                     f"{'s' if width != 1 else ''} both times", expected="max_len columns when max_len is given, else "
                     "the largest length", cause="your width is written into the code, or an outer variable",
                     fix="build the mask from the arguments: torch.arange(max_len) < lengths[:, None]")
        hints = [((S, B), "transposed: one row per position", "you put the positions on the rows",
                  f"return (B, max_len) = {(B, S)}: one row per sequence")]
        if max_len is not None:  # widths that ignore the max_len given
            hints += [((B, longest), "max_len ignored", f"your mask has max(lengths) = {longest} columns, not "
                       f"max_len = {S}", "use max_len when it is given"),
                      ((B, S + 1), "one column more than max_len", f"your mask has {S + 1} columns, not max_len = {S}",
                       "torch.arange(max_len): exactly max_len columns")]
        else:  # widths that a wrong default gives (a hint of the right shape is never used)
            hints += [((B, width), "default max_len wrong", f"with max_len=None your mask has {why}, not the largest "
                       f"length {S}", "max_len = int(lengths.max()) when max_len is None") for width, why in (
                          (B, f"B = {B} columns (the number of sequences)"),
                          (values[0], f"lengths[0] = {values[0]} columns (the lengths are not sorted)"),
                          (S + 1, f"{S + 1} columns, one more than the largest length"),
                          (S - 1, f"{S - 1} columns, one fewer than the largest length"))]
        expected = torch.arange(S)[None, :] < lengths[:, None].long()  # (B, S)
        _compare(got, expected, judge, case, tried=tried, hints=hints, regions=_padding_regions(expected),
                 index_names=" (sequence, position)", unit="position")
    return (f"correct on {len(cases)} batches (a zero length, no padding, one sequence, max_len given and "
            "default, int32 and int64 lengths)")


def _ids_mistakes(ids: torch.Tensor, pad_id: int) -> list[tuple]:
    real, every = ids != pad_id, "compare every id with pad_id: ids != pad_id"
    return [("zero", *_PAD_ID, "compare with the argument: ids != pad_id", ids != 0),
            ("positive", *_PAD_ID, "compare with the argument: ids != pad_id", ids > 0),
            ("polarity", _POLARITY[0], _POLARITY[1] + "; real tokens should be True, <pad> False", "ids != pad_id",
             ids == pad_id),
            ("count", *_COUNTED, every,
             torch.arange(ids.shape[1])[None, :] < real.sum(-1, keepdim=True)),
            ("cumprod", "padding assumed after the first <pad>", "you marked everything after the first <pad> as "
             "padding; with padding on the left the real tokens come after it", every,
             torch.cumprod(real.long(), -1).bool()),
            ("greater", "ids below pad_id blocked (ids > pad_id)", "you kept only the ids greater than pad_id; a real "
             "token may have a smaller id", every, ids > pad_id),
            ("zero-too", "id 0 treated as padding too", "you blocked id 0 as well as pad_id; here id 0 is a real "
             "token", "compare with the argument only: ids != pad_id", real & (ids != 0))]


@check("padding_mask_from_ids", expects="a function padding_mask_from_ids(ids, pad_id) returning a (B, S) bool tensor")
def check_padding_mask_from_ids(fn: Learner) -> str:
    cases = [(torch.tensor([[5, 7, 2, 0, 0], [4, 4, 9, 8, 1]]), 0),
             (torch.tensor([[6, 3, 3, 3], [0, 2, 3, 3], [3, 3, 3, 3]]), 3),  # pad id 3; a token with id 0 is real
             (torch.tensor([[1, 1, 5, 6, 2], [1, 7, 8, 9, 4]]), 1),  # left padding
             (torch.tensor([[9, 12, 9], [4, 9, 9]], dtype=torch.int32), 9),
             (torch.tensor([[0]]), 0)]  # one sequence of one <pad>
    judge = _Judge(fn, _ids_mistakes, cases, lambda ids, pad_id: tuple(ids.shape))
    for case in cases:
        (ids, pad_id), (B, S) = case, case[0].shape
        tried = f"padding_mask_from_ids(ids {(B, S)} {str(ids.dtype).replace('torch.', '')}, pad_id={pad_id})"
        hints = [((S, B), "transposed: one row per position", "you put the positions on the rows",
                  "return (B, S), one row per sequence"),
                 ((B, 1, 1, S), "shape (B, 1, 1, S), not (B, S)", "you added the heads and queries axes; this "
                  "function returns the plain (B, S) mask", "return ids != pad_id as it is; add axes where it is used")]
        _compare(_mask_of(fn, case, tried, (B, S)), ids != pad_id, judge, case, tried=tried, hints=hints,
                 regions=_padding_regions(ids != pad_id), index_names=" (sequence, position)", unit="position")
    return f"correct on {len(cases)} batches (pad ids 0, 1, 3 and 9; left and right padding; an all-<pad> sequence)"


# ============================================================================ decoder and cross
def _heads_hints(B: int, n_q: int, n_k: int) -> list[tuple]:
    """Shapes that get the heads axis wrong: missing, or bigger than 1."""
    return [((B, n_q, n_k), "no heads axis", "a (B, n_q, n_k) mask lines B up with the heads axis of scores "
             "(B, H, n_q, n_k)", "return (B, 1, n_q, n_k): mask[:, None]"),
            *[((B, h, n_q, n_k), f"a heads axis of size {h}, not 1", f"you repeated the mask for {h} heads; a heads "
               "axis of size 1 broadcasts over any number", "mask[:, None], without expand or repeat")
              for h in range(2, 17)]]


def _pair_regions(real_q: torch.Tensor, real_k: torch.Tensor, causal: bool) -> list[tuple[str, torch.Tensor]]:
    """Regions of a (B, 1, n_q, n_k) mask."""
    i, j = torch.arange(real_q.shape[1])[:, None], torch.arange(real_k.shape[1])[None, :]
    pad_keys, pad_queries = ~real_k[:, None, None, :], ~real_q[:, None, :, None]
    return [("<pad> keys", pad_keys), ("rows of <pad> queries", pad_queries),
            ("<pad> keys or rows of <pad> queries", pad_keys | pad_queries),
            *([("later keys (j > i)", j > i), ("the diagonal (j = i)", j == i),
               ("real earlier keys (j < i)", (j < i) & ~pad_keys)] if causal else [("real source keys", ~pad_keys)])]


def _decoder_mistakes(ids: torch.Tensor, pad_id: int) -> list[tuple]:
    B, T = ids.shape
    ones = torch.ones(T, T, dtype=torch.bool)
    causal, real = ones.tril(), ids != pad_id
    keys, queries = real[:, None, None, :], real[:, None, :, None]  # (B, 1, 1, T), (B, 1, T, 1)
    counted = torch.arange(T)[None, :] < real.sum(-1, keepdim=True)  # padding assumed at the end

    def padded(kept: torch.Tensor, q_too: bool = False) -> torch.Tensor:  # causal & kept keys (& kept query rows)
        return causal & kept[:, None, None, :] & (kept[:, None, :, None] if q_too else True)

    negate, key_part = "negate it: ~mask", "causal & (tgt_ids != pad_id)[:, None, None, :]"
    mistakes = []
    for q_too, tag in ((False, ""), (True, "+q")):  # each mistake alone, and with the <pad> query rows blocked too
        rows = queries if q_too else True
        mistakes += [
            ("queries" + tag, "padding blocked on the queries instead of the keys", "you blocked the rows of <pad> "
             "queries, not the <pad> keys, so real tokens still read <pad>",
             "block the columns of <pad> tokens: (tgt_ids != pad_id)[:, None, None, :]", causal & queries),
            ("nopad" + tag, "the padding part is missing", "you used the causal mask alone",
             f"AND it with the key-padding mask: {key_part}", None if q_too else causal),
            ("nocausal" + tag, "the causal part is missing", "you used the padding mask alone, so tokens see later "
             "tokens", "AND it with torch.tril(torch.ones(T, T, dtype=torch.bool))", keys & rows),
            ("or" + tag, "causal OR padding instead of AND", "you combined the two masks with | (OR)",
             "both must hold: combine with & (AND)", (causal | keys) & rows),
            *[(key + tag, summary, cause, fix, part(ones) & keys & rows)
              for key, summary, cause, fix, part in _TRIANGLES],
            ("zero" + tag, *_PAD_ID, "compare with the argument: tgt_ids != pad_id", padded(ids != 0, q_too)),
            ("count" + tag, *_COUNTED, "compare the ids: tgt_ids != pad_id", padded(counted, q_too))]
    return mistakes + [
        ("zeros", "everything is masked", "no query may attend to any key", key_part,
         torch.zeros(B, 1, T, T, dtype=torch.bool)),
        ("transposed", "transposed: rows and columns swapped", "your rows are the keys and your columns the queries",
         "mask[..., i, j] says whether query i may attend to key j",
         padded(real).transpose(-2, -1)),
        ("polarity", *_POLARITY, negate, ~padded(real)),
        ("pad-polarity", "padding part inverted (== pad_id)", "your padding part (tgt_ids == pad_id) allows only <pad> "
         "keys", f"compare with !=: {key_part}", padded(ids == pad_id)),
        ("polarity+q", *_POLARITY, negate, ~padded(real, True)),
        ("rows-too", "<pad> query rows blocked as well", "the docstring blocks only <pad> keys (a <pad> query's output "
         "is never used); blocking their rows too leaves them fully masked", f"drop the query part: {key_part}",
         padded(real, True))]


@check("decoder_mask", expects="a function decoder_mask(tgt_ids, pad_id) returning a (B, 1, T, T) bool tensor")
def check_decoder_mask(fn: Learner) -> str:
    cases = [(torch.tensor([[1, 5, 6, 2, 2], [2, 2, 1, 0, 7], [1, 3, 4, 6, 0]]), 2),  # right, left padding; a real 0
             (torch.tensor([[1, 5, 6, 7, 0, 0], [1, 8, 9, 4, 3, 2]]), 0),  # right padding
             (torch.tensor([[0, 0, 1, 5, 6], [0, 1, 7, 8, 9], [1, 4, 3, 2, 5]]), 0),  # left padding (generation)
             (torch.tensor([[0, 0, 0], [1, 5, 6]]), 0),  # a sequence of <pad> only
             (torch.tensor([[4]]), 0)]  # T = 1, B = 1
    judge = _Judge(fn, _decoder_mistakes, cases, lambda ids, pad: (ids.shape[0], 1, ids.shape[1], ids.shape[1]))
    for case in cases:
        (ids, pad_id), (B, T) = case, case[0].shape
        tried, keys = f"decoder_mask(tgt_ids {(B, T)}, pad_id={pad_id})", (ids != pad_id)[:, None, None, :]
        batch_for_time = ("your causal part is sized by tgt_ids.shape[0] (the batch size B), not by T = "
                          "tgt_ids.shape[1]", "causal = torch.ones(T, T, dtype=torch.bool).tril()",
                          lambda: torch.ones(B, B, dtype=torch.bool).tril() & keys)
        got = _mask_of(fn, case, tried, (B, 1, T, T), constructs=[batch_for_time])
        _compare(got, torch.ones(T, T, dtype=torch.bool).tril() & keys, judge, case, tried=tried,
                 hints=_heads_hints(B, T, T), index_names=" (batch, head, query, key)",
                 regions=_pair_regions(ids != pad_id, ids != pad_id, True))
    return "causal AND key padding (right and left padding, an all-<pad> sequence), with a heads axis of size 1"


def _cross_mistakes(tgt: torch.Tensor, src: torch.Tensor, pad_id: int) -> list[tuple]:
    (B, T), S = tgt.shape, src.shape[1]
    src_real, queries = src != pad_id, (tgt != pad_id)[:, None, :, None]
    expected = src_real[:, None, None, :].expand(B, 1, T, S)
    return [("tgt", "target padding blocked instead of source padding", "you blocked the rows of target <pad> "
             "queries, not the source <pad> keys", "block the source <pad> columns: " + _KEY_PADDING, queries),
            ("tgt-too", "target padding rows blocked as well", "in cross-attention only the source padding (the "
             "columns) is blocked", "drop the target part: " + _KEY_PADDING, expected & queries),
            ("causal", "a causal part in cross-attention", "the whole source is known before the decoder starts, so "
             "nothing is causal here", "block only the source padding",
             expected & torch.ones(T, S, dtype=torch.bool).tril()),
            ("polarity", _POLARITY[0], _POLARITY[1] + "; real source tokens should be True", "negate it: ~mask",
             ~expected),
            ("zero", *_PAD_ID, "compare with the argument: src_ids != pad_id", (src != 0)[:, None, None, :]),
            ("count", *_COUNTED, "compare the ids: src_ids != pad_id",
             (torch.arange(S)[None, :] < src_real.sum(-1, keepdim=True))[:, None, None, :]),
            ("ones", "nothing is masked", "every target query sees every source key, <pad> included",
             "block the source <pad> keys: " + _KEY_PADDING, torch.ones(B, 1, T, S, dtype=torch.bool))]


@check("cross_attention_mask",
       expects="a function cross_attention_mask(tgt_ids, src_ids, pad_id) returning a (B, 1, T, S) bool tensor")
def check_cross_attention_mask(fn: Learner) -> str:
    cases = [(torch.tensor([[1, 5, 6, 7, 0, 0], [1, 8, 9, 4, 3, 2]]), torch.tensor([[4, 9, 0, 0], [3, 5, 7, 2]]), 0),
             (torch.tensor([[1, 5, 2, 2, 2], [1, 3, 4, 6, 2], [1, 2, 2, 2, 2]]),
              torch.tensor([[7, 8, 9, 2, 2, 2, 2], [5, 6, 2, 2, 2, 2, 2], [4, 4, 4, 4, 4, 4, 4]]), 2),
             (torch.tensor([[1, 2, 3], [1, 0, 0]]), torch.tensor([[0, 0, 4, 5], [6, 7, 8, 9]]), 0),  # left-padded src
             (torch.tensor([[1, 4], [1, 5]]), torch.tensor([[0, 0, 0], [5, 6, 7]]), 0),  # a source of <pad> only
             (torch.tensor([[1]]), torch.tensor([[3]]), 0)]  # T = S = 1, B = 1
    judge = _Judge(fn, _cross_mistakes, cases, lambda tgt, src, pad: (len(tgt), 1, tgt.shape[1], src.shape[1]))
    for case in cases:
        (tgt, src, pad_id), (B, T), S = case, case[0].shape, case[1].shape[1]
        tried = f"cross_attention_mask(tgt_ids {(B, T)}, src_ids {(B, S)}, pad_id={pad_id})"
        swapped = ("rows and columns swapped", "rows are the target queries (T), columns the source keys (S)",
                   f"return (B, 1, T, S) = {(B, 1, T, S)}")
        hints = [((B, 1, S, T), *swapped), ((B, S, T), *swapped), *_heads_hints(B, T, S),
                 ((B, 1, 1, S), "not expanded to the T target rows", "you returned the (B, 1, 1, S) key-padding mask; "
                  "the docstring asks for one row per target query", "mask.expand(-1, 1, T, -1), T = tgt_ids.shape[1]"),
                 ((B, 1, S, S), "one row per source token", "the rows of cross-attention are the target queries, not "
                  "the source tokens", "take T from tgt_ids: T = tgt_ids.shape[1]"),
                 ((B, 1, B, S), "rows counted from tgt_ids.shape[0]", "tgt_ids.shape[0] is the batch size; the target "
                  "length is tgt_ids.shape[1]", "T = tgt_ids.shape[1] (or shape[-1])"),
                 *[((B, 1, rows, T), "columns are target tokens", "the keys of cross-attention are the source tokens",
                    "build the columns from src_ids: (src_ids != pad_id)") for rows in (T, 1)]]
        _compare(_mask_of(fn, case, tried, (B, 1, T, S)), (src != pad_id)[:, None, None, :].expand(B, 1, T, S), judge,
                 case, tried=tried, hints=hints, regions=_pair_regions(tgt != pad_id, src != pad_id, False),
                 index_names=" (batch, head, query, key)")
    return ("rows = target, columns = source, only source padding blocked (right and left padding, an all-<pad> "
            "source), with a heads axis of size 1")


# ============================================================================ additive
def _large_scores(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(2, 1, 3, 4) scores, kept ones near -2e4 and blocked ones up to +3e4, and the keep mask."""
    s = torch.tensor([[-20000.0, 30000.0, -20016.0, 0.0],
                      [30000.0, -20000.0, -5000.0, -20032.0],
                      [-20032.0, -20000.0, 30000.0, -5000.0]])
    keep = torch.tensor([[True, False, True, False], [False, True, False, True], [True, True, False, False]])
    return torch.stack([s, s.flip(-1)])[:, None].to(dtype), torch.stack([keep, keep.flip(-1)])[:, None]


@check("additive_mask", expects="a function additive_mask(mask, dtype=torch.float32) returning a float tensor")
def check_additive_mask(fn: Learner) -> str:
    keep, fill = _large_scores(torch.float32)[1], "masked_fill(~mask, float('-inf'))"
    for mask, dtype in [(keep, torch.float32), (keep, torch.float16), (keep, torch.float64), (keep, torch.bfloat16),
                        (keep, None), (torch.ones(4, 4, dtype=torch.bool).tril()[None, None], torch.float64),
                        (torch.tensor([True, False, True, True, False]), torch.float32),
                        (torch.zeros(2, 3, dtype=torch.bool), torch.float32),
                        (torch.ones(1, 1, dtype=torch.bool), torch.float16)]:
        want, shape = dtype or torch.float32, tuple(mask.shape)
        name, zeros = str(want).replace("torch.", ""), "torch.zeros(mask.shape, dtype=dtype)"
        shown = f"additive_mask(mask {shape}" + (f", dtype=torch.{name})" if dtype else ") with the default dtype")
        got = _call(fn, (mask,), shown, f"a {name} tensor of shape {shape}", {"dtype": dtype} if dtype else {})
        got = as_tensor(got, tried=shown, what="your function", expected=f"a {name} tensor")
        kind, right = str(got.dtype).replace("torch.", ""), torch.zeros(shape, dtype=want).masked_fill(~mask, -math.inf)
        if got.dtype == torch.bool:
            negated = got.shape == mask.shape and torch.equal(got, ~mask)
            fail("returned a bool mask, not the additive form", tried=shown, got=f"a bool tensor {tuple(got.shape)}",
                 expected=f"a {name} tensor: 0 where the mask is True, -inf where it is False",
                 cause=("you returned ~mask, the negated mask:" if negated else "you returned") + " True/False values, "
                 "not the numbers 0 and -inf added to the scores", fix=f"{zeros}.{fill}")
        if got.dtype != want:
            fail(f"dtype {kind}, not {name}", tried=shown, got=f"a {kind} tensor", expected=f"dtype {name}, as asked",
                 cause="the dtype argument is ignored (torch.zeros defaults to float32)" if kind == "float32" else "",
                 fix="create the result with dtype=dtype, or convert it with .to(dtype)")
        if mask.dim() >= 2 and got.shape == right.mT.shape != mask.shape and torch.equal(got, right.mT):
            fail("last two axes swapped", tried=shown, got=f"the right additive mask, transposed: {tuple(got.shape)}",
                 expected=f"the mask's shape {shape}", cause="a transpose (.T or .mT) swapped the last two axes",
                 fix=f"leave the axes as the mask has them: {zeros}.{fill}")
        if tuple(got.shape) != shape:
            fail(f"shape {tuple(got.shape)}, not the mask's {shape}", tried=shown, got=f"shape {tuple(got.shape)}",
                 expected=f"the mask's shape {shape}", fix=f"build the result with the mask's shape: {zeros}")
        if torch.isnan(got).any():
            fail("NaN in the additive mask", tried=shown, got=f"NaN in {int(torch.isnan(got).sum())} places",
                 expected="0 and -inf only", cause="0 × (-inf) is NaN, so (~mask) * float('-inf') does not work",
                 fix=f"{zeros}.{fill}, or torch.where")
        if mask.any() and not mask.all() and torch.equal(got, mask.to(want)):
            fail("1 for kept, 0 for blocked: blocks nothing", tried=shown, got="mask.to(dtype): 1 where True, 0 where "
                 "False", expected="0 where True, -inf where False", cause="adding 1 to the kept scores blocks nothing",
                 fix="use 0 for kept positions and float('-inf') for blocked ones")
        kept, blocked = got[mask].to(torch.float64), got[~mask].to(torch.float64)
        if (kept != 0).any():
            if (~mask).any() and (blocked == 0).all() and (kept < 0).all():
                fail(_POLARITY[0], tried=shown, got="-inf (or a large negative) where the mask is True, 0 where False",
                     expected="0 where True, -inf where False", cause="you filled where the mask is True",
                     fix=f"fill where it is False: {fill}")
            c = fmt(float(kept[0])) if bool((kept == kept[0]).all()) else ""  # one value in every kept place
            fail("kept positions are not 0", tried=shown,
                 got=f"{fmt(float(kept[kept != 0][0]))} where the mask is True", expected="0 where the mask is True",
                 cause=f"every kept position of your result holds {c}, which shifts every kept score (a start from "
                 "torch.ones or torch.full)" if c else "",
                 fix=f"start from zeros: {zeros}")
        if (blocked >= 0).any():
            fail("blocked positions not negative", tried=shown,
                 got=f"{fmt(float(blocked.max()))} where the mask is False", expected="-inf where the mask is False",
                 fix="fill where the mask is False with float('-inf')")
        if shape == (2, 1, 3, 4):  # the large scores: softmax(scores + mask) must give blocked keys no weight
            scores = _large_scores(want)[0]
            weights = torch.softmax((scores + got).to(torch.float32), dim=-1)
            leak = weights[~mask].max().item()
            if leak > 1e-6 or not torch.allclose(weights, torch.softmax(
                    scores.to(torch.float32).masked_fill(~mask, -math.inf), dim=-1), atol=1e-4):
                fail("a fill value too weak", tried=shown + " added to scores of ±3·10⁴",
                     got=f"blocked with {fmt(float(blocked.max()))}: blocked keys get weight up to {fmt(leak)}",
                     expected="weight 0 on every blocked key", fix="fill with float('-inf')",
                     cause="next to scores this large, blocked keys still win over a finite fill")
        if torch.isfinite(blocked).any():
            value = float(blocked[torch.isfinite(blocked)][0])
            named = f"torch.finfo({name}).min" if value == torch.finfo(want).min else fmt(value)
            fail("a finite fill instead of -inf", tried=shown, got=f"{named} where the mask is False",
                 expected="-inf where the mask is False, as the docstring says",
                 cause=f"{named} is finite: it gives uniform weights, not zeros, to a query with every key blocked, "
                       "and it blocks only while the scores stay smaller than it",
                 fix="fill with float('-inf'), which every floating-point dtype holds")
    return "0 / -inf in float16, bfloat16, float32 and float64 (and the default); no leak with scores of ±3·10⁴"


# ============================================================================ masked softmax
_SoftCase = namedtuple("_SoftCase", "name scores mask atol", defaults=(1e-7,))


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
        _SoftCase("scores (3, 4) with a (3, 4) mask, every row allowed a key", rand(3, 4), keep),
        _SoftCase("large scores (±3·10⁴) with a mask, every row allowed a key (the last row every key)", large,
                  torch.tensor([[True, False, True, False], [False, True, False, True], [True, True, True, True]])),
        _SoftCase("scores (3, 2, 4, 5) in float32 with a key-padding mask (3, 1, 1, 5): right, left and all-<pad>",
                  rand(3, 2, 4, 5, dtype=torch.float32), padding, 2e-6),
        _SoftCase("a decoder mask (2, 1, 4, 4) with left padding: rows 0 and 1 of the first sequence are empty",
                  rand(2, 3, 4, 4), decoder),
        _SoftCase("a 1-D mask (4,) that blocks every key", rand(2, 4), torch.zeros(4, dtype=torch.bool)),
        _SoftCase("one key (n_k = 1), allowed in one row and blocked in the other", rand(2, 1),
                  torch.tensor([[True], [False]])),
        _SoftCase("large scores (±3·10⁴) with a mask and an empty row", large, large_keep),
        _SoftCase("scores in float16 with a mask and an empty row", rand(3, 4, dtype=torch.float16), large_keep, 2e-3),
    ]


def _softmax_oracle(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Weights from F.scaled_dot_product_attention: with K = I·√n_k and V = I, its output is the weights."""
    n_k, eye = scores.shape[-1], torch.eye(scores.shape[-1], dtype=torch.float64)
    out = F.scaled_dot_product_attention(scores.to(torch.float64), eye * math.sqrt(n_k), eye.expand(
        *scores.shape[:-2], n_k, n_k), attn_mask=torch.broadcast_to(mask, scores.shape))
    return out.to(scores.dtype)


_NAIVE = ("softmax without subtracting the maximum", "you exponentiated the raw scores: e^30000 overflows to inf, and "
          "inf/inf (or inf × 0) is NaN", "subtract each row's maximum allowed score before exp, or use torch.softmax")
_EMPTY_ROWS = "~mask.any(dim=-1, keepdim=True)"  # the fully masked rows, one per query


def _softmax_mistakes(s: torch.Tensor, mask: torch.Tensor) -> list[tuple]:
    full = torch.broadcast_to(mask, s.shape)
    empty, empty_q = ~full.any(-1, keepdim=True), ~mask.any(-2, keepdim=True)  # empty_q: over the queries (axis -2)
    inf, before = -math.inf, "fill the blocked scores with float('-inf') before the softmax"
    plain, soft = torch.softmax(s.masked_fill(~full, inf), -1), torch.softmax(s, -1)
    after, exps = soft * full, torch.exp(s) * full
    uniform = ("uniform weights in fully masked rows", "a finite fill such as -1e9 gives a row with every key blocked "
               "uniform weights over exactly the keys it must not see", f"set such rows to 0 ({_EMPTY_ROWS})")
    renormalised = ("mask applied after the softmax, then renormalised", "you zeroed the blocked weights after the "
                    "softmax and divided by the row sum: ")
    return [
        ("nan", "NaN in fully masked rows", "softmax over a row that is -inf everywhere is 0/0 = NaN",
         f"set the rows with no allowed key ({_EMPTY_ROWS}) to 0 with torch.where or masked_fill", plain),
        ("uniform9", *uniform, lambda: torch.softmax(s.masked_fill(~full, -1e9), -1)),
        ("uniformmin", *uniform, lambda: torch.softmax(s.masked_fill(~full, torch.finfo(s.dtype).min), -1)),
        ("unmasked-rows", "fully masked rows not masked", "your rows with no allowed key hold the softmax of the "
         "unmasked scores", "give such rows all-zero weights", torch.where(empty, soft, plain)),
        ("dim-2", "softmax over axis -2 (the queries)", "you normalised each column instead of each row",
         "softmax over the last axis, dim=-1", lambda: torch.nan_to_num(torch.softmax(s.masked_fill(~full, inf), -2))),
        ("polarity", *_POLARITY, "fill the scores where the mask is False: scores.masked_fill(~mask, float('-inf'))",
         lambda: torch.nan_to_num(torch.softmax(s.masked_fill(full, inf), -1))),
        ("ignored", "mask ignored", "you did not use the mask, so blocked keys get weight", before, soft),
        ("plus", "bool mask added to the scores", "added to a score, True counts as +1: it blocks nothing",
         "scores.masked_fill(~mask, float('-inf'))", lambda: torch.softmax(s + full.to(s.dtype), -1)),
        ("after", "mask applied after the softmax", "you zeroed the blocked weights after the softmax, so rows no "
         "longer sum to 1", before, after),
        ("renorm", renormalised[0], renormalised[1] + "0/0 = NaN in fully masked rows and where the allowed weights "
         "underflow", before, after / after.sum(-1, keepdim=True)),
        ("renorm-nan0", renormalised[0], renormalised[1] + "where the allowed weights underflow, that is 0/0", before,
         torch.nan_to_num(after / after.sum(-1, keepdim=True))),
        ("all", "rows with any blocked key set to 0", "you zeroed every row with a blocked key (all instead of any)",
         f"zero only the rows with no allowed key: {_EMPTY_ROWS}", plain.masked_fill(~full.all(-1, keepdim=True), 0.0)),
        ("log", "log-softmax instead of softmax", "you returned log-weights (log_softmax), not weights",
         "use torch.softmax", lambda: torch.log_softmax(s.masked_fill(~full, inf).masked_fill(empty, 0.0), -1)
         .masked_fill(empty, 0.0)),
        ("scores", "scores returned as weights", "you returned the masked scores, not their softmax",
         "return their torch.softmax(…, dim=-1)", lambda: s.masked_fill(~full, inf).masked_fill(empty, 0.0)),
        ("naive", *_NAIVE, lambda: exps / exps.sum(-1, keepdim=True)),
        ("naive-nan0", _NAIVE[0], _NAIVE[1] + ", which your code then set to 0", _NAIVE[2],
         lambda: torch.nan_to_num(exps / exps.sum(-1, keepdim=True))),
        ("ones", "fully masked rows filled with 1", "a row with no allowed key must get weights 0, not 1",
         "use 0 for such rows", torch.where(empty, torch.ones_like(plain), plain)),
        ("any-2", "fully masked rows looked for over axis -2", "mask.any(dim=-2) looks down each column (over the "
         "queries), not along each row", f"{_EMPTY_ROWS}: one True/False per query row",
         lambda: torch.softmax(s.masked_fill(~mask, inf).masked_fill(empty_q, 0.0), -1).masked_fill(empty_q, 0.0)),
        *[(f"in-{name}", f"computed in {name}, not float64", f"part of your computation ran in {name} (.float(), "
           f".half() or dtype={low}), too few digits for these inputs", "keep the scores' dtype (or a wider one)",
           lambda low=low: _softmax_oracle(s.to(low), mask).to(s.dtype) if s.dtype == torch.float64 else None)
          for low, name in ((torch.float32, "float32"), (torch.float16, "float16"))],  # right, but computed narrower
        *[(f"weak{fill}", "a fill value too weak for these scores", "next to scores of ±3·10⁴, a finite fill still "
           "gives blocked keys weight", "fill with float('-inf')",
           lambda fill=fill: torch.softmax(s.masked_fill(~full, fill), -1).masked_fill(empty, 0.0))
          for fill in (-1e4, -1e3, -1e5)],
    ]


@check("masked_softmax", expects="a function masked_softmax(scores, mask) returning weights shaped like scores")
def check_masked_softmax(fn: Learner) -> str:
    cases = _softmax_cases()
    every = [(c.scores, c.mask) for c in cases]
    suspects = Suspects(_table(_softmax_mistakes, every, lambda s, m: tuple(s.shape)))
    no_keepdim = ("mask.any(dim=-1) without keepdim=True has shape (…, n_q), which lines up with the keys' axis, not "
                  "the rows", f"keep the axis: {_EMPTY_ROWS} has shape (…, n_q, 1)")
    confirm = functools.cache(lambda: _confirm_no_keepdim(fn))  # one more call of the learner's code, if needed
    for case, (s, mask) in zip(cases, every):
        tried = (f"masked_softmax(scores {tuple(s.shape)} {str(s.dtype).replace('torch.', '')}, mask "
                 f"{tuple(mask.shape)}) on {case.name}")
        plain = torch.softmax(s.masked_fill(~mask, -math.inf), -1)
        constructs = [(*no_keepdim, attempt, confirm) for attempt in (
            lambda: plain.masked_fill(~mask.any(-1), 0.0), lambda: torch.where(mask.any(-1), plain, 0.0),
            lambda: plain.masked_fill(~torch.broadcast_to(mask, s.shape).any(-1), 0.0))]
        raw, changed = _call(fn.observe, (kit.CALL, s, mask), tried, f"weights of shape {tuple(s.shape)}",
                             constructs=constructs)
        got = kit.tensor_answer(raw, tried=tried)
        if got.dtype == torch.bool:
            rows = torch.equal(got, ~torch.broadcast_to(mask, s.shape).any(-1, keepdim=True))
            fail("returned a bool tensor, not weights", tried=tried, got=f"a bool tensor of shape {tuple(got.shape)}",
                 expected=f"float weights of shape {tuple(s.shape)}", cause=f"you returned the fully masked rows "
                 f"({_EMPTY_ROWS}) in place of the weights" if rows else "", fix="return the softmax weights")
        try:
            suspects.expect(got, _softmax_oracle(s, mask), (s, mask), tried=tried, distinguish=every,
                            again=lambda *a: as_tensor(fn(*a), tried=""), what="your weights", atol=case.atol)
        except Failure as failure:
            if not failure.diagnosis.cause:
                _softmax_structure(got, case, tried)
            raise
        if changed:
            names = " and ".join(("scores", "mask")[int(i)] for i in changed)
            fail(f"changed {names} in place", tried=tried, got=f"right weights, but {names} changed by the call",
                 expected="the arguments left as they were", cause=f"an in-place operation on {names} (masked_fill_, "
                 "or an assignment into it) changes the caller's tensor",
                 fix="scores.masked_fill(~mask, float('-inf')), without the trailing _")
    return ("zero weights on blocked keys and in fully masked rows, rows of allowed keys summing to 1 "
            f"(masks of {len({tuple(c.mask.shape) for c in cases})} shapes, left padding, large scores, float16/32/64)")


def _confirm_no_keepdim(fn: Learner) -> bool:
    """On square scores, where a (…, n_q) row mask broadcasts, the learner's function zeroes column i where row i has
    no key, as a missing keepdim does."""
    s = torch.tensor([[0.3, -1.2, 2.0], [0.7, 0.1, -0.4], [1.5, -0.6, 0.2]], dtype=torch.float64)  # (3, 3)
    mask = torch.tensor([[True, False, True], [False, False, False], [True, True, False]])
    try:
        got = as_tensor(fn(s, mask), tried="", what="")
    except (LearnerRaised, Failure):
        return False
    no_keepdim = torch.softmax(s.masked_fill(~mask, -math.inf), -1).masked_fill(~mask.any(-1), 0.0)
    return same(got, no_keepdim, atol=1e-9, rtol=1e-7)


def _softmax_structure(got: torch.Tensor, case: _SoftCase, tried: str) -> None:
    """When no known mistake reproduces the weights, say which property is off."""
    if tuple(got.shape) != tuple(case.scores.shape):
        return
    w, full = got.to(torch.float64), torch.broadcast_to(case.mask, got.shape)
    empty = ~full.any(-1)  # (..., n_q)
    rows, bad = f"{int(empty.sum())} fully masked row{'s' if int(empty.sum()) != 1 else ''}", w[empty]
    if torch.isnan(bad).any():
        fail("NaN in fully masked rows", tried=tried, got=f"NaN in the {rows}", expected="all-zero weights there",
             cause="softmax over a row that is -inf everywhere is 0/0 = NaN", fix=f"set such rows to 0 ({_EMPTY_ROWS})")
    if (bad.abs() > 1e-6).any():
        fail("fully masked rows are not zero", tried=tried, got=f"weights up to {fmt(float(bad.abs().max()))} in "
             f"the {rows}", expected="all-zero weights there", fix=f"set such rows to 0 ({_EMPTY_ROWS})")
    if (w < -1e-12).any() or (w > 1 + 1e-6).any():
        fail("weights outside [0, 1]", tried=tried, got=f"weights from {fmt(float(w.min()))} to {fmt(float(w.max()))}",
             expected="weights between 0 and 1", fix="the weights are a softmax over the allowed keys: torch.softmax")
    if torch.isnan(w).any():
        nan_rows = torch.isnan(w).any(-1)  # (..., n_q)
        if torch.equal(nan_rows, torch.isinf(torch.exp(case.scores.to(w.dtype)).masked_fill(~full, 0.0)).any(-1)):
            fail(_NAIVE[0], tried=tried, expected="finite weights in every row with an allowed key", got=f"NaN in "
                 f"exactly the {int(nan_rows.sum())} rows where an allowed score is so large that e^score is inf",
                 cause=_NAIVE[1], fix=_NAIVE[2])
        fail("NaN in rows that have an allowed key", tried=tried, got=f"NaN in {int(nan_rows.sum())} rows with allowed "
             "keys", expected="finite weights", fix="print each step on this input: where does NaN first appear?")
    leak = float(w[~full].abs().max()) if (~full).any() else 0.0
    if leak > 1e-6:
        fail("weight on blocked keys", tried=tried, got=f"blocked keys get weight up to {fmt(leak)}",
             expected="weight 0 wherever the mask is False", fix="fill blocked scores with float('-inf') first")
    sums = w.sum(-1)[~empty]
    if sums.numel() and not torch.allclose(sums, torch.ones_like(sums), atol=1e-3):
        fail("rows do not sum to 1", tried=tried, got=f"rows with allowed keys summing to {fmt(float(sums.min()))} … "
             f"{fmt(float(sums.max()))}", expected="1 in each row with an allowed key",
             fix="take the softmax over the last axis (dim=-1) after masking")
