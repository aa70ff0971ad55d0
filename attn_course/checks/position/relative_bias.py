"""Biases added to the scores by relative position, (A, n, n) per head: T5's bucketed relative_position_bias
and ALiBi's alibi_bias, each with its known mistakes and what a wrong answer's buckets or slopes are."""

from __future__ import annotations

import math

import torch

from ... import position as ref
from .. import kit
from ..compare import Failure, expect_shape, fail, fail_again, fmt, same
from ..core import Learner, check
from ..kit import Suspects, variants
from .judge import call, floating, judge, kept_slice


# ================================================================================== T5 relative position bias
def _t5_buckets(n: int, nb: int, bidirectional: bool, max_distance: int, mistake: str = "") -> tuple[torch.Tensor, ...]:
    """(n, n) buckets of j − i computed in float64, and an alternative where the logarithm lands on a whole
    number (float32 code may fall one below there). With ``mistake``, one classic error."""
    pos = torch.arange(n)
    rel = (pos[:, None] - pos[None, :]) if mistake == "i_minus_j" else (pos[None, :] - pos[:, None])  # j − i
    bidirectional = {"always_bi": True, "never_bi": False}.get(mistake, bidirectional)
    md = 128 if mistake == "max_distance" else max_distance
    half = nb // 2 if bidirectional and mistake != "no_halving" else nb
    offset = ((rel < 0) if mistake == "offset_before" else (rel > 0)).long() * half * (mistake != "no_offset") * \
        bidirectional
    dist = rel.abs() if bidirectional else rel.clamp(min=0) if mistake == "uni_sign" else (-rel).clamp(min=0)
    exact = nb // 2 if mistake == "max_exact" else half // 2
    val = dist.double() if mistake == "linear" else \
        exact + torch.log(dist.double().clamp(min=1) / exact) / math.log(md / exact) * (half - exact)
    near = val.round()
    on_whole = (val - near).abs() < 1e-6
    first = {"round": near, "ceil": torch.where(on_whole, near, val.ceil())}.get(mistake, torch.where(
        on_whole, near, val.floor()))
    second = first if mistake in ("round", "ceil") else torch.where(on_whole, near - 1, first)
    cap = 10 ** 9 if mistake == "no_clamp" else half - 1
    return tuple(torch.where(dist < exact, dist, b.clamp(max=cap).long()) + offset for b in (first, second))


def _t5(n, table, bi, md, mistake=""):
    buckets = _t5_buckets(n, table.shape[0], bi, md, mistake)[0]
    out = None if int(buckets.max()) >= table.shape[0] else table[buckets].permute(2, 0, 1).double()
    return out.transpose(-2, -1) if mistake == "transposed" else out


_T5_FIX = ("bias[a, i, j] = table[bucket(j − i), a]: bidirectional, keys after the query (j − i > 0) use the upper "
           "half; distances below half a half are exact, larger ones logarithmic up to max_distance, then clamped")
_T5_BI = "bidirectional: halve the buckets, the upper half for j − i > 0; otherwise distance = max(i − j, 0)"
_T5_SIGN = ("relative positions indexed i − j instead of j − i", "the docstring's relative position is j − i, "
            "positive when the key comes after the query", "rel = positions[None, :] - positions[:, None]  # j − i")
