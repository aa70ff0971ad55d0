"""Checks of notebook 09 (attn_course.checks.fast): every wrong answer is rejected and named, every right
one accepted, on record → replay.

The learners' answers below are written independently of the check's own variants of the loop
(:class:`~attn_course.checks.fast.Pass`, :class:`~attn_course.checks.fast.Loop`): each is code a learner
could type. Right answers use other loop orders, torch.split, a running log-sum-exp, einsum, float64
inside, a −1e9 fill, a per-tile triu mask…; wrong ones make one mistake each.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attn_course.checks import fast as cf
from attn_course.checks.fast import check_causal_tiled_attention, check_online_softmax, check_tiled_attention
from attn_course.checks.compare import same
from attn_course.checks.result import Status
from tests.checks.fast_right_answers import RIGHT as AUDITED
from tests.checks.test_voice import assert_voice

pytestmark = pytest.mark.filterwarnings("ignore:The use of `x.T`:UserWarning")  # one learner's answer uses k.T


# ============================================================================ online softmax: learners
def os_ref(x, block_size=1):
    n = x.shape[-1]
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for start in range(0, n, block_size):
        block = x[..., start:start + block_size]
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(block - m_new).sum(dim=-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / l


def os_split(x, block_size=1):
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for blk in torch.split(x, block_size, dim=-1):
        new = torch.max(m, blk.max(dim=-1, keepdim=True).values)
        l = torch.exp(m - new) * l + torch.exp(blk - new).sum(-1, keepdim=True)
        m = new
    return torch.exp(x - m) / l


def os_logsumexp(x, block_size=1):  # a running log-sum-exp instead of (m, l)
    lse = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    for s in range(0, x.shape[-1], block_size):
        lse = torch.logaddexp(lse, torch.logsumexp(x[..., s:s + block_size], dim=-1, keepdim=True))
    return torch.exp(x - lse)


def os_while_first_block(x, block_size=1):  # state starts from the first block, while loop
    n, i, m, l = x.shape[-1], 0, None, None
    while i < n:
        blk = x[..., i:i + block_size]
        bm = blk.amax(-1, keepdim=True)
        if m is None:
            m, l = bm, torch.exp(blk - bm).sum(-1, keepdim=True)
        else:
            new = torch.maximum(m, bm)
            l = l * torch.exp(m - new) + torch.exp(blk - new).sum(-1, keepdim=True)
            m = new
        i += block_size
    return torch.exp(x - m) / l


def os_float64_inside(x, block_size=1):
    return os_ref(x.double(), block_size).to(x.dtype)


def os_numpy(x, block_size=1):  # NumPy inside (float64), a NumPy array of x's dtype out
    a = np.asarray(x, dtype=np.float64)
    m = np.full(a.shape[:-1] + (1,), -np.inf)
    l = np.zeros_like(m)
    for s in range(0, a.shape[-1], block_size):
        blk = a[..., s:s + block_size]
        new = np.maximum(m, blk.max(-1, keepdims=True))
        l = l * np.exp(m - new) + np.exp(blk - new).sum(-1, keepdims=True)
        m = new
    return (np.exp(a - m) / l).astype(np.asarray(x).dtype)


def _os(x, b, *, factor="shrink", newmax="running", final="ok", stop=None, end=lambda s, b: s + b, m0=-math.inf):
    n = x.shape[-1]
    m = torch.full(x.shape[:-1] + (1,), m0, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s in range(0, n if stop is None else stop(n, b), b):
        blk = x[..., s:end(s, b)]
        bm = blk.amax(-1, keepdim=True)
        new = {"running": torch.maximum(m, bm), "block": bm, "zero": torch.zeros_like(bm)}[newmax]
        f = {"shrink": torch.exp(m - new), "none": 1.0, "grow": torch.exp(new - m),
             "grow_guard": torch.where(torch.isinf(m), torch.ones_like(m), torch.exp(new - m))}[factor]
        l = l * f + torch.exp(blk - new).sum(-1, keepdim=True)
        m = new
    if final == "nodiv":
        return torch.exp(x - m)
    if final == "raw":
        return torch.exp(x) / l
    return torch.exp(x - m) / l


def os_no_keepdim(x, block_size=1):
    m = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s in range(0, x.shape[-1], block_size):
        blk = x[..., s:s + block_size]
        new = torch.maximum(m, blk.amax(-1, keepdim=True))
        l = l * torch.exp(m - new) + torch.exp(blk - new).sum(-1, keepdim=True)
        m = new
    return torch.exp(x - m) / l


def os_global_max(x, block_size=1):  # two passes: the row's maximum first
    m = x.amax(-1, keepdim=True)
    l = sum(torch.exp(x[..., s:s + block_size] - m).sum(-1, keepdim=True) for s in range(0, x.shape[-1], block_size))
    return torch.exp(x - m) / l


def os_two_pass_blocks(x, block_size=1):  # two passes, both in blocks: every block's maximum, then the sums
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    for s in range(0, x.shape[-1], block_size):
        m = torch.maximum(m, x[..., s:s + block_size].amax(-1, keepdim=True))
    l = torch.zeros_like(m)
    for s in range(0, x.shape[-1], block_size):
        l = l + torch.exp(x[..., s:s + block_size] - m).sum(-1, keepdim=True)
    return torch.exp(x - m) / l


def os_float32_state(x, block_size=1):  # m and l made without dtype= (float32), kept so by in-place updates
    m = torch.full(x.shape[:-1] + (1,), -math.inf)
    l = torch.zeros(x.shape[:-1] + (1,))
    for s in range(0, x.shape[-1], block_size):
        block = x[..., s:s + block_size]
        m_new = torch.maximum(m, block.amax(-1, keepdim=True))
        l.mul_(torch.exp(m - m_new)).add_(torch.exp(block - m_new).sum(-1, keepdim=True))
        m.copy_(m_new)
    return torch.exp(x - m) / l


def os_state(x, block_size):  # the running (m, l) after the last block
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s in range(0, x.shape[-1], block_size):
        blk = x[..., s:s + block_size]
        new = torch.maximum(m, blk.amax(-1, keepdim=True))
        l, m = l * torch.exp(m - new) + torch.exp(blk - new).sum(-1, keepdim=True), new
    return m, l


def os_allmax(x, block_size):  # the block's maximum over all its rows (amax without dim)
    m = torch.tensor(-math.inf, dtype=x.dtype)
    l = torch.zeros(x.shape[:-1] + (1,), dtype=x.dtype)
    for s in range(0, x.shape[-1], block_size):
        blk = x[..., s:s + block_size]
        new = torch.maximum(m, blk.max())
        l, m = l * torch.exp(m - new) + torch.exp(blk - new).sum(-1, keepdim=True), new
    return torch.exp(x - m) / l


# one pass in other styles: rows one after the other or side by side, blocks backwards, state updated in place
# (and a block's maximum looked at twice), a running log-sum-exp, unfold; the output joined or written block by block
def os_rows_one_by_one(x, block_size=1):  # a 1-D loop per row, rows one after the other, a preallocated output
    flat = x.reshape(-1, x.shape[-1])
    out = torch.empty_like(flat)
    for r in range(flat.shape[0]):
        row, m, l = flat[r], torch.tensor(-math.inf, dtype=x.dtype), torch.tensor(0.0, dtype=x.dtype)
        for s in range(0, row.shape[0], block_size):
            blk = row[s:s + block_size]
            new = torch.maximum(m, blk.max())
            l, m = l * torch.exp(m - new) + torch.exp(blk - new).sum(), new
        out[r] = torch.exp(row - m) / l
    return out.reshape(x.shape)


def os_rows_side_by_side(x, block_size=1):  # blocks outside, rows inside: every row's maximum, then every row's sum
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    m = [torch.tensor(-math.inf, dtype=x.dtype)] * rows
    l = [torch.tensor(0.0, dtype=x.dtype)] * rows
    for s in range(0, flat.shape[1], block_size):
        new = [torch.maximum(m[r], flat[r, s:s + block_size].amax()) for r in range(rows)]
        l = [l[r] * torch.exp(m[r] - new[r]) + torch.exp(flat[r, s:s + block_size] - new[r]).sum() for r in range(rows)]
        m = new
    return (torch.exp(flat - torch.stack(m)[:, None]) / torch.stack(l)[:, None]).reshape(x.shape)


def os_reversed_blocks_cat(x, block_size=1):  # blocks from the last to the first; the output built block by block
    n = x.shape[-1]
    starts = list(range(0, n, block_size))[::-1]
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s in starts:
        blk = x[..., s:s + block_size]
        bm = torch.max(blk, dim=-1, keepdim=True).values
        new = torch.maximum(m, bm)
        l = l * torch.exp(m - new) + torch.exp(blk - bm).sum(-1, keepdim=True) * torch.exp(bm - new)
        m = new
    return torch.cat([torch.exp(x[..., s:s + block_size] - m) / l for s in range(0, n, block_size)], dim=-1)


def os_inplace_state_twice(x, block_size=1):  # m and l updated in place; the block's maximum taken twice
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    s = 0
    while s < x.shape[-1]:
        blk = x[..., s:s + block_size].clone()
        if bool((blk.amax(-1, keepdim=True) > m).any()):  # a look before the update: the same block again
            pass
        new = torch.maximum(m, blk.amax(-1, keepdim=True))
        l.mul_(torch.exp(m - new)).add_(torch.exp(blk - new).sum(-1, keepdim=True))
        m.copy_(new)
        s += block_size
    return torch.exp(x - m) / l


def os_logaddexp(x, block_size=1):  # a running log-sum-exp from each block's maximum and sum, float64 inside
    x64 = x.to(torch.float64)
    lse = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=torch.float64)
    for blk in x64.split(block_size, dim=-1):
        bm = blk.amax(-1, keepdim=True)
        lse = torch.logaddexp(lse, bm + torch.log(torch.sum(torch.exp(blk - bm), -1, keepdim=True)))
    return torch.exp(x64 - lse).to(x.dtype)


def os_unfold(x, block_size=1):  # the full blocks as a view (unfold), then the last, shorter one
    n = x.shape[-1]
    full = n - n % block_size
    blocks = (list(x[..., :full].unfold(-1, block_size, block_size).unbind(-2)) if full else []) + ([x[..., full:]] if full < n else [])
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for blk in blocks:
        new = torch.maximum(m, blk.amax(-1, keepdim=True))
        l = l * torch.exp(m - new) + torch.exp(blk - new).sum(-1, keepdim=True)
        m = new
    out = torch.empty_like(x)
    for s in range(0, n, block_size):  # the output written block by block
        out[..., s:s + block_size] = torch.exp(x[..., s:s + block_size] - m) / l
    return out


# two passes in disguise: the maxima read in a first loop (or all at once), then the online loop or the sums
def os_max_loop_first(x, block_size=1):  # a first loop over the blocks for the maximum, then the online loop
    top = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    for s in range(0, x.shape[-1], block_size):
        top = torch.maximum(top, x[..., s:s + block_size].amax(-1, keepdim=True))
    m = torch.full_like(top, -math.inf)
    l = torch.zeros_like(m)
    for s in range(0, x.shape[-1], block_size):
        blk = x[..., s:s + block_size]
        new = torch.maximum(m, blk.amax(-1, keepdim=True))
        l = l * torch.exp(m - new) + torch.exp(blk - new).sum(-1, keepdim=True)
        m = new
    return torch.exp(x - top) / (l * torch.exp(m - top))


def os_two_pass_decoy_sums(x, block_size=1):  # two passes; a throwaway sum after each maximum of the first
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    for s in range(0, x.shape[-1], block_size):
        m = torch.maximum(m, x[..., s:s + block_size].amax(-1, keepdim=True))
        x[..., s:s + block_size].sum(-1)
    l = torch.zeros_like(m)
    for s in range(0, x.shape[-1], block_size):
        l = l + torch.exp(x[..., s:s + block_size] - m).sum(-1, keepdim=True)
    return torch.exp(x - m) / l


def os_block_maxima_at_once(x, block_size=1):  # every block's maximum in one reduction (pad, unfold), then the sums
    n = x.shape[-1]
    maxima = F.pad(x, (0, -n % block_size), value=-math.inf).unfold(-1, block_size, block_size).amax(-1)
    m = maxima[..., :1]
    for j in range(1, maxima.shape[-1]):
        m = torch.maximum(m, maxima[..., j:j + 1])
    l = sum(torch.exp(x[..., s:s + block_size] - m).sum(-1, keepdim=True) for s in range(0, n, block_size))
    return torch.exp(x - m) / l


def os_sums_by_ones(x, block_size=1):  # the one loop, each block's sum written as a product with ones
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s in range(0, x.shape[-1], block_size):
        blk = x[..., s:s + block_size]
        m_new = torch.maximum(m, blk.amax(-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(blk - m_new) @ torch.ones(blk.shape[-1], 1, dtype=x.dtype)
        m = m_new
    return torch.exp(x - m) / l


def os_two_loops_ones(x, block_size=1):  # two passes: the block maxima with amax, then the sums as e @ ones
    n = x.shape[-1]
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    for s in range(0, n, block_size):
        m = torch.maximum(m, x[..., s:s + block_size].amax(-1, keepdim=True))
    l = torch.zeros_like(m)
    for s in range(0, n, block_size):
        e = torch.exp(x[..., s:s + block_size] - m)
        l = l + e @ torch.ones(e.shape[-1], 1, dtype=x.dtype)
    return torch.exp(x - m) / l


def _os_sums_after(x, b, m):  # the sums of the blocks, after a maximum m found some other way
    l = torch.zeros_like(m)
    for s in range(0, x.shape[-1], b):
        l = l + torch.exp(x[..., s:s + b] - m).sum(-1, keepdim=True)
    return torch.exp(x - m) / l


def os_amin_first(x, block_size=1):  # two passes, the maxima written as −min(−x)
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    for s in range(0, x.shape[-1], block_size):
        m = torch.maximum(m, -(-x[..., s:s + block_size]).amin(-1, keepdim=True))
    return _os_sums_after(x, block_size, m)


def os_topk_first(x, block_size=1):  # two passes, the block maxima with topk
    maxima = [x[..., s:s + block_size].topk(1, dim=-1).values for s in range(0, x.shape[-1], block_size)]
    return _os_sums_after(x, block_size, torch.stack(maxima).amax(0))


def os_pool_first(x, block_size=1):  # every block's maximum at once by max pooling, then the online loop
    n = x.shape[-1]
    maxima = F.max_pool1d(x.reshape(-1, 1, n), block_size, block_size, ceil_mode=True).reshape(*x.shape[:-1], -1)
    m, l = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype), 0
    for i, s in enumerate(range(0, n, block_size)):
        m_new = torch.maximum(m, maxima[..., i:i + 1])
        l = l * torch.exp(m - m_new) + torch.exp(x[..., s:s + block_size] - m_new).sum(-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / l


def os_copy_two_loops(x, block_size=1):  # two passes, the second over a copy of x (copy_), throwaway sums first
    buf = torch.empty_like(x)
    buf.copy_(x)
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    for s in range(0, x.shape[-1], block_size):
        m = torch.maximum(m, x[..., s:s + block_size].amax(-1, keepdim=True))
        torch.zeros(x[..., s:s + block_size].shape, dtype=x.dtype).sum(-1)
    return _os_sums_after(buf, block_size, m)


def os_merged_at_end(x, block_size=1):  # each block's (max, sum) kept in lists, merged with cat and amax after
    ms, ls = [], []
    for s in range(0, x.shape[-1], block_size):
        blk = x[..., s:s + block_size]
        ms.append(blk.amax(-1, keepdim=True))
        ls.append(torch.exp(blk - ms[-1]).sum(-1, keepdim=True))
    big = torch.cat(ms, -1)
    m = big.amax(-1, keepdim=True)
    return torch.exp(x - m) / (torch.cat(ls, -1) * torch.exp(big - m)).sum(-1, keepdim=True)


def os_pipelined(x, block_size=1):  # the next block's maximum taken before this block's sum
    starts = list(range(0, x.shape[-1], block_size))
    m = x[..., :block_size].amax(-1, keepdim=True)
    l = torch.zeros_like(m)
    for i, s in enumerate(starts):
        m_next = m
        if i + 1 < len(starts):
            m_next = torch.maximum(m, x[..., starts[i + 1]:starts[i + 1] + block_size].amax(-1, keepdim=True))
        l = l * torch.exp(m - m_next) + torch.exp(x[..., s:s + block_size] - m_next).sum(-1, keepdim=True)
        m = m_next
    return torch.exp(x - m) / l


def os_written_over_x(x, block_size=1):  # the right loop, then the result computed in x's own storage
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(block - m_new).sum(dim=-1, keepdim=True)
        m = m_new
    return x.sub_(m).exp_().div_(l)


def os_copied_into_x(x, block_size=1):  # the right result, copied into x and x returned
    x.copy_(os_ref(x, block_size))
    return x


OS_RIGHT = {"reference": os_ref, "torch.split": os_split, "running logsumexp": os_logsumexp,
            "while, first block": os_while_first_block, "float64 inside": os_float64_inside, "numpy": os_numpy,
            "rows one by one, preallocated output": os_rows_one_by_one, "rows side by side": os_rows_side_by_side,
            "blocks backwards, output joined with torch.cat": os_reversed_blocks_cat,
            "state in place, a block's maximum taken twice": os_inplace_state_twice,
            "running logaddexp of block maxima and sums, float64": os_logaddexp,
            "unfold, then the last block": os_unfold, "sums as products with ones": os_sums_by_ones}

# name -> (answer, words the diagnosis must contain)
OS_WRONG = {
    "no max": (lambda x, b=1: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True), "no running maximum"),
    "sum not rescaled": (lambda x, b=1: _os(x, b, factor="none"), "running sum not rescaled"),
    "rescaled by exp(m_new - m_old), guarded": (lambda x, b=1: _os(x, b, factor="grow_guard"), "exp(m_new − m_old)"),
    "rescaled by exp(m_new - m_old)": (lambda x, b=1: _os(x, b, factor="grow"), "NaN from the first block on"),
    "per-block max": (lambda x, b=1: _os(x, b, newmax="block"), "per-block maximum instead of a running one"),
    "max started at 0": (lambda x, b=1: _os(x, b, m0=0.0), "running max started at 0"),
    "no final division": (lambda x, b=1: _os(x, b, final="nodiv"), "final division missing"),
    "exp(x) at the end": (lambda x, b=1: _os(x, b, final="raw"), "exp(x) instead of exp(x − m)"),
    "last partial block dropped": (lambda x, b=1: _os(x, b, stop=lambda n, b: n - n % b), "last, shorter block dropped"),
    "last block always dropped": (lambda x, b=1: _os(x, b, stop=lambda n, b: n - b), "last block dropped"),
    "slice one short": (lambda x, b=1: _os(x, b, end=lambda s, b: s + b - 1), "each block one column short"),
    "slice one long": (lambda x, b=1: _os(x, b, end=lambda s, b: s + b + 1), "blocks overlap by one column"),
    "softmax per block": (lambda x, b=1: torch.cat([torch.softmax(x[..., s:s + b], -1)
                                                     for s in range(0, x.shape[-1], b)], -1),
                          "each block normalised on its own"),
    "one max over the whole block": (lambda x, b=1: os_allmax(x, b), "one maximum for every row of a block"),
    "no exp at the end": (lambda x, b=1: (lambda m, l: (x - m) / l)(*os_state(x, b)), "exp missing in the last step"),
    "log at the end": (lambda x, b=1: (lambda m, l: torch.log(x - m) / l)(*os_state(x, b)),
                       "log instead of exp in the last step"),
    "returns l": (lambda x, b=1: os_state(x, b)[1], "one value per row instead of the softmax"),
    "torch.softmax": (lambda x, b=1: torch.softmax(x, -1), "calls torch.softmax"),
    "F.log_softmax": (lambda x, b=1: F.log_softmax(x, -1).exp(), "calls torch.softmax"),
    "global max first": (os_global_max, "the whole row"),
    "global max first, in blocks": (os_two_pass_blocks, "two passes over x: every maximum before any sum"),
    "a first loop for the maximum, then the online loop": (os_max_loop_first, "reads x twice: goes back to blocks"),
    "two passes, a throwaway sum after each maximum": (os_two_pass_decoy_sums, "reads x twice: goes back to blocks"),
    "every block's maximum at once, then the sums": (os_block_maxima_at_once, "reads x twice: goes back to blocks"),
    "float64 result for float32 input": (lambda x, b=1: os_ref(x.double(), b), "result in float64 for float32 input"),
    "float32 running state, updated in place": (os_float32_state, "float64 input, float32 precision"),
    "float32 result via .float()": (lambda x, b=1: os_ref(x, b).float(), "a conversion to float32 (.float()"),
    "result written over x with sub_, exp_, div_": (os_written_over_x, "x changed in place"),
    "result copied into x with copy_": (os_copied_into_x, "x changed in place"),
    "renormalised over the whole row": (lambda x, b=1: (lambda e: e / e.sum(-1, keepdim=True))(os_ref(x, b)),
                                        "the whole row"),
    "block_size ignored (1)": (lambda x, b=1: os_ref(x, 1), "block_size not used"),
    "block_size ignored (64)": (lambda x, b=1: os_ref(x, 64), "block_size not used"),
    "keepdim missing": (os_no_keepdim, "keepdim=True"),
    "float16 result": (lambda x, b=1: os_ref(x, b).half(), "float16"),
    "returns a tuple": (lambda x, b=1: (os_ref(x, b), None), "returned a Python tuple"),
    "two loops, the sums as e @ ones": (os_two_loops_ones, "two passes over x: every maximum before any sum"),
    "no blocks: cummax and cumsum": (lambda x, b=1: (lambda e: e / e.cumsum(-1)[..., -1:])(
        torch.exp(x - x.cummax(-1).values[..., -1:])), "block_size not used"),
    "no blocks: topk and einsum": (lambda x, b=1: (lambda e: e / torch.einsum("...i->...", e)[..., None])(
        torch.exp(x - x.topk(1, -1).values)), "block_size not used"),
    "no blocks: sort and @ ones": (lambda x, b=1: (lambda e: e / (e @ torch.ones(x.shape[-1], 1, dtype=x.dtype)))(
        torch.exp(x - x.sort(-1).values[..., -1:])), "block_size not used"),
    "row max by cummax, sums in blocks": (lambda x, b=1: _os_sums_after(x, b, x.cummax(-1).values[..., -1:]),
                                          "the whole row"),
    "row max by max pooling, sums in blocks": (lambda x, b=1: _os_sums_after(
        x, b, F.max_pool1d(x.reshape(-1, 1, x.shape[-1]), x.shape[-1]).reshape(*x.shape[:-1], 1)), "the whole row"),
    "block maxima as −min(−x) first": (os_amin_first, "two passes over x: every maximum before any sum"),
    "block maxima by topk first": (os_topk_first, "two passes over x: every maximum before any sum"),
    "every block's maximum by max pooling, then the loop": (os_pool_first, "reads x twice: goes back to blocks"),
    "second loop over a copy_ of x": (os_copy_two_loops, "reads x twice: goes back to blocks"),
    "block results merged at the end": (os_merged_at_end, "block results merged at the end instead of a running m"),
    "next block's maximum before this block's sum": (os_pipelined, "each block's sum taken after the next block's"),
}


# ============================================================================ tiled attention: learners
def ta_ref(q, k, v, block_size=64):
    n, m_keys, scale = q.shape[-2], k.shape[-2], 1.0 / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, block_size):
        q_blk = q[..., qs:qs + block_size, :]
        row_max = torch.full(q_blk.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        row_sum = torch.zeros_like(row_max)
        acc = torch.zeros(q_blk.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, m_keys, block_size):
            scores = q_blk @ k[..., ks:ks + block_size, :].transpose(-2, -1) * scale
            new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))
            correction = torch.exp(row_max - new_max)
            probs = torch.exp(scores - new_max)
            row_sum = row_sum * correction + probs.sum(dim=-1, keepdim=True)
            acc = acc * correction + probs @ v[..., ks:ks + block_size, :]
            row_max = new_max
        out[..., qs:qs + block_size, :] = acc / row_sum
    return out


def attn(q, k, v, b, causal=False, *, scale=None, m0=-math.inf, sum_f="shrink", acc_f="shrink", newmax="running",
         final="div", q_stop=None, k_range=None, k_end=lambda s, b: s + b, hide=lambda r, c, qs, ks: c > r,
         masked=lambda qs, qe, ks, ke: ke - 1 > qs, fill=-math.inf, tile_max="row", pv="plain", zero_guard=False, prob=None, update_max=True):
    """A learner's tiled loop in which each of the options below can go wrong."""
    n, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1 / math.sqrt(d) if scale is None else scale(q, k, v, b)
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n if q_stop is None else q_stop(n, b), b):
        qe = min(qs + b, n)
        qb = q[..., qs:qe, :]
        m = torch.full(qb.shape[:-1] + (1,), m0, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in (k_range(n, nk, b, qs, qe) if k_range else range(0, qe if causal else nk, b)):
            ke = min(k_end(ks, b), nk)
            if ke <= ks:
                continue
            s = qb @ k[..., ks:ke, :].transpose(-2, -1) * scale
            if causal and masked(qs, qe, ks, ke):
                s = s.masked_fill(hide(torch.arange(qs, qe)[:, None], torch.arange(ks, ke)[None, :], qs, ks), fill)
            tm = s.amax(-1, keepdim=True) if tile_max == "row" else s.amax(dim=(-2, -1), keepdim=True)
            new = {"running": torch.maximum(m, tm), "block": tm, "zero": torch.zeros_like(tm)}[newmax]

            def f(kind):
                if callable(kind):
                    return kind(m, new)
                return {"shrink": torch.exp(m - new), "none": torch.ones_like(new), "grow": torch.exp(new - m),
                        "grow_guard": torch.where(torch.isinf(m), torch.ones_like(m), torch.exp(new - m))}[kind]

            p = torch.exp(s - new) if prob is None else prob(s, new)
            l_new = l * f(sum_f) + p.sum(-1, keepdim=True)
            if pv == "overwrite":
                acc = p @ v[..., ks:ke, :]
            elif pv == "add the correction":
                acc = f(acc_f) + p @ v[..., ks:ke, :]
            elif pv == "v without p":
                acc = acc * f(acc_f) + v[..., ks:ke, :]
            elif pv == "tile softmax":
                acc = acc * f(acc_f) + (p / p.sum(-1, keepdim=True)) @ v[..., ks:ke, :]
            elif pv == "normalise each tile":
                acc = (acc * f(acc_f) + p @ v[..., ks:ke, :]) / l_new
            else:
                acc = acc * f(acc_f) + p @ v[..., ks:ke, :]
            l, m = l_new, (new if update_max else m)
        res = acc / l if final == "div" else acc
        if zero_guard:
            res = torch.where(l > 0, acc / torch.where(l > 0, l, torch.ones_like(l)), torch.zeros_like(acc))
        out[..., qs:qe, :] = res
    return out


def T(**kw):
    return lambda q, k, v, b=64: attn(q, k, v, b, **kw)


def C(**kw):
    return lambda q, k, v, b=64: attn(q, k, v, b, True, **kw)


def ta_key_outer(q, k, v, block_size=64):  # FlashAttention-1's loop order: keys outside, queries inside
    n, nk = q.shape[-2], k.shape[-2]
    scale = q.shape[-1] ** -0.5
    m = torch.full(q.shape[:-1] + (1,), float("-inf"), dtype=q.dtype)
    l = torch.zeros_like(m)
    acc = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for ks in range(0, nk, block_size):
        kb, vb = k[..., ks:ks + block_size, :], v[..., ks:ks + block_size, :]
        for qs in range(0, n, block_size):
            sl = slice(qs, qs + block_size)
            s = torch.einsum("...id,...jd->...ij", q[..., sl, :], kb) * scale
            new = torch.maximum(m[..., sl, :], s.amax(-1, keepdim=True))
            c = torch.exp(m[..., sl, :] - new)
            p = torch.exp(s - new)
            l[..., sl, :] = l[..., sl, :] * c + p.sum(-1, keepdim=True)
            acc[..., sl, :] = acc[..., sl, :] * c + p @ vb
            m[..., sl, :] = new
    return acc / l


def ta_lse(q, k, v, block_size=64):  # a running log-sum-exp, torch.split, mT
    scale = 1 / math.sqrt(q.shape[-1])
    outs = []
    for qb in torch.split(q, block_size, dim=-2):
        lse = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        o = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for kb, vb in zip(torch.split(k, block_size, dim=-2), torch.split(v, block_size, dim=-2)):
            s = qb @ kb.mT * scale
            new = torch.logaddexp(lse, torch.logsumexp(s, -1, keepdim=True))
            o = o * torch.exp(lse - new) + torch.exp(s - new) @ vb
            lse = new
        outs.append(o)
    return torch.cat(outs, -2)


def ta_first_tile(q, k, v, block_size=64):  # the state starts from the first tile, q scaled once
    n, nk = q.shape[-2], k.shape[-2]
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, block_size):
        qb = q[..., qs:qs + block_size, :] / math.sqrt(q.shape[-1])
        m = l = acc = None
        for ks in range(0, nk, block_size):
            s = qb @ k[..., ks:ks + block_size, :].transpose(-1, -2)
            tm = s.amax(-1, keepdim=True)
            if m is None:
                m = tm
                p = torch.exp(s - m)
                l, acc = p.sum(-1, keepdim=True), p @ v[..., ks:ks + block_size, :]
                continue
            new = torch.maximum(m, tm)
            c, p = torch.exp(m - new), torch.exp(s - new)
            l, acc, m = c * l + p.sum(-1, keepdim=True), c * acc + p @ v[..., ks:ks + block_size, :], new
        out[..., qs:qs + block_size, :] = acc / l
    return out


