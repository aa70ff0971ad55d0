"""Checks for notebook 04 (the softmax Jacobian): softmax_jacobian, softmax_vjp, SoftmaxFunction.

Oracle: PyTorch's autograd — ``torch.autograd.functional.jacobian`` of ``torch.softmax`` for J, the
gradient of ``torch.softmax`` for the vector–Jacobian product and for the Function's backward, and
``torch.autograd.gradcheck`` for the Function.

The cases cover one vector (n,), batches (B, n) — square and not — and (B, A, n), size-1 axes, n = 1,
float32 and float64, a saturated softmax, exact zeros in p (scores of -inf), and upstream gradients
of ±1000: so a sign or transposition slip, pᵀp for p pᵀ, a missing term, a reduction over the whole
tensor or without keepdim, and code for one vector only each fail, and are named.

**O(n) memory and work** (the docstrings' promise for the VJP and the Function's backward) are
measured where the learner's code runs, by the learner-side probes :func:`vjp_cost` and
:func:`function_cost` (registered with :func:`~.boundary.probe`, asked for with
``learner.observe(...)``): they run the code once at n = 2048 while one
``torch.overrides.TorchFunctionMode`` records every tensor that a torch function called from
Python returns, and ``tracemalloc`` records NumPy's peak. Only those numbers cross back; the
verdict is the check's. The O(n) route holds a few vectors of n numbers (about 10⁴ in all); building
J or its outer product holds n² = 4,194,304 at once, and recomputing ⟨g, p⟩ for every entry creates
n² in total. The line is drawn at n²/8: 8× below the wrong answers and over 50× above the right
ones. The mode is imported inside the probe, with a fallback (memory then reported as not measured),
so a change in PyTorch can never break these checks at import.

The Function's backward is also compared with what a backward using the wrong saved tensor (z, or the
exponentials before normalising) would give, and a gradcheck failure says which pass lost float64
precision, measured on the float64 cases before it. Every check also asks, once, whether the learner's
code leaves its input (p or z) as it was.

Shared pieces come from notebook 03's checks, where they are public and documented
(:mod:`attn_course.checks.softmax`).
"""

from __future__ import annotations

import math
import tracemalloc
from typing import Any, Callable

import numpy as np
import torch

from .boundary import probe
from .compare import Failure
from .core import (Learner, LearnerRaised, LearnerTimedOut, Mistake, as_tensor, check, fail, fmt, learner_error)
from .softmax import (RuledOut, TensorOrArray, compare, describe_input, expect_floating, expect_input_unchanged,
                      explain_weights, probe_worth, raised_hint, same_as, softmax_mistakes, works_elsewhere)

__all__ = ["check_softmax_jacobian", "check_softmax_vjp", "check_SoftmaxFunction", "vjp_cost", "function_cost",
           "BIG_N"]

#: The size at which O(n) is checked: n² = 4,194,304 numbers, 16 MiB in float32.
BIG_N = 2048
#: At least this many numbers in one tensor, or created in all, mean O(n²): n²/8.
QUADRATIC = BIG_N * BIG_N // 8
INF = float("inf")


# ============================================================================ oracles
def _oracle_jacobian(p: torch.Tensor) -> torch.Tensor:
    """∂softmax/∂z by autograd at z = log p (softmax(log p) = p), one row at a time: (..., n, n)."""
    z = torch.log(p.double())
    rows = [torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1), row) for row in z.reshape(-1, z.shape[-1])]
    return torch.stack(rows).reshape(*p.shape, p.shape[-1])


def _oracle_vjp(p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """gᵀJ by autograd through torch.softmax at z = log p."""
    z = torch.log(p.double()).requires_grad_(True)
    (grad,) = torch.autograd.grad(torch.softmax(z, -1), z, g.double())
    return grad


def _probs(g: torch.Generator, *shape: int, dtype=torch.float64, scale: float = 1.5) -> torch.Tensor:
    return torch.softmax(scale * torch.randn(*shape, generator=g, dtype=dtype), -1)


def _fixed(scores: list, dtype=torch.float64) -> torch.Tensor:
    return torch.softmax(torch.tensor(scores, dtype=dtype), -1)


# ============================================================================ learner-side cost probes
def _tensors(value: Any, depth: int = 0):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)) and depth < 3:
        for item in value:
            yield from _tensors(item, depth + 1)


