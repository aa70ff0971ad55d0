"""What every check of notebook 11 judges with: the tolerances, the float64 oracles (attention, the window
mask), the messages whose meaning the exercises make certain, and the words for a count of rows."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from ..compare import same

LOOSE = dict(atol=3e-5, rtol=1e-3)  # what a suspect must match (float32 cases included); a pass uses tolerance


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    return dict(atol=1e-6, rtol=1e-5) if dtype == torch.float64 else dict(LOOSE)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def sdpa(q, k, v, mask=None) -> torch.Tensor:
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)


def attn(q, k, v, *, scale=None, mask=None, dim=-1, naive=False) -> torch.Tensor:
    """softmax(q kᵀ · scale) v in float64 (rows with no kept key: 0); ``naive``: unshifted, in q's dtype."""
    q, k, v = (q, k, v) if naive else (q.double(), k.double(), v.double())
    s = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if naive:
        return (s.exp() / s.exp().sum(-1, keepdim=True)) @ v
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.nan_to_num(torch.softmax(s, dim=dim), nan=0.0) @ v


#: (type, regex, cause, fix): messages whose meaning the exercises of this notebook make certain.
PATTERNS = [
    ("RuntimeError", r"upper bound and lower bound inconsistent with step sign",
     "torch.arange(start, end) got start > end: a bound on the line shown is wrong (or the two are swapped)",
     "print the bounds; a range of positions runs from the smaller to the larger"),
    ("RuntimeError", r"Subtraction, the `-` operator, with a bool tensor",
     "a `-` met a bool tensor: a mask stands where numbers were meant, or a mask is negated with − instead of ~",
     "negate masks with ~; subtract only numbers"),
    ("TypeError", r"'float' object cannot be interpreted as an integer",
     "a float where Python needs an integer (a range bound, a size): / gives a float even for whole numbers",
     "use // for positions and block counts (or int(...))"),
]


def rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def window(n_q, n_k, window, lo=0, hi=0, top_left=False, causal=True) -> torch.Tensor:
    """Key j seen from position p iff p − window + lo < j ≤ p + hi (not causal: |j − p| < window − lo)."""
    p = torch.arange(n_q)[:, None] + (0 if top_left else n_k - n_q)
    j = torch.arange(n_k)[None, :]
    return (j > p - window + lo) & ((j <= p + hi) if causal else (j < p + window - lo))


def confirm(suspects: Any, fn: Callable[..., Any], actual: torch.Tensor, case: tuple, expected: torch.Tensor,
            others: Sequence[tuple], oracle: Callable[..., torch.Tensor], tol: dict,
            convert: Callable[[Any], Any] = lambda x: x) -> None:
    """Before a wrong ``actual`` is named: drop from ``suspects.table`` every known mistake that reproduces it on
    ``case`` but none of the learner's other wrong answers on ``others`` (``oracle(*other)`` the right one; cases
    where the row or the learner gives no tensor, or the learner is right, say nothing), so that a row which
    coincides with another mistake on one case only (a window of 3 with blocks of 4: window + 1, or block_size
    where window belongs) is not named. A row that fits some of them stays: the rows' loops need not match the
    learner's in every edge case. The learner's function runs once per other case, only when a row reproduces
    ``actual``."""
    found = suspects.suspects(actual, case, expected)
    if not found:
        return
    mine: dict[int, Any] = {}

    def learner(i: int) -> Any:
        if i not in mine:
            try:
                got = convert(fn(*others[i]))
            except Exception:  # noqa: BLE001 - raising (or an answer of another kind) tells nothing here
                got = None
            right = oracle(*others[i]) if isinstance(got, torch.Tensor) else None
            mine[i] = None if right is None or (tuple(got.shape) == tuple(right.shape) and same(got, right, **tol)) \
                else got
        return mine[i]

    def made(known: Any, other: tuple) -> Any:
        try:
            return known.make(*other)
        except Exception:  # noqa: BLE001 - this mistake cannot happen on that case
            return None

    drop = set()
    for known in found:
        fits = []
        for i, other in enumerate(others):
            out = made(known, other) if other is not case else None
            if isinstance(out, torch.Tensor) and isinstance(got := learner(i), torch.Tensor):
                fits.append(tuple(out.shape) == tuple(got.shape) and same(got, out, **tol))
        if fits and not any(fits):
            drop.add(known.key)
    suspects.table = [k for k in suspects.table if k.key not in drop]