def ta_row_block(q, k, v, b=64):  # a block of queries against all keys at once
    outs = [torch.softmax(q[..., s:s + b, :] @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1) @ v
            for s in range(0, q.shape[-2], b)]
    return torch.cat(outs, -2)


def ta_two_pass(q, k, v, b=64, causal=False):  # the row maxima in a first pass over the tiles
    n, nk, scale = q.shape[-2], k.shape[-2], 1 / math.sqrt(q.shape[-1])
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, b):
        qe = min(qs + b, n)
        qb = q[..., qs:qe, :]

        def tile(ks):
            s = qb @ k[..., ks:ks + b, :].transpose(-2, -1) * scale
            if causal:
                s = s.masked_fill(torch.arange(ks, min(ks + b, nk))[None] > torch.arange(qs, qe)[:, None], -math.inf)
            return s

        stop = qe if causal else nk
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        for ks in range(0, stop, b):
            m = torch.maximum(m, tile(ks).amax(-1, keepdim=True))
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, stop, b):
            p = torch.exp(tile(ks) - m)
            l, acc = l + p.sum(-1, keepdim=True), acc + p @ v[..., ks:ks + b, :]
        out[..., qs:qe, :] = acc / l
    return out


def ta_garbage_tail(q, k, v, block_size=64):  # torch.empty output, last partial block never written
    n = q.shape[-2]
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype).fill_(7.0)
    full = n - n % block_size
    if full:
        out[..., :full, :] = ta_ref(q[..., :full, :], k, v, block_size)
    return out


