"""What every check of notebook 11 judges with: the tolerances, the float64 oracles (attention, the window
mask), the messages whose meaning the exercises make certain, and the words for a count of rows."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

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