def _storage_elements(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().nbytes() // max(t.element_size(), 1)
    except Exception:  # noqa: BLE001 - tensors without a storage (sparse, meta…): count their elements
        return t.numel()


def _measure(work: Callable[[], Any]) -> dict[str, Any]:
    """Run ``work()`` once while watching what it creates: the largest tensor storage (elements) and its
    shape, the elements of every tensor a torch function returned, summed, and NumPy's peak (bytes)."""
    try:  # imported here, not at the top: a PyTorch without it costs this measurement, never the module
        from torch.overrides import TorchFunctionMode
    except ImportError:  # pragma: no cover - every PyTorch the course supports has it
        TorchFunctionMode = None
    stats: dict[str, Any] = {"measured": TorchFunctionMode is not None, "largest": 0, "shape": [], "total": 0}
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        if TorchFunctionMode is None:
            work()
        else:
            class Watch(TorchFunctionMode):
                def __torch_function__(self, func, types, args=(), kwargs=None):
                    out = func(*args, **(kwargs or {}))
                    for t in _tensors(out):
                        size = _storage_elements(t)
                        stats["total"] += t.numel()
                        if size > stats["largest"]:
                            stats["largest"], stats["shape"] = size, list(t.shape)
                    return out

            with Watch():
                work()
        stats["numpy_peak"] = max(0, tracemalloc.get_traced_memory()[1] - base)
    finally:
        if not tracing:
            tracemalloc.stop()
    return stats


@probe("softmax_vjp_cost")
def vjp_cost(fn: Callable, p: torch.Tensor, g: torch.Tensor, numpy: bool = False) -> dict[str, Any]:
    """Learner side: what one call ``fn(p, g)`` creates (see :func:`_measure`), after one unwatched
    call (so that one-off costs are not counted). ``numpy``: call with arrays."""
    args = (p.numpy(), g.numpy()) if numpy else (p, g)
    fn(*args)
    return _measure(lambda: fn(*args))


@probe("softmax_function_cost")
def function_cost(cls: type, z: torch.Tensor, g: torch.Tensor) -> dict[str, Any]:
    """Learner side: what ``cls.apply(z)`` creates, and what its backward creates for upstream ``g``.

    The backward is run by calling the output's ``grad_fn.apply(g)`` from Python: that is the learner's
    own ``backward`` with its real ctx, and torch functions it calls are seen (the autograd engine's
    own calls are not seen by a TorchFunctionMode)."""
    z = z.detach().requires_grad_(True)
    cls.apply(z)  # one unwatched forward
    holder: dict[str, Any] = {}
    forward = _measure(lambda: holder.setdefault("y", cls.apply(z)))
    node = getattr(holder["y"], "grad_fn", None)
    if node is None or not callable(getattr(node, "apply", None)):
        return {"forward": forward, "backward": {"measured": False}}
    with torch.no_grad():
        node.apply(g)  # one unwatched backward
        backward = _measure(lambda: node.apply(g))
    return {"forward": forward, "backward": backward}


def _quadratic(cost: dict, what: str, tried: str, fix: str) -> None:
    """Fail when a measured cost shows an n×n object or n² work."""
    if not isinstance(cost, dict) or not cost.get("measured", False):
        return
    largest, shape = int(cost.get("largest", 0)), tuple(cost.get("shape", ()))
    total, peak = int(cost.get("total", 0)), int(cost.get("numpy_peak", 0))
    expected = f"O(n) memory and work: a few vectors of {BIG_N} numbers (a full n×n matrix holds {BIG_N * BIG_N:,})"
    if largest >= QUADRATIC:
        fail(f"O(n²) memory in {what}", tried=tried,
             got=f"at n = {BIG_N}, {what} built a tensor of shape {shape} ({largest:,} numbers)", expected=expected,
             cause=f"{what} forms an n×n matrix (the Jacobian, or the outer product p pᵀ)", fix=fix)
    if peak >= 4 * QUADRATIC:
        fail(f"O(n²) memory in {what}", tried=tried,
             got=f"at n = {BIG_N}, {what} held {peak / 2**20:.0f} MiB of NumPy arrays at once", expected=expected,
             cause=f"{what} forms an n×n NumPy matrix (the Jacobian, or an outer product)", fix=fix)
    if total >= QUADRATIC:
        fail(f"O(n²) work in {what}", tried=tried,
             got=f"at n = {BIG_N}, {what} created {total:,} numbers in all, about n²/{max(1, round(BIG_N ** 2 / total))}",
             expected=expected, cause=f"{what} recomputes a whole row's worth of numbers for every entry (a Python "
             "loop over the entries, each computing ⟨g, p⟩ or a row of J again)", fix=fix)


# ============================================================================ after an exception
_ANY_AXES_FIX = "write every step for shape (..., n): torch.diag_embed, p.unsqueeze(-1) * p.unsqueeze(-2), sums " \
                "along -1 with keepdim=True"


def _works_elsewhere(failed: tuple[int, ...], others: list) -> dict[str, str]:
    return works_elsewhere(failed, others, fix=_ANY_AXES_FIX)


def _size_one(n: int, passed: set[int]) -> dict[str, str]:
    """``cause``/``fix`` for code that raised at n = 1 after working for longer rows."""
    if n != 1 or not passed or 1 in passed:
        return {}
    return dict(cause=f"your code fails when n = 1, though it worked for n = {', '.join(map(str, sorted(passed)))}: "
                      "something in it treats an axis of size 1 differently (.squeeze() without an axis removes "
                      "it, for example)",
                fix="keep every axis: no .squeeze() without an axis, and take n from p.shape[-1]")


# ============================================================================ softmax_jacobian
_BATCH_FIX = ("use operations that work for any leading axes: torch.diag_embed(p) (torch.diag on a 2-D tensor "
              "extracts a diagonal instead of building one) and p.unsqueeze(-1) * p.unsqueeze(-2) (torch.outer and "
              "np.outer flatten their inputs)")


def _new_size(p: torch.Tensor, passed: set[int]) -> str:
    """``"n = 5, though it worked for n = 3"`` when no earlier case had this row length, else ``""``."""
    n = p.shape[-1]
    if not passed or n in passed:
        return ""
    return f"n = {n}, though it worked for n = {', '.join(map(str, sorted(passed)))}"


def _jacobian_cases() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [
        _fixed([1.0, 2.0, 3.0]),
        _probs(g, 5, dtype=torch.float32),
        _fixed([12.0, 0.0, -3.0, 1.0]),  # saturated
        _fixed([2.0, -INF, 0.0, -INF]),  # exact zeros
        torch.ones(1, dtype=torch.float64),  # n = 1: J = [[0]]
        _probs(g, 2, 5),
        _probs(g, 4, 4, dtype=torch.float32),  # a square batch
        _probs(g, 3, 5),
        _probs(g, 1, 5, dtype=torch.float32),  # batch of one
        _probs(g, 2, 3, 4),  # batch and heads
        _probs(g, 3, 1, 4, dtype=torch.float32),  # a size-1 axis in the middle
    ]


def _jacobian_mistakes(p: torch.Tensor, expected: torch.Tensor) -> list[Mistake]:
    outer = p.unsqueeze(-1) * p.unsqueeze(-2)  # (..., n, n)
    diag = torch.diag_embed(p)
    n = p.shape[-1]
    eye = torch.eye(n, dtype=p.dtype)
    formula = "J = diag(p) − p pᵀ: torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)"
    inner = ("pᵀp for p pᵀ", "you subtracted the inner product pᵀp = Σ p_i² (one number) where J needs the outer "
             "product p pᵀ (an n×n matrix with entries p_i p_j)", "the outer product: p.unsqueeze(-1) * p.unsqueeze(-2)")
    out = [
        Mistake("sign flipped", "your J is p pᵀ − diag(p), the negative of diag(p) − p pᵀ (its diagonal p_i(1 − p_i) "
                "must be positive)", formula, lambda: outer - diag),
        Mistake(*inner, lambda: diag - (p * p).sum(-1)[..., None, None]),
        Mistake(*inner, lambda: diag - (p * p).sum()),
        Mistake("− p pᵀ term missing", "you returned diag(p) alone: off the diagonal, ∂p_i/∂z_j = −p_i p_j, not 0",
                formula, lambda: diag),
        Mistake("diag(p) term missing", "you returned −p pᵀ alone: the diagonal entries are p_i − p_i², not −p_i²",
                formula, lambda: -outer),
        Mistake("only the diagonal", "you returned only the diagonal entries p_i(1 − p_i): the off-diagonal entries "
                "−p_i p_j are missing", formula, lambda: torch.diag_embed(p * (1 - p))),
        Mistake("p_i² for p_i p_j", "you subtracted p_i² in row i (p ⊙ p broadcast along the rows), not the outer "
                "product p_i p_j", "the outer product: p.unsqueeze(-1) * p.unsqueeze(-2)",
                lambda: diag - (p * p).unsqueeze(-1)),
        Mistake("p_j² for p_i p_j", "you subtracted p_j² in column j, not the outer product p_i p_j",
                "the outer product: p.unsqueeze(-1) * p.unsqueeze(-2)", lambda: diag - (p * p).unsqueeze(-2)),
        Mistake("p_i / p_j for p_i p_j", "you divided where the outer product multiplies: p_i / p_j", formula,
                lambda: diag - p.unsqueeze(-1) / p.unsqueeze(-2)),
        Mistake("outer product missing a factor", "you subtracted p_i (p broadcast along one axis), not the outer "
                "product p_i p_j", "the outer product: p.unsqueeze(-1) * p.unsqueeze(-2)",
                lambda: diag - p.unsqueeze(-1)),
        Mistake("outer product missing a factor", "you subtracted p_j (p broadcast along one axis), not the outer "
                "product p_i p_j", "the outer product: p.unsqueeze(-1) * p.unsqueeze(-2)",
                lambda: diag - p.unsqueeze(-2)),
        Mistake("p for diag(p)", "you subtracted the outer product from the vector p, which broadcasts along the "
                "rows, where J needs the diagonal matrix diag(p)", "torch.diag_embed(p) builds diag(p) for any leading "
                "axes", lambda: p.unsqueeze(-2) - outer),
        Mistake("outer product added", "you added p pᵀ to diag(p); J subtracts it", formula, lambda: diag + outer),
        Mistake("outer product alone", "you returned p pᵀ alone", formula, lambda: outer),
        Mistake("identity for diag(p)", "you used the identity matrix where J has diag(p)", formula,
                lambda: eye - outer),
        Mistake("Jacobian of log-softmax", "you returned I − 1 pᵀ, the Jacobian of log-softmax; softmax's is "
                "diag(p) − p pᵀ", formula, lambda: eye - p.unsqueeze(-2).expand(*p.shape[:-1], n, n)),
        Mistake("softmax applied to p", "you took the softmax of p again: p is already the softmax output, and J is "
                "written in terms of it", "use p as it is: " + formula,
                lambda: torch.diag_embed(torch.softmax(p, -1)) - torch.softmax(p, -1).unsqueeze(-1) *
                torch.softmax(p, -1).unsqueeze(-2)),
        Mistake("outer product over the batch", "you multiplied pᵀ @ p over a (B, n) tensor, which sums the outer "
                "products of all rows into one n×n matrix", "one matrix per row: p.unsqueeze(-1) * p.unsqueeze(-2)",
                lambda: torch.diag_embed(p).sum(0) - p.T @ p if p.ndim == 2 else None),
    ]
    if p.ndim >= 2:
        flat = p.reshape(-1)
        out.append(Mistake("one Jacobian for the whole batch, flattened", "torch.outer and np.outer flatten their "
                           "inputs, so your J treats the whole batch as one long vector: one (B·n)×(B·n) matrix",
                           "one n×n matrix per row: " + formula, lambda: torch.diag(flat) - torch.outer(flat, flat)))
        batch = list(range(p.ndim - 1))
        out += [
            Mistake("batch axes last", "your J has the batch axes after the two Jacobian axes",
                    "batch axes first, the two Jacobian axes last: J[..., i, j] = ∂p_i/∂z_j",
                    lambda: expected.movedim(batch, [expected.ndim - len(batch) + k for k in batch])),
            Mistake("batch axes in the wrong place", "your J has a batch axis between the two Jacobian axes",
                    "batch axes first, the two Jacobian axes last: J[..., i, j] = ∂p_i/∂z_j",
                    lambda: expected.movedim(batch, [k + 1 for k in batch])),
        ]
    if p.ndim == 2:
        out.append(Mistake("Jacobian across the batch", "you differentiated the whole (B, n) batch at once: that is "
                           "a (B, n, B, n) array, most of it zeros between different rows",
                           "one n×n matrix per row: " + formula,
                           lambda: torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1),
                                                                      torch.log(p.double()))))
    return out


