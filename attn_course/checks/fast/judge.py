"""Judging the values: every answer through the kit's engine and the tables of :mod:`.mistakes`; a wrong
answer no row reproduces is named by a property measured on it."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from ..compare import Failure, call_or_skip, same
from ..core import Learner, LearnerRaised, as_tensor, fail, fmt, learner_error
from ..kit import (Known, Suspects, epsilon_in_the_sum, expect_float64_precision, expect_not_kept, expect_unchanged,
                   explain_raise, narrowing_calls)
from .cases import Case
from .mistakes import CAUSAL_FIX, FINAL_FIX, PATTERNS, Q_WIDTH
from .steps import Tensor, blocks


# ============================================================================ judging the values
_PRECISION = {torch.float64: 3, torch.float32: 2, torch.bfloat16: 1, torch.float16: 1}
_LOOP_FIX = "print m, l and acc after each block on this input and compare them with the notebook's worked example"


def run(fn: Learner, exercise: str, cases: Sequence[Case], table: Sequence[Known], raises: Sequence[tuple]) -> None:
    """Every case through the kit's engine: a row is a suspect only if it also reproduces every answer after the
    first wrong one; before a generic mismatch, the properties of :func:`_measure`. Then dtypes and unchanged inputs."""
    softmax = exercise == "online_softmax"
    args, first, what = ("x", "x", "your result") if softmax else ("q, k, v", "q", "your output")
    suspects = Suspects(_remembered(exercise, cases, table), atol=2e-5, rtol=1e-3)  # float32's tolerance
    answers: list[tuple[Case, Tensor, str]] = []
    for case in cases:
        tried = f"{exercise}({args}, {case.block}) on {case.name}"
        try:
            answers.append((case, as_tensor(fn(*case.args), tried=tried), tried))
        except LearnerRaised as exc:
            if any(not _right(out, c) for c, out, _ in answers):
                break  # an earlier wrong answer is the one to explain
            constructs = [(cause, fix, functools.partial(make, *case.args)) for cause, fix, make in raises]
            raise Failure(learner_error(exc, tried=tried, expected="a tensor shaped like x" if softmax else
                                        "a tensor (..., n_q, d_v)", **explain_raise(exc, constructs, PATTERNS))) from None
    for i, (case, out, tried) in enumerate(answers):
        if not _right(out, case):  # the rows' outputs on the check's own cases are remembered: None where they raise
            expect_not_kept(out, case.expected, [(c.name, a, c.expected) for c, a, _ in answers[:i]], tried=tried,
                            what=what, close=lambda x, y: same(x, y, atol=case.atol, rtol=case.rtol))
            suspects.table = [k for k in suspects.table if all(
                (o := k.make(*c.args)) is None or same(a, o, atol=c.atol, rtol=c.rtol) for c, a, _ in answers[i + 1:])]
            if not suspects.suspects(out, case.args):
                _measure(fn, out, case, tried, softmax)
        suspects.expect(out, case.expected, case.args, tried=tried, what=what, atol=case.atol, rtol=case.rtol,
                        fix=_LOOP_FIX, oracle="torch.softmax" if softmax else "F.scaled_dot_product_attention")
    for case, out, tried in answers:  # right values, and no less precise than the input
        given = case.args[0].dtype
        got, want = (str(t).replace("torch.", "") for t in (out.dtype, given))
        if _PRECISION.get(out.dtype, 0) < _PRECISION[given]:
            _narrowed(out, given, tried, first)
        if out.dtype != given:  # right values at a wider precision: still not what the docstring returns
            fail(f"result in {got} for {want} input", tried=tried, got=f"a {got} result with the right values",
                 expected=f"a {want} result: the docstring returns {first}'s dtype",
                 cause=f"your computation converted to {got} (.double(), or a tensor created with dtype={out.dtype}) "
                       "and the result was not converted back",
                 fix=f"computing in a wider dtype is fine; convert the result back at the end: .to({first}.dtype)")
        _epsilon(out, case, tried, softmax)
        expect_float64_precision(out, case.expected, tried=tried, what="your result", first=first)
    for case in (cases[1], cases[0], *cases[2:]):  # right values on every case: the inputs must come back as given
        expect_unchanged(fn, case.args, call=f"{exercise}({args}, {case.block})", name=first, shown=case.name,
                         others=() if softmax else ("k", "v"))


def _narrowed(out: Tensor, given: torch.dtype, tried: str, first: str) -> None:
    """Fail: a result in a narrower floating dtype than the input's."""
    got, want = (str(t).replace("torch.", "") for t in (out.dtype, given))
    fail(f"result in {got} for {want} input", tried=tried,
         got=f"a {got} result, close to the right values but with {got}'s precision",
         expected=f"a {want} result, like the input",
         cause=("a tensor you created without dtype= (torch.empty, zeros and full make float32 by default), "
                "or " if out.dtype == torch.float32 else "") + f"a conversion to {got} ({narrowing_calls(out.dtype)})",
         fix=f"create every tensor with dtype={first}.dtype (or with *_like functions) and convert nothing to {got}")


