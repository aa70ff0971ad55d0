"""split_heads and merge_heads: their cases, tables of known mistakes and checks, and the explanations only they use."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Callable

import torch

from ...multihead import merge_heads as ref_merge, split_heads as ref_split
from ..compare import Failure, fail_again
from ..core import Learner, LearnerRaised, LearnerTimedOut, check, fail, fmt, learner_error
from ..kit import (Known, Suspects, bool_hint, expect_unchanged, explain_raise, factors, half_rounded, lower_precision,
                   tensor_answer)
from .shared import PATTERNS, Sized, and_


# ============================================================================ shared by split_heads and merge_heads
def _explain(exc: LearnerRaised, call: Callable, x: torch.Tensor) -> dict:
    """Cause and fix of an exception: a tensor asked for one truth value, code that runs on x[:1] only, the message."""
    if bool_hint(exc):
        return bool_hint(exc)
    if x.shape[0] > 1:
        try:
            call(x[:1])
            return dict(cause="your code ran with a batch of one (B = 1) but raised with a batch of several: it treats "
                              "x as a single sequence", fix="keep B as the first axis throughout: reshape with "
                        "x.shape[0] in front, and count the axes to transpose from the end")
        except (LearnerRaised, LearnerTimedOut):
            pass
    return explain_raise(exc, patterns=PATTERNS)


def _shape_in_symbols(out: torch.Tensor, want: tuple, sizes: dict[str, int], target: str, tried: str) -> None:
    """Fail on a shape that reads, in the docstring's letters, as other axes or another order: read only when every
    axis is exactly one letter or one product of two (``B·A``), and nothing else, here."""
    reading: dict[int, list[str]] = {}
    products = [(f"{x}·{y}", sizes[x] * sizes[y]) for x, y in itertools.combinations(sizes, 2)]
    for name, size in [*sizes.items(), *products]:
        reading.setdefault(size, []).append(name)
    parts, letters = [reading.get(int(s), []) for s in out.shape], target[1:-1].split(", ")
    if not parts or any(len(p) != 1 for p in parts) or [p[0] for p in parts] == letters:
        return
    axes = [p[0] for p in parts]
    shown = f"({', '.join(axes)})"
    if sorted(axes) == sorted(letters):
        moved = [a for a, w in zip(axes, letters) if a != w]
        cause = f"your result has the docstring's axes in another order, {shown}: {and_(moved)} are out of place"
    else:
        extra, missing = (list((Counter(x) - Counter(y)).elements()) for x, y in ((axes, letters), (letters, axes)))
        cause = "your result has " + (f"{and_(extra)} where the docstring has {and_(missing)}" if extra and missing
                                      else f"no {and_(missing)} axis" if missing else f"an extra {and_(extra)} axis")
    fail(f"wrong shape {tuple(out.shape)} = {shown}, expected {target}", tried=tried,
         got=f"a result of shape {tuple(out.shape)}, which on this input reads as {shown}",
         expected=f"shape {tuple(want)} = {target}", cause=cause,
         fix=f"follow the docstring's shapes step by step (print(t.shape) after each step); the result is {target}")


def _moved(failure: Failure, out: torch.Tensor, x: torch.Tensor, oracle: Callable, axes: str, fix: str) -> None:
    """After a mismatch nothing named: a result that holds each of x's values exactly once, in other places, is a
    rearrangement no known mistake lists; say across which of x's ``axes`` (their letters, as the docstring writes x's
    shape) its entries moved, with an example. (x's values are distinct random numbers, so where each value of the
    result came from is known.)"""
    if failure.diagnosis.cause or not out.is_floating_point() or tuple(out.shape) != tuple(oracle(x).shape):
        return
    flat, got = x.detach().double().flatten(), out.detach().double().flatten()
    if torch.unique(flat).numel() != flat.numel():
        return
    order = flat.argsort()
    src = order[torch.searchsorted(flat[order], got).clamp(max=flat.numel() - 1)]  # where each value of out is in x
    if not torch.equal(flat[src], got) or torch.unique(src).numel() != src.numel():
        return
    right = oracle(torch.arange(flat.numel(), dtype=torch.float64).reshape(x.shape)).flatten().long()
    wrong = (src != right).nonzero().flatten()
    if not wrong.numel():
        return
    place = lambda i: torch.stack(torch.unravel_index(i, x.shape), -1)  # noqa: E731 - flat index → x's index
    crossed = and_([name for name, moved in zip(axes.split(", "), (place(src[wrong]) != place(right[wrong])).any(0))
                    if moved])
    at = tuple(int(i) for i in torch.unravel_index(wrong[0], out.shape))
    came, belongs = (tuple(int(i) for i in place(t[wrong[0]])) for t in (src, right))
    fail_again(failure, f"x's entries moved across axes {crossed}",
               f"your result holds each of x's values exactly once, but entries moved along x's axes {crossed} of "
               f"({axes}): your result{list(at)} holds x{list(came)}, where the docstring's rule puts "
               f"x{list(belongs)}. "
               "A reshape or view with its sizes in another order than the axes in memory, a transpose missing or "
               "misplaced before one, or indexing in the wrong order moves entries from one axis into another", fix)


def _expect_same_precision(out: torch.Tensor, x: torch.Tensor, want: torch.Tensor, *, tried: str, what: str,
                           unchanged: Callable[[], None]) -> None:
    """``what`` only moves numbers, so its result holds x's values exactly: one in a narrower dtype has rounded them,
    one whose values all lie on a narrower dtype's grid went through it (float32), and any other difference within the
    tolerance comes from arithmetic on the values."""
    if not out.is_floating_point():
        return
    if out.dtype.itemsize < x.dtype.itemsize:
        got, had = str(out.dtype)[6:], str(x.dtype)[6:]
        fail(f"result rounded to {got}", tried=tried, got=f"the right numbers, but as {got}: x's {had} values rounded",
             expected=f"x's own values, exactly: {what} only moves numbers", cause=f"you converted to {got} (.float(), "
             f".half() or dtype={got})", fix="drop the conversion: reshape, transpose and cat keep x's dtype")
    if not torch.equal(out.to(want.dtype), want):
        lower_precision(out, x.dtype, tried=tried, what=f"your {what} result")
        unchanged()  # values computed on an x changed in place: that names it better
        off = fmt(float((out.double() - want.double()).abs().max()))
        fail("values changed", tried=tried, got=f"the right values to within {off}, but not x's own values",
             expected=f"x's own values, exactly: {what} only moves numbers",
             cause="some step of yours computes with the values (adds, multiplies, divides) instead of only moving "
                   "them", fix="only reshape, transpose, split or cat: no arithmetic on x's values")


_KEEP_DTYPE = "leave out .half() and .bfloat16(): reshape and transpose keep x's dtype and values"


def _half_trip(out: torch.Tensor, want: torch.Tensor, *, tried: str, what: str) -> None:
    """Name a trip through float16 or bfloat16 (:func:`~..kit.half_rounded`) only when it is proven: moving numbers
    through that dtype and back rounds each to its nearest number there, so the result is exactly ``want`` so
    rounded. Values cut to a fixed grid (round(x * 256) / 256) or bits cut off lie on the grid too, but not there."""
    got = out.detach()
    if got.is_floating_point() and tuple(got.shape) == tuple(want.shape) and any(
            torch.equal(got, want.detach().to(h).to(got.dtype)) for h in (torch.bfloat16, torch.float16)):
        half_rounded(out, want, tried=tried, what=what, fix=_KEEP_DTYPE)


# ============================================================================ split_heads
_SPLIT_CASES = [  # (B, n, A, d_head, dtype); the first is the one every mistake differs on
    (2, 5, 3, 4, torch.float32),
    (2, 4, 4, 3, torch.float32),  # same width 12, another n_heads
    (2, 4, 2, 6, torch.float32),
    (2, 3, 4, 4, torch.float64),  # A = d_head: only the values tell (A, d_head) from (d_head, A)
    (1, 4, 6, 1, torch.float32),  # heads of width 1
    (3, 1, 2, 4, torch.float32),  # one position
    (2, 3, 1, 8, torch.float32),  # one head
    (1, 1, 1, 1, torch.float64),
]
_MIXED = "reshape to (B, n, A, d_head) first, then swap the position and head axes: .transpose(1, 2)"

SPLIT_MISTAKES = [
    Known("no_transpose", "heads split without a transpose", "you reshaped straight to (B, A, n, d_head), so each "
          "'head' holds pieces of several positions (heads mixed with positions)", _MIXED,
          lambda x, a: x.reshape(x.shape[0], a, x.shape[1], -1)),
    Known("strided", "features split in the wrong order", "you reshaped the last axis as (d_head, A): head h got every "
          "A-th feature", "reshape the last axis as (A, d_head), not (d_head, A)",
          lambda x, a: x.reshape(*x.shape[:2], -1, a).permute(0, 3, 1, 2)),
    Known("forgot_transpose", "head axis not moved in front of the positions", "you reshaped to (B, n, A, d_head) but "
          "did not swap the axes", "add .transpose(1, 2)", lambda x, a: x.reshape(*x.shape[:2], a, -1)),
    Known("sizes_swapped", "n_heads used as the head width", "you split into d_head heads of width A", "reshape the "
          "last axis as (n_heads, width // n_heads)",
          lambda x, a: None if a * a == x.shape[-1] else x.reshape(*x.shape[:2], -1, a).transpose(1, 2)),
    Known("reversed", "heads in reverse order", "your head 0 holds the last block of features", "head h takes "
          "features h·d_head … (h+1)·d_head − 1", lambda x, a: None if a == 1 else ref_split(x, a).flip(1)),
    Known("batch_heads_merged", "batch and head axes merged into one", "you returned (B·A, n, d_head), as d2l's "
          "transpose_qkv does", "stop after the transpose: (B, A, n, d_head)",
          lambda x, a: None if x.shape[0] == 1 or a == 1 else ref_split(x, a).flatten(0, 1)),
    Known("last_two_swapped", "positions and features swapped", "your last two axes are (d_head, n): one transpose too "
          "many", "swap only the position and head axes",
          lambda x, a: None if x.shape[1] * a == x.shape[2] else ref_split(x, a).transpose(-2, -1)),
]


def _heads_count_cause(shape: tuple, b: int, n: int, a: int, width: int, previous: tuple | None) -> dict:
    """A split into another number of heads, and whether that count or width is the previous case's (hard-coded)."""
    if not (len(shape) == 4 and shape[0] == b and shape[2] == n and shape[1] != a and shape[1] * shape[3] == width):
        return {}
    heads = f"your result has {shape[1]} heads of width {shape[3]}"
    wanted = f"while n_heads = {a} asks for heads of width {width // a}"
    if previous and (shape[1], shape[3]) == previous:  # (a width kept from the previous case with another count
        # cannot follow a right answer on _SPLIT_CASES: a fixed width is right on case 0 only, and case 1 splits the
        # same width 12 into the same count)
        cause = f"{heads}, the split of the previous case: the head count or width is hard-coded, {wanted}"
    else:
        cause = f"{heads}, but n_heads = {a}: the head count is hard-coded or taken from somewhere else"
    return dict(cause=cause, fix="split into n_heads heads of width x.shape[-1] // n_heads, using the n_heads argument")