def _explain_jacobian(out: torch.Tensor, p: torch.Tensor, expected: torch.Tensor, tried: str) -> None:
    """Which property of J = diag(p) − p pᵀ the answer breaks (same shape, no known mistake)."""
    a, e = out.detach().double(), expected
    if not torch.isfinite(a).all():
        return
    eye = torch.eye(p.shape[-1], dtype=torch.bool)
    close = torch.isclose(a, e, atol=1e-6, rtol=1e-4)
    diag_ok, off_ok = bool(close[..., eye].all()), bool(close[..., ~eye].all())
    formula = "J = diag(p) − p pᵀ: torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)"
    if diag_ok and not off_ok:
        fail("off-diagonal entries wrong", tried=tried, got="the diagonal of your J is right, the entries off it are not",
             expected="J[i, j] = −p_i p_j for i ≠ j", fix=formula)
    if off_ok and not diag_ok:
        fail("diagonal wrong", tried=tried, got="the entries off the diagonal are right, the diagonal is not",
             expected="J[i, i] = p_i (1 − p_i)", fix=formula)
    if not torch.allclose(a, a.transpose(-1, -2), atol=1e-6):
        fail("J not symmetric", tried=tried,
             got=f"your J differs from its transpose (by up to {fmt(float((a - a.transpose(-1, -2)).abs().max()))})",
             expected="a symmetric J: J[i, j] = J[j, i] = −p_i p_j off the diagonal", fix=formula)
    rows = a.sum(-1)
    if not torch.allclose(rows, torch.zeros_like(rows), atol=1e-6):
        fail("rows of J do not sum to 0", tried=tried,
             got=f"rows of your J sum to {fmt(float(rows.min()))} … {fmt(float(rows.max()))}",
             expected="every row summing to 0 (Σ_i p_i = 1 whatever z is)", fix=formula)


