"""Checks for notebook 07 (multi-head attention): split_heads, merge_heads, MultiHeadAttention.

Oracles: the course's split_heads / merge_heads (tested against ``torch.chunk`` / ``torch.cat``); for the module,
``torch.nn.MultiheadAttention`` with the same weights wherever it applies (A·d_head = d_model, no fully masked row),
else :func:`_multihead`, a float64 model the tests hold equal to it. Each check judges its table of
:class:`~.kit.Known` mistakes with one :class:`~.kit.Suspects`; the learner's class is reached only through the
learner boundary (``inspect``, ``construct``, ``set_parameters``, calls).
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

from ..multihead import merge_heads as ref_merge, split_heads as ref_split, torch_masks
from ..softmax import masked_softmax
from .compare import Failure, same
from .core import Learner, LearnerRaised, LearnerTimedOut, Mistake, check, expect_close, fail, fmt, learner_error
from .kit import Known, Suspects, bool_hint, call_explained, explain_raise, factors, tensor_answer, unpack
from .result import Diagnosis

__all__ = ["check_split_heads", "check_merge_heads", "check_MultiHeadAttention"]


# ============================================================================ shared by the three checks
@dataclass(frozen=True)
class Sized(Known):
    """A :class:`~.kit.Known` whose texts name the case's sizes: ``{A}``, ``{d_head}``… from ``sizes(*case)``."""

    sizes: Callable[..., dict] = lambda *case: {}

    def on(self, case: tuple) -> Mistake:
        s = self.sizes(*case)
        return Mistake(self.summary.format(**s), self.cause.format(**s), self.fix.format(**s), lambda: self.make(*case))


#: Exceptions whose message says what the code did (type, regex, cause, fix), before the course-wide table.
_PATTERNS = [("RuntimeError", r"view size is not compatible|contiguous", "`.view` needs memory laid out in the new "
              "shape, and `.transpose` gives a tensor whose memory is not (a non-contiguous one)",
              "use `.reshape(...)`, or `.contiguous().view(...)`, after the transpose")]
_BATCH_HINT = dict(cause="your code ran with a batch of one (B = 1) but raised with a batch of several: it treats x "
                         "as a single sequence", fix="keep B as the first axis throughout: reshape with x.shape[0] in "
                   "front, and count the axes to transpose from the end")


def _explain(exc: LearnerRaised, call: Callable, x: torch.Tensor) -> dict:
    """Cause and fix of a learner's exception: a truth value asked of a tensor, code that runs on x[:1] only, else
    what the message says."""
    if bool_hint(exc):
        return bool_hint(exc)
    if x.shape[0] > 1:
        try:
            call(x[:1])
            return _BATCH_HINT
        except (LearnerRaised, LearnerTimedOut):
            pass
    return explain_raise(exc, patterns=_PATTERNS)


def _shape_in_symbols(out: torch.Tensor, want: tuple, sizes: dict[str, int], target: str, tried: str) -> None:
    """Fail on a shape that reads, in the docstring's letters, as other axes or another order: read only when every
    axis is exactly one letter or one product of two (``B·A``), and nothing else, here."""
    reading: dict[int, list[str]] = {}
    for name in sizes:
        reading.setdefault(sizes[name], []).append(name)
    for x, y in itertools.combinations(sizes, 2):
        reading.setdefault(sizes[x] * sizes[y], []).append(f"{x}·{y}")
    parts, letters = [reading.get(int(s), []) for s in out.shape], target[1:-1].split(", ")
    if not parts or any(len(p) != 1 for p in parts) or [p[0] for p in parts] == letters:
        return
    axes = [p[0] for p in parts]
    shown = f"({', '.join(axes)})"
    if sorted(axes) == sorted(letters):
        moved = [a for a, w in zip(axes, letters) if a != w]
        cause = f"your result has the docstring's axes in another order, {shown}: {_and(moved)} are out of place"
    else:
        extra, missing = [a for a in axes if a not in letters], [w for w in letters if w not in axes]
        cause = f"your result has {_and(extra)} where the docstring has {_and(missing)}"
    fail(f"wrong shape {tuple(out.shape)} = {shown}, expected {target}", tried=tried,
         got=f"a result of shape {tuple(out.shape)}, which on this input reads as {shown}",
         expected=f"shape {tuple(want)} = {target}", cause=cause,
         fix=f"follow the docstring's shapes step by step (print(t.shape) after each step); the result is {target}")


def _expect_same_precision(out: torch.Tensor, x: torch.Tensor, *, tried: str, what: str) -> None:
    """``what`` only moves numbers: a result in a narrower dtype than ``x`` has rounded them."""
    if out.is_floating_point() and out.dtype.itemsize < x.dtype.itemsize:
        got, had = str(out.dtype)[6:], str(x.dtype)[6:]
        fail(f"result rounded to {got}", tried=tried, got=f"the right numbers, but as {got}: x's {had} values rounded",
             expected=f"x's own values, exactly: {what} only moves numbers", cause=f"you converted to {got} (.float(), "
             f".half() or dtype={got})", fix="drop the conversion: reshape, transpose and cat keep x's dtype")


