"""Checks for notebook 04 (the softmax Jacobian): softmax_jacobian, softmax_vjp, SoftmaxFunction.

Oracle: PyTorch's autograd (``torch.autograd.functional.jacobian`` of ``torch.softmax`` for J, its gradient for the
vector–Jacobian product and the Function's backward, ``gradcheck`` for the Function). The cases: one vector (n,),
batches (B, n), square and not, and (B, A, n); size-1 axes, n = 1, float32 and float64, a saturated softmax, exact
zeros in p (scores of -inf), upstream gradients of ±1000. Each part is one body (:func:`_judge_cases`): its table of
known mistakes (``kit.Known``) judged by ``kit.Suspects``, then what no mistake reproduces is measured (the diagonal,
symmetry, rows that must sum to 0…). A gradcheck failure says which pass lost float64 precision, and the probe
``kit.call`` says once whether the learner's code leaves its input (p or z) as it was.

**O(n) memory and work**, the docstrings' promise for the VJP and the Function's backward, are measured where the
learner's code runs (the probes :func:`vjp_cost` and :func:`function_cost`), once at n = 2048: the O(n) route holds
a few vectors of n numbers (about 10⁴ in all), while building J or its outer product holds n² = 4,194,304 at once and
recomputing ⟨g, p⟩ for every entry creates n² in all. The line, n²/8, is 8× below those and over 50× above the first.
"""

from __future__ import annotations

import math
import tracemalloc
from typing import Any, Callable

import numpy as np
import torch

from . import kit
from .boundary import probe
from .compare import Failure
from .core import Learner, LearnerRaised, LearnerTimedOut, as_tensor, check, fail, fmt, learner_error

__all__ = ["check_softmax_jacobian", "check_softmax_vjp", "check_SoftmaxFunction", "vjp_cost", "function_cost",
           "BIG_N", "QUADRATIC"]

#: The size at which O(n) is checked: n² = 4,194,304 numbers, 16 MiB in float32.
BIG_N = 2048
#: At least this many numbers in one tensor, or created in all, mean O(n²): n²/8.
QUADRATIC = BIG_N * BIG_N // 8
INF = float("inf")
_HALF = (torch.float16, torch.bfloat16)
_J = "J = diag(p) − p pᵀ: torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)"
_VJP = "p * (grad - (grad * p).sum(-1, keepdim=True))"
_OUTER = "the outer product: p.unsqueeze(-1) * p.unsqueeze(-2)"


# ============================================================================ oracles and cases
def _oracle_jacobian(p: torch.Tensor) -> torch.Tensor:
    """∂softmax/∂z by autograd at z = log p (softmax(log p) = p), one row at a time: (..., n, n)."""
    z = torch.log(p.double())
    rows = [torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1), r) for r in z.reshape(-1, z.shape[-1])]
    return torch.stack(rows).reshape(*p.shape, p.shape[-1])