@check("softmax_jacobian", expects="a function softmax_jacobian(p) returning J of shape (..., n, n)")
def check_softmax_jacobian(fn: Learner) -> str:
    run, ruled = TensorOrArray(fn), RuledOut()
    cases = _jacobian_cases()
    passed_ndim, passed_n, passed_ndims = 0, set(), set()
    for p in cases:
        tried = f"softmax_jacobian(p) on {describe_input(p, 'p')}"
        try:
            result = run(p)
        except LearnerRaised as exc:
            hint = raised_hint(exc, signature="softmax_jacobian(p)", batched=p.ndim > passed_ndim >= 1,
                               reductions=False, new_size=_new_size(p, passed_n))
            hint = _size_one(p.shape[-1], passed_n) or hint
            if p.ndim not in passed_ndims and probe_worth(hint):
                hint = _works_elsewhere(tuple(p.shape), [
                    (tuple(c.shape), lambda c=c: same_as(run(c), _oracle_jacobian(c), atol=1e-6))
                    for c in cases if c.ndim not in passed_ndims]) or hint
            raise Failure(learner_error(exc, tried=tried, expected="J of shape (..., n, n)", **hint)) from None
        out = as_tensor(result, tried=tried)
        expect_floating(out, p.dtype, tried=tried, what="your J")
        expected = _oracle_jacobian(p)
        compare(out, expected, tried=tried, what="your J", mistakes=_jacobian_mistakes(p, expected), atol=1e-6,
                rtol=1e-4, ruled_out=ruled, explain=lambda o, p=p, e=expected: _explain_jacobian(o, p, e, tried),
                shape_fix="one n×n matrix per row of p: J has shape (*p.shape, n)" + (
                    "; " + _BATCH_FIX if p.ndim > passed_ndim >= 1 else ""), factors={"n": float(p.shape[-1])})
        passed_ndim = max(passed_ndim, p.ndim)
        passed_ndims.add(p.ndim)
        passed_n.add(p.shape[-1])
    expect_input_unchanged(fn, cases[0], call="softmax_jacobian(p)", numpy=run.mode == "numpy", name="p")
    return (f"matches torch.autograd.functional.jacobian on {len(cases)} cases ({run.kind}): (n,), (B, n), "
            "(B, A, n), n = 1, saturated")


# ============================================================================ softmax_vjp
_VJP_FORMULA = "p * (grad - (grad * p).sum(-1, keepdim=True))"