def _and(words: list[str]) -> str:
    return " and ".join(words) if len(words) < 3 else ", ".join(words[:-1]) + " and " + words[-1]


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
    if previous and (shape[1], shape[3]) == previous:
        cause = f"{heads}, the split of the previous case: the head count or width is hard-coded, {wanted}"
    elif previous and shape[3] == previous[1]:
        cause = f"{heads}, the head width of the previous case: the width looks hard-coded, {wanted}"
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
        suspects.expect(out, ref_merge(x), (x,), tried=tried, again=fn, factors=factors(A=a, d_head=d, n=n),
                        axes=("batch entries", "positions", "features"))
        _expect_same_precision(out, x, tried=tried, what="merge_heads")
    return (f"matches the reference on {len(_MERGE_CASES)} cases (1 to 6 heads, one position, float32 and "
            "float64) and undoes split_heads")


# ============================================================================ the module: finding its layers
_ROLE_TOKENS = {"q": {"q", "query", "queries", "wq"}, "k": {"k", "key", "keys", "wk"},
                "v": {"v", "value", "values", "wv"}, "o": {"o", "out", "output", "wo", "c_proj", "proj", "dense"},
                "qkv": {"qkv", "c_attn", "in_proj", "wqkv", "attn"}}
_ROLE_NAMES = {"q": "W^Q (q_proj)", "k": "W^K (k_proj)", "v": "W^V (v_proj)", "o": "W^O (out_proj)"}


def _role(name: str) -> str | None:
    """Which projection a layer's name says it is (``q_proj``, ``W_q``, ``query``, ``out_proj``, ``c_attn``…)."""
    last = name.rsplit(".", 1)[-1].lower()
    tokens = {t for t in re.split(r"[_\W\d]+", last) if t} | {last}
    return next((role for role in ("qkv", "q", "k", "v", "o") if tokens & _ROLE_TOKENS[role]), None)