def ta_out_width_q(q, k, v, block_size=64):
    out = torch.empty(q.shape, dtype=q.dtype)  # d_k columns, not d_v
    for qs in range(0, q.shape[-2], block_size):
        out[..., qs:qs + block_size, :] = ta_ref(q[..., qs:qs + block_size, :], k, v, block_size)
    return out


def ta_kT(q, k, v, block_size=64):
    n, nk, scale = q.shape[-2], k.shape[-2], 1.0 / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, block_size):
        qb = q[..., qs:qs + block_size, :]
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l, acc = torch.zeros_like(m), torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, nk, block_size):
            s = qb @ k[..., ks:ks + block_size, :].T * scale  # .T reverses every axis of a batched k
            new = torch.maximum(m, s.amax(-1, keepdim=True))
            c, p = torch.exp(m - new), torch.exp(s - new)
            l, acc, m = l * c + p.sum(-1, keepdim=True), acc * c + p @ v[..., ks:ks + block_size, :], new
        out[..., qs:qs + block_size, :] = acc / l
    return out


def ta_rows_to_dk(q, k, v, block_size=64):  # the query loop runs to q.shape[-1] (d_k), not n_q
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, min(q.shape[-1], q.shape[-2]), block_size):
        out[..., qs:qs + block_size, :] = ta_ref(q[..., qs:qs + block_size, :], k, v, block_size)
    return out


