"""O(n) memory and work, measured where the learner's code runs: the probes the softmax_vjp and SoftmaxFunction
checks call at n = BIG_N, and the judge of what they saw."""

from __future__ import annotations

import tracemalloc
from typing import Any, Callable

import torch

from .. import kit
from ..boundary import probe
from ..compare import Failure
from ..core import Learner, LearnerRaised, LearnerTimedOut, fail, learner_error

#: The size at which O(n) is checked: n² = 4,194,304 numbers, 16 MiB in float32.
BIG_N = 2048
#: At least this many numbers in one tensor, or created in all, mean O(n²): n²/8.
QUADRATIC = BIG_N * BIG_N // 8


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


@probe("softmax_backward_in_place")
def backward_in_place(cls: type, z: torch.Tensor, g: torch.Tensor) -> bool:
    """Learner side: whether autograd, running the backward of ``cls.apply(z)`` for upstream ``g``, leaves ``g``
    changed (compared with a copy taken before; autograd hands ``g`` itself to the backward)."""
    z, given = z.detach().requires_grad_(True), g.clone()
    with torch.enable_grad():
        y = cls.apply(z)
    if not isinstance(y, torch.Tensor) or not y.requires_grad:
        return False
    torch.autograd.grad(y, z, given, allow_unused=True)
    return not torch.equal(given, g)


def observe(fn: Learner, tried: str, expected: str, what: str, name: str, *args: Any) -> dict:
    try:
        cost = fn.observe(name, *args)
    except (LearnerRaised, LearnerTimedOut) as exc:
        raise Failure(learner_error(exc, tried=tried, expected=expected, cause="" if isinstance(exc, LearnerRaised)
                                    else f"at n = {BIG_N} {what} needs far more than O(n) work")) from None
    return cost if isinstance(cost, dict) else {}


def quadratic(cost: dict, what: str, tried: str, fix: str) -> None:
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