def _oracle_vjp(p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """gᵀJ by autograd through torch.softmax at z = log p."""
    z = torch.log(p.double()).requires_grad_(True)
    return torch.autograd.grad(torch.softmax(z, -1), z, g.double())[0]


# Shorthands: random probabilities of a shape; the probabilities of given scores; an input as a case names it.
_probs = lambda g, *shape, dtype=torch.float64: torch.softmax(  # noqa: E731
    1.5 * torch.randn(*shape, generator=g, dtype=dtype), -1)
_fixed = lambda scores: torch.softmax(torch.tensor(scores, dtype=torch.float64), -1)  # noqa: E731
_describe = lambda x, name: f"{name} of shape {tuple(x.shape)}, {str(x.dtype).replace('torch.', '')}"  # noqa: E731


def _jacobian_cases() -> list[tuple]:
    g, f32 = torch.Generator().manual_seed(7), torch.float32
    return [(p,) for p in (
        _fixed([1.0, 2.0, 3.0]), _probs(g, 5, dtype=f32), _fixed([12.0, 0.0, -3.0, 1.0]),  # saturated
        _fixed([2.0, -INF, 0.0, -INF]), torch.ones(1, dtype=torch.float64),  # exact zeros; n = 1: J = [[0]]
        _probs(g, 2, 5), _probs(g, 4, 4, dtype=f32), _probs(g, 3, 5), _probs(g, 1, 5, dtype=f32),  # a square batch
        _probs(g, 2, 3, 4), _probs(g, 3, 1, 4, dtype=f32))]  # batch and heads; a size-1 axis in the middle


def _vjp_cases() -> list[tuple]:
    g, f32 = torch.Generator().manual_seed(8), torch.float32

    grad = lambda *shape, dtype=torch.float64: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    s5 = _probs(g, 5)
    return [
        (s5, grad(5)), (s5, torch.ones(5, dtype=torch.float64)),  # the gradient of Σ p = 1 is 0
        (_probs(g, 6, dtype=f32), grad(6, dtype=f32)),
        (_probs(g, 4, 4), grad(4, 4)),  # square: a keepdim slip broadcasts instead of failing
        (_probs(g, 3, 5, dtype=f32), grad(3, 5, dtype=f32)), (_probs(g, 2, 3, 6), grad(2, 3, 6)),
        (_probs(g, 1, 5), grad(1, 5)), (_probs(g, 3, 1, 4, dtype=f32), grad(3, 1, 4, dtype=f32)),
        (torch.ones(2, 1, dtype=torch.float64), grad(2, 1)),  # n = 1: the gradient is 0
        # saturated rows with large upstream gradients, and exact zeros in p
        (_fixed([[20.0, 0.0, -5.0, 3.0], [2.0, -INF, 0.0, -INF]]),
         torch.tensor([[1000.0, -1000.0, 500.0, 0.001], [-1000.0, 7.0, 1000.0, 3.0]], dtype=torch.float64)),
    ]


def _forward_cases() -> list[tuple]:
    g, t = torch.Generator().manual_seed(9), torch.tensor
    return [(z,) for z in (
        2 * torch.randn(2, 5, generator=g), torch.randn(2, 3, 4, generator=g, dtype=torch.float64),
        torch.randn(6, generator=g), torch.randn(1, 5, generator=g, dtype=torch.float64),
        torch.randn(3, 1, 4, generator=g),
        t([[50.0, 48.0, 49.0], [-3.0, 0.0, 1.0]]),  # e^z finite in float32, e^(z + max) not
        t([[1000.0, 1001.0, 1002.0], [2.0, 1.0, 0.0]]),
        t([[-1000.0, -998.0, -999.0], [0.0, -1000.0, 5.0]], dtype=torch.float64),
        t([[0.0, -INF, 1.0], [-INF, 3.0, -INF]]))]


def _backward_cases() -> list[tuple]:
    g = torch.Generator().manual_seed(10)

    rand = lambda *shape, dtype=torch.float64, scale=1.0: scale * torch.randn(  # noqa: E731
        *shape, generator=g, dtype=dtype)
    return [
        (rand(5), rand(5)), (rand(4, 4, dtype=torch.float32, scale=2.0), rand(4, 4, dtype=torch.float32)),
        (rand(3, 5), rand(3, 5)), (rand(2, 3, 6), rand(2, 3, 6)),
        (rand(1, 5, dtype=torch.float32), rand(1, 5, dtype=torch.float32)), (rand(3, 1, 4), rand(3, 1, 4)),
        (torch.tensor([[1000.0, 1001.0, 1002.0], [0.0, -1000.0, 5.0]], dtype=torch.float64),
         torch.tensor([[1000.0, -1000.0, 5.0], [-1000.0, 1000.0, 3.0]], dtype=torch.float64)),
        (torch.tensor([[0.0, -INF, 1.0], [2.0, 2.0, -INF]]), rand(2, 3, dtype=torch.float32)),
    ]


def _hint(exc: LearnerRaised, case: tuple, passed: list, *, signature: str, reductions: bool = True,
          others: Callable[[tuple], bool] | None = None, cases: list[tuple] = ()) -> dict[str, str]:
    """``cause``/``fix`` for an exception the learner's code raised on ``case`` after passing ``passed``: a wrong
    signature, n = 1 or a new n where earlier ones worked, code for fewer axes, a reduction that lost its axis, an axis
    that does not exist; else (``others``: whether the answer on another case is right) an input with another number
    of axes on which the code works."""
    msg, x = exc.message, case[0]
    ndim, ns = max((c[0].ndim for c in passed), default=0), {c[0].shape[-1] for c in passed}
    batched, n = x.ndim > ndim >= 1, x.shape[-1]
    broadcast = "must match the size" in msg or "could not be broadcast" in msg
    if hint := kit.signature_hint(exc, signature):
        return hint
    if n == 1 and ns and 1 not in ns:
        return dict(cause=f"your code fails when n = 1, though it worked for n = {', '.join(map(str, sorted(ns)))}: "
                          "something in it treats an axis of size 1 differently (.squeeze() without an axis removes it, "
                          "for example)",
                    fix="keep every axis: no .squeeze() without an axis, and take n from p.shape[-1]")
    if batched and (not reductions or "outer" in msg + exc.code or "diag" in msg + exc.code):
        hint = dict(cause="your function worked on inputs with fewer axes and fails once there are batch axes in front",
                    fix="write every step for any number of leading axes: torch.diag_embed rather than torch.diag, "
                        "s.unsqueeze(-1) * s.unsqueeze(-2) rather than torch.outer or np.outer")
    elif reductions or not broadcast:  # without reductions, a broadcast error is not a lost axis
        hint = kit.reduction_hint(exc, dim=False)
    if not hint and ns and n not in ns and (broadcast or "shape" in msg):
        hint = dict(cause=f"a size written into your code: your function fails for n = {n}, though it worked for n = "
                          f"{', '.join(map(str, sorted(ns)))}", fix="take every size from the input (s.shape[-1]), never "
                          "write a number for it")
    elif not hint and batched:
        hint = dict(cause="your function worked on inputs with fewer axes and fails once there are batch axes in front",
                    fix="write every step for any number of leading axes: index and reduce along negative axes (-1), "
                        "never loop over or index a fixed axis")
    seen = {c[0].ndim for c in passed}
    if others is None or x.ndim in seen or (hint and not hint["cause"].startswith("your code uses an axis number")):
        return hint
    return kit.works_elsewhere(x.shape, [(c[0].shape, lambda c=c: others(c)) for c in cases if c[0].ndim not in seen],
                               fix="write every step for shape (..., n): torch.diag_embed, p.unsqueeze(-1) * "
                                   "p.unsqueeze(-2), sums along -1 with keepdim=True") or hint


# ============================================================================ one body for every part
def _judge_cases(cases: list[tuple], answer: Callable[[tuple, str], torch.Tensor], *, oracle: Callable,
                 table: list[kit.Known], tried: Callable[[tuple], str], expected: str, signature: str,
                 explain: Callable, what: str = "your result", shape_fix: str | Callable[[tuple, list], str],
                 reductions: bool = True,
                 atol: Callable[[tuple], float] = lambda c: 1e-6, again: Callable | None = None, reduced: bool = False,
                 factors: bool = False, hint: Callable[[LearnerRaised], dict] = lambda exc: {}
                 ) -> list[tuple[tuple, torch.Tensor]]:
    """Judge ``answer(case, tried)`` against ``oracle(*case)`` on every case: a known mistake of ``table`` that
    reproduces it, else what ``kit.what_is_off`` and ``explain(out, case, tried)`` find, else the plain comparison.
    An exception is explained by ``hint(exc)``, else by :func:`_hint`. Returns each case with its answer."""
    suspects, passed = kit.Suspects(table, atol=1e-5, rtol=1e-4), []
    for case in cases:
        said = tried(case)
        try:
            out = answer(case, said)
        except LearnerRaised as exc:
            right_on = lambda c: kit.agrees(answer(c, said), oracle(*c), atol=atol(c), rtol=1e-4)  # noqa: E731
            raise Failure(learner_error(exc, tried=said, expected=expected, **(hint(exc) or _hint(
                exc, case, [c for c, _ in passed], signature=signature, reductions=reductions, cases=cases,
                others=right_on)))) from None
        right, a = oracle(*case), atol(case)
        fix = shape_fix(case, [c for c, _ in passed]) if callable(shape_fix) else shape_fix
        if out.is_floating_point() and out.dtype not in _HALF and not kit.agrees(out, right, atol=a, rtol=1e-4) and \
                not suspects.suspects(out, case, right):
            kit.what_is_off(out, right, tried=said, what=what, atol=a, rtol=1e-4, fix=fix,
                            reduced=right.ndim - 1 if reduced else None,
                            explain=lambda o, case=case: explain(o, case, said))
        suspects.expect(out, right, case, tried=said, again=again, what=what, atol=a, rtol=1e-4,
                        fix=fix if out.shape != right.shape else "",
                        factors={"n": float(case[0].shape[-1])} if factors else None)
        passed.append((case, out))
    return passed


# ============================================================================ softmax_jacobian
_jac = lambda p: torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)  # noqa: E731 - J = diag(p) − p pᵀ


