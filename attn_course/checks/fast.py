"""Checks for notebook 09 (fast attention): ``online_softmax``, ``tiled_attention``, ``causal_tiled_attention``.

Oracles: ``torch.softmax`` and ``F.scaled_dot_product_attention`` (``is_causal`` for the causal one), in
float64. Every argument is varied: block sizes 1, equal to, longer than and not dividing the length;
1-D, batched and batch × head inputs, size-1 axes, n_q ≠ n_k, d_k ≠ d_v, float32 and float64; scores
whose block maxima *rise* (every rescaling matters) and *fall* (a per-block maximum instead of a
running one), and extreme scores (hundreds apart), where only a running maximum keeps exp finite.

How a wrong answer is named (never a guess):

* a known mistake (:data:`SOFTMAX_MISTAKES`, :data:`TILED_MISTAKES`, :data:`CAUSAL_MISTAKES` — each
  a :class:`Known` with the variant of the loop that makes it) is blamed only when it reproduces the
  answer on **every** case the check ran, not just the one that failed: two mistakes that coincide on
  one input are told apart by the others;
* an exception is explained only when a known variant raises the very same message on that input;
* otherwise a property of the answer is measured: wrong only in the last, partial block; every row
  off by its own factor (the normaliser); rows of a causal answer that change when a later key changes;
  and, failing those, :func:`~.compare.describe_mismatch`.

The docstrings also state how the result is computed, and the checks verify that with a wide margin,
on the learner's side (:func:`trace`, a ``@probe``: only plain numbers cross the boundary): which
torch functions ran (no ``torch.softmax``, no fused attention), how many numbers the largest max or sum
combined (one block, not the whole row), the largest tensor created (a tile, never an n × n matrix)
and the matrix-multiply work (each tile once; none above the diagonal when causal).
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, NoReturn, Sequence

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .boundary import probe
from .compare import describe_mismatch
from .core import Failure, Learner, LearnerRaised, as_tensor, check, fail, fmt, learner_error

__all__ = ["check_online_softmax", "check_tiled_attention", "check_causal_tiled_attention", "trace",
           "Known", "Pass", "Loop", "SOFTMAX_MISTAKES", "TILED_MISTAKES", "CAUSAL_MISTAKES"]

Tensor = torch.Tensor


# ============================================================================ the algorithms, step by step
def _blocks(n: int, b: int) -> list[tuple[int, int]]:
    """(start, end) of each block of ``b`` among ``n`` positions; the last may be shorter."""
    return [(s, min(s + b, n)) for s in range(0, n, b)]


def _shrink(m_old: Tensor, m_new: Tensor) -> Tensor:
    return torch.exp(m_old - m_new)


def _grow(m_old: Tensor, m_new: Tensor) -> Tensor:  # the sign error: exp(+inf) = inf on the first block
    return torch.exp(m_new - m_old)


def _grow_guarded(m_old: Tensor, m_new: Tensor) -> Tensor:  # the sign error, first block guarded
    return torch.where(torch.isinf(m_old), torch.ones_like(m_new), torch.exp(m_new - m_old))


def _one(m_old: Tensor, m_new: Tensor) -> Tensor:
    return torch.ones_like(m_new)


def _running_max(m: Tensor, block_max: Tensor) -> Tensor:
    return torch.maximum(m, block_max)


def _block_max_only(m: Tensor, block_max: Tensor) -> Tensor:
    return block_max


def _zero_max(m: Tensor, block_max: Tensor) -> Tensor:
    return torch.zeros_like(block_max)


@dataclass(frozen=True)
class Pass:
    """The online softmax with each step a parameter; the defaults are the right algorithm, and a known
    mistake changes one step. ``blocks(n, b)`` gives the (start, end) of the blocks read; ``new_max(m,
    block max)`` the new running max; ``factor(m_old, m_new)`` what the running sum is multiplied by;
    ``finish(x, m, l)`` the result; ``start`` the running max before the first block; ``block_max`` a
    block's largest value."""

    blocks: Callable[[int, int], list[tuple[int, int]]] = _blocks
    block_max: Callable[[Tensor], Tensor] = lambda block: block.amax(-1, keepdim=True)
    new_max: Callable[[Tensor, Tensor], Tensor] = _running_max
    factor: Callable[[Tensor, Tensor], Tensor] = _shrink
    finish: Callable[[Tensor, Tensor, Tensor], Tensor] = lambda x, m, l: torch.exp(x - m) / l
    start: float = -math.inf

    def __call__(self, x: Tensor, b: int) -> Tensor:
        m = torch.full(x.shape[:-1] + (1,), self.start, dtype=x.dtype)  # (..., 1)
        l = torch.zeros_like(m)
        for s, e in self.blocks(x.shape[-1], b):
            block = x[..., s:e]
            m_new = self.new_max(m, self.block_max(block))
            l = l * self.factor(m, m_new) + torch.exp(block - m_new).sum(-1, keepdim=True)
            m = m_new
        return self.finish(x, m, l)


def _per_block_softmax(x: Tensor, b: int) -> Tensor:
    return torch.cat([torch.softmax(x[..., s:e], -1) for s, e in _blocks(x.shape[-1], b)], -1)


def _softmax_no_keepdim(x: Tensor, b: int) -> Tensor:  # raises on inputs with leading axes
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s, e in _blocks(x.shape[-1], b):
        block = x[..., s:e]
        m_new = torch.maximum(m, block.amax(-1))
        l = l * torch.exp(m - m_new) + torch.exp(block - m_new).sum(-1)
        m = m_new
    return torch.exp(x - m) / l


def _key_blocks(n_k: int, b: int, q_start: int, q_end: int, causal: bool) -> list[tuple[int, int]]:
    """The key blocks a query block [q_start, q_end) visits: all, or (causal) those starting before q_end."""
    return [(s, e) for s, e in _blocks(n_k, b) if not causal or s < q_end]


def _causal_hide(rows: Tensor, cols: Tensor, q_start: int, k_start: int) -> Tensor:
    return cols > rows


def _acc_update(acc: Tensor, correction: Tensor, p: Tensor, v_blk: Tensor, l_old: Tensor, l_new: Tensor) -> Tensor:
    return acc * correction + p @ v_blk


