"""Checks for notebook 07 (multi-head attention): split_heads, merge_heads, MultiHeadAttention.

Oracles: the course's :func:`attn_course.multihead.split_heads` / ``merge_heads`` (tested against ``torch.chunk`` /
``torch.cat``); for the module, ``torch.nn.MultiheadAttention`` with the same weights wherever it applies
(A·d_head = d_model, no fully masked row), else :func:`_multihead`, a float64 model the tests hold equal to it.
Each check's known mistakes are a table of :class:`~.kit.Known` rows judged by one :class:`~.kit.Suspects`.
The learner's class is reached only through the learner boundary (``inspect``, ``construct``,
``set_parameters``, calls).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn as nn

from ..multihead import merge_heads as ref_merge
from ..multihead import split_heads as ref_split
from ..multihead import torch_masks
from ..softmax import masked_softmax
from .compare import Failure, same
from .core import (Learner, LearnerRaised, LearnerTimedOut, Mistake, as_tensor, check, expect_close, fail, fmt,
                   learner_error)
from .kit import Known, Suspects, bool_hint, explain_raise, factors

__all__ = ["check_split_heads", "check_merge_heads", "check_MultiHeadAttention"]


# ============================================================================ shared by the three checks
@dataclass(frozen=True)
class Sized(Known):
    """A :class:`~.kit.Known` whose texts name the case's sizes: ``{A}``, ``{k}``… filled in from
    ``sizes(*case)`` (could move to the kit)."""

    sizes: Callable[..., dict] = lambda *case: {}

    def on(self, case: tuple) -> Mistake:
        s = self.sizes(*case)
        return Mistake(self.summary.format(**s), self.cause.format(**s), self.fix.format(**s), lambda: self.make(*case))


#: Exceptions whose message says what the code did (type, regex, cause, fix), before the course-wide table.
_PATTERNS = [
    ("RuntimeError", r"view size is not compatible|contiguous",
     "`.view` needs memory laid out in the new shape, and `.transpose` gives a tensor whose memory is not (a "
     "non-contiguous one)", "use `.reshape(...)`, or `.contiguous().view(...)`, after the transpose"),
]
_BATCH_HINT = dict(cause="your code ran with a batch of one (B = 1) but raised with a batch of several: it does not keep "
                         "the batch axis B (it treats x as a single sequence)",
                   fix="keep B as the first axis throughout: reshape with x.shape[0] (or -1) in front, and "
                       "transpose the axes by position counted from the end")


def _explain(exc: LearnerRaised, call: Callable, x: torch.Tensor) -> dict:
    """Cause and fix of a learner's exception: a truth value asked of a tensor, code that only runs on one
    sequence (it runs on x[:1]), else what the message says."""
    if bool_hint(exc):
        return bool_hint(exc)
    if x.shape[0] > 1:
        try:
            call(x[:1])
            return _BATCH_HINT
        except (LearnerRaised, LearnerTimedOut):
            pass
    return explain_raise(exc, patterns=_PATTERNS)


def _tensor(value, *, tried: str, what: str = "your function") -> torch.Tensor:
    """The answer as a tensor; the docstrings ask for a torch tensor, so a NumPy array is named as such."""
    if isinstance(value, np.ndarray):
        fail(f"{what} returned a NumPy array, not a tensor", tried=tried,
             got=f"a NumPy array of shape {value.shape} ({value.dtype})", expected="a torch tensor, as the docstring says",
             cause="you converted to NumPy along the way (.numpy(), np.asarray or a NumPy function)",
             fix="stay with torch operations (torch.from_numpy(array) turns an array back into a tensor)")
    return as_tensor(value, tried=tried, what=what)


def _in_symbols(shape: tuple, sizes: dict[str, int]) -> list[str] | None:
    """``shape`` in the names of ``sizes`` (``["B·A", "n", "d_head"]``) when every axis is exactly one name or one
    product of two names — and nothing else — on this input; else None."""
    names, reading = list(sizes), {}
    for i, name in enumerate(names):
        reading.setdefault(sizes[name], []).append(name)
        for other in names[i + 1:]:
            reading.setdefault(sizes[name] * sizes[other], []).append(f"{name}·{other}")
    parts = [reading.get(int(s), []) for s in shape]
    return None if not shape or any(len(p) != 1 for p in parts) else [p[0] for p in parts]


def _shape_in_symbols(out: torch.Tensor, want: tuple, sizes: dict[str, int], target: str, tried: str) -> None:
    """Fail on a shape that reads, in the docstring's letters, as other axes or another order (saying what differs)."""
    axes, letters = _in_symbols(tuple(out.shape), sizes), target[1:-1].split(", ")
    if not axes or axes == letters:
        return
    reading = f"({', '.join(axes)})"
    if sorted(axes) == sorted(letters):
        moved = [a for a, w in zip(axes, letters) if a != w]
        cause = f"your result has the docstring's axes in another order, {reading}: {_and(moved)} are out of place"
    else:
        extra, missing = [a for a in axes if a not in letters], [w for w in letters if w not in axes]
        cause = f"your result has {_and(extra)} where the docstring has {_and(missing)}"
    fail(f"wrong shape {tuple(out.shape)} = {reading}, expected {target}", tried=tried,
         got=f"a result of shape {tuple(out.shape)}, which on this input reads as {reading}",
         expected=f"shape {tuple(want)} = {target}", cause=cause,
         fix=f"follow the docstring's shapes step by step (print(t.shape) after each step); the result is {target}")


_PRECISION = {torch.float64: 3, torch.float32: 2, torch.bfloat16: 1, torch.float16: 1}


def _expect_same_precision(out: torch.Tensor, x: torch.Tensor, *, tried: str, what: str) -> None:
    """``what`` only moves numbers: a result in a narrower dtype than ``x`` has rounded them."""
    if _PRECISION.get(out.dtype, 3) < _PRECISION.get(x.dtype, 0):
        got, had = str(out.dtype)[6:], str(x.dtype)[6:]
        fail(f"result rounded to {got}", tried=tried, got=f"the right numbers, but as {got}: x's {had} values rounded",
             expected=f"x's own values, exactly: {what} only moves numbers (the docstring's equation is an equality)",
             cause=f"you converted to {got} (.float(), .half() or dtype={got})",
             fix="drop the conversion: reshape, transpose and cat keep x's dtype")


def _and(words: list[str]) -> str:
    return " and ".join(words) if len(words) < 3 else ", ".join(words[:-1]) + " and " + words[-1]


def _order(perm: tuple, letters: tuple) -> str:
    return "(" + ", ".join(letters[i] for i in perm) + ")"


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
    Known("strided", "features split in the wrong order", "you reshaped the last axis as (d_head, A), so head h got "
          "every A-th feature instead of the block h·d_head … (h+1)·d_head − 1",
          "reshape the last axis as (A, d_head), not (d_head, A)",
          lambda x, a: x.reshape(*x.shape[:2], -1, a).permute(0, 3, 1, 2)),
    Known("forgot_transpose", "head axis not moved in front of the positions", "you reshaped to (B, n, A, d_head) but "
          "did not swap the axes, so the heads are still after the positions", "add .transpose(1, 2) to get "
          "(B, A, n, d_head)", lambda x, a: x.reshape(*x.shape[:2], a, -1)),
    Known("sizes_swapped", "n_heads used as the head width", "you split into d_head heads of width A instead of A "
          "heads of width d_head", "reshape the last axis as (n_heads, width // n_heads)",
          lambda x, a: None if a * a == x.shape[-1] else x.reshape(*x.shape[:2], -1, a).transpose(1, 2)),
    Known("reversed", "heads in reverse order", "your head 0 holds the last block of features: the heads come out in "
          "reverse order", "head h takes features h·d_head … (h+1)·d_head − 1, head 0 first",
          lambda x, a: None if a == 1 else ref_split(x, a).flip(1)),
    Known("batch_heads_merged", "batch and head axes merged into one", "you returned (B·A, n, d_head), as d2l's "
          "transpose_qkv does; the docstring keeps them apart: (B, A, n, d_head)", "stop after the transpose: no final "
          "reshape to (B·A, n, d_head)",
          lambda x, a: None if x.shape[0] == 1 or a == 1 else ref_split(x, a).flatten(0, 1)),
    Known("last_two_swapped", "positions and features swapped", "your last two axes are (d_head, n): one transpose too "
          "many (or the wrong pair of axes)", "the result is (B, A, n, d_head): swap only the position and head axes",
          lambda x, a: None if x.shape[1] * a == x.shape[2] else ref_split(x, a).transpose(-2, -1)),
]


