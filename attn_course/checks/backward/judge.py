"""Judging notebook 10's three gradients against the oracle: the oracle and its inputs, the known mistake or
the measured difference behind a wrong answer, and the learner's exceptions explained."""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..compare import Failure, describe_mismatch, expect_close, expect_shape, fail, same
from ..core import LearnerRaised, learner_error
from ..kit import Known, Suspects, expect_not_kept, explain_raise, unpack
from .mistakes import LOOP, VJP_FIX, flat

NAMES = ("dq", "dk", "dv")
ORACLE = "F.scaled_dot_product_attention"


# ============================================================================ oracle and inputs
def oracle(q, k, v, dout, mask=None, causal=False):
    """(o, (dq, dk, dv)) from autograd through F.scaled_dot_product_attention, in float64."""
    with torch.enable_grad():  # whatever grad mode a learner's code left behind
        q, k, v = (t.detach().to(torch.float64).requires_grad_(True) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        return o.detach(), torch.autograd.grad(o, (q, k, v), dout.to(torch.float64))


def expect_fresh(got: tuple, expected: tuple, earlier: list, tried: str) -> None:
    """:func:`~..kit.expect_not_kept` for gradients: ``earlier`` holds (case name, gradients, right gradients)."""
    expect_not_kept(got, expected, earlier, tried=tried, what="your (dq, dk, dv)", close=lambda right, want: all(
        same(a, b, **tolerance(want, torch.float64)) for a, b in zip(right, want)))


def rand(g: torch.Generator, *shape: int, dtype=torch.float64, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)


def make_case(g: torch.Generator, name: str, lead: tuple, n: int, m: int, d: int, dv: int, mask: Any = None, *,
              dtype=torch.float64, q_scale: float = 1.0, dout_scale: float = 1.0, extreme: bool = False) -> dict:
    """One case of exercises 1 and 2: q (..., n, d), k (..., m, d), v (..., m, dv), dout (..., n, dv)."""
    q, k = rand(g, *lead, n, d, dtype=dtype, scale=q_scale), rand(g, *lead, m, d, dtype=dtype)
    v, dout = rand(g, *lead, m, dv, dtype=dtype), rand(g, *lead, n, dv, dtype=dtype, scale=dout_scale)
    return dict(name=name, q=q, k=k, v=v, dout=dout, mask=mask, dtype=dtype, extreme=extreme)


# ============================================================================ judging three gradients
def unpack_grads(result: Any, tried: str) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv) from the learner's result: the right numbers as NumPy arrays are right too."""
    if isinstance(result, (tuple, list)):
        result = tuple(torch.from_numpy(r) if isinstance(r, np.ndarray) else r for r in result)
    return unpack(result, NAMES, tried=tried)


def tolerance(expected: tuple, dtype: torch.dtype) -> dict:
    big = max(1.0, max(float(e.abs().max()) if e.numel() else 0.0 for e in expected))
    return dict(atol=1e-10 * big, rtol=1e-9) if dtype == torch.float64 else dict(atol=2e-4 * big, rtol=2e-3)


def blame(groups: list[list[Known]], tried: str, got: str, expected: str) -> None:
    """Fail naming the mistakes found: each group is one mistake, or several that give the same numbers here."""
    groups = [list({k.summary: k for k in group}.values()) for group in groups]
    if len(groups) == 1:
        same_numbers = "" if len(groups[0]) == 1 else "on this input these mistakes give the same numbers: "
        fail(" or ".join(k.summary for k in groups[0]), tried=tried, got=got, expected=expected,
             cause=same_numbers + " — or ".join(k.cause for k in groups[0]),
             fix="; otherwise ".join(k.fix for k in groups[0]))
    fail("; and ".join(" or ".join(k.summary for k in g) for g in groups), tried=tried, got=got, expected=expected,
         cause=f"{len(groups)} mistakes at once: " + " — and ".join(" or ".join(k.cause for k in g) for g in groups),
         fix="; then ".join(g[0].fix for g in groups))


def _at_once(suspects: Suspects, grads: Callable[..., tuple], case: tuple, got, expected, wrong, tol) -> list:
    """The fewest known mistakes that together explain every wrong gradient, each reproducing the gradients it
    changes (one in dV, another in dQ…), grouped by the gradients they change; [] when they cannot."""
    explains = []
    for known in suspects.table:
        try:
            out = grads(*case, bug=known.key)
        except Exception:  # noqa: BLE001 - this mistake cannot happen on this case
            continue
        changed = frozenset(j for j in range(3) if not same(out[j], expected[j], **tol))
        if changed and not suspects.ruled_out(known) and all(j in wrong and same(got[j], out[j], **tol)
                                                             for j in changed):
            explains.append((known, changed))
    remaining, chosen = set(wrong), []
    while remaining:
        best = max(explains, key=lambda e: len(e[1] & remaining), default=None)
        if best is None or not best[1] & remaining:
            return []
        chosen.append([k for k, changed in explains if changed == best[1]])
        remaining -= best[1]
    return chosen


