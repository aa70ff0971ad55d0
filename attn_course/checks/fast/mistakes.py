"""Known mistakes as data: each row the algorithm of :mod:`.steps` with one step changed; then the known
exceptions, each with a construct that raises the very same message."""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from ..kit import Known
from .steps import Loop, Pass, Tensor, blocks, drop_last, ends, grow, keys, no_tail, one, zero


# ============================================================================ known mistakes, as data
_RESCALE_FIX = "multiply by exp(m_old − m_new) (≤ 1) before adding the new block's terms"
_TAIL_FIX = ("loop with range(0, n, block_size) and slice [start:start + block_size]: slicing stops at the end by "
             "itself, so the last, shorter block is read too")
FINAL_FIX, _SLICE_FIX = "return torch.exp(x - m) / l", "slice [start:start + block_size]: the end of a slice is not included"
_MAX_FAR = "when a block's maximum falls far below an earlier one, exp(m_old − m_new) overflows"

SOFTMAX_MISTAKES: list[Known] = [
    Known("no_max", "no running maximum subtracted", "you exponentiated the raw values, so exp overflowed to inf for "
          "large values and underflowed to 0 for very negative ones (inf / inf and 0 / 0 are NaN)", "keep a running max m and exponentiate x − m", Pass(new_max=zero)),
    Known("sum", "running sum not rescaled", "you added each block's Σ exp(x − m_new) to a running sum that was still "
          "relative to the old maximum", "when the maximum grows, " + _RESCALE_FIX, Pass(factor=one)),
    Known("sign", "running sum rescaled by exp(m_new − m_old)", "you rescaled the running sum by exp(m_new − m_old): "
          "the sign is reversed, so the old sum grows instead of shrinking", _RESCALE_FIX, Pass(factor=grow)),
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
          FINAL_FIX, Pass(finish=lambda x, m, l: torch.exp(x - m))),
    Known("final_raw", "exp(x) instead of exp(x − m) at the end", "your last step computes exp(x) / l, but l is a sum "
          "of exp(x − m): the two do not match", FINAL_FIX, Pass(finish=lambda x, m, l: torch.exp(x) / l)),
    Known("final_noexp", "exp missing in the last step", "your last step computes (x − m) / l, without the exp",
          FINAL_FIX, Pass(finish=lambda x, m, l: (x - m) / l)),
    Known("final_log", "log instead of exp in the last step", "your last step computes log(x − m) / l: a log where "
          "the softmax has exp (x − m ≤ 0, so mostly NaN)", FINAL_FIX, Pass(finish=lambda x, m, l: torch.log(x - m) / l)),
    Known("tail", "last, shorter block dropped", "your loop stops before the last block when n is not a multiple of "
          "block_size, so those columns never reach the running max and sum", _TAIL_FIX, Pass(blocks=no_tail)),
    Known("last", "last block dropped", "your loop (range(0, n - block_size, block_size)) never reads the last block",
          _TAIL_FIX, Pass(blocks=drop_last)),
    Known("short_slice", "each block one column short", "you sliced [start:start + block_size - 1], so the last column "
          "of every block is skipped", _SLICE_FIX, Pass(blocks=ends(lambda s, b: s + b - 1))),
    Known("long_slice", "blocks overlap by one column", "you sliced [start:start + block_size + 1], so the first column "
          "of each next block is counted twice", _SLICE_FIX, Pass(blocks=ends(lambda s, b: s + b + 1))),
    Known("per_block", "each block normalised on its own", "you took a softmax inside each block, so each block sums "
          "to 1 instead of the whole row", "normalise once, at the end: exp(x − m) / l with m and l over the whole row",
          lambda x, b: torch.cat([torch.softmax(x[..., s:e], -1) for s, e in blocks(x.shape[-1], b)], -1)),
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
          "sum l", "multiply l too by exp(m_old − m_new) before adding the new tile's row sums", Loop(sum_factor=one)),
    Known("acc", "accumulator not rescaled", "you rescaled the running sum when the maximum grew, but not the output "
          "accumulator acc", "multiply acc too by exp(m_old − m_new) before adding p @ v_block", Loop(acc_factor=one)),
    Known("neither", "running sum and accumulator not rescaled", "you never rescaled l or acc when the maximum grew: "
          "both still hold terms relative to the old maximum", "multiply both l and acc by exp(m_old − m_new) before "
          "adding the new tile", Loop(sum_factor=one, acc_factor=one)),
    Known("sign", "rescaled by exp(m_new − m_old)", "you rescaled by exp(m_new − m_old): the sign is reversed, so old "
          "terms grow instead of shrinking", "rescale by exp(m_old − m_new), which is ≤ 1",
          Loop(sum_factor=grow, acc_factor=grow)),
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
          "the largest scores and underflowed to 0 for a row far below 0 (inf / inf and 0 / 0 are NaN)", "keep a running row max m and exponentiate s − m", Loop(new_max=zero)),
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
          "a multiple of block_size, so those keys get no weight", _TAIL_FIX, Loop(k_blocks=keys(no_tail))),
    Known("k_last", "last key block dropped", "your key loop (range(0, n_k - block_size, block_size)) never visits the "
          "last key block", _TAIL_FIX, Loop(k_blocks=keys(drop_last))),
    Known("k_first", "only the first key block visited", "your key loop visits only the first key block (its step is "
          "larger than block_size, or it ends after one tile), so the later keys get no weight", "visit every key "
          "block: range(0, n_k, block_size)", Loop(k_blocks=keys(lambda n, b: blocks(n, b)[:1]))),
    Known("k_from1", "key loop starts at 1", "your key loop starts at 1, not 0: key 0 is never read and every block is "
          "shifted by one", "start at 0: range(0, n_k, block_size)",
          Loop(k_blocks=keys(lambda n, b: [(s, min(s + b, n)) for s in range(1, n, b)]))),
    Known("k_short", "each key block one key short", "you sliced the keys [start:start + block_size - 1], so the last "
          "key of every block is skipped", _SLICE_FIX, Loop(k_blocks=keys(ends(lambda s, b: s + b - 1)))),
    Known("k_long", "key blocks overlap by one key", "you sliced the keys [start:start + block_size + 1], so the first "
          "key of each next block counts twice", _SLICE_FIX, Loop(k_blocks=keys(ends(lambda s, b: s + b + 1)))),
    *[Known(key, "last, shorter query block not computed", "your query loop stops before the last query block when n_q "
            f"is not a multiple of block_size, so those rows are {what}", _TAIL_FIX, Loop(q_blocks=no_tail, short=short))
      for key, what, short in (("q_tail", "never written", False), ("q_tail_short", "missing from the output", True))],
]