def _right(out: Tensor, case: Case) -> bool:
    return same(out, case.expected, atol=case.atol, rtol=case.rtol)


_OUTPUTS: dict[tuple[str, str, int], Any] = {}


def _remembered(exercise: str, cases: Sequence[Case], table: Sequence[Known]) -> list[Known]:
    """The table, each row's output on the check's own (fixed) cases computed once per process (None: it raises)."""
    index = {id(c.args[0]): i for i, c in enumerate(cases)}

    def once(known: Known) -> Callable[..., Any]:
        def make(*args: Any) -> Any:
            i = index.get(id(args[0]))
            if i is None or any(a is not b for a, b in zip(args, cases[i].args)):
                return known.make(*args)
            if (exercise, known.key, i) not in _OUTPUTS:
                _OUTPUTS[exercise, known.key, i] = call_or_skip(lambda: known.make(*args))
            return _OUTPUTS[exercise, known.key, i]
        return make

    return [dataclasses.replace(k, make=once(k)) for k in table]


def _measure(fn: Learner, out: Tensor, case: Case, tried: str, softmax: bool) -> None:
    """Properties of a wrong answer that no known mistake reproduces; each ends the check when it holds."""
    e, what = case.expected, "your result" if softmax else "your output"
    got, expected = f"{what} of shape {tuple(out.shape)}", f"shape {tuple(e.shape)}"
    if tuple(out.shape) != tuple(e.shape):
        if out.dim() >= 2 and tuple(out.shape) == tuple(e.transpose(-2, -1).shape) and \
                same(out.transpose(-2, -1), e, atol=case.atol, rtol=case.rtol):
            fail("output transposed", tried=tried, got=got + ": the right numbers with the last two axes swapped",
                 expected=expected, cause="you returned the result transposed (the last two axes swapped)",
                 fix="return it with the docstring's axes: " + ("(..., n)" if softmax else "(..., n_q, d_v)"))
        if softmax and tuple(out.shape) == tuple(e.shape[:-1]) + (1,):
            fail("one value per row instead of the softmax", tried=tried, got=got + ": one number per row",
                 expected=expected, cause="you returned a per-row quantity (shaped like the running max m or sum l, "
                 "or built from them alone) instead of exp(x − m) / l", fix=FINAL_FIX)
        q, v = case.args[0], case.args[-2]
        if not softmax and out.shape == q.shape and q.shape[-1] != v.shape[-1]:
            fail("output has q's width d_k, not v's width d_v", tried=tried, got=got, expected=expected,
                 cause=Q_WIDTH[0], fix=Q_WIDTH[1])
        return  # the engine's shape diagnosis follows
    if not out.is_floating_point():
        return
    given = case.args[0].dtype
    if _PRECISION.get(out.dtype, 0) < _PRECISION.get(given, 0) and \
            same(out, e, atol=1e-3 * max(1.0, float(e.abs().max())), rtol=1e-3):
        # close, but not within the input dtype's tolerance: the narrower dtype (a float32 tensor or a .float()
        # on a float64 input) is what rounds it off, on the extreme cases first
        _narrowed(out, given, tried, "x" if softmax else "q")
    if out.dtype == given == torch.float64 and bool(torch.isfinite(out).all()):
        # float64 result, off by no more than the oracle itself computed in float32 would be: float32 inside
        f32 = [t.float() for t in case.args[:-1]]
        rounded = (torch.softmax(f32[0], -1) if softmax else F.scaled_dot_product_attention(*f32, is_causal=case.causal))
        off, off32 = float((out - e).abs().max()), float((rounded.double() - e).abs().max())
        if off <= 10 * off32:
            expect_float64_precision(out, e, tried=tried, what=what, first="x" if softmax else "q")
    a, axis, b = out.double(), -1 if softmax else -2, case.block
    n, unit = e.shape[axis], "columns" if softmax else "rows"
    rows = lambda t: t.movedim(axis, 0).reshape(n, -1)  # noqa: E731 - (n, everything else): a row per position
    bad = rows(~torch.isclose(a, e, atol=case.atol, rtol=case.rtol)).any(1)  # (n,) positions with a wrong entry
    ps, pe = blocks(n, b)[-1]
    if pe - ps < b and ps > 0 and bad[ps:].any() and not bad[:ps].any():
        fail(f"wrong only in the last, partial block ({unit} {ps}–{pe - 1})", tried=tried,
             got=f"the {unit} of every full block are right, but {unit} {ps}–{pe - 1} (the last block, {pe - ps} long "
                 f"instead of {b}) are wrong", expected="the same computation for a block shorter than block_size",
             cause="your loop handles a block shorter than block_size differently (a slice or range that assumes full "
                   "blocks, or a buffer of size block_size)",
             fix="use range(0, n, block_size) and slices [start:start + block_size], which stop at the end by "
                 "themselves, and size every buffer from the slice you got")
    if not softmax and bad.any() and not bad.all():  # some rows right: were the others written at all?
        zero = (rows(a).abs() < 1e-30).all(1) & (rows(e).abs() > 1e-12).any(1)
        # a computed row doubles when v doubles (exactly: × 2 commutes with rounding); memory never written does not
        q, k, v, _ = case.args
        doubled = call_or_skip(lambda: as_tensor(fn(q, k, 2 * v, b), tried=tried))
        stale = ~rows(torch.isclose(doubled.double(), 2 * a, atol=case.atol, rtol=case.rtol, equal_nan=True)).all(1) \
            if doubled is not None and doubled.shape == out.shape else torch.zeros_like(zero)
        if not (bad & ~zero & ~stale).any():
            shown = [int(i) for i in bad.nonzero()]
            first, d_k = shown[0], case.args[0].shape[-1]
            stop = f" (it stops at {first} = d_k = q.shape[-1]: n_q is q.shape[-2])" if first == d_k and shown == \
                list(range(first, n)) else ""
            fail(f"output rows never written ({_list(shown)})", tried=tried,
                 got=f"rows {_list(shown)} of your output " + ("are 0 (what torch.zeros or a fresh torch.empty holds)"
                     if bool(zero[bad].all()) else "are 0 or do not double when v is doubled, as computed rows do "
                     "(torch.empty leaves whatever the memory held)") + "; the other rows are right",
                 expected="every row computed",
                 cause=f"your query loop never writes these rows{stop}",
                 fix="visit every query block: for q_start in range(0, n_q, block_size)")
    if torch.isnan(a).all() and a.numel() > 1:
        fail("NaN from the first block on", tried=tried, got=f"every entry of {what} is NaN", expected="finite numbers",
             cause="the first update of the running state already gives NaN (common causes: rescaling by "
                   "exp(m_new − m_old), which is exp(+inf) = inf on the first block while the sum is 0, and "
                   "0 × inf = NaN; or a running max that starts at +inf)",
             fix="start m at −inf and l, acc at 0; rescale by exp(m_old − m_new); print m and l after the first block")
    _epsilon(out, case, tried, softmax)
    if torch.isfinite(a).all() and a.numel():
        c = (a * e).sum(-1, keepdim=True) / (e * e).sum(-1, keepdim=True).clamp_min(1e-300)  # a ≈ c · e, row by row?
        if torch.allclose(a, c * e, atol=1e-7, rtol=1e-6) and not torch.allclose(c, torch.ones_like(c), rtol=1e-5, atol=0):
            span = f"from {fmt(float(c.min()))} to {fmt(float(c.max()))}"
            fail("rows scaled by a wrong normaliser", tried=tried,
                 got=f"each row is softmax(x) times its own factor ({span}), so the rows sum to those factors" if softmax
                 else f"each output row is the right one times its own factor ({span})",
                 expected="rows that sum to 1" if softmax else "each row a weighted average of v's rows (weights summing to 1)",
                 cause="the running sum l does not equal Σ exp(x − m) over the row: it is rescaled or summed differently "
                       "from how exp(x − m) is formed at the end" if softmax else "the accumulator and the running sum l "
                       "do not match: one is rescaled, summed or divided differently from the other",
                 fix="after each block: l = l · exp(m_old − m_new) + Σ exp(block − m_new); return exp(x − m) / l with the "
                     "final m" if softmax else "rescale acc and l by the same exp(m_old − m_new), and divide acc by l once, "
                     "after the last key block")
    c = _temperature(a, case)
    d_k = 1 if softmax else case.args[0].shape[-1]
    if c is not None and abs(c * math.sqrt(d_k) - 1) > 1e-3:  # 4 digits: a factor that prints as 1/√d_k is rounding
        factor = c * math.sqrt(d_k)
        named = next((name for name, value in {"ln 2 (exp2 used in place of exp)": math.log(2),
                                               "1/ln 2 (log2 e folded in twice)": 1 / math.log(2), "√d_k": math.sqrt(d_k),
                                               "1/√d_k": 1 / math.sqrt(d_k), "d_k": float(d_k)}.items()
                      if abs(factor - value) <= 1e-3 * value and (not softmax or "ln" in name)), "")
        if softmax:
            fail(f"softmax of {fmt(c)} · x", tried=tried, got=f"exactly softmax({fmt(c)} · x), rows summing to 1",
                 expected="softmax(x)", cause="you used exp2 (base 2) where the formulas use exp: 2^x = e^(x·ln 2)"
                 if named.startswith("ln 2") else f"your exponentials see the values multiplied by {fmt(c)}",
                 fix="use torch.exp for every exponential, on x − m itself")
        fail(f"scores scaled by {fmt(c)} instead of 1/√d_k = {fmt(1 / math.sqrt(d_k))}", tried=tried,
             got=f"exactly softmax({fmt(c)} · q kᵀ) v", expected=f"softmax(q kᵀ / √d_k) v with d_k = {d_k}",
             cause=f"your scores are {named} times the right ones" if named else
             f"your scores are multiplied by {fmt(c)} somewhere, not by 1/√d_k",
             fix="multiply q kᵀ by 1/√d_k, d_k = q.shape[-1], once, and use torch.exp for the exponentials")
    if case.causal:
        _leak(fn, case, tried)