def _vjp_mistakes(p: torch.Tensor, g: torch.Tensor) -> list[Mistake]:
    dot = (g * p).sum(-1, keepdim=True)
    fix = f"∂ℒ/∂z = p ⊙ (g − ⟨g, p⟩): {_VJP_FORMULA}"
    return [
        Mistake("grad returned unchanged", "you returned the upstream gradient as it is: the gradient with respect to "
                "the scores is grad multiplied by the softmax Jacobian", fix, lambda: g.clone()),
        Mistake("⟨g, p⟩ term missing", "you returned p ⊙ g, only the diagonal part of the product: the − p ⟨g, p⟩ "
                "term is missing", fix, lambda: p * g),
        Mistake("sign flipped", "you returned p ⊙ (⟨g, p⟩ − g), the negative of the gradient", fix,
                lambda: p * (dot - g)),
        Mistake("final multiplication by p missing", "you returned g − ⟨g, p⟩ without multiplying by p", fix,
                lambda: g - dot),
        Mistake("plain sum of g", "you subtracted the plain sum Σ_j g_j; the term is the p-weighted sum ⟨g, p⟩ = "
                "Σ_j g_j p_j", fix, lambda: p * (g - g.sum(-1, keepdim=True))),
        Mistake("mean of g", "you subtracted the mean of g; the term is the p-weighted sum ⟨g, p⟩ = Σ_j g_j p_j", fix,
                lambda: p * (g - g.mean(-1, keepdim=True))),
        Mistake("⟨g, p⟩ summed over the whole tensor", "you summed g ⊙ p over the whole tensor, not per row, so every "
                "row gets the same ⟨g, p⟩", "sum along the last axis only: (grad * p).sum(-1, keepdim=True)",
                lambda: p * (g - (g * p).sum())),
        Mistake("keepdim missing", "you reduced ⟨g, p⟩ without keepdim=True, so it broadcast along the wrong axis "
                "(each row got another row's sum)", "(grad * p).sum(-1, keepdim=True)",
                lambda: p * (g - (g * p).sum(-1))),
        Mistake("only the diagonal of J", "you multiplied g by the diagonal of J, p ⊙ (1 − p), leaving out the "
                "off-diagonal −p_i p_j", fix, lambda: p * (1 - p) * g),
        Mistake("p and grad swapped", "you used grad where the formula has p and p where it has grad", fix,
                lambda: g * (p - dot)),
        Mistake("mean instead of sum for ⟨g, p⟩", "you took the mean of g ⊙ p; ⟨g, p⟩ is its sum", fix,
                lambda: p * (g - (g * p).mean(-1, keepdim=True))),
        Mistake("g / p for g ⊙ p", "you divided grad by p inside ⟨g, p⟩; it is the sum of the products g_j p_j", fix,
                lambda: p * (g - (g / p).sum(-1, keepdim=True))),
        Mistake("⟨g, p⟩ replaced by Σ p", "you summed p alone (which is 1) where ⟨g, p⟩ sums g ⊙ p", fix,
                lambda: p * (g - p.sum(-1, keepdim=True))),
        Mistake("divided by (g − ⟨g, p⟩)", "you divided p by (g − ⟨g, p⟩); the two are multiplied", fix,
                lambda: p / (g - dot)),
        Mistake("returned p", "you returned p itself", fix, lambda: p.clone()),
        Mistake("sign of the ⟨g, p⟩ term", "you added ⟨g, p⟩; the formula subtracts it", fix, lambda: p * (g + dot)),
        Mistake("only the − p ⟨g, p⟩ part", "you returned p ⊙ ⟨g, p⟩: the p ⊙ g part is missing", fix,
                lambda: p * dot),
        Mistake("upstream gradient not used", "your result is J·1, the product with a vector of ones (which is 0), "
                "not with grad", fix, lambda: torch.zeros_like(p)),
        Mistake("upstream gradient not used", "your result is the diagonal of J, p ⊙ (1 − p): grad does not enter it",
                fix, lambda: p * (1 - p)),
        Mistake("softmax applied to p", "you took the softmax of p again: p is already the softmax output",
                "use p as it is: " + _VJP_FORMULA, lambda: torch.softmax(p, -1) * (
                    g - (g * torch.softmax(p, -1)).sum(-1, keepdim=True))),
        Mistake("pᵀp for p pᵀ", "you used J = diag(p) − pᵀp (one number) in place of the outer product p pᵀ",
                fix, lambda: p * g - (p * p).sum(-1, keepdim=True) * g),
        Mistake("⟨g, p⟩ not multiplied by p", "you returned p ⊙ g − ⟨g, p⟩: the ⟨g, p⟩ term must be multiplied by "
                "p too, p ⊙ g − p ⟨g, p⟩", fix, lambda: p * g - dot),
        Mistake("⟨p, p⟩ for ⟨g, p⟩", "you subtracted ⟨p, p⟩ = Σ p_j² where the formula has ⟨g, p⟩ = Σ g_j p_j", fix,
                lambda: p * (g - (p * p).sum(-1, keepdim=True))),
        Mistake("⟨g, g⟩ for ⟨g, p⟩", "you subtracted ⟨g, g⟩ = Σ g_j² where the formula has ⟨g, p⟩ = Σ g_j p_j", fix,
                lambda: p * (g - (g * g).sum(-1, keepdim=True))),
    ] + [
        Mistake(f"⟨g, p⟩ summed along axis {o}", f"you summed g ⊙ p along axis {o}; ⟨g, p⟩ is the sum along the "
                "last axis, one number per row", "(grad * p).sum(-1, keepdim=True)",
                lambda o=o: p * (g - (g * p).sum(o, keepdim=True))) for o in range(p.ndim - 1)
    ] + [
        Mistake("⟨g, p⟩ summed over a whole batch entry", "you summed g ⊙ p over each batch entry (a loop over the "
                "first axis?), not over each row", "sum along the last axis only: (grad * p).sum(-1, keepdim=True)",
                lambda: p * (g - (g * p).flatten(1).sum(1).reshape(-1, *[1] * (p.ndim - 1))) if p.ndim >= 3 else None),
    ]


def _vjp_cases() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(8)

    def grad(*shape, dtype=torch.float64, scale=1.0):
        return scale * torch.randn(*shape, generator=g, dtype=dtype)

    s5 = _probs(g, 5)
    return [
        (s5, grad(5)),
        (s5, torch.ones(5, dtype=torch.float64)),  # the gradient of Σ p = 1 is 0
        (_probs(g, 6, dtype=torch.float32), grad(6, dtype=torch.float32)),
        (_probs(g, 4, 4), grad(4, 4)),  # square: a keepdim slip broadcasts instead of failing
        (_probs(g, 3, 5, dtype=torch.float32), grad(3, 5, dtype=torch.float32)),
        (_probs(g, 2, 3, 6), grad(2, 3, 6)),
        (_probs(g, 1, 5), grad(1, 5)),
        (_probs(g, 3, 1, 4, dtype=torch.float32), grad(3, 1, 4, dtype=torch.float32)),
        (torch.ones(2, 1, dtype=torch.float64), grad(2, 1)),  # n = 1: the gradient is 0
        # saturated rows with large upstream gradients, and exact zeros in p
        (_fixed([[20.0, 0.0, -5.0, 3.0], [2.0, -INF, 0.0, -INF]]),
         torch.tensor([[1000.0, -1000.0, 500.0, 0.001], [-1000.0, 7.0, 1000.0, 3.0]], dtype=torch.float64)),
    ]


def _explain_vjp(out: torch.Tensor, p: torch.Tensor, g: torch.Tensor, tried: str,
                 z: torch.Tensor | None = None) -> None:
    """What is wrong with a gradient that matches no known mistake. ``z``: the scores, when the answer is a
    Function's backward (whose forward has already passed every case, ±1000 included)."""
    a = out.detach().double()
    if not torch.isfinite(a).all():
        rows = (~torch.isfinite(a)).any(-1)  # (...,) the rows holding NaN or inf
        cause = ""
        if z is not None:
            xs = z.double()
            top = xs.masked_fill(~torch.isfinite(xs), -INF).amax(-1)
            limit = math.log(torch.finfo(z.dtype).max)
            if bool((top[rows] > limit).all()):
                cause = (f"those rows hold scores above {limit:.2f}, where e^z overflows in "
                         f"{str(z.dtype).replace('torch.', '')}; your forward handles them (it passed the cases at "
                         "±1000), so your backward must be exponentiating z again without subtracting the maximum")
        fail("NaN or inf in the gradient", tried=tried, got=f"{int((~torch.isfinite(a)).sum())} entries are NaN or inf",
             expected="finite gradients (p and grad are finite)", cause=cause,
             fix="save p in forward and use it in backward (or recompute it stably, with the maximum subtracted)"
             if cause else f"compute {_VJP_FORMULA}: no division, no log")
    sums = a.sum(-1)
    if not torch.allclose(sums, torch.zeros_like(sums), atol=1e-6 * max(1.0, float(g.abs().max()))):
        fail("rows do not sum to 0", tried=tried,
             got=f"rows of your result sum to {fmt(float(sums.min()))} … {fmt(float(sums.max()))}",
             expected="every row summing to 0 (Σ_i p_i (g_i − ⟨g, p⟩) = ⟨g, p⟩ − ⟨g, p⟩ = 0)",
             fix=f"∂ℒ/∂z = p ⊙ (g − ⟨g, p⟩): {_VJP_FORMULA}")


