"""Checks for notebook 09 (fast attention): ``online_softmax``, ``tiled_attention``, ``causal_tiled_attention``.

Oracles: ``torch.softmax`` and ``F.scaled_dot_product_attention`` (``is_causal``), in float64, on cases that vary
every argument (block sizes 1, equal to, longer than and not dividing n; 1-D to batch × heads; n_q ≠ n_k, d_k ≠
d_v; float32 and float64; block maxima that rise, fall and sit hundreds apart). A wrong answer is named by the
kit's engine from the tables below, each row the algorithm (:class:`Pass`, :class:`Loop`) with one step changed;
when no row reproduces it, a property of it is measured (:func:`_measure`). How the result is computed is
checked on the learner's side by the probe :func:`trace`: no torch.softmax or fused attention, every max and sum
over one block, no tensor larger than a tile, the matrix-multiply work of one pass (none above the diagonal).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from .boundary import probe
from .compare import Failure, call_or_skip, same
from .core import Learner, LearnerRaised, as_tensor, check, fail, fmt, learner_error
from .kit import Known, Suspects, explain_raise, watch

__all__ = ["check_online_softmax", "check_tiled_attention", "check_causal_tiled_attention", "trace",
           "Known", "Pass", "Loop", "SOFTMAX_MISTAKES", "TILED_MISTAKES", "CAUSAL_MISTAKES"]

Tensor = torch.Tensor
Blocks = Callable[[int, int], list[tuple[int, int]]]  # (n, block_size) -> the (start, end) of each block


# ============================================================================ the algorithms, step by step
def _blocks(n: int, b: int) -> list[tuple[int, int]]:
    """(start, end) of each block of ``b`` among ``n`` positions; the last may be shorter."""
    return [(s, min(s + b, n)) for s in range(0, n, b)]


def _ends(end: Callable[[int, int], int]) -> Blocks:
    """Blocks whose end is ``end(start, b)`` instead of start + b (a slice off by one)."""
    return lambda n, b: [(s, min(end(s, b), n)) for s in range(0, n, b) if min(end(s, b), n) > s]


def _keys(blocks: Blocks) -> Callable[..., list[tuple[int, int]]]:
    """Key blocks from ``blocks(n_k, b)``, those before the query block's end when causal."""
    return lambda n, b, qs, qe, causal: [t for t in blocks(n, b) if not causal or t[0] < qe]


_no_tail = lambda n, b: [(s, s + b) for s in range(0, n - n % b, b)]  # noqa: E731 - the partial block never read
_drop_last = lambda n, b: _blocks(n, b)[:-1] if n > b else []  # noqa: E731 - range(0, n - b, b)
_shrink = lambda m_old, m_new: torch.exp(m_old - m_new)  # noqa: E731 - the right rescaling
_grow = lambda m_old, m_new: torch.where(m_old.isinf(), 1.0, torch.exp(m_new - m_old))  # noqa: E731 - sign (guarded)
_one = lambda m_old, m_new: torch.ones_like(m_new)  # noqa: E731 - no rescaling
_zero = lambda m, block_max: torch.zeros_like(block_max)  # noqa: E731 - no maximum at all


@dataclass(frozen=True)
class Pass:
    """The online softmax, each step a parameter (the defaults are right; a known mistake changes one):
    ``blocks(n, b)`` read; ``block_max(block)``; ``new_max(m, block max)``; ``factor(m_old, m_new)`` on the
    running sum; ``finish(x, m, l)``; ``start`` the first running max."""

    blocks: Blocks = _blocks
    block_max: Callable[[Tensor], Tensor] = lambda block: block.amax(-1, keepdim=True)
    new_max: Callable[[Tensor, Tensor], Tensor] = torch.maximum
    factor: Callable[[Tensor, Tensor], Tensor] = _shrink
    finish: Callable[[Tensor, Tensor, Tensor], Tensor] = lambda x, m, l: torch.exp(x - m) / l
    start: float = -math.inf

    def __call__(self, x: Tensor, b: int) -> Tensor:
        m = torch.full(x.shape[:-1] + (1,), self.start, dtype=x.dtype)  # (..., 1)
        l = torch.zeros_like(m)
        for s, e in self.blocks(x.shape[-1], b):
            m_new = self.new_max(m, self.block_max(x[..., s:e]))
            l, m = l * self.factor(m, m_new) + torch.exp(x[..., s:e] - m_new).sum(-1, keepdim=True), m_new
        return self.finish(x, m, l)


