"""check_attention: the learner's (output, weights) on every case, judged by the tables of known mistakes; an
exception is explained by a construct that raises the very same message."""

from __future__ import annotations

import math
from typing import Callable

import torch

from .. import kit
from ..compare import Failure, same
from ..core import Learner, LearnerRaised, as_tensor, check, fail, learner_error
from ..kit import BOOL_HINT, Suspects, explain_raise, reproduce
from .cases import Case, attention_cases, oracle
from .mistakes import (MASK_FIX, MISTAKES_OF_OUTPUT, NO_DROPOUT, epsilon_in_the_sum, float64_digits,
                       mistakes_of_weights, rounded_scores, soft, structure)


# ============================================================================ exceptions
def _constructs(case: Case) -> list[tuple[str, str, Callable[[], object]]]:
    """Wrong constructs, run on ``case``: (cause, fix, attempt)."""
    Q, K, V, mask = case.args
    s, w = case.scaled, soft(case.scaled)
    rev = lambda t: t.permute(*reversed(range(t.dim())))  # noqa: E731 - what .T does
    last_two, lost = "transpose only the last two axes: K.transpose(-2, -1)", "without keepdim=True: shape (…, n_q)"
    front = ("K.transpose(1, 2) counts axes from the front: on input with fewer axes there is no axis 2",
             "count from the end: K.transpose(-2, -1)")
    out = [("on batched input, K.T reverses every axis (the batch axes too)", f"{last_two} (or K.mT)", a)
           for a in [lambda: torch.matmul(Q, rev(K))] + [
               lambda i=(0,) * i: Q[i] @ rev(K[i]) for i in range(min(Q.dim(), K.dim()) - 1)]]
    out += [(cause, f"use the @ operator (torch.matmul), which handles {many}leading batch axes",
             lambda op=op, a=a, b=b: op(a, b))
            for op, cause, many in ((torch.mm, "torch.mm multiplies 2-D matrices only", ""),
                                    (torch.bmm, "torch.bmm needs exactly 3-D tensors", "any number of "))
            for a, b in ((Q, K.mT), (w, V))]
    out += [("K.t() works on 2-D matrices only", last_two, lambda: K.t()),
            (*front, lambda: K.transpose(1, 2)), (*front, lambda: K.permute(0, 2, 1)),
            ("K.transpose(0, 1) swaps the first two axes, which on batched input are not the keys and features",
             last_two, lambda: Q @ K.transpose(0, 1)),
            ("you multiplied the weights by Vᵀ instead of V", "output = weights @ V: (…, n_q, n_k) @ (…, n_k, d_v)",
             lambda: w @ V.mT),
            (f"you subtracted scores.max(-1).values {lost} does not line up with the rows",
             "keep the axis: scores.amax(dim=-1, keepdim=True)", lambda: s - s.max(-1).values),
            (f"you divided by e.sum(-1) {lost} does not line up with the rows",
             "keep the axis: e.sum(dim=-1, keepdim=True)", lambda: w / w.sum(-1))]
    if mask is not None:
        last = ("you added an axis at the end of the mask (mask[..., None] or mask.unsqueeze(-1)): its keys line up "
                "with the scores' queries", "use the mask as it is: it already broadcasts to (…, n_q, n_k)")
        out += [(*last, lambda: s.masked_fill(~mask[..., None], -math.inf)),
                (*last, lambda: torch.where(mask[..., None], s, -math.inf)),
                ("indexing with a boolean mask (scores[~mask] = …) needs the scores' full shape: it does not broadcast",
                 f"use {MASK_FIX} or torch.where, which broadcast", lambda: s.clone().__setitem__(~mask, -math.inf))]
    return out


_PATTERNS = [("RuntimeError", "Boolean value of Tensor", BOOL_HINT["cause"], BOOL_HINT["fix"]),
             ("TypeError", r"bad operand type for unary ~: 'NoneType'", "you applied ~ to None: the name you negated "
              "holds None, not the mask", "negate the mask argument itself, inside `if mask is not None:`: ~mask")]
_NO_MASK_ARGUMENT = ("TypeError", "positional argument", "your function does not take the mask as its fourth argument",
                     "keep the signature attention(Q, K, V, mask=None)")


# ============================================================================ check_attention
def _call(fn: Learner, case: Case, tried: str) -> tuple[object, list[str]]:
    """The learner's result on ``case`` and the names of the arguments it changed in place."""
    args = case.args if case.mask is not None else case.args[:3]
    try:
        result = fn.observe(kit.CALL, *args)
    except LearnerRaised as exc:  # a construct is named only when it alone raises the very same message
        constructs = [c for c in _constructs(case) if reproduce(c[2]) == exc.message]
        hint = explain_raise(exc, constructs if len({c[0] for c in constructs}) == 1 else (),
                             _PATTERNS + ([_NO_MASK_ARGUMENT] if case.mask is not None else []))
        raise Failure(learner_error(exc, tried=tried, expected="(output, weights)", **hint)) from None
    value, changed = result if isinstance(result, tuple) and len(result) == 2 else (result, [])
    return value, [("Q", "K", "V", "mask")[int(i)] for i in changed if 0 <= int(i) < len(args)]


def _again(fn: Learner, which: int) -> Callable[..., torch.Tensor]:
    """The learner's function as the engine calls it on another case: the output (0) or the weights (1)."""
    return lambda *args: as_tensor(fn(*(args if args[3] is not None else args[:3]))[which], tried="", what="")


