"""Exercise 1 of notebook 10, attention_backward: the chain rule on the whole score matrix, judged on cases
with masks, fully masked rows, batch × heads, float32 and saturated scores."""

from __future__ import annotations

from typing import Any

import torch

from ..core import Learner, LearnerRaised, check
from ..kit import Suspects, explain_raise
from .judge import DTYPE, MATMUL, expect_fresh, fail_raised, judge, make_case, oracle, unpack_grads
from .mistakes import MASKED, NAIVE, naive, table
from .probes import watch_and_forbid


def _backward_cases() -> list[dict]:
    g = torch.Generator().manual_seed(10)
    cases = [make_case(g, "one head, n_q = n_k = 5, d_k = 7, d_v = 3, no mask", (), 5, 5, 7, 3, q_scale=1.5),
             make_case(g, "batch × heads (2, 3), n_q = 4, n_k = 6, d_k = 8, d_v = 5, no mask", (2, 3), 4, 6, 8, 5)]
    keep = torch.rand(5, 7, generator=g) < 0.6
    keep[:, 0], keep[1, 2] = True, False
    keep[3] = False  # query 3 sees nothing: zero weights, zero output, zero gradients
    pad = (torch.arange(6) < torch.tensor([5, 0, 3])[:, None])[:, None, None, :]  # (3, 1, 1, 6): batch 1 all padding
    return cases + [
        make_case(g, "batch 2, n_q = 5, n_k = 7, d_k = 6, d_v = 6, a (5, 7) mask with row 3 fully masked", (2,), 5, 7,
                  6, 6, keep),
        make_case(g, "key padding (3, 1, 1, 6) over 2 heads, n_q = 4, n_k = 6, d_k = 5, d_v = 2; batch entry 1 fully "
                  "padded", (3, 2), 4, 6, 5, 2, pad),
        make_case(g, "a causal (6, 6) mask, one head, d_k = 3, d_v = 7", (), 6, 6, 3, 7,
                  torch.ones(6, 6, dtype=torch.bool).tril()),
        make_case(g, "float32, batch 2, n_q = 9, n_k = 8, d_k = 12, d_v = 4", (2,), 9, 8, 12, 4, dtype=torch.float32),
        make_case(g, "axes of size 1: batch 1, one query, one key, d_k = 1, d_v = 1", (1,), 1, 1, 1, 1),
        make_case(g, "one query, n_q = 1, n_k = 5, d_k = 2, d_v = 3, with a (1, 5) mask", (), 1, 5, 2, 3,
                  torch.tensor([[True, False, True, True, False]])),
        make_case(g, "extreme values: scores up to ±10³ (saturated softmax), upstream gradient ×10⁴", (2,), 5, 6, 5,
                  3, q_scale=400.0, dout_scale=1e4, extreme=True),
        # the first case's shapes with other values, last: a result kept from an earlier call shows
        make_case(g, "one head, n_q = n_k = 5, d_k = 7, d_v = 3, no mask, other values", (), 5, 5, 7, 3)]


def _backward_raised(exc: LearnerRaised, q: torch.Tensor, mask: Any) -> dict:
    """What an exception from the learner's chain rule says about its cause, when the evidence is clear."""
    if mask is not None and exc.type_name == "TypeError" and "positional argument" in exc.message:
        return dict(cause="your function does not take the mask as its fifth argument",
                    fix="keep the signature attention_backward(q, k, v, dout, mask=None)")
    if mask is None and "NoneType" in exc.message:
        return dict(cause="with mask=None (no mask) your code still uses the mask",
                    fix="apply the mask only when there is one (`if mask is not None:`), or let masked_softmax "
                        "handle None")
    if "3D tensor" in exc.message or (q.dim() < 3 and "Dimension out of range" in exc.message):
        return dict(cause=f"your code assumes exactly one batch axis (torch.bmm, or transpose(1, 2)); here q has shape "
                          f"{tuple(q.shape)}, and the docstring allows any number of leading axes, none included",
                    fix="write it for any leading axes: @ (torch.matmul) and .mT or .transpose(-2, -1)")
    return explain_raise(exc, (), [MATMUL, DTYPE])


@check("attention_backward", expects="a function attention_backward(q, k, v, dout, mask=None) returning (dq, dk, dv)")
def check_attention_backward(fn: Learner) -> str:
    cases, inputs = _backward_cases(), ("q", "k", "v", "dout")
    case = cases[1]  # first, what the code does besides its result: autograd, or writes into an input
    watch_and_forbid(fn, f"attention_backward(q, k, v, dout) on {case['name']}, watching the functions it calls",
                     *(case[x] for x in inputs), what="attention_backward", inputs=inputs)
    suspects, earlier = Suspects(table(NAIVE + MASKED, naive), atol=1e-6, rtol=1e-4), []
    for case in cases:
        q, k, v, dout, mask = case["q"], case["k"], case["v"], case["dout"], case["mask"]
        tried = f"attention_backward(q, k, v, dout{', mask' if mask is not None else ''}) on {case['name']}"
        try:
            got = unpack_grads(fn(q, k, v, dout, *(() if mask is None else (mask,))), tried)
        except LearnerRaised as exc:
            fail_raised(exc, tried, "(dq, dk, dv)", **_backward_raised(exc, q, mask))
        nan_cause = ("exp overflowed on scores this large: a softmax written by hand must subtract each row's maximum"
                     if case["extreme"] else "a fully masked row went through a softmax over -inf everywhere (0/0)"
                     if mask is not None and bool((~mask).all(-1).any()) else "")
        expected = oracle(q, k, v, dout, mask)[1]
        expect_fresh(got, expected, earlier, tried)
        earlier.append((case["name"], got, expected))
        judge(suspects, got, expected, (q, k, v, dout, mask), tried=tried, dtype=case["dtype"], grads=naive,
              nan_cause=nan_cause, nan_fix="compute P with the course's masked_softmax(scores, mask), which is stable "
              "and gives a fully masked row zero weights")
    return (f"matches autograd through F.scaled_dot_product_attention on {len(cases)} cases (masks, fully masked rows, "
            "batch × heads, d_k ≠ d_v, size-1 axes, float32, saturated scores)")