def _heads_count_cause(shape: tuple, b: int, n: int, a: int, width: int, previous: tuple | None) -> dict:
    """When the answer has the layout of a split into another number of heads, say so (and whether that count or
    width is the previous case's, i.e. hard-coded)."""
    if not (len(shape) == 4 and shape[0] == b and shape[2] == n and shape[1] != a and shape[1] * shape[3] == width):
        return {}
    heads = f"your result has {shape[1]} heads of width {shape[3]}"
    if previous and (shape[1], shape[3]) == previous:
        cause = (f"{heads}, the split of the previous case: the head count or the head width is hard-coded, while "
                 f"n_heads = {a} asks for {a} heads of width {width // a}")
    elif previous and shape[3] == previous[1]:
        cause = (f"{heads}, the head width of the previous case: the width looks hard-coded, while n_heads = {a} asks "
                 f"for heads of width {width // a}")
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
            out = _tensor(fn(x, a), tried=tried)
        except LearnerRaised as exc:
            raise Failure(learner_error(exc, tried=tried, expected=f"a tensor of shape {(b, a, n, d)}",
                                        **_explain(exc, lambda t: fn(t, a), x))) from None
        if tuple(out.shape) != (b, a, n, d) and not suspects.suspects(out, (x, a)):
            if hint := _heads_count_cause(tuple(out.shape), b, n, a, a * d, previous):
                fail(f"split into {out.shape[1]} heads, not n_heads = {a}", tried=tried,
                     got=f"a result of shape {tuple(out.shape)}", expected=f"shape {(b, a, n, d)}", **hint)
            _shape_in_symbols(out, (b, a, n, d), {"B": b, "A": a, "n": n, "d_head": d}, "(B, A, n, d_head)", tried)
        suspects.expect(out, ref_split(x, a), (x, a), tried=tried, again=fn, factors=factors(A=a, d_head=d, n=n),
                        axes=("batch entries", "heads", "positions", "features"))
        _expect_same_precision(out, x, tried=tried, what="split_heads")
        previous = (a, d)
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
          "instead of the head and position axes before reshaping, so each output row mixes several positions",
          _UNMIXED, lambda x: None if x.shape[2] == x.shape[3] else x.transpose(2, 3).reshape(_MERGED(x))),
    Known("transposed_after", "heads merged without a transpose", "you reshaped to (B, A·d_head, n) and then "
          "transposed, so each output row mixes several positions and features", _UNMIXED,
          lambda x: x.reshape(x.shape[0], -1, x.shape[2]).transpose(1, 2)),
    Known("interleaved", "wrong concat order: features interleaved", "you put the feature axis before the head axis, so "
          "the result is ordered (d_head, A): feature 0 of every head, then feature 1, …", _CONCAT,
          lambda x: x.permute(0, 2, 3, 1).reshape(_MERGED(x))),
    Known("reversed", "wrong concat order: last head first", "you concatenated the heads in reverse order", _CONCAT,
          lambda x: ref_merge(x.flip(1))),
    Known("not_concatenated", "heads not concatenated", "you swapped the axes but did not reshape, so the result is "
          "still (B, n, A, d_head)", "reshape the last two axes into one of size A·d_head", lambda x: x.transpose(1, 2)),
    Known("averaged", "heads averaged instead of concatenated", "you averaged the heads, which leaves d_head features "
          "instead of A·d_head", _CONCAT, lambda x: x.mean(1)),
    Known("summed", "heads summed instead of concatenated", "you summed the heads, which leaves d_head features "
          "instead of A·d_head", _CONCAT, lambda x: x.sum(1)),
    Known("head_0", "only one head kept", "you returned head 0 alone", _CONCAT, lambda x: x[:, 0]),
    *(Sized(f"first_{k}", f"only the first {k} of {{A}} heads concatenated", f"you concatenated heads 0 … {k - 1} "
            f"and dropped the rest: the number of heads looks hard-coded as {k}", "take the number of heads from the "
            "input, x.shape[1]", lambda x, k=k: ref_merge(x[:, :k]) if k < x.shape[1] else None,
            sizes=lambda x: dict(A=x.shape[1])) for k in range(2, 6)),
    *(Known(f"permuted_{''.join(map(str, p))}", f"axes arranged as {_order(p, ('B', 'A', 'n', 'd_head'))} before the "
            "reshape", f"you arranged the axes as {_order(p, ('B', 'A', 'n', 'd_head'))} and then reshaped to "
            "(B, n, A·d_head): a reshape keeps the entries in memory order, so they must be (B, n, A, d_head) first",
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
            out = _tensor(fn(x), tried=tried)
        except LearnerRaised as exc:
            raise Failure(learner_error(exc, tried=tried, expected=f"a tensor of shape {(b, n, a * d)}",
                                        **_explain(exc, fn, x))) from None
        if tuple(out.shape) != (b, n, a * d) and not suspects.suspects(out, (x,)):
            _shape_in_symbols(out, (b, n, a * d), {"B": b, "A": a, "n": n, "d_head": d}, "(B, n, A·d_head)", tried)
        suspects.expect(out, ref_merge(x), (x,), tried=tried, again=fn, factors=factors(A=a, d_head=d, n=n),
                        axes=("batch entries", "positions", "features"))
        _expect_same_precision(out, x, tried=tried, what="merge_heads")
    return (f"matches the reference on {len(_MERGE_CASES)} cases (1 to 6 heads, one position, float32 and "
            "float64) and undoes split_heads")


# ============================================================================ the module: finding its layers
_ROLE_TOKENS = {
    "q": {"q", "query", "queries", "wq"},
    "k": {"k", "key", "keys", "wk"},
    "v": {"v", "value", "values", "wv"},
    "o": {"o", "out", "output", "wo", "c_proj", "proj", "dense"},
    "qkv": {"qkv", "c_attn", "in_proj", "wqkv", "attn"},
}
_ROLE_NAMES = {"q": "W^Q (q_proj)", "k": "W^K (k_proj)", "v": "W^V (v_proj)", "o": "W^O (out_proj)"}


def _role(name: str) -> str | None:
    """Which projection a layer's name says it is (``q_proj``, ``W_q``, ``query``, ``out_proj``, ``c_attn``…)."""
    last = name.rsplit(".", 1)[-1].lower()
    tokens = {t for t in re.split(r"[_\W\d]+", last) if t} | {last}
    return next((role for role in ("qkv", "q", "k", "v", "o") if tokens & _ROLE_TOKENS[role]), None)


def _swapped(p_in: int, p_out: int, want: tuple[int, int]) -> str:
    return (f"nn.Linear takes (in_features, out_features); yours has them the other way round: {p_in} in and {p_out} "
            "out" if (p_in, p_out) == want[::-1] else "")


def _sizes_cause(p_in: int, p_out: int, want: tuple[int, int], a: int, d_head: int, d_model: int) -> str:
    """What a projection's (in, out) sizes say went wrong, when they say it."""
    if swapped := _swapped(p_in, p_out, want):
        return swapped
    if p_in != want[0] or p_out == want[1]:
        return ""
    if p_out == d_model:
        return (f"you projected to d_model = {d_model} features; the heads need A·d_head = {want[1]} (they differ "
                "when d_head ≠ d_model / A)")
    if p_out == a * (d_model // a) and d_model // a != d_head:
        return (f"you used d_head = d_model // n_heads = {d_model // a}: the d_head argument (or its default "
                f"⌈d_model / n_heads⌉ = {d_head}) was ignored")
    if p_out % d_head == 0:
        made = p_out // d_head
        return (f"your projection makes {made} head{'s' if made != 1 else ''} of width d_head = {d_head}, but "
                f"n_heads = {a}: the head count is hard-coded or taken from somewhere else")
    if p_out % a == 0:
        return (f"your projection makes n_heads = {a} heads of width {p_out // a}, but d_head = {d_head} here: the "
                "head width is not the d_head argument (default ⌈d_model / n_heads⌉)")
    return ""


def _layers(info: dict, d_model: int, a: int, d_head: int, tried: str) -> dict:
    """The learner's W^Q, W^K, W^V, W^O as {"q": (linear name, first row), …} after checking their sizes."""
    linears = {name: spec for name, kind, spec in info.get("modules", []) if spec is not None}
    width = a * d_head
    found: dict[str, list[str]] = {}
    for name in linears:
        if role := _role(name):
            found.setdefault(role, []).append(name)
    fused = len(found.get("qkv", [])) == 1 and not all(len(found.get(r, [])) == 1 for r in "qkv")
    named = len(found.get("o", [])) == 1 and (fused or all(len(found.get(r, [])) == 1 for r in "qkv"))
    guessed = not named and len(linears) == 4 and not found
    if guessed:  # four unnamed layers (the Annotated Transformer's clones(nn.Linear, 4)): creation order Q, K, V, O
        found, named = {role: [name] for role, name in zip("qkvo", linears)}, True
    if not named:
        missing = [_ROLE_NAMES[r] for r in "qkvo" if not found.get(r) and not (r != "o" and found.get("qkv"))]
        several = [f"{_ROLE_NAMES[r]}: {', '.join(found[r])}" for r in "qkvo" if len(found.get(r, [])) > 1]
        cause = (f"no nn.Linear layer of yours is named as {_and(missing)}: it was never created in __init__, is not "
                 "an nn.Linear, or has another name" if missing else
                 f"several layers are named as one projection ({'; '.join(several)})")
        fail("W^Q, W^K, W^V, W^O not found", tried=tried,
             got=f"nn.Linear layers: {', '.join(f'{n} ({s[0]} → {s[1]})' for n, s in linears.items()) or 'none'}",
             expected="nn.Linear layers q_proj, k_proj, v_proj (d_model → A·d_head) and out_proj (A·d_head → d_model), "
                      "or one fused qkv_proj (d_model → 3·A·d_head) and out_proj", cause=cause,
             fix="create the projections in __init__ as nn.Linear layers with the names in the docstring")
    if fused:
        name = found["qkv"][0]
        f_in, f_out = linears[name][:2]
        if (f_in, f_out) != (d_model, 3 * width):
            fail(f"the fused projection is nn.Linear({f_in}, {f_out})", tried=tried,
                 got=f"{name} = nn.Linear({f_in}, {f_out})",
                 expected=f"nn.Linear(d_model = {d_model}, 3·A·d_head = {3 * width})",
                 cause=_swapped(f_in, f_out, (d_model, 3 * width)),
                 fix="one fused layer gives q, k and v side by side: nn.Linear(d_model, 3 * n_heads * d_head)")
        roles = {"q": (name, 0), "k": (name, width), "v": (name, 2 * width)}
    else:
        for role in "qkv":
            name = found[role][0]
            p_in, p_out = linears[name][:2]
            got = f"{name} = nn.Linear({p_in}, {p_out})"
            want = f"nn.Linear(d_model = {d_model}, A·d_head = {a}·{d_head} = {width})"
            cause = _sizes_cause(p_in, p_out, (d_model, width), a, d_head, d_model)
            if p_in != d_model:
                fail(f"W^{role.upper()} takes {p_in} inputs, not d_model = {d_model}", tried=tried, got=got,
                     expected=want, cause=cause, fix=f"create {role}_proj = nn.Linear(d_model, n_heads * d_head)")
            if p_out != width:
                fail(f"W^{role.upper()} gives {p_out} outputs, not A·d_head = {width}", tried=tried, got=got,
                     expected=want, cause=cause, fix="use the d_head you are given (default ⌈d_model / n_heads⌉): "
                                                     f"{role}_proj = nn.Linear(d_model, n_heads * d_head)")
        roles = {r: (found[r][0], 0) for r in "qkv"}
    o_name = found["o"][0]
    o_in, o_out = linears[o_name][:2]
    got, want = f"{o_name} = nn.Linear({o_in}, {o_out})", f"nn.Linear({width}, {d_model})"
    if o_in == d_model != width:
        fail("W^O takes d_model inputs, not A·d_head", tried=tried, got=got,
             expected=f"nn.Linear(A·d_head = {a}·{d_head} = {width}, d_model = {d_model})",
             cause=f"you sized W^O for d_model = {d_model} inputs, but the concatenated heads have A·d_head = "
                   f"{width} features (they differ when d_head ≠ d_model / A)",
             fix="create out_proj = nn.Linear(n_heads * d_head, d_model)")
    if (o_in, o_out) != (width, d_model):
        fail(f"W^O takes {o_in} inputs, not A·d_head = {width}" if o_in != width else
             f"W^O gives {o_out} outputs, not d_model = {d_model}", tried=tried, got=got, expected=want,
             cause=_swapped(o_in, o_out, (width, d_model)),
             fix="W^O maps the concatenated heads back to d_model: nn.Linear(n_heads * d_head, d_model)")
    return {**roles, "o": (o_name, 0), "fused": fused, "guessed": guessed}


def _weights_for(layers: dict, linears: dict, d_model: int, width: int, gen: torch.Generator) -> tuple[dict, dict]:
    """Seeded W^Q, W^K, W^V, W^O and biases: (float64 values for the oracle, float32 tensors by parameter name)."""
    P, params = {}, {}
    for role, fan_in, fan_out in (("q", d_model, width), ("k", d_model, width), ("v", d_model, width), ("o", width, d_model)):
        w = torch.randn(fan_out, fan_in, generator=gen, dtype=torch.float64) * 1.2 / math.sqrt(fan_in)
        b = 0.3 * torch.randn(fan_out, generator=gen, dtype=torch.float64)
        if not linears[layers[role][0]][2]:
            b = torch.zeros(fan_out, dtype=torch.float64)  # the learner's layer has no bias
        P[role] = (w.to(torch.float32).to(torch.float64), b.to(torch.float32).to(torch.float64))
    groups = [("qkv", layers["q"][0])] if layers["fused"] else [(r, layers[r][0]) for r in "qkv"]
    for roles, name in [*groups, ("o", layers["o"][0])]:
        params[f"{name}.weight"] = torch.cat([P[r][0] for r in roles]).to(torch.float32)
        if linears[name][2]:
            params[f"{name}.bias"] = torch.cat([P[r][1] for r in roles]).to(torch.float32)
    return P, params


# ============================================================================ the module: oracle and mistakes
_MASKING = {  # how a mistake turns the scores s (B, A, n_q, n_k) and the broadcast mask m into weights
    "inverted": lambda s, m, dim: masked_softmax(s, ~m, dim),
    "ignored": lambda s, m, dim: torch.softmax(s, dim),
    "after": lambda s, m, dim: torch.softmax(s, dim) * m,
    "nan": lambda s, m, dim: torch.softmax(s.masked_fill(~m, float("-inf")), dim),
    "finite": lambda s, m, dim: torch.softmax(s.masked_fill(~m, -1e9), dim),
    "transposed": lambda s, m, dim: masked_softmax(s, m.transpose(-2, -1), dim),
    "added": lambda s, m, dim: torch.softmax(s + m.to(s.dtype), dim),
    "zero_fill": lambda s, m, dim: torch.softmax(s.masked_fill(~m, 0.0), dim),
    # a (B·A, …) mask built head-major for batch-major scores
    "heads_batch_mixed": lambda s, m, dim: masked_softmax(s, m.transpose(0, 1).reshape(m.shape), dim),
}
_MERGES = {  # (B, A, n_q, d_head) → (B, n_q, A·d_head), right or wrong
    "ok": ref_merge, "no_transpose": lambda h: h.reshape(h.shape[0], h.shape[2], -1),
    "interleaved": lambda h: h.permute(0, 2, 3, 1).flatten(2), "reversed": lambda h: ref_merge(h.flip(1)),
}
_POST = {"": lambda out, x: out, "residual": lambda out, x: out + x,
         "layer_norm": lambda out, x: nn.functional.layer_norm(out, out.shape[-1:]),
         "residual_layer_norm": lambda out, x: nn.functional.layer_norm(out + x, out.shape[-1:])}


def _multihead(P: dict, x_q: torch.Tensor, x_kv: torch.Tensor | None, mask: torch.Tensor | None, a: int,
               d_head: int, *, scale: float | None = None, split: str = "ok", merge: str = "ok", dim: int = -1,
               out_proj: bool = True, mask_mode: str = "ok", kv_source: str = "x_kv", q_source: str = "x_q",
               v_weights: str = "v", scale_after: float = 0.0, k_source: str | None = None, roles: str = "qkv",
               returns: str = "weights", v_scale: float = 1.0, post: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """(out, weights) of multi-head attention from plain float64 tensors, or of one classic mistake in it.
    ``roles`` names the projections used for the queries, keys and values (``"kqv"``: W^K for the queries…);
    ``returns`` what comes back as the weights (``"scores"``: the scaled scores after masking, ``"raw_scores"``)."""
    x_q = x_q.to(torch.float64)
    src = {"x_q": x_q, "x_kv": x_q if x_kv is None else x_kv.to(torch.float64)}
    heads = {"ok": lambda t: ref_split(t, a), "no_transpose": lambda t: t.reshape(t.shape[0], a, t.shape[1], -1),
             "strided": lambda t: t.reshape(*t.shape[:2], -1, a).permute(0, 3, 1, 2)}[split]
    proj = lambda role, t: heads(t @ P[role][0].T + P[role][1])  # noqa: E731 - (B, A, n, d_head)
    q = proj(roles[0], src[q_source])  # (B, A, n_q, d_head)
    k = proj(roles[1], src[k_source or kv_source])  # (B, A, n_k, d_head)
    v = proj(roles[2], x_q if v_weights == "v_from_x_q" else src[kv_source])  # (B, A, n_k, d_head)
    scores = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(d_head) if scale is None else scale)  # (B, A, n_q, n_k)
    raw = scores
    if mask_mode == "causal":  # a causal mask built inside forward, whatever mask was given
        mask, mask_mode = torch.ones(scores.shape[-2:], dtype=torch.bool).tril(), "ok"
    full = None if mask is None else torch.broadcast_to(mask, scores.shape)
    weights = _MASKING[mask_mode](scores, full, dim) if full is not None and mask_mode != "ok" else \
        masked_softmax(scores, mask, dim)  # (B, A, n_q, n_k)
    if full is not None:
        scores = scores.masked_fill(~full, float("-inf"))
    if scale_after:
        weights = weights * scale_after  # the mistake of scaling the weights instead of the scores
    cat = _MERGES[merge](weights @ (v * v_scale))  # (B, n_q, A·d_head)
    out = cat @ P["o"][0].T + P["o"][1] if out_proj else cat  # (B, n_q, d_model)
    return _POST[post](out, x_q), {"weights": weights, "scores": scores, "raw_scores": raw}[returns]


def _fused_per_head(P: dict, a: int, d_head: int) -> dict:
    """The W^Q, W^K, W^V a learner gets who splits a fused qkv_proj head by head — (B, n, A, 3·d_head), then
    chunk(3) — instead of into three blocks q | k | v."""
    w, b = torch.cat([P[r][0] for r in "qkv"]), torch.cat([P[r][1] for r in "qkv"])  # as the check loads them
    rows = {r: torch.tensor([h * 3 * d_head + i * d_head + j for h in range(a) for j in range(d_head)])
            for i, r in enumerate("qkv")}
    return {**P, **{r: (w[rows[r]], b[rows[r]]) for r in "qkv"}}


def _oracle(P: dict, x_q, x_kv, mask, a: int, d_head: int, d_model: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(out, weights, whether nn.MultiheadAttention gave them)."""
    x_q64 = x_q.to(torch.float64)
    x_kv64 = x_q64 if x_kv is None else x_kv.to(torch.float64)
    b, n_q, n_k = x_q.shape[0], x_q.shape[1], x_kv64.shape[1]
    if a * d_head != d_model or (mask is not None and bool((~torch.broadcast_to(mask, (b, a, n_q, n_k))).all(-1).any())):
        return (*_multihead(P, x_q, x_kv, mask, a, d_head), False)
    torch_mha = nn.MultiheadAttention(d_model, a, batch_first=True, dtype=torch.float64).eval()
    with torch.no_grad():
        torch_mha.in_proj_weight.copy_(torch.cat([P[r][0] for r in "qkv"]))
        torch_mha.in_proj_bias.copy_(torch.cat([P[r][1] for r in "qkv"]))
        torch_mha.out_proj.weight.copy_(P["o"][0])
        torch_mha.out_proj.bias.copy_(P["o"][1])
        out, w = torch_mha(x_q64, x_kv64, x_kv64, attn_mask=torch_masks(mask, batch=b, n_heads=a, n_q=n_q, n_k=n_k),
                           average_attn_weights=False)
    return out, w, True


class _Case:
    """One forward call of the module check, as the mistakes' ``make(case, view)`` sees it: the seeded weights,
    inputs and sizes; the oracle's (out, weights) and every mistake's, each computed once."""

    def __init__(self, P: dict, x_q, x_kv, mask, a: int, d_head: int, d_model: int, fused: bool):
        self.P, self.x_q, self.x_kv, self.mask, self.a, self.d_head, self.fused = P, x_q, x_kv, mask, a, d_head, fused
        self.out, self.weights, self.by_torch = _oracle(P, x_q, x_kv, mask, a, d_head, d_model)
        self.split_width = abs(d_model / a - d_head) > 1e-9  # d_head ≠ d_model / A
        self.width_differs = a * d_head != d_model
        self.words = dict(ratio=f"{d_model / a:g}", d_head=d_head, none=" — here none was given" if mask is None else "",
                          also="" if self.width_differs else " (here also √(A·d_head), the width of all heads together)")
        self.scales = {"1/√d_model": 1 / math.sqrt(d_model), "1/d_head": 1 / d_head, "√d_head": math.sqrt(d_head),
                       "1/√(d_model/A)": 1 / math.sqrt(d_model / a), "1/√(A·d_head)": 1 / math.sqrt(a * d_head),
                       "1/√d_head": 1 / math.sqrt(d_head)}
        self._memo: dict = {}

    def part(self, view: str, per_head: bool = False, **kw) -> torch.Tensor | None:
        """``view`` ("out" or "weights") of the mistake that ``kw`` names (a factor by its name in ``scales``;
        ``per_head``: qkv_proj split head by head)."""
        kw = {k: self.scales[v] if k in ("scale", "scale_after", "v_scale") and isinstance(v, str) else v
              for k, v in kw.items()}
        key = (per_head, *sorted(kw.items()))
        if key not in self._memo:
            P = _fused_per_head(self.P, self.a, self.d_head) if per_head else self.P
            try:
                self._memo[key] = _multihead(P, self.x_q, self.x_kv, self.mask, self.a, self.d_head, **kw)
            except Exception:  # noqa: BLE001 - this mistake cannot run on this case (lengths differ…)
                self._memo[key] = None
        pair = self._memo[key]
        return None if pair is None else pair[0 if view == "out" else 1]


def _m(key: str, summary: str, cause: str, fix: str, when: Callable[[_Case], bool] | None = None, **kw) -> Sized:
    """A mistake of the module: :func:`_multihead` with ``kw``, on the cases where ``when(case)`` holds."""
    return Sized(key, summary, cause, fix, lambda c, view: c.part(view, **kw) if when is None or when(c) else None,
                 sizes=lambda c, view: c.words)


_CONCAT_FIX = "concatenate whole heads, head 0 first: transpose to (B, n_q, A, d_head), then reshape"
_MASK_FIX = "fill the scores where the mask is False with -inf before the softmax, or use masked_softmax(scores, mask)"
_SCALE_FIX = "divide by math.sqrt(d_head)"
_SOFTMAX_FIX = "take it over the keys, dim=-1"
_EMPTY_FIX = "the course's rule gives such a row zero weights: use masked_softmax(scores, mask) from attn_course.softmax"
_BLOCK = "return out_proj(concatenated heads) as it is"
_CROSS, _MASKED = (lambda c: c.x_kv is not None), (lambda c: c.mask is not None)
_FUSED_ORDERS = {"kqv": "k, q, v", "qvk": "q, v, k", "vkq": "v, k, q", "kvq": "k, v, q", "vqk": "v, q, k"}

MODULE_MISTAKES = [
    _m("split_no_transpose", "heads split without a transpose", "you reshaped the projections straight to "
       "(B, A, n, d_head), so each head mixes several positions (heads mixed with positions)",
       "reshape to (B, n, A, d_head), then .transpose(1, 2)", split="no_transpose"),
    _m("split_strided", "features split in the wrong order", "you reshaped the last axis as (d_head, A), so head h got "
       "every A-th feature instead of a block of d_head", "reshape the last axis as (A, d_head)", split="strided"),
    _m("sqrt_d_model", "scaled by √d_model, not √d_head", "you divided the scores by √d_model{also}; each head's dot "
       "product has only d_head terms", _SCALE_FIX, scale="1/√d_model"),
    _m("unscaled", "scores not scaled", "you did not divide the scores by √d_head", "divide q @ kᵀ by math.sqrt(d_head)",
       scale=1.0),
    _m("d_head", "divided by d_head instead of √d_head", "you divided the scores by d_head", _SCALE_FIX,
       scale="1/d_head"),
    _m("times_sqrt", "multiplied by √d_head", "you multiplied the scores by √d_head", _SCALE_FIX, scale="√d_head"),
    _m("softmax_queries", "softmax over the queries", "you took the softmax over axis -2 (the queries)",
       "take it over the keys, dim=-1: each query's row of weights sums to 1", dim=-2),
    _m("softmax_heads", "softmax over the heads", "you took the softmax over axis 1, the heads of (B, A, n_q, n_k)",
       _SOFTMAX_FIX, dim=1),
    _m("softmax_batch", "softmax over the batch", "you took the softmax over axis 0, the batch of (B, A, n_q, n_k)",
       _SOFTMAX_FIX, dim=0),
    *(_m(f"weights_scaled{i}", "weights scaled instead of the scores", "you divided the weights by √d_head after the "
         "softmax, so the rows sum to 1/√d_head", "divide the scores q @ kᵀ by √d_head before the softmax",
         scale_after="1/√d_head", **kw) for i, kw in enumerate(({"scale": 1.0}, {}))),
    _m("qk_swapped", "queries and keys swapped", "your scores are k·qᵀ instead of q·kᵀ (W^K used for the queries and "
       "W^Q for the keys, or k @ q.transpose(-2, -1))", "q = q_proj(x_q), k = k_proj(x_kv), scores = "
       "q @ k.transpose(-2, -1)", when=lambda c: not c.fused, roles="kqv"),  # fused: a split order, below
    _m("v_with_w_k", "values projected with W^K", "you computed the values with k_proj instead of v_proj",
       "v = v_proj(x_kv)", roles="qkk"),
    _m("merge_no_transpose", "heads merged without a transpose", "you reshaped (B, A, n_q, d_head) straight to "
       "(B, n_q, A·d_head), so each output row mixes several positions (heads mixed with positions)", _CONCAT_FIX,
       merge="no_transpose"),
    _m("merge_interleaved", "wrong concat order: features interleaved", "you concatenated feature by feature, ordered "
       "(d_head, A), instead of head by head", _CONCAT_FIX, merge="interleaved"),
    _m("merge_reversed", "wrong concat order: last head first", "you concatenated the heads in reverse order",
       _CONCAT_FIX, merge="reversed"),
    _m("no_out_proj", "W^O not applied", "you returned the concatenated heads without passing them through out_proj",
       "return self.out_proj(concatenated heads)", out_proj=False),
    _m("values_scaled", "values scaled instead of the scores", "you divided the values (or the heads' outputs) by "
       "√d_head; the scaling belongs to the scores q·kᵀ, before the softmax",
       "scale only the scores: (q @ k.transpose(-2, -1)) / math.sqrt(d_head)", v_scale="1/√d_head"),
    _m("residual", "residual added inside attention", "your out is the attention output plus x_q: the residual "
       "connection belongs to the transformer block around attention, not to attention itself",
       "return out_proj(concatenated heads) without adding x_q", post="residual"),
    _m("layer_norm", "layer norm inside attention", "you applied a layer norm to out: normalisation belongs to the "
       "transformer block around attention, not to attention itself", _BLOCK, post="layer_norm"),
    _m("residual_layer_norm", "residual and layer norm inside attention", "your out is layer_norm(attention output + "
       "x_q), a whole post-norm sub-layer: the residual and the norm belong to the transformer block around attention",
       _BLOCK, post="residual_layer_norm"),
    _m("q_with_w_k", "queries projected with W^K", "you computed the queries with k_proj instead of q_proj",
       "q = q_proj(x_q)", roles="kkv"),
    _m("k_with_w_q", "keys projected with W^Q", "you computed the keys with q_proj instead of k_proj",
       "k = k_proj(x_kv)", roles="qqv"),
    *(_m(f"scores_returned{i}", "scores returned as the weights", "you returned the scaled scores q·kᵀ/√d_head, not "
         "their softmax", "return the weights, softmax(scores) over the keys", returns=r) for i, r in
      enumerate(("scores", "raw_scores"))),
    _m("raw_scores_returned", "scores returned as the weights", "you returned the scores q·kᵀ (not even scaled), not "
       "their softmax", "return the weights, softmax(q·kᵀ/√d_head) over the keys", returns="raw_scores", scale=1.0),
    _m("always_causal", "always causal", "you applied a causal mask (each query sees itself and the keys before it) "
       "whatever the mask argument says{none}", "use the mask you are given (None: every key allowed); a causal mask is "
       "the caller's choice", mask_mode="causal"),
    _m("sqrt_d_model_over_a", "scaled by √(d_model / A), not √d_head", "you divided the scores by √(d_model / n_heads) "
       "= √{ratio}; each head's dot product has d_head = {d_head} terms (d_head is given, or rounded up, so it need "
       "not be d_model / A)", _SCALE_FIX, when=lambda c: c.split_width, scale="1/√(d_model/A)"),
    *(_m(f"fused_{order}", f"qkv_proj split in the order {said}", f"you took qkv_proj's three blocks in the order "
         f"{said}; the docstring orders them q, k, v", "q, k, v = qkv.split(n_heads * d_head, dim=-1), in that order",
         when=lambda c: c.fused, roles=order) for order, said in _FUSED_ORDERS.items()),
    _m("fused_per_head", "qkv_proj split head by head", "you reshaped qkv_proj's output to (…, A, 3·d_head) and split "
       "each head's piece into q, k, v; the docstring's qkv_proj holds three blocks side by side, all of q, then all "
       "of k, then all of v", "split first, into three blocks of n_heads·d_head (qkv.split(n_heads * d_head, dim=-1)), "
       "then split each into heads", when=lambda c: c.fused, per_head=True),
    _m("sqrt_width", "scaled by √(A·d_head)", "you divided the scores by √(A·d_head), the width of all heads together",
       "divide by math.sqrt(d_head), one head's width", when=lambda c: c.width_differs, scale="1/√(A·d_head)"),
    _m("x_kv_ignored", "x_kv ignored: keys and values from x_q", "you computed the keys and values from x_q, so this "
       "is self-attention even when x_kv is given", "k = k_proj(x_kv), v = v_proj(x_kv); use x_q only when x_kv is "
       "None", when=_CROSS, kv_source="x_q"),
    _m("v_from_x_q", "values from x_q in cross-attention", "you computed the keys from x_kv but the values from x_q",
       "v = v_proj(x_kv)", when=_CROSS, v_weights="v_from_x_q"),
    _m("k_from_x_q", "keys from x_q in cross-attention", "you computed the values from x_kv but the keys from x_q",
       "k = k_proj(x_kv)", when=_CROSS, k_source="x_q"),
    _m("q_from_x_kv", "queries from x_kv in cross-attention", "you computed the queries from x_kv; they come from x_q "
       "(the keys and values from x_kv)", "q = q_proj(x_q)", when=_CROSS, q_source="x_kv"),
    _m("x_swapped", "x_q and x_kv swapped", "you took the queries from x_kv and the keys and values from x_q",
       "queries come from x_q, keys and values from x_kv", when=_CROSS, q_source="x_kv", kv_source="x_q"),
    _m("mask_inverted", "mask polarity inverted", "you blocked the positions where the mask is True; in this course (as "
       "in F.scaled_dot_product_attention) True means 'may attend' — nn.MultiheadAttention's masks are the ones where "
       "True means blocked", "fill the scores where the mask is False: scores.masked_fill(~mask, float('-inf'))",
       when=_MASKED, mask_mode="inverted"),
    _m("mask_ignored", "mask ignored", "you did not use the mask, so blocked keys still get weight", _MASK_FIX,
       when=_MASKED, mask_mode="ignored"),
    _m("mask_after", "mask applied after the softmax", "you zeroed the weights after the softmax, so the rows no longer "
       "sum to 1", "mask the scores before the softmax", when=_MASKED, mask_mode="after"),
    _m("mask_transposed", "mask transposed", "you applied the mask with its rows and columns swapped (rows are "
       "queries, columns keys)", "use mask[..., i, j] for query i and key j, as given", when=_MASKED,
       mask_mode="transposed"),
    _m("mask_zero_fill", "blocked scores set to 0", "you filled the blocked scores with 0 instead of -inf, so blocked "
       "keys still get weight (e^0 = 1 against the others)", _MASK_FIX, when=_MASKED, mask_mode="zero_fill"),
    _m("mask_added", "bool mask added to the scores", "you added the boolean mask to the scores: True counts as +1, "
       "which blocks nothing", _MASK_FIX, when=_MASKED, mask_mode="added"),
    _m("mask_heads_batch", "mask matched to the wrong batch entries and heads", "you flattened the mask to "
       "(B·A, n_q, n_k) head by head while the scores are flattened batch entry by batch entry (repeat vs "
       "repeat_interleave)", "let the mask broadcast: a (B, 1, n_q, n_k) mask against (B, A, n_q, n_k) scores needs "
       "no reshaping", when=_MASKED, mask_mode="heads_batch_mixed"),
    _m("mask_nan", "NaN on a fully masked row", "a query whose keys are all blocked got softmax of -inf everywhere, "
       "which is 0/0 = NaN", _EMPTY_FIX, when=_MASKED, mask_mode="nan"),
    _m("mask_finite", "uniform weights on a fully masked row", "you filled blocked scores with a finite number, so a "
       "query whose keys are all blocked spreads its weight evenly over them", _EMPTY_FIX + " (or fill with -inf and "
       "zero the rows that are all -inf)", when=_MASKED, mask_mode="finite"),
    Known("weights_averaged", "weights averaged over the heads", "you returned one (n_q, n_k) matrix per batch entry, "
          "the mean over heads (nn.MultiheadAttention's default)", "return every head's weights, shaped (B, A, n_q, n_k)",
          lambda c, view: c.weights.mean(1) if view == "weights" else None),
]


# ============================================================================ the module: cases and check
def _cases() -> list[dict]:
    from ..masks import causal_mask

    g = torch.Generator().manual_seed(11)
    lengths = torch.tensor([6, 3])
    key_padding = (torch.arange(6) < lengths[:, None])[:, None, None, :]  # (2, 1, 1, 6)
    decoder = causal_mask(5) & (torch.arange(5) < torch.tensor([5, 2])[:, None])[:, None, None, :]  # (2, 1, 5, 5)
    per_head = torch.rand(2, 3, 4, 6, generator=g) < 0.5  # (B, A, n_q, n_k)
    per_head[..., 0] = True  # no fully masked row here
    per_head[1, :, :, 0] = False
    per_head[1, :, :, 5] = True
    fully = torch.ones(2, 1, 4, 4, dtype=torch.bool)  # (B, 1, n_q, n_k)
    fully[1, 0, 2] = False  # query 2 of sequence 1 may attend to nothing
    fully[0, 0, :, 3] = False
    return [
        dict(name="self-attention, d_model = 15, 3 heads of 5", d=15, a=3, h=5, b=2, n=7),
        dict(name="A·d_head ≠ d_model: d_model = 10, 3 heads of 4", d=10, a=3, h=4, b=2, n=4),
        dict(name="A·d_head ≠ d_model: d_model = 6, 2 heads of 5", d=6, a=2, h=5, b=2, n=3),
        dict(name="default d_head: MultiHeadAttention(16, 4), heads of 16 / 4 = 4", d=16, a=4, h=None, b=1, n=6),
        dict(name="default d_head when 4 heads do not divide d_model = 10: ⌈10 / 4⌉ = 3", d=10, a=4, h=None, b=2, n=3),
        dict(name="one head and one position", d=4, a=1, h=4, b=3, n=1),
        dict(name="6 heads of width 1", d=6, a=6, h=1, b=2, n=4),
        dict(name="a causal mask (5, 5)", d=12, a=3, h=4, b=2, n=5, mask=causal_mask(5)),
        dict(name="cross-attention, x_kv another sequence of the same length", d=10, a=2, h=4, b=2, n=5, m=5),
        dict(name="cross-attention, x_kv with n_k = 7 keys for n_q = 4 queries", d=12, a=2, h=6, b=2, n=4, m=7),
        dict(name="cross-attention with a key-padding mask (2, 1, 1, 6)", d=12, a=3, h=4, b=2, n=3, m=6, mask=key_padding),
        dict(name="a decoder mask (2, 1, 5, 5): causal and padding", d=8, a=2, h=4, b=2, n=5, mask=decoder),
        dict(name="a different mask per head (2, 3, 4, 6), cross-attention", d=9, a=3, h=3, b=2, n=4, m=6, mask=per_head),
        dict(name="a fully masked row (query 2 of sequence 1 may attend to nothing)", d=8, a=2, h=4, b=2, n=4,
             mask=fully),
    ]


def _describe(case: dict) -> str:
    b, n, d = case["b"], case["n"], case["d"]
    call = f"MultiHeadAttention({d}, {case['a']}{', ' + str(case['h']) if case['h'] is not None else ''})"
    args = f"x_q {(b, n, d)}" + (f", x_kv {(b, case['m'], d)}" if case.get("m") else ", x_kv=None")
    if case.get("mask") is not None:
        args += f", mask {tuple(case['mask'].shape)}"
    return f"{call} then forward({args}) — {case['name']}"


def _unpack(result, tried: str, b: int, a: int, n_q: int, n_k: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    expected = f"a pair (out, weights): out {(b, n_q, d)}, weights {(b, a, n_q, n_k)}"
    if isinstance(result, torch.Tensor):
        fail("forward returned one tensor, not (out, weights)", tried=tried, got=f"one tensor of shape {tuple(result.shape)}",
             expected=expected, fix="end forward with `return self.out_proj(...), weights`")
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        got = f"a {type(result).__name__} of {len(result)} items" if isinstance(result, (tuple, list)) else type(result).__name__
        fail("forward did not return (out, weights)", tried=tried, got=got, expected=expected,
             fix="end forward with `return out, weights`")
    first, second = result
    shape = lambda t: tuple(t.shape) if isinstance(t, (torch.Tensor, np.ndarray)) else None  # noqa: E731
    if shape(first) == (b, a, n_q, n_k) and shape(second) == (b, n_q, d):
        fail("forward returned (weights, out), not (out, weights)", tried=tried,
             got=f"first a tensor of shape {(b, a, n_q, n_k)} (the weights), then one of shape {(b, n_q, d)} (out)",
             expected=expected, cause="you returned the two results in the opposite order",
             fix="end forward with `return out, weights`")
    return (as_tensor(first, tried=tried, what="out (the first value forward returns)"),
            as_tensor(second, tried=tried, what="the weights (the second value forward returns)"))


def _forward_accepts_three(info: dict) -> bool:
    sig = info.get("forward_signature") or []
    return any(p["kind"] == "VAR_POSITIONAL" for p in sig) or \
        len([p for p in sig if p["kind"] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]) >= 3


def _forward_hint(exc: LearnerRaised, mask, n: int, m: int | None, wide: bool) -> dict:
    """Cause and fix of an exception in forward, from what this case adds to the plain one (``wide``: A·d_head ≠
    d_model)."""
    shapeish = any(w in exc.message for w in ("size", "shape", "dimension", "broadcast", "match"))
    if mask is not None and shapeish:
        return dict(cause=f"the same module ran without a mask; with the mask {tuple(mask.shape)} it fails, so the mask "
                          "does not broadcast against the scores (B, A, n_q, n_k): adding an axis (unsqueeze) or "
                          "reshaping it moves its axes",
                    fix="use the mask as it is: (n_q, n_k), (B, 1, n_q, n_k), (B, 1, 1, n_k) and (B, A, n_q, n_k) all "
                        "broadcast against (B, A, n_q, n_k)")
    if m is not None and m != n and shapeish:
        return dict(cause=f"with x_kv of {m} positions and x_q of {n}, your code mixes the two lengths: keys and values "
                          "come from x_kv (n_k rows), queries from x_q (n_q rows)",
                    fix="k = k_proj(x_kv), v = v_proj(x_kv); reshape each with its own length")
    if bool_hint(exc):
        return bool_hint(exc)
    if wide and shapeish:
        return dict(cause="your forward assumes A·d_head = d_model somewhere (a reshape to d_model, or d_model // n_heads "
                          "as the head width)", fix="reshape with n_heads and d_head, and merge to n_heads·d_head features")
    return explain_raise(exc, patterns=_PATTERNS)


_PARTS = (("weights", "the weights", ("batch entries", "heads", "queries", "keys"),
           "return the weights of every head, shaped (B, A, n_q, n_k)"),
          ("out", "out", ("batch entries", "queries", "features"),
           "out has one row per query and d_model features: (B, n_q, d_model)"))


@check("MultiHeadAttention", kind="class",
       expects="an nn.Module class MultiHeadAttention(d_model, n_heads, d_head=None) whose forward(x_q, x_kv=None, "
               "mask=None) returns (out, weights)")
def check_MultiHeadAttention(cls: Learner) -> str:
    info = cls.inspect()
    if not info.get("module_class"):
        fail("MultiHeadAttention is not an nn.Module", tried="checking the class MultiHeadAttention",
             got=f"a class with bases {', '.join(info.get('bases') or []) or 'object'}",
             expected="a subclass of nn.Module", fix="define `class MultiHeadAttention(nn.Module):` and call "
             "super().__init__() first in __init__")
    gen = torch.Generator().manual_seed(4)
    suspects = Suspects(MODULE_MISTAKES, atol=2e-5, rtol=1e-4)
    with_torch, cases = 0, _cases()
    for case in cases:
        d, a, b, n, m, mask = case["d"], case["a"], case["b"], case["n"], case.get("m"), case.get("mask")
        d_head = case["h"] if case["h"] is not None else -(-d // a)
        tried = _describe(case)
        try:
            module = cls.construct(d, a, case["h"]) if case["h"] is not None else cls.construct(d, a)
        except LearnerRaised as exc:
            hint = explain_raise(exc, patterns=_PATTERNS)
            if d % a and exc.type_name in ("AssertionError", "ValueError"):
                hint = dict(cause=f"your __init__ refuses d_model = {d} with {a} heads; with d_head given (or its "
                                  "default ⌈d_model / n_heads⌉) A need not divide d_model",
                            fix="drop the divisibility requirement: W^Q maps d_model → n_heads·d_head, W^O maps it back")
            raise Failure(learner_error(exc, tried=tried, expected="a module", **hint)) from None
        minfo = module.inspect()
        if minfo.get("kind") != "module":
            fail("MultiHeadAttention(...) is not an nn.Module", tried=tried, got=str(minfo.get("type")),
                 expected="an nn.Module", fix="define `class MultiHeadAttention(nn.Module):`")
        module.method("eval")()  # a deterministic forward: dropout, if the learner added any, off
        layers = _layers(minfo, d, a, d_head, tried)
        linears = {name: spec for name, kind, spec in minfo.get("modules", []) if spec is not None}
        P, params = _weights_for(layers, linears, d, a * d_head, gen)
        try:
            module.set_parameters(params)
        except LearnerRaised as exc:
            raise Failure(learner_error(exc, tried=f"loading weights into {tried}", expected="nn.Linear layers")) from None
        x_q = torch.randn(b, n, d, generator=gen)
        x_kv = torch.randn(b, m, d, generator=gen) if m else None
        if (m or mask is not None) and not _forward_accepts_three(minfo):
            fail("forward does not take (x_q, x_kv=None, mask=None)", tried=tried,
                 got=f"forward({', '.join(p['name'] for p in minfo.get('forward_signature') or [])})",
                 expected="forward(x_q, x_kv=None, mask=None)",
                 fix="add the parameters x_kv=None (keys and values from x_q when None) and mask=None")
        args = (x_q,) if m is None and mask is None else (x_q, x_kv) if mask is None else (x_q, x_kv, mask)
        try:
            result = module(*args)
        except LearnerRaised as exc:
            raise Failure(learner_error(exc, tried=tried, expected="(out, weights)",
                                        **_forward_hint(exc, mask, n, m, a * d_head != d))) from None
        got = dict(zip(("out", "weights"), _unpack(result, tried, b, a, n, m or n, d)))
        ctx = _Case(P, x_q, x_kv, mask, a, d_head, d, layers["fused"])
        with_torch += ctx.by_torch
        mine = lambda c, view: got[view] if c is ctx else None  # noqa: E731 - the learner's answer, for the engine
        try:
            for view, what, axes, fix in _PARTS:  # the weights first: out depends on them
                want = getattr(ctx, view)
                suspects.expect(got[view], want, (ctx, view), tried=tried, again=mine, distinguish=[(ctx, "out")],
                                what=what, axes=axes, fix=fix if got[view].shape != want.shape else "")
        except Failure as failure:
            _explain_mismatch(failure, module, args, result, got["out"], got["weights"], ctx, tried)
            if layers["guessed"] and not failure.diagnosis.cause:
                failure.diagnosis.cause = (f"your four nn.Linear layers ({', '.join(linears)}) have no names that say "
                                           "which is which, so the check took them in the order they were created as "
                                           "W^Q, W^K, W^V, W^O")
                failure.diagnosis.fix = ("name them q_proj, k_proj, v_proj and out_proj as the docstring says (or create "
                                         "them in that order); then compare your steps with the docstring")
            raise
        if case is cases[0]:
            _expect_gradient(module, P, x_q, a, d_head, tried, gen)
    return (f"matches nn.MultiheadAttention on {with_torch} cases (weights copied) and the float64 reference on "
            f"{len(cases) - with_torch} (A·d_head ≠ d_model, a fully masked row): self-, causal and cross-attention, "
            "masks of four shapes")
def _explain_mismatch(failure: Failure, module: Learner, args: tuple, result, out: torch.Tensor,
                      weights: torch.Tensor, ctx: _Case, tried: str) -> None:
    """Add what the evidence says to a mismatch that neither a known mistake nor the comparison layer's probes
    (the right values reordered, repeated or mapped) explain: another scale of the scores, weight rows that do
    not sum to 1 or ignore the mask, out off by one vector, randomness (a second identical call gives other
    numbers), a difference confined to fully masked queries."""
    d = failure.diagnosis
    if d.cause:
        return
    P, x_q, x_kv, mask, a, d_head = ctx.P, ctx.x_q, ctx.x_kv, ctx.mask, ctx.a, ctx.d_head
    want_out, want_w = ctx.out, ctx.weights
    try:
        again = module(*args)
    except (LearnerRaised, LearnerTimedOut):
        again = None
    if isinstance(again, (tuple, list)) and len(again) == 2 and all(isinstance(t, torch.Tensor) for t in again) \
            and not all(isinstance(u, torch.Tensor) and same(t, u, atol=0.0, rtol=0.0) for t, u in zip(again, result)):
        fail("different results for the same input", tried=tried + ", twice",
             got="two calls with the same input, in eval() mode, gave different numbers", expected="the same result",
             cause="something random runs in forward even in eval() mode: dropout that ignores self.training "
                   "(F.dropout(w, p) drops by default, training=True) or random numbers drawn in forward",
             fix="use an nn.Dropout layer (eval() turns it off) or F.dropout(w, p, training=self.training)")
    weights_ok = tuple(weights.shape) == tuple(want_w.shape) and same(weights, want_w, atol=2e-5, rtol=1e-4)
    if weights_ok and tuple(out.shape) == tuple(want_out.shape):
        diff = (out.to(torch.float64) - want_out).flatten(0, -2)  # (B·n_q, d_model)
        if diff.shape[0] > 1 and same(diff, diff[:1].expand_as(diff), atol=2e-5, rtol=1e-4):
            bias = P["o"][1]
            if same(diff[0], -bias, atol=2e-5, rtol=1e-4):
                d.summary, d.cause = "out_proj's bias not added", ("your out is the expected one minus out_proj's bias "
                                                                  "at every position: W^O was applied without its bias")
            elif same(diff[0], bias, atol=2e-5, rtol=1e-4):
                d.summary, d.cause = "out_proj's bias added twice", ("your out is the expected one plus out_proj's "
                                                                    "bias at every position")
            else:
                d.summary, d.cause = "out off by one vector at every position", (
                    "your out differs from the expected one by the same vector at every batch entry and query: a "
                    "constant (a bias) added or missing")
            return
    elif tuple(weights.shape) == tuple(want_w.shape) and weights.is_floating_point():
        scale = _fitted_scale(P, x_q, x_kv, mask, a, d_head, weights)
        if scale is not None:
            named = {"1/(2·√d_head)": 1 / (2 * math.sqrt(d_head)), "1/√n_heads": 1 / math.sqrt(a),
                     "1/(n_heads·√d_head)": 1 / (a * math.sqrt(d_head)), "1/d_head²": 1 / d_head ** 2,
                     "2/√d_head": 2 / math.sqrt(d_head), "−1/√d_head": -1 / math.sqrt(d_head)}
            name = next((k for k, v in named.items() if abs(scale - v) <= 1e-3 * abs(v)), "")
            d.summary = f"scores multiplied by {name or fmt(scale)}, not 1/√d_head"
            d.cause = (f"your weights are the softmax of q·kᵀ × {fmt(scale)} (= 1/{fmt(1 / scale)}"
                       + (f", that is {name}" if name else "") + f"); the scale is 1/√d_head = 1/{fmt(math.sqrt(d_head))}")
            d.fix = "divide the scores q @ k.transpose(-2, -1) by math.sqrt(d_head), once"
            return
        if _weights_properties(failure, weights, want_w, mask):
            return
    if mask is None:
        return
    full = torch.broadcast_to(mask, want_w.shape)  # (B, A, n_q, n_k)
    empty = ~full.any(-1)  # (B, A, n_q): queries that may attend to nothing
    if not empty.any():
        return
    for got, want, rows, what in ((weights, want_w, empty, "weights"), (out, want_out, empty.all(1), "out")):
        if tuple(got.shape) != tuple(want.shape) or same(got, want, atol=2e-5, rtol=1e-4):
            continue
        bad = ~torch.isclose(got.to(torch.float64), want, atol=2e-5, rtol=1e-4, equal_nan=True)
        bad_rows = bad.any(-1)
        if bad_rows.any() and not (bad_rows & ~rows).any():
            d.summary = f"{what} wrong only for the queries that may attend to nothing"
            verb = "differ" if what == "weights" else "differs"
            d.cause = (f"your {what} {verb} only for the queries that may attend to nothing (every key masked): their "
                       "weights are all 0, so their heads give zero vectors and their out is out_proj(0), the bias")
            d.fix = ("for a fully masked row, return zero weights (masked_softmax(scores, mask) does) and let out_proj "
                     "map the zero vector as it maps any other")
            return


def _fitted_scale(P: dict, x_q, x_kv, mask, a: int, d_head: int, weights: torch.Tensor) -> float | None:
    """The factor c for which the learner's weights are masked_softmax(c·q·kᵀ), when there is one."""
    raw = _multihead(P, x_q, x_kv, None, a, d_head, scale=1.0, returns="raw_scores")[1]  # (B, A, n_q, n_k)
    w = weights.detach().to(torch.float64)
    allowed = torch.ones_like(raw, dtype=torch.bool) if mask is None else torch.broadcast_to(mask, raw.shape)
    ok = allowed & (w > 0)
    count = ok.sum(-1, keepdim=True).clamp(min=1)
    log_w = torch.where(ok, w.clamp(min=1e-300).log(), 0.0)
    r = torch.where(ok, raw, 0.0)
    log_w = torch.where(ok, log_w - log_w.sum(-1, keepdim=True) / count, 0.0)
    r = torch.where(ok, r - r.sum(-1, keepdim=True) / count, 0.0)
    den = float((r * r).sum())
    if den < 1e-12:
        return None
    c = float((log_w * r).sum()) / den
    if not math.isfinite(c) or abs(c) < 1e-6 or abs(c * math.sqrt(d_head) - 1) < 1e-4:
        return None
    return c if same(w, _multihead(P, x_q, x_kv, mask, a, d_head, scale=c)[1], atol=2e-5, rtol=1e-4) else None


def _weights_properties(failure: Failure, weights: torch.Tensor, want_w: torch.Tensor, mask) -> bool:
    """Properties every right answer's weights have: rows that sum to 1 (0 for a fully masked row), no weight on
    a blocked key, weight on every allowed key. Names the first one the learner's weights break."""
    d = failure.diagnosis
    w = weights.detach().to(torch.float64)
    full = torch.ones_like(w, dtype=torch.bool) if mask is None else torch.broadcast_to(mask, w.shape)
    leak = (w.abs() > 1e-6) & ~full
    if leak.any():
        where = tuple(int(i) for i in leak.nonzero()[0])
        d.summary = "weight on blocked keys"
        d.cause = (f"your weights put {fmt(float(w[where]))} on entry {where} (batch, head, query, key), which the mask "
                   "blocks (False = may not attend)")
        return True
    missing = (w.abs() <= 1e-12) & full & (want_w > 1e-6)
    if missing.any():
        where = tuple(int(i) for i in missing.nonzero()[0])
        d.summary = "zero weight on keys the mask allows"
        d.cause = (f"your weights are exactly 0 at entry {where} (batch, head, query, key), which "
                   + ("no mask blocks" if mask is None else "the mask allows")
                   + "; a softmax over the allowed keys is never exactly 0 on one of them")
        return True
    live = full.any(-1)  # rows with at least one allowed key
    sums = w.sum(-1)[live]
    if sums.numel() and torch.isfinite(sums).all() and float((sums - 1).abs().max()) > 1e-3:
        lo, hi = float(sums.min()), float(sums.max())
        d.summary = "weight rows do not sum to 1"
        d.cause = ("each query's weights are a distribution over its keys and sum to 1; yours sum to "
                   + (f"{fmt(lo)}" if hi - lo < 1e-6 else f"between {fmt(lo)} and {fmt(hi)}"))
        return True
    return False


def _expect_gradient(module: Learner, P: dict, x_q: torch.Tensor, a: int, d_head: int, tried: str,
                     gen: torch.Generator) -> None:
    """out must be differentiable: gradients reach x_q (and so the projections), as autograd gives them."""
    upstream = torch.randn(*x_q.shape[:-1], P["o"][0].shape[0], generator=gen)
    x = x_q.to(torch.float64).requires_grad_(True)
    (want,) = torch.autograd.grad((_multihead(P, x, None, None, a, d_head)[0] * upstream).sum(), x)
    tried = f"{tried}, then out.backward(g): the gradient with respect to x_q"
    try:
        _, grads = module.vjp((x_q,), upstream, wrt=(0,), index=0)
    except (LearnerRaised, LearnerTimedOut) as exc:
        raise Failure(learner_error(exc, tried=tried, expected="a gradient for x_q")) from None
    got = grads[0] if isinstance(grads, tuple) and grads else None
    if not isinstance(got, torch.Tensor):
        fail("no gradient flows back through out", tried=tried, got="out does not depend on x_q through autograd",
             expected=f"a gradient of shape {tuple(x_q.shape)}",
             cause="forward cut the autograd graph: .detach(), torch.no_grad(), .item()/.tolist() or a NumPy round trip, "
                   "so W^Q, W^K, W^V, W^O could never be trained",
             fix="compute out with torch operations only, without detaching it")
    expect_close(got, want, tried=tried, what="the gradient", atol=1e-4, rtol=1e-3)