def _batch_moved(p: torch.Tensor, where: Callable[[list[int], int], list[int]]) -> torch.Tensor | None:
    batch = list(range(p.ndim - 1))
    return _jac(p).movedim(batch, where(batch, p.ndim + 1)) if p.ndim >= 2 else None


_INNER = ("pᵀp for p pᵀ", "you subtracted the inner product pᵀp = Σ p_i² (one number) where J needs the outer product "
          "p pᵀ (an n×n matrix with entries p_i p_j)", _OUTER)
_FACTOR = "outer product missing a factor"
_BATCH = "batch axes first, the two Jacobian axes last: J[..., i, j] = ∂p_i/∂z_j"
K = kit.Known
JACOBIAN = [
    K("sign", "sign flipped", "your J is p pᵀ − diag(p), the negative of diag(p) − p pᵀ (its diagonal p_i(1 − p_i) must "
      "be positive)", _J, lambda p: -_jac(p)),
    K("inner", *_INNER, lambda p: torch.diag_embed(p) - (p * p).sum(-1)[..., None, None]),
    K("inner-all", *_INNER, lambda p: torch.diag_embed(p) - (p * p).sum()),
    K("no-outer", "− p pᵀ term missing", "you returned diag(p) alone: off the diagonal, ∂p_i/∂z_j = −p_i p_j, not 0", _J,
      lambda p: torch.diag_embed(p)),
    K("no-diag", "diag(p) term missing", "you returned −p pᵀ alone: the diagonal entries are p_i − p_i², not −p_i²", _J,
      lambda p: -p.unsqueeze(-1) * p.unsqueeze(-2)),
    K("diagonal", "only the diagonal", "you returned only the diagonal entries p_i(1 − p_i): the off-diagonal entries "
      "−p_i p_j are missing", _J, lambda p: torch.diag_embed(p * (1 - p))),
    K("pi2", "p_i² for p_i p_j", "you subtracted p_i² in row i (p ⊙ p broadcast along the rows), not the outer product "
      "p_i p_j", _OUTER, lambda p: torch.diag_embed(p) - (p * p).unsqueeze(-1)),
    K("pj2", "p_j² for p_i p_j", "you subtracted p_j² in column j, not the outer product p_i p_j", _OUTER,
      lambda p: torch.diag_embed(p) - (p * p).unsqueeze(-2)),
    K("ratio", "p_i / p_j for p_i p_j", "you divided where the outer product multiplies: p_i / p_j", _J,
      lambda p: torch.diag_embed(p) - p.unsqueeze(-1) / p.unsqueeze(-2)),
    K("pi", _FACTOR, "you subtracted p_i (p broadcast along one axis), not the outer product p_i p_j", _OUTER,
      lambda p: torch.diag_embed(p) - p.unsqueeze(-1)),
    K("pj", _FACTOR, "you subtracted p_j (p broadcast along one axis), not the outer product p_i p_j", _OUTER,
      lambda p: torch.diag_embed(p) - p.unsqueeze(-2)),
    K("p-for-diag", "p for diag(p)", "you subtracted the outer product from the vector p, which broadcasts along the "
      "rows, where J needs the diagonal matrix diag(p)", "torch.diag_embed(p) builds diag(p) for any leading axes",
      lambda p: p.unsqueeze(-2) - p.unsqueeze(-1) * p.unsqueeze(-2)),
    K("added", "outer product added", "you added p pᵀ to diag(p); J subtracts it", _J,
      lambda p: torch.diag_embed(p) + p.unsqueeze(-1) * p.unsqueeze(-2)),
    K("outer", "outer product alone", "you returned p pᵀ alone", _J, lambda p: p.unsqueeze(-1) * p.unsqueeze(-2)),
    K("identity", "identity for diag(p)", "you used the identity matrix where J has diag(p)", _J,
      lambda p: torch.eye(p.shape[-1], dtype=p.dtype) - p.unsqueeze(-1) * p.unsqueeze(-2)),
    K("log-softmax", "Jacobian of log-softmax", "you returned I − 1 pᵀ, the Jacobian of log-softmax; softmax's is "
      "diag(p) − p pᵀ", _J,
      lambda p: torch.eye(p.shape[-1], dtype=p.dtype) - p.unsqueeze(-2).expand(*p.shape, p.shape[-1])),
    K("softmax-again", "softmax applied to p", "you took the softmax of p again: p is already the softmax output, and J "
      "is written in terms of it", "use p as it is: " + _J, lambda p: _jac(torch.softmax(p, -1))),
    K("batch-summed", "outer product over the batch", "you multiplied pᵀ @ p over a (B, n) tensor, which sums the outer "
      "products of all rows into one n×n matrix", "one matrix per row: p.unsqueeze(-1) * p.unsqueeze(-2)",
      lambda p: torch.diag_embed(p).sum(0) - p.T @ p if p.ndim == 2 else None),
    K("flattened", "one Jacobian for the whole batch, flattened", "torch.outer and np.outer flatten their inputs, so your "
      "J treats the whole batch as one long vector: one (B·n)×(B·n) matrix", "one n×n matrix per row: " + _J,
      lambda p: _jac(p.reshape(-1)) if p.ndim >= 2 else None),
    K("batch-last", "batch axes last", "your J has the batch axes after the two Jacobian axes", _BATCH,
      lambda p: _batch_moved(p, lambda b, nd: [nd - len(b) + k for k in b])),
    K("batch-middle", "batch axes in the wrong place", "your J has a batch axis between the two Jacobian axes", _BATCH,
      lambda p: _batch_moved(p, lambda b, nd: [k + 1 for k in b])),
    K("across-batch", "Jacobian across the batch", "you differentiated the whole (B, n) batch at once: that is a "
      "(B, n, B, n) array, most of it zeros between different rows", "one n×n matrix per row: " + _J,
      lambda p: torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1), torch.log(p.double()))
      if p.ndim == 2 else None),
]