def _vjp_tried(name: str, p: torch.Tensor, g: torch.Tensor) -> str:
    return f"{name} on {describe_input(p, 'p')} and {describe_input(g, 'grad')}"


@check("softmax_vjp", expects="a function softmax_vjp(p, grad) returning ∂ℒ/∂z shaped like p")
def check_softmax_vjp(fn: Learner) -> str:
    run, ruled = TensorOrArray(fn), RuledOut()
    cases = _vjp_cases()
    passed_ndim, passed_n, passed_ndims = 0, set(), set()
    for p, g in cases:
        tried = _vjp_tried("softmax_vjp(p, grad)", p, g)
        try:
            result = run(p, g)
        except LearnerRaised as exc:
            hint = raised_hint(exc, signature="softmax_vjp(p, grad)", batched=p.ndim > passed_ndim >= 1,
                               new_size=_new_size(p, passed_n))
            hint = _size_one(p.shape[-1], passed_n) or hint
            if p.ndim not in passed_ndims and probe_worth(hint):
                hint = _works_elsewhere(tuple(p.shape), [
                    (tuple(c.shape), lambda c=c, h=h: same_as(run(c, h), _oracle_vjp(c, h), atol=1e-5))
                    for c, h in cases if c.ndim not in passed_ndims]) or hint
            raise Failure(learner_error(exc, tried=tried, expected="∂ℒ/∂z shaped like p", **hint)) from None
        out = as_tensor(result, tried=tried)
        expect_floating(out, p.dtype, tried=tried)
        atol = 1e-6 * max(1.0, float(g.abs().max()))
        compare(out, _oracle_vjp(p, g), tried=tried, what="your result", mistakes=_vjp_mistakes(p, g), atol=atol,
                rtol=1e-4, ruled_out=ruled, explain=lambda o, p=p, g=g: _explain_vjp(o, p, g, tried),
                shape_fix="∂ℒ/∂z has the shape of p")
        passed_ndim = max(passed_ndim, p.ndim)
        passed_ndims.add(p.ndim)
        passed_n.add(p.shape[-1])
    expect_input_unchanged(fn, cases[0][0], cases[0][1], call="softmax_vjp(p, grad)", numpy=run.mode == "numpy",
                           name="p")
    # O(n): measured in the learner's process
    gen = torch.Generator().manual_seed(80)
    big_s, big_g = _probs(gen, 1, BIG_N, dtype=torch.float32), torch.randn(1, BIG_N, generator=gen)
    tried = f"softmax_vjp(p, grad) on p and grad of shape (1, {BIG_N}), float32, watching what it creates"
    try:
        cost = fn.observe("softmax_vjp_cost", big_s, big_g, run.mode == "numpy")
    except (LearnerRaised, LearnerTimedOut) as exc:
        raise Failure(learner_error(exc, tried=tried, expected="∂ℒ/∂z in O(n)",
                                    cause="" if isinstance(exc, LearnerRaised) else
                                    f"at n = {BIG_N} your function needs far more than O(n) work")) from None
    _quadratic(cost, "your softmax_vjp", tried, fix=f"do not form J: {_VJP_FORMULA}")
    memory = f"O(n) at n = {BIG_N}" if cost.get("measured") else "memory not measured (no TorchFunctionMode)"
    return f"matches autograd on {len(cases)} cases ({run.kind}): (n,) to (B, A, n), n = 1, grads of ±1000; {memory}"