CAUSAL_FIX = ("mask, in the tiles that reach above the diagonal, the scores whose key position is greater than the "
               "query position: s.masked_fill(cols > rows, -inf) with global positions rows = q_start + i, "
               "cols = k_start + j")
DIAG_FIX = "stop the key loop at the diagonal: range(0, q_end, block_size)"
_TO_DIAG = "visit key blocks up to and including the diagonal: range(0, q_end, block_size)"
_C = functools.partial(Loop, causal=True)
_ALL_KEYS, _EVERY_TILE = (lambda n, b, qs, qe, c: blocks(n, b)), (lambda qs, qe, ks, ke: True)
_BEFORE_DIAG = (lambda n, b, qs, qe, c: [t for t in blocks(n, b) if t[0] < qs])
_SKIPPED = ("your key loop stops before the diagonal tile (range(0, q_start, …)): the first query block sees no key "
            "{} and every query misses the keys of its own block")
_SAFE_DIV = (lambda acc, l: torch.where(l > 0, acc / torch.where(l > 0, l, torch.ones_like(l)), torch.zeros_like(acc)))

CAUSAL_MISTAKES: list[Known] = [
    Known("not_causal", "not causal", "you computed full attention: every query also sees the keys after it",
          "visit only key blocks that start before the query block ends, and " + CAUSAL_FIX, Loop()),
    Known("above_unmasked", "tiles above the diagonal computed and not masked", "your key loop runs past the diagonal "
          "tile, and those tiles are not masked, so queries see future keys", DIAG_FIX,
          _C(k_blocks=_ALL_KEYS, masked=lambda qs, qe, ks, ke: ks == qs)),
    Known("next_unmasked", "one tile past the diagonal computed and not masked", "your key loop goes one block past "
          "the diagonal (range(0, q_end + block_size, …)), and that tile is not masked, so queries see the next block "
          "of keys", DIAG_FIX, _C(k_blocks=lambda n, b, qs, qe, c: [t for t in blocks(n, b) if t[0] < qe + b],
                                   masked=lambda qs, qe, ks, ke: ks == qs)),
    Known("diag_unmasked", "diagonal tile not masked", "you skip the tiles above the diagonal but do not mask inside "
          "the diagonal tile, so a query still sees the later keys of its own block", CAUSAL_FIX,
          _C(hide=lambda r, c, qs, ks: torch.zeros_like(c > r))),
    *[Known(f"excl_self {i}", "mask hides the query's own key", "your mask hides key ≥ query instead of key > query, so "
            "no query sees itself and the first one sees nothing at all (0/0 = NaN)", "mask only key > query: a query "
            "may attend to itself", _C(hide=lambda r, c, qs, ks: c >= r, masked=masked))
      for i, masked in enumerate((Loop.masked, _EVERY_TILE))],  # tiles past the diagonal masked, or every tile
    *[Known(f"excl_self_zeros {i}", "mask hides the query's own key", "your mask hides key ≥ query instead of key > "
            "query, so no query sees itself, and the first one, which then sees no key at all, comes out as 0 (a guard "
            "against 0/0 hides the NaN)", "mask only key > query: a query may attend to itself",
            _C(hide=lambda r, c, qs, ks: c >= r, masked=masked, finish=_SAFE_DIV))
      for i, masked in enumerate((Loop.masked, _EVERY_TILE))],
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
          _C(k_blocks=lambda n, b, qs, qe, c: [(s, n) for s, _ in blocks(n, b) if s < qe])),
    *[Known(key, "diagonal tile skipped", _SKIPPED.format(seen), _TO_DIAG, _C(k_blocks=_BEFORE_DIAG, **finish))
      for key, seen, finish in (("skip_diag", "at all (0/0 = NaN)", {}),
                                ("skip_diag_zeros", "(its rows come out as 0)", dict(finish=_SAFE_DIV)))],
    Known("skip_diag_after_first", "diagonal tile skipped after the first query block", "your key loop stops "
          "before the diagonal tile (range(0, q_start, …)) in every query block but the first (which would see no key "
          "at all): from the second block on, every query misses the keys of its own block, itself included",
          _TO_DIAG, _C(k_blocks=lambda n, b, qs, qe, c: [t for t in blocks(n, b) if t[0] < (qs or qe)])),
    *[Known(k.key, k.summary, k.cause, k.fix, dataclasses.replace(k.make, causal=True)) for k in TILED_MISTAKES],
]