@dataclass(frozen=True)
class Loop:
    """The tiled attention loop (FlashAttention-2's forward), each step a parameter; the defaults are right.
    ``scale(q, k, v, b)``; ``q_blocks(n_q, b)``, ``k_blocks(n_k, b, q_start, q_end, causal)``; a tile's causal
    mask ``hide(rows, cols, q_start, k_start)`` (global positions), applied where ``masked(qs, qe, ks, ke)``,
    with ``fill``; ``tile_max``, ``new_max``, ``sum_factor``, ``acc_factor``, ``start`` as in :class:`Pass`;
    ``prob(s, m)`` the tile's weights; ``acc_update(acc, correction, p, v_block, l_old, l_new)``; ``finish(acc,
    l)``; ``update_max``: m = m_new after each tile; ``short``: rows never computed are left out."""

    scale: Callable[[Tensor, Tensor, Tensor, int], float] = lambda q, k, v, b: q.shape[-1] ** -0.5
    q_blocks: Blocks = _blocks
    k_blocks: Callable[..., list[tuple[int, int]]] = _keys(_blocks)
    hide: Callable[[Tensor, Tensor, int, int], Tensor] = lambda rows, cols, qs, ks: cols > rows
    masked: Callable[[int, int, int, int], bool] = lambda qs, qe, ks, ke: ke - 1 > qs
    fill: float = -math.inf
    tile_max: Callable[[Tensor], Tensor] = lambda s: s.amax(-1, keepdim=True)
    new_max: Callable[[Tensor, Tensor], Tensor] = torch.maximum
    sum_factor: Callable[[Tensor, Tensor], Tensor] = _shrink
    acc_factor: Callable[[Tensor, Tensor], Tensor] = _shrink
    prob: Callable[[Tensor, Tensor], Tensor] = lambda s, m: torch.exp(s - m)
    acc_update: Callable[..., Tensor] = lambda acc, c, p, v_blk, l_old, l_new: acc * c + p @ v_blk
    finish: Callable[[Tensor, Tensor], Tensor] = lambda acc, l: acc / l
    start: float = -math.inf
    update_max: bool = True
    short: bool = False
    causal: bool = False

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, b: int) -> Tensor:
        n_q, n_k, scale = q.shape[-2], k.shape[-2], self.scale(q, k, v, b)
        out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)  # (..., n_q, d_v)
        done = 0
        for qs, qe in self.q_blocks(n_q, b):
            q_blk = q[..., qs:qe, :]
            m = torch.full(q_blk.shape[:-1] + (1,), self.start, dtype=q.dtype)
            l, acc = torch.zeros_like(m), torch.zeros(q_blk.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
            for ks, ke in self.k_blocks(n_k, b, qs, qe, self.causal):
                s = q_blk @ k[..., ks:ke, :].transpose(-2, -1) * scale  # (..., b_q, b_k)
                if self.causal and self.masked(qs, qe, ks, ke):
                    hidden = self.hide(torch.arange(qs, qe)[:, None], torch.arange(ks, min(ke, n_k))[None, :], qs, ks)
                    s = s.masked_fill(hidden, self.fill)
                m_new = self.new_max(m, self.tile_max(s))
                p = self.prob(s, m_new)
                l_new = l * self.sum_factor(m, m_new) + p.sum(-1, keepdim=True)
                acc = self.acc_update(acc, self.acc_factor(m, m_new), p, v[..., ks:ke, :], l, l_new)
                l, m = l_new, (m_new if self.update_max else m)
            out[..., qs:qe, :] = self.finish(acc, l)
            done = max(done, qe)
        return out[..., :done, :] if self.short else out


# ============================================================================ known mistakes, as data
_RESCALE_FIX = "multiply by exp(m_old − m_new) (≤ 1) before adding the new block's terms"
_TAIL_FIX = ("loop with range(0, n, block_size) and slice [start:start + block_size]: slicing stops at the end by "
             "itself, so the last, shorter block is read too")
_FINAL_FIX, _SLICE_FIX = "return torch.exp(x - m) / l", "slice [start:start + block_size]: the end of a slice is not included"
_MAX_FAR = "when a block's maximum falls far below an earlier one, exp(m_old − m_new) overflows"

SOFTMAX_MISTAKES: list[Known] = [
    Known("no_max", "no running maximum subtracted", "you exponentiated the raw values, so exp overflowed to inf for "
          "values near 1000 (inf / inf = NaN)", "keep a running max m and exponentiate x − m", Pass(new_max=_zero)),
    Known("sum", "running sum not rescaled", "you added each block's Σ exp(x − m_new) to a running sum that was still "
          "relative to the old maximum", "when the maximum grows, " + _RESCALE_FIX, Pass(factor=_one)),
    Known("sign", "running sum rescaled by exp(m_new − m_old)", "you rescaled the running sum by exp(m_new − m_old): "
          "the sign is reversed, so the old sum grows instead of shrinking", _RESCALE_FIX, Pass(factor=_grow)),
    Known("blockmax", "per-block maximum instead of a running one", "you replaced m by each block's own maximum "
          "instead of max(m, block maximum): " + _MAX_FAR, "keep m = torch.maximum(m, block.amax(-1, keepdim=True)): "
          "the maximum of everything read so far", Pass(new_max=lambda m, block_max: block_max)),
    Known("amin", "block minimum instead of maximum", "you took each block's smallest value (amin) as the reference, so "
          "exp(x − m) overflows when a block's values are far apart", "take the block's largest value: "
          "block.amax(dim=-1, keepdim=True)", Pass(block_max=lambda block: block.amin(-1, keepdim=True))),
    Known("allmax", "one maximum for every row of a block", "you took the block's maximum over all its values (amax "
          "without dim=-1), not row by row: a row far below it underflows to exp(−800) = 0 and gives 0/0",
          "take the maximum along the last axis only: block.amax(dim=-1, keepdim=True)",
          Pass(block_max=lambda block: block.amax(keepdim=True))),
    Known("start0", "running max started at 0", "you started the running max at 0 instead of −inf, so it never falls "
          "below 0: a row whose values are all far below 0 underflows to exp(−800) = 0 and gives 0/0 = NaN",
          "start m at −inf: torch.full(x.shape[:-1] + (1,), float('-inf'))", Pass(start=0.0)),
    Known("division", "final division missing", "you returned exp(x − m) without dividing by the running sum l",
          _FINAL_FIX, Pass(finish=lambda x, m, l: torch.exp(x - m))),
    Known("final_raw", "exp(x) instead of exp(x − m) at the end", "your last step computes exp(x) / l, but l is a sum "
          "of exp(x − m): the two do not match", _FINAL_FIX, Pass(finish=lambda x, m, l: torch.exp(x) / l)),
    Known("final_noexp", "exp missing in the last step", "your last step computes (x − m) / l, without the exp",
          _FINAL_FIX, Pass(finish=lambda x, m, l: (x - m) / l)),
    Known("final_log", "log instead of exp in the last step", "your last step computes log(x − m) / l: a log where "
          "the softmax has exp (x − m ≤ 0, so mostly NaN)", _FINAL_FIX, Pass(finish=lambda x, m, l: torch.log(x - m) / l)),
    Known("tail", "last, shorter block dropped", "your loop stops before the last block when n is not a multiple of "
          "block_size, so those columns never reach the running max and sum", _TAIL_FIX, Pass(blocks=_no_tail)),
    Known("last", "last block dropped", "your loop (range(0, n - block_size, block_size)) never reads the last block",
          _TAIL_FIX, Pass(blocks=_drop_last)),
    Known("short_slice", "each block one column short", "you sliced [start:start + block_size - 1], so the last column "
          "of every block is skipped", _SLICE_FIX, Pass(blocks=_ends(lambda s, b: s + b - 1))),
    Known("long_slice", "blocks overlap by one column", "you sliced [start:start + block_size + 1], so the first column "
          "of each next block is counted twice", _SLICE_FIX, Pass(blocks=_ends(lambda s, b: s + b + 1))),
    Known("per_block", "each block normalised on its own", "you took a softmax inside each block, so each block sums "
          "to 1 instead of the whole row", "normalise once, at the end: exp(x − m) / l with m and l over the whole row",
          lambda x, b: torch.cat([torch.softmax(x[..., s:e], -1) for s, e in _blocks(x.shape[-1], b)], -1)),
]

_SCALE_FIX, _ACC_FIX = ("multiply q kᵀ by 1/√d_k, with d_k = q.shape[-1]", "acc = acc * exp(m_old − m_new) + p @ "
                        "v_block: rescale what is there, then add this tile's weighted values")
_PROB_FIX = "take p = torch.exp(s - m_new): the tile's scores minus the new running maximum, exponentiated"
_NORM_FIX = "keep acc unnormalised in the loop and divide by l once, after the last key block"
# (key, summary, cause, scale(q, k, v, b)) and (text, factor(m_old, m_new)): slips of the scale and of the rescaling
_SCALES = [("noscale", "scores not scaled", "you did not multiply the scores by 1/√d_k", lambda q, k, v, b: 1.0),
           ("dk", "divided by d_k instead of √d_k", "you divided the scores by d_k", lambda q, k, v, b: 1 / q.shape[-1]),
           ("times", "multiplied by √d_k", "you multiplied the scores by √d_k instead of dividing",
            lambda q, k, v, b: q.shape[-1] ** 0.5),
           ("negative", "scores scaled by −1/√d_k", "your scale has the wrong sign (−1/√d_k), so the softmax favours the "
            "keys least like the query", lambda q, k, v, b: -q.shape[-1] ** -0.5),
           ("dv", "scaled by √d_v instead of √d_k", "you scaled by the square root of d_v, the width of v",
            lambda q, k, v, b: v.shape[-1] ** -0.5),
           ("nk", "scaled by √n_k instead of √d_k", "you scaled by the square root of the number of keys",
            lambda q, k, v, b: k.shape[-2] ** -0.5),
           ("block_scale", "scaled by √block_size instead of √d_k", "you scaled by the square root of block_size",
            lambda q, k, v, b: b ** -0.5)]
_FACTORS = [("exp(m_old + m_new)", lambda m, n: torch.exp(m + n)), ("exp(m_old)", lambda m, n: torch.exp(m)),
            ("exp(m_new)", lambda m, n: torch.exp(n))]

TILED_MISTAKES: list[Known] = [
    *[Known(key, summary, cause, _SCALE_FIX, Loop(scale=scale)) for key, summary, cause, scale in _SCALES],
    Known("sum", "running sum not rescaled", "you rescaled the accumulator when the maximum grew, but not the running "
          "sum l", "multiply l too by exp(m_old − m_new) before adding the new tile's row sums", Loop(sum_factor=_one)),
    Known("acc", "accumulator not rescaled", "you rescaled the running sum when the maximum grew, but not the output "
          "accumulator acc", "multiply acc too by exp(m_old − m_new) before adding p @ v_block", Loop(acc_factor=_one)),
    Known("neither", "running sum and accumulator not rescaled", "you never rescaled l or acc when the maximum grew: "
          "both still hold terms relative to the old maximum", "multiply both l and acc by exp(m_old − m_new) before "
          "adding the new tile", Loop(sum_factor=_one, acc_factor=_one)),
    Known("sign", "rescaled by exp(m_new − m_old)", "you rescaled by exp(m_new − m_old): the sign is reversed, so old "
          "terms grow instead of shrinking", "rescale by exp(m_old − m_new), which is ≤ 1",
          Loop(sum_factor=_grow, acc_factor=_grow)),
    *[Known(f"factor {text}", f"rescaled by {text} instead of exp(m_old − m_new)", f"your correction factor is {text}: "
            "it must be exp(m_old − m_new), the ratio of the old and the new reference, so the old terms come out on "
            "the wrong scale", "correction = torch.exp(m - m_new)", Loop(sum_factor=f, acc_factor=f)) for text, f in _FACTORS],
    Known("stale_max", "running max never updated", "you never set m = m_new after a tile, so every correction is taken "
          "against the first maximum", "end each tile's step with m = m_new", Loop(update_max=False)),
    Known("blockmax", "per-tile maximum instead of a running one", "you replaced m by each tile's own row maximum "
          "instead of max(m, tile maximum): " + _MAX_FAR.replace("block", "tile"), "keep m = torch.maximum(m, "
          "s.amax(-1, keepdim=True)): the maximum over every tile so far", Loop(new_max=lambda m, tile_max: tile_max)),
    Known("tilemax", "one maximum for the whole tile, not per row", "you took the maximum over the whole tile (all its "
          "rows) instead of per query row: a row far below it underflows to 0 and its output is 0/0", "take the "
          "maximum along the keys only: s.amax(dim=-1, keepdim=True)", Loop(tile_max=lambda s: s.amax((-2, -1), True))),
    Known("amin", "tile minimum instead of maximum", "you took each tile row's smallest score (amin) as the reference, "
          "so exp(s − m) overflows when a tile's scores are far apart", "take the row maximum: s.amax(dim=-1, "
          "keepdim=True)", Loop(tile_max=lambda s: s.amin(-1, keepdim=True))),
    Known("start0", "running max started at 0", "you started the running max at 0 instead of −inf, so it never falls "
          "below 0: a query whose scores are all far below 0 underflows to exp(−800) = 0 and gives 0/0 = NaN",
          "start m at −inf: torch.full(q_blk.shape[:-1] + (1,), float('-inf'))", Loop(start=0.0)),
    Known("no_max", "no running maximum subtracted", "you exponentiated the raw scores, so exp overflowed to inf for "
          "scores in the hundreds", "keep a running row max m and exponentiate s − m", Loop(new_max=_zero)),
    Known("p_raw", "tile weights exp(s), without the maximum", "your tile weights are exp(s): the running sum and "
          "accumulator are rescaled as if they were exp(s − m_new)", _PROB_FIX, Loop(prob=lambda s, m: torch.exp(s))),
    Known("p_plus", "tile weights exp(s + m_new)", "your tile weights are exp(s + m_new): the maximum added, not "
          "subtracted", _PROB_FIX, Loop(prob=lambda s, m: torch.exp(s + m))),
    Known("p_noexp", "tile weights without exp", "your tile weights are s − m_new: the exp is missing", _PROB_FIX,
          Loop(prob=lambda s, m: s - m)),
    Known("division", "final division missing", "you returned the accumulator Σ exp(s − m)·v without dividing it by "
          "the running sum l", "after the last key block, divide: acc / l", Loop(finish=lambda acc, l: acc)),
    Known("overwrite", "accumulator overwritten by each tile", "you set acc = p @ v_block at each tile, so only the "
          "last tile's values are kept", _ACC_FIX, Loop(acc_update=lambda acc, c, p, v, lo, ln: p @ v)),
    Known("acc_plus", "correction added to the accumulator", "you added the correction factor to acc (correction + "
          "p @ v_block) instead of multiplying acc by it", _ACC_FIX, Loop(acc_update=lambda acc, c, p, v, lo, ln: c + p @ v)),
    Known("acc_v", "v_block added without the weights p", "you added v_block itself to acc, without multiplying it by "
          "the tile's weights p", _ACC_FIX, Loop(acc_update=lambda acc, c, p, v, lo, ln: acc * c + v)),
    Known("per_step", "accumulator normalised at every tile", "you divided acc by l inside the loop, but the next tile "
          "adds unnormalised p @ v to it", _NORM_FIX,
          Loop(acc_update=lambda acc, c, p, v, lo, ln: (acc * c + p @ v) / ln, finish=lambda acc, l: acc)),
    Known("per_step_twice", "accumulator normalised at every tile", "you divided acc by l inside the loop (and again at "
          "the end), but the next tile adds unnormalised p @ v to it", _NORM_FIX,
          Loop(acc_update=lambda acc, c, p, v, lo, ln: (acc * c + p @ v) / ln)),
    Known("per_block", "each tile normalised on its own", "you normalised each tile's probabilities by their own sum "
          "before multiplying by v_block", "add the unnormalised p @ v_block to acc and divide by l once, at the end",
          Loop(acc_update=lambda acc, c, p, v, lo, ln: acc * c + (p / p.sum(-1, keepdim=True)) @ v)),
    Known("k_tail", "last, shorter key block dropped", "your key loop stops before the last key block when n_k is not "
          "a multiple of block_size, so those keys get no weight", _TAIL_FIX, Loop(k_blocks=_keys(_no_tail))),
    Known("k_last", "last key block dropped", "your key loop (range(0, n_k - block_size, block_size)) never visits the "
          "last key block", _TAIL_FIX, Loop(k_blocks=_keys(_drop_last))),
    Known("k_first", "only the first key block visited", "your key loop visits only the first key block (its step is "
          "larger than block_size, or it ends after one tile), so the later keys get no weight", "visit every key "
          "block: range(0, n_k, block_size)", Loop(k_blocks=_keys(lambda n, b: _blocks(n, b)[:1]))),
    Known("k_from1", "key loop starts at 1", "your key loop starts at 1, not 0: key 0 is never read and every block is "
          "shifted by one", "start at 0: range(0, n_k, block_size)",
          Loop(k_blocks=_keys(lambda n, b: [(s, min(s + b, n)) for s in range(1, n, b)]))),
    Known("k_short", "each key block one key short", "you sliced the keys [start:start + block_size - 1], so the last "
          "key of every block is skipped", _SLICE_FIX, Loop(k_blocks=_keys(_ends(lambda s, b: s + b - 1)))),
    Known("k_long", "key blocks overlap by one key", "you sliced the keys [start:start + block_size + 1], so the first "
          "key of each next block counts twice", _SLICE_FIX, Loop(k_blocks=_keys(_ends(lambda s, b: s + b + 1)))),
    *[Known(key, "last, shorter query block not computed", "your query loop stops before the last query block when n_q "
            f"is not a multiple of block_size, so those rows are {what}", _TAIL_FIX, Loop(q_blocks=_no_tail, short=short))
      for key, what, short in (("q_tail", "never written", False), ("q_tail_short", "missing from the output", True))],
]

_CAUSAL_FIX = ("mask, in the tiles that reach above the diagonal, the scores whose key position is greater than the "
               "query position: s.masked_fill(cols > rows, -inf) with global positions rows = q_start + i, "
               "cols = k_start + j")
_DIAG_FIX = "stop the key loop at the diagonal: range(0, q_end, block_size)"
_C = functools.partial(Loop, causal=True)
_ALL_KEYS, _EVERY_TILE = (lambda n, b, qs, qe, c: _blocks(n, b)), (lambda qs, qe, ks, ke: True)
_BEFORE_DIAG = (lambda n, b, qs, qe, c: [t for t in _blocks(n, b) if t[0] < qs])
_SKIPPED = ("your key loop stops before the diagonal tile (range(0, q_start, …)): the first query block sees no key "
            "{} and every query misses the keys of its own block")
_SAFE_DIV = (lambda acc, l: torch.where(l > 0, acc / torch.where(l > 0, l, torch.ones_like(l)), torch.zeros_like(acc)))

CAUSAL_MISTAKES: list[Known] = [
    Known("not_causal", "not causal", "you computed full attention: every query also sees the keys after it",
          "visit only key blocks that start before the query block ends, and " + _CAUSAL_FIX, Loop()),
    Known("above_unmasked", "tiles above the diagonal computed and not masked", "your key loop runs past the diagonal "
          "tile, and those tiles are not masked, so queries see future keys", _DIAG_FIX,
          _C(k_blocks=_ALL_KEYS, masked=lambda qs, qe, ks, ke: ks == qs)),
    Known("next_unmasked", "one tile past the diagonal computed and not masked", "your key loop goes one block past "
          "the diagonal (range(0, q_end + block_size, …)), and that tile is not masked, so queries see the next block "
          "of keys", _DIAG_FIX, _C(k_blocks=lambda n, b, qs, qe, c: [t for t in _blocks(n, b) if t[0] < qe + b],
                                   masked=lambda qs, qe, ks, ke: ks == qs)),
    Known("diag_unmasked", "diagonal tile not masked", "you skip the tiles above the diagonal but do not mask inside "
          "the diagonal tile, so a query still sees the later keys of its own block", _CAUSAL_FIX,
          _C(hide=lambda r, c, qs, ks: torch.zeros_like(c > r))),
    *[Known(f"excl_self {i}", "mask hides the query's own key", "your mask hides key ≥ query instead of key > query, so "
            "no query sees itself and the first one sees nothing at all (0/0 = NaN)", "mask only key > query: a query "
            "may attend to itself", _C(hide=lambda r, c, qs, ks: c >= r, masked=masked))
      for i, masked in enumerate((Loop.masked, _EVERY_TILE))],  # tiles past the diagonal masked, or every tile
    Known("one_ahead", "mask one position late", "your mask hides key > query + 1, so every query also sees the next "
          "key", "mask key > query", _C(hide=lambda r, c, qs, ks: c > r + 1)),
    Known("swapped", "mask hides the past instead of the future", "your mask compares the wrong way round (key < "
          "query), so queries see later keys instead of earlier ones", "mask where the key position is greater than "
          "the query position: cols > rows", _C(hide=lambda r, c, qs, ks: c < r)),
    Known("local", "mask from positions inside the tile", "you built the causal mask from positions inside the tile (a "
          "triangle on every tile) instead of global positions, so tiles below the diagonal lose keys they may see",
          "compare global positions, q_start + i and k_start + j, or mask only tiles that reach above the diagonal",
          _C(hide=lambda r, c, qs, ks: (c - ks) > (r - qs), masked=_EVERY_TILE)),
    *[Known(f"weak_fill {fill}", "masked scores filled with a finite value", "you filled the masked scores with a "
            "finite number that is not far enough below scores around −20000, so the masked (future) keys still get "
            "weight", "fill with float('-inf')", _C(fill=fill)) for fill in (-1e4, -1e3, -1e2, -30.0)],
    Known("plus_inf", "masked scores filled with +inf", "you filled the masked scores with +inf instead of −inf: the "
          "row maximum becomes inf and inf − inf = NaN", "fill with float('-inf')", _C(fill=math.inf)),
    Known("to_end", "key blocks run to the end of the sequence", "your key blocks run from their start to the end of "
          "the sequence (an end of n: max( ) where min( ) belongs, or a size larger than block_size), so later blocks "
          "count those keys again", "end each key block at min(k_start + block_size, n)",
          _C(k_blocks=lambda n, b, qs, qe, c: [(s, n) for s, _ in _blocks(n, b) if s < qe])),
    Known("skip_diag", "diagonal tile skipped", _SKIPPED.format("at all (0/0 = NaN)"), _DIAG_FIX.replace(
          "stop the key loop at", "visit key blocks up to and including"), _C(k_blocks=_BEFORE_DIAG)),
    Known("skip_diag_zeros", "diagonal tile skipped", _SKIPPED.format("(its rows come out as 0)"), _DIAG_FIX.replace(
          "stop the key loop at", "visit key blocks up to and including"), _C(k_blocks=_BEFORE_DIAG, finish=_SAFE_DIV)),
    *[Known(k.key, k.summary, k.cause, k.fix, dataclasses.replace(k.make, causal=True)) for k in TILED_MISTAKES],
]


# ============================================================================ known exceptions
def _q_width(q: Tensor, k: Tensor, v: Tensor, b: int) -> None:  # the output allocated with q's width: d_v ≠ d_k raises
    out = torch.zeros(q.shape, dtype=q.dtype)
    out[..., :b, :] = torch.zeros(q.shape[:-2] + (min(b, q.shape[-2]), v.shape[-1]), dtype=q.dtype)


_KEEPDIM = "reduce with keepdim=True: {}.amax(dim=-1, keepdim=True)"
_Q_WIDTH = ("you allocated the output (or acc) with q's width d_k, but each output row is a mix of rows of v, "
            "which have d_v columns", "allocate with v.shape[-1] columns: torch.empty(q.shape[:-1] + (v.shape[-1],))")
# (cause, fix, construct): a construct raising the very same message on the case is the cause
_SOFTMAX_RAISES = [("you took the block's max (or sum) without keepdim=True, so a (..., 1) tensor met a (...,) one "
                    "and broadcast into the wrong shape", _KEEPDIM.format("block"),
                    Pass(block_max=lambda block: block.amax(-1)))]
_TILED_RAISES = [
    (*_Q_WIDTH, _q_width),
    ("you took the row max (or sum) without keepdim=True, so a (…, b, 1) tensor met a (…, b) one and broadcast "
     "into the wrong shape", _KEEPDIM.format("s"), Loop(tile_max=lambda s: s.amax(-1))),
    ("k.T reverses *all* axes of a batched k, not just the last two",
     "transpose the last two axes: k_block.transpose(-2, -1) (or k_block.mT)",
     lambda q, k, v, b: q[..., :b, :] @ k[..., :b, :].T),
]
_PATTERNS = [
    ("RuntimeError", "upper bound and lower bound inconsistent with step sign",
     "a torch.arange(start, end) got an end below its start: the positions of a tile are arange(q_start, q_end) "
     "and arange(k_start, k_end), with each end = min(start + block_size, n)",
     "build the tile's positions as torch.arange(k_start, k_end) with k_end = min(k_start + block_size, n)"),
    ("RuntimeError", "with a bool tensor is not supported",
     "a bool tensor (a mask, the result of a comparison) was used in a subtraction: it holds True/False, not "
     "scores", "keep the scores as numbers and apply the mask with s.masked_fill(mask, float('-inf')); invert a mask "
     "with ~mask, not 1 - mask"),
]


# ============================================================================ the cases
@dataclass
class Case:
    """One input: ``args`` as the learner gets them, ``expected`` from the oracle (float64), its tolerance."""

    name: str
    args: tuple
    expected: Tensor
    atol: float
    rtol: float
    block: int
    causal: bool = False


def _case(name: str, args: tuple[Tensor, ...], b: int, causal: bool = False) -> Case:
    """``args`` (x, or q, k, v) with block size ``b``, the oracle's answer in float64, the tolerance of their dtype."""
    wide = [a.double() for a in args]
    expected = torch.softmax(*wide, -1) if len(args) == 1 else F.scaled_dot_product_attention(*wide, is_causal=causal)
    return Case(name, (*args, b), expected, *((1e-5, 1e-4) if args[0].dtype == torch.float64 else (2e-5, 1e-3)),
                b, causal)


def _offsets(n: int, b: int, pattern: str, spread: float, g: torch.Generator) -> Tensor:
    """(n,) an offset per position, constant on each block: maxima that rise, fall, or both (random steps)."""
    count, f64 = len(_blocks(n, b)), torch.float64
    if pattern != "mixed":
        return torch.linspace(*((0, spread) if pattern == "rising" else (spread, 0)), count, dtype=f64).repeat_interleave(b)[:n]
    steps = (torch.rand(count, generator=g, dtype=f64) + 0.5) * spread
    return torch.cumsum(steps * torch.tensor([(-1.0) ** i for i in range(count)], dtype=f64), 0).repeat_interleave(b)[:n]


def _rows(shape: tuple[int, ...], b: int, seed: int, pattern: str = "mixed", dtype=torch.float64) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) + _offsets(shape[-1], b, pattern, 4.0, g)).to(dtype)