def _epsilon(out: Tensor, case: Case, tried: str, softmax: bool) -> None:
    """Fail naming it when a float64 result is, to float64 rounding, the right one times S / (S + ε) on every row for
    one ε > 0, S = Σ exp(s − the row's maximum) ≥ 1: an epsilon added to the running sum l (rows of unequal S tell it
    from a constant factor; float32 rounding is no factor of a row)."""
    e = case.expected
    if out.dtype != torch.float64 or tuple(out.shape) != tuple(e.shape) or not bool(torch.isfinite(out).all()):
        return
    if softmax:
        s = case.args[0].double()
    else:
        q, k = (t.double() for t in case.args[:2])
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if case.causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    sums = torch.exp(s - s.amax(-1, keepdim=True)).sum(-1)
    value = epsilon_in_the_sum(out, e, torch.broadcast_to(sums, e.shape[:-1]), atol=1e-13 * float(e.abs().max()),
                               rtol=1e-10) if e.shape[-1] >= 2 else None
    if value is not None:
        fail("an epsilon added to the sum", tried=tried,
             got=("your result" if softmax else "your output") + f" is the right one times l / (l + {value:.2g}) on "
                 "every row, l = Σ exp(s − m)", expected="exp(x − m) / l" if softmax else "acc / l",
             cause=f"you added an epsilon (about {value:.2g}) to the running sum l, or where you divide by it; with "
                   "the maximum subtracted, l is at least 1 (the maximum's own term is exp(0) = 1), never 0",
             fix="divide by l itself: no epsilon is needed")