def ca_tile_positions(q, k, v, block_size=64):  # arange(k_end, k_start): an end below the start
    return attn(q, k, v, block_size, True, hide=lambda r, c, qs, ks: torch.arange(c.max() + 1, ks)[None] > r)


def ca_mask_as_scores(q, k, v, block_size=64):  # s = future: the mask itself took the place of the scores
    n = q.shape[-2]
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, block_size):
        qe = min(qs + block_size, n)
        m = torch.full((qe - qs, 1), -math.inf, dtype=q.dtype)
        l, acc = torch.zeros_like(m), torch.zeros(qe - qs, v.shape[-1], dtype=q.dtype)
        for ks in range(0, qe, block_size):
            ke = min(ks + block_size, n)
            s = torch.arange(ks, ke)[None, :] > torch.arange(qs, qe)[:, None]
            new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            c, p = torch.exp(m - new), torch.exp(s - new)
            l, acc, m = l * c + p.sum(-1, keepdim=True), acc * c + p @ v[..., ks:ke, :], new
        out[..., qs:qe, :] = acc / l
    return out


# one pass in other styles: while loops and a list of output blocks, logaddexp into a preallocated output, float64
# inside with a dict of outputs, the state updated in place
def ta_blocks_cat_while(q, k, v, block_size=64):  # while loops, a list of output blocks joined at the end
    n, nk, scale = q.shape[-2], k.shape[-2], 1 / math.sqrt(q.shape[-1])
    outs, qs = [], 0
    while qs < n:
        qb = q[..., qs:qs + block_size, :] * scale
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l, acc, ks = torch.zeros_like(m), torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype), 0
        while ks < nk:
            s = torch.matmul(qb, k[..., ks:ks + block_size, :].transpose(-2, -1))
            new = torch.maximum(m, s.max(dim=-1, keepdim=True).values)
            p, c = torch.exp(s - new), torch.exp(m - new)
            l, acc, m = c * l + torch.sum(p, -1, keepdim=True), c * acc + torch.matmul(p, v[..., ks:ks + block_size, :]), new
            ks += block_size
        outs.append(acc / l)
        qs += block_size
    return torch.cat(outs, dim=-2)


def ta_logaddexp_prealloc(q, k, v, block_size=64):  # a running log-sum-exp with torch.logaddexp, written in place
    n, nk = q.shape[-2], k.shape[-2]
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    kT = k.transpose(-2, -1).contiguous() / math.sqrt(q.shape[-1])  # all keys, transposed and scaled once
    for qs in range(0, n, block_size):
        qe = min(qs + block_size, n)
        lse = torch.full(q.shape[:-2] + (qe - qs, 1), -math.inf, dtype=q.dtype)
        for ks in range(0, nk, block_size):
            s = q[..., qs:qe, :] @ kT[..., :, ks:ks + block_size]
            new = torch.logaddexp(lse, torch.logsumexp(s, -1, keepdim=True))
            out[..., qs:qe, :] = out[..., qs:qe, :] * torch.exp(lse - new) + torch.exp(s - new) @ v[..., ks:ks + block_size, :]
            lse = new
    return out


def ta_float64_blocks(q, k, v, block_size=64):  # float64 inside, key blocks listed first (views), a dict of outputs
    q64, k64, v64 = q.double(), k.double(), v.double()
    kv = list(zip(k64.split(block_size, -2), v64.split(block_size, -2)))
    done = {}
    for i, qb in enumerate(q64.split(block_size, -2)):
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=torch.float64)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
        for kb, vb in kv:
            s = torch.einsum("...qd,...kd->...qk", qb, kb) / math.sqrt(q.shape[-1])
            new = torch.maximum(m, s.amax(-1, keepdim=True))
            c = torch.exp(m - new)
            p = torch.exp(s - new)
            l, acc, m = l * c + p.sum(-1, keepdim=True), acc * c + p @ vb, new
        done[i] = acc / l
    return torch.cat([done[i] for i in sorted(done)], -2).to(q.dtype)


def ta_inplace_state(q, k, v, block_size=64):  # m, l, acc updated in place, the last blocks shorter (min)
    n, nk, scale = q.shape[-2], k.shape[-2], q.shape[-1] ** -0.5
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, block_size):
        qe = min(qs + block_size, n)
        m = torch.full(q.shape[:-2] + (qe - qs, 1), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = out[..., qs:qe, :].zero_()
        for ks in range(0, nk, block_size):
            ke = min(ks + block_size, nk)
            s = (q[..., qs:qe, :] @ k[..., ks:ke, :].mT).mul_(scale)
            new = torch.maximum(m, s.amax(-1, keepdim=True))
            c = (m - new).exp_()
            s.sub_(new).exp_()
            l.mul_(c).add_(s.sum(-1, keepdim=True))
            acc.mul_(c).add_(s @ v[..., ks:ke, :])
            m = new
        acc.div_(l)
    return out


# right values, one pass of work, but every tile kept alive: the score matrix in pieces
def ta_keep_tiles(q, k, v, block_size=64):  # every score tile computed once and kept, then two passes over them
    n, nk, scale = q.shape[-2], k.shape[-2], q.shape[-1] ** -0.5
    tiles = {(qs, ks): q[..., qs:qs + block_size, :] @ k[..., ks:ks + block_size, :].transpose(-2, -1) * scale
             for qs in range(0, n, block_size) for ks in range(0, nk, block_size)}
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, block_size):
        row = [(ks, tiles[qs, ks]) for ks in range(0, nk, block_size)]
        m = torch.full(row[0][1].shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        for _, s in row:
            m = torch.maximum(m, s.amax(-1, keepdim=True))
        l, acc = 0, 0
        for ks, s in row:
            p = torch.exp(s - m)
            l, acc = l + p.sum(-1, keepdim=True), acc + p @ v[..., ks:ks + block_size, :]
        out[..., qs:qs + block_size, :] = acc / l
    return out


def ta_hoard_weights(q, k, v, block_size=64):  # the online loop, but every weight tile appended to a list
    kept = []
    n, nk, scale = q.shape[-2], k.shape[-2], q.shape[-1] ** -0.5
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, block_size):
        qb = q[..., qs:qs + block_size, :]
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l, acc = torch.zeros_like(m), torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, nk, block_size):
            s = qb @ k[..., ks:ks + block_size, :].transpose(-2, -1) * scale
            new = torch.maximum(m, s.amax(-1, keepdim=True))
            c, p = torch.exp(m - new), torch.exp(s - new)
            kept.append(p)
            l, acc, m = l * c + p.sum(-1, keepdim=True), acc * c + p @ v[..., ks:ks + block_size, :], new
        out[..., qs:qs + block_size, :] = acc / l
    return out


def ta_keep_flattened(q, k, v, block_size=64):  # the online loop, every score tile kept flattened, (…, b·b)
    kept, n, nk, scale = [], q.shape[-2], k.shape[-2], q.shape[-1] ** -0.5
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, block_size):
        qb = q[..., qs:qs + block_size, :]
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l, acc = torch.zeros_like(m), torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, nk, block_size):
            s = qb @ k[..., ks:ks + block_size, :].transpose(-2, -1) * scale
            kept.append(s.flatten(-2).clone())
            new = torch.maximum(m, s.amax(-1, keepdim=True))
            c, p = torch.exp(m - new), torch.exp(s - new)
            l, acc, m = l * c + p.sum(-1, keepdim=True), acc * c + p @ v[..., ks:ks + block_size, :], new
        out[..., qs:qs + block_size, :] = acc / l
    return out

def vmapped(answer):
    """``answer`` written for one (n, d) matrix, mapped over the leading axes with torch.func.vmap (whose tensors'
    values the check's watcher cannot read)."""
    def run(q, k, v, block_size=64):
        flat = lambda t: t.reshape(-1, *t.shape[-2:])  # noqa: E731 - (…, n, d) → (batch, n, d)
        out = torch.func.vmap(lambda a, b, c: answer(a, b, c, block_size))(flat(q), flat(k), flat(v))
        return out.reshape(*q.shape[:-2], *out.shape[-2:])
    return run


TA_RIGHT = {"reference": ta_ref, "options at their right values": T(), "keys outside (FlashAttention-1 order)":
            ta_key_outer, "running logsumexp": ta_lse, "state from the first tile": ta_first_tile,
            "float64 inside": lambda q, k, v, b=64: ta_ref(q.double(), k.double(), v.double(), b).to(q.dtype),
            "while loops, output blocks joined with torch.cat": ta_blocks_cat_while,
            "running logaddexp into a preallocated output": ta_logaddexp_prealloc,
            "float64 inside, key blocks listed first, a dict of outputs": ta_float64_blocks,
            "state updated in place": ta_inplace_state, "torch.func.vmap over the leading axes": vmapped(ta_lse)}

