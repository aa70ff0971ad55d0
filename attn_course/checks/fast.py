"""Checks for notebook 09 (fast attention): online_softmax, tiled_attention, causal_tiled_attention.

Each check compares the learner's function with PyTorch's own (``torch.softmax`` and
``F.scaled_dot_product_attention``, in float64) on several shapes and block sizes, always including
a sequence length that is not a multiple of the block, a block of 1 and a block longer than the
sequence. Inputs are built so that the running maximum changes from block to block: a function that
forgets a rescaling gives a visibly different answer.

When the answer is wrong, the check replays the classic mistakes (a running sum or accumulator that
is not rescaled, no final division, a dropped last block, a causal mask off by one block or one
position) and names the one the learner's output reproduces. When the values are right, it also
looks at the work: calling ``torch.softmax`` / SDPA, building a full N×M score matrix, or computing
the blocks above the diagonal in the causal case are reported as well.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ._core import as_tensor, call, check, expect_close, fail

__all__ = ["check_online_softmax", "check_tiled_attention", "check_causal_tiled_attention"]

# ---------------------------------------------------------------------------------------------
# Messages naming the mistakes (the tests assert on their key phrases).

SUM_NOT_RESCALED = (
    "the running sum is not rescaled when the maximum changes: before adding a block's "
    "exp(x - m_new), multiply the sum so far by exp(m_old - m_new) (it was accumulated under the old max)."
)
SUM_RESCALED_WRONG_WAY = (
    "the running sum is rescaled the wrong way round: the factor is exp(m_old - m_new) (≤ 1), "
    "not exp(m_new - m_old)."
)
NO_FINAL_DIVISION = (
    "the final division is missing: the result is still unnormalised. Divide by the running sum "
    "once, after the last block."
)
NO_MAX = (
    "no running maximum is subtracted: e^x overflows for scores near 1000. Keep a running max m "
    "and exponentiate x - m."
)
TAIL_DROPPED = (
    "block-boundary off-by-one: the last, shorter block is dropped when the length is not a multiple "
    "of the block size. Loop with range(0, n, block_size) and slice [start:start + block_size] "
    "(slicing stops at the end by itself)."
)
CALLS_SOFTMAX = (
    "it calls torch.softmax (or log_softmax) instead of building the softmax from a running max and "
    "a running sum. The values are right, but that is not the exercise."
)
ACC_NOT_RESCALED = (
    "the output accumulator is not rescaled when the maximum changes: multiply it by "
    "exp(m_old - m_new) before adding probs @ v_block (the running sum is rescaled, the accumulator must be too)."
)
NEITHER_RESCALED = (
    "neither the running sum nor the output accumulator is rescaled when the maximum changes: "
    "multiply both by exp(m_old - m_new) before adding the new block."
)
NO_FINAL_DIVISION_ATTN = (
    "the final division is missing: the accumulator holds Σ exp(s - m)·v, unnormalised. Divide it "
    "by the running sum once, after the last key block."
)
KEY_TAIL_DROPPED = (
    "block-boundary off-by-one: the last, shorter key/value block is dropped when the number of keys "
    "is not a multiple of the block size. Loop with range(0, M, block_size)."
)
QUERY_TAIL_DROPPED = (
    "block-boundary off-by-one: the last, shorter query block is never computed when N is not a "
    "multiple of the block size. Loop over query blocks with range(0, N, block_size)."
)
NO_SCALE = "the scores are not scaled: multiply q·kᵀ by 1/√D (D = q.shape[-1])."
SCALE_BY_D = "the scores are divided by D instead of √D."
FULL_SCORES = (
    "the values are right, but your function built a floating-point tensor of shape {shape}: the "
    "full N×M score matrix (or a full-size mask). Tiled attention must only ever hold "
    "(block, block) tiles; that is where the memory saving comes from."
)
CALLS_SDPA = (
    "it calls F.scaled_dot_product_attention (or another fused attention) instead of the tiled loop. "
    "The values are right, but that is not the exercise."
)
NOT_CAUSAL = (
    "the output is the non-causal result: every query also sees future keys. Mask key > query on "
    "the diagonal block and skip the blocks above it."
)
OUTPUT_WIDTH = (
    "the output's last dimension must come from v (Dv = {dv}), not from q (D = {d}): allocate the "
    "output and the accumulator with v.shape[-1] columns."
)
DIAGONAL_SKIPPED = (
    "causal block off-by-one: the diagonal block is skipped (key blocks 0..i-1 instead of 0..i). "
    "The first query block then sees no key at all (NaN or zeros) and every row misses its own "
    "neighbourhood. Visit key blocks up to and including the diagonal."
)
ABOVE_KEPT_UNMASKED = (
    "causal block off-by-one: blocks above the diagonal are computed and not masked, so queries "
    "see future keys. Stop the key loop at the diagonal block."
)
DIAGONAL_NOT_MASKED = (
    "the diagonal block is not masked: inside it, query i still sees keys i+1, i+2, … of the same "
    "block. Set scores with key position > query position to -inf in that block."
)
MASK_EXCLUDES_SELF = (
    "causal mask off by one: it also hides the key at the query's own position (key ≥ query instead "
    "of key > query), so the first query sees nothing (NaN). A query may attend to itself."
)
MASK_ONE_AHEAD = (
    "causal mask off by one: each query also sees the next key (key > query + 1 was masked instead "
    "of key > query)."
)
LOCAL_MASK = (
    "the causal mask is built from positions inside the tile (a triangular mask on every tile) "
    "instead of global positions: blocks below the diagonal lose keys they may see. Compare the "
    "global positions q_start + i and k_start + j, or mask only the diagonal tile."
)
ABOVE_COMPUTED = (
    "the values are right, but your function computes the blocks above the diagonal too "
    "({counted:.0f} matrix-multiply FLOPs where skipping needs {needed:.0f}): they are fully masked, "
    "so skip them — loop over key blocks only up to the diagonal. That halves the work."
)

# ---------------------------------------------------------------------------------------------
# The mistakes, replayed: a tiled attention with switches for each classic error.


def _online_softmax_variant(x: torch.Tensor, b: int, mistake: str) -> torch.Tensor:
    n = x.shape[-1]
    stop = n - n % b if mistake == "tail" else n
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s in range(0, stop, b):
        blk = x[..., s:s + b]
        m_new = torch.maximum(m, blk.amax(-1, keepdim=True))
        if mistake == "no_max":
            m_new = torch.zeros_like(m)
        if mistake == "sum":
            factor = torch.ones_like(m)
        elif mistake == "inverted":
            factor = torch.exp(torch.nan_to_num(m_new - m, posinf=0.0))
        else:
            factor = torch.exp(m - m_new)
        l = l * factor + torch.exp(blk - m_new).sum(-1, keepdim=True)
        m = m_new
    if mistake == "division":
        return torch.exp(x - m)
    return torch.exp(x - m) / l


def _tiled_variant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: int, *, causal: bool,
                   mistake: str = "") -> torch.Tensor:
    d = q.shape[-1]
    scale = {"no_scale": 1.0, "scale_d": 1.0 / d}.get(mistake, 1.0 / math.sqrt(d))
    n, m_keys = q.shape[-2], k.shape[-2]
    q_stop = n - n % b if mistake.startswith("q_tail") else n
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, q_stop, b):
        qe = min(qs + b, n)
        qb = q[..., qs:qe, :]
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        if not causal or mistake in ("not_causal", "above_unmasked_all"):
            k_stop = m_keys
        elif mistake.startswith("skip_diag"):
            k_stop = qs
        elif mistake == "above_unmasked_next":
            k_stop = min(qe + b, m_keys)
        else:
            k_stop = qe
        if mistake == "k_tail":
            k_stop = min(k_stop, m_keys - m_keys % b)
        for ks in range(0, k_stop, b):
            ke = min(ks + b, m_keys)
            s = (qb @ k[..., ks:ke, :].transpose(-2, -1)) * scale
            if causal and mistake != "not_causal":
                rows = torch.arange(qs, qe)[:, None]
                cols = torch.arange(ks, ke)[None, :]
                if mistake == "local_mask":
                    hide = (cols - ks) > (rows - qs)
                elif mistake == "excl_self":
                    hide = cols >= rows
                elif mistake == "one_ahead":
                    hide = cols > rows + 1
                elif mistake == "diag_unmasked":
                    hide = torch.zeros_like(cols > rows)
                elif mistake.startswith("above_unmasked"):
                    hide = (cols > rows) if ks == qs else torch.zeros_like(cols > rows)
                else:
                    hide = cols > rows
                s = s.masked_fill(hide, -math.inf)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            alpha = torch.exp(m - m_new)
            p = torch.exp(s - m_new)
            keep_sum = mistake in ("sum", "neither")
            keep_acc = mistake in ("acc", "neither")
            l = (l if keep_sum else l * alpha) + p.sum(-1, keepdim=True)
            acc = (acc if keep_acc else acc * alpha) + p @ v[..., ks:ke, :]
            m = m_new
        if mistake == "division":
            res = acc
        elif mistake == "skip_diag_zero":
            res = torch.where(l > 0, acc / torch.where(l > 0, l, torch.ones_like(l)), torch.zeros_like(acc))
        else:
            res = acc / l
        out[..., qs:qe, :] = res
    if mistake == "q_tail_short":
        return out[..., :q_stop, :]
    return out


class _Watch(TorchFunctionMode):
    """Records which torch functions ran and the shapes of the floating-point tensors they returned.

    (A torch-function mode is cheap to enter; the FLOP counter, which needs a dispatch mode, is only
    used where the work itself is checked.)
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.add(getattr(func, "__name__", str(func)))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() >= 2:
                self.shapes.append(tuple(t.shape))
        return out