def _explain_jacobian(out: torch.Tensor, case: tuple, tried: str) -> None:
    """Which property of J = diag(p) − p pᵀ the answer breaks (same shape, no known mistake)."""
    (p,), a = case, out.detach().double()
    if not torch.isfinite(a).all():
        return
    e, eye, n = _jac(p.double()), torch.eye(p.shape[-1], dtype=torch.bool), p.shape[-1]
    close = torch.isclose(a, e, atol=1e-6, rtol=1e-4)
    diag_ok, off_ok = bool(close[..., eye].all()), bool(close[..., ~eye].all())
    if diag_ok and not off_ok:
        fail("off-diagonal entries wrong", tried=tried, got="the diagonal of your J is right, the entries off it are not",
             expected="J[i, j] = −p_i p_j for i ≠ j", fix=_J)
    if off_ok and not diag_ok:
        fail("diagonal wrong", tried=tried, got="the entries off the diagonal are right, the diagonal is not",
             expected="J[i, i] = p_i (1 − p_i)", fix=_J)
    for axis, index, other in ((-2, "j", "column"), (-1, "i", "row")):  # off the diagonal, one index only
        spread = lambda m: m.masked_fill(eye, -INF).amax(axis) - m.masked_fill(eye, INF).amin(axis)  # noqa: E731
        if n >= 3 and float(spread(a).abs().max()) <= 1e-9 and float(spread(e).abs().max()) > 1e-6:
            fail("off-diagonal entries depend on one index only", tried=tried, expected="J[i, j] = −p_i p_j for i ≠ j",
                 got=f"off the diagonal, your J[i, j] changes with {index} only: each {other} holds one value",
                 cause="the term you subtract from diag(p) holds one factor of p_i p_j (p broadcast along one axis, "
                       "perhaps times a constant), not the outer product", fix=_J)
    if not torch.allclose(a, a.transpose(-1, -2), atol=1e-6):
        fail("J not symmetric", tried=tried, expected="a symmetric J: J[i, j] = J[j, i] = −p_i p_j off the diagonal",
             got=f"your J differs from its transpose (by up to {fmt(float((a - a.mT).abs().max()))})", fix=_J)
    if not torch.allclose(rows := a.sum(-1), torch.zeros_like(rows), atol=1e-6):
        fail("rows of J do not sum to 0", tried=tried, got=f"rows of your J sum to {fmt(float(rows.min()))} … "
             f"{fmt(float(rows.max()))}", expected="every row summing to 0 (Σ_i p_i = 1 whatever z is)", fix=_J)


@check("softmax_jacobian", expects="a function softmax_jacobian(p) returning J of shape (..., n, n)")
def check_softmax_jacobian(fn: Learner) -> str:
    run, cases = kit.TensorOrArray(fn), _jacobian_cases()
    _judge_cases(cases, lambda case, said: as_tensor(run(*case), tried=said), oracle=_oracle_jacobian, table=JACOBIAN,
                 tried=lambda c: f"softmax_jacobian(p) on {_describe(c[0], 'p')}", expected="J of shape (..., n, n)",
                 signature="softmax_jacobian(p)", reductions=False,
                 explain=_explain_jacobian, what="your J", again=run.tensor, factors=True,
                 shape_fix=lambda case, passed: "one n×n matrix per row of p: J has shape (*p.shape, n)" + (
                     "; use operations that work for any leading axes: torch.diag_embed(p) (torch.diag on a 2-D tensor "
                     "extracts a diagonal instead of building one) and p.unsqueeze(-1) * p.unsqueeze(-2) (torch.outer "
                     "and np.outer flatten their inputs)" if case[0].ndim > max((c[0].ndim for c in passed), default=0)
                     >= 1 else ""))
    kit.expect_unchanged(fn, cases[0], call="softmax_jacobian(p)", name="p", shown=_describe(cases[0][0], "p"),
                         numpy=run.mode == "numpy")
    return f"matches torch.autograd.functional.jacobian on {len(cases)} cases ({run.kind}): (n,), (B, n), (B, A, n), " \
           "n = 1, saturated"