def ta_two_pass_elementwise(q, k, v, b=64):  # two passes over the keys, scores by broadcasting instead of @
    scale, out = 1 / math.sqrt(q.shape[-1]), torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, q.shape[-2], b):
        qb = q[..., qs:qs + b, :]
        tiles = lambda: ((ks, (qb[..., :, None, :] * k[..., None, ks:ks + b, :]).sum(-1) * scale)  # noqa: E731
                         for ks in range(0, k.shape[-2], b))
        m = torch.stack([s.amax(-1) for _, s in tiles()], -1).amax(-1, keepdim=True)
        acc, l = 0, 0
        for ks, s in tiles():
            p = torch.exp(s - m)
            acc, l = acc + p @ v[..., ks:ks + b, :], l + p.sum(-1, keepdim=True)
        out[..., qs:qs + b, :] = acc / l
    return out



def ta_query_blocks_batched(q, k, v, block_size=64):  # every query block at once: (…, n_q / b, b, b) tiles
    n_q, b = q.shape[-2], block_size
    nb = -(-n_q // b)
    qp = F.pad(q, (0, 0, 0, nb * b - n_q)).unflatten(-2, (nb, b)) / math.sqrt(q.shape[-1])  # (..., nb, b, d_k)
    m = torch.full(qp.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
    l, acc = torch.zeros_like(m), torch.zeros(qp.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for ks in range(0, k.shape[-2], b):
        s = qp @ k[..., None, ks:ks + b, :].transpose(-2, -1)  # (..., nb, b, b_k)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p, c = torch.exp(s - m_new), torch.exp(m - m_new)
        l, acc, m = l * c + p.sum(-1, keepdim=True), acc * c + p @ v[..., None, ks:ks + b, :], m_new
    return (acc / l).flatten(-3, -2)[..., :n_q, :]


def ta_q_scaled_in_place(q, k, v, block_size=64):  # 1/√d_k folded into q once, in place, before the loop
    q *= 1 / math.sqrt(q.shape[-1])
    return attn(q, k, v, block_size, scale=lambda q, k, v, b: 1.0)


def ca_k_scaled_in_place(q, k, v, block_size=64):  # 1/√d_k folded into k once, in place, before the loop
    k /= math.sqrt(k.shape[-1])
    return attn(q, k, v, block_size, True, scale=lambda q, k, v, b: 1.0)


TA_WRONG = {
    "1/√d_k folded into q in place": (ta_q_scaled_in_place, "q changed in place"),
    "two passes, scores by broadcasting": (ta_two_pass_elementwise, "reads the keys twice"),
    "float64 result for float32 input": (lambda q, k, v, b=64: ta_ref(q.double(), k.double(), v.double(), b),
                                         "result in float64 for float32 input"),
    "not scaled": (T(scale=lambda q, k, v, b: 1.0), "scores not scaled"),
    "divided by d_k": (T(scale=lambda q, k, v, b: 1 / q.shape[-1]), "divided by d_k instead of √d_k"),
    "multiplied by √d_k": (T(scale=lambda q, k, v, b: math.sqrt(q.shape[-1])), "multiplied by √d_k"),
    "scaled by √d_v": (T(scale=lambda q, k, v, b: 1 / math.sqrt(v.shape[-1])), "scaled by √d_v"),
    "scaled by √n_k": (T(scale=lambda q, k, v, b: 1 / math.sqrt(k.shape[-2])), "scaled by √n_k"),
    "sum not rescaled": (T(sum_f="none"), "running sum not rescaled"),
    "acc not rescaled": (T(acc_f="none"), "accumulator not rescaled"),
    "neither rescaled": (T(sum_f="none", acc_f="none"), "running sum and accumulator not rescaled"),
    "rescaled by exp(m_new - m_old)": (T(sum_f="grow", acc_f="grow"), "NaN from the first block on"),
    "rescaled by exp(m_new - m_old), guarded": (T(sum_f="grow_guard", acc_f="grow_guard"), "exp(m_new − m_old)"),
    "per-tile max": (T(newmax="block"), "per-tile maximum instead of a running one"),
    "one max per tile": (T(tile_max="tile"), "one maximum for the whole tile"),
    "no max": (T(newmax="zero"), "no running maximum subtracted"),
    "max started at 0": (T(m0=0.0), "running max started at 0"),
    "no final division": (T(final="none"), "final division missing"),
    "normalised at every tile": (T(pv="normalise each tile"), "accumulator normalised at every tile"),
    "each tile normalised": (T(pv="tile softmax"), "each tile normalised on its own"),
    "last partial key block dropped": (T(k_range=lambda n, nk, b, qs, qe: range(0, nk - nk % b, b)),
                                       "last, shorter key block dropped"),
    "last key block always dropped": (T(k_range=lambda n, nk, b, qs, qe: range(0, nk - b, b)), "last key block dropped"),
    "key slice one short": (T(k_end=lambda s, b: s + b - 1), "each key block one key short"),
    "key slice one long": (T(k_end=lambda s, b: s + b + 1), "key blocks overlap by one key"),
    "last partial query block skipped": (T(q_stop=lambda n, b: n - n % b), "last, shorter query block not computed"),
    "last partial query block left as garbage": (ta_garbage_tail, "wrong only in the last, partial block"),
    "scale −1/√d_k": (T(scale=lambda q, k, v, b: -q.shape[-1] ** -0.5), "scores scaled by −1/√d_k"),
    "correction exp(m + m_new)": (T(sum_f=lambda m, new: torch.exp(m + new), acc_f=lambda m, new: torch.exp(m + new)),
                                  "rescaled by exp(m_old + m_new)"),
    "correction exp(m_new)": (T(sum_f=lambda m, new: torch.exp(new), acc_f=lambda m, new: torch.exp(new)),
                              "rescaled by exp(m_new)"),
    "m never updated": (T(update_max=False), "running max never updated"),
    "weights exp(s)": (T(prob=lambda s, m: torch.exp(s)), "tile weights exp(s), without the maximum"),
    "weights s - m": (T(prob=lambda s, m: s - m), "tile weights without exp"),
    "acc overwritten": (T(pv="overwrite"), "accumulator overwritten by each tile"),
    "correction added to acc": (T(pv="add the correction"), "correction added to the accumulator"),
    "v without p": (T(pv="v without p"), "v_block added without the weights p"),
    "first key block only": (T(k_range=lambda n, nk, b, qs, qe: range(0, nk, 1000)), "only the first key block visited"),
    "key loop from 1": (T(k_range=lambda n, nk, b, qs, qe: range(1, nk, b)), "key loop starts at 1"),
    "query loop to d_k": (ta_rows_to_dk, "output rows never written"),
    "output with q's width": (ta_out_width_q, "allocated"),
    "k.T on a batch": (ta_kT, "k.T"),
    "F.scaled_dot_product_attention": (lambda q, k, v, b=64: F.scaled_dot_product_attention(q, k, v),
                                       "calls a fused attention"),
    "full score matrix": (lambda q, k, v, b=64: torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1) @ v,
                          "builds a full 192 × 192 matrix"),
    "a row of tiles at once": (ta_row_block, "builds a whole row of tiles at once"),
    "every query block at once, batched tiles": (ta_query_blocks_batched, "computes a whole column of tiles at once"),
    "every score tile kept, then two passes over them": (ta_keep_tiles, "keeps every score tile alive at once"),
    "every weight tile appended to a list": (ta_hoard_weights, "keeps every score tile alive at once"),
    "every score tile kept, flattened": (ta_keep_flattened, "holds as much as a 192 × 192 matrix at once"),
    "two passes over the keys": (ta_two_pass, "reads the keys twice"),
    "block_size ignored (64)": (lambda q, k, v, b=64: ta_ref(q, k, v, 64), "tiles larger than block_size"),
    "block_size ignored (8)": (lambda q, k, v, b=64: ta_ref(q, k, v, 8), "block_size not used"),
    "float16 result": (lambda q, k, v, b=64: ta_ref(q, k, v, b).half(), "float16"),
}


# ============================================================================ causal: learners
def ca_triu(q, k, v, block_size=64):  # a per-tile mask from triu with an offset, −1e9 fill
    n, scale = q.shape[-2], 1 / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, block_size):
        qe = min(qs + block_size, n)
        qb = q[..., qs:qe, :]
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l, acc = torch.zeros_like(m), torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, qe, block_size):
            ke = min(ks + block_size, n)
            s = qb @ k[..., ks:ke, :].transpose(-2, -1) * scale
            s = s.masked_fill(torch.ones(qe - qs, ke - ks, dtype=torch.bool).triu(qs - ks + 1), -1e9)
            new = torch.maximum(m, s.amax(-1, keepdim=True))
            c, p = torch.exp(m - new), torch.exp(s - new)
            l, acc, m = l * c + p.sum(-1, keepdim=True), acc * c + p @ v[..., ks:ke, :], new
        out[..., qs:qe, :] = acc / l
    return out


def ca_full_mask(q, k, v, block_size=64):  # slices an (n, n) mask built up front
    n = q.shape[-2]
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    return attn(q, k, v, block_size, True, hide=lambda r, c, qs, ks: ~allowed[r[:, 0]][:, c[0]])


# one pass in other styles: the key loop broken at the diagonal with torch.where; while loops, logaddexp, float64
def ca_early_stop(q, k, v, block_size=64):  # the key loop breaks at the diagonal; the diagonal tile masked with where
    n, scale = q.shape[-2], 1 / math.sqrt(q.shape[-1])
    outs = []
    for qs in range(0, n, block_size):
        qe = min(qs + block_size, n)
        qb = q[..., qs:qe, :]
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l, acc = torch.zeros_like(m), torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, n, block_size):
            if ks >= qe:
                break
            ke = min(ks + block_size, n)
            s = qb @ k[..., ks:ke, :].transpose(-2, -1) * scale
            if ke - 1 > qs:
                s = torch.where(torch.arange(ks, ke)[None, :] <= torch.arange(qs, qe)[:, None], s, float("-inf"))
            new = torch.maximum(m, s.amax(-1, keepdim=True))
            c, p = torch.exp(m - new), torch.exp(s - new)
            l, acc, m = l * c + p.sum(-1, keepdim=True), acc * c + p @ v[..., ks:ke, :], new
        outs.append(acc / l)
    return torch.cat(outs, -2)


