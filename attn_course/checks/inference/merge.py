"""The check of merge_partials: the merge of two partials (m, l, acc) against its definition in float64,
its known mistakes, and the factor a wrong merge gives each side, measured."""

from __future__ import annotations

import itertools
from typing import Any

import torch

from ..compare import Failure, describe_mismatch, fmt, same
from ..core import Learner, LearnerRaised, LearnerTimedOut, check, expect_shape, fail
from ..kit import (Suspects, call_explained, expect_dtype, expect_float64_precision, expect_unchanged,
                   lower_precision, unpack, variants)
from .oracle import LOOSE, PATTERNS, tolerance


def _pack(m, l, acc) -> torch.Tensor:
    """(m, l, acc) as one tensor (..., n_q, 2 + d_v): what the engine compares."""
    return torch.cat([m.double(), l.double(), acc.double()], dim=-1)


def _merge_variant(a, b, mistake: str = ""):
    """The merge in float64, or one of its classic mistakes."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = [[t.double() for t in p] for p in (a, b)]
    m = {"min": torch.minimum(m_a, m_b), "logaddexp": torch.logaddexp(m_a, m_b),
         "m_first_rel": m_a}.get(mistake, torch.maximum(m_a, m_b))  # m_first_rel: both sides rescaled relative to m_a
    shift = m if mistake == "unguarded" else torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    alpha, beta = {"inverted": (torch.exp(shift - m_a), torch.exp(shift - m_b)), "absolute": (m_a.exp(), m_b.exp()),
                   "exp2": (torch.exp2(m_a - shift), torch.exp2(m_b - shift)),
                   "swapped": (torch.exp(m_b - shift), torch.exp(m_a - shift))}.get(
        mistake, (torch.exp(m_a - shift), torch.exp(m_b - shift)))
    l, acc = l_a * alpha + l_b * beta, acc_a * alpha + acc_b * beta
    pick = m_a >= m_b
    l, acc = {"winner": (torch.where(pick, l_a, l_b), torch.where(pick, acc_a, acc_b)),
              "average": ((l_a + l_b) / 2, (acc_a + acc_b) / 2), "none": (l_a + l_b, acc_a + acc_b),
              "only_l": (l, acc_a + acc_b), "only_acc": (l_a + l_b, acc), "normalised": (l, acc / l)}.get(
        mistake, (l, acc))
    m = {"m_first": m_a, "m_sum": m_a + m_b}.get(mistake, m)
    return m, l, acc


_EACH = "l = l_a·exp(m_a − m) + l_b·exp(m_b − m), and the same for acc"
_MAX = "m = torch.maximum(m_a, m_b)"
#: A case of merge_partials: (part_a, part_b).
MERGE = variants(lambda x, y, key: _pack(*_merge_variant(x, y, key)), [
    ("none", "merge without rescaling", "you added l_a + l_b and acc_a + acc_b, computed relative to different maxima",
     "rescale each side by exp(m_side − m) with m = max(m_a, m_b) before adding"),
    ("inverted", "rescaled by exp(m − m_side) instead of exp(m_side − m)", "your factors are ≥ 1: the rescaling is "
     "the wrong way round", "multiply by exp(m_a − m) and exp(m_b − m), each ≤ 1"),
    ("absolute", "rescaled by e^m instead of e^(m_side − m)", "you multiplied by exp(m_a) and exp(m_b): l and acc "
     "are then measured from 0, not from the merged maximum (and e^m overflows once m passes 88.7 in float32)", "multiply by exp(m_a − m) and exp(m_b − m) with m = max(m_a, m_b)"),
    ("only_l", "acc not rescaled", "you rescaled l but not the accumulators", "rescale acc_a and acc_b as l_a and l_b"),
    ("only_acc", "l not rescaled", "you rescaled the accumulators but not l", "rescale l_a and l_b as acc_a and acc_b"),
    ("m_first", "m not updated to the larger maximum", "you returned m_a as the merged m", "return m = max(m_a, m_b)"),
    ("m_first_rel", "m not updated to the larger maximum", "you kept m = m_a and rescaled side b by exp(m_b − m_a), "
     "which overflows when m_b is much larger", "m = max(m_a, m_b); rescale each side by exp(m_side − m)"),
    ("m_sum", "m added instead of maximised", "you returned m_a + m_b as the merged m", "return " + _MAX),
    ("normalised", "acc divided by l", "you returned the normalised output acc / l instead of the accumulator",
     "keep acc unnormalised: divide by l once, after the last merge"),
    ("unguarded", "NaN where neither chunk sees a key", "where m_a = m_b = −inf, exp(m_a − m) is exp(−inf − (−inf)) "
     "= exp(NaN)", "shift by 0 where m is −inf: torch.where(torch.isinf(m), torch.zeros_like(m), m)"),
    ("min", "m = min(m_a, m_b), not the maximum", "with the smaller maximum the factors exp(m_side − m) are ≥ 1 and "
     "overflow for large scores", _MAX),
    ("logaddexp", "m = logsumexp(m_a, m_b), not max(m_a, m_b)", "you combined the two maxima with logaddexp",
     _MAX + "; the sums l carry the rest"),
    ("winner", "kept only the side with the larger maximum", "you dropped the keys of the chunk whose m is smaller; "
     "it contributes too, rescaled by exp(m_side − m)", _EACH),
    ("average", "averaged the two sides instead of rescaling and adding", "you returned (l_a + l_b) / 2 and "
     "(acc_a + acc_b) / 2", _EACH),
    ("swapped", "each side rescaled by the other side's factor", "you multiplied side a by exp(m_b − m) and side b by "
     "exp(m_a − m)", "side a gets exp(m_a − m), side b gets exp(m_b − m)"),
    ("exp2", "rescaled with 2^(m_side − m) instead of e^(m_side − m)", "you used exp2 (or 2 ** …), but m and l "
     "come from the natural exponential", "use torch.exp(m_side − m)")])


def _merge_cases() -> list[tuple[str, tuple]]:
    from ...inference import partial_attention  # lazily: the reference module imports matplotlib

    g = torch.Generator().manual_seed(31)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    def split(q, k, v, at, masks=(None, None)):
        return tuple(partial_attention(q, k[..., part, :], v[..., part, :], mask)
                     for part, mask in zip((slice(None, at), slice(at, None)), masks))

    cases = []
    q, k, v = rand(2, 2, 3, 8), rand(2, 2, 10, 8), rand(2, 2, 10, 5)
    k[..., 5:, :] += 1.5 * q.mean(-2, keepdim=True)  # the second chunk's scores are larger: the maximum rises
    cases.append(("batch 2 × heads 2, 3 queries, the second chunk holding the larger scores", split(q, k, v, 5)))
    q, k, v = rand(2, 3, 6), rand(2, 9, 6), rand(2, 9, 4)
    k[..., :4, :] += 1.5 * q.mean(-2, keepdim=True)  # the first chunk's scores are larger: the maximum falls
    cases.append(("batch 2, 3 queries, the first chunk holding the larger scores", split(q, k, v, 4)))
    q, k, v = rand(1, 4), rand(7, 4), rand(7, 1)
    cases.append(("decoding: one query, no batch axes, d_v = 1", split(q, k, v, 3)))
    q, k, v = rand(2, 4, 6), rand(2, 8, 6), rand(2, 8, 3)
    masks = (torch.tensor([True, True, True, False])[:, None].expand(4, 4),  # row 3 sees nothing at all
             torch.tensor([True, False, True, False])[:, None].expand(4, 4))  # rows 1, 3 see nothing of chunk b
    cases.append(("chunks with no visible key for some queries (m = −inf, l = 0, acc = 0), query 3 seeing no key at "
                  "all", split(q, k, v, 4, masks)))
    q, k, v = rand(3, 8) * 40, rand(12, 8) * 40, rand(12, 6)
    cases.append(("scores up to ±1000, float32", tuple(tuple(t.float() for t in p) for p in split(q, k, v, 6))))
    q, k, v = rand(2, 3, 5), rand(2, 4, 5), rand(2, 8, 2)
    k = torch.cat([k, k], dim=-2)  # each chunk holds the same keys: m_a = m_b exactly, and both sides count
    cases.append(("two chunks with equal maxima (the same keys in both)", split(q, k, v, 4)))
    return cases


def _unpack_partial(result: Any, tried: str, want) -> tuple[torch.Tensor, ...]:
    if isinstance(result, torch.Tensor):  # which tensor it is, before unpack's general words
        finished = torch.where(want[1] > 0, want[2] / want[1].clamp(min=1e-300), torch.zeros_like(want[2]))
        tol = tolerance(result.dtype) if result.is_floating_point() else dict(atol=0, rtol=0)
        fail("returned one tensor, not (m, l, acc)", tried=tried, got=f"one tensor of shape {tuple(result.shape)}",
             expected="a tuple (m, l, acc)", fix="return the merged (m, l, acc); divide by l after the last merge",
             cause="you returned the finished output acc / l" if same(result, finished, **tol)
             else "you returned only the merged acc" if same(result, want[2], **tol) else "")
    return unpack(result, ("m", "l", "acc"), tried=tried)


_PROBE_M = ((0.0, -2.0), (-1.5, 0.5), (0.3, 0.3))  # (m_a, m_b) per row: a larger, b larger, equal


def _measured_factors(fn: Learner, dtype: torch.dtype) -> str:
    """A cause naming the factor the learner's merge gives a side's l or acc where it is not exp(m_side − m), read off
    by changing one side's sums at a time (a merge is affine in them); "" when none can be read."""
    m_a, m_b = (torch.tensor([[r[i]] for r in _PROBE_M], dtype=dtype) for i in (0, 1))

    def run(s_a: float, s_b: float):
        out = fn((m_a, torch.full_like(m_a, s_a), torch.full_like(m_a, s_a)),
                 (m_b, torch.full_like(m_b, s_b), torch.full_like(m_b, s_b)))
        if not (isinstance(out, (tuple, list)) and len(out) == 3 and all(
                isinstance(t, torch.Tensor) and tuple(t.shape) == (3, 1) for t in out)):
            raise ValueError("not a partial")
        return [t.double() for t in out]

    try:
        base, a2, b2, lin = run(1, 1), run(2, 1), run(1, 2), run(3, 2)
    except (Failure, LearnerRaised, LearnerTimedOut, ValueError):
        return ""
    m_a, m_b = m_a.double(), m_b.double()
    m = torch.maximum(m_a, m_b)
    rows = ", ".join(f"({fmt(a)}, {fmt(b)})" for a, b in _PROBE_M)
    def show(t: torch.Tensor) -> str:
        return ", ".join(map(fmt, t.flatten().tolist()))
    for i, part in ((1, "l"), (2, "acc")):  # the merge as c + α·s_a + β·s_b, read off three runs, checked on a fourth
        alpha, beta = a2[i] - base[i], b2[i] - base[i]
        const = base[i] - alpha - beta
        if not same(lin[i], const + 3 * alpha + 2 * beta, **LOOSE):
            continue  # not affine in the sums: no factor to read
        wrong = [(side, got, m_s, torch.exp(m_s - m)) for side, got, m_s in (("a", alpha, m_a), ("b", beta, m_b))
                 if not same(got, torch.exp(m_s - m), **LOOSE)]
        extra = "" if same(const, 0 * const, **LOOSE) else f" adds {show(const)} to {part} that no sum multiplies"
        if not (wrong or extra):
            continue
        text = f"measured on rows with (m_a, m_b) = {rows}: your merge"
        if wrong:
            side, got, m_s, want = wrong[0]
            labels = ((torch.ones_like(want), "1 in every row: not rescaled"),
                      (torch.zeros_like(want), f"0: that side's {part} is left out"),
                      (-want, "minus the right factor: subtracted instead of added"),
                      (1 / want, "the inverse of the right factor: divided by it, or exp(m − m_side)"),
                      (m_s - m, "m_side − m itself: the exp is missing"))
            label = next((name for value, name in labels if same(got, value, **LOOSE)), "")
            text += (f" multiplies part {side}'s {part} by {show(got)} where exp(m_{side} − m) is {show(want)}"
                     + (f" ({label})" if label else "") + (" and" if extra else ""))
        return text + extra
    return ""


