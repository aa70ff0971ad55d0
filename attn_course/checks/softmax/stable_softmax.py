"""The stable_softmax check, judged against the kit's stable-softmax mistakes (``kit.SOFTMAX_MISTAKES``, which
softmax_temperature reuses on x / T and notebook 04's SoftmaxFunction along the last axis)."""

from __future__ import annotations

import torch

from .. import kit
from ..core import Learner, check
from .body import case_dim, default, explain_weights, judge_cases, score_cases


@check("stable_softmax", expects="a function stable_softmax(x, dim=-1) returning weights shaped like x")
def check_stable_softmax(fn: Learner) -> str:
    cases = score_cases(3)
    run = judge_cases(fn, cases, signature="stable_softmax(x, dim=-1)", what="your weights",
                      oracle=lambda x, dim=-1: torch.softmax(x.double(), dim), expected="weights shaped like x",
                      table=default("sm", "normalised", torch.softmax) + kit.SOFTMAX_MISTAKES,
                      explain=lambda o, case, passed, tried: explain_weights(o, case[0], case_dim(case), tried=tried),
                      shape_fix="the weights have the shape of x: keep the reduced axis with keepdim=True before "
                                "dividing")
    return (f"matches torch.softmax on {len(cases)} cases ({run.kind}): any axis, 1-D to 4-D, float16/32/64, "
            "stable at ±1000, -inf entries")