def _watched(fn: Callable, *args: Any, count_flops: bool = False) -> tuple[Any, _Watch, float]:
    """Call the learner's function under a watch: functions called, tensor shapes, matmul FLOPs."""
    watch = _Watch()
    if not count_flops:
        with watch:
            return call(fn, *args), watch, 0.0
    from torch.utils.flop_counter import FlopCounterMode  # imports torch._dynamo: a second, once

    counter = FlopCounterMode(display=False)
    with counter, watch:
        result = call(fn, *args)
    return result, watch, float(counter.get_total_flops())


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------------
# online softmax


def _rising_rows(rows: int, n: int, seed: int, spread: float = 6.0) -> torch.Tensor:
    """Scores whose maximum keeps growing along each row: every rescaling step matters."""
    g = _gen(seed)
    trend = torch.linspace(0, spread, n, dtype=torch.float64)
    return trend + torch.randn(rows, n, generator=g, dtype=torch.float64)


@check("online softmax", expects="a function online_softmax(x, block_size) returning a tensor shaped like x")
def check_online_softmax(fn):
    cases = [
        ("x (4, 10), block 3", _rising_rows(4, 10, 1), 3),
        ("x (4, 10), block 1", _rising_rows(4, 10, 2), 1),
        ("x (2, 3, 12), block 4", _rising_rows(6, 12, 3).reshape(2, 3, 12), 4),
        ("x (3, 7), block 16 (longer than the row)", _rising_rows(3, 7, 4), 16),
        ("x (2, 9) near ±1000, block 4", torch.tensor([[1000.0, 999, 998, 1001, 1000, 997, 1002, 1000, 1003],
                                                        [-1000.0, -999, -1001, -998, -1000, -997, -1002, -996, -999]],
                                                       dtype=torch.float64), 4),
        ("x (4, 10) float32, block 3", _rising_rows(4, 10, 5).float(), 3),
    ]
    for label, x, b in cases:
        out = as_tensor(call(fn, x, b), f"online_softmax(x, {b})")
        expected = torch.softmax(x, dim=-1)
        pitfalls = [
            (NO_MAX, lambda: _online_softmax_variant(x, b, "no_max")),
            (SUM_NOT_RESCALED, lambda: _online_softmax_variant(x, b, "sum")),
            (SUM_RESCALED_WRONG_WAY, lambda: _online_softmax_variant(x, b, "inverted")),
            (NO_FINAL_DIVISION, lambda: _online_softmax_variant(x, b, "division")),
            (TAIL_DROPPED, lambda: _online_softmax_variant(x, b, "tail")),
        ]
        tol = dict(atol=1e-5, rtol=1e-4) if x.dtype == torch.float64 else dict(atol=1e-5, rtol=1e-3)
        expect_close(out, expected, f"online_softmax(x, {b})", case=label, pitfalls=pitfalls, **tol)
    x = _rising_rows(3, 10, 6)
    _, watch, _ = _watched(fn, x, 4)
    if watch.ops & {"_softmax", "_log_softmax", "_safe_softmax", "softmax", "log_softmax"}:
        fail(CALLS_SOFTMAX)
    return f"matches torch.softmax on {len(cases)} cases (block sizes 1…16, lengths not a multiple of the block, ±1000)"