@check("split_heads", expects="a function split_heads(x, n_heads) turning (B, n, A·d_head) into (B, A, n, d_head)")
def check_split_heads(fn: Learner) -> str:
    gen = torch.Generator().manual_seed(7)
    suspects = Suspects(SPLIT_MISTAKES, atol=1e-6, rtol=1e-5)
    previous = None
    for b, n, a, d, dtype in _SPLIT_CASES:
        x = torch.randn(b, n, a * d, generator=gen, dtype=torch.float64).to(dtype)
        tried = f"split_heads(x, {a}) with x of shape {(b, n, a * d)} ({str(dtype)[6:]}): {a} heads of width {d}"
        try:
            out = tensor_answer(fn(x, a), tried=tried)
        except LearnerRaised as exc:
            raise Failure(learner_error(exc, tried=tried, expected=f"a tensor of shape {(b, a, n, d)}",
                                        **_explain(exc, lambda t: fn(t, a), x))) from None
        if tuple(out.shape) != (b, a, n, d) and not suspects.suspects(out, (x, a)):
            if hint := _heads_count_cause(tuple(out.shape), b, n, a, a * d, previous):
                fail(f"split into {out.shape[1]} heads, not n_heads = {a}", tried=tried,
                     got=f"a result of shape {tuple(out.shape)}", expected=f"shape {(b, a, n, d)}", **hint)
            _shape_in_symbols(out, (b, a, n, d), {"B": b, "A": a, "n": n, "d_head": d}, "(B, A, n, d_head)", tried)
        _half_trip(out, ref_split(x, a), tried=tried, what="your heads")
        try:
            suspects.expect(out, ref_split(x, a), (x, a), tried=tried, again=fn, factors=factors(A=a, d_head=d, n=n),
                            axes=("batch entries", "heads", "positions", "features"))
        except Failure as failure:
            _moved(failure, out, x, lambda t, a=a: ref_split(t, a), "B, n, A·d_head", _MIXED)
            raise
        shown = f"x of shape {tuple(x.shape)} ({str(dtype)[6:]})"
        _expect_same_precision(out, x, ref_split(x, a), tried=tried, what="split_heads", unchanged=lambda: (
            expect_unchanged(fn, (x, a), call=f"split_heads(x, {a})", name="x", shown=shown)))
        previous = (a, d)
    x = torch.randn(2, 5, 12, generator=gen)
    expect_unchanged(fn, (x, 3), call="split_heads(x, 3)", name="x", shown="x of shape (2, 5, 12) (float32)")
    return (f"matches the reference on {len(_SPLIT_CASES)} cases (1 to 6 heads, width 1 to 8, one position, "
            "float32 and float64): one block of features per head")


