"""The softmax_temperature check: its cases, its table of known mistakes (with every softmax mistake on x / T), and
which temperature a wrong answer's weights have."""

from __future__ import annotations

import math

import torch

from ..core import Learner, check
from .. import kit
from .body import INF, K, early_epsilon, explain_weights, judge_cases, overflows_near_1000


def _temperature_cases() -> list[tuple[torch.Tensor, float]]:
    g = torch.Generator().manual_seed(6)
    x, t = 2 * torch.randn(3, 6, generator=g), torch.tensor
    return [
        (x, 0.5), (x, 2.0), (x, 1.0),  # the same scores at other temperatures: an ignored temperature shows at once
        (torch.randn(2, 2, 5, generator=g, dtype=torch.float64), 3.0), (torch.randn(7, generator=g), 0.25),
        (torch.randn(4, 1, generator=g), 0.7), (torch.randn(1, 5, generator=g, dtype=torch.float64), 10.0),
        (2 * torch.randn(4, 4, generator=g), 1.5),  # square: a keepdim slip broadcasts instead of failing
        (t([[50.0, 48.0, 49.0], [-3.0, 0.0, 1.0]]), 1.0),  # e^x finite in float32, e^(x + max) not
        (t([[1000.0, 1001.0, 1002.0], [2.0, 1.0, 0.0]]), 1.0),
        (t([[-1000.0, -998.0, -999.0], [0.0, 1.0, 2.0]], dtype=torch.float64), 0.5),
        (t([[3.0, 1.0, -2.0, 2.9], [0.5, 0.4, 0.3, 0.2]]), 0.01),  # x / T reaches 300
        (t([[0.0, -INF, 1.0], [-INF, 2.0, 2.0]]), 0.3),
        (3 * torch.randn(3, 5, generator=g, dtype=torch.float64), 100.0),
        (t([[1.0, 2.0, 3.0], [6.0, 4.0, 5.0]], dtype=torch.float16), 0.5),
    ]


_AFTER = ("temperature applied after the softmax", "divide the scores by T first, then take the softmax")
TEMPERATURE = [
    K("multiplied", "temperature multiplied", "you multiplied the scores by T; softmax(x / T) divides them, so a high T "
      "flattens the weights and a low T sharpens them", "divide: softmax(x / temperature)",
      lambda x, t: torch.softmax(x * t, -1)),
    K("ignored", "temperature ignored", "the temperature has no effect on your weights", "divide the scores by the "
      "temperature before the softmax", lambda x, t: None if t == 1.0 else torch.softmax(x, -1)),
    K("after", _AFTER[0], "you applied the temperature to the weights, after the softmax", _AFTER[1],
      lambda x, t: torch.softmax(x, -1) / t),
    K("power", _AFTER[0], "you raised the weights to the power 1/T without normalising again", _AFTER[1],
      lambda x, t: torch.softmax(x, -1) ** (1 / t)),
    K("twice", "temperature applied twice", "you divided by T twice (x / T²)", "divide once: x / temperature",
      lambda x, t: torch.softmax(x / t ** 2, -1)),
    K("sqrt", "divided by √T", "you divided by √T, not by T", "divide by the temperature itself",
      lambda x, t: torch.softmax(x / math.sqrt(t), -1)),
    K("numerator", "temperature only in the numerator", "you divided only the exponent of the numerator by T, so the "
      "weights no longer sum to 1", "compute z = x / T once and take the softmax of z",
      lambda x, t: kit.exp_shifted(x / t, -1) / kit.exp_shifted(x, -1).sum(-1, keepdim=True)),
    K("power-renormalised", "weights raised to 1/T and renormalised", "you raised softmax(x) to the power 1/T and "
      "normalised again: equal on paper, but for a small T the powers underflow to 0 (0/0 = NaN)",
      "divide the scores by T first, then take the stable softmax",
      lambda x, t: kit.normalised(torch.softmax(x, -1) ** (1 / t), -1)),
] + [K(k.key, k.summary.replace("{dim}", "-1"), k.cause.replace("{dim}", "-1"), k.fix,
       lambda x, t, k=k: k.make(x / t, -1)) for k in kit.SOFTMAX_MISTAKES]  # and every softmax mistake, on x / T


def _explain_temperature(out: torch.Tensor, case: tuple, passed: list, tried: str) -> None:
    # The temperatures a wrong answer could be using that the cases it passed leave possible: a whole number made of
    # T, a fixed value seen before; 1/T, 1, T², √T and -T only while every case passed had T = 1.
    x, t = case
    known: dict[str, float] = {}
    if float(int(t)) != t and int(t) != 0:
        known[f"{int(t)}: you cut the temperature to a whole number (int)"] = float(int(t))
    if float(round(t)) != t and round(t) != 0:
        known[f"{round(t)}: you rounded the temperature to a whole number"] = float(round(t))
    known.update({f"{p:g}, the temperature of an earlier case: your function does not use the temperature it is given": p
                  for _, p in passed if p != t})
    if all(p == 1.0 for _, p in passed):
        known.update({"1/T (you multiplied by T)": 1 / t, "1 (the temperature is not used)": 1.0,
                      "T² (you divided by T twice)": t * t, "√T": math.sqrt(t), "-T (a sign slip)": -t})
    explain_weights(out, x, -1, tried=tried, temperature=t, known=known)


@check("softmax_temperature", expects="a function softmax_temperature(x, temperature) returning weights shaped like x")
def check_softmax_temperature(fn: Learner) -> str:
    cases = _temperature_cases()
    run = judge_cases(fn, cases, signature="softmax_temperature(x, temperature)", what="your weights",
                      oracle=lambda x, t: torch.softmax(x.double() / t, -1), expected="weights shaped like x",
                      table=TEMPERATURE, explain=_explain_temperature, shape_fix="the weights have the shape of x",
                      call=lambda c: f"softmax_temperature(x, {c[1]:g})", dim=lambda c: c[0].ndim - 1,
                      early=lambda o, case, tried: early_epsilon(o, case[0], -1, tried=tried, temperature=case[1],
                                                                 overflows=overflows_near_1000(kit.TensorOrArray(fn), 1.0)))
    temps = sorted({t for _, t in cases})
    return (f"matches torch.softmax(x / T) on {len(cases)} cases, T from {temps[0]:g} to {temps[-1]:g} "
            f"({run.kind}), stable at ±1000")