@dataclass(frozen=True)
class Loop:
    """The tiled attention loop with each step a parameter; the defaults are the right algorithm
    (FlashAttention-2's forward), and a known mistake changes one step.

    ``scale(q, k, v, b)``; ``q_blocks(n_q, b)`` and ``k_blocks(n_k, b, q_start, q_end, causal)`` the
    blocks visited; ``hide(rows, cols, q_start, k_start)`` the causal mask of a tile (global
    positions); ``masked(q_start, q_end, k_start, k_end)`` whether a tile is masked at all;
    ``tile_max(s)`` a tile's row max; ``new_max``, ``sum_factor``, ``acc_factor`` as in :class:`Pass`;
    ``acc_update``; ``finish(acc, l)``; ``short``: rows never computed are left out instead of 0;
    ``start``: the running max before the first tile; ``fill``: what masked scores are set to.
    """

    scale: Callable[[Tensor, Tensor, Tensor, int], float] = lambda q, k, v, b: 1 / math.sqrt(q.shape[-1])
    q_blocks: Callable[[int, int], list[tuple[int, int]]] = _blocks
    k_blocks: Callable[[int, int, int, int, bool], list[tuple[int, int]]] = _key_blocks
    hide: Callable[[Tensor, Tensor, int, int], Tensor] | None = _causal_hide
    masked: Callable[[int, int, int, int], bool] = lambda qs, qe, ks, ke: ke - 1 > qs
    tile_max: Callable[[Tensor], Tensor] = lambda s: s.amax(-1, keepdim=True)
    new_max: Callable[[Tensor, Tensor], Tensor] = _running_max
    sum_factor: Callable[[Tensor, Tensor], Tensor] = _shrink
    acc_factor: Callable[[Tensor, Tensor], Tensor] = _shrink
    acc_update: Callable[..., Tensor] = _acc_update
    finish: Callable[[Tensor, Tensor], Tensor] = lambda acc, l: acc / l
    short: bool = False
    start: float = -math.inf
    fill: float = -math.inf

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, b: int, causal: bool) -> Tensor:
        n_q, n_k = q.shape[-2], k.shape[-2]
        scale = self.scale(q, k, v, b)
        out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)  # (..., n_q, d_v)
        done = 0
        for qs, qe in self.q_blocks(n_q, b):
            q_blk = q[..., qs:qe, :]
            m = torch.full(q_blk.shape[:-1] + (1,), self.start, dtype=q.dtype)
            l = torch.zeros_like(m)
            acc = torch.zeros(q_blk.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
            for ks, ke in self.k_blocks(n_k, b, qs, qe, causal):
                s = q_blk @ k[..., ks:ke, :].transpose(-2, -1) * scale  # (..., b_q, b_k)
                if causal and self.hide is not None and self.masked(qs, qe, ks, ke):
                    rows = torch.arange(qs, qe)[:, None]
                    cols = torch.arange(ks, min(ke, n_k))[None, :]
                    s = s.masked_fill(self.hide(rows, cols, qs, ks), self.fill)
                m_new = self.new_max(m, self.tile_max(s))
                p = torch.exp(s - m_new)
                l_new = l * self.sum_factor(m, m_new) + p.sum(-1, keepdim=True)
                acc = self.acc_update(acc, self.acc_factor(m, m_new), p, v[..., ks:ke, :], l, l_new)
                l, m = l_new, m_new
            out[..., qs:qe, :] = self.finish(acc, l)
            done = max(done, qe)
        return out[..., :done, :] if self.short else out


def _tiles_of(size: Callable[[int, int], int]) -> Callable[[int, int], list[tuple[int, int]]]:
    """Blocks whose end is computed by ``size(start, b)`` instead of start + b (slicing off by one)."""
    return lambda n, b: [(s, min(size(s, b), n)) for s in range(0, n, b) if min(size(s, b), n) > s]


def _no_tail(n: int, b: int) -> list[tuple[int, int]]:  # range(0, n - n % b, b): the partial block is never read
    return [(s, s + b) for s in range(0, n - n % b, b)]


def _drop_last(n: int, b: int) -> list[tuple[int, int]]:  # range(0, n - b, b): the last block is never read
    return [(s, min(s + b, n)) for s in range(0, n - b, b)]


def _acc_normalised_each_step(acc, correction, p, v_blk, l_old, l_new):
    return (acc * correction + p @ v_blk) / l_new  # normalised, but the old acc is never multiplied back by l_old


def _tile_softmax(acc, correction, p, v_blk, l_old, l_new):
    return acc * correction + (p / p.sum(-1, keepdim=True)) @ v_blk


def _sqrt_of(size: Callable[[Tensor, Tensor, Tensor, int], int]) -> Callable[[Tensor, Tensor, Tensor, int], float]:
    return lambda q, k, v, b: 1 / math.sqrt(size(q, k, v, b))


# ============================================================================ known mistakes, as data
@dataclass(frozen=True)
class Known:
    """A known mistake: ``summary`` (grade tables), ``cause`` and ``fix`` (second person), and ``make``,
    the variant of the algorithm that makes it (a :class:`Pass` or :class:`Loop`, or any function with
    the exercise's arguments plus, for attention, ``causal``)."""

    key: str
    summary: str
    cause: str
    fix: str
    make: Callable[..., Tensor]


_RESCALE_FIX = "multiply by exp(m_old − m_new) (≤ 1) before adding the new block's terms"
_TAIL_FIX = ("loop with range(0, n, block_size) and slice [start:start + block_size]: slicing stops at the end "
             "by itself, so the last, shorter block is read too")

SOFTMAX_MISTAKES: list[Known] = [
    Known("no_max", "no running maximum subtracted",
          "you exponentiated the raw values, so exp overflowed to inf for values near 1000 (inf / inf = NaN)",
          "keep a running max m and exponentiate x − m", Pass(new_max=_zero_max)),
    Known("sum", "running sum not rescaled",
          "you added each block's Σ exp(x − m_new) to a running sum that was still relative to the old maximum",
          "when the maximum grows, " + _RESCALE_FIX, Pass(factor=_one)),
    Known("sign", "running sum rescaled by exp(m_new − m_old)",
          "you rescaled the running sum by exp(m_new − m_old): the sign is reversed (it must shrink the old sum, "
          "and on the first block exp(m_new − (−inf)) = inf)", _RESCALE_FIX, Pass(factor=_grow)),
    Known("sign", "running sum rescaled by exp(m_new − m_old)",
          "you rescaled the running sum by exp(m_new − m_old): the sign is reversed, so the old sum grows instead "
          "of shrinking", _RESCALE_FIX, Pass(factor=_grow_guarded)),
    Known("blockmax", "per-block maximum instead of a running one",
          "you replaced m by each block's own maximum instead of max(m, block maximum): when a block's maximum "
          "falls far below an earlier one, exp(m_old − m_new) overflows",
          "keep m = torch.maximum(m, block.amax(-1, keepdim=True)): the maximum of everything read so far",
          Pass(new_max=_block_max_only)),
    Known("amin", "block minimum instead of maximum",
          "you took each block's smallest value (amin) as the reference, so exp(x − m) overflows when a block's "
          "values are far apart", "take the block's largest value: block.amax(dim=-1, keepdim=True)",
          Pass(block_max=lambda block: block.amin(-1, keepdim=True))),
    Known("start0", "running max started at 0",
          "you started the running max at 0 instead of −inf, so it never falls below 0: a row whose values are all "
          "far below 0 underflows to exp(−800) = 0 and gives 0/0 = NaN",
          "start m at −inf: torch.full(x.shape[:-1] + (1,), float('-inf'))", Pass(start=0.0)),
    Known("division", "final division missing", "you returned exp(x − m) without dividing by the running sum l",
          "return torch.exp(x - m) / l", Pass(finish=lambda x, m, l: torch.exp(x - m))),
    Known("final_raw", "exp(x) instead of exp(x − m) at the end",
          "your last step computes exp(x) / l, but l is a sum of exp(x − m): the two do not match",
          "return torch.exp(x - m) / l", Pass(finish=lambda x, m, l: torch.exp(x) / l)),
    Known("tail", "last, shorter block dropped",
          "your loop stops before the last block when n is not a multiple of block_size, so those columns never "
          "reach the running max and sum", _TAIL_FIX, Pass(blocks=_no_tail)),
    Known("last", "last block dropped",
          "your loop (range(0, n - block_size, block_size)) never reads the last block", _TAIL_FIX,
          Pass(blocks=_drop_last)),
    Known("short_slice", "each block one column short",
          "you sliced [start:start + block_size - 1], so the last column of every block is skipped",
          "slice [start:start + block_size]: the end of a slice is not included",
          Pass(blocks=_tiles_of(lambda s, b: s + b - 1))),
    Known("long_slice", "blocks overlap by one column",
          "you sliced [start:start + block_size + 1], so the first column of each next block is counted twice",
          "slice [start:start + block_size]", Pass(blocks=_tiles_of(lambda s, b: s + b + 1))),
    Known("per_block", "each block normalised on its own",
          "you took a softmax inside each block, so each block sums to 1 instead of the whole row",
          "normalise once, at the end: exp(x − m) / l with m and l over the whole row", _per_block_softmax),
]

_SOFTMAX_RAISES = [
    ("keepdim", "you took the block's max (or sum) without keepdim=True, so a (..., 1) tensor met a (...,) one "
                "and broadcast into the wrong shape", "reduce with keepdim=True: block.amax(dim=-1, keepdim=True)",
     _softmax_no_keepdim),
]

_SCALE_FIX = "multiply q kᵀ by 1/√d_k, with d_k = q.shape[-1]"

TILED_MISTAKES: list[Known] = [
    Known("noscale", "scores not scaled", "you did not multiply the scores by 1/√d_k", _SCALE_FIX,
          Loop(scale=lambda q, k, v, b: 1.0)),
    Known("dk", "divided by d_k instead of √d_k", "you divided the scores by d_k", _SCALE_FIX,
          Loop(scale=lambda q, k, v, b: 1 / q.shape[-1])),
    Known("times", "multiplied by √d_k", "you multiplied the scores by √d_k instead of dividing", _SCALE_FIX,
          Loop(scale=lambda q, k, v, b: math.sqrt(q.shape[-1]))),
    Known("dv", "scaled by √d_v instead of √d_k", "you scaled by the square root of d_v, the width of v", _SCALE_FIX,
          Loop(scale=_sqrt_of(lambda q, k, v, b: v.shape[-1]))),
    Known("nk", "scaled by √n_k instead of √d_k", "you scaled by the square root of the number of keys", _SCALE_FIX,
          Loop(scale=_sqrt_of(lambda q, k, v, b: k.shape[-2]))),
    Known("block_scale", "scaled by √block_size instead of √d_k", "you scaled by the square root of block_size",
          _SCALE_FIX, Loop(scale=_sqrt_of(lambda q, k, v, b: b))),
    Known("sum", "running sum not rescaled",
          "you rescaled the accumulator when the maximum grew, but not the running sum l",
          "multiply l too by exp(m_old − m_new) before adding the new tile's row sums", Loop(sum_factor=_one)),
    Known("acc", "accumulator not rescaled",
          "you rescaled the running sum when the maximum grew, but not the output accumulator acc",
          "multiply acc too by exp(m_old − m_new) before adding p @ v_block", Loop(acc_factor=_one)),
    Known("neither", "running sum and accumulator not rescaled",
          "you never rescaled l or acc when the maximum grew: both still hold terms relative to the old maximum",
          "multiply both l and acc by exp(m_old − m_new) before adding the new tile", Loop(sum_factor=_one, acc_factor=_one)),
    Known("sign", "rescaled by exp(m_new − m_old)",
          "you rescaled by exp(m_new − m_old): the sign is reversed (on the first tile exp(m_new − (−inf)) = inf, "
          "and 0 × inf = NaN)", "rescale by exp(m_old − m_new), which is ≤ 1",
          Loop(sum_factor=_grow, acc_factor=_grow)),
    Known("sign", "rescaled by exp(m_new − m_old)",
          "you rescaled by exp(m_new − m_old): the sign is reversed, so old terms grow instead of shrinking",
          "rescale by exp(m_old − m_new), which is ≤ 1", Loop(sum_factor=_grow_guarded, acc_factor=_grow_guarded)),
    Known("blockmax", "per-tile maximum instead of a running one",
          "you replaced m by each tile's own row maximum instead of max(m, tile maximum): when a tile's maximum "
          "falls far below an earlier one, exp(m_old − m_new) overflows",
          "keep m = torch.maximum(m, s.amax(-1, keepdim=True)): the maximum over every tile so far",
          Loop(new_max=_block_max_only)),
    Known("tilemax", "one maximum for the whole tile, not per row",
          "you took the maximum over the whole tile (all its rows) instead of per query row: a row far below it "
          "underflows to 0 and its output is 0/0",
          "take the maximum along the keys only: s.amax(dim=-1, keepdim=True)",
          Loop(tile_max=lambda s: s.amax((-2, -1), keepdim=True))),
    Known("amin", "tile minimum instead of maximum",
          "you took each tile row's smallest score (amin) as the reference, so exp(s − m) overflows when a tile's "
          "scores are far apart", "take the row maximum: s.amax(dim=-1, keepdim=True)",
          Loop(tile_max=lambda s: s.amin(-1, keepdim=True))),
    Known("start0", "running max started at 0",
          "you started the running max at 0 instead of −inf, so it never falls below 0: a query whose scores are "
          "all far below 0 underflows to exp(−800) = 0 and gives 0/0 = NaN",
          "start m at −inf: torch.full(q_blk.shape[:-1] + (1,), float('-inf'))", Loop(start=0.0)),
    Known("no_max", "no running maximum subtracted",
          "you exponentiated the raw scores, so exp overflowed to inf for scores in the hundreds",
          "keep a running row max m and exponentiate s − m", Loop(new_max=_zero_max)),
    Known("division", "final division missing",
          "you returned the accumulator Σ exp(s − m)·v without dividing it by the running sum l",
          "after the last key block, divide: acc / l", Loop(finish=lambda acc, l: acc)),
    Known("per_step", "accumulator normalised at every tile",
          "you divided acc by l inside the loop, but the next tile adds unnormalised p @ v to it",
          "keep acc unnormalised in the loop and divide by l once, after the last key block",
          Loop(acc_update=_acc_normalised_each_step, finish=lambda acc, l: acc)),
    Known("per_step", "accumulator normalised at every tile",
          "you divided acc by l inside the loop (and again at the end), but the next tile adds unnormalised p @ v "
          "to it", "keep acc unnormalised in the loop and divide by l once, after the last key block",
          Loop(acc_update=_acc_normalised_each_step)),
    Known("per_block", "each tile normalised on its own",
          "you normalised each tile's probabilities by their own sum before multiplying by v_block",
          "add the unnormalised p @ v_block to acc and divide by l once, at the end", Loop(acc_update=_tile_softmax)),
    Known("k_tail", "last, shorter key block dropped",
          "your key loop stops before the last key block when n_k is not a multiple of block_size, so those keys "
          "get no weight", _TAIL_FIX, Loop(k_blocks=lambda n, b, qs, qe, c: [t for t in _no_tail(n, b) if not c or t[0] < qe])),
    Known("k_last", "last key block dropped",
          "your key loop (range(0, n_k - block_size, block_size)) never visits the last key block", _TAIL_FIX,
          Loop(k_blocks=lambda n, b, qs, qe, c: [t for t in _drop_last(n, b) if not c or t[0] < qe])),
    Known("k_short", "each key block one key short",
          "you sliced the keys [start:start + block_size - 1], so the last key of every block is skipped",
          "slice [start:start + block_size]: the end of a slice is not included",
          Loop(k_blocks=lambda n, b, qs, qe, c: [t for t in _tiles_of(lambda s, b: s + b - 1)(n, b) if not c or t[0] < qe])),
    Known("k_long", "key blocks overlap by one key",
          "you sliced the keys [start:start + block_size + 1], so the first key of each next block counts twice",
          "slice [start:start + block_size]",
          Loop(k_blocks=lambda n, b, qs, qe, c: [t for t in _tiles_of(lambda s, b: s + b + 1)(n, b) if not c or t[0] < qe])),
    Known("q_tail", "last, shorter query block not computed",
          "your query loop stops before the last query block when n_q is not a multiple of block_size, so those "
          "rows are never written", _TAIL_FIX, Loop(q_blocks=_no_tail)),
    Known("q_tail", "last, shorter query block not computed",
          "your query loop stops before the last query block when n_q is not a multiple of block_size, so those "
          "rows are missing from the output", _TAIL_FIX, Loop(q_blocks=_no_tail, short=True)),
]

_CAUSAL_FIX = ("mask, in the tiles that reach above the diagonal, the scores whose key position is greater than the "
               "query position: s.masked_fill(cols > rows, -inf) with global positions rows = q_start + i, "
               "cols = k_start + j")

CAUSAL_MISTAKES: list[Known] = [
    Known("not_causal", "not causal", "you computed full attention: every query also sees the keys after it",
          "visit only key blocks that start before the query block ends, and " + _CAUSAL_FIX,
          Loop(hide=None, k_blocks=lambda n, b, qs, qe, c: _blocks(n, b))),
    Known("above_unmasked", "tiles above the diagonal computed and not masked",
          "your key loop runs past the diagonal tile, and those tiles are not masked, so queries see future keys",
          "stop the key loop at the diagonal: range(0, q_end, block_size)",
          Loop(k_blocks=lambda n, b, qs, qe, c: _blocks(n, b), masked=lambda qs, qe, ks, ke: ks == qs)),
    Known("above_unmasked", "one tile past the diagonal computed and not masked",
          "your key loop goes one block past the diagonal (range(0, q_end + block_size, …)), and that tile is not "
          "masked, so queries see the next block of keys", "stop the key loop at the diagonal: range(0, q_end, block_size)",
          Loop(k_blocks=lambda n, b, qs, qe, c: [t for t in _blocks(n, b) if t[0] < qe + b],
               masked=lambda qs, qe, ks, ke: ks == qs)),
    Known("diag_unmasked", "diagonal tile not masked",
          "you skip the tiles above the diagonal but do not mask inside the diagonal tile, so a query still sees "
          "the later keys of its own block", _CAUSAL_FIX, Loop(hide=lambda r, c, qs, ks: torch.zeros_like(c > r))),
    Known("excl_self", "mask hides the query's own key",
          "your mask hides key ≥ query instead of key > query, so no query sees itself and the first one sees "
          "nothing at all (0/0 = NaN)", "mask only key > query: a query may attend to itself",
          Loop(hide=lambda r, c, qs, ks: c >= r)),
    Known("one_ahead", "mask one position late",
          "your mask hides key > query + 1, so every query also sees the next key", "mask key > query",
          Loop(hide=lambda r, c, qs, ks: c > r + 1)),
    Known("swapped", "mask hides the past instead of the future",
          "your mask compares the wrong way round (key < query), so queries see later keys instead of earlier ones",
          "mask where the key position is greater than the query position: cols > rows",
          Loop(hide=lambda r, c, qs, ks: c < r)),
    Known("local", "mask from positions inside the tile",
          "you built the causal mask from positions inside the tile (a triangle on every tile) instead of global "
          "positions, so tiles below the diagonal lose keys they may see",
          "compare global positions, q_start + i and k_start + j, or mask only tiles that reach above the diagonal",
          Loop(hide=lambda r, c, qs, ks: (c - ks) > (r - qs), masked=lambda qs, qe, ks, ke: True)),
    *[Known("weak_fill", "masked scores filled with a finite value",
            "you filled the masked scores with a finite number that is not far enough below scores around −20000, "
            "so the masked (future) keys still get weight", "fill with float('-inf')", Loop(fill=fill))
      for fill in (-1e4, -1e3, -1e2, -30.0)],
    Known("skip_diag", "diagonal tile skipped",
          "your key loop stops before the diagonal tile (range(0, q_start, …)): the first query block sees no key "
          "at all (0/0 = NaN) and every query misses the keys of its own block",
          "visit key blocks up to and including the diagonal: range(0, q_end, block_size)",
          Loop(k_blocks=lambda n, b, qs, qe, c: [t for t in _blocks(n, b) if t[0] < qs])),
    Known("skip_diag", "diagonal tile skipped",
          "your key loop stops before the diagonal tile (range(0, q_start, …)): the first query block sees no key "
          "(its rows come out as 0) and every query misses the keys of its own block",
          "visit key blocks up to and including the diagonal: range(0, q_end, block_size)",
          Loop(k_blocks=lambda n, b, qs, qe, c: [t for t in _blocks(n, b) if t[0] < qs],
               finish=lambda acc, l: torch.where(l > 0, acc / torch.where(l > 0, l, torch.ones_like(l)),
                                                 torch.zeros_like(acc)))),
    *TILED_MISTAKES,
]


def _tiled_out_q_width(q, k, v, b, causal):  # the output allocated with q's width d_k: raises when d_v ≠ d_k
    out = torch.zeros(q.shape, dtype=q.dtype)
    for qs, qe in _blocks(q.shape[-2], b):
        out[..., qs:qe, :] = torch.zeros(q.shape[:-2] + (qe - qs, v.shape[-1]), dtype=q.dtype)
    return out


def _tiled_no_keepdim(q, k, v, b, causal):
    q_blk, k_blk = q[..., :b, :], k[..., :b, :]
    s = q_blk @ k_blk.transpose(-2, -1)
    m = torch.full(q_blk.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
    m_new = torch.maximum(m, s.amax(-1))
    p = torch.exp(s - m_new)
    return p @ v[..., :b, :] + torch.zeros(q_blk.shape[:-1] + (1,), dtype=q.dtype) * torch.exp(m - m_new)


def _tiled_kT(q, k, v, b, causal):
    return q[..., :b, :] @ k[..., :b, :].T


_TILED_RAISES = [
    ("q_width", "you allocated the output (or acc) with q's width d_k, but each output row is a mix of rows of v, "
                "which have d_v columns", "allocate with v.shape[-1] columns: torch.empty(q.shape[:-1] + (v.shape[-1],))",
     _tiled_out_q_width),
    ("keepdim", "you took the row max (or sum) without keepdim=True, so a (…, b, 1) tensor met a (…, b) one and "
                "broadcast into the wrong shape", "reduce with keepdim=True: s.amax(dim=-1, keepdim=True)",
     _tiled_no_keepdim),
    ("kT", "k.T reverses *all* axes of a batched k, not just the last two", "transpose the last two axes: "
           "k_block.transpose(-2, -1) (or k_block.mT)", _tiled_kT),
]


# ============================================================================ the cases
@dataclass
class Case:
    """One input of a check: ``args`` as the learner gets them, ``expected`` from the oracle (float64),
    and what the text says about it."""

    name: str
    args: tuple
    expected: Tensor
    atol: float
    rtol: float
    block: int
    causal: bool = False


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return (1e-5, 1e-4) if dtype == torch.float64 else (2e-5, 1e-3)


def _block_offsets(n: int, b: int, pattern: str, spread: float, g: torch.Generator) -> Tensor:
    """(n,) an offset per position, constant on each block: maxima that rise, fall, or both."""
    count = len(_blocks(n, b))
    if pattern == "rising":
        levels = torch.linspace(0, spread, count, dtype=torch.float64)
    elif pattern == "falling":
        levels = torch.linspace(spread, 0, count, dtype=torch.float64)
    else:  # mixed: up, down, up… with random sizes
        steps = (torch.rand(count, generator=g, dtype=torch.float64) + 0.5) * spread
        levels = torch.cumsum(steps * torch.tensor([(-1.0) ** i for i in range(count)], dtype=torch.float64), 0)
    return levels.repeat_interleave(b)[:n]


def _rows(shape: tuple[int, ...], b: int, seed: int, pattern: str = "mixed", spread: float = 4.0,
          dtype: torch.dtype = torch.float64) -> Tensor:
    g = _gen(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    return (x + _block_offsets(shape[-1], b, pattern, spread, g)).to(dtype)


def _softmax_case(name: str, x: Tensor, b: int) -> Case:
    atol, rtol = _tolerance(x.dtype)
    return Case(name, (x, b), torch.softmax(x.double(), -1), atol, rtol, b)


def _extreme_rows(levels: Sequence[Sequence[float]], b: int, seed: int) -> Tensor:
    """Rows whose blocks sit at the given levels (plus a little noise in [0, 5))."""
    g = _gen(seed)
    rows = [torch.tensor(level, dtype=torch.float64).repeat_interleave(b) for level in levels]
    x = torch.stack(rows)
    return x + 5 * torch.rand(x.shape, generator=g, dtype=torch.float64)


@functools.lru_cache(maxsize=None)
def softmax_cases() -> tuple[Case, ...]:
    """The inputs ``check_online_softmax`` tries, in order."""
    f32 = torch.float32
    extreme = _extreme_rows([[800, -200, 700], [-300, 300, 900], [100, -700, 90], [750, 740, 745],
                             [-800, -790, -805]], 4, 7)
    extreme32 = _extreme_rows([[60, -60, 50], [-30, 30, 95], [20, -80, 15], [95, 90, 93], [-120, -110, -115]],
                              4, 8).to(f32)
    return (
        _softmax_case("x (4, 10) whose block maxima rise, block_size 3", _rows((4, 10), 3, 1, "rising"), 3),
        _softmax_case("x (3, 12) whose block maxima fall, then rise, block_size 4", _rows((3, 12), 4, 2), 4),
        _softmax_case("x (4, 10) whose block maxima fall, block_size 4", _rows((4, 10), 4, 3, "falling"), 4),
        _softmax_case("x (3, 7), block_size 1", _rows((3, 7), 1, 4), 1),
        _softmax_case("a 1-D x (9,), block_size 4", _rows((9,), 4, 5), 4),
        _softmax_case("x (2, 3, 12) (batch × rows), block_size 5", _rows((2, 3, 12), 5, 6), 5),
        _softmax_case("x (2, 8), block_size 8 (one block)", _rows((2, 8), 8, 9), 8),
        _softmax_case("x (3, 7), block_size 16 (longer than the row)", _rows((3, 7), 16, 10), 16),
        _softmax_case("x (2, 1, 1) (n = 1), block_size 3", _rows((2, 1, 1), 3, 11), 3),
        _softmax_case("x (4, 10) in float32, block_size 3", _rows((4, 10), 3, 12, dtype=f32), 3),
        _softmax_case("x (5, 12) with values in the hundreds whose block maxima rise and fall by up to 1000, "
                      "block_size 4", extreme, 4),
        _softmax_case("x (5, 12) in float32 with block maxima that rise and fall by up to 125, block_size 4",
                      extreme32, 4),
        _softmax_case("x (3, 8) in float32 whose blocks span up to 200, block_size 4", _SPREAD.to(f32), 4),
    )


#: Rows whose blocks of 4 each span 200: a reference other than the block's maximum overflows float32.
_SPREAD = torch.tensor([[-100.0, 0.0, 50.0, 100.0, -90.0, 10.0, 60.0, 95.0],
                        [30.0, -120.0, 80.0, -40.0, 85.0, -110.0, 5.0, 70.0],
                        [0.5, -1.0, 2.0, 0.0, 1.5, -0.5, 1.0, 3.0]], dtype=torch.float64)


def _qkv(lead: tuple[int, ...], n_q: int, n_k: int, d_k: int, d_v: int, b: int, seed: int, pattern: str = "mixed",
         dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v whose scores, key block by key block, rise and fall (q leans towards the all-ones direction,
    each key block is shifted along it)."""
    g = _gen(seed)
    q = torch.randn(*lead, n_q, d_k, generator=g, dtype=torch.float64) + 1.0
    k = torch.randn(*lead, n_k, d_k, generator=g, dtype=torch.float64)
    k = k + _block_offsets(n_k, b, pattern, 2.0, g)[:, None]
    v = torch.randn(*lead, n_k, d_v, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _extreme_qkv(levels: Sequence[Sequence[float]], b: int, d_v: int, seed: int,
                 dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor, Tensor]:
    """Scores exactly as wanted: q = the scores, k = √d_k · I with d_k = n_k, so q kᵀ / √d_k = q."""
    s = _extreme_rows(levels, b, seed)  # (n_q, n_k)
    n_k = s.shape[-1]
    k = math.sqrt(n_k) * torch.eye(n_k, dtype=torch.float64)
    v = torch.randn(n_k, d_v, generator=_gen(seed + 100), dtype=torch.float64)
    return s.to(dtype), k.to(dtype), v.to(dtype)


def _exact_qkv(scores: Tensor, d_v: int, seed: int, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v with q kᵀ / √d_k equal to ``scores`` (n_q, n_k): q = scores, k = √n_k · I."""
    n_k = scores.shape[-1]
    v = torch.randn(n_k, d_v, generator=_gen(seed), dtype=torch.float64)
    return scores.to(dtype), (math.sqrt(n_k) * torch.eye(n_k, dtype=torch.float64)).to(dtype), v.to(dtype)


def _attention_case(name: str, qkv: tuple[Tensor, Tensor, Tensor], b: int, causal: bool) -> Case:
    q, k, v = qkv
    atol, rtol = _tolerance(q.dtype)
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    return Case(name, (q, k, v, b), expected, atol, rtol, b, causal)


def _worked() -> tuple[Tensor, Tensor, Tensor]:
    from ..dot import worked_example

    return worked_example()


@functools.lru_cache(maxsize=None)
def tiled_cases() -> tuple[Case, ...]:
    """The inputs ``check_tiled_attention`` tries, in order."""
    f32 = torch.float32
    extreme = _extreme_qkv([[800, -200], [-300, 300], [-700, -705], [750, 740], [100, -700], [-20, -25],
                            [-800, -790]], 4, 3, 21)
    extreme32 = _extreme_qkv([[60, -60], [-30, 30], [-100, -105], [95, 90], [20, -80], [-2, -5], [-120, -110]],
                             4, 3, 22, f32)
    cases = [
        ("the 4×8 worked example (n = 4, d_k = d_v = 8), block_size 2", _worked(), 2),
        ("q (10, 4), k (10, 4), v (10, 5) with rising scores, block_size 4", _qkv((), 10, 10, 4, 5, 4, 11, "rising"), 4),
        ("batch × heads (2, 3), n = 37, d_k = 8, d_v = 3, block_size 16", _qkv((2, 3), 37, 37, 8, 3, 16, 12), 16),
        ("q, k (12, 4), v (12, 2), block_size 1", _qkv((), 12, 12, 4, 2, 1, 13), 1),
        ("n_q = 7 queries, n_k = 13 keys, d_k = 4, d_v = 6, block_size 4", _qkv((), 7, 13, 4, 6, 4, 14), 4),
        ("n_q = 13 queries, n_k = 5 keys, d_k = 3, d_v = 2, block_size 4", _qkv((), 13, 5, 3, 2, 4, 15), 4),
        ("q, k (9, 4), v (9, 4), block_size 32 (longer than the sequence)", _qkv((), 9, 9, 4, 4, 32, 16), 32),
        ("a batch of 2, n = 24, d_k = 8, d_v = 8 in float32, block_size 8",
         _qkv((2,), 24, 24, 8, 8, 8, 17, dtype=f32), 8),
        ("one query over 6 keys, size-1 axes: q (1, 1, 1, 5), v (1, 1, 6, 1), block_size 4",
         _qkv((1, 1), 1, 6, 5, 1, 4, 18), 4),
        ("a single key (n_k = 1), q (3, 4), block_size 2", _qkv((), 3, 1, 4, 2, 2, 19), 2),
        ("scores in the hundreds whose tile maxima rise and fall by up to 1000 (7 queries, 8 keys), block_size 4",
         extreme, 4),
        ("float32 scores whose tile maxima rise and fall by up to 120 (7 queries, 8 keys), block_size 4",
         extreme32, 4),
        ("float32 scores whose tiles span up to 200 (3 queries, 8 keys), block_size 4",
         _exact_qkv(_SPREAD, 3, 23, f32), 4),
    ]
    return tuple(_attention_case(name, qkv, b, False) for name, qkv, b in cases)


@functools.lru_cache(maxsize=None)
def causal_cases() -> tuple[Case, ...]:
    """The inputs ``check_causal_tiled_attention`` tries, in order."""
    f32 = torch.float32
    extreme = _extreme_qkv([[800, -200, 700, -100], [-300, 300, -10, 900], [750, 740, 745, 748], [100, -700, 90, -650],
                            [-20, -25, -700, -10], [-800, -790, -805, -795], [-20000, -20010, -19995, -20005], [-100, 600, -200, 650]],
                           2, 3, 31)
    extreme32 = _extreme_qkv([[60, -60, 50, -20], [-30, 30, -10, 95], [95, 90, 93, 94], [20, -80, 15, -75],
                              [-2, -5, -100, -1], [-120, -110, -115, -112], [40, -50, 38, -60], [-10, 80, -20, 85]], 2, 3, 32, f32)
    cases = [
        ("the 4×8 worked example (n = 4, d_k = d_v = 8), block_size 2", _worked(), 2),
        ("q, k (10, 4), v (10, 5) with rising scores, block_size 4", _qkv((), 10, 10, 4, 5, 4, 21, "rising"), 4),
        ("batch × heads (2, 3), n = 37, d_k = 8, d_v = 3, block_size 16", _qkv((2, 3), 37, 37, 8, 3, 16, 22), 16),
        ("q, k (12, 4), v (12, 2), block_size 1", _qkv((), 12, 12, 4, 2, 1, 23), 1),
        ("q, k (10, 4), v (10, 3), block_size 5 (n a multiple of the block)", _qkv((), 10, 10, 4, 3, 5, 24), 5),
        ("q, k (11, 3), v (11, 2) with falling scores, block_size 3", _qkv((), 11, 11, 3, 2, 3, 25, "falling"), 3),
        ("q, k (9, 4), v (9, 4), block_size 32 (longer than the sequence)", _qkv((), 9, 9, 4, 4, 32, 26), 32),
        ("a batch of 2, n = 24, d_k = 8, d_v = 8 in float32, block_size 8",
         _qkv((2,), 24, 24, 8, 8, 8, 27, dtype=f32), 8),
        ("a single position (n = 1) with size-1 axes: q (1, 1, 1, 5), v (1, 1, 1, 1), block_size 4",
         _qkv((1, 1), 1, 1, 5, 1, 4, 28), 4),
        ("scores from −20000 to 900 whose tile maxima rise and fall by up to 1000 (n = 8), block_size 2", extreme, 2),
        ("float32 scores whose tile maxima rise and fall by up to 120 (n = 8), block_size 2", extreme32, 2),
    ]
    return tuple(_attention_case(name, qkv, b, True) for name, qkv, b in cases)


# ============================================================================ what the learner's code does: a probe
_SOFTMAX_FUNCTIONS = {"softmax", "log_softmax", "_softmax", "_log_softmax", "_safe_softmax"}
_FUSED_FUNCTIONS = {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
                    "_scaled_dot_product_attention_math", "multi_head_attention_forward"}
_REDUCTIONS = {"amax", "amin", "max", "min", "sum", "nansum", "mean", "logsumexp", "prod", "norm", "std", "var"}


class _Watch(TorchFunctionMode):
    """Records, for every torch function the code calls: its name, the elements of the tensors it returns,
    and for reductions how many inputs each output element combines."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()
        self.largest: list[tuple[int, tuple[int, ...]]] = []  # (elements, shape), the largest few
        self.reductions: set[int] = set()  # how many inputs one output of a max or sum combined

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", str(func))
        self.ops.add(name)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for t in outs:
            if isinstance(t, torch.Tensor) and t.dim() >= 1:
                self.largest.append((t.numel(), tuple(t.shape)))
        if len(self.largest) > 64:
            self.largest = sorted(set(self.largest), reverse=True)[:8]
        first_in = next((a for a in args if isinstance(a, torch.Tensor)), None)
        first_out = outs[0] if outs and isinstance(outs[0], torch.Tensor) else None
        if name in _REDUCTIONS and first_in is not None and first_out is not None and first_out.numel() > 0:
            if len(self.reductions) < 32:
                self.reductions.add(first_in.numel() // first_out.numel())
        return out


@probe("fast.trace")
def trace(fn: Callable[..., Any], *args: Any, flops: bool = True) -> dict[str, Any]:
    """Run ``fn(*args)`` watching it: the torch functions it called, the largest tensors it created
    (elements and shape), how many inputs one output of each max or sum combined, and (``flops``) its
    matrix-multiply FLOPs (``torch.utils.flop_counter``). Plain data only."""
    watch = _Watch()
    if flops:
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        with counter, watch:
            fn(*args)
        total = float(counter.get_total_flops())
    else:
        with watch:
            fn(*args)
        total = 0.0
    largest = sorted(set(watch.largest), reverse=True)[:4]
    return {"ops": sorted(watch.ops), "largest": [[n, list(shape)] for n, shape in largest],
            "reductions": sorted(watch.reductions), "flops": total}


@functools.lru_cache(maxsize=None)
def _warm_flop_counter() -> None:
    """The FLOP counter's first use imports much of torch (seconds on a busy machine): do it here, before
    the learner's code runs under its time limit, not inside it."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False):
        torch.ones(2, 2) @ torch.ones(2, 2)


# ============================================================================ diagnosis
def _agrees(a: Tensor, b: Tensor, atol: float, rtol: float) -> bool:
    """Same shape, non-finite in the same places (NaN and ±inf alike), close everywhere else."""
    if tuple(a.shape) != tuple(b.shape):
        return False
    a, b = a.detach().double(), b.detach().double()
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    if not torch.equal(fa, fb):
        return False
    return bool(torch.allclose(a[fa], b[fb], atol=atol, rtol=rtol))


_VALUES: dict[tuple[int, int], Tensor | None] = {}


def _value(make: Callable[..., Tensor], case: Case) -> Tensor | None:
    """A known mistake's output on a case, or None when it cannot even run there (remembered: the
    mistakes and the cases are fixed, so a replay of the check does not compute them again)."""
    key = (id(make), id(case))
    if key not in _VALUES:
        args = case.args + ((case.causal,) if len(case.args) == 4 else ())
        try:
            with torch.no_grad():
                out = make(*args)
        except Exception:  # noqa: BLE001 - this mistake cannot happen on this input
            out = None
        _VALUES[key] = out if isinstance(out, torch.Tensor) else None
    return _VALUES[key]


def _explaining(mistakes: Sequence[Known], answers: list[tuple[Case, Tensor]], failing: Case) -> list[Known]:
    """The mistakes that reproduce the answer on every case it was given — and that were visible on the
    failing one (their output differs from the right answer there and is not entirely NaN)."""
    found = []
    answer = next(out for case, out in answers if case is failing)
    for mistake in mistakes:
        wrong_there = _value(mistake.make, failing)
        if wrong_there is None or bool(torch.isnan(wrong_there).all()) and wrong_there.numel() > 1:
            continue
        if _agrees(wrong_there, failing.expected, failing.atol, failing.rtol):
            continue
        if not _agrees(answer, wrong_there, failing.atol, failing.rtol):
            continue
        if all(case is failing or (w := _value(mistake.make, case)) is None or _agrees(out, w, case.atol, case.rtol)
               for case, out in answers):
            found.append(mistake)
    return found


def _blame(found: list[Known], tried: str, got: str, expected: str) -> NoReturn:
    unique = list({(m.summary, m.cause, m.fix): m for m in found}.values())
    if len(unique) == 1:
        m = unique[0]
        fail(m.summary, tried=tried, got=got, expected=expected, cause=m.cause, fix=m.fix)
    fail(" or ".join(dict.fromkeys(m.summary for m in unique)), tried=tried, got=got, expected=expected,
         cause="on every input tried, these mistakes give the same numbers as your function: "
               + " — or ".join(m.cause for m in unique),
         fix="; otherwise ".join(dict.fromkeys(m.fix for m in unique)))


def _explain_raise(exc: LearnerRaised, case: Case, raises: Sequence[tuple]) -> dict[str, str]:
    """Cause and fix for an exception, only when a known construct raises the very same message here."""
    args = case.args + ((case.causal,) if len(case.args) == 4 else ())
    for _, cause, fix, make in raises:
        try:
            with warnings.catch_warnings():  # k.T on a batch warns before it fails: not the learner's output
                warnings.simplefilter("ignore")
                make(*args)
        except Exception as mine:  # noqa: BLE001
            if type(mine).__name__ == exc.type_name and str(mine) == exc.message:
                return dict(cause=cause, fix=fix)
    return {}


def _row_factors(out: Tensor, expected: Tensor) -> Tensor | None:
    """c (…, rows, 1) with out ≈ c · expected row by row, or None when no such per-row factor fits."""
    if tuple(out.shape) != tuple(expected.shape) or not torch.isfinite(out).all() or out.numel() == 0:
        return None
    a, e = out.double(), expected.double()
    norm = (e * e).sum(-1, keepdim=True)
    c = (a * e).sum(-1, keepdim=True) / norm.clamp_min(1e-300)
    if not torch.allclose(a, c * e, atol=1e-7, rtol=1e-6):
        return None
    return c


def _properties(case: Case, out: Tensor, tried: str, *, softmax: bool) -> None:
    """When no known mistake explains the answer, say which property of it is off (if one is)."""
    if tuple(out.shape) != tuple(case.expected.shape) or not out.is_floating_point():
        return
    a, e = out.double(), case.expected
    wrong = ~torch.isclose(a, e, atol=case.atol, rtol=case.rtol, equal_nan=False)
    n = e.shape[-1] if softmax else e.shape[-2]
    b = case.block
    last = _blocks(n, b)[-1]
    partial = last[1] - last[0] < b and len(_blocks(n, b)) > 1
    if partial and wrong.any():
        where = wrong[..., last[0]:last[1]] if softmax else wrong[..., last[0]:last[1], :]
        elsewhere = wrong[..., :last[0]] if softmax else wrong[..., :last[0], :]
        if where.any() and not elsewhere.any():
            what = "columns" if softmax else "rows"
            fail(f"wrong only in the last, partial block ({what} {last[0]}–{last[1] - 1})", tried=tried,
                 got=f"the {what} of every full block are right, but {what} {last[0]}–{last[1] - 1} (the last block, "
                     f"{last[1] - last[0]} long instead of {b}) are wrong",
                 expected="the same computation for a block shorter than block_size",
                 cause="your loop handles a block shorter than block_size differently (a slice or range that assumes "
                       "full blocks, or a buffer of size block_size)",
                 fix="use range(0, n, block_size) and slices [start:start + block_size], which stop at the end by "
                     "themselves, and size every buffer from the slice you got")
    if torch.isnan(a).all() and a.numel() > 1:
        fail("NaN from the first block on", tried=tried, got=f"every entry of {'your result' if softmax else 'your output'} is NaN",
             expected="finite numbers",
             cause="the first update of the running state already gives NaN (common causes: "
                   "rescaling by exp(m_new − m_old), which is exp(+inf) = inf on the first block while the sum is 0, "
                   "and 0 × inf = NaN; or a running max that starts at +inf)",
             fix="start m at −inf and l, acc at 0; rescale by exp(m_old − m_new); print m and l after the first block")
    c = _row_factors(out, e)
    if c is not None and not torch.allclose(c, torch.ones_like(c), rtol=1e-5, atol=0):
        lo, hi = fmt(float(c.min())), fmt(float(c.max()))
        if softmax:
            fail("rows scaled by a wrong normaliser", tried=tried,
                 got=f"each row is softmax(x) times its own factor (from {lo} to {hi}), so the rows sum to those factors",
                 expected="rows that sum to 1",
                 cause="the running sum l does not equal Σ exp(x − m) over the row: it is rescaled or summed "
                       "differently from how exp(x − m) is formed at the end",
                 fix="after each block: l = l · exp(m_old − m_new) + Σ exp(block − m_new); return exp(x − m) / l with the "
                     "final m")
        fail("rows scaled by a wrong normaliser", tried=tried,
             got=f"each output row is the right one times its own factor (from {lo} to {hi})",
             expected="each row a weighted average of v's rows (weights summing to 1)",
             cause="the accumulator and the running sum l do not match: one is rescaled, summed or divided "
                   "differently from the other",
             fix="rescale acc and l by the same exp(m_old − m_new), and divide acc by l once, after the last key block")
    if softmax:
        c = _softmax_temperature(out, case.args[0])
        if c is not None and abs(c - 1) > 1e-4:
            named = _name_scale(c, 1)
            fail(f"softmax of {fmt(c)} · x", tried=tried, got=f"exactly softmax({fmt(c)} · x), rows summing to 1",
                 expected="softmax(x)",
                 cause=("you used exp2 (base 2) where the formulas use exp: 2^x = e^(x·ln 2)" if named.startswith("ln 2")
                        else f"your exponentials see the values multiplied by {fmt(c)}"),
                 fix="use torch.exp for every exponential, on x − m itself")
        return
    c = _attention_scale(out, case)
    d_k = case.args[0].shape[-1]
    if c is not None and abs(c * math.sqrt(d_k) - 1) > 1e-4:
        factor = c * math.sqrt(d_k)
        named = _name_scale(factor, d_k)
        fail(f"scores scaled by {fmt(c)} instead of 1/√d_k = {fmt(1 / math.sqrt(d_k))}", tried=tried,
             got=f"exactly softmax({fmt(c)} · q kᵀ) v", expected=f"softmax(q kᵀ / √d_k) v with d_k = {d_k}",
             cause=f"your scores are {named} times the right ones" if named else
                   f"your scores are multiplied by {fmt(c)} somewhere, not by 1/√d_k",
             fix="multiply q kᵀ by 1/√d_k, d_k = q.shape[-1], once, and use torch.exp for the exponentials")


def _softmax_temperature(out: Tensor, x: Tensor) -> float | None:
    """c when every row of ``out`` is softmax(c · x) (fitted on log out), else None."""
    if not torch.isfinite(out).all() or not (out > 0).all() or x.shape[-1] < 2:
        return None
    y = torch.log(out.double())
    xc = x.double() - x.double().mean(-1, keepdim=True)
    yc = y - y.mean(-1, keepdim=True)
    if float((xc * xc).sum()) < 1e-12:
        return None
    c = float((xc * yc).sum() / (xc * xc).sum())
    if not torch.allclose(yc, c * xc, atol=1e-6, rtol=1e-5) or not torch.allclose(out.double().sum(-1), torch.ones(1, dtype=torch.float64)):
        return None
    return c


def _attention_scale(out: Tensor, case: Case) -> float | None:
    """c when ``out`` is softmax(c · q kᵀ) v (causal as the case), found by a search over c; else None."""
    q, k, v, _ = (a.double() if isinstance(a, Tensor) else a for a in case.args)
    if tuple(out.shape) != tuple(case.expected.shape) or not torch.isfinite(out).all():
        return None
    raw = q @ k.transpose(-2, -1)
    if case.causal:
        raw = raw.masked_fill(torch.ones(raw.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    target = out.double()

    def error(log_c: float) -> float:
        return float((torch.softmax(raw * math.exp(log_c), -1) @ v - target).abs().max())

    grid = [i / 8 for i in range(-80, 81)]  # c from e^-10 to e^10
    best = min(grid, key=error)
    lo, hi = best - 1 / 8, best + 1 / 8
    for _ in range(40):  # golden-section refinement
        a, b = hi - (hi - lo) * 0.618, lo + (hi - lo) * 0.618
        lo, hi = (lo, b) if error(a) < error(b) else (a, hi)
    log_c = (lo + hi) / 2
    if error(log_c) > case.atol + case.rtol * float(target.abs().max()):
        return None
    return math.exp(log_c)


def _name_scale(factor: float, d_k: int) -> str:
    """How a learner may have got ``factor`` × the right scale 1/√d_k."""
    named = {"ln 2 (exp2 used in place of exp)": math.log(2), "1/ln 2 (log2 e folded in twice)": 1 / math.log(2),
             "√d_k": math.sqrt(d_k), "1/√d_k": 1 / math.sqrt(d_k), "d_k": float(d_k)}
    for name, value in named.items():
        if abs(factor - value) <= 1e-3 * value:
            return name
    return ""


def _leak(fn: Learner, case: Case, tried: str) -> None:
    """Causal: change the last key and value only; every earlier row of a causal answer must stay put."""
    q, k, v, b = case.args
    k2, v2 = k.clone(), v.clone()
    k2[..., -1, :] += 3.0
    v2[..., -1, :] -= 5.0
    try:
        first = as_tensor(fn(q, k, v, b), tried=tried)
        second = as_tensor(fn(q, k2, v2, b), tried=tried)
    except (LearnerRaised, Exception):  # noqa: BLE001 - this probe only adds evidence
        return
    n = q.shape[-2]
    if n < 2 or tuple(first.shape) != tuple(second.shape) or first.shape[-2] != n:
        return
    changed = ~torch.isclose(first[..., :-1, :].double(), second[..., :-1, :].double(), atol=1e-9, rtol=1e-7,
                             equal_nan=True)
    if changed.any():
        rows = sorted({int(i) for i in changed.nonzero()[:, -2]})
        shown = ", ".join(map(str, rows[:6])) + ("…" if len(rows) > 6 else "")
        fail("queries see future keys", tried=f"{tried}, then again with only the last key and value changed",
             got=f"rows {shown} changed too, though they come before the last position",
             expected=f"only row {n - 1} (the one query allowed to see the last key) to change",
             cause="some tiles (or entries) above the diagonal reach the softmax: a tile past the diagonal is "
                   "computed, or the mask lets key > query through",
             fix="visit key blocks only up to the diagonal and " + _CAUSAL_FIX)


def _run(fn: Learner, cases: Sequence[Case], describe: Callable[[Case], str], mistakes: Sequence[Known],
         raises: Sequence[tuple], *, softmax: bool) -> None:
    """Call the learner on every case (stopping at an exception); if any answer is wrong, explain the first."""
    answers: list[tuple[Case, Tensor]] = []
    failing: Case | None = None
    for case in cases:
        tried = describe(case)
        try:
            raw = fn(*case.args)
        except LearnerRaised as exc:
            if failing is not None:
                break  # an earlier wrong answer is the one to explain
            raise Failure(learner_error(exc, tried=tried, expected=_EXPECTED[softmax],
                                        **_explain_raise(exc, case, raises))) from None
        out = as_tensor(raw, tried=tried)
        answers.append((case, out))
        if failing is None and not _right(out, case):
            failing = case
    if failing is None:
        _expect_precision(answers, describe)
        return
    out = dict((id(c), o) for c, o in answers)[id(failing)]
    tried = describe(failing)
    what = "your result" if softmax else "your output"
    if tuple(out.shape) != tuple(failing.expected.shape):
        found = _explaining(mistakes, answers, failing)
        got, expected = f"{what} of shape {tuple(out.shape)}", f"shape {tuple(failing.expected.shape)}"
        if found:
            _blame(found, tried, got, expected)
        if out.dim() >= 2 and _agrees(out.transpose(-2, -1), failing.expected, failing.atol, failing.rtol):
            fail("output transposed", tried=tried, got=got + ": the right numbers with the last two axes swapped",
                 expected=expected, cause="you returned the result transposed (the last two axes swapped)",
                 fix="return it with the docstring's axes: " + ("(..., n)" if softmax else "(..., n_q, d_v)"))
        if not softmax and len(failing.args) == 4:
            q, k, v, _ = failing.args
            if out.shape == q.shape[:-1] + (q.shape[-1],) and q.shape[-1] != v.shape[-1]:
                fail("output has q's width d_k, not v's width d_v", tried=tried, got=got, expected=expected,
                     cause=_TILED_RAISES[0][1], fix=_TILED_RAISES[0][2])
        fail(f"wrong shape {tuple(out.shape)}, expected {tuple(failing.expected.shape)}", tried=tried, got=got,
             expected=expected, fix="the result has the shape of " + ("x" if softmax else "q with v's last axis: "
                                                                      "(..., n_q, d_v)"))
    got, expected, cause, summary = describe_mismatch(out, failing.expected, what=what, atol=failing.atol,
                                                      rtol=failing.rtol)
    found = _explaining(mistakes, answers, failing)
    if found:
        _blame(found, tried, got, expected)
    _properties(failing, out, tried, softmax=softmax)
    if failing.causal:
        _leak(fn, failing, tried)
    fail(summary, tried=tried, got=got, expected=expected, cause=cause,
         fix="print m, l and acc after each block on this input and compare them with the notebook's worked example")


_EXPECTED = {True: "a tensor shaped like x", False: "a tensor (..., n_q, d_v)"}
_PRECISION = {torch.float64: 3, torch.float32: 2, torch.bfloat16: 1, torch.float16: 1}


def _expect_precision(answers: list[tuple[Case, Tensor]], describe: Callable[[Case], str]) -> None:
    """Right values, and no less precise than the input: a float64 input gives a float64 result."""
    for case, out in answers:
        given = case.args[0].dtype
        if _PRECISION.get(out.dtype, 0) < _PRECISION[given]:
            got, want = str(out.dtype).replace("torch.", ""), str(given).replace("torch.", "")
            default = out.dtype == torch.float32 and given == torch.float64
            fail(f"result in {got} for {want} input", tried=describe(case),
                 got=f"a {got} result, close to the right values but with {got}'s precision",
                 expected=f"a {want} result, like the input",
                 cause="a tensor you created without dtype= (torch.empty, zeros and full make float32 by default)"
                       if default else f"your computation converted to {got}",
                 fix="create every tensor with dtype=" + ("x.dtype" if len(case.args) == 2 else "q.dtype")
                     + " (or with *_like functions)")


def _right(out: Tensor, case: Case) -> bool:
    if tuple(out.shape) != tuple(case.expected.shape):
        return False
    if not (out.is_floating_point()):
        return False
    return bool(torch.allclose(out.detach().double(), case.expected, atol=case.atol, rtol=case.rtol))


# ============================================================================ structure
def _softmax_structure(fn: Learner) -> None:
    n, b = 48, 6
    x = _rows((3, n), b, 40)
    tried = f"online_softmax(x, {b}) on x (3, {n}), watching which torch functions run"
    seen = fn.observe("fast.trace", x, b, flops=False)
    if set(seen["ops"]) & _SOFTMAX_FUNCTIONS:
        fail("calls torch.softmax", tried=tried, got="your function calls torch.softmax (or log_softmax)",
             expected="a softmax built from a running max and a running sum",
             cause="the values are right, but torch.softmax does the exercise for you",
             fix="build it yourself: a running max m and sum l over the blocks, then exp(x − m) / l")
    _reduction_rule(seen["reductions"], b, n, tried, unit="column", reads="x[..., start:start + block_size]")


def _reduction_rule(sizes: list[int], b: int, n: int, tried: str, *, unit: str, reads: str) -> None:
    """Every max and sum covers one block: some cover exactly ``b`` numbers, none more (n = 8·b or more
    here, so a whole row and a block are far apart)."""
    if not sizes:
        return  # no torch reductions at all (plain Python numbers): nothing to judge by
    shown = ", ".join(map(str, sizes))
    if b not in sizes:
        fixed = max(sizes)
        fail("block_size not used", tried=tried,
             got=f"your maxima and sums combine {shown} numbers at a time"
                 + (" (the whole row)" if fixed >= n else "") + f", never block_size = {b}",
             expected=f"blocks of block_size = {b} {unit}s", cause="your loop reads a fixed number of "
             f"{unit}s, whatever block_size says", fix=f"slice each block with block_size: {reads}")
    if max(sizes) > b:
        whole = max(sizes) >= n
        fail(f"max or sum over {'the whole row' if whole else f'{max(sizes)} {unit}s'} as well as blocks", tried=tried,
             got=f"your maxima and sums combine {shown} numbers at a time: blocks of {b}, but also {max(sizes)}"
                 + (" (the whole row)" if whole else ""),
             expected=f"every max and sum over one block of block_size = {b} {unit}s",
             cause="besides the blocks, you reduce over more at once (a maximum found before the loop, or a "
                   "normalisation after it): that is a second pass, where the algorithm makes one",
             fix="inside the loop, reduce only the current block and fold it into the running m and l; after the "
                 "loop, divide by l")


def _tile_work(n_q: int, n_k: int, d_k: int, d_v: int, b: int, lead: int, *, causal: bool, extra: int = 0,
               passes: int = 1) -> float:
    """Matrix-multiply FLOPs of the tiled loop: for each visited tile, q kᵀ (2·b_q·b_k·d_k, ``passes``
    times) and p v (2·b_q·b_k·d_v); ``extra`` more key blocks per query block (clipped at n_k)."""
    total = 0.0
    for qs, qe in _blocks(n_q, b):
        for i, (ks, ke) in enumerate(_blocks(n_k, b)):
            visited = not causal or ks < qe
            if not visited and not (extra and ks < qe + extra * b):
                continue
            total += 2.0 * (qe - qs) * (ke - ks) * (passes * d_k + d_v)
    return lead * total


def _attention_structure(fn: Learner, name: str, causal: bool) -> None:
    # Memory: many small tiles; a full score matrix, a full mask or a row of tiles stands out by a factor ≥ 4.
    lead, n, d_k, d_v, b = 2, 192, 2, 1, 16
    q, k, v = _qkv((lead,), n, n, d_k, d_v, b, 41)
    tried = f"{name}(q, k, v, {b}) on q, k ({lead}, {n}, {d_k}), v ({lead}, {n}, {d_v}), watching what it creates"
    seen = fn.observe("fast.trace", q, k, v, b, flops=False)
    if any(op in _FUSED_FUNCTIONS or "attention" in op for op in seen["ops"]):
        fail("calls a fused attention", tried=tried, got="your function calls F.scaled_dot_product_attention "
             "(or another fused attention)", expected="the tiled loop, written out",
             cause="the values are right, but the fused function does the exercise for you",
             fix="compute each tile's scores with @ and keep the running max, sum and accumulator yourself")
    needed = lead * b * b
    limit = 2 * max(needed, q.numel(), k.numel(), v.numel(), lead * n * d_v)
    elements, shape = seen["largest"][0] if seen["largest"] else (0, [])
    if elements > limit:
        shape = tuple(shape)
        big = [s for s in shape if s > b]
        if len(big) >= 2 and n in shape:
            summary, what = f"builds a full {n} × {n} matrix", f"a full {n} × {n} matrix (scores, probabilities or a mask)"
        elif len(big) == 1 and n in shape:
            summary, what = "builds a whole row of tiles at once", f"a whole row or column of tiles ({n} positions by a block)"
        elif any(s > b for s in shape[-2:]):
            summary, what = "tiles larger than block_size", f"tiles larger than block_size = {b}"
        else:
            summary, what = "builds a tensor larger than a tile", "a large tensor"
        fail(summary, tried=tried,
             got=f"your function creates a tensor of shape {shape} ({elements} numbers): {what}",
             expected=f"nothing larger than the inputs, the output and a ({b}, {b}) tile (at most {limit // 2} numbers "
                      "here)",
             cause="the values are right, but holding that tensor is what tiling avoids: its memory grows like n²",
             fix="compute one (block_size, block_size) tile of scores at a time, and mask (causal) tile by tile "
                 "from global positions")
    _reduction_rule(seen["reductions"], b, n, tried, unit="key", reads="k[..., start:start + block_size, :]")
    # Work: few large blocks, d_k ≫ d_v, so reading the keys twice or one tile too many shows by ≥ 1.3×.
    lead, n, d_k, d_v, b = 1, 96, 8, 1, 32
    q, k, v = _qkv((lead,), n, n, d_k, d_v, b, 42)
    tried = f"{name}(q, k, v, {b}) on q, k ({lead}, {n}, {d_k}), v ({lead}, {n}, {d_v}), counting matrix-multiply FLOPs"
    _warm_flop_counter()
    flops = fn.observe("fast.trace", q, k, v, b)["flops"]
    needed = _tile_work(n, n, d_k, d_v, b, lead, causal=causal)
    if flops <= 1.2 * needed:
        return
    candidates = [("every tile, also those above the diagonal", _tile_work(n, n, d_k, d_v, b, lead, causal=False)),
                  ("one tile past the diagonal per query block", _tile_work(n, n, d_k, d_v, b, lead, causal=True, extra=1))
                  ] if causal else []
    candidates.append(("the scores twice (a first pass for the maximum, then the sums)",
                       _tile_work(n, n, d_k, d_v, b, lead, causal=causal, passes=2)))
    named = next((what for what, work in candidates if abs(flops - work) <= 0.02 * work), "")
    above = causal and named.startswith(("every tile", "one tile"))
    if above:
        summary = "computes one tile past the diagonal" if named.startswith("one tile") else \
            "computes the tiles above the diagonal"
    else:
        summary = "reads the keys twice" if named.startswith("the scores twice") else "does more work than one pass"
    fail(summary,
         tried=tried, got=f"{fmt(flops)} matrix-multiply FLOPs, {fmt(flops / needed)} × what one pass needs"
                          + (f": {named}" if named else ""),
         expected=f"{fmt(needed)}: each tile{' on or below the diagonal' if causal else ''} computed once",
         cause=("the values are right, but the tiles above the diagonal are entirely masked: computing them is "
                "wasted work, and skipping them is what halves a causal attention's cost" if above else
                "the values are right, but the algorithm is a single pass: each tile's scores computed once, with a "
                "running maximum instead of a maximum found beforehand"),
         fix=("stop the key loop at the diagonal: range(0, q_end, block_size)" if above else
              "visit each key block once per query block, updating m, l and acc as you go"))


# ============================================================================ the checks
@check("online_softmax", expects="a function online_softmax(x, block_size=1) returning a tensor shaped like x")
def check_online_softmax(fn: Learner) -> str:
    cases = softmax_cases()

    _run(fn, cases, lambda c: f"online_softmax(x, {c.block}) on {c.name}", SOFTMAX_MISTAKES, _SOFTMAX_RAISES,
         softmax=True)
    _softmax_structure(fn)
    return (f"matches torch.softmax on {len(cases)} cases (block sizes 1…16, 1-D to 3-D, maxima rising and falling, "
            "values near ±1000) and reads x in blocks, once")


@check("tiled_attention",
       expects="a function tiled_attention(q, k, v, block_size=64) returning a tensor (..., n_q, d_v)")
def check_tiled_attention(fn: Learner) -> str:
    cases = tiled_cases()

    _run(fn, cases, lambda c: f"tiled_attention(q, k, v, {c.block}) on {c.name}", TILED_MISTAKES, _TILED_RAISES,
         softmax=False)
    _attention_structure(fn, "tiled_attention", causal=False)
    return (f"matches F.scaled_dot_product_attention on {len(cases)} cases (blocks 1…32, n_q ≠ n_k, d_k ≠ d_v, "
            "extreme scores) and holds only (block, block) tiles, each computed once")


@check("causal_tiled_attention",
       expects="a function causal_tiled_attention(q, k, v, block_size=64) returning a tensor (..., n, d_v)")
def check_causal_tiled_attention(fn: Learner) -> str:
    cases = causal_cases()

    _run(fn, cases, lambda c: f"causal_tiled_attention(q, k, v, {c.block}) on {c.name}", CAUSAL_MISTAKES,
         _TILED_RAISES, softmax=False)
    _attention_structure(fn, "causal_tiled_attention", causal=True)
    return (f"matches causal F.scaled_dot_product_attention on {len(cases)} cases and never computes a tile above "
            "the diagonal")