def ca_logaddexp_while(q, k, v, block_size=64):  # while loops, a running log-sum-exp, float64 inside
    q64, k64, v64 = q.double(), k.double(), v.double()
    n, scale = q.shape[-2], q.shape[-1] ** -0.5
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
    qs = 0
    while qs < n:
        qe = min(qs + block_size, n)
        lse = torch.full(q.shape[:-2] + (qe - qs, 1), -math.inf, dtype=torch.float64)
        o = torch.zeros(q.shape[:-2] + (qe - qs, v.shape[-1]), dtype=torch.float64)
        ks = 0
        while ks < qe:
            ke = min(ks + block_size, n)
            s = q64[..., qs:qe, :] @ k64[..., ks:ke, :].transpose(-2, -1) * scale
            s = s.masked_fill(torch.arange(ks, ke) > torch.arange(qs, qe)[:, None], -math.inf)
            new = torch.logaddexp(lse, torch.logsumexp(s, -1, keepdim=True))
            o = o * torch.exp(lse - new) + torch.exp(s - new) @ v64[..., ks:ke, :]
            lse, ks = new, ke
        out[..., qs:qe, :] = o
        qs = qe
    return out.to(q.dtype)


def ca_keep_tiles(q, k, v, block_size=64):  # every causal tile masked and kept, then two passes over them
    n, scale = q.shape[-2], q.shape[-1] ** -0.5
    tiles = {}
    for qs in range(0, n, block_size):
        qe = min(qs + block_size, n)
        for ks in range(0, qe, block_size):
            ke = min(ks + block_size, n)
            s = q[..., qs:qe, :] @ k[..., ks:ke, :].transpose(-2, -1) * scale
            tiles[qs, ks] = s.masked_fill(torch.arange(ks, ke)[None] > torch.arange(qs, qe)[:, None], -math.inf)
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, block_size):
        row = [(ks, tiles[qs, ks]) for ks in range(0, min(qs + block_size, n), block_size)]
        m = torch.full(row[0][1].shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        for _, s in row:
            m = torch.maximum(m, s.amax(-1, keepdim=True))
        l, acc = 0, 0
        for ks, s in row:
            p = torch.exp(s - m)
            l, acc = l + p.sum(-1, keepdim=True), acc + p @ v[..., ks:ks + block_size, :]
        out[..., qs:qs + block_size, :] = acc / l
    return out


CA_RIGHT = {"reference": C(), "global mask on every tile": C(masked=lambda qs, qe, ks, ke: True), "triu per tile, −1e9": ca_triu,
            "tile-local mask on the diagonal tiles only": C(hide=lambda r, c, qs, ks: (c - ks) > (r - qs)),
            "float64 inside": lambda q, k, v, b=64: attn(q.double(), k.double(), v.double(), b, True).to(q.dtype),
            "key loop broken at the diagonal, torch.where, output blocks joined": ca_early_stop,
            "while loops, running logaddexp, float64 inside": ca_logaddexp_while,
            "torch.func.vmap over the leading axes": vmapped(ca_early_stop)}

CA_WRONG = {
    "1/√d_k folded into k in place": (ca_k_scaled_in_place, "k changed in place"),
    "not causal": (lambda q, k, v, b=64: ta_ref(q, k, v, b), "not causal"),
    "every tile computed, masked": (C(k_range=lambda n, nk, b, qs, qe: range(0, nk, b), masked=lambda qs, qe, ks, ke: True),
                                    "computes the tiles above the diagonal"),
    "one tile past the diagonal, masked": (C(k_range=lambda n, nk, b, qs, qe: range(0, min(qe + b, nk), b),
                                             masked=lambda qs, qe, ks, ke: True), "computes one tile past the diagonal"),
    "every tile computed, only the diagonal masked": (C(k_range=lambda n, nk, b, qs, qe: range(0, nk, b),
                                                        masked=lambda qs, qe, ks, ke: ks == qs),
                                                      "computed and not masked"),
    "one tile past the diagonal, not masked": (C(k_range=lambda n, nk, b, qs, qe: range(0, min(qe + b, nk), b),
                                                 masked=lambda qs, qe, ks, ke: ks == qs), "computed and not masked"),
    "diagonal tile not masked": (C(hide=lambda r, c, qs, ks: torch.zeros_like(c > r)), "diagonal tile not masked"),
    "mask key >= query": (C(hide=lambda r, c, qs, ks: c >= r), "mask hides the query's own key"),
    "mask key > query + 1": (C(hide=lambda r, c, qs, ks: c > r + 1), "mask one position late"),
    "mask key < query": (C(hide=lambda r, c, qs, ks: c < r), "mask hides the past instead of the future"),
    "tile-local mask on every tile": (C(hide=lambda r, c, qs, ks: (c - ks) > (r - qs), masked=lambda qs, qe, ks, ke: True),
                                      "mask from positions inside the tile"),
    "diagonal tile skipped": (C(k_range=lambda n, nk, b, qs, qe: range(0, qs, b)), "diagonal tile skipped"),
    "diagonal tile skipped, zeros": (C(k_range=lambda n, nk, b, qs, qe: range(0, qs, b), zero_guard=True),
                                     "diagonal tile skipped"),
    "diagonal tile skipped after the first block": (C(k_range=lambda n, nk, b, qs, qe: range(0, qs if qs else qe, b)),
                                                    "diagonal tile skipped after the first query block"),
    "weak fill −1e4": (C(fill=-1e4), "masked scores filled with a finite value"),
    "weak fill −30": (C(fill=-30.0), "masked scores filled with a finite value"),
    "fill +inf": (C(fill=math.inf), "masked scores filled with +inf"),
    "key blocks to the end": (C(k_end=lambda s, b: 10 ** 9), "key blocks run to the end of the sequence"),
    # no known mistake reproduces these: changing only the last key and value moves earlier rows
    "mask key > query + 2": (C(hide=lambda r, c, qs, ks: c > r + 2), "queries see future keys"),
    "masked scores filled with −1": (C(fill=-1.0), "queries see future keys"),
    "mask key >= query on every tile": (C(hide=lambda r, c, qs, ks: c >= r, masked=lambda qs, qe, ks, ke: True),
                                        "mask hides the query's own key"),
    "arange with its end below its start": (ca_tile_positions, "torch.arange(start, end) got an end below its start"),
    "the mask as the scores": (ca_mask_as_scores, "was used in a subtraction"),
    "sum not rescaled": (C(sum_f="none"), "running sum not rescaled"),
    "acc not rescaled": (C(acc_f="none"), "accumulator not rescaled"),
    "per-tile max": (C(newmax="block"), "per-tile maximum"),
    "max started at 0": (C(m0=0.0), "running max started at 0"),
    "no final division": (C(final="none"), "final division missing"),
    "not scaled": (C(scale=lambda q, k, v, b: 1.0), "scores not scaled"),
    "last partial query block skipped": (C(q_stop=lambda n, b: n - n % b), "last, shorter query block not computed"),
    "last partial key block dropped": (C(k_range=lambda n, nk, b, qs, qe: [s for s in range(0, nk - nk % b, b) if s < qe]),
                                       "last, shorter key block dropped"),
    "two passes over the keys": (lambda q, k, v, b=64: ta_two_pass(q, k, v, b, causal=True), "reads the keys twice"),
    "an (n, n) mask": (ca_full_mask, "builds a full 192 × 192 matrix"),
    "every causal tile kept, then two passes over them": (ca_keep_tiles, "keeps every score tile alive at once"),
    "F.scaled_dot_product_attention": (lambda q, k, v, b=64: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                       "calls a fused attention"),
}

CHECKS = {"online_softmax": (check_online_softmax, OS_RIGHT, OS_WRONG),
          "tiled_attention": (check_tiled_attention, TA_RIGHT, TA_WRONG),
          "causal_tiled_attention": (check_causal_tiled_attention, CA_RIGHT, CA_WRONG)}

#: A few of each kind run in the quick suite; `pytest -m slow` runs every one.
QUICK = {"sum not rescaled", "rescaled by exp(m_new - m_old), guarded", "last partial block dropped", "torch.softmax",
         "global max first", "block_size ignored (1)", "acc not rescaled", "last partial query block left as garbage",
         "a row of tiles at once", "two passes over the keys", "every tile computed, masked", "mask key >= query",
         "diagonal tile skipped", "per-tile max", "keepdim missing", "a first loop for the maximum, then the online loop",
         "every weight tile appended to a list", "every causal tile kept, then two passes over them",
         "two loops, the sums as e @ ones", "no blocks: sort and @ ones", "second loop over a copy_ of x",
         "block results merged at the end", "next block's maximum before this block's sum",
         "float32 result via .float()", "result written over x with sub_, exp_, div_", "result copied into x with copy_",
         "1/√d_k folded into q in place", "1/√d_k folded into k in place"}


def _cases(kind):
    for exercise, (check, right, wrong) in CHECKS.items():
        table = right if kind == "right" else wrong
        for name, value in table.items():
            marks = () if kind == "right" or name in QUICK else (pytest.mark.slow,)
            yield pytest.param(check, value, id=f"{exercise}: {name}", marks=marks)


# ============================================================================ the tests
@pytest.mark.parametrize("check, fn", list(_cases("right")))
def test_right_answers_are_accepted(check, fn, accepts):
    accepts(check, fn)


@pytest.mark.parametrize("check, wrong", list(_cases("wrong")))
def test_wrong_answers_are_rejected_and_named(check, wrong, rejects):
    fn, phrase = wrong
    assert_voice(rejects(check, fn, phrase))


@pytest.mark.parametrize("check", [c for c, _, _ in CHECKS.values()], ids=list(CHECKS))
def test_unfinished_is_not_attempted(check, rejects, unfinished):
    rejects(check, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)


def test_an_exception_shows_the_learners_line(rejects):
    def broken(q, k, v, block_size=64):
        scores = q @ k.transpose(-2, -1)
        return scores @ v[..., :1, :]  # the wrong slice of v

    result = rejects(check_tiled_attention, broken, "your code raised RuntimeError", "of your cell",
                     "return scores @ v")
    # no mistake of the exercise raises that message, so the cause is only what PyTorch's message itself says
    assert result.diagnosis.cause.startswith("a matrix product whose inner sizes differ"), result.text()


def _learner(make, softmax):
    if softmax:
        return lambda x, block_size=1: make(x, block_size)
    return lambda q, k, v, block_size=64: make(q, k, v, block_size)


@pytest.mark.slow
@pytest.mark.parametrize("exercise, mistakes", [
    ("online_softmax", cf.SOFTMAX_MISTAKES), ("tiled_attention", cf.TILED_MISTAKES),
    ("causal_tiled_attention", cf.CAUSAL_MISTAKES)])
def test_every_known_mistake_is_named_by_its_own_summary(exercise, mistakes):
    check = CHECKS[exercise][0]
    for mistake in mistakes:
        result = check.evaluate(_learner(mistake.make, exercise == "online_softmax"))
        assert result.status is Status.FAILED, f"{mistake.summary}: {result.text()}"
        assert mistake.summary in result.summary, f"{mistake.summary!r} not in:\n{result.text()}"


@pytest.mark.parametrize("exercise, mistakes, cases", [
    ("online_softmax", cf.SOFTMAX_MISTAKES, cf.softmax_cases), ("tiled_attention", cf.TILED_MISTAKES, cf.tiled_cases),
    ("causal_tiled_attention", cf.CAUSAL_MISTAKES, cf.causal_cases)])
@pytest.mark.slow
def test_the_cases_tell_every_known_mistake_apart(exercise, mistakes, cases):
    """Each mistake is wrong on some case, and two mistakes with different names differ on some case (so
    "explains every case" never has to choose between them)."""
    cases = cases()
    mistakes = cf.judge._remembered(exercise, cases, mistakes)  # the outputs the checks use (computed once)

    def output(m, c):
        try:
            return m.make(*c.args)
        except Exception:  # noqa: BLE001 - this mistake cannot happen on this case
            return None

    table = {m.key: [output(m, c) for c in cases] for m in mistakes}
    assert len(table) == len(mistakes), "two mistakes share a key"
    for m in mistakes:
        assert any(o is not None and not same(o, c.expected, atol=c.atol, rtol=c.rtol) for o, c in zip(table[m.key], cases)), \
            f"{m.summary}: right on every case"
    for a, b in itertools.combinations(mistakes, 2):
        if a.summary == b.summary:
            continue
        assert any(x is not None and y is not None and not same(x, y, atol=c.atol, rtol=c.rtol)
                   for x, y, c in zip(table[a.key], table[b.key], cases)), f"{a.summary} == {b.summary} on every case"


def test_the_cases_vary_every_argument():
    soft = cf.softmax_cases()
    blocks = {c.block for c in soft}
    assert {1, 16} <= blocks and any(c.args[0].shape[-1] % c.block for c in soft)  # 1, longer than n, not dividing
    assert {c.args[0].dim() for c in soft} >= {1, 2, 3} and {c.args[0].dtype for c in soft} >= {torch.float32, torch.float64}
    tiled = cf.tiled_cases()
    assert any(c.args[0].shape[-2] != c.args[1].shape[-2] for c in tiled)  # n_q ≠ n_k, both ways
    assert any(c.args[0].shape[-2] > c.args[1].shape[-2] for c in tiled)
    assert any(c.args[0].shape[-1] != c.args[2].shape[-1] for c in tiled)  # d_k ≠ d_v
    assert any(c.args[0].dim() == 4 for c in tiled) and any(1 in c.args[0].shape[:-1] for c in tiled)
    for cases in (tiled, cf.causal_cases()):
        assert {1} <= {c.block for c in cases} and any(c.block > c.args[0].shape[-2] for c in cases)
        assert any(c.args[0].shape[-2] % c.block for c in cases)
        assert {c.args[0].dtype for c in cases} == {torch.float32, torch.float64}


def test_every_diagnosis_speaks_to_the_learner():
    for mistake in [*cf.SOFTMAX_MISTAKES, *cf.CAUSAL_MISTAKES]:
        assert mistake.cause.startswith(("you ", "your ")), mistake.cause
        assert len(mistake.summary) <= 60 and not mistake.summary.endswith(".")


# ============================================================================ memory held at once, one pass over x
def test_tiles_kept_alive_are_named_in_the_learners_terms(rejects):
    d = rejects(check_tiled_attention, ta_hoard_weights, "keeps every score tile alive at once").diagnosis
    assert "tiles of shape (2, 16, 16) alive at the same time" in d.got, d.got
    assert "of the 589,824 bytes the full 192 × 192 score matrices of this batch take" in d.got, d.got
    assert "less than a quarter of the full score matrices" in d.expected and "no list of tiles" in d.fix
    d = rejects(check_causal_tiled_attention, ca_keep_tiles, "keeps every score tile alive at once").diagnosis
    assert "81 tiles of shape (2, 16, 16) alive at the same time" in d.got and "57%" in d.got, d.got


def test_the_memory_bound_is_far_from_right_answers_and_from_kept_tiles():
    """The bound, a quarter of the full score matrices, is never borderline on the probe's case: every right
    answer holds under a tenth of them (the output, the running state, a few tiles), every answer that keeps its
    tiles over a half (causal too: the tiles on and below the diagonal are more than half of them)."""
    lead, n, d_k, d_v, b = 2, 192, 2, 1, 16  # the case attention_structure watches
    q, k, v = cf.cases.qkv((lead,), n, n, d_k, d_v, b, 41)
    full = lead * n * n * q.element_size()
    for name, fn in [*TA_RIGHT.items(), *CA_RIGHT.items()]:
        assert cf.trace(fn, q, k, v, b)["live_peak"] < full / 10, name
    for fn in (ta_keep_tiles, ta_hoard_weights, ta_keep_flattened, ca_keep_tiles):
        assert cf.trace(fn, q, k, v, b)["live_peak"] > full / 2, fn.__name__


def test_a_second_pass_over_x_is_named_in_the_learners_terms(rejects):
    d = rejects(check_online_softmax, os_max_loop_first, "reads x twice: goes back to blocks already passed").diagnosis
    assert "a maximum read 18 numbers of x again" in d.got and "your maxima twice, your sums once" in d.got, d.got
    assert "delete any loop or reduction over x before it" in d.fix, d.fix
    d = rejects(check_online_softmax, os_two_pass_decoy_sums, "reads x twice").diagnosis
    assert "a sum read 18 numbers of x again" in d.got and "your maxima once, your sums twice" in d.got, d.got


def test_one_pass_is_judged_row_by_row_and_within_a_block():
    """Right answers read a block again only before moving on (a second look at the same block), and rows are
    independent: one after the other, or side by side."""
    x = cf.cases.rows((3, 48), 6, 40)  # the case softmax_structure watches
    for name, fn in OS_RIGHT.items():
        reads = cf.trace(fn, x, 6)["reads"]
        assert reads["back"] is None, (name, reads)
    assert cf.trace(os_inplace_state_twice, x, 6)["reads"]["most"]["m"] == 2  # the same block twice: not a second pass
    for fn in (os_max_loop_first, os_two_pass_decoy_sums, os_block_maxima_at_once, os_two_pass_blocks):
        assert cf.trace(fn, x, 6)["reads"]["back"] is not None, fn.__name__


def _audited(source, name):
    scope = {"torch": torch, "math": math, "F": F}
    exec(compile(source, f"<{name}>", "exec"), scope)  # noqa: S102 - a right answer, as a learner types it
    return scope[name]


@pytest.mark.parametrize("exercise, source", [pytest.param(e, s, id=f"{e}: {what}") for e, what, s in AUDITED])
def test_the_audited_right_answers_are_accepted(exercise, source, accepts):
    """56 right answers written by independent audits (chunk, unfold, while loops, in-place state, sums as
    products with ones, split copies…): each passes."""
    check = {"online_softmax": check_online_softmax, "tiled_attention": check_tiled_attention,
             "causal_tiled_attention": check_causal_tiled_attention}[exercise]
    accepts(check, _audited(source, exercise))


def test_a_block_read_late_or_results_merged_are_not_called_a_second_loop(rejects):
    """x read once, in blocks, yet not the online update: named for what it is, never 'a second loop'."""
    d = rejects(check_online_softmax, os_pipelined, "each block's sum taken after the next block's maximum").diagnosis
    assert "x is read once" in d.got and "second loop" not in d.cause + d.got, d
    d = rejects(check_online_softmax, os_merged_at_end, "block results merged at the end").diagnosis
    assert "which are not columns of x" in d.got and "second pass" not in d.cause, d
    d = rejects(check_tiled_attention, ta_query_blocks_batched, "computes a whole column of tiles at once").diagnosis
    assert "12 (16, 16) tiles side by side" in d.got and "n · block_size" in d.cause and "n²" not in d.cause, d


# ============================================================================ audit D: named for what they did
def ca_float32_inside(q, k, v, block_size=64):  # right steps, but everything in float32: a float32 result
    q, k, v = q.float(), k.float(), v.float()
    n, scale = q.shape[-2], 1.0 / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],))
    for qs in range(0, n, block_size):
        qe = min(qs + block_size, n)
        m = torch.full((*q.shape[:-2], qe - qs, 1), -math.inf)
        l, acc = torch.zeros_like(m), torch.zeros((*q.shape[:-2], qe - qs, v.shape[-1]))
        for ks in range(0, qe, block_size):
            ke = min(ks + block_size, n)
            s = q[..., qs:qe, :] @ k[..., ks:ke, :].mT * scale
            s = s.masked_fill(torch.arange(ks, ke)[None, :] > torch.arange(qs, qe)[:, None], -math.inf)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p, c = torch.exp(s - m_new), torch.exp(m - m_new)
            l, acc, m = l * c + p.sum(-1, keepdim=True), acc * c + p @ v[..., ks:ke, :], m_new
        out[..., qs:qe, :] = acc / l
    return out