def judge(suspects: Suspects, got: tuple, expected: tuple, case: tuple, *, tried: str, dtype: torch.dtype,
          grads: Callable[..., tuple], nan_cause: str = "", nan_fix: str = "") -> None:
    """Fail unless the three gradients match the oracle's; name the known mistake behind them (``suspects`` tries its
    table on ``case``, ``grads(*case, bug=key)``), else measure what is wrong. (No two rows of a table give the same
    gradients on the first case where they are wrong, so the mistakes found are never told apart on other cases:
    tests/checks/test_backward.py keeps it so.)"""
    tol = tolerance(expected, dtype)
    for name, g, e in zip(NAMES, got, expected):
        if tuple(g.shape) != tuple(e.shape):
            _order(got, expected, tried, tol)
            if found := suspects.suspects(flat(got), case):
                blame([found], tried, f"your {name} of shape {tuple(g.shape)}", f"shape {tuple(e.shape)}")
            expect_shape(g, e.shape, tried=tried, what=f"your {name}", fix={
                "dq": "dq has q's shape (..., n_q, d_k): dQ = dS K/√d_k", "dk": "dk has k's shape (..., n_k, d_k): "
                "dK = dSᵀ Q/√d_k", "dv": "dv has v's shape (..., n_k, d_v): dV = Pᵀ dO"}[name])
    for name, g in zip(NAMES, got):
        if g.dtype != dtype:
            have, want = str(g.dtype).replace("torch.", ""), str(dtype).replace("torch.", "")
            fail(f"{name} is {have}, not {want}", tried=tried, got=f"your {name} in {have}",
                 expected=f"{want}, the dtype of the inputs",
                 cause="a tensor created without dtype= (torch.zeros(shape) is float32) or a .float()/.double()",
                 fix="create accumulators with torch.zeros_like(q) or dtype=q.dtype")
    if all(same(g, e, **tol) for g, e in zip(got, expected)):
        suspects.expect(flat(got), flat(expected), case, tried=tried, **tol)  # a right case rules mistakes out
        return
    _order(got, expected, tried, tol)
    wrong = [i for i in range(3) if not same(got[i], expected[i], **tol)]
    name = NAMES[wrong[0]]
    factors = {"√d_k": math.sqrt(expected[0].shape[-1]), "d_k": expected[0].shape[-1]}
    found = [k for k in suspects.suspects(flat(got), case) if not same(k.make(*case), flat(expected), **tol)]
    if groups := [found] if found else _at_once(suspects, grads, case, got, expected, wrong, tol):
        got_text, exp_text, _, _ = describe_mismatch(got[wrong[0]], expected[wrong[0]], what=f"your {name}",
                                                     factors=factors, **tol)
        blame(groups, tried, f"{', '.join(NAMES[i] for i in wrong)} {'is' if len(wrong) == 1 else 'are'} wrong; in "
              f"{name}: {got_text}", named(exp_text, name))
    for i in wrong:
        if torch.isnan(got[i]).any() and nan_cause and not torch.isnan(expected[i]).any():
            fail(f"NaN in {NAMES[i]}", tried=tried, expected="finite gradients", cause=nan_cause, fix=nan_fix,
                 got=f"NaN in {int(torch.isnan(got[i]).sum())} of {got[i].numel()} entries of your {NAMES[i]}")
    _wrong_scale(got, case, grads, tried, tol)
    _properties(got, expected, wrong, tried=tried, dtype=dtype, tol=tol)
    _one_wrong_ds(got, wrong, case, tried, tol)
    try:
        expect_close(got[wrong[0]], expected[wrong[0]], tried=tried, what=f"your {name}", factors=factors, **tol)
    except Failure as failure:
        d = failure.diagnosis
        d.expected = named(d.expected, name)
        d.summary = d.summary if name in d.summary else f"{name}: {d.summary}"
        d.got = d.got if name in d.got else f"in your {name}: {d.got}"
        raise


def named(text: str, name: str) -> str:
    """The "expected" line: which gradient, from where — never a bare "the expected values"."""
    if text in ("the expected values", "the correct values (from the check's reference computation)"):
        return f"the {name} that autograd computes through {ORACLE} (in float64)"
    return text