# ============================================================================ SoftmaxFunction
class _ThroughLearner(torch.autograd.Function):
    """A Function whose forward and backward are the learner's, reached through Learner operations.

    ``torch.autograd.gradcheck`` runs on it in the check's own process: every forward it asks for is a
    ``learner.method("apply")(z)`` operation and every backward a ``learner.method("apply").vjp(...)``,
    so the grader, replaying the log, feeds gradcheck exactly the same numbers (gradcheck's inputs
    are deterministic) without running the learner's code. A probe would instead have to trust a
    verdict computed in the learner's process."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, apply: Learner) -> torch.Tensor:
        ctx.learner = apply  # (not ctx.apply: that name is the backward node's own method)
        ctx.save_for_backward(z)
        out = as_tensor(apply(z.detach()), tried="gradcheck's forward")
        return out.to(z.dtype).reshape(z.shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (z,) = ctx.saved_tensors
        with torch.enable_grad():  # autograd runs backward with grad mode off; the learner's forward needs it on
            _, grads = ctx.learner.vjp((z.detach(),), grad.detach())
        if not grads or grads[0] is None:
            return torch.zeros_like(z), None
        return as_tensor(grads[0], tried="gradcheck's backward").to(z.dtype).reshape(z.shape), None


#: Relative errors above this, on float64 inputs, are not float64 rounding (which stays near 1e-16).
_FLOAT64_ROUNDING = 1e-10


def _relative_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    a, e = out.detach().double(), expected.detach().double()
    ok = torch.isfinite(a) & torch.isfinite(e)
    if not ok.any():
        return 0.0
    return float((a[ok] - e[ok]).abs().max() / e[ok].abs().max().clamp(min=1e-300))


def _saved_mistakes(z: torch.Tensor, g: torch.Tensor) -> list[Mistake]:
    """Backwards that use another tensor than p = softmax(z) as p: what forward saved was not the output."""
    z = z.double()
    e = torch.exp(z - z.amax(-1, keepdim=True))  # the exponentials before normalising
    fix = "save the output of forward: ctx.save_for_backward(p) with p = e / e.sum(-1, keepdim=True) (or save z " \
          "and recompute p from it, stably)"

    def product(t: torch.Tensor) -> torch.Tensor:
        return t * (g - (g * t).sum(-1, keepdim=True))

    return [
        Mistake("z used as p in backward", "your backward uses z, the scores, where the formula needs p = softmax(z): "
                "forward saved its input, not its output", fix, lambda: product(z)),
        Mistake("unnormalised e used as p in backward", "your backward uses e = exp(z − max) before it is divided "
                "by its sum: forward saved e, not p = e / Σ e", fix, lambda: product(e)),
        Mistake("e^z used as p in backward", "your backward uses exp(z), not p = softmax(z): forward saved the "
                "exponentials before normalising", fix, lambda: product(torch.exp(z))),
    ]


def _forward_cases() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(9)
    return [
        2 * torch.randn(2, 5, generator=g),
        torch.randn(2, 3, 4, generator=g, dtype=torch.float64),
        torch.randn(6, generator=g),
        torch.randn(1, 5, generator=g, dtype=torch.float64),
        torch.randn(3, 1, 4, generator=g),
        torch.tensor([[50.0, 48.0, 49.0], [-3.0, 0.0, 1.0]]),  # e^z finite in float32, e^(z + max) not
        torch.tensor([[1000.0, 1001.0, 1002.0], [2.0, 1.0, 0.0]]),
        torch.tensor([[-1000.0, -998.0, -999.0], [0.0, -1000.0, 5.0]], dtype=torch.float64),
        torch.tensor([[0.0, -INF, 1.0], [-INF, 3.0, -INF]]),
    ]


def _backward_cases() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(10)

    def rand(*shape, dtype=torch.float64, scale=1.0):
        return scale * torch.randn(*shape, generator=g, dtype=dtype)

    return [
        (rand(5), rand(5)),
        (rand(4, 4, dtype=torch.float32, scale=2.0), rand(4, 4, dtype=torch.float32)),
        (rand(3, 5), rand(3, 5)),
        (rand(2, 3, 6), rand(2, 3, 6)),
        (rand(1, 5, dtype=torch.float32), rand(1, 5, dtype=torch.float32)),
        (rand(3, 1, 4), rand(3, 1, 4)),
        (torch.tensor([[1000.0, 1001.0, 1002.0], [0.0, -1000.0, 5.0]], dtype=torch.float64),
         torch.tensor([[1000.0, -1000.0, 5.0], [-1000.0, 1000.0, 3.0]], dtype=torch.float64)),
        (torch.tensor([[0.0, -INF, 1.0], [2.0, 2.0, -INF]]), rand(2, 3, dtype=torch.float32)),
    ]


def _backward_right(apply: Learner, z: torch.Tensor, g: torch.Tensor) -> bool:
    """Whether the learner's Function gives the right gradient on (z, g) (an attempt on another shape)."""
    _, grads = apply.vjp((z,), g)
    return bool(grads) and grads[0] is not None and \
        same_as(grads[0], _oracle_vjp(torch.softmax(z.double(), -1), g.double()), atol=1e-5 * max(1.0, float(g.abs().max())))


