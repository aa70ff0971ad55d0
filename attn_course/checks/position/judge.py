"""What the topic's checks share: the learner's call with its exceptions explained, the
judge of one case, and the measurements that make its diagnoses precise (a kept slice, frequencies)."""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable

import torch

from .. import kit
from ..compare import Failure, as_tensor, fail, fail_again, fmt, same
from ..core import Learner
from ..kit import Suspects


# ================================================================================== shared
#: torch.cat's complaint, explained better here than by the course-wide table: (type, regex, cause, fix).
PATTERNS = [("RuntimeError", r"Sizes of tensors must match except in dimension (-?\d+)", "torch.cat along axis {1} "
             "needs every other axis to agree: a join along the wrong axis, or a tensor that lost or gained an axis",
             "print the shapes you join; join the positions with dim=-2")]


def call(fn: Learner, args: tuple, tried: str, expected: str, constructs=(), patterns=(), tensor=True) -> Any:
    """The learner's ``fn(*args)`` (as a tensor unless ``tensor`` is False), its exception explained."""
    out = kit.call_explained(fn, *args, tried=tried, expected=expected, constructs=constructs,
                             patterns=[*patterns, *PATTERNS])
    return as_tensor(out, tried=tried) if tensor else out


def kept_slice(failure: Failure, out: torch.Tensor, expected: torch.Tensor, names: tuple[str, ...]) -> None:
    """When ``out`` has size 1 on axes where ``expected`` is longer and equals ``expected`` at one index of them,
    say which slice the answer holds (``names``: each axis in the singular)."""
    axes = [a for a in range(out.dim()) if out.dim() == expected.dim() and out.shape[a] == 1 < expected.shape[a]]
    if failure.diagnosis.cause or not axes or not out.is_floating_point() or \
            any(out.shape[a] != expected.shape[a] for a in range(out.dim()) if a not in axes):
        return
    for index in itertools.product(*(range(expected.shape[a]) for a in axes)):
        at = dict(zip(axes, index))
        part = expected[tuple(slice(at[a], at[a] + 1) if a in at else slice(None) for a in range(out.dim()))]
        if same(out.double(), part.double(), atol=1e-5, rtol=1e-4):
            where = " and ".join(f"{names[a]} {i}" for a, i in at.items())
            lost = " and ".join(f"axis {a} ({expected.shape[a]} {names[a]}s)" for a in axes)
            fail_again(failure, f"only {where} computed", f"your result holds the right values for {where} alone: "
                   f"{lost} came out of size 1, so the values for every other {names[axes[0]]} were never computed",
                   "keep that axis at its full size: print the shape after each step to find where it becomes 1")


def floating(out: torch.Tensor, tried: str, fix: str) -> None:
    if not out.is_floating_point():
        kind = str(out.dtype)[6:]
        fail(f"integer result ({kind})", tried=tried, got=kind, expected="a floating-point tensor",
             cause="integer tensors (torch.arange(n) is int64) or a // made your arithmetic drop the fractions",
             fix=fix)


def judge(suspects: Suspects, fn: Learner, out: torch.Tensor, expected: torch.Tensor, case: tuple, tried: str,
          measure: Callable[[Failure], None], **compare: Any) -> None:
    """``suspects.expect`` on one case (re-running ``fn`` to tell mistakes apart); ``measure(failure)`` may say more."""
    try:
        suspects.expect(out, expected, case, tried=tried, again=lambda *c: as_tensor(fn(*c), tried=tried), **compare)
    except Failure as failure:
        measure(failure)
        raise


# ================================================================================== frequencies, measured
def frequency_cause(measured: torch.Tensor, expected: torch.Tensor, base: float, d: int) -> str:
    """What per-pair frequencies are, next to base^(−2r/d): one for all, a constant factor, another base or d."""
    shown, want = (", ".join(fmt(float(w)) for w in t[:5]) + ("…" if len(t) > 5 else "")
                   for t in (measured, expected))
    text, ratio = f"pair frequencies {shown} (pair 0, 1, …); expected base^(−2r/d): {want}", measured / expected
    if len(measured) >= 2 and torch.allclose(measured, measured[0].expand_as(measured), rtol=1e-3, atol=1e-6):
        return f"{text}. Every pair has the same frequency {fmt(float(measured[0]))}"
    if torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-3):
        named = " (π/180: an angle converted between degrees and radians)" if abs(ratio[0] - math.pi / 180) < 1e-4 \
            else ""
        return f"{text}. Every frequency is {fmt(float(ratio[0]))} × the expected one{named}"
    if len(measured) >= 2 and bool((measured > 0).all()) and abs(float(measured[0]) - 1) < 1e-3:
        logs = torch.log(measured[1:].double()) / torch.arange(1, len(measured), dtype=torch.float64)
        if torch.allclose(logs, logs[0].expand_as(logs), rtol=1e-3) and float(logs[0]) < 0:
            return (f"{text}. They are base'^(−2r/d) with base' = {fmt(math.exp(-float(logs[0]) * d / 2))} instead "
                    f"of {fmt(base)} — the same numbers as base^(−2r/d') with d' = "
                    f"{fmt(-2 * math.log(base) / float(logs[0]))} instead of d = {d}")
    return text