def _order(got: tuple, expected: tuple, tried: str, tol: dict) -> None:
    """Fail when the gradients are right but returned in another order."""
    for perm in itertools.permutations(range(3)):
        if perm != (0, 1, 2) and all(same(got[i], expected[j], **tol) for i, j in enumerate(perm)):
            fail("gradients returned in the wrong order", tried=tried, got=f"({', '.join(NAMES[j] for j in perm)})",
                 expected="(dq, dk, dv): one gradient per input, in the inputs' order", fix="return dq, dk, dv")


def fit_scale(err: Callable[[float], float], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> float:
    """The c in [10⁻³, 10³] that minimises err(c) (a grid in log c, then golden-section search around its best),
    replaced by the value of a named scale when it is that one to 6 digits (a fit is not exact)."""
    lo = math.log(min((10 ** (i / 10) for i in range(-30, 31)), key=err)) - 0.24
    hi, r = lo + 0.48, (math.sqrt(5) - 1) / 2
    for _ in range(45):  # keep the part of [lo, hi] that holds the lower of two inner points
        a, b = hi - r * (hi - lo), lo + r * (hi - lo)
        lo, hi = (lo, b) if err(math.exp(a)) < err(math.exp(b)) else (a, hi)
    c = math.exp((lo + hi) / 2)
    return next((x for x in _scale_names(q, k, v).values() if abs(c - x) <= 1e-6 * x), c)


def _scale_names(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict[str, float]:
    d = q.shape[-1]
    return {"1/√d_k": 1 / math.sqrt(d), "√d_k": math.sqrt(d), "1/d_k": 1 / d, "1": 1.0, "1/√d_v": v.shape[-1] ** -0.5,
            "1/√n_q": q.shape[-2] ** -0.5, "1/√n_k": k.shape[-2] ** -0.5, "2/√d_k": 2 / math.sqrt(d)}


def scale_name(c: float, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    fits = [name for name, x in _scale_names(q, k, v).items() if abs(c - x) <= 1e-9 * x]
    return f"{c:.4g}" + (f" = {fits[0]}" if len(fits) == 1 else "")


def _wrong_scale(got: tuple, case: tuple, grads: Callable[..., tuple], tried: str, tol: dict) -> None:
    """Fail when the answer is exactly the right backward with other scales: c on the scores (fitted on dV, which
    sees the scale only through P), c′ on dQ and dK (then a ratio)."""
    if not all(bool(torch.isfinite(g).all()) for g in got):
        return
    q, k, v = case[:3]
    run = lambda c, cg: grads(*case, bug="", scale=c, gscale=cg)  # noqa: E731
    c = fit_scale(lambda x: float((run(x, 1.0)[2] - got[2].double()).norm()), q, k, v)
    x = run(c, 1.0)[0]
    cg = float((got[0].double() * x).sum() / (x * x).sum()) if bool(x.any()) else 1.0
    cg = next((y for y in _scale_names(q, k, v).values() if abs(cg - y) <= 1e-6 * y), cg)
    if not all(same(g, e, **tol) for g, e in zip(got, run(c, cg))):
        return
    right = 1 / math.sqrt(q.shape[-1])
    parts = [f"scores scaled by {scale_name(c, q, k, v)}"] if abs(c - right) > 1e-6 * right else []
    parts += [f"dQ, dK scaled by {scale_name(cg, q, k, v)}"] if abs(cg - right) > 1e-6 * right else []
    fail(" and ".join(parts) + " instead of 1/√d_k", tried=tried,
         got="your gradients are exactly those of attention with " + " and ".join(parts),
         expected=f"1/√d_k = {right:.4g} (d_k = {q.shape[-1]}, the last axis of q) in the scores and in dQ, dK",
         cause="the scale is wrong: the scores of the forward are Q Kᵀ/√d_k, and dQ, dK carry the same 1/√d_k",
         fix="scale = 1 / math.sqrt(q.shape[-1]); multiply the scores and dQ, dK by it")


def _one_wrong_ds(got: tuple, wrong: list[int], case: tuple, tried: str, tol: dict) -> None:
    """dV right, dQ and dK wrong yet both following from one matrix dS′ (pinned down by dQ where K has full row
    rank): the mistake is where dS is made."""
    q, k = case[0].double(), case[1].double()
    if wrong != [0, 1] or k.shape[-2] > k.shape[-1] or int(torch.linalg.matrix_rank(k).min()) < k.shape[-2]:
        return
    ds = got[0].double() @ torch.linalg.pinv(k) * math.sqrt(q.shape[-1])  # (..., n_q, n_k): dq = dS′ K/√d_k
    if not same(got[1], ds.mT @ q / math.sqrt(q.shape[-1]), **tol):
        return
    fail("dS wrong: dv right, dq and dk from one wrong dS", tried=tried,
         got="your dv is right; your dq and dk are dS′ K/√d_k and dS′ᵀ Q/√d_k for one and the same dS′ (recovered "
             "from dq, as K has full row rank) that is not P ⊙ (dP − rowsum(dP ⊙ P))",
         expected=f"dS = P ⊙ (dP − rowsum(dP ⊙ P)), with dP = dO Vᵀ, as autograd through {ORACLE} gives",
         cause="your dQ and dK lines agree, so the mistake is in dS: dP = dO Vᵀ, rowsum(dP ⊙ P), or the product with P",
         fix=f"print your ds next to {VJP_FIX.split(' = ')[1]} on a small input and compare")


def _properties(got: tuple, expected: tuple, wrong: list[int], *, tried: str, dtype: torch.dtype, tol: dict) -> None:
    """Name what the wrong gradients measurably are: float32 precision, all zeros, the last rows zero."""
    if dtype == torch.float64 and all(bool(torch.isfinite(g).all()) for g in got):
        loose = tolerance(expected, torch.float32)
        in_float32 = all(bool((got[i] == got[i].float().double()).all()) for i in wrong)
        pairs = list(zip(got, expected))
        if in_float32 and all(same(g, e, atol=loose["atol"] / 20, rtol=loose["rtol"] / 20) for g, e in pairs):
            worst = max(float(((g.double() - e).abs() / (e.abs() + loose["atol"])).max()) for g, e in pairs)
            fail("float64 inputs, float32 precision", tried=tried,
                 got=f"gradients that agree with the expected ones to about 7 significant digits only (relative "
                     f"error up to {worst:.1e}), every value a float32 number",
                 expected="float64 precision, about 15 significant digits, like the inputs",
                 cause="part of your computation ran in float32: torch.zeros(shape) or torch.tensor(...) without "
                       "dtype=, or a .float()",
                 fix="keep every tensor in the inputs' dtype: torch.zeros_like(q), or dtype=q.dtype")
    for i in wrong:
        g, e = got[i].double(), expected[i].double()
        if g.numel() and not bool(g.any()) and bool(e.any()):
            fail(f"{NAMES[i]} is all zeros", tried=tried, got=f"your {NAMES[i]} is zero everywhere",
                 expected=f"the gradient {NAMES[i]} (not zero)",
                 cause="nothing was added into it, or the function returns the tensor it started from",
                 fix=f"check that {NAMES[i]} is the tensor your formula (or your loop) fills")
        zero_rows = ~g.reshape(-1, *g.shape[-2:]).ne(0).any(-1).any(0)  # (rows,)
        live_rows = e.reshape(-1, *e.shape[-2:]).ne(0).any(-1).any(0)
        tail = int((zero_rows & live_rows).flip(0).int().cumprod(0).sum())  # how many last rows are zero where e is not
        first = zero_rows.numel() - tail
        if tail and first > 0 and same(g[..., :first, :], e[..., :first, :], **tol):
            axis, axes = ("query", "queries") if i == 0 else ("key", "keys")
            fail(f"{NAMES[i]}: the last {axis} rows get no gradient", tried=tried,
                 got=f"your {NAMES[i]} is right in rows 0…{first - 1} and zero from row {first} on",
                 expected=f"a gradient for every {axis}, rows 0…{g.shape[-2] - 1}",
                 cause=f"your loop over the {axes} stops before row {first}: a range or a block count that "
                       "leaves out the last (possibly shorter) block", fix=LOOP.replace("n_q", "n"))


# ============================================================================ exceptions the learner's code raises
MATMUL = ("RuntimeError", r"mat1 and mat2|shapes cannot be multiplied|Expected size for first two dimensions of "
          "batch2", "two matrices with incompatible shapes were multiplied; with n_q ≠ n_k or d_k ≠ d_v a "
          "transpose in the wrong place does exactly this", "write each line's shapes next to it: P (..., n_q, n_k), "
          "dO (..., n_q, d_v), dV = Pᵀ dO (..., n_k, d_v), dP = dO Vᵀ (..., n_q, n_k), dQ = dS K (..., n_q, d_k), "
          "dK = dSᵀ Q (..., n_k, d_k)")
DTYPE = ("RuntimeError", r"same dtype|expected scalar type|Float.*Double|Double.*Float",
         "a float32 tensor met a float64 one: a tensor created without dtype= (torch.zeros(shape) is float32) or a "
         ".float()/.double() somewhere", "create every tensor from the inputs: torch.zeros_like(q), or dtype=q.dtype")


def fail_raised(exc: LearnerRaised, tried: str, expected: str, patterns=(), **hint: str) -> None:
    """Fail with the learner's exception, explained by ``hint`` or else by a pattern of this topic."""
    hint = hint or explain_raise(exc, (), patterns)
    raise Failure(learner_error(exc, tried=tried, expected=expected, **hint)) from None
