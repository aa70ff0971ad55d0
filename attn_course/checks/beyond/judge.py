"""What notebook 13's checks share: cases drawn, the verdict at the input dtype's tolerance, which rows or blocks
are right, and the probe :func:`work` with the test built on it (no (n, n) matrix)."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from ..boundary import probe
from ..compare import Failure, fail, fail_again, same
from ..core import Learner
from ..kit import Suspects, watch


def qkv(lead: tuple[int, ...], n_q: int, n_k: int, d_k: int, d_v: int, seed: int, *, scale: float = 1.0,
        dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*lead, n, d, generator=g, dtype=torch.float64)
               for n, d in ((n_q, d_k), (n_k, d_k), (n_k, d_v)))
    return (scale * q).to(dtype), (scale * k).to(dtype), v.to(dtype)


def dtype_of(label: str) -> torch.dtype:
    return torch.float32 if "float32" in label else torch.float64


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    return dict(atol=1e-10, rtol=1e-9) if dtype == torch.float64 else dict(atol=2e-5, rtol=2e-3)


def expect_close_at_dtype(suspects: Suspects, out: Tensor, expected: Tensor, case: tuple, *, tried: str,
                          measured: Callable[[Failure], None] | None = None, normaliser: str = "",
                          **compare: Any) -> None:
    """The engine's verdict at the input's dtype's tolerance, naming a float64 answer right only to float32's
    precision (else ``measured`` may say more); then the result must have the input's dtype."""
    dtype = case[0].dtype
    try:
        suspects.expect(out, expected, case, tried=tried, **tolerance(dtype), **compare)
    except Failure as failure:
        d = failure.diagnosis
        if not d.cause and dtype == torch.float64 and same(out, expected, **tolerance(torch.float32)):
            _row_factors(out, expected, failure, normaliser)
            fail("computed in float32, not the input's float64", tried=tried, got=d.got,
                 expected="the values to float64's precision (the inputs are float64)",
                 cause="right to about 7 digits, as float32 gives: a tensor you created without dtype= (torch.zeros "
                       "and torch.empty make float32 by default), or a conversion, made part of the work float32",
                 fix=_DTYPE_FIX)
        if measured is not None and not d.cause:
            measured(failure)
        raise
    if out.dtype != dtype:
        got, want = (str(t).replace("torch.", "") for t in (out.dtype, dtype))
        fail(f"result in {got}, not the input's {want}", tried=tried, got=f"a {got} tensor",
             expected=f"a {want} tensor, like the input",
             cause="a tensor you created without dtype= (torch.zeros and torch.empty make float32 by default), or a "
                   "conversion", fix=_DTYPE_FIX)


_DTYPE_FIX = "create every tensor with the input's dtype (dtype=q.dtype, or *_like functions)"


def _row_factors(out: Tensor, expected: Tensor, failure: Failure, normaliser: str) -> None:
    """Fail when each row of ``out`` is its expected row times its own factor near 1 (float32 rounding would differ
    entry by entry): the divisor of each row is slightly off."""
    ratio = out.double() / expected
    if not normaliser or expected.shape[-1] < 2 or not bool(torch.isfinite(ratio).all()):
        return
    within = float((ratio - ratio[..., :1]).abs().max())  # inside each row
    across = float((ratio[..., 0] - ratio.flatten()[0]).abs().max())  # from row to row
    if within < 1e-3 * across:
        fail_again(failure, "each row off by a tiny factor: the normaliser", "every row of yours is the right row "
                   f"times a factor of its own, at most {float((ratio - 1).abs().max()):.1e} away from 1: what each "
                   f"row is divided by is not exactly {normaliser} (an ε added to it, or it alone computed in "
                   "float32)", f"divide by {normaliser} as the docstring writes it, in the input's dtype, with no ε")


def rows_right(out: Tensor, expected: Tensor) -> Tensor:
    """(..., n) whether each output row is right (float32's tolerance; NaN where NaN is expected counts as right)."""
    return torch.isclose(out.double(), expected, atol=2e-5, rtol=2e-3, equal_nan=True).all(-1)


def blocks_right(out: Tensor, expected: Tensor, size: int) -> list[bool] | None:
    """For each block of ``size`` rows: are all its rows right in every batch entry? None if the shapes differ."""
    if tuple(out.shape) != tuple(expected.shape):
        return None
    right = rows_right(out, expected).reshape(-1, out.shape[-2]).all(0)  # (n,)
    return [bool(right[s:s + size].all()) for s in range(0, right.shape[0], size)]


# ============================================================================ the probe: what the code builds
@probe("beyond.work")
def work(fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
    """Learner-side: ``fn(*args)`` under :class:`~..kit.Watch`: its torch calls (``ops``), the shapes of the floating
    tensors it built (``shapes``), its matrix products' shapes and counts (``products``) and FLOPs (``flops``)."""
    return watch(fn, *args)


def squares(seen: dict[str, Any], n: int) -> list[tuple[int, ...]]:
    """The shapes of the floating-point tensors built whose last two axes are (n, n)."""
    return [tuple(s) for s in seen["shapes"] if tuple(s[-2:]) == (n, n)]


def no_square(fn: Learner, n: int, tried: str, fix: str, *args: Any) -> dict[str, Any]:
    """What the probe saw of ``fn(*args)``, after failing when it built a floating-point (n, n) tensor."""
    seen = fn.observe("beyond.work", *args)
    if full := squares(seen, n):
        fail(f"builds the full {n} × {n} matrix", tried=tried,
             got=f"a floating-point tensor of shape {full[0]}: one number per (query, key) pair",
             expected="nothing with one entry per (query, key) pair: only (d_k, d_v) sums over the keys",
             cause="the values are right, but computing φ(q) φ(k)ᵀ (or the scores) costs O(n²) time and memory, "
                   "which is exactly what linear attention removes",
             fix=fix)
    return seen