# ---------------------------------------------------------------------------------------------
# tiled attention


def _qkv(shape_q: tuple[int, ...], m: int, seed: int, dtype=torch.float64, spread: float = 2.0):
    """q, k, v whose later keys tend to score higher: the running max changes from block to block."""
    g = _gen(seed)
    *lead, n, d = shape_q
    q = torch.randn(*lead, n, d, generator=g, dtype=torch.float64) + 1.0
    k = torch.randn(*lead, m, d, generator=g, dtype=torch.float64)
    k = k + torch.linspace(0, spread, m, dtype=torch.float64)[:, None]
    v = torch.randn(*lead, m, d + 1, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _attention_pitfalls(q, k, v, b, causal):
    def variant(mistake):
        return lambda: _tiled_variant(q.double(), k.double(), v.double(), b, causal=causal, mistake=mistake)

    common = [
        (SUM_NOT_RESCALED, variant("sum")),
        (ACC_NOT_RESCALED, variant("acc")),
        (NEITHER_RESCALED, variant("neither")),
        (NO_FINAL_DIVISION_ATTN, variant("division")),
        (KEY_TAIL_DROPPED, variant("k_tail")),
        (QUERY_TAIL_DROPPED, variant("q_tail_zero")),
        (QUERY_TAIL_DROPPED, variant("q_tail_short")),
        (NO_SCALE, variant("no_scale")),
        (SCALE_BY_D, variant("scale_d")),
    ]
    if not causal:
        return common
    return [
        (NOT_CAUSAL, variant("not_causal")),
        (DIAGONAL_SKIPPED, variant("skip_diag")),
        (DIAGONAL_SKIPPED, variant("skip_diag_zero")),
        (ABOVE_KEPT_UNMASKED, variant("above_unmasked_all")),
        (ABOVE_KEPT_UNMASKED, variant("above_unmasked_next")),
        (DIAGONAL_NOT_MASKED, variant("diag_unmasked")),
        (MASK_EXCLUDES_SELF, variant("excl_self")),
        (MASK_ONE_AHEAD, variant("one_ahead")),
        (LOCAL_MASK, variant("local_mask")),
    ] + common


def _check_attention_cases(fn, name: str, cases, causal: bool) -> None:
    for label, (q, k, v), b in cases:
        out = as_tensor(call(fn, q, k, v, b), f"{name}(q, k, v, {b})")
        if out.shape[:-1] == q.shape[:-1] and out.shape[-1] == q.shape[-1] != v.shape[-1]:
            fail(f"{name}(q, k, v, {b}) ({label}) has shape {tuple(out.shape)}, expected "
                 f"{tuple(q.shape[:-1]) + (v.shape[-1],)}: " + OUTPUT_WIDTH.format(dv=v.shape[-1], d=q.shape[-1]))
        expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
        tol = dict(atol=1e-6, rtol=1e-5) if q.dtype == torch.float64 else dict(atol=2e-5, rtol=1e-3)
        expect_close(out, expected, f"{name}(q, k, v, {b})", case=label,
                     pitfalls=_attention_pitfalls(q, k, v, b, causal), **tol)


def _check_work(fn, name: str, causal: bool) -> None:
    """Right values; now the way they were computed: no fused attention, no full score matrix."""
    n, d, b = 64, 8, 8
    q, k, v = _qkv((2, n, d), n, 40)
    _, watch, flops = _watched(fn, q, k, v, b, count_flops=causal)
    if any("scaled_dot_product" in op or "flash_attention" in op or "efficient_attention" in op
           for op in watch.ops):
        fail(CALLS_SDPA)
    full = [s for s in watch.shapes if s[-2:] == (n, n)]
    if full:
        fail(FULL_SCORES.format(shape=full[0]))
    if causal and flops > 0:
        tiles, batch, dv = n // b, q.shape[0], v.shape[-1]
        per_tile = batch * (2.0 * b * b * d + 2.0 * b * b * dv)  # one tile's QKᵀ and PV products
        needed = per_tile * tiles * (tiles + 1) / 2
        everything = per_tile * tiles * tiles
        if flops > (needed + everything) / 2:
            fail(ABOVE_COMPUTED.format(counted=flops, needed=needed))


@check("tiled attention", expects="a function tiled_attention(q, k, v, block_size) returning a tensor (..., N, Dv)")
def check_tiled_attention(fn):
    cases = [
        ("q, k (10, 4), v (10, 5), block 4", _qkv((10, 4), 10, 11), 4),
        ("q, k (2, 3, 37, 8), block 16", _qkv((2, 3, 37, 8), 37, 12), 16),
        ("q, k (12, 4), block 1", _qkv((12, 4), 12, 13), 1),
        ("q, k (9, 4), block 32 (longer than the sequence)", _qkv((9, 4), 9, 14), 32),
        ("q (7, 4), k (13, 4): more keys than queries, block 4", _qkv((7, 4), 13, 15), 4),
        ("q, k (2, 24, 8) float32, block 8", _qkv((2, 24, 8), 24, 16, dtype=torch.float32), 8),
    ]
    _check_attention_cases(fn, "tiled_attention", cases, causal=False)
    _check_work(fn, "tiled_attention", causal=False)
    return f"matches F.scaled_dot_product_attention on {len(cases)} cases (blocks 1…32, N not a multiple of the block, M ≠ N), tile by tile"


@check("causal tiled attention",
       expects="a function causal_tiled_attention(q, k, v, block_size) returning a tensor (..., N, Dv)")
def check_causal_tiled_attention(fn):
    cases = [
        ("q, k (10, 4), block 4", _qkv((10, 4), 10, 21), 4),
        ("q, k (2, 3, 37, 8), block 16", _qkv((2, 3, 37, 8), 37, 22), 16),
        ("q, k (12, 4), block 1", _qkv((12, 4), 12, 23), 1),
        ("q, k (10, 4), block 5 (N a multiple of the block)", _qkv((10, 4), 10, 24), 5),
        ("q, k (9, 4), block 32 (longer than the sequence)", _qkv((9, 4), 9, 25), 32),
        ("q, k (2, 24, 8) float32, block 8", _qkv((2, 24, 8), 24, 26, dtype=torch.float32), 8),
    ]
    _check_attention_cases(fn, "causal_tiled_attention", cases, causal=True)
    _check_work(fn, "causal_tiled_attention", causal=True)
    return f"matches causal F.scaled_dot_product_attention on {len(cases)} cases and skips the blocks above the diagonal"