def _list(rows: list[int]) -> str:
    return ", ".join(map(str, rows[:6])) + ("…" if len(rows) > 6 else "")


def _temperature(a: Tensor, case: Case) -> float | None:
    """c when ``a`` is exactly softmax(c · x) (fitted on log a), or softmax(c · q kᵀ) v (a search over c)."""
    if not torch.isfinite(a).all():
        return None
    if len(case.args) == 2:
        x = case.args[0].double()
        if not (a > 0).all() or x.shape[-1] < 2:
            return None
        xc, yc = x - x.mean(-1, keepdim=True), a.log() - a.log().mean(-1, keepdim=True)
        if float((xc * xc).sum()) < 1e-12:
            return None
        c = float((xc * yc).sum() / (xc * xc).sum())
        fits = torch.allclose(yc, c * xc, atol=1e-6, rtol=1e-5) and torch.allclose(a.sum(-1), torch.ones(1, dtype=a.dtype))
        return c if fits else None
    q, k, v = (t.double() for t in case.args[:3])
    raw = q @ k.transpose(-2, -1)
    if case.causal:
        raw = raw.masked_fill(torch.ones(raw.shape[-2:], dtype=torch.bool).triu(1), -math.inf)

    def error(log_c: float) -> float:
        return float((torch.softmax(raw * math.exp(log_c), -1) @ v - a).abs().max())

    best = min((i / 8 for i in range(-80, 81)), key=error)  # c from e^-10 to e^10, then a golden-section refinement
    lo, hi = best - 1 / 8, best + 1 / 8
    for _ in range(40):
        x1, x2 = hi - (hi - lo) * 0.618, lo + (hi - lo) * 0.618
        lo, hi = (lo, x2) if error(x1) < error(x2) else (x1, hi)
    log_c = (lo + hi) / 2
    return math.exp(log_c) if error(log_c) <= case.atol + case.rtol * float(a.abs().max()) else None


