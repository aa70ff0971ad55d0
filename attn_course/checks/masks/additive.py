"""Check of the additive mask: 0 where kept, -inf where blocked, in the asked-for dtype."""

from __future__ import annotations

import math

import torch

from ..core import Learner, as_tensor, check, fail, fmt
from .answers import POLARITY, call, expect_inputs_unchanged


def _large_scores(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(2, 1, 3, 4) scores, kept ones near -2e4 and blocked ones up to +3e4, and the keep mask."""
    s = torch.tensor([[-20000.0, 30000.0, -20016.0, 0.0],
                      [30000.0, -20000.0, -5000.0, -20032.0],
                      [-20032.0, -20000.0, 30000.0, -5000.0]])
    keep = torch.tensor([[True, False, True, False], [False, True, False, True], [True, True, False, False]])
    return torch.stack([s, s.flip(-1)])[:, None].to(dtype), torch.stack([keep, keep.flip(-1)])[:, None]


@check("additive_mask", expects="a function additive_mask(mask, dtype=torch.float32) returning a float tensor")
def check_additive_mask(fn: Learner) -> str:
    keep, fill = _large_scores(torch.float32)[1], "masked_fill(~mask, float('-inf'))"
    cases = [*((keep, t) for t in (torch.float32, torch.float16, torch.float64, torch.bfloat16, None)),
             (torch.ones(4, 4, dtype=torch.bool).tril()[None, None], torch.float64),
             (torch.tensor([True, False, True, True, False]), torch.float32),
             (torch.zeros(2, 3, dtype=torch.bool), torch.float32),
             (torch.ones(1, 1, dtype=torch.bool), torch.float16)]
    for mask, dtype in cases:
        want, shape = dtype or torch.float32, tuple(mask.shape)
        name, zeros = str(want).replace("torch.", ""), "torch.zeros(mask.shape, dtype=dtype)"
        shown = f"additive_mask(mask {shape}" + (f", dtype=torch.{name})" if dtype else ") with the default dtype")
        got = call(fn, (mask,), shown, f"a {name} tensor of shape {shape}", {"dtype": dtype} if dtype else {})
        got = as_tensor(got, tried=shown, what="your function", expected=f"a {name} tensor")
        kind, right = str(got.dtype).replace("torch.", ""), torch.zeros(shape, dtype=want).masked_fill(~mask, -math.inf)
        if got.dtype == torch.bool:
            negated = got.shape == mask.shape and torch.equal(got, ~mask)
            fail("returned a bool mask, not the additive form", tried=shown, got=f"a bool tensor {tuple(got.shape)}",
                 expected=f"a {name} tensor: 0 where the mask is True, -inf where it is False",
                 cause=("you returned ~mask, the negated mask:" if negated else "you returned") + " True/False values, "
                 "not the numbers 0 and -inf added to the scores", fix=f"{zeros}.{fill}")
        if got.dtype != want:
            fail(f"dtype {kind}, not {name}", tried=shown, got=f"a {kind} tensor", expected=f"dtype {name}, as asked",
                 cause="the dtype argument is ignored (torch.zeros defaults to float32)" if kind == "float32" else "",
                 fix="create the result with dtype=dtype, or convert it with .to(dtype)")
        if mask.dim() >= 2 and got.shape == right.mT.shape != mask.shape and torch.equal(got, right.mT):
            fail("last two axes swapped", tried=shown, got=f"the right additive mask, transposed: {tuple(got.shape)}",
                 expected=f"the mask's shape {shape}", cause="a transpose (.T or .mT) swapped the last two axes",
                 fix=f"leave the axes as the mask has them: {zeros}.{fill}")
        if tuple(got.shape) != shape:
            fail(f"shape {tuple(got.shape)}, not the mask's {shape}", tried=shown, got=f"shape {tuple(got.shape)}",
                 expected=f"the mask's shape {shape}", fix=f"build the result with the mask's shape: {zeros}")
        if torch.isnan(got).any():
            fail("NaN in the additive mask", tried=shown, got=f"NaN in {int(torch.isnan(got).sum())} places",
                 expected="0 and -inf only", cause="0 × (-inf) is NaN, so (~mask) * float('-inf') does not work",
                 fix=f"{zeros}.{fill}, or torch.where")
        if mask.any() and not mask.all() and torch.equal(got, mask.to(want)):
            fail("1 for kept, 0 for blocked: blocks nothing", tried=shown, got="mask.to(dtype): 1 where True, 0 where "
                 "False", expected="0 where True, -inf where False", cause="adding 1 to the kept scores blocks nothing",
                 fix="use 0 for kept positions and float('-inf') for blocked ones")
        kept, blocked = got[mask].to(torch.float64), got[~mask].to(torch.float64)
        if (kept != 0).any():
            if (~mask).any() and (blocked == 0).all() and (kept < 0).all():
                fail(POLARITY[0], tried=shown, got="-inf (or a large negative) where the mask is True, 0 where False",
                     expected="0 where True, -inf where False", cause="you filled where the mask is True",
                     fix=f"fill where it is False: {fill}")
            c = fmt(float(kept[0])) if bool((kept == kept[0]).all()) else ""  # one value in every kept place
            fail("kept positions are not 0", tried=shown,
                 got=f"{fmt(float(kept[kept != 0][0]))} where the mask is True", expected="0 where the mask is True",
                 cause=f"every kept position of your result holds {c}, which shifts every kept score (a start from "
                 "torch.ones or torch.full)" if c else "", fix=f"start from zeros: {zeros}")
        if (blocked >= 0).any():
            fail("blocked positions not negative", tried=shown,
                 got=f"{fmt(float(blocked.max()))} where the mask is False", expected="-inf where the mask is False",
                 fix="fill where the mask is False with float('-inf')")
        if shape == (2, 1, 3, 4):  # the large scores: softmax(scores + mask) must give blocked keys no weight
            scores = _large_scores(want)[0]
            weights = torch.softmax((scores + got).to(torch.float32), dim=-1)
            leak = weights[~mask].max().item()
            if leak > 1e-6 or not torch.allclose(weights, torch.softmax(
                    scores.to(torch.float32).masked_fill(~mask, -math.inf), dim=-1), atol=1e-4):
                fail("a fill value too weak", tried=shown + " added to scores of ±3·10⁴",
                     got=f"blocked with {fmt(float(blocked.max()))}: blocked keys get weight up to {fmt(leak)}",
                     expected="weight 0 on every blocked key", fix="fill with float('-inf')",
                     cause="next to scores this large, blocked keys still win over a finite fill")
        if torch.isfinite(blocked).any():
            value = float(blocked[torch.isfinite(blocked)][0])
            named = f"torch.finfo({name}).min" if value == torch.finfo(want).min else fmt(value)
            fail("a finite fill instead of -inf", tried=shown, got=f"{named} where the mask is False",
                 expected="-inf where the mask is False, as the docstring says",
                 cause=f"{named} is finite: it gives uniform weights, not zeros, to a query with every key blocked, "
                       "and it blocks only while the scores stay smaller than it",
                 fix="fill with float('-inf'), which every floating-point dtype holds")
    expect_inputs_unchanged(fn, [(mask,) for mask, dtype in cases if dtype is None], names=("mask",),
                            call=lambda case: "additive_mask(mask)")
    return "0 / -inf in float16, bfloat16, float32 and float64 (and the default); no leak with scores of ±3·10⁴"