# ============================================================================ merge_heads
_MERGE_CASES = [  # (B, A, n, d_head, dtype)
    (2, 3, 5, 4, torch.float32),
    (2, 4, 3, 4, torch.float64),  # A = d_head
    (1, 6, 4, 1, torch.float32),
    (3, 2, 1, 4, torch.float32),
    (2, 1, 3, 8, torch.float32),
    (1, 2, 2, 3, torch.float32),
]
_CONCAT = "concatenate whole heads, head 0 first: transpose to (B, n, A, d_head), then reshape to (B, n, A·d_head)"
_MERGED = lambda x: (x.shape[0], x.shape[2], x.shape[1] * x.shape[3])  # noqa: E731 - (B, n, A·d_head)
_UNMIXED = "first .transpose(1, 2) to (B, n, A, d_head), then reshape"

MERGE_MISTAKES = [
    Known("no_transpose", "heads merged without a transpose", "you reshaped (B, A, n, d_head) straight to "
          "(B, n, A·d_head), so each output row mixes several positions (heads mixed with positions)", _UNMIXED,
          lambda x: x.reshape(_MERGED(x))),
    Known("last_two_swapped", "heads merged without a transpose", "you swapped the last two axes, (B, A, d_head, n), "
          "instead of the head and position axes", _UNMIXED,
          lambda x: None if x.shape[2] == x.shape[3] else x.transpose(2, 3).reshape(_MERGED(x))),
    Known("transposed_after", "heads merged without a transpose", "you reshaped to (B, A·d_head, n) and then "
          "transposed, so each output row mixes positions and features", _UNMIXED,
          lambda x: x.reshape(x.shape[0], -1, x.shape[2]).transpose(1, 2)),
    Known("interleaved", "wrong concat order: features interleaved", "you put the feature axis before the head axis: "
          "feature 0 of every head, then feature 1, …", _CONCAT, lambda x: x.permute(0, 2, 3, 1).reshape(_MERGED(x))),
    Known("reversed", "wrong concat order: last head first", "you concatenated the heads in reverse order", _CONCAT,
          lambda x: ref_merge(x.flip(1))),
    Known("not_concatenated", "heads not concatenated", "you swapped the axes but did not reshape: (B, n, A, d_head)",
          "reshape the last two axes into one of size A·d_head", lambda x: x.transpose(1, 2)),
    *(Known(key, f"heads {how} instead of concatenated", f"you {how} the heads: d_head features, not A·d_head",
            _CONCAT, make) for key, how, make in (("averaged", "averaged", lambda x: x.mean(1)),
                                                   ("summed", "summed", lambda x: x.sum(1)))),
    Known("head_0", "only one head kept", "you returned head 0 alone", _CONCAT, lambda x: x[:, 0]),
    *(Sized(f"first_{k}", f"only the first {k} of {{A}} heads concatenated", f"you dropped the heads after head "
            f"{k - 1}: the number of heads looks hard-coded as {k}", "take the number of heads from x.shape[1]",
            lambda x, k=k: ref_merge(x[:, :k]) if k < x.shape[1] else None, sizes=lambda x: dict(A=x.shape[1]))
      for k in range(2, 6)),
    *(Known(f"permuted_{''.join(map(str, p))}",
            f"axes arranged as ({', '.join(('B', 'A', 'n', 'd_head')[i] for i in p)}) before the reshape",
            "a reshape keeps the entries in memory order, so they must be (B, n, A, d_head) first",
            _UNMIXED, lambda x, p=p: x.permute(p).reshape(_MERGED(x)))
      for p in itertools.permutations(range(4)) if p not in ((0, 2, 1, 3), (0, 1, 2, 3), (0, 1, 3, 2), (0, 2, 3, 1))),
]


