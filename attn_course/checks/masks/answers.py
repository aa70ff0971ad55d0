"""Answers as bool masks: the answer read as a bool tensor, the judge that names a known mistake or the wrong
region, and the mistakes several checks share (polarity, pad_id, counted padding, the triangles)."""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import torch

from .. import kit
from ..core import Learner, fail, fmt
from ..kit import Known, Suspects

_BOOL = "a bool tensor (True = may attend)"
_MAKE_BOOL = "make it bool: .bool(), dtype=torch.bool, or a comparison"
POLARITY = ("mask polarity inverted", "your mask is True where attention is blocked; in this course True means "
            "'may attend' (the convention of F.scaled_dot_product_attention; nn.MultiheadAttention uses the opposite)")
PAD_ID = ("pad_id ignored (compared with 0)", "you compared the ids with 0, not with the pad_id argument")
COUNTED = ("padding assumed at the end", "you marked as many positions from the start as there are real tokens; with "
           "left padding the real tokens are elsewhere")

TRIANGLES = [  # (key, summary, cause, fix, the causal part it makes of a square of ones): causal and decoder masks
    ("triu", "upper triangle instead of lower", "torch.triu keeps j ≥ i: each query sees itself and the future",
     "keep j ≤ i: torch.tril", lambda ones: ones.triu()),
    ("tril-1", "diagonal excluded (off by one)", "a token must attend to itself; without the diagonal the first row "
     "has no key at all", "torch.tril with diagonal=0 (the default)", lambda ones: ones.tril(-1)),
    ("tril+1", "one diagonal too many (off by one)", "query i also sees key i + 1, the next token",
     "torch.tril with diagonal=0 (the default)", lambda ones: ones.tril(1)),
]


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
             got=f"{what} is {kind} with values {values}", expected=_BOOL, fix=_MAKE_BOOL,
             cause="~, & and masked_fill need bool masks (torch.ones makes floats unless given dtype=torch.bool; "
             "so do .float() and arithmetic on a bool mask)")
    if 0.0 in values and values[-1] <= 0:  # 0 to keep, a negative number to block
        fail("an additive float mask, not a bool mask", tried=tried, got=f"{what} is {kind}: 0 for kept positions, "
             f"{fmt(values[0]) if values[0] < 0 else '-inf'} for blocked ones", expected=_BOOL,
             cause="you returned the additive form (exercise 6's additive_mask); this docstring asks for the bool form",
             fix="return the comparison itself (a bool tensor), e.g. torch.ones(n, n, dtype=torch.bool).tril()")
    fail(f"a {kind} mask with values {values[:4]}{'…' if len(values) > 4 else ''}", tried=tried,
         got=f"{what} is {kind}", expected=_BOOL, fix="build it from comparisons (==, !=, <, <=) and torch.tril")


def table(rows: Callable[..., list[tuple]], cases: list[tuple], shape_of: Callable[..., tuple]) -> list[Known]:
    """Known mistakes from ``rows(*case)``: (key, summary, cause, fix, mask) tuples, the mask being what the mistake
    gives on that case (a tensor, a function making it, or None where it cannot happen), broadcast to
    ``shape_of(*case)``. Keys and texts do not depend on the case; each case's rows are built once."""
    made = functools.cache(lambda *case: {row[0]: row[4] for row in rows(*case)})  # tensors are cached by identity

    def mask(key: str, *case: Any) -> torch.Tensor | None:
        value = made(*case).get(key)
        value = value() if callable(value) else value
        return None if value is None else torch.broadcast_to(value, shape_of(*case))  # raises: no suspect here

    return [Known(key, summary, cause, fix, lambda *case, key=key: mask(key, *case))
            for key, summary, cause, fix, _ in rows(*cases[0])]


class Judge:
    """One check run: a :class:`~..kit.Suspects` over the table ``rows``, and the learner's ``fn`` (called as
    ``call(fn, *case)`` where given) to tell two suspects apart on the other ``cases``."""

    def __init__(self, fn: Learner, rows: Callable[..., list[tuple]], cases: list[tuple],
                 shape_of: Callable[..., tuple], call: Callable[..., Any] | None = None):
        self.suspects, self.cases = Suspects(table(rows, cases, shape_of)), cases
        self.again = lambda *case: torch.broadcast_to(_as_bool_mask(call(fn, *case) if call else fn(*case), tried=""),
                                                      shape_of(*case))

    def found(self, got: torch.Tensor, case: tuple) -> list[Known]:
        """The known mistakes (not ruled out, told apart on other cases where they can be) whose mask is ``got``."""
        found = self.suspects.narrow(self.suspects.suspects(got, case), self.again, self.cases)
        return list({m.summary: m for m in found}.values())


def compare(got: torch.Tensor, expected: torch.Tensor, judge: Judge, case: tuple, *, tried: str,
            regions: list[tuple[str, torch.Tensor]], hints: list[tuple] = (), index_names: str = "",
            unit: str = "pair", what: str = "your mask") -> None:
    """Fail unless ``got`` equals ``expected``, shape included, naming a known mistake, else a wrong shape, else the
    ``regions`` (name, where) that hold the wrong pairs. A right answer rules out the mistakes whose mask differs."""
    target, shape = tuple(expected.shape), tuple(got.shape)
    try:
        g = torch.broadcast_to(got, target)
    except RuntimeError:
        g = None
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
        fail(POLARITY[0], tried=tried, got=f"{what} is True exactly where it should be False",
             expected="True = may attend", cause=POLARITY[1], fix="negate it (~mask), or flip the comparison")
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


def call(fn: Callable, args: tuple, tried: str, expected: str, kwargs: dict | None = None,
         constructs: list = ()) -> Any:
    """The learner's result; an exception is explained by a construct that reproduces it, else by a pattern."""
    return kit.call_explained(lambda *a: fn(*a, **(kwargs or {})), *args, tried=tried, expected=expected,
                              constructs=constructs, patterns=_PATTERNS)


def expect_inputs_unchanged(fn: Learner, cases: list[tuple], *, call: Callable[[tuple], str],
                            names: tuple[str, ...]) -> None:
    """Fail when the learner's code changes one of its tensor arguments (called ``names``, in order) in place on any
    of ``cases``: the mask it returns can be right while the caller's ids, lengths or mask no longer hold what they
    held (ids[ids == pad_id] = …, lengths.unsqueeze_(…), mask.logical_not_()). ``call(case)`` shows the call."""
    for case in cases:
        kit.expect_unchanged(fn, case, call=call(case), name=names[0], others=names[1:],
                             shown="; ".join(f"{name} {tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"
                                             for name, t in zip(names, case)))


def mask_of(fn: Learner, args: tuple, tried: str, shape: tuple, kwargs: dict | None = None,
            constructs: list = ()) -> torch.Tensor:
    return _as_bool_mask(call(fn, args, tried, f"a {shape} bool tensor", kwargs, constructs), tried=tried)
