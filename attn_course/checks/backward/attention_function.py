"""Exercise 2 of notebook 10, AttentionFunction: a torch.autograd.Function whose forward and hand-written
backward are judged, then two calls in one graph, the backward watched, and gradcheck."""

from __future__ import annotations

import math

import torch

from ..compare import as_tensor, describe_mismatch, expect_shape, fail, same
from ..core import Learner, LearnerRaised, check
from ..kit import Known, Suspects, call_explained
from .judge import (MATMUL, NAMES, ORACLE, blame, fail_raised, fit_scale, judge, make_case, named, oracle, rand,
                    scale_name, tolerance)
from .mistakes import MASKED, NAIVE, TEXT, naive, scales, table, weights
from .probes import WATCHED

_BACKWARD_COUNT = ("the backward returns one gradient per input of forward, in order: for forward(ctx, q, k, v, mask) "
                   "that is four, the last one None because a bool mask has no gradient")
_FORWARD_FIX = "forward returns softmax(q kᵀ/√d_k) v with the course's masked_softmax: shape (..., n_q, d_v)"
_APPLY_RAISES = [
    ("RuntimeError", "incorrect number of gradients", _BACKWARD_COUNT, "return dq, dk, dv, None"),
    ("RuntimeError", "invalid gradient at index", "a gradient from your backward does not have its input's shape: "
     "backward returns them in the order forward takes its inputs, (q, k, v, mask)", "return dq, dk, dv, None"),
    ("RuntimeError", r"Mismatch in shape: grad_output\[0\]", "the output of your forward does not have the attention "
     "output's shape (..., n_q, d_v)", _FORWARD_FIX),
    *[(kind, "save_for_backward can only save", "ctx.save_for_backward takes tensors (or None) only",
       "keep other values as attributes of ctx (ctx.scale = scale) and save only tensors")
      for kind in ("TypeError", "RuntimeError")],
    MATMUL]
#: Mistakes of the forward: rows of :data:`TEXT`, with the causes that differ there.
_FORWARD_CAUSE = {"unscaled_all": "your forward computes softmax(q kᵀ) v without the 1/√d_k",
                  "by_d_all": "you divided the scores by d_k", "scale_inverted": "you multiplied the scores by √d_k",
                  "no_softmax": "your forward multiplies the scaled scores themselves by v"}


def _forward(q, k, v, mask, bug="", scale=None):
    """The forward, softmax(q kᵀ/√d_k) v in float64, with one bug (or another scale)."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    return weights(q @ k.mT * (scales(bug, q.shape[-1], v.shape[-1])[0] if scale is None else scale), mask, bug) @ v


def _expect_output(out: torch.Tensor, case: dict, tried: str) -> None:
    """The forward's output: right, a known mistake, another scale, or what the difference measures."""
    q, k, v, mask = case["q"], case["k"], case["v"], case["mask"]
    expected = oracle(q, k, v, case["dout"], mask)[0]
    expect_shape(out, expected.shape, tried=tried, what="the output of forward", fix=_FORWARD_FIX)
    tol = tolerance((expected,), torch.float64)
    if same(out, expected, **tol):
        return
    keys = ("unscaled_all", "by_d_all", "scale_inverted", "scale_dv", "softmax_axis", "no_softmax") + (
        () if mask is None else ("mask_ignored", "mask_inverted", "nan_rows", "weak_fill", "mask_after_softmax",
                                 "mask_added"))
    table = [Known(key, "forward: " + TEXT[key][0].replace(" in the backward", ""),
                   _FORWARD_CAUSE.get(key, TEXT[key][1]), TEXT[key][2],
                   lambda q, k, v, mask, key=key: _forward(q, k, v, mask, key)) for key in keys]
    found = Suspects(table, **tol).suspects(out, (q, k, v, mask))
    got_text, exp_text, cause, summary = describe_mismatch(out, expected, what="the output of forward",
                                                           factors={"√d_k": math.sqrt(q.shape[-1])}, **tol)
    if exp_text != named(exp_text, "output"):  # the generic "expected": say what it is
        exp_text = f"softmax(q kᵀ/√d_k) v, as {ORACLE} computes it (in float64)"
    if found:
        blame([found], tried, f"the output of forward: {got_text}", exp_text)
    c = fit_scale(lambda x: float((_forward(q, k, v, mask, scale=x) - out).norm()), q, k, v) \
        if bool(torch.isfinite(out).all()) else 0
    if c and same(out, _forward(q, k, v, mask, scale=c), **tol):
        summary, cause = f"scores scaled by {scale_name(c, q, k, v)}", "the scale is wrong: the scores are q kᵀ/√d_k"
        exp_text = f"1/√d_k = {1 / math.sqrt(q.shape[-1]):.4g} (d_k = {q.shape[-1]}, the last axis of q) on the scores"
    fail(f"forward: {summary}", tried=tried, got=f"the output of forward: {got_text}", expected=exp_text, cause=cause,
         fix=_FORWARD_FIX)


