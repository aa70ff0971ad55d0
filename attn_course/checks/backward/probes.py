"""The learner-side probes of notebook 10's checks (they run in the learner's process; only plain numbers
come back), and the failures on what they watch: autograd, fused attention, an input written into."""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..boundary import probe
from ..compare import fail
from ..core import Learner, LearnerRaised
from ..kit import Watch, watch

#: Functions whose use a check reports: autograd (the exercise is the chain rule by hand) and fused attention.
WATCHED = {"grad": "torch.autograd.grad", "backward": ".backward()", "vjp": "a vector–Jacobian product from "
           "torch.func / torch.autograd.functional", "jacobian": "torch.autograd.functional.jacobian",
           "scaled_dot_product_attention": "F.scaled_dot_product_attention"}


@probe("backward.watch")
def _watch_probe(obj: Callable[..., Any], *args: Any, **kwargs: Any) -> dict:
    """``obj(*args, **kwargs)`` once under :class:`~..kit.Watch`: what it created and computed, the watched functions
    it called (``calls``) and the tensor arguments it wrote into (``changed``); its result is dropped."""
    before = [(i, a.clone()) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    report = watch(obj, *args, **kwargs)
    return {"changed": [i for i, copy in before if not torch.equal(args[i], copy)], "flops": int(report["flops"]),
            "calls": sorted(set(report["calls"]) & set(WATCHED)),
            **{key: report[key] for key in ("largest", "shape", "exp_elements", "elements", "exp_tile", "zero_tiles")}}


@probe("backward.function_watch")
def _function_watch_probe(cls: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any,
                          dout: torch.Tensor) -> dict:
    """``cls.apply`` once, then ``cls.backward`` called directly on the node it made (the ``ctx`` its forward
    filled), watched, gradients off as autograd would: the watched functions it calls."""
    out = cls.apply(*[t.detach().clone().requires_grad_(True) for t in (q, k, v)], *(() if mask is None else (mask,)))
    if getattr(out, "grad_fn", None) is None:
        return {"calls": []}
    with torch.no_grad(), Watch() as seen:
        cls.backward(out.grad_fn, dout)
    return {"calls": sorted(set(seen.calls) & set(WATCHED))}


@probe("backward.function_twice")
def _function_twice_probe(cls: Any, first: list, second: list, upstream: list) -> list:
    """Two calls of ``cls.apply`` in one graph, one backward through both: the six gradients (q1 … v2)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (*first, *second)]
    outs = (cls.apply(*leaves[:3]), cls.apply(*leaves[3:]))
    return list(torch.autograd.grad(outs, leaves, upstream, allow_unused=True))


@probe("backward.gradcheck")
def _gradcheck_probe(cls: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> dict:
    """torch.autograd.gradcheck of ``cls.apply`` in float64 (run where the class lives); plain data back."""
    inputs = tuple(t.detach().clone().requires_grad_(True) for t in (q, k, v)) + (mask,)
    try:
        return {"passed": bool(torch.autograd.gradcheck(cls.apply, inputs, eps=1e-6, atol=1e-5))}
    except Exception as exc:  # noqa: BLE001 - gradcheck's own report of what differs
        return {"passed": False, "error": f"{type(exc).__name__}: {exc}".strip()}


def forbid(report: dict, tried: str, *, what: str, inputs: tuple[str, ...]) -> None:
    """Fail when the watch saw autograd or a fused attention, or an input written into."""
    if used := [c for c in report.get("calls", []) if c in WATCHED]:
        fail("called a fused attention" if "scaled_dot_product_attention" in used else
             "used autograd instead of the chain rule", tried=tried,
             got=f"your {what} calls {', '.join(WATCHED[c] for c in used)}",
             expected=f"{what} written from the formulas, with matrix products and element-wise operations",
             cause="the values may be right, but autograd (or PyTorch's own attention) did the work the exercise asks "
                   "you to do", fix="compute dV, dP, dS, dQ and dK yourself, as the exercise's formulas say")
    if changed := [inputs[i] for i in report.get("changed", []) if i < len(inputs)]:
        fail(f"overwrote its input {changed[0]}", tried=tried,
             got=f"after the call, {', '.join(changed)} held different numbers than before",
             expected="the inputs left as they were: the caller still needs them",
             cause="an in-place write into an input: += or [...] = on it, or a result that is the input itself "
                   "(dk = k instead of dk = torch.zeros_like(k))",
             fix="allocate every result and accumulator as a new tensor (torch.zeros_like, torch.empty_like)")


def watch_and_forbid(fn: Learner, tried: str, *args: Any, what: str, inputs: tuple[str, ...], **kwargs: Any) -> None:
    """:func:`forbid` on the watch probe's report of ``fn(*args, **kwargs)``; a call that raises is left to the
    cases, where its error gets the full diagnosis."""
    try:
        forbid(fn.observe("backward.watch", *args, **kwargs), tried, what=what, inputs=inputs)
    except LearnerRaised:
        pass