@check("merge_heads", expects="a function merge_heads(x) turning (B, A, n, d_head) into (B, n, A·d_head)")
def check_merge_heads(fn: Learner) -> str:
    gen = torch.Generator().manual_seed(8)
    suspects = Suspects(MERGE_MISTAKES, atol=1e-6, rtol=1e-5)
    for b, a, n, d, dtype in _MERGE_CASES:
        x = torch.randn(b, a, n, d, generator=gen, dtype=torch.float64).to(dtype)
        tried = f"merge_heads(x) with x of shape {(b, a, n, d)} ({str(dtype)[6:]}): {a} heads of width {d}"
        try:
            out = tensor_answer(fn(x), tried=tried)
        except LearnerRaised as exc:
            raise Failure(learner_error(exc, tried=tried, expected=f"a tensor of shape {(b, n, a * d)}",
                                        **_explain(exc, fn, x))) from None
        if tuple(out.shape) != (b, n, a * d) and not suspects.suspects(out, (x,)):
            _shape_in_symbols(out, (b, n, a * d), {"B": b, "A": a, "n": n, "d_head": d}, "(B, n, A·d_head)", tried)
        _half_trip(out, ref_merge(x), tried=tried, what="your merged heads")
        try:
            suspects.expect(out, ref_merge(x), (x,), tried=tried, again=fn, factors=factors(A=a, d_head=d, n=n),
                            axes=("batch entries", "positions", "features"))
        except Failure as failure:
            _moved(failure, out, x, ref_merge, "B, A, n, d_head", _UNMIXED)
            raise
        shown = f"x of shape {tuple(x.shape)} ({str(dtype)[6:]})"
        _expect_same_precision(out, x, ref_merge(x), tried=tried, what="merge_heads", unchanged=lambda: (
            expect_unchanged(fn, (x,), call="merge_heads(x)", name="x", shown=shown)))
    x = torch.randn(2, 3, 5, 4, generator=gen)
    expect_unchanged(fn, (x,), call="merge_heads(x)", name="x", shown="x of shape (2, 3, 5, 4) (float32)")
    return (f"matches the reference on {len(_MERGE_CASES)} cases (1 to 6 heads, one position, float32 and "
            "float64) and undoes split_heads")