def test_a_float32_result_is_named_by_its_dtype_not_as_a_scale(rejects):
    """On scores near −20000 float32 rounding leaves the tolerance: the answer is close, in float32, and the
    fitted temperature is 1/√d_k itself; the diagnosis is the dtype, never "scaled by 0.3536 instead of 0.3536"."""
    d = rejects(check_causal_tiled_attention, ca_float32_inside, "result in float32 for float64 input").diagnosis
    assert "scaled" not in d.summary and "dtype=" in d.fix, d


def ta_two_passes_per_query_block(q, k, v, block_size=64):  # each query block's tiles kept in a list, then reduced
    n_q, n_k, scale = q.shape[-2], k.shape[-2], 1 / math.sqrt(q.shape[-1])
    rows = []
    for qs in range(0, n_q, block_size):
        q_blk = q[..., qs:qs + block_size, :]
        tiles = [q_blk @ k[..., ks:ks + block_size, :].mT * scale for ks in range(0, n_k, block_size)]
        m = torch.stack([t.amax(-1, keepdim=True) for t in tiles]).amax(0)
        l = sum(torch.exp(t - m).sum(-1, keepdim=True) for t in tiles)
        acc = sum(torch.exp(t - m) @ v[..., i * block_size:(i + 1) * block_size, :] for i, t in enumerate(tiles))
        rows.append(acc / l)
    return torch.cat(rows, dim=-2)