@check("merge_partials", expects="a function merge_partials(part_a, part_b) returning (m, l, acc)")
def check_merge_partials(fn: Learner) -> str:
    suspects, names, cases = Suspects(MERGE, **LOOSE), ("m", "l", "acc"), _merge_cases()
    for name, (a, b) in cases:
        for order, (x, y) in (("(a, b)", (a, b)), ("(b, a)", (b, a))):
            tried, tol, want = f"merge_partials{order} on {name}", tolerance(a[0].dtype), _merge_variant(x, y)
            got = _unpack_partial(call_explained(fn, x, y, tried=tried, expected="(m, l, acc)", patterns=PATTERNS),
                                  tried, want)
            right = [same(g, w, **tol) for g, w in zip(got, want)]
            for perm in itertools.permutations(range(3)):  # the identity never passes: not all(right)
                if not all(right) and all(same(got[i], want[j], **tol) for i, j in enumerate(perm)):
                    order = ", ".join(names[j] for j in perm)
                    fail(f"returned ({order}), not (m, l, acc)", tried=tried,
                         got=f"the right values in the order ({order})", expected="the tuple (m, l, acc)",
                         cause=f"you returned them in the order ({order})", fix="return m, l, acc in that order")
            for g, w, part in zip(got, want, names):
                expect_shape(g, w.shape, tried=tried, what=f"the merged {part}",
                             fix="m and l are (..., n_q, 1) and acc is (..., n_q, d_v), like the inputs")
            if all(right):
                suspects.passed((x, y), _pack(*want))  # a right case rules out the mistakes that change it
                for g, w, part in zip(got, want, names):
                    lower_precision(g, x[0].dtype, tried=tried, what=f"the merged {part}", grid=False)
                    expect_dtype(g, x[0].dtype, tried=tried, what=f"the merged {part}")
                    expect_float64_precision(g, w, tried=tried, what=f"the merged {part}", first="m_a")
                continue
            empty = torch.isinf(x[0]) & torch.isinf(y[0]) & (x[0] < 0) & (y[0] < 0)  # neither chunk sees a key
            if empty.any() and torch.isfinite(got[0][empty]).all() and same(got[0][~empty], want[0][~empty], **tol):
                fail("m is not −inf where neither chunk sees a key", tried=tried,
                     got=f"m = {got[0][empty].flatten()[0].item():.4g} where m_a = m_b = −inf",
                     expected="m = −inf there (with l = 0 and acc = 0)",
                     cause="you turned −inf into a finite number (nan_to_num, a clamp, or a large negative fill)",
                     fix="keep m = max(m_a, m_b) as it is; guard only the shift used inside exp")
            i = right.index(False)
            g_desc, e_desc, cause, summary = describe_mismatch(got[i], want[i], what=f"your {names[i]}", **tol)
            try:
                suspects.expect(_pack(*got), _pack(*want), (x, y), tried=tried, **tol,
                                again=lambda x, y: _pack(*fn(x, y)), distinguish=[p for _, p in cases])
            except Failure as failure:
                if (d := failure.diagnosis).cause:
                    fail(d.summary, tried=tried, got=g_desc, expected=e_desc, cause=d.cause, fix=d.fix)
            if i == 0 and (side := next((s for s, p in (("a", x), ("b", y)) if same(got[0], p[0], **tol)), None)):
                cause = f"your m equals part {side}'s m_{side} in every row, not the larger of m_a and m_b"
            elif got[i].isnan().any() and not want[i].isnan().any() and (x[0].isinf().any() or y[0].isinf().any()):
                cause = "NaN where a chunk sees no key: with m = −inf, exp(m_a − m) can be exp(−inf − (−inf)) = NaN"
            fail(f"{names[i]}: {summary}", tried=tried, got=g_desc, expected=e_desc,
                 cause=cause or _measured_factors(fn, a[0].dtype),
                 fix="m = max(m_a, m_b); each side is rescaled by exp(m_side − m) (0 when m_side = −inf); "
                     "l and acc are the rescaled sums")
    # Each side as one (3, 3, 1) tensor stacking m, l and acc: it unpacks like the tuple, into views of that tensor,
    # so the probe sees an in-place change of any of the three (it compares tensor arguments, not tuples).
    g = torch.Generator().manual_seed(13)
    m = torch.tensor([[0.5, -1.0, 0.2], [-0.3, 0.7, -torch.inf]], dtype=torch.float64)[..., None]  # each side rescaled
    l = torch.rand(2, 3, 1, generator=g, dtype=torch.float64) + 0.5
    acc = torch.randn(2, 3, 1, generator=g, dtype=torch.float64)
    l[1, 2], acc[1, 2] = 0.0, 0.0  # part_b's last query sees no key
    expect_unchanged(fn, tuple(torch.stack(side) for side in zip(m, l, acc)), call="merge_partials(part_a, part_b)",
                     name="part_a", others=("part_b",), shown="part_a and part_b for 3 queries (d_v = 1, float64; "
                     "part_b's last query sees no key), each passed as one (3, 3, 1) tensor stacking m, l and acc, "
                     "which unpacks as the tuple does")
    return (f"matches the definition on {len(cases)} cases, both orders (rising and falling maxima, chunks with "
            "no visible key, scores ±1000)")