@check("attention", expects="a function attention(Q, K, V, mask=None) returning (output, weights)")
def check_attention(fn: Learner) -> str:
    cases = attention_cases()
    weights = Suspects(mistakes_of_weights(cases), atol=2e-5, rtol=1e-5)
    outputs = Suspects(MISTAKES_OF_OUTPUT, atol=2e-5, rtol=1e-5)
    every, passed_dks, judged = [c.args for c in cases], set(), []
    for case in cases:
        tried = f"attention(Q, K, V{', mask' if case.mask is not None else ''}) on {case.name}"
        result, changed = _call(fn, case, tried)
        out, w = kit.unpack(result, ("output", "weights"), tried=tried)
        exp_out, exp_w = oracle(case)
        if out.shape == exp_w.shape and w.shape == exp_out.shape and exp_w.shape != exp_out.shape:
            fail("output and weights swapped", tried=tried, got="(weights, output)", expected="(output, weights)",
                 fix="return output first, then weights")
        _squeezed(w, exp_w.shape, tried, "the weights")
        _mask_axis_added(w, case, tried)
        try:
            weights.expect(w, exp_w, case.args, tried=tried, again=_again(fn, 1), distinguish=every,
                           what="the weights", atol=case.atol,
                           fix="the weights have one row per query, one column per key: (..., n_q, n_k)")
        except Failure as failure:
            if not failure.diagnosis.cause:
                _random(fn, case, tried, w)
                epsilon_in_the_sum(w, case, tried)
                rounded_scores(w, case, tried)
                kit.lower_precision(w, case.Q.dtype, tried=tried, what="the weights")
                structure(w, case, tried, passed_dks)
            raise
        _squeezed(out, exp_out.shape, tried, "the output")
        d_k = case.Q.shape[-1]
        try:
            outputs.expect(out, exp_out, case.args, tried=tried, again=_again(fn, 0), distinguish=every,
                           what="the output", atol=case.atol, factors={"√d_k": math.sqrt(d_k), "d_k": float(d_k)},
                           fix="the output is weights @ V: (..., n_q, d_v)")
        except Failure as failure:
            if not failure.diagnosis.cause:
                kit.lower_precision(out, case.Q.dtype, tried=tried, what="the output")
            raise
        judged.append((w, out, case, tried))
        if changed:
            names = " and ".join(changed)
            fail(f"changed {names} in place", tried=tried, got=f"right results, but the call changed {names}",
                 expected="the arguments left as they were", cause=f"an in-place operation on {names} (/=, *=, +=, "
                 "a method ending in _ such as masked_fill_, an assignment into it) changes the caller's tensor too",
                 fix="compute new tensors: scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k); ~mask, not "
                     "mask.logical_not_()")
        passed_dks.add(d_k)
    for w, out, case, tried in judged:  # right within the tolerance everywhere: now the digits (and exact zeros)
        float64_digits(w, out, case, tried)
    shapes = {tuple(c.mask.shape) for c in cases if c.mask is not None}
    return (f"matches F.scaled_dot_product_attention on {len(cases)} cases (batched, n_q ≠ n_k, d_k ≠ d_v, "
            f"masks of {len(shapes)} shapes, large scores)")


# ============================================================================ shapes and randomness
def _squeezed(t: torch.Tensor, shape: torch.Size, tried: str, what: str) -> None:
    """Fail, naming squeeze, when ``t`` is the expected shape with its size-1 axes dropped."""
    shape = tuple(shape)
    if tuple(t.shape) != shape and 1 in shape and tuple(t.shape) == tuple(s for s in shape if s != 1):
        fail(f"size-1 axes dropped from {what}", tried=tried, got=f"{what} of shape {tuple(t.shape)}",
             expected=f"shape {shape}", cause="you squeezed the tensor (.squeeze() drops every axis of size 1, "
             "here the batch, heads or queries axis)", fix="leave out .squeeze(); keep every axis the inputs have")


def _mask_axis_added(w: torch.Tensor, case: Case, tried: str) -> None:
    """Fail, naming it, when the weights have the shape the scores broadcast to with an axis added to the mask."""
    want = tuple(case.scaled.shape)
    for i in range(case.mask.dim() + 1) if case.mask is not None and tuple(w.shape) != want else ():
        try:
            shape = tuple(torch.broadcast_shapes(want, case.mask.unsqueeze(i).shape))
        except RuntimeError:
            continue
        if shape == tuple(w.shape):
            fail(f"weights of shape {shape}: the mask got an extra axis", tried=tried, got=f"the weights of shape "
                 f"{shape}", expected=f"shape {want}", cause=f"you added an axis to the mask {tuple(case.mask.shape)} "
                 f"(mask.unsqueeze({i}) or a None index): broadcast against the scores {want}, it made them bigger",
                 fix="use the mask as it is: any mask that broadcasts to (…, n_q, n_k) works unchanged")


def _random(fn: Learner, case: Case, tried: str, first: torch.Tensor) -> None:
    """Fail when one of three more calls gives other weights (dropout with a small p may keep all once)."""
    for _ in range(3):
        w = kit.unpack(_call(fn, case, tried)[0], ("output", "weights"), tried=tried)[1]
        if tuple(w.shape) == tuple(first.shape) and not same(w, first, atol=0.0, rtol=0.0):
            fail("different results for the same input", tried=tried + ", more than once", got="calls with the same "
                 "Q, K, V and mask gave different weights", expected="the same weights every time (attention is "
                 "deterministic)", cause="dropout in training mode (F.dropout's default training=True, or an "
                 "nn.Dropout module) zeroes random weights and scales the rest up", fix=NO_DROPOUT)