# ============================================================================ softmax_vjp
_dot = lambda p, g: (g * p).sum(-1, keepdim=True)  # noqa: E731 - ⟨g, p⟩ per row, kept
_grad_atol = lambda case: 1e-6 * max(1.0, float(case[1].abs().max()))  # noqa: E731 - scales with the upstream grad
_VJP_FIX = f"∂ℒ/∂z = p ⊙ (g − ⟨g, p⟩): {_VJP}"
_PER_ROW = "sum along the last axis only: (grad * p).sum(-1, keepdim=True)"
_UNUSED = "upstream gradient not used"
VJP = [
    K("unchanged", "grad returned unchanged", "you returned the upstream gradient as it is: the gradient with respect to "
      "the scores is grad multiplied by the softmax Jacobian", _VJP_FIX, lambda p, g: g.clone()),
    K("no-dot", "⟨g, p⟩ term missing", "you returned p ⊙ g, only the diagonal part of the product: the − p ⟨g, p⟩ term "
      "is missing", _VJP_FIX, lambda p, g: p * g),
    K("sign", "sign flipped", "you returned p ⊙ (⟨g, p⟩ − g), the negative of the gradient", _VJP_FIX,
      lambda p, g: p * (_dot(p, g) - g)),
    K("no-p", "final multiplication by p missing", "you returned g − ⟨g, p⟩ without multiplying by p", _VJP_FIX,
      lambda p, g: g - _dot(p, g)),
    K("plain-sum", "plain sum of g", "you subtracted the plain sum Σ_j g_j; the term is the p-weighted sum ⟨g, p⟩ = "
      "Σ_j g_j p_j", _VJP_FIX, lambda p, g: p * (g - g.sum(-1, keepdim=True))),
    K("mean-g", "mean of g", "you subtracted the mean of g; the term is the p-weighted sum ⟨g, p⟩ = Σ_j g_j p_j", _VJP_FIX,
      lambda p, g: p * (g - g.mean(-1, keepdim=True))),
    K("whole-sum", "⟨g, p⟩ summed over the whole tensor", "you summed g ⊙ p over the whole tensor, not per row, so every "
      "row gets the same ⟨g, p⟩", _PER_ROW, lambda p, g: p * (g - (g * p).sum())),
    K("keepdim", "keepdim missing", "you reduced ⟨g, p⟩ without keepdim=True, so it broadcast along the wrong axis (each "
      "row got another row's sum)", "(grad * p).sum(-1, keepdim=True)", lambda p, g: p * (g - (g * p).sum(-1))),
    K("diagonal", "only the diagonal of J", "you multiplied g by the diagonal of J, p ⊙ (1 − p), leaving out the "
      "off-diagonal −p_i p_j", _VJP_FIX, lambda p, g: p * (1 - p) * g),
    K("swapped", "p and grad swapped", "you used grad where the formula has p and p where it has grad", _VJP_FIX,
      lambda p, g: g * (p - _dot(p, g))),
    K("mean-dot", "mean instead of sum for ⟨g, p⟩", "you took the mean of g ⊙ p; ⟨g, p⟩ is its sum", _VJP_FIX,
      lambda p, g: p * (g - (g * p).mean(-1, keepdim=True))),
    K("g-over-p", "g / p for g ⊙ p", "you divided grad by p inside ⟨g, p⟩; it is the sum of the products g_j p_j",
      _VJP_FIX, lambda p, g: p * (g - (g / p).sum(-1, keepdim=True))),
    K("sum-p", "⟨g, p⟩ replaced by Σ p", "you summed p alone (which is 1) where ⟨g, p⟩ sums g ⊙ p", _VJP_FIX,
      lambda p, g: p * (g - p.sum(-1, keepdim=True))),
    K("divided", "divided by (g − ⟨g, p⟩)", "you divided p by (g − ⟨g, p⟩); the two are multiplied", _VJP_FIX,
      lambda p, g: p / (g - _dot(p, g))),
    K("p", "returned p", "you returned p itself", _VJP_FIX, lambda p, g: p.clone()),
    K("plus-dot", "sign of the ⟨g, p⟩ term", "you added ⟨g, p⟩; the formula subtracts it", _VJP_FIX,
      lambda p, g: p * (g + _dot(p, g))),
    K("only-dot", "only the − p ⟨g, p⟩ part", "you returned p ⊙ ⟨g, p⟩: the p ⊙ g part is missing", _VJP_FIX,
      lambda p, g: p * _dot(p, g)),
    K("zeros", _UNUSED, "your result is J·1, the product with a vector of ones (which is 0), not with grad", _VJP_FIX,
      lambda p, g: torch.zeros_like(p)),
    K("diag-of-J", _UNUSED, "your result is the diagonal of J, p ⊙ (1 − p): grad does not enter it", _VJP_FIX,
      lambda p, g: p * (1 - p)),
    K("softmax-again", "softmax applied to p", "you took the softmax of p again: p is already the softmax output",
      "use p as it is: " + _VJP, lambda p, g: torch.softmax(p, -1) * (g - _dot(torch.softmax(p, -1), g))),
    K("inner", "pᵀp for p pᵀ", "you used J = diag(p) − pᵀp (one number) in place of the outer product p pᵀ", _VJP_FIX,
      lambda p, g: p * g - (p * p).sum(-1, keepdim=True) * g),
    K("dot-not-times-p", "⟨g, p⟩ not multiplied by p", "you returned p ⊙ g − ⟨g, p⟩: the ⟨g, p⟩ term must be multiplied "
      "by p too, p ⊙ g − p ⟨g, p⟩", _VJP_FIX, lambda p, g: p * g - _dot(p, g)),
    K("pp", "⟨p, p⟩ for ⟨g, p⟩", "you subtracted ⟨p, p⟩ = Σ p_j² where the formula has ⟨g, p⟩ = Σ g_j p_j", _VJP_FIX,
      lambda p, g: p * (g - (p * p).sum(-1, keepdim=True))),
    K("gg", "⟨g, g⟩ for ⟨g, p⟩", "you subtracted ⟨g, g⟩ = Σ g_j² where the formula has ⟨g, p⟩ = Σ g_j p_j", _VJP_FIX,
      lambda p, g: p * (g - (g * g).sum(-1, keepdim=True))),
    K("per-entry", "⟨g, p⟩ summed over a whole batch entry", "you summed g ⊙ p over each batch entry (a loop over the "
      "first axis?), not over each row", _PER_ROW,
      lambda p, g: p * (g - (g * p).flatten(1).sum(1).reshape(-1, *[1] * (p.ndim - 1))) if p.ndim >= 3 else None),
] + [K(f"axis-{o}", f"⟨g, p⟩ summed along axis {o}", f"you summed g ⊙ p along axis {o}; ⟨g, p⟩ is the sum along the last "
       "axis, one number per row", "(grad * p).sum(-1, keepdim=True)",
       lambda p, g, o=o: p * (g - (g * p).sum(o, keepdim=True)) if o < p.ndim - 1 else None) for o in range(3)]


def _explain_vjp(out: torch.Tensor, case: tuple, tried: str, z: torch.Tensor | None = None) -> None:
    """What is wrong with a gradient no known mistake reproduces. ``z``: the scores, when the answer is a Function's
    backward (whose forward has already passed every case, ±1000 included)."""
    a, g = out.detach().double(), case[1]
    if not torch.isfinite(a).all():
        cause = ""
        if z is not None:
            top, limit = z.double().masked_fill(~torch.isfinite(z), -INF).amax(-1), kit.exp_limits(z.dtype)[0]
            if bool((top[(~torch.isfinite(a)).any(-1)] > limit).all()):
                cause = (f"those rows hold scores above {limit:.2f}, where e^z overflows in "
                         f"{str(z.dtype).replace('torch.', '')}; your forward handles them (it passed the cases at "
                         "±1000), so your backward must be exponentiating z again without subtracting the maximum")
        fail("NaN or inf in the gradient", tried=tried, got=f"{int((~torch.isfinite(a)).sum())} entries are NaN or inf",
             expected="finite gradients (p and grad are finite)", cause=cause,
             fix="save p in forward and use it in backward (or recompute it stably, with the maximum subtracted)"
             if cause else f"compute {_VJP}: no division, no log")
    if not torch.allclose(sums := a.sum(-1), torch.zeros_like(sums), atol=1e-6 * max(1.0, float(g.abs().max()))):
        fail("rows do not sum to 0", tried=tried, got=f"rows of your result sum to {fmt(float(sums.min()))} … "
             f"{fmt(float(sums.max()))}",
             expected="every row summing to 0 (Σ_i p_i (g_i − ⟨g, p⟩) = ⟨g, p⟩ − ⟨g, p⟩ = 0)",
             fix=_VJP_FIX)


@check("softmax_vjp", expects="a function softmax_vjp(p, grad) returning ∂ℒ/∂z shaped like p")
def check_softmax_vjp(fn: Learner) -> str:
    run, cases = kit.TensorOrArray(fn), _vjp_cases()
    _judge_cases(cases, lambda case, said: as_tensor(run(*case), tried=said), oracle=_oracle_vjp, table=VJP,
                 tried=lambda c: f"softmax_vjp(p, grad) on {_describe(c[0], 'p')} and {_describe(c[1], 'grad')}",
                 expected="∂ℒ/∂z shaped like p", explain=_explain_vjp, atol=_grad_atol, again=run.tensor,
                 signature="softmax_vjp(p, grad)", shape_fix="∂ℒ/∂z has the shape of p")
    kit.expect_unchanged(fn, cases[0], call="softmax_vjp(p, grad)", name="p", shown=_describe(cases[0][0], "p"),
                         numpy=run.mode == "numpy")
    gen = torch.Generator().manual_seed(80)
    big = (_probs(gen, 1, BIG_N, dtype=torch.float32), torch.randn(1, BIG_N, generator=gen))
    tried = f"softmax_vjp(p, grad) on p and grad of shape (1, {BIG_N}), float32, watching what it creates"
    cost = _observe(fn, tried, "∂ℒ/∂z in O(n)", "your function", "softmax_vjp_cost", *big, run.mode == "numpy")
    _quadratic(cost, "your softmax_vjp", tried, fix=f"do not form J: {_VJP}")
    memory = f"O(n) at n = {BIG_N}" if cost.get("measured") else "memory not measured"
    return f"matches autograd on {len(cases)} cases ({run.kind}): (n,) to (B, A, n), n = 1, grads of ±1000; {memory}"


