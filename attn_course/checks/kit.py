"""Small helpers that the checks of several notebooks share, beyond :mod:`.core` and :mod:`.compare`.

A topic's checks module (``checks/<topic>.py``) never imports another topic's private names: what two
topics share lives here (or in :mod:`.compare`, :mod:`.core`, a reference module), under a public name.

* :func:`reproduce` — the message a construct raises, to name the construct behind a learner's
  exception only when the check can reproduce that very message;
* :class:`Evidence` — mistakes that earlier cases ruled out, so a later mismatch is never blamed on them;
* :func:`bool_hint` — the cause and fix for "Boolean value of Tensor … is ambiguous";
* :func:`factors` — names for constant factors that :func:`~.compare.describe_mismatch` may report;
* :func:`einsum_flops` — the FLOPs of an ``einsum`` call, for the watchers that count a learner's work.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable

import torch

from .boundary import LearnerRaised
from .compare import Mistake, same

__all__ = ["reproduce", "Evidence", "BOOL_HINT", "bool_hint", "factors", "einsum_flops"]


def reproduce(attempt: Callable[[], object]) -> str | None:
    """The message ``attempt()`` raises (None if it does not raise)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            attempt()
    except Exception as exc:  # noqa: BLE001
        return str(exc)
    return None


class Evidence:
    """Mistakes that earlier cases rule out: an answer that matched the oracle on a case where a mistake's
    output differs from it did not make that mistake, so a later mismatch is never blamed on it.
    Worked out lazily, only when a later case fails (right answers pay nothing)."""

    def __init__(self) -> None:
        self._history: list[tuple[list[Mistake], torch.Tensor, float, float]] = []
        self._ruled: dict[str, bool] = {}

    def passed(self, mistakes: list[Mistake], expected: torch.Tensor, *, atol: float, rtol: float) -> None:
        self._history.append((mistakes, expected, atol, rtol))

    def ruled_out(self, summary: str) -> bool:
        if summary not in self._ruled:
            self._ruled[summary] = False
            for mistakes, expected, atol, rtol in self._history:
                values = [m.value() for m in mistakes if m.summary == summary]
                if values and all(v is not None and not same(v, expected, atol=atol, rtol=rtol) for v in values):
                    self._ruled[summary] = True
                    break
        return self._ruled[summary]

    def possible(self, mistakes: list[Mistake]) -> list[Mistake]:
        return [Mistake(m.summary, m.cause, m.fix, lambda m=m: None if self.ruled_out(m.summary) else m.value())
                for m in mistakes]


BOOL_HINT = dict(cause="Python asked a tensor for one True/False (`x_kv or x_q`, `if mask:`, `and` / `or` between "
                       "tensors); a tensor of several values has none",
                 fix="test for None instead: `x_q if x_kv is None else x_kv`, `if mask is not None:`")


def bool_hint(exc: LearnerRaised) -> dict:
    """:data:`BOOL_HINT` when the learner's code asked a tensor for one truth value, else nothing."""
    return BOOL_HINT if "Boolean value of Tensor" in exc.message else {}


def factors(**named: float) -> dict[str, float]:
    """Names for a constant factor, keeping only values no other name (nor 2, ½ or −1) shares on this input."""
    taken = [2.0, 0.5, -1.0, 1.0, *named.values()]
    return {k: v for k, v in named.items() if sum(abs(v - t) < 1e-9 or abs(1 / v - t) < 1e-9 for t in taken) == 1}


def einsum_flops(args: tuple, out: torch.Tensor) -> float:
    """2 × (output entries) × (product of the contracted sizes) of an einsum; 0 when it cannot be read."""
    try:
        equation, operands = args[0], args[1:]
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
        inputs, output = equation.replace(" ", "").split("->")
        sizes: dict[str, int] = {}
        for spec, t in zip(inputs.split(","), operands):
            head, _, tail = spec.partition("...")
            sizes.update(zip(head, t.shape))
            sizes.update(zip(reversed(tail), reversed(t.shape)))
        return 2.0 * out.numel() * math.prod(s for letter, s in sizes.items() if letter not in output)
    except Exception:  # noqa: BLE001 - an equation this reader does not follow is not counted
        return 0.0