# ============================================================================ known exceptions
def _q_width(q: Tensor, k: Tensor, v: Tensor, b: int) -> None:  # the output allocated with q's width: d_v ≠ d_k raises
    out = torch.zeros(q.shape, dtype=q.dtype)
    out[..., :b, :] = torch.zeros(q.shape[:-2] + (min(b, q.shape[-2]), v.shape[-1]), dtype=q.dtype)


_KEEPDIM = "reduce with keepdim=True: {}.amax(dim=-1, keepdim=True)"
Q_WIDTH = ("you allocated the output (or acc) with q's width d_k, but each output row is a mix of rows of v, "
            "which have d_v columns", "allocate with v.shape[-1] columns: torch.empty(q.shape[:-1] + (v.shape[-1],))")
# (cause, fix, construct): a construct raising the very same message on the case is the cause
SOFTMAX_RAISES = [("you took the block's max (or sum) without keepdim=True, so a (..., 1) tensor met a (...,) one "
                    "and broadcast into the wrong shape", _KEEPDIM.format("block"),
                    Pass(block_max=lambda block: block.amax(-1)))]
TILED_RAISES = [
    (*Q_WIDTH, _q_width),
    ("you took the row max (or sum) without keepdim=True, so a (…, b, 1) tensor met a (…, b) one and broadcast "
     "into the wrong shape", _KEEPDIM.format("s"), Loop(tile_max=lambda s: s.amax(-1))),
    ("k.T reverses *all* axes of a batched k, not just the last two",
     "transpose the last two axes: k_block.transpose(-2, -1) (or k_block.mT)",
     lambda q, k, v, b: q[..., :b, :] @ k[..., :b, :].T),
]
PATTERNS = [
    ("RuntimeError", "upper bound and lower bound inconsistent with step sign",
     "a torch.arange(start, end) got an end below its start: the positions of a tile are arange(q_start, q_end) "
     "and arange(k_start, k_end), with each end = min(start + block_size, n)",
     "build the tile's positions as torch.arange(k_start, k_end) with k_end = min(k_start + block_size, n)"),
    ("RuntimeError", "with a bool tensor is not supported",
     "a bool tensor (a mask, the result of a comparison) was used in a subtraction: it holds True/False, not "
     "scores", "keep the scores as numbers and apply the mask with s.masked_fill(mask, float('-inf')); invert a mask "
     "with ~mask, not 1 - mask"),
]