# ============================================================================ the O(n) probes (learner side)
def _cost(work: Callable[[], Any]) -> dict[str, Any]:
    """Run ``work()`` once under ``kit.Watch`` and tracemalloc: the largest tensor storage (elements) and its shape,
    the elements of every tensor a torch function returned ("total"), and NumPy's peak (bytes)."""
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        seen = kit.watch(work)
        peak = max(0, tracemalloc.get_traced_memory()[1] - base)
    finally:
        if not tracing:
            tracemalloc.stop()
    return {"measured": True, "largest": seen.get("largest", 0), "shape": seen.get("shape", []),
            "total": seen.get("elements", 0), "numpy_peak": peak}


@probe("softmax_vjp_cost")
def vjp_cost(fn: Callable, p: torch.Tensor, g: torch.Tensor, numpy: bool = False) -> dict[str, Any]:
    """Learner side: what one call ``fn(p, g)`` creates (:func:`_cost`), after one unwatched call (so that one-off
    costs are not counted). ``numpy``: call with arrays."""
    args = (p.numpy(), g.numpy()) if numpy else (p, g)
    fn(*args)
    return _cost(lambda: fn(*args))


@probe("softmax_function_cost")
def function_cost(cls: type, z: torch.Tensor, g: torch.Tensor) -> dict[str, Any]:
    """Learner side: what ``cls.apply(z)`` creates, and what its backward creates for upstream ``g``: the output's
    ``grad_fn.apply(g)``, the learner's own backward with its real ctx, called from Python so its torch calls are
    seen (the autograd engine's own calls are not)."""
    z = z.detach().requires_grad_(True)
    cls.apply(z)  # one unwatched forward
    holder: dict[str, Any] = {}
    forward = _cost(lambda: holder.setdefault("y", cls.apply(z)))
    node = getattr(holder["y"], "grad_fn", None)
    if node is None or not callable(getattr(node, "apply", None)):
        return {"forward": forward, "backward": {"measured": False}}
    with torch.no_grad():
        node.apply(g)  # one unwatched backward
        return {"forward": forward, "backward": _cost(lambda: node.apply(g))}


def _observe(fn: Learner, tried: str, expected: str, what: str, name: str, *args: Any) -> dict:
    try:
        cost = fn.observe(name, *args)
    except (LearnerRaised, LearnerTimedOut) as exc:
        raise Failure(learner_error(exc, tried=tried, expected=expected, cause="" if isinstance(exc, LearnerRaised)
                                    else f"at n = {BIG_N} {what} needs far more than O(n) work")) from None
    return cost if isinstance(cost, dict) else {}


def _quadratic(cost: dict, what: str, tried: str, fix: str) -> None:
    """Fail when a measured cost shows an n×n object or n² work."""
    if not isinstance(cost, dict) or not cost.get("measured", False):
        return
    largest, shape = int(cost.get("largest", 0)), tuple(cost.get("shape", ()))
    total, peak = int(cost.get("total", 0)), int(cost.get("numpy_peak", 0))
    expected = f"O(n) memory and work: a few vectors of {BIG_N} numbers (a full n×n matrix holds {BIG_N * BIG_N:,})"
    for hit, kind, got, cause in (
            (largest >= QUADRATIC, "memory", f"built a tensor of shape {shape} ({largest:,} numbers)",
             "forms an n×n matrix (the Jacobian, or the outer product p pᵀ)"),
            (peak >= 4 * QUADRATIC, "memory", f"held {peak / 2**20:.0f} MiB of NumPy arrays at once",
             "forms an n×n NumPy matrix (the Jacobian, or an outer product)"),
            (total >= QUADRATIC, "work", f"created {total:,} numbers in all, about n²/"
             f"{max(1, round(BIG_N ** 2 / max(total, 1)))}", "recomputes a whole row's worth of numbers for every "
             "entry (a Python loop over the entries, each computing ⟨g, p⟩ or a row of J again)")):
        if hit:
            fail(f"O(n²) {kind} in {what}", tried=tried, expected=expected, fix=fix, got=f"at n = {BIG_N}, {what} {got}",
                 cause=f"{what} {cause}")


