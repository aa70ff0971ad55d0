"""The SoftmaxFunction check: forward judged as a stable softmax (notebook 03's mistakes), backward as the VJP (what
forward saved, then the VJP's mistakes), gradcheck through the learner's own code, and O(n) for both passes."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from .. import kit
from ..compare import Failure
from ..core import Learner, LearnerRaised, LearnerTimedOut, as_tensor, check, fail, learner_error
from .cases import backward_cases, describe, forward_cases, judge_cases, oracle_vjp, raised_hint, unchanged_cases
from .jacobian import VJP, VJP_CODE, K, dot, explain_vjp, grad_atol
from .probes import BIG_N, observe, quadratic


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


#: Known wrong forwards: notebook 03's stable-softmax mistakes that a forward along the last axis can make.
FORWARD = kit.along_last_axis(kit.SOFTMAX_MISTAKES, "naive", "whole-max", "min", "max-added", "mean-sum", "whole-sum",
                              "unnormalised", "times-sum", "exp-missing", "log-for-exp", "sign",
                              *(f"{row}-{o}" for o in range(3) for row in ("axis", "max-axis", "sum-axis")))

_SAVE_FIX = ("save the output of forward: ctx.save_for_backward(p) with p = e / e.sum(-1, keepdim=True) (or save z and "
             "recompute p from it, stably)")
#: Backwards that use another tensor than p = softmax(z) as p (what forward saved was not its output), then the VJP's.
BACKWARD = [K(key, summary, cause, _SAVE_FIX,
              lambda z, g, t=t: t(z.double()) * (g.double() - dot(t(z.double()), g.double())))
            for key, summary, cause, t in (
    ("saved-z", "z used as p in backward", "your backward uses z, the scores, where the formula needs p = softmax(z): "
     "forward saved its input, not its output", lambda z: z),
    ("saved-e", "unnormalised e used as p in backward", "your backward uses e = exp(z − max) before it is divided by its "
     "sum: forward saved e, not p = e / Σ e", lambda z: kit.exp_shifted(z, -1)),
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
             "like z", fix=f"end backward with return {VJP_CODE}")
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


def _expect_grad_unchanged(fn: Learner, case: tuple) -> None:
    """Fail when the backward overwrites the upstream gradient autograd hands it, on ``case`` and on the same values in
    the other float dtype (where grad.to(torch.float64) or grad.float() returns grad itself). Raising here says
    nothing: the cases already ran this code."""
    z, g = case
    other = {torch.float32: torch.float64, torch.float64: torch.float32}[z.dtype]
    for given, where in (((z, g), describe(z, "z")), ((z.to(other), g.to(other)), "the same values in "
                                                      f"{str(other).replace('torch.', '')}")):
        try:
            changed = fn.observe("softmax_backward_in_place", *given)
        except (LearnerRaised, LearnerTimedOut):
            continue
        if changed is True:
            fail("grad changed in place by backward", tried=f"SoftmaxFunction.apply(z), then backward through "
                 f"autograd, on {where} and an upstream grad of the same shape, comparing grad with a copy taken "
                 "before",
                 got="after backward, grad no longer holds the values autograd gave it",
                 expected="grad left unchanged: backward only reads it and returns a new tensor",
                 cause="an in-place operation on grad (grad -= …, grad *= …, grad.sub_(…), grad.mul_(…)) overwrites "
                       "the gradient autograd hands your backward; autograd may give that same tensor to other "
                       "branches of the graph (y = a + b hands one gradient to both), so their gradients come out "
                       "wrong",
                 fix=f"compute a new tensor: return {VJP_CODE} (or start from grad = grad.clone())")


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
    forward = judge_cases(
        forward_cases(), lambda case, said: _forward(apply, case, said), oracle=forward_oracle, table=FORWARD,
        tried=lambda c: f"SoftmaxFunction.apply(z) on {describe(c[0], 'z')}", reduced=True, again=apply,
        expected="p = softmax(z) along the last axis, shaped like z", what="forward's output", atol=lambda c: 1e-5,
        signature="forward(ctx, z)", explain=_explain_forward, shape_fix="forward returns p shaped like z")
    for case in unchanged_cases(forward_cases(), lambda z: not bool(torch.isfinite(z).all())):  # z[z == -inf] = …
        kit.expect_unchanged(fn, case, call="SoftmaxFunction.apply(z)", name="z", shown=describe(case[0], "z"),
                             apply=True)
    # 2. backward: the gradient autograd gets through torch.softmax, for any upstream gradient
    backward_oracle = lambda z, g: oracle_vjp(torch.softmax(z.double(), -1), g)  # noqa: E731
    backward = judge_cases(
        backward_cases(), lambda case, said: _backward(apply, case, said), oracle=backward_oracle, table=BACKWARD,
        tried=lambda c: f"SoftmaxFunction.apply(z), then backward, on {describe(c[0], 'z')} and upstream "
                        f"{describe(c[1], 'grad')}", expected="∂ℒ/∂z shaped like z", what="backward's gradient",
        atol=lambda c: 10 * grad_atol(c), hint=_saved_hint, signature="forward(ctx, z) and backward(ctx, grad)",
        explain=lambda o, case, said: explain_vjp(o, case, said, z=case[0], again=lambda z, g: _backward(
            apply, (z, g), said)),
        shape_fix="backward returns ∂ℒ/∂z shaped like z")
    _expect_grad_unchanged(fn, backward_cases()[0])
    # a backward computed in float32 passes the tolerance above and gradcheck's: its float64 cases show it
    forward_error, backward_error = _float64_error(forward, forward_oracle), _float64_error(backward, backward_oracle)
    if backward_error > 1e-10 and forward_error <= 1e-10:  # (a lossy forward: gradcheck blames it)
        fail("backward not in float64 precision", tried="SoftmaxFunction.apply(z), then backward, on the float64 "
             "cases above", got=f"your gradient is off by up to {backward_error:.1e} of the largest value (about "
             f"{-math.log10(backward_error):.0f} correct digits)",
             expected="float64's ~16 digits: the gradient in grad's dtype",
             cause="your backward computes in a narrower dtype (.float(), .to(torch.float32) or float32 constants), "
                   "and autograd converts the result back to float64 without a word",
             fix="compute in grad's dtype: leave out .float(), .to(torch.float32) or float32 constants")
    # 3. gradcheck: backward agrees with finite differences of the learner's own forward (float64)
    z = torch.randn(3, 4, generator=torch.Generator().manual_seed(11), dtype=torch.float64).requires_grad_(True)
    tried = "torch.autograd.gradcheck(SoftmaxFunction.apply, z) with z of shape (3, 4), float64"
    try:
        ok = torch.autograd.gradcheck(lambda v: _ThroughLearner.apply(v, apply), (z,), raise_exception=False)
    except LearnerRaised as exc:
        raise Failure(learner_error(exc, tried=tried, expected="∂ℒ/∂z shaped like z",
                                    **(_saved_hint(exc) or raised_hint(exc, (z.detach(),), [], signature="forward(ctx, z) "
                                                                      "and backward(ctx, grad)")))) from None
    if not ok:  # a forward that loses precision hands its backward a rounded p too: blame the forward first
        where, error = ("forward", forward_error) if forward_error > 1e-10 else ("backward", backward_error)
        lossy = error > 1e-10  # float64 rounding stays near 1e-16
        fail(f"gradcheck fails: {where} not in float64 precision" if lossy else "gradcheck fails", tried=tried,
             got="your backward disagrees with finite differences of your forward" + (
                 f"; on the float64 cases above, your {where} was off by up to {error:.1e} of the largest value"
                 if lossy else ""),
             expected="backward = the derivative of forward, both accurate to float64's ~16 digits",
             cause=f"your {where} loses precision (about {-math.log10(error):.0f} correct digits, as in float32 where "
                   "float64 keeps ~16): finite differences divide that error by gradcheck's step of 1e-6"
             if lossy else "",
             fix="compute in x's dtype: leave out .float(), .to(torch.float32) or float32 constants" if lossy
             else f"backward returns {VJP_CODE}")
    if forward_error > 1e-10:  # gradcheck passed: a forward off by far less than float32's rounding (an epsilon)
        fail("forward not in float64 precision", tried="SoftmaxFunction.apply(z) on the float64 cases above",
             got=f"your p is off by up to {forward_error:.1e} of the largest value (about "
                 f"{-math.log10(forward_error):.0f} correct digits)",
             expected="float64's ~16 digits: p = softmax(z) in z's dtype, as the docstring says",
             fix="compute in z's dtype (no .float(), no float32 constants) and divide by the sum itself, with no "
                 "epsilon added")
    # 4. O(n): measured in the learner's process, forward and backward apart
    gen = torch.Generator().manual_seed(12)
    tried = f"SoftmaxFunction.apply(z) and its backward on z of shape (1, {BIG_N}), float32, watching what they create"
    cost = observe(fn, tried, "softmax and its gradient in O(n)", "your Function", "softmax_function_cost",
                   torch.randn(1, BIG_N, generator=gen), torch.randn(1, BIG_N, generator=gen))
    fix = f"save p in forward; in backward compute {VJP_CODE}, never J"
    quadratic(cost.get("forward", {}), "your forward", tried, fix)
    quadratic(cost.get("backward", {}), "your backward", tried, fix)
    memory = f"O(n) at n = {BIG_N}" if cost.get("backward", {}).get("measured") else "memory not measured"
    return (f"forward stable on {len(forward)} cases, backward matches autograd on {len(backward)} (grads of ±1000), "
            f"gradcheck passes, {memory}")