def _extreme_rows(levels: Sequence[Sequence[float]], b: int, seed: int) -> Tensor:
    """Rows whose blocks sit at the given levels (plus a little noise in [0, 5))."""
    x = torch.stack([torch.tensor(level, dtype=torch.float64).repeat_interleave(b) for level in levels])
    return x + 5 * torch.rand(x.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


#: Rows whose blocks of 4 each span 200: a reference other than the block's maximum overflows float32.
_SPREAD = torch.tensor([[-100.0, 0.0, 50.0, 100.0, -90.0, 10.0, 60.0, 95.0],
                        [30.0, -120.0, 80.0, -40.0, 85.0, -110.0, 5.0, 70.0],
                        [0.5, -1.0, 2.0, 0.0, 1.5, -0.5, 1.0, 3.0]], dtype=torch.float64)


@functools.lru_cache(maxsize=None)
def softmax_cases() -> tuple[Case, ...]:
    """The inputs ``check_online_softmax`` tries, in order."""
    f32 = torch.float32
    extreme = _extreme_rows([[800, -200, 700], [-300, 300, 900], [100, -700, 90], [750, 740, 745],
                             [-800, -790, -805]], 4, 7)
    extreme32 = _extreme_rows([[60, -60, 50], [-30, 30, 95], [20, -80, 15], [95, 90, 93], [-120, -110, -115]],
                              4, 8).to(f32)
    return tuple(_case(name, (x,), b) for name, x, b in [
        ("x (4, 10) whose block maxima rise, block_size 3", _rows((4, 10), 3, 1, "rising"), 3),
        ("x (3, 12) whose block maxima fall, then rise, block_size 4", _rows((3, 12), 4, 2), 4),
        ("x (4, 10) whose block maxima fall, block_size 4", _rows((4, 10), 4, 3, "falling"), 4),
        ("x (3, 7), block_size 1", _rows((3, 7), 1, 4), 1),
        ("a 1-D x (9,), block_size 4", _rows((9,), 4, 5), 4),
        ("x (2, 3, 12) (batch × rows), block_size 5", _rows((2, 3, 12), 5, 6), 5),
        ("x (2, 8), block_size 8 (one block)", _rows((2, 8), 8, 9), 8),
        ("x (3, 7), block_size 16 (longer than the row)", _rows((3, 7), 16, 10), 16),
        ("x (2, 1, 1) (n = 1), block_size 3", _rows((2, 1, 1), 3, 11), 3),
        ("x (4, 10) in float32, block_size 3", _rows((4, 10), 3, 12, dtype=f32), 3),
        ("x (5, 12) with values in the hundreds whose block maxima rise and fall by up to 1000, block_size 4",
         extreme, 4),
        ("x (5, 12) in float32 with block maxima that rise and fall by up to 125, block_size 4", extreme32, 4),
        ("x (3, 8) in float32 whose blocks span up to 200, block_size 4", _SPREAD.to(f32), 4),
    ])


def _qkv(lead: tuple[int, ...], n_q: int, n_k: int, d_k: int, d_v: int, b: int, seed: int, pattern: str = "mixed",
         dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v whose scores rise and fall key block by key block (q leans towards the all-ones direction,
    each key block is shifted along it)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*lead, n_q, d_k, generator=g, dtype=torch.float64) + 1.0
    k = torch.randn(*lead, n_k, d_k, generator=g, dtype=torch.float64)
    k = k + _offsets(n_k, b, pattern, 2.0, g)[:, None]
    v = torch.randn(*lead, n_k, d_v, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _exact_qkv(scores: Tensor, d_v: int, seed: int, dtype: torch.dtype = torch.float64) -> tuple[Tensor, ...]:
    """q, k, v with q kᵀ / √d_k equal to ``scores`` (n_q, n_k): q = scores, k = √n_k · I."""
    n_k = scores.shape[-1]
    v = torch.randn(n_k, d_v, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return scores.to(dtype), (math.sqrt(n_k) * torch.eye(n_k, dtype=torch.float64)).to(dtype), v.to(dtype)


def _extreme_qkv(levels: Sequence[Sequence[float]], b: int, d_v: int, seed: int, dtype=torch.float64):
    return _exact_qkv(_extreme_rows(levels, b, seed), d_v, seed + 100, dtype)


@functools.lru_cache(maxsize=None)
def tiled_cases() -> tuple[Case, ...]:
    """The inputs ``check_tiled_attention`` tries, in order."""
    from ..dot import worked_example  # imported here: attn_course.dot imports matplotlib

    f32 = torch.float32
    extreme = _extreme_qkv([[800, -200], [-300, 300], [-700, -705], [750, 740], [100, -700], [-20, -25],
                            [-800, -790]], 4, 3, 21)
    extreme32 = _extreme_qkv([[60, -60], [-30, 30], [-100, -105], [95, 90], [20, -80], [-2, -5], [-120, -110]],
                             4, 3, 22, f32)
    return tuple(_case(name, qkv, b) for name, qkv, b in [
        ("the 4×8 worked example (n = 4, d_k = d_v = 8), block_size 2", worked_example(), 2),
        ("q (10, 4), k (10, 4), v (10, 5) with rising scores, block_size 4", _qkv((), 10, 10, 4, 5, 4, 11, "rising"), 4),
        ("batch × heads (2, 3), n = 37, d_k = 8, d_v = 3, block_size 16", _qkv((2, 3), 37, 37, 8, 3, 16, 12), 16),
        ("q, k (12, 4), v (12, 2), block_size 1", _qkv((), 12, 12, 4, 2, 1, 13), 1),
        ("n_q = 7 queries, n_k = 13 keys, d_k = 4, d_v = 6, block_size 4", _qkv((), 7, 13, 4, 6, 4, 14), 4),
        ("n_q = 13 queries, n_k = 5 keys, d_k = 3, d_v = 2, block_size 4", _qkv((), 13, 5, 3, 2, 4, 15), 4),
        ("q, k (9, 4), v (9, 4), block_size 32 (longer than the sequence)", _qkv((), 9, 9, 4, 4, 32, 16), 32),
        ("a batch of 2, n = 24, d_k = 8, d_v = 8 in float32, block_size 8", _qkv((2,), 24, 24, 8, 8, 8, 17, dtype=f32), 8),
        ("one query over 6 keys, size-1 axes: q (1, 1, 1, 5), v (1, 1, 6, 1), block_size 4",
         _qkv((1, 1), 1, 6, 5, 1, 4, 18), 4),
        ("a single key (n_k = 1), q (3, 4), block_size 2", _qkv((), 3, 1, 4, 2, 2, 19), 2),
        ("scores in the hundreds whose tile maxima rise and fall by up to 1000 (7 queries, 8 keys), block_size 4",
         extreme, 4),
        ("float32 scores whose tile maxima rise and fall by up to 120 (7 queries, 8 keys), block_size 4", extreme32, 4),
        ("float32 scores whose tiles span up to 200 (3 queries, 8 keys), block_size 4", _exact_qkv(_SPREAD, 3, 23, f32), 4),
    ])


@functools.lru_cache(maxsize=None)
def causal_cases() -> tuple[Case, ...]:
    """The inputs ``check_causal_tiled_attention`` tries, in order."""
    from ..dot import worked_example

    f32 = torch.float32
    extreme = _extreme_qkv([[800, -200, 700, -100], [-300, 300, -10, 900], [750, 740, 745, 748], [100, -700, 90, -650],
                            [-20, -25, -700, -10], [-800, -790, -805, -795], [-20000, -20010, -19995, -20005],
                            [-100, 600, -200, 650]], 2, 3, 31)
    extreme32 = _extreme_qkv([[60, -60, 50, -20], [-30, 30, -10, 95], [95, 90, 93, 94], [20, -80, 15, -75],
                              [-2, -5, -100, -1], [-120, -110, -115, -112], [40, -50, 38, -60], [-10, 80, -20, 85]],
                             2, 3, 32, f32)
    return tuple(_case(name, qkv, b, causal=True) for name, qkv, b in [
        ("the 4×8 worked example (n = 4, d_k = d_v = 8), block_size 2", worked_example(), 2),
        ("q, k (10, 4), v (10, 5) with rising scores, block_size 4", _qkv((), 10, 10, 4, 5, 4, 21, "rising"), 4),
        ("batch × heads (2, 3), n = 37, d_k = 8, d_v = 3, block_size 16", _qkv((2, 3), 37, 37, 8, 3, 16, 22), 16),
        ("q, k (12, 4), v (12, 2), block_size 1", _qkv((), 12, 12, 4, 2, 1, 23), 1),
        ("q, k (10, 4), v (10, 3), block_size 5 (n a multiple of the block)", _qkv((), 10, 10, 4, 3, 5, 24), 5),
        ("q, k (11, 3), v (11, 2) with falling scores, block_size 3", _qkv((), 11, 11, 3, 2, 3, 25, "falling"), 3),
        ("q, k (9, 4), v (9, 4), block_size 32 (longer than the sequence)", _qkv((), 9, 9, 4, 4, 32, 26), 32),
        ("a batch of 2, n = 24, d_k = 8, d_v = 8 in float32, block_size 8", _qkv((2,), 24, 24, 8, 8, 8, 27, dtype=f32), 8),
        ("a single position (n = 1) with size-1 axes: q (1, 1, 1, 5), v (1, 1, 1, 1), block_size 4",
         _qkv((1, 1), 1, 1, 5, 1, 4, 28), 4),
        ("scores from −20000 to 900 whose tile maxima rise and fall by up to 1000 (n = 8), block_size 2", extreme, 2),
        ("float32 scores whose tile maxima rise and fall by up to 120 (n = 8), block_size 2", extreme32, 2),
    ])


# ============================================================================ judging the values
_PRECISION = {torch.float64: 3, torch.float32: 2, torch.bfloat16: 1, torch.float16: 1}
_LOOP_FIX = "print m, l and acc after each block on this input and compare them with the notebook's worked example"


def _run(fn: Learner, exercise: str, cases: Sequence[Case], table: Sequence[Known], raises: Sequence[tuple]) -> None:
    """The learner on every case (up to an exception), then each answer through the kit's engine. A row is a
    suspect only if it reproduces every answer after the first wrong one too; before the engine falls back to
    a generic mismatch, the properties of :func:`_measure` are tried."""
    softmax = exercise == "online_softmax"
    suspects = Suspects(_remembered(exercise, cases, table), atol=2e-5, rtol=1e-3)  # float32's tolerance
    answers: list[tuple[Case, Tensor, str]] = []
    for case in cases:
        tried = f"{exercise}({'x' if softmax else 'q, k, v'}, {case.block}) on {case.name}"
        try:
            answers.append((case, as_tensor(fn(*case.args), tried=tried), tried))
        except LearnerRaised as exc:
            if any(not _right(out, c) for c, out, _ in answers):
                break  # an earlier wrong answer is the one to explain
            constructs = [(cause, fix, functools.partial(make, *case.args)) for cause, fix, make in raises]
            raise Failure(learner_error(exc, tried=tried, expected="a tensor shaped like x" if softmax else
                                        "a tensor (..., n_q, d_v)", **explain_raise(exc, constructs, _PATTERNS))) from None
    for i, (case, out, tried) in enumerate(answers):
        if not _right(out, case):  # the rows' outputs on the check's own cases are remembered: None where they raise
            suspects.table = [k for k in suspects.table if all(
                (o := k.make(*c.args)) is None or same(a, o, atol=c.atol, rtol=c.rtol) for c, a, _ in answers[i + 1:])]
            if not suspects.suspects(out, case.args):
                _measure(fn, out, case, tried, softmax)
        suspects.expect(out, case.expected, case.args, tried=tried, what="your result" if softmax else "your output",
                        atol=case.atol, rtol=case.rtol, fix=_LOOP_FIX,
                        oracle="torch.softmax" if softmax else "F.scaled_dot_product_attention")
    for case, out, tried in answers:  # right values, and no less precise than the input
        given = case.args[0].dtype
        if _PRECISION.get(out.dtype, 0) < _PRECISION[given]:
            got, want = (str(t).replace("torch.", "") for t in (out.dtype, given))
            fail(f"result in {got} for {want} input", tried=tried,
                 got=f"a {got} result, close to the right values but with {got}'s precision",
                 expected=f"a {want} result, like the input",
                 cause="a tensor you created without dtype= (torch.empty, zeros and full make float32 by default)"
                       if out.dtype == torch.float32 and given == torch.float64 else f"your computation converted to {got}",
                 fix=f"create every tensor with dtype={'x' if softmax else 'q'}.dtype (or with *_like functions)")


def _right(out: Tensor, case: Case) -> bool:
    return same(out, case.expected, atol=case.atol, rtol=case.rtol)


_OUTPUTS: dict[tuple[str, str, int], Any] = {}


def _remembered(exercise: str, cases: Sequence[Case], table: Sequence[Known]) -> list[Known]:
    """The table with each row's output on the check's own cases computed once per process (they are fixed;
    None where the row raises)."""
    index = {id(c.args[0]): i for i, c in enumerate(cases)}

    def once(known: Known) -> Callable[..., Any]:
        def make(*args: Any) -> Any:
            i = index.get(id(args[0]))
            if i is None or any(a is not b for a, b in zip(args, cases[i].args)):
                return known.make(*args)
            if (exercise, known.key, i) not in _OUTPUTS:
                _OUTPUTS[exercise, known.key, i] = call_or_skip(lambda: known.make(*args))
            return _OUTPUTS[exercise, known.key, i]
        return make

    return [dataclasses.replace(k, make=once(k)) for k in table]


def _measure(fn: Learner, out: Tensor, case: Case, tried: str, softmax: bool) -> None:
    """Properties of a wrong answer that no known mistake reproduces; each ends the check when it holds."""
    e, what = case.expected, "your result" if softmax else "your output"
    got, expected = f"{what} of shape {tuple(out.shape)}", f"shape {tuple(e.shape)}"
    if tuple(out.shape) != tuple(e.shape):
        if out.dim() >= 2 and tuple(out.shape) == tuple(e.transpose(-2, -1).shape) and \
                same(out.transpose(-2, -1), e, atol=case.atol, rtol=case.rtol):
            fail("output transposed", tried=tried, got=got + ": the right numbers with the last two axes swapped",
                 expected=expected, cause="you returned the result transposed (the last two axes swapped)",
                 fix="return it with the docstring's axes: " + ("(..., n)" if softmax else "(..., n_q, d_v)"))
        if softmax and tuple(out.shape) == tuple(e.shape[:-1]) + (1,):
            fail("one value per row instead of the softmax", tried=tried, got=got + ": one number per row",
                 expected=expected, cause="you returned a per-row quantity (shaped like the running max m or sum l, "
                 "or built from them alone) instead of exp(x − m) / l", fix=_FINAL_FIX)
        q, v = case.args[0], case.args[-2]
        if not softmax and out.shape == q.shape and q.shape[-1] != v.shape[-1]:
            fail("output has q's width d_k, not v's width d_v", tried=tried, got=got, expected=expected,
                 cause=_Q_WIDTH[0], fix=_Q_WIDTH[1])
        return  # the engine's shape diagnosis follows
    if not out.is_floating_point():
        return
    a, axis, b = out.double(), -1 if softmax else -2, case.block
    n, unit = e.shape[axis], "columns" if softmax else "rows"
    rows = lambda t: t.movedim(axis, 0).reshape(n, -1)  # noqa: E731 - (n, everything else): a row per position
    bad = rows(~torch.isclose(a, e, atol=case.atol, rtol=case.rtol)).any(1)  # (n,) positions with a wrong entry
    ps, pe = _blocks(n, b)[-1]
    if pe - ps < b and ps > 0 and bad[ps:].any() and not bad[:ps].any():
        fail(f"wrong only in the last, partial block ({unit} {ps}–{pe - 1})", tried=tried,
             got=f"the {unit} of every full block are right, but {unit} {ps}–{pe - 1} (the last block, {pe - ps} long "
                 f"instead of {b}) are wrong", expected="the same computation for a block shorter than block_size",
             cause="your loop handles a block shorter than block_size differently (a slice or range that assumes full "
                   "blocks, or a buffer of size block_size)",
             fix="use range(0, n, block_size) and slices [start:start + block_size], which stop at the end by "
                 "themselves, and size every buffer from the slice you got")
    if not softmax and bad.any() and not bad.all():  # some rows right: were the others written at all?
        zero = (rows(a).abs() < 1e-30).all(1) & (rows(e).abs() > 1e-12).any(1)
        # a computed row doubles when v doubles (exactly: × 2 commutes with rounding); memory never written does not
        q, k, v, _ = case.args
        doubled = call_or_skip(lambda: as_tensor(fn(q, k, 2 * v, b), tried=tried))
        stale = ~rows(torch.isclose(doubled.double(), 2 * a, atol=case.atol, rtol=case.rtol, equal_nan=True)).all(1) \
            if doubled is not None and doubled.shape == out.shape else torch.zeros_like(zero)
        if not (bad & ~zero & ~stale).any():
            shown = [int(i) for i in bad.nonzero()]
            first, d_k = shown[0], case.args[0].shape[-1]
            stop = f" (it stops at {first} = d_k = q.shape[-1]: n_q is q.shape[-2])" if first == d_k and shown == \
                list(range(first, n)) else ""
            fail(f"output rows never written ({_list(shown)})", tried=tried,
                 got=f"rows {_list(shown)} of your output " + ("are 0 (what torch.zeros or a fresh torch.empty holds)"
                     if bool(zero[bad].all()) else "are 0 or do not double when v is doubled, as computed rows do "
                     "(torch.empty leaves whatever the memory held)") + "; the other rows are right",
                 expected="every row computed",
                 cause=f"your query loop never writes these rows{stop}",
                 fix="visit every query block: for q_start in range(0, n_q, block_size)")
    if torch.isnan(a).all() and a.numel() > 1:
        fail("NaN from the first block on", tried=tried, got=f"every entry of {what} is NaN", expected="finite numbers",
             cause="the first update of the running state already gives NaN (common causes: rescaling by "
                   "exp(m_new − m_old), which is exp(+inf) = inf on the first block while the sum is 0, and "
                   "0 × inf = NaN; or a running max that starts at +inf)",
             fix="start m at −inf and l, acc at 0; rescale by exp(m_old − m_new); print m and l after the first block")
    if torch.isfinite(a).all() and a.numel():
        c = (a * e).sum(-1, keepdim=True) / (e * e).sum(-1, keepdim=True).clamp_min(1e-300)  # a ≈ c · e, row by row?
        if torch.allclose(a, c * e, atol=1e-7, rtol=1e-6) and not torch.allclose(c, torch.ones_like(c), rtol=1e-5, atol=0):
            span = f"from {fmt(float(c.min()))} to {fmt(float(c.max()))}"
            fail("rows scaled by a wrong normaliser", tried=tried,
                 got=f"each row is softmax(x) times its own factor ({span}), so the rows sum to those factors" if softmax
                 else f"each output row is the right one times its own factor ({span})",
                 expected="rows that sum to 1" if softmax else "each row a weighted average of v's rows (weights summing to 1)",
                 cause="the running sum l does not equal Σ exp(x − m) over the row: it is rescaled or summed differently "
                       "from how exp(x − m) is formed at the end" if softmax else "the accumulator and the running sum l "
                       "do not match: one is rescaled, summed or divided differently from the other",
                 fix="after each block: l = l · exp(m_old − m_new) + Σ exp(block − m_new); return exp(x − m) / l with the "
                     "final m" if softmax else "rescale acc and l by the same exp(m_old − m_new), and divide acc by l once, "
                     "after the last key block")
    c = _temperature(a, case)
    d_k = 1 if softmax else case.args[0].shape[-1]
    if c is not None and abs(c * math.sqrt(d_k) - 1) > 1e-4:
        factor = c * math.sqrt(d_k)
        named = next((name for name, value in {"ln 2 (exp2 used in place of exp)": math.log(2),
                                               "1/ln 2 (log2 e folded in twice)": 1 / math.log(2), "√d_k": math.sqrt(d_k),
                                               "1/√d_k": 1 / math.sqrt(d_k), "d_k": float(d_k)}.items()
                      if abs(factor - value) <= 1e-3 * value and (not softmax or "ln" in name)), "")
        if softmax:
            fail(f"softmax of {fmt(c)} · x", tried=tried, got=f"exactly softmax({fmt(c)} · x), rows summing to 1",
                 expected="softmax(x)", cause="you used exp2 (base 2) where the formulas use exp: 2^x = e^(x·ln 2)"
                 if named.startswith("ln 2") else f"your exponentials see the values multiplied by {fmt(c)}",
                 fix="use torch.exp for every exponential, on x − m itself")
        fail(f"scores scaled by {fmt(c)} instead of 1/√d_k = {fmt(1 / math.sqrt(d_k))}", tried=tried,
             got=f"exactly softmax({fmt(c)} · q kᵀ) v", expected=f"softmax(q kᵀ / √d_k) v with d_k = {d_k}",
             cause=f"your scores are {named} times the right ones" if named else
             f"your scores are multiplied by {fmt(c)} somewhere, not by 1/√d_k",
             fix="multiply q kᵀ by 1/√d_k, d_k = q.shape[-1], once, and use torch.exp for the exponentials")
    if case.causal:
        _leak(fn, case, tried)


def _list(rows: list[int]) -> str:
    return ", ".join(map(str, rows[:6])) + ("…" if len(rows) > 6 else "")


def _temperature(a: Tensor, case: Case) -> float | None:
    """c when ``a`` is exactly softmax(c · x) (fitted on log a), or softmax(c · q kᵀ) v (a search over c)."""
    if not torch.isfinite(a).all():
        return None
    if len(case.args) == 2:
        x = case.args[0].double()
        if not (a > 0).all() or x.shape[-1] < 2:
            return None
        xc, yc = x - x.mean(-1, keepdim=True), a.log() - a.log().mean(-1, keepdim=True)
        if float((xc * xc).sum()) < 1e-12:
            return None
        c = float((xc * yc).sum() / (xc * xc).sum())
        fits = torch.allclose(yc, c * xc, atol=1e-6, rtol=1e-5) and torch.allclose(a.sum(-1), torch.ones(1, dtype=a.dtype))
        return c if fits else None
    q, k, v = (t.double() for t in case.args[:3])
    raw = q @ k.transpose(-2, -1)
    if case.causal:
        raw = raw.masked_fill(torch.ones(raw.shape[-2:], dtype=torch.bool).triu(1), -math.inf)

    def error(log_c: float) -> float:
        return float((torch.softmax(raw * math.exp(log_c), -1) @ v - a).abs().max())

    best = min((i / 8 for i in range(-80, 81)), key=error)  # c from e^-10 to e^10, then a golden-section refinement
    lo, hi = best - 1 / 8, best + 1 / 8
    for _ in range(40):
        x1, x2 = hi - (hi - lo) * 0.618, lo + (hi - lo) * 0.618
        lo, hi = (lo, x2) if error(x1) < error(x2) else (x1, hi)
    log_c = (lo + hi) / 2
    return math.exp(log_c) if error(log_c) <= case.atol + case.rtol * float(a.abs().max()) else None


def _leak(fn: Learner, case: Case, tried: str) -> None:
    """Causal: change the last key and value only; every earlier row of a causal answer must stay put. (An answer
    that differs between two calls on the same input, unwritten torch.empty memory, tells nothing.)"""
    q, k, v, b = case.args
    k2, v2 = k.clone(), v.clone()
    k2[..., -1, :] += 3.0
    v2[..., -1, :] -= 5.0
    try:
        first, second, again = (as_tensor(fn(q, k_, v_, b), tried=tried) for k_, v_ in ((k, v), (k2, v2), (k, v)))
    except Exception:  # noqa: BLE001 - this probe only adds evidence
        return
    n = q.shape[-2]
    if n < 2 or tuple(first.shape) != tuple(second.shape) or first.shape[-2] != n or not same(first, again, atol=0, rtol=0):
        return
    changed = ~torch.isclose(first[..., :-1, :].double(), second[..., :-1, :].double(), atol=1e-9, rtol=1e-7,
                             equal_nan=True)
    if changed.any():
        fail("queries see future keys", tried=f"{tried}, then again with only the last key and value changed",
             got=f"rows {_list(sorted({int(i) for i in changed.nonzero()[:, -2]}))} changed too, though they come "
                 "before the last position",
             expected=f"only row {n - 1} (the one query allowed to see the last key) to change",
             cause="some tiles (or entries) above the diagonal reach the softmax: a tile past the diagonal is "
                   "computed, or the mask lets key > query through",
             fix="visit key blocks only up to the diagonal and " + _CAUSAL_FIX)


# ============================================================================ how it is computed: a probe
_SOFTMAX_FUNCTIONS = {"softmax", "log_softmax", "_softmax", "_log_softmax", "_safe_softmax"}
_FUSED_FUNCTIONS = {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
                    "_scaled_dot_product_attention_math", "multi_head_attention_forward"}


@probe("fast.trace")
def trace(fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
    """Run ``fn(*args)`` under the kit's watcher: the torch functions called (``ops``), the largest tensor
    created (``largest`` elements, ``shape``), how many inputs one output of each max or sum combined
    (``reductions``) and the matrix-multiply FLOPs (``flops``). Plain data only."""
    return watch(fn, *args)


def _reduction_rule(sizes: list[int], b: int, n: int, tried: str, *, unit: str, reads: str) -> None:
    """Every max and sum covers one block: some cover exactly ``b`` numbers, none more (n ≥ 8·b here)."""
    if not sizes:
        return  # no torch reductions at all (plain Python numbers): nothing to judge by
    shown, top = ", ".join(map(str, sizes)), max(sizes)
    whole = " (the whole row)" if top >= n else ""
    if b not in sizes:
        fail("block_size not used", tried=tried, got=f"your maxima and sums combine {shown} numbers at a time{whole}, "
             f"never block_size = {b}", expected=f"blocks of block_size = {b} {unit}s",
             cause=f"your loop reads a fixed number of {unit}s, whatever block_size says",
             fix=f"slice each block with block_size: {reads}")
    if top > b:
        fail(f"max or sum over {'the whole row' if whole else f'{top} {unit}s'} as well as blocks", tried=tried,
             got=f"your maxima and sums combine {shown} numbers at a time: blocks of {b}, but also {top}{whole}",
             expected=f"every max and sum over one block of block_size = {b} {unit}s",
             cause="besides the blocks, you reduce over more at once (a maximum found before the loop, or a "
                   "normalisation after it): that is a second pass, where the algorithm makes one",
             fix="inside the loop, reduce only the current block and fold it into the running m and l; after the "
                 "loop, divide by l")


def _tile_work(n: int, d_k: int, d_v: int, b: int, *, causal: bool, extra: int = 0, passes: int = 1) -> float:
    """Matrix-multiply FLOPs of the tiled loop (one head): per visited tile q kᵀ (2·b_q·b_k·d_k, ``passes``
    times) and p v (2·b_q·b_k·d_v); ``extra`` more key blocks per query block when causal."""
    return sum(2.0 * (qe - qs) * (ke - ks) * (passes * d_k + d_v) for qs, qe in _blocks(n, b)
               for ks, ke in _blocks(n, b) if not causal or ks < qe + extra * b)


def _softmax_structure(fn: Learner) -> None:
    n, b = 48, 6
    tried = f"online_softmax(x, {b}) on x (3, {n}), watching which torch functions run"
    seen = fn.observe("fast.trace", _rows((3, n), b, 40), b)
    if set(seen["ops"]) & _SOFTMAX_FUNCTIONS:
        fail("calls torch.softmax", tried=tried, got="your function calls torch.softmax (or log_softmax)",
             expected="a softmax built from a running max and a running sum",
             cause="the values are right, but torch.softmax does the exercise for you",
             fix="build it yourself: a running max m and sum l over the blocks, then exp(x − m) / l")
    _reduction_rule(seen["reductions"], b, n, tried, unit="column", reads="x[..., start:start + block_size]")


def _attention_structure(fn: Learner, name: str, causal: bool) -> None:
    # Memory: many small tiles; a full score matrix, a full mask or a row of tiles stands out by a factor ≥ 4.
    lead, n, d_k, d_v, b = 2, 192, 2, 1, 16
    q, k, v = _qkv((lead,), n, n, d_k, d_v, b, 41)
    tried = f"{name}(q, k, v, {b}) on q, k ({lead}, {n}, {d_k}), v ({lead}, {n}, {d_v}), watching what it creates"
    seen = fn.observe("fast.trace", q, k, v, b)
    if any(op in _FUSED_FUNCTIONS or "attention" in op for op in seen["ops"]):
        fail("calls a fused attention", tried=tried, got="your function calls F.scaled_dot_product_attention "
             "(or another fused attention)", expected="the tiled loop, written out",
             cause="the values are right, but the fused function does the exercise for you",
             fix="compute each tile's scores with @ and keep the running max, sum and accumulator yourself")
    limit = 2 * max(lead * b * b, q.numel(), k.numel(), v.numel(), lead * n * d_v)
    elements, shape = seen["largest"], tuple(seen["shape"])
    if elements > limit:
        big = [s for s in shape if s > b]
        if len(big) >= 2 and n in shape:
            summary, what = f"builds a full {n} × {n} matrix", f"a full {n} × {n} matrix (scores, probabilities or a mask)"
        elif len(big) == 1 and n in shape:
            summary, what = "builds a whole row of tiles at once", f"a whole row or column of tiles ({n} positions by a block)"
        elif any(s > b for s in shape[-2:]):
            summary, what = "tiles larger than block_size", f"tiles larger than block_size = {b}"
        else:
            summary, what = "builds a tensor larger than a tile", "a large tensor"
        fail(summary, tried=tried, got=f"your function creates a tensor of shape {shape} ({elements} numbers): {what}",
             expected=f"nothing larger than the inputs, the output and a ({b}, {b}) tile (at most {limit // 2} numbers "
                      "here)",
             cause="the values are right, but holding that tensor is what tiling avoids: its memory grows like n²",
             fix="compute one (block_size, block_size) tile of scores at a time, and mask (causal) tile by tile "
                 "from global positions")
    _reduction_rule(seen["reductions"], b, n, tried, unit="key", reads="k[..., start:start + block_size, :]")
    # Work: few large blocks, d_k ≫ d_v, so reading the keys twice or one tile too many shows by ≥ 1.3×.
    n, d_k, d_v, b = 96, 8, 1, 32
    tried = f"{name}(q, k, v, {b}) on q, k (1, {n}, {d_k}), v (1, {n}, {d_v}), counting matrix-multiply FLOPs"
    flops = fn.observe("fast.trace", *_qkv((1,), n, n, d_k, d_v, b, 42), b)["flops"]
    needed = _tile_work(n, d_k, d_v, b, causal=causal)
    if flops <= 1.2 * needed:
        return
    # (summary, what the work matches, its FLOPs)
    candidates = [("computes the tiles above the diagonal", "every tile, also those above the diagonal",
                   _tile_work(n, d_k, d_v, b, causal=False)),
                  ("computes one tile past the diagonal", "one tile past the diagonal per query block",
                   _tile_work(n, d_k, d_v, b, causal=True, extra=1))] if causal else []
    candidates.append(("reads the keys twice", "the scores twice (a first pass for the maximum, then the sums)",
                       _tile_work(n, d_k, d_v, b, causal=causal, passes=2)))
    summary, named = next(((s, w) for s, w, work in candidates if abs(flops - work) <= 0.02 * work),
                          ("does more work than one pass", ""))
    above = "diagonal" in summary
    fail(summary, tried=tried,
         got=f"{fmt(flops)} matrix-multiply FLOPs, {fmt(flops / needed)} × what one pass needs" + (f": {named}" if named else ""),
         expected=f"{fmt(needed)}: each tile{' on or below the diagonal' if causal else ''} computed once",
         cause=("the values are right, but the tiles above the diagonal are entirely masked: computing them is "
                "wasted work, and skipping them is what halves a causal attention's cost" if above else
                "the values are right, but the algorithm is a single pass: each tile's scores computed once, with a "
                "running maximum instead of a maximum found beforehand"),
         fix=_DIAG_FIX if above else "visit each key block once per query block, updating m, l and acc as you go")


# ============================================================================ the checks
@check("online_softmax", expects="a function online_softmax(x, block_size=1) returning a tensor shaped like x")
def check_online_softmax(fn: Learner) -> str:
    cases = softmax_cases()
    _run(fn, "online_softmax", cases, SOFTMAX_MISTAKES, _SOFTMAX_RAISES)
    _softmax_structure(fn)
    return (f"matches torch.softmax on {len(cases)} cases (block sizes 1…16, 1-D to 3-D, maxima rising and falling, "
            "values near ±1000) and reads x in blocks, once")


@check("tiled_attention",
       expects="a function tiled_attention(q, k, v, block_size=64) returning a tensor (..., n_q, d_v)")
def check_tiled_attention(fn: Learner) -> str:
    cases = tiled_cases()
    _run(fn, "tiled_attention", cases, TILED_MISTAKES, _TILED_RAISES)
    _attention_structure(fn, "tiled_attention", causal=False)
    return (f"matches F.scaled_dot_product_attention on {len(cases)} cases (blocks 1…32, n_q ≠ n_k, d_k ≠ d_v, "
            "extreme scores) and holds only (block, block) tiles, each computed once")


@check("causal_tiled_attention",
       expects="a function causal_tiled_attention(q, k, v, block_size=64) returning a tensor (..., n, d_v)")
def check_causal_tiled_attention(fn: Learner) -> str:
    cases = causal_cases()
    _run(fn, "causal_tiled_attention", cases, CAUSAL_MISTAKES, _TILED_RAISES)
    _attention_structure(fn, "causal_tiled_attention", causal=True)
    return (f"matches causal F.scaled_dot_product_attention on {len(cases)} cases and never computes a tile above "
            "the diagonal")