# ============================================================================ SoftmaxFunction
class _ThroughLearner(torch.autograd.Function):
    """A Function whose forward and backward are the learner's, reached through Learner operations (``apply(z)``,
    ``apply.vjp(…)``), so that ``gradcheck`` runs in the check's own process and the grader, replaying the log, feeds
    it exactly the same numbers without running the learner's code."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, apply: Learner) -> torch.Tensor:
        ctx.learner = apply  # (not ctx.apply: that name is the backward node's own method)
        ctx.save_for_backward(z)
        return as_tensor(apply(z.detach()), tried="gradcheck's forward").to(z.dtype).reshape(z.shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (z,) = ctx.saved_tensors
        with torch.enable_grad():  # autograd runs backward with grad mode off; the learner's forward needs it on
            _, grads = ctx.learner.vjp((z.detach(),), grad.detach())
        if not grads or grads[0] is None:
            return torch.zeros_like(z), None
        return as_tensor(grads[0], tried="gradcheck's backward").to(z.dtype).reshape(z.shape), None


_norm = lambda e: e / e.sum(-1, keepdim=True)  # noqa: E731 - normalised along the last axis
_e = lambda z: torch.exp(z - z.amax(-1, keepdim=True))  # noqa: E731 - e^(z − max) along the last axis
_SHIFT = "subtract the maximum of each slice along `dim` before exp: x - x.amax(dim, keepdim=True)"
_AXIS = "use `dim` in both the maximum and the sum: x.amax(dim, keepdim=True), e.sum(dim, keepdim=True)"
_NORMALISE = "divide by the sum along dim: e / e.sum(dim, keepdim=True)"
#: Known wrong forwards (a softmax along the last axis), as notebook 03's checks know them.
FORWARD = [
    K("naive", "maximum not subtracted", "you exponentiated the scores as they are: e^x overflows to inf for scores near "
      "1000 (and underflows to 0 near -1000), and inf/inf or 0/0 is NaN", _SHIFT, lambda z: _norm(torch.exp(z))),
    K("whole-max", "maximum taken over the whole tensor", "you subtracted the maximum of the whole tensor, not of each "
      "slice: a slice whose scores lie far below that maximum underflows to 0 (0/0 = NaN, or zeros behind an epsilon)",
      _SHIFT, lambda z: _norm(torch.exp(z - z.max()))),
    K("min", "minimum subtracted instead of the maximum", "you subtracted each slice's minimum: the largest score minus "
      "the smallest can exceed what e^x can hold, so e^x overflows", _SHIFT,
      lambda z: _norm(torch.exp(z - z.amin(-1, keepdim=True)))),
    K("max-added", "maximum added instead of subtracted", "you exponentiated x + max where the shift is x − max: the "
      "largest score doubles, so e^(x + max) overflows as soon as 2·max passes e^x's range", _SHIFT,
      lambda z: _norm(torch.exp(z + z.amax(-1, keepdim=True)))),
    K("mean-sum", "divided by the mean, not the sum", "you divided e^(x − max) by its mean along dim where softmax "
      "divides by its sum, so every weight is n times too large (n = the slice's length)", _NORMALISE,
      lambda z: _e(z) / _e(z).mean(-1, keepdim=True)),
    K("whole-sum", "divided by the sum of the whole tensor", "you divided by the sum of e^(x − max) over every entry of "
      "the tensor, not over each slice along dim", _NORMALISE, lambda z: _e(z) / _e(z).sum()),
    K("unnormalised", "not normalised", "you returned e^(x - max) without dividing by the sum", _NORMALISE, _e),
    K("times-sum", "multiplied by the sum", "you multiplied e^(x − max) by its sum where softmax divides by it",
      "divide: e / e.sum(dim, keepdim=True)", lambda z: _e(z) * _e(z).sum(-1, keepdim=True)),
    K("exp-missing", "exponential missing", "you normalised x − max without exponentiating it", "exponentiate before "
      "normalising: e = exp(x - max)", lambda z: _norm(z - z.amax(-1, keepdim=True))),
    K("log-for-exp", "log instead of exp", "you took the log of x − max where softmax exponentiates it",
      "e = torch.exp(x - max), then e / e.sum(dim, keepdim=True)",
      lambda z: _norm(torch.log(z - z.amax(-1, keepdim=True)))),
    K("sign", "sign flipped", "you exponentiated -x, so the smallest score gets the largest weight",
      "exponentiate x - max, not max - x", lambda z: torch.softmax(-z, -1)),
] + [row for o in range(3) for row in (
    K(f"axis-{o}", f"softmax along axis {o}, not dim=-1", f"you normalised along axis {o}, so the slices along axis {o} "
      "sum to 1, not those along dim=-1", _AXIS, lambda z, o=o: torch.softmax(z, o) if o < z.ndim - 1 else None),
    K(f"max-axis-{o}", "maximum taken along the wrong axis", f"you took the maximum along axis {o}, not along dim=-1: that "
      "shift changes from entry to entry of a slice, so it does not cancel", _AXIS,
      lambda z, o=o: _norm(torch.exp(z - z.amax(o, keepdim=True))) if o < z.ndim - 1 else None),
    K(f"sum-axis-{o}", "sum taken along the wrong axis", f"you divided by the sum along axis {o}, not along dim=-1", _AXIS,
      lambda z, o=o: _e(z) / _e(z).sum(o, keepdim=True) if o < z.ndim - 1 else None))]

_SAVE_FIX = ("save the output of forward: ctx.save_for_backward(p) with p = e / e.sum(-1, keepdim=True) (or save z and "
             "recompute p from it, stably)")
#: Backwards that use another tensor than p = softmax(z) as p (what forward saved was not its output), then the VJP's.
BACKWARD = [K(key, summary, cause, _SAVE_FIX,
              lambda z, g, t=t: t(z.double()) * (g.double() - _dot(t(z.double()), g.double())))
            for key, summary, cause, t in (
    ("saved-z", "z used as p in backward", "your backward uses z, the scores, where the formula needs p = softmax(z): "
     "forward saved its input, not its output", lambda z: z),
    ("saved-e", "unnormalised e used as p in backward", "your backward uses e = exp(z − max) before it is divided by its "
     "sum: forward saved e, not p = e / Σ e", _e),
    ("saved-exp", "e^z used as p in backward", "your backward uses exp(z), not p = softmax(z): forward saved the "
     "exponentials before normalising", torch.exp))] + [
    K(k.key, k.summary, k.cause, k.fix, lambda z, g, k=k: k.make(torch.softmax(z.double(), -1), g.double()))
    for k in VJP]


def _saved_hint(exc: LearnerRaised) -> dict[str, str]:
    """``cause``/``fix`` for an exception of autograd's about what backward returned or what forward saved."""
    if "invalid gradient" in exc.message or "expected shape" in exc.message:
        return dict(cause="backward returned a gradient whose shape is not the shape of z",
                    fix="return ∂ℒ/∂z shaped like z: p * (grad - (grad * p).sum(-1, keepdim=True))")
    if "saved_tensors" in exc.code and "unpack" in exc.message:
        return dict(cause="ctx.saved_tensors holds nothing: your forward did not save p",
                    fix="in forward, call ctx.save_for_backward(p) before returning p")
    if "saved" in exc.message and ("freed" in exc.message or "saved_tensors" in exc.message):
        return dict(cause="backward could not read what forward saved", fix="save with ctx.save_for_backward(p) in "
                    "forward and read it back with (p,) = ctx.saved_tensors in backward")
    return {}


def _backward(apply: Learner, case: tuple, tried: str) -> torch.Tensor:
    _, grads = apply.vjp((case[0],), case[1])
    if grads is None:
        fail("no gradient reaches z", tried=tried, got="the output of apply(z) does not depend on z through autograd",
             expected="∂ℒ/∂z from your backward", fix="return p from forward as computed from z (no .detach(), no "
             "torch.no_grad())")
    if grads[0] is None:
        fail("backward returned None", tried=tried, got="None as the gradient for z", expected="∂ℒ/∂z, a tensor shaped "
             f"like z", fix=f"end backward with return {_VJP}")
    return as_tensor(grads[0], tried=tried, what="backward's gradient")


def _forward(apply: Learner, case: tuple, tried: str) -> torch.Tensor:
    result = apply(case[0])
    if isinstance(result, np.ndarray):
        fail("forward returned a NumPy array", tried=tried, got=f"a NumPy array of shape {result.shape}",
             expected="a torch.Tensor p shaped like z", fix="compute p with torch operations and return the tensor",
             cause="autograd follows tensors only: a NumPy result leaves the graph, so backward can never run")
    return as_tensor(result, tried=tried, what="forward")


