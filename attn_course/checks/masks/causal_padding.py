"""Checks of the causal mask and of the padding masks, from lengths and from ids."""

from __future__ import annotations

import torch

from ..core import Learner, as_tensor, check, fail
from .answers import COUNTED, PAD_ID, POLARITY, TRIANGLES, Judge, call, compare, expect_inputs_unchanged, mask_of


# ============================================================================ causal
def _causal_mistakes(n: int) -> list[tuple]:
    ones, tril = torch.ones(n, n, dtype=torch.bool), "keep j ≤ i: torch.tril"
    return [*[(key, summary, cause, fix, part(ones)) for key, summary, cause, fix, part in TRIANGLES],
            ("polarity", POLARITY[0], POLARITY[1] + "; True marks the future here", tril, ones.triu(1)),
            ("ones", "nothing is masked", "every query sees every key", tril, ones),
            ("eye", "only the diagonal is allowed", "each token sees only itself (torch.eye)", tril,
             torch.eye(n, dtype=torch.bool)),
            ("zeros", "everything is masked", "no query may attend to any key", tril, ~ones),
            ("flip", "anti-diagonal triangle (flipped)", "you flipped the matrix left to right",
             tril + ", without flipping", ones.tril().flip(-1))]


@check("causal_mask", expects="a function causal_mask(n) returning an (n, n) bool tensor")
def check_causal_mask(fn: Learner) -> str:
    sizes = [5, 8, 1, 2, 11]  # 11: past a mask made once for 8, then sliced
    judge = Judge(fn, _causal_mistakes, [(n,) for n in sizes], lambda n: (n, n))
    shapes: dict[tuple, int] = {}  # the shapes returned so far, and for which n
    for case in judge.cases:
        n, tried = case[0], f"causal_mask({case[0]})"
        got = mask_of(fn, case, tried, (n, n))
        shape = tuple(got.shape)
        if shape[-2:] != (n, n) and shape not in shapes:  # one more call tells a fixed size from a wrong formula
            again = call(fn, (7,), "causal_mask(7)", "a (7, 7) bool tensor")  # 7: a size the cases do not use
            shapes[tuple(as_tensor(again, tried="causal_mask(7)", what="your function").shape)] = 7
        m = shape[0] if len(shape) == 2 and shape[0] == shape[1] else None
        if shape in shapes and shape[-2:] != (n, n) and m is not None and m < n and shapes[shape] == m and \
                any(k < m and s == (k, k) for s, k in shapes.items()):  # right up to m, so n is read: a fixed m × m
            fail(f"n used only up to {m}", tried=tried, got=f"a mask of shape {shape}, as for n = {m}, where "
                 f"smaller n gave n × n masks", expected=f"shape ({n}, {n})", cause=f"your mask is cut from one of "
                 f"fixed size {m} × {m} (made once, or an outer variable, then sliced [:n, :n]): past n = {m} "
                 "there is nothing more to cut", fix="build the mask from the argument n on every call: "
                 "torch.ones(n, n, dtype=torch.bool).tril()")
        if shape in shapes and shape[-2:] != (n, n):
            fail("n is ignored", tried=tried, got=f"a mask of shape {shape}, as for n = {shapes[shape]}",
                 expected=f"shape ({n}, {n})", cause="your size is written into the code, or an outer variable",
                 fix="build the mask from the argument n")
        shapes[shape] = n
        hints = [((n + d, n + d), f"size n {sign} 1 = {n + d}, not n", f"one row and one column too {word}",
                  "make it n × n: torch.ones(n, n, dtype=torch.bool)")
                 for d, sign, word in ((1, "+", "many"), (-1, "-", "few")) if n > 1]
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        compare(got, j <= i, judge, case, tried=tried, hints=hints, index_names=" (query, key)",
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
    polarity = (POLARITY[0], POLARITY[1] + "; real tokens should be True, padding False",
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
    # Defaults: [2, 6, 4] has a largest length (6), a first (2) and a last length (4) and a batch size (3) that all
    # differ, and differ from 6 ± 1: each wrong default width names one mistake.
    cases = [([3, 1, 4], 6, torch.int64), ([2, 6, 4], None, torch.int64), ([0, 2], 3, torch.int64),
             ([4, 2, 1], None, torch.int32), ([1], 1, torch.int64), ([3, 3], None, torch.int64),
             ([1, 2], 5, torch.int64), ([300, 7], None, torch.int64)]  # 300: past int8 and uint8
    judge = Judge(fn, _lengths_mistakes, [(torch.tensor(values, dtype=dtype), n) for values, n, dtype in cases],
                  lambda lengths, max_len: (len(lengths), max_len or int(lengths.max())),
                  lambda f, lengths, max_len: f(lengths) if max_len is None else f(lengths, max_len=max_len))
    for case in judge.cases:
        (lengths, max_len), values = case, case[0].tolist()
        B, longest = len(values), max(values)
        S = longest if max_len is None else max_len
        tried = f"padding_mask_from_lengths(torch.tensor({values}){'' if max_len is None else f', max_len={max_len}'})"
        got = mask_of(fn, (lengths,), tried, (B, S), None if max_len is None else {"max_len": max_len})
        if got.dim() == 2 and got.shape[0] == B and got.shape[1] != S:  # the same width on other arguments too?
            width, other = got.shape[1], 9 if got.shape[1] != 9 else 11
            shown = f"padding_mask_from_lengths(torch.tensor([1, 2]), max_len={other})"
            again = as_tensor(call(fn, (torch.tensor([1, 2]),), shown, f"a (2, {other}) bool tensor",
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
                          (values[-1], f"lengths[-1] = {values[-1]} columns (the lengths are not sorted)"),
                          (S + 1, f"{S + 1} columns, one more than the largest length"),
                          (S - 1, f"{S - 1} columns, one fewer than the largest length"))]
        expected = torch.arange(S)[None, :] < lengths[:, None].long()  # (B, S)
        compare(got, expected, judge, case, tried=tried, hints=hints, regions=_padding_regions(expected),
                index_names=" (sequence, position)", unit="position")
    expect_inputs_unchanged(fn, judge.cases, names=("lengths",),  # max_len passed by position, as the signature has it
                            call=lambda case: f"padding_mask_from_lengths(lengths, {case[1]})")
    return (f"correct on {len(cases)} batches (a zero length, no padding, one sequence, max_len given and "
            "default, int32 and int64 lengths, a length of 300)")


def _ids_mistakes(ids: torch.Tensor, pad_id: int) -> list[tuple]:
    real, every = ids != pad_id, "compare every id with pad_id: ids != pad_id"
    return [("zero", *PAD_ID, "compare with the argument: ids != pad_id", ids != 0),
            ("positive", *PAD_ID, "compare with the argument: ids != pad_id", ids > 0),
            ("polarity", POLARITY[0], POLARITY[1] + "; real tokens should be True, <pad> False", "ids != pad_id",
             ids == pad_id),
            ("count", *COUNTED, every, torch.arange(ids.shape[1])[None, :] < real.sum(-1, keepdim=True)),
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
    judge = Judge(fn, _ids_mistakes, cases, lambda ids, pad_id: tuple(ids.shape))
    for case in cases:
        (ids, pad_id), (B, S) = case, case[0].shape
        tried = f"padding_mask_from_ids(ids {(B, S)} {str(ids.dtype).replace('torch.', '')}, pad_id={pad_id})"
        hints = [((S, B), "transposed: one row per position", "you put the positions on the rows",
                  "return (B, S), one row per sequence"),
                 ((B, 1, 1, S), "shape (B, 1, 1, S), not (B, S)", "you added the heads and queries axes; this "
                  "function returns the plain (B, S) mask", "return ids != pad_id as it is; add axes where it is used")]
        compare(mask_of(fn, case, tried, (B, S)), ids != pad_id, judge, case, tried=tried, hints=hints,
                regions=_padding_regions(ids != pad_id), index_names=" (sequence, position)", unit="position")
    expect_inputs_unchanged(fn, cases, names=("ids",), call=lambda case: f"padding_mask_from_ids(ids, pad_id={case[1]})")
    return f"correct on {len(cases)} batches (pad ids 0, 1, 3 and 9; left and right padding; an all-<pad> sequence)"