def ca_two_passes_per_query_block(q, k, v, block_size=64):
    n, scale = q.shape[-2], 1 / math.sqrt(q.shape[-1])
    rows = []
    for qs in range(0, n, block_size):
        qe = min(n, qs + block_size)
        tiles = [(q[..., qs:qe, :] @ k[..., ks:ks + block_size, :].mT * scale).masked_fill(
            torch.arange(ks, min(n, ks + block_size))[None] > torch.arange(qs, qe)[:, None], -math.inf)
            for ks in range(0, qe, block_size)]
        m = torch.cat([t.amax(-1, keepdim=True) for t in tiles], -1).amax(-1, keepdim=True)
        l = sum(torch.exp(t - m).sum(-1, keepdim=True) for t in tiles)
        acc = sum(torch.exp(t - m) @ v[..., i * block_size:(i + 1) * block_size, :] for i, t in enumerate(tiles))
        rows.append(acc / l)
    return torch.cat(rows, dim=-2)


@pytest.mark.parametrize("check, fn", [(check_tiled_attention, ta_two_passes_per_query_block),
                                       (check_causal_tiled_attention, ca_two_passes_per_query_block)])
def test_a_query_blocks_tiles_kept_for_a_second_pass_are_rejected(check, fn, rejects):
    """The docstring: each tile let go once folded into m, l and acc. Keeping a query block's 12 tiles for a
    maximum over all of them holds n · block_size numbers, under the quarter of n² the full-matrix rule needs."""
    result = rejects(check, fn, "keeps a query block's score tiles alive at once")
    d = result.diagnosis
    assert "tiles of shape (2, 16, 16)" in d.got and "a query block has 12 key blocks" in d.got, d
    assert "n · block_size" in d.cause, d
    assert_voice(result)


def ca_mask_hides_self_guarded(q, k, v, block_size=64):  # key ≥ query masked; a guard turns 0/0 into 0
    n, scale = q.shape[-2], 1 / math.sqrt(q.shape[-1])
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n, block_size):
        qe = min(n, qs + block_size)
        m = torch.full((*q.shape[:-2], qe - qs, 1), -math.inf, dtype=q.dtype)
        l, acc = torch.zeros_like(m), torch.zeros_like(out[..., qs:qe, :])
        for ks in range(0, qe, block_size):
            ke = min(n, ks + block_size)
            s = (q[..., qs:qe, :] @ k[..., ks:ke, :].mT * scale).masked_fill(
                torch.arange(ks, ke)[None] >= torch.arange(qs, qe)[:, None], -math.inf)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            safe = torch.where(m_new.isinf(), torch.zeros_like(m_new), m_new)
            p, c = torch.exp(s - safe), torch.exp(m - safe)
            l, acc, m = l * c + p.sum(-1, keepdim=True), acc * c + p @ v[..., ks:ke, :], m_new
        out[..., qs:qe, :] = torch.nan_to_num(acc / l)
    return out


def test_a_mask_hiding_the_diagonal_is_named_behind_a_nan_guard(rejects):
    d = rejects(check_causal_tiled_attention, ca_mask_hides_self_guarded, "mask hides the query's own key").diagnosis
    assert "comes out as 0" in d.cause and "key > query" in d.fix, d


def ca_float32_cast_back(q, k, v, block_size=64):  # float32 inside, the result cast back to q's dtype
    return ca_float32_inside(q, k, v, block_size).to(q.dtype)


def test_float32_inside_a_float64_result_is_named_by_its_precision(rejects):
    """Off by 2e-4 on scores near −20000, as the float32 oracle is: the precision, not a scale of 0.3536 "instead of"
    0.3536, nor a generic "wrong values"."""
    d = rejects(check_causal_tiled_attention, ca_float32_cast_back, "float64 input, float32 precision").diagnosis
    assert "scaled" not in d.summary and "float32" in d.cause, d


# ============================================================================ round 3: kept results, inputs changed on any case
def _cached(name):
    cache = {}

    def online_softmax(x, block_size=1):
        key = (x.shape, x.dtype, block_size)  # "same problem, same answer"
        if key not in cache:
            cache[key] = _online(x, block_size)
        return cache[key]

    def tiled_attention(q, k, v, block_size=64):
        key = (q.shape, k.shape, v.shape, q.dtype, block_size)
        if key not in cache:
            cache[key] = _tiles(q, k, v, block_size, causal=name == "causal_tiled_attention")
        return cache[key]
    return online_softmax if name == "online_softmax" else tiled_attention


def _online(x, block_size):
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(block - m_new).sum(dim=-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / l


def _tiles(q, k, v, block_size, causal=False):
    n_q, n_k, scale = q.shape[-2], k.shape[-2], 1 / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n_q, block_size):
        qe = min(qs + block_size, n_q)
        m = torch.full(q.shape[:-2] + (qe - qs, 1), -math.inf, dtype=q.dtype)
        l, acc = torch.zeros_like(m), torch.zeros(q.shape[:-2] + (qe - qs, v.shape[-1]), dtype=q.dtype)
        for ks in range(0, qe if causal else n_k, block_size):
            ke = min(ks + block_size, n_k)
            s = q[..., qs:qe, :] @ k[..., ks:ke, :].mT * scale
            if causal:
                s = s.masked_fill(torch.arange(ks, ke)[None, :] > torch.arange(qs, qe)[:, None], -math.inf)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p, c = torch.exp(s - m_new), torch.exp(m - m_new)
            l, acc, m = l * c + p.sum(dim=-1, keepdim=True), acc * c + p @ v[..., ks:ke, :], m_new
        out[..., qs:qe, :] = acc / l
    return out


@pytest.mark.parametrize("check, name", [(check_online_softmax, "online_softmax"),
                                         (check_tiled_attention, "tiled_attention"),
                                         (check_causal_tiled_attention, "causal_tiled_attention")])
def test_a_result_kept_from_an_earlier_call_is_named(check, name, rejects):
    result = rejects(check, _cached(name), "an earlier result returned again")
    assert "a cache keyed by the shapes" in result.diagnosis.cause and "same shape" in result.diagnosis.got
    assert_voice(result)


def online_softmax_n1_in_place(x, block_size=1):
    if x.shape[-1] == 1:  # "a single column: its softmax is 1"
        return x.fill_(1.0)
    return _online(x, block_size)


def test_an_input_changed_on_any_case_is_named(rejects):
    d = rejects(check_online_softmax, online_softmax_n1_in_place, "x changed in place").diagnosis
    assert "(n = 1)" in d.tried, d.tried


def tiled_attention_first_tile_reference(q, k, v, block_size=64):
    """The first tile's maximum as the reference for every later tile: no rescaling needed, until exp overflows."""
    n_q, n_k, scale = q.shape[-2], k.shape[-2], 1 / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for qs in range(0, n_q, block_size):
        m = None
        for ks in range(0, n_k, block_size):
            s = q[..., qs:qs + block_size, :] @ k[..., ks:ks + block_size, :].mT * scale
            if m is None:
                m = s.amax(dim=-1, keepdim=True)
                l, acc = torch.zeros_like(m), torch.zeros(s.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
            p = torch.exp(s - m)
            l, acc = l + p.sum(dim=-1, keepdim=True), acc + p @ v[..., ks:ks + block_size, :]
        out[..., qs:qs + block_size, :] = acc / l
    return out


def test_a_reference_maximum_never_updated_is_rejected(rejects):
    d = rejects(check_tiled_attention, tiled_attention_first_tile_reference, "NaN").diagnosis
    assert "rise by up to 900 from the first tile" in d.tried, d.tried


def tiled_attention_recursive(q, k, v, block_size=64):
    scale = 1 / math.sqrt(q.shape[-1])

    def fold(q_blk, ks, m, l, acc):  # one key block, then the rest
        if ks >= k.shape[-2]:
            return acc / l
        s = q_blk @ k[..., ks:ks + block_size, :].mT * scale
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        p, c = torch.exp(s - m_new), torch.exp(m - m_new)
        return fold(q_blk, ks + block_size, m_new, l * c + p.sum(dim=-1, keepdim=True), acc * c + p @ v[..., ks:ks + block_size, :])
    parts = []
    for qs in range(0, q.shape[-2], block_size):
        q_blk = q[..., qs:qs + block_size, :]
        m = torch.full(q_blk.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        parts.append(fold(q_blk, 0, m, torch.zeros_like(m), torch.zeros(q_blk.shape[:-1] + (v.shape[-1],), dtype=q.dtype)))
    return torch.cat(parts, dim=-2)


def test_tiles_held_by_a_recursion_are_named_as_such(rejects):
    d = rejects(check_tiled_attention, tiled_attention_recursive, "keeps a query block's score tiles alive at once").diagnosis
    assert "held by a call of your function on itself" in d.cause, d.cause


# ============================================================================ round 4: an epsilon in l is no float32
def _with_epsilon(name, eps):
    """The right algorithm with ``eps`` added to the running sum where it divides: float64 all through."""
    def online_softmax(x, block_size=1):
        return _online(x, block_size) * _sums(x) / (_sums(x) + eps)

    def tiled_attention(q, k, v, block_size=64):
        causal = name == "causal_tiled_attention"
        s = q @ k.mT / math.sqrt(q.shape[-1])
        if causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
        return _tiles(q, k, v, block_size, causal=causal) * _sums(s) / (_sums(s) + eps)
    return online_softmax if name == "online_softmax" else tiled_attention


def _sums(s):
    return torch.exp(s - s.amax(dim=-1, keepdim=True)).sum(dim=-1, keepdim=True)


@pytest.mark.parametrize("check, name", [(check_online_softmax, "online_softmax"),
                                         (check_tiled_attention, "tiled_attention"),
                                         (check_causal_tiled_attention, "causal_tiled_attention")])
@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_an_epsilon_in_the_running_sum_is_named_not_called_float32(check, name, eps, rejects):
    """A tiny ε leaves the values within tolerance but off by more than float64 rounding: named as the ε it is,
    not as "part of your computation runs in float32"; a large one is named the same way."""
    d = rejects(check, _with_epsilon(name, eps), "an epsilon added to the sum").diagnosis
    assert "float32" not in d.cause and f"{eps:.2g}" in d.got, d


def tiled_attention_float32_accumulator(q, k, v, block_size=64):
    out = _tiles(q, k, v, block_size)
    return out.float().double() if out.dtype == torch.float64 else out


def test_float32_rounding_is_not_called_an_epsilon(rejects):
    d = rejects(check_tiled_attention, tiled_attention_float32_accumulator, "float64 input, float32 precision").diagnosis
    assert "epsilon" not in d.summary, d