def _explain_forward(out: torch.Tensor, case: tuple, tried: str) -> None:
    """NaN or inf in forward's output: where they come from (``kit.explain_nonfinite``)."""
    (z,), o = case, out.detach().double()
    if (rows := (~torch.isfinite(o)).any(-1, keepdim=True)).any():
        kinds = "NaN" if torch.isnan(o).any() else "inf"
        kit.explain_nonfinite(rows.expand_as(z), z.double(), z.dtype, tried=tried, kinds=kinds, scaled="z",
                              got=f"forward's output holds {kinds} in {int(rows.sum())} row(s)",
                              expected="finite weights", last=False)


def _float64_error(judged: list[tuple[tuple, torch.Tensor]], oracle: Callable) -> float:
    """The largest error of the answers on float64 cases, relative to the largest expected value."""
    errors = [0.0]
    for case, out in judged:
        if case[0].dtype == torch.float64:
            a, e = out.detach().double(), oracle(*case).double()
            ok = torch.isfinite(a) & torch.isfinite(e)
            if ok.any():
                errors.append(float((a[ok] - e[ok]).abs().max() / e[ok].abs().max().clamp(min=1e-300)))
    return max(errors)


@check("SoftmaxFunction", kind="class",
       expects="the class SoftmaxFunction, a subclass of torch.autograd.Function used as SoftmaxFunction.apply(z)")
def check_SoftmaxFunction(fn: Learner) -> str:  # noqa: N802 - the check of exercise X is check_X
    info = fn.inspect()
    if not info.get("autograd_function"):
        fail("not a torch.autograd.Function", tried="checking the class SoftmaxFunction",
             got=f"a class whose bases are {', '.join(info.get('bases', [])) or 'object'}",
             expected="class SoftmaxFunction(torch.autograd.Function) with static forward and backward",
             fix="keep `class SoftmaxFunction(torch.autograd.Function):` and define forward(ctx, z) and "
                 "backward(ctx, grad) as @staticmethod")
    apply = fn.method("apply")
    # 1. forward: a stable softmax along the last axis, any leading axes
    forward_oracle = lambda z: torch.softmax(z.double(), -1)  # noqa: E731
    forward = _judge_cases(
        _forward_cases(), lambda case, said: _forward(apply, case, said), oracle=forward_oracle, table=FORWARD,
        tried=lambda c: f"SoftmaxFunction.apply(z) on {_describe(c[0], 'z')}", reduced=True, again=apply,
        expected="p = softmax(z) along the last axis, shaped like z", what="forward's output", atol=lambda c: 1e-5,
        signature="forward(ctx, z)", explain=_explain_forward, shape_fix="forward returns p shaped like z")
    first = _forward_cases()[0]
    kit.expect_unchanged(fn, first, call="SoftmaxFunction.apply(z)", name="z", shown=_describe(first[0], "z"),
                         apply=True)
    # 2. backward: the gradient autograd gets through torch.softmax, for any upstream gradient
    backward_oracle = lambda z, g: _oracle_vjp(torch.softmax(z.double(), -1), g)  # noqa: E731
    backward = _judge_cases(
        _backward_cases(), lambda case, said: _backward(apply, case, said), oracle=backward_oracle, table=BACKWARD,
        tried=lambda c: f"SoftmaxFunction.apply(z), then backward, on {_describe(c[0], 'z')} and upstream "
                        f"{_describe(c[1], 'grad')}", expected="∂ℒ/∂z shaped like z", what="backward's gradient",
        atol=lambda c: 10 * _grad_atol(c), hint=_saved_hint, signature="forward(ctx, z) and backward(ctx, grad)",
        explain=lambda o, case, said: _explain_vjp(o, case, said, z=case[0]),
        shape_fix="backward returns ∂ℒ/∂z shaped like z")
    # 3. gradcheck: backward agrees with finite differences of the learner's own forward (float64)
    z = torch.randn(3, 4, generator=torch.Generator().manual_seed(11), dtype=torch.float64).requires_grad_(True)
    tried = "torch.autograd.gradcheck(SoftmaxFunction.apply, z) with z of shape (3, 4), float64"
    try:
        ok = torch.autograd.gradcheck(lambda v: _ThroughLearner.apply(v, apply), (z,), raise_exception=False)
    except LearnerRaised as exc:
        raise Failure(learner_error(exc, tried=tried, expected="∂ℒ/∂z shaped like z",
                                    **(_saved_hint(exc) or _hint(exc, (z.detach(),), [], signature="forward(ctx, z) "
                                                                 "and backward(ctx, grad)")))) from None
    if not ok:  # a forward that loses precision hands its backward a rounded p too: blame the forward first
        where, error = ("forward", _float64_error(forward, forward_oracle))
        if error <= 1e-10:  # float64 rounding stays near 1e-16
            where, error = ("backward", _float64_error(backward, backward_oracle))
        lossy = error > 1e-10
        fail(f"gradcheck fails: {where} not in float64 precision" if lossy else "gradcheck fails", tried=tried,
             got="your backward disagrees with finite differences of your forward" + (
                 f"; on the float64 cases above, your {where} was off by up to {error:.1e} of the largest value"
                 if lossy else ""),
             expected="backward = the derivative of forward, both accurate to float64's ~16 digits",
             cause=f"your {where} loses precision (about {-math.log10(error):.0f} correct digits, as in float32 where "
                   "float64 keeps ~16): finite differences divide that error by gradcheck's step of 1e-6"
             if lossy else "",
             fix="compute in x's dtype: leave out .float(), .to(torch.float32) or float32 constants" if lossy
             else f"backward returns {_VJP}")
    # 4. O(n): measured in the learner's process, forward and backward apart
    gen = torch.Generator().manual_seed(12)
    tried = f"SoftmaxFunction.apply(z) and its backward on z of shape (1, {BIG_N}), float32, watching what they create"
    cost = _observe(fn, tried, "softmax and its gradient in O(n)", "your Function", "softmax_function_cost",
                    torch.randn(1, BIG_N, generator=gen), torch.randn(1, BIG_N, generator=gen))
    fix = f"save p in forward; in backward compute {_VJP}, never J"
    _quadratic(cost.get("forward", {}), "your forward", tried, fix)
    _quadratic(cost.get("backward", {}), "your backward", tried, fix)
    memory = f"O(n) at n = {BIG_N}" if cost.get("backward", {}).get("measured") else "memory not measured"
    return (f"forward stable on {len(_forward_cases())} cases, backward matches autograd on "
            f"{len(_backward_cases())} (grads of ±1000), gradcheck passes, {memory}")