def _leak(fn: Learner, case: Case, tried: str) -> None:
    """Causal: change the last key and value only; every earlier row of a causal answer must stay put. (An answer
    that differs between two calls on the same input, unwritten torch.empty memory, tells nothing.)"""
    q, k, v, b = case.args
    k2, v2 = k.clone(), v.clone()
    k2[..., -1, :] += 3.0
    v2[..., -1, :] -= 5.0
    try:
        first, second, again = (as_tensor(fn(q, k_, v_, b), tried=tried) for k_, v_ in ((k, v), (k2, v2), (k, v)))
    except Exception:  # noqa: BLE001 - this probe only adds evidence
        return
    n = q.shape[-2]
    if n < 2 or tuple(first.shape) != tuple(second.shape) or first.shape[-2] != n or not same(first, again, atol=0, rtol=0):
        return
    changed = ~torch.isclose(first[..., :-1, :].double(), second[..., :-1, :].double(), atol=1e-9, rtol=1e-7,
                             equal_nan=True)
    if changed.any():
        fail("queries see future keys", tried=f"{tried}, then again with only the last key and value changed",
             got=f"rows {_list(sorted({int(i) for i in changed.nonzero()[:, -2]}))} changed too, though they come "
                 "before the last position",
             expected=f"only row {n - 1} (the one query allowed to see the last key) to change",
             cause="some tiles (or entries) above the diagonal reach the softmax: a tile past the diagonal is "
                   "computed, or the mask lets key > query through",
             fix="visit key blocks only up to the diagonal and " + CAUSAL_FIX)