_T5_TRUNC = "truncate it: .long() (or floor), as T5 does"
_T5_TABLE = variants(_t5, [
    ("i_minus_j", *_T5_SIGN), ("transposed", *_T5_SIGN),
    ("always_bi", "`bidirectional` ignored", "your buckets are bidirectional whatever `bidirectional` is", _T5_BI),
    ("never_bi", "`bidirectional` ignored", "your buckets are unidirectional whatever `bidirectional` is", _T5_BI),
    ("no_halving", "buckets not halved for bidirectional", "in bidirectional mode you used all num_buckets for each "
     "direction", "num_buckets //= 2 first: each direction gets half of them"),
    ("max_exact", "max_exact from the whole number of buckets", "you computed max_exact = num_buckets // 2 before "
     "halving the buckets", "halve num_buckets first (bidirectional), then max_exact = num_buckets // 2"),
    ("round", "logarithmic bucket rounded instead of floored", "you rounded the logarithmic bucket", _T5_TRUNC),
    ("linear", "no logarithmic buckets", "your distances beyond max_exact each get their own bucket",
     "beyond max_exact: max_exact + log(dist/max_exact) / log(max_distance/max_exact) × (num_buckets − max_exact)"),
    ("max_distance", "max_distance ignored", "your buckets use 128 whatever `max_distance` is passed",
     "use the max_distance argument"),
    ("no_offset", "no offset for keys after the query", "your keys after the query (j − i > 0) share the lower "
     "half of the buckets; they use the upper half", "add (rel > 0).long() * (num_buckets // 2)"),
    ("ceil", "logarithmic bucket rounded up instead of floored", "you rounded the logarithmic bucket up", _T5_TRUNC),
    ("offset_before", "upper half of the buckets given to the keys before the query", "you added "
     "num_buckets // 2 where j − i < 0; the upper half is for j − i > 0", "offset = (rel > 0) * num_buckets // 2"),
    ("uni_sign", "not bidirectional: distance of the keys after the query", "with bidirectional=False your distance "
     "is max(j − i, 0); T5's causal buckets count the keys before the query, max(i − j, 0)",
     "distance = (-rel).clamp(min=0) with rel = j − i"),
])
_T5_CLAMP = [(kind, r".*" if kind == "IndexError" else r"out of (?:bounds|range)", "a bucket index reached "
              "num_buckets: distances beyond max_distance go to the last bucket of their half (num_buckets // 2 "
              "buckets per half when bidirectional)", "torch.clamp(bucket, max=num_buckets - 1), num_buckets halved")
             for kind in ("IndexError", "RuntimeError", "ValueError")]


def _t5_measured(failure: Failure, out: torch.Tensor, n: int, table: torch.Tensor, bi: bool, md: int) -> None:
    """When each entry is a table value, say which relative positions get which bucket."""
    if failure.diagnosis.cause or tuple(out.shape) != (table.shape[1], n, n):
        return
    # (n, n, num_buckets): which buckets' rows this (i, j) holds, at most one (the cases' tables are randn draws, no
    # two rows alike: tests/checks/test_position.py keeps it so)
    hits = torch.isclose(out.double().permute(1, 2, 0)[:, :, None, :], table.double()[None, None], atol=1e-6,
                         rtol=1e-5).all(-1)
    if not bool(hits.any(-1).all()):
        fail_again(failure, "entries that are not table values", "some of your entries are no value of `table`: each "
               "bias is table[bucket, head] itself (nothing added, scaled, averaged or mixed between heads)", _T5_FIX)
    mine, right = hits.float().argmax(-1), _t5_buckets(n, table.shape[0], bi, md)[0]
    rel = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    wrong = sorted({int(r) for r in rel[mine != right]})
    if any(len({int(b) for b in mine[rel == r]}) > 1 for r in wrong):
        fail_again(failure, "buckets that depend on i and j, not on j − i", "your entries are table values, but two "
               "pairs (i, j) with the same j − i get different buckets", _T5_FIX)
    half = table.shape[0] // 2 if bi else table.shape[0]
    dist = [abs(r) if bi else max(-r, 0) for r in wrong]
    region = " (all exact distances, below max_exact)" if max(dist) < half // 2 else \
        " (all in the logarithmic range, distance ≥ max_exact)" if min(dist) >= half // 2 else ""
    shown = "; ".join(f"j − i = {r} → bucket {int(mine[rel == r][0])}, T5's {int(right[rel == r][0])}"
                      for r in wrong[:5]) + ("…" if len(wrong) > 5 else "")
    many = f"{len(wrong)} relative positions get" if len(wrong) > 1 else "1 relative position gets"
    fail_again(failure, "wrong buckets", f"your entries are table values, one bucket per j − i as they should be, but "
           f"{many} the wrong bucket{region}: {shown}", _T5_FIX)


_HEAD_AXES = ("heads", "queries", "keys")
_T5_CASES = [(6, 32, 2, True, 128), (40, 32, 3, True, 128), (40, 32, 1, False, 20), (1, 8, 4, True, 16),
             (30, 8, 2, True, 12), (25, 16, 2, False, 64), (35, 32, 2, True, 24, torch.float32), (12, 4, 2, True, 8),
             (30, 10, 2, True, 20), (30, 9, 1, False, 24), (8, 3, 2, False, 2), (60, 10, 2, False, 256),
             (30, 11, 2, True, 24)]  # an odd number of buckets, bidirectional: num_buckets // 2 per direction


