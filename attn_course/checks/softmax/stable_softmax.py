"""The stable_softmax check, judged against the kit's stable-softmax mistakes (``kit.SOFTMAX_MISTAKES``, which
softmax_temperature reuses on x / T and notebook 04's SoftmaxFunction along the last axis)."""

from __future__ import annotations

import torch

from .. import kit
from ..core import Learner, check, fail, fmt
from .body import case_dim, default, early_epsilon, explain_weights, judge_cases, overflows_near_1000, score_cases


def masked_weights_zero(out: torch.Tensor, case: tuple, tried: str) -> None:
    """The docstring's "weight 0 where x is -inf", exactly: e^-inf is 0 in every dtype, so a right answer gives 0
    there, while a clamp or a fill of the shifted scores leaves a weight too small for the tolerance to see."""
    o = out.detach()
    if (hit := torch.isneginf(case[0]) & (o != 0)).any():
        fail("weight on -inf scores", tried=tried, expected="weight exactly 0 wherever the score is -inf (e^-inf = 0)",
             got=f"{int(hit.sum())} entries whose score is -inf get weight (up to {fmt(float(o[hit].abs().max()))})",
             cause="your code changes -inf scores into finite numbers before the exponential (a clamp, a fill or "
                   "nan_to_num), so each keeps a tiny weight",
             fix="leave -inf scores as they are: exp(-inf - max) is 0, which is the weight they need")


@check("stable_softmax", expects="a function stable_softmax(x, dim=-1) returning weights shaped like x")
def check_stable_softmax(fn: Learner) -> str:
    cases, overflows = score_cases(3), overflows_near_1000(kit.TensorOrArray(fn), -1)
    run = judge_cases(fn, cases, signature="stable_softmax(x, dim=-1)", what="your weights",
                      oracle=lambda x, dim=-1: torch.softmax(x.double(), dim), expected="weights shaped like x",
                      table=default("sm", "normalised", torch.softmax) + kit.SOFTMAX_MISTAKES,
                      explain=lambda o, case, passed, tried: explain_weights(o, case[0], case_dim(case), tried=tried),
                      shape_fix="the weights have the shape of x: keep the reduced axis with keepdim=True before "
                                "dividing", exact=masked_weights_zero,
                      early=lambda o, case, tried: early_epsilon(o, case[0], case_dim(case), tried=tried,
                                                                 overflows=overflows))
    return (f"matches torch.softmax on {len(cases)} cases ({run.kind}): any axis, 1-D to 4-D, float16/32/64, "
            "stable at ±1000, -inf entries")