def _backward_error(exc: LearnerRaised, tried: str, z: torch.Tensor, passed_ndim: int,
                    others: list | None = None) -> Failure:
    hint: dict[str, str] = {}
    if "invalid gradient" in exc.message or "expected shape" in exc.message:
        hint = dict(cause="backward returned a gradient whose shape is not the shape of z",
                    fix="return ∂ℒ/∂z shaped like z: p * (grad - (grad * p).sum(-1, keepdim=True))")
    elif "saved_tensors" in exc.code and "unpack" in exc.message:
        hint = dict(cause="ctx.saved_tensors holds nothing: your forward did not save p",
                    fix="in forward, call ctx.save_for_backward(p) before returning p")
    elif "saved" in exc.message and ("freed" in exc.message or "saved_tensors" in exc.message):
        hint = dict(cause="backward could not read what forward saved", fix="save with ctx.save_for_backward(p) "
                    "in forward and read it back with (p,) = ctx.saved_tensors in backward")
    else:
        hint = raised_hint(exc, signature="forward(ctx, z) and backward(ctx, grad)", batched=z.ndim > passed_ndim >= 1)
        if probe_worth(hint):
            hint = _works_elsewhere(tuple(z.shape), others or []) or hint
    return Failure(learner_error(exc, tried=tried, expected="∂ℒ/∂z shaped like z", **hint))


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
    ruled = RuledOut()
    passed_ndim, passed_ndims = 0, set()
    forward_error = 0.0  # the largest error of forward on float64 input, relative to the largest weight
    for z in _forward_cases():
        tried = f"SoftmaxFunction.apply(z) on {describe_input(z, 'z')}"
        try:
            result = apply(z)
        except LearnerRaised as exc:
            hint = raised_hint(exc, signature="forward(ctx, z)", batched=z.ndim > passed_ndim >= 1)
            if z.ndim not in passed_ndims and probe_worth(hint):
                hint = _works_elsewhere(tuple(z.shape), [
                    (tuple(c.shape), lambda c=c: same_as(apply(c), torch.softmax(c.double(), -1)))
                    for c in _forward_cases() if c.ndim not in passed_ndims]) or hint
            raise Failure(learner_error(exc, tried=tried, expected="p = softmax(z) along the last axis, shaped like z",
                                        **hint)) from None
        if isinstance(result, np.ndarray):
            fail("forward returned a NumPy array", tried=tried, got=f"a NumPy array of shape {result.shape}",
                 expected="a torch.Tensor p shaped like z",
                 cause="autograd follows tensors only: a NumPy result leaves the graph, so backward can never run",
                 fix="compute p with torch operations and return the tensor")
        out = as_tensor(result, tried=tried, what="forward")
        expect_floating(out, z.dtype, tried=tried, what="forward's output")
        atol, rtol = (1e-5, 1e-4)
        compare(out, torch.softmax(z.double(), -1), tried=tried, what="forward's output",
                mistakes=softmax_mistakes(z, -1), atol=atol, rtol=rtol, ruled_out=ruled,
                explain=lambda o, z=z: explain_weights(o, z, -1, tried=tried, what="forward's output"),
                shape_fix="forward returns p shaped like z", reduced=z.ndim - 1)
        passed_ndim = max(passed_ndim, z.ndim)
        passed_ndims.add(z.ndim)
        if z.dtype == torch.float64:
            forward_error = max(forward_error, _relative_error(out, torch.softmax(z, -1)))

    expect_input_unchanged(fn, _forward_cases()[0], call="SoftmaxFunction.apply(z)", apply=True, name="z")

    # 2. backward: the gradient autograd gets through torch.softmax, for any upstream gradient
    ruled = RuledOut()
    passed_ndim, passed_ndims = 0, set()
    backward_error = 0.0  # the same for backward's gradient
    for z, g in _backward_cases():
        tried = f"SoftmaxFunction.apply(z), then backward, on {describe_input(z, 'z')} and upstream {describe_input(g, 'grad')}"
        try:
            _, grads = apply.vjp((z,), g)
        except LearnerRaised as exc:
            others = [] if z.ndim in passed_ndims else [
                (tuple(c.shape), lambda c=c, h=h: _backward_right(apply, c, h))
                for c, h in _backward_cases() if c.ndim not in passed_ndims]
            raise _backward_error(exc, tried, z, passed_ndim, others) from None
        if grads is None:
            fail("no gradient reaches z", tried=tried, got="the output of apply(z) does not depend on z through autograd",
                 expected="∂ℒ/∂z from your backward",
                 fix="return p from forward as computed from z (no .detach(), no torch.no_grad())")
        if grads[0] is None:
            fail("backward returned None", tried=tried, got="None as the gradient for z",
                 expected="∂ℒ/∂z, a tensor shaped like z", fix=f"end backward with return {_VJP_FORMULA}")
        grad = as_tensor(grads[0], tried=tried, what="backward's gradient")
        p = torch.softmax(z.double(), -1)
        g64 = g.double()
        atol = 1e-5 * max(1.0, float(g.abs().max()))
        compare(grad, _oracle_vjp(p, g64), tried=tried, what="backward's gradient",
                mistakes=_saved_mistakes(z, g64) + _vjp_mistakes(p, g64), atol=atol, rtol=1e-4, ruled_out=ruled,
                explain=lambda o, p=p, g64=g64, z=z: _explain_vjp(o, p, g64, tried, z=z),
                shape_fix="backward returns ∂ℒ/∂z shaped like z")
        passed_ndim = max(passed_ndim, z.ndim)
        passed_ndims.add(z.ndim)
        if z.dtype == torch.float64:
            backward_error = max(backward_error, _relative_error(grad, _oracle_vjp(p, g64)))

    # 3. gradcheck: backward agrees with finite differences of the learner's own forward (float64)
    z = torch.randn(3, 4, generator=torch.Generator().manual_seed(11), dtype=torch.float64).requires_grad_(True)
    tried = "torch.autograd.gradcheck(SoftmaxFunction.apply, z) with z of shape (3, 4), float64"
    try:
        ok = torch.autograd.gradcheck(lambda v: _ThroughLearner.apply(v, apply), (z,), raise_exception=False)
    except LearnerRaised as exc:
        raise _backward_error(exc, tried, z, 2) from None
    if not ok:
        # A forward that loses precision hands its backward a rounded p too: blame the forward first.
        where, error = ("forward", forward_error) if forward_error > _FLOAT64_ROUNDING else ("backward", backward_error)
        lossy = error > _FLOAT64_ROUNDING
        fail(f"gradcheck fails: {where} not in float64 precision" if lossy else "gradcheck fails", tried=tried,
             got="your backward disagrees with finite differences of your forward" + (
                 f"; on the float64 cases above, your {where} was off by up to {error:.1e} of the largest value" if lossy
                 else ""),
             expected="backward = the derivative of forward, both accurate to float64's ~16 digits",
             cause=f"your {where} loses precision (about {-math.log10(error):.0f} correct digits, as in float32 where "
                   "float64 keeps ~16): finite differences divide that error by gradcheck's step of 1e-6" if lossy
             else "",
             fix="compute in x's dtype: leave out .float(), .to(torch.float32) or float32 constants" if lossy
             else f"backward returns {_VJP_FORMULA}")

    # 4. O(n): measured in the learner's process, forward and backward apart
    gen = torch.Generator().manual_seed(12)
    big_x, big_g = torch.randn(1, BIG_N, generator=gen), torch.randn(1, BIG_N, generator=gen)
    tried = f"SoftmaxFunction.apply(z) and its backward on z of shape (1, {BIG_N}), float32, watching what they create"
    try:
        cost = fn.observe("softmax_function_cost", big_x, big_g)
    except (LearnerRaised, LearnerTimedOut) as exc:
        raise Failure(learner_error(exc, tried=tried, expected="softmax and its gradient in O(n)",
                                    cause="" if isinstance(exc, LearnerRaised) else
                                    f"at n = {BIG_N} your Function needs far more than O(n) work")) from None
    fix = f"save p in forward; in backward compute {_VJP_FORMULA}, never J"
    _quadratic(cost.get("forward", {}) if isinstance(cost, dict) else {}, "your forward", tried, fix)
    backward = cost.get("backward", {}) if isinstance(cost, dict) else {}
    _quadratic(backward, "your backward", tried, fix)
    memory = f"O(n) at n = {BIG_N}" if backward.get("measured") else "memory not measured"
    return (f"forward stable on {len(_forward_cases())} cases, backward matches autograd on "
            f"{len(_backward_cases())} (grads of ±1000), gradcheck passes, {memory}")