def _sizes_cause(role: str, p_in: int, p_out: int, want: tuple[int, int], a: int, d_head: int, d_model: int) -> str:
    """What a projection's (in, out) sizes say went wrong, when they say it. The heads' side (W^Q's, W^K's, W^V's
    outputs, W^O's inputs) should be A·d_head wide."""
    if (p_in, p_out) == want[::-1]:
        return f"nn.Linear takes (in_features, out_features); yours has them the other way round: {p_in} in"
    heads, other, other_want = (p_in, p_out, want[1]) if role == "o" else (p_out, p_in, want[0])
    if role == "qkv" or other != other_want or heads == a * d_head:
        return ""
    if heads == d_model:
        return (f"you sized W^O for d_model = {d_model} inputs, but the concatenated heads have A·d_head = "
                f"{a * d_head} features" if role == "o" else f"you projected to d_model = {d_model} features; the "
                f"heads need A·d_head = {a * d_head}") + " (they differ when d_head ≠ d_model / A)"
    if heads == a * (d_model // a) and d_model // a != d_head:
        return f"you used d_model // n_heads = {d_model // a}, not d_head (default ⌈d_model / n_heads⌉ = {d_head})"
    if heads % d_head == 0:
        made = heads // d_head
        return (f"your projection makes {made} head{'s' if made != 1 else ''} of width d_head = {d_head}, but "
                f"n_heads = {a}: the head count is hard-coded or taken from somewhere else")
    if heads % a == 0:
        return (f"your projection makes n_heads = {a} heads of width {heads // a}, but d_head = {d_head} here "
                "(default ⌈d_model / n_heads⌉)")
    return ""


def _layers(info: dict, d_model: int, a: int, d_head: int, tried: str) -> dict:
    """The learner's W^Q, W^K, W^V, W^O as {"q": layer name, …} after checking their sizes, with ``linears`` (name →
    (in, out, bias)), ``fused`` and ``guessed`` (four unnamed layers taken in creation order)."""
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
        fail("W^Q, W^K, W^V, W^O not found", tried=tried, cause=cause,
             got=f"nn.Linear layers: {', '.join(f'{n} ({s[0]} → {s[1]})' for n, s in linears.items()) or 'none'}",
             expected="nn.Linear layers q_proj, k_proj, v_proj (d_model → A·d_head) and out_proj (A·d_head → "
                      "d_model), or one fused qkv_proj (d_model → 3·A·d_head) and out_proj",
             fix="create the projections in __init__ as nn.Linear layers with the names in the docstring")
    qkv = [("qkv", "the fused projection", d_model, "d_model", 3 * width, "3·A·d_head",
            "qkv_proj = nn.Linear(d_model, 3 * n_heads * d_head): q, k and v side by side")] if fused else [
        (r, f"W^{r.upper()}", d_model, "d_model", width, "A·d_head",
         f"{r}_proj = nn.Linear(d_model, n_heads * d_head)") for r in "qkv"]
    o = ("o", "W^O", width, "A·d_head", d_model, "d_model",
         "out_proj = nn.Linear(n_heads * d_head, d_model): W^O maps the concatenated heads back to d_model")
    for role, label, want_in, in_name, want_out, out_name, create in [*qkv, o]:
        name = found[role][0]
        p_in, p_out = linears[name][:2]
        if p_in != want_in:
            shown = "d_model" if role == "o" and p_in == d_model else p_in
            summary = f"{label} takes {shown} inputs, not {in_name} = {want_in}"
        elif p_out != want_out:
            summary = f"{label} gives {p_out} outputs, not {out_name} = {want_out}"
        else:
            continue
        only_width = role in ("q", "k", "v") and p_in == want_in  # the heads' side alone is wrong
        fail(summary, tried=tried, got=f"{name} = nn.Linear({p_in}, {p_out})",
             expected=f"nn.Linear({in_name} = {want_in}, {out_name} = {want_out}): {a} heads of d_head = {d_head}",
             cause=_sizes_cause(role, p_in, p_out, (want_in, want_out), a, d_head, d_model),
             fix=("use the d_head you are given (default ⌈d_model / n_heads⌉): " if only_width else "create ")
             + create)
    roles = {r: found["qkv" if fused and r != "o" else r][0] for r in "qkvo"}
    return {**roles, "fused": fused, "guessed": guessed, "linears": linears}


def _weights_for(layers: dict, d_model: int, width: int, gen: torch.Generator) -> tuple[dict, dict]:
    """Seeded W^Q, W^K, W^V, W^O and biases: (float64 values for the oracle, float32 tensors by parameter name)."""
    P, params, linears = {}, {}, layers["linears"]
    for role in "qkvo":
        fan_in, fan_out = (width, d_model) if role == "o" else (d_model, width)
        w = torch.randn(fan_out, fan_in, generator=gen, dtype=torch.float64) * 1.2 / math.sqrt(fan_in)
        b = 0.3 * torch.randn(fan_out, generator=gen, dtype=torch.float64)
        if not linears[layers[role]][2]:
            b = torch.zeros(fan_out, dtype=torch.float64)  # the learner's layer has no bias
        P[role] = (w.to(torch.float32).to(torch.float64), b.to(torch.float32).to(torch.float64))
    groups = [("qkv", layers["q"])] if layers["fused"] else [(r, layers[r]) for r in "qkv"]
    for roles, name in [*groups, ("o", layers["o"])]:
        params[f"{name}.weight"] = torch.cat([P[r][0] for r in roles]).to(torch.float32)
        if linears[name][2]:
            params[f"{name}.bias"] = torch.cat([P[r][1] for r in roles]).to(torch.float32)
    return P, params


# ============================================================================ the module: oracle and mistakes
_MASKING = {  # how the scores s (B, A, n_q, n_k) and the broadcast mask m become weights, right or wrong
    "ok": masked_softmax,
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
_POST = {"": lambda out, x: out, "residual": lambda out, x: out + x,
         "layer_norm": lambda out, x: nn.functional.layer_norm(out, out.shape[-1:]),
         "residual_layer_norm": lambda out, x: nn.functional.layer_norm(out + x, out.shape[-1:])}


def _multihead(P: dict, x_q: torch.Tensor, x_kv: torch.Tensor | None, mask: torch.Tensor | None, a: int,
               d_head: int, *, scale: float | None = None, split: Callable = ref_split, merge: Callable = ref_merge,
               roles: str = "qkv", inputs: tuple = ("x_q", "x_kv", "x_kv"), dim: int = -1, mask_mode: str = "ok",
               scale_after: float = 1.0, v_scale: float = 1.0, out_proj: bool = True, out_bias: float = 1.0,
               post: str = "", returns: str = "weights") -> tuple[torch.Tensor, torch.Tensor]:
    """(out, weights) of multi-head attention from plain float64 tensors, or of one classic mistake in it.
    ``split``/``merge`` make and join the heads; ``roles`` names the projections used for the queries, keys and values
    (``"kqv"``: W^K for the queries…) and ``inputs`` what each projects; ``returns`` what comes back as the weights
    (``"scores"``: the scaled scores after masking, ``"raw_scores"``)."""
    src = {"x_q": x_q.to(torch.float64), "x_kv": (x_q if x_kv is None else x_kv).to(torch.float64)}
    q, k, v = (split(src[x] @ P[r][0].T + P[r][1], a) for r, x in zip(roles, inputs))  # (B, A, n_q or n_k, d_head)
    scores = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(d_head) if scale is None else scale)  # (B, A, n_q, n_k)
    raw = scores
    if mask_mode == "causal":  # a causal mask built inside forward, whatever mask was given
        mask, mask_mode = torch.ones(scores.shape[-2:], dtype=torch.bool).tril(), "ok"
    full = None if mask is None else torch.broadcast_to(mask, scores.shape)
    weights = _MASKING[mask_mode if full is not None else "ok"](scores, full, dim) * scale_after  # (B, A, n_q, n_k)
    if full is not None:
        scores = scores.masked_fill(~full, float("-inf"))
    cat = merge(weights @ (v * v_scale))  # (B, n_q, A·d_head)
    out = cat @ P["o"][0].T + out_bias * P["o"][1] if out_proj else cat  # (B, n_q, d_model)
    return _POST[post](out, src["x_q"]), {"weights": weights, "scores": scores, "raw_scores": raw}[returns]


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
    fully_masked = mask is not None and bool((~torch.broadcast_to(mask, (b, a, n_q, n_k))).all(-1).any())
    if a * d_head != d_model or fully_masked:
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
    """One forward call of the module check, as the mistakes' ``make(case, view)`` see it: weights, inputs, sizes,
    and the oracle's (out, weights) and every mistake's, each computed once."""

    def __init__(self, P: dict, x_q, x_kv, mask, a: int, d_head: int, d_model: int, fused: bool):
        self.P, self.x_q, self.x_kv, self.mask, self.a, self.d_head, self.fused = P, x_q, x_kv, mask, a, d_head, fused
        self.out, self.weights, self.by_torch = _oracle(P, x_q, x_kv, mask, a, d_head, d_model)
        self.allowed = torch.broadcast_to(torch.tensor(True) if mask is None else mask, self.weights.shape)
        self.split_width = abs(d_model / a - d_head) > 1e-9  # d_head ≠ d_model / A
        self.width_differs = a * d_head != d_model
        self.words = dict(ratio=f"{d_model / a:g}", d_head=d_head, none="" if mask is not None else
                          " — here none was given", also="" if self.width_differs else
                          " (here also √(A·d_head), the width of all heads together)")
        self.scales = {"1/√d_model": 1 / math.sqrt(d_model), "1/d_head": 1 / d_head, "√d_head": math.sqrt(d_head),
                       "1/√(d_model/A)": 1 / math.sqrt(d_model / a), "1/√(A·d_head)": 1 / math.sqrt(a * d_head),
                       "1/√d_head": 1 / math.sqrt(d_head)}
        self._memo: dict = {}

    def part(self, view: str, per_head: bool = False, **kw) -> torch.Tensor | None:
        """``view`` ("out" or "weights") of the mistake that ``kw`` names (a factor by its name in ``scales``;
        ``per_head``: qkv_proj split head by head)."""
        kw = {k: self.scales.get(v, v) if k in ("scale", "scale_after", "v_scale") else v for k, v in kw.items()}
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


def _inside(table: list[Known], key: str, step: str) -> Sized:
    """A split_heads / merge_heads mistake (``step``: "split" or "merge"), made inside forward: the same texts."""
    row = next(k for k in table if k.key == key)
    return _m(f"{step}_{key}", row.summary, row.cause, row.fix, **{step: row.make})


_MASK_FIX = "fill the scores where the mask is False with -inf before the softmax, or use masked_softmax(scores, mask)"
_SCALE_FIX = "divide by math.sqrt(d_head)"
_EMPTY_FIX = "such a row gets zero weights in this course: use masked_softmax(scores, mask) from attn_course.softmax"
_BLOCK = "return out_proj(concatenated heads) as it is: the transformer block around attention adds the rest"
_CROSS, _MASKED = (lambda c: c.x_kv is not None), (lambda c: c.mask is not None)
_FUSED_ORDERS = {"kqv": "k, q, v", "qvk": "q, v, k", "vkq": "v, k, q", "kvq": "k, v, q", "vqk": "v, q, k"}
_FUSED_SPLIT = "qkv.split(n_heads * d_head, dim=-1)"

MODULE_MISTAKES = [
    *(_inside(SPLIT_MISTAKES, key, "split") for key in ("no_transpose", "strided")),
    _m("sqrt_d_model", "scaled by √d_model, not √d_head", "you divided the scores by √d_model{also}; each head's dot "
       "product has only d_head terms", _SCALE_FIX, scale="1/√d_model"),
    _m("unscaled", "scores not scaled", "you did not divide the scores by √d_head", _SCALE_FIX, scale=1.0),
    _m("d_head", "divided by d_head instead of √d_head", "you divided the scores by d_head", _SCALE_FIX,
       scale="1/d_head"),
    _m("times_sqrt", "multiplied by √d_head", "you multiplied the scores by √d_head", _SCALE_FIX, scale="√d_head"),
    *(_m(f"softmax_{axis}", f"softmax over the {axis}", f"you took the softmax over axis {dim}, the {axis} of "
         "(B, A, n_q, n_k)", "take it over the keys, dim=-1: each query's row of weights sums to 1", dim=dim)
      for dim, axis in ((-2, "queries"), (1, "heads"), (0, "batch"))),
    *(_m(f"weights_scaled{i}", "weights scaled instead of the scores", "you divided the weights by √d_head after the "
         "softmax, so the rows sum to 1/√d_head", "divide the scores q @ kᵀ by √d_head before the softmax",
         scale_after="1/√d_head", **kw) for i, kw in enumerate(({"scale": 1.0}, {}))),
    _m("qk_swapped", "queries and keys swapped", "your scores are k·qᵀ instead of q·kᵀ (W^K used for the queries, or "
       "k @ q.transpose(-2, -1))", "q = q_proj(x_q), k = k_proj(x_kv), scores = q @ k.transpose(-2, -1)",
       when=lambda c: not c.fused, roles="kqv"),  # fused: a split order, below
    _m("v_with_w_k", "values projected with W^K", "you computed the values with k_proj", "v = v_proj(x_kv)",
       roles="qkk"),
    *(_inside(MERGE_MISTAKES, key, "merge") for key in ("no_transpose", "interleaved", "reversed")),
    _m("no_out_proj", "W^O not applied", "you returned the concatenated heads without out_proj",
       "return self.out_proj(concatenated heads)", out_proj=False),
    _m("values_scaled", "values scaled instead of the scores", "you divided the values (or the heads' outputs) by "
       "√d_head", "scale only the scores: (q @ k.transpose(-2, -1)) / math.sqrt(d_head)", v_scale="1/√d_head"),
    _m("residual", "residual added inside attention", "your out is the attention output plus x_q: the residual belongs "
       "to the transformer block around attention", "return out_proj(concatenated heads) without adding x_q",
       post="residual"),
    _m("layer_norm", "layer norm inside attention", "you applied a layer norm to out", _BLOCK, post="layer_norm"),
    _m("residual_layer_norm", "residual and layer norm inside attention", "your out is layer_norm(attention output + "
       "x_q), a whole post-norm sub-layer", _BLOCK, post="residual_layer_norm"),
    _m("q_with_w_k", "queries projected with W^K", "you computed the queries with k_proj", "q = q_proj(x_q)",
       roles="kkv"),
    _m("k_with_w_q", "keys projected with W^Q", "you computed the keys with q_proj", "k = k_proj(x_kv)", roles="qqv"),
    *(_m(f"scores_returned{i}", "scores returned as the weights", "you returned the scaled scores q·kᵀ/√d_head, not "
         "their softmax", "return the weights, softmax(scores) over the keys", returns=r) for i, r in
      enumerate(("scores", "raw_scores"))),
    _m("raw_scores_returned", "scores returned as the weights", "you returned the unscaled scores q·kᵀ, not their "
       "softmax", "return the weights, softmax(q·kᵀ/√d_head) over the keys", returns="raw_scores", scale=1.0),
    _m("always_causal", "always causal", "you applied a causal mask whatever the mask argument says{none}",
       "use the mask you are given (None: every key allowed)", mask_mode="causal"),
    _m("sqrt_d_model_over_a", "scaled by √(d_model / A), not √d_head", "you divided the scores by √(d_model / n_heads) "
       "= √{ratio}; a head's dot product has d_head = {d_head} terms", _SCALE_FIX, when=lambda c: c.split_width,
       scale="1/√(d_model/A)"),
    *(_m(f"fused_{order}", f"qkv_proj split in the order {said}", f"you took qkv_proj's three blocks as {said}",
         f"q, k, v = {_FUSED_SPLIT}, in that order", when=lambda c: c.fused, roles=order)
      for order, said in _FUSED_ORDERS.items()),
    _m("fused_per_head", "qkv_proj split head by head", "you split each head's piece of qkv_proj's output into q, k, "
       "v; qkv_proj holds three blocks: all of q, then all of k, then all of v", f"split first into three blocks "
       f"({_FUSED_SPLIT}), then each into heads", when=lambda c: c.fused, per_head=True),
    _m("sqrt_width", "scaled by √(A·d_head)", "you divided the scores by √(A·d_head), the width of all heads together",
       "divide by math.sqrt(d_head), one head's width", when=lambda c: c.width_differs, scale="1/√(A·d_head)"),
    *(_m(key, summary, cause, fix, when=_CROSS, inputs=inputs) for key, summary, cause, fix, inputs in (
        ("x_kv_ignored", "x_kv ignored: keys and values from x_q", "you computed the keys and values from x_q even "
         "when x_kv is given", "k = k_proj(x_kv), v = v_proj(x_kv); x_q only when x_kv is None", ("x_q",) * 3),
        ("v_from_x_q", "values from x_q in cross-attention", "you computed the values from x_q", "v = v_proj(x_kv)",
         ("x_q", "x_kv", "x_q")),
        ("k_from_x_q", "keys from x_q in cross-attention", "you computed the keys from x_q", "k = k_proj(x_kv)",
         ("x_q", "x_q", "x_kv")),
        ("q_from_x_kv", "queries from x_kv in cross-attention", "you computed the queries from x_kv",
         "q = q_proj(x_q)", ("x_kv",) * 3),
        ("x_swapped", "x_q and x_kv swapped", "you took the queries from x_kv and the keys and values from x_q",
         "queries come from x_q, keys and values from x_kv", ("x_kv", "x_q", "x_q")))),
    *(_m(key, summary, cause, fix, when=_MASKED, mask_mode=mode) for key, mode, summary, cause, fix in (
        ("mask_inverted", "inverted", "mask polarity inverted", "you blocked the positions where the mask is True; "
         "here True means 'may attend' (as in F.scaled_dot_product_attention, unlike nn.MultiheadAttention)",
         "fill the scores where the mask is False: scores.masked_fill(~mask, float('-inf'))"),
        ("mask_ignored", "ignored", "mask ignored", "you did not use the mask", _MASK_FIX),
        ("mask_after", "after", "mask applied after the softmax", "you zeroed the weights after the softmax, so the "
         "rows no longer sum to 1", "mask the scores before the softmax"),
        ("mask_transposed", "transposed", "mask transposed", "you applied the mask with its rows (queries) and columns "
         "(keys) swapped", "use mask[..., i, j] for query i and key j"),
        ("mask_zero_fill", "zero_fill", "blocked scores set to 0", "you filled the blocked scores with 0 instead of "
         "-inf, so blocked keys still get weight", _MASK_FIX),
        ("mask_added", "added", "bool mask added to the scores", "you added the boolean mask to the scores: True "
         "counts as +1, which blocks nothing", _MASK_FIX),
        ("mask_heads_batch", "heads_batch_mixed", "mask matched to the wrong batch entries and heads", "you flattened "
         "the mask to (B·A, n_q, n_k) head by head while the scores run batch entry by batch entry (repeat vs "
         "repeat_interleave)", "let a (B, 1, n_q, n_k) mask broadcast against (B, A, n_q, n_k) scores, unreshaped"),
        ("mask_nan", "nan", "NaN on a fully masked row", "a query whose keys are all blocked got softmax of -inf "
         "everywhere, which is 0/0 = NaN", _EMPTY_FIX),
        ("mask_finite", "finite", "uniform weights on a fully masked row", "you filled blocked scores with a finite "
         "number, so a query whose keys are all blocked spreads its weight evenly over them", _EMPTY_FIX))),
    Known("weights_averaged", "weights averaged over the heads", "you returned the mean over heads, one (n_q, n_k) "
          "matrix per batch entry (nn.MultiheadAttention's default)", "return every head's weights: (B, A, n_q, n_k)",
          lambda c, view: c.weights.mean(1) if view == "weights" else None),
    _m("out_bias_missing", "out_proj's bias not added", "your out lacks out_proj's bias at every position",
       "return self.out_proj(concatenated heads)", out_bias=0.0),
    _m("out_bias_twice", "out_proj's bias added twice", "your out has out_proj's bias twice at every position",
       "self.out_proj(concatenated heads) adds its bias once: add no other", out_bias=2.0),
]


# ============================================================================ the module: cases and check
def _cases() -> list[dict]:
    g = torch.Generator().manual_seed(11)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()  # (n_q, n_k): query i sees keys 0 … i
    key_padding = (torch.arange(6) < torch.tensor([6, 3])[:, None])[:, None, None, :]  # (2, 1, 1, 6)
    decoder = causal & (torch.arange(5) < torch.tensor([5, 2])[:, None])[:, None, None, :]  # (2, 1, 5, 5)
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
        dict(name="a causal mask (5, 5)", d=12, a=3, h=4, b=2, n=5, mask=causal),
        dict(name="cross-attention, x_kv another sequence of the same length", d=10, a=2, h=4, b=2, n=5, m=5),
        dict(name="cross-attention, x_kv with n_k = 7 keys for n_q = 4 queries", d=12, a=2, h=6, b=2, n=4, m=7),
        dict(name="cross-attention with a key-padding mask (2, 1, 1, 6)", d=12, a=3, h=4, b=2, n=3, m=6,
             mask=key_padding),
        dict(name="a decoder mask (2, 1, 5, 5): causal and padding", d=8, a=2, h=4, b=2, n=5, mask=decoder),
        dict(name="a different mask per head (2, 3, 4, 6), cross-attention", d=9, a=3, h=3, b=2, n=4, m=6,
             mask=per_head),
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
    shapes = [tuple(t.shape) if isinstance(t, (torch.Tensor, np.ndarray)) else None for t in result] \
        if isinstance(result, (tuple, list)) else []
    if shapes == [(b, a, n_q, n_k), (b, n_q, d)]:
        fail("forward returned (weights, out), not (out, weights)", tried=tried,
             got=f"first a tensor of shape {(b, a, n_q, n_k)} (the weights), then one of shape {(b, n_q, d)} (out)",
             expected=f"out {(b, n_q, d)}, then the weights {(b, a, n_q, n_k)}",
             cause="you returned the two results in the opposite order", fix="end forward with `return out, weights`")
    return unpack(result, ("out", "weights"), tried=tried, fix="end forward with `return self.out_proj(...), weights`")


def _forward_hint(exc: LearnerRaised, mask, n: int, m: int | None, wide: bool) -> dict:
    """Cause and fix of an exception in forward, from what this case adds to the plain one (``wide``: A·d_head ≠
    d_model)."""
    shapeish = any(w in exc.message for w in ("size", "shape", "dimension", "broadcast", "match"))
    if mask is not None and shapeish:
        return dict(cause=f"the mask {tuple(mask.shape)} does not broadcast against the scores (B, A, n_q, n_k), "
                          "though the same module ran without a mask: an added axis (unsqueeze) or a reshape moved its "
                          "axes",
                    fix="use the mask as it is: (n_q, n_k), (B, 1, n_q, n_k), (B, 1, 1, n_k) and (B, A, n_q, n_k) all "
                        "broadcast against the scores")
    if m is not None and m != n and shapeish:
        return dict(cause=f"with x_kv of {m} positions and x_q of {n}, your code mixes the two lengths: keys and "
                          "values have n_k rows (from x_kv), queries n_q (from x_q)",
                    fix="k = k_proj(x_kv), v = v_proj(x_kv); reshape each with its own length")
    if bool_hint(exc):
        return bool_hint(exc)
    if wide and shapeish:
        return dict(cause="your forward assumes A·d_head = d_model somewhere (a reshape to d_model, or "
                          "d_model // n_heads as the head width)",
                    fix="reshape with n_heads and d_head, and merge to n_heads·d_head features")
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
        refused = [(kind, "", f"your __init__ refuses d_model = {d} with {a} heads; with d_head given (or its default "
                    "⌈d_model / n_heads⌉) A need not divide d_model", "drop the divisibility check: W^Q maps d_model → "
                    "n_heads·d_head, W^O maps it back") for kind in ("AssertionError", "ValueError") if d % a]
        module = call_explained(cls.construct, d, a, *([] if case["h"] is None else [case["h"]]), tried=tried,
                                expected="a module", patterns=[*refused, *_PATTERNS])
        minfo = module.inspect()
        if minfo.get("kind") != "module":
            fail("MultiHeadAttention(...) is not an nn.Module", tried=tried, got=str(minfo.get("type")),
                 expected="an nn.Module", fix="define `class MultiHeadAttention(nn.Module):`")
        module.method("eval")()  # a deterministic forward: dropout, if the learner added any, off
        layers = _layers(minfo, d, a, d_head, tried)
        P, params = _weights_for(layers, d, a * d_head, gen)
        call_explained(module.set_parameters, params, tried=f"loading weights into {tried}",
                       expected="nn.Linear layers")
        x_q = torch.randn(b, n, d, generator=gen)
        x_kv = torch.randn(b, m, d, generator=gen) if m else None
        sig = minfo.get("forward_signature") or []
        if (m or mask is not None) and not any(p["kind"] == "VAR_POSITIONAL" for p in sig) and \
                len([p for p in sig if p["kind"] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]) < 3:
            fail("forward does not take (x_q, x_kv=None, mask=None)", tried=tried,
                 got=f"forward({', '.join(p['name'] for p in sig)})", expected="forward(x_q, x_kv=None, mask=None)",
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
            if not failure.diagnosis.cause:
                _explain_mismatch(failure.diagnosis, module, args, result, got, ctx, tried, layers)
            raise
        if case is cases[0]:
            _expect_gradient(module, P, x_q, a, d_head, tried, gen)
    return (f"matches nn.MultiheadAttention on {with_torch} cases (weights copied) and the float64 reference on "
            f"{len(cases) - with_torch} (A·d_head ≠ d_model, a fully masked row): self-, causal and cross-attention, "
            "masks of four shapes")


# ============================================================================ the module: measured causes
def _explain_mismatch(d: Diagnosis, module: Learner, args: tuple, result, got: dict, ctx: _Case, tried: str,
                      layers: dict) -> None:
    """Add a cause to the diagnosis ``d`` of a mismatch no known mistake explains: randomness, out off by one vector,
    another scale, a broken property of the weights, fully masked queries; else the order four unnamed layers took."""
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
    out, weights = got["out"], got["weights"]
    weights_shaped = tuple(weights.shape) == tuple(ctx.weights.shape)
    if weights_shaped and same(weights, ctx.weights, atol=2e-5, rtol=1e-4):
        diff = (out.to(torch.float64) - ctx.out).flatten(0, -2) if out.shape == ctx.out.shape else None  # (B·n_q, d)
        if diff is not None and diff.shape[0] > 1 and same(diff, diff[:1].expand_as(diff), atol=2e-5, rtol=1e-4):
            d.summary, d.cause = "out off by one vector at every position", (
                "your out differs from the expected one by the same vector at every batch entry and query: a constant "
                "(a bias) added or missing")
            return
    elif weights_shaped and weights.is_floating_point() and (
            _fitted_scale(d, ctx, weights) or _broken_property(d, ctx, weights)):
        return
    if not _masked_rows_only(d, ctx, out, weights) and layers["guessed"]:
        d.cause = (f"your four nn.Linear layers ({', '.join(layers['linears'])}) have no names that say which is "
                   "which, so the check took them in the order they were created as W^Q, W^K, W^V, W^O")
        d.fix = "name them q_proj, k_proj, v_proj and out_proj as the docstring says (or create them in that order); " \
                "then compare your steps with the docstring"


def _fitted_scale(d: Diagnosis, ctx: _Case, weights: torch.Tensor) -> bool:
    """Name the factor c when the learner's weights are masked_softmax(c·q·kᵀ) for some c other than 1/√d_head."""
    P, x_q, x_kv, mask, a, d_head = ctx.P, ctx.x_q, ctx.x_kv, ctx.mask, ctx.a, ctx.d_head
    raw = _multihead(P, x_q, x_kv, None, a, d_head, scale=1.0, returns="raw_scores")[1]  # (B, A, n_q, n_k)
    w = weights.detach().to(torch.float64)
    ok = (w > 0) & ctx.allowed
    count = ok.sum(-1, keepdim=True).clamp(min=1)
    centred = lambda t: torch.where(ok, t - torch.where(ok, t, 0.0).sum(-1, keepdim=True) / count, 0.0)  # noqa: E731
    log_w, r = centred(w.clamp(min=1e-300).log()), centred(raw)  # over each row's allowed keys
    den = float((r * r).sum())
    c = float((log_w * r).sum()) / den if den >= 1e-12 else 0.0  # least squares: log w ≈ c·raw + row constant
    if not math.isfinite(c) or abs(c) < 1e-6 or abs(c * math.sqrt(d_head) - 1) < 1e-4 or \
            not same(w, _multihead(P, x_q, x_kv, mask, a, d_head, scale=c)[1], atol=2e-5, rtol=1e-4):
        return False
    named = {"1/(2·√d_head)": 1 / (2 * math.sqrt(d_head)), "1/√n_heads": 1 / math.sqrt(a),
             "1/(n_heads·√d_head)": 1 / (a * math.sqrt(d_head)), "1/d_head²": 1 / d_head ** 2,
             "2/√d_head": 2 / math.sqrt(d_head), "−1/√d_head": -1 / math.sqrt(d_head)}
    name = next((k for k, v in named.items() if abs(c - v) <= 1e-3 * abs(v)), "")
    d.summary = f"scores multiplied by {name or fmt(c)}, not 1/√d_head"
    d.cause = (f"your weights are the softmax of q·kᵀ × {fmt(c)} (= 1/{fmt(1 / c)}"
               + (f", that is {name}" if name else "") + f"); the scale is 1/√d_head = 1/{fmt(math.sqrt(d_head))}")
    d.fix = "divide the scores q @ k.transpose(-2, -1) by math.sqrt(d_head), once"
    return True


def _broken_property(d: Diagnosis, ctx: _Case, weights: torch.Tensor) -> bool:
    """Name the first property every right answer's weights have that the learner's break: no weight on a blocked
    key, weight on every allowed key, rows that sum to 1 (0 for a fully masked row)."""
    w, full = weights.detach().to(torch.float64), ctx.allowed
    leak, missing = (w.abs() > 1e-6) & ~full, (w.abs() <= 1e-12) & full & (ctx.weights > 1e-6)
    if leak.any():
        where = tuple(int(i) for i in leak.nonzero()[0])
        d.summary = "weight on blocked keys"
        d.cause = (f"your weights put {fmt(float(w[where]))} on entry {where} (batch, head, query, key), which the "
                   "mask blocks (False = may not attend)")
    elif missing.any():
        where = tuple(int(i) for i in missing.nonzero()[0])
        d.summary = "zero weight on keys the mask allows"
        d.cause = (f"your weights are exactly 0 at entry {where} (batch, head, query, key), which "
                   + ("no mask blocks" if ctx.mask is None else "the mask allows")
                   + "; a softmax over the allowed keys is never exactly 0 on one of them")
    else:
        sums = w.sum(-1)[full.any(-1)]  # the rows with at least one allowed key
        if not (sums.numel() and torch.isfinite(sums).all() and float((sums - 1).abs().max()) > 1e-3):
            return False
        lo, hi = float(sums.min()), float(sums.max())
        d.summary = "weight rows do not sum to 1"
        d.cause = ("each query's weights are a distribution over its keys and sum to 1; yours sum to "
                   + (f"{fmt(lo)}" if hi - lo < 1e-6 else f"between {fmt(lo)} and {fmt(hi)}"))
    return True


def _masked_rows_only(d: Diagnosis, ctx: _Case, out: torch.Tensor, weights: torch.Tensor) -> bool:
    """Name a difference confined to the queries that may attend to nothing (every key masked)."""
    if ctx.mask is None:
        return False
    empty = ~ctx.allowed.any(-1)  # (B, A, n_q): queries that may attend to nothing
    for got, want, rows, what in ((weights, ctx.weights, empty, "weights"), (out, ctx.out, empty.all(1), "out")):
        if not empty.any() or tuple(got.shape) != tuple(want.shape) or same(got, want, atol=2e-5, rtol=1e-4):
            continue
        bad_rows = (~torch.isclose(got.to(torch.float64), want, atol=2e-5, rtol=1e-4, equal_nan=True)).any(-1)
        if bad_rows.any() and not (bad_rows & ~rows).any():
            d.summary = f"{what} wrong only for the queries that may attend to nothing"
            d.cause = (f"your {what} {'differ' if what == 'weights' else 'differs'} only for the queries that may "
                       "attend to nothing (every key masked): their weights are all 0, so their heads give zero "
                       "vectors and their out is out_proj(0), the bias")
            d.fix = ("for a fully masked row, return zero weights (masked_softmax(scores, mask) does) and let out_proj "
                     "map the zero vector as it maps any other")
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
             cause="forward cut the autograd graph (.detach(), torch.no_grad(), .item()/.tolist() or a NumPy round "
                   "trip), so W^Q, W^K, W^V, W^O could never be trained",
             fix="compute out with torch operations only, without detaching it")
    expect_close(got, want, tried=tried, what="the gradient", atol=1e-4, rtol=1e-3)