@check("relative_position_bias",
       expects="a function relative_position_bias(n, table, bidirectional=True, max_distance=128) returning (A, n, n)")
def check_relative_position_bias(fn: Learner) -> str:
    g = torch.Generator().manual_seed(7)
    cases = [(n, torch.randn(nb, heads, generator=g, dtype=torch.float64).to(*dtype or [torch.float64]), bi, md)
             for n, nb, heads, bi, md, *dtype in _T5_CASES]
    suspects = Suspects(_T5_TABLE, atol=1e-6, rtol=1e-5)
    for case in cases:
        (n, table, bi, md), (nb, heads) = case, case[1].shape
        expected, alt = (table[b].permute(2, 0, 1).double() for b in _t5_buckets(n, nb, bi, md))
        tried = (f"relative_position_bias({n}, table ({nb} buckets × {heads} heads), bidirectional={bi}, "
                 f"max_distance={md})")
        out = call(fn, case, tried, f"a ({heads}, {n}, {n}) tensor", patterns=_T5_CLAMP)
        if tuple(out.shape) == (n, n, heads) and heads != n:
            fail("heads last: shape (n, n, A)", tried=tried, got=f"shape {tuple(out.shape)}",
                 expected=f"shape {(heads, n, n)}", cause="table[buckets] has the heads last",
                 fix="move them first: table[buckets].permute(2, 0, 1)")
        try:
            expect_shape(out, expected.shape, tried=tried, what="your bias", fix="(A, n, n): an (n, n) matrix per head")
        except Failure as failure:
            kept_slice(failure, out, expected, ("head", "query", "key"))
            raise
        # where the logarithm lands on a whole number, float32 code may take the bucket below: both are right
        expected = torch.where(torch.isclose(out.double(), alt, atol=1e-6, rtol=1e-5), alt, expected)
        judge(suspects, fn, out, expected, case, tried, lambda f: _t5_measured(f, out, *case), what="your bias",
              fix=_T5_FIX, axes=_HEAD_AXES, distinguish=cases)
    # `table` is the second argument: the first name goes to n, an int, which no call can change
    kit.expect_unchanged(fn, cases[0], call="relative_position_bias(n, table, bidirectional, max_distance)", name="n",
                         others=("table",), shown="n = 6, table (32 buckets × 2 heads) float64, bidirectional=True, "
                         "max_distance=128")
    return (f"matches T5's buckets on {len(cases)} cases (bidirectional and not, logarithmic buckets, clamping "
            "beyond max_distance)")