@check("AttentionFunction", kind="class",
       expects="a torch.autograd.Function subclass AttentionFunction: forward(ctx, q, k, v, mask=None), backward")
def check_AttentionFunction(fn: Learner) -> str:
    info = fn.inspect()
    if not info.get("autograd_function"):
        fail("not a torch.autograd.Function", tried="checking the class AttentionFunction",
             got=f"a class deriving from {', '.join(info.get('bases', [])[:2]) or 'object'}",
             expected="class AttentionFunction(torch.autograd.Function)",
             fix="derive the class from torch.autograd.Function and give it static methods forward and backward")
    g = torch.Generator().manual_seed(11)
    cases = [make_case(g, "batch × heads (2, 2), n_q = 4, n_k = 5, d_k = 3, d_v = 2, no mask", (2, 2), 4, 5, 3, 2),
             make_case(g, "one head, n_q = n_k = 5, d_k = 5, d_v = 6, a causal mask", (), 5, 5, 5, 6,
                       torch.ones(5, 5, dtype=torch.bool).tril()),
             make_case(g, "batch 2, n_q = 3, n_k = 4, d_k = 2, d_v = 3, a mask with row 1 fully masked", (2,), 3, 4,
                       2, 3, torch.tensor([[True, False, True, True], [False] * 4, [False, True, True, False]]))]
    apply, suspects = fn.method("apply"), Suspects(table(NAIVE + MASKED, naive), atol=1e-6, rtol=1e-4)
    for case in cases:
        q, k, v, dout, mask = case["q"], case["k"], case["v"], case["dout"], case["mask"]
        tried = f"AttentionFunction.apply(q, k, v{'' if mask is None else ', mask'}) and backward, on {case['name']}"
        try:
            out, grads = apply.vjp((q, k, v) if mask is None else (q, k, v, mask), dout, wrt=(0, 1, 2))
        except LearnerRaised as exc:
            hint = dict(cause="forward does not take the mask: apply passes its arguments to forward(ctx, …) in order",
                        fix="def forward(ctx, q, k, v, mask=None)") if (
                exc.type_name == "TypeError" and "positional argument" in exc.message and exc.phase == "call") else {}
            fail_raised(exc, tried, "the attention output, then its gradients", _APPLY_RAISES, **hint)
        raw, out = out, as_tensor(out, tried=tried, what="forward",
                                  expected="the attention output, one tensor (..., n_q, d_v)")
        _expect_output(out, case, tried)
        if grads is None:  # apply connects every tensor forward returns to the graph: this output is not a tensor
            kind = "a NumPy array" if type(raw).__module__ == "numpy" else f"a {type(raw).__name__}"
            fail("no gradient reaches the inputs", tried=tried, expected="gradients from your backward",
                 got="the output does not depend on q, k, v through autograd",
                 cause="" if isinstance(raw, torch.Tensor) else f"forward returned {kind}: autograd calls your "
                       "backward only for the torch tensors forward returns",
                 fix="compute forward's output with torch operations and return that tensor")
        if missing := ", ".join(name for name, gr in zip(NAMES, grads) if gr is None):
            fail(f"backward returned None for {missing}", tried=tried, got=f"no gradient for {missing}",
                 expected="(dq, dk, dv, None)", cause=_BACKWARD_COUNT, fix="return dq, dk, dv, None")
        got = tuple(as_tensor(gr, tried=tried, what=f"the backward's {name}") for name, gr in zip(NAMES, grads))
        judge(suspects, got, oracle(q, k, v, dout, mask)[1], (q, k, v, dout, mask), tried=tried, dtype=torch.float64,
              grads=naive, nan_cause="a fully masked row went through a softmax over -inf everywhere (0/0)"
              if mask is not None else "", nan_fix="compute P with the course's masked_softmax(scores, mask)")
    case = cases[1]  # the backward by hand: watched while it runs (called directly, with the ctx forward filled)
    report = fn.observe("backward.function_watch", case["q"], case["k"], case["v"], case["mask"], case["dout"])
    if used := [c for c in report.get("calls", []) if c in ("grad", "backward", "vjp", "jacobian")]:
        fail("backward uses autograd", tried=f"AttentionFunction.backward on {case['name']}, watching the functions it "
             "calls", got=f"your backward calls {', '.join(WATCHED[c] for c in used)}",
             expected="a backward written from the formulas (ref.attention_backward, or your own)",
             cause="autograd differentiated the forward again; the exercise asks for the backward by hand",
             fix="return (*ref.attention_backward(q, k, v, dout, mask), None)")
    g = torch.Generator().manual_seed(15)  # two calls in one graph (two attention layers): each its own tensors
    first, second = ([rand(g, 2, 4, 3), rand(g, 2, 6, 3), rand(g, 2, 6, 2)] for _ in range(2))
    upstream = [rand(g, 2, 4, 2), rand(g, 2, 4, 2)]
    tried = ("o1 = AttentionFunction.apply(q1, k1, v1); o2 = AttentionFunction.apply(q2, k2, v2); then one backward "
             "through both (two attention layers in one model)")
    grads = call_explained(fn.observe, "backward.function_twice", first, second, upstream, tried=tried,
                           expected="the gradients of both calls", patterns=_APPLY_RAISES)
    expected = [*oracle(*first, upstream[0])[1], *oracle(*second, upstream[1])[1]]
    tol = tolerance(tuple(expected), torch.float64)
    if bad := [i for i, (x, e) in enumerate(zip(grads, expected))
               if x is None or not same(as_tensor(x, tried=tried, what="a gradient"), e, **tol)]:
        fail("two calls share their state", tried=tried,
             got=f"wrong gradients for call {', '.join(sorted({str(i // 3 + 1) for i in bad}))} (right when each call "
                 "is alone)", expected="each call's gradients computed from that call's own q, k, v",
             cause="forward keeps what backward needs where all calls share it (a class attribute, a global), so "
                   "the second call overwrites the first call's tensors",
             fix="keep per-call state on ctx only: ctx.save_for_backward(q, k, v, mask), ctx.anything = …")
    g = torch.Generator().manual_seed(12)  # gradcheck, next to the learner's class: its backward vs its own forward
    q, k, v = rand(g, 2, 3, 4), rand(g, 2, 5, 4), rand(g, 2, 5, 2)
    mask = torch.tensor([[True, True, False, True, False], [False, True, True, False, True], [True] * 5])
    report = fn.observe("backward.gradcheck", q, k, v, mask, timeout=60)
    if not isinstance(report, dict) or not report.get("passed"):
        message = str(report.get("error", "")) if isinstance(report, dict) else repr(report)
        # right gradients once, then other ones (or autograd's in-place error) from a second backward
        reentrant = "not reentrant" in message or "modified by an inplace operation" in message
        fail("gradcheck fails", tried="torch.autograd.gradcheck(AttentionFunction.apply, (q, k, v, mask)) in float64, "
             "shapes (2, 3, 4), (2, 5, 4), (2, 5, 2)", got=message[:400] or "gradcheck returned False",
             expected="gradcheck passes: your backward agrees with finite differences of your forward",
             cause="a second backward through the same graph fails or gives other gradients: your backward changes "
                   "a tensor forward kept (an in-place operation such as p.mul_ on what is on ctx)" if reentrant else "",
             fix="compute new tensors in backward (ds = p * (…)), never change the saved ones in place" if reentrant
             else "compare your backward's formulas with the exercise's, line by line")
    return (f"forward and backward match autograd through F.scaled_dot_product_attention on {len(cases)} cases "
            f"(masks, a fully masked row) and with two calls in one graph; the backward is by hand; gradcheck passes")