# ================================================================================== ALiBi
def _alibi(n: int, heads: int, mistake: str = "") -> torch.Tensor | None:
    i, h = torch.arange(n, dtype=torch.float64), torch.arange(1, heads + 1, dtype=torch.float64)
    diff = i[:, None] - i[None, :]  # i − j
    m = {"halve": 0.5 ** h, "from1": 2.0 ** (-8 * (h - 1) / heads), "reversed": ref.alibi_slopes(heads).flip(0),
         "linear": h / heads, "inverse": 1 / h, "falling": 1 - h / (heads + 1),
         "floor_div": 2.0 ** (-(8 // heads) * h)}.get(mistake, ref.alibi_slopes(heads))
    shape = {"positive": diff.abs(), "signed": -diff, "signed_T": diff, "causal": -diff.clamp(min=0)}.get(
        mistake, -diff.abs())
    out = m.double()[:, None, None] * shape
    return out.permute(1, 2, 0) if mistake == "heads_last" else out


_SLOPE_FIX = "slope_a = 2^(−8(a+1)/A) for a = 0 … A − 1: geometric, from 2^(−8/A) with ratio 2^(−8/A)"
_ABS = "use the distance: (i − j).abs()"
_SIGNED = "not symmetric: −slope·(i − j) without the absolute value"
_ALIBI_TABLE = variants(_alibi, [
    ("halve", "slopes halve from head to head whatever A", "your slopes are 1/2, 1/4, …: right for 8 heads only",
     _SLOPE_FIX),
    ("from1", "slopes start at 1", "your first slope is 2^0 = 1: you counted heads from 0 in 2^(−8a/A)", _SLOPE_FIX),
    ("reversed", "slopes in reverse order", "your smallest slope is on head 0", "head 0 has the largest, 2^(−8/A)"),
    ("floor_div", "slopes with 8 // A", "your exponent uses integer division, 8 // A: right when A divides 8, but 0 "
     "for more than 8 heads (every slope 1) and rounded down otherwise", "divide as floats: 2 ** (-8 * (a + 1) / A)"),
    ("linear", "slopes not geometric", "your slopes grow linearly ((a + 1)/A)", _SLOPE_FIX),
    ("inverse", "slopes not geometric", "your slopes are 1/(a + 1)", _SLOPE_FIX),
    ("falling", "slopes not geometric", "your slopes fall linearly (1 − (a + 1)/(A + 1))", _SLOPE_FIX),
    ("positive", "bias positive", "your bias grows with distance (+slope·|i − j|): far keys are favoured",
     "negate it: bias = −slope_a·|i − j|"),
    ("signed", _SIGNED, "your bias is positive above the diagonal (keys after the query)", _ABS),
    ("signed_T", _SIGNED, "your bias is positive below the diagonal", _ABS),
    ("causal", "zero for keys after the query", "your bias is 0 above the diagonal (the causal form); the docstring "
     "asks for −slope_a·|i − j| everywhere", _ABS),
    ("heads_last", "heads last: shape (n, n, A)", "your heads are on the last axis", "put the heads first: (A, n, n)"),
])


def _alibi_measured(failure: Failure, out: torch.Tensor, n: int, heads: int) -> None:
    """Which slice a wrong shape holds; when the bias is −slope_a·|i − j| with wrong slopes, what they are."""
    kept_slice(failure, out, _alibi(n, heads), ("head", "query", "key"))  # a wrong shape: which slice it holds
    if failure.diagnosis.cause or n < 2 or tuple(out.shape) != (heads, n, n):
        return
    distance = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().double()
    slopes = -out[:, 1, 0].double()  # (A,)
    if not same(out.double(), -slopes[:, None, None] * distance, atol=1e-6, rtol=1e-5):
        return
    shown, expected = (", ".join(fmt(float(s)) for s in t[:6]) + ("…" if heads > 6 else "")
                       for t in (slopes, ref.alibi_slopes(heads)))
    got, summary, ratios = f"your slopes are {shown}", "wrong slopes", slopes[1:] / slopes[:-1]
    if heads > 2 and bool((slopes[:-1] != 0).all()) and torch.allclose(ratios, ratios[0].expand_as(ratios), rtol=1e-4):
        got = (f"your slopes {shown} are geometric with ratio {fmt(float(ratios[0]))}, expected 2^(−8/A) = "
               f"{fmt(2 ** (-8 / heads))} starting at the same value")
    elif heads > 2 and bool((slopes[:-1] != 0).all()):
        got = f"your slopes {shown} are not geometric (ratios {', '.join(fmt(float(r)) for r in ratios[:4])}…)"
        summary = "slopes not geometric"
    fail(summary, tried=failure.diagnosis.tried, got=got,
         expected=f"slopes {expected}: 2^(−8(a+1)/A) for a = 0 … A − 1",
         cause="the form −slope·|i − j| is right; the slopes are not", fix="slope = 2 ** (-8 * (a + 1) / A)")


_ALIBI_CASES = [(5, 8), (7, 4), (1, 4), (6, 1), (24, 16), (12, 2), (3, 32)]  # (24, 16): biases down to −16.3


@check("alibi_bias", expects="a function alibi_bias(n, n_heads) returning an (n_heads, n, n) tensor")
def check_alibi_bias(fn: Learner) -> str:
    suspects = Suspects(_ALIBI_TABLE, atol=1e-7, rtol=1e-5)
    for case in _ALIBI_CASES:
        tried = f"alibi_bias{case}"
        out = call(fn, case, tried, f"an ({case[1]}, {case[0]}, {case[0]}) tensor")
        floating(out, tried, "the slopes are fractions: compute in floating point")
        kit.half_rounded(out, _alibi(*case), tried=tried, what="your bias", fix="compute the slopes and the bias in "
                         "float32 or float64: leave out .half() and .bfloat16()")
        judge(suspects, fn, out, _alibi(*case), case, tried, lambda f: _alibi_measured(f, out, *case),
              what="your bias", axes=_HEAD_AXES, distinguish=_ALIBI_CASES,
              fix="bias[a, i, j] = −slope_a·|i − j| with slope_a = 2^(−8(a+1)/A)")
    return f"matches −slope_a·|i − j| on {len(_ALIBI_CASES)} cases (1 to 32 heads, n = 1, slopes 2^(−8(a+1)/A))"
